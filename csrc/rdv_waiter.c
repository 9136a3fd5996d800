/* Layer 5: waiter records (see rdv_waiter.h and struct rdv_waiter).
 *
 * Each handle allocates its records from slabs of its own: arena blocks of
 * stage RDV_MSG_WAITERS owned by its process entry, so that its death frees
 * them with its other blocks (after recovery has unlinked every record).
 * Which records are free is process-local (a mutex and an array, and one
 * spare record beside them that a receive takes and frees with an
 * exchange); senders only ever reach a record through a waiter queue,
 * under the slot's lock.
 *
 * A waiter queue is doubly linked through next and prev. Its forward links
 * from w_head are the truth: every change makes the forward chain right
 * first, with one store, so a holder that dies part-way leaves a chain
 * that rdv_waiter_rebuild can follow. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rdv_arena.h"
#include "rdv_atomic.h"
#include "rdv_os.h"
#include "rdv_wait.h"
#include "rdv_waiter.h"

#define SLAB_BYTES (RDV_SLAB_GRANULES * RDV_GRANULE)
#define PER_SLAB (RDV_SLAB_GRANULES - RDV_SLAB_FIRST)

static int grow(uint32_t **arr, uint32_t *cap, uint32_t need) {
    if (need <= *cap)
        return 0;
    uint32_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    uint32_t *p = realloc(*arr, (size_t)n * sizeof *p);
    if (!p)
        return -ENOMEM;
    *arr = p;
    *cap = n;
    return 0;
}

static uint32_t home_granule(const rdv_t *h, uint32_t entry) {
    return h->granules + entry * RDV_SLAB_GRANULES;
}

static struct rdv_msg *header_at(const rdv_t *h, uint32_t g) {
    return (struct rdv_msg *)(h->karena + (uint64_t)g * RDV_GRANULE);
}

/* A fresh slab of ours: every record free. Called with waiter_lock held.
 * The first is our entry's home slab, the others arena blocks. */
static int add_slab(rdv_t *h) {
    /* room for every record of every slab: all of them may be free at once */
    if (grow(&h->slabs, &h->cap_slabs, h->n_slabs + 1) < 0 ||
        grow(&h->free_waiters, &h->cap_free, (h->n_slabs + 1) * PER_SLAB) < 0)
        return -ENOMEM;
    uint32_t g;
    struct rdv_msg *m;
    if (h->n_slabs == 0) {
        g = home_granule(h, h->me);
        m = header_at(h, g);
        m->pos = g;
        m->owner = (uint16_t)(h->me + 1);
    } else {
        uint64_t pos;
        int rc = rdv_arena_alloc(h, SLAB_BYTES, &pos); /* WRITING, ours: freed if we die now */
        if (rc < 0)
            return rc;
        m = rdv_msg_at(h, pos);
        g = (uint32_t)rdv_pos_granule(pos);
    }
    m->next = 0;
    m->key_len = 0;
    m->ndim = 0;
    m->dtype_len = 0;
    m->flags = 0;
    m->payload_off = RDV_GRANULE;
    m->nbytes = SLAB_BYTES - RDV_GRANULE;
    struct rdv_slab *slab = (struct rdv_slab *)(m + 1);
    memset(slab, 0, sizeof *slab);
    for (uint32_t i = RDV_SLAB_FIRST; i < RDV_SLAB_GRANULES; i++) {
        struct rdv_waiter *w = rdv_waiter_at(h, g + i + 1);
        memset(w, 0, sizeof *w);
        w->owner = (uint16_t)(h->me + 1);
        w->slab = g + 2; /* the control granule's link */
        h->free_waiters[h->n_free++] = g + i + 1;
    }
    /* release: a slab's records are initialised before anyone (a reclaimer,
     * our poll) looks at it as one */
    smp_store_release(&m->stage, RDV_MSG_WAITERS);
    if (h->n_slabs == 0)
        /* release: pairs with the acquire in rdv_waiter_ours; set before
         * any record of the slab is handed out */
        smp_store_release(&h->home_slab_ready, 1);
    /* kept sorted, for rdv_waiter_ours */
    uint32_t at = h->n_slabs;
    while (at > 0 && h->slabs[at - 1] > g + 1) {
        h->slabs[at] = h->slabs[at - 1];
        at--;
    }
    h->slabs[at] = g + 1;
    h->n_slabs++;
    return 0;
}

