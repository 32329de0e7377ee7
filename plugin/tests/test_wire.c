/* SPDX-License-Identifier: Apache-2.0 */
/* Frame header, handshake, CTS, RESUME and handle encodings, against captured bytes. */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "core/auth.h"
#include "core/wire.h"

static void test_hdr(void)
{
	/* Captured encoding of a DATA frame: type 1, slot 2, len 4096, conn 0x1122334455667788,
	 * epoch 3, aux 7, seq 9, off 8192, total 16384 (little-endian). */
	static const uint8_t golden[RH_HDR_LEN] = {
		0x01, 0x02, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x88, 0x77, 0x66, 0x55,
		0x44, 0x33, 0x22, 0x11, 0x03, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00,
		0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00,
		0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	};
	struct rh_hdr h = { .type = RH_F_DATA,
			    .slot = 2,
			    .len = 4096,
			    .conn_id = 0x1122334455667788ull,
			    .epoch = 3,
			    .aux = 7,
			    .seq = 9,
			    .off = 8192,
			    .total = 16384 },
		      g;
	uint8_t b[RH_HDR_LEN];

	rh_hdr_put(&h, b);
	EXPECT(memcmp(b, golden, sizeof(b)) == 0);
	EXPECT_EQ(rh_hdr_get(golden, &g), 0);
	EXPECT_EQ(g.conn_id, h.conn_id);
	EXPECT_EQ(g.off, 8192);
	EXPECT_EQ(g.total, 16384);
	EXPECT_EQ(g.epoch, 3);
	/* bad type, bad slot, data past the end, oversized control payload */
	b[0] = 0;
	EXPECT_EQ(rh_hdr_get(b, &g), -EPROTO);
	b[0] = RH_F_DATA;
	b[1] = RH_MAX_RECVS;
	EXPECT_EQ(rh_hdr_get(b, &g), -EPROTO);
	h.off = 16384 - 100;
	rh_hdr_put(&h, b);
	EXPECT_EQ(rh_hdr_get(b, &g), -EPROTO);
	h.type = RH_F_CTS;
	h.len = RH_CTRL_MAX + 1;
	h.off = 0;
	rh_hdr_put(&h, b);
	EXPECT_EQ(rh_hdr_get(b, &g), -EPROTO);
	/* zero-byte message */
	h = (struct rh_hdr){ .type = RH_F_DATA };
	rh_hdr_put(&h, b);
	EXPECT_EQ(rh_hdr_get(b, &g), 0);
}

