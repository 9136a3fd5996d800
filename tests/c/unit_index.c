/* Unit tests of the key index (csrc/rdv_index.c) on its own layers only:
 * this program links rdv_os.c rdv_wait.c rdv_segment.c rdv_live.c
 * rdv_lock.c rdv_index.c and nothing above them. Built with
 * -fsanitize=address,undefined by tests/c/test_c_units.py. The segment lives
 * on a memfd; liveness is faked through the handle's rdv_ops.
 *
 *   the key hash as the segment format defines it (a reference written
 *   plainly here: the hash is in every slot, so it may never change),
 *   insert / find / delete, tombstones reused, keys that share a home slot,
 *   max_keys live keys and a full index (-ENOSPC, nothing left locked),
 *   concurrent inserts of the same keys, and of more keys than max_keys
 *   (exactly max_keys admitted), the key count of a holder that died in the
 *   middle of an insert or delete (finished or undone), lock words held by the dead (found through the fake
 *   alive table, cleared by the fake dead_holder hook), by nobody (a word
 *   naming no entry) and by the living (waited for, never broken). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "rdv_atomic.h"
#include "rdv_index.h"
#include "rdv_live.h"
#include "rdv_lock.h"
#include "rdv_os.h"
#include "rdv_segment.h"

#define UNIT_NAME "unit_index"
#include "unit_check.h"

/* ---- fake liveness -------------------------------------------------------- */

#define DEAD 7  /* an entry whose process the table says died */
#define LIVE 9  /* an entry whose process the table says lives */

static uint8_t alive_tab[RDV_MAX_PROCS];
static unsigned dead_holder_calls;
static uint32_t *last_klock;
static uint32_t last_holder;

static int fake_alive(rdv_t *h, uint32_t entry) {
    (void)h;
    return entry >= RDV_MAX_PROCS || alive_tab[entry];
}

/* Recovery would repair what the lock guards; here: clear it. */
static void fake_dead_holder(rdv_t *h, uint32_t *klock, uint32_t holder) {
    (void)h;
    __atomic_fetch_add(&dead_holder_calls, 1, __ATOMIC_RELAXED);
    last_klock = klock;
    last_holder = holder;
    CHECK(holder >= 1 && holder <= RDV_MAX_PROCS && !alive_tab[holder - 1],
          "dead_holder called for holder %u, which the table says is alive", holder);
    uint32_t expected = holder;
    rdv_cas(klock, &expected, 0, __ATOMIC_RELEASE);
}

static void fake_reclaim_dead(rdv_t *h) { (void)h; }

static const struct rdv_ops fake_ops = {
    .alive = fake_alive,
    .dead_holder = fake_dead_holder,
    .reclaim_dead = fake_reclaim_dead,
};

static rdv_t *make_segment(uint64_t max_keys, int *fdp) {
    int fd = memfd_create("shmrdv-unit-index", MFD_CLOEXEC);
    CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
    rdv_t *h;
    int rc = rdv_segment_create(fd, 64 << 10, max_keys, 0, &h);
    CHECK(rc == 0, "rdv_segment_create: %d", rc);
    rc = rdv_segment_lock_fd(h, fd);
    CHECK(rc == 0, "rdv_segment_lock_fd: %d", rc);
    rdv_segment_publish(h, fd);
    rc = rdv_live_claim(h);
    CHECK(rc == 0, "rdv_live_claim: %d", rc);
    CHECK(h->me != DEAD && h->me != LIVE, "our entry collides with the fake ones");
    h->ops = fake_ops;
    memset(alive_tab, 1, sizeof alive_tab);
    alive_tab[DEAD] = 0;
    *fdp = fd;
    return h;
}

static void drop_segment(rdv_t *h, int fd) {
    rdv_live_release(h);
    rdv_segment_discard(h);
    close(fd);
}

static void reset_index(rdv_t *h) {
    memset(h->kslots, 0, (h->slot_mask + 1) * sizeof *h->kslots);
    for (uint32_t i = 0; i < RDV_MAX_PROCS; i++)
        h->kprocs[i].key_count = 0;
    h->khdr->arena.keys_approx = 0;
}

