/* Layer 1: the operating system calls (see rdv_os.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "rdv_atomic.h"
#include "rdv_os.h"

int64_t rdv_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

uint64_t rdv_wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint32_t rdv_cpu(void) {
    int cpu = sched_getcpu();
    return cpu < 0 ? 0 : (uint32_t)cpu;
}

uint32_t rdv_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (uint32_t)n;
}

void rdv_yield(void) { sched_yield(); }

/* CPUs online, read at the first look: sysconf reads sysfs, too slow for
 * every look (a CPU brought online later is not seen). */
static uint32_t cpus_online;

int rdv_cpus_oversubscribed(void) {
    uint32_t cpus = READ_ONCE(cpus_online); /* relaxed: a process-local cache; a race writes the same value */
    if (cpus == 0)
        WRITE_ONCE(cpus_online, cpus = rdv_cpus());
    /* Opened at each look, not kept: about 4 us, paid only by a spin that
     * has gone on for a while, and no fd of ours for a program to trip
     * over (an fd counted as leaked, or closed behind us and reused). */
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    /* "0.12 0.12 0.05 3/83 15855": the fourth field is runnable/all tasks */
    char buf[128];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *p = buf;
    for (int field = 0; field < 3; field++) {
        while (*p && *p != ' ')
            p++;
        if (*p)
            p++;
    }
    unsigned long running = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 9; p++, digits++)
        running = running * 10 + (unsigned long)(*p - '0');
    return digits && *p == '/' && running > cpus;
}

int rdv_pid(void) { return getpid(); }

int rdv_futex_wait(uint32_t *kword, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts, *tsp = NULL;
    if (timeout_ns != INT64_MAX) {
        ts.tv_sec = timeout_ns / 1000000000;
        ts.tv_nsec = timeout_ns % 1000000000;
        tsp = &ts;
    }
    /* shared, not FUTEX_PRIVATE: the waker is another process */
    long rc = syscall(SYS_futex, kword, FUTEX_WAIT, expected, tsp, NULL, 0);
    if (rc == 0 || errno == EAGAIN)
        return 0;
    return -errno; /* ETIMEDOUT or EINTR */
}

void rdv_futex_wake_all(uint32_t *kword) {
    syscall(SYS_futex, kword, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static struct flock byte_range(uint64_t byte, short type) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)byte;
    fl.l_len = 1;
    return fl;
}

int rdv_bytes_locked_by_other(int fd, uint64_t first, uint64_t n) {
    struct flock fl = byte_range(first, F_WRLCK);
    fl.l_len = (off_t)n;
    if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
        return 1;
    return fl.l_type != F_UNLCK;
}

int rdv_byte_lock(int fd, uint64_t byte) {
    struct flock fl = byte_range(byte, F_WRLCK);
    return fcntl(fd, F_OFD_SETLK, &fl) < 0 ? -errno : 0;
}

void rdv_byte_unlock(int fd, uint64_t byte) {
    struct flock fl = byte_range(byte, F_UNLCK);
    fcntl(fd, F_OFD_SETLK, &fl);
}

int rdv_byte_locked_by_other(int fd, uint64_t byte) { return rdv_bytes_locked_by_other(fd, byte, 1); }

int rdv_file_resize(int fd, uint64_t len) { return ftruncate(fd, (off_t)len) < 0 ? -errno : 0; }

int rdv_file_allocate(int fd, uint64_t len) {
    int err = posix_fallocate(fd, 0, (off_t)len);
    return err ? -err : 0;
}

int rdv_file_reserve(int fd, uint64_t len) {
    int rc = rdv_file_resize(fd, len);
    return rc < 0 ? rc : rdv_file_allocate(fd, len);
}

int64_t rdv_file_size(int fd) {
    struct stat st;
    return fstat(fd, &st) < 0 ? -errno : (int64_t)st.st_size;
}

#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6 /* linux/magic.h */
#endif

uint64_t rdv_file_huge_page(int fd) {
    struct statfs fs;
    if (fstatfs(fd, &fs) < 0 || fs.f_type != HUGETLBFS_MAGIC || fs.f_bsize <= 0)
        return 0;
    return (uint64_t)fs.f_bsize;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* A mapping that asks for huge pages: the advice must come before any page
 * is faulted in (so no MAP_POPULATE), then the pages are populated as below,
 * best effort (always: faulting them in as advised is what makes them huge).
 * A kernel without transparent huge pages refuses the advice. */
static void *map_huge(int fd, size_t len, unsigned how, int *err) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        *err = -errno;
        return NULL;
    }
    if (madvise(p, len, MADV_HUGEPAGE) < 0) {
        *err = errno == EINVAL ? -EOPNOTSUPP : -errno;
        munmap(p, len);
        return NULL;
    }
    (void)madvise(p, len, how & RDV_MAP_FRESH ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
    return p;
}

