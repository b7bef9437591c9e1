"""Cases: the (collective, dtype, op, root) combinations a sweep runs, in nccl-tests' order
(collective, then dtype, op, root, size); which combinations are invalid, for shmcomm itself or
for one peer, and why; and the steps (case, size, round) that every backend's workers and the
parent walk through in one and the same order.

Example::

    >>> cases, skipped = expand(["all_reduce"], ["float32", "int8"], ["sum", "band"], [0], 2)
    >>> [tuple(c) for c in cases]
    [('all_reduce', 'float32', 'sum', -1), ('all_reduce', 'int8', 'sum', -1), ('all_reduce', 'int8', 'band', -1)]
    >>> skipped[0][1]
    'bitwise ops need an integer or bool dtype'
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from shmcomm._core import ReduceOp, reduce_kernel

from .peers import deepspeed_half_missing
from .common import _REDUCING, _ROOTED, MPI_BACKENDS
from .dtypes import bench_dtype, itemsize, kind as dtype_kind, unavailable
from .sizes import collective_sizes

# --op names: ReduceOp's members, lower case, PRODUCT spelled "prod" as nccl-tests does.
OPS = tuple("prod" if m.name == "PRODUCT" else m.name.lower() for m in ReduceOp)
OP_ALIASES = {"product": "prod", "mean": "avg"}
_BITWISE = ("band", "bor", "bxor")
ANY = "*"  # the dtype of a skipped case whose reason holds for every dtype


class Case(NamedTuple):
    """One combination: ``op`` is ``none`` where the collective does not reduce and ``root`` -1
    where it has no root, as nccl-tests prints them."""

    collective: str
    dtype: str
    op: str
    root: int


class Step(NamedTuple):
    """One measurement: a case at one size (``count`` elements, ``chunk`` per rank), one round."""

    case: Case
    count: int
    chunk: int
    round: int


def reduce_op(name: str) -> ReduceOp:
    """The ReduceOp of an --op name: ``reduce_op("prod") is ReduceOp.PRODUCT``."""
    return ReduceOp["PRODUCT" if name == "prod" else name.upper()]


@lru_cache(maxsize=None)
def why_invalid(dtype: str, op: str) -> str | None:
    """Why shmcomm has no ``op`` for ``dtype`` (None if it has). The library decides: its own
    kernel is asked on a one-element array; the reason is worded here for the reader.

    Example::

        >>> why_invalid("complex64", "max"), why_invalid("bool", "bxor")
        ('complex numbers have no order (no min/max)', None)
    """
    probe = dtype
    if dtype == "bfloat16" and (unavailable(dtype) or bench_dtype(dtype).bits16):
        probe = "float16"  # no numpy bfloat16 array to ask with; the half types share their ops
    try:
        one = np.zeros(1, bench_dtype(probe).storage)
        reduce_kernel(one, [one], int(reduce_op(op)))
        return None
    except TypeError as exc:
        kind = dtype_kind(dtype)
        if op in _BITWISE and kind not in ("int", "uint", "bool"):
            return "bitwise ops need an integer or bool dtype"
        if op in ("min", "max") and kind == "complex":
            return "complex numbers have no order (no min/max)"
        if op == "avg" and kind == "bool":
            return "bool has no average"
        return str(exc)


# torch.distributed's gloo (checked with torch 2.13) has no int16 or unsigned type wider than 8
# bits, no long double; complex numbers it reduces with sum/avg only and cannot gather.
_GLOO_MISSING = ("int16", "uint16", "uint32", "uint64", "longdouble", "clongdouble")


def peer_skip(backend: str, case: Case) -> str | None:
    """Why ``backend`` cannot run ``case`` although shmcomm can (None if it can).

    Example::

        >>> peer_skip("mpi", Case("all_reduce", "float16", "sum", -1))
        'MPI has no standard float16 datatype'
    """
    dt, op, kind = case.dtype, case.op, dtype_kind(case.dtype)
    if case.collective == "barrier":
        return None  # no data, so no dtype
    if backend == "gloo":
        if case.collective == "scan":
            return "torch.distributed has no scan"
        if dt in _GLOO_MISSING:
            return f"torch.distributed gloo has no {dt}"
        if kind == "complex" and case.collective == "gather":
            return "gloo's gather has no complex types"
        if kind == "complex" and op not in ("none", "sum", "avg"):
            return "gloo reduces complex numbers with sum and avg only"
        if op == "avg" and kind not in ("float", "complex"):
            return "gloo averages floating-point types only"
    if backend == "deepspeed":
        if case.collective != "all_reduce":
            return "DeepSpeed's shared-memory op is an all_reduce only"
        if op != "sum":
            return "DeepSpeed's shared-memory op sums only"
        if dt not in ("float32", "bfloat16", "float16"):
            return "DeepSpeed's shared-memory op takes float32, bfloat16 and float16 only"
        if dt != "float32":
            return deepspeed_half_missing()
    if backend in MPI_BACKENDS:
        if dt in ("float16", "bfloat16"):
            return f"MPI has no standard {dt} datatype"
        if op == "avg":
            return "MPI has no average reduction (MPI_AVG does not exist)"
        if dt == "bool" and op != "none":
            return "MPI's C_BOOL takes logical reductions only (LAND, LOR, LXOR)"
    return None


def expand(collectives, dtype_names, ops, roots, nranks: int):
    """The cases of a sweep, and ``(case, reason)`` for every combination shmcomm cannot run.

    ``ops`` apply to the reducing collectives only, ``roots`` to the rooted ones; barrier runs
    once, with the first dtype. Returns ``(cases, skipped)``.
    """
    cases, skipped = [], []
    for coll in collectives:
        if coll == "send_recv" and nranks < 2:
            skipped.append((Case(coll, ANY, "none", -1), "send_recv needs at least 2 ranks"))
            continue
        for dt in dtype_names[:1] if coll == "barrier" else dtype_names:
            for op in ops if coll in _REDUCING else ["none"]:
                why = why_invalid(dt, op) if op != "none" else None
                for root in roots if coll in _ROOTED else [-1]:
                    case = Case(coll, dt, op, root)
                    if why:
                        skipped.append((case, why))
                    else:  # the option parsers dropped repeated dtypes, ops and roots
                        cases.append(case)
    return cases, skipped


def steps(cases, sizes: list[int], nranks: int, rounds: int = 1) -> list[Step]:
    """Every measurement in order: per case, per size, per round (rounds of a size adjoin, so
    backends taking turns measure them close together).

    Example::

        >>> [s.count for s in steps([Case("broadcast", "float32", "none", 0)], [8, 64], 2)]
        [2, 16]
    """
    out = []
    for case in cases:
        for count, chunk in collective_sizes(case.collective, sizes, nranks, itemsize(case.dtype)):
            out += [Step(case, count, chunk, r) for r in range(rounds)]
    return out
