/* Unit tests of the arena (csrc/rdv_arena.c) on its own layers only: this
 * program links rdv_os.c rdv_wait.c rdv_segment.c rdv_live.c rdv_lock.c
 * rdv_arena.c and nothing above them (no recovery, no queues, no index),
 * so that the link itself shows the arena stands on its lower layers.
 * Built with -fsanitize=address,undefined by tests/c/test_c_units.py.
 *
 * The segment lives on a memfd (nothing in /dev/shm). Liveness is faked
 * through the handle's rdv_ops: a table the test controls says who is
 * alive, and a dead lock holder of the arena is "reclaimed" the way
 * recovery would: rdv_arena_repair, then unlock.
 *
 *   1. random alloc/free, 64 B .. 256 KiB, random lifetimes, 200k steps,
 *      with a full invariant check every CHECK_EVERY steps;
 *   2. allocation never depends on order: a fragmented arena hands out
 *      exactly its largest free run, nothing larger, then every other run;
 *   3. crash windows: (a) a forked child runs one step and dies before its
 *      k-th store to the segment, for every k (stores are counted by
 *      write-protecting the header, the side table and the arena and
 *      single-stepping each store; x86-64 only): the chain must be the one
 *      before or after the step, and the repair that follows must leave
 *      everything consistent; sampled, the reclaimer dies inside that
 *      repair too; (b) a repair merging two adjacent free blocks (damage),
 *      killed before each of its stores; (c) children looping alloc/free
 *      on a handle of their own, SIGKILLed at random moments, 200 times;
 *   4. rdv_block_at / rdv_queued_msg / rdv_arena_free reject freed blocks
 *      and positions of later blocks at the same granule;
 *   5. allocation numbers, reserved in growing ranges by each handle:
 *      unique across three handles and four threads, growing along each
 *      handle's allocations, below the counter, little wasted.
 *
 * Deterministic for a seed (UNIT_SEED in the environment, nonzero), but for
 * the moments of the kills in 3(c). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "rdv_arena.h"
#include "rdv_atomic.h"
#include "rdv_live.h"
#include "rdv_lock.h"
#include "rdv_os.h"
#include "rdv_segment.h"

/* A smaller quarantine than ASan's 256 MiB: this program forks some
 * thousand children, and each fork copies the page tables of whatever the
 * quarantine keeps touched (a fork costs ~3 ms instead of ~7). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=16"; }

#define UNIT_NAME "unit_arena"
#include "unit_check.h"

static uint64_t seed0 = 0x2545f4914f6cdd1dULL;
static uint64_t rng_state;
static uint64_t rng(void) {
    uint64_t *s = &rng_state;
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static uint64_t last_seq = UINT64_MAX; /* the last position's number, if known */

/* ---- fake liveness -------------------------------------------------------- */

static uint8_t alive_tab[RDV_MAX_PROCS];
static unsigned dead_holder_calls, repairs;

static int fake_alive(rdv_t *h, uint32_t entry) {
    (void)h;
    return entry >= RDV_MAX_PROCS || alive_tab[entry];
}

/* What recovery does for the arena's lock: repair as the dead holder, then
 * let go. */
static void fake_dead_holder(rdv_t *h, uint32_t *klock, uint32_t holder) {
    dead_holder_calls++;
    CHECK(holder >= 1 && holder <= RDV_MAX_PROCS && !alive_tab[holder - 1],
          "dead_holder called for holder %u, which the table says is alive", holder);
    CHECK(klock == &h->khdr->arena.lock, "dead_holder called for a lock that is not the arena's");
    if (READ_ONCE(*klock) == holder) {
        rdv_arena_repair(h);
        repairs++;
        rdv_unlock(h, klock);
    }
}

static void fake_reclaim_dead(rdv_t *h) { (void)h; }

static const struct rdv_ops fake_ops = {
    .alive = fake_alive,
    .dead_holder = fake_dead_holder,
    .reclaim_dead = fake_reclaim_dead,
};

/* ---- segments -------------------------------------------------------------- */

static rdv_t *make_segment(uint64_t arena_bytes, int *fdp) {
    int fd = memfd_create("shmrdv-unit-arena", MFD_CLOEXEC);
    CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
    rdv_t *h;
    int rc = rdv_segment_create(fd, arena_bytes, 16, 0, &h);
    CHECK(rc == 0, "rdv_segment_create: %d", rc);
    rc = rdv_segment_lock_fd(h, fd);
    CHECK(rc == 0, "rdv_segment_lock_fd: %d", rc);
    rdv_arena_init(h);
    rdv_segment_publish(h, fd);
    rc = rdv_live_claim(h);
    CHECK(rc == 0, "rdv_live_claim: %d", rc);
    h->ops = fake_ops;
    memset(alive_tab, 1, sizeof alive_tab);
    last_seq = UINT64_MAX;
    *fdp = fd;
    return h;
}

/* Another handle on the segment in memfd, on an open file description of
 * its own (its byte lock is its own), with the fake liveness. */
static rdv_t *attach_handle(int memfd) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
    rdv_t *h;
    int rc = rdv_segment_attach(fd, &h);
    CHECK(rc == 0, "rdv_segment_attach: %d", rc);
    rc = rdv_segment_lock_fd(h, fd);
    CHECK(rc == 0, "rdv_segment_lock_fd: %d", rc);
    close(fd);
    rc = rdv_live_claim(h);
    CHECK(rc == 0, "rdv_live_claim: %d", rc);
    h->ops = fake_ops;
    return h;
}

static void drop_segment(rdv_t *h, int fd) {
    rdv_live_release(h);
    rdv_segment_discard(h);
    close(fd);
}

/* Back to a fresh arena (what rdv_arena_init expects: zeros). */
static void reset_arena(rdv_t *h) {
    memset(h->kside, 0, (size_t)h->granules * 4);
    memset(&h->khdr->arena, 0, sizeof h->khdr->arena);
    h->seq_word = h->seq_reserved = 0; /* its range of allocation numbers came from the old counter */
    rdv_arena_init(h);
}

/* ---- the invariant checker ------------------------------------------------- */

/* The list a free block of len granules belongs on, from layout.h's words:
 * first level by the top set bit, second by the next RDV_SL_BITS bits;
 * lengths below RDV_SL_COUNT map exactly. */
static void spec_class(uint32_t len, uint32_t *f, uint32_t *s) {
    if (len < RDV_SL_COUNT) {
        *f = 0;
        *s = len;
        return;
    }
    uint32_t m = 31u - (uint32_t)__builtin_clz(len);
    *f = m - RDV_SL_BITS + 1;
    *s = (len >> (m - RDV_SL_BITS)) & (RDV_SL_COUNT - 1);
}

struct blk {
    uint32_t g, len, kind;
};

struct walk {
    struct blk *b;
    uint32_t n, cap;
    uint64_t live_bytes, free_bytes, live_blocks, largest; /* bytes */
};

static void walk_free(struct walk *w) { free(w->b); memset(w, 0, sizeof *w); }

/* The chain of start tags, checked as it must be at every instant, even
 * with a holder dead in the middle of a step: it covers the arena exactly,
 * no two free blocks are adjacent, every busy block's header names itself.
 * END tags are derived state (a step rewrites the one of the block it cuts
 * before it publishes the cut): checked only if settled. */
static void walk_chain_at(rdv_t *h, struct walk *w, int settled) {
    uint32_t G = h->granules;
    memset(w, 0, sizeof *w);
    w->cap = 1024;
    w->b = malloc(w->cap * sizeof *w->b);
    int prev_free = 0;
    uint32_t g = 0;
    while (g < G) {
        uint32_t v = h->kside[g], kind = RDV_SIDE_KIND(v), len = RDV_SIDE_LEN(v);
        CHECK(kind == RDV_SIDE_BUSY || kind == RDV_SIDE_FREE,
              "granule %u: the chain reaches an entry 0x%08x that is no start tag", g, v);
        CHECK(len > 0 && len <= G - g, "granule %u: block length %u runs past the arena (%u)", g, len, G);
        if (kind == RDV_SIDE_FREE) {
            CHECK(!prev_free, "granule %u: two adjacent free blocks (not coalesced)", g);
            CHECK(len >= RDV_MIN_BLOCK, "granule %u: free block of %u granules", g, len);
            CHECK(!settled || h->kside[g + len - 1] == (RDV_SIDE_END | len),
                  "granule %u: free block of %u ends in 0x%08x, not its END tag", g, len,
                  h->kside[g + len - 1]);
            w->free_bytes += (uint64_t)len * RDV_GRANULE;
            if ((uint64_t)len * RDV_GRANULE > w->largest)
                w->largest = (uint64_t)len * RDV_GRANULE;
        } else {
            const struct rdv_msg *m = (const struct rdv_msg *)(h->karena + (uint64_t)g * RDV_GRANULE);
            CHECK(rdv_pos_granule(m->pos) == g, "granule %u: busy block whose header names granule %llu",
                  g, (unsigned long long)rdv_pos_granule(m->pos));
            uint64_t blen = 0;
            CHECK(rdv_block_at(h, m->pos, &blen) == m && blen == (uint64_t)len * RDV_GRANULE,
                  "granule %u: rdv_block_at rejects a busy block", g);
            w->live_bytes += (uint64_t)len * RDV_GRANULE;
            w->live_blocks++;
        }
        if (w->n == w->cap) {
            w->cap *= 2;
            w->b = realloc(w->b, w->cap * sizeof *w->b);
        }
        w->b[w->n++] = (struct blk){g, len, kind};
        prev_free = kind == RDV_SIDE_FREE;
        g += len;
    }
    CHECK(g == G, "the chain ends at %u, not at the arena's end %u", g, G);
}

