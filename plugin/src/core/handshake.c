/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Lane handshakes, as the transports report them: a peer's hello (a new connection on a
 * listener, or a new lane of a live one) proven with the connection secret (auth.c), the
 * opener's check of the reply, then the lane's streams coming up, failing or closing. Every
 * function takes the registry lock before a connection's lock (conn.h's order).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../log.h"
#include "../param.h"
#include "../probes.h"
#include "auth.h"
#include "conn.h"
#include "fmac.h"
#include "health.h"

static void set_remote_table(struct rh_conn *c, const struct rh_hello *h)
{
	c->nrnics = h->nnics;
	for (int i = 0; i < h->nnics; i++) {
		c->rnics[i] = h->nics[i];
	}
}

/* A refused hello is logged at most once a second (a stranger can send many). */
static void refuse(const struct rh_hdr *hdr, const struct rh_hello *h, const char *why)
{
	static uint64_t last_ms;
	static unsigned quiet;
	uint64_t now = rh_now_ms();

	if (now - __atomic_load_n(&last_ms, __ATOMIC_RELAXED) < 1000) {
		__atomic_add_fetch(&quiet, 1, __ATOMIC_RELAXED);
		return;
	}
	__atomic_store_n(&last_ms, now, __ATOMIC_RELAXED);
	WARN("refused a %s hello naming conn %016llx lane %u: %s (%u more refused in the last "
	     "second)",
	     h->kind == RH_HELLO_CONN  ? "connection" :
	     h->kind == RH_HELLO_PROBE ? "probe" :
					 "lane",
	     (unsigned long long)hdr->conn_id, h->lane_id, why,
	     __atomic_exchange_n(&quiet, 0, __ATOMIC_RELAXED));
}

static bool listen_seen(const struct rh_listen *ls, uint64_t id)
{
	for (unsigned i = 0; i < RH_LISTEN_SEEN && i < ls->nseen; i++) {
		if (ls->seen[i] == id) {
			return true;
		}
	}
	return false;
}

/* Lane ids of one side share a parity and only grow; streams of one lane repeat its id. */
static bool peer_lane_fresh(const struct rh_conn *c, uint32_t id)
{
	uint32_t k = id >> 1;

	if (!c->peer_lane_any || k > c->peer_lane_max) {
		return true;
	}
	return c->peer_lane_max - k < 64 && !(c->peer_lane_seen & (1ull << (c->peer_lane_max - k)));
}

static void peer_lane_mark(struct rh_conn *c, uint32_t id)
{
	uint32_t k = id >> 1;

	if (!c->peer_lane_any) {
		c->peer_lane_any = true;
		c->peer_lane_max = k;
		c->peer_lane_seen = 1;
	} else if (k > c->peer_lane_max) {
		uint32_t d = k - c->peer_lane_max;

		c->peer_lane_seen = (d >= 64 ? 0 : c->peer_lane_seen << d) | 1;
		c->peer_lane_max = k;
	} else {
		c->peer_lane_seen |= 1ull << (c->peer_lane_max - k);
	}
}

/* The listener's record of connection id (made when create; its oldest is reused). */
static struct rh_listen_rec *listen_rec(struct rh_listen *ls, uint64_t id, bool create)
{
	struct rh_listen_rec *r;

	for (unsigned i = 0; i < RH_LISTEN_SEEN && i < ls->nrec; i++) {
		if (ls->rec[i].conn_id == id) {
			return &ls->rec[i];
		}
	}
	if (!create) {
		return NULL;
	}
	r = &ls->rec[ls->nrec++ % RH_LISTEN_SEEN];
	memset(r, 0, sizeof(*r));
	r->conn_id = id;
	return r;
}

/* After peer_lane_mark: the listener's record follows the connection's (while the listener is
 * open: once NCCL closed it, no hello can re-found the connection, so no record is needed). */
static void listen_rec_update(struct rh_conn *c)
{
	struct rh_listen *ls = c->listen_id ? rh_listen_find(c->listen_id) : NULL;
	struct rh_listen_rec *r = ls ? listen_rec(ls, c->id, true) : NULL;

	if (r) {
		r->any = c->peer_lane_any;
		r->max = c->peer_lane_max;
		r->seen = c->peer_lane_seen;
	}
}

