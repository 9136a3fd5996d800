/* Layer 2: creating, validating and mapping a rendezvous segment. */
#include <errno.h>
#include <stdlib.h>

#include "rdv_atomic.h"
#include "rdv_os.h"
#include "rdv_segment.h"
#include "rdv_spin.h"

static uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

struct layout {
    uint64_t slots, procs_off, index_off, side_off, arena_off, arena_size, total;
    uint32_t flags; /* RDV_CREATE_*, as the header's seg_flags */
};

/* The unit a segment file is sized and mapped in: a page, or on hugetlbfs
 * a huge page (its files take no other sizes, and a mapping of one can
 * only be cut at a huge page's edge). */
static uint64_t file_page(int fd) {
    uint64_t huge = rdv_file_huge_page(fd);
    return huge > RDV_PAGE ? huge : RDV_PAGE;
}

static void plan(struct layout *l, uint64_t arena_size, uint64_t slots, uint64_t page) {
    l->slots = slots;
    l->arena_size = arena_size;
    l->procs_off = RDV_HEADER_BYTES;
    l->index_off = l->procs_off + RDV_MAX_PROCS * sizeof(struct rdv_proc);
    l->side_off = l->index_off + round_up(slots * sizeof(struct rdv_slot), RDV_PAGE);
    l->arena_off = l->side_off + round_up(arena_size / RDV_GRANULE * 4, RDV_PAGE);
    /* then the home slabs of waiter records, one per process entry: a
     * handle's first waits need no arena space (rdv_waiter.c); on hugetlbfs
     * the last huge page's tail is left unused (a multiple of RDV_PAGE
     * already otherwise) */
    l->total = round_up(l->arena_off + arena_size + (uint64_t)RDV_MAX_PROCS * RDV_SLAB_GRANULES * RDV_GRANULE, page);
}

/* ---- a segment truncated under us ----------------------------------------------
 * Another process of the same user may ftruncate a named segment's file
 * while it is mapped (nothing can prevent it: files in /dev/shm take no
 * seals; a private rendezvous' memfd is sealed, shmrdv/segments.py). A
 * later access past the new end faults with SIGBUS. We survive it: the
 * fault's page to the end of the mapping becomes private zero pages, the
 * access is retried, and the handle is marked damaged, so its calls fail
 * with -EFBIG (SegmentMismatch) from then on and its waits end at once
 * (rdv_is_aborted). What lay past the cut is lost; a view of it reads
 * zeros. The table below is what the SIGBUS handler searches: process-local,
 * lock-free (the handler may run on any thread at any time). */
#define RDV_MAX_MAPPED 256

static struct mapped_range {
    uintptr_t base; /* 0: unused; published last (release), cleared first */
    uintptr_t end;
    uintptr_t page; /* the unit its mapping can be cut in (file_page) */
    uint32_t *damaged;
} mapped_ranges[RDV_MAX_MAPPED];

static int claim_fault(void *addr) {
    uintptr_t a = (uintptr_t)addr;
    for (int i = 0; i < RDV_MAX_MAPPED; i++) {
        struct mapped_range *r = &mapped_ranges[i];
        /* acquire: pairs with the release in watch_range, so end, damaged
         * and page are the range's */
        uintptr_t base = smp_load_acquire(&r->base);
        uintptr_t end = READ_ONCE(r->end); /* relaxed: ordered by the acquire above */
        uint32_t *damaged = READ_ONCE(r->damaged); /* relaxed: as end */
        uintptr_t page = READ_ONCE(r->page); /* relaxed: as end */
        /* acquire: base again, so end and damaged were not an entry reused under us */
        if (base == 0 || a < base || a >= end || smp_load_acquire(&r->base) != base)
            continue;
        uintptr_t from = a & ~(page - 1); /* a hugetlbfs mapping is cut at a huge page's edge only */
        if (rdv_map_zeros((void *)from, end - from) < 0)
            return 0;
        WRITE_ONCE(*damaged, 1); /* relaxed: read by this process's calls, any thread */
        return 1;
    }
    return 0;
}

