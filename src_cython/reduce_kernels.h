/* Reduction kernels: dst[i] = op(src0[i], src1[i], ..., src{n-1}[i]), always in source order so
 * every rank that reduces the same inputs gets the same bits. dst may alias any source.
 *
 * Work goes in blocks through an accumulator array in the accumulate type (float32 for float16 and
 * bfloat16, unsigned for integer sums so overflow wraps as in numpy); the simple inner loops let
 * the compiler vectorise at -O3.
 */
#ifndef SHMCOMM_REDUCE_KERNELS_H
#define SHMCOMM_REDUCE_KERNELS_H

#include <complex.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    SHM_BOOL, SHM_INT8, SHM_UINT8, SHM_INT16, SHM_UINT16, SHM_INT32, SHM_UINT32, SHM_INT64,
    SHM_UINT64, SHM_FLOAT16, SHM_BFLOAT16, SHM_FLOAT32, SHM_FLOAT64, SHM_LONGDOUBLE,
    SHM_COMPLEX64, SHM_COMPLEX128, SHM_CLONGDOUBLE, SHM_NDTYPES
};
enum { SHM_SUM, SHM_PRODUCT, SHM_MIN, SHM_MAX, SHM_AVG, SHM_BAND, SHM_BOR, SHM_BXOR, SHM_NOPS };

#define SHM_BLOCK 512

/* ---- half-precision conversions (round to nearest even, as numpy, torch and ml_dtypes do) ---- */
static inline float shm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t shm_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
#if defined(__FLT16_MAX__)
static inline float shm_f16_to_f32(uint16_t h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t shm_f32_to_f16(float f) { _Float16 x = (_Float16)f; uint16_t h; memcpy(&h, &x, 2); return h; }
#else
static inline float shm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
    if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);
    else if (exp) u = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) u = sign;
    else { /* subnormal: normalise */
        exp = 113;
        while (!(man & 0x400u)) { man <<= 1; exp--; }
        u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t shm_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to infinity */
    if (abs < 0x38800000u) { /* subnormal or zero in half */
        float a;
        memcpy(&a, &abs, 4);
        a += 0.5f; /* the addition rounds to nearest even at 2^-24 */
        uint32_t r;
        memcpy(&r, &a, 4);
        return (uint16_t)(sign | (r - 0x3f000000u));
    }
    uint32_t mant_odd = (abs >> 13) & 1u;
    abs += 0xc8000fffu + mant_odd; /* rebias exponent and round */
    return (uint16_t)(sign | (abs >> 13));
}
#endif

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

typedef void (*shm_kernel_t)(void *dst, const void *const *srcs, int n, size_t count);

/* NAME: kernel; T: element type; ACC: accumulate type; LOAD/STORE convert between them;
 * OP: binary op on ACC; FINAL: applied once to the accumulated value (AVG divides by n). */
#define SHM_KERNEL(NAME, T, ACC, LOAD, STORE, OP, FINAL)                                          \
    static void NAME(void *dst_, const void *const *srcs, int n, size_t count) {                 \
        T *dst = (T *)dst_;                                                                       \
        ACC acc[SHM_BLOCK];                                                                       \
        const ACC n_as_acc = (ACC)n;                                                              \
        (void)n_as_acc;                                                                           \
        for (size_t base = 0; base < count; base += SHM_BLOCK) {                                  \
            size_t m = count - base < SHM_BLOCK ? count - base : SHM_BLOCK;                       \
            const T *s0 = (const T *)srcs[0] + base;                                              \
            for (size_t j = 0; j < m; j++) acc[j] = LOAD(s0[j]);                                  \
            for (int k = 1; k < n; k++) {                                                         \
                const T *s = (const T *)srcs[k] + base;                                           \
                for (size_t j = 0; j < m; j++) acc[j] = OP(acc[j], LOAD(s[j]));                   \
            }                                                                                     \
            for (size_t j = 0; j < m; j++) dst[base + j] = STORE(FINAL(acc[j]));                  \
        }                                                                                         \
    }

