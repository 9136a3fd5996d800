/* Multi-process stress test of the C core, built with
 * -fsanitize=address,undefined by tests/c/test_c_core.py.
 *
 * PRODUCERS processes send MESSAGES messages each, of random sizes, over KEYS
 * keys round-robin; CONSUMERS processes split the keys among themselves and
 * take whatever is queued on theirs (a consumer that blocked on one key could
 * wait for a message that cannot be sent while the arena is full of the
 * others': a bounded buffer's deadlock, not the core's), holding a random few
 * views for a while so the ring wraps around held blocks, and verify every
 * payload. The parent checks that the sum of checksums sent equals the
 * sum received and that the arena is empty at the end.
 *
 * Then producer marks under SIGKILL: a producer publishes 1, 2, 3, ... on one
 * key with rdv_send_commit_marked, each setting mark 0 to (MARK_ID, n, 0),
 * starting after the value the mark holds; the parent kills it at random
 * moments (often inside a marked commit: it is much of the loop) and starts
 * another, receiving as it goes. It must receive exactly 1..mark, in order.
 *
 * Then leased receives under SIGKILL: a forwarder lease-receives numbered
 * messages, reports each number down a pipe, holds the view a moment (the
 * far side acknowledging) and releases it; the parent queues more and kills
 * it at random, again and again. Every number must be forwarded or still
 * queued at the end, in order, and only a number a killed forwarder held
 * may be forwarded twice.
 *
 * Then allocation and free under SIGKILL: churners loop sends and receives
 * of random sizes on keys of their own, with bursts of rdv_send_begin /
 * rdv_send_discard, so that they spend much of their time inside
 * rdv_arena_alloc and rdv_arena_free under the arena lock; the parent
 * kills one at a random moment and starts another, 200 times, while it
 * sends and receives checksummed messages on keys of its own. Everything
 * the parent receives must check out, and once it has drained every key
 * (after rdv_gc) the arena must be empty: the dead churners' blocks,
 * whatever step they died in, reclaimed.
 *
 * Then receivers in line under SIGKILL: WAITERS processes wait on two keys
 * in every way a receiver can (rdv_recv, rdv_recv_any_start, an async
 * waiter polled and then taken or cancelled), always leased, report each
 * number they take down a pipe and release it; the parent sends numbered
 * messages and kills a waiter at random moments (waiting in line, being
 * handed a message, taking it), again and again. Every number must be
 * reported or still queued at the end, and once every waiter is gone no
 * waiter, key, block or waiter slab may be left. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* shmrdv.h, through the handle's layout: the churn's report tells whether a
 * churner died holding the arena lock (shmrdv.h has no include guard) */
#include "rdv_handle.h"

#define PRODUCERS 2
#define CONSUMERS 2
#define KEYS 16
#define MESSAGES 20000
#define MAX_WORDS 2048 /* up to 16 KiB payloads */
#define HOLD 4         /* views a consumer keeps at once */
#define TIMEOUT_NS (20LL * 1000000000)
#define KILLS 200
#define MARK_ID 0x5eed0001ULL
#define MARKED_KEY "/job:stress/task:0;marked;0:0"
#define LEASE_KILLS 100
#define LEASE_BATCH 50 /* messages queued per forwarder */
#define LEASED_KEY "/job:stress/task:0;leased;0:0"
#define CHURN_KILLS 200
#define CHURNERS 2
#define CHURN_KEYS 2        /* per churner */
#define CHURN_MAX_WORDS 8192 /* up to 64 KiB payloads */
#define OWN_KEYS 4          /* the parent's, during the churn */
#define OWN_MAX_WORDS 2048
#define WAIT_KILLS 150
#define WAITERS 3
#define WAIT_BATCH 20 /* messages sent between kills */
#define WAIT_KEY_A "/job:stress/task:0;wait-a;0:0"
#define WAIT_KEY_B "/job:stress/task:0;wait-b;0:0"

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static rdv_t *current; /* for the state report when something fails */

static void die(const char *what, int rc) {
    fprintf(stderr, "stress: %s failed: %d (%s)\n", what, rc, strerror(-rc));
    struct rdv_stats st;
    if (current && rdv_stats(current, &st) == 0)
        fprintf(stderr, "stress: pending %llu, keys %llu, waiters %llu, used %llu of %llu\n",
                (unsigned long long)st.pending_messages, (unsigned long long)st.keys,
                (unsigned long long)st.waiters, (unsigned long long)st.bytes_used,
                (unsigned long long)st.capacity);
    exit(1);
}

static rdv_t *attach(const char *name) {
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        die("shm_open", -errno);
    rdv_t *h;
    int rc = rdv_attach(fd, &h);
    close(fd);
    if (rc)
        die("attach", rc);
    return current = h;
}

