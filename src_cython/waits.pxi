# Steps, waits and health: the one place a rank waits for its peers (spin adaptively, yield, then
# sleep on the futex in slices), checks their health between slices (dead, stopped, aborted,
# timed out), begins an op, publishes a step and compares the descriptors every rank published
# with it. Free functions of Communicator (engine.pxi holds its fields).

# ---- health: the one check collectives, point to point and RPC make -------------------------
cdef bint _peer_dead(Communicator self, int r) noexcept nogil:
    """Rank r's process has exited (pidfd, else kill(pid, 0)); it writes nothing any more."""
    if self.pidfds[r] >= 0:
        return capi.shm_pidfd_exited(self.pidfds[r])
    return kill(self.pids[r], 0) != 0 and errno == ESRCH


cdef bint _peer_gone(Communicator self, int r) noexcept nogil:
    """Rank r left the group (destroyed it) or died: nothing it owes this rank will come."""
    return capi.shm_load_acquire(&self.cb(r).state) == SHM_RANK_DEPARTED or _peer_dead(self, r)


cdef bint _group_aborted(Communicator self) noexcept nogil:
    """Some rank aborted the group (Communicator.abort); every operation on it fails."""
    return self.hdr != NULL and capi.shm_load_acquire(&self.hdr.abort_flag) != 0



cdef object _fail(Communicator self, object exc):
    """Remember why the group broke (a step was left half done) and return the error."""
    self.broken = exc
    return exc


cdef object _unusable(Communicator self, str op):
    """The error of a call on a group that an earlier failure left half done, the cause chained:
    a PeerFailureError where the cause was a peer's failure (code that catches PeerFailureError
    must see every call after a death as one, whichever call or thread met the death first),
    else a ShmcommError."""
    cause = self.broken
    text = f"{op}: the group is unusable after an earlier failure: {cause}"
    exc = (PeerFailureError(text, cause.rank, cause.pid) if isinstance(cause, PeerFailureError)
           else ShmcommError(text))
    exc.__cause__ = cause
    return exc



cdef str _name(Communicator self):
    return (<bytes>self.op_name).decode()



cdef int _check_health(Communicator self, int peer, uint32_t target) except -1 nogil:
    """Raise if the group is aborted, a peer we wait for is gone, the deadline passed, or a
    Python signal handler raised. peer < 0: every peer whose seq is behind `target`."""
    cdef int r, first, last
    if _group_aborted(self):
        with gil:
            raise _fail(self, _aborted(self, _name(self)))
    if peer < 0:
        first, last = 0, self.size
    else:
        first, last = peer, peer + 1
    for r in range(first, last):
        if r == self.rank:
            continue
        if peer < 0 and capi.shm_seq_geq(capi.shm_load_acquire(&self.cb(r).seq), target):
            continue
        if _peer_gone(self, r):
            with gil:
                raise _fail(self, peer_failure(_name(self), r, self.pids[r]))
    if capi.shm_now_ns() > self.deadline_ns:
        with gil:
            # each late rank with the step it reached: a rank far behind is stuck
            # elsewhere (another collective, or computing), one step behind is just late
            late = [(r, <uint32_t>(capi.shm_load_acquire(&self.cb(r).seq) - FIRST_STEP))
                    for r in range(self.size)
                    if r != self.rank and
                    not capi.shm_seq_geq(capi.shm_load_acquire(&self.cb(r).seq), target)]
            where = ", ".join(f"rank {r} at step {seq}" for r, seq in late) or "none"
            raise _fail(self, CommTimeoutError(
                f"{_name(self)} timed out after {self.timeout} s on rank {self.rank} "
                f"waiting for {'rank %d' % peer if peer >= 0 else 'its peers'} at step "
                f"{<uint32_t>(target - FIRST_STEP)}; not arrived: {where}"))
    with gil:
        try:
            PyErr_CheckSignals()
        except BaseException as exc:
            _fail(self, ShmcommError(f"{_name(self)} interrupted: {exc!r}"))
            raise
    return 0



cdef uint32_t _note_cpu(Communicator self) noexcept nogil:
    """1 + the CPU this thread runs on (0: unknown), published in this rank's block when it
    changed, for peers' `_peer_shares_core`."""
    cdef int cpu = capi.sched_getcpu()
    cdef uint32_t here = <uint32_t>(cpu + 1) if cpu >= 0 else 0
    if here != self.cpu_here:
        self.cpu_here = here
        capi.shm_store_release(&self.cb(self.rank).cpu, here)
    return here


