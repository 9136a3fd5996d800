/* Multi-process stress test of the collectives (rdv_coll.c), built with
 * -fsanitize=address,undefined by tests/c/test_c_coll.py.
 *
 * The parent creates each group's segment (shm_open O_CREAT | O_EXCL, 0600,
 * named after its pid) and forks the ranks: rank 0 creates the group
 * (rdv_coll_open create 1), then the others join; the rank whose join
 * completes the group unlinks the name. The parent never takes part.
 *
 * 1. Mixed calls: for W = 2, 3, 4 and buffers (slots) of 4 KiB and 64 KiB,
 *    every rank makes the same pseudo-random sequence of calls (same seed):
 *    allreduce, broadcast (rotating root), allgather, reduce_scatter,
 *    reduce, gather, scatter, alltoall and barrier, of 0 bytes to 384 KiB
 *    (many near the one-shot limit and the chunk sizes), over several
 *    dtypes and ops whose results are exact (int64 sums wrap; float sums
 *    are of integers). Rank j's input to call i is a function of (seed, i,
 *    j), so every rank computes what it must receive and compares it byte
 *    for byte; it also checks that its input was not written and that a
 *    rank with no output (NULL dst) is fine. About one call in 40 is a
 *    mismatch: one rank changes one field (op, size, dtype, root, kind,
 *    shape hash): every rank must get -EBADE, with rdv_coll_status naming
 *    the odd rank and its call, and no output written; the next call
 *    must succeed. Each rank reports a checksum of what every rank
 *    receives alike (allreduce, broadcast, allgather) and of all it
 *    received; the parent checks they agree.
 * 2. Mismatches on purpose: allreduce pairs, the first with one rank's call
 *    changed, the second normal and checked.
 * 3. SIGKILL: KILL_ROUNDS fresh groups run allreduce loops of 64 KiB to
 *    1 MiB (many phases each with a small slot); the parent kills one rank
 *    at a random moment (mostly mid-call; every fifth round while the
 *    others are still joining). Every survivor must return -EPIPE naming
 *    the killed rank and its pid, within HARD_LIMIT_NS of the kill
 *    (measured; over SOFT_LIMIT_NS is reported), with no wrong result
 *    before; the next call fails the same way.
 * 4. Abort and leave: one rank aborts while the others are blocked in a
 *    call (all get -ECONNABORTED and the reason), one aborts in the middle
 *    of a call of its own, and one leaves (rdv_coll_leave: the others get
 *    -EPIPE with closed 1).
 *
 * The parent's alarm kills everything on a hang; it waits for every child,
 * checks how each ended, and checks that nothing is left in /dev/shm. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shmrdv.h"
#include "rdv_reduce.h"

#define MAXW 4
#define SLOT_SMALL 4096
#define SLOT_LARGE 65536
#define MIXED_CALLS 1500    /* per (world, slot) */
#define MISMATCH_PAIRS 30   /* per world */
#define KILL_ROUNDS 30
#define MAX_BYTES (384u << 10)
#define KILL_MIN_BYTES (64u << 10)
#define KILL_MAX_BYTES (1u << 20)
#define SEC 1000000000LL
#define CALL_TIMEOUT_NS (30 * SEC) /* a hang shows as -ETIMEDOUT before the alarm */
#define SOFT_LIMIT_NS SEC          /* a survivor should see a death within this */
#define HARD_LIMIT_NS (2 * SEC)    /* and must */
#define CHILD_ALARM 150
#define PARENT_ALARM 220

static char shm_name[64];
static pid_t kids[64];
static volatile uint32_t *in_call; /* shared: rank r is inside a call (for the kill statistics) */
#define GO 100                     /* in_call[GO]: the parent's word to a REFUSE round's late rank */
static int failures;

/* ---- helpers ------------------------------------------------------------ */

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * SEC + ts.tv_nsec;
}

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "coll stress: FAIL: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    failures++;
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "coll stress: FAIL: alarm: hung; killing every rank\n";
    for (int i = 0; i < 64; i++)
        if (kids[i] > 0)
            kill(kids[i], SIGKILL);
    shm_unlink(shm_name);
    if (write(2, msg, sizeof msg - 1) < 0)
        _exit(3);
    _exit(3);
}

static void add_kid(pid_t pid) {
    for (int i = 0; i < 64; i++)
        if (kids[i] == 0) {
            kids[i] = pid;
            return;
        }
}

static void drop_kid(pid_t pid) {
    for (int i = 0; i < 64; i++)
        if (kids[i] == pid)
            kids[i] = 0;
}

static int read_full(int fd, void *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)p + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

static void write_full(int fd, const void *p, size_t n) {
    size_t put = 0;
    while (put < n) {
        ssize_t k = write(fd, (const char *)p + put, n - put);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            _exit(20);
        put += (size_t)k;
    }
}

/* ---- what ranks report -------------------------------------------------- */

struct report {
    uint32_t rank, pid;
    int32_t rc;  /* the call that failed (kill and abort sections) */
    int32_t rc2; /* the call after it */
    uint32_t st_rank, st_pid, st_closed, errors;
    uint64_t calls, mismatches, cs_repl, cs_all;
    int64_t t_start; /* when the failing call began */
    int64_t t_ret;   /* when it returned */
    int64_t t_act;   /* when this rank aborted or left */
    char msg[200];
};

