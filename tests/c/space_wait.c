/* Producers waiting for arena space are woken by every free that makes room:
 * no lost wake-ups. Built with -fsanitize=address,undefined by
 * tests/core/test_space_wait.py.
 *
 * The arena holds exactly SLOTS blocks of one size. PRODUCERS processes send
 * MESSAGES messages each with no timeout at all (a lost wake-up hangs them
 * rather than being covered by a later retry). The parent receives until it
 * holds SLOTS views (the arena is full, every producer blocked), then, round
 * after round, releases one to three held views chosen at random (so space
 * is freed in any order, between blocks still held) and expects exactly as
 * many messages, each within ROUND_TIMEOUT_NS. Sometimes it first takes a
 * freed slot itself with rdv_send_begin and discards it a while later: then
 * only the discard makes room.
 * Before each release it waits a random while, none to a few milliseconds,
 * so that a release finds the producers anywhere: in their attempt,
 * spinning, asleep. Every payload names its producer and sequence number
 * and is checked. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shmrdv.h"

#define PRODUCERS 3
#define MESSAGES 400
#define SLOTS 8
#define ARENA (1u << 20)
#define META 128 /* message header, shape, strides, key and position: one block */
#define KEY "space"
#define ROUND_TIMEOUT_NS (10LL * 1000000000)

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static pid_t producers[PRODUCERS]; /* in the parent: killed if it fails */

static void die(rdv_t *h, const char *what, int rc) {
    fprintf(stderr, "space_wait: %s failed: %d (%s)\n", what, rc, strerror(-rc));
    for (int i = 0; i < PRODUCERS; i++)
        if (producers[i] > 0)
            kill(producers[i], SIGKILL); /* they wait with no timeout */
    struct rdv_stats st;
    if (h && rdv_stats(h, &st) == 0)
        fprintf(stderr, "space_wait: pending %llu, used %llu of %llu\n",
                (unsigned long long)st.pending_messages, (unsigned long long)st.bytes_used,
                (unsigned long long)st.capacity);
    exit(1);
}

static const uint64_t WORDS = (ARENA / SLOTS - META) / 8; /* payload fills its block */

static void produce(const char *name, uint64_t id) {
    int fd = shm_open(name, O_RDWR, 0);
    rdv_t *h;
    int rc = fd < 0 ? -errno : rdv_attach(fd, &h);
    if (rc)
        die(NULL, "attach", rc);
    close(fd);
    uint64_t *words = malloc(8 * WORDS);
    for (uint64_t i = 0; i < MESSAGES; i++) {
        for (uint64_t j = 0; j < WORDS; j++)
            words[j] = id << 48 | i << 24 | j;
        int64_t shape[1] = {(int64_t)WORDS}, strides[1] = {8};
        rc = rdv_send(h, KEY, strlen(KEY), "<u8", 3, 1, shape, strides, words, 8 * WORDS, -1);
        if (rc)
            die(h, "send", rc);
    }
    free(words);
    rdv_close(h);
}

/* Receive one message and check it; the producers' sequence numbers must
 * come in order, each producer's own. */
static void *take(rdv_t *h, uint64_t *next_seq, int64_t timeout_ns) {
    struct rdv_msg_info info;
    int rc = rdv_recv(h, KEY, strlen(KEY), timeout_ns, &info);
    if (rc == -ETIMEDOUT)
        die(h, "a release that made room woke no producer (lost wake-up): recv", rc);
    if (rc)
        die(h, "recv", rc);
    const uint64_t *w = info.payload;
    uint64_t id = w[0] >> 48, seq = w[0] >> 24 & 0xffffff;
    if (info.nbytes != 8 * WORDS || id >= PRODUCERS || seq != next_seq[id])
        die(h, "message identity", -EBADMSG);
    for (uint64_t j = 0; j < WORDS; j += 997)
        if (w[j] != (id << 48 | seq << 24 | j))
            die(h, "payload", -EBADMSG);
    next_seq[id]++;
    return info.payload;
}

