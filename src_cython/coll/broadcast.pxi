# broadcast: rank `root`'s array into every rank's array.
#
#   slots: per slot-sized chunk, 1. the root copies the chunk into its slot (the first step also
#       carries the descriptor); 2. step; 3. every other rank copies it out.
#   single copy (from cma_bytes, cross-memory attach on): 1. a step publishing array addresses;
#       2. receivers pull the first (n-1)/n of the root's array while the root pushes the last
#       1/n into every receiver, so every core copies; 3. step.

# Only the root writes its slot and the others read it: from this size its chunk moves along the
# slot already (_slot_shift_from), so the root never writes lines a receiver still holds (2 ranks,
# 1-3 KiB: 0.82-0.85x the time at a fixed place); calls that write and read both ways stay put
# up to 4 KiB (all_reduce and all_gather lost 4-9% moving from 1 KiB).
cdef size_t BROADCAST_SHIFT_MIN = 1024


cdef object _prep_broadcast(Communicator c, op_t *o, object array, int src):
    cdef buf_t b
    c._check_root(src, "src")
    owner = as_buf(array, &b, src != c.rank, "array")
    o.kind, o.ptr, o.nbytes, o.dtype, o.root = K_BROADCAST, b.ptr, b.nbytes, b.dtype, src
    return owner


cdef int _run_broadcast(Communicator c, op_t *o) except -1 nogil:
    cdef uint32_t s
    cdef size_t off = 0, ch, split, nbytes = o.nbytes
    cdef int q, root = o.root
    cdef char *ptr = o.ptr, *at
    cdef bint first = True, stream
    if c.size == 1:
        return 0
    _set_desc(c, K_BROADCAST, o.dtype, nbytes, root, 0)
    if c._single_copy_size(nbytes):
        first = False
        if _publish_table(c, &ptr, 1):
            split = (nbytes - nbytes // c.size) & ~(<size_t>4095)
            if c.rank != root:
                _cma(c, root, ptr, c._peer_entry(root, 0), split, False)
            else:
                for q in range(c.size):
                    if q != root:
                        _cma(c, q, ptr + split, c._peer_entry(q, 0) + split, nbytes - split, True)
            _step(c)
            return 0
    stream = _slot_streaming(c, nbytes)  # one choice for the whole call
    while first or off < nbytes:
        ch = min(c.slot_bytes, nbytes - off)
        s = c.next_step()
        at = c.slot(root, s) + _slot_shift_from(c.slot_bytes, s, ch, BROADCAST_SHIFT_MIN)
        if c.rank == root:
            _slot_copy(at, ptr + off, ch, stream)
        _step(c)
        if first:
            _check_desc(c)
            first = False
        if c.rank != root:
            c._out(ptr + off, at, ch, nbytes)
        off += ch
    return 0
