/* SPDX-License-Identifier: Apache-2.0 */
/* Parameter parsing and the NIC list syntax. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nic.h"
#include "param.h"
#include "param_node.h"

int main(void)
{
	int64_t v;
	enum rh_rail_rule rr;
	enum rh_dist d;
	struct rh_nic_spec s[RH_MAX_NICS];

	EXPECT_EQ(rh_parse_int("1000", 0, 100000, &v), 0);
	EXPECT_EQ(v, 1000);
	EXPECT_EQ(rh_parse_int("0x10", 0, 100, &v), 0);
	EXPECT_EQ(v, 16);
	EXPECT_EQ(rh_parse_int("", 0, 10, &v), -EINVAL);
	EXPECT_EQ(rh_parse_int("12ms", 0, 100, &v), -EINVAL);
	EXPECT_EQ(rh_parse_int("-1", 0, 100, &v), -EINVAL);
	EXPECT_EQ(rh_parse_int("101", 0, 100, &v), -EINVAL);
	EXPECT_EQ(rh_parse_rail_rule("same", &rr), 1); /* deprecated spelling */
	EXPECT_EQ(rr, RH_RAIL_SAME);
	EXPECT_EQ(rh_parse_rail_rule("ANY", &rr), 0);
	EXPECT_EQ(rr, RH_RAIL_ANY);
	EXPECT_EQ(rh_parse_rail_rule("matrix", &rr), -EINVAL);
	EXPECT_EQ(rh_parse_dist("pxb", &d), 0);
	EXPECT_EQ(d, RH_DIST_PXB);
	EXPECT_EQ(rh_parse_dist("NODE", &d), 0);
	EXPECT_EQ(d, RH_DIST_NODE);
	EXPECT_EQ(rh_parse_dist("far", &d), -EINVAL);
	EXPECT(strcmp(rh_dist_name(RH_DIST_SYS), "SYS") == 0);
	EXPECT(rh_param_known("COMPLETION_TIMEOUT"));
	EXPECT(rh_param_known("PLUGIN_PATH"));
	EXPECT(!rh_param_known("COMPLETION_TIMEOUTS"));
	/* defaults from the table */
	EXPECT_EQ(rh_param.COMPLETION_TIMEOUT, 1000);
	EXPECT_EQ(rh_param.FAILBACK_INTERVAL, 1000);
	EXPECT(strcmp(rh_param.DISTANCE_LIMIT, "NODE") == 0);
	EXPECT(strcmp(rh_param.RAIL_RULE, "same-rail") == 0);

	EXPECT_EQ(rh_nic_parse_list("nic0:0,nic1:1,eth7", s, RH_MAX_NICS), 3);
	EXPECT(strcmp(s[1].ifname, "nic1") == 0);
	EXPECT_EQ(s[1].rail, 1);
	EXPECT_EQ(s[2].rail, -1);
	EXPECT_EQ(rh_nic_parse_list("lo", s, RH_MAX_NICS), 1);
	EXPECT_EQ(rh_nic_parse_list("nic0:", s, RH_MAX_NICS), -EINVAL);
	EXPECT_EQ(rh_nic_parse_list("nic0:x", s, RH_MAX_NICS), -EINVAL);
	EXPECT_EQ(rh_nic_parse_list(",nic0", s, RH_MAX_NICS), -EINVAL);
	EXPECT_EQ(rh_nic_parse_list("averyveryverylongifname0", s, RH_MAX_NICS), -EINVAL);
	EXPECT_EQ(rh_nic_parse_list("a,b", s, 1), -EINVAL);

	/* env loading: a bad value is rejected, an unknown name only warned about */
	setenv("RAILHOP_COMPLETION_TIMEOUT", "250", 1);
	setenv("RAILHOP_NOT_A_PARAM", "1", 1);
	EXPECT_EQ(rh_params_load(), 0);
	EXPECT_EQ(rh_param.COMPLETION_TIMEOUT, 250);
	setenv("RAILHOP_DISTANCE_LIMIT", "FAR", 1);
	EXPECT_EQ(rh_params_load(), -EINVAL);
	setenv("RAILHOP_DISTANCE_LIMIT", "SYS", 1);
	setenv("RAILHOP_CHUNK_SIZE", "abc", 1);
	EXPECT_EQ(rh_params_load(), -EINVAL);
	/* The node policy's timeouts: env var > policy > default. */
	EXPECT_EQ(rh_param_pick(true, 700, 2000, 1000), 700);
	EXPECT_EQ(rh_param_pick(false, 1000, 2000, 1000), 2000);
	EXPECT_EQ(rh_param_pick(false, 2000, 0, 1000), 1000); /* the policy no longer sets it */
	EXPECT_EQ(rh_param_pick(false, 1000, 5, 1000), 1000); /* < 10 ms: not a valid timeout */
	unsetenv("RAILHOP_COMPLETION_TIMEOUT");
	unsetenv("RAILHOP_FAILBACK_INTERVAL");
	unsetenv("RAILHOP_CHUNK_SIZE"); /* the bad values of the cases above */
	unsetenv("RAILHOP_DISTANCE_LIMIT");
	setenv("RAILHOP_PROBE_TIMEOUT", "450", 1);
	EXPECT_EQ(rh_params_load(), 0);
	rh_params_apply_node(2000, 900, 0);
	EXPECT_EQ(rh_param.COMPLETION_TIMEOUT, 2000); /* policy */
	EXPECT_EQ(rh_param.PROBE_TIMEOUT, 450); /* the job's variable wins */
	EXPECT_EQ(rh_param.FAILBACK_INTERVAL, rh_param_defaults.FAILBACK_INTERVAL);
	rh_params_apply_node(0, 0, 3000);
	EXPECT_EQ(rh_param.COMPLETION_TIMEOUT, rh_param_defaults.COMPLETION_TIMEOUT);
	EXPECT_EQ(rh_param.FAILBACK_INTERVAL, 3000);
	EXPECT_EQ(rh_params_load(), 0); /* a restart begins from the defaults again */
	EXPECT_EQ(rh_param.FAILBACK_INTERVAL, rh_param_defaults.FAILBACK_INTERVAL);
	unsetenv("RAILHOP_PROBE_TIMEOUT");
	TEST_DONE();
}
