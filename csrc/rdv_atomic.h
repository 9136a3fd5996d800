/* Every memory-ordering primitive shmrdv uses, in one place: on shared
 * memory, and on a handle's process-local counters and flags.
 *
 * Shared words are plain integers in a mapping that other processes see; the
 * GCC __atomic builtins work on them without _Atomic qualifiers, so the
 * shared structs keep a fixed, assertable layout. */
#ifndef RDV_ATOMIC_H
#define RDV_ATOMIC_H

#include <stdint.h>

/* Relaxed: no ordering, only freedom from tearing. */
#define READ_ONCE(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define WRITE_ONCE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

/* Release store publishes every earlier write; pairs with load_acquire. */
#define smp_store_release(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define smp_load_acquire(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define smp_load_seq_cst(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define smp_store_seq_cst(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)

/* Full barrier: orders an earlier store before a later load (Dekker-style
 * waiter flags need it on both sides). */
#define smp_mb() __atomic_thread_fence(__ATOMIC_SEQ_CST)

/* Read-modify-write; the ordering is named at each call site. */
#define rdv_cas(p, expected, desired, order)                                       \
    __atomic_compare_exchange_n((p), (expected), (desired), 0, (order), __ATOMIC_RELAXED)
#define rdv_fetch_add(p, v, order) __atomic_fetch_add((p), (v), (order))
#define rdv_fetch_or(p, v, order) __atomic_fetch_or((p), (v), (order))
#define rdv_fetch_and(p, v, order) __atomic_fetch_and((p), (v), (order))
#define rdv_exchange(p, v, order) __atomic_exchange_n((p), (v), (order))

static inline void rdv_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

#endif
