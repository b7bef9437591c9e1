/* Progress engine of one process group: the queue of issued operations and who runs them.
 *
 * Operations on a group run one at a time, in issue order. Any thread may run the one at the head
 * of the queue: the group's background thread, or a thread that waits for an operation (it
 * drives the queue up to its own instead of handing off and sleeping). A synchronous call claims
 * the engine for itself ("inline") once everything issued before it has run. Everything here
 * runs without the GIL; operations are opaque pointers owned by the caller.
 *
 * Waking the background thread costs a futex syscall (1-3 us) on every submit, more than a whole
 * small collective, and in the common "issue, then wait at once" pattern the waiter runs the op
 * before the thread could start anyway. So while the group is active the thread dozes (a futex
 * wait with a short timeout, default 50 us) and submit only publishes its ticket; the thread
 * sleeps without a timeout, and submit wakes it, only after a quiet spell (IDLE_NS). And it takes only
 * ops issued before its last rest began: a fresh op is the issuing thread's, which waits for it at
 * once or issues more first (on two cores, a background thread competing for the same op
 * measured 3.3x the synchronous time for an 8-byte all_reduce waited at once).
 */
#ifndef SHMCOMM_ENGINE_H
#define SHMCOMM_ENGINE_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shm_sync.h"

/* An op's state word: QUEUED, then DONE (stored by one RMW); FUTURE_WANTED is or-ed in by
 * Work.get_future(). Whichever of the two RMWs comes second sees the other's bit and settles the
 * Future, so the thread completing an op never reads it after DONE unless a Future was wanted
 * (and then the op's _Call pins itself until the Future is settled): once DONE is visible the
 * waiter may free the op. */
enum { SHM_OP_QUEUED = 0, SHM_OP_DONE = 1, SHM_OP_FUTURE_WANTED = 2 };

static inline int shm_op_done(const uint32_t *state) {
    return (__atomic_load_n(state, __ATOMIC_ACQUIRE) & SHM_OP_DONE) != 0;
}

/* Or `bit` into an op's state; returns the state before (acq_rel: results written before a DONE
 * are visible to whoever sees it, and the DONE side sees the want). */
static inline uint32_t shm_op_mark(uint32_t *state, uint32_t bit) {
    return __atomic_fetch_or(state, bit, __ATOMIC_ACQ_REL);
}
enum { SHM_CLAIM_NONE = 0, SHM_CLAIM_OWN = 1, SHM_CLAIM_NESTED = 2 };

/* Queued ops per group at most: a fixed ring, so the thread holding the engine reads it without a
 * lock (a slot is written before `issued` is published with release). A caller that finds it full
 * runs queued ops until there is room (shm_engine_push says EAGAIN). */
#define SHM_ENGINE_CAP 4096u

typedef struct {
    uint64_t reserved;       /* tickets taken by submitting threads (published in order as `issued`) */
    void **slots;            /* ring of queued ops, indexed by ticket % SHM_ENGINE_CAP */
    uint64_t issued;         /* tickets published: slots below it are filled (release/acquire) */
    uint64_t finished;       /* queued ops that ran (written by the engine's holder only) */
    uint32_t busy;           /* 1 while a thread runs an op or holds the engine inline (CAS) */
    pthread_t owner;         /* that thread (valid while busy and owned) */
    uint32_t owned;
    int depth;               /* nested inline claims of the owner (Python ops calling collectives) */
    uint32_t done;           /* bumped after every release: what waiters sleep on (futex word) */
    uint32_t done_waiters;
    uint32_t kick;           /* bumped on submit: what the background thread sleeps on */
    uint32_t kick_waiters;
    uint32_t deep;           /* the background thread sleeps without a timeout: wake it */
    uint32_t drivers;        /* threads waiting in a drive loop: the background thread leaves
                                the queue to them instead of competing for the cores */
    uint32_t stop;
    uint64_t eager_until;    /* tickets below this may start at once (large ops; ops whose Future was asked for) */
} shm_engine_t;

static inline int shm_engine_init(shm_engine_t *e) {
    memset(e, 0, sizeof(*e));
    e->slots = (void **)calloc(SHM_ENGINE_CAP, sizeof(void *));
    return e->slots ? 0 : ENOMEM;
}

