/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verbs lanes, adverts and one-sided writes (lane.h), with the ofi lane's four rules of the fence
 * (lanes/ofi/fence.c, THE FENCE), on one queue pair per lane:
 *  1. a fenced lane's queue pair is destroyed by the I/O thread before anything else it does;
 *  2. after a resume at epoch M the sender drops the chunks of older epochs it has not written
 *     and sends EPOCH(M) on every lane's queue pair; RC delivers a send after the writes posted
 *     before it on the same queue pair;
 *  3. the receiver gives adverts of epoch >= M only while no fenced lane of the connection
 *     still has a queue pair and every lane that advertised before M has passed its marker;
 *  4. adverts carry the receiver's placed-chunk map; the sender never writes those again.
 */
#include "lane.h"

static void deliver(struct vb_ep *e, const struct rh_hdr *h, const char *expect)
{
	bool counted;
	char *dst = rh_core_rx_data(e->lane, h, &counted);

	if (dst && h->len && dst != expect) {
		WARN("verbs: chunk %llu+%u of seq %llu was written to %p, the core expects %p",
		     (unsigned long long)h->off, h->len, (unsigned long long)h->seq, (void *)expect,
		     (void *)dst);
		rh_core_rx_data_done(e->lane, h, counted, false);
		verbs_ep_fail(e, -EPROTO, "placement mismatch");
		return;
	}
	rh_core_rx_data_done(e->lane, h, counted, true);
	verbs_ep_touch(e, h->len);
}

/* Receiver: a write completed with immediate imm (its advert id and chunk, proto.h). */
void verbs_on_write(struct vb_ep *e, uint32_t imm)
{
	struct vb_lane *vl = e->lane ? e->lane->tp : NULL;
	struct rh_conn *c = e->conn;
	struct rh_hdr h;
	uint32_t adv;
	int rc;

	if (!vl || rh_core_conn_is_send(c)) {
		return;
	}
	verbs_ep_touch(e, 0);
	rc = !vl->ids ? -ENOENT :
			verbs_write_hdr(vl->ids, 0, &vl->rrec, imm, rh_core_conn_chunk(c),
					rh_core_conn_id(c), &h, &adv);
	if (rc == -ENOENT) {
		WARN("verbs: queue pair %u: a write names advert %u, which is not outstanding",
		     e->qp ? e->qp->qp_num : 0, adv);
		verbs_ep_fail(e, -EPROTO, "write for no outstanding advert");
		return;
	}
	if (rc < 0) {
		WARN("verbs: queue pair %u: a write against advert %u lies outside it",
		     e->qp ? e->qp->qp_num : 0, adv);
		verbs_ep_fail(e, -EPROTO, "write outside its advert");
		return;
	}
	deliver(e, &h, vl->rrec.e[h.seq % RH_RING][h.slot].buf + h.off);
}

/* Receiver: the record's advert id is free again (its next request is the sender's RETIRE,
 * proto.h). */
static void rrec_retire(struct vb_lane *vl, uint64_t seq, int slot)
{
	uint16_t *id = &vl->rrec_id[seq % RH_RING][slot];

	if (*id && vl->ids) {
		verbs_adv_retire(vl->ids, (uint32_t)(*id - 1), 0);
		*id = 0;
	}
}

void verbs_on_data0(struct vb_ep *e, const uint8_t *b, size_t len)
{
	struct rh_hdr h;

	if (len < RH_HDR_LEN || rh_hdr_get(b, &h) < 0 || h.type != RH_F_DATA || h.len != 0) {
		verbs_ep_fail(e, -EPROTO, "malformed DATA0");
		return;
	}
	deliver(e, &h, NULL);
}

