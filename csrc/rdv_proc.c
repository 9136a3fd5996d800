/* The process table: registering a handle, telling whether the process
 * behind an entry is alive, and reclaiming what a dead one held — without a
 * daemon. Any process may reclaim a dead entry: it takes the entry's byte
 * lock (so its own death mid-way is as visible as the first one was) and
 * acts under the dead entry's identity while it repairs:
 *   - slot locks the dead process held: the slot's queue is rebuilt from the
 *     blocks themselves, keeping every QUEUED message (a message whose send
 *     had linked it survives; one it was still writing is dropped);
 *   - its ins_lock and island_lock holds;
 *   - its waits: waiter and sleeper counts go back down;
 *   - a producer-mark change it was making: rolled back unless its commit
 *     happened (rdv_mark.c);
 *   - views it took with rdv_recv_leased go back to the head of their keys
 *     (rdv_lease.c);
 *   - its other blocks: views it held (DELIVERED) and blocks it was writing
 *     (WRITING) are freed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rdv_atomic.h"
#include "rdv_layout.h"

/* The one-byte range of the segment file that stands for process entry i. */
static struct flock entry_byte(uint32_t entry, short type) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = entry;
    fl.l_len = 1;
    return fl;
}

static int byte_lock(int fd, uint32_t entry, short type) {
    struct flock fl = entry_byte(entry, type);
    return fcntl(fd, F_OFD_SETLK, &fl) < 0 ? -errno : 0;
}

/* Whether an open file description other than ours holds entry's byte. */
static int held_by_another(rdv_t *h, uint32_t entry) {
    struct flock fl = entry_byte(entry, F_WRLCK);
    if (fcntl(h->fd, F_OFD_GETLK, &fl) < 0)
        return 1; /* cannot tell: never reclaim on a guess */
    return fl.l_type != F_UNLCK;
}

/* Act for entry: claim it among our threads (rdv.reclaiming), then take its
 * byte lock. 0 on success; -EBUSY if one of our threads (maybe this one,
 * further up the stack) or another process holds it, or it is registered. */
static int take_entry(rdv_t *h, uint32_t entry) {
    /* acquire, process-local: pairs with the release in give_back_entry, so
     * what the previous thread of ours did for the entry happens before us */
    if (rdv_exchange(&h->reclaiming[entry], 1, __ATOMIC_ACQUIRE))
        return -EBUSY;
    if (byte_lock(h->fd, entry, F_WRLCK) == 0)
        return 0;
    __atomic_store_n(&h->reclaiming[entry], 0, __ATOMIC_RELEASE); /* as in give_back_entry */
    return -EBUSY;
}

static void give_back_entry(rdv_t *h, uint32_t entry) {
    byte_lock(h->fd, entry, F_UNLCK);
    /* release, process-local: our work on the entry happens before the next
     * thread of ours that claims it */
    __atomic_store_n(&h->reclaiming[entry], 0, __ATOMIC_RELEASE);
}

int rdv_proc_alive(rdv_t *h, uint32_t entry) {
    /* relaxed, process-local: a thread of ours acting for the entry (a dead
     * one being reclaimed) is as good as its process for lock waiters */
    return entry == h->me ||
           (entry < RDV_MAX_PROCS && __atomic_load_n(&h->reclaiming[entry], __ATOMIC_RELAXED)) ||
           held_by_another(h, entry);
}

static int claim_free_entry(rdv_t *h) {
    for (uint32_t i = 0; i < RDV_MAX_PROCS; i++) {
        struct rdv_proc *p = &h->kprocs[i];
        /* acquire: pairs with the release of FREE in unregister/reclaim */
        if (smp_load_acquire(&p->state) != RDV_PROC_FREE || byte_lock(h->fd, i, F_WRLCK) < 0)
            continue;
        /* The byte lock makes the entry ours alone; re-check under it. */
        if (smp_load_acquire(&p->state) != RDV_PROC_FREE) {
            byte_lock(h->fd, i, F_UNLCK);
            continue;
        }
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        p->pid = (uint32_t)getpid();
        p->attached_ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
        memset(p->waits, 0, sizeof p->waits);
        p->mark_state = 0; /* zero already, unless damaged: no change of ours in flight */
        h->me = i;
        /* release: publishes pid and the cleared records to readers of state */
        smp_store_release(&p->state, RDV_PROC_ALIVE);
        return 0;
    }
    return -EUSERS;
}

