"""How waiting behaves on a shared machine: two ranks the scheduler keeps on one core part, and
nobody's CPU affinity changes."""

import ctypes
import os
import time

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks


def _start_on_one_core_then_reduce(rank, size):
    """Both ranks start on the first usable core, then may use every core they had (as the
    scheduler leaves them after futex wake-ups with busy processes on the other cores)."""
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mask)})
    sc.barrier()
    os.sched_setaffinity(0, mask)
    getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
    x = np.ones(2, np.float32)
    cpus = []
    for i in range(10000):  # the last 2000 calls, once the scheduler and the move had time
        sc.all_reduce(x)
        if i >= 8000:
            cpus.append(getcpu())
    return cpus, os.sched_getaffinity(0) == mask


def _cpu_times() -> dict[int, tuple[int, int]]:
    """(busy, idle) jiffies of each CPU, from /proc/stat."""
    times = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name != "cpu":
                values = [int(v) for v in fields]
                idle = values[3] + values[4]  # idle + iowait
                times[int(name[3:])] = (sum(values) - idle, idle)
    return times


def _wait_for_idle_cpus(limit: float) -> bool:
    """Wait up to ``limit`` seconds until, over 0.2 s, the usable CPUs were at least 80% idle."""
    usable = os.sched_getaffinity(0)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        before = _cpu_times()
        time.sleep(0.2)
        after = _cpu_times()
        busy = sum(after[c][0] - before[c][0] for c in usable if c in after and c in before)
        idle = sum(after[c][1] - before[c][1] for c in usable if c in after and c in before)
        if busy + idle and idle >= 0.8 * (busy + idle):
            return True
    return False


@pytest.mark.timeout(150)
def test_ranks_left_on_one_core_end_on_two_with_their_affinity_unchanged():
    """Up to three runs, each once the CPUs are idle: the other core must be free for the ranks to
    move there, and the suite runs two tests at a time (CI runs found it busy: 1149 of 2000 calls
    together; then 1879, 1947 and 1323 in three runs back to back)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable cores")
    seen = []
    for _ in range(3):
        if not _wait_for_idle_cpus(30.0):
            pytest.skip("every usable CPU stayed busy for 30 s (the suite's other worker): the ranks "
                        f"had no free core to move to (runs so far: {seen})")
        (cpus0, kept0), (cpus1, kept1) = run_ranks(_start_on_one_core_then_reduce, 2)
        assert kept0 and kept1, "a rank's CPU affinity was changed"
        # the calls after the first 8000, each seen by both ranks at about the same moment
        seen.append(sum(a == b for a, b in zip(cpus0, cpus1)))
        if seen[-1] < len(cpus0) // 2:
            return
    pytest.fail(f"of the last {len(cpus0)} calls of each of 3 runs, {seen} had both ranks on one CPU")


def test_spin_budget_regrows_after_a_peer_that_was_only_being_woken():
    """The adaptive spin budget (ns): doubled after a wait that ended while spinning or within
    200 us after (a peer being woken), halved after a longer one, between 20 us and the most.
    Counting woken peers as failures held 16 ranks on 16 cores at the floor."""
    from shmcomm._core import _next_spin_budget as after

    most = 2_000_000
    assert after(100_000, most, 1, 50_000) == 200_000  # caught while spinning
    assert after(1_500_000, most, 1, 10) == most  # never past the most
    assert after(100_000, most, 2, 100_000 + 150_000) == 200_000  # woken soon after: more would have caught it
    assert after(100_000, most, 2, 100_000 + 250_000) == 50_000  # a busy peer: give the core back
    assert after(30_000, most, 2, 10_000_000) == 20_000  # down to the floor, no lower
    assert after(30_000, most, 0, 50_000_000) == 20_000  # slept a whole slice
    assert after(10_000, 10_000, 0, 50_000_000) == 10_000  # a most below the floor is the floor
    # every rank at the floor, each peer woken 70 us after its waiter gave up: a few waits and
    # the budget covers the wake-up, after which waits end while spinning
    budget, wake = 20_000, 70_000
    for _ in range(3):
        got = 1 if budget >= wake else 2
        budget = after(budget, most, got, min(budget, wake) + (0 if got == 1 else wake))
    assert budget >= wake
