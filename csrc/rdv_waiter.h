/* Layer 5: waiter records: receivers waiting in line on a key (see
 * struct rdv_waiter in rdv_layout.h), the slabs they live in, the waiter
 * queue's links, and waking a waiter. */
#ifndef RDV_WAITER_H
#define RDV_WAITER_H

#include <stdint.h>

#include "rdv_handle.h"

/* The record at link (granule + 1), or NULL if the link is out of range.
 * Any granule inside the arena is safe to read; what a record says is
 * checked where it is used. */
static inline struct rdv_waiter *rdv_waiter_at(const rdv_t *h, uint32_t link) {
    if (link == 0 || link > h->granules + RDV_MAX_PROCS * RDV_SLAB_GRANULES)
        return NULL;
    return (struct rdv_waiter *)(h->karena + (uint64_t)(link - 1) * RDV_GRANULE);
}

/* More than any line can hold: the bound of every walk along one. */
static inline uint64_t rdv_waiter_walk_max(const rdv_t *h) {
    return (uint64_t)h->granules + RDV_MAX_PROCS * RDV_SLAB_GRANULES;
}

/* The link of the leader of w's group (w's own link is `link`): the
 * record whose state decides the wait; w itself if its group link is out
 * of range (damage). */
static inline uint32_t rdv_waiter_leader_link(const rdv_t *h, const struct rdv_waiter *w, uint32_t link) {
    return rdv_waiter_at(h, w->group) ? w->group : link;
}

/* n records of ours, not linked anywhere, into links[]: state WAITING, a
 * group of their own. Allocates a slab from the arena when none is free:
 * -ENOSPC if the arena has no room for one. */
int rdv_waiter_alloc(rdv_t *h, uint32_t n, uint32_t *links);
/* Entry who - 1's home slab, emptied (its records unlinked, by recovery):
 * no longer a slab of anyone's until its next owner's first wait. */
void rdv_waiter_home_reset(rdv_t *h, uint32_t who);
/* Give records back to our pool (they must be linked nowhere). */
void rdv_waiter_free(rdv_t *h, uint32_t n, const uint32_t *links);
/* One record if our pool has one free at hand (1), without allocating a
 * slab or waiting for the pool's lock: safe under a slot lock. */
int rdv_waiter_alloc_cached(rdv_t *h, uint32_t *link);
/* Whether link is a record in one of our slabs. */
int rdv_waiter_ours(rdv_t *h, uint32_t link);
/* Forget the pool, once our slabs are freed (the handle's last reference). */
void rdv_waiter_pool_drop(rdv_t *h);

/* With slot idx locked: link record `link` at the tail of its waiter queue. */
void rdv_waiter_link(rdv_t *h, uint32_t idx, uint32_t link);
/* With slot idx locked: unlink record `link` if the queue holds it (1), or
 * just mark it unlinked (0): a sender that died part-way through an unlink
 * can leave a record that says it is linked and is not. */
int rdv_waiter_unlink(rdv_t *h, uint32_t idx, uint32_t link);
/* With slot idx locked (as the dead holder, by its reclaimer, or as the
 * reclaimer of dead entry drop - 1): rebuild the waiter queue from its
 * forward links, keeping the records still waiting that entry drop - 1
 * does not own. Every record dropped is marked unlinked. */
void rdv_waiter_rebuild(rdv_t *h, uint32_t idx, uint32_t drop);

/* Decide a wait: the leader's state from WAITING to `to` (HANDED | granule
 * for a send, CANCELLED for its owner). 1 if this call decided it. */
int rdv_waiter_decide(struct rdv_waiter *leader, uint32_t to);
/* Waking the receiver behind a leader record after its state changed (or
 * the rendezvous was aborted), in two halves. rdv_waiter_wake_prepare runs
 * while the record is still linked (its owner cannot free it then): for an
 * async record it sets its slab's hint. It notes what to wake: the
 * record's futex word, or its owner's bell. rdv_waiter_wake_now makes the
 * wake, after the unlock too: it only bumps a bell and makes a syscall, so
 * a record freed meanwhile gets at most a spare wake. */
struct rdv_wake {
    uint32_t *word;     /* NULL: nothing to wake */
    uint32_t *sleepers;
    int bump;           /* a bell: bump it first */
};
void rdv_waiter_wake_prepare(rdv_t *h, uint32_t link, struct rdv_wake *wk);
void rdv_waiter_wake_now(const struct rdv_wake *wk);

/* Our async leader records that were handed a message, into out (up to
 * cap), from the slabs whose hint is set (the hints are cleared). */
uint32_t rdv_waiter_handed(rdv_t *h, uint32_t *out, uint32_t cap);
/* Whether a slab of ours has its hint set; if full, every record is looked
 * at too, and a slab with a handed async record gets its hint back. */
int rdv_waiter_hinted(rdv_t *h, int full);
/* Each slab of entry who - 1 (of every entry if who is 0) in turn, home
 * slabs last: from *g = 0, the next one's header (NULL at the end) and its
 * first and last record links. */
struct rdv_msg *rdv_waiter_slab_next(rdv_t *h, uint32_t who, uint32_t *g, uint32_t *first,
                                     uint32_t *last);

#endif
