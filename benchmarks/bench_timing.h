/* What the C benchmarks share: a monotonic clock in nanoseconds and
 * pinning the calling process to one CPU. Include it with _GNU_SOURCE
 * defined first (cpu_set_t). */
#ifndef BENCH_TIMING_H
#define BENCH_TIMING_H

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        perror("sched_setaffinity");
}

#endif
