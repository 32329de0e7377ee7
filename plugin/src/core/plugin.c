/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Process-wide setup and connection establishment: the plugin's lifecycle (start at the first
 * init, stop when nobody uses it any more), devices, listen, the resumable connect/accept
 * state machines, lane handshakes, close.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../log.h"
#include "../param.h"
#include "../probes.h"
#include "../rh.h"
#include "auth.h"
#include "conn.h"
#include "health.h"
#include "sched.h"

static void registry_del(struct rh_conn *c);

/*
 * Lifecycle. The plugin runs (ticker, transport I/O threads, lane listeners, the agent link)
 * while someone uses it: a context (ncclNet v11+: init .. finalize), a listen comm or a send/
 * recv comm handed to the host. Tables without finalize (v8..v10) hold it from init until
 * their last comm and listener are closed. When nothing holds it any more it stops: every
 * thread is joined, every descriptor closed, every connection released and the host's logger
 * forgotten, so the host may dlclose the library (NCCL does when its last communicator using
 * the plugin is finalized) and a later init starts from scratch.
 */
static pthread_mutex_t life_mu = PTHREAD_MUTEX_INITIALIZER;
static bool running;
static int nctx; /* live contexts (v11+) */
static int nobj; /* listen comms and send/recv comms held by the host */
static int legacy; /* init through a table without finalize: held until nobj drops to 0 */
static ncclDebugLogger_t host_logger; /* the last logger a v8..v10 init passed */

static int start_locked(void)
{
	int rc;

	if (running) {
		return 0;
	}
	rc = rh_params_load();
	if (rc < 0) {
		return rc;
	}
	rc = rh_nic_discover(rh_g.nics, RH_MAX_NICS);
	if (rc < 0) {
		return rc;
	}
	rh_g.nnics = rc;
	rh_health_reset();
	rh_health_poll_carrier(); /* a NIC already down at start is never advertised or used */
	rh_g.ops = rh_lanes_choose();
	if (!rh_g.ops) {
		return -EPROTONOSUPPORT;
	}
	rc = rh_g.ops->start((int)rh_param.NTHREADS);
	if (rc < 0) {
		if (rh_g.ops->stop) {
			rh_g.ops->stop();
		}
		return rc;
	}
	for (int i = 0; i < rh_g.nnics; i++) {
		rc = rh_g.ops->listen(i);
		if (rc < 0) {
			WARN("cannot listen on %s: %s", rh_g.nics[i].ifname, strerror(-rc));
			if (rh_g.ops->stop) {
				rh_g.ops->stop();
			}
			return rc;
		}
	}
	if (rh_param.CHECKSUM) {
		INFO_ENV("RAILHOP_CHECKSUM=1: a CRC32C (%s) of every DATA chunk sent on TCP lanes",
			 rh_crc32c_impl());
	}
	rc = rh_health_start_ticker();
	if (rc < 0) {
		if (rh_g.ops->stop) {
			rh_g.ops->stop();
		}
		return rc;
	}
	running = true;
	INFO_INIT("initialised: %d NIC(s), %s lanes, %lld I/O thread(s)", rh_g.nnics,
		  rh_g.ops->name, (long long)rh_param.NTHREADS);
	return 0;
}

static void stop_locked(void)
{
	struct rh_conn *list[RH_SNAPSHOT_MAX];
	int n;

	if (!running) {
		return;
	}
	if (!rh_g.ops->stop) {
		return; /* a transport that cannot stop keeps running (the library stays mapped) */
	}
	rh_health_stop_ticker();
	/* What is left in the registry was never handed to the host (half-open, abandoned
	 * connects) or was closed and waits for its BYE: fence it, drop the registry's
	 * reference; the transport's streams hold theirs until it stops below. */
	do {
		pthread_mutex_lock(&rh_g.mu);
		for (n = 0; rh_g.conns && n < RH_SNAPSHOT_MAX; n++) {
			struct rh_conn *c = rh_g.conns;

			pthread_mutex_lock(&c->mu);
			registry_del(c);
			atomic_store(&c->closed, true);
			if (!c->err) {
				c->err = -ESHUTDOWN;
			}
			for (int i = 0; i < c->nlanes; i++) {
				rh_conn_fence_lane(c, c->lanes[i]);
			}
			pthread_mutex_unlock(&c->mu);
			list[n] = c;
		}
		pthread_mutex_unlock(&rh_g.mu);
		for (int i = 0; i < n; i++) {
			rh_core_conn_put(list[i]);
		}
	} while (n == RH_SNAPSHOT_MAX);
	rh_g.ops->stop(); /* joins the I/O threads; the last connection references go */
	rh_health_shutdown();
	running = false;
	INFO_INIT("stopped: no context, comm or listener left");
	rh_log_clear();
}

