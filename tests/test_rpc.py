"""shmcomm.rpc with real processes: calls, async_execution (torch's documented examples), RRefs and
their lifetime, errors, timeouts, large arrays, concurrency, shutdown and dead workers."""

import gc
import operator
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks
from shmcomm import rpc

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(body, size=3, *args, timeout=60.0, expect_dead=(), graceful=True):
    """Run ``body(rank, size, *args)`` on ``size`` processes that joined RPC as worker0..N-1."""
    job = f"test-rpc-{uuid.uuid4().hex[:10]}"

    def worker(rank, size, *args):
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=size, job=job, timeout=30.0,
                     rpc_timeout=30.0)
        try:
            return body(rank, size, *args)
        finally:
            rpc.shutdown(graceful=graceful)

    return run_ranks(worker, size, *args, init=False, timeout=timeout, job=job,
                     expect_dead=expect_dead)


# ---- functions called remotely (module level: pickled by reference) -----------------------------
def whoami():
    return rpc.get_worker_info().name


def echo(*args, **kwargs):
    return args, kwargs


def slow(seconds, value=None):
    time.sleep(seconds)
    return value


def boom(text):
    raise ValueError(f"boom: {text}")


class NeedsTwoArgs(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")
        self.a, self.b = a, b


def raise_custom():
    raise NeedsTwoArgs("x", "y")


class FixedText(Exception):
    def __str__(self):
        return "always this"


def raise_fixed_text():
    raise FixedText("lost")


def sc_error():
    raise sc.PeerFailureError("fake", 5, 123)


def exits():
    raise SystemExit(4)


def return_lock():
    return threading.Lock()   # not picklable: the caller gets the pickling error


def array_info(a):
    return type(a).__name__, str(a.dtype), tuple(a.shape), float(a.sum()), bool(a.flags.writeable)


def double(a):
    return a * 2


# torch's async_execution documentation, with shmcomm's rpc
@rpc.functions.async_execution
def async_add_chained(to, x, y, z):
    return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)


class AsyncExecutionClass:
    @staticmethod
    @rpc.functions.async_execution
    def static_async_add(to, x, y, z):
        return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)

    @classmethod
    @rpc.functions.async_execution
    def class_async_add(cls, to, x, y, z):
        ret_fut = torch.futures.Future()   # a torch Future works as well as a shmcomm one
        rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: ret_fut.set_result(fut.wait() + z))
        return ret_fut

    @rpc.functions.async_execution
    def bound_async_add(self, to, x, y, z):
        return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)


@rpc.functions.async_execution
def async_fails():
    fut = sc.Future()
    fut.set_exception(KeyError("missing"))
    return fut


@rpc.functions.async_execution
def not_a_future():
    return 42


# ---- basics ---------------------------------------------------------------------------------------
def _basics(rank, size):
    me = rpc.get_worker_info()
    assert me == rpc.WorkerInfo(f"worker{rank}", rank) and me.id == rank
    peer = (rank + 1) % size
    info = rpc.get_worker_info(f"worker{peer}")
    # every form of `to`, and calling yourself
    assert rpc.rpc_sync(f"worker{peer}", whoami) == f"worker{peer}"
    assert rpc.rpc_sync(peer, whoami) == f"worker{peer}"
    assert rpc.rpc_sync(info, whoami) == f"worker{peer}"
    assert rpc.rpc_sync(rank, whoami) == f"worker{rank}"
    assert rpc.rpc_sync(peer, echo, args=(1, "a"), kwargs={"k": [1, 2]}) == ((1, "a"), {"k": [1, 2]})
    assert rpc.rpc_sync(peer, operator.add, args=[2, 3]) == 5
    fut = rpc.rpc_async(peer, operator.mul, args=(6, 7))
    assert isinstance(fut, sc.Future)
    assert fut.then(lambda f: f.value() + 1).wait() == 43
    assert rpc.rpc_async(rank, operator.mul, args=(2, 3)).wait() == 6      # async to self
    # arguments are copied, even to yourself
    a = np.zeros(3)
    b = rpc.rpc_sync(rank, np.add, args=(a, 1))
    assert a.sum() == 0 and b.sum() == 3
    with pytest.raises(ValueError, match="unknown worker"):
        rpc.rpc_sync("nobody", whoami)
    with pytest.raises(ValueError):
        rpc.rpc_sync(size, whoami)
    with pytest.raises(TypeError):
        rpc.rpc_sync(peer, 42)
    with pytest.raises(ValueError, match="unknown worker"):
        rpc.get_worker_info("nobody")
    return True


