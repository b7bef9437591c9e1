# all_reduce and reduce (root >= 0): one algorithm with four paths, chosen by size and memory.
#
#   small (up to small_bytes): one shot, several calls at once. 1. copy each queued small
#       reduction (descriptor, then data) into this rank's slot, and publish their count (the
#       first call's data, up to 8 bytes, rides in the descriptor's line instead); 2. step;
#       3. the first m calls, m the smallest count any rank published, are done: every rank that
#       wants a result reduces the slots in rank order. Calls past m stay queued for the next step.
#       So ranks that saw different numbers of queued calls still agree, with no extra sync.
#   medium (below the single-copy size, within one slot): reduce-scatter plus all-gather in two
#       steps, several queued calls at once with the same agreement on their count (see
#       _reduce_batch_medium).
#   pipelined (larger, below the single-copy size): per slot-sized chunk, 1. copy to the slot
#       the parts peers reduce; 2. step; 3. reduce this rank's slice of the chunk from every slot
#       into the next slot; 4. step; 5. copy every rank's reduced slice out.
#   zero copy (every rank passed an sc.empty array at the same place of one heap): 1. a step with
#       the descriptor; 2. rank r reduces slice r straight from every array and writes it into
#       every array that wants it; 3. step. From ZERO_COPY_MIN_BYTES, also where the small and
#       medium paths serve the size: an sc.empty array stays out of the slots, and the first step
#       tells (_heap_route) whether every rank's did alike, else the call runs again through them.
#   single copy (private arrays, cross-memory attach on, unless rank 0's tuning chose the
#       pipelined path instead, tuning.pxi): 1. a step publishing array addresses;
#       2. rank r reduces slice r block by block, reading peers through a cache-sized scratch,
#       and writes each block into every array that wants it; 3. step.
# Every rank reduces in rank order, so every rank gets the same bits.


cdef size_t SLOT_STREAM_BLOCK = 8192  # bytes a streamed reduction reduces at a time (L1-sized)


cdef object _prep_reduce(Communicator c, op_t *o, object array, int op, int root, double factor):
    cdef buf_t b
    owner = as_buf(array, &b, True, "array")
    _fill_reduce(c, o, &b, op, root, factor)
    return owner


cdef int _fill_reduce(Communicator c, op_t *o, buf_t *b, int op, int root, double factor) except -1:
    """Fill ``o`` for a reduction of the buffer ``b`` (an array's, or a torch op's raw tensor)."""
    check_reduce_op(b.dtype, op)
    o.kind = K_ALL_REDUCE if root < 0 else K_REDUCE
    o.ptr, o.count, o.itemsize, o.dtype, o.nbytes = b.ptr, b.count, b.itemsize, b.dtype, b.nbytes
    o.op, o.root, o.factor = op, root, factor
    o.heap = _find_heap(c, b.ptr, b.nbytes, &o.heap_off, &o.heap_stride)
    return 0


