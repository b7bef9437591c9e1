"""Arrays that live in shared memory: ``sc.empty`` / ``sc.zeros``.

Every rank of the group calls ``empty`` with the same shape and dtype; each gets its own array,
and all of them live in one segment mapped by every rank. Collectives accept them like any
array. The segment's name is removed at once, so the memory goes away with the last array::

    x = sc.empty((1024,), np.float32)
    x[:] = 1
    sc.all_reduce(x)
"""

from __future__ import annotations

import numpy as np

__all__ = ["empty"]


def empty(group, shape, dtype=float) -> np.ndarray:
    """Uninitialised array of ``shape``/``dtype`` in ``group``'s shared memory (collective call)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if np.isscalar(shape) else tuple(shape)
    if any(int(d) < 0 for d in shape):
        raise ValueError(f"shape must not have negative dimensions, got {shape}")
    count = int(np.prod(shape, dtype=np.int64))
    segment, stride = group._comm.alloc_shared(count * dtype.itemsize)
    array = np.frombuffer(segment, dtype=dtype, count=count, offset=group.rank * stride)
    return array.reshape(shape)