int rdv_proc_register(rdv_t *h) {
    int rc = claim_free_entry(h);
    h->acting = rc < 0; /* a full table: reclaim the dead as each of them */
    rdv_proc_reclaim_dead(h, NULL); /* attaching is when the dead get noticed */
    if (rc < 0)
        rc = claim_free_entry(h);
    h->acting = 0;
    return rc;
}

static void reclaim_entry(rdv_t *h, uint32_t dead);

void rdv_proc_unregister(rdv_t *h) {
    /* Our calls and views are all gone (refs reached 0), but a block we
     * reserved and never committed or discarded would stay: reclaim our own
     * entry as we would a dead one's. */
    reclaim_entry(h, h->me);
    /* release: our last accesses through the entry happen before reuse */
    smp_store_release(&h->kprocs[h->me].state, RDV_PROC_FREE);
    byte_lock(h->fd, h->me, F_UNLCK);
}

int rdv_proc_reclaim_dead(rdv_t *h, uint32_t *reclaimed) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < RDV_MAX_PROCS; i++) {
        struct rdv_proc *p = &h->kprocs[i];
        /* relaxed: a first look; the byte lock below decides */
        if ((i == h->me && !h->acting) || READ_ONCE(p->state) == RDV_PROC_FREE ||
            held_by_another(h, i))
            continue;
        if (take_entry(h, i) < 0)
            continue; /* somebody registered or is reclaiming it right now */
        /* acquire: pairs with the release of ALIVE/FREE */
        uint32_t st = smp_load_acquire(&p->state);
        if (st != RDV_PROC_FREE) {
            uint32_t r = __atomic_fetch_add(&h->reaped, 1, __ATOMIC_RELAXED); /* process-local */
            if (r < 16)
                h->reaped_pids[r] = READ_ONCE(p->pid);
            WRITE_ONCE(p->state, RDV_PROC_RECLAIMING); /* for shmrdv ls */
            if (h->acting)
                h->me = i; /* no entry of our own yet: its steps are recorded as its */
            reclaim_entry(h, i);
            /* release: the repairs above happen before the entry is reused */
            smp_store_release(&p->state, RDV_PROC_FREE);
            n++;
        }
        give_back_entry(h, i);
    }
    if (reclaimed)
        *reclaimed = n;
    return 0;
}

static void reclaim_locks(rdv_t *h, uint32_t dead);

/* Called by a lock waiter that has spun a while on a lock `holder` holds. */
void rdv_lock_holder_check(rdv_t *h, uint32_t *klock, uint32_t holder) {
    uint32_t entry = holder - 1;
    if (holder > RDV_MAX_PROCS) {
        uint32_t expected = holder;
        /* release: a lock word naming no entry at all is damage; free it */
        rdv_cas(klock, &expected, 0, __ATOMIC_RELEASE);
        return;
    }
    if (rdv_proc_alive(h, entry))
        return;
    rdv_proc_reclaim_dead(h, NULL);
    /* A lock naming a FREE entry (damage, or a holder reclaimed without its
     * locks being found) is repaired on its own, under that entry's byte lock. */
    if (READ_ONCE(*klock) == holder && take_entry(h, entry) == 0) {
        /* acquire: pairs with the release of FREE */
        if (smp_load_acquire(&h->kprocs[entry].state) == RDV_PROC_FREE)
            reclaim_locks(h, entry);
        give_back_entry(h, entry);
    }
}

/* ---- wait records ----------------------------------------------------------*/

uint32_t *rdv_wait_record(rdv_t *h, uint32_t slot_idx) {
    struct rdv_proc *p = &h->kprocs[h->me];
    for (int i = 0; i < RDV_PROC_WAITS; i++) {
        uint32_t empty = 0;
        /* relaxed: only our own threads write our records, and only a
         * reclaimer (after our death, holding our byte lock) reads them */
        if (rdv_cas(&p->waits[i], &empty, slot_idx + 1, __ATOMIC_RELAXED))
            return &p->waits[i];
    }
    return NULL; /* more concurrent waits than records: this one is not covered */
}

void rdv_wait_unrecord(uint32_t *krecord) {
    if (krecord)
        WRITE_ONCE(*krecord, 0); /* relaxed: see rdv_wait_record */
}

/* ---- reclaiming a dead entry ------------------------------------------------*/

