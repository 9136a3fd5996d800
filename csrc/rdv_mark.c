/* Layer 7: producer marks: records in the segment header that an idempotent producer
 * (the network bridge) changes together with a commit, so that after its
 * death it can tell exactly which of its messages were committed.
 *
 * A change is logged in the producer's own process entry, which only its
 * reclaimer acts on, after its death (holding its byte lock); readers of the
 * mark wait while the record is armed (settle):
 *   1. record the mark's old value and the block being committed, then arm
 *      the record (mark_state = index + 1);
 *   2. write the new value into the mark;
 *   3. commit the message: its stage becomes QUEUED under the slot lock;
 *   4. disarm the record.
 * A reclaimer that finds the record armed asks the block whether step 3
 * happened: a block that is still WRITING and still the dead producer's was
 * not committed, so the old value goes back; anything else (queued, half
 * linked and kept by repair, delivered, freed after delivery) was. A commit
 * that fails rolls the mark back itself and disarms before it frees the
 * block, so while the record is armed a freed block always means committed
 * (then delivered, or drained by an abort).
 * Block positions carry their allocation's number, so a later block at the
 * same place is never mistaken for ours. */
#include <errno.h>
#include <pthread.h>

#include "rdv_arena.h"
#include "rdv_atomic.h"
#include "rdv_mark.h"
#include "rdv_os.h"
#include "rdv_queue.h"

/* Whether the block at pos is one entry who - 1 is writing: the test both
 * for a block we may commit and for a commit that never came. */
static int writing_by(rdv_t *h, uint64_t pos, uint32_t who) {
    uint64_t len;
    return rdv_queue_writing(h, pos, who, &len) != NULL;
}

static void write_mark(struct rdv_mark *km, uint64_t id, uint64_t val0, uint64_t val1) {
    /* relaxed: a mark has one writer (the caller's contract); the ordering
     * against our record is made by the barriers around the calls */
    WRITE_ONCE(km->id, id);
    WRITE_ONCE(km->val[0], val0);
    WRITE_ONCE(km->val[1], val1);
}

/* Steps 1 and 2: log the change in our entry, arm it, change the mark.
 * Called with mark_lock held. */
static void begin_change(rdv_t *h, uint32_t idx, uint64_t pos, uint64_t id, uint64_t val0,
                         uint64_t val1) {
    struct rdv_proc *kme = &h->kprocs[h->me];
    struct rdv_mark *km = &h->khdr->marks[idx];
    /* relaxed: we are the mark's one writer, and our record is read only by
     * our reclaimer; the release below orders them before the arming */
    WRITE_ONCE(kme->mark_prev[0], READ_ONCE(km->id));
    WRITE_ONCE(kme->mark_prev[1], READ_ONCE(km->val[0]));
    WRITE_ONCE(kme->mark_prev[2], READ_ONCE(km->val[1]));
    WRITE_ONCE(kme->mark_pos, pos);
    /* release: publishes the record above; pairs with the acquire load of
     * mark_state in rdv_mark_recover */
    smp_store_release(&kme->mark_state, idx + 1);
    /* full barrier: the armed record lands before the mark changes, so a
     * death in between leaves a record to roll back with (a release store
     * does not keep later stores from moving above it) */
    smp_mb();
    write_mark(km, id, val0, val1);
}

/* Step 4, and the rollback of a change that did not happen. */
static void end_change(rdv_t *h, uint32_t idx, int happened) {
    struct rdv_proc *kme = &h->kprocs[h->me];
    if (!happened) /* relaxed: our own record, as in begin_change */
        write_mark(&h->khdr->marks[idx], READ_ONCE(kme->mark_prev[0]),
                   READ_ONCE(kme->mark_prev[1]), READ_ONCE(kme->mark_prev[2]));
    /* release: the commit (or the rollback) lands before the record is
     * disarmed; pairs with the acquire load in rdv_mark_recover */
    smp_store_release(&kme->mark_state, 0);
}

