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

    # ---- point to point (blocking; isend/irecv are in ProcessGroup) --------------------------
    cpdef send(self, array, dst, tag=0):
        """``shmcomm.send`` on this group (full text: shmcomm.collectives copies it here)."""
        self._p2p.send(array, _rank_arg(dst, "dst"), _tag_arg(tag))

    cpdef recv(self, array, src=None, tag=0):
        """``shmcomm.recv`` on this group (full text: shmcomm.collectives copies it here)."""
        return self._p2p.recv(array, source_arg(src), _tag_arg(tag))


# ---- module-level collectives (shmcomm.all_reduce, ...): the group's method, on the default group
# These docstrings are the one full text of each collective: shmcomm.collectives copies each onto
# the ProcessGroup method of the same name at import (without the ``group`` argument).
#
# Shared wording: "array" is a numpy array, a torch CPU tensor or a C-contiguous buffer-protocol
# object; every numpy bool, integer, float and complex dtype works, and bfloat16.

def all_reduce(array, op=_SUM, group=None, async_op=False):
    """Reduce ``array`` element-wise over every rank of the group, in place.

    Every rank passes an array of the same size and dtype and gets the reduction of all of
    them. Ranks reduce in one fixed order (rank 0, 1, ...), so the result is bit-identical on
    every rank, whatever the SIMD level. float16 and bfloat16 accumulate in float32.
    ``BAND``/``BOR``/``BXOR`` take integer and bool arrays only; complex has no ``MIN``/``MAX``;
    bool has no ``AVG``; integer ``AVG`` truncates toward zero.

    Args:
        array (ndarray | Tensor | buffer): numpy array, torch CPU tensor or C-contiguous
            buffer-protocol object, writable; input and output. Same size and dtype on every
            rank; any size, 0 included. Dtypes: every numpy bool, integer, float (float16
            included) and complex type, and bfloat16 (torch, or ``ml_dtypes``).
        op (ReduceOp | str | int): the reduction, default ``ReduceOp.SUM``; also its name
            (``"max"``), its code, or torch's ``ReduceOp``. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``array`` holds the result. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[array]``.

    Raises:
        TypeError: ``array`` is not an array or has an unsupported dtype; ``op`` does not apply to
            the dtype.
        ValueError: ``array`` is not C-contiguous or not writable; ``op`` is unknown; the group was
            destroyed.
        CollectiveMismatchError: the ranks passed different sizes, dtypes or ops, or called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        x = np.full(3, sc.get_rank() + 1.0)
        sc.all_reduce(x)                            # 2 ranks: x == [3., 3., 3.]
        sc.all_reduce(x, op=sc.ReduceOp.MAX)
        work = sc.all_reduce(x, op="avg", async_op=True)
        out, = work.result()                        # waits; out is x
    """
    return _resolve(group).all_reduce(array, op, async_op)


def broadcast(array, src, group=None, async_op=False):
    """Copy ``array`` of rank ``src`` into ``array`` of every other rank.

    Args:
        array (ndarray | Tensor | buffer): numpy array, torch CPU tensor or C-contiguous
            buffer-protocol object of the same size and dtype on every rank (any dtype of
            ``all_reduce``). Read on ``src``; written, so writable, on the others.
        src (int): the rank that sends, within the group. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``array`` holds ``src``'s data. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[array]``.

    Raises:
        TypeError: ``array`` is not an array or has an unsupported dtype; ``src`` is not an int.
        ValueError: ``src`` is not a rank of the group; ``array`` is not C-contiguous, or not
            writable on a receiving rank; the group was destroyed.
        CollectiveMismatchError: the ranks passed different sizes, dtypes or ``src``, or called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        w = np.arange(4.0) if sc.get_rank() == 0 else np.empty(4)
        sc.broadcast(w, src=0)                      # every rank: w == [0., 1., 2., 3.]
    """
    return _resolve(group).broadcast(array, src, async_op)


