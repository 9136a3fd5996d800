/* The shared-memory layout of one rendezvous segment, and the process-local
 * handle that maps it. Everything in this file that lives in shared memory is
 * versioned by RDV_LAYOUT_VERSION and pinned by _Static_asserts.
 *
 *   [ header: 1 page ][ process table ][ key index: slots x 64 B ]
 *   [ side table: u32 per granule ][ arena ]
 *
 * The arena is mapped twice, back to back, so a block that runs past the end
 * of the ring continues in the mirror: no block is ever split or padded. */
#ifndef RDV_LAYOUT_H
#define RDV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <sys/types.h>

#include "shmrdv.h"

#define RDV_MAGIC 0x31564452524d4853ULL /* "SHMRRDV1" little-endian */
#define RDV_LAYOUT_VERSION 4u
#define RDV_PAGE 4096u
#define RDV_LINE 64u
#define RDV_GRANULE 64u /* arena allocation unit and payload alignment */
#define RDV_MAX_ARENA ((1ULL << 36) - RDV_PAGE) /* block lengths fit the side table */
#define RDV_MAX_ISLANDS 64
#define RDV_MAX_PROCS 128 /* processes attached at once (handles, really) */
#define RDV_PROC_WAITS 46 /* concurrent waits per handle that survive its death */

/* ---- header (page 0) ---------------------------------------------------- */

/* A producer mark: a small record an idempotent producer (the network
 * bridge) keeps beside the messages it commits, e.g. the last sequence
 * number of a remote sender. rdv_send_commit_marked changes it together with
 * a commit, so that after the producer's death either both happened or
 * neither did. Each mark has one writer at a time (the caller's contract);
 * its words are read and written relaxed: a reader that wants the triple
 * whole reads it when the writer is idle or dead. id 0: unused. */
struct rdv_mark {
    uint64_t id;
    uint64_t val[2];
    uint64_t pad;
};

_Static_assert(sizeof(struct rdv_mark) == 32, "a mark is 32 B");

enum { RDV_RUNNING = 0, RDV_ABORTING = 1, RDV_ABORTED = 2 };

struct rdv_header {
    /* line 0: identity; written by the creator before magic is published */
    uint64_t magic; /* published last (release); attachers load it with acquire */
    uint32_t version;
    uint32_t header_size;
    uint64_t total_size;
    uint64_t index_off;
    uint64_t index_slots; /* power of two */
    uint64_t side_off;
    uint64_t arena_off;
    uint64_t arena_size; /* page multiple */

    /* line 1: constants */
    uint64_t hash_seed[2];
    uint64_t max_keys;
    uint32_t creator_pid;
    uint8_t pad1[RDV_LINE - 28];

    /* line 2: producers' tail: next free ring position (free-running bytes) */
    uint64_t p_tail;
    uint8_t pad2[RDV_LINE - 8];

    /* line 3: reclaimers' head: oldest block not yet reclaimed, and the futex
     * that producers waiting for space sleep on */
    uint64_t c_head;
    uint32_t space_seq;
    uint32_t space_sleepers;
    /* CPU + 1 that the last bump of space_seq ran on, 0 unknown: a hint for
     * the spin of producers waiting for space (rdv_wait.c). A segment of a
     * version that never writes it reads 0 here: spin as before. */
    uint32_t space_waker_cpu;
    uint8_t pad3[RDV_LINE - 20];

    /* line 4: abort state (RDV_RUNNING/ABORTING/ABORTED) */
    uint32_t abort_state;
    uint32_t abort_reason_len;
    uint8_t pad4[RDV_LINE - 8];

    char abort_reason[RDV_REASON_MAX];

    /* Islands: received blocks still held by a view that the ring head has
     * stepped over so one long-held view does not stall the arena. Each is
     * one word: valid bit 63 | offset in granules << 30 | length in granules.
     * Allocators read them lock-free and skip over them; pinning and
     * releasing a pinned block take island_lock. */
    uint32_t island_lock;
    /* Leased messages of dead receivers that could not go back to their key
     * (the key index was full) and were freed instead: a statistic. */
    uint32_t leases_dropped;
    uint64_t islands[RDV_MAX_ISLANDS];

    /* Producer marks (see struct rdv_mark). */
    struct rdv_mark marks[RDV_MAX_MARKS];
};

