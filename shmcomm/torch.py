"""``torch.distributed`` backend "shmcomm": every CPU collective of torch over shared memory.

Installed with ``pip install shmcomm[torch]``, the backend is named by the ``torch.backends``
entry point (``_shmcomm_torch_entry``) as soon as torch is imported, and this module is imported
at the first ``init_process_group("shmcomm")``, so an unchanged script only names it::

    import torch, torch.distributed as dist
    dist.init_process_group("shmcomm")        # under torchrun or shmrun
    t = torch.ones(4); dist.all_reduce(t)     # t == world_size on every rank
    dist.destroy_process_group()

``import shmcomm.torch`` registers it by hand (when entry points are disabled with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``). Each torch process group, ``new_group`` ones included, gets
its own shared segment: its ranks agree on a unique job name through the store torch hands the
backend. A group whose ranks run on several machines is hierarchical (shmcomm.multinode):
shared memory inside each machine, torch's gloo between them.
"""

from __future__ import annotations

import collections
import datetime
import functools
import math
import sys
import threading

import torch
import torch.distributed as dist

from _shmcomm_torch_entry import BACKEND_NAME, autoload, register
from shmcomm import _core
from shmcomm.buffer_pool import BufferPool
from shmcomm.errors import ShmcommError
from shmcomm.group import ProcessGroup as _ShmGroup
from shmcomm.multinode import HierarchicalGroup, build
from shmcomm.multinode.store import StoreMeeting, share_job
from shmcomm.ops import ReduceOp
from shmcomm.segments import sanitize_job
from shmcomm.torch_ops import all_reduce_  # the drop-in of CPU inference engines (re-exported)
from shmcomm.torch_ops import groups as _op_groups, kernels as _op_kernels
from shmcomm.trust import new_secret

__all__ = ["BACKEND_NAME", "ShmcommProcessGroup", "ShmcommWork", "all_reduce_", "register"]

# On a torch built without distributed support this module still imports, and registers nothing.
_HAVE_DIST = dist.is_available()
if _HAVE_DIST:
    from torch._C import _distributed_c10d as _c10d
    _ProcessGroupBase, _WorkBase = dist.ProcessGroup, dist.Work
else:  # pragma: no cover - CPU wheels of every supported platform ship torch.distributed
    _c10d = None
    _ProcessGroupBase = _WorkBase = object

# Dtypes the compiled core reduces and moves natively; any other dtype (float8, complex32, ...)
# is moved as raw bytes by the data-movement collectives and refused by the reducing ones.
_NATIVE = frozenset(getattr(torch, name) for name in _core.DTYPE_NAMES if hasattr(torch, name))


# ---- reduce ops: torch's ReduceOp -> (shmcomm op code, PREMUL_SUM factor) ------------------------
def _reduce_codes() -> dict:
    """torch's RedOpType value -> shmcomm op code, matched by name."""
    if not _HAVE_DIST:
        return {}
    return {int(member): _core.OP_NAMES.index(name)
            for name, member in dist.ReduceOp.RedOpType.__members__.items() if name in _core.OP_NAMES}


_REDUCE_CODES = _reduce_codes()
_PREMUL_SUM = _core.PREMUL_SUM


def _hash_codes() -> dict:
    """hash(ReduceOp object) -> shmcomm op code, when hashes tell the ops apart (they are the
    RedOpType values in torch 2.x); reading ``.op`` through pybind costs twice as much."""
    if not _HAVE_DIST:
        return {}
    opts, codes = _c10d.AllreduceOptions(), {}
    for name, member in dist.ReduceOp.RedOpType.__members__.items():
        opts.reduceOp = dist._make_nccl_premul_sum(1.0) if name == "PREMUL_SUM" else dist.ReduceOp(member)
        codes[hash(opts.reduceOp)] = _REDUCE_CODES.get(int(member))
    distinct = len(codes) == len(dist.ReduceOp.RedOpType.__members__)
    return codes if distinct and None not in codes.values() else {}


def _reduction(reduce_op) -> tuple[int, float]:
    """The shmcomm op code of a torch ``ReduceOp``, and its factor (1.0 unless PREMUL_SUM).

    Example::

        code, factor = _reduction(dist._make_nccl_premul_sum(0.5))   # factor == 0.5
    """
    code = _HASHED_CODES.get(hash(reduce_op)) if type(reduce_op) is _ReduceOpType else None
    if code is None:
        kind = getattr(reduce_op, "op", reduce_op)
        code = _REDUCE_CODES.get(int(kind))
        if code is None:
            raise ValueError(f"shmcomm does not support ReduceOp {getattr(kind, 'name', kind)}")
    if code != _PREMUL_SUM:
        return code, 1.0
    return code, _premul_factor(reduce_op)


def _premul_factor(reduce_op) -> float:
    """The factor of ``ReduceOp.PREMUL_SUM(factor)`` (a number, or a one-element tensor)."""
    factor = reduce_op.__getstate__()[1]
    if isinstance(factor, torch.Tensor):
        if factor.numel() != 1:
            raise ValueError(f"PREMUL_SUM's factor must be a scalar or a one-element tensor, got a "
                             f"tensor of shape {tuple(factor.shape)}")
        factor = factor.item()
    if isinstance(factor, complex):
        raise TypeError(f"PREMUL_SUM's factor must be real, got {factor}")
    return float(factor)