/* Drop one hold (nctx or nobj already decremented); stop when none is left. */
static void release_locked(void)
{
	if (nobj == 0) {
		legacy = 0;
	}
	if (nctx == 0 && nobj == 0 && legacy == 0) {
		stop_locked();
	}
}

int rh_init(ncclDebugLogger_t logger)
{
	int rc;

	pthread_mutex_lock(&life_mu);
	rh_log_set(logger);
	if (logger) {
		host_logger = logger;
	}
	rc = start_locked();
	if (rc == 0) {
		legacy = 1;
	}
	pthread_mutex_unlock(&life_mu);
	return rc;
}

int rh_init_ctx(ncclDebugLogger_t logger)
{
	int rc;

	pthread_mutex_lock(&life_mu);
	rh_log_set(logger);
	rc = start_locked();
	if (rc == 0) {
		nctx++;
	}
	pthread_mutex_unlock(&life_mu);
	return rc;
}

void rh_finalize_ctx(void)
{
	pthread_mutex_lock(&life_mu);
	if (nctx > 0) {
		nctx--;
		release_locked();
	}
	pthread_mutex_unlock(&life_mu);
}

bool rh_running(void)
{
	bool r;

	pthread_mutex_lock(&life_mu);
	r = running;
	pthread_mutex_unlock(&life_mu);
	return r;
}

/* Make sure the plugin runs (a v8..v10 host listening or connecting again after its last comm
 * was closed starts it again) and, with count, count one more comm held by the host. */
static int hold(bool count)
{
	int rc = 0;

	pthread_mutex_lock(&life_mu);
	if (!running && host_logger) {
		rh_log_set(host_logger);
		rc = start_locked();
		legacy = rc == 0;
	}
	if (rc == 0 && !running) {
		rc = -ESHUTDOWN; /* used without init, or after finalize */
	}
	if (rc == 0 && count) {
		nobj++;
	}
	pthread_mutex_unlock(&life_mu);
	return rc;
}

static void release(void)
{
	pthread_mutex_lock(&life_mu);
	if (nobj > 0) {
		nobj--;
		release_locked();
	}
	pthread_mutex_unlock(&life_mu);
}

int rh_devices(int *ndev)
{
	*ndev = rh_g.nnics;
	return 0;
}

int rh_get_props(int dev, struct rh_props *p)
{
	if (dev < 0 || dev >= rh_g.nnics) {
		return -EINVAL;
	}
	p->name = rh_g.nics[dev].ifname;
	p->pci = rh_g.nics[dev].pci[0] ? rh_g.nics[dev].pci : NULL;
	p->guid = (uint64_t)dev;
	p->speed = rh_g.nics[dev].speed;
	p->rail = rh_g.nics[dev].rail;
	p->max_recvs = RH_MAX_RECVS_ADVERTISED;
	p->max_comms = 65536;
	return 0;
}

int rh_listen(int dev, void *handle, void **listen_comm)
{
	struct rh_listen *l;
	struct rh_handle h = { 0 };
	int rc;

	*listen_comm = NULL;
	if (dev < 0 || dev >= rh_g.nnics) {
		return -EINVAL;
	}
	rc = hold(true);
	if (rc < 0) {
		return rc;
	}
	l = calloc(1, sizeof(*l));
	if (!l) {
		release();
		return -ENOMEM;
	}
	l->dev = dev;
	if (rh_auth_random(l->secret, sizeof(l->secret)) < 0) {
		WARN("getrandom failed: no connection secret for the listener");
		free(l);
		return -EIO;
	}
	memcpy(h.secret, l->secret, sizeof(h.secret));
	pthread_mutex_lock(&rh_g.mu);
	l->id = rh_random_id();
	l->next = rh_g.listens;
	rh_g.listens = l;
	pthread_mutex_unlock(&rh_g.mu);
	h.nnics = (uint8_t)(rh_g.nnics < RH_HANDLE_NICS ? rh_g.nnics : RH_HANDLE_NICS);
	h.listen_nic = (uint8_t)(dev < RH_HANDLE_NICS ? dev : 0);
	h.listen_id = l->id;
	for (int i = 0; i < h.nnics; i++) {
		h.nics[i].ipv4 = rh_g.nics[i].ipv4;
		h.nics[i].port = rh_g.nics[i].port;
		h.nics[i].rail = (int8_t)rh_g.nics[i].rail;
		h.nics[i].up = __atomic_load_n(&rh_g.nics[i].up, __ATOMIC_RELAXED);
	}
	rh_handle_put(&h, handle);
	*listen_comm = l;
	return 0;
}

