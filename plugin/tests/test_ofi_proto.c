/* SPDX-License-Identifier: Apache-2.0 */
/* The libfabric lane's bookkeeping: immediates, lane messages, adverts, the fence gate and the
 * registration cache (lanes/ofi/proto.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lanes/ofi/proto.h"

static void test_imm_roundtrip(void)
{
	struct ofi_imm in = { .seq = 0x123456789ull, .slot = 5, .chunk = 1000, .epoch = 0x10007 };
	struct ofi_imm out;
	uint64_t v;

	EXPECT_EQ(ofi_imm_encode(&ofi_imm_wide, &in, &v), 0);
	ofi_imm_decode(&ofi_imm_wide, v, &out);
	EXPECT_EQ(out.seq, 0x123456789ull & ((1u << OFI_IMM_SEQ_BITS) - 1));
	EXPECT_EQ(out.slot, 5);
	EXPECT_EQ(out.chunk, 1000);
	EXPECT_EQ(out.epoch, 7);
	/* every field at its maximum stays in its own bits */
	in = (struct ofi_imm){ .seq = UINT64_MAX,
			       .slot = RH_MAX_RECVS - 1,
			       .chunk = (1ull << OFI_IMM_CHUNK_BITS) - 1,
			       .epoch = UINT32_MAX };
	EXPECT_EQ(ofi_imm_encode(&ofi_imm_wide, &in, &v), 0);
	EXPECT_EQ(v, UINT64_MAX);
	ofi_imm_decode(&ofi_imm_wide, v, &out);
	EXPECT_EQ(out.slot, RH_MAX_RECVS - 1);
	EXPECT_EQ(out.chunk, (1ull << OFI_IMM_CHUNK_BITS) - 1);
	/* out of range */
	in.slot = RH_MAX_RECVS;
	EXPECT_EQ(ofi_imm_encode(&ofi_imm_wide, &in, &v), -ERANGE);
	in.slot = 0;
	in.chunk = 1ull << OFI_IMM_CHUNK_BITS;
	EXPECT_EQ(ofi_imm_encode(&ofi_imm_wide, &in, &v), -ERANGE);
	/* bits add up to 64 */
	EXPECT_EQ(OFI_IMM_SEQ_BITS + OFI_IMM_SLOT_BITS + OFI_IMM_CHUNK_BITS + OFI_IMM_EPOCH_BITS,
		  64);
	EXPECT_EQ(1u << OFI_IMM_SLOT_BITS, RH_MAX_RECVS);
}

/* verbs carries 32 bits of immediate data: the narrow layout fits them, the epoch included (the
 * wide layout's epoch sits in bits 48-63, which verbs drops: every write then decoded as epoch
 * 0, and after a resume the receiver dropped every write as stale) */
static void test_imm_narrow(void)
{
	const struct ofi_imm_layout *l = &ofi_imm_narrow;
	struct ofi_imm in = { .seq = UINT64_MAX,
			      .slot = RH_MAX_RECVS - 1,
			      .chunk = (1ull << l->chunk) - 1,
			      .epoch = UINT32_MAX };
	struct ofi_imm out;
	uint64_t v;

	EXPECT_EQ(l->seq + l->slot + l->chunk + l->epoch, 32);
	EXPECT_EQ(1u << l->slot, RH_MAX_RECVS);
	EXPECT(ofi_imm_layout_for(4) == l);
	EXPECT(ofi_imm_layout_for(8) == &ofi_imm_wide);
	EXPECT(ofi_imm_layout_for(2) == NULL);
	EXPECT_EQ(ofi_imm_encode(l, &in, &v), 0);
	EXPECT_EQ(v, UINT32_MAX);
	/* a write of resume epoch 2, chunk 700, through a 32-bit immediate */
	in = (struct ofi_imm){ .seq = 4242, .slot = 3, .chunk = 700, .epoch = 2 };
	EXPECT_EQ(ofi_imm_encode(l, &in, &v), 0);
	ofi_imm_decode(l, v & UINT32_MAX, &out);
	EXPECT_EQ(out.seq, 4242 & ((1u << l->seq) - 1));
	EXPECT_EQ(out.slot, 3);
	EXPECT_EQ(out.chunk, 700);
	EXPECT_EQ(ofi_expand(out.epoch, l->epoch, 2), 2);
	EXPECT_EQ(ofi_expand(out.epoch, l->epoch, 3), 2); /* the receiver a resume ahead */
	/* the wide layout through the same 32 bits loses the epoch and the chunk's high bits */
	EXPECT_EQ(ofi_imm_encode(&ofi_imm_wide, &in, &v), 0);
	ofi_imm_decode(&ofi_imm_wide, v & UINT32_MAX, &out);
	EXPECT_EQ(out.epoch, 0);
	EXPECT(out.chunk != 700);
	/* a chunk index past 14 bits does not fit */
	in.chunk = 1ull << l->chunk;
	EXPECT_EQ(ofi_imm_encode(l, &in, &v), -ERANGE);
}

