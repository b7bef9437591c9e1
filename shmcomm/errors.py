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

    Also raised as such where no subclass fits: a call on a destroyed group, a group left
    unusable by an earlier failure (a timeout or a dead peer half-way through a collective),
    ``/dev/shm`` too small for a segment, a job name in use by another live job.

    Example::

        try:
            sc.barrier()
        except sc.ShmcommError as e:
            log.error("communication failed: %s", e)
    """


class CommTimeoutError(ShmcommError, TimeoutError):
    """An operation or a wait did not complete within its timeout.

    Raised by a collective or a blocking send/recv whose peers did not arrive within the
    group's timeout (``init_process_group(timeout=...)``, ``SHMCOMM_TIMEOUT``, default 300 s;
    the group is unusable afterwards), by ``Work.wait(timeout)``, ``Future.wait(timeout)``,
    ``wait_all`` and ``wait_any`` past their ``timeout`` (the operation goes on), and by RPC
    calls past their timeout. Also a ``TimeoutError``, so ``except TimeoutError`` catches it.

    Example::

        try:
            work.wait(timeout=1.0)
        except TimeoutError:
            ...
    """


class PeerFailureError(ShmcommError):
    """A peer process died or left the group while this rank was waiting for it.

    Raised at once (not after the timeout) by collectives, point-to-point calls and RPC calls;
    after a failure half-way through a collective, the group is unusable. ``rank`` is the failed
    peer's rank in the group (``-1`` if unknown) and ``pid`` its process id (``-1`` if unknown).

    Example::

        try:
            sc.all_reduce(x)
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

    Raised on every rank of the group instead of returning corrupt data; the message names
    each rank's call. Also raised by ``recv`` for a message of another size or dtype than its
    buffer. Also a ``ValueError``.

    Example::

        try:
            sc.broadcast(x, src=0)
        except sc.CollectiveMismatchError as e:
            print(e)  # names what differed and on which ranks
    """


class AbortedError(ShmcommError):
    """The group was aborted (``Work.abort()`` or ``ProcessGroup.abort()`` on any rank).

    Every pending and later operation on that group raises it, on every rank; the group can
    only be destroyed then. Where the rank that aborted it did so because a peer died (a
    composition across NUMA nodes or machines wakes ranks waiting in its other groups that way),
    they raise the ``PeerFailureError`` naming that peer instead.

    Example::

        work = sc.all_reduce(x, async_op=True)
        work.abort()          # every rank's pending and later ops on the group raise AbortedError
    """


class InvalidStateError(ShmcommError):
    """An object was used in a state that does not allow it.

    Raised by ``Future.set_result``/``set_exception`` on a completed Future, ``Future.value()``
    on a pending one, and the RPC calls before ``init_rpc`` or a second ``init_rpc``.

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


def future_error(exc: BaseException) -> Exception:
    """``exc`` as a Future can hold it (``set_exception`` takes an Exception only, as torch's):
    an Exception as it is; a ``SystemExit``, ``KeyboardInterrupt`` or ``GeneratorExit`` raised by
    the work behind the Future as a ``ShmcommError`` naming it, chained to it. Without this the
    Future would stay pending forever.

    Example::

        >>> future_error(SystemExit(3))
        ShmcommError('the operation raised SystemExit: 3')
    """
    if isinstance(exc, Exception):
        return exc
    wrapped = ShmcommError(f"the operation raised {type(exc).__name__}: {exc}")
    wrapped.__cause__ = exc
    return wrapped


def caused_by_peer(exc: BaseException | None) -> bool:
    """Whether ``exc`` is fallout of another rank's failure: a ``PeerFailureError`` or an
    ``AbortedError``, or an exception raised while handling one (found through ``__cause__`` and
    ``__context__``). The root cause of a failed job is the first rank whose failure is not.

    Example::

        >>> caused_by_peer(PeerFailureError("rank 1 died", 1)), caused_by_peer(ValueError())
        (True, False)
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (PeerFailureError, AbortedError)):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
