/* Layer 3: lock words in shared memory. A lock word holds its holder's
 * process entry + 1 (0: free), so a waiter can find out that the holder
 * died; it then calls the handle's dead_holder hook, which reaches recovery
 * (rdv_recover.c) without this layer calling up into it. Held for a handful
 * of stores, never across a wait or a copy. Each entry counts the locks
 * its holders hold or are taking (a word per thread for a process's first
 * threads, thread_holds, and the shared locks_held for the rest), so a
 * waiter can also tell a lock word that damage set to a live entry's
 * value: that entry holds nothing, check after check, and the word is
 * freed. */
#ifndef RDV_LOCK_H
#define RDV_LOCK_H

#include <stdint.h>

#include "rdv_handle.h"

void rdv_lock(rdv_t *h, uint32_t *klock);
void rdv_unlock(rdv_t *h, uint32_t *klock);
/* Take klock as entry who - 1 (a reclaimer acting for a dead process): free,
 * or already held by who. */
void rdv_lock_as(rdv_t *h, uint32_t *klock, uint32_t who);
/* With klock held by us: make it name who instead, so that if we die from
 * here on, who's reclaimer repairs what it guards. */
void rdv_lock_hand_over(rdv_t *h, uint32_t *klock, uint32_t who);
/* A free or reclaimed entry holds no locks: its count starts again at 0. */
void rdv_lock_forget(rdv_t *h, uint32_t entry);

#endif
