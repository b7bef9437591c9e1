"""The gloo engine between nodes (``SHMCOMM_LINK=gloo``, the default): torch's
``ProcessGroupGloo``, one per link, over the store of torchrun or ``shmrun --nnodes``.

Links take numpy arrays (``shmcomm.multinode.link``); the conversion to torch tensors, which
gloo moves, is kept here. Data moves as bytes, so every dtype crosses::

    rail, world = connect(StoreMeeting(store, "shmcomm/0", rank=3, size=4), 60.0, [[0, 2], [1, 3]])
    rail.all_reduce(a, 0)          # SUM over ranks 1 and 3 (rank 3 is in the second rail)
"""

from __future__ import annotations

import os

import numpy as np

from shmcomm._core import reduce_kernel
from shmcomm.errors import ShmcommError
from shmcomm.multinode.link import Launch, check_same, descriptor
from shmcomm.hierarchy.scratch import Scratch
from shmcomm.multinode.store import StoreMeeting, from_environment, torch_timeout
from shmcomm.hierarchy.topology import spans_nodes
from shmcomm.ops import ReduceOp

__all__ = ["BUSY_THREADS", "GlooLink", "connect", "launch"]

# Threads of a rank that a busy link keeps on a core: gloo's transport loop and its work thread
# (the rank's own thread waits). A node group counts them when deciding whether waiting may spin.
BUSY_THREADS = 2

# all_reduce of at most this many bytes: all-gather and reduce here. gloo's ring sends several
# small messages per peer, one after another, and over TCP that measured 0.3-7 ms for 1 KiB on
# loopback where one all-gather took 0.2 ms.
GATHER_BYTES = 64 << 10

# The tag of a 2-rank link's swaps (GlooLink._swap). Only links that carry no users' messages
# swap (not the world link), so swaps match each other in issue order.
_SWAP_TAG = 0x5C

# (dtype name, op code) pairs gloo reduces itself; others go by all-gather + shmcomm's kernel.
_ARITHMETIC = [int(ReduceOp[name]) for name in ("SUM", "PRODUCT", "MIN", "MAX")]
_BITWISE = [int(ReduceOp[name]) for name in ("BAND", "BOR", "BXOR")]
_NATIVE = ({(d, op) for d in ("float32", "float64", "float16", "bfloat16") for op in _ARITHMETIC}
           | {(d, op) for d in ("int8", "uint8", "int32", "int64") for op in _ARITHMETIC + _BITWISE}
           | {(d, int(ReduceOp.SUM)) for d in ("complex64", "complex128")})


def _gloo_ops():
    import torch.distributed as dist

    r = dist.ReduceOp
    return {int(ReduceOp.SUM): r.SUM, int(ReduceOp.PRODUCT): r.PRODUCT, int(ReduceOp.MIN): r.MIN,
            int(ReduceOp.MAX): r.MAX, int(ReduceOp.BAND): r.BAND, int(ReduceOp.BOR): r.BOR,
            int(ReduceOp.BXOR): r.BXOR}


# ---- numpy -> torch: the views gloo moves ---------------------------------------------------------
def _from_numpy(a: np.ndarray):
    """A tensor sharing ``a``'s memory (a copy of a read-only array, which torch will not share;
    only inputs are ever read-only)."""
    import torch

    return torch.from_numpy(a if a.flags.writeable else a.copy())


def _bytes(a: np.ndarray):
    """``a``'s memory as a uint8 tensor (gloo moves every dtype this way, whatever kernels it has)."""
    return _from_numpy(a.view(np.uint8))


def _typed(a: np.ndarray):
    """``a`` as a tensor of its own dtype, for gloo's own reductions (``_NATIVE`` dtypes only)."""
    import torch

    if a.dtype.name == "bfloat16":  # ml_dtypes
        return _from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return _from_numpy(a)


