# Joining a group: the first rank creates the group's segment, the others attach and check it is
# this job's (tag, nonce, the creator alive), every rank registers (pid, start time, pidfd) and
# probes whether it can read peers' memory directly (cross-memory attach), then all wait until
# every rank is there. Free functions of Communicator (engine.pxi holds its fields).

# ---- rendezvous ---------------------------------------------------------------------------
def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


cdef _rendezvous(Communicator self, size_t slot_bytes, size_t ring_bytes, size_t cma_bytes):
    from shmcomm.segments import segment_name
    name = segment_name(self.job, self.part)
    deadline = time.monotonic() + self.timeout
    host, boot = socket.gethostname(), _boot_id()
    # on every rank, so that settings that cannot fit fail each at once, not only rank 0
    cdef size_t total = _layout(self, slot_bytes, ring_bytes)
    if self.rank == 0:
        try:
            _create(self, name, host, boot, total, cma_bytes)
        except BaseException as exc:
            if self.watch is not None:  # a derived group's members wait for the segment: tell them
                self.watch.not_made(exc)
            raise
    else:
        _attach(self, name, deadline, host, boot)
    _register(self)
    try:
        _wait_all_attached(self, deadline)
    except BaseException:
        self.cb(self.rank).state = SHM_RANK_DEPARTED
        self.seg.unlink_name()
        raise
    # The last rank to join removes the name (_register); one killed between counting itself
    # and removing it would leave it in /dev/shm for good, and that rank may be rank 0 (a peer
    # can attach and count itself before the creator does). Every rank makes sure, by nonce:
    # never a later segment of the same name. (Usually the name is gone: one failed open.)
    _unlink_name_if_nonce(name, _GROUP_NONCE_AT, self.hdr.nonce)
    for r in range(self.size):
        self.pids[r] = self.cb(r).pid
        if r != self.rank:
            self.pidfds[r] = capi.shm_pidfd_open(self.pids[r])
            _verify_peer(self, r)
    # Algorithm choices depend on these, so every rank takes rank 0's values.
    self.small_bytes = self.hdr.small_bytes
    self.cma_bytes = self.hdr.cma_bytes
    self.cma_ok = self.cma_bytes > 0 and _probe_cma(self)
    capi.shm_store_seq_cst(&self.cb(self.rank).cma_ok, self.cma_ok)  # senders of p2p look



cdef _create(Communicator self, str name, str host, str boot, size_t total, size_t cma_bytes):
    """Rank 0: make the segment of ``total`` bytes (laid out: _layout), write its header, then
    give it its name."""
    self.seg = Segment.create(
        name, total, f"the group's segment ({self.size} ranks: two slots of "
        f"{mib(self.slot_bytes)} each and a ring of {mib(self.ring_bytes)} per pair of ranks)",
        f"{SHM_SPACE_HINT}; or lower SHMCOMM_SLOT_BYTES / SHMCOMM_RING_BYTES")
    self.base = self.seg.base
    self.hdr = <capi.shm_header_t *>self.base
    self.hdr.version = SHM_VERSION
    self.hdr.world_size = self.size
    self.hdr.layout_size = total
    self.hdr.slot_bytes = self.slot_bytes
    self.hdr.ring_bytes = self.ring_bytes
    self.hdr.creator_pid = getpid()
    self.hdr.small_bytes = self.small_bytes
    self.hdr.cma_bytes = cma_bytes
    self.hdr.nonce = int.from_bytes(os.urandom(8), "little")
    self.hdr.name_salt = int.from_bytes(os.urandom(8), "little")
    self.hdr.abort_rank = -1
    _copy_text(self.hdr.job, self.job, 127)
    _copy_text(self.hdr.boot_id, boot, 63)
    _copy_text(self.hdr.hostname, host, 63)
    tag = self.creds.tag(self.job, self.part)
    memcpy(self.hdr.tag, <char *>tag, 32)
    self.hdr.self_made = self.creds.self_made
    capi.shm_store_release64(&self.hdr.magic, SHM_MAGIC)
    while True:  # the header is complete: now ranks may find it by name
        try:
            self.seg.publish()
            break
        except FileExistsError:
            _remove_stale(self, name)



