/* Threads of one process sharing one handle, built by tests/c/test_c_core.py
 * under AddressSanitizer and UBSan and under ThreadSanitizer.
 *
 * What a handle keeps per process, its threads share: the pool of waiter
 * records (with its spare record, taken and put back by exchange), the
 * key-count word's one-change-at-a-time turns, the lock-hold counts.
 * PAIRS pairs of threads bounce numbered messages between two keys of
 * their own (a receive that starts before its message is a hand-off: a
 * record allocated, decided, freed); a pair whose receiver takes from two
 * keys at once (rdv_recv_any_start: two records a wait, freed together)
 * acknowledges each message; an async receiver (RDV_RECV_ASYNC) learns from
 * rdv_recv_poll, which looks at every record of the handle's while the
 * other threads set theirs up, that it was served; LOOPERS threads send to a key of their own
 * and receive from it at once (each message inserts and deletes the key,
 * one count change each). Every message is checked; at the end no key,
 * message, waiter, message byte, waiter slab or lock hold may be left
 * (a record lost by the pool would make the handle take slabs from the
 * arena once its home slab's 62 were gone), and the key count must agree
 * with the keys. There are more threads than lock-hold slots (rdv_lock.c):
 * some count in a word of their own, the rest in the shared one; those of
 * the next phase take the slots that exiting threads gave back. Then the same loopers on a rendezvous whose max_keys is
 * half their number: sends refused for it (-ENOSPC) are retried, and the
 * count must still come back to 0 (inserts near the limit sum the count
 * under keys_lock, undoing and redoing their change around the wait). */
#define _GNU_SOURCE
#define UNIT_NAME "threads"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rdv_handle.h" /* shmrdv.h, and the process entry's lock counts */
#include "unit_check.h"

#define PAIRS 2
#define LOOPERS 2
#define SQUEEZED 4 /* loopers on the rendezvous with max_keys SQUEEZED / 2 */
#define ROUNDS 20000
#define TIMEOUT_NS 30000000000LL
_Static_assert(2 * PAIRS + 4 + LOOPERS > RDV_HOLD_SLOTS, "more threads than lock-hold slots");

static rdv_t *h;
static _Atomic long refused; /* sends the squeezed rendezvous refused for max_keys */
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

/* The sending side of the any pair: a message on "anyA" or "anyB" in
 * turn, then wait for its acknowledgement. */
static void *any_sender(void *arg) {
    (void)arg;
    for (uint64_t i = 0; i < ROUNDS; i++) {
        send_number(i % 2 ? "anyB" : "anyA", 77, i);
        recv_number("anyack", 78, i);
    }
    return NULL;
}

static void *any_receiver(void *arg) {
    (void)arg;
    const uint32_t lens[2] = {4, 4};
    for (uint64_t i = 0; i < ROUNDS; i++) {
        struct rdv_msg_info m;
        uint32_t waiter = 0, which = 99;
        int rc = rdv_recv_any_start(h, "anyAanyB", lens, 2, TIMEOUT_NS, 0, &waiter, &which, &m);
        CHECK(rc == 0 && waiter == 0, "recv_any: %s", strerror(-rc));
        CHECK(which == i % 2, "recv_any: message %llu from key %u", (unsigned long long)i, which);
        uint64_t got[2];
        memcpy(got, m.payload, sizeof got);
        CHECK(got[0] == 77 && got[1] == i, "recv_any: (%llu, %llu), not (77, %llu)", (unsigned long long)got[0],
              (unsigned long long)got[1], (unsigned long long)i);
        CHECK(rdv_release_payload(h, m.payload) == 0, "release after recv_any");
        send_number("anyack", 78, i);
    }
    return NULL;
}

/* The async pair: the receiver lines up with RDV_RECV_ASYNC, learns from
 * rdv_recv_poll that a send served it (the poll looks at every record of
 * ours, while the other threads set theirs up) and takes the message. */
static void *async_sender(void *arg) {
    (void)arg;
    for (uint64_t i = 0; i < ROUNDS; i++) {
        recv_number("asyncready", 88, i); /* the receiver is in line */
        send_number("async", 87, i);
    }
    return NULL;
}

static void *async_receiver(void *arg) {
    (void)arg;
    for (uint64_t i = 0; i < ROUNDS; i++) {
        struct rdv_msg_info m;
        uint32_t waiter = 0, served[4], n = 0;
        int rc = rdv_recv_start(h, "async", 5, TIMEOUT_NS, RDV_RECV_ASYNC, &waiter, &m);
        CHECK(rc == -EINPROGRESS && waiter != 0, "async start: %s", strerror(-rc));
        send_number("asyncready", 88, i);
        do {
            rc = rdv_recv_poll(h, TIMEOUT_NS, served, 4, &n);
            /* a signal (ThreadSanitizer sends its own) ends a wait early: look again */
            CHECK(rc == 0 || rc == -ETIMEDOUT || rc == -EINTR, "poll: %s", strerror(-rc));
        } while (n == 0);
        CHECK(n == 1 && served[0] == waiter, "poll: %u served, not our one waiter", n);
        rc = rdv_recv_wait(h, &waiter, 0, 0, NULL, &m);
        CHECK(rc == 0 && waiter == 0, "async take: %s", strerror(-rc));
        uint64_t got[2];
        memcpy(got, m.payload, sizeof got);
        CHECK(got[0] == 87 && got[1] == i, "async: (%llu, %llu), not (87, %llu)", (unsigned long long)got[0],
              (unsigned long long)got[1], (unsigned long long)i);
        CHECK(rdv_release_payload(h, m.payload) == 0, "release after async");
    }
    return NULL;
}

