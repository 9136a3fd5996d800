/* Layer 4: the payload arena. A heap of variable-size blocks, any number of
 * them live, allocated and freed in any order, with the costs of a ring
 * where traffic is a stream.
 *
 * The map. The side table holds one u32 per 64 B granule (rdv_layout.h):
 * the first granule of every block, free or busy, holds a start tag with
 * its length, and the chain of start tags from granule 0 covers the arena
 * exactly. Nothing a user writes into a payload is ever read as metadata.
 * A free block also keeps, in its own side entries, its two free-list links
 * and an END tag (its length, in its last entry), so the block after it can
 * find it and coalesce with it when it is freed (boundary tags).
 *
 * Finding space, in O(1) whatever the number and order of live blocks:
 * segregated free lists (two-level, TLSF style: a list per size class, a
 * bitmap of non-empty lists per level) give a good fit, the first block of
 * the smallest class whose blocks all fit; failing that, any block that
 * fits in the request's own class. So an allocation succeeds whenever a
 * free block of that size exists. And the ring: a cursor names where the
 * last block ended, and when the free block starting there is in a class
 * no larger than the good fit's, the new block is cut from its front. A
 * stream of messages received in order thus walks the arena front to back,
 * contiguous, without a search, and space freed behind it coalesces into
 * one run the cursor comes round to; while a message that fits a hole left
 * between blocks that stay (pending messages, held views) takes the hole,
 * instead of the stream's run.
 * Chosen by measurement (benchmarks/arena_sim.c, full counts): cutting from
 * the cursor whenever its block fits (ring first) left the stream's run
 * chopped into holes between small pending messages: 98% external
 * fragmentation with 10,000 small values beside a 1 MiB stream, against
 * 0.1% with the good fit first; random sizes with random lifetimes failed
 * 7x more often (404 against 57 in 10^6 steps), at the same cost per
 * step. A next fit over the side table alone (no lists) scans past every
 * pending block once per lap of the arena (99,524 blocks in one
 * allocation with 100,000 pending).
 *
 * Concurrency and crash safety. Every change is made under one lock word
 * (ctl.lock, rdv_lock.h), held for a few dozen stores, never across a
 * copy: producers and consumers copy payloads outside it. Each step
 * changes the chain of start tags with exactly one store (the publish of
 * the block's new start tag, a release); the stores before it touch only
 * entries the chain does not reach and END tags (read only under the
 * lock, and rebuilt by repair), the stores after it only derived state
 * (links, END tags, lists, counters, cursor). A holder that dies at any
 * point thus leaves a chain that is either before or after its step,
 * and whoever reclaims it (the lock names it) rebuilds everything else
 * from the chain: rdv_arena_repair. Interior side entries are 0, a stale
 * link (top bits clear, never read as a tag), or an END tag whose start tag
 * does not confirm it; the one reader of END tags checks the start tag. */
#include <errno.h>
#include <string.h>

#include "rdv_arena.h"
#include "rdv_atomic.h"
#include "rdv_lock.h"
#include "rdv_os.h"
#include "rdv_wait.h"

#define NONE UINT32_MAX
#define SEQ_MASK ((1ULL << (64 - RDV_GRANULE_BITS)) - 1)
#define FL_MASK ((1u << RDV_FL_COUNT) - 1) /* the first-level classes that exist */
#define SL_MASK ((1u << RDV_SL_COUNT) - 1)

static inline uint32_t msb(uint32_t x) { return 31u - (uint32_t)__builtin_clz(x); }

/* The list a free block of len granules lives on. */
static void class_of(uint32_t len, uint32_t *f, uint32_t *s) {
    if (len < RDV_SL_COUNT) {
        *f = 0;
        *s = len;
    } else {
        uint32_t m = msb(len);
        *f = m - RDV_SL_BITS + 1;
        *s = (len >> (m - RDV_SL_BITS)) ^ RDV_SL_COUNT;
    }
}

/* The smallest list whose every block holds len granules: 0, or -1 if
 * there is none (len is within the largest class). */
static int class_at_least(uint32_t len, uint32_t *f, uint32_t *s) {
    uint64_t up = len;
    if (len >= RDV_SL_COUNT)
        up += (1ull << (msb(len) - RDV_SL_BITS)) - 1;
    if (up >= 1ull << RDV_GRANULE_BITS)
        return -1;
    class_of((uint32_t)up, f, s);
    return 0;
}

/* ---- the side table, read and written under the lock ------------------- */

static inline uint32_t side(const rdv_t *h, uint32_t g) {
    return READ_ONCE(h->kside[g]); /* relaxed: under the lock, or re-checked */
}
static inline void set_side(rdv_t *h, uint32_t g, uint32_t v) {
    /* relaxed: an entry the chain does not reach, or derived state; the
     * lock's release publishes it to the next holder */
    WRITE_ONCE(h->kside[g], v);
}
static inline void publish_side(rdv_t *h, uint32_t g, uint32_t v) {
    /* release: the one store that changes the chain; publishes the stores
     * before it (a new block's header) to lock-free readers of the tag
     * (rdv_block_at, rdv_arena_next: acquire) */
    smp_store_release(&h->kside[g], v);
}

