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

from shmcomm.group import resolve
from shmcomm.ops import ReduceOp

__all__ = ["all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather", "all_gather_into",
           "gather", "scatter", "reduce_scatter", "reduce_scatter_into", "all_to_all",
           "all_to_all_single", "barrier", "send", "recv", "isend", "irecv", "broadcast_object_list",
           "all_gather_object", "gather_object", "scatter_object_list", "empty", "zeros"]


def all_reduce(array, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``array`` in place over all ranks. Example: ``sc.all_reduce(x, op=sc.ReduceOp.MAX)``."""
    return resolve(group).all_reduce(array, op, async_op)


def all_reduce_coalesced(arrays, op=ReduceOp.SUM, group=None, async_op=False):
    """All-reduce several arrays in one operation. Example: ``sc.all_reduce_coalesced([a, b])``."""
    return resolve(group).all_reduce_coalesced(arrays, op, async_op)


def broadcast(array, src, group=None, async_op=False):
    """Copy rank ``src``'s array to every rank. Example: ``sc.broadcast(w, src=0)``."""
    return resolve(group).broadcast(array, src, async_op)


def reduce(array, dst, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce into ``array`` on rank ``dst`` only. Example: ``sc.reduce(x, dst=0)``."""
    return resolve(group).reduce(array, dst, op, async_op)


def all_gather(output_list, array, group=None, async_op=False):
    """Every rank gets every rank's array. Example: ``sc.all_gather(outs, x)``."""
    return resolve(group).all_gather(output_list, array, async_op)


def all_gather_into(output, array, group=None, async_op=False):
    """All-gather into one array, rank-major. Example: ``sc.all_gather_into(out, x)``."""
    return resolve(group).all_gather_into(output, array, async_op)


def gather(array, gather_list=None, dst=0, group=None, async_op=False):
    """Collect arrays on rank ``dst``. Example: ``sc.gather(x, outs if rank == 0 else None)``."""
    return resolve(group).gather(array, gather_list, dst, async_op)


def scatter(array, scatter_list=None, src=0, group=None, async_op=False):
    """Hand rank q ``scatter_list[q]`` of ``src``. Example: ``sc.scatter(x, parts, src=0)``."""
    return resolve(group).scatter(array, scatter_list, src, async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``input_list[r]`` over ranks into rank r's ``output``. Example: ``sc.reduce_scatter(o, ins)``."""
    return resolve(group).reduce_scatter(output, input_list, op, async_op)


def reduce_scatter_into(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """reduce_scatter with one rank-major input. Example: ``sc.reduce_scatter_into(o, whole)``."""
    return resolve(group).reduce_scatter_into(output, input, op, async_op)


def all_to_all(output_list, input_list, group=None, async_op=False):
    """Exchange ``input_list[q]`` with rank q. Example: ``sc.all_to_all(outs, ins)``."""
    return resolve(group).all_to_all(output_list, input_list, async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    """All-to-all on single arrays. Example: ``sc.all_to_all_single(out, inp, [1, 3], [2, 2])``."""
    return resolve(group).all_to_all_single(output, input, output_split_sizes, input_split_sizes, async_op)


def barrier(group=None, async_op=False):
    """Wait for every rank of the group. Example: ``sc.barrier()``."""
    return resolve(group).barrier(async_op)


def send(array, dst, tag=0, group=None):
    """Send ``array`` to ``dst``. Example: ``sc.send(x, dst=1, tag=3)``."""
    return resolve(group).send(array, dst, tag)


def recv(array, src=None, tag=0, group=None):
    """Receive into ``array``; returns the sender. Example: ``who = sc.recv(buf)``."""
    return resolve(group).recv(array, src, tag)


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