/* The key count agrees with the slots (nothing in progress). */
static void check_count(rdv_t *h) {
    int64_t live = 0;
    for (uint64_t i = 0; i <= h->slot_mask; i++)
        live += h->kslots[i].state == RDV_SLOT_LIVE;
    CHECK(rdv_index_live_keys(h) == live, "the key count says %lld, %lld slots are live",
          (long long)rdv_index_live_keys(h), (long long)live);
    CHECK(h->khdr->arena.keys_approx == live, "keys_approx %lld, %lld live", (long long)h->khdr->arena.keys_approx, (long long)live);
    for (uint32_t i = 0; i < RDV_MAX_PROCS; i++)
        CHECK(RDV_KC_SLOT(h->kprocs[i].key_count) == 0, "entry %u: a count change left in progress", i);
}

/* No lock word of the index is held. */
static void check_unlocked(rdv_t *h) {
    for (uint64_t i = 0; i <= h->slot_mask; i++)
        CHECK(h->kslots[i].lock == 0 && h->kslots[i].ins_lock == 0, "slot %llu: lock %u, ins_lock %u",
              (unsigned long long)i, h->kslots[i].lock, h->kslots[i].ins_lock);
}

static uint64_t home_of(rdv_t *h, const char *key, uint32_t len) {
    uint64_t h1, h2;
    rdv_hash_key(h, key, len, &h1, &h2);
    return h1 & h->slot_mask;
}

static int racing; /* threads share the index: a slot just released may be taken again */

/* Run fn(0..n-1) on n threads that share barrier, and wait for them all. */
static void run_threads(int n, pthread_barrier_t *barrier, void *(*fn)(void *)) {
    pthread_t th[16];
    CHECK(n <= 16, "%d threads", n);
    pthread_barrier_init(barrier, NULL, (unsigned)n);
    for (uintptr_t t = 0; t < (uintptr_t)n; t++)
        CHECK(pthread_create(&th[t], NULL, fn, (void *)t) == 0, "pthread_create");
    for (int t = 0; t < n; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(barrier);
}

/* Insert (or find) a key: returns its slot, checked and unlocked again. */
static uint32_t put(rdv_t *h, const char *key, uint32_t len) {
    uint32_t idx = UINT32_MAX;
    int rc = rdv_index_acquire(h, key, len, 1, &idx);
    CHECK(rc == 0, "acquire(create) of '%.*s': %d", (int)(len > 40 ? 40 : len), key, rc);
    CHECK(idx <= h->slot_mask, "slot %u", idx);
    struct rdv_slot *s = &h->kslots[idx];
    uint64_t h1, h2;
    rdv_hash_key(h, key, len, &h1, &h2);
    CHECK(s->lock == h->me + 1, "acquire returned slot %u unlocked (%u)", idx, s->lock);
    CHECK(s->state == RDV_SLOT_LIVE && s->h1 == h1 && s->h2 == h2 && s->key_len == len,
          "slot %u does not hold the key", idx);
    rdv_index_release(h, idx);
    /* (threads racing for the slot may take it at once) */
    CHECK(racing || s->lock == 0, "release left slot %u locked", idx);
    return idx;
}

/* The slot a key is found in lock-free, or -1. */
static int64_t find(rdv_t *h, const char *key, uint32_t len) {
    uint64_t h1, h2;
    rdv_hash_key(h, key, len, &h1, &h2);
    uint32_t idx;
    int rc = rdv_index_find(h, h1, h2, len, &idx);
    CHECK(rc == 0 || rc == -ENOENT, "find: %d", rc);
    return rc == 0 ? (int64_t)idx : -1;
}

/* Delete a key (as a receiver that took its last message does). */
static void del(rdv_t *h, const char *key, uint32_t len) {
    uint32_t idx;
    int rc = rdv_index_acquire(h, key, len, 0, &idx);
    CHECK(rc == 0, "acquire of '%.*s' to delete it: %d", (int)len, key, rc);
    uint32_t gen = h->kslots[idx].gen;
    rdv_index_maybe_delete(h, idx);
    CHECK(h->kslots[idx].state == RDV_SLOT_TOMB && h->kslots[idx].gen == gen + 1,
          "an idle key was not turned into a tombstone");
    rdv_index_release(h, idx);
}

/* Keys k-<n> that hash to the same home slot as each other. */
static int same_home_keys(rdv_t *h, char (*out)[32], int want, uint64_t *home) {
    char first[32];
    snprintf(first, sizeof first, "/job:w/task:0;home;%d", 0);
    *home = home_of(h, first, (uint32_t)strlen(first));
    int n = 0;
    for (int i = 0; n < want && i < 1000000; i++) {
        char k[32];
        snprintf(k, sizeof k, "/job:w/task:0;home;%d", i);
        if (home_of(h, k, (uint32_t)strlen(k)) == *home)
            memcpy(out[n++], k, sizeof k);
    }
    return n;
}

/* ---- the key hash --------------------------------------------------------- */

static uint64_t ref_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* The hash as the segment format defines it: the key's 8-byte words in
 * turn, then its last len % 8 bytes zero-extended, with their count. */
static uint64_t ref_hash(uint64_t seed, const char *p, uint32_t len) {
    uint64_t acc = ref_mix64(seed ^ ((uint64_t)len * 0x9e3779b97f4a7c15ULL));
    uint32_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        acc = ref_mix64(acc ^ w) * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
    }
    uint64_t tail = 0;
    memcpy(&tail, p + i, len - i);
    return ref_mix64(acc ^ tail ^ ((uint64_t)(len - i) << 56));
}

