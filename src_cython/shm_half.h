/* Exact conversions between float32 and the two 16-bit float types, in portable C.
 *
 * Every SIMD level must give the same bits, so these match what the hardware converters do
 * (x86 F16C, AArch64 FCVT with default FPCR), value for value, NaNs included:
 *   - float32 -> 16 bits rounds to nearest, ties to even; overflow gives infinity;
 *   - a NaN stays a NaN of the same sign, made quiet, its payload truncated from the top bits;
 *   - float16 subnormals are converted exactly (no flush to zero, whatever MXCSR says).
 * AVX512_BF16's VCVTNEPS2BF16 is deliberately not used: it flushes subnormals to zero, so its bits
 * would differ from these for tiny values.
 *
 * The code uses integer operations and selects only (the float additions below are exact, and
 * their operands are normal numbers so DAZ/FTZ cannot change them); compilers vectorize it on the
 * levels without a hardware converter.
 */
#ifndef SHMCOMM_HALF_H
#define SHMCOMM_HALF_H

#include <stdint.h>
#include <string.h>

static inline float shm_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t shm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float shm_bf16_to_f32(uint16_t h) { return shm_bits_f32((uint32_t)h << 16); }

static inline uint16_t shm_f32_to_bf16(float f) {
    uint32_t u = shm_f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

static inline float shm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t body = (uint32_t)(h & 0x7fffu) << 13; /* exponent and mantissa in float32's places */
    uint32_t exp = body & 0x0f800000u, mant = body & 0x007fe000u;
    uint32_t normal = body + 0x38000000u; /* rebias the exponent: 127 - 15 */
    uint32_t special = 0x7f800000u | mant | (mant ? 0x00400000u : 0u); /* inf, or a quiet NaN */
    /* subnormal: 2^-14 * (1 + m) - 2^-14 = m * 2^-24, exact (both operands are normal floats) */
    uint32_t subnormal = shm_f32_bits(shm_bits_f32(body + 0x38800000u) - shm_bits_f32(0x38800000u));
    uint32_t u = exp == 0x0f800000u ? special : exp == 0 ? subnormal : normal;
    return shm_bits_f32(sign | u);
}

static inline uint16_t shm_f32_to_f16(float f) {
    uint32_t u = shm_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    /* below 2^-14 (half subnormals and zero): adding 0.5 rounds to a multiple of 2^-24 (ties to
     * even), the half quantum; float32 subnormals here round to zero either way. */
    uint32_t subnormal = shm_f32_bits(shm_bits_f32(a) + 0.5f) - 0x3f000000u;
    uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13; /* rebias, round to even */
    uint32_t h = a > 0x7f800000u ? nan : a >= 0x477ff000u ? 0x7c00u /* >= 65520: infinity */
               : a < 0x38800000u ? subnormal : normal;
    return (uint16_t)(sign | h);
}

#endif
