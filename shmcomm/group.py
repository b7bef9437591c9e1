"""Process groups: one group's calls, its sub-groups and its teardown.

A ``ProcessGroup`` owns one shared segment through the compiled ``Communicator``, whose progress
engine runs the group's operations in issue order. Every collective is a method; the module-level
functions in ``shmcomm.collectives`` call the default group's methods. The default group and the
functions that make and destroy groups (``init_process_group``, ``new_group``, ...) are
``shmcomm.world``'s.

A group runs its collectives on an *engine* (``shmcomm._core.Engine``: the calls every engine
provides, with the ``Communicator``'s signatures). On one node the engine is the ``Communicator`` itself, driven
by the compiled ``GroupCore``; ``EngineGroup`` drives any other engine (a group across nodes,
``shmcomm.multinode``).
"""

from __future__ import annotations

import atexit
import inspect
import os
import weakref
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence, cast, overload

import numpy as np

import shmcomm._core as _core
from shmcomm.errors import AbortedError
from shmcomm.ops import ReduceOp, op_code


from shmcomm.work import Work

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from shmcomm._core import Engine
    from shmcomm._types import Array, ReduceOpLike

__all__ = ["ProcessGroup", "ENGINE_CALLS", "EngineGroup", "DEFAULT_TIMEOUT", "PROC_NULL"]

# Five minutes: long enough for any collective of a healthy job (and for ranks to start), short
# enough that a script whose peer died fails while someone still watches it. (The torch backend
# takes torch's own default instead, 30 minutes, because torch passes its timeout explicitly.)
DEFAULT_TIMEOUT = 300.0
# A send or receive partner of ``sendrecv`` that is none, as MPI's ``PROC_NULL``: the ranks at the
# edges of a non-periodic halo exchange have one neighbour.
PROC_NULL = -1


# The collective calls of a group's engine (``shmcomm._core.Engine``, a type of the stub), by
# name: those of the compiled ``GroupCore``, which drives them (its point to point goes through
# the P2PEngine instead).
ENGINE_CALLS = tuple(name for name in vars(_core.GroupCore)
                     if not name.startswith("_") and name not in ("send", "recv"))


