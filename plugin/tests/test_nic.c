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

static struct rh_nic_cand C(const char *name, bool up, bool loopback) {
	struct rh_nic_cand c;

	memset(&c, 0, sizeof(c));
	snprintf(c.ifname, sizeof(c.ifname), "%s", name);
	c.up = up;
	c.loopback = loopback;
	return c;
}

/* RAILHOP_NICS in NCCL_SOCKET_IFNAME syntax, and auto-detection's default skip list. */
static void
test_select(void)
{
	struct rh_nic_cand cand[] = {
		C("lo", true, true),	  C("docker0", true, false),   C("veth12ab", true, false),
		C("cni0", true, false),	  C("flannel.1", true, false), C("cali9f", true, false),
		C("virbr0", true, false), C("eth10", true, false),     C("eth1", true, false),
		C("ib0", true, false),	  C("eth2", false, false),     C("nic1", true, false),
		C("nic0", true, false),
	};
	int nc = (int)(sizeof(cand) / sizeof(cand[0]));
	struct rh_nic_spec out[RH_MAX_NICS];
	bool unmatched[RH_MAX_NICS];
	struct rh_nic_sel sel;
	int n;

	EXPECT(rh_nic_default_skip("lo"));
	EXPECT(rh_nic_default_skip("docker0") && rh_nic_default_skip("veth0") &&
	       rh_nic_default_skip("cni0") && rh_nic_default_skip("flannel.1") &&
	       rh_nic_default_skip("cali1") && rh_nic_default_skip("virbr0"));
	EXPECT(!rh_nic_default_skip("eth0") && !rh_nic_default_skip("lo1") &&
	       !rh_nic_default_skip("ib0"));

	/* Auto: up, not loopback, not skipped; sorted; rail = position. */
	EXPECT_EQ(rh_nic_parse_sel("", &sel), 0);
	n = rh_nic_select(&sel, cand, nc, out, RH_MAX_NICS, NULL);
	EXPECT_EQ(n, 5);
	EXPECT(n == 5 && !strcmp(out[0].ifname, "eth1") && !strcmp(out[1].ifname, "eth10") &&
	       !strcmp(out[2].ifname, "ib0") && !strcmp(out[3].ifname, "nic0") &&
	       !strcmp(out[4].ifname, "nic1"));
	EXPECT(n == 5 && out[0].rail == 0 && out[4].rail == 4);

	/* Prefixes, in the list's order, each entry's matches sorted. */
	EXPECT_EQ(rh_nic_parse_sel("nic,eth1", &sel), 0);
	n = rh_nic_select(&sel, cand, nc, out, RH_MAX_NICS, unmatched);
	EXPECT_EQ(n, 4);
	EXPECT(n == 4 && !strcmp(out[0].ifname, "nic0") && !strcmp(out[1].ifname, "nic1") &&
	       !strcmp(out[2].ifname, "eth1") && !strcmp(out[3].ifname, "eth10"));
	EXPECT(!unmatched[0] && !unmatched[1]);

	/* '=': exact names; ':rail' kept; a listed NIC is taken whatever its flags. */
	EXPECT_EQ(rh_nic_parse_sel("=eth1:7,eth2:5,nic9", &sel), 0);
	EXPECT(sel.exact && !sel.exclude && sel.n == 3);
	n = rh_nic_select(&sel, cand, nc, out, RH_MAX_NICS, unmatched);
	EXPECT_EQ(n, 2);
	EXPECT(n == 2 && !strcmp(out[0].ifname, "eth1") && out[0].rail == 7 &&
	       !strcmp(out[1].ifname, "eth2") && out[1].rail == 5);
	EXPECT(!unmatched[0] && !unmatched[1] && unmatched[2]);

	/* A NIC named twice is taken once. */
	EXPECT_EQ(rh_nic_parse_sel("nic0:3,nic", &sel), 0);
	n = rh_nic_select(&sel, cand, nc, out, RH_MAX_NICS, NULL);
	EXPECT_EQ(n, 2);
	EXPECT(n == 2 && !strcmp(out[0].ifname, "nic0") && out[0].rail == 3 &&
	       !strcmp(out[1].ifname, "nic1") && out[1].rail == 1);

	/* '^': auto-detection minus the prefixes (the default skips still apply). */
	EXPECT_EQ(rh_nic_parse_sel("^eth,ib", &sel), 0);
	n = rh_nic_select(&sel, cand, nc, out, RH_MAX_NICS, NULL);
	EXPECT_EQ(n, 2);
	EXPECT(n == 2 && !strcmp(out[0].ifname, "nic0") && !strcmp(out[1].ifname, "nic1"));
	/* '^=': exact exclusions. */
	EXPECT_EQ(rh_nic_parse_sel("^=eth1", &sel), 0);
	n = rh_nic_select(&sel, cand, nc, out, RH_MAX_NICS, NULL);
	EXPECT_EQ(n, 4);
	EXPECT(n == 4 && !strcmp(out[0].ifname, "eth10"));

	/* Bad values. */
	EXPECT(rh_nic_parse_sel("^", &sel) < 0);
	EXPECT(rh_nic_parse_sel("=", &sel) < 0);
	EXPECT(rh_nic_parse_sel("^eth0:1", &sel) < 0);
	EXPECT(rh_nic_parse_sel("eth0:x", &sel) < 0);
	EXPECT(rh_nic_parse_sel("eth0,,eth1", &sel) < 0);
	EXPECT(rh_nic_parse_sel("=^eth0", &sel) == 0 && sel.exact && !sel.exclude &&
	       !strcmp(sel.spec[0].ifname, "^eth0"));
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
	test_select();
	TEST_DONE();
}
