/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Queue pairs (verbs.h): one RC queue pair per stream, moved through the states the verbs
 * specification requires (RESET -> INIT -> RTR -> RTS), each step with the attribute mask the
 * kernel checks for it.
 */
#include <errno.h>
#include <string.h>

#include "../../log.h"
#include "../../param.h"
#include "verbs.h"

void verbs_qp_params_init(struct verbs_qp_params *p, uint8_t port, int gid_index, enum ibv_mtu mtu,
			  uint32_t depth)
{
	memset(p, 0, sizeof(*p));
	p->port = port;
	p->gid_index = gid_index;
	p->mtu = mtu;
	p->timeout = (uint8_t)rh_param.IB_TIMEOUT;
	p->retry_cnt = (uint8_t)rh_param.IB_RETRY_CNT;
	p->rnr_retry = 7;
	p->max_send_wr = depth;
	p->max_recv_wr = depth;
}

struct ibv_qp *verbs_qp_create(struct ibv_pd *pd, struct ibv_cq *cq,
			       const struct verbs_qp_params *p)
{
	struct ibv_qp_init_attr ia;
	struct ibv_qp *qp;

	memset(&ia, 0, sizeof(ia));
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = p->max_send_wr;
	ia.cap.max_recv_wr = p->max_recv_wr;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	qp = verbs_ib.create_qp(pd, &ia);
	if (!qp) {
		int e = errno ? errno : ENOMEM;

		WARN("verbs: create_qp: %s", strerror(e));
		errno = e;
	}
	return qp;
}

static int qp_init(struct ibv_qp *qp, const struct verbs_qp_params *p)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = p->port;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	return verbs_ib.modify_qp(
		qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int qp_rtr(struct ibv_qp *qp, const struct verbs_qp_params *p, const struct verbs_qp_info *r)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = p->mtu < (enum ibv_mtu)r->mtu ? p->mtu : (enum ibv_mtu)r->mtu;
	a.dest_qp_num = r->qpn;
	a.rq_psn = r->psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12; /* 0.64 ms */
	a.ah_attr.is_global = 1; /* RoCE: every packet carries the GRH (routable, v2) */
	memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
	a.ah_attr.grh.sgid_index = (uint8_t)p->gid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = p->port;
	return verbs_ib.modify_qp(qp, &a,
				  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					  IBV_QP_MIN_RNR_TIMER);
}

static int qp_rts(struct ibv_qp *qp, const struct verbs_qp_params *p, uint32_t psn)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = p->timeout;
	a.retry_cnt = p->retry_cnt;
	a.rnr_retry = p->rnr_retry;
	a.sq_psn = psn;
	a.max_rd_atomic = 1;
	return verbs_ib.modify_qp(qp, &a,
				  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					  IBV_QP_MAX_QP_RD_ATOMIC);
}

/* ibv_modify_qp returns an errno value (positive) or -1 with errno set, depending on the
 * provider and the library version. */
static int qp_err(int rc)
{
	if (rc > 0) {
		return -rc;
	}
	return errno ? -errno : -EIO;
}

int verbs_qp_init(struct ibv_qp *qp, const struct verbs_qp_params *p)
{
	int rc = qp_init(qp, p);

	if (rc) {
		rc = qp_err(rc);
		WARN("verbs: queue pair %u: RESET->INIT: %s", qp->qp_num, strerror(-rc));
	}
	return rc;
}

int verbs_qp_ready(struct ibv_qp *qp, const struct verbs_qp_params *p, uint32_t local_psn,
		   const struct verbs_qp_info *remote)
{
	const char *step;
	int rc;

	step = "INIT->RTR";
	rc = qp_rtr(qp, p, remote);
	if (rc) {
		goto fail;
	}
	step = "RTR->RTS";
	rc = qp_rts(qp, p, local_psn);
	if (rc) {
		goto fail;
	}
	return 0;
fail:
	rc = qp_err(rc);
	WARN("verbs: queue pair %u: %s: %s", qp->qp_num, step, strerror(-rc));
	return rc;
}

int verbs_qp_connect(struct ibv_qp *qp, const struct verbs_qp_params *p, uint32_t local_psn,
		     const struct verbs_qp_info *remote)
{
	int rc = verbs_qp_init(qp, p);

	return rc ? rc : verbs_qp_ready(qp, p, local_psn, remote);
}

int verbs_qp_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	rc = verbs_ib.modify_qp(qp, &a, IBV_QP_STATE);
	return rc ? qp_err(rc) : 0;
}
