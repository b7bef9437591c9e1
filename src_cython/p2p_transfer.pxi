# Point to point, moving bytes: the eager fast paths (a whole message straight into or out of its
# ring), control messages, moving every byte that can move (_p2p_pass: ring writes and reads,
# matching arrivals to posted receives, single-copy pulls and pushes) and failing what a dead peer
# leaves behind. Free functions of P2PEngine (p2p.pxi holds its state, posting and threads).
from libc.errno cimport EIO

# ---- eager paths and control messages --------------------------------------------------------
cdef bint _p2p_put_eager(P2PEngine self, int dst, buf_t *b, int64_t tag) except -1:
    """Write a whole message into ring me->dst if it has room now; False if not."""
    cdef Communicator c = self.comm
    cdef capi.shm_ring_t *ring = c.ring(c.rank, dst)
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
        head = capi.shm_ring_write(ring, cap, head, <char *>header, MSG_HEADER_BYTES)
        capi.shm_ring_publish(ring, capi.shm_ring_write(ring, cap, head, b.ptr, b.nbytes))
        capi.shm_ring_bell(&c.cb(dst).bell, &c.cb(dst).bell_waiters)
    return True



cdef int _p2p_take_eager(P2PEngine self, int src, buf_t *b, int64_t tag) except -2:
    """Take the next message of ring src->me into ``b``: 1 done, 0 not (wholly) there yet,
    -1 it is not a plain message of this tag, size and dtype (the general path handles it)."""
    cdef Communicator c = self.comm
    cdef capi.shm_ring_t *ring = c.ring(src, c.rank)
    cdef uint64_t tail = ring.tail
    cdef size_t cap = c.ring_bytes, avail = capi.shm_ring_avail(ring, tail)
    cdef unsigned char header[MSG_HEADER_BYTES]
    if avail < MSG_HEADER_BYTES:
        return 0
    capi.shm_ring_peek(ring, cap, tail, <char *>header, MSG_HEADER_BYTES)
    if ((<uint32_t *>header)[0] != MSG_MAGIC or (<uint64_t *>header)[3] != MSG_DATA
            or (<int64_t *>header)[1] != tag or (<uint64_t *>header)[2] != b.nbytes
            or (<uint32_t *>header)[1] != <uint32_t>b.dtype):
        return -1
    if avail < MSG_HEADER_BYTES + b.nbytes:
        return 0
    with nogil:
        capi.shm_ring_read(ring, cap, tail + MSG_HEADER_BYTES, b.ptr, b.nbytes)
        capi.shm_ring_bell(&c.cb(src).bell, &c.cb(src).bell_waiters)
    return 1



cdef _p2p_send_control(P2PEngine self, int dst, uint64_t kind, uint64_t msg_id, int status=0, int64_t offset=0,
                   uint64_t nbytes=0, uint64_t addr=0, uint64_t exposure=0):
    """Send a header-only control message (ACK, PUSH, PUSHED) about message `msg_id`."""
    cdef _SendOp ctl = _SendOp()
    ctl.total, ctl.done, ctl.dst, ctl.deadline, ctl.slot = MSG_HEADER_BYTES, 0, dst, self._deadline(), -1
    _pack_header(ctl.header, status, offset, nbytes, kind, addr, msg_id, exposure)
    if not self.sendq[dst]:  # usually the ring has room: send it now, the peer is waiting
        _p2p_write(self, dst, ctl)
        if ctl.done == ctl.total:
            return
    self.sendq[dst].append(ctl)
    self.pending += 1
    self._kick()  # a full ring: the progress thread delivers it



# ---- moving bytes -------------------------------------------------------------------------
cdef bint _p2p_pass(P2PEngine self) except -1:
    """Move every byte that can move now; True if anything moved."""
    cdef bint moved = False
    cdef int r
    cdef _SendOp sent
    for r in range(self.comm.size):
        while self.sendq[r]:
            if _p2p_write(self, r, <_SendOp>self.sendq[r][0]):
                moved = True
            if (<_SendOp>self.sendq[r][0]).done < (<_SendOp>self.sendq[r][0]).total:
                break
            sent = <_SendOp>self.sendq[r].popleft()
            if sent.waits_for_ack:  # the receiver still has to read the payload
                self.acks_due[(<uint64_t *>sent.header)[5]] = sent
            else:
                _p2p_finish(self, sent.future, None, None, -1)
    for r in range(self.comm.size):
        while _p2p_read(self, r):
            moved = True
    return moved



