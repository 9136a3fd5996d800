/* Layer 7: producer marks, changed atomically with a commit against the
 * producer's death (see rdv_mark.c and shmrdv.h). */
#ifndef RDV_MARK_H
#define RDV_MARK_H

#include <stdint.h>

#include "rdv_handle.h"

int rdv_mark_commit(rdv_t *h, uint64_t pos, uint32_t idx, uint64_t id, uint64_t val0, uint64_t val1);
int rdv_mark_set_impl(rdv_t *h, uint32_t idx, uint64_t id, uint64_t val0, uint64_t val1);
int rdv_mark_get_impl(rdv_t *h, uint32_t idx, uint64_t *id, uint64_t *val0, uint64_t *val1);
/* Roll back or keep the mark change entry `dead` was making. Called by its
 * reclaimer after its slot locks are repaired and before its WRITING blocks
 * are freed. */
void rdv_mark_recover(rdv_t *h, uint32_t dead);

#endif
