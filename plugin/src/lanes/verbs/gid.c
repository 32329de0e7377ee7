/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The RoCE v2 GID of a NIC address (verbs.h): rxe and RoCE devices list one GID per address and
 * RoCE version; the IPv4-mapped one (::ffff:a.b.c.d) of type "RoCE v2" is routable over UDP.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "verbs.h"

static int read_line(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f) {
		return -errno;
	}
	n = fread(buf, 1, cap - 1, f);
	fclose(f);
	buf[n] = '\0';
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) {
		buf[--n] = '\0';
	}
	return 0;
}

/* "0000:0000:0000:0000:0000:ffff:0a00:0001" for 10.0.0.1 */
static void mapped_gid(uint32_t ip, char *out, size_t cap)
{
	const uint8_t *b = (const uint8_t *)&ip;

	snprintf(out, cap, "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", b[0], b[1], b[2],
		 b[3]);
}

int verbs_gid_index(const char *root, const char *dev, int port, uint32_t ip)
{
	char dir[512], path[1024], want[64], val[128];
	struct dirent *de;
	DIR *d;
	int best = -ENOENT;

	snprintf(dir, sizeof(dir), "%s/sys/class/infiniband/%s/ports/%d/gids", root ? root : "",
		 dev, port);
	d = opendir(dir);
	if (!d) {
		return -errno;
	}
	mapped_gid(ip, want, sizeof(want));
	while ((de = readdir(d))) {
		char *end;
		long i = strtol(de->d_name, &end, 10);

		if (de->d_name[0] == '.' || *end || i < 0 || i > 65535) {
			continue;
		}
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (read_line(path, val, sizeof(val)) < 0 || strcasecmp(val, want)) {
			continue;
		}
		snprintf(path, sizeof(path),
			 "%s/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%ld",
			 root ? root : "", dev, port, i);
		if (read_line(path, val, sizeof(val)) < 0 || strcasecmp(val, "RoCE v2")) {
			continue;
		}
		if (best < 0 || i < best) {
			best = (int)i;
		}
	}
	closedir(d);
	return best;
}
