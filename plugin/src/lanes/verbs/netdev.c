/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which RDMA device (and port) serves a network interface (netdev.h), from sysfs: a port lists
 * the net devices of its GIDs in gid_attrs/ndevs/<i> (RoCE hardware and Soft-RoCE alike); a
 * device bound to the interface's PCI function appears under the interface's
 * device/infiniband/ directory (port 1 assumed then). root= for fixtures.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "netdev.h"

static bool file_is(const char *path, const char *want)
{
	char buf[64];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f) {
		return false;
	}
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) {
		buf[--n] = '\0';
	}
	return strcmp(buf, want) == 0;
}

static bool plain_name(const char *s)
{
	return s[0] != '.' && !strchr(s, '/');
}

/* Does port `port` of device dev list ifname among its GIDs' net devices? */
static bool port_has(const char *root, const char *dev, const char *port, const char *ifname)
{
	char dir[512], path[1024];
	struct dirent *de;
	bool found = false;
	DIR *d;

	if (snprintf(dir, sizeof(dir), "%s/sys/class/infiniband/%s/ports/%s/gid_attrs/ndevs", root,
		     dev, port) >= (int)sizeof(dir)) {
		return false;
	}
	d = opendir(dir);
	if (!d) {
		return false;
	}
	while (!found && (de = readdir(d))) {
		if (!plain_name(de->d_name)) {
			continue;
		}
		if (snprintf(path, sizeof(path), "%s/%s", dir, de->d_name) < (int)sizeof(path)) {
			found = file_is(path, ifname);
		}
	}
	closedir(d);
	return found;
}

static int by_ndevs(const char *root, const char *ifname, char *dev, size_t cap, int *port)
{
	char dir[512], pdir[768];
	struct dirent *de, *pe;
	int rc = -ENOENT;
	DIR *d, *p;

	snprintf(dir, sizeof(dir), "%s/sys/class/infiniband", root);
	d = opendir(dir);
	if (!d) {
		return -ENOENT;
	}
	while (rc < 0 && (de = readdir(d))) {
		if (!plain_name(de->d_name)) {
			continue;
		}
		if (snprintf(pdir, sizeof(pdir), "%s/%s/ports", dir, de->d_name) >=
		    (int)sizeof(pdir)) {
			continue;
		}
		p = opendir(pdir);
		if (!p) {
			continue;
		}
		while (rc < 0 && (pe = readdir(p))) {
			char *end;
			long n = strtol(pe->d_name, &end, 10);

			if (!plain_name(pe->d_name) || *end || n < 1 || n > 255 ||
			    !port_has(root, de->d_name, pe->d_name, ifname)) {
				continue;
			}
			if (strlen(de->d_name) >= cap) {
				rc = -ENAMETOOLONG;
				break;
			}
			strcpy(dev, de->d_name);
			*port = (int)n;
			rc = 0;
		}
		closedir(p);
	}
	closedir(d);
	return rc;
}

static int by_pci(const char *root, const char *ifname, char *dev, size_t cap, int *port)
{
	char dir[512];
	struct dirent *de;
	int rc = -ENOENT;
	DIR *d;

	snprintf(dir, sizeof(dir), "%s/sys/class/net/%s/device/infiniband", root, ifname);
	d = opendir(dir);
	if (!d) {
		return -ENOENT;
	}
	while (rc < 0 && (de = readdir(d))) {
		if (!plain_name(de->d_name)) {
			continue;
		}
		if (strlen(de->d_name) >= cap) {
			rc = -ENAMETOOLONG;
			break;
		}
		strcpy(dev, de->d_name);
		*port = 1;
		rc = 0;
	}
	closedir(d);
	return rc;
}

int verbs_netdev_ibdev(const char *root, const char *ifname, char *dev, size_t cap, int *port)
{
	int rc;

	root = root ? root : "";
	if (!ifname[0] || !plain_name(ifname) || cap == 0) {
		return -EINVAL;
	}
	rc = by_ndevs(root, ifname, dev, cap, port);
	return rc == -ENOENT ? by_pci(root, ifname, dev, cap, port) : rc;
}

bool verbs_netdevs_rdma(const char *root, const char *const *ifnames, int n, char *why, size_t cap)
{
	size_t o = 0;

	if (n <= 0) {
		snprintf(why, cap, "no NIC managed");
		return false;
	}
	for (int i = 0; i < n; i++) {
		char dev[64];
		int port, w;

		if (verbs_netdev_ibdev(root, ifnames[i], dev, sizeof(dev), &port) < 0) {
			snprintf(why, cap, "%s is not an RDMA device", ifnames[i]);
			return false;
		}
		w = snprintf(why + o, cap > o ? cap - o : 0, "%s%s=%s:%d", i ? " " : "", ifnames[i],
			     dev, port);
		o += w > 0 ? (size_t)w : 0;
	}
	return true;
}
