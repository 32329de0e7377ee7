/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The version-free plugin API that api_nccl.c adapts to every ncclNet version.
 * Every function returns 0 or a negative errno; rh_result() in api_nccl.c maps those.
 */
#ifndef RH_H
#define RH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl/common.h"

#define RH_MAX_RECVS_ADVERTISED 8

struct rh_props {
	const char *name;
	const char *pci; /* NULL when virtual */
	uint64_t guid;
	int speed;
	int rail;
	int max_recvs;
	int max_comms;
};

/* Lifecycle (see core/plugin.c): rh_init is the init of a table without finalize (v8..v10),
 * which holds the plugin until its last comm and listener are closed; rh_init_ctx and
 * rh_finalize_ctx bracket one context (v11+). The plugin stops, joining every thread and
 * closing every descriptor, when no context, comm or listener is left; rh_running() says
 * whether it runs. */
int rh_init(ncclDebugLogger_t logger);
int rh_init_ctx(ncclDebugLogger_t logger);
void rh_finalize_ctx(void);
bool rh_running(void);
int rh_devices(int *ndev);
int rh_get_props(int dev, struct rh_props *p);
int rh_listen(int dev, void *handle, void **listen_comm);
/* *send_comm = NULL means "call again" (the handle holds the state). */
int rh_connect(int dev, void *handle, void **send_comm);
int rh_accept(void *listen_comm, void **recv_comm);
int rh_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle);
int rh_dereg_mr(void *comm, void *mhandle);
/* *request = NULL means "try later". */
int rh_isend(void *send_comm, void *data, size_t size, int tag, void **request);
int rh_irecv(void *recv_comm, int n, void **data, const size_t *sizes, const int *tags,
	     void **request);
/* sizes may be NULL; for a grouped receive it receives n sizes. */
int rh_test(void *request, int *done, int *sizes);
int rh_close_send(void *send_comm);
int rh_close_recv(void *recv_comm);
int rh_close_listen(void *listen_comm);

/* Control-plane hooks (agent): mark a local NIC up/down; down moves every lane on it at once.
 * A NIC is usable when no source holds it down. */
enum rh_health_src { RH_HEALTH_API = 1, RH_HEALTH_CARRIER = 2, RH_HEALTH_AGENT = 4 };
void rh_nic_set_health(int nic, bool up); /* RH_HEALTH_API */
void rh_nic_set_health_from(int nic, enum rh_health_src src, bool up);
/* A soft signal (the agent's SUSPECT): run the confirming probe on every lane using local NIC
 * nic now and move the lanes whose probe fails, without waiting for the completion timeout. */
void rh_nic_suspect(int nic);
int rh_nic_count(void);
const char *rh_nic_name(int nic);
const char *rh_run_dir(void);

/* Lane event types (same values as enum rh_lane_event_type in railhop/ctl_table.h). */
enum {
	RH_EVT_LANE_UP = 1,
	RH_EVT_LANE_DOWN = 2,
	RH_EVT_LANE_TIMEOUT = 3,
	RH_EVT_LANE_ERROR = 4,
	RH_EVT_FAILOVER_START = 5,
	RH_EVT_FAILOVER_END = 6,
	RH_EVT_FAILBACK = 7,
};

/* agent.c (ticker thread): apply the agent's health table; report lane events (types of
 * railhop/ctl_table.h enum rh_lane_event_type). */
void rh_ctl_poll(uint64_t now_ms);
/* Plugin shutdown (no ticker or I/O thread left): close the control plane (table mapping,
 * agent socket) and forget its state, so a later init starts afresh. */
void rh_ctl_shutdown(void);
/* The agent's ranked backups for local NIC lnic, best first (0: no plan, rank locally). */
struct rh_plan_entry {
	int lnic; /* local NIC index */
	int remote_rail; /* rail of the remote NIC to pair with, -1: any */
	int weight;
};
int rh_ctl_plan_for(int lnic, struct rh_plan_entry *out, int max);
/* The agent holds local NIC nic SUSPECT (its TCP probes saw trouble on the NIC's lanes). */
bool rh_ctl_nic_suspect(int nic);
/* What a lane event says about the lane beyond its ids (all optional, zero = unknown). */
struct rh_lane_info {
	uint32_t laddr, raddr; /* IPv4, network order */
	char rnic[16]; /* the peer's NIC as this side knows it (its address) */
	int nports; /* TCP streams: local/remote ports, host order */
	uint16_t lports[8], rports[8];
	uint64_t bytes_replayed; /* FAILOVER_END (sender): bytes queued again for replay */
};
void rh_ctl_lane_event(int type, uint64_t conn_id, uint32_t epoch, uint32_t lane, int lnic, int err,
		       uint64_t duration_ns, const struct rh_lane_info *info);

#endif