/* Every key length, random bytes and seeds: rdv_hash_key as defined. The
 * key sits at the end of a buffer, so a load past it would be caught. */
static void test_hash(rdv_t *h) {
    uint64_t saved[2] = {h->khdr->hash_seed[0], h->khdr->hash_seed[1]};
    unsigned seed = 12345;
    for (uint32_t len = 1; len <= RDV_KEY_MAX; len++) {
        for (int round = 0; round < 8; round++) {
            char *key = malloc(len);
            CHECK(key != NULL, "malloc");
            for (uint32_t j = 0; j < len; j++)
                key[j] = (char)rand_r(&seed);
            for (int s = 0; s < 2; s++)
                h->khdr->hash_seed[s] = (uint64_t)rand_r(&seed) << 33 ^ (uint64_t)rand_r(&seed) << 11 ^ (uint64_t)rand_r(&seed);
            uint64_t h1, h2;
            rdv_hash_key(h, key, len, &h1, &h2);
            CHECK(h1 == ref_hash(h->khdr->hash_seed[0], key, len) && h2 == ref_hash(h->khdr->hash_seed[1], key, len),
                  "the hash of a %u-byte key differs from its definition", len);
            free(key);
        }
    }
    h->khdr->hash_seed[0] = saved[0];
    h->khdr->hash_seed[1] = saved[1];
    printf("unit_index: hash: ok\n");
}

static void test_basic(rdv_t *h) {
    phase = "basic";
    reset_index(h);
    char key[64];
    uint32_t idx[20];
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof key, "/job:w/task:0;basic;%d", i);
        idx[i] = put(h, key, (uint32_t)strlen(key));
        for (int j = 0; j < i; j++)
            CHECK(idx[j] != idx[i], "two keys in one slot %u", idx[i]);
    }
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof key, "/job:w/task:0;basic;%d", i);
        uint32_t len = (uint32_t)strlen(key);
        CHECK(find(h, key, len) == idx[i], "key %d found elsewhere", i);
        CHECK(put(h, key, len) == idx[i], "a second insert of key %d moved it", i);
        uint32_t got;
        CHECK(rdv_index_acquire(h, key, len, 0, &got) == 0 && got == idx[i], "acquire without create");
        CHECK(h->kslots[got].lock == h->me + 1, "acquire without create returned it unlocked");
        rdv_index_release(h, got);
        /* a prefix, or a longer key, is another key */
        CHECK(find(h, key, len - 1) != idx[i], "a prefix of key %d matched it", i);
    }
    uint32_t got;
    CHECK(rdv_index_acquire(h, "absent", 6, 0, &got) == -ENOENT, "acquire of an absent key without create");
    CHECK(find(h, "absent", 6) < 0, "find of an absent key");
    /* bytes the hash must not stop at: NULs, and the longest key */
    char nul[5] = {'a', 0, 'b', 0, 'c'}, nul2[5] = {'a', 0, 'b', 0, 'd'};
    uint32_t a = put(h, nul, 5), b = put(h, nul2, 5);
    CHECK(a != b, "keys that differ after a NUL share a slot");
    char *big = malloc(RDV_KEY_MAX);
    memset(big, 'x', RDV_KEY_MAX);
    uint32_t c = put(h, big, RDV_KEY_MAX);
    big[RDV_KEY_MAX - 1] = 'y';
    uint32_t d = put(h, big, RDV_KEY_MAX);
    CHECK(c != d && find(h, big, RDV_KEY_MAX) == d, "keys of the largest length");
    free(big);
    check_unlocked(h);
    /* a busy key is not deleted */
    snprintf(key, sizeof key, "/job:w/task:0;basic;%d", 3);
    uint32_t len = (uint32_t)strlen(key);
    CHECK(rdv_index_acquire(h, key, len, 0, &got) == 0, "acquire");
    h->kslots[got].count = 1;
    rdv_index_maybe_delete(h, got);
    CHECK(h->kslots[got].state == RDV_SLOT_LIVE, "a key with a queued message was deleted");
    h->kslots[got].count = 0;
    h->kslots[got].waiters = 1;
    rdv_index_maybe_delete(h, got);
    CHECK(h->kslots[got].state == RDV_SLOT_LIVE, "a key with a waiter was deleted");
    h->kslots[got].waiters = 0;
    rdv_index_release(h, got);
    del(h, key, len);
    CHECK(find(h, key, len) < 0, "a deleted key is still found");
    CHECK(rdv_index_acquire(h, key, len, 0, &got) == -ENOENT, "a deleted key is still acquired");
    uint32_t again = put(h, key, len);
    CHECK(h->kslots[again].state == RDV_SLOT_LIVE, "re-insert");
    check_unlocked(h);
    printf("unit_index: basic: ok\n");
}

