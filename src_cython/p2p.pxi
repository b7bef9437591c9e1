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
import threading
from collections import deque
from cpython.pythread cimport (
    NOWAIT_LOCK, WAIT_LOCK, PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock,
    PyThread_get_thread_ident, PyThread_release_lock, PyThread_type_lock,
)
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

# A thread blocked this long in drive() takes unexpected single-copy messages into buffers.
cdef uint64_t PULL_AFTER_NS = 1000 * 1000

cdef enum:
    MSG_HEADER_BYTES = 48   # magic u32, dtype u32, tag i64, nbytes u64, kind u64, addr u64, id u64
    MSG_MAGIC = 0x4d534853  # "SHSM"
    MSG_DATA = 0            # the payload follows in the ring
    MSG_CMA = 1             # the payload stays at `addr` in the sender: read it from there
    MSG_ACK = 2             # the CMA message `id` was read: its send is complete
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
                              uint64_t kind, uint64_t addr, uint64_t msg_id) noexcept nogil:
    cdef uint64_t *h = <uint64_t *>header
    (<uint32_t *>header)[0] = MSG_MAGIC
    (<uint32_t *>header)[1] = dtype
    (<int64_t *>header)[1] = tag
    h[2], h[3], h[4], h[5] = nbytes, kind, addr, msg_id


