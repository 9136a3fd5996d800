/* Creating, validating and mapping a rendezvous segment. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rdv_atomic.h"
#include "rdv_layout.h"

#define RDV_INITIAL_SPIN_NS 50000
#define RDV_MAX_KEYS (1u << 24)

static uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

struct layout {
    uint64_t slots, procs_off, index_off, side_off, arena_off, arena_size, total;
};

static void plan(struct layout *l, uint64_t arena_size, uint64_t slots) {
    l->slots = slots;
    l->arena_size = arena_size;
    l->procs_off = RDV_PAGE;
    l->index_off = l->procs_off + RDV_MAX_PROCS * sizeof(struct rdv_proc);
    l->side_off = l->index_off + round_up(slots * sizeof(struct rdv_slot), RDV_PAGE);
    l->arena_off = l->side_off + round_up(arena_size / RDV_GRANULE * 4, RDV_PAGE);
    l->total = l->arena_off + arena_size;
}

/* Map the segment with the arena mirrored right after it, so that a block
 * running past the arena's end stays contiguous in our address space. */
static int map_segment(int fd, const struct layout *l, rdv_t **out) {
    size_t len = l->total + l->arena_size;
    uint8_t *base = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return -errno;
    /* MAP_POPULATE: a first touch of a shared page costs ~8x a copy into it,
     * so take the faults here, once, not on the data path. The mirror too:
     * block offsets drift, so over time blocks run past the end everywhere. */
    int flags = MAP_SHARED | MAP_FIXED | MAP_POPULATE;
    if (mmap(base, l->total, PROT_READ | PROT_WRITE, flags, fd, 0) == MAP_FAILED ||
        mmap(base + l->total, l->arena_size, PROT_READ | PROT_WRITE, flags, fd,
             (off_t)l->arena_off) == MAP_FAILED) {
        int err = errno;
        munmap(base, len);
        return -err;
    }
    rdv_t *h = calloc(1, sizeof *h);
    if (!h) {
        munmap(base, len);
        return -ENOMEM;
    }
    h->base = base;
    h->map_len = len;
    h->khdr = (struct rdv_header *)base;
    h->kslots = (struct rdv_slot *)(base + l->index_off);
    h->kprocs = (struct rdv_proc *)(base + l->procs_off);
    h->kside = (uint32_t *)(base + l->side_off);
    h->karena = base + l->arena_off;
    h->cap = l->arena_size;
    h->slot_mask = l->slots - 1;
    h->spin_ns = RDV_INITIAL_SPIN_NS;
    h->refs = 1;
    h->pid = getpid();
    pthread_mutex_init(&h->op_lock, NULL);
    pthread_mutex_init(&h->mark_lock, NULL);
    /* our own descriptor: it carries our process-table byte lock */
    h->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (h->fd < 0) {
        int err = errno;
        munmap(base, len);
        free(h);
        return -err;
    }
    *out = h;
    return 0;
}

static void unmap(rdv_t *h) {
    munmap(h->base, h->map_len);
    close(h->fd);
}

/* Check what the running state of a segment says before trusting it: ring
 * positions, islands, key slots and process entries must all be in range
 * (they are at every instant, however busy the segment; only damage breaks
 * them). Offsets and lengths are checked again wherever they are used. */