static void rank_error(struct report *rep, const char *fmt, ...) {
    char buf[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (rep->errors++ < 5)
        fprintf(stderr, "coll stress: rank %u (pid %u): %s\n", rep->rank, rep->pid, buf);
    if (!rep->msg[0])
        snprintf(rep->msg, sizeof rep->msg, "%s", buf);
}

/* ---- the calls ---------------------------------------------------------- */

enum { MIXED, MISMATCH, KILL, ABORT, REFUSE };

struct job {
    int mode;
    uint32_t world;
    uint64_t slot;
    uint64_t seed;
    uint32_t ncalls;
    int variant;    /* ABORT: 0 abort while the others wait, 1 abort mid-call, 2 leave;
                       REFUSE: 0 refused before the late rank opens, 1 as it does */
    uint32_t actor; /* ABORT: who aborts or leaves */
    uint32_t late;  /* ABORT variant 1: who calls only once it is aborted; REFUSE: who opens at the parent's word */
};

struct desc {
    uint32_t kind, op, dtype, root;
    uint64_t nbytes, hash;
};

struct plan {
    struct desc d;   /* every rank's call */
    struct desc alt; /* the odd rank's, when odd >= 0 */
    int odd;
};

struct combo {
    uint32_t dtype, op;
};

/* reductions whose results are exact (or computed here in the same order) */
static const struct combo combos[] = {
    {RDV_DT_I64, RDV_OP_SUM}, {RDV_DT_I64, RDV_OP_SUM}, {RDV_DT_I64, RDV_OP_SUM}, {RDV_DT_I64, RDV_OP_SUM},
    {RDV_DT_I64, RDV_OP_MIN}, {RDV_DT_I64, RDV_OP_MAX}, {RDV_DT_U64, RDV_OP_PROD}, {RDV_DT_U64, RDV_OP_BXOR},
    {RDV_DT_F32, RDV_OP_SUM}, {RDV_DT_F32, RDV_OP_SUM}, {RDV_DT_F32, RDV_OP_SUM}, {RDV_DT_F32, RDV_OP_MIN},
    {RDV_DT_F32, RDV_OP_MAX}, {RDV_DT_F32, RDV_OP_MEAN}, {RDV_DT_F64, RDV_OP_SUM}, {RDV_DT_F64, RDV_OP_MEAN},
    {RDV_DT_F64, RDV_OP_MAX}, {RDV_DT_I32, RDV_OP_BAND}, {RDV_DT_I32, RDV_OP_BOR}, {RDV_DT_I32, RDV_OP_SUM},
    {RDV_DT_U32, RDV_OP_MIN}, {RDV_DT_I16, RDV_OP_SUM}, {RDV_DT_U16, RDV_OP_MAX}, {RDV_DT_I8, RDV_OP_SUM},
    {RDV_DT_U8, RDV_OP_BXOR}, {RDV_DT_U8, RDV_OP_PROD}, {RDV_DT_BOOL, RDV_OP_SUM}, {RDV_DT_BOOL, RDV_OP_MIN},
    {RDV_DT_BOOL, RDV_OP_BXOR}, {RDV_DT_F16, RDV_OP_SUM}, {RDV_DT_BF16, RDV_OP_SUM}, {RDV_DT_BF16, RDV_OP_MAX},
    {RDV_DT_C128, RDV_OP_SUM},
};
#define NCOMBOS (sizeof combos / sizeof combos[0])

static int reducing(uint32_t kind) {
    return kind == RDV_COLL_ALLREDUCE || kind == RDV_COLL_REDUCE || kind == RDV_COLL_REDUCE_SCATTER;
}

static int rooted(uint32_t kind) {
    return kind == RDV_COLL_BROADCAST || kind == RDV_COLL_REDUCE || kind == RDV_COLL_GATHER ||
           kind == RDV_COLL_SCATTER || kind == RDV_COLL_SCATTER_META;
}

/* RDV_COLL_SCATTER_META moves data as a broadcast does */
static int broadcasting(uint32_t kind) { return kind == RDV_COLL_BROADCAST || kind == RDV_COLL_SCATTER_META; }

/* Rank j's input to call i is a function of these alone. */
static uint64_t input_base(uint64_t seed, uint64_t i, uint32_t j) {
    return mix64(seed ^ mix64(i * 0x100000001b3ULL + (uint64_t)j * 0x9e3779b1ULL + 17));
}

/* Bytes [from, from + len) of the byte stream of base. */
static void gen_bytes(uint64_t base, uint64_t from, uint64_t len, uint8_t *out) {
    uint64_t b = from, end = from + len;
    while (b < end) {
        uint64_t w = mix64(base + (b >> 3));
        uint64_t off = b & 7, take = 8 - off < end - b ? 8 - off : end - b;
        memcpy(out + (b - from), (const uint8_t *)&w + off, take);
        b += take;
    }
}

/* One element of dtype for op from the random word v. */
static void elem(uint32_t dt, uint32_t op, uint64_t v, uint8_t *out) {
    switch (dt) {
    case RDV_DT_BOOL: /* mostly the value that keeps or and and interesting */
        out[0] = op == RDV_OP_BXOR ? (uint8_t)(v >> 63)
                 : op == RDV_OP_MIN ? (v & 7) != 0
                                    : (v & 7) == 0;
        break;
    case RDV_DT_F16: {
        _Float16 h = (_Float16)(float)((int)(v % 512) - 256);
        memcpy(out, &h, 2);
        break;
    }
    case RDV_DT_BF16: {
        float f = (float)((int)(v % 64) - 32);
        uint32_t u;
        memcpy(&u, &f, 4);
        uint16_t b = (uint16_t)(u >> 16); /* exact: small integers */
        memcpy(out, &b, 2);
        break;
    }
    case RDV_DT_F32: {
        float f = op == RDV_OP_SUM || op == RDV_OP_MEAN ? (float)((int32_t)(v >> 32) >> 11) /* |f| < 2^20 */
                                                        : (float)(int32_t)(v >> 32) * (1.0f / 1024);
        memcpy(out, &f, 4);
        break;
    }
    case RDV_DT_F64: {
        double d = (double)((int64_t)v >> 20); /* |d| < 2^43: sums of 4 exact */
        memcpy(out, &d, 8);
        break;
    }
    case RDV_DT_C128: {
        double d[2] = {(double)((int64_t)v >> 20), (double)((int64_t)mix64(v) >> 20)};
        memcpy(out, d, 16);
        break;
    }
    default: /* integers: the low bytes */
        memcpy(out, &v, rdv_dtype_size(dt));
    }
}

static void gen_elems(uint32_t dt, uint32_t op, uint64_t base, uint64_t count, uint8_t *out) {
    uint32_t isz = rdv_dtype_size(dt);
    for (uint64_t k = 0; k < count; k++)
        elem(dt, op, mix64(base + k), out + k * isz);
}

/* bfloat16 as rdv_reduce.c converts it */
static float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

#define IFOLD(T, UT)                                                                                      \
    do {                                                                                                  \
        T a, x;                                                                                           \
        memcpy(&a, v[0], sizeof a);                                                                       \
        for (uint32_t j = 1; j < W; j++) {                                                                \
            memcpy(&x, v[j], sizeof x);                                                                   \
            switch (op) {                                                                                 \
            case RDV_OP_SUM: a = (T)((UT)a + (UT)x); break;                                               \
            case RDV_OP_PROD: a = (T)((UT)a * (UT)x); break;                                              \
            case RDV_OP_MIN: a = x < a ? x : a; break;                                                    \
            case RDV_OP_MAX: a = x > a ? x : a; break;                                                    \
            case RDV_OP_BAND: a = (T)(a & x); break;                                                      \
            case RDV_OP_BOR: a = (T)(a | x); break;                                                       \
            case RDV_OP_BXOR: a = (T)(a ^ x); break;                                                      \
            }                                                                                             \
        }                                                                                                 \
        memcpy(out, &a, sizeof a);                                                                        \
    } while (0)

/* no NaN here: min and max are plain comparisons, in rank order */
#define FFOLD(ACC, LOADV, STOREV)                                                                         \
    do {                                                                                                  \
        ACC a = LOADV(0);                                                                                 \
        for (uint32_t j = 1; j < W; j++) {                                                                \
            ACC x = LOADV(j);                                                                             \
            if (op == RDV_OP_MIN)                                                                         \
                a = x < a ? x : a;                                                                        \
            else if (op == RDV_OP_MAX)                                                                    \
                a = x > a ? x : a;                                                                        \
            else                                                                                          \
                a = a + x;                                                                                \
        }                                                                                                 \
        if (op == RDV_OP_MEAN)                                                                            \
            a = (ACC)(a / (ACC)W);                                                                        \
        STOREV(a);                                                                                        \
    } while (0)

static float load_f16(const uint8_t *p) { _Float16 h; memcpy(&h, p, 2); return (float)h; }
static float load_bf16(const uint8_t *p) { uint16_t b; memcpy(&b, p, 2); return bf16_to_f32(b); }
static float load_f32(const uint8_t *p) { float f; memcpy(&f, p, 4); return f; }
static double load_f64(const uint8_t *p) { double d; memcpy(&d, p, 8); return d; }

/* The reduction of the W elements v[0..W-1] (rank order), as rdv_reduce does it. */
static void fold(uint32_t dt, uint32_t op, uint32_t W, uint8_t v[][16], uint8_t *out) {
    switch (dt) {
    case RDV_DT_BOOL: {
        uint8_t a = v[0][0];
        for (uint32_t j = 1; j < W; j++)
            a = op == RDV_OP_PROD || op == RDV_OP_MIN || op == RDV_OP_BAND ? a & v[j][0]
                : op == RDV_OP_BXOR                                         ? a ^ v[j][0]
                                                                            : a | v[j][0];
        out[0] = a;
        break;
    }
    case RDV_DT_I8: IFOLD(int8_t, uint8_t); break;
    case RDV_DT_U8: IFOLD(uint8_t, uint8_t); break;
    case RDV_DT_I16: IFOLD(int16_t, uint16_t); break;
    case RDV_DT_U16: IFOLD(uint16_t, uint16_t); break;
    case RDV_DT_I32: IFOLD(int32_t, uint32_t); break;
    case RDV_DT_U32: IFOLD(uint32_t, uint32_t); break;
    case RDV_DT_I64: IFOLD(int64_t, uint64_t); break;
    case RDV_DT_U64: IFOLD(uint64_t, uint64_t); break;
#define L_F16(j) load_f16(v[j])
#define S_F16(a) do { _Float16 h = (_Float16)(a); memcpy(out, &h, 2); } while (0)
    case RDV_DT_F16: FFOLD(float, L_F16, S_F16); break;
#define L_BF16(j) load_bf16(v[j])
#define S_BF16(a) do { uint16_t b = f32_to_bf16(a); memcpy(out, &b, 2); } while (0)
    case RDV_DT_BF16: FFOLD(float, L_BF16, S_BF16); break;
#define L_F32(j) load_f32(v[j])
#define S_F32(a) do { float f = (a); memcpy(out, &f, 4); } while (0)
    case RDV_DT_F32: FFOLD(float, L_F32, S_F32); break;
#define L_F64(j) load_f64(v[j])
#define S_F64(a) do { double d = (a); memcpy(out, &d, 8); } while (0)
    case RDV_DT_F64: FFOLD(double, L_F64, S_F64); break;
    case RDV_DT_C128: { /* sums only */
        double re = load_f64(v[0]), im = load_f64(v[0] + 8);
        for (uint32_t j = 1; j < W; j++)
            re = re + load_f64(v[j]), im = im + load_f64(v[j] + 8);
        memcpy(out, &re, 8);
        memcpy(out + 8, &im, 8);
        break;
    }
    }
}

/* Elements [k0, k0 + count) of the reduction of every rank's input. */
static void expected_reduce(uint32_t dt, uint32_t op, uint32_t W, const uint64_t *bases, uint64_t k0,
                            uint64_t count, uint8_t *out) {
    uint32_t isz = rdv_dtype_size(dt);
    uint8_t v[MAXW][16];
    for (uint64_t k = 0; k < count; k++) {
        for (uint32_t j = 0; j < W; j++)
            elem(dt, op, mix64(bases[j] + k0 + k), v[j]);
        fold(dt, op, W, v, out + k * isz);
    }
}

static uint64_t digest(const uint8_t *p, uint64_t n, uint64_t salt) {
    uint64_t h = mix64(salt ^ n), w;
    uint64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        memcpy(&w, p + k, 8);
        h = mix64(h ^ w);
    }
    for (; k < n; k++)
        h = mix64(h ^ p[k]);
    return h;
}

