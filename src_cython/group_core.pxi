# The public collective API's hot path, compiled: argument conversion, then straight into the
# Communicator, which runs a synchronous call inline and queues an async one (engine.pxi).
#
# Why in C: the same chain in Python (module function -> resolve -> method -> rank check -> _op)
# cost 0.3-0.6 us per call, more than the whole 8-byte broadcast between two ranks (0.36 us).

cdef object _ReduceOp = ReduceOp  # kernels.pxi
cdef object _op_code = op_code
cdef object _SUM = ReduceOp.SUM
cdef object _default_group = None  # mirrors shmcomm.group's default group (set_default_group)


cdef inline int _op_arg(object op) except? -1:
    if type(op) is _ReduceOp:  # the common case; anything else (names, ints, torch's) by op_code
        return op
    return _op_code(op)


cpdef object rows_to_elements(object array, object splits, str argname):
    """Split sizes along the first axis (torch's meaning) as element counts of the flattened
    array: each times the elements of one row. None, and 1-D arrays, stay as they are (cpdef:
    all_to_all_single calls it twice per call, without a Python call).

    Example::

        >>> rows_to_elements(np.zeros((4, 3)), [1, 3], "input_split_sizes")
        [3, 9]
    """
    if splits is None:
        return None
    shape = getattr(array, "shape", None)
    if shape is None or len(shape) < 2:
        return splits
    row = 1
    for extent in shape[1:]:
        row *= extent
    try:
        return [_as_index(x, f"{argname}[i]") * row for x in splits]
    except TypeError as exc:
        if "[i]" in str(exc):
            raise
        raise TypeError(f"{argname} must be a sequence of ints, got {type(splits).__name__}") from None


def source_arg(src):
    """A receive's ``src`` as the p2p engine takes it: None (any rank) is -1; a negative rank is
    refused (it is not another spelling of "any").

    Example::

        >>> source_arg(None), source_arg(2)
        (-1, 2)
    """
    if src is None:
        return -1
    cdef int r = _rank_arg(src, "src")
    if r < 0:
        raise ValueError(f"src must be a rank >= 0, or None for any rank; got {r}")
    return r


cdef int64_t _tag_arg(object tag) except? -1:
    tag = _as_index(tag, "tag")
    if not -(2**63) <= tag < 2**63:
        raise ValueError(f"tag must fit in 64 bits, got {tag}")
    return tag


def tag_arg(tag):
    """``tag`` as a 64-bit message tag; TypeError/ValueError name the problem.

    Example::

        >>> tag_arg(7)
        7
    """
    return _tag_arg(tag)


def set_default_group(group):
    """Make ``group`` (a GroupCore or None) what module-level collectives use for ``group=None``."""
    global _default_group
    if group is not None and not isinstance(group, GroupCore):
        raise TypeError(f"expected a ProcessGroup, got {type(group).__name__}")
    _default_group = group


cdef inline GroupCore _resolve(object group):
    if group is None:
        if _default_group is None:
            raise ValueError("shmcomm is not initialized: call shmcomm.init_process_group() first")
        return <GroupCore>_default_group
    if isinstance(group, GroupCore):
        return <GroupCore>group
    raise TypeError(f"group must be a shmcomm.ProcessGroup or None, got {type(group).__name__}")