static int lane_slot(const struct rh_conn *c, const struct rh_lane *l)
{
	for (int i = 0; i < c->nlanes; i++) {
		if (c->lanes[i] == l) {
			return i;
		}
	}
	return -1;
}

/* Sign the hello that opens lane l (conn.c calls this from rh_conn_open_lane). */
int rh_conn_sign_hello(struct rh_conn *c, struct rh_lane *l, struct rh_hello *h)
{
	int slot = lane_slot(c, l), rc;

	if (slot < 0) {
		return -EINVAL;
	}
	if (h->kind == RH_HELLO_CONN) {
		memcpy(c->lane_nonce[slot], c->conn_nonce[0], RH_NONCE_LEN);
	} else if ((rc = rh_auth_random(c->lane_nonce[slot], RH_NONCE_LEN)) < 0) {
		return rc;
	}
	return rh_core_sign_stream(l, h);
}

int rh_core_sign_stream(struct rh_lane *l, struct rh_hello *h)
{
	struct rh_conn *c = l->conn;
	int slot = lane_slot(c, l), rc;

	if (slot < 0) {
		return -EINVAL;
	}
	memcpy(h->nonce, c->lane_nonce[slot], RH_NONCE_LEN);
	if ((rc = rh_auth_random(h->snonce, RH_NONCE_LEN)) < 0) {
		return rc;
	}
	if (h->kind == RH_HELLO_CONN) {
		return rh_auth_sign(c->key, h, false, c->id, c->epoch, NULL, NULL);
	}
	if (!c->have_nonces) {
		return -EAGAIN;
	}
	return rh_auth_sign(c->key, h, false, c->id, c->epoch, c->conn_nonce[0], c->conn_nonce[1]);
}

static void probe_nonce(uint64_t cookie, uint8_t *nonce)
{
	memset(nonce, 0, RH_NONCE_LEN);
	memcpy(nonce, &cookie, sizeof(cookie)); /* a random 64-bit value per probe */
}

int rh_core_probe_hello(struct rh_conn *c, uint64_t cookie, struct rh_hello *h, uint64_t *conn_id)
{
	memset(h, 0, sizeof(*h));
	h->kind = RH_HELLO_PROBE;
	h->from_sender = c->is_send;
	probe_nonce(cookie, h->nonce);
	*conn_id = c->id;
	if (!c->have_nonces) {
		return -EAGAIN;
	}
	return rh_auth_sign(c->key, h, false, c->id, 0, c->conn_nonce[0], c->conn_nonce[1]);
}

bool rh_core_probe_answer(const struct rh_hdr *hdr, const struct rh_hello *in,
			  struct rh_hello *reply)
{
	struct rh_conn *c;
	bool ok = false;

	memset(reply, 0, sizeof(*reply));
	reply->kind = RH_HELLO_PROBE;
	reply->nstreams = 1;
	pthread_mutex_lock(&rh_g.mu);
	c = rh_registry_find(hdr->conn_id, !in->from_sender);
	if (c) {
		pthread_mutex_lock(&c->mu);
		ok = c->have_nonces && !c->err && !atomic_load(&c->closed) &&
		     rh_auth_verify(c->key, in, false, c->id, 0, c->conn_nonce[0],
				    c->conn_nonce[1]) &&
		     rh_auth_sign(c->key, reply, true, c->id, 0, in->nonce, NULL) == 0;
		pthread_mutex_unlock(&c->mu);
	}
	pthread_mutex_unlock(&rh_g.mu);
	if (!ok) {
		refuse(hdr, in, "a probe that does not prove a live connection's secret");
	}
	return ok;
}

bool rh_core_probe_check(struct rh_conn *c, uint64_t cookie, const struct rh_hello *reply)
{
	uint8_t nonce[RH_NONCE_LEN];
	bool ok;

	probe_nonce(cookie, nonce);
	pthread_mutex_lock(&c->mu);
	ok = reply->kind == RH_HELLO_PROBE &&
	     rh_auth_verify(c->key, reply, true, c->id, 0, nonce, NULL);
	pthread_mutex_unlock(&c->mu);
	return ok;
}

/* An incoming HELLO_CONN: the connection it names (created on its first proven hello). */
static struct rh_conn *hello_conn(const struct rh_hdr *hdr, const struct rh_hello *h)
{
	struct rh_listen_rec *rec;
	struct rh_listen *ls;
	struct rh_conn *c;

