/* SPDX-License-Identifier: Apache-2.0 */
/* ncclNet v8 (NCCL 2.20.3+), from ncclnet.md §3. */
#ifndef RH_NCCL_NET_V8_H
#define RH_NCCL_NET_V8_H

#include "net_device.h"

typedef struct {
	char *name;
	char *pciPath;
	uint64_t guid;
	int ptrSupport;
	int regIsGlobal;
	int speed;
	int port;
	float latency;
	int maxComms;
	int maxRecvs;
	ncclNetDeviceType netDeviceType;
	int netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
	const char *name;
	ncclResult_t (*init)(ncclDebugLogger_t logFunction);
	ncclResult_t (*devices)(int *ndev);
	ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t *props);
	ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
	ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
				ncclNetDeviceHandle_v8_t **sendDevComm);
	ncclResult_t (*accept)(void *listenComm, void **recvComm,
			       ncclNetDeviceHandle_v8_t **recvDevComm);
	ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
	ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
				    int fd, void **mhandle);
	ncclResult_t (*deregMr)(void *comm, void *mhandle);
	ncclResult_t (*isend)(void *sendComm, void *data, int size, int tag, void *mhandle,
			      void **request);
	ncclResult_t (*irecv)(void *recvComm, int n, void **data, int *sizes, int *tags,
			      void **mhandles, void **request);
	ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
			       void **request);
	ncclResult_t (*test)(void *request, int *done, int *sizes);
	ncclResult_t (*closeSend)(void *sendComm);
	ncclResult_t (*closeRecv)(void *recvComm);
	ncclResult_t (*closeListen)(void *listenComm);
	ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
	ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
} ncclNet_v8_t;

_Static_assert(sizeof(ncclNetProperties_v8_t) == 64, "v8 properties size");
_Static_assert(offsetof(ncclNetProperties_v8_t, pciPath) == 8, "v8 pciPath");
_Static_assert(offsetof(ncclNetProperties_v8_t, guid) == 16, "v8 guid");
_Static_assert(offsetof(ncclNetProperties_v8_t, ptrSupport) == 24, "v8 ptrSupport");
_Static_assert(offsetof(ncclNetProperties_v8_t, regIsGlobal) == 28, "v8 regIsGlobal");
_Static_assert(offsetof(ncclNetProperties_v8_t, speed) == 32, "v8 speed");
_Static_assert(offsetof(ncclNetProperties_v8_t, port) == 36, "v8 port");
_Static_assert(offsetof(ncclNetProperties_v8_t, latency) == 40, "v8 latency");
_Static_assert(offsetof(ncclNetProperties_v8_t, maxComms) == 44, "v8 maxComms");
_Static_assert(offsetof(ncclNetProperties_v8_t, maxRecvs) == 48, "v8 maxRecvs");
_Static_assert(offsetof(ncclNetProperties_v8_t, netDeviceType) == 52, "v8 netDeviceType");
_Static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56, "v8 netDeviceVersion");
_Static_assert(sizeof(ncclNet_v8_t) == 152, "v8 function table size");
_Static_assert(offsetof(ncclNet_v8_t, isend) == 80, "v8 isend slot");
_Static_assert(offsetof(ncclNet_v8_t, irecvConsumed) == 144, "v8 irecvConsumed slot");

#endif
