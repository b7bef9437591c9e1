"""Reduction kernels alone, per SIMD level and dtype, against memcpy of the same bytes.

Run:  python bench/bench_kernels.py [--count 8388608] [--sources 2] [--op SUM] [--repeat 15]
                                    [--dtypes float32,float16,bfloat16,float64,int32,int8]

One process, no communication: each line times ``dst = src0 op src1 ...`` by one level's kernel
(``shmcomm._core.reduce_kernel``, what every collective reduction runs) on arrays larger than the
last-level cache, and a ``np.copyto`` of one array of the same size. Bandwidth counts every byte a
call reads and writes (kernel: sources + destination; copy: source + destination), so a kernel at
"memory speed" shows a ratio near 1. Best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _inputs(dtype: np.dtype, count: int, sources: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    if dtype.kind in "iu":
        return [rng.integers(0, 100, count).astype(dtype) for _ in range(sources)]
    return [rng.standard_normal(count).astype(np.float32).astype(dtype) for _ in range(sources)]


def main(argv=None) -> int:
    """Print one line per (dtype, level); returns 0.

    Example::

        python bench/bench_kernels.py --count 1048576 --dtypes float16
    """
    import shmcomm as sc
    from shmcomm import _core

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=8 << 20, help="elements per array (default 8M)")
    parser.add_argument("--sources", type=int, default=2, help="arrays reduced (ranks; default 2)")
    parser.add_argument("--op", default="SUM", help="a ReduceOp name (default SUM)")
    parser.add_argument("--repeat", type=int, default=15, help="runs per measurement; the best counts")
    parser.add_argument("--dtypes", default="float32,float16,bfloat16,float64,int32,int8")
    args = parser.parse_args(argv)
    op = int(sc.ReduceOp[args.op.upper()])
    print(f"{args.sources} sources x {args.count} elements, op {args.op.upper()}, best of {args.repeat}; "
          f"levels here: {', '.join(_core.simd_levels())} (in use: {_core.simd_level()})")
    print(f"{'dtype':<10}{'level':<10}{'MiB/array':>10}{'kernel ms':>11}{'GB/s':>8}"
          f"{'memcpy ms':>11}{'GB/s':>8}{'kernel/memcpy GB/s':>20}")
    for name in args.dtypes.split(","):
        if name == "bfloat16":
            import ml_dtypes

            dtype = np.dtype(ml_dtypes.bfloat16)
        else:
            dtype = np.dtype(name)
        srcs = _inputs(dtype, args.count, args.sources)
        dst, copy_dst = np.empty_like(srcs[0]), np.empty_like(srcs[0])
        nbytes = srcs[0].nbytes
        copy_s = _best(lambda: np.copyto(copy_dst, srcs[0]), args.repeat)
        copy_bw = 2 * nbytes / copy_s / 1e9
        for level in _core.simd_levels():
            t = _best(lambda: _core.reduce_kernel(dst, srcs, op, level), args.repeat)
            bw = (args.sources + 1) * nbytes / t / 1e9
            print(f"{name:<10}{level:<10}{nbytes / 2**20:>10.0f}{t * 1e3:>11.2f}{bw:>8.1f}"
                  f"{copy_s * 1e3:>11.2f}{copy_bw:>8.1f}{bw / copy_bw:>20.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