static inline void shm_engine_free(shm_engine_t *e) {
    free(e->slots);
    e->slots = NULL;
}

static inline void shm_engine_kick(shm_engine_t *e) {
    __atomic_fetch_add(&e->kick, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&e->deep, __ATOMIC_SEQ_CST) && __atomic_load_n(&e->kick_waiters, __ATOMIC_SEQ_CST))
        shm_futex_wake_all(&e->kick);
}

static inline uint64_t shm_engine_issued(shm_engine_t *e) { return __atomic_load_n(&e->issued, __ATOMIC_ACQUIRE); }
static inline uint64_t shm_engine_eager_until(shm_engine_t *e) { return __atomic_load_n(&e->eager_until, __ATOMIC_ACQUIRE); }
static inline uint64_t shm_engine_finished(shm_engine_t *e) { return __atomic_load_n(&e->finished, __ATOMIC_ACQUIRE); }

/* Queued ops not yet run to their end (a snapshot). */
static inline uint64_t shm_engine_pending(shm_engine_t *e) {
    uint64_t finished = shm_engine_finished(e);
    return shm_engine_issued(e) - finished;
}

/* Queue `op` behind everything issued: 0, or EAGAIN when the ring is half full (the other half is
 * headroom for threads submitting at the same moment). Lock-free: take a ticket, fill its slot,
 * then publish it once every earlier ticket is published (submitters on other threads are at
 * most a few instructions apart there). */
static inline int shm_engine_push(shm_engine_t *e, void *op) {
    uint64_t t;
    if (__atomic_load_n(&e->reserved, __ATOMIC_RELAXED) - shm_engine_finished(e) >= SHM_ENGINE_CAP / 2)
        return EAGAIN;
    t = __atomic_fetch_add(&e->reserved, 1, __ATOMIC_ACQ_REL);
    e->slots[t % SHM_ENGINE_CAP] = op;
    while (__atomic_load_n(&e->issued, __ATOMIC_ACQUIRE) != t) shm_cpu_relax();
    /* seq_cst store, then seq_cst load of `deep` (shm_engine_rest does the mirror image): either
     * the sleeping thread sees this ticket, or this sees it asleep and wakes it. */
    __atomic_store_n(&e->issued, t + 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&e->deep, __ATOMIC_SEQ_CST)) shm_engine_kick(e);
    return 0;
}

/* The background thread may start every op issued so far at once: after pushing a large op (a
 * wake-up costs microseconds; the op milliseconds that the caller can spend computing meanwhile),
 * or when an op's Future is asked for (its waiter blocks on the Future and runs nothing). */
static inline void shm_engine_start_issued(shm_engine_t *e) {
    uint64_t t = shm_engine_issued(e);
    uint64_t seen = __atomic_load_n(&e->eager_until, __ATOMIC_RELAXED);
    while (seen < t && !__atomic_compare_exchange_n(&e->eager_until, &seen, t, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {}
    __atomic_fetch_add(&e->kick, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&e->kick_waiters, __ATOMIC_SEQ_CST)) shm_futex_wake_all(&e->kick);
}

/* Wake threads waiting for the engine to change hands. */
static inline void shm_engine_signal(shm_engine_t *e) {
    __atomic_fetch_add(&e->done, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&e->done_waiters, __ATOMIC_SEQ_CST)) shm_futex_wake_all(&e->done);
}

