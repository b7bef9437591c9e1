"""Large collectives on a machine with several NUMA nodes: reduce and gather inside each NUMA node
first, as Open MPI's HAN and coll/xhc do, so that only 1/L of the data crosses between nodes (L
ranks per NUMA node) instead of about half of it.

A group gets the composition when its ranks are each bound inside one NUMA node (``shmrun
--bind-to numa`` or ``core``, ``taskset``, ``numactl``), the nodes hold the same number of ranks,
two or more each, and there are two nodes or more; ``SHMCOMM_SIMULATE_NUMA=K`` (testing) makes
K blocks of consecutive ranks act as NUMA nodes on any machine. Then all_reduce, reduce_scatter_into
and all_gather_into of private arrays of ``SHMCOMM_NUMA_BYTES`` (1 MiB, all ranks' data together)
and more run, each as one operation of the group's progress engine:

1. a check on the whole group that every rank called the same collective (a rank that took the
   flat path instead meets it there, and both raise CollectiveMismatchError);
2. the multi-node composition's steps (``shmcomm.hierarchy.compose``), with shared-memory groups
   for both levels: each NUMA node's group and each *rail* (the ranks of one local index, one per
   node). all_reduce: reduce-scatter in the node, all_reduce of each shard along the rail,
   all-gather in the node. reduce_scatter: each node sums its ranks' pieces for every node, the
   rails reduce-scatter those sums. all_gather: along the rail, then inside each node.

Every rank gets the same bits (each level reduces in one fixed order), not the flat path's: the
order of the sum differs. ``sc.empty`` arrays keep the flat zero-copy path, and smaller messages
the flat paths: below a megabyte the composition's extra steps should cost more than the traffic
it saves. Not yet measured on a machine with several NUMA nodes (``bench/bench_numa.py``).

Example::

    SHMCOMM_SIMULATE_NUMA=2 shmrun -n 4 python train.py     # 2 simulated NUMA nodes of 2 ranks
    pg._comm.levels[0].calls                                 # collectives it ran
"""

from __future__ import annotations

from typing import Any

import numpy as np

import shmcomm._core as _core
from shmcomm import cpus
from shmcomm.hierarchy.compose import HierarchicalComm, flat, numpy_bfloat16
from shmcomm.hierarchy.level import check_same_call, run_or_abort
from shmcomm.hierarchy.topology import Topology
from shmcomm.multinode.link import descriptor
from shmcomm.settings import find, read_int

__all__ = ["NumaLevel", "attach", "install"]