cdef class _Derivation:
    """A group made through another (``Communicator.derive``), as its start-up sees that parent.
    The members waiting for rank 0's segment check (``check``) that no member died and that
    rank 0 did not fail to make it; rank 0 tells why it failed (``not_made``) in its own control
    block of the parent, where they look: they raise its cause at once, not a timeout that asks
    whether rank 0 is running."""
    cdef Communicator parent
    cdef list members
    cdef uint64_t code  # the group's, from its part (name): never 0

    def __init__(self, Communicator parent, list members, str part):
        import zlib
        self.parent, self.members = parent, members
        self.code = (<uint64_t>zlib.crc32(part.encode()) << 1) | 1

    def check(self):
        """Raise PeerFailureError if a member died, ShmcommError if rank 0 failed to make the
        segment (with its error's words)."""
        self.parent.check_alive(self.members)
        cdef capi.shm_cb_t *c = self.parent.cb(self.members[0])
        if capi.shm_load_acquire64(&c.not_made) != self.code:
            return
        why = (<bytes>c.not_made_why).decode(errors="replace")
        if capi.shm_load_acquire64(&c.not_made) != self.code:
            return  # rank 0 wrote another group's failure meanwhile: not ours
        raise ShmcommError(
            f"rank 0 of the new group (rank {self.members[0]} of the group it is made from) "
            f"could not create the new group's shared segment: {why}")

    def not_made(self, exc):
        """Rank 0: tell the members waiting for the segment that it will not come, and why."""
        cdef capi.shm_cb_t *c = self.parent.cb(self.parent.rank)
        capi.shm_store_release64(&c.not_made, 0)  # (readers skip a text being rewritten)
        _copy_text(c.not_made_why, f"{type(exc).__name__}: {exc}", 231)
        capi.shm_store_release64(&c.not_made, self.code)



cdef _verify_peer(Communicator self, int r):
    """Rank r's pid, read from the segment, must name the process that registered: same
    user, same start time (checked after the pidfd is open, so the pid cannot be recycled
    under us). Cross-memory copies only ever target these pids."""
    from shmcomm.trust import process_identity
    ident = process_identity(self.pids[r])
    if ident is None and not _pid_alive(self.pids[r]):  # it joined, then died
        self.cb(self.rank).state = SHM_RANK_DEPARTED
        raise peer_failure("init_process_group", r, self.pids[r], "died during start-up")
    if ident is None or ident[0] != os.geteuid() or ident[1] != self.cb(r).start_time:
        self.cb(self.rank).state = SHM_RANK_DEPARTED
        raise ShmcommError(
            f"init_process_group: rank {r} registered pid {self.pids[r]}, but that is not the "
            f"process that joined job {self.job!r} (" +
            ("it does not exist" if ident is None else
             f"uid {ident[0]}, start time {ident[1]}; expected uid {os.geteuid()}, start time "
             f"{self.cb(r).start_time}") + ")")



cdef bint _probe_cma(Communicator self):
    """Can this rank read every peer's memory directly (same user, no ptrace restriction)?"""
    cdef int32_t seen
    for r in range(self.size):
        if r != self.rank:
            seen = 0
            if capi.shm_cma_read(self.pids[r], &seen, self.cb(r).probe_addr, sizeof(seen)) != 0 \
                    or seen != self.pids[r]:
                return False
    return True



cdef _attach(Communicator self, str name, double deadline, str host, str boot):
    cdef Segment seg
    delay = 0.0005
    while True:
        seg = Segment.attach(name)
        if seg is not None and seg.size >= SHM_HEADER_BYTES:
            hdr = <capi.shm_header_t *>seg.base
            if capi.shm_load_acquire64(&hdr.magic) == SHM_MAGIC and _pid_alive(hdr.creator_pid):
                if hdr.version != SHM_VERSION:
                    raise ShmcommError(f"segment {name} has layout version {hdr.version}, this "
                                       f"shmcomm uses {SHM_VERSION}: mixed shmcomm versions?")
                if not self.creds.accepts((<char *>hdr.tag)[:32], hdr.self_made, self.job, self.part):
                    from shmcomm.trust import foreign_job_error
                    raise foreign_job_error("/dev/shm" + name, self.job, hdr.creator_pid)
                if hdr.world_size != <uint32_t>self.size:
                    raise ShmcommError(f"rank {self.rank} was started with world_size={self.size} "
                                       f"but rank 0 with world_size={hdr.world_size}")
                self.base = seg.base
                total = _layout(self, hdr.slot_bytes, hdr.ring_bytes)
                if hdr.layout_size != total or seg.size != total:
                    raise ShmcommError(f"segment {name} has a corrupt layout size")
                theirs_host = hdr.hostname.decode(errors="replace")
                theirs_boot = hdr.boot_id.decode(errors="replace")
                if theirs_host != host[:63] or theirs_boot != boot[:63]:
                    raise ShmcommError(
                        f"rank {self.rank} on host {host!r} found rank 0 on host {theirs_host!r}: "
                        f"shmcomm groups must have every rank on one machine")
                self.seg = seg
                self.hdr = hdr
                return
            if capi.shm_load_acquire64(&hdr.magic) == SHM_MAGIC:
                # Rank 0 died before every rank attached (SIGKILL during start-up): nobody
                # else would remove its segment. Remove it (if the name still is that one,
                # not a restarted rank 0's) and wait for a new rank 0.
                _unlink_name_if_nonce(name, _GROUP_NONCE_AT, hdr.nonce)
        seg = None
        if self.watch is not None:
            self.watch.check()
        if time.monotonic() > deadline:
            # A rank 0 killed before it named its segment (no O_TMPFILE) left a staging name:
            # nobody else coming, this rank removes it.
            from shmcomm.segments import remove_dead_staging
            remove_dead_staging(name)
            raise CommTimeoutError(
                f"rank {self.rank} found no segment from rank 0 of job {self.job!r} within "
                f"{self.timeout} s: is rank 0 running, on this machine, with the same job name?")
        time.sleep(delay)  # releases the GIL: other threads (a progress thread) run meanwhile
        delay = min(delay * 2, 0.01)
        PyErr_CheckSignals()



