/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Connections and their lanes: creation and references, the io guard, adding, opening and
 * fencing lanes, the control-frame queue, and the services the core offers the transports
 * (core/lane_ops.h: stream attach/detach, NIC lookup, connection queries). The data path is
 * in data.c, failure handling in failover.c.
 */
/*
 * The data path of a connection: requests (isend/irecv/test), clear-to-send, chunk placement,
 * acknowledgements, control frames; transport callbacks. Failure handling is in failover.c.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "../log.h"
#include "../param.h"
#include "../probes.h"
#include "conn.h"
#include "health.h"
#include "sched.h"

struct rh_global rh_g = { .mu = PTHREAD_MUTEX_INITIALIZER };

uint64_t rh_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

uint64_t rh_now_ms(void)
{
	return rh_now_ns() / 1000000;
}

uint64_t rh_random_id(void)
{
	uint64_t v = 0;

	while (v == 0 || v == UINT64_MAX) {
		if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != sizeof(v)) {
			v = rh_now_ns() ^ (uint64_t)(uintptr_t)&v;
		}
	}
	return v;
}

struct rh_conn *rh_conn_new(bool is_send)
{
	struct rh_conn *c = calloc(1, sizeof(*c));

	if (!c) {
		return NULL;
	}
	pthread_mutex_init(&c->mu, NULL);
	atomic_init(&c->refs, 1);
	atomic_init(&c->active_io, 0);
	atomic_init(&c->closed, false);
	atomic_init(&c->ctrl_inflight, 0);
	c->is_send = is_send;
	c->chunk = (uint64_t)rh_param.CHUNK_SIZE;
	c->epoch = 1;
	c->rx_min_epoch = 0;
	c->fo.backoff_ms = (int)rh_param.FAILBACK_INTERVAL;
	c->next_lane_id = is_send ? 0 : 1;
	for (int i = 0; i < RH_RING * RH_MAX_RECVS; i++) {
		c->sreqs[i].r.kind = RH_REQ_SEND;
		c->sreqs[i].r.conn = c;
	}
	for (int i = 0; i < RH_RING; i++) {
		c->rreqs[i].r.kind = RH_REQ_RECV;
		c->rreqs[i].r.conn = c;
	}
	return c;
}

void rh_conn_get(struct rh_conn *c)
{
	atomic_fetch_add(&c->refs, 1);
}

void rh_rreq_free_bits(struct rh_rreq *q)
{
	for (int s = 0; s < RH_MAX_RECVS; s++) {
		free(q->bits[s]);
		q->bits[s] = NULL;
	}
}

void rh_core_conn_put(struct rh_conn *c)
{
	if (atomic_fetch_sub(&c->refs, 1) != 1) {
		return;
	}
	for (int i = 0; i < c->nlanes; i++) {
		free(c->lanes[i]);
	}
	for (int i = 0; i < RH_RING; i++) {
		rh_rreq_free_bits(&c->rreqs[i]);
	}
	free(c->ctrl);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

bool rh_core_io_enter(struct rh_conn *c)
{
	atomic_fetch_add(&c->active_io, 1);
	if (atomic_load(&c->closed)) {
		atomic_fetch_sub(&c->active_io, 1);
		return false;
	}
	return true;
}

void rh_core_io_exit(struct rh_conn *c)
{
	atomic_fetch_sub(&c->active_io, 1);
}

/* --- lanes --- */

struct rh_lane *rh_conn_add_lane(struct rh_conn *c, uint32_t id, int lnic, int rnic, int nstreams,
				 bool opener)
{
	struct rh_lane *l = NULL;
	int slot = -1;

	for (int i = 0; i < c->nlanes; i++) {
		/* dead, released by its transport, and no stream on its way to attach */
		if (c->lanes[i]->state == RH_LANE_DEAD && !c->lanes[i]->tp &&
		    !c->lanes[i]->attaching) {
			slot = i;
			break;
		}
	}
	if (slot < 0) {
		if (c->nlanes >= RH_MAX_LANES) {
			return NULL;
		}
		l = calloc(1, sizeof(*l));
		if (!l) {
			return NULL;
		}
		slot = c->nlanes++;
		c->lanes[slot] = l;
	}
	l = c->lanes[slot];
	memset(l, 0, sizeof(*l));
	l->conn = c;
	l->ops = rh_g.ops;
	l->id = id;
	l->lnic = lnic;
	l->rnic = rnic;
	l->state = RH_LANE_OPENING;
	l->nstreams = nstreams;
	l->opener = opener;
	l->weight = 1;
	l->primary = lnic == c->lnic_orig && rnic == c->rnic_orig;
	return l;
}

