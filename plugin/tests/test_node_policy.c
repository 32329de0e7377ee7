/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The node policy's rail rule, distance limit and backup lanes reaching the plugin's parameters
 * (rh_params_apply_policy): the policy's words, the old spelling "same" read with a
 * deprecation warning, a job's RAILHOP_* variable winning and said once, allowed-pairs in the
 * backup ranking.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/rank.h"
#include "log.h"
#include "param.h"
#include "param_node.h"

#define MAXLINES 128

static char lines[MAXLINES][256];
static int nlines;

static void capture(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		    const char *fmt, ...)
{
	va_list ap;

	(void)level;
	(void)flags;
	(void)file;
	(void)line;
	if (nlines >= MAXLINES) {
		return;
	}
	va_start(ap, fmt);
	vsnprintf(lines[nlines], sizeof(lines[nlines]), fmt, ap);
	va_end(ap);
	nlines++;
}

/* How many captured lines contain s. */
static int count(const char *s)
{
	int n = 0;

	for (int i = 0; i < nlines; i++) {
		n += strstr(lines[i], s) != NULL;
	}
	return n;
}

static void test_words(void)
{
	enum rh_rail_rule rr;

	EXPECT_EQ(rh_parse_rail_rule("same-rail", &rr), 0);
	EXPECT_EQ(rr, RH_RAIL_SAME);
	EXPECT_EQ(rh_parse_rail_rule("allowed-pairs", &rr), 0);
	EXPECT_EQ(rr, RH_RAIL_ALLOWED_PAIRS);
	EXPECT_EQ(rh_parse_rail_rule("any", &rr), 0);
	EXPECT_EQ(rr, RH_RAIL_ANY);
	EXPECT_EQ(rh_parse_rail_rule("same", &rr), 1); /* the old spelling: deprecated */
	EXPECT_EQ(rr, RH_RAIL_SAME);
	EXPECT_EQ(rh_parse_rail_rule("pairs", &rr), -EINVAL);
	EXPECT(strcmp(rh_rail_rule_name(RH_RAIL_ALLOWED_PAIRS), "allowed-pairs") == 0);
	EXPECT(strcmp(rh_param_defaults.RAIL_RULE, "same-rail") == 0);

	/* the old spelling from the job: accepted as same-rail, one deprecation warning */
	nlines = 0;
	setenv("RAILHOP_RAIL_RULE", "same", 1);
	EXPECT_EQ(rh_params_load(), 0);
	EXPECT(strcmp(rh_param.RAIL_RULE, "same-rail") == 0);
	EXPECT_EQ(count("deprecated: use same-rail"), 1);
	setenv("RAILHOP_RAIL_RULE", "matrix", 1);
	EXPECT_EQ(rh_params_load(), -EINVAL);
	EXPECT_EQ(count("expected same-rail|allowed-pairs|any"), 1);
	unsetenv("RAILHOP_RAIL_RULE");
}

static void test_policy_reaches_params(void)
{
	struct rh_node_policy p = { .rail_rule = "any",
				    .distance_limit = "SYS",
				    .backup_lanes = 5 };
	struct rh_node_policy none = { 0 };

	EXPECT_EQ(rh_params_load(), 0);
	nlines = 0;
	rh_params_apply_policy(&p);
	EXPECT(strcmp(rh_param.RAIL_RULE, "any") == 0);
	EXPECT(strcmp(rh_param.DISTANCE_LIMIT, "SYS") == 0);
	EXPECT_EQ(rh_param.BACKUP_LANES, 5);
	EXPECT_EQ(count("RAILHOP_RAIL_RULE=any (node policy, via the agent)"), 1);
	/* the same policy again (every publish): nothing new is logged */
	rh_params_apply_policy(&p);
	EXPECT_EQ(count("RAILHOP_RAIL_RULE="), 1);
	EXPECT_EQ(count("RAILHOP_BACKUP_LANES="), 1);
	/* the policy stops setting them: back to the defaults */
	rh_params_apply_policy(&none);
	EXPECT(strcmp(rh_param.RAIL_RULE, rh_param_defaults.RAIL_RULE) == 0);
	EXPECT(strcmp(rh_param.DISTANCE_LIMIT, rh_param_defaults.DISTANCE_LIMIT) == 0);
	EXPECT_EQ(rh_param.BACKUP_LANES, rh_param_defaults.BACKUP_LANES);
	/* a value out of the plugin's range is not applied */
	p.backup_lanes = 40;
	rh_params_apply_policy(&p);
	EXPECT_EQ(rh_param.BACKUP_LANES, rh_param_defaults.BACKUP_LANES);
}

