# The public collective API's hot path, compiled: argument conversion, then straight into the
# Communicator, which runs a synchronous call inline and queues an async one (engine.pxi).
#
# Why in C: the same chain in Python (module function -> resolve -> method -> rank check -> _op)
# cost 0.3-0.6 us per call, more than the whole 8-byte broadcast between two ranks (0.36 us).
from operator import index as _index

cdef object _ReduceOp = ReduceOp  # kernels.pxi
cdef object _op_code = op_code
cdef object _SUM = ReduceOp.SUM
cdef object _default_group = None  # mirrors shmcomm.group's default group (set_default_group)


cdef inline int _op_arg(object op) except? -1:
    if type(op) is _ReduceOp:  # the common case; anything else (names, ints, torch's) by op_code
        return op
    return _op_code(op)


cdef object _as_index(object value, str argname):
    """``value`` as a Python int; TypeError naming ``argname`` for bools and non-integers."""
    if type(value) is int:
        return value
    if not isinstance(value, bool):
        try:
            return _index(value)  # int subclasses, numpy integers
        except TypeError:
            pass
    raise TypeError(f"{argname} must be an int rank, got {type(value).__name__}")


cdef inline int _rank_arg(object value, str argname) except? -1:
    if type(value) is int:  # the common case first: this is on every call's path
        return value
    return _as_index(value, argname)


