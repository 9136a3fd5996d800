/* Unit test of a spin's clock (rdv_spin.h) over rdv_os.c alone: with more
 * busy tasks than CPUs, rdv_cpus_oversubscribed says so and a spin past its
 * free window ends crowded, not on its budget; a spin shorter than the free
 * window never reads the load; on a machine with a CPU to spare a spin runs
 * to its budget; no fd is kept open between looks. The busy children die with this program (PDEATHSIG) or after 60 s
 * (alarm), whichever is first. */
#define UNIT_NAME "unit_spin"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rdv_atomic.h"
#include "rdv_os.h"
#include "rdv_spin.h"
#include "unit_check.h"

/* Spin through rounds of pauses, as the core's waits do, until the clock
 * says stop: 1 if it stopped crowded. */
static int spin_until_stopped(int64_t budget_ns) {
    struct rdv_spin s;
    rdv_spin_begin(&s, rdv_now_ns());
    do {
        for (int i = 0; i < RDV_SPIN_CHECK_EVERY; i++)
            rdv_cpu_relax();
    } while (rdv_spin_on(&s, budget_ns));
    return s.crowded;
}

static pid_t *start_hogs(int n) {
    pid_t parent = getpid(), *pids = calloc((size_t)n, sizeof *pids);
    CHECK(pids, "out of memory");
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        CHECK(pids[i] >= 0, "fork failed");
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) /* the parent died before the line above */
                _exit(0);
            int null = open("/dev/null", O_WRONLY); /* not the test's pipes: they end with the parent */
            dup2(null, 1);
            dup2(null, 2);
            alarm(60);
            for (;;)
                rdv_cpu_relax();
        }
    }
    return pids;
}

/* The fd this process holds on /proc/loadavg, or -1. */
static int loadavg_fd_number(void) {
    DIR *dir = opendir("/proc/self/fd");
    CHECK(dir, "cannot list /proc/self/fd");
    int found = -1;
    for (struct dirent *e; (e = readdir(dir)) != NULL && found < 0;) {
        char path[300], target[64];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n > 0 && (target[n] = 0, strcmp(target, "/proc/loadavg") == 0))
            found = atoi(e->d_name);
    }
    closedir(dir);
    return found;
}

static void stop_hogs(pid_t *pids, int n) {
    for (int i = 0; i < n; i++)
        kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++)
        waitpid(pids[i], NULL, 0);
    free(pids);
}

/* A machine with a CPU to spare, at least once in ~20 s of looks (other
 * tasks may crowd it for a while). */
static int seen_spare(void) {
    for (int tries = 0; tries < 2000; tries++) {
        if (!rdv_cpus_oversubscribed())
            return 1;
        usleep(10000);
    }
    return 0;
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);

    phase = "crowded";
    int n = (int)rdv_cpus() + 2;
    pid_t *pids = start_hogs(n);
    int seen = 0;
    for (int tries = 0; tries < 500 && !seen; tries++) { /* up to ~5 s for the hogs to run */
        seen = rdv_cpus_oversubscribed();
        if (!seen)
            usleep(10000);
    }
    CHECK(seen, "%d busy tasks on %u CPUs, and rdv_cpus_oversubscribed never said so", n, rdv_cpus());
    /* A 10 s budget: only a crowded machine ends this spin soon, and not
     * before its free window (the first look is due then). */
    int64_t t0 = rdv_now_ns();
    CHECK(spin_until_stopped(10LL * 1000 * 1000 * 1000), "a spin on a crowded machine was not cut short");
    CHECK(rdv_now_ns() - t0 >= RDV_SPIN_FREE_NS, "a spin was cut short within its free window");
    /* Within the free window the load is never read: every spin runs out its budget. */
    for (int i = 0; i < 1000; i++)
        CHECK(!spin_until_stopped(RDV_SPIN_FREE_NS / 2), "a spin shorter than its free window read the load");
    printf(UNIT_NAME ": crowded: %d busy tasks on %u CPUs, ok\n", n, rdv_cpus());
    stop_hogs(pids, n);

    phase = "spare";
    CHECK(seen_spare(), "with the busy tasks gone, rdv_cpus_oversubscribed still says crowded");
    int ran_out = 0;
    for (int tries = 0; tries < 2000 && !ran_out; tries++) {
        ran_out = !spin_until_stopped(10 * RDV_SPIN_LOAD_EVERY_NS);
        if (!ran_out)
            usleep(10000);
    }
    CHECK(ran_out, "with the busy tasks gone, every spin still ended crowded");
    printf(UNIT_NAME ": spare: ok\n");

    phase = "no fd kept";
    /* Each look opens /proc/loadavg and closes it: after all the looks
     * above, none is open (nothing for a program to count as leaked, or to
     * close behind the core and reuse). */
    CHECK(loadavg_fd_number() < 0, "an fd on /proc/loadavg is still open after the looks");
    printf(UNIT_NAME ": no fd kept: ok\n");
    printf(UNIT_NAME ": all passed\n");
    return 0;
}