/* The length of the free block starting at g, or 0 if g starts none (a
 * link or tag that damage or a dead holder left stale). */
static uint32_t free_len_at(const rdv_t *h, uint32_t g) {
    if (g >= h->granules)
        return 0;
    uint32_t v = side(h, g), len = RDV_SIDE_LEN(v);
    return RDV_SIDE_KIND(v) == RDV_SIDE_FREE && len >= RDV_MIN_BLOCK && len <= h->granules - g ? len : 0;
}

/* ---- free lists: links are granule + 1, 0 = none ------------------------ */

static void list_insert(rdv_t *h, uint32_t g, uint32_t len) {
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    uint32_t f, s;
    class_of(len, &f, &s);
    uint32_t head = ka->heads[f][s];
    if (head && !free_len_at(h, head - 1))
        head = 0; /* a damaged head: the list restarts here (a repair rebuilds the rest) */
    set_side(h, g + 1, head);
    set_side(h, g + 2, 0);
    if (head)
        set_side(h, head - 1 + 2, g + 1);
    ka->heads[f][s] = g + 1;
    ka->sl_bitmap[f] |= 1u << s;
    ka->fl_bitmap |= 1u << f;
}

/* 0, or -EBADMSG if the links are not a list (then repair and retry). */
static int list_remove(rdv_t *h, uint32_t g, uint32_t len) {
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    uint32_t f, s;
    class_of(len, &f, &s);
    uint32_t next = side(h, g + 1), prev = side(h, g + 2);
    if ((next && !free_len_at(h, next - 1)) || (prev && !free_len_at(h, prev - 1)) ||
        (!prev && ka->heads[f][s] != g + 1))
        return -EBADMSG;
    if (prev)
        set_side(h, prev - 1 + 1, next);
    else
        ka->heads[f][s] = next;
    if (next)
        set_side(h, next - 1 + 2, prev);
    if (!ka->heads[f][s]) {
        ka->sl_bitmap[f] &= ~(1u << s);
        if (!ka->sl_bitmap[f])
            ka->fl_bitmap &= ~(1u << f);
    }
    return 0;
}

/* The first block of the first non-empty list at or above (f, s). */
static uint32_t first_at_or_above(rdv_t *h, uint32_t f, uint32_t s) {
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    /* Bits past the classes that exist are damage: masked off, so that no
     * index leaves heads[][]. */
    uint32_t slm = ka->sl_bitmap[f] & (~0u << s) & SL_MASK;
    if (!slm) {
        uint32_t flm = f + 1 < RDV_FL_COUNT ? ka->fl_bitmap & (~0u << (f + 1)) & FL_MASK : 0;
        if (!flm)
            return NONE;
        f = (uint32_t)__builtin_ctz(flm);
        slm = ka->sl_bitmap[f] & SL_MASK;
        if (!slm)
            return NONE; /* bitmaps disagree: damage; the caller's fallback decides */
    }
    uint32_t head = ka->heads[f][__builtin_ctz(slm)];
    return head ? head - 1 : NONE;
}

/* A free block of at least need granules, or NONE: the good fit, unless
 * the ring's block is as good (see the top of this file). */
static uint32_t find(rdv_t *h, uint32_t need) {
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    uint32_t c = ka->cursor, clen = free_len_at(h, c);
    uint32_t f, s, g = NONE;
    if (class_at_least(need, &f, &s) == 0) {
        g = first_at_or_above(h, f, s);
        if (g != NONE && free_len_at(h, g) < need)
            g = NONE;
    }
    if (clen >= need) { /* the ring, when its block is in a class no larger */
        if (g == NONE)
            return c;
        uint32_t gf, gs, cf, cs;
        class_of(free_len_at(h, g), &gf, &gs);
        class_of(clen, &cf, &cs);
        if (cf < gf || (cf == gf && cs <= gs))
            return c;
        return g;
    }
    if (g != NONE)
        return g;
    /* Only blocks in need's own class may still fit: look at each. */
    class_of(need, &f, &s);
    uint32_t link = ka->heads[f][s];
    for (uint32_t steps = 0; link && steps < h->granules; steps++) {
        uint32_t len = free_len_at(h, link - 1);
        if (len >= need)
            return link - 1;
        if (!len)
            break;
        link = side(h, link - 1 + 1);
    }
    return NONE;
}

/* ---- the steps -------------------------------------------------------------*/

/* The next allocation number of our range, a new range first when it is
 * used up. Ranges are reserved from the segment's counter by one atomic
 * add, as many numbers as we have reserved so far (1, 1, 2, 4, ...) up to
 * RDV_SEQ_BATCH: a send no longer takes the counter's line from the other
 * CPU each time, and a handle that sends little wastes little. Numbers are
 * unique over the segment's life and grow along each handle's
 * allocations; across handles they follow the order ranges were reserved
 * in, not the allocations'. Numbers never handed out (the rest of a range
 * when we detach or die, a range a thread reserved while another of ours
 * refilled first) are skipped, never reused: at most as many as we used,
 * plus one range. */
