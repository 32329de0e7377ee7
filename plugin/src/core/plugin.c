/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Process-wide setup and connection establishment: the plugin's lifecycle (start at the first
 * init, stop when nobody uses it any more), devices, listen, the resumable connect/accept
 * state machines, close, and the connection registry. The lane handshakes are in handshake.c.
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

/* Start everything in order; a failure unwinds what started (the transport's stop also
 * closes the listeners it opened). */
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
	rc = rh_transport_start();
	if (rc < 0) {
		return rc;
	}
	rc = rh_g.ops->start((int)rh_param.NTHREADS);
	if (rc < 0) {
		goto stop_transport;
	}
	for (int i = 0; i < rh_g.nnics; i++) {
		rc = rh_g.ops->listen(i);
		if (rc < 0) {
			WARN("cannot listen on %s: %s", rh_g.nics[i].ifname, strerror(-rc));
			goto stop_transport;
		}
	}
	if (rh_param.CHECKSUM) {
		INFO_ENV("RAILHOP_CHECKSUM=1: a keyed payload MAC (GMAC) on every DATA frame of "
			 "TCP lanes, required from the peer");
	}
	rc = rh_health_start_ticker();
	if (rc < 0) {
		goto stop_transport;
	}
	running = true;
	INFO_INIT("initialised: %d NIC(s), %s lanes, %lld I/O thread(s)", rh_g.nnics,
		  rh_g.ops->name, (long long)rh_param.NTHREADS);
	return 0;

stop_transport:
	if (rh_g.ops->stop) {
		rh_g.ops->stop();
	}
	return rc;
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
		rc = -ENOMEM;
		goto err_release;
	}
	l->dev = dev;
	if (rh_auth_random(l->secret, sizeof(l->secret)) < 0) {
		WARN("getrandom failed: no connection secret for the listener");
		rc = -EIO;
		goto err_free;
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

err_free:
	free(l);
err_release:
	release(); /* the hold taken above: a v8..v10 host would otherwise never stop */
	return rc;
}

void rh_registry_add(struct rh_conn *c)
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