static void key_name(char *buf, int k) { snprintf(buf, 64, "/job:stress/task:0;key-%d;0:0", k); }

/* Every producer sends its message i to key i % KEYS. */
static int messages_on_key(int k) { return PRODUCERS * (MESSAGES / KEYS + (k < MESSAGES % KEYS)); }

#define BATCH 4 /* messages per rdv_send_many / rdv_recv_many of the odd producers and consumers */

/* Producer id sends MESSAGES checksummed messages round the keys: the even
 * ones one rdv_send at a time, the odd ones in rdv_send_many batches. */
static uint64_t produce(const char *name, int id) {
    rdv_t *h = attach(name);
    uint64_t seed = 0x9e3779b97f4a7c15ULL * (id + 1), sum = 0;
    static uint64_t words[BATCH][MAX_WORDS];
    static char keys[BATCH][64];
    static int64_t shapes[BATCH][1], strides[1] = {8};
    struct rdv_send_item items[BATCH];
    const struct rdv_send_item *item_ptrs[BATCH];
    const void *srcs[BATCH];
    int batch = id % 2 ? BATCH : 1;
    for (int i = 0; i < MESSAGES; i += batch) {
        int count = MESSAGES - i < batch ? MESSAGES - i : batch;
        for (int b = 0; b < count; b++) {
            uint32_t n = 2 + rng(&seed) % (MAX_WORDS - 2);
            words[b][0] = n;
            uint64_t x = 0;
            for (uint32_t j = 1; j < n - 1; j++)
                x += words[b][j] = rng(&seed);
            words[b][n - 1] = x; /* checksum of the middle words */
            sum += x;
            key_name(keys[b], (i + b) % KEYS);
            shapes[b][0] = n;
            items[b] = (struct rdv_send_item){.key = keys[b], .key_len = strlen(keys[b]), .dtype = "<u8",
                                              .dtype_len = 3, .ndim = 1, .shape = shapes[b],
                                              .strides = strides, .nbytes = 8ull * n};
            item_ptrs[b] = &items[b];
            srcs[b] = words[b];
        }
        int rc;
        if (batch == 1) {
            rc = rdv_send(h, keys[0], items[0].key_len, "<u8", 3, 1, shapes[0], strides, words[0],
                          items[0].nbytes, TIMEOUT_NS);
        } else {
            uint32_t sent;
            rc = rdv_send_many(h, item_ptrs, srcs, (uint32_t)count, TIMEOUT_NS, &sent);
            if (rc == 0 && sent != (uint32_t)count)
                rc = -EBADMSG;
        }
        if (rc)
            die("send", rc);
    }
    rdv_close(h);
    return sum;
}

/* Check one received message; its checksum. */
static uint64_t checked(const struct rdv_msg_info *info) {
    const uint64_t *w = info->payload;
    uint64_t n = w[0], x = 0;
    if (info->nbytes != 8 * n || info->ndim != 1 || info->dims[0] != (int64_t)n)
        die("message shape", -EBADMSG);
    for (uint64_t j = 1; j < n - 1; j++)
        x += w[j];
    if (x != w[n - 1])
        die("payload checksum", -EBADMSG);
    return x;
}

static uint64_t consume(const char *name, int id) {
    rdv_t *h = attach(name);
    uint64_t sum = 0, seed = 77 + id;
    void *held[HOLD] = {0};
    int remaining[KEYS], left = 0;
    for (int k = id; k < KEYS; k += CONSUMERS)
        left += remaining[k] = messages_on_key(k);
    while (left > 0) {
        int took = 0;
        for (int k = id; k < KEYS; k += CONSUMERS) {
            if (!remaining[k])
                continue;
            char key[64];
            key_name(key, k);
            struct rdv_msg_info infos[BATCH];
            uint32_t got = 1, waiter = 0;
            /* never block on one key while another's messages fill the arena;
             * the odd consumers take up to a batch at once */
            int64_t wait_ns = took ? 0 : 1000000;
            uint32_t most = id % 2 ? (remaining[k] < BATCH ? (uint32_t)remaining[k] : BATCH) : 1;
            int rc = most == 1 ? rdv_recv(h, key, strlen(key), wait_ns, &infos[0])
                               : rdv_recv_many(h, key, strlen(key), wait_ns, 0, &waiter, infos, most, &got);
            if (rc < 0 && waiter && rdv_recv_cancel(h, &waiter, 0, NULL, &infos[0]) == 1)
                rc = 0, got = 1; /* handed over as we left the line */
            if (rc == -EAGAIN || rc == -ETIMEDOUT)
                continue;
            if (rc)
                die("recv", rc);
            for (uint32_t b = 0; b < got; b++) {
                sum += checked(&infos[b]);
                int slot = rng(&seed) % HOLD; /* keep this view, drop an older one */
                if (held[slot] && (rc = rdv_release_payload(h, held[slot])))
                    die("release", rc);
                held[slot] = infos[b].payload;
                remaining[k]--, left--, took++;
            }
        }
    }
    for (int i = 0; i < HOLD; i++)
        if (held[i])
            rdv_release_payload(h, held[i]);
    rdv_close(h);
    return sum;
}

