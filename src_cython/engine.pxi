# Communicator: one group's shared segment, the step protocol every collective is built on, and
# the progress engine that runs the group's operations in issue order.
#
# Step protocol. Each rank owns a monotonically increasing `seq` in its control block and two data
# slots, used by step parity. One step: write your own slot (and descriptor), publish seq = s
# (release), wait until every peer's seq >= s (acquire), then read peers' slots. A rank publishes s
# only after it finished reading step s-1, so writing slot[s % 2] at step s never races a reader of
# step s-2: no trailing barrier is needed. The first step of every collective also carries a
# descriptor (what was called, dtype, size, root, op) that every rank checks against all others,
# so a mismatch raises CollectiveMismatchError on every rank instead of returning corrupt data.
#
# Progress engine (shm_engine.h). A synchronous call holds the engine "inline" once everything
# issued before it ran, and runs on the caller's thread. An async call queues its _Call and
# returns a Work; the queue is run by whichever thread gets there first: a thread waiting for a
# Work (it drives the queue up to its op), a synchronous call issued behind it, or the group's
# background thread. All of it runs without the GIL; the GIL is taken only to raise an error or to
# complete a Future that was handed out.
#
# Threads. Every call on a group may come from any thread: calls are serialised, each runs whole
# before the next starts, in the order threads reach the engine (every rank must still issue the
# same sequence of collectives, as with torch.distributed).
#
# Leases. Single-copy and zero-copy paths read and write peers' memory: private arrays at the
# addresses peers publish, and sc.empty arrays through the shared heap. Every such copy runs under
# a lease: the copying rank counts it in its own control block (`leases`), then checks that the
# peer has not withdrawn. A rank whose op fails after it exposed its memory marks `withdrawn` and,
# before returning, waits until no live peer holds a lease. Both sides use sequentially consistent
# accesses, so either the copier sees the withdrawal or the withdrawer sees the lease: a late peer
# can never write into memory the user has already reused. Leases are counted per holder, so a
# dead holder (which writes nothing) is not waited for, and one that holds a lease past the
# timeout (stopped) is killed before the withdrawal returns.
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memmove
from posix.signal cimport kill
from libc.signal cimport SIGKILL
from posix.unistd cimport getpid, usleep
from cpython.exc cimport PyErr_CheckSignals

cdef uint64_t SLICE_NS = 50 * 1000 * 1000  # futex sleep slice: how often health is checked
cdef uint64_t SPIN_FLOOR_NS = 20 * 1000     # adaptive spinning never goes below this budget
cdef uint64_t IDLE_NS = 20 * 1000 * 1000    # after this long without ops the progress thread sleeps
cdef size_t EAGER_BYTES = 256 << 10         # async ops this large start on the progress thread at once

ctypedef int (*_exec_unchecked_t)(Communicator, op_t *) noexcept nogil
ctypedef int (*_exec_batch_unchecked_t)(Communicator, op_t **, int) noexcept nogil


cdef void _copy_text(char *dst, str text, size_t cap):
    cdef bytes raw = text.encode()[:cap]
    memcpy(dst, <char *>raw, len(raw))
    dst[len(raw)] = 0


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


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


_NESTED_CLOSE = "a process group cannot be destroyed from inside one of its own operations"

# This process's pid, kept current by a fork hook: a group whose owner is another process was
# inherited from the parent, and a call on it would run as the parent's rank. One load per call
# (getpid() is a system call: ~0.2 us on every small collective).
cdef int _this_pid = getpid()


def _note_fork():
    global _this_pid
    _this_pid = getpid()


os.register_at_fork(after_in_child=_note_fork)


