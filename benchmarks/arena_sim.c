/* arena_sim: drive shmrdv's real arena allocator (csrc/rdv_arena.c: the ring
 * plus two-level segregated free lists) and, for comparison, a plain next
 * fit (a cursor and a scan over its own side table of boundary tags, with
 * coalescing, no lists) through the same allocation traces, in one process.
 * Built and run by benchmarks/test_bench_arena.py:
 *
 *   gcc -std=gnu11 -O2 -Icsrc benchmarks/arena_sim.c csrc/rdv_os.c csrc/rdv_wait.c \
 *       csrc/rdv_segment.c csrc/rdv_live.c csrc/rdv_lock.c csrc/rdv_arena.c -lm -o arena_sim
 *   ./arena_sim --help
 *
 * The real allocator runs in a segment made by rdv_segment_create on a
 * memfd (no name in /dev/shm) with trivial ops (every entry alive, no dead
 * holders); the reference keeps the same tags (RDV_SIDE_*) in a private
 * array and writes a block's position at its start, as the real one writes
 * the block header, so both touch the same memory per block.
 *
 * Scenarios (every count is an option):
 *   a  random sizes 64 B - 4 MiB (log-uniform), each living a random number
 *      (1 .. 2M) of subsequent steps, in a 256 MiB arena kept 50-80% full:
 *      expired blocks are freed only while the arena stays above 50%, and
 *      the soonest to expire are freed early while a new block would take
 *      it above 80%;
 *   b  a TensorFlow-like step: 500 tensors (70% 64 B - 4 KiB, 28% 4 KiB -
 *      1 MiB, 2% 1 - 8 MiB; the same shapes every step) allocated, then
 *      freed in random order; repeated;
 *   c  10,000 long-lived small values (64 B - 1 KiB) allocated first,
 *      interleaved with a 1 MiB stream (allocate 1 MiB, free the oldest when
 *      4 are in flight; one stream step per 10 values), then the stream
 *      alone for many iterations;
 *   d  (the C side of the "100,000 pending" benchmark) 100,000 blocks of
 *      256 B pending in an arena twice their size, a 4 KiB stream (64 in
 *      flight) while the pending blocks are freed in random order, one per
 *      stream step.
 *
 * Each (scenario, allocator) runs twice on the same trace (same seed):
 * once timed, with nothing else between the calls (ns per alloc/free pair =
 * elapsed / ((allocation attempts + frees) / 2), the trace's own
 * bookkeeping included, the same for both), once sampled: every N
 * operations (--sample-every) external fragmentation
 * 1 - largest_free / free_bytes is computed from a walk of the side table's
 * start tags (ground truth, the same code for both allocators); worst =
 * max, typical = median of the samples. At every failed allocation the
 * walk says whether a free block large enough existed: for the real
 * allocator that is a bug (fit_failures must be 0). The sampled pass also
 * checks rdv_arena_usage (what Rendezvous.stats() reports) against the walk.
 *
 * Output: one "RESULT key=value ..." line per (scenario, allocator), then a
 * table. Exit status 0, or 2 on an internal error (a free refused, a broken
 * chain of tags). */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench_timing.h"
#include "rdv_arena.h"
#include "rdv_atomic.h"
#include "rdv_lock.h"
#include "rdv_os.h"
#include "rdv_segment.h"
#include "rdv_wait.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)
#define GMASK ((1ull << RDV_GRANULE_BITS) - 1)

__attribute__((format(printf, 1, 2), noreturn)) static void fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "arena_sim: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

/* ---- random numbers: splitmix64, one stream per run ----------------------- */

