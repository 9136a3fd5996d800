/* Layer 8: reclaiming what dead processes held. A reclaimer takes the dead
 * entry's byte lock (so its own death mid-way is as visible as the first
 * one was) and acts under the dead entry's identity while it repairs, in
 * this order:
 *   1. locks the dead process held: the arena's (its free lists rebuilt
 *      from the side table), the key count's, slot locks (the key count's
 *      change in progress there finished or undone, then the slot's queue
 *      rebuilt from the blocks themselves, keeping every QUEUED message: a
 *      message whose send had linked it survives, one it was still writing
 *      is dropped), ins_locks;
 *   2. a producer-mark change it was making: rolled back unless its commit
 *      happened (rdv_mark.c);
 *   3. its waiter records: unlinked from every key they wait on;
 *   4. views it took with rdv_recv_leased, and messages handed to it that
 *      it had not taken, go back to the head of their keys (rdv_lease.c),
 *      or to the keys' oldest waiters;
 *   5. its other blocks: views it held (DELIVERED), blocks it was writing
 *      (WRITING) and its waiter slabs are freed.
 * Then every receiver that was handed a message is woken once more: a
 * sender that died between deciding a hand-off and its wake leaves its
 * receiver asleep. */
#include <errno.h>

#include "rdv_arena.h"
#include "rdv_atomic.h"
#include "rdv_index.h"
#include "rdv_lease.h"
#include "rdv_live.h"
#include "rdv_lock.h"
#include "rdv_mark.h"
#include "rdv_queue.h"
#include "rdv_recover.h"
#include "rdv_segment.h"
#include "rdv_wait.h"
#include "rdv_waiter.h"

/* Step 1: repair, then let go. Inserts hold ins_lock around a slot lock, so
 * slots come before ins_locks; the arena comes first, because the slot
 * repairs walk its blocks. */
static void reclaim_locks(rdv_t *h, uint32_t dead) {
    uint32_t who = dead + 1;
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    /* relaxed, here and below: a lock naming the dead changes only through
     * us (we act as it) */
    if (READ_ONCE(ka->lock) == who) {
        rdv_arena_repair(h);
        rdv_unlock(h, &ka->lock);
    }
    /* Held only to sum the key count: nothing to repair (the count words
     * are, with their slots, below). */
    if (READ_ONCE(h->khdr->keys_lock) == who)
        rdv_unlock(h, &h->khdr->keys_lock);
    for (uint64_t i = 0; i <= h->slot_mask; i++) {
        struct rdv_slot *s = &h->kslots[i];
        if (READ_ONCE(s->lock) == who) {
            /* First, while the slot is as the dead left it. */
            rdv_index_count_repair(h, dead, (uint32_t)i);
            /* also serves its waiters, under the lock: if we die first, the
             * lock still names the dead and the next repair does it again */
            rdv_queue_repair(h, (uint32_t)i, dead);
            rdv_index_maybe_delete(h, (uint32_t)i);
            rdv_unlock(h, &s->lock);
        }
    }
    for (uint64_t i = 0; i <= h->slot_mask; i++) {
        uint32_t expected = who;
        /* release: as rdv_unlock */
        rdv_cas(&h->kslots[i].ins_lock, &expected, 0, __ATOMIC_RELEASE);
    }
}

/* Step 3: a record of the dead is unlinked by rebuilding its slot's
 * waiter queue without the dead's records (a rebuild, not an unlink: the
 * dead may have been in the middle of linking or unlinking it). */
static void reclaim_waiters(rdv_t *h, uint32_t dead) {
    uint32_t who = dead + 1, g = 0, first, last;
    while (rdv_waiter_slab_next(h, who, &g, &first, &last))
        for (uint32_t link = first; link <= last; link++) {
            struct rdv_waiter *w = rdv_waiter_at(h, link);
            /* acquire: pairs with the release of 0 in rdv_waiter_unlink, so
             * a hand-off that unlinked it is seen whole by the lease step */
            uint32_t slot = smp_load_acquire(&w->slot), idx = slot - 1;
            if (slot == 0 || idx > h->slot_mask)
                continue;
            struct rdv_slot *s = &h->kslots[idx];
            rdv_lock_as(h, &s->lock, who);
            if (w->slot == idx + 1)
                rdv_waiter_rebuild(h, idx, who);
            rdv_index_maybe_delete(h, idx);
            rdv_unlock(h, &s->lock);
        }
}

/* After reclaiming: wake every receiver a send handed a message to that
 * has not taken it (a spare wake for most; see the top). */
