/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The ncclNet ABI edge: versioned adapters and the five exported tables, nothing else.
 * Adapters are named <op>_v<N> after the first version with that signature; each table reuses
 * the oldest compatible adapter. Results are converted from negative errno in rh_result().
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "lanes/lanes.h"
#include "log.h"
#include "nccl/net.h"
#include "rh.h"

#define RH_EXPORT __attribute__((visibility("default")))

/* The one errno -> ncclResult_t mapping. */
static ncclResult_t rh_result(int rc)
{
	switch (rc) {
	case 0:
		return ncclSuccess;
	/* the peer or the link: NCCL reports it, the application aborts/revokes/shrinks */
	case -ECONNRESET:
	case -ECONNREFUSED:
	case -ECONNABORTED:
	case -EHOSTUNREACH:
	case -ENETUNREACH:
	case -ETIMEDOUT:
	case -EPIPE:
	case -EPROTO:
		return ncclRemoteError;
	/* NCCL misused the plugin (bad handle, request, device) */
	case -EINVAL:
	case -EBADF:
		return ncclInternalError;
	/* user error or configuration: size mismatch, unsupported memory type */
	case -EMSGSIZE:
	case -EOPNOTSUPP:
		return ncclInvalidUsage;
	default:
		return ncclSystemError; /* local OS / NIC failure (ENOMEM, ENETDOWN, ENODEV, ...) */
	}
}

/* The one place that assembles the plugin: the transport choice (lanes/lanes.h) and the agent
 * glue plug into the core, then init (of a context, v11+, or of a table without finalize). The
 * core runs the choice at each start, once the parameters are loaded, and checks the table it
 * returns. */
static int plugin_init(ncclDebugLogger_t logger, bool ctx)
{
	rh_core_set_transport(rh_lanes_choose);
	rh_agent_register();
	return ctx ? rh_init_ctx(logger) : rh_init(logger);
}

struct rh_ctx {
	uint64_t comm_id;
	int traffic_class;
	ncclNetAttr_v11_t attr;
};

static ncclResult_t init_v8(ncclDebugLogger_t logFunction)
{
	return rh_result(plugin_init(logFunction, false));
}

static ncclResult_t init_v10(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction)
{
	(void)profFunction;
	return rh_result(plugin_init(logFunction, false));
}

static ncclResult_t init_v11(void **ctx, uint64_t commId, ncclNetCommConfig_v11_t *config,
			     ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction)
{
	struct rh_ctx *c;
	int rc;

	(void)profFunction;
	rc = plugin_init(logFunction, true);
	if (rc < 0) {
		return rh_result(rc);
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		rh_finalize_ctx();
		return ncclSystemError;
	}
	c->comm_id = commId;
	c->traffic_class = config ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF;
	*ctx = c;
	return ncclSuccess;
}

/* The last context gone (and every comm and listener closed): the plugin stops, so the host
 * may dlclose it right after. */
static ncclResult_t finalize_v11(void *ctx)
{
	if (!ctx) {
		return ncclInternalError;
	}
	free(ctx);
	rh_finalize_ctx();
	return ncclSuccess;
}

static ncclResult_t setNetAttr_v11(void *ctx, ncclNetAttr_v11_t *netAttr)
{
	if (ctx && netAttr) {
		((struct rh_ctx *)ctx)->attr = *netAttr;
	}
	return ncclSuccess;
}

static ncclResult_t devices_v8(int *ndev)
{
	return rh_result(rh_devices(ndev));
}

#define FILL_COMMON(p, r)                                                \
	do {                                                             \
		memset((p), 0, sizeof(*(p)));                            \
		(p)->name = (char *)(r).name;                            \
		(p)->pciPath = (char *)(r).pci;                          \
		(p)->guid = (r).guid;                                    \
		(p)->ptrSupport = NCCL_PTR_HOST;                         \
		(p)->regIsGlobal = 0;                                    \
		(p)->speed = (r).speed;                                  \
		(p)->port = 0;                                           \
		(p)->latency = 0;                                        \
		(p)->maxComms = (r).max_comms;                           \
		(p)->maxRecvs = (r).max_recvs;                           \
		(p)->netDeviceType = NCCL_NET_DEVICE_HOST;               \
		(p)->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION; \
	} while (0)

/* test() reports sizes as int: one message must stay below 2 GiB, so NCCL is told 1 GiB (as
 * its own MAX_NET_SIZE for v8 plugins) and splits larger transfers. */
#define RH_MAX_P2P_BYTES NCCL_MAX_NET_SIZE_V8

#define FILL_V9(p, dev)                                    \
	do {                                               \
		(p)->forceFlush = 0;                       \
		(p)->vProps.ndevs = 1;                     \
		(p)->vProps.devs[0] = (dev);               \
		(p)->maxP2pBytes = RH_MAX_P2P_BYTES;       \
		(p)->maxCollBytes = NCCL_MAX_COLLNET_SIZE; \
	} while (0)