static uint64_t next_seq(rdv_t *h) {
    const uint64_t left_mask = (1ULL << RDV_SEQ_LEFT_BITS) - 1;
    for (;;) {
        /* relaxed, and the CASs: process-local; each number is taken by one CAS */
        uint64_t w = READ_ONCE(h->seq_word);
        if (w & left_mask) {
            if (rdv_cas(&h->seq_word, &w, w + (1ULL << RDV_SEQ_LEFT_BITS) - 1, __ATOMIC_RELAXED))
                return w >> RDV_SEQ_LEFT_BITS;
            continue;
        }
        uint64_t reserved = READ_ONCE(h->seq_reserved); /* relaxed: a size hint */
        uint64_t n = reserved == 0 ? 1 : reserved < RDV_SEQ_BATCH ? reserved : RDV_SEQ_BATCH;
        /* relaxed: a range only needs to be unique */
        uint64_t first = rdv_fetch_add(&h->khdr->arena.alloc_seq, n, __ATOMIC_RELAXED);
        WRITE_ONCE(h->seq_reserved, reserved + n);
        if (rdv_cas(&h->seq_word, &w, (first + 1) << RDV_SEQ_LEFT_BITS | (n - 1), __ATOMIC_RELAXED))
            return first;
    }
}

/* A new position for the block at granule g: the next allocation number. */
static uint64_t fresh_pos(rdv_t *h, uint32_t g) {
    return rdv_pos_make(next_seq(h) & SEQ_MASK, g);
}

/* Cut a block of need granules from the front of the free block at g (len
 * granules, taken off its list), naming us its holder. */
static uint64_t carve(rdv_t *h, uint32_t g, uint32_t len, uint32_t need) {
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    uint32_t rest = len - need;
    if (rest < RDV_MIN_BLOCK) {
        need = len;
        rest = 0;
    }
    if (rest) { /* the remainder's tags, unreachable until the publish */
        set_side(h, g + need, RDV_SIDE_FREE | rest);
        set_side(h, g + len - 1, RDV_SIDE_END | rest);
    }
    uint64_t pos = fresh_pos(h, g);
    /* The header names its holder before the block is published: a
     * producer killed before it writes the rest is still found as the
     * owner of a WRITING block, and its space comes back. */
    struct rdv_msg *m = rdv_msg_at(h, pos);
    WRITE_ONCE(m->pos, pos); /* relaxed: a late keeper CAS on it fails (the kept block) */
    m->payload_off = 0; /* rdv_block_at checks it against the length */
    m->stage = RDV_MSG_WRITING;
    m->owner = (uint16_t)(h->me + 1);
    m->flags = 0; /* a freed block's header may say anything (KEPT, say) */
    publish_side(h, g, RDV_SIDE_BUSY | need);
    set_side(h, g + 1, 0); /* the old links and END tag: interior now */
    set_side(h, g + 2, 0);
    if (rest)
        list_insert(h, g + need, rest);
    else
        set_side(h, g + len - 1, 0);
    ka->cursor = g + need < h->granules ? g + need : 0;
    ka->live_blocks++;
    ka->live_bytes += (uint64_t)need * RDV_GRANULE;
    ka->free_bytes -= (uint64_t)need * RDV_GRANULE;
    return pos;
}

/* Free the busy block at g (a granules), coalescing with free neighbours. */
static int release(rdv_t *h, uint32_t g, uint32_t a) {
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    uint32_t begin = g, end = g + a, total = a;
    uint32_t after = free_len_at(h, end);
    if (after && list_remove(h, end, after) < 0)
        return -EBADMSG;
    total += after;
    if (g > 0) {
        uint32_t pv = side(h, g - 1), before = RDV_SIDE_LEN(pv);
        /* an END tag counts only if the start tag it points at agrees */
        if (RDV_SIDE_KIND(pv) == RDV_SIDE_END && before <= g && free_len_at(h, g - before) == before) {
            if (list_remove(h, g - before, before) < 0) {
                if (after)
                    list_insert(h, end, after); /* as it was: repair finds the lists whole */
                return -EBADMSG;
            }
            begin = g - before;
            total += before;
        }
    }
    set_side(h, begin + total - 1, RDV_SIDE_END | total);
    publish_side(h, begin, RDV_SIDE_FREE | total);
    if (begin != g) {
        set_side(h, g, 0);
        set_side(h, g - 1, 0);
    }
    if (after) {
        set_side(h, end, 0);
        set_side(h, end + 1, 0);
        set_side(h, end + 2, 0);
    }
    list_insert(h, begin, total);
    /* The cursor's free block merged into one that starts earlier: move it
     * back to the start, so a stream with few messages in flight reuses
     * the same, cache-warm, space. */
    if (ka->cursor > begin && ka->cursor < begin + total)
        ka->cursor = begin;
    ka->live_blocks--;
    ka->live_bytes -= (uint64_t)a * RDV_GRANULE;
    ka->free_bytes += (uint64_t)a * RDV_GRANULE;
    return 0;
}

