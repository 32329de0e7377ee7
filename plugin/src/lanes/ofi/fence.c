/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi lanes, the fence and the adverts: DATA moves one-sided, so the receiver hands out adverts
 * (address, key, size of a posted buffer) and the sender writes into them; this file holds both
 * sides of that exchange and the rules that keep a late write out of a reused buffer.
 *
 * THE FENCE. A write is placed by the receiver's provider, not by our code, so dropping stale
 * frames (epochs) is not enough: a write still in flight after a move must not land in a
 * buffer that was completed by the replay and re-posted by the application. Four rules:
 *  1. A fenced lane's endpoints are closed by the I/O thread before anything else it does
 *     (it reads and posts nothing more on them) and their provider objects handed to a
 *     closer thread (closer.c: fi_close may block on a dead peer); once fi_close returned
 *     the provider places nothing more through them. Every lane endpoint holds one core io
 *     reference (rh_core_io_enter) from creation until that fi_close returned, so
 *     close_conn() cannot return (and the application cannot free a buffer) while a
 *     provider may still read or write user memory through the lane.
 *  2. After a resume at epoch M (the receiver's rx_min_epoch, the sender's resume_epoch) the
 *     sender drops every chunk of an older epoch it has not written yet and sends an EPOCH(M)
 *     marker on every endpoint of the connection; the provider orders a send after earlier
 *     writes on the same endpoint (FI_ORDER_SAW), so the marker arrives after the last
 *     old-epoch write of that endpoint has been placed.
 *  3. The receiver gives adverts of epoch >= M (every replayed chunk needs one; ADV_REQs of
 *     older epochs are answered STALE) only while the gate is open: no fenced endpoint of the
 *     connection is still open (or still being closed by a closer) and every open endpoint of a lane that advertised before M
 *     has passed its marker (an advert is good for writes on every endpoint of its lane). A replayed chunk therefore cannot complete a receive (and free its buffer
 *     for reuse) while an older write to that buffer may still land. An endpoint that does not
 *     pass its marker within the completion timeout is failed (and so closed).
 *  4. The core replays an unacknowledged message from its first chunk, also the chunks the
 *     receiver already holds; such a write, issued at the new epoch, would pass the gate and
 *     could land after the receive completed. Each advert therefore carries the receiver's
 *     placed-chunk map (read after the gate) and the sender never writes those chunks again:
 *     every chunk of a receive is then written exactly once per epoch, so no write to its
 *     buffer is in flight when it completes.
 */
#include "ofi.h"

static void deliver(struct ofi_ep *e, const struct rh_hdr *h, const char *expect)
{
	bool counted;
	char *dst = rh_core_rx_data(e->lane, h, &counted);

	if (dst && h->len && dst != expect) {
		/* the core would place it elsewhere than where it was written: never happens
		 * unless the two sides disagree about the buffer; a protocol failure */
		WARN("ofi: chunk %llu+%u of seq %llu was written to %p, the core expects %p",
		     (unsigned long long)h->off, h->len, (unsigned long long)h->seq, (void *)expect,
		     (void *)dst);
		rh_core_rx_data_done(e->lane, h, counted, false);
		ofi_ep_fail(e, -EPROTO, "placement mismatch");
		return;
	}
	rh_core_rx_data_done(e->lane, h, counted, true);
	ofi_ep_touch(e, h->len);
}

