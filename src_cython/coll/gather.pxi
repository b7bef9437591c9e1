# all_gather (root < 0: outputs on every rank) and gather (outputs on the root only).
#
#   slots: per slot-sized chunk, 1. every rank copies its chunk into its slot; 2. step; 3. ranks
#       that want outputs copy every slot out (their own piece straight from the input).
#   single copy, all_gather: 1. a step publishing input addresses; 2. every rank pulls every
#       peer's input into its output; 3. step.
#   single copy, gather: 1. the root publishes its output addresses; 2. every rank writes its
#       piece into the root's output while the root copies its own; 3. step.
#   zero copy, all_gather (every rank's output is an sc.empty array at the same place of one heap,
#       as FSDP2's buffers from the process group are): 1. a step with the descriptor; 2. every
#       rank writes its input into its piece of every output; 3. step.
# Calls whose pieces together reach the single-copy size (_address_step_pieces) take the
# descriptor step of their own (with single copy, it carries the address table too), so every
# rank picks the same path from what all of them published. Below it, from ZERO_COPY_MIN_BYTES
# (heap.pxi), an all_gather into an sc.empty output skips its first copy into the slots and says
# where the output lies instead: zero copy if every rank's lies alike, else through the slots.


cdef int _split_whole(Communicator c, buf_t *whole, buf_t *piece, str argname, char **table) except -1:
    """Point table[q] at the q-th of world_size equal parts of `whole`."""
    cdef int q
    if whole.dtype != piece.dtype or whole.count != piece.count * c.size:
        raise ValueError(f"{argname} must hold world_size * {piece.count} = "
                         f"{piece.count * c.size} {DTYPE_NAMES[piece.dtype]} elements, got "
                         f"{whole.count} {DTYPE_NAMES[whole.dtype]}")
    for q in range(c.size):
        table[q] = whole.ptr + q * piece.nbytes
    return 0


cdef object _prep_gather(Communicator c, op_t *o, object output_list, object array, int root,
                         str argname):
    cdef buf_t b
    owner = as_buf(array, &b, False, "array")
    o.kind = K_ALL_GATHER if root < 0 else K_GATHER
    o.ptr, o.nbytes, o.dtype, o.root = b.ptr, b.nbytes, b.dtype, root
    if root >= 0 and c.rank != root:
        return owner
    owners = _fill_list(c, output_list if type(output_list) is list else list(output_list),
                        b.dtype, argname, True, o.outs, o.out_bytes)
    owners.append(owner)
    if root < 0 and not _all_equal(o.out_bytes, c.size):  # every rank sees the same list sizes
        _set_all_gather_list_v(c, o, &b)
        return owners
    _check_like(c, o.out_bytes, &b, argname, "shmcomm.gather_v" if root >= 0 else None)
    return owners


cdef int _check_like(Communicator c, size_t *sizes, buf_t *like, str argname, str hint) except -1:
    """Every piece of a list sized like ``like``: the list forms of gather and scatter, whose
    non-roots cannot know the root's sizes (uneven pieces take the v form and its counts)."""
    cdef int q
    for q in range(c.size):
        if sizes[q] != like.nbytes:
            raise ValueError(f"{argname}[{q}] has {sizes[q] // like.itemsize} "
                             f"{DTYPE_NAMES[like.dtype]} elements; expected {like.count}" +
                             (f" (for pieces of different sizes use {hint})" if hint else ""))
    return 0


cdef object _prep_gather_into(Communicator c, op_t *o, object output, object array):
    cdef buf_t b, whole
    owner = as_buf(array, &b, False, "array")
    out_owner = as_buf(output, &whole, True, "output")
    _split_whole(c, &whole, &b, "output", o.outs)
    o.kind, o.ptr, o.nbytes, o.dtype, o.root = K_ALL_GATHER, b.ptr, b.nbytes, b.dtype, -1
    o.heap = _find_heap(c, whole.ptr, whole.nbytes, &o.heap_off, &o.heap_stride)
    return (owner, out_owner)


