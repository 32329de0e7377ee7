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

bool rh_sched_share_ok(uint64_t taken, uint32_t share, const uint64_t *taken_o,
		       const uint32_t *share_o, int n, uint64_t slack)
{
	if (share == 0) {
		return true;
	}
	for (int j = 0; j < n; j++) {
		if (share_o[j] == 0) {
			continue;
		}
		/* taken / share > (taken_j + slack) / share_j, without division or overflow */
		if ((unsigned __int128)taken * share_o[j] >
		    ((unsigned __int128)taken_o[j] + slack) * share) {
			return false;
		}
	}
	return true;
}

uint64_t rh_sched_share_start(uint32_t share, const uint64_t *taken_o, const uint32_t *share_o,
			      int n)
{
	unsigned __int128 best = 0;
	bool any = false;

	for (int j = 0; j < n; j++) {
		unsigned __int128 v;

		if (share_o[j] == 0) {
			continue;
		}
		v = (unsigned __int128)taken_o[j] * share / share_o[j];
		if (!any || v < best) {
			best = v;
			any = true;
		}
	}
	return best > UINT64_MAX ? UINT64_MAX : (uint64_t)best;
}

static bool bit_set(const uint64_t *bits, uint64_t i)
{
	return bits[i / 64] & (1ull << (i % 64));
}

int rh_sched_runs_from_bits(const uint64_t *bits, uint64_t nchunks, struct rh_run *runs, int max)
{
	int n = 0;
	uint64_t i = 0;

	if (nchunks > UINT32_MAX) {
		nchunks = UINT32_MAX; /* chunk indexes travel as 32 bits; the rest is resent */
	}
	while (i < nchunks && n < max) {
		uint64_t start;

		while (i < nchunks && !bit_set(bits, i)) {
			i++;
		}
		if (i == nchunks) {
			break;
		}
		start = i;
		while (i < nchunks && bit_set(bits, i)) {
			i++;
		}
		runs[n].start = (uint32_t)start;
		runs[n].count = (uint32_t)(i - start);
		n++;
	}
	return n;
}

uint64_t rh_sched_skip_placed(const struct rh_run *runs, int nruns, uint64_t idx)
{
	for (int i = 0; i < nruns; i++) {
		uint64_t end = (uint64_t)runs[i].start + runs[i].count;

		if (idx < runs[i].start) {
			break;
		}
		if (idx < end) {
			idx = end;
		}
	}
	return idx;
}

uint64_t rh_sched_runs_chunks(const struct rh_run *runs, int nruns)
{
	uint64_t n = 0;

	for (int i = 0; i < nruns; i++) {
		n += runs[i].count;
	}
	return n;
}