cdef class _SendOp:
    cdef object future
    cdef object owner
    cdef char *ptr
    cdef size_t total      # header + payload
    cdef size_t nbytes     # payload
    cdef size_t done
    cdef unsigned char header[48]
    cdef uint64_t deadline
    cdef int dst
    cdef bint waits_for_ack


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
    cdef unsigned char header[48]
    cdef size_t header_got
    cdef uint64_t kind
    cdef uint64_t addr
    cdef uint64_t msg_id
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
    cdef dict pushes_due     # (sender, message id) -> [_RecvOp, error] waiting for PUSHED
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
        op.nbytes = b.nbytes
        kind = MSG_DATA
        if self._single_copy(b.nbytes, dst):
            kind, op.total, op.waits_for_ack = MSG_CMA, MSG_HEADER_BYTES, True
            self.next_id += 1
        _pack_header(op.header, b.dtype, tag, b.nbytes, kind, <uint64_t>b.ptr, self.next_id)
        op.deadline = self._deadline()
        self.lock.acquire()
        try:
            self._check_open()
            self.sendq[dst].append(op)
            self.pending += 1
            self._pass()
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
                        self._deliver(inc)
                    break
            else:
                self.posted.append(op)
                self._pass()
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
                if not self.sendq[dst] and self._put_eager(dst, &b, tag):
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
                got = self._take_eager(src, &b, tag)
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
        c = self.comm
        return nbytes >= c.cma_bytes > 0 and c.cma_ok and c.cb(dst).cma_ok

    cdef bint _put_eager(self, int dst, buf_t *b, int64_t tag) except -1:
        """Write a whole message into ring me->dst if it has room now; False if not."""
        cdef Communicator c = self.comm
        cdef capi.shm_ring_t *ring = c.ring(c.rank, dst)
        cdef char *data = <char *>ring + SHM_RING_CTRL_BYTES
        cdef uint64_t head = ring.head, tail = self.known_tail[dst]
        cdef size_t cap = c.ring_bytes
        cdef unsigned char header[MSG_HEADER_BYTES]
        if <size_t>(head - tail) + MSG_HEADER_BYTES + b.nbytes > cap:
            # The receiver's tail line is read only when the stale value says "no room": reading
            # it every time put a cache miss on every message's path. (The general path moves
            # head too, so head - stale tail may exceed the capacity: never subtract from cap.)
            tail = capi.shm_load_acquire64(&ring.tail)
            self.known_tail[dst] = tail
            if <size_t>(head - tail) + MSG_HEADER_BYTES + b.nbytes > cap:
                return False
        _pack_header(header, b.dtype, tag, b.nbytes, MSG_DATA, 0, 0)
        with nogil:
            capi.shm_ring_put(data, cap, head, <char *>header, MSG_HEADER_BYTES)
            capi.shm_ring_put(data, cap, head + MSG_HEADER_BYTES, b.ptr, b.nbytes)
            capi.shm_store_release64(&ring.head, head + MSG_HEADER_BYTES + b.nbytes)
            capi.shm_ring_bell(&c.cb(dst).bell, &c.cb(dst).bell_waiters)
        return True

    cdef int _take_eager(self, int src, buf_t *b, int64_t tag) except -2:
        """Take the next message of ring src->me into ``b``: 1 done, 0 not (wholly) there yet,
        -1 it is not a plain message of this tag, size and dtype (the general path handles it)."""
        cdef Communicator c = self.comm
        cdef capi.shm_ring_t *ring = c.ring(src, c.rank)
        cdef char *data = <char *>ring + SHM_RING_CTRL_BYTES
        cdef uint64_t tail = ring.tail, head = capi.shm_load_acquire64(&ring.head)
        cdef size_t cap = c.ring_bytes, avail = <size_t>(head - tail)
        cdef unsigned char header[MSG_HEADER_BYTES]
        if avail < MSG_HEADER_BYTES:
            return 0
        capi.shm_ring_get(<char *>header, data, cap, tail, MSG_HEADER_BYTES)
        if ((<uint32_t *>header)[0] != MSG_MAGIC or (<uint64_t *>header)[3] != MSG_DATA
                or (<int64_t *>header)[1] != tag or (<uint64_t *>header)[2] != b.nbytes
                or (<uint32_t *>header)[1] != <uint32_t>b.dtype):
            return -1
        if avail < MSG_HEADER_BYTES + b.nbytes:
            return 0
        with nogil:
            capi.shm_ring_get(b.ptr, data, cap, tail + MSG_HEADER_BYTES, b.nbytes)
            capi.shm_store_release64(&ring.tail, tail + MSG_HEADER_BYTES + b.nbytes)
            capi.shm_ring_bell(&c.cb(src).bell, &c.cb(src).bell_waiters)
        return 1

    cdef _send_control(self, int dst, uint64_t kind, uint64_t msg_id, int status=0, int64_t offset=0,
                       uint64_t nbytes=0, uint64_t addr=0):
        """Send a header-only control message (ACK, PUSH, PUSHED) about message `msg_id`."""
        cdef _SendOp ctl = _SendOp()
        ctl.total, ctl.done, ctl.dst, ctl.deadline = MSG_HEADER_BYTES, 0, dst, self._deadline()
        _pack_header(ctl.header, status, offset, nbytes, kind, addr, msg_id)
        if not self.sendq[dst]:  # usually the ring has room: send it now, the peer is waiting
            self._write(dst, ctl)
            if ctl.done == ctl.total:
                return
        self.sendq[dst].append(ctl)
        self.pending += 1
        self._kick()  # a full ring: the progress thread delivers it

    cdef _check_peer(self, int r, str argname):
        if not 0 <= r < self.comm.size:
            raise ValueError(f"{argname} must be a rank in [0, {self.comm.size}), got {r}")

    cdef _check_open(self):
        if self.closed:
            raise ShmcommError("the process group was destroyed")
        _check_process(self.comm)
        if self.comm.hdr != NULL and capi.shm_load_acquire(&self.comm.hdr.abort_flag):
            raise AbortedError(_aborted_text(self.comm))

    cdef uint64_t _deadline(self):
        return capi.shm_now_ns() + <uint64_t>(self.comm.timeout * 1e9)

    cdef _kick(self):
        if self.pending:
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, daemon=True,
                                               name=f"shmcomm-p2p-{self.comm.part}")
                self.thread.start()
            capi.shm_ring_bell(&self.kicks, &self.kick_waiters)

    # ---- moving bytes -------------------------------------------------------------------------
    cdef bint _pass(self) except -1:
        """Move every byte that can move now; True if anything moved."""
        cdef bint moved = False
        cdef int r
        cdef _SendOp sent
        for r in range(self.comm.size):
            while self.sendq[r]:
                if self._write(r, <_SendOp>self.sendq[r][0]):
                    moved = True
                if (<_SendOp>self.sendq[r][0]).done < (<_SendOp>self.sendq[r][0]).total:
                    break
                sent = <_SendOp>self.sendq[r].popleft()
                if sent.waits_for_ack:  # the receiver still has to read the payload
                    self.acks_due[(<uint64_t *>sent.header)[5]] = sent
                else:
                    self._finish(sent.future, None, None, -1)
        for r in range(self.comm.size):
            while self._read(r):
                moved = True
        return moved

    cdef bint _write(self, int dst, _SendOp op) except -1:
        cdef Communicator c = self.comm
        cdef capi.shm_ring_t *ring = c.ring(c.rank, dst)
        cdef char *data = <char *>ring + SHM_RING_CTRL_BYTES
        cdef uint64_t head = ring.head, tail = capi.shm_load_acquire64(&ring.tail)
        cdef size_t cap = c.ring_bytes, room = cap - <size_t>(head - tail), n
        cdef const char *src
        if room == 0:
            return False
        while room and op.done < op.total:
            if op.done < MSG_HEADER_BYTES:
                src, n = <char *>op.header + op.done, MSG_HEADER_BYTES - op.done
            else:
                src, n = op.ptr + (op.done - MSG_HEADER_BYTES), op.total - op.done
            n = min(n, room)
            with nogil:
                capi.shm_ring_put(data, cap, head, src, n)
            head += n
            room -= n
            op.done += n
        capi.shm_store_release64(&ring.head, head)
        capi.shm_ring_bell(&c.cb(dst).bell, &c.cb(dst).bell_waiters)
        return True

    cdef size_t _take(self, int src, char *dst, size_t want) except? 0:
        """Copy up to `want` available bytes of ring src->me into dst; return how many."""
        cdef Communicator c = self.comm
        cdef capi.shm_ring_t *ring = c.ring(src, c.rank)
        cdef char *data = <char *>ring + SHM_RING_CTRL_BYTES
        cdef uint64_t tail = ring.tail, head = capi.shm_load_acquire64(&ring.head)
        cdef size_t cap = c.ring_bytes, n = min(want, <size_t>(head - tail))
        if n == 0:
            return 0
        if dst != NULL:
            with nogil:
                capi.shm_ring_get(dst, data, cap, tail, n)
        capi.shm_store_release64(&ring.tail, tail + n)
        capi.shm_ring_bell(&c.cb(src).bell, &c.cb(src).bell_waiters)
        return n

    cdef bint _read(self, int src) except -1:
        cdef _Incoming inc = self.incoming[src]
        cdef size_t n
        cdef char *dst
        if inc is None:
            inc = _Incoming()
            inc.src = src
            self.incoming[src] = inc
        if inc.header_got < MSG_HEADER_BYTES:
            n = self._take(src, <char *>inc.header + inc.header_got, MSG_HEADER_BYTES - inc.header_got)
            inc.header_got += n
            if inc.header_got < MSG_HEADER_BYTES:
                return n > 0
            if (<uint32_t *>inc.header)[0] != MSG_MAGIC:
                raise ShmcommError(f"corrupt message header from rank {src}")
            inc.dtype = (<uint32_t *>inc.header)[1]
            inc.tag = (<int64_t *>inc.header)[1]
            inc.nbytes = (<uint64_t *>inc.header)[2]
            inc.kind = (<uint64_t *>inc.header)[3]
            inc.addr = (<uint64_t *>inc.header)[4]
            inc.msg_id = (<uint64_t *>inc.header)[5]
            if inc.kind == MSG_ACK:
                self.incoming[src] = None
                acked = self.acks_due.pop(inc.msg_id, None)
                if acked is not None:
                    self._finish((<_SendOp>acked).future, None, None, -1)
                return True
            if inc.kind == MSG_PUSH:
                self.incoming[src] = None
                self._push(src, inc)
                return True
            if inc.kind == MSG_PUSHED:
                self.incoming[src] = None
                waiting = self.pushes_due.pop((src, inc.msg_id), None)
                if waiting is not None:
                    error = waiting[1]
                    if error is None and inc.dtype:
                        error = ShmcommError(f"recv from rank {src}: it could not write into this "
                                             f"buffer: {_os_error_text(inc.dtype)}")
                    self._finish_recv(waiting[0], error, src)
                return True
            if inc.kind == MSG_CMA:
                inc.got = inc.nbytes  # nothing more comes through the ring
            self._match(inc)
        if inc.got < inc.nbytes:
            if inc.buf is not None:
                dst = <char *>inc.buf + inc.got
            else:
                dst = inc.target.ptr + inc.got
            n = self._take(src, dst, inc.nbytes - inc.got)
            inc.got += n
            if inc.got < inc.nbytes:
                return n > 0
        inc.complete = True
        self.incoming[src] = None
        if inc.target is not None:
            if inc.buf is not None and inc in self.unexpected:
                self.unexpected.remove(inc)  # a receive claimed it while it streamed in
            self._deliver(inc)
        return True

    cdef _match(self, _Incoming inc):
        cdef _RecvOp op
        for op in self.posted:
            if (op.src < 0 or op.src == inc.src) and op.tag == inc.tag:
                self.posted.remove(op)
                inc.target = op
                if op.nbytes != inc.nbytes or op.dtype != inc.dtype:
                    if inc.kind == MSG_DATA:
                        inc.buf = bytearray(inc.nbytes)  # drain it, then fail the receive
                    inc.error = CollectiveMismatchError(
                        f"recv: rank {inc.src} sent {inc.nbytes} bytes of {DTYPE_NAMES[inc.dtype]} "
                        f"(tag {inc.tag}) into a buffer of {op.nbytes} bytes of {DTYPE_NAMES[op.dtype]}")
                return
        if inc.kind == MSG_DATA:
            inc.buf = bytearray(inc.nbytes)
        self.unexpected.append(inc)

    cdef _deliver(self, _Incoming inc):
        cdef _RecvOp op = inc.target
        cdef char *src
        if inc.kind == MSG_CMA:
            if inc.error is None and (op.nbytes != inc.nbytes or op.dtype != inc.dtype):
                inc.error = CollectiveMismatchError(
                    f"recv: rank {inc.src} sent {inc.nbytes} bytes of {DTYPE_NAMES[inc.dtype]} "
                    f"(tag {inc.tag}) into a buffer of {op.nbytes} bytes of {DTYPE_NAMES[op.dtype]}")
            if inc.error is None and inc.nbytes >= SHARED_PUSH_BYTES and inc.src != self.comm.rank:
                # Share the copy: the sender writes the second half while this rank reads the
                # first; the receive completes when its PUSHED arrives.
                split = (inc.nbytes // 2) & ~(<size_t>4095)
                self._send_control(inc.src, MSG_PUSH, inc.msg_id, 0, split, inc.nbytes - split,
                                   <uint64_t>op.ptr + split)
                error = self._read_from_sender(inc, op.ptr, split)
                self._send_control(inc.src, MSG_ACK, inc.msg_id)
                self.pushes_due[(inc.src, inc.msg_id)] = [op, error]
                return
            if inc.error is None:
                inc.error = self._read_from_sender(inc, op.ptr, inc.nbytes)
            self._send_control(inc.src, MSG_ACK, inc.msg_id)
        elif inc.error is None and inc.buf is not None:
            if op.nbytes != inc.nbytes or op.dtype != inc.dtype:
                inc.error = CollectiveMismatchError(
                    f"recv: rank {inc.src} sent {inc.nbytes} bytes of {DTYPE_NAMES[inc.dtype]} "
                    f"(tag {inc.tag}) into a buffer of {op.nbytes} bytes of {DTYPE_NAMES[op.dtype]}")
            else:
                src = <char *>inc.buf
                memcpy(op.ptr, src, inc.nbytes)
        self._finish_recv(op, inc.error, inc.src)

    cdef _push(self, int dst, _Incoming req):
        """A receiver asked for part of a CMA message we sent: write it into its buffer."""
        cdef _SendOp op = self.acks_due.get(req.msg_id)
        cdef int err = 0, pid = self.comm.pids[dst]
        cdef uint64_t remote = req.addr
        cdef size_t n = req.nbytes
        cdef char *local
        if op is None:  # the send already failed here (timeout, abort): tell the receiver
            self._send_control(dst, MSG_PUSHED, req.msg_id, 5)  # EIO
            return
        if req.tag < 0 or <size_t>req.tag > op.nbytes or n > op.nbytes - <size_t>req.tag:
            # read from the ring, so never trusted: only the message's own bytes are ever sent
            self._send_control(dst, MSG_PUSHED, req.msg_id, 22)  # EINVAL
            return
        local = op.ptr + req.tag
        with nogil:
            err = capi.shm_cma_write(pid, local, remote, n)
        self._send_control(dst, MSG_PUSHED, req.msg_id, err)
        if err:
            del self.acks_due[req.msg_id]
            self._finish(op.future, ShmcommError(f"send to rank {dst}: writing into its buffer failed: "
                                                 f"{_os_error_text(err)}"), None, -1)

    cdef object _read_from_sender(self, _Incoming inc, char *dst, size_t n):
        """Copy the first n bytes of a CMA message out of the sender's memory; an error or None."""
        cdef int err = 0, pid = self.comm.pids[inc.src]
        cdef uint64_t addr = inc.addr
        if inc.src == self.comm.rank:
            memcpy(dst, <char *>addr, n)
            return None
        with nogil:
            err = capi.shm_cma_read(pid, dst, addr, n)
        if err == 0:
            return None
        return os_failure(f"recv from rank {inc.src}: reading its memory", err, inc.src, pid)

    cdef _finish_recv(self, _RecvOp op, error, int source):
        """Complete a receive matched with a message from ``source``."""
        op.source = source
        self._finish(op.future, error, op.work, source)

    cdef _finish(self, future, error, work, int source):
        self.pending -= 1
        if future is None:  # an ACK we sent
            return
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
            return
        if work is not None:
            work._source = source
        future.set_result(work._outputs if work is not None else [])

    # ---- the caller drives progress ---------------------------------------------------------
    def drive(self, future, double timeout=-1.0):
        """Move bytes on the calling thread until ``future`` is done: a blocking send or receive
        then needs no hand-off to the progress thread. CommTimeoutError after ``timeout`` s (< 0:
        no limit here; the operation's own deadline still applies)."""
        cdef Communicator c = self.comm
        cdef capi.shm_cb_t *me = c.cb(c.rank)
        cdef uint32_t bell
        cdef uint64_t started = capi.shm_now_ns()
        cdef uint64_t deadline = started + <uint64_t>(timeout * 1e9) if timeout >= 0 else 0
        while not future.done():
            self.lock.acquire()
            try:
                bell = capi.shm_load_acquire(&me.bell)
                try:
                    if not self._pass() and not (self.unexpected and capi.shm_now_ns() - started
                                                 > PULL_AFTER_NS and self._pull_unexpected()):
                        self._check_failures()
                except BaseException as exc:
                    self._fail_all(exc)
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

    cdef bint _pull_unexpected(self) except -1:
        """Read every single-copy message no receive has asked for yet into a private buffer and
        acknowledge it, which completes its sender's send. Called by a thread blocked in drive():
        two ranks that each send a large message to the other before receiving would otherwise
        wait for each other's receive for ever (each send waits for its ACK). True if any."""
        cdef _Incoming inc
        cdef bytearray data
        cdef bint pulled = False
        for inc in self.unexpected:
            if inc.kind != MSG_CMA or not inc.complete or inc.target is not None \
                    or inc.error is not None or inc.src == self.comm.rank:
                continue
            data = bytearray(inc.nbytes)
            inc.error = self._read_from_sender(inc, <char *>data, inc.nbytes)
            inc.kind, inc.buf = MSG_DATA, data  # a receive now copies it out, as any buffered one
            if inc.error is None:
                self._send_control(inc.src, MSG_ACK, inc.msg_id)
            pulled = True
        return pulled

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
                        moved = self._pass()
                        if not moved:
                            self._check_failures()
                    except BaseException as exc:  # noqa: fail everything rather than hang
                        self._fail_all(exc)
                        continue
            finally:
                self.lock.release()
            if idle:  # nothing posted: sleep until _kick (not on the bell: leave messages to recv)
                with nogil:
                    capi.shm_wait_geq(&self.kicks, kicks + 1, &self.kick_waiters, 0, 0, SLICE_NS)
            elif not moved:  # background work: sleep at once, leave the cores to the ranks
                with nogil:
                    capi.shm_wait_geq(&me.bell, bell + 1, &me.bell_waiters, 0, 0, SLICE_NS)

    cdef _check_failures(self):
        """Fail operations whose peer is gone, or that ran past their deadline."""
        cdef Communicator c = self.comm
        cdef uint64_t now = capi.shm_now_ns()
        cdef _SendOp s
        cdef _RecvOp r
        if c.is_aborted():
            self._fail_all(AbortedError(_aborted_text(self.comm)))
            return
        gone = [q != c.rank and (capi.shm_load_acquire(&c.cb(q).state) == SHM_RANK_DEPARTED
                                 or _peer_dead(c, q)) for q in range(c.size)]
        for q in range(c.size):
            while self.sendq[q]:
                s = self.sendq[q][0]
                if not gone[q] and now < s.deadline:
                    break
                self.sendq[q].popleft()
                self._finish(s.future, self._why(q, gone[q], "send to"), None, -1)
        for msg_id, s in list(self.acks_due.items()):
            if gone[s.dst] or now >= s.deadline:
                del self.acks_due[msg_id]
                self._finish(s.future, self._why(s.dst, gone[s.dst], "send to"), None, -1)
        for key, waiting in list(self.pushes_due.items()):
            r = waiting[0]
            if gone[key[0]] or now >= r.deadline:
                del self.pushes_due[key]
                self._finish(r.future, self._why(key[0], gone[key[0]], "recv from"), None, -1)
        everyone_gone = all(gone[q] for q in range(c.size) if q != c.rank)
        for r in list(self.posted):
            if now >= r.deadline or (gone[r.src] if r.src >= 0 else everyone_gone and c.size > 1):
                self.posted.remove(r)
                self._finish(r.future, self._why(r.src, now < r.deadline, "recv from"), None, -1)

    cdef object _why(self, int q, bint gone, str what):
        c = self.comm
        if gone:
            pid = c.pids[q] if q >= 0 else -1
            return peer_failure(f"{what} rank {q}", q, pid)
        return CommTimeoutError(f"{what} rank {q}: no progress within {c.timeout} s")

    cdef _fail_all(self, exc):
        cdef _SendOp s
        cdef _RecvOp r
        for q in range(self.comm.size):
            while self.sendq[q]:
                s = self.sendq[q].popleft()
                self._finish(s.future, exc, None, -1)
        for r in self.posted:
            self._finish(r.future, exc, None, -1)
        self.posted.clear()
        for s in self.acks_due.values():
            self._finish(s.future, exc, None, -1)
        self.acks_due.clear()
        for waiting in self.pushes_due.values():
            self._finish((<_RecvOp>waiting[0]).future, exc, None, -1)
        self.pushes_due.clear()
        for inc in self.unexpected:
            if (<_Incoming>inc).target is not None:
                self._finish((<_Incoming>inc).target.future, exc, None, -1)

    def fail_all(self, exc):
        self.lock.acquire()
        try:
            self._fail_all(exc)
        finally:
            self.lock.release()

    def close(self):
        cdef uint64_t until = capi.shm_now_ns() + 1000000000
        self.lock.acquire()
        try:
            # ACKs still queued complete peers' sends: deliver them before leaving (bounded).
            while any(self.sendq[r] for r in range(self.comm.size)) and capi.shm_now_ns() < until:
                if not self._pass():
                    time.sleep(0.001)
            self.closed = True
            if self.pending:
                self._fail_all(ShmcommError("the process group was destroyed"))
            capi.shm_ring_bell(&self.kicks, &self.kick_waiters)
        finally:
            self.lock.release()
        if self.thread is not None and self.thread is not threading.current_thread():
            capi.shm_futex_wake_all(&self.comm.cb(self.comm.rank).bell)
            self.thread.join(timeout=5.0)
