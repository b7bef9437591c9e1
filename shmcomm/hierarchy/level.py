"""The level contract: what a composition level provides to serve some of a group's collectives
by composing calls on sub-groups (as Open MPI's HAN composes its intra-node and inter-node
levels, and coll/xhc keeps the component it replaces as its fallback).

A level lives in one module of ``shmcomm.hierarchy`` that has:

* ``attach(comm) -> Level | None``: collective over the group's ranks (every rank returns a
  level or every rank None). It decides from what it can see (the machine's topology, settings)
  whether it applies, makes its sub-groups (``comm.derive``) and returns the level, or None.

and the ``Level`` it returns has:

* ``routes``: the entry points it serves and from what size each, ``(entry, min_bytes)`` pairs.
  ``shmcomm.hierarchy.attach_levels`` adds them to the group's routes (``_core.add_route``); the
  compiled registry decides, per call, after the arguments are checked, whether a route holds.
* ``min_ranks``: the group size below which it serves nothing; ``bfloat16``: whether it takes
  bfloat16 arrays.
* one method per entry point, with the ``Communicator``'s signature (``all_reduce(array, op,
  async_op, factor)``, ``all_gather_into(output, array, async_op)``, ``reduce_scatter_into(output,
  input, op, async_op, factor)``), which queues the composed call in issue order
  (``comm.submit``) and returns what the ``Communicator`` would;
* ``abort(reason, cause)`` and ``close()``: called by the group's own, for its sub-groups.

A composed call first checks on the whole group that every rank made the same call (a rank
that took the flat path meets it there and both raise ``CollectiveMismatchError``).

Example::

    class Level(Protocol): ...          # below
    numa = shmcomm.hierarchy.numa.attach(comm)   # None on a machine with one NUMA node
    numa.routes                          # (("all_reduce", 1048576), ...)
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Level"]


class Level(Protocol):
    """A composition level (see the module's text). Example::

        def serves(level: Level, entry: str) -> bool:
            return any(e == entry for e, _ in level.routes)
    """

    routes: tuple[tuple[str, int], ...]
    min_ranks: int
    bfloat16: bool

    def abort(self, reason: str | None, cause: BaseException | None = None) -> None:
        """Abort the level's sub-groups with ``reason`` (the group's own abort calls it)."""

    def close(self) -> None:
        """Leave the level's sub-groups (the group's own close calls it)."""

    def all_reduce(self, array: Any, op: int, async_op: bool, factor: float) -> Any:
        """Serve an all_reduce (only when ``routes`` names it)."""