void ofi_on_write(struct ofi_ep *e, uint64_t imm)
{
	struct ofi_lane *ol = e->lane ? e->lane->tp : NULL;
	struct rh_conn *c = e->conn;
	struct ofi_imm im;
	struct ofi_rrec *r;
	struct rh_hdr h;

	if (!ol || rh_core_conn_is_send(c)) {
		return;
	}
	ofi_imm_decode(e->d->imm, imm, &im);
	r = ofi_rrec_find(e->d->imm, &ol->rrec, &im);
	ofi_ep_touch(e, 0);
	if (!r) {
		uint32_t ep =
			(uint32_t)ofi_expand(im.epoch, e->d->imm->epoch, rh_core_conn_epoch(c));
		uint32_t min = rh_core_conn_rx_min_epoch(c);

		if (ep >= min) {
			/* Only a write issued before the last resume may outlive its advert (its
			 * chunk is replayed); one of the current epoch would be lost here while
			 * the sender counts it written, so the lane fails and the replay has it. */
			WARN("ofi: lane %u: write of epoch %u for an unknown advert (seq %llu slot "
			     "%u)",
			     e->lane->id, ep, (unsigned long long)im.seq, im.slot);
			ofi_ep_fail(e, -EPROTO, "write for an unknown advert");
			return;
		}
		TRACE("ofi: write of epoch %u (< %u) for an unknown advert (seq %llu slot %u) "
		      "dropped",
		      ep, min, (unsigned long long)im.seq, im.slot);
		return;
	}
	if (ofi_rrec_hdr(e->d->imm, r, &im, rh_core_conn_chunk(c), rh_core_conn_epoch(c),
			 rh_core_conn_id(c), &h) < 0) {
		ofi_ep_fail(e, -EPROTO, "write outside its advert");
		return;
	}
	deliver(e, &h, r->buf + h.off);
}

void ofi_on_data0(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	struct rh_hdr h;

	if (len < RH_HDR_LEN || rh_hdr_get(b, &h) < 0 || h.type != RH_F_DATA || h.len != 0) {
		ofi_ep_fail(e, -EPROTO, "malformed DATA0");
		return;
	}
	deliver(e, &h, NULL);
}

/* Receiver: the gate of the fence (rule 3). */
static bool gate_open(struct rh_conn *c, uint32_t min_epoch, struct ofi_ep **blocker)
{
	uint32_t marks[RH_MAX_LANES * OFI_MAX_STREAMS] = { 0 }; /* each endpoint of a conn */
	int nopen = 0, nfenced = 0;

	*blocker = NULL;
	if (min_epoch == 0) {
		return true;
	}
	for (struct ofi_ep *o = ofi_eps; o; o = o->next) {
		struct ofi_lane *ol;

		if (o->conn != c || (o->kind != EK_LANE && o->kind != EK_LANE_IN) ||
		    (o->st == ES_CLOSED && !(o->closing && o->was_ready))) {
			continue;
		}
		/* fenced, or closed with a closer still releasing it (closer.c): the provider may
		 * still place an older write through it (one that never was ready carried none) */
		if (atomic_load(&o->fenced) || o->st == ES_CLOSED) {
			nfenced++;
			*blocker = o;
			continue;
		}
		ol = o->lane ? o->lane->tp : NULL;
		if (o->st != ES_READY || !ol || !ol->adv_given || ol->max_adv_epoch >= min_epoch) {
			continue;
		}
		if (nopen < (int)(sizeof(marks) / sizeof(marks[0]))) {
			marks[nopen++] = o->mark_seen;
		}
		if (o->mark_seen < min_epoch) {
			*blocker = o;
		}
	}
	return ofi_gate_open(min_epoch, marks, nopen, nfenced);
}

/* Receiver: answer the pending advert r on e (when the gate is open). Returns false when it
 * must wait. The buffer and its placed-chunk map are read now, after the gate: the map then
 * covers every chunk an older epoch placed. */
