# RpcChannel: whole framed messages between ranks, for shmcomm.rpc (written by the RPC work).
#
# ``rpc_channels(comm, ring_bytes, lanes)`` maps one segment (collectively, through
# ``Communicator.alloc_shared``) that holds, for every rank, a doorbell per lane and, per lane, one
# byte ring from every other rank; it returns one RpcChannel per lane (shmcomm.rpc uses a lane for
# requests and one for replies, so the threads that wait for each never wake each other). The
# Communicator provides the rendezvous, the cleanup of the name and the liveness of peers.
#
# Frames (their layout in rpc_frame.pxi). Any thread may send: one lock per destination keeps
# frames whole. One thread at a time receives (shmcomm.rpc guarantees it; a second one raises): it
# reads each sender's ring into that sender's _FrameReader, as far as the ring holds bytes, and
# never waits for one sender: a sender stopped in the middle of a frame holds only its own frame.
# A large array is copied into shared memory once by the sender and out once by the receiver,
# whatever the ring size.
#
# A sender's ring is broken (never read again) when its frame cannot be read (a corrupt header, no
# memory for it), or when the sender died in the middle of a frame: what was read is dropped.
#
# Waking. A sender publishes `head` and rings the receiver's doorbell every 16 KiB (so the receiver
# copies out close behind the sender, while the data is still in a cache near it: several times
# faster than 64 KiB steps when the two run on different cores) and at the end of a frame; the receiver spins (if asked), yields, then sleeps on its doorbell. A sender that
# finds the ring full counts itself in the ring's `room_wanted` word and sleeps on the low half of
# `tail`, which the receiver wakes after consuming. Both sides check the peer's liveness between
# sleep slices, so a dead peer is an error within one slice, never a hang.
#
# Layout of one rank's region (page aligned): 4096 bytes of doorbells (lane L: bell at L*128,
# waiters at L*128+64), then for lane 0, 1, ...: for src 0..n-1: ring control (256 bytes: head at
# 0, room_wanted at 8, tail at 128) and `ring_bytes` of data.
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE

cdef enum:
    RPC_BELLS_BYTES = 4096
    RPC_MAX_LANES = 32
    RPC_PUBLISH_BYTES = 16384     # a long frame is published (and the receiver woken) this often
    RPC_OK = 0
    RPC_GONE = -1                 # the peer died or left
    RPC_TIMEOUT = -2              # nothing was written before the deadline
    RPC_STALLED = -3              # the peer is alive but consumed nothing for the group timeout

cdef uint64_t RPC_SLICE_NS = 20 * 1000 * 1000   # longest sleep between liveness checks


cdef inline uint32_t *_rpc_tail_word(capi.shm_ring_t *ring) noexcept nogil:
    return <uint32_t *>&ring.tail   # low half on little-endian targets (x86-64, aarch64)


def rpc_channels(Communicator comm not None, size_t ring_bytes, int lanes=2):
    """Collective over ``comm``: map the rings of ``lanes`` channels (every rank calls it with the
    same arguments); returns the list of RpcChannel, one per lane (internal: shmcomm.rpc).

    Example::

        requests, replies = _core.rpc_channels(comm, 1 << 20, 2)
    """
    if not 1 <= lanes <= RPC_MAX_LANES:
        raise ValueError(f"lanes must be in [1, {RPC_MAX_LANES}], got {lanes}")
    ring_bytes = _align_up(max(ring_bytes, <size_t>4096), 4096)
    cdef size_t ring_stride = SHM_RING_CTRL_BYTES + ring_bytes
    seg, stride = comm.alloc_shared(RPC_BELLS_BYTES + lanes * comm.size * ring_stride)
    return [RpcChannel(comm, seg, stride, lane, ring_bytes) for lane in range(lanes)]


