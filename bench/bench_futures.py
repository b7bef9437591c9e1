"""Compare shmcomm's compiled Future with torch.futures.Future on three micro-benchmarks.

Run:  python bench/bench_futures.py [--number N] [--repeat R]

Prints the best per-operation time of each implementation (timeit, best of R repeats) and the
ratio shmcomm / torch (lower is better). Measures:
  create+set+wait   Future(); set_result(1); wait()
  then-chain        f = Future(); c = f.then(cb); f.set_result(1); c.wait()
  collect_all(100)  collect_all(100 done futures).wait()
Set SHMCOMM_FUTURE_IMPL=module to measure another module that provides Future/collect_all.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import timeit


def _cases(mod):
    Future, collect_all = mod.Future, mod.collect_all

    def cb(f):
        return f.value()

    done = []
    for i in range(100):
        f = Future()
        f.set_result(i)
        done.append(f)
    env = {"Future": Future, "collect_all": collect_all, "cb": cb, "done": done}
    return [
        ("create+set+wait", "f = Future(); f.set_result(1); f.wait()", env),
        ("then-chain", "f = Future(); c = f.then(cb); f.set_result(1); c.wait()", env),
        ("collect_all(100)+wait", "collect_all(done).wait()", env),
    ]


def _best(stmt: str, env: dict, number: int, repeat: int) -> float:
    times = timeit.repeat(stmt, globals=env, number=number, repeat=repeat)
    return min(times) / number


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000,
                        help="calls per timing (default 20000)")
    parser.add_argument("--repeat", type=int, default=7, help="timings per case; best kept (7)")
    args = parser.parse_args(argv)

    impl = importlib.import_module(os.environ.get("SHMCOMM_FUTURE_IMPL", "shmcomm"))
    try:
        import torch.futures as tf
    except ImportError:
        tf = None

    ours = _cases(impl)
    theirs = _cases(tf) if tf is not None else [None] * len(ours)
    print(f"Python {sys.version.split()[0]}; shmcomm impl: {impl.__name__}; "
          f"torch: {tf and __import__('torch').__version__}; best of {args.repeat} x {args.number}")
    print(f"{'case':<24}{'shmcomm':>12}{'torch':>12}{'ratio':>10}")
    for mine, ref in zip(ours, theirs):
        name, stmt, env = mine
        number = max(1, args.number // 20) if "collect" in name else args.number
        t_ours = _best(stmt, env, number, args.repeat)
        if ref is None:
            print(f"{name:<24}{t_ours * 1e6:>10.3f}us{'-':>12}{'-':>10}")
            continue
        t_ref = _best(ref[1], ref[2], number, args.repeat)
        print(f"{name:<24}{t_ours * 1e6:>10.3f}us{t_ref * 1e6:>10.3f}us{t_ours / t_ref:>9.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
