/* Layer 10: collectives over a group's own segment (layout and phase rule
 * in rdv_coll.h). Public entry points only (shmrdv.h), over the OS layer
 * and the reduction kernels.
 *
 * Waiting: a rank that finds another behind spins on that rank's arrive
 * word for a bounded, adaptive budget (none when the laggard last ran on
 * our CPU: it cannot run while we spin), then sleeps on it with a futex, in
 * slices of at most RDV_COLL_SLICE_NS. Every wake and every slice's end
 * checks the laggards' liveness locks, so a rank that dies or closes is
 * found within a slice; and every slice returns to the caller
 * (-EINPROGRESS), which resumes the call after running signal handlers.
 *
 * Failure: the first rank to find the group broken (a rank lost, an abort)
 * says so with one compare-and-swap of the header's state, naming the rank
 * (whose pid and reason sit in its own slot, written before), and wakes
 * everyone. A process may die between any two stores: what it leaves is
 * either its own slot (read by nobody once it is lost) or the one CAS. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdv_atomic.h"
#include "rdv_coll.h"
#include "rdv_os.h"
#include "rdv_reduce.h"
#include "rdv_spin.h"

#define RDV_COLL_SLICE_NS 50000000LL /* 50 ms: how soon a death or a signal is seen */
/* A rank's abort reason: length word at 0, the ranks a timeout waited for
 * at 8, text at 64; 64-aligned. Written only by the rank, before the state
 * CAS that names it. */
#define REASON_STRIDE 1088

struct rdv_group {
    uint8_t *base;
    uint64_t len;
    struct rdv_coll_hdr *hdr;
    struct rdv_coll_rank *ranks;
    uint8_t *reasons;
    uint8_t *bufs;
    int lock_fd;
    uint32_t rank;
    uint32_t world;
    uint64_t slot;
    int inert;           /* closed for calls: left, or a forked child's copy (READ_ONCE: threads) */
    int64_t timeout_ns;  /* of each call */
    struct rdv_coll_status st; /* why the last call failed */
    uint32_t failed_len; /* and, when another rank's call was RDV_COLL_FAILED, why it said */
    char failed_why[RDV_REASON_MAX];
    int64_t spin_ns;     /* process-local hint */
    int64_t spin_max_ns; /* its bound */
    uint32_t next;       /* the phase our next call starts at */
    pthread_mutex_t abort_lock; /* one writer of our reason area at a time */
    /* the call in progress */
    uint32_t busy;       /* a call runs (or waits to be resumed): process-local, atomic */
    pthread_t owner;     /* the thread whose call it is, while busy */
    struct rdv_coll_call c;
    uint32_t isz;        /* bytes per element the kind splits at */
    uint64_t region;     /* bytes of a buffer each peer's share may use */
    uint64_t nchunks;
    int one_shot;
    uint32_t p0, phase, nphases;
    int produced;        /* this phase's produce and arrive are done */
    int spun;            /* this phase's wait: 1 spun, 2 slept after, 3 slept after a spin cut short (crowded) */
    int64_t wait_from;   /* when this phase's wait began */
    int forever;
    int64_t deadline;
};

static uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

static uint64_t ranks_bytes(uint32_t world) {
    return round_up((uint64_t)world * sizeof(struct rdv_coll_rank), RDV_COLL_PAGE);
}

static uint64_t reasons_bytes(uint32_t world) {
    return round_up((uint64_t)world * REASON_STRIDE, RDV_COLL_PAGE);
}

static uint64_t segment_bytes(uint32_t world, uint64_t slot) {
    return RDV_COLL_PAGE + ranks_bytes(world) + reasons_bytes(world) + (uint64_t)world * 2 * slot;
}

static uint8_t *buf(const rdv_group_t *g, uint32_t r, uint32_t parity) {
    return g->bufs + ((uint64_t)r * 2 + (parity & 1)) * g->slot;
}

static uint32_t *reason_len_of(const rdv_group_t *g, uint32_t r) {
    return (uint32_t *)(g->reasons + (uint64_t)r * REASON_STRIDE);
}

static uint64_t *missing_of(const rdv_group_t *g, uint32_t r) {
    return (uint64_t *)(g->reasons + (uint64_t)r * REASON_STRIDE + 8);
}

static char *reason_of(const rdv_group_t *g, uint32_t r) {
    return (char *)(g->reasons + (uint64_t)r * REASON_STRIDE + 64);
}

static void wake_everyone(rdv_group_t *g) {
    for (uint32_t r = 0; r < g->world; r++)
        rdv_futex_wake_all(&g->ranks[r].arrive);
    rdv_futex_wake_all(&g->hdr->joined);
}

/* Mark the group broken (RDV_COLL_LOST or ABORTED, naming rank), unless it
 * is already: one CAS, so a death between any two stores leaves it either
 * running or broken, never half-said. */
static void set_broken(rdv_group_t *g, uint32_t state) {
    uint32_t running = RDV_COLL_RUNNING;
    /* release: the rank's pid, state or reason (written before) are
     * readable by whoever sees the new state; pairs with the acquire in
     * broken_status */
    rdv_cas(&g->hdr->state, &running, state, __ATOMIC_RELEASE);
    wake_everyone(g);
}

/* The error a broken group's calls return, with what st needs to say why. */
static int broken_status(rdv_group_t *g, uint32_t state, struct rdv_coll_status *st) {
    uint32_t rank = state >> 8 & 0xff, flags = state >> 16;
    st->rank = rank;
    /* relaxed: the named rank's pid, written before its JOINED; the caller
     * acquired the state word, whose CAS came after */
    st->pid = rank < g->world ? READ_ONCE(g->ranks[rank].pid) : 0;
    if ((state & 0xff) == RDV_COLL_LOST) {
        st->closed = flags & RDV_COLL_FLAG_CLOSED;
        return -EPIPE;
    }
    st->timed_out = rank < g->world && (flags & RDV_COLL_FLAG_TIMED_OUT);
    /* relaxed: written by the aborter before the state CAS the caller acquired */
    st->missing = st->timed_out ? READ_ONCE(*missing_of(g, rank)) : 0;
    return -ECONNABORTED;
}