cdef int _run_reduce(Communicator c, op_t *o) except -1 nogil:
    cdef int n = c.size, q, i, root = o.root, itemsize = o.itemsize, dtype = o.dtype, op = o.op
    cdef uint32_t s
    cdef char *ptr = o.ptr
    cdef size_t count = o.count, nbytes = o.nbytes, chunk, ch, off = 0, lo, hi, sh
    cdef bint wants = root < 0 or root == c.rank
    cdef bint cma, first, stream, single, skip
    cdef uint64_t timer
    if n == 1:
        if op == SHM_PREMUL_SUM:  # the only op that changes one rank's values
            c.srcs[0], c.factors[0] = ptr, o.factor
            shm_reduce(ptr, c.srcs, c.factors, 1, count, dtype, op)
        return 0
    timer = _tune_timer(c, nbytes)
    if c._one_shot_size(nbytes):
        skip = _skips_slots(o)
        _reduce_batch(c, &o, 1, skip)
        _tune_timed(c, &c.stores, nbytes, 0 if skip else timer)  # it times calls through the slots
        return 0
    if _medium_size(c, nbytes):
        skip = _skips_slots(o)
        _reduce_batch_medium(c, &o, 1, skip)
        _tune_timed(c, &c.stores, nbytes, 0 if skip else timer)
        return 0
    _set_desc(c, o.kind, dtype, nbytes, <uint64_t>root, op)
    c._set_factor(o)
    # Below the single-copy size the descriptor rides on the first chunk's step (no zero copy
    # there: one sync fewer matters more at these sizes); above it, a step of its own first.
    first = not c._address_step_size(nbytes)
    single = False
    if not first:
        _set_heap_desc(c, o.heap, o.heap_off)
        single = c._single_copy_size(nbytes)
        if single:  # the step that carries the descriptor, too; rank 0 says which way (tuning.pxi)
            cma = _publish_table(c, &ptr, 1, c.rank != 0 or not _second_way(c, &c.paths, nbytes))
        else:
            _step(c)
            _check_desc(c)
            cma = False
        c._load_factors(o)
        if o.heap and _all_same_heap(c):
            return _reduce_zero_copy(c, o)
        if cma:
            for q in range(n):
                o.outs[q] = <char *>c._peer_entry(q, 0)
            _reduce_single_copy(c, o)
            c.single_copy_reductions += 1
            _tune_timed(c, &c.paths, nbytes, timer)
            return 0
    chunk = c.slot_bytes // itemsize
    while off < count:
        ch = min(chunk, count - off)
        s = c.next_step()
        sh = _slot_shift(c.slot_bytes, s, ch * itemsize)  # both steps' slots, from where step s puts it
        c._slice(ch, c.rank, itemsize, &lo, &hi)
        # Peers need every part of this chunk but this rank's own slice: copy only those.
        stream = _slot_streaming(c, nbytes)
        _slot_copy(c.slot(c.rank, s) + sh, ptr + off * itemsize, lo * itemsize, stream)
        _slot_copy(c.slot(c.rank, s) + sh + hi * itemsize, ptr + (off + hi) * itemsize, (ch - hi) * itemsize, stream)
        _step(c)
        if first:
            _check_desc(c)
            c._load_factors(o)
            first = False
        for q in range(n):
            c.srcs[q] = c.slot(q, s) + sh + lo * itemsize
        c.srcs[c.rank] = ptr + (off + lo) * itemsize
        _reduce_to_slot(c, c.slot(c.rank, s + 1) + sh + lo * itemsize, hi - lo, itemsize, dtype, op, stream)
        _step(c)
        if wants:
            for i in range(n):
                q = (c.rank + i) % n
                c._slice(ch, q, itemsize, &lo, &hi)
                memcpy(ptr + (off + lo) * itemsize, c.slot(q, s + 1) + sh + lo * itemsize,
                       (hi - lo) * itemsize)
        off += ch
    _tune_timed(c, &c.stores, nbytes, timer)
    if single:
        _tune_timed(c, &c.paths, nbytes, timer)
    return 0


cdef int _reduce_to_slot(Communicator c, char *dst, size_t count, int itemsize, int dtype, int op,
                         bint stream) except -1 nogil:
    """shm_reduce of c.srcs into this rank's slot, for peers to read; with streaming stores
    (``stream``, tuning.pxi) by blocks reduced into private scratch, where they stay in L1,
    then streamed out. Advances c.srcs."""
    cdef size_t block = SLOT_STREAM_BLOCK // itemsize, b = 0, m
    cdef int q
    cdef char *scratch
    if not stream:
        shm_reduce(dst, c.srcs, c.factors, c.size, count, dtype, op)
        return 0
    scratch = _scratch(c, block * itemsize)
    while b < count:
        m = min(block, count - b)
        shm_reduce(scratch, c.srcs, c.factors, c.size, m, dtype, op)
        shm_stream_copy(dst + b * itemsize, scratch, m * itemsize)
        for q in range(c.size):
            c.srcs[q] = <const char *>c.srcs[q] + m * itemsize
        b += m
    return 0


cdef inline bint _medium_size(Communicator c, size_t nbytes) noexcept nogil:
    """Reductions between the one-shot and the single-copy sizes that fit one slot: reduce-scatter
    plus all-gather in two steps, several calls at once."""
    return not c._address_step_size(nbytes) and nbytes <= c.slot_bytes and not c._one_shot_size(nbytes)


cdef int _batch_class(Communicator c, op_t *o) noexcept nogil:
    """The batcher of all_reduce and reduce (their registry rows): 1: small (one shot), 2: medium
    (two steps), 0: runs alone. Calls batch with their kind and class."""
    if c.size == 1 or o.heap:
        return 0
    if c._one_shot_size(o.nbytes):
        return 1
    return 2 if _medium_size(c, o.nbytes) else 0


