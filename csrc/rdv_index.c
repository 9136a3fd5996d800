/* Layer 4: the key index: an open-addressing table of key slots in shared memory.
 *
 * Lookups are lock-free reads of (state, hash, length) along a probe run
 * bounded by the home slot's max_probe. Everything that changes a slot goes
 * through its own lock word, taken by compare-and-swap and held for a handful
 * of stores (never across a wait or a copy). Inserting a new key also takes
 * the home slot's ins_lock so that two processes cannot insert the same key
 * twice; deleting needs only the slot's own lock. A slot is deleted (made a
 * tombstone, reusable by later inserts) once it holds no messages and no
 * waiters, so keys that carry a step number do not fill the table.
 *
 * At most max_keys keys are live at once. Each insert and delete is counted
 * in the process entry of the slot lock's holder (key_count: its net count
 * and the change in progress, one word, one change at a time among the
 * handle's threads: key_count_busy),
 * so a reclaimer knows from that word and the slot's state alone whether a
 * dead holder's change happened (rdv_index_count_repair). The exact count is
 * the sum over all entries. keys_approx, a running total updated after an
 * insert's word and after a delete's state, is never below the count of
 * admitted keys (a death between the two stores leaves it higher): an insert
 * that finds it under max_keys is admitted without summing, and only one that
 * does not sums, under keys_lock. */
#include <errno.h>
#include <string.h>

#include "rdv_atomic.h"
#include "rdv_index.h"
#include "rdv_lock.h"
#include "rdv_os.h"

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

/* The n < 8 bytes at p, little-endian, zero-extended: what a memcpy into
 * a zeroed word gives, without one (its call, and the store forwarding
 * that fails when a word is read back from byte stores, cost more than
 * the rest of a short key's hash). Overlapping loads OR in equal bytes. */
static inline uint64_t tail_word(const char *p, uint32_t n) {
    if (n >= 4) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + n - 4, 4);
        return lo | (uint64_t)hi << (8 * (n - 4));
    }
    if (n >= 2) {
        uint16_t lo, hi;
        memcpy(&lo, p, 2);
        memcpy(&hi, p + n - 2, 2);
        return lo | (uint64_t)hi << (8 * (n - 2));
    }
    return n ? (uint8_t)p[0] : 0;
}

static uint64_t hash_start(uint64_t seed, uint32_t len) {
    return mix64(seed ^ ((uint64_t)len * 0x9e3779b97f4a7c15ULL));
}

static uint64_t hash_word(uint64_t acc, uint64_t w) {
    return mix64(acc ^ w) * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
}

void rdv_hash_key(const rdv_t *h, const char *key, uint32_t len, uint64_t *h1, uint64_t *h2) {
    /* Both hashes in one pass: their chains of multiplies overlap. */
    uint64_t a1 = hash_start(h->khdr->hash_seed[0], len), a2 = hash_start(h->khdr->hash_seed[1], len);
    uint32_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, key + i, 8);
        a1 = hash_word(a1, w);
        a2 = hash_word(a2, w);
    }
    uint64_t last = tail_word(key + i, len - i) ^ ((uint64_t)(len - i) << 56);
    *h1 = mix64(a1 ^ last);
    *h2 = mix64(a2 ^ last);
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
    uint64_t max_probe = smp_load_acquire(&h->kslots[home].max_probe);
    if (max_probe > h->slot_mask)
        max_probe = h->slot_mask; /* damage: a run longer than the table */
    for (uint64_t d = 0; d <= max_probe; d++) {
        uint64_t i = (home + d) & h->slot_mask;
        if (slot_matches(&h->kslots[i], h1, h2, key_len)) {
            *idx = (uint32_t)i;
            return 0;
        }
    }
    return -ENOENT;
}

/* ---- the key count ----------------------------------------------------------*/