void rh_conn_local_hello(struct rh_conn *c, struct rh_hello *h)
{
	memset(h, 0, sizeof(*h));
	h->from_sender = c->is_send;
	h->chunk = (uint32_t)c->chunk;
	h->flags = rh_param.CHECKSUM ? RH_HELLO_F_PMAC : 0;
	h->nnics = rh_g.nnics;
	for (int i = 0; i < rh_g.nnics; i++) {
		const struct rh_nic *n = &rh_g.nics[i];

		h->nics[i].ipv4 = n->ipv4;
		h->nics[i].port = n->port;
		h->nics[i].rail = (int16_t)n->rail;
		h->nics[i].numa = (int16_t)n->numa;
		h->nics[i].up = __atomic_load_n(&n->up, __ATOMIC_RELAXED);
		memcpy(h->nics[i].pci, n->pci, sizeof(h->nics[i].pci));
	}
}

int rh_conn_open_lane(struct rh_conn *c, struct rh_lane *l, int kind, int timeout_ms)
{
	struct rh_hello h;
	const struct rh_peer_nic *r = &c->rnics[l->rnic];
	int rc;

	rh_conn_local_hello(c, &h);
	h.kind = (uint8_t)kind;
	h.nstreams = (uint8_t)l->nstreams;
	h.lane_id = l->id;
	/* only a connector founds a connection; the acceptor's remote_listen_id is 0 */
	h.listen_id = kind == RH_HELLO_CONN ? c->remote_listen_id : 0;
	h.src_nic = (int16_t)l->lnic;
	h.dst_nic = (int16_t)l->rnic;
	if (l->standby && kind == RH_HELLO_LANE) {
		h.flags |= RH_HELLO_F_STANDBY;
	}
	rc = rh_conn_sign_hello(c, l, &h);
	if (rc < 0) {
		return rc;
	}
	l->t_deadline_ms = rh_now_ms() + timeout_ms;
	INFO("conn %016llx: opening %slane %u %s -> peer NIC %d (%d streams, epoch %u)",
	     (unsigned long long)c->id, l->standby ? "standby " : "", l->id,
	     rh_g.nics[l->lnic].ifname, l->rnic, l->nstreams, c->epoch);
	return l->ops->open(l, &h, c->id, c->epoch, r->ipv4, r->port);
}

int rh_conn_start_connect(struct rh_conn *c)
{
	int lnic, rnic, rc;
	struct rh_lane *l;

	CHECK(rh_backup_initial_pair(c, &lnic, &rnic));
	l = rh_conn_add_lane(c, c->next_lane_id, lnic, rnic, (int)rh_param.STREAMS_PER_LANE, true);
	if (!l) {
		return -ENOMEM;
	}
	c->next_lane_id += 2;
	l->primary = true;
	c->lnic_orig = lnic;
	c->rnic_orig = rnic;
	c->connect_attempts++;
	rc = rh_conn_open_lane(c, l, RH_HELLO_CONN, 2000 + (int)rh_param.PROBE_TIMEOUT);
	if (rc < 0) {
		rh_conn_fence_lane(c, l); /* never opened: dead, its slot reusable */
	}
	return rc;
}

