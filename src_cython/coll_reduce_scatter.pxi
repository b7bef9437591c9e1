# reduce_scatter: rank r's output = reduction over ranks of their input piece r.
#
#   slots: per chunk (a slot holds one chunk per rank), 1. every rank copies its pieces for peers
#       into its slot; 2. step; 3. every rank reduces, in rank order, its own piece with the
#       chunks peers left for it.


cdef object _prep_reduce_scatter(Communicator c, op_t *o, object output, list input_list, int op,
                                 double factor):
    cdef buf_t b
    out_owner = as_buf(output, &b, True, "output")
    check_reduce_op(b.dtype, op)
    owners = _fill_pieces(c, input_list, &b, "input_list", False, o.ins)
    _set_reduce_scatter(o, &b, op, factor)
    return (out_owner, owners)


cdef object _prep_reduce_scatter_into(Communicator c, op_t *o, object output, object input, int op,
                                      double factor):
    cdef buf_t b, whole
    out_owner = as_buf(output, &b, True, "output")
    in_owner = as_buf(input, &whole, False, "input")
    check_reduce_op(b.dtype, op)
    _split_whole(c, &whole, &b, "input", o.ins)
    _set_reduce_scatter(o, &b, op, factor)
    return (out_owner, in_owner)


cdef void _set_reduce_scatter(op_t *o, buf_t *out, int op, double factor) noexcept:
    o.kind, o.ptr, o.count, o.itemsize = K_REDUCE_SCATTER, out.ptr, out.count, out.itemsize
    o.dtype, o.nbytes, o.op, o.factor = out.dtype, out.nbytes, op, factor


cdef int _run_reduce_scatter(Communicator c, op_t *o) except -1 nogil:
    cdef uint32_t s
    cdef int q, n = c.size, itemsize = o.itemsize
    cdef size_t cap = ((c.slot_bytes // n) // 64 * 64) // itemsize, off = 0, ch, count = o.count
    cdef char **ins = o.ins
    cdef bint first = True
    c._set_desc(K_REDUCE_SCATTER, o.dtype, count * itemsize, 0, o.op)
    c._set_factor(o)
    while first or off < count:
        ch = min(cap, count - off)
        s = c.next_step()
        for q in range(n):
            if q != c.rank:
                memcpy(c.slot(c.rank, s) + q * cap * itemsize, ins[q] + off * itemsize, ch * itemsize)
        c._step()
        if first:
            c._check_desc()
            c._load_factors(o)
            first = False
        for q in range(n):
            if q == c.rank:
                c.srcs[q] = ins[q] + off * itemsize
            else:
                c.srcs[q] = c.slot(q, s) + c.rank * cap * itemsize
        shm_reduce(o.ptr + off * itemsize, c.srcs, c.factors, n, ch, o.dtype, o.op)
        off += ch
    return 0
