"""Exception classes raised by shmcomm.

Every failure of the runtime reaches the caller as one of these classes (or as a plain
``ValueError``/``TypeError`` for bad arguments), so callers can catch ``ShmcommError`` to handle
any communication failure::

    import shmcomm as sc
    try:
        sc.all_reduce(x)
    except sc.PeerFailureError as e:
        print("rank", e.rank, "(pid", e.pid, ") died")
"""

from __future__ import annotations

__all__ = [
    "ShmcommError",
    "CommTimeoutError",
    "PeerFailureError",
    "CollectiveMismatchError",
    "AbortedError",
    "InvalidStateError",
    "UntrustedFileError",
]


class ShmcommError(RuntimeError):
    """Base class of every error raised by the shmcomm runtime.

    Example::

        try:
            sc.barrier()
        except sc.ShmcommError as e:
            log.error("communication failed: %s", e)
    """


class CommTimeoutError(ShmcommError, TimeoutError):
    """An operation or a wait did not complete within its timeout.

    Also a ``TimeoutError``, so ``except TimeoutError`` catches it::

        try:
            work.wait(timeout=1.0)
        except TimeoutError:
            ...
    """


class PeerFailureError(ShmcommError):
    """A peer process died or left the group while this rank was waiting for it.

    ``rank`` is the failed peer's rank in the group (``-1`` if unknown) and ``pid`` its process id::

        except sc.PeerFailureError as e:
            print(f"rank {e.rank} (pid {e.pid}) failed")
    """

    def __init__(self, message: str, rank: int = -1, pid: int = -1):
        super().__init__(message)
        self.rank = rank
        self.pid = pid

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.rank, self.pid))


class CollectiveMismatchError(ShmcommError, ValueError):
    """Ranks called different collectives, or the same one with different sizes, dtypes, ops or roots.

    Raised on every rank of the group instead of returning corrupt data::

        except sc.CollectiveMismatchError as e:
            print(e)  # names what differed and on which ranks
    """


class AbortedError(ShmcommError):
    """The group was aborted (``Work.abort()`` on any rank); pending and later ops raise this.

    Example::

        work = sc.all_reduce(x, async_op=True)
        work.abort()          # every rank's pending and later ops on the group raise AbortedError
    """


class InvalidStateError(ShmcommError):
    """An object was used in a state that does not allow it (a Future completed twice, say).

    Example::

        f = sc.Future(); f.set_result(1)
        f.set_result(2)       # raises InvalidStateError
    """


class UntrustedFileError(ShmcommError, PermissionError):
    """A shared file shmcomm was about to use is not this user's or not this job's.

    Raised at once (never after a timeout) for a file another user planted, a symlink, a hard link,
    a wrong mode, or a segment of another job with the same name; the message names the file, its
    owner and mode. Also a ``PermissionError``::

        try:
            sc.init_process_group(rank=1, world_size=2, name="train")
        except sc.UntrustedFileError as e:
            print(e)   # ... owned by uid 1001 (mallory), mode 0666, 2 links ...
    """
