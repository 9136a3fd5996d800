/* Layer 2: the process table's entries and their liveness (see rdv_live.h). */
#include <errno.h>
#include <string.h>

#include "rdv_atomic.h"
#include "rdv_live.h"
#include "rdv_os.h"

int rdv_live_held_elsewhere(rdv_t *h, uint32_t entry) {
    return rdv_byte_locked_by_other(h->fd, entry);
}

int rdv_live_take(rdv_t *h, uint32_t entry) {
    /* acquire, process-local: pairs with the release in rdv_live_give_back,
     * so what the previous thread of ours did for the entry happens before us */
    if (rdv_exchange(&h->reclaiming[entry], 1, __ATOMIC_ACQUIRE))
        return -EBUSY;
    if (rdv_byte_lock(h->fd, entry) == 0)
        return 0;
    smp_store_release(&h->reclaiming[entry], 0); /* as in rdv_live_give_back */
    return -EBUSY;
}

void rdv_live_give_back(rdv_t *h, uint32_t entry) {
    rdv_byte_unlock(h->fd, entry);
    /* release, process-local: our work on the entry happens before the next
     * thread of ours that claims it */
    smp_store_release(&h->reclaiming[entry], 0);
}

int rdv_live_alive(rdv_t *h, uint32_t entry) {
    /* relaxed, process-local: a thread of ours acting for the entry (a dead
     * one being reclaimed) is as good as its process for lock waiters */
    return entry == h->me ||
           (entry < RDV_MAX_PROCS && READ_ONCE(h->reclaiming[entry])) ||
           rdv_live_held_elsewhere(h, entry);
}

int rdv_live_claim(rdv_t *h) {
    for (uint32_t i = 0; i < RDV_MAX_PROCS; i++) {
        struct rdv_proc *p = &h->kprocs[i];
        /* acquire: pairs with the release of FREE in rdv_live_release/recovery */
        if (smp_load_acquire(&p->state) != RDV_PROC_FREE || rdv_byte_lock(h->fd, i) < 0)
            continue;
        /* The byte lock makes the entry ours alone; re-check under it. */
        if (smp_load_acquire(&p->state) != RDV_PROC_FREE) {
            rdv_byte_unlock(h->fd, i);
            continue;
        }
        p->pid = (uint32_t)rdv_pid();
        p->attached_ns = rdv_wall_ns();
        p->bell_sleepers = 0; /* a sleeper that died asleep leaves it high */
        /* so does a holder that died (rdv_lock.c); published with the
         * entry by the release of ALIVE below, which holds_nothing acquires */
        rdv_proc_clear_holds(p);
        p->mark_state = 0; /* zero already, unless damaged: no change of ours in flight */
        h->me = i;
        /* release: publishes pid and the cleared words to readers of state */
        smp_store_release(&p->state, RDV_PROC_ALIVE);
        return 0;
    }
    return -EUSERS;
}

void rdv_live_release(rdv_t *h) {
    /* release: our last accesses through the entry happen before reuse */
    smp_store_release(&h->kprocs[h->me].state, RDV_PROC_FREE);
    rdv_byte_unlock(h->fd, h->me);
}
