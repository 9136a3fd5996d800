/* The payload arena: a ring of variable-size blocks, allocated at p_tail by
 * compare-and-swap and reclaimed at c_head once freed, in any order.
 *
 * Block state lives out of band in the side table (one u32 per granule), so
 * nothing a user writes into a payload can be mistaken for ring metadata. A
 * side entry is nonzero only for a block between c_head and p_tail: a
 * producer writes it right after winning its reservation, a reclaimer clears
 * it before moving c_head past the block. A reclaimer that finds a zero entry
 * at c_head is looking at a reservation in flight and stops. */
#include <errno.h>

#include "rdv_atomic.h"
#include "rdv_layout.h"

int rdv_arena_alloc(rdv_t *h, uint64_t nbytes, uint64_t *pos) {
    struct rdv_header *khdr = h->khdr;
    uint64_t n = (nbytes + RDV_GRANULE - 1) & ~(uint64_t)(RDV_GRANULE - 1);
    if (n == 0 || n > h->cap)
        return -EMSGSIZE;
    /* relaxed: a stale tail only makes the CAS below fail and retry */
    uint64_t t = READ_ONCE(khdr->p_tail);
    for (;;) {
        /* acquire: pairs with the release store of c_head in reclaim(), so
         * the previous owners' accesses to the space we take happen first */
        uint64_t hd = smp_load_acquire(&khdr->c_head);
        if (t - hd + n > h->cap)
            return -ENOSPC;
        /* relaxed CAS: it only reserves [t, t+n); the side entry below is
         * what publishes the block to reclaimers */
        if (rdv_cas(&khdr->p_tail, &t, t + n, __ATOMIC_RELAXED))
            break;
    }
    /* release: pairs with the acquire load in reclaim(); a BUSY entry stops it */
    smp_store_release(&h->kside[rdv_granule_of(h, t)], (uint32_t)(n / RDV_GRANULE));
    *pos = t;
    return 0;
}

/* Move c_head past every freed block at the head of the ring. */
static void reclaim(rdv_t *h) {
    struct rdv_header *khdr = h->khdr;
    int moved = 0;
    for (;;) {
        /* acquire: pairs with the release store below by another reclaimer */
        uint64_t hd = smp_load_acquire(&khdr->c_head);
        /* relaxed: compared only; a reserved-but-unpublished block has a zero
         * side entry, which stops us anyway */
        if (hd == READ_ONCE(khdr->p_tail))
            break;
        uint32_t *kent = &h->kside[rdv_granule_of(h, hd)];
        /* acquire: pairs with the release FREE store in rdv_arena_free: the
         * owner's last access to the block happens before we reuse it */
        uint32_t v = smp_load_acquire(kent);
        if (!(v & RDV_SIDE_FREE))
            break; /* in use, or reserved and not yet published */
        /* Claim the entry, then move the head. The head CAS fails only if the
         * head moved on since we read it (the entry we claimed then belongs
         * to a later lap): give it back and start over. */
        if (!rdv_cas(kent, &v, 0, __ATOMIC_ACQ_REL))
            continue;
        uint64_t want = hd;
        /* release: publishes the cleared entry and the freed space to
         * allocators (their acquire load of c_head) */
        if (!rdv_cas(&khdr->c_head, &want, hd + (uint64_t)RDV_SIDE_LEN(v) * RDV_GRANULE,
                     __ATOMIC_RELEASE)) {
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

/* 0 and the block length if pos names a block that is allocated and not yet
 * freed; -EINVAL otherwise. Guards every free against a bad position. */
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

int rdv_arena_free(rdv_t *h, uint64_t pos) {
    uint64_t len;
    int rc = rdv_arena_check_busy(h, pos, &len);
    if (rc < 0)
        return rc;
    uint32_t *kent = &h->kside[rdv_granule_of(h, pos)];
    /* release: everything we did with the block happens before a reclaimer
     * (acquire load in reclaim) hands it to the next producer */
    rdv_fetch_or(kent, RDV_SIDE_FREE, __ATOMIC_RELEASE);
    /* full barrier: FREE store before the head load in reclaim(); pairs with
     * the barrier after a reclaimer's head move */
    smp_mb();
    reclaim(h);
    return 0;
}