cdef class Communicator:
    """The compiled side of a process group (internal: use ``shmcomm.init_process_group``)."""
    cdef Segment seg
    cdef char *base
    cdef capi.shm_header_t *hdr
    cdef readonly int rank
    cdef readonly int size
    cdef readonly str job
    cdef readonly str part
    cdef readonly size_t slot_bytes
    cdef readonly size_t ring_bytes
    cdef readonly size_t small_bytes
    cdef size_t ring_off, ring_stride, slot_off
    cdef uint32_t step
    cdef uint64_t spin_ns        # spin budget now: adapts between SPIN_FLOOR_NS and spin_max_ns
    cdef uint64_t spin_max_ns
    cdef int yields
    cdef uint32_t cpu_here       # 1 + the CPU of this rank's last wait, as published in its block
    cdef uint64_t deadline_ns
    cdef readonly double timeout
    cdef int *pidfds
    cdef int *pids
    cdef const void **srcs        # reduction inputs: scratch of the op running now
    cdef double *factors          # PREMUL_SUM: each rank's factor, for the op running now
    cdef object broken
    cdef const char *op_name
    cdef readonly bint closed
    cdef int heap_count
    cdef list heaps               # (weakref to Segment, heap id, stride) of sc.empty segments
    cdef char *scratch            # private cache-sized buffer for single-copy reductions
    cdef size_t scratch_bytes
    cdef char *staging            # kept across calls (no page faults): in-place all_to_all's input copy
    cdef size_t staging_bytes
    cdef readonly size_t stream_bytes  # results this large go out with streaming stores
    cdef bint cma_ok              # single-copy reads from peers work here (probed at start)
    cdef readonly size_t cma_bytes  # pieces at least this large use them
    # ---- progress engine
    cdef capi.shm_engine_t engine
    cdef bint engine_ready
    cdef bint background          # the op running now runs on the background thread
    cdef bint published           # the op running now published addresses of this rank's memory
    cdef _Call inline_call        # the arguments of the synchronous call holding the engine
    cdef list inflight            # queued _Calls from inflight_head on, oldest first (they keep
    cdef Py_ssize_t inflight_head  # their arrays alive); entries before the head are done
    cdef object thread
    cdef object thread_lock
    cdef readonly int owner_pid   # a forked child must not leave its parent's group
    cdef object creds             # shmcomm.trust.Credentials: proves segments are this job's
    cdef uint64_t doze_ns
    cdef readonly unsigned long long fused_calls  # small reductions that ran in a step with others
    cdef readonly unsigned long long zero_copy_calls  # calls that read or wrote peers' sc.empty arrays in place

    def __cinit__(self):
        self.pidfds = NULL
        self.pids = NULL
        self.srcs = NULL
        self.factors = NULL
        self.scratch = NULL
        self.scratch_bytes = 0
        self.staging = NULL
        self.staging_bytes = 0
        self.closed = True
        self.engine_ready = False
        self.op_name = b"init"

    def __init__(self, str job, str part, int rank, int size, double timeout, secret=None,
                 int threads_per_rank=1):
        if size < 1:
            raise ValueError(f"world_size must be >= 1, got {size}")
        if not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, {size}), got {rank}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.rank, self.size, self.job, self.part = rank, size, job, part
        self.timeout = timeout
        self.broken = None
        self.heaps = []
        self.owner_pid = getpid()
        from shmcomm.trust import credentials
        self.creds = credentials(secret)
        settings = group_settings(size, threads_per_rank)
        self.small_bytes = settings["small_bytes"]
        self.stream_bytes = settings["stream_bytes"]
        self.spin_ns = self.spin_max_ns = settings["spin_us"] * 1000
        self.yields = settings["yields"]
        self.doze_ns = settings["progress_us"] * 1000
        self.pidfds = <int *>malloc(size * sizeof(int))
        self.pids = <int *>malloc(size * sizeof(int))
        self.srcs = <const void **>malloc(size * sizeof(void *))
        self.factors = <double *>malloc(size * sizeof(double))
        if not (self.pidfds and self.pids and self.srcs and self.factors):
            raise MemoryError()
        if capi.shm_engine_init(&self.engine) != 0:
            raise MemoryError("cannot set up the progress engine")
        self.engine_ready = True
        self.inline_call = _Call()
        self.inline_call._tables(size)
        self.inline_call.inline = True
        self.inflight = []
        self.inflight_head = 0
        self.thread = None
        self.thread_lock = threading.Lock()
        for r in range(size):
            self.pidfds[r] = -1
            self.pids[r] = 0
        self._rendezvous(settings["slot_bytes"], settings["ring_bytes"], settings["cma_bytes"])
        self.closed = False

    # ---- layout -------------------------------------------------------------------------------
    cdef size_t _layout(self, size_t slot_bytes, size_t ring_bytes):
        cdef size_t n = self.size
        # at least 64 bytes per rank after reduce_scatter_v's size header, or a chunk would be
        # empty and a pipelined loop would never advance (SHMCOMM_SLOT_BYTES=4096, 57+ ranks)
        slot_bytes = max(slot_bytes, _align_up((n + 1) * sizeof(uint64_t), 64) + 64 * n)
        self.slot_bytes = _align_up(slot_bytes, 4096)
        self.ring_bytes = _align_up(ring_bytes, 4096)
        self.ring_off = _align_up(SHM_HEADER_BYTES + n * SHM_CB_BYTES, 4096)
        self.ring_stride = SHM_RING_CTRL_BYTES + self.ring_bytes
        self.slot_off = _align_up(self.ring_off + n * n * self.ring_stride, 4096)
        return self.slot_off + 2 * n * self.slot_bytes

    cdef inline capi.shm_cb_t *cb(self, int r) noexcept nogil:
        return <capi.shm_cb_t *>(self.base + SHM_HEADER_BYTES + r * SHM_CB_BYTES)

    cdef inline char *slot(self, int r, uint32_t s) noexcept nogil:
        return self.base + self.slot_off + (r * 2 + (s & 1)) * self.slot_bytes

    cdef inline capi.shm_ring_t *ring(self, int src, int dst) noexcept nogil:
        return <capi.shm_ring_t *>(self.base + self.ring_off + (src * self.size + dst) * self.ring_stride)

    # ---- rendezvous ---------------------------------------------------------------------------
    cdef _rendezvous(self, size_t slot_bytes, size_t ring_bytes, size_t cma_bytes):
        from shmcomm.segments import describe, segment_name
        name = segment_name(self.job, self.part)
        deadline = time.monotonic() + self.timeout
        host, boot = socket.gethostname(), _boot_id()
        cdef size_t total
        if self.rank == 0:
            total = self._layout(slot_bytes, ring_bytes)
            while True:
                try:
                    self.seg = Segment.create(name, total)
                    break
                except FileExistsError:
                    info = describe("/dev/shm" + name)
                    if info.valid and not info.stale:
                        raise ShmcommError(
                            f"job name {self.job!r} is in use by live processes {info.pids}; "
                            f"give this job another name (SHMCOMM_JOB or name=)") from None
                    Segment.attach(name) and None
                    os.unlink("/dev/shm" + name) if os.path.exists("/dev/shm" + name) else None
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
        else:
            self._attach(name, deadline, host, boot)
        self._register()
        try:
            self._wait_all_attached(deadline)
        except BaseException:
            self.cb(self.rank).state = SHM_RANK_DEPARTED
            self.seg.unlink_name()
            raise
        for r in range(self.size):
            self.pids[r] = self.cb(r).pid
            if r != self.rank:
                self.pidfds[r] = capi.shm_pidfd_open(self.pids[r])
                self._verify_peer(r)
        # Algorithm choices depend on these, so every rank takes rank 0's values.
        self.small_bytes = self.hdr.small_bytes
        self.cma_bytes = self.hdr.cma_bytes
        self.cma_ok = self.cma_bytes > 0 and self._probe_cma()
        capi.shm_store_seq_cst(&self.cb(self.rank).cma_ok, self.cma_ok)  # senders of p2p look

    cdef _verify_peer(self, int r):
        """Rank r's pid, read from the segment, must name the process that registered: same
        user, same start time (checked after the pidfd is open, so the pid cannot be recycled
        under us). Cross-memory copies only ever target these pids."""
        from shmcomm.trust import process_identity
        ident = process_identity(self.pids[r])
        if ident is None or ident[0] != os.geteuid() or ident[1] != self.cb(r).start_time:
            self.cb(self.rank).state = SHM_RANK_DEPARTED
            raise ShmcommError(
                f"init_process_group: rank {r} registered pid {self.pids[r]}, but that is not the "
                f"process that joined job {self.job!r} (" +
                ("it does not exist" if ident is None else
                 f"uid {ident[0]}, start time {ident[1]}; expected uid {os.geteuid()}, start time "
                 f"{self.cb(r).start_time}") + ")")

    cdef bint _probe_cma(self):
        """Can this rank read every peer's memory directly (same user, no ptrace restriction)?"""
        cdef int32_t seen
        for r in range(self.size):
            if r != self.rank:
                seen = 0
                if capi.shm_cma_read(self.pids[r], &seen, self.cb(r).probe_addr, sizeof(seen)) != 0 \
                        or seen != self.pids[r]:
                    return False
        return True

    cdef _attach(self, str name, double deadline, str host, str boot):
        cdef Segment seg
        delay = 0.0005
        while True:
            seg = Segment.attach(name)
            if seg is not None and seg.size >= SHM_HEADER_BYTES:
                hdr = <capi.shm_header_t *>seg.base
                if capi.shm_load_acquire64(&hdr.magic) == SHM_MAGIC and self._creator_alive(hdr.creator_pid):
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
                    total = self._layout(hdr.slot_bytes, hdr.ring_bytes)
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
                    self._remove_if_same(name, hdr.nonce)
            seg = None
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"rank {self.rank} found no segment from rank 0 of job {self.job!r} within "
                    f"{self.timeout} s: is rank 0 running, on this machine, with the same job name?")
            time.sleep(delay)  # releases the GIL: other threads (a progress thread) run meanwhile
            delay = min(delay * 2, 0.01)
            PyErr_CheckSignals()

    cdef _remove_if_same(self, str name, uint64_t nonce):
        cdef Segment again = Segment.attach(name)
        if again is not None and again.size >= SHM_HEADER_BYTES \
                and (<capi.shm_header_t *>again.base).nonce == nonce:
            again.unlink_name()

    cdef bint _creator_alive(self, int pid):
        return pid > 0 and (kill(pid, 0) == 0 or errno != ESRCH)

    cdef _register(self):
        cdef capi.shm_cb_t *me = self.cb(self.rank)
        if me.state == SHM_RANK_ATTACHED and me.pid > 0 and kill(me.pid, 0) == 0:
            raise ShmcommError(f"rank {self.rank} of job {self.job!r} is already taken by pid "
                               f"{me.pid}: two processes were given the same rank")
        from shmcomm.trust import process_identity
        me.pid = getpid()
        me.start_time = process_identity(me.pid)[1]
        me.probe_addr = <uint64_t>&me.pid
        capi.shm_store_seq_cst(&me.state, SHM_RANK_ATTACHED)
        cdef uint32_t joined = capi.shm_fetch_add(&self.hdr.attached, 1) + 1
        capi.shm_futex_wake_all(&self.hdr.attached)
        if joined == <uint32_t>self.size:
            self.seg.unlink_name()  # everyone is in: the name is no longer needed

    cdef _wait_all_attached(self, double deadline):
        cdef uint32_t target = self.size
        cdef int got
        while True:
            with nogil:  # other threads of this process (progress threads) run while we wait
                got = capi.shm_wait_geq(&self.hdr.attached, target, &self.hdr.attached_waiters,
                                        0, 1, SLICE_NS // 5)
            if got:
                return
            PyErr_CheckSignals()
            if not self._creator_alive(self.hdr.creator_pid):
                raise peer_failure("init_process_group", 0, self.hdr.creator_pid, "died during start-up")
            if time.monotonic() > deadline:
                missing = [r for r in range(self.size) if self.cb(r).state != SHM_RANK_ATTACHED]
                raise CommTimeoutError(
                    f"init_process_group timed out after {self.timeout} s: rank(s) {missing} of job "
                    f"{self.job!r} never joined (same job name and world size on every rank?)")

    # ---- waiting and health -------------------------------------------------------------------
    cdef bint _peer_dead(self, int r) noexcept nogil:
        if self.pidfds[r] >= 0:
            return capi.shm_pidfd_exited(self.pidfds[r])
        return kill(self.pids[r], 0) != 0 and errno == ESRCH

    cdef object _fail(self, object exc):
        """Remember why the group broke (a step was left half done) and return the error."""
        self.broken = exc
        return exc

    cdef str _name(self):
        return (<bytes>self.op_name).decode()

    cdef int _check_health(self, int peer, uint32_t target) except -1 nogil:
        """Raise if the group is aborted, a peer we wait for is gone, the deadline passed, or a
        Python signal handler raised. peer < 0: every peer whose seq is behind `target`."""
        cdef int r, first, last
        if capi.shm_load_acquire(&self.hdr.abort_flag):
            with gil:
                raise self._fail(AbortedError(f"{self._name()}: {self._aborted_text()}"))
        if peer < 0:
            first, last = 0, self.size
        else:
            first, last = peer, peer + 1
        for r in range(first, last):
            if r == self.rank:
                continue
            if peer < 0 and capi.shm_seq_geq(capi.shm_load_acquire(&self.cb(r).seq), target):
                continue
            if capi.shm_load_acquire(&self.cb(r).state) == SHM_RANK_DEPARTED or self._peer_dead(r):
                with gil:
                    raise self._fail(peer_failure(self._name(), r, self.pids[r]))
        if capi.shm_now_ns() > self.deadline_ns:
            with gil:
                # each late rank with the step it reached: a rank far behind is stuck
                # elsewhere (another collective, or computing), one step behind is just late
                late = [(r, capi.shm_load_acquire(&self.cb(r).seq)) for r in range(self.size)
                        if r != self.rank and
                        not capi.shm_seq_geq(capi.shm_load_acquire(&self.cb(r).seq), target)]
                where = ", ".join(f"rank {r} at step {seq}" for r, seq in late) or "none"
                raise self._fail(CommTimeoutError(
                    f"{self._name()} timed out after {self.timeout} s on rank {self.rank} "
                    f"waiting for {'rank %d' % peer if peer >= 0 else 'its peers'} at step "
                    f"{target}; not arrived: {where}"))
        with gil:
            try:
                PyErr_CheckSignals()
            except BaseException as exc:
                self._fail(ShmcommError(f"{self._name()} interrupted: {exc!r}"))
                raise
        return 0

    cdef bint _peer_shares_core(self, int peer) noexcept nogil:
        """Whether `peer` (every peer when -1) last waited on the CPU this thread runs on: the
        scheduler may keep two ranks on one core while busy processes hold the others, and then
        a spinning waiter only delays the peer it waits for."""
        cdef int cpu = capi.sched_getcpu()
        cdef uint32_t here = <uint32_t>(cpu + 1) if cpu >= 0 else 0
        cdef int r
        if here != self.cpu_here:
            self.cpu_here = here
            capi.shm_store_release(&self.cb(self.rank).cpu, here)
        if here == 0:
            return False
        if peer >= 0:
            return capi.shm_load_acquire(&self.cb(peer).cpu) == here
        for r in range(self.size):
            if r != self.rank and capi.shm_load_acquire(&self.cb(r).cpu) == here:
                return True
        return False

    cdef int _wait(self, uint32_t *word, uint32_t target, uint32_t *waiters, int peer) except -1 nogil:
        # On the progress thread with nobody waiting, the caller is computing: sleep soon and
        # leave it the core.
        cdef uint64_t spin = self.spin_ns
        if self.background and capi.shm_load_acquire(&self.engine.drivers) == 0:
            spin = 0
        elif spin and self._peer_shares_core(peer):
            spin = 0  # it can only run once this thread stops: no spinning, straight to yielding
        cdef int got = capi.shm_wait_geq(word, target, waiters, spin, self.yields, SLICE_NS)
        if spin:
            # Adaptive spinning: a wait that ended while spinning says peers answer within the
            # budget, so keep (regrow) it; one that had to sleep says the budget only burnt a
            # core somebody else needed (a loaded machine), so halve it, down to a floor. (Also
            # regrowing after waits that ended soon after the spin stopped was measured worse:
            # on a core shared with its peer, a waiter's peer arrives right after it gives the
            # core up, so that rule grew budgets that only delayed the peer: window medians of
            # 16-27 us where this rule, with the shared-core check, gives 0.4-0.6 us.)
            if got == 1:
                self.spin_ns = min(self.spin_max_ns, 2 * self.spin_ns)
            else:
                self.spin_ns = max(min(SPIN_FLOOR_NS, self.spin_max_ns), self.spin_ns // 2)
        if got:
            return 0
        while True:
            self._check_health(peer, target)
            if capi.shm_wait_geq(word, target, waiters, 0, 0, SLICE_NS):
                return 0

    cdef int _begin(self, const char *op_name) except -1 nogil:
        if self.closed:
            with gil:
                raise ShmcommError(f"{op_name.decode()}: the process group was destroyed")
        if capi.shm_load_acquire(&self.hdr.abort_flag):
            with gil:
                raise AbortedError(f"{op_name.decode()}: {self._aborted_text()}")
        if self.broken is not None:  # read without the GIL: set once, never cleared
            with gil:
                raise ShmcommError(f"{op_name.decode()}: the group is unusable after an earlier "
                                   f"failure: {self.broken}") from self.broken
        self.op_name = op_name
        self.deadline_ns = capi.shm_now_ns() + <uint64_t>(self.timeout * 1e9)
        self.published = False
        return 0

    # ---- the step ---------------------------------------------------------------------------
    cdef inline uint32_t next_step(self) noexcept nogil:
        return self.step + 1

    cdef int _step(self) except -1 nogil:
        cdef uint32_t s = self.step + 1
        cdef int i, q
        cdef capi.shm_cb_t *c = self.cb(self.rank)
        self.step = s
        capi.shm_publish(&c.seq, s, &c.seq_waiters)
        for i in range(1, self.size):
            q = (self.rank + i) % self.size
            c = self.cb(q)
            if not capi.shm_seq_geq(capi.shm_load_acquire(&c.seq), s):
                self._wait(&c.seq, s, &c.seq_waiters, -1)
        return 0

    cdef void _set_desc(self, uint64_t kind, uint64_t dtype, uint64_t nbytes, uint64_t root,
                        uint64_t op) noexcept nogil:
        cdef uint64_t *d = self.cb(self.rank).desc[(self.step + 1) & 1]
        d[0] = kind; d[1] = dtype; d[2] = nbytes; d[3] = root; d[4] = op

    cdef int _check_desc(self) except -1 nogil:
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
                        raise CollectiveMismatchError(self._mismatch_text())
        return 0

    cdef inline void _set_factor(self, op_t *o) noexcept nogil:
        """PREMUL_SUM: publish this rank's factor with the descriptor of the next step (word 7,
        not compared: each rank may scale its input by its own factor, as in NCCL)."""
        cdef uint64_t *d = self.cb(self.rank).desc[(self.step + 1) & 1]
        if o.op == SHM_PREMUL_SUM:
            memcpy(&d[7], &o.factor, sizeof(double))

    cdef inline void _load_factors(self, op_t *o) noexcept nogil:
        """PREMUL_SUM, after the step that carried the descriptors: every rank's factor, in rank
        order, for the kernel (a peer cannot overwrite them before this rank's next step)."""
        cdef int q
        if o.op == SHM_PREMUL_SUM:
            for q in range(self.size):
                memcpy(&self.factors[q], &self.cb(q).desc[self.step & 1][7], sizeof(double))

    cdef str _mismatch_text(self):
        lines = [f"rank {q}: {describe_call(self.cb(q).desc[self.step & 1])}" for q in range(self.size)]
        return "ranks called different collectives or arguments:\n  " + "\n  ".join(lines)

    cdef inline void _slice(self, size_t count, int q, int itemsize, size_t *lo, size_t *hi) noexcept nogil:
        """Bounds of rank q's share of `count` elements, cache-line aligned."""
        cdef size_t align = 64 // itemsize if itemsize < 64 else 1
        cdef size_t per = _align_up((count + self.size - 1) // self.size, align)
        lo[0] = min(q * per, count)
        hi[0] = min(lo[0] + per, count)

    # ---- path choice: one place --------------------------------------------------------------
    cdef inline bint _single_copy_size(self, size_t nbytes) noexcept nogil:
        """Pieces this large go by cross-memory attach (if every rank can) instead of the slots."""
        return self.cma_bytes > 0 and nbytes >= self.cma_bytes

    cdef inline bint _one_shot_size(self, size_t nbytes) noexcept nogil:
        """Reductions this small go through the slots in one step."""
        return (nbytes <= self.small_bytes or nbytes <= <size_t>(64 * self.size)) \
            and nbytes + 64 <= self.slot_bytes

    # ---- buffers kept across calls -----------------------------------------------------------
    cdef inline void _out(self, char *dst, const char *src, size_t n, size_t total) noexcept nogil:
        """Copy n bytes of an output of ``total`` bytes in all (overlap allowed): streaming stores
        from stream_bytes up (not for reductions: their outputs are their cached inputs)."""
        shm_move_out(dst, src, n, total >= self.stream_bytes)

    cdef char *_scratch(self, size_t nbytes) except NULL nogil:
        return _grown(&self.scratch, &self.scratch_bytes, nbytes, "scratch")

    cdef char *_staging(self, size_t nbytes) except NULL nogil:
        return _grown(&self.staging, &self.staging_bytes, nbytes, "staging")

    # ---- single copy: peers read each other's arrays in place ----------------------------------
    # For large pieces every rank publishes a table of its array addresses with the descriptor;
    # if every rank can read every other's memory (cross-memory attach), each pulls what it needs
    # straight into its output, and a last step keeps the sources untouched until all are done.
    cdef bint _publish_table(self, char **table, int ntable, bint usable=True) except -1 nogil:
        """One step carrying the descriptor and [cma_ok, table...]; True if single copy is on
        (every rank can read peers' memory and passed ``usable``)."""
        cdef uint32_t s = self.next_step()
        cdef uint64_t *mine = <uint64_t *>self.slot(self.rank, s)
        cdef int i, q
        mine[0] = self.cma_ok and usable
        for i in range(ntable):
            mine[1 + i] = <uint64_t>table[i] if table != NULL else 0
        self.published = True  # from here a failure must withdraw these addresses
        self._step()
        self._check_desc()
        for q in range(self.size):
            if not (<uint64_t *>self.slot(q, s))[0]:
                return False
        return True

    cdef inline uint64_t _peer_entry(self, int q, int i) noexcept nogil:
        return (<uint64_t *>self.slot(q, self.step))[1 + i]

    cdef int _lease(self, int q) except -1 nogil:
        """Take a lease covering rank q's memory (q < 0: every peer's) for the copy about to run;
        ``_unlease`` ends it. Raises if one of them withdrew (see Leases at the top)."""
        cdef capi.shm_cb_t *me = self.cb(self.rank)
        cdef int r, first = 0 if q < 0 else q, last = self.size if q < 0 else q + 1
        capi.shm_fetch_add(&me.leases, 1)
        for r in range(first, last):
            if r != self.rank and capi.shm_load_seq_cst(&self.cb(r).withdrawn):
                capi.shm_fetch_sub(&me.leases, 1)
                with gil:
                    raise self._fail(peer_failure(self._name(), r, self.pids[r],
                                                  "failed this operation and withdrew its buffers"))
        return 0

    cdef inline void _unlease(self) noexcept nogil:
        capi.shm_fetch_sub(&self.cb(self.rank).leases, 1)

    cdef int _cma(self, int q, char *local, uint64_t remote, size_t n, bint write) except -1 nogil:
        """Copy n bytes between ``local`` and address ``remote`` of rank q (write: to rank q),
        under a lease on q's memory."""
        cdef int err
        if n == 0:
            return 0
        self._lease(q)
        if write:
            err = capi.shm_cma_write(self.pids[q], local, remote, n)
        else:
            err = capi.shm_cma_read(self.pids[q], local, remote, n)
        self._unlease()
        if err:
            with gil:
                raise self._fail(os_failure(f"{self._name()}: {'writing' if write else 'reading'} rank "
                                            f"{q}'s memory", err, q, self.pids[q]))
        return 0

    cdef void _withdraw(self) noexcept nogil:
        """After a failed op that exposed this rank's memory: no peer may touch it from now on.
        Wait until every live peer's copies under way have ended (a dead peer copies nothing);
        a peer still holding a lease after the group's timeout is stopped (SIGSTOP, a debugger)
        and is killed, so that it cannot write into memory the caller reuses."""
        cdef capi.shm_cb_t *me = self.cb(self.rank)
        cdef uint64_t give_up = capi.shm_now_ns() + <uint64_t>(self.timeout * 1e9)
        cdef int q
        capi.shm_store_seq_cst(&me.withdrawn, 1)
        for q in range(self.size):
            if q == self.rank:
                continue
            while capi.shm_load_seq_cst(&self.cb(q).leases) != 0 and not self._peer_dead(q):
                if capi.shm_now_ns() > give_up:
                    self._end_stuck_peer(q)
                    break
                usleep(100)

    cdef void _end_stuck_peer(self, int q) noexcept nogil:
        """Kill rank q, which has held a lease on this rank's memory for the whole timeout, and
        wait (bounded) until it is gone: only then can it no longer write here."""
        cdef uint64_t give_up = capi.shm_now_ns() + 5 * 1000 * 1000 * 1000ULL
        with gil:
            sys.stderr.write(f"shmcomm: rank {self.rank}: rank {q} (pid {self.pids[q]}) has been "
                             f"copying into this rank's memory for more than {self.timeout} s after "
                             f"the operation failed (stopped?); killing it so it cannot write into "
                             f"reused memory\n")
        capi.shm_pidfd_kill(self.pidfds[q], self.pids[q], SIGKILL)
        while not self._peer_dead(q) and capi.shm_now_ns() < give_up:
            usleep(1000)

    # ---- running one op -----------------------------------------------------------------------
    cdef int _exec(self, op_t *o) except -1 nogil:
        """Run ``o`` on this thread, which holds the engine."""
        cdef int k = o.kind
        if k == K_PYTHON:
            with gil:
                call = <_Call>o.call
                call.fn(*call.args)
            return 0
        self._begin(<const char *>_kind_cname(k))
        if k == K_ALL_REDUCE or k == K_REDUCE:
            return _run_reduce(self, o)
        if k == K_BROADCAST:
            return _run_broadcast(self, o)
        if k == K_ALL_GATHER or k == K_GATHER:
            return _run_gather(self, o)
        if k == K_SCATTER:
            return _run_scatter(self, o)
        if k == K_REDUCE_SCATTER:
            return _run_reduce_scatter(self, o)
        if k == K_ALL_TO_ALL or k == K_ALL_TO_ALL_V or k == K_ALL_GATHER_V or k == K_GATHER_V \
                or k == K_SCATTER_V:
            return _run_all_to_all(self, o)
        if k == K_REDUCE_SCATTER_V:
            return _run_reduce_scatter_v(self, o)
        if k == K_BARRIER:
            return _run_barrier(self, o)
        with gil:
            raise SystemError(f"unknown operation kind {k}")

    cdef void _run_queued(self, op_t *o, bint background) noexcept nogil:
        """Run the queued op ``o`` (claimed from the engine) and, when it is a small reduction,
        the small reductions queued right behind it in the same step; complete what ran and
        release the engine. Touches Python only for an error or a Future that was handed out."""
        cdef op_t *batch[MAX_BATCH]
        cdef op_t *nxt
        cdef size_t room = self.slot_bytes
        cdef int j, k = 1, rc, settle = 0, kind = _batch_class(self, o)
        batch[0] = o
        if kind:
            room -= _batch_bytes(o, 0)
            while k < MAX_BATCH:
                nxt = <op_t *>capi.shm_engine_peek(&self.engine, k)
                if nxt == NULL or _batch_class(self, nxt) != kind or _batch_bytes(nxt, k) > room:
                    break
                room -= _batch_bytes(nxt, k)
                batch[k] = nxt
                k += 1
        self.background = background
        if k == 1:
            rc = (<_exec_unchecked_t>_exec_entry)(self, o)
        else:
            rc = (<_exec_batch_unchecked_t>_exec_batch_entry)(self, batch, k)
        self.background = False
        if rc < 0:
            with gil:
                (<_Call>o.call).error = _fetch_exception()
            if self.published:
                self._withdraw()
            rc = 1  # the head failed; what it failed with decides the rest
        elif k == 1:
            rc = 1
        elif rc > 1:
            self.fused_calls += rc
        self.published = False
        # Ops j >= rc stay queued. Once DONE is visible a waiter may free an op, so whether its
        # Future is ours to settle is learnt in the same RMW (a wanted one is pinned, see calls.pxi).
        for j in range(rc):
            if capi.shm_op_mark(&batch[j].state, SHM_OP_DONE) & SHM_OP_FUTURE_WANTED:
                batch[settle] = batch[j]
                settle += 1
        capi.shm_engine_release(&self.engine, SHM_CLAIM_OWN, rc)
        for j in range(settle):
            _settle_future(batch[j])

    # ---- the engine ---------------------------------------------------------------------------
    cdef int _drive(self, op_t *target, double timeout) except -1 nogil:
        """Run queued ops on this thread until ``target`` is done (target NULL: until this thread
        holds the engine inline; returns the claim). Between ops it waits, spinning adaptively
        then sleeping, with Python signals checked every slice.
        With a ``timeout`` (s, >= 0) it only waits, leaving the ops to the progress thread (an op
        once started cannot be left half done), and returns -2 when the time ran out."""
        cdef void *head
        cdef uint32_t seen
        cdef int claim, got, rc = 0
        cdef bint runs = timeout < 0
        cdef uint64_t deadline = 0
        if target != NULL and capi.shm_engine_held_here(&self.engine) and not capi.shm_op_done(&target.state):
            # This thread runs an op of the group (a ProcessGroup.run callable, a callback) and
            # waits for one queued behind it: that one can only start after this one ends.
            with gil:
                raise ShmcommError(
                    f"an operation running on group {self.job}.{self.part} (ProcessGroup.run, a torch "
                    f"composite or a callback) waits for an async operation issued on the same group "
                    f"after it, which can only start once the running one has ended: issue it with "
                    f"async_op=False inside the operation, or wait for it outside")
        if not runs:
            deadline = capi.shm_now_ns() + <uint64_t>(timeout * 1e9)
            capi.shm_engine_kick(&self.engine)
        else:
            if target != NULL:  # the common case: the op is next in line; run it at once
                head = capi.shm_engine_claim(&self.engine)
                if head != NULL:
                    self._run_queued(<op_t *>head, False)
                if capi.shm_op_done(&target.state):
                    return 0
            capi.shm_fetch_add(&self.engine.drivers, 1)
        try:
            while True:
                if target != NULL:
                    if capi.shm_op_done(&target.state):
                        break
                else:
                    claim = capi.shm_engine_claim_inline(&self.engine)
                    if claim != SHM_CLAIM_NONE:
                        rc = claim
                        break
                seen = capi.shm_load_acquire(&self.engine.done)
                if runs:
                    head = capi.shm_engine_claim(&self.engine)
                    if head != NULL:
                        self._run_queued(<op_t *>head, False)
                        continue
                # Another thread runs an op: spin only briefly, then sleep. A large op would
                # otherwise share this core with a spinning waiter (on two cores, a waiter
                # spinning beside the progress thread doubled a 32 MiB all_reduce).
                got = capi.shm_wait_geq(&self.engine.done, seen + 1, &self.engine.done_waiters,
                                        min(self.spin_ns, SPIN_FLOOR_NS) if runs else 0, self.yields,
                                        SLICE_NS if runs else 1000 * 1000)
                if not got:
                    with gil:
                        PyErr_CheckSignals()
                if deadline and capi.shm_now_ns() > deadline:
                    rc = -2
                    break
        finally:
            if runs:
                capi.shm_fetch_sub(&self.engine.drivers, 1)
            if capi.shm_engine_pending(&self.engine):
                capi.shm_engine_kick(&self.engine)  # what is left is the progress thread's (if it sleeps)
        return rc

    cdef int _check_process(self) except -1:
        """Refuse a call from a child forked from this rank's process: it would act as the
        parent's rank, and its peers would get wrong data or none."""
        if _this_pid != self.owner_pid:
            raise ShmcommError(
                f"process group {self.job}.{self.part} belongs to process {self.owner_pid} (rank "
                f"{self.rank}); this process ({_this_pid}) is a child forked from it and cannot use "
                f"it: join a group of its own in the child (init_process_group), or start children "
                f"with multiprocessing's 'spawn' or 'forkserver' method")
        return 0

    cdef _Call _open(self, bint async_op):
        """The _Call to fill for a new call: a fresh one for an async op; for a synchronous one the
        inline _Call, once this thread holds the engine (after everything issued before it ran)."""
        cdef _Call call
        cdef int claim
        if self.closed:
            raise ValueError(f"process group {self.job}.{self.part} was destroyed")
        self._check_process()
        if async_op:
            return Work._new(self)  # the Work is the call's own argument object
        claim = capi.shm_engine_claim_inline(&self.engine)
        if claim == SHM_CLAIM_NONE:
            with nogil:
                claim = self._drive(NULL, -1.0)
        call = self.inline_call
        if claim == SHM_CLAIM_NESTED:
            # A queued Python op calls a collective: a _Call of its own (the inline one may be
            # the caller's, mid-call).
            call = _Call.__new__(_Call)
            call._tables(self.size)
            call.inline = True
        # The inline _Call is reused by every synchronous call: clear what the last one left
        # (a list form's prep does not set the shared-array fields its runner reads).
        call.reset()
        call.claim = claim
        return call

    cdef _abandon(self, _Call call):
        """A call whose arguments were refused: let go of the engine if it held it."""
        if call.inline:
            capi.shm_engine_release(&self.engine, call.claim, 0)
            call.owners = None

    cdef object _go(self, _Call call, object owners, object outputs, bint one_output=False):
        """Run a filled call: inline now (returns None), or queued (returns its Work). The Work's
        results are ``outputs``, a list, or ``[outputs]`` with ``one_output`` (made only if asked)."""
        cdef int rc
        cdef op_t *o = &call.o
        if call.inline:
            with nogil:
                rc = (<_exec_unchecked_t>_exec_entry)(self, o)
                if rc < 0 and self.published:
                    self._withdraw()
                self.published = False
                capi.shm_engine_release(&self.engine, call.claim, 0)
            if rc < 0:
                raise _fetch_exception()
            return None
        call.owners = owners
        call.outputs = outputs
        call.one_output = one_output
        if len(self.inflight) - self.inflight_head > 8:  # (Work.wait prunes too)
            self._prune()
        while capi.shm_engine_push(&self.engine, o) != 0:  # the queue is full: make room
            oldest = <_Call>self.inflight[self.inflight_head]
            with nogil:
                self._drive(&oldest.o, -1.0)
            self._prune()
        self.inflight.append(call)
        if self.thread is None:
            self._start_thread()
        if o.nbytes >= EAGER_BYTES and o.kind != K_PYTHON:
            capi.shm_engine_push_eager(&self.engine)  # worth a wake-up: start it now
        return call

    cdef _prune(self):
        """Forget queued calls that completed (their arrays may go)."""
        cdef Py_ssize_t n = len(self.inflight)
        while self.inflight_head < n and (<_Call>self.inflight[self.inflight_head]).done():
            self.inflight[self.inflight_head] = None
            self.inflight_head += 1
        if self.inflight_head == n:
            del self.inflight[:]
            self.inflight_head = 0
        elif self.inflight_head > 64:
            del self.inflight[:self.inflight_head]
            self.inflight_head = 0

    def submit(self, fn, tuple args, outputs, bint async_op=False):
        """Run ``fn(*args)`` in issue order (collectives it calls run inside it); a Work if async.

        Example::

            work = comm.submit(lambda: [comm.all_reduce(a) for a in arrays], (), arrays, True)
        """
        cdef _Call call = self._open(async_op)
        call.o.kind = K_PYTHON
        if call.inline:
            try:
                fn(*args)
            finally:
                self._abandon(call)
            return None
        call.fn, call.args = fn, args
        return self._go(call, None, list(outputs))

    cdef _start_thread(self):
        with self.thread_lock:
            if self.thread is None and not self.closed:
                self.thread = threading.Thread(target=self._progress_loop, daemon=True,
                                               name=f"shmcomm-{self.job}.{self.part}")
                self.thread.start()

    def _progress_loop(self):
        """The group's background thread: runs queued ops nobody is waiting for."""
        with nogil:
            self._progress()

    cdef void _progress(self) noexcept nogil:
        # The thread takes only ops issued before its last rest began: a fresh op belongs to the
        # thread that issued it, which usually waits for it at once or issues more first. While
        # callers run every op themselves, the rest doubles (up to doze_max_ns: fewer wake-ups
        # competing for the cores); the first op nobody waited for sets it back.
        cdef void *head
        cdef uint64_t before = 0, seen, last_seen = 0, doze = self.doze_ns, doze_max = 20 * self.doze_ns
        cdef uint64_t active = capi.shm_now_ns()
        while not capi.shm_load_acquire(&self.engine.stop):
            seen = capi.shm_engine_issued(&self.engine)
            if seen != last_seen:
                last_seen, active = seen, capi.shm_now_ns()
            if capi.shm_load_acquire(&self.engine.drivers) == 0:
                head = capi.shm_engine_claim_ticket_below(
                    &self.engine, max(before, capi.shm_engine_eager_until(&self.engine)))
                if head != NULL:
                    self._run_queued(<op_t *>head, True)
                    doze = self.doze_ns
                    continue
            before = capi.shm_engine_issued(&self.engine)
            capi.shm_engine_rest(&self.engine, before, capi.shm_now_ns() - active > IDLE_NS, doze, SLICE_NS)
            # Ops came in during the rest: they are ours after one short rest unless their issuer
            # runs them meanwhile. Nothing came: rest longer.
            if capi.shm_engine_pending(&self.engine) and not capi.shm_engine_busy(&self.engine):
                doze = self.doze_ns
            else:
                doze = min(2 * doze, doze_max)

    cdef _stop_thread(self):
        thread = self.thread
        if thread is None:
            return
        capi.shm_store_seq_cst(&self.engine.stop, 1)
        capi.shm_fetch_add(&self.engine.kick, 1)
        capi.shm_futex_wake_all(&self.engine.kick)
        if thread is not threading.current_thread():
            thread.join()
        self.thread = None

    def drain(self):
        """Run every queued op to its end (on this thread or the progress thread).

        Example::

            comm.drain()   # before close: nothing of this group is left running
        """
        cdef int claim
        if self.closed or not self.engine_ready:
            return
        claim = capi.shm_engine_claim_inline(&self.engine)
        if claim == SHM_CLAIM_NESTED:
            capi.shm_engine_release(&self.engine, claim, 0)
            raise ShmcommError(_NESTED_CLOSE)
        if claim == SHM_CLAIM_NONE:
            with nogil:
                claim = self._drive(NULL, -1.0)
        capi.shm_engine_release(&self.engine, claim, 0)
        self._prune()

    def pending(self):
        """Number of queued ops not yet run to their end.

        Example::

            assert comm.pending() == 0   # after wait() on every Work
        """
        return capi.shm_engine_pending(&self.engine)

    # ---- shared arrays ------------------------------------------------------------------------
    def alloc_shared(self, size_t nbytes_per_rank):
        """Collectively map one new segment holding `nbytes_per_rank` bytes per rank (page aligned);
        returns (Segment, stride). Rank 0 creates it, the others attach, rank 0 unlinks it.

        The segment starts with a header page (magic, a random nonce, the job's tag) that the
        Segment's buffer leaves out; rank 0 also publishes the nonce in its descriptor, which
        lives in the trusted group segment, so a file planted under the heap's name (even one
        of ours, from another job) is refused, never mapped as this group's memory. Its name
        derives from the group's salt (``derived_part``, as sub-groups'): nobody watching
        /dev/shm can plant the next heap's name ahead of rank 0 and so stop the job."""
        from shmcomm.segments import segment_name
        cdef size_t stride = _align_up(max(nbytes_per_rank, 1), 4096)
        cdef size_t total = SHM_HEADER_BYTES + stride * self.size
        cdef Segment seg = None
        cdef capi.shm_heap_header_t *hh
        cdef uint64_t nonce = 0
        cdef _Call call = self._open(False)
        try:
            self._begin(b"empty")
            self.heap_count += 1
            part = self.derived_part(f"{self.part}.h{self.heap_count}")
            name = segment_name(self.job, part)
            tag = self.creds.tag(self.job, part)
            failed = None  # rank 0's error creating the segment: every rank raises its cause
            if self.rank == 0:
                nonce = int.from_bytes(os.urandom(8), "little")
                try:
                    seg = Segment.create(name, total)
                except (ShmcommError, OSError) as e:
                    failed = e
                else:
                    hh = <capi.shm_heap_header_t *>seg.base
                    hh.nonce = nonce
                    memcpy(hh.tag, <char *>tag, 32)
                    hh.magic = SHM_HEAP_MAGIC
            self._set_desc(K_ALLOC, 0, nbytes_per_rank, 0, 0)
            # words 5-7 are not compared by _check_desc: rank 0's failure flag, the space left
            # in /dev/shm when it failed, the heap's nonce
            self.cb(self.rank).desc[(self.step + 1) & 1][5] = failed is not None
            self.cb(self.rank).desc[(self.step + 1) & 1][6] = _shm_free_bytes() if failed is not None else 0
            self.cb(self.rank).desc[(self.step + 1) & 1][7] = nonce
            try:
                with nogil:
                    self._step()
                    self._check_desc()
                if self.cb(0).desc[self.step & 1][5]:  # the group stays usable: nothing was made
                    if failed is not None:
                        raise failed
                    raise ShmcommError(
                        f"empty: rank 0 could not create the shared array's segment of {total} "
                        f"bytes in /dev/shm ({self.cb(0).desc[self.step & 1][6]} bytes free; see "
                        f"rank 0's error; enlarge /dev/shm, e.g. docker --shm-size)")
                if self.rank != 0:
                    nonce = self.cb(0).desc[self.step & 1][7]
                    try:
                        seg = Segment.attach(name)
                    except ShmcommError as e:
                        self.abort()
                        raise self._fail(e) from None
                    hh = <capi.shm_heap_header_t *>seg.base if seg is not None else NULL
                    if hh == NULL or seg.size != total or hh.magic != SHM_HEAP_MAGIC \
                            or hh.nonce != nonce \
                            or not self.creds.accepts((<char *>hh.tag)[:32], self.hdr.self_made,
                                                      self.job, part):
                        # (the group's rule: ranks started by hand, each with a secret of its
                        # own, share the job name, and here rank 0's nonce)
                        from shmcomm.trust import UntrustedFileError
                        self.abort()
                        raise self._fail(UntrustedFileError(
                            f"empty: shared array segment /dev/shm{name} is missing or is not the one "
                            f"rank 0 of job {self.job!r} created (size, nonce or tag differ)"))
                seg.data_offset = SHM_HEADER_BYTES
                with nogil:
                    self._step()
            finally:
                if seg is not None and self.rank == 0:
                    seg.unlink()
        finally:
            self._abandon(call)
        self.heaps = [h for h in self.heaps if h[0]() is not None]
        self.heaps.append((weakref.ref(seg), self.heap_count, stride))
        return seg, stride

    cdef uint64_t _find_heap(self, char *ptr, size_t nbytes, uint64_t *off, size_t *stride_out):
        """Heap id (0: none) of the sc.empty region of this rank holding [ptr, ptr+nbytes)."""
        cdef Segment seg
        cdef char *lo
        for ref, heap_id, stride in self.heaps:
            seg = ref()
            if seg is None:
                continue
            lo = seg.base + seg.data_offset + self.rank * <size_t>stride
            if lo <= ptr and ptr + nbytes <= lo + <size_t>stride:
                off[0] = ptr - lo
                stride_out[0] = stride
                return heap_id
        off[0] = 0
        stride_out[0] = 0
        return 0

    # ---- lifecycle ----------------------------------------------------------------------------
    def abort(self, str reason=None):
        """Abort the group on every rank: pending and later ops raise AbortedError (naming this
        rank and ``reason``, if it is the first to abort)."""
        if self.hdr == NULL or _this_pid != self.owner_pid:
            return
        if reason is not None and capi.shm_fetch_add(&self.hdr.abort_claim, 1) == 0:
            _copy_text(self.hdr.abort_reason, reason, 511)
            self.hdr.abort_rank = self.rank
        capi.shm_store_seq_cst(&self.hdr.abort_flag, 1)
        for r in range(self.size):
            capi.shm_futex_wake_all(&self.cb(r).seq)
            capi.shm_futex_wake_all(&self.cb(r).bell)

    def derived_part(self, str what):
        """The segment part (name) of something made through this group, e.g. sub-group ``g3``:
        ``what`` plus a suffix from the group's random salt, which only its members can read, so
        nobody watching /dev/shm can plant the name first.

        Example::

            comm.derived_part("g3")   # 'g3.9f0c2a71d4e6b580'
        """
        import hashlib
        salt = self.hdr.name_salt.to_bytes(8, "little")
        return f"{what}.{hashlib.blake2s(what.encode(), key=salt, digest_size=8).hexdigest()}"

    cdef str _aborted_text(self):
        """``the group was aborted``, with who did it and why when the first to abort said."""
        if self.hdr == NULL or self.hdr.abort_rank < 0:
            return "the group was aborted"
        reason = (<bytes>(<char *>self.hdr.abort_reason)).decode(errors="replace")
        return f"the group was aborted by rank {self.hdr.abort_rank}: {reason}"

    def is_aborted(self):
        return self.hdr != NULL and capi.shm_load_acquire(&self.hdr.abort_flag) != 0

    def refuse_inside_own_operation(self):
        """ShmcommError when this thread is running one of the group's own operations (a
        callback, a torch composite): closing there would stop the thread under itself. Checked
        before anything is closed, so the group stays whole.

        Example::

            comm.refuse_inside_own_operation()   # before a close
        """
        cdef int claim
        if self.closed or not self.engine_ready or _this_pid != self.owner_pid:
            return
        claim = capi.shm_engine_claim_inline(&self.engine)
        if claim != SHM_CLAIM_NONE:  # NONE: another thread holds it, nothing was taken
            capi.shm_engine_release(&self.engine, claim, 0)
        if claim == SHM_CLAIM_NESTED:
            raise ShmcommError(_NESTED_CLOSE)

    def close(self):
        """Leave the group: queued ops run to their end first (each bounded by the group's
        timeout); peers still waiting on this rank get PeerFailureError. In a forked child this
        only forgets the group: the parent is still a member."""
        if self.closed:
            return
        if _this_pid != self.owner_pid:
            self.closed = True
            return
        self.refuse_inside_own_operation()
        try:
            self.drain()
        finally:
            self.closed = True
            self._stop_thread()
            if self.hdr != NULL:
                capi.shm_store_seq_cst(&self.cb(self.rank).state, SHM_RANK_DEPARTED)
                capi.shm_futex_wake_all(&self.cb(self.rank).seq)
                capi.shm_futex_wake_all(&self.cb(self.rank).bell)
            for r in range(self.size):
                if self.pidfds[r] >= 0:
                    close(self.pidfds[r])
                    self.pidfds[r] = -1

    def __dealloc__(self):
        if self.pidfds != NULL:
            for r in range(self.size):
                if self.pidfds[r] >= 0:
                    close(self.pidfds[r])
        if self.engine_ready:
            capi.shm_engine_free(&self.engine)
        free(self.pidfds); free(self.pids); free(self.srcs); free(self.factors)
        free(self.scratch)
        free(self.staging)

    # ---- Python-facing entry points: validate into a _Call, then run or queue it ----------------
    cdef int _check_root(self, int root, str argname) except -1:
        if not 0 <= root < self.size:
            raise ValueError(f"{argname} must be a rank in [0, {self.size}), got {root}")
        return 0

    cpdef all_reduce(self, array, int op=SHM_SUM, bint async_op=False, double factor=1.0):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_reduce(self, &call.o, array, op, -1, factor)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, array, True)

    cpdef reduce(self, array, int dst, int op=SHM_SUM, bint async_op=False, double factor=1.0):
        cdef _Call call = self._open(async_op)
        try:
            self._check_root(dst, "dst")
            owners = _prep_reduce(self, &call.o, array, op, dst, factor)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, array, True)

    cpdef broadcast(self, array, int src, bint async_op=False):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_broadcast(self, &call.o, array, src)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, array, True)

    cpdef all_gather(self, list output_list, array, bint async_op=False):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_gather(self, &call.o, output_list, array, -1, "output_list")
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, output_list)

    cpdef all_gather_into(self, output, array, bint async_op=False):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_gather_into(self, &call.o, output, array)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, output, True)

    cpdef gather(self, array, gather_list, int dst, bint async_op=False):
        cdef _Call call = self._open(async_op)
        try:
            self._check_root(dst, "dst")
            if self.rank == dst and gather_list is None:
                raise ValueError("gather_list is required on the dst rank")
            if self.rank != dst and gather_list is not None:
                raise ValueError("gather_list must be None on ranks other than dst")
            owners = _prep_gather(self, &call.o, gather_list, array, dst, "gather_list")
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, None if call.inline else gather_list or [])

    cpdef scatter(self, array, scatter_list, int src, bint async_op=False):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_scatter(self, &call.o, array, scatter_list, src)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, array, True)

    cpdef reduce_scatter(self, output, list input_list, int op=SHM_SUM, bint async_op=False,
                         double factor=1.0):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_reduce_scatter(self, &call.o, output, input_list, op, factor)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, output, True)

    cpdef reduce_scatter_into(self, output, input, int op=SHM_SUM, bint async_op=False,
                              double factor=1.0):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_reduce_scatter_into(self, &call.o, output, input, op, factor)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, output, True)

    cpdef all_to_all(self, list output_list, list input_list, bint async_op=False):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_all_to_all(self, &call.o, output_list, input_list)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, output_list)

    cpdef all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                            bint async_op=False):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_all_to_all_single(self, &call.o, output, input, output_split_sizes,
                                             input_split_sizes)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, output, True)

    cpdef all_gather_v(self, output, array, counts, displs=None, bint async_op=False):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_all_gather_v(self, &call.o, output, array, counts, displs)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, output, True)

    cpdef gather_v(self, array, output, counts, displs, int dst, bint async_op=False):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_gather_v(self, &call.o, array, output, counts, displs, dst)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, output, True)

    cpdef scatter_v(self, output, input, counts, displs, int src, bint async_op=False):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_scatter_v(self, &call.o, output, input, counts, displs, src)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, output, True)

    cpdef reduce_scatter_v(self, output, input, counts, int op=SHM_SUM, bint async_op=False,
                           double factor=1.0):
        cdef _Call call = self._open(async_op)
        try:
            owners = _prep_reduce_scatter_v(self, &call.o, output, input, counts, op, factor)
        except BaseException:
            self._abandon(call)
            raise
        return self._go(call, owners, output, True)

    cpdef barrier(self, bint async_op=False):
        cdef _Call call = self._open(async_op)
        call.o.kind = K_BARRIER
        return self._go(call, None, [])


