# Uneven pieces: all_gather, gather, scatter and reduce_scatter where ranks contribute different
# counts (MPI's Allgatherv/Gatherv/Scatterv/Reduce_scatter, and torch's list forms with tensors of
# different sizes).
#
# The data movements are an all_to_all with per-pair sizes (coll/all_to_all.pxi): its first step
# publishes every rank's sizes, so a rank that does not know its peers' counts (a non-root of
# gather_v, as in MPI) needs none, and every rank checks the whole size matrix; small ones finish
# in that same step, large ones are pulled straight from the senders' arrays (single copy).
# reduce_scatter_v has a loop of its own (below): the same first step, then reduce_scatter's.
#   all_gather_v: rank r sends its array to every rank; rank r's piece q goes to output piece q.
#   gather_v / scatter_v: only the pairs (q -> root) / (root -> q) carry bytes.
#   reduce_scatter_v: as reduce_scatter's slot path (every rank copies its chunk for each peer
#       into its slot, steps, and reduces in rank order the chunks left for it, halves in float32),
#       its first step carrying the size matrix; one result per output, so "bit-identical on every
#       rank" holds trivially.


def check_counts(counts, displs, long long length, int size, str argname, bint disjoint):
    """``(counts, displs)`` as lists of ``size`` non-negative ints, every piece inside an array
    of ``length`` elements (``displs`` None: packed in rank order); ``disjoint`` (outputs): no two
    pieces overlap, as MPI requires of receive buffers. Errors name ``argname``.

    Example::

        >>> check_counts([2, 0, 3], None, 5, 3, "output", True)
        ([2, 0, 3], [0, 2, 2])
    """
    cdef int q
    cdef long long *cs = _room(size)
    try:
        _check_counts(counts, displs, length, size, argname, disjoint, cs, cs + size)
        return [cs[q] for q in range(size)], [cs[size + q] for q in range(size)]
    finally:
        free(cs)


cdef long long *_room(int size) except NULL:
    """Room for counts and displacements (2 * size)."""
    cdef long long *at = <long long *>malloc(max(2 * size, 1) * sizeof(long long))
    if at == NULL:
        raise MemoryError()
    return at


# Appended where counts do not fit the array they cut: mpi4py's habit puts the send buffer first.
cdef str V_ORDER = ("; counts cut the array that holds every rank's piece, and shmcomm's arguments come in "
                    "its own order: all_gather_v(output, array, counts), gather_v(array, output, "
                    "counts, dst=), scatter_v(output, input, counts, src=), reduce_scatter_v(output, "
                    "input, counts) (mpi4py's Allgatherv and Reduce_scatter take the send buffer first)")


cdef int _check_counts(object counts, object displs, long long length, int size, str argname,
                       bint disjoint, long long *cs, long long *ds) except -1:
    """check_counts into C arrays: a typed loop, as this is on every v call's path."""
    cdef int q
    cdef long long at = 0
    _counts_into(counts, size, "counts", cs)
    if displs is None:  # packed: in bounds when the total is, and never overlapping
        for q in range(size):
            ds[q] = at
            at += cs[q]
    else:
        _counts_into(displs, size, "displs", ds)
    for q in range(size):  # both are non-negative: written so that no sum can overflow
        if cs[q] > length or ds[q] > length - cs[q]:
            raise ValueError(f"{argname}: piece {q} (counts[{q}]={cs[q]} from element {ds[q]}) "
                             f"ends past the array's {length} elements{V_ORDER}")
    if disjoint and displs is not None:
        spans = sorted((ds[q], ds[q] + cs[q], q) for q in range(size) if cs[q])
        for (lo, hi, q), (lo2, hi2, q2) in zip(spans, spans[1:]):
            if lo2 < hi:
                raise ValueError(f"{argname}: pieces {q} and {q2} overlap (displs and counts)")
    return 0


cdef int _counts_into(object counts, int size, str argname, long long *out) except -1:
    """``counts`` as ``size`` non-negative ints in ``out``; errors name ``argname``."""
    cdef Py_ssize_t q
    cdef object x
    if counts is None:
        raise ValueError(f"{argname} is required: world_size={size} element counts")
    if type(counts) is not list and type(counts) is not tuple:
        try:
            counts = list(counts)
        except TypeError:
            raise TypeError(f"{argname} must be a sequence of {size} ints, got "
                            f"{type(counts).__name__}") from None
    if len(counts) != size:
        raise ValueError(f"{argname} must be {size} non-negative element counts, got {list(counts)}")
    for q in range(size):
        x = counts[q]
        if type(x) is not int:
            if isinstance(x, bool) or not hasattr(type(x), "__index__"):
                raise TypeError(f"{argname}[{q}] must be an int element count, got {type(x).__name__}")
            x = _index(x)  # numpy integers
        out[q] = x
        if out[q] < 0:
            raise ValueError(f"{argname} must be {size} non-negative element counts, got {list(counts)}")
    return 0