/* Integers: sums, products and bit ops in the unsigned type (wrap-around, no UB); min/max signed. */
#define SHM_INT_KERNELS(P, T, U)                                                                  \
    SHM_KERNEL(P##_sum, U, U, SHM_ID, SHM_ID, SHM_OP_SUM, SHM_ID)                                 \
    SHM_KERNEL(P##_prod, U, U, SHM_ID, SHM_ID, SHM_OP_PROD, SHM_ID)                               \
    SHM_KERNEL(P##_min, T, T, SHM_ID, SHM_ID, SHM_OP_MIN, SHM_ID)                                 \
    SHM_KERNEL(P##_max, T, T, SHM_ID, SHM_ID, SHM_OP_MAX, SHM_ID)                                 \
    SHM_KERNEL(P##_band, U, U, SHM_ID, SHM_ID, SHM_OP_BAND, SHM_ID)                               \
    SHM_KERNEL(P##_bor, U, U, SHM_ID, SHM_ID, SHM_OP_BOR, SHM_ID)                                 \
    SHM_KERNEL(P##_bxor, U, U, SHM_ID, SHM_ID, SHM_OP_BXOR, SHM_ID)
#define SHM_INT_ROW(P) {P##_sum, P##_prod, P##_min, P##_max, NULL, P##_band, P##_bor, P##_bxor}

SHM_INT_KERNELS(shm_i8, int8_t, uint8_t)
SHM_INT_KERNELS(shm_u8, uint8_t, uint8_t)
SHM_INT_KERNELS(shm_i16, int16_t, uint16_t)
SHM_INT_KERNELS(shm_u16, uint16_t, uint16_t)
SHM_INT_KERNELS(shm_i32, int32_t, uint32_t)
SHM_INT_KERNELS(shm_u32, uint32_t, uint32_t)
SHM_INT_KERNELS(shm_i64, int64_t, uint64_t)
SHM_INT_KERNELS(shm_u64, uint64_t, uint64_t)

/* Booleans (one byte, 0 or 1): sum and max are "or", product and min are "and". */
SHM_KERNEL(shm_b_or, uint8_t, uint8_t, SHM_ID, SHM_ID, SHM_OP_BOR, SHM_ID)
SHM_KERNEL(shm_b_and, uint8_t, uint8_t, SHM_ID, SHM_ID, SHM_OP_BAND, SHM_ID)
SHM_KERNEL(shm_b_xor, uint8_t, uint8_t, SHM_ID, SHM_ID, SHM_OP_BXOR, SHM_ID)

#define SHM_FLOAT_KERNELS(P, T, ACC, LOAD, STORE)                                                 \
    SHM_KERNEL(P##_sum, T, ACC, LOAD, STORE, SHM_OP_SUM, SHM_ID)                                  \
    SHM_KERNEL(P##_prod, T, ACC, LOAD, STORE, SHM_OP_PROD, SHM_ID)                                \
    SHM_KERNEL(P##_min, T, ACC, LOAD, STORE, SHM_OP_MIN, SHM_ID)                                  \
    SHM_KERNEL(P##_max, T, ACC, LOAD, STORE, SHM_OP_MAX, SHM_ID)                                  \
    SHM_KERNEL(P##_avg, T, ACC, LOAD, STORE, SHM_OP_SUM, SHM_DIVN)
#define SHM_FLOAT_ROW(P) {P##_sum, P##_prod, P##_min, P##_max, P##_avg, NULL, NULL, NULL}

SHM_FLOAT_KERNELS(shm_f16, uint16_t, float, shm_f16_to_f32, shm_f32_to_f16)
SHM_FLOAT_KERNELS(shm_bf16, uint16_t, float, shm_bf16_to_f32, shm_f32_to_bf16)
SHM_FLOAT_KERNELS(shm_f32, float, float, SHM_ID, SHM_ID)
SHM_FLOAT_KERNELS(shm_f64, double, double, SHM_ID, SHM_ID)
SHM_FLOAT_KERNELS(shm_f128, long double, long double, SHM_ID, SHM_ID)

/* Complex numbers have no order: sum, product and average only. AVG divides each component. */
#define SHM_COMPLEX_KERNELS(P, T, R)                                                              \
    SHM_KERNEL(P##_sum, T, T, SHM_ID, SHM_ID, SHM_OP_SUM, SHM_ID)                                 \
    SHM_KERNEL(P##_prod, T, T, SHM_ID, SHM_ID, SHM_OP_PROD, SHM_ID)                               \
    SHM_KERNEL(P##_avg, T, T, SHM_ID, SHM_ID, SHM_OP_SUM, SHM_ID)
#define SHM_COMPLEX_ROW(P) {P##_sum, P##_prod, NULL, NULL, P##_avg, NULL, NULL, NULL}

SHM_COMPLEX_KERNELS(shm_c64, float _Complex, float)
SHM_COMPLEX_KERNELS(shm_c128, double _Complex, double)
SHM_COMPLEX_KERNELS(shm_c256, long double _Complex, long double)

static const shm_kernel_t shm_kernels[SHM_NDTYPES][SHM_NOPS] = {
    [SHM_BOOL] = {shm_b_or, shm_b_and, shm_b_and, shm_b_or, NULL, shm_b_and, shm_b_or, shm_b_xor},
    [SHM_INT8] = SHM_INT_ROW(shm_i8),
    [SHM_UINT8] = SHM_INT_ROW(shm_u8),
    [SHM_INT16] = SHM_INT_ROW(shm_i16),
    [SHM_UINT16] = SHM_INT_ROW(shm_u16),
    [SHM_INT32] = SHM_INT_ROW(shm_i32),
    [SHM_UINT32] = SHM_INT_ROW(shm_u32),
    [SHM_INT64] = SHM_INT_ROW(shm_i64),
    [SHM_UINT64] = SHM_INT_ROW(shm_u64),
    [SHM_FLOAT16] = SHM_FLOAT_ROW(shm_f16),
    [SHM_BFLOAT16] = SHM_FLOAT_ROW(shm_bf16),
    [SHM_FLOAT32] = SHM_FLOAT_ROW(shm_f32),
    [SHM_FLOAT64] = SHM_FLOAT_ROW(shm_f64),
    [SHM_LONGDOUBLE] = SHM_FLOAT_ROW(shm_f128),
    [SHM_COMPLEX64] = SHM_COMPLEX_ROW(shm_c64),
    [SHM_COMPLEX128] = SHM_COMPLEX_ROW(shm_c128),
    [SHM_CLONGDOUBLE] = SHM_COMPLEX_ROW(shm_c256),
};

/* Complex AVG: divide real and imaginary parts by n (a complex division would round differently). */
static inline void shm_complex_avg_fix(int dtype, void *dst, int n, size_t count) {
    if (dtype == SHM_COMPLEX64) { float *p = (float *)dst; for (size_t i = 0; i < 2 * count; i++) p[i] /= (float)n; }
    else if (dtype == SHM_COMPLEX128) { double *p = (double *)dst; for (size_t i = 0; i < 2 * count; i++) p[i] /= (double)n; }
    else if (dtype == SHM_CLONGDOUBLE) { long double *p = (long double *)dst; for (size_t i = 0; i < 2 * count; i++) p[i] /= (long double)n; }
}

static inline int shm_reduce_supported(int dtype, int op) {
    return dtype >= 0 && dtype < SHM_NDTYPES && op >= 0 && op < SHM_NOPS && shm_kernels[dtype][op] != NULL;
}

/* Returns 0, or -1 for an unsupported (dtype, op) pair (the caller validates first). */
static inline int shm_reduce(void *dst, const void *const *srcs, int n, size_t count, int dtype, int op) {
    if (!shm_reduce_supported(dtype, op)) return -1;
    if (count == 0) return 0;
    shm_kernels[dtype][op](dst, srcs, n, count);
    if (op == SHM_AVG && dtype >= SHM_COMPLEX64) shm_complex_avg_fix(dtype, dst, n, count);
    return 0;
}

#endif
