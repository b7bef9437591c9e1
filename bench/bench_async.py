"""Async collectives against synchronous ones, measured in the same processes, round by round.

Cases (all_reduce, float32 sum; the time per op, rank 0, mean over a loop of back-to-back calls):

* ``sync``         ``sc.all_reduce(x)``
* ``async+wait``   ``sc.all_reduce(x, async_op=True).wait()``: an async op waited at once
* ``4 in flight``  four ``async_op=True`` calls, then four waits (time per op)
* with torch installed, at 8 KiB: ``dist.all_reduce`` and ``fc.wait_tensor(fc.all_reduce(...))``
  (functional collectives) on the "shmcomm" backend

Each round measures every case once; the table gives the median over rounds and the ratio to
``sync`` (the median of the per-round ratios, with their range). The overlap section issues a
large async all_reduce, computes for about as long as the all_reduce takes, then waits; it reports
how much of the shorter of the two was hidden::

    python bench/bench_async.py                 # 2 ranks
    python bench/bench_async.py -n 4 --rounds 9 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import checkout  # noqa: E402 - bench/checkout.py, beside this script

checkout.use_checkout()  # this checkout where built in place, else the installed shmcomm

SIZES = (8, 64 << 10)
TORCH_BYTES = 8 << 10


def _loop_time(call, iters: int) -> float:
    import shmcomm as sc

    sc.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def _numpy_cases(np, sc, nbytes: int):
    x = np.ones(max(nbytes // 4, 1), np.float32)
    xs = [np.ones_like(x) for _ in range(4)]

    def in_flight():
        works = [sc.all_reduce(a, async_op=True) for a in xs]
        for w in works:
            w.wait()

    return {
        f"sync {nbytes} B": (lambda: sc.all_reduce(x), 1),
        f"async+wait {nbytes} B": (lambda: sc.all_reduce(x, async_op=True).wait(), 1),
        f"4 in flight {nbytes} B": (in_flight, 4),
    }


def _torch_cases():
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    import shmcomm.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    dist.init_process_group("shmcomm")  # env://: RANK, WORLD_SIZE, MASTER_* from the launcher
    t = torch.ones(TORCH_BYTES // 4)
    group = dist.group.WORLD
    return {
        f"torch dist.all_reduce {TORCH_BYTES} B": (lambda: dist.all_reduce(t), 1),
        f"torch fc.all_reduce+wait_tensor {TORCH_BYTES} B":
            (lambda: fc.wait_tensor(fc.all_reduce(t, "sum", group)), 1),
    }


def _overlap(np, sc, nbytes: int, rounds: int) -> dict:
    """Large async all_reduce with compute in between, against the two one after the other."""
    x = np.ones(nbytes // 4, np.float32)
    work_in = np.random.default_rng(0).random(1 << 16)

    def compute(reps):
        acc = 0.0
        for _ in range(reps):
            acc += float(np.sort(work_in)[0])
        return acc

    def timed(call):
        sc.barrier()
        t0 = time.perf_counter()
        call()
        return time.perf_counter() - t0

    timed(lambda: sc.all_reduce(x))  # warm-up: page faults
    comm = statistics.median(timed(lambda: sc.all_reduce(x)) for _ in range(rounds))
    one = statistics.median(timed(lambda: compute(1)) for _ in range(rounds))
    reps = max(1, round(comm / one))
    comp = statistics.median(timed(lambda: compute(reps)) for _ in range(rounds))

    def overlapped():
        w = sc.all_reduce(x, async_op=True)
        compute(reps)
        w.wait()

    both = statistics.median(timed(overlapped) for _ in range(rounds))
    hidden = (comm + comp - both) / min(comm, comp)
    return {"bytes": nbytes, "all_reduce_s": comm, "compute_s": comp, "overlapped_s": both,
            "hidden_fraction": hidden}


def _worker(rank: int, size: int, rounds: int, iters: int, use_torch: bool,
            overlap_bytes: int) -> tuple:
    """One rank (started by sc.spawn, already in the default group): ({case: seconds per op, one
    per counted round}, the overlap figures or None)."""
    import numpy as np

    import shmcomm as sc

    cases = {}
    for nbytes in SIZES:
        cases.update(_numpy_cases(np, sc, nbytes))
    if use_torch:
        cases.update(_torch_cases())
    times = {name: [] for name in cases}
    for round_ in range(rounds + 1):  # round 0 warms up and is dropped
        for name, (call, ops) in cases.items():
            times[name].append(_loop_time(call, iters) / ops)
    overlap = _overlap(np, sc, overlap_bytes, max(3, rounds)) if overlap_bytes else None
    if use_torch:
        import torch.distributed as dist

        dist.destroy_process_group()
    return {name: t[1:] for name, t in times.items()}, overlap


def _have_torch() -> bool:
    try:
        import torch.distributed as dist  # noqa: F401
    except ImportError:
        return False
    return dist.is_available()


def main(argv: list[str] | None = None) -> int:
    import shmcomm as sc
    from shmcomm.bench.sizes import parse_size

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", "--nranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=2000, help="calls per case and round")
    p.add_argument("--overlap-size", type=parse_size, default=32 << 20,
                   help="bytes of the overlap case's all_reduce (0: skip it)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch cases")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    use_torch = not args.no_torch and _have_torch()
    env_threads = os.environ.setdefault("OMP_NUM_THREADS", "1")  # the ranks inherit it
    # The ranks import shmcomm afresh: make it this checkout's too.
    results = sc.spawn(_worker, args.nranks, args=(args.rounds, args.iters, use_torch, args.overlap_size),
                       timeout=120.0)
    times, overlap = results[0]
    rows = []
    print(f"# bench_async: {args.nranks} ranks, {args.rounds} rounds x {args.iters} calls, rank 0, "
          f"OMP_NUM_THREADS={env_threads}")
    print(f"{'case':44s} {'median us':>10s} {'x sync':>8s} {'range':>13s}")
    for name, ts in times.items():
        reference = _reference(name)
        med = statistics.median(ts) * 1e6
        if reference and reference in times:
            ratios = [a / b for a, b in zip(ts, times[reference])]
            ratio, lo, hi = statistics.median(ratios), min(ratios), max(ratios)
            rtext = f"{ratio:8.2f} {lo:6.2f}-{hi:<6.2f}"
        else:
            ratio = lo = hi = None
            rtext = f"{'':8s} {'':13s}"
        print(f"{name:44s} {med:10.2f} {rtext}")
        rows.append({"case": name, "median_us": med, "ratio": ratio, "ratio_min": lo, "ratio_max": hi,
                     "round_us": [t * 1e6 for t in ts]})
    if overlap:
        print(f"overlap: all_reduce {overlap['bytes'] >> 20} MiB {overlap['all_reduce_s'] * 1e3:.2f} ms, "
              f"compute {overlap['compute_s'] * 1e3:.2f} ms, both overlapped "
              f"{overlap['overlapped_s'] * 1e3:.2f} ms: {100 * overlap['hidden_fraction']:.0f}% of "
              f"the shorter hidden")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nranks": args.nranks, "rows": rows, "overlap": overlap}, f, indent=1)
    return 0


def _reference(name: str) -> str | None:
    """The synchronous case a row is compared with."""
    if name.startswith("torch fc."):
        return f"torch dist.all_reduce {TORCH_BYTES} B"
    for prefix in ("async+wait ", "4 in flight "):
        if name.startswith(prefix):
            return "sync " + name[len(prefix):]
    return None


if __name__ == "__main__":
    sys.exit(main())
