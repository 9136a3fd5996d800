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
 * block that is free from birth and never written) until its view is dropped. */
#include <errno.h>

#include "rdv_atomic.h"
#include "rdv_layout.h"

static inline uint64_t island_word(uint64_t off_g, uint64_t len_g) {
    return RDV_ISLAND_VALID | off_g << 30 | len_g;
}
static inline uint64_t island_off(uint64_t w) { return ((w >> 30) & 0x3fffffffu) * RDV_GRANULE; }
static inline uint64_t island_len(uint64_t w) { return (w & 0x3fffffffu) * RDV_GRANULE; }

/* Bytes from ring offset a to the end of an island that [a, a+n) overlaps,
 * or 0 if it overlaps none. Offsets live in [0, 2*cap) thanks to the mirror. */
static uint64_t island_skip(rdv_t *h, uint64_t a, uint64_t n) {
    for (int i = 0; i < RDV_MAX_ISLANDS; i++) {
        /* acquire: pairs with the release store in pin_head, which happens
         * before the c_head move our caller has already observed */
        uint64_t w = smp_load_acquire(&h->khdr->islands[i]);
        if (!w)
            continue;
        int64_t o = (int64_t)island_off(w), l = (int64_t)island_len(w), cap = (int64_t)h->cap;
        /* the island's copies in the unrolled offset space; the one at o - cap
         * is the part of an island that wraps past the end into [0, ...) */
        int64_t copies[3] = {o - cap, o, o + cap};
        for (int c = 0; c < 3; c++)
            if (copies[c] < (int64_t)(a + n) && (int64_t)a < copies[c] + l)
                return (uint64_t)(copies[c] + l - (int64_t)a);
    }
    return 0;
}

/* Move c_head past every freed block at the head of the ring. */
static void reclaim(rdv_t *h) {
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
        if (!(v & RDV_SIDE_FREE))
            break; /* in use, or reserved and not yet published */
        if (len == 0 || len > READ_ONCE(khdr->p_tail) - hd)
            break; /* a damaged entry: never walk the head past the tail */
        /* Claim the entry, then move the head. The head CAS fails only if the
         * head moved on since we read it (the entry we claimed then belongs
         * to a later lap): give it back and start over. */
        if (!rdv_cas(kent, &v, 0, __ATOMIC_ACQ_REL))
            continue;
        uint64_t want = hd;
        /* release: publishes the cleared entry and the freed space to
         * allocators (their acquire load of c_head) */
        if (!rdv_cas(&khdr->c_head, &want, hd + len, __ATOMIC_RELEASE)) {
            smp_store_release(kent, v);
            continue;
        }
        moved = 1;
        /* full barrier: our head store before the next entry's load; pairs
         * with the barrier in rdv_arena_free between its FREE store and its
         * head load, so one of us always sees the other's block. */
        smp_mb();
    }
    if (moved)
        rdv_wake_all(&khdr->space_seq, &khdr->space_sleepers);
}

/* If the block at the head is a delivered one (a receiver holds its view),
 * make it an island and step the head over it. 1 if the head moved. */
static int pin_head(rdv_t *h, uint64_t hd) {
    struct rdv_header *khdr = h->khdr;
    if (hd == READ_ONCE(khdr->p_tail))
        return 0;
    uint32_t *kent = &h->kside[rdv_granule_of(h, hd)];
    /* acquire: pairs with the release store in rdv_arena_alloc */
    uint32_t v = smp_load_acquire(kent);
    if ((v & (RDV_SIDE_FREE | RDV_SIDE_DELIVERED)) != RDV_SIDE_DELIVERED)
        return 0;
    int moved = 0;
    rdv_slot_lock(h, &khdr->island_lock);
    for (int i = 0; i < RDV_MAX_ISLANDS; i++) {
        if (READ_ONCE(khdr->islands[i]))
            continue;
        /* Island first, then claim the entry, then move the head: if we die
         * at any point, the island table tells whoever repairs it (under
         * island_lock) how far we got (see repair_islands). The release
         * makes the island visible before the head moves past the block, so
         * an allocator that sees the new head (acquire) sees the island. */
        smp_store_release(&khdr->islands[i],
                          island_word(rdv_granule_of(h, hd), RDV_SIDE_LEN(v)));
        /* acq_rel: claims the entry against a concurrent release (which CASes
         * it to FREE) and reclaimers; the loser sees the other's value */
        if (!rdv_cas(kent, &v, 0, __ATOMIC_ACQ_REL)) {
            WRITE_ONCE(khdr->islands[i], 0);
            break;
        }
        uint64_t want = hd;
        /* release: pairs with the acquire load of c_head in allocators */
        if (rdv_cas(&khdr->c_head, &want, hd + (uint64_t)RDV_SIDE_LEN(v) * RDV_GRANULE,
                    __ATOMIC_RELEASE)) {
            moved = 1;
        } else {
            smp_store_release(kent, v);
            WRITE_ONCE(khdr->islands[i], 0);
        }
        break;
    }
    rdv_slot_unlock(&khdr->island_lock);
    if (moved) {
        smp_mb(); /* head move before reading the next entry, as in reclaim() */
        reclaim(h);
        rdv_wake_all(&khdr->space_seq, &khdr->space_sleepers);
    }
    return moved;
}