int rdv_waiter_ours(rdv_t *h, uint32_t link) {
    /* A record of our home slab is ours while we are attached: no lock */
    uint32_t home = home_granule(h, h->me) + 1;
    if (link >= home + RDV_SLAB_FIRST && link < home + RDV_SLAB_GRANULES &&
        smp_load_acquire(&h->home_slab_ready)) /* acquire: as in add_slab; process-local */
        return 1;
    pthread_mutex_lock(&h->waiter_lock);
    uint32_t lo = 0, hi = h->n_slabs; /* the last slab starting at or before link */
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (h->slabs[mid] <= link)
            lo = mid + 1;
        else
            hi = mid;
    }
    int ours = lo > 0 && link >= h->slabs[lo - 1] + RDV_SLAB_FIRST &&
               link < h->slabs[lo - 1] + RDV_SLAB_GRANULES;
    pthread_mutex_unlock(&h->waiter_lock);
    return ours;
}

/* A free record of ours, handed out: initialised. */
static void init_record(rdv_t *h, uint32_t link) {
    struct rdv_waiter *w = rdv_waiter_at(h, link);
    if (!w)
        return; /* never: our pool holds links of our own slabs only */
    /* relaxed: our poll (async_handed) may read these of a record it saw
     * HANDED in its last use, while we set it up for its next */
    WRITE_ONCE(w->group, link);
    WRITE_ONCE(w->flags, 0);
    w->next = w->prev = w->slot = 0;
    w->won = w->sibling = 0;
    /* relaxed, both: nobody else reaches the record until it is linked
     * (under a slot lock, which publishes it), but the send that handed
     * its last message may still be reading them, to wake whoever slept on
     * it (after its unlock, rdv_waiter_wake_now): a wake of the reused
     * record, at most, which its waiter takes for a spurious one */
    WRITE_ONCE(w->sleeping, 0);
    WRITE_ONCE(w->state, RDV_WAITER_WAITING);
}

/* Hand out n free records (there are), initialised. waiter_lock held. */
static void take_free(rdv_t *h, uint32_t n, uint32_t *links) {
    for (uint32_t i = 0; i < n; i++) {
        links[i] = h->free_waiters[--h->n_free];
        init_record(h, links[i]);
    }
}

/* The spare record back into the array, if there is one. waiter_lock held. */
static void pool_spare(rdv_t *h) {
    /* acquire: pairs with the exchange in rdv_waiter_free; process-local */
    uint32_t spare = rdv_exchange(&h->spare_waiter, 0, __ATOMIC_ACQUIRE);
    if (spare)
        h->free_waiters[h->n_free++] = spare; /* room: every record came from a slab */
}

int rdv_waiter_alloc(rdv_t *h, uint32_t n, uint32_t *links) {
    pthread_mutex_lock(&h->waiter_lock);
    pool_spare(h);
    int rc = 0;
    while (rc == 0 && h->n_free < n)
        rc = add_slab(h);
    if (rc == 0)
        take_free(h, n, links);
    pthread_mutex_unlock(&h->waiter_lock);
    return rc;
}

int rdv_waiter_alloc_cached(rdv_t *h, uint32_t *link) {
    /* acquire: pairs with the exchange in rdv_waiter_free, which made the
     * record free; process-local */
    uint32_t spare = rdv_exchange(&h->spare_waiter, 0, __ATOMIC_ACQUIRE);
    if (spare) {
        init_record(h, spare);
        *link = spare;
        return 1;
    }
    /* trylock: a thread of ours holding it may be in add_slab, waiting on
     * the arena's lock, whose dead holder's repair takes slot locks */
    if (pthread_mutex_trylock(&h->waiter_lock) != 0)
        return 0;
    int got = h->n_free > 0;
    if (got)
        take_free(h, 1, link);
    pthread_mutex_unlock(&h->waiter_lock);
    return got;
}

