"""The collectives of a group across nodes, composed from a shared-memory group per node and the
links between nodes (``shmcomm.multinode.link``), as Open MPI's HAN and Horovod's hierarchical
allreduce do. ``HierarchicalComm`` has the compiled ``Communicator``'s signatures (op codes,
``async_op``, ``factor``: an ``Engine``, declared in ``shmcomm/_core.pyi``), so the group and the
torch backend drive it as they drive one node. One section per collective below, each with its steps.

Every rank gets the same bits: each node reduces its ranks in local order, then the rails combine
the node results in one order, the same on every rank of a rail. AVG is SUM then one division by
the group size; PREMUL_SUM scales inside the node and sums across. Half types round between the
two stages. When nodes hold different numbers of ranks no rail layout fits, and every collective
goes through the world link. Operations run in issue order on the node group's progress engine,
so ``async_op=True`` returns a Work as on one node.

Before its steps, every composed call compares the descriptor of the call (kind, dtype, bytes,
op, root, piece sizes) of every rank of every node (``_descriptors``): which links and node
steps a call takes depends on those, so ranks that called different things would otherwise
wait on different links until the timeout, or return wrong results without an error::

    h = HierarchicalComm(topology, rank, node_comm, rail, world)
    h.all_reduce(x, 0)                          # SUM, synchronous
    h.all_reduce(x, 0, async_op=True).wait()
"""

from __future__ import annotations

import threading
from typing import NoReturn

import numpy as np

import shmcomm._core as _core
import shmcomm.hierarchy.uneven as uneven
from shmcomm.multinode.link import check_same, descriptor, lost_peer
from shmcomm.errors import PeerFailureError, ShmcommError
from shmcomm.hierarchy.scratch import Scratch
from shmcomm.hierarchy.topology import Topology
from shmcomm.ops import ReduceOp

__all__ = ["HierarchicalComm", "SMALL_BYTES", "flat", "name_in_whole_group", "numpy_bfloat16"]

_SUM, _AVG, _PREMUL = int(ReduceOp.SUM), int(ReduceOp.AVG), _core.PREMUL_SUM
# all_reduce at or below this many bytes: reduce to each node's leader, all_reduce along rail 0,
# broadcast inside the node (bench/bench_multinode.py: 0.16x gloo at 64 KiB, 0.5x at 1 MiB,
# where the three-phase form measured 0.33x and 0.69x)
SMALL_BYTES = 4 << 20


# ---- arrays as the links take them: 1-D numpy views ----------------------------------------------
def flat(array, argname: str = "array", writable: bool = False) -> np.ndarray:
    """A 1-D numpy view of a contiguous numpy array, torch CPU tensor or buffer, with the dtype
    the compiled core sees (a torch bfloat16 tensor as ``ml_dtypes.bfloat16``).

    Example::

        >>> flat(np.zeros((2, 3))).shape
        (6,)
    """
    a, dtype = _core.as_numpy(array, argname, writable)
    if dtype == "bfloat16" and a.dtype.name != "bfloat16":  # a torch tensor's, seen as int16
        bfloat16 = numpy_bfloat16()
        if bfloat16 is None:
            raise TypeError(f"{argname}: bfloat16 crosses nodes as an ml_dtypes array, and "
                            "ml_dtypes is not installed: pip install ml_dtypes")
        a = a.view(bfloat16)
    return a.reshape(-1)


def name_in_whole_group(exc: PeerFailureError, rank: int) -> None:
    """Renumber a death met in one level's group (or learnt of from a peer's abort of it), which
    numbers its ranks from 0, as the whole group's ``rank``: ``exc.rank``, and its text (which
    would otherwise name a live rank of the whole group that has the level's number: a rank that
    left early was blamed on another).

    Example::

        >>> e = PeerFailureError("all_reduce: rank 1 (pid 42) died or left the group", 1, 42)
        >>> name_in_whole_group(e, 3); (e.rank, str(e))
        (3, 'all_reduce: rank 3 (pid 42) died or left the group')
    """
    if rank >= 0 and rank != exc.rank:
        said, text = f"rank {exc.rank} (pid {exc.pid})", exc.args[0]
        text = (text.replace(said, f"rank {rank} (pid {exc.pid})", 1) if said in text
                else f"{text} [rank {rank} of the whole group]")
        exc.rank = rank
        exc.args = (text, *exc.args[1:])


