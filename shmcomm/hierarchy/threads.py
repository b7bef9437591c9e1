"""Large all_reduce on every core a rank owns: each rank splits the array into pieces and reduces
each piece on a thread of its own, as DeepSpeed's and vLLM's CPU ops split their copies and
reductions over the rank's OpenMP threads. One thread copies and reduces at a fraction of a
socket's memory bandwidth; several reach it.

The threads are the progress threads of *lanes*: T groups over the same ranks as the group
(``comm.derive``), one piece each, made by the first call that needs them. A call of ``SHMCOMM_THREADS_BYTES`` (1 MiB) and more runs, in
issue order on the group's engine, as:

1. a check on the whole group that every rank made the same call (a rank that took the flat
   path instead meets it there, and both raise CollectiveMismatchError);
2. lanes 1..P-1 get their pieces as async all_reduces, started at once on their progress
   threads; the calling thread reduces piece 0 on lane 0, then waits for the others.

Only synchronous calls split: then the caller waits, and its torch threads idle on the cores the
lanes use. An async call (DDP's buckets, FSDP's prefetches) overlaps the caller's computing, and
threads of the library taking its cores would slow that more than they gain (oneCCL's worker
threads made tensor parallelism 12x slower until moved off them): it runs in one piece on lane 0,
by the group's progress thread, as the flat path would. Where the ranks differ (one waits, one
does not), none splits.

P = min(T, bytes // (SHMCOMM_THREADS_BYTES / T)): no piece smaller than the threshold's share
of a lane. Pieces start on cache-line bounds. Every lane reduces its piece exactly as the flat
path reduces those elements (ranks in order), so the result is the same bits whatever T is, on
every rank.

T is ``SHMCOMM_RANK_THREADS`` where set (1: off); by default each rank's share of the cores:
its affinity over the group's ranks whose affinity meets it, and at most the machine's cores
over the job's ranks here (a sub-group's other ranks run here too), at most 8 (a socket's
bandwidth is reached before that). The group takes the smallest T of its ranks, and no more
lanes than half of /dev/shm's free space holds. A rank bound to one core, or ranks that share
their cores, get no lanes: the level never puts a thread on a core outside the call's own, and
its threads sleep between calls. ``sc.empty`` arrays split too: the group lends its heaps to the
lanes (``_core.lend_heaps``), so each lane runs its piece zero copy, as the flat path
runs the whole (one thread reading and writing every rank's array cannot reach the memory's
bandwidth either).

Not yet measured on a machine with many cores per rank (``bench/bench_threads.py``).

Example::

    SHMCOMM_RANK_THREADS=8 shmrun -n 2 --bind-to numa python decode.py   # 8 threads a rank
    pg._comm.levels[0].calls                                            # calls it split
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import numpy as np

import shmcomm._core as _core
from shmcomm.hierarchy.level import check_same_call, run_or_abort
from shmcomm.multinode.link import descriptor

__all__ = ["ThreadsLevel", "attach", "install", "default_threads", "pieces"]

# The default bound: a socket's memory bandwidth is reached before this many threads copy and
# reduce, and every thread is one more group segment in /dev/shm.
DEFAULT_MAX_THREADS = 8
# The descriptor's column (counts, unused by all_reduce) that carries whether the rank's call is
# async: the ranks may differ there, and then no rank splits.
_ASYNC = 5
_HOW = "split over the ranks' threads"
# CPU ids told to the other ranks (glibc's CPU_SETSIZE): 16 words of 64 bits.
_MASK_WORDS = 16


def attach(comm: _core.Communicator) -> ThreadsLevel | None:
    """Give ``comm`` lanes for its large all_reduces where its ranks own several cores each (see
    the module's text), else None. Collective over ``comm``'s ranks: every rank tells the others
    its setting, affinity and free /dev/shm, and all decide alike from the same rows.

    Example::

        level = attach(comm)     # None where each rank owns one core
    """
    size = comm.size
    if size < 2:
        return None
    settings = _core.group_settings(size, comm.threads_per_rank, comm.busy_ranks)
    threshold, asked = settings["threads_bytes"], settings["rank_threads"]
    # Decided without an exchange where every rank decides alike: off by its setting (as the
    # NUMA level's threshold), or fewer than two cores per rank of the job on this machine.
    if threshold == 0 or asked == 1 or (asked == 0 and (os.cpu_count() or 1) // max(comm.busy_ranks, 1) < 2):
        return None
    mine = np.zeros(3 + _MASK_WORDS, np.int64)
    mine[0], mine[1] = asked, threshold
    mine[2] = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    cpus = [c for c in os.sched_getaffinity(0) if c < 64 * _MASK_WORDS]
    np.bitwise_or.at(mine[3:].view(np.uint64), [c // 64 for c in cpus],
                     np.left_shift(np.uint64(1), np.array([c % 64 for c in cpus], np.uint64)))
    rows = np.empty((size, mine.size), np.int64)
    comm.all_gather_into(rows, mine)
    threads = min(default_threads(rows, r, os.cpu_count() or 1, comm.busy_ranks) for r in range(size))
    lane_bytes = _lane_segment_bytes(size, comm.slot_bytes, comm.ring_bytes)
    threads = min(threads, int(rows[:, 2].min()) // (2 * lane_bytes))
    if threads < 2:
        return None
    return install(comm, threads, int(rows[:, 1].max()))


def default_threads(rows: np.ndarray, rank: int, machine_cores: int, busy_ranks: int) -> int:
    """Rank ``rank``'s threads from the rows ``attach`` exchanges (setting, threshold, free
    /dev/shm, affinity mask words): its setting where above 0, else its share of the cores.

    Example::

        >>> row = lambda mask: [0, 1 << 20, 1 << 30, mask] + [0] * 15
        >>> default_threads(np.array([row(0xFF), row(0xFF00)]), 0, 16, 2)   # bound, 8 cores each
        8
        >>> default_threads(np.array([row(0xFFFF), row(0xFFFF)]), 0, 16, 2)  # unbound: a half
        8
        >>> default_threads(np.array([row(0x1), row(0x2)]), 0, 2, 2)         # a core each
        1
    """
    asked = int(rows[rank, 0])
    if asked > 0:
        return asked
    masks = rows[:, 3:].view(np.uint64)
    own = int(sum(bin(int(w)).count("1") for w in masks[rank]))
    sharing = int(((masks & masks[rank]) != 0).any(axis=1).sum())
    return max(1, min(DEFAULT_MAX_THREADS, own // max(sharing, 1), machine_cores // max(busy_ranks, 1)))


def _lane_segment_bytes(size: int, slot_bytes: int, ring_bytes: int) -> int:
    """About what one lane's group segment reserves in /dev/shm (layout.pxi's sum)."""
    return size * size * (ring_bytes + 4096) + 2 * size * slot_bytes + (1 << 20)


def install(comm: _core.Communicator, threads: int, threshold: int) -> ThreadsLevel:
    """``attach``'s second half: the level of ``threads`` threads a rank serving all_reduce from
    ``threshold`` bytes. Every rank passes the same numbers. Its lanes are made by the first
    call that needs them (a group that never makes a large call costs nothing). Tests call it,
    then ``shmcomm.hierarchy.add_routes``, with the threads they like.

    Example::

        add_routes(comm, install(comm, 3, 1 << 20))
    """
    return ThreadsLevel(comm, threads, threshold)


def pieces(count: int, itemsize: int, threads: int, min_piece_bytes: int) -> list[tuple[int, int]]:
    """The (start, stop) elements of each lane's piece of ``count`` elements: at most
    ``threads`` pieces, none under ``min_piece_bytes`` (but the last), each starting on a
    64-byte bound (relative to the array's start). The same list on every rank.

    Example::

        >>> pieces(1000, 4, 3, 64)
        [(0, 336), (336, 672), (672, 1000)]
        >>> pieces(1000, 4, 8, 2000)
        [(0, 512), (512, 1000)]
    """
    nbytes = count * itemsize
    n = max(1, min(threads, nbytes // max(min_piece_bytes, 1)))
    line = max(1, 64 // itemsize) if 64 % itemsize == 0 else 1
    step = -(-count // n)
    step = max(1, -(-step // line) * line)
    return [(a, min(a + step, count)) for a in range(0, count, step)] or [(0, 0)]


class ThreadsLevel:
    """The threads of one group's large all_reduces (``attach`` makes it; a ``Level``):
    ``threads`` a rank, each the progress thread of one of ``lanes``, groups over the group's
    ranks made by the first call that needs them. It serves ``all_reduce`` of ``threshold``
    bytes and more.

    Example::

        level = pg._comm.levels[0]
        level.threads, level.calls      # threads a rank, calls it split
    """

    min_ranks = 2
    bfloat16 = True  # a torch bfloat16 tensor's pieces stay tensors: no ml_dtypes needed
    shared = True  # sc.empty arrays too: each lane finds the group's heaps and runs its piece zero copy

    def __init__(self, comm: _core.Communicator, threads: int, threshold: int):
        self.routes = (("all_reduce", threshold),)
        self.threads = threads
        self.lanes: list[_core.Communicator] = []
        self._comm = comm
        self._min_piece = max(64, threshold // threads)
        self._running: list[Any] = []   # the pieces in flight on lanes 1.. (waited on failure)
        self.calls = 0

    def all_reduce(self, array: Any, op: int, async_op: bool, factor: float):
        """Run ``array``'s all_reduce in pieces on the lanes, in issue order on the group's engine
        (in one piece where any rank's call is async: see the module's text)."""
        a, dtype = _core.as_numpy(array, "array", True)
        if dtype == "bfloat16" and a.dtype.name != "bfloat16":
            a = array.view(-1)   # a torch tensor seen as int16: its pieces must stay bfloat16
        else:
            a = a.reshape(-1)
        mine = descriptor("all_reduce", None, op, nbytes=a.nbytes, dtype=dtype)
        mine[_ASYNC] = async_op
        return self._comm.submit(self._run, (a, op, factor, mine), [array], async_op)

    def _run(self, whole: Any, op: int, factor: float, mine: np.ndarray) -> None:
        rows = check_same_call(self._comm, mine, _HOW, free=_ASYNC)
        threads = 1 if any(rows[:, _ASYNC].tolist()) else self.threads
        run_or_abort(self._comm, _HOW, self._pieces, (whole, op, factor, threads), self.abort,
                     self._settle)
        self.calls += threads > 1

    def _pieces(self, whole: Any, op: int, factor: float, threads: int) -> None:
        while len(self.lanes) < threads:  # every rank is in this call: made together
            lane = self._comm.derive(f"threads{len(self.lanes)}", range(self._comm.size),
                                     threads_per_rank=self.threads)
            lane.rest_until_kicked()  # its thread wakes for its pieces only, never to look
            _core.lend_heaps(self._comm, lane)  # an sc.empty array's pieces: zero copy on the lane too
            self.lanes.append(lane)
        count = whole.shape[0]
        itemsize = whole.nbytes // count if count else 1
        (a0, b0), *rest = pieces(count, itemsize, threads, self._min_piece)
        for lane, (a, b) in zip(self.lanes[1:], rest):
            self._running.append(lane.all_reduce(whole[a:b], op, True, factor))
            lane.start_issued()
        self.lanes[0].all_reduce(whole[a0:b0], op, False, factor)
        while self._running:
            self._running[0].wait()   # a failure leaves it (and those after it) to _settle
            del self._running[0]

    def _settle(self) -> None:
        """After an abort: wait until no lane still writes into the caller's array."""
        running, self._running = self._running, []
        for work in running:
            try:
                work.wait()
            except BaseException:
                pass

    def abort(self, reason: str | None, cause: BaseException | None = None) -> None:
        """Abort every lane (the whole group's abort calls it), with its ``cause``."""
        for lane in self.lanes:
            lane.abort(reason, cause)

    def close(self) -> None:
        """Leave every lane (the whole group's close calls it)."""
        errors = []
        for lane in self.lanes:
            try:
                lane.close()
            except BaseException as exc:  # leave the others all the same
                errors.append(exc)
        if errors:
            raise errors[0]
