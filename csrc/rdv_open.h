/* Layer 9: opening and closing handles: create and attach (registering in
 * the process table, reclaiming the dead), references on the mapping, and
 * fork awareness. */
#ifndef RDV_OPEN_H
#define RDV_OPEN_H

#include <errno.h>

#include "rdv_handle.h"

/* References on a handle's mapping. A handle struct is never freed (a few
 * hundred bytes per closed rendezvous), so taking a reference on a closed
 * handle fails cleanly instead of touching freed memory. -EBADF (closed,
 * or inherited through fork), -EFBIG (its segment was truncated under us). */
int rdv_get(rdv_t *h);
/* The handle's segment was truncated under it (rdv_segment.c). */
int rdv_damaged(const rdv_t *h);
int rdv_forked(const rdv_t *h);
void rdv_put(rdv_t *h);

/* The body of a public entry point: call with a reference held. */
#define WITH_REF(h, call)                                                          \
    do {                                                                           \
        int rc_ = rdv_get(h);                                                      \
        if (rc_ < 0)                                                               \
            return rc_;                                                            \
        rc_ = (call);                                                              \
        if (rdv_damaged(h)) /* truncated during the call: whatever it did is void */ \
            rc_ = -EFBIG;                                                          \
        rdv_put(h);                                                                \
        return rc_;                                                                \
    } while (0)

#endif
