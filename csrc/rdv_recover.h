/* Layer 8: recovery, without a daemon. Any process may reclaim a dead
 * entry; each structure's repair lives beside it (rdv_arena_repair,
 * rdv_queue_repair, rdv_lease_recover, rdv_mark_recover); this layer finds
 * the dead and runs the repairs in order. */
#ifndef RDV_RECOVER_H
#define RDV_RECOVER_H

#include <stdint.h>

#include "rdv_handle.h"

/* Reclaim every entry whose process died; *reclaimed (may be NULL) counts them. */
int rdv_recover_dead(rdv_t *h, uint32_t *reclaimed);
/* The hooks recovery serves (rdv_ops): a lock waiter found a dead holder;
 * a waiter wants the dead reclaimed. */
void rdv_recover_dead_holder(rdv_t *h, uint32_t *klock, uint32_t holder);
void rdv_recover_reclaim_hook(rdv_t *h);
/* Our own entry, on the last close: a block we reserved and never committed
 * or discarded would stay; reclaim it as we would a dead one's. */
void rdv_recover_own(rdv_t *h);

#endif
