/* SPDX-License-Identifier: Apache-2.0 */
/* ncclNet v10 (NCCL 2.26.2+), from ncclnet.md §3. */
#ifndef RH_NCCL_NET_V10_H
#define RH_NCCL_NET_V10_H

#include "net_v9.h"

/* v9 and v10 vProps/properties are layout-identical (ncclnet.md §3.1): one type. */
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v10_t;

typedef struct {
	int trafficClass;
} ncclNetCommConfig_v10_t;

typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

typedef struct {
	const char *name;
	ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
	ncclResult_t (*devices)(int *ndev);
	ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t *props);
	ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
	ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t *config, void *handle,
				void **sendComm, ncclNetDeviceHandle_v10_t **sendDevComm);
	ncclResult_t (*accept)(void *listenComm, void **recvComm,
			       ncclNetDeviceHandle_v10_t **recvDevComm);
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
	ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v10_t *props);
} ncclNet_v10_t;

_Static_assert(sizeof(ncclNetVDeviceProps_v10_t) == 20, "v10 vProps size");
_Static_assert(sizeof(ncclNetCommConfig_v10_t) == 4, "v10 commConfig size");
_Static_assert(sizeof(ncclNetProperties_v10_t) == 104, "v10 properties size");
_Static_assert(offsetof(ncclNetProperties_v10_t, forceFlush) == 32, "v10 forceFlush");
_Static_assert(offsetof(ncclNetProperties_v10_t, speed) == 36, "v10 speed");
_Static_assert(offsetof(ncclNetProperties_v10_t, port) == 40, "v10 port");
_Static_assert(offsetof(ncclNetProperties_v10_t, latency) == 44, "v10 latency");
_Static_assert(offsetof(ncclNetProperties_v10_t, maxComms) == 48, "v10 maxComms");
_Static_assert(offsetof(ncclNetProperties_v10_t, maxRecvs) == 52, "v10 maxRecvs");
_Static_assert(offsetof(ncclNetProperties_v10_t, netDeviceType) == 56, "v10 netDeviceType");
_Static_assert(offsetof(ncclNetProperties_v10_t, netDeviceVersion) == 60, "v10 netDeviceVersion");
_Static_assert(offsetof(ncclNetProperties_v10_t, vProps) == 64, "v10 vProps");
_Static_assert(offsetof(ncclNetProperties_v10_t, maxP2pBytes) == 88, "v10 maxP2pBytes");
_Static_assert(offsetof(ncclNetProperties_v10_t, maxCollBytes) == 96, "v10 maxCollBytes");
_Static_assert(sizeof(ncclNet_v10_t) == 160, "v10 function table size");
_Static_assert(offsetof(ncclNet_v10_t, makeVDevice) == 152, "v10 makeVDevice slot");

#endif