_ReduceOpType = dist.ReduceOp if _HAVE_DIST else None
try:
    _HASHED_CODES = _hash_codes()
except Exception:  # noqa: BLE001 - an optimisation only: _reduction falls back to reading `.op`
    _HASHED_CODES = {}


def _seconds(timeout) -> float | None:
    """Seconds of a torch timeout (timedelta or number); None for 'no timeout' (0 or negative).
    torch's C++ passes timedelta(0) on every wait_tensor: falsy, like None, so it returns at once.
    inf for a span torch's int64 microseconds wrapped to days below zero: timedelta.max, "never",
    reaches a backend as -67519912 days (its own unset value is -1 ms)."""
    if not timeout:
        return None
    if isinstance(timeout, datetime.timedelta):
        if timeout < -datetime.timedelta(days=1):
            return math.inf
        timeout = timeout.total_seconds()
    timeout = float(timeout)
    return timeout if timeout > 0 else None


def _async(opts) -> bool:
    """Whether torch's call was ``async_op=True`` (``opts.asyncOp``). Before torch 2.8 only some
    options carry it (2.7: those of broadcast, scatter, all_gather and reduce_scatter); without
    it, the operation is queued as an asynchronous one, as gloo's are, and torch itself waits on
    the Work of a synchronous call, which runs it on the caller.

    Example::

        opts = _c10d.AllreduceOptions(); opts.asyncOp = False   # as dist.all_reduce(t) sets it
        _async(opts)                                           # False (torch >= 2.8)
    """
    return getattr(opts, "asyncOp", True)


# ---- tensors: the core takes contiguous native tensors by pointer; the rest through a copy -------
# The core's test for "takes it by pointer as it is" (plain CPU tensor, contiguous, native
# dtype, no lazy conjugate or negative bit); anything else goes through `_stage`'s copy.
_fast = _core.tensor_is_direct


def _plain(t, argname: str) -> torch.Tensor:
    """The tensor whose memory holds ``t``'s data, for the core to take by pointer.

    ``t`` itself for plain tensors and subclasses without a ``__torch_dispatch__`` of their own
    (``nn.Parameter``); for an ``AsyncCollectiveTensor`` (what functional collectives and
    ``DTensor.to_local()`` return), the tensor it wraps, once its collective completed, so that
    results written there show through the wrapper. Other subclasses with a ``__torch_dispatch__``
    (DTensor, ...) raise ``TypeError``: a wrapper's own pointer is not its data, and a subclass
    that intercepts operations may not hold its values as plain memory.

    Example::

        out = fc.all_reduce(torch.ones(4), "sum", group)   # an AsyncCollectiveTensor
        _plain(out, "tensor")                              # waits; the wrapped plain tensor
    """
    if type(t) is torch.Tensor:
        return t
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{argname} must be a torch.Tensor, got {type(t).__name__}")
    # Looked up, not imported: this module loads inside `import torch`, and no such tensor can
    # exist before torch.distributed._functional_collectives was imported.
    funcol = sys.modules.get("torch.distributed._functional_collectives")
    while funcol is not None and isinstance(t, funcol.AsyncCollectiveTensor):
        t = t.trigger_wait()
    if t._python_dispatch:
        raise TypeError(f"{argname}: shmcomm takes tensors by their memory and cannot take a "
                        f"{type(t).__name__}, a tensor subclass with its own __torch_dispatch__; "
                        f"pass a plain tensor (for a DTensor, its .to_local() or .full_tensor())")
    return t


def _stage(t: torch.Tensor, reducing: bool, argname: str):
    """Return ``(buffer, dense)``: ``buffer`` goes to the core; ``dense`` is the contiguous tensor
    to copy back into ``t`` after an output was written, or None when ``buffer`` shares ``t``'s
    memory."""
    if _fast(t):
        return t, None
    t = _plain(t, argname)
    if t.layout is not torch.strided:
        raise TypeError(f"{argname}: shmcomm supports dense tensors only, got layout {t.layout}")
    if t.device.type != "cpu":
        raise ValueError(f"{argname}: shmcomm serves CPU tensors only, got a tensor on {t.device}")
    native = t.dtype in _NATIVE
    if not native and reducing:
        raise TypeError(f"{argname}: shmcomm cannot reduce dtype {t.dtype}")
    if t.is_conj() or t.is_neg():  # lazy conjugate/negative views have no plain memory to share
        dense = t.resolve_conj().resolve_neg().contiguous()
    else:
        dense = t if t.is_contiguous() else t.contiguous()
    buf = dense if native else dense.reshape(-1).view(torch.uint8)
    return buf, (None if dense is t else dense)


class _Call:
    """The core calls of one torch operation and the copies back into non-contiguous outputs.

    Most operations are one call on tensors the core takes as they are: they go straight to the
    core. Coalesced ones, and those needing copies, run as one composite operation (`_composite`).
    """

    __slots__ = ("calls", "backs")

    def __init__(self):
        self.calls = []
        self.backs = []

    def input(self, t, reducing=False, argname="tensor"):
        return _stage(t, reducing, argname)[0]

    def output(self, t, reducing=False, argname="tensor"):
        if not _fast(t):
            _refuse_overlap(t, argname)
        buf, dense = _stage(t, reducing, argname)
        if dense is not None:
            self.backs.append((t, dense))
        return buf


