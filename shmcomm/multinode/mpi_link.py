"""The MPI engine between nodes (``SHMCOMM_LINK=mpi``): mpi4py communicators, for jobs started
by ``mpirun``/``mpiexec``. No torch: the numpy API runs across nodes with MPI alone.

Under ``mpirun`` rank and world size come from MPI, the job name from rank 0 (``name=``, else
``SHMCOMM_JOB``, else a fresh one) and, unless ``SHMCOMM_SECRET`` is set, rank 0's secret is
shared as ``shmrun`` would hand it. Ranks meet through MPI itself (``MPIMeeting``); a group
built elsewhere (the torch backend's store) gets its communicator from its ranks' MPI ranks.

Links move bytes with MPI's non-blocking collectives and wait by polling, so that every call is
bounded by the group's timeout (``CommTimeoutError``) instead of blocking forever. Reductions
never use MPI's ops: each rank receives its piece from every rank and reduces it with shmcomm's
kernel in link-rank order, then the pieces are all-gathered: every rank gets the same bits, for
every dtype (float16, bfloat16 and bool included)::

    SHMCOMM_LINK=mpi mpirun -n 8 python train.py      # sc.init_process_group(), as under shmrun
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
import zlib

import numpy as np

from shmcomm._core import reduce_kernel
from shmcomm.errors import CollectiveMismatchError, CommTimeoutError, ShmcommError
from shmcomm.multinode.link import Launch, check_same, descriptor
from shmcomm.hierarchy.scratch import Scratch

__all__ = ["BUSY_THREADS", "MPILink", "MPIMeeting", "connect", "launch"]

# MPI progresses on the thread that polls (this rank's own): no thread of its own stays busy.
BUSY_THREADS = 0

# all_reduce of at most this many bytes: all-gather and reduce here, in one round; above,
# reduce-scatter (all-to-all of the pieces, then the kernel) and all-gather of the pieces.
GATHER_BYTES = 64 << 10

# Variables that MPI launchers set for every process they start: Open MPI's mpirun, MPICH's and
# Intel MPI's Hydra, PMIx launchers (srun --mpi=pmix)
_LAUNCH_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        raise ShmcommError("SHMCOMM_LINK=mpi runs over mpi4py, which is not installed: pip install "
                           "'shmcomm[mpi]' (and an MPI library, such as Open MPI or MPICH)") from None
    return MPI


def _serial():
    """A lock around MPI calls when the library does not allow calls from several threads at
    once (groups run their operations on their own progress threads)."""
    global _LOCK
    if _LOCK is None:
        MPI = _mpi()
        _LOCK = (contextlib.nullcontext() if MPI.Query_thread() >= MPI.THREAD_MULTIPLE
                 else threading.Lock())
    return _LOCK


_LOCK = None


def _poll(request, deadline: float, what: str, status=None) -> None:
    """Wait for ``request`` by testing it: a few quick tests, then sleeps that grow to 1 ms
    (yielding the core: ranks often outnumber cores), until ``deadline`` (CommTimeoutError)."""
    MPI = _mpi()
    tests = 0
    pause = 20e-6
    while True:
        try:
            with _serial():
                if request.Test(status):
                    return
        except MPI.Exception as exc:  # as shmcomm's errors
            if exc.Get_error_class() == MPI.ERR_TRUNCATE:
                raise CollectiveMismatchError(f"{what}: the message is larger than the receiving "
                                              f"array ({exc})") from None
            raise ShmcommError(f"{what} across nodes (MPI) failed: {exc}") from None
        tests += 1
        if time.monotonic() > deadline:
            raise CommTimeoutError(f"{what} across nodes (MPI) did not complete in time")
        if tests < 50:
            os.sched_yield()
        else:
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)


# ---- meeting through MPI ---------------------------------------------------------------------
class MPIMeeting:
    """A ``store.Meeting`` over an MPI communicator (its ranks are the meeting's).

    Example::

        meeting = MPIMeeting(MPI.COMM_WORLD)
        hosts = meeting.all_gather("hosts", host_identity())
    """

    def __init__(self, comm):
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()

    def all_gather(self, name: str, value: str) -> list[str]:
        """Every rank's ``value``, by rank (one MPI all-gather)."""
        return self.comm.allgather(value)

    def from_rank(self, name: str, value: str | None, source: int) -> str:
        """Rank ``source``'s ``value``; sources may differ by rank: every rank's is gathered."""
        return self.comm.allgather(value)[source]

    def among(self, name: str, members: list[int]) -> MPIMeeting:
        """The members' meeting: a communicator of them (collective over the members only)."""
        group = self.comm.Get_group().Incl(members)
        try:
            return MPIMeeting(self.comm.Create_group(group, zlib.crc32(name.encode()) % 32768))
        finally:
            group.Free()


def launched_by_mpi() -> bool:
    """Whether an MPI launcher (mpirun, mpiexec, srun with PMIx) started this process.

    Example::

        launched_by_mpi()   # True under mpirun -n 4 python script.py
    """
    return any(os.environ.get(var) for var in _LAUNCH_VARS)


def launch(name: str | None, timeout: float | None) -> Launch | None:
    """``init_process_group()`` under ``mpirun``/``mpiexec``: rank and world size from MPI, the
    job name and secret from rank 0, every rank's meeting through MPI. Started otherwise (shmrun,
    torchrun), None on one node, and on several a ValueError: MPI needs its own launcher.

    Example::

        started = launch(None, None)   # under SHMCOMM_LINK=mpi mpirun -n 4 python script.py
    """
    from shmcomm.world import job_arguments
    from shmcomm.hierarchy.topology import spans_nodes
    from shmcomm.trust import SECRET_ENV, given_secret, new_secret

    if not launched_by_mpi():
        _, size, _, _ = job_arguments(None, None, name, timeout)
        if not spans_nodes(size):
            return None
        raise ValueError("SHMCOMM_LINK=mpi needs a job started by mpirun or mpiexec (none of "
                         f"{', '.join(_LAUNCH_VARS)} is set): start it so, or unset SHMCOMM_LINK")
    MPI = _mpi()
    world = MPI.COMM_WORLD
    expected = os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMI_SIZE")
    if expected and int(expected) != world.Get_size():
        raise ShmcommError(f"the launcher started {expected} ranks but MPI's world here has "
                           f"{world.Get_size()}: mpi4py is built for another MPI than this mpirun")
    meeting = MPIMeeting(world)
    first = meeting.rank == 0
    job = meeting.from_rank("job", (name or os.environ.get("SHMCOMM_JOB") or
                                    f"mpi-{uuid.uuid4().hex[:12]}") if first else None, 0)
    # the job's secret for every segment of this job, as shmrun hands one to its ranks
    os.environ[SECRET_ENV] = meeting.from_rank(
        "secret", (given_secret() or new_secret()) if first else None, 0)
    _, _, job, timeout = job_arguments(meeting.rank, meeting.size, job, timeout)
    return Launch(meeting, job, timeout, None)


def connect(meeting, timeout: float, rails: list[list[int]] | None, checked: bool = True):
    """This rank's rail link (None without ``rails``) and the world link: communicators split
    from the meeting's (an ``MPIMeeting``), or from MPI's world by the ranks' MPI ranks
    (``checked``: as ``MPILink``'s). Collective over the meeting.

    Example::

        rail, world = connect(MPIMeeting(MPI.COMM_WORLD), 60.0, [[0, 2], [1, 3]])
    """
    MPI = _mpi()
    if isinstance(meeting, MPIMeeting):
        comm = meeting.comm
    else:  # a store's meeting (the torch backend's): the same ranks in MPI's world
        ranks = [int(r) for r in meeting.all_gather("mpi-ranks", str(MPI.COMM_WORLD.Get_rank()))]
        group = MPI.COMM_WORLD.Get_group().Incl(ranks)
        try:
            comm = MPI.COMM_WORLD.Create_group(group, zlib.crc32(str(ranks).encode()) % 32768)
        finally:
            group.Free()
    rail = None
    if rails:
        index = next(i for i, members in enumerate(rails) if meeting.rank in members)
        rail = MPILink(comm.Split(index, rails[index].index(meeting.rank)), timeout, checked)
    return rail, MPILink(comm.Dup(), timeout, checked)


# ---- the link --------------------------------------------------------------------------------
def _bytes(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


def _even(count: int, n: int) -> list[int]:
    """``count`` elements in ``n`` pieces: the first ``count % n`` one element larger."""
    return [count // n + (q < count % n) for q in range(n)]


def _offsets(counts: list[int]) -> list[int]:
    return [int(x) for x in np.concatenate([[0], np.cumsum(counts)[:-1]])] if counts else []


class _MPIRequest:
    """A ``link.Request`` over an MPI point-to-point request."""

    def __init__(self, link: MPILink, request, keep: np.ndarray, expect: int | None):
        MPI = _mpi()
        self._link, self._request, self._keep, self._expect = link, request, keep, expect
        self._status = MPI.Status()
        self._finished = False
        self._lock = threading.Lock()  # MPI allows one test of a request at a time

    def wait(self, timeout: float | None = None) -> None:
        with self._lock:
            if self._finished:
                return
            limit = self._link.timeout if timeout is None else float(timeout)
            try:
                _poll(self._request, time.monotonic() + limit, "a point-to-point transfer",
                      self._status)
            except CommTimeoutError:
                if self._expect is not None:  # a receive can be taken back
                    with _serial():
                        self._request.Cancel()
                self._link.abandon(self._request, self._keep)  # MPI may still use the array
                raise
            self._finished = True
            if self._expect is not None:
                got = self._status.Get_count(_mpi().BYTE)
                if got != self._expect:
                    raise CollectiveMismatchError(
                        f"the message from rank {self._status.Get_source()} has {got} bytes; this "
                        f"receive expects {self._expect}")

    def done(self) -> bool:
        with self._lock:
            if not self._finished:
                with _serial():
                    self._finished = self._request.Test(self._status)
            return self._finished

    def source(self) -> int:
        return self._status.Get_source()


class MPILink:
    """One inter-node communicator: an MPI communicator over ``size`` ranks. ``checked``: each
    collective first compares every rank's descriptor (``_agree``); off for the composition,
    which compares each composed call's once, before any link moves data.

    Example::

        link = MPILink(MPI.COMM_WORLD.Dup(), timeout=60.0)
        link.all_reduce(np.ones(4), 0)
    """

    def __init__(self, comm, timeout: float, checked: bool = True):
        MPI = _mpi()
        self._MPI, self._comm, self.timeout = MPI, comm, timeout
        self._checked = checked
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)  # (cached on the world communicator)
        self._scratch = Scratch()
        self._abandoned: list = []  # requests MPI may still be using after a timeout, and arrays
        self._broken: str | None = None

    def abandon(self, request, keep) -> None:
        """Keep a timed-out request and its arrays alive for good: MPI may still write them."""
        self._abandoned.append((request, keep))

    def _wait(self, request, what: str) -> None:
        if self._broken:
            raise ShmcommError(f"this MPI link is unusable: {self._broken}")
        try:
            _poll(request, time.monotonic() + self.timeout, what)
        except CommTimeoutError as exc:
            self.abandon(request, None)
            self._broken = f"{what} timed out"
            raise CommTimeoutError(f"{exc} (timeout {self.timeout} s)") from None

    def _start(self, what: str, call, *buffers) -> None:
        """Start a non-blocking MPI call on ``buffers`` and wait for it; the buffers stay alive
        with the request should it time out."""
        if self._broken:
            raise ShmcommError(f"this MPI link is unusable: {self._broken}")
        with _serial():
            request = call()
        try:
            self._wait(request, what)
        except CommTimeoutError:
            self._abandoned.append(buffers)
            raise

    def _agree(self, kind: str, a: np.ndarray | None = None, op: int = -1, root: int = -1,
               nbytes: int | None = None) -> None:
        """Every rank of the link called the same collective with the same dtype, size, op and
        root: else CollectiveMismatchError on every rank, before any data moves. Off for the
        composition (``checked=False``), which compares each composed call's once instead."""
        if not self._checked:
            return
        mine = descriptor(kind, a, op, root, nbytes)
        every = np.empty((self.size, mine.size), np.int64)
        B = self._MPI.BYTE
        self._start(f"{kind} (agreeing)", lambda: self._comm.Iallgather([_bytes(mine), B],
                                                                         [_bytes(every), B]), mine, every)
        check_same(every)

    # ---- data movement -----------------------------------------------------------------------
    def broadcast(self, a: np.ndarray, root: int) -> None:
        """Copy link rank ``root``'s ``a`` into every rank's."""
        self._agree("broadcast", a, root=root)
        buf = a if a.flags.writeable else a.copy()  # only the root's may be read-only
        self._start("broadcast", lambda: self._comm.Ibcast([_bytes(buf), self._MPI.BYTE], root), buf)

    def all_gather_into(self, out: np.ndarray, a: np.ndarray) -> None:
        """``out`` = every rank's ``a``, in link-rank order."""
        self._agree("all_gather", a)
        self._all_gather_into(out, a)

    def _all_gather_into(self, out: np.ndarray, a: np.ndarray) -> None:
        B = self._MPI.BYTE
        self._start("all_gather", lambda: self._comm.Iallgather([_bytes(a), B], [_bytes(out), B]), out, a)

    def _all_gather_v(self, out: np.ndarray, a: np.ndarray, counts: list[int]) -> None:
        width, B = out.itemsize, self._MPI.BYTE
        sizes = [c * width for c in counts]
        self._start("all_gather", lambda: self._comm.Iallgatherv(
            [_bytes(a), B], [_bytes(out), (sizes, _offsets(sizes)), B]), out, a)

    def all_to_all_single(self, out: np.ndarray, a: np.ndarray, out_splits: list, in_splits: list) -> None:
        """Rank q gets the ``in_splits[q]`` elements of ``a`` meant for it, into ``out``."""
        self._agree("all_to_all", a, nbytes=0)  # sizes differ by rank; MPI checks each pair
        self._all_to_all_v(out, a, out_splits, in_splits)

    def _all_to_all_v(self, out: np.ndarray, a: np.ndarray, out_splits: list, in_splits: list) -> None:
        width, B = a.itemsize, self._MPI.BYTE
        outs, ins = [s * width for s in out_splits], [s * width for s in in_splits]
        self._start("all_to_all", lambda: self._comm.Ialltoallv(
            [_bytes(a), (ins, _offsets(ins)), B], [_bytes(out), (outs, _offsets(outs)), B]), out, a)

    def gather(self, a: np.ndarray, outs: list | None, root: int) -> None:
        """Link rank ``root``'s ``outs[q]`` = rank q's ``a``."""
        self._agree("gather", a, root=root)
        whole = np.empty(self.size * a.size if outs is not None else 0, a.dtype)
        B = self._MPI.BYTE
        self._start("gather", lambda: self._comm.Igather([_bytes(a), B], [_bytes(whole), B], root),
                    whole, a)
        for q, o in enumerate(outs or []):
            o[...] = whole[q * a.size:(q + 1) * a.size]

    def scatter(self, a: np.ndarray, ins: list | None, root: int) -> None:
        """Rank q's ``a`` = link rank ``root``'s ``ins[q]``."""
        self._agree("scatter", a, root=root)
        whole = np.concatenate(ins) if ins is not None else np.empty(0, a.dtype)
        B = self._MPI.BYTE
        self._start("scatter", lambda: self._comm.Iscatter([_bytes(whole), B], [_bytes(a), B], root),
                    whole, a)

    def barrier(self) -> None:
        """Return once every rank of the link called it."""
        self._agree("barrier")
        self._start("barrier", self._comm.Ibarrier)

    # ---- reductions: pieces moved by MPI, reduced by shmcomm's kernel in link-rank order -------
    def reduce_scatter_into(self, out: np.ndarray, a: np.ndarray, op: int) -> None:
        """``out`` on link rank r = reduction of piece r of every rank's ``a``."""
        self._agree("reduce_scatter", a, op)
        self._reduce_scatter_v(out, a, [out.size] * self.size, op)

    def _reduce_scatter_v(self, out: np.ndarray, a: np.ndarray, counts: list[int], op: int) -> None:
        # 1. every rank sends piece q of its ``a`` to rank q  2. reduce the size pieces received
        n = counts[self.rank]
        if not sum(counts):
            return
        received = self._scratch.take(self.size * n, a.dtype)
        self._all_to_all_v(received, a, [n] * self.size, counts)
        reduce_kernel(out, [received[q * n:(q + 1) * n] for q in range(self.size)], op)

    def all_reduce(self, a: np.ndarray, op: int) -> None:
        """Reduce ``a`` in place over the link's ranks (the same bits on every rank)."""
        self._agree("all_reduce", a, op)
        if not a.size:
            return
        if a.nbytes <= GATHER_BYTES:  # one round: all-gather, then reduce here
            every = self._scratch.take(self.size * a.size, a.dtype)
            self._all_gather_into(every, a)
            reduce_kernel(a, [every[q * a.size:(q + 1) * a.size] for q in range(self.size)], op)
            return
        # 1. reduce-scatter: this rank reduces its piece of every rank's ``a``
        # 2. all-gather of the reduced pieces into ``a``
        counts = _even(a.size, self.size)
        mine = np.empty(counts[self.rank], a.dtype)
        self._reduce_scatter_v(mine, a, counts, op)
        self._all_gather_v(a, mine, counts)

    # ---- point to point -------------------------------------------------------------------------
    def _tag(self, tag: int) -> int:
        if not 0 <= tag <= self._tag_ub:
            raise ValueError(f"tag must be in [0, {self._tag_ub}] between nodes with SHMCOMM_LINK=mpi "
                             f"(MPI's limit), got {tag}")
        return tag

    def isend(self, a: np.ndarray, dst: int, tag: int) -> _MPIRequest:
        """Start sending ``a`` to link rank ``dst``."""
        tag = self._tag(tag)
        with _serial():
            request = self._comm.Isend([_bytes(a), self._MPI.BYTE], dst, tag)
        return _MPIRequest(self, request, a, None)

    def irecv(self, a: np.ndarray, src: int | None, tag: int) -> _MPIRequest:
        """Start receiving into ``a`` from ``src`` (None: any rank)."""
        tag = self._tag(tag)
        source = self._MPI.ANY_SOURCE if src is None else src
        with _serial():
            request = self._comm.Irecv([_bytes(a), self._MPI.BYTE], source, tag)
        return _MPIRequest(self, request, a, a.nbytes)

    def close(self) -> None:
        """Free the communicator (idempotent; nothing once MPI is finalized)."""
        comm, self._comm = self._comm, None
        self._scratch.release()
        if comm is not None and not self._abandoned and not self._MPI.Is_finalized():
            with _serial():
                comm.Free()
