/* Layer 2: liveness. A process entry is alive while some open file
 * description holds the write lock on its byte of the segment file; the
 * kernel drops it when the process dies. This layer only tells; reclaiming
 * what a dead process held is recovery's (rdv_recover.c). */
#ifndef RDV_LIVE_H
#define RDV_LIVE_H

#include <stdint.h>

#include "rdv_handle.h"

/* Claim a FREE entry for this handle (its byte lock, ALIVE): sets h->me. 0
 * or -EUSERS when the table is full. */
int rdv_live_claim(rdv_t *h);
/* Give our own entry back (FREE, then our byte lock). */
void rdv_live_release(rdv_t *h);
/* The default rdv_ops.alive: us, a thread of ours acting for the entry, or
 * another open file description holding its byte. */
int rdv_live_alive(rdv_t *h, uint32_t entry);
/* Whether another process holds the entry's byte: its owner lives. */
int rdv_live_held_elsewhere(rdv_t *h, uint32_t entry);
/* Act for entry: claim it among our threads, then take its byte lock. 0,
 * or -EBUSY if one of our threads or another process holds it. */
int rdv_live_take(rdv_t *h, uint32_t entry);
void rdv_live_give_back(rdv_t *h, uint32_t entry);

#endif
