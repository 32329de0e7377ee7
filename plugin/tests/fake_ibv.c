/* SPDX-License-Identifier: Apache-2.0 */
/* The fake libibverbs device (fake_ibv.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fake_ibv.h"

struct fake_ibv fake;

struct fake_cq {
	struct ibv_cq cq;
	struct ibv_wc ring[FAKE_CQ_DEPTH];
	int head, n;
};

static void cq_push(struct ibv_cq *cq, const struct ibv_wc *wc)
{
	struct fake_cq *c = (struct fake_cq *)cq;

	if (c->n < FAKE_CQ_DEPTH) {
		c->ring[(c->head + c->n++) % FAKE_CQ_DEPTH] = *wc;
	}
}

static int f_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
	struct fake_cq *c = (struct fake_cq *)cq;
	int n = 0;

	while (n < num && c->n > 0) {
		wc[n++] = c->ring[c->head];
		c->head = (c->head + 1) % FAKE_CQ_DEPTH;
		c->n--;
	}
	return n;
}

static void complete(struct fake_qp *q, uint64_t wr_id, enum ibv_wc_status st)
{
	struct ibv_wc wc;

	memset(&wc, 0, sizeof(wc));
	wc.wr_id = wr_id;
	wc.status = st;
	wc.qp_num = q->qp.qp_num;
	wc.opcode = IBV_WC_RDMA_WRITE;
	cq_push(q->qp.send_cq, &wc);
}

static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct fake_qp *q = fake_qp_of(qp);

	for (; wr; wr = wr->next) {
		if (qp->state != IBV_QPS_RTS || q->nposted >= FAKE_WR_LOG) {
			*bad = wr;
			return EINVAL;
		}
		if (fake.nlog < FAKE_WR_LOG) {
			struct fake_wr_log *l = &fake.log[fake.nlog++];

			l->qp_num = qp->qp_num;
			l->opcode = wr->opcode;
			l->imm = ntohl(wr->imm_data);
			l->remote_addr = wr->wr.rdma.remote_addr;
			l->rkey = wr->wr.rdma.rkey;
			l->len = wr->num_sge ? wr->sg_list[0].length : 0;
		}
		q->posted_ids[q->nposted++] = wr->wr_id;
	}
	/* the fake wire: complete what is posted, in order, with the status asked for; an error
	 * completion moves the queue pair to ERROR and flushes the rest (as a device does) */
	for (int i = 0; i < q->nposted; i++) {
		enum ibv_wc_status st = IBV_WC_SUCCESS;

		if (qp->state == IBV_QPS_ERR) {
			st = IBV_WC_WR_FLUSH_ERR;
		} else if (fake.status_left > 0) {
			st = fake.next_status;
			fake.status_left--;
		}
		complete(q, q->posted_ids[i], st);
		if (st != IBV_WC_SUCCESS) {
			qp->state = IBV_QPS_ERR;
		}
	}
	q->nposted = 0;
	return 0;
}

static int f_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	if (qp->state == IBV_QPS_RESET) {
		*bad = wr;
		return EINVAL;
	}
	return 0;
}

static struct ibv_device **f_get_device_list(int *num)
{
	struct ibv_device **l = calloc(2, sizeof(*l));

	if (l) {
		l[0] = &fake.dev;
	}
	*num = l ? 1 : 0;
	return l;
}

static void f_free_device_list(struct ibv_device **list)
{
	free(list);
}

static const char *f_get_device_name(struct ibv_device *dev)
{
	(void)dev;
	return "fake_rxe0";
}

static struct ibv_context *f_open_device(struct ibv_device *dev)
{
	fake.ctx.device = dev;
	return &fake.ctx;
}

static int f_close_device(struct ibv_context *ctx)
{
	(void)ctx;
	return 0;
}

static struct ibv_pd *f_alloc_pd(struct ibv_context *ctx)
{
	fake.pd.context = ctx;
	return &fake.pd;
}

