/* The machine's cost of moving one cache line between two CPUs and back:
 * two processes, pinned to CPUs 0 and 1, bounce a counter through one
 * shared line, 200,000 times. On a VM the figure tells which placement the
 * two vCPUs have right now (seen: 100-125 ns on most readings, 520-640 ns
 * in phases of seconds to minutes, 50-60 ns now and then), and with it
 * what every shared-memory round trip costs at least.
 *
 *   gcc -O2 -o /tmp/line_pingpong benchmarks/line_pingpong.c && /tmp/line_pingpong
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_timing.h"

#define ROUNDS 200000L

int main(void) {
    /* ping in the first word, pong in another line */
    _Atomic long *line = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (line == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    pid_t child = fork();
    if (child == 0) {
        pin(1);
        for (long i = 1; i <= ROUNDS; i++) {
            while (atomic_load(&line[0]) != i) /* acquire: the ping */
                ;
            atomic_store(&line[8], i); /* release: the pong */
        }
        _exit(0);
    }
    pin(0);
    uint64_t start = now_ns();
    for (long i = 1; i <= ROUNDS; i++) {
        atomic_store(&line[0], i);
        while (atomic_load(&line[8]) != i)
            ;
    }
    printf("cache-line round trip, CPU 0 <-> CPU 1: %.0f ns\n", (double)(now_ns() - start) / ROUNDS);
    waitpid(child, NULL, 0);
    return 0;
}