def rank_arg(value, str argname):
    """``value`` as an int rank; TypeError naming ``argname`` for bools and non-integers.

    Example::

        >>> rank_arg(3, "dst")
        3
    """
    return _as_index(value, argname)


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

    cpdef all_reduce(self, array, op=_SUM, bint async_op=False):
        """Reduce ``array`` over all ranks in place; every rank gets the same bits.

        Example::

            x = np.full(3, pg.rank, np.float32); pg.all_reduce(x)   # x == sum of ranks
        """
        cdef int code = _op_arg(op)
        return self._comm.all_reduce(array, code, async_op)

    cpdef broadcast(self, array, src, bint async_op=False):
        """Copy ``array`` of rank ``src`` into ``array`` of every rank.

        Example::

            pg.broadcast(weights, src=0)
        """
        cdef int root = _rank_arg(src, "src")
        return self._comm.broadcast(array, root, async_op)

    cpdef reduce(self, array, dst, op=_SUM, bint async_op=False):
        """Reduce into ``array`` of rank ``dst``; other ranks' arrays are unchanged.

        Example::

            pg.reduce(x, dst=0)
        """
        cdef int root = _rank_arg(dst, "dst")
        cdef int code = _op_arg(op)
        return self._comm.reduce(array, root, code, async_op)

    cpdef all_gather(self, output_list, array, bint async_op=False):
        """Fill ``output_list[q]`` with rank q's ``array`` on every rank.

        Example::

            outs = [np.empty_like(x) for _ in range(pg.size)]; pg.all_gather(outs, x)
        """
        cdef list outs = list(output_list)
        return self._comm.all_gather(outs, array, async_op)

    cpdef all_gather_into(self, output, array, bint async_op=False):
        """Gather every rank's ``array`` into ``output`` (world_size * array.size elements, rank-major).

        Example::

            out = np.empty(pg.size * x.size, x.dtype); pg.all_gather_into(out, x)
        """
        return self._comm.all_gather_into(output, array, async_op)

    cpdef gather(self, array, gather_list=None, dst=0, bint async_op=False):
        """Collect every rank's ``array`` into ``gather_list`` on rank ``dst`` (None elsewhere).

        Example::

            outs = [np.empty_like(x) for _ in range(pg.size)] if pg.rank == 0 else None
            pg.gather(x, outs, dst=0)
        """
        cdef int root = _rank_arg(dst, "dst")
        outs = list(gather_list) if gather_list is not None else None
        return self._comm.gather(array, outs, root, async_op)

    cpdef scatter(self, array, scatter_list=None, src=0, bint async_op=False):
        """Fill ``array`` on rank q with ``scatter_list[q]`` of rank ``src`` (None elsewhere).

        Example::

            pg.scatter(x, [np.full(4, q) for q in range(pg.size)] if pg.rank == 0 else None, src=0)
        """
        cdef int root = _rank_arg(src, "src")
        ins = list(scatter_list) if scatter_list is not None else None
        return self._comm.scatter(array, ins, root, async_op)

    cpdef reduce_scatter(self, output, input_list, op=_SUM, bint async_op=False):
        """``output`` on rank r = reduction over ranks of their ``input_list[r]``.

        Example::

            pg.reduce_scatter(out, [np.ones(4) for _ in range(pg.size)])   # out == size
        """
        cdef list ins = list(input_list)
        cdef int code = _op_arg(op)
        return self._comm.reduce_scatter(output, ins, code, async_op)

    cpdef reduce_scatter_into(self, output, input, op=_SUM, bint async_op=False):
        """Like reduce_scatter with ``input`` holding world_size * output.size elements, rank-major.

        Example::

            pg.reduce_scatter_into(out, np.ones(pg.size * out.size, out.dtype))
        """
        cdef int code = _op_arg(op)
        return self._comm.reduce_scatter_into(output, input, code, async_op)

    cpdef all_to_all(self, output_list, input_list, bint async_op=False):
        """``output_list[q]`` on rank r receives ``input_list[r]`` of rank q.

        Example::

            pg.all_to_all(outs, [np.full(2, pg.rank * 10 + q) for q in range(pg.size)])
        """
        cdef list outs = list(output_list), ins = list(input_list)
        return self._comm.all_to_all(outs, ins, async_op)

    cpdef all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          bint async_op=False):
        """All-to-all on single arrays split along the first axis, evenly or by the split sizes.

        Example::

            pg.all_to_all_single(out, inp)      # equal parts
            pg.all_to_all_single(out, inp, [1, 3], [2, 2])
        """
        return self._comm.all_to_all_single(output, input, output_split_sizes, input_split_sizes, async_op)

    cpdef all_gather_v(self, output, array, counts, displs=None, bint async_op=False):
        """All-gather of pieces of different sizes into one array (MPI's Allgatherv).

        Rank q's ``array`` (``counts[q]`` elements) lands in every rank's ``output`` at element
        ``displs[q]`` (default: packed in rank order). Every rank passes the same ``counts``.

        Example::

            counts = [q + 1 for q in range(pg.size)]
            out = np.empty(sum(counts), np.float32)
            pg.all_gather_v(out, np.full(pg.rank + 1, pg.rank, np.float32), counts)
        """
        return self._comm.all_gather_v(output, array, counts, displs, async_op)

    cpdef gather_v(self, array, output=None, counts=None, displs=None, dst=0, bint async_op=False):
        """Gather pieces of different sizes into one array on rank ``dst`` (MPI's Gatherv).

        ``output``, ``counts`` and ``displs`` matter on ``dst`` only (``output`` must be None
        elsewhere): rank q's ``array`` (``counts[q]`` elements) lands at element ``displs[q]``.

        Example::

            counts = [q + 1 for q in range(pg.size)]
            out = np.empty(sum(counts)) if pg.rank == 0 else None
            pg.gather_v(np.full(pg.rank + 1, pg.rank, float), out, counts, dst=0)
        """
        cdef int root = _rank_arg(dst, "dst")
        return self._comm.gather_v(array, output, counts, displs, root, async_op)

    cpdef scatter_v(self, output, input=None, counts=None, displs=None, src=0, bint async_op=False):
        """Scatter pieces of different sizes from one array on rank ``src`` (MPI's Scatterv).

        ``input``, ``counts`` and ``displs`` matter on ``src`` only (``input`` must be None
        elsewhere): rank q's ``output`` receives ``counts[q]`` elements from ``displs[q]``.

        Example::

            counts = [q + 1 for q in range(pg.size)]
            whole = np.arange(sum(counts), dtype=float) if pg.rank == 0 else None
            mine = np.empty(pg.rank + 1); pg.scatter_v(mine, whole, counts, src=0)
        """
        cdef int root = _rank_arg(src, "src")
        return self._comm.scatter_v(output, input, counts, displs, root, async_op)

    cpdef reduce_scatter_v(self, output, input, counts, op=_SUM, bint async_op=False):
        """Reduce-scatter with pieces of different sizes (MPI's Reduce_scatter).

        ``input`` holds ``sum(counts)`` elements on every rank; rank r's ``output`` (``counts[r]``
        elements) gets the reduction over ranks of their piece r, in rank order.

        Example::

            counts = [q + 1 for q in range(pg.size)]
            out = np.empty(counts[pg.rank])
            pg.reduce_scatter_v(out, np.ones(sum(counts)), counts)   # out == size
        """
        cdef int code = _op_arg(op)
        return self._comm.reduce_scatter_v(output, input, counts, code, async_op)

    cpdef barrier(self, bint async_op=False):
        """Wait until every rank of the group reached the barrier.

        Example::

            pg.barrier()
        """
        return self._comm.barrier(async_op)

    # ---- point to point (blocking; isend/irecv are in ProcessGroup) --------------------------
    cpdef send(self, array, dst, tag=0):
        """Send ``array`` to rank ``dst`` (returns once it is in shared memory or received).

        Example::

            pg.send(np.arange(4), dst=1, tag=7)
        """
        self._p2p.send(array, _rank_arg(dst, "dst"), _tag_arg(tag))

    cpdef recv(self, array, src=None, tag=0):
        """Receive into ``array`` from ``src`` (None: any rank); returns the sender's rank.

        Example::

            sender = pg.recv(buf, src=None, tag=7)
        """
        return self._p2p.recv(array, source_arg(src), _tag_arg(tag))