def _refuse_overlap(t, argname: str) -> None:
    """An output whose elements share memory (``expand``: stride 0) cannot hold a result;
    refused before anything runs (the copy back failed after the collective had run).

    Example::

        _refuse_overlap(torch.ones(1).expand(4), "tensor")   # ValueError
    """
    if isinstance(t, torch.Tensor) and t.layout is torch.strided and any(
            stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride())):
        raise ValueError(f"{argname}: an expanded tensor (shape {tuple(t.shape)}, stride "
                         f"{t.stride()}: several elements share memory) cannot receive a result; "
                         f"pass a tensor of its own (.clone())")


def _scaled(reduce_fn, factor: float):
    """The core's reduction entry point, with PREMUL_SUM's factor bound when there is one."""
    return reduce_fn if factor == 1.0 else functools.partial(reduce_fn, factor=factor)


def _call_each(fn, *args) -> None:
    """For composite operations whose calls differ in their core function: args[0](*args[1:])."""
    fn(*args)


def _composite(fn, calls, backs) -> None:
    """``fn(*args)`` for each args of ``calls`` (inside one queued operation), then the copies back."""
    for args in calls:
        fn(*args)
    for t, dense in backs:
        t.copy_(dense)


# ---- Work ---------------------------------------------------------------------------------------
class ShmcommWork(_WorkBase):
    """The ``torch.distributed.Work`` returned by every shmcomm collective and point-to-point call.

    ``wait()`` raises the operation's error (a ``shmcomm.ShmcommError`` such as
    ``PeerFailureError`` or ``CollectiveMismatchError``), and ``get_future()`` gives a
    ``torch.futures.Future`` completed with the output tensors or failed with a RuntimeError
    naming that error::

        work = dist.all_reduce(t, async_op=True)
        work.wait()                                   # raises if the all_reduce failed
        fut = dist.all_reduce(t, async_op=True).get_future()
        total = fut.then(lambda f: f.value()[0].sum()).wait()

    A synchronous call (``opts.asyncOp`` False: ``dist.all_reduce(t)`` and the like, which
    wait on the Work and drop it) finished before it returns; it returns a completed Work with
    its outputs, reused from a pool once nobody holds it (``_done``: making one costs a fifth of
    a small all_reduce).
    """

    # No Python __init__: pybind's runs alone (a Python one that calls it costs 0.7 us more, a
    # fifth of a small all_reduce); `_new_work` fills the slots.
    __slots__ = ("_work", "_outputs", "_after", "_lock", "_future")

    def _finish(self):
        if self._after is not None:
            with self._lock:
                after, self._after = self._after, None
                if after is not None:
                    after()

    def wait(self, timeout=None) -> bool:
        """Block until the operation is done; raise its error. ``timeout``: timedelta or seconds.

        Example::

            dist.broadcast(t, src=0, async_op=True).wait()
        """
        if self._work is not None:
            self._work.wait(_seconds(timeout))
        self._finish()
        return True

    def is_completed(self) -> bool:
        """True once the operation finished, successfully or not.

        Example::

            while not work.is_completed(): compute()
        """
        return self._work is None or self._work.is_completed()

    def is_success(self) -> bool:
        """True when the operation finished without error.

        Example::

            work.wait(); assert work.is_success()
        """
        return self._work is None or self._work.is_success()

    def exception(self):
        """The operation's error, or None.

        Example::

            err = work.exception()
        """
        return None if self._work is None else self._work.exception()

    def result(self) -> list:
        """The output tensors, after waiting.

        Example::

            out, = dist.all_reduce(t, async_op=True).result()
        """
        self.wait()
        return _flat(self._outputs)

    def source_rank(self) -> int:
        """Group rank of the sender of a completed receive (``dist.recv(src=None)`` uses it).

        Example::

            w = dist.irecv(buf); w.wait(); print(w.source_rank())
        """
        if self._work is None:
            return -1
        self._work.wait()
        return self._work.source_rank()

    _source_rank = source_rank

    def synchronize(self) -> None:
        """Nothing to do on CPU; kept for torch's API.

        Example::

            work.synchronize()
        """

    def get_future(self):
        """A ``torch.futures.Future`` completed with the outputs, or failed with the error (a
        ``RuntimeError`` naming it, as torch's own backends fail theirs; ``wait()`` on the Work
        raises the ``shmcomm`` error itself).

        Example::

            fut = dist.all_reduce(t, async_op=True).get_future(); fut.wait()
        """
        if self._future is None:
            if self._work is None:
                self._future = torch.futures.Future()
                self._finish()
                self._future.set_result(self._outputs)
            else:
                # C++ readers of the future (DDP's reducer) see only its C++ state: failed, it must
                # be an error there, which only a raising then() callback makes. (A future
                # completed with the exception as its value, set_exception's way, reads as a
                # success holding no tensors: DDP's reducer crashed on it.)
                outcome = torch.futures.Future()
                self._future = outcome.then(_outputs_or_raise)
                self._work.get_future().add_done_callback(lambda done: self._complete(done, outcome))
        return self._future

    def _complete(self, done, outcome) -> None:
        try:
            done.value()
            self._finish()
        except BaseException as exc:  # noqa: BLE001 - carried to the torch future
            outcome.set_exception(exc)
            return
        outcome.set_result(self._outputs)

    def __repr__(self) -> str:
        return f"<shmcomm.torch.ShmcommWork {'done' if self.is_completed() else 'pending'}>"


