/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi lanes, the lane_ops table: the core's calls (start, listen, open, probe, kick, fence and
 * the locked queries). Callbacks with the connection lock held only set flags and wake the I/O
 * thread.
 */
#include "ofi.h"

/* --- lane_ops --- */

static bool io_started, lf_held;

static int ofi_start(int nthreads)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	int rc;

	(void)nthreads; /* one I/O thread: libfabric providers progress on their own */
	if (!ofi_lf_load()) {
		WARN("RAILHOP_TRANSPORT=ofi, but libfabric.so.1 cannot be loaded (install libfabric1)");
		return -ELIBACC;
	}
	lf_held = true;
	ofi_wait_fds = true;
	ofi_epfd = epoll_create1(EPOLL_CLOEXEC);
	ofi_evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (ofi_epfd < 0 || ofi_evfd < 0 || epoll_ctl(ofi_epfd, EPOLL_CTL_ADD, ofi_evfd, &ev) < 0) {
		return -errno;
	}
	atomic_store(&ofi_kicked, false);
	atomic_store(&ofi_io_stop, false);
	rc = pthread_create(&ofi_io_thread, NULL, ofi_io_main, NULL);
	if (rc != 0) {
		return -rc;
	}
	io_started = true;
	pthread_setname_np(ofi_io_thread, "railhop-ofi");
	rc = ofi_connectors_start(); /* a failed start is stopped by the caller (ofi_stop) */
	return rc ? rc : ofi_closers_start();
}

/* Join the I/O thread, close every endpoint (their connection references go), then the
 * domains, and unload libfabric: its destructor finalizes the providers and stops the threads
 * they started. */
static void ofi_stop(void)
{
	ofi_connectors_stop(); /* first: what they hand over lands in ofi_pending, closed below */
	if (io_started) {
		atomic_store(&ofi_io_stop, true);
		atomic_store(&ofi_kicked, false);
		ofi_io_kick();
		pthread_join(ofi_io_thread, NULL);
		io_started = false;
	}
	/* the closes in progress end (bounded); what stays inside the provider past the bound
	 * keeps its endpoint, the domains and libfabric */
	bool released_all = ofi_closers_stop();

	for (;;) {
		struct ofi_ep *e;

		pthread_mutex_lock(&ofi_pend_mu);
		e = ofi_eps ? ofi_eps : ofi_pending;
		if (e && e == ofi_eps) {
			ofi_eps = e->next;
		} else if (e) {
			ofi_pending = e->next;
		}
		pthread_mutex_unlock(&ofi_pend_mu);
		if (!e) {
			break;
		}
		if (e->closing) {
			if (!atomic_load_explicit(&e->released, memory_order_acquire)) {
				continue; /* a closer was abandoned with it: leaked */
			}
			e->closing = false;
			ofi_ep_closed(e);
		}
		atomic_store(&e->fenced, true);
		ofi_ep_close(e); /* no closer runs: closed here */
		ofi_ep_free(e);
	}
	if (!released_all) {
		return; /* a provider close still runs: the domains and libfabric stay */
	}
	for (int i = 0; i < RH_MAX_NICS; i++) {
		ofi_dom_close(i);
	}
	if (ofi_epfd >= 0) {
		close(ofi_epfd);
		ofi_epfd = -1;
	}
	if (ofi_evfd >= 0) {
		close(ofi_evfd);
		ofi_evfd = -1;
	}
	if (lf_held) {
		lf_held = false;
		ofi_lf_unload();
	}
}

/* Called at init, before the I/O thread serves the NIC: domain + passive endpoint. */
static int ofi_listen(int nic)
{
	struct ofi_dom *d = &ofi_doms[nic];
	struct fi_eq_attr eqa = { .size = 64, .wait_obj = FI_WAIT_FD };
	struct sockaddr_in sa;
	size_t len = sizeof(sa);
	int rc;

	CHECK(ofi_dom_open(nic));
	rc = fi_eq_open(d->fabric, &eqa, &d->peq, NULL);
	if (rc == -FI_ENOSYS || rc == -FI_EINVAL) {
		eqa.wait_obj = FI_WAIT_NONE;
		ofi_wait_fds = false;
		rc = fi_eq_open(d->fabric, &eqa, &d->peq, NULL);
	}
	if (!rc) {
		rc = fi_passive_ep(d->fabric, d->info, &d->pep, NULL);
	}
	if (!rc) {
		rc = fi_pep_bind(d->pep, &d->peq->fid, 0);
	}
	if (!rc) {
		rc = fi_listen(d->pep);
	}
	if (!rc) {
		rc = fi_getname(&d->pep->fid, &sa, &len);
	}
	if (rc) {
		WARN("ofi: cannot listen on %s: %s", rh_core_nic(nic)->ifname,
		     ofi_lf_strerror(-rc));
		return fi_err(rc);
	}
	if (ofi_wait_fds) {
		int fd;
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = d };

		if (fi_control(&d->peq->fid, FI_GETWAIT, &fd) == 0) {
			epoll_ctl(ofi_epfd, EPOLL_CTL_ADD, fd, &ev);
		}
	}
	rh_core_nic(nic)->port = sa.sin_port;
	INFO("ofi: lane listener on %s port %u", rh_core_nic(nic)->ifname, ntohs(sa.sin_port));
	atomic_store_explicit(&d->served, true, memory_order_release);
	ofi_io_kick();
	return 0;
}