def numpy_bfloat16():
    """``ml_dtypes.bfloat16``, the numpy dtype ``flat`` shows a torch bfloat16 tensor as; None
    where ml_dtypes is not installed.

    Example::

        >>> numpy_bfloat16() is None or numpy_bfloat16().__name__ == "bfloat16"
        True
    """
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes.bfloat16


def _check_op(a: np.ndarray, op: int) -> None:
    """TypeError at once, on every rank, when ``op`` does not apply to ``a``'s dtype (before
    anything is queued: a failure inside a composite would abort the node group)."""
    if op != _PREMUL:
        _core.reduce_kernel(a[:0], [a[:0]], op)


def _scale(a: np.ndarray, factor: float) -> None:
    """``a *= factor`` by the kernels' PREMUL_SUM (the rounding of the node steps)."""
    _core.reduce_kernel(a, [a], _PREMUL, factors=[factor])


def _divide(a: np.ndarray, n: int) -> None:
    """AVG's last step, in place: floats divide (half types in float32, rounded once);
    integers truncate toward zero (as NCCL)."""
    if a.dtype.kind in "iu":
        if n > np.iinfo(a.dtype).max:
            a[...] = 0
            return
        q = np.floor_divide(a, n)
        q += (np.remainder(a, n) != 0) & (a < 0)
        a[...] = q
    elif a.dtype.itemsize <= 2:  # float16, bfloat16
        a[...] = (a.astype(np.float32) / np.float32(n)).astype(a.dtype)
    else:
        np.divide(a, n, out=a)


def _check_rank(rank, size: int, argname: str) -> None:
    """The checks every rank argument gets (TypeError for non-integers, as on one node)."""
    if not 0 <= _core.rank_arg(rank, argname) < size:
        raise ValueError(f"{argname} must be a rank in [0, {size}), got {rank!r}")


def _check_root_only(value, on_root: bool, argname: str, rootname: str) -> None:
    """An argument the root alone passes (a gather's outputs, a scatter's inputs)."""
    if on_root != (value is not None):
        raise ValueError(f"{argname} is required on the {rootname} rank and must be None elsewhere")


