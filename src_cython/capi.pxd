# C-level declarations used by the compiled core, declared once (as mpi4py does).
from libc.stdint cimport int32_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "shm_sync.h" nogil:
    uint32_t shm_load_acquire(const uint32_t *p)
    uint32_t shm_load_relaxed(const uint32_t *p)
    uint32_t shm_load_seq_cst(const uint32_t *p)
    uint64_t shm_load_acquire64(const uint64_t *p)
    void shm_store_release64(uint64_t *p, uint64_t v)
    uint32_t shm_fetch_add(uint32_t *p, uint32_t v)
    uint32_t shm_fetch_sub(uint32_t *p, uint32_t v)
    void shm_store_seq_cst(uint32_t *p, uint32_t v)
    void shm_store_relaxed(uint32_t *p, uint32_t v)
    void shm_store_release(uint32_t *p, uint32_t v)
    int shm_seq_geq(uint32_t a, uint32_t b)
    uint64_t shm_now_ns()
    uint64_t shm_span_ns(double seconds)
    uint64_t shm_deadline_after(double seconds)
    void shm_futex_wake_all(uint32_t *addr)
    int shm_move_off_cpu(int cpu)
    void shm_publish(uint32_t *word, uint32_t value, uint32_t *waiters)
    void shm_ring_bell(uint32_t *bell, uint32_t *waiters)
    int shm_wait_geq(uint32_t *word, uint32_t target, uint32_t *waiters,
                     uint64_t spin_ns, int yields, uint64_t sleep_ns)
    uint64_t shm_desc_word0(uint32_t kind, uint32_t step)
    uint32_t shm_desc_kind(uint64_t word0)
    uint32_t shm_desc_step(uint64_t word0)
    int shm_step_reached(const uint64_t *tag, uint32_t target)
    void shm_tag_step(uint64_t *tag, uint32_t s)
    int shm_wait_step(const uint64_t *tag, uint32_t *seq, uint32_t target, uint32_t *waiters,
                      uint64_t spin_ns, int yields, uint64_t sleep_ns)
    int shm_spin_change64(const uint64_t *word, uint64_t seen, uint64_t spin_ns)
    int shm_pidfd_open(int pid)
    int shm_pidfd_exited(int pidfd)
    int shm_pidfd_kill(int pidfd, int pid, int sig)
    uint64_t shm_process_cpu_ns(int pid)
    int shm_cma_read(int pid, void *dst, uint64_t remote, size_t n)
    int shm_cma_write(int pid, const void *src, uint64_t remote, size_t n)


cdef extern from "<sched.h>" nogil:
    int sched_getcpu()


cdef extern from "shm_layout.h" nogil:
    uint64_t SHM_MAGIC, SHM_HEAP_MAGIC
    uint32_t SHM_VERSION
    int SHM_HEADER_BYTES, SHM_CB_BYTES, SHM_RING_CTRL_BYTES, SHM_DESC_WORDS, SHM_P2P_EXPOSURES
    int SHM_RANK_ABSENT, SHM_RANK_ATTACHED, SHM_RANK_DEPARTED

    ctypedef struct shm_header_t:
        uint64_t magic
        uint32_t version
        uint32_t world_size
        uint64_t layout_size
        uint64_t slot_bytes
        uint64_t ring_bytes
        int32_t creator_pid
        uint32_t attached
        uint32_t attached_waiters
        uint32_t abort_flag
        uint64_t nonce
        char job[128]
        char boot_id[64]
        char hostname[64]
        uint64_t small_bytes
        uint64_t cma_bytes
        uint8_t tag[32]
        uint32_t self_made
        uint64_t name_salt
        int32_t abort_rank
        uint32_t abort_claim
        char abort_reason[512]
        int32_t abort_peer_pid
        uint32_t slot_stores

    ctypedef struct shm_heap_header_t:
        uint64_t magic
        uint64_t nonce
        uint8_t tag[32]

    ctypedef struct shm_cb_t:
        uint32_t seq
        uint32_t seq_waiters
        int32_t pid
        uint32_t state
        uint64_t probe_addr
        uint32_t cma_ok
        uint32_t withdrawn
        uint32_t leases
        uint32_t lease_progress
        uint32_t cpu
        uint64_t start_time
        uint64_t desc[2][8]
        uint32_t bell
        uint32_t bell_waiters
        uint64_t not_made
        char not_made_why[232]
        uint32_t exposures[32]  # SHM_P2P_EXPOSURES

    ctypedef struct shm_ring_t:
        uint64_t head
        uint32_t room_wanted
        uint64_t tail


