/* Layer 2: waiting for a shared word to change (an event count: a bounded
 * adaptive spin, then a futex sleep), deadlines, and the abort flag that
 * ends every wait. */
#ifndef RDV_WAIT_H
#define RDV_WAIT_H

#include <stdint.h>

#include "rdv_handle.h"

struct rdv_deadline {
    int forever;
    int64_t at_ns; /* CLOCK_MONOTONIC; 0 for a zero timeout, which reads no clock */
};

void rdv_deadline_init(struct rdv_deadline *d, int64_t timeout_ns);
/* 0 with the time left (INT64_MAX when forever), or -ETIMEDOUT. */
int rdv_deadline_left(const struct rdv_deadline *d, int64_t *left_ns);
/* The two above with the clock read already (now_ns, a moment ago). A
 * receiver that is about to wait reads it once for all of them: each
 * reading costs ~16 ns, and a send that comes meanwhile waits for them. */
void rdv_deadline_init_at(struct rdv_deadline *d, int64_t timeout_ns, int64_t now_ns);
int rdv_deadline_left_at(const struct rdv_deadline *d, int64_t now_ns, int64_t *left_ns);
/* Aborted, or this handle's segment was truncated under it: either ends every wait. */
int rdv_is_aborted(const rdv_t *h);

/* Wait until *kword differs from seen (or spuriously); 0, -ETIMEDOUT or
 * -EINTR. Callers re-check their condition either way. *ksleepers counts
 * the waiters (about to be) asleep on kword, so wakers skip the syscall
 * when it is 0. */
int rdv_wait_change(rdv_t *h, uint32_t *kword, uint32_t *ksleepers, uint32_t seen,
                    const struct rdv_deadline *d);
/* rdv_wait_change with the clock read already (now_ns, a moment ago). */
int rdv_wait_change_at(rdv_t *h, uint32_t *kword, uint32_t *ksleepers, uint32_t seen,
                       const struct rdv_deadline *d, int64_t now_ns);
void rdv_wake_all(uint32_t *kword, uint32_t *ksleepers);
/* The two halves of rdv_wake_all, so a wake syscall can be made after a
 * lock is dropped: a woken receiver that preempts us (same CPU) must not
 * find the lock still held. */
void rdv_wake_bump(uint32_t *kword);
void rdv_wake_sleepers(uint32_t *kword, uint32_t *ksleepers);
/* A receiver's note of whether the message it got came from its own CPU:
 * spinning for a peer that needs our CPU only delays it. */
void rdv_wait_note_sender(rdv_t *h, uint32_t sender_cpu);

#endif