static void wake_handed(rdv_t *h) {
    /* Wakes only: a record of a live process may be freed under us, so
     * nothing is stored in one. Every bell is rung (an async poll that finds
     * no hint then looks at all its records); a blocking receiver handed a
     * message gets a futex wake. */
    for (uint32_t i = 0; i < RDV_MAX_PROCS; i++)
        /* relaxed: a first look; a spare wake is harmless */
        if (READ_ONCE(h->kprocs[i].state) == RDV_PROC_ALIVE)
            rdv_wake_all(&h->kprocs[i].bell, &h->kprocs[i].bell_sleepers);
    uint32_t g = 0, first, last;
    while (rdv_waiter_slab_next(h, 0, &g, &first, &last))
        for (uint32_t link = first; link <= last; link++) {
            struct rdv_waiter *w = rdv_waiter_at(h, link);
            /* relaxed: a wake is a hint; receivers re-read their state */
            if (w->group == link && RDV_WAITER_KIND(READ_ONCE(w->state)) == RDV_WAITER_HANDED)
                rdv_wake_sleepers(&w->state, &w->sleeping);
        }
}

static void reclaim_entry(rdv_t *h, uint32_t dead) {
    uint32_t who = dead + 1;
    reclaim_locks(h, dead);
    /* Decided from the block it was committing, so only now that repair has
     * kept (QUEUED) or dropped (still WRITING) a message it was linking,
     * and before step 5 frees its WRITING blocks. */
    rdv_mark_recover(h, dead);
    reclaim_waiters(h, dead);
    rdv_lease_recover(h, dead);
    rdv_arena_forget_wants(h, dead); /* its bit among producers short of space; its kept block: step 5 */
    /* Step 5: nobody else changes the dead's blocks (but for its kept
     * block, below), so the lock-free walk sees every one of them. */
    struct rdv_msg *m;
    for (uint32_t g = 0; (m = rdv_arena_next(h, &g)); rdv_arena_step(h, &g)) {
        /* Owner checked again under the lock: a producer short of space may
         * take the dead's kept block meanwhile and free it (rdv_arena.c). */
        uint64_t pos = READ_ONCE(m->pos);
        if (m->owner == who && (m->stage == RDV_MSG_WRITING || m->stage == RDV_MSG_DELIVERED ||
                                m->stage == RDV_MSG_WAITERS))
            rdv_arena_free_owned(h, pos, who);
    }
    rdv_waiter_home_reset(h, who);
}

void rdv_recover_own(rdv_t *h) { reclaim_entry(h, h->me); }

int rdv_recover_dead(rdv_t *h, uint32_t *reclaimed) {
    uint32_t n = 0;
    if (reclaimed)
        *reclaimed = 0;
    /* Every look for the dead (attach, gc, a waiter's tick, a stuck lock)
     * also looks for a truncation, which ends this handle's waits and fails
     * its calls. The reclaim goes on all the same: it frees the locks the
     * dead held, repaired, for processes that have not seen the cut yet
     * (past it, it reads zeros: every walk here is bounded). */
    int intact = rdv_segment_check(h);
    for (uint32_t i = 0; i < RDV_MAX_PROCS; i++) {
        struct rdv_proc *p = &h->kprocs[i];
        /* relaxed: a first look; the byte lock below decides */
        if ((i == h->me && !h->acting) || READ_ONCE(p->state) == RDV_PROC_FREE ||
            rdv_live_held_elsewhere(h, i))
            continue;
        if (rdv_live_take(h, i) < 0)
            continue; /* somebody registered or is reclaiming it right now */
        /* acquire: pairs with the release of ALIVE/FREE */
        uint32_t st = smp_load_acquire(&p->state);
        if (st != RDV_PROC_FREE) {
            uint32_t r = rdv_fetch_add(&h->reaped, 1, __ATOMIC_RELAXED); /* process-local */
            if (r < 16)
                h->reaped_pids[r] = READ_ONCE(p->pid);
            WRITE_ONCE(p->state, RDV_PROC_RECLAIMING); /* for shmrdv ls */
            if (h->acting)
                h->me = i; /* no entry of our own yet: its steps are recorded as its */
            reclaim_entry(h, i);
            rdv_lock_forget(h, i); /* every lock naming it is free now */
            /* release: the repairs above happen before the entry is reused */
            smp_store_release(&p->state, RDV_PROC_FREE);
            n++;
        }
        rdv_live_give_back(h, i);
    }
    if (n) {
        wake_handed(h);
        /* and every producer waiting for space: a dead process may have
         * freed space and died before its wake-up (or held what was just
         * freed); a spare wake for the others */
        rdv_wake_all(&h->khdr->arena.space_seq, &h->khdr->arena.space_sleepers);
    }
    if (reclaimed)
        *reclaimed = n;
    return intact;
}

void rdv_recover_reclaim_hook(rdv_t *h) { rdv_recover_dead(h, NULL); }

void rdv_recover_dead_holder(rdv_t *h, uint32_t *klock, uint32_t holder) {
    uint32_t entry = holder - 1;
    rdv_recover_dead(h, NULL);
    /* A lock naming a FREE entry (damage, or a holder reclaimed without its
     * locks being found) is repaired on its own, under that entry's byte lock. */
    if (READ_ONCE(*klock) == holder && rdv_live_take(h, entry) == 0) { /* relaxed: re-checked */
        /* acquire: pairs with the release of FREE */
        if (smp_load_acquire(&h->kprocs[entry].state) == RDV_PROC_FREE)
            reclaim_locks(h, entry);
        rdv_live_give_back(h, entry);
    }
}