def _reduce_in_order(out: np.ndarray, mine: np.ndarray, theirs: np.ndarray, rank: int, op: int) -> None:
    """``out`` = op(link rank 0's values, link rank 1's): the same order, so the same bits, on
    both ranks of a two-rank link."""
    reduce_kernel(out, [mine, theirs] if rank == 0 else [theirs, mine], op)


class _GlooRequest:
    """A ``link.Request`` over a torch Work of gloo's point to point."""

    def __init__(self, work, keep):
        self._work, self._keep = work, keep  # the tensors gloo reads or writes, kept alive

    def wait(self, timeout: float | None = None) -> None:
        if timeout is None:
            self._work.wait()  # bounded by the link's timeout
        else:
            self._work.wait(torch_timeout(float(timeout)))

    def done(self) -> bool:
        return self._work.is_completed()

    def source(self) -> int:
        return self._work._source_rank()


class GlooLink:
    """One inter-node communicator: a torch ``ProcessGroupGloo`` over ``size`` ranks.

    ``checked``: each collective first compares every rank's descriptor (``_agree``); off for
    the composition, which compares each composed call's once, before any link moves data.

    A two-rank link that carries no users' messages (``carries_p2p=False``: the rails) reduces
    and gathers by swapping values with its peer and running shmcomm's kernel; other links use
    gloo's collectives, and reductions gloo has no kernel for (int16, unsigned wide types, bool,
    complex products...) all-gather the values and reduce them with shmcomm's kernel in
    link-rank order. Every rank gets the same bits either way.

    Example::

        link = GlooLink(store, "shmcomm/rail0", rank=1, size=2, timeout=60.0)
        link.broadcast(a, root=0)
    """

    def __init__(self, store, prefix: str, rank: int, size: int, timeout: float,
                 carries_p2p: bool = False, checked: bool = True):
        import torch.distributed as dist

        self._dist = dist
        self._ops = _gloo_ops()
        self.rank, self.size, self._checked = rank, size, checked
        # swaps are tagged point-to-point messages: only on a link no user message could match
        self._swaps = size == 2 and not carries_p2p
        self._scratch = Scratch()  # what a swap receives
        self._pg = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size,
                                         torch_timeout(timeout))

    def _agree(self, kind: str, a: np.ndarray | None = None, op: int = -1, root: int = -1,
               nbytes: int | None = None) -> None:
        """Check that every rank of the link called the same collective with the same dtype,
        size, op and root, before any data moves (``link.check_same``). (Unchecked, gloo aborted
        the process on different sizes and reduced the bytes of different dtypes into garbage.)
        One small exchange: a swap on two-rank rails, an all-gather elsewhere."""
        if not self._checked:
            return
        mine = descriptor(kind, a, op, root, nbytes)
        every = np.empty((self.size, mine.size), np.int64)
        self._all_gather_into(every.reshape(-1), mine)
        check_same(every)

    def _op(self, op: int):
        try:
            return self._ops[op]
        except KeyError:
            raise ValueError(f"op code {op} has no inter-node form") from None

    def all_reduce(self, a: np.ndarray, op: int) -> None:
        """Reduce ``a`` in place over the link's ranks."""
        self._agree("all_reduce", a, op)
        if not a.size:
            return
        if self._swaps:
            theirs = self._swap(a, self._scratch.take(a.size, a.dtype))
            return _reduce_in_order(a, a, theirs, self.rank, op)
        if (a.dtype.name, op) not in _NATIVE or a.nbytes <= GATHER_BYTES:
            return self._reduce_gathered(a, a, op)
        opts = self._dist.AllreduceOptions()
        opts.reduceOp = self._op(op)
        self._pg.allreduce([_typed(a)], opts).wait()

    def _swap(self, mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
        """Two ranks: send ``mine`` to the other rank while receiving its counterpart into
        ``theirs`` (returned).

        Two-rank links (the rails of a two-node job) gather and reduce this way: the same bytes
        cross as in gloo's ring (reduce-scatter, then all-gather), but in one round trip instead
        of two dependent ones, and shmcomm's kernel reduces. On 2 simulated nodes x 2 ranks, in
        runs alternating with the ring, a 32 MiB all_reduce took 0.54-0.59x plain gloo's time
        instead of 0.60-0.65x, and 8 B 0.37 ms instead of 0.56.
        """
        peer = 1 - self.rank
        receiving = self._pg.recv([_bytes(theirs)], peer, _SWAP_TAG)
        sending = self._pg.send([_bytes(mine)], peer, _SWAP_TAG)
        receiving.wait()
        sending.wait()
        return theirs

    def _reduce_gathered(self, out: np.ndarray, a: np.ndarray, op: int, piece: int | None = None) -> None:
        """``out`` = op over every rank's ``a`` (or over its piece ``piece``), by shmcomm's kernel."""
        n = a.size
        every = np.empty(self.size * n, a.dtype)
        self._all_gather_into(every, a)
        lo, hi = (0, n) if piece is None else (piece * out.size, (piece + 1) * out.size)
        reduce_kernel(out, [every[q * n + lo:q * n + hi] for q in range(self.size)], op)

    def broadcast(self, a: np.ndarray, root: int) -> None:
        """Copy link rank ``root``'s ``a`` into every rank's."""
        self._agree("broadcast", a, root=root)
        opts = self._dist.BroadcastOptions()
        opts.rootRank = root
        self._pg.broadcast([_bytes(a)], opts).wait()

    def all_gather_into(self, out: np.ndarray, a: np.ndarray) -> None:
        """``out`` = every rank's ``a``, in link-rank order."""
        self._agree("all_gather", a)
        self._all_gather_into(out, a)

    def _all_gather_into(self, out: np.ndarray, a: np.ndarray) -> None:
        if self._swaps and a.size:
            n, peer = a.size, 1 - self.rank
            self._swap(a, out[peer * n:(peer + 1) * n])
            out[self.rank * n:(self.rank + 1) * n] = a
            return
        self._pg._allgather_base(_bytes(out), _bytes(a)).wait()

    def reduce_scatter_into(self, out: np.ndarray, a: np.ndarray, op: int) -> None:
        """``out`` on link rank r = reduction of piece r of every rank's ``a``."""
        self._agree("reduce_scatter", a, op)
        if not out.size:
            return
        if self._swaps:
            n, peer = out.size, 1 - self.rank
            theirs = self._swap(a[peer * n:(peer + 1) * n], self._scratch.take(n, out.dtype))
            return _reduce_in_order(out, a[self.rank * n:(self.rank + 1) * n], theirs, self.rank, op)
        if (a.dtype.name, op) not in _NATIVE:
            return self._reduce_gathered(out, a, op, piece=self.rank)
        opts = self._dist.ReduceScatterOptions()
        opts.reduceOp = self._op(op)
        self._pg._reduce_scatter_base(_typed(out), _typed(a), opts).wait()

    def all_to_all_single(self, out: np.ndarray, a: np.ndarray, out_splits: list, in_splits: list) -> None:
        """Rank q gets the ``in_splits[q]`` elements of ``a`` meant for it, into ``out``."""
        self._agree("all_to_all", a, nbytes=0)  # sizes differ by rank; each pair is checked by gloo
        width = a.itemsize
        self._pg.alltoall_base(_bytes(out), _bytes(a), [s * width for s in out_splits],
                               [s * width for s in in_splits], self._dist.AllToAllOptions()).wait()

    def gather(self, a: np.ndarray, outs: list | None, root: int) -> None:
        """Link rank ``root``'s ``outs[q]`` = rank q's ``a``."""
        self._agree("gather", a, root=root)
        opts = self._dist.GatherOptions()
        opts.rootRank = root
        self._pg.gather([[_bytes(o) for o in outs]] if outs is not None else [], [_bytes(a)],
                        opts).wait()

    def scatter(self, a: np.ndarray, ins: list | None, root: int) -> None:
        """Rank q's ``a`` = link rank ``root``'s ``ins[q]``."""
        self._agree("scatter", a, root=root)
        opts = self._dist.ScatterOptions()
        opts.rootRank = root
        self._pg.scatter([_bytes(a)], [[_bytes(x) for x in ins]] if ins is not None else [],
                         opts).wait()

    def barrier(self) -> None:
        """Return once every rank of the link called it."""
        self._agree("barrier")
        self._pg.barrier(self._dist.BarrierOptions()).wait()

    def close(self) -> None:
        """Stop gloo's threads and close its connections (idempotent)."""
        pg, self._pg = self._pg, None
        self._scratch.release()
        if pg is not None:
            pg.shutdown()

    def isend(self, a: np.ndarray, dst: int, tag: int) -> _GlooRequest:
        """Start sending ``a`` to link rank ``dst``."""
        t = _bytes(a)
        return _GlooRequest(self._pg.send([t], dst, tag), t)

    def irecv(self, a: np.ndarray, src: int | None, tag: int) -> _GlooRequest:
        """Start receiving into ``a`` from ``src`` (None: any rank)."""
        t = _bytes(a)
        work = self._pg.recv_anysource([t], tag) if src is None else self._pg.recv([t], src, tag)
        return _GlooRequest(work, t)


def launch(name: str | None, timeout: float | None) -> Launch | None:
    """``init_process_group()`` under torchrun or ``shmrun --nnodes``: rank, world size and job
    from their environment; None when it says one node. Needs torch (the ``shmcomm[torch]``
    extra): without it, a clear error at once, never a timeout.

    Example::

        started = launch(None, None)   # under torchrun --nnodes 2
    """
    from shmcomm.world import job_arguments
    from shmcomm.multinode.mpi_link import launched_by_mpi

    try:
        rank, size, job, timeout = job_arguments(None, None, name, timeout)
    except ValueError as exc:
        if launched_by_mpi():  # mpirun sets none of torchrun's variables
            raise ValueError(f"{exc}; under mpirun, set SHMCOMM_LINK=mpi") from None
        raise
    if not spans_nodes(size):
        return None
    local_size = os.environ.get("LOCAL_WORLD_SIZE")
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        raise ShmcommError(
            f"ranks span several nodes (WORLD_SIZE={size}, LOCAL_WORLD_SIZE={local_size}): between "
            "nodes shmcomm uses torch's gloo; install the extra: pip install 'shmcomm[torch]'") from None
    return Launch(from_environment(rank, size, job, timeout), job, timeout,
                  f"WORLD_SIZE={size} but LOCAL_WORLD_SIZE={local_size}, yet every rank runs on "
                  "this machine: fix the launch environment")


def connect(meeting, timeout: float, rails: list[list[int]] | None, checked: bool = True):
    """This rank's rail link (None without ``rails``) and the world link, over the store of
    ``meeting`` (a ``StoreMeeting``) under its key (``checked``: as ``GlooLink``'s). Collective
    over the meeting.

    Example::

        rail, world = connect(StoreMeeting(store, "shmcomm/0", 0, 4), 60.0, [[0, 2], [1, 3]])
    """
    if not isinstance(meeting, StoreMeeting):
        raise ShmcommError("SHMCOMM_LINK=gloo meets through torch's store (torchrun, shmrun "
                           "--nnodes); under mpirun set SHMCOMM_LINK=mpi")
    rank, size = meeting.rank, meeting.size
    rail = None
    if rails:
        index = next(i for i, members in enumerate(rails) if rank in members)
        rail = GlooLink(meeting.store, f"{meeting.key}/rail{index}/", rails[index].index(rank),
                        len(rails[index]), timeout, checked=checked)
    world = GlooLink(meeting.store, f"{meeting.key}/world/", rank, size, timeout, carries_p2p=True,
                     checked=checked)
    return rail, world