def reduce(array, dst, op=_SUM, group=None, async_op=False):
    """Reduce ``array`` element-wise over every rank into ``array`` of rank ``dst``.

    As ``all_reduce`` (same dtypes, ops, fixed order and float32 accumulation of half types),
    but only ``dst`` gets the result; the other ranks' arrays are unchanged.

    Args:
        array (ndarray | Tensor | buffer): numpy array, torch CPU tensor or C-contiguous
            buffer-protocol object, writable (on every rank); same size and dtype on every rank.
            The input everywhere, the output on ``dst``.
        dst (int): the rank that gets the result, within the group. Same on every rank.
        op (ReduceOp | str | int): the reduction, default ``ReduceOp.SUM`` (see ``all_reduce``).
            Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once the call is done on this rank. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[array]``.

    Raises:
        TypeError: ``array`` is not an array or has an unsupported dtype; ``op`` does not apply to
            the dtype; ``dst`` is not an int.
        ValueError: ``dst`` is not a rank of the group; ``array`` is not C-contiguous or not
            writable; ``op`` is unknown; the group was destroyed.
        CollectiveMismatchError: the ranks passed different sizes, dtypes, ops or ``dst``, or called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        x = np.full(3, sc.get_rank() + 1.0)
        sc.reduce(x, dst=0)                         # 2 ranks: x == [3., 3., 3.] on rank 0 only
    """
    return _resolve(group).reduce(array, dst, op, async_op)


def all_gather(output_list, array, group=None, async_op=False):
    """Gather every rank's ``array`` into ``output_list`` on every rank.

    ``output_list[q]`` receives rank q's ``array``. Pieces may differ in size between ranks
    (as in torch): ``output_list[q]`` is then sized like rank q's array, on every rank.

    Args:
        output_list (list[ndarray | Tensor | buffer]): ``world_size`` writable C-contiguous
            arrays of ``array``'s dtype.
        array (ndarray | Tensor | buffer): this rank's piece: numpy array, torch CPU tensor or
            C-contiguous buffer-protocol object (any dtype of ``all_reduce``).
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output_list`` is filled. With ``async_op=True``, a ``Work``: its ``wait()``
        raises the communication errors below, its ``result()`` is the arrays of
        ``output_list`` (a list).

    Raises:
        TypeError: an array is not one or has an unsupported dtype.
        ValueError: ``output_list`` does not hold ``world_size`` arrays, or one differs in dtype, is
            not writable, is not C-contiguous or is not sized like its rank's piece; the group was
            destroyed.
        CollectiveMismatchError: the ranks disagree on the sizes or dtype, or called different
            collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        x = np.full(2, sc.get_rank(), np.int32)
        outs = [np.empty(2, np.int32) for _ in range(sc.get_world_size())]
        sc.all_gather(outs, x)                      # outs[q] == [q, q]
    """
    return _resolve(group).all_gather(output_list, array, async_op)


def all_gather_into(output, array, group=None, async_op=False):
    """Gather every rank's ``array`` into one array, rank-major, on every rank.

    ``output`` holds ``world_size * array.size`` elements; rank q's ``array`` lands at
    element ``q * array.size`` (NCCL's all_gather, torch's ``all_gather_into_tensor``).

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array of ``world_size *
            array.size`` elements of ``array``'s dtype.
        array (ndarray | Tensor | buffer): this rank's piece: numpy array, torch CPU tensor or
            C-contiguous buffer-protocol object (any dtype of ``all_reduce``), the same size on
            every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` is filled. With ``async_op=True``, a ``Work``: its ``wait()``
        raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype.
        ValueError: ``output`` has the wrong size or dtype, or is not writable or not C-contiguous;
            the group was destroyed.
        CollectiveMismatchError: the ranks passed different sizes or dtypes, or called different
            collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        x = np.full(2, sc.get_rank(), np.int32)
        out = np.empty(2 * sc.get_world_size(), np.int32)
        sc.all_gather_into(out, x)                  # 2 ranks: out == [0, 0, 1, 1]
    """
    return _resolve(group).all_gather_into(output, array, async_op)


