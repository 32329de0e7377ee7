/* SPDX-License-Identifier: Apache-2.0 */
/* Distance classes and the backup pair ranking. */
#include <stdbool.h>
#include <string.h>

#include "check.h"
#include "core/rank.h"

#define P0 "/sys/devices/pci0000:00"
#define P1 "/sys/devices/pci0000:80"

static void test_distance(void)
{
	/* same switch port (two functions behind one bridge) */
	EXPECT_EQ(rh_nic_distance(P0 "/0000:00:01.0/0000:01:00.0/0000:02:00.0", 0,
				  P0 "/0000:00:01.0/0000:01:00.0/0000:02:00.1", 0),
		  RH_DIST_PIX);
	/* same device */
	EXPECT_EQ(rh_nic_distance(P0 "/0000:00:01.0/0000:01:00.0", 0,
				  P0 "/0000:00:01.0/0000:01:00.0", 0),
		  RH_DIST_PIX);
	/* share a switch below the root port, different downstream ports */
	EXPECT_EQ(rh_nic_distance(P0 "/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:03:00.0", 0,
				  P0 "/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:04:00.0", 0),
		  RH_DIST_PXB);
	/* same host bridge, different root ports */
	EXPECT_EQ(rh_nic_distance(P0 "/0000:00:01.0/0000:01:00.0", 0,
				  P0 "/0000:00:02.0/0000:05:00.0", 0),
		  RH_DIST_PHB);
	/* different host bridges, same / different NUMA node */
	EXPECT_EQ(rh_nic_distance(P0 "/0000:00:01.0/0000:01:00.0", 0,
				  P1 "/0000:80:01.0/0000:81:00.0", 0),
		  RH_DIST_NODE);
	EXPECT_EQ(rh_nic_distance(P0 "/0000:00:01.0/0000:01:00.0", 0,
				  P1 "/0000:80:01.0/0000:81:00.0", 1),
		  RH_DIST_SYS);
	/* no PCI information (veth): NUMA equality decides */
	EXPECT_EQ(rh_nic_distance("", -1, NULL, -1), RH_DIST_NODE);
	EXPECT_EQ(rh_nic_distance("", 0, "", 1), RH_DIST_SYS);
}

static struct rh_rank_nic virt(int rail)
{
	return (struct rh_rank_nic){ .rail = rail, .numa = -1, .pci = "", .up = true };
}

static void test_rank_rails(void)
{
	struct rh_rank_nic loc[4], rem[4];
	struct rh_pair out[16];
	struct rh_rank_in in = { .local = loc,
				 .nlocal = 4,
				 .remote = rem,
				 .nremote = 4,
				 .orig_local = 0,
				 .orig_remote = 0,
				 .rule = RH_RAIL_SAME,
				 .limit = RH_DIST_NODE };
	int n;

	for (int i = 0; i < 4; i++) {
		loc[i] = virt(i);
		rem[i] = virt(i);
	}
	loc[0].up = false; /* the original local NIC failed */
	n = rh_rank_pairs(&in, out, 16);
	EXPECT_EQ(n, 3);
	for (int i = 0; i < n; i++) {
		EXPECT(out[i].local != 0);
		EXPECT_EQ(out[i].local, out[i].remote); /* same rail */
		EXPECT(out[i].weight >= 1);
	}
	/* spreading: load moves a pair down the list */
	loc[1].load = 2;
	rem[1].load = 2;
	n = rh_rank_pairs(&in, out, 16);
	EXPECT_EQ(n, 3);
	EXPECT_EQ(out[0].local, 2);
	EXPECT_EQ(out[2].local, 1);
	/* remote end down instead: any rail allowed gives every healthy pair, one per NIC first */
	loc[0].up = true;
	loc[1].load = rem[1].load = 0;
	rem[0].up = false;
	in.rule = RH_RAIL_ANY;
	n = rh_rank_pairs(&in, out, 16);
	EXPECT_EQ(n, 12);
	{
		bool lseen[4] = { 0 };

		for (int i = 0; i < 3; i++) {
			EXPECT(!lseen[out[i].local]);
			lseen[out[i].local] = true;
			EXPECT(out[i].remote != 0);
		}
	}
	/* exclusions (pairs in use or known bad) */
	{
		bool ex[16] = { 0 };

		in.rule = RH_RAIL_SAME;
		ex[1 * 4 + 1] = true;
		in.exclude = ex;
		n = rh_rank_pairs(&in, out, 16);
		EXPECT_EQ(n, 2);
		in.exclude = NULL;
	}
	/* everything down: no candidate (escalation) */
	for (int i = 0; i < 4; i++) {
		loc[i].up = false;
	}
	EXPECT_EQ(rh_rank_pairs(&in, out, 16), 0);
}

static void test_rank_distance(void)
{
	/* Two sockets, two NICs each: a backup never crosses the socket under NODE. */
	struct rh_rank_nic loc[4] = {
		{ 0, 0, P0 "/0000:00:01.0/0000:01:00.0", false, 0 },
		{ 0, 0, P0 "/0000:00:02.0/0000:02:00.0", true, 0 },
		{ 0, 1, P1 "/0000:80:01.0/0000:81:00.0", true, 0 },
		{ 0, 1, P1 "/0000:80:02.0/0000:82:00.0", true, 0 },
	};
	struct rh_rank_nic rem[1] = { { 0, 0, "", true, 0 } };
	struct rh_pair out[8];
	struct rh_rank_in in = { .local = loc,
				 .nlocal = 4,
				 .remote = rem,
				 .nremote = 1,
				 .orig_local = 0,
				 .orig_remote = 0,
				 .rule = RH_RAIL_SAME,
				 .limit = RH_DIST_NODE };
	int n = rh_rank_pairs(&in, out, 8);

	EXPECT_EQ(n, 1);
	EXPECT_EQ(out[0].local, 1);
	EXPECT_EQ(out[0].dist, RH_DIST_PHB);
	in.limit = RH_DIST_SYS;
	n = rh_rank_pairs(&in, out, 8);
	EXPECT_EQ(n, 3);
	EXPECT_EQ(out[0].local, 1); /* nearest first */
	in.limit = RH_DIST_PIX;
	EXPECT_EQ(rh_rank_pairs(&in, out, 8), 0);
}

int main(void)
{
	test_distance();
	test_rank_rails();
	test_rank_distance();
	TEST_DONE();
}
