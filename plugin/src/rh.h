/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The version-free plugin API that api_nccl.c adapts to every ncclNet version.
 * Every function returns 0 or a negative errno; rh_result() in api_nccl.c maps those.
 * NIC health and the control-plane hooks are in core/health.h.
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

#endif