def gather(array, gather_list=None, dst=0, group=None, async_op=False):
    """Gather every rank's ``array`` into ``gather_list`` on rank ``dst``.

    ``gather_list[q]`` on ``dst`` receives rank q's ``array``. Every piece has the same size
    (the other ranks cannot know the root's sizes): for pieces of different sizes use
    ``gather_v``.

    Args:
        array (ndarray | Tensor | buffer): this rank's piece: numpy array, torch CPU tensor or
            C-contiguous buffer-protocol object (any dtype of ``all_reduce``), the same size and
            dtype on every rank.
        gather_list (list[ndarray | Tensor | buffer] | None): on ``dst``, ``world_size``
            writable C-contiguous arrays sized like ``array``; None (the default) on the others.
        dst (int): the rank that gathers, within the group; default 0. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once the call is done on this rank. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is the arrays of
        ``gather_list`` on ``dst`` and ``[]`` on the others.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``dst`` is not an int.
        ValueError: ``dst`` is not a rank of the group; ``gather_list`` is missing on ``dst`` or
            given elsewhere, does not hold ``world_size`` arrays, or holds one of another size or
            dtype, not writable or not C-contiguous; the group was destroyed.
        CollectiveMismatchError: the ranks passed different sizes, dtypes or ``dst``, or called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        x = np.full(2, sc.get_rank(), np.int32)
        outs = [np.empty(2, np.int32) for _ in range(sc.get_world_size())] if sc.get_rank() == 0 else None
        sc.gather(x, outs, dst=0)                   # on rank 0: outs[q] == [q, q]
    """
    return _resolve(group).gather(array, gather_list, dst, async_op)


def scatter(array, scatter_list=None, src=0, group=None, async_op=False):
    """Hand rank q the piece ``scatter_list[q]`` of rank ``src``, into its ``array``.

    Every piece has the same size (the other ranks cannot know the root's sizes): for pieces
    of different sizes use ``scatter_v``.

    Args:
        array (ndarray | Tensor | buffer): writable C-contiguous array that receives this
            rank's piece: numpy array, torch CPU tensor or buffer-protocol object (any dtype of
            ``all_reduce``), the same size and dtype on every rank.
        scatter_list (list[ndarray | Tensor | buffer] | None): on ``src``, ``world_size``
            C-contiguous arrays sized like ``array``; None (the default) on the others.
        src (int): the rank that scatters, within the group; default 0. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``array`` holds this rank's piece. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[array]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``src`` is not an int.
        ValueError: ``src`` is not a rank of the group; ``scatter_list`` is missing on ``src`` or
            given elsewhere, does not hold ``world_size`` arrays, or holds one of another size or
            dtype; ``array`` is not writable or not C-contiguous; the group was destroyed.
        CollectiveMismatchError: the ranks passed different sizes, dtypes or ``src``, or called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        n = sc.get_world_size()
        parts = [np.full(2, q, np.int32) for q in range(n)] if sc.get_rank() == 0 else None
        mine = np.empty(2, np.int32)
        sc.scatter(mine, parts, src=0)              # rank q: mine == [q, q]
    """
    return _resolve(group).scatter(array, scatter_list, src, async_op)


def reduce_scatter(output, input_list, op=_SUM, group=None, async_op=False):
    """Reduce ``input_list[r]`` over every rank into ``output`` of rank r.

    Dtypes, ops, the fixed rank order (bit-identical results) and float32 accumulation of
    half types are those of ``all_reduce``. Pieces may differ in size between ranks (as in
    torch): ``input_list[q]`` is then sized like rank q's ``output``, on every rank.

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array that receives this
            rank's reduced piece.
        input_list (list[ndarray | Tensor | buffer]): ``world_size`` C-contiguous arrays of
            ``output``'s dtype; ``input_list[q]`` is this rank's contribution to rank q.
        op (ReduceOp | str | int): the reduction, default ``ReduceOp.SUM`` (see ``all_reduce``).
            Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` holds the result. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``op`` does not apply to the
            dtype.
        ValueError: ``input_list`` does not hold ``world_size`` arrays, or one differs in dtype or
            has the wrong size; ``output`` is not writable or not C-contiguous; ``op`` is unknown;
            the group was destroyed.
        CollectiveMismatchError: the ranks disagree on sizes, dtype or op, or called different
            collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        n = sc.get_world_size()
        out = np.empty(2)
        sc.reduce_scatter(out, [np.full(2, q + 1.0) for q in range(n)])   # rank q: out == n * (q + 1)
    """
    return _resolve(group).reduce_scatter(output, input_list, op, async_op)


