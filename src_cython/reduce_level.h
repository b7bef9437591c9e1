/* One SIMD level's reduction kernels and their table, generated from SHM_DTYPE_TABLE.
 *
 * Included once per level by reduce_kernels.c (no include guard), with SHM_L defined to the
 * level's name (baseline, avx2, avx512, neon) and, where the level has a target, inside that
 * target's pragma region, so the compiler vectorizes the same C for that instruction set. Before
 * each inclusion the level defines its half-precision block conversions,
 * shm_<L>_load_FLOAT16 / shm_<L>_store_FLOAT16 and the same for BFLOAT16. Defines
 * shm_<L>_<DTYPE>_<OP> for every supported pair, and the table shm_kernels_<L>.
 */

#define SHM_FN(ID, OP) SHM_PASTE3(SHM_L, ID, OP)
#define SHM_BLOCKFN(WHAT, ID) SHM_PASTE3(SHM_L, WHAT, ID)

/* INT: sums, products and bit ops in the unsigned twin (wrap-around, no UB); min/max signed. */
#define SHM_DEFINE_INT(ID, T, U)                                                                  \
    SHM_KERNEL(SHM_FN(ID, SUM), U, U, SHM_ID, SHM_ID, SHM_OP_SUM, SHM_ID, SHM_AS_IS)                         \
    SHM_KERNEL(SHM_FN(ID, PRODUCT), U, U, SHM_ID, SHM_ID, SHM_OP_PROD, SHM_ID, SHM_AS_IS)                    \
    SHM_KERNEL(SHM_FN(ID, MIN), T, T, SHM_ID, SHM_ID, SHM_OP_MIN, SHM_ID, SHM_AS_IS)                         \
    SHM_KERNEL(SHM_FN(ID, MAX), T, T, SHM_ID, SHM_ID, SHM_OP_MAX, SHM_ID, SHM_AS_IS)                         \
    SHM_KERNEL(SHM_FN(ID, BAND), U, U, SHM_ID, SHM_ID, SHM_OP_BAND, SHM_ID, SHM_AS_IS)                       \
    SHM_KERNEL(SHM_FN(ID, BOR), U, U, SHM_ID, SHM_ID, SHM_OP_BOR, SHM_ID, SHM_AS_IS)                         \
    SHM_KERNEL(SHM_FN(ID, BXOR), U, U, SHM_ID, SHM_ID, SHM_OP_BXOR, SHM_ID, SHM_AS_IS)            \
    SHM_KERNEL(SHM_FN(ID, AVG), T, U, SHM_TO_ACC, SHM_TO_ELEM, SHM_OP_SUM, SHM_DIVN_INT, SHM_AS_IS)
#define SHM_ROW_INT(ID)                                                                           \
    {[SHM_SUM] = SHM_FN(ID, SUM), [SHM_PRODUCT] = SHM_FN(ID, PRODUCT), [SHM_MIN] = SHM_FN(ID, MIN), \
     [SHM_MAX] = SHM_FN(ID, MAX), [SHM_AVG] = SHM_FN(ID, AVG), [SHM_BAND] = SHM_FN(ID, BAND),     \
     [SHM_BOR] = SHM_FN(ID, BOR), [SHM_BXOR] = SHM_FN(ID, BXOR)}

/* BOOL (bytes 0 or 1): sum and max are "or", product and min are "and". */
#define SHM_DEFINE_BOOL(ID, T, U)                                                                 \
    SHM_KERNEL(SHM_FN(ID, BOR), T, T, SHM_ID, SHM_ID, SHM_OP_BOR, SHM_ID, SHM_AS_IS)                         \
    SHM_KERNEL(SHM_FN(ID, BAND), T, T, SHM_ID, SHM_ID, SHM_OP_BAND, SHM_ID, SHM_AS_IS)                       \
    SHM_KERNEL(SHM_FN(ID, BXOR), T, T, SHM_ID, SHM_ID, SHM_OP_BXOR, SHM_ID, SHM_AS_IS)
#define SHM_ROW_BOOL(ID)                                                                          \
    {[SHM_SUM] = SHM_FN(ID, BOR), [SHM_PRODUCT] = SHM_FN(ID, BAND), [SHM_MIN] = SHM_FN(ID, BAND), \
     [SHM_MAX] = SHM_FN(ID, BOR), [SHM_BAND] = SHM_FN(ID, BAND), [SHM_BOR] = SHM_FN(ID, BOR),    \
     [SHM_BXOR] = SHM_FN(ID, BXOR)}

#define SHM_DEFINE_FLOAT(ID, T, H)                                                                \
    SHM_KERNEL(SHM_FN(ID, SUM), T, T, SHM_ID, SHM_ID, SHM_OP_SUM, SHM_ID, SHM_AS_IS)                         \
    SHM_KERNEL(SHM_FN(ID, PRODUCT), T, T, SHM_ID, SHM_ID, SHM_OP_PROD, SHM_ID, SHM_AS_IS)                    \
    SHM_KERNEL(SHM_FN(ID, MIN), T, T, SHM_ID, SHM_ID, SHM_OP_MIN, SHM_ID, SHM_AS_IS)                         \
    SHM_KERNEL(SHM_FN(ID, MAX), T, T, SHM_ID, SHM_ID, SHM_OP_MAX, SHM_ID, SHM_AS_IS)                         \
    SHM_KERNEL(SHM_FN(ID, AVG), T, T, SHM_ID, SHM_ID, SHM_OP_SUM, SHM_DIVN, SHM_AS_IS)           \
    SHM_KERNEL(SHM_FN(ID, PREMUL_SUM), T, T, SHM_ID, SHM_ID, SHM_OP_SUM, SHM_ID, SHM_TIMES)