static uint8_t *hello_msg(const struct rh_hello *hello, uint64_t conn_id, uint32_t epoch,
			  size_t *len)
{
	struct rh_hdr h = { .type = RH_F_HELLO, .conn_id = conn_id, .epoch = epoch };
	uint8_t *b = malloc(RH_HDR_LEN + OFI_HELLO_MAX);
	int n;

	if (!b) {
		return NULL;
	}
	n = rh_hello_put(hello, b + RH_HDR_LEN, OFI_HELLO_MAX);
	if (n < 0) {
		free(b);
		return NULL;
	}
	h.len = (uint32_t)n;
	rh_hdr_put(&h, b);
	*len = RH_HDR_LEN + (size_t)n;
	return b;
}

static int ofi_open(struct rh_lane *lane, const struct rh_hello *hello, uint64_t conn_id,
		    uint32_t epoch, uint32_t ip, uint16_t port)
{
	struct ofi_lane *ol;
	struct rh_hello h = *hello;
	struct ofi_ep *e[OFI_MAX_STREAMS] = { 0 };
	int n;

	if (!ofi_doms[lane->lnic].ok) {
		return -ENODEV;
	}
	/* the core's stream count is the lane's data endpoints; stream 0 is added for control */
	if (lane->nstreams > OFI_MAX_DATA) {
		lane->nstreams = OFI_MAX_DATA;
	}
	lane->nstreams += 1;
	n = lane->nstreams;
	ol = calloc(1, sizeof(*ol));
	if (!ol) {
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		e[i] = ofi_ep_new(EK_LANE, lane->lnic);
		h.stream = (uint8_t)i;
		h.nstreams = (uint8_t)n;
		if (!e[i] || rh_core_sign_stream(lane, &h) < 0 ||
		    !(e[i]->hello = hello_msg(&h, conn_id, epoch, &e[i]->hello_len))) {
			goto fail;
		}
	}
	for (int i = 0; i < n; i++) {
		if (!rh_core_io_enter(lane->conn)) {
			for (int k = 0; k < i; k++) {
				rh_core_io_exit(lane->conn);
			}
			for (int k = 0; k < n; k++) {
				if (e[k]) {
					ofi_ep_free(e[k]);
				}
			}
			free(ol);
			return -ECONNABORTED;
		}
	}
	lane->tp = ol;
	for (int i = 0; i < n; i++) {
		e[i]->lane = lane;
		e[i]->conn = lane->conn;
		rh_core_conn_get(lane->conn);
		e[i]->io_held = true;
		e[i]->idx = i;
		e[i]->ip = ip;
		e[i]->port = port;
		ol->st.s[i] = e[i];
		ol->st.live++;
		ofi_ep_push(e[i]);
	}
	return 0;
fail:
	for (int k = 0; k < n; k++) {
		if (e[k]) {
			ofi_ep_free(e[k]);
		}
	}
	free(ol);
	return -ENOMEM;
}

static int ofi_probe(struct rh_conn *conn, int lnic, uint32_t ip, uint16_t port, uint64_t cookie,
		     int timeout_ms)
{
	struct rh_hello h;
	struct ofi_ep *e;
	uint64_t conn_id;
	int rc;

	if (!ofi_doms[lnic].ok) {
		return -ENODEV;
	}
	if ((rc = rh_core_probe_hello(conn, cookie, &h, &conn_id)) < 0) {
		return rc;
	}
	e = ofi_ep_new(EK_PROBE_OUT, lnic);
	if (!e) {
		return -ENOMEM;
	}
	e->hello = hello_msg(&h, conn_id, 0, &e->hello_len);
	if (!e->hello) {
		free(e);
		return -ENOMEM;
	}
	e->conn = conn;
	rh_core_conn_get(conn);
	e->cookie = cookie;
	e->ip = ip;
	e->port = port;
	e->deadline_ms = rh_now_ms() + (uint64_t)timeout_ms;
	ofi_ep_push(e);
	return 0;
}

