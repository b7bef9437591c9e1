"""Tests of shmcomm.Future, collect_all and wait_all.

Every behaviour shared with ``torch.futures`` runs the same test body against both implementations
(the ``impl`` fixture; the torch variant is skipped when torch is not installed), so torch is the
reference. What torch has no equivalent for (timeouts, InvalidStateError, asyncio, logging of
callback errors, signals) is checked against shmcomm only (the ``sc`` fixture).

``SHMCOMM_FUTURE_IMPL=module`` makes the shmcomm side import Future/collect_all/wait_all from that
module instead of ``shmcomm`` (used to test a scratch build of the compiled file).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import os
import signal
import threading
import time
import weakref
from types import SimpleNamespace

import pytest

from shmcomm.errors import CommTimeoutError, InvalidStateError, ShmcommError

pytestmark = pytest.mark.timeout(20)


def _shmcomm_impl():
    mod = importlib.import_module(os.environ.get("SHMCOMM_FUTURE_IMPL", "shmcomm"))
    return SimpleNamespace(name="shmcomm", Future=mod.Future, collect_all=mod.collect_all,
                           wait_all=mod.wait_all)


def _torch_impl():
    tf = pytest.importorskip("torch.futures")
    return SimpleNamespace(name="torch", Future=tf.Future, collect_all=tf.collect_all,
                           wait_all=tf.wait_all)


@pytest.fixture(params=["shmcomm", "torch"])
def impl(request):
    """The implementation under test: shmcomm's, or torch.futures as the reference."""
    return _shmcomm_impl() if request.param == "shmcomm" else _torch_impl()


@pytest.fixture
def sc():
    """shmcomm's implementation only, for behaviour torch has no equivalent for."""
    return _shmcomm_impl()


def _in_thread(fn, *args, delay=0.0):
    """Runs fn(*args) in a daemon thread after ``delay`` seconds; returns the started thread."""
    def run():
        if delay:
            time.sleep(delay)
        fn(*args)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---- completion, wait, value --------------------------------------------------------------------

def test_new_future_is_pending(impl):
    f = impl.Future()
    assert f.done() is False


def test_constructor_arguments(impl):
    assert not impl.Future(devices=[]).done()
    assert not impl.Future(devices=None).done()
    with pytest.raises(TypeError):
        impl.Future(1)
    with pytest.raises(ValueError):
        impl.Future(devices=["cpu"])  # CPU values need no devices (torch refuses this too)


def test_set_result_then_wait_and_value(impl):
    f = impl.Future()
    payload = {"a": [1, 2]}
    f.set_result(payload)
    assert f.done() is True
    assert f.wait() is payload
    assert f.value() is payload
    assert f.wait() is payload


def test_result_none(impl):
    f = impl.Future()
    f.set_result(None)
    assert f.done()
    assert f.wait() is None
    assert f.value() is None


def test_set_exception_raises_same_object(impl):
    f = impl.Future()
    err = ValueError("bad input")
    f.set_exception(err)
    assert f.done()
    with pytest.raises(ValueError) as info:
        f.wait()
    assert info.value is err
    with pytest.raises(ValueError) as info:
        f.value()
    assert info.value is err


def test_set_exception_rejects_non_exceptions(impl):
    f = impl.Future()
    # torch raises AssertionError; shmcomm follows its own rule for bad arguments (TypeError).
    for bad in ("not an exception", ValueError, 3):
        with pytest.raises((TypeError, AssertionError)):
            f.set_exception(bad)
    assert not f.done()
    f.set_result(1)
    assert f.wait() == 1


@pytest.mark.parametrize("first,second", [
    ("result", "result"), ("result", "exception"), ("exception", "result"),
    ("exception", "exception"),
])
def test_completing_twice_raises(impl, first, second):
    f = impl.Future()
    err = KeyError("k")
    if first == "result":
        f.set_result(1)
    else:
        f.set_exception(err)
    with pytest.raises(RuntimeError):
        if second == "result":
            f.set_result(2)
        else:
            f.set_exception(ValueError("again"))
    if impl.name == "torch" and second == "exception":
        return  # torch swaps in its error-raising unwrap function before refusing (a torch bug)
    if first == "result":
        assert f.wait() == 1
    else:
        with pytest.raises(KeyError):
            f.wait()


