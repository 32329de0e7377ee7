/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The node policy's parameters, as the agent publishes them in the health table (agent.c ->
 * param.c). Apart from param.h, whose enum rh_dist shares its names with the table's.
 */
#ifndef RH_PARAM_NODE_H
#define RH_PARAM_NODE_H

#include <stdint.h>

/* Apply the node policy's timeouts (ms, 0 = not set by the policy) to COMPLETION_TIMEOUT,
 * PROBE_TIMEOUT and FAILBACK_INTERVAL: each unless the job set its RAILHOP_* variable; a value
 * the policy no longer sets returns to the built-in default. Logs each change (NCCL_ENV). */
void rh_params_apply_node(uint32_t completion_ms, uint32_t probe_ms, uint32_t failback_interval_ms);

#endif
