/* Layer 5: per-key FIFO queues. A queue is a singly linked list of message
 * blocks (rdv_msg.next), changed only under its slot's lock; a message's
 * bytes are written before the lock is taken, so the unlock (release)
 * publishes them to the receiver that next takes the lock (acquire). */
#include <errno.h>
#include <string.h>

#include "rdv_arena.h"
#include "rdv_atomic.h"
#include "rdv_index.h"
#include "rdv_lock.h"
#include "rdv_queue.h"
#include "rdv_wait.h"

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

int rdv_queue_link(rdv_t *h, uint64_t pos) {
    uint64_t len;
    struct rdv_msg *m = rdv_queue_writing(h, pos, h->me + 1, &len);
    if (!m)
        return -EINVAL;
    /* the header is ours, but it lives in shared memory: bound what we read */
    if (m->key_len == 0 || m->key_len > RDV_KEY_MAX || m->ndim > RDV_NDIM_MAX ||
        sizeof *m + 16ull * m->ndim + m->key_len > len)
        return -EBADMSG;
    uint32_t idx;
    int rc = rdv_index_acquire(h, rdv_msg_key(m), m->key_len, 1, &idx);
    if (rc < 0)
        return rc;
    struct rdv_slot *s = &h->kslots[idx];
    if (rdv_is_aborted(h)) {
        /* rdv_abort drains each slot under its lock after setting the state:
         * a message linked after that drain would never be freed */
        rdv_index_maybe_delete(h, idx);
        rdv_index_release(h, idx);
        return -ECONNABORTED;
    }
    /* QUEUED before linking, owner cleared after: if we die in between
     * (holding the lock), repair finds the block by its owner and stage.
     * This store is the commit point: repair keeps a QUEUED block, and a
     * marked commit counts as done from here on (rdv_mark.c). */
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
    int wake = s->waiters != 0;
    if (wake)
        rdv_wake_bump(&s->seq);
    rdv_index_release(h, idx);
    if (wake) /* a stale wake on a slot reused meanwhile is harmless */
        rdv_wake_sleepers(&s->seq, &s->sleepers);
    return 0;
}

int rdv_queue_pop(rdv_t *h, struct rdv_slot *s, const char *key, uint32_t key_len, int leased,
                  struct rdv_msg_info *out) {
    uint64_t len;
    const struct rdv_msg *m = rdv_queued_msg(h, s->q_head, &len);
    if (!m)
        return -EBADMSG;
    uint64_t pos = m->pos;
    uint32_t ndim = m->ndim, dlen = m->dtype_len, off = m->payload_off;
    if (ndim > RDV_NDIM_MAX || dlen == 0 || dlen > RDV_DTYPE_MAX || m->key_len != key_len ||
        off != rdv_meta_bytes(ndim, key_len) || m->nbytes > len - off)
        return -EBADMSG;
    const int64_t *dims = (const int64_t *)(m + 1);
    if (memcmp(dims + 2 * ndim, key, key_len) != 0)
        return -ENOTUNIQ; /* 128-bit hash collision: refuse rather than misdeliver */

    out->payload = (uint8_t *)m + off;
    out->nbytes = m->nbytes;
    out->pos = pos;
    out->ndim = ndim;
    out->dtype_len = dlen;
    memset(out->dtype, 0, sizeof out->dtype);
    memcpy(out->dtype, m->dtype, dlen);
    memcpy(out->dims, dims, 16ull * ndim);
    rdv_wait_note_sender(h, m->sender_cpu);

    /* Owner and flags, then DELIVERED, then unlinked, in this order against
     * our death (whoever repairs the slot after it sees a prefix of these
     * stores): before the stage, a QUEUED block that repair keeps; after it,
     * a plain view that repair drops from the queue and reclaiming frees
     * with our other views, or a leased one that repair keeps in place. */
    struct rdv_msg *km = (struct rdv_msg *)m;
    km->owner = (uint16_t)(h->me + 1);
    km->flags = leased ? RDV_MSG_LEASED : 0;
    /* release, both: order the stores above before these (see above); the
     * slot lock's release publishes them to other processes */
    smp_store_release(&km->stage, RDV_MSG_DELIVERED);
    smp_store_release(&s->q_head, km->next);
    if (s->q_head == 0)
        s->q_tail = 0;
    s->count--;
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
    if (m->ndim > RDV_NDIM_MAX || m->key_len == 0 || m->key_len > RDV_KEY_MAX ||
        m->key_len != s->key_len || sizeof *m + 16ull * m->ndim + m->key_len > len)
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

/* Keep the QUEUED messages reachable from q_head, in order, then append any
 * message the dead process had marked QUEUED but not yet linked. A block
 * the dead leased that is still reachable (a leased pop it had not finished
 * unlinking, or leased messages its reclaimer was putting back, see
 * rdv_lease.c) stays where it is, queued again: what reclaiming the lease
 * would have done. */
void rdv_queue_repair(rdv_t *h, uint32_t idx, uint32_t dead) {
    struct rdv_slot *s = &h->kslots[idx];
    if (s->state != RDV_SLOT_LIVE)
        return; /* died inserting it, before it was published */
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
        /* else: a pop the dead process started; its block is freed as its own */
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

void rdv_queue_drain_all(rdv_t *h) {
    for (uint64_t i = 0; i <= h->slot_mask; i++) {
        struct rdv_slot *s = &h->kslots[i];
        if (READ_ONCE(s->state) != RDV_SLOT_LIVE) /* relaxed: re-checked under the lock */
            continue;
        rdv_lock(h, &s->lock);
        uint32_t g = 0;
        if (s->state == RDV_SLOT_LIVE) {
            g = take_all(h, s);
            rdv_wake_all(&s->seq, &s->sleepers);
            rdv_index_maybe_delete(h, (uint32_t)i);
        }
        rdv_unlock(&s->lock);
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