/* Receiver: the gate of the fence (rule 3). */
static bool gate_open(struct rh_conn *c, uint32_t min_epoch, struct vb_ep **blocker)
{
	uint32_t marks[RH_MAX_LANES] = { 0 };
	int nopen = 0, nfenced = 0;

	*blocker = NULL;
	if (min_epoch == 0) {
		return true;
	}
	for (struct vb_ep *o = verbs_eps; o; o = o->next) {
		struct vb_lane *vl;

		if (o->conn != c || (o->kind != VK_LANE && o->kind != VK_LANE_IN) ||
		    o->st == VS_CLOSED) {
			continue;
		}
		if (atomic_load(&o->fenced)) {
			nfenced++;
			*blocker = o;
			continue;
		}
		vl = o->lane ? o->lane->tp : NULL;
		if (o->st != VS_READY || !vl || !vl->adv_given || vl->max_adv_epoch >= min_epoch) {
			continue;
		}
		if (nopen < RH_MAX_LANES) {
			marks[nopen++] = o->mark_seen;
		}
		if (o->mark_seen < min_epoch) {
			*blocker = o;
		}
	}
	return ofi_gate_open(min_epoch, marks, nopen, nfenced);
}

bool verbs_answer_adv(struct vb_ep *e, struct ofi_rrec *r, int slot, uint64_t now)
{
	static uint64_t placed[OFI_ADV_WORDS_MAX]; /* I/O thread only */
	static uint8_t body[VERBS_ADV_ID_LEN + OFI_ADV_LEN + 8 * OFI_ADV_WORDS_MAX];
	struct rh_conn *c = e->conn;
	struct ofi_adv_msg a = { .seq = r->seq, .slot = (uint8_t)slot, .epoch = r->epoch };
	uint32_t min_epoch = rh_core_conn_rx_min_epoch(c), lkey, rkey;
	struct vb_lane *vl = e->lane->tp;
	struct vb_ep *blocker;
	char *buf = NULL;
	uint64_t size = 0;
	int rc, len, id = -1;

	if (r->epoch >= min_epoch && !gate_open(c, min_epoch, &blocker)) {
		if (blocker && !atomic_load(&blocker->fenced) &&
		    now - r->t_pending_ms > (uint64_t)rh_param.COMPLETION_TIMEOUT &&
		    now - blocker->last_rx_ms > (uint64_t)rh_param.COMPLETION_TIMEOUT) {
			verbs_ep_fail(blocker, -ETIMEDOUT, "no fence marker from the sender");
		}
		return false;
	}
	rc = rh_core_rx_buffer(e->lane, r->seq, slot, r->epoch, &buf, &size, placed,
			       OFI_ADV_WORDS_MAX, &a.nwords);
	if (rc == -ESTALE) {
		a.status = OFI_ADV_STALE;
		a.nwords = 0;
	} else if (rc == -E2BIG) {
		verbs_ep_fail(e, -EMSGSIZE, "message too large for an advert");
		return true;
	} else if (rc < 0) {
		a.status = OFI_ADV_GONE;
		a.nwords = 0;
	} else if ((rc = verbs_dev_mr(e->d, buf, size, &lkey, &rkey)) < 0) {
		verbs_ep_fail(e, rc, "cannot register the receive buffer");
		return true;
	} else {
		a.addr = (uintptr_t)buf;
		a.key = rkey;
		a.size = size;
		a.status = OFI_ADV_OK;
		r->buf = buf;
		r->size = size;
	}
	if (a.status == OFI_ADV_OK && !vl->ids) {
		vl->ids = calloc(1, sizeof(*vl->ids));
		if (!vl->ids) {
			verbs_ep_fail(e, -ENOMEM, "no memory for the advert ids");
			return true;
		}
	}
	if (a.status == OFI_ADV_OK) {
		id = verbs_adv_alloc(vl->ids, 0, r->seq, slot, r->epoch, VERBS_ADV_WANT_ANY);
		if (id < 0) {
			return false; /* every id is live (more than the records): later */
		}
	}
	verbs_adv_id_put(id < 0 ? 0 : (uint32_t)id, body);
	len = ofi_adv_put(&a, placed, body + VERBS_ADV_ID_LEN, sizeof(body) - VERBS_ADV_ID_LEN);
	if (len < 0 || verbs_send_msg(e, OFI_M_ADV, body, (size_t)len + VERBS_ADV_ID_LEN) < 0) {
		if (id >= 0) {
			verbs_adv_retire(vl->ids, (uint32_t)id, 0);
		}
		return false; /* no send slot: later */
	}
	if (a.status == OFI_ADV_OK) {
		vl->rrec_id[r->seq % RH_RING][slot] = (uint16_t)(id + 1);
		r->state = OFI_RREC_ADVERTISED;
		vl->adv_given = true;
		if (r->epoch > vl->max_adv_epoch) {
			vl->max_adv_epoch = r->epoch;
		}
	} else {
		r->state = OFI_RREC_NONE;
	}
	return true;
}

