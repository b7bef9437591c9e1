"""Async ops: Work handles, issue order, overlap with computation, futures from Work."""

import threading
import time

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks


def _issue_order_and_results(rank, size):
    arrays = [np.full(1000 + i, rank + i, np.float64) for i in range(20)]
    works = [sc.all_reduce(a, async_op=True) for a in arrays]
    # a synchronous op issued behind async ones waits its turn
    b = np.full(3, float(rank))
    sc.broadcast(b, src=size - 1)
    assert (b == size - 1).all()
    for i, w in enumerate(works):
        assert w.wait() is True and w.is_completed() and w.is_success() and w.exception() is None
        out, = w.result()
        assert out is arrays[i]
        assert (out == sum(r + i for r in range(size))).all()
    # Work.get_future() is a shmcomm.Future usable with then/collect_all
    works = [sc.all_reduce(np.full(4, 1.0), async_op=True) for _ in range(5)]
    sums = sc.wait_all([w.get_future().then(lambda f: float(f.value()[0].sum())) for w in works])
    assert sums == [4.0 * size] * 5
    done = sc.collect_all([w.get_future() for w in works]).wait()
    assert len(done) == 5
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_async_ops_run_in_issue_order(world):
    assert all(run_ranks(_issue_order_and_results, world))


def _overlap(rank, size):
    """The caller computes while a large all_reduce proceeds on the progress thread."""
    x = np.ones(4 << 20, np.float32)  # 16 MiB
    if rank == 1:
        time.sleep(0.3)  # the peer is late: the op stays pending for a while
    t0 = time.perf_counter()
    work = sc.all_reduce(x, async_op=True)
    returned_after = time.perf_counter() - t0
    computed = 0
    while not work.is_completed():
        computed += int(np.sum(np.arange(1000)))  # the caller keeps working
    work.wait()
    assert (x == size).all()
    return returned_after, computed


@pytest.mark.timeout(60)
def test_async_op_returns_at_once_and_overlaps():
    (returned0, computed0), _ = run_ranks(_overlap, 2)
    assert returned0 < 0.1 and computed0 > 0


def _work_errors(rank, size):
    x = np.ones(4)
    if rank == 0:
        w = sc.all_reduce(x, async_op=True)
        with pytest.raises(sc.CommTimeoutError):
            w.wait(timeout=0.2)  # peer late: the wait times out, the op is still pending
        assert not w.is_completed()
        w.wait(timeout=10)
    else:
        time.sleep(0.6)
        sc.all_reduce(x)
    bad = sc.all_reduce(np.ones(3 + rank), async_op=True)
    with pytest.raises(sc.CollectiveMismatchError):
        bad.wait()
    assert isinstance(bad.exception(), sc.CollectiveMismatchError) and not bad.is_success()
    return True


@pytest.mark.timeout(60)
def test_work_wait_timeout_and_error_reporting():
    assert all(run_ranks(_work_errors, 2))


def _threads(rank, size):
    """Other Python threads keep running while a rank waits (the GIL is released)."""
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    if rank == 1:
        time.sleep(0.5)
    sc.barrier()
    stop.set()
    t.join()
    return len(ticks)


@pytest.mark.timeout(60)
def test_waits_release_the_gil():
    ticks = run_ranks(_threads, 2)
    assert ticks[0] > 50


def _idle_cpu(rank, size):
    import psutil

    if rank == 1:
        time.sleep(2.0)
        sc.barrier()
        return None
    proc = psutil.Process()
    before = proc.cpu_times()
    sc.barrier()  # blocked ~2 s on the late peer
    after = proc.cpu_times()
    return (after.user + after.system) - (before.user + before.system)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 4])
def test_blocked_rank_sleeps_instead_of_spinning(world):
    cpu = run_ranks(_idle_cpu, world)[0]
    assert cpu < 0.5, f"a rank blocked 2 s used {cpu:.2f} s of CPU"


