/* Layer 10: the public entry points that look at a rendezvous without
 * changing it (statistics, keys, processes) and the explicit reclaim. */
#include <errno.h>
#include <string.h>

#include "rdv_arena.h"
#include "rdv_atomic.h"
#include "rdv_index.h"
#include "rdv_lock.h"
#include "rdv_open.h"
#include "rdv_recover.h"
#include "rdv_wait.h"
#include "rdv_waiter.h"

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
    rdv_arena_usage(h, &out->bytes_used, &out->bytes_free, &out->largest_free, &out->live_blocks);
    /* Waiter slabs are counted apart from messages, kept blocks as free (a
     * walk, so a moment apart from the snapshot above: a slab allocated in
     * between is rare) */
    const struct rdv_msg *m;
    int any_kept = 0;
    for (uint32_t g = 0; (m = rdv_arena_next(h, &g)); rdv_arena_step(h, &g)) {
        uint64_t len;
        /* relaxed: a snapshot */
        int kept = rdv_msg_kept(m);
        if ((READ_ONCE(m->stage) == RDV_MSG_WAITERS || kept) && rdv_block_at(h, m->pos, &len) && out->bytes_used >= len &&
            out->live_blocks) {
            /* a kept block is free space its keeper's next send reuses, and
             * a producer short of space frees */
            if (kept)
                out->bytes_free += len;
            else
                out->waiter_bytes += len;
            out->bytes_used -= len;
            out->live_blocks--;
            any_kept |= kept;
        }
    }
    if (any_kept) { /* what a producer short of space finds once it has freed them */
        uint64_t longest = rdv_arena_largest_run(h);
        if (longest > out->largest_free)
            out->largest_free = longest;
    }
    out->capacity = h->cap;
    out->max_keys = h->khdr->max_keys;
    out->aborted = rdv_is_aborted(h);
    out->leases_dropped = READ_ONCE(h->khdr->leases_dropped); /* relaxed: a statistic */
    int64_t counted = rdv_index_live_keys(h);
    out->keys_counted = counted > 0 ? (uint64_t)counted : 0;
    out->flags = h->khdr->seg_flags; /* a constant, written before the segment was published */
    return 0;
}

void rdv_mapping(rdv_t *h, uint64_t *base, uint64_t *len) {
    *base = (uint64_t)(uintptr_t)h->base;
    *len = h->map_len;
}

int rdv_stats(rdv_t *h, struct rdv_stats *out) { WITH_REF(h, do_stats(h, out)); }

/* Live keys, read under each slot's lock (the name from its oldest message). */
static int do_keys(rdv_t *h, struct rdv_key_info *out, uint32_t cap, uint32_t *n) {
    uint32_t k = 0;
    for (uint64_t i = 0; i <= h->slot_mask && k < cap; i++) {
        struct rdv_slot *s = &h->kslots[i];
        if (READ_ONCE(s->state) != RDV_SLOT_LIVE) /* relaxed: re-checked under the lock */
            continue;
        rdv_lock(h, &s->lock);
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
        rdv_unlock(h, &s->lock);
    }
    *n = k;
    return 0;
}

int rdv_keys(rdv_t *h, struct rdv_key_info *out, uint32_t cap, uint32_t *n) { WITH_REF(h, do_keys(h, out, cap, n)); }

static void count_holding(struct rdv_proc_info *pi, const struct rdv_msg *m, uint64_t len) {
    if (m->owner != pi->entry + 1 || rdv_msg_kept(m))
        return; /* a kept block is no view (rdv_arena.c) */
    if (m->stage == RDV_MSG_DELIVERED) {
        pi->views++;
        pi->view_bytes += len;
    } else if (m->stage == RDV_MSG_WRITING) {
        pi->writing++;
    }
}

static int do_procs(rdv_t *h, struct rdv_proc_info *out, uint32_t cap, uint32_t *n) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < RDV_MAX_PROCS && k < cap; i++) {
        struct rdv_proc *p = &h->kprocs[i];
        /* acquire: pairs with the release of ALIVE; a snapshot for humans */
        uint32_t st = smp_load_acquire(&p->state);
        if (st == RDV_PROC_FREE)
            continue;
        struct rdv_proc_info *pi = &out[k++];
        memset(pi, 0, sizeof *pi);
        pi->entry = i;
        pi->pid = READ_ONCE(p->pid); /* relaxed, below too: a snapshot for humans */
        pi->state = st;
        pi->alive = (uint32_t)h->ops.alive(h, i);
        pi->attached_ns = READ_ONCE(p->attached_ns);
    }
    /* a snapshot for humans: the lock-free walk, as everywhere */
    const struct rdv_msg *m;
    for (uint32_t g = 0; (m = rdv_arena_next(h, &g)); rdv_arena_step(h, &g)) {
        uint64_t len;
        if (rdv_block_at(h, m->pos, &len))
            for (uint32_t j = 0; j < k; j++)
                count_holding(&out[j], m, len);
    }
    /* receives waiting in line: linked waiter records */
    uint32_t g = 0, first, last;
    while ((m = rdv_waiter_slab_next(h, 0, &g, &first, &last)))
        for (uint32_t j = 0; j < k; j++)
            if (m->owner == out[j].entry + 1)
                for (uint32_t link = first; link <= last; link++)
                    out[j].waits += READ_ONCE(rdv_waiter_at(h, link)->slot) != 0; /* relaxed: a snapshot */
    *n = k;
    return 0;
}

uint32_t rdv_reaped(rdv_t *h, uint32_t *pids, uint32_t cap) {
    uint32_t n = READ_ONCE(h->reaped); /* process-local */
    for (uint32_t i = 0; i < n && i < cap && i < 16; i++)
        pids[i] = h->reaped_pids[i];
    return n;
}

int rdv_procs(rdv_t *h, struct rdv_proc_info *out, uint32_t cap, uint32_t *n) {
    WITH_REF(h, do_procs(h, out, cap, n));
}

int rdv_gc(rdv_t *h, uint32_t *reclaimed) { WITH_REF(h, rdv_recover_dead(h, reclaimed)); }