/* Mid-step: whatever moment a holder died at. */
static void walk_chain(rdv_t *h, struct walk *w) { walk_chain_at(h, w, 0); }

static int same_chain(const struct walk *a, const struct walk *b) {
    return a->n == b->n && memcmp(a->b, b->b, a->n * sizeof *a->b) == 0;
}

static unsigned checks_run;

/* Everything: the chain as above, interior entries, the free lists against
 * the chain, the counters, rdv_arena_usage. strict: no crash ever happened
 * in this arena since it was fresh, so every interior entry is 0; else an
 * interior entry may hold a stale link or an unconfirmed END tag, but never
 * a start tag. */
static void check_arena(rdv_t *h, int strict) {
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    uint32_t G = h->granules;
    struct walk w;
    walk_chain_at(h, &w, 1);
    checks_run++;
    uint8_t *mark = calloc(G, 1); /* 1: a free block starts here, 2: found on a list */
    for (uint32_t i = 0; i < w.n; i++) {
        const struct blk *b = &w.b[i];
        uint32_t from = b->g + 1, to = b->g + b->len; /* interior: [from, to) */
        if (b->kind == RDV_SIDE_FREE) {
            mark[b->g] = 1;
            from = b->g + 3;
            to = b->g + b->len - 1;
            for (uint32_t j = b->g + 1; j < b->g + 3; j++)
                CHECK(RDV_SIDE_KIND(h->kside[j]) == 0 && h->kside[j] <= G,
                      "free block %u: link entry %u holds 0x%08x", b->g, j, h->kside[j]);
        }
        for (uint32_t j = from; j < to; j++) {
            uint32_t v = h->kside[j];
            if (strict)
                CHECK(v == 0, "block %u (%s, %u granules): interior entry %u is 0x%08x", b->g,
                      b->kind == RDV_SIDE_FREE ? "free" : "busy", b->len, j, v);
            else
                CHECK(RDV_SIDE_KIND(v) != RDV_SIDE_BUSY && RDV_SIDE_KIND(v) != RDV_SIDE_FREE,
                      "block %u (%u granules): interior entry %u holds a start tag 0x%08x", b->g, b->len, j, v);
        }
    }
    /* the lists */
    CHECK((ka->fl_bitmap >> RDV_FL_COUNT) == 0, "fl_bitmap 0x%x has bits past the levels", ka->fl_bitmap);
    for (uint32_t f = 0; f < RDV_FL_COUNT; f++) {
        CHECK((ka->sl_bitmap[f] >> RDV_SL_COUNT) == 0, "sl_bitmap[%u] = 0x%x", f, ka->sl_bitmap[f]);
        CHECK(!!(ka->fl_bitmap & (1u << f)) == !!ka->sl_bitmap[f], "fl_bitmap bit %u disagrees with sl_bitmap", f);
        for (uint32_t s = 0; s < RDV_SL_COUNT; s++) {
            uint32_t head = ka->heads[f][s];
            CHECK(!!(ka->sl_bitmap[f] & (1u << s)) == !!head, "list (%u,%u): bitmap bit %d, head %u", f, s,
                  !!(ka->sl_bitmap[f] & (1u << s)), head);
            uint32_t prev = 0;
            for (uint32_t link = head; link;) {
                uint32_t g = link - 1;
                CHECK(g < G && mark[g] == 1, "list (%u,%u): link %u names no free block not yet listed", f, s, link);
                mark[g] = 2;
                uint32_t len = RDV_SIDE_LEN(h->kside[g]), ff, ss;
                spec_class(len, &ff, &ss);
                CHECK(ff == f && ss == s, "free block %u of %u granules is on list (%u,%u), its class is (%u,%u)",
                      g, len, f, s, ff, ss);
                CHECK(h->kside[g + 2] == prev, "free block %u: prev link %u, expected %u", g, h->kside[g + 2], prev);
                prev = link;
                link = h->kside[g + 1];
            }
        }
    }
    for (uint32_t i = 0; i < w.n; i++)
        CHECK(w.b[i].kind != RDV_SIDE_FREE || mark[w.b[i].g] == 2, "free block %u (%u granules) is on no list",
              w.b[i].g, w.b[i].len);
    free(mark);
    /* counters */
    CHECK(ka->live_bytes == w.live_bytes && ka->free_bytes == w.free_bytes && ka->live_blocks == w.live_blocks,
          "counters live %llu free %llu blocks %llu, chain says %llu %llu %llu",
          (unsigned long long)ka->live_bytes, (unsigned long long)ka->free_bytes,
          (unsigned long long)ka->live_blocks, (unsigned long long)w.live_bytes,
          (unsigned long long)w.free_bytes, (unsigned long long)w.live_blocks);
    CHECK(w.live_bytes + w.free_bytes == h->cap, "live + free != capacity");
    CHECK(ka->cursor < G, "cursor %u out of the arena", ka->cursor);
    uint64_t lb, fb, largest, blocks;
    rdv_arena_usage(h, &lb, &fb, &largest, &blocks);
    CHECK(lb == w.live_bytes && fb == w.free_bytes && blocks == w.live_blocks, "rdv_arena_usage disagrees");
    CHECK(largest == w.largest, "rdv_arena_usage: largest_free %llu, the largest free block is %llu",
          (unsigned long long)largest, (unsigned long long)w.largest);
    CHECK(ka->lock == 0, "the arena lock is held (%u) at rest", ka->lock);
    walk_free(&w);
}

/* The arena is one free block, nothing live. */
static void check_empty(rdv_t *h) {
    check_arena(h, 0);
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    CHECK(h->kside[0] == (RDV_SIDE_FREE | h->granules), "arena not one free block: tag 0x%08x", h->kside[0]);
    CHECK(ka->free_bytes == h->cap && ka->live_bytes == 0 && ka->live_blocks == 0,
          "empty arena: free %llu of %llu, live %llu in %llu blocks", (unsigned long long)ka->free_bytes,
          (unsigned long long)h->cap, (unsigned long long)ka->live_bytes, (unsigned long long)ka->live_blocks);
}

/* ---- blocks the test owns ------------------------------------------------- */

struct owned {
    uint64_t pos, stamp, deadline;
    uint32_t g, len; /* granules */
};

static int seq_checked; /* positions' numbers must follow each other (no snapshot restores) */

/* Stamps at payload byte 64 and at the block's last 8 bytes (blocks are at
 * least 4 granules): an allocator that hands out live memory overwrites
 * one of them, or hands out a block whose stamps it then frees twice. */
static void stamp(rdv_t *h, const struct owned *o) {
    uint8_t *b = (uint8_t *)rdv_msg_at(h, o->pos);
    memcpy(b + 64, &o->stamp, 8);
    memcpy(b + (uint64_t)o->len * RDV_GRANULE - 8, &o->stamp, 8);
}

static void check_stamp(rdv_t *h, const struct owned *o) {
    const uint8_t *b = (const uint8_t *)rdv_msg_at(h, o->pos);
    uint64_t x, y;
    memcpy(&x, b + 64, 8);
    memcpy(&y, b + (uint64_t)o->len * RDV_GRANULE - 8, 8);
    CHECK(x == o->stamp && y == o->stamp, "block at %u (%u granules): payload overwritten", o->g, o->len);
    uint64_t len;
    CHECK(rdv_block_at(h, o->pos, &len) == (const struct rdv_msg *)b && len == (uint64_t)o->len * RDV_GRANULE,
          "block at %u no longer busy", o->g);
}

