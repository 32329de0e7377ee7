/* SPDX-License-Identifier: Apache-2.0 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "nic.h"
#include "param.h"

int rh_nic_parse_list(const char *s, struct rh_nic_spec *out, int max)
{
	int n = 0;
	const char *p = s;

	while (p && *p) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		const char *colon = memchr(p, ':', len);
		size_t nlen = colon ? (size_t)(colon - p) : len;

		if (nlen == 0 || nlen >= IF_NAMESIZE || n >= max) {
			return -EINVAL;
		}
		memcpy(out[n].ifname, p, nlen);
		out[n].ifname[nlen] = 0;
		out[n].rail = -1;
		if (colon) {
			char buf[16];
			int64_t r;
			size_t rlen = len - nlen - 1;

			if (rlen == 0 || rlen >= sizeof(buf)) {
				return -EINVAL;
			}
			memcpy(buf, colon + 1, rlen);
			buf[rlen] = 0;
			if (rh_parse_int(buf, 0, 32767, &r) < 0) {
				return -EINVAL;
			}
			out[n].rail = (int)r;
		}
		n++;
		p = end ? end + 1 : NULL;
	}
	return n;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
	size_t n = strnlen(src, cap - 1);

	memcpy(dst, src, n);
	dst[n] = 0;
}

int rh_nic_parse_sel(const char *s, struct rh_nic_sel *sel)
{
	int n;

	memset(sel, 0, sizeof(*sel));
	if (*s == '^') {
		sel->exclude = true;
		s++;
	}
	if (*s == '=') {
		sel->exact = true;
		s++;
	}
	if (!*s) {
		return sel->exclude || sel->exact ? -EINVAL : 0;
	}
	n = rh_nic_parse_list(s, sel->spec, RH_MAX_NICS);
	if (n <= 0) {
		return -EINVAL;
	}
	for (int i = 0; i < n && sel->exclude; i++) {
		if (sel->spec[i].rail >= 0) {
			return -EINVAL; /* a rail for an excluded NIC means nothing */
		}
	}
	sel->n = n;
	return 0;
}

static bool has_prefix(const char *name, const char *prefix)
{
	return !strncmp(name, prefix, strlen(prefix));
}

bool rh_nic_default_skip(const char *ifname)
{
	static const char *const skip[] = { "docker", "veth", "cni", "flannel", "cali", "virbr" };

	if (!strcmp(ifname, "lo")) {
		return true;
	}
	for (size_t i = 0; i < sizeof(skip) / sizeof(skip[0]); i++) {
		if (has_prefix(ifname, skip[i])) {
			return true;
		}
	}
	return false;
}

static bool spec_matches(const struct rh_nic_sel *sel, const struct rh_nic_spec *sp,
			 const char *ifname)
{
	return sel->exact ? !strcmp(ifname, sp->ifname) : has_prefix(ifname, sp->ifname);
}

static int cmp_cand(const void *a, const void *b)
{
	return strcmp(((const struct rh_nic_cand *)a)->ifname,
		      ((const struct rh_nic_cand *)b)->ifname);
}

int rh_nic_select(const struct rh_nic_sel *sel, const struct rh_nic_cand *cand, int ncand,
		  struct rh_nic_spec *out, int max, bool *unmatched)
{
	struct rh_nic_cand sorted[64];
	bool taken[64] = { false };
	int n = 0;

	if (ncand > 64) {
		ncand = 64;
	}
	memcpy(sorted, cand, sizeof(cand[0]) * (size_t)ncand);
	qsort(sorted, (size_t)ncand, sizeof(sorted[0]), cmp_cand);
	if (sel->n && !sel->exclude) {
		for (int e = 0; e < sel->n; e++) {
			bool any = false;

			for (int i = 0; i < ncand && n < max; i++) {
				if (taken[i] ||
				    !spec_matches(sel, &sel->spec[e], sorted[i].ifname)) {
					continue;
				}
				taken[i] = any = true;
				copy_str(out[n].ifname, sizeof(out[n].ifname), sorted[i].ifname);
				out[n].rail = sel->spec[e].rail >= 0 ? sel->spec[e].rail : n;
				n++;
			}
			if (unmatched) {
				unmatched[e] = !any;
			}
		}
		return n;
	}
	for (int i = 0; i < ncand && n < max; i++) {
		bool excluded = !sorted[i].up || sorted[i].loopback ||
				rh_nic_default_skip(sorted[i].ifname);

		for (int e = 0; e < sel->n && !excluded; e++) {
			excluded = spec_matches(sel, &sel->spec[e], sorted[i].ifname);
		}
		if (excluded) {
			continue;
		}
		copy_str(out[n].ifname, sizeof(out[n].ifname), sorted[i].ifname);
		out[n].rail = n;
		n++;
	}
	return n;
}

static int read_small(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	size_t got;

	if (!f) {
		return -errno;
	}
	got = fread(buf, 1, len - 1, f);
	fclose(f);
	buf[got] = 0;
	while (got && (buf[got - 1] == '\n' || buf[got - 1] == ' ')) {
		buf[--got] = 0;
	}
	return (int)got;
}