static int validate_state(rdv_t *h) {
    struct rdv_header *khdr = h->khdr;
    uint64_t hd, t;
    for (int tries = 0;; tries++) {
        /* acquire/relaxed: head, tail, head again, so the pair is consistent */
        hd = smp_load_acquire(&khdr->c_head);
        t = READ_ONCE(khdr->p_tail);
        if (smp_load_acquire(&khdr->c_head) == hd)
            break;
        if (tries == 100)
            return -EBADMSG;
    }
    if (t - hd > h->cap || hd % RDV_GRANULE || t % RDV_GRANULE)
        return -EBADMSG;
    for (int i = 0; i < RDV_MAX_ISLANDS; i++) {
        uint64_t w = READ_ONCE(khdr->islands[i]); /* relaxed: range checks, as below */
        uint64_t off = rdv_island_off(w), len = rdv_island_len(w);
        if (w && ((w & ~RDV_ISLAND_VALID) >> 60 || !(w & RDV_ISLAND_VALID) || off >= h->cap ||
                  len == 0 || len > h->cap))
            return -EBADMSG;
    }
    uint64_t granules = h->cap / RDV_GRANULE;
    for (uint64_t i = 0; i <= h->slot_mask; i++) {
        const struct rdv_slot *s = &h->kslots[i];
        /* relaxed: range checks that hold whatever moment they are read at */
        if (READ_ONCE(s->state) > RDV_SLOT_TOMB || READ_ONCE(s->key_len) > RDV_KEY_MAX ||
            READ_ONCE(s->q_head) > granules || READ_ONCE(s->q_tail) > granules ||
            READ_ONCE(s->max_probe) > h->slot_mask || READ_ONCE(s->lock) > RDV_MAX_PROCS ||
            READ_ONCE(s->ins_lock) > RDV_MAX_PROCS)
            return -EBADMSG;
    }
    for (uint32_t i = 0; i < RDV_MAX_PROCS; i++) /* relaxed: range checks */
        if (READ_ONCE(h->kprocs[i].state) > RDV_PROC_RECLAIMING ||
            READ_ONCE(h->kprocs[i].mark_state) > RDV_MAX_MARKS)
            return -EBADMSG;
    return 0;
}

int rdv_create(int fd, uint64_t arena_size, uint64_t max_keys, rdv_t **out) {
    if (arena_size == 0 || arena_size > RDV_MAX_ARENA || max_keys == 0 || max_keys > RDV_MAX_KEYS)
        return -EINVAL;
    uint64_t slots = 64;
    while (slots < 2 * max_keys) /* load factor at most 1/2 */
        slots *= 2;
    struct layout l;
    plan(&l, round_up(arena_size, RDV_PAGE), slots);
    if (ftruncate(fd, (off_t)l.total) < 0)
        return -errno;
    /* Reserve every page now: a full /dev/shm fails here with ENOSPC, not
     * later with SIGBUS in the middle of a copy. */
    int err = posix_fallocate(fd, 0, (off_t)l.total);
    if (err)
        return -err;
    int rc = map_segment(fd, &l, out);
    if (rc < 0)
        return rc;
    struct rdv_header *khdr = (*out)->khdr; /* a new tmpfs file reads as zeros */
    khdr->version = RDV_LAYOUT_VERSION;
    khdr->header_size = sizeof *khdr;
    khdr->total_size = l.total;
    khdr->index_off = l.index_off;
    khdr->index_slots = l.slots;
    khdr->side_off = l.side_off;
    khdr->arena_off = l.arena_off;
    khdr->arena_size = l.arena_size;
    khdr->max_keys = max_keys;
    khdr->creator_pid = (uint32_t)getpid();
    if (getrandom(khdr->hash_seed, sizeof khdr->hash_seed, 0) != sizeof khdr->hash_seed) {
        khdr->hash_seed[0] = (uint64_t)rdv_now_ns();
        khdr->hash_seed[1] = ~khdr->hash_seed[0] ^ (uint64_t)getpid();
    }
    /* release: publishes every field above; pairs with the acquire load of
     * magic in rdv_attach */
    smp_store_release(&khdr->magic, RDV_MAGIC);
    rc = rdv_proc_register(*out);
    if (rc < 0) {
        unmap(*out);
        free(*out);
    }
    return rc;
}