@pytest.mark.timeout(60)
def test_calls_by_name_rank_and_workerinfo_including_self():
    assert all(_run(_basics))


# ---- async_execution: torch's documented examples ----------------------------------------------
def _async_examples(rank, size):
    if rank != 0:
        return None
    ret = rpc.rpc_sync("worker1", async_add_chained, args=("worker2", torch.ones(2), 1, 1))
    assert torch.equal(ret, torch.tensor([3.0, 3.0]))
    ret = rpc.rpc_sync("worker1", AsyncExecutionClass.static_async_add,
                       args=("worker2", torch.ones(2), 1, 2))
    assert torch.equal(ret, torch.tensor([4.0, 4.0]))
    ret = rpc.rpc_sync("worker1", AsyncExecutionClass.class_async_add,
                       args=("worker2", torch.ones(2), 1, 2))
    assert torch.equal(ret, torch.tensor([4.0, 4.0]))
    ret = rpc.rpc_sync("worker1", AsyncExecutionClass().bound_async_add,
                       args=("worker2", torch.ones(2), 1, 2))
    assert torch.equal(ret, torch.tensor([4.0, 4.0]))
    ret = rpc.rpc_async("worker1", async_add_chained, args=("worker2", torch.ones(2), 1, 1)).wait()
    assert torch.equal(ret, torch.tensor([3.0, 3.0]))
    # the RRef helpers
    rref = rpc.remote("worker1", AsyncExecutionClass)
    ret = rref.rpc_sync().static_async_add("worker2", torch.ones(2), 1, 2)
    assert torch.equal(ret, torch.tensor([4.0, 4.0]))
    rref = rpc.remote("worker1", AsyncExecutionClass)
    ret = rref.rpc_async().static_async_add("worker2", torch.ones(2), 1, 2).wait()
    assert torch.equal(ret, torch.tensor([4.0, 4.0]))
    rref = rpc.remote("worker1", AsyncExecutionClass)
    ret = rref.remote().static_async_add("worker2", torch.ones(2), 1, 2).to_here()
    assert torch.equal(ret, torch.tensor([4.0, 4.0]))
    for proxy in (rref.rpc_sync(), rref.rpc_async(), rref.remote()):
        out = proxy.class_async_add("worker2", torch.ones(2), 1, 2)
        out = out.wait() if isinstance(out, sc.Future) else out
        out = out.to_here() if isinstance(out, rpc.RRef) else out
        assert torch.equal(out, torch.tensor([4.0, 4.0]))
    assert torch.equal(rref.rpc_sync().bound_async_add("worker2", torch.ones(2), 1, 2),
                       torch.tensor([4.0, 4.0]))
    # errors through the returned Future, and a function that breaks the contract
    with pytest.raises(KeyError, match="missing"):
        rpc.rpc_sync("worker1", async_fails)
    with pytest.raises(TypeError, match="not a Future"):
        rpc.rpc_sync("worker1", not_a_future)
    return True


@pytest.mark.timeout(60)
def test_async_execution_documented_examples():
    assert _run(_async_examples)[0]


@pytest.mark.timeout(30)
def test_async_execution_marks_functions_and_methods():
    assert rpc.functions.is_async_execution(async_add_chained)
    assert rpc.functions.is_async_execution(AsyncExecutionClass.static_async_add)
    assert rpc.functions.is_async_execution(AsyncExecutionClass.class_async_add)
    assert rpc.functions.is_async_execution(AsyncExecutionClass().bound_async_add)
    assert not rpc.functions.is_async_execution(whoami)
    with pytest.raises(TypeError):
        rpc.functions.async_execution(42)


# ---- serialization (in process) ------------------------------------------------------------------
def _roundtrip_values():
    return [np.arange(12.0).reshape(3, 4), np.float32(2.5), np.array(3), np.zeros((0, 5)),
            np.array([True, False]), np.array([1 + 2j]), np.arange(10)[::2], np.array(["a", "bc"]),
            np.array([{"x": 1}], dtype=object), torch.arange(6).reshape(2, 3), torch.tensor(1.5),
            torch.zeros(0), torch.ones(3, dtype=torch.bfloat16), torch.ones(2, requires_grad=True),
            torch.arange(10.0)[::3], torch.nn.Parameter(torch.ones(2)), 7, "text", None, (1, [2])]


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.detach(), b.detach()) and a.requires_grad == b.requires_grad)
    if isinstance(a, np.ndarray):
        return type(b) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape and \
            (a.dtype == object or np.array_equal(a, b))
    return a == b and type(a) is type(b)


