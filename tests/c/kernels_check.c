/* Prints one line per (level, dtype, op): a hash of the kernel's output over fixed inputs, several
 * lengths (vector tails, block edges) and 1-4 sources. tests/test_kernels.py builds it for this
 * machine and for AArch64 (run under qemu) and compares: every level of an architecture, and both
 * architectures, must give the same bits (long double aside: 80-bit x87 against 128-bit quad).
 * Inputs are finite and never zero, so no operation makes a NaN (whose default bits differ
 * between x86 and Arm). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reduce_kernels.h"
#include "shm_half.h"

static uint64_t lcg = 88172645463325252ull;
static uint64_t next(void) { lcg = lcg * 6364136223846793005ull + 1442695040888963407ull; return lcg >> 17; }

static double value(void) {
    double v = (double)((int64_t)(next() % 20001) - 10000) / 3.0;
    return v == 0 ? 1.0 : v;
}

static void fill(int dtype, char *p, size_t count) {
    size_t size = (size_t)shm_dtype_itemsizes[dtype];
    for (size_t i = 0; i < count; i++, p += size) {
        switch (dtype) {
        case SHM_BOOL: *(uint8_t *)p = next() & 1; break;
        case SHM_FLOAT16: *(uint16_t *)p = shm_f32_to_f16((float)(value() / 64)); break;
        case SHM_BFLOAT16: *(uint16_t *)p = shm_f32_to_bf16((float)value()); break;
        case SHM_FLOAT32: *(float *)p = (float)value(); break;
        case SHM_FLOAT64: *(double *)p = value(); break;
        case SHM_LONGDOUBLE: memset(p, 0, size); *(long double *)p = value(); break;
        case SHM_COMPLEX64: ((float *)p)[0] = (float)value(), ((float *)p)[1] = (float)value(); break;
        case SHM_COMPLEX128: ((double *)p)[0] = value(), ((double *)p)[1] = value(); break;
        case SHM_CLONGDOUBLE:
            memset(p, 0, size);
            ((long double *)p)[0] = value(), ((long double *)p)[1] = value();
            break;
        default: for (size_t b = 0; b < size; b++) p[b] = (char)next(); /* integers: any bits */
        }
    }
}

int main(void) {
    static const size_t lengths[] = {1, 7, 17, 33, 513, 1031};
    size_t max = 1031 * 32;
    char *srcs[4], *dst = malloc(max);
    static const double factors[4] = {0.5, -1.25, 3.0, 0.1}; /* PREMUL_SUM's, one per source */
    for (int k = 0; k < 4; k++) srcs[k] = malloc(max);
    for (int level = 0; level < SHM_SIMD_NLEVELS; level++) {
        if (!shm_simd_runs(level)) continue;
        for (int dtype = 0; dtype < SHM_NDTYPES; dtype++) {
            for (int op = 0; op < SHM_NOPS; op++) {
                if (!shm_reduce_supported(dtype, op)) continue;
                uint64_t hash = 1469598103934665603ull; /* FNV-1a over every output */
                lcg = 88172645463325252ull + (uint64_t)dtype * 131 + (uint64_t)op;
                for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++) {
                    for (int n = 1; n <= 4; n++) {
                        size_t count = lengths[l], bytes = count * (size_t)shm_dtype_itemsizes[dtype];
                        for (int k = 0; k < n; k++) fill(dtype, srcs[k], count);
                        memset(dst, 0, bytes);
                        shm_reduce_at(level, dst, (const void *const *)srcs, factors, n, count, dtype, op);
                        for (size_t b = 0; b < bytes; b++) {
                            size_t in_elem = b % (size_t)shm_dtype_itemsizes[dtype];
                            int x87_padding = (dtype == SHM_LONGDOUBLE || dtype == SHM_CLONGDOUBLE) &&
                                              sizeof(long double) == 16 && __LDBL_MANT_DIG__ == 64 &&
                                              in_elem % 16 >= 10;
                            if (!x87_padding) hash = (hash ^ (uint8_t)dst[b]) * 1099511628211ull;
                        }
                    }
                }
                printf("%s %s %s %016llx\n", shm_simd_names[level], shm_dtype_names[dtype],
                       shm_op_names[op], (unsigned long long)hash);
            }
        }
    }
    return 0;
}
