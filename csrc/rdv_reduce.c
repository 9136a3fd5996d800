/* Layer 1: element-wise reductions (see rdv_reduce.h). Each dtype and op is
 * one loop over a block that stays in L1: the first source is loaded into
 * an accumulator of the dtype's accumulation type, every further source is
 * folded in, and the result is written to the destinations. Accumulating
 * per block, rather than one source pair at a time into dst, lets dst alias
 * any source and rounds float16 and bfloat16 once. */
/* The loops below are the collectives' arithmetic: vectorized (-O3: with
 * the runtime alias checks -O2's cost model refuses), whatever the build's
 * level elsewhere. */
#pragma GCC optimize("O3")

#include <complex.h>
#include <stdint.h>
#include <string.h>

#include "shmrdv.h"
#include "rdv_reduce.h"

#define BLOCK 1024 /* elements per accumulator block: 16 KiB at most */

uint32_t rdv_dtype_size(uint32_t dtype) {
    switch (dtype) {
    case RDV_DT_BOOL: case RDV_DT_I8: case RDV_DT_U8: return 1;
    case RDV_DT_I16: case RDV_DT_U16: case RDV_DT_F16: case RDV_DT_BF16: return 2;
    case RDV_DT_I32: case RDV_DT_U32: case RDV_DT_F32: return 4;
    case RDV_DT_I64: case RDV_DT_U64: case RDV_DT_F64: case RDV_DT_C64: return 8;
    case RDV_DT_C128: return 16;
    default: return 0;
    }
}

static int is_float(uint32_t dt) {
    return dt == RDV_DT_F16 || dt == RDV_DT_BF16 || dt == RDV_DT_F32 || dt == RDV_DT_F64;
}

static int is_complex(uint32_t dt) { return dt == RDV_DT_C64 || dt == RDV_DT_C128; }

int rdv_reduce_valid(uint32_t dtype, uint32_t op) {
    if (rdv_dtype_size(dtype) == 0 || op < RDV_OP_SUM || op > RDV_OP_BXOR)
        return 0;
    if (op >= RDV_OP_BAND) /* bitwise: integers and bool */
        return !is_float(dtype) && !is_complex(dtype);
    if (op == RDV_OP_MEAN)
        return is_float(dtype) || is_complex(dtype);
    if (op == RDV_OP_MIN || op == RDV_OP_MAX) /* complex numbers have no order */
        return !is_complex(dtype);
    return 1;
}

/* bfloat16 is the top half of a float32; rounding back is to nearest, ties
 * to even, and a NaN stays a (quiet) NaN, as ml_dtypes does it. */
static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* Whether a and b are the same n bytes or do not overlap at all. */
static int exact_or_apart(const void *a, const void *b, uint64_t n) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x == y || x + n <= y || y + n <= x;
}

/* NaN-propagating min and max, as numpy's minimum and maximum. */
#define FMIN(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : (b) < (a) ? (b) : (a))
#define FMAX(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : (b) > (a) ? (b) : (a))
#define IMIN(a, b) ((b) < (a) ? (b) : (a))
#define IMAX(a, b) ((b) > (a) ? (b) : (a))

/* One dtype: ELEM is how it is stored, ACC what it accumulates in (with LOAD
 * and STORE between them); integers add and multiply as the unsigned type
 * UACC, at least unsigned int wide (a narrower one would be promoted to a
 * signed int, whose overflow is undefined), wrapping as numpy does once
 * the result is cut back to ELEM. */
