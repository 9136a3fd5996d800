/* Layer 2: creating, validating and mapping a segment, and the handle that
 * maps it. Filling in what lives inside (the arena's free space, the
 * process entry) is for the layers that own it. */
#ifndef RDV_SEGMENT_H
#define RDV_SEGMENT_H

#include <stdint.h>

#include "rdv_handle.h"

/* Size and reserve fd for an arena of arena_size bytes and max_keys keys,
 * map it and write the header's identity, but not its magic: the segment
 * is invisible to attachers until rdv_segment_publish. Takes the creator's
 * byte lock (RDV_CREATOR_LOCK_BYTE) first, on fd's file description, and
 * rdv_segment_publish (given the same fd) drops it. */
int rdv_segment_create(int fd, uint64_t arena_size, uint64_t max_keys, uint32_t flags, rdv_t **out);
void rdv_segment_publish(rdv_t *h, int fd);
/* Validate the header of an existing segment, map it and check that its
 * running state is in range. -EAGAIN: still being created (its creator
 * holds RDV_CREATOR_LOCK_BYTE); -EOWNERDEAD: not initialised and nobody
 * creating it (its creator died, or has yet to take the lock); -EPROTO: not a
 * segment; -EPROTONOSUPPORT: another layout version; -EBADMSG: damaged;
 * -EFBIG: the file's size disagrees with its header. */
int rdv_segment_attach(int fd, rdv_t **out);
/* Unmap and free a handle that was never handed out. */
void rdv_segment_discard(rdv_t *h);
/* Unmap a handle's segment; the struct stays (see rdv_open.c). */
void rdv_segment_unmap(rdv_t *h);
/* Open the file description the handle's byte locks live on (a reopen of
 * fd's file, see rdv_os.h), before any is taken. 0 or -errno. */
int rdv_segment_lock_fd(rdv_t *h, int fd);
/* 0 while the segment is whole; -EFBIG once it was truncated under us: an
 * access faulted past the cut (the SIGBUS handler marked the handle), or
 * the file's size no longer matches the mapping (one fstat, checked here;
 * the damaged mark is then set too). */
int rdv_segment_check(rdv_t *h);
/* In a forked child, for a handle inherited from the parent: close our copy
 * of its lock file description, so the parent's locks end with the parent. */
void rdv_segment_drop_locks(rdv_t *h);

#endif
