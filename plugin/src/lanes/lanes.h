/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The concrete transports and the choice between them, for the assembly point (api_nccl.c),
 * which registers the choice with the core (rh_core_set_transport, core/lane_ops.h). The core
 * never includes this header.
 */
#ifndef RH_LANES_H
#define RH_LANES_H

#include <stdbool.h>
#include <stddef.h>

#include "../core/lane_ops.h"

/* The transport for this process: RAILHOP_TRANSPORT=tcp|ofi|verbs forces one, auto takes verbs
 * where every managed NIC is an RDMA device and libibverbs loads, else libfabric where an
 * RDMA-class provider is found, else tcp; logs why. NULL: the one asked for is not
 * available (a clear error at init, never a silent fallback). Reads rh_param: call it after the
 * parameters are loaded (the core's start does, through the registered picker). */
const struct lane_ops *rh_lanes_choose(void);

extern const struct lane_ops tcp_lane_ops;
#ifdef RH_HAVE_OFI
extern const struct lane_ops ofi_lane_ops;
/* An RDMA-class libfabric provider (verbs) offers FI_EP_MSG + FI_RMA here. */
bool ofi_rdma_provider(char *name, size_t cap);
#endif
#ifdef RH_HAVE_VERBS
extern const struct lane_ops verbs_lane_ops;
#endif

#endif