void verbs_on_adv_req(struct vb_ep *e, const uint8_t *b, size_t len)
{
	struct vb_lane *vl = e->lane ? e->lane->tp : NULL;
	struct ofi_adv_req q;
	struct ofi_rrec *r;

	if (!vl || ofi_adv_req_get(b, len, &q) < 0 || q.slot >= RH_MAX_RECVS) {
		verbs_ep_fail(e, -EPROTO, "malformed ADV_REQ");
		return;
	}
	r = &vl->rrec.e[q.seq % RH_RING][q.slot];
	if (!ofi_rrec_take(r, &q)) {
		return;
	}
	if (r->state == OFI_RREC_PENDING) {
		vl->npending--;
	}
	rrec_retire(vl, q.seq, q.slot);
	memset(r, 0, sizeof(*r));
	r->seq = q.seq;
	r->epoch = q.epoch;
	r->total = q.total;
	r->t_pending_ms = rh_now_ms();
	r->state = OFI_RREC_PENDING;
	vl->npending++;
	if (verbs_answer_adv(e, r, q.slot, r->t_pending_ms)) {
		vl->npending--;
	}
}

void verbs_on_adv(struct vb_ep *e, const uint8_t *b, size_t len)
{
	static uint64_t placed[OFI_ADV_WORDS_MAX]; /* I/O thread only */
	struct vb_lane *vl = e->lane ? e->lane->tp : NULL;
	struct ofi_adv_msg a;
	uint32_t id;

	if (!vl || verbs_adv_id_get(b, len, &id) < 0 ||
	    ofi_adv_get(b + VERBS_ADV_ID_LEN, len - VERBS_ADV_ID_LEN, &a, placed,
			OFI_ADV_WORDS_MAX) < 0 ||
	    a.slot >= RH_MAX_RECVS) {
		verbs_ep_fail(e, -EPROTO, "malformed ADV");
		return;
	}
	if (!ofi_adv_store(&vl->adv, &a, placed)) {
		return;
	}
	vl->adv_id[a.seq % RH_RING][a.slot] = a.status == OFI_ADV_OK ? (uint16_t)(id + 1) : 0;
	if (a.status != OFI_ADV_OK) {
		/* the receive is complete or a resume has passed: chunks waiting for it go */
		for (int i = 0; i < VB_NWR; i++) {
			struct vb_wr *w = &e->wr[i];

			if (w->state == VWR_WAIT && w->h.seq == a.seq && w->h.slot == a.slot) {
				w->state = VWR_FREE;
				e->nwr_used--;
			}
		}
	}
	verbs_ep_touch(e, 0);
}

/* Post the write of chunk w (its advert is valid). */
static int post_write(struct vb_ep *e, struct vb_lane *vl, int i)
{
	struct vb_wr *w = &e->wr[i];
	struct rh_conn *c = e->conn;
	uint16_t id = vl->adv_id[w->h.seq % RH_RING][w->h.slot];
	uint64_t raddr, key;
	uint32_t lkey, rkey, imm;
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	int err;

	err = ofi_adv_target(&vl->adv, w->h.seq, w->h.slot, w->h.off, w->h.len, &raddr, &key);
	if (err == 0) {
		err = id ? verbs_imm_encode(id - 1u, w->h.off / rh_core_conn_chunk(c), &imm) :
			   -EPROTO;
	}
	if (err == 0) {
		err = verbs_dev_mr(e->d, w->payload - w->h.off, w->h.total, &lkey, &rkey);
	}
	if (err < 0) {
		WARN("verbs: chunk %llu+%u of seq %llu: %s", (unsigned long long)w->h.off, w->h.len,
		     (unsigned long long)w->h.seq, strerror(-err));
		return err;
	}
	sge = (struct ibv_sge){ .addr = (uintptr_t)w->payload, .length = w->h.len, .lkey = lkey };
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = vb_wrid(VB_CTX_WR, i);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htonl(imm);
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = (uint32_t)key;
	err = ibv_post_send(e->qp, &wr, &bad);
	if (err) {
		return err > 0 ? -err : err;
	}
	w->state = VWR_POSTED;
	w->post_ns = rh_now_ns();
	atomic_fetch_add(&e->outstanding, 1);
	return 0;
}

