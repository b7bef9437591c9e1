# scan and exscan (MPI's prefix reductions): rank r's array becomes op over the arrays of ranks
# 0..r (exscan: 0..r-1; rank 0's becomes the op's identity, or stays as it is where the op has
# none, AVG).
#
#   slots: per slot-sized chunk, 1. every rank but the last (whose array is in no other rank's
#       prefix) copies the chunk into its slot (the first step also carries the descriptor);
#       2. step; 3. rank r reduces the slots of ranks 0..r-1, then (scan) its own chunk, in rank
#       order, into its array. Up to 8 bytes ride in the descriptor's line instead of the slot.
# A slot is written again two chunks later, after the next chunk's step, which a rank reaches
# only once it has read this chunk. Rank order makes rank r's bits those of all_reduce over
# ranks 0..r.


cdef dict _identities = {}  # (dtype code, op) -> one element of the op's identity; kept for ever


cdef object _prep_scan(Communicator c, op_t *o, object array, int op, bint exclusive):
    cdef buf_t b
    owner = as_buf(array, &b, True, "array")
    check_reduce_op(b.dtype, op)
    if op == SHM_PREMUL_SUM:
        raise ValueError(f"{'exscan' if exclusive else 'scan'} does not take PREMUL_SUM (a factor "
                         f"per rank is a torch reduction's, not a prefix's): pass SUM and scale first")
    o.kind = K_EXSCAN if exclusive else K_SCAN
    o.ptr, o.count, o.itemsize, o.dtype, o.nbytes = b.ptr, b.count, b.itemsize, b.dtype, b.nbytes
    o.op, o.root, o.factor = op, -1, 1.0
    o.fill = NULL
    if exclusive and c.rank == 0:
        key = (b.dtype, op)
        fill = _identities.get(key)
        if fill is None:
            fill = identity_bytes(DTYPE_NAMES[b.dtype], OP_NAMES[op]) or b""
            _identities[key] = fill
        if fill:
            o.fill = <const char *>(<bytes>fill)
    return owner


cdef int _run_scan(Communicator c, op_t *o) except -1 nogil:
    cdef int n = c.size, q, itemsize = o.itemsize
    cdef int upto = c.rank if o.kind == K_EXSCAN else c.rank + 1  # the ranks reduced here
    cdef uint32_t s
    cdef size_t count = o.count, chunk = c.slot_bytes // itemsize, off = 0, ch, sh  # slots: 4 KiB and up
    cdef char *at
    cdef bint first = True, inlined = o.nbytes <= INLINE_BYTES  # the same on every rank once checked
    if n == 1:  # scan: op over its own array alone (AVG: divided by one, exact); exscan: none
        if upto == 0:
            _fill(o.ptr, o.fill, count * itemsize, itemsize)
        return 0
    _set_desc(c, o.kind, o.dtype, o.nbytes, 0, o.op)
    while first or off < count:
        ch = min(chunk, count - off)
        at = o.ptr + off * itemsize
        s = c.next_step()
        sh = _slot_shift(c.slot_bytes, s, ch * itemsize)
        if c.rank < n - 1:  # (up to 8 bytes ride in the descriptor's line: one line per peer)
            memcpy(<char *>&c.cb(c.rank).desc[s & 1][D_INLINE] if inlined else c.slot(c.rank, s) + sh,
                   at, ch * itemsize)
        _step(c)
        if first:
            _check_desc(c)
            first = False
        if upto == 0:
            _fill(at, o.fill, ch * itemsize, itemsize)
        elif ch:
            for q in range(upto):
                c.srcs[q] = <char *>&c.cb(q).desc[s & 1][D_INLINE] if inlined else c.slot(q, s) + sh
            if o.kind == K_SCAN:
                c.srcs[c.rank] = at
            shm_reduce(at, c.srcs, c.factors, upto, ch, o.dtype, o.op)
        off += ch
    return 0


cdef void _fill(char *dst, const char *element, size_t nbytes, int itemsize) noexcept nogil:
    """``dst`` = ``element`` repeated over ``nbytes`` (doubling copies); NULL: left as it is."""
    cdef size_t done = itemsize
    if element == NULL or nbytes == 0:
        return
    memcpy(dst, element, itemsize)
    while done < nbytes:
        memcpy(dst + done, dst, min(done, nbytes - done))
        done += min(done, nbytes - done)


def identity_bytes(str dtype_name, str op_name):
    """One element of the identity of ``op_name`` (``OP_NAMES``) in dtype ``dtype_name``
    (``DTYPE_NAMES``), as its bytes: what op over no operand gives, written on exscan's rank 0.
    None where the op has none (AVG, a mean of nothing).

    Example::

        >>> identity_bytes("int8", "MAX"), identity_bytes("float32", "PRODUCT")
        (b'\\x80', b'\\x00\\x00\\x80?')
    """
    # "highest"/"lowest": the dtype's extremes (inf for floating point); "ones": every bit set
    kind = {"SUM": 0, "BOR": 0, "BXOR": 0, "PRODUCT": 1, "MIN": "highest", "MAX": "lowest",
            "BAND": "ones"}.get(op_name)
    if kind is None:
        return None
    if dtype_name == "bfloat16":  # the upper half of the float32 of the same value (exact here)
        value = {0: 0.0, 1: 1.0, "highest": np.inf, "lowest": -np.inf}[kind]
        return (np.array([value], np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    dt = np.dtype(dtype_name)
    if kind in (0, 1):
        return np.array([kind], dt).tobytes()
    if dt.kind == "b":
        return np.array([kind != "lowest"], dt).tobytes()
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.array([{"highest": info.max, "lowest": info.min,
                          "ones": -1 if dt.kind == "i" else info.max}[kind]], dt).tobytes()
    return np.array([np.inf if kind == "highest" else -np.inf], dt).tobytes()  # floating point