class ProcessGroup(_core.GroupCore):
    """A set of local processes that run collectives together over shared memory.

    Made by ``init_process_group`` (the default group), ``new_group``, ``split`` or
    ``new_subgroups``, never by hand. Every collective and point-to-point call is also a method
    (``pg.all_reduce(x)`` is ``sc.all_reduce(x, group=pg)``); each method's text is that of the
    module function, without ``group``. ``src``/``dst`` arguments are ranks within this group.
    Operations on one group run in issue order. The array collectives are compiled in its base
    ``shmcomm._core.GroupCore``.

    Example::

        pg = sc.init_process_group()
        x = np.arange(4.0)
        pg.all_reduce(x)              # same as sc.all_reduce(x, group=pg)
        print(pg.rank, pg.size, x)
    """

    def __init__(self, comm: _core.Communicator, global_ranks: Sequence[int], name: str,
                 engine: Engine | None = None, p2p: _core.P2PEngine | None = None):
        # comm: the segment whose progress engine runs this group's operations in issue order;
        # engine: what runs its collectives (comm itself on one node)
        self._comm = comm
        self._engine: Engine = comm if engine is None else engine
        self._global_ranks = list(global_ranks)
        self._name = name
        self._p2p = _core.P2PEngine(comm) if p2p is None else p2p
        self._subgroups = 0
        self._destroyed = False
        _alive.add(self)
        if engine is None and not comm.levels:
            from shmcomm.hierarchy import attach_levels  # it builds on shmcomm.multinode

            try:
                attach_levels(comm)  # compositions serving some calls, where they apply
            except BaseException:
                self.destroy()
                raise

    # ---- identity ---------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return self._engine.rank

    @property
    def size(self) -> int:
        """Number of ranks in the group."""
        return self._engine.size

    @property
    def name(self) -> str:
        """The group's name (job name and group index)."""
        return self._name

    @property
    def ranks(self) -> list[int]:
        """Ranks of the members in the default group, in group-rank order."""
        return list(self._global_ranks)

    def __repr__(self) -> str:
        return f"<shmcomm.ProcessGroup {self._name} rank={self.rank} size={self.size}>"

    # ---- running operations -----------------------------------------------------------------
    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], outputs: list[Any],
            async_op: bool) -> Work | None:
        """Run ``fn(*args)`` as one operation of this group, in issue order.

        An entry point of the group's engine (``pg._engine.all_reduce``, ...) runs as that
        collective; any other callable (a composite operation, such as the torch backend's coalesced calls) runs
        whole, the collectives it calls inside it, before the next operation starts.

        Args:
            fn (Callable): the operation: a bound method of ``pg._engine``, or any callable.
            args (tuple): its arguments.
            outputs (list): what the Work's ``result()`` returns.
            async_op (bool): if True, queue it and return a ``Work`` at once.

        Returns:
            None once ``fn`` ran; with ``async_op=True``, a ``Work`` whose ``result()`` is
            ``outputs`` and whose ``wait()`` raises ``fn``'s error.

        Raises:
            ValueError: the group was destroyed.
            Exception: what ``fn`` raises (with ``async_op=True``, from ``wait()``).

        Example::

            def both(a, b):
                pg._engine.all_reduce(a, 0); pg._engine.broadcast(b, 0)
            pg.run(both, (x, y), [x, y], async_op=True).wait()
        """
        if self._destroyed:
            raise ValueError(f"process group {self._name} was destroyed")
        if getattr(fn, "__self__", None) is self._engine:
            return fn(*args, async_op=async_op)
        return self._comm.submit(fn, tuple(args), outputs, async_op)

    def abort(self) -> None:
        """Abort the group on every rank: pending and later operations raise ``AbortedError``.

        Every rank's queued and blocked operations on this group (collectives, sends and
        receives) fail with ``AbortedError``, and so does every later one; the group can only be
        destroyed then. Other groups are not affected.

        Example::

            pg.abort()
        """
        self._comm.abort()
        self._p2p.fail_all(AbortedError(f"group {self._name} was aborted"))

    # ---- collectives: compiled in shmcomm._core.GroupCore ------------------------------------
    @overload
    def all_reduce_coalesced(self, arrays: Sequence[Array], op: ReduceOpLike = ...,
                             async_op: Literal[False] = ...) -> None: ...
    @overload
    def all_reduce_coalesced(self, arrays: Sequence[Array], op: ReduceOpLike = ..., *,
                             async_op: Literal[True]) -> Work: ...
    @overload
    def all_reduce_coalesced(self, arrays: Sequence[Array], op: ReduceOpLike = ...,
                             async_op: bool = ...) -> Work | None: ...
    def all_reduce_coalesced(self, arrays: Sequence[Array], op: ReduceOpLike = ReduceOp.SUM,
                             async_op: bool = False) -> Work | None:
        """``shmcomm.all_reduce_coalesced`` on this group (its text is copied here at import)."""
        arrays, code = list(arrays), op_code(op)
        reduce_one = self._engine.all_reduce

        def run():
            for a in arrays:
                reduce_one(a, code)
        return self._comm.submit(run, (), arrays, async_op)

    # ---- point to point ---------------------------------------------------------------------
    def isend(self, array: Array, dst: int, tag: int = 0) -> Work:
        """``shmcomm.isend`` on this group (its text is copied here at import)."""
        work = Work(None, (array,), [array], self.abort, self._p2p.drive)
        self._p2p.post_send(work._future, array, _rank_arg(dst, "dst"), _tag_arg(tag))
        return work

    def irecv(self, array: Array, src: int | None = None, tag: int = 0) -> Work:
        """``shmcomm.irecv`` on this group (its text is copied here at import)."""
        work = Work(None, (array,), [array], self.abort, self._p2p.drive)
        source = _core.source_arg(src)
        self._p2p.post_recv(work._future, array, source, _tag_arg(tag), work)
        return work

    def sendrecv(self, sendbuf: Array, dst: int, recvbuf: Array, src: int | None, sendtag: int = 0,
                 recvtag: int = 0) -> int:
        """``shmcomm.sendrecv`` on this group (its text is copied here at import)."""
        if sendbuf is recvbuf and PROC_NULL not in (dst, src):
            raise ValueError("sendbuf and recvbuf must be different arrays (MPI's Sendrecv rule)")
        # Checked before anything is posted: a receive left posted by a failed call would take a
        # later message. The send goes first, so a bad recvbuf leaves at most a message in flight.
        _partner_arg(dst, "dst", self.size, allow_any=False)
        _partner_arg(src, "src", self.size, allow_any=True)
        _tag_arg(sendtag)
        _tag_arg(recvtag)
        # Both posted before either is waited for: in a ring where every rank sends first, a
        # message larger than a slot waits for its receive, which would never be posted.
        send = None if dst == PROC_NULL else self.isend(sendbuf, dst, sendtag)
        recv = None if src == PROC_NULL else self.irecv(recvbuf, src, recvtag)
        errors: list[Exception] = []
        for work in (recv, send):  # both end before an error is raised: neither is left in flight
            try:
                if work is not None:
                    work.wait()
            except Exception as exc:  # noqa: BLE001 - the first one is raised below
                errors.append(exc)
        if errors:
            raise errors[0]
        return PROC_NULL if recv is None else recv.source_rank()

    # ---- object collectives -----------------------------------------------------------------
    def broadcast_object_list(self, object_list: list[Any], src: int = 0) -> None:
        """``shmcomm.broadcast_object_list`` on this group (its text is copied here at import)."""
        from shmcomm import objects

        objects.broadcast_object_list(self, object_list, src)

    def all_gather_object(self, object_list: list[Any], obj: Any) -> None:
        """``shmcomm.all_gather_object`` on this group (its text is copied here at import)."""
        from shmcomm import objects

        objects.all_gather_object(self, object_list, obj)

    def gather_object(self, obj: Any, object_gather_list: list[Any] | None = None, dst: int = 0) -> None:
        """``shmcomm.gather_object`` on this group (its text is copied here at import)."""
        from shmcomm import objects

        objects.gather_object(self, obj, object_gather_list, dst)

    def scatter_object_list(self, scatter_object_output_list: list[Any],
                            scatter_object_input_list: Sequence[Any] | None = None, src: int = 0) -> None:
        """``shmcomm.scatter_object_list`` on this group (its text is copied here at import)."""
        from shmcomm import objects

        objects.scatter_object_list(self, scatter_object_output_list, scatter_object_input_list, src)

    # ---- shared arrays ------------------------------------------------------------------------
    def empty(self, shape: int | Sequence[int], dtype: DTypeLike = float) -> np.ndarray[Any, np.dtype[Any]]:
        """``shmcomm.empty`` on this group (its text is copied here at import)."""
        from shmcomm import shared_arrays

        return shared_arrays.empty(self, shape, dtype)

    # ---- sub-groups ---------------------------------------------------------------------------
    def subgroup(self, members: list[int], index: int, timeout: float) -> ProcessGroup | None:
        """The group of ``members`` (ranks of this group; member i becomes rank i), this
        group's sub-group number ``index``: what ``new_group``, ``split`` and ``new_subgroups``
        make. Collective over this group; None on non-members.

        Example::

            sub = pg.subgroup([0, 2], index=1, timeout=60.0)
        """
        if self.rank not in members:
            return None
        comm = self._comm.derive(f"g{index}", members, timeout)
        return ProcessGroup(comm, [self._global_ranks[m] for m in members], f"{comm.job}.g{index}")

    def split(self, color: int | None, key: int = 0, timeout: float | None = None) -> ProcessGroup | None:
        """Split this group by ``color``, as MPI's ``Comm.Split``: ``shmcomm.split(color, key,
        timeout, group=self)`` (collective over this group).

        Example::

            row = pg.split(color=pg.rank // 2, key=pg.rank)     # ranks 0-1, 2-3, ...
            one = row.split(color=row.rank)                      # and again, on the row
        """
        from shmcomm.world import split

        return split(color, key, timeout, group=self)

    # ---- teardown -----------------------------------------------------------------------------
    def destroy(self) -> None:
        """Release this group's shared memory once its queued operations ran (idempotent).

        ``destroy_process_group`` calls it and also forgets the group; a group made outside the
        module's registry (the torch backend's) is destroyed with this alone. Later calls on the
        group raise ``ValueError`` or ``ShmcommError`` ("the process group was destroyed").
        In a forked child it only forgets the group: the parent is still in it.

        Raises:
            ShmcommError: called from inside one of the group's own queued operations.

        Example::

            pg.destroy()
        """
        if not self._begin_destroy():
            return
        if os.getpid() != self._comm.owner_pid:
            self._comm.close()  # a forked child: forget the group, the parent is still in it
            return
        try:
            self._comm.drain()  # queued ops run to their end (each bounded by the timeout)
        finally:
            self._p2p.close()
            self._comm.close()


    def _leave(self) -> None:
        self.destroy()  # at interpreter exit; groups across nodes skip their closing barrier

    def _begin_destroy(self) -> bool:
        """Mark the group destroyed and forget it; False if it already was (nothing to do).
        Refused from inside one of its own operations, before anything changes."""
        if self._destroyed:
            return False
        self._refuse_destroy_here()
        self._destroyed = True
        _alive.discard(self)
        return True

    def _refuse_destroy_here(self) -> None:
        """ShmcommError when called from inside one of this group's own queued operations (which
        would wait for itself); checked before anything is given up, so the group stays whole."""
        if not self._destroyed:
            self._comm.refuse_inside_own_operation()


