"""``torch.distributed`` backend "shmcomm": every CPU collective of torch over shared memory.

Installed with ``pip install shmcomm[torch]``, the backend is registered by the ``torch.backends``
entry point as soon as torch is imported, so an unchanged script only names it::

    import torch, torch.distributed as dist
    dist.init_process_group("shmcomm")        # under torchrun or shmrun
    t = torch.ones(4); dist.all_reduce(t)     # t == world_size on every rank
    dist.destroy_process_group()

``import shmcomm.torch`` registers it by hand (when entry points are disabled with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``). Each torch process group, ``new_group`` ones included, gets
its own shared segment: its ranks agree on a unique job name through the store torch hands the
backend, after checking that they all run on one machine.
"""

from __future__ import annotations


def _autoload() -> None:
    """Entry point run inside ``import torch``: registers the backend and never raises.

    Example (what torch does for each ``torch.backends`` entry point)::

        from shmcomm.torch import _autoload; _autoload()
    """
    # Defined before `import torch` below: when this module is imported first, that import runs
    # the entry point while the module is half built; it then registers itself at its end.
    register_now = globals().get("register")
    if register_now is None or not globals().get("_HAVE_DIST"):
        return
    try:
        register_now()
    except Exception as exc:  # noqa: BLE001 - must never break `import torch`
        import warnings

        warnings.warn(f"shmcomm: torch backend not registered: {exc}", RuntimeWarning, stacklevel=2)


import atexit  # noqa: E402 - _autoload must exist before `import torch` runs it
import datetime  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import uuid  # noqa: E402
import warnings  # noqa: E402
import weakref  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from shmcomm import _core  # noqa: E402
from shmcomm.errors import ShmcommError  # noqa: E402
from shmcomm.group import ProcessGroup as _ShmGroup  # noqa: E402
from shmcomm.ops import ReduceOp  # noqa: E402
from shmcomm.segments import sanitize_job  # noqa: E402
from shmcomm.trust import new_secret  # noqa: E402

__all__ = ["BACKEND_NAME", "ShmcommProcessGroup", "ShmcommWork", "register"]

BACKEND_NAME = "shmcomm"

# This module is imported from inside `import torch` (the entry point), where nothing may raise:
# on a torch built without distributed support it still imports, and registers nothing.
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

# Complex tensors may be lazy conjugate views: they take the checked path (`_stage`).
_FAST = _NATIVE - {getattr(torch, "complex64", None), getattr(torch, "complex128", None)}


def _reduce_codes() -> dict:
    """torch's RedOpType value -> shmcomm op code, matched by name (PREMUL_SUM has no match)."""
    if not _HAVE_DIST:
        return {}
    codes = {}
    for name, member in dist.ReduceOp.RedOpType.__members__.items():
        if name in ReduceOp.__members__:
            codes[int(member)] = int(ReduceOp[name])
    return codes


_REDUCE_CODES = _reduce_codes()


def _hash_codes() -> dict:
    """hash(ReduceOp object) -> shmcomm op code, when hashes tell the ops apart (they are the
    RedOpType values in torch 2.x); reading ``.op`` through pybind costs twice as much."""
    if not _HAVE_DIST:
        return {}
    opts, codes = _c10d.AllreduceOptions(), {}
    for name, member in dist.ReduceOp.RedOpType.__members__.items():
        if name == "PREMUL_SUM":
            continue
        opts.reduceOp = dist.ReduceOp(member)
        codes[hash(opts.reduceOp)] = _REDUCE_CODES.get(int(member))
    distinct = len(codes) == len(dist.ReduceOp.RedOpType.__members__) - 1
    return codes if distinct and None not in codes.values() else {}


def _op_code(reduce_op) -> int:
    """The shmcomm op code of the ``ReduceOp`` in a torch options object."""
    try:
        return _HASHED_CODES[hash(reduce_op)] if type(reduce_op) is _ReduceOpType else _slow_code(reduce_op)
    except KeyError:
        return _slow_code(reduce_op)


def _slow_code(reduce_op) -> int:
    kind = getattr(reduce_op, "op", reduce_op)
    code = _REDUCE_CODES.get(int(kind))
    if code is None:
        name = getattr(kind, "name", str(kind))
        raise ValueError(f"shmcomm does not support ReduceOp.{name} (PREMUL_SUM is NCCL only); use "
                         f"SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR or BXOR")
    return code


_ReduceOpType = dist.ReduceOp if _HAVE_DIST else None
try:
    _HASHED_CODES = _hash_codes()
