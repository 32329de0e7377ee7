/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The verbs lane's pure protocol (lanes/verbs/proto.c): the write immediate names an advert and
 * a chunk, advert ids are never given again while a write naming them can arrive (so nothing
 * aliases across resumes), the queue pair address codec, the verdicts on completions and
 * events.
 */
#include <errno.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "../src/lanes/ofi/proto.h"
#include "../src/lanes/verbs/proto.h"
#include "check.h"

static void test_imm(void)
{
	uint32_t imm, adv, chunk;

	EXPECT_EQ(verbs_imm_encode(0, 0, &imm), 0);
	EXPECT_EQ(imm, 0);
	EXPECT_EQ(verbs_imm_encode(VERBS_NADV - 1, VERBS_IMM_CHUNK_MAX, &imm), 0);
	EXPECT_EQ(imm, 0xffffffffu);
	verbs_imm_decode(imm, &adv, &chunk);
	EXPECT_EQ(adv, VERBS_NADV - 1);
	EXPECT_EQ(chunk, VERBS_IMM_CHUNK_MAX);
	EXPECT_EQ(verbs_imm_encode(1234, 56789, &imm), 0);
	verbs_imm_decode(imm, &adv, &chunk);
	EXPECT_EQ(adv, 1234);
	EXPECT_EQ(chunk, 56789);
	EXPECT_EQ(verbs_imm_encode(VERBS_NADV, 0, &imm), -ERANGE);
	EXPECT_EQ(verbs_imm_encode(0, (uint64_t)VERBS_IMM_CHUNK_MAX + 1, &imm), -ERANGE);
}

static struct verbs_adv_ids ids;

static void test_adv_lifecycle(void)
{
	int a, b;

	verbs_adv_init(&ids);
	EXPECT_EQ(verbs_adv_alloc(&ids, 2, 7, 0, 1, 0), -EINVAL);
	a = verbs_adv_alloc(&ids, 2, 7, 0, 1, 3);
	b = verbs_adv_alloc(&ids, 4, 7, 1, 1, 1);
	EXPECT(a >= 0 && b >= 0 && a != b);
	/* writes come only on the lane the advert was given on */
	EXPECT(verbs_adv_find(&ids, (uint32_t)a, 2) != NULL);
	EXPECT(verbs_adv_find(&ids, (uint32_t)a, 4) == NULL);
	EXPECT(verbs_adv_find(&ids, VERBS_NADV + 5, 2) == NULL);
	/* (a) freed by its last write */
	EXPECT(!verbs_adv_written(&ids, (uint32_t)a));
	EXPECT(!verbs_adv_written(&ids, (uint32_t)a));
	EXPECT(verbs_adv_written(&ids, (uint32_t)a));
	EXPECT(verbs_adv_find(&ids, (uint32_t)a, 2) == NULL);
	EXPECT(!verbs_adv_written(&ids, (uint32_t)a)); /* a late duplicate changes nothing */
	/* (b) retired by the sender, on its own lane only */
	EXPECT(!verbs_adv_retire(&ids, (uint32_t)b, 2));
	EXPECT(verbs_adv_retire(&ids, (uint32_t)b, 4));
	EXPECT_EQ(ids.nlive, 0);
	/* (c) the lane fenced: everything given on it is free, nothing else */
	for (int i = 0; i < 10; i++) {
		EXPECT(verbs_adv_alloc(&ids, (uint32_t)(i % 2), (uint64_t)i, 0, 1, 4) >= 0);
	}
	EXPECT_EQ(verbs_adv_lane_fenced(&ids, 1), 5);
	EXPECT_EQ(ids.nlive, 5);
	EXPECT_EQ(verbs_adv_lane_fenced(&ids, 0), 5);
	EXPECT_EQ(ids.nlive, 0);
}

static void test_adv_full(void)
{
	verbs_adv_init(&ids);
	for (uint32_t i = 0; i < VERBS_NADV; i++) {
		EXPECT(verbs_adv_alloc(&ids, 0, i, 0, 1, 1) >= 0);
	}
	/* a full table holds the answer back; it never hands out a live id */
	EXPECT_EQ(verbs_adv_alloc(&ids, 0, 1, 0, 1, 1), -EAGAIN);
	EXPECT(verbs_adv_written(&ids, 77));
	EXPECT_EQ(verbs_adv_alloc(&ids, 0, 1, 0, 1, 1), 77);
}