@pytest.mark.timeout(30)
def test_values_and_calls_survive_serialization():
    from shmcomm.rpc.frames import _copies
    from shmcomm.rpc.serialization import dumps_call, dumps_value, loads_call, loads_value

    for v in _roundtrip_values():
        data, bufs, flags = dumps_value(v, 0)
        back = loads_value(data, _copies(bufs), flags)
        assert _same(v, back), (v, back)
        if isinstance(back, np.ndarray) and back.size and back.dtype != object:
            assert back.flags.writeable
        data, bufs, flags = dumps_call(echo, (1, v, "s"), None, 0)
        func, args, kwargs = loads_call(data, _copies(bufs), flags)
        assert func is echo and kwargs is None and _same(v, args[1]) and args[0] == 1
    data, bufs, flags = dumps_call(echo, (np.ones(2),), {"k": torch.ones(1)}, 0)   # general form
    func, args, kwargs = loads_call(data, _copies(bufs), flags)
    assert func is echo and flags == 0 and np.array_equal(args[0], np.ones(2))
    assert torch.equal(kwargs["k"], torch.ones(1))


# ---- errors -------------------------------------------------------------------------------------
def _errors(rank, size):
    if rank != 0:
        return None
    with pytest.raises(ValueError) as info:
        rpc.rpc_sync("worker1", boom, args=("sync",))
    text = str(info.value)
    assert "boom: sync" in text and "worker1" in text and "Traceback" in text and "in boom" in text
    fut = rpc.rpc_async("worker2", boom, args=("async",))
    with pytest.raises(ValueError, match="boom: async"):
        fut.wait()
    with pytest.raises(NeedsTwoArgs) as info:       # __init__ with other arguments: still rebuilt
        rpc.rpc_sync("worker1", raise_custom)
    assert "x/y" in str(info.value) and "in raise_custom" in str(info.value) and info.value.b == "y"
    with pytest.raises(sc.PeerFailureError) as info:  # attributes travel too
        rpc.rpc_sync("worker1", sc_error)
    assert info.value.rank == 5 and info.value.pid == 123 and "in sc_error" in str(info.value)
    with pytest.raises(rpc.RemoteError) as info:       # its own __str__ hides the message
        rpc.rpc_sync("worker1", raise_fixed_text)
    assert "FixedText" in info.value.exc_type and "in raise_fixed_text" in info.value.remote_traceback
    assert isinstance(info.value.original, FixedText) and "always this" in str(info.value)
    with pytest.raises(TypeError, match="(?i)pickle.*lock"):
        rpc.rpc_sync("worker1", return_lock)
    with pytest.raises(TypeError, match="(?i)pickle.*lock"):
        rpc.rpc_sync("worker1", echo, args=(threading.Lock(),))
    # a callee's SystemExit must not end the caller, nor leave a Future pending forever
    with pytest.raises(Exception, match="SystemExit") as info:
        rpc.rpc_sync("worker1", exits)
    assert not isinstance(info.value, SystemExit)
    with pytest.raises(sc.ShmcommError, match="raised SystemExit: 4"):
        rpc.rpc_async("worker2", exits).wait(timeout=20)
    with pytest.raises(sc.ShmcommError, match="raised SystemExit: 4"):
        rpc.remote("worker2", exits).to_here(timeout=20)
    # the workers still serve after all that
    assert rpc.rpc_sync("worker1", operator.add, args=(1, 1)) == 2
    rref = rpc.remote("worker2", boom, args=("remote",))
    with pytest.raises(ValueError, match="boom: remote"):
        rref.to_here()
    return True


@pytest.mark.timeout(60)
def test_remote_exceptions_keep_type_and_traceback():
    assert _run(_errors)[0]