	ls = h->listen_id ? rh_listen_find(h->listen_id) : NULL;
	if (!ls) {
		refuse(hdr, h, "no such listener");
		return NULL;
	}
	if (!rh_auth_verify(ls->secret, h, false, hdr->conn_id, hdr->epoch, NULL, NULL)) {
		refuse(hdr, h, "no proof of the connection secret");
		return NULL;
	}
	c = rh_registry_find(hdr->conn_id, false);
	if (c) {
		if (c->listen_id != ls->id ||
		    !rh_auth_equal(c->conn_nonce[0], h->nonce, RH_NONCE_LEN)) {
			refuse(hdr, h, "another connection's hello");
			return NULL;
		}
		/* another stream, or a retried first lane (the connector may pick another pair):
		 * its NIC indices index our tables too */
		if (h->dst_nic < 0 || h->dst_nic >= rh_g.nnics || h->src_nic < 0 ||
		    h->src_nic >= c->nrnics) {
			refuse(hdr, h, "bad NIC index");
			return NULL;
		}
		return c;
	}
	if (listen_seen(ls, hdr->conn_id)) {
		refuse(hdr, h, "replay of a finished connection's hello");
		return NULL;
	}
	if (h->dst_nic < 0 || h->dst_nic >= rh_g.nnics || h->src_nic < 0 ||
	    h->src_nic >= h->nnics || h->chunk < 4096 || h->chunk > (64u << 20) ||
	    !rh_epoch_ok(1, hdr->epoch)) {
		refuse(hdr, h, "bad NIC index, chunk size or epoch");
		return NULL;
	}
	c = rh_conn_new(false);
	if (!c) {
		return NULL;
	}
	c->id = hdr->conn_id;
	c->listen_id = ls->id;
	c->dev = ls->dev;
	c->lnic_orig = h->dst_nic;
	c->rnic_orig = h->src_nic;
	c->chunk = h->chunk;
	memcpy(c->key, ls->secret, RH_SECRET_LEN);
	memcpy(c->conn_nonce[0], h->nonce, RH_NONCE_LEN);
	if (rh_auth_random(c->conn_nonce[1], RH_NONCE_LEN) < 0) {
		rh_core_conn_put(c);
		return NULL;
	}
	c->have_nonces = true;
	rec = listen_rec(ls, c->id, true); /* re-founded: the lane ids seen before still count */
	c->peer_lane_any = rec->any;
	c->peer_lane_max = rec->max;
	c->peer_lane_seen = rec->seen;
	set_remote_table(c, h);
	rh_registry_add(c);
	return c;
}

struct rh_lane *rh_core_hello(const struct rh_hdr *hdr, const struct rh_hello *h,
			      struct rh_hello *reply)
{
	struct rh_conn *c = NULL;
	struct rh_lane *l = NULL;

