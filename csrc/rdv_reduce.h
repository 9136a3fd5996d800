/* Layer 1: element-wise reductions of one dtype by one op over several
 * sources, the arithmetic of the collectives (rdv_coll.c). Pure computation:
 * no shared state. */
#ifndef RDV_REDUCE_H
#define RDV_REDUCE_H

#include <stdint.h>

/* Bytes of one element of a dtype (RDV_DT_* in shmrdv.h), 0 if unknown. */
uint32_t rdv_dtype_size(uint32_t dtype);
/* Whether op (RDV_OP_*) is defined for dtype. */
int rdv_reduce_valid(uint32_t dtype, uint32_t op);
/* dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc - 1][i], in that
 * order for every i, so every process that reduces the same sources gets
 * the same bits. float16 and bfloat16 accumulate in float32 and round once;
 * RDV_OP_MEAN is the sum divided by nsrc. dst may alias any source; dst2,
 * when not NULL, receives the same result (a second copy, written from
 * cache). n is in elements. */
void rdv_reduce(void *dst, void *dst2, const void *const *srcs, uint32_t nsrc, uint64_t n,
                uint32_t dtype, uint32_t op);

#endif
