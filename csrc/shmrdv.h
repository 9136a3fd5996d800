/* shmrdv public C API. Plain declarations only: this header doubles as the
 * cffi cdef (see shmrdv/_build.py), so it holds no includes and no macros
 * other than integer constants.
 *
 * Every function returns 0 or a negative errno; shmrdv/_binding.py maps the
 * codes to Python exceptions in one place. */

#define RDV_KEY_MAX 4096
#define RDV_NDIM_MAX 32
#define RDV_DTYPE_MAX 24
#define RDV_REASON_MAX 1024
#define RDV_NAME_MAX 200
/* Keys a rendezvous may hold live at once (its max_keys), at most. */
#define RDV_MAX_KEYS 16777216
#define RDV_MAX_MARKS 64
/* The largest arena a rendezvous can have: 2^36 - 4096 bytes (64 GiB less a
 * page), so that every granule index fits RDV_GRANULE_BITS (rdv_layout.h).
 * Arena sizes are multiples of 4096 bytes. */
#define RDV_MAX_ARENA_BYTES 68719472640
/* Handles attached to one segment at once: the size of its process table
 * (rdv_layout.h); rdv_procs never reports more. */
#define RDV_MAX_PROCS 128
/* The shared layout's version: attach refuses a segment of another one. It
 * sits at byte 8 of every segment (after the magic), in every version. */
#define RDV_LAYOUT_VERSION 9
/* A timeout of this many nanoseconds or more (about 146 years) waits
 * forever, as a negative one does: no deadline arithmetic overflows. */
#define RDV_FOREVER_NS 4611686018427387904

typedef struct rdv rdv_t;

/* What a receiver learns about one message; copied out of shared memory and
 * bounds-checked, so Python never reads the block header itself. */
struct rdv_msg_info {
    void *payload;        /* start of the payload inside this process's mapping */
    uint64_t nbytes;      /* payload length */
    uint64_t pos;         /* the block's position: the handle for release */
    /* The descriptor: from ndim to the end of dims[2 * ndim], contiguous, so
     * a caller can use its bytes as a cache key. */
    uint32_t ndim;
    uint32_t dtype_len;
    char dtype[32];       /* numpy dtype.str, zero-padded */
    int64_t dims[64];     /* shape[ndim], then strides[ndim] */
};

struct rdv_stats {
    uint64_t pending_messages;
    uint64_t keys;
    uint64_t waiters;
    uint64_t bytes_used;   /* in message blocks: queued, being written, held as views */
    uint64_t bytes_free;   /* capacity - bytes_used - waiter_bytes */
    uint64_t largest_free; /* the largest free block: no message needing more fits now */
    uint64_t live_blocks;  /* message blocks */
    uint64_t waiter_bytes; /* in slabs of waiter records (receivers that wait in line) */
    uint64_t capacity;
    uint64_t max_keys;
    uint32_t aborted;
    /* Leased messages whose receiver died and that could not go back to
     * their key because the key index was full: freed instead (see
     * rdv_recv_leased). Counted since the segment was created. */
    uint32_t leases_dropped;
    /* Live keys as max_keys counts them: keys, unless an insert or delete is
     * in progress (a check on the crash-safe count). */
    uint64_t keys_counted;
    uint32_t flags; /* RDV_CREATE_* its creator asked for */
};

/* Lifecycle. fd is an open POSIX shm object; the caller closes it afterwards. */
int rdv_create(int fd, uint64_t arena_size, uint64_t max_keys, rdv_t **out);
/* rdv_create with flags: RDV_CREATE_HUGE_PAGES maps the segment, in the
 * creator and in every process that attaches, with transparent huge pages
 * advised (MADV_HUGEPAGE) before its pages are faulted in: huge if the
 * file system gives them (tmpfs mounted huge=always, within_size or
 * advise). -EOPNOTSUPP if the kernel has no transparent huge pages. */
