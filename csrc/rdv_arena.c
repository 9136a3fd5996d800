/* The payload arena: a ring of variable-size blocks, allocated at p_tail by
 * compare-and-swap and reclaimed at c_head once freed, in any order.
 *
 * Block state lives out of band in the side table (one u32 per granule), so
 * nothing a user writes into a payload can be mistaken for ring metadata. A
 * side entry is nonzero only for a block between c_head and p_tail: a
 * producer writes it right after winning its reservation, a reclaimer clears
 * it before moving c_head past the block. A reclaimer that finds a zero entry
 * at c_head is looking at a reservation in flight and stops.
 *
 * A received block whose view is held for long would stall the ring at the
 * head. When the arena runs out of space with such a block at the head, the
 * block becomes an island: recorded in the header's island table, stepped
 * over by c_head, and skipped by allocators (which cover it with a padding
 * block that is free from birth and never written) until its view is dropped.
 *
 * Producers that find no room sleep on space_seq. It is bumped only by steps
 * that can make room: a block freed, an island dropped, a block committed at
 * the head (it may be stepped over now), a dead process's step finished. An
 * allocation attempt itself never bumps it, though it moves the head (over
 * its own padding, over blocks it pins): that makes no room, and a producer
 * whose failed attempt bumped the word it is about to sleep on would never
 * sleep. In exchange an allocator decides that there is no room only when
 * the head is stable: another process's step on the head in flight (a
 * reclaim, a pin, a free not yet reclaimed) is waited out or finished. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>

#include "rdv_atomic.h"
#include "rdv_layout.h"


/* Bytes from ring offset a to the end of an island that [a, a+n) overlaps,
 * or 0 if it overlaps none. Offsets live in [0, 2*cap) thanks to the mirror. */
static uint64_t island_skip(rdv_t *h, uint64_t a, uint64_t n) {
    for (int i = 0; i < RDV_MAX_ISLANDS; i++) {
        /* acquire: pairs with the release store in pin_head, which happens
         * before the c_head move our caller has already observed */
        uint64_t w = smp_load_acquire(&h->khdr->islands[i]);
        if (!w)
            continue;
        int64_t o = (int64_t)rdv_island_off(w), l = (int64_t)rdv_island_len(w), cap = (int64_t)h->cap;
        /* the island's copies in the unrolled offset space; the one at o - cap
         * is the part of an island that wraps past the end into [0, ...) */
        int64_t copies[3] = {o - cap, o, o + cap};
        for (int c = 0; c < 3; c++)
            if (copies[c] < (int64_t)(a + n) && (int64_t)a < copies[c] + l)
                return (uint64_t)(copies[c] + l - (int64_t)a);
    }
    return 0;
}

/* Move c_head past every freed block at the head of the ring; 1 if it moved.
 * It does not wake producers: its callers that free something do. */
static int reclaim(rdv_t *h) {
    struct rdv_header *khdr = h->khdr;
    int moved = 0;
    for (;;) {
        /* acquire: pairs with the release CAS below by another reclaimer */
        uint64_t hd = smp_load_acquire(&khdr->c_head);
        /* relaxed: compared only; a reserved-but-unpublished block has a zero
         * side entry, which stops us anyway */
        if (hd == READ_ONCE(khdr->p_tail))
            break;
        uint32_t *kent = &h->kside[rdv_granule_of(h, hd)];
        /* acquire: pairs with the release CAS that set FREE in rdv_arena_free:
         * the owner's last access to the block happens before we reuse it */
        uint32_t v = smp_load_acquire(kent);
        uint64_t len = (uint64_t)RDV_SIDE_LEN(v) * RDV_GRANULE;
        if (!(v & RDV_SIDE_FREE) || RDV_SIDE_CLAIMED(v))
            break; /* in use, being reserved, or claimed by another reclaimer */
        if (len == 0 || len > READ_ONCE(khdr->p_tail) - hd)
            break; /* a damaged entry: never walk the head past the tail */
        /* Claim the entry (naming us), move the head, clear the entry. The
         * head CAS fails only if the head moved on since we read it (the
         * entry we claimed then belongs to a later lap): give it back. Our op
         * record lets whoever reclaims us finish or undo this if we die. */
        struct rdv_proc *kme = &h->kprocs[h->me];
        pthread_mutex_lock(&h->op_lock);
        /* relaxed: read only after our death; program order puts them first */
        WRITE_ONCE(kme->op_pos, hd);
        WRITE_ONCE(kme->op_val, v);
        WRITE_ONCE(kme->op_kind, RDV_OP_RECLAIM);
        int ok = 0;
        /* acq_rel: pairs with the release FREE in rdv_arena_free (the owner's
         * last access happens before us) and with other claimers */
        if (rdv_cas(kent, &v, RDV_SIDE_CLAIM | h->me, __ATOMIC_ACQ_REL)) {
            uint64_t want = hd;
            /* release: publishes the freed space to allocators (their
             * acquire load of c_head) */
            if (rdv_cas(&khdr->c_head, &want, hd + len, __ATOMIC_RELEASE)) {
                /* release: the entry is behind the head now; pairs with the
                 * acquire load of an allocator that comes round to it */
                smp_store_release(kent, 0);
                ok = 1;
            } else {
                smp_store_release(kent, v); /* release: as the FREE store it restores */
            }
        }
        WRITE_ONCE(kme->op_kind, RDV_OP_NONE); /* relaxed: as the record above */
        pthread_mutex_unlock(&h->op_lock);
        if (!ok)
            continue;
        moved = 1;
        /* full barrier: our head store before the next entry's load; pairs
         * with the barrier in rdv_arena_free between its FREE store and its
         * head load, so one of us always sees the other's block. */
        smp_mb();
    }
    return moved;
}

