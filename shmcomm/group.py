"""Process groups: creation from arguments or the environment, sub-groups, teardown.

A ``ProcessGroup`` owns one shared segment through the compiled ``Communicator``, whose progress
engine runs the group's operations in issue order. Every collective is a method; the module-level
functions in ``shmcomm.collectives`` call the default group's methods.

A group runs its collectives on an *engine* (``Engine``: the calls every engine provides, with
the ``Communicator``'s signatures). On one node the engine is the ``Communicator`` itself, driven
by the compiled ``GroupCore``; ``EngineGroup`` drives any other engine (a group across nodes,
``shmcomm.multinode``). Groups across nodes are made by ``shmcomm.multinode``, which registers its
start-up here (``register_multinode``): this module imports nothing of it.
"""

from __future__ import annotations

import atexit
import numbers
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol, Sequence, cast, overload

import numpy as np

import shmcomm._core as _core
from shmcomm.errors import AbortedError
from shmcomm.ops import ReduceOp, op_code
from shmcomm.settings import find, read_seconds

from shmcomm.work import Work

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from shmcomm._types import Array, ReduceOpLike

__all__ = ["ProcessGroup", "init_process_group", "is_initialized", "get_rank", "get_world_size",
           "new_group", "split", "new_subgroups", "destroy_process_group", "default_group",
           "Engine", "ENGINE_CALLS", "EngineGroup", "register_multinode"]

# Five minutes: long enough for any collective of a healthy job (and for ranks to start), short
# enough that a script whose peer died fails while someone still watches it. (The torch backend
# takes torch's own default instead, 30 minutes, because torch passes its timeout explicitly.)
DEFAULT_TIMEOUT = 300.0
# A send or receive partner of ``sendrecv`` that is none, as MPI's ``PROC_NULL``: the ranks at the
# edges of a non-periodic halo exchange have one neighbour.
PROC_NULL = -1


class Engine(Protocol):
    """The collective calls every engine of a group provides, with the compiled
    ``Communicator``'s signatures: ``op`` an op code (``shmcomm.ops.op_code``), ranks as ints,
    split sizes in elements, ``factor`` PREMUL_SUM's; each runs inline and returns None, or with
    ``async_op=True`` is queued on the group's progress engine and returns a ``Work``.

    Engines: ``shmcomm._core.Communicator`` (one node) and ``shmcomm.multinode.HierarchicalComm``
    (several); tests/test_groups.py checks that both provide ``ENGINE_CALLS`` with these
    signatures.

    Example::

        engine: Engine = pg._engine
        engine.all_reduce(x, 0)                 # SUM
    """

    rank: int
    size: int

    def all_reduce(self, array: Array, op: int = 0, async_op: bool = False,
                   factor: float = 1.0) -> Work | None: ...

    def reduce(self, array: Array, dst: int, op: int = 0, async_op: bool = False,
               factor: float = 1.0) -> Work | None: ...

    def broadcast(self, array: Array, src: int, async_op: bool = False) -> Work | None: ...

    def all_gather(self, output_list: list[Array], array: Array, async_op: bool = False) -> Work | None: ...

    def all_gather_into(self, output: Array, array: Array, async_op: bool = False) -> Work | None: ...

    def gather(self, array: Array, gather_list: list[Array] | None, dst: int,
               async_op: bool = False) -> Work | None: ...

    def scatter(self, array: Array, scatter_list: list[Array] | None, src: int,
                async_op: bool = False) -> Work | None: ...

    def reduce_scatter(self, output: Array, input_list: list[Array], op: int = 0,
                       async_op: bool = False, factor: float = 1.0) -> Work | None: ...

    def reduce_scatter_into(self, output: Array, input: Array, op: int = 0,
                            async_op: bool = False, factor: float = 1.0) -> Work | None: ...

    def all_to_all(self, output_list: list[Array], input_list: list[Array],
                   async_op: bool = False) -> Work | None: ...

    def all_to_all_single(self, output: Array, input: Array, output_split_sizes: Sequence[int] | None = None,
                          input_split_sizes: Sequence[int] | None = None,
                          async_op: bool = False) -> Work | None: ...

    def all_gather_v(self, output: Array, array: Array, counts: Sequence[int],
                     displs: Sequence[int] | None = None, async_op: bool = False) -> Work | None: ...

    def gather_v(self, array: Array, output: Array | None, counts: Sequence[int] | None,
                 displs: Sequence[int] | None, dst: int, async_op: bool = False) -> Work | None: ...

    def scatter_v(self, output: Array, input: Array | None, counts: Sequence[int] | None,
                  displs: Sequence[int] | None, src: int, async_op: bool = False) -> Work | None: ...

    def reduce_scatter_v(self, output: Array, input: Array, counts: Sequence[int], op: int = 0,
                         async_op: bool = False, factor: float = 1.0) -> Work | None: ...

    def barrier(self, async_op: bool = False) -> Work | None: ...


