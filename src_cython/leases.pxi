# Buffers kept across calls, and leases: every copy into or out of a peer's memory (single copy,
# zero copy) holds a lease on that peer, and a rank whose op failed withdraws its memory and waits
# for the leases on it to end (engine.pxi's header says why this is safe). Free functions of
# Communicator.
from cpython.exc cimport PyErr_Fetch, PyErr_Restore
from cpython.ref cimport Py_XDECREF, Py_XINCREF
cdef char *_grown(char **buf, size_t *cap, size_t nbytes, const char *what) except NULL nogil:
    """``*buf`` with room for at least ``nbytes`` (kept across calls: grown, never shrunk)."""
    cdef char *grown
    if nbytes > cap[0]:
        grown = <char *>realloc(buf[0], nbytes)
        if grown == NULL:
            with gil:
                raise MemoryError(f"no memory for a {nbytes}-byte {what.decode()} buffer")
        buf[0], cap[0] = grown, nbytes
    return buf[0]


cdef extern from "<errno.h>":
    int ECANCELED  # (not in Cython's libc.errno): a copy refused because its buffer was withdrawn

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



# Copies into or out of a peer's memory run in chunks of at most this many bytes, each under a
# lease of its own: a live copier sees a withdrawal within one chunk (~0.5 ms at memory speed,
# the chunk's share of a throttled CPU otherwise) and stops, so a withdrawing rank never waits
# for a whole large copy, and a rank that is merely slow is never taken for a stuck one.
cdef size_t LEASE_CHUNK = 4 << 20



cdef int _lease(Communicator self, int q) except -1 nogil:
    """Take a lease covering rank q's memory (q < 0: every peer's) for the copy about to run;
    ``_unlease`` ends it. Raises if one of them withdrew (see Leases at the top)."""
    cdef int r = _try_lease(self, q, NULL, 0)
    if r >= 0:
        with gil:
            raise _withdrawn(self, r)
    return 0



cdef object _withdrawn(Communicator self, int r):
    return _fail(self, peer_failure(_name(self), r, self.pids[r],
                                    "failed this operation and withdrew its buffers"))



cdef int _try_lease(Communicator self, int q, const uint32_t *exposure, uint32_t gen) noexcept nogil:
    """The lease of ``_lease``, or of a point-to-point copy of the buffer rank q exposed in word
    ``exposure`` of its control block at generation ``gen``: -1 taken, else the rank that
    withdrew (nothing taken). The loads are seq_cst (see Leases at the top of engine.pxi); an
    exposure is withdrawn once its word moved past ``gen``, whatever q's other buffers do."""
    cdef int r, first = 0 if q < 0 else q, last = self.size if q < 0 else q + 1
    capi.shm_fetch_add(&self.cb(self.rank).leases, 1)
    if exposure != NULL:
        if capi.shm_load_seq_cst(exposure) == gen:
            return -1
        r = q
    else:
        for r in range(first, last):
            if r != self.rank and capi.shm_load_seq_cst(&self.cb(r).withdrawn):
                break
        else:
            return -1
    capi.shm_fetch_sub(&self.cb(self.rank).leases, 1)
    return r



cdef int _leased_copy(Communicator self, int q, char *local, uint64_t remote, size_t n, bint write,
                      const uint32_t *exposure, uint32_t gen) noexcept nogil:
    """Copy n bytes between ``local`` and address ``remote`` of rank q (write: to rank q), chunk
    by chunk, each under a lease (``_try_lease``: on q's memory, or on the buffer q exposed
    as ``exposure`` at ``gen``). 0, ECANCELED once q withdrew it, or the copy's errno."""
    cdef int err = 0
    cdef size_t m
    while n and not err:
        m = min(n, LEASE_CHUNK)
        if _try_lease(self, q, exposure, gen) >= 0:
            return ECANCELED
        err = capi.shm_cma_write(self.pids[q], local, remote, m) if write else \
            capi.shm_cma_read(self.pids[q], local, remote, m)
        self._unlease()
        local += m
        remote += m
        n -= m
    return err



