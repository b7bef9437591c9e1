"""Small-message latency on a loaded machine, window by window, and the CPU a blocked rank burns.

The practitioners' check of issue #33: two ranks run windows of 8-byte all_reduces with pauses
between them (as a training loop's small calls come in bursts), while ``--load`` busy processes
hold the cores. A wait that stopped spinning for good would show as windows stuck at a futex
wake-up (~50 us) long after the peer is back. Then one rank sleeps ``--blocked`` seconds inside
a collective's wait while its peer computes, and the waiting rank's CPU time over that span is
reported: waiting must stay idle-friendly.

Run from the repository root::

    python bench/bench_latency_floor.py                 # 2 busy processes, 40 windows of 500
    python bench/bench_latency_floor.py --load 0        # the same on an idle machine

Prints each window's median (us), the count of windows above 5 us, and the blocked rank's CPU %.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time


def _busy():
    while True:  # stopped with terminate(): a shared flag's lock would starve the setter
        pass


def _rank(rank, size, windows, calls, pause, blocked):
    import numpy as np

    import shmcomm as sc

    x = np.zeros(2, np.float32)
    medians = []
    for _ in range(windows):
        times = []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            sc.all_reduce(x)
            times.append(time.perf_counter_ns() - t0)
        medians.append(statistics.median(times) / 1000)
        sc.barrier()
        time.sleep(pause)
    sc.barrier()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if rank == 0:
        time.sleep(blocked)            # "computing": rank 1 waits for it inside all_reduce
    sc.all_reduce(x)
    cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    return medians, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the ranks")
    parser.add_argument("--windows", type=int, default=40)
    parser.add_argument("--calls", type=int, default=500, help="all_reduces per window")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between windows")
    parser.add_argument("--blocked", type=float, default=2.0, help="seconds a rank waits blocked")
    args = parser.parse_args()

    import shmcomm as sc

    hogs = [mp.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for hog in hogs:
        hog.start()
    try:
        results = sc.spawn(_rank, 2, args=(args.windows, args.calls, args.pause, args.blocked))
    finally:
        for hog in hogs:
            hog.terminate()
            hog.join()
    worst = [max(a, b) for a, b in zip(results[0][0], results[1][0])]
    print(f"# 8-byte all_reduce, 2 ranks, {args.load} busy processes on {os.cpu_count()} cores, "
          f"{args.windows} windows of {args.calls} calls, {args.pause * 1000:.0f} ms pauses")
    print("window medians (us, the slower rank's):", " ".join(f"{m:.1f}" for m in worst))
    print(f"windows above 5 us: {sum(m > 5 for m in worst)}/{len(worst)}; "
          f"median of medians {statistics.median(worst):.2f} us")
    print(f"rank 1 blocked {args.blocked:.1f} s in all_reduce: {100 * results[1][1]:.1f}% CPU")


if __name__ == "__main__":
    main()
