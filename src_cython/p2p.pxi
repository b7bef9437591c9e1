# Point-to-point messages: one single-producer single-consumer byte ring per (src, dst) pair in the
# group segment, and a progress engine that moves bytes for every pending send and receive.
#
# A message is a 32-byte header (tag, payload size, dtype) followed by its payload, streamed
# through the ring in as many pieces as needed, so any size passes through a fixed ring. Receives
# match messages in arrival order per sender and posting order per receive (MPI's non-overtaking
# rule); a message no receive has asked for yet is copied into an "unexpected" buffer. Every ring
# movement rings the peer's doorbell, the one futex word a blocked progress loop sleeps on.
#
# Large messages (SHMCOMM_CMA_BYTES and up, when both ranks can read each other's memory) send only
# a header carrying the buffer's address: the receiver reads the payload straight from the
# sender's memory into the receive buffer (one copy) and answers with an ACK header, which
# completes the send. The sender's buffer must not change until then, as for any isend.
# From SHARED_PUSH_BYTES up the two share the copy: the receiver asks the sender (PUSH) to write
# the second half into the receive buffer while it reads the first half itself; the receive
# completes on PUSHED, the send on the ACK (which follows the PUSH in the same ring).
#
# Exposures. A single-copy message exposes a buffer to a peer: the sender's (the receiver reads
# it) and, for a PUSH, the receiver's (the sender writes into it). Each exposure takes a slot of
# the owner's control block (`exposures`, SHM_P2P_EXPOSURES of them) and carries the slot's
# generation in the message; the peer copies only under a lease that finds that generation still
# there (leases.pxi), chunk by chunk. The owner ends an exposure by moving the slot to its next
# generation: when the message completes, and when its operation fails, after which it also
# waits until the peer's copies under way have ended (the same lease rule as collectives). So a
# failed send or receive returns only once nothing can touch its buffer any more, and a failure
# voids that message's buffer alone. With every slot in use, a message goes through the ring.
import threading
from collections import deque
from cpython.pythread cimport (
    NOWAIT_LOCK, WAIT_LOCK, PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock,
    PyThread_get_thread_ident, PyThread_release_lock, PyThread_type_lock,
)
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

# A thread blocked this long in drive() takes unexpected single-copy messages into buffers (up
# to the group's unexpected_bytes in all: SHMCOMM_UNEXPECTED_BYTES).
cdef uint64_t PULL_AFTER_NS = 1000 * 1000

cdef enum:
    MSG_HEADER_BYTES = 64   # magic u32, dtype u32, tag i64, nbytes u64, kind u64, addr u64, id u64,
                            # exposure u64 (slot << 32 | generation of the buffer at addr), 0 u64
    MSG_MAGIC = 0x4d534853  # "SHSM"
    MSG_DATA = 0            # the payload follows in the ring
    MSG_CMA = 1             # the payload stays at `addr` in the sender: read it from there
    MSG_ACK = 2             # the CMA message `id` was read: its send is complete (dtype: 0, or
                            # the errno of a receive that failed before it took the message)
    MSG_PUSH = 3            # receiver -> sender: write bytes [tag, tag + nbytes) of message `id` to `addr`
    MSG_PUSHED = 4          # sender -> receiver: that write is done (dtype: 0, or the errno)


cdef class _EngineLock:
    """A re-entrant lock taken from C in ~20 ns (threading.RLock through Python's ``with`` cost
    0.4 us per blocking send or receive). Re-entrant because Future callbacks run while it is
    held may post more operations. All bookkeeping runs under the GIL; only a contended
    acquire releases the GIL while it blocks."""
    cdef PyThread_type_lock mutex
    cdef unsigned long owner
    cdef int depth

    def __cinit__(self):
        self.mutex = PyThread_allocate_lock()
        if self.mutex == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self.mutex != NULL:
            PyThread_free_lock(self.mutex)

    cdef inline void acquire(self):
        cdef unsigned long me = PyThread_get_thread_ident()
        if self.depth and self.owner == me:
            self.depth += 1
            return
        if not PyThread_acquire_lock(self.mutex, NOWAIT_LOCK):
            with nogil:
                PyThread_acquire_lock(self.mutex, WAIT_LOCK)
        self.owner, self.depth = me, 1

    cdef inline void release(self):
        self.depth -= 1
        if self.depth == 0:
            self.owner = 0
            PyThread_release_lock(self.mutex)