/* The length of the busy block at granule g, or 0 if no busy block starts
 * there (under the lock). */
static uint32_t busy_len(rdv_t *h, uint32_t g) {
    uint32_t v = side(h, g), len = RDV_SIDE_LEN(v);
    return RDV_SIDE_KIND(v) == RDV_SIDE_BUSY && len <= h->granules - g ? len : 0;
}

/* release, once more after a repair if the lists were damaged. */
static int release_repairing(rdv_t *h, uint32_t g, uint32_t a) {
    int rc = release(h, g, a);
    if (rc == -EBADMSG) {
        rdv_arena_repair(h);
        rc = release(h, g, a);
    }
    return rc;
}

void rdv_arena_repair(rdv_t *h) {
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    uint32_t G = h->granules;
    ka->fl_bitmap = 0;
    memset(ka->sl_bitmap, 0, sizeof ka->sl_bitmap);
    memset(ka->heads, 0, sizeof ka->heads);
    ka->live_bytes = ka->free_bytes = ka->live_blocks = 0;
    for (uint32_t g = 0; g < G;) {
        uint32_t v = side(h, g), len = RDV_SIDE_LEN(v), kind = RDV_SIDE_KIND(v);
        if ((kind != RDV_SIDE_BUSY && kind != RDV_SIDE_FREE) || len == 0 || len > G - g) {
            /* Damage: the chain cannot be followed past here. Keep the rest
             * as one busy block nobody holds: lost, but never handed out
             * over data that may still be in use. */
            publish_side(h, g, RDV_SIDE_BUSY | (G - g));
            ka->live_blocks++;
            ka->live_bytes += (uint64_t)(G - g) * RDV_GRANULE;
            break;
        }
        if (kind == RDV_SIDE_BUSY) {
            ka->live_blocks++;
            ka->live_bytes += (uint64_t)len * RDV_GRANULE;
            g += len;
            continue;
        }
        while (g + len < G && RDV_SIDE_KIND(side(h, g + len)) == RDV_SIDE_FREE &&
               RDV_SIDE_LEN(side(h, g + len)) && RDV_SIDE_LEN(side(h, g + len)) <= G - g - len)
            len += RDV_SIDE_LEN(side(h, g + len)); /* neighbours a step left apart */
        if (len < RDV_MIN_BLOCK) { /* too small to list (damage): lost as above */
            publish_side(h, g, RDV_SIDE_BUSY | len);
            ka->live_blocks++;
            ka->live_bytes += (uint64_t)len * RDV_GRANULE;
            g += len;
            continue;
        }
        /* The merged tag first, the interior after: the interior holds the
         * start tags of the neighbours merged in, which the chain reaches
         * until this publish. A reclaimer that dies before it leaves the
         * chain as it was; after it, with stale entries the chain skips. */
        set_side(h, g + len - 1, RDV_SIDE_END | len);
        publish_side(h, g, RDV_SIDE_FREE | len);
        for (uint32_t i = g + 1; i < g + len - 1; i++)
            set_side(h, i, 0);
        list_insert(h, g, len);
        ka->free_bytes += (uint64_t)len * RDV_GRANULE;
        g += len;
    }
    if (ka->cursor >= G)
        ka->cursor = 0;
}

/* ---- entry points -----------------------------------------------------------*/

void rdv_arena_init(rdv_t *h) {
    /* A fresh segment reads as zeros: no blocks, no lists. One free block. */
    uint32_t G = h->granules;
    set_side(h, G - 1, RDV_SIDE_END | G);
    publish_side(h, 0, RDV_SIDE_FREE | G);
    list_insert(h, 0, G);
    h->khdr->arena.free_bytes = h->cap;
}