static void registry_add(struct rh_conn *c)
{
	c->gnext = rh_g.conns;
	rh_g.conns = c;
	c->registered = true;
}

static void registry_del(struct rh_conn *c)
{
	for (struct rh_conn **pp = &rh_g.conns; *pp; pp = &(*pp)->gnext) {
		if (*pp == c) {
			*pp = c->gnext;
			c->registered = false;
			return;
		}
	}
}

int rh_registry_snapshot(struct rh_conn **list)
{
	int n = 0;

	pthread_mutex_lock(&rh_g.mu);
	for (struct rh_conn *c = rh_g.conns; c && n < RH_SNAPSHOT_MAX; c = c->gnext) {
		rh_conn_get(c);
		list[n++] = c;
	}
	pthread_mutex_unlock(&rh_g.mu);
	return n;
}

static struct rh_conn *registry_find(uint64_t id, bool is_send)
{
	for (struct rh_conn *c = rh_g.conns; c; c = c->gnext) {
		if (c->id == id && c->is_send == is_send) {
			return c;
		}
	}
	return NULL;
}

int rh_conn_start_connect(struct rh_conn *c)
{
	int lnic, rnic;
	struct rh_lane *l;

	CHECK(rh_fo_initial_pair(c, &lnic, &rnic));
	l = rh_conn_add_lane(c, c->next_lane_id, lnic, rnic, (int)rh_param.STREAMS_PER_LANE, true);
	if (!l) {
		return -ENOMEM;
	}
	c->next_lane_id += 2;
	l->primary = true;
	c->lnic_orig = lnic;
	c->rnic_orig = rnic;
	c->connect_attempts++;
	return rh_conn_open_lane(c, l, RH_HELLO_CONN, 2000 + (int)rh_param.PROBE_TIMEOUT);
}