static int f_dealloc_pd(struct ibv_pd *pd)
{
	(void)pd;
	return 0;
}

static struct ibv_mr *f_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	struct ibv_mr *mr;

	if (!(access & IBV_ACCESS_LOCAL_WRITE) && (access & IBV_ACCESS_REMOTE_WRITE)) {
		errno = EINVAL; /* the verbs rule: remote write needs local write */
		return NULL;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr) {
		return NULL;
	}
	mr->pd = pd;
	mr->context = pd->context;
	mr->addr = addr;
	mr->length = len;
	mr->lkey = ++fake.next_key;
	mr->rkey = 0x10000 + fake.next_key;
	fake.nmr_live++;
	fake.nreg++;
	return mr;
}

static struct ibv_mr *f_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
				      int fd, int access)
{
	struct ibv_mr *mr;

	if (fd < 0) {
		errno = EBADF;
		return NULL;
	}
	mr = f_reg_mr(pd, (void *)(uintptr_t)iova, len, access);
	(void)offset;
	if (mr) {
		fake.ndmabuf++;
	}
	return mr;
}

static int f_dereg_mr(struct ibv_mr *mr)
{
	free(mr);
	fake.nmr_live--;
	return 0;
}

static struct ibv_cq *f_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
				  struct ibv_comp_channel *ch, int vec)
{
	struct fake_cq *c = calloc(1, sizeof(*c));

	(void)ch;
	(void)vec;
	if (!c) {
		return NULL;
	}
	c->cq.context = ctx;
	c->cq.cqe = cqe;
	c->cq.cq_context = cq_context;
	fake.ncq_live++;
	return &c->cq;
}

static int f_destroy_cq(struct ibv_cq *cq)
{
	free(cq);
	fake.ncq_live--;
	return 0;
}

static struct ibv_qp *f_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
	struct fake_qp *q;

	if (ia->qp_type != IBV_QPT_RC || !ia->send_cq || !ia->recv_cq || !ia->cap.max_send_wr) {
		errno = EINVAL;
		return NULL;
	}
	q = calloc(1, sizeof(*q));
	if (!q) {
		return NULL;
	}
	q->qp.context = pd->context;
	q->qp.pd = pd;
	q->qp.send_cq = ia->send_cq;
	q->qp.recv_cq = ia->recv_cq;
	q->qp.qp_type = ia->qp_type;
	q->qp.qp_num = ++fake.next_qpn;
	q->qp.state = IBV_QPS_RESET;
	fake.nqp_live++;
	return &q->qp;
}

static int f_destroy_qp(struct ibv_qp *qp)
{
	free(fake_qp_of(qp));
	fake.nqp_live--;
	return 0;
}

/* The masks the kernel requires per transition (ib_modify_qp_is_ok, RC) */
static bool transition_ok(enum ibv_qp_state from, enum ibv_qp_state to, int mask)
{
	int need;

	if (to == IBV_QPS_ERR || to == IBV_QPS_RESET) {
		return mask == IBV_QP_STATE;
	}
	if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
		need = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	} else if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
		need = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	} else if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
		need = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	} else {
		return false;
	}
	return (mask & need) == need;
}