cdef bint _p2p_write(P2PEngine self, int dst, _SendOp op) except -1:
    cdef Communicator c = self.comm
    cdef capi.shm_ring_t *ring = c.ring(c.rank, dst)
    cdef uint64_t head = ring.head
    cdef size_t cap = c.ring_bytes, room = capi.shm_ring_room(ring, cap, head), n
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
            head = capi.shm_ring_write(ring, cap, head, src, n)
        room -= n
        op.done += n
    capi.shm_ring_publish(ring, head)
    capi.shm_ring_bell(&c.cb(dst).bell, &c.cb(dst).bell_waiters)
    return True



cdef size_t _p2p_take(P2PEngine self, int src, char *dst, size_t want) except? 0:
    """Copy up to `want` available bytes of ring src->me into dst; return how many."""
    cdef Communicator c = self.comm
    cdef capi.shm_ring_t *ring = c.ring(src, c.rank)
    cdef uint64_t tail = ring.tail
    cdef size_t cap = c.ring_bytes, n = min(want, capi.shm_ring_avail(ring, tail))
    if n == 0:
        return 0
    with nogil:
        capi.shm_ring_read(ring, cap, tail, dst, n)
    capi.shm_ring_bell(&c.cb(src).bell, &c.cb(src).bell_waiters)
    return n



cdef bint _p2p_read(P2PEngine self, int src) except -1:
    cdef _Incoming inc = self.incoming[src]
    cdef size_t n
    cdef char *dst
    cdef bytearray drain
    if inc is None:
        inc = _Incoming()
        inc.src = src
        self.incoming[src] = inc
    if inc.header_got < MSG_HEADER_BYTES:
        n = _p2p_take(self, src, <char *>inc.header + inc.header_got, MSG_HEADER_BYTES - inc.header_got)
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
        inc.exposure = (<uint64_t *>inc.header)[6]
        if inc.kind == MSG_ACK:
            self.incoming[src] = None
            acked = self.acks_due.pop(inc.msg_id, None)
            if acked is not None:
                _p2p_end_send(self, acked, None if inc.dtype == 0 else ShmcommError(
                    f"send to rank {src}: its receive failed before it took the message "
                    f"({_os_error_text(inc.dtype)}); the message was not delivered"))
            return True
        if inc.kind == MSG_PUSH:
            self.incoming[src] = None
            _p2p_push(self, src, inc)
            return True
        if inc.kind == MSG_PUSHED:
            self.incoming[src] = None
            waiting = self.pushes_due.pop((src, inc.msg_id), None)
            if waiting is not None:
                _p2p_unexpose(self, waiting[2], src, None)  # the sender's write is over
                error = waiting[1]
                if error is None and inc.dtype:
                    error = ShmcommError(f"recv from rank {src}: it could not write into this "
                                         f"buffer: {_os_error_text(inc.dtype)}")
                _p2p_finish_recv(self, waiting[0], error, src)
            return True
        if inc.kind == MSG_CMA:
            inc.got = inc.nbytes  # nothing more comes through the ring
        _p2p_match(self, inc)
    if inc.got < inc.nbytes:
        if inc.dropped:  # its receive failed: the rest never touches the receive's buffer
            drain = _p2p_drain(self)
            n = _p2p_take(self, src, <char *>drain, min(<size_t>len(drain), inc.nbytes - inc.got))
        elif inc.buf is not None:
            n = _p2p_take(self, src, <char *>inc.buf + inc.got, inc.nbytes - inc.got)
        else:
            n = _p2p_take(self, src, inc.target.ptr + inc.got, inc.nbytes - inc.got)
        inc.got += n
        if inc.got < inc.nbytes:
            return n > 0
    inc.complete = True
    self.incoming[src] = None
    if inc.dropped:  # its receive already failed
        if inc in self.unexpected:
            self.unexpected.remove(inc)
    elif inc.target is not None:
        if inc.buf is not None and inc in self.unexpected:
            self.unexpected.remove(inc)  # a receive claimed it while it streamed in
        _p2p_deliver(self, inc)
    return True



cdef _p2p_match(P2PEngine self, _Incoming inc):
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



