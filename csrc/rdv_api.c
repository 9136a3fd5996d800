/* Layer 10: the public entry points of the channel: send, receive (in
 * line: a waiter's start, wait, cancel and poll), give-back, release,
 * abort, producer marks. Each holds a reference on the mapping for
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
#include "rdv_waiter.h"

#define RDV_RECLAIM_EVERY_NS 50000000 /* 50 ms */

/* A wait for space about to start: counted among the producers short of
 * space, once (1 when it counted now), so that no block is kept from us
 * from now on; the caller then tries once more, which finds any block
 * kept before (rdv_arena_want_space). */
static int count_wanting(rdv_t *h, int *wanting) {
    if (*wanting)
        return 0;
    rdv_arena_want_space(h, 1);
    *wanting = 1;
    return 1;
}

static int check_key(uint32_t key_len) { return key_len == 0 || key_len > RDV_KEY_MAX ? -EINVAL : 0; }

/* Inlined into every send: as a call of its own (gcc made one once it had
 * two callers) the 64 B round trip apart went 1.25 -> 1.28-1.32 us in
 * medians of benchmarks/ab_round_trip.py; inlined, 1.27 -> 1.28. */
static inline __attribute__((always_inline)) void *
write_header(rdv_t *h, uint64_t pos, const char *key, uint32_t key_len, const char *dtype, uint32_t dtype_len,
             uint32_t ndim, const int64_t *shape, const int64_t *strides, uint64_t nbytes, uint64_t meta);

/* The block's metadata bytes for a send of these, or 0 if the send is
 * refused (-EINVAL) or can never fit (-EMSGSIZE) into *rc. */
static uint64_t send_meta(const rdv_t *h, uint32_t key_len, uint32_t ndim, uint32_t dtype_len, uint64_t nbytes,
                          int *rc) {
    if (key_len == 0 || key_len > RDV_KEY_MAX || ndim > RDV_NDIM_MAX || dtype_len == 0 ||
        dtype_len > RDV_DTYPE_MAX) {
        *rc = -EINVAL;
        return 0;
    }
    uint64_t meta = rdv_meta_bytes(ndim, key_len);
    if (nbytes > h->cap || meta + nbytes > h->cap) {
        *rc = -EMSGSIZE;
        return 0;
    }
    return meta;
}

static int do_send_begin(rdv_t *h, const char *key, uint32_t key_len, const char *dtype,
                   uint32_t dtype_len, uint32_t ndim, const int64_t *shape,
                   const int64_t *strides, uint64_t nbytes, int64_t timeout_ns,
                   uint64_t *pos, void **payload) {
    int rc = 0;
    uint64_t meta = send_meta(h, key_len, ndim, dtype_len, nbytes, &rc);
    if (!meta)
        return rc;

    /* The clock is read only once there is no room: a send that finds room
     * at once (nearly all of them) makes no clock call. */
    struct rdv_deadline d = {.forever = 1, .at_ns = 0};
    struct rdv_header *khdr = h->khdr;
    int64_t next_reclaim_ns = INT64_MAX;
    int wanting = 0; /* counted among the producers short of space (rdv_arena_want_space) */
    for (;;) {
        if (rdv_is_aborted(h)) {
            rc = -ECONNABORTED;
            break;
        }
        /* acquire: pairs with the release bump in wake_space() (rdv_arena.c)
         * after a free: a change after our failed attempt means space may
         * have appeared */
        uint32_t seen = smp_load_acquire(&khdr->arena.space_seq);
        rc = rdv_arena_alloc(h, meta + nbytes, pos);
        if (rc != -ENOSPC)
            break;
        if (timeout_ns == 0) {
            rc = -ETIMEDOUT;
            break;
        }
        if (count_wanting(h, &wanting))
            continue;
        if (next_reclaim_ns == INT64_MAX) { /* the first attempts failed: the wait starts now */
            rdv_deadline_init(&d, timeout_ns);
            next_reclaim_ns = rdv_now_ns() + RDV_RECLAIM_EVERY_NS;
        }
        /* -ETIMEDOUT only once the deadline has passed and one more attempt
         * after the last wait has failed */
        rc = rdv_wait_change(h, &khdr->arena.space_seq, &khdr->arena.space_sleepers, seen, &d);
        /* Space may be held by a process that died (its views, a half-written
         * block): after a while without room, look for the dead. */
        if (rc == 0 && rdv_now_ns() >= next_reclaim_ns) {
            rdv_recover_dead(h, NULL);
            next_reclaim_ns = rdv_now_ns() + RDV_RECLAIM_EVERY_NS;
        }
        if (rc < 0)
            break;
    }
    if (wanting)
        rdv_arena_want_space(h, 0);
    if (rc < 0)
        return rc;

    *payload = write_header(h, *pos, key, key_len, dtype, dtype_len, ndim, shape, strides, nbytes, meta);
    return 0;
}

/* The header of a message in the block at pos (ours, WRITING, meta +
 * nbytes long): the payload's address. */