/* Check a header read from an untrusted file against the layout it claims. */
static int validate(const struct rdv_header *khdr, uint64_t file_size, struct layout *l) {
    /* acquire: pairs with the creator's release store of magic */
    uint64_t magic = smp_load_acquire(&khdr->magic);
    if (magic == 0)
        return -EAGAIN; /* still being created */
    if (magic != RDV_MAGIC)
        return -EPROTO;
    if (khdr->version != RDV_LAYOUT_VERSION || khdr->header_size != sizeof *khdr)
        return -EPROTONOSUPPORT;
    uint64_t slots = khdr->index_slots, arena = khdr->arena_size;
    if (slots < 64 || slots > 2ull * RDV_MAX_KEYS || (slots & (slots - 1)) || arena == 0 ||
        arena > RDV_MAX_ARENA || arena % RDV_PAGE || khdr->max_keys == 0 ||
        khdr->max_keys > slots / 2)
        return -EBADMSG;
    plan(l, arena, slots);
    if (khdr->index_off != l->index_off || khdr->side_off != l->side_off ||
        khdr->arena_off != l->arena_off || khdr->total_size != l->total)
        return -EBADMSG;
    if (file_size != l->total)
        return -EFBIG; /* header and file disagree: truncated or grown */
    if (khdr->abort_reason_len > RDV_REASON_MAX || khdr->abort_state > RDV_ABORTED)
        return -EBADMSG;
    return 0;
}

int rdv_attach(int fd, rdv_t **out) {
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    if ((uint64_t)st.st_size < RDV_PAGE)
        return st.st_size == 0 ? -EAGAIN : -EPROTO;
    struct rdv_header *khdr = mmap(NULL, RDV_PAGE, PROT_READ, MAP_SHARED, fd, 0);
    if (khdr == MAP_FAILED)
        return -errno;
    struct layout l;
    int rc = validate(khdr, (uint64_t)st.st_size, &l);
    munmap(khdr, RDV_PAGE);
    if (rc < 0)
        return rc;
    rc = map_segment(fd, &l, out);
    if (rc < 0)
        return rc;
    rc = validate_state(*out);
    if (rc == 0)
        rc = rdv_proc_register(*out);
    if (rc < 0) {
        unmap(*out);
        free(*out);
    }
    return rc;
}

/* Closed handles stay allocated (see rdv_get) and reachable from here. */
static rdv_t *retired;

void rdv_close(rdv_t *h) {
    uint32_t open_ = 0;
    /* process-local, relaxed: only makes close idempotent; rdv_put orders the unmap */
    if (h && __atomic_compare_exchange_n(&h->closed, &open_, 1, 0, __ATOMIC_RELAXED,
                                         __ATOMIC_RELAXED)) {
        h->next_retired = __atomic_exchange_n(&retired, h, __ATOMIC_RELAXED);
        rdv_put(h);
    }
}

uint64_t rdv_capacity(rdv_t *h) { return h->cap; }

/* This process's pid, kept current across fork without a syscall per call. */
static pid_t current_pid;

static void refresh_pid(void) { current_pid = getpid(); }

__attribute__((constructor)) static void watch_forks(void) {
    refresh_pid();
    pthread_atfork(NULL, NULL, refresh_pid);
}

/* A handle inherited through fork belongs to the parent: its entry, its
 * views and its locks are the parent's, so the child must not use, release
 * or unregister any of them (it attaches a handle of its own instead). */
int rdv_forked(const rdv_t *h) { return h->pid != current_pid; }

int rdv_get(rdv_t *h) {
    if (rdv_forked(h))
        return -EBADF;
    /* process-local count; relaxed: the mapping it protects was set up before
     * the handle was handed out */
    int64_t r = __atomic_load_n(&h->refs, __ATOMIC_RELAXED);
    do {
        if (r == 0)
            return -EBADF; /* closed and unmapped */
    } while (!__atomic_compare_exchange_n(&h->refs, &r, r + 1, 0, __ATOMIC_ACQUIRE,
                                          __ATOMIC_RELAXED));
    return 0;
}

void rdv_put(rdv_t *h) {
    if (rdv_forked(h))
        return; /* the parent's: leave its entry, views and blocks alone */
    /* acq_rel: every access through the mapping happens before the unmap */
    if (__atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        rdv_proc_unregister(h);
        unmap(h);
    }
}

void rdv_unref(rdv_t *h) { rdv_put(h); }
