# all_to_all (equal pieces) and all_to_all_single (any splits): outs[q] <- peer q's ins[rank].
#
#   uneven, first step: every rank publishes its split sizes (so each checks the whole matrix)
#       and, when all its pieces fit a slot, the pieces too: if every rank's fit, that one step is
#       the whole collective.
#   single copy (largest piece from cma_bytes, unless some rank's outputs overlap the inputs its
#       peers read): 1. a step publishing input addresses; 2. every rank pulls its pieces; 3. step.
#   slots: per chunk (a slot holds one chunk per peer), 1. every rank copies its pieces for peers;
#       2. step; 3. every rank copies its pieces out.
# In place (output overlapping input), the pieces peers read are sent from a staged copy.


cdef int _set_splits(Communicator c, object splits, buf_t *b, str argname, char **table,
                     size_t *sizes) except -1:
    """Point table[q] at part q of `b` and record its byte size in sizes[q]."""
    cdef int q, n = c.size
    cdef size_t off = 0, per
    if splits is None:
        if b.count % n:
            raise ValueError(f"{b.count} elements do not split evenly into world_size={n} "
                             f"parts; pass {argname}")
        per = b.count // n
        for q in range(n):  # the common case, without building Python lists
            table[q] = b.ptr + q * per * b.itemsize
            sizes[q] = per * b.itemsize
        return 0
    splits = [_as_index(x, f"{argname}[i]") for x in splits]
    if len(splits) != n or any(x < 0 for x in splits):
        raise ValueError(f"{argname} must be {n} non-negative sizes, got {splits}")
    if sum(splits) != <long long>b.count:
        raise ValueError(f"{argname} sum to {sum(splits)} but the array has {b.count} elements")
    for q in range(n):
        table[q] = b.ptr + off * b.itemsize
        sizes[q] = <size_t>splits[q] * b.itemsize
        off += <size_t>splits[q]
    return 0


cdef object _prep_all_to_all(Communicator c, op_t *o, list output_list, list input_list):
    """The list form; pieces of different sizes (as torch allows) take the uneven protocol."""
    cdef buf_t first
    if len(input_list) != c.size:
        raise ValueError(f"input_list must hold world_size={c.size} arrays, got {len(input_list)}")
    owner = as_buf(input_list[0], &first, False, "input_list[0]")
    in_owners = _fill_list(c, input_list, first.dtype, "input_list", False, o.ins, o.in_bytes)
    out_owners = _fill_list(c, output_list, first.dtype, "output_list", True, o.outs, o.out_bytes)
    o.dtype, o.itemsize, o.nbytes = first.dtype, first.itemsize, first.nbytes
    if _all_equal(o.in_bytes, c.size) and _all_equal(o.out_bytes, c.size) and \
            o.out_bytes[0] == first.nbytes:
        o.kind, o.uniform = K_ALL_TO_ALL, True
    else:
        o.kind, o.uniform = K_ALL_TO_ALL_V, False
        o.overlap = _any_overlap(c, o)
    return (owner, in_owners, out_owners)


cdef object _prep_all_to_all_single(Communicator c, op_t *o, object output, object input,
                                    object output_split_sizes, object input_split_sizes):
    cdef buf_t b_out, b_in
    out_owner = as_buf(output, &b_out, True, "output")
    in_owner = as_buf(input, &b_in, False, "input")
    if b_out.dtype != b_in.dtype:
        raise ValueError(f"output dtype {DTYPE_NAMES[b_out.dtype]} differs from input dtype "
                         f"{DTYPE_NAMES[b_in.dtype]}")
    _set_splits(c, output_split_sizes, &b_out, "output_split_sizes", o.outs, o.out_bytes)
    _set_splits(c, input_split_sizes, &b_in, "input_split_sizes", o.ins, o.in_bytes)
    o.kind, o.dtype, o.itemsize, o.uniform = K_ALL_TO_ALL_V, b_out.dtype, b_out.itemsize, False
    o.overlap = b_out.ptr < b_in.ptr + b_in.nbytes and b_in.ptr < b_out.ptr + b_out.nbytes
    return (out_owner, in_owner)


cdef int _run_all_to_all(Communicator c, op_t *o) except -1 nogil:
    if o.overlap:
        _stage_inputs(c, o.ins, o.outs, o.in_bytes)
    return _all_to_all(c, o)


cdef int _stage_inputs(Communicator c, char **ins, char **outs, size_t *in_bytes) except -1 nogil:
    """In place (or overlapping): pieces move between offsets of one array, so a piece could be
    overwritten before it is sent. Send every piece a peer reads from a copy in the kept
    staging buffer."""
    cdef int q
    cdef size_t total = 0
    cdef char *at
    for q in range(c.size):
        if _peers_read(c, q, ins, outs):
            total += in_bytes[q]
    at = _staging(c, max(total, 1))
    for q in range(c.size):
        if _peers_read(c, q, ins, outs):
            memcpy(at, ins[q], in_bytes[q])
            ins[q] = at
            at += in_bytes[q]
    return 0


