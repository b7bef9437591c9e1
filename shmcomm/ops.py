"""Reduction operations for all_reduce, reduce and reduce_scatter.

``ReduceOp`` is generated inside the compiled core from its op table (src_cython/shm_dtypes.h), so
its names and codes cannot drift from the kernels'; this module is its public home.

Example::

    import shmcomm as sc
    sc.all_reduce(x, op=sc.ReduceOp.MAX)
"""

from __future__ import annotations

from shmcomm._core import ReduceOp, op_code

__all__ = ["ReduceOp", "op_code"]