#define RDV_CREATE_HUGE_PAGES 1
/* RDV_CREATE_NO_PREFAULT: map the segment, in the creator and in every
 * process that attaches, without faulting its pages in up front (by
 * default each mapping faults in all of it at once: creating 256 MiB takes
 * ~150 ms instead of ~50, attaching ~30 ms instead of ~6). The pages are
 * still reserved, so a full /dev/shm fails the create, never a later
 * write; each page is faulted in by its first touch instead, at several
 * times a copy's cost. For a segment large for what touches it, or one
 * that must be ready at once (a data loader's arena). Not with
 * RDV_CREATE_HUGE_PAGES (-EINVAL): faulting pages in as advised is what
 * makes them huge. */
#define RDV_CREATE_NO_PREFAULT 2
int rdv_create_flags(int fd, uint64_t arena_size, uint64_t max_keys, uint32_t flags, rdv_t **out);
/* Bytes of /dev/shm a new segment with this arena and max_keys takes (its
 * file's size: arena, side table, key index, header, process table, home
 * slabs); 0 if no segment can have them. */
uint64_t rdv_segment_bytes(uint64_t arena_size, uint64_t max_keys);
/* Where this handle maps its segment: for a caller that asks the kernel how
 * the mapping is backed (/proc/self/smaps). */
void rdv_mapping(rdv_t *h, uint64_t *base, uint64_t *len);
int rdv_attach(int fd, rdv_t **out);
/* Whether any process has the segment in fd attached or is creating it,
 * read from the byte locks the kernel drops when a process dies, without
 * mapping it: 1 (also when it cannot tell), or 0: nobody will use it again
 * unless someone attaches by its name. */
int rdv_segment_in_use(int fd);
/* Drop this handle's own reference. The mapping stays until every view and
 * every call in flight has let go of it (see rdv_release_payload). */
void rdv_close(rdv_t *h);
uint64_t rdv_capacity(rdv_t *h);
/* The descriptor of this handle's own open file description of the segment,
 * the one its process-table byte lock is on (-1 if none). A flock taken on
 * it goes when the process dies, in the same release, after that byte
 * lock: whoever gets the flock next finds the dead process dead. */
int rdv_lock_fd(rdv_t *h);

/* Producer. rdv_send_begin reserves a block (waiting up to timeout_ns while
 * the arena is full; timeout_ns < 0 waits forever) and writes its metadata;
 * the caller fills *payload, then publishes it with rdv_send_commit or
 * returns it with rdv_send_discard. rdv_send does all three with one memcpy.
 * A successful rdv_send_begin takes a reference on the mapping for *payload,
 * dropped with rdv_unref once the caller no longer touches it. */
int rdv_send_begin(rdv_t *h, const char *key, uint32_t key_len, const char *dtype,
                   uint32_t dtype_len, uint32_t ndim, const int64_t *shape,
                   const int64_t *strides, uint64_t nbytes, int64_t timeout_ns,
                   uint64_t *pos, void **payload);
int rdv_send_commit(rdv_t *h, uint64_t pos);
int rdv_send_discard(rdv_t *h, uint64_t pos);
int rdv_send(rdv_t *h, const char *key, uint32_t key_len, const char *dtype,
             uint32_t dtype_len, uint32_t ndim, const int64_t *shape,
             const int64_t *strides, const void *src, uint64_t nbytes, int64_t timeout_ns);

/* Producer marks: RDV_MAX_MARKS records of (id, val0, val1) in the segment,
 * for idempotent producers such as the network bridge, which must know after
 * a restart exactly which of its messages were committed. id 0 means unused.
 *
 * rdv_send_commit_marked is rdv_send_commit that also sets mark idx to (id,
 * val0, val1), atomically with respect to the caller's death: once the dead
 * caller is reclaimed, either the message is committed and the mark updated,
 * or the message is not committed and the mark unchanged. A commit that
 * fails (-errno) leaves the mark unchanged too. rdv_mark_set changes a mark
 * with no message (to claim or reset it), as atomically. Each mark must have
 * one writer at a time: that is the caller's contract (the bridge serializes
 * per mark); concurrent writers of one mark may undo each other. A handle
 * makes one mark change at a time (concurrent calls queue on a lock).
 * rdv_mark_get reads a mark; the triple is consistent when its writer is not
 * in the middle of a change (idle, or dead and reclaimed). -EINVAL when idx
 * is not below RDV_MAX_MARKS. */