int rh_connect(int dev, void *handle, void **send_comm)
{
	uint8_t *hb = handle;
	struct rh_conn *c = NULL, *it;
	struct rh_handle h;
	uint64_t cookie;
	bool ready = false;
	int rc = 0;

	*send_comm = NULL;
	memcpy(&cookie, hb + RH_HANDLE_COOKIE_OFF, sizeof(cookie));
	if (cookie == 0) {
		if (dev < 0 || dev >= rh_g.nnics) {
			WARN("bad device %d", dev);
			return -EINVAL;
		}
		if (rh_handle_get(hb, &h) < 0) {
			WARN("bad connect handle (or one from another railhop wire protocol: every "
			     "rank must load the same plugin build)");
			return -EINVAL;
		}
		rc = hold(false);
		if (rc < 0) {
			return rc;
		}
		c = rh_conn_new(true);
		if (!c) {
			return -ENOMEM;
		}
		c->id = rh_random_id();
		memcpy(c->key, h.secret, sizeof(c->key));
		if (rh_auth_random(c->conn_nonce[0], RH_NONCE_LEN) < 0) {
			rh_core_conn_put(c);
			return -EIO;
		}
		c->dev = dev;
		c->lnic_orig = dev;
		c->rnic_orig = h.listen_nic;
		c->remote_listen_id = h.listen_id; /* carried in the first hello */
		c->nrnics = h.nnics;
		for (int i = 0; i < h.nnics; i++) {
			c->rnics[i].ipv4 = h.nics[i].ipv4;
			c->rnics[i].port = h.nics[i].port;
			c->rnics[i].rail = h.nics[i].rail;
			c->rnics[i].numa = -1;
			c->rnics[i].up = true;
			if (!h.nics[i].up) {
				/* The listener's side knew this NIC was down: avoid it for now. */
				for (int l = 0; l < RH_MAX_NICS; l++) {
					c->fo.bad_until_ms[l][i] =
						rh_now_ms() + (uint64_t)rh_param.FAILBACK_INTERVAL;
				}
			}
		}
		c->t_connect_deadline_ms = rh_now_ms() + 30000;
		pthread_mutex_lock(&rh_g.mu);
		pthread_mutex_lock(&c->mu);
		registry_add(c);
		rc = rh_conn_start_connect(c);
		pthread_mutex_unlock(&c->mu);
		if (rc < 0) {
			registry_del(c);
		}
		pthread_mutex_unlock(&rh_g.mu);
		if (rc < 0) {
			rh_core_conn_put(c);
			return rc;
		}
		cookie = (uint64_t)(uintptr_t)c;
		memcpy(hb + RH_HANDLE_COOKIE_OFF, &cookie, sizeof(cookie));
		return 0;
	}
	pthread_mutex_lock(&rh_g.mu);
	for (it = rh_g.conns; it; it = it->gnext) {
		if ((uint64_t)(uintptr_t)it == cookie) {
			c = it;
			break;
		}
	}
	pthread_mutex_unlock(&rh_g.mu);
	if (!c) {
		WARN("connect handle refers to an unknown connection");
		return -EINVAL;
	}
	pthread_mutex_lock(&c->mu);
	if (c->ready) {
		ready = true;
	} else if (c->err) {
		rc = c->err;
	} else if (rh_now_ms() > c->t_connect_deadline_ms) {
		rc = -ETIMEDOUT;
	}
	pthread_mutex_unlock(&c->mu);
	if (ready && hold(true) == 0) { /* not under c->mu: the lifecycle lock comes first */
		*send_comm = c;
		memset(hb + RH_HANDLE_COOKIE_OFF, 0, sizeof(cookie));
	}
	if (rc < 0) {
		memset(hb + RH_HANDLE_COOKIE_OFF, 0, sizeof(cookie));
		pthread_mutex_lock(&rh_g.mu);
		pthread_mutex_lock(&c->mu);
		registry_del(c);
		atomic_store(&c->closed, true);
		for (int i = 0; i < c->nlanes; i++) {
			rh_conn_fence_lane(c, c->lanes[i]);
		}
		pthread_mutex_unlock(&c->mu);
		pthread_mutex_unlock(&rh_g.mu);
		rh_core_conn_put(c);
	}
	return rc;
}

int rh_accept(void *listen_comm, void **recv_comm)
{
	struct rh_listen *l = listen_comm;
	struct rh_conn *c;

	*recv_comm = NULL;
	pthread_mutex_lock(&rh_g.mu);
	c = l->ready_head;
	if (c) {
		l->ready_head = c->lnext;
		if (!l->ready_head) {
			l->ready_tail = NULL;
		}
		c->lnext = NULL;
		c->accepted = true;
		*recv_comm = c;
	}
	pthread_mutex_unlock(&rh_g.mu);
	if (c && hold(true) < 0) {
		/* cannot happen: the listener holds the plugin running */
		rh_core_conn_put(c);
		*recv_comm = NULL;
		return -ESHUTDOWN;
	}
	return 0;
}

/* What a registration handle remembers for a transport that caches registrations. */
struct rh_mr {
	void *data;
	size_t size;
};

int rh_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle)
{
	struct rh_mr *m;

	(void)comm;
	if (type != NCCL_PTR_HOST) {
		return -EOPNOTSUPP;
	}
	/* Host memory needs no registration for TCP lanes; an RDMA transport registers on the
	 * lanes that actually carry traffic (lazily, when traffic moves there) and only needs
	 * to hear when the buffer goes away. */
	if (!rh_g.ops || !rh_g.ops->forget) {
		*mhandle = (void *)(uintptr_t)0x1;
		return 0;
	}
	m = malloc(sizeof(*m));
	if (!m) {
		return -ENOMEM;
	}
	m->data = data;
	m->size = size;
	*mhandle = m;
	return 0;
}

