/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Frame MACs after the hello (core/auth.c, struct rh_fmac): a frame verifies at the peer only
 * as sealed, in order, in its direction, under its stream's key; any tampered header byte,
 * tag byte, control payload byte, counter (replay, reorder, skip) or key input is refused; the
 * payload GMAC likewise; and a DATA frame without the payload MAC that the receiver requires is
 * refused.
 */
#include <errno.h>
#include <string.h>

#include "../src/core/fmac.h"
#include "../src/core/wire.h"
#include "check.h"

static const uint8_t secret[RH_SECRET_LEN] = "0123456789abcde";
static const uint8_t n_open[RH_NONCE_LEN] = "opener-nonce-01";
static const uint8_t n_acc[RH_NONCE_LEN] = "accept-nonce-01";

/* The two ends of stream 2 of lane 6 (opener, acceptor). */
static void pair(struct rh_fmac *o, struct rh_fmac *a)
{
	EXPECT_EQ(rh_fmac_init(o, secret, 0x1122334455667788ull, 6, 2, 4, n_open, n_acc, true), 0);
	EXPECT_EQ(rh_fmac_init(a, secret, 0x1122334455667788ull, 6, 2, 4, n_open, n_acc, false), 0);
}

static void data_hdr(uint8_t *b, uint64_t seq)
{
	struct rh_hdr h = { .type = RH_F_DATA,
			    .slot = 1,
			    .len = 4096,
			    .conn_id = 0x1122334455667788ull,
			    .epoch = 3,
			    .seq = seq,
			    .off = 8192,
			    .total = 65536 };

	rh_hdr_put(&h, b);
}

static void test_roundtrip_and_order(void)
{
	struct rh_fmac o, a;
	uint8_t h0[RH_HDR_LEN], h1[RH_HDR_LEN], t0[RH_TAG_LEN], t1[RH_TAG_LEN], t2[RH_TAG_LEN];
	const uint8_t cts[12] = { 1, 2, 3 };

	pair(&o, &a);
	data_hdr(h0, 10);
	data_hdr(h1, 11);
	/* both directions, in order: accepted */
	EXPECT_EQ(rh_fmac_seal(&o, h0, NULL, 0, t0), 0);
	EXPECT(rh_fmac_open(&a, h0, NULL, 0, t0));
	EXPECT_EQ(rh_fmac_seal(&a, h1, cts, sizeof(cts), t1), 0);
	EXPECT(rh_fmac_open(&o, h1, cts, sizeof(cts), t1));
	/* the same frame again (a replay of an earlier frame) is refused */
	EXPECT(!rh_fmac_open(&a, h0, NULL, 0, t0));
	rh_fmac_free(&o);
	rh_fmac_free(&a);

	/* reordered: frame 1 before frame 0 is refused; skipped counters too */
	pair(&o, &a);
	EXPECT_EQ(rh_fmac_seal(&o, h0, NULL, 0, t0), 0);
	EXPECT_EQ(rh_fmac_seal(&o, h1, NULL, 0, t1), 0);
	EXPECT(!rh_fmac_open(&a, h1, NULL, 0, t1));
	rh_fmac_free(&a);
	EXPECT_EQ(rh_fmac_init(&a, secret, 0x1122334455667788ull, 6, 2, 4, n_open, n_acc, false),
		  0);
	EXPECT(rh_fmac_open(&a, h0, NULL, 0, t0));
	EXPECT(rh_fmac_open(&a, h1, NULL, 0, t1));
	/* an injected frame (counter 2 never sealed by the peer): a tag made by nobody */
	memset(t2, 0, sizeof(t2));
	EXPECT(!rh_fmac_open(&a, h1, NULL, 0, t2));
	rh_fmac_free(&o);
	rh_fmac_free(&a);

	/* reflected: our own frame sent back to us is refused (direction byte) */
	pair(&o, &a);
	EXPECT_EQ(rh_fmac_seal(&o, h0, NULL, 0, t0), 0);
	EXPECT(!rh_fmac_open(&o, h0, NULL, 0, t0));
	rh_fmac_free(&o);
	rh_fmac_free(&a);
}

static void test_tamper(void)
{
	uint8_t h[RH_HDR_LEN], t[RH_TAG_LEN], p[64];

	data_hdr(h, 5);
	for (size_t i = 0; i < sizeof(p); i++) {
		p[i] = (uint8_t)(i * 7);
	}
	/* every header byte, every tag byte, every control payload byte */
	for (size_t i = 0; i < RH_HDR_LEN + RH_TAG_LEN + sizeof(p); i++) {
		struct rh_fmac o, a;
		uint8_t *b;

		pair(&o, &a);
		EXPECT_EQ(rh_fmac_seal(&o, h, p, sizeof(p), t), 0);
		b = i < RH_HDR_LEN		? h + i :
		    i < RH_HDR_LEN + RH_TAG_LEN ? t + i - RH_HDR_LEN :
						  p + i - RH_HDR_LEN - RH_TAG_LEN;
		*b ^= 0x01;
		EXPECT(!rh_fmac_open(&a, h, p, sizeof(p), t));
		*b ^= 0x01;
		rh_fmac_free(&o);
		rh_fmac_free(&a);
	}
	/* a payload cut short is refused too */
	{
		struct rh_fmac o, a;

		pair(&o, &a);
		EXPECT_EQ(rh_fmac_seal(&o, h, p, sizeof(p), t), 0);
		EXPECT(!rh_fmac_open(&a, h, p, sizeof(p) - 1, t));
		rh_fmac_free(&o);
		rh_fmac_free(&a);
	}
}