cdef class GroupCore:
    """Compiled base of ``shmcomm.ProcessGroup``: every array collective's synchronous fast path.

    Not used directly; ``ProcessGroup`` (shmcomm/group.py) adds identity, async queueing,
    point-to-point, object collectives and teardown::

        pg = sc.init_process_group()
        pg.broadcast(x, src=0)        # runs here, inline, when nothing is queued on pg
    """
    cdef public Communicator _comm
    cdef public P2PEngine _p2p
    # The engine the group's collectives run on: _comm itself, whose calls the methods below make
    # (the typed fast path), or another with the same calls (an Engine, shmcomm/_core.pyi: the
    # multi-node HierarchicalComm), for which EngineGroup makes every method anew (shmcomm/group.py).
    cdef public object _engine

    cpdef all_reduce(self, array, op=_SUM, bint async_op=False):
        """``shmcomm.all_reduce`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef int code = _op_arg(op)
        return self._comm.all_reduce(array, code, async_op)

    cpdef broadcast(self, array, src, bint async_op=False):
        """``shmcomm.broadcast`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef int root = _rank_arg(src, "src")
        return self._comm.broadcast(array, root, async_op)

    cpdef reduce(self, array, dst, op=_SUM, bint async_op=False):
        """``shmcomm.reduce`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef int root = _rank_arg(dst, "dst")
        cdef int code = _op_arg(op)
        return self._comm.reduce(array, root, code, async_op)

    cpdef all_gather(self, output_list, array, bint async_op=False):
        """``shmcomm.all_gather`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef list outs = list(output_list)
        return self._comm.all_gather(outs, array, async_op)

    cpdef all_gather_into(self, output, array, bint async_op=False):
        """``shmcomm.all_gather_into`` on this group (full text: shmcomm.collectives copies it here)."""
        return self._comm.all_gather_into(output, array, async_op)

    cpdef gather(self, array, gather_list=None, dst=0, bint async_op=False):
        """``shmcomm.gather`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef int root = _rank_arg(dst, "dst")
        outs = list(gather_list) if gather_list is not None else None
        return self._comm.gather(array, outs, root, async_op)

    cpdef scatter(self, array, scatter_list=None, src=0, bint async_op=False):
        """``shmcomm.scatter`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef int root = _rank_arg(src, "src")
        ins = list(scatter_list) if scatter_list is not None else None
        return self._comm.scatter(array, ins, root, async_op)

    cpdef reduce_scatter(self, output, input_list, op=_SUM, bint async_op=False):
        """``shmcomm.reduce_scatter`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef list ins = list(input_list)
        cdef int code = _op_arg(op)
        return self._comm.reduce_scatter(output, ins, code, async_op)

    cpdef reduce_scatter_into(self, output, input, op=_SUM, bint async_op=False):
        """``shmcomm.reduce_scatter_into`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef int code = _op_arg(op)
        return self._comm.reduce_scatter_into(output, input, code, async_op)

    cpdef all_to_all(self, output_list, input_list, bint async_op=False):
        """``shmcomm.all_to_all`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef list outs = list(output_list), ins = list(input_list)
        return self._comm.all_to_all(outs, ins, async_op)

    cpdef all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          bint async_op=False):
        """``shmcomm.all_to_all_single`` on this group (full text: shmcomm.collectives copies it here)."""
        return self._comm.all_to_all_single(output, input,
                                            rows_to_elements(output, output_split_sizes, "output_split_sizes"),
                                            rows_to_elements(input, input_split_sizes, "input_split_sizes"),
                                            async_op)

    cpdef all_gather_v(self, output, array, counts, displs=None, bint async_op=False):
        """``shmcomm.all_gather_v`` on this group (full text: shmcomm.collectives copies it here)."""
        return self._comm.all_gather_v(output, array, counts, displs, async_op)

    cpdef gather_v(self, array, output=None, counts=None, displs=None, dst=0, bint async_op=False):
        """``shmcomm.gather_v`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef int root = _rank_arg(dst, "dst")
        return self._comm.gather_v(array, output, counts, displs, root, async_op)

    cpdef scatter_v(self, output, input=None, counts=None, displs=None, src=0, bint async_op=False):
        """``shmcomm.scatter_v`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef int root = _rank_arg(src, "src")
        return self._comm.scatter_v(output, input, counts, displs, root, async_op)

    cpdef reduce_scatter_v(self, output, input, counts, op=_SUM, bint async_op=False):
        """``shmcomm.reduce_scatter_v`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef int code = _op_arg(op)
        return self._comm.reduce_scatter_v(output, input, counts, code, async_op)

    cpdef barrier(self, bint async_op=False):
        """``shmcomm.barrier`` on this group (full text: shmcomm.collectives copies it here)."""
        return self._comm.barrier(async_op)

    cpdef scan(self, array, op=_SUM, bint async_op=False):
        """``shmcomm.scan`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef int code = _op_arg(op)
        return self._comm.scan(array, code, async_op)

    cpdef exscan(self, array, op=_SUM, bint async_op=False):
        """``shmcomm.exscan`` on this group (full text: shmcomm.collectives copies it here)."""
        cdef int code = _op_arg(op)
        return self._comm.exscan(array, code, async_op)

    # ---- point to point (blocking; isend/irecv are in ProcessGroup) --------------------------
    cpdef send(self, array, dst, tag=0):
        """``shmcomm.send`` on this group (full text: shmcomm.collectives copies it here)."""
        self._p2p.send(array, _rank_arg(dst, "dst"), _tag_arg(tag))

    cpdef recv(self, array, src=None, tag=0):
        """``shmcomm.recv`` on this group (full text: shmcomm.collectives copies it here)."""
        return self._p2p.recv(array, source_arg(src), _tag_arg(tag))


# ---- module-level collectives (shmcomm.all_reduce, ...): the group's method, on the default group
# Their text is in shmcomm/collectives.py, which gives each its docstring at import (and the
# ProcessGroup method of the same name a copy of it, without the ``group`` argument).

def all_reduce(array, op=_SUM, group=None, async_op=False):
    return _resolve(group).all_reduce(array, op, async_op)


def broadcast(array, src, group=None, async_op=False):
    return _resolve(group).broadcast(array, src, async_op)


def reduce(array, dst, op=_SUM, group=None, async_op=False):
    return _resolve(group).reduce(array, dst, op, async_op)


def all_gather(output_list, array, group=None, async_op=False):
    return _resolve(group).all_gather(output_list, array, async_op)


def all_gather_into(output, array, group=None, async_op=False):
    return _resolve(group).all_gather_into(output, array, async_op)


def gather(array, gather_list=None, dst=0, group=None, async_op=False):
    return _resolve(group).gather(array, gather_list, dst, async_op)


def scatter(array, scatter_list=None, src=0, group=None, async_op=False):
    return _resolve(group).scatter(array, scatter_list, src, async_op)


def reduce_scatter(output, input_list, op=_SUM, group=None, async_op=False):
    return _resolve(group).reduce_scatter(output, input_list, op, async_op)


def reduce_scatter_into(output, input, op=_SUM, group=None, async_op=False):
    return _resolve(group).reduce_scatter_into(output, input, op, async_op)


def all_to_all(output_list, input_list, group=None, async_op=False):
    return _resolve(group).all_to_all(output_list, input_list, async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    return _resolve(group).all_to_all_single(output, input, output_split_sizes, input_split_sizes, async_op)


def all_gather_v(output, array, counts, displs=None, group=None, async_op=False):
    return _resolve(group).all_gather_v(output, array, counts, displs, async_op)


def gather_v(array, output=None, counts=None, displs=None, dst=0, group=None, async_op=False):
    return _resolve(group).gather_v(array, output, counts, displs, dst, async_op)


def scatter_v(output, input=None, counts=None, displs=None, src=0, group=None, async_op=False):
    return _resolve(group).scatter_v(output, input, counts, displs, src, async_op)


def reduce_scatter_v(output, input, counts, op=_SUM, group=None, async_op=False):
    return _resolve(group).reduce_scatter_v(output, input, counts, op, async_op)


def barrier(group=None, async_op=False):
    return _resolve(group).barrier(async_op)


def scan(array, op=_SUM, group=None, async_op=False):
    return _resolve(group).scan(array, op, async_op)


def exscan(array, op=_SUM, group=None, async_op=False):
    return _resolve(group).exscan(array, op, async_op)


def send(array, dst, tag=0, group=None):
    _resolve(group).send(array, dst, tag)


def recv(array, src=None, tag=0, group=None):
    return _resolve(group).recv(array, src, tag)
