/* SPDX-License-Identifier: Apache-2.0 */
/* Completion queues (verbs.h): successful completions to the data path, errors to a verdict;
 * every completion and async event traced (probes.h: verbs_wc, verbs_wc_err, verbs_async). */
#include <errno.h>
#include <time.h>

#include "../../probes.h"
#include "verbs.h"

#define VERBS_POLL_BATCH 16

/* The time since wc's work request was posted, 0 when the lane gave no post time. */
static uint64_t wc_age_ns(const struct verbs_cq_trace *tr, const struct ibv_wc *wc, uint64_t now)
{
	uint64_t t0;

	if (!tr || !tr->post_ns) {
		return 0;
	}
	t0 = tr->post_ns(tr->arg, wc);
	return t0 && t0 <= now ? now - t0 : 0;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void wc_trace(const struct verbs_cq_trace *tr, const struct ibv_wc *wc, uint64_t now)
{
	int nic = tr ? tr->nic : -1;
	uint32_t bytes = wc->status == IBV_WC_SUCCESS ? wc->byte_len : 0;

	RH_PROBE5(verbs_wc, wc->qp_num, nic, (int)wc->status, bytes, wc_age_ns(tr, wc, now));
	if (wc->status != IBV_WC_SUCCESS) {
		RH_PROBE4(verbs_wc_err, wc->qp_num, nic, (int)wc->status, wc->vendor_err);
	}
}

int verbs_cq_drain(struct ibv_cq *cq, int max, verbs_wc_fn fn, void *arg,
		   struct verbs_poll_fail *fail, int *nfail)
{
	return verbs_cq_drain_traced(cq, max, fn, arg, fail, nfail, NULL);
}

int verbs_cq_drain_traced(struct ibv_cq *cq, int max, verbs_wc_fn fn, void *arg,
			  struct verbs_poll_fail *fail, int *nfail, const struct verbs_cq_trace *tr)
{
	struct ibv_wc wc[VERBS_POLL_BATCH];
	int total = 0;

	*nfail = 0;
	while (total < max) {
		int want = max - total < VERBS_POLL_BATCH ? max - total : VERBS_POLL_BATCH;
		int n = ibv_poll_cq(cq, want, wc);
		/* one clock read per batch, and only when the lane keeps post times */
		uint64_t now = n > 0 && tr && tr->post_ns ? mono_ns() : 0;

		if (n < 0) {
			return -EIO;
		}
		for (int i = 0; i < n; i++) {
			wc_trace(tr, &wc[i], now);
			if (wc[i].status == IBV_WC_SUCCESS) {
				fn(arg, &wc[i]);
				continue;
			}
			if ((*nfail)++ == 0) {
				fail->qp_num = wc[i].qp_num;
				fail->wr_id = wc[i].wr_id;
				fail->status = wc[i].status;
				fail->v = verbs_wc_verdict(wc[i].status);
			}
		}
		total += n;
		if (n < want) {
			break;
		}
	}
	return total;
}

int verbs_async_read(struct ibv_context *ctx, struct verbs_async *out)
{
	return verbs_async_read_nic(ctx, -1, out);
}

int verbs_async_read_nic(struct ibv_context *ctx, int nic, struct verbs_async *out)
{
	struct ibv_async_event ev;

	if (verbs_ib.get_async_event(ctx, &ev)) {
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == 0 ? -EAGAIN : -errno;
	}
	out->type = ev.event_type;
	out->qp_num = 0;
	out->port = 0;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->qp_num = ev.element.qp ? ev.element.qp->qp_num : 0;
		break;
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_GID_CHANGE:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
		out->port = ev.element.port_num;
		break;
	default:
		break;
	}
	out->v = verbs_async_verdict(ev.event_type);
	RH_PROBE4(verbs_async, nic, out->type, out->qp_num, out->port);
	verbs_ib.ack_async_event(&ev);
	return 0;
}