void rh_conn_lane_event(struct rh_conn *c, struct rh_lane *l, int type, int err,
			uint64_t duration_ns, uint64_t bytes_replayed)
{
	struct rh_lane_info info = { .bytes_replayed = bytes_replayed };
	int lnic = l ? l->lnic : c->lnic_orig, rnic = l ? l->rnic : c->rnic_orig;
	uint32_t rip;

	if (lnic < 0 || lnic >= rh_g.nnics) {
		return;
	}
	info.laddr = rh_g.nics[lnic].ipv4;
	if (rnic >= 0 && rnic < c->nrnics) {
		rip = ntohl(c->rnics[rnic].ipv4);
		info.raddr = c->rnics[rnic].ipv4;
		snprintf(info.rnic, sizeof(info.rnic), "%u.%u.%u.%u", rip >> 24, (rip >> 16) & 255,
			 (rip >> 8) & 255, rip & 255);
	}
	if (l && l->tp && l->ops->ports) {
		info.nports = l->ops->ports(l, info.lports, info.rports, 8);
	}
	if (type == RH_EVT_LANE_UP && l && l->standby) {
		/* a standby handshaken (idle), or promoted: it carries from now on */
		info.flags = l->state == RH_LANE_STANDBY ? RH_EVT_F_STANDBY :
							   RH_EVT_F_STANDBY | RH_EVT_F_PROMOTED;
	}
	rh_health_lane_event(type, c->id, c->epoch, l ? l->id : 0, lnic, err, duration_ns, &info);
}

void rh_conn_fence_lane(struct rh_conn *c, struct rh_lane *l)
{
	if (l->state == RH_LANE_DEAD) {
		return;
	}
	if (c->ready &&
	    (atomic_load(&c->closed) || (l->state == RH_LANE_DRAINING && l->bye_sent))) {
		/* closed on purpose (connection close, fail-back retirement) */
		rh_conn_lane_event(c, l, RH_EVT_LANE_DOWN, 0, 0, 0);
	}
	l->state = RH_LANE_DEAD;
	if (l->tp) {
		l->ops->fence(l);
	}
	if (c->ctrl_lane == l) {
		c->ctrl_lane = NULL;
		rh_conn_pick_ctrl_lane(c);
	}
}

struct rh_lane *rh_conn_lane_by_id(struct rh_conn *c, uint32_t id)
{
	for (int i = 0; i < c->nlanes; i++) {
		if (c->lanes[i]->id == id) {
			return c->lanes[i];
		}
	}
	return NULL;
}

int rh_conn_active_lanes(struct rh_conn *c)
{
	int n = 0;

	for (int i = 0; i < c->nlanes; i++) {
		n += c->lanes[i]->state == RH_LANE_ACTIVE;
	}
	return n;
}

/* Control frames go on stream 0 of one lane: the primary if active, else the first active. */
void rh_conn_pick_ctrl_lane(struct rh_conn *c)
{
	struct rh_lane *best = NULL;

	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *l = c->lanes[i];

		if (l->state != RH_LANE_ACTIVE && l->state != RH_LANE_DRAINING) {
			continue;
		}
		if (!best || (l->primary && !best->primary) ||
		    (l->state == RH_LANE_ACTIVE && best->state != RH_LANE_ACTIVE)) {
			best = l;
		}
	}
	c->ctrl_lane = best;
	if (best && c->ctrl_len) {
		best->ops->kick(best);
	}
}

void rh_conn_kick_data(struct rh_conn *c)
{
	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *l = c->lanes[i];

		if (l->state == RH_LANE_ACTIVE || l->state == RH_LANE_DRAINING) {
			l->ops->kick(l);
		}
	}
}

int rh_conn_queue_ctrl(struct rh_conn *c, struct rh_hdr *h, const uint8_t *p, size_t len)
{
	size_t need = c->ctrl_len + RH_HDR_LEN + len;

	if (need > c->ctrl_cap) {
		size_t cap = c->ctrl_cap ? c->ctrl_cap * 2 : 4096;
		uint8_t *n;

		while (cap < need) {
			cap *= 2;
		}
		n = realloc(c->ctrl, cap);
		if (!n) {
			return -ENOMEM;
		}
		c->ctrl = n;
		c->ctrl_cap = cap;
	}
	h->conn_id = c->id;
	h->epoch = c->epoch;
	h->len = (uint32_t)len;
	rh_hdr_put(h, c->ctrl + c->ctrl_len);
	if (len) {
		memcpy(c->ctrl + c->ctrl_len + RH_HDR_LEN, p, len);
	}
	c->ctrl_len = need;
	if (c->ctrl_lane) {
		c->ctrl_lane->ops->kick(c->ctrl_lane);
	}
	return 0;
}

