"""Waiting: the adaptive spin budget recovers when peers are back, and stays idle-friendly.

The budget halved after every wait that had to sleep, down to 20 us, below a futex wake-up
(~50 us): once both ranks slept they woke each other for every step, and small collectives stuck
at ~50 us per call for thousands of calls (issue #33). These tests drive both ranks to the floor
with alternating pauses, then run back-to-back calls.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks


def _recovers_after_pauses(rank, size):
    x = np.ones(1)
    for i in range(16):  # each rank in turn arrives 30 ms late: the other's waits sleep
        if i % 2 == rank:
            time.sleep(0.03)
        sc.all_reduce(x)
    times = []
    for _ in range(2000):
        start = time.perf_counter()
        sc.all_reduce(x)
        times.append(time.perf_counter() - start)
    return float(np.median(times[-500:])) * 1e6


@pytest.mark.timeout(60)
def test_spin_budget_recovers_once_the_peer_is_back():
    # Not a speed test: a rank stuck on the sleep path pays a futex wake-up (tens of us) per
    # step, a spinning one about a microsecond; 25 us separates the two by a wide margin.
    medians = run_ranks(_recovers_after_pauses, 2, env={"SHMCOMM_SPIN_US": 2000})
    assert max(medians) < 25, f"median per call after the pauses: {medians} us"


def test_the_budget_grows_after_a_short_sleep_and_shrinks_after_a_long_one():
    from shmcomm._core import spin_after_wait

    assert spin_after_wait(20, 2000, False, 60) == 120  # woken by a peer back in 60 us: grow
    assert spin_after_wait(1000, 2000, False, 60) == 2000
    assert spin_after_wait(100, 2000, True, 50) == 200  # caught while spinning: regrow
    assert spin_after_wait(2000, 2000, False, 30_000) == 1000  # the peer was away: halve
    assert spin_after_wait(30, 2000, False, 50_000) == 20  # never below the floor
    assert spin_after_wait(0, 0, False, 60) == 0  # no spinning at all (ranks outnumber cores)
