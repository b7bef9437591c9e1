# Communicator: one group's shared segment, the step protocol every collective is built on, and
# the progress engine that runs the group's operations in issue order.
#
# Step protocol. Each rank owns a monotonically increasing step number, two data slots and two
# descriptors, used by step parity. One step: write your own slot (and descriptor), publish s
# (release) as the tag of that parity's descriptor and then in `seq`, wait until every peer's tag
# >= s (acquire: one cache line per peer brings its arrival and its descriptor; sleepers wait on
# `seq`), then read peers' slots. A rank publishes s only after it finished reading step s-1, so
# writing slot[s % 2] at step s never races a reader of step s-2: no trailing barrier is needed.
# Step numbers are 32-bit, compared wrap-safely, and start 1024 below the wrap (FIRST_STEP). The
# first step of every collective also carries a descriptor (what was called, dtype, size, root,
# op) that every rank checks against all others, so a mismatch raises CollectiveMismatchError on
# every rank instead of returning corrupt data.
#
# Files: this one holds Communicator's fields, layout, inline helpers, lifecycle and the entry
# points; its mechanisms are free functions taking the Communicator, one concern per file:
# joining.pxi (rendezvous), waits.pxi (steps, waits, health, descriptors), leases.pxi (single copy
# and leases), queue.pxi (running ops, the queue, the progress thread), heap.pxi (sc.empty),
# tuning.pxi (what rank 0 measures and chooses as the group runs).
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
# Every group's steps start here, 1024 below where 32-bit step numbers wrap (as Linux starts its
# jiffies just before theirs): every run crosses the wrap early, so a comparison that is not
# wrap-safe fails in every test, not after days of running. Messages count steps from here.
cdef uint32_t FIRST_STEP = 0xfffffc00
cdef uint64_t SPIN_FLOOR_NS = 20 * 1000     # adaptive spinning never goes below this budget
# A wait that slept but ended within this long after its spin budget ran out met a peer that was
# only being woken (a futex wake-up on a VM's idle core takes tens of us): more spinning would
# have caught it. Counting such waits as failures can hold every rank of a large group at the
# floor, each sleeping through every step (see _adapted_spin).
cdef uint64_t WAKE_GRACE_NS = 200 * 1000
cdef int SHARED_WAITS_TO_MOVE = 32         # waits in a row on the peer's core before moving off it
cdef uint64_t MOVE_GAP_NS = 10 * 1000 * 1000  # and at most one such move per this long
cdef uint64_t IDLE_NS = 20 * 1000 * 1000    # after this long without ops the progress thread sleeps
cdef size_t EAGER_BYTES = 256 << 10         # async ops this large start on the progress thread at once
# Collectives attach to peers' memory (single copy) in groups of at most this many ranks. In a
# collective every rank attaches to every peer at once, and pinning the same pages for many
# readers serialises. On 16 cores, 16 ranks were slower with it (all_reduce 256 KiB: 208 us
# against 94; 1 MiB: 559 against 381). At 8 ranks (us per call, slots / single copy): all_reduce
# 256 KiB 87-101 / 167-181, 1 MiB 339-552 / 598-611, 4-16 MiB within the run-to-run spread
# (16 MiB 5190-7100 / 5490-6890), broadcast 4 MiB 905 / 1857, all_gather 4 MiB 646 / 757.
# Point to point has one reader per message and keeps it at any size of group.
cdef int SINGLE_COPY_MAX_RANKS = 4
cdef enum:
    MAX_HEAP_BOUNDS = 128  # live sc.empty heaps whose address ranges are kept in C (heap.pxi)

ctypedef int (*_exec_unchecked_t)(Communicator, op_t *) noexcept nogil
ctypedef int (*_exec_batch_unchecked_t)(Communicator, op_t **, int) noexcept nogil


