/* Layer 6: per-key FIFO queues. A queue is a singly linked list of message
 * blocks (rdv_msg.next), changed only under its slot's lock; a message's
 * bytes are written before the lock is taken, so the unlock (release)
 * publishes them to the receiver that next takes the lock (acquire).
 *
 * A key queues messages or waiting receivers (rdv_waiter.c), never both:
 * whatever adds a message to a key with waiters hands messages to waiters,
 * oldest to oldest, before it lets go of the lock (serve). A hand-off:
 *   1. decide the oldest waiter's group: WAITING -> HANDED | granule (CAS);
 *      a group decided otherwise (withdrawn, or handed a message of
 *      another key) is unlinked and the next waiter tried;
 *   2. the leader's won names the record;
 *   3. the message: owner the receiver, flags HANDED, then DELIVERED;
 *   4. unlinked from the message queue, then the record from the waiters;
 *   5. after the unlock, wake that one receiver.
 * A holder that dies part-way leaves the lock naming it, and the repair
 * (rdv_queue_repair) finishes what step 1 decided. The receiver takes the
 * message (rdv_queue_take): its flags lose HANDED; until then its death
 * sends the message back to the head of its key (rdv_lease.c). */
#include <errno.h>
#include <string.h>

#include "rdv_arena.h"
#include "rdv_atomic.h"
#include "rdv_index.h"
#include "rdv_lock.h"
#include "rdv_queue.h"
#include "rdv_wait.h"
#include "rdv_waiter.h"

static uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

uint64_t rdv_meta_bytes(uint32_t ndim, uint32_t key_len) {
    return round_up(sizeof(struct rdv_msg) + 16ull * ndim + key_len + 8, RDV_GRANULE);
}

struct rdv_msg *rdv_queue_writing(rdv_t *h, uint64_t pos, uint32_t who, uint64_t *len) {
    struct rdv_msg *m = rdv_block_at(h, pos, len);
    /* relaxed: stage and owner change only through the block's holder: the
     * caller itself, or the dead writer whose byte lock the caller holds */
    return m && READ_ONCE(m->stage) == RDV_MSG_WRITING && READ_ONCE(m->owner) == who ? m : NULL;
}

/* With slot idx locked and a message just queued: hand messages to its
 * waiters, release the slot, then wake the first receiver served (after
 * the unlock: a receiver that preempts us finds the lock free). */
static void serve_and_release(rdv_t *h, uint32_t idx) {
    struct rdv_wake wk = {0};
    if (h->kslots[idx].w_head) {
        rdv_queue_serve(h, idx, &wk);
        rdv_index_maybe_delete(h, idx); /* handed over: the key may hold nothing now */
    }
    rdv_index_release(h, idx);
    rdv_waiter_wake_now(&wk);
}

/* With slot s locked: append message m (at pos, ours, WRITING) to its
 * queue. QUEUED before linking, owner cleared after: if we die in between
 * (holding the lock), repair finds the block by its owner and stage. The
 * stage store is the commit point: repair keeps a QUEUED block, and a
 * marked commit counts as done from here on (rdv_mark.c). One block at a
 * time is in that window, so repair's arena-order append keeps send order. */
static void append(rdv_t *h, struct rdv_slot *s, struct rdv_msg *m, uint64_t pos) {
    uint64_t len;
    m->stage = RDV_MSG_QUEUED;
    uint32_t g = rdv_link_of(pos);
    struct rdv_msg *tail = rdv_queued_msg(h, s->q_tail, &len);
    if (tail)
        tail->next = g;
    else
        s->q_head = g;
    s->q_tail = g;
    s->count++;
    m->owner = 0;
}

/* The slot of m's key, locked, created if need be (hash: as for
 * rdv_queue_link): 0, or -errno with nothing held. */