static int check_state(rdv_group_t *g, struct rdv_coll_status *st) {
    if (READ_ONCE(g->inert)) /* relaxed: set by rdv_coll_leave, maybe in another thread */
        return -EBADF;
    /* acquire: pairs with the release CAS in set_broken */
    uint32_t state = smp_load_acquire(&g->hdr->state);
    return state == RDV_COLL_RUNNING ? 0 : broken_status(g, state, st);
}

/* Whether rank r is gone: its liveness lock is free. A rank that closed
 * said so in its slot first. */
static int lost(rdv_group_t *g, uint32_t r) {
    return r != g->rank && !rdv_byte_locked_by_other(g->lock_fd, RDV_COLL_LIVE_BYTE(r));
}

static void declare_lost(rdv_group_t *g, uint32_t r) {
    /* acquire: pairs with the release of CLOSED in rdv_coll_close */
    uint32_t closed = smp_load_acquire(&g->ranks[r].state) == RDV_COLL_RANK_CLOSED;
    set_broken(g, RDV_COLL_LOST | r << 8 | closed << 16);
}

/* ---- joining ---- */

/* Break the state of a group whose join was refused (RDV_COLL_REFUSED is
 * in joined), unless it is broken already, and wake whoever waits to join:
 * the refuser's last step, which any member that finds the bit finishes
 * should the refuser die before it. */
static void refused_state(struct rdv_coll_hdr *h) {
    uint32_t running = RDV_COLL_RUNNING;
    /* release: a reason the refuser published before (outsider_claim) is
     * readable by whoever acquires the new state (rdv_coll_reason) */
    rdv_cas(&h->state, &running, RDV_COLL_ABORTED | RDV_COLL_OUTSIDER << 8, __ATOMIC_RELEASE);
    rdv_futex_wake_all(&h->joined);
}

/* Refuse the join of the group whose header is h (a writable mapping of
 * its first page), saying why when nobody has yet: see rdv_coll_refuse. */
static int refuse(struct rdv_coll_hdr *h, const char *reason, uint32_t reason_len) {
    uint32_t world = h->world; /* plain: written before the magic the caller acquired */
    uint32_t unclaimed = RDV_COLL_CLAIM_FREE;
    /* relaxed: only one process may write the record; what it writes is
     * published by the release below */
    if (rdv_cas(&h->outsider_claim, &unclaimed, RDV_COLL_CLAIM_WRITING, __ATOMIC_RELAXED)) {
        memcpy(h->outsider_reason, reason, reason_len);
        WRITE_ONCE(h->outsider_len, reason_len); /* relaxed: published by the next store */
        /* release: the text and length before the claim that says they are
         * whole; pairs with the acquire in rdv_coll_reason */
        smp_store_release(&h->outsider_claim, RDV_COLL_CLAIM_PUBLISHED);
    }
    /* acquire: pairs with the joiners' seq_cst CAS of joined */
    uint32_t n = smp_load_acquire(&h->joined);
    while (!(n & RDV_COLL_REFUSED)) {
        if (n >= world)
            return -EALREADY; /* formed: nobody outside it may stop it */
        /* seq_cst: the bit and the joiners' counts are one word, so either
         * the last joiner's CAS or ours comes first, never both */
        if (rdv_cas(&h->joined, &n, n | RDV_COLL_REFUSED, __ATOMIC_SEQ_CST))
            break;
    }
    refused_state(h);
    return 0;
}

int rdv_coll_refuse(int fd, const uint8_t *job, const char *reason, uint32_t reason_len) {
    if (reason_len > RDV_REASON_MAX)
        return -EINVAL;
    int64_t size = rdv_file_size(fd);
    if (size < 0)
        return (int)size;
    if ((uint64_t)size < RDV_COLL_PAGE)
        return -EAGAIN;
    int err;
    struct rdv_coll_hdr *h = rdv_map(fd, RDV_COLL_PAGE, 0, &err);
    if (!h)
        return err;
    /* acquire: pairs with the creator's release of magic, after the rest */
    uint64_t magic = smp_load_acquire(&h->magic);
    int rc;
    if (magic == 0)
        rc = -EAGAIN;
    else if (magic != RDV_COLL_MAGIC)
        rc = -EPROTO;
    else if (h->version != RDV_COLL_VERSION)
        rc = -EPROTONOSUPPORT;
    else if (job && memcmp(h->job, job, RDV_COLL_JOB_BYTES) != 0) /* plain: written before the magic */
        rc = -EREMCHG; /* another job's: what happens to it is none of ours */
    else
        rc = refuse(h, reason, reason_len);
    rdv_unmap(h, RDV_COLL_PAGE);
    return rc;
}

static int valid_shape(uint32_t world, uint32_t rank, uint64_t slot) {
    return world >= 1 && world <= RDV_COLL_MAX_RANKS && rank < world && slot >= RDV_COLL_PAGE &&
           slot % RDV_COLL_PAGE == 0 && slot <= (1ULL << 30);
}

static rdv_group_t *new_handle(uint8_t *base, uint64_t len, int lock_fd, uint32_t world,
                               uint32_t rank, uint64_t slot) {
    rdv_group_t *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->base = base;
    g->len = len;
    g->hdr = (struct rdv_coll_hdr *)base;
    g->ranks = (struct rdv_coll_rank *)(base + RDV_COLL_PAGE);
    g->reasons = base + RDV_COLL_PAGE + ranks_bytes(world);
    g->bufs = g->reasons + reasons_bytes(world);
    g->lock_fd = lock_fd;
    g->world = world;
    g->rank = rank;
    g->slot = slot;
    /* More ranks than CPUs: a rank that spins takes the CPU a laggard needs,
     * so spin only as long as a wake-up takes to start. */
    g->spin_max_ns = world > rdv_cpus() ? RDV_SPIN_MIN_NS : RDV_SPIN_MAX_NS;
    g->spin_ns = g->spin_max_ns < RDV_SPIN_START_NS ? g->spin_max_ns : RDV_SPIN_START_NS;
    g->timeout_ns = -1; /* none, until rdv_coll_set_timeout */
    pthread_mutex_init(&g->abort_lock, NULL);
    return g;
}

uint64_t rdv_coll_segment_bytes(uint32_t world, uint64_t slot_bytes) { return segment_bytes(world, slot_bytes); }

