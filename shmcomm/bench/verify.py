"""``--check``: the input patterns, the numpy references a correct result must equal, and the count
of wrong elements."""

from __future__ import annotations

import numpy as np

from .common import _is_float

_SENTINEL = 99  # what outputs hold before a checked call; outside the patterns' range


def _pattern(rank: int, length: int, dtype: np.dtype, dtname: str, op: str) -> np.ndarray:
    """Input of ``rank`` for the check: small integers, so every sum is exact in every dtype
    (float16 included) and wrong placement (rank or offset) shows as wrong values."""
    idx = np.arange(length, dtype=np.int64)
    if op == "prod":  # factors 1, 2, -1 keep products exact powers of two for many ranks
        table = np.array([1, 2, 3] if dtname.startswith("uint") else [1, 2, -1], np.int64)
        values = table[(idx + rank) % 3]
    else:
        values = (idx * 5 + rank * 3 + 1) % 9
        if not dtname.startswith("uint"):
            values = values - 4
    return values.astype(dtype)


def _reference(length: int, nranks: int, dtype: np.dtype, dtname: str, op: str) -> np.ndarray:
    """The reduction over ranks of their patterns, computed the way a correct library must:
    integers wrap in their own dtype; floats are exact in float64 and rounded once at the end."""
    acc_dtype = np.float64 if _is_float(dtname) else dtype
    acc = _pattern(0, length, dtype, dtname, op).astype(acc_dtype)
    with np.errstate(over="ignore"):
        for q in range(1, nranks):
            x = _pattern(q, length, dtype, dtname, op).astype(acc_dtype)
            if op in ("sum", "avg"):
                acc = acc + x
            elif op == "prod":
                acc = acc * x
            elif op == "min":
                acc = np.minimum(acc, x)
            elif op == "max":
                acc = np.maximum(acc, x)
            else:
                acc = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op](acc, x)
        if op == "avg":
            acc = acc / nranks
        return acc.astype(dtype)


def _count_wrong(got: np.ndarray, expected: np.ndarray, dtname: str) -> int:
    """Elements of ``got`` that differ from ``expected`` (floats: beyond a few ulps of the dtype)."""
    if _is_float(dtname):
        rtol = {2: 1e-2, 4: 1e-5, 8: 1e-12}[expected.dtype.itemsize]
        ok = np.isclose(got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=0.0,
                        equal_nan=True)
        return int(ok.size - np.count_nonzero(ok))
    return int(np.count_nonzero(got != expected))
