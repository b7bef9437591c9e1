"""Groups that span several machines: shared memory inside each node, an engine between nodes.

As Open MPI's HAN and Horovod's hierarchical allreduce do, each collective is composed from a
shared-memory group per node and inter-node links (shmcomm.internode: torch's gloo today), one
per local index (the *rails*: rank l of every node), plus one over the whole group:

- all_reduce: reduce-scatter inside the node, all_reduce of this rank's shard along its rail,
  all-gather inside the node. Up to ``SMALL_BYTES`` (4 MiB), where latency rules: reduce to
  each node's local rank 0, all_reduce along rail 0, broadcast inside the node. The reduction
  order is fixed: each node sums its ranks in local order, then the rails combine the node
  results in one order, the same on every rank of a rail (two nodes: swapped and summed in node
  order by shmcomm's kernel; more: gloo's ring, or below 64 KiB all-gathered and summed in node
  order); so every rank gets the same bits. AVG is SUM then one division by the group size;
  PREMUL_SUM scales inside the node and sums across. Half types round between the two stages.
- reduce_scatter: one reduce-scatter inside the node per node's block of pieces (this rank gets
  the node's sum of the pieces its rail carries), then reduce-scatter along the rail. all_gather:
  along the rail, then inside the node once per node's block, straight into the output. Both,
  up to ``SMALL_BYTES`` where every node's ranks are consecutive, cross once instead: through
  each node's local rank 0 along rail 0, with whole node blocks.
  broadcast: along the source's rail, then inside each node.
  reduce: an all_reduce of a copy, kept by the destination. barrier: node, rail 0, node.
- all_to_all, gather, scatter and point to point: the inter-node engine over the whole group.

When nodes hold different numbers of ranks no rail layout fits, and every collective goes
through the whole-group link (plain gloo). Operations run in issue order on the node group's
progress engine, so ``async_op=True`` returns a Work as on one node::

    pg = sc.init_process_group()         # under torchrun --nnodes 2 (or shmrun --nnodes 2)
    sc.all_reduce(x)                     # shared memory inside the node, gloo between nodes
"""

from __future__ import annotations

import os
import threading

import numpy as np

from shmcomm import _core, uneven
from shmcomm.errors import ShmcommError
from shmcomm.group import ProcessGroup
from shmcomm.group import _alive as group_registry
from shmcomm.ops import ReduceOp, op_code
from shmcomm.scratch import Scratch

__all__ = ["Topology", "HierarchicalComm", "HierarchicalGroup", "host_identity", "exchange_hosts",
           "init_multinode", "simulated_nodes"]

_SUM, _AVG, _PREMUL = int(ReduceOp.SUM), int(ReduceOp.AVG), _core.PREMUL_SUM
# all_reduce at or below this many bytes: reduce to each node's leader, all_reduce along rail 0,
# broadcast inside the node (bench/bench_multinode.py: 0.16x gloo at 64 KiB, 0.5x at 1 MiB,
# where the three-phase form measured 0.33x and 0.69x)
SMALL_BYTES = 4 << 20


# ---- where every rank runs ----------------------------------------------------------------------
def simulated_nodes() -> int:
    """``SHMCOMM_SIMULATE_NODES`` (testing and benchmarking): the number of blocks of
    consecutive ranks that act as separate nodes on this machine; 1 when unset.

    Example::

        os.environ["SHMCOMM_SIMULATE_NODES"] = "2"; simulated_nodes()   # 2
    """
    raw = os.environ.get("SHMCOMM_SIMULATE_NODES", "").strip()
    if not raw:
        return 1
    try:
        k = int(raw)
    except ValueError:
        k = 0
    if k < 1:
        raise ValueError(f"SHMCOMM_SIMULATE_NODES must be an integer >= 1, got {raw!r}")
    return k


def host_identity(rank: int | None = None, size: int | None = None) -> str:
    """Host name, boot id and the /dev/shm mount: ranks sharing all three see one another's
    segments (containers on one kernel with private /dev/shm mounts differ in the last). Under
    ``SHMCOMM_SIMULATE_NODES=K``, rank ``rank`` of ``size`` also names its block of consecutive
    ranks, so that the blocks act as K nodes.

    Example::

        print(host_identity())   # "node-a (boot id 5f..., /dev/shm 25:1)"
    """
    import socket

    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    try:
        st = os.stat("/dev/shm")
        shm = f"{st.st_dev}:{st.st_ino}"
    except OSError:
        shm = "?"
    k = simulated_nodes()
    block = f" [simulated node {rank * k // size} of {k}]" if k > 1 and rank is not None and size else ""
    return f"{socket.gethostname()}{block} (boot id {boot}, /dev/shm {shm})"


