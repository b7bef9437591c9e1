/* SIMD levels of the reduction kernels: which ones this build has, which ones this CPU runs, and
 * the one in use (chosen once at start-up: the best the CPU runs, unless SHMCOMM_SIMD names one).
 *
 * Levels are compiled with per-function target regions (SHM_TARGET_PUSH/POP) rather than global
 * -m flags, so a wheel built for baseline x86-64 still carries AVX2 and AVX-512 code and uses it
 * only where cpuid (and the OS's saved register state, XCR0) says it may.
 */
#ifndef SHMCOMM_SIMD_H
#define SHMCOMM_SIMD_H

#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SHM_SIMD_X86 1
#include <cpuid.h>
#else
#define SHM_SIMD_X86 0
#endif
#if defined(__aarch64__)
#define SHM_SIMD_ARM 1
#else
#define SHM_SIMD_ARM 0
#endif

enum { SHM_SIMD_BASELINE, SHM_SIMD_AVX2, SHM_SIMD_AVX512, SHM_SIMD_NEON, SHM_SIMD_NLEVELS };
static const char *const shm_simd_names[SHM_SIMD_NLEVELS] = {"baseline", "avx2", "avx512", "neon"};

/* Functions defined between PUSH and POP are compiled for the given target features. */
#if defined(__clang__)
#define SHM_PRAGMA(x) _Pragma(#x)
#define SHM_TARGET_PUSH(features) SHM_PRAGMA(clang attribute push(__attribute__((target(features))), apply_to = function))
#define SHM_TARGET_POP _Pragma("clang attribute pop")
#elif defined(__GNUC__)
#define SHM_PRAGMA(x) _Pragma(#x)
#define SHM_TARGET_PUSH(features) _Pragma("GCC push_options") SHM_PRAGMA(GCC target(features))
#define SHM_TARGET_POP _Pragma("GCC pop_options")
#endif

#if SHM_SIMD_X86
static inline uint64_t shm_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

/* 1 if this build has `level` and this CPU (and OS) can run it. */
static inline int shm_simd_runs(int level) {
    if (level == SHM_SIMD_BASELINE) return 1;
#if SHM_SIMD_X86
    if (level == SHM_SIMD_AVX2 || level == SHM_SIMD_AVX512) {
        unsigned a, b, c, d;
        if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
        int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
        if (!(fma && osxsave && avx && f16c)) return 0;
        uint64_t xcr0 = shm_xcr0();
        if ((xcr0 & 0x6) != 0x6) return 0; /* the OS saves XMM and YMM state */
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((b >> 5) & 1)) return 0; /* AVX2 */
        if (level == SHM_SIMD_AVX2) return 1;
        int f = (b >> 16) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
        return f && bw && vl && (xcr0 & 0xe6) == 0xe6; /* and opmask and ZMM state */
    }
#endif
#if SHM_SIMD_ARM
    if (level == SHM_SIMD_NEON) return 1; /* Advanced SIMD and its fp16 conversions are in ARMv8-A */
#endif
    return 0;
}

/* The best level this CPU runs. */
static inline int shm_simd_best(void) {
    for (int level = SHM_SIMD_NLEVELS - 1; level > SHM_SIMD_BASELINE; level--)
        if (shm_simd_runs(level)) return level;
    return SHM_SIMD_BASELINE;
}

/* The level in use: set once at import, by the compiled module (defined in reduce_kernels.c). */
extern __attribute__((visibility("hidden"))) int shm_simd_level;

#endif