cdef int _set_counts(Communicator c, object counts, object displs, buf_t *b, str argname,
                     char **table, size_t *sizes, bint disjoint) except -1:
    """Point table[q] at the counts[q] elements of ``b`` from displs[q] (see check_counts)."""
    cdef int q, n = c.size
    cdef long long stack[2 * INLINE_RANKS]
    cdef long long *cs = &stack[0]
    if n > INLINE_RANKS:
        cs = _room(n)
    try:
        _check_counts(counts, displs, b.count, n, argname, disjoint, cs, cs + n)
        for q in range(n):
            table[q] = b.ptr + <size_t>cs[n + q] * b.itemsize
            sizes[q] = <size_t>cs[q] * b.itemsize
    finally:
        if cs != &stack[0]:
            free(cs)
    return 0


cdef int _check_own(buf_t *mine, size_t theirs, str what) except -1:
    """This rank's own piece of a list/counts must match its array (as torch and MPI require)."""
    if theirs != mine.nbytes:
        raise ValueError(f"{what} has {theirs // mine.itemsize} {DTYPE_NAMES[mine.dtype]} "
                         f"elements but this rank's array has {mine.count}")
    return 0


cdef void _set_uneven(op_t *o, int kind, buf_t *b, int root) noexcept:
    o.kind, o.dtype, o.itemsize, o.root, o.uniform = kind, b.dtype, b.itemsize, root, False
    o.nbytes = b.nbytes  # this rank's share: what decides an eager start of an async op


cdef void _send_everywhere(Communicator c, op_t *o, buf_t *b) noexcept:
    cdef int q
    for q in range(c.size):
        o.ins[q], o.in_bytes[q] = b.ptr, b.nbytes


cdef void _nothing_moves(Communicator c, char **table, size_t *sizes, char *at) noexcept:
    cdef int q
    for q in range(c.size):
        table[q], sizes[q] = at, 0


# ---- torch's list forms with pieces of different sizes ---------------------------------------
cdef int _set_all_gather_list_v(Communicator c, op_t *o, buf_t *b) except -1:
    """all_gather whose output_list (already in o.outs/o.out_bytes) is uneven."""
    _check_own(b, o.out_bytes[c.rank], f"output_list[{c.rank}]")
    _send_everywhere(c, o, b)
    _set_uneven(o, K_ALL_GATHER_V, b, 0)
    o.overlap = _any_overlap(c, o)
    return 0


# ---- MPI's v forms: one flat array with counts (and displacements) ---------------------------
cdef object _prep_all_gather_v(Communicator c, op_t *o, object output, object array, object counts,
                               object displs):
    cdef buf_t b, whole
    owner = as_buf(array, &b, False, "array")
    out_owner = as_buf(output, &whole, True, "output")
    if whole.dtype != b.dtype:
        raise ValueError(f"output is {DTYPE_NAMES[whole.dtype]} but array is {DTYPE_NAMES[b.dtype]}")
    _set_counts(c, counts, displs, &whole, "output", o.outs, o.out_bytes, True)
    _check_own(&b, o.out_bytes[c.rank], f"counts[{c.rank}]")
    _send_everywhere(c, o, &b)
    _set_uneven(o, K_ALL_GATHER_V, &b, 0)
    o.overlap = _any_overlap(c, o)
    return (owner, out_owner)


cdef object _prep_gather_v(Communicator c, op_t *o, object array, object output, object counts,
                           object displs, int root):
    cdef buf_t b, whole
    c._check_root(root, "dst")
    owner = as_buf(array, &b, False, "array")
    _nothing_moves(c, o.ins, o.in_bytes, b.ptr)
    o.ins[root], o.in_bytes[root] = b.ptr, b.nbytes
    _set_uneven(o, K_GATHER_V, &b, root)
    if c.rank != root:
        if output is not None:
            raise ValueError("output must be None on ranks other than dst")
        _nothing_moves(c, o.outs, o.out_bytes, b.ptr)
        return owner
    if output is None:
        raise ValueError("output is required on the dst rank")
    out_owner = as_buf(output, &whole, True, "output")
    if whole.dtype != b.dtype:
        raise ValueError(f"output is {DTYPE_NAMES[whole.dtype]} but array is {DTYPE_NAMES[b.dtype]}")
    _set_counts(c, counts, displs, &whole, "output", o.outs, o.out_bytes, True)
    _check_own(&b, o.out_bytes[root], f"counts[{root}]")
    o.overlap = _any_overlap(c, o)
    return (owner, out_owner)


