/* Layer 0: the shared-memory layout of one rendezvous segment. Everything
 * here lives in shared memory, is versioned by RDV_LAYOUT_VERSION and pinned
 * by _Static_asserts. Types and inline helpers only: no code that calls out.
 *
 *   [ header: 2 pages ][ process table ][ key index: slots x 64 B ]
 *   [ side table: u32 per granule ][ arena ][ home slabs: one per process entry ]
 *
 * The arena is a heap of variable-size blocks (rdv_arena.c): the side table
 * is the map of which granules start a block, free or busy. */
#ifndef RDV_LAYOUT_H
#define RDV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "rdv_atomic.h"
#include "shmrdv.h"

#define RDV_MAGIC 0x31564452524d4853ULL /* "SHMRRDV1" little-endian */
#define RDV_PAGE 4096u
#define RDV_HEADER_BYTES (2 * RDV_PAGE)
#define RDV_LINE 64u
#define RDV_GRANULE 64u /* arena allocation unit and payload alignment */
#define RDV_GRANULE_BITS 30 /* a granule index or block length fits 30 bits */
#define RDV_MAX_ARENA ((uint64_t)RDV_MAX_ARENA_BYTES) /* shmrdv.h; granule indexes fit RDV_GRANULE_BITS */
/* The most allocation numbers a handle reserves from the segment at once:
 * one atomic add on the arena's first line, which the other side of a
 * round trip uses too, for up to RDV_SEQ_BATCH blocks instead of one each
 * (rdv_arena.c's next_seq). */
#define RDV_SEQ_BATCH 256u
#define RDV_SEQ_LEFT_BITS 9 /* rdv_t.seq_word: numbers left in the range, below RDV_SEQ_BATCH */
#define RDV_MIN_BLOCK 4u /* granules: a free block holds its start tag, two links, its end tag */
/* RDV_MAX_PROCS (shmrdv.h): processes attached at once (handles, really) */
#define RDV_PROC_SPARE 43 /* words of a process entry kept for later use */
#define RDV_HOLD_SLOTS 8 /* threads of a process whose lock holds are counted without a locked add */

/* Segregated free lists (two-level, TLSF-style): first level by the top set
 * bit of a block's length in granules, second level by the next
 * RDV_SL_BITS bits; lengths below RDV_SL_COUNT map exactly. */
#define RDV_SL_BITS 4
#define RDV_SL_COUNT (1u << RDV_SL_BITS)
#define RDV_FL_COUNT (RDV_GRANULE_BITS - RDV_SL_BITS + 1)

/* ---- header --------------------------------------------------------------- */

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

/* The arena's allocator state. Everything but the space futex words is
 * written only under lock (an rdv_lock.c lock word), and all of it but the
 * side table's start tags is derived: a holder that dies mid-step leaves it
 * to rdv_arena_repair, which rebuilds it from the start tags. */
struct rdv_arena_ctl {
    uint32_t lock;        /* rdv_lock word: holder's entry + 1 */
    uint32_t cursor;      /* granule where the ring's next block goes (next fit) */
    /* Allocation numbers handed out or reserved so far (the upper bits of
     * block positions): a handle reserves a range and gives its blocks
     * the numbers of it in turn (rdv_arena.c's next_seq). */
    uint64_t alloc_seq;
    uint64_t live_bytes;  /* in busy blocks */
    uint64_t free_bytes;  /* in free blocks */
    uint64_t live_blocks;
    uint32_t fl_bitmap;   /* bit f: some list of first level f is not empty */
    uint32_t pad0;
    /* The key count's running total (rdv_index.c), not the arena's: on this
     * line because a send's alloc has just pulled the line into our cache,
     * so the insert that links its message finds it there. */
    int64_t keys_approx;
    uint8_t pad0b[RDV_LINE - 56];
    /* line 1: producers waiting for space sleep on space_seq; every free
     * bumps it (rdv_wait.c's event count) */
    uint32_t space_seq;
    uint32_t space_sleepers;
    /* CPU + 1 that the last bump of space_seq ran on, 0 unknown: a hint for
     * the spin of producers waiting for space (rdv_wait.c) */
    uint32_t space_waker_cpu;
    uint32_t pad1a;
    /* Bit i: a producer of process entry i is short of space and has not
     * given up (rdv_arena.c, "the kept block"): while any bit is set, a
     * released view's block is freed, never kept. */
    uint64_t space_wanting[RDV_MAX_PROCS / 64];
    uint8_t pad1[RDV_LINE - 16 - 8 * (RDV_MAX_PROCS / 64)];
    uint32_t sl_bitmap[RDV_FL_COUNT]; /* bit s: list (f, s) is not empty */
    uint32_t heads[RDV_FL_COUNT][RDV_SL_COUNT]; /* first block of each list: granule + 1 */
    uint32_t pad2;
};

