/* Layer 6: the per-key FIFO queues that tie key slots to arena blocks, the
 * hand-off of messages to waiting receivers, and their repair after a lock
 * holder's death. */
#ifndef RDV_QUEUE_H
#define RDV_QUEUE_H

#include <stdint.h>

#include "rdv_handle.h"

/* How long a receiver spins for the rest of a hand-off (its sender's last
 * few stores) before it waits on the key's lock instead. */
#define RDV_HAND_OFF_SPINS 512

/* Metadata bytes before a payload; keeps room for the u64 position copy. */
uint64_t rdv_meta_bytes(uint32_t ndim, uint32_t key_len);
/* Whether message m's header names a key and dimensions that fit within
 * `room` bytes of its block (its length, or its payload offset): read from
 * shared memory, so checked before rdv_msg_key is used. */
static inline int rdv_msg_key_fits(const struct rdv_msg *m, uint64_t room) {
    return m->key_len != 0 && m->key_len <= RDV_KEY_MAX && m->ndim <= RDV_NDIM_MAX &&
           sizeof *m + 16ull * m->ndim + m->key_len <= room;
}
/* The key bytes a message block carries (checked with rdv_msg_key_fits). */
static inline const char *rdv_msg_key(const struct rdv_msg *m) {
    return (const char *)(m + 1) + 16ull * m->ndim;
}
/* Copy n 8-byte words of a descriptor (its dims, its strides). A loop, not
 * memcpy: gcc, knowing n is small, makes that memcpy a rep movsq, whose
 * start-up costs more than the few words a descriptor has (measured: two
 * thirds of do_send_begin's time, about 20 ns of a 64 B send). */
static inline void rdv_copy_words(int64_t *dst, const int64_t *src, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        dst[i] = src[i];
}
/* Whether m goes back to its key if entry who - 1 dies: a view it took with
 * rdv_recv_leased, or a message handed to it that it has not taken. Read by
 * reclaimers of that entry: nobody else changes a dead entry's blocks. */
static inline int rdv_msg_leased_by(const struct rdv_msg *m, uint32_t who) {
    return m->stage == RDV_MSG_DELIVERED && m->owner == who &&
           (m->flags & (RDV_MSG_LEASED | RDV_MSG_HANDED));
}

/* The block at pos if it is allocated, WRITING and held by entry who - 1:
 * a block its writer may commit or discard, or (after who's death) one
 * whose commit never came. NULL otherwise. */
struct rdv_msg *rdv_queue_writing(rdv_t *h, uint64_t pos, uint32_t who, uint64_t *len);
/* Link the block at pos, which we are writing, onto its key's queue: the
 * commit point of a send. -EINVAL if it is not a block we are writing (left
 * alone); on any other failure the block is left as it was, the caller's to
 * free. hash: the key's two hashes (rdv_hash_key) if the caller has them,
 * else NULL (the key in the message's header is hashed). */
int rdv_queue_link(rdv_t *h, uint64_t pos, const uint64_t *hash);
/* Blocks a run links at most, and the bytes after which a run is linked
 * (its first message waits for the rest to be written: a bound on that). */
#define RDV_LINK_RUN_MAX 64
#define RDV_LINK_RUN_BYTES (256u << 10)
/* rdv_queue_link of n blocks of one key, in order, under one hold of the
 * key's lock: what a batch of sends saves is the lock's round trip per
 * message. Every block is checked first: on failure none is linked (the
 * caller frees them, or links them one by one), -EINVAL if one is not a
 * block we are writing or the keys differ. */
int rdv_queue_link_run(rdv_t *h, const uint64_t *pos, uint32_t n, const uint64_t *hash);
/* With slot s locked and a message queued: describe it into out (bounds-
 * checking everything read from shared memory) and unlink it, delivered to
 * us (leased: it goes back to the queue if we die holding it). */
int rdv_queue_pop(rdv_t *h, struct rdv_slot *s, const char *key, uint32_t key_len, int leased,
                  struct rdv_msg_info *out);
/* With slot idx locked: hand its queued messages to its waiters, oldest to
 * oldest, while it has both. The wake of the first receiver handed one is
 * left in *later (zeroed by the caller) to make after the unlock; the
 * others (all of them when later is NULL) are woken under the lock. */
struct rdv_wake;
void rdv_queue_serve(rdv_t *h, uint32_t idx, struct rdv_wake *later);
/* Take the message a send handed us (at granule, from our leader's state):
 * describe it into out and make it our view (leased: it goes back to its
 * key if we die holding it). -EBADMSG if no such hand-off is there. */
int rdv_queue_take(rdv_t *h, uint32_t granule, int leased, struct rdv_msg_info *out);
/* Put a view of ours (DELIVERED, ours) back at the head of its key, or hand
 * it to the key's oldest waiter: a receiver that gives up after taking.
 * -EINVAL if pos is not such a view; on -ECONNABORTED and -ENOSPC it stays
 * our (leased) view, for the caller to free. */
int rdv_queue_give_back(rdv_t *h, uint64_t pos);
/* rdv_queue_give_back of n views of ours of one key, under one hold of its
 * lock, so that they end at its head in the order of pos (or are handed to
 * its waiters, oldest to oldest). -EINVAL, nothing changed, unless all are
 * such views of one key; as rdv_queue_give_back otherwise. */
int rdv_queue_give_back_many(rdv_t *h, const uint64_t *pos, uint32_t n);
/* Make a block QUEUED again (owner and flags cleared), in an order that a
 * death in the middle leaves repairable. */
void rdv_queue_requeue(struct rdv_msg *m);
/* Rebuild slot idx's queue after its lock holder `dead` died; called by its
 * reclaimer holding the lock as the dead. */
void rdv_queue_repair(rdv_t *h, uint32_t idx, uint32_t dead);
/* Free every queued message and wake every waiter, slot by slot (abort). */
void rdv_queue_drain_all(rdv_t *h);

#endif