# Messages this large share their copy between sender and receiver (see the top of this file).
cdef size_t SHARED_PUSH_BYTES = 1 << 20


cdef inline void _pack_header(unsigned char *header, int dtype, int64_t tag, uint64_t nbytes,
                              uint64_t kind, uint64_t addr, uint64_t msg_id,
                              uint64_t exposure=0) noexcept nogil:
    cdef uint64_t *h = <uint64_t *>header
    (<uint32_t *>header)[0] = MSG_MAGIC
    (<uint32_t *>header)[1] = dtype
    (<int64_t *>header)[1] = tag
    h[2], h[3], h[4], h[5], h[6], h[7] = nbytes, kind, addr, msg_id, exposure, 0


cdef class _SendOp:
    cdef object future
    cdef object owner
    cdef char *ptr
    cdef size_t total      # header + payload
    cdef size_t nbytes     # payload
    cdef size_t done
    cdef unsigned char header[64]
    cdef uint64_t deadline
    cdef int dst
    cdef bint waits_for_ack
    cdef int slot           # the exposure of a single-copy send's buffer, or -1


cdef class _RecvOp:
    cdef object future
    cdef object owner
    cdef object work
    cdef char *ptr
    cdef size_t nbytes
    cdef int dtype
    cdef int src
    cdef int source         # the sender, once matched
    cdef int64_t tag
    cdef uint64_t deadline


cdef class _Incoming:
    """The message currently streaming in from one sender."""
    cdef int src
    cdef unsigned char header[64]
    cdef size_t header_got
    cdef uint64_t kind
    cdef uint64_t addr
    cdef uint64_t msg_id
    cdef uint64_t exposure  # single copy: the sender's slot << 32 | generation for `addr`
    cdef bint pulled        # its payload was pulled into `buf` (counted in pulled_bytes)
    cdef bint dropped       # its receive failed mid-stream: the rest is read and dropped
    cdef int64_t tag
    cdef size_t nbytes
    cdef int dtype
    cdef size_t got
    cdef _RecvOp target     # the receive it feeds, or None while unexpected
    cdef bytearray buf      # unexpected payload (or a too-large one being drained)
    cdef bint complete
    cdef object error


