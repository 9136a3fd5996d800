/* The C core's own 64 B round trip between two processes, with no Python:
 * rdv_send and rdv_recv on two keys, the parent on CPU 0 and a forked child
 * on CPU 1 ("apart", the default) or on CPU 0 ("same"). What a shmrdv round
 * trip costs below the Python layer, and so what a change of the core's
 * hand-off can win: compare it with `shmrdv bench`'s round trip and with
 * line_pingpong.c's floors, measured in the same minutes.
 *
 * "local": one process, on CPU 0, sends a message and receives it back on
 * one key, again and again: the core's own work for one message (send,
 * receive, release), with no line moved to another CPU. A round trip apart
 * costs about twice this plus the lines its two messages move.
 *
 *   gcc -O2 -std=gnu11 -Icsrc -o /tmp/core_pingpong benchmarks/core_pingpong.c csrc/rdv_*.c -lpthread
 *   /tmp/core_pingpong [round trips] [apart|same|local]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_timing.h"
#include "shmrdv.h"

static const int64_t shape[1] = {16}, strides[1] = {4};

static void check(int rc, const char *what) {
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", what, strerror(-rc));
        exit(1);
    }
}

/* One leg: receive on `in` (copying the payload out, as a reader would),
 * send on `out`; the first side sends before it receives. */
static void leg(rdv_t *h, const char *in, const char *out, int send_first, char *buf) {
    struct rdv_msg_info m;
    if (send_first)
        check(rdv_send(h, out, 4, "<f4", 3, 1, shape, strides, buf, 64, -1), "send");
    check(rdv_recv(h, in, 4, 30000000000LL, &m), "recv");
    memcpy(buf, m.payload, 64);
    check(rdv_release_payload(h, m.payload), "release");
    if (!send_first)
        check(rdv_send(h, out, 4, "<f4", 3, 1, shape, strides, buf, 64, -1), "send");
}

/* Nanoseconds per leg of n sending first (after warmup untimed ones). */
static double timed_legs(rdv_t *h, const char *in, const char *out, long n, long warmup, char *buf) {
    for (long i = 0; i < warmup; i++)
        leg(h, in, out, 1, buf);
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++)
        leg(h, in, out, 1, buf);
    return (double)(now_ns() - t0) / n;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    const char *mode = argc > 2 ? argv[2] : "apart";
    int apart = strcmp(mode, "same") != 0;
    const long warmup = 1000;
    char name[64], buf[64] = {0};
    snprintf(name, sizeof name, "/shmrdv-core-pingpong-%d", (int)getpid());
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        perror("shm_open");
        return 1;
    }
    rdv_t *h;
    int rc = rdv_create(fd, 16 << 20, 1024, &h);
    if (rc < 0) {
        shm_unlink(name);
        check(rc, "rdv_create");
    }
    if (strcmp(mode, "local") == 0) { /* n messages sent and received by one process */
        pin(0);
        double ns = timed_legs(h, "ping", "ping", n, warmup, buf);
        shm_unlink(name);
        printf("core 64 B send + receive + release, one process: %.0f ns (mean of %ld)\n", ns, n);
        return 0;
    }
    pid_t child = fork();
    if (child == 0) {
        pin(apart ? 1 : 0);
        rdv_t *c;
        check(rdv_attach(shm_open(name, O_RDWR, 0), &c), "rdv_attach");
        for (long i = 0; i < n + warmup; i++)
            leg(c, "ping", "pong", 0, buf);
        _exit(0);
    }
    pin(0);
    double ns = timed_legs(h, "pong", "ping", n, warmup, buf);
    int status = 0;
    waitpid(child, &status, 0);
    shm_unlink(name);
    printf("core 64 B round trip, %s: %.0f ns (mean of %ld)\n", apart ? "apart" : "same", ns, n);
    return status != 0;
}
