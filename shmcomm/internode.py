"""The engine between nodes of a hierarchical group: the interface it offers, and torch's gloo.

A group whose ranks span several machines (shmcomm.hierarchy) runs shared memory inside each
node and calls an inter-node engine for the rest. The engine hands out *links*: one inter-node
communicator over some ranks of the group. A hierarchical group uses two:

- its **rail**: the ranks with this rank's local index on every node (one per node);
- its **world**: every rank of the group (point to point, all_to_all, gather, scatter, and
  everything when nodes hold different numbers of ranks).

A link's methods take contiguous 1-D torch CPU tensors of any dtype and block until done (the
hierarchy runs them on its group's progress thread); ``op`` is a shmcomm op code without AVG
and PREMUL_SUM (the hierarchy turns those into SUM). Another engine (mpi4py, say) is one more
``connect`` function returning objects with these methods::

    rail, world = connect_gloo(store, rank=3, size=4, timeout=60.0, rails=[[0, 2], [1, 3]])
    rail.all_reduce(t, 0)          # SUM over ranks 1 and 3 (rank 3 is in the second rail)
"""

from __future__ import annotations

import datetime
import zlib

from shmcomm.errors import CollectiveMismatchError
from shmcomm.scratch import Scratch

__all__ = ["BUSY_THREADS", "GlooLink", "connect_gloo"]

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


def _gloo_ops():
    import torch.distributed as dist

    from shmcomm.ops import ReduceOp

    r = dist.ReduceOp
    return {int(ReduceOp.SUM): r.SUM, int(ReduceOp.PRODUCT): r.PRODUCT, int(ReduceOp.MIN): r.MIN,
            int(ReduceOp.MAX): r.MAX, int(ReduceOp.BAND): r.BAND, int(ReduceOp.BOR): r.BOR,
            int(ReduceOp.BXOR): r.BXOR}


def _native_reductions():
    """(dtype, op code) pairs gloo reduces itself; others go by all-gather + shmcomm's kernel."""
    import torch

    from shmcomm.ops import ReduceOp

    arithmetic = [int(ReduceOp[name]) for name in ("SUM", "PRODUCT", "MIN", "MAX")]
    bitwise = [int(ReduceOp[name]) for name in ("BAND", "BOR", "BXOR")]
    floats = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    ints = (torch.int8, torch.uint8, torch.int32, torch.int64)
    pairs = {(d, op) for d in floats for op in arithmetic}
    pairs |= {(d, op) for d in ints for op in arithmetic + bitwise}
    pairs |= {(d, int(ReduceOp.SUM)) for d in (torch.complex64, torch.complex128)}
    return pairs


def _reduce_in_order(out, mine, theirs, rank: int, op: int) -> None:
    """``out`` = op(link rank 0's values, link rank 1's): the same order, so the same bits, on
    both ranks of a two-rank link."""
    from shmcomm._core import reduce_kernel

    reduce_kernel(out, [mine, theirs] if rank == 0 else [theirs, mine], op)


# Link collectives by descriptor code; a link's ranks exchange (kind, dtype, bytes, op, root)
# before each one (GlooLink._agree).
_KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
          "barrier")


def _dtype_code(t) -> int:
    """The same number for the same dtype in every process (a hash of its name)."""
    return zlib.crc32(str(t.dtype).encode()) if t is not None else 0


def _describe(row: list[int], dtype_names: dict[int, str]) -> str:
    kind, dtype, nbytes, op, root = row
    name = _KINDS[kind] if 0 <= kind < len(_KINDS) else f"kind {kind}"
    args = [f"dtype={dtype_names.get(dtype, dtype)}", f"nbytes={nbytes}"]
    if op >= 0:
        args.append(f"op={op}")
    if root >= 0:
        args.append(f"root={root}")
    return f"{name}({', '.join(args)})"


def _bytes(t):
    """``t``'s memory as uint8 (gloo moves every dtype this way, whatever kernels it has)."""
    import torch

    if not t.numel():  # an empty tensor may have any strides, which view() refuses
        return torch.empty(0, dtype=torch.uint8)
    return t.view(torch.uint8)