static void produce_marked(const char *name) {
    rdv_t *h = attach(name);
    uint64_t id, n, unused;
    int rc = rdv_mark_get(h, 0, &id, &n, &unused);
    if (rc)
        die("mark_get", rc);
    for (;;) { /* until killed */
        n++;
        int64_t shape[1] = {1}, strides[1] = {8};
        uint64_t pos;
        void *payload;
        rc = rdv_send_begin(h, MARKED_KEY, strlen(MARKED_KEY), "<u8", 3, 1, shape, strides, 8,
                            TIMEOUT_NS, &pos, &payload);
        if (rc)
            die("send_begin", rc);
        memcpy(payload, &n, 8);
        rc = rdv_send_commit_marked(h, pos, 0, MARK_ID, n, 0);
        if (rc)
            die("send_commit_marked", rc);
        rdv_unref(h);
    }
}

/* Receive what is queued on the marked key: each must be *next, then next + 1... */
static int drain_marked(rdv_t *h, uint64_t *next) {
    struct rdv_msg_info info;
    int rc;
    while ((rc = rdv_recv(h, MARKED_KEY, strlen(MARKED_KEY), 0, &info)) == 0) {
        uint64_t n;
        memcpy(&n, info.payload, 8);
        rdv_release_payload(h, info.payload);
        if (n != *next) {
            fprintf(stderr, "stress: marked: received %llu, expected %llu\n", (unsigned long long)n,
                    (unsigned long long)*next);
            return 1;
        }
        ++*next;
    }
    return rc != -EAGAIN;
}

static int marked_kill_loop(rdv_t *h, const char *name) {
    int rc = rdv_mark_set(h, 0, MARK_ID, 0, 0);
    if (rc)
        die("mark_set", rc);
    uint64_t next = 1, seed = 12345, id, last, v1;
    int failed = 0;
    for (int k = 0; k < KILLS && !failed; k++) {
        uint64_t before = next - 1; /* the mark: every message committed so far is drained */
        pid_t pid = fork();
        if (pid < 0)
            die("fork", -errno);
        if (pid == 0) {
            alarm(60); /* never hang */
            produce_marked(name);
        }
        /* once it has committed (so every round makes progress), at random */
        uint64_t n = before;
        for (int waited = 0; n == before && waited < 10000; waited++) {
            usleep(1000);
            rc = rdv_mark_get(h, 0, &id, &n, &v1);
            if (rc)
                die("mark_get", rc);
        }
        failed |= n == before;
        usleep(rng(&seed) % 2000);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        failed |= !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL;
        failed |= drain_marked(h, &next);
    }
    rdv_gc(h, NULL);
    failed |= drain_marked(h, &next);
    rc = rdv_mark_get(h, 0, &id, &last, &v1);
    printf("stress: marked: %d kills, %llu messages, mark %llu\n", KILLS,
           (unsigned long long)next - 1, (unsigned long long)last);
    return failed || rc || id != MARK_ID || last != next - 1 || last < KILLS;
}

/* A numbered message: [n, 3n + 1, n, n]. */
static void send_number_to(rdv_t *h, const char *key, uint64_t n) {
    uint64_t words[4] = {n, 3 * n + 1, n, n};
    int64_t shape[1] = {4}, strides[1] = {8};
    int rc = rdv_send(h, key, strlen(key), "<u8", 3, 1, shape, strides, words, sizeof words, TIMEOUT_NS);
    if (rc)
        die("send", rc);
}

static void send_number(rdv_t *h, uint64_t n) { send_number_to(h, LEASED_KEY, n); }

/* A child running body(name, arg, the write end of a pipe) until killed
 * (or until it returns); *in gets the read end. */
static pid_t fork_reporting(const char *name, void (*body)(const char *, int, int), int arg, int *in) {
    int p[2];
    pid_t pid;
    if (pipe(p) < 0 || (pid = fork()) < 0)
        die("fork", -errno);
    if (pid == 0) {
        alarm(60); /* never hang */
        close(p[0]);
        body(name, arg, p[1]);
        _exit(0);
    }
    close(p[1]);
    *in = p[0];
    return pid;
}