/* A call's size: often at the edges that matter (the one-shot limit, a
 * buffer, a chunk, a peer's region), else log-uniform up to the kind's max. */
static uint64_t pick_bytes(uint64_t *s, const struct job *job, uint32_t kind, uint32_t isz) {
    uint32_t W = job->world;
    uint64_t slot = job->slot, per = slot / W;
    uint64_t reg_r = per / isz * isz, reg_b = per / 64 * 64;
    int per_row = kind == RDV_COLL_ALLGATHER || kind == RDV_COLL_GATHER || kind == RDV_COLL_SCATTER ||
                  kind == RDV_COLL_ALLTOALL;
    uint64_t max = per_row ? MAX_BYTES / W : MAX_BYTES, u;
    uint32_t pick = (uint32_t)(rng(s) % 100);
    if (pick < 8) {
        u = 0;
    } else if (pick < 25) {
        u = rng(s) % 257;
    } else if (pick < 50) {
        uint64_t c[6];
        int n = 0;
        switch (kind) {
        case RDV_COLL_ALLREDUCE:
        case RDV_COLL_REDUCE:
            c[n++] = RDV_COLL_ONE_SHOT_BYTES, c[n++] = slot, c[n++] = W * reg_r;
            c[n++] = 2 * W * reg_r, c[n++] = reg_r, c[n++] = 3 * W * reg_r + reg_r;
            break;
        case RDV_COLL_REDUCE_SCATTER:
            c[n++] = W * reg_r, c[n++] = 2 * W * reg_r, c[n++] = 5 * W * reg_r, c[n++] = RDV_COLL_ONE_SHOT_BYTES;
            break;
        case RDV_COLL_SCATTER:
        case RDV_COLL_ALLTOALL:
            c[n++] = reg_b, c[n++] = 2 * reg_b, c[n++] = 7 * reg_b;
            break;
        default:
            c[n++] = slot, c[n++] = 2 * slot, c[n++] = 3 * slot, c[n++] = RDV_COLL_ONE_SHOT_BYTES;
        }
        uint64_t unit = kind == RDV_COLL_REDUCE_SCATTER ? (uint64_t)W * isz : isz;
        int64_t deltas[] = {0, 1, -1, (int64_t)unit, -(int64_t)unit, 64, -64};
        int64_t v = (int64_t)c[rng(s) % (uint64_t)n] + deltas[rng(s) % 7];
        u = v < 0 ? 0 : (uint64_t)v;
    } else {
        uint32_t bits = 8 + (uint32_t)(rng(s) % 12); /* up to 2^19 */
        u = 1 + rng(s) % (1ull << bits);
    }
    if (u > max)
        u = max;
    uint64_t unit = kind == RDV_COLL_REDUCE_SCATTER ? (uint64_t)W * isz : isz;
    return u / unit * unit;
}

/* The odd rank's call: d with one field changed (how, or the next that
 * applies), or (how 6) a call it could not make, saying why in bytes. */
