/* Layer 0: the process-local handle that maps one segment, and the hooks
 * through which the low layers reach recovery without calling up into it.
 * Types only. */
#ifndef RDV_HANDLE_H
#define RDV_HANDLE_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "rdv_layout.h"

/* What a layer below recovery needs from above it, installed in the handle
 * by the layer that opens it (rdv_open.c) or faked by a unit test (the
 * ops-struct pattern: a primitive never calls a function above its layer).
 * Every hook may be called from any thread that holds a reference. */
struct rdv_ops {
    /* Whether the process behind process entry `entry` is alive. */
    int (*alive)(rdv_t *h, uint32_t entry);
    /* A lock waiter found lock word klock held by entry holder - 1, whose
     * process is dead: reclaim what it held (repairing and freeing klock). */
    void (*dead_holder)(rdv_t *h, uint32_t *klock, uint32_t holder);
    /* Reclaim every dead process: for waits that a dead process's
     * leftovers may be behind (space, a producer mark being changed). */
    void (*reclaim_dead)(rdv_t *h);
};

struct rdv {
    uint8_t *base;      /* segment mapping */
    size_t map_len;
    struct rdv_header *khdr;
    struct rdv_slot *kslots;
    struct rdv_proc *kprocs;
    uint32_t *kside;
    uint8_t *karena;
    uint64_t cap;       /* arena bytes */
    uint32_t granules;  /* cap / RDV_GRANULE */
    uint64_t slot_mask;
    struct rdv_ops ops;
    int64_t spin_ns;    /* adaptive spin budget before a futex sleep (racy hint) */
    uint32_t same_cpu;  /* recent deliveries whose sender ran on our CPU, one bit each */
    uint32_t space_same_cpu; /* recent space wake-ups made from our CPU, one bit each */
    int64_t refs;       /* the owner's + one per call in flight + one per live payload */
    uint32_t closed;
    struct rdv *next_retired;
    struct rdv *next_mapped, *prev_mapped; /* rdv_open.c's list of mapped handles */
    int fd;             /* the segment file, kept open: it carries our byte lock */
    uint32_t damaged;   /* its file was truncated under us (rdv_segment.c): calls fail with -EFBIG */
    uint32_t me;        /* our process entry; lock words hold me + 1 */
    /* One mark change at a time: our entry has one mark record. */
    pthread_mutex_t mark_lock;
    /* One key-count change at a time among our threads: an entry's
     * key_count records one insert or delete in progress (rdv_index.c).
     * A spin word, 1 while a thread of ours has one in progress: the
     * change is a handful of stores with no wait in it. */
    uint32_t key_count_busy;
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
    /* Our waiter records (rdv_waiter.c): the slabs we allocated and the
     * records not in use, process-local arrays of links. */
    pthread_mutex_t waiter_lock;
    uint32_t *slabs;
    uint32_t n_slabs, cap_slabs;
    uint32_t *free_waiters;
    uint32_t n_free, cap_free;
    /* One free record kept out of the pool, taken and put back with an
     * exchange and no lock (a receive's record, freed and taken again by
     * the next), or 0; and whether our home slab is set up (1 from its
     * setup until the pool is dropped), which rdv_waiter_ours trusts
     * without the lock. */
    uint32_t spare_waiter;
    uint32_t home_slab_ready;
    uint32_t any_turn; /* where the next rdv_recv_any_start begins its turn */
    /* Our producers short of space (rdv_arena_want_space): the first sets
     * our bit of arena.space_wanting, the last clears it */
    pthread_mutex_t want_lock;
    uint32_t want_count;
    /* The range of allocation numbers we hand out (rdv_arena.c): the next
     * number << RDV_SEQ_LEFT_BITS | how many are left after it (0 before
     * the first range), and the numbers we have reserved in all, which
     * sizes the next range. Process-local; our threads take numbers by
     * compare-and-swap of seq_word. */
    uint64_t seq_word;
    uint64_t seq_reserved;
    /* Cold, last: the hot fields above keep the cache lines they had. */
    uint64_t map_page;  /* the unit the mapping is cut in: RDV_PAGE, or a hugetlbfs file's huge page */
};

#endif