def reduce_scatter_into(output, input, op=_SUM, group=None, async_op=False):
    """``reduce_scatter`` with one input array of ``world_size * output.size`` elements.

    Piece r of ``input`` (elements ``r * output.size`` on, rank-major) is this rank's
    contribution to rank r (NCCL's reduce_scatter, torch's ``reduce_scatter_tensor``). Dtypes,
    ops, the fixed rank order and float32 accumulation of half types are those of ``all_reduce``.

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array that receives this
            rank's reduced piece; the same size on every rank.
        input (ndarray | Tensor | buffer): C-contiguous array of ``world_size * output.size``
            elements of ``output``'s dtype.
        op (ReduceOp | str | int): the reduction, default ``ReduceOp.SUM`` (see ``all_reduce``).
            Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` holds the result. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``op`` does not apply to the
            dtype.
        ValueError: ``input`` has the wrong size or dtype; ``output`` is not writable or not
            C-contiguous; ``op`` is unknown; the group was destroyed.
        CollectiveMismatchError: the ranks passed different sizes, dtypes or ops, or called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        n = sc.get_world_size()
        out = np.empty(2)
        sc.reduce_scatter_into(out, np.ones(2 * n))  # out == [n, n]
    """
    return _resolve(group).reduce_scatter_into(output, input, op, async_op)


