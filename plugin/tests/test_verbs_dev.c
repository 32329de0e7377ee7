/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The verbs lane's device phases against a fake libibverbs (fake_ibv.c): the shim's table,
 * queue pair state transitions with the kernel's attribute masks, error completions turned into
 * a lane failure (and the flushes behind them), the move to ERROR and a re-created queue pair
 * for fail-back, the registration cache per protection domain, dmabuf registration, and the
 * RoCE v2 GID index read from a sysfs fixture.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dlfcn.h>

#include "../src/lanes/verbs/lane.h"
#include "../src/lanes/verbs/verbs.h"
#include "../src/core/wire.h"
#include "../src/param.h"
#include "check.h"
#include "fake_ibv.h"

static struct verbs_qp_params params(void)
{
	struct verbs_qp_params p = {
		.port = 1,
		.gid_index = 3,
		.mtu = IBV_MTU_4096,
		.timeout = 20,
		.retry_cnt = 7,
		.rnr_retry = 7,
		.max_send_wr = 64,
		.max_recv_wr = 64,
	};
	return p;
}

static struct verbs_qp_info peer(void)
{
	struct verbs_qp_info r = { .qpn = 0x4242, .psn = 0x777, .mtu = IBV_MTU_1024 };

	r.gid[10] = r.gid[11] = 0xff;
	r.gid[12] = 10;
	r.gid[15] = 2;
	return r;
}

/* The real library, where this host has it: every mandatory entry found. */
static void test_real_library(void)
{
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);

	verbs_ib_use(NULL);
	if (!h) {
		EXPECT(!verbs_ib_load());
		return;
	}
	dlclose(h);
	EXPECT(verbs_ib_load());
	EXPECT(verbs_ib.create_qp != NULL && verbs_ib.modify_qp != NULL &&
	       verbs_ib.get_device_list != NULL && verbs_ib.query_gid != NULL);
	EXPECT(verbs_ib.create_qp != fake_ibv_fns.create_qp);
	verbs_ib_unload();
	EXPECT(verbs_ib.create_qp == NULL);
}

static void test_params(void)
{
	struct verbs_qp_params p;

	unsetenv("RAILHOP_IB_TIMEOUT");
	unsetenv("RAILHOP_IB_RETRY_CNT");
	EXPECT_EQ(rh_params_load(), 0);
	verbs_qp_params_init(&p, 1, 3, IBV_MTU_1024, 32);
	EXPECT_EQ(p.timeout, 20); /* NCCL's defaults */
	EXPECT_EQ(p.retry_cnt, 7);
	EXPECT_EQ(p.rnr_retry, 7);
	EXPECT_EQ(p.max_send_wr, 32);
	EXPECT_EQ(p.gid_index, 3);
	setenv("RAILHOP_IB_TIMEOUT", "14", 1);
	setenv("RAILHOP_IB_RETRY_CNT", "3", 1);
	EXPECT_EQ(rh_params_load(), 0);
	verbs_qp_params_init(&p, 1, 3, IBV_MTU_1024, 32);
	EXPECT_EQ(p.timeout, 14);
	EXPECT_EQ(p.retry_cnt, 3);
	setenv("RAILHOP_IB_RETRY_CNT", "8", 1); /* a QP has 3 bits for it */
	EXPECT(rh_params_load() < 0);
	setenv("RAILHOP_IB_RETRY_CNT", "7", 1);
	setenv("RAILHOP_IB_TIMEOUT", "0", 1);
	EXPECT(rh_params_load() < 0);
	unsetenv("RAILHOP_IB_TIMEOUT");
	unsetenv("RAILHOP_IB_RETRY_CNT");
	EXPECT_EQ(rh_params_load(), 0);
}

static void test_shim(void)
{
	struct verbs_ib_fns partial = fake_ibv_fns;

	verbs_ib_use(&fake_ibv_fns);
	EXPECT(verbs_ib_load());
	EXPECT(verbs_ib.create_qp == fake_ibv_fns.create_qp);
	verbs_ib_unload();
	verbs_ib_use(NULL);
	EXPECT(verbs_ib.create_qp == NULL);
	partial.reg_dmabuf_mr = NULL;
	verbs_ib_use(&partial);
	EXPECT(verbs_ib_load());
	verbs_ib_unload();
	verbs_ib_use(&fake_ibv_fns);
}