void *rdv_map(int fd, size_t len, unsigned how, int *err) {
    if (how & RDV_MAP_HUGE)
        return map_huge(fd, len, how, err);
    int fresh = (how & RDV_MAP_FRESH) != 0, no_prefault = (how & RDV_MAP_NO_PREFAULT) != 0;
    /* Which way of faulting every page in is fastest depends on the pages
     * (measured on 1-4 GiB, benchmarks/test_bench_open.py): pages just
     * reserved and never touched fault one at a time, and MADV_POPULATE_WRITE
     * maps them ~30% faster than MAP_POPULATE's read faults; pages in use
     * (an attach) are mapped 16 at a time by a read fault's fault-around, 2x
     * faster than write faults. Best effort, as MAP_POPULATE is: the pages
     * are reserved (rdv_file_reserve), so a populate that fails only defers
     * faults. A kernel without MADV_POPULATE_WRITE (EINVAL) gets MAP_POPULATE. */
    int flags = MAP_SHARED | (fresh || no_prefault ? 0 : MAP_POPULATE);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (p == MAP_FAILED) {
        *err = -errno;
        return NULL;
    }
    if (fresh && !no_prefault && madvise(p, len, MADV_POPULATE_WRITE) < 0 && errno == EINVAL) {
        munmap(p, len);
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (p == MAP_FAILED) {
            *err = -errno;
            return NULL;
        }
    }
    return p;
}

const void *rdv_map_readonly(int fd, size_t len, int *err) {
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        *err = -errno;
        return NULL;
    }
    return p;
}

void rdv_unmap(const void *p, size_t len) { munmap((void *)p, len); }

int rdv_reopen(int fd) {
    /* A new open file description needs an open(); /proc/self/fd reaches the
     * very file fd names, even unlinked, and no other one (checked below). */
    char path[40];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int d = open(path, O_RDWR | O_CLOEXEC);
    if (d < 0 && errno == ENOENT) {
        /* No /proc mounted: a duplicate, sharing fd's description (a fork
         * child's inherited copy then keeps our locks until it closes it) */
        d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        return d < 0 ? -errno : d;
    }
    if (d < 0)
        return -errno;
    struct stat a, b;
    if (fstat(fd, &a) < 0 || fstat(d, &b) < 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        close(d);
        return -ESTALE;
    }
    return d;
}

void rdv_close_fd(int fd) { close(fd); }

void rdv_random(void *buf, size_t len) {
    if (getrandom(buf, len, 0) == (ssize_t)len)
        return;
    uint64_t x = (uint64_t)rdv_now_ns() ^ ((uint64_t)getpid() << 32); /* no entropy source: still distinct */
    for (size_t i = 0; i < len; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        ((uint8_t *)buf)[i] = (uint8_t)(x >> 56);
    }
}

int rdv_map_zeros(void *at, size_t len) {
    void *p = mmap(at, len, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? -errno : 0;
}

/* ---- SIGBUS: a mapped file that shrank under us ------------------------------ */

static int (*sigbus_claim)(void *addr);
static struct sigaction sigbus_before;
static int sigbus_installed;

static void on_sigbus(int sig, siginfo_t *si, void *ctx) {
    int saved_errno = errno; /* the interrupted code's */
    /* relaxed: set before the handler was installed, or a newer claim */
    int (*claim)(void *) = READ_ONCE(sigbus_claim);
    /* BUS_ADRERR: an access past the end of a mapped file (not a memory
     * error, not a kill(): si_addr is real) */
    if (si->si_code == BUS_ADRERR && claim && claim(si->si_addr)) {
        errno = saved_errno;
        return; /* the access is retried and succeeds */
    }
    if (sigbus_before.sa_flags & SA_SIGINFO) {
        sigbus_before.sa_sigaction(sig, si, ctx);
    } else if (sigbus_before.sa_handler == SIG_DFL || sigbus_before.sa_handler == SIG_IGN) {
        /* The default action: a fault repeats on return and kills us then;
         * a SIGBUS sent by kill() has to be raised again. */
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        sigaction(SIGBUS, &dfl, NULL);
        if (si->si_code <= 0)
            raise(sig);
    } else {
        sigbus_before.sa_handler(sig);
    }
}

int rdv_sigbus_route(int (*claim)(void *addr)) {
    WRITE_ONCE(sigbus_claim, claim); /* relaxed: read by the handler, see there */
    /* acq_rel, process-local: one caller installs; another that returns
     * before the install completes maps a segment unprotected for a moment */
    if (rdv_exchange(&sigbus_installed, 1, __ATOMIC_ACQ_REL))
        return 0;
    struct sigaction ours = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART};
    sigemptyset(&ours.sa_mask);
    return sigaction(SIGBUS, &ours, &sigbus_before) < 0 ? -errno : 0;
}