_rank_arg = _core.rank_arg


_tag_arg = _core.tag_arg


class EngineGroup(ProcessGroup):
    """A group whose collectives run on an engine written in Python (an ``Engine`` that also has
    ``isend`` and ``irecv``), such as ``shmcomm.multinode.HierarchicalComm``.

    Each collective is made from ``GroupCore``'s of the same name (``_engine_call``): the same
    signature and text, its arguments converted as ``GroupCore``'s converts them, then the
    engine's call; ``GroupCore`` itself only ever calls its ``Communicator``. Point to point goes
    through the engine too, not the node's ring engine. Queued operations still run in issue
    order on ``self._comm``'s progress engine.

    Example::

        group = EngineGroup(node_comm, range(engine.size), "job.h", engine=engine)
        group.all_reduce(x, "max")    # engine.all_reduce(x, int(ReduceOp.MAX), False)
    """

    # point to point: the engine's own (GroupCore's goes through the node's P2PEngine)
    def isend(self, array, dst, tag=0):
        return cast(Any, self._engine).isend(array, _rank_arg(dst, "dst"), _tag_arg(tag))

    def irecv(self, array, src=None, tag=0):
        source = None if src is None else _rank_arg(src, "src")
        return cast(Any, self._engine).irecv(array, source, _tag_arg(tag))

    def send(self, array, dst, tag=0):
        self.isend(array, dst, tag).wait()

    def recv(self, array, src=None, tag=0):
        work = self.irecv(array, src, tag)
        work.wait()
        return work.source_rank()