static void forward(const char *name, int unused, int out) {
    (void)unused;
    rdv_t *h = attach(name);
    for (uint64_t seed = (uint64_t)getpid();;) { /* until killed */
        struct rdv_msg_info info;
        int rc = rdv_recv_leased(h, LEASED_KEY, strlen(LEASED_KEY), TIMEOUT_NS, &info);
        if (rc)
            die("recv_leased", rc);
        const uint64_t *w = info.payload;
        uint64_t n = info.nbytes == 32 && w[1] == 3 * w[0] + 1 ? w[0] : 0;
        if (write(out, &n, 8) != 8) /* atomic: below PIPE_BUF */
            _exit(1);
        if (rng(&seed) & 1)
            usleep(rng(&seed) % 300); /* the far side acknowledges */
        rdv_release_payload(h, info.payload);
    }
}

static int leased_kill_loop(rdv_t *h, const char *name) {
    static uint64_t seen[LEASE_KILLS * LEASE_BATCH + 1];
    uint64_t produced = 0, last = 0, again = 0, seed = 999;
    int failed = 0;
    for (int k = 0; k < LEASE_KILLS && !failed; k++) {
        for (int i = 0; i < LEASE_BATCH; i++)
            send_number(h, ++produced);
        int in;
        pid_t pid = fork_reporting(name, forward, 0, &in);
        /* Mostly once it forwards, then at random; every fourth time at once,
         * often while it attaches: reclaiming the one killed before. */
        int at_once = k % 4 == 3;
        uint64_t n;
        ssize_t got = at_once ? 0 : read(in, &n, 8);
        usleep(rng(&seed) % (at_once ? 500 : 2000));
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        failed |= !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL;
        /* in order; each forwarder may start with the number the last one held */
        if (at_once)
            got = read(in, &n, 8);
        for (int first = 1; got == 8; got = read(in, &n, 8), first = 0) {
            failed |= n == 0 || n > produced || n < last || (n == last && !first);
            again += seen[n]++ != 0;
            last = n;
        }
        close(in);
    }
    rdv_gc(h, NULL);
    struct rdv_msg_info info;
    int rc;
    for (int first = 1; (rc = rdv_recv(h, LEASED_KEY, strlen(LEASED_KEY), 0, &info)) == 0;
         first = 0) {
        uint64_t n = *(const uint64_t *)info.payload;
        rdv_release_payload(h, info.payload);
        failed |= n == 0 || n > produced || n < last || (n == last && !first);
        again += seen[n]++ != 0;
        last = n;
    }
    for (uint64_t n = 1; n <= produced; n++)
        failed |= seen[n] == 0; /* lost */
    printf("stress: leased: %d kills, %llu messages, %llu forwarded again\n", LEASE_KILLS,
           (unsigned long long)produced, (unsigned long long)again);
    return failed || rc != -EAGAIN || again > LEASE_KILLS;
}

/* A message of n words: n, n - 2 random words, their sum; returns the sum. */
static uint64_t fill_words(uint64_t *words, uint32_t n, uint64_t *seed) {
    uint64_t x = 0;
    words[0] = n;
    for (uint32_t j = 1; j < n - 1; j++)
        x += words[j] = rng(seed);
    words[n - 1] = x;
    return x;
}

/* 0 with *sum = its checksum if the message is one of fill_words'. */
static int check_words(const struct rdv_msg_info *info, uint64_t *sum) {
    const uint64_t *w = info->payload;
    *sum = 0;
    if (info->nbytes < 16 || info->nbytes % 8 || info->ndim != 1)
        return -1;
    uint64_t n = w[0], x = 0;
    if (info->nbytes != 8 * n || info->dims[0] != (int64_t)n)
        return -1;
    for (uint64_t j = 1; j < n - 1; j++)
        x += w[j];
    *sum = x;
    return x == w[n - 1] ? 0 : -1;
}

/* 2 .. max words, log-uniform: mostly small, so that alloc and free are
 * much of the work. */
static uint32_t random_words(uint64_t *seed, uint32_t max) {
    uint32_t bits = 1 + (uint32_t)(rng(seed) % 12), n = 2 + (uint32_t)(rng(seed) % (1u << bits));
    return n > max ? max : n;
}

static int send_words(rdv_t *h, const char *key, const uint64_t *words, uint32_t n) {
    int64_t shape[1] = {n}, strides[1] = {8};
    return rdv_send(h, key, strlen(key), "<u8", 3, 1, shape, strides, words, 8ull * n, TIMEOUT_NS);
}

