/* SPDX-License-Identifier: Apache-2.0 */
/*
 * deregMr against the transports' per-NIC registration caches, which every comm shares
 * (core/plugin.c, "Memory handles"): a fake transport whose forget() records what it is told
 * to drop. The core must forget only the pages no other live handle covers:
 *  - two comms registering the same buffer: the first deregMr forgets nothing, the last
 *    forgets the buffer's pages;
 *  - overlapping buffers: deregistering one forgets only its pages outside the other's, and
 *    never a page of the live one; deregistering the last forgets the rest;
 *  - a page shared at the edge of two unaligned buffers stays until both are gone;
 *  - a range covered by two others together (neither alone) is not forgotten;
 *  - a buffer nobody else covers is forgotten at once, rounded out to whole pages;
 *  - a transport without forget gets the no-op handle; an unknown handle is refused.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "core/lane_ops.h"
#include "lane_stub.h"
#include "rh.h"

#define PG 4096u
#define BASE ((uintptr_t)0x10000000u)

static struct {
	uintptr_t lo, hi;
} calls[64];
static int ncalls;

static void fk_forget(const void *addr, size_t size)
{
	if (ncalls < 64) {
		calls[ncalls].lo = (uintptr_t)addr;
		calls[ncalls].hi = (uintptr_t)addr + size;
	}
	ncalls++;
}

/* Some forget() since the last reset overlapped [lo, hi). */
static bool forgot_any(uintptr_t lo, uintptr_t hi)
{
	for (int i = 0; i < ncalls && i < 64; i++) {
		if (calls[i].lo < hi && lo < calls[i].hi) {
			return true;
		}
	}
	return false;
}

/* The forget() calls since the last reset cover [lo, hi) exactly (no byte outside, none
 * missing, no page twice). */
static bool forgot_exactly(uintptr_t lo, uintptr_t hi)
{
	uintptr_t total = 0;

	for (int i = 0; i < ncalls && i < 64; i++) {
		if (calls[i].lo < lo || calls[i].hi > hi || calls[i].lo % PG || calls[i].hi % PG) {
			return false;
		}
		total += calls[i].hi - calls[i].lo;
	}
	for (int i = 0; i < ncalls; i++) {
		for (int k = i + 1; k < ncalls; k++) {
			if (calls[i].lo < calls[k].hi && calls[k].lo < calls[i].hi) {
				return false;
			}
		}
	}
	return total == hi - lo;
}

static void reset(void)
{
	ncalls = 0;
	memset(calls, 0, sizeof(calls));
}

static void *reg(int comm, uintptr_t a, size_t len)
{
	void *mh = NULL;

	EXPECT_EQ(rh_reg_mr((void *)(uintptr_t)(0x1000 + comm), (void *)a, len, NCCL_PTR_HOST, &mh),
		  0);
	EXPECT(mh != NULL);
	return mh;
}

static int dereg(int comm, void *mh)
{
	return rh_dereg_mr((void *)(uintptr_t)(0x1000 + comm), mh);
}

