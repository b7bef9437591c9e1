/* The reduction kernels' interface (implemented in reduce_kernels.c, a translation unit of its own:
 * it is compiled at -O3 and in parallel with the Cython module, which is most of the build time).
 *
 * Reductions run in source order, so every rank that reduces the same inputs gets the same bits;
 * dst may alias any source. The symbols are hidden: they are the extension's own, never exported.
 */
#ifndef SHMCOMM_REDUCE_KERNELS_H
#define SHMCOMM_REDUCE_KERNELS_H

#include <stddef.h>

#include "shm_dtypes.h"
#include "shm_simd.h"

#define SHM_HIDDEN __attribute__((visibility("hidden")))

/* dst, the n sources, the sources' factors (PREMUL_SUM only; NULL for the other ops), n, count */
typedef void (*shm_kernel_t)(void *dst, const void *const *srcs, const double *factors, int n,
                             size_t count);

/* 1 if (dtype, op) has a kernel. */
SHM_HIDDEN int shm_reduce_supported(int dtype, int op);
/* Reduces with the kernels of `level` (which the caller checked with shm_simd_runs). Returns 0,
 * or -1 for an unsupported (dtype, op) pair (the caller validates first). */
SHM_HIDDEN int shm_reduce_at(int level, void *dst, const void *const *srcs, const double *factors,
                             int n, size_t count, int dtype, int op);
/* Reduces with the level in use (shm_simd_level). factors: one per source, read for PREMUL_SUM
 * only. */
SHM_HIDDEN int shm_reduce(void *dst, const void *const *srcs, const double *factors, int n,
                          size_t count, int dtype, int op);

#endif
