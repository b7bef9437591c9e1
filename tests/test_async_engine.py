"""The async engine: per-call arguments (no call can reach another's buffers), ops of every kind
in flight at once, a late peer, and the lifecycle cases (timeouts, abort, destroy, fork, threads,
callbacks). Each test here failed before the engine was rewritten (issue: async collectives)."""

import gc
import os
import threading
import time

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks

# 1 MiB single-copy threshold at test sizes: the tests cover slots and single copy with small arrays.
SMALL_PATHS = {"SHMCOMM_CMA_BYTES": 4096, "SHMCOMM_SLOT_BYTES": 8192}


def _two_all_gathers_late_peer(rank, size):
    """The issue's reproducer: two all_gathers in flight, rank 1 late; rank 0's first outputs
    used to stay zero (its data went into the second op's buffers)."""
    if rank == 1:
        time.sleep(0.3)
    xa = np.full(4, 10 + rank, np.float32)
    outs_a = [np.zeros(4, np.float32) for _ in range(size)]
    xb = np.full(4, 20 + rank, np.float32)
    outs_b = [np.zeros(4, np.float32) for _ in range(size)]
    wa = sc.all_gather(outs_a, xa, async_op=True)
    time.sleep(0.05)
    wb = sc.all_gather(outs_b, xb, async_op=True)
    wa.wait()
    wb.wait()
    for q in range(size):
        np.testing.assert_array_equal(outs_a[q], np.full(4, 10 + q, np.float32))
        np.testing.assert_array_equal(outs_b[q], np.full(4, 20 + q, np.float32))
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_two_async_all_gathers_with_a_late_peer_keep_their_own_buffers(world):
    assert all(run_ranks(_two_all_gathers_late_peer, world))


def _issue_every_kind(rank, size, n, late_rank):
    """Every collective kind in flight at once (twice, with different values), the late rank
    arriving after the others queued everything; each result checked against numpy."""
    checks, works = [], []

    def pace():
        # Every rank issues an op every 20 ms, the late rank 30 ms behind the others: they validate
        # op k+1 while op k runs (blocked on the late rank), which is when one call's arguments
        # used to overwrite the running call's pointer tables.
        time.sleep(0.02)

    if rank == late_rank:
        time.sleep(0.03)

    for round_ in range(2):
        base = 100 * round_
        x = np.arange(n, dtype=np.float64) + rank + base
        pace()
        works.append(sc.all_reduce(x, async_op=True))
        checks.append((x, sum(np.arange(n, dtype=np.float64) + r + base for r in range(size))))
        b = np.full(n, -1.0) if rank != size - 1 else np.arange(n, dtype=np.float64) + base
        pace()
        works.append(sc.broadcast(b, src=size - 1, async_op=True))
        checks.append((b, np.arange(n, dtype=np.float64) + base))
        red = np.full(n, rank + base, np.int64)
        pace()
        works.append(sc.reduce(red, dst=0, async_op=True))
        checks.append((red, np.full(n, sum(r + base for r in range(size)), np.int64) if rank == 0
                       else np.full(n, rank + base, np.int64)))
        outs = [np.zeros(n, np.float32) for _ in range(size)]
        pace()
        works.append(sc.all_gather(outs, np.full(n, rank + base, np.float32), async_op=True))
        checks += [(outs[q], np.full(n, q + base, np.float32)) for q in range(size)]
        whole = np.zeros(size * n, np.int32)
        pace()
        works.append(sc.all_gather_into(whole, np.full(n, rank + base, np.int32), async_op=True))
        checks.append((whole, np.repeat(np.arange(size, dtype=np.int32) + base, n)))
        glist = [np.zeros(n, np.int16) for _ in range(size)] if rank == 1 % size else None
        pace()
        works.append(sc.gather(np.full(n, rank + base, np.int16), glist, dst=1 % size, async_op=True))
        if glist is not None:
            checks += [(glist[q], np.full(n, q + base, np.int16)) for q in range(size)]
        sc_out = np.zeros(n, np.float32)
        slist = [np.full(n, 10 * q + base, np.float32) for q in range(size)] if rank == 0 else None
        pace()
        works.append(sc.scatter(sc_out, slist, src=0, async_op=True))
        checks.append((sc_out, np.full(n, 10 * rank + base, np.float32)))
        rs = np.zeros(n, np.float64)
        ins = [np.full(n, rank * 10 + q + base, np.float64) for q in range(size)]
        pace()
        works.append(sc.reduce_scatter(rs, ins, async_op=True))
        checks.append((rs, np.full(n, sum(r * 10 + rank + base for r in range(size)), np.float64)))
        a2a_out = [np.zeros(n, np.int64) for _ in range(size)]
        a2a_in = [np.full(n, 100 * rank + q + base, np.int64) for q in range(size)]
        pace()
        works.append(sc.all_to_all(a2a_out, a2a_in, async_op=True))
        checks += [(a2a_out[q], np.full(n, 100 * q + rank + base, np.int64)) for q in range(size)]
        single = np.arange(size * n, dtype=np.float32) + 1000 * rank + base
        single_out = np.zeros(size * n, np.float32)
        pace()
        works.append(sc.all_to_all_single(single_out, single, async_op=True))
        expect = np.concatenate([np.arange(rank * n, (rank + 1) * n, dtype=np.float32) + 1000 * q + base
                                 for q in range(size)])
        checks.append((single_out, expect))
        prefix = np.full(n, rank + 1 + base, np.float64)
        pace()
        works.append(sc.scan(prefix, async_op=True))
        checks.append((prefix, np.full(n, sum(r + 1 + base for r in range(rank + 1)), np.float64)))
        before = np.full(n, rank + 1, np.int32)
        pace()
        works.append(sc.exscan(before, op="max", async_op=True))
        checks.append((before, np.full(n, rank if rank else np.iinfo(np.int32).min, np.int32)))
        pace()
        works.append(sc.barrier(async_op=True))
    for w in works:
        assert w.wait() is True
    for got, want in checks:
        np.testing.assert_array_equal(got, want)
    return True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("n", [5, 3000, 40000])