static void test_hello(void)
{
	struct rh_hello h = { .kind = RH_HELLO_LANE,
			      .from_sender = 1,
			      .nstreams = 4,
			      .stream = 3,
			      .lane_id = 6,
			      .listen_id = 0xabcdef,
			      .chunk = 524288,
			      .src_nic = 1,
			      .dst_nic = 2,
			      .nnics = 2 },
			g;
	uint8_t b[4096];
	int len;

	h.nics[0] = (struct rh_peer_nic){
		.ipv4 = 0x0100007f, .port = 0x3412, .rail = 0, .numa = 1, .up = true
	};
	strcpy(h.nics[0].pci, "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0");
	h.nics[1] = (struct rh_peer_nic){
		.ipv4 = 0x0201a8c0, .port = 0x7856, .rail = 1, .numa = -1, .up = false
	};
	len = rh_hello_put(&h, b, sizeof(b));
	EXPECT(len > 29);
	EXPECT_EQ(rh_hello_get(b, (size_t)len, &g), 0);
	EXPECT_EQ(g.kind, RH_HELLO_LANE);
	EXPECT_EQ(g.lane_id, 6);
	EXPECT_EQ(g.listen_id, 0xabcdef);
	EXPECT_EQ(g.nnics, 2);
	EXPECT_EQ(g.nics[1].numa, -1);
	EXPECT_EQ(g.nics[1].up, 0);
	EXPECT(strcmp(g.nics[0].pci, h.nics[0].pci) == 0);
	EXPECT_EQ(g.nics[0].port, 0x3412);
	/* nonce and MAC travel at fixed offsets after the magic */
	memset(h.nonce, 0xa5, sizeof(h.nonce));
	memset(h.mac, 0x5a, sizeof(h.mac));
	memset(h.snonce, 0x3c, sizeof(h.snonce));
	h.flags = RH_HELLO_F_PMAC;
	len = rh_hello_put(&h, b, sizeof(b));
	EXPECT_EQ(b[28], 0xa5);
	EXPECT_EQ(b[28 + RH_NONCE_LEN], 0x5a);
	EXPECT_EQ(b[28 + RH_NONCE_LEN + RH_MAC_LEN], 0x3c);
	EXPECT_EQ(rh_hello_get(b, (size_t)len, &g), 0);
	EXPECT(memcmp(g.nonce, h.nonce, RH_NONCE_LEN) == 0);
	EXPECT(memcmp(g.mac, h.mac, RH_MAC_LEN) == 0);
	EXPECT(memcmp(g.snonce, h.snonce, RH_NONCE_LEN) == 0);
	EXPECT_EQ(g.flags, RH_HELLO_F_PMAC);
	/* truncated / bad magic / stream index out of range */
	EXPECT_EQ(rh_hello_get(b, (size_t)len - 3, &g), -EPROTO);
	b[0] ^= 1;
	EXPECT_EQ(rh_hello_get(b, (size_t)len, &g), -EPROTO);
	b[0] ^= 1;
	b[7] = 4;
	EXPECT_EQ(rh_hello_get(b, (size_t)len, &g), -EPROTO);
	EXPECT_EQ(rh_hello_put(&h, b, 20), -ENOSPC);
	b[7] = 3;
	EXPECT_EQ(g.tp_len, 0); /* none sent: none decoded */
	/* transport bytes: a length byte and the bytes after the NICs, only when there are some */
	h.tp_len = 25;
	for (int i = 0; i < 25; i++) {
		h.tp[i] = (uint8_t)(0x40 + i);
	}
	EXPECT_EQ(rh_hello_put(&h, b, sizeof(b)), len + 26);
	EXPECT_EQ(rh_hello_get(b, (size_t)len + 26, &g), 0);
	EXPECT_EQ(g.tp_len, 25);
	EXPECT(memcmp(g.tp, h.tp, 25) == 0);
	EXPECT_EQ(rh_hello_get(b, (size_t)len + 25, &g), -EPROTO); /* cut short */
	b[len] = 0;
	EXPECT_EQ(rh_hello_get(b, (size_t)len + 26, &g), -EPROTO); /* an empty trailer */
	b[len] = RH_HELLO_TP_MAX + 1;
	EXPECT_EQ(rh_hello_get(b, (size_t)len + 26, &g), -EPROTO); /* longer than allowed */
	EXPECT_EQ(rh_hello_put(&h, b, (size_t)len + 25), -ENOSPC);
	h.tp_len = RH_HELLO_TP_MAX + 1;
	EXPECT_EQ(rh_hello_put(&h, b, sizeof(b)), -ENOSPC);
}

static void test_cts_resume(void)
{
	struct rh_cts c = { .seq = 5,
			    .n = 3,
			    .tags = { 100, 101, 102 },
			    .sizes = { 1, 1ull << 31, 0 } },
		      g;
	static struct rh_resume r, rg;
	uint8_t b[RH_CTRL_MAX];
	int len;

	len = rh_cts_put(&c, b, sizeof(b));
	EXPECT_EQ(len, 36);
	EXPECT_EQ(rh_cts_get(b, (size_t)len, 3, &g), 0);
	EXPECT_EQ(g.sizes[1], 1ull << 31);
	EXPECT_EQ(g.tags[2], 102);
	EXPECT_EQ(rh_cts_get(b, (size_t)len, 2, &g), -EPROTO);

	r.next_seq = 77;
	r.ndead = 2;
	r.dead[0] = 0;
	r.dead[1] = 4;
	r.nout = 2;
	r.out[0] = c;
	r.out[0].seq = 75;
	r.done[0] = 0x5;
	r.out[1] = (struct rh_cts){ .seq = 76, .n = 1, .tags = { 9 }, .sizes = { 4096 } };
	r.nruns[0][1] = 2;
	r.runs[0][1][0] = (struct rh_run){ .start = 0, .count = 3 };
	r.runs[0][1][1] = (struct rh_run){ .start = 7, .count = 1 };
	len = rh_resume_put(&r, b, sizeof(b));
	EXPECT_EQ((size_t)len, rh_resume_base_len(&r) + 16);
	EXPECT(len > 0);
	EXPECT_EQ(rh_resume_get(b, (size_t)len, &rg), 0);
	EXPECT_EQ(rg.next_seq, 77);
	EXPECT_EQ(rg.ndead, 2);
	EXPECT_EQ(rg.dead[1], 4);
	EXPECT_EQ(rg.nout, 2);
	EXPECT_EQ(rg.out[0].seq, 75);
	EXPECT_EQ(rg.out[0].n, 3);
	EXPECT_EQ(rg.done[0], 0x5);
	EXPECT_EQ(rg.out[1].seq, 76);
	EXPECT_EQ(rg.out[1].sizes[0], 4096);
	EXPECT_EQ(rg.nruns[0][0], 0);
	EXPECT_EQ(rg.nruns[0][1], 2);
	EXPECT_EQ(rg.nruns[0][2], 0);
	EXPECT_EQ(rg.runs[0][1][1].start, 7);
	EXPECT_EQ(rg.runs[0][1][1].count, 1);
	EXPECT_EQ(rg.nruns[1][0], 0);
	EXPECT_EQ(rh_resume_get(b, (size_t)len - 1, &rg), -EPROTO);
	/* overlapping runs are refused */
	r.runs[0][1][1].start = 2;
	len = rh_resume_put(&r, b, sizeof(b));
	EXPECT_EQ(rh_resume_get(b, (size_t)len, &rg), -EPROTO);
	/* as are empty ones */
	r.runs[0][1][1] = (struct rh_run){ .start = 9, .count = 0 };
	len = rh_resume_put(&r, b, sizeof(b));
	EXPECT_EQ(rh_resume_get(b, (size_t)len, &rg), -EPROTO);
	/* a record too big for the buffer is refused, never truncated */
	EXPECT_EQ(rh_resume_put(&r, b, rh_resume_base_len(&r) + 8), -ENOSPC);
}

