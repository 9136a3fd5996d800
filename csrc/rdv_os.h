/* Layer 1: the operating system calls the core makes, each in one place:
 * clocks, futexes, open-file-description byte locks, the CPU we run on,
 * mapping and reserving segment files, random seeds. */
#ifndef RDV_OS_H
#define RDV_OS_H

#include <stddef.h>
#include <stdint.h>

int64_t rdv_now_ns(void);      /* CLOCK_MONOTONIC */
uint64_t rdv_wall_ns(void);    /* CLOCK_REALTIME, for humans */
uint32_t rdv_cpu(void);        /* the CPU this thread runs on now */
uint32_t rdv_cpus(void);       /* CPUs online (at least 1) */
void rdv_yield(void);
/* 1 if more tasks are runnable on the machine than it has CPUs online (a
 * spinner then keeps a CPU from someone who needs it), 0 if not or if it
 * cannot tell. About 4 us: it opens, reads and closes /proc/loadavg. */
int rdv_cpus_oversubscribed(void);
int rdv_pid(void);          /* getpid() */

/* FUTEX_WAIT on a shared word: 0 when woken or the word differs, -ETIMEDOUT,
 * -EINTR. timeout_ns INT64_MAX: no timeout. */
int rdv_futex_wait(uint32_t *kword, uint32_t expected, int64_t timeout_ns);
void rdv_futex_wake_all(uint32_t *kword);

/* Write lock on one byte of fd (an open file description's, F_OFD_*):
 * 0 or -errno; never blocks. */
int rdv_byte_lock(int fd, uint64_t byte);
void rdv_byte_unlock(int fd, uint64_t byte);
/* Whether an open file description other than fd's holds the byte (1 when
 * it cannot tell: never reclaim on a guess). */
int rdv_byte_locked_by_other(int fd, uint64_t byte);
/* The same for any of bytes [first, first + n). */
int rdv_bytes_locked_by_other(int fd, uint64_t first, uint64_t n);

/* Size fd to len bytes and reserve every page (a full /dev/shm fails here,
 * not later with SIGBUS). 0 or -errno. */
int rdv_file_reserve(int fd, uint64_t len);
/* Its two halves: the size, then every page allocated. */
int rdv_file_resize(int fd, uint64_t len);
int rdv_file_allocate(int fd, uint64_t len);
/* fd's size, or -errno. */
int64_t rdv_file_size(int fd);
/* The huge page size of a file on hugetlbfs, whose files are sized,
 * mapped and unmapped in whole huge pages only; 0 for any other file. */
uint64_t rdv_file_huge_page(int fd);
/* Map len bytes of fd at offset 0, shared, read-write. How, in bits:
 * RDV_MAP_FRESH: the file was just reserved and no page of it touched yet
 * (creation), which changes how pages are best faulted in;
 * RDV_MAP_HUGE: advise transparent huge pages (MADV_HUGEPAGE) before any
 * page is faulted in (whether they are huge is up to the kernel and mount);
 * RDV_MAP_NO_PREFAULT (not with RDV_MAP_HUGE): fault nothing in now.
 * Without it every page is faulted in now (best effort): a first touch of a
 * shared page costs ~8x a copy into it, so a mapping that will touch all of
 * it pays once, up front.
 * NULL on failure with *err = -errno. */
#define RDV_MAP_FRESH 1u
#define RDV_MAP_HUGE 2u
#define RDV_MAP_NO_PREFAULT 4u
void *rdv_map(int fd, size_t len, unsigned how, int *err);
/* Map len bytes of fd read-only (to read a header), NULL on failure. */
const void *rdv_map_readonly(int fd, size_t len, int *err);
void rdv_unmap(const void *p, size_t len);
/* fd's file opened again, close-on-exec: a new open file description, whose
 * F_OFD locks are its own (a dup would share fd's), or -errno. */
int rdv_reopen(int fd);
void rdv_close_fd(int fd);
void rdv_random(void *buf, size_t len);
/* Replace [at, at + len) of a mapping with private zero pages, in place.
 * Safe in a signal handler (a raw mmap). 0 or -errno. */
int rdv_map_zeros(void *at, size_t len);
/* Route a SIGBUS fault at an address for which claim(addr) returns 1 to
 * claim, which must make the access work when it is retried; every other
 * SIGBUS goes to the handler installed before (default: the process dies).
 * Installed once per process; later calls only change claim. 0 or -errno. */
int rdv_sigbus_route(int (*claim)(void *addr));

#endif