void rdv_waiter_free(rdv_t *h, uint32_t n, const uint32_t *links) {
    for (uint32_t i = 0; i < n; i++)
        /* relaxed: unlinked everywhere, so only our threads read it (our
         * poll, which skips a free record, and whoever takes it next,
         * ordered by the exchange or the mutex below) */
        WRITE_ONCE(rdv_waiter_at(h, links[i])->state, RDV_WAITER_FREE);
    if (n == 0)
        return;
    /* The first becomes the spare, with no lock if there was none; the
     * rest (and a spare it replaced) go back into the array.
     * acq_rel: publishes its FREE state to the thread that takes it (its
     * acquire exchange), and takes the one it replaces; process-local */
    uint32_t out = rdv_exchange(&h->spare_waiter, links[0], __ATOMIC_ACQ_REL);
    if (out == 0 && n == 1)
        return;
    pthread_mutex_lock(&h->waiter_lock);
    if (out)
        h->free_waiters[h->n_free++] = out; /* room: every record came from a slab */
    for (uint32_t i = 1; i < n; i++)
        h->free_waiters[h->n_free++] = links[i];
    pthread_mutex_unlock(&h->waiter_lock);
}

void rdv_waiter_pool_drop(rdv_t *h) {
    free(h->slabs);
    free(h->free_waiters);
    h->slabs = h->free_waiters = NULL;
    h->n_slabs = h->cap_slabs = h->n_free = h->cap_free = 0;
    h->spare_waiter = h->home_slab_ready = 0;
}

/* ---- the waiter queue (slot lock held) ---------------------------------- */

void rdv_waiter_link(rdv_t *h, uint32_t idx, uint32_t link) {
    struct rdv_slot *s = &h->kslots[idx];
    struct rdv_waiter *w = rdv_waiter_at(h, link);
    struct rdv_waiter *tail = rdv_waiter_at(h, s->w_tail);
    WRITE_ONCE(w->slot, idx + 1); /* relaxed: published by the release below */
    w->next = 0;
    w->prev = tail ? s->w_tail : 0;
    /* release: the record's fields land before the forward link that makes
     * it reachable (the one store a repair follows) */
    if (tail)
        smp_store_release(&tail->next, link);
    else
        smp_store_release(&s->w_head, link);
    s->w_tail = link;
    s->waiters++;
}

int rdv_waiter_unlink(rdv_t *h, uint32_t idx, uint32_t link) {
    struct rdv_slot *s = &h->kslots[idx];
    struct rdv_waiter *w = rdv_waiter_at(h, link);
    if (!w || w->slot != idx + 1)
        return 0;
    struct rdv_waiter *prev = rdv_waiter_at(h, w->prev);
    int member = prev ? prev->slot == idx + 1 && prev->next == link : s->w_head == link;
    if (member) {
        /* release: the forward chain skips w before anything else changes:
         * a repair after our death follows it */
        if (prev)
            smp_store_release(&prev->next, w->next);
        else
            smp_store_release(&s->w_head, w->next);
        struct rdv_waiter *next = rdv_waiter_at(h, w->next);
        if (next)
            next->prev = w->prev;
        else
            s->w_tail = w->prev;
        if (s->waiters)
            s->waiters--;
    }
    /* release: our reads of its links happen before its owner, who skips
     * the lock once it reads 0 (acquire), frees the record */
    smp_store_release(&w->slot, 0);
    return member;
}

/* Whether record w (at link) still waits: linked here, its group undecided. */
static int still_waiting(rdv_t *h, struct rdv_waiter *w, uint32_t link, uint32_t idx, uint32_t drop) {
    struct rdv_waiter *leader = rdv_waiter_at(h, rdv_waiter_leader_link(h, w, link));
    /* relaxed: the state is re-read by whoever decides it, with a CAS */
    return w->slot == idx + 1 && w->owner != drop && READ_ONCE(leader->state) == RDV_WAITER_WAITING;
}