cdef void _copy_text(char *dst, str text, size_t cap):
    cdef bytes raw = text.encode()[:cap]
    memcpy(dst, <char *>raw, len(raw))
    dst[len(raw)] = 0


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
    cdef int shared_waits        # waits in a row that found the peer on this rank's core
    cdef uint64_t moved_ns       # when this rank last moved off a core it shared (waits.pxi)
    cdef uint64_t deadline_ns
    cdef readonly double timeout
    cdef int *pidfds
    cdef int *pids
    cdef const void **srcs        # reduction inputs: scratch of the op running now
    cdef double *factors          # PREMUL_SUM: each rank's factor, for the op running now
    cdef object broken
    cdef object watch             # start-up only: a derived group's _Derivation (its parent's news)
    cdef const char *op_name
    cdef readonly bint closed
    cdef int heap_count
    # heaps: (weakref to Segment, heap id, stride) of sc.empty segments; heap_borrowers: groups
    # over the same ranks that find those heaps too (lend_heaps, heap.pxi)
    cdef list heaps, heap_borrowers
    cdef uintptr_t heap_bounds[2 * MAX_HEAP_BOUNDS]  # heaps[i]'s part of this rank: [2i, 2i+1) (heap.pxi)
    cdef int n_heap_bounds        # entries of heap_bounds in use; -1: more heaps, heaps is scanned
    cdef char *scratch            # private cache-sized buffer for single-copy reductions
    cdef size_t scratch_bytes
    cdef char *staging            # kept across calls (no page faults): in-place all_to_all's input copy
    cdef size_t staging_bytes
    cdef readonly size_t stream_bytes  # results this large go out with streaming stores
    cdef readonly size_t tune_bytes  # calls this large are tuned as they run (tuning.pxi)
    cdef tuner_t stores           # rank 0: slot copies with normal or streaming stores (tuning.pxi)
    cdef tuner_t paths            # rank 0: large reductions by single copy or the slots
    cdef bint cma_ok              # single-copy reads from peers work here (probed at start)
    cdef readonly size_t cma_bytes  # pieces at least this large use them
    cdef readonly size_t unexpected_bytes  # point to point: unexpected single-copy messages taken
                                  # into private buffers, at most (SHMCOMM_UNEXPECTED_BYTES)
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
    cdef readonly unsigned long long calls_begun  # collectives this rank began on this group (mismatch text)
    cdef readonly unsigned long long fused_calls  # small reductions that ran in a step with others
    cdef readonly unsigned long long background_calls  # queued ops the progress thread ran
    cdef readonly unsigned long long zero_copy_calls  # calls that read or wrote peers' sc.empty arrays in place
    cdef readonly unsigned long long single_copy_reductions  # reductions of private arrays by single copy
    cdef readonly int threads_per_rank  # busy threads per rank (group_settings), kept for derive
    cdef readonly int busy_ranks  # ranks of the job running here: this group's, or its parent's
    # The compositions that may serve this group's calls instead of the flat paths, per kind in
    # the order added (add_route; shmcomm/hierarchy/ installs them): _route_t rows. None until
    # one is added, so a call of a group without any pays one test (registry.pxi's _route).
    cdef list routes
    # Per kind, the fewest bytes any of its routes takes (SIZE_MAX: none): a call below it is
    # flat after one C comparison, without reading the Python rows (a group with a level for
    # its large calls keeps its small ones as fast as a group without).
    cdef size_t route_floor[K_COUNT]
    cdef readonly list levels   # the levels behind the routes: aborted and closed with this group

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
        self.routes = None
        memset(self.route_floor, 0xff, sizeof(self.route_floor))
        self.levels = []

    def __init__(self, str job, str part, int rank, int size, double timeout, secret=None,
                 int threads_per_rank=1, watch=None, busy_ranks=None):
        if size < 1:
            raise ValueError(f"world_size must be >= 1, got {size}")
        if not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, {size}), got {rank}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.rank, self.size, self.job, self.part = rank, size, job, part
        self.timeout = timeout
        self.broken = None
        self.heaps, self.heap_borrowers = [], []
        self.owner_pid = getpid()
        from shmcomm.trust import Credentials, credentials
        # a derived group's (derive) are its parent's: the secret itself is not kept
        self.creds = secret if isinstance(secret, Credentials) else credentials(secret)
        self.threads_per_rank = threads_per_rank
        self.busy_ranks = busy_rank_count(size, busy_ranks)
        settings = group_settings(size, threads_per_rank, self.busy_ranks)
        self.small_bytes = settings["small_bytes"]
        self.stream_bytes = settings["stream_bytes"]
        self.tune_bytes = settings["tune_bytes"]
        self.spin_ns = self.spin_max_ns = settings["spin_us"] * 1000
        self.yields = settings["yields"]
        self.doze_ns = settings["progress_us"] * 1000
        self.unexpected_bytes = settings["unexpected_bytes"]
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
        self.watch = watch  # a derived group's view of its parent (_Derivation)
        try:
            _rendezvous(self, settings["slot_bytes"], settings["ring_bytes"], settings["cma_bytes"])
        finally:
            self.watch = None
        _tune_start(self)
        self.closed = False

    # ---- layout: where _layout (layout.pxi) placed the blocks, rings and slots ---------------
    cdef inline capi.shm_cb_t *cb(self, int r) noexcept nogil:
        return <capi.shm_cb_t *>(self.base + SHM_HEADER_BYTES + r * SHM_CB_BYTES)

    cdef inline char *slot(self, int r, uint32_t s) noexcept nogil:
        return self.base + self.slot_off + (r * 2 + (s & 1)) * self.slot_bytes

    cdef inline capi.shm_ring_t *ring(self, int src, int dst) noexcept nogil:
        return <capi.shm_ring_t *>(self.base + self.ring_off + (src * self.size + dst) * self.ring_stride)

    # ---- the step ---------------------------------------------------------------------------
    cdef inline uint32_t next_step(self) noexcept nogil:
        return self.step + 1

    cdef inline void _set_factor(self, op_t *o) noexcept nogil:
        """PREMUL_SUM: publish this rank's factor with the descriptor of the next step (word 7,
        not compared: each rank may scale its input by its own factor, as in NCCL)."""
        cdef uint64_t *d = self.cb(self.rank).desc[(self.step + 1) & 1]
        if o.op == SHM_PREMUL_SUM:
            memcpy(&d[D_FACTOR], &o.factor, sizeof(double))

    cdef inline void _load_factors(self, op_t *o) noexcept nogil:
        """PREMUL_SUM, after the step that carried the descriptors: every rank's factor, in rank
        order, for the kernel (a peer cannot overwrite them before this rank's next step)."""
        cdef int q
        if o.op == SHM_PREMUL_SUM:
            for q in range(self.size):
                memcpy(&self.factors[q], &self.cb(q).desc[self.step & 1][D_FACTOR], sizeof(double))

    cdef inline void _slice(self, size_t count, int q, int itemsize, size_t *lo, size_t *hi) noexcept nogil:
        """Bounds of rank q's share of `count` elements, cache-line aligned."""
        cdef size_t align = 64 // itemsize if itemsize < 64 else 1
        cdef size_t per = _align_up((count + self.size - 1) // self.size, align)
        lo[0] = min(q * per, count)
        hi[0] = min(lo[0] + per, count)

    # ---- path choice: one place --------------------------------------------------------------
    # Every collective's choice of path reads these; their thresholds are the group's settings
    # (shmcomm/settings.py, whose defaults depend on the rank count) and the rank count here.
    cdef inline bint _single_copy_size(self, size_t nbytes) noexcept nogil:
        """Collective pieces this large go by cross-memory attach (if every rank can) instead of
        the slots; only in groups of up to SINGLE_COPY_MAX_RANKS ranks."""
        return self._single_copy_p2p_size(nbytes) and self.size <= SINGLE_COPY_MAX_RANKS

    cdef inline bint _single_copy_p2p_size(self, size_t nbytes) noexcept nogil:
        """Point-to-point messages this large go by cross-memory attach (one reader each)."""
        return self.cma_bytes > 0 and nbytes >= self.cma_bytes

    cdef inline bint _address_step_size(self, size_t nbytes) noexcept nogil:
        """Arrays this large get a step of their own that publishes where they lie (a peer's
        sc.empty array is then read in place; with single copy on, private arrays too). The
        single-copy size, also when single copy is off (cma_bytes 0: every size, for zero copy)."""
        return nbytes >= self.cma_bytes

    cdef inline bint _address_step_pieces(self, size_t piece) noexcept nogil:
        """``_address_step_size`` for collectives of one piece per rank (gathers,
        reduce_scatter): by the bytes of all pieces, which each rank writes or reads. By the
        piece alone, FSDP2's 128 KiB shards of a 1 MiB layer took no zero copy at 8 ranks
        (they did at 4, as 256 KiB shards)."""
        return self._address_step_size(piece * <size_t>self.size)

    cdef inline bint _one_shot_size(self, size_t nbytes) noexcept nogil:
        """Reductions this small go through the slots in one step (every rank reads every
        rank's message: small_bytes's default shrinks as the group grows, settings.py)."""
        return nbytes <= self.small_bytes and nbytes + 64 <= self.slot_bytes

    # ---- copies out and single-copy tables (the rest of leases: leases.pxi) -----------------
    cdef inline void _out(self, char *dst, const char *src, size_t n, size_t total) noexcept nogil:
        """Copy n bytes of an output of ``total`` bytes in all (overlap allowed): streaming stores
        from stream_bytes up (not for reductions: their outputs are their cached inputs)."""
        shm_move_out(dst, src, n, total >= self.stream_bytes)

    @property
    def slot_stores(self) -> int:
        """Bit b set: calls of size class b (4 KiB << b and up) write their slot copies with
        streaming stores now; rank 0 tunes it as the group runs (tuning.pxi)."""
        return self.hdr.slot_stores if self.hdr != NULL and not self.closed else 0

    @property
    def reduce_paths(self) -> int:
        """Bit b set: reductions of private arrays in size class b go through the slots instead
        of single copy now (rank 0's choice, tuned as the group runs; 0 on other ranks)."""
        return self.paths.own if self.rank == 0 else 0

    def _fix_tuning(self, stores=None, paths=None):
        """Fix the stores mask (0: normal stores for every class, 0xffff: streaming for all)
        and/or the paths mask (0: single copy where it can, 0xffff: the slots), and stop tuning
        them; every rank must call it alike. For benchmarks and tests that compare the ways."""
        if self.hdr == NULL or self.closed:
            return
        if stores is not None:
            _tune_fix(&self.stores, <uint32_t>stores)
        if paths is not None:
            _tune_fix(&self.paths, <uint32_t>paths)

    cdef inline uint64_t _peer_entry(self, int q, int i) noexcept nogil:
        return (<uint64_t *>self.slot(q, self.step))[1 + i]

    cdef inline void _unlease(self) noexcept nogil:
        capi.shm_fetch_sub(&self.cb(self.rank).leases, 1)
        capi.shm_fetch_add(&self.cb(self.rank).lease_progress, 1)  # a withdrawer sees progress

    # ---- the queue (queue.pxi): Python's entry points ------------------------------------------
    def submit(self, fn, tuple args, outputs, bint async_op=False):
        """Run ``fn(*args)`` in issue order (collectives it calls run inside it); a Work if async.

        Example::

            work = comm.submit(lambda: [comm.all_reduce(a) for a in arrays], (), arrays, True)
        """
        cdef _Call call = _open(self, async_op)
        call.o.kind = K_PYTHON
        if call.inline:
            try:
                fn(*args)
            finally:
                _abandon(self, call)
            return None
        call.fn, call.args = fn, args
        return _go(self, call, None, list(outputs))

    def start_issued(self):
        """Let the progress thread start every op queued so far now, whatever its size (by
        default only ops of 256 KiB and more start at once; smaller ones wait for their issuer,
        or for the thread's next look). A level that hands pieces of one call to several groups'
        progress threads calls it so that they run at the same time.

        Example::

            work = comm.all_reduce(piece, async_op=True); comm.start_issued()
        """
        capi.shm_engine_start_issued(&self.engine)

    def rest_until_kicked(self):
        """Let the progress thread rest until an op is started for it (``start_issued``, or a
        waiter's future) instead of looking for queued ops every SHMCOMM_PROGRESS_US: a level's
        lanes, whose every op is started so, then take no core between calls.

        Example::

            lane.rest_until_kicked(); lane.all_reduce(piece, async_op=True); lane.start_issued()
        """
        self.doze_ns = SLICE_NS

    def _progress_loop(self):
        """The group's background thread: runs queued ops nobody is waiting for."""
        with nogil:
            _progress(self)

    def drain(self):
        """Run every queued op to its end (on this thread or the progress thread).

        Example::

            comm.drain()   # before close: nothing of this group is left running
        """
        if self.closed or not self.engine_ready:
            return
        capi.shm_engine_release(&self.engine, _hold_idle(self), 0)
        _prune(self)

    def pending(self):
        """Number of queued ops not yet run to their end.

        Example::

            assert comm.pending() == 0   # after wait() on every Work
        """
        return capi.shm_engine_pending(&self.engine)

    # ---- shared arrays (heap.pxi) -------------------------------------------------------------
    def alloc_shared(self, size_t nbytes_per_rank):
        """Collectively map one new segment holding `nbytes_per_rank` bytes per rank (page aligned);
        returns (Segment, stride). Rank 0 creates it, the others attach, rank 0 unlinks it.

        The segment starts with a header page (magic, a random nonce, the job's tag) that the
        Segment's buffer leaves out; rank 0 also publishes the nonce in its descriptor, which
        lives in the trusted group segment, so a file planted under the heap's name (even one
        of ours, from another job) is refused, never mapped as this group's memory. Its name
        derives from the group's salt (``derived_part``, as sub-groups'): nobody watching
        /dev/shm can plant the next heap's name ahead of rank 0 and so stop the job."""
        return _alloc_shared(self, nbytes_per_rank)

    # ---- lifecycle ----------------------------------------------------------------------------
    def abort(self, str reason=None, cause=None):
        """Abort the group on every rank: pending and later ops raise AbortedError (naming this
        rank and ``reason``, if it is the first to abort). A composition's groups too: a peer may
        be waiting in one of them.

        ``cause``: the exception that made this rank abort. A ``PeerFailureError`` (a rank died)
        makes the others' ops raise ``PeerFailureError`` naming that process, not AbortedError:
        a composition wakes its ranks waiting in other groups so, and they must see the death
        as the ranks that met it do.

        Example::

            comm.abort("stopping")          # every rank: AbortedError("... by rank 0: stopping")
        """
        if self.hdr == NULL or _this_pid != self.owner_pid:
            return
        for level in self.levels:
            level.abort(reason, cause)
        if reason is not None and capi.shm_fetch_add(&self.hdr.abort_claim, 1) == 0:
            _copy_text(self.hdr.abort_reason, reason, 511)
            self.hdr.abort_rank = self.rank
            if isinstance(cause, PeerFailureError):
                self.hdr.abort_peer_pid = cause.pid if cause.pid > 0 else -1
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

    def derive(self, str what, members, timeout=None, int threads_per_rank=0):
        """The group of ``members`` (ranks of this group; member i becomes rank i) made through
        this one: its segment part ``derived_part(what)``, this group's secret, busy threads and
        busy ranks (its waits spin only if this group's would: the other ranks still run here),
        its timeout unless ``timeout`` is given. Its start-up fails at once when a member dies.
        Collective over ``members``: sub-groups and a composition's groups are made this way.
        ``threads_per_rank``: the busy threads per rank its waits count on, when more than this
        group's (a level that runs several groups at once from each rank's own threads).

        Example::

            sub = comm.derive("g3", [0, 2])   # on ranks 0 and 2
        """
        members = list(members)
        part = self.derived_part(what)
        return Communicator(self.job, part, members.index(self.rank),
                            len(members), self.timeout if timeout is None else timeout,
                            secret=self.creds,
                            threads_per_rank=max(threads_per_rank, self.threads_per_rank),
                            watch=_Derivation(self, members, part), busy_ranks=self.busy_ranks)

    def check_alive(self, ranks):
        """Raise PeerFailureError naming the first of ``ranks`` (of this group) whose process
        exited: a sub-group's start-up watches its members through it, so that it fails at
        once when one dies instead of waiting for it the whole timeout.

        Example::

            comm.check_alive([0, 2])
        """
        for r in ranks:
            if r != self.rank and _peer_dead(self, r):
                raise peer_failure("new_group", r, self.pids[r])

    def is_aborted(self):
        return _group_aborted(self)

    cpdef int rank_of_pid(self, int pid):
        """The rank of process ``pid`` in this group, or -1 where it is not a member.

        Example::

            err.rank = comm.rank_of_pid(err.pid)   # a sub-group's PeerFailureError, renumbered
        """
        cdef int r
        if self.pids != NULL:
            for r in range(self.size):
                if self.pids[r] == pid:
                    return r
        return -1

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
            self._close_levels()
            return
        self.refuse_inside_own_operation()
        cdef int claim = SHM_CLAIM_NONE
        try:
            claim = _hold_idle(self)  # queued ops, and one another thread runs, end first
        finally:
            # Closed while this thread holds the engine: an op that starts later fails at once
            # (_begin); none runs on while the pidfds close and peers learn this rank left.
            self.closed = True
            try:
                if claim != SHM_CLAIM_NONE:
                    capi.shm_engine_release(&self.engine, claim, 0)
                    # ops queued meanwhile (their calls got past _open) fail now, not never
                    capi.shm_engine_release(&self.engine, _hold_idle(self), 0)
                    _prune(self)
            finally:
                self._depart()

    cdef _depart(self):
        """The end of close: no op runs any more; peers learn this rank left."""
        _stop_thread(self)
        if self.hdr != NULL:
            capi.shm_store_seq_cst(&self.cb(self.rank).state, SHM_RANK_DEPARTED)
            capi.shm_futex_wake_all(&self.cb(self.rank).seq)
            capi.shm_futex_wake_all(&self.cb(self.rank).bell)
        for r in range(self.size):
            if self.pidfds[r] >= 0:
                close(self.pidfds[r])
                self.pidfds[r] = -1
        self._close_levels()

    cdef _close_levels(self):
        levels, self.levels, self.routes = self.levels, [], None
        memset(self.route_floor, 0xff, sizeof(self.route_floor))
        for level in levels:
            level.close()

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
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_reduce(self, &call.o, array, op, -1, factor)
        except BaseException:
            _abandon(self, call)
            raise
        if self.routes is not None:  # a composition may serve it (registry.pxi)
            level = _first_route(self, &call.o)
            if level is not None:
                _abandon(self, call)
                return level.all_reduce(array, op, async_op, factor)
        return _go(self, call, owners, array, True)

    cpdef reduce(self, array, int dst, int op=SHM_SUM, bint async_op=False, double factor=1.0):
        cdef _Call call = _open(self, async_op)
        try:
            self._check_root(dst, "dst")
            owners = _prep_reduce(self, &call.o, array, op, dst, factor)
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, array, True)

    cpdef broadcast(self, array, int src, bint async_op=False):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_broadcast(self, &call.o, array, src)
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, array, True)

    cpdef all_gather(self, list output_list, array, bint async_op=False):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_gather(self, &call.o, output_list, array, -1, "output_list")
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, output_list)

    cpdef all_gather_into(self, output, array, bint async_op=False):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_gather_into(self, &call.o, output, array)
        except BaseException:
            _abandon(self, call)
            raise
        if self.routes is not None:  # a composition may serve it (registry.pxi)
            level = _first_route(self, &call.o)
            if level is not None:
                _abandon(self, call)
                return level.all_gather_into(output, array, async_op)
        return _go(self, call, owners, output, True)

    cpdef gather(self, array, gather_list, int dst, bint async_op=False):
        cdef _Call call = _open(self, async_op)
        try:
            self._check_root(dst, "dst")
            if self.rank == dst and gather_list is None:
                raise ValueError("gather_list is required on the dst rank")
            if self.rank != dst and gather_list is not None:
                raise ValueError("gather_list must be None on ranks other than dst")
            owners = _prep_gather(self, &call.o, gather_list, array, dst, "gather_list")
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, None if call.inline else gather_list or [])

    cpdef scatter(self, array, scatter_list, int src, bint async_op=False):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_scatter(self, &call.o, array, scatter_list, src)
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, array, True)

    cpdef reduce_scatter(self, output, list input_list, int op=SHM_SUM, bint async_op=False,
                         double factor=1.0):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_reduce_scatter(self, &call.o, output, input_list, op, factor)
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, output, True)

    cpdef reduce_scatter_into(self, output, input, int op=SHM_SUM, bint async_op=False,
                              double factor=1.0):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_reduce_scatter_into(self, &call.o, output, input, op, factor)
        except BaseException:
            _abandon(self, call)
            raise
        if self.routes is not None:  # a composition may serve it (registry.pxi)
            level = _first_route(self, &call.o)
            if level is not None:
                _abandon(self, call)
                return level.reduce_scatter_into(output, input, op, async_op, factor)
        return _go(self, call, owners, output, True)

    cpdef all_to_all(self, list output_list, list input_list, bint async_op=False):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_all_to_all(self, &call.o, output_list, input_list)
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, output_list)

    cpdef all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                            bint async_op=False):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_all_to_all_single(self, &call.o, output, input, output_split_sizes,
                                             input_split_sizes)
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, output, True)

    cpdef all_gather_v(self, output, array, counts, displs=None, bint async_op=False):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_all_gather_v(self, &call.o, output, array, counts, displs)
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, output, True)

    cpdef gather_v(self, array, output, counts, displs, int dst, bint async_op=False):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_gather_v(self, &call.o, array, output, counts, displs, dst)
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, output, True)

    cpdef scatter_v(self, output, input, counts, displs, int src, bint async_op=False):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_scatter_v(self, &call.o, output, input, counts, displs, src)
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, output, True)

    cpdef reduce_scatter_v(self, output, input, counts, int op=SHM_SUM, bint async_op=False,
                           double factor=1.0):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_reduce_scatter_v(self, &call.o, output, input, counts, op, factor)
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, output, True)

    cpdef barrier(self, bint async_op=False):
        cdef _Call call = _open(self, async_op)
        call.o.kind = K_BARRIER
        return _go(self, call, None, [])

    cpdef scan(self, array, int op=SHM_SUM, bint async_op=False):
        return self._prefix(array, op, async_op, False)

    cpdef exscan(self, array, int op=SHM_SUM, bint async_op=False):
        return self._prefix(array, op, async_op, True)

    cdef _prefix(self, array, int op, bint async_op, bint exclusive):
        cdef _Call call = _open(self, async_op)
        try:
            owners = _prep_scan(self, &call.o, array, op, exclusive)
        except BaseException:
            _abandon(self, call)
            raise
        return _go(self, call, owners, array, True)
