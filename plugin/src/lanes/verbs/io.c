/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verbs lanes, I/O (lane.h): the one I/O thread owns every endpoint, queue pair and completion
 * queue. Each pass: fenced lanes' queue pairs go first (rule 1), then the listeners, the
 * devices' asynchronous events, every completion queue, the handshakes, and the pump (control
 * frames from the core, adverts, writes). Idle, the thread sleeps in epoll until a listener,
 * a device's asynchronous event, a completion channel (every CQ of a NIC reports there once
 * armed) or a kick wakes it, or 20 ms pass (handshake deadlines).
 */

#include "lane.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>

pthread_t verbs_io_thread;
atomic_bool verbs_io_stop;
int verbs_epfd = -1, verbs_evfd = -1;
atomic_bool verbs_kicked;
pthread_mutex_t verbs_pend_mu = PTHREAD_MUTEX_INITIALIZER;
struct vb_ep *verbs_pending;
struct vb_ep *verbs_eps;

void verbs_io_kick(void)
{
	uint64_t one = 1;

	if (!atomic_exchange(&verbs_kicked, true)) {
		if (write(verbs_evfd, &one, sizeof(one)) < 0) {
			atomic_store(&verbs_kicked, false);
		}
	}
}

void verbs_io_watch(int fd, void *ptr, uint64_t tag)
{
	struct epoll_event ev = { .events = EPOLLIN };

	if (ptr) {
		ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
		ev.data.ptr = ptr;
	} else {
		ev.data.u64 = tag;
	}
	epoll_ctl(verbs_epfd, EPOLL_CTL_ADD, fd, &ev);
}

static void on_core(struct vb_ep *e, const uint8_t *b, size_t len)
{
	size_t o = 0;

	while (o + RH_HDR_LEN <= len) {
		struct rh_hdr h;

		if (rh_hdr_get(b + o, &h) < 0 || h.len > len - o - RH_HDR_LEN ||
		    h.type == RH_F_DATA) {
			verbs_ep_fail(e, -EPROTO, "malformed control frame");
			return;
		}
		rh_core_rx_ctrl(e->lane, &h, b + o + RH_HDR_LEN);
		o += RH_HDR_LEN + h.len;
	}
}

static void on_msg(struct vb_ep *e, const uint8_t *b, size_t len)
{
	enum ofi_mkind kind;
	uint32_t blen;

	if (ofi_mhdr_get(b, len, &kind, &blen) < 0) {
		verbs_ep_fail(e, -EPROTO, "malformed message");
		return;
	}
	b += OFI_MHDR_LEN;
	if (e->st != VS_READY || atomic_load(&e->fenced)) {
		return;
	}
	verbs_ep_touch(e, blen);
	switch (kind) {
	case OFI_M_CORE:
		on_core(e, b, blen);
		break;
	case OFI_M_ADV_REQ:
		verbs_on_adv_req(e, b, blen);
		break;
	case OFI_M_ADV:
		verbs_on_adv(e, b, blen);
		break;
	case OFI_M_EPOCH:
		if (blen >= 4) {
			uint32_t m = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
				     (uint32_t)b[3] << 24;

			if (m > e->mark_seen) {
				e->mark_seen = m;
			}
		}
		break;
	case OFI_M_DATA0:
		verbs_on_data0(e, b, blen);
		break;
	default:
		verbs_ep_fail(e, -EPROTO, "unexpected message");
		break;
	}
}

