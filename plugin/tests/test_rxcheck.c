/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every frame is checked against what the receiver itself posted (issue 17, findings 2, 3, 5
 * from a peer that got past the handshake): a frame that disagrees fails the lane it came on
 * and neither completes nor fails the user's receive; a chunk whose CRC32C does not match is
 * not placed. Drives the core's receive path with a stub lane transport.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lane_stub.h"
#include "core/auth.h"
#include "core/conn.h"
#include "param.h"
#include "rh.h"

static int opened;

/* The stub transport, counting opens: backups cannot open here, the test only looks at the
 * lane verdicts. */
static int counting_open(struct rh_lane *l, const struct rh_hello *h, uint64_t id, uint32_t epoch,
			 uint32_t ip, uint16_t port)
{
	opened++;
	return stub_open(l, h, id, epoch, ip, port);
}

#define CHUNK 524288 /* set on both connections below (not the default) */
#define SIZE (3 * CHUNK + 100) /* 4 chunks, the last one short */

static struct rh_conn *c;
static char *buf;
static void *req;

static struct rh_lane *fresh_lane(void)
{
	static uint32_t id = 1;
	struct rh_lane *l;

	pthread_mutex_lock(&c->mu);
	l = rh_conn_add_lane(c, id += 2, 1, 1, 1, false);
	l->state = RH_LANE_ACTIVE;
	pthread_mutex_unlock(&c->mu);
	return l;
}

static struct rh_hdr good(uint64_t idx)
{
	uint64_t off = idx * CHUNK;

	return (struct rh_hdr){ .type = RH_F_DATA,
				.conn_id = c->id,
				.epoch = c->epoch,
				.seq = 0,
				.slot = 0,
				.off = off,
				.len = (uint32_t)(off + CHUNK <= SIZE ? CHUNK : SIZE - off),
				.total = SIZE };
}

/* Feeds h to a fresh lane: true when the lane survived it; *placed whether it was placed. */
static bool feed(struct rh_hdr h, bool *placed, const char *fill)
{
	struct rh_lane *l = fresh_lane();
	bool counted;
	char *dst = rh_core_rx_data(l, &h, &counted);

	*placed = dst != NULL;
	if (dst && fill) {
		memcpy(dst, fill + h.off, h.len);
	}
	rh_core_rx_data_done(l, &h, counted, true);
	return l->state != RH_LANE_DEAD;
}

/* The transport took the chunk's bytes but refused them (its payload MAC did not check). */
static bool feed_refused(struct rh_hdr h, const char *fill)
{
	struct rh_lane *l = fresh_lane();
	bool counted;
	char *dst = rh_core_rx_data(l, &h, &counted);

	if (dst && fill) {
		memcpy(dst, fill + h.off, h.len);
	}
	rh_core_rx_data_done(l, &h, counted, false);
	return dst != NULL && counted;
}

static void expect_pending(void)
{
	int done = 1, sizes[1] = { -1 };

	EXPECT_EQ(rh_test(req, &done, sizes), 0); /* neither failed ... */
	EXPECT_EQ(done, 0); /* ... nor completed */
}