def _splits(sizes, count: int, n: int, argname: str) -> list[int]:
    if sizes is None:
        if count % n:
            raise ValueError(f"{count} elements do not split evenly into world_size={n}; pass {argname}")
        return [count // n] * n
    sizes = [int(s) for s in sizes]
    if len(sizes) != n or any(s < 0 for s in sizes) or sum(sizes) != count:
        raise ValueError(f"{argname} must be {n} non-negative sizes summing to {count}, got {sizes}")
    return sizes


def _pieces(whole: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """``whole`` cut into consecutive pieces of ``sizes`` elements."""
    return np.split(whole, np.cumsum(sizes)[:-1]) if sizes else []


class HierarchicalComm:
    """The collectives of a group across nodes, with the compiled ``Communicator``'s signatures.

    ``local`` is this node's ``Communicator``; ``rail`` and ``world`` the links of
    ``shmcomm.multinode.link`` (``rail`` None when nodes hold different numbers of ranks).
    ``leaders_bytes``: all_reduce, reduce_scatter and all_gather up to this size cross by each
    node's leader alone.

    Example::

        h = HierarchicalComm(topology, rank, local_comm, rail, world)
        h.broadcast(x, 0)
    """

    def __init__(self, topology: Topology, rank: int, local: _core.Communicator, rail, world,
                 leaders_bytes: int = SMALL_BYTES):
        self.topology, self.rank, self.size = topology, rank, len(topology.hosts)
        # all_reduce, reduce_scatter and all_gather up to this many bytes cross by the leaders
        # alone (0: always by shards)
        self._leaders_bytes = leaders_bytes
        self._local, self._rail, self._world = local, rail, world
        self._node, self._l = topology.node_of[rank], topology.local_of[rank]
        # a hierarchy is built only for ranks on two nodes or more, so every rank has a rail
        # partner (M >= 2); one node is a plain shared-memory group
        self._L, self._M = len(topology.nodes[self._node]), len(topology.nodes)
        self._flat = not topology.even  # no rail layout: everything over the world link
        self._first_of = topology.first_of
        self._consecutive = topology.consecutive
        # row n * L + l of the leaders' table of descriptors is rank nodes[n][l]'s
        self._node_major = [r for members in topology.nodes for r in members]
        self._scratch = Scratch()  # the stage between the node and the rails

    def close(self, graceful: bool = True) -> None:
        """Shut the links between nodes down, after a barrier over them when ``graceful``."""
        links = [link for link in (self._rail, self._world) if link is not None]
        try:
            if graceful:
                self._world.barrier()
        except Exception:  # noqa: BLE001 - a peer already gone: nothing left to wait for
            pass
        finally:
            for link in links:
                link.close()
            self._scratch.release()

    def _run(self, fn, args: tuple, outputs: list, async_op: bool, call: np.ndarray):
        """Queue ``fn(*args)`` on the node group's engine as one composed call described by
        ``call`` (a ``link.descriptor``)."""
        return self._local.submit(self._composite, (fn, args, call), outputs, async_op)

    def _composite(self, fn, args: tuple, call: np.ndarray) -> None:
        """Run one composite collective once every rank's descriptor matched ``call``. A
        mismatch raises CollectiveMismatchError on every rank alike, in step, so the group stays
        usable. Any other failure aborts the node group with the cause (``_fail``)."""
        try:
            rows = self._descriptors(call)
        except BaseException as exc:
            self._fail(exc)
        check_same(rows, "ranks", "rank")
        try:
            fn(*args)
        except BaseException as exc:
            self._fail(exc)

    def _descriptors(self, call: np.ndarray) -> np.ndarray:
        """Every rank's ``call``, in rank order, on every rank. One small exchange between
        nodes, by the leaders (local rank 0) along rail 0: the one each link call cost when the
        links checked their own (they do not here: ``link.connect(checked=False)``); plus two
        small node steps. Over the world link when there are no rails."""
        rows = np.empty((self.size, call.size), np.int64)
        if self._flat:
            self._world.all_gather_into(rows.reshape(-1), call)
            return rows
        # 1. the node's descriptors on every rank of the node
        # 2. the leaders all-gather their nodes' along rail 0 (node order)
        # 3. the leader's table to the node
        node = np.empty((self._L, call.size), np.int64) if self._L > 1 else call
        if self._L > 1:
            self._local.all_gather(list(node), call)  # the list form: never composed (NUMA)
        table = np.empty((self.size, call.size), np.int64)
        if self._l == 0:
            self._rail.all_gather_into(table.reshape(-1), node.reshape(-1))
        if self._L > 1:
            self._local.broadcast(table, 0, False)
        rows[self._node_major] = table
        return rows

    def _fail(self, exc: BaseException) -> NoReturn:
        """Abort the node group with ``exc``'s cause and raise it. This rank's node peers may be
        waiting in (or about to enter) a node step that it will never reach: without the abort
        they would pair it with the next operation and report a mismatch, or wait out the
        timeout, instead of the real cause (a peer's death reaches them as the PeerFailureError
        it is)."""
        failure = lost_peer(exc) or exc  # a death on another node, as its link said it
        if isinstance(failure, PeerFailureError) and failure.pid > 0:  # a death on this node
            local = self._local.rank_of_pid(failure.pid)
            if local >= 0:
                name_in_whole_group(failure, self.topology.nodes[self._node][local])
        self._local.abort(f"{type(failure).__name__} on rank {self.rank} (node {self._node}): "
                          f"{str(failure)[:400]}", failure)
        if failure is exc:
            raise exc
        raise failure from exc

    # ---- all_reduce ------------------------------------------------------------------------
    def all_reduce(self, array, op: int = _SUM, async_op: bool = False, factor: float = 1.0):
        """Reduce ``array`` in place over every rank of every node."""
        a = flat(array, writable=True)
        _check_op(a, op)
        return self._run(self.all_reduce_steps, (a, op, factor), [array], async_op,
                         descriptor("all_reduce", a, op))

    def all_reduce_steps(self, a: np.ndarray, op: int, factor: float) -> None:
        """all_reduce's steps on the calling thread, which runs them as one operation of some
        progress engine (this class's own ``all_reduce`` queues them on its node group's; the
        NUMA composition of ``shmcomm.hierarchy.numa`` on its flat group's)."""
        # 1. inside the node: SUM for AVG (divided at the end), PREMUL_SUM scales there
        # 2. between nodes: SUM for AVG and PREMUL_SUM; by leaders up to SMALL_BYTES, by shards
        #    above; everything over the world link when there are no rails
        # 3. AVG: one division by the group size
        cross = _SUM if op in (_AVG, _PREMUL) else op
        local = _SUM if op == _AVG else op
        if self._flat:
            if op == _PREMUL:
                _scale(a, factor)
            self._world.all_reduce(a, cross)
        elif a.nbytes <= self._leaders_bytes:
            self._all_reduce_by_leaders(a, local, cross, factor)
        else:
            self._all_reduce_by_shards(a, local, cross, factor)
        if op == _AVG:
            _divide(a, self.size)

    def _all_reduce_by_leaders(self, a: np.ndarray, local: int, cross: int, factor: float) -> None:
        """Latency-bound sizes: only each node's local rank 0 crosses, along rail 0; fewer ranks
        on the network beat spreading small pieces over every rail."""
        # 1. reduce to the node's local rank 0  2. all_reduce along rail 0  3. broadcast inside
        self._local.reduce(a, 0, local, False, factor)
        if self._l == 0:
            self._rail.all_reduce(a, cross)
        self._local.broadcast(a, 0, False)

    def _all_reduce_by_shards(self, a: np.ndarray, local: int, cross: int, factor: float) -> None:
        # 1. reduce-scatter inside the node: local index l gets shard l of the node's sum
        # 2. all_reduce of the shard along the rail (every node's shard l)
        # 3. all-gather of the shards inside the node
        n, L, l = a.size, self._L, self._l
        if n % L == 0:
            shard = a[l * (n // L):(l + 1) * (n // L)]
            self._local.reduce_scatter_into(shard, a, local, False, factor)
            self._rail.all_reduce(shard, cross)
            self._local.all_gather_into(a, shard)
        else:  # the first n % L local ranks' shards hold one more element (as on every node)
            counts = [n // L + (q < n % L) for q in range(L)]
            start = sum(counts[:l])
            shard = a[start:start + counts[l]]
            self._local.reduce_scatter_v(shard, a, counts, local, False, factor)
            self._rail.all_reduce(shard, cross)
            self._local.all_gather_v(a, shard, counts)

    # ---- reduce ----------------------------------------------------------------------------
    def reduce(self, array, dst: int, op: int = _SUM, async_op: bool = False, factor: float = 1.0):
        """Reduce into ``array`` of rank ``dst``; other ranks' arrays are unchanged."""
        _check_rank(dst, self.size, "dst")
        a = flat(array, writable=True)
        _check_op(a, op)
        return self._run(self._reduce, (a, dst, op, factor), [array], async_op,
                         descriptor("reduce", a, op, dst))

    def _reduce(self, a: np.ndarray, dst: int, op: int, factor: float) -> None:
        # 1. all_reduce of a copy  2. the destination keeps it
        result = a.copy()
        self.all_reduce_steps(result, op, factor)
        if self.rank == dst:
            a[...] = result

    # ---- reduce_scatter ----------------------------------------------------------------------
    def reduce_scatter_into(self, output, input, op: int = _SUM, async_op: bool = False,
                            factor: float = 1.0):
        """Rank r's ``output`` = reduction over ranks of piece r of their ``input``."""
        out, inp = flat(output, "output", writable=True), flat(input, "input")
        if inp.size != out.size * self.size or inp.dtype != out.dtype:
            raise ValueError(f"input must hold world_size * {out.size} = {out.size * self.size} "
                             f"{out.dtype} elements, got {inp.size} {inp.dtype}")
        _check_op(out, op)
        return self._run(self.reduce_scatter_steps, (out, inp, op, factor), [output], async_op,
                         descriptor("reduce_scatter", inp, op))

    def reduce_scatter(self, output, input_list, op: int = _SUM, async_op: bool = False,
                       factor: float = 1.0):
        """reduce_scatter with ``world_size`` separate input arrays (of any sizes: rank q's
        ``input_list[q]`` sized like its output)."""
        ins = [flat(a, "input_list[i]") for a in input_list]
        out = flat(output, "output", writable=True)
        if len(ins) == self.size and any(a.size != out.size for a in ins):
            _check_op(out, op)
            sizes = [a.size for a in ins]
            return self._run(uneven.reduce_scatter_list, (self._exchange, out, ins, op, factor,
                                                          self.rank, self.size), [output], async_op,
                             descriptor("reduce_scatter", out, op, nbytes=sum(sizes) * out.itemsize,
                                        counts=sizes))
        if len(ins) != self.size:
            raise ValueError(f"input_list must hold world_size={self.size} arrays, got {len(ins)}")
        return self.reduce_scatter_into(output, np.concatenate(ins), op, async_op, factor)

    def reduce_scatter_v(self, output, input, counts, op: int = _SUM, async_op: bool = False,
                         factor: float = 1.0):
        """MPI's Reduce_scatter: rank r's ``output`` = piece r (``counts[r]`` elements) reduced."""
        out = flat(output, "output", writable=True)
        _check_op(out, op)
        args = (self._exchange, out, flat(input, "input"), counts, op, factor, self.rank, self.size)
        return self._run(uneven.reduce_scatter_v, args, [output], async_op,
                         descriptor("reduce_scatter_v", args[2], op, counts=counts))

    def reduce_scatter_steps(self, out: np.ndarray, inp: np.ndarray, op: int, factor: float) -> None:
        """reduce_scatter_into's steps on the calling thread (as ``all_reduce_steps``)."""
        # 1. inside the node, once per node n: the node's sum of the pieces rank (n, l) gets,
        #    for this rank's local index l (so mid holds them for every n)
        # 2. along the rail: reduce-scatter of mid, so that rank (n, l) gets its own piece
        # (up to SMALL_BYTES with consecutive nodes: one crossing by the leaders instead)
        # 3. AVG: one division by the group size
        cross = _SUM if op in (_AVG, _PREMUL) else op
        local = _SUM if op == _AVG else op
        if self._flat:
            if op == _PREMUL:
                inp = inp.copy()
                _scale(inp, factor)
            self._world.reduce_scatter_into(out, inp, cross)
        elif inp.nbytes <= self._leaders_bytes and self._consecutive:
            self._reduce_scatter_by_leaders(out, inp, local, cross, factor)
        else:
            piece = out.size
            mid = self._scratch.take(self._M * piece, out.dtype)
            for n in range(self._M):
                self._local.reduce_scatter_into(mid[n * piece:(n + 1) * piece],
                                                self._node_pieces(inp, n, piece), local, False, factor)
            self._rail.reduce_scatter_into(out, mid, cross)
        if op == _AVG:
            _divide(out, self.size)

    def _reduce_scatter_by_leaders(self, out: np.ndarray, inp: np.ndarray, local: int, cross: int,
                                   factor: float) -> None:
        """Latency-bound sizes: one crossing, by each node's local rank 0 along rail 0 (as
        ``_all_reduce_by_leaders``)."""
        # 1. the node's sum of the whole input, on its local rank 0
        # 2. reduce-scatter of node blocks along rail 0
        # 3. the node's pieces scattered inside the node
        whole = self._scratch.take(inp.size, inp.dtype)
        whole[...] = inp  # the node reduce writes the leader's input
        self._local.reduce(whole, 0, local, False, factor)
        block = None
        if self._l == 0:
            block = np.empty(self._L * out.size, out.dtype)
            self._rail.reduce_scatter_into(block, whole, cross)
        self._local.scatter(out, None if block is None else list(block.reshape(self._L, -1)), 0)

    def _node_pieces(self, a: np.ndarray, n: int, piece: int) -> np.ndarray:
        """Node n's ranks' pieces of the rank-ordered ``a``, in local order: a slice, or a copy
        when those ranks are not consecutive."""
        first = self._first_of[n]
        if first is not None:
            return a[first * piece:(first + self._L) * piece]
        return a.reshape(self.size, piece)[self.topology.nodes[n]].reshape(-1)

    def _exchange(self, out: np.ndarray, inp: np.ndarray, out_splits: list, in_splits: list) -> None:
        """all_to_all_single over every rank (the uneven forms' one primitive here)."""
        self._world.all_to_all_single(out, inp, out_splits, in_splits)

    # ---- broadcast -------------------------------------------------------------------------
    def broadcast(self, array, src: int, async_op: bool = False):
        """Copy rank ``src``'s array into every rank's."""
        _check_rank(src, self.size, "src")
        a = flat(array, writable=self.rank != src)
        return self._run(self._broadcast, (a, src), [array], async_op,
                         descriptor("broadcast", a, root=src))

    def _broadcast(self, a: np.ndarray, src: int) -> None:
        # 1. along the source's rail (its local index on every node)  2. inside each node
        if self._flat:
            return self._world.broadcast(a, src)
        source_local = self.topology.local_of[src]
        if self._l == source_local:
            self._rail.broadcast(a, self.topology.node_of[src])
        self._local.broadcast(a, source_local)

    # ---- all_gather ------------------------------------------------------------------------
    def all_gather_into(self, output, array, async_op: bool = False):
        """``output`` = every rank's ``array``, in rank order."""
        out, a = flat(output, "output", writable=True), flat(array)
        if out.size != a.size * self.size or out.dtype != a.dtype:
            raise ValueError(f"output must hold world_size * {a.size} = {a.size * self.size} "
                             f"{a.dtype} elements, got {out.size} {out.dtype}")
        return self._run(self.all_gather_steps, (out, a), [output], async_op,
                         descriptor("all_gather", out))

    def all_gather(self, output_list, array, async_op: bool = False):
        """``output_list[q]`` = rank q's ``array`` (pieces may differ in size, as torch allows)."""
        outs = [flat(o, "output_list[i]", writable=True) for o in output_list]
        a = flat(array)
        if any(o.size != a.size for o in outs):
            sizes = [o.size for o in outs]
            return self._run(uneven.all_gather_list, (self._exchange, outs, a, self.rank, self.size),
                             list(output_list), async_op,
                             descriptor("all_gather", a, nbytes=sum(sizes) * a.itemsize, counts=sizes))
        if len(outs) != self.size:
            raise ValueError(f"output_list must hold world_size={self.size} arrays, got {len(outs)}")
        whole = np.empty(a.size * self.size, a.dtype)

        def gather_then_split():
            self.all_gather_steps(whole, a)
            for o, part in zip(outs, _pieces(whole, [a.size] * self.size)):
                o[...] = part
        return self._run(gather_then_split, (), list(output_list), async_op,
                         descriptor("all_gather", whole))

    def all_gather_v(self, output, array, counts, displs=None, async_op: bool = False):
        """MPI's Allgatherv: rank q's ``array`` at element ``displs[q]`` of every ``output``."""
        args = (self._exchange, flat(output, "output", writable=True), flat(array), counts, displs,
                self.rank, self.size)
        return self._run(uneven.all_gather_v, args, [output], async_op,
                         descriptor("all_gather_v", args[2], nbytes=0, counts=counts))

    def all_gather_steps(self, out: np.ndarray, a: np.ndarray) -> None:
        """all_gather_into's steps on the calling thread (as ``all_reduce_steps``)."""
        # up to SMALL_BYTES with consecutive nodes (latency-bound):
        # 1. gather inside the node into the node's block  2. rail 0 gathers the node blocks
        # (which lie in node order)  3. broadcast inside the node
        # above:
        # 1. along the rail, rank (n, l) gets every node's local-index-l piece
        # 2. node n's all-gather of those fills node n's pieces of ``out``, for every n
        if self._flat:
            return self._world.all_gather_into(out, a)
        piece = a.size
        if out.nbytes <= self._leaders_bytes and self._consecutive:
            first = self._first_of[self._node]
            block = out[first * piece:(first + self._L) * piece]
            self._local.all_gather_into(block, a)
            if self._l == 0:
                self._rail.all_gather_into(out, block.copy())
            self._local.broadcast(out, 0, False)
            return
        along_rail = self._scratch.take(self._M * piece, a.dtype)
        self._rail.all_gather_into(along_rail, a)
        for n in range(self._M):
            mine = a if n == self._node else along_rail[n * piece:(n + 1) * piece]
            first = self._first_of[n]
            if first is not None:
                self._local.all_gather_into(out[first * piece:(first + self._L) * piece], mine)
            else:
                pieces = np.empty(self._L * piece, a.dtype)
                self._local.all_gather_into(pieces, mine)
                out.reshape(self.size, piece)[self.topology.nodes[n]] = pieces.reshape(self._L, piece)

    # ---- gather and scatter: over the world link ----------------------------------------------
    def gather(self, array, gather_list, dst: int, async_op: bool = False):
        """``gather_list[q]`` on rank ``dst`` = rank q's ``array``."""
        _check_rank(dst, self.size, "dst")
        _check_root_only(gather_list, self.rank == dst, "gather_list", "dst")
        outs = ([flat(o, "gather_list[i]", writable=True) for o in gather_list]
                if gather_list is not None else None)
        a = flat(array)
        return self._run(self._world.gather, (a, outs, dst), list(gather_list or []), async_op,
                         descriptor("gather", a, root=dst))

    def scatter(self, array, scatter_list, src: int, async_op: bool = False):
        """Rank q's ``array`` = ``scatter_list[q]`` of rank ``src``."""
        _check_rank(src, self.size, "src")
        _check_root_only(scatter_list, self.rank == src, "scatter_list", "src")
        ins = [flat(a, "scatter_list[i]") for a in scatter_list] if scatter_list is not None else None
        a = flat(array, writable=True)
        return self._run(self._world.scatter, (a, ins, src), [array], async_op,
                         descriptor("scatter", a, root=src))

    def gather_v(self, array, output, counts, displs, dst: int, async_op: bool = False):
        """MPI's Gatherv on rank ``dst``."""
        _check_rank(dst, self.size, "dst")
        _check_root_only(output, self.rank == dst, "output", "dst")
        args = (self._exchange, flat(array), None if output is None else flat(output, "output", True),
                counts, displs, dst, self.rank, self.size)
        return self._run(uneven.gather_v, args, [output], async_op,
                         descriptor("gather_v", args[1], root=dst, nbytes=0))

    def scatter_v(self, output, input, counts, displs, src: int, async_op: bool = False):
        """MPI's Scatterv from rank ``src``."""
        _check_rank(src, self.size, "src")
        _check_root_only(input, self.rank == src, "input", "src")
        args = (self._exchange, flat(output, "output", writable=True),
                None if input is None else flat(input, "input"), counts, displs, src, self.rank,
                self.size)
        return self._run(uneven.scatter_v, args, [output], async_op,
                         descriptor("scatter_v", args[1], root=src, nbytes=0))

    # ---- all_to_all: over the world link ----------------------------------------------------
    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          async_op: bool = False):
        """Rank q gets its part of every rank's ``input`` (split sizes in elements; None: even)."""
        out, inp = flat(output, "output", writable=True), flat(input, "input")
        out_splits = _splits(output_split_sizes, out.size, self.size, "output_split_sizes")
        in_splits = _splits(input_split_sizes, inp.size, self.size, "input_split_sizes")
        # (sizes differ by rank: the link's engine checks each pair's)
        return self._run(self._world.all_to_all_single, (out, inp, out_splits, in_splits), [output],
                         async_op, descriptor("all_to_all", inp, nbytes=0))

    def all_to_all(self, output_list, input_list, async_op: bool = False):
        """``output_list[q]`` = rank q's ``input_list[rank]``."""
        outs = [flat(o, "output_list[i]", writable=True) for o in output_list]
        ins = [flat(a, "input_list[i]") for a in input_list]
        if len(outs) != self.size or len(ins) != self.size:
            raise ValueError(f"output_list and input_list must hold world_size={self.size} arrays")
        out_splits, in_splits = [o.size for o in outs], [a.size for a in ins]
        whole_out = np.empty(sum(out_splits), outs[0].dtype)

        def exchange():
            # 1. one all_to_all_single of the inputs laid end to end  2. split into the outputs
            self._world.all_to_all_single(whole_out, np.concatenate(ins), out_splits, in_splits)
            for o, part in zip(outs, _pieces(whole_out, out_splits)):
                o[...] = part
        return self._run(exchange, (), list(output_list), async_op,
                         descriptor("all_to_all", whole_out, nbytes=0))

    # ---- scan and exscan: every rank's array, then each rank's own prefix ---------------------
    def scan(self, array, op: int = _SUM, async_op: bool = False):
        """MPI's Scan: rank r's ``array`` = op over ranks 0..r, in rank order."""
        return self._prefix(array, op, False, async_op)

    def exscan(self, array, op: int = _SUM, async_op: bool = False):
        """MPI's Exscan: rank r's ``array`` = op over ranks 0..r-1 (rank 0: the op's identity)."""
        return self._prefix(array, op, True, async_op)

    def _prefix(self, array, op: int, exclusive: bool, async_op: bool):
        # 1. all_gather every rank's array  2. reduce ranks 0..r-1 (and r's own, scan) in order
        a = flat(array, writable=True)
        _check_op(a, op)
        kind = "exscan" if exclusive else "scan"
        if op == _PREMUL:
            raise ValueError(f"{kind} does not take PREMUL_SUM: pass SUM and scale first")
        n, upto = a.size, self.rank if exclusive else self.rank + 1
        fill = None if upto else _core.identity_bytes(_core.as_numpy(a, "array")[1], _core.OP_NAMES[op])

        def steps():
            every = np.empty(n * self.size, a.dtype)
            self.all_gather_steps(every, a)
            if upto:
                _core.reduce_kernel(a, [every[q * n:(q + 1) * n] for q in range(upto)], op)
            elif fill is not None and n:
                a.view(np.uint8).reshape(n, -1)[:] = np.frombuffer(fill, np.uint8)
        return self._run(steps, (), [array], async_op, descriptor(kind, a, op))

    # ---- barrier ---------------------------------------------------------------------------
    def barrier(self, async_op: bool = False):
        """Return once every rank of every node called it."""
        return self._run(self._barrier, (), [], async_op, descriptor("barrier"))

    def _barrier(self) -> None:
        # 1. inside the node  2. along rail 0  3. inside the node (nobody leaves before rail 0 did)
        if self._flat:
            return self._world.barrier()
        self._local.barrier()
        if self._l == 0:
            self._rail.barrier()
        self._local.barrier()

    # ---- point to point: straight through the world link ---------------------------------------
    def isend(self, array, dst: int, tag: int = 0) -> LinkWork:
        """Start sending ``array`` to rank ``dst``."""
        _check_rank(dst, self.size, "dst")
        return LinkWork(self._world.isend(flat(array), dst, tag), [array])

    def irecv(self, array, src: int | None = None, tag: int = 0) -> LinkWork:
        """Start receiving into ``array`` from ``src`` (None: any rank)."""
        if src is not None:
            _check_rank(src, self.size, "src")
        return LinkWork(self._world.irecv(flat(array, writable=True), src, tag), [array])


class LinkWork:
    """A ``shmcomm.Work``-like handle over a link's point-to-point ``Request``.

    Example::

        work = h.irecv(buf, src=0, tag=5); work.wait(); print(work.source_rank())
    """

    def __init__(self, request, arrays: list):
        self._request, self._arrays = request, arrays
        self._error: BaseException | None = None
        self._done = False
        self._lock = threading.Lock()  # one wait on the request at a time (see wait)
        self._future: _core.Future | None = None

    def wait(self, timeout: float | None = None) -> bool:
        """True once done; raises the transfer's error (the same one on every later call)."""
        with self._lock:
            if self._done:  # gloo's point-to-point wait is not idempotent: a second one waits
                if self._error is not None:  # for another message
                    raise self._error
                return True
            try:
                self._request.wait(timeout)
            except Exception as exc:  # noqa: BLE001 - the engine's error, as shmcomm's
                self._done = True
                self._error = exc if isinstance(exc, ShmcommError) else lost_peer(exc) or ShmcommError(
                    f"point-to-point across nodes failed: {exc}")
                if self._error is exc:
                    raise
                raise self._error from exc
            self._done = True
            return True

    def is_completed(self) -> bool:
        """Whether the transfer finished (without waiting)."""
        return self._done or self._request.done()

    def is_success(self) -> bool:
        """Finished without an error."""
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        """The transfer's error, once ``wait`` raised it."""
        return self._error

    def result(self) -> list:
        """The arrays of the transfer."""
        return list(self._arrays)

    def source_rank(self) -> int:
        """The sender's rank (a finished receive)."""
        return self._request.source()

    def get_future(self) -> _core.Future:
        """A shmcomm Future holding ``result()`` (or the error) once the transfer is done, so
        ``sc.wait_all``/``wait_any`` and ``then`` take these handles too. Links give no Future
        for point to point: a daemon thread waits on the request instead."""
        with self._lock:
            if self._future is None:
                self._future = _core.Future()
                threading.Thread(target=self._settle, name="shmcomm-link-work", daemon=True).start()
            return self._future

    def _settle(self) -> None:
        assert self._future is not None
        try:
            self.wait()
        except Exception as exc:  # noqa: BLE001 - handed to the Future's waiters
            self._future.set_exception(exc)
        else:
            self._future.set_result(self.result())