static void churn_key(char *buf, int c, int k) { snprintf(buf, 64, "/job:stress/task:0;churn-%d-%d;0:0", c, k); }
static void own_key(char *buf, int k) { snprintf(buf, 64, "/job:stress/task:0;own-%d;0:0", k); }

/* The churners' payloads: n, then the first n - 2 words of a fixed random
 * run, then their sum (prefix sums precomputed): check_words' format,
 * written and checked without a loop over the words. */
static uint64_t churn_run[CHURN_MAX_WORDS], churn_prefix[CHURN_MAX_WORDS];

static void churn_init(void) {
    uint64_t seed = 0xc0ffee;
    for (uint32_t i = 0; i < CHURN_MAX_WORDS; i++) {
        churn_run[i] = rng(&seed);
        churn_prefix[i] = (i ? churn_prefix[i - 1] : 0) + churn_run[i];
    }
}

/* Until killed: sends and receives on churner c's keys, views held a
 * while, and bursts of blocks begun and discarded in random order. */
static void churn(const char *name, int c, int ready) {
    rdv_t *h = attach(name); /* reclaims the churners killed before us, if nobody did */
    uint32_t entry = h->me;
    if (write(ready, &entry, 4) != 4)
        _exit(1);
    close(ready);
    churn_init();
    uint64_t seed = 0x5eed5eedULL ^ (uint64_t)getpid() << 20;
    void *held[2] = {0};
    char key[64];
    for (;;) {
        /* a burst: allocs and frees, nothing else */
        uint64_t pos[12];
        int n = 1 + (int)(rng(&seed) % 12);
        churn_key(key, c, 0);
        for (int i = 0; i < n; i++) {
            int64_t shape[1] = {random_words(&seed, CHURN_MAX_WORDS)}, strides[1] = {8};
            void *payload;
            int rc = rdv_send_begin(h, key, strlen(key), "<u8", 3, 1, shape, strides, 8ull * shape[0], TIMEOUT_NS,
                                    &pos[i], &payload);
            if (rc)
                die("churn: send_begin", rc);
        }
        for (int i = n; i > 0; i--) {
            int j = (int)(rng(&seed) % (uint64_t)i);
            int rc = rdv_send_discard(h, pos[j]);
            if (rc)
                die("churn: send_discard", rc);
            rdv_unref(h);
            pos[j] = pos[i - 1];
        }
        /* a message or two, sent */
        int rc;
        for (int i = (int)(rng(&seed) % 2); i >= 0; i--) {
            uint32_t w = random_words(&seed, CHURN_MAX_WORDS);
            churn_key(key, c, (int)(rng(&seed) % CHURN_KEYS));
            int64_t shape[1] = {w}, strides[1] = {8};
            uint64_t *payload;
            rc = rdv_send_begin(h, key, strlen(key), "<u8", 3, 1, shape, strides, 8ull * w, TIMEOUT_NS, &pos[0],
                                (void **)&payload);
            if (rc)
                die("churn: send_begin", rc);
            payload[0] = w;
            memcpy(payload + 1, churn_run, 8ull * (w - 2));
            payload[w - 1] = churn_prefix[w - 3 < CHURN_MAX_WORDS ? w - 3 : 0] * (w > 2);
            if ((rc = rdv_send_commit(h, pos[0])))
                die("churn: send_commit", rc);
            rdv_unref(h);
        }
        /* one to three taken (what a killed predecessor left queued goes
         * too): queues stay short, but not always empty */
        int want = 1 + (int)(rng(&seed) % 3);
        for (int got = 0, k = 0; got < want && k < 2 * CHURN_KEYS; k++) {
            churn_key(key, c, k % CHURN_KEYS);
            struct rdv_msg_info info;
            rc = rdv_recv(h, key, strlen(key), 0, &info);
            if (rc == -EAGAIN)
                continue;
            if (rc)
                die("churn: recv", rc);
            const uint64_t *m = info.payload;
            uint64_t mw = info.nbytes / 8;
            if (mw < 2 || mw > CHURN_MAX_WORDS || m[0] != mw || info.nbytes != 8 * mw ||
                m[mw - 1] != (mw > 2 ? churn_prefix[mw - 3] : 0) || (mw > 2 && m[1] != churn_run[0]))
                die("churn: payload", -EBADMSG);
            got++;
            int slot = (int)(rng(&seed) % 3);
            if (slot == 2) { /* released at once */
                rdv_release_payload(h, info.payload);
                continue;
            }
            if (held[slot] && (rc = rdv_release_payload(h, held[slot])))
                die("churn: release", rc);
            held[slot] = info.payload;
        }
    }
}