/* ---- the kept block ------------------------------------------------------
 * A handle that releases the view of a small message keeps its block for
 * its next allocation instead of freeing it. In a round trip (each receive
 * answered by a send) the answer is then written into the block just read,
 * whose lines this CPU holds, and neither the release nor the allocation
 * takes the arena's lock or touches its lists and side entries, which the
 * other side wrote last: each would move cache lines between CPUs.
 * Measured with two processes pinned apart (64 B, C calls): see
 * docs/architecture.md, "The kept block".
 *
 * A kept block stays busy: DELIVERED, owned by its keeper, flags
 * RDV_MSG_KEPT; its position + 1 is in the keeper's process entry
 * (kept_pos; 0 is none, and the first block's position is 0), where the
 * keeper publishes it after marking the block. What becomes of it is
 * decided by one compare-and-swap of the block's position, which is unique
 * over the segment's life, from the kept one to a new allocation number:
 * by the keeper reusing it (lock-free), or by a producer short of space
 * freeing it (under the arena lock, in the same hold as the free). The
 * loser leaves the block alone. Every path that frees a kept block makes
 * that CAS first, or has no keeper left to race (a dead keeper's reclaim,
 * the keeper's own thread freeing what it could not put back): so a late
 * keeper CAS finds a position that is no longer the old one, unless bytes
 * that came to lie there since (a block cut anew over the granule) equal
 * it, the same trust rdv_block_at puts in a header that repeats its own
 * position. kept_pos only says where to look: the keeper empties it (an
 * exchange) before its CAS, a taker after.
 *
 * Reuse so gives the block a new position, as carve does: stale positions
 * are refused, producer marks decide right (rdv_mark.c) and leased views
 * keep their allocation order (rdv_lease.c).
 *
 * Crash safety. A keeper that dies anywhere leaves a block DELIVERED or
 * WRITING and owned by it: its reclaimer frees it with its other views
 * (rdv_recover.c, step 5). A taker records the position it is about to
 * give the block (dropping, in its own entry) before its CAS: if it dies
 * after the CAS and before the free, its reclaimer frees the block at that
 * position, which nothing else can have given it.
 *
 * Space. At most one block per handle, of at most KEEP_MAX_BYTES and 1/64
 * of the arena. A producer that finds no room sets its entry's bit in
 * space_wanting, then frees every kept block (its own and other
 * processes') and tries again before it waits; while any bit is set,
 * releases free. The bits and kept_pos pair as a Dekker handshake (a full
 * barrier between each side's store and its load): either the keeper sees
 * the producer and frees, which wakes it, or the producer's next attempt
 * finds the kept block. */
#define KEEP_MAX_BYTES 8192u
#define WANT_WORDS (RDV_MAX_PROCS / 64)

static void wake_space(rdv_t *h);

static uint32_t keep_max_granules(const rdv_t *h) {
    uint32_t cap = h->granules / 64;
    return cap < KEEP_MAX_BYTES / RDV_GRANULE ? cap : KEEP_MAX_BYTES / RDV_GRANULE;
}

/* Whether a producer is short of space. Relaxed: the caller orders it
 * after its own store with a full barrier where the handshake needs it. */
static int space_wanted(const rdv_t *h) {
    const uint64_t *w = h->khdr->arena.space_wanting;
    uint64_t any = 0;
    for (uint32_t i = 0; i < WANT_WORDS; i++)
        any |= READ_ONCE(w[i]);
    return any != 0;
}

/* kept_pos just published our block (seq_cst): if a producer wants space,
 * free it after all. The barrier orders our publish before the look at the
 * bits; pairs with the one in rdv_arena_want_space. */
static void unless_wanted(rdv_t *h) {
    smp_mb();
    if (space_wanted(h))
        rdv_arena_drop_kept(h, h->me);
}

int rdv_arena_release(rdv_t *h, uint64_t pos) {
    uint64_t len;
    struct rdv_msg *m = rdv_block_at(h, pos, &len);
    struct rdv_proc *me = &h->kprocs[h->me];
    /* relaxed: our own entry's word, changed by our own threads (and by a
     * taker, once the block it named has a new position) */
    uint64_t kept = READ_ONCE(me->kept_pos);
    if (!m || kept == pos + 1)
        return -EINVAL; /* not a busy block, or our kept block: no view */
    /* relaxed: our own view's header, changed by nobody else while we hold
     * it; the bits are a hint here, the handshake below decides */
    if (kept == 0 && len <= (uint64_t)keep_max_granules(h) * RDV_GRANULE &&
        READ_ONCE(m->stage) == RDV_MSG_DELIVERED && READ_ONCE(m->owner) == h->me + 1 && !space_wanted(h)) {
        WRITE_ONCE(m->flags, RDV_MSG_KEPT); /* no longer a view: never given back (lease) */
        uint64_t none = 0;
        /* seq_cst: publishes the mark above to a taker (its acquire load of
         * kept_pos), and is the handshake's store */
        if (rdv_cas(&me->kept_pos, &none, pos + 1, __ATOMIC_SEQ_CST)) {
            unless_wanted(h);
            return 0;
        }
        /* never published: still ours alone */
    }
    return rdv_arena_free(h, pos);
}