static int lock_key_of(rdv_t *h, const struct rdv_msg *m, const uint64_t *hash, uint32_t *idx) {
    int rc = hash ? rdv_index_acquire_hashed(h, hash[0], hash[1], m->key_len, RDV_INDEX_CREATE, idx)
                  : rdv_index_acquire(h, rdv_msg_key(m), m->key_len, RDV_INDEX_CREATE, idx);
    if (rc < 0)
        return rc;
    if (rdv_is_aborted(h)) {
        /* rdv_abort drains each slot under its lock after setting the state:
         * a message linked after that drain would never be freed */
        rdv_index_maybe_delete(h, *idx);
        rdv_index_release(h, *idx);
        return -ECONNABORTED;
    }
    return 0;
}

int rdv_queue_link(rdv_t *h, uint64_t pos, const uint64_t *hash) {
    uint64_t len;
    struct rdv_msg *m = rdv_queue_writing(h, pos, h->me + 1, &len);
    if (!m)
        return -EINVAL;
    /* the header is ours, but it lives in shared memory: bound what we read */
    if (!rdv_msg_key_fits(m, len))
        return -EBADMSG;
    uint32_t idx;
    int rc = lock_key_of(h, m, hash, &idx);
    if (rc < 0)
        return rc;
    append(h, &h->kslots[idx], m, pos);
    serve_and_release(h, idx);
    return 0;
}

int rdv_queue_link_run(rdv_t *h, const uint64_t *pos, uint32_t n, const uint64_t *hash) {
    struct rdv_msg *ms[RDV_LINK_RUN_MAX];
    if (n == 0 || n > RDV_LINK_RUN_MAX)
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++) { /* all ours, all of one key, before the lock */
        uint64_t len;
        struct rdv_msg *m = ms[i] = rdv_queue_writing(h, pos[i], h->me + 1, &len);
        if (!m)
            return -EINVAL;
        if (!rdv_msg_key_fits(m, len))
            return -EBADMSG;
        if (i && (m->key_len != ms[0]->key_len || memcmp(rdv_msg_key(m), rdv_msg_key(ms[0]), m->key_len) != 0))
            return -EINVAL;
    }
    uint32_t idx;
    int rc = lock_key_of(h, ms[0], hash, &idx);
    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        append(h, &h->kslots[idx], ms[i], pos[i]);
    serve_and_release(h, idx);
    return 0;
}

/* Steps 2 to 4 of a hand-off, once step 1 gave message m (the queue's
 * head) to w's group: also what a repair finishes. */
static void finish_hand_off(struct rdv_msg *m, struct rdv_waiter *leader, uint32_t w_link,
                            const struct rdv_waiter *w) {
    leader->won = w_link;
    m->owner = w->owner;
    m->flags = RDV_MSG_HANDED;
    /* release: won, owner and flags before the stage (a receiver that sees
     * DELIVERED with acquire reads them; a repair sees them in order) */
    smp_store_release(&m->stage, RDV_MSG_DELIVERED);
}

/* Hand the queue's head message to the oldest waiter still waiting: 1 and
 * its wake prepared in *wk, or 0 if none is left. */
static int hand_head(rdv_t *h, uint32_t idx, struct rdv_wake *wk) {
    struct rdv_slot *s = &h->kslots[idx];
    uint64_t len;
    struct rdv_msg *m = rdv_queued_msg(h, s->q_head, &len);
    if (!m)
        return 0;
    uint32_t g = s->q_head;
    for (uint64_t tries = 0; s->w_head && tries < rdv_waiter_walk_max(h); tries++) {
        uint32_t w_link = s->w_head;
        struct rdv_waiter *w = rdv_waiter_at(h, w_link);
        if (!w) {
            rdv_waiter_rebuild(h, idx, 0); /* damage: a head out of range */
            continue;
        }
        uint32_t l_link = rdv_waiter_leader_link(h, w, w_link);
        struct rdv_waiter *leader = rdv_waiter_at(h, l_link);
        if (!rdv_waiter_decide(leader, RDV_WAITER_HANDED | (g - 1))) {
            rdv_waiter_unlink(h, idx, w_link); /* withdrawn, or served by another key */
            continue;
        }
        finish_hand_off(m, leader, w_link, w);
        /* release: as in rdv_queue_pop, the stage lands before the unlink */
        smp_store_release(&s->q_head, m->next);
        if (s->q_head == 0)
            s->q_tail = 0;
        s->count--;
        rdv_waiter_wake_prepare(h, l_link, wk); /* while linked: its owner cannot free it yet */
        rdv_waiter_unlink(h, idx, w_link);
        return 1;
    }
    return 0;
}