_Static_assert(offsetof(struct rdv_arena_ctl, space_seq) == RDV_LINE, "space futex on its own line");
_Static_assert(offsetof(struct rdv_arena_ctl, sl_bitmap) == 2 * RDV_LINE, "free lists");
_Static_assert(sizeof(struct rdv_arena_ctl) == 2 * RDV_LINE + 4 * RDV_FL_COUNT * (1 + RDV_SL_COUNT) + 4,
               "arena control, no hidden padding");

struct rdv_header {
    /* line 0: identity; written by the creator before magic is published */
    uint64_t magic; /* published last (release); attachers load it with acquire */
    uint32_t version; /* RDV_LAYOUT_VERSION (shmrdv.h) */
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
    /* Leased messages of dead receivers that could not go back to their key
     * (the key index was full) and were freed instead: a statistic. */
    uint32_t leases_dropped;
    uint32_t seg_flags; /* RDV_CREATE_* the creator asked for (RDV_CREATE_HUGE_PAGES, RDV_CREATE_NO_PREFAULT) */
    uint8_t pad1[RDV_LINE - 36];

    /* line 2: abort state (RDV_RUNNING/ABORTING/ABORTED) */
    uint32_t abort_state;
    uint32_t abort_reason_len;
    uint8_t pad2[RDV_LINE - 8];

    char abort_reason[RDV_REASON_MAX];

    /* Producer marks (see struct rdv_mark). */
    struct rdv_mark marks[RDV_MAX_MARKS];

    struct rdv_arena_ctl arena;

    /* How many keys are live (rdv_index.c): the exact count is the sum of
     * the process entries' key_count; arena.keys_approx is a running total,
     * never below it, that lets an insert well under max_keys skip the sum;
     * keys_lock serialises the inserts that do sum. */
    uint32_t keys_lock __attribute__((aligned(RDV_LINE))); /* rdv_lock word: holder's entry + 1 */
    uint8_t pad3[RDV_LINE - 4];
};

_Static_assert(RDV_MAX_ARENA == (1ULL << (RDV_GRANULE_BITS + 6)) - RDV_PAGE && RDV_GRANULE == 1u << 6,
               "the largest arena's granule indexes fit RDV_GRANULE_BITS");
_Static_assert(offsetof(struct rdv_header, version) == 8, "the version is where every layout had it");
_Static_assert(offsetof(struct rdv_header, hash_seed) == 1 * RDV_LINE, "line 1");
_Static_assert(offsetof(struct rdv_header, leases_dropped) == RDV_LINE + 28, "leases_dropped (tests read it)");
_Static_assert(offsetof(struct rdv_header, seg_flags) == RDV_LINE + 32, "seg_flags (tests poke it)");
_Static_assert(offsetof(struct rdv_header, abort_state) == 2 * RDV_LINE, "line 2");
_Static_assert(offsetof(struct rdv_header, abort_reason) == 3 * RDV_LINE, "reason");
_Static_assert(offsetof(struct rdv_header, marks) == 3 * RDV_LINE + RDV_REASON_MAX, "marks (tests poke them)");
_Static_assert(offsetof(struct rdv_header, arena) ==
                   3 * RDV_LINE + RDV_REASON_MAX + 32 * RDV_MAX_MARKS, "arena control (tests poke it)");
_Static_assert(offsetof(struct rdv_header, arena) % RDV_LINE == 0, "arena control is line-aligned");
_Static_assert(offsetof(struct rdv_header, keys_lock) % RDV_LINE == 0, "the key count is line-aligned");
_Static_assert(sizeof(struct rdv_header) <= RDV_HEADER_BYTES, "header fits its pages");

/* ---- process table ---------------------------------------------------------
 * One entry per attached handle. Liveness comes from the kernel, not from
 * pids: a handle holds an open-file-description write lock on byte i of the
 * segment file for entry i, which the kernel drops when the process dies
 * (whatever its pid namespace, whatever pid reuse). An entry that is ALIVE
 * while nobody holds its byte lock belongs to a dead process. */

enum { RDV_PROC_FREE = 0, RDV_PROC_ALIVE = 1, RDV_PROC_RECLAIMING = 2 };