/* Fatal: every request fails with err from now on. */
void rh_conn_fail(struct rh_conn *c, int err, const char *why)
{
	if (c->err) {
		return;
	}
	c->err = err;
	WARN("conn %016llx (%s): failing all requests: %s (%s)", (unsigned long long)c->id,
	     c->is_send ? "send" : "recv", why, strerror(-err));
	for (int i = 0; i < c->nlanes; i++) {
		rh_conn_fence_lane(c, c->lanes[i]);
	}
}

/* --- sender --- */

/* --- services for the transports (lane_ops.h) --- */

void rh_core_conn_get(struct rh_conn *c)
{
	rh_conn_get(c);
}

struct rh_nic *rh_core_nic(int nic)
{
	return &rh_g.nics[nic];
}

int rh_core_nic_count(void)
{
	return rh_g.nnics;
}

uint64_t rh_core_conn_id(const struct rh_conn *c)
{
	return c->id;
}

bool rh_core_conn_is_send(const struct rh_conn *c)
{
	return c->is_send;
}

uint64_t rh_core_conn_chunk(const struct rh_conn *c)
{
	return c->chunk;
}

bool rh_core_conn_closed(struct rh_conn *c)
{
	return atomic_load(&c->closed);
}

uint32_t rh_core_conn_epoch(struct rh_conn *c)
{
	return __atomic_load_n(&c->epoch, __ATOMIC_RELAXED);
}

uint32_t rh_core_conn_rx_min_epoch(struct rh_conn *c)
{
	return __atomic_load_n(&c->rx_min_epoch, __ATOMIC_ACQUIRE);
}

uint32_t rh_core_conn_resume_epoch(struct rh_conn *c)
{
	return __atomic_load_n(&c->resume_epoch, __ATOMIC_ACQUIRE);
}

int rh_core_stream_attach(struct rh_lane *lane, int idx, int max, void *s, size_t tp_size, bool io)
{
	struct rh_conn *c = lane->conn;
	struct rh_lane_streams *st;
	int rc = 0;

	pthread_mutex_lock(&c->mu);
	if (lane->attaching > 0) {
		lane->attaching--; /* rh_core_hello's hold on the slot ends here */
	}
	st = lane->tp;
	if (lane->state != RH_LANE_OPENING || idx < 0 || idx >= max || idx >= RH_LANE_MAX_STREAMS ||
	    idx >= lane->nstreams || (st && st->s[idx])) {
		rc = -EPROTO;
	} else if (io && !rh_core_io_enter(c)) {
		rc = -ECONNABORTED;
	} else if (!st && !(st = lane->tp = calloc(1, tp_size))) {
		if (io) {
			rh_core_io_exit(c);
		}
		rc = -ENOMEM;
	} else {
		st->s[idx] = s;
		st->live++;
	}
	pthread_mutex_unlock(&c->mu);
	if (rc < 0) {
		rh_core_conn_put(c);
	}
	return rc;
}

void rh_core_stream_detach(struct rh_conn *c, struct rh_lane *lane, int idx, void *s,
			   void (*release)(void *tp))
{
	pthread_mutex_lock(&c->mu);
	if (lane && lane->tp) {
		struct rh_lane_streams *st = lane->tp;

		if (idx >= 0 && idx < RH_LANE_MAX_STREAMS && st->s[idx] == s) {
			st->s[idx] = NULL;
			if (--st->live == 0) {
				lane->tp = NULL;
				if (release) {
					release(st);
				}
				free(st);
			}
		}
	}
	pthread_mutex_unlock(&c->mu);
	rh_core_conn_put(c);
}

bool rh_conn_epoch_take(struct rh_conn *c, uint32_t e)
{
	if (!rh_epoch_ok(c->epoch, e)) {
		return false;
	}
	if (e > c->epoch) {
		c->epoch = e;
	}
	return true;
}

int rh_conn_epoch_bump(struct rh_conn *c)
{
	if (c->epoch + 1 >= RH_EPOCH_LIMIT) {
		rh_conn_fail(c, -EOVERFLOW, "epoch space exhausted");
		return -EOVERFLOW;
	}
	c->epoch++;
	return 0;
}