static uint64_t rng_state;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double unif(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static uint64_t below(uint64_t n) { return n ? rnd() % n : 0; }
static uint64_t log_uniform(uint64_t lo, uint64_t hi) {
    double x = exp(log((double)lo) + unif() * (log((double)hi) - log((double)lo)));
    uint64_t v = (uint64_t)x;
    return v < lo ? lo : v > hi ? hi : v;
}
static uint32_t granules_of(uint64_t bytes) {
    uint64_t g = (bytes + RDV_GRANULE - 1) / RDV_GRANULE;
    return (uint32_t)(g < RDV_MIN_BLOCK ? RDV_MIN_BLOCK : g);
}

/* ---- the two allocators behind one interface ------------------------------ */

struct alloc {
    const char *name;
    uint32_t G;
    const uint32_t *tags; /* start tags (RDV_SIDE_*) from granule 0 */
    /* real */
    rdv_t *h;
    int memfd;
    /* reference next fit */
    uint32_t *tag;
    uint8_t *arena;
    uint32_t cursor;
    uint64_t seq, free_g;
    uint64_t scan_blocks, scan_calls, scan_max;
};

static int real_alive(rdv_t *h, uint32_t entry) { (void)h, (void)entry; return 1; }
static void real_dead_holder(rdv_t *h, uint32_t *klock, uint32_t holder) { (void)h, (void)klock, (void)holder; }
static void real_reclaim_dead(rdv_t *h) { (void)h; }

static void real_open(struct alloc *a, uint64_t arena_bytes) {
    memset(a, 0, sizeof *a);
    a->name = "shmrdv";
    a->memfd = memfd_create("arena_sim", MFD_CLOEXEC);
    if (a->memfd < 0)
        fatal("memfd_create: %s", strerror(errno));
    int rc = rdv_segment_create(a->memfd, arena_bytes, 1, 0, &a->h);
    if (rc < 0)
        fatal("rdv_segment_create: %s (%llu bytes)", strerror(-rc), (unsigned long long)arena_bytes);
    a->h->ops.alive = real_alive;
    a->h->ops.dead_holder = real_dead_holder;
    a->h->ops.reclaim_dead = real_reclaim_dead;
    a->h->me = 0;
    a->G = a->h->granules;
    a->tags = a->h->kside;
    rdv_arena_init(a->h);
}

static void real_reset(struct alloc *a) {
    memset(a->h->kside, 0, (size_t)a->G * sizeof(uint32_t));
    memset(&a->h->khdr->arena, 0, sizeof a->h->khdr->arena);
    rdv_arena_init(a->h);
}

static void real_close(struct alloc *a) {
    rdv_segment_discard(a->h);
    close(a->memfd);
}

static void ref_reset(struct alloc *a) {
    memset(a->tag, 0, (size_t)a->G * sizeof(uint32_t));
    a->tag[0] = RDV_SIDE_FREE | a->G;
    a->tag[a->G - 1] = RDV_SIDE_END | a->G;
    a->cursor = 0;
    a->seq = 0;
    a->free_g = a->G;
    a->scan_blocks = a->scan_calls = a->scan_max = 0;
}

static void ref_open(struct alloc *a, uint64_t arena_bytes) {
    memset(a, 0, sizeof *a);
    a->name = "next-fit";
    arena_bytes = (arena_bytes + RDV_PAGE - 1) / RDV_PAGE * RDV_PAGE;
    a->G = (uint32_t)(arena_bytes / RDV_GRANULE);
    /* populated, like the real segment (rdv_map: MAP_POPULATE) */
    a->arena = mmap(NULL, arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    a->tag = calloc(a->G, sizeof(uint32_t));
    if (a->arena == MAP_FAILED || !a->tag)
        fatal("out of memory for the reference arena (%llu bytes)", (unsigned long long)arena_bytes);
    a->tags = a->tag;
    ref_reset(a);
}

static void ref_close(struct alloc *a) {
    munmap(a->arena, (size_t)a->G * RDV_GRANULE);
    free(a->tag);
}

/* Next fit: from the cursor, block by block (start tags), once round the
 * arena; cut the block from the front of the first free block that fits. */
static int ref_alloc(struct alloc *a, uint64_t bytes, uint64_t *pos) {
    uint32_t need = granules_of(bytes), G = a->G, g = a->cursor;
    uint64_t scanned = 0, blocks = 0;
    a->scan_calls++;
    while (scanned < G) {
        uint32_t v = a->tag[g], len = RDV_SIDE_LEN(v);
        blocks++;
        if (RDV_SIDE_KIND(v) == RDV_SIDE_FREE && len >= need) {
            uint32_t rest = len - need;
            if (rest < RDV_MIN_BLOCK) {
                need = len;
                rest = 0;
            }
            a->tag[g] = RDV_SIDE_BUSY | need;
            if (rest) {
                a->tag[g + need] = RDV_SIDE_FREE | rest;
                a->tag[g + len - 1] = RDV_SIDE_END | rest;
            } else {
                a->tag[g + len - 1] = 0;
            }
            *pos = (a->seq++ << RDV_GRANULE_BITS) | g;
            memcpy(a->arena + (uint64_t)g * RDV_GRANULE, pos, sizeof *pos); /* as the real header */
            a->cursor = g + need < G ? g + need : 0;
            a->free_g -= need;
            a->scan_blocks += blocks;
            if (blocks > a->scan_max)
                a->scan_max = blocks;
            return 0;
        }
        if (len == 0)
            fatal("next-fit: broken chain at granule %u", g);
        scanned += len;
        g += len;
        if (g >= G)
            g = 0;
    }
    a->scan_blocks += blocks;
    if (blocks > a->scan_max)
        a->scan_max = blocks;
    return -ENOSPC;
}

static int ref_free(struct alloc *a, uint64_t pos) {
    uint32_t G = a->G, g = (uint32_t)(pos & GMASK);
    uint64_t stored;
    if (g >= G)
        return -EINVAL;
    memcpy(&stored, a->arena + (uint64_t)g * RDV_GRANULE, sizeof stored);
    uint32_t v = a->tag[g], len = RDV_SIDE_LEN(v);
    if (RDV_SIDE_KIND(v) != RDV_SIDE_BUSY || stored != pos || len == 0 || len > G - g)
        return -EINVAL;
    uint32_t begin = g, total = len, end = g + len;
    if (end < G && RDV_SIDE_KIND(a->tag[end]) == RDV_SIDE_FREE) {
        uint32_t after = RDV_SIDE_LEN(a->tag[end]);
        a->tag[end] = 0;
        a->tag[end + after - 1] = 0;
        total += after;
    }
    if (g > 0 && RDV_SIDE_KIND(a->tag[g - 1]) == RDV_SIDE_END) {
        uint32_t before = RDV_SIDE_LEN(a->tag[g - 1]);
        if (before <= g && a->tag[g - before] == (RDV_SIDE_FREE | before)) {
            a->tag[g - 1] = 0;
            a->tag[g] = 0;
            begin = g - before;
            total += before;
        }
    }
    a->tag[begin] = RDV_SIDE_FREE | total;
    a->tag[begin + total - 1] = RDV_SIDE_END | total;
    if (a->cursor > begin && a->cursor < begin + total)
        a->cursor = begin; /* the cursor's block merged into an earlier one */
    a->free_g += len;
    return 0;
}

static int a_alloc(struct alloc *a, uint64_t bytes, uint64_t *pos) {
    return a->h ? rdv_arena_alloc(a->h, bytes, pos) : ref_alloc(a, bytes, pos);
}
static int a_free(struct alloc *a, uint64_t pos) { return a->h ? rdv_arena_free(a->h, pos) : ref_free(a, pos); }
static void a_reset(struct alloc *a) {
    if (a->h)
        real_reset(a);
    else
        ref_reset(a);
}

/* ---- one pass over a trace ------------------------------------------------ */

struct walk {
    uint64_t free_g, largest_g, blocks;
    int ok;
};

static void walk_tags(const struct alloc *a, struct walk *w) {
    memset(w, 0, sizeof *w);
    w->ok = 1;
    for (uint32_t g = 0; g < a->G;) {
        uint32_t v = a->tags[g], len = RDV_SIDE_LEN(v), kind = RDV_SIDE_KIND(v);
        if ((kind != RDV_SIDE_BUSY && kind != RDV_SIDE_FREE) || len == 0 || len > a->G - g) {
            w->ok = 0;
            return;
        }
        if (kind == RDV_SIDE_FREE) {
            w->free_g += len;
            if (len > w->largest_g)
                w->largest_g = len;
        }
        w->blocks++;
        g += len;
    }
}

struct run {
    struct alloc *a;
    const char *scenario;
    int sampling;   /* the sampled pass (else the timed one) */
    int warm;       /* samples count from here on */
    uint64_t every; /* sample every so many operations */
    uint64_t ops, attempts, allocs, frees, failures, fit_failures, stream_failures;
    uint64_t mismatches, usage_checks, peak_used_g, used_g;
    double *samples;
    size_t nsamples, cap;
    uint32_t *lat; /* sampled pass: ns of each allocation call */
    size_t nlat, latcap;
};

static void run_init(struct run *r, struct alloc *a, const char *scenario, int sampling, uint64_t every) {
    memset(r, 0, sizeof *r);
    r->a = a;
    r->scenario = scenario;
    r->sampling = sampling;
    r->every = every ? every : 1;
    r->warm = 1;
    a_reset(a);
}

static void sample(struct run *r) {
    struct walk w;
    walk_tags(r->a, &w);
    if (!w.ok)
        fatal("%s/%s: the chain of start tags is broken (sample %zu)", r->scenario, r->a->name, r->nsamples);
    if (r->nsamples == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 4096;
        r->samples = realloc(r->samples, r->cap * sizeof *r->samples);
        if (!r->samples)
            fatal("out of memory (%zu samples)", r->cap);
    }
    r->samples[r->nsamples++] = w.free_g ? 1.0 - (double)w.largest_g / (double)w.free_g : 0.0;
    /* what Rendezvous.stats() reports, against the walk: every 8th sample */
    if (r->nsamples % 8 == 1) {
        r->usage_checks++;
        if (r->a->h) {
            uint64_t live, fb, largest, blocks;
            rdv_arena_usage(r->a->h, &live, &fb, &largest, &blocks);
            if (fb != w.free_g * RDV_GRANULE || largest != w.largest_g * RDV_GRANULE ||
                live + fb != (uint64_t)r->a->G * RDV_GRANULE) {
                if (r->mismatches < 5)
                    fprintf(stderr, "USAGE-MISMATCH %s/%s: usage free=%llu largest=%llu live=%llu, walk free=%llu largest=%llu\n",
                            r->scenario, r->a->name, (unsigned long long)fb, (unsigned long long)largest,
                            (unsigned long long)live, (unsigned long long)(w.free_g * RDV_GRANULE),
                            (unsigned long long)(w.largest_g * RDV_GRANULE));
                r->mismatches++;
            }
        } else if (r->a->free_g != w.free_g) {
            r->mismatches++;
        }
    }
}

static void tick(struct run *r) {
    if (r->sampling && r->warm && ++r->ops % r->every == 0)
        sample(r);
}

/* 0 or -ENOSPC; a failure is checked against the walk in the sampled pass. */
static int do_alloc(struct run *r, uint64_t bytes, uint64_t *pos, int stream) {
    r->attempts++;
    int rc;
    if (r->sampling) {
        uint64_t t0 = now_ns();
        rc = a_alloc(r->a, bytes, pos);
        uint64_t dt = now_ns() - t0;
        if (r->nlat == r->latcap) {
            r->latcap = r->latcap ? 2 * r->latcap : 4096;
            r->lat = realloc(r->lat, r->latcap * sizeof *r->lat);
            if (!r->lat)
                fatal("out of memory (%zu latencies)", r->latcap);
        }
        r->lat[r->nlat++] = dt > UINT32_MAX ? UINT32_MAX : (uint32_t)dt;
    } else {
        rc = a_alloc(r->a, bytes, pos);
    }
    if (rc == 0) {
        r->allocs++;
        r->used_g += granules_of(bytes);
        if (r->used_g > r->peak_used_g)
            r->peak_used_g = r->used_g;
    } else if (rc == -ENOSPC) {
        r->failures++;
        r->stream_failures += stream;
        if (r->sampling) {
            struct walk w;
            walk_tags(r->a, &w);
            if (w.largest_g >= granules_of(bytes)) {
                if (r->fit_failures < 5)
                    fprintf(stderr, "FIT-FAILURE %s/%s: %llu bytes (%u granules) refused while the largest free block has %llu granules (free %llu granules)\n",
                            r->scenario, r->a->name, (unsigned long long)bytes, granules_of(bytes),
                            (unsigned long long)w.largest_g, (unsigned long long)w.free_g);
                r->fit_failures++;
            }
        }
    } else {
        fatal("%s/%s: alloc returned %d", r->scenario, r->a->name, rc);
    }
    tick(r);
    return rc;
}

static void do_free(struct run *r, uint64_t pos, uint64_t bytes) {
    if (a_free(r->a, pos) != 0)
        fatal("%s/%s: free of position %llu refused", r->scenario, r->a->name, (unsigned long long)pos);
    r->frees++;
    r->used_g -= granules_of(bytes);
    tick(r);
}

/* ---- scenarios --------------------------------------------------------------*/

struct params {
    uint64_t seed, sample_every[4];
    uint64_t a_steps, a_arena;
    uint64_t b_steps, b_tensors, b_arena;
    uint64_t c_small, c_stream, c_arena, c_small_per_stream;
    uint64_t d_pending, d_stream, d_depth;
};

struct live { uint64_t expiry, pos, bytes; };

static void heap_push(struct live *heap, size_t *n, struct live x) {
    size_t i = (*n)++;
    while (i && heap[(i - 1) / 2].expiry > x.expiry) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = x;
}
static struct live heap_pop(struct live *heap, size_t *n) {
    struct live top = heap[0], x = heap[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap[c + 1].expiry < heap[c].expiry)
            c++;
        if (heap[c].expiry >= x.expiry)
            break;
        heap[i] = heap[c];
        i = c;
    }
    if (*n)
        heap[i] = x;
    return top;
}

static void scenario_a(struct run *r, const struct params *p) {
    const uint64_t lo = 64, hi = 4 * MiB, G = r->a->G;
    const uint64_t lo_g = G / 2, hi_g = G * 8 / 10;
    /* mean block of a log-uniform size, and lifetimes giving ~65% on average */
    double mean = (double)(hi - lo) / log((double)hi / (double)lo);
    uint64_t m = (uint64_t)(0.65 * (double)(G * RDV_GRANULE) / mean);
    if (m < 1)
        m = 1;
    struct live *heap = malloc((size_t)(p->a_steps + 1) * sizeof *heap);
    size_t n = 0;
    r->warm = 0;
    for (uint64_t step = 0; step < p->a_steps; step++) {
        uint64_t bytes = log_uniform(lo, hi), life = 1 + below(2 * m);
        while (n && heap[0].expiry <= step && r->used_g - granules_of(heap[0].bytes) >= lo_g) {
            struct live x = heap_pop(heap, &n);
            do_free(r, x.pos, x.bytes);
        }
        while (n && r->used_g + granules_of(bytes) > hi_g) {
            struct live x = heap_pop(heap, &n);
            do_free(r, x.pos, x.bytes);
        }
        uint64_t pos;
        if (do_alloc(r, bytes, &pos, 0) == 0)
            heap_push(heap, &n, (struct live){step + life, pos, bytes});
        if (!r->warm && r->used_g >= lo_g)
            r->warm = 1;
    }
    while (n) {
        struct live x = heap_pop(heap, &n);
        do_free(r, x.pos, x.bytes);
    }
    free(heap);
}

static void scenario_b(struct run *r, const struct params *p) {
    size_t T = (size_t)p->b_tensors;
    uint64_t *sizes = malloc(T * sizeof *sizes), *pos = malloc(T * sizeof *pos);
    size_t *order = malloc(T * sizeof *order);
    for (size_t i = 0; i < T; i++) { /* the model's shapes: the same every step */
        uint64_t c = below(100);
        sizes[i] = c < 70 ? log_uniform(64, 4 * KiB) : c < 98 ? log_uniform(4 * KiB, MiB) : log_uniform(MiB, 8 * MiB);
    }
    for (uint64_t step = 0; step < p->b_steps; step++) {
        for (size_t i = 0; i < T; i++)
            if (do_alloc(r, sizes[i], &pos[i], 0) != 0)
                pos[i] = UINT64_MAX;
        for (size_t i = 0; i < T; i++)
            order[i] = i;
        for (size_t i = T; i > 1; i--) {
            size_t j = (size_t)below(i), t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
        for (size_t i = 0; i < T; i++)
            if (pos[order[i]] != UINT64_MAX)
                do_free(r, pos[order[i]], sizes[order[i]]);
    }
    free(sizes);
    free(pos);
    free(order);
}

/* A stream: allocate one block, free the oldest once `depth` are in flight;
 * a stream block that does not fit frees the oldest and tries again once. */
struct stream { uint64_t *pos; uint64_t bytes; size_t depth, head, count; };

static void stream_step(struct run *r, struct stream *s) {
    uint64_t pos;
    int rc = do_alloc(r, s->bytes, &pos, 1);
    if (rc != 0 && s->count) {
        do_free(r, s->pos[s->head], s->bytes);
        s->head = (s->head + 1) % s->depth;
        s->count--;
        rc = do_alloc(r, s->bytes, &pos, 1);
    }
    if (rc == 0) {
        s->pos[(s->head + s->count) % s->depth] = pos;
        s->count++;
    }
    if (s->count == s->depth) {
        do_free(r, s->pos[s->head], s->bytes);
        s->head = (s->head + 1) % s->depth;
        s->count--;
    }
}

static void stream_drain(struct run *r, struct stream *s) {
    while (s->count) {
        do_free(r, s->pos[s->head], s->bytes);
        s->head = (s->head + 1) % s->depth;
        s->count--;
    }
}

static void scenario_c(struct run *r, const struct params *p) {
    size_t N = (size_t)p->c_small;
    uint64_t *pos = malloc(N * sizeof *pos), *sizes = malloc(N * sizeof *sizes);
    struct stream s = {calloc(4, sizeof(uint64_t)), MiB, 4, 0, 0};
    uint64_t per = p->c_small_per_stream ? p->c_small_per_stream : 1;
    for (size_t i = 0; i < N; i++) {
        sizes[i] = log_uniform(64, KiB);
        if (do_alloc(r, sizes[i], &pos[i], 0) != 0)
            pos[i] = UINT64_MAX;
        if (i % per == per - 1)
            stream_step(r, &s);
    }
    for (uint64_t i = 0; i < p->c_stream; i++)
        stream_step(r, &s);
    stream_drain(r, &s);
    for (size_t i = 0; i < N; i++)
        if (pos[i] != UINT64_MAX)
            do_free(r, pos[i], sizes[i]);
    free(pos);
    free(sizes);
    free(s.pos);
}

#define D_PENDING_BYTES 256 /* the block of a 64 B message under a short key */
#define D_STREAM_BYTES 4224 /* the block of a 4 KiB message */

static void scenario_d(struct run *r, const struct params *p) {
    size_t N = (size_t)p->d_pending;
    uint64_t *pos = malloc(N * sizeof *pos);
    size_t kept = 0;
    for (size_t i = 0; i < N; i++)
        if (do_alloc(r, D_PENDING_BYTES, &pos[kept], 0) == 0)
            kept++;
    for (size_t i = kept; i > 1; i--) { /* the receiver's random order */
        size_t j = (size_t)below(i);
        uint64_t t = pos[i - 1];
        pos[i - 1] = pos[j];
        pos[j] = t;
    }
    struct stream s = {calloc(p->d_depth, sizeof(uint64_t)), D_STREAM_BYTES, (size_t)p->d_depth, 0, 0};
    size_t next = 0;
    for (uint64_t i = 0; i < p->d_stream; i++) {
        stream_step(r, &s);
        if (next < kept)
            do_free(r, pos[next++], D_PENDING_BYTES);
    }
    while (next < kept)
        do_free(r, pos[next++], D_PENDING_BYTES);
    stream_drain(r, &s);
    free(pos);
    free(s.pos);
}

/* ---- driver ---------------------------------------------------------------*/

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static int cmp_u32(const void *x, const void *y) {
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

struct row {
    char scenario, allocator[16];
    double worst, typical, mean, ns_pair, scan, alloc_p999_us, alloc_max_us;
    uint64_t scan_max;
    uint64_t attempts, frees, failures, fit_failures, stream_failures, mismatches, usage_checks, samples, peak_used;
    int deterministic;
};

static const char *const TITLES[4] = {"a random 64B-4MiB", "b TF step x500", "c small + 1MiB stream",
                                      "d 256B pending + 4KiB"};

static void run_scenario(char sc, struct alloc *a, const struct params *p, struct row *row) {
    void (*fn)(struct run *, const struct params *) = sc == 'a' ? scenario_a : sc == 'b' ? scenario_b
                                                    : sc == 'c' ? scenario_c : scenario_d;
    char name[2] = {sc, 0};
    struct run timed, sampled;
    run_init(&timed, a, name, 0, 0);
    rng_state = p->seed;
    uint64_t t0 = now_ns();
    fn(&timed, p);
    uint64_t elapsed = now_ns() - t0;
    double scan = a->scan_calls ? (double)a->scan_blocks / (double)a->scan_calls : 0;
    uint64_t scan_max = a->scan_max;
    run_init(&sampled, a, name, 1, p->sample_every[sc - 'a']);
    rng_state = p->seed;
    fn(&sampled, p);
    struct walk w;
    walk_tags(a, &w);
    if (!w.ok || w.free_g != a->G)
        fatal("%s/%s: arena not empty at the end (%llu of %u granules free)", name, a->name, (unsigned long long)w.free_g, a->G);

    memset(row, 0, sizeof *row);
    row->scenario = sc;
    snprintf(row->allocator, sizeof row->allocator, "%s", a->name);
    row->attempts = timed.attempts;
    row->frees = timed.frees;
    row->ns_pair = (double)elapsed / ((double)(timed.attempts + timed.frees) / 2.0);
    row->scan = scan;
    row->scan_max = scan_max;
    row->failures = sampled.failures;
    row->fit_failures = sampled.fit_failures;
    row->stream_failures = sampled.stream_failures;
    row->mismatches = sampled.mismatches;
    row->usage_checks = sampled.usage_checks;
    row->samples = sampled.nsamples;
    row->peak_used = sampled.peak_used_g * RDV_GRANULE;
    row->deterministic = timed.attempts == sampled.attempts && timed.failures == sampled.failures &&
                         timed.frees == sampled.frees;
    if (sampled.nsamples) {
        qsort(sampled.samples, sampled.nsamples, sizeof(double), cmp_double);
        row->worst = sampled.samples[sampled.nsamples - 1];
        row->typical = sampled.samples[sampled.nsamples / 2];
        double sum = 0;
        for (size_t i = 0; i < sampled.nsamples; i++)
            sum += sampled.samples[i];
        row->mean = sum / (double)sampled.nsamples;
    }
    free(sampled.samples);
    if (sampled.nlat) {
        qsort(sampled.lat, sampled.nlat, sizeof(uint32_t), cmp_u32);
        row->alloc_p999_us = sampled.lat[(size_t)((double)(sampled.nlat - 1) * 0.999)] / 1e3;
        row->alloc_max_us = sampled.lat[sampled.nlat - 1] / 1e3;
    }
    free(sampled.lat);
    printf("RESULT scenario=%c allocator=%s arena_bytes=%llu attempts=%llu frees=%llu failures=%llu "
           "fit_failures=%llu stream_failures=%llu worst_frag=%.4f typical_frag=%.4f mean_frag=%.4f samples=%llu "
           "ns_per_pair=%.1f alloc_p999_us=%.2f alloc_max_us=%.1f scan_blocks_per_alloc=%.2f scan_blocks_max=%llu usage_mismatches=%llu usage_checks=%llu "
           "peak_used_bytes=%llu deterministic=%d\n",
           sc, a->name, (unsigned long long)a->G * RDV_GRANULE, (unsigned long long)row->attempts,
           (unsigned long long)row->frees, (unsigned long long)row->failures,
           (unsigned long long)row->fit_failures, (unsigned long long)row->stream_failures, row->worst,
           row->typical, row->mean, (unsigned long long)row->samples, row->ns_pair, row->alloc_p999_us, row->alloc_max_us,
           row->scan, (unsigned long long)row->scan_max, (unsigned long long)row->mismatches, (unsigned long long)row->usage_checks,
           (unsigned long long)row->peak_used, row->deterministic);
    fflush(stdout);
}

/* What every alloc/free pair of the real allocator pays besides finding
 * and cutting the block: the lock word taken and dropped twice and the
 * wake-up of producers waiting for space (rdv_arena_free's wake_space),
 * uncontended, on the same words. The next fit here takes no lock. */
static double sync_floor_ns(uint64_t pairs) {
    struct alloc a;
    real_open(&a, 1 * MiB);
    struct rdv_arena_ctl *ka = &a.h->khdr->arena;
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < pairs; i++) {
        rdv_lock(a.h, &ka->lock);
        rdv_unlock(a.h, &ka->lock);
        rdv_lock(a.h, &ka->lock);
        rdv_unlock(a.h, &ka->lock);
        WRITE_ONCE(ka->space_waker_cpu, rdv_cpu() + 1);
        rdv_wake_all(&ka->space_seq, &ka->space_sleepers);
    }
    double ns = (double)(now_ns() - t0) / (double)pairs;
    real_close(&a);
    return ns;
}

static void usage(const char *prog) {
    printf("usage: %s [options]\n"
           "  --scenarios LIST        of a b c d (default abcd)\n"
           "  --allocators LIST       shmrdv,next-fit (default both)\n"
           "  --seed N                (default 1)\n"
           "  --sample-every N        operations between fragmentation samples, all scenarios\n"
           "                          (default a 16, b 4, c 64, d 256)\n"
           "  --a-steps N             (default 1000000)   --a-arena-mib N (256)\n"
           "  --b-steps N             (default 1000)     --b-tensors N (500)  --b-arena-mib N (128)\n"
           "  --c-small N             (default 10000)    --c-stream N (1000000)\n"
           "  --c-small-per-stream N  (default 10)       --c-arena-mib N (64)\n"
           "  --d-pending N           (default 100000)   --d-stream N (default 1.25 x pending)\n"
           "  --d-depth N             4 KiB blocks in flight (default 64); the arena is 2 x pending x 256 B\n",
           prog);
}

int main(int argc, char **argv) {
    struct params p = {.seed = 1, .sample_every = {16, 4, 64, 256}, .a_steps = 1000000, .a_arena = 256 * MiB,
                       .b_steps = 1000, .b_tensors = 500, .b_arena = 128 * MiB, .c_small = 10000,
                       .c_stream = 1000000, .c_arena = 64 * MiB, .c_small_per_stream = 10,
                       .d_pending = 100000, .d_stream = 0, .d_depth = 64};
    const char *scenarios = "abcd", *allocators = "shmrdv,next-fit";
    enum { O_SC = 1, O_AL, O_SEED, O_EVERY, O_AS, O_AA, O_BS, O_BT, O_BA, O_CS, O_CT, O_CP, O_CA, O_DP, O_DS, O_DD };
    static const struct option opts[] = {
        {"scenarios", 1, 0, O_SC}, {"allocators", 1, 0, O_AL}, {"seed", 1, 0, O_SEED},
        {"sample-every", 1, 0, O_EVERY}, {"a-steps", 1, 0, O_AS}, {"a-arena-mib", 1, 0, O_AA},
        {"b-steps", 1, 0, O_BS}, {"b-tensors", 1, 0, O_BT}, {"b-arena-mib", 1, 0, O_BA},
        {"c-small", 1, 0, O_CS}, {"c-stream", 1, 0, O_CT}, {"c-small-per-stream", 1, 0, O_CP},
        {"c-arena-mib", 1, 0, O_CA}, {"d-pending", 1, 0, O_DP}, {"d-stream", 1, 0, O_DS},
        {"d-depth", 1, 0, O_DD}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        uint64_t v = optarg ? strtoull(optarg, NULL, 10) : 0;
        switch (c) {
        case O_SC: scenarios = optarg; break;
        case O_AL: allocators = optarg; break;
        case O_SEED: p.seed = v; break;
        case O_EVERY: for (int i = 0; i < 4; i++) p.sample_every[i] = v ? v : 1; break;
        case O_AS: p.a_steps = v; break;
        case O_AA: p.a_arena = v * MiB; break;
        case O_BS: p.b_steps = v; break;
        case O_BT: p.b_tensors = v ? v : 1; break;
        case O_BA: p.b_arena = v * MiB; break;
        case O_CS: p.c_small = v; break;
        case O_CT: p.c_stream = v; break;
        case O_CP: p.c_small_per_stream = v; break;
        case O_CA: p.c_arena = v * MiB; break;
        case O_DP: p.d_pending = v; break;
        case O_DS: p.d_stream = v; break;
        case O_DD: p.d_depth = v ? v : 1; break;
        case 'h': usage(argv[0]); return 0;
        default: usage(argv[0]); return 1;
        }
    }
    if (!p.d_stream)
        p.d_stream = p.d_pending + p.d_pending / 4;
    struct row rows[8];
    int nrows = 0;
    double sync_ns = 0;
    if (strstr(allocators, "shmrdv")) {
        sync_ns = sync_floor_ns(1000000);
        printf("SYNC ns_per_pair=%.1f\n", sync_ns);
    }
    for (const char *s = scenarios; *s; s++) {
        if (*s < 'a' || *s > 'd')
            continue;
        uint64_t arena = *s == 'a' ? p.a_arena : *s == 'b' ? p.b_arena : *s == 'c' ? p.c_arena
                                                : 2 * p.d_pending * D_PENDING_BYTES + 4 * MiB;
        for (int k = 0; k < 2; k++) {
            if (!strstr(allocators, k == 0 ? "shmrdv" : "next-fit"))
                continue;
            struct alloc a;
            if (k == 0)
                real_open(&a, arena);
            else
                ref_open(&a, arena);
            run_scenario(*s, &a, &p, &rows[nrows++]);
            if (k == 0)
                real_close(&a);
            else
                ref_close(&a);
        }
    }
    printf("\n%-24s %-9s %8s %8s %9s %9s %8s %10s %9s %14s %8s\n", "scenario", "allocator", "worst", "typical",
           "failures", "fit-fail", "ns/pair", "p99.9 us", "max us", "scan avg/max", "stats-ok");
    for (int i = 0; i < nrows; i++) {
        struct row *x = &rows[i];
        char scan[32] = "-";
        if (strcmp(x->allocator, "next-fit") == 0)
            snprintf(scan, sizeof scan, "%.1f/%llu", x->scan, (unsigned long long)x->scan_max);
        printf("%-24s %-9s %7.1f%% %7.1f%% %9llu %9llu %8.1f %10.2f %9.1f %14s %8s\n", TITLES[x->scenario - 'a'],
               x->allocator, 100 * x->worst, 100 * x->typical, (unsigned long long)x->failures,
               (unsigned long long)x->fit_failures, x->ns_pair, x->alloc_p999_us, x->alloc_max_us, scan,
               x->mismatches ? "NO" : "yes");
    }
    if (sync_ns > 0)
        printf("(shmrdv's ns/pair includes %.1f ns of lock and space wake-up that the next fit does not pay)\n", sync_ns);
    return 0;
}