# ---- module-level collectives (shmcomm.all_reduce, ...): the group's method, on the default group
def all_reduce(array, op=_SUM, group=None, async_op=False):
    """Reduce ``array`` in place over all ranks. Example: ``sc.all_reduce(x, op=sc.ReduceOp.MAX)``."""
    return _resolve(group).all_reduce(array, op, async_op)


def broadcast(array, src, group=None, async_op=False):
    """Copy rank ``src``'s array to every rank. Example: ``sc.broadcast(w, src=0)``."""
    return _resolve(group).broadcast(array, src, async_op)


def reduce(array, dst, op=_SUM, group=None, async_op=False):
    """Reduce into ``array`` on rank ``dst`` only. Example: ``sc.reduce(x, dst=0)``."""
    return _resolve(group).reduce(array, dst, op, async_op)


def all_gather(output_list, array, group=None, async_op=False):
    """Every rank gets every rank's array. Example: ``sc.all_gather(outs, x)``."""
    return _resolve(group).all_gather(output_list, array, async_op)


def all_gather_into(output, array, group=None, async_op=False):
    """All-gather into one array, rank-major. Example: ``sc.all_gather_into(out, x)``."""
    return _resolve(group).all_gather_into(output, array, async_op)


def gather(array, gather_list=None, dst=0, group=None, async_op=False):
    """Collect arrays on rank ``dst``. Example: ``sc.gather(x, outs if rank == 0 else None)``."""
    return _resolve(group).gather(array, gather_list, dst, async_op)


def scatter(array, scatter_list=None, src=0, group=None, async_op=False):
    """Hand rank q ``scatter_list[q]`` of ``src``. Example: ``sc.scatter(x, parts, src=0)``."""
    return _resolve(group).scatter(array, scatter_list, src, async_op)


def reduce_scatter(output, input_list, op=_SUM, group=None, async_op=False):
    """Reduce ``input_list[r]`` over ranks into rank r's ``output``. Example: ``sc.reduce_scatter(o, ins)``."""
    return _resolve(group).reduce_scatter(output, input_list, op, async_op)


def reduce_scatter_into(output, input, op=_SUM, group=None, async_op=False):
    """reduce_scatter with one rank-major input. Example: ``sc.reduce_scatter_into(o, whole)``."""
    return _resolve(group).reduce_scatter_into(output, input, op, async_op)


def all_to_all(output_list, input_list, group=None, async_op=False):
    """Exchange ``input_list[q]`` with rank q. Example: ``sc.all_to_all(outs, ins)``."""
    return _resolve(group).all_to_all(output_list, input_list, async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    """All-to-all on single arrays. Example: ``sc.all_to_all_single(out, inp, [1, 3], [2, 2])``."""
    return _resolve(group).all_to_all_single(output, input, output_split_sizes, input_split_sizes, async_op)


def all_gather_v(output, array, counts, displs=None, group=None, async_op=False):
    """Allgatherv: pieces of different sizes. Example: ``sc.all_gather_v(out, x, counts)``."""
    return _resolve(group).all_gather_v(output, array, counts, displs, async_op)


def gather_v(array, output=None, counts=None, displs=None, dst=0, group=None, async_op=False):
    """Gatherv on ``dst``. Example: ``sc.gather_v(x, out if rank == 0 else None, counts)``."""
    return _resolve(group).gather_v(array, output, counts, displs, dst, async_op)


def scatter_v(output, input=None, counts=None, displs=None, src=0, group=None, async_op=False):
    """Scatterv from ``src``. Example: ``sc.scatter_v(mine, whole if rank == 0 else None, counts)``."""
    return _resolve(group).scatter_v(output, input, counts, displs, src, async_op)


def reduce_scatter_v(output, input, counts, op=_SUM, group=None, async_op=False):
    """Reduce_scatter with counts. Example: ``sc.reduce_scatter_v(out, whole, counts)``."""
    return _resolve(group).reduce_scatter_v(output, input, counts, op, async_op)


def barrier(group=None, async_op=False):
    """Wait for every rank of the group. Example: ``sc.barrier()``."""
    return _resolve(group).barrier(async_op)


def send(array, dst, tag=0, group=None):
    """Send ``array`` to ``dst``. Example: ``sc.send(x, dst=1, tag=3)``."""
    _resolve(group).send(array, dst, tag)


def recv(array, src=None, tag=0, group=None):
    """Receive into ``array``; returns the sender. Example: ``who = sc.recv(buf)``."""
    return _resolve(group).recv(array, src, tag)
