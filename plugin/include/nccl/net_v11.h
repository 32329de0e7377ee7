/* SPDX-License-Identifier: Apache-2.0 */
/* ncclNet v11 (NCCL 2.28.3+), from ncclnet.md §3. init is per communicator (ctx). */
#ifndef RH_NCCL_NET_V11_H
#define RH_NCCL_NET_V11_H

#include "net_device.h"

typedef struct {
	int ndevs;
	int devs[NCCL_NET_MAX_DEVS_PER_NIC_V11];
} ncclNetVDeviceProps_v11_t;

typedef struct {
	int trafficClass;
} ncclNetCommConfig_v11_t;

typedef struct {
	int32_t maxConcurrentPeers;
	int32_t minConcurrentPeers;
	int32_t maxFlowsPerPeer;
	int32_t minFlowsPerPeer;
} ncclNetCommAttr_v11_t;

typedef struct {
	ncclNetCommAttr_v11_t sendCommAttr;
	ncclNetCommAttr_v11_t recvCommAttr;
	uint32_t op;
	uint32_t algo;
	uint32_t proto;
} ncclNetAttr_v11_t;

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
	ncclNetVDeviceProps_v11_t vProps;
	size_t maxP2pBytes;
	size_t maxCollBytes;
	int maxMultiRequestSize;
} ncclNetProperties_v11_t;

typedef struct {
	const char *name;
	ncclResult_t (*init)(void **ctx, uint64_t commId, ncclNetCommConfig_v11_t *config,
			     ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
	ncclResult_t (*devices)(int *ndev);
	ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t *props);
	ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **listenComm);
	ncclResult_t (*connect)(void *ctx, int dev, void *handle, void **sendComm,
				ncclNetDeviceHandle_v11_t **sendDevComm);
	ncclResult_t (*accept)(void *listenComm, void **recvComm,
			       ncclNetDeviceHandle_v11_t **recvDevComm);
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
	ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v11_t *props);
	ncclResult_t (*finalize)(void *ctx);
	ncclResult_t (*setNetAttr)(void *ctx, ncclNetAttr_v11_t *netAttr);
} ncclNet_v11_t;

_Static_assert(sizeof(ncclNetVDeviceProps_v11_t) == 20, "v11 vProps size");
_Static_assert(sizeof(ncclNetCommConfig_v11_t) == 4, "v11 commConfig size");
_Static_assert(sizeof(ncclNetCommAttr_v11_t) == 16, "v11 commAttr size");
_Static_assert(sizeof(ncclNetAttr_v11_t) == 44, "v11 netAttr size");
_Static_assert(offsetof(ncclNetAttr_v11_t, recvCommAttr) == 16, "v11 recvCommAttr");
_Static_assert(offsetof(ncclNetAttr_v11_t, op) == 32, "v11 op");
_Static_assert(offsetof(ncclNetAttr_v11_t, algo) == 36, "v11 algo");
_Static_assert(offsetof(ncclNetAttr_v11_t, proto) == 40, "v11 proto");
_Static_assert(sizeof(ncclNetProperties_v11_t) == 112, "v11 properties size");
_Static_assert(offsetof(ncclNetProperties_v11_t, forceFlush) == 32, "v11 forceFlush");
_Static_assert(offsetof(ncclNetProperties_v11_t, speed) == 36, "v11 speed");
_Static_assert(offsetof(ncclNetProperties_v11_t, port) == 40, "v11 port");
_Static_assert(offsetof(ncclNetProperties_v11_t, latency) == 44, "v11 latency");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxComms) == 48, "v11 maxComms");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxRecvs) == 52, "v11 maxRecvs");
_Static_assert(offsetof(ncclNetProperties_v11_t, netDeviceType) == 56, "v11 netDeviceType");
_Static_assert(offsetof(ncclNetProperties_v11_t, netDeviceVersion) == 60, "v11 netDeviceVersion");
_Static_assert(offsetof(ncclNetProperties_v11_t, vProps) == 64, "v11 vProps");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxP2pBytes) == 88, "v11 maxP2pBytes");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxCollBytes) == 96, "v11 maxCollBytes");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104,
	       "v11 maxMultiRequestSize");
_Static_assert(sizeof(ncclNet_v11_t) == 176, "v11 function table size");
_Static_assert(offsetof(ncclNet_v11_t, finalize) == 160, "v11 finalize slot");
_Static_assert(offsetof(ncclNet_v11_t, setNetAttr) == 168, "v11 setNetAttr slot");

#endif
