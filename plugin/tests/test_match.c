/* SPDX-License-Identifier: Apache-2.0 */
/* Grouped-receive tag matching as NCCL specifies it. */
#include "check.h"
#include "core/match.h"

static struct rh_cts_slot rec(uint64_t seq, int n, const int *tags)
{
	struct rh_cts_slot r = { .present = true };

	r.cts.seq = seq;
	r.cts.n = n;
	for (int i = 0; i < n; i++) {
		r.cts.tags[i] = tags[i];
		r.cts.sizes[i] = 1 << 20;
	}
	return r;
}

int main(void)
{
	int t3[3] = { 10, 11, 12 }, t1[1] = { 10 };
	struct rh_cts_slot recs[3] = { 0 };
	int slot = -1;

	/* nothing posted yet: try later */
	EXPECT_EQ(rh_match_tag(recs, 0, 10, &slot), -1);
	recs[0] = rec(0, 3, t3);
	recs[1] = rec(1, 1, t1);
	/* sends of a group may come in any order; each takes its tag's slot */
	EXPECT_EQ(rh_match_tag(recs, 2, 12, &slot), 0);
	EXPECT_EQ(slot, 2);
	recs[0].matched |= 1 << 2;
	EXPECT_EQ(rh_match_tag(recs, 2, 10, &slot), 0);
	EXPECT_EQ(slot, 0);
	recs[0].matched |= 1 << 0;
	/* a second send with tag 10 must not overtake the first group's free slot (11) */
	EXPECT_EQ(rh_match_tag(recs, 2, 10, &slot), -1);
	EXPECT_EQ(rh_match_tag(recs, 2, 11, &slot), 0);
	EXPECT_EQ(slot, 1);
	recs[0].matched |= 1 << 1;
	/* first group full: the next one takes it */
	EXPECT_EQ(rh_match_tag(recs, 2, 10, &slot), 1);
	EXPECT_EQ(slot, 0);
	/* a missing record (out-of-order CTS arrival) stops the search */
	recs[1].present = false;
	recs[2] = rec(2, 1, t1);
	EXPECT_EQ(rh_match_tag(recs, 3, 10, &slot), -1);
	/* unknown tag in the first free group: not matched (try later) */
	recs[1] = rec(1, 1, t1);
	EXPECT_EQ(rh_match_tag(recs, 2, 99, &slot), -1);
	TEST_DONE();
}