void rdv_waiter_rebuild(rdv_t *h, uint32_t idx, uint32_t drop) {
    struct rdv_slot *s = &h->kslots[idx];
    uint32_t head = 0, tail = 0, n = 0;
    uint32_t link = s->w_head;
    for (uint64_t steps = 0; link && steps < rdv_waiter_walk_max(h); steps++) {
        struct rdv_waiter *w = rdv_waiter_at(h, link);
        if (!w)
            break; /* the chain is broken here */
        uint32_t next = w->next;
        if (still_waiting(h, w, link, idx, drop)) {
            struct rdv_waiter *t = rdv_waiter_at(h, tail);
            if (t)
                t->next = link;
            else
                head = link;
            w->prev = tail;
            tail = link;
            n++;
        } else if (w->slot == idx + 1) {
            smp_store_release(&w->slot, 0); /* as in rdv_waiter_unlink */
        }
        link = next;
    }
    struct rdv_waiter *t = rdv_waiter_at(h, tail);
    if (t)
        t->next = 0;
    /* release: the kept records' links land before the head that reaches them */
    smp_store_release(&s->w_head, head);
    s->w_tail = tail;
    s->waiters = n;
}

/* ---- deciding and waking ------------------------------------------------ */

int rdv_waiter_decide(struct rdv_waiter *leader, uint32_t to) {
    uint32_t waiting = RDV_WAITER_WAITING;
    /* acq_rel: exactly one of a send (HANDED), another key's send of the
     * same group, and the owner's withdraw (CANCELLED) wins; the winner's
     * earlier stores are visible to the loser, which re-reads the state */
    return rdv_cas(&leader->state, &waiting, to, __ATOMIC_ACQ_REL);
}

void rdv_waiter_wake_prepare(rdv_t *h, uint32_t link, struct rdv_wake *wk) {
    struct rdv_waiter *l = rdv_waiter_at(h, link);
    wk->word = NULL;
    if (!l)
        return;
    if (l->flags & RDV_WAITER_ASYNC) {
        struct rdv_waiter *ctl = rdv_waiter_at(h, l->slab);
        if (ctl)
            /* release: the decided state lands before the hint; pairs with
             * the exchange in rdv_waiter_handed */
            smp_store_release(&((struct rdv_slab *)ctl)->handed, 1);
        uint32_t owner = l->owner;
        if (owner >= 1 && owner <= RDV_MAX_PROCS) {
            struct rdv_proc *p = &h->kprocs[owner - 1];
            wk->word = &p->bell;
            wk->sleepers = &p->bell_sleepers;
            wk->bump = 1;
        }
        return;
    }
    wk->word = &l->state; /* changed already: the CAS, or abort's flag */
    wk->sleepers = &l->sleeping;
    wk->bump = 0;
}

void rdv_waiter_wake_now(const struct rdv_wake *wk) {
    if (!wk->word)
        return;
    if (wk->bump)
        rdv_wake_all(wk->word, wk->sleepers);
    else /* the barrier and sleeper check of the event count, then one wake */
        rdv_wake_sleepers(wk->word, wk->sleepers);
}

/* ---- looking at our slabs ----------------------------------------------- */

/* Whether record link is an async leader a send handed a message to. */
static int async_handed(rdv_t *h, uint32_t link) {
    struct rdv_waiter *w = rdv_waiter_at(h, link);
    /* acquire: the state a send decided, after the hint, and with it the
     * fields its receiver set up before it lined up. Read first: a record
     * being set up is not HANDED. relaxed, the fields: a thread of ours may
     * be setting the record up for its next use right now (with no lock,
     * rdv_waiter_alloc_cached), if we saw the state of its last; its waiter
     * is then served already, and the caller finds nothing to take */
    return RDV_WAITER_KIND(smp_load_acquire(&w->state)) == RDV_WAITER_HANDED && READ_ONCE(w->group) == link &&
           (READ_ONCE(w->flags) & RDV_WAITER_ASYNC);
}

static struct rdv_slab *slab_ctl(rdv_t *h, uint32_t i) {
    return (struct rdv_slab *)rdv_waiter_at(h, h->slabs[i] + 1);
}