static void alter(uint64_t *s, const struct job *job, const struct desc *d, struct desc *alt, uint32_t how) {
    uint32_t W = job->world;
    for (int tries = 0; tries < 7; tries++, how = (how + 1) % 7) {
        *alt = *d;
        switch (how) {
        case 0: /* shape */
            if (d->kind == RDV_COLL_BARRIER)
                break;
            alt->hash ^= 0x10;
            return;
        case 1: { /* size */
            if (d->kind == RDV_COLL_BARRIER)
                break;
            uint64_t unit = d->kind == RDV_COLL_REDUCE_SCATTER ? (uint64_t)W * rdv_dtype_size(d->dtype)
                            : reducing(d->kind)                  ? rdv_dtype_size(d->dtype)
                                                                 : 1;
            if (rng(s) % 4 == 0)
                unit *= 1 + rng(s) % 9000; /* another size altogether: across the one-shot limit, say */
            alt->nbytes = d->nbytes >= unit && rng(s) % 2 ? d->nbytes - unit : d->nbytes + unit;
            return;
        }
        case 2: { /* op */
            if (!reducing(d->kind))
                break;
            static const uint32_t ops[] = {RDV_OP_SUM, RDV_OP_MAX, RDV_OP_MIN, RDV_OP_BXOR, RDV_OP_PROD, RDV_OP_MEAN};
            for (unsigned k = 0; k < 6; k++)
                if (ops[k] != d->op && rdv_reduce_valid(d->dtype, ops[k])) {
                    alt->op = ops[k];
                    return;
                }
            break;
        }
        case 3: /* root */
            if (!rooted(d->kind))
                break;
            alt->root = (d->root + 1) % W;
            return;
        case 4: /* kind */
            if (d->kind == RDV_COLL_BARRIER) {
                *alt = (struct desc){RDV_COLL_ALLREDUCE, RDV_OP_SUM, RDV_DT_I64, 0, 8, 0};
            } else if (d->kind == RDV_COLL_ALLREDUCE) {
                alt->kind = RDV_COLL_REDUCE;
                alt->root = (uint32_t)(rng(s) % W);
            } else {
                *alt = (struct desc){RDV_COLL_BARRIER, 0, 0, 0, 0, 0};
            }
            return;
        case 5: { /* dtype, of the same size */
            if (d->kind == RDV_COLL_BARRIER)
                break;
            if (!reducing(d->kind)) {
                alt->dtype = RDV_DT_I8;
                return;
            }
            for (uint32_t dt = RDV_DT_BOOL; dt <= RDV_DT_C128; dt++)
                if (dt != d->dtype && rdv_dtype_size(dt) == rdv_dtype_size(d->dtype) && rdv_reduce_valid(dt, d->op)) {
                    alt->dtype = dt;
                    return;
                }
            break;
        }
        case 6: /* a call it could not make (RDV_COLL_FAILED), why in up to RDV_REASON_MAX bytes */
            *alt = (struct desc){RDV_COLL_FAILED, d->kind, 0, 0, rng(s) % (RDV_REASON_MAX + 1), 0};
            return;
        }
    }
    alt->hash ^= 0x20;
}

/* Call i of a job: the same on every rank. */
static void plan_call(const struct job *job, uint64_t i, struct plan *p) {
    uint64_t s = mix64(job->seed * 0x2545f4914f6cdd1dULL + i) | 1;
    uint32_t W = job->world;
    struct desc *d = &p->d;
    memset(p, 0, sizeof *p);
    p->odd = -1;
    uint32_t kind;
    if (job->mode == MIXED) {
        static const uint32_t weights[][2] = {
            {RDV_COLL_ALLREDUCE, 30}, {RDV_COLL_BROADCAST, 10}, {RDV_COLL_ALLGATHER, 10},
            {RDV_COLL_REDUCE_SCATTER, 10}, {RDV_COLL_REDUCE, 9}, {RDV_COLL_GATHER, 8},
            {RDV_COLL_SCATTER, 8}, {RDV_COLL_ALLTOALL, 8}, {RDV_COLL_BARRIER, 6}, {RDV_COLL_SCATTER_META, 1},
        };
        uint32_t x = (uint32_t)(rng(&s) % 100), k = 0;
        while (x >= weights[k][1])
            x -= weights[k++][1];
        kind = weights[k][0];
    } else {
        kind = RDV_COLL_ALLREDUCE;
    }
    d->kind = kind;
    if (reducing(kind)) {
        const struct combo *c = &combos[rng(&s) % NCOMBOS];
        if (job->mode == KILL || job->mode == ABORT)
            c = &combos[rng(&s) % 2 ? 0 : 8]; /* int64 or float32 sums */
        d->op = c->op;
        d->dtype = c->dtype;
    } else if (kind != RDV_COLL_BARRIER) {
        d->dtype = RDV_DT_U8;
    }
    uint32_t isz = reducing(kind) ? rdv_dtype_size(d->dtype) : 1;
    if (kind != RDV_COLL_BARRIER) {
        if (job->mode == KILL || (job->mode == ABORT && i > 0))
            d->nbytes = (KILL_MIN_BYTES + rng(&s) % (KILL_MAX_BYTES - KILL_MIN_BYTES)) / 8 * 8;
        else if (job->mode == ABORT)
            d->nbytes = 4096;
        else
            d->nbytes = pick_bytes(&s, job, kind, isz);
        d->hash = rng(&s) & 0xffffffffffffULL;
    }
    if (rooted(kind))
        d->root = (uint32_t)(i % W);
    int mismatch = job->mode == MISMATCH ? i % 2 == 0 : job->mode == MIXED && rng(&s) % 40 == 0;
    if (mismatch) {
        p->odd = job->mode == MISMATCH ? (int)((i / 2) % W) : (int)(rng(&s) % W);
        alter(&s, job, d, &p->alt, job->mode == MISMATCH ? (uint32_t)(i / 2 % 7) : (uint32_t)(rng(&s) % 7));
    }
}

static int same_desc_status(const struct rdv_coll_status *st, const struct desc *d) {
    return st->kind == d->kind && st->op == d->op && st->dtype == d->dtype && st->root == d->root &&
           st->nbytes == d->nbytes && st->shape_hash == d->hash;
}

/* Make call i of plan p as rank r and check it. Returns the call's rc
 * (after resuming it past -EINPROGRESS); with abort_after >= 0, this rank
 * aborts the group after that many -EINPROGRESS. */