/*
 * Rapid resumes inside one window of outstanding writes. One receive (seq 5, slot 0) is
 * advertised again at each of 200 resumes on a lane that stays up, while the writes of the last
 * 40 adverts are still in flight (they land late, in order per queue pair, as RC delivers).
 * Every late write must resolve to the advert it was written against, with that advert's epoch.
 * The same schedule under the ofi lane's narrow immediate (5 epoch bits expanded against the
 * receiver's newest epoch) resolves some of them to the wrong epoch: the check below can fail.
 */
#define RESUMES 200
#define WINDOW 40

struct inflight {
	uint32_t imm_verbs;
	uint64_t imm_ofi;
	uint32_t epoch;
};

static void test_rapid_resumes(void)
{
	static struct inflight q[RESUMES];
	int qh = 0, qn = 0, wrong_verbs = 0, wrong_ofi = 0, resolved = 0;
	const struct ofi_imm_layout *narrow = ofi_imm_layout_for(4);

	EXPECT(narrow != NULL);
	verbs_adv_init(&ids);
	for (uint32_t epoch = 1; epoch <= RESUMES; epoch++) {
		int id = verbs_adv_alloc(&ids, 3, 5, 0, epoch, 1);
		struct ofi_imm oim = { .seq = 5, .slot = 0, .chunk = 0, .epoch = epoch };
		struct inflight *w = &q[(qh + qn++) % RESUMES];

		EXPECT(id >= 0);
		EXPECT_EQ(verbs_imm_encode((uint32_t)id, 0, &w->imm_verbs), 0);
		EXPECT_EQ(ofi_imm_encode(narrow, &oim, &w->imm_ofi), 0);
		w->epoch = epoch;
		/* the oldest write lands once the window is full */
		while (qn > WINDOW || (epoch == RESUMES && qn > 0)) {
			struct inflight *o = &q[qh];
			uint32_t adv, chunk;
			struct verbs_advid *a;
			struct ofi_imm dec;

			qh = (qh + 1) % RESUMES;
			qn--;
			verbs_imm_decode(o->imm_verbs, &adv, &chunk);
			a = verbs_adv_find(&ids, adv, 3);
			if (!a || a->epoch != o->epoch || a->seq != 5 || chunk != 0) {
				wrong_verbs++;
			} else {
				EXPECT(verbs_adv_written(&ids, adv));
				resolved++;
			}
			ofi_imm_decode(narrow, o->imm_ofi, &dec);
			if ((uint32_t)ofi_expand(dec.epoch, narrow->epoch, epoch) != o->epoch) {
				wrong_ofi++;
			}
		}
	}
	EXPECT_EQ(wrong_verbs, 0);
	EXPECT_EQ(resolved, RESUMES);
	EXPECT_EQ(ids.nlive, 0);
	EXPECT(wrong_ofi > 0); /* the schedule does alias a truncated epoch */
}

/*
 * The lane's receive path (verbs_write_hdr, called by lanes/verbs/fence.c on every write
 * completion) over 40 resumes with 24 writes in flight on a lane that stays up: each resume
 * advertises a fresh receive record, and the oldest write lands once the window is full. Every
 * late write must rebuild the header of the advert it was written against (seq, slot, epoch,
 * chunk): under the ofi lane's narrow immediate (the lane's layout before advert ids) the same
 * schedule resolves writes more than 16 epochs old to a wrong epoch, so this fails on it.
 */
#define LANE_RESUMES 40
#define LANE_WINDOW 24
#define CH 4096u

struct lane_write {
	uint32_t imm;
	uint64_t imm_ofi;
	uint64_t seq;
	int slot;
	uint32_t epoch, chunk;
	uint32_t id;
};

static struct ofi_rrec_table rr;
static char rbuf[4 * CH];

static void advertise(uint64_t seq, int slot, uint32_t epoch, int *id)
{
	struct ofi_rrec *r = &rr.e[seq % RH_RING][slot];

	*r = (struct ofi_rrec){ .seq = seq,
				.total = 4 * CH,
				.size = 4 * CH,
				.buf = rbuf,
				.epoch = epoch,
				.state = OFI_RREC_ADVERTISED };
	*id = verbs_adv_alloc(&ids, 0, seq, slot, epoch, VERBS_ADV_WANT_ANY);
}