/* The entry a change under slot idx's lock is counted in: its holder's. */
static uint64_t *count_word(rdv_t *h, uint32_t idx) {
    /* relaxed: we hold the lock, so it holds our identity (or the dead's we act as) */
    uint32_t entry = READ_ONCE(h->kslots[idx].lock) - 1;
    return &h->kprocs[entry < RDV_MAX_PROCS ? entry : h->me].key_count; /* a damaged word: ours */
}

/* Begin a change of delta keys at slot idx (its lock held): the net count
 * and the change in progress, in one store. Holds key_count_busy until
 * count_end: no waits in between, so a thread of ours that finds it taken
 * spins (yielding now and then: the holder may be preempted). */
static void count_begin(rdv_t *h, uint32_t idx, int delta) {
    uint64_t *kw = count_word(h, idx);
    for (unsigned spins = 1;; spins++) {
        uint32_t idle = 0;
        /* acquire: pairs with the release in count_end; the previous
         * change's stores to the count word are visible to us.
         * Process-local word. */
        if (READ_ONCE(h->key_count_busy) == 0 && rdv_cas(&h->key_count_busy, &idle, 1, __ATOMIC_ACQUIRE))
            break;
        rdv_cpu_relax();
        if (spins % 64 == 0)
            rdv_yield();
    }
    uint64_t w = READ_ONCE(*kw); /* relaxed: only we write it, holding key_count_busy */
    /* relaxed: read by a reclaimer only after we died (the kernel's lock
     * release orders it), and by sums that need no more than a fresh value */
    WRITE_ONCE(*kw, RDV_KC_WORD(RDV_KC_NET(w) + delta, (idx + 1) | (delta < 0 ? RDV_KC_DELETE : 0)));
}

/* The change is done (or undone, undo = -delta): clear it. */
static void count_end(rdv_t *h, uint32_t idx, int undo) {
    uint64_t *kw = count_word(h, idx);
    uint64_t w = READ_ONCE(*kw); /* relaxed: as in count_begin */
    WRITE_ONCE(*kw, RDV_KC_WORD(RDV_KC_NET(w) + undo, 0));
    smp_store_release(&h->key_count_busy, 0); /* release: our stores above before the next change's */
}

/* The sum of every entry's net count. Each is kept modulo 2^37 (an entry
 * that only makes keys others delete counts up without end), so the sum is
 * taken modulo 2^37 as well and read as signed: exact, for the true total
 * is far below 2^36. */
static int64_t count_exact(rdv_t *h) {
    uint64_t sum = 0;
    for (uint32_t i = 0; i < RDV_MAX_PROCS; i++)
        sum += READ_ONCE(h->kprocs[i].key_count) >> RDV_KC_NET_SHIFT; /* relaxed: see count_admit */
    return RDV_KC_NET(sum << RDV_KC_NET_SHIFT);
}

/* Admit the insert begun at slot idx (count_begin done), or undo it and
 * return -ENOSPC: max_keys are live. A restore is admitted past the limit. */
static int count_admit(rdv_t *h, uint32_t idx, int create) {
    int64_t limit = (int64_t)h->khdr->max_keys;
    /* acq_rel: a total that orders the inserts that skip the sum after every
     * count word already begun; pairs with itself */
    if (rdv_fetch_add(&h->khdr->arena.keys_approx, 1, __ATOMIC_ACQ_REL) < limit || create == RDV_INDEX_RESTORE)
        return 0;
    /* Near the limit: sum, one inserter at a time. Undo our count while we
     * wait for the lock (a dead holder's reclaim may change counts of ours). */
    count_end(h, idx, -1);
    rdv_lock(h, &h->khdr->keys_lock);
    count_begin(h, idx, +1);
    /* The sum holds every admitted key, ours, and the inserts in progress
     * that skipped it (each will be admitted): exactly what will be live.
     * An insert that skipped it with its add before ours is seen through the
     * release sequence of keys_approx; one after ours found our add in the
     * total, so its admission holds whatever we decide; earlier summers
     * through keys_lock. Full fence: our count word, stored again, is
     * visible before we read theirs (cheap; only near the limit). */
    smp_mb();
    int rc = count_exact(h) > limit ? -ENOSPC : 0;
    if (rc < 0) {
        count_end(h, idx, -1);
        rdv_fetch_add(&h->khdr->arena.keys_approx, -1, __ATOMIC_ACQ_REL); /* as above */
    }
    rdv_unlock(h, &h->khdr->keys_lock);
    return rc;
}