static int do_call(rdv_group_t *g, const struct job *job, uint64_t i, const struct plan *p, uint32_t r,
                   struct report *rep, int abort_after, int check) {
    int odd = p->odd >= 0;
    const struct desc *d = odd && (uint32_t)p->odd == r ? &p->alt : &p->d;
    uint32_t W = job->world, kind = d->kind, root = d->root, dt = d->dtype, op = d->op;
    uint64_t N = d->nbytes;
    uint32_t isz = reducing(kind) ? rdv_dtype_size(dt) : 1;
    uint64_t bases[MAXW];
    for (uint32_t j = 0; j < W; j++)
        bases[j] = input_base(job->seed, i, j);
    uint64_t local = mix64(bases[r] ^ 0x51ab);
    uint64_t in_len = 0, out_len = 0;
    int has_src = 0, has_dst = 0, in_place = 0;
    switch (kind) {
    case RDV_COLL_ALLREDUCE:
        has_src = has_dst = 1, in_len = out_len = N, in_place = local % 4 == 0;
        break;
    case RDV_COLL_REDUCE:
        has_src = 1, in_len = out_len = N, has_dst = r == root;
        break;
    case RDV_COLL_REDUCE_SCATTER:
        has_src = has_dst = 1, in_len = N, out_len = N / W;
        break;
    case RDV_COLL_BROADCAST: /* the root: into its own input, a buffer of its own, or none */
    case RDV_COLL_SCATTER_META:
        in_len = out_len = N, has_src = r == root;
        has_dst = r != root || local % 3 != 2;
        in_place = r == root && local % 3 == 0;
        break;
    case RDV_COLL_ALLGATHER:
        has_src = has_dst = 1, in_len = N, out_len = W * N;
        break;
    case RDV_COLL_GATHER:
        has_src = 1, in_len = N, out_len = W * N, has_dst = r == root;
        break;
    case RDV_COLL_SCATTER:
        has_src = r == root, in_len = W * N, has_dst = 1, out_len = N;
        break;
    case RDV_COLL_ALLTOALL:
        has_src = has_dst = 1, in_len = out_len = W * N;
        break;
    case RDV_COLL_FAILED: /* src: why it failed */
        has_src = 1, in_len = N;
        break;
    }
    uint8_t *src = NULL, *dst = NULL, *exp = NULL;
    if (has_src) {
        src = malloc(in_len);
        if (!src && in_len)
            _exit(21);
        if (reducing(kind))
            gen_elems(dt, op, bases[r], in_len / isz, src);
        else
            gen_bytes(bases[r], 0, in_len, src);
    }
    if (has_dst) {
        if (in_place) {
            dst = src;
        } else {
            dst = malloc(out_len);
            if (!dst && out_len)
                _exit(21);
            memset(dst, 0xa5, out_len);
        }
    }
    uint64_t what = kind | op << 8 | dt << 16 | (uint64_t)root << 32;
    rep->t_start = now_ns();
    in_call[r] = 1;
    int rc = kind == RDV_COLL_BARRIER && local % 2 ? rdv_coll_barrier(g) : rdv_coll_run(g, what, N, d->hash, src, dst);
    for (int slices = 0; rc == -EINPROGRESS; slices++) {
        if (slices == abort_after) {
            char reason[64];
            int n = snprintf(reason, sizeof reason, "coll stress: rank %u aborts mid-call", r);
            rep->t_act = now_ns();
            if (rdv_coll_abort(g, reason, (uint32_t)n))
                rank_error(rep, "rdv_coll_abort failed");
        }
        rc = rdv_coll_resume(g);
    }
    in_call[r] = 0;
    rep->t_ret = now_ns();
    rep->calls++;
    struct rdv_coll_status st;
    rdv_coll_status(g, &st);
    if (odd) {
        if (rc != -EBADE) {
            rank_error(rep, "call %llu: a mismatch (odd rank %d, kind %u vs %u) returned %d, not -EBADE",
                       (unsigned long long)i, p->odd, p->d.kind, p->alt.kind, rc);
        } else {
            uint32_t want_rank = (uint32_t)p->odd == r ? (p->odd == 0 ? 1 : 0) : (uint32_t)p->odd;
            const struct desc *theirs = (uint32_t)p->odd == r ? &p->d : &p->alt;
            if (st.rank != want_rank || !same_desc_status(&st, theirs))
                rank_error(rep, "call %llu: -EBADE status names rank %u (kind %u op %u dtype %u root %u nbytes %llu "
                           "hash %llx), expected rank %u (kind %u op %u dtype %u root %u nbytes %llu hash %llx)",
                           (unsigned long long)i, st.rank, st.kind, st.op, st.dtype, st.root,
                           (unsigned long long)st.nbytes, (unsigned long long)st.shape_hash, want_rank, theirs->kind,
                           theirs->op, theirs->dtype, theirs->root, (unsigned long long)theirs->nbytes,
                           (unsigned long long)theirs->hash);
            if (theirs->kind == RDV_COLL_FAILED) { /* the odd rank's why, as it gave it */
                char why[RDV_REASON_MAX], want[RDV_REASON_MAX];
                uint32_t len = 0;
                int wrc = rdv_coll_failed_why(g, why, sizeof why, &len);
                gen_bytes(bases[p->odd], 0, theirs->nbytes, (uint8_t *)want);
                if (wrc || len != theirs->nbytes || memcmp(why, want, len))
                    rank_error(rep, "call %llu: rdv_coll_failed_why: %d, %u bytes, not the %llu the odd rank gave",
                               (unsigned long long)i, wrc, len, (unsigned long long)theirs->nbytes);
            }
            for (uint64_t k = 0; has_dst && !in_place && k < out_len; k++)
                if (dst[k] != 0xa5) {
                    rank_error(rep, "call %llu: -EBADE but output byte %llu was written", (unsigned long long)i,
                               (unsigned long long)k);
                    break;
                }
            rep->mismatches++;
            rep->cs_repl += mix64(i ^ 0xbadeULL);
            rep->cs_all += mix64(i ^ 0xbadeULL);
        }
    } else if (rc == 0 && check) {
        /* the output, byte for byte */
        if (has_dst) {
            exp = malloc(out_len ? out_len : 1);
            switch (kind) {
            case RDV_COLL_ALLREDUCE:
            case RDV_COLL_REDUCE:
                expected_reduce(dt, op, W, bases, 0, N / isz, exp);
                break;
            case RDV_COLL_REDUCE_SCATTER:
                expected_reduce(dt, op, W, bases, r * (N / isz / W), N / isz / W, exp);
                break;
            case RDV_COLL_BROADCAST:
            case RDV_COLL_SCATTER_META:
                gen_bytes(bases[root], 0, N, exp);
                break;
            case RDV_COLL_ALLGATHER:
            case RDV_COLL_GATHER:
                for (uint32_t j = 0; j < W; j++)
                    gen_bytes(bases[j], 0, N, exp + j * N);
                break;
            case RDV_COLL_SCATTER:
                gen_bytes(bases[root], r * N, N, exp);
                break;
            case RDV_COLL_ALLTOALL:
                for (uint32_t j = 0; j < W; j++)
                    gen_bytes(bases[j], r * N, N, exp + j * N);
                break;
            }
            if (memcmp(dst, exp, out_len)) {
                uint64_t k = 0;
                while (dst[k] == exp[k])
                    k++;
                rank_error(rep, "call %llu (W %u slot %llu): kind %u op %u dtype %u root %u nbytes %llu%s: output "
                           "byte %llu of %llu is %02x, expected %02x",
                           (unsigned long long)i, W, (unsigned long long)job->slot, kind, op, dt, root,
                           (unsigned long long)N, in_place ? " (in place)" : "", (unsigned long long)k,
                           (unsigned long long)out_len, dst[k], exp[k]);
            }
            uint64_t h = digest(dst, out_len, i * 31 + r);
            rep->cs_all += h;
            if (kind == RDV_COLL_ALLREDUCE || broadcasting(kind) || kind == RDV_COLL_ALLGATHER)
                rep->cs_repl += digest(dst, out_len, i); /* the same on every rank */
        } else {
            rep->cs_all += mix64(i);
            if (kind == RDV_COLL_BARRIER)
                rep->cs_repl += mix64(i ^ 0xba22);
        }
        if (broadcasting(kind) && r == root && !has_dst) /* a root without output: same digest as the others */
            rep->cs_repl += digest(src, N, i);
        /* the input was not written (unless it is the output) */
        if (has_src && !in_place) {
            if (!exp || in_len > out_len) {
                free(exp);
                exp = malloc(in_len ? in_len : 1);
            }
            if (reducing(kind))
                gen_elems(dt, op, bases[r], in_len / isz, exp);
            else
                gen_bytes(bases[r], 0, in_len, exp);
            if (memcmp(src, exp, in_len))
                rank_error(rep, "call %llu: kind %u nbytes %llu: the input was written", (unsigned long long)i, kind,
                           (unsigned long long)N);
        }
    }
    free(exp);
    if (dst != src)
        free(dst);
    free(src);
    return rc;
}

/* ---- rank bodies -------------------------------------------------------- */

static void body_calls(rdv_group_t *g, int join_rc, const struct job *job, uint32_t r, struct report *rep) {
    if (join_rc) {
        rank_error(rep, "rdv_coll_wait_joined: %d", join_rc);
        return;
    }
    for (uint64_t i = 0; i < job->ncalls; i++) {
        struct plan p;
        plan_call(job, i, &p);
        int rc = do_call(g, job, i, &p, r, rep, -1, 1);
        if (rc && !(p.odd >= 0 && rc == -EBADE)) {
            struct rdv_coll_status st;
            rdv_coll_status(g, &st);
            rank_error(rep, "call %llu (kind %u, %llu bytes) returned %d (%s), status rank %u",
                       (unsigned long long)i, p.d.kind, (unsigned long long)p.d.nbytes, rc, strerror(-rc), st.rank);
            return; /* we leave: the others find us closed */
        }
    }
}

