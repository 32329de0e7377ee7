/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The agent glue (agent.c): connects the core to the agent's control plane (ctl.c) by
 * registering struct rh_ctl_hooks (core/health.h). Without it the core works alone.
 */
#ifndef RH_AGENT_H
#define RH_AGENT_H

/* Register the agent glue's hooks with the core; call before the first rh_init(). */
void rh_agent_register(void);

#endif
