/* Send, receive, cancel, release and abort: the per-key FIFO queues that tie
 * the key index to arena blocks. A queue is a singly linked list of message
 * blocks (rdv_msg.next), changed only under its slot's lock; a message's
 * bytes are written before the lock is taken, so the unlock (release)
 * publishes them to the receiver that next takes the lock (acquire). */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <string.h>

#include "rdv_atomic.h"
#include "rdv_layout.h"

#define RDV_RECLAIM_EVERY_NS 50000000 /* 50 ms */

static uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* Metadata bytes before the payload; keeps room for the u64 position copy. */
static uint64_t meta_bytes(uint32_t ndim, uint32_t key_len) {
    return round_up(sizeof(struct rdv_msg) + 16ull * ndim + key_len + 8, RDV_GRANULE);
}

static int do_send_begin(rdv_t *h, const char *key, uint32_t key_len, const char *dtype,
                   uint32_t dtype_len, uint32_t ndim, const int64_t *shape,
                   const int64_t *strides, uint64_t nbytes, int64_t timeout_ns,
                   uint64_t *pos, void **payload) {
    if (key_len == 0 || key_len > RDV_KEY_MAX || ndim > RDV_NDIM_MAX || dtype_len == 0 ||
        dtype_len > RDV_DTYPE_MAX)
        return -EINVAL;
    uint64_t meta = meta_bytes(ndim, key_len);
    if (nbytes > h->cap || meta + nbytes > h->cap)
        return -EMSGSIZE;

    struct rdv_deadline d;
    rdv_deadline_init(&d, timeout_ns);
    struct rdv_header *khdr = h->khdr;
    int64_t next_reclaim_ns = rdv_now_ns() + RDV_RECLAIM_EVERY_NS;
    for (;;) {
        if (rdv_is_aborted(h))
            return -ECONNABORTED;
        /* acquire: pairs with the release bump in wake_space() (rdv_arena.c)
         * after a free; our own attempt never bumps it, so a change after
         * our failed attempt means space may have appeared */
        uint32_t seen = smp_load_acquire(&khdr->space_seq);
        int rc = rdv_arena_alloc(h, meta + nbytes, pos);
        if (rc == 0)
            break;
        if (rc != -ENOSPC)
            return rc;
        if (timeout_ns == 0)
            return -ETIMEDOUT;
        /* -ETIMEDOUT only once the deadline has passed and one more attempt
         * after the last wait has failed */
        rc = rdv_wait_change(h, &khdr->space_seq, &khdr->space_sleepers, NULL, seen, &d);
        /* Space may be held by a process that died (its views, a half-written
         * block): after a while without room, look for the dead. */
        if (rc == 0 && rdv_now_ns() >= next_reclaim_ns) {
            rdv_proc_reclaim_dead(h, NULL);
            next_reclaim_ns = rdv_now_ns() + RDV_RECLAIM_EVERY_NS;
        }
        if (rc < 0)
            return rc;
    }

    uint8_t *block = (uint8_t *)rdv_msg_at(h, *pos);
    struct rdv_msg *m = (struct rdv_msg *)block;
    m->next = 0;
    m->key_len = key_len;
    m->nbytes = nbytes;
    m->payload_off = (uint32_t)meta; /* pos, stage and owner: set by rdv_arena_alloc */
    m->ndim = (uint16_t)ndim;
    m->dtype_len = (uint8_t)dtype_len;
    m->flags = 0;
    m->sender_cpu = (uint32_t)sched_getcpu();
    memcpy(m->dtype, dtype, dtype_len);
    int64_t *dims = (int64_t *)(block + sizeof *m);
    memcpy(dims, shape, 8ull * ndim);
    memcpy(dims + ndim, strides, 8ull * ndim);
    memcpy(dims + 2 * ndim, key, key_len);
    memcpy(block + meta - 8, pos, 8);
    *payload = block + meta;
    return 0;
}