static void watch_range(rdv_t *h) {
    rdv_sigbus_route(claim_fault); /* best effort: without it a truncation is fatal, as before */
    for (int i = 0; i < RDV_MAX_MAPPED; i++) {
        uintptr_t none = 0;
        /* claim an unused entry: acquire, process-local, pairs with the
         * release of 0 in unwatch_range */
        if (!rdv_cas(&mapped_ranges[i].end, &none, (uintptr_t)h->base + h->map_len, __ATOMIC_ACQUIRE))
            continue;
        WRITE_ONCE(mapped_ranges[i].damaged, &h->damaged); /* relaxed: published by the release below */
        WRITE_ONCE(mapped_ranges[i].page, (uintptr_t)h->map_page); /* relaxed: as damaged */
        /* release: end, damaged and page before the handler can match base */
        smp_store_release(&mapped_ranges[i].base, (uintptr_t)h->base);
        return;
    }
    /* Over RDV_MAX_MAPPED mappings: this one is not protected. */
}

static void unwatch_range(rdv_t *h) {
    for (int i = 0; i < RDV_MAX_MAPPED; i++)
        if (READ_ONCE(mapped_ranges[i].base) == (uintptr_t)h->base) { /* relaxed: ours to clear */
            WRITE_ONCE(mapped_ranges[i].base, 0); /* first: the handler stops matching it */
            smp_store_release(&mapped_ranges[i].end, 0); /* then the entry is free again */
            return;
        }
}

/* Every RDV_CREATE_* flag: a segment with others was made by a newer build. */
#define KNOWN_FLAGS ((uint32_t)(RDV_CREATE_HUGE_PAGES | RDV_CREATE_NO_PREFAULT))

/* Huge pages are made by faulting them in as advised (tmpfs huge=advise):
 * a segment cannot have them and leave its pages to their first touch. */
static int both_page_flags(uint32_t flags) {
    return (flags & RDV_CREATE_HUGE_PAGES) && (flags & RDV_CREATE_NO_PREFAULT);
}

static int map_segment(int fd, const struct layout *l, uint64_t page, int fresh, rdv_t **out) {
    int err = 0;
    unsigned how = (fresh ? RDV_MAP_FRESH : 0) | (l->flags & RDV_CREATE_HUGE_PAGES ? RDV_MAP_HUGE : 0) |
                   (l->flags & RDV_CREATE_NO_PREFAULT ? RDV_MAP_NO_PREFAULT : 0);
    uint8_t *base = rdv_map(fd, l->total, how, &err);
    if (!base)
        return err;
    rdv_t *h = calloc(1, sizeof *h);
    if (!h) {
        rdv_unmap(base, l->total);
        return -ENOMEM;
    }
    h->base = base;
    h->map_len = l->total;
    h->map_page = page;
    h->khdr = (struct rdv_header *)base;
    h->kslots = (struct rdv_slot *)(base + l->index_off);
    h->kprocs = (struct rdv_proc *)(base + l->procs_off);
    h->kside = (uint32_t *)(base + l->side_off);
    h->karena = base + l->arena_off;
    h->cap = l->arena_size;
    h->granules = (uint32_t)(l->arena_size / RDV_GRANULE);
    h->slot_mask = l->slots - 1;
    h->spin_ns = RDV_SPIN_START_NS;
    h->refs = 1;
    h->pid = rdv_pid();
    pthread_mutex_init(&h->mark_lock, NULL);
    pthread_mutex_init(&h->waiter_lock, NULL);
    pthread_mutex_init(&h->want_lock, NULL);
    h->fd = -1; /* rdv_segment_lock_fd */
    watch_range(h);
    *out = h;
    return 0;
}

void rdv_segment_unmap(rdv_t *h) {
    unwatch_range(h); /* before the addresses can be reused */
    rdv_unmap(h->base, h->map_len);
    rdv_segment_drop_locks(h);
}

int rdv_segment_lock_fd(rdv_t *h, int fd) {
    /* Our own open file description, for the process-table byte locks
     * alone: the mapping holds fd's (the caller's) until it is unmapped, and
     * a forked child inherits both, but it closes this one (rdv_open.c), so
     * our locks die with us however long the child lives. */
    int d = rdv_reopen(fd);
    if (d < 0)
        return d;
    h->fd = d;
    return 0;
}

int rdv_segment_check(rdv_t *h) {
    /* relaxed, both: the mark is process-local, set by our SIGBUS handler */
    if (READ_ONCE(h->damaged))
        return -EFBIG;
    int64_t size = h->fd >= 0 ? rdv_file_size(h->fd) : (int64_t)h->map_len;
    if (size >= 0 && (uint64_t)size != h->map_len) {
        WRITE_ONCE(h->damaged, 1);
        return -EFBIG;
    }
    return 0;
}