static pid_t start_churner(const char *name, int c, uint32_t *entry) {
    int in;
    pid_t pid = fork_reporting(name, churn, c, &in);
    if (read(in, entry, 4) != 4)
        die("churner start", -EPIPE);
    close(in);
    return pid;
}

/* The parent's own traffic: a few sends and receives, each verified. */
struct own {
    uint64_t seed, sent, received, sent_sum, received_sum;
    int bad;
};

static void own_receive(rdv_t *h, struct own *o, int max) {
    char key[64];
    for (int k = 0, got = 0; k < OWN_KEYS && got < max; k++) {
        own_key(key, (int)((o->received + (uint64_t)k) % OWN_KEYS));
        struct rdv_msg_info info;
        int rc = rdv_recv(h, key, strlen(key), 0, &info);
        if (rc == -EAGAIN)
            continue;
        if (rc)
            die("own recv", rc);
        uint64_t sum;
        o->bad |= check_words(&info, &sum) != 0;
        rdv_release_payload(h, info.payload);
        o->received++, got++;
        o->received_sum += sum;
        k--; /* the same key again */
    }
}

static void own_traffic(rdv_t *h, struct own *o) {
    static uint64_t words[OWN_MAX_WORDS];
    char key[64];
    int n = 1 + (int)(rng(&o->seed) % 3);
    for (int i = 0; i < n; i++) {
        uint32_t w = random_words(&o->seed, OWN_MAX_WORDS);
        uint64_t sum = fill_words(words, w, &o->seed);
        own_key(key, (int)(rng(&o->seed) % OWN_KEYS));
        int rc = send_words(h, key, words, w);
        if (rc)
            die("own send", rc);
        o->sent++;
        o->sent_sum += sum;
    }
    own_receive(h, o, o->sent - o->received > 16 ? 8 : 2);
}

static int churn_kill_loop(rdv_t *h, const char *name) {
    pid_t pids[CHURNERS];
    uint32_t entries[CHURNERS];
    for (int c = 0; c < CHURNERS; c++)
        pids[c] = start_churner(name, c, &entries[c]);
    struct own o = {.seed = 4242};
    uint64_t seed = 31337;
    int failed = 0, in_lock = 0;
    for (int k = 0; k < CHURN_KILLS; k++) {
        int c = (int)(rng(&seed) % CHURNERS);
        /* our traffic for a random while, then the kill */
        int64_t until = (int64_t)(rng(&seed) % 3000);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do { /* leaving the churners most of the CPUs */
            own_traffic(h, &o);
            usleep(100);
            clock_gettime(CLOCK_MONOTONIC, &t1);
        } while ((t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000 < until);
        /* the others stopped a moment, so that none of them reclaims the
         * victim before we look at the arena lock (a statistic) */
        for (int i = 0; i < CHURNERS; i++)
            if (i != c)
                kill(pids[i], SIGSTOP);
        kill(pids[c], SIGKILL);
        int status;
        waitpid(pids[c], &status, 0);
        /* relaxed: a statistic; nobody but the stopped churners could change it */
        in_lock += __atomic_load_n(&h->khdr->arena.lock, __ATOMIC_RELAXED) == entries[c] + 1;
        for (int i = 0; i < CHURNERS; i++)
            if (i != c)
                kill(pids[i], SIGCONT);
        if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
            fprintf(stderr, "stress: churn: churner %d ended with status 0x%x\n", c, status);
            failed = 1;
            break;
        }
        pids[c] = start_churner(name, c, &entries[c]);
    }
    for (int c = 0; c < CHURNERS; c++) {
        kill(pids[c], SIGKILL);
        waitpid(pids[c], NULL, 0);
    }
    uint32_t reclaimed = 0;
    rdv_gc(h, &reclaimed);
    /* drain: ours, verified and summed; the churners', verified */
    while (o.received < o.sent) {
        uint64_t before = o.received;
        own_receive(h, &o, OWN_KEYS);
        if (o.received == before)
            break; /* lost */
    }
    own_receive(h, &o, 1); /* nothing more */
    uint64_t leftovers = 0;
    char key[64];
    for (int c = 0; c < CHURNERS; c++)
        for (int k = 0; k < CHURN_KEYS; k++) {
            churn_key(key, c, k);
            struct rdv_msg_info info;
            int rc;
            while ((rc = rdv_recv(h, key, strlen(key), 0, &info)) == 0) {
                uint64_t sum;
                failed |= check_words(&info, &sum) != 0;
                rdv_release_payload(h, info.payload);
                leftovers++;
            }
            failed |= rc != -EAGAIN;
        }
    struct rdv_stats st;
    rdv_stats(h, &st);
    printf("stress: churn: %d kills (%d holding the arena lock), %llu own messages sent, %llu received, "
           "%llu left by churners, %u reclaimed by gc; used %llu in %llu blocks\n",
           CHURN_KILLS, in_lock, (unsigned long long)o.sent, (unsigned long long)o.received,
           (unsigned long long)leftovers, reclaimed, (unsigned long long)st.bytes_used,
           (unsigned long long)st.live_blocks);
    failed |= o.bad || o.sent != o.received || o.sent_sum != o.received_sum;
    failed |= st.bytes_used != 0 || st.live_blocks != 0 || st.pending_messages != 0 || st.keys != 0 ||
              st.keys_counted != 0;
    return failed;
}