int main(void)
{
	static char src[SIZE];
	size_t size = SIZE;
	int tag = 7, done = 0, sizes[1] = { 0 };
	void *data;
	bool placed;
	struct rh_hdr h;
	static struct lane_ops ops; /* the core keeps the pointer */

	ops = stub_lane_ops;
	ops.open = counting_open;
	EXPECT_EQ(rh_core_register_ops(&ops), 0);
	rh_g.nnics = 2;
	for (int i = 0; i < 2; i++) {
		rh_g.nics[i].up = true;
		rh_g.nics[i].rail = 0;
	}
	for (int i = 0; i < SIZE; i++) {
		src[i] = (char)(i * 7 + 1);
	}
	c = rh_conn_new(false);
	c->chunk = CHUNK;
	c->id = 0x1122334455667788ull;
	c->ready = true;
	c->nrnics = 2;
	c->rnics[0].up = c->rnics[1].up = true;
	buf = calloc(1, SIZE);
	data = buf;
	EXPECT_EQ(rh_irecv(c, 1, &data, &size, &tag, &req), 0);
	EXPECT(req != NULL);
	fresh_lane(); /* a healthy lane that stays: the connection always has somewhere to go */

	/* finding 3: a frame above the posted size fails its lane, not the receive (EMSGSIZE) */
	h = good(0);
	h.total = 2 * SIZE;
	EXPECT(!feed(h, &placed, NULL));
	EXPECT(!placed);
	expect_pending();
	/* another connection's frame, a future epoch, a receive never posted, a slot it lacks,
	 * an offset off the chunk grid, a length that is not the chunk's */
	h = good(1);
	h.conn_id ^= 1;
	EXPECT(!feed(h, &placed, NULL));
	h = good(1);
	h.epoch = c->epoch + 1;
	EXPECT(!feed(h, &placed, NULL));
	h = good(1);
	h.seq = 1;
	EXPECT(!feed(h, &placed, NULL));
	h = good(1);
	h.slot = 1;
	EXPECT(!feed(h, &placed, NULL));
	h = good(1);
	h.off += 4096;
	h.len -= 4096;
	EXPECT(!feed(h, &placed, NULL));
	h = good(1);
	h.len = 4096;
	EXPECT(!feed(h, &placed, NULL));
	expect_pending();
	EXPECT_EQ(buf[CHUNK], 0); /* nothing was written */

	/* the first good chunk fixes the message size ... */
	EXPECT(feed(good(0), &placed, src));
	EXPECT(placed);
	/* finding 2: ... so a frame claiming the message is empty cannot complete it */
	h = (struct rh_hdr){ .type = RH_F_DATA, .conn_id = c->id, .epoch = c->epoch };
	EXPECT(!feed(h, &placed, NULL));
	EXPECT(!placed);
	expect_pending();
	/* a replayed, already placed chunk is dropped quietly (the lane stays) */
	EXPECT(feed(good(0), &placed, NULL));
	EXPECT(!placed);
	/* a stale epoch is dropped quietly too */
	c->rx_min_epoch = c->epoch = c->epoch + 2;
	h = good(1);
	h.epoch = c->epoch - 1;
	EXPECT(feed(h, &placed, NULL));
	EXPECT(!placed);

	/* a chunk the transport refused (its payload MAC did not check) is not counted; the
	 * replayed one is placed */
	h = good(1);
	EXPECT(feed_refused(h, src));
	expect_pending();
	EXPECT(feed(h, &placed, src));
	EXPECT(placed);
	EXPECT(feed(good(2), &placed, src));
	EXPECT(feed(good(3), &placed, src));
	EXPECT_EQ(rh_test(req, &done, sizes), 0);
	EXPECT_EQ(done, 1);
	EXPECT_EQ(sizes[0], SIZE);
	EXPECT(memcmp(buf, src, SIZE) == 0);

	/* finding 5: control frames whose epoch is out of bounds fail their lane; the epoch
	 * stays (UINT32_MAX then ++ wrapped to 0) */
	{
		struct rh_lane *l = fresh_lane();
		uint8_t p[1] = { 0 };
		uint32_t e0 = c->epoch;

		h = (struct rh_hdr){
			.type = RH_F_FAILREQ, .conn_id = c->id, .epoch = UINT32_MAX, .len = 1
		};
		rh_core_rx_ctrl(l, &h, p);
		EXPECT_EQ(l->state, RH_LANE_DEAD);
		EXPECT_EQ(c->epoch, e0);
		l = fresh_lane();
		h.epoch = c->epoch + RH_EPOCH_AHEAD_MAX + 1;
		rh_core_rx_ctrl(l, &h, p);
		EXPECT_EQ(l->state, RH_LANE_DEAD);
		EXPECT_EQ(c->epoch, e0);
		/* one in bounds is taken (and bumped by the resume it triggers) */
		l = fresh_lane();
		h.epoch = e0 + 5;
		rh_core_rx_ctrl(l, &h, p);
		EXPECT(l->state != RH_LANE_DEAD);
		EXPECT_EQ(c->epoch, e0 + 6);
		/* the epoch never wraps: at the limit the connection fails with a clear error */
		pthread_mutex_lock(&c->mu);
		c->epoch = RH_EPOCH_LIMIT - 1;
		EXPECT_EQ(rh_conn_epoch_bump(c), -EOVERFLOW);
		EXPECT_EQ(c->epoch, RH_EPOCH_LIMIT - 1);
		EXPECT_EQ(c->err, -EOVERFLOW);
		pthread_mutex_unlock(&c->mu);
	}
	TEST_DONE();
}
