"""Uneven counts against even ones, in the same processes: what pieces of different sizes cost.

Per total size, each round times (the median of the rounds is reported, with the ratio to
``even``):

* ``even``           ``sc.all_gather_into``: every rank holds total / n elements
* ``all_gather_v``   MPI's Allgatherv: rank r holds a share growing with r (same total)
* ``list``           torch's list form with those pieces (``sc.all_gather(outs, x)``)
* ``broadcasts``     the same pieces moved by n broadcasts, one per source rank: what the torch
                     backend did for uneven ``dist.all_gather`` before the native form
* ``rs_even`` / ``reduce_scatter_v``   the same for reduce_scatter::

    python bench/bench_uneven.py                        # 2 ranks, 4 KiB to 16 MiB (x8)
    python bench/bench_uneven.py -n 3 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import checkout  # noqa: E402 - bench/checkout.py, beside this script

checkout.use_checkout()  # this checkout where built in place, else the installed shmcomm

CASES = ("even", "all_gather_v", "list", "broadcasts", "rs_even", "reduce_scatter_v")


def _counts(total: int, n: int) -> list[int]:
    """Shares growing with the rank (1, 2, ..., n parts), summing to ``total``."""
    parts = n * (n + 1) // 2
    counts = [total * (q + 1) // parts for q in range(n)]
    counts[-1] += total - sum(counts)
    return counts


def _worker(rank: int, n: int, nbytes: int, rounds: int, iters: int) -> dict:
    import numpy as np

    import shmcomm as sc

    total = nbytes // 4 // n * n
    counts = _counts(total, n)
    even_in = np.full(total // n, rank + 1, np.float32)
    mine = np.full(counts[rank], rank + 1, np.float32)
    out = np.empty(total, np.float32)
    starts = np.cumsum([0] + counts)
    pieces = [out[starts[q]:starts[q + 1]] for q in range(n)]
    whole = np.ones(total, np.float32)
    rs_out_even, rs_out = np.empty(total // n, np.float32), np.empty(counts[rank], np.float32)

    def broadcasts():  # as the old fallback: its own piece copied in too
        for q in range(n):
            sc.broadcast(mine if q == rank else pieces[q], src=q)
        np.copyto(pieces[rank], mine)

    calls = {
        "even": lambda: sc.all_gather_into(out, even_in),
        "all_gather_v": lambda: sc.all_gather_v(out, mine, counts),
        "list": lambda: sc.all_gather(pieces, mine),
        "broadcasts": broadcasts,
        "rs_even": lambda: sc.reduce_scatter_into(rs_out_even, whole),
        "reduce_scatter_v": lambda: sc.reduce_scatter_v(rs_out, whole, counts),
    }
    # each form checked once, from a cleared output: rank q's piece holds q + 1
    want = np.repeat(np.arange(1, n + 1, dtype=np.float32), counts)
    for case in ("all_gather_v", "list", "broadcasts"):
        out.fill(0)
        calls[case]()
        assert np.array_equal(out, want), case
    calls["reduce_scatter_v"]()
    assert (rs_out == n).all()
    times = {case: [] for case in CASES}
    for r in range(rounds + 1):  # round 0 warms up (page faults) and is dropped
        for case in CASES:
            call = calls[case]
            sc.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            if r:
                times[case].append((time.perf_counter() - t0) / iters)
    return {case: statistics.median(v) for case, v in times.items()}


def main(argv=None) -> int:
    from shmcomm.bench.sizes import parse_size, sweep_sizes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--nranks", type=int, default=2)
    parser.add_argument("-b", "--min-bytes", default="4K")
    parser.add_argument("-e", "--max-bytes", default="32M")
    parser.add_argument("-f", "--step-factor", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=0, help="calls per round (default: by size)")
    args = parser.parse_args(argv)
    import shmcomm as sc

    rows = {}
    for nbytes in sweep_sizes(parse_size(args.min_bytes), parse_size(args.max_bytes),
                              args.step_factor):  # one spawn per size: iterations follow the size
        iters = args.iters or max(2, min(200, (64 << 20) // max(nbytes, 1) // 8))
        rows[nbytes] = sc.spawn(_worker, args.nranks, args=(nbytes, args.rounds, iters))[0]
    print(f"# {args.nranks} ranks, float32, median of {args.rounds} rounds; us per call "
          f"(ratio to the even form of the same total)")
    print(f"# {'bytes':>10} " + " ".join(f"{c:>18}" for c in CASES))
    for nbytes, t in rows.items():
        cells = []
        for case in CASES:
            base = t["rs_even" if case.startswith("r") else "even"]
            cells.append(f"{t[case] * 1e6:10.1f} ({t[case] / base:4.2f})")
        print(f"  {nbytes:>10} " + " ".join(f"{c:>18}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