static void test_handle(void)
{
	struct rh_handle h = { .nnics = 2, .listen_nic = 1, .listen_id = 42 }, g;
	uint8_t b[RH_HANDLE_LEN];

	h.nics[0].ipv4 = 0x0100007f;
	h.nics[0].port = 0x1234;
	h.nics[0].rail = 0;
	h.nics[0].up = 1;
	h.nics[1].ipv4 = 0x0200007f;
	h.nics[1].port = 0x5678;
	h.nics[1].rail = 1;
	rh_handle_put(&h, b);
	EXPECT_EQ(rh_handle_get(b, &g), 0);
	EXPECT_EQ(g.listen_id, 42);
	EXPECT_EQ(g.listen_nic, 1);
	EXPECT_EQ(g.nics[1].port, 0x5678);
	/* the connector's cookie bytes are not part of the encoding */
	for (int i = RH_HANDLE_COOKIE_OFF; i < RH_HANDLE_LEN; i++) {
		EXPECT_EQ(b[i], 0);
	}
	EXPECT(16 + 8 * RH_HANDLE_NICS <= RH_HANDLE_SECRET_OFF);
	EXPECT(RH_HANDLE_SECRET_OFF + RH_SECRET_LEN <= RH_HANDLE_COOKIE_OFF);
	/* the secret travels in the handle (and only there) */
	memset(h.secret, 0x3c, sizeof(h.secret));
	rh_handle_put(&h, b);
	EXPECT_EQ(rh_handle_get(b, &g), 0);
	EXPECT(memcmp(g.secret, h.secret, RH_SECRET_LEN) == 0);
	EXPECT_EQ(b[RH_HANDLE_SECRET_OFF], 0x3c);
	b[5] = 3;
	EXPECT_EQ(rh_handle_get(b, &g), -EINVAL);
	/* a handle of the previous wire protocol ("RHHP") is refused: mixed builds fail at
	 * connect instead of misreading each other's RESUME records and lanes */
	b[5] = 1;
	EXPECT_EQ(rh_handle_get(b, &g), 0);
	b[0] = 'R';
	b[1] = 'H';
	b[2] = 'H';
	b[3] = 'P';
	EXPECT(rh_handle_get(b, &g) < 0);
	/* and so is one of "RHH2" (no secret) */
	b[3] = '2';
	EXPECT(rh_handle_get(b, &g) < 0);
}

/* A hello's MAC proves the secret and binds what it must: connection, epoch, direction, the
 * bound nonces and every field, the stream index and count included (issue 29, 3). */
