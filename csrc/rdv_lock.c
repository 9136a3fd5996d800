/* Layer 3: lock words whose dead holders are found (see rdv_lock.h). */
#include <pthread.h>
#include <string.h>

#include "rdv_atomic.h"
#include "rdv_lock.h"
#include "rdv_os.h"

/* Spins before a lock waiter asks whether the holder is still alive. */
#define RDV_LOCK_CHECK_SPINS 4096
/* Checks in a row (each RDV_LOCK_CHECK_SPINS spins apart, milliseconds in
 * all) that must find the live entry a lock word names holding nothing
 * before the word is taken for damage and freed. */
#define RDV_LOCK_STALE_CHECKS 16

/* Thread slots: a process's first RDV_HOLD_SLOTS threads to lock count
 * their holds as their own entry in a word each (rdv_proc.thread_holds),
 * with plain (release) stores; the rest of its threads, and holds as another entry
 * (a reclaimer's, a hand-over's, and all of a handle's that registers into
 * a full table, acting as the dead entry it reclaims), share locks_held
 * with locked adds. Which
 * slot a thread has is the process's, not a segment's: bit i of
 * slots_taken, released when the thread exits (a thread holds no lock
 * between core calls, so it leaves its slot 0 in every segment). */
#define NO_SLOT 0xff /* tried, none free: the shared word for this handle */
static uint32_t slots_taken; /* process-local bitmap */
static pthread_key_t slot_key;
static int slot_key_made; /* written once, under slot_once */
static pthread_once_t slot_once = PTHREAD_ONCE_INIT;

/* This thread's share of each entry's locks_held, for the handle it last
 * locked in: a thread only takes away from a count what it added (a dead
 * holder's lock freed by a reclaimer was counted by the dead; the count is
 * zeroed when its entry is reclaimed, rdv_lock_forget); and its slot + 1
 * (0: none asked for yet, NO_SLOT). */
static __thread struct {
    const rdv_t *h;
    uint8_t slot;
    uint16_t held[RDV_MAX_PROCS];
} mine;

static void give_slot_back(void *unused) {
    (void)unused;
    /* release: our last stores to the slot's words happen before the
     * next thread's (its acquire CAS in take_slot) */
    if (mine.slot && mine.slot != NO_SLOT)
        rdv_fetch_and(&slots_taken, ~(1u << (mine.slot - 1)), __ATOMIC_RELEASE);
    /* A core call from a later destructor of this thread's must not write
     * the slot given back (another thread may own it now): the shared word
     * from here on (a lock in another segment would ask anew, and this
     * destructor run again to give that back). */
    mine.slot = NO_SLOT;
}

/* A fork child has one thread: the one that forked keeps its slot. */
static void slots_after_fork(void) {
    slots_taken = mine.slot && mine.slot != NO_SLOT ? 1u << (mine.slot - 1) : 0;
}

static void make_slot_key(void) {
    /* without the destructor, no slots: they would never come back */
    if (pthread_key_create(&slot_key, give_slot_back) == 0 && pthread_atfork(NULL, NULL, slots_after_fork) == 0)
        slot_key_made = 1;
}

/* A free slot for this thread, NO_SLOT if none. */
static uint8_t take_slot(void) {
    pthread_once(&slot_once, make_slot_key);
    if (!slot_key_made)
        return NO_SLOT;
    uint32_t taken = READ_ONCE(slots_taken); /* process-local */
    for (;;) {
        uint32_t free_ = ~taken & ((1u << RDV_HOLD_SLOTS) - 1);
        if (!free_)
            return NO_SLOT;
        uint32_t i = (uint32_t)__builtin_ctz(free_);
        /* acquire: pairs with the release in give_slot_back; the slot's
         * words are 0 in every segment, as their last thread left them (or
         * a claim of the entry zeroed them) */
        if (rdv_cas(&slots_taken, &taken, taken | 1u << i, __ATOMIC_ACQUIRE)) {
            if (pthread_setspecific(slot_key, (void *)1) != 0) {
                rdv_fetch_and(&slots_taken, ~(1u << i), __ATOMIC_RELEASE); /* as in give_slot_back */
                return NO_SLOT;
            }
            return (uint8_t)(i + 1);
        }
    }
}

static void count_hold(rdv_t *h, uint32_t who, int delta) {
    uint32_t e = who - 1;
    if (e >= RDV_MAX_PROCS)
        return;
    /* One look-up of the thread's block: in a shared library each is a call
     * (__tls_get_addr), which gcc would otherwise repeat at every use. */
    __typeof__(mine) *m = &mine;
    __asm__("" : "+r"(m));
    if (m->h != h) {
        /* Another handle: its counts start from here (a thread holds no lock
         * of one segment while it locks another's). */
        m->h = h;
        memset(m->held, 0, sizeof m->held);
        if (m->slot == 0 || m->slot == NO_SLOT)
            m->slot = take_slot();
    }
    if (delta < 0 && m->held[e] == 0)
        return; /* not counted by us (a dead holder's lock we free): see rdv_lock_forget */
    uint16_t n = (uint16_t)(m->held[e] + delta);
    m->held[e] = n;
    if (e == h->me && !h->acting && m->slot != NO_SLOT) {
        /* release: an increment is visible before the CAS that takes the
         * lock (which a waiter reads with acquire before the count), a
         * decrement only after the store that frees it, so the count covers
         * every moment the word names the entry; pairs with the acquire
         * loads in holds_nothing. No locked add: the word is ours alone. */
        smp_store_release(&h->kprocs[e].thread_holds[m->slot - 1], n);
        return;
    }
    /* seq_cst: as the release store above, for a word other threads add to */
    rdv_fetch_add(&h->kprocs[e].locks_held, (uint32_t)delta, __ATOMIC_SEQ_CST);
}