/* ---- receivers in line under SIGKILL ----------------------------------- */

static void report(rdv_t *h, int out, const struct rdv_msg_info *info, uint64_t *seed) {
    const uint64_t *w = info->payload;
    uint64_t n = info->nbytes == 32 && w[1] == 3 * w[0] + 1 ? w[0] : 0;
    if (write(out, &n, 8) != 8) /* atomic: below PIPE_BUF */
        _exit(1);
    if (rng(seed) & 1)
        usleep(rng(seed) % 300); /* held a while: a kill now sends it back to its key */
    rdv_release_payload(h, info->payload);
}

static void wait_in_line(const char *name, int unused, int out) {
    (void)unused;
    rdv_t *h = attach(name);
    static const char keys[] = WAIT_KEY_A WAIT_KEY_B;
    const uint32_t lens[2] = {sizeof WAIT_KEY_A - 1, sizeof WAIT_KEY_B - 1};
    for (uint64_t seed = (uint64_t)getpid();;) { /* until killed */
        struct rdv_msg_info info;
        uint32_t waiter = 0, which, refs[8], n;
        int rc, way = (int)(rng(&seed) % 3);
        if (way == 0) {
            rc = rdv_recv_leased(h, WAIT_KEY_A, lens[0], 50000000, &info);
        } else if (way == 1) {
            rc = rdv_recv_any_start(h, keys, lens, 2, 50000000, RDV_RECV_LEASED, &waiter, &which, &info);
            if (waiter && (rc == -ETIMEDOUT || rc == -EINTR))
                rc = rdv_recv_cancel(h, &waiter, RDV_RECV_LEASED, &which, &info) == 1 ? 0 : -EAGAIN;
        } else {
            const char *key = rng(&seed) & 1 ? WAIT_KEY_A : WAIT_KEY_B;
            rc = rdv_recv_start(h, key, strlen(key), 0, RDV_RECV_ASYNC | RDV_RECV_LEASED, &waiter, &info);
            if (rc == -EINPROGRESS) {
                rdv_recv_poll(h, (int64_t)(rng(&seed) % 20000000), refs, 8, &n);
                rc = rdv_recv_wait(h, &waiter, 0, RDV_RECV_LEASED, NULL, &info);
                if (waiter)
                    rc = rdv_recv_cancel(h, &waiter, RDV_RECV_LEASED, NULL, &info) == 1 ? 0 : -EAGAIN;
            }
        }
        if (rc == 0)
            report(h, out, &info, &seed);
        else if (rc != -ETIMEDOUT && rc != -EAGAIN)
            die("receive in line", rc);
    }
}

static pid_t start_waiter(const char *name, int *in) {
    pid_t pid = fork_reporting(name, wait_in_line, 0, in);
    fcntl(*in, F_SETFL, O_NONBLOCK);
    return pid;
}

/* Numbers reported so far on pipe in; 1 if one is out of range. */
static int collect(int in, uint64_t *seen, uint64_t produced) {
    uint64_t n;
    int bad = 0;
    while (read(in, &n, 8) == 8) {
        bad |= n == 0 || n > produced;
        if (!bad)
            seen[n]++;
    }
    return bad;
}