except Exception:  # noqa: BLE001 - an optimisation only: fall back to reading `.op`
    _HASHED_CODES = {}


def _seconds(timeout) -> float | None:
    """Seconds of a torch timeout (timedelta or number); None for 'no timeout' (0 or negative)."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    timeout = float(timeout)
    return timeout if timeout > 0 else None


# ---- staging: contiguous native buffers for the core --------------------------------------------
def _stage(t: torch.Tensor, reducing: bool, argname: str):
    """Return ``(buffer, dense)``: ``buffer`` goes to the core; ``dense`` is the contiguous tensor
    to copy back into ``t`` after an output was written, or None when ``buffer`` is ``t``'s memory."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{argname} must be a torch.Tensor, got {type(t).__name__}")
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


class _Staging:
    """Buffers for one operation, and the copies back into non-contiguous outputs afterwards."""

    __slots__ = ("backs",)

    def __init__(self):
        self.backs = []

    def input(self, t, reducing=False, argname="tensor"):
        return _stage(t, reducing, argname)[0]

    def output(self, t, reducing=False, argname="tensor"):
        buf, dense = _stage(t, reducing, argname)
        if dense is not None:
            self.backs.append((t, dense))
        return buf

    def finish(self):
        for t, dense in self.backs:
            t.copy_(dense)


def _fast(t) -> bool:
    """True for a tensor the core takes as it is (the common case: no staging at all)."""
    return (type(t) is torch.Tensor and t.dtype in _FAST and t.is_contiguous() and t.is_cpu
            and not t.is_neg())


def _direct(t):
    """What the core gets for a ``_fast`` tensor: a numpy view of its memory (cheaper for the core
    to take than the tensor), or the tensor itself for bfloat16, which numpy lacks."""
    if t.dtype is torch.bfloat16:
        return t
    return t.detach().numpy() if t.requires_grad else t.numpy()


# ---- Work ---------------------------------------------------------------------------------------
class ShmcommWork(_WorkBase):
    """The ``torch.distributed.Work`` returned by every shmcomm collective and point-to-point call.

    ``wait()`` raises the operation's error (a ``shmcomm.ShmcommError`` such as
    ``PeerFailureError`` or ``CollectiveMismatchError``), and ``get_future()`` gives a
    ``torch.futures.Future`` completed with the output tensors or failed with that error::

        work = dist.all_reduce(t, async_op=True)
        work.wait()                                   # raises if the all_reduce failed
        fut = dist.all_reduce(t, async_op=True).get_future()
        total = fut.then(lambda f: f.value()[0].sum()).wait()
    """

    def __init__(self, work=None, outputs=(), after=None):
        super().__init__()
        self._work = work            # shmcomm.Work, or None when the operation already finished
        self._outputs = outputs
        self._after = after          # run once after success (copies back into outputs)
        self._lock = threading.Lock() if after is not None else None
        self._future = None

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
        """A ``torch.futures.Future`` completed with the outputs, or failed with the error.

        Example::

            fut = dist.all_reduce(t, async_op=True).get_future(); fut.wait()
        """
        if self._future is None:
            fut = torch.futures.Future()
            self._future = fut
            if self._work is None:
                self._finish()
                fut.set_result(self._outputs)
            else:
                self._work.get_future().add_done_callback(self._complete)
        return self._future

    def _complete(self, done) -> None:
        try:
            done.value()
            self._finish()
        except BaseException as exc:  # noqa: BLE001 - carried to the torch future
            self._future.set_exception(exc)
            return
        self._future.set_result(self._outputs)

    def __repr__(self) -> str:
        return f"<shmcomm.torch.ShmcommWork {'done' if self.is_completed() else 'pending'}>"


def _flat(outputs) -> list:
    flat = []
    for item in outputs:
        if isinstance(item, (list, tuple)):
            flat.extend(item)
        else:
            flat.append(item)
    return flat


# ---- rendezvous through torch's store -------------------------------------------------------------
def _host_identity() -> str:
    """Host name, boot id and the /dev/shm mount: ranks sharing all three see one another's
    segments (containers on one kernel with private /dev/shm mounts differ in the last)."""
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
    return f"{socket.gethostname()} (boot id {boot}, /dev/shm {shm})"


