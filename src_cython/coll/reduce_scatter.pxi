# reduce_scatter: rank r's output = reduction over ranks of their input piece r.
#
#   slots: per chunk (a slot holds one chunk per rank), 1. every rank copies its pieces for peers
#       into its slot; 2. step; 3. every rank reduces, in rank order, its own piece with the
#       chunks peers left for it.
#   zero copy (every rank's whole input is an sc.empty array at the same place of one heap, as
#       FSDP2's buffers from the process group are): 1. a step with the descriptor; 2. rank r
#       reduces piece r straight from every input into its output; 3. step.
# Calls whose pieces together reach the single-copy size (_address_step_pieces) take the
# descriptor step of their own, so every rank picks the same path from what all of them published.
# Below it, from ZERO_COPY_MIN_SCATTER_BYTES (heap.pxi), an sc.empty input skips the first copy
# into the slots and says where it lies instead: zero copy if every rank's lies alike, else
# through the slots.


cdef object _prep_reduce_scatter(Communicator c, op_t *o, object output, list input_list, int op,
                                 double factor):
    cdef buf_t b
    out_owner = as_buf(output, &b, True, "output")
    check_reduce_op(b.dtype, op)
    owners = _fill_list(c, input_list, b.dtype, "input_list", False, o.ins, o.in_bytes)
    if _all_equal(o.in_bytes, c.size) and o.in_bytes[0] == b.nbytes:
        _set_reduce_scatter(o, &b, op, factor)
    else:  # torch's uneven form: input_list[q] sized like rank q's output
        _set_reduce_scatter_list_v(c, o, &b, op, factor)
    return (out_owner, owners)


cdef object _prep_reduce_scatter_into(Communicator c, op_t *o, object output, object input, int op,
                                      double factor):
    cdef buf_t b, whole
    out_owner = as_buf(output, &b, True, "output")
    in_owner = as_buf(input, &whole, False, "input")
    check_reduce_op(b.dtype, op)
    _split_whole(c, &whole, &b, "input", o.ins)
    _set_reduce_scatter(o, &b, op, factor)
    o.heap = _find_heap(c, whole.ptr, whole.nbytes, &o.heap_off, &o.heap_stride)
    return (out_owner, in_owner)


cdef void _set_reduce_scatter(op_t *o, buf_t *out, int op, double factor) noexcept:
    o.kind, o.ptr, o.count, o.itemsize = K_REDUCE_SCATTER, out.ptr, out.count, out.itemsize
    o.dtype, o.nbytes, o.op, o.factor = out.dtype, out.nbytes, op, factor


cdef int _run_reduce_scatter(Communicator c, op_t *o) except -1 nogil:
    cdef bint first = True
    _set_desc(c, K_REDUCE_SCATTER, o.dtype, o.count * o.itemsize, 0, o.op)
    c._set_factor(o)
    if c._address_step_pieces(o.nbytes):
        _set_heap_desc(c, o.heap, o.heap_off)
        _step(c)
        _check_desc(c)
        c._load_factors(o)
        first = False
        if o.heap and _all_same_heap(c):
            return _reduce_scatter_zero_copy(c, o)
    return _reduce_scatter_through_slots(c, o, first, first and o.heap != 0
                                         and o.nbytes * <size_t>c.size >= ZERO_COPY_MIN_SCATTER_BYTES)


cdef int _reduce_scatter_through_slots(Communicator c, op_t *o, bint first, bint skip) except -1 nogil:
    """The slot path (see the top); ``first``: its first step carries the descriptor. With
    ``skip`` that step carries where this rank's sc.empty input lies instead of a chunk."""
    cdef uint32_t s
    cdef int q, n = c.size, itemsize = o.itemsize
    cdef size_t cap = ((c.slot_bytes // n) // 64 * 64) // itemsize, off = 0, ch, blk, sh, count = o.count
    cdef char **ins = o.ins
    if first:
        _publish_heap(c, 1, o.heap if skip else 0, o.heap_off)
    while first or off < count:
        ch = min(cap, count - off)
        blk = _align_up(ch * itemsize, 64)  # the piece for rank q at q * blk of each slot
        s = c.next_step()
        sh = _slot_shift(c.slot_bytes, s, n * blk)
        for q in range(n if not skip else 0):
            if q != c.rank:
                memcpy(c.slot(c.rank, s) + sh + q * blk, ins[q] + off * itemsize, ch * itemsize)
        _step(c)
        if first:
            _check_desc(c)
            c._load_factors(o)
            first = False
            if _any_heap(c):
                if _heap_route(c) == 1:
                    return _reduce_scatter_zero_copy(c, o)
                _set_desc(c, K_REDUCE_SCATTER, o.dtype, count * itemsize, 0, o.op)
                c._set_factor(o)
                return _reduce_scatter_through_slots(c, o, True, False)
        for q in range(n):
            if q == c.rank:
                c.srcs[q] = ins[q] + off * itemsize
            else:
                c.srcs[q] = c.slot(q, s) + sh + c.rank * blk
        shm_reduce(o.ptr + off * itemsize, c.srcs, c.factors, n, ch, o.dtype, o.op)
        off += ch
    return 0


cdef int _reduce_scatter_zero_copy(Communicator c, op_t *o) except -1 nogil:
    """Every rank's input is visible here: this rank reduces its piece of all of them, in rank
    order, straight into its output (in place too: only this rank touches this piece)."""
    cdef int q
    cdef char *first = o.ins[0] - c.rank * o.heap_stride  # rank 0's input
    cdef size_t b = 0, m, block = LEASE_CHUNK // o.itemsize
    while b < o.count:  # chunk by chunk, each under a lease (leases.pxi: LEASE_CHUNK)
        m = min(block, o.count - b)
        for q in range(c.size):
            c.srcs[q] = first + q * o.heap_stride + c.rank * o.nbytes + b * o.itemsize
        _lease(c, -1)
        shm_reduce(o.ptr + b * o.itemsize, c.srcs, c.factors, c.size, m, o.dtype, o.op)
        c._unlease()
        b += m
    c.zero_copy_calls += 1
    _step(c)  # inputs untouched until every rank has read its piece
    return 0
