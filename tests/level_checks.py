"""Rank functions (for ``harness.run_ranks``) that every composition level's tests run: a call
made differently by the ranks is named at once, and a rank killed in the middle of calls is a
peer failure at once, naming the dead process by its rank of the whole group."""

from __future__ import annotations

import os
import time

import numpy as np


def mismatch(rank: int, size: int, kind: str):
    """``kind`` "size": rank 0's array of 100 float64 is composed, the others' of 4 go the flat
    one-shot path; "op": every rank composes, rank 0 with sum, the others with max. Returns the
    seconds until CollectiveMismatchError and its text, or None."""
    import shmcomm as sc

    t0 = time.monotonic()
    try:
        if kind == "size":
            sc.all_reduce(np.ones(100 if rank == 0 else 4))
        else:
            sc.all_reduce(np.ones(100), op="sum" if rank == 0 else "max")
    except sc.CollectiveMismatchError as e:
        return time.monotonic() - t0, str(e)
    return None


def killed_mid_calls(rank: int, size: int):
    """The last rank kills itself at its 51st all_reduce of 512 KiB; the others return (seconds
    until PeerFailureError, its text, its rank, its pid, the dead rank's pid), or None."""
    import signal

    import shmcomm as sc

    pids = [None] * size
    sc.all_gather_object(pids, os.getpid())
    x = np.ones(1 << 16)
    t0 = time.monotonic()
    try:
        for i in range(100_000):
            if rank == size - 1 and i == 50:
                os.kill(os.getpid(), signal.SIGKILL)
            sc.all_reduce(x)
            x[...] = 1
    except sc.PeerFailureError as e:
        return time.monotonic() - t0, str(e), e.rank, e.pid, pids[size - 1]
    return None
