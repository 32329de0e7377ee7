/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The node policy's parameters, as the agent publishes them in the health table (agent.c ->
 * param.c). Apart from param.h, whose enum rh_dist shares its names with the table's.
 */
#ifndef RH_PARAM_NODE_H
#define RH_PARAM_NODE_H

#include <stdint.h>

#define RH_NODE_RAIL_PEERS 64 /* rails 0..63 have a rail_peers row (the table's rail_peers) */

/* The node policy's plugin settings (table layout minor >= 1; all unset for older tables),
 * in the policy's words: the agent glue translates the table's codes. */
struct rh_node_policy {
	const char *rail_rule; /* same-rail | allowed-pairs | any; NULL: not set */
	const char *distance_limit; /* PIX | PXB | PHB | NODE | SYS; NULL: not set */
	int backup_lanes; /* 1..8; 0: not set */
	uint64_t rail_peers[RH_NODE_RAIL_PEERS]; /* by local rail (allowed-pairs) */
};

/* Apply the node policy's timeouts (ms, 0 = not set by the policy) to COMPLETION_TIMEOUT,
 * PROBE_TIMEOUT and FAILBACK_INTERVAL: each unless the job set its RAILHOP_* variable; a value
 * the policy no longer sets returns to the built-in default. Logs each change (NCCL_ENV). */
void rh_params_apply_node(uint32_t completion_ms, uint32_t probe_ms, uint32_t failback_interval_ms);

/* Apply the node policy's RAIL_RULE, DISTANCE_LIMIT and BACKUP_LANES (and the allowed rail
 * pairs): each unless the job set its RAILHOP_* variable, which wins and is said once (one
 * INFO line per parameter); a value the policy no longer sets returns to the default. */
void rh_params_apply_policy(const struct rh_node_policy *p);

#endif