	pthread_mutex_lock(&rh_g.mu);
	if (h->kind == RH_HELLO_CONN) {
		c = hello_conn(hdr, h);
		if (!c) {
			goto out;
		}
	} else if (h->kind == RH_HELLO_LANE) {
		c = rh_registry_find(hdr->conn_id, !h->from_sender);
		if (!c || !c->have_nonces) {
			refuse(hdr, h, "no such connection");
			c = NULL;
			goto out;
		}
		if (!rh_auth_verify(c->key, h, false, hdr->conn_id, hdr->epoch, c->conn_nonce[0],
				    c->conn_nonce[1])) {
			refuse(hdr, h, "no proof of the connection secret");
			c = NULL;
			goto out;
		}
		if (h->dst_nic < 0 || h->dst_nic >= rh_g.nnics || h->src_nic < 0 ||
		    h->src_nic >= c->nrnics) {
			c = NULL;
			goto out;
		}
	} else {
		goto out;
	}
	pthread_mutex_lock(&c->mu);
	if (atomic_load(&c->closed) || c->err) {
		pthread_mutex_unlock(&c->mu);
		goto out;
	}
	if (!rh_epoch_ok(c->epoch, hdr->epoch)) {
		refuse(hdr, h, "epoch out of bounds");
		pthread_mutex_unlock(&c->mu);
		goto out;
	}
	for (int i = 0; i < c->nlanes; i++) {
		if (c->lanes[i]->id == h->lane_id && c->lanes[i]->state == RH_LANE_OPENING &&
		    !c->lanes[i]->opener) {
			l = c->lanes[i];
		}
	}
	if (h->nstreams < 1 || h->stream >= h->nstreams || (l && h->nstreams != l->nstreams)) {
		/* the count and index are under the MAC: a stream names its lane's size */
		refuse(hdr, h, "stream index or count does not match its lane");
		l = NULL;
	} else if (!l && !peer_lane_fresh(c, h->lane_id)) {
		refuse(hdr, h, "lane id already used (a replayed hello)");
	} else if (!l) {
		l = rh_conn_add_lane(c, h->lane_id, h->dst_nic, h->src_nic, h->nstreams, false);
		if (l) {
			/* a warm standby: no data lane until a move (or the peer) promotes it */
			l->standby = h->kind == RH_HELLO_LANE && (h->flags & RH_HELLO_F_STANDBY);
			peer_lane_mark(c, h->lane_id);
			listen_rec_update(c);
			/* Primary means the connection's original pair (our own record, from the
			 * founding hello). An extra lane on that pair takes the role only when no
			 * live lane has it (the peer's fail-back), never beside the real one. */
			for (int i = 0; i < c->nlanes && l->primary && h->kind == RH_HELLO_LANE;
			     i++) {
				struct rh_lane *o = c->lanes[i];

				if (o != l && o->primary && o->state != RH_LANE_DEAD) {
					l->primary = false;
				}
			}
			l->t_deadline_ms = rh_now_ms() + (h->kind == RH_HELLO_CONN ? 2000 : 200) +
					   2 * (uint64_t)rh_param.PROBE_TIMEOUT;
		}
	}
	if (l) {
		rh_conn_epoch_take(c, hdr->epoch);
		rh_conn_get(c);
		l->attaching++; /* until the caller's rh_core_stream_attach (rh_conn_add_lane) */
		rh_conn_local_hello(c, reply);
		reply->kind = h->kind;
		reply->lane_id = h->lane_id;
		reply->nstreams = h->nstreams;
		reply->stream = h->stream;
		reply->src_nic = h->dst_nic;
		reply->dst_nic = h->src_nic;
		if (h->kind == RH_HELLO_CONN) {
			memcpy(reply->nonce, c->conn_nonce[1], RH_NONCE_LEN);
		}
		if (rh_auth_random(reply->snonce, RH_NONCE_LEN) < 0 ||
		    rh_auth_sign(c->key, reply, true, c->id, 0, h->nonce, NULL) < 0) {
			memset(reply->mac, 0, sizeof(reply->mac)); /* the opener refuses it */
		}
	}
	pthread_mutex_unlock(&c->mu);
out:
	pthread_mutex_unlock(&rh_g.mu);
	return l;
}

int rh_core_sign_reply(struct rh_lane *l, const struct rh_hello *in, struct rh_hello *reply)
{
	struct rh_conn *c = l->conn;

	if (reply->tp_len > RH_HELLO_TP_MAX) {
		return -EINVAL;
	}
	return rh_auth_sign(c->key, reply, true, c->id, 0, in->nonce, NULL);
}

/* The opener's side: the reply must prove the secret too, and answer our nonce. */
static const char *check_reply(struct rh_conn *c, struct rh_lane *l, const struct rh_hello *r)
{
	int slot = lane_slot(c, l);

	if (slot < 0 || !rh_auth_verify(c->key, r, true, c->id, 0, c->lane_nonce[slot], NULL)) {
		return "the peer's reply does not prove the connection secret";
	}
	if (r->kind == RH_HELLO_CONN) {
		if (!c->have_nonces) {
			memcpy(c->conn_nonce[1], r->nonce, RH_NONCE_LEN);
			c->have_nonces = true;
		} else if (!rh_auth_equal(c->conn_nonce[1], r->nonce, RH_NONCE_LEN)) {
			return "the peer's reply names another connection";
		}
	}
	return NULL;
}

void rh_core_stream_answered(struct rh_lane *l)
{
	struct rh_conn *c = l->conn;

	pthread_mutex_lock(&c->mu);
	if (l->state == RH_LANE_OPENING && l->opener && !l->answered) {
		l->answered = true;
		INFO("conn %016llx: lane %u: the peer answered", (unsigned long long)c->id, l->id);
	}
	pthread_mutex_unlock(&c->mu);
}