/* The creator's byte lock: from before the file has a size until magic is
 * published, the creating handle holds an open-file-description write lock on
 * this byte, just past the process table's bytes. An attacher that finds
 * magic still 0 tells a creator still initialising (the byte is locked) from
 * one that died (nobody holds it: the kernel dropped the lock). */
#define RDV_CREATOR_LOCK_BYTE RDV_MAX_PROCS

struct rdv_proc {
    uint32_t state; /* RDV_PROC_*; ALIVE published (release) after pid/start */
    uint32_t pid;   /* for humans (shmrdv ls); liveness uses the byte lock */
    uint64_t attached_ns; /* CLOCK_REALTIME at attach, for humans */
    /* The handle's bell: an event count that a send bumps after handing a
     * message to one of this handle's async waiters (rdv_wait.c's protocol,
     * bell_sleepers its sleepers word). */
    uint32_t bell;
    uint32_t bell_sleepers;
    uint64_t pad0;
    /* Keys this entry's holders made live minus those they deleted (it may
     * go negative), and the insert or delete in progress, in one word so
     * that a death between two stores leaves nothing ambiguous:
     * RDV_KC_NET(w), and RDV_KC_SLOT(w) = slot + 1 (0: none), with
     * RDV_KC_DELETE set for a delete. Kept across reuse of the entry. */
    uint64_t key_count;
    uint32_t spare_a[6];
    /* Lock words naming this entry that its holders hold or are about to
     * take (rdv_lock.c), with thread_holds below: their sum is never 0
     * while one of them legitimately names it, so a lock word that names a
     * live entry holding nothing is damage. On a line of its own from the
     * bell's, which other processes write. */
    uint32_t locks_held;
    uint32_t pad1;
    /* The kept block (rdv_arena.c): the position + 1 of the block this
     * handle keeps for its next send, or 0, written by its threads with
     * atomic exchanges and cleared by a producer that took the block; and
     * the position + 1 this handle is giving another's kept block that it
     * takes to free, or 0, for its reclaimer to finish the free. */
    uint64_t kept_pos;
    uint64_t dropping;
    /* This entry's holds by its first RDV_HOLD_SLOTS threads, one word per
     * thread, each written by its thread alone (rdv_lock.c): counted with
     * plain stores where a shared word would take a locked add. The rest,
     * and holds taken as this entry by others, are in locks_held. */
    uint32_t thread_holds[RDV_HOLD_SLOTS];
    uint32_t spare[RDV_PROC_SPARE - 11 - RDV_HOLD_SLOTS];
    /* A mark change in progress (rdv_send_commit_marked, rdv_mark_set), so
     * that whoever reclaims us after a death in the middle can roll the mark
     * back if the change did not happen. One at a time per handle
     * (rdv.mark_lock). */
    uint32_t mark_state; /* 0 none, else mark index + 1: a marked commit (or set) in progress */
    uint32_t mark_pad;
    uint64_t mark_pos;     /* the block being committed, or RDV_MARK_NO_MESSAGE */
    uint64_t mark_prev[3]; /* the mark's id, val[0], val[1] before this change */
};

/* mark_pos of a plain rdv_mark_set: no block has it, so a set in progress
 * is always rolled back. */
#define RDV_MARK_NO_MESSAGE UINT64_MAX

_Static_assert(offsetof(struct rdv_proc, bell) == 16, "bell");
_Static_assert(offsetof(struct rdv_proc, mark_state) == 44 + 4 * RDV_PROC_SPARE, "mark record");
_Static_assert(offsetof(struct rdv_proc, key_count) == 32, "key count is word-aligned");
_Static_assert(offsetof(struct rdv_proc, locks_held) == RDV_LINE, "locks_held starts line 1");
_Static_assert(offsetof(struct rdv_proc, thread_holds) + sizeof(uint32_t) * RDV_HOLD_SLOTS <= 2 * RDV_LINE,
               "the thread slots share locks_held's line");
_Static_assert(offsetof(struct rdv_proc, kept_pos) == RDV_LINE + 8, "the kept block, on our own line");

/* The entry holds no lock: its counts (locks_held and thread_holds) start
 * again at 0, for a claim (rdv_live.c) and a reclaim (rdv_lock.c's
 * rdv_lock_forget). seq_cst, release: as the stores of rdv_lock.c's
 * count_hold; pair with the loads of its holds_nothing. */
