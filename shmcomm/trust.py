"""Who may share a job's memory: file checks and the per-job secret.

Threat model: other local users of a shared machine. Every name shmcomm opens in ``/dev/shm`` (or
writes for the launcher) is one they can guess and plant a file under first, so a file is used
only if it passes two checks:

1. **It is ours** (``check_file``): a regular file owned by this user, mode 0600, one link, opened
   with ``O_NOFOLLOW``. Another user cannot make such a file; a hard link to theirs has their owner
   and two links, a symlink is refused by ``O_NOFOLLOW``.
2. **It is this job's** (``Credentials``): the creator writes a tag derived from the job's secret
   into the header; an attaching rank compares it with its own. This tells two jobs of one user
   that were given the same name apart.

The secret comes from ``SHMCOMM_SECRET``: ``shmrun`` sets a fresh one for every job, the torch
backend passes one through torch's store, and a process that imports shmcomm without one makes one
up (``auto-<pid>-<hex>``) and puts it in its environment, so the ranks it starts (multiprocessing,
subprocess) share it. Ranks started by hand, with no common parent, each make up their own; those
are matched by job name alone (``Credentials.self_made``). Environments are readable only by their
own user::

    creds = credentials()                   # from SHMCOMM_SECRET
    tag = creds.tag("job-42", "g0")         # 32 bytes, written into the segment header
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import stat
from dataclasses import dataclass

from shmcomm.errors import UntrustedFileError

__all__ = ["SECRET_ENV", "UntrustedFileError", "Credentials", "credentials", "new_secret",
           "ensure_inherited_secret", "given_secret", "private_part", "process_identity", "problem", "check_file", "open_checked",
           "open_private_output", "describe_owner",
           "foreign_job_error"]

SECRET_ENV = "SHMCOMM_SECRET"
_AUTO = re.compile(r"auto-(\d+)-[0-9a-f]{32}")


def new_secret() -> str:
    """A fresh random job secret (what ``shmrun`` hands each job).

    Example::

        >>> len(new_secret())
        32
    """
    return secrets.token_hex(16)


def ensure_inherited_secret() -> None:
    """Give this process a secret its children inherit, unless one was handed to it.

    Runs on ``import shmcomm``. Example::

        ensure_inherited_secret(); os.environ["SHMCOMM_SECRET"]   # 'auto-4242-...'
    """
    if not os.environ.get(SECRET_ENV):
        os.environ[SECRET_ENV] = f"auto-{os.getpid()}-{secrets.token_hex(16)}"


def given_secret() -> str | None:
    """The ``SHMCOMM_SECRET`` a person set, or None: absent, or made up by a shmcomm process
    (``auto-...``, see ``ensure_inherited_secret``), which no other machine shares.

    Example::

        os.environ["SHMCOMM_SECRET"] = "s3cret"; given_secret()   # 's3cret'
    """
    secret = os.environ.get(SECRET_ENV)
    return None if not secret or _AUTO.fullmatch(secret) else secret


@dataclass(frozen=True)
class Credentials:
    """What a rank proves it belongs to its job with.

    ``key`` is derived from the secret; ``self_made`` is true when nobody handed this process a
    secret (it made one up itself), the case of ranks started by hand. Example::

        >>> c = Credentials(bytes(32), False)
        >>> len(c.tag("job-42", "g0")), c.tag("job-42", "g0") != c.tag("job-42", "g1")
        (32, True)
    """

    key: bytes
    self_made: bool

    def tag(self, job: str, part: str) -> bytes:
        """The 32 bytes a segment ``part`` of ``job`` carries: keyed, so the secret stays unknown."""
        return hashlib.blake2b(f"{job}\0{part}".encode(), key=self.key, digest_size=32).digest()

    def accepts(self, tag: bytes, creator_self_made: bool, job: str, part: str) -> bool:
        """Whether a segment with ``tag``, made by a creator whose secret was ``creator_self_made``,
        belongs to this rank's job. Two self-made secrets mean ranks started by hand: the name is
        all they share."""
        return tag == self.tag(job, part) or (creator_self_made and self.self_made)


def credentials(secret: str | bytes | None = None) -> Credentials:
    """Credentials from ``secret``, else from ``SHMCOMM_SECRET`` (made up if absent).

    Example::

        >>> credentials("s3cret").self_made
        False
    """
    self_made = False
    if secret is None:
        ensure_inherited_secret()
        secret = os.environ[SECRET_ENV]
        made = _AUTO.fullmatch(secret)
        self_made = made is not None and int(made.group(1)) == os.getpid()
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    return Credentials(hashlib.sha256(b"shmcomm-secret\0" + raw).digest(), self_made)


def private_part(job: str, part: str) -> str:
    """The segment part to use for ``part`` of ``job`` when its ranks meet by name alone (RPC's
    group): with a secret a person or launcher handed every rank, ``part`` plus a suffix keyed by
    it, which nobody outside the job can compute and plant first; else ``part`` as it is.

    Example::

        os.environ["SHMCOMM_SECRET"] = "s3cret"; private_part("job-42", "rpc")   # 'rpc.5be1...'
    """
    secret = given_secret()
    if secret is None:
        return part
    key = hashlib.sha256(b"shmcomm-name\0" + secret.encode()).digest()
    suffix = hashlib.blake2s(f"{job}\0{part}".encode(), key=key, digest_size=8).hexdigest()
    return f"{part}.{suffix}"


def process_identity(pid: int) -> tuple[int, int] | None:
    """``(uid, start time)`` of process ``pid`` (start time in clock ticks since boot, field 22 of
    ``/proc/PID/stat``), or None if there is no such process. A pid plus its start time names one
    process even after the pid is recycled.

    Example::

        >>> process_identity(os.getpid())[0] == os.geteuid()
        True
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return os.stat(f"/proc/{pid}").st_uid, int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def describe_owner(st: os.stat_result) -> str:
    """``owned by uid U (name), mode 0MMM, N link(s), <kind>`` for an error message.

    Example::

        describe_owner(os.stat("/dev/shm"))   # 'owned by uid 0 (root), mode 1777, 2 links, directory'
    """
    try:
        import pwd
        who = f"uid {st.st_uid} ({pwd.getpwuid(st.st_uid).pw_name})"
    except (ImportError, KeyError):
        who = f"uid {st.st_uid}"
    kind = "regular file" if stat.S_ISREG(st.st_mode) else \
        "symlink" if stat.S_ISLNK(st.st_mode) else \
        "directory" if stat.S_ISDIR(st.st_mode) else "special file"
    links = "1 link" if st.st_nlink == 1 else f"{st.st_nlink} links"
    return f"owned by {who}, mode {stat.S_IMODE(st.st_mode):04o}, {links}, {kind}"