void rh_nic_read_sysfs(const char *root, struct rh_nic *nic)
{
	char path[PATH_MAX], real[PATH_MAX], buf[64];
	size_t rlen = strlen(root);

	nic->pci[0] = 0;
	nic->numa = -1;
	nic->speed = 10000;
	snprintf(path, sizeof(path), "%s/sys/class/net/%s/device", root, nic->ifname);
	if (realpath(path, real)) {
		const char *p = real;

		if (rlen && !strncmp(real, root, rlen)) {
			p += rlen;
		}
		copy_str(nic->pci, sizeof(nic->pci), p);
	}
	snprintf(path, sizeof(path), "%s/sys/class/net/%s/device/numa_node", root, nic->ifname);
	if (read_small(path, buf, sizeof(buf)) > 0) {
		nic->numa = atoi(buf);
	}
	snprintf(path, sizeof(path), "%s/sys/class/net/%s/speed", root, nic->ifname);
	if (read_small(path, buf, sizeof(buf)) > 0 && atoi(buf) > 0) {
		nic->speed = atoi(buf);
	}
}

int rh_nic_read_carrier(const char *root, const char *ifname)
{
	char path[PATH_MAX], buf[32];

	/* operstate first: carrier cannot be read while the link is administratively down. */
	snprintf(path, sizeof(path), "%s/sys/class/net/%s/operstate", root, ifname);
	if (read_small(path, buf, sizeof(buf)) > 0) {
		if (!strcmp(buf, "up")) {
			return 1;
		}
		if (!strcmp(buf, "down") || !strcmp(buf, "lowerlayerdown") ||
		    !strcmp(buf, "notpresent") || !strcmp(buf, "dormant")) {
			return 0;
		}
	}
	snprintf(path, sizeof(path), "%s/sys/class/net/%s/carrier", root, ifname);
	if (read_small(path, buf, sizeof(buf)) <= 0) {
		return -1;
	}
	return buf[0] == '1';
}

static int find_ipv4(struct ifaddrs *ifs, const char *name, uint32_t *ip)
{
	for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
		if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
		    !strcmp(i->ifa_name, name)) {
			*ip = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
			return 0;
		}
	}
	return -ENOENT;
}

int rh_nic_discover(struct rh_nic *nics, int max)
{
	struct rh_nic_spec specs[RH_MAX_NICS];
	struct rh_nic_cand cand[64];
	bool unmatched[RH_MAX_NICS] = { false };
	struct rh_nic_sel sel;
	struct ifaddrs *ifs;
	int ncand = 0, ns, n = 0;

	if (rh_nic_parse_sel(rh_param.NICS, &sel) < 0) {
		WARN("RAILHOP_NICS=\"%s\": expected [^][=]ifname[:rail],... (NCCL_SOCKET_IFNAME "
		     "syntax: prefixes, ^ excludes, = exact names; no :rail after ^)",
		     rh_param.NICS);
		return -EINVAL;
	}
	if (getifaddrs(&ifs) < 0) {
		WARN("getifaddrs: %s", strerror(errno));
		return -errno;
	}
	for (struct ifaddrs *i = ifs; i && ncand < 64; i = i->ifa_next) {
		bool dup = false;

		if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) {
			continue;
		}
		for (int j = 0; j < ncand; j++) {
			dup |= !strcmp(cand[j].ifname, i->ifa_name);
		}
		if (dup) {
			continue;
		}
		copy_str(cand[ncand].ifname, sizeof(cand[ncand].ifname), i->ifa_name);
		cand[ncand].up = i->ifa_flags & IFF_UP;
		cand[ncand].loopback = i->ifa_flags & IFF_LOOPBACK;
		ncand++;
	}
	ns = rh_nic_select(&sel, cand, ncand, specs, max < RH_MAX_NICS ? max : RH_MAX_NICS,
			   unmatched);
	for (int e = 0; e < sel.n && !sel.exclude; e++) {
		if (unmatched[e]) {
			WARN("RAILHOP_NICS: no interface with an IPv4 address %s \"%s\", skipped",
			     sel.exact ? "is named" : "starts with", sel.spec[e].ifname);
		}
	}
	for (int i = 0; i < ns; i++) {
		memset(&nics[n], 0, sizeof(nics[n]));
		copy_str(nics[n].ifname, sizeof(nics[n].ifname), specs[i].ifname);
		if (find_ipv4(ifs, specs[i].ifname, &nics[n].ipv4) < 0) {
			continue;
		}
		nics[n].rail = specs[i].rail;
		n++;
	}
	freeifaddrs(ifs);
	for (int i = 0; i < n; i++) {
		char ip[INET_ADDRSTRLEN];

		rh_nic_read_sysfs(rh_param.SYSFS_ROOT, &nics[i]);
		nics[i].up = true;
		inet_ntop(AF_INET, &nics[i].ipv4, ip, sizeof(ip));
		INFO_INIT("NIC %d: %s %s rail %d numa %d speed %d pci %s", i, nics[i].ifname, ip,
			  nics[i].rail, nics[i].numa, nics[i].speed,
			  nics[i].pci[0] ? nics[i].pci : "-");
	}
	if (n == 0) {
		WARN("no usable NIC (auto-detection skips lo, docker*, veth*, cni*, flannel*, cali*, "
		     "virbr*; set RAILHOP_NICS=[^][=]ifname[:rail],...)");
		return -ENODEV;
	}
	return n;
}
