/* Layer 4: the payload arena, a heap of variable-size blocks with the ring's
 * costs where traffic is a stream (see rdv_arena.c). */
#ifndef RDV_ARENA_H
#define RDV_ARENA_H

#include <stdint.h>

#include "rdv_atomic.h"
#include "rdv_handle.h"

/* The creator's first step: the whole arena one free block. */
void rdv_arena_init(rdv_t *h);
/* A block of at least nbytes whose header already names us (pos, stage
 * WRITING, owner), at *pos. -EMSGSIZE: larger than the arena can ever hold;
 * -ENOSPC: no free run that large right now (frees bump space_seq). */
int rdv_arena_alloc(rdv_t *h, uint64_t nbytes, uint64_t *pos);
/* Blocks of nbytes[0], nbytes[1], ... in order, for as many as there is
 * room for now, under one hold of the arena's lock (a run of sends: one
 * lock round trip, and one barrier, instead of one per block): how many,
 * each as rdv_arena_alloc makes it, at pos[]. Never waits; a size the
 * arena can never hold ends the run there too. */
uint32_t rdv_arena_alloc_run(rdv_t *h, const uint64_t *nbytes, uint32_t n, uint64_t *pos);
/* Free the busy block at pos; -EINVAL if pos names no busy block (freed
 * already, or never allocated). Wakes producers waiting for space. */
int rdv_arena_free(rdv_t *h, uint64_t pos);
/* rdv_arena_free if the block is owned by who (process entry + 1), checked
 * under the lock: for a reclaimer freeing the dead's blocks, which a
 * producer short of space may take meanwhile (see "the kept block"). */
int rdv_arena_free_owned(rdv_t *h, uint64_t pos, uint32_t who);
/* A received view's block, released by its receiver (us): kept for our
 * next allocation (see "the kept block" in rdv_arena.c) or freed. -EINVAL
 * as rdv_arena_free, and for a block kept already. */
int rdv_arena_release(rdv_t *h, uint64_t pos);
/* Free the block process entry `entry` keeps, if any: 1 if it freed one.
 * For a producer short of space. */
int rdv_arena_drop_kept(rdv_t *h, uint32_t entry);
/* A producer that found no space counts itself (want = 1) until it has
 * room or gives up (want = 0): while any does, released views' blocks are
 * freed, not kept. After counting itself it must try once more before it
 * waits. rdv_arena_forget_wants: a dead, closing or newly claimed entry's
 * bit and kept_pos cleared (its kept block is a block it owns, which its
 * reclaim or close frees with its views). */
void rdv_arena_want_space(rdv_t *h, int want);
void rdv_arena_forget_wants(rdv_t *h, uint32_t entry);
/* The longest run of free and kept blocks, in bytes: the largest block a
 * producer finds once it has freed the kept ones. A lock-free snapshot. */
uint64_t rdv_arena_largest_run(rdv_t *h);
/* Rebuild the allocator's derived state from the side table's start tags:
 * called by a reclaimer holding ctl.lock as the dead process that held it. */
void rdv_arena_repair(rdv_t *h);

/* Every read of a message block from shared memory goes through these: the
 * block at pos (or at queue link g, a granule + 1), if it is busy, names
 * itself and has a payload offset inside it; NULL otherwise. *len is the
 * block's length in bytes. */
struct rdv_msg *rdv_block_at(rdv_t *h, uint64_t pos, uint64_t *len);
struct rdv_msg *rdv_queued_msg(rdv_t *h, uint32_t g, uint64_t *len);
/* The next busy block at granule *g or after it that names itself; *g is
 * left on it (the caller steps past it with rdv_arena_step). NULL at the
 * end. Lock-free: a block that stays busy throughout is never missed. */
struct rdv_msg *rdv_arena_next(rdv_t *h, uint32_t *g);
void rdv_arena_step(rdv_t *h, uint32_t *g);

/* Bytes in busy blocks, free bytes, the largest free block, busy blocks:
 * a consistent snapshot (taken under the lock). */
void rdv_arena_usage(rdv_t *h, uint64_t *live_bytes, uint64_t *free_bytes, uint64_t *largest_free,
                     uint64_t *live_blocks);

static inline uint32_t rdv_link_of(uint64_t pos) { return (uint32_t)rdv_pos_granule(pos) + 1; }
/* Whether m is a kept block (see "the kept block" in rdv_arena.c). relaxed:
 * a look at a header its holder may be changing; callers that act on it
 * decide with a CAS or under the lock */
static inline int rdv_msg_kept(const struct rdv_msg *m) {
    return READ_ONCE(m->stage) == RDV_MSG_DELIVERED && (READ_ONCE(m->flags) & RDV_MSG_KEPT);
}
static inline struct rdv_msg *rdv_msg_at(const rdv_t *h, uint64_t pos) {
    return (struct rdv_msg *)(h->karena + rdv_pos_granule(pos) * RDV_GRANULE);
}

#endif