cdef object _prep_scatter_v(Communicator c, op_t *o, object output, object input, object counts,
                            object displs, int root):
    cdef buf_t b, whole
    c._check_root(root, "src")
    out_owner = as_buf(output, &b, True, "output")
    _nothing_moves(c, o.outs, o.out_bytes, b.ptr)
    o.outs[root], o.out_bytes[root] = b.ptr, b.nbytes
    _set_uneven(o, K_SCATTER_V, &b, root)
    if c.rank != root:
        if input is not None:
            raise ValueError("input must be None on ranks other than src")
        _nothing_moves(c, o.ins, o.in_bytes, b.ptr)
        return out_owner
    if input is None:
        raise ValueError("input is required on the src rank")
    in_owner = as_buf(input, &whole, False, "input")
    if whole.dtype != b.dtype:
        raise ValueError(f"input is {DTYPE_NAMES[whole.dtype]} but output is {DTYPE_NAMES[b.dtype]}")
    _set_counts(c, counts, displs, &whole, "input", o.ins, o.in_bytes, False)
    _check_own(&b, o.in_bytes[root], f"counts[{root}]")
    o.overlap = _any_overlap(c, o)
    return (out_owner, in_owner)


cdef object _prep_reduce_scatter_v(Communicator c, op_t *o, object output, object input,
                                   object counts, int op, double factor):
    cdef buf_t b, whole
    out_owner = as_buf(output, &b, True, "output")
    in_owner = as_buf(input, &whole, False, "input")
    check_reduce_op(b.dtype, op)
    if whole.dtype != b.dtype:
        raise ValueError(f"input is {DTYPE_NAMES[whole.dtype]} but output is {DTYPE_NAMES[b.dtype]}")
    _set_counts(c, counts, None, &whole, "input", o.ins, o.in_bytes, False)
    _check_own(&b, o.in_bytes[c.rank], f"counts[{c.rank}]")
    _set_reduce_scatter_v(c, o, &b, op, factor)
    return (out_owner, in_owner)


cdef int _set_reduce_scatter_list_v(Communicator c, op_t *o, buf_t *b, int op, double factor) except -1:
    """reduce_scatter whose input_list (already in o.ins/o.in_bytes) is uneven."""
    _check_own(b, o.in_bytes[c.rank], f"input_list[{c.rank}]")
    return _set_reduce_scatter_v(c, o, b, op, factor)


cdef int _set_reduce_scatter_v(Communicator c, op_t *o, buf_t *out, int op, double factor) except -1:
    """Chunks are reduced into the output while later chunks of the pieces for peers are still
    to be sent: the output may be this rank's own piece (in place), never overlap another."""
    cdef int q
    for q in range(c.size):
        if _spans_overlap(out.ptr, out.nbytes, o.ins[q], o.in_bytes[q]) and \
                (q != c.rank or out.ptr != o.ins[q]):
            raise ValueError(f"output overlaps the input piece for rank {q} (in place, the output "
                             f"must be exactly this rank's own piece, {c.rank})")
    _set_uneven(o, K_REDUCE_SCATTER_V, out, 0)
    o.ptr, o.count, o.nbytes, o.op, o.factor = out.ptr, out.count, out.nbytes, op, factor
    return 0


cdef int _run_reduce_scatter_v(Communicator c, op_t *o) except -1 nogil:
    """As reduce_scatter's slot path, with pieces of any size: per chunk, every rank copies its
    chunk for each peer into its slot, steps, and reduces (in rank order) the chunks peers left
    for it, while they are in cache. The first step also carries every rank's piece sizes and
    output size, which every rank checks in full (a disagreement fails on every rank)."""
    cdef uint32_t s
    cdef int q, a, b, n = c.size, itemsize = o.itemsize
    cdef size_t header = _align_up((n + 1) * sizeof(uint64_t), 64)
    cdef size_t cap = ((c.slot_bytes - header) // n) // 64 * 64 // itemsize * itemsize
    cdef size_t off = 0, ch, most = 0
    cdef uint64_t *sizes
    cdef char **ins = o.ins
    cdef bint first = True
    _set_desc(c, K_REDUCE_SCATTER_V, o.dtype, 0, 0, o.op)
    c._set_factor(o)
    while first or off < most:
        s = c.next_step()
        if first:
            sizes = <uint64_t *>c.slot(c.rank, s)
            for q in range(n):
                sizes[q] = o.in_bytes[q]
            sizes[n] = o.nbytes
        for q in range(n):
            if q != c.rank and o.in_bytes[q] > off:
                memcpy(c.slot(c.rank, s) + header + q * cap, ins[q] + off, min(cap, o.in_bytes[q] - off))
        _step(c)
        if first:
            _check_desc(c)
            c._load_factors(o)
            for a in range(n):
                for b in range(n):
                    if (<uint64_t *>c.slot(a, s))[b] != (<uint64_t *>c.slot(b, s))[n]:
                        with gil:
                            raise CollectiveMismatchError(_size_mismatch(
                                o, a, b, (<uint64_t *>c.slot(a, s))[b], (<uint64_t *>c.slot(b, s))[n]))
                most = max(most, (<uint64_t *>c.slot(a, s))[n])
            first = False
        if o.nbytes > off:
            ch = min(cap, o.nbytes - off)
            for q in range(n):
                c.srcs[q] = ins[q] + off if q == c.rank else c.slot(q, s) + header + c.rank * cap
            shm_reduce(o.ptr + off, c.srcs, c.factors, n, ch // itemsize, o.dtype, o.op)
        off += cap
    return 0