static inline int shm_engine_try_hold(shm_engine_t *e) {
    uint32_t idle = 0;
    if (!__atomic_compare_exchange_n(&e->busy, &idle, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return 0;
    e->owner = pthread_self();
    e->depth = 0;
    __atomic_store_n(&e->owned, 1, __ATOMIC_RELEASE);
    return 1;
}

static inline void shm_engine_let_go(shm_engine_t *e) {
    __atomic_store_n(&e->owned, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->busy, 0, __ATOMIC_RELEASE);
    shm_engine_signal(e);
}

/* The op at the head of the queue, now owned by this thread, if its ticket is below `tickets`
 * (it was issued before the caller's snapshot of `issued`); NULL if not, if the queue is empty or
 * if another thread holds the engine. */
static inline void *shm_engine_claim_ticket_below(shm_engine_t *e, uint64_t tickets) {
    void *op = NULL;
    uint64_t finished = shm_engine_finished(e);
    if (finished >= shm_engine_issued(e) || finished >= tickets || !shm_engine_try_hold(e)) return NULL;
    finished = e->finished;  /* now ours: stable */
    if (finished < shm_engine_issued(e) && finished < tickets) op = e->slots[finished % SHM_ENGINE_CAP];
    else shm_engine_let_go(e);
    return op;
}

static inline void *shm_engine_claim(shm_engine_t *e) { return shm_engine_claim_ticket_below(e, UINT64_MAX); }

/* Hold the engine for a synchronous call: SHM_CLAIM_OWN when the queue is empty and nobody runs
 * anything, SHM_CLAIM_NESTED when this thread already holds it (a queued Python op calling a
 * collective), SHM_CLAIM_NONE otherwise. No lock: two atomic loads and a CAS. */
static inline int shm_engine_claim_inline(shm_engine_t *e) {
    if (__atomic_load_n(&e->busy, __ATOMIC_ACQUIRE)) {
        if (__atomic_load_n(&e->owned, __ATOMIC_ACQUIRE) && pthread_equal(e->owner, pthread_self())) {
            e->depth++;
            return SHM_CLAIM_NESTED;
        }
        return SHM_CLAIM_NONE;
    }
    if (shm_engine_pending(e) || !shm_engine_try_hold(e)) return SHM_CLAIM_NONE;
    return SHM_CLAIM_OWN;
}

/* The op `i` places behind the head, or NULL. Only for the thread holding the engine (nobody
 * else moves the head; submit only appends). */
static inline void *shm_engine_peek(shm_engine_t *e, uint64_t i) {
    if (e->finished + i < shm_engine_issued(e)) return e->slots[(e->finished + i) % SHM_ENGINE_CAP];
    return NULL;
}

/* End a claim: `queued` ops at the head of the queue ran (they leave it; 0 for inline claims). */
static inline void shm_engine_release(shm_engine_t *e, int claim, int queued) {
    if (claim == SHM_CLAIM_NESTED) {
        e->depth--;
        return;
    }
    if (queued) __atomic_store_n(&e->finished, e->finished + (uint64_t)queued, __ATOMIC_RELEASE);
    shm_engine_let_go(e);
    /* Ops queued behind: the background thread takes them (a dozing one finds them itself). */
    if (__atomic_load_n(&e->deep, __ATOMIC_SEQ_CST) && shm_engine_pending(e)) shm_engine_kick(e);
}

/* Does the calling thread hold the engine (it runs a queued Python op, or a synchronous call)? */
static inline int shm_engine_held_here(shm_engine_t *e) {
    return __atomic_load_n(&e->busy, __ATOMIC_ACQUIRE) && __atomic_load_n(&e->owned, __ATOMIC_ACQUIRE)
           && pthread_equal(e->owner, pthread_self());
}

static inline int shm_engine_busy(shm_engine_t *e) { return (int)__atomic_load_n(&e->busy, __ATOMIC_ACQUIRE); }

static inline int shm_engine_idle(shm_engine_t *e) {
    return !__atomic_load_n(&e->busy, __ATOMIC_ACQUIRE) && !shm_engine_pending(e);
}

/* The background thread's rest between ops: doze for `doze_ns` while the group was active
 * recently, else (deep) sleep until a submit wakes it, up to `slice_ns` so it can notice `stop`.
 * `seen_issued`: `issued` when the thread last looked; a ticket issued since ends the rest. */
static inline void shm_engine_rest(shm_engine_t *e, uint64_t seen_issued, int deep, uint64_t doze_ns,
                                   uint64_t slice_ns) {
    uint32_t kick = __atomic_load_n(&e->kick, __ATOMIC_SEQ_CST);
    if (deep) {
        __atomic_store_n(&e->deep, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&e->issued, __ATOMIC_SEQ_CST) != seen_issued) {
            __atomic_store_n(&e->deep, 0, __ATOMIC_SEQ_CST);
            return;
        }
    }
    shm_wait_geq(&e->kick, kick + 1, &e->kick_waiters, 0, 0, deep ? slice_ns : doze_ns);
    if (deep) __atomic_store_n(&e->deep, 0, __ATOMIC_SEQ_CST);
}

#endif