void rdv_segment_drop_locks(rdv_t *h) {
    if (h->fd >= 0)
        rdv_close_fd(h->fd);
    h->fd = -1;
}

void rdv_segment_discard(rdv_t *h) {
    rdv_segment_unmap(h);
    free(h->slabs); /* a handle that never registered has none; see rdv_waiter.c */
    free(h->free_waiters);
    free(h);
}

/* Check what the running state of a segment says before trusting it: key
 * slots, process entries and the arena's control words must all be in
 * range (they are at every instant, however busy the segment; only damage
 * breaks them). Offsets and lengths are checked again wherever they are
 * used. */
static int validate_state(rdv_t *h) {
    const struct rdv_arena_ctl *ka = &h->khdr->arena;
    uint64_t granules = h->granules;
    /* relaxed, all: range checks that hold whatever moment they are read at */
    if (READ_ONCE(ka->cursor) >= granules || READ_ONCE(ka->lock) > RDV_MAX_PROCS ||
        READ_ONCE(ka->live_bytes) > h->cap || READ_ONCE(ka->free_bytes) > h->cap)
        return -EBADMSG;
    for (uint32_t f = 0; f < RDV_FL_COUNT; f++)
        for (uint32_t s = 0; s < RDV_SL_COUNT; s++)
            if (READ_ONCE(ka->heads[f][s]) > granules)
                return -EBADMSG;
    for (uint64_t i = 0; i <= h->slot_mask; i++) {
        const struct rdv_slot *s = &h->kslots[i];
        if (READ_ONCE(s->state) > RDV_SLOT_TOMB || READ_ONCE(s->key_len) > RDV_KEY_MAX ||
            READ_ONCE(s->q_head) > granules || READ_ONCE(s->q_tail) > granules ||
            READ_ONCE(s->max_probe) > h->slot_mask || READ_ONCE(s->lock) > RDV_MAX_PROCS ||
            READ_ONCE(s->ins_lock) > RDV_MAX_PROCS)
            return -EBADMSG;
    }
    for (uint32_t i = 0; i < RDV_MAX_PROCS; i++)
        if (READ_ONCE(h->kprocs[i].state) > RDV_PROC_RECLAIMING ||
            READ_ONCE(h->kprocs[i].mark_state) > RDV_MAX_MARKS)
            return -EBADMSG;
    return 0;
}

/* The layout of a new segment: 0, or -EINVAL for sizes it cannot have. */
static int plan_new(struct layout *l, uint64_t arena_size, uint64_t max_keys, uint64_t page) {
    if (arena_size == 0 || arena_size > RDV_MAX_ARENA || max_keys == 0 || max_keys > RDV_MAX_KEYS)
        return -EINVAL;
    uint64_t slots = 64;
    while (slots < 2 * max_keys) /* load factor at most 1/2 */
        slots *= 2;
    plan(l, round_up(arena_size, RDV_PAGE), slots, page);
    return 0;
}

uint64_t rdv_segment_bytes(uint64_t arena_size, uint64_t max_keys) {
    struct layout l;
    return plan_new(&l, arena_size, max_keys, RDV_PAGE) < 0 ? 0 : l.total;
}

int rdv_segment_create(int fd, uint64_t arena_size, uint64_t max_keys, uint32_t flags, rdv_t **out) {
    struct layout l;
    uint64_t page = file_page(fd);
    if ((flags & ~KNOWN_FLAGS) || both_page_flags(flags) || plan_new(&l, arena_size, max_keys, page) < 0)
        return -EINVAL;
    l.flags = flags;
    /* Held until rdv_segment_publish, or dropped with the caller's file
     * description if creation fails or we die: attachers that meanwhile
     * find magic 0 wait while it is held (see rdv_segment_attach). */
    int rc = rdv_byte_lock(fd, RDV_CREATOR_LOCK_BYTE);
    if (rc < 0)
        return rc;
    /* Huge pages: tmpfs allocates a page as the faulting mapping advises
     * (huge=advise), and posix_fallocate has no mapping: so size the file,
     * map it with the advice and populate it, then allocate what is left,
     * which still fails here, cleanly, when /dev/shm is short of room. */
    int huge = (flags & RDV_CREATE_HUGE_PAGES) != 0;
    rc = huge ? rdv_file_resize(fd, l.total) : rdv_file_reserve(fd, l.total);
    if (rc < 0)
        return rc;
    rc = map_segment(fd, &l, page, 1, out);
    if (rc < 0)
        return rc;
    if (huge && (rc = rdv_file_allocate(fd, l.total)) < 0) {
        rdv_segment_discard(*out);
        return rc;
    }
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
    khdr->creator_pid = (uint32_t)rdv_pid();
    khdr->seg_flags = flags;
    rdv_random(khdr->hash_seed, sizeof khdr->hash_seed);
    return 0;
}