def exchange_hosts(store, key: str, rank: int, size: int) -> list[str]:
    """Every rank's ``host_identity()``, by rank, through a torch ``Store`` under ``key``.

    Example::

        hosts = exchange_hosts(store, "shmcomm/0", rank, size)
    """
    mine = host_identity(rank, size)
    store.set(f"{key}/host/{rank}", mine)
    return [mine if r == rank else store.get(f"{key}/host/{r}").decode() for r in range(size)]


class Topology:
    """Which node each rank of a group runs on: nodes in order of their lowest rank, and each
    node's ranks in rank order (a rank's *local index* is its place there).

    Example::

        >>> t = Topology(["a", "b", "a", "b"])
        >>> t.nodes, t.local_of, t.rails
        ([[0, 2], [1, 3]], [0, 0, 1, 1], [[0, 1], [2, 3]])
    """

    def __init__(self, hosts: list[str]):
        names = list(dict.fromkeys(hosts))
        self.hosts = list(hosts)
        self.nodes = [[r for r, h in enumerate(hosts) if h == name] for name in names]
        self.node_of = [names.index(h) for h in hosts]
        self.local_of = [self.nodes[k].index(r) for r, k in enumerate(self.node_of)]
        self.even = len({len(node) for node in self.nodes}) == 1
        # rails[l]: the rank of local index l on every node, in node order (rail rank = node index)
        self.rails = ([[node[l] for node in self.nodes] for l in range(len(self.nodes[0]))]
                      if self.even else None)

    def describe(self) -> str:
        """One line: the nodes and their ranks."""
        return "; ".join(f"{self.hosts[node[0]].split(' ')[0]}: ranks {node}" for node in self.nodes)


# ---- arrays as torch tensors (what the inter-node engine takes) ---------------------------------
def _tensor(array):
    """A 1-D torch view of a contiguous array or tensor (a copy for a read-only array)."""
    import torch

    if isinstance(array, torch.Tensor):
        if not array.is_contiguous():
            raise ValueError("arrays must be contiguous")
        return array.view(-1)
    a = np.asarray(array)
    if not a.flags.c_contiguous:
        raise ValueError("arrays must be C-contiguous")
    a = a.reshape(-1)
    if a.dtype.name == "bfloat16":  # ml_dtypes
        a = a.view(np.uint16)
        return (torch.from_numpy(a) if a.flags.writeable else torch.tensor(a)).view(torch.bfloat16)
    try:
        return torch.from_numpy(a) if a.flags.writeable else torch.tensor(a)
    except TypeError:
        raise TypeError(f"dtype {a.dtype} cannot cross nodes (torch has no such type)") from None


def _divide(t, n: int) -> None:
    """AVG's last step, in place: floats divide; integers truncate toward zero (as NCCL)."""
    import torch

    if t.dtype == torch.bool:
        raise ValueError("ReduceOp.AVG is not defined for bool")
    if t.is_floating_point() or t.is_complex():
        t.div_(n)
    else:
        torch.div(t, n, rounding_mode="trunc", out=t)


class _LinkWork:
    """A ``shmcomm.Work``-like handle over the inter-node engine's Work (point to point)."""

    def __init__(self, work, arrays):
        self._work, self._arrays = work, arrays
        self._error, self._done = None, False
        self._lock = threading.Lock()  # one wait on gloo's Work at a time (see wait)
        self._future = None

    def wait(self, timeout=None) -> bool:
        import datetime

        with self._lock:
            if self._done:  # gloo's point-to-point wait is not idempotent: a second one waits
                if self._error is not None:  # for another message
                    raise self._error
                return True
            try:
                if timeout is None:
                    self._work.wait()
                else:
                    self._work.wait(datetime.timedelta(seconds=float(timeout)))
            except Exception as exc:  # noqa: BLE001 - the engine's error, as shmcomm's
                self._done = True
                self._error = ShmcommError(f"point-to-point across nodes failed: {exc}")
                raise self._error from exc
            self._done = True
            return True

    def is_completed(self) -> bool:
        return self._done or self._work.is_completed()

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        return list(self._arrays)

    def source_rank(self) -> int:
        return self._work._source_rank()

    def get_future(self) -> _core.Future:
        """A shmcomm Future holding ``result()`` (or the error) once the transfer is done, so
        ``sc.wait_all``/``wait_any`` and ``then`` take these handles too. gloo gives no Future
        for point to point: a daemon thread waits on its Work instead."""
        with self._lock:
            if self._future is None:
                self._future = _core.Future()
                threading.Thread(target=self._settle, name="shmcomm-link-work", daemon=True).start()
            return self._future

    def _settle(self) -> None:
        try:
            self.wait()
        except Exception as exc:  # noqa: BLE001 - handed to the Future's waiters
            self._future.set_exception(exc)
        else:
            self._future.set_result(self.result())


