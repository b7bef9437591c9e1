# Buffers kept across calls, and leases: every copy into or out of a peer's memory (single copy,
# zero copy) holds a lease on that peer, and a rank whose op failed withdraws its memory and waits
# for the leases on it to end (engine.pxi's header says why this is safe). Free functions of
# Communicator.

cdef char *_scratch(Communicator self, size_t nbytes) except NULL nogil:
    return _grown(&self.scratch, &self.scratch_bytes, nbytes, "scratch")



cdef char *_staging(Communicator self, size_t nbytes) except NULL nogil:
    return _grown(&self.staging, &self.staging_bytes, nbytes, "staging")



# ---- single copy: peers read each other's arrays in place ----------------------------------
# For large pieces every rank publishes a table of its array addresses with the descriptor;
# if every rank can read every other's memory (cross-memory attach), each pulls what it needs
# straight into its output, and a last step keeps the sources untouched until all are done.
cdef bint _publish_table(Communicator self, char **table, int ntable, bint usable=True) except -1 nogil:
    """One step carrying the descriptor and [cma_ok, table...]; True if single copy is on
    (every rank can read peers' memory and passed ``usable``)."""
    cdef uint32_t s = self.next_step()
    cdef uint64_t *mine = <uint64_t *>self.slot(self.rank, s)
    cdef int i, q
    mine[0] = self.cma_ok and usable
    for i in range(ntable):
        mine[1 + i] = <uint64_t>table[i] if table != NULL else 0
    self.published = True  # from here a failure must withdraw these addresses
    _step(self)
    _check_desc(self)
    for q in range(self.size):
        if not (<uint64_t *>self.slot(q, s))[0]:
            return False
    return True



cdef int _lease(Communicator self, int q) except -1 nogil:
    """Take a lease covering rank q's memory (q < 0: every peer's) for the copy about to run;
    ``_unlease`` ends it. Raises if one of them withdrew (see Leases at the top)."""
    cdef capi.shm_cb_t *me = self.cb(self.rank)
    cdef int r, first = 0 if q < 0 else q, last = self.size if q < 0 else q + 1
    capi.shm_fetch_add(&me.leases, 1)
    for r in range(first, last):
        if r != self.rank and capi.shm_load_seq_cst(&self.cb(r).withdrawn):
            capi.shm_fetch_sub(&me.leases, 1)
            with gil:
                raise _fail(self, peer_failure(_name(self), r, self.pids[r],
                                              "failed this operation and withdrew its buffers"))
    return 0



cdef int _cma(Communicator self, int q, char *local, uint64_t remote, size_t n, bint write) except -1 nogil:
    """Copy n bytes between ``local`` and address ``remote`` of rank q (write: to rank q),
    under a lease on q's memory."""
    cdef int err
    if n == 0:
        return 0
    _lease(self, q)
    if write:
        err = capi.shm_cma_write(self.pids[q], local, remote, n)
    else:
        err = capi.shm_cma_read(self.pids[q], local, remote, n)
    self._unlease()
    if err:
        with gil:
            raise _fail(self, os_failure(f"{_name(self)}: {'writing' if write else 'reading'} rank "
                                        f"{q}'s memory", err, q, self.pids[q]))
    return 0



cdef void _withdraw(Communicator self) noexcept nogil:
    """After a failed op that exposed this rank's memory: no peer may touch it from now on.
    Wait until every live peer's copies under way have ended (a dead peer copies nothing);
    a peer still holding a lease after the group's timeout is stopped (SIGSTOP, a debugger)
    and is killed, so that it cannot write into memory the caller reuses."""
    cdef capi.shm_cb_t *me = self.cb(self.rank)
    cdef uint64_t give_up = capi.shm_deadline_after(self.timeout)
    cdef int q
    capi.shm_store_seq_cst(&me.withdrawn, 1)
    for q in range(self.size):
        if q == self.rank:
            continue
        while capi.shm_load_seq_cst(&self.cb(q).leases) != 0 and not _peer_dead(self, q):
            if capi.shm_now_ns() > give_up:
                _end_stuck_peer(self, q)
                break
            usleep(100)



cdef void _end_stuck_peer(Communicator self, int q) noexcept nogil:
    """Kill rank q, which has held a lease on this rank's memory for the whole timeout, and
    wait (bounded) until it is gone: only then can it no longer write here."""
    cdef uint64_t give_up = capi.shm_now_ns() + 5 * 1000 * 1000 * 1000ULL
    with gil:
        sys.stderr.write(f"shmcomm: rank {self.rank}: rank {q} (pid {self.pids[q]}) has been "
                         f"copying into this rank's memory for more than {self.timeout} s after "
                         f"the operation failed (stopped?); killing it so it cannot write into "
                         f"reused memory\n")
    capi.shm_pidfd_kill(self.pidfds[q], self.pids[q], SIGKILL)
    while not _peer_dead(self, q) and capi.shm_now_ns() < give_up:
        usleep(1000)
