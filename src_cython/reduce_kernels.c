/* Reduction kernels: dst[i] = op(src0[i], src1[i], ..., src{n-1}[i]), always in source order so
 * every rank that reduces the same inputs gets the same bits. dst may alias any source.
 *
 * The kernels are written once, as the macros below, and compiled at several SIMD levels
 * (reduce_level.h, once per level, each inside its own target region; never -march=native, so one
 * build runs on every CPU of its architecture). shm_simd.h picks the level once, from the CPU or
 * SHMCOMM_SIMD. The levels give the same bits: the element operations are the same IEEE
 * operations in the same order (the build passes -ffp-contract=off, so no level fuses a multiply
 * and an add), and the half-precision converters are exact (shm_half.h).
 *
 * Work goes in blocks, in the accumulate type (float32 for float16 and bfloat16, unsigned for
 * integer sums so overflow wraps as in numpy), through an accumulator array only when there are
 * more than two sources (SHM_KERNEL); the simple inner loops let the compiler vectorize them for
 * each level's instruction set. Only the float16 converters are
 * written with intrinsics (F16C, NEON): compilers do not vectorize those conversions themselves.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "reduce_kernels.h"
#include "shm_half.h"

int shm_simd_level = SHM_SIMD_BASELINE; /* set once at import, by the compiled module */

#define SHM_BLOCK 512

#define SHM_PASTE2_(a, b) shm_##a##_##b
#define SHM_PASTE2(a, b) SHM_PASTE2_(a, b)
#define SHM_PASTE3_(a, b, c) shm_##a##_##b##_##c
#define SHM_PASTE3(a, b, c) SHM_PASTE3_(a, b, c)

/* ---- element operations ---- */
#define SHM_OP_SUM(a, b) ((a) + (b))
#define SHM_OP_PROD(a, b) ((a) * (b))
#define SHM_OP_MIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b)) /* NaN propagates, as np.minimum */
#define SHM_OP_MAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define SHM_OP_BAND(a, b) ((a) & (b))
#define SHM_OP_BOR(a, b) ((a) | (b))
#define SHM_OP_BXOR(a, b) ((a) ^ (b))
#define SHM_ID(x) (x)
#define SHM_DIVN(x) ((x) / n_as_acc)
/* Integer AVG: the wrapped sum read as the element type, divided by n, truncated toward zero. */
#define SHM_DIVN_INT(x) ((shm_acc_t)((shm_elem_t)(x) / n))
#define SHM_TO_ACC(x) ((shm_acc_t)(x))
#define SHM_TO_ELEM(x) ((shm_elem_t)(x))
/* How source k's element enters the reduction: as it is, or times that source's factor
 * (PREMUL_SUM: each rank's input scaled by its own factor, then summed, as NCCL defines it). */
#define SHM_AS_IS(x, f) (x)
#define SHM_TIMES(x, f) ((x) * (f))


/* NAME: kernel; T: element type; ACC: accumulate type; LOAD/STORE convert between them;
 * OP: binary op on ACC; FINAL: applied once to the accumulated value (AVG divides by n);
 * SCALE: SHM_AS_IS, or SHM_TIMES (each source times its factor, rounded, before the op).
 *
 * Per block, the first pass combines sources 0 and 1 and the last pass folds in source n-1 as it
 * stores, so two sources take one pass and no accumulator (the case of every two-rank step). The
 * operations and their order are those of acc = s0; acc = OP(acc, s_k) for k = 1..n-1; dst =
 * FINAL(acc), so the bits are too. A source may be dst itself: each block of every source is read
 * before that block of dst is written. Against one accumulator pass per source, 32 MiB float32
 * arrays (bench/bench_kernels.py) took 1.97 ms instead of 3.91 for two sources and 3.94 instead
 * of 7.90 for four. */