/* Allocate nbytes and check what came back; 0 or the error. */
/* Check a block the allocator just gave for nbytes at pos, and own it in o. */
static void adopt(rdv_t *h, uint64_t pos, uint64_t nbytes, struct owned *o) {
    uint64_t need = (nbytes + RDV_GRANULE - 1) / RDV_GRANULE;
    if (need < RDV_MIN_BLOCK)
        need = RDV_MIN_BLOCK;
    uint32_t g = (uint32_t)rdv_pos_granule(pos), v = h->kside[g];
    CHECK(g < h->granules && RDV_SIDE_KIND(v) == RDV_SIDE_BUSY, "alloc returned granule %u, tag 0x%08x", g, v);
    uint32_t len = RDV_SIDE_LEN(v);
    CHECK(len >= need && len < need + RDV_MIN_BLOCK, "alloc of %llu granules got a block of %u",
          (unsigned long long)need, len);
    CHECK(!seq_checked || rdv_pos_seq(pos) == last_seq + 1 || last_seq == UINT64_MAX,
          "positions' sequence numbers jump: %llu after %llu", (unsigned long long)rdv_pos_seq(pos),
          (unsigned long long)last_seq);
    last_seq = rdv_pos_seq(pos);
    const struct rdv_msg *m = rdv_msg_at(h, pos);
    CHECK(m->pos == pos && m->stage == RDV_MSG_WRITING && m->owner == h->me + 1 && m->payload_off == 0,
          "a new block's header does not name its holder");
    o->pos = pos;
    o->g = g;
    o->len = len;
    o->stamp = rng();
    stamp(h, o);
}

static int take(rdv_t *h, uint64_t nbytes, struct owned *o) {
    uint64_t pos;
    int rc = rdv_arena_alloc(h, nbytes, &pos);
    if (rc)
        return rc;
    adopt(h, pos, nbytes, o);
    return 0;
}

static void give(rdv_t *h, const struct owned *o) {
    check_stamp(h, o);
    int rc = rdv_arena_free(h, o->pos);
    CHECK(rc == 0, "free of the block at %u: %d", o->g, rc);
}

/* ---- 1. random alloc/free ------------------------------------------------- */

#define RANDOM_OPS 200000
#define CHECK_EVERY 1000

static struct owned *heap;
static uint32_t heap_n;

static void heap_push(struct owned o) {
    uint32_t i = heap_n++;
    while (i && heap[(i - 1) / 2].deadline > o.deadline) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = o;
}

static struct owned heap_pop(void) {
    struct owned top = heap[0], last = heap[--heap_n];
    uint32_t i = 0;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= heap_n)
            break;
        if (c + 1 < heap_n && heap[c + 1].deadline < heap[c].deadline)
            c++;
        if (heap[c].deadline >= last.deadline)
            break;
        heap[i] = heap[c];
        i = c;
    }
    if (heap_n)
        heap[i] = last;
    return top;
}

/* 64 B .. max (a power of two), log-uniform. */
static uint64_t random_size(uint64_t max) {
    uint32_t bits = 63u - (uint32_t)__builtin_clzll(max / 64);
    uint64_t size = 64ull << (rng() % (bits + 1));
    size += rng() % size;
    return size > max ? max : size;
}

static void test_random(void) {
    phase = "random";
    seq_checked = 1;
    int fd;
    rdv_t *h = make_segment(8 << 20, &fd);
    check_empty(h);
    heap = malloc(sizeof *heap * (h->granules / RDV_MIN_BLOCK + 1));
    heap_n = 0;
    uint64_t allocs = 0, frees = 0, enospc = 0, enospc_walked = 0, streamed = 0;
    for (uint64_t now = 0; now < RANDOM_OPS; now++) {
        if (heap_n && heap[0].deadline <= now) {
            struct owned o = heap_pop();
            give(h, &o);
            frees++;
        } else {
            uint64_t nbytes = random_size(256 << 10);
            struct owned o;
            uint32_t cursor = h->khdr->arena.cursor, at = h->kside[cursor];
            uint64_t need = (nbytes + 63) / 64 < RDV_MIN_BLOCK ? RDV_MIN_BLOCK : (nbytes + 63) / 64;
            int ring = RDV_SIDE_KIND(at) == RDV_SIDE_FREE && RDV_SIDE_LEN(at) >= need;
            int rc = take(h, nbytes, &o);
            /* The cursor's block fits: the allocation succeeds, from the
             * cursor, or from a hole in a smaller class (the cursor's run
             * left whole for the stream). */
            CHECK(!ring || (rc == 0 && (o.g == cursor || h->kside[cursor] == at)),
                  "the free block at the cursor fits, the block went to %u", rc ? UINT32_MAX : o.g);
            if (rc == 0) {
                uint64_t r = rng() % 10;
                o.deadline = now + 1 + (r < 5 ? rng() % 16 : r < 9 ? rng() % 512 : rng() % 8192);
                heap_push(o);
                allocs++;
                streamed += o.g == cursor;
            } else {
                CHECK(rc == -ENOSPC, "alloc of %llu: %d", (unsigned long long)nbytes, rc);
                uint64_t lb, fb, largest, blocks;
                rdv_arena_usage(h, &lb, &fb, &largest, &blocks);
                CHECK(largest < need * 64, "alloc of %llu failed with a free block of %llu",
                      (unsigned long long)need * 64, (unsigned long long)largest);
                if (enospc++ % 64 == 0) { /* and by the chain itself, now and then */
                    struct walk w;
                    walk_chain(h, &w);
                    CHECK(w.largest < need * 64, "alloc of %llu failed; the chain has a free block of %llu",
                          (unsigned long long)need * 64, (unsigned long long)w.largest);
                    walk_free(&w);
                    enospc_walked++;
                }
                CHECK(heap_n > 0, "an empty arena refused %llu bytes", (unsigned long long)nbytes);
                struct owned victim = heap_pop(); /* the earliest to go, early */
                give(h, &victim);
                frees++;
            }
        }
        if (now % 4099 == 0) { /* wrong frees change nothing */
            CHECK(rdv_arena_free(h, rdv_pos_make(1, h->granules)) == -EINVAL, "free past the arena");
            CHECK(rdv_arena_free(h, rdv_pos_make(last_seq + 1, 0)) == -EINVAL, "free of a position never handed out");
            uint64_t p;
            CHECK(rdv_arena_alloc(h, h->cap + 1, &p) == -EMSGSIZE, "alloc larger than the arena");
        }
        if (now % CHECK_EVERY == 0) {
            check_arena(h, 1);
            for (uint32_t i = 0; i < heap_n; i++)
                check_stamp(h, &heap[i]);
        }
    }
    check_arena(h, 1);
    while (heap_n) {
        struct owned o = heap_pop();
        give(h, &o);
    }
    check_empty(h);
    printf("unit_arena: random: %d steps, %llu allocs (%llu at the cursor), %llu frees, %llu refused "
           "(%llu checked on the chain), %u checks\n",
           RANDOM_OPS, (unsigned long long)allocs, (unsigned long long)streamed, (unsigned long long)frees,
           (unsigned long long)enospc, (unsigned long long)enospc_walked, checks_run);
    free(heap);
    seq_checked = 0;
    drop_segment(h, fd);
}

/* ---- 2. allocation never depends on order --------------------------------- */