static void test_tombstones(rdv_t *h) {
    phase = "tombstones";
    reset_index(h);
    char keys[6][32];
    uint64_t home;
    CHECK(same_home_keys(h, keys, 6, &home) == 6, "not enough keys sharing a home slot");
    uint64_t m = h->slot_mask;
    for (int i = 0; i < 4; i++) {
        uint32_t idx = put(h, keys[i], (uint32_t)strlen(keys[i]));
        CHECK(idx == ((home + (uint64_t)i) & m), "key %d of a shared home in slot %u, not %llu", i, idx,
              (unsigned long long)((home + (uint64_t)i) & m));
    }
    CHECK(h->kslots[home].max_probe == 3, "home max_probe %u, expected 3", h->kslots[home].max_probe);
    /* delete the second: the ones after it are still found across the tombstone */
    uint32_t gen = h->kslots[(home + 1) & m].gen;
    del(h, keys[1], (uint32_t)strlen(keys[1]));
    CHECK(find(h, keys[1], (uint32_t)strlen(keys[1])) < 0, "deleted key found");
    for (int i = 0; i < 4; i++)
        if (i != 1)
            CHECK(find(h, keys[i], (uint32_t)strlen(keys[i])) == (int64_t)((home + (uint64_t)i) & m),
                  "key %d lost behind a tombstone", i);
    /* the next insert of that home takes the tombstone */
    uint32_t idx = put(h, keys[4], (uint32_t)strlen(keys[4]));
    CHECK(idx == ((home + 1) & m), "a new key of the home went to slot %u, not the tombstone", idx);
    CHECK(h->kslots[idx].gen == gen + 2, "a reused slot's gen %u, expected %u", h->kslots[idx].gen, gen + 2);
    CHECK(h->kslots[home].max_probe == 3, "max_probe grew for a reused slot");
    /* and the deleted key, back, goes past the end of the run */
    idx = put(h, keys[1], (uint32_t)strlen(keys[1]));
    CHECK(idx == ((home + 4) & m) && h->kslots[home].max_probe == 4, "the re-inserted key in slot %u", idx);
    /* a tombstone where a key of another home landed is reused as well */
    for (int i = 0; i < 5; i++)
        del(h, keys[i], (uint32_t)strlen(keys[i]));
    for (int i = 0; i < 5; i++)
        CHECK(find(h, keys[i], (uint32_t)strlen(keys[i])) < 0, "key %d found after deleting all", i);
    idx = put(h, keys[5], (uint32_t)strlen(keys[5]));
    CHECK(idx == home, "a key after deleting all went to %u, not its home %llu", idx, (unsigned long long)home);
    check_unlocked(h);
    printf("unit_index: tombstones: ok (home %llu)\n", (unsigned long long)home);
}

