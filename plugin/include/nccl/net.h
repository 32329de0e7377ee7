/* SPDX-License-Identifier: Apache-2.0 */
/* All ncclNet versions railhop exports (v8..v12). */
#ifndef RH_NCCL_NET_H
#define RH_NCCL_NET_H

#include "net_v8.h"
#include "net_v9.h"
#include "net_v10.h"
#include "net_v11.h"
#include "net_v12.h"

#endif
