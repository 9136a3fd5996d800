/* Layer 4: the key index, an open-addressing table of key slots, each with
 * its own lock word (rdv_lock.h). */
#ifndef RDV_INDEX_H
#define RDV_INDEX_H

#include <stdint.h>

#include "rdv_handle.h"

void rdv_hash_key(const rdv_t *h, const char *key, uint32_t len, uint64_t *h1, uint64_t *h2);
/* A lock-free lookup: the slot that held the key when looked at. */
int rdv_index_find(rdv_t *h, uint64_t h1, uint64_t h2, uint32_t key_len, uint32_t *idx);
/* Find the key's slot, inserting it if create; returns with the slot
 * locked. -ENOENT (not found, !create) or -ENOSPC (the index is full). */
int rdv_index_acquire(rdv_t *h, const char *key, uint32_t key_len, int create, uint32_t *idx);
void rdv_index_release(rdv_t *h, uint32_t idx);
/* With the slot locked: turn it into a tombstone if nothing needs it. */
void rdv_index_maybe_delete(rdv_t *h, uint32_t idx);

#endif
