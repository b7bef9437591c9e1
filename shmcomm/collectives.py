"""Module-level collectives: each runs the method of the same name on ``group`` (default: the
default group). See ``ProcessGroup`` for what each one does.

Example::

    import numpy as np, shmcomm as sc
    sc.init_process_group()
    x = np.ones(4, np.float32)
    sc.all_reduce(x)                                  # in place; x == world_size
    w = sc.broadcast(x, src=0, async_op=True); w.wait()
"""

from __future__ import annotations

# The array collectives are compiled (shmcomm._core, src_cython/group_core.pxi): a Python
# wrapper here would cost more than an 8-byte collective itself.
from shmcomm._core import (  # noqa: F401
    all_gather, all_gather_into, all_gather_v, all_reduce, all_to_all, all_to_all_single, barrier,
    broadcast, gather, gather_v, recv, reduce, reduce_scatter, reduce_scatter_into,
    reduce_scatter_v, scatter, scatter_v, send,
)
from shmcomm.group import resolve
from shmcomm.ops import ReduceOp

__all__ = ["all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather", "all_gather_into",
           "gather", "scatter", "reduce_scatter", "reduce_scatter_into", "all_to_all",
           "all_to_all_single", "all_gather_v", "gather_v", "scatter_v", "reduce_scatter_v",
           "barrier", "send", "recv", "isend", "irecv", "broadcast_object_list",
           "all_gather_object", "gather_object", "scatter_object_list", "empty", "zeros"]



def all_reduce_coalesced(arrays, op=ReduceOp.SUM, group=None, async_op=False):
    """All-reduce several arrays in one operation. Example: ``sc.all_reduce_coalesced([a, b])``."""
    return resolve(group).all_reduce_coalesced(arrays, op, async_op)


def isend(array, dst, tag=0, group=None):
    """Start a send; returns a Work. Example: ``w = sc.isend(x, 1); w.wait()``."""
    return resolve(group).isend(array, dst, tag)


def irecv(array, src=None, tag=0, group=None):
    """Start a receive; returns a Work. Example: ``w = sc.irecv(buf); w.wait(); w.source_rank()``."""
    return resolve(group).irecv(array, src, tag)


def broadcast_object_list(object_list, src=0, group=None):
    """Broadcast picklable objects in place. Example: ``sc.broadcast_object_list(objs, src=0)``."""
    return resolve(group).broadcast_object_list(object_list, src)


def all_gather_object(object_list, obj, group=None):
    """Gather a picklable object from every rank. Example: ``sc.all_gather_object(out, obj)``."""
    return resolve(group).all_gather_object(object_list, obj)


def gather_object(obj, object_gather_list=None, dst=0, group=None):
    """Gather picklable objects on ``dst``. Example: ``sc.gather_object(obj, out, dst=0)``."""
    return resolve(group).gather_object(obj, object_gather_list, dst)


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=0, group=None):
    """Scatter picklable objects. Example: ``sc.scatter_object_list(out, objs, src=0)``."""
    return resolve(group).scatter_object_list(scatter_object_output_list, scatter_object_input_list, src)


def empty(shape, dtype=float, group=None):
    """Uninitialised array in the group's shared memory (collective). Example: ``sc.empty(1024, np.float32)``."""
    return resolve(group).empty(shape, dtype)


def zeros(shape, dtype=float, group=None):
    """Zero-filled ``empty``. Example: ``buf = sc.zeros((4, 256), np.float64)``."""
    array = empty(shape, dtype, group)
    array.fill(0)
    return array