#define DEFINE_REDUCE(NAME, ELEM, ACC, UACC, LOAD, STORE, MIN, MAX, BITWISE, DIRECT)                \
    static void NAME(void *dst, void *dst2, const void *const *srcs, uint32_t nsrc, uint64_t n,     \
                     uint32_t op) {                                                                   \
        if (DIRECT && nsrc == 2 && op == RDV_OP_SUM && !dst2 && dst &&                                \
            exact_or_apart(dst, srcs[0], n * sizeof(ELEM)) &&                                         \
            exact_or_apart(dst, srcs[1], n * sizeof(ELEM))) {                                         \
            /* one pass: element i is read before it is written, so dst may be a source */            \
            const ELEM *a = srcs[0], *b = srcs[1];                                                    \
            ELEM *d = dst;                                                                            \
            for (uint64_t i = 0; i < n; i++)                                                          \
                d[i] = (ELEM)((UACC)a[i] + (UACC)b[i]);                                               \
            return;                                                                                   \
        }                                                                                             \
        ACC acc[BLOCK];                                                                               \
        for (uint64_t base = 0; base < n; base += BLOCK) {                                            \
            uint64_t m = n - base < BLOCK ? n - base : BLOCK;                                         \
            const ELEM *s0 = (const ELEM *)srcs[0] + base;                                            \
            for (uint64_t i = 0; i < m; i++)                                                          \
                acc[i] = LOAD(s0[i]);                                                                 \
            for (uint32_t k = 1; k < nsrc; k++) {                                                     \
                const ELEM *s = (const ELEM *)srcs[k] + base;                                         \
                switch (op) {                                                                         \
                case RDV_OP_SUM:                                                                      \
                case RDV_OP_MEAN:                                                                     \
                    for (uint64_t i = 0; i < m; i++)                                                  \
                        acc[i] = (ACC)((UACC)acc[i] + (UACC)LOAD(s[i]));                              \
                    break;                                                                            \
                case RDV_OP_PROD:                                                                     \
                    for (uint64_t i = 0; i < m; i++)                                                  \
                        acc[i] = (ACC)((UACC)acc[i] * (UACC)LOAD(s[i]));                              \
                    break;                                                                            \
                case RDV_OP_MIN:                                                                      \
                    for (uint64_t i = 0; i < m; i++)                                                  \
                        acc[i] = MIN(acc[i], LOAD(s[i]));                                             \
                    break;                                                                            \
                case RDV_OP_MAX:                                                                      \
                    for (uint64_t i = 0; i < m; i++)                                                  \
                        acc[i] = MAX(acc[i], LOAD(s[i]));                                             \
                    break;                                                                            \
                default:                                                                              \
                    BITWISE                                                                           \
                }                                                                                     \
            }                                                                                         \
            if (op == RDV_OP_MEAN)                                                                    \
                for (uint64_t i = 0; i < m; i++)                                                      \
                    acc[i] = (ACC)(acc[i] / (ACC)nsrc);                                               \
            if (dst) {                                                                                \
                ELEM *d = (ELEM *)dst + base;                                                         \
                for (uint64_t i = 0; i < m; i++)                                                      \
                    d[i] = STORE(acc[i]);                                                             \
            }                                                                                         \
            if (dst2) {                                                                               \
                ELEM *d2 = (ELEM *)dst2 + base;                                                       \
                for (uint64_t i = 0; i < m; i++)                                                      \
                    d2[i] = STORE(acc[i]);                                                            \
            }                                                                                         \
        }                                                                                             \
    }

#define SAME(x) (x)
#define NO_BITWISE break;
#define INT_BITWISE                                                                                   \
    if (op == RDV_OP_BAND)                                                                            \
        for (uint64_t i = 0; i < m; i++)                                                              \
            acc[i] &= s[i];                                                                           \
    else if (op == RDV_OP_BOR)                                                                        \
        for (uint64_t i = 0; i < m; i++)                                                              \
            acc[i] |= s[i];                                                                           \
    else                                                                                              \
        for (uint64_t i = 0; i < m; i++)                                                              \
            acc[i] ^= s[i];                                                                           \
    break;