#define SHM_ROW_FLOAT(ID)                                                                         \
    {[SHM_SUM] = SHM_FN(ID, SUM), [SHM_PRODUCT] = SHM_FN(ID, PRODUCT), [SHM_MIN] = SHM_FN(ID, MIN), \
     [SHM_MAX] = SHM_FN(ID, MAX), [SHM_AVG] = SHM_FN(ID, AVG), [SHM_PREMUL_SUM] = SHM_FN(ID, PREMUL_SUM)}

/* HALF: blocks converted to float32 by the level's converters, reduced, rounded once. */
#define SHM_DEFINE_HALF(ID, T, H)                                                                 \
    SHM_HALF_KERNEL(SHM_FN(ID, SUM), SHM_BLOCKFN(load, ID), SHM_BLOCKFN(store, ID), SHM_OP_SUM, SHM_ID, SHM_AS_IS) \
    SHM_HALF_KERNEL(SHM_FN(ID, PRODUCT), SHM_BLOCKFN(load, ID), SHM_BLOCKFN(store, ID), SHM_OP_PROD, SHM_ID, SHM_AS_IS) \
    SHM_HALF_KERNEL(SHM_FN(ID, MIN), SHM_BLOCKFN(load, ID), SHM_BLOCKFN(store, ID), SHM_OP_MIN, SHM_ID, SHM_AS_IS) \
    SHM_HALF_KERNEL(SHM_FN(ID, MAX), SHM_BLOCKFN(load, ID), SHM_BLOCKFN(store, ID), SHM_OP_MAX, SHM_ID, SHM_AS_IS) \
    SHM_HALF_KERNEL(SHM_FN(ID, AVG), SHM_BLOCKFN(load, ID), SHM_BLOCKFN(store, ID), SHM_OP_SUM, SHM_DIVN, SHM_AS_IS) \
    SHM_HALF_KERNEL(SHM_FN(ID, PREMUL_SUM), SHM_BLOCKFN(load, ID), SHM_BLOCKFN(store, ID), SHM_OP_SUM, SHM_ID, SHM_TIMES)
#define SHM_ROW_HALF SHM_ROW_FLOAT

/* COMPLEX: no order, so sum, product and average only. AVG divides each component by n (a
 * complex division would round differently). Every level uses baseline's complex kernels: GCC
 * vectorizes a complex product with fused multiply-adds (vfmaddsub) whatever -ffp-contract says,
 * which changes the last bit; complex numbers are not what this library is fast for. */
#define SHM_CFN(ID, OP) SHM_PASTE3(baseline, ID, OP)
#ifdef SHM_LEVEL_IS_BASELINE
#define SHM_DEFINE_COMPLEX(ID, T, R)                                                              \
    SHM_KERNEL(SHM_CFN(ID, SUM), T, T, SHM_ID, SHM_ID, SHM_OP_SUM, SHM_ID, SHM_AS_IS)                        \
    SHM_KERNEL(SHM_CFN(ID, PRODUCT), T, T, SHM_ID, SHM_ID, SHM_OP_PROD, SHM_ID, SHM_AS_IS)                   \
    static void SHM_CFN(ID, AVG)(void *dst, const void *const *srcs, const double *factors, int n, \
                                 size_t count) {                                                  \
        R *parts = (R *)dst;                                                                      \
        SHM_CFN(ID, SUM)(dst, srcs, factors, n, count);                                           \
        for (size_t i = 0; i < 2 * count; i++) parts[i] /= (R)n;                                  \
    }
#else
#define SHM_DEFINE_COMPLEX(ID, T, R)
#endif
#define SHM_ROW_COMPLEX(ID)                                                                       \
    {[SHM_SUM] = SHM_CFN(ID, SUM), [SHM_PRODUCT] = SHM_CFN(ID, PRODUCT), [SHM_AVG] = SHM_CFN(ID, AVG)}

#define SHM_DEFINE(ID, NAME, T, FAMILY, H) SHM_DEFINE_##FAMILY(ID, T, H)
#define SHM_ROW(ID, NAME, T, FAMILY, H) [SHM_##ID] = SHM_ROW_##FAMILY(ID),

SHM_DTYPE_TABLE(SHM_DEFINE)

static const shm_kernel_t SHM_PASTE2(kernels, SHM_L)[SHM_NDTYPES][SHM_NOPS] = {SHM_DTYPE_TABLE(SHM_ROW)};

#undef SHM_FN
#undef SHM_BLOCKFN
#undef SHM_DEFINE_INT
#undef SHM_ROW_INT
#undef SHM_DEFINE_BOOL
#undef SHM_ROW_BOOL
#undef SHM_DEFINE_FLOAT
#undef SHM_ROW_FLOAT
#undef SHM_DEFINE_HALF
#undef SHM_ROW_HALF
#undef SHM_CFN
#undef SHM_DEFINE_COMPLEX
#undef SHM_ROW_COMPLEX
#undef SHM_DEFINE
#undef SHM_ROW