cdef int _all_to_all(Communicator c, op_t *o) except -1 nogil:
    """Move o.ins[q] (o.in_bytes[q]) to rank q's o.outs[rank], under o.kind's descriptor; uneven
    kinds check the size matrix. No kind that comes here reduces (reduce_scatter_v has its own
    loop), so the descriptor carries no op."""
    cdef char **outs = o.outs
    cdef char **ins = o.ins
    cdef size_t *in_bytes = o.in_bytes
    cdef size_t *out_bytes = o.out_bytes
    cdef int dtype = o.dtype
    cdef uint32_t s
    cdef int q, a, b, n = c.size
    cdef size_t cap = (c.slot_bytes // n) // 64 * 64, off = 0, most = 0, blk, sh
    cdef uint64_t *sizes
    cdef bint first = True, fits
    cdef size_t header = _align_up((2 * n + 1) * sizeof(uint64_t), 64)
    cdef size_t piece_cap = ((c.slot_bytes - header) // n) // 64 * 64
    if o.uniform:
        most = in_bytes[0]
        _set_desc(c, K_ALL_TO_ALL, dtype, most, 0, 0)
        if c._single_copy_size(most):
            first = False
            if _all_to_all_single_copy(c, outs, ins, in_bytes, out_bytes):
                return 0
    else:
        _set_desc(c, o.kind, dtype, 0, o.root, 0)
        s = c.next_step()
        sizes = <uint64_t *>c.slot(c.rank, s)
        fits = 1
        for q in range(n):
            sizes[q] = in_bytes[q]
            sizes[n + q] = out_bytes[q]
            if in_bytes[q] > piece_cap:
                fits = 0
        sizes[2 * n] = fits
        if fits:
            for q in range(n):
                if q != c.rank:
                    memcpy(c.slot(c.rank, s) + header + q * piece_cap, ins[q], in_bytes[q])
        _step(c)
        _check_desc(c)
        first = False
        for a in range(n):
            for b in range(n):
                if (<uint64_t *>c.slot(a, s))[b] != (<uint64_t *>c.slot(b, s))[n + a]:
                    with gil:
                        raise CollectiveMismatchError(_size_mismatch(
                            o, a, b, (<uint64_t *>c.slot(a, s))[b], (<uint64_t *>c.slot(b, s))[n + a]))
                most = max(most, (<uint64_t *>c.slot(a, s))[b])
            fits = fits and (<uint64_t *>c.slot(a, s))[2 * n]
        if fits:
            if out_bytes[c.rank] and outs[c.rank] != ins[c.rank]:
                memmove(outs[c.rank], ins[c.rank], out_bytes[c.rank])
            for q in range(n):
                if q != c.rank:
                    memcpy(outs[q], c.slot(q, s) + header + c.rank * piece_cap, out_bytes[q])
            return 0
        if c._single_copy_size(most):  # every rank saw the same matrix: the same choice
            _set_desc(c, o.kind, dtype, 0, o.root, 0)  # for the table's step
            if _all_to_all_single_copy(c, outs, ins, in_bytes, out_bytes):
                return 0
    c._out(outs[c.rank], ins[c.rank], out_bytes[c.rank], out_bytes[c.rank])
    while first or off < most:
        s = c.next_step()
        blk = _align_up(min(cap, most - off), 64)  # every piece's chunk, at q * blk of a slot
        sh = _slot_shift(c.slot_bytes, s, n * blk)
        for q in range(n):
            if q != c.rank and in_bytes[q] > off:
                memcpy(c.slot(c.rank, s) + sh + q * blk, ins[q] + off, min(cap, in_bytes[q] - off))
        _step(c)
        if first:
            _check_desc(c)
            first = False
        for q in range(n):
            if q != c.rank and out_bytes[q] > off:
                c._out(outs[q] + off, c.slot(q, s) + sh + c.rank * blk, min(cap, out_bytes[q] - off),
                       out_bytes[q])
        off += cap
    return 0


cdef bint _all_to_all_single_copy(Communicator c, char **outs, char **ins, size_t *in_bytes,
                                  size_t *out_bytes) except -1 nogil:
    """Pull every piece for this rank straight from its sender; False (nothing done) when some
    rank cannot, or some rank's outputs overlap the inputs its peers read (in place: a peer
    could still be reading a piece this rank is overwriting), and the slots must carry it. Its
    own piece may sit exactly in place: no peer reads it."""
    cdef int q, i, n = c.size
    cdef size_t in_lo = <size_t>-1, in_hi = 0, out_lo = <size_t>-1, out_hi = 0
    for q in range(n):  # the address spans of the input pieces peers read, and of the outputs
        if _peers_read(c, q, ins, outs):
            in_lo, in_hi = min(in_lo, <size_t>ins[q]), max(in_hi, <size_t>ins[q] + in_bytes[q])
        out_lo, out_hi = min(out_lo, <size_t>outs[q]), max(out_hi, <size_t>outs[q] + out_bytes[q])
    if not _publish_table(c, ins, n, in_hi <= out_lo or out_hi <= in_lo):
        return False
    for i in range(1, n):
        q = (c.rank + i) % n
        _cma(c, q, outs[q], c._peer_entry(q, c.rank), out_bytes[q], False)
    c._out(outs[c.rank], ins[c.rank], out_bytes[c.rank], out_bytes[c.rank])
    _step(c)
    return True