cdef class RpcChannel:
    """Framed messages between the ranks of a group (internal: used by ``shmcomm.rpc``).

    Made by ``rpc_channels``; frames are ``(src, kind, req_id, flags, data, buffers)``::

        requests, replies = _core.rpc_channels(comm, 1 << 20, 2)
        requests.send(1 - rank, 1, 7, 0, b"hello", [memoryview(array).cast("B")])
        for src, kind, req_id, flags, data, buffers in requests.recv(1.0):
            ...
    """
    cdef Communicator comm
    cdef Segment seg
    cdef char *base
    cdef size_t stride
    cdef size_t ring_bytes
    cdef size_t ring_stride
    cdef readonly int lane
    cdef readonly int rank
    cdef readonly int size
    cdef list locks
    cdef list gone                 # peers known dead or departed (sending to them fails)
    cdef list broken               # rings never read again (a frame was cut off or corrupt)
    cdef list readers              # per sender: its _FrameReader (the frame it is in the middle of)
    cdef bint receiving
    cdef bint kicked
    cdef uint64_t next_check       # when recv next looks for senders that died mid-frame
    cdef int next_src
    cdef public uint64_t spin_ns
    cdef public int yields
    cdef public size_t publish_bytes   # see "Waking" above

    def __init__(self, Communicator comm not None, Segment seg not None, size_t stride, int lane,
                 size_t ring_bytes):
        if seg.size - seg.data_offset < comm.size * stride or stride < RPC_BELLS_BYTES + (lane + 1) * comm.size * (
                SHM_RING_CTRL_BYTES + ring_bytes):
            raise ValueError("segment too small for this channel")
        self.comm, self.seg, self.base, self.stride = comm, seg, seg.base + seg.data_offset, stride
        self.ring_bytes, self.ring_stride = ring_bytes, SHM_RING_CTRL_BYTES + ring_bytes
        self.lane, self.rank, self.size = lane, comm.rank, comm.size
        self.locks = [threading.Lock() for _ in range(comm.size)]
        self.gone = [False] * comm.size
        self.broken = [False] * comm.size
        self.readers = [_FrameReader() for _ in range(comm.size)]
        self.receiving = self.kicked = False
        self.next_check = 0
        self.next_src = 0
        self.spin_ns = comm.spin_ns
        self.yields = comm.yields
        self.publish_bytes = RPC_PUBLISH_BYTES

    cdef inline capi.shm_ring_t *ring(self, int src, int dst) noexcept nogil:
        return <capi.shm_ring_t *>(self.base + dst * self.stride + RPC_BELLS_BYTES
                                   + (self.lane * self.size + src) * self.ring_stride)

    cdef inline uint32_t *bell(self, int r) noexcept nogil:
        return <uint32_t *>(self.base + r * self.stride + self.lane * 128)

    cdef inline uint32_t *bell_waiters(self, int r) noexcept nogil:
        return <uint32_t *>(self.base + r * self.stride + self.lane * 128 + 64)

    # ---- liveness -----------------------------------------------------------------------------
    def peer_gone(self, int r):
        """True once rank ``r`` died or left (remembered: a gone peer never comes back)."""
        if not 0 <= r < self.size:
            raise ValueError(f"rank must be in [0, {self.size}), got {r}")
        if r != self.rank and not self.gone[r] and self.comm.closed == False and _peer_gone(self.comm, r):
            self.gone[r] = True
        return self.gone[r]

    def pid(self, int r):
        """Process id of rank ``r``."""
        if not 0 <= r < self.size:
            raise ValueError(f"rank must be in [0, {self.size}), got {r}")
        return self.comm.pids[r]

    def kick(self):
        """Wake this rank's receiver if it sleeps (it returns early with what it has, maybe nothing)."""
        if not self.comm.closed:
            self.kicked = True
            capi.shm_ring_bell(self.bell(self.rank), self.bell_waiters(self.rank))

    cdef object _gone_error(self, int r, str what):
        self.gone[r] = True
        pid = self.comm.pids[r]
        return peer_failure(f"{what} rank {r}", r, pid)

    # ---- sending ------------------------------------------------------------------------------
    def send(self, int dst, int kind, uint64_t req_id, uint64_t flags, bytes data not None,
             list buffers=None, double timeout=-1.0, bint only_if_room=False):
        """Send one frame to ``dst``: ``data`` then each buffer of ``buffers`` (contiguous
        buffer-protocol objects). Returns True once the whole frame is in shared memory. Raises
        PeerFailureError if ``dst`` is gone, CommTimeoutError if not a byte could be written
        within ``timeout`` seconds (< 0: the group timeout). With ``only_if_room`` it never
        waits: False (nothing written) unless the channel is free and the frame fits now."""
        cdef int nbuf = len(buffers) if buffers is not None else 0
        cdef int i, rc, nparts = 2 + nbuf
        cdef Py_buffer *views = NULL
        cdef const char **ptrs = NULL
        cdef size_t *lens = NULL
        cdef unsigned char small[RPC_HEADER_BYTES + 8 * 8]
        cdef unsigned char *head = small
        cdef size_t head_len = RPC_HEADER_BYTES + 8 * <size_t>nbuf
        cdef uint64_t deadline
        cdef size_t total
        cdef capi.shm_ring_t *ring
        cdef int got = 0
        cdef bint fits
        if not 0 <= dst < self.size or dst == self.rank:
            raise ValueError(f"dst must be another rank in [0, {self.size}), got {dst}")
        if not 0 <= kind < 256:
            raise ValueError(f"kind must be in [0, 256), got {kind}")
        if nbuf > RPC_MAX_BUFFERS:
            raise ValueError(f"at most {RPC_MAX_BUFFERS} buffers per frame, got {nbuf}")
        if self.comm.closed:
            raise ShmcommError("the RPC channel is closed")
        _check_process(self.comm)
        if self.gone[dst]:
            raise self._gone_error(dst, "send to")
        if timeout < 0:
            timeout = self.comm.timeout
        deadline = capi.shm_deadline_after(timeout)
        try:
            ptrs = <const char **>malloc(nparts * sizeof(char *))
            lens = <size_t *>malloc(nparts * sizeof(size_t))
            if nbuf:
                views = <Py_buffer *>malloc(nbuf * sizeof(Py_buffer))
            if nbuf > 8:
                head = <unsigned char *>malloc(head_len)
            if ptrs == NULL or lens == NULL or head == NULL or (nbuf and views == NULL):
                raise MemoryError()
            for i in range(nbuf):
                PyObject_GetBuffer(buffers[i], &views[i], PyBUF_SIMPLE)
                got += 1
                (<uint64_t *>(head + RPC_HEADER_BYTES))[i] = <uint64_t>views[i].len
                ptrs[2 + i], lens[2 + i] = <const char *>views[i].buf, <size_t>views[i].len
            (<uint32_t *>head)[0] = RPC_MAGIC | <uint32_t>kind
            (<uint32_t *>head)[1] = <uint32_t>nbuf
            (<uint64_t *>head)[1] = req_id
            (<uint64_t *>head)[2] = <uint64_t>PyBytes_GET_SIZE(data)
            (<uint64_t *>head)[3] = flags
            ptrs[0], lens[0] = <const char *>head, head_len
            ptrs[1], lens[1] = PyBytes_AS_STRING(data), <size_t>PyBytes_GET_SIZE(data)
            lock = self.locks[dst]
            if not lock.acquire(False):
                if only_if_room:
                    return False
                # (-1: no limit; a Lock refuses more than TIMEOUT_MAX, about 292 years)
                if not lock.acquire(True, timeout if timeout < threading.TIMEOUT_MAX else -1):
                    raise CommTimeoutError(f"send to rank {dst}: another send held the channel "
                                           f"for {timeout} s")
            total = 0
            for i in range(nparts):
                total += lens[i]
            ring = self.ring(self.rank, dst)
            try:
                fits = capi.shm_ring_room(ring, self.ring_bytes, ring.head) >= total
                if only_if_room and not fits:
                    return False
                if total <= RPC_GIL_FREE_COPY and fits:
                    rc = self._write(dst, ptrs, lens, nparts, deadline)  # fits now: no wait
                else:
                    with nogil:
                        rc = self._write(dst, ptrs, lens, nparts, deadline)
            finally:
                lock.release()
            if rc == RPC_GONE:
                raise self._gone_error(dst, "send to")
            if rc == RPC_TIMEOUT:
                raise CommTimeoutError(f"send to rank {dst}: no room in the ring within {timeout} s")
            if rc == RPC_STALLED:
                self.gone[dst] = True   # the stream holds half a frame: never use it again
                raise ShmcommError(f"send to rank {dst}: the peer consumed nothing for "
                                   f"{self.comm.timeout} s; the channel to it is unusable")
            return True
        finally:
            for i in range(got):
                PyBuffer_Release(&views[i])
            free(views)
            free(ptrs)
            free(lens)
            if head != small:
                free(head)

    cdef int _write(self, int dst, const char **ptrs, size_t *lens, int nparts,
                    uint64_t deadline) noexcept nogil:
        cdef capi.shm_ring_t *ring = self.ring(self.rank, dst)
        cdef size_t cap = self.ring_bytes, room, n, off
        cdef size_t chunk = max(<size_t>4096, min(cap // 4, self.publish_bytes))
        cdef uint64_t start = ring.head, head = start, published = start, tail, stall
        cdef uint32_t *peer_bell = self.bell(dst)
        cdef uint32_t *peer_waiters = self.bell_waiters(dst)
        cdef int p
        stall = 0
        for p in range(nparts):
            off = 0
            while off < lens[p]:
                tail = capi.shm_load_acquire64(&ring.tail)  # kept: the futex compares its low half
                room = cap - <size_t>(head - tail)
                if room == 0:
                    if head != published:
                        capi.shm_ring_publish(ring, head)
                        capi.shm_ring_bell(peer_bell, peer_waiters)
                        published = head
                    if capi.shm_wait_geq(_rpc_tail_word(ring), <uint32_t>tail + 1,
                                         &ring.room_wanted, self.spin_ns, self.yields,
                                         RPC_SLICE_NS):
                        stall = 0
                        continue
                    if _peer_gone(self.comm, dst):
                        return RPC_GONE
                    if head == start and capi.shm_now_ns() > deadline:
                        return RPC_TIMEOUT
                    if stall == 0:
                        stall = capi.shm_deadline_after(self.comm.timeout)
                    elif capi.shm_now_ns() > stall:
                        return RPC_STALLED
                    continue
                n = min(lens[p] - off, room, chunk)
                head = capi.shm_ring_write(ring, cap, head, ptrs[p] + off, n)
                off += n
                if head - published >= chunk:
                    # let the receiver copy out while the rest goes in
                    capi.shm_ring_publish(ring, head)
                    capi.shm_ring_bell(peer_bell, peer_waiters)
                    published = head
        capi.shm_ring_publish(ring, head)
        capi.shm_ring_bell(peer_bell, peer_waiters)
        return RPC_OK

    # ---- receiving ----------------------------------------------------------------------------
    def recv(self, double wait_s, int max_frames=64):
        """Wait up to ``wait_s`` seconds (< 0: forever) for frames from any live rank and return
        every complete frame available then (at most ``max_frames``), as a list of
        ``(src, kind, req_id, flags, data, buffers)``; an empty list when none came or ``kick``
        was called. A frame whose sender has not written all of it yet is kept for a later call:
        it never delays the others. Raises ShmcommError on a corrupt frame."""
        cdef uint32_t *my_bell = self.bell(self.rank)
        cdef uint32_t *my_waiters = self.bell_waiters(self.rank)
        cdef uint32_t bell
        cdef uint64_t now, end, slice_ns
        cdef int i, src, n = self.size
        cdef list frames = []
        if self.receiving:
            raise ShmcommError("RpcChannel.recv: another thread is receiving")
        if self.comm.closed:
            raise ShmcommError("the RPC channel is closed")
        _check_process(self.comm)
        self.receiving = True
        try:
            end = capi.shm_deadline_after(wait_s) if wait_s >= 0 else 0
            while True:
                bell = capi.shm_load_acquire(my_bell)
                for i in range(n):
                    src = (self.next_src + i) % n
                    while len(frames) < max_frames and self._available(src):
                        frame = self._feed(src)
                        if frame is None:
                            break   # the rest of its frame is not written yet: the next sender
                        frames.append(frame)
                if frames:
                    self.next_src = (self.next_src + 1) % n
                    return frames
                if self.kicked:
                    self.kicked = False
                    return frames
                now = capi.shm_now_ns()
                if now >= self.next_check:
                    self.next_check = now + RPC_SLICE_NS
                    self._drop_dead_frames()
                if end and now >= end:
                    return frames
                slice_ns = min(RPC_SLICE_NS, end - now) if end else RPC_SLICE_NS
                with nogil:
                    if capi.shm_wait_geq(my_bell, bell + 1, my_waiters, self.spin_ns,
                                         self.yields, slice_ns):
                        pass
                PyErr_CheckSignals()
        finally:
            self.receiving = False

    cdef bint _available(self, int src) noexcept:
        cdef capi.shm_ring_t *ring
        if src == self.rank or self.broken[src]:
            return False
        ring = self.ring(src, self.rank)
        return capi.shm_ring_avail(ring, ring.tail) != 0

    cdef object _feed(self, int src):
        """Read ring src->me into src's _FrameReader: its frame once whole, else None."""
        cdef _FrameReader reader = self.readers[src]
        try:
            return reader.feed(self.ring(src, self.rank), self.ring_bytes, src)
        except BaseException:
            self._break(src)   # the rest of the frame cannot be found in the stream
            raise

    cdef void _break(self, int src):
        """Never read src's ring again; drop its frame in progress."""
        self.broken[src] = True
        (<_FrameReader>self.readers[src]).reset()

    cdef void _drop_dead_frames(self):
        """A sender that died in the middle of a frame will never finish it: drop what was read
        (the calls waiting for it fail through the peer's liveness, see shmcomm.rpc.replies)."""
        cdef capi.shm_ring_t *ring
        cdef int r
        for r in range(self.size):
            if self.broken[r] or not (<_FrameReader>self.readers[r]).started():
                continue
            ring = self.ring(r, self.rank)
            # gone first, then empty: bytes written just before it died are still read
            if _peer_gone(self.comm, r) and capi.shm_ring_avail(ring, ring.tail) == 0:
                self.gone[r] = True
                self._break(r)
