/* Layer 7: leased receive: a message taken with rdv_recv_leased whose receiver dies
 * before releasing it goes back to the head of its key's queue, for the next
 * receiver (at-least-once forwarding: the network bridge frees a message
 * only once the far side has it), instead of being freed with the dead
 * receiver's other views.
 *
 * A leased view is a DELIVERED block owned by its receiver with
 * RDV_MSG_LEASED in its flags. The receiver's reclaimer (holding its byte
 * lock, acting as it) gives them back one key at a time; for the key of the
 * first leased view an arena walk finds:
 *   1. chain every leased view of that key through their next links, in
 *      the order of their allocation numbers (a block position carries
 *      its number; a handle's numbers grow along its allocations). The
 *      forwarder took them in queue order, so this is their queue order
 *      whenever their numbers' order was (one producer per key, say). One
 *      walk of the arena per key: recovery is
 *      rare, and a forwarder reads few keys (the bridge, one);
 *   2. find the key's slot, or create it again (its queue may have emptied
 *      and the slot been deleted since), and hold its lock as the dead;
 *   3. point the chain's last link at the queue's head, then the queue's
 *      head at the chain: the commit point;
 *   4. make each block QUEUED again, fix count and tail, wake the key's
 *      receivers, unlock.
 * If we die in the middle: up to step 3 the queue is as it was and the
 * blocks are still the dead's leased views, so whoever reclaims it next
 * (its entry is not FREE yet) starts over. From step 3 on, the slot lock
 * names the dead, so its next reclaimer repairs the slot first, and
 * rdv_queue_repair keeps a leased block of the dead that the queue reaches, where
 * it is; nothing is left to give back. Either way each block ends up queued
 * once, in order, ahead of whatever was queued meanwhile.
 *
 * Given back nowhere, freed instead: in an aborted rendezvous (abort frees
 * queued messages too); when the key index is full and the key's slot was
 * deleted (counted in leases_dropped); a view whose header is damaged is
 * skipped here and freed by our caller with the dead's other views. */
#include <string.h>

#include "rdv_arena.h"
#include "rdv_atomic.h"
#include "rdv_index.h"
#include "rdv_lease.h"
#include "rdv_lock.h"
#include "rdv_queue.h"
#include "rdv_wait.h"

/* The leased views of one key, linked oldest first. */
struct chain {
    const char *key; /* the key bytes in the first view */
    uint32_t key_len;
    uint32_t first;  /* granule + 1, as queue links */
    uint32_t last_g;
    struct rdv_msg *last;
    uint32_t n;
};

/* The key of block m if it is a leased view of who with a header we can
 * read it from; NULL otherwise. Nobody but us changes a dead entry's views,
 * so plain reads are enough. */
static const char *leased_key(rdv_t *h, struct rdv_msg *m, uint32_t who, uint32_t *key_len) {
    uint64_t len;
    if (!rdv_block_at(h, m->pos, &len) || !rdv_msg_leased_by(m, who) || !rdv_msg_key_fits(m, m->payload_off))
        return NULL; /* rdv_block_at checked payload_off against the block length */
    *key_len = m->key_len;
    return rdv_msg_key(m);
}

/* How long ago the block at pos was numbered, in allocation numbers. */
static uint64_t age(rdv_t *h, uint64_t pos) {
    /* relaxed: a counter that only grows; a stale value shifts every age
     * alike. Past every number handed out (reserved ranges included). */
    uint64_t now = READ_ONCE(h->khdr->arena.alloc_seq);
    return (now - rdv_pos_seq(pos)) & ((1ULL << (64 - RDV_GRANULE_BITS)) - 1);
}

/* Put m into the chain, which is sorted oldest first, if it is a leased
 * view of who and of the chain's key (the first one found sets the key).
 * A view's link is nobody's to read until give_back publishes the chain. */
static void consider(rdv_t *h, struct chain *c, struct rdv_msg *m, uint32_t who) {
    uint32_t key_len;
    const char *key = leased_key(h, m, who, &key_len);
    if (!key)
        return;
    uint32_t g = rdv_link_of(m->pos);
    if (c->n == 0) {
        c->key = key;
        c->key_len = key_len;
        c->first = c->last_g = g;
        c->last = m;
        m->next = 0;
        c->n = 1;
        return;
    }
    if (key_len != c->key_len || memcmp(key, c->key, key_len) != 0)
        return;
    uint64_t a = age(h, m->pos);
    uint64_t len;
    struct rdv_msg *prev = NULL, *cur = rdv_queued_msg(h, c->first, &len);
    while (cur && age(h, cur->pos) > a) { /* older ones stay in front */
        prev = cur;
        cur = cur->next ? rdv_queued_msg(h, cur->next, &len) : NULL;
    }
    m->next = prev ? prev->next : c->first;
    if (prev)
        prev->next = g;
    else
        c->first = g;
    if (!cur) {
        c->last = m;
        c->last_g = g;
    }
    c->n++;
}