def test_every_kind_in_flight_with_a_late_peer(world, n):
    env = SMALL_PATHS if n > 5 else {}
    assert all(run_ranks(_issue_every_kind, world, n, world - 1, env=env))


def _two_heaps(rank, size):
    """Two async all_reduces on sc.empty arrays from two heaps (the zero-copy path) used to share
    one 'current heap stride' field: silently wrong."""
    a = sc.empty(1 << 16, np.float32)
    b = sc.empty(3 << 16, np.float32)  # another heap, another stride
    a[:] = rank + 1
    b[:] = 10 * (rank + 1)
    if rank == 0:
        time.sleep(0.2)
    wa = sc.all_reduce(a, async_op=True)
    wb = sc.all_reduce(b, async_op=True)
    wa.wait()
    wb.wait()
    total = size * (size + 1) / 2
    assert (a == total).all() and (b == 10 * total).all()
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_async_all_reduces_on_two_heaps(world):
    assert all(run_ranks(_two_heaps, world, env={"SHMCOMM_CMA_BYTES": 4096}))


def _sync_behind_async(rank, size):
    """A synchronous call issued behind queued async ones waits its turn and sees their results."""
    if rank == 0:
        time.sleep(0.2)
    xs = [np.full(1000, rank + i, np.float64) for i in range(8)]
    works = [sc.all_reduce(x, async_op=True) for x in xs]
    y = np.full(3, float(rank))
    sc.all_reduce(y)
    assert (y == sum(range(size))).all()
    for i, (w, x) in enumerate(zip(works, xs)):
        assert w.is_completed()  # ran before the synchronous call
        assert (x == sum(r + i for r in range(size))).all()
    return True


@pytest.mark.timeout(60)
def test_synchronous_call_behind_queued_ones():
    assert all(run_ranks(_sync_behind_async, 3))