int rdv_coll_creator_alive(int fd, int closed_counts, uint32_t *pid) {
    *pid = 0;
    int locked = rdv_byte_locked_by_other(fd, RDV_COLL_LIVE_BYTE(0));
    uint32_t state = 0;
    if (rdv_file_size(fd) >= (int64_t)(2 * RDV_COLL_PAGE)) {
        int err;
        const uint8_t *p = rdv_map_readonly(fd, 2 * RDV_COLL_PAGE, &err);
        if (p) {
            const struct rdv_coll_rank *r0 = (const struct rdv_coll_rank *)(p + RDV_COLL_PAGE);
            /* relaxed: a pid for a message, written before rank 0's JOINED */
            *pid = READ_ONCE(r0->pid);
            /* acquire: pairs with rdv_coll_leave's release of CLOSED, made
             * before it dropped the lock we found free */
            state = smp_load_acquire(&r0->state);
            rdv_unmap(p, 2 * RDV_COLL_PAGE);
        }
    }
    /* A rank 0 that left normally (CLOSED) was a live member: a caller that
     * has just joined is in its group, not in a killed job's. */
    return locked || (closed_counts && state == RDV_COLL_RANK_CLOSED);
}

/* Map an existing group segment whose header agrees with ours. */
static int attach_map(int fd, uint32_t world, uint64_t slot, const uint8_t *job, uint8_t **base, uint64_t *len) {
    uint64_t want = segment_bytes(world, slot);
    int64_t size = rdv_file_size(fd);
    if (size < 0)
        return (int)size;
    int creator = rdv_byte_locked_by_other(fd, RDV_COLL_LIVE_BYTE(0));
    if ((uint64_t)size < RDV_COLL_PAGE)
        return creator ? -EAGAIN : -EOWNERDEAD;
    int err;
    const struct rdv_coll_hdr *h = rdv_map_readonly(fd, RDV_COLL_PAGE, &err);
    if (!h)
        return err;
    /* acquire: pairs with the creator's release of magic, after the rest */
    uint64_t magic = smp_load_acquire(&h->magic);
    int rc = 0;
    if (magic == 0)
        rc = creator ? -EAGAIN : -EOWNERDEAD;
    else if (magic != RDV_COLL_MAGIC)
        rc = -EPROTO;
    else if (h->version != RDV_COLL_VERSION)
        rc = -EPROTONOSUPPORT;
    else if (memcmp(h->job, job, RDV_COLL_JOB_BYTES) != 0)
        rc = -EREMCHG; /* another job's group: first, as its shape is none of ours */
    else if (h->world != world || h->slot_bytes != slot)
        rc = -EXDEV;
    else if (h->total_bytes != want || (uint64_t)size != want)
        rc = -EBADMSG;
    rdv_unmap(h, RDV_COLL_PAGE);
    if (rc < 0)
        return rc;
    *base = rdv_map(fd, want, 0, &err);
    if (!*base)
        return err;
    *len = want;
    return 0;
}

int rdv_coll_open(int fd, int create, uint32_t world, uint32_t rank, uint64_t slot_bytes,
                  const uint8_t *job, rdv_group_t **out, uint32_t *last) {
    *out = NULL;
    *last = 0;
    if (!valid_shape(world, rank, slot_bytes) || (create && rank != 0))
        return -EINVAL;
    /* Our liveness lock lives on a description of our own (see rdv_reopen),
     * so a child that inherits fd never holds it. */
    int lock_fd = rdv_reopen(fd);
    if (lock_fd < 0)
        return lock_fd;
    uint8_t *base = NULL;
    uint64_t len = segment_bytes(world, slot_bytes);
    int rc;
    if (create) {
        /* Locked before the file has a size: an attacher that finds it
         * empty sees a live creator (-EAGAIN), not a dead one. */
        rc = rdv_byte_lock(lock_fd, RDV_COLL_LIVE_BYTE(0));
        if (rc == 0)
            rc = rdv_file_reserve(fd, len);
        if (rc == 0) {
            int err = 0;
            base = rdv_map(fd, len, RDV_MAP_FRESH, &err);
            rc = base ? 0 : err;
        }
        if (rc == 0) {
            struct rdv_coll_hdr *h = (struct rdv_coll_hdr *)base;
            h->version = RDV_COLL_VERSION;
            h->world = world;
            h->slot_bytes = slot_bytes;
            h->total_bytes = len;
            memcpy(h->job, job, RDV_COLL_JOB_BYTES);
            /* release: the fields above (and the zeroed file) before the magic
             * attachers acquire */
            smp_store_release(&h->magic, RDV_COLL_MAGIC);
        }
    } else {
        rc = attach_map(fd, world, slot_bytes, job, &base, &len);
        if (rc == 0 && rdv_byte_lock(lock_fd, RDV_COLL_LIVE_BYTE(rank)) < 0) {
            /* relaxed: the holder's pid, for the message */
            *last = READ_ONCE(((struct rdv_coll_rank *)(base + RDV_COLL_PAGE))[rank].pid);
            rc = -EBUSY;
        }
    }
    rdv_group_t *g = NULL;
    if (rc == 0) {
        g = new_handle(base, len, lock_fd, world, rank, slot_bytes);
        if (!g)
            rc = -ENOMEM;
    }
    if (rc == 0) {
        struct rdv_coll_rank *me = &g->ranks[rank];
        /* acquire: pairs with the release of JOINED by a previous holder */
        if (smp_load_acquire(&me->state) != RDV_COLL_RANK_FREE) {
            /* a rank that joined once (and died or closed): the group is not ours */
            *last = READ_ONCE(me->pid);
            rc = -EBUSY;
        }
    }
    if (rc < 0) {
        free(g);
        if (base)
            rdv_unmap(base, len);
        rdv_close_fd(lock_fd);
        return rc;
    }
    struct rdv_coll_rank *me = &g->ranks[rank];
    me->pid = (uint32_t)rdv_pid();
    /* release: our pid before the state others acquire */
    smp_store_release(&me->state, RDV_COLL_RANK_JOINED);
    /* Count ourselves in, unless the join was refused: then we stay out
     * (rdv_coll_wait_joined tells the caller why). acquire: pairs with the
     * other joiners' and a refuser's seq_cst CAS */
    uint32_t n = smp_load_acquire(&g->hdr->joined);
    while (!(n & RDV_COLL_REFUSED)) {
        /* seq_cst RMW then the wake: pairs with the sleepers' increment,
         * barrier and re-read in rdv_coll_wait_joined; one word with the
         * refusal bit, so the last join and a refusal cannot both win */
        if (rdv_cas(&g->hdr->joined, &n, n + 1, __ATOMIC_SEQ_CST)) {
            smp_mb();
            /* relaxed, after the barrier: pairs with a sleeper's increment + barrier */
            if (READ_ONCE(g->hdr->join_sleepers))
                rdv_futex_wake_all(&g->hdr->joined);
            *last = n + 1 == world;
            break;
        }
    }
    *out = g;
    return 0;
}