cdef bint _peer_shares_core(Communicator self, int peer) noexcept nogil:
    """Whether `peer` last waited on the CPU this thread runs on: the scheduler may keep two
    ranks on one core while busy processes hold the others, and then a spinning waiter only
    delays the peer it waits for."""
    cdef uint32_t here = _note_cpu(self)
    return here != 0 and capi.shm_load_acquire(&self.cb(peer).cpu) == here



cdef void _part_from(Communicator self, int peer) noexcept nogil:
    """After a wait found `peer` on this rank's core. Many such waits in a row are the
    scheduler's doing, not a moment's: it can keep two ranks on one core for good while busy
    processes hold the others, and each step then costs a context switch (bench_latency_floor:
    window medians of 5-27 us, against 0.4 us on two cores). The higher rank of the two moves
    to another core it may use (shm_move_off_cpu), at most once per MOVE_GAP_NS."""
    cdef uint64_t now
    self.shared_waits += 1
    if self.shared_waits < SHARED_WAITS_TO_MOVE or self.rank < peer:
        return
    now = capi.shm_now_ns()
    if now - self.moved_ns < MOVE_GAP_NS:
        return
    self.moved_ns, self.shared_waits = now, 0
    if capi.shm_move_off_cpu(<int>self.cpu_here - 1):
        _note_cpu(self)