void rdv_segment_publish(rdv_t *h, int fd) {
    /* release: publishes every field the creator wrote; pairs with the
     * acquire load of magic in validate() */
    smp_store_release(&h->khdr->magic, RDV_MAGIC);
    /* After the publish: an attacher that sees the byte free and then reads
     * magic finds it set, unless the creator died before publishing. */
    rdv_byte_unlock(fd, RDV_CREATOR_LOCK_BYTE);
}

/* Check a header read from an untrusted file against the layout it claims. */
static int validate(const struct rdv_header *khdr, uint64_t file_size, int creating, uint64_t page,
                    struct layout *l) {
    /* acquire: pairs with the creator's release store of magic */
    uint64_t magic = smp_load_acquire(&khdr->magic);
    if (magic == 0)
        return creating ? -EAGAIN : -EOWNERDEAD; /* still being created, or never will be */
    if (magic != RDV_MAGIC)
        return -EPROTO;
    if (khdr->version != RDV_LAYOUT_VERSION || khdr->header_size != sizeof *khdr)
        return -EPROTONOSUPPORT;
    uint64_t slots = khdr->index_slots, arena = khdr->arena_size;
    if (slots < 64 || slots > 2ull * RDV_MAX_KEYS || (slots & (slots - 1)) || arena == 0 ||
        arena > RDV_MAX_ARENA || arena % RDV_PAGE || khdr->max_keys == 0 ||
        khdr->max_keys > slots / 2)
        return -EBADMSG;
    if (khdr->seg_flags & ~KNOWN_FLAGS)
        return -EPROTONOSUPPORT; /* made with options this build does not know */
    if (both_page_flags(khdr->seg_flags))
        return -EBADMSG;
    plan(l, arena, slots, page);
    l->flags = khdr->seg_flags; /* a constant: attachers map it as its creator did */
    if (khdr->index_off != l->index_off || khdr->side_off != l->side_off ||
        khdr->arena_off != l->arena_off || khdr->total_size != l->total)
        return -EBADMSG;
    if (file_size != l->total)
        return -EFBIG; /* header and file disagree: truncated or grown */
    if (khdr->abort_reason_len > RDV_REASON_MAX || khdr->abort_state > RDV_ABORTED)
        return -EBADMSG;
    return 0;
}

int rdv_segment_attach(int fd, rdv_t **out) {
    /* Whether a creator is still at work, asked before the file is read: a
     * creator that publishes after this sees its magic read as set below. */
    int creating = rdv_byte_locked_by_other(fd, RDV_CREATOR_LOCK_BYTE);
    int64_t size = rdv_file_size(fd);
    if (size < 0)
        return (int)size;
    if (size == 0)
        return creating ? -EAGAIN : -EOWNERDEAD;
    if ((uint64_t)size < RDV_PAGE)
        return -EPROTO;
    int err = 0;
    /* identity and version sit in line 0, and an old layout's header may
     * be one page: read the first page only (a whole huge page's mapping
     * on hugetlbfs, which unmaps in no smaller unit) */
    uint64_t page = file_page(fd);
    const struct rdv_header *khdr = rdv_map_readonly(fd, page, &err);
    if (!khdr)
        return err;
    struct layout l;
    int rc = validate(khdr, (uint64_t)size, creating, page, &l);
    rdv_unmap(khdr, page);
    if (rc < 0)
        return rc;
    rc = map_segment(fd, &l, page, 0, out);
    if (rc < 0)
        return rc;
    rc = validate_state(*out);
    if (rc < 0)
        rdv_segment_discard(*out);
    return rc;
}