# The collective calls of ``Engine``, by name (the group calls of the same names take the
# arguments users pass: ``GroupCore``'s, mirrored by ``EngineGroup``)
ENGINE_CALLS = tuple(name for name, value in vars(Engine).items()
                     if callable(value) and not name.startswith("_"))


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

    def scan(self, array: Array, op: ReduceOpLike = ReduceOp.SUM, async_op: bool = False) -> Work | None:
        """``shmcomm.scan`` on this group (its text is copied here at import)."""
        from shmcomm.prefix import prefix_reduce

        return prefix_reduce(self, array, op, False, async_op)

    def exscan(self, array: Array, op: ReduceOpLike = ReduceOp.SUM, async_op: bool = False) -> Work | None:
        """``shmcomm.exscan`` on this group (its text is copied here at import)."""
        from shmcomm.prefix import prefix_reduce

        return prefix_reduce(self, array, op, True, async_op)

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
        return ProcessGroup(comm, members, f"{comm.job}.g{index}")

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

    The collectives are ``GroupCore``'s own: each converts its arguments and calls
    ``self._engine`` when that is not the group's ``Communicator``. Only point to point differs:
    it goes through the engine, not the node's ring engine. Queued operations still run in issue
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


def _partner_arg(rank: int | None, name: str, size: int, allow_any: bool) -> None:
    """Refuse a ``sendrecv`` partner that is not a rank of a group of ``size``, ``PROC_NULL``, or
    (``allow_any``) None for any rank."""
    if rank is None and allow_any:
        return
    r = _rank_arg(rank, name)
    if r != PROC_NULL and not 0 <= r < size:
        anyone = ", None (any rank)" if allow_any else ""
        raise ValueError(f"{name} must be a rank of the group (0 to {size - 1}){anyone} or PROC_NULL, got {r}")


# ---- the default group and module-level management ------------------------------------------
_lock = threading.Lock()
_default: ProcessGroup | None = None
_groups: list[ProcessGroup] = []


def _env_int(var: str) -> int:
    raw = os.environ.get(var)
    if raw is None:
        raise ValueError(f"{var} is not set: pass it as an argument or run under shmrun/torchrun")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{var} must be an integer, got {raw!r}") from None


def _env_job() -> str:
    job = os.environ.get("SHMCOMM_JOB")
    if job:
        return job
    run_id, port = os.environ.get("TORCHELASTIC_RUN_ID"), os.environ.get("MASTER_PORT")
    if run_id and port:
        return f"{run_id}-{port}"
    raise ValueError("SHMCOMM_JOB is not set (nor TORCHELASTIC_RUN_ID and MASTER_PORT): pass name= "
                     "or run under shmrun/torchrun")


def job_arguments(rank: int | None, world_size: int | None, name: str | None,
                  timeout: float | None, name_arg: str = "name") -> tuple[int, int, str, float]:
    """Rank, world size, job name and timeout from the arguments, else from the environment
    (RANK, WORLD_SIZE, SHMCOMM_JOB or TORCHELASTIC_RUN_ID + MASTER_PORT, SHMCOMM_TIMEOUT).

    Example::

        rank, size, job, timeout = job_arguments(None, None, None, None)   # under shmrun
    """
    rank = _env_int("RANK") if rank is None else _rank_arg(rank, "rank")
    world_size = _env_int("WORLD_SIZE") if world_size is None else _rank_arg(world_size, "world_size")
    job = _env_job() if name is None else name
    if not isinstance(job, str) or not job:
        raise ValueError(f"{name_arg} must be a non-empty string, got {job!r}")
    if timeout is None:
        return rank, world_size, job, read_seconds(find("SHMCOMM_TIMEOUT"), DEFAULT_TIMEOUT)
    return rank, world_size, job, timeout_arg(timeout)