static uint64_t missing_ranks(rdv_group_t *g) {
    uint64_t m = 0;
    for (uint32_t r = 0; r < g->world; r++)
        /* acquire: pairs with the release of JOINED in rdv_coll_open */
        if (smp_load_acquire(&g->ranks[r].state) == RDV_COLL_RANK_FREE)
            m |= 1ULL << r;
    return m;
}

int rdv_coll_wait_joined(rdv_group_t *g, int64_t timeout_ns) {
    struct rdv_coll_status *st = &g->st;
    memset(st, 0, sizeof *st);
    int64_t slice = timeout_ns < 0 || timeout_ns > RDV_COLL_SLICE_NS ? RDV_COLL_SLICE_NS : timeout_ns;
    int64_t until = rdv_now_ns() + slice;
    for (;;) {
        int rc = check_state(g, st);
        if (rc < 0)
            return rc;
        /* acquire: pairs with the joiners' seq_cst CAS, after their slot,
         * and with a refuser's */
        uint32_t seen = smp_load_acquire(&g->hdr->joined);
        if (seen & RDV_COLL_REFUSED) {
            refused_state(g->hdr); /* done already, unless the refuser died first */
            return check_state(g, st);
        }
        if (seen >= g->world)
            return 0;
        for (uint32_t r = 0; r < g->world; r++)
            /* relaxed: a joined slot's state; whether its lock is held decides.
             * Joined re-read after: a group that completed meanwhile is whole
             * (a rank that closed since is found by the next call). */
            if (READ_ONCE(g->ranks[r].state) != RDV_COLL_RANK_FREE && lost(g, r) &&
                (smp_load_acquire(&g->hdr->joined) & ~RDV_COLL_REFUSED) < g->world) {
                declare_lost(g, r);
                return check_state(g, st);
            }
        st->missing = missing_ranks(g);
        int64_t left = until - rdv_now_ns();
        if (left <= 0)
            return -EINPROGRESS;
        /* seq_cst RMW + barrier before the re-read: pairs with the joiner's
         * increment, barrier and read of join_sleepers */
        rdv_fetch_add(&g->hdr->join_sleepers, 1, __ATOMIC_SEQ_CST);
        smp_mb();
        /* relaxed: the re-read after the barrier; the kernel compares again */
        if (READ_ONCE(g->hdr->joined) == seen)
            rdv_futex_wait(&g->hdr->joined, seen, left);
        /* release: done with the word; a joiner that still counts us makes a
         * spare wake syscall, no more */
        rdv_fetch_add(&g->hdr->join_sleepers, (uint32_t)-1, __ATOMIC_RELEASE);
    }
}

/* ---- the phases of each collective ---- */

static int rooted(uint32_t kind) {
    return kind == RDV_COLL_BROADCAST || kind == RDV_COLL_REDUCE || kind == RDV_COLL_GATHER ||
           kind == RDV_COLL_SCATTER || kind == RDV_COLL_SCATTER_META;
}

static int reducing(uint32_t kind) {
    return kind == RDV_COLL_ALLREDUCE || kind == RDV_COLL_REDUCE || kind == RDV_COLL_REDUCE_SCATTER;
}

