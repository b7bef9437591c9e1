"""Names and headers of shmcomm's shared-memory segments, readable without the compiled core.

Every segment of a job is a file in ``/dev/shm`` named ``shmcomm.<uid>.<job>.<part>``; segments are
unlinked as soon as every rank has attached, so a name only outlives start-up when a rank crashed
during it. Where ``/dev/shm`` has no unnamed files (no ``O_TMPFILE``), a segment is made under a
*staging name*, ``<name>~<pid>-<start time>`` of its creator, until its header is written: whoever
finds one can tell whether its creator still runs. ``shmcomm ls``/``shmcomm clean`` and the
launcher's cleanup use this module::

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
_STAGING = re.compile(r"[^/~]+~(\d+)-(\d+)")  # a segment's name, then its creator's pid and start time
NAME_MAX = 255  # bytes in a file name (Linux)


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


def staging_name(name: str, pid: int, start_time: int) -> str:
    """The name (leading ``/``) segment ``name`` has until its header is written, where
    ``/dev/shm`` has no unnamed files: ``name`` plus the pid and start time (``trust.process_identity``)
    of the process creating it, so that anyone can tell once that process is gone.

    Example::

        >>> staging_name("/shmcomm.1000.job-42.g0", 4242, 987654)
        '/shmcomm.1000.job-42.g0~4242-987654'
    """
    staged = f"{name}~{pid}-{start_time}"
    if len(staged.encode()) - 1 > NAME_MAX:  # parts and jobs are short: never in practice
        raise ValueError(f"segment name {name!r} is too long for /dev/shm ({NAME_MAX} bytes)")
    return staged


def staging_creator(name: str) -> tuple[int, int] | None:
    """``(pid, start time)`` of the creator a staging name carries; None for any other name.

    Example::

        >>> staging_creator("shmcomm.1000.job-42.g0~4242-987654")
        (4242, 987654)
    """
    m = _STAGING.fullmatch(os.path.basename(name))
    return (int(m.group(1)), int(m.group(2))) if m else None


def creator_gone(pid: int, start_time: int) -> bool:
    """Whether process ``pid`` that started at ``start_time`` has exited (a recycled pid has
    another start time; a zombie counts as gone: it writes nothing any more).

    Example::

        >>> creator_gone(os.getpid(), trust.process_identity(os.getpid())[1])
        False
    """
    ident = trust.process_identity(pid)
    return ident is None or ident[1] != start_time or not _alive(pid)


def remove_dead_staging(name: str) -> list[str]:
    """Unlink the staging names of segment ``name`` (leading ``/``) whose creators are gone:
    each is what a creator killed before it named its segment left. A live creator's, and files
    that are not ours, stay. Returns the names removed.

    Example::

        remove_dead_staging(segment_name("job-42", "g0"))
    """
    base = os.path.basename(name) + "~"
    removed = []
    for staged in _names(base):
        creator = staging_creator(staged)
        if creator is not None and creator_gone(*creator) and _unlink_ours(staged):
            removed.append(staged)
    return removed


def publishing(path: str) -> bool:
    """Whether the segment at ``path``, refused for its two links, had them only because its
    creator was naming it (it links its staging name to ``path``, then removes the staging
    name): a file of ours, mode 0600, whose second link is such a staging name, or that has
    one link again. Should that creator be gone (killed between the two), its staging name is
    removed here, and ``path`` is an ordinary segment again. True: look at it again.

    Example::

        if publishing("/dev/shm/shmcomm.1000.job-42.g0"):
            time.sleep(0.001)   # try again: the creator is about to remove its staging name
    """
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if trust.problem(st) is None:
        return True  # the staging name went since the file was refused
    if st.st_nlink != 2 or stat.S_IMODE(st.st_mode) != 0o600 or trust.problem(st, strict=False):
        return False
    for staged in _names(os.path.basename(path) + "~"):
        creator = staging_creator(staged)
        try:
            same = os.path.samestat(st, os.lstat(os.path.join(SHM_DIR, staged)))
        except OSError:
            continue
        if creator is not None and same:
            if creator_gone(*creator):
                _unlink_ours(staged)
            return True
    return False


def _names(prefix: str) -> list[str]:
    """Names in ``/dev/shm`` that start with ``prefix``."""
    try:
        return [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return []


def _unlink_ours(name: str) -> bool:
    """Unlink ``/dev/shm/name`` if it is a regular file of this user; whether it was."""
    path = os.path.join(SHM_DIR, name)
    try:
        if trust.problem(os.lstat(path), strict=False) is None:
            os.unlink(path)
            return True
    except OSError:
        pass
    return False


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
    creator: tuple[int, int] | None = None  # a staging name's creator: (pid, start time)

    @property
    def stale(self) -> bool:
        """True when no process that attached to the segment is still alive (for a staging
        name: when its creator has exited)."""
        if self.creator is not None:
            return creator_gone(*self.creator)
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
            info = SegmentInfo(name, path, size, creator=staging_creator(name))
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
        return SegmentInfo(name, path, 0, creator=staging_creator(name))


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