def _new_work(work, outputs, after=None) -> ShmcommWork:
    """The ``ShmcommWork`` of one operation.

    ``work``: the shmcomm ``Work``, or None when the operation already finished; ``outputs``:
    what ``result()`` and the future give; ``after``: run once after success (copies back into
    outputs).

    Example::

        w = _new_work(None, [t]); w.wait(); w.result()   # [t]
    """
    w = ShmcommWork()
    w._work, w._outputs, w._after, w._future = work, outputs, after, None
    w._lock = threading.Lock() if after is not None else None
    return w


# Completed Works of synchronous calls, reused (see _done): one per thread making calls at once.
_DONE_POOL: collections.deque = collections.deque()


def _done(outputs: list) -> ShmcommWork:
    """The completed Work of a synchronous call, whose ``result()`` is its ``outputs`` (as
    gloo's). Taken from a pool: making one costs 0.9 us, a fifth of a small all_reduce, and
    torch drops it at once (``dist.all_reduce(t)`` waits on it and lets go). One that somebody
    still holds (its reference count says so) leaves the pool, and a new one takes its place.

    Example::

        w = _done([t]); w.wait(); w.result()   # [t]
    """
    try:
        w = _DONE_POOL.popleft()  # atomic: no two threads take the same one
    except IndexError:
        w = None
    if w is None or sys.getrefcount(w) > 2:  # (w and getrefcount's argument)
        w = _new_work(None, outputs)
    else:
        w._outputs, w._future = outputs, None
    _DONE_POOL.append(w)
    return w


def _outputs_or_raise(outcome):
    """The then() callback of ``ShmcommWork.get_future``: the outputs, or the error raised."""
    return outcome.value()


def _gathered(output_lists: list) -> list:
    """What a list-form gather's future holds, as gloo's: the output list of its one input, or
    the list of output lists when there are several."""
    return output_lists[0] if len(output_lists) == 1 else list(output_lists)


def _flat(outputs) -> list:
    flat = []
    for item in outputs:
        if isinstance(item, (list, tuple)):
            flat.extend(item)
        else:
            flat.append(item)
    return flat


# ---- rendezvous through torch's store -------------------------------------------------------------
def _rendezvous(store, rank: int, size: int, group_name: str, timeout: float):
    """Where this group's ranks run, through the store: on one machine, ``(job, secret)`` for
    its segment (a job name unique to this group and to this incarnation of its name; a secret
    for shmcomm.trust); across machines, the ``HierarchicalGroup`` (shmcomm.multinode)."""
    # Every rank of incarnation g adds before any rank can finish it (the segment needs all of
    # them), so the counter values of one incarnation form one block of `size`.
    generation = (store.add("shmcomm/joined", 1) - 1) // size
    meeting = StoreMeeting(store, f"shmcomm/{generation}", rank, size)
    label = f"torch-{sanitize_job(group_name or 'pg')[:12]}"
    spanning = build(meeting, timeout, label, new_secret)
    if spanning is not None:
        return spanning
    return share_job(meeting, "pg", 0, label, new_secret)


