/* SPDX-License-Identifier: Apache-2.0 */
/* The scheduler: chunking, lane eligibility, and a pull simulation over several lanes. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/sched.h"

static void test_chunks(void)
{
	uint64_t off, len;

	EXPECT_EQ(rh_sched_nchunks(0, 4096), 1);
	EXPECT_EQ(rh_sched_nchunks(1, 4096), 1);
	EXPECT_EQ(rh_sched_nchunks(4096, 4096), 1);
	EXPECT_EQ(rh_sched_nchunks(4097, 4096), 2);
	EXPECT_EQ(rh_sched_nchunks(1ull << 30, 1 << 19), 2048);
	EXPECT(rh_sched_chunk(0, 4096, 0, &off, &len));
	EXPECT_EQ(off, 0);
	EXPECT_EQ(len, 0);
	EXPECT(!rh_sched_chunk(0, 4096, 1, &off, &len));
	EXPECT(rh_sched_chunk(10000, 4096, 2, &off, &len));
	EXPECT_EQ(off, 8192);
	EXPECT_EQ(len, 10000 - 8192);
	EXPECT(!rh_sched_chunk(10000, 4096, 3, &off, &len));
}

static void test_runs(void)
{
	uint64_t bits[3] = { 0 };
	struct rh_run r[4];
	int n;

	EXPECT_EQ(rh_sched_runs_from_bits(bits, 130, r, 4), 0);
	EXPECT_EQ(rh_sched_skip_placed(r, 0, 7), 7);
	/* placed: 0-2, 5, 63-65, 129 */
	bits[0] = 0x7 | (1ull << 5) | (1ull << 63);
	bits[1] = 0x3;
	bits[2] = 0x2;
	n = rh_sched_runs_from_bits(bits, 130, r, 4);
	EXPECT_EQ(n, 4);
	EXPECT_EQ(r[0].start, 0);
	EXPECT_EQ(r[0].count, 3);
	EXPECT_EQ(r[1].start, 5);
	EXPECT_EQ(r[1].count, 1);
	EXPECT_EQ(r[2].start, 63);
	EXPECT_EQ(r[2].count, 3);
	EXPECT_EQ(r[3].start, 129);
	EXPECT_EQ(r[3].count, 1);
	EXPECT_EQ(rh_sched_runs_chunks(r, n), 8);
	/* chunk 129 is past nchunks = 129: not listed */
	EXPECT_EQ(rh_sched_runs_from_bits(bits, 129, r, 4), 3);
	/* a cap keeps the first runs only (leaving runs out is safe: they are resent) */
	EXPECT_EQ(rh_sched_runs_from_bits(bits, 130, r, 2), 2);
	EXPECT_EQ(r[1].start, 5);
	n = rh_sched_runs_from_bits(bits, 130, r, 4);
	EXPECT_EQ(rh_sched_skip_placed(r, n, 0), 3);
	EXPECT_EQ(rh_sched_skip_placed(r, n, 3), 3);
	EXPECT_EQ(rh_sched_skip_placed(r, n, 4), 4);
	EXPECT_EQ(rh_sched_skip_placed(r, n, 5), 6);
	EXPECT_EQ(rh_sched_skip_placed(r, n, 64), 66);
	EXPECT_EQ(rh_sched_skip_placed(r, n, 129), 130);
	/* adjacent runs are skipped in one go */
	r[0] = (struct rh_run){ .start = 2, .count = 2 };
	r[1] = (struct rh_run){ .start = 4, .count = 3 };
	EXPECT_EQ(rh_sched_skip_placed(r, 2, 2), 7);
	/* every chunk placed: the cursor ends at nchunks */
	memset(bits, 0xff, sizeof(bits));
	n = rh_sched_runs_from_bits(bits, 10, r, 4);
	EXPECT_EQ(n, 1);
	EXPECT_EQ(rh_sched_skip_placed(r, n, 0), 10);
}

static void test_eligibility(void)
{
	EXPECT(rh_sched_lane_may_carry(RH_LANE_ACTIVE, 0, RH_GEN_NEW));
	EXPECT(rh_sched_lane_may_carry(RH_LANE_ACTIVE, 0, 5));
	/* a draining lane finishes messages begun before its retirement, takes no new ones */
	EXPECT(rh_sched_lane_may_carry(RH_LANE_DRAINING, 3, 2));
	EXPECT(!rh_sched_lane_may_carry(RH_LANE_DRAINING, 3, 3));
	EXPECT(!rh_sched_lane_may_carry(RH_LANE_DRAINING, 3, RH_GEN_NEW));
	EXPECT(!rh_sched_lane_may_carry(RH_LANE_SUSPECT, 0, 0));
	EXPECT(!rh_sched_lane_may_carry(RH_LANE_OPENING, 0, RH_GEN_NEW));
	EXPECT(!rh_sched_lane_may_carry(RH_LANE_DEAD, 0, 0));
}

