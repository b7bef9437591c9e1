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
    for borrower in self.heap_borrowers:
        lend_heaps(self, <Communicator>borrower)
    return seg, stride


def lend_heaps(Communicator comm, Communicator other):
    """Let ``other``, a group over the same ranks in the same order as ``comm`` (a lane of the
    threads level), find ``comm``'s ``sc.empty`` heaps, those made later included: its calls on
    pieces of an ``sc.empty`` array of ``comm`` then run zero copy as ``comm``'s would. Every rank
    lends alike (heap ids are ``comm``'s, the same on every rank).

    Example::

        lane = comm.derive("threads0", range(comm.size))
        lend_heaps(comm, lane)   # lane.all_reduce(a[lo:hi]) of an sc.empty a: zero copy
    """
    if other.size != comm.size or other.rank != comm.rank:
        raise ValueError(f"lend_heaps: group {other.job}.{other.part} is not over the same ranks "
                         f"(rank {other.rank} of {other.size}, here {comm.rank} of {comm.size})")
    other.heaps = list(comm.heaps)
    _index_heaps(other)
    if not any(b is other for b in comm.heap_borrowers):
        comm.heap_borrowers.append(other)



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



# ---- arrays left out of the slots: zero copy decided by a slot path's first step ---------------
# From these sizes an sc.empty array stays out of the slots where a slot path serves the call:
# the first step's descriptor words 5-6 carry where it lies (word 5 from bit 16 the heap; below
# it a reduction's batch count), and every rank then tells from all of them (_heap_route) whether
# every array lies alike (zero copy) or not (the call runs again through the slots, one step
# more). Two ranks on the 2-core VM, us per call, zero copy against the slots
# (shmcomm-bench --zero-copy): all_reduce 1 KiB 1.10 / 0.90, 2 KiB 1.09 / 1.37, 4 KiB 1.21 /
# 1.40, 16 KiB 1.91 / 3.27, 64 KiB 3.77 / 7.22; all_gather (all pieces) 2 KiB 0.95 / 0.92, 8 KiB
# 1.05 / 1.35, 32 KiB 1.05 / 2.98; reduce_scatter (all pieces) 2 KiB 1.07 / 0.95, 8 KiB 1.37 /
# 1.33, 32 KiB 2.26 / 3.12.
cdef size_t ZERO_COPY_MIN_BYTES = 4096           # all_reduce, reduce; all_gather's pieces together
cdef size_t ZERO_COPY_MIN_SCATTER_BYTES = 16384  # reduce_scatter's pieces together


cdef inline void _publish_heap(Communicator c, uint64_t low, uint64_t heap, uint64_t off) noexcept nogil:
    """Words 5-6 of the next step's descriptor: ``low`` (a reduction's batch count, else 1) and,
    for an array left out of the slots, its heap (0: none) and offset."""
    cdef uint64_t *d = c.cb(c.rank).desc[(c.step + 1) & 1]
    d[D_BATCH] = low | (heap << 16)
    if heap:
        d[D_HEAP_OFF] = off
        c.published = True  # from this step peers may read and write the array (zero copy)


cdef bint _any_heap(Communicator c) noexcept nogil:
    """After that step: whether some rank left its array out of the slots."""
    cdef int q
    for q in range(c.size):
        if c.cb(q).desc[c.step & 1][D_BATCH] >> 16:
            return True
    return False


cdef int _heap_route(Communicator c) noexcept nogil:
    """After a step in which some rank left its array out of the slots (_any_heap): 1 if every
    rank did, at the same place of one heap (zero copy), else 2 (again, through the slots). Every
    rank reads the same descriptors, so all take the same way."""
    cdef uint64_t *mine = c.cb(c.rank).desc[c.step & 1]
    cdef uint64_t *theirs
    cdef int q
    for q in range(c.size):
        theirs = c.cb(q).desc[c.step & 1]
        if theirs[D_BATCH] >> 16 != mine[D_BATCH] >> 16 or theirs[D_HEAP_OFF] != mine[D_HEAP_OFF]:
            return 2
    return 1 if mine[D_BATCH] >> 16 else 2
