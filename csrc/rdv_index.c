/* Layer 4: the key index: an open-addressing table of key slots in shared memory.
 *
 * Lookups are lock-free reads of (state, hash, length) along a probe run
 * bounded by the home slot's max_probe. Everything that changes a slot goes
 * through its own lock word, taken by compare-and-swap and held for a handful
 * of stores (never across a wait or a copy). Inserting a new key also takes
 * the home slot's ins_lock so that two processes cannot insert the same key
 * twice; deleting needs only the slot's own lock. A slot is deleted (made a
 * tombstone, reusable by later inserts) once it holds no messages and no
 * waiters, so keys that carry a step number do not fill the table. */
#include <errno.h>
#include <string.h>

#include "rdv_atomic.h"
#include "rdv_index.h"
#include "rdv_lock.h"

/* ---- hashing ---------------------------------------------------------------
 * Two independent 64-bit hashes per key (seeded per segment at creation). */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(uint64_t seed, const char *p, uint32_t len) {
    uint64_t acc = mix64(seed ^ ((uint64_t)len * 0x9e3779b97f4a7c15ULL));
    uint32_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        acc = mix64(acc ^ w) * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
    }
    uint64_t tail = 0;
    memcpy(&tail, p + i, len - i);
    return mix64(acc ^ tail ^ ((uint64_t)(len - i) << 56));
}

void rdv_hash_key(const rdv_t *h, const char *key, uint32_t len, uint64_t *h1, uint64_t *h2) {
    *h1 = hash_bytes(h->khdr->hash_seed[0], key, len);
    *h2 = hash_bytes(h->khdr->hash_seed[1], key, len);
}

/* ---- lookups ---------------------------------------------------------------*/

static int slot_matches(const struct rdv_slot *s, uint64_t h1, uint64_t h2, uint32_t key_len) {
    /* relaxed: a lock-free guess; rdv_index_acquire re-checks under the lock */
    return READ_ONCE(s->state) == RDV_SLOT_LIVE && READ_ONCE(s->h1) == h1 &&
           READ_ONCE(s->h2) == h2 && READ_ONCE(s->key_len) == key_len;
}

int rdv_index_find(rdv_t *h, uint64_t h1, uint64_t h2, uint32_t key_len, uint32_t *idx) {
    uint64_t home = h1 & h->slot_mask;
    /* acquire: pairs with the release store in insert(); a concurrent insert
     * may still be missed, which callers handle by inserting under ins_lock */
    uint32_t max_probe = smp_load_acquire(&h->kslots[home].max_probe);
    for (uint64_t d = 0; d <= max_probe; d++) {
        uint64_t i = (home + d) & h->slot_mask;
        if (slot_matches(&h->kslots[i], h1, h2, key_len)) {
            *idx = (uint32_t)i;
            return 0;
        }
    }
    return -ENOENT;
}

/* Claim a free slot for the key; called with the home's ins_lock held and
 * the key known to be absent. Returns with the new slot locked. */
static int insert(rdv_t *h, uint64_t h1, uint64_t h2, uint32_t key_len, uint32_t *idx) {
    uint64_t home = h1 & h->slot_mask;
    for (uint64_t d = 0; d <= h->slot_mask; d++) {
        uint64_t i = (home + d) & h->slot_mask;
        struct rdv_slot *s = &h->kslots[i];
        if (READ_ONCE(s->state) == RDV_SLOT_LIVE) /* relaxed: re-checked under the lock */
            continue;
        rdv_lock(h, &s->lock);
        if (s->state == RDV_SLOT_LIVE) {
            rdv_unlock(&s->lock);
            continue;
        }
        /* relaxed: lookups read these lock-free only as a guess; the release
         * store of state below publishes them, and matches are re-checked
         * under the lock */
        WRITE_ONCE(s->h1, h1);
        WRITE_ONCE(s->h2, h2);
        WRITE_ONCE(s->key_len, key_len);
        s->q_head = s->q_tail = 0;
        s->count = 0;
        s->waiters = 0;
        s->gen++;
        /* release: lock-free lookups that see LIVE also see the hash above */
        smp_store_release(&s->state, RDV_SLOT_LIVE);
        if (d > h->kslots[home].max_probe)
            /* release: pairs with the acquire in rdv_index_find; the slot is
             * LIVE before lookups are told to scan this far */
            smp_store_release(&h->kslots[home].max_probe, (uint32_t)d);
        *idx = (uint32_t)i;
        return 0;
    }
    return -ENOSPC;
}

/* Find the key's slot, inserting it if create; returns with the slot locked. */
int rdv_index_acquire(rdv_t *h, const char *key, uint32_t key_len, int create, uint32_t *idx) {
    uint64_t h1, h2;
    rdv_hash_key(h, key, key_len, &h1, &h2);
    for (;;) {
        uint32_t i;
        int rc = rdv_index_find(h, h1, h2, key_len, &i);
        if (rc == -ENOENT) {
            if (!create)
                return rc;
            struct rdv_slot *khome = &h->kslots[h1 & h->slot_mask];
            rdv_lock(h, &khome->ins_lock);
            rc = rdv_index_find(h, h1, h2, key_len, &i);
            if (rc == -ENOENT) {
                rc = insert(h, h1, h2, key_len, idx);
                rdv_unlock(&khome->ins_lock);
                return rc;
            }
            rdv_unlock(&khome->ins_lock);
        }
        struct rdv_slot *s = &h->kslots[i];
        rdv_lock(h, &s->lock);
        if (s->state == RDV_SLOT_LIVE && s->h1 == h1 && s->h2 == h2 && s->key_len == key_len) {
            *idx = i;
            return 0;
        }
        rdv_unlock(&s->lock); /* deleted or reused since the lookup */
    }
}

void rdv_index_release(rdv_t *h, uint32_t idx) {
    rdv_unlock(&h->kslots[idx].lock);
}

/* With the slot locked: turn it into a tombstone if nothing needs it. */
void rdv_index_maybe_delete(rdv_t *h, uint32_t idx) {
    struct rdv_slot *s = &h->kslots[idx];
    if (s->count == 0 && s->waiters == 0) {
        s->gen++;
        /* relaxed: lookups that still see LIVE re-check under the lock */
        WRITE_ONCE(s->state, RDV_SLOT_TOMB);
    }
}