/* Wake the producers waiting for space: something was freed. Called after the
 * free and the reclaim that follows it, so that a producer that wakes finds
 * the head moved, or (if another process's reclaim is still in flight) waits
 * it out in make_room. */
static void wake_space(rdv_t *h) {
    /* relaxed: a hint for the waiters' spin (rdv_wait.c), read after they
     * see the bump below; a stale value misjudges one spin, no more */
    WRITE_ONCE(h->khdr->space_waker_cpu, (uint32_t)sched_getcpu() + 1);
    /* release (the bump): publishes the free and the head move to a producer
     * whose acquire load of space_seq reads the new value; full barrier
     * before reading space_sleepers, pairing with the waiter's (rdv_wait.c) */
    rdv_wake_all(&h->khdr->space_seq, &h->khdr->space_sleepers);
}

/* Step the head over the finished block at hd (entry v, busy), making it an
 * island: a message queued for a receiver that has not come (yet), or
 * delivered to a view still held. 1 if the head moved; 0 if it cannot be
 * (a block being written, which will be committed where it is, or a full
 * island table); -EAGAIN if the entry or the head changed meanwhile. Blocks
 * freed behind it are left to the caller's next look at the head. */
static int pin_head(rdv_t *h, uint64_t hd, uint32_t v) {
    struct rdv_header *khdr = h->khdr;
    uint32_t *kent = &h->kside[rdv_granule_of(h, hd)];
    const struct rdv_msg *m = rdv_msg_at(h, hd);
    uint8_t stage = READ_ONCE(m->stage); /* relaxed: the claim CAS below decides */
    if (m->pos != hd || (stage != RDV_MSG_QUEUED && stage != RDV_MSG_DELIVERED))
        return 0;
    int rc = 0;
    rdv_slot_lock(h, &khdr->island_lock);
    for (int i = 0; i < RDV_MAX_ISLANDS; i++) {
        if (READ_ONCE(khdr->islands[i])) /* relaxed: island words change under island_lock */
            continue;
        /* Island first, then claim the entry, then move the head: if we die
         * at any point, the island table tells whoever repairs it (under
         * island_lock) how far we got (see repair_islands). The release
         * makes the island visible before the head moves past the block, so
         * an allocator that sees the new head (acquire) sees the island. */
        smp_store_release(&khdr->islands[i],
                          rdv_island_word(rdv_granule_of(h, hd), RDV_SIDE_LEN(v)));
        rc = -EAGAIN;
        /* acq_rel: claims the entry against a concurrent release (which CASes
         * it to FREE) and reclaimers; the loser sees the other's value */
        if (!rdv_cas(kent, &v, 0, __ATOMIC_ACQ_REL)) {
            WRITE_ONCE(khdr->islands[i], 0); /* relaxed: never stepped over, nobody relied on it */
            break;
        }
        uint64_t want = hd;
        /* release: pairs with the acquire load of c_head in allocators */
        if (rdv_cas(&khdr->c_head, &want, hd + (uint64_t)RDV_SIDE_LEN(v) * RDV_GRANULE,
                    __ATOMIC_RELEASE)) {
            rc = 1;
        } else {
            smp_store_release(kent, v);      /* release: the entry back, as we found it */
            WRITE_ONCE(khdr->islands[i], 0); /* relaxed: the head never passed it */
        }
        break;
    }
    rdv_slot_unlock(&khdr->island_lock);
    return rc;
}