static void ofi_kick(struct rh_lane *lane)
{
	if (lane->tp) {
		ofi_io_kick();
	}
}

static void ofi_fence(struct rh_lane *lane)
{
	struct ofi_lane *ol = lane->tp;
	uint64_t now = rh_now_ms();

	if (!ol) {
		return;
	}
	for (int i = 0; i < OFI_MAX_STREAMS; i++) {
		if (ol_ep(ol, i) && !atomic_load(&ol_ep(ol, i)->fenced)) {
			ol_ep(ol, i)->t_fenced_ms = now;
			atomic_store(&ol_ep(ol, i)->fenced, true);
		}
	}
	ofi_io_kick();
}

/* Lane level, unlike TCP's per-stream test: progress comes in whole operations here (a
 * chunk's write completes at once), and on a link shared by many endpoints one of them can
 * wait longer than the timeout for its next completion while the lane moves data. The data
 * endpoints are stalled when some of them has work outstanding and none completed anything for
 * the timeout (a dead link stops them all); the control endpoint is judged on its own, so its
 * adverts cannot hide data endpoints stuck in TCP retransmission back-off after a flap. */
static bool ofi_stalled(struct rh_lane *lane, uint64_t now, int timeout_ms)
{
	struct ofi_lane *ol = lane->tp;
	bool busy[2] = { false, false }, stalled = false;
	uint64_t p[2] = { 0, 0 };

	if (!ol) {
		return false;
	}
	for (int i = 0; i < OFI_MAX_STREAMS; i++) {
		struct ofi_ep *e = ol_ep(ol, i);
		int g;

		if (!e || e->st != ES_READY) {
			continue;
		}
		g = ofi_ep_ctrl_only(e) ? 0 : 1;
		busy[g] |= atomic_load(&e->outstanding) > 0;
		p[g] += atomic_load(&e->progress);
	}
	for (int g = 0; g < 2; g++) {
		if (!busy[g]) {
			ol->stall_since_ms[g] = 0;
		} else if (p[g] != ol->stall_mark[g] || ol->stall_since_ms[g] == 0) {
			ol->stall_mark[g] = p[g];
			ol->stall_since_ms[g] = now;
		} else if (now - ol->stall_since_ms[g] >= (uint64_t)timeout_ms) {
			stalled = true;
		}
	}
	return stalled;
}

/* Over a provider whose endpoints are TCP sockets (libfabric's tcp provider), the same verdict
 * as the TCP lane's, read through sock_diag by each data endpoint's address 4-tuple. Other
 * providers have no such socket (the lookup finds none): their lanes wait for the probe. */
static bool ofi_lost(struct rh_lane *lane, uint64_t quiet_ms)
{
	struct ofi_lane *ol = lane->tp;

	for (int i = 0; ol && i < OFI_MAX_STREAMS; i++) {
		struct ofi_ep *e = ol_ep(ol, i);
		struct tcp_info ti;

		if (!e || e->st != ES_READY || !e->lport || !e->rport || ofi_ep_ctrl_only(e) ||
		    tcp_info_by_addr(e->lip, e->lport, e->rip, e->rport, &ti) < 0) {
			continue;
		}
		if (tcp_info_lost(&ti, quiet_ms)) {
			return true;
		}
	}
	return false;
}

static uint64_t ofi_progress(struct rh_lane *lane)
{
	struct ofi_lane *ol = lane->tp;
	uint64_t sum = 0;

	for (int i = 0; ol && i < OFI_MAX_STREAMS; i++) {
		if (ol_ep(ol, i)) {
			sum += atomic_load(&ol_ep(ol, i)->progress);
		}
	}
	return sum;
}

static int ofi_ports(struct rh_lane *lane, uint16_t *lports, uint16_t *rports, int max)
{
	struct ofi_lane *ol = lane->tp;
	int n = 0;

	for (int i = 0; ol && i < OFI_MAX_STREAMS && n < max; i++) {
		struct ofi_ep *e = ol_ep(ol, i);

		if (e && e->lport && e->rport) {
			lports[n] = e->lport;
			rports[n] = e->rport;
			n++;
		}
	}
	return n;
}

const struct lane_ops ofi_lane_ops = {
	.name = "ofi",
	.start = ofi_start,
	.stop = ofi_stop,
	.listen = ofi_listen,
	.open = ofi_open,
	.kick = ofi_kick,
	.fence = ofi_fence,
	.stalled = ofi_stalled,
	.lost = ofi_lost,
	.progress = ofi_progress,
	.ports = ofi_ports,
	.probe = ofi_probe,
	.forget = ofi_forget,
};