cdef inline uint64_t _adapted_spin(uint64_t budget, uint64_t most, int got, uint64_t waited) noexcept nogil:
    """The spin budget after a wait that spun for ``budget`` ns and took ``waited`` ns in all
    (``got``: shm_wait_step's answer). A wait that ended while spinning, or soon after (within
    WAKE_GRACE_NS: the peer was only being woken), says peers answer within reach of the budget:
    double it. One that waited longer says the budget only burnt a core somebody else needed (a
    loaded machine): halve it, down to a floor. Counting the woken peers as failures too could
    hold every rank of a large group at the floor, each sleeping through every step. A peer on
    the waiter's own core must get no spinning at all (_wait's shared-core check): there a
    regrown budget only delays it (bench_latency_floor once gave window medians of 16-27 us
    so; with the check, 0.6 us under 2-3 busy processes, with this rule as with halving)."""
    if got == 1 or (got == 2 and waited <= budget + WAKE_GRACE_NS):
        return min(most, 2 * budget)
    return max(min(SPIN_FLOOR_NS, most), budget // 2)


def _next_spin_budget(budget_ns, most_ns, got, waited_ns):
    """``_adapted_spin`` for tests: the budget (ns) after one wait.

    Example::

        >>> _next_spin_budget(20_000, 2_000_000, 2, 90_000)  # woken 70 us after the budget
        40000
    """
    return _adapted_spin(budget_ns, most_ns, got, waited_ns)



cdef int _wait(Communicator self, int peer, uint32_t target) except -1 nogil:
    # For `peer` to reach step `target` (its core is the one checked); the health check still
    # covers every peer behind `target`: the one waited for may be waiting on a dead one. On
    # the progress thread with nobody waiting, the caller is computing: sleep soon and leave it
    # the core.
    cdef capi.shm_cb_t *c = self.cb(peer)
    cdef uint64_t *tag = &c.desc[target & 1][D_KIND]
    cdef uint64_t spin = self.spin_ns, start = 0
    if self.background and capi.shm_load_acquire(&self.engine.drivers) == 0:
        spin = 0
    elif spin:
        if _peer_shares_core(self, peer):
            spin = 0  # it can only run once this thread stops: no spinning, straight to yielding
            _part_from(self, peer)
        else:
            self.shared_waits = 0
    if spin:
        start = capi.shm_now_ns()
    cdef int got = capi.shm_wait_step(tag, &c.seq, target, &c.seq_waiters, spin, self.yields, SLICE_NS)
    if spin:  # a peer on this very core gets no spinning and no adaptation (above)
        self.spin_ns = _adapted_spin(spin, self.spin_max_ns, got, capi.shm_now_ns() - start)
    if got:
        return 0
    while True:
        _check_health(self, -1, target)
        if capi.shm_wait_step(tag, &c.seq, target, &c.seq_waiters, 0, 0, SLICE_NS):
            return 0



cdef int _begin(Communicator self, const char *op_name) except -1 nogil:
    if self.closed:
        with gil:
            raise ShmcommError(f"{op_name.decode()}: the process group was destroyed")
    if _group_aborted(self):
        with gil:
            raise _aborted(self, op_name.decode())
    if self.broken is not None:  # read without the GIL: set once, never cleared
        with gil:
            raise _unusable(self, op_name.decode())
    self.op_name = op_name
    self.calls_begun += 1
    self.deadline_ns = capi.shm_deadline_after(self.timeout)
    self.published = False
    return 0



cdef int _step(Communicator self) except -1 nogil:
    # Arrival goes out twice: tagged onto the descriptor line, where peers look for it (one
    # cache line per peer brings arrival and descriptor: a barrier at 2 ranks took 0.50-0.57 us
    # reading the two lines, 0.45 without the second), then in `seq`, for sleepers and health
    # checks.
    cdef uint32_t s = self.step + 1
    cdef int i, q
    cdef capi.shm_cb_t *c = self.cb(self.rank)
    self.step = s
    capi.shm_tag_step(&c.desc[s & 1][D_KIND], s)
    capi.shm_publish(&c.seq, s, &c.seq_waiters)
    for i in range(1, self.size):
        q = (self.rank + i) % self.size
        if not capi.shm_step_reached(&self.cb(q).desc[s & 1][D_KIND], s):
            _wait(self, q, s)
    return 0



cdef void _set_desc(Communicator self, uint64_t kind, uint64_t dtype, uint64_t nbytes, uint64_t root,
                    uint64_t op) noexcept nogil:
    cdef uint64_t *d = self.cb(self.rank).desc[(self.step + 1) & 1]
    d[D_KIND] = capi.shm_desc_word0(<uint32_t>kind, capi.shm_desc_step(d[D_KIND]))  # keeps the tag
    d[D_DTYPE] = dtype; d[D_NBYTES] = nbytes; d[D_ROOT] = root; d[D_OP] = op



cdef int _check_desc(Communicator self) except -1 nogil:
    cdef uint64_t *mine = self.cb(self.rank).desc[self.step & 1]
    cdef uint64_t *theirs
    cdef int q, w
    for q in range(self.size):
        theirs = self.cb(q).desc[self.step & 1]
        for w in range(5):
            if theirs[w] != mine[w]:
                # every rank compares the same descriptors and fails here: none will copy,
                # so what this step exposed needs no withdrawal (the group stays usable)
                self.published = False
                with gil:
                    raise CollectiveMismatchError(_mismatch_text(self))
    return 0



cdef str _mismatch_text(Communicator self):
    lines = [f"rank {q}: {describe_call(self.cb(q).desc[self.step & 1])}" for q in range(self.size)]
    return (f"ranks called different collectives or arguments, at collective {self.calls_begun} of "
            f"this rank on this group (each rank counts its own: one whose count differs in its "
            f"message skipped or added a call before this one):\n  " + "\n  ".join(lines))



cdef int _check_process(Communicator self) except -1:
    """Refuse a call from a child forked from this rank's process: it would act as the
    parent's rank, and its peers would get wrong data or none."""
    if _this_pid != self.owner_pid:
        raise ShmcommError(
            f"process group {self.job}.{self.part} belongs to process {self.owner_pid} (rank "
            f"{self.rank}); this process ({_this_pid}) is a child forked from it and cannot use "
            f"it: join a group of its own in the child (init_process_group), or start children "
            f"with multiprocessing's 'spawn' or 'forkserver' method")
    return 0



cdef object _aborted(Communicator self, str what):
    """The error of an operation on an aborted group: ``<what>: the group was aborted``, with
    who did it and why when the first to abort said. A PeerFailureError naming the dead process
    (its rank here, or -1 where it is not a member) when that abort's cause was a peer's death
    (``Communicator.abort``'s ``cause``), else an AbortedError. The one home of both."""
    cdef int pid = 0
    text = "the group was aborted"
    if self.hdr != NULL and self.hdr.abort_rank >= 0:
        reason = (<bytes>(<char *>self.hdr.abort_reason)).decode(errors="replace")
        text = f"the group was aborted by rank {self.hdr.abort_rank}: {reason}"
        pid = self.hdr.abort_peer_pid
    text = f"{what}: {text}"
    if pid == 0:
        return AbortedError(text)
    return PeerFailureError(text, self.rank_of_pid(pid) if pid > 0 else -1, pid)