_Static_assert(offsetof(struct rdv_header, hash_seed) == 1 * RDV_LINE, "line 1");
_Static_assert(offsetof(struct rdv_header, p_tail) == 2 * RDV_LINE, "line 2");
_Static_assert(offsetof(struct rdv_header, c_head) == 3 * RDV_LINE, "line 3");
_Static_assert(offsetof(struct rdv_header, space_waker_cpu) == 3 * RDV_LINE + 16, "in line 3's old padding");
_Static_assert(offsetof(struct rdv_header, abort_state) == 4 * RDV_LINE, "line 4");
_Static_assert(offsetof(struct rdv_header, abort_reason) == 5 * RDV_LINE, "reason");
_Static_assert(offsetof(struct rdv_header, leases_dropped) == 5 * RDV_LINE + RDV_REASON_MAX + 4,
               "leases_dropped (tests read it)");
_Static_assert(offsetof(struct rdv_header, islands) == 5 * RDV_LINE + RDV_REASON_MAX + 8, "islands");
_Static_assert(offsetof(struct rdv_header, marks) ==
                   5 * RDV_LINE + RDV_REASON_MAX + 8 + 8 * RDV_MAX_ISLANDS, "marks");
_Static_assert(offsetof(struct rdv_header, marks) % 8 == 0, "marks are word-aligned");
_Static_assert(sizeof(struct rdv_header) <= RDV_PAGE, "header fits page 0");

/* ---- process table ---------------------------------------------------------
 * One entry per attached handle. Liveness comes from the kernel, not from
 * pids: a handle holds an open-file-description write lock on byte i of the
 * segment file for entry i, which the kernel drops when the process dies
 * (whatever its pid namespace, whatever pid reuse). An entry that is ALIVE
 * while nobody holds its byte lock belongs to a dead process. */

enum { RDV_PROC_FREE = 0, RDV_PROC_ALIVE = 1, RDV_PROC_RECLAIMING = 2 };
enum { RDV_OP_NONE = 0, RDV_OP_ALLOC = 1, RDV_OP_RECLAIM = 2 };

#define RDV_WAIT_SLEEPING 0x80000000u /* in a wait record: also counted in sleepers */

struct rdv_proc {
    uint32_t state; /* RDV_PROC_*; ALIVE published (release) after pid/start */
    uint32_t pid;   /* for humans (shmrdv ls); liveness uses the byte lock */
    uint64_t attached_ns; /* CLOCK_REALTIME at attach, for humans */
    /* The arena step in progress (RDV_OP_*), so that a death between its
     * atomic steps can be finished or undone: the position and the entry
     * value (ALLOC: length in granules; RECLAIM: the FREE entry claimed).
     * One step at a time per handle (rdv.op_lock). */
    uint32_t op_kind;
    uint32_t op_val;
    uint64_t op_pos;
    /* Waits in progress: key slot index + 1, | RDV_WAIT_SLEEPING while also
     * counted in that slot's sleepers; so a dead waiter's counts come back. */
    uint32_t waits[RDV_PROC_WAITS];
    /* A mark change in progress (rdv_send_commit_marked, rdv_mark_set), so
     * that whoever reclaims us after a death in the middle can roll the mark
     * back if the change did not happen. One at a time per handle
     * (rdv.mark_lock). */
    uint32_t mark_state; /* 0 none, else mark index + 1: a marked commit (or set) in progress */
    uint32_t mark_pad;
    uint64_t mark_pos;     /* the block being committed, or RDV_MARK_NO_MESSAGE */
    uint64_t mark_prev[3]; /* the mark's id, val[0], val[1] before this change */
};

/* mark_pos of a plain rdv_mark_set: no block has it (not granule-aligned),
 * so a set in progress is always rolled back. */
#define RDV_MARK_NO_MESSAGE UINT64_MAX

_Static_assert(offsetof(struct rdv_proc, op_kind) == 16, "op record (tests poke it)");
_Static_assert(offsetof(struct rdv_proc, waits) == 32, "wait records");
_Static_assert(offsetof(struct rdv_proc, mark_state) == 32 + 4 * RDV_PROC_WAITS, "mark record");
_Static_assert(offsetof(struct rdv_proc, mark_pos) % 8 == 0, "mark record is word-aligned");
_Static_assert(sizeof(struct rdv_proc) == 4 * RDV_LINE, "process entry is 256 B");
_Static_assert(RDV_MAX_PROCS * sizeof(struct rdv_proc) % RDV_PAGE == 0, "table is whole pages");

