/* SPDX-License-Identifier: Apache-2.0 */
#include "sched.h"

uint64_t rh_sched_nchunks(uint64_t size, uint64_t chunk)
{
	return size == 0 ? 1 : (size + chunk - 1) / chunk;
}

bool rh_sched_chunk(uint64_t size, uint64_t chunk, uint64_t idx, uint64_t *off, uint64_t *len)
{
	if (idx >= rh_sched_nchunks(size, chunk)) {
		return false;
	}
	*off = idx * chunk;
	*len = size - *off < chunk ? size - *off : chunk;
	return true;
}

bool rh_sched_lane_may_carry(enum rh_lane_state st, uint32_t retire_gen, uint32_t msg_gen)
{
	switch (st) {
	case RH_LANE_ACTIVE:
		return true;
	case RH_LANE_DRAINING:
		return msg_gen != RH_GEN_NEW && msg_gen < retire_gen;
	default:
		return false;
	}
}