def _rendezvous(store, rank: int, size: int, group_name: str) -> tuple[str, str]:
    """Agree on a job name unique to this group (and to this incarnation of its name) and a
    secret for its segments (shmcomm.trust), and check that every rank runs on this machine;
    return the job name and the secret."""
    # Every rank of incarnation g adds before any rank can finish it (the segment needs all of
    # them), so the counter values of one incarnation form one block of `size`.
    generation = (store.add("shmcomm/joined", 1) - 1) // size
    key = f"shmcomm/{generation}"
    mine = _host_identity()
    store.set(f"{key}/host/{rank}", mine)
    if rank == 0:
        label = sanitize_job(group_name or "pg")[:12]
        store.set(f"{key}/secret", new_secret())
        store.set(f"{key}/job", f"torch-{label}-{uuid.uuid4().hex[:12]}")
    hosts = [mine if r == rank else store.get(f"{key}/host/{r}").decode() for r in range(size)]
    others = [(r, h) for r, h in enumerate(hosts) if h != hosts[0]]
    if others:
        listing = ", ".join(f"rank {r} on {h}" for r, h in others)
        raise ShmcommError(
            f"the shmcomm backend needs every rank of a process group on one machine, but group "
            f"{group_name!r} has rank 0 on {hosts[0]} and {listing}; use gloo across machines")
    return store.get(f"{key}/job").decode(), store.get(f"{key}/secret").decode()


