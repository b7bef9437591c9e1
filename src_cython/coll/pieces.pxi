# What the collectives that move one piece per rank share (the list forms, all_to_all, the
# uneven v forms): a list of arrays as a table of pointers and sizes, whether the pieces are
# all one size, whether an output piece overlaps an input piece a peer reads, and the message
# for pieces whose sizes the ranks disagree on. Included before the families that use it.


cdef list _fill_list(Communicator c, list arrays, int dtype, str argname, bint writable,
                     char **table, size_t *sizes):
    """Point table[q] at arrays[q] (all of ``dtype``) and record its byte size; returns owners."""
    cdef buf_t b
    cdef int q
    if len(arrays) != c.size:
        raise ValueError(f"{argname} must hold world_size={c.size} arrays, got {len(arrays)}")
    owners = []
    for q in range(c.size):
        owners.append(as_buf(arrays[q], &b, writable, f"{argname}[{q}]"))
        if b.dtype != dtype:
            raise ValueError(f"{argname}[{q}] is {DTYPE_NAMES[b.dtype]}; expected {DTYPE_NAMES[dtype]}")
        table[q], sizes[q] = b.ptr, b.nbytes
    return owners


cdef bint _all_equal(size_t *sizes, int n) noexcept:
    cdef int q
    for q in range(1, n):
        if sizes[q] != sizes[0]:
            return False
    return True


cdef inline bint _peers_read(Communicator c, int q, char **ins, char **outs) noexcept nogil:
    """Whether input piece q is read by a peer during all_to_all: all are but this rank's own
    piece when it stays exactly in place (it goes nowhere)."""
    return q != c.rank or ins[q] != outs[q]


cdef bint _any_overlap(Communicator c, op_t *o) noexcept:
    """Whether some output piece overlaps an input piece a peer reads (then inputs are staged)."""
    cdef int p, q
    for p in range(c.size):
        for q in range(c.size):
            if _spans_overlap(o.outs[p], o.out_bytes[p], o.ins[q], o.in_bytes[q]) and \
                    _peers_read(c, q, o.ins, o.outs):
                return True
    return False


cdef str _size_mismatch(op_t *o, int a, int b, uint64_t sent, uint64_t expected):
    unit = max(o.itemsize, 1)
    dt = DTYPE_NAMES[o.dtype]
    return (f"{_KIND_ROWS[o.kind].name.decode()}: rank {a} sends {sent // unit} {dt} elements to rank {b}, "
            f"which expects {expected // unit}")
