# Communicator: one group's shared segment and the step protocol every collective is built on.
#
# Step protocol. Each rank owns a monotonically increasing `seq` in its control block and two data
# slots, used by step parity. One step: write your own slot (and descriptor), publish seq = s
# (release), wait until every peer's seq >= s (acquire), then read peers' slots. A rank publishes s
# only after it finished reading step s-1, so writing slot[s % 2] at step s never races a reader of
# step s-2: no trailing barrier is needed. The first step of every collective also carries a
# descriptor (what was called, dtype, size, root, op) that every rank checks against all others,
# so a mismatch raises CollectiveMismatchError on every rank instead of returning corrupt data.
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memmove
from posix.signal cimport kill
from posix.unistd cimport getpid
from cpython.exc cimport PyErr_CheckSignals

cdef uint64_t SLICE_NS = 50 * 1000 * 1000  # futex sleep slice: how often health is checked
cdef uint64_t SPIN_FLOOR_NS = 20 * 1000     # adaptive spinning never goes below this budget

# Descriptor words: kind, dtype, nbytes, root, op, extra.
cdef enum:
    K_BARRIER = 1
    K_ALL_REDUCE
    K_BROADCAST
    K_REDUCE
    K_ALL_GATHER
    K_GATHER
    K_SCATTER
    K_REDUCE_SCATTER
    K_ALL_TO_ALL
    K_ALL_TO_ALL_V
    K_ALLOC

KIND_NAMES = {K_BARRIER: "barrier", K_ALL_REDUCE: "all_reduce", K_BROADCAST: "broadcast",
              K_REDUCE: "reduce", K_ALL_GATHER: "all_gather", K_GATHER: "gather",
              K_SCATTER: "scatter", K_REDUCE_SCATTER: "reduce_scatter",
              K_ALL_TO_ALL: "all_to_all", K_ALL_TO_ALL_V: "all_to_all_single",
              K_ALLOC: "empty/zeros"}
OP_NAMES = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR")


cdef inline size_t _align_up(size_t x, size_t a) noexcept nogil:
    return (x + a - 1) // a * a


def _env_bytes(str var, size_t default, size_t minimum):
    raw = os.environ.get(var)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{var} must be an integer number of bytes, got {raw!r}") from None
    if value < <long long>minimum:
        raise ValueError(f"{var} must be at least {minimum}, got {value}")
    return value


_llc_bytes = None