def problem(st: os.stat_result, strict: bool = True) -> str | None:
    """Why a file with status ``st`` is not one we may use (None when it is). ``strict=False``
    only asks whether it is a regular file of ours, whatever its mode and links: enough to read
    or remove it, not to join it.

    Example::

        >>> problem(os.stat("/"))
        'not a regular file'
    """
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"not owned by this user (uid {os.geteuid()})"
    if strict and stat.S_IMODE(st.st_mode) != 0o600:
        return "mode is not 0600"
    if strict and st.st_nlink != 1:
        return "it has more than one link"
    return None


def check_file(fd: int, path: str, what: str = "shared segment", strict: bool = True) -> os.stat_result:
    """Raise ``UntrustedFileError`` unless the open file ``fd`` (at ``path``) is ours (see
    ``problem``); return its status.

    Example::

        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        check_file(fd, path)
    """
    st = os.fstat(fd)
    why = problem(st, strict)
    if why is not None:
        raise UntrustedFileError(_refusal(path, st, why, what))
    return st


def open_checked(path: str, flags: int, what: str = "shared segment", strict: bool = True) -> int:
    """``os.open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)`` followed by ``check_file``;
    a symlink, or a file that is not ours, raises ``UntrustedFileError`` (the fd is closed).

    Example::

        fd = open_checked("/dev/shm/shmcomm.1000.job-42.g0", os.O_RDONLY)
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.EACCES, errno.EPERM):
            raise
        # ELOOP: the name is a symlink; EACCES: a file of another user we may not even open.
        try:
            st = os.lstat(path)
        except OSError:
            raise e from None
        why = "it is a symlink" if stat.S_ISLNK(st.st_mode) else (problem(st, strict) or "cannot open it")
        raise UntrustedFileError(_refusal(path, st, why, what)) from None
    try:
        check_file(fd, path, what, strict)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private_output(path: str, what: str = "log file") -> int:
    """Open ``path`` for writing from its start, creating it with mode 0600: never through a
    symlink, and never a file of another user or one with other links (it is only truncated
    once that is checked). For files the launcher writes into directories others may share.

    Example::

        fd = open_private_output("/tmp/logs/rank0.out")
    """
    fd = open_checked(path, os.O_WRONLY | os.O_CREAT, what, strict=False)
    st = os.fstat(fd)
    if st.st_nlink != 1:  # a hard link planted to make us overwrite another file of ours
        os.close(fd)
        raise UntrustedFileError(_refusal(path, st, "it has more than one link", what))
    os.ftruncate(fd, 0)
    os.set_blocking(fd, True)
    return fd


def _refusal(path: str, st: os.stat_result, why: str, what: str) -> str:
    return (f"refusing {what} {path}: {why} ({describe_owner(st)}). shmcomm only uses regular "
            f"files of its own user with mode 0600 and one link; this one was not created by this "
            f"job (another user may have planted it). Ask its owner or root to remove it, or give "
            f"the job another name")


def foreign_job_error(path: str, job: str, pid: int) -> UntrustedFileError:
    """The error for a segment of ours that carries another job's secret (two jobs, one name).

    Example::

        raise foreign_job_error("/dev/shm/shmcomm.1000.train.g0", "train", 4242)
    """
    return UntrustedFileError(
        f"segment {path} belongs to another job named {job!r} (created by live pid {pid}, with a "
        f"different {SECRET_ENV}): two jobs were given the same name. Give each job its own name; "
        f"ranks of one job started without shmrun must share one {SECRET_ENV} or be started by "
        f"one parent process")