/* max_keys live keys: one more is refused, until one is deleted. */
static void test_max_keys(rdv_t *h) {
    phase = "max_keys";
    reset_index(h);
    uint64_t max = h->khdr->max_keys;
    char key[64];
    for (uint64_t i = 0; i < max; i++) {
        snprintf(key, sizeof key, "/job:w/task:0;max;%llu", (unsigned long long)i);
        put(h, key, (uint32_t)strlen(key));
    }
    uint32_t idx;
    CHECK(rdv_index_acquire(h, "one too many", 12, 1, &idx) == -ENOSPC, "insert %llu of max_keys %llu",
          (unsigned long long)max + 1, (unsigned long long)max);
    check_unlocked(h);
    check_count(h);
    for (uint64_t i = 0; i < max; i++) { /* the keys already there still work */
        snprintf(key, sizeof key, "/job:w/task:0;max;%llu", (unsigned long long)i);
        CHECK(put(h, key, (uint32_t)strlen(key)) <= h->slot_mask, "key %llu", (unsigned long long)i);
    }
    snprintf(key, sizeof key, "/job:w/task:0;max;%d", 3);
    del(h, key, (uint32_t)strlen(key));
    put(h, "one too many", 12);
    CHECK(rdv_index_acquire(h, "and another", 11, 1, &idx) == -ENOSPC, "a second one too many");
    /* a message going back to its key may pass the limit: it was live before */
    CHECK(rdv_index_acquire(h, "restored", 8, RDV_INDEX_RESTORE, &idx) == 0, "a restore past max_keys");
    rdv_index_release(h, idx);
    CHECK(rdv_index_live_keys(h) == (int64_t)max + 1, "a restore is counted");
    del(h, "restored", 8);
    /* a total left high by a death (between a delete's state and its
     * total): the sum decides, and the limit still holds exactly */
    del(h, "one too many", 12);
    h->khdr->arena.keys_approx += 5;
    put(h, "and another", 11);
    CHECK(rdv_index_acquire(h, "and a third", 11, 1, &idx) == -ENOSPC, "past max_keys with a high total");
    h->khdr->arena.keys_approx -= 5;
    check_unlocked(h);
    check_count(h);
    printf("unit_index: max_keys: %llu keys, ok\n", (unsigned long long)max);
}

/* A full index (damage, or max_keys raised in place: it is at most half the
 * slots): inserts fail, lookups end. */
static void test_full(rdv_t *h) {
    phase = "full";
    reset_index(h);
    uint64_t slots = h->slot_mask + 1, max = h->khdr->max_keys;
    h->khdr->max_keys = slots + 1;
    char key[64];
    for (uint64_t i = 0; i < slots; i++) {
        snprintf(key, sizeof key, "/job:w/task:0;full;%llu", (unsigned long long)i);
        put(h, key, (uint32_t)strlen(key));
    }
    for (uint64_t i = 0; i <= h->slot_mask; i++)
        CHECK(h->kslots[i].state == RDV_SLOT_LIVE, "slot %llu not in use in a full index", (unsigned long long)i);
    uint32_t idx;
    int rc = rdv_index_acquire(h, "one too many", 12, 1, &idx);
    CHECK(rc == -ENOSPC, "an insert into a full index: %d", rc);
    check_unlocked(h);
    CHECK(rdv_index_acquire(h, "one too many", 12, 0, &idx) == -ENOENT, "a lookup in a full index");
    CHECK(find(h, "one too many", 12) < 0, "find in a full index");
    for (uint64_t i = 0; i < slots; i++) { /* the keys already there still work */
        snprintf(key, sizeof key, "/job:w/task:0;full;%llu", (unsigned long long)i);
        CHECK(find(h, key, (uint32_t)strlen(key)) >= 0, "key %llu lost in a full index", (unsigned long long)i);
        put(h, key, (uint32_t)strlen(key));
    }
    /* one tombstone makes room for one */
    snprintf(key, sizeof key, "/job:w/task:0;full;%d", 17);
    del(h, key, (uint32_t)strlen(key));
    put(h, "one too many", 12);
    CHECK(rdv_index_acquire(h, "and another", 11, 1, &idx) == -ENOSPC, "a second insert into a full index");
    /* all tombstones: inserts and lookups still end */
    for (uint64_t i = 0; i < slots; i++) {
        snprintf(key, sizeof key, "/job:w/task:0;full;%llu", (unsigned long long)i);
        if (i != 17)
            del(h, key, (uint32_t)strlen(key));
    }
    del(h, "one too many", 12);
    CHECK(find(h, "never there", 11) < 0, "find among tombstones");
    put(h, "and another", 11);
    check_unlocked(h);
    check_count(h);
    h->khdr->max_keys = max;
    printf("unit_index: full: %llu slots, ok\n", (unsigned long long)slots);
}

/* A holder that died in the middle of an insert or a delete, after the
 * count word and before or after the slot's state: the repair finishes or
 * undoes the count from the state alone. */
