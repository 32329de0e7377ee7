/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device-offload handle: one layout for v7..v12 (ncclnet.md §2).
 */
#ifndef RH_NCCL_NET_DEVICE_H
#define RH_NCCL_NET_DEVICE_H

#include <stddef.h>

#include "common.h"

typedef enum {
	NCCL_NET_DEVICE_HOST = 0,
	NCCL_NET_DEVICE_UNPACK = 1,
	NCCL_NET_DEVICE_GIN_PROXY = 2,
	NCCL_NET_DEVICE_GIN_GDAKI = 3,
} ncclNetDeviceType;

#define NCCL_NET_DEVICE_INVALID_VERSION 0x0
#define NCCL_NET_DEVICE_UNPACK_VERSION 0x7
#define NCCL_NET_MTU_SIZE 4096

typedef struct {
	ncclNetDeviceType netDeviceType;
	int netDeviceVersion;
	void *handle;
	size_t size;
	int needsProxyProgress;
} ncclNetDeviceHandle_v8_t;

typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v9_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v10_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v11_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v12_t;

_Static_assert(sizeof(ncclNetDeviceType) == 4, "device type is a 4-byte enum");
_Static_assert(sizeof(ncclNetDeviceHandle_v8_t) == 32, "device handle size");
_Static_assert(offsetof(ncclNetDeviceHandle_v8_t, netDeviceVersion) == 4, "netDeviceVersion");
_Static_assert(offsetof(ncclNetDeviceHandle_v8_t, handle) == 8, "handle");
_Static_assert(offsetof(ncclNetDeviceHandle_v8_t, size) == 16, "size");
_Static_assert(offsetof(ncclNetDeviceHandle_v8_t, needsProxyProgress) == 24, "needsProxyProgress");

#endif
