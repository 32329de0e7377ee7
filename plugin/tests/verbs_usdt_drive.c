/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Drives the verbs lane's completion and async-event verdicts (lanes/verbs/poll.c) on the fake
 * libibverbs device (fake_ibv.c) so the completion probes (probes.h: verbs_wc, verbs_wc_err,
 * verbs_async) fire with known values; tests/privileged/test_verbs_usdt.py traces it with the
 * agent's source. Also a ctest (plugin_verbs_usdt_drive): it checks poll.c's verdicts itself.
 *
 *   verbs_usdt_drive [--hold] NIC NOK NERR STATUS
 *
 * NOK successful writes on one queue pair (write i reports byte_len 1000 + i, is posted 2 ms
 * or more before it is polled), then NERR queue pairs that each fail one write with STATUS
 * (enum ibv_wc_status) and flush one more write queued behind it, then two async events: a
 * QP_FATAL of the first failed queue pair and a PORT_ERR of port 1. Every drain and read names
 * NIC as the plugin's NIC index. Prints one line: "pid P qpn Q nic N ok K err_qpns A,B,...".
 * --hold: then waits (at most 60 s) until stdin closes, so a tracer can read /proc/<pid>.
 * Exit 0 when every verdict was as expected, 1 otherwise, 2 on bad arguments.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/lanes/verbs/verbs.h"
#include "fake_ibv.h"

#define MAX_WR 64
#define MAX_ERR 16
#define POST_GAP_NS 2000000u /* each write's completion is polled at least this long after */

static int failed;

#define CHECK(c)                                                                              \
	do {                                                                                  \
		if (!(c)) {                                                                   \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
			failed = 1;                                                           \
		}                                                                             \
	} while (0)

static uint64_t post_time[MAX_WR]; /* by wr_id */
static uint32_t post_len[MAX_WR];
static int (*fake_poll)(struct ibv_cq *cq, int num, struct ibv_wc *wc);

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The fake's completions with the byte count a device reports (the write's length). */
static int poll_with_len(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
	int n = fake_poll(cq, num, wc);

	for (int i = 0; i < n; i++) {
		if (wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id < MAX_WR) {
			wc[i].byte_len = post_len[wc[i].wr_id];
		}
	}
	return n;
}

/* The lane's post-time hook (struct verbs_cq_trace) */
static uint64_t posted_at(void *arg, const struct ibv_wc *wc)
{
	(void)arg;
	return wc->wr_id < MAX_WR ? post_time[wc->wr_id] : 0;
}

static void on_wc(void *arg, const struct ibv_wc *wc)
{
	(*(int *)arg)++;
	(void)wc;
}

static int post_write(struct ibv_qp *qp, uint64_t id, uint32_t len)
{
	static char buf[4096];
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = 1 };
	struct ibv_send_wr wr, *bad = NULL;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = 0x1000;
	wr.wr.rdma.rkey = 0x55;
	post_len[id] = len;
	post_time[id] = mono_ns();
	return ibv_post_send(qp, &wr, &bad);
}

static void wait_ns(uint64_t ns)
{
	uint64_t until = mono_ns() + ns;

	while (mono_ns() < until) {
		struct timespec ts = { 0, 200000 };

		nanosleep(&ts, NULL);
	}
}

static struct ibv_qp *connected_qp(struct ibv_cq *cq)
{
	struct verbs_qp_params p;
	struct verbs_qp_info r = { .qpn = 0x4242, .psn = 0x777, .mtu = IBV_MTU_1024 };
	struct ibv_qp *qp;

	verbs_qp_params_init(&p, 1, 3, IBV_MTU_4096, 64);
	qp = verbs_qp_create(&fake.pd, cq, &p);
	CHECK(qp != NULL);
	if (qp) {
		CHECK(verbs_qp_connect(qp, &p, 5, &r) == 0);
	}
	return qp;
}