# ---- timeouts and blocking functions --------------------------------------------------------------
def _timeouts(rank, size):
    if rank != 0:
        return None
    t0 = time.monotonic()
    with pytest.raises(sc.CommTimeoutError):
        rpc.rpc_sync("worker1", slow, args=(1.5,), timeout=0.2)
    assert time.monotonic() - t0 < 1.0
    fut = rpc.rpc_async("worker1", slow, args=(1.5,), timeout=0.2)
    with pytest.raises(TimeoutError):
        fut.wait()
    # a slow function does not stall the others on the same worker
    blocker = rpc.rpc_async("worker2", slow, args=(1.0, "slow"))
    time.sleep(0.05)
    t0 = time.monotonic()
    assert rpc.rpc_sync("worker2", operator.add, args=(1, 2)) == 3
    assert time.monotonic() - t0 < 0.5
    assert blocker.wait() == "slow"
    assert rpc.rpc_sync("worker1", slow, args=(0.1, "ok"), timeout=0) == "ok"   # 0: no timeout
    return True


@pytest.mark.timeout(60)
def test_timeouts_and_a_blocking_function_does_not_stall_others():
    assert _run(_timeouts)[0]


# ---- large arrays ---------------------------------------------------------------------------------
def _large(rank, size):
    if rank != 0:
        return None
    n = 1 << 20                                        # 8 MiB of float64
    a = np.arange(n, dtype=np.float64)
    t = torch.arange(n, dtype=torch.float64)
    info = rpc.rpc_sync("worker1", array_info, args=(a,))
    assert info == ("ndarray", "float64", (n,), float(a.sum()), True)
    back = rpc.rpc_sync("worker2", double, args=(a,))
    assert back.flags.writeable and np.array_equal(back, a * 2)
    back = rpc.rpc_sync("worker1", double, args=(t,))
    assert torch.equal(back, t * 2)
    back[0] = 7.0                                       # received tensors are writable
    bf = torch.ones(n, dtype=torch.bfloat16)
    assert torch.equal(rpc.rpc_sync("worker2", double, args=(bf,)), bf * 2)
    two_d = np.arange(12.0).reshape(3, 4)
    assert np.array_equal(rpc.rpc_sync("worker1", double, args=(two_d.T,)), two_d.T * 2)   # strided
    futs = [rpc.rpc_async(w, double, args=(a,)) for w in ("worker1", "worker2", "worker1")]
    assert all(np.array_equal(x, a * 2) for x in sc.wait_all(futs))
    assert np.array_equal(rpc.rpc_sync("worker0", double, args=(a,)), a * 2)   # to yourself
    return True


@pytest.mark.timeout(90)
def test_large_numpy_and_torch_arguments_and_returns():
    assert _run(_large, timeout=90)[0]


# ---- many concurrent calls ------------------------------------------------------------------------
def _many(rank, size):
    futs = [rpc.rpc_async((rank + 1 + i % (size - 1)) % size, operator.add, args=(rank, i))
            for i in range(300)]
    assert sc.wait_all(futs) == [rank + i for i in range(300)]
    # several threads calling rpc_sync at once, mixed with async calls
    errors = []

    def caller(k):
        try:
            for i in range(40):
                dst = (rank + k + i) % size
                assert rpc.rpc_sync(dst, operator.mul, args=(k, i)) == k * i
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    more = [rpc.rpc_async((rank + 1) % size, echo, args=(i,)) for i in range(100)]
    for th in threads:
        th.join()
    assert not errors, errors
    assert [f.wait()[0][0] for f in more] == list(range(100))
    return True


@pytest.mark.timeout(90)
def test_hundreds_of_concurrent_calls_between_all_workers():
    assert all(_run(_many, timeout=90))


# ---- shutdown -------------------------------------------------------------------------------------
def _shutdown_waits(rank, size):
    if rank == 1:
        time.sleep(0.3)   # the others are already in shutdown; worker2 must still serve this
        assert rpc.rpc_sync("worker2", slow, args=(0.3, "late")) == "late"
    return rank


@pytest.mark.timeout(60)
def test_graceful_shutdown_waits_for_everyones_outstanding_work():
    assert _run(_shutdown_waits) == [0, 1, 2]


def _reinit(rank, size, job):
    for round_ in range(2):
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=size, job=f"{job}-{round_}", timeout=30.0)
        with pytest.raises(sc.InvalidStateError):
            rpc.init_rpc(f"w{rank}", rank=rank, world_size=size, job=job)
        assert rpc.rpc_sync((rank + 1) % size, whoami) == f"w{(rank + 1) % size}"
        rpc.shutdown()
    with pytest.raises(sc.InvalidStateError):
        rpc.rpc_sync(0, whoami)
    with pytest.raises(sc.InvalidStateError):
        rpc.shutdown()
    return True


