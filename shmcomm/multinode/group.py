"""The numpy API's group across nodes: ``HierarchicalGroup``, how it is built (``build``) and how
``init_process_group`` starts one (``start``, registered with ``shmcomm.world``).

Example::

    pg = sc.init_process_group()       # torchrun --nnodes 2 --nproc-per-node 2 ...
    pg.all_reduce(x); print(pg.rank, pg.size, pg.topology.nodes)
"""

from __future__ import annotations

import os

import shmcomm._core as _core
import shmcomm.multinode.link as link
from shmcomm.errors import ShmcommError
from shmcomm.group import EngineGroup, ProcessGroup
from shmcomm.hierarchy.compose import HierarchicalComm
from shmcomm.multinode.store import Meeting, share_job
from shmcomm.hierarchy.topology import Topology, host_identity
from shmcomm.trust import new_secret

__all__ = ["HierarchicalGroup", "build", "start"]


class HierarchicalGroup(EngineGroup):
    """A ``shmcomm.ProcessGroup`` across nodes: the same methods, run by ``HierarchicalComm``
    (shared memory inside this node's group ``node``, links between nodes). Its operations are
    queued on the node group's progress engine; its point to point goes over the world link.

    Example::

        pg = sc.init_process_group()       # torchrun --nnodes 2 --nproc-per-node 2 ...
        pg.all_reduce(x); print(pg.rank, pg.size, pg.topology.nodes)
    """

    def __init__(self, comm: HierarchicalComm, node: ProcessGroup, name: str, meeting: Meeting,
                 label: str, secret_fn=None):
        super().__init__(node._comm, range(comm.size), name, engine=comm, p2p=node._p2p)
        self.comm, self.node, self.topology = comm, node, comm.topology
        # where sub-groups across nodes meet: the meeting, this group's label and how new secrets
        # are made (sub-groups inside the node derive from its group, with its secret)
        self._meeting, self._label, self._secret_fn = meeting, label, secret_fn

    def __repr__(self) -> str:
        return (f"<shmcomm.HierarchicalGroup {self._name} rank={self.rank} size={self.size} "
                f"nodes={len(self.topology.nodes)}>")

    def subgroup(self, members: list[int], index: int, timeout: float) -> ProcessGroup | None:
        """The numpy API's ``new_group(members)`` on this group (every rank calls it; ``index``
        numbers the group's sub-groups): pure shared memory when every member shares this
        rank's node, else a hierarchy of its own over the same meeting. None on non-members.

        Example::

            sub = pg.subgroup([0, 3], index=1, timeout=60.0)
        """
        if self.rank not in members:
            return None
        if len({self.topology.node_of[g] for g in members}) == 1:  # a part of this node's job
            local = [self.topology.local_of[g] for g in members]
            comm = self.node._comm.derive(f"g{index}", local, timeout)
            return ProcessGroup(comm, [self._global_ranks[g] for g in members], f"{comm.job}.g{index}")
        sub = build(self._meeting.among(f"g{index}", members), timeout, f"{self._label}.g{index}",
                    self._secret_fn)
        assert sub is not None, "members on several nodes"
        sub._global_ranks = [self._global_ranks[g] for g in members]
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
        if not self._begin_destroy():
            return
        try:
            if os.getpid() == self.node._comm.owner_pid:
                self.node._comm.drain()
                self.comm.close(graceful)
        finally:
            self.node.destroy()


def build(meeting: Meeting, timeout: float, label: str, secret_fn=None) -> HierarchicalGroup | None:
    """Every rank's host through ``meeting``; on several hosts, this rank's node group, links and
    ``HierarchicalGroup``, else None (the caller makes a one-node group). Collective.

    Example::

        group = build(StoreMeeting(store, "np", rank, size), 60.0, "job-42", new_secret)
    """
    # 1. where every rank runs  2. this node's segment (its first rank names the job and secret)
    # 3. the links between nodes, by the engine SHMCOMM_LINK names
    rank = meeting.rank
    topology = Topology(meeting.all_gather("hosts", host_identity(rank, meeting.size)))
    if len(topology.nodes) == 1:
        return None
    engine = link.engine()
    node_index, local = topology.node_of[rank], topology.local_of[rank]
    node_ranks = topology.nodes[node_index]
    job, secret = share_job(meeting, f"node{node_index}", node_ranks[0], f"{label}-n{node_index}",
                            secret_fn)
    # Each rank here may also drive the link's threads (gloo: its transport loop and work
    # thread): while a rank waits for a node peer still crossing the network, spinning would take
    # the core that peer's threads need (on 2 nodes x 2 ranks sharing 2 cores, 32 MiB all_reduce
    # went from 0.67-0.70x plain gloo's time to 0.62-0.64x without it).
    comm = _core.Communicator(job, "node", local, len(node_ranks), timeout, secret=secret,
                              threads_per_rank=1 + engine.BUSY_THREADS)
    node = ProcessGroup(comm, node_ranks, f"{job}.node")
    try:
        # the composition compares each call's descriptors itself, once: the links need not
        rail, world = engine.connect(meeting, timeout, topology.rails, checked=False)
    except BaseException:
        node.destroy()
        raise
    hcomm = HierarchicalComm(topology, rank, comm, rail, world)
    return HierarchicalGroup(hcomm, node, f"{label}.h", meeting, label, secret_fn)


def start(name: str | None, timeout: float | None) -> ProcessGroup | None:
    """``init_process_group()``'s default group when the launch environment spans nodes (or is
    MPI's, with ``SHMCOMM_LINK=mpi``), else None: the engine of ``SHMCOMM_LINK`` reads its
    launcher's environment, then ``build``. Registered with ``shmcomm.group`` at import.

    Example::

        pg = start(None, None)   # under torchrun --nnodes 2: a HierarchicalGroup
    """
    started = link.engine().launch(name, timeout)
    if started is None:
        return None
    meeting = started.meeting
    group = build(meeting, started.timeout, started.job, new_secret)
    if group is not None:
        return group
    if started.one_node_error:
        raise ShmcommError(started.one_node_error)
    # every rank on one machine, under a launcher that is not shmcomm's (mpirun): a plain group
    comm = _core.Communicator(started.job, "g0", meeting.rank, meeting.size, started.timeout)
    return ProcessGroup(comm, range(meeting.size), f"{started.job}.g0")
