/* SPDX-License-Identifier: Apache-2.0 */
/* ncclNet v9 (NCCL 2.24.3+), from ncclnet.md §3. */
#ifndef RH_NCCL_NET_V9_H
#define RH_NCCL_NET_V9_H

#include "net_device.h"

typedef struct {
	int ndevs;
	int devs[NCCL_NET_MAX_DEVS_PER_NIC_V11];
} ncclNetVDeviceProps_v9_t;

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
	ncclNetVDeviceProps_v9_t vProps;
	size_t maxP2pBytes;
	size_t maxCollBytes;
} ncclNetProperties_v9_t;

typedef struct {
	const char *name;
	ncclResult_t (*init)(ncclDebugLogger_t logFunction);
	ncclResult_t (*devices)(int *ndev);
	ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t *props);
	ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
	ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
				ncclNetDeviceHandle_v9_t **sendDevComm);
	ncclResult_t (*accept)(void *listenComm, void **recvComm,
			       ncclNetDeviceHandle_v9_t **recvDevComm);
	ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
	ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
				    int fd, void **mhandle);
	ncclResult_t (*deregMr)(void *comm, void *mhandle);
	ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
			      void **request);
	ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
			      void **mhandles, void **request);
	ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
			       void **request);
	ncclResult_t (*test)(void *request, int *done, int *sizes);
	ncclResult_t (*closeSend)(void *sendComm);
	ncclResult_t (*closeRecv)(void *recvComm);
	ncclResult_t (*closeListen)(void *listenComm);
	ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
	ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
	ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v9_t *props);
} ncclNet_v9_t;

_Static_assert(sizeof(ncclNetVDeviceProps_v9_t) == 20, "v9 vProps size");
_Static_assert(sizeof(ncclNetProperties_v9_t) == 104, "v9 properties size");
_Static_assert(offsetof(ncclNetProperties_v9_t, forceFlush) == 32, "v9 forceFlush");
_Static_assert(offsetof(ncclNetProperties_v9_t, speed) == 36, "v9 speed");
_Static_assert(offsetof(ncclNetProperties_v9_t, port) == 40, "v9 port");
_Static_assert(offsetof(ncclNetProperties_v9_t, latency) == 44, "v9 latency");
_Static_assert(offsetof(ncclNetProperties_v9_t, maxComms) == 48, "v9 maxComms");
_Static_assert(offsetof(ncclNetProperties_v9_t, maxRecvs) == 52, "v9 maxRecvs");
_Static_assert(offsetof(ncclNetProperties_v9_t, netDeviceType) == 56, "v9 netDeviceType");
_Static_assert(offsetof(ncclNetProperties_v9_t, netDeviceVersion) == 60, "v9 netDeviceVersion");
_Static_assert(offsetof(ncclNetProperties_v9_t, vProps) == 64, "v9 vProps");
_Static_assert(offsetof(ncclNetProperties_v9_t, maxP2pBytes) == 88, "v9 maxP2pBytes");
_Static_assert(offsetof(ncclNetProperties_v9_t, maxCollBytes) == 96, "v9 maxCollBytes");
_Static_assert(sizeof(ncclNet_v9_t) == 160, "v9 function table size");
_Static_assert(offsetof(ncclNet_v9_t, makeVDevice) == 152, "v9 makeVDevice slot");

#endif