/* Take a lock word the dead process may hold, as that process. */
static void lock_as(uint32_t *klock, uint32_t who) {
    for (;;) {
        uint32_t cur = READ_ONCE(*klock);
        /* acquire: as in rdv_slot_lock */
        if ((cur == 0 || cur == who) && rdv_cas(klock, &cur, who, __ATOMIC_ACQUIRE))
            return;
        rdv_cpu_relax();
    }
}

static int message_key_matches(rdv_t *h, const struct rdv_msg *m, const struct rdv_slot *s) {
    if (m->ndim > RDV_NDIM_MAX || m->key_len == 0 || m->key_len > RDV_KEY_MAX ||
        m->key_len != s->key_len)
        return 0;
    const char *key = (const char *)(m + 1) + 16ull * m->ndim;
    uint64_t h1, h2;
    rdv_hash_key(h, key, m->key_len, &h1, &h2);
    return h1 == s->h1 && h2 == s->h2;
}

/* The side table is nonzero only at block starts: the walk skips the rest. */
struct rdv_msg *rdv_next_block(rdv_t *h, uint64_t *pos, uint64_t end) {
    for (; *pos < end; *pos += RDV_GRANULE) {
        /* relaxed: a first look; rdv_block_at re-checks with acquire */
        if (!READ_ONCE(h->kside[rdv_granule_of(h, *pos)]))
            continue;
        uint64_t len;
        struct rdv_msg *m = rdv_block_at(h, *pos, &len);
        if (m)
            return m;
    }
    return NULL;
}

void rdv_msg_requeue(struct rdv_msg *m) {
    /* relaxed, then release twice: the releases keep the stage store ahead
     * of the other two against our death (a cut in program order): QUEUED
     * first, so that whoever repairs after us still sees a block to keep
     * (QUEUED, or leased by the dead), never a view it would free */
    WRITE_ONCE(m->stage, RDV_MSG_QUEUED);
    smp_store_release(&m->flags, 0);
    smp_store_release(&m->owner, 0);
}

/* Append the block at granule g + 1 to a queue being rebuilt, as QUEUED. */
static void rebuild_append(uint32_t g1, struct rdv_msg *m, uint32_t *head, struct rdv_msg **last,
                           uint32_t *n) {
    if (*last)
        (*last)->next = g1;
    else
        *head = g1;
    *last = m;
    rdv_msg_requeue(m);
    (*n)++;
}

/* Rebuild a slot's queue after its lock holder died: keep the QUEUED
 * messages reachable from q_head, in order, then append any message the dead
 * process had marked QUEUED but not yet linked. A block the dead leased that
 * is still reachable (a leased pop it had not finished unlinking, or leased
 * messages its reclaimer was putting back, see rdv_lease.c) stays where it
 * is, queued again: what reclaiming the lease would have done. */
static void repair_slot(rdv_t *h, uint32_t idx, uint32_t dead) {
    struct rdv_slot *s = &h->kslots[idx];
    if (s->state != RDV_SLOT_LIVE)
        return; /* died inserting it, before it was published */
    uint32_t head = 0, n = 0;
    struct rdv_msg *last = NULL;
    uint32_t g = s->q_head;
    for (uint64_t steps = 0; g && steps < h->cap / RDV_GRANULE; steps++) {
        uint64_t len;
        struct rdv_msg *m = rdv_queued_msg(h, g, &len);
        if (!m)
            break; /* the chain is broken here */
        uint32_t next = m->next;
        if (m->stage == RDV_MSG_QUEUED || rdv_msg_leased_by(m, dead + 1))
            rebuild_append(g, m, &head, &last, &n);
        /* else: a pop the dead process started; its block is freed as its own */
        g = next;
    }
    /* Messages it was linking: QUEUED, still owned by it, keyed here. */
    uint64_t hd = smp_load_acquire(&h->khdr->c_head), t = READ_ONCE(h->khdr->p_tail);
    struct rdv_msg *m;
    for (uint64_t pos = hd; (m = rdv_next_block(h, &pos, t)); pos += RDV_GRANULE)
        if (m->stage == RDV_MSG_QUEUED && m->owner == dead + 1 && message_key_matches(h, m, s))
            rebuild_append((uint32_t)rdv_granule_of(h, pos) + 1, m, &head, &last, &n);
    if (last)
        last->next = 0;
    s->q_head = head;
    s->q_tail = last ? (uint32_t)rdv_granule_of(h, last->pos) + 1 : 0;
    s->count = n;
}