int rdv_channel_link(rdv_t *h, uint64_t pos) {
    struct rdv_msg *m = rdv_msg_at(h, pos);
    const char *key = (const char *)(m + 1) + 16ull * m->ndim;
    uint32_t idx;
    int rc = rdv_index_acquire(h, key, m->key_len, 1, &idx);
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
    uint32_t g = (uint32_t)rdv_granule_of(h, pos) + 1;
    if (s->q_tail)
        rdv_msg_at(h, (uint64_t)(s->q_tail - 1) * RDV_GRANULE)->next = g;
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
    rdv_arena_committed(h, pos);
    return 0;
}

static int do_send_commit(rdv_t *h, uint64_t pos) {
    uint64_t len;
    if (rdv_arena_check_busy(h, pos, &len) < 0)
        return -EINVAL;
    int rc = rdv_channel_link(h, pos);
    if (rc < 0)
        rdv_arena_free(h, pos); /* a message that cannot be queued is not sent */
    return rc;
}

static int do_send(rdv_t *h, const char *key, uint32_t key_len, const char *dtype,
             uint32_t dtype_len, uint32_t ndim, const int64_t *shape,
             const int64_t *strides, const void *src, uint64_t nbytes, int64_t timeout_ns) {
    uint64_t pos;
    void *payload;
    int rc = do_send_begin(h, key, key_len, dtype, dtype_len, ndim, shape, strides, nbytes,
                            timeout_ns, &pos, &payload);
    if (rc < 0)
        return rc;
    memcpy(payload, src, nbytes);
    return do_send_commit(h, pos);
}

/* With the slot locked and a message queued: copy its description out,
 * bounds-checking everything read from shared memory, and unlink it; a
 * leased one goes back to the queue if we die holding it (rdv_lease.c). */