/* ---- key index slot -------------------------------------------------------
 * A key is identified by its length and two independent 64-bit hashes; every
 * message also carries the key bytes, which the receiver compares before it
 * delivers, so a hash collision fails loudly instead of misdelivering. */

enum { RDV_SLOT_EMPTY = 0, RDV_SLOT_LIVE = 1, RDV_SLOT_TOMB = 2 };

struct rdv_slot {
    uint32_t lock;      /* 0 free, else held: guards every field below but max_probe */
    uint32_t ins_lock;  /* as a home slot: serializes inserts of keys hashed here */
    uint32_t state;     /* RDV_SLOT_*; written under lock, read lock-free by lookups */
    uint32_t gen;       /* bumped under lock when the slot changes key */
    uint64_t h1, h2;    /* key hash; written under lock before state = LIVE */
    uint32_t key_len;
    uint32_t max_probe; /* as a home slot: farthest displacement of its keys (ins_lock) */
    uint32_t q_head;    /* oldest queued message: granule index + 1, 0 = none */
    uint32_t q_tail;    /* newest queued message: granule index + 1 */
    uint32_t count;     /* queued messages */
    uint32_t waiters;   /* receivers inside rdv_recv for this key */
    uint32_t seq;       /* futex word: bumped on enqueue, abort and cancel */
    uint32_t sleepers;  /* receivers about to sleep or asleep on seq */
};

_Static_assert(sizeof(struct rdv_slot) == RDV_LINE, "one slot per cache line");
_Static_assert(offsetof(struct rdv_slot, h1) == 16, "slot hash");
_Static_assert(offsetof(struct rdv_slot, seq) == 56, "slot futex word");

/* ---- message block (in the arena, at a granule boundary) ------------------
 *   [ rdv_msg ][ shape[ndim] ][ strides[ndim] ][ key ][ pad ][ pos ][ payload ]
 * The u64 just before the payload repeats the block position so a payload
 * pointer alone identifies its block. */

struct rdv_msg {
    uint32_t next;        /* next message on the same key: granule + 1 (slot lock) */
    uint32_t key_len;
    uint64_t nbytes;      /* payload length */
    uint64_t pos;         /* ring position of this block */
    uint32_t payload_off; /* from block start; multiple of RDV_GRANULE */
    uint16_t ndim;
    uint8_t dtype_len;
    uint8_t stage;        /* RDV_MSG_*: who may hold the block (see owner) */
    uint32_t sender_cpu;  /* CPU the sender ran on: a hint for the receiver's spin */
    uint16_t owner;       /* process entry + 1 of the writer / receiver, 0 = none */
    uint16_t flags;       /* RDV_MSG_LEASED; written with stage, by the same holder */
    char dtype[RDV_DTYPE_MAX];
};

/* A block's stage, written by whoever holds it: a producer writing it
 * (owner = producer), queued on a key (owner = 0 once linked), delivered to
 * a receiver's view (owner = receiver). A dead owner's WRITING and DELIVERED
 * blocks are freed, except leased ones; QUEUED blocks survive their producer. */
enum { RDV_MSG_WRITING = 1, RDV_MSG_QUEUED = 2, RDV_MSG_DELIVERED = 3 };

/* flags: delivered by rdv_recv_leased. If its receiver dies holding it, the
 * message goes back to the head of its key's queue instead of being freed
 * (rdv_lease.c). Meaningful only while DELIVERED; cleared whenever a block
 * goes back to QUEUED. */
#define RDV_MSG_LEASED 1u

/* Whether m is a view that entry who - 1 took with rdv_recv_leased. Read by
 * reclaimers of that entry (holding its byte lock, or its slot lock as it):
 * nobody else changes a dead entry's blocks, so plain reads are enough. */
static inline int rdv_msg_leased_by(const struct rdv_msg *m, uint32_t who) {
    return m->stage == RDV_MSG_DELIVERED && m->owner == who && (m->flags & RDV_MSG_LEASED);
}

_Static_assert(sizeof(struct rdv_msg) == RDV_LINE, "message header is one line");
_Static_assert(offsetof(struct rdv_msg, dtype) == 40, "dtype offset");
_Static_assert(offsetof(struct rdv_msg, stage) == 31, "message stage (tests poke it)");
_Static_assert(offsetof(struct rdv_msg, owner) == 36, "message owner (tests poke it)");
_Static_assert(offsetof(struct rdv_msg, flags) == 38, "message flags (tests poke them)");

/* Side table entry, one per arena granule; nonzero only at the first granule
 * of a block between c_head and p_tail: length in granules, plus FREE once
 * its owner is done with it. */