bool ofi_answer_adv(struct ofi_ep *e, struct ofi_rrec *r, int slot, uint64_t now)
{
	static uint64_t placed[OFI_ADV_WORDS_MAX]; /* I/O thread only */
	static uint8_t body[OFI_ADV_LEN + 8 * OFI_ADV_WORDS_MAX];
	struct rh_conn *c = e->conn;
	struct ofi_adv_msg a = { .seq = r->seq, .slot = (uint8_t)slot, .epoch = r->epoch };
	uint32_t min_epoch = rh_core_conn_rx_min_epoch(c);
	struct ofi_ep *blocker;
	char *buf = NULL;
	uint64_t size = 0;
	void *desc;
	int rc, len;

	if (r->epoch >= min_epoch && !gate_open(c, min_epoch, &blocker)) {
		/* an endpoint still draining older writes is slow, not dead: only one that has
		 * received nothing for the completion timeout is failed (and so closed) */
		if (blocker && !atomic_load(&blocker->fenced) &&
		    now - r->t_pending_ms > (uint64_t)rh_param.COMPLETION_TIMEOUT &&
		    now - blocker->last_rx_ms > (uint64_t)rh_param.COMPLETION_TIMEOUT) {
			ofi_ep_fail(blocker, -ETIMEDOUT, "no fence marker from the sender");
		}
		return false;
	}
	rc = rh_core_rx_buffer(e->lane, r->seq, slot, r->epoch, &buf, &size, placed,
			       OFI_ADV_WORDS_MAX, &a.nwords);
	if (rc == -ESTALE) {
		a.status = OFI_ADV_STALE;
		a.nwords = 0;
	} else if (rc == -E2BIG) {
		WARN("ofi: receive of %llu bytes has too many chunks for an advert",
		     (unsigned long long)size);
		ofi_ep_fail(e, -EMSGSIZE, "message too large for an advert");
		return true;
	} else if (rc < 0) {
		a.status = OFI_ADV_GONE;
		a.nwords = 0;
	} else if ((rc = ofi_mr_get(e->d, buf, size ? size : 1, &a.addr, &a.key, &desc)) < 0) {
		ofi_ep_fail(e, rc, "cannot register the receive buffer");
		return true;
	} else {
		a.size = size;
		a.status = OFI_ADV_OK;
		r->buf = buf;
		r->size = size;
	}
	len = ofi_adv_put(&a, placed, body, sizeof(body));
	if (len < 0 || ofi_send_msg(e, OFI_M_ADV, body, (size_t)len) < 0) {
		return false; /* no send slot: later */
	}
	if (a.status == OFI_ADV_OK) {
		r->state = OFI_RREC_ADVERTISED;
		struct ofi_lane *ol = e->lane->tp;

		ol->adv_given = true;
		if (r->epoch > ol->max_adv_epoch) {
			ol->max_adv_epoch = r->epoch;
		}
	} else {
		r->state = OFI_RREC_NONE;
	}
	return true;
}

void ofi_on_adv_req(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	struct ofi_lane *ol = e->lane ? e->lane->tp : NULL;
	struct ofi_adv_req q;
	struct ofi_rrec *r;

	if (!ol || ofi_adv_req_get(b, len, &q) < 0) {
		ofi_ep_fail(e, -EPROTO, "malformed ADV_REQ");
		return;
	}
	r = &ol->rrec.e[q.seq % RH_RING][q.slot];
	if (!ofi_rrec_take(r, &q)) {
		TRACE("ofi: lane %u: ADV_REQ seq %llu slot %u of epoch %u after one of epoch %u, "
		      "ignored",
		      e->lane->id, (unsigned long long)q.seq, q.slot, q.epoch, r->epoch);
		return;
	}
	if (r->state == OFI_RREC_PENDING) {
		ol->npending--;
	}
	memset(r, 0, sizeof(*r));
	r->seq = q.seq;
	r->epoch = q.epoch;
	r->total = q.total;
	r->t_pending_ms = rh_now_ms();
	r->state = OFI_RREC_PENDING;
	ol->npending++;
	if (ofi_answer_adv(e, r, q.slot, r->t_pending_ms)) {
		ol->npending--;
	}
}

