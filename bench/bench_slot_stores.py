"""Launch-to-launch spread of all_reduce through the slots, by the stores that write them.

The copies into the shared slots go out with normal stores (lines stay dirty in the writer's cache
and each reader takes them from there) or streaming ones (lines go to memory). Which is faster
depends on where the machine runs the ranks' cores, and that changes between launches and within
one (src_cython/slot_stores.pxi). This launches the job ``--launches`` times; in each launch three
groups of the same ranks run all_reduce in alternated rounds:

  normal     normal stores only (the group's mask fixed at 0)
  streaming  streaming stores only (mask fixed at every class)
  adaptive   the default: rank 0 measures and chooses per size class as the group runs

and it prints, per size, each launch's median time per call (us) of each, then for each way the
spread over launches (slowest launch's median / fastest). A way that is robust to the machine's
modes has a small spread; the adaptive one should follow the faster of the other two.

Example (2 ranks, 7 launches, about a minute on 2 cores)::

    python bench/bench_slot_stores.py
    python bench/bench_slot_stores.py --ranks 3 --sizes 16K,64K --launches 5
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

WAYS = ("normal", "streaming", "adaptive")


def parse_size(text: str) -> int:
    """``parse_size("64K") == 65536``; K and M are powers of 1024."""
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def one_launch(rank: int, size: int, sizes: list[int], rounds: int) -> dict:
    """One launch: {(nbytes, way): median us per call}, and the adaptive group's final mask."""
    groups = {way: sc.new_group(list(range(size))) for way in WAYS}
    groups["normal"]._comm._fix_slot_stores(0)
    groups["streaming"]._comm._fix_slot_stores(0xFFFF)
    out = {}
    for nbytes in sizes:
        a = np.ones(nbytes // 4, np.float32)
        reps = max(20, min(400, (4 << 20) // nbytes))
        for g in groups.values():  # the adaptive group probes early, then ever less often
            for _ in range(600):
                sc.all_reduce(a, group=g)
        times = {way: [] for way in WAYS}
        for rnd in range(rounds):
            for way in WAYS if rnd % 2 == 0 else WAYS[::-1]:
                g = groups[way]
                sc.barrier(group=g)
                t = time.perf_counter()
                for _ in range(reps):
                    sc.all_reduce(a, group=g)
                times[way].append((time.perf_counter() - t) / reps * 1e6)
        for way in WAYS:
            out[(nbytes, way)] = statistics.median(times[way])
    return {"times": out, "adaptive_mask": groups["adaptive"]._comm.slot_stores}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes", default="16K,64K,128K", help="comma list (K, M) (default 16K,64K,128K)")
    p.add_argument("--launches", type=int, default=7)
    p.add_argument("--rounds", type=int, default=9, help="alternated rounds per size and launch (default 9)")
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    launches = []
    for i in range(args.launches):
        launches.append(sc.spawn(one_launch, args.ranks, (sizes, args.rounds))[0])
        print(f"launch {i + 1}/{args.launches} done", file=sys.stderr, flush=True)
    print(f"# all_reduce float32 sum, {args.ranks} ranks, {os.cpu_count()} cores, {args.launches} launches; "
          f"us per call (median of {args.rounds} alternated rounds) as normal / streaming / adaptive stores")
    for nbytes in sizes:
        cells = ["/".join(f"{run['times'][(nbytes, w)]:.2f}" for w in WAYS) for run in launches]
        print(f"{nbytes >> 10:>6} KiB  " + "  ".join(cells))
    print("# spread over launches (slowest median / fastest), and the median over launches (us)")
    for nbytes in sizes:
        parts = []
        for w in WAYS:
            v = [run["times"][(nbytes, w)] for run in launches]
            parts.append(f"{w} {max(v) / min(v):.2f} ({statistics.median(v):.2f})")
        print(f"{nbytes >> 10:>6} KiB  " + "  ".join(parts))
    print("# adaptive group's mask at the end of each launch (bit b: size class 4 KiB << b streams): "
          + " ".join(hex(run["adaptive_mask"]) for run in launches))


if __name__ == "__main__":
    main()
