"""MPI's prefix reductions: ``scan`` (rank r gets op over ranks 0..r) and ``exscan`` (0..r-1).

One algorithm for every kind of group (one node, or several through ``shmcomm.multinode``): the
ranks all-gather their arrays, then each reduces the prefix it needs with the kernels every
collective uses, in rank order, so ranks that share a prefix get the same bits as ``all_reduce``
over those ranks would. It runs as one operation of the group (``ProcessGroup.run``), in issue
order, synchronously or as a ``Work``::

    x = np.full(3, sc.get_rank() + 1.0)
    sc.scan(x)        # rank r: (r + 1) (r + 2) / 2
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from shmcomm import _core
from shmcomm.ops import op_code

if TYPE_CHECKING:
    from shmcomm._types import Array, ReduceOpLike
    from shmcomm.group import ProcessGroup
    from shmcomm.work import Work


def prefix_reduce(group: ProcessGroup, array: Array, op: ReduceOpLike, exclusive: bool,
                  async_op: bool) -> Work | None:
    """``array`` = op over ranks 0..r of ``group`` (``exclusive``: 0..r-1; rank 0 gets the op's
    identity, or keeps its own array where the op has none: AVG).

    Example::

        prefix_reduce(pg, x, "sum", exclusive=True, async_op=False)
    """
    code = op_code(op)
    view, dtype_name = _core.as_numpy(array, "array", writable=True)  # writable, contiguous, known dtype
    flat = _flat(array)
    _core.reduce_kernel(flat[:0], [flat[:0]], code)  # the op applies to the dtype, on every rank
    rank, size = group.rank, group.size

    def run() -> None:
        every = _like(flat, size * _numel(flat))
        group.all_gather_into(every, flat)
        upto = rank if exclusive else rank + 1
        n = _numel(flat)
        if upto:
            _core.reduce_kernel(flat, [every[q * n:(q + 1) * n] for q in range(upto)], code)
        elif identity is not None and n:  # exscan's rank 0: op over no rank at all
            view.reshape(-1).view(np.uint8).reshape(n, -1)[:] = np.frombuffer(identity, np.uint8)

    identity = identity_bytes(dtype_name, _core.OP_NAMES[code]) if exclusive and rank == 0 else None
    return group.run(run, (), [array], async_op)


# What op over no operand at all gives, by op: "highest"/"lowest" are the dtype's extremes (inf for
# floating point), "ones" every bit set. AVG has none (a mean of nothing): rank 0 keeps its array.
_IDENTITIES = {"SUM": 0, "BOR": 0, "BXOR": 0, "PRODUCT": 1, "MIN": "highest", "MAX": "lowest",
               "BAND": "ones"}


def identity_bytes(dtype_name: str, op_name: str) -> bytes | None:
    """One element of ``op``'s identity in dtype ``dtype_name`` (the core's names), as its bytes;
    None where the op has none.

    Example::

        >>> identity_bytes("int8", "MAX"), identity_bytes("float32", "PRODUCT")
        (b'\\x80', b'\\x00\\x00\\x80?')
    """
    kind = _IDENTITIES.get(op_name)
    if kind is None:
        return None
    if dtype_name == "bfloat16":  # the upper half of the float32 of the same value (exact here)
        value = {0: 0.0, 1: 1.0, "highest": np.inf, "lowest": -np.inf}[kind]
        return (np.array([value], np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    dt = np.dtype(dtype_name)
    if kind in (0, 1):
        return np.array([kind], dt).tobytes()
    if dt.kind == "b":
        return np.array([kind != "lowest"], dt).tobytes()
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.array([{"highest": info.max, "lowest": info.min,
                          "ones": -1 if dt.kind == "i" else info.max}[kind]], dt).tobytes()
    return np.array([np.inf if kind == "highest" else -np.inf], dt).tobytes()  # floating point


def _flat(array: Any) -> Any:
    """A 1-D view of a C-contiguous array or tensor (or buffer, as numpy sees it)."""
    if hasattr(array, "view") and hasattr(array, "data_ptr"):  # a torch tensor
        return array.view(-1)
    return np.asarray(array).reshape(-1)


def _numel(flat: Any) -> int:
    return int(flat.numel()) if hasattr(flat, "numel") else int(flat.size)


def _like(flat: Any, count: int) -> Any:
    """A fresh 1-D array of ``count`` elements of ``flat``'s kind and dtype."""
    if hasattr(flat, "new_empty"):
        return flat.new_empty(count)
    return np.empty(count, flat.dtype)