int rdv_mark_commit(rdv_t *h, uint64_t pos, uint32_t idx, uint64_t id, uint64_t val0,
                            uint64_t val1) {
    if (idx >= RDV_MAX_MARKS || !writing_by(h, pos, h->me + 1))
        return -EINVAL; /* a block we are not writing: nothing changes */
    pthread_mutex_lock(&h->mark_lock);
    begin_change(h, idx, pos, id, val0, val1);
    /* full barrier: the new mark lands before the commit can, so a death
     * after the commit point finds the mark already changed */
    smp_mb();
    int rc = rdv_queue_link(h, pos, NULL);
    end_change(h, idx, rc == 0);
    pthread_mutex_unlock(&h->mark_lock);
    if (rc < 0 && rc != -EINVAL) /* -EINVAL: no longer a block we are writing */
        rdv_arena_free(h, pos); /* only now: see the top of this file */
    return rc;
}

int rdv_mark_set_impl(rdv_t *h, uint32_t idx, uint64_t id, uint64_t val0, uint64_t val1) {
    if (idx >= RDV_MAX_MARKS)
        return -EINVAL;
    pthread_mutex_lock(&h->mark_lock);
    /* No message: a death before the disarm always rolls back. */
    begin_change(h, idx, RDV_MARK_NO_MESSAGE, id, val0, val1);
    end_change(h, idx, 1);
    pthread_mutex_unlock(&h->mark_lock);
    return 0;
}

/* Wait until no process is in the middle of changing mark idx, so that what
 * we read is a value a change left, not one it is making: a live writer
 * finishes in a few steps; a dead one's change is rolled back or kept by
 * whoever reclaims it, us if nobody else is. A producer restarted after a
 * death thus reads the mark its predecessor's commits really left, even
 * while another process is still reclaiming that predecessor. */
static void settle(rdv_t *h, uint32_t idx) {
    for (unsigned spins = 1;; spins++) {
        int armed = 0, dead = 0;
        for (uint32_t i = 0; i < RDV_MAX_PROCS; i++) {
            struct rdv_proc *kp = &h->kprocs[i];
            /* acquire, both: pair with the releases of FREE and of the disarm
             * (end_change, rdv_mark_recover), so a rollback that disarmed is
             * visible before we read the mark; a FREE entry changes nothing */
            if (smp_load_acquire(&kp->state) == RDV_PROC_FREE ||
                smp_load_acquire(&kp->mark_state) != idx + 1)
                continue;
            armed = 1;
            if (spins % 64 == 0) /* a syscall: not on every spin */
                dead |= !h->ops.alive(h, i);
        }
        if (!armed)
            return;
        if (dead)
            h->ops.reclaim_dead(h); /* skips any that another reclaimer holds */
        else if (spins % 64 == 0)
            rdv_yield(); /* the writer or reclaimer may be preempted on this CPU */
        else
            rdv_cpu_relax();
    }
}

int rdv_mark_get_impl(rdv_t *h, uint32_t idx, uint64_t *id, uint64_t *val0, uint64_t *val1) {
    if (idx >= RDV_MAX_MARKS)
        return -EINVAL;
    settle(h, idx);
    const struct rdv_mark *km = &h->khdr->marks[idx];
    /* relaxed: whole when its writer is idle or dead (see shmrdv.h) */
    *id = READ_ONCE(km->id);
    *val0 = READ_ONCE(km->val[0]);
    *val1 = READ_ONCE(km->val[1]);
    return 0;
}

void rdv_mark_recover(rdv_t *h, uint32_t dead) {
    struct rdv_proc *kp = &h->kprocs[dead];
    /* acquire: pairs with the release that armed the record; the dead wrote
     * nothing after, and we hold its byte lock */
    uint32_t state = smp_load_acquire(&kp->mark_state);
    if (state == 0)
        return;
    /* relaxed: the dead process's record, published by the arming */
    uint64_t pos = READ_ONCE(kp->mark_pos);
    /* (a state out of range is damage found after attach: only disarm it) */
    if (state <= RDV_MAX_MARKS && (pos == RDV_MARK_NO_MESSAGE || writing_by(h, pos, dead + 1)))
        write_mark(&h->khdr->marks[state - 1], READ_ONCE(kp->mark_prev[0]),
                   READ_ONCE(kp->mark_prev[1]), READ_ONCE(kp->mark_prev[2]));
    /* release: the rollback lands before the disarm, and the disarm before
     * our caller frees the block (a release CAS): if we die in between, the
     * next reclaimer finds the record armed and the block unchanged, and
     * decides the same */
    smp_store_release(&kp->mark_state, 0);
}