void rh_core_stream_ready(struct rh_lane *l, const struct rh_hello *reply)
{
	struct rh_conn *c = l->conn;
	struct rh_listen *ls = NULL;

	pthread_mutex_lock(&rh_g.mu);
	pthread_mutex_lock(&c->mu);
	if (l->state != RH_LANE_OPENING) {
		goto out;
	}
	if (reply) {
		const char *why = check_reply(c, l, reply);

		if (why) {
			rh_fo_lane_failed(c, l, -EACCES, why);
			goto out;
		}
		/* The acceptor's full NIC table (the handle has at most RH_HANDLE_NICS): taken
		 * from the reply that founds the connection only, never from a later lane. */
		if (!c->ready && reply->kind == RH_HELLO_CONN && reply->nnics) {
			set_remote_table(c, reply);
		}
	}
	if (++l->nready < l->nstreams) {
		goto out;
	}
	l->state = l->standby && c->ready ? RH_LANE_STANDBY : RH_LANE_ACTIVE;
	RH_PROBE4(lane_up, c->id, l->id, l->lnic, l->rnic);
	rh_conn_lane_event(c, l, RH_EVT_LANE_UP, 0, 0, 0);
	INFO("conn %016llx (%s): lane %u up %s -> peer NIC %d%s", (unsigned long long)c->id,
	     c->is_send ? "send" : "recv", l->id, rh_g.nics[l->lnic].ifname, l->rnic,
	     l->primary			 ? " (primary)" :
	     l->state == RH_LANE_STANDBY ? " (standby)" :
					   "");
	if (l->state == RH_LANE_STANDBY) {
		rh_fo_standby_up(c, l);
	} else if (!c->ready) {
		c->ready = true;
		rh_conn_pick_ctrl_lane(c);
		ls = !c->is_send && c->listen_id ? rh_listen_find(c->listen_id) : NULL;
		if (!c->is_send && !ls) {
			rh_conn_fail(c, -ECONNABORTED, "listener closed before accept");
		}
	} else {
		rh_fo_lane_up(c, l);
	}
	if (ls) {
		ls->seen[ls->nseen++ % RH_LISTEN_SEEN] = c->id;
		if (ls->ready_tail) {
			ls->ready_tail->lnext = c;
		} else {
			ls->ready_head = c;
		}
		ls->ready_tail = c;
	}
out:
	pthread_mutex_unlock(&c->mu);
	pthread_mutex_unlock(&rh_g.mu);
}

int rh_core_frame_key(struct rh_lane *l, int stream, const uint8_t *nonce_open,
		      const uint8_t *nonce_acc, struct rh_fmac *f)
{
	struct rh_conn *c = l->conn;
	uint8_t key[RH_SECRET_LEN];
	uint64_t id;
	int rc;

	pthread_mutex_lock(&c->mu);
	memcpy(key, c->key, RH_SECRET_LEN);
	id = c->id;
	pthread_mutex_unlock(&c->mu);
	/* lane id, stream count and side are fixed once the lane exists */
	rc = rh_fmac_init(f, key, id, l->id, stream, l->nstreams, nonce_open, nonce_acc, l->opener);
	memset(key, 0, sizeof(key));
	return rc;
}

void rh_core_lane_error(struct rh_lane *l, int err)
{
	struct rh_conn *c = l->conn;

	pthread_mutex_lock(&c->mu);
	if (l->state != RH_LANE_DEAD) {
		rh_fo_lane_failed(c, l, err, "transport error");
	}
	pthread_mutex_unlock(&c->mu);
}

void rh_core_stream_eof(struct rh_lane *l)
{
	struct rh_conn *c = l->conn;

	pthread_mutex_lock(&c->mu);
	if (l->state != RH_LANE_DEAD && ++l->neof >= l->nstreams) {
		if (c->peer_closed || (l->state == RH_LANE_DRAINING && l->bye_sent)) {
			rh_conn_fence_lane(c, l);
		} else {
			rh_fo_lane_failed(c, l, -ECONNRESET, "peer closed the lane");
		}
	}
	pthread_mutex_unlock(&c->mu);
}

void rh_core_probe_done(struct rh_conn *c, uint64_t cookie, bool ok)
{
	pthread_mutex_lock(&c->mu);
	rh_fo_probe_done(c, cookie, ok);
	pthread_mutex_unlock(&c->mu);
}