def _dropped_works(rank, size):
    """Works dropped without wait: the ops still run, in order, and their arrays stay alive."""
    for i in range(50):
        sc.all_reduce(np.full(257, float(rank + i)), async_op=True)  # dropped at once
    x = np.full(257, float(rank))
    sc.all_reduce(x)
    assert (x == sum(range(size))).all()
    return True


@pytest.mark.timeout(60)
def test_works_dropped_without_wait():
    assert all(run_ranks(_dropped_works, 2))


def _freed_arrays(rank, size):
    """The caller drops its only reference to the arrays while the op runs (peer late)."""
    if rank == 1:
        time.sleep(0.3)
    w = sc.all_reduce(np.ones(1 << 18, np.float32), async_op=True)
    gc.collect()
    junk = [np.full(1 << 18, 7.0, np.float32) for _ in range(4)]  # reuse freed memory, if any
    out, = w.result()
    assert (out == size).all() and all((j == 7.0).all() for j in junk)
    return True


@pytest.mark.timeout(60)
def test_arrays_dropped_by_the_caller_while_the_op_runs():
    assert all(run_ranks(_freed_arrays, 2, env=SMALL_PATHS))


# ---- lifecycle ----------------------------------------------------------------------------------
def _late_peer_and_reused_memory(rank, size):
    """Rank 1 times out on a single-copy all_reduce and reuses the memory; rank 0 arrives late.
    Rank 0 used to overwrite half of rank 1's fresh array through the published addresses."""
    n = 10 << 20  # 40 MiB of float32: above glibc's mmap threshold, so the memory is reused as is
    if rank == 1:
        x = np.ones(n, np.float32)
        try:  # (not pytest.raises: its traceback would keep x alive)
            sc.all_reduce(x)
        except sc.CommTimeoutError:
            pass
        else:
            raise AssertionError("rank 1's all_reduce did not time out")
        del x
        fresh = np.zeros(n, np.float32)
        time.sleep(2.5)  # rank 0 runs its all_reduce meanwhile
        assert not fresh.any(), f"{np.count_nonzero(fresh)} elements written by a late peer"
        return True
    time.sleep(1.5)
    x = np.ones(n, np.float32)
    try:
        sc.all_reduce(x)
    except sc.ShmcommError as exc:
        return type(exc).__name__
    raise AssertionError("rank 0's all_reduce with a failed peer succeeded")


@pytest.mark.timeout(60)
def test_a_failed_op_withdraws_its_addresses_before_returning():
    err, ok = run_ranks(_late_peer_and_reused_memory, 2, env={"SHMCOMM_TIMEOUT": 1.0})
    assert ok and err in ("PeerFailureError", "CommTimeoutError")


def _new_group_behind_async(rank, size):
    """Rank 0 waits in new_group's rendezvous while its async all_reduce is queued; rank 1 waits
    for that all_reduce before calling new_group. The rendezvous used to hold the GIL."""
    x, x2 = np.full(8, float(rank)), np.full(8, float(rank))
    t0 = time.monotonic()
    if rank == 0:
        w = sc.all_reduce(x, async_op=True)
        w2 = sc.all_reduce(x2, async_op=True)  # starts only after the first one completed
        sub = sc.new_group([0, 1])
        w.wait()
        w2.wait()
    else:
        time.sleep(0.1)
        sc.all_reduce(x)
        sc.all_reduce(x2)
        sub = sc.new_group([0, 1])
    assert (x == sum(range(size))).all() and (x2 == sum(range(size))).all()
    y = np.ones(2)
    sc.all_reduce(y, group=sub)
    assert (y == 2).all()
    return time.monotonic() - t0


@pytest.mark.timeout(60)
def test_rendezvous_does_not_block_the_progress_thread():
    took = run_ranks(_new_group_behind_async, 2, env={"SHMCOMM_TIMEOUT": 10.0})
    assert max(took) < 5.0