@pytest.mark.timeout(60)
def test_init_shutdown_twice_and_use_after_shutdown():
    job = f"test-rpc-{uuid.uuid4().hex[:10]}"
    assert all(run_ranks(_reinit, 2, job, init=False, job=job, timeout=60))
    from shmcomm import segments

    for round_ in range(2):
        assert not segments.list_segments(job=f"{job}-{round_}")


def _from_env(rank, size, job):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), SHMCOMM_JOB=job)
    rpc.init_rpc(f"env{rank}")
    try:
        return rpc.rpc_sync(1 - rank, whoami)
    finally:
        rpc.shutdown()


@pytest.mark.timeout(60)
def test_init_from_environment():
    job = f"test-rpc-{uuid.uuid4().hex[:10]}"
    assert run_ranks(_from_env, 2, job, init=False, job=job) == ["env1", "env0"]


@pytest.mark.timeout(30)
def test_init_without_environment_names_the_variable(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="RANK"):
        rpc.init_rpc("x")
    with pytest.raises(ValueError, match="name"):
        rpc.init_rpc("", rank=0, world_size=1, job="x")


def _duplicate_names(rank, size, job):
    with pytest.raises(ValueError, match="unique"):
        rpc.init_rpc("same", rank=rank, world_size=size, job=job, timeout=30.0)
    return True


@pytest.mark.timeout(60)
def test_duplicate_worker_names_are_refused():
    job = f"test-rpc-{uuid.uuid4().hex[:10]}"
    assert all(run_ranks(_duplicate_names, 2, job, init=False, job=job))


def _alone(rank, size):
    assert rpc.rpc_sync("worker0", operator.add, args=(1, 2)) == 3
    assert rpc.rpc_async(0, whoami).wait() == "worker0"
    rref = rpc.remote(0, Tracked, args=(4,))
    assert rref.is_owner() and rref.rpc_sync().add(1) == 5 and rref.to_here().value == 5
    with pytest.raises(KeyError):
        rpc.rpc_sync(0, async_fails)
    with pytest.raises(TypeError, match="timeout"):
        rpc.rpc_sync(0, whoami, timeout="soon")
    t0 = time.monotonic()
    with pytest.raises(sc.CommTimeoutError):
        rpc.rpc_sync(0, slow, args=(1.0,), timeout=0.1)
    assert time.monotonic() - t0 < 0.8
    return True


@pytest.mark.timeout(60)
def test_a_single_worker_calls_itself():
    assert _run(_alone, 1) == [True]


# ---- a worker dies in the middle of a call --------------------------------------------------------
def die_soon(seconds):
    threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    time.sleep(60)


def _killed(rank, size):
    if rank == 2:
        time.sleep(30)   # killed long before this ends
        return None
    if rank == 0:
        t0 = time.monotonic()
        pending = [rpc.rpc_async("worker2", slow, args=(30,)) for _ in range(3)]
        with pytest.raises(sc.PeerFailureError) as info:
            rpc.rpc_sync("worker2", die_soon, args=(0.3,), timeout=0)
        assert info.value.rank == 2
        for fut in pending:
            with pytest.raises(sc.PeerFailureError):
                fut.wait()
        assert time.monotonic() - t0 < 5.0
        with pytest.raises(sc.PeerFailureError):
            rpc.rpc_sync("worker2", whoami)
    assert rpc.rpc_sync((rank + 1) % 2, whoami) == f"worker{(rank + 1) % 2}"  # the others go on
    return True


@pytest.mark.timeout(60)
def test_worker_killed_mid_call_fails_pending_calls():
    results = _run(_killed, expect_dead=(2,))
    assert results[:2] == [True, True]


# ---- RRefs ----------------------------------------------------------------------------------------
_live: "weakref.WeakSet" = weakref.WeakSet()


class Tracked:
    """Counts its live instances on the worker that owns them."""

    def __init__(self, value=0):
        self.value = value
        _live.add(self)

    def add(self, k):
        self.value += k
        return self.value

    def get(self):
        return self.value


def live_count():
    gc.collect()
    return len(_live)


