"""The engine between nodes of a hierarchical group: the interface it offers, and torch's gloo.

A group whose ranks span several machines (shmcomm.hierarchy) runs shared memory inside each
node and calls an inter-node engine for the rest. The engine hands out *links*: one inter-node
communicator over some ranks of the group. A hierarchical group uses two:

- its **rail**: the ranks with this rank's local index on every node (one per node);
- its **world**: every rank of the group (point to point, all_to_all, gather, scatter, and
  everything when nodes hold different numbers of ranks).

A link's methods take contiguous torch CPU tensors and block until done (the hierarchy runs
them on its group's progress thread); ``op`` is a shmcomm op code without AVG and PREMUL_SUM
(the hierarchy turns those into SUM). Another engine (mpi4py, say) is one more ``connect``
function returning objects with these methods::

    rail, world = connect_gloo(store, rank=3, size=4, timeout=60.0, rails=[[0, 2], [1, 3]])
    rail.all_reduce(t, 0)          # SUM over ranks 1 and 3 (rank 3 is in the second rail)
"""

from __future__ import annotations

import datetime

__all__ = ["GlooLink", "connect_gloo"]


def _gloo_ops():
    import torch.distributed as dist

    from shmcomm.ops import ReduceOp

    r = dist.ReduceOp
    return {int(ReduceOp.SUM): r.SUM, int(ReduceOp.PRODUCT): r.PRODUCT, int(ReduceOp.MIN): r.MIN,
            int(ReduceOp.MAX): r.MAX, int(ReduceOp.BAND): r.BAND, int(ReduceOp.BOR): r.BOR,
            int(ReduceOp.BXOR): r.BXOR}


class GlooLink:
    """One inter-node communicator: a torch ``ProcessGroupGloo`` over ``size`` ranks.

    Example::

        link = GlooLink(store, "shmcomm/rail0", rank=1, size=2, timeout=60.0)
        link.broadcast(t, root=0)
    """

    def __init__(self, store, prefix: str, rank: int, size: int, timeout: float):
        import torch.distributed as dist

        self._dist = dist
        self._ops = _gloo_ops()
        self.rank, self.size = rank, size
        self._pg = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size,
                                         datetime.timedelta(seconds=timeout))

    def _op(self, op: int):
        try:
            return self._ops[op]
        except KeyError:
            raise ValueError(f"op code {op} has no inter-node form") from None

    def all_reduce(self, t, op: int) -> None:
        """Reduce ``t`` in place over the link's ranks."""
        opts = self._dist.AllreduceOptions()
        opts.reduceOp = self._op(op)
        self._pg.allreduce([t], opts).wait()

    def broadcast(self, t, root: int) -> None:
        """Copy link rank ``root``'s ``t`` into every rank's."""
        opts = self._dist.BroadcastOptions()
        opts.rootRank = root
        self._pg.broadcast([t], opts).wait()

    def all_gather_into(self, out, t) -> None:
        """``out`` = every rank's ``t``, in link-rank order."""
        self._pg._allgather_base(out, t).wait()

    def reduce_scatter_into(self, out, t, op: int) -> None:
        """``out`` on link rank r = reduction of piece r of every rank's ``t``."""
        opts = self._dist.ReduceScatterOptions()
        opts.reduceOp = self._op(op)
        self._pg._reduce_scatter_base(out, t, opts).wait()

    def all_to_all_single(self, out, t, out_splits: list, in_splits: list) -> None:
        """Rank q gets the ``in_splits[q]`` rows of ``t`` meant for it, into ``out``."""
        self._pg.alltoall_base(out, t, out_splits, in_splits, self._dist.AllToAllOptions()).wait()

    def gather(self, t, outs: list | None, root: int) -> None:
        """Link rank ``root``'s ``outs[q]`` = rank q's ``t``."""
        opts = self._dist.GatherOptions()
        opts.rootRank = root
        self._pg.gather([outs] if outs is not None else [], [t], opts).wait()

    def scatter(self, t, ins: list | None, root: int) -> None:
        """Rank q's ``t`` = link rank ``root``'s ``ins[q]``."""
        opts = self._dist.ScatterOptions()
        opts.rootRank = root
        self._pg.scatter([t], [ins] if ins is not None else [], opts).wait()

    def barrier(self) -> None:
        """Return once every rank of the link called it."""
        self._pg.barrier().wait()

    def isend(self, t, dst: int, tag: int):
        """Start sending ``t`` to link rank ``dst``: a torch Work."""
        return self._pg.send([t], dst, tag)

    def irecv(self, t, src: int | None, tag: int):
        """Start receiving into ``t`` from ``src`` (None: any rank): a torch Work."""
        return self._pg.recv_anysource([t], tag) if src is None else self._pg.recv([t], src, tag)


def connect_gloo(store, rank: int, size: int, timeout: float, rails: list[list[int]] | None):
    """This rank's rail link (None without ``rails``) and the world link, over ``store``.

    ``rails`` lists the group ranks of each rail; every rank of the group must call this with
    the same arguments but its own ``rank`` (each link is a collective rendezvous).

    Example::

        rail, world = connect_gloo(store, 0, 4, 60.0, [[0, 2], [1, 3]])
    """
    rail = None
    if rails:
        index = next(i for i, members in enumerate(rails) if rank in members)
        rail = GlooLink(store, f"shmcomm/rail{index}/", rails[index].index(rank), len(rails[index]),
                        timeout)
    world = GlooLink(store, "shmcomm/world/", rank, size, timeout)
    return rail, world
