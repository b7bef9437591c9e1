# Choices the group makes by measuring while it runs: rank 0 times the calls, tries the other
# way now and then, and keeps what is faster, per size class. Two such choices today, each a
# two-way tuner (tuner_t):
#
# 1. Which stores write the shared slots: normal ones, or streaming ones that bypass this core's
#    cache (`stores`). A line written with a normal store stays dirty in the writer's cache, and
#    each reader takes it from there (and the writer takes it back, to write the next step). How
#    fast that transfer is depends on where the two cores are: on the 2-core VM it has three
#    speeds, changing every few seconds with where the host runs the vCPUs. 64 KiB exchanged each
#    way took, normal / streaming stores: 43-48 / 9-10 us in the slow state, 11-13 / 10-12 in the
#    middle one; shmcomm's all_reduce of 16 KiB / 64 KiB, normal then streaming, 12.7 / 5.5 and
#    44.9 / 17.9 us in the slow state, 2.0 / 5.3 and 5.9 / 23.1 in the fast one
#    (bench/bench_tuning.py). Timed: reductions through the slots (one step, two, or the
#    pipeline). The mask lives in the header, on a line of its own: every rank reads it at each
#    copy, and only rank 0 writes it. Either store writes the same bytes, so a rank that reads the
#    mask a call late is only slower. Broadcast and all_gather take the same mask.
# 2. Whether reductions of private arrays from the single-copy size go by single copy (reading
#    peers' arrays with process_vm_readv) or through the slots (`paths`): which wins moved with
#    the machine's state too (2 ranks, 1 MiB: slots 115-124 against single copy 134-150 us in one
#    state, 305-331 against 164-234 in another). Timed: every such reduction (that is not zero
#    copy). The mask is rank 0's own: it tells the others through the step that publishes the
#    arrays' addresses (`_publish_table`'s `usable`: single copy runs only if every rank allows
#    it), so every rank takes the same path for the same call. Through the slots, the call's
#    stores are the first tuner's.
#
# How a tuner chooses:
# - Size class b of a call of n bytes: floor(log2(n)) - 12, from 4 KiB (0) to 128 MiB and up (15).
#   Calls below tune_bytes (SHMCOMM_TUNE_BYTES, default 4 KiB; 0: no tuning at all)
#   take the first way of every choice and are not timed.
# - Rank 0 keeps, per class, an average of the calls made the way in use. Every `period` timed
#   calls of a class it flips that class's way for a window of TUNE_WINDOW calls, times them (the
#   first TUNE_WARM not: lines still move from the old way's state; each sample clipped at 3x the
#   average, so one preempted call cannot decide) and keeps the flip if it was faster by
#   TUNE_GAIN than both as many calls just before the window and the running average
#   (_flip_wins). Against the average alone, the first calls' page faults once made a 32 MiB
#   class switch to the slower way; against the calls before alone, a few slow ones there could
#   flip 64 KiB to streaming stores, 1.7x slower here, for 128 calls (README: the tuned group's
#   spread). A real change of state moves the average within some 20 calls. The first window
#   opens early (a job's first state matters most, and a 16 MiB class may see few calls); a
#   window that changed nothing doubles the class's period up to TUNE_PERIOD_MAX, so probing
#   costs about TUNE_WINDOW / period of the calls, under 0.05% once settled (some 60 calls of
#   each class in all before that); one that changed the choice sets it to TUNE_PERIOD_CHANGED.
#   Classes are independent: a size that runs for a while gets probed whatever else the group
#   runs.
cdef int TUNE_WINDOW = 6
cdef int TUNE_WARM = 1
cdef uint64_t TUNE_PERIOD_MIN = 32      # the first window opens after 26 calls
cdef uint64_t TUNE_PERIOD_CHANGED = 128  # after a window that changed the choice
cdef uint64_t TUNE_PERIOD_MAX = 16384
cdef uint64_t TUNE_FIXED = (<uint64_t>1) << 62  # a period no run reaches: the choice is fixed
cdef double TUNE_GAIN = 0.85
cdef int TUNE_CLASSES = 16
cdef uint32_t TUNE_ALL = 0xffff  # every class's bit

ctypedef struct tuner_t:
    uint32_t *mask           # bit b set: class b the second way (the header's, or `own`)
    uint32_t own             # the mask when only rank 0 reads it
    uint64_t calls[16]       # per class: timed calls since its period began
    uint64_t period[16]      # per class: timed calls from one window to the next (0: not begun)
    double avg[16]           # per class: average ns of a call the way in use
    double probe[16]         # per class: ns of the window's timed calls, in all
    int probe_n[16]          # per class: the window's timed calls
    double base[16]          # per class: ns of the calls just before the window, in all
    int base_n[16]           # per class: those calls (the window is compared with them)


cdef inline int _size_class(size_t nbytes) noexcept nogil:
    """Size class of a call of ``nbytes`` (at least 4 KiB): 0 for 4-8 KiB ... 15 from 128 MiB."""
    cdef int b = 0
    nbytes >>= 13
    while nbytes and b < TUNE_CLASSES - 1:
        nbytes >>= 1
        b += 1
    return b


cdef inline bint _tuned(Communicator c, size_t nbytes) noexcept nogil:
    """Whether calls of ``nbytes`` are tuned at all (else they take every choice's first way)."""
    return c.tune_bytes != 0 and nbytes >= c.tune_bytes