cdef int _run_reduce_batch(Communicator c, op_t **ops, int k) except -1 nogil:
    """Run k small (or k medium) reductions together; returns how many are done."""
    cdef uint64_t timer = _tune_timer(c, ops[0].nbytes)
    # (sc.empty arrays never batch, _batch_class: none of these calls leaves the slots)
    cdef int m = (_reduce_batch(c, ops, k, False) if _batch_class(c, ops[0]) == 1
                  else _reduce_batch_medium(c, ops, k, False))
    _tune_timed(c, &c.stores, ops[0].nbytes, timer)
    return m


cdef int _agreed_calls(Communicator c, op_t **ops, int k, uint32_t s, size_t *data_off,
                       bint *skipped) except -1 nogil:
    """After the first step of a batch: the number of calls every rank packed and agrees on (the
    first call's descriptor is checked by _check_desc; later ones from the slot headers), and in
    ``skipped`` whether a rank left its array out of the slots: what _any_heap (heap.pxi) tells,
    found in this pass over the same words rather than a second one on the small calls' path."""
    cdef int j, q, w, m = k
    cdef char *mine = c.slot(c.rank, s)
    cdef uint64_t *theirs
    cdef uint64_t word, heaps = 0
    _check_desc(c)
    for q in range(c.size):
        word = c.cb(q).desc[s & 1][D_BATCH]
        m = min(m, <int>(word & 0xffff))
        heaps |= word >> 16
    skipped[0] = heaps != 0
    for j in range(1, m):
        for q in range(c.size):
            theirs = <uint64_t *>(c.slot(q, s) + data_off[j] - BATCH_HEADER)
            for w in range(5):
                if theirs[w] != (<uint64_t *>(mine + data_off[j] - BATCH_HEADER))[w]:
                    return j
    return m


cdef void _load_batch_factors(Communicator c, op_t **ops, int j, uint32_t s, size_t *data_off) noexcept nogil:
    """PREMUL_SUM call j of a batch: every rank's factor, from the control block's descriptor
    (j = 0) or call j's header in each rank's slot."""
    cdef int q
    if ops[j].op != SHM_PREMUL_SUM:
        return
    if j == 0:
        c._load_factors(ops[0])
        return
    for q in range(c.size):
        memcpy(&c.factors[q], c.slot(q, s) + data_off[j] - BATCH_HEADER + 7 * sizeof(uint64_t),
               sizeof(double))


cdef int _pack_headers(Communicator c, op_t **ops, int k, uint32_t s, char *mine, size_t *data_off) noexcept nogil:
    """Lay out up to k calls in the slot of step s from where the first call's size puts them
    (_slot_shift; a descriptor before every call but the first, data cache-line aligned); fills
    data_off (from the slot's start) and returns how many calls fit there (the first always
    does)."""
    cdef size_t off = _slot_shift(c.slot_bytes, s, _batch_bytes(ops[0], 0))
    cdef uint64_t *d
    cdef int j
    cdef op_t *o
    for j in range(k):
        o = ops[j]
        if j and off + _batch_bytes(o, j) > c.slot_bytes:
            return j
        if j:
            d = <uint64_t *>(mine + off)
            d[D_KIND] = o.kind; d[D_DTYPE] = o.dtype; d[D_NBYTES] = o.nbytes
            d[D_ROOT] = <uint64_t>o.root; d[D_OP] = o.op
            memcpy(&d[D_FACTOR], &o.factor, sizeof(double))  # PREMUL_SUM's factor, as in _set_factor
            off += BATCH_HEADER
        data_off[j] = off
        off += _align_up(o.nbytes, 64)
    return k