static void test_expand(void)
{
	/* near the reference, both sides of a wrap of the truncated field */
	EXPECT_EQ(ofi_expand(5, 8, 260), 261);
	EXPECT_EQ(ofi_expand(250, 8, 260), 250);
	EXPECT_EQ(ofi_expand(2, 8, 254), 258);
	EXPECT_EQ(ofi_expand(253, 8, 258), 253);
	EXPECT_EQ(ofi_expand(3, 8, 0), 3);
	EXPECT_EQ(ofi_expand(255, 8, 0), 255); /* never below zero */
	EXPECT_EQ(ofi_expand(7, 16, 7), 7);
	/* a receive window of RH_RING sequences behind rx_next_seq always expands exactly */
	for (uint64_t next = 0; next < 3 * (1u << OFI_IMM_SEQ_BITS); next += 99991) {
		for (uint64_t seq = next >= RH_RING ? next - RH_RING : 0; seq < next; seq++) {
			uint64_t lo = seq & ((1u << OFI_IMM_SEQ_BITS) - 1);

			EXPECT_EQ(ofi_expand(lo, OFI_IMM_SEQ_BITS, next), seq);
		}
	}
}

static void test_messages(void)
{
	uint8_t b[128];
	uint64_t map[2] = { 0x8000000000000005ull, 0x3 }, map2[4] = { 0 };
	enum ofi_mkind k;
	uint32_t blen;
	struct ofi_adv_req q = { .seq = 77, .total = 3 << 20, .epoch = 4, .slot = 7 }, q2;
	struct ofi_adv_msg a = { .seq = 1ull << 40,
				 .addr = 0xdeadbeef000ull,
				 .key = 42,
				 .size = 1 << 20,
				 .epoch = 9,
				 .slot = 3,
				 .status = OFI_ADV_OK },
			   a2;

	EXPECT_EQ(ofi_mhdr_put(b, OFI_M_ADV, 38), OFI_MHDR_LEN);
	EXPECT_EQ(ofi_mhdr_get(b, OFI_MHDR_LEN + 38, &k, &blen), 0);
	EXPECT_EQ(k, OFI_M_ADV);
	EXPECT_EQ(blen, 38);
	EXPECT_EQ(ofi_mhdr_get(b, OFI_MHDR_LEN + 37, &k, &blen), -EPROTO); /* truncated */
	EXPECT_EQ(ofi_mhdr_get(b, 4, &k, &blen), -EPROTO);
	b[0] = OFI_M_MAX;
	EXPECT_EQ(ofi_mhdr_get(b, 64, &k, &blen), -EPROTO);
	b[0] = OFI_M_ADV;
	b[1] = 'X';
	EXPECT_EQ(ofi_mhdr_get(b, 64, &k, &blen), -EPROTO);

	EXPECT_EQ(ofi_adv_req_put(&q, b), OFI_ADV_REQ_LEN);
	EXPECT_EQ(ofi_adv_req_get(b, OFI_ADV_REQ_LEN, &q2), 0);
	EXPECT_EQ(q2.seq, 77);
	EXPECT_EQ(q2.total, 3 << 20);
	EXPECT_EQ(q2.epoch, 4);
	EXPECT_EQ(q2.slot, 7);
	EXPECT_EQ(ofi_adv_req_get(b, OFI_ADV_REQ_LEN - 1, &q2), -EPROTO);
	b[20] = RH_MAX_RECVS;
	EXPECT_EQ(ofi_adv_req_get(b, OFI_ADV_REQ_LEN, &q2), -EPROTO);

	EXPECT_EQ(ofi_adv_put(&a, map, b, sizeof(b)), OFI_ADV_LEN);
	EXPECT_EQ(ofi_adv_get(b, OFI_ADV_LEN, &a2, map2, 4), 0);
	EXPECT(a2.seq == a.seq && a2.addr == a.addr && a2.key == a.key && a2.size == a.size &&
	       a2.epoch == a.epoch && a2.slot == a.slot && a2.status == a.status && a2.nwords == 0);
	/* with the placed-chunk map */
	a.nwords = 2;
	EXPECT_EQ(ofi_adv_put(&a, map, b, sizeof(b)), OFI_ADV_LEN + 16);
	EXPECT_EQ(ofi_adv_put(&a, map, b, OFI_ADV_LEN + 15), -ENOSPC);
	EXPECT_EQ(ofi_adv_get(b, OFI_ADV_LEN + 16, &a2, map2, 4), 0);
	EXPECT_EQ(a2.nwords, 2);
	EXPECT(map2[0] == map[0] && map2[1] == map[1]);
	EXPECT_EQ(ofi_adv_get(b, OFI_ADV_LEN + 15, &a2, map2, 4), -EPROTO); /* truncated map */
	EXPECT_EQ(ofi_adv_get(b, OFI_ADV_LEN + 16, &a2, map2, 1), -EPROTO); /* too long */
	b[37] = 9;
	EXPECT_EQ(ofi_adv_get(b, OFI_ADV_LEN + 16, &a2, map2, 4), -EPROTO);
}

