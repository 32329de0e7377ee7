/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi lanes, I/O: the one I/O thread (it owns every endpoint, CQ and EQ), the dispatch of
 * received messages, the per-endpoint pump (control frames from the core, then writes), and the
 * completion and event queues.
 */
#include "ofi.h"

pthread_t ofi_io_thread;
atomic_bool ofi_io_stop;
int ofi_epfd = -1, ofi_evfd = -1;
atomic_bool ofi_kicked;
pthread_mutex_t ofi_pend_mu = PTHREAD_MUTEX_INITIALIZER;
struct ofi_ep *ofi_pending; /* created by other threads */
struct ofi_ep *ofi_eps; /* owned by the I/O thread */
atomic_bool ofi_wait_fds = true; /* the provider gives FI_WAIT_FD wait objects */

uint64_t ofi_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void ofi_slow_check(uint64_t t0, const char *what, const struct ofi_ep *e)
{
	uint64_t dt = ofi_us() - t0;

	if (dt > OFI_SLOW_US) {
		WARN("ofi: I/O thread: %s took %llu ms (endpoint nic%d kind %d state %d%s)", what,
		     (unsigned long long)(dt / 1000), e ? e->nic : -1, e ? (int)e->kind : -1,
		     e ? (int)e->st : -1, e && atomic_load(&e->fenced) ? ", fenced" : "");
	}
}

void ofi_io_kick(void)
{
	uint64_t one = 1;

	if (!atomic_exchange(&ofi_kicked, true)) {
		if (write(ofi_evfd, &one, sizeof(one)) < 0) {
			atomic_store(&ofi_kicked, false);
		}
	}
}

static void on_core(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	size_t o = 0;

	while (o + RH_HDR_LEN <= len) {
		struct rh_hdr h;

		if (rh_hdr_get(b + o, &h) < 0 || h.len > len - o - RH_HDR_LEN) {
			ofi_ep_fail(e, -EPROTO, "malformed control frame");
			return;
		}
		if (h.type == RH_F_DATA) { /* DATA travels as writes, never here */
			ofi_ep_fail(e, -EPROTO, "DATA frame in a control message");
			return;
		}
		rh_core_rx_ctrl(e->lane, &h, b + o + RH_HDR_LEN);
		o += RH_HDR_LEN + h.len;
	}
}

/* A chunk arrived (a write completion, or DATA0 for a zero-byte chunk): tell the core. */

static void on_msg(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	enum ofi_mkind kind;
	uint32_t blen;

	if (ofi_mhdr_get(b, len, &kind, &blen) < 0) {
		ofi_ep_fail(e, -EPROTO, "malformed message");
		return;
	}
	b += OFI_MHDR_LEN;
	if (kind == OFI_M_HELLO) {
		ofi_on_hello(e, b, blen);
		return;
	}
	if (kind == OFI_M_HELLO_ACK) {
		ofi_on_hello_ack(e, b, blen);
		return;
	}
	if (e->st != ES_READY || (e->kind != EK_LANE && e->kind != EK_LANE_IN) ||
	    atomic_load(&e->fenced)) {
		return;
	}
	ofi_ep_touch(e, blen);
	switch (kind) {
	case OFI_M_CORE:
		on_core(e, b, blen);
		break;
	case OFI_M_ADV_REQ:
		ofi_on_adv_req(e, b, blen);
		break;
	case OFI_M_ADV:
		ofi_on_adv(e, b, blen);
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
		ofi_on_data0(e, b, blen);
		break;
	default:
		break;
	}
}