void ofi_on_adv(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	static uint64_t placed[OFI_ADV_WORDS_MAX]; /* I/O thread only */
	struct ofi_lane *ol = e->lane ? e->lane->tp : NULL;
	struct ofi_adv_msg a;

	if (!ol || ofi_adv_get(b, len, &a, placed, OFI_ADV_WORDS_MAX) < 0) {
		ofi_ep_fail(e, -EPROTO, "malformed ADV");
		return;
	}
	if (!ofi_adv_store(&ol->adv, &a, placed)) {
		return;
	}
	if (a.status != OFI_ADV_OK) {
		/* the receive is complete or a resume has passed: chunks waiting for it go (the
		 * resume replays whatever is still missing) */
		for (int i = 0; i < OFI_NWR; i++) {
			struct ofi_wr *w = &e->wr[i];

			if (w->state == WR_WAIT && w->h.seq == a.seq && w->h.slot == a.slot) {
				w->state = WR_FREE;
				e->nwr_used--;
			}
		}
		/* other streams of the lane may wait for it too */
		for (int s = 0; s < OFI_MAX_STREAMS; s++) {
			struct ofi_ep *o = ol_ep(ol, s);

			for (int i = 0; o && o != e && i < OFI_NWR; i++) {
				struct ofi_wr *w = &o->wr[i];

				if (w->state == WR_WAIT && w->h.seq == a.seq &&
				    w->h.slot == a.slot) {
					w->state = WR_FREE;
					o->nwr_used--;
				}
			}
		}
	}
	ofi_ep_touch(e, 0);
}

/* Post the write of chunk w (its advert is valid). Returns -EAGAIN to retry later. */
static int post_write(struct ofi_ep *e, struct ofi_lane *ol, struct ofi_wr *w)
{
	struct rh_conn *c = e->conn;
	struct ofi_imm im = { .seq = w->h.seq,
			      .slot = w->h.slot,
			      .chunk = w->h.off / rh_core_conn_chunk(c),
			      .epoch = w->h.epoch };
	uint64_t raddr, key, imm, lraddr, lkey;
	void *desc = NULL;
	ssize_t rc;
	int err;

	err = ofi_adv_target(&ol->adv, w->h.seq, w->h.slot, w->h.off, w->h.len, &raddr, &key);
	if (err == 0) {
		err = ofi_imm_encode(e->d->imm, &im, &imm);
	}
	if (err < 0) {
		WARN("ofi: chunk %llu+%u of seq %llu does not fit its advert: %s",
		     (unsigned long long)w->h.off, w->h.len, (unsigned long long)w->h.seq,
		     strerror(-err));
		return err;
	}
	if (e->d->mr_mode & FI_MR_LOCAL) {
		err = ofi_mr_get(e->d, w->payload - w->h.off, w->h.total, &lraddr, &lkey, &desc);
		if (err < 0) {
			return err;
		}
	}
	rc = fi_writedata(e->ep, w->payload, w->h.len, desc, imm, 0, raddr, key, &w->ctx);
	if (rc == -FI_EAGAIN) {
		return -EAGAIN;
	}
	if (rc) {
		return fi_err(rc);
	}
	w->state = WR_POSTED;
	/* only posted operations count: a chunk waiting at the receiver's fence gate for its
	 * advert is not a stalled transport */
	atomic_fetch_add(&e->outstanding, 1);
	return 0;
}

int ofi_send_epoch(struct ofi_ep *e, uint32_t m)
{
	uint8_t b[4] = { (uint8_t)m, (uint8_t)(m >> 8), (uint8_t)(m >> 16), (uint8_t)(m >> 24) };

	return ofi_send_msg(e, OFI_M_EPOCH, b, sizeof(b));
}

/* Sender: ask for the advert of (seq, slot) on the lane's control endpoint, or (a lane of one
 * endpoint, or the control endpoint busy) its least loaded one: the request travels behind
 * that endpoint's queued writes. */