int rh_dereg_mr(void *comm, void *mhandle)
{
	struct rh_mr *m = mhandle;

	(void)comm;
	if (!m || mhandle == (void *)(uintptr_t)0x1) {
		return 0;
	}
	if (rh_g.ops && rh_g.ops->forget) {
		rh_g.ops->forget(m->data, m->size);
	}
	free(m);
	return 0;
}

static void close_conn(struct rh_conn *c)
{
	uint64_t spin = 0;

	pthread_mutex_lock(&rh_g.mu);
	pthread_mutex_lock(&c->mu);
	registry_del(c);
	atomic_store(&c->closed, true);
	if (!c->err && c->ctrl_lane) {
		/* Best effort: tell the peer so its lane EOFs are not taken for failures. The
		 * lanes are fenced by the ticker shortly after (never waiting on a dead lane). */
		rh_conn_queue_bye(c);
		c->fo.t_close_ms = rh_now_ms() + 100;
		rh_conn_get(c);
		registry_add(c); /* kept for the ticker; closed conns are not found by hellos */
	} else {
		for (int i = 0; i < c->nlanes; i++) {
			rh_conn_fence_lane(c, c->lanes[i]);
		}
	}
	pthread_mutex_unlock(&c->mu);
	pthread_mutex_unlock(&rh_g.mu);
	/* Give the last ACKs and the BYE a moment to leave on healthy lanes (bounded: a dead
	 * lane never holds close up for more than 50 ms). */
	for (uint64_t end = rh_now_ms() + 50;;) {
		struct timespec ts = { 0, 200 * 1000 };
		bool flushed;

		pthread_mutex_lock(&c->mu);
		flushed = (c->ctrl_len == 0 && atomic_load(&c->ctrl_inflight) == 0) ||
			  !c->ctrl_lane || c->err;
		pthread_mutex_unlock(&c->mu);
		if (flushed || rh_now_ms() >= end) {
			break;
		}
		nanosleep(&ts, NULL);
	}
	/* No transport thread may touch user memory once we return. */
	while (atomic_load(&c->active_io)) {
		if (++spin > 1000) {
			sched_yield();
		}
	}
	rh_core_conn_put(c);
}

int rh_close_send(void *send_comm)
{
	close_conn(send_comm);
	release();
	return 0;
}

int rh_close_recv(void *recv_comm)
{
	close_conn(recv_comm);
	release();
	return 0;
}

int rh_close_listen(void *listen_comm)
{
	struct rh_listen *l = listen_comm, *drop;

	pthread_mutex_lock(&rh_g.mu);
	for (struct rh_listen **pp = &rh_g.listens; *pp; pp = &(*pp)->next) {
		if (*pp == l) {
			*pp = l->next;
			break;
		}
	}
	drop = l;
	pthread_mutex_unlock(&rh_g.mu);
	/* Connections established but never accepted are closed with the listener. */
	while (drop->ready_head) {
		struct rh_conn *c = drop->ready_head;

		drop->ready_head = c->lnext;
		close_conn(c);
	}
	/* Pending (not yet ready) connections of this listener: nobody can accept them any
	 * more. Fail them so the ticker drops them (they would leak otherwise). */
	pthread_mutex_lock(&rh_g.mu);
	for (struct rh_conn *c = rh_g.conns; c; c = c->gnext) {
		if (c->listen == l && !c->accepted) {
			pthread_mutex_lock(&c->mu);
			c->listen = NULL;
			rh_conn_fail(c, -ECONNABORTED, "listener closed before accept");
			pthread_mutex_unlock(&c->mu);
		}
	}
	pthread_mutex_unlock(&rh_g.mu);
	free(l);
	release();
	return 0;
}

/* --- transport callbacks: handshakes and lane state --- */

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
	     h->kind == RH_HELLO_CONN ? "connection" : "lane", (unsigned long long)hdr->conn_id,
	     h->lane_id, why, __atomic_exchange_n(&quiet, 0, __ATOMIC_RELAXED));
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
	memcpy(h->nonce, c->lane_nonce[slot], RH_NONCE_LEN);
	if (h->kind == RH_HELLO_CONN) {
		return rh_auth_sign(c->key, h, false, c->id, c->epoch, NULL, NULL);
	}
	if (!c->have_nonces) {
		return -EAGAIN;
	}
	return rh_auth_sign(c->key, h, false, c->id, c->epoch, c->conn_nonce[0], c->conn_nonce[1]);
}