def timeout_arg(timeout: float) -> float:
    """A group's ``timeout`` argument in seconds: a number > 0; ``inf`` (or any span past the
    deadlines' range, as torch's ``timedelta.max``) waits without limit. TypeError or ValueError
    naming the argument otherwise.

    Example::

        timeout_arg(float("inf"))   # inf: collectives never time out
    """
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
    if not timeout > 0:  # nan too
        raise ValueError(f"timeout must be > 0 seconds (inf: no timeout), got {timeout!r}")
    return float(timeout)


# Groups across nodes: shmcomm.multinode registers its start-up here when it is imported (as
# ``import shmcomm`` does), so that the dependency runs one way, shmcomm.multinode -> this module.
# ``start(name, timeout)`` returns the default group when the launch environment spans nodes (or
# is MPI's, with SHMCOMM_LINK=mpi), else None.
_multinode_start: Callable[[str | None, float | None], ProcessGroup | None] | None = None


def register_multinode(start: Callable[[str | None, float | None], ProcessGroup | None]) -> None:
    """Make ``start`` decide, when ``init_process_group`` reads the environment, whether the
    default group spans nodes (``shmcomm.multinode`` registers itself at import).

    Example::

        register_multinode(shmcomm.multinode.group.start)
    """
    global _multinode_start
    _multinode_start = start


def init_process_group(rank: int | None = None, world_size: int | None = None, name: str | None = None,
                       timeout: float | None = None) -> ProcessGroup:
    """Join the default group of this job; returns it once every rank has joined.

    Every rank of the job calls it with the same job name and world size. Missing arguments
    come from the environment ``shmrun`` and ``torchrun`` set: ``RANK``, ``WORLD_SIZE``, and the
    job name from ``SHMCOMM_JOB``, else ``TORCHELASTIC_RUN_ID`` + ``MASTER_PORT``. Launched on
    several nodes (``LOCAL_WORLD_SIZE`` != ``WORLD_SIZE``, as torchrun and ``shmrun --nnodes``
    set, with rank and world size from the environment), the group is hierarchical: shared
    memory inside each node, torch's gloo between nodes (``shmcomm.multinode``; needs the
    ``shmcomm[torch]`` extra), or MPI with ``SHMCOMM_LINK=mpi`` under ``mpirun`` (rank and
    world size from MPI).

    Args:
        rank (int | None): this process's rank in ``[0, world_size)``; None (the default):
            ``RANK``.
        world_size (int | None): the number of ranks; None (the default): ``WORLD_SIZE``.
        name (str | None): the job name, the same on every rank and unique among the jobs
            running on this machine; None (the default): from the environment.
        timeout (float | None): seconds a collective of this group, and this call, may wait for
            the other ranks; ``inf`` (or torch's ``timedelta.max`` in seconds): no limit; None
            (the default): ``SHMCOMM_TIMEOUT``, else 300.

    Returns:
        ProcessGroup: the default group, also used by every call made with ``group=None``.

    Raises:
        ValueError: it was already called (without ``destroy_process_group``); a variable
            needed is not set or not an integer (the message names it); ``rank`` is outside
            ``[0, world_size)``, ``world_size`` < 1, ``timeout`` <= 0 or nan (or
            ``SHMCOMM_TIMEOUT`` not such a number), or ``name`` empty.
        TypeError: ``rank`` or ``world_size`` is not an int, or ``timeout`` not a number.
        CommTimeoutError: not every rank joined within ``timeout``.
        PeerFailureError: rank 0 died during the start-up.
        ShmcommError: the ranks disagree on the world size, a rank is taken by a live process,
            the job name is in use by another live job, or a peer is not the process that joined;
            on several nodes, torch is missing.
        UntrustedFileError: the group's shared file is not this user's or not this job's.

    Example::

        pg = sc.init_process_group()               # under shmrun or torchrun
        pg = sc.init_process_group(rank=0, world_size=2, name="job-42", timeout=60.0)
    """
    global _default
    with _lock:
        if _default is not None:
            raise ValueError("init_process_group was already called; destroy_process_group() first")
        from_env = rank is None and world_size is None
        if from_env and _multinode_start is not None:
            _default = _multinode_start(name, timeout)
        if _default is None:
            rank, world_size, job, timeout = job_arguments(rank, world_size, name, timeout)
            comm = _core.Communicator(job, "g0", rank, world_size, timeout)
            _default = ProcessGroup(comm, range(world_size), f"{job}.g0")
        _core.set_default_group(_default)
        _groups.append(_default)
        return _default