static void test_lane_write_hdr(void)
{
	static struct lane_write q[LANE_RESUMES];
	const struct ofi_imm_layout *narrow = ofi_imm_layout_for(4);
	int qh = 0, qn = 0, placed = 0, wrong_ofi = 0;
	struct rh_hdr h;
	uint32_t adv;
	uint8_t b[VERBS_ADV_ID_LEN];
	int id;

	verbs_adv_init(&ids);
	memset(&rr, 0, sizeof(rr));
	for (uint32_t epoch = 1; epoch <= LANE_RESUMES; epoch++) {
		struct lane_write *w = &q[(qh + qn++) % LANE_RESUMES];
		struct ofi_imm oim;

		w->seq = 1000 + epoch;
		w->slot = (int)(epoch % RH_MAX_RECVS);
		w->epoch = epoch;
		w->chunk = epoch % 4;
		advertise(w->seq, w->slot, epoch, &id);
		EXPECT(id >= 0);
		w->id = (uint32_t)id;
		EXPECT_EQ(verbs_imm_encode(w->id, w->chunk, &w->imm), 0);
		oim = (struct ofi_imm){
			.seq = w->seq, .slot = (uint32_t)w->slot, .chunk = w->chunk, .epoch = epoch
		};
		EXPECT_EQ(ofi_imm_encode(narrow, &oim, &w->imm_ofi), 0);
		while (qn > LANE_WINDOW || (epoch == LANE_RESUMES && qn > 0)) {
			struct lane_write *o = &q[qh];
			struct ofi_imm dec;
			struct ofi_rrec *r;
			struct rh_hdr ho;

			qh = (qh + 1) % LANE_RESUMES;
			qn--;
			EXPECT_EQ(verbs_write_hdr(&ids, 0, &rr, o->imm, CH, 9, &h, &adv), 0);
			EXPECT_EQ(adv, o->id);
			EXPECT_EQ(h.seq, o->seq);
			EXPECT_EQ(h.slot, o->slot);
			EXPECT_EQ(h.epoch, o->epoch);
			EXPECT_EQ(h.off, (uint64_t)o->chunk * CH);
			EXPECT_EQ(h.len, CH);
			EXPECT_EQ(h.conn_id, 9);
			placed += h.epoch == o->epoch && h.seq == o->seq;
			/* the old layout, expanded against the receiver's newest epoch */
			ofi_imm_decode(narrow, o->imm_ofi, &dec);
			r = ofi_rrec_find(narrow, &rr, &dec);
			if (!r || ofi_rrec_hdr(narrow, r, &dec, CH, epoch, 9, &ho) < 0 ||
			    ho.epoch != o->epoch) {
				wrong_ofi++;
			}
			/* the sender's next request for the record retires the id: a duplicate of
			 * the write now names no outstanding advert and is refused, never placed */
			EXPECT(verbs_adv_retire(&ids, o->id, 0));
			rr.e[o->seq % RH_RING][o->slot].state = OFI_RREC_PENDING;
			EXPECT_EQ(verbs_write_hdr(&ids, 0, &rr, o->imm, CH, 9, &h, &adv), -ENOENT);
		}
	}
	EXPECT_EQ(placed, LANE_RESUMES);
	EXPECT_EQ(ids.nlive, 0);
	EXPECT(wrong_ofi > 0); /* the old layout does alias on this schedule */

	/* an id given on another lane (queue pair) is not this lane's */
	verbs_adv_init(&ids);
	memset(&rr, 0, sizeof(rr));
	EXPECT_EQ(verbs_adv_alloc(&ids, 1, 7, 0, 3, VERBS_ADV_WANT_ANY), 0);
	EXPECT_EQ(verbs_imm_encode(0, 0, &adv), 0);
	EXPECT_EQ(verbs_write_hdr(&ids, 0, &rr, adv, CH, 9, &h, &adv), -ENOENT);
	/* a live id whose record no longer holds its advert: a protocol error, not a guess */
	advertise(7, 1, 3, &id);
	EXPECT(id >= 0);
	rr.e[7][1].epoch = 4;
	EXPECT_EQ(verbs_imm_encode((uint32_t)id, 0, &adv), 0);
	EXPECT_EQ(verbs_write_hdr(&ids, 0, &rr, adv, CH, 9, &h, &adv), -EPROTO);
	rr.e[7][1].epoch = 3;
	EXPECT_EQ(verbs_imm_encode((uint32_t)id, 0, &adv), 0);
	EXPECT_EQ(verbs_write_hdr(&ids, 0, &rr, adv, CH, 9, &h, &adv), 0);
	/* a chunk outside the message */
	EXPECT_EQ(verbs_imm_encode((uint32_t)id, 4, &adv), 0);
	EXPECT_EQ(verbs_write_hdr(&ids, 0, &rr, adv, CH, 9, &h, &adv), -EPROTO);
	/* the ADV's id prefix */
	verbs_adv_id_put(VERBS_NADV - 1, b);
	EXPECT_EQ(verbs_adv_id_get(b, sizeof(b), &adv), 0);
	EXPECT_EQ(adv, VERBS_NADV - 1);
	EXPECT_EQ(verbs_adv_id_get(b, sizeof(b) - 1, &adv), -EPROTO);
	verbs_adv_id_put(VERBS_NADV, b);
	EXPECT_EQ(verbs_adv_id_get(b, sizeof(b), &adv), -EPROTO);
}

