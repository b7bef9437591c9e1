/* Memory ordering and waiting for shmcomm: every atomic and futex call of the runtime lives here.
 *
 * Flags are 32-bit words holding monotonically increasing sequence numbers; a waiter waits for
 * `word >= target` in wrap-around arithmetic, never for equality (cyclic states deadlocked other
 * systems when one rank lapped another). Waiting spins briefly (only when ranks fit the cores),
 * then yields, then sleeps on a process-shared futex for one slice; the caller loops over slices
 * and checks abort, peer liveness, its timeout and Python signals between them.
 */
#ifndef SHMCOMM_SYNC_H
#define SHMCOMM_SYNC_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* process_vm_readv (Python.h defines it too when included first) */
#endif

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static inline uint32_t shm_load_acquire(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline uint32_t shm_load_relaxed(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline uint32_t shm_load_seq_cst(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static inline uint64_t shm_load_acquire64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void shm_store_release64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline uint32_t shm_fetch_add(uint32_t *p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline uint32_t shm_fetch_sub(uint32_t *p, uint32_t v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
static inline void shm_store_seq_cst(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static inline void shm_store_release(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline void shm_store_relaxed(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline int shm_seq_geq(uint32_t a, uint32_t b) { return (int32_t)(a - b) >= 0; }

static inline void shm_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline uint64_t shm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* `seconds` in nanoseconds, saturated as shm_deadline_after's deadline is (UINT64_MAX: never). */
static inline uint64_t shm_span_ns(double seconds) {
    if (seconds >= 1e10) return UINT64_MAX;  /* now + 1e19 ns would come close to wrapping */
    if (!(seconds > 0)) return 0;
    return (uint64_t)(seconds * 1e9);
}

/* The shm_now_ns() at which a wait of `seconds` ends: UINT64_MAX (never) for inf and for any span
 * past about 317 years (torch's "never", timedelta.max, is 8.6e13 s), whose nanoseconds would not
 * fit: converting such a double to uint64_t is undefined in C, and in practice gave a deadline in
 * the past (inf timed out at the first wait slice). At once (now) for 0, negative or nan. */
static inline uint64_t shm_deadline_after(double seconds) {
    uint64_t span = shm_span_ns(seconds);
    return span == UINT64_MAX ? UINT64_MAX : shm_now_ns() + span;
}

/* Shared (not FUTEX_PRIVATE) futex ops: the word lives in memory mapped by several processes. */
static inline void shm_futex_wait(uint32_t *addr, uint32_t expected, uint64_t timeout_ns) {
    struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
    syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static inline void shm_futex_wake_all(uint32_t *addr) { syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

/* Publish a new value and wake sleepers. The seq_cst store orders against the waiter's seq_cst
 * increment of `waiters`, so a sleeper is either seen here or sees the new value itself. */
static inline void shm_publish(uint32_t *word, uint32_t value, uint32_t *waiters) {
    __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(waiters, __ATOMIC_SEQ_CST)) shm_futex_wake_all(word);
}

/* Add one to a doorbell word and wake its sleepers. */
static inline void shm_ring_bell(uint32_t *bell, uint32_t *waiters) {
    __atomic_fetch_add(bell, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(waiters, __ATOMIC_SEQ_CST)) shm_futex_wake_all(bell);
}

/* Word 0 of a rank's descriptor (shm_layout.h): the call's kind in its lower half, the step tag
 * in its upper half. The one place that knows the split. */
static inline uint64_t shm_desc_word0(uint32_t kind, uint32_t step) { return ((uint64_t)step << 32) | kind; }
static inline uint32_t shm_desc_kind(uint64_t word0) { return (uint32_t)word0; }
static inline uint32_t shm_desc_step(uint64_t word0) { return (uint32_t)(word0 >> 32); }

/* A collective step's arrival, as its readers look for it: the upper half of `*tag` (word 0 of
 * the rank's descriptor for the step's parity, shm_layout.h) holds the last step the rank
 * published there, stored after the descriptor and the step's data. One load then brings the
 * arrival and the descriptor together (a cache line per peer per step, not two). */
static inline int shm_step_reached(const uint64_t *tag, uint32_t target) {
    return shm_seq_geq(shm_desc_step(shm_load_acquire64(tag)), target);
}

/* Store step `s` into the upper half of the caller's own `*tag`, keeping the lower half (the
 * descriptor's kind): only this rank writes it, and never a value readers could take for a later
 * step. Release: the descriptor and data written before it are visible to whoever sees `s`. */
static inline void shm_tag_step(uint64_t *tag, uint32_t s) {
    __atomic_store_n(tag, shm_desc_word0(shm_desc_kind(*tag), s), __ATOMIC_RELEASE);
}

static inline int shm_word_reached(const void *word, uint32_t target) {
    return shm_seq_geq(shm_load_acquire((const uint32_t *)word), target);
}

static inline int shm_tag_reached(const void *tag, uint32_t target) {
    return shm_step_reached((const uint64_t *)tag, target);
}

/* One wait slice for `reached(watched, target)`: returns 1 once it holds while spinning (or at
 * once), 2 when it held only after yielding or sleeping, 0 when the slice ended first. Sleeps on
 * the futex word `*sleep_word` (>= target once the writer is done: it stores that word last).
 * spin_ns: busy-poll budget (0 when ranks outnumber cores); yields: sched_yield rounds;
 * sleep_ns: futex sleep of the slice. Inlined with a constant `reached`. */
static inline __attribute__((always_inline)) int shm_wait_until(
        int (*reached)(const void *, uint32_t), const void *watched, uint32_t *sleep_word,
        uint32_t target, uint32_t *waiters, uint64_t spin_ns, int yields, uint64_t sleep_ns) {
    if (reached(watched, target)) return 1;
    if (spin_ns) {
        uint64_t start = shm_now_ns();
        do {
            for (int i = 0; i < 64; i++) {
                shm_cpu_relax();
                if (reached(watched, target)) return 1;
            }
        } while (shm_now_ns() - start < spin_ns);
    }
    for (int i = 0; i < yields; i++) {
        sched_yield();
        if (reached(watched, target)) return 2;
    }
    if (sleep_ns) {
        __atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
        uint32_t seen = __atomic_load_n(sleep_word, __ATOMIC_SEQ_CST);
        if (!shm_seq_geq(seen, target)) shm_futex_wait(sleep_word, seen, sleep_ns);
        __atomic_fetch_sub(waiters, 1, __ATOMIC_SEQ_CST);
    }
    /* the sleep word reached (acquire) implies whatever was stored before it is visible */
    return shm_word_reached(sleep_word, target) || reached(watched, target) ? 2 : 0;
}

/* Wait for `*word >= target` (the futex word itself). */
static inline int shm_wait_geq(uint32_t *word, uint32_t target, uint32_t *waiters,
                               uint64_t spin_ns, int yields, uint64_t sleep_ns) {
    return shm_wait_until(shm_word_reached, word, word, target, waiters, spin_ns, yields, sleep_ns);
}

/* Wait for a peer's step: watch its tag (shm_step_reached), sleep on its `*seq`, which it
 * publishes after the tag (shm_publish wakes the sleepers). */
static inline int shm_wait_step(const uint64_t *tag, uint32_t *seq, uint32_t target, uint32_t *waiters,
                                uint64_t spin_ns, int yields, uint64_t sleep_ns) {
    return shm_wait_until(shm_tag_reached, tag, seq, target, waiters, spin_ns, yields, sleep_ns);
}

/* Busy-poll until the 64-bit `*word` differs from `seen` or `spin_ns` passed; returns 1 if it
 * changed. For a waiter that expects data within microseconds and watches the one word the
 * writer stores anyway (a ring head): no doorbell traffic, no futex. */
static inline int shm_spin_change64(const uint64_t *word, uint64_t seen, uint64_t spin_ns) {
    uint64_t start = shm_now_ns();
    do {
        for (int i = 0; i < 64; i++) {
            shm_cpu_relax();
            if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != seen) return 1;
        }
    } while (shm_now_ns() - start < spin_ns);
    return 0;
}

/* Leave CPU `cpu` for another one this thread may use: the scheduler can keep two ranks on one
 * core for good (their futex wake-ups pull the woken one over, and with busy processes on the
 * other cores the counts already look balanced), so that every step costs a context switch.
 * Narrowing this thread's affinity to the rest of its mask moves it at once; the mask is then
 * restored as it was, so the user's pinning is unchanged. Returns 1 if it moved. */
static inline int shm_move_off_cpu(int cpu) {
    cpu_set_t mask, others;
    if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof mask, &mask) != 0) return 0;
    if (!CPU_ISSET(cpu, &mask) || CPU_COUNT(&mask) < 2) return 0;
    others = mask;
    CPU_CLR(cpu, &others);
    if (sched_setaffinity(0, sizeof others, &others) != 0) return 0;
    sched_setaffinity(0, sizeof mask, &mask);
    return 1;
}

/* Peer liveness: a pidfd becomes readable when its process exits (zombies included, and immune to
 * pid reuse); without pidfds the caller falls back to kill(pid, 0). */
static inline int shm_pidfd_open(int pid) {
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    errno = ENOSYS;
    return -1;
#endif
}

static inline int shm_pidfd_exited(int pidfd) {
    struct pollfd p = {pidfd, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
}

/* Send sig to the process behind pidfd (immune to pid reuse); kill(pid) without pidfds. */
static inline int shm_pidfd_kill(int pidfd, int pid, int sig) {
#ifdef SYS_pidfd_send_signal
    if (pidfd >= 0) return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
#endif
    return kill(pid, sig);
}

/* CPU time process pid has run, in ns (all its threads; the kernel lets any process read it):
 * UINT64_MAX where it cannot be read. A stopped or frozen process's stands still. */
static inline uint64_t shm_process_cpu_ns(int pid) {
    struct timespec ts;
    clockid_t clock;
    if (clock_getcpuclockid(pid, &clock) || clock_gettime(clock, &ts)) return UINT64_MAX;
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Single copy between processes (Linux cross-memory attach): read n bytes at `remote` in process
 * pid into `local` (write: from `local` to `remote`). Returns 0 or an errno (ESRCH: the process
 * is gone; EPERM: not allowed here). */
static inline int shm_cma_copy(int pid, void *local, uint64_t remote, size_t n, int write) {
    while (n) {
        struct iovec mine = {local, n}, far = {(void *)(uintptr_t)remote, n};
        ssize_t got = write ? process_vm_writev(pid, &mine, 1, &far, 1, 0)
                            : process_vm_readv(pid, &mine, 1, &far, 1, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (got == 0) return EFAULT;
        local = (char *)local + got;
        remote += (uint64_t)got;
        n -= (size_t)got;
    }
    return 0;
}

static inline int shm_cma_read(int pid, void *dst, uint64_t remote, size_t n) {
    return shm_cma_copy(pid, dst, remote, n, 0);
}

static inline int shm_cma_write(int pid, const void *src, uint64_t remote, size_t n) {
    return shm_cma_copy(pid, (void *)src, remote, n, 1);
}

#endif