int rdv_mark_get(rdv_t *h, uint32_t idx, uint64_t *id, uint64_t *val0, uint64_t *val1);
int rdv_mark_set(rdv_t *h, uint32_t idx, uint64_t id, uint64_t val0, uint64_t val1);
int rdv_send_commit_marked(rdv_t *h, uint64_t pos, uint32_t idx, uint64_t id, uint64_t val0,
                           uint64_t val1);

/* Consumer. Receivers of a key are served first come, first served: one
 * that finds no message waits in line (a waiter record in the segment),
 * and a send hands its message to the oldest waiter and wakes that one.
 *
 * rdv_recv takes the oldest message of key, waiting up to timeout_ns (< 0
 * forever, 0 never blocks: -EAGAIN when empty) and leaving the line if none
 * comes. rdv_recv_leased: the message is leased: if this process dies
 * while it holds the payload (before rdv_release_payload), the message goes
 * back to the head of its key's queue, ahead of messages queued meanwhile
 * and in the order its leased messages of that key were allocated, instead
 * of being freed: at-least-once delivery for a forwarder that releases a
 * message only once it has passed it on. Releasing it frees it as
 * rdv_recv's. If the rendezvous is aborted by then, or the key can be
 * neither found nor re-created because the key index is full, the message
 * is freed (the latter counted in rdv_stats.leases_dropped). */
int rdv_recv(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns,
             struct rdv_msg_info *out);
int rdv_recv_leased(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns,
                    struct rdv_msg_info *out);

/* flags of the calls below */
#define RDV_RECV_LEASED 1 /* take the message leased (see rdv_recv_leased) */
#define RDV_RECV_ASYNC 2  /* enqueue without waiting; rdv_recv_poll tells when it is served */
/* Messages one rdv_send_many or rdv_recv_many moves at most: bounds how
 * long a batch holds a key's lock. */
#define RDV_MANY_MAX 1024

/* What rdv_send_many sends for one kind of message: rdv_send's arguments
 * but the source, the same for every message of one key, dtype and shape. */
struct rdv_send_item {
    const char *key;
    const char *dtype;
    const int64_t *shape;
    const int64_t *strides;
    uint64_t nbytes;
    uint32_t key_len;
    uint32_t dtype_len;
    uint32_t ndim;
    uint32_t reserved;
};
/* rdv_send of (*items[i], srcs[i]) for i in [0, n), in order, n <=
 * RDV_MANY_MAX, all within one timeout_ns (each waits for room as rdv_send
 * does, up to what is left). 0 once all are sent; else the error of item
 * *sent, the count queued before it (those stay sent). */
int rdv_send_many(rdv_t *h, const struct rdv_send_item *const *items, const void *const *srcs,
                  uint32_t n, int64_t timeout_ns, uint32_t *sent);
/* rdv_recv_start for key's oldest message into out[0], then, if it got one,
 * up to max - 1 more that are queued under key by then (no wait for them),
 * in order, into out[1..]: *n in all (1 <= *n <= max <= RDV_MANY_MAX), each
 * payload released on its own. Returns and *waiter as rdv_recv_start's;
 * a message that comes through rdv_recv_wait is one: take what else is
 * queued then with rdv_recv_more. */
int rdv_recv_many(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns, uint32_t flags,
                  uint32_t *waiter, struct rdv_msg_info *out, uint32_t max, uint32_t *n);
/* Up to max messages queued under key now, without waiting, in order: 0
 * with *n (possibly 0). Both calls set out[i].payload to NULL for every
 * entry of out[0..max) they do not fill. */
int rdv_recv_more(rdv_t *h, const char *key, uint32_t key_len, uint32_t flags,
                  struct rdv_msg_info *out, uint32_t max, uint32_t *n);
