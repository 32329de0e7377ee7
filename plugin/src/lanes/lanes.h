/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The concrete transports, private to lanes/: the core reaches them only through
 * rh_lanes_choose() (lane_ops.h).
 */
#ifndef RH_LANES_H
#define RH_LANES_H

#include <stdbool.h>
#include <stddef.h>

#include "lane_ops.h"

extern const struct lane_ops rh_tcp_ops;
#ifdef RH_HAVE_OFI
extern const struct lane_ops rh_ofi_ops;
/* An RDMA-class libfabric provider (verbs) offers FI_EP_MSG + FI_RMA here. */
bool rh_ofi_rdma_provider(char *name, size_t cap);
#endif

#endif