int rdv_arena_drop_kept(rdv_t *h, uint32_t entry) {
    struct rdv_proc *p = &h->kprocs[entry], *me = &h->kprocs[h->me];
    /* acquire: the keeper's mark, published by its seq_cst CAS of kept_pos */
    uint64_t kept = smp_load_acquire(&p->kept_pos);
    if (!kept)
        return 0;
    uint64_t pos = kept - 1, g64 = rdv_pos_granule(pos);
    if (g64 >= h->granules)
        return 0; /* damage */
    uint32_t g = (uint32_t)g64;
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    int freed = 0;
    rdv_lock(h, &ka->lock); /* no free or carve under us: only the keeper's CAS */
    uint32_t len = busy_len(h, g);
    struct rdv_msg *m = rdv_msg_at(h, pos);
    /* relaxed under the lock: the keeper changes the block only after
     * winning the CAS below */
    if (len && READ_ONCE(m->pos) == pos && READ_ONCE(m->stage) == RDV_MSG_DELIVERED &&
        READ_ONCE(m->owner) == entry + 1 && READ_ONCE(m->flags) == RDV_MSG_KEPT) {
        uint64_t mine = fresh_pos(h, g);
        /* relaxed: read by our reclaimer only, after our death (the CAS's
         * seq_cst orders it first) */
        WRITE_ONCE(me->dropping, mine + 1);
        /* seq_cst: decides against the keeper's CAS in take_kept */
        if (rdv_cas(&m->pos, &pos, mine, __ATOMIC_SEQ_CST))
            freed = release_repairing(h, g, len) == 0;
        WRITE_ONCE(me->dropping, 0);
    }
    rdv_unlock(h, &ka->lock);
    if (freed)
        wake_space(h);
    /* relaxed: kept_pos no longer names a kept block (the keeper's own
     * exchange may have emptied it first) */
    rdv_cas(&p->kept_pos, &kept, 0, __ATOMIC_RELAXED);
    return freed;
}

/* Our kept block, made the new allocation if it fits need granules: 1. */
static int take_kept(rdv_t *h, uint32_t need, uint64_t *pos) {
    struct rdv_proc *me = &h->kprocs[h->me];
    /* relaxed: a first look, so that an empty one costs no atomic */
    if (!READ_ONCE(me->kept_pos))
        return 0;
    /* acquire: as in rdv_arena_drop_kept */
    uint64_t kept = rdv_exchange(&me->kept_pos, 0, __ATOMIC_ACQUIRE), len;
    struct rdv_msg *m = kept ? rdv_block_at(h, kept - 1, &len) : NULL;
    if (!m)
        return 0; /* freed by a producer short of space meanwhile (or damage) */
    uint64_t have = len / RDV_GRANULE;
    /* no more spare room than a block cut from a free run may get (carve) */
    if (have < need || have - need >= RDV_MIN_BLOCK) {
        uint64_t none = 0;
        /* seq_cst: back as it was, the handshake's store as in
         * rdv_arena_release. Another thread's block meanwhile wins: then
         * this one is named nowhere, and freed (under the lock, by its
         * position, against a taker that read kept_pos before us) */
        if (rdv_cas(&me->kept_pos, &none, kept, __ATOMIC_SEQ_CST))
            unless_wanted(h);
        else
            rdv_arena_free(h, kept - 1);
        return 0;
    }
    uint64_t old = kept - 1, fresh = fresh_pos(h, (uint32_t)rdv_pos_granule(old));
    /* acq_rel: decides against a taker's CAS (rdv_arena_drop_kept); the
     * new position before anything else changes: a death from here leaves
     * a view of ours, freed with our views, that no longer has the old
     * position, which a producer mark being committed may name */
    if (!rdv_cas(&m->pos, &old, fresh, __ATOMIC_ACQ_REL))
        return 0; /* a producer short of space took it */
    /* relaxed: lock-free readers (stats, inspect) find either value */
    WRITE_ONCE(m->flags, 0);
    WRITE_ONCE(m->payload_off, 0);
    /* release: the stores above before the stage, as carve leaves a block */
    smp_store_release(&m->stage, RDV_MSG_WRITING);
    *pos = fresh;
    return 1;
}

/* Drop every kept block: 1 if any was freed. For a producer with no room. */
static int drop_all_kept(rdv_t *h) {
    int any = 0;
    for (uint32_t i = 0; i < RDV_MAX_PROCS; i++)
        any |= rdv_arena_drop_kept(h, i);
    return any;
}

void rdv_arena_want_space(rdv_t *h, int want) {
    uint64_t *word = &h->khdr->arena.space_wanting[h->me / 64], bit = 1ull << (h->me % 64);
    /* Our threads count in want_count; our bit is set while any does. */
    pthread_mutex_lock(&h->want_lock);
    if (want && h->want_count++ == 0)
        /* seq_cst: the handshake's store (pairs with unless_wanted) */
        rdv_fetch_or(word, bit, __ATOMIC_SEQ_CST);
    else if (!want && --h->want_count == 0)
        rdv_fetch_and(word, ~bit, __ATOMIC_RELAXED); /* nothing to publish */
    pthread_mutex_unlock(&h->want_lock);
    /* the barrier between the store (ours, or another thread's before it
     * let go of the mutex) and our next look at kept_pos */
    if (want)
        smp_mb();
}