static inline void rdv_proc_clear_holds(struct rdv_proc *p) {
    smp_store_seq_cst(&p->locks_held, 0);
    for (uint32_t i = 0; i < RDV_HOLD_SLOTS; i++)
        smp_store_release(&p->thread_holds[i], 0);
}
_Static_assert(RDV_MAX_PROCS % 64 == 0, "space_wanting is whole words");

#define RDV_KC_SLOT_BITS 26 /* slot + 1 <= 2 * RDV_MAX_KEYS = 2^25 */
#define RDV_KC_DELETE (1ull << RDV_KC_SLOT_BITS)
#define RDV_KC_NET_SHIFT (RDV_KC_SLOT_BITS + 1)
#define RDV_KC_SLOT(w) ((uint32_t)((w) & (RDV_KC_DELETE - 1)))
#define RDV_KC_NET(w) ((int64_t)(w) >> RDV_KC_NET_SHIFT) /* gcc: arithmetic shift */
#define RDV_KC_WORD(net, pending) (((uint64_t)(net) << RDV_KC_NET_SHIFT) | (pending))
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
    /* A key queues either messages or waiting receivers, never both: a
     * send hands its message to the oldest waiter, a receiver that finds
     * a message takes it instead of waiting. */
    uint32_t q_head;    /* oldest queued message: granule index + 1, 0 = none */
    uint32_t q_tail;    /* newest queued message: granule index + 1 */
    uint32_t count;     /* queued messages */
    uint32_t waiters;   /* waiter records linked below */
    uint32_t w_head;    /* oldest waiting receiver: its record's link (granule + 1), 0 = none */
    uint32_t w_tail;    /* newest waiting receiver */
};

_Static_assert(sizeof(struct rdv_slot) == RDV_LINE, "one slot per cache line");
_Static_assert(offsetof(struct rdv_slot, h1) == 16, "slot hash");
_Static_assert(offsetof(struct rdv_slot, w_head) == 56, "slot waiter queue");

/* ---- message block (in the arena, at a granule boundary) ------------------
 *   [ rdv_msg ][ shape[ndim] ][ strides[ndim] ][ key ][ pad ][ pos ][ payload ]
 * The u64 just before the payload repeats the block position so a payload
 * pointer alone identifies its block.
 *
 * A block position is unique over the segment's life: the block's granule
 * in the low RDV_GRANULE_BITS bits, the allocation's sequence number above
 * them. So a later block at the same place is never mistaken for an older
 * one (producer marks rely on it), and the leased blocks of a dead receiver
 * can be put back in the order they were allocated. */

static inline uint64_t rdv_pos_make(uint64_t seq, uint64_t granule) {
    return seq << RDV_GRANULE_BITS | granule;
}
static inline uint64_t rdv_pos_granule(uint64_t pos) {
    return pos & ((1ULL << RDV_GRANULE_BITS) - 1);
}
static inline uint64_t rdv_pos_seq(uint64_t pos) { return pos >> RDV_GRANULE_BITS; }