static int finish_call(rdv_group_t *g, int rc) {
    while (rc == -EINPROGRESS)
        rc = rdv_coll_resume(g);
    return rc;
}

static void record_failure(rdv_group_t *g, int rc, struct report *rep) {
    struct rdv_coll_status st;
    rdv_coll_status(g, &st);
    rep->rc = rc;
    rep->st_rank = st.rank;
    rep->st_pid = st.pid;
    rep->st_closed = st.closed;
    /* a broken group stays broken: the next call says so at once */
    rep->rc2 = finish_call(g, rdv_coll_barrier(g));
}

static void body_kill(rdv_group_t *g, int join_rc, const struct job *job, uint32_t r, struct report *rep) {
    if (join_rc) {
        rep->t_ret = now_ns();
        record_failure(g, join_rc, rep);
        return;
    }
    for (uint64_t i = 0;; i++) {
        struct plan p;
        plan_call(job, i, &p);
        /* the victim (to be) does not check: it is in a call nearly all the time */
        int rc = do_call(g, job, i, &p, r, rep, -1, r != job->actor);
        if (rc) {
            rep->calls--; /* the calls that completed */
            record_failure(g, rc, rep);
            return;
        }
    }
}

static void body_abort(rdv_group_t *g, int join_rc, const struct job *job, uint32_t r, struct report *rep) {
    if (join_rc) {
        rank_error(rep, "rdv_coll_wait_joined: %d", join_rc);
        return;
    }
    struct plan p;
    plan_call(job, 0, &p); /* one call that completes first */
    int rc = do_call(g, job, 0, &p, r, rep, -1, 1);
    if (rc) {
        rank_error(rep, "first call: %d", rc);
        return;
    }
    plan_call(job, 1, &p); /* 64 KiB to 1 MiB: many phases */
    char reason[64];
    int n = snprintf(reason, sizeof reason, "coll stress: rank %u aborts", job->actor);
    if (r == job->actor && job->variant == 0) {
        usleep(200000); /* the others are blocked by then */
        rep->t_act = now_ns();
        if (rdv_coll_abort(g, reason, (uint32_t)n))
            rank_error(rep, "rdv_coll_abort failed");
        rc = do_call(g, job, 1, &p, r, rep, -1, 1);
    } else if (r == job->actor && job->variant == 2) {
        usleep(200000);
        rep->t_act = now_ns();
        rdv_coll_leave(g);
        rc = do_call(g, job, 1, &p, r, rep, -1, 1); /* a handle that left refuses calls */
        if (rc != -EBADF)
            rank_error(rep, "a call after rdv_coll_leave returned %d, not -EBADF", rc);
        rep->rc = rc;
        return;
    } else {
        if (job->variant == 1 && r == job->late)
            usleep(400000); /* comes once the others are aborted */
        rc = do_call(g, job, 1, &p, r, rep, job->variant == 1 && r == job->actor ? 2 : -1, 1);
    }
    record_failure(g, rc, rep);
    if (rep->rc == -ECONNABORTED) {
        char buf[RDV_REASON_MAX];
        uint32_t len = 0;
        int rrc = rdv_coll_reason(g, buf, sizeof buf, &len);
        if (job->variant == 1)
            n = snprintf(reason, sizeof reason, "coll stress: rank %u aborts mid-call", job->actor);
        if (rrc || len != (uint32_t)n || memcmp(buf, reason, len))
            rank_error(rep, "rdv_coll_reason: %d, %.*s", rrc, (int)len, buf);
    }
}

static const char refusal[] = "coll stress: refused by the parent";

/* A refused join: -ECONNABORTED naming no rank but the outsider, with its
 * reason, at once and on every later call; a join that completed first: a
 * group that works. */
static void body_refuse(rdv_group_t *g, int join_rc, const struct job *job, uint32_t r, struct report *rep) {
    (void)job, (void)r;
    rep->t_ret = now_ns();
    if (join_rc == 0) {
        rep->rc2 = finish_call(g, rdv_coll_barrier(g));
        return;
    }
    record_failure(g, join_rc, rep);
    char buf[RDV_REASON_MAX];
    uint32_t len = 0;
    int rrc = rdv_coll_reason(g, buf, sizeof buf, &len);
    if (rrc || len != sizeof refusal - 1 || memcmp(buf, refusal, len))
        rank_error(rep, "rdv_coll_reason: %d, %.*s", rrc, (int)len, buf);
}

/* ---- teams -------------------------------------------------------------- */

struct team {
    const struct job *job;
    pid_t pid[MAXW];
    int in[MAXW];
    char stage[MAXW]; /* the last tag read: 'o' opened, 'j' joined, 'R' reported */
};

typedef void (*body_fn)(rdv_group_t *, int, const struct job *, uint32_t, struct report *);

static void rank_main(int fd, const struct job *job, uint32_t r, int out, body_fn body) {
    signal(SIGALRM, SIG_DFL);
    alarm(CHILD_ALARM);
    rdv_group_t *g = NULL;
    uint32_t last = 0;
    int rc;
    int64_t until = now_ns() + 10 * SEC;
    static const uint8_t no_token[RDV_COLL_JOB_BYTES];
    while (job->mode == REFUSE && r == job->late && !in_call[GO] && now_ns() < until)
        usleep(20);
    while ((rc = rdv_coll_open(fd, r == 0, job->world, r, job->slot, no_token, &g, &last)) == -EAGAIN &&
           now_ns() < until)
        usleep(1000);
    if (rc) {
        fprintf(stderr, "coll stress: rank %u: rdv_coll_open: %d (%s)\n", r, rc, strerror(-rc));
        _exit(10);
    }
    close(fd);
    write_full(out, "o", 1);
    if (last && shm_unlink(shm_name) < 0) /* the group is complete: its name goes */
        fprintf(stderr, "coll stress: rank %u: shm_unlink: %s\n", r, strerror(errno));
    rdv_coll_set_timeout(g, CALL_TIMEOUT_NS);
    int64_t t0 = now_ns();
    do
        rc = rdv_coll_wait_joined(g, -1);
    while (rc == -EINPROGRESS && now_ns() - t0 < 20 * SEC);
    write_full(out, "j", 1);
    struct report rep;
    memset(&rep, 0, sizeof rep);
    rep.rank = r;
    rep.pid = (uint32_t)getpid();
    body(g, rc, job, r, &rep);
    write_full(out, "R", 1);
    write_full(out, &rep, sizeof rep);
    rdv_coll_free(g);
    _exit(0);
}

/* Read pipe r up to the tag want: 0, or -1 at its end. */
static int wait_tag(struct team *t, uint32_t r, char want) {
    while (t->stage[r] != want) {
        char c;
        if (t->in[r] < 0 || read_full(t->in[r], &c, 1) < 0)
            return -1;
        t->stage[r] = c;
    }
    return 0;
}

static int spawn(struct team *t, const struct job *job, body_fn body) {
    memset(t, 0, sizeof *t);
    t->job = job;
    int fd = shm_open(shm_name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        fail("shm_open %s: %s (a group's name left behind?)", shm_name, strerror(errno));
        return -1;
    }
    fflush(stdout);
    for (uint32_t r = 0; r < job->world; r++) {
        int p[2];
        pid_t pid;
        if (pipe(p) < 0 || (pid = fork()) < 0) {
            fprintf(stderr, "coll stress: fork: %s\n", strerror(errno));
            exit(2);
        }
        if (pid == 0) {
            close(p[0]);
            rank_main(fd, job, r, p[1], body);
        }
        add_kid(pid);
        close(p[1]);
        t->pid[r] = pid;
        t->in[r] = p[0];
        if (r == 0 && wait_tag(t, 0, 'o') < 0) /* rank 0 has created the group: the others may join */
            fail("rank 0 did not open the group");
    }
    close(fd);
    return 0;
}