static uint64_t div_up(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* Plan g->c: element size, region, chunks and phases; -EINVAL if it cannot run. */
static int plan(rdv_group_t *g) {
    const struct rdv_coll_call *c = &g->c;
    uint32_t W = g->world;
    if (c->kind < RDV_COLL_BARRIER || c->kind > RDV_COLL_FAILED)
        return -EINVAL;
    if (rooted(c->kind) && c->root >= W)
        return -EINVAL;
    g->isz = 1;
    g->one_shot = 0;
    g->nchunks = 1;
    if (reducing(c->kind)) {
        if (!rdv_reduce_valid(c->dtype, c->op))
            return -EINVAL;
        g->isz = rdv_dtype_size(c->dtype);
        /* the kernels load and store whole elements: misaligned ones would
         * fault in vector loops (the caller copies into aligned memory) */
        uintptr_t lane = g->isz > 8 ? 8 : g->isz;
        if (((uintptr_t)c->src | (uintptr_t)c->dst) & (lane - 1))
            return -EFAULT;
        if (c->nbytes % g->isz || (c->kind == RDV_COLL_REDUCE_SCATTER && c->nbytes % ((uint64_t)W * g->isz)))
            return -EINVAL;
    }
    /* each peer's share of a buffer, whole elements (and 64-byte multiples
     * where the kind splits by bytes) */
    uint64_t per = g->slot / W;
    g->region = reducing(c->kind) ? per / g->isz * g->isz : per / 64 * 64;
    uint64_t n = c->nbytes;
    switch (c->kind) {
    case RDV_COLL_BARRIER:
        g->nphases = 1;
        break;
    case RDV_COLL_FAILED: /* why, in one buffer */
        if (n > RDV_REASON_MAX || (n && !c->src))
            return -EINVAL;
        g->nphases = 1;
        break;
    case RDV_COLL_ALLREDUCE:
    case RDV_COLL_REDUCE:
        g->one_shot = n <= RDV_COLL_ONE_SHOT_BYTES && n <= g->slot;
        g->nchunks = g->one_shot ? 1 : div_up(n, W * g->region);
        g->nphases = g->one_shot ? 1 : (uint32_t)g->nchunks + 1;
        break;
    case RDV_COLL_REDUCE_SCATTER:
        g->nchunks = n ? div_up(n / W, g->region) : 1;
        g->nphases = (uint32_t)g->nchunks;
        break;
    case RDV_COLL_BROADCAST:
    case RDV_COLL_SCATTER_META:
    case RDV_COLL_ALLGATHER:
    case RDV_COLL_GATHER:
        g->nchunks = n ? div_up(n, g->slot) : 1;
        g->nphases = (uint32_t)g->nchunks;
        break;
    case RDV_COLL_SCATTER:
    case RDV_COLL_ALLTOALL:
        g->nchunks = n ? div_up(n, g->region) : 1;
        g->nphases = (uint32_t)g->nchunks;
        break;
    }
    if (g->nchunks > (1u << 30))
        return -EINVAL;
    return 0;
}

/* Chunk i of a reduction: elements [*off, *off + *count). */
static void reduce_chunk(const rdv_group_t *g, uint64_t i, uint64_t *off, uint64_t *count) {
    uint64_t n = g->c.nbytes / g->isz, per = g->world * (g->region / g->isz);
    *off = i * per;
    *count = n - *off < per ? n - *off : per;
}

/* Rank j's slice of a chunk of count elements: [lo, hi). */
static void slice(const rdv_group_t *g, uint64_t count, uint32_t j, uint64_t *lo, uint64_t *hi) {
    *lo = count * j / g->world;
    *hi = count * (j + 1) / g->world;
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Bytes [at, at + len) of chunk i, chunks of size `size`, of a total of n. */
static uint64_t piece(uint64_t i, uint64_t size, uint64_t n, uint64_t *at) {
    *at = i * size;
    return *at < n ? min_u64(size, n - *at) : 0;
}

static void produce(rdv_group_t *g, uint32_t P, uint32_t i) {
    const struct rdv_coll_call *c = &g->c;
    const uint8_t *src = c->src;
    uint32_t W = g->world, me = g->rank;
    uint8_t *mine = buf(g, me, P);
    uint64_t at, len, N = c->nbytes;
    if (i == 0) {
        struct rdv_coll_desc *d = &g->ranks[me].desc[P & 1];
        d->what = c->kind | c->op << 8 | c->dtype << 16;
        d->root = c->root;
        d->nbytes = c->nbytes;
        d->shape_hash = c->shape_hash;
    }
    if (W == 1)
        return;
    switch (c->kind) {
    case RDV_COLL_ALLREDUCE:
    case RDV_COLL_REDUCE:
        if (g->one_shot) {
            memcpy(mine, src, N);
        } else if (i < g->nchunks) {
            uint64_t off, count, lo, hi;
            reduce_chunk(g, i, &off, &count);
            for (uint32_t j = 0; j < W; j++) {
                if (j == me)
                    continue;
                slice(g, count, j, &lo, &hi);
                memcpy(mine + j * g->region, src + (off + lo) * g->isz, (hi - lo) * g->isz);
            }
        }
        break;
    case RDV_COLL_REDUCE_SCATTER:
        len = piece(i, g->region, N / W, &at);
        for (uint32_t j = 0; j < W; j++)
            if (j != me)
                memcpy(mine + j * g->region, src + j * (N / W) + at, len);
        break;
    case RDV_COLL_BROADCAST:
    case RDV_COLL_SCATTER_META:
        if (me == c->root && (len = piece(i, g->slot, N, &at)))
            memcpy(mine, src + at, len);
        break;
    case RDV_COLL_ALLGATHER:
    case RDV_COLL_GATHER:
        if ((c->kind == RDV_COLL_ALLGATHER || me != c->root) && (len = piece(i, g->slot, N, &at)))
            memcpy(mine, src + at, len);
        break;
    case RDV_COLL_SCATTER:
    case RDV_COLL_ALLTOALL:
        if (c->kind == RDV_COLL_SCATTER && me != c->root)
            break;
        len = piece(i, g->region, N, &at);
        for (uint32_t j = 0; j < W; j++)
            if (j != me)
                memcpy(mine + j * g->region, src + j * N + at, len);
        break;
    case RDV_COLL_FAILED: /* read by the others when they find our descriptor (note_failed) */
        memcpy(mine, src, N);
        break;
    }
}

static void consume(rdv_group_t *g, uint32_t P, uint32_t i) {
    const struct rdv_coll_call *c = &g->c;
    const uint8_t *src = c->src;
    uint8_t *dst = c->dst;
    uint32_t W = g->world, me = g->rank;
    uint64_t at, len, N = c->nbytes;
    const void *srcs[RDV_COLL_MAX_RANKS];
    switch (c->kind) {
    case RDV_COLL_ALLREDUCE:
    case RDV_COLL_REDUCE: {
        int keep = c->kind == RDV_COLL_ALLREDUCE || me == c->root;
        uint64_t n = N / g->isz;
        if (g->one_shot) {
            for (uint32_t j = 0; j < W; j++)
                srcs[j] = j == me ? (const void *)src : buf(g, j, P);
            if (keep)
                rdv_reduce(dst, NULL, srcs, W, n, c->dtype, c->op);
            break;
        }
        uint64_t off, count, lo, hi;
        if (i >= 1 && keep) { /* the others' reduced slices of chunk i - 1 */
            reduce_chunk(g, i - 1, &off, &count);
            for (uint32_t j = 0; j < W; j++) {
                if (j == me)
                    continue;
                slice(g, count, j, &lo, &hi);
                memcpy(dst + (off + lo) * g->isz, buf(g, j, P) + j * g->region, (hi - lo) * g->isz);
            }
        }
        if (i < g->nchunks) { /* our slice of chunk i, shared in our parity P + 1 buffer */
            reduce_chunk(g, i, &off, &count);
            slice(g, count, me, &lo, &hi);
            for (uint32_t j = 0; j < W; j++)
                srcs[j] = j == me ? (const void *)(src + (off + lo) * g->isz) : buf(g, j, P) + me * g->region;
            rdv_reduce(keep ? dst + (off + lo) * g->isz : NULL, W > 1 ? buf(g, me, P + 1) + me * g->region : NULL,
                       srcs, W, hi - lo, c->dtype, c->op);
        }
        break;
    }
    case RDV_COLL_REDUCE_SCATTER:
        len = piece(i, g->region, N / W, &at);
        for (uint32_t j = 0; j < W; j++)
            srcs[j] = j == me ? (const void *)(src + me * (N / W) + at) : buf(g, j, P) + me * g->region;
        rdv_reduce(dst + at, NULL, srcs, W, len / g->isz, c->dtype, c->op);
        break;
    case RDV_COLL_BROADCAST:
    case RDV_COLL_SCATTER_META:
        if ((len = piece(i, g->slot, N, &at)) && dst && (me != c->root || dst != src))
            memcpy(dst + at, me == c->root ? src + at : buf(g, c->root, P), len);
        break;
    case RDV_COLL_ALLGATHER:
    case RDV_COLL_GATHER:
        if ((c->kind == RDV_COLL_ALLGATHER || me == c->root) && (len = piece(i, g->slot, N, &at)))
            for (uint32_t j = 0; j < W; j++)
                memcpy(dst + j * N + at, j == me ? src + at : buf(g, j, P), len);
        break;
    case RDV_COLL_SCATTER:
        if ((len = piece(i, g->region, N, &at)))
            memcpy(dst + at, me == c->root ? src + me * N + at : buf(g, c->root, P) + me * g->region, len);
        break;
    case RDV_COLL_ALLTOALL:
        if ((len = piece(i, g->region, N, &at)))
            for (uint32_t j = 0; j < W; j++)
                memcpy(dst + j * N + at, j == me ? src + me * N + at : buf(g, j, P) + me * g->region, len);
        break;
    }
}

/* ---- waiting for the other ranks ---- */

static int behind(const rdv_group_t *g, uint32_t r, uint32_t target) {
    /* acquire: pairs with the release store of arrive in publish, so the
     * rank's parity-P buffer and descriptor are readable once it is past */
    return (int32_t)(smp_load_acquire(&g->ranks[r].arrive) - target) < 0;
}

static int first_behind(const rdv_group_t *g, uint32_t target) {
    for (uint32_t r = 0; r < g->world; r++)
        if (r != g->rank && behind(g, r, target))
            return (int)r;
    return -1;
}

static void publish(rdv_group_t *g, uint32_t P) {
    struct rdv_coll_rank *me = &g->ranks[g->rank];
    WRITE_ONCE(me->cpu, rdv_cpu() + 1); /* relaxed: a hint for spinners */
    /* release: our parity-P buffer and descriptor before the count that
     * says they are ready (acquired in behind) */
    smp_store_release(&me->arrive, P + 1);
    /* full barrier, then sleepers: pairs with the waiter's increment,
     * barrier and re-read of arrive in wait_all */
    smp_mb();
    if (READ_ONCE(me->sleepers))
        rdv_futex_wake_all(&me->arrive);
}

static int spin_for(rdv_group_t *g, uint32_t r, uint32_t target, int64_t budget, struct rdv_spin *spin) {
    rdv_spin_begin(spin, rdv_now_ns());
    for (;;) {
        for (int k = 0; k < RDV_SPIN_CHECK_EVERY; k++) {
            /* relaxed: a hint to stop spinning; behind() re-reads with acquire */
            if ((int32_t)(READ_ONCE(g->ranks[r].arrive) - target) >= 0)
                return 1;
            rdv_cpu_relax();
        }
        /* relaxed: a hint to stop spinning; wait_all's check_state acquires */
        if (READ_ONCE(g->hdr->state) != RDV_COLL_RUNNING || !rdv_spin_on(spin, budget))
            return 0;
    }
}

/* Wait until every rank has arrived at phase P: 0; -EINPROGRESS when a
 * slice ended first; -ETIMEDOUT (st->missing), -EPIPE, -ECONNABORTED. */
static int wait_all(rdv_group_t *g, uint32_t P, struct rdv_coll_status *st) {
    uint32_t target = P + 1;
    int64_t entered = rdv_now_ns();
    for (;;) {
        int lag = first_behind(g, target);
        if (lag < 0) {
            /* a wait that slept but ended soon: a longer spin would have caught it */
            int64_t waited = rdv_now_ns() - g->wait_from;
            if (g->spun == 3)
                ; /* the spin was cut short (crowded): nothing learned about its budget */
            else if (g->spun == 2 && waited < RDV_SPIN_MAX_NS && g->spin_ns < g->spin_max_ns)
                g->spin_ns *= 2;
            else if (waited > 16 * RDV_SPIN_MAX_NS && g->spin_ns > RDV_SPIN_MIN_NS)
                g->spin_ns /= 2;
            return 0;
        }
        int rc = check_state(g, st);
        if (rc < 0)
            return rc;
        int64_t now = rdv_now_ns();
        if (!g->forever && now >= g->deadline) {
            st->missing = 0;
            for (uint32_t r = 0; r < g->world; r++)
                if (r != g->rank && behind(g, r, target))
                    st->missing |= 1ULL << r;
            return -ETIMEDOUT;
        }
        struct rdv_coll_rank *lr = &g->ranks[lag];
        if (!g->spun) {
            g->spun = 1;
            /* relaxed: a hint; a laggard on our CPU cannot run while we spin */
            int same_cpu = READ_ONCE(lr->cpu) == rdv_cpu() + 1;
            int64_t budget = same_cpu ? 0 : g->spin_ns;
            if (!g->forever && g->deadline - now < budget)
                budget = g->deadline - now;
            struct rdv_spin spin = {0};
            if (budget > 0 && spin_for(g, (uint32_t)lag, target, budget, &spin))
                continue;
            if (spin.crowded)
                g->spun = 3; /* what follows says nothing about the budget */
        }
        if (g->spun == 1)
            g->spun = 2;
        int64_t left = RDV_COLL_SLICE_NS - (now - entered);
        if (!g->forever && g->deadline - now < left)
            left = g->deadline - now;
        if (left > 0) {
            /* seq_cst RMW + barrier before the re-read: pairs with the
             * barrier between publish's store of arrive and its read of
             * sleepers */
            rdv_fetch_add(&lr->sleepers, 1, __ATOMIC_SEQ_CST);
            smp_mb();
            /* relaxed: the re-read after the barrier; the kernel compares again */
            uint32_t seen = READ_ONCE(lr->arrive);
            if ((int32_t)(seen - target) < 0 && READ_ONCE(g->hdr->state) == RDV_COLL_RUNNING)
                rdv_futex_wait(&lr->arrive, seen, left);
            /* release: done with the word; a waker that still counts us makes
             * one spare wake syscall. One that dies asleep leaves sleepers one
             * high: spare wakes, never a missed one. */
            rdv_fetch_add(&lr->sleepers, (uint32_t)-1, __ATOMIC_RELEASE);
        }
        /* woken, or the slice ran out: is anyone we wait for gone? */
        for (uint32_t r = 0; r < g->world; r++)
            /* behind again after lost: a rank that arrived, finished and
             * closed between the first look and the lock query took part */
            if (r != g->rank && behind(g, r, target) && lost(g, r) && behind(g, r, target)) {
                declare_lost(g, r);
                return check_state(g, st);
            }
        if (rdv_now_ns() - entered >= RDV_COLL_SLICE_NS)
            return -EINPROGRESS;
    }
}

/* The descriptors of the call that began at phase P: the first rank whose
 * call differs from ours, or -1. */
static int differs(rdv_group_t *g, uint32_t P, struct rdv_coll_status *st) {
    const struct rdv_coll_desc *mine = &g->ranks[g->rank].desc[P & 1];
    for (uint32_t r = 0; r < g->world; r++) {
        /* plain reads: published by the release of arrive that behind() acquired */
        const struct rdv_coll_desc *d = &g->ranks[r].desc[P & 1];
        if (d->what != mine->what || d->root != mine->root || d->nbytes != mine->nbytes ||
            d->shape_hash != mine->shape_hash) {
            st->rank = r;
            st->kind = d->what & 0xff;
            st->op = d->what >> 8 & 0xff;
            st->dtype = d->what >> 16 & 0xff;
            st->root = d->root;
            st->nbytes = d->nbytes;
            st->shape_hash = d->shape_hash;
            return (int)r;
        }
    }
    return -1;
}

/* After a mismatch at phase P: if a rank other than us made a call it
 * could not (RDV_COLL_FAILED), name it in st rather than the first rank
 * that differs, and keep why it failed. Its parity-P buffer is rewritten
 * only in phase P + 2, after we have arrived at P + 1: read it now. */
static void note_failed(rdv_group_t *g, uint32_t P, struct rdv_coll_status *st) {
    g->failed_len = 0;
    for (uint32_t r = 0; r < g->world; r++) {
        /* plain reads: published by the release of arrive that behind() acquired */
        const struct rdv_coll_desc *d = &g->ranks[r].desc[P & 1];
        if (r == g->rank || (d->what & 0xff) != RDV_COLL_FAILED)
            continue;
        st->rank = r;
        st->kind = RDV_COLL_FAILED;
        st->op = d->what >> 8 & 0xff;
        st->dtype = st->root = 0;
        st->nbytes = d->nbytes;
        st->shape_hash = d->shape_hash;
        g->failed_len = (uint32_t)(d->nbytes < RDV_REASON_MAX ? d->nbytes : RDV_REASON_MAX);
        memcpy(g->failed_why, buf(g, r, P), g->failed_len);
        return;
    }
}

/* A rank that gives up mid-call has published some of the call's phases
 * and not the rest: the others would wait for it, or read buffers it goes
 * on to rewrite. So a timeout aborts the group, saying who was missing. */
static void abort_timed_out(rdv_group_t *g, uint64_t missing) {
    static const char *const kinds[] = {"", "barrier", "allreduce", "broadcast", "allgather", "reduce_scatter",
                                        "reduce", "gather", "scatter", "alltoall", "scatter"};
    uint32_t kind = g->c.kind == RDV_COLL_FAILED ? g->c.op : g->c.kind; /* the call it stood for */
    char reason[RDV_REASON_MAX];
    size_t cap = sizeof reason - 48, n = 0; /* room for the tail */
    n += (size_t)snprintf(reason, cap, "rank %u gave up waiting in %s after %.3g s: ranks [", g->rank,
                          kind < sizeof kinds / sizeof *kinds ? kinds[kind] : "collective",
                          (double)g->timeout_ns / 1e9);
    const char *sep = "";
    for (uint32_t r = 0; r < g->world && n < cap; r++)
        if (missing >> r & 1) {
            n += (size_t)snprintf(reason + n, cap - n, "%s%u", sep, r);
            sep = ", ";
        }
    n = n < cap ? n : cap;
    n += (size_t)snprintf(reason + n, sizeof reason - n, "] had not arrived");
    rdv_coll_abort_timed_out(g, reason, (uint32_t)(n < sizeof reason ? n : sizeof reason - 1), missing);
}

static void end_call(rdv_group_t *g) {
    /* release, process-local: our work on the call before the next thread's */
    smp_store_release(&g->busy, 0);
}

static int advance(rdv_group_t *g, struct rdv_coll_status *st) {
    while (g->phase < g->nphases) {
        uint32_t P = g->p0 + g->phase;
        if (!g->produced) {
            produce(g, P, g->phase);
            publish(g, P);
            g->produced = 1;
            g->spun = 0;
            g->wait_from = rdv_now_ns();
        }
        int rc = wait_all(g, P, st);
        if (rc == -EINPROGRESS)
            return rc;
        if (rc == -ETIMEDOUT)
            abort_timed_out(g, st->missing); /* half a call done: nobody may go on */
        if (rc < 0) {
            end_call(g); /* the group is broken; nothing to resume */
            return rc;
        }
        if (g->phase == 0 && differs(g, P, st) >= 0) {
            /* every rank sees the same descriptors, so every rank stops here */
            note_failed(g, P, st);
            g->next = P + 1;
            end_call(g);
            return -EBADE;
        }
        consume(g, P, g->phase);
        g->phase++;
        g->produced = 0;
    }
    g->next = g->p0 + g->nphases;
    end_call(g);
    return 0;
}

static int run(rdv_group_t *g, uint64_t what, uint64_t nbytes, uint64_t shape_hash, const void *src, void *dst) {
    struct rdv_coll_status *st = &g->st;
    int rc = check_state(g, st); /* first: a broken group says why, whatever was left running */
    if (rc < 0)
        return rc;
    /* acquire, process-local: one call per handle at a time; pairs with end_call */
    if (rdv_exchange(&g->busy, 1, __ATOMIC_ACQUIRE))
        return -EALREADY;
    g->owner = pthread_self();
    struct rdv_coll_call *c = &g->c;
    c->kind = what & 0xff;
    c->op = what >> 8 & 0xff;
    c->dtype = what >> 16 & 0xff;
    c->root = (uint32_t)(what >> 32);
    c->nbytes = nbytes;
    c->shape_hash = shape_hash;
    c->src = src;
    c->dst = dst;
    if ((rc = plan(g)) < 0) {
        end_call(g);
        return rc;
    }
    g->forever = g->timeout_ns < 0 || g->timeout_ns >= RDV_FOREVER_NS;
    g->deadline = g->forever ? 0 : rdv_now_ns() + g->timeout_ns;
    g->p0 = g->next;
    g->phase = 0;
    g->produced = 0;
    return advance(g, st);
}

int rdv_coll_run(rdv_group_t *g, uint64_t what, uint64_t nbytes, uint64_t shape_hash, const void *src,
                 void *dst) {
    return run(g, what, nbytes, shape_hash, src, dst);
}

int rdv_coll_barrier(rdv_group_t *g) { return run(g, RDV_COLL_BARRIER, 0, 0, NULL, NULL); }

int rdv_coll_resume(rdv_group_t *g) {
    /* relaxed, process-local: the caller is the thread whose call it is */
    if (!READ_ONCE(g->busy))
        return -EINVAL;
    return advance(g, &g->st);
}

void rdv_coll_status(rdv_group_t *g, struct rdv_coll_status *out) { *out = g->st; }

int rdv_coll_mine(rdv_group_t *g) {
    /* acquire, process-local: pairs with run's exchange, so owner is ours to read */
    return smp_load_acquire(&g->busy) && pthread_equal(g->owner, pthread_self());
}

void rdv_coll_set_timeout(rdv_group_t *g, int64_t timeout_ns) { g->timeout_ns = timeout_ns; }

/* Abort as this rank, with reason; flags RDV_COLL_FLAG_TIMED_OUT and the
 * ranks it waited for when it gave up at its timeout. */
static int abort_as(rdv_group_t *g, const char *reason, uint32_t reason_len, uint32_t flags, uint64_t missing) {
    if (g->lock_fd < 0)
        return -EBADF; /* a forked child's copy */
    if (reason_len > RDV_REASON_MAX)
        return -EINVAL;
    pthread_mutex_lock(&g->abort_lock);
    /* relaxed: our reason area; published by the release CAS in set_broken */
    if (READ_ONCE(g->hdr->state) == RDV_COLL_RUNNING) {
        memcpy(reason_of(g, g->rank), reason, reason_len);
        /* relaxed: published with the text by set_broken's release CAS */
        WRITE_ONCE(*reason_len_of(g, g->rank), reason_len);
        WRITE_ONCE(*missing_of(g, g->rank), missing); /* relaxed: likewise */
        set_broken(g, RDV_COLL_ABORTED | g->rank << 8 | flags << 16);
    }
    pthread_mutex_unlock(&g->abort_lock);
    return 0;
}

int rdv_coll_abort(rdv_group_t *g, const char *reason, uint32_t reason_len) {
    return abort_as(g, reason, reason_len, 0, 0);
}

int rdv_coll_abort_timed_out(rdv_group_t *g, const char *reason, uint32_t reason_len, uint64_t missing) {
    return abort_as(g, reason, reason_len, RDV_COLL_FLAG_TIMED_OUT, missing);
}

int rdv_coll_failed_why(rdv_group_t *g, char *out, uint32_t cap, uint32_t *len) {
    *len = 0;
    if (g->st.kind != RDV_COLL_FAILED)
        return -EINVAL;
    *len = g->failed_len < cap ? g->failed_len : cap;
    memcpy(out, g->failed_why, *len);
    return 0;
}

int rdv_coll_reason(rdv_group_t *g, char *out, uint32_t cap, uint32_t *len) {
    /* acquire: pairs with the release CAS in set_broken and refused_state */
    uint32_t state = smp_load_acquire(&g->hdr->state);
    *len = 0;
    if ((state & 0xff) != RDV_COLL_ABORTED)
        return -EINVAL;
    uint32_t r = state >> 8 & 0xff;
    if (r == RDV_COLL_OUTSIDER) {
        /* acquire: pairs with the refuser's release of PUBLISHED, after its text */
        if (smp_load_acquire(&g->hdr->outsider_claim) != RDV_COLL_CLAIM_PUBLISHED)
            return -ENODATA; /* refused by one that could not say why */
        uint32_t n = READ_ONCE(g->hdr->outsider_len); /* relaxed: published by the claim */
        if (n > RDV_REASON_MAX)
            return -EBADMSG; /* a length read from shared memory, checked */
        n = n < cap ? n : cap;
        memcpy(out, g->hdr->outsider_reason, n);
        *len = n;
        return 0;
    }
    if (r >= g->world)
        return -EBADMSG;
    /* relaxed: written before the state CAS this function acquired */
    uint32_t n = READ_ONCE(*reason_len_of(g, r));
    if (n > RDV_REASON_MAX)
        return -EBADMSG; /* a length read from shared memory, checked */
    n = n < cap ? n : cap;
    memcpy(out, reason_of(g, r), n);
    *len = n;
    return 0;
}

uint32_t rdv_coll_pid(rdv_group_t *g, uint32_t rank) {
    /* relaxed: a pid for messages */
    return rank < g->world ? READ_ONCE(g->ranks[rank].pid) : 0;
}

void rdv_coll_leave(rdv_group_t *g) {
    if (g->inert)
        return;
    /* relaxed, process-local: read by check_state in a call of another thread */
    WRITE_ONCE(g->inert, 1);
    /* release: others that find our lock free read CLOSED (declare_lost) */
    smp_store_release(&g->ranks[g->rank].state, RDV_COLL_RANK_CLOSED);
    /* The byte only: the description stays open until rdv_coll_free, as a
     * running call of another thread may still look at others' bytes. */
    rdv_byte_unlock(g->lock_fd, RDV_COLL_LIVE_BYTE(g->rank));
    /* whoever waits on us looks at our lock now, not at its slice's end */
    rdv_futex_wake_all(&g->ranks[g->rank].arrive);
}

void rdv_coll_free(rdv_group_t *g) {
    rdv_coll_leave(g);
    if (g->lock_fd >= 0)
        rdv_close_fd(g->lock_fd);
    rdv_unmap(g->base, g->len);
    pthread_mutex_destroy(&g->abort_lock);
    free(g);
}

void rdv_coll_forget(rdv_group_t *g) {
    if (g->lock_fd >= 0)
        rdv_close_fd(g->lock_fd); /* our copy of the description: the parent keeps its own */
    g->lock_fd = -1;
    WRITE_ONCE(g->inert, 1);
}
