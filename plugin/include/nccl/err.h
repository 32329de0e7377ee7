/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ncclResult_t as seen by a network plugin. Written from the facts in
 * shared/research/ncclnet.md §0 and §2 (values are part of NCCL's ABI).
 */
#ifndef RH_NCCL_ERR_H
#define RH_NCCL_ERR_H

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	/* Core-only code; a plugin must never return it (NCCLCHECK treats it as success). */
	ncclInProgress = 7,
} ncclResult_t;

_Static_assert(sizeof(ncclResult_t) == 4, "ncclResult_t is a 4-byte enum");

#endif
