/* SPDX-License-Identifier: Apache-2.0 */
/* ncclNet v12 (NCCL 2.30.3+), from ncclnet.md §3. init is per communicator (ctx). */
#ifndef RH_NCCL_NET_V12_H
#define RH_NCCL_NET_V12_H

#include "net_v11.h"

typedef struct {
	int ndevs;
	int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
} ncclNetVDeviceProps_v12_t;

/* Binary-identical to v11 (ncclnet.md §1.2, §3.2): one type. */
typedef ncclNetCommConfig_v11_t ncclNetCommConfig_v12_t;

typedef ncclNetCommAttr_v11_t ncclNetCommAttr_v12_t;

typedef ncclNetAttr_v11_t ncclNetAttr_v12_t;

typedef struct {
	char *name;
	char *pciPath;
	uint64_t guid;
	int ptrSupport;
	int regIsGlobal;
	int forceFlush;
	int speed;
	int port;
	float latency;
	int maxComms;
	int maxRecvs;
	ncclNetDeviceType netDeviceType;
	int netDeviceVersion;
	ncclNetVDeviceProps_v12_t vProps;
	size_t maxP2pBytes;
	size_t maxCollBytes;
	int maxMultiRequestSize;
	int16_t railId;
	int16_t planeId;
} ncclNetProperties_v12_t;

typedef struct {
	const char *name;
	ncclResult_t (*init)(void **ctx, uint64_t commId, ncclNetCommConfig_v12_t *config,
			     ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
	ncclResult_t (*devices)(int *ndev);
	ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t *props);
	ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **listenComm);
	ncclResult_t (*connect)(void *ctx, int dev, void *handle, void **sendComm,
				ncclNetDeviceHandle_v12_t **sendDevComm);
	ncclResult_t (*accept)(void *listenComm, void **recvComm,
			       ncclNetDeviceHandle_v12_t **recvDevComm);
	ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
	ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
				    int fd, void **mhandle);
	ncclResult_t (*deregMr)(void *comm, void *mhandle);
	ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
			      void *phandle, void **request);
	ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
			      void **mhandles, void **phandles, void **request);
	ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
			       void **request);
	ncclResult_t (*test)(void *request, int *done, int *sizes);
	ncclResult_t (*closeSend)(void *sendComm);
	ncclResult_t (*closeRecv)(void *recvComm);
	ncclResult_t (*closeListen)(void *listenComm);
	ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
	ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
	ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v12_t *props);
	ncclResult_t (*finalize)(void *ctx);
	ncclResult_t (*setNetAttr)(void *ctx, ncclNetAttr_v12_t *netAttr);
} ncclNet_v12_t;

_Static_assert(sizeof(ncclNetVDeviceProps_v12_t) == 36, "v12 vProps size");
_Static_assert(sizeof(ncclNetCommConfig_v12_t) == 4, "v12 commConfig size");
_Static_assert(sizeof(ncclNetCommAttr_v12_t) == 16, "v12 commAttr size");
_Static_assert(sizeof(ncclNetAttr_v12_t) == 44, "v12 netAttr size");
_Static_assert(offsetof(ncclNetAttr_v12_t, recvCommAttr) == 16, "v12 recvCommAttr");
_Static_assert(offsetof(ncclNetAttr_v12_t, op) == 32, "v12 op");
_Static_assert(offsetof(ncclNetAttr_v12_t, algo) == 36, "v12 algo");
_Static_assert(offsetof(ncclNetAttr_v12_t, proto) == 40, "v12 proto");
_Static_assert(sizeof(ncclNetProperties_v12_t) == 128, "v12 properties size");
_Static_assert(offsetof(ncclNetProperties_v12_t, forceFlush) == 32, "v12 forceFlush");
_Static_assert(offsetof(ncclNetProperties_v12_t, speed) == 36, "v12 speed");
_Static_assert(offsetof(ncclNetProperties_v12_t, port) == 40, "v12 port");
_Static_assert(offsetof(ncclNetProperties_v12_t, latency) == 44, "v12 latency");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxComms) == 48, "v12 maxComms");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxRecvs) == 52, "v12 maxRecvs");
_Static_assert(offsetof(ncclNetProperties_v12_t, netDeviceType) == 56, "v12 netDeviceType");
_Static_assert(offsetof(ncclNetProperties_v12_t, netDeviceVersion) == 60, "v12 netDeviceVersion");
_Static_assert(offsetof(ncclNetProperties_v12_t, vProps) == 64, "v12 vProps");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104, "v12 maxP2pBytes");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxCollBytes) == 112, "v12 maxCollBytes");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxMultiRequestSize) == 120,
	       "v12 maxMultiRequestSize");
_Static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124, "v12 railId");
_Static_assert(offsetof(ncclNetProperties_v12_t, planeId) == 126, "v12 planeId");
_Static_assert(sizeof(ncclNet_v12_t) == 176, "v12 function table size");
_Static_assert(offsetof(ncclNet_v12_t, finalize) == 160, "v12 finalize slot");
_Static_assert(offsetof(ncclNet_v12_t, setNetAttr) == 168, "v12 setNetAttr slot");

#endif