#define SHM_KERNEL(NAME, T, ACC, LOAD, STORE, OP, FINAL, SCALE)                                   \
    static void NAME(void *dst_, const void *const *srcs, const double *factors, int n,           \
                     size_t count) {                                                              \
        typedef T shm_elem_t __attribute__((unused)); /* for LOAD/STORE/FINAL macros */           \
        typedef ACC shm_acc_t __attribute__((unused));                                            \
        T *dst = (T *)dst_;                                                                       \
        ACC acc[SHM_BLOCK];                                                                       \
        const ACC n_as_acc = (ACC)n;                                                              \
        (void)n_as_acc;                                                                           \
        const ACC f0 = factors ? (ACC)factors[0] : (ACC)1;                                        \
        const ACC f1 = factors && n > 1 ? (ACC)factors[1] : (ACC)1;                               \
        const ACC fl = factors ? (ACC)factors[n - 1] : (ACC)1;                                    \
        (void)f0, (void)f1, (void)fl;                                                             \
        for (size_t base = 0; base < count; base += SHM_BLOCK) {                                  \
            size_t m = count - base < SHM_BLOCK ? count - base : SHM_BLOCK;                       \
            const T *s0 = (const T *)srcs[0] + base;                                              \
            T *d = dst + base;                                                                    \
            if (n == 1) {                                                                         \
                for (size_t j = 0; j < m; j++) d[j] = STORE(FINAL(SCALE(LOAD(s0[j]), f0)));       \
                continue;                                                                         \
            }                                                                                     \
            const T *s1 = (const T *)srcs[1] + base;                                              \
            if (n == 2) {                                                                         \
                for (size_t j = 0; j < m; j++)                                                    \
                    d[j] = STORE(FINAL(OP(SCALE(LOAD(s0[j]), f0), SCALE(LOAD(s1[j]), f1))));      \
                continue;                                                                         \
            }                                                                                     \
            for (size_t j = 0; j < m; j++) acc[j] = OP(SCALE(LOAD(s0[j]), f0), SCALE(LOAD(s1[j]), f1)); \
            for (int k = 2; k < n - 1; k++) {                                                     \
                const T *s = (const T *)srcs[k] + base;                                           \
                const ACC f = factors ? (ACC)factors[k] : (ACC)1;                                 \
                (void)f;                                                                          \
                for (size_t j = 0; j < m; j++) acc[j] = OP(acc[j], SCALE(LOAD(s[j]), f));         \
            }                                                                                     \
            const T *sl = (const T *)srcs[n - 1] + base;                                          \
            for (size_t j = 0; j < m; j++) d[j] = STORE(FINAL(OP(acc[j], SCALE(LOAD(sl[j]), fl)))); \
        }                                                                                         \
    }

/* 16-bit floats: each source's block is converted into float32 by the level's block converter
 * LOADB, reduced in float32, and rounded once by STOREB. */
#define SHM_HALF_KERNEL(NAME, LOADB, STOREB, OP, FINAL, SCALE)                                    \
    static void NAME(void *dst_, const void *const *srcs, const double *factors, int n,           \
                     size_t count) {                                                              \
        uint16_t *dst = (uint16_t *)dst_;                                                         \
        float acc[SHM_BLOCK], in[SHM_BLOCK];                                                      \
        const float n_as_acc = (float)n;                                                          \
        (void)n_as_acc;                                                                           \
        for (size_t base = 0; base < count; base += SHM_BLOCK) {                                  \
            size_t m = count - base < SHM_BLOCK ? count - base : SHM_BLOCK;                       \
            const float f0 = factors ? (float)factors[0] : 1.0f;                                  \
            (void)f0;                                                                             \
            LOADB(acc, (const uint16_t *)srcs[0] + base, m);                                      \
            for (size_t j = 0; j < m; j++) acc[j] = SCALE(acc[j], f0);                            \
            for (int k = 1; k < n; k++) {                                                         \
                const float f = factors ? (float)factors[k] : 1.0f;                               \
                (void)f;                                                                          \
                LOADB(in, (const uint16_t *)srcs[k] + base, m);                                   \
                for (size_t j = 0; j < m; j++) acc[j] = OP(acc[j], SCALE(in[j], f));              \
            }                                                                                     \
            for (size_t j = 0; j < m; j++) acc[j] = FINAL(acc[j]);                                \
            STOREB(dst + base, acc, m);                                                           \
        }                                                                                         \
    }

/* Block converters in portable C, defined inside a level's region so the compiler vectorizes
 * them for it. */
#define SHM_PORTABLE_CONVERTERS(L, ID, TO_F32, FROM_F32)                                         \
    static inline void SHM_PASTE3(L, load, ID)(float *acc, const uint16_t *s, size_t m) {        \
        for (size_t j = 0; j < m; j++) acc[j] = TO_F32(s[j]);                                     \
    }                                                                                             \
    static inline void SHM_PASTE3(L, store, ID)(uint16_t *d, const float *acc, size_t m) {       \
        for (size_t j = 0; j < m; j++) d[j] = FROM_F32(acc[j]);                                   \
    }

/* ---- baseline: portable C, every CPU of the architecture ---- */
#define SHM_L baseline
#define SHM_LEVEL_IS_BASELINE
SHM_PORTABLE_CONVERTERS(baseline, FLOAT16, shm_f16_to_f32, shm_f32_to_f16)
SHM_PORTABLE_CONVERTERS(baseline, BFLOAT16, shm_bf16_to_f32, shm_f32_to_bf16)
#include "reduce_level.h"
#undef SHM_LEVEL_IS_BASELINE
#undef SHM_L

#if SHM_SIMD_X86
/* ---- x86-64: AVX2 + FMA + F16C, then AVX-512 (F, BW, VL) ---- */
#include <immintrin.h>

