/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Grouped-receive tag matching (pure, unit-tested). NCCL: "send/receive operations should
 * always match in the order they were posted. Tags are only used to assign a given send
 * operation to one of the buffers of the first (multi-)receive in the queue."
 * The sender keeps the receiver's clear-to-send records in posting order; a send takes the
 * first record that still has an unmatched slot with its tag.
 */
#ifndef RH_MATCH_H
#define RH_MATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "wire.h"

struct rh_cts_slot {
	struct rh_cts cts;
	bool present; /* record received */
	uint8_t matched; /* mask of slots already matched to a send */
};

/*
 * recs[i] is the record of sequence base+i (in order; a missing one stops the search since
 * records arrive in order eventually). Returns the index i and sets *slot, or -1 when no record
 * can take the tag yet (try later). Records whose slots are all matched are skipped.
 * With strict ordering only the first record with free slots is searched.
 */
int rh_match_tag(const struct rh_cts_slot *recs, int nrecs, int32_t tag, int *slot);

#endif