struct rh_conn *rh_registry_find(uint64_t id, bool is_send)
{
	for (struct rh_conn *c = rh_g.conns; c; c = c->gnext) {
		if (c->id == id && c->is_send == is_send) {
			return c;
		}
	}
	return NULL;
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
		rh_registry_add(c);
		/* a transient error: retried by the tick until the deadline */
		rc = rh_fo_connect(c);
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
	/* The cookie is only compared with the registry's addresses, never dereferenced: the
	 * connection it named may be gone (a plugin stop dropped it). A reference taken under
	 * g.mu keeps the one found alive for this call (a stop or the error path below may drop
	 * the registry's meanwhile). */
	pthread_mutex_lock(&rh_g.mu);
	for (it = rh_g.conns; it; it = it->gnext) {
		if ((uint64_t)(uintptr_t)it == cookie && it->is_send) {
			c = it;
			rh_conn_get(c);
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
		bool listed;

		memset(hb + RH_HANDLE_COOKIE_OFF, 0, sizeof(cookie));
		pthread_mutex_lock(&rh_g.mu);
		pthread_mutex_lock(&c->mu);
		listed = c->registered; /* a stop may have dropped the registry's reference */
		registry_del(c);
		atomic_store(&c->closed, true);
		for (int i = 0; i < c->nlanes; i++) {
			rh_conn_fence_lane(c, c->lanes[i]);
		}
		pthread_mutex_unlock(&c->mu);
		pthread_mutex_unlock(&rh_g.mu);
		if (listed) {
			rh_core_conn_put(c);
		}
	}
	rh_core_conn_put(c); /* this call's reference */
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

/*
 * Memory handles (regMr / deregMr) for a transport that caches registrations (ops->forget).
 *
 * The transports' caches (lanes/ofi domain.c, lanes/verbs mr.c) are per NIC and shared by
 * every comm: a receive buffer is registered once per NIC, rounded out to whole pages, the
 * first time a lane there needs it, and any later receive inside that registration uses it,
 * whichever comm's handle it came with. NCCL registers the same buffers (its shared buffers,
 * user buffers) with several comms and deregisters them one comm at a time. So a deregMr must
 * not drop cached registrations that another live handle still covers: a lane of that other
 * comm may have an advert or a write in flight against them (dropping one fails the write and
 * the lane). The core keeps every live handle in mr_live (under mr_mu) and deregMr asks the
 * transport to forget only the pages of the handle that no other live handle covers, with
 * both rounded to pages as the caches round (RH_MR_PAGE: ofi_rc_range in lanes/ofi/proto.c).
 *
 * Residual case: a cached registration is made for one receive's page range and then serves
 * any receive inside it. If a receive of handle B fell inside a registration made for a
 * receive of handle A that also spans pages only A covers, deregistering A forgets those
 * pages and with them that whole registration, although B is live (B's next use registers
 * its range again). A receive lies inside its own handle, so this needs two handles sharing
 * pages at the edge of one of them; NCCL's shared buffers are registered with identical
 * ranges and never hit it.
 *
 * Lifetime: a struct rh_mr is created by rh_reg_mr and freed by rh_dereg_mr (the host's
 * order, any host thread); it names no comm (the host may close the comm first) and no
 * transport object, and nothing else keeps a pointer to it. mr_live outlives plugin stops and
 * restarts (the handles stay the host's until it deregisters them).
 */
#define RH_MR_PAGE 4096u

struct rh_mr {
	void *data;
	size_t size;
	uintptr_t lo, hi; /* [lo, hi): the pages the caches register for it */
	struct rh_mr *next; /* mr_live */
};

/* Lock order: taken alone (never with rh_g.mu or a conn.mu), before the transports' cache
 * locks (forget() runs under it). */
static pthread_mutex_t mr_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rh_mr *mr_live;

/* The page range a cache registers for [a, a + len) (as ofi_rc_range). */
static void mr_pages(uintptr_t a, size_t len, uintptr_t *lo, uintptr_t *hi)
{
	*lo = a & ~(uintptr_t)(RH_MR_PAGE - 1);
	*hi = (a + len + RH_MR_PAGE - 1) & ~(uintptr_t)(RH_MR_PAGE - 1);
	if (*hi <= *lo) {
		*hi = *lo + RH_MR_PAGE;
	}
}

static int mr_cmp_lo(const void *a, const void *b)
{
	const struct rh_mr *x = *(struct rh_mr *const *)a, *y = *(struct rh_mr *const *)b;

	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Forget the pages of m (already out of mr_live) that no live handle covers. mr_mu held: a
 * registration of the same pages racing this deregMr waits, so it never loses a cache entry
 * it has started to use. */
static int mr_forget_uncovered(const struct rh_mr *m)
{
	struct rh_mr **cover;
	uintptr_t at = m->lo;
	int n = 0, max = 0;

	for (struct rh_mr *o = mr_live; o; o = o->next) {
		max += o->lo < m->hi && m->lo < o->hi;
	}
	if (max == 0) {
		rh_g.ops->forget((const void *)m->lo, m->hi - m->lo);
		return 0;
	}
	cover = malloc((size_t)max * sizeof(*cover));
	if (!cover) {
		/* Cannot tell what is covered: keep the cache entries (the pages stay registered
		 * until the plugin stops) rather than drop what a live handle uses. */
		return -ENOMEM;
	}
	for (struct rh_mr *o = mr_live; o; o = o->next) {
		if (o->lo < m->hi && m->lo < o->hi) {
			cover[n++] = o;
		}
	}
	qsort(cover, (size_t)n, sizeof(*cover), mr_cmp_lo);
	for (int i = 0; i < n && at < m->hi; i++) {
		if (cover[i]->lo > at) {
			rh_g.ops->forget((const void *)at, cover[i]->lo - at);
		}
		if (cover[i]->hi > at) {
			at = cover[i]->hi;
		}
	}
	if (at < m->hi) {
		rh_g.ops->forget((const void *)at, m->hi - at);
	}
	free(cover);
	return 0;
}

int rh_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle)
{
	struct rh_mr *m;

	(void)comm; /* never kept: the host may close the comm before it deregisters */
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
	m = calloc(1, sizeof(*m));
	if (!m) {
		return -ENOMEM;
	}
	m->data = data;
	m->size = size;
	mr_pages((uintptr_t)data, size, &m->lo, &m->hi);
	pthread_mutex_lock(&mr_mu);
	m->next = mr_live;
	mr_live = m;
	pthread_mutex_unlock(&mr_mu);
	*mhandle = m;
	return 0;
}

int rh_dereg_mr(void *comm, void *mhandle)
{
	struct rh_mr *m = mhandle;
	bool found = false;

	(void)comm;
	if (!m || mhandle == (void *)(uintptr_t)0x1) {
		return 0;
	}
	pthread_mutex_lock(&mr_mu);
	for (struct rh_mr **pp = &mr_live; *pp; pp = &(*pp)->next) {
		if (*pp == m) {
			*pp = m->next;
			found = true;
			break;
		}
	}
	if (found && rh_g.ops && rh_g.ops->forget && mr_forget_uncovered(m) < 0) {
		WARN("deregMr of %zu bytes: out of memory, its registrations stay cached", m->size);
	}
	pthread_mutex_unlock(&mr_mu);
	if (!found) {
		WARN("deregMr of an unknown memory handle %p (deregistered twice?)", mhandle);
		return -EINVAL;
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
		rh_registry_add(c); /* kept for the ticker; closed conns are not found by hellos */
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

/*
 * NCCL closes a listen comm as soon as its accept returned (and at teardown, in any order with
 * the comms). In one registry section: unlink it, take its ready queue and cut every connection
 * it founded loose (listen_id = 0: accepted ones go on, pending ones fail and the ticker drops
 * them); then the never-accepted ready ones are closed and the memory goes back to the host's
 * side. No connection, lane or transport thread keeps a pointer to it.
 */
int rh_close_listen(void *listen_comm)
{
	struct rh_listen *l = listen_comm;
	struct rh_conn *ready;

	pthread_mutex_lock(&rh_g.mu);
	for (struct rh_listen **pp = &rh_g.listens; *pp; pp = &(*pp)->next) {
		if (*pp == l) {
			*pp = l->next;
			break;
		}
	}
	ready = l->ready_head;
	l->ready_head = l->ready_tail = NULL;
	for (struct rh_conn *c = ready; c; c = c->lnext) {
		pthread_mutex_lock(&c->mu);
		c->accepted = true; /* taken by this close as by an accept: the ticker leaves it */
		pthread_mutex_unlock(&c->mu);
	}
	for (struct rh_conn *c = rh_g.conns; c; c = c->gnext) {
		if (c->is_send || c->listen_id != l->id) {
			continue;
		}
		pthread_mutex_lock(&c->mu);
		c->listen_id = 0;
		if (!c->accepted && !c->ready) {
			rh_conn_fail(c, -ECONNABORTED, "listener closed before accept");
		}
		pthread_mutex_unlock(&c->mu);
	}
	pthread_mutex_unlock(&rh_g.mu);
	/* Connections established but never accepted are closed with the listener (the ready
	 * queue's reference is the one close_conn drops). */
	while (ready) {
		struct rh_conn *c = ready;

		ready = c->lnext;
		c->lnext = NULL;
		close_conn(c);
	}
	memset(l, 0, sizeof(*l)); /* the connection secret does not outlive the listener */
	free(l);
	release();
	return 0;
}

struct rh_listen *rh_listen_find(uint64_t id)
{
	for (struct rh_listen *l = rh_g.listens; l; l = l->next) {
		if (l->id == id) {
			return l;
		}
	}
	return NULL;
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
			    (!c->ready || !c->listen_id)) {
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
