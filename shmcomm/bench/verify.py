"""``--check``: the input patterns, the numpy references a correct result must equal, and the count
of wrong elements, for every dtype and op.

The references never call shmcomm: they are numpy's arithmetic on the patterns, with the
semantics the contract states (integers wrap; AVG on integers truncates the wrapped sum toward
zero; bool sums are logical or and products logical and, as numpy's; floats exact, rounded once).

Example::

    >>> from .dtypes import bench_dtype
    >>> dt = bench_dtype("int8")
    >>> reference(4, 2, dt, "bxor").tolist() == (pattern(0, 4, dt, "bxor") ^ pattern(1, 4, dt, "bxor")).tolist()
    True
"""

from __future__ import annotations

import numpy as np

from .dtypes import BenchDtype

SENTINEL = 99  # what outputs hold before a checked call; outside the patterns' range
# Tolerance of averages, the only inexact results (the library may round its sum differently).
_RTOL = {"float16": 1e-2, "bfloat16": 1e-2, "float32": 1e-5, "complex64": 1e-5}


def _values(rank: int, length: int, dt: BenchDtype, op: str) -> np.ndarray:
    """Exact input values of ``rank``: small integers, so every sum is exact in every dtype
    (float16 included) and wrong placement (rank or offset) shows as wrong values."""
    idx = np.arange(length, dtype=np.int64)
    base = (idx * 5 + rank * 3 + 1) % 9
    if dt.kind == "bool":
        return base % 2 == 1
    if op == "prod":  # factors of magnitude 1 or 2 keep products exact for many ranks
        table = {"uint": [1, 2, 3], "complex": [1, 2j, -1]}.get(dt.kind, [1, 2, -1])
        return np.array(table)[(idx + rank) % 3]
    if dt.kind == "uint":
        return base
    if dt.kind == "complex":
        return (base - 4) + 1j * ((idx * 3 + rank * 5 + 2) % 7 - 3)
    return base - 4


def pattern(rank: int, length: int, dt: BenchDtype, op: str) -> np.ndarray:
    """The input ``rank`` holds for the check, as an array of ``dt``."""
    return dt.encode(_values(rank, length, dt, op))


_REDUCE = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
           "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def reference(length: int, nranks: int, dt: BenchDtype, op: str) -> np.ndarray:
    """What a correct reduction with ``op`` over every rank's pattern holds, as an array of ``dt``."""
    exact = dt.exact()
    acc = _values(0, length, dt, op).astype(exact)
    with np.errstate(over="ignore"):
        for q in range(1, nranks):
            acc = _REDUCE[op](acc, _values(q, length, dt, op).astype(exact)).astype(exact)
        if op == "avg":
            if dt.kind in ("int", "uint"):  # truncate toward zero (as NCCL)
                wide = acc.astype(np.int64 if dt.kind == "int" else np.uint64)
                acc = np.sign(wide) * (np.abs(wide) // nranks) if dt.kind == "int" else wide // nranks
            else:
                acc = acc / nranks
    return dt.encode(acc)


def count_wrong(got: np.ndarray, expected: np.ndarray, dt: BenchDtype) -> int:
    """Elements of ``got`` that differ from ``expected`` (floats: beyond the rounding of an average)."""
    if dt.kind in ("float", "complex"):
        ok = np.isclose(dt.decode(got), dt.decode(expected), rtol=_RTOL.get(dt.name, 1e-12), atol=0.0,
                        equal_nan=True)
        return int(ok.size - np.count_nonzero(ok))
    return int(np.count_nonzero(got != expected))
