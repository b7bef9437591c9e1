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
  bfloat16 arrays; ``shared`` (optional, default False): whether it takes ``sc.empty`` arrays
  (a level that keeps them where they lie; the others would stage copies that lose to the flat
  zero-copy path).
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

from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

import numpy as np

from shmcomm.errors import PeerFailureError
from shmcomm.hierarchy.compose import name_in_whole_group
from shmcomm.multinode.link import check_same

if TYPE_CHECKING:
    import shmcomm._core as _core

__all__ = ["Level", "check_same_call", "run_or_abort"]


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


def check_same_call(comm: _core.Communicator, mine: np.ndarray, how: str, free: int | None = None) -> np.ndarray:
    """Every rank's descriptor ``mine`` (``shmcomm.multinode.link.descriptor``) of a composed
    call, checked on the whole group before any step: a rank that took the flat path meets it
    there, and both raise CollectiveMismatchError (``how`` words it). Column ``free`` may differ
    between ranks (a level's own flag, which the ranks then agree on from the rows returned).

    Example::

        rows = check_same_call(comm, descriptor("all_reduce", a, op), "composed inside NUMA nodes")
    """
    rows = np.empty((comm.size, mine.size), np.int64)
    comm.all_gather(list(rows), mine)  # the list form: never composed
    checked = rows
    if free is not None:
        checked = rows.copy()
        checked[:, free] = 0
    check_same(checked, f"ranks of a group whose large calls are {how}", "rank")
    return rows


def run_or_abort(comm: _core.Communicator, how: str, steps: Callable[..., None], args: tuple,
                 abort_level: Callable[[str, BaseException], None],
                 settle: Optional[Callable[[], None]] = None) -> None:
    """``steps(*args)``, the steps of a composed call of ``comm`` (after ``check_same_call``).

    When a step fails, peers may wait in a step this rank will not reach: they are woken with
    the cause. A death aborts only the level's groups (``abort_level``; every rank sees the
    death on the whole group itself, so its later calls fail as PeerFailureError, not
    AbortedError), renumbered as the whole group's rank; anything else aborts the whole group.
    Then ``settle()`` (a level with steps still running on other threads waits for them), and
    the error is raised. ``how`` words the abort's reason.

    Example::

        run_or_abort(comm, "composed inside NUMA nodes", steps.all_reduce_steps, (a, op, 1.0),
                     level.abort)
    """
    try:
        steps(*args)
    except BaseException as exc:
        died = isinstance(exc, PeerFailureError)
        if died and exc.pid > 0:
            name_in_whole_group(exc, comm.rank_of_pid(exc.pid))
        reason = f"{type(exc).__name__} on rank {comm.rank} (a call {how}): {str(exc)[:400]}"
        (abort_level if died else comm.abort)(reason, exc)
        if settle is not None:
            settle()
        raise