static int f_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	struct fake_qp *q = fake_qp_of(qp);

	if (!(mask & IBV_QP_STATE) || !transition_ok(qp->state, a->qp_state, mask)) {
		return EINVAL;
	}
	if (fake.fail_to && a->qp_state == fake.fail_to) {
		return EINVAL;
	}
	if (a->qp_state == IBV_QPS_RTR &&
	    (!a->ah_attr.is_global || a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096)) {
		return EINVAL; /* RoCE needs the GRH */
	}
	if (a->qp_state == IBV_QPS_ERR) {
		for (int i = 0; i < q->nposted; i++) {
			complete(q, q->posted_ids[i], IBV_WC_WR_FLUSH_ERR);
		}
		q->nposted = 0;
	}
	if (mask & IBV_QP_PORT) {
		q->attr.port_num = a->port_num;
	}
	if (mask & IBV_QP_ACCESS_FLAGS) {
		q->attr.qp_access_flags = a->qp_access_flags;
	}
	if (mask & IBV_QP_AV) {
		q->attr.ah_attr = a->ah_attr;
	}
	if (mask & IBV_QP_PATH_MTU) {
		q->attr.path_mtu = a->path_mtu;
	}
	if (mask & IBV_QP_DEST_QPN) {
		q->attr.dest_qp_num = a->dest_qp_num;
	}
	if (mask & IBV_QP_RQ_PSN) {
		q->attr.rq_psn = a->rq_psn;
	}
	if (mask & IBV_QP_SQ_PSN) {
		q->attr.sq_psn = a->sq_psn;
	}
	if (mask & IBV_QP_TIMEOUT) {
		q->attr.timeout = a->timeout;
	}
	if (mask & IBV_QP_RETRY_CNT) {
		q->attr.retry_cnt = a->retry_cnt;
	}
	if (mask & IBV_QP_RNR_RETRY) {
		q->attr.rnr_retry = a->rnr_retry;
	}
	qp->state = a->qp_state;
	return 0;
}

static int f_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	(void)ctx;
	if (port != 1) {
		return EINVAL;
	}
	memset(attr, 0, sizeof(*attr));
	attr->state = IBV_PORT_ACTIVE;
	attr->active_mtu = IBV_MTU_1024;
	attr->link_layer = IBV_LINK_LAYER_ETHERNET;
	return 0;
}

static int f_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	(void)ctx;
	(void)port;
	memset(gid, 0, sizeof(*gid));
	gid->raw[10] = gid->raw[11] = 0xff;
	gid->raw[12] = 10;
	gid->raw[15] = (uint8_t)index;
	return 0;
}

static int f_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	(void)ctx;
	if (fake.nevents == 0) {
		errno = EAGAIN; /* a non-blocking async_fd with nothing pending */
		return -1;
	}
	*ev = fake.events[0];
	memmove(fake.events, fake.events + 1, sizeof(fake.events[0]) * (size_t)--fake.nevents);
	return 0;
}

static void f_ack_async_event(struct ibv_async_event *ev)
{
	(void)ev;
	fake.nacked++;
}

static const char *f_wc_status_str(enum ibv_wc_status st)
{
	return st == IBV_WC_SUCCESS ? "success" : "error";
}

const struct verbs_ib_fns fake_ibv_fns = {
	.get_device_list = f_get_device_list,
	.free_device_list = f_free_device_list,
	.get_device_name = f_get_device_name,
	.open_device = f_open_device,
	.close_device = f_close_device,
	.alloc_pd = f_alloc_pd,
	.dealloc_pd = f_dealloc_pd,
	.reg_mr = f_reg_mr,
	.reg_dmabuf_mr = f_reg_dmabuf_mr,
	.dereg_mr = f_dereg_mr,
	.create_cq = f_create_cq,
	.destroy_cq = f_destroy_cq,
	.create_qp = f_create_qp,
	.destroy_qp = f_destroy_qp,
	.modify_qp = f_modify_qp,
	.query_port = f_query_port,
	.query_gid = f_query_gid,
	.get_async_event = f_get_async_event,
	.ack_async_event = f_ack_async_event,
	.wc_status_str = f_wc_status_str,
};

void fake_ibv_reset(void)
{
	memset(&fake, 0, sizeof(fake));
	fake.ctx.ops.poll_cq = f_poll_cq;
	fake.ctx.ops.post_send = f_post_send;
	fake.ctx.ops.post_recv = f_post_recv;
	fake.next_status = IBV_WC_SUCCESS;
	fake.pd.context = &fake.ctx;
}
