/* Threads of one process sharing one handle, built with
 * -fsanitize=address,undefined by tests/test_c_core.py (or with
 * -fsanitize=thread by hand: see the test).
 *
 * What a handle keeps per process, its threads share: the pool of waiter
 * records (with its spare record, taken and put back by exchange), the
 * key-count word's one-change-at-a-time spin, the lock-hold counts. PAIRS
 * pairs of threads bounce numbered messages between two keys of their own
 * (each side waits in line, so every message is a hand-off: a record
 * allocated, decided, freed), while LOOPERS threads send to a key of their
 * own and receive from it at once (each message inserts and deletes the
 * key, one count change each). Every message is checked; at the end no
 * key, message, waiter or arena byte may be left, and the key count must
 * agree with the keys. */
#define _GNU_SOURCE
#define UNIT_NAME "threads"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shmrdv.h"
#include "unit_check.h"

#define PAIRS 2
#define LOOPERS 2
#define ROUNDS 20000
#define TIMEOUT_NS 30000000000LL

static rdv_t *h;
static const int64_t shape[1] = {2}, strides[1] = {8};

static void send_number(const char *key, uint64_t a, uint64_t b) {
    uint64_t msg[2] = {a, b};
    int rc = rdv_send(h, key, (uint32_t)strlen(key), "<u8", 3, 1, shape, strides, msg, sizeof msg, TIMEOUT_NS);
    CHECK(rc == 0, "send on %s: %s", key, strerror(-rc));
}

static void recv_number(const char *key, uint64_t a, uint64_t b) {
    struct rdv_msg_info m;
    int rc = rdv_recv(h, key, (uint32_t)strlen(key), TIMEOUT_NS, &m);
    CHECK(rc == 0, "recv on %s: %s", key, strerror(-rc));
    uint64_t got[2];
    CHECK(m.nbytes == sizeof got, "recv on %s: %llu bytes", key, (unsigned long long)m.nbytes);
    memcpy(got, m.payload, sizeof got);
    CHECK(got[0] == a && got[1] == b, "recv on %s: (%llu, %llu), not (%llu, %llu)", key,
          (unsigned long long)got[0], (unsigned long long)got[1], (unsigned long long)a, (unsigned long long)b);
    rc = rdv_release_payload(h, m.payload);
    CHECK(rc == 0, "release on %s: %s", key, strerror(-rc));
}

struct side {
    int pair, first;
};

/* One side of a pair: the first sends before it receives. */
static void *bounce(void *arg) {
    const struct side *s = arg;
    char ping[16], pong[16];
    snprintf(ping, sizeof ping, "ping%d", s->pair);
    snprintf(pong, sizeof pong, "pong%d", s->pair);
    for (uint64_t i = 0; i < ROUNDS; i++) {
        if (s->first) {
            send_number(ping, (uint64_t)s->pair, i);
            recv_number(pong, (uint64_t)s->pair, i);
        } else {
            recv_number(ping, (uint64_t)s->pair, i);
            send_number(pong, (uint64_t)s->pair, i);
        }
    }
    return NULL;
}

static void *loop(void *arg) {
    int me = (int)(intptr_t)arg;
    char key[16];
    snprintf(key, sizeof key, "loop%d", me);
    for (uint64_t i = 0; i < ROUNDS; i++) {
        send_number(key, 1000u + (uint64_t)me, i);
        recv_number(key, 1000u + (uint64_t)me, i);
    }
    return NULL;
}

int main(void) {
    int fd = memfd_create("shmrdv-threads", MFD_CLOEXEC);
    CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
    int rc = rdv_create(fd, 1 << 20, 256, &h);
    CHECK(rc == 0, "rdv_create: %s", strerror(-rc));
    close(fd);

    phase = "threads";
    pthread_t t[2 * PAIRS + LOOPERS];
    struct side sides[2 * PAIRS];
    int n = 0;
    for (int p = 0; p < PAIRS; p++)
        for (int first = 0; first < 2; first++) {
            sides[2 * p + first] = (struct side){p, first};
            CHECK(pthread_create(&t[n++], NULL, bounce, &sides[2 * p + first]) == 0, "pthread_create");
        }
    for (int i = 0; i < LOOPERS; i++)
        CHECK(pthread_create(&t[n++], NULL, loop, (void *)(intptr_t)i) == 0, "pthread_create");
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    printf(UNIT_NAME ": %d pairs and %d loopers, %d messages each: ok\n", PAIRS, LOOPERS, ROUNDS);

    phase = "empty";
    struct rdv_stats st;
    rc = rdv_stats(h, &st);
    CHECK(rc == 0, "rdv_stats: %s", strerror(-rc));
    CHECK(st.keys == 0 && st.keys_counted == 0, "keys left: %llu (counted %llu)", (unsigned long long)st.keys,
          (unsigned long long)st.keys_counted);
    CHECK(st.pending_messages == 0 && st.waiters == 0, "left: %llu messages, %llu waiters",
          (unsigned long long)st.pending_messages, (unsigned long long)st.waiters);
    printf(UNIT_NAME ": nothing left: ok\n");
    rdv_close(h);
    printf(UNIT_NAME ": all passed\n");
    return 0;
}
