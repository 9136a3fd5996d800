/* Unit test of a spin's clock (rdv_spin.h) over rdv_os.c alone: with more
 * busy tasks than CPUs, rdv_cpus_oversubscribed says so and a spin past its
 * free window ends crowded, not on its budget; a spin shorter than the free
 * window never reads the load; on a machine with a CPU to spare a spin runs
 * to its budget. The busy children die with this program (PDEATHSIG) or
 * after 60 s (alarm), whichever is first. */
#define UNIT_NAME "unit_spin"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rdv_atomic.h"
#include "rdv_os.h"
#include "rdv_spin.h"
#include "unit_check.h"

#define MAX_HOGS 64

/* Spin through rounds of pauses, as the core's waits do, until the clock
 * says stop: 1 if it stopped crowded. */
static int spin_until_stopped(int64_t budget_ns) {
    struct rdv_spin s;
    rdv_spin_begin(&s);
    do {
        for (int i = 0; i < RDV_SPIN_CHECK_EVERY; i++)
            rdv_cpu_relax();
    } while (rdv_spin_on(&s, budget_ns));
    return s.crowded;
}

static int start_hogs(pid_t *pids) {
    int n = (int)rdv_cpus() + 2;
    CHECK(n <= MAX_HOGS, "%d CPUs: more hogs than this test keeps", n - 2);
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        CHECK(pids[i] >= 0, "fork failed");
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            alarm(60);
            for (;;)
                rdv_cpu_relax();
        }
    }
    return n;
}

static void stop_hogs(pid_t *pids, int n) {
    for (int i = 0; i < n; i++)
        kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++)
        waitpid(pids[i], NULL, 0);
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    pid_t pids[MAX_HOGS];

    phase = "crowded";
    int n = start_hogs(pids);
    int seen = 0;
    for (int tries = 0; tries < 500 && !seen; tries++) { /* up to ~5 s for the hogs to run */
        seen = rdv_cpus_oversubscribed();
        if (!seen)
            usleep(10000);
    }
    CHECK(seen, "%d busy tasks on %u CPUs, and rdv_cpus_oversubscribed never said so", n, rdv_cpus());
    /* A 10 s budget: only a crowded machine ends this spin soon. */
    CHECK(spin_until_stopped(10LL * 1000 * 1000 * 1000), "a spin on a crowded machine was not cut short");
    /* Within the free window the load is never read: every spin runs out its budget. */
    for (int i = 0; i < 1000; i++)
        CHECK(!spin_until_stopped(RDV_SPIN_FREE_NS / 2), "a spin shorter than its free window read the load");
    printf(UNIT_NAME ": crowded: %d busy tasks on %u CPUs, ok\n", n, rdv_cpus());
    stop_hogs(pids, n);

    phase = "spare";
    /* Other tasks on the machine may crowd it for a while: one spin in a few
     * seconds' tries that runs out its budget shows the clock lets it. */
    int spare = 0, ran_out = 0;
    for (int tries = 0; tries < 300 && !(spare && ran_out); tries++) {
        spare = spare || !rdv_cpus_oversubscribed();
        ran_out = ran_out || !spin_until_stopped(10 * RDV_SPIN_LOAD_EVERY_NS);
        usleep(10000);
    }
    CHECK(spare, "with the busy tasks gone, rdv_cpus_oversubscribed still says crowded");
    CHECK(ran_out, "with the busy tasks gone, every spin still ended crowded");
    printf(UNIT_NAME ": spare: ok\n");
    printf(UNIT_NAME ": all passed\n");
    return 0;
}