def attach(comm: _core.Communicator) -> NumaLevel | None:
    """Give ``comm`` the NUMA composition for its large collectives, where it applies (see the
    module's text): then its groups per NUMA node and per rail are made and the composition
    returned, else None. Collective over ``comm``'s ranks (they agree: every input is the same
    on every rank or exchanged).

    Example::

        numa = attach(comm)     # None on a machine with one NUMA node
    """
    size = comm.size
    if size < 4:
        return None
    simulated = read_int(find("SHMCOMM_SIMULATE_NUMA"), 1)
    if simulated == 1 and cpus.machine_numa_nodes(cpus.SYSFS) == 1:
        return None  # the common case, decided without the group's settings or any exchange
    threshold = _core.group_settings(size, comm.threads_per_rank, comm.busy_ranks)["numa_bytes"]
    if threshold == 0:
        return None
    if simulated > 1:
        nodes = [r * simulated // size for r in range(size)]
    else:
        every = np.empty(size, np.int64)
        comm.all_gather_into(every, np.array([cpus.rank_numa_node(cpus.SYSFS)], np.int64))
        nodes = every.tolist()
        if -1 in nodes:
            return None
    return install(comm, nodes, threshold)


def install(comm: _core.Communicator, nodes: list[int], threshold: int) -> NumaLevel | None:
    """``attach``'s second half: with rank r of ``comm`` on NUMA node ``nodes[r]`` (the same list
    on every rank), make the groups of each node and rail and return the level serving from
    ``threshold`` bytes; None when the layout has no use for it (one node, nodes of different
    sizes, or of one rank each). Collective. Tests call it, then ``shmcomm.hierarchy.add_routes``,
    to place ranks as they like.

    Example::

        install(comm, [0, 1, 0, 1], 1 << 20)   # shmrun --bind-to numa's round robin, 2 nodes
    """
    topology = Topology([f"NUMA node {n}" for n in nodes])
    if len(topology.nodes) < 2 or not topology.even or len(topology.nodes[0]) < 2:
        return None
    node_index, local = topology.node_of[comm.rank], topology.local_of[comm.rank]
    assert topology.rails is not None  # even
    node = comm.derive(f"numa{node_index}", topology.nodes[node_index])
    try:
        rail = comm.derive(f"rail{local}", topology.rails[local])
    except BaseException:
        node.close()
        raise
    return NumaLevel(comm, topology, node, rail, threshold)


class NumaLevel:
    """The NUMA level of one group's large collectives (``attach`` makes it; a ``Level``):
    ``comm``, the whole group; ``node``, this rank's NUMA node's group; ``rail``, the group of
    this rank's local index on every node. It serves ``all_reduce``, ``reduce_scatter_into`` and
    ``all_gather_into`` of ``threshold`` bytes and more (in all).

    Example::

        pg._comm.levels[0].calls     # collectives that went this way
    """

    min_ranks = 4
    # its steps view bfloat16 arrays through ml_dtypes: without it bfloat16 stays flat
    bfloat16 = numpy_bfloat16() is not None

    def __init__(self, comm: _core.Communicator, topology: Any, node: _core.Communicator,
                 rail: _core.Communicator, threshold: int):
        self.topology = topology
        self.routes = (("all_reduce", threshold), ("reduce_scatter_into", threshold),
                       ("all_gather_into", threshold))
        self._comm, self._node, self._rail = comm, node, rail
        # the multi-node composition's steps, both levels shared memory: always by shards
        self._steps = HierarchicalComm(topology, comm.rank, node, rail, None, leaders_bytes=0)
        self.calls = 0

    def all_reduce(self, array: Any, op: int, async_op: bool, factor: float):
        """Run ``array``'s all_reduce as the composition, in issue order on the group's engine."""
        a = flat(array, writable=True)
        return self._comm.submit(self._run, ("all_reduce", a, op, self._steps.all_reduce_steps,
                                             (a, op, factor)), [array], async_op)

    def reduce_scatter_into(self, output: Any, input: Any, op: int, async_op: bool, factor: float):
        """Run a reduce_scatter_into as the composition: each NUMA node sums every node's pieces
        of its ranks' inputs, then the rails reduce-scatter those sums."""
        out, inp = flat(output, "output", writable=True), flat(input, "input")
        return self._comm.submit(self._run, ("reduce_scatter", inp, op, self._steps.reduce_scatter_steps,
                                             (out, inp, op, factor)), [output], async_op)

    def all_gather_into(self, output: Any, array: Any, async_op: bool):
        """Run an all_gather_into as the composition: the rails gather every node's piece of
        this local index, then each node gathers its ranks' pieces of every node."""
        out, a = flat(output, "output", writable=True), flat(array)
        return self._comm.submit(self._run, ("all_gather", out, -1, self._steps.all_gather_steps,
                                             (out, a)), [output], async_op)

    def _run(self, kind: str, whole: np.ndarray, op: int, steps, args: tuple) -> None:
        """One composed collective: every rank's (kind, dtype, bytes of ``whole``, op) checked on
        the whole group first, then its steps."""
        how = "composed inside NUMA nodes"
        check_same_call(self._comm, descriptor(kind, whole, op), how)
        run_or_abort(self._comm, how, steps, args, self.abort)
        self.calls += 1

    def abort(self, reason: str | None, cause: BaseException | None = None) -> None:
        """Abort both levels' groups (the whole group's abort calls it), with its ``cause``."""
        self._node.abort(reason, cause)
        self._rail.abort(reason, cause)

    def close(self) -> None:
        """Leave both levels' groups (the whole group's close calls it)."""
        try:
            self._node.close()
        finally:
            self._rail.close()