void rdv_queue_serve(rdv_t *h, uint32_t idx, struct rdv_wake *later) {
    struct rdv_slot *s = &h->kslots[idx];
    for (uint64_t n = 0; s->q_head && s->w_head && n < h->granules; n++) {
        struct rdv_wake wk;
        if (!hand_head(h, idx, &wk))
            break;
        if (later && !later->word)
            *later = wk; /* the caller wakes it after its unlock */
        else
            rdv_waiter_wake_now(&wk); /* under the lock: a death leaves it to the repair */
    }
}

/* Describe message m into out, bounds-checking what shared memory says. */
static int describe(rdv_t *h, const struct rdv_msg *m, uint64_t len, struct rdv_msg_info *out) {
    uint32_t ndim = m->ndim, dlen = m->dtype_len, off = m->payload_off, key_len = m->key_len;
    if (ndim > RDV_NDIM_MAX || dlen == 0 || dlen > RDV_DTYPE_MAX || key_len == 0 ||
        key_len > RDV_KEY_MAX || off != rdv_meta_bytes(ndim, key_len) || m->nbytes > len - off)
        return -EBADMSG;
    const int64_t *dims = (const int64_t *)(m + 1);
    out->payload = (uint8_t *)m + off;
    out->nbytes = m->nbytes;
    /* Its reader starts at the payload's first line: asked for now, its
     * miss overlaps what comes before the read (a batch's other pops and
     * views). A hint: no fault, whatever the address. */
    __builtin_prefetch(out->payload, 0, 3);
    out->pos = m->pos;
    out->ndim = ndim;
    out->dtype_len = dlen;
    memset(out->dtype, 0, sizeof out->dtype);
    memcpy(out->dtype, m->dtype, dlen);
    rdv_copy_words(out->dims, dims, 2 * ndim);
    rdv_wait_note_sender(h, m->sender_cpu);
    return 0;
}

int rdv_queue_pop(rdv_t *h, struct rdv_slot *s, const char *key, uint32_t key_len, int leased,
                  struct rdv_msg_info *out) {
    uint64_t len;
    struct rdv_msg *m = rdv_queued_msg(h, s->q_head, &len);
    if (!m)
        return -EBADMSG;
    int rc = describe(h, m, len, out);
    if (rc < 0)
        return rc;
    if (m->key_len != key_len || memcmp(rdv_msg_key(m), key, key_len) != 0)
        return -ENOTUNIQ; /* 128-bit hash collision: refuse rather than misdeliver */

    /* Owner and flags, then DELIVERED, then unlinked, in this order against
     * our death (whoever repairs the slot after it sees a prefix of these
     * stores): before the stage, a QUEUED block that repair keeps; after it,
     * a plain view that repair drops from the queue and reclaiming frees
     * with our other views, or a leased one that repair keeps in place. */
    m->owner = (uint16_t)(h->me + 1);
    m->flags = leased ? RDV_MSG_LEASED : 0;
    /* release, both: order the stores above before these (see above); the
     * slot lock's release publishes them to other processes */
    smp_store_release(&m->stage, RDV_MSG_DELIVERED);
    smp_store_release(&s->q_head, m->next);
    if (s->q_head == 0)
        s->q_tail = 0;
    s->count--;
    return 0;
}