static void test_connect(void)
{
	struct verbs_qp_params p = params();
	struct verbs_qp_info r = peer();
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct fake_qp *f;

	fake_ibv_reset();
	cq = verbs_ib.create_cq(&fake.ctx, 128, NULL, NULL, 0);
	qp = verbs_qp_create(&fake.pd, cq, &p);
	EXPECT(qp != NULL);
	if (!qp) {
		return;
	}
	EXPECT_EQ(qp->state, IBV_QPS_RESET);
	EXPECT_EQ(verbs_qp_connect(qp, &p, 0x99, &r), 0);
	f = fake_qp_of(qp);
	EXPECT_EQ(qp->state, IBV_QPS_RTS);
	EXPECT_EQ(f->attr.dest_qp_num, 0x4242);
	EXPECT_EQ(f->attr.rq_psn, 0x777);
	EXPECT_EQ(f->attr.sq_psn, 0x99);
	EXPECT_EQ(f->attr.timeout, 20);
	EXPECT_EQ(f->attr.retry_cnt, 7);
	EXPECT_EQ(f->attr.rnr_retry, 7);
	EXPECT_EQ(f->attr.path_mtu, IBV_MTU_1024); /* the smaller of the two active MTUs */
	EXPECT_EQ(f->attr.ah_attr.is_global, 1);
	EXPECT_EQ(f->attr.ah_attr.grh.sgid_index, 3);
	EXPECT(!memcmp(f->attr.ah_attr.grh.dgid.raw, r.gid, 16));
	EXPECT_EQ(f->attr.qp_access_flags, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE);
	/* connecting again from RTS is refused by the state machine */
	EXPECT_EQ(verbs_qp_connect(qp, &p, 0x99, &r), -EINVAL);
	EXPECT_EQ(qp->state, IBV_QPS_RTS);
	verbs_ib.destroy_qp(qp);

	/* a failing step leaves the queue pair where it stopped */
	fake.fail_to = IBV_QPS_RTR;
	qp = verbs_qp_create(&fake.pd, cq, &p);
	EXPECT_EQ(verbs_qp_connect(qp, &p, 1, &r), -EINVAL);
	EXPECT_EQ(qp->state, IBV_QPS_INIT);
	verbs_ib.destroy_qp(qp);
	verbs_ib.destroy_cq(cq);
	EXPECT_EQ(fake.nqp_live, 0);
	EXPECT_EQ(fake.ncq_live, 0);
}

/* The lane's handshake order: the opener's queue pair to INIT (its receives posted) before its
 * hello leaves, RTR/RTS once the reply's address is in; the address travels in the hello's
 * transport bytes and comes out unchanged. */
static void test_connect_in_two_halves(void)
{
	struct verbs_qp_params p = params();
	struct verbs_qp_info r = peer(), got;
	struct rh_hello h = { .kind = RH_HELLO_LANE, .nstreams = 1 }, g;
	uint8_t b[1024];
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	int len;

	fake_ibv_reset();
	cq = verbs_ib.create_cq(&fake.ctx, 128, NULL, NULL, 0);
	qp = verbs_qp_create(&fake.pd, cq, &p);
	EXPECT(qp != NULL);
	if (!qp) {
		return;
	}
	EXPECT_EQ(verbs_qp_init(qp, &p), 0);
	EXPECT_EQ(qp->state, IBV_QPS_INIT);
	verbs_qp_info_put(&r, h.tp);
	h.tp_len = VERBS_QP_INFO_LEN;
	len = rh_hello_put(&h, b, sizeof(b));
	EXPECT(len > 0);
	EXPECT_EQ(rh_hello_get(b, (size_t)len, &g), 0);
	EXPECT_EQ(verbs_qp_info_get(g.tp, g.tp_len, &got), 0);
	EXPECT_EQ(got.qpn, r.qpn);
	EXPECT_EQ(got.psn, r.psn);
	EXPECT(!memcmp(got.gid, r.gid, 16));
	EXPECT_EQ(verbs_qp_ready(qp, &p, 0x55, &got), 0);
	EXPECT_EQ(qp->state, IBV_QPS_RTS);
	EXPECT_EQ(fake_qp_of(qp)->attr.dest_qp_num, r.qpn);
	EXPECT_EQ(fake_qp_of(qp)->attr.sq_psn, 0x55);
	/* RTR straight from RESET is refused: INIT comes first */
	verbs_ib.destroy_qp(qp);
	qp = verbs_qp_create(&fake.pd, cq, &p);
	EXPECT_EQ(verbs_qp_ready(qp, &p, 1, &got), -EINVAL);
	EXPECT_EQ(qp->state, IBV_QPS_RESET);
	verbs_ib.destroy_qp(qp);
	verbs_ib.destroy_cq(cq);
	EXPECT_EQ(fake.nqp_live, 0);
}