static void test_order(void) {
    phase = "order";
    int fd;
    rdv_t *h = make_segment(4 << 20, &fd);
    uint32_t G = h->granules;
    struct owned *b = malloc(sizeof *b * (G / RDV_MIN_BLOCK + 1));
    uint8_t *freed = calloc(G / RDV_MIN_BLOCK + 1, 1);
    for (int round = 0; round < 6; round++) {
        reset_arena(h);
        uint32_t n = 0;
        /* fill it: random small blocks, then minimum ones to the last granule */
        while (take(h, 64 * (4 + rng() % (round < 3 ? 61 : 400)), &b[n]) == 0)
            n++;
        while (take(h, 64, &b[n]) == 0)
            n++;
        CHECK(h->khdr->arena.free_bytes == 0, "a full arena has %llu free bytes",
              (unsigned long long)h->khdr->arena.free_bytes);
        check_arena(h, 1);
        /* free every other block, and a few stretches of consecutive ones */
        memset(freed, 0, n);
        for (uint32_t i = 1; i < n; i += 2)
            freed[i] = 1;
        for (int s = 0; s < 8; s++) {
            uint32_t at = (uint32_t)(rng() % n), len = 1 + (uint32_t)(rng() % 40);
            for (uint32_t i = at; i < at + len && i < n; i++)
                freed[i] = 1;
        }
        /* in a random order: the result may not depend on it */
        uint32_t *order = malloc(n * sizeof *order), nf = 0;
        for (uint32_t i = 0; i < n; i++)
            if (freed[i])
                order[nf++] = i;
        for (uint32_t i = nf; i > 1; i--) {
            uint32_t j = (uint32_t)(rng() % i), t = order[i - 1];
            order[i - 1] = order[j], order[j] = t;
        }
        uint8_t *before = malloc(h->map_len);
        memcpy(before, h->base, h->map_len);
        for (uint32_t i = 0; i < nf; i++)
            give(h, &b[order[i]]);
        check_arena(h, 1);
        struct walk shuffled, ascending;
        walk_chain(h, &shuffled);
        memcpy(h->base, before, h->map_len);
        for (uint32_t i = 0; i < n; i++)
            if (freed[i])
                give(h, &b[i]);
        check_arena(h, 1);
        walk_chain(h, &ascending);
        CHECK(same_chain(&shuffled, &ascending), "freeing the same blocks in two orders gives two chains");
        free(before);
        free(order);
        /* the free runs, from what we freed */
        uint32_t *runs = malloc(n * sizeof *runs), nr = 0, largest = 0;
        for (uint32_t i = 0; i < n;) {
            if (!freed[i]) {
                i++;
                continue;
            }
            uint32_t len = 0;
            for (; i < n && freed[i]; i++)
                len += b[i].len;
            runs[nr++] = len;
            largest = len > largest ? len : largest;
        }
        CHECK(shuffled.free_bytes == 0 || nr > 0, "no runs");
        uint64_t lb, fb, lf, blocks;
        rdv_arena_usage(h, &lb, &fb, &lf, &blocks);
        CHECK(lf == (uint64_t)largest * 64, "largest_free %llu, the largest run is %u granules",
              (unsigned long long)lf, largest);
        struct owned o;
        int rc = take(h, (uint64_t)largest * 64 + 1, &o);
        CHECK(rc == -ENOSPC, "alloc one byte larger than the largest run (%u granules): %d", largest, rc);
        /* then every run, largest first, each exactly: none is passed over
         * whatever its class or place */
        for (uint32_t i = 1; i < nr; i++) /* insertion sort, descending */
            for (uint32_t j = i; j > 0 && runs[j] > runs[j - 1]; j--) {
                uint32_t t = runs[j];
                runs[j] = runs[j - 1], runs[j - 1] = t;
            }
        for (uint32_t i = 0; i < nr; i++) {
            rc = take(h, (uint64_t)runs[i] * 64, &o);
            CHECK(rc == 0, "alloc of exactly the free run %u of %u (%u granules): %d", i, nr, runs[i], rc);
            CHECK(o.len == runs[i], "alloc of a %u-granule run got %u", runs[i], o.len);
            if (i % 16 == 0)
                check_arena(h, 1);
        }
        check_arena(h, 1);
        CHECK(h->khdr->arena.free_bytes == 0, "after taking every run %llu bytes are still free",
              (unsigned long long)h->khdr->arena.free_bytes);
        CHECK(take(h, 64, &o) == -ENOSPC, "a full arena handed out a block");
        printf("unit_arena: order: round %d: %u blocks, %u freed into %u runs, largest %u granules\n", round, n,
               nf, nr, largest);
        walk_free(&shuffled);
        walk_free(&ascending);
        free(runs);
    }
    free(freed);
    free(b);
    drop_segment(h, fd);
}

/* ---- 3. crash windows ----------------------------------------------------- */

#define CHILD 5 /* the process entry the dying children act as */
#define MAXB 2048

struct state {
    struct owned b[MAXB];
    uint8_t child[MAXB]; /* allocated as CHILD */
    uint8_t gone[MAXB];  /* freed since (indexes stay put) */
    uint32_t n;
};

static void st_take(rdv_t *h, struct state *st, uint64_t nbytes, int as_child) {
    uint32_t me = h->me;
    if (as_child)
        h->me = CHILD;
    int rc = take(h, nbytes, &st->b[st->n]);
    h->me = me;
    CHECK(rc == 0, "setting up: alloc of %llu: %d", (unsigned long long)nbytes, rc);
    st->gone[st->n] = 0;
    st->child[st->n++] = (uint8_t)as_child;
}

static void st_give(rdv_t *h, struct state *st, uint32_t i) {
    CHECK(i < st->n && !st->gone[i], "setting up: block %u is not live", i);
    give(h, &st->b[i]);
    st->gone[i] = 1;
}

static void st_reset(rdv_t *h, struct state *st) {
    reset_arena(h);
    memset(st, 0, sizeof *st);
}

/* Free every busy block that names `owner` (walked as recovery walks). */
static uint32_t free_owned_by(rdv_t *h, uint16_t owner) {
    uint64_t *pos = malloc(sizeof *pos * (h->granules / RDV_MIN_BLOCK + 1));
    uint32_t n = 0;
    struct rdv_msg *m;
    for (uint32_t g = 0; (m = rdv_arena_next(h, &g)); rdv_arena_step(h, &g))
        if (m->owner == owner)
            pos[n++] = m->pos;
    for (uint32_t i = 0; i < n; i++) {
        int rc = rdv_arena_free(h, pos[i]);
        CHECK(rc == 0, "free of a block owned by %u: %d", owner, rc);
    }
    free(pos);
    return n;
}

/* Every busy block belongs to someone we know of. */
static void check_owners(rdv_t *h, uint16_t a, uint16_t b) {
    struct rdv_msg *m;
    for (uint32_t g = 0; (m = rdv_arena_next(h, &g)); rdv_arena_step(h, &g))
        CHECK(m->owner == a || m->owner == b, "busy block at %u owned by %u", g, m->owner);
}

/* Bytes and blocks that name owner. */
static void owned_by(rdv_t *h, uint16_t owner, uint64_t *bytes, uint64_t *blocks) {
    struct rdv_msg *m;
    *bytes = *blocks = 0;
    for (uint32_t g = 0; (m = rdv_arena_next(h, &g)); rdv_arena_step(h, &g))
        if (m->owner == owner) {
            *bytes += (uint64_t)RDV_SIDE_LEN(h->kside[g]) * RDV_GRANULE;
            ++*blocks;
        }
}

/* After a death: free the dead child's blocks and ours, in either order
 * (a block freed next to a busy one reads the END tag a step may have left
 * stale inside it); the counters must agree with them at each stage, and
 * nothing may be left. */
static unsigned settles;

static void settle(rdv_t *h, const struct owned *ours, uint32_t n_ours) {
    check_owners(h, (uint16_t)(h->me + 1), CHILD + 1);
    int ours_first = settles++ % 2;
    uint64_t live = 0, child_bytes, child_blocks;
    for (uint32_t i = 0; i < n_ours; i++) {
        check_stamp(h, &ours[i]);
        live += (uint64_t)ours[i].len * RDV_GRANULE;
    }
    owned_by(h, CHILD + 1, &child_bytes, &child_blocks);
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    CHECK(ka->live_bytes == live + child_bytes && ka->live_blocks == n_ours + child_blocks,
          "after the death: %llu bytes in %llu blocks live; ours are %llu in %u, the dead child's %llu in %llu",
          (unsigned long long)ka->live_bytes, (unsigned long long)ka->live_blocks, (unsigned long long)live, n_ours,
          (unsigned long long)child_bytes, (unsigned long long)child_blocks);
    if (ours_first) {
        for (uint32_t i = 0; i < n_ours; i++)
            give(h, &ours[n_ours - 1 - i]);
        check_arena(h, 0);
        CHECK(ka->live_bytes == child_bytes && ka->live_blocks == child_blocks, "after freeing ours");
        free_owned_by(h, CHILD + 1);
    } else {
        free_owned_by(h, CHILD + 1);
        check_arena(h, 0);
        CHECK(ka->live_bytes == live && ka->live_blocks == n_ours, "after freeing the dead child's blocks");
        for (uint32_t i = 0; i < n_ours; i++)
            give(h, &ours[i]);
    }
    check_empty(h);
}

#if defined(__x86_64__)
#define HAVE_STORE_STEPPING 1

/* Counting stores: the header's first two pages (the arena's control
 * block, its lock word included), the side table and the arena (block
 * headers: the step writes no payload) are write-protected;
 * each store faults, is counted, and is let through by single-stepping the
 * faulting instruction with the protection lifted (the trap flag), after
 * which the protection comes back. At store number `die_at` the process
 * kills itself instead: what a SIGKILL between two stores leaves. */
static struct {
    uint8_t *p;
    size_t n;
} guarded[3];
static volatile long die_at = -1, stores_seen;

static void guard(int on) {
    for (int i = 0; i < 3; i++)
        mprotect(guarded[i].p, guarded[i].n, on ? PROT_READ : PROT_READ | PROT_WRITE);
}

static void on_segv(int sig, siginfo_t *si, void *ucv) {
    (void)sig;
    uint8_t *a = si->si_addr;
    int ours = 0;
    for (int i = 0; i < 3; i++)
        ours |= a >= guarded[i].p && a < guarded[i].p + guarded[i].n;
    if (!ours) {
        signal(SIGSEGV, SIG_DFL); /* a real fault: let it crash */
        return;
    }
    if (stores_seen == die_at)
        kill(getpid(), SIGKILL);
    stores_seen++;
    guard(0);
    ((ucontext_t *)ucv)->uc_mcontext.gregs[REG_EFL] |= 0x100; /* trap after this one instruction */
}