static inline __attribute__((always_inline)) void *
write_header(rdv_t *h, uint64_t pos, const char *key, uint32_t key_len, const char *dtype, uint32_t dtype_len,
             uint32_t ndim, const int64_t *shape, const int64_t *strides, uint64_t nbytes, uint64_t meta) {
    uint8_t *block = (uint8_t *)rdv_msg_at(h, pos);
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
    rdv_copy_words(dims, shape, ndim);
    rdv_copy_words(dims + ndim, strides, ndim);
    memcpy(dims + 2 * ndim, key, key_len);
    memcpy(block + meta - 8, &pos, 8);
    return block + meta;
}

static int do_send_commit(rdv_t *h, uint64_t pos, const uint64_t *hash) {
    int rc = rdv_queue_link(h, pos, hash);
    if (rc < 0 && rc != -EINVAL) /* -EINVAL: not a block we are writing, not ours to free */
        rdv_arena_free(h, pos); /* a message that cannot be queued is not sent */
    return rc;
}

static int do_send(rdv_t *h, const char *key, uint32_t key_len, const char *dtype,
             uint32_t dtype_len, uint32_t ndim, const int64_t *shape,
             const int64_t *strides, const void *src, uint64_t nbytes, int64_t timeout_ns) {
    if (check_key(key_len) < 0)
        return -EINVAL;
    /* hashed once, first: the key's slot line comes over while we write */
    uint64_t hash[2];
    rdv_hash_key(h, key, key_len, &hash[0], &hash[1]);
    rdv_index_warm(h, hash[0]);
    uint64_t pos;
    void *payload;
    int rc = do_send_begin(h, key, key_len, dtype, dtype_len, ndim, shape, strides, nbytes,
                            timeout_ns, &pos, &payload);
    if (rc < 0)
        return rc;
    memcpy(payload, src, nbytes);
    return do_send_commit(h, pos, hash);
}

/* ---- receiving ----------------------------------------------------------
 * A receiver that finds its key empty links a waiter record (rdv_waiter.c)
 * and waits on its leader's state; a send decides it (rdv_queue.c's
 * hand-off). A group (rdv_recv_any_start) is one record per key, all
 * naming the first as leader, chained through sibling. */

/* Take slot idx's oldest message (the slot locked, and released here). */
static int pop_locked(rdv_t *h, uint32_t idx, const char *key, uint32_t key_len, uint32_t flags,
                      struct rdv_msg_info *out) {
    int rc = rdv_queue_pop(h, &h->kslots[idx], key, key_len, (flags & RDV_RECV_LEASED) != 0, out);
    rdv_index_maybe_delete(h, idx);
    rdv_index_release(h, idx);
    return rc;
}

/* The oldest message of key if one is queued: 0, or -EAGAIN. */
static int try_pop(rdv_t *h, const char *key, uint32_t key_len, uint32_t flags,
                   struct rdv_msg_info *out) {
    uint32_t idx;
    int rc = rdv_index_acquire(h, key, key_len, RDV_INDEX_FIND, &idx);
    if (rc == -ENOENT)
        return -EAGAIN;
    if (rc < 0)
        return rc;
    if (h->kslots[idx].count)
        return pop_locked(h, idx, key, key_len, flags, out);
    rdv_index_maybe_delete(h, idx);
    rdv_index_release(h, idx);
    return -EAGAIN;
}

/* n waiter records. With the arena too full for a slab of them, a message
 * that is already queued is better than waiting for room: *got then says
 * so, out filled by try (which may be NULL), and rc is try's (0, or a
 * recv_any's which + 1). */
static int alloc_waiters_counted(rdv_t *h, uint32_t n, uint32_t *links, int64_t timeout_ns,
                                 int (*try)(rdv_t *, const void *, uint32_t, struct rdv_msg_info *),
                                 const void *arg, uint32_t flags, struct rdv_msg_info *out, int *got,
                                 int *wanting) {
    struct rdv_deadline d;
    rdv_deadline_init(&d, timeout_ns);
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    *got = 0;
    for (;;) {
        /* acquire: pairs with the release bump after a free (rdv_arena.c) */
        uint32_t seen = smp_load_acquire(&ka->space_seq);
        int rc = rdv_waiter_alloc(h, n, links);
        if (rc != -ENOSPC)
            return rc;
        if (try && (rc = try(h, arg, flags, out)) != -EAGAIN) {
            *got = rc >= 0; /* 0, or a recv_any's which + 1 */
            return rc;
        }
        if (rdv_is_aborted(h))
            return -ECONNABORTED;
        int64_t left;
        if (rdv_deadline_left(&d, &left) < 0)
            return -ETIMEDOUT;
        if (count_wanting(h, wanting))
            continue;
        rc = rdv_wait_change(h, &ka->space_seq, &ka->space_sleepers, seen, &d);
        if (rc < 0)
            return rc;
    }
}

static int alloc_waiters(rdv_t *h, uint32_t n, uint32_t *links, int64_t timeout_ns,
                         int (*try)(rdv_t *, const void *, uint32_t, struct rdv_msg_info *),
                         const void *arg, uint32_t flags, struct rdv_msg_info *out, int *got) {
    int wanting = 0;
    int rc = alloc_waiters_counted(h, n, links, timeout_ns, try, arg, flags, out, got, &wanting);
    if (wanting)
        rdv_arena_want_space(h, 0);
    return rc;
}