/* rdv_give_back of payloads[0..n), views of ours of one key (a batch
 * received and not handed out), under one hold of the key's lock: they are
 * at the head of the key in this order, or handed to its waiters, the
 * oldest message to the oldest waiter. -EINVAL (nothing changed) unless
 * all are views of ours of one key; aborted, or no slot for the key: they
 * are freed (-ECONNABORTED, -ENOSPC), as rdv_give_back does. */
int rdv_give_back_many(rdv_t *h, void *const *payloads, uint32_t n);

/* Keys one rdv_recv_any_start waits on at most. */
#define RDV_ANY_MAX 64

/* A receive that keeps its place in line across calls. rdv_recv_start
 * returns 0 with *out (a message was queued, or one was handed to us
 * within timeout_ns), -EAGAIN (timeout_ns 0 and nothing queued), or, with
 * *waiter set to our place in line: -ETIMEDOUT or -EINTR (timeout_ns ran
 * out, or a signal came) and, with RDV_RECV_ASYNC, -EINPROGRESS at once.
 * Then rdv_recv_wait waits on (same returns), and rdv_recv_cancel leaves
 * the line: 0 if it did, 1 if a send had already handed us a message,
 * which it takes into *out. Both take the waiter by reference and set it
 * to 0 once it has ended (a 0 from rdv_recv_wait, any return of
 * rdv_recv_cancel, -ECONNABORTED), so a caller interrupted at any point
 * knows whether it is still in line. With
 * RDV_RECV_ASYNC, timeout_ns bounds only the wait for arena room for the
 * waiter record (-ENOBUFS after it). A blocking start may also return
 * -ETIMEDOUT or -EINTR with *waiter 0: it ran out of time, or a signal
 * came, while it waited for room for its record (the arena full, and the
 * handle's first 62 records in use).
 *
 * rdv_recv_any_start: the same on nkeys keys at once (key_lens[i] bytes
 * each, concatenated in keys; distinct; at most RDV_ANY_MAX): the first
 * message of any of them, taken from exactly one; *which is its key's
 * index. Keys that have messages when it starts are tried in turn from a
 * starting point that rotates, so a busy key does not starve the others.
 *
 * rdv_recv_poll waits up to timeout_ns for sends to serve this handle's
 * RDV_RECV_ASYNC waiters and returns up to cap of them (*n); take each
 * with rdv_recv_wait(..., 0, ...). With cap 0 it only waits, leaving the
 * served waiters to the next call. -ETIMEDOUT when none was served,
 * -ECONNABORTED once aborted. A wait that ends looks at every waiter, so a
 * hand-off whose sender died before telling is found within one wait. */
int rdv_recv_start(rdv_t *h, const char *key, uint32_t key_len, int64_t timeout_ns,
                   uint32_t flags, uint32_t *waiter, struct rdv_msg_info *out);
int rdv_recv_any_start(rdv_t *h, const char *keys, const uint32_t *key_lens, uint32_t nkeys,
                       int64_t timeout_ns, uint32_t flags, uint32_t *waiter, uint32_t *which,
                       struct rdv_msg_info *out);
int rdv_recv_wait(rdv_t *h, uint32_t *waiter, int64_t timeout_ns, uint32_t flags,
                  uint32_t *which, struct rdv_msg_info *out);
int rdv_recv_cancel(rdv_t *h, uint32_t *waiter, uint32_t flags, uint32_t *which,
                    struct rdv_msg_info *out);
int rdv_recv_poll(rdv_t *h, int64_t timeout_ns, uint32_t *waiters, uint32_t cap, uint32_t *n);
/* Make a rdv_recv_poll of this handle in another thread return now
 * (-EINTR, unless something was served meanwhile). */
int rdv_recv_interrupt(rdv_t *h);
/* Put a received payload back at the head of its key's queue (or hand it
 * to the key's oldest waiter) instead of freeing it: for a receiver that
 * gives up after a message was handed to it. Drops the payload's reference
 * as rdv_release_payload does. If the rendezvous is aborted, or the key
 * index is full, the message is freed instead (-ECONNABORTED, -ENOSPC). */