static ncclResult_t getProperties_v8(int dev, ncclNetProperties_v8_t *props)
{
	struct rh_props r;
	int rc = rh_get_props(dev, &r);

	if (rc < 0) {
		return rh_result(rc);
	}
	FILL_COMMON(props, r);
	return ncclSuccess;
}

static ncclResult_t getProperties_v9(int dev, ncclNetProperties_v9_t *props)
{
	struct rh_props r;
	int rc = rh_get_props(dev, &r);

	if (rc < 0) {
		return rh_result(rc);
	}
	FILL_COMMON(props, r);
	FILL_V9(props, dev);
	return ncclSuccess;
}

static ncclResult_t getProperties_v11(int dev, ncclNetProperties_v11_t *props)
{
	struct rh_props r;
	int rc = rh_get_props(dev, &r);

	if (rc < 0) {
		return rh_result(rc);
	}
	FILL_COMMON(props, r);
	FILL_V9(props, dev);
	props->maxMultiRequestSize = 1;
	return ncclSuccess;
}

static ncclResult_t getProperties_v12(int dev, ncclNetProperties_v12_t *props)
{
	struct rh_props r;
	int rc = rh_get_props(dev, &r);

	if (rc < 0) {
		return rh_result(rc);
	}
	FILL_COMMON(props, r);
	FILL_V9(props, dev);
	props->maxMultiRequestSize = 1;
	props->railId = (int16_t)r.rail;
	props->planeId = NCCL_NET_ID_UNDEF;
	return ncclSuccess;
}

static ncclResult_t listen_v8(int dev, void *handle, void **listenComm)
{
	return rh_result(rh_listen(dev, handle, listenComm));
}

static ncclResult_t listen_v11(void *ctx, int dev, void *handle, void **listenComm)
{
	(void)ctx;
	return rh_result(rh_listen(dev, handle, listenComm));
}

/* Host-only devices: the device-handle arguments are left untouched (they may be NULL). */
static ncclResult_t connect_v8(int dev, void *handle, void **sendComm,
			       ncclNetDeviceHandle_v8_t **sendDevComm)
{
	(void)sendDevComm;
	return rh_result(rh_connect(dev, handle, sendComm));
}

static ncclResult_t connect_v10(int dev, ncclNetCommConfig_v10_t *config, void *handle,
				void **sendComm, ncclNetDeviceHandle_v10_t **sendDevComm)
{
	(void)config;
	(void)sendDevComm;
	return rh_result(rh_connect(dev, handle, sendComm));
}

static ncclResult_t connect_v11(void *ctx, int dev, void *handle, void **sendComm,
				ncclNetDeviceHandle_v11_t **sendDevComm)
{
	(void)ctx;
	(void)sendDevComm;
	return rh_result(rh_connect(dev, handle, sendComm));
}

static ncclResult_t accept_v8(void *listenComm, void **recvComm,
			      ncclNetDeviceHandle_v8_t **recvDevComm)
{
	(void)recvDevComm;
	return rh_result(rh_accept(listenComm, recvComm));
}

static ncclResult_t regMr_v8(void *comm, void *data, size_t size, int type, void **mhandle)
{
	return rh_result(rh_reg_mr(comm, data, size, type, mhandle));
}

static ncclResult_t deregMr_v8(void *comm, void *mhandle)
{
	return rh_result(rh_dereg_mr(comm, mhandle));
}

static ncclResult_t isend_v8(void *sendComm, void *data, int size, int tag, void *mhandle,
			     void **request)
{
	(void)mhandle;
	if (size < 0) {
		*request = NULL;
		return ncclInternalError;
	}
	return rh_result(rh_isend(sendComm, data, (size_t)size, tag, request));
}

static ncclResult_t isend_v9(void *sendComm, void *data, size_t size, int tag, void *mhandle,
			     void **request)
{
	(void)mhandle;
	return rh_result(rh_isend(sendComm, data, size, tag, request));
}

static ncclResult_t isend_v10(void *sendComm, void *data, size_t size, int tag, void *mhandle,
			      void *phandle, void **request)
{
	(void)mhandle;
	(void)phandle;
	return rh_result(rh_isend(sendComm, data, size, tag, request));
}

static ncclResult_t irecv_v8(void *recvComm, int n, void **data, int *sizes, int *tags,
			     void **mhandles, void **request)
{
	size_t sz[RH_MAX_RECVS_ADVERTISED];

	(void)mhandles;
	if (n < 1 || n > RH_MAX_RECVS_ADVERTISED) {
		*request = NULL;
		return ncclInternalError;
	}
	for (int i = 0; i < n; i++) {
		sz[i] = sizes[i] < 0 ? 0 : (size_t)sizes[i];
	}
	return rh_result(rh_irecv(recvComm, n, data, sz, tags, request));
}

static ncclResult_t irecv_v9(void *recvComm, int n, void **data, size_t *sizes, int *tags,
			     void **mhandles, void **request)
{
	(void)mhandles;
	return rh_result(rh_irecv(recvComm, n, data, sizes, tags, request));
}

static ncclResult_t irecv_v10(void *recvComm, int n, void **data, size_t *sizes, int *tags,
			      void **mhandles, void **phandles, void **request)
{
	(void)mhandles;
	(void)phandles;
	return rh_result(rh_irecv(recvComm, n, data, sizes, tags, request));
}