def _last_level_cache_bytes():
    """Size of the largest cache cpu0 sees (sysfs, read once; glibc's sysconf reports the whole
    package's on some VMs, 10x too much); 32 MiB when unknown."""
    global _llc_bytes
    if _llc_bytes is not None:
        return _llc_bytes
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        names = os.listdir(base)
    except OSError:
        names = []
    for name in names:
        try:
            with open(f"{base}/{name}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text[:-1] if scale != 1 else text
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    _llc_bytes = best or 32 << 20
    return _llc_bytes


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
    cdef uint64_t deadline_ns
    cdef readonly double timeout
    cdef int *pidfds
    cdef int *pids
    cdef const void **srcs
    cdef char **ptrs
    cdef size_t *sizes
    cdef object broken
    cdef str op_name
    cdef bint closed
    cdef int heap_count
    cdef list heaps            # (weakref to Segment, heap id, stride) of sc.empty segments
    cdef size_t heap_stride_now
    cdef char *scratch            # private cache-sized buffer for single-copy reductions
    cdef size_t scratch_bytes
    cdef char *staging            # kept across calls (no page faults): in-place all_to_all's input copy
    cdef size_t staging_bytes
    cdef readonly size_t stream_bytes  # results this large go out with streaming stores
    cdef bint cma_ok              # single-copy reads from peers work here (probed at start)
    cdef readonly size_t cma_bytes  # pieces at least this large use them
    cdef public bint background  # ops run on the progress thread (set by shmcomm.work.OpQueue)
    # Ops handed to the group's progress thread, and how many of those finished (each counter has
    # one writer: the issuing thread, the progress thread). Equal: a synchronous op may run inline.
    cdef public unsigned long long submitted
    cdef public unsigned long long completed

    def __cinit__(self):
        self.pidfds = NULL
        self.pids = NULL
        self.srcs = NULL
        self.ptrs = NULL
        self.sizes = NULL
        self.scratch = NULL
        self.scratch_bytes = 0
        self.staging = NULL
        self.staging_bytes = 0
        self.closed = True

    def __init__(self, str job, str part, int rank, int size, double timeout):
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
        self.op_name = "init"
        self.small_bytes = _env_bytes("SHMCOMM_SMALL_BYTES", 16384, 0)
        # Outputs from half the last-level cache up are written with streaming stores; smaller
        # ones stay cached where the caller reads them next (on a 32 MiB-L3 VM, all_gather: 8 MiB
        # streamed 0.6-2.3 ms vs 0.7-0.8 ms, 32 MiB 3.8-4.3 ms vs 4.7-5.2 ms). Reductions, whose
        # outputs are their inputs and still cached, never stream (16 MiB zero-copy all_reduce:
        # 1.69-1.73 ms streamed vs 1.38-1.61 ms).
        self.stream_bytes = _env_bytes("SHMCOMM_STREAM_BYTES", _last_level_cache_bytes() // 2, 0)
        usable = len(os.sched_getaffinity(0))
        # Ranks that fit the cores spin up to 2 ms before sleeping: a futex wake-up costs tens of
        # microseconds, and far more when another process holds the core (measured: 8 B
        # all_reduce beside a busy loop, 400 us with a 50 us spin, 0.7 us with 5 ms). A rank
        # blocked for seconds still sleeps almost all the time. More ranks than cores: never spin.
        spin_us = _env_bytes("SHMCOMM_SPIN_US", 2000 if size <= usable else 0, 0)
        self.spin_ns = self.spin_max_ns = spin_us * 1000
        # More ranks than cores: the peer we wait for needs our core, so give it away with
        # sched_yield for a while (a few hundred microseconds) before sleeping on the futex.
        self.yields = _env_bytes("SHMCOMM_YIELDS", 16 if size <= usable else 256, 0)
        self.pidfds = <int *>malloc(size * sizeof(int))
        self.pids = <int *>malloc(size * sizeof(int))
        self.srcs = <const void **>malloc(size * sizeof(void *))
        self.ptrs = <char **>malloc(2 * size * sizeof(char *))
        self.sizes = <size_t *>malloc(2 * size * sizeof(size_t))
        if not (self.pidfds and self.pids and self.srcs and self.ptrs and self.sizes):
            raise MemoryError()
        for r in range(size):
            self.pidfds[r] = -1
            self.pids[r] = 0
        self._rendezvous(_env_bytes("SHMCOMM_SLOT_BYTES", 1 << 20, 4096),
                         _env_bytes("SHMCOMM_RING_BYTES", 256 << 10, 4096))
        self.closed = False

    # ---- layout -------------------------------------------------------------------------------
    cdef size_t _layout(self, size_t slot_bytes, size_t ring_bytes):
        cdef size_t n = self.size
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
    cdef _rendezvous(self, size_t slot_bytes, size_t ring_bytes):
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
            self.hdr.cma_bytes = _env_bytes("SHMCOMM_CMA_BYTES", 256 << 10, 0)
            self.hdr.nonce = int.from_bytes(os.urandom(8), "little")
            _copy_text(self.hdr.job, self.job, 127)
            _copy_text(self.hdr.boot_id, boot, 63)
            _copy_text(self.hdr.hostname, host, 63)
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
        # Algorithm choices depend on these, so every rank takes rank 0's values.
        self.small_bytes = self.hdr.small_bytes
        self.cma_bytes = self.hdr.cma_bytes
        self.cma_ok = self.cma_bytes > 0 and self._probe_cma()
        capi.shm_store_seq_cst(&self.cb(self.rank).cma_ok, self.cma_ok)  # senders of p2p look

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
            seg = None
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"rank {self.rank} found no segment from rank 0 of job {self.job!r} within "
                    f"{self.timeout} s: is rank 0 running, on this machine, with the same job name?")
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
            PyErr_CheckSignals()

    cdef bint _creator_alive(self, int pid):
        return pid > 0 and (kill(pid, 0) == 0 or errno != 3)  # ESRCH

    cdef _register(self):
        cdef capi.shm_cb_t *me = self.cb(self.rank)
        if me.state == SHM_RANK_ATTACHED and me.pid > 0 and kill(me.pid, 0) == 0:
            raise ShmcommError(f"rank {self.rank} of job {self.job!r} is already taken by pid "
                               f"{me.pid}: two processes were given the same rank")
        me.pid = getpid()
        me.probe_addr = <uint64_t>&me.pid
        capi.shm_store_seq_cst(&me.state, SHM_RANK_ATTACHED)
        cdef uint32_t joined = capi.shm_fetch_add(&self.hdr.attached, 1) + 1
        capi.shm_futex_wake_all(&self.hdr.attached)
        if joined == <uint32_t>self.size:
            self.seg.unlink_name()  # everyone is in: the name is no longer needed

    cdef _wait_all_attached(self, double deadline):
        cdef uint32_t target = self.size
        while not capi.shm_wait_geq(&self.hdr.attached, target, &self.hdr.attached_waiters,
                                     0, 1, SLICE_NS // 5):
            PyErr_CheckSignals()
            if not self._creator_alive(self.hdr.creator_pid):
                raise PeerFailureError(f"rank 0 (pid {self.hdr.creator_pid}) died during start-up",
                                       0, self.hdr.creator_pid)
            if time.monotonic() > deadline:
                missing = [r for r in range(self.size) if self.cb(r).state != SHM_RANK_ATTACHED]
                raise CommTimeoutError(
                    f"init_process_group timed out after {self.timeout} s: rank(s) {missing} of job "
                    f"{self.job!r} never joined (same job name and world size on every rank?)")

    # ---- waiting and health -------------------------------------------------------------------
    cdef bint _peer_dead(self, int r) noexcept nogil:
        if self.pidfds[r] >= 0:
            return capi.shm_pidfd_exited(self.pidfds[r])
        return kill(self.pids[r], 0) != 0 and errno == 3

    cdef object _fail(self, object exc):
        """Remember why the group broke (a step was left half done) and return the error."""
        self.broken = exc
        return exc

    cdef int _check_health(self, int peer, uint32_t target) except -1 nogil:
        """Raise if the group is aborted, a peer we wait for is gone, the deadline passed, or a
        Python signal handler raised. peer < 0: every peer whose seq is behind `target`."""
        cdef int r, first, last
        if capi.shm_load_acquire(&self.hdr.abort_flag):
            with gil:
                raise self._fail(AbortedError(f"{self.op_name}: the group was aborted"))
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
                    raise self._fail(PeerFailureError(
                        f"{self.op_name}: rank {r} (pid {self.pids[r]}) died or left the group",
                        r, self.pids[r]))
        if capi.shm_now_ns() > self.deadline_ns:
            with gil:
                raise self._fail(CommTimeoutError(
                    f"{self.op_name} timed out after {self.timeout} s on rank {self.rank} "
                    f"waiting for {'rank %d' % peer if peer >= 0 else 'its peers'}"))
        with gil:
            try:
                PyErr_CheckSignals()
            except BaseException as exc:
                self._fail(ShmcommError(f"{self.op_name} interrupted: {exc!r}"))
                raise
        return 0

    cdef int _wait(self, uint32_t *word, uint32_t target, uint32_t *waiters, int peer) except -1 nogil:
        # On the progress thread the caller is computing: sleep soon, leave it the core.
        cdef uint64_t spin = 0 if self.background else self.spin_ns
        cdef int got = capi.shm_wait_geq(word, target, waiters, spin, self.yields, SLICE_NS)
        if spin:
            # Adaptive spinning: a wait that ended while spinning says peers answer within the
            # budget, so keep (regrow) it; one that had to sleep says the budget only burnt a
            # core somebody else needed (a loaded machine), so halve it, down to a floor.
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

    cdef int _begin(self, str op_name) except -1:
        if self.closed:
            raise ShmcommError(f"{op_name}: the process group was destroyed")
        if capi.shm_load_acquire(&self.hdr.abort_flag):
            raise AbortedError(f"{op_name}: the group was aborted")
        if self.broken is not None:
            raise ShmcommError(f"{op_name}: the group is unusable after an earlier failure: "
                               f"{self.broken}") from self.broken
        self.op_name = op_name
        self.deadline_ns = capi.shm_now_ns() + <uint64_t>(self.timeout * 1e9)
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
                    with gil:
                        raise CollectiveMismatchError(self._mismatch_text())
        return 0

    cdef str _mismatch_text(self):
        lines = []
        for q in range(self.size):
            d = self.cb(q).desc[self.step & 1]
            kind = KIND_NAMES.get(d[0], f"kind {d[0]}")
            args = []
            if d[0] not in (K_BARRIER, K_ALLOC):
                args.append(f"dtype={DTYPE_NAMES[d[1]] if d[1] < len(DTYPE_NAMES) else d[1]}")
            if d[0] != K_BARRIER:
                args.append(f"nbytes={d[2]}")
            if d[0] in (K_BROADCAST, K_REDUCE, K_GATHER, K_SCATTER):
                args.append(f"root={d[3]}")
            if d[0] in (K_ALL_REDUCE, K_REDUCE, K_REDUCE_SCATTER):
                args.append(f"op={OP_NAMES[d[4]] if d[4] < len(OP_NAMES) else d[4]}")
            lines.append(f"rank {q}: {kind}({', '.join(args)})")
        return "ranks called different collectives or arguments:\n  " + "\n  ".join(lines)

    cdef inline void _slice(self, size_t count, int q, int itemsize, size_t *lo, size_t *hi) noexcept nogil:
        """Bounds of rank q's share of `count` elements, cache-line aligned."""
        cdef size_t align = 64 // itemsize if itemsize < 64 else 1
        cdef size_t per = _align_up((count + self.size - 1) // self.size, align)
        lo[0] = min(q * per, count)
        hi[0] = min(lo[0] + per, count)

    # ---- algorithms on raw pointers (no GIL) --------------------------------------------------
    cdef int _reduce(self, char *ptr, size_t count, int itemsize, int dtype, int op, int root,
                     uint64_t heap, uint64_t heap_off) except -1 nogil:
        """all_reduce when root < 0, else reduce to root. Small: one shot through the slots. Large:
        a descriptor-only first step, then zero copy when every rank passed an array at the same
        place of one shared heap (sc.empty), else pipelined reduce-scatter + all-gather."""
        cdef int n = self.size, q, i
        cdef uint32_t s
        cdef size_t nbytes = count * itemsize, chunk, c, off = 0, lo, hi
        cdef bint wants = root < 0 or root == self.rank
        cdef bint cma, first
        self._set_desc(K_ALL_REDUCE if root < 0 else K_REDUCE, dtype, nbytes, <uint64_t>root, op)
        if nbytes <= self.small_bytes or nbytes <= <size_t>(64 * n):
            s = self.next_step()
            memcpy(self.slot(self.rank, s), ptr, nbytes)
            self._step()
            self._check_desc()
            if wants:
                for q in range(n):
                    self.srcs[q] = self.slot(q, s)
                shm_reduce(ptr, self.srcs, n, count, dtype, op)
            return 0
        # Below the single-copy size the descriptor rides on the first chunk's step (no zero copy
        # there: one sync fewer matters more at these sizes); above it, a step of its own first.
        first = nbytes < self.cma_bytes
        if not first:
            self._set_heap_desc(heap, heap_off)
            if nbytes >= self.cma_bytes > 0:
                cma = self._publish_table(&ptr, 1)  # the step that carries the descriptor, too
            else:
                self._step()
                self._check_desc()
                cma = False
            if heap and self._all_same_heap():
                return self._reduce_zero_copy(ptr, count, itemsize, dtype, op, root, heap_off)
            if cma:
                for q in range(n):
                    self.ptrs[q] = <char *>self._peer_entry(q, 0)
                return self._reduce_single_copy(ptr, count, itemsize, dtype, op, root)
        chunk = self.slot_bytes // itemsize
        while off < count:
            c = min(chunk, count - off)
            s = self.next_step()
            self._slice(c, self.rank, itemsize, &lo, &hi)
            # Peers need every part of this chunk but this rank's own slice: copy only those.
            memcpy(self.slot(self.rank, s), ptr + off * itemsize, lo * itemsize)
            memcpy(self.slot(self.rank, s) + hi * itemsize, ptr + (off + hi) * itemsize, (c - hi) * itemsize)
            self._step()
            if first:
                self._check_desc()
                first = False
            for q in range(n):
                self.srcs[q] = self.slot(q, s) + lo * itemsize
            self.srcs[self.rank] = ptr + (off + lo) * itemsize
            shm_reduce(self.slot(self.rank, s + 1) + lo * itemsize, self.srcs, n, hi - lo, dtype, op)
            self._step()
            if wants:
                for i in range(n):
                    q = (self.rank + i) % n
                    self._slice(c, q, itemsize, &lo, &hi)
                    memcpy(ptr + (off + lo) * itemsize, self.slot(q, s + 1) + lo * itemsize,
                           (hi - lo) * itemsize)
            off += c
        return 0

    cdef void _set_heap_desc(self, uint64_t heap, uint64_t heap_off) noexcept nogil:
        cdef uint64_t *d = self.cb(self.rank).desc[(self.step + 1) & 1]
        d[5] = heap; d[6] = heap_off

    cdef bint _all_same_heap(self) noexcept nogil:
        cdef uint64_t *mine = self.cb(self.rank).desc[self.step & 1]
        cdef uint64_t *theirs
        for q in range(self.size):
            theirs = self.cb(q).desc[self.step & 1]
            if theirs[5] != mine[5] or theirs[6] != mine[6]:
                return False
        return True

    cdef int _reduce_zero_copy(self, char *ptr, size_t count, int itemsize, int dtype, int op,
                               int root, uint64_t heap_off) except -1 nogil:
        """Every rank's array is visible here: rank r reduces slice r straight from all of them and
        writes the result into every array that wants it (one read and one write per byte)."""
        cdef int n = self.size, q, i
        cdef size_t lo, hi, block = (256 << 10) // itemsize, b, m
        cdef char *first = ptr - self.rank * self.heap_stride_now  # rank 0's array
        self._slice(count, self.rank, itemsize, &lo, &hi)
        b = lo
        while b < hi:
            m = min(block, hi - b)
            for q in range(n):
                self.srcs[q] = first + q * self.heap_stride_now + b * itemsize
            if root < 0:
                shm_reduce(ptr + b * itemsize, self.srcs, n, m, dtype, op)
                for i in range(1, n):
                    q = (self.rank + i) % n
                    memcpy(first + q * self.heap_stride_now + b * itemsize, ptr + b * itemsize, m * itemsize)
            else:
                shm_reduce(first + root * self.heap_stride_now + b * itemsize, self.srcs, n, m, dtype, op)
            b += m
        self._step()  # every slice written before anyone returns
        return 0

    cdef int _reduce_single_copy(self, char *ptr, size_t count, int itemsize, int dtype, int op,
                                 int root) except -1 nogil:
        """Private arrays at self.ptrs[q], cross-memory attach on: rank r reduces slice r block by
        block, reading peers' parts through a cache-sized scratch, and writes each result block,
        still in cache, into every array that wants it (its own in place; peers' remotely). Only
        rank r touches slice r of any array, so one step at the end is the only sync; non-root
        arrays of reduce stay as they were."""
        cdef int n = self.size, q, i
        cdef size_t block = (128 << 10) // itemsize, lo = 0, hi = 0, b, m
        cdef size_t block_bytes = block * itemsize
        cdef char *scratch = self._scratch(n * block_bytes)  # n - 1 inputs and one output
        cdef char *part
        cdef char *out
        cdef bint mine = root < 0 or root == self.rank
        self._slice(count, self.rank, itemsize, &lo, &hi)
        b = lo
        while b < hi:
            m = min(block, hi - b)
            part = scratch
            for q in range(n):
                if q == self.rank:
                    self.srcs[q] = ptr + b * itemsize
                else:
                    self._cma(q, part, <uint64_t>self.ptrs[q] + b * itemsize, m * itemsize, False)
                    self.srcs[q] = part
                    part += block_bytes
            out = ptr + b * itemsize if mine else part  # in place is fine: element-wise
            shm_reduce(out, self.srcs, n, m, dtype, op)
            for i in range(1, n):
                q = (self.rank + i) % n
                if root < 0 or q == root:
                    self._cma(q, out, <uint64_t>self.ptrs[q] + b * itemsize, m * itemsize, True)
            b += m
        self._step()  # every slice written, and arrays untouched until every rank is done
        return 0

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
        self._step()
        self._check_desc()
        for q in range(self.size):
            if not (<uint64_t *>self.slot(q, s))[0]:
                return False
        return True

    cdef inline uint64_t _peer_entry(self, int q, int i) noexcept nogil:
        return (<uint64_t *>self.slot(q, self.step))[1 + i]

    cdef int _cma(self, int q, char *local, uint64_t remote, size_t n, bint write) except -1 nogil:
        """Copy n bytes between ``local`` and address ``remote`` of rank q (write: to rank q)."""
        cdef int err
        if n == 0:
            return 0
        if write:
            err = capi.shm_cma_write(self.pids[q], local, remote, n)
        else:
            err = capi.shm_cma_read(self.pids[q], local, remote, n)
        if err:
            with gil:
                if err == 3:  # ESRCH
                    raise self._fail(PeerFailureError(f"{self.op_name}: rank {q} (pid {self.pids[q]}) "
                                                      f"died", q, self.pids[q]))
                raise self._fail(ShmcommError(f"{self.op_name}: {'writing' if write else 'reading'} "
                                              f"rank {q}'s memory failed: {_os_error_text(err)}"))
        return 0

    cdef int _broadcast(self, char *ptr, size_t nbytes, int dtype, int root) except -1 nogil:
        cdef uint32_t s
        cdef size_t off = 0, c, split
        cdef int q
        cdef bint first = True
        self._set_desc(K_BROADCAST, dtype, nbytes, root, 0)
        if nbytes >= self.cma_bytes > 0:
            first = False
            if self._publish_table(&ptr, 1):
                # The root would idle while receivers pull: it pushes the last 1/n of the array
                # into every receiver (writes), each receiver pulls the rest, so all cores copy.
                split = (nbytes - nbytes // self.size) & ~(<size_t>4095)
                if self.rank != root:
                    self._cma(root, ptr, self._peer_entry(root, 0), split, False)
                else:
                    for q in range(self.size):
                        if q != root:
                            self._cma(q, ptr + split, self._peer_entry(q, 0) + split, nbytes - split, True)
                self._step()
                return 0
        while first or off < nbytes:
            c = min(self.slot_bytes, nbytes - off)
            s = self.next_step()
            if self.rank == root:
                memcpy(self.slot(root, s), ptr + off, c)
            self._step()
            if first:
                self._check_desc()
                first = False
            if self.rank != root:
                self._out(ptr + off, self.slot(root, s), c, nbytes)
            off += c
        return 0

    cdef int _gather(self, char **outs, char *inp, size_t nbytes, int dtype, int root) except -1 nogil:
        """all_gather when root < 0 (outs on every rank), else gather to root (outs on root only)."""
        cdef uint32_t s
        cdef size_t off = 0, c
        cdef int i, q, n = self.size
        cdef bint first = True, wants = root < 0 or root == self.rank
        self._set_desc(K_ALL_GATHER if root < 0 else K_GATHER, dtype, nbytes, <uint64_t>root, 0)
        if nbytes >= self.cma_bytes > 0 and root >= 0:
            # gather: the root publishes its outputs and every other rank writes its piece there
            # while the root copies its own, so all cores copy at once instead of the root alone.
            first = False
            if self._publish_table(outs if wants else &inp, n if wants else 1):
                if wants:
                    self._out(outs[self.rank], inp, nbytes, nbytes)
                else:
                    self._cma(root, inp, self._peer_entry(root, self.rank), nbytes, True)
                self._step()
                return 0
        elif nbytes >= self.cma_bytes > 0:
            first = False
            if self._publish_table(&inp, 1):
                if wants:
                    for i in range(1, n):
                        q = (self.rank + i) % n
                        self._cma(q, outs[q], self._peer_entry(q, 0), nbytes, False)
                    self._out(outs[self.rank], inp, nbytes, nbytes)
                self._step()
                return 0
        while first or off < nbytes:
            c = min(self.slot_bytes, nbytes - off)
            s = self.next_step()
            memcpy(self.slot(self.rank, s), inp + off, c)
            self._step()
            if first:
                self._check_desc()
                first = False
            if wants:
                for i in range(n):
                    q = (self.rank + i) % n
                    if q == self.rank:
                        self._out(outs[q] + off, inp + off, c, nbytes)
                    else:
                        self._out(outs[q] + off, self.slot(q, s), c, nbytes)
            off += c
        return 0

    cdef int _scatter(self, char *out, char **ins, size_t nbytes, int dtype, int root) except -1 nogil:
        cdef uint32_t s
        cdef size_t off = 0, c, cap = (self.slot_bytes // self.size) // 64 * 64
        cdef int q
        cdef bint first = True
        self._set_desc(K_SCATTER, dtype, nbytes, root, 0)
        if nbytes >= self.cma_bytes > 0:
            first = False
            if self._publish_table(ins if self.rank == root else NULL, self.size):
                if self.rank == root:
                    self._out(out, ins[root], nbytes, nbytes)
                else:
                    self._cma(root, out, self._peer_entry(root, self.rank), nbytes, False)
                self._step()
                return 0
        while first or off < nbytes:
            c = min(cap, nbytes - off)
            s = self.next_step()
            if self.rank == root:
                for q in range(self.size):
                    if q != root:
                        memcpy(self.slot(root, s) + q * cap, ins[q] + off, c)
            self._step()
            if first:
                self._check_desc()
                first = False
            if self.rank == root:
                self._out(out + off, ins[root] + off, c, nbytes)
            else:
                self._out(out + off, self.slot(root, s) + self.rank * cap, c, nbytes)
            off += c
        return 0

    cdef int _reduce_scatter(self, char *out, char **ins, size_t count, int itemsize, int dtype,
                             int op) except -1 nogil:
        """out = op over ranks of ins[rank]; each ins[q] holds `count` elements."""
        cdef uint32_t s
        cdef int q, n = self.size
        cdef size_t cap = ((self.slot_bytes // n) // 64 * 64) // itemsize, off = 0, c
        cdef bint first = True
        self._set_desc(K_REDUCE_SCATTER, dtype, count * itemsize, 0, op)
        while first or off < count:
            c = min(cap, count - off)
            s = self.next_step()
            for q in range(n):
                if q != self.rank:
                    memcpy(self.slot(self.rank, s) + q * cap * itemsize, ins[q] + off * itemsize,
                           c * itemsize)
            self._step()
            if first:
                self._check_desc()
                first = False
            for q in range(n):
                if q == self.rank:
                    self.srcs[q] = ins[q] + off * itemsize
                else:
                    self.srcs[q] = self.slot(q, s) + self.rank * cap * itemsize
            shm_reduce(out + off * itemsize, self.srcs, n, c, dtype, op)
            off += c
        return 0

    cdef int _all_to_all(self, char **outs, char **ins, size_t *in_bytes, size_t *out_bytes,
                         int dtype, bint uniform) except -1 nogil:
        """outs[q] <- peer q's ins[rank]. Uniform: every piece in_bytes[0] bytes. Otherwise a first
        step exchanges every rank's split sizes so each rank checks the whole matrix."""
        cdef uint32_t s
        cdef int q, a, b, i, n = self.size
        cdef size_t cap = (self.slot_bytes // n) // 64 * 64, off = 0, c, most = 0, pending
        cdef uint64_t *sizes
        cdef bint first = True, fits
        cdef size_t header = _align_up((2 * n + 1) * sizeof(uint64_t), 64)
        cdef size_t piece_cap = ((self.slot_bytes - header) // n) // 64 * 64
        if uniform:
            most = in_bytes[0]
            self._set_desc(K_ALL_TO_ALL, dtype, most, 0, 0)
            if most >= self.cma_bytes > 0:
                first = False
                if self._all_to_all_single_copy(outs, ins, in_bytes, out_bytes):
                    return 0
        else:
            # First step: every rank's split sizes (so each checks the whole matrix) and, when
            # all its pieces fit, the pieces themselves: if every rank's fit, that one step is
            # the whole collective.
            self._set_desc(K_ALL_TO_ALL_V, dtype, 0, 0, 0)
            s = self.next_step()
            sizes = <uint64_t *>self.slot(self.rank, s)
            fits = 1
            for q in range(n):
                sizes[q] = in_bytes[q]
                sizes[n + q] = out_bytes[q]
                if in_bytes[q] > piece_cap:
                    fits = 0
            sizes[2 * n] = fits
            if fits:
                for q in range(n):
                    if q != self.rank:
                        memcpy(self.slot(self.rank, s) + header + q * piece_cap, ins[q], in_bytes[q])
            self._step()
            self._check_desc()
            first = False
            for a in range(n):
                for b in range(n):
                    if (<uint64_t *>self.slot(a, s))[b] != (<uint64_t *>self.slot(b, s))[n + a]:
                        with gil:
                            raise CollectiveMismatchError(
                                f"all_to_all_single: rank {a} sends "
                                f"{(<uint64_t *>self.slot(a, s))[b]} bytes to rank {b}, which "
                                f"expects {(<uint64_t *>self.slot(b, s))[n + a]}")
                    most = max(most, (<uint64_t *>self.slot(a, s))[b])
                fits = fits and (<uint64_t *>self.slot(a, s))[2 * n]
            if fits:
                if out_bytes[self.rank] and outs[self.rank] != ins[self.rank]:
                    memmove(outs[self.rank], ins[self.rank], out_bytes[self.rank])
                for q in range(n):
                    if q != self.rank:
                        memcpy(outs[q], self.slot(q, s) + header + self.rank * piece_cap, out_bytes[q])
                return 0
            if most >= self.cma_bytes > 0:  # every rank saw the same matrix: the same choice
                self._set_desc(K_ALL_TO_ALL_V, dtype, 0, 0, 0)  # for the table's step
                if self._all_to_all_single_copy(outs, ins, in_bytes, out_bytes):
                    return 0
        self._out(outs[self.rank], ins[self.rank], out_bytes[self.rank], out_bytes[self.rank])
        while first or off < most:
            s = self.next_step()
            for q in range(n):
                if q != self.rank and in_bytes[q] > off:
                    memcpy(self.slot(self.rank, s) + q * cap, ins[q] + off, min(cap, in_bytes[q] - off))
            self._step()
            if first:
                self._check_desc()
                first = False
            for q in range(n):
                if q != self.rank and out_bytes[q] > off:
                    self._out(outs[q] + off, self.slot(q, s) + self.rank * cap,
                              min(cap, out_bytes[q] - off), out_bytes[q])
            off += cap
        return 0

    cdef inline bint _peers_read(self, int q, char **ins, char **outs) noexcept nogil:
        """Whether input piece q is read by a peer during all_to_all: all are but this rank's own
        piece when it stays exactly in place (it goes nowhere)."""
        return q != self.rank or ins[q] != outs[q]

    cdef bint _all_to_all_single_copy(self, char **outs, char **ins, size_t *in_bytes,
                                      size_t *out_bytes) except -1 nogil:
        """Pull every piece for this rank straight from its sender; False (nothing done) when some
        rank cannot, or some rank's outputs overlap the inputs its peers read (in place: a peer
        could still be reading a piece this rank is overwriting), and the slots must carry it. Its
        own piece may sit exactly in place: no peer reads it."""
        cdef int q, i, n = self.size
        cdef size_t in_lo = <size_t>-1, in_hi = 0, out_lo = <size_t>-1, out_hi = 0
        for q in range(n):  # the address spans of the input pieces peers read, and of the outputs
            if self._peers_read(q, ins, outs):
                in_lo, in_hi = min(in_lo, <size_t>ins[q]), max(in_hi, <size_t>ins[q] + in_bytes[q])
            out_lo, out_hi = min(out_lo, <size_t>outs[q]), max(out_hi, <size_t>outs[q] + out_bytes[q])
        if not self._publish_table(ins, n, in_hi <= out_lo or out_hi <= in_lo):
            return False
        for i in range(1, n):
            q = (self.rank + i) % n
            self._cma(q, outs[q], self._peer_entry(q, self.rank), out_bytes[q], False)
        self._out(outs[self.rank], ins[self.rank], out_bytes[self.rank], out_bytes[self.rank])
        self._step()
        return True

    cdef int _barrier(self) except -1 nogil:
        self._set_desc(K_BARRIER, 0, 0, 0, 0)
        self._step()
        self._check_desc()
        return 0

    # ---- Python-facing entry points: validate, then run without the GIL ------------------------
    cdef int _check_root(self, int root, str argname) except -1:
        if not 0 <= root < self.size:
            raise ValueError(f"{argname} must be a rank in [0, {self.size}), got {root}")
        return 0

    cdef int _check_op(self, int dtype, int op) except -1:
        if not 0 <= op < SHM_NOPS:
            raise ValueError(f"op must be a ReduceOp, got {op}")
        if not shm_reduce_supported(dtype, op):
            if op == SHM_AVG:
                raise TypeError(f"op AVG needs a floating-point or complex dtype, got {DTYPE_NAMES[dtype]}")
            raise TypeError(f"op {OP_NAMES[op]} is not supported for dtype {DTYPE_NAMES[dtype]}")
        return 0

    cpdef all_reduce(self, array, int op=SHM_SUM, bint run=True):
        cdef buf_t b
        cdef uint64_t heap, heap_off
        owner = as_buf(array, &b, True, "array")
        self._check_op(b.dtype, op)
        heap = self._find_heap(b.ptr, b.nbytes, &heap_off)
        if not run:  # validation only: async ops check arguments at the call
            return
        self._begin("all_reduce")
        if self.size > 1:
            with nogil:
                self._reduce(b.ptr, b.count, b.itemsize, b.dtype, op, -1, heap, heap_off)

    cpdef reduce(self, array, int dst, int op=SHM_SUM, bint run=True):
        cdef buf_t b
        cdef uint64_t heap, heap_off
        owner = as_buf(array, &b, True, "array")
        self._check_op(b.dtype, op)
        self._check_root(dst, "dst")
        heap = self._find_heap(b.ptr, b.nbytes, &heap_off)
        if not run:  # validation only: async ops check arguments at the call
            return
        self._begin("reduce")
        if self.size > 1:
            with nogil:
                self._reduce(b.ptr, b.count, b.itemsize, b.dtype, op, dst, heap, heap_off)

    cpdef broadcast(self, array, int src, bint run=True):
        cdef buf_t b
        self._check_root(src, "src")
        owner = as_buf(array, &b, src != self.rank, "array")
        if not run:  # validation only: async ops check arguments at the call
            return
        self._begin("broadcast")
        if self.size > 1:
            with nogil:
                self._broadcast(b.ptr, b.nbytes, b.dtype, src)

    cdef list _fill_ptrs(self, list arrays, buf_t *like, str argname, bint writable, size_t offset):
        """Point self.ptrs[offset + q] at arrays[q], each shaped like `like`."""
        cdef buf_t b
        cdef int q
        if len(arrays) != self.size:
            raise ValueError(f"{argname} must hold world_size={self.size} arrays, got {len(arrays)}")
        owners = []
        for q in range(self.size):
            a = arrays[q]
            owners.append(as_buf(a, &b, writable, f"{argname}[{q}]"))
            if b.nbytes != like.nbytes or b.dtype != like.dtype:
                raise ValueError(f"{argname}[{q}] has {b.count} {DTYPE_NAMES[b.dtype]} elements; expected "
                                 f"{like.count} {DTYPE_NAMES[like.dtype]}")
            self.ptrs[offset + q] = b.ptr
        return owners

    cdef _split_into(self, object arr, buf_t *whole, buf_t *piece, str argname, size_t offset):
        """Point self.ptrs[offset + q] at the q-th of world_size equal parts of `whole`."""
        cdef int q
        if whole.dtype != piece.dtype or whole.count != piece.count * self.size:
            raise ValueError(f"{argname} must hold world_size * {piece.count} = "
                             f"{piece.count * self.size} {DTYPE_NAMES[piece.dtype]} elements, got "
                             f"{whole.count} {DTYPE_NAMES[whole.dtype]}")
        for q in range(self.size):
            self.ptrs[offset + q] = whole.ptr + q * piece.nbytes

    cpdef all_gather(self, list output_list, array, bint run=True):
        cdef buf_t b
        owner = as_buf(array, &b, False, "array")
        owners = self._fill_ptrs(output_list, &b, "output_list", True, 0)
        if not run:  # validation only: async ops check arguments at the call
            return
        self._begin("all_gather")
        with nogil:
            self._gather(self.ptrs, b.ptr, b.nbytes, b.dtype, -1)

    cpdef all_gather_into(self, output, array, bint run=True):
        cdef buf_t b, o
        owner = as_buf(array, &b, False, "array")
        out_owner = as_buf(output, &o, True, "output")
        self._split_into(output, &o, &b, "output", 0)
        if not run:  # validation only: async ops check arguments at the call
            return
        self._begin("all_gather_into")
        with nogil:
            self._gather(self.ptrs, b.ptr, b.nbytes, b.dtype, -1)

    cpdef gather(self, array, gather_list, int dst, bint run=True):
        cdef buf_t b
        self._check_root(dst, "dst")
        owner = as_buf(array, &b, False, "array")
        owners = None
        if self.rank == dst:
            if gather_list is None:
                raise ValueError("gather_list is required on the dst rank")
            owners = self._fill_ptrs(list(gather_list), &b, "gather_list", True, 0)
        elif gather_list is not None:
            raise ValueError("gather_list must be None on ranks other than dst")
        if not run:  # validation only: async ops check arguments at the call
            return
        self._begin("gather")
        with nogil:
            self._gather(self.ptrs, b.ptr, b.nbytes, b.dtype, dst)

    cpdef scatter(self, array, scatter_list, int src, bint run=True):
        cdef buf_t b
        self._check_root(src, "src")
        owner = as_buf(array, &b, True, "array")
        owners = None
        if self.rank == src:
            if scatter_list is None:
                raise ValueError("scatter_list is required on the src rank")
            owners = self._fill_ptrs(list(scatter_list), &b, "scatter_list", False, 0)
        elif scatter_list is not None:
            raise ValueError("scatter_list must be None on ranks other than src")
        if not run:  # validation only: async ops check arguments at the call
            return
        self._begin("scatter")
        with nogil:
            self._scatter(b.ptr, self.ptrs, b.nbytes, b.dtype, src)

    cpdef reduce_scatter(self, output, list input_list, int op=SHM_SUM, bint run=True):
        cdef buf_t o
        out_owner = as_buf(output, &o, True, "output")
        self._check_op(o.dtype, op)
        owners = self._fill_ptrs(input_list, &o, "input_list", False, 0)
        if not run:  # validation only: async ops check arguments at the call
            return
        self._begin("reduce_scatter")
        with nogil:
            self._reduce_scatter(o.ptr, self.ptrs, o.count, o.itemsize, o.dtype, op)

    cpdef reduce_scatter_into(self, output, input, int op=SHM_SUM, bint run=True):
        cdef buf_t o, i
        out_owner = as_buf(output, &o, True, "output")
        in_owner = as_buf(input, &i, False, "input")
        self._check_op(o.dtype, op)
        self._split_into(input, &i, &o, "input", 0)
        if not run:  # validation only: async ops check arguments at the call
            return
        self._begin("reduce_scatter_into")
        with nogil:
            self._reduce_scatter(o.ptr, self.ptrs, o.count, o.itemsize, o.dtype, op)

    cpdef all_to_all(self, list output_list, list input_list, bint run=True):
        cdef buf_t first
        cdef int q
        if len(input_list) != self.size:
            raise ValueError(f"input_list must hold world_size={self.size} arrays, got {len(input_list)}")
        owner = as_buf(input_list[0], &first, False, "input_list[0]")
        in_owners = self._fill_ptrs(input_list, &first, "input_list", False, self.size)
        out_owners = self._fill_ptrs(output_list, &first, "output_list", True, 0)
        for q in range(self.size):
            self.sizes[q] = first.nbytes
            self.sizes[self.size + q] = first.nbytes
        if not run:  # validation only: async ops check arguments at the call
            return
        self._begin("all_to_all")
        with nogil:
            self._all_to_all(self.ptrs, self.ptrs + self.size, self.sizes, self.sizes + self.size,
                             first.dtype, True)

    cdef int _set_splits(self, object splits, buf_t *b, str argname, size_t ptr_base,
                         size_t size_base) except -1:
        """Point self.ptrs[ptr_base + q] at part q of `b` and record its byte size."""
        cdef int q, n = self.size
        cdef size_t off = 0, per
        if splits is None:
            if b.count % n:
                raise ValueError(f"{b.count} elements do not split evenly into world_size={n} "
                                 f"parts; pass {argname}")
            per = b.count // n
            for q in range(n):  # the common case, without building Python lists
                self.ptrs[ptr_base + q] = b.ptr + q * per * b.itemsize
                self.sizes[size_base + q] = per * b.itemsize
            return 0
        splits = [int(x) for x in splits]
        if len(splits) != n or any(x < 0 for x in splits):
            raise ValueError(f"{argname} must be {n} non-negative sizes, got {splits}")
        if sum(splits) != <long long>b.count:
            raise ValueError(f"{argname} sum to {sum(splits)} but the array has {b.count} elements")
        for q in range(n):
            self.ptrs[ptr_base + q] = b.ptr + off * b.itemsize
            self.sizes[size_base + q] = <size_t>splits[q] * b.itemsize
            off += <size_t>splits[q]
        return 0

    cpdef all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, bint run=True):
        cdef buf_t o, i
        cdef int n = self.size
        out_owner = as_buf(output, &o, True, "output")
        in_owner = as_buf(input, &i, False, "input")
        if o.dtype != i.dtype:
            raise ValueError(f"output dtype {DTYPE_NAMES[o.dtype]} differs from input dtype "
                             f"{DTYPE_NAMES[i.dtype]}")
        self._set_splits(output_split_sizes, &o, "output_split_sizes", 0, n)
        self._set_splits(input_split_sizes, &i, "input_split_sizes", n, 0)
        if not run:  # validation only: async ops check arguments at the call
            return
        self._begin("all_to_all_single")
        with nogil:
            if o.ptr < i.ptr + i.nbytes and i.ptr < o.ptr + o.nbytes:
                self._stage_inputs(self.ptrs + n, self.ptrs, self.sizes)
            self._all_to_all(self.ptrs, self.ptrs + n, self.sizes, self.sizes + n, o.dtype, False)

    cdef int _stage_inputs(self, char **ins, char **outs, size_t *in_bytes) except -1 nogil:
        """In place (or overlapping): pieces move between offsets of one array, so a piece could be
        overwritten before it is sent. Send every piece a peer reads from a copy in the kept
        staging buffer."""
        cdef int q
        cdef size_t total = 0
        cdef char *at
        for q in range(self.size):
            if self._peers_read(q, ins, outs):
                total += in_bytes[q]
        at = self._staging(max(total, 1))
        for q in range(self.size):
            if self._peers_read(q, ins, outs):
                memcpy(at, ins[q], in_bytes[q])
                ins[q] = at
                at += in_bytes[q]
        return 0

    cpdef barrier(self, bint run=True):
        if not run:  # validation only: async ops check arguments at the call
            return
        self._begin("barrier")
        if self.size > 1:
            with nogil:
                self._barrier()

    # ---- shared arrays ------------------------------------------------------------------------
    def alloc_shared(self, size_t nbytes_per_rank):
        """Collectively map one new segment holding `nbytes_per_rank` bytes per rank (page aligned);
        returns (Segment, stride). Rank 0 creates it, the others attach, rank 0 unlinks it."""
        from shmcomm.segments import segment_name
        cdef size_t stride = _align_up(max(nbytes_per_rank, 1), 4096)
        cdef Segment seg = None
        self._begin("empty")
        self.heap_count += 1
        name = segment_name(self.job, f"{self.part}.h{self.heap_count}")
        if self.rank == 0:
            seg = Segment.create(name, stride * self.size)
        self._set_desc(K_ALLOC, 0, nbytes_per_rank, 0, 0)
        try:
            with nogil:
                self._step()
                self._check_desc()
            if self.rank != 0:
                seg = Segment.attach(name)
                if seg is None or seg.size != stride * self.size:
                    raise self._fail(ShmcommError(f"empty: cannot attach shared array segment {name}"))
            with nogil:
                self._step()
        finally:
            if seg is not None and self.rank == 0:
                seg.unlink()
        self.heaps = [h for h in self.heaps if h[0]() is not None]
        self.heaps.append((weakref.ref(seg), self.heap_count, stride))
        return seg, stride

    cdef uint64_t _find_heap(self, char *ptr, size_t nbytes, uint64_t *off):
        """Heap id (0: none) of the sc.empty region of this rank holding [ptr, ptr+nbytes)."""
        cdef Segment seg
        cdef char *lo
        for ref, heap_id, stride in self.heaps:
            seg = ref()
            if seg is None:
                continue
            lo = seg.base + self.rank * <size_t>stride
            if lo <= ptr and ptr + nbytes <= lo + <size_t>stride:
                off[0] = ptr - lo
                self.heap_stride_now = stride
                return heap_id
        off[0] = 0
        return 0

    # ---- lifecycle ----------------------------------------------------------------------------
    def abort(self):
        """Abort the group on every rank: pending and later ops raise AbortedError."""
        if self.hdr == NULL:
            return
        capi.shm_store_seq_cst(&self.hdr.abort_flag, 1)
        for r in range(self.size):
            capi.shm_futex_wake_all(&self.cb(r).seq)
            capi.shm_futex_wake_all(&self.cb(r).bell)

    def is_aborted(self):
        return self.hdr != NULL and capi.shm_load_acquire(&self.hdr.abort_flag) != 0

    def close(self):
        """Leave the group: peers still waiting on this rank get PeerFailureError."""
        if self.closed:
            return
        self.closed = True
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
        free(self.pidfds); free(self.pids); free(self.srcs); free(self.ptrs); free(self.sizes)
        free(self.scratch)
        free(self.staging)