int main(void)
{
	struct lane_ops ops = stub_lane_ops;
	struct lane_ops plain = stub_lane_ops;
	void *a, *b, *c, *mh;

	ops.forget = fk_forget;
	EXPECT_EQ(rh_core_register_ops(&ops), 0);

	/* Two comms, the same buffer (NCCL's shared buffers). */
	reset();
	a = reg(1, BASE, 64 * PG);
	b = reg(2, BASE, 64 * PG);
	EXPECT_EQ(dereg(1, a), 0);
	EXPECT_EQ(ncalls, 0);
	EXPECT_EQ(dereg(2, b), 0);
	EXPECT(forgot_exactly(BASE, BASE + 64 * PG));

	/* Overlapping buffers of two comms: A [0, 64 pages), B [16, 80 pages). */
	reset();
	a = reg(1, BASE, 64 * PG);
	b = reg(2, BASE + 16 * PG, 64 * PG);
	EXPECT_EQ(dereg(1, a), 0);
	EXPECT(!forgot_any(BASE + 16 * PG, BASE + 80 * PG)); /* B's pages untouched */
	EXPECT(forgot_exactly(BASE, BASE + 16 * PG));
	reset();
	EXPECT_EQ(dereg(2, b), 0);
	EXPECT(forgot_exactly(BASE + 16 * PG, BASE + 80 * PG));

	/* The other way round: deregistering the inner one first forgets nothing. */
	reset();
	a = reg(1, BASE, 64 * PG);
	b = reg(2, BASE + 8 * PG, 4 * PG);
	EXPECT_EQ(dereg(2, b), 0);
	EXPECT_EQ(ncalls, 0);
	EXPECT_EQ(dereg(1, a), 0);
	EXPECT(forgot_exactly(BASE, BASE + 64 * PG));

	/* Unaligned buffers sharing one page: A [100, 5000), B [6000, 9000) share page 1. */
	reset();
	a = reg(1, BASE + 100, 4900);
	b = reg(2, BASE + 6000, 3000);
	EXPECT_EQ(dereg(1, a), 0);
	EXPECT(forgot_exactly(BASE, BASE + PG));
	reset();
	EXPECT_EQ(dereg(2, b), 0);
	EXPECT(forgot_exactly(BASE + PG, BASE + 3 * PG));

	/* A range covered by two others together: A [0, 12), B [0, 5), C [4, 12) pages. */
	reset();
	a = reg(1, BASE, 12 * PG);
	b = reg(2, BASE, 5 * PG);
	c = reg(3, BASE + 4 * PG, 8 * PG);
	EXPECT_EQ(dereg(1, a), 0);
	EXPECT_EQ(ncalls, 0);
	EXPECT_EQ(dereg(2, b), 0);
	EXPECT(forgot_exactly(BASE, BASE + 4 * PG));
	reset();
	EXPECT_EQ(dereg(3, c), 0);
	EXPECT(forgot_exactly(BASE + 4 * PG, BASE + 12 * PG));

	/* A gap between two covering handles is forgotten, the covered parts are not:
	 * A [0, 20), B [2, 4), C [10, 12) pages. */
	reset();
	a = reg(1, BASE, 20 * PG);
	b = reg(2, BASE + 2 * PG, 2 * PG);
	c = reg(3, BASE + 10 * PG, 2 * PG);
	EXPECT_EQ(dereg(1, a), 0);
	EXPECT(!forgot_any(BASE + 2 * PG, BASE + 4 * PG));
	EXPECT(!forgot_any(BASE + 10 * PG, BASE + 12 * PG));
	EXPECT_EQ(ncalls, 3);
	reset();
	EXPECT_EQ(dereg(2, b), 0);
	EXPECT_EQ(dereg(3, c), 0);
	EXPECT(forgot_any(BASE + 2 * PG, BASE + 4 * PG) &&
	       forgot_any(BASE + 10 * PG, BASE + 12 * PG));

	/* Distinct buffers: each forgotten at once, rounded out to its pages (and a zero-sized
	 * one still names the page a cache registers for it). */
	reset();
	a = reg(1, BASE + 100, 10);
	b = reg(2, BASE + 40 * PG, 3 * PG + 1);
	c = reg(3, BASE + 80 * PG, 0);
	EXPECT_EQ(dereg(1, a), 0);
	EXPECT(forgot_exactly(BASE, BASE + PG));
	reset();
	EXPECT_EQ(dereg(2, b), 0);
	EXPECT(forgot_exactly(BASE + 40 * PG, BASE + 44 * PG));
	reset();
	EXPECT_EQ(dereg(3, c), 0);
	EXPECT(forgot_exactly(BASE + 80 * PG, BASE + 81 * PG));

	/* An unknown handle (freed already) is refused, nothing forgotten. */
	reset();
	a = reg(1, BASE, PG);
	EXPECT_EQ(dereg(1, a), 0);
	reset();
	{
		uint64_t fake[8] = { 0 };

		EXPECT_EQ(dereg(1, fake), -EINVAL);
	}
	EXPECT_EQ(ncalls, 0);
	EXPECT_EQ(dereg(1, NULL), 0);

	/* Non-host memory is not taken. */
	EXPECT_EQ(rh_reg_mr(NULL, (void *)BASE, PG, 0x2, &mh), -EOPNOTSUPP);

	/* A transport without forget: the no-op handle, deregistered without a call. */
	plain.forget = NULL;
	EXPECT_EQ(rh_core_register_ops(&plain), 0);
	reset();
	mh = NULL;
	EXPECT_EQ(rh_reg_mr(NULL, (void *)BASE, PG, NCCL_PTR_HOST, &mh), 0);
	EXPECT(mh == (void *)(uintptr_t)0x1);
	EXPECT_EQ(rh_dereg_mr(NULL, mh), 0);
	EXPECT_EQ(ncalls, 0);

	TEST_DONE();
}
