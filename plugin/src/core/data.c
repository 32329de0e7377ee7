/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The data path of a connection: requests (isend/irecv/test), clear-to-send, chunk placement,
 * acknowledgements, control frames (RESUME/BYE records); the transports' data callbacks.
 * Failure handling is in failover.c.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../log.h"
#include "../param.h"
#include "../probes.h"
#include "../rh.h"
#include "conn.h"
#include "health.h"
#include "sched.h"

static void sendq_push(struct rh_conn *c, struct rh_sreq *s)
{
	if (s->queued) {
		return;
	}
	s->queued = true;
	s->qnext = NULL;
	if (c->qtail) {
		c->qtail->qnext = s;
	} else {
		c->qhead = s;
	}
	c->qtail = s;
}

static void sendq_remove(struct rh_conn *c, struct rh_sreq *s)
{
	struct rh_sreq **pp = &c->qhead, *prev = NULL;

	if (!s->queued) {
		return;
	}
	while (*pp && *pp != s) {
		prev = *pp;
		pp = &(*pp)->qnext;
	}
	if (*pp) {
		*pp = s->qnext;
		if (c->qtail == s) {
			c->qtail = prev;
		}
	}
	s->queued = false;
	s->qnext = NULL;
}

static struct rh_sreq *sreq_at(struct rh_conn *c, uint64_t seq, int slot)
{
	return &c->sreqs[(seq % RH_RING) * RH_MAX_RECVS + slot];
}

/* Drop fully matched records at the front of the CTS ring. */
static void cts_advance(struct rh_conn *c)
{
	while (c->cts_base < c->cts_next) {
		struct rh_cts_slot *r = &c->cts[c->cts_base % RH_RING];
		uint8_t all = (uint8_t)((1u << r->cts.n) - 1);

		if (!r->present || (r->matched & all) != all) {
			break;
		}
		r->present = false;
		c->cts_base++;
	}
}

static void cts_store(struct rh_conn *c, const struct rh_cts *cts)
{
	struct rh_cts_slot *r;

	if (cts->seq < c->cts_base || cts->seq >= c->cts_base + RH_RING) {
		return; /* duplicate (already matched) or out of window */
	}
	r = &c->cts[cts->seq % RH_RING];
	if (r->present && r->cts.seq == cts->seq) {
		return;
	}
	r->cts = *cts;
	r->present = true;
	r->matched = 0;
	if (cts->seq + 1 > c->cts_next) {
		c->cts_next = cts->seq + 1;
	}
}