cdef _p2p_deliver(P2PEngine self, _Incoming inc):
    cdef _RecvOp op = inc.target
    cdef char *src
    cdef int slot
    cdef uint64_t exposure
    if inc.kind == MSG_CMA:
        if inc.error is None and (op.nbytes != inc.nbytes or op.dtype != inc.dtype):
            inc.error = CollectiveMismatchError(
                f"recv: rank {inc.src} sent {inc.nbytes} bytes of {DTYPE_NAMES[inc.dtype]} "
                f"(tag {inc.tag}) into a buffer of {op.nbytes} bytes of {DTYPE_NAMES[op.dtype]}")
        if inc.error is None and inc.nbytes >= SHARED_PUSH_BYTES and inc.src != self.comm.rank:
            # Share the copy: the sender writes the second half (exposed to it, see Exposures
            # in p2p.pxi) while this rank reads the first; the receive completes when its
            # PUSHED arrives. (Every exposure slot in use: this rank copies it all.)
            exposure = _p2p_expose(self, &slot)
            if slot >= 0:
                split = (inc.nbytes // 2) & ~(<size_t>4095)
                _p2p_send_control(self, inc.src, MSG_PUSH, inc.msg_id, 0, split, inc.nbytes - split,
                                   <uint64_t>op.ptr + split, exposure)
                error = _p2p_read_from_sender(self, inc, op.ptr, split)
                _p2p_send_control(self, inc.src, MSG_ACK, inc.msg_id, 0 if error is None else EIO)
                if error is None:
                    self.pushes_due[(inc.src, inc.msg_id)] = [op, error, slot]
                else:  # (a sender that withdrew may never answer the PUSH: fail now)
                    _p2p_unexpose(self, slot, inc.src, error)
                    _p2p_finish_recv(self, op, error, inc.src)
                return
        read_error = None  # (a mismatch releases the sender: its send completes, as in MPI)
        if inc.error is None:
            read_error = inc.error = _p2p_read_from_sender(self, inc, op.ptr, inc.nbytes)
        _p2p_send_control(self, inc.src, MSG_ACK, inc.msg_id, 0 if read_error is None else EIO)
    elif inc.error is None and inc.buf is not None:
        if op.nbytes != inc.nbytes or op.dtype != inc.dtype:
            inc.error = CollectiveMismatchError(
                f"recv: rank {inc.src} sent {inc.nbytes} bytes of {DTYPE_NAMES[inc.dtype]} "
                f"(tag {inc.tag}) into a buffer of {op.nbytes} bytes of {DTYPE_NAMES[op.dtype]}")
        else:
            src = <char *>inc.buf
            memcpy(op.ptr, src, inc.nbytes)
    if inc.pulled:
        self.pulled_bytes -= inc.nbytes
        inc.pulled, inc.buf = False, None
    _p2p_finish_recv(self, op, inc.error, inc.src)



cdef _p2p_push(P2PEngine self, int dst, _Incoming req):
    """A receiver asked for part of a CMA message we sent: write it into its buffer (under a
    lease on the exposure it named: a receive that failed meanwhile refuses it)."""
    cdef _SendOp op = self.acks_due.get(req.msg_id)
    cdef int err = 0
    cdef size_t n = req.nbytes
    if op is None:  # the send already failed here (timeout, abort): tell the receiver
        _p2p_send_control(self, dst, MSG_PUSHED, req.msg_id, 5)  # EIO
        return
    if req.tag < 0 or <size_t>req.tag > op.nbytes or n > op.nbytes - <size_t>req.tag \
            or (req.exposure >> 32) >= SHM_P2P_EXPOSURES:
        # read from the ring, so never trusted: only the message's own bytes are ever sent
        _p2p_send_control(self, dst, MSG_PUSHED, req.msg_id, 22)  # EINVAL
        return
    err = _p2p_copy(self, dst, op.ptr + req.tag, req.addr, n, True, req.exposure)
    _p2p_send_control(self, dst, MSG_PUSHED, req.msg_id, err)
    if err:
        del self.acks_due[req.msg_id]
        if err == ECANCELED:
            error = ShmcommError(f"send to rank {dst}: its receive failed (timed out or was "
                                 f"aborted) before this rank wrote its part; the message was not "
                                 f"delivered")
        else:  # ESRCH: the receiver died after it asked (a PeerFailureError, as every death is)
            error = os_failure(f"send to rank {dst}: writing into its buffer", err, dst,
                               self.comm.pids[dst])
        _p2p_end_send(self, op, error)



cdef object _p2p_read_from_sender(P2PEngine self, _Incoming inc, char *dst, size_t n):
    """Copy the first n bytes of a CMA message out of the sender's memory; an error or None."""
    cdef int err = 0
    if inc.src == self.comm.rank:
        memcpy(dst, <char *>inc.addr, n)
        return None
    if (inc.exposure >> 32) >= SHM_P2P_EXPOSURES:
        return ShmcommError(f"corrupt message header from rank {inc.src}")
    err = _p2p_copy(self, inc.src, dst, inc.addr, n, False, inc.exposure)
    if err == 0:
        return None
    if err == ECANCELED:
        return ShmcommError(f"recv from rank {inc.src}: its send failed (timed out or was aborted) "
                            f"and withdrew its buffer before this rank read it")
    return os_failure(f"recv from rank {inc.src}: reading its memory", err, inc.src,
                      self.comm.pids[inc.src])



cdef int _p2p_copy(P2PEngine self, int q, char *local, uint64_t remote, size_t n, bint write,
                   uint64_t exposure):
    """``_leased_copy`` of the buffer rank q exposed as ``exposure`` (slot << 32 | generation)."""
    cdef Communicator c = self.comm
    cdef int err
    with nogil:
        err = _leased_copy(c, q, local, remote, n, write, &c.cb(q).exposures[exposure >> 32],
                           <uint32_t>exposure)
    return err



cdef uint64_t _p2p_expose(P2PEngine self, int *slot):
    """Expose a buffer of this rank to a peer: take a free slot and move it to its next
    generation; returns the exposure (slot << 32 | generation), with ``slot[0]`` the slot (-1 when
    every slot is in use: the caller then does without single copy)."""
    cdef int i
    cdef uint32_t gen
    slot[0] = -1
    for i in range(SHM_P2P_EXPOSURES):
        if self.free_slots & (1u << i):
            self.free_slots &= ~(1u << i)
            gen = capi.shm_fetch_add(&self.comm.cb(self.comm.rank).exposures[i], 1) + 1
            slot[0] = i
            return (<uint64_t>i << 32) | gen
    return 0



cdef _p2p_unexpose(P2PEngine self, int slot, int peer, error):
    """End exposure ``slot``: its next generation voids the buffer for peers. With ``error`` (its
    operation failed): also wait until ``peer``'s copies under way have ended, so that nothing
    touches the buffer once the failure is reported (_await_leases: a stuck peer is killed)."""
    cdef Communicator c = self.comm
    cdef bint interrupted = isinstance(error, KeyboardInterrupt)
    capi.shm_fetch_add(&c.cb(c.rank).exposures[slot], 1)  # seq_cst: see Leases, engine.pxi
    if error is not None and peer != c.rank:
        with nogil:
            _await_leases(c, peer, interrupted)
    self.free_slots |= 1u << slot



cdef _p2p_end_send(P2PEngine self, _SendOp s, error):
    """Complete a send (error None) or fail it; a single-copy send's buffer exposure ends."""
    if s.slot >= 0:
        _p2p_unexpose(self, s.slot, s.dst, error)
        s.slot = -1
    _p2p_finish(self, s.future, error, None, -1)



cdef bytearray _p2p_drain(P2PEngine self):
    """Where the rest of a message whose receive failed mid-stream is read to (and dropped)."""
    global _drain_buffer
    if _drain_buffer is None:
        _drain_buffer = bytearray(64 << 10)
    return _drain_buffer


cdef object _drain_buffer = None



cdef _p2p_finish_recv(P2PEngine self, _RecvOp op, error, int source):
    """Complete a receive matched with a message from ``source``."""
    op.source = source
    _p2p_finish(self, op.future, error, op.work, source)



cdef _p2p_finish(P2PEngine self, future, error, work, int source):
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



cdef bint _p2p_pull_unexpected(P2PEngine self) except -1:
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
        if self.pulled_bytes + inc.nbytes > self.comm.unexpected_bytes:
            continue  # bounded: this one's sender waits for its receive (MPI's rendezvous)
        data = bytearray(inc.nbytes)
        inc.error = _p2p_read_from_sender(self, inc, <char *>data, inc.nbytes)
        inc.kind, inc.buf, inc.pulled = MSG_DATA, data, True  # a receive copies it out, as any buffered one
        self.pulled_bytes += inc.nbytes
        if inc.error is None:
            _p2p_send_control(self, inc.src, MSG_ACK, inc.msg_id)
        pulled = True
    return pulled



cdef _p2p_check_failures(P2PEngine self):
    """Fail operations whose peer is gone, or that ran past their deadline."""
    cdef Communicator c = self.comm
    cdef uint64_t now = capi.shm_now_ns()
    cdef _SendOp s
    cdef _RecvOp r
    if _group_aborted(c):
        _p2p_fail_all(self, _aborted(self.comm, "point to point"))
        return
    gone = [q != c.rank and _peer_gone(c, q) for q in range(c.size)]
    cdef _Incoming inc
    for q in range(c.size):
        while self.sendq[q]:
            s = self.sendq[q][0]
            if not gone[q] and now < s.deadline:
                break
            self.sendq[q].popleft()
            _p2p_end_send(self, s, _p2p_why(self, q, gone[q], "send to"))
    for msg_id, s in list(self.acks_due.items()):
        if gone[s.dst] or now >= s.deadline:
            del self.acks_due[msg_id]
            _p2p_end_send(self, s, _p2p_why(self, s.dst, gone[s.dst], "send to", True))
    for key, waiting in list(self.pushes_due.items()):
        r = waiting[0]
        if gone[key[0]] or now >= r.deadline:
            del self.pushes_due[key]
            error = _p2p_why(self, key[0], gone[key[0]], "recv from")
            _p2p_unexpose(self, waiting[2], key[0], error)
            _p2p_finish(self, r.future, error, None, -1)
    for q in range(c.size):  # receives whose message stopped streaming in part way
        inc = self.incoming[q]
        if inc is not None and inc.target is not None and not inc.dropped and not inc.complete \
                and (gone[q] or now >= inc.target.deadline):
            _p2p_drop(self, inc, _p2p_why(self, q, gone[q], "recv from"))
    everyone_gone = all(gone[q] for q in range(c.size) if q != c.rank)
    for r in list(self.posted):
        if now >= r.deadline or (gone[r.src] if r.src >= 0 else everyone_gone and c.size > 1):
            self.posted.remove(r)
            _p2p_finish(self, r.future, _p2p_why(self, r.src, now < r.deadline, "recv from"), None, -1)



cdef object _p2p_why(P2PEngine self, int q, bint gone, str what, bint unreceived=False):
    c = self.comm
    if gone:
        pid = c.pids[q] if q >= 0 else -1
        return peer_failure(f"{what} rank {q}", q, pid)
    if unreceived:  # a single-copy send whose receive never came
        return CommTimeoutError(
            f"{what} rank {q}: not received within {c.timeout} s (messages of SHMCOMM_CMA_BYTES "
            f"({c.cma_bytes}) and up wait for a matching receive, as MPI's rendezvous does; ones "
            f"no receive asked for are taken into buffers only up to SHMCOMM_UNEXPECTED_BYTES "
            f"({c.unexpected_bytes}) in all)")
    return CommTimeoutError(f"{what} rank {q}: no progress within {c.timeout} s")



cdef _p2p_drop(P2PEngine self, _Incoming inc, error):
    """Fail the receive a message was streaming into; the rest of it is read and dropped."""
    inc.dropped = True
    _p2p_finish(self, inc.target.future, error, None, -1)



cdef _p2p_fail_all(P2PEngine self, exc):
    cdef _SendOp s
    cdef _RecvOp r
    cdef _Incoming inc
    for q in range(self.comm.size):
        while self.sendq[q]:
            s = self.sendq[q].popleft()
            _p2p_end_send(self, s, exc)
    for r in self.posted:
        _p2p_finish(self, r.future, exc, None, -1)
    self.posted.clear()
    acks_due, self.acks_due = self.acks_due, {}
    for s in acks_due.values():
        _p2p_end_send(self, s, exc)
    pushes_due, self.pushes_due = self.pushes_due, {}
    for key, waiting in pushes_due.items():
        _p2p_unexpose(self, waiting[2], key[0], exc)
        _p2p_finish(self, (<_RecvOp>waiting[0]).future, exc, None, -1)
    for q in range(self.comm.size):
        inc = self.incoming[q]
        if inc is not None and inc.target is not None and not inc.dropped and not inc.complete:
            _p2p_drop(self, inc, exc)
    for inc in self.unexpected:
        if inc.target is not None and not inc.dropped:
            _p2p_finish(self, inc.target.future, exc, None, -1)