/* Unlink every record of the group led by `leader` (they wait on their
 * keys no more), then give them back to our pool. */
static void end_group(rdv_t *h, uint32_t leader) {
    uint32_t links[RDV_ANY_MAX];
    uint32_t n = 0;
    uint32_t l_won = rdv_waiter_at(h, leader)->won; /* 0 unless a send decided the group */
    for (uint32_t link = leader; link && n < RDV_ANY_MAX;) {
        struct rdv_waiter *w = rdv_waiter_at(h, link);
        if (!w || !rdv_waiter_ours(h, link))
            break; /* damage: the rest of the group is not ours to free */
        links[n++] = link;
        /* The record a send handed through is unlinked by that send, a few
         * stores after the hand-off: wait for that rather than its lock.
         * relaxed: a first look; re-checked under the slot's lock */
        for (int spins = 0; link == l_won && READ_ONCE(w->slot) && spins < RDV_HAND_OFF_SPINS; spins++)
            rdv_cpu_relax();
        /* acquire: pairs with the release of 0 in rdv_waiter_unlink: the
         * unlinker is done with the record before we free it */
        uint32_t slot = smp_load_acquire(&w->slot), idx = slot - 1;
        if (slot && idx <= h->slot_mask) {
            rdv_lock(h, &h->kslots[idx].lock);
            rdv_waiter_unlink(h, idx, link);
            rdv_index_maybe_delete(h, idx);
            rdv_index_release(h, idx);
        }
        link = w->sibling;
    }
    rdv_waiter_free(h, n, links);
}

/* Wait for the group's leader to be decided: 0 once it is, -ECONNABORTED,
 * -ETIMEDOUT, -EINTR. */
static int await_decision(rdv_t *h, struct rdv_waiter *l, int64_t timeout_ns) {
    /* One reading of the clock, before the first look, serves the deadline,
     * the first look for the dead and the wait's own start: a send that
     * comes meanwhile waits for every reading (rdv_deadline_init_at). */
    int64_t now = rdv_now_ns();
    struct rdv_deadline d;
    rdv_deadline_init_at(&d, timeout_ns, now);
    int64_t next_reclaim_ns = now + RDV_RECLAIM_EVERY_NS;
    for (int first = 1;; first = 0) {
        /* acquire: pairs with the send's CAS (rdv_waiter_decide) */
        if (smp_load_acquire(&l->state) != RDV_WAITER_WAITING)
            return 0;
        if (rdv_is_aborted(h))
            return -ECONNABORTED;
        if (!first)
            now = rdv_now_ns();
        int64_t left;
        if (timeout_ns == 0 || rdv_deadline_left_at(&d, now, &left) < 0)
            return -ETIMEDOUT;
        /* A waiter ahead of us in line that died takes the messages handed
         * to it with it until it is reclaimed (they then come back to the
         * head of the key, for us): after a while of waiting, look for the
         * dead, as a producer waiting for space does. */
        if (now >= next_reclaim_ns) {
            rdv_recover_dead(h, NULL);
            next_reclaim_ns = rdv_now_ns() + RDV_RECLAIM_EVERY_NS;
            continue;
        }
        struct rdv_deadline step = d;
        if (d.forever || d.at_ns > next_reclaim_ns)
            step = (struct rdv_deadline){.forever = 0, .at_ns = next_reclaim_ns};
        int rc = rdv_wait_change_at(h, &l->state, &l->sleeping, RDV_WAITER_WAITING, &step, now);
        if (rc == -EINTR)
            return smp_load_acquire(&l->state) != RDV_WAITER_WAITING ? 0 : -EINTR; /* as above */
    }
}

/* Which of the group's keys record `link` waits on: its place in the group
 * (records are chained in key order), RDV_ANY_MAX if it is not in it. */
static uint32_t group_index(rdv_t *h, uint32_t leader, uint32_t link) {
    uint32_t i = 0;
    for (uint32_t r = leader; r && i < RDV_ANY_MAX; i++) {
        struct rdv_waiter *w = rdv_waiter_at(h, r);
        if (r == link)
            return i;
        if (!w || !rdv_waiter_ours(h, r))
            break;
        r = w->sibling;
    }
    return RDV_ANY_MAX;
}

/* A decided group: take the message a send handed it, end the group. */
static int complete(rdv_t *h, uint32_t leader, uint32_t flags, uint32_t *which,
                    struct rdv_msg_info *out) {
    struct rdv_waiter *l = rdv_waiter_at(h, leader);
    /* acquire: as in await_decision */
    uint32_t st = smp_load_acquire(&l->state);
    int rc = -EBADMSG;
    if (RDV_WAITER_KIND(st) == RDV_WAITER_HANDED) {
        rc = rdv_queue_take(h, RDV_WAITER_GRANULE(st), (flags & RDV_RECV_LEASED) != 0, out);
        if (rc == 0 && which && (*which = group_index(h, leader, l->won)) == RDV_ANY_MAX) {
            rdv_arena_free(h, out->pos); /* handed through no record of ours: damage */
            rc = -EBADMSG;
        }
        if (rc == 0 && rdv_is_aborted(h)) {
            rdv_arena_free(h, out->pos); /* abort fails every receive */
            rc = -ECONNABORTED;
        }
    }
    end_group(h, leader);
    return rc;
}