static void test_qp_info(void)
{
	struct verbs_qp_info a = { .qpn = 0x123456, .psn = 0xabcdef, .mtu = IBV_MTU_1024 }, b;
	uint8_t buf[VERBS_QP_INFO_LEN];

	for (int i = 0; i < 16; i++) {
		a.gid[i] = (uint8_t)(i * 17);
	}
	verbs_qp_info_put(&a, buf);
	EXPECT_EQ(verbs_qp_info_get(buf, sizeof(buf), &b), 0);
	EXPECT_EQ(b.qpn, a.qpn);
	EXPECT_EQ(b.psn, a.psn);
	EXPECT_EQ(b.mtu, a.mtu);
	EXPECT(!memcmp(a.gid, b.gid, 16));
	EXPECT_EQ(verbs_qp_info_get(buf, sizeof(buf) - 1, &b), -EPROTO);
	a.qpn = 0x1000000;
	verbs_qp_info_put(&a, buf);
	EXPECT_EQ(verbs_qp_info_get(buf, sizeof(buf), &b), -EPROTO);
	a.qpn = 1;
	a.mtu = 6;
	verbs_qp_info_put(&a, buf);
	EXPECT_EQ(verbs_qp_info_get(buf, sizeof(buf), &b), -EPROTO);
}

static void test_verdicts(void)
{
	struct verbs_verdict v;

	EXPECT_EQ(verbs_wc_verdict(IBV_WC_SUCCESS).scope, VERBS_OK);
	v = verbs_wc_verdict(IBV_WC_RETRY_EXC_ERR);
	EXPECT_EQ(v.scope, VERBS_FAIL_LANE);
	EXPECT_EQ(v.err, -ETIMEDOUT);
	v = verbs_wc_verdict(IBV_WC_RNR_RETRY_EXC_ERR);
	EXPECT_EQ(v.scope, VERBS_FAIL_LANE);
	EXPECT_EQ(v.err, -ETIMEDOUT);
	EXPECT_EQ(verbs_wc_verdict(IBV_WC_WR_FLUSH_ERR).err, -ECANCELED);
	EXPECT_EQ(verbs_wc_verdict(IBV_WC_REM_ACCESS_ERR).err, -EACCES);
	EXPECT_EQ(verbs_wc_verdict(IBV_WC_FATAL_ERR).scope, VERBS_FAIL_NIC);
	EXPECT_EQ(verbs_wc_verdict(IBV_WC_GENERAL_ERR).scope, VERBS_FAIL_LANE);
	EXPECT_EQ(verbs_async_verdict(IBV_EVENT_QP_FATAL).scope, VERBS_FAIL_LANE);
	EXPECT_EQ(verbs_async_verdict(IBV_EVENT_QP_ACCESS_ERR).scope, VERBS_FAIL_LANE);
	v = verbs_async_verdict(IBV_EVENT_PORT_ERR);
	EXPECT_EQ(v.scope, VERBS_FAIL_NIC);
	EXPECT_EQ(v.err, -ENETDOWN);
	EXPECT_EQ(verbs_async_verdict(IBV_EVENT_DEVICE_FATAL).scope, VERBS_FAIL_NIC);
	EXPECT_EQ(verbs_async_verdict(IBV_EVENT_GID_CHANGE).scope, VERBS_FAIL_NIC);
	EXPECT_EQ(verbs_async_verdict(IBV_EVENT_PORT_ACTIVE).scope, VERBS_NIC_UP);
	EXPECT_EQ(verbs_async_verdict(IBV_EVENT_LID_CHANGE).scope, VERBS_OK);
	EXPECT_EQ(verbs_async_verdict(IBV_EVENT_COMM_EST).scope, VERBS_OK);
}

int main(void)
{
	test_imm();
	test_adv_lifecycle();
	test_adv_full();
	test_rapid_resumes();
	test_lane_write_hdr();
	test_qp_info();
	test_verdicts();
	TEST_DONE();
}