/* The sender's adverts across a resume: the clear-to-send -> advert -> write cycle. */
static void test_adverts(void)
{
	struct ofi_adv_table *t = calloc(1, sizeof(*t));
	struct ofi_adv_msg a = { .seq = 70,
				 .addr = 0x1000,
				 .key = 5,
				 .size = 1 << 20,
				 .epoch = 1,
				 .slot = 2,
				 .status = OFI_ADV_OK,
				 .nwords = 1 };
	uint64_t raddr, key, placed[1] = { 0x5 }; /* chunks 0 and 2 already held */

	EXPECT_EQ(ofi_adv_lookup(t, 70, 2, 0), OFI_ADV_NONE);
	ofi_adv_requested(t, 70, 2, 1, 1000);
	EXPECT_EQ(ofi_adv_lookup(t, 70, 2, 0), OFI_ADV_REQUESTED);
	/* an unanswered request is overdue after the limit, and only that request */
	EXPECT(!ofi_adv_overdue(t, 70, 2, 3000, 3000));
	EXPECT(ofi_adv_overdue(t, 70, 2, 4001, 3000));
	EXPECT(!ofi_adv_overdue(t, 70 + RH_RING, 2, 4001, 3000));
	EXPECT(!ofi_adv_overdue(t, 70, 3, 4001, 3000));
	EXPECT(!ofi_adv_overdue(t, 70, 2, 500, 3000)); /* clock before the request */
	EXPECT_EQ(ofi_adv_lookup(t, 70 + RH_RING, 2, 0), OFI_ADV_NONE); /* same ring slot */
	EXPECT_EQ(ofi_adv_target(t, 70, 2, 0, 4096, &raddr, &key), -ENOENT);
	/* an answer nobody asked for is ignored */
	a.seq = 71;
	EXPECT(!ofi_adv_store(t, &a, placed));
	a.seq = 70;
	EXPECT(ofi_adv_store(t, &a, placed));
	EXPECT_EQ(ofi_adv_lookup(t, 70, 2, 1), OFI_ADV_VALID);
	EXPECT(!ofi_adv_overdue(t, 70, 2, 9000, 3000)); /* answered */
	/* a replay never writes what the receiver holds already */
	EXPECT(ofi_adv_placed(t, 70, 2, 0));
	EXPECT(!ofi_adv_placed(t, 70, 2, 1));
	EXPECT(ofi_adv_placed(t, 70, 2, 2));
	EXPECT(!ofi_adv_placed(t, 70, 2, 64)); /* past the map */
	EXPECT(!ofi_adv_placed(t, 71, 2, 0));
	EXPECT(!ofi_adv_placed(t, 70, 3, 0));
	EXPECT_EQ(ofi_adv_target(t, 70, 2, 512 << 10, 512 << 10, &raddr, &key), 0);
	EXPECT_EQ(raddr, 0x1000 + (512 << 10));
	EXPECT_EQ(key, 5);
	/* never outside the advertised buffer */
	EXPECT_EQ(ofi_adv_target(t, 70, 2, 512 << 10, (512 << 10) + 1, &raddr, &key), -ERANGE);
	EXPECT_EQ(ofi_adv_target(t, 70, 2, (1 << 20) + 1, 0, &raddr, &key), -ERANGE);
	/* after a resume at epoch 2 the advert of epoch 1 is not used any more */
	EXPECT_EQ(ofi_adv_lookup(t, 70, 2, 2), OFI_ADV_NONE);
	ofi_adv_requested(t, 70, 2, 2, 2000);
	/* a late STALE answer to the old request does not cancel the new one */
	a.epoch = 1;
	a.status = OFI_ADV_STALE;
	EXPECT(!ofi_adv_store(t, &a, placed));
	EXPECT_EQ(ofi_adv_lookup(t, 70, 2, 2), OFI_ADV_REQUESTED);
	EXPECT(!ofi_adv_placed(t, 70, 2, 0)); /* the old map went with the old advert */
	/* STALE/GONE for the current request: forgotten, chunks waiting for it are dropped */
	a.epoch = 2;
	a.status = OFI_ADV_GONE;
	EXPECT(ofi_adv_store(t, &a, placed));
	EXPECT_EQ(ofi_adv_lookup(t, 70, 2, 2), OFI_ADV_NONE);
	ofi_adv_table_free(t);
	free(t);
}