/* Leave the line: 0 if we did, else (a send decided first) complete's. */
static int leave(rdv_t *h, uint32_t leader, uint32_t flags, uint32_t *which,
                 struct rdv_msg_info *out) {
    if (rdv_waiter_decide(rdv_waiter_at(h, leader), RDV_WAITER_CANCELLED)) {
        end_group(h, leader);
        return 0;
    }
    int rc = complete(h, leader, flags, which, out);
    return rc == 0 ? 1 : rc;
}

/* After our waiter's first wait: done, still in line, or (abort) out of it. */
static int after_wait(rdv_t *h, int rc, uint32_t *waiter, uint32_t flags, uint32_t *which,
                      struct rdv_msg_info *out) {
    uint32_t leader = *waiter;
    if (rc == 0) {
        *waiter = 0;
        return complete(h, leader, flags, which, out);
    }
    if (rc == -ECONNABORTED) {
        *waiter = 0;
        if (leave(h, leader, flags, which, out) == 1)
            rdv_arena_free(h, out->pos);
    }
    return rc;
}

struct one_key {
    const char *key;
    uint32_t len;
};

static int try_pop_key(rdv_t *h, const void *arg, uint32_t flags, struct rdv_msg_info *out) {
    const struct one_key *k = arg;
    return try_pop(h, k->key, k->len, flags, out);
}

static int do_recv_start(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns,
                         uint32_t flags, uint32_t *waiter, struct rdv_msg_info *out) {
    *waiter = 0;
    if (check_key(key_len) < 0)
        return -EINVAL;
    if (rdv_is_aborted(h))
        return -ECONNABORTED;
    int async = (flags & RDV_RECV_ASYNC) != 0;
    uint32_t link = 0, idx;
    int rc = rdv_index_acquire(h, key, key_len, (timeout_ns != 0 || async) ? RDV_INDEX_CREATE : RDV_INDEX_FIND, &idx);
    if (rc == -ENOENT)
        return -EAGAIN;
    if (rc < 0)
        return rc;
    if (h->kslots[idx].count)
        return pop_locked(h, idx, key, key_len, flags, out); /* no record needed */
    if ((timeout_ns == 0 && !async) || !rdv_waiter_alloc_cached(h, &link)) {
        rdv_index_maybe_delete(h, idx);
        rdv_index_release(h, idx);
        if (timeout_ns == 0 && !async)
            return -EAGAIN;
        /* No record at hand: allocate one with no lock held (a slab may be
         * needed, or room for one), then look again. */
        int got;
        struct one_key k = {key, key_len};
        rc = alloc_waiters(h, 1, &link, timeout_ns, try_pop_key, &k, flags, out, &got);
        if (rc == -ETIMEDOUT && async)
            rc = -ENOBUFS; /* an async start waits for no room */
        if (rc < 0 || got)
            return rc;
        rc = rdv_index_acquire(h, key, key_len, RDV_INDEX_CREATE, &idx);
        if (rc < 0) {
            rdv_waiter_free(h, 1, &link);
            return rc;
        }
        if (h->kslots[idx].count) {
            rc = pop_locked(h, idx, key, key_len, flags, out);
            rdv_waiter_free(h, 1, &link); /* after the unlock: it may wait for our pool's lock */
            return rc;
        }
    }
    struct rdv_waiter *w = rdv_waiter_at(h, link);
    WRITE_ONCE(w->flags, async ? RDV_WAITER_ASYNC : 0); /* relaxed: as in rdv_waiter.c's init_record */
    rdv_waiter_link(h, idx, link);
    rdv_index_release(h, idx);
    *waiter = link;
    if (async)
        return -EINPROGRESS;
    return after_wait(h, await_decision(h, w, timeout_ns), waiter, flags, NULL, out);
}

struct any_keys {
    const char *keys;
    const uint32_t *lens;
    uint32_t n, first;
};

/* Key i's bytes and length. */
static const char *any_key(const struct any_keys *k, uint32_t i, uint32_t *len) {
    const char *p = k->keys;
    for (uint32_t j = 0; j < i; j++)
        p += k->lens[j];
    *len = k->lens[i];
    return p;
}

static int try_pop_any(rdv_t *h, const void *arg, uint32_t flags, struct rdv_msg_info *out) {
    const struct any_keys *k = arg;
    for (uint32_t j = 0; j < k->n; j++) {
        uint32_t i = (k->first + j) % k->n, len;
        const char *key = any_key(k, i, &len);
        int rc = try_pop(h, key, len, flags, out);
        if (rc != -EAGAIN)
            return rc < 0 ? rc : (int)i + 1; /* which + 1 */
    }
    return -EAGAIN;
}