void rdv_arena_forget_wants(rdv_t *h, uint32_t entry) {
    struct rdv_proc *p = &h->kprocs[entry];
    /* relaxed: the entry is dead, closing (ours, no producer left) or being
     * claimed; nobody else writes these */
    rdv_fetch_and(&h->khdr->arena.space_wanting[entry / 64], ~(1ull << (entry % 64)), __ATOMIC_RELAXED);
    uint64_t dropping = READ_ONCE(p->dropping);
    uint64_t len;
    /* a kept block it had given this position and not freed yet: named by
     * nobody else, ever */
    if (dropping && rdv_block_at(h, dropping - 1, &len))
        rdv_arena_free(h, dropping - 1);
    WRITE_ONCE(p->dropping, 0);
    /* its own kept block is a view it owns: freed by step 5 of its reclaim
     * (or close) */
    WRITE_ONCE(p->kept_pos, 0);
}

uint64_t rdv_arena_largest_run(rdv_t *h) {
    /* The chain of start tags, lock-free: a snapshot (a block that changes
     * under us may be misread, as stats may be a moment apart) */
    uint64_t run = 0, longest = 0;
    for (uint32_t g = 0; g < h->granules;) {
        /* acquire: as in rdv_block_at */
        uint32_t v = smp_load_acquire(&h->kside[g]), n = RDV_SIDE_LEN(v);
        if ((RDV_SIDE_KIND(v) != RDV_SIDE_BUSY && RDV_SIDE_KIND(v) != RDV_SIDE_FREE) || n == 0 ||
            n > h->granules - g) {
            run = 0; /* not a start tag (a block changed under us): granule by granule */
            g++;
            continue;
        }
        uint64_t len;
        const struct rdv_msg *m = (const struct rdv_msg *)(h->karena + (uint64_t)g * RDV_GRANULE);
        uint64_t pos = READ_ONCE(m->pos); /* relaxed: checked by rdv_block_at */
        int kept = RDV_SIDE_KIND(v) == RDV_SIDE_BUSY && rdv_pos_granule(pos) == g && rdv_block_at(h, pos, &len) &&
                   rdv_msg_kept(m);
        run = RDV_SIDE_KIND(v) == RDV_SIDE_FREE || kept ? run + n : 0;
        if (run > longest)
            longest = run;
        g += n;
    }
    return longest * RDV_GRANULE;
}

/* A block of need granules from the free lists, the lock held: 0, -ENOSPC,
 * or list_remove's code if the lists stay damaged after a repair. */
static int cut(rdv_t *h, uint32_t need, uint64_t *pos) {
    int rc = -ENOSPC;
    for (int tries = 0; tries < 2; tries++) {
        uint32_t g = find(h, need);
        if (g == NONE)
            return -ENOSPC;
        uint32_t len = free_len_at(h, g);
        rc = list_remove(h, g, len);
        if (rc == 0) {
            *pos = carve(h, g, len, need);
            return 0;
        }
        rdv_arena_repair(h); /* damaged lists: rebuilt from the chain, then once more */
    }
    return rc;
}

/* A block of need granules from the free lists, under the lock. */
static int alloc_from_lists(rdv_t *h, uint32_t need, uint64_t *pos) {
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    rdv_lock(h, &ka->lock);
    int rc = cut(h, need, pos);
    rdv_unlock(h, &ka->lock);
    return rc;
}

/* The granules a block of nbytes takes. */
static uint64_t granules_for(uint64_t nbytes) {
    uint64_t need = (nbytes + RDV_GRANULE - 1) / RDV_GRANULE;
    return need < RDV_MIN_BLOCK ? RDV_MIN_BLOCK : need;
}

uint32_t rdv_arena_alloc_run(rdv_t *h, const uint64_t *nbytes, uint32_t n, uint64_t *pos) {
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    uint32_t k = 0;
    rdv_lock(h, &ka->lock);
    /* Each block is its own step, as a lone allocation's is: a death
     * between two leaves the ones cut so far ours, WRITING, to reclaim. */
    for (; k < n; k++) {
        uint64_t need = granules_for(nbytes[k]);
        if (need > h->granules || cut(h, (uint32_t)need, &pos[k]) < 0)
            break;
    }
    rdv_unlock(h, &ka->lock);
    return k;
}

int rdv_arena_alloc(rdv_t *h, uint64_t nbytes, uint64_t *pos) {
    uint64_t need = granules_for(nbytes);
    if (need > h->granules)
        return -EMSGSIZE;
    if (take_kept(h, (uint32_t)need, pos))
        return 0;
    int rc = alloc_from_lists(h, (uint32_t)need, pos);
    if (rc == -ENOSPC && drop_all_kept(h))
        rc = alloc_from_lists(h, (uint32_t)need, pos);
    return rc;
}

/* Wake the producers waiting for space: something was freed. */
static void wake_space(rdv_t *h) {
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    /* relaxed: a hint for the waiters' spin (rdv_wait.c), read after they
     * see the bump below; a stale value misjudges one spin, no more */
    WRITE_ONCE(ka->space_waker_cpu, rdv_cpu() + 1);
    /* release (the bump): publishes the free to a producer whose acquire
     * load of space_seq reads the new value; full barrier before reading
     * space_sleepers, pairing with the waiter's (rdv_wait.c) */
    rdv_wake_all(&ka->space_seq, &ka->space_sleepers);
}