static void pump(struct vb_ep *e)
{
	struct vb_lane *vl = e->lane ? e->lane->tp : NULL;
	struct rh_conn *c = e->conn;
	int rc;

	if (!vl || e->st != VS_READY || atomic_load(&e->fenced) || !e->qp) {
		return;
	}
	if (rh_core_conn_is_send(c)) {
		uint32_t m = rh_core_conn_resume_epoch(c);

		if (m > e->mark_sent) {
			if (verbs_send_epoch(e, m) < 0) {
				return; /* no slot: next round */
			}
			e->mark_sent = m;
		}
		rc = verbs_pump_writes(e, vl, e->mark_sent);
		if (rc < 0) {
			verbs_ep_fail(e, rc, "write failed");
			return;
		}
		verbs_prefetch_adverts(e, vl);
	} else {
		uint64_t now = rh_now_ms();

		for (int s = 0; vl->npending > 0 && s < RH_RING * RH_MAX_RECVS; s++) {
			struct ofi_rrec *r = &vl->rrec.e[s / RH_MAX_RECVS][s % RH_MAX_RECVS];

			if (r->state == OFI_RREC_PENDING &&
			    verbs_answer_adv(e, r, s % RH_MAX_RECVS, now)) {
				vl->npending--;
			}
			if (e->st == VS_CLOSED) {
				return;
			}
		}
	}
	/* new frames from the core; two send slots stay free for the lane's own messages */
	while (e->st == VS_READY && e->ntx_busy < VB_NTX - 2 && e->nwr_used < VB_NWR) {
		int t = verbs_tx_free_slot(e);
		struct rh_tx tx;
		struct rh_hdr h;
		struct vb_wr *w = NULL;

		if (t < 0 || rh_core_next_tx(e->lane, 0, e->tx[t].buf + OFI_MHDR_LEN,
					     VB_MSG_MAX - OFI_MHDR_LEN, &tx) <= 0) {
			break;
		}
		if (!tx.is_data) {
			ofi_mhdr_put(e->tx[t].buf, OFI_M_CORE, (uint32_t)tx.ctrl_len);
			e->tx[t].core_len = tx.ctrl_len;
			rc = verbs_tx_post(e, t, OFI_MHDR_LEN + tx.ctrl_len);
			if (rc < 0) {
				verbs_ep_fail(e, rc, "send failed");
				return;
			}
			continue;
		}
		rh_hdr_get(tx.hdr, &h);
		if (h.len == 0) {
			rc = verbs_send_msg(e, OFI_M_DATA0, tx.hdr, RH_HDR_LEN);
			if (rc < 0) {
				verbs_ep_fail(e, rc, "DATA0 send failed");
				return;
			}
			continue;
		}
		for (int i = 0; i < VB_NWR && !w; i++) {
			if (e->wr[i].state == VWR_FREE) {
				w = &e->wr[i];
			}
		}
		w->state = VWR_WAIT;
		w->h = h;
		w->payload = tx.payload;
		e->nwr_used++;
		rc = verbs_pump_writes(e, vl, e->mark_sent);
		if (rc < 0) {
			verbs_ep_fail(e, rc, "write failed");
			return;
		}
	}
}

static void on_wc(void *arg, const struct ibv_wc *wc)
{
	struct vb_ep *e = arg;
	enum vb_ctx k = (enum vb_ctx)(wc->wr_id >> 32);
	int idx = (int)(uint32_t)wc->wr_id;

	if (e->st == VS_CLOSED) {
		return;
	}
	switch (k) {
	case VB_CTX_RX:
		e->last_rx_ms = rh_now_ms();
		if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
			verbs_on_write(e, ntohl(wc->imm_data));
		} else {
			on_msg(e, e->arena + (size_t)idx * VB_MSG_MAX, wc->byte_len);
		}
		if (e->st != VS_CLOSED && e->qp) {
			int rc = verbs_post_rx(e, idx);

			if (rc < 0) {
				verbs_ep_fail(e, rc, "cannot post a receive");
			}
		}
		break;
	case VB_CTX_TX: {
		struct vb_tx *t = &e->tx[idx];
		size_t core_len = t->core_len;

		if (!t->busy) {
			break;
		}
		t->busy = false;
		t->core_len = 0;
		e->ntx_busy--;
		atomic_fetch_sub(&e->outstanding, 1);
		if (core_len && e->lane) {
			rh_core_ctrl_written(e->lane, core_len);
		}
		verbs_ep_touch(e, core_len);
		break;
	}
	case VB_CTX_WR: {
		struct vb_wr *w = &e->wr[idx];

		if (w->state == VWR_POSTED) {
			verbs_ep_touch(e, w->h.len);
			w->state = VWR_FREE;
			e->nwr_used--;
			atomic_fetch_sub(&e->outstanding, 1);
		}
		break;
	}
	default:
		break;
	}
}

/* The post time of a write's completion (the probe's age); sends and receives keep none. */
static uint64_t wc_post_ns(void *arg, const struct ibv_wc *wc)
{
	struct vb_ep *e = arg;
	uint32_t idx = (uint32_t)wc->wr_id;

	if ((enum vb_ctx)(wc->wr_id >> 32) != VB_CTX_WR || idx >= VB_NWR) {
		return 0;
	}
	return e->wr[idx].post_ns;
}

static bool poll_cq(struct vb_ep *e)
{
	struct verbs_poll_fail f;
	struct verbs_cq_trace tr = { .nic = e->nic, .post_ns = wc_post_ns, .arg = e };
	int nfail = 0, n;

	if (!e->cq || e->st == VS_CLOSED) {
		return false;
	}
	n = verbs_cq_drain_traced(e->cq, 64, on_wc, e, &f, &nfail, &tr);
	if (n == 0 && e->d->ch && !e->armed && e->st != VS_CLOSED) {
		/* idle: ask for an event on the next completion, then look once more (one may have
		 * come in between) */
		e->armed = ibv_req_notify_cq(e->cq, 0) == 0;
		n = verbs_cq_drain_traced(e->cq, 64, on_wc, e, &f, &nfail, &tr);
	}
	if (n < 0) {
		verbs_ep_fail(e, n, "completion queue poll failed");
		return true;
	}
	if (nfail && e->st != VS_CLOSED && !atomic_load(&e->fenced)) {
		WARN("verbs: queue pair %u on %s: %s (status %d)", f.qp_num,
		     rh_core_nic(e->nic)->ifname, f.v.why, f.status);
		verbs_ep_fail(e, f.v.err ? f.v.err : -EIO, f.v.why);
	}
	return n > 0;
}

