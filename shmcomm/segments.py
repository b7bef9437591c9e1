"""Names and headers of shmcomm's shared-memory segments, readable without the compiled core.

Every segment of a job is a file in ``/dev/shm`` named ``shmcomm.<uid>.<job>.<part>``; segments are
unlinked as soon as every rank has attached, so a name only outlives start-up when a rank crashed
during it. ``shmcomm ls``/``shmcomm clean`` and the launcher's cleanup use this module::

    from shmcomm import segments
    for seg in segments.list_segments():
        print(seg.name, seg.size, seg.pids, "stale" if seg.stale else "alive")
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct
from dataclasses import dataclass, field

from shmcomm import trust

SHM_DIR = "/dev/shm"
PREFIX = "shmcomm"
MAGIC = 0x006D6D6F636D6873  # b"shmcomm\0" read as a little-endian uint64
HEADER_BYTES = 4096  # header page; per-rank control blocks follow it
CONTROL_BLOCK_BYTES = 640
# Offsets inside the header and a control block; src_cython/shm_layout.h is the authority.
_HEADER = struct.Struct("<QII")  # magic, version, world_size
_PID_OFFSET = 8  # int32 pid inside each control block
_CREATOR_PID_OFFSET = 40  # int32 pid of rank 0 inside the header
_JOB_OFFSET, _JOB_BYTES = 64, 128

_SAFE = re.compile(r"[^A-Za-z0-9_-]")


def sanitize_job(job: str) -> str:
    """Return ``job`` as a segment-name component: only ``[A-Za-z0-9_-]``, at most 48 characters.

    Names that had to change get a short hash so two different jobs never share a name::

        >>> sanitize_job("job-42")
        'job-42'
        >>> sanitize_job("my job/1")[:7]
        'my_job_'
    """
    if not isinstance(job, str) or not job:
        raise ValueError(f"job name must be a non-empty string, got {job!r}")
    safe = _SAFE.sub("_", job)
    if safe != job or len(safe) > 48:
        digest = hashlib.blake2s(job.encode(), digest_size=4).hexdigest()
        safe = f"{safe[:39]}_{digest}"
    return safe


def job_prefix(job: str, uid: int | None = None) -> str:
    """Name prefix (without the leading ``/``) shared by every segment of ``job`` for user ``uid``.

    Example::

        >>> job_prefix("job-42", uid=1000)
        'shmcomm.1000.job-42.'
    """
    uid = os.getuid() if uid is None else uid
    return f"{PREFIX}.{uid}.{sanitize_job(job)}."


def segment_name(job: str, part: str) -> str:
    """POSIX shared-memory name (leading ``/``) of one segment of ``job``: ``part`` says which.

    Example::

        >>> segment_name("job-42", "g0").startswith("/shmcomm.")
        True
    """
    return "/" + job_prefix(job) + part


@dataclass
class SegmentInfo:
    """What ``describe`` reads from a segment file: its header and the pids of its ranks."""

    name: str
    path: str
    size: int
    job: str = ""
    world_size: int = 0
    pids: list[int] = field(default_factory=list)
    valid: bool = False
    untrusted: str | None = None  # why the file is not ours (another user's, a link...), or None

    @property
    def stale(self) -> bool:
        """True when no process that attached to the segment is still alive."""
        return not any(_alive(pid) for pid in self.pids)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def describe(path: str) -> SegmentInfo:
    """Read the header of the segment file at ``path`` (never raises for a malformed file, never
    follows a symlink or blocks on a FIFO). A file that is not ours is described, not read:
    ``untrusted`` says why.

    Example::

        info = describe("/dev/shm/shmcomm.1000.job-42.g0")
        info.pids, info.stale, info.untrusted
    """
    name = os.path.basename(path)
    try:
        st = os.lstat(path)
        why = "it is a symlink" if stat.S_ISLNK(st.st_mode) else trust.problem(st, strict=False)
        if why is not None:
            return SegmentInfo(name, path, st.st_size, untrusted=f"{why} ({trust.describe_owner(st)})")
        size = st.st_size
        fd = trust.open_checked(path, os.O_RDONLY, strict=False)
        with os.fdopen(fd, "rb") as f:
            head = f.read(HEADER_BYTES)
            magic, _version, world = _HEADER.unpack_from(head) if len(head) >= 16 else (0, 0, 0)
            info = SegmentInfo(name, path, size)
            if magic != MAGIC or not 0 < world <= 4096:
                return info
            info.valid = True
            info.world_size = world
            info.job = head[_JOB_OFFSET:_JOB_OFFSET + _JOB_BYTES].split(b"\0", 1)[0].decode(errors="replace")
            f.seek(HEADER_BYTES)
            blocks = f.read(world * CONTROL_BLOCK_BYTES)
            info.pids = [
                struct.unpack_from("<i", blocks, r * CONTROL_BLOCK_BYTES + _PID_OFFSET)[0]
                for r in range(world)
                if len(blocks) >= (r + 1) * CONTROL_BLOCK_BYTES
            ]
            if info.pids and info.pids[0] <= 0:  # named, but rank 0 not registered yet: its creator
                info.pids[0] = struct.unpack_from("<i", head, _CREATOR_PID_OFFSET)[0]
            return info
    except trust.UntrustedFileError as e:  # replaced between lstat and open
        return SegmentInfo(name, path, 0, untrusted=str(e))
    except OSError:
        return SegmentInfo(name, path, 0)


def list_segments(uid: int | None = None, job: str | None = None) -> list[SegmentInfo]:
    """Every shmcomm segment in ``/dev/shm`` of user ``uid`` (default: this user), optionally one job.

    Example::

        stale = [s for s in list_segments() if s.stale]
    """
    uid = os.getuid() if uid is None else uid
    prefix = job_prefix(job, uid) if job else f"{PREFIX}.{uid}."
    try:
        names = sorted(os.listdir(SHM_DIR))
    except OSError:
        return []
    return [describe(os.path.join(SHM_DIR, n)) for n in names if n.startswith(prefix)]


def remove_job_segments(job: str, uid: int | None = None) -> list[str]:
    """Unlink every segment of ``job`` that is ours (used by the launcher once all of its ranks
    have exited); a file someone else planted under the job's names is left alone.

    Returns the names removed::

        remove_job_segments(os.environ["SHMCOMM_JOB"])
    """
    removed = []
    for seg in list_segments(uid, job):
        if seg.untrusted is not None:
            continue
        try:
            os.unlink(seg.path)
            removed.append(seg.name)
        except (FileNotFoundError, PermissionError):
            pass
    return removed