/* Islands after the island_lock holder died in pin_head: an island whose
 * block is still in the ring was never stepped over (drop it); one whose
 * block sits at the head with its entry claimed needs the head moved on. */
static void repair_islands(rdv_t *h) {
    struct rdv_header *khdr = h->khdr;
    for (int i = 0; i < RDV_MAX_ISLANDS; i++) {
        uint64_t w = READ_ONCE(khdr->islands[i]);
        if (!w)
            continue;
        uint64_t off = rdv_island_off(w);
        uint64_t len = rdv_island_len(w);
        struct rdv_msg *m = rdv_msg_at(h, off);
        /* acquire/relaxed: the ring window (we hold island_lock; pins wait) */
        uint64_t hd = smp_load_acquire(&khdr->c_head), t = READ_ONCE(khdr->p_tail);
        if (off >= h->cap || m->pos % h->cap != off) {
            WRITE_ONCE(khdr->islands[i], 0); /* not a block at all */
        } else if (m->pos - hd < t - hd) { /* still in the ring window */
            if (READ_ONCE(h->kside[rdv_granule_of(h, m->pos)]) != 0)
                WRITE_ONCE(khdr->islands[i], 0); /* the pin never claimed it */
            else if (m->pos == hd)
                /* release: as in pin_head; the island is already visible */
                rdv_cas(&khdr->c_head, &hd, hd + len, __ATOMIC_RELEASE);
        }
    }
}

/* Slot, ins and island locks the dead entry held: repair, then let go.
 * Inserts hold ins_lock around a slot lock, so slots come first. */
static void reclaim_locks(rdv_t *h, uint32_t dead) {
    struct rdv_header *khdr = h->khdr;
    uint32_t who = dead + 1;
    for (uint64_t i = 0; i <= h->slot_mask; i++) {
        struct rdv_slot *s = &h->kslots[i];
        /* relaxed: a lock naming the dead changes only through us (we act as it) */
        if (READ_ONCE(s->lock) == who) {
            repair_slot(h, (uint32_t)i, dead);
            rdv_index_maybe_delete(h, (uint32_t)i);
            /* The dead may have queued messages and died before waking the
             * receivers: wake them, under the lock, so that if we die first
             * the lock still names the dead and the next repair wakes them. */
            if (s->state == RDV_SLOT_LIVE && s->waiters)
                rdv_wake_all(&s->seq, &s->sleepers);
            rdv_slot_unlock(&s->lock);
        }
    }
    for (uint64_t i = 0; i <= h->slot_mask; i++) {
        uint32_t expected = who;
        /* release: as rdv_slot_unlock */
        rdv_cas(&h->kslots[i].ins_lock, &expected, 0, __ATOMIC_RELEASE);
    }
    if (READ_ONCE(khdr->island_lock) == who) {
        repair_islands(h);
        rdv_slot_unlock(&khdr->island_lock);
    }
}