/* Another stream, lane, connection, nonce or secret: another key. */
static void test_key_inputs(void)
{
	static const uint8_t other[RH_NONCE_LEN] = "some-other-nonc";
	uint8_t h[RH_HDR_LEN], t[RH_TAG_LEN];
	struct rh_fmac o, a;

	data_hdr(h, 1);
	for (int k = 0; k < 6; k++) {
		uint8_t sec[RH_SECRET_LEN];

		memcpy(sec, secret, sizeof(sec));
		sec[0] ^= k == 5;
		EXPECT_EQ(rh_fmac_init(&o, secret, 7, 6, 2, 4, n_open, n_acc, true), 0);
		EXPECT_EQ(rh_fmac_init(&a, sec, k == 0 ? 8 : 7, k == 1 ? 8 : 6, k == 2 ? 3 : 2,
				       k == 3 ? 5 : 4, k == 4 ? other : n_open, n_acc, false),
			  0);
		EXPECT_EQ(rh_fmac_seal(&o, h, NULL, 0, t), 0);
		EXPECT(!rh_fmac_open(&a, h, NULL, 0, t));
		rh_fmac_free(&o);
		rh_fmac_free(&a);
	}
	/* the acceptor's nonce too */
	EXPECT_EQ(rh_fmac_init(&o, secret, 7, 6, 2, 4, n_open, n_acc, true), 0);
	EXPECT_EQ(rh_fmac_init(&a, secret, 7, 6, 2, 4, n_open, other, false), 0);
	EXPECT_EQ(rh_fmac_seal(&o, h, NULL, 0, t), 0);
	EXPECT(!rh_fmac_open(&a, h, NULL, 0, t));
	rh_fmac_free(&o);
	rh_fmac_free(&a);
}

static void test_payload(void)
{
	static uint8_t pay[300000];
	uint8_t h[RH_HDR_LEN], t[RH_TAG_LEN], pt[RH_TAG_LEN];
	struct rh_fmac o, a;

	for (size_t i = 0; i < sizeof(pay); i++) {
		pay[i] = (uint8_t)(i * 2654435761u >> 11);
	}
	data_hdr(h, 9);
	/* sealed in one piece, checked as the bytes arrive in pieces */
	for (int bad = 0; bad < 3; bad++) {
		pair(&o, &a);
		EXPECT_EQ(rh_fmac_seal(&o, h, NULL, 0, t), 0); /* frame 0: no payload MAC */
		EXPECT(rh_fmac_open(&a, h, NULL, 0, t));
		EXPECT_EQ(rh_fmac_pay_seal(&o, pay, sizeof(pay), pt), 0); /* frame 1's */
		EXPECT_EQ(rh_fmac_seal(&o, h, NULL, 0, t), 0);
		EXPECT(rh_fmac_open(&a, h, NULL, 0, t));
		EXPECT_EQ(rh_fmac_pay_begin(&a), 0);
		if (bad == 1) {
			pay[123456] ^= 0x80;
		}
		EXPECT_EQ(rh_fmac_pay_update(&a, pay, 1), 0);
		EXPECT_EQ(rh_fmac_pay_update(&a, pay + 1, 65535), 0);
		EXPECT_EQ(rh_fmac_pay_update(&a, pay + 65536, sizeof(pay) - 65536), 0);
		if (bad == 2) {
			pt[3] ^= 1;
		}
		EXPECT_EQ(rh_fmac_pay_end(&a, pt), bad == 0);
		if (bad == 1) {
			pay[123456] ^= 0x80;
		}
		rh_fmac_free(&o);
		rh_fmac_free(&a);
	}
	/* a payload tag is bound to its frame's counter: frame 0's tag does not pass at frame 1 */
	pair(&o, &a);
	EXPECT_EQ(rh_fmac_pay_seal(&o, pay, 4096, pt), 0);
	EXPECT_EQ(rh_fmac_seal(&o, h, NULL, 0, t), 0);
	EXPECT(rh_fmac_open(&a, h, NULL, 0, t));
	EXPECT_EQ(rh_fmac_seal(&o, h, NULL, 0, t), 0);
	EXPECT(rh_fmac_open(&a, h, NULL, 0, t));
	EXPECT_EQ(rh_fmac_pay_begin(&a), 0);
	EXPECT_EQ(rh_fmac_pay_update(&a, pay, 4096), 0);
	EXPECT(!rh_fmac_pay_end(&a, pt));
	rh_fmac_free(&o);
	rh_fmac_free(&a);
}

static void test_policy(void)
{
	struct rh_hdr d = { .type = RH_F_DATA, .len = 10, .total = 10 };
	struct rh_hdr z = { .type = RH_F_DATA };
	struct rh_hdr c = { .type = RH_F_CTS, .len = 12 };

	/* required: a DATA frame without it is refused, empty ones included */
	EXPECT_EQ(rh_fmac_pay_policy(&d, true), -EBADMSG);
	EXPECT_EQ(rh_fmac_pay_policy(&z, true), -EBADMSG);
	d.flags = RH_FLAG_PMAC;
	EXPECT_EQ(rh_fmac_pay_policy(&d, true), 0);
	/* not required: taken either way (a flagged one is still checked) */
	EXPECT_EQ(rh_fmac_pay_policy(&d, false), 0);
	EXPECT_EQ(rh_fmac_pay_policy(&z, false), 0);
	/* control frames have no payload MAC: their header tag covers their payload */
	EXPECT_EQ(rh_fmac_pay_policy(&c, true), 0);
}

int main(void)
{
	test_roundtrip_and_order();
	test_tamper();
	test_key_inputs();
	test_payload();
	test_policy();
	TEST_DONE();
}