cdef inline bint _second_way(Communicator c, tuner_t *t, size_t nbytes) noexcept nogil:
    """Whether a call of ``nbytes`` goes the tuner's second way now."""
    return _tuned(c, nbytes) and (capi.shm_load_relaxed(t.mask) >> _size_class(nbytes)) & 1 != 0


cdef inline bint _slot_streaming(Communicator c, size_t nbytes) noexcept nogil:
    """Whether a call of ``nbytes`` writes its slot copies with streaming stores now."""
    return _second_way(c, &c.stores, nbytes)


cdef inline void _slot_copy(char *dst, const char *src, size_t n, bint stream) noexcept nogil:
    """Copy n bytes into a slot, with the stores `_slot_streaming` chose for the call."""
    if stream:
        capi.shm_stream_copy(dst, src, n)
    else:
        capi.shm_slot_memcpy(dst, src, n)


cdef inline uint64_t _tune_timer(Communicator c, size_t nbytes) noexcept nogil:
    """Start timing a tuned call of ``nbytes`` (rank 0 only; 0: not timed)."""
    if c.rank != 0 or not _tuned(c, nbytes):
        return 0
    return capi.shm_now_ns()


cdef inline bint _flip_wins(double window, double before, double average) noexcept nogil:
    """Whether a window whose calls took ``window`` ns each beat the way in use: faster by
    TUNE_GAIN than both the calls just before it (``before`` ns each; 0: none were timed) and
    the class's running ``average`` (see the top of this file: neither alone may flip)."""
    return window < TUNE_GAIN * (min(average, before) if before > 0 else average)


def _tuner_keeps_flip(window_ns, before_ns, average_ns):
    """``_flip_wins`` for tests: whether a window of ``window_ns`` a call keeps its flip.

    Example::

        >>> _tuner_keeps_flip(10_000, 20_000, 10_500)   # only the calls before it were slow
        False
        >>> _tuner_keeps_flip(10_000, 20_000, 20_000)   # the way in use is slow: flip
        True
    """
    return _flip_wins(window_ns, before_ns, average_ns)


cdef void _tune_timed(Communicator c, tuner_t *t, size_t nbytes, uint64_t started) noexcept nogil:
    """Rank 0, after a call timed from ``started``: average it in, and probe or decide (see top)."""
    cdef uint64_t i, window
    cdef double ns, avg, before
    cdef int b
    cdef uint32_t bit
    if started == 0:
        return
    ns = <double>(capi.shm_now_ns() - started)
    b = _size_class(nbytes)
    bit = (<uint32_t>1) << b
    if t.period[b] == 0:
        t.period[b] = TUNE_PERIOD_MIN
    i = t.calls[b]
    t.calls[b] += 1
    window = t.period[b] - <uint64_t>TUNE_WINDOW
    avg = t.avg[b]
    if i < window:
        if i == 0:
            t.base[b], t.base_n[b] = 0, 0
        if avg == 0:
            t.avg[b] = ns
        else:  # a slow outlier (a preempted rank) moves the average by at most a quarter
            t.avg[b] = avg + (min(ns, 3 * avg) - avg) / 8
        if i + <uint64_t>(TUNE_WINDOW - TUNE_WARM) >= window:  # the calls the window is weighed against
            t.base[b] += min(ns, 3 * avg) if avg > 0 else ns
            t.base_n[b] += 1
        if i + 1 == window:  # the window opens: this class the other way
            t.probe[b], t.probe_n[b] = 0, 0
            capi.shm_store_relaxed(t.mask, capi.shm_load_relaxed(t.mask) ^ bit)
        return
    if i >= window + <uint64_t>TUNE_WARM:
        t.probe[b] += min(ns, 3 * avg) if avg > 0 else ns
        t.probe_n[b] += 1
    if i + 1 < t.period[b]:
        return
    # The window closes: keep the flip if it was clearly faster than the way in use, else flip back.
    t.calls[b] = 0
    before = t.base[b] / t.base_n[b] if t.base_n[b] else 0
    if t.probe_n[b] and _flip_wins(t.probe[b] / t.probe_n[b], before, avg):
        t.avg[b] = t.probe[b] / t.probe_n[b]
        t.period[b] = TUNE_PERIOD_CHANGED
        return
    capi.shm_store_relaxed(t.mask, capi.shm_load_relaxed(t.mask) ^ bit)
    t.period[b] = min(2 * t.period[b], TUNE_PERIOD_MAX)


cdef void _tune_fix(tuner_t *t, uint32_t mask) noexcept nogil:
    """Take the ways of ``mask`` from now on and stop tuning (benchmarks and tests compare them;
    every rank calls it with the same mask)."""
    cdef int b
    capi.shm_store_relaxed(t.mask, mask & TUNE_ALL)
    for b in range(TUNE_CLASSES):
        t.calls[b], t.period[b] = 0, TUNE_FIXED


cdef void _tune_start(Communicator c) noexcept nogil:
    """Point the tuners at their masks once the header is mapped (the stores' is shared)."""
    c.stores.mask = &c.hdr.slot_stores
    c.paths.own = 0
    c.paths.mask = &c.paths.own