/* Collect every rank's report (none from victim, which must have died of
 * SIGKILL) and wait for them all. */
static void finish(struct team *t, struct report *reps, int victim) {
    const struct job *job = t->job;
    for (uint32_t r = 0; r < job->world; r++) {
        memset(&reps[r], 0, sizeof reps[r]);
        if ((int)r != victim) {
            if (wait_tag(t, r, 'R') < 0 || read_full(t->in[r], &reps[r], sizeof reps[r]) < 0) {
                fail("mode %d W %u: rank %u sent no report", job->mode, job->world, r);
                reps[r].errors = 1;
            }
        }
        close(t->in[r]);
        int status = 0;
        waitpid(t->pid[r], &status, 0);
        drop_kid(t->pid[r]);
        if ((int)r == victim) {
            if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
                fail("the killed rank %u ended with status 0x%x", r, status);
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fail("mode %d W %u: rank %u ended with status 0x%x", job->mode, job->world, r, status);
        }
        if (reps[r].errors)
            fail("mode %d W %u slot %llu: rank %u: %u errors, first: %s", job->mode, job->world,
                 (unsigned long long)job->slot, r, reps[r].errors, reps[r].msg);
    }
}

/* Once every rank has joined the name is gone; remove it if it is not
 * (returns whether it was still there). */
static int name_left(void) { return shm_unlink(shm_name) == 0; }

/* ---- sections ----------------------------------------------------------- */

static uint64_t total_calls, checksum;

static void run_calls(int mode, uint32_t W, uint64_t slot, uint32_t ncalls, uint64_t seed) {
    struct job job = {.mode = mode, .world = W, .slot = slot, .seed = seed, .ncalls = ncalls};
    struct team t;
    struct report reps[MAXW];
    int64_t t0 = now_ns();
    if (spawn(&t, &job, body_calls) < 0)
        return;
    finish(&t, reps, -1);
    if (name_left())
        fail("W %u: the group's name was still there after every rank joined", W);
    uint64_t all = 0;
    for (uint32_t r = 0; r < W; r++) {
        if (reps[r].calls != ncalls || reps[r].mismatches != reps[0].mismatches || reps[r].cs_repl != reps[0].cs_repl)
            fail("%s W %u slot %llu: rank %u made %llu calls (%llu mismatches, replicated checksum %llx), rank 0 "
                 "%llu (%llu, %llx); expected %u calls",
                 mode == MIXED ? "mixed" : "mismatch", W, (unsigned long long)slot, r,
                 (unsigned long long)reps[r].calls, (unsigned long long)reps[r].mismatches,
                 (unsigned long long)reps[r].cs_repl, (unsigned long long)reps[0].calls,
                 (unsigned long long)reps[0].mismatches, (unsigned long long)reps[0].cs_repl, ncalls);
        all += reps[r].cs_all;
    }
    total_calls += reps[0].calls;
    checksum = mix64(checksum ^ all ^ reps[0].cs_repl);
    printf("coll stress: %s W %u slot %llu: %llu calls (%llu mismatches) in %.2f s, checksum %016llx\n",
           mode == MIXED ? "mixed" : "mismatch", W, (unsigned long long)slot, (unsigned long long)reps[0].calls,
           (unsigned long long)reps[0].mismatches, (double)(now_ns() - t0) / SEC, (unsigned long long)all);
}

static void kill_rounds(void) {
    uint64_t s = 0x6b696c6cULL;
    int64_t max_delay = 0, sum_delay = 0, t0 = now_ns();
    int delays = 0, mid_call = 0, early = 0, slow = 0;
    uint64_t calls = 0;
    for (int k = 0; k < KILL_ROUNDS; k++) {
        struct job job = {.mode = KILL, .world = 2 + (uint32_t)(k % 3), .slot = k % 4 == 3 ? SLOT_LARGE : SLOT_SMALL,
                          .seed = 0x1000 + (uint64_t)k};
        uint32_t W = job.world, victim = (uint32_t)(rng(&s) % W);
        job.actor = victim;
        int at_join = k % 5 == 4; /* killed as soon as it has opened: the others may still be joining */
        struct team t;
        struct report reps[MAXW];
        if (spawn(&t, &job, body_kill) < 0)
            return;
        if (at_join) {
            if (wait_tag(&t, victim, 'o') < 0)
                fail("kill round %d: the victim did not open", k);
            usleep((useconds_t)(rng(&s) % 3000));
        } else {
            for (uint32_t r = 0; r < W; r++)
                if (wait_tag(&t, r, 'j') < 0)
                    fail("kill round %d: rank %u did not join", k, r);
            usleep((useconds_t)(20000 + rng(&s) % 150000));
        }
        int64_t t_kill = now_ns();
        kill(t.pid[victim], SIGKILL);
        int was_in_call = 0;
        finish(&t, reps, (int)victim);
        was_in_call = (int)in_call[victim];
        in_call[victim] = 0;
        mid_call += was_in_call;
        early += at_join;
        int left = name_left();
        if (left && !at_join)
            fail("kill round %d: the group's name was still there", k);
        uint64_t lo = UINT64_MAX, hi = 0;
        for (uint32_t r = 0; r < W; r++) {
            if (r == victim)
                continue;
            const struct report *rp = &reps[r];
            int64_t delay = rp->t_ret - t_kill;
            if (rp->rc != -EPIPE || rp->st_rank != victim || rp->st_pid != (uint32_t)t.pid[victim] || rp->st_closed ||
                rp->rc2 != -EPIPE)
                fail("kill round %d (W %u, victim rank %u pid %d): rank %u returned %d (status rank %u pid %u closed "
                     "%u), then %d; expected -EPIPE naming the victim",
                     k, W, victim, (int)t.pid[victim], r, rp->rc, rp->st_rank, rp->st_pid, rp->st_closed, rp->rc2);
            if (delay < 0 || delay > HARD_LIMIT_NS)
                fail("kill round %d: rank %u returned %.3f s after the kill", k, r, (double)delay / SEC);
            if (delay > SOFT_LIMIT_NS)
                slow++;
            max_delay = delay > max_delay ? delay : max_delay;
            sum_delay += delay;
            delays++;
            lo = rp->calls < lo ? rp->calls : lo;
            hi = rp->calls > hi ? rp->calls : hi;
        }
        if (hi > lo + 1)
            fail("kill round %d: survivors completed %llu to %llu calls", k, (unsigned long long)lo,
                 (unsigned long long)hi);
        calls += hi;
    }
    total_calls += calls;
    printf("coll stress: kills: %d rounds (%d while joining, %d victims mid-call), %llu calls completed; survivors "
           "returned -EPIPE %.1f ms after the kill on average, %.1f ms at most (%d over 1 s) in %.2f s\n",
           KILL_ROUNDS, early, mid_call, (unsigned long long)calls, delays ? (double)sum_delay / delays / 1e6 : 0.0,
           (double)max_delay / 1e6, slow, (double)(now_ns() - t0) / SEC);
}