#define RDV_SIDE_FREE 0x80000000u
#define RDV_SIDE_LEN(v) ((v) & 0x3fffffffu)
/* FREE with bit 30, which no block length reaches, marks an entry claimed by
 * process entry (v & 0xff) for one arena step (see rdv_arena.c). */
#define RDV_SIDE_CLAIM 0xC0000000u
#define RDV_SIDE_CLAIMED(v) (((v) & RDV_SIDE_CLAIM) == RDV_SIDE_CLAIM)
#define RDV_SIDE_CLAIMER(v) ((v) & 0xffu)
#define RDV_ISLAND_VALID (1ULL << 63)

/* An island word: valid bit | offset in granules << 30 | length in granules. */
static inline uint64_t rdv_island_word(uint64_t off_g, uint64_t len_g) {
    return RDV_ISLAND_VALID | off_g << 30 | len_g;
}
static inline uint64_t rdv_island_off(uint64_t w) { return ((w >> 30) & 0x3fffffffu) * RDV_GRANULE; }
static inline uint64_t rdv_island_len(uint64_t w) { return (w & 0x3fffffffu) * RDV_GRANULE; }

/* ---- process-local handle --------------------------------------------------*/

struct rdv {
    uint8_t *base;      /* segment mapping; the arena mirror follows it */
    size_t map_len;     /* total_size + arena_size */
    struct rdv_header *khdr;
    struct rdv_slot *kslots;
    uint32_t *kside;
    uint8_t *karena;
    uint64_t cap;       /* arena bytes */
    uint64_t slot_mask;
    int64_t spin_ns;    /* adaptive spin budget before a futex sleep (racy hint) */
    uint32_t same_cpu;  /* recent deliveries whose sender ran on our CPU, one bit each */
    uint32_t space_same_cpu; /* recent space wake-ups made from our CPU, one bit each */
    int64_t refs;       /* the owner's + one per call in flight + one per live payload */
    uint32_t closed;
    struct rdv *next_retired;
    struct rdv_proc *kprocs;
    int fd;             /* the segment file, kept open: it carries our byte lock */
    uint32_t me;        /* our process entry; lock words hold me + 1 */
    pthread_mutex_t op_lock; /* one arena step at a time: our entry has one op record */
    /* One mark change at a time: our entry has one mark record. Not op_lock:
     * a commit takes op_lock inside (freeing, reclaiming the dead). Taken
     * before op_lock, never while holding it. */
    pthread_mutex_t mark_lock;
    int acting;         /* registering into a full table: me is the dead entry being reclaimed */
    pid_t pid;          /* the process that attached: in a forked child the handle is inert */
    uint32_t reaped;    /* dead processes this handle reclaimed, and the first pids */
    uint32_t reaped_pids[16];
    /* Entries a thread of ours is reclaiming (1 each). The kernel byte locks
     * belong to our open file description, which all our threads share: they
     * keep other processes out, but neither our other threads nor a reclaim
     * nested in one of ours (a lock waiter inside a reclaim finds a dead
     * holder), which would take the byte lock again and drop it early. */
    uint8_t reclaiming[RDV_MAX_PROCS];
};

/* rdv_segment.c: references on a handle's mapping. A handle struct is never
 * freed (a few dozen bytes per closed rendezvous), so taking a reference on a
 * closed handle fails cleanly instead of touching freed memory. */
int rdv_get(rdv_t *h);
int rdv_forked(const rdv_t *h);
void rdv_put(rdv_t *h);
/* The body of a public entry point: call with a reference held. */
#define WITH_REF(h, call)                                                          \
    do {                                                                           \
        if (rdv_get(h) < 0)                                                        \
            return -EBADF;                                                         \
        int rc_ = (call);                                                          \
        rdv_put(h);                                                                \
        return rc_;                                                                \
    } while (0)

/* rdv_proc.c: registry, liveness, and reclaiming what dead processes held */
int rdv_proc_register(rdv_t *h);
void rdv_proc_unregister(rdv_t *h);
int rdv_proc_alive(rdv_t *h, uint32_t entry);
int rdv_proc_reclaim_dead(rdv_t *h, uint32_t *reclaimed);
int rdv_procs_impl(rdv_t *h, struct rdv_proc_info *out, uint32_t cap, uint32_t *n);
void rdv_lock_holder_check(rdv_t *h, uint32_t *klock, uint32_t holder);
uint32_t *rdv_wait_record(rdv_t *h, uint32_t slot_idx);
void rdv_wait_unrecord(uint32_t *krecord);
/* The next live message block at or after *pos and before end, walking the
 * side table; *pos is left on it. */