int rdv_arena_alloc(rdv_t *h, uint64_t nbytes, uint64_t *pos) {
    struct rdv_header *khdr = h->khdr;
    uint64_t n = (nbytes + RDV_GRANULE - 1) & ~(uint64_t)(RDV_GRANULE - 1);
    if (n == 0 || n > h->cap)
        return -EMSGSIZE;
    /* relaxed: a stale tail only makes the CAS below fail and retry */
    uint64_t t = READ_ONCE(khdr->p_tail);
    uint64_t padded = 0; /* once a whole lap is padding, islands leave no room */
    for (;;) {
        /* acquire: pairs with the release CAS of c_head in reclaim()/pin_head(),
         * so the previous owners' accesses to the space we take happen first,
         * and islands stepped over are visible to island_skip */
        uint64_t hd = smp_load_acquire(&khdr->c_head);
        uint64_t skip = island_skip(h, t % h->cap, n);
        uint64_t take = skip ? skip : n;
        if (t - hd + take > h->cap || padded > h->cap) {
            if (pin_head(h, hd))
                continue;
            return -ENOSPC;
        }
        /* relaxed CAS: it only reserves [t, t+take); the side entry below is
         * what publishes the block to reclaimers */
        if (!rdv_cas(&khdr->p_tail, &t, t + take, __ATOMIC_RELAXED))
            continue;
        uint32_t *kent = &h->kside[rdv_granule_of(h, t)];
        if (skip) {
            /* release: a padding block, free from birth; pairs with the
             * acquire load in reclaim() */
            smp_store_release(kent, (uint32_t)(take / RDV_GRANULE) | RDV_SIDE_FREE);
            smp_mb(); /* as in rdv_arena_free: entry store before head load */
            reclaim(h);
            t += take;
            padded += take;
            continue;
        }
        /* release: pairs with the acquire load in reclaim(); a BUSY entry stops it */
        smp_store_release(kent, (uint32_t)(n / RDV_GRANULE));
        *pos = t;
        return 0;
    }
}

/* 0 and the block length if pos names a block between c_head and p_tail that
 * is allocated and not yet freed; -EINVAL otherwise. */
int rdv_arena_check_busy(rdv_t *h, uint64_t pos, uint64_t *len) {
    if (pos % RDV_GRANULE)
        return -EINVAL;
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

void rdv_arena_mark_delivered(rdv_t *h, uint64_t pos) {
    /* relaxed: tells pin_head that a view now holds the block; atomic so it
     * cannot lose a concurrent bit. Published by the bump below. */
    rdv_fetch_or(&h->kside[rdv_granule_of(h, pos)], RDV_SIDE_DELIVERED, __ATOMIC_RELAXED);
    /* A producer waiting for space may find it can now pin the head block:
     * bump space_seq so it retries. It read space_seq (acquire) before it
     * looked at the entry, so it either saw DELIVERED or sees the bump.
     * The full barrier orders our entry store before the head load. */
    smp_mb();
    if (smp_load_acquire(&h->khdr->c_head) == pos)
        rdv_wake_all(&h->khdr->space_seq, &h->khdr->space_sleepers);
}

/* Drop the island for the block at pos, if there is one. */
static int unpin(rdv_t *h, uint64_t pos) {
    struct rdv_header *khdr = h->khdr;
    uint64_t off = pos % h->cap;
    int found = 0;
    rdv_slot_lock(h, &khdr->island_lock);
    for (int i = 0; i < RDV_MAX_ISLANDS && !found; i++) {
        uint64_t w = READ_ONCE(khdr->islands[i]);
        if (w && island_off(w) == off) {
            /* release: our last access to the block happens before an
             * allocator that no longer sees the island writes there */
            smp_store_release(&khdr->islands[i], 0);
            found = 1;
        }
    }
    rdv_slot_unlock(&khdr->island_lock);
    if (found)
        rdv_wake_all(&khdr->space_seq, &khdr->space_sleepers);
    return found;
}

int rdv_arena_free(rdv_t *h, uint64_t pos) {
    for (int tries = 0; tries < 2; tries++) {
        uint64_t len;
        while (rdv_arena_check_busy(h, pos, &len) == 0) {
            uint32_t *kent = &h->kside[rdv_granule_of(h, pos)];
            uint32_t v = READ_ONCE(*kent);
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

uint64_t rdv_arena_island_bytes(rdv_t *h) {
    uint64_t sum = 0;
    for (int i = 0; i < RDV_MAX_ISLANDS; i++) {
        /* relaxed: a statistic */
        uint64_t w = READ_ONCE(h->khdr->islands[i]);
        if (w)
            sum += island_len(w);
    }
    return sum;
}
