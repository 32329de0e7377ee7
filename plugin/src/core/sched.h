/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The scheduler: which bytes go on which lane (pure functions, unit-tested).
 *
 * A message of `size` bytes is cut into chunks of `chunk` bytes placed by offset (a zero-byte
 * message is one empty chunk). Chunks are pulled in message order by whichever stream of an
 * eligible lane can write, so a message is striped over every eligible lane in proportion to
 * what each lane can carry (a lane on a congested or slower NIC pulls fewer chunks).
 * Eligibility follows the lane state; a DRAINING lane only finishes messages that were begun
 * before it was retired, which makes fail-back switch at message boundaries.
 */
#ifndef RH_SCHED_H
#define RH_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "lane_state.h"

/* Number of chunks of a message (>= 1). */
uint64_t rh_sched_nchunks(uint64_t size, uint64_t chunk);
/* Offset and length of chunk idx; false when idx is past the end. */
bool rh_sched_chunk(uint64_t size, uint64_t chunk, uint64_t idx, uint64_t *off, uint64_t *len);
/* May a lane carry a chunk of a message first scheduled in generation msg_gen?
 * msg_gen == UINT32_MAX means "not started yet" (a new message). */
bool rh_sched_lane_may_carry(enum rh_lane_state st, uint32_t retire_gen, uint32_t msg_gen);

#define RH_GEN_NEW UINT32_MAX

/* The plan's byte shares. Lanes opened from the agent's plan carry its share (x 10000); among
 * the ACTIVE lanes that carry one, a lane may take the next chunk only while it is not ahead of
 * any other: taken / share <= (taken_j + slack) / share_j for every other lane j. The lane
 * furthest behind is always allowed, so the set never stalls; bytes then follow the shares as
 * long as every lane can carry its share (a slower lane slows the others down to keep them).
 * share == 0: not gated. */
bool rh_sched_share_ok(uint64_t taken, uint32_t share, const uint64_t *taken_o,
		       const uint32_t *share_o, int n, uint64_t slack);
/* The starting count of a lane joining lanes that already carried bytes: as far as the one
 * furthest behind, so that it does not take everything until it catches up. */
uint64_t rh_sched_share_start(uint32_t share, const uint64_t *taken_o, const uint32_t *share_o,
			      int n);

/* A run of chunks [start, start + count) of one message. */
struct rh_run {
	uint32_t start;
	uint32_t count;
};

/* Replay after a failover resends only what the receiver has not placed: the receiver lists
 * the runs of placed chunks from its bitmap (at most max runs, the first ones; leaving runs out
 * only costs resending them), the sender skips them. */
int rh_sched_runs_from_bits(const uint64_t *bits, uint64_t nchunks, struct rh_run *runs, int max);
/* The first chunk >= idx that no run covers (runs sorted and disjoint). */
uint64_t rh_sched_skip_placed(const struct rh_run *runs, int nruns, uint64_t idx);
/* Chunks the runs cover (what a replay saves). */
uint64_t rh_sched_runs_chunks(const struct rh_run *runs, int nruns);

#endif
