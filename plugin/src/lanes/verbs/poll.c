/* SPDX-License-Identifier: Apache-2.0 */
/* Completion queues (verbs.h): successful completions to the data path, errors to a verdict. */
#include <errno.h>

#include "verbs.h"

#define VERBS_POLL_BATCH 16

int verbs_cq_drain(struct ibv_cq *cq, int max, verbs_wc_fn fn, void *arg,
		   struct verbs_poll_fail *fail, int *nfail)
{
	struct ibv_wc wc[VERBS_POLL_BATCH];
	int total = 0;

	*nfail = 0;
	while (total < max) {
		int want = max - total < VERBS_POLL_BATCH ? max - total : VERBS_POLL_BATCH;
		int n = ibv_poll_cq(cq, want, wc);

		if (n < 0) {
			return -EIO;
		}
		for (int i = 0; i < n; i++) {
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
	verbs_ib.ack_async_event(&ev);
	return 0;
}
