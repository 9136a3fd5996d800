/* Layer 2: waiting for a shared word to change: a bounded, adaptive spin, then a
 * futex sleep on the word itself (shared, not FUTEX_PRIVATE: the waker is
 * another process). The protocol follows an event count: a waiter announces
 * itself in a sleepers word, a full barrier, then re-checks the word before
 * it sleeps; a waker bumps the word, a full barrier, and makes the wake
 * syscall only when sleepers is nonzero. */
#include <errno.h>

#include "rdv_atomic.h"
#include "rdv_os.h"
#include "rdv_spin.h"
#include "rdv_wait.h"

/* How long a waiter whose waker shares its CPU yields to it before it
 * sleeps: a few of the waker's turns (a round trip of Python code is
 * 10-30 us), short enough that a waiter nobody serves soon uses almost no
 * CPU (a yield with nothing else to run returns at once). */
#define RDV_YIELD_NS 50000

/* The shortest futex sleep worth making: a shorter one oversleeps by the
 * kernel's timer slack (50 us by default; a 2 us sleep took 35-74 us on
 * the VMs measured). A wait whose deadline comes sooner than this after
 * its spin spins on to the deadline instead: a 4 us wait lasts 4 us. */
#define RDV_SLEEP_MIN_NS 50000

/* Whether a deadline of timeout_ns needs no clock: forever, or passed at
 * once (a zero timeout: at_ns 0 says so, for a reading plus a positive
 * timeout is never 0). */
static int reads_no_clock(int64_t timeout_ns) {
    return timeout_ns <= 0 || timeout_ns >= RDV_FOREVER_NS;
}

void rdv_deadline_init_at(struct rdv_deadline *d, int64_t timeout_ns, int64_t now_ns) {
    d->forever = timeout_ns < 0 || timeout_ns >= RDV_FOREVER_NS;
    d->at_ns = reads_no_clock(timeout_ns) ? 0 : now_ns + timeout_ns;
}

void rdv_deadline_init(struct rdv_deadline *d, int64_t timeout_ns) {
    rdv_deadline_init_at(d, timeout_ns, reads_no_clock(timeout_ns) ? 0 : rdv_now_ns());
}

int rdv_deadline_left_at(const struct rdv_deadline *d, int64_t now_ns, int64_t *left_ns) {
    if (d->forever) {
        *left_ns = INT64_MAX;
        return 0;
    }
    if (d->at_ns == 0) { /* a zero timeout */
        *left_ns = 0;
        return -ETIMEDOUT;
    }
    int64_t left = d->at_ns - now_ns;
    *left_ns = left;
    return left > 0 ? 0 : -ETIMEDOUT;
}

/* 0 with the time left (INT64_MAX when forever), or -ETIMEDOUT. */
int rdv_deadline_left(const struct rdv_deadline *d, int64_t *left_ns) {
    return rdv_deadline_left_at(d, d->forever || d->at_ns == 0 ? 0 : rdv_now_ns(), left_ns);
}

int rdv_is_aborted(const rdv_t *h) {
    /* A handle whose segment was truncated under it (rdv_segment.c) ends
     * its waits as an abort does; its calls then fail with -EFBIG.
     * relaxed: set by our own SIGBUS handler */
    if (READ_ONCE(h->damaged))
        return 1;
    /* acquire: pairs with the release store of RDV_ABORTED in rdv_abort, so
     * the reason is readable once the state is seen */
    return smp_load_acquire(&h->khdr->abort_state) != RDV_RUNNING;
}

/* Spin until *kword != seen, abort, or the spin ends (rdv_spin_on): 1 when
 * the word changed. No sched_yield: with an unrelated task on this CPU a
 * yield can cost a whole time slice (milliseconds); a waker that shares
 * our CPU is yielded to instead (yield_for_change). */
static int spin_for_change(rdv_t *h, uint32_t *kword, uint32_t seen, int64_t budget_ns, struct rdv_spin *spin,
                           int64_t now_ns) {
    rdv_spin_begin(spin, now_ns);
    for (;;) {
        for (int i = 0; i < RDV_SPIN_CHECK_EVERY; i++) {
            /* relaxed: only a hint to stop spinning; the caller re-reads the
             * state under the slot lock or with acquire */
            if (READ_ONCE(*kword) != seen)
                return 1;
            rdv_cpu_relax();
        }
        if (rdv_is_aborted(h) || !rdv_spin_on(spin, budget_ns))
            return 0;
    }
}

/* Where the process that ends our waits on kword ran, lately: one bit per
 * wait, set if on our CPU. A receiver learns it from each delivery (the
 * sender's CPU, rdv_wait_note_sender); a producer waiting for space from
 * the hint beside space_seq, after each wait that a bump ended. */
static uint32_t *same_cpu_history(rdv_t *h, const uint32_t *kword) {
    return kword == &h->khdr->arena.space_seq ? &h->space_same_cpu : &h->same_cpu;
}

static void note_space_waker(rdv_t *h, const uint32_t *kword) {
    if (kword != &h->khdr->arena.space_seq)
        return;
    /* relaxed: a hint, written just before the bump we saw */
    uint32_t waker = READ_ONCE(h->khdr->arena.space_waker_cpu);
    if (waker == 0)
        return;
    int same = waker - 1 == rdv_cpu();
    WRITE_ONCE(h->space_same_cpu, (READ_ONCE(h->space_same_cpu) << 1 | same) & 0xf);
}