static int do_recv_any_start(rdv_t *h, const char *keys, const uint32_t *key_lens, uint32_t nkeys,
                             int64_t timeout_ns, uint32_t flags, uint32_t *waiter, uint32_t *which,
                             struct rdv_msg_info *out) {
    *waiter = 0;
    if (nkeys == 0 || nkeys > RDV_ANY_MAX)
        return -EINVAL;
    for (uint32_t i = 0; i < nkeys; i++)
        if (check_key(key_lens[i]) < 0)
            return -EINVAL;
    if (rdv_is_aborted(h))
        return -ECONNABORTED;
    /* process-local, relaxed: only spreads where each call starts */
    struct any_keys k = {keys, key_lens, nkeys, rdv_fetch_add(&h->any_turn, 1, __ATOMIC_RELAXED) % nkeys};
    int async = (flags & RDV_RECV_ASYNC) != 0;
    int rc = try_pop_any(h, &k, flags, out);
    if (rc > 0) {
        *which = (uint32_t)rc - 1;
        return 0;
    }
    if (rc != -EAGAIN || (timeout_ns == 0 && !async))
        return rc;
    uint32_t links[RDV_ANY_MAX];
    int got;
    rc = alloc_waiters(h, nkeys, links, timeout_ns, try_pop_any, &k, flags, out, &got);
    if (rc == -ETIMEDOUT && async)
        rc = -ENOBUFS;
    if (got) {
        *which = (uint32_t)rc - 1;
        return 0;
    }
    if (rc < 0)
        return rc;
    uint32_t leader = links[0];
    for (uint32_t i = 0; i < nkeys; i++) {
        struct rdv_waiter *w = rdv_waiter_at(h, links[i]);
        WRITE_ONCE(w->group, leader); /* relaxed, both: as in rdv_waiter.c's init_record */
        w->sibling = i + 1 < nkeys ? links[i + 1] : 0;
        WRITE_ONCE(w->flags, async ? RDV_WAITER_ASYNC : 0);
    }
    struct rdv_waiter *l = rdv_waiter_at(h, leader);
    for (uint32_t j = 0; j < nkeys; j++) {
        /* acquire: a send of a key linked already may have decided us */
        if (smp_load_acquire(&l->state) != RDV_WAITER_WAITING)
            break;
        uint32_t i = (k.first + j) % nkeys, len, idx;
        const char *key = any_key(&k, i, &len);
        rc = rdv_index_acquire(h, key, len, RDV_INDEX_CREATE, &idx);
        if (rc < 0) { /* max_keys are live (or the index is full): no line to wait in */
            int left = leave(h, leader, flags, which, out);
            return left == 1 ? 0 : left < 0 ? left : rc; /* 1: served meanwhile, ours */
        }
        if (h->kslots[idx].count) {
            /* a message came meanwhile: ours, unless a send decided first */
            if (rdv_waiter_decide(l, RDV_WAITER_CANCELLED)) {
                rc = pop_locked(h, idx, key, len, flags, out);
                end_group(h, leader);
                *which = i;
                return rc;
            }
            rdv_index_maybe_delete(h, idx);
            rdv_index_release(h, idx);
            break;
        }
        rdv_waiter_link(h, idx, links[i]);
        rdv_index_release(h, idx);
    }
    *waiter = leader;
    if (async)
        return -EINPROGRESS;
    return after_wait(h, await_decision(h, l, timeout_ns), waiter, flags, which, out);
}

/* A waiter handle from the caller: one of our leader records in use. */
static struct rdv_waiter *our_waiter(rdv_t *h, uint32_t link) {
    struct rdv_waiter *w = rdv_waiter_at(h, link);
    /* relaxed: our own record */
    if (!w || !rdv_waiter_ours(h, link) || w->group != link || READ_ONCE(w->state) == RDV_WAITER_FREE)
        return NULL;
    return w;
}

static int do_recv_wait(rdv_t *h, uint32_t *waiter, int64_t timeout_ns, uint32_t flags,
                        uint32_t *which, struct rdv_msg_info *out) {
    struct rdv_waiter *l = our_waiter(h, *waiter);
    if (!l)
        return -EINVAL;
    return after_wait(h, await_decision(h, l, timeout_ns), waiter, flags, which, out);
}

static int do_recv_cancel(rdv_t *h, uint32_t *waiter, uint32_t flags, uint32_t *which,
                          struct rdv_msg_info *out) {
    if (!our_waiter(h, *waiter))
        return -EINVAL;
    uint32_t leader = *waiter;
    *waiter = 0;
    return leave(h, leader, flags, which, out);
}