static int request_adv(struct ofi_lane *ol, uint64_t seq, int slot, uint64_t total, uint32_t epoch)
{
	struct ofi_adv_req q = { .seq = seq, .total = total, .epoch = epoch, .slot = (uint8_t)slot };
	uint8_t body[OFI_ADV_REQ_LEN];
	struct ofi_ep *best = NULL;
	int rc;

	for (int i = 0; i < OFI_MAX_STREAMS; i++) {
		struct ofi_ep *o = ol_ep(ol, i);

		if (!o || o->st != ES_READY || atomic_load(&o->fenced) ||
		    o->ntx_busy >= OFI_NTX - 1 || o->mark_sent < ol->ep_mark) {
			continue;
		}
		if (ofi_ep_ctrl_only(o)) {
			best = o; /* nothing queued ahead of it */
			break;
		}
		if (!best || o->nwr_used + o->txq_n < best->nwr_used + best->txq_n) {
			best = o;
		}
	}
	if (!best) {
		return -EAGAIN;
	}
	ofi_adv_req_put(&q, body);
	rc = ofi_send_msg(best, OFI_M_ADV_REQ, body, sizeof(body));
	if (rc == 0) {
		ofi_adv_requested(&ol->adv, seq, slot, epoch, rh_now_ms());
	}
	return rc;
}

/* Sender: ask for the adverts of the messages queued next, before their chunks are due. */
void ofi_prefetch_adverts(struct ofi_ep *e, struct ofi_lane *ol)
{
	struct rh_tx_peek pk[OFI_PEEK];
	int n;

	if (ol_ep(ol, 0) != e && !(ol_ep(ol, 0) == NULL || ol_ep(ol, 0)->st != ES_READY)) {
		return; /* once per lane per pass: on its first endpoint */
	}
	n = rh_core_tx_peek(e->lane, pk, OFI_PEEK);
	for (int i = 0; i < n; i++) {
		if (pk[i].size == 0 || pk[i].epoch < e->mark_sent ||
		    ofi_adv_lookup(&ol->adv, pk[i].seq, pk[i].slot, e->mark_sent) != OFI_ADV_NONE) {
			continue;
		}
		if (request_adv(ol, pk[i].seq, pk[i].slot, pk[i].size, pk[i].epoch) < 0) {
			return;
		}
	}
}

/* Sender: move chunks that wait for adverts along (request, write, or drop when stale). */
int ofi_pump_writes(struct ofi_ep *e, struct ofi_lane *ol, uint32_t m)
{
	int rc = 0;

	for (int i = 0; i < OFI_NWR && rc == 0; i++) {
		struct ofi_wr *w = &e->wr[i];

		if (w->state != WR_WAIT) {
			continue;
		}
		if (w->h.epoch < m) {
			/* rule 2: never write an older epoch after a resume (it is replayed) */
			w->state = WR_FREE;
			e->nwr_used--;
			continue;
		}
		switch (ofi_adv_lookup(&ol->adv, w->h.seq, w->h.slot, m)) {
		case OFI_ADV_VALID:
			if (ofi_adv_placed(&ol->adv, w->h.seq, w->h.slot,
					   w->h.off / rh_core_conn_chunk(e->conn))) {
				/* the receiver holds it already (a replay after a resume):
				 * writing it again could land after the receive completed */
				w->state = WR_FREE;
				e->nwr_used--;
				ofi_ep_touch(e, 0);
				continue;
			}
			rc = post_write(e, ol, w);
			break;
		case OFI_ADV_NONE:
			rc = request_adv(ol, w->h.seq, w->h.slot, w->h.total, w->h.epoch);
			break;
		default:
			/* requested: a lost request or answer must not become a silent stall
			 * (nothing is posted, so the lane's stall test cannot see it) */
			if (ofi_adv_overdue(&ol->adv, w->h.seq, w->h.slot, rh_now_ms(),
					    OFI_ADV_WAIT_TIMEOUTS *
						    (uint64_t)rh_param.COMPLETION_TIMEOUT)) {
				WARN("ofi: lane %u: no advert for seq %llu slot %u within %lld ms",
				     e->lane->id, (unsigned long long)w->h.seq, w->h.slot,
				     (long long)OFI_ADV_WAIT_TIMEOUTS *
					     (long long)rh_param.COMPLETION_TIMEOUT);
				return -ETIMEDOUT;
			}
			break;
		}
	}
	return rc == -EAGAIN ? 0 : rc;
}