int main(int argc, char **argv)
{
	struct verbs_poll_fail fail;
	struct verbs_async a;
	struct ibv_qp *qp, *eqp[MAX_ERR] = { 0 };
	struct ibv_cq *cq;
	int hold = 0, nic, nok, nerr, status, nfail, ndone = 0, n;
	uint64_t id = 0;
	struct verbs_cq_trace tr;

	if (argc > 1 && !strcmp(argv[1], "--hold")) {
		hold = 1;
		argv++;
		argc--;
	}
	if (argc != 5) {
		fprintf(stderr, "usage: verbs_usdt_drive [--hold] NIC NOK NERR STATUS\n");
		return 2;
	}
	nic = atoi(argv[1]);
	nok = atoi(argv[2]);
	nerr = atoi(argv[3]);
	status = atoi(argv[4]);
	if (nok < 0 || nok > MAX_WR / 2 || nerr < 0 || nerr > MAX_ERR || status <= IBV_WC_SUCCESS ||
	    status == IBV_WC_WR_FLUSH_ERR) {
		fprintf(stderr,
			"verbs_usdt_drive: NOK 0..%d, NERR 0..%d, STATUS an error other "
			"than a flush\n",
			MAX_WR / 2, MAX_ERR);
		return 2;
	}
	verbs_ib_use(&fake_ibv_fns);
	fake_ibv_reset();
	fake_poll = fake.ctx.ops.poll_cq;
	fake.ctx.ops.poll_cq = poll_with_len;
	tr = (struct verbs_cq_trace){ .nic = nic, .post_ns = posted_at, .arg = NULL };
	cq = verbs_ib.create_cq(&fake.ctx, 128, NULL, NULL, 0);
	qp = connected_qp(cq);
	if (!cq || !qp) {
		return 1;
	}

	/* successful writes: each polled after POST_GAP_NS, so its age is at least that */
	for (int i = 0; i < nok; i++) {
		CHECK(post_write(qp, ++id, 1000 + (uint32_t)i) == 0);
		wait_ns(POST_GAP_NS);
		n = verbs_cq_drain_traced(cq, 64, on_wc, &ndone, &fail, &nfail, &tr);
		CHECK(n == 1 && nfail == 0);
	}
	CHECK(ndone == nok);

	/* queue pairs whose write fails with STATUS; a second write queued behind it flushes */
	for (int i = 0; i < nerr; i++) {
		struct fake_qp *f;

		eqp[i] = connected_qp(cq);
		if (!eqp[i]) {
			return 1;
		}
		f = fake_qp_of(eqp[i]);
		fake.next_status = (enum ibv_wc_status)status;
		fake.status_left = 1;
		f->posted_ids[f->nposted++] = ++id; /* the write behind it, not completed yet */
		post_time[id] = mono_ns();
		CHECK(post_write(eqp[i], ++id, 512) == 0);
		n = verbs_cq_drain_traced(cq, 64, on_wc, &ndone, &fail, &nfail, &tr);
		CHECK(n == 2 && nfail == 2);
		CHECK(fail.status == status && fail.qp_num == eqp[i]->qp_num);
		CHECK(fail.v.scope != VERBS_OK);
		CHECK(eqp[i]->state == IBV_QPS_ERR);
	}
	CHECK(ndone == nok);

	/* async events of the device */
	n = 0;
	if (nerr > 0) {
		fake.events[n++] = (struct ibv_async_event){ .element.qp = eqp[0],
							     .event_type = IBV_EVENT_QP_FATAL };
	}
	fake.events[n++] =
		(struct ibv_async_event){ .element.port_num = 1, .event_type = IBV_EVENT_PORT_ERR };
	fake.nevents = n;
	for (int i = 0; i < n; i++) {
		CHECK(verbs_async_read_nic(&fake.ctx, nic, &a) == 0);
	}
	CHECK(a.type == IBV_EVENT_PORT_ERR && a.port == 1 && a.v.scope == VERBS_FAIL_NIC);
	CHECK(verbs_async_read_nic(&fake.ctx, nic, &a) == -EAGAIN);

	printf("pid %d qpn %u nic %d ok %d err_qpns ", (int)getpid(), qp->qp_num, nic, nok);
	for (int i = 0; i < nerr; i++) {
		printf("%s%u", i ? "," : "", eqp[i]->qp_num);
	}
	printf("\n");
	fflush(stdout);
	for (int i = 0; i < nerr; i++) {
		verbs_ib.destroy_qp(eqp[i]);
	}
	verbs_ib.destroy_qp(qp);
	verbs_ib.destroy_cq(cq);
	if (hold) {
		struct pollfd pfd = { .fd = 0, .events = POLLIN };
		char b[64];

		/* until stdin closes (EOF), at most 60 s */
		while (poll(&pfd, 1, 60000) == 1 && read(0, b, sizeof(b)) > 0) {
		}
	}
	return failed;
}