static int do_recv_poll(rdv_t *h, int64_t timeout_ns, uint32_t *waiters, uint32_t cap, uint32_t *n) {
    struct rdv_proc *p = &h->kprocs[h->me];
    struct rdv_deadline d;
    rdv_deadline_init(&d, timeout_ns);
    *n = 0;
    for (;;) {
        /* acquire: pairs with the release bump of the bell (rdv_waiter_wake) */
        uint32_t seen = smp_load_acquire(&p->bell);
        if (cap == 0 ? rdv_waiter_hinted(h, 0) : (*n = rdv_waiter_handed(h, waiters, cap)) != 0)
            return 0;
        if (rdv_is_aborted(h))
            return -ECONNABORTED;
        int64_t left;
        if (timeout_ns == 0)
            return -ETIMEDOUT;
        if (rdv_deadline_left(&d, &left) < 0) {
            /* At the end of a wait: the dead reclaimed (a dead waiter ahead
             * of ours holds messages until then, see await_decision), then a
             * look at every record: a sender that died between a hand-off
             * and its hint is found here (and its slab's hint set for the
             * next look). */
            rdv_recover_dead(h, NULL);
            return rdv_waiter_hinted(h, 1) ? 0 : -ETIMEDOUT;
        }
        int rc = rdv_wait_change(h, &p->bell, &p->bell_sleepers, seen, &d);
        if (rc == -EINTR)
            return rc;
        /* relaxed: a bell rung with no hint set is rdv_recv_interrupt, or a
         * reclaimer's wake after a sender died mid-hand-off: a look at
         * every record tells them apart */
        if (READ_ONCE(p->bell) != seen && !rdv_waiter_hinted(h, 0) && !rdv_waiter_hinted(h, 1) &&
            !rdv_is_aborted(h))
            return -EINTR;
    }
}

static int do_recv_once(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns,
                        uint32_t flags, struct rdv_msg_info *out) {
    uint32_t waiter;
    int rc = do_recv_start(h, key, key_len, timeout_ns, flags, &waiter, out);
    if (waiter && (rc == -ETIMEDOUT || rc == -EINTR)) {
        int left = do_recv_cancel(h, &waiter, flags, NULL, out);
        if (left != 0)
            return left == 1 ? 0 : left; /* served while leaving: ours */
    }
    return rc;
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
static int payload_pos(rdv_t *h, void *payload, uint64_t *pos);

static int do_release_payload(rdv_t *h, void *payload) {
    uint64_t pos;
    int rc = payload_pos(h, payload, &pos);
    return rc < 0 ? rc : rdv_arena_release(h, pos); /* checks that pos is a busy block */
}

/* ---- public entry points: each holds a reference on the mapping for the
 * duration of the call (WITH_REF), and one more per payload it hands out. */

int rdv_send_begin(rdv_t *h, const char *key, uint32_t key_len, const char *dtype,
                   uint32_t dtype_len, uint32_t ndim, const int64_t *shape,
                   const int64_t *strides, uint64_t nbytes, int64_t timeout_ns,
                   uint64_t *pos, void **payload) {
    int rc = rdv_get(h);
    if (rc < 0)
        return rc;
    rc = do_send_begin(h, key, key_len, dtype, dtype_len, ndim, shape, strides, nbytes,
                           timeout_ns, pos, payload);
    if (rc < 0)
        rdv_put(h); /* on success the reference passes to *payload */
    return rc;
}

int rdv_send_commit(rdv_t *h, uint64_t pos) { WITH_REF(h, do_send_commit(h, pos, NULL)); }

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

/* Whether two items name the same key. */
static int same_key(const struct rdv_send_item *a, const struct rdv_send_item *b) {
    return a->key_len == b->key_len && (a->key == b->key || memcmp(a->key, b->key, a->key_len) == 0);
}

/* Link a run's blocks (written, all of one key) under one hold of its
 * lock; if that fails, each as a send would, so every message gets the
 * error its own send would have had. How many were sent: *sent grows by
 * that; the first failure's code. */
static int commit_run(rdv_t *h, const uint64_t *pos, uint32_t n, const uint64_t *hash, uint32_t *sent) {
    if (rdv_queue_link_run(h, pos, n, hash) == 0) {
        *sent += n;
        return 0;
    }
    int rc = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (rc < 0)
            rdv_arena_free(h, pos[i]); /* after a failure nothing more is sent */
        else if ((rc = do_send_commit(h, pos[i], hash)) == 0)
            (*sent)++;
    }
    return rc;
}

/* The items as sends, in order, in runs of one key: a run's blocks are
 * allocated (the first as a send allocates, waiting for room if need be,
 * the rest at once under one hold of the arena's lock), filled, then
 * linked under one hold of the key's lock (commit_run). A run never waits
 * for room while it holds blocks not yet linked (the consumer could not
 * free any for us): it ends where room ends, and the next run, starting
 * there, waits. A run is at most RDV_LINK_RUN_MAX messages and about
 * RDV_LINK_RUN_BYTES, so its first message is not held back long. */
