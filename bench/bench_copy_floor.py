"""Large all_reduce against the memory floor: one ``np.copyto`` of the same size, same processes.

The issue's targets compare a 32 MiB all_reduce with one 32 MiB ``np.copyto`` (the cost of moving
the bytes once). Both are measured here in the same two ranks, interleaved round by round, so a
shared machine's drift hits them alike:

* ``copyto``       rank 0 copies one private array into another (rank 1 waits at a barrier)
* ``numpy``        ``sc.all_reduce`` on private numpy arrays (refilled before every call)
* ``sc.empty``     ``sc.all_reduce`` on arrays in shared memory (``sc.empty``; refilled too)

Each round times ``--iters`` calls of each case; the median of the rounds' means is reported with
the ratio to ``copyto``::

    python bench/bench_copy_floor.py                   # 32 MiB, 2 ranks
    python bench/bench_copy_floor.py --size 8M --rounds 9 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import checkout  # noqa: E402 - bench/checkout.py, beside this script

checkout.use_checkout()  # this checkout where built in place, else the installed shmcomm

CASES = ("copyto", "numpy", "sc.empty")


def _worker(rank: int, size: int, nbytes: int, rounds: int, iters: int) -> tuple:
    """One rank (started by sc.spawn, already in the default group): ({case: mean seconds per
    call, one per counted round}, whether the sums were right)."""
    import numpy as np

    import shmcomm as sc

    count = nbytes // 4
    private = np.ones(count, np.float32)
    shared = sc.empty(count, np.float32)
    src, dst = np.ones(count, np.float32), np.zeros(count, np.float32)
    times = {case: [] for case in CASES}

    def timed(case: str, call, refill) -> None:
        total = 0.0
        for i in range(iters):
            if refill is not None:
                refill.fill(i % 4 + 1)
            sc.barrier()
            t0 = time.perf_counter()
            call()
            total += time.perf_counter() - t0
        times[case].append(total / iters)

    for _ in range(rounds + 1):  # the first round warms up (page faults) and is dropped below
        timed("copyto", (lambda: np.copyto(dst, src)) if rank == 0 else (lambda: None), src)
        timed("numpy", lambda: sc.all_reduce(private), private)
        timed("sc.empty", lambda: sc.all_reduce(shared), shared)
    expected = float(sum(((iters - 1) % 4 + 1) for _ in range(size)))
    ok = bool(private[0] == expected and private[-1] == expected and shared[count // 2] == expected)
    del shared  # before sc.spawn leaves the group
    return {case: t[1:] for case, t in times.items()}, ok


def main(argv: list[str] | None = None) -> int:
    import shmcomm as sc
    from shmcomm.bench.sizes import parse_size  # the size syntax of shmcomm-bench (32M, 1K, ...)

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=parse_size, default=32 << 20, help="bytes per array (default 32M)")
    p.add_argument("-n", "--nranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=10, help="calls per case and round")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    # The ranks import shmcomm afresh: make it this checkout's too.
    results = sc.spawn(_worker, args.nranks, args=(args.size, args.rounds, args.iters), timeout=120.0)
    if not all(ok for _, ok in results):
        print("wrong all_reduce result", file=sys.stderr)
        return 1
    # Per round, the slowest rank's mean (a collective ends when its last rank returns).
    per_round = {case: [max(t[case][i] for t, _ in results) for i in range(args.rounds)]
                 for case in CASES}
    median = {case: statistics.median(v) * 1e6 for case, v in per_round.items()}
    print(f"# {args.size} B, {args.nranks} ranks, float32 sum; median over {args.rounds} rounds of "
          f"{args.iters} calls; per round the slowest rank")
    print(f"{'case':<10}{'median (us)':>14}{'range (us)':>24}{'/ copyto':>10}")
    for case in CASES:
        lo, hi = min(per_round[case]) * 1e6, max(per_round[case]) * 1e6
        spread = f"{lo:.0f}-{hi:.0f}"
        print(f"{case:<10}{median[case]:>14.1f}{spread:>24}{median[case] / median['copyto']:>10.2f}")
    if args.json:
        with open(args.json, "w") as f:
            rounds_us = {c: [t * 1e6 for t in v] for c, v in per_round.items()}
            json.dump({"size": args.size, "nranks": args.nranks, "rounds": args.rounds, "iters": args.iters,
                       "median_us": median, "round_us": rounds_us}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