static void test_count_repair(rdv_t *h) {
    phase = "count repair";
    struct { int deleting, state_done; int64_t net_after; } cases[] = {
        {0, 0, 0}, /* insert, state never set: undone */
        {0, 1, 1}, /* insert, state LIVE: kept */
        {1, 0, 1}, /* delete, state still LIVE: undone */
        {1, 1, 0}, /* delete, state TOMB: kept */
    };
    for (unsigned c = 0; c < sizeof cases / sizeof *cases; c++) {
        reset_index(h);
        uint32_t idx = 5;
        struct rdv_slot *s = &h->kslots[idx];
        int64_t before = cases[c].deleting ? 1 : 0; /* the dead's net before its change */
        int live_after = cases[c].deleting ? !cases[c].state_done : cases[c].state_done;
        s->state = live_after ? RDV_SLOT_LIVE : RDV_SLOT_TOMB;
        s->lock = DEAD + 1;
        int64_t begun = before + (cases[c].deleting ? -1 : +1);
        h->kprocs[DEAD].key_count = RDV_KC_WORD(begun, (idx + 1) | (cases[c].deleting ? RDV_KC_DELETE : 0));
        rdv_index_count_repair(h, DEAD, idx);
        uint64_t w = h->kprocs[DEAD].key_count;
        CHECK(RDV_KC_SLOT(w) == 0 && RDV_KC_NET(w) == cases[c].net_after, "case %u: net %lld, slot %u", c,
              (long long)RDV_KC_NET(w), RDV_KC_SLOT(w));
        /* a change at another slot is not this slot's to repair */
        h->kprocs[DEAD].key_count = RDV_KC_WORD(3, 9 + 1);
        rdv_index_count_repair(h, DEAD, idx);
        CHECK(h->kprocs[DEAD].key_count == RDV_KC_WORD(3, 9 + 1), "case %u: another slot's change repaired", c);
        s->lock = 0;
    }
    /* Net counts wrap (a process that only makes keys others delete): the
     * sum is still exact. */
    reset_index(h);
    h->kprocs[DEAD].key_count = RDV_KC_WORD((int64_t)1 << 36, 0); /* one past the largest: wrapped */
    h->kprocs[LIVE].key_count = RDV_KC_WORD(-((int64_t)1 << 36) + 7, 0);
    CHECK(rdv_index_live_keys(h) == 7, "a wrapped count sums to %lld, not 7", (long long)rdv_index_live_keys(h));
    reset_index(h);
    printf("unit_index: count repair: ok\n");
}

/* More distinct keys than max_keys, inserted at once by several threads:
 * exactly max_keys are admitted. */
#define LIMIT_THREADS 6
static rdv_t *limit_h;
static pthread_barrier_t limit_barrier;
static int limit_admitted;