/* A message block names its holder before it is published: a producer
 * killed before it writes the rest of the header is still found as the
 * owner of a WRITING block (see reclaim_entry), and its space comes back.
 * Padding is never written: it may cover an island. */
static void name_holder(rdv_t *h, uint64_t pos) {
    struct rdv_msg *m = rdv_msg_at(h, pos);
    m->pos = pos;
    m->payload_off = 0; /* rdv_block_at checks it against the length */
    m->stage = RDV_MSG_WRITING;
    m->owner = (uint16_t)(h->me + 1);
}

/* Reserve [t, t+take) at the tail: claim the side entry at t (naming us),
 * move the tail, publish the entry. While the claim stands nobody else can
 * move the tail off t (producers that find a claimed entry at the tail wait
 * for it), so the tail CAS fails only if t was stale: then the claim is
 * undone. Our op record lets whoever reclaims us finish or undo this if we
 * die in between. 0, or -EAGAIN to retry. */
static int reserve(rdv_t *h, uint32_t *kent, uint64_t t, uint64_t take, uint32_t flags) {
    struct rdv_proc *kme = &h->kprocs[h->me];
    uint32_t zero = 0;
    int rc = -EAGAIN;
    pthread_mutex_lock(&h->op_lock);
    /* relaxed: read only after our death; program order puts them first */
    WRITE_ONCE(kme->op_pos, t);
    WRITE_ONCE(kme->op_val, (uint32_t)(take / RDV_GRANULE));
    WRITE_ONCE(kme->op_kind, RDV_OP_ALLOC);
    /* acquire: pairs with the release clear of the entry by the reclaimer
     * that last passed it, so its accesses to the space happen first */
    if (rdv_cas(kent, &zero, RDV_SIDE_CLAIM | h->me, __ATOMIC_ACQUIRE)) {
        uint64_t want = t;
        /* relaxed: the claim, not the tail, is what other producers obey */
        if (rdv_cas(&h->khdr->p_tail, &want, t + take, __ATOMIC_RELAXED)) {
            if (!flags)
                name_holder(h, t);
            /* release: publishes the block (BUSY, or FREE for padding), and
             * its holder, to reclaimers; pairs with their acquire load of
             * the entry */
            smp_store_release(kent, (uint32_t)(take / RDV_GRANULE) | flags);
            rc = 0;
        } else {
            smp_store_release(kent, 0); /* stale t: undo */
        }
    }
    WRITE_ONCE(kme->op_kind, RDV_OP_NONE);
    pthread_mutex_unlock(&h->op_lock);
    return rc;
}

/* A producer found the tail's entry claimed: wait for the claimer, and if it
 * stays, find out whether it died (reclaiming it finishes or undoes its step). */
static void wait_for_claim(rdv_t *h, uint32_t claim, unsigned *spins) {
    rdv_cpu_relax();
    if ((++*spins & 63) == 0)
        sched_yield(); /* the claimer may be preempted on this CPU */
    if ((*spins & 4095) == 0 && !rdv_proc_alive(h, RDV_SIDE_CLAIMER(claim)))
        rdv_proc_reclaim_dead(h, NULL);
}

/* An allocator found no room between the tail and the head it read, hd.
 * Make room without waiting for space_seq: step over a finished block at the
 * head, finish a free nobody has reclaimed yet, or wait out another
 * process's step on the head (a few stores). 1: look again. 0: the head is
 * stable and stuck (a block being written, a full island table, an empty
 * ring whose islands leave no room, or damage) until somebody frees,
 * commits or unpins, each of which bumps space_seq after it: the caller may
 * sleep on the value it read before its attempt. */