struct rdv_msg *rdv_next_block(rdv_t *h, uint64_t *pos, uint64_t end);
/* Make a block QUEUED again (owner and flags cleared), in an order that a
 * death in the middle leaves repairable: for repairs and given-back leases. */
void rdv_msg_requeue(struct rdv_msg *m);

/* rdv_index.c */
int rdv_index_find(rdv_t *h, uint64_t h1, uint64_t h2, uint32_t key_len, uint32_t *idx);
int rdv_index_acquire(rdv_t *h, const char *key, uint32_t key_len, int create, uint32_t *idx);
void rdv_index_release(rdv_t *h, uint32_t idx);
void rdv_index_maybe_delete(rdv_t *h, uint32_t idx);
void rdv_slot_lock(rdv_t *h, uint32_t *klock);
void rdv_slot_unlock(uint32_t *klock);
void rdv_hash_key(const rdv_t *h, const char *key, uint32_t len, uint64_t *h1, uint64_t *h2);

/* rdv_lease.c: give the leased views a dead entry held back to their keys
 * (or free them: abort, full index, damage). Called by its reclaimer after its
 * slot locks are repaired and before its remaining views are freed. */
void rdv_lease_recover(rdv_t *h, uint32_t dead);

/* rdv_channel.c: link the WRITING block at pos (checked by the caller to be
 * busy) onto its key's queue. On failure the block is left as it was, the
 * caller's to free. */
int rdv_channel_link(rdv_t *h, uint64_t pos);

/* rdv_mark.c: roll back or keep the mark change a dead entry was making.
 * Called by its reclaimer after its slot locks are repaired and before its
 * WRITING blocks are freed. */
void rdv_mark_recover(rdv_t *h, uint32_t dead);

/* rdv_arena.c */
/* A block at *pos whose header already names us: pos, stage WRITING, owner. */
int rdv_arena_alloc(rdv_t *h, uint64_t nbytes, uint64_t *pos);
int rdv_arena_free(rdv_t *h, uint64_t pos);
void rdv_arena_recover_op(rdv_t *h, uint32_t dead);
void rdv_arena_committed(rdv_t *h, uint64_t pos);
/* Like rdv_arena_check_busy, but also for a block that is an island. */
int rdv_arena_owned(rdv_t *h, uint64_t pos, uint64_t *len);
/* Every read of a message block from shared memory goes through these: the
 * block at pos (or at queue link g, a granule + 1), if it is allocated (in
 * the ring or an island), names itself and has a payload offset inside it;
 * NULL otherwise. *len is the block's length. */
struct rdv_msg *rdv_block_at(rdv_t *h, uint64_t pos, uint64_t *len);
struct rdv_msg *rdv_queued_msg(rdv_t *h, uint32_t g, uint64_t *len);
uint64_t rdv_arena_island_bytes(rdv_t *h);
int rdv_arena_check_busy(rdv_t *h, uint64_t pos, uint64_t *len);
static inline uint64_t rdv_granule_of(const rdv_t *h, uint64_t pos) {
    return (pos % h->cap) / RDV_GRANULE;
}
static inline struct rdv_msg *rdv_msg_at(const rdv_t *h, uint64_t pos) {
    return (struct rdv_msg *)(h->karena + pos % h->cap);
}

/* rdv_wait.c */
struct rdv_deadline {
    int forever;
    int64_t at_ns; /* CLOCK_MONOTONIC */
};
int64_t rdv_now_ns(void);
void rdv_deadline_init(struct rdv_deadline *d, int64_t timeout_ns);
int rdv_deadline_left(const struct rdv_deadline *d, int64_t *left_ns);
int rdv_wait_change(rdv_t *h, uint32_t *kword, uint32_t *ksleepers, uint32_t *krecord,
                    uint32_t seen, const struct rdv_deadline *d);
void rdv_wake_all(uint32_t *kword, uint32_t *ksleepers);
/* The two halves of rdv_wake_all, so a wake syscall can be made after the
 * slot lock is dropped: a woken receiver that preempts us (same CPU) must
 * not find the lock still held. */
void rdv_wake_bump(uint32_t *kword);
void rdv_wake_sleepers(uint32_t *kword, uint32_t *ksleepers);
int rdv_is_aborted(const rdv_t *h);

#endif