/* Give the CPU to whatever else is runnable on it until *kword != seen,
 * abort, or the budget runs out. Used when our waker ran on our CPU lately:
 * it cannot run while we spin, and a yield hands it the CPU at once, where
 * a futex sleep costs a sleep and a wake syscall on top of the same switch
 * (and a waiter that is not counted asleep spares the waker its wake). */
static int yield_for_change(rdv_t *h, uint32_t *kword, uint32_t seen, int64_t budget_ns, int64_t now_ns) {
    int64_t start = now_ns;
    for (;;) {
        /* relaxed: only a hint to stop waiting; as in spin_for_change */
        if (READ_ONCE(*kword) != seen)
            return 1;
        if (rdv_is_aborted(h) || rdv_now_ns() - start >= budget_ns)
            return 0;
        rdv_yield();
    }
}

/* Wait until *kword differs from seen (or spuriously); 0, -ETIMEDOUT or -EINTR.
 * Callers re-check their condition either way. */
int rdv_wait_change(rdv_t *h, uint32_t *kword, uint32_t *ksleepers, uint32_t seen,
                    const struct rdv_deadline *d) {
    return rdv_wait_change_at(h, kword, ksleepers, seen, d, rdv_now_ns());
}

int rdv_wait_change_at(rdv_t *h, uint32_t *kword, uint32_t *ksleepers, uint32_t seen,
                       const struct rdv_deadline *d, int64_t now_ns) {
    int64_t left;
    if (rdv_deadline_left_at(d, now_ns, &left) < 0)
        return -ETIMEDOUT;

    int64_t budget = READ_ONCE(h->spin_ns); /* process-local hint; races only blur it */
    int64_t t0 = now_ns;
    /* Lately whoever ended our waits ran on our CPU: it cannot run while
     * we spin, so yield to it for a while instead, then sleep. The spin
     * budget is left alone: it is learned from wakers on other CPUs. */
    int same_cpu = __builtin_popcount(READ_ONCE(*same_cpu_history(h, kword))) >= 2;
    int64_t spin_ns = budget < left ? budget : left;
    if (left - spin_ns < RDV_SLEEP_MIN_NS)
        spin_ns = left; /* a sleep after it would oversleep the deadline (RDV_SLEEP_MIN_NS) */
    struct rdv_spin spin = {0};
    if (same_cpu ? yield_for_change(h, kword, seen, RDV_YIELD_NS < left ? RDV_YIELD_NS : left, t0)
                 : spin_for_change(h, kword, seen, spin_ns, &spin, t0)) {
        note_space_waker(h, kword);
        return 0;
    }
    if (rdv_deadline_left(d, &left) < 0)
        return -ETIMEDOUT;

    /* release+seq_cst RMW then full barrier: the sleepers increment must be
     * visible before we re-read the word; pairs with the barrier between the
     * waker's bump of the word and its read of sleepers (rdv_wake_all). */
    rdv_fetch_add(ksleepers, 1, __ATOMIC_SEQ_CST);
    smp_mb();
    int rc = 0;
    /* relaxed: after the barrier, the re-read the waker's bump pairs with;
     * the kernel compares the word again atomically before sleeping */
    if (READ_ONCE(*kword) == seen && !rdv_is_aborted(h))
        rc = rdv_futex_wait(kword, seen, left);
    /* relaxed: as the re-read above */
    if (rc == 0 && READ_ONCE(*kword) != seen)
        note_space_waker(h, kword);
    /* release: we are done reading the word; a waker that still sees us
     * counted makes one spare wake syscall, no more. A waiter that dies
     * asleep leaves its sleepers word one too high: a spare wake, never a
     * missed one. */
    rdv_fetch_add(ksleepers, (uint32_t)-1, __ATOMIC_RELEASE);

    /* Adapt the budget: a wake within the largest budget means a longer spin
     * would have caught it (and saved the wake-up, which costs more); a wait
     * far beyond it means the peer is slow and spinning is waste. */
    int64_t waited = rdv_now_ns() - t0;
    if (same_cpu || spin.crowded)
        ; /* nothing learned about spinning: it was not up to the budget */
    else if (rc == 0 && waited < RDV_SPIN_MAX_NS && budget < RDV_SPIN_MAX_NS)
        WRITE_ONCE(h->spin_ns, budget * 2);
    else if (waited > 16 * RDV_SPIN_MAX_NS && budget > RDV_SPIN_MIN_NS)
        WRITE_ONCE(h->spin_ns, budget / 2);
    return rc == -ETIMEDOUT ? 0 : rc; /* the caller's deadline decides timeouts */
}

void rdv_wake_bump(uint32_t *kword) {
    /* release: publishes everything written before the bump to spinners that
     * read the word (they then take the lock or load with acquire) */
    rdv_fetch_add(kword, 1, __ATOMIC_RELEASE);
}

void rdv_wake_sleepers(uint32_t *kword, uint32_t *ksleepers) {
    /* full barrier: the bump before the sleepers read, pairing with the
     * waiter's increment + barrier + re-read of the word */
    smp_mb();
    if (READ_ONCE(*ksleepers) != 0)
        rdv_futex_wake_all(kword);
}

void rdv_wake_all(uint32_t *kword, uint32_t *ksleepers) {
    rdv_wake_bump(kword);
    rdv_wake_sleepers(kword, ksleepers);
}

void rdv_wait_note_sender(rdv_t *h, uint32_t sender_cpu) {
    int same = sender_cpu == rdv_cpu();
    /* process-local, relaxed: a hint; races only blur it */
    WRITE_ONCE(h->same_cpu, (READ_ONCE(h->same_cpu) << 1 | same) & 0xf);
}