/* Whether entry holder - 1 holds no lock at all, apart from what this
 * thread holds as it (its attempt on this lock, and the locks it holds
 * meanwhile, such as an insert's home lock): a word that names our own
 * entry while no other thread of ours holds a lock is damage, or we would
 * wait for ourselves forever. Only a live entry's count says so: one being
 * reclaimed, or FREE, is acted for by a reclaimer whose holds under its
 * identity may not all be counted (a FREE entry's lock repaired as it). */
static int holds_nothing(rdv_t *h, uint32_t holder, uint32_t who) {
    uint32_t e = holder - 1;
    /* acquire: the state an entry was claimed with (rdv_live_claim) */
    if (smp_load_acquire(&h->kprocs[e].state) != RDV_PROC_ALIVE)
        return 0;
    /* seq_cst: pairs with count_hold's RMWs */
    int64_t n = (int32_t)smp_load_seq_cst(&h->kprocs[e].locks_held);
    for (uint32_t i = 0; i < RDV_HOLD_SLOTS; i++)
        n += smp_load_acquire(&h->kprocs[e].thread_holds[i]); /* acquire: pairs with count_hold's stores */
    /* This thread's holds as who, counted (count_hold) from before each
     * CAS: the rest of the count is other threads of ours. Exact because a
     * lock is always released by the thread that took it, within one core
     * call (a hand-over or a reclaimer's unlock acts as another entry). */
    int64_t ours = holder == who && mine.h == h ? mine.held[e] : 0;
    return n - ours <= 0;
}

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
    count_hold(h, who, +1); /* before the CAS: see count_hold */
    uint32_t suspect = 0, stale_checks = 0;
    for (unsigned spins = 0;; spins++) {
        /* acquire (not relaxed): a holder's count, stored before its CAS,
         * is visible to holds_nothing once we read its value here */
        uint32_t holder = smp_load_acquire(klock);
        if (holder == 0 || (reentrant && holder == who)) {
            /* acquire: pairs with the release in rdv_unlock; the previous
             * holder's writes are visible to us. The word names its holder
             * (entry + 1) so that a dead holder can be found. Release too:
             * our count (count_hold) is visible before the word names us. */
            if (rdv_cas(klock, &holder, who, __ATOMIC_ACQ_REL))
                return;
            continue;
        }
        rdv_cpu_relax();
        if ((spins & 63) == 63)
            rdv_yield(); /* the holder may be preempted on this CPU */
        if (spins % RDV_LOCK_CHECK_SPINS != RDV_LOCK_CHECK_SPINS - 1)
            continue;
        check_holder(h, klock, holder); /* a dead holder's lock is repaired */
        /* A live holder that holds nothing, check after check, while the
         * word keeps naming it: damage wrote the word. A holder that really
         * has it counts it from before its CAS to after its release. */
        if (holder <= RDV_MAX_PROCS && holds_nothing(h, holder, who)) {
            stale_checks = holder == suspect ? stale_checks + 1 : 1;
            suspect = holder;
        } else {
            stale_checks = 0;
        }
        if (stale_checks >= RDV_LOCK_STALE_CHECKS) {
            uint32_t expected = holder;
            rdv_cas(klock, &expected, 0, __ATOMIC_RELEASE); /* release: as rdv_unlock */
            stale_checks = 0;
        }
    }
}

void rdv_lock(rdv_t *h, uint32_t *klock) { take(h, klock, h->me + 1, 0); }

void rdv_lock_as(rdv_t *h, uint32_t *klock, uint32_t who) { take(h, klock, who, 1); }

void rdv_lock_hand_over(rdv_t *h, uint32_t *klock, uint32_t who) {
    count_hold(h, who, +1);
    /* acquire: the holder's later stores cannot move above the hand-over */
    uint32_t was = rdv_exchange(klock, who, __ATOMIC_ACQUIRE);
    count_hold(h, was, -1);
}

void rdv_unlock(rdv_t *h, uint32_t *klock) {
    uint32_t holder = READ_ONCE(*klock); /* relaxed: ours, naming us or the dead we act as */
    /* release: publishes our writes under the lock to the next holder;
     * pairs with the acquire CAS in take() */
    smp_store_release(klock, 0);
    if (holder)
        count_hold(h, holder, -1);
}

void rdv_lock_forget(rdv_t *h, uint32_t entry) { rdv_proc_clear_holds(&h->kprocs[entry]); }