/* Whether m is a hand-off to us that its sender finished. */
static int handed_to_me(const rdv_t *h, struct rdv_msg *m) {
    /* acquire: pairs with the release of DELIVERED in finish_hand_off */
    return smp_load_acquire(&m->stage) == RDV_MSG_DELIVERED && m->owner == h->me + 1 &&
           (m->flags & RDV_MSG_HANDED);
}

int rdv_queue_take(rdv_t *h, uint32_t granule, int leased, struct rdv_msg_info *out) {
    uint64_t len;
    struct rdv_msg *m = rdv_queued_msg(h, granule + 1, &len);
    if (!m || !rdv_msg_key_fits(m, len))
        return -EBADMSG;
    /* The sender stores DELIVERED a few stores after deciding us: a short
     * spin sees it without touching the key's lock */
    for (int spins = 0; spins < RDV_HAND_OFF_SPINS && !handed_to_me(h, m); spins++)
        rdv_cpu_relax();
    if (!handed_to_me(h, m)) {
        /* Its sender is still at it, or died at it: its slot's lock waits
         * for the one and repairs after the other (finishing the hand-off). */
        uint32_t idx;
        if (rdv_index_acquire(h, rdv_msg_key(m), m->key_len, RDV_INDEX_FIND, &idx) == 0)
            rdv_index_release(h, idx);
        if (!handed_to_me(h, m))
            return -EBADMSG;
    }
    int rc = describe(h, m, len, out);
    if (rc < 0)
        return rc;
    /* ours now: a plain view (freed if we die) or a leased one */
    WRITE_ONCE(m->flags, leased ? RDV_MSG_LEASED : 0); /* relaxed: our own block */
    return 0;
}

int rdv_queue_give_back(rdv_t *h, uint64_t pos) { return rdv_queue_give_back_many(h, &pos, 1); }

int rdv_queue_give_back_many(rdv_t *h, const uint64_t *pos, uint32_t n) {
    struct rdv_msg *ms[RDV_MANY_MAX];
    if (n == 0 || n > RDV_MANY_MAX)
        return n ? -EINVAL : 0;
    for (uint32_t i = 0; i < n; i++) { /* all ours, all of one key, before anything changes */
        uint64_t len;
        struct rdv_msg *m = ms[i] = rdv_block_at(h, pos[i], &len);
        /* relaxed: our own views' headers (a kept block is no view) */
        if (!m || READ_ONCE(m->stage) != RDV_MSG_DELIVERED || m->owner != h->me + 1 || rdv_msg_kept(m) ||
            !rdv_msg_key_fits(m, len))
            return -EINVAL;
        if (i && (m->key_len != ms[0]->key_len || memcmp(rdv_msg_key(m), rdv_msg_key(ms[0]), m->key_len) != 0))
            return -EINVAL;
    }
    /* Leased first, each: if we die from here on, those not linked yet go
     * back to the key by lease recovery (in allocation order, ahead of what
     * is queued), so ahead of those linked: in order either way. */
    for (uint32_t i = 0; i < n; i++)
        WRITE_ONCE(ms[i]->flags, RDV_MSG_LEASED); /* relaxed: ordered by the releases below */
    struct rdv_msg *first = ms[0];
    uint32_t idx;
    int rc = rdv_index_acquire(h, rdv_msg_key(first), first->key_len, RDV_INDEX_RESTORE, &idx);
    if (rc < 0)
        return rc; /* still our leased views: the caller frees them */
    struct rdv_slot *s = &h->kslots[idx];
    if (rdv_is_aborted(h)) {
        rdv_index_maybe_delete(h, idx);
        rdv_index_release(h, idx);
        return -ECONNABORTED;
    }
    for (uint32_t i = n; i-- > 0;) { /* the last first, each to the head: they end in order */
        struct rdv_msg *m = ms[i];
        uint32_t g = rdv_link_of(pos[i]);
        m->next = s->q_head;
        /* release: the link lands before the head reaches it; each its own commit point */
        smp_store_release(&s->q_head, g);
        if (s->q_tail == 0)
            s->q_tail = g;
        s->count++;
        rdv_queue_requeue(m);
    }
    serve_and_release(h, idx);
    return 0;
}

