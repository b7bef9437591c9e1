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
    """``array`` = op over ranks 0..r of ``group`` (``exclusive``: 0..r-1; rank 0 keeps its own).

    Example::

        prefix_reduce(pg, x, "sum", exclusive=True, async_op=False)
    """
    code = op_code(op)
    _core.as_numpy(array, "array", writable=True)  # a writable contiguous array of a known dtype
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

    return group.run(run, (), [array], async_op)


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