int rdv_give_back(rdv_t *h, void *payload);
/* Give back a payload handed out by rdv_recv or rdv_recv_leased: frees its
 * block and drops the reference the view held on the mapping. */
int rdv_release_payload(rdv_t *h, void *payload);
/* Drop the reference a payload handed out by rdv_send_begin held. */
void rdv_unref(rdv_t *h);

/* Abort: every pending and future operation in every process fails with
 * -ECONNABORTED; queued messages are freed. The first reason wins. */
int rdv_abort(rdv_t *h, const char *reason, uint32_t reason_len);
int rdv_abort_reason(rdv_t *h, char *buf, uint32_t cap, uint32_t *len);

int rdv_stats(rdv_t *h, struct rdv_stats *out);

/* One attached handle, as the process table and the arena show it. */
struct rdv_proc_info {
    uint32_t entry;
    uint32_t pid;
    uint32_t state;        /* 1 attached, 2 being reclaimed */
    uint32_t alive;        /* its process still holds the entry's kernel lock */
    uint64_t attached_ns;  /* CLOCK_REALTIME */
    uint64_t views;        /* received blocks it holds */
    uint64_t view_bytes;
    uint64_t writing;      /* blocks it is writing (send, alloc) */
    uint64_t waits;        /* receives it is blocked in */
};

/* Up to cap entries into out; *n is how many were written. */
int rdv_procs(rdv_t *h, struct rdv_proc_info *out, uint32_t cap, uint32_t *n);
/* One live key: its pending messages and waiters, and its name as the
 * oldest pending message carries it (key_len 0 when none is pending). */
struct rdv_key_info {
    uint32_t pending;
    uint32_t waiters;
    uint32_t key_len;  /* bytes in key; the full length may be longer */
    uint32_t full_len;
    char key[256];
};

int rdv_keys(rdv_t *h, struct rdv_key_info *out, uint32_t cap, uint32_t *n);

/* How many dead processes this handle has reclaimed (attaching reclaims),
 * and the pids of the first ones (up to cap, at most 16). */
uint32_t rdv_reaped(rdv_t *h, uint32_t *pids, uint32_t cap);

/* Reclaim everything held by processes that died; *reclaimed counts them. */
int rdv_gc(rdv_t *h, uint32_t *reclaimed);

/* Collectives: a group of world_size processes (ranks) sharing one segment
 * of its own, not a rendezvous's (rdv_coll.c, docs/architecture.md). */
typedef struct rdv_group rdv_group_t;

#define RDV_COLL_MAX_RANKS 64
/* Bytes of a group's job token: what proves that a process joining a
 * group's segment is of the job that created it (all zero: no token). */
#define RDV_COLL_JOB_BYTES 16
/* Bytes of a rank's data buffer, by default: a collective moves data in
 * chunks of about this much per phase (each rank has two). */
#define RDV_COLL_SLOT_BYTES 1048576
/* An allreduce of at most this many bytes runs in one phase: every rank
 * reduces all inputs itself rather than its share. */
#define RDV_COLL_ONE_SHOT_BYTES 65536

/* Collectives (struct rdv_coll_call.kind) */
#define RDV_COLL_BARRIER 1
#define RDV_COLL_ALLREDUCE 2
#define RDV_COLL_BROADCAST 3
#define RDV_COLL_ALLGATHER 4
#define RDV_COLL_REDUCE_SCATTER 5
#define RDV_COLL_REDUCE 6
#define RDV_COLL_GATHER 7
#define RDV_COLL_SCATTER 8
#define RDV_COLL_ALLTOALL 9
#define RDV_COLL_SCATTER_META 10 /* a broadcast of what scatter's root sends */
/* A call this rank could not make (its arguments were refused before it
 * began), made in its place so that the others do not pair their call with
 * this rank's next one: op holds the kind it was to be, src/nbytes the text
 * of why (at most RDV_REASON_MAX bytes). One phase; every other rank's call
 * stops there with -EBADE, naming it. */