static void *loop(void *arg) {
    int me = (int)(intptr_t)arg;
    char key[16];
    snprintf(key, sizeof key, "loop%d", me);
    uint64_t msg[2] = {1000u + (uint64_t)me, 0};
    for (uint64_t i = 0; i < ROUNDS; i++) {
        msg[1] = i;
        int rc;
        while ((rc = rdv_send(h, key, (uint32_t)strlen(key), "<u8", 3, 1, shape, strides, msg, sizeof msg,
                              TIMEOUT_NS)) == -ENOSPC) {
            refused++; /* every key in use: on the squeezed rendezvous only */
            sched_yield();
        }
        CHECK(rc == 0, "send on %s: %s", key, strerror(-rc));
        recv_number(key, msg[0], i);
    }
    return NULL;
}

/* Nothing left on h: no key (counted or not), message, waiter, message
 * byte or waiter slab. */
static void check_empty(void) {
    struct rdv_stats st;
    int rc = rdv_stats(h, &st);
    CHECK(rc == 0, "rdv_stats: %s", strerror(-rc));
    CHECK(st.keys == 0 && st.keys_counted == 0, "keys left: %llu (counted %llu)", (unsigned long long)st.keys,
          (unsigned long long)st.keys_counted);
    CHECK(st.pending_messages == 0 && st.waiters == 0, "left: %llu messages, %llu waiters",
          (unsigned long long)st.pending_messages, (unsigned long long)st.waiters);
    CHECK(st.bytes_used == 0 && st.waiter_bytes == 0, "left: %llu message bytes, %llu bytes of waiter slabs",
          (unsigned long long)st.bytes_used, (unsigned long long)st.waiter_bytes);
    /* More threads than slots counted their holds: those with a slot in
     * their words, the rest in locks_held; every count back at 0 */
    const struct rdv_proc *p = &h->kprocs[h->me];
    CHECK(p->locks_held == 0, "lock holds left in the shared word: %u", p->locks_held);
    for (int i = 0; i < RDV_HOLD_SLOTS; i++)
        CHECK(p->thread_holds[i] == 0, "lock holds left in thread slot %d: %u", i, p->thread_holds[i]);
}

static rdv_t *create(uint64_t max_keys) {
    int fd = memfd_create("shmrdv-threads", MFD_CLOEXEC);
    CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
    rdv_t *out;
    int rc = rdv_create(fd, 1 << 20, max_keys, &out);
    CHECK(rc == 0, "rdv_create: %s", strerror(-rc));
    close(fd);
    return out;
}

int main(void) {
    h = create(256);
    phase = "threads";
    pthread_t t[2 * PAIRS + 4 + SQUEEZED];
    struct side sides[2 * PAIRS];
    int n = 0;
    for (int p = 0; p < PAIRS; p++)
        for (int first = 0; first < 2; first++) {
            sides[2 * p + first] = (struct side){p, first};
            CHECK(pthread_create(&t[n++], NULL, bounce, &sides[2 * p + first]) == 0, "pthread_create");
        }
    CHECK(pthread_create(&t[n++], NULL, any_sender, NULL) == 0, "pthread_create");
    CHECK(pthread_create(&t[n++], NULL, any_receiver, NULL) == 0, "pthread_create");
    CHECK(pthread_create(&t[n++], NULL, async_sender, NULL) == 0, "pthread_create");
    CHECK(pthread_create(&t[n++], NULL, async_receiver, NULL) == 0, "pthread_create");
    for (int i = 0; i < LOOPERS; i++)
        CHECK(pthread_create(&t[n++], NULL, loop, (void *)(intptr_t)i) == 0, "pthread_create");
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    printf(UNIT_NAME ": %d pairs, an any pair, an async pair and %d loopers, %d messages each: ok\n", PAIRS, LOOPERS,
           ROUNDS);
    phase = "empty";
    check_empty();
    printf(UNIT_NAME ": nothing left: ok\n");
    rdv_close(h);

    phase = "squeezed";
    h = create(SQUEEZED / 2);
    for (int i = 0; i < SQUEEZED; i++)
        CHECK(pthread_create(&t[i], NULL, loop, (void *)(intptr_t)i) == 0, "pthread_create");
    for (int i = 0; i < SQUEEZED; i++)
        pthread_join(t[i], NULL);
    check_empty();
    printf(UNIT_NAME ": %d loopers on max_keys %d, %d messages each, %ld sends refused and retried: ok\n",
           SQUEEZED, SQUEEZED / 2, ROUNDS, (long)refused);
    rdv_close(h);
    printf(UNIT_NAME ": all passed\n");
    return 0;
}