def _abort_with_queued_ops(rank, size):
    if rank == 0:
        works = [sc.all_reduce(np.ones(100), async_op=True) for _ in range(5)]
        time.sleep(0.1)
        works[2].abort()
        for w in works:
            with pytest.raises(sc.AbortedError):
                w.wait()
        with pytest.raises(sc.AbortedError):
            sc.barrier()
    else:
        time.sleep(0.5)
        with pytest.raises((sc.AbortedError, sc.PeerFailureError)):
            sc.all_reduce(np.ones(100))
    return True


@pytest.mark.timeout(60)
def test_abort_fails_every_queued_op_on_every_rank():
    assert all(run_ranks(_abort_with_queued_ops, 2))


def _destroy_with_ops_in_flight(rank, size):
    """destroy_process_group drains queued ops (it used to return after 5 s with ops running)."""
    x = np.full(1000, float(rank + 1))
    if rank == 1:
        time.sleep(5.5)
        sc.all_reduce(x)
    else:
        sc.all_reduce(x, async_op=True)  # dropped
        sc.destroy_process_group()
    assert (x == 3.0).all()
    return True


@pytest.mark.timeout(60)
def test_destroy_runs_queued_ops_to_their_end():
    assert all(run_ranks(_destroy_with_ops_in_flight, 2))


EXIT_WITH_OPS = """
import sys, time, numpy as np, shmcomm as sc
rank, job = int(sys.argv[1]), sys.argv[2]
sc.init_process_group(rank=rank, world_size=2, name=job, timeout=30)
x = np.full(1000, float(rank + 1))
if rank == 1:
    time.sleep(0.5)
    sc.all_reduce(x)
    assert (x == 3.0).all(), x
    print("ok")
else:
    sc.all_reduce(x, async_op=True)   # never waited: the interpreter exits with it queued
"""


@pytest.mark.timeout(60)
def test_interpreter_exit_with_ops_in_flight():
    import subprocess
    import sys
    import uuid

    from shmcomm import segments

    job = f"test-exit-{uuid.uuid4().hex[:8]}"
    procs = [subprocess.Popen([sys.executable, "-c", EXIT_WITH_OPS, str(r), job],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=50) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[1][0].strip() == "ok"
    assert not segments.list_segments(job=job)


def _fork_child_exits(rank, size):
    """A child made with os.fork() that exits normally (atexit handlers run) must not mark its
    parent's rank as gone."""
    import atexit

    if rank == 0:
        pid = os.fork()
        if pid == 0:
            atexit._run_exitfuncs()  # what a normal interpreter exit does
            os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.3)  # rank 1 waits for us meanwhile: it checks our rank's state
    x = np.ones(4)
    sc.all_reduce(x)
    assert (x == size).all()
    return True


@pytest.mark.timeout(60)
def test_forked_child_exit_does_not_leave_the_parents_group():
    assert all(run_ranks(_fork_child_exits, 2))


def _system_exit_in_callback(rank, size):
    """SystemExit raised in a Work's future callback used to kill the progress thread, and every
    later op on the group waited forever."""
    import sys

    if rank == 1:
        time.sleep(0.3)  # rank 0's op is pending when its callback is added (else it runs inline)
    x = np.ones(4)
    w = sc.all_reduce(x, async_op=True)
    if rank == 0:
        w.get_future().add_done_callback(lambda f: sys.exit(3))
    deadline = time.monotonic() + 10
    while not w.is_completed() and time.monotonic() < deadline:
        time.sleep(0.01)  # not waited: the progress thread runs it and the callback
    assert w.is_completed()
    w2 = sc.all_reduce(np.ones(4), async_op=True)
    w2.get_future().then(lambda f: sys.exit(4))
    w2.wait()
    y = np.ones(4)
    sc.all_reduce(y)  # synchronous calls still work too
    assert (x == size).all() and (y == size).all()
    return True