static void abort_rounds(void) {
    static const char *names[] = {"abort while the others wait", "abort mid-call", "leave while the others wait"};
    int64_t t0 = now_ns(), max_delay = 0;
    int rounds = 0;
    for (int variant = 0; variant < 3; variant++)
        for (uint32_t W = 2; W <= MAXW; W++) {
            struct job job = {.mode = ABORT, .world = W, .slot = SLOT_SMALL, .seed = 0xab0 + W * 3 + (uint64_t)variant,
                              .variant = variant, .actor = (W + (uint32_t)variant) % W};
            job.late = (job.actor + 1) % W;
            struct team t;
            struct report reps[MAXW];
            if (spawn(&t, &job, body_abort) < 0)
                return;
            finish(&t, reps, -1);
            if (name_left())
                fail("%s: the group's name was still there", names[variant]);
            rounds++;
            int64_t t_act = reps[job.actor].t_act;
            for (uint32_t r = 0; r < W; r++) {
                const struct report *rp = &reps[r];
                if (variant == 2 && r == job.actor)
                    continue; /* checked in the rank: -EBADF after leaving */
                int want = variant == 2 ? -EPIPE : -ECONNABORTED;
                if (rp->rc != want || rp->rc2 != want || rp->st_rank != job.actor ||
                    rp->st_pid != (uint32_t)t.pid[job.actor] || rp->st_closed != (variant == 2))
                    fail("%s (W %u, rank %u acts): rank %u returned %d (status rank %u pid %u closed %u), then %d; "
                         "expected %d",
                         names[variant], W, job.actor, r, rp->rc, rp->st_rank, rp->st_pid, rp->st_closed, rp->rc2,
                         want);
                int waited = !(r == job.actor && variant == 0) && !(variant == 1 && r == job.late);
                if (waited) { /* blocked when it happened: it must have noticed soon */
                    int64_t delay = rp->t_ret - t_act;
                    if (rp->t_start > t_act)
                        fail("%s (W %u): rank %u was not in its call yet", names[variant], W, r);
                    if (delay < 0 || delay > HARD_LIMIT_NS)
                        fail("%s (W %u): rank %u returned %.3f s after it", names[variant], W, r, (double)delay / SEC);
                    max_delay = delay > max_delay ? delay : max_delay;
                }
            }
        }
    printf("coll stress: abort/leave: %d groups, blocked ranks returned within %.1f ms, in %.2f s\n", rounds,
           (double)max_delay / 1e6, (double)(now_ns() - t0) / SEC);
}

/* A process of the same job refuses a join: the parent, while every rank
 * but the late one waits (variant 0: all get -ECONNABORTED, the late one
 * too when it opens), or just as the late one joins (variant 1: either the
 * refusal or the join wins, on every rank alike: never a group that formed
 * for some ranks and was refused for others). Another job's token cannot. */
static void refuse_rounds(void) {
    static const uint8_t no_token[RDV_COLL_JOB_BYTES], other_token[RDV_COLL_JOB_BYTES] = {1};
    uint64_t s = 0x72656675ULL;
    int64_t t0 = now_ns(), max_delay = 0;
    int refused = 0, formed = 0, rounds = 0;
    for (int k = 0; k < 40; k++) {
        int variant = k >= 4;
        struct job job = {.mode = REFUSE, .world = 2 + (uint32_t)(k % 3), .slot = SLOT_SMALL, .variant = variant};
        uint32_t W = job.world;
        job.late = W - 1;
        in_call[GO] = 0;
        struct team t;
        struct report reps[MAXW];
        if (spawn(&t, &job, body_refuse) < 0)
            return;
        for (uint32_t r = 0; r + 1 < W; r++)
            if (wait_tag(&t, r, 'o') < 0)
                fail("refuse round %d: rank %u did not open", k, r);
        if (variant)
            in_call[GO] = 1;
        usleep(variant ? (useconds_t)(rng(&s) % 400) : 50000);
        int64_t t_refuse = now_ns();
        int fd = shm_open(shm_name, O_RDWR, 0);
        int rc = fd < 0 ? -EALREADY : rdv_coll_refuse(fd, other_token, "other", 5);
        if (fd >= 0 && rc != -EREMCHG)
            fail("refuse round %d: a refusal with another job's token returned %d, not -EREMCHG", k, rc);
        if (fd >= 0)
            rc = rdv_coll_refuse(fd, no_token, refusal, sizeof refusal - 1);
        if (fd >= 0)
            close(fd);
        if (rc != 0 && rc != -EALREADY)
            fail("refuse round %d: rdv_coll_refuse returned %d", k, rc);
        if (!variant && rc)
            fail("refuse round %d: the refusal before the late rank opened returned %d", k, rc);
        in_call[GO] = 1;
        finish(&t, reps, -1);
        name_left();
        rounds++;
        refused += rc == 0;
        formed += rc != 0;
        for (uint32_t r = 0; r < W; r++) {
            const struct report *rp = &reps[r];
            if (rc == 0 && (rp->rc != -ECONNABORTED || rp->rc2 != -ECONNABORTED || rp->st_rank != RDV_COLL_OUTSIDER))
                fail("refuse round %d (W %u): refused, but rank %u returned %d (status rank %u), then %d", k, W, r,
                     rp->rc, rp->st_rank, rp->rc2);
            if (rc != 0 && (rp->rc != 0 || rp->rc2 != 0))
                fail("refuse round %d (W %u): formed first, but rank %u returned %d, then %d", k, W, r, rp->rc,
                     rp->rc2);
            if (rc == 0 && r != job.late) { /* waiting when it happened: it must have noticed soon */
                int64_t delay = rp->t_ret - t_refuse;
                if (delay > HARD_LIMIT_NS)
                    fail("refuse round %d: rank %u returned %.3f s after the refusal", k, r, (double)delay / SEC);
                max_delay = delay > max_delay ? delay : max_delay;
            }
        }
    }
    printf("coll stress: refusals: %d rounds, %d refused, %d formed first; waiting ranks returned within %.1f ms, "
           "in %.2f s\n", rounds, refused, formed, (double)max_delay / 1e6, (double)(now_ns() - t0) / SEC);
}

static int leftovers(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s", shm_name + 1);
    DIR *d = opendir("/dev/shm");
    int n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            fprintf(stderr, "coll stress: left in /dev/shm: %s\n", e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

int main(void) {
    snprintf(shm_name, sizeof shm_name, "/shmrdv-t-ccoll-%d", (int)getpid());
    in_call = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (in_call == MAP_FAILED)
        return 2;
    signal(SIGALRM, on_alarm);
    alarm(PARENT_ALARM);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int64_t t0 = now_ns();

    for (uint32_t W = 2; W <= MAXW; W++) {
        run_calls(MIXED, W, SLOT_SMALL, MIXED_CALLS, 0x5eed0000ULL + W);
        run_calls(MIXED, W, SLOT_LARGE, MIXED_CALLS, 0x5eed1000ULL + W);
    }
    for (uint32_t W = 2; W <= MAXW; W++)
        run_calls(MISMATCH, W, SLOT_SMALL, 2 * MISMATCH_PAIRS, 0xbade0000ULL + W);
    kill_rounds();
    abort_rounds();
    refuse_rounds();

    int left = leftovers();
    if (left)
        fail("%d entries left in /dev/shm", left);
    shm_unlink(shm_name);
    if (failures) {
        fprintf(stderr, "coll stress: FAILED (%d failures)\n", failures);
        return 1;
    }
    printf("coll stress ok: %llu calls, checksum %016llx, %.1f s\n", (unsigned long long)total_calls,
           (unsigned long long)checksum, (double)(now_ns() - t0) / SEC);
    return 0;
}