def test_value_on_pending_future_raises(impl):
    f = impl.Future()
    with pytest.raises(RuntimeError):
        f.value()
    assert not f.done()


def test_wait_blocks_until_set_from_another_thread(impl):
    f = impl.Future()
    _in_thread(f.set_result, 42, delay=0.05)
    assert f.wait() == 42


def test_wait_releases_the_gil(impl):
    # The setter is pure Python: it can only run if the waiting thread released the GIL.
    f = impl.Future()
    progress = []

    def setter():
        for i in range(2000):
            progress.append(i)
        f.set_result(len(progress))
    _in_thread(setter, delay=0.02)
    assert f.wait() == 2000


def test_many_threads_wait(impl):
    f = impl.Future()
    results = []
    lock = threading.Lock()

    def waiter():
        v = f.wait()
        with lock:
            results.append(v)
    threads = [threading.Thread(target=waiter, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    f.set_result("x")
    for t in threads:
        t.join(5)
    assert results == ["x"] * 8


def test_exception_wakes_waiters(impl):
    f = impl.Future()
    caught = []

    def waiter():
        try:
            f.wait()
        except ValueError as e:
            caught.append(e)
    threads = [threading.Thread(target=waiter, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    f.set_exception(ValueError("v"))
    for t in threads:
        t.join(5)
    assert len(caught) == 3


def test_weakref_and_subclass(impl):
    f = impl.Future()
    assert weakref.ref(f)() is f

    class Tagged(impl.Future):
        def __init__(self, tag):
            super().__init__()
            self.tag = tag

    t = Tagged("t")
    child = t.then(lambda fut: fut.tag)
    t.set_result(0)
    assert child.wait() == "t"


def test_generic_alias(impl):
    alias = impl.Future[int]
    assert alias is not None


# ---- then ---------------------------------------------------------------------------------------

def test_then_receives_the_future_and_returns_its_value(impl):
    f = impl.Future()
    seen = []

    def cb(fut):
        seen.append(fut)
        return fut.value() * 2
    child = f.then(cb)
    assert not child.done()
    f.set_result(21)
    assert seen == [f] and seen[0] is f
    assert child.done()
    assert child.wait() == 42
    assert child.value() == 42


def test_then_chain(impl):
    f = impl.Future()
    chained = f.then(lambda x: x.value() + 1).then(lambda x: x.value() * 10)
    f.set_result(1)
    assert chained.wait() == 20


def test_then_callback_error_completes_child_with_it(impl):
    f = impl.Future()
    err = ValueError("boom")

    def cb(fut):
        raise err
    child = f.then(cb)
    f.set_result(1)  # does not raise
    assert child.done()
    with pytest.raises(Exception, match="boom") as info:
        child.wait()
    with pytest.raises(Exception, match="boom"):
        child.value()
    if impl.name == "shmcomm":
        assert info.value is err  # torch wraps it in a RuntimeError; shmcomm keeps the original
    assert f.wait() == 1


def test_then_on_failed_future(impl):
    f = impl.Future()
    f_child = f.then(lambda x: x.value())
    recovered = f.then(lambda x: "recovered")
    f.set_exception(KeyError("k"))
    with pytest.raises(Exception, match="k"):
        f_child.wait()
    assert recovered.wait() == "recovered"


def test_then_does_not_unwrap_returned_future(impl):
    f = impl.Future()
    inner = impl.Future()
    child = f.then(lambda x: inner)
    f.set_result(1)
    assert child.done()
    assert child.wait() is inner
    assert not inner.done()


def test_then_on_done_future_runs_inline(impl):
    f = impl.Future()
    f.set_result(3)
    where = []
    child = f.then(lambda x: where.append(threading.current_thread()) or x.value())
    assert where == [threading.current_thread()]
    assert child.done() and child.wait() == 3


def test_then_requires_callable(impl):
    with pytest.raises(TypeError):
        impl.Future().then(5)
    with pytest.raises(TypeError):
        impl.Future().add_done_callback("nope")


# ---- add_done_callback and ordering -------------------------------------------------------------

def test_add_done_callback_runs_on_completion(impl):
    f = impl.Future()
    got = []
    assert f.add_done_callback(lambda x: got.append(x.value()) or "ignored") is None
    assert got == []
    f.set_result(5)
    assert got == [5]


def test_add_done_callback_on_done_future_runs_inline(impl):
    f = impl.Future()
    f.set_result(5)
    got = []
    f.add_done_callback(lambda x: got.append((x.value(), threading.current_thread())))
    assert got == [(5, threading.current_thread())]


def test_add_done_callback_error_is_not_raised(impl):
    f = impl.Future()
    got = []
    f.add_done_callback(lambda x: 1 / 0)
    f.add_done_callback(lambda x: got.append("after"))
    f.set_result(1)  # must not raise
    assert got == ["after"]
    f.add_done_callback(lambda x: 1 / 0)  # inline: must not raise either


def test_callbacks_run_in_order_added(impl):
    f = impl.Future()
    order = []
    for i in range(12):
        if i % 3 == 0:
            f.then(lambda x, i=i: order.append(i))
        else:
            f.add_done_callback(lambda x, i=i: order.append(i))
    f.set_result(None)
    assert order == list(range(12))


def test_callback_added_by_a_callback_runs_at_once(impl):
    f = impl.Future()
    order = []

    def first(fut):
        order.append(1)
        fut.add_done_callback(lambda y: order.append("nested"))
    f.add_done_callback(first)
    f.add_done_callback(lambda x: order.append(2))
    f.set_result(0)
    assert order == [1, "nested", 2]


def test_concurrent_add_and_complete_run_each_callback_once(impl):
    for _ in range(20):
        f = impl.Future()
        counts = [0] * 400
        start = threading.Barrier(5)

        def adder(base):
            start.wait()
            for i in range(base, base + 100):
                f.add_done_callback(lambda x, i=i: counts.__setitem__(i, counts[i] + 1))

        def setter():
            start.wait()
            time.sleep(0.0005)
            f.set_result(1)
        threads = [threading.Thread(target=adder, args=(b,)) for b in range(0, 400, 100)]
        threads.append(threading.Thread(target=setter))
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert counts == [1] * 400


def test_concurrent_waiters_and_callbacks(impl):
    f = impl.Future()
    got = []
    waiters = [threading.Thread(target=lambda: got.append(f.wait()), daemon=True)
               for _ in range(4)]
    for t in waiters:
        t.start()
    children = [f.then(lambda x, i=i: x.value() + i) for i in range(50)]
    _in_thread(f.set_result, 100, delay=0.02)
    assert [c.wait() for c in children] == [100 + i for i in range(50)]
    for t in waiters:
        t.join(5)
    assert got == [100] * 4


# ---- collect_all / wait_all ---------------------------------------------------------------------

def test_collect_all_of_done_futures(impl):
    futs = [impl.Future() for _ in range(5)]
    for i, f in enumerate(futs):
        f.set_result(i)
    all_done = impl.collect_all(futs)
    assert all_done.done()
    got = all_done.wait()
    assert isinstance(got, list) and len(got) == 5
    assert [g.wait() for g in got] == list(range(5))


def test_collect_all_waits_for_every_future(impl):
    a, b, c = impl.Future(), impl.Future(), impl.Future()
    all_done = impl.collect_all([a, b, c])
    b.set_result("b")
    a.set_result("a")
    assert not all_done.done()
    _in_thread(c.set_result, "c", delay=0.05)
    assert [g.wait() for g in all_done.wait()] == ["a", "b", "c"]


def test_collect_all_empty(impl):
    all_done = impl.collect_all([])
    assert all_done.done()
    assert all_done.wait() == []
    assert impl.wait_all([]) == []


def test_collect_all_accepts_a_tuple(impl):
    a = impl.Future()
    a.set_result(1)
    assert [g.wait() for g in impl.collect_all((a,)).wait()] == [1]


def test_collect_all_with_a_failure_completes_when_all_done(impl):
    a, b, c = impl.Future(), impl.Future(), impl.Future()
    all_done = impl.collect_all([a, b, c])
    c.set_exception(KeyError("c"))
    b.set_exception(ValueError("b"))
    assert not all_done.done()  # a failure does not complete it early
    a.set_result(1)
    assert all_done.done()
    with pytest.raises(ValueError, match="b"):  # first failure in list order
        all_done.wait()
    with pytest.raises(ValueError, match="b"):
        all_done.value()


def test_collect_all_then(impl):
    a, b = impl.Future(), impl.Future()
    total = impl.collect_all([a, b]).then(lambda x: sum(g.wait() for g in x.value()))
    a.set_result(1)
    b.set_result(2)
    assert total.wait() == 3


def test_collect_all_rejects_non_futures(impl):
    with pytest.raises(TypeError):
        impl.collect_all([impl.Future(), 1])


def test_wait_all_returns_values(impl):
    futs = [impl.Future() for _ in range(4)]
    for i, f in enumerate(futs[:3]):
        f.set_result(i * i)
    _in_thread(futs[3].set_result, 9, delay=0.05)
    assert impl.wait_all(futs) == [0, 1, 4, 9]


def test_wait_all_raises_first_error(impl):
    a, b, c = impl.Future(), impl.Future(), impl.Future()
    a.set_result(1)
    c.set_exception(IndexError("c"))
    b.set_exception(KeyError("b"))
    with pytest.raises(KeyError):
        impl.wait_all([a, b, c])


# ---- shmcomm only: errors, timeouts, signals ----------------------------------------------------

def test_invalid_state_error_class(sc):
    f = sc.Future()
    with pytest.raises(InvalidStateError):
        f.value()
    f.set_result(1)
    with pytest.raises(InvalidStateError):
        f.set_result(2)
    with pytest.raises(InvalidStateError):
        f.set_exception(ValueError())
    assert issubclass(InvalidStateError, ShmcommError)
    assert f.value() == 1


def test_set_exception_type_error_names_argument(sc):
    with pytest.raises(TypeError, match="result"):
        sc.Future().set_exception("x")


def test_then_error_is_the_original_exception(sc):
    f = sc.Future()
    err = KeyError("k")
    f.set_exception(err)
    child = f.then(lambda x: x.value())
    with pytest.raises(KeyError) as info:
        child.wait()
    assert info.value is err


def test_collect_all_holds_the_input_futures(sc):
    futs = [sc.Future() for _ in range(3)]
    all_done = sc.collect_all(futs)
    for f in futs:
        f.set_result(0)
    got = all_done.wait()
    assert got == futs and all(g is f for g, f in zip(got, futs))
    assert got is not futs  # a copy: later changes to the caller's list do not leak in


def test_wait_timeout(sc):
    f = sc.Future()
    t0 = time.monotonic()
    with pytest.raises(CommTimeoutError) as info:
        f.wait(timeout=0.2)
    elapsed = time.monotonic() - t0
    assert 0.19 <= elapsed < 2.0
    assert isinstance(info.value, TimeoutError)
    assert not f.done()
    with pytest.raises(CommTimeoutError):
        f.wait(timeout=0)
    f.set_result(7)
    assert f.wait(timeout=0) == 7
    assert f.wait(timeout=0.1) == 7


def test_wait_timeout_then_completed(sc):
    f = sc.Future()
    _in_thread(f.set_result, 3, delay=0.05)
    assert f.wait(timeout=5.0) == 3


def test_wait_timeout_infinite(sc):
    f = sc.Future()
    _in_thread(f.set_result, 3, delay=0.05)
    assert f.wait(timeout=float("inf")) == 3


def test_wait_bad_timeout(sc):
    f = sc.Future()
    with pytest.raises(ValueError, match="timeout"):
        f.wait(timeout=-1)
    with pytest.raises(ValueError, match="timeout"):
        f.wait(timeout=float("nan"))
    with pytest.raises(TypeError, match="timeout"):
        f.wait(timeout="1")


def test_timed_out_waiter_does_not_disturb_others(sc):
    f = sc.Future()
    got = []
    forever = threading.Thread(target=lambda: got.append(f.wait()), daemon=True)
    forever.start()
    for _ in range(3):
        with pytest.raises(CommTimeoutError):
            f.wait(timeout=0.02)
    f.set_result("done")
    forever.join(5)
    assert got == ["done"]
    assert f.wait(timeout=0.01) == "done"


def test_wait_all_timeout(sc):
    a, b = sc.Future(), sc.Future()
    a.set_result(1)
    with pytest.raises(CommTimeoutError):
        sc.wait_all([a, b], timeout=0.05)
    b.set_result(2)
    assert sc.wait_all([a, b], timeout=1) == [1, 2]


def test_wait_is_interruptible_by_signals(sc):
    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted()
    old = signal.signal(signal.SIGUSR1, handler)
    try:
        f = sc.Future()
        # Sent from another thread, so the kernel may not interrupt the main thread's wait: the
        # 100 ms slices must notice the pending Python signal anyway.
        _in_thread(os.kill, os.getpid(), signal.SIGUSR1, delay=0.1)
        t0 = time.monotonic()
        with pytest.raises(Interrupted):
            f.wait()
        assert time.monotonic() - t0 < 2.0
        assert not f.done()
        f.set_result(1)
        assert f.wait() == 1
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_callback_error_is_logged(sc, caplog):
    f = sc.Future()
    f.add_done_callback(lambda x: 1 / 0)
    with caplog.at_level(logging.ERROR, logger="shmcomm.future"):
        f.set_result(1)
    records = [r for r in caplog.records if r.name == "shmcomm.future"]
    assert len(records) == 1
    assert "ZeroDivisionError" in records[0].getMessage()
    assert records[0].exc_info is not None


def test_keyboard_interrupt_in_callback_propagates_after_all_callbacks(sc):
    f = sc.Future()
    ran = []

    def interrupt(fut):
        raise KeyboardInterrupt()
    f.add_done_callback(interrupt)
    f.add_done_callback(lambda x: ran.append(1))
    child = f.then(lambda x: ran.append(2))
    with pytest.raises(KeyboardInterrupt):
        f.set_result(0)
    assert ran == [1, 2]
    assert f.done() and child.done()


def test_child_completed_by_hand_is_left_alone(sc):
    f = sc.Future()
    child = f.then(lambda x: "from callback")
    child.set_result("by hand")
    f.set_result(1)
    assert child.wait() == "by hand"


def test_long_then_chain(sc):
    f = sc.Future()
    tail = f
    for _ in range(2000):
        tail = tail.then(lambda x: x.value() + 1)
    f.set_result(0)
    assert tail.wait() == 2000


def test_futures_are_freed(sc):
    # A completed future with callbacks must not keep itself alive (no leaked references).
    f = sc.Future()
    f.then(lambda x: x.value())
    f.add_done_callback(lambda x: None)
    f.set_result(object())
    ref = weakref.ref(f)
    del f
    gc.collect()
    assert ref() is None


def test_repr(sc):
    f = sc.Future()
    assert "pending" in repr(f)
    f.set_result(1)
    assert "done" in repr(f)
    g = sc.Future()
    g.set_exception(ValueError("x"))
    assert "ValueError" in repr(g)


# ---- shmcomm only: asyncio ----------------------------------------------------------------------

def test_await_done_future(sc):
    f = sc.Future()
    f.set_result(4)

    async def main():
        return await f
    assert asyncio.run(main()) == 4


def test_await_future_completed_by_the_loop(sc):
    async def main():
        f = sc.Future()
        asyncio.get_running_loop().call_later(0.02, f.set_result, "loop")
        return await f
    assert asyncio.run(main()) == "loop"


def test_await_future_completed_by_another_thread(sc):
    async def main():
        futs = [sc.Future() for _ in range(5)]
        for i, f in enumerate(futs):
            _in_thread(f.set_result, i, delay=0.01 * (i + 1))
        return await asyncio.gather(*(_await(f) for f in futs))

    async def _await(f):
        return await f
    assert asyncio.run(main()) == [0, 1, 2, 3, 4]


def test_await_failed_future(sc):
    async def main():
        f = sc.Future()
        _in_thread(f.set_exception, KeyError("k"), delay=0.02)
        await f
    with pytest.raises(KeyError):
        asyncio.run(main())


def test_await_cancelled_task_leaves_future_usable(sc):
    f = sc.Future()

    async def waiter():
        return await f

    async def main():
        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(main())
    f.set_result(1)  # the bridge to the closed loop must not raise
    assert f.wait() == 1


def test_await_then_child(sc):
    async def main():
        f = sc.Future()
        child = f.then(lambda x: x.value() * 3)
        asyncio.get_running_loop().call_soon(f.set_result, 5)
        return await child
    assert asyncio.run(main()) == 15