static void on_trap(int sig, siginfo_t *si, void *ucv) {
    (void)sig, (void)si;
    guard(1);
    ((ucontext_t *)ucv)->uc_mcontext.gregs[REG_EFL] &= ~0x100LL;
}

struct step {
    int alloc;       /* 1: alloc nbytes; 0: free block `victim` (a child's); 2: repair */
    uint64_t nbytes;
    uint64_t victim; /* position */
    int expect;      /* what it returns */
};

struct shared_result {
    long stores;
    uint64_t pos;
    int rc;
};
static struct shared_result *result;

/* In a forked child acting as CHILD: run the step, dying before store
 * die_at (never if -1). Reports the number of stores it made. */
static void run_step_child(rdv_t *h, const struct step *st, long kill_at) {
    h->me = CHILD;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sa.sa_sigaction = on_segv;
    sigaction(SIGSEGV, &sa, NULL);
    sa.sa_sigaction = on_trap;
    sigaction(SIGTRAP, &sa, NULL);
    guarded[0].p = h->base;
    guarded[0].n = RDV_HEADER_BYTES;
    guarded[1].p = (uint8_t *)h->kside;
    guarded[1].n = ((size_t)h->granules * 4 + RDV_PAGE - 1) / RDV_PAGE * RDV_PAGE;
    guarded[2].p = h->karena;
    guarded[2].n = h->cap;
    die_at = kill_at;
    stores_seen = 0;
    guard(1);
    int rc = 0;
    uint64_t pos = 0;
    if (st->alloc == 1)
        rc = rdv_arena_alloc(h, st->nbytes, &pos);
    else if (st->alloc == 0)
        rc = rdv_arena_free(h, st->victim);
    else
        rdv_arena_repair(h);
    guard(0);
    result->stores = stores_seen;
    result->pos = pos;
    result->rc = rc;
    _exit(0);
}

static pid_t fork_step(rdv_t *h, const struct step *st, long kill_at) {
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        alarm(20);
        run_step_child(h, st, kill_at);
    }
    return pid;
}

static int wait_child(pid_t pid) {
    int status;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    if (WIFSIGNALED(status))
        return -WTERMSIG(status);
    return WEXITSTATUS(status);
}

static unsigned windows_run, windows_held, repair_windows_run;

/* Run step in a child dying before each of its stores in turn; after each
 * death check that the chain is the one before the step or the one after
 * it, then that the parent, finding the dead holder, repairs everything,
 * and that freeing the dead child's blocks and ours leaves nothing. */
static void crash_windows(rdv_t *h, const struct state *st, struct step step, const char *what) {
    phase = what;
    uint8_t *snap = malloc(h->map_len);
    memcpy(snap, h->base, h->map_len);
    /* our range of allocation numbers is part of the state each run starts
     * from (the parent's own allocations between runs use it up) */
    uint64_t seq_snap = h->seq_word, reserved_snap = h->seq_reserved;
    struct walk before, after;
    walk_chain(h, &before);
    /* the reference run: the whole step */
    int r = wait_child(fork_step(h, &step, -1));
    CHECK(r == 0, "the reference run of the step ended with %d", r);
    CHECK(result->rc == step.expect, "the step returned %d, not %d", result->rc, step.expect);
    long n = result->stores;
    uint64_t new_pos = result->pos;
    int did = result->rc == 0;
    check_arena(h, 1);
    walk_chain(h, &after);
    CHECK(n > 0 && n < 1000000, "the step made %ld stores", n);
    /* ours (the parent's) are the state's non-child blocks */
    static struct owned ours[MAXB + 1], all[MAXB + 2];
    uint32_t n_ours = 0;
    for (uint32_t i = 0; i < st->n; i++)
        if (!st->child[i] && !st->gone[i])
            ours[n_ours++] = st->b[i];
    for (long k = 0; k < n; k++) {
        memcpy(h->base, snap, h->map_len);
        h->seq_word = seq_snap;
        h->seq_reserved = reserved_snap;
        r = wait_child(fork_step(h, &step, k));
        CHECK(r == -SIGKILL, "the child meant to die before store %ld of %ld ended with %d", k, n, r);
        windows_run++;
        struct walk now;
        walk_chain(h, &now);
        int is_before = same_chain(&now, &before), is_after = same_chain(&now, &after);
        CHECK(is_before || is_after, "killed before store %ld of %ld: the chain is neither before nor after the step",
              k, n);
        walk_free(&now);
        int held = h->khdr->arena.lock == CHILD + 1;
        windows_held += held;
        /* Repairs can die too: a reclaimer killed inside one, and then
         * another reclaimer. Sampled, and mostly early (list and counter
         * resets, the first blocks): a repair stores to every free
         * block's interior, and every store stepped costs ~30 us. */
        if (held && k % 4 == 0) {
            uint8_t *dead = malloc(h->map_len);
            memcpy(dead, h->base, h->map_len);
            struct step rep = {.alloc = 2};
            for (int j = 0; j < 2; j++) {
                memcpy(h->base, dead, h->map_len);
                long at = (long)(rng() % (j ? 1024 : 64));
                r = wait_child(fork_step(h, &rep, at));
                CHECK(r == -SIGKILL || r == 0, "a repair meant to die at %ld ended with %d", at, r);
                repair_windows_run += r == -SIGKILL;
                struct walk mid;
                walk_chain(h, &mid); /* whole, even with a repair cut short */
                walk_free(&mid);
                /* the lock still names the first dead: the next waiter repairs again */
                alive_tab[CHILD] = 0;
                struct owned extra[1];
                uint32_t ne = take(h, 64, &extra[0]) == 0;
                alive_tab[CHILD] = 1;
                check_arena(h, 0);
                memcpy(all, ours, n_ours * sizeof *ours);
                if (ne)
                    all[n_ours] = extra[0];
                settle(h, all, n_ours + ne);
            }
            memcpy(h->base, dead, h->map_len);
            free(dead);
        }
        /* the parent's next step finds the dead holder and repairs */
        alive_tab[CHILD] = 0;
        unsigned calls = dead_holder_calls;
        struct owned extra;
        int rc = take(h, 64, &extra);
        CHECK(rc == 0 || rc == -ENOSPC, "the parent's alloc after the death: %d", rc);
        CHECK(!held || dead_holder_calls > calls, "the lock named the dead child, the hook was not called");
        alive_tab[CHILD] = 1;
        check_arena(h, 0);
        if (step.alloc == 1 && did) {
            uint64_t len;
            struct rdv_msg *m = rdv_block_at(h, new_pos, &len);
            m = m && m->owner == CHILD + 1 ? m : NULL; /* ours may have the same position */
            CHECK(!!m == is_after, "killed before store %ld: chain %s the step, the new block %s", k,
                  is_after ? "after" : "before", m ? "exists" : "does not");
        } else if (step.alloc == 0) {
            uint64_t len;
            struct rdv_msg *m = rdv_block_at(h, step.victim, &len);
            CHECK(!!m == is_before, "killed before store %ld: chain %s the free, the block %s", k,
                  is_after ? "after" : "before", m ? "is still busy" : "is gone");
        }
        ours[n_ours] = extra;
        settle(h, ours, n_ours + (rc == 0));
    }
    memcpy(h->base, snap, h->map_len);
    h->seq_word = seq_snap;
    h->seq_reserved = reserved_snap;
    free(snap);
    walk_free(&before);
    walk_free(&after);
}

static uint64_t child_victim(const struct state *st, uint32_t i) {
    CHECK(i < st->n && st->child[i] && !st->gone[i], "victim %u is not a live block of the child's", i);
    return st->b[i].pos;
}