void rdv_queue_requeue(struct rdv_msg *m) {
    /* relaxed, then release twice: the releases keep the stage store ahead
     * of the other two against our death (a cut in program order): QUEUED
     * first, so that whoever repairs after us still sees a block to keep
     * (QUEUED, or leased by the dead), never a view it would free */
    WRITE_ONCE(m->stage, RDV_MSG_QUEUED);
    smp_store_release(&m->flags, 0);
    smp_store_release(&m->owner, 0);
}

static int key_matches(rdv_t *h, const struct rdv_msg *m, uint64_t len, const struct rdv_slot *s) {
    if (!rdv_msg_key_fits(m, len) || m->key_len != s->key_len)
        return 0;
    uint64_t h1, h2;
    rdv_hash_key(h, rdv_msg_key(m), m->key_len, &h1, &h2);
    return h1 == s->h1 && h2 == s->h2;
}

/* Append the block at link g to a queue being rebuilt, as QUEUED. */
static void rebuild_append(uint32_t g, struct rdv_msg *m, uint32_t *head, struct rdv_msg **last,
                           uint32_t *n) {
    if (*last)
        (*last)->next = g;
    else
        *head = g;
    *last = m;
    rdv_queue_requeue(m);
    (*n)++;
}

/* A hand-off the dead holder decided (step 1) and did not finish: a record
 * still linked here whose group is HANDED a QUEUED message of this key. */
static void finish_decided(rdv_t *h, uint32_t idx) {
    struct rdv_slot *s = &h->kslots[idx];
    uint32_t link = s->w_head;
    for (uint64_t steps = 0; link && steps < rdv_waiter_walk_max(h); steps++) {
        struct rdv_waiter *w = rdv_waiter_at(h, link);
        if (!w)
            return;
        uint32_t l_link = rdv_waiter_leader_link(h, w, link);
        struct rdv_waiter *leader = rdv_waiter_at(h, l_link);
        /* relaxed: decided already; only its owner frees it, once unlinked */
        uint32_t st = READ_ONCE(leader->state);
        uint64_t len;
        struct rdv_msg *m;
        if (w->slot == idx + 1 && RDV_WAITER_KIND(st) == RDV_WAITER_HANDED &&
            (m = rdv_queued_msg(h, RDV_WAITER_GRANULE(st) + 1, &len)) && m->stage == RDV_MSG_QUEUED &&
            key_matches(h, m, len, s))
            finish_hand_off(m, leader, link, w);
        link = w->next;
    }
}

/* Keep the QUEUED messages reachable from q_head, in order, then append any
 * message the dead process had marked QUEUED but not yet linked. A block
 * the dead leased that is still reachable (a leased pop it had not finished
 * unlinking, or leased messages its reclaimer was putting back, see
 * rdv_lease.c) stays where it is, queued again: what reclaiming the lease
 * would have done. First, hand-offs the dead decided are finished, so their
 * messages leave the queue as delivered; last, the waiters still waiting
 * are kept and served. */