# ---- the process group ------------------------------------------------------------------------------
_live: "weakref.WeakSet[ShmcommProcessGroup]" = weakref.WeakSet()


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
        job, secret = _rendezvous(store, rank, size, group_name)
        comm = _core.Communicator(job, "pg", rank, size, seconds, secret=secret)
        members = list(global_ranks) if global_ranks else list(range(size))
        self._pg = _ShmGroup(comm, members, f"{job}.pg")
        self._comm = comm
        _live.add(self)

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

    def __repr__(self) -> str:
        return (f"<shmcomm.torch.ShmcommProcessGroup {self._group_name!r} rank={self._rank} "
                f"size={self._size}>")

    # ---- running -------------------------------------------------------------------------------
    def _run(self, fn, args: tuple, outputs, async_op: bool) -> ShmcommWork:
        return ShmcommWork(self._pg._op(fn, args, outputs, async_op), outputs)

    def _run_staged(self, stage: _Staging, fn, args: tuple, outputs, async_op: bool) -> ShmcommWork:
        if stage.backs:
            def staged(*a):
                fn(*a)
                stage.finish()
            return self._run(staged, args, outputs, async_op)
        return self._run(fn, args, outputs, async_op)

    # ---- reductions ----------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        """All-reduce each tensor of ``tensors`` in place (``dist.all_reduce``).

        Example::

            dist.all_reduce(t, op=dist.ReduceOp.AVG)
        """
        opts = opts if opts is not None else _c10d.AllreduceOptions()
        code = _op_code(opts.reduceOp)
        if len(tensors) == 1 and _fast(tensors[0]):
            return ShmcommWork(self._pg._op(self._comm.all_reduce, (_direct(tensors[0]), code), tensors,
                                            opts.asyncOp), tensors)
        return self._all_reduce_many(tensors, code, opts.asyncOp)

    def allreduce_coalesced(self, tensors, opts=None):
        """All-reduce several tensors as one operation (``dist.all_reduce_coalesced``).

        Example::

            dist.all_reduce_coalesced([w, b])
        """
        opts = opts if opts is not None else _c10d.AllreduceCoalescedOptions()
        return self._all_reduce_many(tensors, _op_code(opts.reduceOp), opts.asyncOp)

    def _all_reduce_many(self, tensors, code, async_op):
        stage = _Staging()
        bufs = [stage.output(t, True, f"tensors[{i}]") for i, t in enumerate(tensors)]
        reduce_one = self._comm.all_reduce

        def run():
            for b in bufs:
                reduce_one(b, code)
        return self._run_staged(stage, run, (), list(tensors), async_op)

    def reduce(self, tensors, opts=None):
        """Reduce into the tensor of rank ``opts.rootRank`` (``dist.reduce``).

        Example::

            dist.reduce(t, dst=0)
        """
        opts = opts if opts is not None else _c10d.ReduceOptions()
        code, root = _op_code(opts.reduceOp), opts.rootRank
        stage = _Staging()
        bufs = [stage.output(t, True) for t in tensors]
        reduce_one = self._comm.reduce

        def run():
            for b in bufs:
                reduce_one(b, root, code)
        return self._run_staged(stage, run, (), list(tensors), opts.asyncOp)

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        """``output_tensors[0]`` on rank r = reduction of every rank's ``input_lists[0][r]``.

        Example::

            dist.reduce_scatter(out, [torch.ones(4) for _ in range(world)])
        """
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        code = _op_code(opts.reduceOp)
        stage = _Staging()
        pairs = [(stage.output(o, True, "output"), [stage.input(t, True, "input_list[i]") for t in ins])
                 for o, ins in zip(output_tensors, input_lists)]
        self._check_pairs(output_tensors, input_lists)
        scatter_one = self._comm.reduce_scatter

        def run():
            for out, ins in pairs:
                scatter_one(out, ins, code)
        return self._run_staged(stage, run, (), list(output_tensors), opts.asyncOp)

    def reduce_scatter_single(self, output, input, opts=None):
        """Reduce-scatter of one input holding world_size blocks (``dist.reduce_scatter_tensor``).

        Example::

            dist.reduce_scatter_tensor(out, torch.ones(world * out.numel()))
        """
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        code = _op_code(opts.reduceOp)
        if _fast(output) and _fast(input):
            return self._run(self._comm.reduce_scatter_into, (_direct(output), _direct(input), code),
                             [output], opts.asyncOp)
        stage = _Staging()
        args = (stage.output(output, True, "output"), stage.input(input, True, "input"), code)
        return self._run_staged(stage, self._comm.reduce_scatter_into, args, [output], opts.asyncOp)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """``reduce_scatter_single`` on each (output, input) pair, as one operation.

        Example::

            with dist._coalescing_manager(): dist.reduce_scatter_tensor(out, inp)
        """
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        code = _op_code(opts.reduceOp)
        stage = _Staging()
        pairs = [(stage.output(o, True, "output"), stage.input(i, True, "input"))
                 for o, i in zip(outputs, inputs)]
        one = self._comm.reduce_scatter_into

        def run():
            for o, i in pairs:
                one(o, i, code)
        return self._run_staged(stage, run, (), list(outputs), opts.asyncOp)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ---- data movement -------------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        """Copy the tensors of rank ``opts.rootRank`` into everyone's (``dist.broadcast``).

        Example::

            dist.broadcast(weights, src=0)
        """
        opts = opts if opts is not None else _c10d.BroadcastOptions()
        root = opts.rootRank
        if len(tensors) == 1 and _fast(tensors[0]):
            return self._run(self._comm.broadcast, (_direct(tensors[0]), root), tensors, opts.asyncOp)
        stage = _Staging()
        if root == self._rank:
            bufs = [stage.input(t) for t in tensors]
        else:
            bufs = [stage.output(t) for t in tensors]
        one = self._comm.broadcast

        def run():
            for b in bufs:
                one(b, root)
        return self._run_staged(stage, run, (), list(tensors), opts.asyncOp)

    def allgather(self, output_lists, input_tensors, opts=None):
        """``output_lists[0][q]`` receives rank q's ``input_tensors[0]`` (``dist.all_gather``).

        Ranks may pass tensors of different sizes (each output sized like its sender's input).

        Example::

            outs = [torch.empty(4) for _ in range(world)]; dist.all_gather(outs, t)
        """
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        self._check_pairs(input_tensors, output_lists)
        stage = _Staging()
        steps = []
        for inp, outs in zip(input_tensors, output_lists):
            outs = list(outs)
            if len(outs) != self._size:
                raise ValueError(f"all_gather needs world_size={self._size} output tensors, got {len(outs)}")
            even = all(o.numel() == inp.numel() and o.dtype == inp.dtype for o in outs)
            if even:
                steps.append((True, [stage.output(o, argname="output") for o in outs],
                              stage.input(inp, argname="input")))
            else:
                bufs = [stage.output(o, argname="output") for o in outs]
                bufs[self._rank] = stage.input(inp, argname="input")
                steps.append((False, bufs, None))
                if outs[self._rank].numel() != inp.numel():
                    raise ValueError(f"all_gather: output_tensor_list[{self._rank}] has "
                                     f"{outs[self._rank].numel()} elements but the input has {inp.numel()}")
                stage.backs.append((outs[self._rank], inp))
        gather, bcast = self._comm.all_gather, self._comm.broadcast

        def run():
            for even, outs, inp in steps:
                if even:
                    gather(outs, inp)
                else:  # uneven sizes: rank q's tensor reaches everyone by a broadcast from q
                    for q, buf in enumerate(outs):
                        bcast(buf, q)
        return self._run_staged(stage, run, (), list(output_lists), opts.asyncOp)

    def all_gather_single(self, output, input, opts=None):
        """Gather every rank's ``input`` into ``output``, rank-major (``dist.all_gather_into_tensor``).

        Example::

            out = torch.empty(world * t.numel()); dist.all_gather_into_tensor(out, t)
        """
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        if _fast(output) and _fast(input):
            return self._run(self._comm.all_gather_into, (_direct(output), _direct(input)), [output],
                             opts.asyncOp)
        stage = _Staging()
        args = (stage.output(output, argname="output"), stage.input(input, argname="input"))
        return self._run_staged(stage, self._comm.all_gather_into, args, [output], opts.asyncOp)

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """``output_lists[q][i]`` receives rank q's ``input_tensors[i]`` (``dist.all_gather_coalesced``).

        Example::

            dist.all_gather_coalesced([[torch.empty(2), torch.empty(3)] for _ in range(world)], [a, b])
        """
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        if len(output_lists) != self._size:
            raise ValueError(f"all_gather_coalesced needs world_size={self._size} output lists, "
                             f"got {len(output_lists)}")
        stage = _Staging()
        steps = []
        for i, inp in enumerate(input_tensors):
            outs = [stage.output(output_lists[q][i], argname=f"output_tensor_lists[{q}][{i}]")
                    for q in range(self._size)]
            steps.append((outs, stage.input(inp, argname=f"input_tensor_list[{i}]")))
        gather = self._comm.all_gather

        def run():
            for outs, inp in steps:
                gather(outs, inp)
        return self._run_staged(stage, run, (), list(output_lists), opts.asyncOp)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """``all_gather_single`` on each (output, input) pair, as one operation.

        Example::

            with dist._coalescing_manager(): dist.all_gather_into_tensor(out, t)
        """
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        stage = _Staging()
        pairs = [(stage.output(o, argname="output"), stage.input(i, argname="input"))
                 for o, i in zip(outputs, inputs)]
        one = self._comm.all_gather_into

        def run():
            for o, i in pairs:
                one(o, i)
        return self._run_staged(stage, run, (), list(outputs), opts.asyncOp)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists, input_tensors, opts=None):
        """Rank ``opts.rootRank`` receives every rank's tensor in ``output_lists[0]`` (``dist.gather``).

        Example::

            dist.gather(t, [torch.empty(4) for _ in range(world)] if rank == 0 else None, dst=0)
        """
        opts = opts if opts is not None else _c10d.GatherOptions()
        root = opts.rootRank
        if len(input_tensors) != 1:
            raise ValueError(f"gather takes one input tensor, got {len(input_tensors)}")
        stage = _Staging()
        inp = stage.input(input_tensors[0], argname="input")
        outs = None
        if self._rank == root:
            if len(output_lists) != 1 or len(output_lists[0]) != self._size:
                raise ValueError(f"gather on the destination needs one list of world_size={self._size} "
                                 f"tensors")
            outs = [stage.output(o, argname=f"gather_list[{q}]") for q, o in enumerate(output_lists[0])]
        return self._run_staged(stage, self._comm.gather, (inp, outs, root), list(output_lists),
                                opts.asyncOp)

    def scatter(self, output_tensors, input_lists, opts=None):
        """Rank q's ``output_tensors[0]`` receives ``input_lists[0][q]`` of rank ``opts.rootRank``.

        Example::

            dist.scatter(out, [torch.full((4,), q) for q in range(world)] if rank == 0 else None, src=0)
        """
        opts = opts if opts is not None else _c10d.ScatterOptions()
        root = opts.rootRank
        if len(output_tensors) != 1:
            raise ValueError(f"scatter takes one output tensor, got {len(output_tensors)}")
        stage = _Staging()
        out = stage.output(output_tensors[0], argname="output")
        ins = None
        if self._rank == root:
            if len(input_lists) != 1 or len(input_lists[0]) != self._size:
                raise ValueError(f"scatter on the source needs one list of world_size={self._size} tensors")
            ins = [stage.input(t, argname=f"scatter_list[{q}]") for q, t in enumerate(input_lists[0])]
        return self._run_staged(stage, self._comm.scatter, (out, ins, root), list(output_tensors),
                                opts.asyncOp)

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
        dtypes = {t.dtype for t in (*output_tensors, *input_tensors)}
        if len(dtypes) != 1:
            raise ValueError(f"all_to_all tensors must share one dtype, got {sorted(map(str, dtypes))}")
        # One packed exchange of split sizes keeps every rank on the same path even when only some
        # pairs of ranks exchange pieces of different sizes.
        inp = torch.cat([t.reshape(-1) for t in input_tensors]) if n else torch.empty(0)
        out = torch.empty(sum(t.numel() for t in output_tensors), dtype=inp.dtype)
        in_splits = [t.numel() for t in input_tensors]
        out_splits = [t.numel() for t in output_tensors]
        stage = _Staging()
        out_buf, in_buf = stage.output(out, argname="output"), stage.input(inp, argname="input")
        scale = 1 if out_buf.dtype == out.dtype else out.element_size()  # bytes for byte views
        in_splits = [s * scale for s in in_splits]
        out_splits = [s * scale for s in out_splits]
        exchange = self._comm.all_to_all_single

        def run():
            exchange(out_buf, in_buf, out_splits, in_splits)
            stage.finish()
            for t, piece in zip(output_tensors, torch.split(out, [t.numel() for t in output_tensors])):
                t.copy_(piece.view(t.shape))
        return self._run(run, (), list(output_tensors), opts.asyncOp)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """All-to-all of single tensors split along dim 0 (``dist.all_to_all_single``); empty split
        lists mean equal parts.

        Example::

            dist.all_to_all_single(out, inp, [1, 3], [2, 2])
        """
        opts = opts if opts is not None else _c10d.AllToAllOptions()
        stage = _Staging()
        out_buf = stage.output(output, argname="output")
        in_buf = stage.input(input, argname="input")
        if output.dtype != input.dtype:
            raise ValueError(f"all_to_all_single: output dtype {output.dtype} differs from input "
                             f"dtype {input.dtype}")
        out_splits = self._splits(output, out_buf, output_split_sizes, "output_split_sizes")
        in_splits = self._splits(input, in_buf, input_split_sizes, "input_split_sizes")
        return self._run_staged(stage, self._comm.all_to_all_single,
                                (out_buf, in_buf, out_splits, in_splits), [output], opts.asyncOp)

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
        async_op = opts.asyncOp if opts is not None and hasattr(opts, "asyncOp") else False
        return self._run(self._comm.barrier, (), [], async_op)

    # ---- point to point --------------------------------------------------------------------------
    def send(self, tensors, dst: int, tag: int = 0):
        """Send ``tensors[0]`` to group rank ``dst`` (``dist.send``/``dist.isend``); the Work
        completes once the data is in shared memory.

        Example::

            dist.send(t, dst=1, tag=3)
        """
        if len(tensors) != 1:
            raise ValueError(f"send takes one tensor, got {len(tensors)}")
        buf = tensors[0] if _fast(tensors[0]) else _stage(tensors[0], False, "tensor")[0]
        return ShmcommWork(self._pg.isend(buf, dst, tag), tensors)

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
        if _fast(t):
            return ShmcommWork(self._pg.irecv(t, src, tag), tensors)
        buf, dense = _stage(t, False, "tensor")
        after = (lambda: t.copy_(dense)) if dense is not None else None
        return ShmcommWork(self._pg.irecv(buf, src, tag), tensors, after)

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
        self._pg._destroy()
        _live.discard(self)

    def abort(self) -> None:
        """Abort the group on every rank: pending and later operations raise ``AbortedError``.

        Example::

            dist.group.WORLD.abort()
        """
        self._pg.abort()


def _create(options, backend_options=None) -> ShmcommProcessGroup:
    """The creator torch calls for each group (extended API: store, rank, size, timeout, name)."""
    return ShmcommProcessGroup(options.store, options.group_rank, options.group_size, options.timeout,
                               str(options.group_id), list(options.global_ranks_in_group))


def register() -> None:
    """Register "shmcomm" with ``torch.distributed`` (``import shmcomm.torch`` does it already).

    Example::

        import shmcomm.torch
        shmcomm.torch.register()                  # idempotent
        dist.init_process_group("shmcomm")
    """
    if not _HAVE_DIST:
        raise RuntimeError("this torch build has no torch.distributed")
    if BACKEND_NAME in dist.Backend.backend_list and BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])


@atexit.register
def _leave_at_exit() -> None:
    # Groups torch never destroyed: peers learn at once that this rank left.
    for group in list(_live):
        try:
            group.shutdown()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


if _HAVE_DIST:
    try:
        register()
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"shmcomm: torch backend not registered: {exc}", RuntimeWarning, stacklevel=2)