static void pump(struct ofi_ep *e)
{
	struct ofi_lane *ol = e->lane ? e->lane->tp : NULL;
	struct rh_conn *c = e->conn;
	uint32_t m;
	int rc;

	if (!ol || e->st != ES_READY || atomic_load(&e->fenced)) {
		return;
	}
	rc = ofi_tx_flush(e);
	if (rc < 0) {
		ofi_ep_fail(e, rc, "send failed");
		return;
	}
	if (rh_core_conn_is_send(c)) {
		m = rh_core_conn_resume_epoch(c);
		if (m > e->mark_sent) {
			if (ofi_send_epoch(e, m) < 0) {
				return; /* no slot: next round */
			}
			e->mark_sent = m;
		}
		if (m > ol->ep_mark) {
			ol->ep_mark = m;
		}
		rc = ofi_pump_writes(e, ol, e->mark_sent);
		if (rc < 0) {
			ofi_ep_fail(e, rc, "write failed");
			return;
		}
		ofi_prefetch_adverts(e, ol);
	} else {
		/* receiver: adverts waiting for the gate */
		uint64_t now = rh_now_ms();

		for (int s = 0; ol->npending > 0 && s < RH_RING * RH_MAX_RECVS; s++) {
			struct ofi_rrec *r = &ol->rrec.e[s / RH_MAX_RECVS][s % RH_MAX_RECVS];

			if (r->state == OFI_RREC_PENDING &&
			    ofi_answer_adv(e, r, s % RH_MAX_RECVS, now)) {
				ol->npending--;
			}
			if (e->st == ES_CLOSED) {
				return;
			}
		}
	}
	/* New frames from the core: control batches and chunks. Keep two send slots for the
	 * lane's own messages. */
	while (e->st == ES_READY && e->ntx_busy < OFI_NTX - 2 && e->nwr_used < OFI_NWR) {
		int t = ofi_tx_free_slot(e);
		struct rh_tx tx;

		if (t < 0 ||
		    rh_core_next_tx(e->lane, ofi_ep_ctrl_only(e) ? RH_STREAM_CTRL_ONLY : e->idx,
				    e->tx[t].buf + OFI_MHDR_LEN, OFI_MSG_MAX - OFI_MHDR_LEN,
				    &tx) <= 0) {
			break;
		}
		if (!tx.is_data) {
			ofi_mhdr_put(e->tx[t].buf, OFI_M_CORE, (uint32_t)tx.ctrl_len);
			e->tx[t].core_len = tx.ctrl_len;
			rc = ofi_tx_post(e, t, OFI_MHDR_LEN + tx.ctrl_len);
			if (rc < 0) {
				ofi_ep_fail(e, rc, "send failed");
				return;
			}
			continue;
		}
		{
			struct rh_hdr h;
			struct ofi_wr *w = NULL;

			rh_hdr_get(tx.hdr, &h);
			if (h.len == 0) {
				rc = ofi_send_msg(e, OFI_M_DATA0, tx.hdr, RH_HDR_LEN);
				if (rc < 0) { /* a slot was free: a provider failure */
					ofi_ep_fail(e, rc, "DATA0 send failed");
					return;
				}
				continue;
			}
			for (int i = 0; i < OFI_NWR; i++) {
				if (e->wr[i].state == WR_FREE) {
					w = &e->wr[i];
					break;
				}
			}
			w->state = WR_WAIT;
			w->h = h;
			w->payload = tx.payload;
			e->nwr_used++;
		}
		rc = ofi_pump_writes(e, ol, e->mark_sent);
		if (rc < 0) {
			ofi_ep_fail(e, rc, "write failed");
			return;
		}
	}
}

static void on_cq_entry(struct ofi_ep *e, const struct fi_cq_data_entry *ce)
{
	struct ofi_ctx *x = ce->op_context;

	if ((ce->flags & FI_REMOTE_CQ_DATA) || (x && x->kind == CTX_RX)) {
		e->last_rx_ms = rh_now_ms();
	}
	if ((ce->flags & FI_REMOTE_CQ_DATA) && (ce->flags & (FI_RMA | FI_REMOTE_WRITE))) {
		ofi_on_write(e, ce->data);
		if (x && x->kind == CTX_RX && e->st != ES_CLOSED) {
			int rc = ofi_post_rx(e, x->idx); /* FI_RX_CQ_DATA consumed it */

			if (rc < 0) {
				ofi_ep_fail(e, rc, "cannot post a receive");
			}
		}
		return;
	}
	if (!x) {
		return;
	}
	switch (x->kind) {
	case CTX_RX:
		on_msg(e, e->rx[x->idx].buf, ce->len);
		if (e->st != ES_CLOSED) {
			int rc = ofi_post_rx(e, x->idx);

			if (rc < 0) {
				ofi_ep_fail(e, rc, "cannot post a receive");
			}
		}
		break;
	case CTX_TX: {
		struct ofi_tx *t = &e->tx[x->idx];

		if (!t->busy) {
			break;
		}
		size_t core_len = t->core_len;

		t->busy = false;
		t->core_len = 0;
		e->ntx_busy--;
		atomic_fetch_sub(&e->outstanding, 1);
		if (core_len && e->lane) {
			rh_core_ctrl_written(e->lane, core_len);
		}
		ofi_ep_touch(e, core_len);
		if (e->kind == EK_PROBE_REPLY) {
			ofi_ep_close(e);
		}
		break;
	}
	case CTX_WR: {
		struct ofi_wr *w = &e->wr[x->idx];

		if (w->state == WR_POSTED) {
			ofi_ep_touch(e, w->h.len);
			w->state = WR_FREE;
			e->nwr_used--;
			atomic_fetch_sub(&e->outstanding, 1);
		}
		break;
	}
	default:
		break;
	}
}

