/* The one table of element types and reduce ops.
 *
 * Everything that names a dtype or an op is generated from these two X-macros: the C enums, the
 * kernel tables of every SIMD level (reduce_kernels.c), the name lists the compiled module exports
 * (DTYPE_NAMES, OP_NAMES), and from those shmcomm.ReduceOp, the torch backend's native dtypes, the
 * bench tool's --dtype/--op choices and the tests' lists. To add a dtype or an op, add a row here
 * (and, for an op, its element operation in reduce_kernels.c); nothing else keeps a list.
 *
 * SHM_DTYPE_TABLE(X) rows are X(ID, "numpy name", storage type, family, helper type):
 *   family  INT: the helper is the unsigned twin (sums, products and bit ops wrap, as numpy's);
 *           BOOL: one byte, 0 or 1 (helper unused);
 *           FLOAT: the helper is the type itself;
 *           HALF: stored as 16 bits, accumulated in float32 (helper: float), one rounding at the end;
 *           COMPLEX: the helper is the real component's type (AVG divides each component).
 * SHM_OP_TABLE(X) rows are X(ID); the op's code is its position, its name is #ID. PREMUL_SUM (each
 * source times its own factor, then summed: torch's and NCCL's scaled sum, float types only) takes
 * per-rank factors and is served to the torch backend; shmcomm.ReduceOp leaves it out.
 */
#ifndef SHMCOMM_DTYPES_H
#define SHMCOMM_DTYPES_H

#include <complex.h>
#include <stdint.h>

#define SHM_DTYPE_TABLE(X)                                                                        \
    X(BOOL, "bool", uint8_t, BOOL, uint8_t)                                                       \
    X(INT8, "int8", int8_t, INT, uint8_t)                                                         \
    X(UINT8, "uint8", uint8_t, INT, uint8_t)                                                      \
    X(INT16, "int16", int16_t, INT, uint16_t)                                                     \
    X(UINT16, "uint16", uint16_t, INT, uint16_t)                                                  \
    X(INT32, "int32", int32_t, INT, uint32_t)                                                     \
    X(UINT32, "uint32", uint32_t, INT, uint32_t)                                                  \
    X(INT64, "int64", int64_t, INT, uint64_t)                                                     \
    X(UINT64, "uint64", uint64_t, INT, uint64_t)                                                  \
    X(FLOAT16, "float16", uint16_t, HALF, float)                                                  \
    X(BFLOAT16, "bfloat16", uint16_t, HALF, float)                                                \
    X(FLOAT32, "float32", float, FLOAT, float)                                                    \
    X(FLOAT64, "float64", double, FLOAT, double)                                                  \
    X(LONGDOUBLE, "longdouble", long double, FLOAT, long double)                                  \
    X(COMPLEX64, "complex64", float _Complex, COMPLEX, float)                                     \
    X(COMPLEX128, "complex128", double _Complex, COMPLEX, double)                                 \
    X(CLONGDOUBLE, "clongdouble", long double _Complex, COMPLEX, long double)

#define SHM_OP_TABLE(X) X(SUM) X(PRODUCT) X(MIN) X(MAX) X(AVG) X(BAND) X(BOR) X(BXOR) X(PREMUL_SUM)

#define SHM_DTYPE_ENUM(ID, NAME, T, FAMILY, H) SHM_##ID,
#define SHM_OP_ENUM(ID) SHM_##ID,
enum { SHM_DTYPE_TABLE(SHM_DTYPE_ENUM) SHM_NDTYPES };
enum { SHM_OP_TABLE(SHM_OP_ENUM) SHM_NOPS };
#undef SHM_DTYPE_ENUM
#undef SHM_OP_ENUM

#define SHM_DTYPE_NAME(ID, NAME, T, FAMILY, H) NAME,
#define SHM_DTYPE_SIZE(ID, NAME, T, FAMILY, H) (int)sizeof(T),
#define SHM_OP_NAME(ID) #ID,
static const char *const shm_dtype_names[SHM_NDTYPES] = {SHM_DTYPE_TABLE(SHM_DTYPE_NAME)};
static const int shm_dtype_itemsizes[SHM_NDTYPES] = {SHM_DTYPE_TABLE(SHM_DTYPE_SIZE)};
static const char *const shm_op_names[SHM_NOPS] = {SHM_OP_TABLE(SHM_OP_NAME)};
#undef SHM_DTYPE_NAME
#undef SHM_DTYPE_SIZE
#undef SHM_OP_NAME

#endif