def all_to_all(output_list, input_list, group=None, async_op=False):
    """Send ``input_list[q]`` to rank q; ``output_list[q]`` receives rank q's piece for this rank.

    Pieces may differ in size (as in torch): ``output_list[q]`` on rank r is then sized like
    ``input_list[r]`` of rank q.

    Args:
        output_list (list[ndarray | Tensor | buffer]): ``world_size`` writable C-contiguous
            arrays of the inputs' dtype.
        input_list (list[ndarray | Tensor | buffer]): ``world_size`` C-contiguous arrays of one
            dtype (any dtype of ``all_reduce``).
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output_list`` is filled. With ``async_op=True``, a ``Work``: its ``wait()``
        raises the communication errors below, its ``result()`` is the arrays of
        ``output_list`` (a list).

    Raises:
        TypeError: an array is not one or has an unsupported dtype.
        ValueError: a list does not hold ``world_size`` arrays, or holds one of another dtype, not
            C-contiguous, or (outputs) not writable; the group was destroyed.
        CollectiveMismatchError: the ranks' sizes do not match pairwise, or they called different
            collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        r, n = sc.get_rank(), sc.get_world_size()
        ins = [np.full(2, 10.0 * r + q) for q in range(n)]
        outs = [np.empty(2) for _ in range(n)]
        sc.all_to_all(outs, ins)                    # outs[q] == [10 * q + r, 10 * q + r]
    """
    return _resolve(group).all_to_all(output_list, input_list, async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    """``all_to_all`` on one input and one output array, cut into consecutive pieces.

    Piece q of ``input`` goes to rank q; piece q of ``output`` receives rank q's piece for this
    rank. Without split sizes every piece is ``1/world_size`` of the array; with them,
    ``input_split_sizes[q]`` and ``output_split_sizes[q]`` count the rows of piece q along the
    first axis (elements, for a 1-D array), as in torch.

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array of ``input``'s dtype.
        input (ndarray | Tensor | buffer): C-contiguous array (any dtype of ``all_reduce``).
        output_split_sizes (Sequence[int] | None): ``world_size`` row counts (first axis)
            summing to ``output``'s length; None (the default): equal pieces.
        input_split_sizes (Sequence[int] | None): ``world_size`` row counts (first axis)
            summing to ``input``'s length; None (the default): equal pieces.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` is filled. With ``async_op=True``, a ``Work``: its ``wait()``
        raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; a split size is not an int.
        ValueError: the dtypes differ; split sizes are not ``world_size`` non-negative counts
            summing to the array's size, or are None where the size does not divide evenly;
            ``output`` is not writable or not C-contiguous; the group was destroyed.
        CollectiveMismatchError: the ranks' split sizes do not match pairwise, or they called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        n = sc.get_world_size()
        inp = np.arange(2.0 * n) + 100 * sc.get_rank()
        out = np.empty(2 * n)
        sc.all_to_all_single(out, inp)              # equal pieces of 2 elements
        sc.all_to_all_single(out, inp, [2] * n, [2] * n)   # the same, with explicit sizes
    """
    return _resolve(group).all_to_all_single(output, input, output_split_sizes, input_split_sizes, async_op)


def all_gather_v(output, array, counts, displs=None, group=None, async_op=False):
    """Gather pieces of different sizes into one array on every rank (MPI's Allgatherv).

    Rank q's ``array`` (``counts[q]`` elements) lands in every rank's ``output`` at element
    ``displs[q]`` (default: packed in rank order). Every rank passes the same ``counts`` and
    ``displs``; elements of ``output`` outside the pieces are left as they are.

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array of ``array``'s dtype,
            large enough for every piece.
        array (ndarray | Tensor | buffer): this rank's piece of ``counts[rank]`` elements
            (any dtype of ``all_reduce``).
        counts (Sequence[int]): ``world_size`` element counts, one per rank.
        displs (Sequence[int] | None): ``world_size`` element offsets into ``output``; pieces
            must not overlap. None (the default): packed in rank order.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` is filled. With ``async_op=True``, a ``Work``: its ``wait()``
        raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``counts`` or ``displs`` is not
            a sequence of ints.
        ValueError: the dtypes differ; ``counts``/``displs`` are not ``world_size`` non-negative
            values, a piece ends past ``output`` or overlaps another, or ``array`` does not hold
            ``counts[rank]`` elements; ``output`` is not writable or not C-contiguous; the group was
            destroyed.
        CollectiveMismatchError: the ranks' counts disagree, or they called different collectives
            (raised on every rank, naming both ranks).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        r, n = sc.get_rank(), sc.get_world_size()
        counts = [q + 1 for q in range(n)]
        out = np.empty(sum(counts), np.float32)
        sc.all_gather_v(out, np.full(r + 1, r, np.float32), counts)   # 2 ranks: [0., 1., 1.]
    """
    return _resolve(group).all_gather_v(output, array, counts, displs, async_op)


def gather_v(array, output=None, counts=None, displs=None, dst=0, group=None, async_op=False):
    """Gather pieces of different sizes into one array on rank ``dst`` (MPI's Gatherv).

    Rank q's ``array`` (``counts[q]`` elements) lands in ``output`` of ``dst`` at element
    ``displs[q]`` (default: packed in rank order). ``output``, ``counts`` and ``displs`` matter
    on ``dst`` only: the other ranks need not know the sizes.

    Args:
        array (ndarray | Tensor | buffer): this rank's piece (any dtype of ``all_reduce``).
        output (ndarray | Tensor | buffer | None): on ``dst``, a writable C-contiguous array of
            ``array``'s dtype, large enough for every piece; None (the default) on the others.
        counts (Sequence[int] | None): on ``dst``, ``world_size`` element counts; ignored
            elsewhere. Default None.
        displs (Sequence[int] | None): on ``dst``, ``world_size`` element offsets into
            ``output`` (pieces must not overlap); None (the default): packed in rank order.
        dst (int): the rank that gathers, within the group; default 0. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once the call is done on this rank. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[output]``
        (``[None]`` on ranks other than ``dst``).

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``counts``, ``displs`` or
            ``dst`` is not made of ints.
        ValueError: ``dst`` is not a rank of the group; ``output`` is missing on ``dst`` or given
            elsewhere, of another dtype, not writable or not C-contiguous; ``counts`` is missing on
            ``dst``; a piece ends past ``output`` or overlaps another, or ``array`` does not hold
            ``counts[dst]`` elements on ``dst``; the group was destroyed.
        CollectiveMismatchError: a rank's ``array`` does not hold its ``counts`` entry, the ranks
            passed different ``dst``, or called different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        r, n = sc.get_rank(), sc.get_world_size()
        counts = [q + 1 for q in range(n)]
        out = np.empty(sum(counts)) if r == 0 else None
        sc.gather_v(np.full(r + 1, float(r)), out, counts, dst=0)   # 2 ranks, rank 0: [0., 1., 1.]
    """
    return _resolve(group).gather_v(array, output, counts, displs, dst, async_op)


def scatter_v(output, input=None, counts=None, displs=None, src=0, group=None, async_op=False):
    """Scatter pieces of different sizes from one array on rank ``src`` (MPI's Scatterv).

    Rank q's ``output`` receives ``counts[q]`` elements of ``input`` of ``src``, from element
    ``displs[q]`` (default: packed in rank order). ``input``, ``counts`` and ``displs`` matter
    on ``src`` only: the other ranks need not know the sizes.

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array that receives this
            rank's piece (any dtype of ``all_reduce``).
        input (ndarray | Tensor | buffer | None): on ``src``, a C-contiguous array of
            ``output``'s dtype holding every piece; None (the default) on the others.
        counts (Sequence[int] | None): on ``src``, ``world_size`` element counts; ignored
            elsewhere. Default None.
        displs (Sequence[int] | None): on ``src``, ``world_size`` element offsets into
            ``input`` (pieces may overlap); None (the default): packed in rank order.
        src (int): the rank that scatters, within the group; default 0. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` holds this rank's piece. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``counts``, ``displs`` or
            ``src`` is not made of ints.
        ValueError: ``src`` is not a rank of the group; ``input`` is missing on ``src`` or given
            elsewhere, or of another dtype; ``counts`` is missing on ``src``; a piece ends past
            ``input``, or ``output`` does not hold ``counts[src]`` elements on ``src``; ``output``
            is not writable or not C-contiguous; the group was destroyed.
        CollectiveMismatchError: a rank's ``output`` does not hold its ``counts`` entry, the ranks
            passed different ``src``, or called different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        r, n = sc.get_rank(), sc.get_world_size()
        counts = [q + 1 for q in range(n)]
        whole = np.arange(float(sum(counts))) if r == 0 else None
        mine = np.empty(r + 1)
        sc.scatter_v(mine, whole, counts, src=0)    # 2 ranks: [0.] and [1., 2.]
    """
    return _resolve(group).scatter_v(output, input, counts, displs, src, async_op)


def reduce_scatter_v(output, input, counts, op=_SUM, group=None, async_op=False):
    """``reduce_scatter`` with pieces of different sizes (MPI's Reduce_scatter).

    ``input`` holds ``sum(counts)`` elements on every rank, packed in rank order; rank r's
    ``output`` (``counts[r]`` elements) gets the reduction over ranks of their piece r. Dtypes,
    ops, the fixed rank order (bit-identical results) and float32 accumulation of half types
    are those of ``all_reduce``.

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array of ``counts[rank]``
            elements that receives this rank's reduced piece.
        input (ndarray | Tensor | buffer): C-contiguous array of ``output``'s dtype holding
            ``sum(counts)`` elements.
        counts (Sequence[int]): ``world_size`` element counts, the same on every rank.
        op (ReduceOp | str | int): the reduction, default ``ReduceOp.SUM`` (see ``all_reduce``).
            Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` holds the result. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``op`` does not apply to the
            dtype; ``counts`` is not a sequence of ints.
        ValueError: the dtypes differ; ``counts`` is not ``world_size`` non-negative counts,
            ``input`` is too small, or ``output`` does not hold ``counts[rank]`` elements;
            ``output`` is not writable or not C-contiguous; ``op`` is unknown; the group was
            destroyed.
        CollectiveMismatchError: the ranks' counts, dtypes or ops disagree, or they called different
            collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        r, n = sc.get_rank(), sc.get_world_size()
        counts = [q + 1 for q in range(n)]
        out = np.empty(counts[r])
        sc.reduce_scatter_v(out, np.ones(sum(counts)), counts)   # out == [n, ...]
    """
    return _resolve(group).reduce_scatter_v(output, input, counts, op, async_op)


def barrier(group=None, async_op=False):
    """Wait until every rank of the group has reached the barrier.

    Runs in issue order with the group's other operations: it completes after every
    collective this rank issued before it.

    Args:
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once every rank arrived. With ``async_op=True``, a ``Work``: its ``wait()``
        raises the communication errors below, its ``result()`` is ``[]``.

    Raises:
        ValueError: the group was destroyed.
        CollectiveMismatchError: another rank called a different collective (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        sc.barrier()
        work = sc.barrier(async_op=True); work.wait()
    """
    return _resolve(group).barrier(async_op)


def send(array, dst, tag=0, group=None):
    """Send ``array`` to rank ``dst``; blocks until the bytes are in shared memory or received.

    Messages between one sender and one receiver arrive in the order sent (MPI's
    non-overtaking rule); the receiver's ``recv`` must name this ``tag`` (or ``src=None``) and
    pass an array of the same size and dtype. ``isend`` is the non-blocking form.

    Args:
        array (ndarray | Tensor | buffer): numpy array, torch CPU tensor or C-contiguous
            buffer-protocol object (any dtype of ``all_reduce``; any size, 0 included).
        dst (int): the receiving rank, within the group (this rank too).
        tag (int): a 64-bit signed message tag the receive must match; default 0.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).

    Returns:
        None.

    Raises:
        TypeError: ``array`` is not an array or has an unsupported dtype; ``dst`` or ``tag`` is not
            an int.
        ValueError: ``dst`` is not a rank of the group; ``tag`` does not fit in 64 bits; ``array``
            is not C-contiguous.
        CommTimeoutError: the message was not delivered within the group's timeout.
        PeerFailureError: ``dst`` died or left the group.
        AbortedError: the group was aborted.
        ShmcommError: the group was destroyed.

    Example::

        if sc.get_rank() == 0:
            sc.send(np.arange(4.0), dst=1, tag=7)
    """
    _resolve(group).send(array, dst, tag)


def recv(array, src=None, tag=0, group=None):
    """Receive a message into ``array``; returns the sender's rank.

    Blocks until a message from ``src`` (any rank when None) with this ``tag`` arrived; it
    must have ``array``'s size and dtype. ``irecv`` is the non-blocking form.

    Args:
        array (ndarray | Tensor | buffer): writable C-contiguous numpy array, torch CPU tensor
            or buffer-protocol object that receives the message.
        src (int | None): the sending rank, within the group; None (the default): any rank.
        tag (int): the 64-bit signed tag to match; default 0.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).

    Returns:
        int: the rank that sent the message (within the group).

    Raises:
        TypeError: ``array`` is not an array or has an unsupported dtype; ``src`` or ``tag`` is not
            an int.
        ValueError: ``src`` is negative or not a rank of the group; ``tag`` does not fit in 64 bits;
            ``array`` is not writable or not C-contiguous.
        CollectiveMismatchError: the matching message has another size or dtype.
        CommTimeoutError: no matching message arrived within the group's timeout.
        PeerFailureError: ``src`` died or left the group.
        AbortedError: the group was aborted.
        ShmcommError: the group was destroyed.

    Example::

        if sc.get_rank() == 1:
            buf = np.empty(4)
            sender = sc.recv(buf, src=None, tag=7)  # 0; buf == [0., 1., 2., 3.]
    """
    return _resolve(group).recv(array, src, tag)