@pytest.mark.timeout(60)
def test_system_exit_in_a_callback_does_not_stop_the_group():
    assert all(run_ranks(_system_exit_in_callback, 2))


def _threads_share_a_group(rank, size, n):
    """Synchronous collectives on one group from two threads are serialised (they crashed or
    returned wrong sums). Both threads reduce ones, so any pairing across ranks sums to size."""
    errors = []

    def worker():
        try:
            for _ in range(10):
                x = np.ones(n, np.float32)
                sc.all_reduce(x)
                assert (x == size).all()
                w = sc.all_reduce(np.ones(n, np.float32), async_op=True)
                assert (w.result()[0] == size).all()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return True


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_synchronous_calls_from_two_threads_are_serialised(n):
    assert all(run_ranks(_threads_share_a_group, 2, n))


START_RANK = """
import sys, shmcomm as sc
sc.init_process_group(rank=int(sys.argv[1]), world_size=2, name=sys.argv[2], timeout=float(sys.argv[3]))
"""


@pytest.mark.timeout(60)
def test_rank0_killed_during_start_up_leaves_no_segment():
    """Rank 0 SIGKILLed as soon as its segment appears, without shmrun: the rank that comes later
    removes the dead rank 0's segment (it used to stay in /dev/shm)."""
    import signal
    import subprocess
    import sys
    import uuid

    from shmcomm import segments

    job = f"test-kill0-{uuid.uuid4().hex[:8]}"
    rank0 = subprocess.Popen([sys.executable, "-c", START_RANK, "0", job, "30"])
    deadline = time.monotonic() + 20
    while not segments.list_segments(job=job) and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = segments.list_segments(job=job)
    assert seen, "rank 0 never created its segment"
    # A segment is named only once its header is written: the first sight of it already says
    # whose it is (before, a kill in that window left a header-less file nobody would remove).
    assert all(s.valid and rank0.pid in s.pids and not s.stale for s in seen), seen
    rank0.send_signal(signal.SIGKILL)
    rank0.wait()
    rank1 = subprocess.run([sys.executable, "-c", START_RANK, "1", job, "2"], capture_output=True,
                           text=True, timeout=30)
    assert rank1.returncode != 0 and "CommTimeoutError" in rank1.stderr, rank1.stderr
    assert not segments.list_segments(job=job)


START_OF_THREE = """
import sys, time, shmcomm as sc
t0 = time.monotonic()
try:
    sc.init_process_group(rank=int(sys.argv[1]), world_size=3, name=sys.argv[2], timeout=60)
except sc.PeerFailureError as e:
    print(f"raised after {time.monotonic() - t0:.1f} s: {e}", flush=True)
    sys.exit(3)
"""