static void *limit_race(void *arg) {
    uintptr_t t = (uintptr_t)arg;
    char key[64];
    pthread_barrier_wait(&limit_barrier);
    for (int i = 0; i < 12; i++) {
        snprintf(key, sizeof key, "/job:w/task:0;limit;%d;%d", (int)t, i);
        uint32_t idx;
        int rc = rdv_index_acquire(limit_h, key, (uint32_t)strlen(key), 1, &idx);
        CHECK(rc == 0 || rc == -ENOSPC, "insert under the limit race: %d", rc);
        if (rc == 0) {
            rdv_index_release(limit_h, idx);
            __atomic_fetch_add(&limit_admitted, 1, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

static void test_limit_race(rdv_t *h) {
    phase = "limit race";
    for (int round = 0; round < 50; round++) {
        reset_index(h);
        limit_h = h;
        limit_admitted = 0;
        if (round % 2)
            h->khdr->arena.keys_approx = 3; /* a high total: every insert near the limit sums */
        run_threads(LIMIT_THREADS, &limit_barrier, limit_race);
        CHECK(limit_admitted == (int)h->khdr->max_keys, "round %d: %d keys admitted, max_keys %llu", round,
              limit_admitted, (unsigned long long)h->khdr->max_keys);
        CHECK(rdv_index_live_keys(h) == (int64_t)h->khdr->max_keys, "round %d: count %lld", round,
              (long long)rdv_index_live_keys(h));
        check_unlocked(h);
    }
    reset_index(h);
    printf("unit_index: limit race: %d threads x 12 keys, exactly max_keys admitted, 50 rounds\n", LIMIT_THREADS);
}

/* Threads insert the same keys in different orders, round after round:
 * each key ends up in exactly one slot (ins_lock); between rounds thread 0
 * checks and deletes them all. */
#define RACE_THREADS 4
#define RACE_KEYS 24
#define RACE_ROUNDS 100

static rdv_t *race_h;
static pthread_barrier_t race_barrier;

static void race_key(char *key, int round, int k) {
    snprintf(key, 64, "/job:w/task:0;race-%d;%d", round, k);
}

static void race_check_round(rdv_t *h, int round) {
    uint32_t seen[RACE_KEYS];
    char key[64];
    for (int k = 0; k < RACE_KEYS; k++) {
        race_key(key, round, k);
        uint64_t h1, h2;
        rdv_hash_key(h, key, (uint32_t)strlen(key), &h1, &h2);
        int copies = 0;
        for (uint64_t i = 0; i <= h->slot_mask; i++)
            if (h->kslots[i].state == RDV_SLOT_LIVE && h->kslots[i].h1 == h1 && h->kslots[i].h2 == h2)
                copies++, seen[k] = (uint32_t)i;
        CHECK(copies == 1, "round %d: key %d in %d slots", round, k, copies);
        CHECK(find(h, key, (uint32_t)strlen(key)) == seen[k], "round %d: key %d found elsewhere", round, k);
    }
    uint64_t live = 0;
    for (uint64_t i = 0; i <= h->slot_mask; i++)
        live += h->kslots[i].state == RDV_SLOT_LIVE;
    CHECK(live == RACE_KEYS, "round %d: %llu live slots", round, (unsigned long long)live);
    check_unlocked(h);
    check_count(h);
    for (int k = 0; k < RACE_KEYS; k++) {
        race_key(key, round, k);
        del(h, key, (uint32_t)strlen(key));
    }
}

static void *race(void *arg) {
    uintptr_t t = (uintptr_t)arg;
    char key[64];
    for (int round = 0; round < RACE_ROUNDS; round++) {
        for (int i = 0; i < RACE_KEYS; i++) {
            int k = (int)(((uintptr_t)i * (2 * t + 1) + t * 5 + (uintptr_t)round) % RACE_KEYS);
            race_key(key, round, k);
            put(race_h, key, (uint32_t)strlen(key));
        }
        pthread_barrier_wait(&race_barrier);
        if (t == 0)
            race_check_round(race_h, round);
        pthread_barrier_wait(&race_barrier);
    }
    return NULL;
}

static void test_race(rdv_t *h) {
    phase = "race";
    reset_index(h);
    race_h = h;
    racing = 1;
    run_threads(RACE_THREADS, &race_barrier, race);
    racing = 0;
    check_unlocked(h);
    printf("unit_index: race: %d threads, %d rounds of %d keys, each key in one slot\n", RACE_THREADS,
           RACE_ROUNDS, RACE_KEYS);
}

/* A thread that acquires a key whose lock a live holder has. */
struct waiter {
    rdv_t *h;
    const char *key;
    int done, rc;
    uint32_t idx;
};

static void *acquire_thread(void *arg) {
    struct waiter *w = arg;
    w->rc = rdv_index_acquire(w->h, w->key, (uint32_t)strlen(w->key), 0, &w->idx);
    __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_dead_holder(rdv_t *h) {
    phase = "dead holder";
    reset_index(h);
    const char *key = "/job:w/task:0;locked;0:0";
    uint32_t len = (uint32_t)strlen(key);
    uint32_t idx = put(h, key, len), got;
    struct rdv_slot *s = &h->kslots[idx];

    /* the slot lock, held by a dead entry: found, cleared by the hook */
    s->lock = DEAD + 1;
    unsigned calls = dead_holder_calls;
    CHECK(rdv_index_acquire(h, key, len, 0, &got) == 0 && got == idx, "acquire past a dead holder");
    CHECK(dead_holder_calls == calls + 1 && last_klock == &s->lock && last_holder == DEAD + 1,
          "the dead holder was not reported once, for this slot's lock (%u calls)", dead_holder_calls - calls);
    CHECK(s->lock == h->me + 1, "acquired, but the lock names %u", s->lock);
    rdv_index_release(h, idx);

    /* the home slot's ins_lock, held by a dead entry: an insert gets past */
    const char *fresh = "/job:w/task:0;fresh;0:0";
    uint64_t home = home_of(h, fresh, (uint32_t)strlen(fresh));
    h->kslots[home].ins_lock = DEAD + 1;
    calls = dead_holder_calls;
    put(h, fresh, (uint32_t)strlen(fresh));
    CHECK(dead_holder_calls == calls + 1 && last_klock == &h->kslots[home].ins_lock, "ins_lock's dead holder");

    /* a free slot's lock, held by a dead entry, in the way of an insert */
    const char *third = "/job:w/task:0;third;0:0";
    home = home_of(h, third, (uint32_t)strlen(third));
    uint64_t target = home;
    while (h->kslots[target].state == RDV_SLOT_LIVE)
        target = (target + 1) & h->slot_mask;
    h->kslots[target].lock = DEAD + 1;
    calls = dead_holder_calls;
    CHECK(put(h, third, (uint32_t)strlen(third)) == target, "insert past a dead holder's free slot");
    CHECK(dead_holder_calls == calls + 1 && last_klock == &h->kslots[target].lock, "free slot's dead holder");

    /* a lock word naming no entry at all (damage): freed without the hook */
    s->lock = RDV_MAX_PROCS + 5;
    calls = dead_holder_calls;
    CHECK(rdv_index_acquire(h, key, len, 0, &got) == 0 && got == idx, "acquire past a lock naming nobody");
    CHECK(dead_holder_calls == calls, "the hook was called for a lock naming no entry");
    rdv_index_release(h, idx);

    /* a word naming a live entry that holds no lock (damage): freed after a
     * while of checks, without the hook */
    h->kprocs[LIVE].state = RDV_PROC_ALIVE; /* (liveness itself is faked) */
    s->lock = LIVE + 1;
    calls = dead_holder_calls;
    CHECK(rdv_index_acquire(h, key, len, 0, &got) == 0 && got == idx, "acquire past a stale live holder");
    CHECK(dead_holder_calls == calls, "the hook was called for a live holder");
    rdv_index_release(h, idx);

    /* a live holder (which counts its lock) is waited for, never broken */
    h->kprocs[LIVE].locks_held = 1;
    s->lock = LIVE + 1;
    calls = dead_holder_calls;
    struct waiter w = {.h = h, .key = key};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, acquire_thread, &w) == 0, "pthread_create");
    usleep(150000);
    CHECK(!__atomic_load_n(&w.done, __ATOMIC_ACQUIRE), "acquire took a lock a live holder has");
    CHECK(dead_holder_calls == calls, "the hook was called for a live holder");
    CHECK(s->lock == LIVE + 1, "a live holder's lock changed to %u", s->lock);
    WRITE_ONCE(s->lock, 0); /* the live holder lets go */
    WRITE_ONCE(h->kprocs[LIVE].locks_held, 0);
    pthread_join(th, NULL);
    CHECK(w.rc == 0 && w.idx == idx, "the waiter's acquire: %d", w.rc);
    rdv_index_release(h, idx);
    check_unlocked(h);

    /* so is one that counts it in a thread slot of its entry's */
    h->kprocs[LIVE].thread_holds[RDV_HOLD_SLOTS - 1] = 1;
    s->lock = LIVE + 1;
    w.done = 0;
    CHECK(pthread_create(&th, NULL, acquire_thread, &w) == 0, "pthread_create");
    usleep(150000);
    CHECK(!__atomic_load_n(&w.done, __ATOMIC_ACQUIRE), "acquire took a lock a live holder counts in a thread slot");
    CHECK(s->lock == LIVE + 1, "a live holder's lock changed to %u", s->lock);
    WRITE_ONCE(s->lock, 0);
    WRITE_ONCE(h->kprocs[LIVE].thread_holds[RDV_HOLD_SLOTS - 1], 0);
    pthread_join(th, NULL);
    CHECK(w.rc == 0 && w.idx == idx, "the waiter's acquire: %d", w.rc);
    rdv_index_release(h, idx);
    check_unlocked(h);
    printf("unit_index: dead holder: ok\n");
}

int main(void) {
    int64_t t0 = rdv_now_ns();
    int fd;
    rdv_t *h = make_segment(32, &fd); /* 64 slots */
    CHECK(h->slot_mask == 63, "64 slots expected, got %llu", (unsigned long long)h->slot_mask + 1);
    test_hash(h);
    test_basic(h);
    test_tombstones(h);
    test_max_keys(h);
    test_full(h);
    test_count_repair(h);
    test_limit_race(h);
    test_race(h);
    test_dead_holder(h);
    drop_segment(h, fd);
    printf("unit_index: all passed in %.1f s\n", (double)(rdv_now_ns() - t0) / 1e9);
    return 0;
}