cdef int _cma(Communicator self, int q, char *local, uint64_t remote, size_t n, bint write) except -1 nogil:
    """Copy n bytes between ``local`` and address ``remote`` of rank q (write: to rank q) under
    leases on q's memory (``_leased_copy``)."""
    cdef int err = _leased_copy(self, q, local, remote, n, write, NULL, 0)
    if err:
        with gil:
            if err == ECANCELED:
                raise _withdrawn(self, q)
            raise _fail(self, os_failure(f"{_name(self)}: {'writing' if write else 'reading'} "
                                        f"rank {q}'s memory", err, q, self.pids[q]))
    return 0



cdef void _withdraw(Communicator self, bint interrupted=False) noexcept nogil:
    """After a failed op that exposed this rank's memory: no peer may touch it from now on.
    Wait until every live peer's copies under way have ended (``_await_leases``; ``interrupted``:
    the op failed on Ctrl-C, whose user is not kept waiting for a stuck peer)."""
    cdef int q
    capi.shm_store_seq_cst(&self.cb(self.rank).withdrawn, 1)
    for q in range(self.size):
        if q != self.rank:
            _await_leases(self, q, interrupted)



# A withdrawal interrupted by Ctrl-C gives a peer that copies nothing this long, not the timeout.
cdef uint64_t STUCK_AFTER_SIGNAL_NS = 500 * 1000 * 1000

# A holder that keeps running (CPU time) but ends no lease for this many graces is stuck all the
# same: one chunk is a bounded copy, and no wait may last forever.
cdef uint64_t RUNNING_GRACES = 10


cdef void _await_leases(Communicator self, int q, bint interrupted=False) noexcept nogil:
    """Wait until rank q holds no lease (the copies it has under way ended) or is dead; called
    after this rank withdrew (so q takes no new lease on its memory). A live q ends its lease
    within one chunk (LEASE_CHUNK). One that for the whole grace (the timeout) neither ends a
    lease nor runs at all (its CPU time stands still: SIGSTOP, a debugger, a frozen cgroup) is
    killed (_end_stuck_peer), so that it cannot write into memory the caller reuses: the policy
    of NCCL's watchdog, which also tears a stuck process down. One that runs, however slowly (a
    container's CPU quota, a fresh VM's page faults), is waited for, up to RUNNING_GRACES graces
    without a lease ended. A Ctrl-C (``interrupted``: what failed the op; or arriving meanwhile)
    cuts the grace to STUCK_AFTER_SIGNAL_NS."""
    cdef capi.shm_cb_t *peer = self.cb(q)
    cdef uint32_t progress = capi.shm_load_seq_cst(&peer.lease_progress), now_progress
    cdef uint64_t now = capi.shm_now_ns(), checked = 0, cpu = capi.shm_process_cpu_ns(self.pids[q])
    cdef uint64_t quiet_since = now, progress_since = now, grace = capi.shm_span_ns(self.timeout)
    cdef uint64_t now_cpu, running_limit
    if interrupted:
        grace = min(grace, STUCK_AFTER_SIGNAL_NS)
    while capi.shm_load_seq_cst(&peer.leases) != 0 and not _peer_dead(self, q):
        now = capi.shm_now_ns()
        now_progress = capi.shm_load_seq_cst(&peer.lease_progress)
        if now_progress != progress:
            progress, quiet_since, progress_since = now_progress, now, now
        elif now - quiet_since > grace:
            now_cpu = capi.shm_process_cpu_ns(self.pids[q])
            running_limit = grace * RUNNING_GRACES if grace < UINT64_MAX // RUNNING_GRACES else UINT64_MAX
            if now_cpu == UINT64_MAX or now_cpu <= cpu or now - progress_since > running_limit:
                _end_stuck_peer(self, q, now - progress_since, now - progress_since > running_limit)
                return
            cpu, quiet_since = now_cpu, now  # it ran: slow, not stopped
        if now - checked > SLICE_NS:
            checked = now
            if _signal_arrived():
                grace = min(grace, STUCK_AFTER_SIGNAL_NS)
        usleep(100)




