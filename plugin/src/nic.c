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

static int cmp_nic(const void *a, const void *b)
{
	return strcmp(((const struct rh_nic *)a)->ifname, ((const struct rh_nic *)b)->ifname);
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
	struct ifaddrs *ifs;
	int n = 0;

	if (getifaddrs(&ifs) < 0) {
		WARN("getifaddrs: %s", strerror(errno));
		return -errno;
	}
	if (rh_param.NICS[0]) {
		int ns = rh_nic_parse_list(rh_param.NICS, specs, RH_MAX_NICS);

		if (ns <= 0) {
			WARN("RAILHOP_NICS=\"%s\": expected ifname[:rail],...", rh_param.NICS);
			freeifaddrs(ifs);
			return -EINVAL;
		}
		for (int i = 0; i < ns && n < max; i++) {
			memset(&nics[n], 0, sizeof(nics[n]));
			copy_str(nics[n].ifname, sizeof(nics[n].ifname), specs[i].ifname);
			if (find_ipv4(ifs, specs[i].ifname, &nics[n].ipv4) < 0) {
				WARN("RAILHOP_NICS: %s has no IPv4 address, skipped",
				     specs[i].ifname);
				continue;
			}
			nics[n].rail = specs[i].rail >= 0 ? specs[i].rail : i;
			n++;
		}
	} else {
		for (struct ifaddrs *i = ifs; i && n < max; i = i->ifa_next) {
			bool dup = false;

			if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET ||
			    !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) {
				continue;
			}
			for (int j = 0; j < n; j++) {
				dup |= !strcmp(nics[j].ifname, i->ifa_name);
			}
			if (dup) {
				continue;
			}
			memset(&nics[n], 0, sizeof(nics[n]));
			copy_str(nics[n].ifname, sizeof(nics[n].ifname), i->ifa_name);
			nics[n].ipv4 = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
			n++;
		}
		qsort(nics, n, sizeof(nics[0]), cmp_nic);
		for (int i = 0; i < n; i++) {
			nics[i].rail = i;
		}
	}
	freeifaddrs(ifs);
	for (int i = 0; i < n; i++) {
		char ip[INET_ADDRSTRLEN];

		rh_nic_read_sysfs(rh_param.SYSFS_ROOT, &nics[i]);
		nics[i].up = true;
		inet_ntop(AF_INET, &nics[i].ipv4, ip, sizeof(ip));
		INFO("NIC %d: %s %s rail %d numa %d speed %d pci %s", i, nics[i].ifname, ip,
		     nics[i].rail, nics[i].numa, nics[i].speed, nics[i].pci[0] ? nics[i].pci : "-");
	}
	if (n == 0) {
		WARN("no usable NIC (set RAILHOP_NICS=ifname[:rail],...)");
		return -ENODEV;
	}
	return n;
}