def default_group() -> ProcessGroup:
    """The default group; ValueError if ``init_process_group`` was not called.

    Example::

        pg = default_group()
    """
    if _default is None:
        raise ValueError("shmcomm is not initialized: call shmcomm.init_process_group() first")
    return _default


def resolve(group: ProcessGroup | None) -> ProcessGroup:
    """``group`` itself, or the default group for None (TypeError for anything else)."""
    if group is None:
        if _default is None:
            return default_group()  # raises the "not initialized" error
        return _default
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be a shmcomm.ProcessGroup or None, got {type(group).__name__}")
    return group


def is_initialized() -> bool:
    """Whether this process has a default group.

    Returns:
        bool: True between ``init_process_group`` and ``destroy_process_group``.

    Example::

        if not sc.is_initialized():
            sc.init_process_group()
    """
    return _default is not None


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in ``group``.

    Args:
        group (ProcessGroup | None): the group; default None, the default group.

    Returns:
        int: the rank, in ``[0, get_world_size(group))``.

    Raises:
        ValueError: ``group`` is None and shmcomm is not initialized.
        TypeError: ``group`` is not a ProcessGroup.

    Example::

        if sc.get_rank() == 0:
            print("world size", sc.get_world_size())
    """
    return resolve(group).rank


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in ``group``.

    Args:
        group (ProcessGroup | None): the group; default None, the default group.

    Returns:
        int: the group's size, at least 1.

    Raises:
        ValueError: ``group`` is None and shmcomm is not initialized.
        TypeError: ``group`` is not a ProcessGroup.

    Example::

        n = sc.get_world_size()
    """
    return resolve(group).size


def new_group(ranks: Sequence[int] | None = None, timeout: float | None = None) -> ProcessGroup | None:
    """Make a group of some ranks of the default group (collective over the default group).

    Every rank of the default group calls it, with the same ``ranks``, also those that are not
    members. Ranks are sorted (as torch does): group rank i is the i-th smallest of ``ranks``.

    Args:
        ranks (Sequence[int] | None): ranks of the default group, distinct; None (the default):
            all of them.
        timeout (float | None): the new group's timeout in seconds; None (the default): the
            default group's.

    Returns:
        ProcessGroup | None: the new group on its members, None on the other ranks.

    Raises:
        ValueError: shmcomm is not initialized; ``ranks`` is empty, holds a rank twice or one
            outside the default group.
        TypeError: a rank is not an int.
        CommTimeoutError: not every member joined within the timeout.

    Example::

        sub = sc.new_group(ranks=[0, 2])
        if sub is not None:
            sc.all_reduce(x, group=sub)
    """
    parent = default_group()
    members = list(range(parent.size)) if ranks is None else sorted(_rank_arg(r, "ranks[i]") for r in ranks)
    return _subgroup(parent, members, timeout, f"ranks must be distinct and non-empty, got {ranks}")


def split(color: int | None, key: int = 0, timeout: float | None = None) -> ProcessGroup | None:
    """Split the default group by ``color``, as MPI's ``Comm_split`` (collective).

    Every rank of the default group calls it. Ranks that pass the same ``color`` form one new
    group, ordered by ``key``, then by their rank in the default group.

    Args:
        color (int | None): the new group's label, >= 0; None (MPI's ``UNDEFINED``): join none.
        key (int): this rank's sort key in its new group; default 0.
        timeout (float | None): the new groups' timeout in seconds; None (the default): the
            default group's.

    Returns:
        ProcessGroup | None: this rank's new group; None for ``color=None``.

    Raises:
        ValueError: shmcomm is not initialized; ``color`` is not an int >= 0 or None.
        TypeError: ``key`` is not an int.
        CommTimeoutError: not every rank arrived within the timeout.
        PeerFailureError: a rank of the default group died or left it.

    Example::

        row = sc.split(color=sc.get_rank() // 2, key=sc.get_rank())   # ranks 0-1, 2-3, ...
        sc.all_reduce(x, group=row)
    """
    parent = default_group()
    if color is not None and (isinstance(color, bool) or not isinstance(color, int) or color < 0):
        raise ValueError(f"color must be an integer >= 0 or None, got {color!r}")
    if isinstance(key, bool) or not isinstance(key, int):
        raise TypeError(f"key must be an integer, got {type(key).__name__}")
    everyone: list = [None] * parent.size
    parent.all_gather_object(everyone, (color, key))
    mine = None
    for c in sorted({c for c, _ in everyone if c is not None}):  # the same order on every rank
        members = sorted((r for r, (rc, _) in enumerate(everyone) if rc == c),
                         key=lambda r: (everyone[r][1], r))
        group = _subgroup(parent, members, timeout, "")
        mine = group if c == color else mine
    return mine