/* Three lanes with speeds 1:2:3 pull chunks of a message in turn: every byte is sent exactly
 * once and each lane carries a share proportional to its speed. */
static void test_striping(void)
{
	const uint64_t size = 100 * 4096 + 17, chunk = 4096;
	uint64_t n = rh_sched_nchunks(size, chunk), next = 0, carried[3] = { 0 };
	unsigned char *seen = calloc(size, 1);
	int speed[3] = { 1, 2, 3 }, credit[3] = { 0 };

	while (next < n) {
		for (int l = 0; l < 3 && next < n; l++) {
			credit[l] += speed[l];
			while (credit[l] >= 3 && next < n) {
				uint64_t off, len;

				credit[l] -= 3;
				EXPECT(rh_sched_chunk(size, chunk, next++, &off, &len));
				for (uint64_t b = off; b < off + len; b++) {
					seen[b]++;
				}
				carried[l] += len;
			}
		}
	}
	for (uint64_t b = 0; b < size; b++) {
		if (seen[b] != 1) {
			EXPECT_EQ(seen[b], 1);
			break;
		}
	}
	EXPECT_EQ(carried[0] + carried[1] + carried[2], size);
	EXPECT(carried[2] > carried[1] && carried[1] > carried[0]);
	free(seen);
}

/* Lanes pull chunks in turn, each only when the share gate lets it; `every[i]`: lane i can
 * write only every every[i]-th round (a slower NIC). Returns the bytes per lane. */
static void pull(const uint32_t *share, const int *every, int n, int rounds, uint64_t *taken)
{
	const uint64_t chunk = 512 * 1024;

	for (int i = 0; i < n; i++) {
		taken[i] = 0;
	}
	for (int r = 1; r <= rounds; r++) {
		for (int i = 0; i < n; i++) {
			uint64_t t[8];
			uint32_t sh[8];
			int m = 0;

			if (r % every[i]) {
				continue;
			}
			for (int j = 0; j < n; j++) {
				if (j != i) {
					t[m] = taken[j];
					sh[m] = share[j];
					m++;
				}
			}
			if (rh_sched_share_ok(taken[i], share[i], t, sh, m, 2 * chunk)) {
				taken[i] += chunk;
			}
		}
	}
}

static void expect_shares(const uint64_t *taken, const uint32_t *share, int n, double tol)
{
	uint64_t total = 0, stotal = 0;

	for (int i = 0; i < n; i++) {
		total += taken[i];
		stotal += share[i];
	}
	for (int i = 0; i < n; i++) {
		double got = (double)taken[i] / (double)total, want = (double)share[i] / stotal;

		if (got < want * (1 - tol) || got > want * (1 + tol)) {
			fprintf(stderr, "lane %d: %.3f of the bytes, share %.3f\n", i, got, want);
			test_failures++;
		}
	}
}

static void test_shares(void)
{
	const uint32_t share[3] = { 5000, 3000, 2000 };
	const int fast[3] = { 1, 1, 1 }, slow_big[3] = { 3, 1, 1 };
	uint64_t taken[3], t2[2] = { 0, 0 };
	uint32_t s2[2] = { 3000, 0 };

	/* Equal lanes: bytes follow the shares (within 2 %). */
	pull(share, fast, 3, 3000, taken);
	expect_shares(taken, share, 3, 0.02);
	/* The largest share on the slowest lane: the others wait for it, shares still hold. */
	pull(share, slow_big, 3, 3000, taken);
	expect_shares(taken, share, 3, 0.02);
	EXPECT(taken[0] > 0);

	/* Not gated: share 0, or no other lane with a share. */
	EXPECT(rh_sched_share_ok(1u << 30, 0, t2, s2, 2, 0));
	EXPECT(rh_sched_share_ok(1u << 30, 5000, t2, s2 + 1, 1, 0));
	/* Ahead of a lane by more than the slack: refused; within it: allowed. */
	EXPECT(!rh_sched_share_ok(1u << 30, 5000, t2, s2, 1, 1024));
	t2[0] = 600 << 20; /* 600 MiB at 3000 ~ 1000 MiB at 5000 */
	EXPECT(rh_sched_share_ok(1000ull << 20, 5000, t2, s2, 1, 0));
	EXPECT(!rh_sched_share_ok(1001ull << 20, 5000, t2, s2, 1, 0));
	/* No overflow at the top of the ranges. */
	t2[0] = UINT64_MAX - 1;
	EXPECT(rh_sched_share_ok(UINT64_MAX - 1, 65535, t2, s2, 1, 0));
	/* A joining lane starts level with the lane furthest behind. */
	t2[0] = 300;
	t2[1] = 900;
	s2[1] = 3000;
	EXPECT_EQ(rh_sched_share_start(6000, t2, s2, 2), 600);
	EXPECT_EQ(rh_sched_share_start(6000, t2, (uint32_t[]){ 0, 0 }, 2), 0);
}

int main(void)
{
	test_chunks();
	test_runs();
	test_eligibility();
	test_striping();
	test_shares();
	TEST_DONE();
}