static int do_send_many(rdv_t *h, const struct rdv_send_item *const *items, const void *const *srcs,
                        uint32_t n, int64_t timeout_ns, uint32_t *sent) {
    struct rdv_deadline d;
    rdv_deadline_init(&d, timeout_ns);
    uint32_t i = 0;
    while (i < n) {
        const struct rdv_send_item *first = items[i];
        if (check_key(first->key_len) < 0)
            return -EINVAL;
        uint64_t hash[2], pos[RDV_LINK_RUN_MAX], sizes[RDV_LINK_RUN_MAX], metas[RDV_LINK_RUN_MAX];
        rdv_hash_key(h, first->key, first->key_len, &hash[0], &hash[1]);
        rdv_index_warm(h, hash[0]);
        int64_t left = -1;
        if (!d.forever && rdv_deadline_left(&d, &left) < 0)
            left = 0; /* past the deadline: one try without waiting */
        void *payload;
        int rc = do_send_begin(h, first->key, first->key_len, first->dtype, first->dtype_len, first->ndim,
                               first->shape, first->strides, first->nbytes, left, &pos[0], &payload);
        if (rc < 0)
            return rc;
        memcpy(payload, srcs[i], first->nbytes);
        /* the rest of the run: as many as are valid, of this key, within bounds */
        uint32_t want = 1, k;
        uint64_t bytes = first->nbytes;
        while (i + want < n && want < RDV_LINK_RUN_MAX && bytes < RDV_LINK_RUN_BYTES &&
               same_key(items[i + want], first)) {
            const struct rdv_send_item *it = items[i + want];
            int bad;
            if (!(metas[want] = send_meta(h, it->key_len, it->ndim, it->dtype_len, it->nbytes, &bad)))
                break; /* its own run's first send reports it */
            sizes[want] = metas[want] + it->nbytes;
            bytes += it->nbytes;
            want++;
        }
        k = 1 + (want > 1 ? rdv_arena_alloc_run(h, sizes + 1, want - 1, pos + 1) : 0);
        for (uint32_t j = 1; j < k; j++) {
            const struct rdv_send_item *it = items[i + j];
            memcpy(write_header(h, pos[j], it->key, it->key_len, it->dtype, it->dtype_len, it->ndim, it->shape,
                                it->strides, it->nbytes, metas[j]),
                   srcs[i + j], it->nbytes);
        }
        uint32_t before = *sent;
        rc = commit_run(h, pos, k, hash, sent);
        if (rc < 0)
            return rc;
        i += *sent - before;
    }
    return 0;
}

int rdv_send_many(rdv_t *h, const struct rdv_send_item *const *items, const void *const *srcs,
                  uint32_t n, int64_t timeout_ns, uint32_t *sent) {
    *sent = 0;
    if (n > RDV_MANY_MAX)
        return -EINVAL;
    WITH_REF(h, do_send_many(h, items, srcs, n, timeout_ns, sent));
}

/* A receive holds a reference for the call; on success it passes to the
 * payload handed out. */
#define RECV_REF(h, call)                                                                          \
    do {                                                                                           \
        int rc_ = rdv_get(h);                                                                      \
        if (rc_ < 0)                                                                               \
            return rc_;                                                                            \
        rc_ = (call);                                                                              \
        if (rdv_damaged(h)) /* truncated during the call: a message it got may read zeros, so */   \
            rc_ = -EFBIG;   /* it fails, and the payload's reference goes below (WITH_REF) */      \
        if (rc_ != 0 && rc_ != 1)                                                                  \
            rdv_put(h);                                                                            \
        return rc_;                                                                                \
    } while (0)

int rdv_recv(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns,
             struct rdv_msg_info *out) {
    RECV_REF(h, do_recv_once(h, key, key_len, timeout_ns, 0, out));
}

int rdv_recv_leased(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns,
                    struct rdv_msg_info *out) {
    RECV_REF(h, do_recv_once(h, key, key_len, timeout_ns, RDV_RECV_LEASED, out));
}

int rdv_recv_start(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns,
                   uint32_t flags, uint32_t *waiter, struct rdv_msg_info *out) {
    RECV_REF(h, do_recv_start(h, key, key_len, timeout_ns, flags, waiter, out));
}

int rdv_recv_any_start(rdv_t *h, const char *keys, const uint32_t *key_lens, uint32_t nkeys,
                       int64_t timeout_ns, uint32_t flags, uint32_t *waiter, uint32_t *which,
                       struct rdv_msg_info *out) {
    RECV_REF(h, do_recv_any_start(h, keys, key_lens, nkeys, timeout_ns, flags, waiter, which, out));
}

/* Up to max messages queued under key, each popped as a recv pops one
 * (its own crash-safe step) under one hold of the key's lock, each with a
 * reference of its own for its payload: how many. */
static uint32_t take_queued(rdv_t *h, const char *key, uint32_t key_len, uint32_t flags,
                            struct rdv_msg_info *out, uint32_t max) {
    uint32_t n = 0, idx;
    if (max == 0 || rdv_index_acquire(h, key, key_len, RDV_INDEX_FIND, &idx) < 0)
        return 0;
    /* an abort drains each key under its lock after setting the state: a
     * message still here then is the drain's */
    while (n < max && h->kslots[idx].count && !rdv_is_aborted(h) && rdv_get(h) == 0) {
        if (rdv_queue_pop(h, &h->kslots[idx], key, key_len, (flags & RDV_RECV_LEASED) != 0, &out[n]) < 0) {
            out[n].payload = NULL; /* described, then refused (a hash collision): not ours */
            rdv_put(h);
            break;
        }
        n++;
    }
    rdv_index_maybe_delete(h, idx);
    rdv_index_release(h, idx);
    return n;
}

/* The segment was cut during a batch: its messages may read zeros, so
 * none is handed out (as RECV_REF fails a single receive). */
static int drop_batch(rdv_t *h, struct rdv_msg_info *out, uint32_t *n) {
    for (uint32_t i = 0; i < *n; i++) {
        rdv_release_payload(h, out[i].payload);
        out[i].payload = NULL;
    }
    *n = 0;
    return -EFBIG;
}

