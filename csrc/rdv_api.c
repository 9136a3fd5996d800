/* Layer 9: the public entry points of the channel: send, receive, cancel,
 * release, abort, producer marks. Each holds a reference on the mapping for
 * the duration of the call (WITH_REF), and one more per payload it hands
 * out. */
#include <errno.h>
#include <string.h>

#include "rdv_arena.h"
#include "rdv_atomic.h"
#include "rdv_index.h"
#include "rdv_live.h"
#include "rdv_lock.h"
#include "rdv_mark.h"
#include "rdv_open.h"
#include "rdv_os.h"
#include "rdv_queue.h"
#include "rdv_recover.h"
#include "rdv_wait.h"

#define RDV_RECLAIM_EVERY_NS 50000000 /* 50 ms */

static int do_send_begin(rdv_t *h, const char *key, uint32_t key_len, const char *dtype,
                   uint32_t dtype_len, uint32_t ndim, const int64_t *shape,
                   const int64_t *strides, uint64_t nbytes, int64_t timeout_ns,
                   uint64_t *pos, void **payload) {
    if (key_len == 0 || key_len > RDV_KEY_MAX || ndim > RDV_NDIM_MAX || dtype_len == 0 ||
        dtype_len > RDV_DTYPE_MAX)
        return -EINVAL;
    uint64_t meta = rdv_meta_bytes(ndim, key_len);
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
         * after a free: a change after our failed attempt means space may
         * have appeared */
        uint32_t seen = smp_load_acquire(&khdr->arena.space_seq);
        int rc = rdv_arena_alloc(h, meta + nbytes, pos);
        if (rc == 0)
            break;
        if (rc != -ENOSPC)
            return rc;
        if (timeout_ns == 0)
            return -ETIMEDOUT;
        /* -ETIMEDOUT only once the deadline has passed and one more attempt
         * after the last wait has failed */
        rc = rdv_wait_change(h, &khdr->arena.space_seq, &khdr->arena.space_sleepers, NULL, seen, &d);
        /* Space may be held by a process that died (its views, a half-written
         * block): after a while without room, look for the dead. */
        if (rc == 0 && rdv_now_ns() >= next_reclaim_ns) {
            rdv_recover_dead(h, NULL);
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
    m->sender_cpu = rdv_cpu();
    memcpy(m->dtype, dtype, dtype_len);
    int64_t *dims = (int64_t *)(block + sizeof *m);
    memcpy(dims, shape, 8ull * ndim);
    memcpy(dims + ndim, strides, 8ull * ndim);
    memcpy(dims + 2 * ndim, key, key_len);
    memcpy(block + meta - 8, pos, 8);
    *payload = block + meta;
    return 0;
}

static int do_send_commit(rdv_t *h, uint64_t pos) {
    int rc = rdv_queue_link(h, pos);
    if (rc < 0 && rc != -EINVAL) /* -EINVAL: not a block we are writing, not ours to free */
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
            rc = rdv_queue_pop(h, s, key, key_len, leased, out);
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
    uint32_t *krecord = rdv_live_wait_record(h, idx); /* so our death gives it back */
    for (;;) {
        uint32_t seen = s->seq; /* stable: seq only changes under the lock */
        rdv_index_release(h, idx);
        int wrc = rdv_wait_change(h, &s->seq, &s->sleepers, krecord, seen, &d);
        rdv_lock(h, &s->lock);
        int64_t left;
        if (rdv_is_aborted(h))
            rc = -ECONNABORTED;
        else if (cancel && smp_load_acquire(cancel) == 1)
            rc = -ECANCELED; /* acquire: pairs with the CAS in rdv_cancel */
        else if (s->count) {
            rc = claim_for_delivery(cancel);
            if (rc == 0)
                rc = rdv_queue_pop(h, s, key, key_len, leased, out);
        } else if (wrc == -EINTR)
            rc = -EINTR;
        else if (rdv_deadline_left(&d, &left) < 0)
            rc = -ETIMEDOUT;
        else
            continue;
        rdv_live_wait_unrecord(krecord);
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
    rdv_queue_drain_all(h); /* also by later callers: frees what raced with the first */
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

/* Release a received payload: p must be a payload pointer rdv_recv handed
 * out, so its block position sits in the 8 bytes before it. */
static int do_release_payload(rdv_t *h, void *payload) {
    uint8_t *p = payload;
    if (p < h->karena + 2 * RDV_GRANULE || p > h->karena + h->cap)
        return -EINVAL;
    uint64_t pos, len;
    memcpy(&pos, p - 8, 8);
    const struct rdv_msg *m = rdv_block_at(h, pos, &len);
    if (!m || (uint8_t *)m + m->payload_off != p)
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

static int do_send_discard(rdv_t *h, uint64_t pos) {
    uint64_t len;
    if (!rdv_queue_writing(h, pos, h->me + 1, &len))
        return -EINVAL; /* not a block we are writing */
    return rdv_arena_free(h, pos);
}

int rdv_send_discard(rdv_t *h, uint64_t pos) { WITH_REF(h, do_send_discard(h, pos)); }

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

int rdv_send_commit_marked(rdv_t *h, uint64_t pos, uint32_t idx, uint64_t id, uint64_t val0,
                           uint64_t val1) {
    WITH_REF(h, rdv_mark_commit(h, pos, idx, id, val0, val1));
}

int rdv_mark_set(rdv_t *h, uint32_t idx, uint64_t id, uint64_t val0, uint64_t val1) {
    WITH_REF(h, rdv_mark_set_impl(h, idx, id, val0, val1));
}

int rdv_mark_get(rdv_t *h, uint32_t idx, uint64_t *id, uint64_t *val0, uint64_t *val1) {
    WITH_REF(h, rdv_mark_get_impl(h, idx, id, val0, val1));
}