cdef int _reduce_batch_medium(Communicator c, op_t **ops, int k, bint skip) except -1 nogil:
    """The medium path for ops[0..k), each within one slot: returns m, how many are done.
    1. every rank copies, for each call, the parts peers reduce into its slot (the counts and the
       descriptors ride along; with ``skip``, _skips_slots, its only call's array stays where it
       is); 2. step; 3. for the m agreed calls, each rank reduces its slice from every slot (its
       own from its array) into its next slot; 4. step; 5. ranks that want the results copy every
       slice out."""
    cdef uint32_t s = c.next_step()
    cdef char *mine = c.slot(c.rank, s)
    cdef size_t data_off[MAX_BATCH]
    cdef size_t lo, hi
    cdef int j, q, i, m, n = c.size, isz
    cdef bint stream, skipped
    cdef op_t *o
    k = _pack_headers(c, ops, k, s, mine, data_off)
    for j in range(k if not skip else 0):
        o = ops[j]
        isz = o.itemsize
        c._slice(o.count, c.rank, isz, &lo, &hi)
        stream = _slot_streaming(c, o.nbytes)
        _slot_copy(mine + data_off[j], o.ptr, lo * isz, stream)
        _slot_copy(mine + data_off[j] + hi * isz, o.ptr + hi * isz, (o.count - hi) * isz, stream)
    o = ops[0]
    _set_desc(c, o.kind, o.dtype, o.nbytes, <uint64_t>o.root, o.op)
    c._set_factor(o)
    _publish_heap(c, k, ops[0].heap if skip else 0, ops[0].heap_off)
    _step(c)
    m = _agreed_calls(c, ops, k, s, data_off, &skipped)
    if skipped:
        return _zero_copy_or_again(c, ops[0], _heap_route(c), True)
    for j in range(m):
        o = ops[j]
        isz = o.itemsize
        c._slice(o.count, c.rank, isz, &lo, &hi)
        for q in range(n):
            c.srcs[q] = c.slot(q, s) + data_off[j] + lo * isz
        c.srcs[c.rank] = o.ptr + lo * isz
        _load_batch_factors(c, ops, j, s, data_off)
        _reduce_to_slot(c, c.slot(c.rank, s + 1) + data_off[j] + lo * isz, hi - lo, isz, o.dtype, o.op,
                        _slot_streaming(c, o.nbytes))
    _step(c)
    for j in range(m):
        o = ops[j]
        if o.root >= 0 and o.root != c.rank:
            continue
        isz = o.itemsize
        for i in range(n):
            q = (c.rank + i) % n
            c._slice(o.count, q, isz, &lo, &hi)
            memcpy(o.ptr + lo * isz, c.slot(q, s + 1) + data_off[j] + lo * isz, (hi - lo) * isz)
    return m


cdef int _reduce_batch(Communicator c, op_t **ops, int k, bint skip) except -1 nogil:
    """The small path for ops[0..k): returns m, how many of them are done (see the top; with
    ``skip``, _skips_slots, the only call's array stays out of the slot)."""
    cdef uint32_t s = c.next_step()
    cdef char *mine = c.slot(c.rank, s)
    cdef size_t data_off[MAX_BATCH]
    cdef int j, q, m, n = c.size
    cdef bint skipped
    cdef op_t *o
    cdef bint inlined = ops[0].nbytes <= INLINE_BYTES  # the same on every rank once checked
    k = _pack_headers(c, ops, k, s, mine, data_off)
    for j in range(1 if inlined or skip else 0, k):
        _slot_copy(mine + data_off[j], ops[j].ptr, ops[j].nbytes, _slot_streaming(c, ops[j].nbytes))
    o = ops[0]
    _set_desc(c, o.kind, o.dtype, o.nbytes, <uint64_t>o.root, o.op)
    c._set_factor(o)
    _publish_heap(c, k, ops[0].heap if skip else 0, ops[0].heap_off)
    if inlined:  # peers read it with the step's tag, one cache line per peer
        memcpy(&c.cb(c.rank).desc[s & 1][D_INLINE], o.ptr, o.nbytes)
    _step(c)
    m = _agreed_calls(c, ops, k, s, data_off, &skipped)
    if skipped:
        return _zero_copy_or_again(c, o, _heap_route(c), False)
    for j in range(m):
        o = ops[j]
        if o.root < 0 or o.root == c.rank:
            for q in range(n):
                c.srcs[q] = (<char *>&c.cb(q).desc[s & 1][D_INLINE] if inlined and j == 0
                             else c.slot(q, s) + data_off[j])
            _load_batch_factors(c, ops, j, s, data_off)
            shm_reduce(o.ptr, c.srcs, c.factors, n, o.count, o.dtype, o.op)
    return m


cdef inline bint _skips_slots(op_t *o) noexcept nogil:
    """Whether a small or medium reduction (one that runs alone: sc.empty arrays never batch,
    _batch_class) leaves its array out of the slots: from ZERO_COPY_MIN_BYTES."""
    return o.heap != 0 and o.nbytes >= ZERO_COPY_MIN_BYTES