def _waits_over_works(rank, size):
    xs = [np.full(5, float(rank + k)) for k in range(3)]
    works = [sc.all_reduce(x, async_op=True) for x in xs]
    got = sc.wait_all(works)  # a Work's value is its result(): the arrays it wrote
    base = sum(range(size))
    for k, (out, x) in enumerate(zip(got, xs)):
        assert out[0] is x and (x == base + k * size).all(), (k, out)
    mixed = sc.wait_all([sc.broadcast(np.full(2, float(rank)), src=0, async_op=True), _done_future(7)])
    assert mixed[1] == 7 and (mixed[0][0] == 0.0).all(), mixed
    # wait_any: rank 0's receive from the last rank finishes; the one from a silent peer does not
    if size > 1:
        if rank == 0:
            late, soon = np.empty(1), np.empty(1)
            pending = sc.irecv(late, src=1, tag=9)             # rank 1 sends it only at the end
            ready = sc.irecv(soon, src=size - 1, tag=8)
            assert sc.wait_any([pending, ready]) == 1 and soon[0] == 42.0
            assert not pending.is_completed()
            with pytest.raises(sc.CommTimeoutError, match="none of 1 operations finished"):
                sc.wait_any([pending], timeout=0.2)
            sc.barrier()
            pending.wait()
            assert late[0] == 1.0
        else:
            if rank == size - 1:
                sc.send(np.array([42.0]), dst=0, tag=8)
            sc.barrier()
            if rank == 1:
                sc.send(np.array([1.0]), dst=0, tag=9)
    with pytest.raises(TypeError, match="item 0 is a list, not a shmcomm Future or Work"):
        sc.wait_all([[1]])
    with pytest.raises(ValueError, match="at least one"):
        sc.wait_any([])
    return True


def _done_future(value):
    f = sc.Future()
    f.set_result(value)
    return f


def test_wait_any_in_a_loop_adds_one_callback_per_future():
    """A handle polled with wait_any many times gets one completion callback, not one per call."""
    import sys

    from shmcomm import waits

    pending = sc.Future()
    with pytest.raises(sc.CommTimeoutError):
        sc.wait_any([pending], timeout=0.001)
    after_one = sys.getrefcount(waits._notify)  # the callback's references, held by the Future
    for _ in range(50):
        with pytest.raises(sc.CommTimeoutError):
            sc.wait_any([pending], timeout=0.001)
    after_many = sys.getrefcount(waits._notify)
    assert after_many == after_one
    timer = threading.Timer(0.05, pending.set_result, (5,))
    timer.start()
    assert sc.wait_any([pending], timeout=5) == 0 and pending.value() == 5
    timer.join()  # gone before the next test forks: a fork beside an exiting thread can copy a held lock


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_wait_all_and_wait_any_over_works_and_futures(world):
    assert all(run_ranks(_waits_over_works, world))


def _futures_of_dropped_works_under_gc(rank, size, rounds):
    """Async all_reduces whose Work is dropped right after ``get_future().add_done_callback``
    (what get_future allows), with the cyclic GC running in another thread: the Work kept itself
    alive through a reference cycle (``pin = self``) that the GC could free while the engine
    still held the op, and settling its Future then crashed the rank (SIGSEGV, issue 47)."""
    import gc

    # The heap the rank inherits from the test process (every module the suite imported) frozen
    # out of the collector's way: each full collection then walks only what this loop makes, about
    # one per round instead of one per 10 ms round (the test took 55 s in the suite, 1 s now).
    gc.freeze()
    stop = threading.Event()
    collector = threading.Thread(target=lambda: [gc.collect() for _ in iter(stop.is_set, True)], daemon=True)
    collector.start()
    got = []
    try:
        for i in range(rounds):
            x = np.full(4, float(rank + i), np.float32)
            w = sc.all_reduce(x, async_op=True)
            w.get_future().add_done_callback(lambda f, i=i: got.append(float(f.value()[0][0]) - 2 * i))
            del w
        sc.barrier()
    finally:
        stop.set()
        collector.join()
    assert len(got) == rounds and set(got) == {float(sum(range(size)))}, (len(got), set(got))
    return True


@pytest.mark.timeout(120)
def test_a_future_outlives_its_dropped_work_under_gc():
    import os
    rounds = 2000 if os.environ.get("SHMCOMM_ASAN") == "1" else 6000
    for _ in range(2):
        assert all(run_ranks(_futures_of_dropped_works_under_gc, 2, rounds, timeout=100))