def hold(rref):
    """Keep an RRef (a user reference) on this worker until ``drop``."""
    _held.append(rref)
    return rref.to_here().value


def drop():
    _held.clear()
    gc.collect()


_held: list = []


def read_rref(rref):
    return rref.is_owner(), rref.owner_name(), rref.to_here().value


def make_local_rref(value):
    return rpc.RRef(Tracked(value))


def _wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _rrefs(rank, size):
    if rank != 0:
        return None
    rref = rpc.remote("worker1", Tracked, args=(10,))
    assert not rref.is_owner() and rref.owner() == rpc.get_worker_info("worker1")
    assert rref.owner_name() == "worker1"
    assert rref.to_here().value == 10
    assert rref.rpc_sync().add(5) == 15
    assert rref.rpc_async().add(1).wait() == 16
    assert rref.remote().get().to_here() == 16
    with pytest.raises(RuntimeError, match="owned by"):
        rref.local_value()
    assert rpc.rpc_sync("worker1", live_count) == 1
    # travels: to a third worker, and back to its owner (which sees its own object)
    assert rpc.rpc_sync("worker2", read_rref, args=(rref,)) == (False, "worker1", 16)
    assert rpc.rpc_sync("worker1", read_rref, args=(rref,)) == (True, "worker1", 16)
    # an RRef owned here
    mine = rpc.RRef(Tracked(3))
    assert mine.is_owner() and mine.local_value().value == 3 and mine.to_here().value == 3
    assert rpc.rpc_sync("worker2", read_rref, args=(mine,)) == (False, "worker0", 3)
    # one returned by a remote function: worker2 owns it, we hold it
    theirs = rpc.rpc_sync("worker2", make_local_rref, args=(7,))
    assert theirs.owner_name() == "worker2" and theirs.to_here().value == 7
    assert rpc.rpc_sync("worker2", live_count) == 1

    # lifetime: the owner frees the value after the last user dropped it
    rpc.rpc_sync("worker2", hold, args=(rref,))           # worker2 holds a second reference
    del rref
    gc.collect()
    time.sleep(0.2)
    assert rpc.rpc_sync("worker1", live_count) == 1       # still held by worker2
    rpc.rpc_sync("worker2", drop)
    assert _wait_for(lambda: rpc.rpc_sync("worker1", live_count) == 0)
    del theirs
    gc.collect()
    assert _wait_for(lambda: rpc.rpc_sync("worker2", live_count) == 0)
    # many short-lived RRefs
    for i in range(50):
        r = rpc.remote("worker1", Tracked, args=(i,))
        assert r.rpc_sync().get() == i
    del r
    gc.collect()
    assert _wait_for(lambda: rpc.rpc_sync("worker1", live_count) == 0)
    return True


@pytest.mark.timeout(60)
def test_rref_api_proxies_and_lifetime():
    assert _run(_rrefs)[0]


# ---- lambdas and local functions (by value, through the process pickler) ------------------------
def apply(fn, *args):
    return fn(*args)


def make_adder(n):
    return lambda x: x + n   # made on the callee: the reply carries it by value


def hold_with(rref, fn):
    _held.append(rref)
    return fn(rref.to_here().value)


_pickler_counts = {"dumps": 0, "loads": 0}


def counting_dumps(obj, protocol=None):
    import cloudpickle

    _pickler_counts["dumps"] += 1
    return cloudpickle.dumps(obj, protocol)


def counting_loads(data):
    import pickle

    _pickler_counts["loads"] += 1
    return pickle.loads(data)


def pickler_counts():
    return dict(_pickler_counts)