void rdv_index_count_repair(rdv_t *h, uint32_t dead, uint32_t idx) {
    uint64_t *kw = &h->kprocs[dead].key_count;
    uint64_t w = READ_ONCE(*kw); /* relaxed: the dead wrote it before it died */
    if (RDV_KC_SLOT(w) != idx + 1)
        return;
    int live = READ_ONCE(h->kslots[idx].state) == RDV_SLOT_LIVE; /* relaxed: its lock is ours */
    int undo = w & RDV_KC_DELETE ? (live ? +1 : 0) : (live ? 0 : -1);
    WRITE_ONCE(*kw, RDV_KC_WORD(RDV_KC_NET(w) + undo, 0)); /* relaxed: as in count_begin */
}

int64_t rdv_index_live_keys(rdv_t *h) { return count_exact(h); }

/* Claim a free slot for the key; called with the home's ins_lock held and
 * the key known to be absent. Returns with the new slot locked. */
static int insert(rdv_t *h, uint64_t h1, uint64_t h2, uint32_t key_len, int create, uint32_t *idx) {
    uint64_t home = h1 & h->slot_mask;
    for (uint64_t d = 0; d <= h->slot_mask; d++) {
        uint64_t i = (home + d) & h->slot_mask;
        struct rdv_slot *s = &h->kslots[i];
        if (READ_ONCE(s->state) == RDV_SLOT_LIVE) /* relaxed: re-checked under the lock */
            continue;
        rdv_lock(h, &s->lock);
        if (s->state == RDV_SLOT_LIVE) {
            rdv_unlock(h, &s->lock);
            continue;
        }
        count_begin(h, (uint32_t)i, +1);
        if (count_admit(h, (uint32_t)i, create) < 0) {
            rdv_unlock(h, &s->lock);
            return -ENOSPC;
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
        count_end(h, (uint32_t)i, 0);
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
    return rdv_index_acquire_hashed(h, h1, h2, key_len, create, idx);
}

int rdv_index_acquire_hashed(rdv_t *h, uint64_t h1, uint64_t h2, uint32_t key_len, int create,
                             uint32_t *idx) {
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
                rc = insert(h, h1, h2, key_len, create, idx);
                rdv_unlock(h, &khome->ins_lock);
                return rc;
            }
            rdv_unlock(h, &khome->ins_lock);
        }
        struct rdv_slot *s = &h->kslots[i];
        rdv_lock(h, &s->lock);
        if (s->state == RDV_SLOT_LIVE && s->h1 == h1 && s->h2 == h2 && s->key_len == key_len) {
            *idx = i;
            return 0;
        }
        rdv_unlock(h, &s->lock); /* deleted or reused since the lookup */
    }
}

void rdv_index_release(rdv_t *h, uint32_t idx) {
    rdv_unlock(h, &h->kslots[idx].lock);
}

/* With the slot locked: turn it into a tombstone if nothing needs it. */
void rdv_index_maybe_delete(rdv_t *h, uint32_t idx) {
    struct rdv_slot *s = &h->kslots[idx];
    if (s->state == RDV_SLOT_LIVE && s->count == 0 && s->waiters == 0) { /* plain: under the slot lock */
        count_begin(h, idx, -1);
        s->gen++;
        /* relaxed: lookups that still see LIVE re-check under the lock */
        WRITE_ONCE(s->state, RDV_SLOT_TOMB);
        count_end(h, idx, 0);
        /* acq_rel: as in count_admit; after the state, so a death between
         * leaves the total high, never low */
        rdv_fetch_add(&h->khdr->arena.keys_approx, -1, __ATOMIC_ACQ_REL);
    }
}