cdef int _exec_entry(Communicator c, op_t *o) except -1 nogil:
    return c._exec(o)


cdef int _exec_batch_entry(Communicator c, op_t **ops, int k) except -1 nogil:
    """Run k small (or k medium) reductions together; returns how many are done."""
    c._begin(_kind_cname(ops[0].kind))
    if _batch_class(c, ops[0]) == 1:
        return _reduce_batch(c, ops, k)
    return _reduce_batch_medium(c, ops, k)


cdef const char *_kind_cname(int kind) noexcept nogil:
    """The op's name as a C string, for error messages (static storage: no GIL needed)."""
    if kind == K_ALL_REDUCE: return "all_reduce"
    if kind == K_REDUCE: return "reduce"
    if kind == K_BROADCAST: return "broadcast"
    if kind == K_ALL_GATHER: return "all_gather"
    if kind == K_GATHER: return "gather"
    if kind == K_SCATTER: return "scatter"
    if kind == K_REDUCE_SCATTER: return "reduce_scatter"
    if kind == K_ALL_TO_ALL: return "all_to_all"
    if kind == K_ALL_TO_ALL_V: return "all_to_all_single"
    if kind == K_ALL_GATHER_V: return "all_gather_v"
    if kind == K_GATHER_V: return "gather_v"
    if kind == K_SCATTER_V: return "scatter_v"
    if kind == K_REDUCE_SCATTER_V: return "reduce_scatter_v"
    if kind == K_BARRIER: return "barrier"
    if kind == K_ALLOC: return "empty"
    return "operation"


cdef void _settle_future(op_t *o) noexcept nogil:
    """Complete the Future handed out for ``o``, with the GIL; called once, by the side whose
    shm_op_mark saw the other's bit (the completer or Work.get_future).
    Callbacks run here; an error escaping one (SystemExit included) is logged, never allowed to
    end the thread that runs the group's ops."""
    with gil:
        call = <_Call>o.call  # a reference: dropping the pin below cannot free it under us
        try:
            if call.error is not None:
                call.future.set_exception(call.error)
            else:
                call.future.set_result(call.results())
        except BaseException as exc:  # noqa: BLE001 - see the docstring
            _fut_log_callback_error(call.future, exc)
        finally:
            call.pin = None