class GlooLink:
    """One inter-node communicator: a torch ``ProcessGroupGloo`` over ``size`` ranks.

    Data moves as bytes, so every dtype crosses. A two-rank link that carries no users'
    messages (``carries_p2p=False``: the rails) reduces and gathers by swapping values with its
    peer and running shmcomm's kernel; other links use gloo's collectives, and reductions gloo
    has no kernel for (int16, unsigned wide types, bool, complex products...) all-gather the
    values and reduce them with shmcomm's kernel in link-rank order. Every rank gets the same
    bits either way.

    Example::

        link = GlooLink(store, "shmcomm/rail0", rank=1, size=2, timeout=60.0)
        link.broadcast(t, root=0)
    """

    def __init__(self, store, prefix: str, rank: int, size: int, timeout: float,
                 carries_p2p: bool = False):
        import torch.distributed as dist

        self._dist = dist
        self._ops = _gloo_ops()
        self._native = _native_reductions()
        self.rank, self.size = rank, size
        # swaps are tagged point-to-point messages: only on a link no user message could match
        self._swaps = size == 2 and not carries_p2p
        self._scratch = Scratch()  # what a swap receives
        self._pg = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size,
                                         datetime.timedelta(seconds=timeout))

    def _agree(self, kind: str, t=None, op: int = -1, root: int = -1, nbytes: int | None = None) -> None:
        """Check that every rank of the link called the same collective with the same dtype,
        size, op and root, before any data moves: CollectiveMismatchError on every rank, as on
        one node. (Unchecked, gloo aborted the process on different sizes and reduced the bytes
        of different dtypes into garbage.) One small exchange: a swap on two-rank rails, an
        all-gather elsewhere."""
        import torch

        if nbytes is None:
            nbytes = t.numel() * t.element_size() if t is not None else 0
        mine = torch.tensor([_KINDS.index(kind), _dtype_code(t), nbytes, op, root], dtype=torch.int64)
        every = torch.empty(self.size * 5, dtype=torch.int64)
        if self._swaps:
            self._swap(mine, every[(1 - self.rank) * 5:(2 - self.rank) * 5])
            every[self.rank * 5:(self.rank + 1) * 5] = mine
        else:
            self._pg._allgather_base(every, mine).wait()
        rows = every.view(self.size, 5).tolist()
        if any(row != rows[0] for row in rows):
            names = {_dtype_code(torch.empty(0, dtype=d)): str(d).replace("torch.", "") for d in
                     (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                      torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
                      torch.complex64, torch.complex128)}
            lines = [f"link rank {q}: {_describe(row, names)}" for q, row in enumerate(rows)]
            raise CollectiveMismatchError("ranks on different nodes called different collectives or "
                                          "arguments:\n  " + "\n  ".join(lines))

    def _op(self, op: int):
        try:
            return self._ops[op]
        except KeyError:
            raise ValueError(f"op code {op} has no inter-node form") from None

    def all_reduce(self, t, op: int) -> None:
        """Reduce ``t`` in place over the link's ranks."""
        self._agree("all_reduce", t, op)
        if not t.numel():
            return
        if self._swaps:
            theirs = self._swap(t, self._scratch.take(t.numel(), t.dtype))
            return _reduce_in_order(t, t, theirs, self.rank, op)
        if (t.dtype, op) not in self._native or t.numel() * t.element_size() <= GATHER_BYTES:
            return self._reduce_gathered(t, t, op)
        opts = self._dist.AllreduceOptions()
        opts.reduceOp = self._op(op)
        self._pg.allreduce([t], opts).wait()

    def _swap(self, mine, theirs):
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

    def _reduce_gathered(self, out, t, op: int, piece: int | None = None) -> None:
        """``out`` = op over every rank's ``t`` (or over its piece ``piece``), by shmcomm's kernel."""
        import torch

        from shmcomm._core import reduce_kernel

        n = t.numel()
        every = torch.empty(self.size * n, dtype=t.dtype)
        self._all_gather_into(every, t)
        lo, hi = (0, n) if piece is None else (piece * out.numel(), (piece + 1) * out.numel())
        reduce_kernel(out, [every[q * n + lo:q * n + hi] for q in range(self.size)], op)

    def broadcast(self, t, root: int) -> None:
        """Copy link rank ``root``'s ``t`` into every rank's."""
        self._agree("broadcast", t, root=root)
        opts = self._dist.BroadcastOptions()
        opts.rootRank = root
        self._pg.broadcast([_bytes(t)], opts).wait()

    def all_gather_into(self, out, t) -> None:
        """``out`` = every rank's ``t``, in link-rank order."""
        self._agree("all_gather", t)
        self._all_gather_into(out, t)

    def _all_gather_into(self, out, t) -> None:
        if self._swaps and t.numel():
            n, peer = t.numel(), 1 - self.rank
            self._swap(t, out[peer * n:(peer + 1) * n])
            out[self.rank * n:(self.rank + 1) * n].copy_(t)
            return
        self._pg._allgather_base(_bytes(out), _bytes(t)).wait()

    def reduce_scatter_into(self, out, t, op: int) -> None:
        """``out`` on link rank r = reduction of piece r of every rank's ``t``."""
        self._agree("reduce_scatter", t, op)
        if not out.numel():
            return
        if self._swaps:
            n, peer = out.numel(), 1 - self.rank
            theirs = self._swap(t[peer * n:(peer + 1) * n], self._scratch.take(n, out.dtype))
            return _reduce_in_order(out, t[self.rank * n:(self.rank + 1) * n], theirs, self.rank, op)
        if (t.dtype, op) not in self._native:
            return self._reduce_gathered(out, t, op, piece=self.rank)
        opts = self._dist.ReduceScatterOptions()
        opts.reduceOp = self._op(op)
        self._pg._reduce_scatter_base(out, t, opts).wait()

    def all_to_all_single(self, out, t, out_splits: list, in_splits: list) -> None:
        """Rank q gets the ``in_splits[q]`` elements of ``t`` meant for it, into ``out``."""
        self._agree("all_to_all", t, nbytes=0)  # sizes differ by rank; each pair is checked by gloo
        width = t.element_size()
        self._pg.alltoall_base(_bytes(out), _bytes(t), [s * width for s in out_splits],
                               [s * width for s in in_splits], self._dist.AllToAllOptions()).wait()

    def gather(self, t, outs: list | None, root: int) -> None:
        """Link rank ``root``'s ``outs[q]`` = rank q's ``t``."""
        self._agree("gather", t, root=root)
        opts = self._dist.GatherOptions()
        opts.rootRank = root
        self._pg.gather([[_bytes(o) for o in outs]] if outs is not None else [], [_bytes(t)],
                        opts).wait()

    def scatter(self, t, ins: list | None, root: int) -> None:
        """Rank q's ``t`` = link rank ``root``'s ``ins[q]``."""
        self._agree("scatter", t, root=root)
        opts = self._dist.ScatterOptions()
        opts.rootRank = root
        self._pg.scatter([_bytes(t)], [[_bytes(a) for a in ins]] if ins is not None else [],
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

    def isend(self, t, dst: int, tag: int):
        """Start sending ``t`` to link rank ``dst``: a torch Work."""
        return self._pg.send([_bytes(t)], dst, tag)

    def irecv(self, t, src: int | None, tag: int):
        """Start receiving into ``t`` from ``src`` (None: any rank): a torch Work."""
        t = _bytes(t)
        return self._pg.recv_anysource([t], tag) if src is None else self._pg.recv([t], src, tag)


def connect_gloo(store, rank: int, size: int, timeout: float, rails: list[list[int]] | None,
                 key: str = "shmcomm"):
    """This rank's rail link (None without ``rails``) and the world link, over ``store`` under
    ``key`` (unique to this group and incarnation).

    ``rails`` lists the group ranks of each rail; every rank of the group must call this with
    the same arguments but its own ``rank`` (each link is a collective rendezvous).

    Example::

        rail, world = connect_gloo(store, 0, 4, 60.0, [[0, 2], [1, 3]])
    """
    rail = None
    if rails:
        index = next(i for i, members in enumerate(rails) if rank in members)
        rail = GlooLink(store, f"{key}/rail{index}/", rails[index].index(rank), len(rails[index]),
                        timeout)
    world = GlooLink(store, f"{key}/world/", rank, size, timeout, carries_p2p=True)
    return rail, world