static void test_hello_mac(void)
{
	uint8_t key[RH_SECRET_LEN], other[RH_SECRET_LEN], n1[RH_NONCE_LEN], n2[RH_NONCE_LEN];
	struct rh_hello h = { .kind = RH_HELLO_LANE,
			      .from_sender = 1,
			      .nstreams = 4,
			      .lane_id = 8,
			      .chunk = 524288,
			      .src_nic = 1,
			      .dst_nic = 0 },
			g;

	memset(key, 1, sizeof(key));
	memset(other, 2, sizeof(other));
	memset(n1, 3, sizeof(n1));
	memset(n2, 4, sizeof(n2));
	EXPECT_EQ(rh_auth_random(h.nonce, sizeof(h.nonce)), 0);
	EXPECT_EQ(rh_auth_sign(key, &h, false, 77, 5, n1, n2), 0);
	EXPECT(rh_auth_verify(key, &h, false, 77, 5, n1, n2));
	EXPECT(!rh_auth_verify(other, &h, false, 77, 5, n1, n2)); /* no secret, no entry */
	EXPECT(!rh_auth_verify(key, &h, false, 78, 5, n1, n2)); /* another connection */
	EXPECT(!rh_auth_verify(key, &h, false, 77, 6, n1, n2)); /* another epoch */
	EXPECT(!rh_auth_verify(key, &h, true, 77, 5, n1, n2)); /* reflected as a reply */
	EXPECT(!rh_auth_verify(key, &h, false, 77, 5, n2, n1)); /* another pair of nonces */
	g = h;
	g.stream = 3; /* each stream's hello is signed on its own */
	EXPECT(!rh_auth_verify(key, &g, false, 77, 5, n1, n2));
	g = h;
	g.nstreams = 5; /* and names its lane's size */
	EXPECT(!rh_auth_verify(key, &g, false, 77, 5, n1, n2));
	g = h;
	g.lane_id = 10;
	EXPECT(!rh_auth_verify(key, &g, false, 77, 5, n1, n2));
	g = h;
	g.snonce[0] ^= 1; /* the stream nonce that keys the frame MACs (issue 29, 2) */
	EXPECT(!rh_auth_verify(key, &g, false, 77, 5, n1, n2));
	g = h;
	g.flags ^= RH_HELLO_F_PMAC; /* asking for (or dropping) the payload MAC */
	EXPECT(!rh_auth_verify(key, &g, false, 77, 5, n1, n2));
	g = h;
	g.nnics = 1; /* the NIC table is covered too */
	EXPECT(!rh_auth_verify(key, &g, false, 77, 5, n1, n2));
	g = h; /* and the transport's bytes (a queue pair address): changed, added or dropped */
	g.tp_len = 4;
	memcpy(g.tp, "\x01\x02\x03\x04", 4);
	EXPECT(!rh_auth_verify(key, &g, false, 77, 5, n1, n2));
	EXPECT_EQ(rh_auth_sign(key, &g, false, 77, 5, n1, n2), 0);
	EXPECT(rh_auth_verify(key, &g, false, 77, 5, n1, n2));
	g.tp[3] ^= 1;
	EXPECT(!rh_auth_verify(key, &g, false, 77, 5, n1, n2));
	g.tp[3] ^= 1;
	g.tp_len = 3;
	EXPECT(!rh_auth_verify(key, &g, false, 77, 5, n1, n2));
	g = h;
	g.mac[31] ^= 1;
	EXPECT(!rh_auth_verify(key, &g, false, 77, 5, n1, n2));
}

static void test_epoch_bounds(void)
{
	EXPECT(rh_epoch_ok(1, 1));
	EXPECT(rh_epoch_ok(5, 2)); /* older: fine (stale frames are dropped elsewhere) */
	EXPECT(rh_epoch_ok(1, 1 + RH_EPOCH_AHEAD_MAX));
	EXPECT(!rh_epoch_ok(1, 2 + RH_EPOCH_AHEAD_MAX));
	EXPECT(!rh_epoch_ok(1, UINT32_MAX)); /* finding 5: UINT32_MAX then ++ wrapped to 0 */
	EXPECT(!rh_epoch_ok(RH_EPOCH_LIMIT - 1, RH_EPOCH_LIMIT));
	EXPECT(rh_epoch_ok(RH_EPOCH_LIMIT - 1, RH_EPOCH_LIMIT - 1));
}

int main(void)
{
	test_hdr();
	test_hello();
	test_cts_resume();
	test_handle();
	test_hello_mac();
	test_epoch_bounds();
	TEST_DONE();
}