/* An incoming HELLO_CONN: the connection it names (created on its first proven hello). */
static struct rh_conn *hello_conn(const struct rh_hdr *hdr, const struct rh_hello *h)
{
	struct rh_listen *ls;
	struct rh_conn *c;

	for (ls = rh_g.listens; ls; ls = ls->next) {
		if (ls->id == h->listen_id) {
			break;
		}
	}
	if (!ls) {
		refuse(hdr, h, "no such listener");
		return NULL;
	}
	if (!rh_auth_verify(ls->secret, h, false, hdr->conn_id, hdr->epoch, NULL, NULL)) {
		refuse(hdr, h, "no proof of the connection secret");
		return NULL;
	}
	c = registry_find(hdr->conn_id, false);
	if (c) {
		if (c->listen != ls || !rh_auth_equal(c->conn_nonce[0], h->nonce, RH_NONCE_LEN)) {
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
	c->listen = ls;
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
	set_remote_table(c, h);
	registry_add(c);
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
		c = registry_find(hdr->conn_id, !h->from_sender);
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
	if (!l && !peer_lane_fresh(c, h->lane_id)) {
		refuse(hdr, h, "lane id already used (a replayed hello)");
	} else if (!l) {
		l = rh_conn_add_lane(c, h->lane_id, h->dst_nic, h->src_nic, h->nstreams, false);
		if (l) {
			peer_lane_mark(c, h->lane_id);
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
		if (rh_auth_sign(c->key, reply, true, c->id, 0, h->nonce, NULL) < 0) {
			memset(reply->mac, 0, sizeof(reply->mac)); /* the opener refuses it */
		}
	}
	pthread_mutex_unlock(&c->mu);
out:
	pthread_mutex_unlock(&rh_g.mu);
	return l;
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

void rh_core_stream_ready(struct rh_lane *l, const struct rh_hello *reply)
{
	struct rh_conn *c = l->conn;
	bool push = false;

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
	l->state = RH_LANE_ACTIVE;
	RH_PROBE4(lane_up, c->id, l->id, l->lnic, l->rnic);
	rh_conn_lane_event(c, l, RH_EVT_LANE_UP, 0, 0, 0);
	INFO("conn %016llx (%s): lane %u up %s -> peer NIC %d%s", (unsigned long long)c->id,
	     c->is_send ? "send" : "recv", l->id, rh_g.nics[l->lnic].ifname, l->rnic,
	     l->primary ? " (primary)" : "");
	if (!c->ready) {
		c->ready = true;
		rh_conn_pick_ctrl_lane(c);
		push = !c->is_send && c->listen;
		if (!c->is_send && !c->listen) {
			rh_conn_fail(c, -ECONNABORTED, "listener closed before accept");
		}
	} else {
		rh_fo_lane_up(c, l);
	}
	if (push) {
		struct rh_listen *ls = c->listen;

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

/* --- the ticker's sweep over the connections (core/health.c runs it every 20 ms) --- */

void rh_registry_tick(uint64_t now)
{
	struct rh_conn *list[RH_SNAPSHOT_MAX];
	int n = rh_registry_snapshot(list);

	for (int i = 0; i < n; i++) {
		struct rh_conn *c = list[i];
		bool drop = false;

		pthread_mutex_lock(&rh_g.mu);
		pthread_mutex_lock(&c->mu);
		if (atomic_load(&c->closed)) {
			if (c->registered &&
			    (c->ctrl_len == 0 || now >= c->fo.t_close_ms || !c->ctrl_lane)) {
				/* BYE flushed (or deadline): fence and drop the close ref. */
				for (int k = 0; k < c->nlanes; k++) {
					rh_conn_fence_lane(c, c->lanes[k]);
				}
				registry_del(c);
				drop = true;
			}
		} else {
			rh_fo_tick(c, now);
			if (c->err && !c->is_send && c->registered && !c->accepted &&
			    (!c->ready || !c->listen)) {
				/* half-open incoming connection, or one its listener will never
				 * hand out */
				registry_del(c);
				drop = true;
			}
		}
		pthread_mutex_unlock(&c->mu);
		pthread_mutex_unlock(&rh_g.mu);
		if (drop) {
			rh_core_conn_put(c);
		}
		rh_core_conn_put(c);
	}
}
