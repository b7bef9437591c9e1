# Which stores write the shared slots: normal ones, or streaming ones that bypass this core's cache.
#
# A slot is written by one rank and read by the others. A line written with a normal store stays
# dirty in the writer's cache, and each reader takes it from there (and the writer takes it back,
# to write the next step). How fast that transfer is depends on where the two cores are: on the
# 2-core VM it has three speeds, changing every few seconds with where the host runs the vCPUs.
# 64 KiB exchanged each way took, normal / streaming stores: 43-48 / 9-10 us in the slow mode,
# 11-13 / 10-12 in the middle one; and shmcomm's all_reduce of 16 KiB / 64 KiB, normal then
# streaming, 12.7 / 5.5 and 44.9 / 17.9 us in the slow mode, 2.0 / 5.3 and 5.9 / 23.1 in the
# fast one (bench/bench_slot_stores.py). Neither kind wins everywhere, and which one wins changes
# while a job runs, so the group measures and chooses, per size class, while it runs:
#
# - Size class b of a call of n bytes: floor(log2(n)) - 12, from 4 KiB (0) to 128 MiB and up (15).
#   Calls below slot_stream_bytes (SHMCOMM_SLOT_STREAM_BYTES, default 4 KiB; 0: none) always use
#   normal stores and are not timed.
# - Rank 0 times its slot-path reductions (one step or two, through the slots, or the pipeline)
#   and keeps, per class, an average of the stores in use. Every `period` timed calls of a class
#   it flips that class's choice for a window of STORE_WINDOW calls, times them (the first
#   STORE_WARM not: lines still move from the old stores' state; each sample clipped at 3x the
#   average, so one preempted call cannot decide) and keeps the flip if it was faster by
#   STORE_GAIN. The first window opens early (a job's first mode matters most, and a 16 MiB
#   class may see few calls); a window that changed nothing doubles the class's period up to
#   STORE_PERIOD_MAX, so probing costs about STORE_WINDOW / period of the calls, under 0.05%
#   once settled (some 60 calls of each class in all before that); one that changed the choice
#   sets it to STORE_PERIOD_CHANGED. Classes are independent: a size that runs for a while gets
#   probed whatever else the group runs.
# - The choice is a bit mask in the header (`slot_stores`), on a line of its own: every rank
#   reads it at each copy, so all ranks switch together, and only rank 0 ever writes it. Either
#   store writes the same bytes, so a rank that reads the mask a call late is only slower.
cdef int STORE_WINDOW = 6
cdef int STORE_WARM = 1
cdef uint64_t STORE_PERIOD_MIN = 32      # the first window opens after 26 calls
cdef uint64_t STORE_PERIOD_CHANGED = 128  # after a window that changed the choice
cdef uint64_t STORE_PERIOD_MAX = 16384
cdef double STORE_GAIN = 0.85
cdef int STORE_CLASSES = 16
cdef uint32_t STORE_ALL = 0xffff  # every class's bit


cdef inline int _store_class(size_t nbytes) noexcept nogil:
    """Size class of a call of ``nbytes`` (at least 4 KiB): 0 for 4-8 KiB ... 15 from 128 MiB."""
    cdef int b = 0
    nbytes >>= 13
    while nbytes and b < STORE_CLASSES - 1:
        nbytes >>= 1
        b += 1
    return b


cdef inline bint _slot_streaming(Communicator c, size_t nbytes) noexcept nogil:
    """Whether a call of ``nbytes`` writes its slot copies with streaming stores now."""
    return (c.slot_stream_bytes != 0 and nbytes >= c.slot_stream_bytes
            and (capi.shm_load_relaxed(&c.hdr.slot_stores) >> _store_class(nbytes)) & 1 != 0)


cdef inline void _slot_copy(char *dst, const char *src, size_t n, bint stream) noexcept nogil:
    """Copy n bytes into a slot, with the stores `_slot_streaming` chose for the call."""
    if stream:
        capi.shm_stream_copy(dst, src, n)
    else:
        memcpy(dst, src, n)


cdef inline uint64_t _stores_timer(Communicator c, size_t nbytes) noexcept nogil:
    """Start timing a slot-path reduction of ``nbytes`` (rank 0 only; 0: not timed)."""
    if c.rank != 0 or nbytes < c.slot_stream_bytes or c.slot_stream_bytes == 0:
        return 0
    return capi.shm_now_ns()


cdef void _stores_timed(Communicator c, size_t nbytes, uint64_t started) noexcept nogil:
    """Rank 0, after a timed slot-path reduction: average it in, and probe or decide (see top)."""
    cdef uint64_t i, window
    cdef double t, avg
    cdef int b
    cdef uint32_t bit, mask
    if started == 0:
        return
    t = <double>(capi.shm_now_ns() - started)
    b = _store_class(nbytes)
    bit = (<uint32_t>1) << b
    if c.store_period[b] == 0:
        c.store_period[b] = STORE_PERIOD_MIN
    i = c.store_calls[b]
    c.store_calls[b] += 1
    window = c.store_period[b] - <uint64_t>STORE_WINDOW
    if i < window:
        avg = c.store_ns[b]
        if avg == 0:
            c.store_ns[b] = t
        else:  # a slow outlier (a preempted rank) moves the average by at most a quarter
            c.store_ns[b] = avg + (min(t, 3 * avg) - avg) / 8
        if i + 1 == window:  # the window opens: this class the other way
            c.probe_ns[b], c.probe_n[b] = 0, 0
            mask = capi.shm_load_relaxed(&c.hdr.slot_stores)
            capi.shm_store_relaxed(&c.hdr.slot_stores, mask ^ bit)
        return
    if i >= window + <uint64_t>STORE_WARM:
        avg = c.store_ns[b]
        c.probe_ns[b] += min(t, 3 * avg) if avg > 0 else t
        c.probe_n[b] += 1
    if i + 1 < c.store_period[b]:
        return
    # The window closes: keep the flip if it was clearly faster, else flip back.
    c.store_calls[b] = 0
    if c.probe_n[b] and c.probe_ns[b] / c.probe_n[b] < STORE_GAIN * c.store_ns[b]:
        c.store_ns[b] = c.probe_ns[b] / c.probe_n[b]
        c.store_period[b] = STORE_PERIOD_CHANGED
        return
    mask = capi.shm_load_relaxed(&c.hdr.slot_stores)
    capi.shm_store_relaxed(&c.hdr.slot_stores, mask ^ bit)
    c.store_period[b] = min(2 * c.store_period[b], STORE_PERIOD_MAX)


cdef void _fix_stores(Communicator c, uint32_t mask) noexcept nogil:
    """Use the stores of ``mask`` from now on and stop adapting (benchmarks and tests compare
    the two kinds; every rank calls it with the same mask)."""
    cdef int b
    capi.shm_store_relaxed(&c.hdr.slot_stores, mask & STORE_ALL)
    for b in range(STORE_CLASSES):
        c.store_calls[b], c.store_period[b] = 0, <uint64_t>1 << 62
