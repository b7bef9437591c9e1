# The shared heap behind sc.empty: one segment per allocation, every rank's part at a fixed
# stride, and finding which heap (if any) holds an array, for the zero-copy paths. Free functions
# of Communicator.

cdef _alloc_shared(Communicator self, size_t nbytes_per_rank):
    """Communicator.alloc_shared: see its docstring."""
    from shmcomm.segments import segment_name
    cdef size_t stride = _align_up(max(nbytes_per_rank, 1), 4096)
    cdef size_t total = SHM_HEADER_BYTES + stride * self.size
    cdef Segment seg = None
    cdef capi.shm_heap_header_t *hh
    cdef uint64_t nonce = 0
    cdef _Call call = _open(self, False)
    cdef int made = -1  # step 2's descriptor, where rank 0 says whether it made the heap
    try:
        _begin(self, b"empty")
        failed = None  # rank 0's error creating the segment: every rank raises its cause
        # Three steps: (1) every rank is in this call, with the same size; rank 0 makes and names
        # the heap only then, so a rank that failed earlier leaves no name behind; (2) rank 0 says
        # whether it made it, and the others attach; (3) every rank attached: each removes the
        # name (whoever outlives the others). Should rank 0 die with the heap named, the others
        # fail in step 2 or 3 and remove it themselves (its nonce is out before its name).
        _set_desc(self, K_ALLOC, 0, nbytes_per_rank, 0, 0)
        try:
            with nogil:
                _step(self)
                _check_desc(self)
            # Counted only once every rank is in this call: a rank whose sc.empty met another
            # collective (a mismatch, raised on every rank) must not name the next heap apart
            # from its peers' (it attached to a name rank 0 never made: "not the one rank 0
            # created", and the group aborted)
            self.heap_count += 1
            part = self.derived_part(f"{self.part}.h{self.heap_count}")
            name = segment_name(self.job, part)
            tag = self.creds.tag(self.job, part)
            made = (self.step + 1) & 1  # words 5-7 of rank 0's descriptor are its report
            if self.rank == 0:
                nonce = int.from_bytes(os.urandom(8), "little")
                self.cb(0).desc[made][D_ALLOC_NONCE] = nonce
                try:
                    seg = Segment.create(
                        name, total, f"sc.empty: {mib(nbytes_per_rank)} x {self.size} ranks (one "
                        "segment holds every rank's array)")
                    hh = <capi.shm_heap_header_t *>seg.base
                    hh.nonce = nonce
                    memcpy(hh.tag, <char *>tag, 32)
                    hh.magic = SHM_HEAP_MAGIC
                    seg.publish()  # named only now, with its header: never half-made
                except (ShmcommError, OSError) as e:
                    if seg is not None:
                        seg.unlink()
                        seg = None
                    failed = e
                self.cb(0).desc[made][D_ALLOC_FAILED] = failed is not None
                self.cb(0).desc[made][D_ALLOC_FREE] = _shm_free_bytes() if failed is not None else 0
            with nogil:
                _step(self)
            if self.cb(0).desc[made][D_ALLOC_FAILED]:  # the group stays usable: nothing was made
                if failed is not None:
                    raise failed
                raise ShmcommError(
                    f"empty: rank 0 could not create the shared array's segment of {mib(total)} "
                    f"({mib(nbytes_per_rank)} x {self.size} ranks) in /dev/shm "
                    f"({mib(self.cb(0).desc[made][D_ALLOC_FREE])} free then; see rank 0's error); "
                    f"{SHM_SPACE_HINT}")
            if self.rank != 0:
                nonce = self.cb(0).desc[made][D_ALLOC_NONCE]
                try:
                    seg = Segment.attach(name)
                except ShmcommError as e:
                    self.abort()
                    raise _fail(self, e) from None
                hh = <capi.shm_heap_header_t *>seg.base if seg is not None else NULL
                if hh == NULL or seg.size != total or hh.magic != SHM_HEAP_MAGIC \
                        or hh.nonce != nonce \
                        or not self.creds.accepts((<char *>hh.tag)[:32], self.hdr.self_made,
                                                  self.job, part):
                    # (the group's rule: ranks started by hand, each with a secret of its
                    # own, share the job name, and here rank 0's nonce)
                    from shmcomm.trust import UntrustedFileError
                    self.abort()
                    raise _fail(self, UntrustedFileError(
                        f"empty: shared array segment /dev/shm{name} is missing or is not the one "
                        f"rank 0 of job {self.job!r} created (size, nonce or tag differ)"))
            seg.data_offset = SHM_HEADER_BYTES
            with nogil:
                _step(self)
            seg.unlink_name()  # every rank (a unique name): it outlives none of them
        except BaseException:
            if self.rank != 0 and made >= 0 and _peer_dead(self, 0):
                # rank 0 died with the heap named (only it would have removed the name), or
                # before it named it (no O_TMPFILE: under a staging name)
                from shmcomm.segments import remove_dead_staging
                _unlink_name_if_nonce(name, _HEAP_NONCE_AT, self.cb(0).desc[made][D_ALLOC_NONCE])
                remove_dead_staging(name)
            raise
        finally:
            if seg is not None and self.rank == 0:
                seg.unlink()
    finally:
        _abandon(self, call)
    self.heaps = [h for h in self.heaps if h[0]() is not None]
    self.heaps.append((weakref.ref(seg), self.heap_count, stride))
    _index_heaps(self)
    return seg, stride