cdef bint _signal_arrived() noexcept nogil:
    """Whether a Python signal handler raised (Ctrl-C) while a withdrawal waits; the error
    being raised is kept, the signal's own is dropped (it already interrupts the caller)."""
    cdef bint arrived
    with gil:
        saved = _stash_error()
        arrived = PyErr_CheckSignals() != 0
        _restore_error(saved)
    return arrived



cdef void _end_stuck_peer(Communicator self, int q, uint64_t quiet_ns, bint ran) noexcept nogil:
    """Kill rank q, which has held a lease on this rank's memory without ending it for
    ``quiet_ns`` after this rank withdrew it (``ran``: though it kept running), and wait
    (bounded) until it is gone: only then can it no longer write here. Said on both ranks'
    stderr (the killed one's through /proc/PID/fd/2: a killed process cannot say why itself).
    Never a recycled pid: by pidfd, or by pid only while that pid still has the start time the
    rank registered with."""
    cdef uint64_t give_up = capi.shm_now_ns() + 5 * 1000 * 1000 * 1000ULL
    cdef bint same_process = True
    with gil:
        saved = _stash_error()  # the operation's error, being raised: writing must not lose it
        try:
            text = (f"shmcomm: rank {self.rank} (pid {getpid()}) of group {self.job}.{self.part} "
                    f"killed rank {q} (pid {self.pids[q]}): after rank {self.rank}'s operation "
                    f"failed, rank {q} held a lease on its memory (a copy in or out of it) and made "
                    f"no progress for {quiet_ns / 1e9:.1f} s " +
                    (f"while it ran ({RUNNING_GRACES} times the grace: one chunk's copy takes far "
                     f"less)" if ran else "(the group's timeout) and did not run for as long "
                     f"(stopped or frozen?)") +
                    "; killed so that it cannot write into memory the caller reuses\n")
            _tell_stderr(None, text)
            _tell_stderr(self.pids[q], text)
            if self.pidfds[q] < 0:
                from shmcomm.trust import process_identity
                ident = process_identity(self.pids[q])
                same_process = ident is not None and ident[1] == self.cb(q).start_time
        finally:
            _restore_error(saved)
    if not same_process:
        return  # q's pid is gone or names another process now: q itself writes nothing more
    capi.shm_pidfd_kill(self.pidfds[q], self.pids[q], SIGKILL)
    while not _peer_dead(self, q) and capi.shm_now_ns() < give_up:
        usleep(1000)



cdef _tell_stderr(object pid, str text):
    """Best effort: ``text`` on this process's stderr (pid None) or on process pid's."""
    try:
        if pid is None:
            sys.stderr.write(text)
            sys.stderr.flush()
        else:
            with open(f"/proc/{pid}/fd/2", "a") as f:
                f.write(text)
    except Exception:  # noqa: BLE001 - a closed or unwritable stderr must not stop the kill
        pass



cdef tuple _stash_error():
    """Take the pending Python error (if any) out of the way of Python code to run; give it
    back with ``_restore_error``."""
    cdef PyObject *t = NULL
    cdef PyObject *v = NULL
    cdef PyObject *tb = NULL
    PyErr_Fetch(&t, &v, &tb)
    if t == NULL:
        return None
    # PyErr_Fetch handed over its references: the tuple takes them
    saved = (<object>t, <object>v if v != NULL else None, <object>tb if tb != NULL else None)
    Py_XDECREF(t)
    Py_XDECREF(v)
    Py_XDECREF(tb)
    return saved



cdef void _restore_error(tuple saved):
    cdef PyObject *parts[3]
    if saved is None:
        return
    for i in range(3):
        parts[i] = NULL if saved[i] is None else <PyObject *>saved[i]
        Py_XINCREF(parts[i])  # PyErr_Restore takes these references
    PyErr_Restore(parts[0], parts[1], parts[2])