# ---- the process group ------------------------------------------------------------------------------
class ShmcommProcessGroup(_ProcessGroupBase):
    """A ``torch.distributed.ProcessGroup`` whose CPU collectives run over shared memory.

    torch creates it through the registered backend; a script never builds one by hand::

        dist.init_process_group("shmcomm")
        sub = dist.new_group([0, 1])                  # another ShmcommProcessGroup
        print(dist.group.WORLD.name(), sub.group_name)

    Synchronous calls run at once on the caller; ``async_op=True`` calls (and the ones DDP
    issues) run in issue order on the group's progress thread. Contiguous tensors are used in
    place; non-contiguous ones go through a contiguous copy.
    """

    def __init__(self, store, rank: int, size: int, timeout=None, group_name: str = "",
                 global_ranks=None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._group_name, self._group_desc = group_name, ""
        seconds = _seconds(timeout) or 1800.0
        place = _rendezvous(store, rank, size, group_name, seconds)
        self._on_one_node = not isinstance(place, HierarchicalGroup)  # self._comm is the core's
        if not self._on_one_node:  # ranks on several machines
            self._pg, self._comm, self._pool = place, place.comm, None
            _op_groups.enter(self, group_name)  # what torch.ops.shmcomm's group_name finds
            return
        job, secret = place
        comm = _core.Communicator(job, "pg", rank, size, seconds, secret=secret)
        members = list(global_ranks) if global_ranks else list(range(size))
        self._pg = _ShmGroup(comm, members, f"{job}.pg")
        self._comm = comm
        self._pool = BufferPool(self._pg)
        _op_groups.enter(self, group_name)  # what torch.ops.shmcomm's group_name finds

    # ---- identity ------------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - name fixed by torch's C++ trampoline
        """``"shmcomm"`` (what ``pg.name()`` and ``dist.get_backend`` report).

        Example::

            assert dist.group.WORLD.name() == "shmcomm"
        """
        return BACKEND_NAME

    def getGroupName(self) -> str:  # noqa: N802
        """The group's name (``pg.group_name``), set by torch when it creates the group.

        Example::

            print(dist.group.WORLD.group_name)
        """
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        """Called by torch with the group's name.

        Example::

            pg._set_group_name("trainers")
        """
        self._group_name = name
        _op_groups.enter(self, name)

    def getGroupDesc(self) -> str:  # noqa: N802
        """The group's description (``pg.group_desc``), e.g. ``"default_pg"``.

        Example::

            print(dist.group.WORLD.group_desc)
        """
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        """Called by torch with the group's description.

        Example::

            pg._set_group_desc("data parallel")
        """
        self._group_desc = desc
        if desc == "default_pg":  # what init_process_group calls the default group
            _op_groups.enter(self, self._group_name, is_default=True)

    def __repr__(self) -> str:
        return (f"<shmcomm.torch.ShmcommProcessGroup {self._group_name!r} rank={self._rank} "
                f"size={self._size}>")

    # ---- running: every method below is an adapter onto one of these two ------------------------
    def _go(self, fn, args: tuple, outputs: list, async_op: bool) -> ShmcommWork:
        """One core call on tensors it takes as they are: straight to the core."""
        work = self._pg.run(fn, args, outputs, async_op)
        return _new_work(work, outputs) if async_op else _done(outputs)

    def _go_all(self, fn, call: _Call, outputs: list, async_op: bool) -> ShmcommWork:
        """``fn(*args)`` for each args of ``call.calls``, as one operation, then the copies back."""
        if len(call.calls) == 1 and not call.backs:
            return self._go(fn, call.calls[0], outputs, async_op)
        return self._go(_composite, (fn, call.calls, call.backs), outputs, async_op)

    # ---- reductions ----------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        """All-reduce each tensor of ``tensors`` in place (``dist.all_reduce``); every ReduceOp,
        PREMUL_SUM included (each rank's tensor times its factor, summed in one pass).

        Example::

            dist.all_reduce(t, op=dist.ReduceOp.AVG)
        """
        opts = opts if opts is not None else _c10d.AllreduceOptions()
        op = opts.reduceOp
        if len(tensors) == 1 and type(op) is _ReduceOpType and self._on_one_node:
            # the hot path: _reduction inlined, self._pg.run's call without its layer, and the
            # tensor checked once, by the core as it takes it
            code = _HASHED_CODES.get(hash(op))
            if code is not None and code != _PREMUL_SUM:
                try:
                    if getattr(opts, "asyncOp", True):  # _async(opts)
                        return _new_work(self._comm.all_reduce(tensors[0], code, True), tensors)
                    self._comm.all_reduce(tensors[0], code)
                    return _done(tensors)
                except (TypeError, ValueError) as exc:
                    # The core raises these only while it checks its arguments, before anything
                    # ran (its own errors, CollectiveMismatchError included, are ShmcommErrors):
                    # a tensor to copy first, or a bad one, which the general path names.
                    if isinstance(exc, ShmcommError):
                        raise
        code, factor = _reduction(op)
        return self._reduce_each(_scaled(self._comm.all_reduce, factor), tensors, (code,), _async(opts))

    def allreduce_coalesced(self, tensors, opts=None):
        """All-reduce several tensors as one operation (``dist.all_reduce_coalesced``).

        Example::

            dist.all_reduce_coalesced([w, b])
        """
        opts = opts if opts is not None else _c10d.AllreduceCoalescedOptions()
        code, factor = _reduction(opts.reduceOp)
        return self._reduce_each(_scaled(self._comm.all_reduce, factor), tensors, (code,), _async(opts))

    def reduce(self, tensors, opts=None):
        """Reduce into the tensor of rank ``opts.rootRank`` (``dist.reduce``).

        Example::

            dist.reduce(t, dst=0)
        """
        opts = opts if opts is not None else _c10d.ReduceOptions()
        code, factor = _reduction(opts.reduceOp)
        return self._reduce_each(_scaled(self._comm.reduce, factor), tensors, (opts.rootRank, code),
                                 _async(opts))

    def _reduce_each(self, fn, tensors, rest: tuple, async_op: bool) -> ShmcommWork:
        call = _Call()
        call.calls = [(call.output(t, True, f"tensors[{i}]"), *rest) for i, t in enumerate(tensors)]
        return self._go_all(fn, call, list(tensors), async_op)

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        """``output_tensors[0]`` on rank r = reduction of every rank's ``input_lists[0][r]``.

        Example::

            dist.reduce_scatter(out, [torch.ones(4) for _ in range(world)])
        """
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        code, factor = _reduction(opts.reduceOp)
        self._check_pairs(output_tensors, input_lists)
        call = _Call()
        call.calls = [(call.output(o, True, "output"),
                       [call.input(t, True, f"input_list[{q}]") for q, t in enumerate(ins)], code)
                      for o, ins in zip(output_tensors, input_lists)]
        return self._go_all(_scaled(self._comm.reduce_scatter, factor), call, list(output_tensors),
                            _async(opts))

    def reduce_scatter_single(self, output, input, opts=None):
        """Reduce-scatter of one input holding world_size blocks (``dist.reduce_scatter_tensor``).

        Example::

            dist.reduce_scatter_tensor(out, torch.ones(world * out.numel()))
        """
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """``reduce_scatter_single`` on each (output, input) pair, as one operation
        (``funcol.reduce_scatter_tensor_coalesced``, ``dist._coalescing_manager``).

        Example::

            with dist._coalescing_manager(): dist.reduce_scatter_tensor(out, inp)
        """
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        code, factor = _reduction(opts.reduceOp)
        self._check_pairs(outputs, inputs)
        call = _Call()
        call.calls = [(call.output(o, True, "output"), call.input(i, True, "input"), code)
                      for o, i in zip(outputs, inputs)]
        return self._go_all(_scaled(self._comm.reduce_scatter_into, factor), call, list(outputs),
                            _async(opts))

    # ---- data movement -------------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        """Copy the tensors of rank ``opts.rootRank`` into everyone's (``dist.broadcast``).

        Example::

            dist.broadcast(weights, src=0)
        """
        opts = opts if opts is not None else _c10d.BroadcastOptions()
        root = opts.rootRank
        call = _Call()
        stage = call.input if root == self._rank else call.output
        call.calls = [(stage(t, argname=f"tensors[{i}]"), root) for i, t in enumerate(tensors)]
        return self._go_all(self._comm.broadcast, call, list(tensors), _async(opts))

    def allgather(self, output_lists, input_tensors, opts=None):
        """``output_lists[0][q]`` receives rank q's ``input_tensors[0]`` (``dist.all_gather``).

        Ranks may pass tensors of different sizes (each output sized like its sender's input).

        Example::

            outs = [torch.empty(4) for _ in range(world)]; dist.all_gather(outs, t)
        """
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        self._check_pairs(input_tensors, output_lists)
        call = _Call()
        for inp, outs in zip(input_tensors, output_lists):
            outs = list(outs)
            if len(outs) != self._size:
                raise ValueError(f"all_gather needs world_size={self._size} output tensors, got {len(outs)}")
            # pieces of different sizes (each sized like its sender's input) run as one uneven
            # all_gather in the engine
            call.calls.append((self._comm.all_gather, [call.output(o, argname="output") for o in outs],
                               call.input(inp, argname="input")))
        return self._go_all(_call_each, call, _gathered(output_lists), _async(opts))

    def all_gather_single(self, output, input, opts=None):
        """Gather every rank's ``input`` into ``output``, rank-major (``dist.all_gather_into_tensor``).

        Example::

            out = torch.empty(world * t.numel()); dist.all_gather_into_tensor(out, t)
        """
        return self.all_gather_single_coalesced([output], [input], opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """``all_gather_single`` on each (output, input) pair, as one operation
        (``funcol.all_gather_into_tensor_coalesced``, ``dist._coalescing_manager``).

        Example::

            with dist._coalescing_manager(): dist.all_gather_into_tensor(out, t)
        """
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        self._check_pairs(outputs, inputs)
        call = _Call()
        call.calls = [(call.output(o, argname="output"), call.input(i, argname="input"))
                      for o, i in zip(outputs, inputs)]
        return self._go_all(self._comm.all_gather_into, call, list(outputs), _async(opts))

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """``output_lists[q][i]`` receives rank q's ``input_tensors[i]`` (``dist.all_gather_coalesced``).

        Example::

            dist.all_gather_coalesced([[torch.empty(2), torch.empty(3)] for _ in range(world)], [a, b])
        """
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        if len(output_lists) != self._size:
            raise ValueError(f"all_gather_coalesced needs world_size={self._size} output lists, "
                             f"got {len(output_lists)}")
        call = _Call()
        call.calls = [([call.output(output_lists[q][i], argname=f"output_tensor_lists[{q}][{i}]")
                        for q in range(self._size)],
                       call.input(inp, argname=f"input_tensor_list[{i}]"))
                      for i, inp in enumerate(input_tensors)]
        return self._go_all(self._comm.all_gather, call, _gathered(output_lists), _async(opts))

    def gather(self, output_lists, input_tensors, opts=None):
        """Rank ``opts.rootRank`` receives every rank's tensor in ``output_lists[0]`` (``dist.gather``).

        Example::

            dist.gather(t, [torch.empty(4) for _ in range(world)] if rank == 0 else None, dst=0)
        """
        opts = opts if opts is not None else _c10d.GatherOptions()
        root = opts.rootRank
        if len(input_tensors) != 1:
            raise ValueError(f"gather takes one input tensor, got {len(input_tensors)}")
        call = _Call()
        outs = None
        if self._rank == root:
            if len(output_lists) != 1 or len(output_lists[0]) != self._size:
                raise ValueError(f"gather on the destination needs one list of world_size={self._size} "
                                 f"tensors")
            outs = [call.output(o, argname=f"gather_list[{q}]") for q, o in enumerate(output_lists[0])]
        call.calls = [(call.input(input_tensors[0], argname="input"), outs, root)]
        return self._go_all(self._comm.gather, call, _gathered(output_lists), _async(opts))

    def scatter(self, output_tensors, input_lists, opts=None):
        """Rank q's ``output_tensors[0]`` receives ``input_lists[0][q]`` of rank ``opts.rootRank``.

        Example::

            dist.scatter(out, [torch.full((4,), q) for q in range(world)] if rank == 0 else None, src=0)
        """
        opts = opts if opts is not None else _c10d.ScatterOptions()
        root = opts.rootRank
        if len(output_tensors) != 1:
            raise ValueError(f"scatter takes one output tensor, got {len(output_tensors)}")
        call = _Call()
        ins = None
        if self._rank == root:
            if len(input_lists) != 1 or len(input_lists[0]) != self._size:
                raise ValueError(f"scatter on the source needs one list of world_size={self._size} tensors")
            ins = [call.input(t, argname=f"scatter_list[{q}]") for q, t in enumerate(input_lists[0])]
        call.calls = [(call.output(output_tensors[0], argname="output"), ins, root)]
        return self._go_all(self._comm.scatter, call, list(output_tensors), _async(opts))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """``output_tensors[q]`` on rank r receives ``input_tensors[r]`` of rank q (``dist.all_to_all``).

        Tensors may differ in size between pairs of ranks.

        Example::

            dist.all_to_all(outs, [torch.full((2,), rank) for _ in range(world)])
        """
        opts = opts if opts is not None else _c10d.AllToAllOptions()
        n = self._size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"all_to_all needs world_size={n} input and output tensors, got "
                             f"{len(input_tensors)} and {len(output_tensors)}")
        # Packed below by torch ops, which a subclass would intercept: unwrapped or refused first.
        outs = [_plain(t, f"output_tensor_list[{q}]") for q, t in enumerate(output_tensors)]
        ins = [_plain(t, f"input_tensor_list[{q}]") for q, t in enumerate(input_tensors)]
        dtypes = {t.dtype for t in (*outs, *ins)}
        if len(dtypes) != 1:
            raise ValueError(f"all_to_all tensors must share one dtype, got {sorted(map(str, dtypes))}")
        # One packed exchange of element counts keeps every rank on the same path even when only
        # some pairs of ranks exchange pieces of different sizes.
        inp = torch.cat([t.reshape(-1) for t in ins]) if n else torch.empty(0)
        out = torch.empty(sum(t.numel() for t in outs), dtype=inp.dtype)
        call = _Call()
        out_buf, in_buf = call.output(out, argname="output"), call.input(inp, argname="input")
        scale = 1 if out_buf.dtype == out.dtype else out.element_size()  # bytes for byte views
        call.calls = [(out_buf, in_buf, [t.numel() * scale for t in outs], [t.numel() * scale for t in ins])]
        pieces = torch.split(out, [t.numel() for t in outs])
        call.backs = [(t, piece.view(t.shape)) for t, piece in zip(outs, pieces)]
        return self._go_all(self._comm.all_to_all_single, call, list(output_tensors), _async(opts))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """All-to-all of single tensors split along dim 0 (``dist.all_to_all_single``); empty split
        lists mean equal parts.

        Example::

            dist.all_to_all_single(out, inp, [1, 3], [2, 2])
        """
        opts = opts if opts is not None else _c10d.AllToAllOptions()
        if output.dtype != input.dtype:
            raise ValueError(f"all_to_all_single: output dtype {output.dtype} differs from input "
                             f"dtype {input.dtype}")
        call = _Call()
        out_buf = call.output(output, argname="output")
        in_buf = call.input(input, argname="input")
        call.calls = [(out_buf, in_buf, self._splits(output, out_buf, output_split_sizes, "output_split_sizes"),
                       self._splits(input, in_buf, input_split_sizes, "input_split_sizes"))]
        return self._go_all(self._comm.all_to_all_single, call, [output], _async(opts))

    alltoall_base = all_to_all_single

    def _splits(self, t, buf, splits, argname):
        """Split sizes along dim 0 -> element counts of ``buf`` (None: equal parts)."""
        splits = list(splits) if splits is not None else []
        if t.dim() == 0:
            raise ValueError(f"{argname}: all_to_all_single needs tensors with at least one dimension")
        row = math.prod(t.shape[1:]) * (1 if buf.dtype == t.dtype else t.element_size())
        if not splits:
            if t.shape[0] % self._size:
                raise ValueError(f"all_to_all_single: dim 0 of size {t.shape[0]} does not split into "
                                 f"world_size={self._size} equal parts; pass {argname}")
            return [t.shape[0] // self._size * row] * self._size
        if len(splits) != self._size:
            raise ValueError(f"{argname} must have world_size={self._size} entries, got {len(splits)}")
        return [int(s) * row for s in splits]

    def barrier(self, opts=None):
        """Wait until every rank reached the barrier (``dist.barrier``).

        Example::

            dist.barrier()
        """
        return self._go(self._comm.barrier, (), [], _async(opts) if opts is not None else False)

    # ---- point to point --------------------------------------------------------------------------
    def send(self, tensors, dst: int, tag: int = 0):
        """Send ``tensors[0]`` to group rank ``dst`` (``dist.send``/``dist.isend``); the Work
        completes once the data is in shared memory.

        Example::

            dist.send(t, dst=1, tag=3)
        """
        if len(tensors) != 1:
            raise ValueError(f"send takes one tensor, got {len(tensors)}")
        return _new_work(self._pg.isend(_stage(tensors[0], False, "tensor")[0], dst, tag), tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        """Receive into ``tensors[0]`` from group rank ``src`` (``dist.recv``/``dist.irecv``).

        Example::

            dist.recv(t, src=0, tag=3)
        """
        return self._recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag: int = 0):
        """Receive into ``tensors[0]`` from any rank (``dist.recv(t)`` without ``src``).

        Example::

            sender = dist.recv(t)
        """
        return self._recv(tensors, None, tag)

    def _recv(self, tensors, src, tag):
        if len(tensors) != 1:
            raise ValueError(f"recv takes one tensor, got {len(tensors)}")
        t = tensors[0]
        buf, dense = _stage(t, False, "tensor")
        after = (lambda: t.copy_(dense)) if dense is not None else None
        return _new_work(self._pg.irecv(buf, src, tag), tensors, after)

    # ---- helpers and teardown ----------------------------------------------------------------
    @staticmethod
    def _check_pairs(singles, lists):
        if len(singles) != len(lists):
            raise ValueError(f"expected as many tensors as tensor lists, got {len(singles)} and {len(lists)}")

    def shutdown(self) -> None:
        """Release the group's shared memory (``dist.destroy_process_group`` calls it).

        Example::

            dist.destroy_process_group()
        """
        _op_groups.leave(self)
        self._pg.destroy()

    def abort(self) -> None:
        """Abort the group on every rank: pending and later operations raise ``AbortedError``.

        Example::

            dist.group.WORLD.abort()
        """
        self._pg.abort()

    # ---- what torch asks of a backend beyond the collectives -----------------------------------
    # torch keeps the group the creator returns as it is, with no c10d Backend registered on it,
    # so torch's own `_get_backend` raises for every device. Since 2.15 `batch_isend_irecv` asks
    # any ProcessGroup subclass for its backend (to read `supports_coalescing`), and FSDP2's
    # allocation hooks ask it too: for CPU this group is its own backend, which does not coalesce
    # point-to-point calls (each P2POp runs as its own isend/irecv) and does not split.
    supports_coalescing = False
    supports_splitting = False

    def _get_backend(self, device):
        """This group itself for CPU (torch's ``pg._get_backend(device)``); other devices raise.

        Example::

            assert dist.group.WORLD._get_backend(torch.device("cpu")) is dist.group.WORLD
        """
        if torch.device(device).type == "cpu":
            return self
        return super()._get_backend(device)

    def supports_tensor_alloc(self, device=None) -> bool:
        """True: :meth:`allocate_tensor` serves communication buffers from shared memory.

        Example::

            fsdp_model.set_allocate_memory_from_process_group_for_comm(True)
        """
        return self._pool is not None  # not across machines: no one segment holds every buffer

    def allocate_tensor(self, size, *, dtype, device=None) -> torch.Tensor:
        """A 1-D tensor of ``size`` elements in this group's shared memory, for FSDP2's all-gather
        and reduce-scatter buffers: when every rank's buffer sits at the same place, the
        collectives read peers' tensors in place (zero copy). Every rank must ask for the same
        sizes in the same order, as FSDP2 does; a buffer still in use is never handed out twice
        (a busy one gives a private tensor instead).

        Example::

            buf = pg.allocate_tensor(1 << 20, dtype=torch.bfloat16)
        """
        return self._pool.tensor(int(size), dtype)

    # the names older and newer torch give the same methods
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    recvAnysource = recv_anysource  # noqa: N815 - the name torch 2.15's trampoline forwards


# ---- native functional collectives ----------------------------------------------------------------
# torch's C++ ops reach a Python group only through the methods its trampoline forwards;
# `_c10d_functional.all_gather_into_tensor_out` (inductor's bucketed all-gathers use it) calls
# `_allgather_base`, which is not one of them: torch then looks for a C++ backend on the group
# and fails ("No backend type associated with device type cpu"). A CPU kernel of our own makes
# the same call from Python, where every group's own method is seen.
_kernels = None  # the torch.library.Library holding them: dropping it would unregister them


def _all_gather_into_tensor_out(input, group_size, group_name, *, out):
    """``torch.ops._c10d_functional.all_gather_into_tensor_out`` on CPU, for every group: what
    torch's C++ kernel does, with the group's method looked up in Python.

    Example::

        torch.ops._c10d_functional.all_gather_into_tensor_out(t, world, group.group_name, out=out)
    """
    group = _c10d._resolve_process_group(group_name)
    work = group._allgather_base(out, input, _c10d.AllgatherOptions())
    _c10d._register_work(out, work)  # what wait_tensor(out) waits for
    return out


def _register_kernels() -> None:
    """Install the CPU kernels above once, when the first shmcomm group is created (a process
    that never uses the backend keeps torch's own)."""
    global _kernels
    if _kernels is None:
        lib = torch.library.Library("_c10d_functional", "IMPL")
        lib.impl("all_gather_into_tensor_out", _all_gather_into_tensor_out, "CPU")
        _kernels = lib


def _create(options, backend_options=None) -> ShmcommProcessGroup:
    """The creator torch calls for each group (extended API: store, rank, size, timeout, name)."""
    _register_kernels()
    _op_kernels.register()
    return ShmcommProcessGroup(options.store, options.group_rank, options.group_size, options.timeout,
                               str(options.group_id), list(options.global_ranks_in_group))


# By hand, as the entry point does where entry points are off (TORCH_DEVICE_BACKEND_AUTOLOAD=0).
autoload()