static int make_room(rdv_t *h, uint64_t hd, unsigned *spins) {
    struct rdv_header *khdr = h->khdr;
    /* relaxed: compared only; a tail that moved on is seen by the next look */
    if (hd == READ_ONCE(khdr->p_tail))
        return 0;
    uint32_t *kent = &h->kside[rdv_granule_of(h, hd)];
    /* acquire: pairs with the release stores of the entry (reserve(), the
     * FREE CAS in rdv_arena_free, a reclaimer's clear after its head move) */
    uint32_t v = smp_load_acquire(kent);
    /* acquire: a reclaimer clears the entry after moving the head, so an
     * entry read as cleared comes with the head move it followed */
    if (smp_load_acquire(&khdr->c_head) != hd)
        return 1;
    if (RDV_SIDE_CLAIMED(v)) {
        wait_for_claim(h, v, spins); /* a reclaimer between its claim and its head move */
        return 1;
    }
    if (v & RDV_SIDE_FREE) {
        /* Freed (or padding), and its freer has not reclaimed it yet: do it
         * for them. If nothing moved and nothing changed, it is damage. */
        if (reclaim(h))
            return 1;
        /* acquire: as above */
        return smp_load_acquire(kent) != v || smp_load_acquire(&khdr->c_head) != hd;
    }
    if (v == 0) {
        /* A pin in flight: pin_head clears the entry, then moves the head,
         * under island_lock. Taking the lock waits for it (and repairs the
         * pin of a process that died holding it). */
        rdv_slot_lock(h, &khdr->island_lock);
        rdv_slot_unlock(&khdr->island_lock);
        /* acquire: as above */
        return smp_load_acquire(kent) != 0 || smp_load_acquire(&khdr->c_head) != hd;
    }
    return pin_head(h, hd, v) != 0; /* moved, or raced: look again */
}

int rdv_arena_alloc(rdv_t *h, uint64_t nbytes, uint64_t *pos) {
    struct rdv_header *khdr = h->khdr;
    uint64_t n = (nbytes + RDV_GRANULE - 1) & ~(uint64_t)(RDV_GRANULE - 1);
    if (n == 0 || n > h->cap)
        return -EMSGSIZE;
    uint64_t padded = 0; /* once a whole lap is padding, islands leave no room */
    unsigned spins = 0;
    for (;;) {
        /* acquire: pairs with the release CAS of c_head in reclaim()/pin_head(),
         * so islands stepped over are visible to island_skip */
        uint64_t hd = smp_load_acquire(&khdr->c_head);
        /* relaxed: a stale tail only makes reserve() fail and retry. Read
         * after the head, so it is never behind it (the head moves only over
         * blocks a reclaimer saw below the tail). */
        uint64_t t = READ_ONCE(khdr->p_tail);
        uint64_t skip = island_skip(h, t % h->cap, n);
        uint64_t take = skip ? skip : n;
        if (t - hd + take > h->cap || padded > h->cap) {
            if (make_room(h, hd, &spins))
                continue;
            return -ENOSPC;
        }
        uint32_t *kent = &h->kside[rdv_granule_of(h, t)];
        /* relaxed: a first look; reserve() claims it with a CAS */
        uint32_t cur = READ_ONCE(*kent);
        if (cur != 0) {
            if (READ_ONCE(khdr->p_tail) != t)
                continue; /* our tail was stale */
            if (!RDV_SIDE_CLAIMED(cur))
                return -EBADMSG; /* only damage puts a block at the tail */
            wait_for_claim(h, cur, &spins);
            continue;
        }
        if (reserve(h, kent, t, take, skip ? RDV_SIDE_FREE : 0) < 0)
            continue;
        if (skip) {
            smp_mb(); /* as in rdv_arena_free: entry store before head load */
            reclaim(h);
            padded += take;
            continue;
        }
        *pos = t;
        return 0;
    }
}

/* A process died in the middle of an arena step: finish or undo it, from its
 * op record and its claim in the side table. Called with its byte lock held. */
static int land_on_block_start(rdv_t *h, uint64_t target);