static int pop(rdv_t *h, struct rdv_slot *s, const char *key, uint32_t key_len, int leased,
               struct rdv_msg_info *out) {
    uint64_t len;
    const struct rdv_msg *m = rdv_queued_msg(h, s->q_head, &len);
    if (!m)
        return -EBADMSG;
    uint64_t pos = m->pos;
    uint32_t ndim = m->ndim, dlen = m->dtype_len, off = m->payload_off;
    if (ndim > RDV_NDIM_MAX || dlen == 0 || dlen > RDV_DTYPE_MAX || m->key_len != key_len ||
        off != meta_bytes(ndim, key_len) || m->nbytes > len - off)
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

    /* Remember whether the sender shared our CPU: spinning for a peer that
     * needs our CPU to make progress only delays it (rdv_wait_change). */
    int same = m->sender_cpu == (uint32_t)sched_getcpu();
    WRITE_ONCE(h->same_cpu, (READ_ONCE(h->same_cpu) << 1 | same) & 0xf);
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

/* Move *cancel from 0 (waiting) to 2 (consumed) before taking a message; a
 * receiver whose cancel word is already 1 has been withdrawn. */
static int claim_for_delivery(uint32_t *cancel) {
    if (!cancel)
        return 0;
    uint32_t waiting = 0;
    /* acq_rel: pairs with the CAS 0 -> 1 in rdv_cancel; exactly one wins */
    return rdv_cas(cancel, &waiting, 2, __ATOMIC_ACQ_REL) ? 0 : -ECANCELED;
}

static int do_recv(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns,
             uint32_t *cancel, int leased, struct rdv_msg_info *out) {
    if (key_len == 0 || key_len > RDV_KEY_MAX)
        return -EINVAL;
    if (rdv_is_aborted(h))
        return -ECONNABORTED;
    uint32_t idx;
    int rc = rdv_index_acquire(h, key, key_len, timeout_ns != 0, &idx);
    if (rc == -ENOENT)
        return -EAGAIN;
    if (rc < 0)
        return rc;
    struct rdv_slot *s = &h->kslots[idx];
    if (s->count) {
        rc = claim_for_delivery(cancel);
        if (rc == 0)
            rc = pop(h, s, key, key_len, leased, out);
        rdv_index_maybe_delete(h, idx);
        rdv_index_release(h, idx);
        return rc;
    }
    if (timeout_ns == 0) {
        rdv_index_maybe_delete(h, idx);
        rdv_index_release(h, idx);
        return -EAGAIN;
    }

    /* Register as a waiter (keeps the slot from being deleted), then wait
     * for seq to move without holding the lock. */
    struct rdv_deadline d;
    rdv_deadline_init(&d, timeout_ns);
    s->waiters++;
    uint32_t *krecord = rdv_wait_record(h, idx); /* so our death gives it back */
    for (;;) {
        uint32_t seen = s->seq; /* stable: seq only changes under the lock */
        rdv_index_release(h, idx);
        int wrc = rdv_wait_change(h, &s->seq, &s->sleepers, krecord, seen, &d);
        rdv_slot_lock(h, &s->lock);
        int64_t left;
        if (rdv_is_aborted(h))
            rc = -ECONNABORTED;
        else if (cancel && smp_load_acquire(cancel) == 1)
            rc = -ECANCELED; /* acquire: pairs with the CAS in rdv_cancel */
        else if (s->count) {
            rc = claim_for_delivery(cancel);
            if (rc == 0)
                rc = pop(h, s, key, key_len, leased, out);
        } else if (wrc == -EINTR)
            rc = -EINTR;
        else if (rdv_deadline_left(&d, &left) < 0)
            rc = -ETIMEDOUT;
        else
            continue;
        rdv_wait_unrecord(krecord);
        s->waiters--;
        rdv_index_maybe_delete(h, idx);
        rdv_index_release(h, idx);
        return rc;
    }
}

static int do_cancel(rdv_t *h, const char *key, uint32_t key_len, uint32_t *cancel) {
    uint32_t waiting = 0;
    /* acq_rel: pairs with claim_for_delivery; if the receiver got there
     * first, the message is delivered and the cancel fails */
    if (!rdv_cas(cancel, &waiting, 1, __ATOMIC_ACQ_REL))
        return -EALREADY;
    uint32_t idx;
    if (rdv_index_acquire(h, key, key_len, 0, &idx) == 0) {
        struct rdv_slot *s = &h->kslots[idx];
        rdv_wake_bump(&s->seq); /* the withdrawn waiter re-checks */
        rdv_index_release(h, idx);
        rdv_wake_sleepers(&s->seq, &s->sleepers);
    }
    return 0;
}


/* Free every queued message and wake every waiter, slot by slot. */
static void drain_all(rdv_t *h) {
    for (uint64_t i = 0; i <= h->slot_mask; i++) {
        struct rdv_slot *s = &h->kslots[i];
        if (READ_ONCE(s->state) != RDV_SLOT_LIVE)
            continue;
        rdv_slot_lock(h, &s->lock);
        if (s->state == RDV_SLOT_LIVE) {
            uint32_t g = s->q_head;
            uint64_t len;
            struct rdv_msg *m;
            for (uint32_t n = s->count; n && (m = rdv_queued_msg(h, g, &len)); n--) {
                g = m->next;
                rdv_arena_free(h, m->pos);
            }
            s->q_head = s->q_tail = 0;
            s->count = 0;
            rdv_wake_all(&s->seq, &s->sleepers);
            rdv_index_maybe_delete(h, (uint32_t)i);
        }
        rdv_slot_unlock(&s->lock);
    }
    rdv_wake_all(&h->khdr->space_seq, &h->khdr->space_sleepers);
}

static int do_abort(rdv_t *h, const char *reason, uint32_t reason_len) {
    struct rdv_header *khdr = h->khdr;
    uint32_t running = RDV_RUNNING;
    /* acquire: the winner alone writes the reason */
    if (rdv_cas(&khdr->abort_state, &running, RDV_ABORTING, __ATOMIC_ACQUIRE)) {
        if (reason_len > RDV_REASON_MAX)
            reason_len = RDV_REASON_MAX;
        memcpy(khdr->abort_reason, reason, reason_len);
        khdr->abort_reason_len = reason_len;
        /* release: publishes the reason; pairs with rdv_is_aborted/abort_reason */
        smp_store_release(&khdr->abort_state, RDV_ABORTED);
    }
    drain_all(h); /* also by later callers: frees what raced with the first */
    return 0;
}

static int do_abort_reason(rdv_t *h, char *buf, uint32_t cap, uint32_t *len) {
    struct rdv_header *khdr = h->khdr;
    /* acquire: pairs with the release of RDV_ABORTED; while ABORTING the
     * reason is being written, so wait for it (a few stores) */
    uint32_t st;
    /* bounded: an aborter that died mid-write leaves the state ABORTING */
    for (int spins = 0; (st = smp_load_acquire(&khdr->abort_state)) == RDV_ABORTING && spins < 100000;
         spins++)
        rdv_cpu_relax();
    if (st == RDV_RUNNING) {
        *len = 0;
        return -ENOENT;
    }
    uint32_t n = khdr->abort_reason_len;
    if (n > RDV_REASON_MAX)
        n = RDV_REASON_MAX;
    if (n > cap)
        n = cap;
    memcpy(buf, khdr->abort_reason, n);
    *len = n;
    return 0;
}

static int do_stats(rdv_t *h, struct rdv_stats *out) {
    memset(out, 0, sizeof *out);
    for (uint64_t i = 0; i <= h->slot_mask; i++) {
        struct rdv_slot *s = &h->kslots[i];
        /* relaxed: a snapshot for humans, not a synchronisation point */
        if (READ_ONCE(s->state) != RDV_SLOT_LIVE)
            continue;
        out->keys++;
        out->pending_messages += READ_ONCE(s->count);
        out->waiters += READ_ONCE(s->waiters);
    }
    /* acquire/relaxed: a snapshot of the ring window, as above */
    uint64_t hd = smp_load_acquire(&h->khdr->c_head);
    uint64_t t = READ_ONCE(h->khdr->p_tail);
    uint64_t used = (t - hd) + rdv_arena_island_bytes(h);
    out->bytes_used = used <= h->cap ? used : h->cap;
    out->bytes_free = h->cap - out->bytes_used;
    out->capacity = h->cap;
    out->max_keys = h->khdr->max_keys;
    out->aborted = rdv_is_aborted(h);
    out->leases_dropped = READ_ONCE(h->khdr->leases_dropped); /* relaxed: a statistic */
    return 0;
}

/* Release a received payload: p must be a payload pointer rdv_recv handed
 * out, so its block position sits in the 8 bytes before it. */
static int do_release_payload(rdv_t *h, void *payload) {
    uint8_t *p = payload;
    if (p < h->karena + RDV_GRANULE || p > h->karena + 2 * h->cap)
        return -EINVAL;
    uint64_t pos;
    memcpy(&pos, p - 8, 8);
    const struct rdv_msg *m = rdv_msg_at(h, pos);
    if (pos % RDV_GRANULE || (uint8_t *)m + m->payload_off != p)
        return -EINVAL;
    return rdv_arena_free(h, pos); /* checks that pos is a block we may free */
}

/* ---- public entry points: each holds a reference on the mapping for the
 * duration of the call (WITH_REF), and one more per payload it hands out. */

int rdv_send_begin(rdv_t *h, const char *key, uint32_t key_len, const char *dtype,
                   uint32_t dtype_len, uint32_t ndim, const int64_t *shape,
                   const int64_t *strides, uint64_t nbytes, int64_t timeout_ns,
                   uint64_t *pos, void **payload) {
    if (rdv_get(h) < 0)
        return -EBADF;
    int rc = do_send_begin(h, key, key_len, dtype, dtype_len, ndim, shape, strides, nbytes,
                           timeout_ns, pos, payload);
    if (rc < 0)
        rdv_put(h); /* on success the reference passes to *payload */
    return rc;
}

int rdv_send_commit(rdv_t *h, uint64_t pos) { WITH_REF(h, do_send_commit(h, pos)); }

int rdv_send_discard(rdv_t *h, uint64_t pos) { WITH_REF(h, rdv_arena_free(h, pos)); }

int rdv_send(rdv_t *h, const char *key, uint32_t key_len, const char *dtype,
             uint32_t dtype_len, uint32_t ndim, const int64_t *shape,
             const int64_t *strides, const void *src, uint64_t nbytes, int64_t timeout_ns) {
    WITH_REF(h, do_send(h, key, key_len, dtype, dtype_len, ndim, shape, strides, src, nbytes,
                        timeout_ns));
}

static int recv_ref(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns,
                    uint32_t *cancel, int leased, struct rdv_msg_info *out) {
    if (rdv_get(h) < 0)
        return -EBADF;
    int rc = do_recv(h, key, key_len, timeout_ns, cancel, leased, out);
    if (rc < 0)
        rdv_put(h); /* on success the reference passes to out->payload */
    return rc;
}

int rdv_recv(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns,
             uint32_t *cancel, struct rdv_msg_info *out) {
    return recv_ref(h, key, key_len, timeout_ns, cancel, 0, out);
}

int rdv_recv_leased(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns,
                    uint32_t *cancel, struct rdv_msg_info *out) {
    return recv_ref(h, key, key_len, timeout_ns, cancel, 1, out);
}

int rdv_release_payload(rdv_t *h, void *payload) {
    if (rdv_forked(h))
        return 0; /* a view inherited through fork is the parent's to release */
    int rc = do_release_payload(h, payload);
    if (rc == 0)
        rdv_put(h); /* the payload's own reference keeps the mapping until here */
    return rc;
}

int rdv_cancel(rdv_t *h, const char *key, uint32_t key_len, uint32_t *cancel) {
    WITH_REF(h, do_cancel(h, key, key_len, cancel));
}

int rdv_abort(rdv_t *h, const char *reason, uint32_t reason_len) {
    WITH_REF(h, do_abort(h, reason, reason_len));
}

int rdv_abort_reason(rdv_t *h, char *buf, uint32_t cap, uint32_t *len) {
    WITH_REF(h, do_abort_reason(h, buf, cap, len));
}

int rdv_stats(rdv_t *h, struct rdv_stats *out) { WITH_REF(h, do_stats(h, out)); }

/* Live keys, read under each slot's lock (the name from its oldest message). */
static int do_keys(rdv_t *h, struct rdv_key_info *out, uint32_t cap, uint32_t *n) {
    uint32_t k = 0;
    for (uint64_t i = 0; i <= h->slot_mask && k < cap; i++) {
        struct rdv_slot *s = &h->kslots[i];
        if (READ_ONCE(s->state) != RDV_SLOT_LIVE) /* relaxed: re-checked under the lock */
            continue;
        rdv_slot_lock(h, &s->lock);
        if (s->state == RDV_SLOT_LIVE) {
            struct rdv_key_info *ki = &out[k++];
            memset(ki, 0, sizeof *ki);
            ki->pending = s->count;
            ki->waiters = s->waiters;
            uint64_t len;
            const struct rdv_msg *m = rdv_queued_msg(h, s->q_head, &len);
            if (m && m->ndim <= RDV_NDIM_MAX && m->key_len == s->key_len &&
                64 + 16ull * m->ndim + m->key_len <= len) {
                ki->full_len = m->key_len;
                ki->key_len = m->key_len < sizeof ki->key ? m->key_len : sizeof ki->key;
                memcpy(ki->key, (const char *)(m + 1) + 16ull * m->ndim, ki->key_len);
            }
        }
        rdv_slot_unlock(&s->lock);
    }
    *n = k;
    return 0;
}

int rdv_keys(rdv_t *h, struct rdv_key_info *out, uint32_t cap, uint32_t *n) { WITH_REF(h, do_keys(h, out, cap, n)); }

int rdv_procs(rdv_t *h, struct rdv_proc_info *out, uint32_t cap, uint32_t *n) {
    WITH_REF(h, rdv_procs_impl(h, out, cap, n));
}

int rdv_gc(rdv_t *h, uint32_t *reclaimed) { WITH_REF(h, rdv_proc_reclaim_dead(h, reclaimed)); }