/* Step 1 for the first key left: 0 if the dead holds no leased view. */
static int gather(rdv_t *h, uint32_t who, struct chain *c) {
    memset(c, 0, sizeof *c);
    /* our views stay while we walk: only we free them */
    struct rdv_msg *m;
    for (uint32_t b = 0; (m = rdv_arena_next(h, &b)); rdv_arena_step(h, &b))
        consider(h, c, m, who);
    return c->n != 0;
}

/* Free the chain's views (the key cannot take them). */
static void free_chain(rdv_t *h, const struct chain *c, int count_dropped) {
    uint32_t g = c->first;
    for (uint32_t i = 0; i < c->n; i++) {
        uint64_t len;
        struct rdv_msg *m = rdv_queued_msg(h, g, &len);
        if (!m)
            return; /* cannot happen: only we free these; the caller frees what is left */
        g = m->next; /* before the free: the space may be reused at once */
        if (count_dropped) /* relaxed: a statistic */
            rdv_fetch_add(&h->khdr->leases_dropped, 1, __ATOMIC_RELAXED);
        rdv_arena_free(h, m->pos);
    }
}

/* Steps 2 to 4 for one chain. */
static void give_back(rdv_t *h, uint32_t who, const struct chain *c) {
    uint32_t idx;
    /* Our own identity for finding or inserting (rdv_index.c locks as us):
     * if we die in there, whoever reclaims us repairs what we held. */
    if (rdv_index_acquire(h, c->key, c->key_len, RDV_INDEX_RESTORE, &idx) < 0) {
        free_chain(h, c, 1); /* -ENOSPC: no slot is free at all */
        return;
    }
    struct rdv_slot *s = &h->kslots[idx];
    /* Hand the lock we hold over to the dead: if we die from here on, its
     * next reclaimer repairs the slot as the dead's (see the top).
     * The stores below cannot move above the hand-over, so a death after
     * any of them leaves the lock naming the dead. Lock waiters see a live
     * holder: we hold the dead's byte lock (and rdv.reclaiming). */
    rdv_lock_hand_over(h, &s->lock, who);
    if (rdv_is_aborted(h)) {
        /* rdv_abort drains each slot under its lock after setting the state:
         * a message queued after that drain would never be freed */
        rdv_index_maybe_delete(h, idx);
        rdv_unlock(h, &s->lock);
        free_chain(h, c, 0);
        return;
    }
    c->last->next = s->q_head; /* the last view's link: unreachable until below */
    /* release: the chain's links land before the queue reaches them. The
     * commit point: from here a repair keeps them all, in order. */
    smp_store_release(&s->q_head, c->first);
    /* full barrier: and the commit point before any block turns QUEUED. A
     * QUEUED block of the dead that the queue does not reach would be taken
     * by repair for a send the dead was linking, and put at the tail. */
    smp_mb();
    uint32_t g = c->first;
    for (uint32_t i = 0; i < c->n; i++) {
        uint64_t len;
        struct rdv_msg *m = rdv_queued_msg(h, g, &len);
        if (!m)
            break; /* cannot happen: the chain is ours until we unlock */
        g = m->next;
        rdv_queue_requeue(m);
    }
    if (s->q_tail == 0)
        s->q_tail = c->last_g;
    s->count += c->n;
    /* Hand them to waiting receivers, waking them under the lock: if we die
     * before, the lock still names the dead and its repair serves them. */
    rdv_queue_serve(h, idx, NULL);
    rdv_index_maybe_delete(h, idx);
    rdv_unlock(h, &s->lock);
}

void rdv_lease_recover(rdv_t *h, uint32_t dead) {
    struct chain c;
    /* Each round gives back or frees at least one view: bounded by the most
     * blocks the arena can hold, in case damage keeps one coming back. */
    for (uint64_t rounds = h->granules;
         rounds-- && gather(h, dead + 1, &c);)
        give_back(h, dead + 1, &c);
}