void rdv_arena_recover_op(rdv_t *h, uint32_t dead) {
    struct rdv_proc *kp = &h->kprocs[dead];
    /* relaxed: the dead process wrote its record before its claim, and we
     * hold its byte lock: nobody else writes these now */
    uint32_t kind = READ_ONCE(kp->op_kind), val = READ_ONCE(kp->op_val);
    uint64_t pos = READ_ONCE(kp->op_pos);
    WRITE_ONCE(kp->op_kind, RDV_OP_NONE);
    uint32_t *kent = &h->kside[rdv_granule_of(h, pos)];
    uint32_t claim = RDV_SIDE_CLAIM | dead;
    /* relaxed: a claim naming the dead process changes only through us */
    if (kind == RDV_OP_NONE || READ_ONCE(*kent) != claim)
        return; /* no step, or its claim failed or completed */
    struct rdv_header *khdr = h->khdr;
    /* acquire/relaxed: the ring window, as everywhere (tail only compared) */
    uint64_t hd = smp_load_acquire(&khdr->c_head), t = READ_ONCE(khdr->p_tail);
    uint32_t to = 0;
    if (kind == RDV_OP_ALLOC) {
        /* Its tail CAS succeeded iff pos starts a block in the ring: then
         * the block is its, never published (its header at most half
         * written): publish it as free padding. If the tail is still at pos
         * it reserved nothing; otherwise its pos was stale and the claim
         * sits inside another block or beyond. */
        if (t != pos && land_on_block_start(h, pos) > 0)
            to = RDV_SIDE_LEN(val) | RDV_SIDE_FREE;
    } else if (kind == RDV_OP_RECLAIM) {
        /* If the claimed granule lies in the ring window, the FREE block it
         * starts is still there (the head was not moved, or the claim was on
         * a later lap than the dead process thought): give the entry back.
         * Otherwise the head moved past it: clear the claim. */
        uint64_t lap_pos = hd + (pos % h->cap + h->cap - hd % h->cap) % h->cap;
        to = lap_pos < t ? val : 0;
    } else {
        return; /* an unknown step (damage): leave its claim alone */
    }
    /* release: as in reserve() and rdv_arena_free, whose stores these are */
    if (!rdv_cas(kent, &claim, to, __ATOMIC_RELEASE))
        return;
    if (to & RDV_SIDE_FREE) {
        /* A free block that may be the one at the head: reclaim, as
         * rdv_arena_free does (full barrier: FREE store before head load). */
        smp_mb();
        reclaim(h);
    }
    /* Finished or undone, the step may have made room (the dead process's
     * free would have woken producers after it). */
    wake_space(h);
}

/* 1 if target is the start of a block on the chain from c_head, 0 if the
 * chain passes it, -1 if the chain cannot be followed right now. */
static int land_on_block_start(rdv_t *h, uint64_t target) {
    uint64_t p = smp_load_acquire(&h->khdr->c_head), t = READ_ONCE(h->khdr->p_tail);
    if (target - p >= t - p)
        return 0; /* outside the ring window */
    while (p < target) {
        /* acquire: entries are published with release */
        uint32_t v = smp_load_acquire(&h->kside[rdv_granule_of(h, p)]);
        uint64_t len;
        if (RDV_SIDE_CLAIMED(v)) {
            struct rdv_proc *kc = &h->kprocs[RDV_SIDE_CLAIMER(v) % RDV_MAX_PROCS];
            /* relaxed: a claimer's record, written before its claim; if it
             * is alive and moving on, the walk gives up (-1) */
            if (READ_ONCE(kc->op_kind) != RDV_OP_ALLOC || READ_ONCE(kc->op_pos) != p)
                return -1;
            len = (uint64_t)READ_ONCE(kc->op_val) * RDV_GRANULE;
        } else {
            len = (uint64_t)RDV_SIDE_LEN(v) * RDV_GRANULE;
        }
        if (len == 0)
            return -1;
        p += len;
    }
    return p == target;
}

/* 0 and the block length if pos names a block between c_head and p_tail that
 * is allocated and not yet freed; -EINVAL otherwise. */
int rdv_arena_check_busy(rdv_t *h, uint64_t pos, uint64_t *len) {
    if (pos % RDV_GRANULE)
        return -EINVAL;
    /* acquire: pairs with the head's release moves; tail: relaxed, compared only */
    uint64_t hd = smp_load_acquire(&h->khdr->c_head);
    uint64_t t = READ_ONCE(h->khdr->p_tail);
    if (pos - hd >= t - hd) /* unsigned: pos outside [c_head, p_tail) */
        return -EINVAL;
    /* acquire: pairs with the release store of the entry in rdv_arena_alloc */
    uint32_t v = smp_load_acquire(&h->kside[rdv_granule_of(h, pos)]);
    uint64_t n = (uint64_t)RDV_SIDE_LEN(v) * RDV_GRANULE;
    if (v == 0 || (v & RDV_SIDE_FREE) || n > t - pos)
        return -EINVAL;
    *len = n;
    return 0;
}

