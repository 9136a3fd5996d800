/* Layer 7: leased receive's recovery: the leased views a dead receiver held
 * go back to the head of their keys. */
#ifndef RDV_LEASE_H
#define RDV_LEASE_H

#include <stdint.h>

#include "rdv_handle.h"

/* Give the leased views entry `dead` held back to their keys (or free them:
 * abort, full index, damage). Called by its reclaimer after its slot locks
 * are repaired and before its remaining views are freed. */
void rdv_lease_recover(rdv_t *h, uint32_t dead);

#endif
