/* Layer 1: the clock of a spinning wait, shared by the waits for a key
 * (rdv_wait.c) and for a group's ranks (rdv_coll.c), and the bounds of
 * their budgets (the lock and hand-off spins are bounded on their own).
 * Header only: the checks run between rounds of pauses, in the hot loop. */
#ifndef RDV_SPIN_H
#define RDV_SPIN_H

#include <stdint.h>

#include "rdv_os.h"

/* Spin budgets. Waking a sleeper on another vCPU costs ~25-100 us on the
 * VMs we measured, a spin that catches the change costs a few us; a waiter
 * that keeps waiting past its budget sleeps and uses no CPU. Budgets adapt
 * between MIN and MAX from START. */
#define RDV_SPIN_MIN_NS 2000
#define RDV_SPIN_MAX_NS 200000
#define RDV_SPIN_START_NS 50000
#define RDV_SPIN_CHECK_EVERY 64 /* pause iterations between clock reads */

/* Past its first RDV_SPIN_FREE_NS a spin goes on only while the machine
 * has a CPU to spare (rdv_cpus_oversubscribed, read every
 * RDV_SPIN_LOAD_EVERY_NS): with more tasks runnable than CPUs, a spinner
 * keeps a CPU from whoever it waits for, or from someone else (a loader's
 * trainer spinning while its two workers share the other CPU halves their
 * speed). Most waits a spin catches end within its first microseconds.
 * The count is the whole machine's, as is the CPU count: affinity and
 * cpusets are not looked at, so a job pinned to a few CPUs of a busy
 * machine may spin less than it could, one in a small cpuset on an idle
 * one more (a cost in speed, never in correctness). */
#define RDV_SPIN_FREE_NS 4000
#define RDV_SPIN_LOAD_EVERY_NS 50000

struct rdv_spin {
    int64_t start, next_look;
    int crowded; /* the spin ended because no CPU was spare, not on its budget */
};

/* A spin starting at now_ns, the clock as its caller last read it. */
static inline void rdv_spin_begin(struct rdv_spin *s, int64_t now_ns) {
    s->start = now_ns;
    s->next_look = s->start + RDV_SPIN_FREE_NS;
    s->crowded = 0;
}

/* Between two rounds of RDV_SPIN_CHECK_EVERY pauses: 1 to spin on, 0 once
 * budget_ns have passed or the machine has no CPU to spare (crowded). */
static inline int rdv_spin_on(struct rdv_spin *s, int64_t budget_ns) {
    int64_t now = rdv_now_ns();
    if (now - s->start >= budget_ns)
        return 0;
    if (now >= s->next_look) {
        if (rdv_cpus_oversubscribed()) {
            s->crowded = 1;
            return 0;
        }
        s->next_look = rdv_now_ns() + RDV_SPIN_LOAD_EVERY_NS;
    }
    return 1;
}

#endif
