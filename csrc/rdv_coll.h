/* Layer 10: a group's segment, as the collectives lay it out (rdv_coll.c).
 * A group does not live in a rendezvous: its segment is its own, made of
 * the OS layer alone (mapping, futexes, byte locks for liveness).
 *
 *   page 0          struct rdv_coll_hdr
 *   page 1..        struct rdv_coll_rank[world]   (two cache lines each)
 *   then            per rank, its abort reason: length, the ranks it waited
 *                   for (a timeout's), text (REASON_STRIDE bytes, rdv_coll.c)
 *   then            per rank, two data buffers of slot_bytes (by phase parity)
 *
 * Joining: the creator writes the header (its job token too) and publishes
 * the magic last; each joiner checks it, takes its rank's liveness lock and
 * slot, then counts itself in joined. A process of the same job that
 * conflicts (another world size, a rank taken, a second rank 0) refuses
 * the join: it sets RDV_COLL_REFUSED in joined while the count is short,
 * so no later join completes it, then breaks the state (rdv_coll_refuse).
 *
 * Every collective is a sequence of phases, numbered alike on every rank.
 * In phase P a rank writes what it shares into its buffer of parity P
 * ("produce"), publishes arrive = P + 1, waits until every rank's arrive
 * is past P, then reads the others' parity-P buffers ("consume"), where it
 * may also write its own parity P + 1 buffer. A buffer of parity P is
 * therefore written again only in phase P + 2, after every rank has
 * arrived at P + 1, that is, after every reader of it is done. */
#ifndef RDV_COLL_H
#define RDV_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "shmrdv.h"

#define RDV_COLL_MAGIC 0x6c6c6f6376647273ULL /* "srdvcoll" */
#define RDV_COLL_VERSION 2
#define RDV_COLL_PAGE 4096

/* hdr.state: what | rank << 8 | flags << 16, RUNNING until it changes once */
#define RDV_COLL_RUNNING 0
#define RDV_COLL_ABORTED 1 /* by rank (reason in its reason area), or RDV_COLL_OUTSIDER (shmrdv.h) */
#define RDV_COLL_LOST 2    /* rank (its pid in its slot) died or closed */
#define RDV_COLL_FLAG_CLOSED 1u     /* LOST: the rank closed rather than died */
#define RDV_COLL_FLAG_TIMED_OUT 1u  /* ABORTED: the rank gave up at its timeout (missing in its reason area) */

/* hdr.joined: the count of ranks that have joined, and this bit once a
 * process that conflicts with the group (same job, another world size, a
 * rank taken, a second rank 0) refused its join: set only while the count
 * is short of world, so a group either forms or is refused, never both. */
#define RDV_COLL_REFUSED 0x80000000u

/* hdr.outsider_claim */
#define RDV_COLL_CLAIM_FREE 0
#define RDV_COLL_CLAIM_WRITING 1   /* claimed; a claimer that dies here leaves it unread */
#define RDV_COLL_CLAIM_PUBLISHED 2 /* outsider_len and outsider_reason are whole */

/* rank.state */
#define RDV_COLL_RANK_FREE 0
#define RDV_COLL_RANK_JOINED 1
#define RDV_COLL_RANK_CLOSED 2

struct rdv_coll_hdr {
    uint64_t magic; /* written last by the creator (release) */
    uint32_t version;
    uint32_t world;
    uint64_t slot_bytes;
    uint64_t total_bytes;
    uint8_t job[RDV_COLL_JOB_BYTES]; /* the creator's job token: who may join, or refuse the join */
    uint32_t joined;        /* ranks that have joined | RDV_COLL_REFUSED: a futex word */
    uint32_t join_sleepers; /* waiters asleep on joined */
    uint32_t state;         /* RDV_COLL_RUNNING, then ABORTED or LOST once */
    /* why a process that is no member refused the join: the first to claim
     * the record writes it; the others refuse without a reason */
    uint32_t outsider_claim; /* RDV_COLL_CLAIM_* */
    uint32_t outsider_len;
    char outsider_reason[RDV_REASON_MAX];
};

/* What a rank's call is, for the check that every rank makes the same. */
struct rdv_coll_desc {
    uint32_t what; /* kind | op << 8 | dtype << 16 */
    uint32_t root;
    uint64_t nbytes;
    uint64_t shape_hash;
};

struct rdv_coll_rank {
    /* line 0: written by the rank, read by every other */
    uint32_t arrive; /* phases published: a futex word */
    uint32_t cpu;    /* 1 + the CPU it last arrived from: a hint */
    struct rdv_coll_desc desc[2]; /* of the call that starts at a phase, by parity */
    uint8_t pad0[64 - 8 - 2 * sizeof(struct rdv_coll_desc)];
    /* line 1: written by waiters and at join */
    uint32_t sleepers; /* waiters asleep on arrive */
    uint32_t pid;
    uint32_t state; /* RDV_COLL_RANK_* */
    uint8_t pad1[64 - 12];
};

_Static_assert(sizeof(struct rdv_coll_rank) == 128, "two cache lines per rank");
_Static_assert(offsetof(struct rdv_coll_rank, sleepers) == 64, "the waiters' line is the second");
_Static_assert(offsetof(struct rdv_coll_hdr, job) == 32, "job token after the sizes");
_Static_assert(offsetof(struct rdv_coll_hdr, joined) == 48, "joined after the job token");
_Static_assert(offsetof(struct rdv_coll_hdr, state) == 56, "the state word every call reads");
_Static_assert(offsetof(struct rdv_coll_hdr, outsider_reason) == 68, "the outsider's reason last");
_Static_assert(sizeof(struct rdv_coll_hdr) <= RDV_COLL_PAGE, "the header fits its page");

/* One collective call, as this rank makes it (rdv_coll_run's arguments). */
struct rdv_coll_call {
    uint32_t kind;
    uint32_t op;
    uint32_t dtype;
    uint32_t root;
    uint64_t nbytes;
    uint64_t shape_hash;
    const void *src;
    void *dst;
    int64_t timeout_ns;
};

/* Byte of the segment file whose lock says rank r is alive. */
#define RDV_COLL_LIVE_BYTE(r) (1 + (uint64_t)(r))

#endif
