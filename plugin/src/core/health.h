/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NIC health and the control-plane seam: the core's public interface for whatever watches the
 * NICs from outside (the agent glue, agent.c; a test). A local NIC is usable when no source
 * holds it down; marking it down moves every lane on it at once. The core polls carrier itself
 * and runs a ticker thread (every 20 ms) that drives failure detection and, when hooks are
 * registered, the control plane's poll.
 *
 * struct rh_ctl_hooks is how a control plane plugs in: it registers its hooks before the first
 * rh_init() (NULL, the default: standalone, the core decides alone). The core never names the
 * agent glue; the agent glue calls into the core only through this header.
 */
#ifndef RH_HEALTH_H
#define RH_HEALTH_H

#include <stdbool.h>
#include <stdint.h>

enum rh_health_src { RH_HEALTH_API = 1, RH_HEALTH_CARRIER = 2, RH_HEALTH_AGENT = 4 };

/* Mark local NIC nic up/down for source src (RH_HEALTH_API for rh_nic_set_health). */
void rh_nic_set_health(int nic, bool up);
void rh_nic_set_health_from(int nic, enum rh_health_src src, bool up);
/* A soft signal (the agent's SUSPECT): run the confirming probe on every lane using local NIC
 * nic now and move the lanes whose probe fails, without waiting for the completion timeout. */
void rh_nic_suspect(int nic);
int rh_nic_count(void);
const char *rh_nic_name(int nic); /* "" for an unknown index */
const char *rh_run_dir(void); /* RAILHOP_RUN_DIR: where the agent's table and socket live */
int64_t rh_agent_uid(void); /* RAILHOP_AGENT_UID: the agent's uid when not root (0: unset) */

/* Lane event types (same values as enum rh_lane_event_type in railhop/ctl_table.h). */
enum {
	RH_EVT_LANE_UP = 1,
	RH_EVT_LANE_DOWN = 2,
	RH_EVT_LANE_TIMEOUT = 3,
	RH_EVT_LANE_ERROR = 4,
	RH_EVT_FAILOVER_START = 5,
	RH_EVT_FAILOVER_END = 6,
	RH_EVT_FAILBACK = 7,
	RH_EVT_FAIR_SHARE = 8,
};

/* Lane event flags (same values as RH_EV_F_* in railhop/ctl_table.h): a LANE_UP of a warm
 * standby (idle), and the LANE_UP of its promotion (standby | promoted). */
enum {
	RH_EVT_F_STANDBY = 0x1,
	RH_EVT_F_PROMOTED = 0x2,
};

/* One ranked backup for a local NIC. */
struct rh_plan_entry {
	int lnic; /* local NIC index */
	int remote_rail; /* rail of the remote NIC to pair with, -1: any */
	int weight;
};

/* What a lane event says about the lane beyond its ids (all optional, zero = unknown). */
struct rh_lane_info {
	uint32_t laddr, raddr; /* IPv4, network order */
	char rnic[16]; /* the peer's NIC as this side knows it (its address) */
	int nports; /* TCP streams: local/remote ports, host order */
	uint16_t lports[8], rports[8];
	uint64_t bytes_replayed; /* FAILOVER_END (sender): bytes queued again for replay */
	uint32_t flags; /* RH_EVT_F_* */
};

struct rh_ctl_hooks {
	/* A lane event (type RH_EVT_*), called with the connection's lock held: must not block
	 * nor call back into the core. */
	void (*lane_event)(int type, uint64_t conn_id, uint32_t epoch, uint32_t lane, int lnic,
			   int err, uint64_t duration_ns, const struct rh_lane_info *info);
	/* The ranked backups for local NIC lnic, best first; returns how many (<= max), 0: no
	 * plan (the core ranks alone). Any thread, connection lock held. */
	int (*plan_for)(int lnic, struct rh_plan_entry *out, int max);
	/* The control plane holds local NIC nic SUSPECT. Any thread, connection lock held. */
	bool (*suspect)(int nic);
	/* Called from the ticker thread every tick; may call the rh_nic_* functions above. */
	void (*poll)(uint64_t now_ms);
	/* The plugin stops (no ticker, I/O thread or connection left, no other hook running):
	 * release everything (descriptors, mappings) and forget the state; the next start
	 * begins afresh. */
	void (*shutdown)(void);
};

/* Register the control plane (NULL: standalone). Call before the first rh_init(). */
void rh_health_set_hooks(const struct rh_ctl_hooks *hooks);

#endif