# Every reduction and gather asks whether its array lies in a heap (_find_heap), private arrays
# too: walking the weak references cost 9 ns a heap a call (8 B all_reduce at 2 ranks: 0.43 us
# with no heap, 0.57 with 16, 1.00 with 64). Their address ranges in C make it a few compares;
# a match is confirmed through the weak reference (a dead heap's range may hold a new mapping).
# (Past MAX_HEAP_BOUNDS heaps, engine.pxi, the references are walked.)
cdef void _index_heaps(Communicator self):
    cdef Segment seg
    cdef int i = 0
    if len(self.heaps) > MAX_HEAP_BOUNDS:
        self.n_heap_bounds = -1
        return
    for ref, heap_id, stride in self.heaps:
        seg = ref()
        self.heap_bounds[2 * i] = self.heap_bounds[2 * i + 1] = 0  # an empty range if it died
        if seg is not None:
            self.heap_bounds[2 * i] = <uintptr_t>(seg.base + seg.data_offset + self.rank * <size_t>stride)
            self.heap_bounds[2 * i + 1] = self.heap_bounds[2 * i] + <size_t>stride
        i += 1
    self.n_heap_bounds = i



cdef uint64_t _find_heap(Communicator self, char *ptr, size_t nbytes, uint64_t *off, size_t *stride_out):
    """Heap id (0: none) of the sc.empty region of this rank holding [ptr, ptr+nbytes)."""
    cdef Segment seg
    cdef char *lo
    cdef int i
    cdef uintptr_t p = <uintptr_t>ptr
    off[0] = 0
    stride_out[0] = 0
    if self.n_heap_bounds >= 0:
        for i in range(self.n_heap_bounds):
            if self.heap_bounds[2 * i] <= p and p + nbytes <= self.heap_bounds[2 * i + 1]:
                return _heap_at(self, self.heaps[i], ptr, nbytes, off, stride_out)
        return 0
    for entry in self.heaps:
        heap_id = _heap_at(self, entry, ptr, nbytes, off, stride_out)
        if heap_id:
            return heap_id
    return 0


cdef uint64_t _heap_at(Communicator self, tuple entry, char *ptr, size_t nbytes, uint64_t *off,
                       size_t *stride_out):
    """_find_heap for one entry of self.heaps: its id if it is alive and holds the array, else 0."""
    cdef Segment seg
    cdef char *lo
    ref, heap_id, stride = entry
    seg = ref()
    if seg is None:
        return 0
    lo = seg.base + seg.data_offset + self.rank * <size_t>stride
    if lo <= ptr and ptr + nbytes <= lo + <size_t>stride:
        off[0] = ptr - lo
        stride_out[0] = stride
        return heap_id
    return 0