static void reclaim_entry(rdv_t *h, uint32_t dead) {
    struct rdv_header *khdr = h->khdr;
    uint32_t who = dead + 1;
    /* 1. Its locks, and an arena step it was in the middle of. */
    reclaim_locks(h, dead);
    rdv_arena_recover_op(h, dead);
    /* 1b. A mark change it was making: decided from the block it was
     * committing, so only now that repair has kept (QUEUED) or dropped
     * (still WRITING) a message it was linking, and before step 3 frees its
     * WRITING blocks. */
    rdv_mark_recover(h, dead);
    /* 2. Its waits. */
    struct rdv_proc *p = &h->kprocs[dead];
    for (int i = 0; i < RDV_PROC_WAITS; i++) {
        uint32_t rec = READ_ONCE(p->waits[i]); /* relaxed: the dead process's own record */
        uint32_t idx = (rec & ~RDV_WAIT_SLEEPING) - 1;
        if (!rec || idx > h->slot_mask)
            continue;
        struct rdv_slot *s = &h->kslots[idx];
        lock_as(&s->lock, who);
        if (s->waiters)
            s->waiters--;
        /* release: as a waiter's own decrement after its futex sleep */
        if ((rec & RDV_WAIT_SLEEPING) && READ_ONCE(s->sleepers))
            rdv_fetch_add(&s->sleepers, (uint32_t)-1, __ATOMIC_RELEASE);
        rdv_index_maybe_delete(h, (uint32_t)idx);
        rdv_slot_unlock(&s->lock);
        WRITE_ONCE(p->waits[i], 0); /* relaxed: the entry is reused only after our release of FREE */
    }
    /* 3. Its leased views go back to their keys. */
    rdv_lease_recover(h, dead);
    /* 4. Its other blocks: views it held, blocks it was writing (the window:
     * acquire on the head as everywhere, the tail only bounds the walk). */
    uint64_t hd = smp_load_acquire(&khdr->c_head), t = READ_ONCE(khdr->p_tail);
    struct rdv_msg *m;
    for (uint64_t pos = hd; (m = rdv_next_block(h, &pos, t)); pos += RDV_GRANULE)
        if (m->owner == who && (m->stage == RDV_MSG_WRITING || m->stage == RDV_MSG_DELIVERED))
            rdv_arena_free(h, pos);
    for (int i = 0; i < RDV_MAX_ISLANDS; i++) {
        uint64_t w = READ_ONCE(khdr->islands[i]); /* relaxed: rdv_arena_free re-checks under island_lock */
        uint64_t off = rdv_island_off(w);
        if (!w || off >= h->cap)
            continue;
        struct rdv_msg *m = rdv_msg_at(h, off);
        if (m->pos % h->cap == off && m->owner == who && m->stage == RDV_MSG_DELIVERED)
            rdv_arena_free(h, m->pos); /* unpins it */
    }
}

/* ---- inspection ---------------------------------------------------------------*/

static void count_holding(struct rdv_proc_info *pi, const struct rdv_msg *m, uint64_t len) {
    if (m->owner != pi->entry + 1)
        return;
    if (m->stage == RDV_MSG_DELIVERED) {
        pi->views++;
        pi->view_bytes += len;
    } else if (m->stage == RDV_MSG_WRITING) {
        pi->writing++;
    }
}

int rdv_procs_impl(rdv_t *h, struct rdv_proc_info *out, uint32_t cap, uint32_t *n) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < RDV_MAX_PROCS && k < cap; i++) {
        struct rdv_proc *p = &h->kprocs[i];
        /* acquire: pairs with the release of ALIVE; a snapshot for humans */
        uint32_t st = smp_load_acquire(&p->state);
        if (st == RDV_PROC_FREE)
            continue;
        struct rdv_proc_info *pi = &out[k++];
        memset(pi, 0, sizeof *pi);
        pi->entry = i;
        pi->pid = READ_ONCE(p->pid); /* relaxed, below too: a snapshot for humans */
        pi->state = st;
        pi->alive = (uint32_t)rdv_proc_alive(h, i);
        pi->attached_ns = READ_ONCE(p->attached_ns);
        for (int w = 0; w < RDV_PROC_WAITS; w++)
            pi->waits += READ_ONCE(p->waits[w]) != 0;
    }
    /* acquire/relaxed: the ring window for the walk below, a snapshot */
    uint64_t hd = smp_load_acquire(&h->khdr->c_head), t = READ_ONCE(h->khdr->p_tail);
    const struct rdv_msg *m;
    for (uint64_t pos = hd; (m = rdv_next_block(h, &pos, t)); pos += RDV_GRANULE) {
        uint64_t len;
        if (rdv_arena_check_busy(h, pos, &len) == 0)
            for (uint32_t j = 0; j < k; j++)
                count_holding(&out[j], m, len);
    }
    for (int i = 0; i < RDV_MAX_ISLANDS; i++) {
        uint64_t w = READ_ONCE(h->khdr->islands[i]); /* relaxed: a snapshot */
        uint64_t off = rdv_island_off(w);
        if (!w || off >= h->cap)
            continue;
        const struct rdv_msg *m = rdv_msg_at(h, off);
        for (uint32_t j = 0; j < k && m->pos % h->cap == off; j++)
            count_holding(&out[j], m, rdv_island_len(w));
    }
    *n = k;
    return 0;
}

uint32_t rdv_reaped(rdv_t *h, uint32_t *pids, uint32_t cap) {
    uint32_t n = __atomic_load_n(&h->reaped, __ATOMIC_RELAXED); /* process-local */
    for (uint32_t i = 0; i < n && i < cap && i < 16; i++)
        pids[i] = h->reaped_pids[i];
    return n;
}
