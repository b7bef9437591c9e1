/* Copies into and out of shared memory: streaming ones, whose destination will not be read again
 * soon, and the slot copy (shm_slot_memcpy), whose destination peers read at once.
 *
 * A normal store first reads the destination's cache line from memory ("read for ownership"), so
 * copying n bytes into memory that is not cached moves 3n bytes: read the source, read the
 * destination, write it back. Streaming (non-temporal) stores write whole lines without reading
 * them: 2n (one 32 MiB copy here: 3.3-3.9 ms with glibc's memcpy, 2.1-2.3 ms streamed).
 * memcpy chooses by the size of each call alone; collectives copy a large result in pieces (slot
 * chunks, blocks, one piece per rank) and know the whole, so the caller chooses (see
 * Communicator._out: outputs that cannot stay in the last-level cache). */
#ifndef SHMCOMM_COPY_H
#define SHMCOMM_COPY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

/* Copy n bytes with streaming stores whatever n (the caller chose; below a cache line there is
 * nothing to stream), then fence. */
static inline void shm_stream_copy(char *dst, const char *src, size_t n) {
#if defined(__SSE2__)
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15, body, i;
    if (n < 64 + head) {
        memcpy(dst, src, n);
        return;
    }
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    body = n & ~(size_t)63;
    for (i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + body, src + body, n - body);
    _mm_sfence(); /* streaming stores are weakly ordered: complete them before any later flag store */
#else
    memcpy(dst, src, n);
#endif
}

/* Copy n bytes into a slot that peers read (and then read again after the next write): memcpy,
 * but `rep movsb` from 1280 B where the CPU makes it fast (an Intel CPU with ERMS and FSRM), below
 * where glibc switches to it itself (2112 B on this project's Xeon). glibc's vector loop there
 * stores line by line, each store first taking the line back from the peer that read it; the
 * string instruction writes whole lines. 2-rank one-shot all_reduce, memcpy / rep movsb (us, medians
 * of 5 alternated launches): 1280 B 1.13 / 1.04, 1536 B 1.26 / 1.14, 2048 B 1.46 / 1.26; it lost
 * below 1 KiB (512 B 0.72 / 0.87: its start-up cost), so it starts at 1280. */
#define SHM_MOVSB_MIN 1280
#define SHM_MOVSB_END 4096

static inline int shm_fast_movsb(void) {
    static int known = -1; /* a benign race: every thread computes the same answer */
    if (known < 0) {
        int yes = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
        unsigned a, b, c, d;
        if (__get_cpuid(0, &a, &b, &c, &d) && a >= 7 && b == 0x756e6547 /* "Genu" */ &&
            d == 0x49656e69 /* "ineI" */ && c == 0x6c65746e /* "ntel" */ &&
            __get_cpuid_count(7, 0, &a, &b, &c, &d))
            yes = (b >> 9 & 1) && (d >> 4 & 1); /* ERMS, FSRM */
#endif
        known = yes;
    }
    return known;
}

static inline void shm_slot_memcpy(char *dst, const char *src, size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (n >= SHM_MOVSB_MIN && n < SHM_MOVSB_END && shm_fast_movsb()) {
        __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
        return;
    }
#endif
    memcpy(dst, src, n);
}

/* A large copy whose destination will not be read soon: streaming stores from 4 KiB. */
static inline void shm_copy_stream(char *dst, const char *src, size_t n) {
    if (n < 4096) { /* small: the line reads do not matter, the fence would */
        memcpy(dst, src, n);
        return;
    }
    shm_stream_copy(dst, src, n);
}

/* Copy n bytes of a result into an output array: streaming stores when the caller says the whole
 * result is too large to stay cached (`stream`) and the ranges do not overlap, else memmove. */
static inline void shm_move_out(char *dst, const char *src, size_t n, int stream) {
    if (dst == src || n == 0)
        return;
    if (!stream || (dst < src + n && src < dst + n))
        memmove(dst, src, n);
    else
        shm_copy_stream(dst, src, n);
}

#endif