#define RDV_COLL_FAILED 11

/* Reduction ops */
#define RDV_OP_SUM 1
#define RDV_OP_PROD 2
#define RDV_OP_MIN 3
#define RDV_OP_MAX 4
#define RDV_OP_MEAN 5
#define RDV_OP_BAND 6
#define RDV_OP_BOR 7
#define RDV_OP_BXOR 8

/* Element types */
#define RDV_DT_BOOL 1
#define RDV_DT_I8 2
#define RDV_DT_U8 3
#define RDV_DT_I16 4
#define RDV_DT_U16 5
#define RDV_DT_I32 6
#define RDV_DT_U32 7
#define RDV_DT_I64 8
#define RDV_DT_U64 9
#define RDV_DT_F16 10
#define RDV_DT_BF16 11
#define RDV_DT_F32 12
#define RDV_DT_F64 13
#define RDV_DT_C64 14
#define RDV_DT_C128 15

/* Why a call failed: the rank whose call differs (-EBADE, with its call's
 * fields; kind RDV_COLL_FAILED: a call it could not make, see
 * rdv_coll_failed_why) or that is gone (-EPIPE, with pid and closed 1 if
 * it closed the group rather than died); the ranks that had not arrived
 * (-ETIMEDOUT); the rank that aborted (-ECONNABORTED; RDV_COLL_OUTSIDER
 * for a process that is no member and refused the join), with timed_out 1
 * and missing when it gave up at its timeout. */
struct rdv_coll_status {
    uint32_t rank;
    uint32_t pid;
    uint32_t closed;
    uint32_t kind;
    uint32_t op;
    uint32_t dtype;
    uint32_t root;
    uint32_t timed_out;
    uint64_t nbytes;
    uint64_t shape_hash;
    uint64_t missing; /* bit r: rank r */
};

/* The rank field of an abort by a process that is no member (status.rank). */
#define RDV_COLL_OUTSIDER 255

/* Open a group's segment fd (created by rank 0 with create 1: sized and
 * initialised here; attached otherwise) and join it as rank, of the job
 * whose token is job (RDV_COLL_JOB_BYTES). -EBUSY: rank is taken (by a live
 * process, or it joined once); -EXDEV: the segment's world_size or buffer
 * size is not ours; -EREMCHG: the segment is another job's (its token is
 * not ours); -EAGAIN: not initialised yet (try again); -EOWNERDEAD: not
 * initialised and its creator is gone. *last is 1 for the rank whose join
 * completed the group (it removes the name). A join that was refused
 * (rdv_coll_refuse) opens all the same: rdv_coll_wait_joined says so. */
int rdv_coll_open(int fd, int create, uint32_t world, uint32_t rank, uint64_t slot_bytes,
                  const uint8_t *job, rdv_group_t **out, uint32_t *last);
/* Bytes of the segment of a group of world ranks with buffers of
 * slot_bytes (what rdv_coll_open reserves), for what a create with no
 * room says. */
uint64_t rdv_coll_segment_bytes(uint32_t world, uint64_t slot_bytes);
/* Refuse the join of the group in fd, as a process that conflicts with it
 * but is no member (it came with another world_size, as a rank already
 * taken, or as a second rank 0): every member's wait for the others ends
 * with -ECONNABORTED, rdv_coll_reason giving reason (at most
 * RDV_REASON_MAX bytes), and no later join completes it. Only a process of
 * the same job may (job, RDV_COLL_JOB_BYTES, as the creator's; NULL: any,
 * for an administrator removing it); and only while the group has not
 * formed: once every rank has joined, nobody outside it can stop it.
 * 0 refused (or already broken); -EALREADY it has formed; -EREMCHG another
 * job's; -EAGAIN not initialised yet; -EPROTO, -EPROTONOSUPPORT not a
 * group of this layout. */
int rdv_coll_refuse(int fd, const uint8_t *job, const char *reason, uint32_t reason_len);
/* Whether the group in fd was created by a job still running: a live
 * process holds rank 0, or, with closed_counts, rank 0 left it normally
 * (for a rank that has just joined: a fast rank 0 may finish its calls and
 * close between that join and this check): 1, with rank 0's pid when it
 * has written it, or 0. */