# How GroupCore converts each argument of a collective before its Communicator sees it, by
# parameter name (group_core.pxi); any other argument goes to the engine as given. EngineGroup's
# collectives are made from this table, so an engine written in Python gets what a Communicator
# gets, and a new collective kind needs no code here.
_ENGINE_ARGUMENTS = {
    "op": "op_code(op)",
    "src": "_rank_arg(src, 'src')",
    "dst": "_rank_arg(dst, 'dst')",
    "async_op": "bool(async_op)",
    "output_list": "list(output_list)",
    "input_list": "list(input_list)",
    "gather_list": "None if gather_list is None else list(gather_list)",
    "scatter_list": "None if scatter_list is None else list(scatter_list)",
    "output_split_sizes": "_core.rows_to_elements(output, output_split_sizes, 'output_split_sizes')",
    "input_split_sizes": "_core.rows_to_elements(input, input_split_sizes, 'input_split_sizes')",
}


def _engine_call(name: str) -> Callable[..., Any]:
    """``EngineGroup``'s collective ``name``: ``GroupCore``'s signature and text, the arguments
    converted by ``_ENGINE_ARGUMENTS``, then ``self._engine``'s call of that name. Written as
    source and compiled once (as ``dataclasses`` writes ``__init__``), so that it costs what a
    hand-written method would.

    Example::

        _engine_call("reduce")   # def reduce(self, array, dst, op=..., async_op=...):
                                 #     return self._engine.reduce(array, _rank_arg(dst, 'dst'),
                                 #                                op_code(op), bool(async_op))
    """
    core = getattr(_core.GroupCore, name)
    params = list(inspect.signature(core).parameters.values())[1:]  # after self
    passed = ", ".join(_ENGINE_ARGUMENTS.get(p.name, p.name) for p in params)
    source = (f"def {name}(self, {', '.join(p.name for p in params)}):\n"
              f"    return self._engine.{name}({passed})\n")
    namespace: dict[str, Any] = {"op_code": op_code, "_rank_arg": _rank_arg, "_core": _core}
    exec(compile(source, f"<EngineGroup.{name}>", "exec"), namespace)  # noqa: S102 - our own text
    call = namespace[name]
    call.__defaults__ = tuple(p.default for p in params if p.default is not p.empty) or None
    call.__qualname__, call.__module__ = f"EngineGroup.{name}", __name__  # text: shmcomm.collectives
    return call


for _name in ENGINE_CALLS:
    setattr(EngineGroup, _name, _engine_call(_name))
del _name


def _partner_arg(rank: int | None, name: str, size: int, allow_any: bool) -> None:
    """Refuse a ``sendrecv`` partner that is not a rank of a group of ``size``, ``PROC_NULL``, or
    (``allow_any``) None for any rank."""
    if rank is None and allow_any:
        return
    r = _rank_arg(rank, name)
    if r != PROC_NULL and not 0 <= r < size:
        anyone = ", None (any rank)" if allow_any else ""
        raise ValueError(f"{name} must be a rank of the group (0 to {size - 1}){anyone} or PROC_NULL, got {r}")


# Every group not destroyed yet, whoever made it (this module, the torch backend).
_alive: "weakref.WeakSet[ProcessGroup]" = weakref.WeakSet()


@atexit.register
def _leave_at_exit() -> None:
    # Peers waiting on this rank learn it left instead of waiting for the liveness check.
    for g in list(_alive):
        try:
            g._leave()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
