/* Layout of a shmcomm group segment. shmcomm/segments.py reads the header fields it needs with the
 * same offsets; bump SHM_VERSION on any change.
 *
 *   header page | control block per rank | ring per (src, dst) pair | two data slots per rank
 */
#ifndef SHMCOMM_LAYOUT_H
#define SHMCOMM_LAYOUT_H

#include <stdint.h>
#include <string.h>

#define SHM_MAGIC 0x006D6D6F636D6873ull /* "shmcomm\0" */
#define SHM_VERSION 10u
#define SHM_HEAP_MAGIC 0x0070616568636873ull /* "shcheap\0" */
#define SHM_HEADER_BYTES 4096
#define SHM_CB_BYTES 640
#define SHM_RING_CTRL_BYTES 256
#define SHM_DESC_WORDS 8
#define SHM_P2P_EXPOSURES 32

enum { SHM_RANK_ABSENT = 0, SHM_RANK_ATTACHED = 1, SHM_RANK_DEPARTED = 2 };

typedef struct {
    uint64_t magic;          /* 0: written last by the creator */
    uint32_t version;        /* 8 */
    uint32_t world_size;     /* 12 */
    uint64_t layout_size;    /* 16 */
    uint64_t slot_bytes;     /* 24 */
    uint64_t ring_bytes;     /* 32 */
    int32_t creator_pid;     /* 40 */
    uint32_t attached;       /* 44: ranks attached so far (futex word) */
    uint32_t attached_waiters; /* 48 */
    uint32_t abort_flag;     /* 52: non-zero once any rank aborted the group */
    uint64_t nonce;          /* 56 */
    char job[128];           /* 64 */
    char boot_id[64];        /* 192 */
    char hostname[64];       /* 256 */
    uint64_t small_bytes;    /* 320: thresholds every rank must share (rank 0's settings win) */
    uint64_t cma_bytes;      /* 328 */
    uint8_t tag[32];         /* 336: the job's tag (shmcomm.trust.Credentials.tag): whose segment this is */
    uint32_t self_made;      /* 368: the creator made its secret up (ranks started by hand) */
    uint32_t pad_a;          /* 372 */
    uint64_t name_salt;      /* 376: random; names of the segments made through this group
                                (sub-groups) derive from it, so nobody outside can plant them */
    int32_t abort_rank;      /* 384: the rank that aborted the group first (-1: none or unknown) */
    uint32_t abort_claim;    /* 388: taken (0 -> 1) by the first rank to abort: it writes the reason */
    char abort_reason[512];  /* 392: why, as that rank said (written before abort_flag is set) */
    int32_t abort_peer_pid;  /* 904: the cause was the death of this process (0: another cause;
                                -1: a peer on another node). Written with the reason. */
    uint32_t pad_b;          /* 908 */
    char pad_c[52];          /* 912 */
    uint32_t slot_stores;    /* 964: bit b set: copies into the slots of calls in size class b
                                stream (rank 0 tunes it, every rank reads it: tuning.pxi);
                                a line of its own, written seldom, so reading it is an L1 hit */
} shm_header_t;

/* Header page of an sc.empty / RPC heap segment; the ranks' data follows at SHM_HEADER_BYTES. */
typedef struct {
    uint64_t magic;          /* 0: SHM_HEAP_MAGIC */
    uint64_t nonce;          /* 8: random; rank 0 also publishes it in its (trusted) descriptor */
    uint8_t tag[32];         /* 16: the job's tag for this heap's name */
} shm_heap_header_t;

/* One rank's control block: each group of fields on its own 128-byte line. */
typedef struct {
    uint32_t seq;            /* 0: collective step this rank has published, after its tag in
                                desc (futex word of sleepers; health checks read it) */
    uint32_t seq_waiters;    /* 4 */
    int32_t pid;             /* 8 */
    uint32_t state;          /* 12: SHM_RANK_* */
    uint64_t probe_addr;     /* 16: address of `pid` in this rank's own mapping (single-copy probe) */
    uint32_t cma_ok;         /* 24: this rank can read every peer's memory (set after the probe) */
    uint32_t withdrawn;      /* 28: set once an op of this rank failed: its published addresses are void */
    uint32_t leases;         /* 32: copies this rank is making into or out of peers' memory right now
                                (each a lease on every peer whose `withdrawn` it checked first) */
    uint32_t cpu;            /* 36: 1 + the CPU this rank last waited on (0: not known yet): a
                                waiter whose peer shares its core hands the core over at once */
    uint64_t start_time;     /* 40: this process's start time (/proc/PID/stat field 22): peers check
                                that `pid` is still the process that registered */
    uint32_t lease_progress; /* 48: bumped each time this rank ends a lease (a chunk copied): a
                                withdrawing peer waits for a holder that makes progress, and
                                stops only one that made none for the whole timeout */
    char pad0[76];
    uint64_t desc[2][SHM_DESC_WORDS]; /* 128: what collective this rank called, by step parity;
                                the upper half of word 0 is the last step published with it
                                (shm_tag_step): readers wait on it, not on `seq` */
    uint32_t bell;           /* 256: rung when a ring to or from this rank moves (futex word) */
    uint32_t bell_waiters;   /* 260 */
    uint64_t not_made;       /* 264: a group made through this one (a sub-group) whose rank 0 this
                                rank is could not make its segment: that group's code
                                (_Derivation), stored after not_made_why; 0: none */
    char not_made_why[232];  /* 272: why, as this rank's error said: its members waiting for the
                                segment raise it at once instead of at their timeout */
    char pad1[8];
    uint32_t exposures[SHM_P2P_EXPOSURES]; /* 512: point-to-point buffers of this rank that peers
                                may copy into or out of (single copy): a message names slot i and
                                its generation; the slot's next generation voids it (p2p.pxi) */
} shm_cb_t;

/* Control of a single-producer single-consumer byte ring (one per ordered pair of ranks: point to
 * point and RPC alike); its data area of `cap` bytes follows it. The operations are in shm_ring.h. */
typedef struct {
    uint64_t head;           /* 0: bytes written, by the sender */
    uint32_t room_wanted;    /* 8: senders asleep on tail's low half until the receiver makes room */
    char pad0[116];
    uint64_t tail;           /* 128: bytes consumed, by the receiver */
    char pad1[120];
} shm_ring_t;

_Static_assert(sizeof(shm_header_t) <= SHM_HEADER_BYTES, "header too large");
_Static_assert(sizeof(shm_heap_header_t) <= SHM_HEADER_BYTES, "heap header too large");
_Static_assert(sizeof(shm_cb_t) == SHM_CB_BYTES, "control block size");
_Static_assert(SHM_P2P_EXPOSURES == 32, "P2PEngine.free_slots is a 32-bit mask");
_Static_assert(sizeof(shm_ring_t) == SHM_RING_CTRL_BYTES, "ring control size");

#endif
