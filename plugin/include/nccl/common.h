/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Types and constants shared by every ncclNet version (ncclnet.md §2).
 */
#ifndef RH_NCCL_COMMON_H
#define RH_NCCL_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef enum {
	NCCL_LOG_NONE = 0,
	NCCL_LOG_VERSION = 1,
	NCCL_LOG_WARN = 2,
	NCCL_LOG_INFO = 3,
	NCCL_LOG_ABORT = 4,
	NCCL_LOG_TRACE = 5,
} ncclDebugLogLevel;

typedef enum {
	NCCL_INIT = 1,
	NCCL_COLL = 2,
	NCCL_P2P = 4,
	NCCL_SHM = 8,
	NCCL_NET = 16,
	NCCL_GRAPH = 32,
	NCCL_TUNING = 64,
	NCCL_ENV = 128,
	NCCL_ALLOC = 256,
	NCCL_CALL = 512,
	NCCL_PROXY = 1024,
	NCCL_NVLS = 2048,
	NCCL_BOOTSTRAP = 4096,
	NCCL_REG = 8192,
	NCCL_PROFILE = 16384,
	NCCL_RAS = 32768,
	NCCL_DESTROY = 65536,
	NCCL_ALLOC_HOST = 131072,
	NCCL_ALL = ~0,
} ncclDebugLogSubSys;

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char *file,
				  int line, const char *fmt, ...);

typedef ncclResult_t (*ncclProfilerCallback_t)(void **eHandle, int type, void *pHandle,
					       int64_t pluginId, void *extData);

enum {
	ncclProfilerNetEventStart = 0,
	ncclProfilerNetEventStop = 1,
	ncclProfilerNetEventUpdate = 2,
	ncclProfilerNetEventUpdateAndStop = 3,
};

#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_NET_MAX_REQUESTS 32
/* Upper bound NCCL accepts for maxP2pBytes: 1 TiB. */
#define NCCL_MAX_NET_SIZE_BYTES (1ULL * 1024 * 1024 * 1024 * 1024)
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1
#define NCCL_NET_MULTI_REQUEST 0x2
/* Core limits NCCL applies when adapting a v8 plugin. */
#define NCCL_MAX_NET_SIZE_V8 (1ULL << 30)
#define NCCL_MAX_COLLNET_SIZE (1ULL << 29)

#define NCCL_NET_MAX_DEVS_PER_NIC_V11 4
#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8
#define NCCL_NET_TRAFFIC_CLASS_UNDEF (-1)
#define NCCL_NET_ID_UNDEF (-1)
#define NCCL_NET_ATTR_UNDEF (-1)

#endif