/* F16C converts 8 (AVX2) or 16 (AVX-512) halves per instruction; the tail goes through the
 * portable converter, which gives the same bits. */
#define SHM_F16C_CONVERTERS(L, W, VEC, HALFVEC, LOADH, STOREH, LOADF, STOREF, CVT_IN, CVT_OUT)   \
    static inline void SHM_PASTE3(L, load, FLOAT16)(float *acc, const uint16_t *s, size_t m) {   \
        size_t j = 0;                                                                             \
        for (; j + W <= m; j += W) STOREF(acc + j, CVT_IN(LOADH((const HALFVEC *)(s + j))));      \
        for (; j < m; j++) acc[j] = shm_f16_to_f32(s[j]);                                         \
    }                                                                                             \
    static inline void SHM_PASTE3(L, store, FLOAT16)(uint16_t *d, const float *acc, size_t m) {  \
        size_t j = 0;                                                                             \
        for (; j + W <= m; j += W)                                                                \
            STOREH((HALFVEC *)(d + j), CVT_OUT(LOADF(acc + j), _MM_FROUND_TO_NEAREST_INT));       \
        for (; j < m; j++) d[j] = shm_f32_to_f16(acc[j]);                                         \
    }

SHM_TARGET_PUSH("avx2,fma,f16c")
#define SHM_L avx2
SHM_F16C_CONVERTERS(avx2, 8, __m256, __m128i, _mm_loadu_si128, _mm_storeu_si128, _mm256_loadu_ps,
                    _mm256_storeu_ps, _mm256_cvtph_ps, _mm256_cvtps_ph)
SHM_PORTABLE_CONVERTERS(avx2, BFLOAT16, shm_bf16_to_f32, shm_f32_to_bf16)
#include "reduce_level.h"
#undef SHM_L
SHM_TARGET_POP

SHM_TARGET_PUSH("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#define SHM_L avx512
SHM_F16C_CONVERTERS(avx512, 16, __m512, __m256i, _mm256_loadu_si256, _mm256_storeu_si256,
                    _mm512_loadu_ps, _mm512_storeu_ps, _mm512_cvtph_ps, _mm512_cvtps_ph)
SHM_PORTABLE_CONVERTERS(avx512, BFLOAT16, shm_bf16_to_f32, shm_f32_to_bf16)
#include "reduce_level.h"
#undef SHM_L
SHM_TARGET_POP
#endif

#if SHM_SIMD_ARM
/* ---- AArch64: NEON (always present) with its native float16 conversions ---- */
#include <arm_neon.h>

static inline void shm_neon_load_FLOAT16(float *acc, const uint16_t *s, size_t m) {
    size_t j = 0;
    for (; j + 4 <= m; j += 4) vst1q_f32(acc + j, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(s + j))));
    for (; j < m; j++) acc[j] = shm_f16_to_f32(s[j]);
}
static inline void shm_neon_store_FLOAT16(uint16_t *d, const float *acc, size_t m) {
    size_t j = 0;
    for (; j + 4 <= m; j += 4) vst1_u16(d + j, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(acc + j))));
    for (; j < m; j++) d[j] = shm_f32_to_f16(acc[j]);
}
#define SHM_L neon
SHM_PORTABLE_CONVERTERS(neon, BFLOAT16, shm_bf16_to_f32, shm_f32_to_bf16)
#include "reduce_level.h"
#undef SHM_L
#endif

/* Every level's table, by level code; NULL for levels of another architecture. */
static const shm_kernel_t (*const shm_kernel_tables[SHM_SIMD_NLEVELS])[SHM_NOPS] = {
    [SHM_SIMD_BASELINE] = shm_kernels_baseline,
#if SHM_SIMD_X86
    [SHM_SIMD_AVX2] = shm_kernels_avx2,
    [SHM_SIMD_AVX512] = shm_kernels_avx512,
#endif
#if SHM_SIMD_ARM
    [SHM_SIMD_NEON] = shm_kernels_neon,
#endif
};

int shm_reduce_supported(int dtype, int op) {
    return dtype >= 0 && dtype < SHM_NDTYPES && op >= 0 && op < SHM_NOPS &&
           shm_kernels_baseline[dtype][op] != NULL;
}

int shm_reduce_at(int level, void *dst, const void *const *srcs, const double *factors, int n,
                  size_t count, int dtype, int op) {
    if (!shm_reduce_supported(dtype, op)) return -1;
    if (count) shm_kernel_tables[level][dtype][op](dst, srcs, op == SHM_PREMUL_SUM ? factors : NULL, n, count);
    return 0;
}

int shm_reduce(void *dst, const void *const *srcs, const double *factors, int n, size_t count,
               int dtype, int op) {
    return shm_reduce_at(shm_simd_level, dst, srcs, factors, n, count, dtype, op);
}