static void test_store_windows(void) {
    phase = "store windows";
    int fd;
    rdv_t *h = make_segment(256 << 10, &fd); /* 4096 granules */
    uint32_t G = h->granules;
    result = mmap(NULL, sizeof *result, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(result != MAP_FAILED, "mmap");
    static struct state st;
    unsigned scenarios = 0;
    /* alloc at the cursor, a remainder left */
    st_reset(h, &st);
    crash_windows(h, &st, (struct step){.alloc = 1, .nbytes = 1000}, "alloc: fresh arena"), scenarios++;
    /* the whole arena: no remainder */
    crash_windows(h, &st, (struct step){.alloc = 1, .nbytes = h->cap}, "alloc: whole arena"), scenarios++;
    /* a remainder too small to keep: handed out with the block */
    st_reset(h, &st);
    st_take(h, &st, 64 * (G - 10), 0);
    crash_windows(h, &st, (struct step){.alloc = 1, .nbytes = 64 * 7}, "alloc: remainder < min block"), scenarios++;
    /* an exact fit between two busy blocks, at the cursor: the block's
     * last entry held the free block's END tag */
    st_reset(h, &st);
    st_take(h, &st, 64 * 100, 0);
    st_take(h, &st, 64 * 10, 0);
    st_take(h, &st, 64 * 100, 0);
    st_give(h, &st, 1);
    h->khdr->arena.cursor = st.b[1].g;
    crash_windows(h, &st, (struct step){.alloc = 1, .nbytes = 64 * 10}, "alloc: exact fit, busy neighbours"),
        scenarios++;
    crash_windows(h, &st, (struct step){.alloc = 1, .nbytes = 64 * 8}, "alloc: near fit, busy neighbours"),
        scenarios++;
    /* from the lists (the cursor's block too small): free blocks of 4, 34,
     * 64, 94 and 127 granules; 125 is in 127's class (124..127), and the
     * smallest class whose every block holds 125 is the next one, empty:
     * found by the look at each block of its own class */
    st_reset(h, &st);
    for (int i = 0; i < 40; i++)
        st_take(h, &st, 64 * (4 + 30 * (i % 5) + 3 * (i % 5 == 4)), i % 3 == 0);
    while (h->khdr->arena.free_bytes >= 64 * 40)
        st_take(h, &st, 64 * 40, 0);
    for (uint32_t i = 0; i < 40; i += 4)
        st_give(h, &st, i);
    h->khdr->arena.cursor = 0; /* a free block of 4 */
    crash_windows(h, &st, (struct step){.alloc = 1, .nbytes = 64 * 20}, "alloc: from a list"), scenarios++;
    crash_windows(h, &st, (struct step){.alloc = 1, .nbytes = 64 * 125}, "alloc: list, in-class fit"), scenarios++;
    crash_windows(h, &st, (struct step){.alloc = 1, .nbytes = 64 * 128, .expect = -ENOSPC}, "alloc: refused"), scenarios++;
    /* frees: isolated, with the block after free, before, both (the
     * cursor inside the merged range); blocks 0..11 are the child's, in
     * order from granule 0, then one of ours, then a free tail */
    st_reset(h, &st);
    for (int i = 0; i < 12; i++)
        st_take(h, &st, 64 * (4 + i), 1);
    st_take(h, &st, 64 * (G - 200), 0);
    crash_windows(h, &st, (struct step){.alloc = 0, .victim = child_victim(&st, 0)}, "free: first, isolated"),
        scenarios++;
    crash_windows(h, &st, (struct step){.alloc = 0, .victim = child_victim(&st, 5)}, "free: isolated"), scenarios++;
    st_give(h, &st, 6);
    crash_windows(h, &st, (struct step){.alloc = 0, .victim = child_victim(&st, 5)}, "free: next is free"),
        scenarios++;
    crash_windows(h, &st, (struct step){.alloc = 0, .victim = child_victim(&st, 7)}, "free: previous is free"),
        scenarios++;
    st_give(h, &st, 4);
    h->khdr->arena.cursor = st.b[5].g + 1;
    crash_windows(h, &st, (struct step){.alloc = 0, .victim = child_victim(&st, 5)}, "free: both free, cursor in"),
        scenarios++;
    /* the tail: the block next to the arena's end, and the last one */
    crash_windows(h, &st, (struct step){.alloc = 0, .victim = child_victim(&st, 11)}, "free: next to ours"),
        scenarios++;
    st_reset(h, &st);
    st_take(h, &st, 64 * (G - 8), 0);
    st_take(h, &st, 64 * 8, 1);
    crash_windows(h, &st, (struct step){.alloc = 0, .victim = child_victim(&st, 1)}, "free: last block"),
        scenarios++;
    st_give(h, &st, 0);
    crash_windows(h, &st, (struct step){.alloc = 0, .victim = child_victim(&st, 1)}, "free: last, all else free"),
        scenarios++;
    /* random states and steps */
    for (int r = 0; r < 24; r++) {
        char name[64];
        st_reset(h, &st);
        for (int i = 0; i < 300; i++) {
            uint32_t j = st.n ? (uint32_t)(rng() % st.n) : 0;
            if (st.n && !st.gone[j] && rng() % 3 == 0) {
                st_give(h, &st, j);
                continue;
            }
            uint32_t me = h->me;
            int child = rng() % 2;
            if (child)
                h->me = CHILD;
            int rc = take(h, 64 * (1 + rng() % 48), &st.b[st.n]);
            h->me = me;
            if (rc == 0)
                st.gone[st.n] = 0, st.child[st.n++] = (uint8_t)child;
        }
        check_arena(h, 1);
        uint32_t nchild = 0, pick = 0;
        for (uint32_t i = 0; i < st.n; i++)
            if (st.child[i] && !st.gone[i] && rng() % ++nchild == 0)
                pick = i;
        if (r % 2 == 0 || !nchild) {
            snprintf(name, sizeof name, "random %d: alloc", r);
            uint64_t nbytes = 64 * (1 + rng() % 64), lb, fb, largest, blocks;
            rdv_arena_usage(h, &lb, &fb, &largest, &blocks);
            int expect = largest >= (nbytes < 256 ? 256 : nbytes) ? 0 : -ENOSPC;
            crash_windows(h, &st, (struct step){.alloc = 1, .nbytes = nbytes, .expect = expect}, name);
        } else {
            snprintf(name, sizeof name, "random %d: free", r);
            crash_windows(h, &st, (struct step){.alloc = 0, .victim = child_victim(&st, pick)}, name);
        }
        scenarios++;
    }
    phase = "store windows";
    printf("unit_arena: store windows: %u steps, killed before each store: %u deaths (%u holding the lock), "
           "%u deaths inside repairs\n",
           scenarios, windows_run, windows_held, repair_windows_run);
    CHECK(windows_held > windows_run / 2, "most deaths should be inside the lock");
    munmap(result, sizeof *result);
    drop_segment(h, fd);
}

/* 3(b): a repair that dies. The states the steps leave have no two adjacent
 * free blocks; damage may (repair merges them: "neighbours a step left
 * apart"). Lay out [free 20][free 30][ours, busy][free rest] by hand, the
 * lock naming the dead child, and kill a reclaimer before each store of its
 * repair in turn: another repair must then find the chain whole, every
 * granule accounted for and our block still ours. */
static void test_repair_windows(void) {
    phase = "repair windows";
    int fd;
    rdv_t *h = make_segment(8 << 10, &fd); /* 128 granules: a repair stores to each */
    uint32_t G = h->granules;
    result = mmap(NULL, sizeof *result, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(result != MAP_FAILED, "mmap");
    struct owned ours;
    CHECK(take(h, 64 * 40, &ours) == 0 && ours.len == 40, "setting up");
    /* move it to granule 50: a block is where its tag and header say */
    uint32_t at = 50, len = ours.len;
    memset(h->kside, 0, (size_t)G * 4);
    h->kside[0] = RDV_SIDE_FREE | 20;
    h->kside[19] = RDV_SIDE_END | 20;
    h->kside[20] = RDV_SIDE_FREE | 30;
    h->kside[49] = RDV_SIDE_END | 30;
    h->kside[at] = RDV_SIDE_BUSY | len;
    if (at + len < G) {
        h->kside[at + len] = RDV_SIDE_FREE | (G - at - len);
        h->kside[G - 1] = RDV_SIDE_END | (G - at - len);
    }
    memmove(h->karena + (uint64_t)at * 64, h->karena, (uint64_t)len * 64);
    ours.pos = rdv_pos_make(rdv_pos_seq(ours.pos), at);
    ours.g = at;
    ((struct rdv_msg *)rdv_msg_at(h, ours.pos))->pos = ours.pos;
    h->khdr->arena.lock = CHILD + 1;
    uint8_t *snap = malloc(h->map_len);
    memcpy(snap, h->base, h->map_len);
    struct step rep = {.alloc = 2};
    int r = wait_child(fork_step(h, &rep, -1));
    CHECK(r == 0, "the reference repair ended with %d", r);
    long n = result->stores;
    check_stamp(h, &ours);
    unsigned broken = 0;
    long first_broken = -1;
    for (long k = 0; k < n; k++) {
        memcpy(h->base, snap, h->map_len);
        r = wait_child(fork_step(h, &rep, k));
        CHECK(r == -SIGKILL, "the repair meant to die before store %ld ended with %d", k, r);
        /* the chain, as any lock-free walker sees it now */
        uint32_t g = 0;
        int whole = 1;
        while (g < G && whole) {
            uint32_t v = h->kside[g], kind = RDV_SIDE_KIND(v), l = RDV_SIDE_LEN(v);
            whole = (kind == RDV_SIDE_BUSY || kind == RDV_SIDE_FREE) && l && l <= G - g;
            g += whole ? l : 0;
        }
        alive_tab[CHILD] = 0;
        uint64_t lb, fb, lf, blocks;
        rdv_arena_usage(h, &lb, &fb, &lf, &blocks); /* the next waiter repairs */
        alive_tab[CHILD] = 1;
        uint64_t blen;
        int kept = rdv_block_at(h, ours.pos, &blen) != NULL && rdv_arena_free(h, ours.pos) == 0;
        int empty = kept && h->kside[0] == (RDV_SIDE_FREE | G) && h->khdr->arena.free_bytes == h->cap;
        if (!whole || !kept || !empty) {
            if (!broken++)
                first_broken = k;
            continue;
        }
        check_empty(h);
    }
    memcpy(h->base, snap, h->map_len);
    free(snap);
    printf("unit_arena: repair windows: a repair merging two free blocks, killed before each of its %ld stores: "
           "%u deaths broke the chain or lost space\n", n, broken);
    if (broken)
        printf("unit_arena: repair windows: the first before store %ld\n", first_broken);
    CHECK(!broken, "a reclaimer killed inside rdv_arena_repair (merging adjacent free blocks) leaves a chain that "
                   "the next repair cannot follow: space lost, a live block swallowed");
    munmap(result, sizeof *result);
    h->khdr->arena.lock = 0;
    drop_segment(h, fd);
}
#endif

/* 3(c): children with handles of their own, SIGKILLed at random moments */

#define KILLS 200
#define CHILD_HOLD 48

static void churn(int memfd, int ready) {
    rdv_t *h = attach_handle(memfd);
    uint32_t entry = h->me;
    CHECK(write(ready, &entry, 4) == 4, "child: write");
    uint64_t held[CHILD_HOLD];
    uint32_t n = 0;
    for (;;) { /* until killed */
        uint64_t pos;
        int rc = n < CHILD_HOLD ? rdv_arena_alloc(h, random_size(64 << 10), &pos) : -ENOSPC;
        if (rc == 0)
            held[n++] = pos;
        else if (rc != -ENOSPC)
            FAIL("child: alloc: %d", rc);
        if (n && (rc || rng() % 2)) {
            uint32_t i = (uint32_t)(rng() % n);
            rc = rdv_arena_free(h, held[i]);
            CHECK(rc == 0, "child: free: %d", rc);
            held[i] = held[--n];
        }
    }
}

static void test_kill_loop(void) {
    phase = "kill loop";
    int fd;
    rdv_t *h = make_segment(2 << 20, &fd);
    static struct owned ours[64];
    uint32_t n_ours = 0;
    unsigned held_lock = 0, mid_step = 0, reclaimed_blocks = 0;
    for (int k = 0; k < KILLS; k++) {
        /* our own blocks come and go between children */
        for (int i = 0; i < 6; i++) {
            if (n_ours && rng() % 2) {
                uint32_t j = (uint32_t)(rng() % n_ours);
                give(h, &ours[j]);
                ours[j] = ours[--n_ours];
            } else if (n_ours < 64 && take(h, random_size(32 << 10), &ours[n_ours]) == 0) {
                n_ours++;
            }
        }
        int p[2];
        CHECK(pipe(p) == 0, "pipe");
        uint64_t child_seed = rng();
        fflush(stdout);
        pid_t pid = fork();
        CHECK(pid >= 0, "fork");
        if (pid == 0) {
            alarm(20);
            close(p[0]);
            rng_state = child_seed | 1;
            churn(fd, p[1]);
        }
        close(p[1]);
        uint32_t entry;
        CHECK(read(p[0], &entry, 4) == 4, "the child did not start");
        close(p[0]);
        CHECK(entry != h->me && entry < RDV_MAX_PROCS, "the child's entry %u", entry);
        uint64_t r = rng() % 8;
        if (r) /* and now and then at once */
            usleep((useconds_t)(rng() % (r < 6 ? 2000 : 20000)));
        kill(pid, SIGKILL);
        int status;
        CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the child ended with status 0x%x", status);
        CHECK(!rdv_live_held_elsewhere(h, entry), "a dead child's byte lock is still held");
        /* the chain is whole whatever the moment */
        struct walk w;
        walk_chain(h, &w);
        walk_free(&w);
        int held = h->khdr->arena.lock == entry + 1;
        held_lock += held;
        if (held) { /* were the derived state consistent, this death would be harmless */
            struct rdv_arena_ctl *ka = &h->khdr->arena;
            walk_chain(h, &w);
            mid_step += ka->live_bytes != w.live_bytes || ka->free_bytes != w.free_bytes;
            walk_free(&w);
        }
        alive_tab[entry] = 0;
        unsigned calls = dead_holder_calls;
        if (n_ours < 64 && take(h, random_size(32 << 10), &ours[n_ours]) == 0)
            n_ours++;
        else if (n_ours) {
            give(h, &ours[n_ours - 1]);
            n_ours--;
        } else {
            uint64_t lb, fb, lf, blocks;
            rdv_arena_usage(h, &lb, &fb, &lf, &blocks);
        }
        CHECK(!held || dead_holder_calls > calls, "the lock named the dead child, the hook was not called");
        check_arena(h, 0);
        check_owners(h, (uint16_t)(h->me + 1), (uint16_t)(entry + 1));
        /* the dead child's blocks, found by their owner */
        reclaimed_blocks += free_owned_by(h, (uint16_t)(entry + 1));
        check_arena(h, 0);
        uint64_t live = 0;
        for (uint32_t i = 0; i < n_ours; i++) {
            check_stamp(h, &ours[i]);
            live += (uint64_t)ours[i].len * RDV_GRANULE;
        }
        CHECK(h->khdr->arena.live_bytes == live && h->khdr->arena.live_blocks == n_ours,
              "kill %d: %llu bytes in %llu blocks live, ours are %llu in %u", k,
              (unsigned long long)h->khdr->arena.live_bytes, (unsigned long long)h->khdr->arena.live_blocks,
              (unsigned long long)live, n_ours);
        /* the entry is reused by the next child, as recovery would free it */
        smp_store_release(&h->kprocs[entry].state, RDV_PROC_FREE);
        alive_tab[entry] = 1;
        if (k % 25 == 24 || k == KILLS - 1) {
            while (n_ours)
                give(h, &ours[--n_ours]);
            check_empty(h);
        }
    }
    printf("unit_arena: kill loop: %d kills, %u holding the arena lock (%u mid-step), %u blocks of the dead freed\n",
           KILLS, held_lock, mid_step, reclaimed_blocks);
    CHECK(held_lock > 0, "no child was ever killed inside the arena lock");
    drop_segment(h, fd);
}

/* ---- 4. positions ---------------------------------------------------------- */

static void test_positions(void) {
    phase = "positions";
    int fd;
    rdv_t *h = make_segment(64 << 10, &fd);
    struct owned a, b, c;
    uint64_t len;
    CHECK(take(h, 500, &a) == 0 && a.g == 0, "first block at granule 0");
    CHECK(take(h, 500, &c) == 0, "second block");
    CHECK(rdv_block_at(h, a.pos, &len) != NULL && len == (uint64_t)a.len * 64, "a live block");
    CHECK(rdv_queued_msg(h, rdv_link_of(a.pos), &len) == rdv_msg_at(h, a.pos), "a live block by its link");
    /* interior granules, out of range, link 0 */
    CHECK(rdv_block_at(h, rdv_pos_make(rdv_pos_seq(a.pos), a.g + 1), &len) == NULL, "an interior granule");
    CHECK(rdv_block_at(h, rdv_pos_make(rdv_pos_seq(a.pos), h->granules), &len) == NULL, "past the arena");
    CHECK(rdv_queued_msg(h, 0, &len) == NULL && rdv_queued_msg(h, h->granules + 1, &len) == NULL, "bad links");
    CHECK(rdv_queued_msg(h, a.g + 2, &len) == NULL, "a link to an interior granule");
    /* a payload offset past the block */
    struct rdv_msg *m = rdv_msg_at(h, a.pos);
    m->payload_off = (uint32_t)(a.len * 64 + 64);
    CHECK(rdv_block_at(h, a.pos, &len) == NULL, "a payload offset past the block");
    m->payload_off = (uint32_t)(a.len * 64); /* an empty payload at the end: fine */
    CHECK(rdv_block_at(h, a.pos, &len) == m, "an empty payload ending the block");
    m->payload_off = 0;
    /* freed */
    give(h, &a);
    CHECK(rdv_block_at(h, a.pos, &len) == NULL, "a freed block by its position");
    CHECK(rdv_queued_msg(h, rdv_link_of(a.pos), &len) == NULL, "a freed block by its link");
    CHECK(rdv_arena_free(h, a.pos) == -EINVAL, "a double free");
    /* a later block at the same granule: the old position is not it */
    give(h, &c); /* the arena is one block again, the cursor back at 0 */
    CHECK(take(h, 500, &b) == 0 && b.g == a.g, "the next block at granule %u (got %u)", a.g, b.g);
    CHECK(b.pos != a.pos && rdv_pos_seq(b.pos) > rdv_pos_seq(a.pos), "positions carry the allocation number");
    CHECK(rdv_block_at(h, a.pos, &len) == NULL, "an old position at a reused granule");
    CHECK(rdv_block_at(h, b.pos, &len) == rdv_msg_at(h, b.pos), "the new block");
    CHECK(rdv_queued_msg(h, rdv_link_of(b.pos), &len) == rdv_msg_at(h, b.pos), "the new block by its link");
    CHECK(rdv_arena_free(h, a.pos) == -EINVAL, "a free of the old position");
    check_stamp(h, &b);
    CHECK(h->khdr->arena.live_blocks == 1, "the wrong free freed something");
    /* a header that names another granule (a copy of a block) is not a block */
    m = rdv_msg_at(h, b.pos);
    uint64_t keep = m->pos;
    m->pos = rdv_pos_make(rdv_pos_seq(keep), b.g + 4);
    CHECK(rdv_queued_msg(h, rdv_link_of(b.pos), &len) == NULL, "a header naming another granule");
    m->pos = keep;
    give(h, &b);
    check_empty(h);
    printf("unit_arena: positions: ok\n");
    drop_segment(h, fd);
}

/* ---- runs: blocks for a batch under one hold of the lock ------------------
 * rdv_arena_alloc_run gives blocks for sizes in order, each as
 * rdv_arena_alloc would, as many as fit now; never waits. */
static void test_runs(void) {
    phase = "runs";
    int fd;
    rdv_t *h = make_segment(64 << 10, &fd);
    struct owned o[64];
    uint64_t pos[64];
    uint64_t sizes[] = {500, 64, 5000, 300};
    CHECK(rdv_arena_alloc_run(h, sizes, 4, pos) == 4, "a run of four that fits");
    for (int i = 0; i < 4; i++)
        adopt(h, pos[i], sizes[i], &o[i]);
    check_arena(h, 1);
    for (int i = 0; i < 4; i++)
        give(h, &o[i]);
    check_empty(h);
    /* more than fits: the blocks that fit, in order, and then no room */
    uint64_t big[64];
    for (int i = 0; i < 64; i++)
        big[i] = 4000;
    uint32_t k = rdv_arena_alloc_run(h, big, 64, pos);
    CHECK(k >= 8 && k < 64, "a run larger than the arena: %u blocks", k);
    for (uint32_t i = 0; i < k; i++)
        adopt(h, pos[i], big[i], &o[i]);
    check_arena(h, 1);
    uint64_t extra;
    CHECK(rdv_arena_alloc(h, 4000, &extra) == -ENOSPC, "the run stopped with room left");
    for (uint32_t i = 0; i < k; i++)
        give(h, &o[i]);
    check_empty(h);
    /* a size the arena can never hold ends the run there */
    uint64_t odd[] = {64, (uint64_t)h->granules * RDV_GRANULE + 64, 64};
    CHECK(rdv_arena_alloc_run(h, odd, 3, pos) == 1, "a run ends at a size that can never fit");
    adopt(h, pos[0], odd[0], &o[0]);
    give(h, &o[0]);
    check_empty(h);
    printf("unit_arena: runs: %u of 64 fitted, ok\n", k);
    drop_segment(h, fd);
}

/* ---- 5. allocation numbers --------------------------------------------------
 * Handles reserve them from the segment in ranges that grow (1, 1, 2, 4,
 * ...) up to RDV_SEQ_BATCH: unique across handles and threads, growing
 * along each handle's allocations, all below the counter (what lease
 * recovery's ages count back from); a handle that allocates once reserves
 * one, and one that allocates n reserves at most n + RDV_SEQ_BATCH. */

#define NUM_THREADS 4
#define NUM_PER_THREAD 3000
#define NUM_ALL (2 * 700 + NUM_THREADS * NUM_PER_THREAD)

static uint64_t seen[NUM_ALL];
static uint32_t n_seen;

static void note_seq(rdv_t *h, uint64_t pos, uint64_t *last) {
    uint64_t seq = rdv_pos_seq(pos);
    CHECK(*last == UINT64_MAX || seq > *last, "a handle's numbers do not grow: %llu after %llu",
          (unsigned long long)seq, (unsigned long long)*last);
    CHECK(seq < READ_ONCE(h->khdr->arena.alloc_seq), "number %llu not below the counter", (unsigned long long)seq);
    *last = seq;
    seen[__atomic_fetch_add(&n_seen, 1, __ATOMIC_RELAXED)] = seq;
}

struct num_thread {
    rdv_t *h;
    pthread_t t;
};

static void *number_loop(void *arg) {
    struct num_thread *nt = arg;
    uint64_t last = UINT64_MAX;
    for (int i = 0; i < NUM_PER_THREAD; i++) {
        uint64_t pos;
        CHECK(rdv_arena_alloc(nt->h, 200, &pos) == 0, "thread alloc");
        note_seq(nt->h, pos, &last);
        CHECK(rdv_arena_free(nt->h, pos) == 0, "thread free");
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_numbers(void) {
    phase = "numbers";
    int fd;
    rdv_t *a = make_segment(1 << 20, &fd), *b = attach_handle(fd);
    n_seen = 0;
    uint64_t last_a = UINT64_MAX, last_b = UINT64_MAX, pos;
    /* two handles alternating, each through growing ranges and two full ones */
    for (int i = 0; i < 700; i++) {
        CHECK(rdv_arena_alloc(a, 100, &pos) == 0, "alloc a");
        note_seq(a, pos, &last_a);
        CHECK(rdv_arena_free(a, pos) == 0, "free a");
        CHECK(rdv_arena_alloc(b, 100, &pos) == 0, "alloc b");
        note_seq(b, pos, &last_b);
        CHECK(rdv_arena_free(b, pos) == 0, "free b");
    }
    /* 700 each: ranges of 1, 1, 2, 4, ..., 128, 256, 256 (768 numbers) */
    CHECK(a->khdr->arena.alloc_seq == 2 * 768, "1,400 allocations in two handles reserved %llu numbers, not 1,536",
          (unsigned long long)a->khdr->arena.alloc_seq);
    /* threads sharing a handle */
    struct num_thread nt[NUM_THREADS];
    for (int i = 0; i < NUM_THREADS; i++) {
        nt[i].h = b;
        CHECK(pthread_create(&nt[i].t, NULL, number_loop, &nt[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < NUM_THREADS; i++)
        pthread_join(nt[i].t, NULL);
    CHECK(n_seen == NUM_ALL, "numbers noted: %u", n_seen);
    qsort(seen, n_seen, sizeof seen[0], cmp_u64);
    for (uint32_t i = 1; i < n_seen; i++)
        CHECK(seen[i] != seen[i - 1], "number %llu handed out twice", (unsigned long long)seen[i]);
    /* wasted: the rest of each handle's range, and ranges of threads that lost a refill race */
    uint64_t reserved = b->khdr->arena.alloc_seq;
    CHECK(reserved >= n_seen && reserved <= n_seen + (2 + 2 * NUM_THREADS) * RDV_SEQ_BATCH,
          "%u numbers handed out reserved %llu", n_seen, (unsigned long long)reserved);
    /* a handle that allocates once reserves one number */
    rdv_t *c = attach_handle(fd);
    CHECK(rdv_arena_alloc(c, 100, &pos) == 0, "alloc c");
    CHECK(rdv_pos_seq(pos) == reserved && c->khdr->arena.alloc_seq == reserved + 1,
          "one allocation of a new handle: number %llu, counter %llu -> %llu", (unsigned long long)rdv_pos_seq(pos),
          (unsigned long long)reserved, (unsigned long long)c->khdr->arena.alloc_seq);
    CHECK(rdv_arena_free(c, pos) == 0, "free c");
    rdv_live_release(c);
    rdv_segment_discard(c);
    check_empty(a);
    rdv_live_release(b);
    rdv_segment_discard(b);
    printf("unit_arena: numbers: %u unique, %llu reserved, ok\n", n_seen, (unsigned long long)reserved);
    drop_segment(a, fd);
}

int main(void) {
    const char *s = getenv("UNIT_SEED");
    if (s)
        seed0 = strtoull(s, NULL, 0);
    rng_state = seed0;
    printf("unit_arena: seed 0x%llx\n", (unsigned long long)seed0);
    int64_t t0 = rdv_now_ns();
    test_positions();
    test_runs();
    test_numbers();
    test_random();
    test_order();
    printf("unit_arena: %.1f s so far\n", (double)(rdv_now_ns() - t0) / 1e9);
#ifdef HAVE_STORE_STEPPING
    test_store_windows();
    test_repair_windows();
#else
    printf("unit_arena: store windows: skipped (needs x86-64 single-stepping)\n");
#endif
    printf("unit_arena: %.1f s so far\n", (double)(rdv_now_ns() - t0) / 1e9);
    test_kill_loop();
    printf("unit_arena: all passed in %.1f s (%u invariant checks, %u repairs)\n",
           (double)(rdv_now_ns() - t0) / 1e9, checks_run, repairs);
    return 0;
}