cdef extern from "shm_ring.h" nogil:
    size_t shm_ring_room(shm_ring_t *r, size_t cap, uint64_t head)
    uint64_t shm_ring_write(shm_ring_t *r, size_t cap, uint64_t head, const char *src, size_t n)
    void shm_ring_publish(shm_ring_t *r, uint64_t head)
    size_t shm_ring_avail(shm_ring_t *r, uint64_t tail)
    void shm_ring_peek(shm_ring_t *r, size_t cap, uint64_t pos, char *dst, size_t n)
    uint64_t shm_ring_read(shm_ring_t *r, size_t cap, uint64_t tail, char *dst, size_t n)


cdef extern from "shm_engine.h" nogil:
    enum:
        SHM_OP_QUEUED, SHM_OP_DONE, SHM_OP_FUTURE_WANTED
        SHM_CLAIM_NONE, SHM_CLAIM_OWN, SHM_CLAIM_NESTED
    int shm_op_done(const uint32_t *state)
    uint32_t shm_op_mark(uint32_t *state, uint32_t bit)
    ctypedef struct shm_engine_t:
        uint32_t done
        uint32_t done_waiters
        uint32_t kick
        uint32_t drivers
        uint32_t stop
    int shm_engine_init(shm_engine_t *e)
    void shm_engine_free(shm_engine_t *e)
    void shm_engine_kick(shm_engine_t *e)
    int shm_engine_push(shm_engine_t *e, void *op)
    void *shm_engine_claim(shm_engine_t *e)
    void *shm_engine_peek(shm_engine_t *e, uint64_t i)
    void *shm_engine_claim_ticket_below(shm_engine_t *e, uint64_t tickets)
    uint64_t shm_engine_issued(shm_engine_t *e)
    uint64_t shm_engine_eager_until(shm_engine_t *e)
    void shm_engine_start_issued(shm_engine_t *e)
    int shm_engine_claim_inline(shm_engine_t *e)
    void shm_engine_release(shm_engine_t *e, int claim, int queued)
    int shm_engine_idle(shm_engine_t *e)
    int shm_engine_busy(shm_engine_t *e)
    int shm_engine_held_here(shm_engine_t *e)
    uint64_t shm_engine_pending(shm_engine_t *e)
    void shm_engine_rest(shm_engine_t *e, uint64_t seen_issued, int deep, uint64_t doze_ns, uint64_t slice_ns)


cdef extern from "shm_copy.h" nogil:
    void shm_move_out(char *dst, const char *src, size_t n, int stream)
    void shm_stream_copy(char *dst, const char *src, size_t n)
    void shm_slot_memcpy(char *dst, const char *src, size_t n)


cdef extern from "shm_dtypes.h" nogil:
    # Only the codes the core names itself; the full lists come from the tables (shm_dtypes.h).
    enum:
        SHM_BOOL, SHM_BFLOAT16, SHM_NDTYPES
    enum:
        SHM_SUM, SHM_AVG, SHM_PREMUL_SUM, SHM_NOPS
    const char *shm_dtype_names[]
    const int shm_dtype_itemsizes[]
    const char *shm_op_names[]


cdef extern from "reduce_kernels.h" nogil:
    enum:
        SHM_SIMD_BASELINE, SHM_SIMD_NLEVELS
    const char *shm_simd_names[]
    int shm_simd_level
    int shm_simd_runs(int level)
    int shm_simd_best()
    int shm_reduce_at(int level, void *dst, const void *const *srcs, const double *factors, int n,
                      size_t count, int dtype, int op)
    int shm_reduce(void *dst, const void *const *srcs, const double *factors, int n, size_t count,
                   int dtype, int op)
    int shm_reduce_supported(int dtype, int op)


cdef extern from "<sys/mman.h>" nogil:
    int shm_open(const char *name, int oflag, int mode)
    int shm_unlink(const char *name)
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)
    int PROT_READ, PROT_WRITE, MAP_SHARED
    void *MAP_FAILED


cdef extern from "<fcntl.h>" nogil:
    int O_RDWR, O_CREAT, O_EXCL
    int AT_FDCWD, AT_SYMLINK_FOLLOW
    int posix_fallocate(int fd, long offset, long length)


cdef extern from "<unistd.h>" nogil:
    int linkat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int flags)


cdef extern from "<sys/stat.h>" nogil:
    cdef struct stat:
        long st_size
    int fstat(int fd, stat *buf)
