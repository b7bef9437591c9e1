"""Groups that span several machines: shared memory inside each node, an engine between nodes.

One concept per module; arrows point at what a module uses::

    shmcomm.group, <--------------------- group.py      HierarchicalGroup (an EngineGroup), build,
    shmcomm.world                           |   |         start: init_process_group's hook,
    (EngineGroup; register_multinode)       |   |         registered below
                                            |   v
              shmcomm.hierarchy: <------ compose.py     HierarchicalComm: the composed collectives
              topology.py (hosts,           |             (an Engine, _core.pyi), numpy inside;
              nodes, rails, SIMULATE)       |             uneven.py, scratch.py beside it
                                            v
                                         link.py        the Link contract (numpy arrays), the
                                            |             engine choice (SHMCOMM_LINK), connect
                               +------------+------------+
                               v                         v
                         gloo_link.py               mpi_link.py    engines: torch's gloo (default),
                         (numpy <-> torch inside)    (mpi4py)        MPI under mpirun (no torch)
                               |                         |
                               +-----------> store.py <--+       how ranks meet before any link:
                                    Meeting, StoreMeeting over     the Meeting protocol, share_job
                                    torch's store (also used by    (a job's name and secret), the
                                    shmcomm.torch)                 env:// store

A collective on a ``HierarchicalGroup`` runs as one operation of the node group's progress
engine: ``shmcomm.hierarchy.compose`` drives the node's ``Communicator`` and two links, the rail
(this rank's local index on every node) and the world (every rank). ``shmcomm.world`` imports nothing from here:
importing this package registers ``group.start`` with it (``import shmcomm`` does so).

Example::

    pg = sc.init_process_group()         # under torchrun --nnodes 2 (or shmrun --nnodes 2)
    sc.all_reduce(x)                     # shared memory inside the node, gloo between nodes
    # under mpirun, with SHMCOMM_LINK=mpi: MPI between nodes, no torch
"""

import shmcomm.world as _world
from shmcomm.hierarchy.compose import HierarchicalComm
from shmcomm.multinode.group import HierarchicalGroup, build, start
from shmcomm.hierarchy.topology import Topology

__all__ = ["HierarchicalComm", "HierarchicalGroup", "Topology", "build", "start"]

_world.register_multinode(start)