uint32_t rdv_waiter_handed(rdv_t *h, uint32_t *out, uint32_t cap) {
    uint32_t n = 0;
    pthread_mutex_lock(&h->waiter_lock);
    for (uint32_t i = 0; i < h->n_slabs && n < cap; i++) {
        struct rdv_slab *slab = slab_ctl(h, i);
        /* relaxed first look, then acquire: pairs with the release store of
         * the hint in rdv_waiter_wake_prepare */
        if (READ_ONCE(slab->handed) == 0 || !rdv_exchange(&slab->handed, 0, __ATOMIC_ACQUIRE))
            continue;
        uint32_t g = h->slabs[i] - 1;
        for (uint32_t r = RDV_SLAB_FIRST; r < RDV_SLAB_GRANULES; r++) {
            if (!async_handed(h, g + r + 1))
                continue;
            if (n == cap) {
                smp_store_release(&slab->handed, 1); /* as in rdv_waiter_wake_prepare: come back */
                break;
            }
            out[n++] = g + r + 1;
        }
    }
    pthread_mutex_unlock(&h->waiter_lock);
    return n;
}

int rdv_waiter_hinted(rdv_t *h, int full) {
    int any = 0;
    pthread_mutex_lock(&h->waiter_lock);
    for (uint32_t i = 0; i < h->n_slabs; i++) {
        struct rdv_slab *slab = slab_ctl(h, i);
        if (READ_ONCE(slab->handed)) { /* relaxed: the taker's exchange pairs with the hint */
            any = 1;
            continue;
        }
        if (!full)
            continue;
        uint32_t g = h->slabs[i] - 1;
        for (uint32_t r = RDV_SLAB_FIRST; r < RDV_SLAB_GRANULES; r++)
            if (async_handed(h, g + r + 1)) {
                smp_store_release(&slab->handed, 1); /* as in rdv_waiter_wake_prepare */
                any = 1;
                break;
            }
    }
    pthread_mutex_unlock(&h->waiter_lock);
    return any;
}

struct rdv_msg *rdv_waiter_slab_next(rdv_t *h, uint32_t who, uint32_t *g, uint32_t *first,
                                     uint32_t *last) {
    struct rdv_msg *m;
    for (; *g < h->granules && (m = rdv_arena_next(h, g)); rdv_arena_step(h, g)) {
        uint64_t len;
        /* acquire: pairs with the release of WAITERS in add_slab */
        if (smp_load_acquire(&m->stage) != RDV_MSG_WAITERS || (who && m->owner != who) ||
            !rdv_block_at(h, m->pos, &len) || len < SLAB_BYTES)
            continue;
        uint32_t base = (uint32_t)rdv_pos_granule(m->pos);
        *first = base + RDV_SLAB_FIRST + 1;
        *last = base + RDV_SLAB_GRANULES;
        rdv_arena_step(h, g);
        return m;
    }
    /* then the home slabs: *g counts on past the arena, one per entry */
    if (*g < h->granules)
        *g = h->granules;
    for (; *g < home_granule(h, RDV_MAX_PROCS); *g += RDV_SLAB_GRANULES) {
        m = header_at(h, *g);
        uint32_t entry = (*g - h->granules) / RDV_SLAB_GRANULES;
        /* acquire: as above */
        if (smp_load_acquire(&m->stage) != RDV_MSG_WAITERS || m->owner != entry + 1 ||
            (who && who != entry + 1))
            continue;
        *first = *g + RDV_SLAB_FIRST + 1;
        *last = *g + RDV_SLAB_GRANULES;
        *g += RDV_SLAB_GRANULES;
        return m;
    }
    return NULL;
}

void rdv_waiter_home_reset(rdv_t *h, uint32_t who) {
    if (who == 0 || who > RDV_MAX_PROCS)
        return;
    struct rdv_msg *m = header_at(h, home_granule(h, who - 1));
    /* release: our unlinks happen before the slab stops being one */
    smp_store_release(&m->stage, 0);
}
