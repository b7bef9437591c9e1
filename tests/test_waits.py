"""How waiting behaves on a shared machine: two ranks the scheduler keeps on one core part, and
nobody's CPU affinity changes."""

import ctypes
import os

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


@pytest.mark.timeout(60)
def test_ranks_left_on_one_core_end_on_two_with_their_affinity_unchanged():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable cores")
    (cpus0, kept0), (cpus1, kept1) = run_ranks(_start_on_one_core_then_reduce, 2)
    assert kept0 and kept1, "a rank's CPU affinity was changed"
    # the calls after the first 2000, each seen by both ranks at about the same moment
    together = sum(a == b for a, b in zip(cpus0, cpus1))
    assert together < len(cpus0) // 2, f"{together} of the last {len(cpus0)} calls had both ranks on one CPU"
