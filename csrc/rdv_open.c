/* Layer 9: opening and closing handles (see rdv_open.h). */
#include <errno.h>
#include <pthread.h>
#include <unistd.h>

#include "rdv_arena.h"
#include "rdv_atomic.h"
#include "rdv_live.h"
#include "rdv_open.h"
#include "rdv_os.h"
#include "rdv_recover.h"
#include "rdv_segment.h"
#include "rdv_waiter.h"

static const struct rdv_ops default_ops = {
    .alive = rdv_live_alive,
    .dead_holder = rdv_recover_dead_holder,
    .reclaim_dead = rdv_recover_reclaim_hook,
};

/* Claim an entry, reclaiming the dead on the way (attaching is when the
 * dead get noticed); into a full table, reclaim the dead as each of them. */
static int register_handle(rdv_t *h) {
    h->ops = default_ops;
    int rc = rdv_live_claim(h);
    h->acting = rc < 0;
    rdv_recover_dead(h, NULL);
    if (rc < 0)
        rc = rdv_live_claim(h);
    h->acting = 0;
    if (rc == 0)
        rdv_arena_forget_wants(h, h->me); /* clear already, unless damaged */
    return rc;
}

/* Mapped handles, for the fork child (forget_inherited): process-local. */
static pthread_mutex_t mapped_lock = PTHREAD_MUTEX_INITIALIZER;
static rdv_t *mapped;

/* The handle's lock description is opened and the handle listed in one
 * hold of mapped_lock, which a fork waits for: a child never inherits a
 * lock description that forget_inherited does not know of. */
static int add_mapped(rdv_t *h, int fd) {
    pthread_mutex_lock(&mapped_lock);
    int rc = rdv_segment_lock_fd(h, fd);
    if (rc == 0) {
        h->prev_mapped = NULL;
        h->next_mapped = mapped;
        if (mapped)
            mapped->prev_mapped = h;
        mapped = h;
    }
    pthread_mutex_unlock(&mapped_lock);
    return rc;
}

static void drop_mapped(rdv_t *h) {
    pthread_mutex_lock(&mapped_lock);
    if (h->prev_mapped)
        h->prev_mapped->next_mapped = h->next_mapped;
    else
        mapped = h->next_mapped;
    if (h->next_mapped)
        h->next_mapped->prev_mapped = h->prev_mapped;
    pthread_mutex_unlock(&mapped_lock);
}

/* Before the lock byte of our entry is taken: a fork from then on must find
 * the handle in the list. */
static int open_done(rdv_t *h, int fd) {
    int rc = add_mapped(h, fd);
    if (rc < 0) {
        rdv_segment_discard(h);
        return rc;
    }
    rc = register_handle(h);
    if (rc < 0) {
        drop_mapped(h);
        rdv_segment_discard(h);
    }
    return rc;
}

int rdv_create(int fd, uint64_t arena_size, uint64_t max_keys, rdv_t **out) {
    return rdv_create_flags(fd, arena_size, max_keys, 0, out);
}

int rdv_create_flags(int fd, uint64_t arena_size, uint64_t max_keys, uint32_t flags, rdv_t **out) {
    int rc = rdv_segment_create(fd, arena_size, max_keys, flags, out);
    if (rc < 0)
        return rc;
    rdv_arena_init(*out);
    rdv_segment_publish(*out, fd);
    return open_done(*out, fd);
}

int rdv_attach(int fd, rdv_t **out) {
    int rc = rdv_segment_attach(fd, out);
    if (rc < 0)
        return rc;
    return open_done(*out, fd);
}

int rdv_segment_in_use(int fd) {
    /* a byte per process entry, then the creator's (rdv_layout.h) */
    return rdv_bytes_locked_by_other(fd, 0, RDV_CREATOR_LOCK_BYTE + 1);
}

/* Closed handles stay allocated (see rdv_get) and reachable from here. */
static rdv_t *retired;

void rdv_close(rdv_t *h) {
    uint32_t open_ = 0;
    /* process-local, relaxed: only makes close idempotent; rdv_put orders the unmap */
    if (h && rdv_cas(&h->closed, &open_, 1, __ATOMIC_RELAXED)) {
        h->next_retired = rdv_exchange(&retired, h, __ATOMIC_RELAXED);
        rdv_put(h);
    }
}

uint64_t rdv_capacity(rdv_t *h) { return h->cap; }

int rdv_lock_fd(rdv_t *h) { return h->fd; }

/* This process's pid, kept current across fork without a syscall per call. */
static pid_t current_pid;

static void refresh_pid(void) { current_pid = rdv_pid(); }

static void before_fork(void) { pthread_mutex_lock(&mapped_lock); }

static void after_fork_in_parent(void) { pthread_mutex_unlock(&mapped_lock); }

/* Every handle in a fork child is its parent's: the child must not keep the
 * parent's liveness, which lives on the handles' lock file descriptions
 * (shared across fork) and would outlive the parent while the child runs. */
static void forget_inherited(void) {
    refresh_pid();
    for (rdv_t *h = mapped; h; h = h->next_mapped)
        rdv_segment_drop_locks(h);
    mapped = NULL;
    pthread_mutex_unlock(&mapped_lock);
}

__attribute__((constructor)) static void watch_forks(void) {
    refresh_pid();
    pthread_atfork(before_fork, after_fork_in_parent, forget_inherited);
}

/* A handle inherited through fork belongs to the parent: its entry, its
 * views and its locks are the parent's, so the child must not use, release
 * or unregister any of them (it attaches a handle of its own instead). */
int rdv_forked(const rdv_t *h) { return h->pid != current_pid; }

int rdv_damaged(const rdv_t *h) { return READ_ONCE(h->damaged) != 0; } /* relaxed: see rdv_segment.c */

int rdv_get(rdv_t *h) {
    if (rdv_forked(h))
        return -EBADF;
    if (rdv_damaged(h))
        return -EFBIG;
    /* process-local count; relaxed: the mapping it protects was set up before
     * the handle was handed out */
    int64_t r = READ_ONCE(h->refs);
    do {
        if (r == 0)
            return -EBADF; /* closed and unmapped */
    } while (!rdv_cas(&h->refs, &r, r + 1, __ATOMIC_ACQUIRE));
    return 0;
}

void rdv_put(rdv_t *h) {
    if (rdv_forked(h))
        return; /* the parent's: leave its entry, views and blocks alone */
    /* acq_rel: every access through the mapping happens before the unmap;
     * the old value 1 means this was the last reference */
    if (rdv_fetch_add(&h->refs, -1, __ATOMIC_ACQ_REL) == 1) {
        if (!rdv_damaged(h)) /* a cut segment is not walked */
            rdv_recover_own(h); /* frees our waiter slabs too */
        rdv_waiter_pool_drop(h);
        rdv_live_release(h);
        drop_mapped(h);
        rdv_segment_unmap(h);
    }
}

void rdv_unref(rdv_t *h) { rdv_put(h); }