void rdv_arena_committed(rdv_t *h, uint64_t pos) {
    /* A producer waiting for space may find it can now step the head over
     * this block (it was still being written): bump space_seq so it
     * retries, if the block is at the head or already behind it (another
     * producer pinned it between our stage store and our look, and pinning
     * wakes nobody). The waiter read space_seq (acquire) before it looked at
     * the block, so it either saw the new stage or sees the bump. The full
     * barrier orders our stage store (made under the slot lock) before the
     * head load. */
    smp_mb();
    /* acquire/relaxed: the ring window, as everywhere (tail only compared) */
    uint64_t hd = smp_load_acquire(&h->khdr->c_head), t = READ_ONCE(h->khdr->p_tail);
    if (pos == hd || pos - hd >= t - hd)
        wake_space(h);
}

int rdv_arena_owned(rdv_t *h, uint64_t pos, uint64_t *len) {
    if (rdv_arena_check_busy(h, pos, len) == 0)
        return 0;
    uint64_t off = pos % h->cap;
    for (int i = 0; i < RDV_MAX_ISLANDS; i++) {
        /* acquire: pairs with the release store of the island in pin_head */
        uint64_t w = smp_load_acquire(&h->khdr->islands[i]);
        if (w && rdv_island_off(w) == off && pos % RDV_GRANULE == 0) {
            *len = rdv_island_len(w);
            return 0;
        }
    }
    return -EINVAL;
}

/* Drop the island for the block at pos, if there is one. */
static int unpin(rdv_t *h, uint64_t pos) {
    struct rdv_header *khdr = h->khdr;
    uint64_t off = pos % h->cap;
    int found = 0;
    rdv_slot_lock(h, &khdr->island_lock);
    for (int i = 0; i < RDV_MAX_ISLANDS && !found; i++) {
        uint64_t w = READ_ONCE(khdr->islands[i]); /* relaxed: under island_lock */
        if (w && rdv_island_off(w) == off) {
            /* release: our last access to the block happens before an
             * allocator that no longer sees the island writes there */
            smp_store_release(&khdr->islands[i], 0);
            found = 1;
        }
    }
    rdv_slot_unlock(&khdr->island_lock);
    if (found)
        wake_space(h);
    return found;
}

int rdv_arena_free(rdv_t *h, uint64_t pos) {
    for (int tries = 0; tries < 2; tries++) {
        uint64_t len;
        while (rdv_arena_check_busy(h, pos, &len) == 0) {
            uint32_t *kent = &h->kside[rdv_granule_of(h, pos)];
            uint32_t v = READ_ONCE(*kent); /* relaxed: the CAS below decides */
            if (v == 0 || (v & RDV_SIDE_FREE))
                break;
            /* release: everything we did with the block happens before a
             * reclaimer (acquire load in reclaim) hands it to the next
             * producer. A CAS, not an OR: pin_head may have claimed it. */
            if (rdv_cas(kent, &v, v | RDV_SIDE_FREE, __ATOMIC_RELEASE)) {
                /* full barrier: FREE store before the head load in reclaim();
                 * pairs with the barrier after a reclaimer's head move */
                smp_mb();
                reclaim(h);
                wake_space(h); /* even if the head did not move: see make_room */
                return 0;
            }
        }
        /* Not in the ring window any more: pinned as an island, or being
         * pinned right now (unpin waits for that under the island lock). */
        if (unpin(h, pos))
            return 0;
    }
    return -EINVAL;
}

struct rdv_msg *rdv_block_at(rdv_t *h, uint64_t pos, uint64_t *len) {
    if (rdv_arena_owned(h, pos, len) < 0)
        return NULL;
    struct rdv_msg *m = rdv_msg_at(h, pos);
    return m->pos == pos && m->payload_off <= *len ? m : NULL; /* an empty payload ends the block */
}

struct rdv_msg *rdv_queued_msg(rdv_t *h, uint32_t g, uint64_t *len) {
    uint64_t off = (uint64_t)(g - 1) * RDV_GRANULE;
    if (g == 0 || off >= h->cap)
        return NULL;
    struct rdv_msg *m = rdv_msg_at(h, off);
    return m->pos % h->cap == off ? rdv_block_at(h, m->pos, len) : NULL;
}

uint64_t rdv_arena_island_bytes(rdv_t *h) {
    uint64_t sum = 0;
    for (int i = 0; i < RDV_MAX_ISLANDS; i++) {
        /* relaxed: a statistic */
        uint64_t w = READ_ONCE(h->khdr->islands[i]);
        if (w)
            sum += rdv_island_len(w);
    }
    return sum;
}