/* A hostile peer's queue pair address (the transport bytes of a hello whose MAC held): the lane
 * moves its queue pair to RTR/RTS only towards an address of exactly the codec's length, with a
 * real QPN, PSN and MTU, whose GID is the IPv4-mapped GID of the peer NIC the handshake ran
 * with (ep.c, verbs_ep_connect_peer); every refusal leaves the queue pair in INIT with none of
 * the attacker's values set. */
static void test_peer_address(void)
{
	struct verbs_qp_params p = params();
	struct verbs_qp_info good = { .qpn = 0x4242, .psn = 0x777, .mtu = IBV_MTU_1024 }, q;
	struct rh_hello h = { .kind = RH_HELLO_LANE, .nstreams = 1 };
	uint32_t ip = inet_addr("10.0.1.2"), other = inet_addr("10.0.1.3");
	struct vb_ep e;
	struct ibv_cq *cq;
	struct fake_qp *f;
	struct {
		const char *what;
		uint32_t qpn, psn, gid_ip;
		uint8_t mtu, len;
		bool link_local;
		int want;
	} bad[] = {
		{ "truncated", 0x4242, 0x777, 0, IBV_MTU_1024, VERBS_QP_INFO_LEN - 1, false,
		  -EPROTO },
		{ "oversized", 0x4242, 0x777, 0, IBV_MTU_1024, VERBS_QP_INFO_LEN + 1, false,
		  -EPROTO },
		{ "empty", 0x4242, 0x777, 0, IBV_MTU_1024, 0, false, -EPROTO },
		{ "QPN above 24 bits", 0x1000042, 0x777, 0, IBV_MTU_1024, VERBS_QP_INFO_LEN, false,
		  -EPROTO },
		{ "QPN 1 (GSI)", 1, 0x777, 0, IBV_MTU_1024, VERBS_QP_INFO_LEN, false, -EPROTO },
		{ "PSN above 24 bits", 0x4242, 0x1000000, 0, IBV_MTU_1024, VERBS_QP_INFO_LEN, false,
		  -EPROTO },
		{ "MTU 9", 0x4242, 0x777, 0, 9, VERBS_QP_INFO_LEN, false, -EPROTO },
		{ "GID of another NIC", 0x4242, 0x777, other, IBV_MTU_1024, VERBS_QP_INFO_LEN,
		  false, -EADDRNOTAVAIL },
		{ "link-local GID", 0x4242, 0x777, 0, IBV_MTU_1024, VERBS_QP_INFO_LEN, true,
		  -EADDRNOTAVAIL },
	};

	fake_ibv_reset();
	memset(&e, 0, sizeof(e));
	cq = verbs_ib.create_cq(&fake.ctx, 128, NULL, NULL, 0);
	e.qpp = p;
	e.psn = 0x99;
	e.qp = verbs_qp_create(&fake.pd, cq, &p);
	EXPECT(e.qp != NULL);
	if (!e.qp) {
		return;
	}
	EXPECT_EQ(verbs_qp_init(e.qp, &p), 0);
	f = fake_qp_of(e.qp);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint8_t b[VERBS_QP_INFO_LEN + 1] = { 0 };

		q = (struct verbs_qp_info){ .qpn = bad[i].qpn,
					    .psn = bad[i].psn,
					    .mtu = bad[i].mtu };
		verbs_gid_of_ipv4(bad[i].gid_ip ? bad[i].gid_ip : ip, q.gid);
		if (bad[i].link_local) {
			memset(q.gid, 0, 16);
			q.gid[0] = 0xfe;
			q.gid[1] = 0x80;
			q.gid[15] = 2;
		}
		/* the codec keeps only 24-bit fields: write the attacker's raw bytes */
		verbs_qp_info_put(&q, b);
		memcpy(h.tp, b, sizeof(b));
		h.tp_len = bad[i].len;
		if (verbs_ep_connect_peer(&e, &h, ip) != bad[i].want) {
			fprintf(stderr, "case %s: not refused as expected\n", bad[i].what);
			EXPECT(false);
		}
		EXPECT_EQ(e.qp->state, IBV_QPS_INIT);
		EXPECT_EQ(f->attr.dest_qp_num, 0);
		EXPECT_EQ(f->attr.rq_psn, 0);
	}
	/* the authentic address of that NIC is taken */
	verbs_gid_of_ipv4(ip, good.gid);
	verbs_qp_info_put(&good, h.tp);
	h.tp_len = VERBS_QP_INFO_LEN;
	EXPECT_EQ(verbs_peer_qp_info(h.tp, h.tp_len, ip, &q), 0);
	EXPECT_EQ(verbs_ep_connect_peer(&e, &h, ip), 0);
	EXPECT_EQ(e.qp->state, IBV_QPS_RTS);
	EXPECT_EQ(f->attr.dest_qp_num, 0x4242);
	EXPECT_EQ(f->attr.rq_psn, 0x777);
	EXPECT(!memcmp(f->attr.ah_attr.grh.dgid.raw, good.gid, 16));
	EXPECT_EQ(good.gid[10], 0xff);
	EXPECT_EQ(good.gid[11], 0xff);
	EXPECT(!memcmp(good.gid + 12, &ip, 4));
	verbs_ib.destroy_qp(e.qp);
	verbs_ib.destroy_cq(cq);
	EXPECT_EQ(fake.nqp_live, 0);
	EXPECT_EQ(fake.ncq_live, 0);
}

