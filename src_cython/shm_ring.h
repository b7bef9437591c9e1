/* The single-producer single-consumer byte ring under point to point (p2p.pxi) and RPC
 * (rpc_channel.pxi): its fields are in shm_layout.h (shm_ring_t), its operations here, once.
 *
 * Positions are byte counts since the ring was made (64-bit, never wrap); position p lives at
 * data[p % cap]. The sender owns head, the receiver tail. A sender writes at its private head and
 * publishes it with a release store (shm_ring_publish), so the receiver that acquires head sees
 * the bytes; the receiver copies out and hands the space back with a release store of tail. Who
 * is woken and how (doorbells, the tail futex) is the caller's policy.
 */
#ifndef SHMCOMM_RING_H
#define SHMCOMM_RING_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "shm_layout.h"
#include "shm_sync.h"

static inline char *shm_ring_data(shm_ring_t *r) { return (char *)r + SHM_RING_CTRL_BYTES; }

/* Sender: bytes it may write at `head` now (the receiver's tail read fresh). */
static inline size_t shm_ring_room(shm_ring_t *r, size_t cap, uint64_t head) {
    return cap - (size_t)(head - shm_load_acquire64(&r->tail));
}

/* Sender: copy n bytes in at `head` (the caller made sure they fit); returns the new head, which
 * the receiver sees only once published. */
static inline uint64_t shm_ring_write(shm_ring_t *r, size_t cap, uint64_t head, const char *src, size_t n) {
    char *data = shm_ring_data(r);
    size_t at = (size_t)(head % cap), first = n < cap - at ? n : cap - at;
    memcpy(data + at, src, first);
    if (n > first) memcpy(data, src + first, n - first);
    return head + n;
}

/* Sender: make everything written up to `head` visible to the receiver. */
static inline void shm_ring_publish(shm_ring_t *r, uint64_t head) { shm_store_release64(&r->head, head); }

/* Receiver: bytes available at `tail`. */
static inline size_t shm_ring_avail(shm_ring_t *r, uint64_t tail) {
    return (size_t)(shm_load_acquire64(&r->head) - tail);
}

/* Receiver: copy n available bytes at position `pos` out, leaving them in the ring. */
static inline void shm_ring_peek(shm_ring_t *r, size_t cap, uint64_t pos, char *dst, size_t n) {
    const char *data = shm_ring_data(r);
    size_t at = (size_t)(pos % cap), first = n < cap - at ? n : cap - at;
    memcpy(dst, data + at, first);
    if (n > first) memcpy(dst + first, data, n - first);
}

/* Receiver: copy n available bytes out at `tail` (dst NULL: drop them) and hand the space back,
 * waking senders asleep for room; returns the new tail. */
static inline uint64_t shm_ring_read(shm_ring_t *r, size_t cap, uint64_t tail, char *dst, size_t n) {
    if (dst) shm_ring_peek(r, cap, tail, dst, n);
    /* A seq_cst store, then a seq_cst load of room_wanted (shm_publish's pattern, against
     * shm_wait_geq's count-then-check): a sender going to sleep either sees the new tail or is
     * counted here. A load, not a read-modify-write: room_wanted shares its cache line with
     * the sender's head, which a write would pull away from the sender on every read. */
    __atomic_store_n(&r->tail, tail + n, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&r->room_wanted, __ATOMIC_SEQ_CST))
        shm_futex_wake_all((uint32_t *)&r->tail); /* the low half, on little-endian targets */
    return tail + n;
}

#endif
