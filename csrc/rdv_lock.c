/* Layer 3: lock words whose dead holders are found (see rdv_lock.h). */
#include "rdv_atomic.h"
#include "rdv_lock.h"
#include "rdv_os.h"

/* Spins before a lock waiter asks whether the holder is still alive. */
#define RDV_LOCK_CHECK_SPINS 4096

/* A waiter has spun a while on a lock that `holder` holds. */
static void check_holder(rdv_t *h, uint32_t *klock, uint32_t holder) {
    if (holder > RDV_MAX_PROCS) {
        uint32_t expected = holder;
        /* release: a lock word naming no entry at all is damage; free it */
        rdv_cas(klock, &expected, 0, __ATOMIC_RELEASE);
        return;
    }
    if (!h->ops.alive(h, holder - 1))
        h->ops.dead_holder(h, klock, holder);
}

/* Take klock for who; `reentrant`: a word that already names who counts as
 * ours (a reclaimer acting for the dead holder). */
static void take(rdv_t *h, uint32_t *klock, uint32_t who, int reentrant) {
    for (unsigned spins = 0;; spins++) {
        /* relaxed read first: spin on a shared line without writing to it */
        uint32_t holder = READ_ONCE(*klock);
        if (holder == 0 || (reentrant && holder == who)) {
            /* acquire: pairs with the release in rdv_unlock; the previous
             * holder's writes are visible to us. The word names its holder
             * (entry + 1) so that a dead holder can be found. */
            if (rdv_cas(klock, &holder, who, __ATOMIC_ACQUIRE))
                return;
            continue;
        }
        rdv_cpu_relax();
        if ((spins & 63) == 63)
            rdv_yield(); /* the holder may be preempted on this CPU */
        if (spins % RDV_LOCK_CHECK_SPINS == RDV_LOCK_CHECK_SPINS - 1)
            check_holder(h, klock, holder); /* a dead holder's lock is repaired */
    }
}

void rdv_lock(rdv_t *h, uint32_t *klock) { take(h, klock, h->me + 1, 0); }

void rdv_lock_as(rdv_t *h, uint32_t *klock, uint32_t who) { take(h, klock, who, 1); }

void rdv_lock_hand_over(uint32_t *klock, uint32_t who) {
    /* acquire: the holder's later stores cannot move above the hand-over */
    rdv_exchange(klock, who, __ATOMIC_ACQUIRE);
}

void rdv_unlock(uint32_t *klock) {
    /* release: publishes our writes under the lock to the next holder;
     * pairs with the acquire CAS in take() */
    smp_store_release(klock, 0);
}