static void test_job_variable_wins_and_is_said_once(void)
{
	struct rh_node_policy p = { .rail_rule = "allowed-pairs",
				    .distance_limit = "PXB",
				    .backup_lanes = 2 };

	setenv("RAILHOP_RAIL_RULE", "any", 1);
	setenv("RAILHOP_BACKUP_LANES", "4", 1);
	EXPECT_EQ(rh_params_load(), 0);
	nlines = 0;
	for (int i = 0; i < 5; i++) { /* five publishes */
		rh_params_apply_policy(&p);
	}
	EXPECT(strcmp(rh_param.RAIL_RULE, "any") == 0); /* the job's */
	EXPECT_EQ(rh_param.BACKUP_LANES, 4); /* the job's */
	EXPECT(strcmp(rh_param.DISTANCE_LIMIT, "PXB") == 0); /* the policy's: the job set none */
	EXPECT_EQ(count("RAILHOP_RAIL_RULE=any: the job's variable wins over the node policy's "
			"allowed-pairs"),
		  1);
	EXPECT_EQ(count("RAILHOP_BACKUP_LANES=4: the job's variable wins"), 1);
	EXPECT_EQ(count("RAILHOP_DISTANCE_LIMIT=PXB (node policy"), 1);
	/* a job whose variable equals the policy's says nothing */
	setenv("RAILHOP_RAIL_RULE", "allowed-pairs", 1);
	EXPECT_EQ(rh_params_load(), 0);
	nlines = 0;
	rh_params_apply_policy(&p);
	EXPECT_EQ(count("RAILHOP_RAIL_RULE"), 0);
	unsetenv("RAILHOP_RAIL_RULE");
	unsetenv("RAILHOP_BACKUP_LANES");
	EXPECT_EQ(rh_params_load(), 0);
}

static struct rh_rank_nic virt(int rail)
{
	return (struct rh_rank_nic){ .rail = rail, .numa = -1, .pci = "", .up = true };
}

static void test_allowed_pairs_ranking(void)
{
	struct rh_rank_nic loc[4], rem[4];
	struct rh_pair out[16];
	uint64_t peers[RH_RAIL_PEER_MAX + 1] = { 0 };
	struct rh_rank_in in = { .local = loc,
				 .nlocal = 4,
				 .remote = rem,
				 .nremote = 4,
				 .orig_local = 0,
				 .orig_remote = 0,
				 .rule = RH_RAIL_ALLOWED_PAIRS,
				 .limit = RH_DIST_SYS };
	int n;

	for (int i = 0; i < 4; i++) {
		loc[i] = virt(i);
		rem[i] = virt(i);
	}
	rem[0].up = false; /* the remote end of rail 0 failed */
	/* without pairs (no table): same rail only */
	n = rh_rank_pairs(&in, out, 16);
	EXPECT_EQ(n, 3);
	for (int i = 0; i < n; i++) {
		EXPECT_EQ(out[i].local, out[i].remote);
	}
	/* rails 0 and 1 paired (both directions, as the agent publishes them) */
	peers[0] = 1u << 0 | 1u << 1;
	peers[1] = 1u << 1 | 1u << 0;
	in.rail_peers = peers;
	n = rh_rank_pairs(&in, out, 16);
	EXPECT_EQ(n, 4); /* the three same-rail pairs and local rail 0 -> remote rail 1 */
	{
		int cross = 0;

		for (int i = 0; i < n; i++) {
			EXPECT(out[i].local == out[i].remote ||
			       (out[i].local == 0 && out[i].remote == 1));
			cross += out[i].local != out[i].remote;
		}
		EXPECT_EQ(cross, 1);
	}
	/* rails beyond the mask: same rail only, never a stray bit */
	loc[3].rail = rem[3].rail = 200;
	n = rh_rank_pairs(&in, out, 16);
	EXPECT_EQ(n, 4);
}

int main(void)
{
	rh_log_set(capture);
	test_words();
	test_policy_reaches_params();
	test_job_variable_wins_and_is_said_once();
	test_allowed_pairs_ranking();
	TEST_DONE();
}