int verbs_send_epoch(struct vb_ep *e, uint32_t m)
{
	uint8_t b[4] = { (uint8_t)m, (uint8_t)(m >> 8), (uint8_t)(m >> 16), (uint8_t)(m >> 24) };

	return verbs_send_msg(e, OFI_M_EPOCH, b, sizeof(b));
}

static int request_adv(struct vb_ep *e, struct vb_lane *vl, uint64_t seq, int slot, uint64_t total,
		       uint32_t epoch)
{
	struct ofi_adv_req q = { .seq = seq, .total = total, .epoch = epoch, .slot = (uint8_t)slot };
	uint8_t body[OFI_ADV_REQ_LEN];
	int rc;

	if (e->ntx_busy >= VB_NTX - 1) {
		return -EAGAIN;
	}
	ofi_adv_req_put(&q, body);
	rc = verbs_send_msg(e, OFI_M_ADV_REQ, body, sizeof(body));
	if (rc == 0) {
		ofi_adv_requested(&vl->adv, seq, slot, epoch, rh_now_ms());
	}
	return rc;
}

void verbs_prefetch_adverts(struct vb_ep *e, struct vb_lane *vl)
{
	struct rh_tx_peek pk[VB_PEEK];
	int n = rh_core_tx_peek(e->lane, pk, VB_PEEK);

	for (int i = 0; i < n; i++) {
		if (pk[i].size == 0 || pk[i].epoch < e->mark_sent ||
		    ofi_adv_lookup(&vl->adv, pk[i].seq, pk[i].slot, e->mark_sent) != OFI_ADV_NONE) {
			continue;
		}
		if (request_adv(e, vl, pk[i].seq, pk[i].slot, pk[i].size, pk[i].epoch) < 0) {
			return;
		}
	}
}

int verbs_pump_writes(struct vb_ep *e, struct vb_lane *vl, uint32_t m)
{
	int rc = 0;

	for (int i = 0; i < VB_NWR && rc == 0; i++) {
		struct vb_wr *w = &e->wr[i];

		if (w->state != VWR_WAIT) {
			continue;
		}
		if (w->h.epoch < m) {
			w->state = VWR_FREE; /* rule 2 */
			e->nwr_used--;
			continue;
		}
		switch (ofi_adv_lookup(&vl->adv, w->h.seq, w->h.slot, m)) {
		case OFI_ADV_VALID:
			if (ofi_adv_placed(&vl->adv, w->h.seq, w->h.slot,
					   w->h.off / rh_core_conn_chunk(e->conn))) {
				w->state = VWR_FREE; /* rule 4 */
				e->nwr_used--;
				verbs_ep_touch(e, 0);
				continue;
			}
			rc = post_write(e, vl, i);
			break;
		case OFI_ADV_NONE:
			rc = request_adv(e, vl, w->h.seq, w->h.slot, w->h.total, w->h.epoch);
			break;
		default:
			if (ofi_adv_overdue(&vl->adv, w->h.seq, w->h.slot, rh_now_ms(),
					    VB_ADV_WAIT_TIMEOUTS *
						    (uint64_t)rh_param.COMPLETION_TIMEOUT)) {
				return -ETIMEDOUT;
			}
			break;
		}
	}
	return rc == -EAGAIN ? 0 : rc;
}
