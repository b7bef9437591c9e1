"""Launch-to-launch spread of all_reduce, each way of a tuned choice against the tuning itself.

Two choices are tuned as a group runs (src_cython/tuning.pxi), because which way is faster
depends on where the machine runs the ranks' cores, and that changes between launches and
within one:

  --choice stores  copies into the shared slots with normal stores (lines stay dirty in the
                   writer's cache and each reader takes them from there) or streaming ones
                   (lines go to memory); sizes below the single-copy size (default 16K,64K,128K)
  --choice paths   reductions of private arrays from the single-copy size by single copy or
                   through the slots (default sizes 256K,1M,4M)

This launches the job ``--launches`` times; in each launch three groups of the same ranks run
all_reduce in alternated rounds: the first way only, the second way only (each group's mask
fixed) and the tuned default. It prints, per size, each launch's median time per call (us) of
each, then for each way the spread over launches (slowest launch's median / fastest) and the
median over launches. The tuned group should follow the faster of the other two.

Example (2 ranks, 7 launches, under a minute on 2 cores)::

    python bench/bench_tuning.py
    python bench/bench_tuning.py --choice paths --ranks 3 --launches 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's shmcomm, installed or not

import numpy as np  # noqa: E402

import shmcomm as sc  # noqa: E402

CHOICES = {  # choice: (its ways, the Communicator._fix_tuning keyword, default sizes)
    "stores": (("normal", "streaming", "tuned"), "stores", "16K,64K,128K"),
    "paths": (("single copy", "slots", "tuned"), "paths", "256K,1M,4M"),
}


def parse_size(text: str) -> int:
    """``parse_size("64K") == 65536``; K and M are powers of 1024."""
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def one_launch(rank: int, size: int, choice: str, sizes: list[int], rounds: int) -> dict:
    """One launch: {(nbytes, way): median us per call}, and the tuned group's final mask."""
    ways, keyword, _ = CHOICES[choice]
    groups = {way: sc.new_group(list(range(size))) for way in ways}
    groups[ways[0]]._comm._fix_tuning(**{keyword: 0})
    groups[ways[1]]._comm._fix_tuning(**{keyword: 0xFFFF})
    out = {}
    for nbytes in sizes:
        a = np.ones(nbytes // 4, np.float32)
        reps = max(5, min(400, (4 << 20) // nbytes))
        for g in groups.values():  # the tuned group probes early, then ever less often
            for _ in range(max(200, 4 * reps)):
                sc.all_reduce(a, group=g)
        times = {way: [] for way in ways}
        for rnd in range(rounds):
            for way in ways if rnd % 2 == 0 else ways[::-1]:
                g = groups[way]
                sc.barrier(group=g)
                t = time.perf_counter()
                for _ in range(reps):
                    sc.all_reduce(a, group=g)
                times[way].append((time.perf_counter() - t) / reps * 1e6)
        for way in ways:
            out[(nbytes, way)] = statistics.median(times[way])
    tuned = groups["tuned"]._comm
    return {"times": out, "mask": tuned.slot_stores if choice == "stores" else tuned.reduce_paths}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--choice", choices=sorted(CHOICES), default="stores")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes", help="comma list (K, M) (default: the choice's)")
    p.add_argument("--launches", type=int, default=7)
    p.add_argument("--rounds", type=int, default=9, help="alternated rounds per size and launch (default 9)")
    args = p.parse_args()
    ways, _, default_sizes = CHOICES[args.choice]
    sizes = [parse_size(s) for s in (args.sizes or default_sizes).split(",")]
    launches = []
    for i in range(args.launches):
        launches.append(sc.spawn(one_launch, args.ranks, (args.choice, sizes, args.rounds))[0])
        print(f"launch {i + 1}/{args.launches} done", file=sys.stderr, flush=True)
    print(f"# all_reduce float32 sum, {args.ranks} ranks, {os.cpu_count()} cores, {args.launches} launches; "
          f"us per call (median of {args.rounds} alternated rounds) as {' / '.join(ways)}")
    for nbytes in sizes:
        cells = ["/".join(f"{run['times'][(nbytes, w)]:.2f}" for w in ways) for run in launches]
        print(f"{nbytes >> 10:>6} KiB  " + "  ".join(cells))
    print("# spread over launches (slowest median / fastest), and the median over launches (us)")
    for nbytes in sizes:
        parts = []
        for w in ways:
            v = [run["times"][(nbytes, w)] for run in launches]
            parts.append(f"{w} {max(v) / min(v):.2f} ({statistics.median(v):.2f})")
        print(f"{nbytes >> 10:>6} KiB  " + "  ".join(parts))
    print(f"# tuned group's {args.choice} mask at the end of each launch (bit b: size class 4 KiB << b "
          f"takes the second way): " + " ".join(hex(run["mask"]) for run in launches))


if __name__ == "__main__":
    main()