/* Entries a batch call did not fill say so: a caller that is interrupted
 * gives back exactly the payloads it finds set. */
static void clear_payloads(struct rdv_msg_info *out, uint32_t max) {
    for (uint32_t i = 0; i < max; i++)
        out[i].payload = NULL;
}

int rdv_recv_many(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns, uint32_t flags,
                  uint32_t *waiter, struct rdv_msg_info *out, uint32_t max, uint32_t *n) {
    *n = 0;
    if (max == 0 || max > RDV_MANY_MAX) {
        *waiter = 0;
        return -EINVAL;
    }
    clear_payloads(out, max);
    int rc = rdv_recv_start(h, key, key_len, timeout_ns, flags, waiter, out);
    if (rc != 0) {
        out[0].payload = NULL;
        return rc;
    }
    *n = 1 + take_queued(h, key, key_len, flags, out + 1, max - 1);
    return rdv_damaged(h) ? drop_batch(h, out, n) : 0;
}

int rdv_recv_more(rdv_t *h, const char *key, uint32_t key_len, uint32_t flags,
                  struct rdv_msg_info *out, uint32_t max, uint32_t *n) {
    *n = 0;
    if (check_key(key_len) < 0 || max > RDV_MANY_MAX)
        return -EINVAL;
    clear_payloads(out, max);
    if (rdv_is_aborted(h))
        return -ECONNABORTED;
    int rc = rdv_get(h);
    if (rc < 0)
        return rc;
    *n = take_queued(h, key, key_len, flags, out, max);
    rc = rdv_damaged(h) ? drop_batch(h, out, n) : 0;
    rdv_put(h);
    return rc;
}

int rdv_recv_wait(rdv_t *h, uint32_t *waiter, int64_t timeout_ns, uint32_t flags,
                  uint32_t *which, struct rdv_msg_info *out) {
    RECV_REF(h, do_recv_wait(h, waiter, timeout_ns, flags, which, out));
}

int rdv_recv_cancel(rdv_t *h, uint32_t *waiter, uint32_t flags, uint32_t *which,
                    struct rdv_msg_info *out) {
    /* 1: a message, whose payload keeps the reference; 0: none */
    int rc = rdv_get(h);
    if (rc < 0)
        return rc;
    rc = do_recv_cancel(h, waiter, flags, which, out);
    if (rc != 1)
        rdv_put(h);
    return rc;
}

int rdv_recv_poll(rdv_t *h, int64_t timeout_ns, uint32_t *waiters, uint32_t cap, uint32_t *n) {
    WITH_REF(h, do_recv_poll(h, timeout_ns, waiters, cap, n));
}

static int do_recv_interrupt(rdv_t *h) {
    struct rdv_proc *p = &h->kprocs[h->me];
    rdv_wake_all(&p->bell, &p->bell_sleepers);
    return 0;
}

int rdv_recv_interrupt(rdv_t *h) { WITH_REF(h, do_recv_interrupt(h)); }

/* The block position of a payload rdv_recv handed out (in the 8 bytes
 * before it), checked against the block there. */
static int payload_pos(rdv_t *h, void *payload, uint64_t *pos) {
    uint8_t *p = payload;
    if (p < h->karena + 2 * RDV_GRANULE || p > h->karena + h->cap)
        return -EINVAL;
    uint64_t len;
    memcpy(pos, p - 8, 8);
    const struct rdv_msg *m = rdv_block_at(h, *pos, &len);
    return m && (uint8_t *)m + m->payload_off == p ? 0 : -EINVAL;
}

int rdv_give_back(rdv_t *h, void *payload) { return rdv_give_back_many(h, &payload, 1); }

int rdv_give_back_many(rdv_t *h, void *const *payloads, uint32_t n) {
    uint64_t pos[RDV_MANY_MAX];
    if (n > RDV_MANY_MAX)
        return -EINVAL;
    if (rdv_forked(h))
        return 0; /* the parent's */
    if (rdv_damaged(h)) {
        for (uint32_t i = 0; i < n; i++)
            rdv_put(h); /* as in rdv_give_back */
        return 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        int rc = payload_pos(h, payloads[i], &pos[i]);
        if (rc < 0)
            return rc;
    }
    int rc = rdv_queue_give_back_many(h, pos, n);
    if (rc == -EINVAL)
        return rc; /* not views of ours of one key: nothing changed */
    for (uint32_t i = 0; i < n; i++) {
        if (rc < 0)
            rdv_arena_free(h, pos[i]); /* aborted, or no key slot for them */
        rdv_put(h); /* each payload's reference */
    }
    return rc;
}

int rdv_release_payload(rdv_t *h, void *payload) {
    if (rdv_forked(h))
        return 0; /* a view inherited through fork is the parent's to release */
    if (rdv_damaged(h)) {
        rdv_put(h); /* as in rdv_give_back */
        return 0;
    }
    int rc = do_release_payload(h, payload);
    if (rc == 0)
        rdv_put(h); /* the payload's own reference keeps the mapping until here */
    return rc;
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