/* The receiver turns a write completion back into a DATA header. */
static void receiver_records(const struct ofi_imm_layout *l)
{
	struct ofi_rrec_table *t = calloc(1, sizeof(*t));
	char buf[64];
	uint64_t seq = (1ull << l->seq) + 130, chunk = 4096, v;
	struct ofi_rrec *r = &t->e[seq % RH_RING][1];
	struct ofi_imm im = { .seq = seq, .slot = 1, .chunk = 2, .epoch = 3 }, d;
	struct rh_hdr h;

	r->seq = seq;
	r->total = 10000;
	r->size = 16384;
	r->buf = buf;
	r->epoch = 3;
	r->state = OFI_RREC_ADVERTISED;
	EXPECT_EQ(ofi_imm_encode(l, &im, &v), 0);
	ofi_imm_decode(l, v, &d);
	EXPECT(ofi_rrec_find(l, t, &d) == r);
	EXPECT_EQ(ofi_rrec_hdr(l, r, &d, chunk, 3, 0xabc, &h), 0);
	EXPECT_EQ(h.type, RH_F_DATA);
	EXPECT_EQ(h.seq, seq);
	EXPECT_EQ(h.slot, 1);
	EXPECT_EQ(h.off, 8192);
	EXPECT_EQ(h.len, 10000 - 8192);
	EXPECT_EQ(h.total, 10000);
	EXPECT_EQ(h.epoch, 3);
	EXPECT_EQ(h.conn_id, 0xabc);
	/* the epoch is expanded against the receiver's (it may be ahead by a few) */
	EXPECT_EQ(ofi_rrec_hdr(l, r, &d, chunk, 5, 0xabc, &h), 0);
	EXPECT_EQ(h.epoch, 3);
	/* a chunk past the message is a protocol error */
	d.chunk = 3;
	EXPECT_EQ(ofi_rrec_hdr(l, r, &d, chunk, 3, 0xabc, &h), -EPROTO);
	/* a message larger than the buffer is too */
	d.chunk = 2;
	r->size = 9000;
	EXPECT_EQ(ofi_rrec_hdr(l, r, &d, chunk, 3, 0xabc, &h), -EPROTO);
	/* unknown advert: another seq in the same ring slot, another slot, not advertised */
	d.seq = (seq + RH_RING) & ((1ull << l->seq) - 1);
	EXPECT(ofi_rrec_find(l, t, &d) == NULL);
	d.seq = seq & ((1ull << l->seq) - 1);
	d.slot = 2;
	EXPECT(ofi_rrec_find(l, t, &d) == NULL);
	d.slot = 1;
	r->state = OFI_RREC_PENDING;
	EXPECT(ofi_rrec_find(l, t, &d) == NULL);
	free(t);
}

