# The C entry point of the native torch op (shmcomm/torch_ops/all_reduce.cpp): an all_reduce of a
# tensor's raw memory on a torch group's communicator, no Python object made per call but the
# group's name. Reached through the capsule `torch_all_reduce_entry`; its C type is
# `int (*)(const char *group, int op, void *data, int64_t count, int dtype)`, called with the GIL.
from cpython.pycapsule cimport PyCapsule_New
from cpython.unicode cimport PyUnicode_FromString

# group_name (None: the default group) -> Communicator of each shmcomm torch group on one node;
# shmcomm.torch_ops.groups fills it. A group not here (across nodes) takes the Python kernel.
torch_op_comms = {}
# reduce_op name -> op code, for the direct path's one dict look-up: the names torch's functional
# collectives pass (str(ReduceOp) lower-cased) and "prod"; op_code (kernels.pxi) is the one home
# of the names. PREMUL_SUM needs a factor, which a name cannot carry.
torch_op_codes = {name.lower(): code for code, name in enumerate(OP_NAMES) if name != "PREMUL_SUM"}
torch_op_codes["prod"] = op_code("prod")


def torch_all_reduce_direct(tensor, reduce_op, group) -> bool:
    """All-reduce ``tensor`` in place on the core of torch group ``group`` (its name, the group
    object or None: the keys of ``torch_op_comms``) by ``reduce_op``'s name; True once done.
    False, with nothing run, where the general path must serve it: a group across nodes or not
    known here, an op name not in ``torch_op_codes``, a tensor to copy first or a bad one (the
    general path names the problem). The eager path of ``shmcomm.torch_ops.all_reduce_`` and of
    the op's Python kernel: one compiled call where it was four dict and attribute look-ups.

    Example::

        torch_all_reduce_direct(t, "sum", None) or kernels.all_reduce_(t, "sum", None)
    """
    try:
        comm, code = torch_op_comms.get(group), torch_op_codes.get(reduce_op)
    except TypeError:  # an unhashable group or op: the general path names it
        return False
    if comm is None or code is None:
        return False
    try:
        (<Communicator>comm).all_reduce(tensor, <int>code)
    except (TypeError, ValueError) as exc:
        # raised while the core checked its argument, before anything ran (its own errors are
        # ShmcommErrors): a tensor to copy first, or a bad one, which the general path names
        if isinstance(exc, ShmcommError):
            raise
        return False
    return True


cdef int _torch_all_reduce(const char *group, int op, void *data, int64_t count, int dtype) except -1:
    """0: reduced in place; 1: not served here (the caller runs the Python kernel, which serves
    or names the problem); -1: failed, with the Python error set (CollectiveMismatchError, ...)."""
    cdef Communicator c
    cdef buf_t b
    cdef _Call call
    comm = torch_op_comms.get(None if group == NULL else PyUnicode_FromString(group))
    if comm is None or not 0 <= dtype < SHM_NDTYPES or count < 0:
        return 1
    c = <Communicator>comm
    b.ptr, b.count, b.dtype = <char *>data, <size_t>count, dtype
    b.itemsize = shm_dtype_itemsizes[dtype]
    b.nbytes = b.count * b.itemsize
    call = _open(c, False)
    try:
        _fill_reduce(c, &call.o, &b, op, -1, 1.0)
    except BaseException:
        _abandon(c, call)
        raise
    if _route(c, &call.o) is not None:  # a composition (NUMA) takes arrays: the Python kernel
        _abandon(c, call)
        return 1
    _go(c, call, None, None, True)
    return 0


torch_all_reduce_entry = PyCapsule_New(<void *>_torch_all_reduce, b"shmcomm._core.torch_all_reduce", NULL)
