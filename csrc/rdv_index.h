/* Layer 4: the key index, an open-addressing table of key slots, each with
 * its own lock word (rdv_lock.h). */
#ifndef RDV_INDEX_H
#define RDV_INDEX_H

#include <stdint.h>

#include "rdv_handle.h"

void rdv_hash_key(const rdv_t *h, const char *key, uint32_t len, uint64_t *h1, uint64_t *h2);
/* A lock-free lookup: the slot that held the key when looked at. */
int rdv_index_find(rdv_t *h, uint64_t h1, uint64_t h2, uint32_t key_len, uint32_t *idx);
/* What rdv_index_acquire does with an absent key. */
enum {
    RDV_INDEX_FIND = 0,    /* -ENOENT */
    RDV_INDEX_CREATE = 1,  /* insert it, unless max_keys are live (-ENOSPC) */
    RDV_INDEX_RESTORE = 2, /* insert it even past max_keys, for a message
                            * going back to its key (it was there before):
                            * -ENOSPC only when no slot is free */
};
/* Find the key's slot, inserting it as create says; returns with the slot
 * locked. -ENOENT (not found, RDV_INDEX_FIND) or -ENOSPC. */
int rdv_index_acquire(rdv_t *h, const char *key, uint32_t key_len, int create, uint32_t *idx);
/* rdv_index_acquire of a key already hashed (rdv_hash_key). */
int rdv_index_acquire_hashed(rdv_t *h, uint64_t h1, uint64_t h2, uint32_t key_len, int create,
                             uint32_t *idx);
/* Start fetching, for writing, the line of the home slot of a key of hash h1
 * (where most keys live): a send calls it before it writes its message, so
 * that the line, which the receiver that lined up there wrote last, comes
 * over meanwhile instead of after (about 100 ns of a 1.1 us round trip
 * between two CPUs). A hint: it reads and writes nothing. */
static inline void rdv_index_warm(const rdv_t *h, uint64_t h1) {
    __builtin_prefetch(&h->kslots[h1 & h->slot_mask], 1);
}
void rdv_index_release(rdv_t *h, uint32_t idx);
/* With the slot locked: turn it into a tombstone if nothing needs it. */
void rdv_index_maybe_delete(rdv_t *h, uint32_t idx);
/* A reclaimer holding slot idx's lock as dead: finish or undo the count of
 * an insert or delete dead was making there (before anything else changes
 * the slot). */
void rdv_index_count_repair(rdv_t *h, uint32_t dead, uint32_t idx);
/* How many keys are live: the sum of every entry's count. */
int64_t rdv_index_live_keys(rdv_t *h);

#endif