/* A lane's endpoint on the fake device, as ep.c builds and closes it, 20 times over: its queue
 * pair (INIT, receives posted), CQ and arena registration, connected towards an authentic peer
 * or failed on a refused one, and closed; nothing of the device is left behind either way. (The
 * whole plugin's dlopen-to-dlclose lifecycle over this lane is not run here: see
 * docs/transports.md.) */
static void test_endpoint_lifecycle(void)
{
	struct vb_dev *d = &verbs_devs[0];
	uint32_t ip = inet_addr("10.0.1.2");
	struct verbs_qp_info q = { .qpn = 0x4242, .psn = 0x777, .mtu = IBV_MTU_1024 };
	struct rh_hello h = { .kind = RH_HELLO_LANE, .nstreams = 1 };

	fake_ibv_reset();
	memset(d, 0, sizeof(*d));
	d->ctx = &fake.ctx;
	d->pd = &fake.pd;
	d->port = 1;
	d->gid_index = 3;
	d->mtu = IBV_MTU_1024;
	d->lfd = -1;
	atomic_store(&d->ok, true);
	verbs_gid_of_ipv4(ip, q.gid);
	verbs_qp_info_put(&q, h.tp);
	h.tp_len = VERBS_QP_INFO_LEN;
	for (int round = 0; round < 20; round++) {
		struct vb_ep *e = verbs_ep_new(VK_LANE, 0);
		bool authentic = round % 2 == 0;

		EXPECT(e != NULL);
		if (!e) {
			return;
		}
		EXPECT_EQ(verbs_ep_qp(e), 0);
		EXPECT_EQ(fake.nqp_live, 1);
		EXPECT_EQ(fake.ncq_live, 1);
		EXPECT_EQ(fake.nmr_live, 1);
		EXPECT_EQ(e->qp->state, IBV_QPS_INIT);
		if (authentic) {
			EXPECT_EQ(verbs_ep_connect_peer(e, &h, ip), 0);
			EXPECT_EQ(e->qp->state, IBV_QPS_RTS);
			verbs_ep_close(e);
		} else {
			EXPECT_EQ(verbs_ep_connect_peer(e, &h, inet_addr("10.0.1.9")),
				  -EADDRNOTAVAIL);
			EXPECT_EQ(e->qp->state, IBV_QPS_INIT);
			verbs_ep_fail(e, -EADDRNOTAVAIL, "refused peer address");
		}
		EXPECT_EQ(e->st, VS_CLOSED);
		EXPECT(e->qp == NULL && e->cq == NULL && e->arena_mr == NULL);
		EXPECT_EQ(fake.nqp_live, 0);
		EXPECT_EQ(fake.ncq_live, 0);
		EXPECT_EQ(fake.nmr_live, 0);
		verbs_ep_free(e);
	}
	atomic_store(&d->ok, false);
	memset(d, 0, sizeof(*d));
}

