# The group segment's layout: the header, each rank's control block, a point-to-point ring per
# ordered pair of ranks, then two data slots per rank. Its size grows with the square of the
# ranks, so it is computed in Python integers and checked against /dev/shm: settings and a world
# size that cannot fit are an error naming them on every rank, never a size that wrapped
# (SHMCOMM_SLOT_BYTES=2**62 at 2 ranks once gave a segment without slots: zeros on rank 1,
# SIGSEGV on rank 0). A free function of Communicator (engine.pxi holds its fields and reads).


cdef size_t _layout(Communicator self, size_t slot_bytes, size_t ring_bytes) except 0:
    """Place the rings and slots for ``slot_bytes`` and ``ring_bytes`` (this rank's settings, or
    rank 0's from the segment's header); returns the segment's size."""
    n = self.size
    # at least 64 bytes per rank after reduce_scatter_v's size header, or a chunk would be
    # empty and a pipelined loop would never advance (SHMCOMM_SLOT_BYTES=4096, 57+ ranks)
    slot = _round_up(max(slot_bytes, _round_up((n + 1) * sizeof(uint64_t), 64) + 64 * n), 4096)
    ring = _round_up(ring_bytes, 4096)
    ring_off = _round_up(SHM_HEADER_BYTES + n * SHM_CB_BYTES, 4096)
    slot_off = _round_up(ring_off + n * n * (SHM_RING_CTRL_BYTES + ring), 4096)
    total = slot_off + 2 * n * slot
    room = _shm_size_bytes()
    if total > room:
        raise ValueError(
            f"a group of {n} ranks needs {_size_text(total)} of /dev/shm for its segment "
            f"({n}x{n} point-to-point rings of SHMCOMM_RING_BYTES={ring_bytes} and {2 * n} slots "
            f"of SHMCOMM_SLOT_BYTES={slot_bytes}), more than /dev/shm holds "
            f"({_size_text(room)}): lower SHMCOMM_RING_BYTES or SHMCOMM_SLOT_BYTES, or "
            f"enlarge /dev/shm (e.g. docker --shm-size)")
    self.slot_bytes, self.ring_bytes = slot, ring
    self.ring_off, self.ring_stride, self.slot_off = ring_off, SHM_RING_CTRL_BYTES + ring, slot_off
    return total


def _size_text(n):
    return f"{n / 2**40:,.1f} TiB" if n >= 2**40 else f"{n / 2**30:,.1f} GiB"


def _round_up(x, a):
    return (x + a - 1) // a * a


def _shm_size_bytes():
    """The size of /dev/shm (not what is free now: that changes, and creating the segment says
    so); a file can never be larger. The largest file offset where unknown or unlimited."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return 2**63 - 1
    return st.f_blocks * st.f_frsize or 2**63 - 1


# ---- where in its slot a call's data goes ----------------------------------------------------
# A call that fills only part of a slot moves along the slot from one use to the next, by the
# step's number (every rank finds a peer's data at the same place), over the slot's whole size.
# Writing lines a peer read a call ago first takes them back from the peer's cache (a
# read-for-ownership answered by the other core); two ranks on the 2-core EPYC VM, all_reduce of
# 128 KiB: copying 64 KiB into the slot took 9.2 us at a fixed place, 2.1 us moving (the peer's
# copies have aged out of its cache by the next use), the whole call 25 against 12 us (a C model
# of the medium path). Small calls stay put: a few lines cost a probe either way, and lines the
# writer still holds are the cheapest to write.
cdef size_t SLOT_SHIFT_MIN = 4096


cdef inline size_t _slot_shift(size_t slot_bytes, uint32_t s, size_t used) noexcept nogil:
    """Where in its slot a call that uses ``used`` bytes of it at step ``s`` starts (slot_shift);
    callers compute it once per step and add it to every rank's c.slot(q, s)."""
    return _slot_shift_from(slot_bytes, s, used, SLOT_SHIFT_MIN)


cdef inline size_t _slot_shift_from(size_t slot_bytes, uint32_t s, size_t used, size_t least) noexcept nogil:
    """_slot_shift for a call that moves from ``least`` bytes used."""
    cdef size_t u = _align_up(used, 4096)
    if used < least or 2 * u > slot_bytes:
        return 0
    return ((s >> 1) % (slot_bytes // u)) * u


def slot_shift(size_t slot_bytes, uint32_t step, size_t used):
    """Where a call that fills ``used`` bytes of a slot of ``slot_bytes`` starts in it at
    ``step``: a multiple of ``used`` rounded up to a page, advancing by one each time the slot is
    used again (slots alternate by step parity, so every second step); 0 under 4 KiB or over
    half the slot. Every rank computes it from the same step, so each finds its peers' data.

    Example::

        >>> [slot_shift(1 << 20, step, 100_000) for step in range(0, 24, 2)][:11]
        [0, 102400, 204800, 307200, 409600, 512000, 614400, 716800, 819200, 921600, 0]
        >>> slot_shift(1 << 20, 7, 2048), slot_shift(1 << 20, 7, 600_000)
        (0, 0)
    """
    return _slot_shift(slot_bytes, step, used)