cdef int _zero_copy_or_again(Communicator c, op_t *o, int route, bint medium) except -1 nogil:
    """A call whose first step found arrays left out of the slots (``_heap_route``: 1 or 2): zero
    copy, or the same call again through the slots, every rank copying (one step more). Returns
    1: the call is done (a rank that skipped ran it alone, so the agreed count was 1)."""
    if route == 1:
        c._load_factors(o)
        _reduce_zero_copy(c, o)
    elif medium:
        _reduce_batch_medium(c, &o, 1, False)
    else:
        _reduce_batch(c, &o, 1, False)
    return 1


cdef void _set_heap_desc(Communicator c, uint64_t heap, uint64_t heap_off) noexcept nogil:
    """Publish, with the next step's descriptor, where this rank's array lies in a shared heap:
    from that step on peers may read and write it in place, so a failure must withdraw it."""
    cdef uint64_t *d = c.cb(c.rank).desc[(c.step + 1) & 1]
    d[D_HEAP] = heap; d[D_HEAP_OFF] = heap_off
    if heap:
        c.published = True


cdef bint _all_same_heap(Communicator c) noexcept nogil:
    cdef uint64_t *mine = c.cb(c.rank).desc[c.step & 1]
    cdef uint64_t *theirs
    cdef int q
    for q in range(c.size):
        theirs = c.cb(q).desc[c.step & 1]
        if theirs[D_HEAP] != mine[D_HEAP] or theirs[D_HEAP_OFF] != mine[D_HEAP_OFF]:
            return False
    return True


cdef int _reduce_zero_copy(Communicator c, op_t *o) except -1 nogil:
    """Every rank's array is visible here: rank r reduces slice r straight from all of them and
    writes the result into every array that wants it (one read and one write per byte)."""
    cdef int n = c.size, q, i, itemsize = o.itemsize
    cdef size_t lo, hi, block = (256 << 10) // itemsize, b, m, stride = o.heap_stride
    cdef char *ptr = o.ptr
    cdef char *first = ptr - c.rank * stride  # rank 0's array
    c._slice(o.count, c.rank, itemsize, &lo, &hi)
    b = lo
    while b < hi:
        m = min(block, hi - b)
        for q in range(n):
            c.srcs[q] = first + q * stride + b * itemsize
        _lease(c, -1)  # reads every array, writes every array that wants the result
        if o.root < 0:
            shm_reduce(ptr + b * itemsize, c.srcs, c.factors, n, m, o.dtype, o.op)
            for i in range(1, n):
                q = (c.rank + i) % n
                memcpy(first + q * stride + b * itemsize, ptr + b * itemsize, m * itemsize)
        else:
            shm_reduce(first + o.root * stride + b * itemsize, c.srcs, c.factors, n, m, o.dtype, o.op)
        c._unlease()
        b += m
    c.zero_copy_calls += 1
    _step(c)  # every slice written before anyone returns
    return 0


cdef int _reduce_single_copy(Communicator c, op_t *o) except -1 nogil:
    """Private arrays at o.outs[q], cross-memory attach on: rank r reduces slice r block by
    block, reading peers' parts through a cache-sized scratch, and writes each result block,
    still in cache, into every array that wants it (its own in place; peers' remotely). Only
    rank r touches slice r of any array, so one step at the end is the only sync; non-root
    arrays of reduce stay as they were."""
    cdef int n = c.size, q, i, itemsize = o.itemsize, root = o.root
    cdef size_t block = (128 << 10) // itemsize, lo = 0, hi = 0, b, m
    cdef size_t block_bytes = block * itemsize
    cdef char *scratch = _scratch(c, n * block_bytes)  # n - 1 inputs and one output
    cdef char *part
    cdef char *out
    cdef char *ptr = o.ptr
    cdef bint mine = root < 0 or root == c.rank
    c._slice(o.count, c.rank, itemsize, &lo, &hi)
    b = lo
    while b < hi:
        m = min(block, hi - b)
        part = scratch
        for q in range(n):
            if q == c.rank:
                c.srcs[q] = ptr + b * itemsize
            else:
                _cma(c, q, part, <uint64_t>o.outs[q] + b * itemsize, m * itemsize, False)
                c.srcs[q] = part
                part += block_bytes
        out = ptr + b * itemsize if mine else part  # in place is fine: element-wise
        shm_reduce(out, c.srcs, c.factors, n, m, o.dtype, o.op)
        for i in range(1, n):
            q = (c.rank + i) % n
            if root < 0 or q == root:
                _cma(c, q, out, <uint64_t>o.outs[q] + b * itemsize, m * itemsize, True)
        b += m
    _step(c)  # every slice written, and arrays untouched until every rank is done
    return 0
