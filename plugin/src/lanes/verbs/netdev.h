/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verbs lanes: the RDMA device behind a network interface (netdev.c), for the verbs lane's
 * device choice and RAILHOP_TRANSPORT=auto (lanes.c). Plain sysfs reads, no libibverbs.
 */
#ifndef RH_VERBS_NETDEV_H
#define RH_VERBS_NETDEV_H

#include <stdbool.h>
#include <stddef.h>

/* The RDMA device (name into dev, cap bytes) and port serving interface ifname: a port whose
 * <root>/sys/class/infiniband/<dev>/ports/<port>/gid_attrs/ndevs/<i> names ifname (RoCE,
 * Soft-RoCE), else a device under <root>/sys/class/net/<ifname>/device/infiniband/ (port 1).
 * root NULL or "" for the live system. 0, -ENOENT (none), -EINVAL, -ENAMETOOLONG. */
int verbs_netdev_ibdev(const char *root, const char *ifname, char *dev, size_t cap, int *port);
/* True when every one of the n interfaces has an RDMA device; why (cap bytes) gets the mapping
 * ("eth1=rxe0:1 eth2=rxe1:1") or the first interface without one. */
bool verbs_netdevs_rdma(const char *root, const char *const *ifnames, int n, char *why, size_t cap);

#endif