int rdv_coll_creator_alive(int fd, int closed_counts, uint32_t *pid);
/* Wait for every rank to have joined: 0, or -EINPROGRESS when a slice of
 * the wait (50 ms at most) ended first: call again (rdv_coll_status's
 * missing: who has not joined). Other returns as rdv_coll_run's. */
int rdv_coll_wait_joined(rdv_group_t *g, int64_t timeout_ns);
/* The timeout of every later call of this handle (< 0: none, the default).
 * A call that times out aborts the group (naming the ranks it waited for):
 * it has published part of its phases, so no rank may go on. */
void rdv_coll_set_timeout(rdv_group_t *g, int64_t timeout_ns);
/* Run a collective. what: kind | op << 8 | dtype << 16 | root << 32 (op
 * for reductions, on elements of dtype; root for rooted kinds). nbytes:
 * the input's bytes (a row's for scatter and alltoall, whose inputs hold
 * world_size rows; the root's row for scatter everywhere). src and dst as
 * the kind needs them (NULL where a rank has none). shape_hash: any value
 * every rank must agree on besides the rest (the shape). 0 when done;
 * -EINPROGRESS when a slice of a wait ended first (call rdv_coll_resume,
 * which continues the same call); -EBADE mismatch, -EPIPE a rank is gone,
 * -ETIMEDOUT, -ECONNABORTED aborted, -EINVAL bad arguments and -EFAULT
 * a reduction's src or dst not aligned to its elements (nothing started),
 * -EALREADY another thread's call on this handle is running.
 * rdv_coll_status then says why. rdv_coll_barrier is the barrier's call. */
int rdv_coll_run(rdv_group_t *g, uint64_t what, uint64_t nbytes, uint64_t shape_hash, const void *src,
                 void *dst);
int rdv_coll_barrier(rdv_group_t *g);
int rdv_coll_resume(rdv_group_t *g);
void rdv_coll_status(rdv_group_t *g, struct rdv_coll_status *out);
/* Whether the calling thread has a call running (or waiting to be resumed)
 * on this handle: a caller interrupted mid-call (Ctrl-C) aborts the group
 * only then. */
int rdv_coll_mine(rdv_group_t *g);
/* Abort the group: every member's pending and later calls fail with
 * -ECONNABORTED. The first reason wins. */
int rdv_coll_abort(rdv_group_t *g, const char *reason, uint32_t reason_len);
/* Abort the group as a rank that gave up at its timeout, waiting for the
 * ranks in missing (bit r: rank r): the others' status says timed_out and
 * missing. A call that times out does this itself; joining calls it. */
int rdv_coll_abort_timed_out(rdv_group_t *g, const char *reason, uint32_t reason_len, uint64_t missing);
/* Why the group was aborted: -EINVAL when it was not; -ENODATA when a
 * process that is no member refused the join without saying why. */
int rdv_coll_reason(rdv_group_t *g, char *buf, uint32_t cap, uint32_t *len);
/* After -EBADE naming a rank whose call was RDV_COLL_FAILED: the text it
 * gave for why (copied during the call); -EINVAL otherwise. */
int rdv_coll_failed_why(rdv_group_t *g, char *buf, uint32_t cap, uint32_t *len);
/* The pid that joined as rank (0 if none). */
uint32_t rdv_coll_pid(rdv_group_t *g, uint32_t rank);
/* Leave the group: a rank waiting for us finds us gone (closed). The
 * handle then refuses calls; a call of another thread that is running
 * ends on its own. rdv_coll_free unmaps and frees it, once no call is. */
void rdv_coll_leave(rdv_group_t *g);
void rdv_coll_free(rdv_group_t *g);
/* In a forked child: drop the inherited handle's liveness lock (so the
 * parent's rank ends with the parent) and make the handle refuse calls. */
void rdv_coll_forget(rdv_group_t *g);