def _by_value(rank, size):
    if rank != 0:
        return None
    k = 10

    def local(x):
        return x * k

    assert rpc.rpc_sync("worker1", lambda a, b: a + b, args=(2, 3)) == 5
    assert rpc.rpc_sync(1, local, args=(4,)) == 40
    assert rpc.rpc_async("worker2", apply, args=(lambda: rpc.get_worker_info().name,)).wait() \
        == "worker2"
    assert rpc.remote("worker1", lambda: [k]).to_here() == [10]
    assert rpc.rpc_sync("worker0", local, args=(1,)) == 10          # to itself too
    assert rpc.rpc_sync("worker1", make_adder, args=(5,))(1) == 6
    # arrays passed with a lambda still travel out of band, and arrive intact
    a = np.arange(1 << 16, dtype=np.float64)
    assert rpc.rpc_sync("worker2", lambda x: float(x.sum()), args=(a,)) == float(a.sum())
    assert np.array_equal(rpc.rpc_sync("worker1", lambda: np.arange(5) * k), np.arange(5) * k)

    # an RRef pickled again by value with a lambda is still counted once: freed when dropped
    rref = rpc.remote("worker1", Tracked, args=(1,))
    assert rpc.rpc_sync("worker2", hold_with, args=(rref, lambda v: v + 1)) == 2
    del rref
    gc.collect()
    rpc.rpc_sync("worker2", drop)
    assert _wait_for(lambda: rpc.rpc_sync("worker1", live_count) == 0)

    # a pickler set on every worker serves what plain pickle refuses, both ways; the fast paths
    # (functions by name, plain arguments) do not need it
    for q in range(size):
        rpc.rpc_sync(q, sc.set_pickler, args=(counting_dumps, counting_loads))
    assert rpc.rpc_sync("worker1", operator.add, args=(1, 2)) == 3
    assert pickler_counts() == {"dumps": 0, "loads": 0}
    assert rpc.rpc_sync("worker1", make_adder, args=(1,))(1) == 2
    assert rpc.rpc_sync("worker1", lambda: k) == 10
    assert pickler_counts() == {"dumps": 1, "loads": 1}   # the lambda sent, the adder read
    assert rpc.rpc_sync("worker1", pickler_counts) == {"dumps": 1, "loads": 1}
    for q in range(size):
        rpc.rpc_sync(q, sc.set_pickler)                               # the default again
    assert rpc.rpc_sync("worker1", lambda: k + 1) == 11
    assert rpc.rpc_sync("worker1", pickler_counts) == {"dumps": 1, "loads": 1}
    return True


@pytest.mark.timeout(60)
def test_lambdas_and_local_functions_travel_by_value():
    assert _run(_by_value)[0]


