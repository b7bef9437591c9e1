"""Compositions: collectives served by composing calls on sub-groups, one level a module.

Levels (the contract: ``level.py``), tried in the order of ``LEVELS`` when a group is made:

* ``numa.py``: inside each NUMA node first, then across nodes (large all_reduce,
  reduce_scatter_into, all_gather_into), where ranks are bound inside NUMA nodes.
* ``threads.py``: large all_reduce split over each rank's own threads, where every rank owns
  several cores (serves what the NUMA level leaves).

What they compose with, one concept a module::

    compose.py    HierarchicalComm: the two-level steps (node group, rail, world) of any
                  collective; the multi-node groups (shmcomm.multinode) and the NUMA level use it
    uneven.py     the uneven (v) collectives' pieces, over any exchange
    scratch.py    reusable scratch buffers of the steps
    topology.py   who runs where: hosts, nodes, rails (SHMCOMM_SIMULATE_NODES)

The machine's CPU topology (NUMA nodes, sockets, cores) is ``shmcomm.cpus``, which the launcher
uses too. Adding a level is one new module here and one row of ``LEVELS``; the compiled core's
registry serves each call by the routes the levels declare (``_core.add_route``): the core never
calls into this package to decide a path.

Example::

    levels = attach_levels(comm)     # [] on a machine with one NUMA node
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import shmcomm._core as _core
    from shmcomm.hierarchy.level import Level

__all__ = ["LEVELS", "add_routes", "attach_levels"]

# The levels, in the order their routes are tried: modules with attach(comm) -> Level | None.
LEVELS = ("shmcomm.hierarchy.numa", "shmcomm.hierarchy.threads")


def attach_levels(comm: _core.Communicator) -> list[Level]:
    """Attach every level of ``LEVELS`` that applies to ``comm`` and add its routes. Collective
    over ``comm``'s ranks. A level that fails leaves none attached.

    Example::

        attach_levels(pg._comm)      # [NumaLevel(...)] with ranks bound inside two NUMA nodes
    """
    attached: list[Level] = []
    try:
        for name in LEVELS:
            level = importlib.import_module(name).attach(comm)
            if level is not None:
                attached.append(level)
        for level in attached:
            add_routes(comm, level)
    except BaseException:
        for level in attached:
            if level not in comm.levels:
                level.close()   # those with a route close with comm
        raise
    return attached


def add_routes(comm: _core.Communicator, level: Level) -> Level:
    """Add ``level``'s routes to ``comm``'s (``_core.add_route``, one per entry point it serves):
    from then on the compiled registry hands it the calls its rules take. Returns ``level``.

    Example::

        add_routes(comm, numa.install(comm, [0, 1, 0, 1], 1 << 20))   # ranks placed by hand
    """
    import shmcomm._core as _core

    for entry, min_bytes in level.routes:
        _core.add_route(comm, entry, level, min_bytes, level.min_ranks, level.bfloat16,
                        getattr(level, "shared", False))
    return level