/* Returns true when something happened. */
static bool poll_cq(struct ofi_ep *e)
{
	struct fi_cq_data_entry ce[16];
	bool any = false;

	while (e->cq && e->st != ES_CLOSED) {
		ssize_t n = fi_cq_read(e->cq, ce, 16);

		if (n == -FI_EAGAIN) {
			break;
		}
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry err = { 0 };

			if (fi_cq_readerr(e->cq, &err, 0) <= 0) {
				ofi_ep_fail(e, -EIO, "unreadable completion error");
			} else if (err.err != FI_ECANCELED) {
				ofi_ep_fail(e, err.err ? -(int)err.err : -EIO, "completion error");
			}
			return true;
		}
		if (n < 0) {
			ofi_ep_fail(e, fi_err(n), "CQ read failed");
			return true;
		}
		for (ssize_t i = 0; i < n && e->st != ES_CLOSED; i++) {
			on_cq_entry(e, &ce[i]);
		}
		any = true;
	}
	return any;
}

static bool poll_eq(struct ofi_ep *e)
{
	struct fi_eq_cm_entry ent;
	uint32_t ev;
	ssize_t n;

	if (!e->eq || e->st == ES_CLOSED) {
		return false;
	}
	n = fi_eq_read(e->eq, &ev, &ent, sizeof(ent), 0);
	if (n == -FI_EAGAIN) {
		return false;
	}
	if (n == -FI_EAVAIL) {
		struct fi_eq_err_entry err = { 0 };

		fi_eq_readerr(e->eq, &err, 0);
		ofi_ep_fail(e, err.err ? -err.err : -ECONNREFUSED, "connection failed");
		return true;
	}
	if (n < 0) {
		ofi_ep_fail(e, fi_err(n), "EQ read failed");
		return true;
	}
	if (ev == FI_CONNECTED) {
		if (e->st == ES_CONNECTING && e->hello) {
			int rc;

			/* the peer accepted: a live pair, however long the hellos take */
			if (e->kind == EK_LANE && e->lane && !atomic_load(&e->fenced)) {
				rh_core_stream_answered(e->lane);
			}
			rc = ofi_send_msg(e, OFI_M_HELLO, e->hello, e->hello_len);

			free(e->hello);
			e->hello = NULL;
			if (rc < 0) {
				ofi_ep_fail(e, rc, "cannot send the hello");
				return true;
			}
			e->st = ES_HELLO_WAIT;
		} else if (e->st == ES_CONNECTING) {
			e->st = ES_HELLO_IN; /* accepted side */
		}
	} else if (ev == FI_SHUTDOWN) {
		/* Everything the peer sent before closing is in the CQ: read it first, so a BYE
		 * is seen before the close (an orderly close then is no failure). */
		poll_cq(e);
		if (e->st == ES_READY && e->lane && !atomic_load(&e->fenced) &&
		    (e->kind == EK_LANE || e->kind == EK_LANE_IN)) {
			e->failed = true;
			rh_core_stream_eof(e->lane); /* the core decides: BYE seen or a failure */
			ofi_ep_close(e);
		} else if (e->kind == EK_PROBE_REPLY || e->kind == EK_ACCEPTED) {
			ofi_ep_close(e);
		} else if (e->st != ES_CLOSED) {
			ofi_ep_fail(e, -ECONNRESET, "peer closed");
		}
	}
	return true;
}

/* The passive endpoint of a NIC: connection requests. */
static bool poll_pep(struct ofi_dom *d, int nic)
{
	struct fi_eq_cm_entry ent;
	uint32_t ev;
	ssize_t n;
	struct ofi_ep *e;
	int rc;

	if (!atomic_load_explicit(&d->served, memory_order_acquire)) {
		return false;
	}
	n = fi_eq_read(d->peq, &ev, &ent, sizeof(ent), 0);
	if (n == -FI_EAGAIN) {
		return false;
	}
	if (n == -FI_EAVAIL) {
		struct fi_eq_err_entry err = { 0 };

		/* a connection request that failed on the way: nothing to do but consume it */
		return fi_eq_readerr(d->peq, &err, 0) > 0;
	}
	if (n < 0) {
		return false;
	}
	if (ev != FI_CONNREQ) {
		return true; /* no other event carries anything for a passive endpoint */
	}
	e = ofi_ep_new(EK_ACCEPTED, nic);
	if (!e) {
		fi_reject(d->pep, ent.info->handle, NULL, 0);
		ofi_lf_freeinfo(ent.info);
		return true;
	}
	e->cinfo = ent.info;
	e->deadline_ms = rh_now_ms() + OFI_ACCEPT_MS;
	rc = ofi_ep_setup(e, ent.info);
	if (!rc) {
		rc = fi_err(fi_accept(e->ep, NULL, 0));
	}
	e->st = ES_CONNECTING;
	e->next = ofi_eps;
	ofi_eps = e;
	if (rc) {
		ofi_ep_close(e);
	}
	return true;
}

