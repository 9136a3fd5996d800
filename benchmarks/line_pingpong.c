/* The machine's cost of moving cache lines between two CPUs and back:
 * two processes, pinned to CPUs 0 and 1, 200,000 round trips.
 *
 * Default: a counter bounced through one shared line. On a VM the figure
 * tells which placement the two vCPUs have right now (seen: 100-125 ns on
 * most readings, 520-640 ns in phases of seconds to minutes, 50-60 ns now
 * and then), and with it what every shared-memory round trip costs at least.
 *
 * "message": a 64 B message each way through a mailbox of two lines (the
 * payload, then a sequence number the reader polls), copied in and out, as
 * a shared-memory transport with nothing else to do would move it (Open
 * MPI's fastbox is of this kind): the floor of any 64 B round trip through
 * shared memory, to set beside core_pingpong.c's. Its pages are faulted in
 * fresh each run, like a new segment's.
 *
 *   gcc -O2 -o /tmp/line_pingpong benchmarks/line_pingpong.c && /tmp/line_pingpong [message]
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_timing.h"

#define ROUNDS 200000L

/* One direction of the message mode, on lines of its own. */
struct mailbox {
    char payload[64];
    _Atomic long seq; /* the round the payload is for: published last */
    char pad[56];
};

static void put(struct mailbox *box, const char *msg, long round) {
    memcpy(box->payload, msg, sizeof box->payload);
    atomic_store(&box->seq, round); /* release (seq_cst): the payload before the number */
}

static void get(struct mailbox *box, char *msg, long round) {
    while (atomic_load(&box->seq) != round) /* acquire: pairs with put's store */
        ;
    memcpy(msg, box->payload, sizeof box->payload);
}

int main(int argc, char **argv) {
    int message = argc > 1 && strcmp(argv[1], "message") == 0;
    /* counter mode: ping in the first word, pong in another line; message
     * mode: a mailbox each way, the second on the next page */
    _Atomic long *line = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (line == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    struct mailbox *ping = (struct mailbox *)line, *pong = (struct mailbox *)((char *)line + 4096);
    char msg[64] = {0};
    pid_t child = fork();
    if (child == 0) {
        pin(1);
        for (long i = 1; i <= ROUNDS; i++) {
            if (message) {
                get(ping, msg, i);
                put(pong, msg, i);
                continue;
            }
            while (atomic_load(&line[0]) != i) /* acquire: the ping */
                ;
            atomic_store(&line[8], i); /* release: the pong */
        }
        _exit(0);
    }
    pin(0);
    uint64_t start = now_ns();
    for (long i = 1; i <= ROUNDS; i++) {
        if (message) {
            put(ping, msg, i);
            get(pong, msg, i);
            continue;
        }
        atomic_store(&line[0], i);
        while (atomic_load(&line[8]) != i)
            ;
    }
    uint64_t elapsed = now_ns() - start;
    if (message)
        printf("64 B message round trip through two-line mailboxes, CPU 0 <-> CPU 1: %.0f ns\n",
               (double)elapsed / ROUNDS);
    else
        printf("cache-line round trip, CPU 0 <-> CPU 1: %.0f ns\n", (double)elapsed / ROUNDS);
    waitpid(child, NULL, 0);
    return 0;
}