# ---- a script under its own interpreter (functions pickled by reference to __main__) -------------
@pytest.mark.timeout(90)
def test_script_workers_started_from_the_environment():
    job = f"test-rpc-{uuid.uuid4().hex[:10]}"
    script = os.path.join(HERE, "rpc_scripts", "chain.py")
    procs = []
    for rank in range(3):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="3", SHMCOMM_JOB=job,
                   PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(HERE),
                                                            os.environ.get("PYTHONPATH")])))
        procs.append(subprocess.Popen([sys.executable, script], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=80)
        outs.append(out)
        assert p.returncode == 0, out
    assert "chained: [3.0, 3.0]" in outs[0], outs[0]


# (docstrings: tests/test_docs.py)


# ---- rpc_async never blocks its caller --------------------------------------------------------
def _callee_stops_reading(rank, size):
    """Worker 1 stops (SIGSTOP) and worker 0 calls it with an argument larger than the ring.
    rpc_async used to write the frame on the caller's thread and block it for the group's
    timeout (30 s here, with the call's timeout 2 s), holding every other send to worker 1."""
    if rank == 1:
        return True
    pid = rpc.rpc_sync("worker1", os.getpid)
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        big = rpc.rpc_async("worker1", array_info, args=(np.ones(1 << 20),), timeout=2)  # 8 MiB
        small = rpc.rpc_async("worker1", whoami, timeout=2)  # queued behind it
        issued = time.monotonic() - start
        errors = []
        for fut in (big, small):
            try:
                fut.wait()
            except sc.CommTimeoutError as exc:
                errors.append(type(exc).__name__)
        failed = time.monotonic() - start
    finally:
        os.kill(pid, signal.SIGCONT)
    assert issued < 0.5, f"rpc_async blocked its caller for {issued:.1f} s"
    assert errors == ["CommTimeoutError"] * 2, errors
    assert 1.5 < failed < 8, f"the Futures failed after {failed:.1f} s (call timeout 2 s)"
    assert rpc.rpc_sync("worker1", whoami, timeout=30) == "worker1"  # the channel still works
    return True


@pytest.mark.timeout(90)
def test_rpc_async_returns_at_once_when_the_callee_stops_reading():
    assert all(_run(_callee_stops_reading, 2))


# ---- a sender stopped in the middle of a frame holds nobody ---------------------------------------
_pending: list = []      # Futures a worker started on another worker's behalf
_gate = threading.Event()
BIG = 8 << 20            # float64 elements: a 64 MiB frame, many times the ring


def start_call(to, func, *args):
    """Start ``func(*args)`` on ``to`` from this worker; ``pending_result`` waits for it."""
    _pending.append(rpc.rpc_async(to, func, args=args, timeout=0))
    return True


def pending_result():
    """The value of the call ``start_call`` started, or its error's type name."""
    try:
        return _pending.pop().wait()
    except sc.ShmcommError as exc:
        return type(exc).__name__


def gated_big():
    _gate.wait(30)
    return np.ones(BIG)


def open_gate():
    _gate.set()


def timed_calls(to, count):
    """``count`` rpc_sync calls to ``to`` (5 s timeout each): the error type names and seconds."""
    start, outcomes = time.monotonic(), []
    for _ in range(count):
        try:
            outcomes.append(rpc.rpc_sync(to, whoami, timeout=5))
        except sc.ShmcommError as exc:
            outcomes.append(type(exc).__name__)
    return outcomes, time.monotonic() - start


def _request_sender_stops(rank, size):
    """Worker 2 stops after writing the first ring's worth of a 64 MiB request to worker 0
    (worker 0 is stopped meanwhile, so that the ring fills and no more goes in). Worker 0's
    listener used to wait for the rest of that frame with no deadline: worker 1's calls to it
    all timed out. Then worker 2 resumes and its request completes."""
    if rank != 1:
        return True
    pid0, pid2 = rpc.rpc_sync("worker0", os.getpid), rpc.rpc_sync("worker2", os.getpid)
    os.kill(pid0, signal.SIGSTOP)
    try:
        rpc.rpc_sync("worker2", start_call, args=("worker0", array_info, np.ones(BIG)))
        time.sleep(0.3)   # worker 2's sender fills the ring to the stopped worker 0
        os.kill(pid2, signal.SIGSTOP)
        os.kill(pid0, signal.SIGCONT)
        outcomes, seconds = timed_calls("worker0", 4)
    finally:
        os.kill(pid0, signal.SIGCONT)
        os.kill(pid2, signal.SIGCONT)
    assert outcomes == ["worker0"] * 4 and seconds < 5, (outcomes, seconds)
    # the frame resumes where it stopped: the ring to worker 0 is still in step
    info = rpc.rpc_sync("worker2", pending_result)
    assert info == ("ndarray", "float64", (BIG,), float(BIG), True), info
    assert rpc.rpc_sync("worker0", whoami) == "worker0"
    return True


@pytest.mark.timeout(120)
def test_a_sender_stopped_mid_request_does_not_hold_the_callee():
    assert all(_run(_request_sender_stops, timeout=110))


def _reply_sender_stops(rank, size):
    """The same for a reply: worker 1 waits for a 64 MiB reply from worker 2, which stops in
    the middle of it; worker 1's calls to worker 0 must still get their replies. Then worker 2
    is killed: worker 1's call to it fails with PeerFailureError, and nothing hangs."""
    if rank == 2:
        time.sleep(60)   # killed long before this ends
    if rank != 0:
        return True
    pid1, pid2 = rpc.rpc_sync("worker1", os.getpid), rpc.rpc_sync("worker2", os.getpid)
    rpc.rpc_sync("worker1", start_call, args=("worker2", gated_big))
    os.kill(pid1, signal.SIGSTOP)
    try:
        rpc.rpc_sync("worker2", open_gate)
        time.sleep(0.3)   # worker 2 fills the reply ring to the stopped worker 1
        os.kill(pid2, signal.SIGSTOP)
        os.kill(pid1, signal.SIGCONT)
        outcomes, seconds = rpc.rpc_sync("worker1", timed_calls, args=("worker0", 4), timeout=60)
    finally:
        os.kill(pid1, signal.SIGCONT)
        os.kill(pid2, signal.SIGKILL)
    assert outcomes == ["worker0"] * 4 and seconds < 5, (outcomes, seconds)
    start = time.monotonic()
    assert rpc.rpc_sync("worker1", pending_result) == "PeerFailureError"
    assert time.monotonic() - start < 5
    assert rpc.rpc_sync("worker1", whoami) == "worker1"
    return True


@pytest.mark.timeout(120)
def test_a_sender_stopped_mid_reply_does_not_hold_other_replies():
    assert _run(_reply_sender_stops, timeout=110, expect_dead=(2,))[0]