static int free_owned(rdv_t *h, uint64_t pos, uint32_t who) {
    uint64_t g64 = rdv_pos_granule(pos);
    if (g64 >= h->granules)
        return -EINVAL;
    uint32_t g = (uint32_t)g64;
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    rdv_lock(h, &ka->lock);
    uint32_t len = busy_len(h, g);
    int rc = -EINVAL;
    const struct rdv_msg *m = rdv_msg_at(h, pos);
    /* a busy block that still names itself: not freed already, nor a later
     * block at the same place (positions carry the allocation's number);
     * relaxed: its owner, changed only by its holder */
    if (len && m->pos == pos && (who == 0 || READ_ONCE(m->owner) == who))
        rc = release_repairing(h, g, len);
    rdv_unlock(h, &ka->lock);
    if (rc == 0)
        wake_space(h);
    return rc;
}

int rdv_arena_free(rdv_t *h, uint64_t pos) { return free_owned(h, pos, 0); }

int rdv_arena_free_owned(rdv_t *h, uint64_t pos, uint32_t who) { return free_owned(h, pos, who); }

struct rdv_msg *rdv_block_at(rdv_t *h, uint64_t pos, uint64_t *len) {
    uint64_t g = rdv_pos_granule(pos);
    if (g >= h->granules)
        return NULL;
    /* acquire: pairs with the release publish of the tag, so the header
     * the allocator wrote before it is visible */
    uint32_t v = smp_load_acquire(&h->kside[g]);
    uint64_t n = RDV_SIDE_LEN(v);
    if (RDV_SIDE_KIND(v) != RDV_SIDE_BUSY || n == 0 || n > h->granules - g)
        return NULL;
    struct rdv_msg *m = rdv_msg_at(h, pos);
    *len = n * RDV_GRANULE;
    /* an empty payload ends the block */
    return m->pos == pos && m->payload_off <= *len ? m : NULL;
}

struct rdv_msg *rdv_queued_msg(rdv_t *h, uint32_t link, uint64_t *len) {
    if (link == 0 || link > h->granules)
        return NULL;
    const struct rdv_msg *m = (const struct rdv_msg *)(h->karena + (uint64_t)(link - 1) * RDV_GRANULE);
    uint64_t pos = m->pos;
    return rdv_pos_granule(pos) == link - 1 ? rdv_block_at(h, pos, len) : NULL;
}

struct rdv_msg *rdv_arena_next(rdv_t *h, uint32_t *g) {
    while (*g < h->granules) {
        /* acquire: as in rdv_block_at */
        uint32_t v = smp_load_acquire(&h->kside[*g]), len = RDV_SIDE_LEN(v);
        uint32_t kind = RDV_SIDE_KIND(v);
        if ((kind != RDV_SIDE_BUSY && kind != RDV_SIDE_FREE) || len == 0 || len > h->granules - *g) {
            (*g)++; /* not a start tag (a block changed under us): look granule by granule */
            continue;
        }
        if (kind == RDV_SIDE_BUSY) {
            const struct rdv_msg *m = (const struct rdv_msg *)(h->karena + (uint64_t)*g * RDV_GRANULE);
            uint64_t blen;
            struct rdv_msg *b = rdv_pos_granule(m->pos) == *g ? rdv_block_at(h, m->pos, &blen) : NULL;
            if (b)
                return b;
        }
        *g += len;
    }
    return NULL;
}

void rdv_arena_step(rdv_t *h, uint32_t *g) {
    /* relaxed: a block the caller just looked at; a changed one is found
     * again by rdv_arena_next's granule walk */
    uint32_t len = RDV_SIDE_LEN(READ_ONCE(h->kside[*g]));
    *g += len ? len : 1;
}

void rdv_arena_usage(rdv_t *h, uint64_t *live_bytes, uint64_t *free_bytes, uint64_t *largest_free,
                     uint64_t *live_blocks) {
    struct rdv_arena_ctl *ka = &h->khdr->arena;
    rdv_lock(h, &ka->lock);
    *live_bytes = ka->live_bytes;
    *free_bytes = ka->free_bytes;
    *live_blocks = ka->live_blocks;
    uint64_t largest = 0;
    if (ka->fl_bitmap) { /* the largest block is on the highest non-empty list */
        uint32_t f = msb(ka->fl_bitmap);
        uint32_t link = ka->sl_bitmap[f] ? ka->heads[f][msb(ka->sl_bitmap[f])] : 0;
        for (uint32_t steps = 0; link && steps < h->granules; steps++) {
            uint32_t len = free_len_at(h, link - 1);
            if (!len)
                break;
            if (len > largest)
                largest = len;
            link = side(h, link - 1 + 1);
        }
    }
    *largest_free = largest * RDV_GRANULE;
    rdv_unlock(h, &ka->lock);
}