/* One pass over every endpoint. Returns true when anything moved. */
static bool io_pass(uint64_t now)
{
	bool busy = false;

	/* Rule 1 first: fenced endpoints close before anything else runs this pass. */
	for (struct ofi_ep *e = ofi_eps; e; e = e->next) {
		if (e->st == ES_CLOSED || !atomic_load(&e->fenced)) {
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
		uint64_t t0 = ofi_us();

		ofi_ep_close(e);
		ofi_slow_check(t0, "closing a fenced endpoint", e);
		busy = true;
	}
	for (int i = 0; i < rh_core_nic_count(); i++) {
		uint64_t t0 = ofi_us();

		for (int k = 0; k < 16 && poll_pep(&ofi_doms[i], i); k++) {
			busy = true;
		}
		ofi_slow_check(t0, "the passive endpoint's events", NULL);
	}
	for (struct ofi_ep *e = ofi_eps; e; e = e->next) {
		if (e->st == ES_CLOSED) {
			continue;
		}
		uint64_t t0 = ofi_us();

		busy |= poll_eq(e);
		ofi_slow_check(t0, "the event queue", e);
		t0 = ofi_us();
		busy |= poll_cq(e);
		ofi_slow_check(t0, "the completion queue", e);
		if (e->st != ES_CLOSED && e->deadline_ms && now > e->deadline_ms &&
		    e->st != ES_READY) {
			t0 = ofi_us();
			ofi_ep_fail(e, -ETIMEDOUT, "handshake timed out");
			ofi_slow_check(t0, "failing a timed-out handshake", e);
			continue;
		}
		t0 = ofi_us();
		pump(e);
		ofi_slow_check(t0, "the pump", e);
	}
	for (struct ofi_ep **pp = &ofi_eps; *pp;) {
		struct ofi_ep *e = *pp;

		if (e->st == ES_CLOSED && e->closing) {
			if (!atomic_load_explicit(&e->released, memory_order_acquire)) {
				pp = &e->next; /* a closer is still at it */
				continue;
			}
			e->closing = false;
			ofi_ep_closed(e);
			busy = true;
		}
		if (e->st == ES_CLOSED) {
			*pp = e->next;
			ofi_ep_free(e);
			continue;
		}
		pp = &e->next;
	}
	return busy;
}

static void io_wait(void)
{
	struct epoll_event ev[32];
	int timeout = ofi_wait_fds ? 20 : 1;

	if (ofi_wait_fds) {
		for (struct ofi_ep *e = ofi_eps; e; e = e->next) {
			struct fid *f[2];
			int n = 0;

			if (e->st == ES_CLOSED) {
				continue;
			}
			if (e->cq) {
				f[n++] = &e->cq->fid;
			}
			if (e->eq) {
				f[n++] = &e->eq->fid;
			}
			if (n && fi_trywait(e->d->fabric, f, n) != FI_SUCCESS) {
				return; /* something to read already */
			}
		}
		for (int i = 0; i < rh_core_nic_count(); i++) {
			struct fid *f;

			if (!atomic_load_explicit(&ofi_doms[i].served, memory_order_acquire)) {
				continue;
			}
			f = &ofi_doms[i].peq->fid;
			if (fi_trywait(ofi_doms[i].fabric, &f, 1) != FI_SUCCESS) {
				return;
			}
		}
	}
	int n = epoll_wait(ofi_epfd, ev, 32, timeout);

	for (int i = 0; i < n; i++) {
		if (!ev[i].data.ptr) {
			uint64_t v;

			if (read(ofi_evfd, &v, sizeof(v)) < 0) {
				/* drained already */
			}
			atomic_store(&ofi_kicked, false);
		}
	}
}

void *ofi_io_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&ofi_io_stop)) {
		struct ofi_ep *list;
		bool busy;

		pthread_mutex_lock(&ofi_pend_mu);
		list = ofi_pending;
		ofi_pending = NULL;
		pthread_mutex_unlock(&ofi_pend_mu);
		while (list) {
			struct ofi_ep *e = list;

			list = e->next;
			ofi_ep_start(e);
		}
		uint64_t t0 = ofi_us();

		busy = io_pass(rh_now_ms());
		ofi_slow_check(t0, "a pass over the endpoints", NULL);
		if (!busy) {
			t0 = ofi_us();
			io_wait();
			if (ofi_us() - t0 >
			    OFI_SLOW_US + 100000) { /* its epoll waits 20 ms at most */
				ofi_slow_check(t0, "waiting for events", NULL);
			}
		}
	}
	return NULL;
}