int rh_isend(void *comm, void *data, size_t size, int tag, void **request)
{
	struct rh_conn *c = comm;
	struct rh_cts_slot recs[RH_RING];
	struct rh_sreq *s;
	int n = 0, i, slot, rc = 0;

	*request = NULL;
	pthread_mutex_lock(&c->mu);
	if (c->err) {
		rc = c->err;
		goto out;
	}
	for (uint64_t q = c->cts_base; q < c->cts_next && n < RH_RING; q++) {
		recs[n] = c->cts[q % RH_RING];
		if (recs[n].present && recs[n].cts.seq != q) {
			recs[n].present = false;
		}
		n++;
	}
	i = rh_match_tag(recs, n, tag, &slot);
	if (i < 0) {
		goto out; /* receiver has not posted a matching buffer yet: try later */
	}
	s = sreq_at(c, c->cts_base + i, slot);
	if (s->used) {
		goto out; /* previous user of this slot not tested yet */
	}
	if (size > recs[i].cts.sizes[slot]) {
		WARN("send of %zu bytes to a %llu-byte receive (tag %d)", size,
		     (unsigned long long)recs[i].cts.sizes[slot], tag);
		rc = -EMSGSIZE;
		goto out;
	}
	c->cts[(c->cts_base + i) % RH_RING].matched |= (uint8_t)(1u << slot);
	memset(s, 0, sizeof(*s));
	s->r.kind = RH_REQ_SEND;
	s->r.conn = c;
	s->used = true;
	s->seq = c->cts_base + i;
	s->slot = slot;
	s->buf = data;
	s->size = size;
	s->nchunks = rh_sched_nchunks(size, c->chunk);
	s->gen = RH_GEN_NEW;
	s->t_start_ns = rh_now_ns();
	cts_advance(c);
	sendq_push(c, s);
	rh_conn_kick_data(c);
	*request = s;
out:
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* --- receiver --- */

/* True when no posted receive is waiting for data. */
static bool rreqs_all_complete(struct rh_conn *c)
{
	for (int i = 0; i < RH_RING; i++) {
		if (c->rreqs[i].used && !c->rreqs[i].complete) {
			return false;
		}
	}
	return true;
}

bool rh_conn_rx_waiting(struct rh_conn *c)
{
	return !c->is_send && !rreqs_all_complete(c);
}

int rh_irecv(void *comm, int n, void **data, const size_t *sizes, const int *tags, void **request)
{
	struct rh_conn *c = comm;
	struct rh_rreq *q;
	struct rh_cts cts;
	uint8_t buf[12 * RH_MAX_RECVS];
	struct rh_hdr h = { .type = RH_F_CTS };
	int rc = 0, len;

	*request = NULL;
	if (n < 1 || n > RH_MAX_RECVS) {
		return -EINVAL;
	}
	pthread_mutex_lock(&c->mu);
	if (c->err) {
		rc = c->err;
		goto out;
	}
	if (c->nrecv_out >= RH_MAX_RECV_OUT) {
		goto out; /* try later */
	}
	q = &c->rreqs[c->rx_next_seq % RH_RING];
	if (q->used) {
		goto out;
	}
	rh_rreq_free_bits(q);
	memset(q, 0, sizeof(*q));
	q->r.kind = RH_REQ_RECV;
	q->r.conn = c;
	q->seq = c->rx_next_seq;
	q->n = n;
	cts.seq = q->seq;
	cts.n = n;
	for (int s = 0; s < n; s++) {
		uint64_t nbits = rh_sched_nchunks(sizes[s], c->chunk);

		q->bufs[s] = data[s];
		q->sizes[s] = sizes[s];
		q->tags[s] = tags ? tags[s] : 0;
		q->total[s] = UINT64_MAX;
		q->bits[s] = calloc((nbits + 63) / 64, sizeof(uint64_t));
		if (!q->bits[s]) {
			rh_rreq_free_bits(q);
			rc = -ENOMEM;
			goto out;
		}
		cts.tags[s] = q->tags[s];
		cts.sizes[s] = sizes[s];
	}
	len = rh_cts_put(&cts, buf, sizeof(buf));
	h.seq = q->seq;
	h.aux = (uint32_t)n;
	rc = rh_conn_queue_ctrl(c, &h, buf, (size_t)len);
	if (rc < 0) {
		rh_rreq_free_bits(q);
		goto out;
	}
	q->used = true;
	q->t_start_ns = rh_now_ns();
	if (c->nrecv_out == 0 || rreqs_all_complete(c)) {
		c->t_rx_progress_ms = rh_now_ms();
	}
	c->rx_next_seq++;
	c->nrecv_out++;
	*request = q;
out:
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* List the runs of chunks already placed in the incomplete slots of r's receives, within
 * budget bytes of record, oldest receive first (it is the likeliest to be mostly placed). */
static void record_runs(struct rh_conn *c, struct rh_resume *r, size_t budget)
{
	for (int i = 0; i < r->nout; i++) {
		struct rh_rreq *q = &c->rreqs[r->out[i].seq % RH_RING];

		for (int k = 0; k < r->out[i].n; k++) {
			int max = (int)(budget / 8 < RH_RESUME_RUNS ? budget / 8 : RH_RESUME_RUNS);

			if ((r->done[i] & (1u << k)) || q->total[k] == UINT64_MAX || !q->bits[k] ||
			    max == 0) {
				continue;
			}
			r->nruns[i][k] = (uint8_t)rh_sched_runs_from_bits(
				q->bits[k], rh_sched_nchunks(q->total[k], c->chunk), r->runs[i][k],
				max);
			budget -= 8 * (size_t)r->nruns[i][k];
		}
	}
}

/* Encode the receiver's completion record (next sequence + incomplete receives with the
 * chunks they already hold). */
static int build_record(struct rh_conn *c, uint8_t *buf, size_t cap, int ndead,
			const uint32_t *dead)
{
	struct rh_resume *r = calloc(1, sizeof(*r));
	size_t base;
	int len;

	if (!r) {
		return -ENOMEM;
	}
	r->next_seq = c->rx_next_seq;
	r->ndead = ndead;
	if (ndead > 0) {
		memcpy(r->dead, dead, sizeof(uint32_t) * (size_t)ndead);
	}
	for (uint64_t s = c->rx_next_seq >= RH_RING ? c->rx_next_seq - RH_RING : 0;
	     s < c->rx_next_seq; s++) {
		struct rh_rreq *q = &c->rreqs[s % RH_RING];

		if (!q->used || q->seq != s || q->complete) {
			continue;
		}
		r->out[r->nout].seq = s;
		r->out[r->nout].n = q->n;
		for (int k = 0; k < q->n; k++) {
			r->out[r->nout].tags[k] = q->tags[k];
			r->out[r->nout].sizes[k] = q->sizes[k];
		}
		r->done[r->nout] = q->done_mask;
		r->nout++;
	}
	base = rh_resume_base_len(r);
	if (base < cap) {
		record_runs(c, r, cap - base);
	}
	len = rh_resume_put(r, buf, cap);
	free(r);
	return len;
}

int rh_conn_queue_resume(struct rh_conn *c, bool answer)
{
	struct rh_hdr h = { .type = RH_F_RESUME, .aux = answer ? RH_RESUME_ANSWER : 0 };
	uint8_t *buf = malloc(RH_CTRL_MAX);
	int len, rc;

	if (!buf) {
		return -ENOMEM;
	}
	len = build_record(c, buf, RH_CTRL_MAX, c->fo.ndead, c->fo.dead);
	if (len < 0) {
		free(buf);
		return len;
	}
	/* Everything older than this epoch that is still in flight is dropped: the sender
	 * replays the chunks of unacknowledged messages the record does not list as placed,
	 * with the new epoch. */
	c->rx_min_epoch = c->epoch;
	rc = rh_conn_queue_ctrl(c, &h, buf, (size_t)len);
	free(buf);
	c->fo.ndead = 0;
	return rc;
}

/* BYE for the whole connection; a receiver appends its completion record so acknowledgements
 * lost with a failed lane are not lost for good when it closes. */
int rh_conn_queue_bye(struct rh_conn *c)
{
	struct rh_hdr h = { .type = RH_F_BYE, .aux = UINT32_MAX };
	uint8_t *buf;
	int len = 0, rc;

	if (c->is_send) {
		return rh_conn_queue_ctrl(c, &h, NULL, 0);
	}
	buf = malloc(RH_CTRL_MAX);
	if (!buf) {
		return -ENOMEM;
	}
	len = build_record(c, buf, RH_CTRL_MAX, 0, NULL);
	rc = rh_conn_queue_ctrl(c, &h, buf, len > 0 ? (size_t)len : 0);
	free(buf);
	return rc;
}

/* Sender: apply a closing receiver's record: what it completed is acknowledged. */
static void apply_bye_record(struct rh_conn *c, const struct rh_hdr *h, const uint8_t *p)
{
	struct rh_resume *r;

	if (!h->len) {
		return;
	}
	r = malloc(sizeof(*r));
	if (!r) {
		rh_conn_fail(c, -ENOMEM, "no memory to apply the closing receiver's record");
		return;
	}
	if (rh_resume_get(p, h->len, r) == 0) {
		for (int i = 0; i < RH_RING * RH_MAX_RECVS; i++) {
			struct rh_sreq *s = &c->sreqs[i];
			int k;

			if (s->used && !s->acked && rh_resume_confirms(r, s, &k)) {
				s->acked = true;
				sendq_remove(c, s);
				rh_marks_replay_progress(c, s, true);
			}
		}
	}
	free(r);
}

static void rreq_check_slot(struct rh_conn *c, struct rh_rreq *q, int s, int lane)
{
	struct rh_hdr ack = { .type = RH_F_ACK };

	if ((q->done_mask & (1u << s)) || q->total[s] == UINT64_MAX || q->got[s] != q->total[s] ||
	    q->writers[s]) {
		return;
	}
	q->done_mask |= (uint8_t)(1u << s);
	ack.seq = q->seq;
	ack.slot = (uint8_t)s;
	ack.total = q->total[s];
	rh_conn_queue_ctrl(c, &ack, NULL, 0);
	if (q->done_mask == (uint8_t)((1u << q->n) - 1)) {
		uint64_t bytes = 0;

		q->complete = true;
		for (int k = 0; k < q->n; k++) {
			RH_PROBE3(req_done, lane, q->total[k], rh_now_ns() - q->t_start_ns);
			bytes += q->total[k];
		}
		rh_marks_completed(c, bytes);
	}
}

/* A frame that disagrees with what this side posted or knows: the lane it came on is failed
 * (the sender replays on the others); the user's receive is neither completed nor failed. */
static void bad_frame(struct rh_conn *c, struct rh_lane *l, const struct rh_hdr *h, const char *why)
{
	WARN("conn %016llx: lane %u: %s frame (seq %llu slot %u off %llu len %u total %llu epoch "
	     "%u) %s: failing the lane",
	     (unsigned long long)c->id, l->id, h->type == RH_F_DATA ? "DATA" : "control",
	     (unsigned long long)h->seq, h->slot, (unsigned long long)h->off, h->len,
	     (unsigned long long)h->total, h->epoch, why);
	rh_fo_lane_failed(c, l, -EPROTO, "protocol violation");
}

/* Checks a DATA frame against the receive this side posted (locked). NULL: the frame is
 * fine, *q is its receive or NULL when the frame is stale (an older epoch, a replay of a
 * placed chunk or of a completed receive: dropped quietly). Else the violation. */
static const char *check_data(struct rh_conn *c, const struct rh_hdr *h, struct rh_rreq **qp)
{
	struct rh_rreq *q = &c->rreqs[h->seq % RH_RING];
	uint64_t idx, off, len;

	*qp = NULL;
	if (h->conn_id != c->id) {
		return "names another connection";
	}
	if (h->epoch > c->epoch) {
		return "is of a future epoch";
	}
	if (h->seq >= c->rx_next_seq) {
		return "is for a receive never posted";
	}
	if (h->epoch < c->rx_min_epoch) {
		return NULL;
	}
	if (!q->used || q->seq != h->seq || q->complete) {
		return NULL; /* completed (a late copy); the ring slot may be reused already */
	}
	if (h->slot >= q->n) {
		return "names a slot the receive does not have";
	}
	if (h->total > q->sizes[h->slot]) {
		return "is larger than the posted buffer";
	}
	if (q->total[h->slot] != UINT64_MAX && q->total[h->slot] != h->total) {
		return "disagrees with the message size of earlier chunks";
	}
	idx = h->off / c->chunk;
	if (!rh_sched_chunk(h->total, c->chunk, idx, &off, &len) || off != h->off ||
	    len != h->len) {
		return "is not a chunk of the message";
	}
	if ((q->done_mask & (1u << h->slot)) ||
	    (q->bits[h->slot][idx / 64] & (1ull << (idx % 64)))) {
		return NULL; /* already placed (replay) */
	}
	*qp = q;
	return NULL;
}

void *rh_core_rx_data(struct rh_lane *l, const struct rh_hdr *h, bool *counted)
{
	struct rh_conn *c = l->conn;
	struct rh_rreq *q;
	void *dst = NULL;
	const char *why;

	*counted = false;
	pthread_mutex_lock(&c->mu);
	if (c->is_send || atomic_load(&c->closed) || l->state == RH_LANE_DEAD) {
		goto out;
	}
	rh_standby_answered(c, l);
	if (l->state == RH_LANE_STANDBY) {
		rh_standby_peer_sent(c, l, "the peer sent data on it");
	}
	why = check_data(c, h, &q);
	if (why) {
		bad_frame(c, l, h, why);
		goto out;
	}
	if (!q) {
		goto out;
	}
	q->total[h->slot] = h->total;
	q->writers[h->slot]++;
	*counted = true;
	dst = q->bufs[h->slot] + h->off;
	if (h->len == 0) {
		dst = q->bufs[h->slot] ? q->bufs[h->slot] : (void *)q;
	}
out:
	pthread_mutex_unlock(&c->mu);
	return dst;
}

void rh_core_rx_data_done(struct rh_lane *l, const struct rh_hdr *h, bool counted, bool ok)
{
	struct rh_conn *c = l->conn;
	struct rh_rreq *q;
	uint64_t idx = h->off / c->chunk;

	if (!counted) {
		return;
	}
	pthread_mutex_lock(&c->mu);
	q = &c->rreqs[h->seq % RH_RING];
	q->writers[h->slot]--;
	if (ok && !(q->bits[h->slot][idx / 64] & (1ull << (idx % 64)))) {
		q->bits[h->slot][idx / 64] |= 1ull << (idx % 64);
		q->got[h->slot] += h->len;
		c->t_rx_progress_ms = rh_now_ms();
	}
	rreq_check_slot(c, q, h->slot, (int)l->id);
	pthread_mutex_unlock(&c->mu);
}

int rh_core_rx_buffer(struct rh_lane *l, uint64_t seq, int slot, uint32_t epoch, char **buf,
		      uint64_t *size, uint64_t *placed, uint32_t max_words, uint32_t *nwords)
{
	uint64_t words;
	struct rh_conn *c = l->conn;
	struct rh_rreq *q;
	int rc = -ENOENT;

	pthread_mutex_lock(&c->mu);
	if (c->is_send || atomic_load(&c->closed) || l->state == RH_LANE_DEAD) {
		goto out;
	}
	rh_standby_answered(c, l);
	if (l->state == RH_LANE_STANDBY) {
		rh_standby_peer_sent(c, l, "the peer asked for an advert on it");
	}
	if (epoch < c->rx_min_epoch) {
		rc = -ESTALE;
		goto out;
	}
	q = &c->rreqs[seq % RH_RING];
	if (!q->used || q->seq != seq || q->complete || slot < 0 || slot >= q->n ||
	    (q->done_mask & (1u << slot))) {
		goto out;
	}
	words = (rh_sched_nchunks(q->sizes[slot], c->chunk) + 63) / 64;
	if (words > max_words) {
		rc = -E2BIG;
		goto out;
	}
	memcpy(placed, q->bits[slot], 8 * words);
	*nwords = (uint32_t)words;
	*buf = q->bufs[slot];
	*size = q->sizes[slot];
	rc = 0;
out:
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int rh_core_tx_peek(struct rh_lane *l, struct rh_tx_peek *out, int max)
{
	struct rh_conn *c = l->conn;
	int n = 0;

	pthread_mutex_lock(&c->mu);
	if (!c->is_send || c->await_resume || c->err || atomic_load(&c->closed)) {
		goto out;
	}
	for (struct rh_sreq *s = c->qhead; s && n < max; s = s->qnext) {
		if (!rh_sched_lane_may_carry(l->state, l->retire_gen, s->gen)) {
			continue;
		}
		out[n].seq = s->seq;
		out[n].slot = s->slot;
		out[n].size = s->size;
		out[n].epoch = c->epoch;
		n++;
	}
out:
	pthread_mutex_unlock(&c->mu);
	return n;
}

/* --- transmit --- */

static size_t copy_ctrl(struct rh_conn *c, uint8_t *out, size_t cap)
{
	size_t o = 0;

	while (o < c->ctrl_len) {
		struct rh_hdr h;
		size_t flen;

		rh_hdr_get(c->ctrl + o, &h);
		flen = RH_HDR_LEN + h.len;
		if (o + flen > cap) {
			break;
		}
		o += flen;
	}
	memcpy(out, c->ctrl, o);
	atomic_fetch_add(&c->ctrl_inflight, o);
	memmove(c->ctrl, c->ctrl + o, c->ctrl_len - o);
	c->ctrl_len -= o;
	return o;
}

/* The plan's byte shares (sched.h): may lane l take a DATA chunk now? Locked. */
static bool share_gate(struct rh_conn *c, struct rh_lane *l)
{
	uint64_t taken[RH_MAX_LANES];
	uint32_t share[RH_MAX_LANES];
	int n = 0;

	if (!l->share || l->state != RH_LANE_ACTIVE) {
		return true;
	}
	for (int i = 0; i < c->nlanes && n < RH_MAX_LANES; i++) {
		struct rh_lane *o = c->lanes[i];

		if (o != l && o->share && o->state == RH_LANE_ACTIVE) {
			taken[n] = o->share_bytes;
			share[n] = o->share;
			n++;
		}
	}
	if (l->share_bytes == 0 && n) {
		/* joining lanes that carried bytes already: start level with the slowest */
		l->share_bytes = rh_sched_share_start(l->share, taken, share, n);
	}
	if (rh_sched_share_ok(l->share_bytes, l->share, taken, share, n, 2 * c->chunk)) {
		return true;
	}
	l->share_wait = true;
	return false;
}

/* Lane l took len bytes under its share: wake the lanes the gate held back. Locked. */
static void share_taken(struct rh_conn *c, struct rh_lane *l, uint64_t len)
{
	l->share_bytes += len ? len : 1;
	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *o = c->lanes[i];

		if (o->share_wait && o != l) {
			o->share_wait = false;
			if (o->state == RH_LANE_ACTIVE) {
				o->ops->kick(o);
			}
		}
	}
}

int rh_core_next_tx(struct rh_lane *l, int stream, uint8_t *ctrl, size_t cap, struct rh_tx *tx)
{
	struct rh_conn *c = l->conn;
	int rc = 0;

	pthread_mutex_lock(&c->mu);
	if (l->state != RH_LANE_ACTIVE && l->state != RH_LANE_DRAINING &&
	    l->state != RH_LANE_SUSPECT) {
		goto out;
	}
	if ((stream == 0 || stream == RH_STREAM_CTRL_ONLY) && c->ctrl_lane == l && c->ctrl_len) {
		tx->ctrl_len = copy_ctrl(c, ctrl, cap);
		tx->is_data = false;
		rc = tx->ctrl_len > 0;
		goto out;
	}
	if (stream == RH_STREAM_CTRL_ONLY || !c->is_send || c->await_resume || c->err ||
	    atomic_load(&c->closed)) {
		goto out;
	}
	if (!share_gate(c, l)) {
		goto out;
	}
	for (struct rh_sreq *s = c->qhead; s; s = s->qnext) {
		struct rh_hdr h = { .type = RH_F_DATA };
		uint64_t off, len;

		if (!rh_sched_lane_may_carry(l->state, l->retire_gen, s->gen)) {
			continue;
		}
		if (s->gen == RH_GEN_NEW) {
			s->gen = c->gen;
		}
		rh_sched_chunk(s->size, c->chunk, s->next_chunk, &off, &len);
		s->next_chunk = rh_sched_skip_placed(s->skip, s->nskip, s->next_chunk + 1);
		if (s->next_chunk >= s->nchunks) {
			sendq_remove(c, s);
			rh_marks_replay_progress(c, s, false);
		}
		h.conn_id = c->id;
		h.epoch = c->epoch;
		h.seq = s->seq;
		h.slot = (uint8_t)s->slot;
		h.off = off;
		h.len = (uint32_t)len;
		h.total = s->size;
		rh_hdr_put(&h, tx->hdr);
		tx->payload = s->buf + off;
		tx->len = len;
		tx->is_data = true;
		if (l->share) {
			share_taken(c, l, len);
		}
		tx->ctrl_len = 0;
		rc = 1;
		break;
	}
out:
	if (rc == 1 && l->await_post) {
		rh_marks_first_post(c, l, tx->is_data);
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* --- control frames --- */

static void on_ack(struct rh_conn *c, const struct rh_hdr *h, int lane)
{
	struct rh_sreq *s = sreq_at(c, h->seq, h->slot);

	if (!s->used || s->seq != h->seq || s->slot != h->slot || s->acked) {
		return;
	}
	s->acked = true;
	sendq_remove(c, s);
	if (c->fo.report_pending) {
		rh_marks_first_completion(c);
	}
	RH_PROBE3(req_done, lane, s->size, rh_now_ns() - s->t_start_ns);
	rh_marks_replay_progress(c, s, true);
	rh_marks_completed(c, s->size);
}

void rh_core_rx_ctrl(struct rh_lane *l, const struct rh_hdr *h, const uint8_t *p)
{
	struct rh_conn *c = l->conn;

	pthread_mutex_lock(&c->mu);
	if (l->state == RH_LANE_DEAD) {
		goto out;
	}
	if (h->conn_id != c->id) {
		bad_frame(c, l, h, "names another connection");
		goto out;
	}
	if (!rh_epoch_ok(c->epoch, h->epoch)) {
		bad_frame(c, l, h, "has an epoch out of bounds");
		goto out;
	}
	rh_standby_answered(c, l);
	if (l->state == RH_LANE_STANDBY) {
		/* the peer promoted it (a control frame goes on its control lane only) */
		rh_standby_peer_sent(c, l, "the peer sent a control frame on it");
	}
	switch (h->type) {
	case RH_F_CTS: {
		struct rh_cts cts;

		if (c->is_send && rh_cts_get(p, h->len, (int)h->aux, &cts) == 0) {
			cts.seq = h->seq;
			cts_store(c, &cts);
		}
		break;
	}
	case RH_F_ACK:
		if (c->is_send) {
			on_ack(c, h, (int)l->id);
		}
		break;
	case RH_F_RESUME:
		if (c->is_send && rh_resume_apply(c, h, p) == -ENOMEM) {
			rh_conn_fail(c, -ENOMEM, "no memory to apply the receiver's RESUME");
		}
		break;
	case RH_F_FAILREQ:
		if (!c->is_send) {
			rh_resume_on_failreq(c, h, p);
		}
		break;
	case RH_F_BYE:
		if (h->aux == UINT32_MAX) {
			c->peer_closed = true;
			if (c->is_send) {
				apply_bye_record(c, h, p);
			}
			INFO("conn %016llx: peer closed", (unsigned long long)c->id);
			break;
		}
		for (int i = 0; i < c->nlanes; i++) {
			if (c->lanes[i]->id == h->aux && c->lanes[i]->state != RH_LANE_DEAD) {
				INFO("conn %016llx: lane %u retired by peer",
				     (unsigned long long)c->id, h->aux);
				rh_conn_fence_lane(c, c->lanes[i]);
			}
		}
		break;
	default:
		break;
	}
out:
	pthread_mutex_unlock(&c->mu);
}

/* --- test --- */

int rh_test(void *request, int *done, int *sizes)
{
	struct rh_req *r = request;
	struct rh_conn *c = r->conn;
	int rc = 0;

	*done = 0;
	pthread_mutex_lock(&c->mu);
	if (r->kind == RH_REQ_SEND) {
		struct rh_sreq *s = (struct rh_sreq *)r;

		if (s->acked) {
			*done = 1;
			if (sizes) {
				sizes[0] = s->size > INT_MAX ? INT_MAX : (int)s->size;
			}
			s->used = false;
		} else if (c->err) {
			rc = c->err;
		}
	} else if (r->kind == RH_REQ_RECV) {
		struct rh_rreq *q = (struct rh_rreq *)r;

		if (q->err) {
			rc = q->err;
		} else if (q->complete) {
			*done = 1;
			for (int s = 0; sizes && s < q->n; s++) {
				sizes[s] = q->total[s] > INT_MAX ? INT_MAX : (int)q->total[s];
			}
			q->used = false;
			c->nrecv_out--;
			rh_rreq_free_bits(q);
		} else if (c->err) {
			rc = c->err;
		}
	} else {
		rc = -EINVAL;
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

void rh_core_ctrl_written(struct rh_lane *l, size_t len)
{
	atomic_fetch_sub(&l->conn->ctrl_inflight, len);
}