struct seen {
	int n;
	uint64_t ids[64];
};

static void on_wc(void *arg, const struct ibv_wc *wc)
{
	struct seen *s = arg;

	if (s->n < 64) {
		s->ids[s->n++] = wc->wr_id;
	}
}

static int post_write(struct ibv_qp *qp, uint64_t id, uint32_t imm)
{
	static char buf[64];
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = sizeof(buf), .lkey = 1 };
	struct ibv_send_wr wr, *bad = NULL;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htonl(imm);
	wr.wr.rdma.remote_addr = 0x1000 + id * 64;
	wr.wr.rdma.rkey = 0x55;
	return ibv_post_send(qp, &wr, &bad);
}

static void test_error_completion(void)
{
	struct verbs_qp_params p = params();
	struct verbs_qp_info r = peer();
	struct verbs_poll_fail fail;
	struct seen s = { 0 };
	struct ibv_cq *cq;
	struct ibv_qp *qp, *qp2;
	int nfail, n;
	uint32_t imm;

	fake_ibv_reset();
	cq = verbs_ib.create_cq(&fake.ctx, 128, NULL, NULL, 0);
	qp = verbs_qp_create(&fake.pd, cq, &p);
	/* nothing can be posted before RTS */
	EXPECT_EQ(post_write(qp, 1, 0), EINVAL);
	EXPECT_EQ(verbs_qp_connect(qp, &p, 5, &r), 0);
	EXPECT_EQ(verbs_imm_encode(9, 3, &imm), 0);
	EXPECT_EQ(post_write(qp, 1, imm), 0);
	EXPECT_EQ(fake.log[0].imm, imm);
	EXPECT_EQ(fake.log[0].opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
	n = verbs_cq_drain(cq, 64, on_wc, &s, &fail, &nfail);
	EXPECT_EQ(n, 1);
	EXPECT_EQ(nfail, 0);
	EXPECT_EQ(s.n, 1);
	EXPECT_EQ(s.ids[0], 1);

	/* the peer stops answering: the device exhausts its retries on the next write */
	fake.next_status = IBV_WC_RETRY_EXC_ERR;
	fake.status_left = 1;
	EXPECT_EQ(post_write(qp, 2, imm), 0);
	n = verbs_cq_drain(cq, 64, on_wc, &s, &fail, &nfail);
	EXPECT_EQ(n, 1);
	EXPECT_EQ(nfail, 1);
	EXPECT_EQ(fail.qp_num, qp->qp_num);
	EXPECT_EQ(fail.wr_id, 2);
	EXPECT_EQ(fail.status, IBV_WC_RETRY_EXC_ERR);
	EXPECT_EQ(fail.v.scope, VERBS_FAIL_LANE);
	EXPECT_EQ(fail.v.err, -ETIMEDOUT);
	EXPECT_EQ(qp->state, IBV_QPS_ERR);
	EXPECT_EQ(s.n, 1); /* the failed write is not a delivery */
	/* the queue pair takes nothing more */
	EXPECT_EQ(post_write(qp, 3, imm), EINVAL);

	/* fail-back: a re-created queue pair on the same pair of NICs, connected again */
	qp2 = verbs_qp_create(&fake.pd, cq, &p);
	EXPECT(qp2 && qp2->qp_num != qp->qp_num);
	verbs_ib.destroy_qp(qp);
	EXPECT_EQ(verbs_qp_connect(qp2, &p, 6, &r), 0);
	EXPECT_EQ(post_write(qp2, 4, imm), 0);
	n = verbs_cq_drain(cq, 64, on_wc, &s, &fail, &nfail);
	EXPECT_EQ(n, 1);
	EXPECT_EQ(nfail, 0);
	EXPECT_EQ(s.ids[1], 4);

	/* the receiver's fence: ERROR flushes what is outstanding, every flush reported */
	{
		struct fake_qp *f = fake_qp_of(qp2);

		/* three writes queued at the fake device, not yet completed */
		f->posted_ids[f->nposted++] = 10;
		f->posted_ids[f->nposted++] = 11;
		f->posted_ids[f->nposted++] = 12;
	}
	EXPECT_EQ(verbs_qp_error(qp2), 0);
	EXPECT_EQ(qp2->state, IBV_QPS_ERR);
	n = verbs_cq_drain(cq, 64, on_wc, &s, &fail, &nfail);
	EXPECT_EQ(n, 3);
	EXPECT_EQ(nfail, 3);
	EXPECT_EQ(fail.wr_id, 10);
	EXPECT_EQ(fail.v.err, -ECANCELED);
	/* an empty queue: nothing */
	EXPECT_EQ(verbs_cq_drain(cq, 64, on_wc, &s, &fail, &nfail), 0);
	verbs_ib.destroy_qp(qp2);
	verbs_ib.destroy_cq(cq);
	EXPECT_EQ(fake.nqp_live, 0);
}

static void test_async_events(void)
{
	struct verbs_qp_params p = params();
	struct verbs_async a;
	struct ibv_cq *cq;
	struct ibv_qp *qp;

	fake_ibv_reset();
	cq = verbs_ib.create_cq(&fake.ctx, 16, NULL, NULL, 0);
	qp = verbs_qp_create(&fake.pd, cq, &p);
	EXPECT_EQ(verbs_async_read(&fake.ctx, &a), -EAGAIN);
	fake.events[0] =
		(struct ibv_async_event){ .element.qp = qp, .event_type = IBV_EVENT_QP_FATAL };
	fake.events[1] =
		(struct ibv_async_event){ .element.port_num = 1, .event_type = IBV_EVENT_PORT_ERR };
	fake.events[2] = (struct ibv_async_event){ .element.port_num = 1,
						   .event_type = IBV_EVENT_PORT_ACTIVE };
	fake.nevents = 3;
	EXPECT_EQ(verbs_async_read(&fake.ctx, &a), 0);
	EXPECT_EQ(a.type, IBV_EVENT_QP_FATAL);
	EXPECT_EQ(a.qp_num, qp->qp_num);
	EXPECT_EQ(a.v.scope, VERBS_FAIL_LANE);
	EXPECT_EQ(verbs_async_read(&fake.ctx, &a), 0);
	EXPECT_EQ(a.port, 1);
	EXPECT_EQ(a.v.scope, VERBS_FAIL_NIC);
	EXPECT_EQ(a.v.err, -ENETDOWN);
	EXPECT_EQ(verbs_async_read(&fake.ctx, &a), 0);
	EXPECT_EQ(a.v.scope, VERBS_NIC_UP);
	EXPECT_EQ(verbs_async_read(&fake.ctx, &a), -EAGAIN);
	EXPECT_EQ(fake.nacked, 3); /* every event acknowledged (destroying its QP waits for it) */
	verbs_ib.destroy_qp(qp);
	verbs_ib.destroy_cq(cq);
}

static void test_mr_cache(void)
{
	static char buf[3 * 4096] __attribute__((aligned(4096)));
	struct verbs_mr_cache c = { .pd = NULL };
	uint32_t lk, rk, lk2, rk2;
	struct ibv_mr *mr = NULL;

	fake_ibv_reset();
	c.pd = &fake.pd;
	fake.pd.context = &fake.ctx;
	EXPECT_EQ(verbs_mr_get(&c, buf + 10, 100, &lk, &rk), 0);
	EXPECT_EQ(verbs_mr_get(&c, buf + 200, 1000, &lk2, &rk2), 0); /* same page: cached */
	EXPECT_EQ(fake.nreg, 1);
	EXPECT_EQ(lk, lk2);
	EXPECT_EQ(rk, rk2);
	EXPECT_EQ(verbs_mr_get(&c, buf + 4096, 4096, &lk2, &rk2), 0);
	EXPECT_EQ(fake.nreg, 2);
	EXPECT(lk2 != lk);
	verbs_mr_forget(&c, buf, 1); /* the application deregistered the first page */
	EXPECT_EQ(fake.nmr_live, 1);
	EXPECT_EQ(verbs_mr_get(&c, buf + 10, 100, &lk, &rk), 0);
	EXPECT_EQ(fake.nreg, 3);
	verbs_mr_clear(&c);
	EXPECT_EQ(fake.nmr_live, 0);

	EXPECT_EQ(verbs_mr_dmabuf(&fake.pd, 7, 0, 4096, 0x10000, &mr), 0);
	EXPECT_EQ(fake.ndmabuf, 1);
	if (mr) {
		verbs_ib.dereg_mr(mr);
	}
	EXPECT_EQ(verbs_mr_dmabuf(&fake.pd, -1, 0, 4096, 0x10000, &mr), -EBADF);
	{
		struct verbs_ib_fns nodma = fake_ibv_fns;

		nodma.reg_dmabuf_mr = NULL;
		verbs_ib_use(&nodma);
		EXPECT_EQ(verbs_mr_dmabuf(&fake.pd, 7, 0, 4096, 0x10000, &mr), -EOPNOTSUPP);
		verbs_ib_use(&fake_ibv_fns);
	}
}

static void put_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	EXPECT(f != NULL);
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static void test_gid_index(void)
{
	char root[] = "/tmp/rh_verbs_gidXXXXXX", p[512], cmd[600];
	const char *gids[] = {
		"fe80:0000:0000:0000:5054:00ff:fe12:3401\n", /* link-local, v1 */
		"fe80:0000:0000:0000:5054:00ff:fe12:3401\n", /* link-local, v2 */
		"0000:0000:0000:0000:0000:ffff:0a00:0102\n", /* 10.0.1.2, v1 */
		"0000:0000:0000:0000:0000:ffff:0a00:0102\n", /* 10.0.1.2, v2 */
	};
	const char *types[] = { "IB/RoCE v1\n", "RoCE v2\n", "IB/RoCE v1\n", "RoCE v2\n" };
	uint32_t ip;

	EXPECT(mkdtemp(root) != NULL);
	snprintf(p, sizeof(p), "%s/sys/class/infiniband/rxe0/ports/1/gids", root);
	snprintf(cmd, sizeof(cmd),
		 "mkdir -p %s %s/sys/class/infiniband/rxe0/ports/1/gid_attrs/types", p, root);
	EXPECT_EQ(system(cmd), 0);
	for (int i = 0; i < 4; i++) {
		snprintf(p, sizeof(p), "%s/sys/class/infiniband/rxe0/ports/1/gids/%d", root, i);
		put_file(p, gids[i]);
		snprintf(p, sizeof(p), "%s/sys/class/infiniband/rxe0/ports/1/gid_attrs/types/%d",
			 root, i);
		put_file(p, types[i]);
	}
	inet_pton(AF_INET, "10.0.1.2", &ip);
	EXPECT_EQ(verbs_gid_index(root, "rxe0", 1, ip), 3);
	inet_pton(AF_INET, "10.0.1.3", &ip);
	EXPECT_EQ(verbs_gid_index(root, "rxe0", 1, ip), -ENOENT);
	EXPECT_EQ(verbs_gid_index(root, "rxe9", 1, ip), -ENOENT);
	/* only a v1 GID for the address: not usable for RoCE v2 */
	snprintf(p, sizeof(p), "%s/sys/class/infiniband/rxe0/ports/1/gid_attrs/types/3", root);
	put_file(p, "IB/RoCE v1\n");
	inet_pton(AF_INET, "10.0.1.2", &ip);
	EXPECT_EQ(verbs_gid_index(root, "rxe0", 1, ip), -ENOENT);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	EXPECT_EQ(system(cmd), 0);
}

/* The RDMA device behind an interface: Soft-RoCE's port lists it in gid_attrs/ndevs, a PCI
 * device sits under the interface's device/infiniband; every NIC must have one for auto. */
static void test_netdev_ibdev(void)
{
	char root[] = "/tmp/rh_verbs_ndevXXXXXX", p[512], cmd[1200], dev[64], why[256];
	const char *both[] = { "eth1", "eth2" }, *three[] = { "eth1", "eth2", "eth3" };
	int port = 0;

	EXPECT(mkdtemp(root) != NULL);
	snprintf(cmd, sizeof(cmd),
		 "mkdir -p %s/sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs "
		 "%s/sys/class/infiniband/mlx5_1/ports/1/gid_attrs/ndevs "
		 "%s/sys/class/net/eth2/device/infiniband/mlx5_0 %s/sys/class/net/eth3",
		 root, root, root, root);
	EXPECT_EQ(system(cmd), 0);
	snprintf(p, sizeof(p), "%s/sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/0", root);
	put_file(p, "eth10\n"); /* a prefix of nothing asked for: never matches eth1 */
	snprintf(p, sizeof(p), "%s/sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/3", root);
	put_file(p, "eth1\n");
	EXPECT_EQ(verbs_netdev_ibdev(root, "eth1", dev, sizeof(dev), &port), 0);
	EXPECT(strcmp(dev, "rxe0") == 0);
	EXPECT_EQ(port, 1);
	port = 0;
	EXPECT_EQ(verbs_netdev_ibdev(root, "eth2", dev, sizeof(dev), &port), 0);
	EXPECT(strcmp(dev, "mlx5_0") == 0);
	EXPECT_EQ(port, 1);
	EXPECT_EQ(verbs_netdev_ibdev(root, "eth3", dev, sizeof(dev), &port), -ENOENT);
	EXPECT_EQ(verbs_netdev_ibdev(root, "eth1", dev, 4, &port), -ENAMETOOLONG);
	EXPECT_EQ(verbs_netdev_ibdev(root, "../x", dev, sizeof(dev), &port), -EINVAL);
	EXPECT(verbs_netdevs_rdma(root, both, 2, why, sizeof(why)));
	EXPECT(strcmp(why, "eth1=rxe0:1 eth2=mlx5_0:1") == 0);
	EXPECT(!verbs_netdevs_rdma(root, three, 3, why, sizeof(why)));
	EXPECT(strcmp(why, "eth3 is not an RDMA device") == 0);
	EXPECT(!verbs_netdevs_rdma(root, three, 0, why, sizeof(why)));
	/* no RDMA devices at all (the netns fabric): auto must not take verbs */
	snprintf(cmd, sizeof(cmd), "rm -rf %s/sys/class/infiniband %s/sys/class/net/eth2/device",
		 root, root);
	EXPECT_EQ(system(cmd), 0);
	EXPECT(!verbs_netdevs_rdma(root, both, 2, why, sizeof(why)));
	EXPECT(strcmp(why, "eth1 is not an RDMA device") == 0);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	EXPECT_EQ(system(cmd), 0);
}

int main(void)
{
	test_params();
	test_real_library();
	fake_ibv_reset();
	test_shim();
	test_connect();
	test_connect_in_two_halves();
	test_peer_address();
	test_endpoint_lifecycle();
	test_error_completion();
	test_async_events();
	test_mr_cache();
	test_gid_index();
	test_netdev_ibdev();
	verbs_ib_use(NULL);
	TEST_DONE();
}