cdef class P2PEngine:
    """Progress engine for a group's send/recv (internal: use ProcessGroup.isend/irecv)."""
    cdef Communicator comm
    cdef list sendq          # per destination: deque of _SendOp
    cdef list incoming       # per source: _Incoming or None
    cdef list posted         # _RecvOp in posting order
    cdef list unexpected     # _Incoming without a receive, in arrival order
    cdef _EngineLock lock
    cdef uint32_t kicks          # bumped when work is posted for the progress thread
    cdef uint32_t kick_waiters   # (a futex word in private memory, as a condition variable)
    cdef object thread
    cdef int pending
    cdef bint closed
    cdef dict acks_due       # CMA message id -> _SendOp waiting for the receiver's ACK
    cdef dict pushes_due     # (sender, message id) -> [_RecvOp, error, slot] waiting for PUSHED
    cdef uint32_t free_slots # exposure slots of this rank not in use (bit i: slot i)
    cdef size_t pulled_bytes # unexpected single-copy payloads held in private buffers
    cdef uint64_t next_id
    cdef uint64_t *known_tail    # per destination: its ring's tail when last read (only grows)

    def __cinit__(self):
        self.known_tail = NULL

    def __dealloc__(self):
        free(self.known_tail)

    def __init__(self, Communicator comm):
        self.comm = comm
        self.sendq = [deque() for _ in range(comm.size)]
        self.incoming = [None] * comm.size
        self.posted = []
        self.unexpected = []
        self.lock = _EngineLock()
        self.thread = None
        self.pending = 0
        self.closed = False
        self.acks_due = {}
        self.pushes_due = {}
        self.free_slots = 0xffffffff  # all SHM_P2P_EXPOSURES (32) slots
        self.pulled_bytes = 0
        self.next_id = 0
        self.known_tail = <uint64_t *>calloc(comm.size, sizeof(uint64_t))
        if self.known_tail == NULL:
            raise MemoryError()

    # ---- posting ------------------------------------------------------------------------------
    def post_send(self, future, array, int dst, int64_t tag, bint background=True):
        cdef buf_t b
        cdef _SendOp op = _SendOp()
        op.owner = as_buf(array, &b, False, "array")
        self._check_peer(dst, "dst")
        op.future, op.ptr, op.total, op.done, op.dst = future, b.ptr, MSG_HEADER_BYTES + b.nbytes, 0, dst
        op.nbytes, op.slot = b.nbytes, -1
        op.deadline = self._deadline()
        self.lock.acquire()
        try:
            self._check_open()
            kind, exposure = MSG_DATA, 0
            if self._single_copy(b.nbytes, dst):
                exposure = _p2p_expose(self, &op.slot)
                if op.slot >= 0:  # (every slot in use: through the ring)
                    kind, op.total, op.waits_for_ack = MSG_CMA, MSG_HEADER_BYTES, True
                    self.next_id += 1
            _pack_header(op.header, b.dtype, tag, b.nbytes, kind, <uint64_t>b.ptr, self.next_id, exposure)
            self.sendq[dst].append(op)
            self.pending += 1
            _p2p_pass(self)
            if background:
                self._kick()
        finally:
            self.lock.release()

    def post_recv(self, future, array, int src, int64_t tag, work, bint background=True):
        cdef buf_t b
        cdef _RecvOp op = _RecvOp()
        cdef _Incoming inc
        op.owner = as_buf(array, &b, True, "array")
        if src >= 0:
            self._check_peer(src, "src")
        op.future, op.work, op.ptr, op.nbytes, op.dtype = future, work, b.ptr, b.nbytes, b.dtype
        op.src, op.source, op.tag, op.deadline = src, -1, tag, self._deadline()
        self.lock.acquire()
        try:
            self._check_open()
            self.pending += 1
            for inc in self.unexpected:
                if (src < 0 or inc.src == src) and inc.tag == tag and inc.target is None:
                    inc.target = op
                    if inc.complete:
                        self.unexpected.remove(inc)
                        _p2p_deliver(self, inc)
                    break
            else:
                self.posted.append(op)
                _p2p_pass(self)
            if background:
                self._kick()
        finally:
            self.lock.release()
        return op

    # ---- blocking calls: eager when the ring allows, else an op driven on this thread --------
    def send(self, array, int dst, int64_t tag):
        """Send ``array`` to ``dst`` and return once it is in the ring (or, single-copy, read)."""
        cdef buf_t b
        owner = as_buf(array, &b, False, "array")
        self._check_peer(dst, "dst")
        if not self._single_copy(b.nbytes, dst):
            self.lock.acquire()
            try:
                self._check_open()
                if not self.sendq[dst] and _p2p_put_eager(self, dst, &b, tag):
                    return
            finally:
                self.lock.release()
        future = Future()
        self.post_send(future, array, dst, tag, False)
        self.drive(future)
        future.wait()

    def recv(self, array, int src, int64_t tag):
        """Receive into ``array`` from ``src`` (-1: any rank); returns the sender's rank."""
        cdef buf_t b
        cdef Communicator c = self.comm
        cdef uint64_t head, start = 0, now
        cdef int got
        owner = as_buf(array, &b, True, "array")
        if src >= 0:
            self._check_peer(src, "src")
        # Eager: the next message from src is this one and sits whole in the ring (waiting for
        # it up to the spin budget, watching the ring's head), and nothing else is in flight
        # that could claim it first.
        while src >= 0 and MSG_HEADER_BYTES + b.nbytes <= c.ring_bytes:
            head = capi.shm_load_acquire64(&c.ring(src, c.rank).head)
            self.lock.acquire()
            try:
                self._check_open()
                if self.pending or self.unexpected or self.incoming[src] is not None:
                    break
                got = _p2p_take_eager(self, src, &b, tag)
            finally:
                self.lock.release()
            if got > 0:
                return src
            if got < 0:
                break
            now = capi.shm_now_ns()
            if start == 0:
                start = now
            if now - start >= c.spin_ns:
                break
            with nogil:
                capi.shm_spin_change64(&c.ring(src, c.rank).head, head, c.spin_ns - (now - start))
        future = Future()
        op = self.post_recv(future, array, src, tag, None, False)
        self.drive(future)
        future.wait()
        return (<_RecvOp>op).source

    cdef inline bint _single_copy(self, size_t nbytes, int dst):
        cdef Communicator c = self.comm
        return c._single_copy_p2p_size(nbytes) and c.cma_ok and c.cb(dst).cma_ok

    cdef _check_peer(self, int r, str argname):
        if not 0 <= r < self.comm.size:
            raise ValueError(f"{argname} must be a rank in [0, {self.comm.size}), got {r}")

    cdef _check_open(self):
        if self.closed:
            raise ShmcommError("the process group was destroyed")
        _check_process(self.comm)
        if _group_aborted(self.comm):
            raise _aborted(self.comm, "point to point")

    cdef uint64_t _deadline(self):
        return capi.shm_deadline_after(self.comm.timeout)

    cdef _kick(self):
        if self.pending:
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, daemon=True,
                                               name=f"shmcomm-p2p-{self.comm.part}")
                self.thread.start()
            capi.shm_ring_bell(&self.kicks, &self.kick_waiters)

    # ---- the caller drives progress ---------------------------------------------------------
    def drive(self, future, double timeout=-1.0):
        """Move bytes on the calling thread until ``future`` is done: a blocking send or receive
        then needs no hand-off to the progress thread. CommTimeoutError after ``timeout`` s (< 0:
        no limit here; the operation's own deadline still applies)."""
        cdef Communicator c = self.comm
        cdef capi.shm_cb_t *me = c.cb(c.rank)
        cdef uint32_t bell
        cdef uint64_t started = capi.shm_now_ns()
        cdef uint64_t deadline = capi.shm_deadline_after(timeout) if timeout >= 0 else 0
        while not future.done():
            self.lock.acquire()
            try:
                bell = capi.shm_load_acquire(&me.bell)
                try:
                    if not _p2p_pass(self) and not (self.unexpected and capi.shm_now_ns() - started
                                                 > PULL_AFTER_NS and _p2p_pull_unexpected(self)):
                        _p2p_check_failures(self)
                except BaseException as exc:
                    _p2p_fail_all(self, exc)
                    raise
            finally:
                self.lock.release()
            if future.done():
                break
            if deadline and capi.shm_now_ns() > deadline:
                raise CommTimeoutError(f"point-to-point operation not completed within {timeout} s")
            with nogil:
                capi.shm_wait_geq(&me.bell, bell + 1, &me.bell_waiters, c.spin_ns, c.yields, SLICE_NS)
            PyErr_CheckSignals()

    # ---- the progress thread ------------------------------------------------------------------
    def _loop(self):
        cdef Communicator c = self.comm
        cdef capi.shm_cb_t *me = c.cb(c.rank)
        cdef uint32_t bell, kicks
        cdef bint idle
        while True:
            self.lock.acquire()
            try:
                if self.closed:
                    return
                idle = not self.pending
                kicks = self.kicks
                moved = False
                if not idle:
                    bell = capi.shm_load_acquire(&me.bell)
                    try:
                        moved = _p2p_pass(self)
                        if not moved:
                            _p2p_check_failures(self)
                    except BaseException as exc:  # noqa: fail everything rather than hang
                        _p2p_fail_all(self, exc)
                        continue
            finally:
                self.lock.release()
            if idle:  # nothing posted: sleep until _kick (not on the bell: leave messages to recv)
                with nogil:
                    capi.shm_wait_geq(&self.kicks, kicks + 1, &self.kick_waiters, 0, 0, SLICE_NS)
            elif not moved:  # background work: sleep at once, leave the cores to the ranks
                with nogil:
                    capi.shm_wait_geq(&me.bell, bell + 1, &me.bell_waiters, 0, 0, SLICE_NS)

    def fail_all(self, exc):
        self.lock.acquire()
        try:
            _p2p_fail_all(self, exc)
        finally:
            self.lock.release()

    def close(self):
        cdef uint64_t until = capi.shm_now_ns() + 1000000000
        self.lock.acquire()
        try:
            # ACKs still queued complete peers' sends: deliver them before leaving (bounded).
            while any(self.sendq[r] for r in range(self.comm.size)) and capi.shm_now_ns() < until:
                if not _p2p_pass(self):
                    time.sleep(0.001)
            self.closed = True
            if self.pending:
                _p2p_fail_all(self, ShmcommError("the process group was destroyed"))
            capi.shm_ring_bell(&self.kicks, &self.kick_waiters)
        finally:
            self.lock.release()
        if self.thread is not None and self.thread is not threading.current_thread():
            capi.shm_futex_wake_all(&self.comm.cb(self.comm.rank).bell)
            self.thread.join(timeout=5.0)