static int waiter_kill_loop(rdv_t *h, const char *name) {
    static uint64_t seen[WAIT_KILLS * WAIT_BATCH + 1];
    pid_t pids[WAITERS];
    int ins[WAITERS], failed = 0;
    uint64_t produced = 0, seed = 4242;
    for (int i = 0; i < WAITERS; i++)
        pids[i] = start_waiter(name, &ins[i]);
    for (int k = 0; k < WAIT_KILLS && !failed; k++) {
        for (int i = 0; i < WAIT_BATCH; i++) {
            ++produced;
            send_number_to(h, produced & 1 ? WAIT_KEY_A : WAIT_KEY_B, produced);
            if (rng(&seed) % 4 == 0)
                usleep(rng(&seed) % 200);
        }
        int c = (int)(rng(&seed) % WAITERS);
        usleep(rng(&seed) % 3000);
        kill(pids[c], SIGKILL);
        int status;
        waitpid(pids[c], &status, 0);
        failed |= !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL;
        failed |= collect(ins[c], seen, produced);
        close(ins[c]);
        pids[c] = start_waiter(name, &ins[c]);
        for (int i = 0; i < WAITERS; i++)
            if (i != c)
                failed |= collect(ins[i], seen, produced);
    }
    usleep(200000); /* the last batch taken, mostly */
    for (int i = 0; i < WAITERS; i++) {
        kill(pids[i], SIGKILL);
        int status;
        waitpid(pids[i], &status, 0);
        failed |= collect(ins[i], seen, produced);
        close(ins[i]);
    }
    rdv_gc(h, NULL);
    uint64_t queued = 0, again = 0;
    struct rdv_msg_info info;
    for (int k = 0; k < 2; k++) {
        const char *key = k ? WAIT_KEY_B : WAIT_KEY_A;
        while (rdv_recv(h, key, strlen(key), 0, &info) == 0) {
            uint64_t n = *(const uint64_t *)info.payload;
            rdv_release_payload(h, info.payload);
            failed |= n == 0 || n > produced;
            if (n && n <= produced)
                seen[n]++;
            queued++;
        }
    }
    uint64_t lost = 0;
    for (uint64_t n = 1; n <= produced; n++) {
        lost += seen[n] == 0;
        again += seen[n] > 1;
    }
    struct rdv_stats st;
    rdv_stats(h, &st);
    printf("stress: waiters: %d kills, %llu messages, %llu still queued, %llu taken again, %llu lost; "
           "waiters %llu, keys %llu, bytes used %llu, waiter bytes %llu\n",
           WAIT_KILLS, (unsigned long long)produced, (unsigned long long)queued,
           (unsigned long long)again, (unsigned long long)lost, (unsigned long long)st.waiters,
           (unsigned long long)st.keys, (unsigned long long)st.bytes_used,
           (unsigned long long)st.waiter_bytes);
    failed |= lost != 0 || again > WAIT_KILLS + WAITERS;
    failed |= st.waiters != 0 || st.keys != 0 || st.bytes_used != 0 || st.waiter_bytes != 0 || st.keys_counted != 0;
    return failed;
}

int main(void) {
    char name[64];
    snprintf(name, sizeof name, "/shmrdv-t-cstress-%d", getpid());
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        die("shm_open", -errno);
    rdv_t *h;
    int rc = rdv_create(fd, 2 << 20, 1024, &h); /* 2 MiB: the ring wraps many times */
    close(fd);
    if (rc)
        die("create", rc);

    int pipes[PRODUCERS + CONSUMERS][2];
    pid_t pids[PRODUCERS + CONSUMERS];
    for (int i = 0; i < PRODUCERS + CONSUMERS; i++) {
        if (pipe(pipes[i]) < 0 || (pids[i] = fork()) < 0)
            die("fork", -errno);
        if (pids[i] == 0) {
            alarm(60); /* never hang */
            uint64_t sum = i < PRODUCERS ? produce(name, i) : consume(name, i - PRODUCERS);
            if (write(pipes[i][1], &sum, 8) != 8)
                _exit(1);
            _exit(0);
        }
        close(pipes[i][1]);
    }
    uint64_t sent = 0, received = 0;
    int failed = 0;
    for (int i = 0; i < PRODUCERS + CONSUMERS; i++) {
        uint64_t sum = 0;
        int status;
        if (read(pipes[i][0], &sum, 8) != 8)
            failed = 1;
        waitpid(pids[i], &status, 0);
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        *(i < PRODUCERS ? &sent : &received) += sum;
    }
    struct rdv_stats st;
    rdv_stats(h, &st);
    printf("stress: %d messages, sent sum %llx, received sum %llx, pending %llu, bytes used %llu\n",
           PRODUCERS * MESSAGES, (unsigned long long)sent, (unsigned long long)received,
           (unsigned long long)st.pending_messages, (unsigned long long)st.bytes_used);
    failed |= st.pending_messages || st.bytes_used || st.keys || st.keys_counted;
    failed |= marked_kill_loop(h, name);
    failed |= leased_kill_loop(h, name);
    failed |= churn_kill_loop(h, name);
    failed |= waiter_kill_loop(h, name);
    rdv_stats(h, &st);
    rdv_close(h);
    shm_unlink(name);
    if (failed || sent != received || st.pending_messages || st.bytes_used || st.keys) {
        fprintf(stderr, "stress: FAILED\n");
        return 1;
    }
    return 0;
}