@pytest.mark.timeout(60)
def test_a_rank_killed_after_joining_fails_start_up_at_once():
    """Three ranks by hand; rank 1 joins and is SIGKILLed while rank 2 has not come: rank 0
    fails with PeerFailureError naming rank 1 at once (it waited the whole 60 s timeout for rank
    2, whose place could never be filled), and leaves nothing in /dev/shm."""
    import signal
    import subprocess
    import sys
    import uuid

    from shmcomm import segments

    job = f"test-join1-{uuid.uuid4().hex[:8]}"
    ranks = [subprocess.Popen([sys.executable, "-c", START_OF_THREE, str(r), job],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (0, 1)]
    deadline = time.monotonic() + 30
    while not any(ranks[1].pid in s.pids for s in segments.list_segments(job=job)):
        assert time.monotonic() < deadline, "rank 1 never joined"
        time.sleep(0.02)
    ranks[1].send_signal(signal.SIGKILL)
    ranks[1].wait()
    out = ranks[0].communicate(timeout=20)[0]
    assert ranks[0].returncode == 3 and "rank 1" in out and "died during start-up" in out, out
    assert not segments.list_segments(job=job)


HEAP_RANK = """
import os, sys, time, shmcomm as sc
rank, job, go = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sc.init_process_group(rank=rank, world_size=2, name=job, timeout=20)
sc.barrier()
print("ready", flush=True)
while rank == 1 and not os.path.exists(go):
    time.sleep(0.02)
try:
    sc.empty(1000)
except sc.PeerFailureError as e:
    print("raised", e, flush=True)
    sys.exit(3)
"""


@pytest.mark.timeout(60)
def test_rank0_killed_inside_empty_leaves_no_heap_segment(tmp_path):
    """Ranks started by hand; rank 0 SIGKILLed inside ``sc.empty`` while rank 1 has not come yet:
    rank 1 fails with PeerFailureError and nothing stays in /dev/shm. (Rank 0 named the shared
    array's segment before the others came, and only it removed the name; now it names it once
    every rank is in the call, and the others remove it should rank 0 die after that:
    tests/test_kill_anywhere.py.)"""
    import signal
    import subprocess
    import sys
    import uuid

    from shmcomm import segments

    job, go = f"test-heap0-{uuid.uuid4().hex[:8]}", tmp_path / "go"
    ranks = [subprocess.Popen([sys.executable, "-c", HEAP_RANK, str(r), job, str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (0, 1)]
    for p in ranks:
        assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # rank 0 is inside empty()
    ranks[0].send_signal(signal.SIGKILL)
    ranks[0].wait()
    go.touch()
    out = ranks[1].communicate(timeout=40)[0]
    assert ranks[1].returncode == 3 and "raised" in out, out
    assert not segments.list_segments(job=job)


# ---- small reductions run together in one step ----------------------------------------------------
def _batched_reductions(rank, size, mismatch_at, base):
    """Many all_reduce/reduce calls of mixed dtypes, ops and roots in flight. Ranks pause at
    different points, so each sees a different number of them queued when it runs a step: every
    rank must still complete the same calls with numpy's values. With ``mismatch_at``, that call
    has another size on rank 1: it (only) fails with CollectiveMismatchError on every rank."""
    dtypes = (np.float32, np.int64, np.float64, np.int16)
    works, checks = [], []
    for i in range(48):
        if i % (5 + rank) == 0:
            time.sleep(0.003)  # batch boundaries differ between ranks
        dtype = dtypes[i % len(dtypes)]
        n = base + i % 7 + (1 if i == mismatch_at and rank == 1 else 0)
        x = np.full(n, rank + i, dtype)
        kind = i % 3
        if kind == 0:
            works.append(sc.all_reduce(x, async_op=True))
            checks.append((i, x, np.full(n, sum(r + i for r in range(size)), dtype)))
        elif kind == 1:
            root = i % size
            works.append(sc.reduce(x, dst=root, op=sc.ReduceOp.MAX, async_op=True))
            checks.append((i, x, np.full(n, (size - 1 if rank == root else rank) + i, dtype)))
        else:
            works.append(sc.all_reduce(x, op=sc.ReduceOp.MIN, async_op=True))
            checks.append((i, x, np.full(n, i, dtype)))
    for (i, got, want), w in zip(checks, works):
        if i == mismatch_at:
            with pytest.raises(sc.CollectiveMismatchError):
                w.wait()
            continue
        assert w.wait() is True
        np.testing.assert_array_equal(got, want, err_msg=f"call {i}")
    y = np.ones(3)
    sc.all_reduce(y)  # the group is still in step
    assert (y == size).all()
    from shmcomm.world import default_group

    return default_group()._comm.fused_calls


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("mismatch_at", [None, 9])
# small (one step) and medium (two steps) calls; 30000 elements fill a quarter of a slot or more,
# so a batch placed along the slot (layout.pxi's _slot_shift) often has room for its first only
@pytest.mark.parametrize("base", [1, 6000, 30000])
def test_reductions_in_flight_run_together_and_stay_in_step(world, mismatch_at, base):
    fused = run_ranks(_batched_reductions, world, mismatch_at, base)
    assert sum(fused) > 0, "no call ran together with another: the test did not exercise batching"


def _same_array_in_flight(rank, size, count):
    """Reductions in flight on one array, between calls on others: each must read the result of
    the one before it (issue order), as in torch.distributed. They used to run in one batch,
    each from the array's first values: three all_reduces of ones at 2 ranks left 2 or 4, not 8."""
    x = np.ones(count, np.float64)
    others = [np.full(count, float(i)) for i in range(3)]
    works = []
    for i in range(3):
        works.append(sc.all_reduce(x, async_op=True))
        works.append(sc.all_reduce(others[i], async_op=True))
    works.append(sc.reduce(x, dst=size - 1, async_op=True))
    y = x[1:]  # an overlapping view, not the same array
    works.append(sc.all_reduce(y, op=sc.ReduceOp.MAX, async_op=True))
    for w in works:
        w.wait()
    want = float(size ** 3) * (size if rank == size - 1 else 1)
    np.testing.assert_array_equal(x[1:], np.full(count - 1, float(size ** 4)))  # the root's, by MAX
    assert x[0] == want, (x[0], want)
    for i, o in enumerate(others):
        assert (o == i * size).all()
    return float(x[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("count", [5, 6000])  # small (one step) and medium (two steps) calls
def test_reductions_in_flight_on_one_array_run_in_issue_order(world, count):
    got = run_ranks(_same_array_in_flight, world, count)
    assert got == [float(world ** 4)] * world  # the MAX of y: the root's n**4 everywhere


def _destroy_from_a_callback(rank, size):
    """A Future callback that destroys the group (it runs on whichever thread completes the op,
    the progress thread included): the group goes away cleanly, later calls get a clear error."""
    if rank == 1:
        time.sleep(0.2)  # rank 0's op is pending when its callback is added
    done = threading.Event()
    w = sc.all_reduce(np.ones(4), async_op=True)
    w.get_future().add_done_callback(lambda f: (sc.destroy_process_group(), done.set()))
    assert done.wait(20), "the callback never ran"
    assert w.is_success() and not sc.is_initialized()
    with pytest.raises(ValueError, match="not initialized"):
        sc.all_reduce(np.ones(4))
    return True


@pytest.mark.timeout(60)
def test_a_callback_may_destroy_the_group():
    assert all(run_ranks(_destroy_from_a_callback, 2))


def _drop_works_with_futures(rank, size, n):
    """Works whose Future was handed out, dropped as soon as wait() returns, while the progress
    thread completes them (eager 256 KiB ops; wait with a timeout leaves them to it). The thread
    used to read the op's future flag after publishing DONE: by then the waiter could have freed
    the op (a SIGSEGV on the progress thread in about 1 run of 30 of functional_mixed.py under
    CPU load; under AddressSanitizer with PYTHONMALLOC=malloc such a read is reported)."""
    x = np.ones(1 << 16, np.float32)
    settled = []
    for i in range(n):
        work = sc.all_reduce(x, async_op=True)
        fut = work.get_future().then(lambda f: settled.append(1))
        if i % 2:
            work.wait(timeout=30)
        else:
            work.wait()
        del work
        fut.wait()
        x[:] = 1
    # a Future handed out and never waited for, its Work dropped at once: still settled
    futs = [sc.all_reduce(np.ones(1 << 16, np.float32), async_op=True).get_future() for _ in range(8)]
    values = [f.wait()[0][0] for f in futs]
    assert values == [float(size)] * 8
    assert len(settled) == n
    return True


@pytest.mark.timeout(120)
def test_works_dropped_after_wait_with_futures_handed_out():
    assert all(run_ranks(_drop_works_with_futures, 2, 300 if os.environ.get("SHMCOMM_ASAN") else 1000))


def _callback_waits_for_its_own_collective(rank, size):
    """A then() callback runs on the thread that completed the operation, often the progress
    thread; one that issues a collective and waits on its Future blocked that thread, the only
    one left to run the collective (Future.wait runs nothing): a hang, cut here by the timeout.
    Now a Future asked for on the progress thread runs its op there first."""
    def step(fut):
        return sc.all_reduce(fut.value()[0] * 2, async_op=True).get_future().wait(timeout=20)

    fut = sc.all_reduce(np.ones(3), async_op=True).get_future()
    got = fut.then(step).then(step).wait(timeout=30)
    np.testing.assert_array_equal(got[0], np.full(3, 2.0 * size * 2 * size * size))
    # waited through Futures only (nobody calls Work.wait): every op still runs
    values = sc.wait_all([sc.all_reduce(np.full(2, float(i)), async_op=True).get_future() for i in range(50)])
    assert [v[0][0] for v in values] == [float(i * size) for i in range(50)]
    return True


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_a_callback_may_wait_for_a_collective_it_issued(world):
    assert all(run_ranks(_callback_waits_for_its_own_collective, world))


def _future_waited_inside_an_operation(rank, size):
    """An operation of the group (ProcessGroup.run, as the torch backend's composites) that
    issues an async op and waits on its Future: that op queues behind the running one, so no
    thread can run it. Future.wait runs the queue as Work.wait does and says so at once; it
    waited for ever before (for the group's timeout)."""
    from shmcomm.world import default_group

    pg = default_group()
    seen = []

    def composite():
        fut = sc.all_reduce(np.ones(2), async_op=True).get_future()
        t0 = time.monotonic()
        with pytest.raises(sc.ShmcommError, match="issued on the same group after it"):
            fut.wait()
        seen.append(time.monotonic() - t0)
        return fut

    pg.run(composite, (), [], False)
    (elapsed,) = seen
    assert elapsed < 5, elapsed
    x = np.ones(3)
    sc.all_reduce(x)  # the queued op ran after the composite; the group goes on
    assert (x == size).all()
    return True


@pytest.mark.timeout(60)
def test_a_future_waited_inside_an_operation_of_its_group_raises_at_once():
    assert all(run_ranks(_future_waited_inside_an_operation, 2))


def _futures_run_their_ops(rank, size):
    """Futures of async ops waited for in every way a user can (wait, a then() chain, wait_all,
    collect_all), with and without a timeout, each giving the reduced values."""
    x = [np.full(3, float(i + rank)) for i in range(6)]
    works = [sc.all_reduce(a, async_op=True) for a in x]
    total = sum(range(size))
    assert works[0].get_future().wait()[0][0] == size * 0 + total
    assert works[1].get_future().then(lambda f: f.value()[0][0] * 10).wait() == 10 * (size * 1 + total)
    assert [v[0][0] for v in sc.wait_all([w.get_future() for w in works[2:4]])] == \
        [size * i + total for i in (2, 3)]
    done = sc.collect_all([w.get_future() for w in works[4:]]).wait(timeout=30)
    assert [f.value()[0][0] for f in done] == [size * i + total for i in (4, 5)]
    assert sc.all_reduce(np.ones(2), async_op=True).get_future().wait(timeout=30)[0][0] == size
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_futures_of_async_ops_in_every_way_of_waiting(world):
    assert all(run_ranks(_futures_run_their_ops, world))


def _callback_waits_on_a_work_with_a_timeout(rank, size):
    """A then() callback on the progress thread that waits on a Work with a timeout: a limited
    wait leaves the queue to the progress thread, which is this very thread, so it always timed
    out. On the progress thread Work.wait runs the queue itself, limit or not."""
    def step(fut):
        work = sc.all_reduce(fut.value()[0] + 1, async_op=True)
        work.wait(timeout=20)
        return work.result()

    got = sc.all_reduce(np.ones(3), async_op=True).get_future().then(step).wait(timeout=30)
    np.testing.assert_array_equal(got[0], np.full(3, (size + 1.0) * size))
    return True


@pytest.mark.timeout(90)
def test_a_callback_may_wait_on_a_work_with_a_timeout():
    assert all(run_ranks(_callback_waits_on_a_work_with_a_timeout, 2))
