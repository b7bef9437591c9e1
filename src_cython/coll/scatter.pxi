# scatter: piece q of the root's list into rank q's array.
#
#   slots: per chunk (a slot holds one chunk per rank), 1. the root copies every peer's chunk into
#       its slot; 2. step; 3. every rank copies its chunk out (the root from its own piece).
#   single copy: 1. the root publishes its piece addresses; 2. every rank pulls its piece; 3. step.


cdef object _prep_scatter(Communicator c, op_t *o, object array, object scatter_list, int src):
    cdef buf_t b
    c._check_root(src, "src")
    owner = as_buf(array, &b, True, "array")
    o.kind, o.ptr, o.nbytes, o.dtype, o.root = K_SCATTER, b.ptr, b.nbytes, b.dtype, src
    if c.rank == src:
        if scatter_list is None:
            raise ValueError("scatter_list is required on the src rank")
        owners = _fill_list(c, list(scatter_list), b.dtype, "scatter_list", False, o.ins, o.in_bytes)
        _check_like(c, o.in_bytes, &b, "scatter_list", "shmcomm.scatter_v")
        return (owner, owners)
    if scatter_list is not None:
        raise ValueError("scatter_list must be None on ranks other than src")
    return owner


cdef int _run_scatter(Communicator c, op_t *o) except -1 nogil:
    cdef uint32_t s
    cdef size_t off = 0, ch, blk, nbytes = o.nbytes, cap = (c.slot_bytes // c.size) // 64 * 64
    cdef char *at
    cdef int q, root = o.root
    cdef char *out = o.ptr
    cdef char **ins = o.ins
    cdef bint first = True
    _set_desc(c, K_SCATTER, o.dtype, nbytes, root, 0)
    if c._single_copy_size(nbytes):
        first = False
        if _publish_table(c, ins if c.rank == root else NULL, c.size):
            if c.rank == root:
                c._out(out, ins[root], nbytes, nbytes)
            else:
                _cma(c, root, out, c._peer_entry(root, c.rank), nbytes, False)
            _step(c)
            return 0
    while first or off < nbytes:
        ch = min(cap, nbytes - off)
        blk = _align_up(ch, 64)  # rank q's piece at q * blk of the root's slot
        s = c.next_step()
        # broadcast's pattern (only the root writes the slot): its shift and its copies
        at = c.slot(root, s) + _slot_shift_from(c.slot_bytes, s, c.size * blk, BROADCAST_SHIFT_MIN)
        if c.rank == root:
            for q in range(c.size):
                if q != root:
                    capi.shm_slot_memcpy(at + q * blk, ins[q] + off, ch)
        _step(c)
        if first:
            _check_desc(c)
            first = False
        if c.rank == root:
            c._out(out + off, ins[root] + off, ch, nbytes)
        else:
            c._out(out + off, at + c.rank * blk, ch, nbytes)
        off += ch
    return 0