def new_subgroups(group_size: int | None = None, timeout: float | None = None
                  ) -> tuple[ProcessGroup, list[ProcessGroup | None]]:
    """Cut the default group into consecutive groups of ``group_size`` ranks (collective).

    As ``torch.distributed.new_subgroups``: every rank of the default group calls it; group k
    holds ranks ``k * group_size`` to ``(k + 1) * group_size - 1``.

    Args:
        group_size (int | None): ranks per group, dividing the world size; None (the default):
            the ranks on this machine (the whole default group on one node).
        timeout (float | None): the new groups' timeout in seconds; None (the default): the
            default group's.

    Returns:
        tuple[ProcessGroup, list[ProcessGroup | None]]: this rank's group, and every group in
        order (None for those this rank is not in).

    Raises:
        ValueError: shmcomm is not initialized; ``group_size`` is not an int >= 1 or does not
            divide the world size.
        CommTimeoutError: not every member joined within the timeout.

    Example::

        mine, every = sc.new_subgroups(group_size=2)    # 4 ranks: [0, 1] and [2, 3]
    """
    parent = default_group()
    size = parent.size
    if group_size is None:
        topology = getattr(parent, "topology", None)
        group_size = len(topology.nodes[topology.node_of[parent.rank]]) if topology else size
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    if size % group_size:
        raise ValueError(f"the group's {size} ranks do not divide into groups of {group_size}")
    every = [_subgroup(parent, list(range(start, start + group_size)), timeout, "")
             for start in range(0, size, group_size)]
    return cast(ProcessGroup, every[parent.rank // group_size]), every  # this rank is a member


def _subgroup(parent: ProcessGroup, members: list[int], timeout: float | None,
              empty_message: str) -> ProcessGroup | None:
    """The group of ``members`` (in this order: group rank i is ``members[i]``) under
    ``parent``; collective over ``parent``; None on non-members."""
    if len(set(members)) != len(members) or not members:
        raise ValueError(empty_message or f"members must be distinct and non-empty, got {members}")
    bad = [r for r in members if not 0 <= r < parent.size]
    if bad:
        raise ValueError(f"ranks {bad} are outside the default group of size {parent.size}")
    with _lock:
        parent._subgroups += 1
        index = parent._subgroups
    group = parent.subgroup(members, index, float(timeout or parent._comm.timeout))
    if group is not None:
        with _lock:
            _groups.append(group)
    return group


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Release a group's shared memory, once its queued operations ran.

    With None it destroys the default group and every group made from it, and
    ``init_process_group`` may be called again. A destroyed group refuses every later call.
    Destroying a group twice does nothing.

    Args:
        group (ProcessGroup | None): the group; None (the default): the default group and all
            its sub-groups.

    Raises:
        TypeError: ``group`` is not a ProcessGroup.
        ShmcommError: called from inside one of the group's own queued operations.

    Example::

        sc.destroy_process_group()
    """
    global _default
    with _lock:
        victims = list(_groups) if group is None else [resolve(group)]
        for g in victims:  # before the registry forgets any of them
            g._refuse_destroy_here()
        if group is None:
            _groups.clear()
            _default = None
            _core.set_default_group(None)
        else:
            group = victims[0]
            if group in _groups:
                _groups.remove(group)
            if group is _default:
                _default = None
                _core.set_default_group(None)
    for g in victims:
        g.destroy()


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