static void test_receiver_records(void)
{
	receiver_records(&ofi_imm_wide);
	receiver_records(&ofi_imm_narrow);
}

/* Requests for one receive arrive on any endpoint of the lane, so out of order: one issued
 * before a resume must not replace the sender's newer request or an advert in use. */
static void test_request_order(void)
{
	struct ofi_rrec r = { .seq = 42, .epoch = 5, .state = OFI_RREC_PENDING };
	struct ofi_adv_req q = { .seq = 42, .epoch = 4, .slot = 0 };

	EXPECT(!ofi_rrec_take(&r, &q)); /* older request of a pending one */
	r.state = OFI_RREC_ADVERTISED;
	EXPECT(!ofi_rrec_take(&r, &q)); /* older request of an advert in use */
	q.epoch = 5;
	EXPECT(ofi_rrec_take(&r, &q)); /* same epoch: asked again (after a STALE/GONE) */
	q.epoch = 6;
	EXPECT(ofi_rrec_take(&r, &q)); /* a resume */
	q.epoch = 1;
	q.seq = 42 + RH_RING; /* the ring slot's next receive */
	EXPECT(ofi_rrec_take(&r, &q));
	r.state = OFI_RREC_NONE;
	q.seq = 42;
	EXPECT(ofi_rrec_take(&r, &q));
}

static void test_gate(void)
{
	uint32_t marks[3] = { 2, 2, 1 };

	EXPECT(ofi_gate_open(0, NULL, 0, 0));
	EXPECT(ofi_gate_open(2, marks, 2, 0));
	EXPECT(!ofi_gate_open(2, marks, 3, 0)); /* one endpoint has not passed its marker */
	EXPECT(!ofi_gate_open(2, marks, 2, 1)); /* a fenced endpoint is still open */
	EXPECT(ofi_gate_open(1, marks, 3, 0));
}

static void test_rcache(void)
{
	struct ofi_rcache c = { 0 };
	struct ofi_rc_entry e = { 0 }, out[4];
	uintptr_t lo, hi;

	ofi_rc_range(0x10010, 100, &lo, &hi);
	EXPECT_EQ(lo, 0x10000);
	EXPECT_EQ(hi, 0x11000);
	ofi_rc_range(0x10000, 0, &lo, &hi);
	EXPECT_EQ(hi - lo, 4096);
	ofi_rc_range(0x10ff0, 0x20, &lo, &hi);
	EXPECT_EQ(lo, 0x10000);
	EXPECT_EQ(hi, 0x12000);
	EXPECT(ofi_rc_find(&c, 0x10000, 10) == NULL);
	for (int i = 0; i < 40; i++) {
		e.lo = 0x100000 * (uintptr_t)(i + 1);
		e.hi = e.lo + 0x80000;
		e.key = (uint64_t)i;
		EXPECT_EQ(ofi_rc_insert(&c, &e), 0);
	}
	/* a buffer registered once is found for every range inside it */
	EXPECT(ofi_rc_find(&c, 0x300000, 0x80000) != NULL);
	EXPECT_EQ(ofi_rc_find(&c, 0x300100, 0x100)->key, 2);
	EXPECT(ofi_rc_find(&c, 0x37ff00, 0x200) == NULL); /* runs past the end */
	/* deregistration drops every entry overlapping the range */
	EXPECT_EQ(ofi_rc_take(&c, 0x2f0000, 0x410000, out, 4), 2);
	EXPECT(ofi_rc_find(&c, 0x300100, 0x100) == NULL);
	EXPECT(ofi_rc_find(&c, 0x400100, 0x100) == NULL);
	EXPECT(ofi_rc_find(&c, 0x500100, 0x100) != NULL);
	EXPECT_EQ(c.n, 38);
	ofi_rc_free(&c);
	EXPECT_EQ(c.n, 0);
}

int main(void)
{
	test_imm_roundtrip();
	test_imm_narrow();
	test_expand();
	test_messages();
	test_adverts();
	test_receiver_records();
	test_request_order();
	test_gate();
	test_rcache();
	TEST_DONE();
}