void rdv_queue_repair(rdv_t *h, uint32_t idx, uint32_t dead) {
    struct rdv_slot *s = &h->kslots[idx];
    if (s->state != RDV_SLOT_LIVE)
        return; /* died inserting it, before it was published */
    finish_decided(h, idx);
    uint32_t head = 0, n = 0;
    struct rdv_msg *last = NULL;
    uint32_t g = s->q_head;
    for (uint64_t steps = 0; g && steps < h->granules; steps++) {
        uint64_t len;
        struct rdv_msg *m = rdv_queued_msg(h, g, &len);
        if (!m)
            break; /* the chain is broken here */
        uint32_t next = m->next;
        if (m->stage == RDV_MSG_QUEUED || rdv_msg_leased_by(m, dead + 1))
            rebuild_append(g, m, &head, &last, &n);
        /* else: a pop the dead process started (its block is freed as its
         * own), or a hand-off it finished (the receiver's now) */
        g = next;
    }
    /* Messages it was linking: QUEUED, still owned by it, keyed here. */
    struct rdv_msg *m;
    for (uint32_t b = 0; (m = rdv_arena_next(h, &b)); rdv_arena_step(h, &b)) {
        uint64_t len;
        if (m->stage == RDV_MSG_QUEUED && m->owner == dead + 1 && rdv_block_at(h, m->pos, &len) &&
            key_matches(h, m, len, s))
            rebuild_append(rdv_link_of(m->pos), m, &head, &last, &n);
    }
    if (last)
        last->next = 0;
    s->q_head = head;
    s->q_tail = last ? rdv_link_of(last->pos) : 0;
    s->count = n;
    rdv_waiter_rebuild(h, idx, dead + 1);
    rdv_queue_serve(h, idx, NULL);
}

/* Take every message of slot s's queue as ours, delivered: a pop of each,
 * in the order pop makes its stores against our death (a reclaimer frees a
 * dead process's DELIVERED blocks), leaving them chained through their next
 * links. Called with the slot locked; returns the chain's first link. */
static uint32_t take_all(rdv_t *h, struct rdv_slot *s) {
    uint32_t first = s->q_head, g = first;
    uint64_t len;
    struct rdv_msg *m;
    for (uint32_t n = s->count; n && (m = rdv_queued_msg(h, g, &len)); n--) {
        g = m->next;
        m->owner = (uint16_t)(h->me + 1);
        m->flags = 0;
        /* release: as in rdv_queue_pop, owner before stage */
        smp_store_release(&m->stage, RDV_MSG_DELIVERED);
    }
    /* release: the stages above land before the queue lets go of them */
    smp_store_release(&s->q_head, 0);
    s->q_tail = 0;
    s->count = 0;
    return first;
}

/* Every receiver waiting on slot s: abort ends their waits. Under the
 * lock, so that our death leaves the wakes to whoever repairs the slot. */
static void wake_waiters(rdv_t *h, struct rdv_slot *s) {
    uint32_t link = s->w_head;
    for (uint64_t steps = 0; link && steps < rdv_waiter_walk_max(h); steps++) {
        struct rdv_waiter *w = rdv_waiter_at(h, link);
        if (!w)
            return;
        struct rdv_wake wk; /* linked: safe to prepare, and woken under the lock */
        rdv_waiter_wake_prepare(h, rdv_waiter_leader_link(h, w, link), &wk);
        rdv_waiter_wake_now(&wk);
        link = w->next;
    }
}

void rdv_queue_drain_all(rdv_t *h) {
    for (uint64_t i = 0; i <= h->slot_mask; i++) {
        struct rdv_slot *s = &h->kslots[i];
        if (READ_ONCE(s->state) != RDV_SLOT_LIVE) /* relaxed: re-checked under the lock */
            continue;
        rdv_lock(h, &s->lock);
        uint32_t g = 0;
        if (s->state == RDV_SLOT_LIVE) {
            g = take_all(h, s);
            wake_waiters(h, s);
            rdv_index_maybe_delete(h, (uint32_t)i);
        }
        rdv_unlock(h, &s->lock);
        /* Freed after the unlock: a free may wait on the arena's lock and
         * reclaim a dead holder, whose repair takes slot locks. */
        uint64_t len;
        struct rdv_msg *m;
        for (uint64_t steps = 0; g && steps < h->granules && (m = rdv_queued_msg(h, g, &len)); steps++) {
            g = m->next; /* before the free: the space may be reused at once */
            if (m->stage == RDV_MSG_DELIVERED && m->owner == h->me + 1)
                rdv_arena_free(h, m->pos);
            else
                break; /* not ours (damage): left to whoever reclaims */
        }
    }
    rdv_wake_all(&h->khdr->arena.space_seq, &h->khdr->arena.space_sleepers);
}