/* Host memory only: nothing to flush; a NULL request counts as done. */
static ncclResult_t iflush_v8(void *recvComm, int n, void **data, int *sizes, void **mhandles,
			      void **request)
{
	(void)recvComm;
	(void)n;
	(void)data;
	(void)sizes;
	(void)mhandles;
	*request = NULL;
	return ncclSuccess;
}

static ncclResult_t test_v8(void *request, int *done, int *sizes)
{
	return rh_result(rh_test(request, done, sizes));
}

static ncclResult_t closeSend_v8(void *sendComm)
{
	return rh_result(rh_close_send(sendComm));
}

static ncclResult_t closeRecv_v8(void *recvComm)
{
	return rh_result(rh_close_recv(recvComm));
}

static ncclResult_t closeListen_v8(void *listenComm)
{
	return rh_result(rh_close_listen(listenComm));
}

RH_EXPORT const ncclNet_v8_t ncclNetPlugin_v8 = {
	.name = "railhop",
	.init = init_v8,
	.devices = devices_v8,
	.getProperties = getProperties_v8,
	.listen = listen_v8,
	.connect = connect_v8,
	.accept = accept_v8,
	.regMr = regMr_v8,
	.regMrDmaBuf = NULL,
	.deregMr = deregMr_v8,
	.isend = isend_v8,
	.irecv = irecv_v8,
	.iflush = iflush_v8,
	.test = test_v8,
	.closeSend = closeSend_v8,
	.closeRecv = closeRecv_v8,
	.closeListen = closeListen_v8,
	.getDeviceMr = NULL,
	.irecvConsumed = NULL,
};

RH_EXPORT const ncclNet_v9_t ncclNetPlugin_v9 = {
	.name = "railhop",
	.init = init_v8,
	.devices = devices_v8,
	.getProperties = getProperties_v9,
	.listen = listen_v8,
	.connect = connect_v8,
	.accept = accept_v8,
	.regMr = regMr_v8,
	.regMrDmaBuf = NULL,
	.deregMr = deregMr_v8,
	.isend = isend_v9,
	.irecv = irecv_v9,
	.iflush = iflush_v8,
	.test = test_v8,
	.closeSend = closeSend_v8,
	.closeRecv = closeRecv_v8,
	.closeListen = closeListen_v8,
	.getDeviceMr = NULL,
	.irecvConsumed = NULL,
	.makeVDevice = NULL, /* one device per NIC, never fused */
};

RH_EXPORT const ncclNet_v10_t ncclNetPlugin_v10 = {
	.name = "railhop",
	.init = init_v10,
	.devices = devices_v8,
	.getProperties = getProperties_v9,
	.listen = listen_v8,
	.connect = connect_v10,
	.accept = accept_v8,
	.regMr = regMr_v8,
	.regMrDmaBuf = NULL,
	.deregMr = deregMr_v8,
	.isend = isend_v10,
	.irecv = irecv_v10,
	.iflush = iflush_v8,
	.test = test_v8,
	.closeSend = closeSend_v8,
	.closeRecv = closeRecv_v8,
	.closeListen = closeListen_v8,
	.getDeviceMr = NULL,
	.irecvConsumed = NULL,
	.makeVDevice = NULL,
};

RH_EXPORT const ncclNet_v11_t ncclNetPlugin_v11 = {
	.name = "railhop",
	.init = init_v11,
	.devices = devices_v8,
	.getProperties = getProperties_v11,
	.listen = listen_v11,
	.connect = connect_v11,
	.accept = accept_v8,
	.regMr = regMr_v8,
	.regMrDmaBuf = NULL,
	.deregMr = deregMr_v8,
	.isend = isend_v10,
	.irecv = irecv_v10,
	.iflush = iflush_v8,
	.test = test_v8,
	.closeSend = closeSend_v8,
	.closeRecv = closeRecv_v8,
	.closeListen = closeListen_v8,
	.getDeviceMr = NULL,
	.irecvConsumed = NULL,
	.makeVDevice = NULL,
	.finalize = finalize_v11,
	.setNetAttr = setNetAttr_v11,
};

RH_EXPORT const ncclNet_v12_t ncclNetPlugin_v12 = {
	.name = "railhop",
	.init = init_v11,
	.devices = devices_v8,
	.getProperties = getProperties_v12,
	.listen = listen_v11,
	.connect = connect_v11,
	.accept = accept_v8,
	.regMr = regMr_v8,
	.regMrDmaBuf = NULL,
	.deregMr = deregMr_v8,
	.isend = isend_v10,
	.irecv = irecv_v10,
	.iflush = iflush_v8,
	.test = test_v8,
	.closeSend = closeSend_v8,
	.closeRecv = closeRecv_v8,
	.closeListen = closeListen_v8,
	.getDeviceMr = NULL,
	.irecvConsumed = NULL,
	.makeVDevice = NULL,
	.finalize = finalize_v11,
	.setNetAttr = setNetAttr_v11,
};