cdef int _run_gather(Communicator c, op_t *o) except -1 nogil:
    cdef size_t nbytes = o.nbytes
    cdef int i, q, n = c.size, root = o.root
    cdef char **outs = o.outs
    cdef char *inp = o.ptr
    cdef bint first = True, wants = root < 0 or root == c.rank, cma
    _set_desc(c, o.kind, o.dtype, nbytes, <uint64_t>root, 0)
    if c._single_copy_size(nbytes) and root >= 0:
        first = False
        if _publish_table(c, outs if wants else &inp, n if wants else 1):
            if wants:
                c._out(outs[c.rank], inp, nbytes, nbytes)
            else:
                _cma(c, root, inp, c._peer_entry(root, c.rank), nbytes, True)
            _step(c)
            return 0
    elif c._address_step_pieces(nbytes):
        first = False
        _set_heap_desc(c, o.heap, o.heap_off)
        if c._single_copy_size(nbytes):
            cma = _publish_table(c, &inp, 1)  # the step that carries the descriptor, too
        else:
            _step(c)
            _check_desc(c)
            cma = False
        if o.heap and _all_same_heap(c):
            return _all_gather_zero_copy(c, o)
        if cma:
            for i in range(1, n):
                q = (c.rank + i) % n
                _cma(c, q, outs[q], c._peer_entry(q, 0), nbytes, False)
            c._out(outs[c.rank], inp, nbytes, nbytes)
            _step(c)
            return 0
    return _gather_through_slots(c, o, first, first and root < 0 and o.heap != 0
                                 and nbytes * <size_t>n >= ZERO_COPY_MIN_BYTES)


cdef int _gather_through_slots(Communicator c, op_t *o, bint first, bint skip) except -1 nogil:
    """The slot path (see the top); ``first``: its first step carries the descriptor. With
    ``skip`` that step carries where this rank's sc.empty output lies instead of a chunk."""
    cdef uint32_t s
    cdef size_t off = 0, ch, sh, nbytes = o.nbytes
    cdef int i, q, n = c.size, root = o.root
    cdef char **outs = o.outs
    cdef char *inp = o.ptr
    cdef bint wants = root < 0 or root == c.rank
    cdef bint stream = _slot_streaming(c, nbytes)  # one choice for the whole call
    if first:
        _publish_heap(c, 1, o.heap if skip else 0, o.heap_off)
    while first or off < nbytes:
        ch = min(c.slot_bytes, nbytes - off)
        s = c.next_step()
        sh = _slot_shift(c.slot_bytes, s, ch)
        if not skip:
            _slot_copy(c.slot(c.rank, s) + sh, inp + off, ch, stream)
        _step(c)
        if first:
            _check_desc(c)
            first = False
            if _any_heap(c):
                if _heap_route(c) == 1:
                    return _all_gather_zero_copy(c, o)
                _set_desc(c, o.kind, o.dtype, nbytes, <uint64_t>root, 0)
                return _gather_through_slots(c, o, True, False)
        if wants:
            for i in range(n):
                q = (c.rank + i) % n
                if q == c.rank:
                    c._out(outs[q] + off, inp + off, ch, nbytes)
                else:
                    c._out(outs[q] + off, c.slot(q, s) + sh, ch, nbytes)
        off += ch
    return 0


cdef int _copy_leased(Communicator c, int q, char *dst, const char *src, size_t nbytes) except -1 nogil:
    """Copy into rank q's memory chunk by chunk, each under a lease (leases.pxi: LEASE_CHUNK)."""
    cdef size_t done = 0, m
    while done < nbytes:
        m = min(nbytes - done, LEASE_CHUNK)
        _lease(c, q)
        c._out(dst + done, src + done, m, nbytes)
        c._unlease()
        done += m
    return 0


cdef int _all_gather_zero_copy(Communicator c, op_t *o) except -1 nogil:
    """Every rank's output is visible here: this rank writes its input into its piece of each
    (its own last, and not at all when the input already is that piece, as in FSDP2)."""
    cdef int i, q, n = c.size
    cdef size_t nbytes = o.nbytes
    cdef char *first = o.outs[0] - c.rank * o.heap_stride  # rank 0's output
    cdef char *dst
    for i in range(1, n + 1):
        q = (c.rank + i) % n
        dst = first + q * o.heap_stride + c.rank * nbytes
        if dst != o.ptr:
            _copy_leased(c, q, dst, o.ptr, nbytes)
    c.zero_copy_calls += 1
    _step(c)  # every piece written before anyone returns
    return 0
