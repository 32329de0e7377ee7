/* SPDX-License-Identifier: Apache-2.0 */
/* sysfs reads under a fixture root (built here in a temporary directory). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "nic.h"

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static void mkdirs(const char *path)
{
	char tmp[PATH_MAX];

	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + 1; *p; p++) {
		if (*p == '/') {
			*p = 0;
			mkdir(tmp, 0755);
			*p = '/';
		}
	}
	mkdir(tmp, 0755);
}

int main(void)
{
	char root[] = "/tmp/rh-sysfs-XXXXXX", p[PATH_MAX], q[PATH_MAX + 64];
	struct rh_nic nic = { 0 };

	EXPECT(mkdtemp(root) != NULL);
	snprintf(p, sizeof(p), "%s/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0", root);
	mkdirs(p);
	snprintf(q, sizeof(q), "%s/numa_node", p);
	put(q, "1\n");
	snprintf(p, sizeof(p), "%s/sys/class/net/eth0", root);
	mkdirs(p);
	snprintf(q, sizeof(q), "%s/speed", p);
	put(q, "100000\n");
	snprintf(q, sizeof(q), "%s/carrier", p);
	put(q, "1\n");
	snprintf(q, sizeof(q), "%s/device", p);
	EXPECT_EQ(symlink("../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0", q), 0);
	snprintf(p, sizeof(p), "%s/sys/class/net/veth0", root);
	mkdirs(p);
	snprintf(q, sizeof(q), "%s/speed", p);
	put(q, "-1\n");
	snprintf(q, sizeof(q), "%s/carrier", p);
	put(q, "0\n");

	snprintf(p, sizeof(p), "%s/sys/class/net/down0", root);
	mkdirs(p);
	snprintf(q, sizeof(q), "%s/operstate", p);
	put(q, "down\n"); /* admin down: carrier is unreadable, operstate says it */

	strcpy(nic.ifname, "eth0");
	rh_nic_read_sysfs(root, &nic);
	EXPECT(strcmp(nic.pci, "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0") == 0);
	EXPECT_EQ(nic.numa, 1);
	EXPECT_EQ(nic.speed, 100000);
	EXPECT_EQ(rh_nic_read_carrier(root, "eth0"), 1);

	strcpy(nic.ifname, "veth0");
	rh_nic_read_sysfs(root, &nic);
	EXPECT_EQ(nic.pci[0], 0); /* virtual: no PCI path */
	EXPECT_EQ(nic.numa, -1);
	EXPECT_EQ(nic.speed, 10000); /* unknown speed: fallback */
	EXPECT_EQ(rh_nic_read_carrier(root, "veth0"), 0);
	EXPECT_EQ(rh_nic_read_carrier(root, "missing0"), -1);
	EXPECT_EQ(rh_nic_read_carrier(root, "down0"), 0);

	snprintf(p, sizeof(p), "rm -rf '%s'", root);
	EXPECT_EQ(system(p), 0);
	TEST_DONE();
}