/* bool as numpy and torch reduce it: sum and max are or; prod and min, and */
static void reduce_bool(void *dst, void *dst2, const void *const *srcs, uint32_t nsrc, uint64_t n,
                        uint32_t op) {
    uint8_t acc[BLOCK];
    for (uint64_t base = 0; base < n; base += BLOCK) {
        uint64_t m = n - base < BLOCK ? n - base : BLOCK;
        memcpy(acc, (const uint8_t *)srcs[0] + base, m);
        for (uint32_t k = 1; k < nsrc; k++) {
            const uint8_t *s = (const uint8_t *)srcs[k] + base;
            if (op == RDV_OP_PROD || op == RDV_OP_MIN || op == RDV_OP_BAND)
                for (uint64_t i = 0; i < m; i++)
                    acc[i] &= s[i];
            else if (op == RDV_OP_BXOR)
                for (uint64_t i = 0; i < m; i++)
                    acc[i] ^= s[i];
            else
                for (uint64_t i = 0; i < m; i++)
                    acc[i] |= s[i];
        }
        if (dst)
            memcpy((uint8_t *)dst + base, acc, m);
        if (dst2)
            memcpy((uint8_t *)dst2 + base, acc, m);
    }
}

DEFINE_REDUCE(reduce_i8, int8_t, int8_t, uint32_t, SAME, SAME, IMIN, IMAX, INT_BITWISE, 1)
DEFINE_REDUCE(reduce_u8, uint8_t, uint8_t, uint32_t, SAME, SAME, IMIN, IMAX, INT_BITWISE, 1)
DEFINE_REDUCE(reduce_i16, int16_t, int16_t, uint32_t, SAME, SAME, IMIN, IMAX, INT_BITWISE, 1)
DEFINE_REDUCE(reduce_u16, uint16_t, uint16_t, uint32_t, SAME, SAME, IMIN, IMAX, INT_BITWISE, 1)
DEFINE_REDUCE(reduce_i32, int32_t, int32_t, uint32_t, SAME, SAME, IMIN, IMAX, INT_BITWISE, 1)
DEFINE_REDUCE(reduce_u32, uint32_t, uint32_t, uint32_t, SAME, SAME, IMIN, IMAX, INT_BITWISE, 1)
DEFINE_REDUCE(reduce_i64, int64_t, int64_t, uint64_t, SAME, SAME, IMIN, IMAX, INT_BITWISE, 1)
DEFINE_REDUCE(reduce_u64, uint64_t, uint64_t, uint64_t, SAME, SAME, IMIN, IMAX, INT_BITWISE, 1)
#define F16_LOAD(x) ((float)(x))
#define F16_STORE(x) ((_Float16)(x))
DEFINE_REDUCE(reduce_f16, _Float16, float, float, F16_LOAD, F16_STORE, FMIN, FMAX, NO_BITWISE, 0)
DEFINE_REDUCE(reduce_bf16, uint16_t, float, float, bf16_to_f32, f32_to_bf16, FMIN, FMAX, NO_BITWISE, 0)
DEFINE_REDUCE(reduce_f32, float, float, float, SAME, SAME, FMIN, FMAX, NO_BITWISE, 1)
DEFINE_REDUCE(reduce_f64, double, double, double, SAME, SAME, FMIN, FMAX, NO_BITWISE, 1)
/* complex: no order (rdv_reduce_valid refuses min and max before we get here) */
#define NO_ORDER(a, b) (a)
DEFINE_REDUCE(reduce_c64, float complex, float complex, float complex, SAME, SAME, NO_ORDER, NO_ORDER,
              NO_BITWISE, 0)
DEFINE_REDUCE(reduce_c128, double complex, double complex, double complex, SAME, SAME, NO_ORDER,
              NO_ORDER, NO_BITWISE, 0)

void rdv_reduce(void *dst, void *dst2, const void *const *srcs, uint32_t nsrc, uint64_t n,
                uint32_t dtype, uint32_t op) {
    switch (dtype) {
    case RDV_DT_BOOL: reduce_bool(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_I8: reduce_i8(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_U8: reduce_u8(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_I16: reduce_i16(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_U16: reduce_u16(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_I32: reduce_i32(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_U32: reduce_u32(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_I64: reduce_i64(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_U64: reduce_u64(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_F16: reduce_f16(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_BF16: reduce_bf16(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_F32: reduce_f32(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_F64: reduce_f64(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_C64: reduce_c64(dst, dst2, srcs, nsrc, n, op); break;
    case RDV_DT_C128: reduce_c128(dst, dst2, srcs, nsrc, n, op); break;
    }
}
