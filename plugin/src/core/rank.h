/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Backup pair ranking (pure, unit-tested): given both NIC tables, their health, the failed
 * original (local, remote) pair and the rules, return the usable (local, remote) pairs, best
 * first, with spreading weights. Rules: both ends healthy; the rail rule; the distance limit
 * (PCIe/NUMA class of each backup NIC relative to that side's original NIC; without PCI
 * information, same NUMA node = NODE). The caller then probes (a lane handshake round trip).
 */
#ifndef RH_RANK_H
#define RH_RANK_H

#include <stdbool.h>
#include <stdint.h>

#include "../param.h"

struct rh_rank_nic {
	int rail;
	int numa;
	const char *pci; /* "" or NULL when unknown */
	bool up;
	int load; /* lanes already moved onto this NIC (spreading) */
};

struct rh_rank_in {
	const struct rh_rank_nic *local;
	int nlocal;
	const struct rh_rank_nic *remote;
	int nremote;
	int orig_local, orig_remote;
	enum rh_rail_rule rule;
	/* RH_RAIL_ALLOWED_PAIRS: rail_peers[r] bit q set when local rail r may join remote rail
	 * q (rails 0..RH_RAIL_PEER_MAX; may be NULL: same rail only) */
	const uint64_t *rail_peers;
	enum rh_dist limit;
	/* Pairs to leave out (already in use or known bad): bad[l * nremote + r]; may be NULL. */
	const bool *exclude;
};

struct rh_pair {
	int local, remote;
	enum rh_dist dist; /* worse of the two sides' classes */
	int weight; /* relative share of the moved traffic (>= 1) */
	uint32_t share; /* the agent's plan share x 10000; 0: ranked here, no byte share */
};

/* PCIe/NUMA distance class between two NICs of one host. */
enum rh_dist rh_nic_distance(const char *pci_a, int numa_a, const char *pci_b, int numa_b);
/* Fill out[] (at most max) with candidate pairs, best first. Returns the count. */
int rh_rank_pairs(const struct rh_rank_in *in, struct rh_pair *out, int max);

#endif
