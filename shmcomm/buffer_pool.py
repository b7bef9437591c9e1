"""Communication buffers in a group's shared memory, reused, at the same place on every rank.

A backend that lends its memory to a framework (FSDP2 asks its process group for its all-gather
and reduce-scatter buffers) must hand each rank's buffer out from one segment, at the same
offset, for the collectives to read peers' buffers in place. Buffers are created collectively
(``sc.empty``), so every rank must ask for the same sizes in the same order and release them in
the same order, as FSDP2 does (NCCL's symmetric memory asks the same). A released buffer (its
last view gone) is reused for the next request of its size; idle buffers are kept for the
group's life.

    pool = BufferPool(pg)
    x = pool.array(4096)          # 4096 bytes in shared memory (uint8)
    del x                         # back in the pool: the next array(4096) reuses it
"""

from __future__ import annotations

import weakref

import numpy as np

from shmcomm import shared_arrays

__all__ = ["BufferPool"]


class BufferPool:
    """Byte buffers of one group's shared memory, by size, reused once released.

    Example::

        pool = BufferPool(pg)
        t = torch.from_numpy(pool.array(1 << 20)).view(torch.float32)   # 256Ki floats
    """

    def __init__(self, group):
        self._group = group
        self._idle: dict[int, list[np.ndarray]] = {}  # nbytes -> buffers nobody uses
        self.created = 0                              # buffers made (each a collective call)

    def array(self, nbytes: int) -> np.ndarray:
        """A uint8 array of ``nbytes`` in shared memory: an idle buffer of that size, else a new
        one (a collective call: every rank must ask in the same order).

        Example::

            buf = pool.array(64)
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        idle = self._idle.setdefault(nbytes, [])
        if idle:
            base = idle.pop()
        else:
            base = shared_arrays.empty(self._group, nbytes, np.uint8)
            self.created += 1
        view = base[:]  # what the caller holds: when its last reference goes, base is idle again
        weakref.finalize(view, idle.append, base)
        return view

    def tensor(self, count: int, dtype):
        """A 1-D torch tensor of ``count`` elements of ``dtype`` over :meth:`array`'s memory.

        Example::

            t = pool.tensor(1024, torch.bfloat16)
        """
        import torch

        itemsize = torch.empty(0, dtype=dtype).element_size()
        return torch.from_numpy(self.array(count * itemsize)).view(dtype)