static void pause_a_while(uint64_t *seed) {
    uint64_t r = rng(seed) % 4;
    if (r == 1) { /* a few microseconds: the producers are attempting or spinning */
        for (volatile int i = 0; i < (int)(rng(seed) % 20000); i++)
            ;
    } else if (r >= 2) { /* long enough for them to sleep */
        struct timespec ts = {0, (long)(100000 + rng(seed) % 3000000)};
        nanosleep(&ts, NULL);
    }
}

int main(void) {
    char name[64];
    snprintf(name, sizeof name, "/shmrdv-t-cspace-%d", getpid());
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        die(NULL, "shm_open", -errno);
    rdv_t *h;
    int rc = rdv_create(fd, ARENA, 64, &h);
    close(fd);
    if (rc)
        die(NULL, "create", rc);
    if (rdv_capacity(h) != ARENA)
        die(h, "capacity", -EINVAL);

    for (uint64_t i = 0; i < PRODUCERS; i++) {
        pid_t pid = fork();
        if (pid < 0)
            die(h, "fork", -errno);
        if (pid == 0) {
            memset(producers, 0, sizeof producers); /* a producer kills none */
            alarm(120); /* never hang */
            produce(name, i);
            _exit(0);
        }
        producers[i] = pid;
    }
    alarm(120);
    uint64_t next_seq[PRODUCERS] = {0}, seed = 0x5eed;
    void *held[SLOTS];
    for (int i = 0; i < SLOTS; i++)
        held[i] = take(h, next_seq, ROUND_TIMEOUT_NS);
    uint64_t writes = 0;
    for (int left = PRODUCERS * MESSAGES - SLOTS; left > 0;) {
        int k = 1 + (int)(rng(&seed) % 3);
        k = k < left ? k : left;
        pause_a_while(&seed);
        for (int i = 0; i < k; i++) {
            int slot = (int)(rng(&seed) % SLOTS);
            while (!held[slot])
                slot = (slot + 1) % SLOTS;
            if ((rc = rdv_release_payload(h, held[slot])))
                die(h, "release", rc);
            held[slot] = NULL;
        }
        uint64_t pos;
        void *payload;
        int64_t shape[1] = {(int64_t)WORDS}, strides[1] = {8};
        if (k == 1 && rng(&seed) % 3 == 0 &&
            rdv_send_begin(h, "mine", 4, "<u8", 3, 1, shape, strides, 8 * WORDS, 0, &pos,
                           &payload) == 0) {
            writes++; /* we won the freed slot: no message until we give it back */
            pause_a_while(&seed);
            if ((rc = rdv_send_discard(h, pos)))
                die(h, "discard", rc);
            rdv_unref(h);
        }
        for (int i = 0; i < SLOTS && k > 0; i++)
            if (!held[i]) {
                held[i] = take(h, next_seq, ROUND_TIMEOUT_NS);
                k--, left--;
            }
    }
    for (int i = 0; i < SLOTS; i++)
        rdv_release_payload(h, held[i]);

    int failed = 0;
    for (int i = 0; i < PRODUCERS; i++) {
        int status;
        waitpid(producers[i], &status, 0);
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        failed |= next_seq[i] != MESSAGES;
    }
    struct rdv_stats st;
    rdv_stats(h, &st);
    printf("space_wait: %d messages through %d slots (%llu taken back by the parent), "
           "pending %llu, bytes used %llu\n",
           PRODUCERS * MESSAGES, SLOTS, (unsigned long long)writes,
           (unsigned long long)st.pending_messages,
           (unsigned long long)st.bytes_used);
    failed |= st.pending_messages || st.bytes_used;
    rdv_close(h);
    shm_unlink(name);
    if (failed) {
        fprintf(stderr, "space_wait: FAILED\n");
        return 1;
    }
    return 0;
}