struct rdv_msg {
    uint32_t next;        /* next message on the same key: granule + 1 (slot lock) */
    uint32_t key_len;
    uint64_t nbytes;      /* payload length */
    uint64_t pos;         /* this block's position (rdv_pos_make) */
    uint32_t payload_off; /* from block start; multiple of RDV_GRANULE */
    uint16_t ndim;
    uint8_t dtype_len;
    uint8_t stage;        /* RDV_MSG_*: who may hold the block (see owner) */
    uint32_t sender_cpu;  /* CPU the sender ran on: a hint for the receiver's spin */
    uint16_t owner;       /* process entry + 1 of the writer / receiver, 0 = none */
    uint16_t flags;       /* RDV_MSG_LEASED, HANDED, KEPT; written with stage, by the same holder */
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
/* flags: handed by a send to a waiting receiver that has not taken it yet.
 * Goes back to the head of its key if the receiver dies, as a leased view
 * does; the receiver's take clears it. */
#define RDV_MSG_HANDED 2u
/* flags: a DELIVERED block whose view its receiver has released, kept by
 * that receiver for its next send instead of freed (rdv_arena.c, "the kept
 * block"): no longer a view, freed like one when its owner dies or closes. */
#define RDV_MSG_KEPT 4u
/* stage of a block that holds waiter records (a slab) rather than a
 * message: owned by one handle, freed when it closes or dies. */
#define RDV_MSG_WAITERS 4

_Static_assert(sizeof(struct rdv_msg) == RDV_LINE, "message header is one line");
_Static_assert(offsetof(struct rdv_msg, pos) % 8 == 0, "a kept block's position is taken with a CAS");
_Static_assert(offsetof(struct rdv_msg, pos) == 16, "message position (tests read it)");
_Static_assert(offsetof(struct rdv_msg, dtype) == 40, "dtype offset");
_Static_assert(offsetof(struct rdv_msg, stage) == 31, "message stage (tests poke it)");
_Static_assert(offsetof(struct rdv_msg, owner) == 36, "message owner (tests poke it)");
_Static_assert(offsetof(struct rdv_msg, flags) == 38, "message flags (tests poke them)");

/* ---- waiter records (in slabs: arena blocks of stage RDV_MSG_WAITERS) ------
 * A receiver that finds its key empty links a waiter record at the tail of
 * the key's waiter queue. A send hands its message to the oldest record:
 * one compare-and-swap of the group leader's state from WAITING to
 * HANDED | the message's granule decides it against the owner's withdraw
 * (WAITING to CANCELLED) and against the sends of the group's other keys
 * (recv_any links one record per key, all naming one leader). A record is
 * linked into one slot at a time; next, prev and slot change only under
 * that slot's lock.
 *
 * A slab is RDV_SLAB_GRANULES granules: a block header, one granule of
 * slab control, then one record per granule. A record's link is its
 * granule + 1, like a message's, counted from the arena's start. Each
 * process entry has a home slab just past the arena (entry i's at granule
 * arena granules + i * RDV_SLAB_GRANULES), so a handle's first 62 waits
 * take no arena space; more come from arena blocks of stage
 * RDV_MSG_WAITERS. */

#define RDV_SLAB_GRANULES 64u
#define RDV_SLAB_FIRST 2u /* granule of a slab's first record */

enum { RDV_WAITER_FREE = 0, RDV_WAITER_WAITING = 0x40000000u, RDV_WAITER_CANCELLED = 0x80000000u,
       RDV_WAITER_HANDED = 0xC0000000u };
#define RDV_WAITER_KIND(v) ((v) & 0xC0000000u)
#define RDV_WAITER_GRANULE(v) ((v) & 0x3fffffffu)

#define RDV_WAITER_ASYNC 1u /* flags: the owner learns of a hand-off from its bell */

struct rdv_waiter {
    /* Leader only: RDV_WAITER_* (HANDED | granule of the message); a
     * blocking receiver's futex word. */
    uint32_t state;
    uint32_t sleeping; /* leader only: the receiver is (about to be) asleep on state */
    uint32_t group;    /* the leader's link (its own when alone) */
    uint32_t next;     /* waiter queue links (slot lock) */
    uint32_t prev;
    uint32_t slot;     /* slot index + 1 while linked, 0 otherwise (slot lock) */
    uint16_t owner;    /* entry + 1 of the receiving handle */
    uint16_t flags;    /* RDV_WAITER_ASYNC */
    uint32_t slab;     /* link of its slab's control granule */
    /* Leader only: the record a send handed its message through, written
     * (under that record's slot lock) before the message is DELIVERED. */
    uint32_t won;
    uint32_t sibling;   /* the group's next record, in key order; 0 at the end (owner only) */
    uint8_t pad[RDV_LINE - 40];
};

/* The second granule of a slab. */
struct rdv_slab {
    /* A hint set after a hand-off to one of the slab's async records: the
     * owner's poll looks at slabs that have it. */
    uint32_t handed;
    uint8_t pad[RDV_LINE - 4];
};

_Static_assert(sizeof(struct rdv_waiter) == RDV_LINE, "a waiter record is one granule");
_Static_assert(sizeof(struct rdv_slab) == RDV_LINE, "slab control is one granule");

/* ---- side table: one u32 per arena granule ---------------------------------
 * The first granule of every block holds its start tag: BUSY or FREE, and
 * the block's length in granules. The chain of start tags from granule 0
 * covers the arena exactly; it is the ground truth of the allocator, and
 * every allocator step changes it with one store. A free block also holds
 * its free-list links in its second and third entries (granule + 1, top
 * bits clear) and an END tag with its length in its last entry, so the
 * block after it can find it. Every other entry is 0. */
#define RDV_SIDE_BUSY 0x40000000u
#define RDV_SIDE_FREE 0x80000000u
#define RDV_SIDE_END 0xC0000000u
#define RDV_SIDE_KIND(v) ((v) & 0xC0000000u)
#define RDV_SIDE_LEN(v) ((v) & 0x3fffffffu)

#endif
