/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Local NICs: one ncclNet device per NIC (never fused). Discovered once at init from
 * RAILHOP_NICS or auto-detection; sysfs reads take the RAILHOP_SYSFS_ROOT prefix.
 */
#ifndef RH_NIC_H
#define RH_NIC_H

#include <net/if.h>
#include <stdbool.h>
#include <stdint.h>

#define RH_MAX_NICS 16
#define RH_PCI_MAX 128

struct rh_nic {
	char ifname[IF_NAMESIZE];
	uint32_t ipv4; /* network byte order */
	uint16_t port; /* lane listener port, network byte order (0 until listening) */
	int rail;
	int numa; /* -1 unknown */
	int speed; /* Mbps */
	char pci[RH_PCI_MAX]; /* realpath of /sys/class/net/<if>/device; "" when virtual */
	bool up; /* health: carrier / agent / confirmed failures (atomic access) */
};

struct rh_nic_spec {
	char ifname[IF_NAMESIZE];
	int rail; /* -1 = not given */
};

/* Pure: parse "ifname[:rail],..." into specs. Returns the count or -EINVAL. */
int rh_nic_parse_list(const char *s, struct rh_nic_spec *out, int max);

/* RAILHOP_NICS in NCCL_SOCKET_IFNAME syntax: a leading '^' excludes the listed names from
 * auto-detection, a leading '=' (after '^' if both) makes them exact names instead of prefixes;
 * each entry may carry ":rail" (not with '^'). Empty: auto-detection. */
struct rh_nic_sel {
	bool exclude;
	bool exact;
	int n; /* 0 with !exclude: auto-detection */
	struct rh_nic_spec spec[RH_MAX_NICS];
};

/* An interface seen at discovery (one with an IPv4 address). */
struct rh_nic_cand {
	char ifname[IF_NAMESIZE];
	bool up; /* IFF_UP */
	bool loopback; /* IFF_LOOPBACK */
};

/* Pure: parse a RAILHOP_NICS value. 0 or -EINVAL. */
int rh_nic_parse_sel(const char *s, struct rh_nic_sel *sel);
/* Pure: true for names auto-detection skips (lo, docker*, veth*, cni*, flannel*, cali*,
 * virbr*: loopback, container and VM bridges). */
bool rh_nic_default_skip(const char *ifname);
/* Pure: the NICs a selection takes from the candidates, in ncclNet device order, with rails.
 * Listed (include) mode: entry by entry, each entry's matches sorted by name, any flags, each
 * interface once; rail = the entry's ":rail", else the position. Auto and '^' mode: the up,
 * non-loopback candidates not skipped by default nor excluded, sorted by name, rail =
 * position. unmatched (may be NULL) receives, per entry, whether nothing matched it. Returns
 * the count. */
int rh_nic_select(const struct rh_nic_sel *sel, const struct rh_nic_cand *cand, int ncand,
		  struct rh_nic_spec *out, int max, bool *unmatched);
/* Fill pci/numa/speed of nic from sysfs under root. Missing files leave defaults. */
void rh_nic_read_sysfs(const char *root, struct rh_nic *nic);
/* Read the carrier flag; returns 1 up, 0 down, -1 unknown. */
int rh_nic_read_carrier(const char *root, const char *ifname);
/* Discover NICs (RAILHOP_NICS or auto). Returns the count (>0) or a negative errno. */
int rh_nic_discover(struct rh_nic *nics, int max);

#endif