/* A device's asynchronous events: a QP event fails its lane, a port error every lane of
 * the NIC (the carrier is gone under all of them). */
static void poll_async(int nic)
{
	struct vb_dev *d = &verbs_devs[nic];
	struct verbs_async a;

	while (atomic_load(&d->ok) && verbs_async_read_nic(d->ctx, nic, &a) == 0) {
		if (a.v.scope == VERBS_OK || a.v.scope == VERBS_NIC_UP) {
			continue;
		}
		WARN("verbs: %s (%s): async event %d: %s", rh_core_nic(nic)->ifname, d->name,
		     a.type, a.v.why);
		for (struct vb_ep *e = verbs_eps; e; e = e->next) {
			if (e->nic != nic || e->st == VS_CLOSED || !e->qp) {
				continue;
			}
			if (a.v.scope == VERBS_FAIL_NIC ||
			    (a.qp_num && e->qp->qp_num == a.qp_num)) {
				verbs_ep_fail(e, a.v.err ? a.v.err : -EIO, a.v.why);
			}
		}
	}
}

static bool io_pass(uint64_t now)
{
	bool busy = false;

	for (struct vb_ep *e = verbs_eps; e; e = e->next) {
		if (e->st == VS_CLOSED || !atomic_load(&e->fenced)) {
			continue;
		}
		/* a closing connection: let the last control messages (ACK, BYE) leave */
		if (e->conn && rh_core_conn_closed(e->conn) && e->ntx_busy > 0 &&
		    now < e->t_fenced_ms + 100) {
			poll_cq(e);
			if (e->ntx_busy > 0) {
				continue;
			}
		}
		verbs_ep_close(e);
		busy = true;
	}
	for (int i = 0; i < rh_core_nic_count() && i < RH_MAX_NICS; i++) {
		if (atomic_load_explicit(&verbs_devs[i].ok, memory_order_acquire)) {
			verbs_ep_accept(i, verbs_devs[i].lfd);
			poll_async(i);
		}
	}
	for (struct vb_ep *e = verbs_eps; e; e = e->next) {
		if (e->st == VS_CLOSED) {
			continue;
		}
		busy |= poll_cq(e);
		if (e->st != VS_CLOSED && e->fd >= 0) {
			verbs_ep_hs_io(e);
		}
		if (e->st != VS_CLOSED && e->deadline_ms && now > e->deadline_ms &&
		    e->st != VS_READY) {
			verbs_ep_fail(e, -ETIMEDOUT, "handshake timed out");
			continue;
		}
		pump(e);
	}
	for (struct vb_ep **pp = &verbs_eps; *pp;) {
		struct vb_ep *e = *pp;

		if (e->st == VS_CLOSED) {
			*pp = e->next;
			verbs_ep_free(e);
			continue;
		}
		pp = &e->next;
	}
	return busy;
}

/* Completion events: acknowledged at once; their queue is polled by the next pass. */
static void read_cq_events(void)
{
	for (int i = 0; i < rh_core_nic_count() && i < RH_MAX_NICS; i++) {
		struct vb_dev *d = &verbs_devs[i];
		struct ibv_cq *cq;
		void *ctx;

		if (!atomic_load(&d->ok) || !d->ch) {
			continue;
		}
		while (verbs_ib.get_cq_event(d->ch, &cq, &ctx) == 0) {
			verbs_ib.ack_cq_events(cq, 1);
			((struct vb_ep *)ctx)->armed = false;
		}
	}
}

/* Without completion channels (an old library) the queues are polled every millisecond while
 * any endpoint exists. */
static bool polled(void)
{
	for (int i = 0; i < rh_core_nic_count() && i < RH_MAX_NICS; i++) {
		if (atomic_load(&verbs_devs[i].ok) && !verbs_devs[i].ch) {
			return true;
		}
	}
	return false;
}

static void io_wait(void)
{
	struct epoll_event ev[32];
	int n = epoll_wait(verbs_epfd, ev, 32, verbs_eps && polled() ? 1 : 20);

	for (int i = 0; i < n; i++) {
		uint64_t t = ev[i].data.u64;

		if (t == VB_TAG_KICK) {
			uint64_t v;

			if (read(verbs_evfd, &v, sizeof(v)) < 0) {
				/* drained already */
			}
			atomic_store(&verbs_kicked, false);
		}
		/* listeners and devices' events: every pass reads them (io_pass) */
	}
	read_cq_events();
}

void *verbs_io_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&verbs_io_stop)) {
		struct vb_ep *list;

		pthread_mutex_lock(&verbs_pend_mu);
		list = verbs_pending;
		verbs_pending = NULL;
		pthread_mutex_unlock(&verbs_pend_mu);
		while (list) {
			struct vb_ep *e = list;

			list = e->next;
			verbs_ep_start(e);
		}
		if (!io_pass(rh_now_ms())) {
			io_wait();
		}
	}
	return NULL;
}
