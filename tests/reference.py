"""Independent numpy references for the collectives' results and the inputs the tests feed them."""

from __future__ import annotations

import hashlib

import numpy as np

try:
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    BFLOAT16 = None

from shmcomm._core import DTYPE_NAMES, OP_NAMES  # the kernels' table: what to cover, not what to expect

# Every dtype of the table, as numpy dtypes (bfloat16 through ml_dtypes).
DTYPES = [BFLOAT16 if name == "bfloat16" else np.dtype(name) for name in DTYPE_NAMES
          if name != "bfloat16" or BFLOAT16 is not None]

# The public ReduceOp's ops; the kernels also have PREMUL_SUM (torch's scaled sum, with factors).
OPS = [name for name in OP_NAMES if name != "PREMUL_SUM"]
KERNEL_OPS = list(OP_NAMES)

# PREMUL_SUM factors, one per rank (each rank may scale by its own, as in NCCL).
FACTORS = (0.5, -1.25, 3.0, 0.1)


def ops_for(dtype: np.dtype) -> list[str]:
    """The reduce ops the spec allows for ``dtype`` (integer AVG truncates, as NCCL's)."""
    if dtype.kind == "b":
        return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    if dtype.kind in "iu":
        return ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"]
    if dtype.kind == "c":
        return ["SUM", "PRODUCT", "AVG"]
    return ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]


def kernel_ops_for(dtype: np.dtype) -> list[str]:
    """``ops_for`` plus PREMUL_SUM, which the kernels have for real floating types."""
    return ops_for(dtype) + (["PREMUL_SUM"] if dtype.kind == "f" or dtype == BFLOAT16 else [])


def make_input(dtype: np.dtype, count: int, rank: int, salt: int = 0) -> np.ndarray:
    """Deterministic input of rank ``rank``: every process can rebuild every rank's input."""
    rng = np.random.default_rng([rank, count, salt])
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    if dtype.kind == "i":
        return rng.integers(-50, 50, count).astype(dtype)
    if dtype.kind == "u":
        return rng.integers(0, 100, count).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(count) + 1j * rng.standard_normal(count)).astype(dtype)
    return rng.standard_normal(count).astype(np.float32).astype(dtype)


def _accumulate_type(dtype: np.dtype) -> np.dtype:
    if dtype == np.float16 or dtype == BFLOAT16:
        return np.dtype(np.float32)
    return dtype


def reduce_reference(inputs: list[np.ndarray], op: str, factors=FACTORS) -> np.ndarray:
    """Reduce in rank order, in the accumulate type, as the spec fixes it (PREMUL_SUM: input k
    times ``factors[k]`` in the accumulate type, rounded, then summed)."""
    dtype = inputs[0].dtype
    acc_t = _accumulate_type(dtype)
    if op == "PREMUL_SUM":
        with np.errstate(over="ignore", invalid="ignore"):
            acc = inputs[0].astype(acc_t) * acc_t.type(factors[0])
            for k, x in enumerate(inputs[1:], 1):
                acc = (acc + (x.astype(acc_t) * acc_t.type(factors[k])).astype(acc_t)).astype(acc_t)
        return acc.astype(dtype)
    if dtype.kind == "b":
        fn = {"SUM": np.logical_or, "PRODUCT": np.logical_and, "MIN": np.logical_and,
              "MAX": np.logical_or, "BAND": np.logical_and, "BOR": np.logical_or,
              "BXOR": np.logical_xor}[op]
    else:
        fn = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
              "AVG": np.add, "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
    with np.errstate(over="ignore", invalid="ignore"):
        acc = inputs[0].astype(acc_t)
        for x in inputs[1:]:
            x = x.astype(acc_t)
            if dtype.kind == "c" and op == "PRODUCT":  # textbook formula, no fused multiply-add
                re = acc.real * x.real - acc.imag * x.imag
                im = acc.real * x.imag + acc.imag * x.real
                acc = np.empty_like(acc)
                acc.real, acc.imag = re, im
            else:
                acc = fn(acc, x).astype(acc_t)
        if op == "AVG" and dtype.kind == "c":  # each component divided by n
            n = acc.real.dtype.type(len(inputs))
            re, im = acc.real / n, acc.imag / n
            acc = np.empty_like(acc)
            acc.real, acc.imag = re, im
        elif op == "AVG" and dtype.kind in "iu":  # the wrapped sum, truncated toward zero
            n = len(inputs)
            acc = np.array([(abs(int(v)) // n) * (-1 if v < 0 else 1) for v in acc.ravel()],
                           dtype=dtype).reshape(acc.shape)
        elif op == "AVG":
            acc = (acc / acc_t.type(len(inputs))).astype(acc_t)
    return acc.astype(dtype)


def bits(a: np.ndarray) -> bytes:
    """The value bytes of an array, for bit-identical comparisons (x87 long double padding,
    whose content is undefined, left out)."""
    a = np.ascontiguousarray(a)
    raw = a.view(np.uint8).reshape(a.size, a.dtype.itemsize)
    if a.dtype in (np.dtype(np.longdouble), np.dtype(np.clongdouble)) and np.finfo(np.longdouble).nmant == 63:
        half = a.dtype.itemsize // (2 if a.dtype.kind == "c" else 1)
        keep = [i for i in range(a.dtype.itemsize) if i % half < 10]
        raw = raw[:, keep]
    return raw.tobytes()


def assert_same_bits(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape, (what, got.dtype, got.shape)
    if bits(got) != bits(expected):
        raw_got, raw_expected = bits(got), bits(expected)
        bad = np.flatnonzero(np.frombuffer(raw_got, np.uint8) != np.frombuffer(raw_expected, np.uint8))
        first = int(bad[0]) // (len(raw_got) // got.size)  # the first element that differs
        window = slice(first, first + 6)
        raise AssertionError(f"{what}: {len(bad)} bytes differ from numpy, from element {first}: "
                             f"got {got.ravel()[window]}, expected {expected.ravel()[window]}")


def digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(bits(a))
    return h.hexdigest()