# ---- the composed collectives ---------------------------------------------------------------------
class HierarchicalComm:
    """The collectives of a group across nodes, with the compiled ``Communicator``'s signatures
    (op codes, ``async_op``, ``factor``), so the torch backend drives it as it drives one node.

    Example::

        h = HierarchicalComm(topology, rank, local_comm, rail, world)
        h.all_reduce(x, 0)                          # SUM, synchronous
        h.all_reduce(x, 0, async_op=True).wait()
    """

    def __init__(self, topology: Topology, rank: int, local: _core.Communicator, rail, world):
        self.topology, self.rank, self.size = topology, rank, len(topology.hosts)
        self._local, self._rail, self._world = local, rail, world
        self._node, self._l = topology.node_of[rank], topology.local_of[rank]
        # build() makes a hierarchy only for ranks on two nodes or more, so every rank has a
        # rail partner (M >= 2); one node is a plain shared-memory group
        self._L, self._M = len(topology.nodes[self._node]), len(topology.nodes)
        self._flat = not topology.even  # no rail layout: everything over the world link
        # first_of[n]: node n's lowest rank when its ranks are consecutive (torchrun and shmrun
        # number them so), else None. A node's pieces of a rank-ordered buffer are then one
        # slice, which the node's collectives read or write in place.
        self._first_of = [node[0] if node == list(range(node[0], node[0] + len(node))) else None
                          for node in topology.nodes]
        self._scratch = Scratch()  # the stage between the node and the rails
        # every node's ranks consecutive: the nodes' blocks of a rank-ordered buffer lie in node
        # order, which is rail order, so a rail can gather or reduce-scatter whole blocks
        self._consecutive = None not in self._first_of

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

    def _run(self, fn, args: tuple, outputs: list, async_op: bool):
        return self._local.submit(self._composite, (fn, args), outputs, async_op)

    def _composite(self, fn, args: tuple) -> None:
        """Run one composite collective; if it fails on this rank, abort the node group with the
        cause. Its node peers may be waiting in (or about to enter) a node step that this rank
        will never reach: without the abort they would pair it with the next operation and
        report a mismatch, or wait out the timeout, instead of the real cause."""
        try:
            fn(*args)
        except BaseException as exc:
            self._local.abort(f"{type(exc).__name__} on rank {self.rank} (node {self._node}): "
                              f"{str(exc)[:400]}")
            raise

    # ---- reductions --------------------------------------------------------------------------
    def all_reduce(self, array, op: int = _SUM, async_op: bool = False, factor: float = 1.0):
        """Reduce ``array`` in place over every rank of every node."""
        return self._run(self._all_reduce, (_tensor(array), op, factor), [array], async_op)

    def _all_reduce(self, t, op: int, factor: float) -> None:
        cross = _SUM if op in (_AVG, _PREMUL) else op
        local = _SUM if op == _AVG else op
        if self._flat:
            if op == _PREMUL:
                t.mul_(factor)
            self._world.all_reduce(t, cross)
        elif t.numel() * t.element_size() <= SMALL_BYTES:
            self._all_reduce_by_leaders(t, local, cross, factor)
        else:
            self._all_reduce_by_shards(t, local, cross, factor)
        if op == _AVG:
            _divide(t, self.size)

    def _all_reduce_by_leaders(self, t, local: int, cross: int, factor: float) -> None:
        """Latency-bound sizes: only each node's local rank 0 crosses, along rail 0; fewer ranks
        on the network beat spreading small pieces over every rail."""
        self._local.reduce(t, 0, local, False, factor)
        if self._l == 0:
            self._rail.all_reduce(t, cross)
        self._local.broadcast(t, 0, False)

    def _all_reduce_by_shards(self, t, local: int, cross: int, factor: float) -> None:
        """Reduce-scatter inside the node, each shard along its rail, all-gather inside."""
        n, L, l = t.numel(), self._L, self._l
        if n % L == 0:
            shard = t[l * (n // L):(l + 1) * (n // L)]
            self._local.reduce_scatter_into(shard, t, local, False, factor)
            self._rail.all_reduce(shard, cross)
            self._local.all_gather_into(t, shard)
        else:  # the first n % L local ranks' shards hold one more element (as on every node)
            counts = [n // L + (q < n % L) for q in range(L)]
            start = sum(counts[:l])
            shard = t[start:start + counts[l]]
            self._local.reduce_scatter_v(shard, t, counts, local, False, factor)
            self._rail.all_reduce(shard, cross)
            self._local.all_gather_v(t, shard, counts)

    def reduce(self, array, dst: int, op: int = _SUM, async_op: bool = False, factor: float = 1.0):
        """Reduce into ``array`` of rank ``dst``; other ranks' arrays are unchanged."""
        _check_rank(dst, self.size, "dst")
        return self._run(self._reduce, (_tensor(array), dst, op, factor), [array], async_op)

    def _reduce(self, t, dst: int, op: int, factor: float) -> None:
        result = t.clone()
        self._all_reduce(result, op, factor)
        if self.rank == dst:
            t.copy_(result)

    def reduce_scatter_into(self, output, input, op: int = _SUM, async_op: bool = False,
                            factor: float = 1.0):
        """Rank r's ``output`` = reduction over ranks of piece r of their ``input``."""
        out, inp = _tensor(output), _tensor(input)
        if inp.numel() != out.numel() * self.size or inp.dtype != out.dtype:
            raise ValueError(f"input must hold world_size * {out.numel()} = {out.numel() * self.size} "
                             f"{out.dtype} elements, got {inp.numel()} {inp.dtype}")
        return self._run(self._reduce_scatter, (out, inp, op, factor), [output], async_op)

    def reduce_scatter(self, output, input_list, op: int = _SUM, async_op: bool = False,
                       factor: float = 1.0):
        """reduce_scatter with ``world_size`` separate input arrays (of any sizes: rank q's
        ``input_list[q]`` sized like its output)."""
        import torch

        ins = [_tensor(a) for a in input_list]
        out = _tensor(output)
        if len(ins) == self.size and any(a.numel() != out.numel() for a in ins):
            return self._run(uneven.reduce_scatter_list, (self._exchange, out, ins, op, factor,
                                                          self.rank, self.size), [output], async_op)
        if len(ins) != self.size:
            raise ValueError(f"input_list must hold world_size={self.size} arrays, got {len(ins)}")
        return self.reduce_scatter_into(output, torch.cat(ins), op, async_op, factor)

    def reduce_scatter_v(self, output, input, counts, op: int = _SUM, async_op: bool = False,
                         factor: float = 1.0):
        """MPI's Reduce_scatter: rank r's ``output`` = piece r (``counts[r]`` elements) reduced."""
        args = (self._exchange, _tensor(output), _tensor(input), counts, op, factor, self.rank, self.size)
        return self._run(uneven.reduce_scatter_v, args, [output], async_op)

    def _exchange(self, out, inp, out_splits: list, in_splits: list) -> None:
        """all_to_all_single over every rank (the uneven forms' one primitive here)."""
        self._world.all_to_all_single(out, inp, out_splits, in_splits)

    def _reduce_scatter(self, out, inp, op: int, factor: float) -> None:
        cross = _SUM if op in (_AVG, _PREMUL) else op
        if self._flat:
            if op == _PREMUL:
                inp = inp * factor
            self._world.reduce_scatter_into(out, inp, cross)
        elif inp.numel() * inp.element_size() <= SMALL_BYTES and self._consecutive:
            self._reduce_scatter_by_leaders(out, inp, _SUM if op == _AVG else op, cross, factor)
        else:
            # node n's reduce-scatter over its ranks' pieces leaves this rank (local index l) the
            # node's sum of rank (n, l)'s piece: mid holds them for every n, and the rail
            # reduce-scatters mid so that rank (n, l) gets its own
            piece = out.numel()
            mid = self._scratch.take(self._M * piece, out.dtype)
            for n in range(self._M):
                pieces = self._node_pieces(inp, n, piece)
                self._local.reduce_scatter_into(mid[n * piece:(n + 1) * piece], pieces,
                                                _SUM if op == _AVG else op, False, factor)
            self._rail.reduce_scatter_into(out, mid, cross)
        if op == _AVG:
            _divide(out, self.size)

    # ---- data movement ---------------------------------------------------------------------
    def broadcast(self, array, src: int, async_op: bool = False):
        """Copy rank ``src``'s array into every rank's."""
        _check_rank(src, self.size, "src")
        return self._run(self._broadcast, (_tensor(array), src), [array], async_op)

    def _broadcast(self, t, src: int) -> None:
        if self._flat:
            return self._world.broadcast(t, src)
        source_local = self.topology.local_of[src]
        if self._l == source_local:
            self._rail.broadcast(t, self.topology.node_of[src])
        self._local.broadcast(t, source_local)

    def all_gather_into(self, output, array, async_op: bool = False):
        """``output`` = every rank's ``array``, in rank order."""
        out, t = _tensor(output), _tensor(array)
        if out.numel() != t.numel() * self.size or out.dtype != t.dtype:
            raise ValueError(f"output must hold world_size * {t.numel()} = {t.numel() * self.size} "
                             f"{t.dtype} elements, got {out.numel()} {out.dtype}")
        return self._run(self._all_gather_into, (out, t), [output], async_op)

    def all_gather(self, output_list, array, async_op: bool = False):
        """``output_list[q]`` = rank q's ``array`` (pieces may differ in size, as torch allows)."""
        import torch

        outs = [_tensor(o) for o in output_list]
        t = _tensor(array)
        if any(o.numel() != t.numel() for o in outs):
            return self._run(uneven.all_gather_list, (self._exchange, outs, t, self.rank, self.size),
                             list(output_list), async_op)
        if len(outs) != self.size:
            raise ValueError(f"output_list must hold world_size={self.size} arrays, got {len(outs)}")
        whole = torch.empty(t.numel() * self.size, dtype=t.dtype)

        def gather_then_split():
            self._all_gather_into(whole, t)
            for q, o in enumerate(outs):
                o.copy_(whole[q * t.numel():(q + 1) * t.numel()])
        return self._run(gather_then_split, (), list(output_list), async_op)

    def all_gather_v(self, output, array, counts, displs=None, async_op: bool = False):
        """MPI's Allgatherv: rank q's ``array`` at element ``displs[q]`` of every ``output``."""
        args = (self._exchange, _tensor(output), _tensor(array), counts, displs, self.rank, self.size)
        return self._run(uneven.all_gather_v, args, [output], async_op)

    def gather_v(self, array, output, counts, displs, dst: int, async_op: bool = False):
        """MPI's Gatherv on rank ``dst``."""
        _check_rank(dst, self.size, "dst")
        _check_root_only(output, self.rank == dst, "output", "dst")
        args = (self._exchange, _tensor(array), None if output is None else _tensor(output), counts,
                displs, dst, self.rank, self.size)
        return self._run(uneven.gather_v, args, [output], async_op)

    def scatter_v(self, output, input, counts, displs, src: int, async_op: bool = False):
        """MPI's Scatterv from rank ``src``."""
        _check_rank(src, self.size, "src")
        _check_root_only(input, self.rank == src, "input", "src")
        args = (self._exchange, _tensor(output), None if input is None else _tensor(input), counts,
                displs, src, self.rank, self.size)
        return self._run(uneven.scatter_v, args, [output], async_op)

    def _reduce_scatter_by_leaders(self, out, inp, local: int, cross: int, factor: float) -> None:
        """Latency-bound sizes: one crossing, by each node's local rank 0 along rail 0 (as
        ``_all_reduce_by_leaders``): the node's sum of the whole input to it, the rail's
        reduce-scatter of node blocks, then the node's pieces scattered inside the node."""
        import torch

        whole = self._scratch.take(inp.numel(), inp.dtype)
        whole.copy_(inp)  # the node reduce writes the leader's input
        self._local.reduce(whole, 0, local, False, factor)
        block = None
        if self._l == 0:
            block = torch.empty(self._L * out.numel(), dtype=out.dtype)
            self._rail.reduce_scatter_into(block, whole, cross)
        self._local.scatter(out, None if block is None else list(block.view(self._L, -1)), 0)

    def _all_gather_into(self, out, t) -> None:
        import torch

        if self._flat:
            return self._world.all_gather_into(out, t)
        if out.numel() * out.element_size() <= SMALL_BYTES and self._consecutive:
            # latency-bound sizes: gather inside the node, one crossing by the local ranks 0
            # along rail 0 (the nodes' blocks, which lie in node order), broadcast inside
            piece = t.numel()
            first = self._first_of[self._node]
            block = out[first * piece:(first + self._L) * piece]
            self._local.all_gather_into(block, t)
            if self._l == 0:
                self._rail.all_gather_into(out, block.clone())
            self._local.broadcast(out, 0, False)
            return
        # along the rail, rank (n, l) gets every node's local-index-l piece; node n's gather of
        # those then fills node n's pieces of ``out``
        piece = t.numel()
        along_rail = self._scratch.take(self._M * piece, t.dtype)
        self._rail.all_gather_into(along_rail, t)
        for n in range(self._M):
            mine = t if n == self._node else along_rail[n * piece:(n + 1) * piece]
            first = self._first_of[n]
            if first is not None:
                self._local.all_gather_into(out[first * piece:(first + self._L) * piece], mine)
            else:
                pieces = torch.empty(self._L * piece, dtype=t.dtype)
                self._local.all_gather_into(pieces, mine)
                out.view(self.size, piece)[self.topology.nodes[n]] = pieces.view(self._L, piece)

    def _node_pieces(self, t, n: int, piece: int):
        """Node n's ranks' pieces of the rank-ordered ``t``, in local order: a slice, or a copy
        when those ranks are not consecutive."""
        first = self._first_of[n]
        if first is not None:
            return t[first * piece:(first + self._L) * piece]
        return t.view(self.size, piece)[self.topology.nodes[n]].view(-1)

    def gather(self, array, gather_list, dst: int, async_op: bool = False):
        """``gather_list[q]`` on rank ``dst`` = rank q's ``array``."""
        _check_rank(dst, self.size, "dst")
        outs = [_tensor(o) for o in gather_list] if self.rank == dst else None
        return self._run(self._world.gather, (_tensor(array), outs, dst), list(gather_list or []),
                         async_op)

    def scatter(self, array, scatter_list, src: int, async_op: bool = False):
        """Rank q's ``array`` = ``scatter_list[q]`` of rank ``src``."""
        _check_rank(src, self.size, "src")
        ins = [_tensor(a) for a in scatter_list] if self.rank == src else None
        return self._run(self._world.scatter, (_tensor(array), ins, src), [array], async_op)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          async_op: bool = False):
        """Rank q gets its part of every rank's ``input`` (split sizes in elements; None: even)."""
        out, inp = _tensor(output), _tensor(input)
        out_splits = _splits(output_split_sizes, out.numel(), self.size, "output_split_sizes")
        in_splits = _splits(input_split_sizes, inp.numel(), self.size, "input_split_sizes")
        return self._run(self._world.all_to_all_single, (out, inp, out_splits, in_splits), [output],
                         async_op)

    def all_to_all(self, output_list, input_list, async_op: bool = False):
        """``output_list[q]`` = rank q's ``input_list[rank]``."""
        import torch

        outs, ins = [_tensor(o) for o in output_list], [_tensor(a) for a in input_list]
        if len(outs) != self.size or len(ins) != self.size:
            raise ValueError(f"output_list and input_list must hold world_size={self.size} arrays")
        out_splits, in_splits = [o.numel() for o in outs], [a.numel() for a in ins]
        whole_out = torch.empty(sum(out_splits), dtype=outs[0].dtype if outs else torch.uint8)

        def exchange():
            self._world.all_to_all_single(whole_out, torch.cat(ins), out_splits, in_splits)
            for o, part in zip(outs, torch.split(whole_out, out_splits)):
                o.copy_(part)
        return self._run(exchange, (), list(output_list), async_op)

    def barrier(self, async_op: bool = False):
        """Return once every rank of every node called it."""
        return self._run(self._barrier, (), [], async_op)

    def _barrier(self) -> None:
        if self._flat:
            return self._world.barrier()
        self._local.barrier()
        if self._l == 0:
            self._rail.barrier()
        self._local.barrier()

    # ---- point to point: straight through the inter-node engine ---------------------------------
    def isend(self, array, dst: int, tag: int = 0) -> _LinkWork:
        """Start sending ``array`` to rank ``dst``."""
        _check_rank(dst, self.size, "dst")
        t = _tensor(array)
        return _LinkWork(self._world.isend(t, dst, tag), [array])

    def irecv(self, array, src: int | None = None, tag: int = 0) -> _LinkWork:
        """Start receiving into ``array`` from ``src`` (None: any rank)."""
        if src is not None:
            _check_rank(src, self.size, "src")
        t = _tensor(array)
        return _LinkWork(self._world.irecv(t, src, tag), [array])


def _check_root_only(value, on_root: bool, argname: str, rootname: str) -> None:
    """An argument the root alone passes (a gather's outputs, a scatter's inputs)."""
    if on_root != (value is not None):
        raise ValueError(f"{argname} is required on the {rootname} rank and must be None elsewhere")


def _check_rank(rank, size: int, argname: str) -> None:
    """The checks every rank argument gets (TypeError for non-integers, as on one node)."""
    if not 0 <= _core.rank_arg(rank, argname) < size:
        raise ValueError(f"{argname} must be a rank in [0, {size}), got {rank!r}")


def _splits(sizes, count: int, n: int, argname: str) -> list[int]:
    if sizes is None:
        if count % n:
            raise ValueError(f"{count} elements do not split evenly into world_size={n}; pass {argname}")
        return [count // n] * n
    sizes = [int(s) for s in sizes]
    if len(sizes) != n or any(s < 0 for s in sizes) or sum(sizes) != count:
        raise ValueError(f"{argname} must be {n} non-negative sizes summing to {count}, got {sizes}")
    return sizes


# ---- the numpy API's group -------------------------------------------------------------------------
class HierarchicalGroup(ProcessGroup):
    """A ``shmcomm.ProcessGroup`` across nodes: the same methods, composed by ``HierarchicalComm``
    (shared memory inside this node's group ``node``, the inter-node engine between nodes).

    Example::

        pg = sc.init_process_group()       # torchrun --nnodes 2 --nproc-per-node 2 ...
        pg.all_reduce(x); print(pg.rank, pg.size, pg.topology.nodes)
    """

    def __init__(self, comm: HierarchicalComm, node: ProcessGroup, name: str, meeting: tuple):
        # not ProcessGroup.__init__: the node group owns the segment, its queue and its rings;
        # this group queues its operations there (point to point goes between nodes instead)
        self._comm, self._p2p = node._comm, node._p2p
        self._global_ranks, self._name = list(range(comm.size)), name
        self._subgroups, self._destroyed = 0, False
        self.comm, self.node, self.topology = comm, node, comm.topology
        self._meeting = meeting  # (store, key, label, node secret, secret_fn): sub-groups meet there
        group_registry.add(self)

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size

    def __repr__(self) -> str:
        return (f"<shmcomm.HierarchicalGroup {self._name} rank={self.rank} size={self.size} "
                f"nodes={len(self.topology.nodes)}>")

    def run(self, fn, args: tuple, outputs: list, async_op: bool):
        """As ``ProcessGroup.run``; ``fn`` may also be a ``HierarchicalComm`` method."""
        if self._destroyed:
            raise ValueError(f"process group {self._name} was destroyed")
        if getattr(fn, "__self__", None) is self.comm:
            return fn(*args, async_op=async_op)
        return self._comm.submit(fn, tuple(args), outputs, async_op)

    def all_reduce(self, array, op=ReduceOp.SUM, async_op=False):
        return self.comm.all_reduce(array, op_code(op), async_op)

    def all_reduce_coalesced(self, arrays, op=ReduceOp.SUM, async_op=False):
        arrays, code = list(arrays), op_code(op)
        return self._comm.submit(lambda: [self.comm.all_reduce(a, code) for a in arrays], (), arrays,
                                 async_op)

    def reduce(self, array, dst, op=ReduceOp.SUM, async_op=False):
        return self.comm.reduce(array, dst, op_code(op), async_op)

    def broadcast(self, array, src, async_op=False):
        return self.comm.broadcast(array, src, async_op)

    def all_gather(self, output_list, array, async_op=False):
        return self.comm.all_gather(list(output_list), array, async_op)

    def all_gather_into(self, output, array, async_op=False):
        return self.comm.all_gather_into(output, array, async_op)

    def gather(self, array, gather_list=None, dst=0, async_op=False):
        _check_root_only(gather_list, self.rank == dst, "gather_list", "dst")
        return self.comm.gather(array, gather_list, dst, async_op)

    def scatter(self, array, scatter_list=None, src=0, async_op=False):
        _check_root_only(scatter_list, self.rank == src, "scatter_list", "src")
        return self.comm.scatter(array, scatter_list, src, async_op)

    def reduce_scatter(self, output, input_list, op=ReduceOp.SUM, async_op=False):
        return self.comm.reduce_scatter(output, list(input_list), op_code(op), async_op)

    def reduce_scatter_into(self, output, input, op=ReduceOp.SUM, async_op=False):
        return self.comm.reduce_scatter_into(output, input, op_code(op), async_op)

    def all_to_all(self, output_list, input_list, async_op=False):
        return self.comm.all_to_all(list(output_list), list(input_list), async_op)

    def all_gather_v(self, output, array, counts, displs=None, async_op=False):
        return self.comm.all_gather_v(output, array, counts, displs, async_op)

    def gather_v(self, array, output=None, counts=None, displs=None, dst=0, async_op=False):
        return self.comm.gather_v(array, output, counts, displs, _core.rank_arg(dst, "dst"), async_op)

    def scatter_v(self, output, input=None, counts=None, displs=None, src=0, async_op=False):
        return self.comm.scatter_v(output, input, counts, displs, _core.rank_arg(src, "src"), async_op)

    def reduce_scatter_v(self, output, input, counts, op=ReduceOp.SUM, async_op=False):
        return self.comm.reduce_scatter_v(output, input, counts, op_code(op), async_op)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          async_op=False):
        return self.comm.all_to_all_single(
            output, input, _core.rows_to_elements(output, output_split_sizes, "output_split_sizes"),
            _core.rows_to_elements(input, input_split_sizes, "input_split_sizes"), async_op)

    def barrier(self, async_op=False):
        return self.comm.barrier(async_op)

    def isend(self, array, dst: int, tag: int = 0):
        return self.comm.isend(array, dst, tag)

    def irecv(self, array, src: int | None = None, tag: int = 0):
        return self.comm.irecv(array, src, tag)

    def send(self, array, dst, tag=0):
        self.comm.isend(array, dst, tag).wait()

    def recv(self, array, src=None, tag=0) -> int:
        work = self.comm.irecv(array, src, tag)
        work.wait()
        return work.source_rank()

    def subgroup(self, members: list[int], index: int, timeout: float) -> ProcessGroup | None:
        """The numpy API's ``new_group(members)`` on this group (every rank calls it; ``index``
        numbers the group's sub-groups): pure shared memory when every member shares this
        rank's node, else a hierarchy of its own over the same store. None on non-members."""
        if self.rank not in members:
            return None
        store, key, label, secret, secret_fn = self._meeting
        nodes = {self.topology.node_of[g] for g in members}
        if len(nodes) == 1:  # a part of this node's shared memory job, under its secret
            comm = _core.Communicator(self.node._comm.job, self.node._comm.derived_part(f"g{index}"),
                                      members.index(self.rank),
                                      len(members), timeout, secret=secret)
            return ProcessGroup(comm, members, f"{self.node._comm.job}.g{index}")
        sub = build(store, members.index(self.rank), len(members), timeout, f"{key}/g{index}",
                    f"{label}.g{index}", secret_fn)
        sub._global_ranks = list(members)
        return sub

    def empty(self, shape, dtype=float):
        """A numpy array in this node's shared memory (collective over this node's ranks)."""
        return self.node.empty(shape, dtype)

    def destroy(self) -> None:
        """Release this node's shared memory and the links between nodes once queued operations
        ran (idempotent). Collective, as ``MPI_Comm_free``: a barrier first, so that no rank
        shuts its links (or, hosting it, the store every rank met on) while another still uses
        them; past the timeout or on a lost peer it goes on alone."""
        self._release(graceful=True)

    def _leave(self) -> None:
        self._release(graceful=False)  # interpreter exit: never wait for peers

    def _release(self, graceful: bool) -> None:
        if self._destroyed:
            return
        self._refuse_destroy_here()
        self._destroyed = True
        group_registry.discard(self)
        try:
            if os.getpid() == self.node._comm.owner_pid:
                self.node._comm.drain()
                self.comm.close(graceful)
        finally:
            self.node.destroy()


def build(store, rank: int, size: int, timeout: float, key: str, label: str, secret_fn=None):
    """Every rank's host through ``store``; on several hosts, this rank's node group, links and
    ``HierarchicalGroup``, else None (the caller makes a one-node group). Collective.

    Example::

        group = build(store, rank, size, 60.0, "shmcomm/np", "job-42")
    """
    hosts = exchange_hosts(store, key, rank, size)
    topology = Topology(hosts)
    if len(topology.nodes) == 1:
        return None
    node_index, local = topology.node_of[rank], topology.local_of[rank]
    node_ranks = topology.nodes[node_index]
    job_key = f"{key}/node{node_index}"
    if local == 0:
        import uuid

        store.set(f"{job_key}/job", f"{label}-n{node_index}-{uuid.uuid4().hex[:8]}")
        store.set(f"{job_key}/secret", secret_fn() if secret_fn else "")
    job = store.get(f"{job_key}/job").decode()
    secret = store.get(f"{job_key}/secret").decode() or None
    from shmcomm.internode import BUSY_THREADS, connect_gloo

    # Each rank here also drives gloo (its transport loop and work thread): while a rank waits
    # for a node peer still crossing the network, spinning would take the core that peer's gloo
    # threads need (on 2 nodes x 2 ranks sharing 2 cores, 32 MiB all_reduce went from 0.67-0.70x
    # plain gloo's time to 0.62-0.64x without it).
    comm = _core.Communicator(job, "node", local, len(node_ranks), timeout, secret=secret,
                              threads_per_rank=1 + BUSY_THREADS)
    node = ProcessGroup(comm, node_ranks, f"{job}.node")
    try:
        rail, world = connect_gloo(store, rank, size, timeout, topology.rails, key)
    except BaseException:
        node.destroy()
        raise
    hcomm = HierarchicalComm(topology, rank, comm, rail, world)
    return HierarchicalGroup(hcomm, node, f"{label}.h", (store, key, label, secret, secret_fn))


def init_multinode(rank: int, size: int, job: str, timeout: float) -> HierarchicalGroup:
    """The numpy API's default group on several nodes (``init_process_group`` calls it when
    ``WORLD_SIZE`` != ``LOCAL_WORLD_SIZE``): the store from ``MASTER_ADDR``/``MASTER_PORT`` (as
    torch's ``env://``), then ``build``.

    Example::

        pg = init_multinode(rank=2, size=4, job="job-42", timeout=60.0)
    """
    local_size = os.environ.get("LOCAL_WORLD_SIZE")
    try:
        import torch.distributed as dist
    except ImportError:
        raise ShmcommError(
            f"ranks span several nodes (WORLD_SIZE={size}, LOCAL_WORLD_SIZE={local_size}): between "
            "nodes shmcomm uses torch's gloo; install the extra: pip install 'shmcomm[torch]'") from None
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(var):
            raise ValueError(f"{var} is not set: ranks on several nodes meet through it "
                             "(torchrun and shmrun --nnodes set it)")
    import datetime

    from shmcomm.trust import new_secret

    store, _, _ = next(dist.rendezvous("env://", rank, size,
                                       timeout=datetime.timedelta(seconds=timeout)))
    store = dist.PrefixStore(f"shmcomm/{job}", store)
    group = build(store, rank, size, timeout, "np", job, new_secret)
    if group is None:
        raise ShmcommError(f"WORLD_SIZE={size} but LOCAL_WORLD_SIZE={local_size}, yet every rank "
                           "runs on this machine: fix the launch environment")
    return group