cdef _remove_stale(Communicator self, str name):
    """Rank 0 found ``name`` taken: remove it if it is a dead job's segment (or one whose creator
    died before writing its header), else refuse to share a live job's name."""
    from shmcomm.segments import describe
    info = describe("/dev/shm" + name)
    if info.valid and not info.stale:
        raise ShmcommError(
            f"job name {self.job!r} is in use by live processes {info.pids}; "
            f"give this job another name (SHMCOMM_JOB or name=)") from None
    Segment.attach(name) and None  # raises UntrustedFileError for a file that is not ours
    try:
        os.unlink("/dev/shm" + name)
    except FileNotFoundError:
        pass



cdef bint _pid_alive(int pid):
    return pid > 0 and (kill(pid, 0) == 0 or errno != ESRCH)



cdef _register(Communicator self):
    cdef capi.shm_cb_t *me = self.cb(self.rank)
    if me.state == SHM_RANK_ATTACHED and me.pid > 0 and kill(me.pid, 0) == 0:
        raise ShmcommError(f"rank {self.rank} of job {self.job!r} is already taken by pid "
                           f"{me.pid}: two processes were given the same rank")
    from shmcomm.trust import process_identity
    me.pid = getpid()
    me.start_time = process_identity(me.pid)[1]
    me.probe_addr = <uint64_t>&me.pid
    # Steps start at FIRST_STEP: published here, before peers can see this rank attached (a
    # zero left in place would read as far ahead of it)
    self.step = FIRST_STEP
    me.desc[0][D_KIND] = me.desc[1][D_KIND] = capi.shm_desc_word0(0, FIRST_STEP)
    me.seq = FIRST_STEP
    capi.shm_store_seq_cst(&me.state, SHM_RANK_ATTACHED)
    cdef uint32_t joined = capi.shm_fetch_add(&self.hdr.attached, 1) + 1
    capi.shm_futex_wake_all(&self.hdr.attached)
    if joined == <uint32_t>self.size:
        self.seg.unlink_name()  # everyone is in: the name is no longer needed



cdef _check_joined_alive(Communicator self):
    """A rank that joined and then died or gave up can never be part of this group (its place
    counts as taken): fail now rather than wait the whole timeout for the ranks still missing."""
    cdef uint32_t state
    gave_up = None
    for r in range(self.size):
        if r == self.rank:
            continue
        state = capi.shm_load_acquire(&self.cb(r).state)
        if state == SHM_RANK_ATTACHED and not _pid_alive(self.cb(r).pid):
            raise peer_failure("init_process_group", r, self.cb(r).pid, "died during start-up")
        if state == SHM_RANK_DEPARTED and gave_up is None:
            gave_up = r
    if gave_up is not None:  # after the dead: a death is why others give up
        raise peer_failure("init_process_group", gave_up, self.cb(gave_up).pid, "gave up during start-up")



cdef _wait_all_attached(Communicator self, double deadline):
    cdef uint32_t target = self.size
    cdef int got
    while True:
        with nogil:  # other threads of this process (progress threads) run while we wait
            got = capi.shm_wait_geq(&self.hdr.attached, target, &self.hdr.attached_waiters,
                                    0, 1, SLICE_NS // 5)
        if got:
            return
        PyErr_CheckSignals()
        if not _pid_alive(self.hdr.creator_pid):
            raise peer_failure("init_process_group", 0, self.hdr.creator_pid, "died during start-up")
        if self.watch is not None:  # first: a member's death is why others give up
            self.watch.check()
        _check_joined_alive(self)
        if time.monotonic() > deadline:
            missing = [r for r in range(self.size) if self.cb(r).state != SHM_RANK_ATTACHED]
            raise CommTimeoutError(
                f"init_process_group timed out after {self.timeout} s: rank(s) {missing} of job "
                f"{self.job!r} never joined (same job name and world size on every rank?)")
