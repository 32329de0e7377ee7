/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TCP lanes, set-up and the lane_ops table: worker pool, socket options, listeners, dialing,
 * and the core's calls (open, probe, kick, fence and the locked queries) (tcp.h).
 */
#include "tcp.h"

static struct tcp_worker *workers;
static int nworkers;
static atomic_uint next_worker;

void tcp_worker_kick(struct tcp_worker *w)
{
	uint64_t one = 1;

	if (!atomic_exchange(&w->kicked, true)) {
		if (write(w->evfd, &one, sizeof(one)) < 0) {
			atomic_store(&w->kicked, false);
		}
	}
}

struct tcp_stream *tcp_stream_new(int fd, enum tcp_kind kind)
{
	struct tcp_stream *s = calloc(1, sizeof(*s));

	if (!s) {
		return NULL;
	}
	s->fd = fd;
	s->kind = kind;
	atomic_init(&s->dead, false);
	s->w = &workers[atomic_fetch_add(&next_worker, 1) % nworkers];
	return s;
}

int tcp_stream_add(struct tcp_stream *s)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
				  .data.ptr = s };
	struct tcp_worker *w = s->w; /* s may be reaped by its worker as soon as it is listed */
	int rc = 0;

	if (s->kind == K_LISTENER) {
		ev.events = EPOLLIN;
	}
	if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, s->fd, &ev) < 0) {
		rc = -errno;
		atomic_store(&s->dead, true); /* listed only to be reaped */
	}
	pthread_mutex_lock(&w->mu);
	s->next = w->pending;
	w->pending = s;
	pthread_mutex_unlock(&w->mu);
	tcp_worker_kick(w);
	return rc;
}

/* Socket options of Linux 6.15 (values from its uapi linux/tcp.h; older headers lack them). */
#define RH_TCP_RTO_MIN_US 45
#define RH_TCP_DELACK_MAX_US 46

/* Set one of the per-socket TCP timers; a kernel without it is reported once (lanes then use
 * the kernel's defaults: 200 ms RTO floor, 40+ ms delayed ACKs). */
static void sock_timer(int fd, int opt, int us, const char *name)
{
	static atomic_bool told[2];

	if (us <= 0 || setsockopt(fd, IPPROTO_TCP, opt, &us, sizeof(us)) == 0) {
		return;
	}
	if (!atomic_exchange(&told[opt == RH_TCP_RTO_MIN_US ? 0 : 1], true)) {
		INFO("lane sockets: %s=%d not applied (%s; needs Linux 6.15+): kernel default "
		     "used",
		     name, us, strerror(errno));
	}
}

/* Options of every lane socket: no Nagle, the buffer size (or autotuning), and a bound on the
 * unsent bytes a stream holds (RAILHOP_NOTSENT_LOWAT), so chunks stay in the core's queue, in
 * message order and never lost with a lane, until a stream can send them soon. */
void tcp_sock_tune(int fd)
{
	int one = 1, buf = (int)rh_param.SOCKBUF, lowat = (int)rh_param.NOTSENT_LOWAT;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (buf > 0) {
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
	}
	if (lowat > 0) {
		setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof(lowat));
	}
	if (rh_param.TCP_CC[0] && setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, rh_param.TCP_CC,
					     strlen(rh_param.TCP_CC)) < 0) {
		static atomic_bool told;

		if (!atomic_exchange(&told, true)) {
			WARN("lane sockets: RAILHOP_TCP_CC=%s refused (%s): system default used",
			     rh_param.TCP_CC, strerror(errno));
		}
	}
	sock_timer(fd, RH_TCP_RTO_MIN_US, (int)rh_param.TCP_RTO_MIN_US, "TCP_RTO_MIN_US");
	sock_timer(fd, RH_TCP_DELACK_MAX_US, (int)rh_param.TCP_DELACK_MAX_US, "TCP_DELACK_MAX_US");
}

static int sock_setup(int fd, int nic, bool bind_addr)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	const char *ifname = rh_core_nic(nic)->ifname;

	tcp_sock_tune(fd);
	if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, ifname, strlen(ifname) + 1) < 0) {
		if (errno != EPERM || geteuid() == 0) {
			return -errno;
		}
		/* Unprivileged: binding to the NIC's address still picks the source. */
	}
	if (bind_addr) {
		sa.sin_addr.s_addr = rh_core_nic(nic)->ipv4;
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			return -errno;
		}
	}
	return 0;
}

static int tcp_listen(int nic)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);
	struct tcp_stream *s;
	int fd, one = 1, rc;

	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		return -errno;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	rc = sock_setup(fd, nic, true);
	if (rc < 0 || listen(fd, 1024) < 0 || getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
		rc = rc < 0 ? rc : -errno;
		close(fd);
		return rc;
	}
	rh_core_nic(nic)->port = sa.sin_port;
	s = tcp_stream_new(fd, K_LISTENER);
	if (!s) {
		close(fd);
		return -ENOMEM;
	}
	s->nic = nic;
	INFO("lane listener on %s port %u", rh_core_nic(nic)->ifname, ntohs(sa.sin_port));
	return tcp_stream_add(s);
}

/* Start an outgoing connection of the given kind carrying a hello frame. */
static struct tcp_stream *dial(int lnic, uint32_t ip, uint16_t port, enum tcp_kind kind,
			       const struct rh_hello *hello, uint64_t conn_id, uint32_t epoch,
			       int *err)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = ip, .sin_port = port };
	struct rh_hdr h = { .type = RH_F_HELLO, .conn_id = conn_id, .epoch = epoch };
	struct tcp_stream *s;
	int fd, rc, len;

	fd = tcp_lane_socket();
	if (fd < 0) {
		*err = -errno;
		return NULL;
	}
	rc = sock_setup(fd, lnic, true);
	if (rc < 0) {
		close(fd);
		*err = rc;
		return NULL;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
		*err = -errno;
		close(fd);
		return NULL;
	}
	s = tcp_stream_new(fd, kind);
	if (!s) {
		close(fd);
		*err = -ENOMEM;
		return NULL;
	}
	s->txbuf = malloc(TCP_TXBUF_CAP);
	if (!s->txbuf) {
		close(fd);
		free(s);
		*err = -ENOMEM;
		return NULL;
	}
	len = rh_hello_put(hello, s->txbuf + RH_HDR_LEN, TCP_HELLO_MAX);
	h.len = (uint32_t)len;
	rh_hdr_put(&h, s->txbuf);
	s->txbuf_len = RH_HDR_LEN + (size_t)len;
	s->tx_active = true;
	s->tx_data = false;
	s->tx_off = 0;
	s->state = ST_CONNECTING;
	s->nic = lnic;
	return s;
}

static int tcp_open(struct rh_lane *lane, const struct rh_hello *hello, uint64_t conn_id,
		    uint32_t epoch, uint32_t ip, uint16_t port)
{
	struct tcp_lane *tl = calloc(1, sizeof(*tl));
	struct rh_hello h = *hello;
	int err = 0;

	if (!tl) {
		return -ENOMEM;
	}
	if (lane->nstreams > TCP_MAX_STREAMS) {
		lane->nstreams = TCP_MAX_STREAMS;
	}
	lane->tp = tl;
	for (int i = 0; i < lane->nstreams; i++) {
		struct tcp_stream *s;

		h.stream = (uint8_t)i;
		h.nstreams = (uint8_t)lane->nstreams;
		if ((err = rh_core_sign_stream(lane, &h)) < 0) {
			break;
		}
		s = dial(lane->lnic, ip, port, K_LANE, &h, conn_id, epoch, &err);
		if (!s) {
			break;
		}
		s->lane = lane;
		s->conn = lane->conn;
		rh_core_conn_get(lane->conn);
		s->idx = i;
		memcpy(s->snonce, h.snonce, RH_NONCE_LEN); /* keys the stream's frame MACs */
		tl->st.s[i] = s;
		tl->st.live++;
		if ((err = tcp_stream_add(s)) < 0) {
			break;
		}
	}
	if (err < 0) {
		for (int i = 0; i < TCP_MAX_STREAMS; i++) {
			if (tl_s(tl, i)) {
				atomic_store(&tl_s(tl, i)->dead, true);
				tcp_worker_kick(tl_s(tl, i)->w);
			}
		}
		if (tl->st.live == 0) {
			lane->tp = NULL;
			free(tl);
		}
		WARN("cannot open lane from %s: %s", rh_core_nic(lane->lnic)->ifname,
		     strerror(-err));
	}
	return err;
}

static int tcp_probe(struct rh_conn *conn, int lnic, uint32_t ip, uint16_t port, uint64_t cookie,
		     int timeout_ms)
{
	struct rh_hello h;
	struct tcp_stream *s;
	uint64_t conn_id;
	int err;

	if ((err = rh_core_probe_hello(conn, cookie, &h, &conn_id)) < 0) {
		return err;
	}
	s = dial(lnic, ip, port, K_PROBE_OUT, &h, conn_id, 0, &err);
	if (!s) {
		return err;
	}
	s->conn = conn;
	rh_core_conn_get(conn);
	s->cookie = cookie;
	s->deadline_ms = rh_now_ms() + (uint64_t)timeout_ms;
	return tcp_stream_add(s);
}

static void tcp_kick(struct rh_lane *lane)
{
	struct tcp_lane *tl = lane->tp;

	if (!tl) {
		return;
	}
	for (int i = 0; i < TCP_MAX_STREAMS; i++) {
		if (tl_s(tl, i)) {
			tcp_worker_kick(tl_s(tl, i)->w);
		}
	}
}

static void tcp_fence(struct rh_lane *lane)
{
	struct tcp_lane *tl = lane->tp;

	if (!tl) {
		return;
	}
	for (int i = 0; i < TCP_MAX_STREAMS; i++) {
		struct tcp_stream *s = tl_s(tl, i);

		if (!s || atomic_load(&s->dead)) {
			continue;
		}
		if (rh_core_conn_closed(lane->conn)) {
			/* Closing: let the last control frames (ACK, BYE) leave, bounded. */
			s->drain_until_ms = rh_now_ms() + 100;
		} else {
			shutdown(s->fd, SHUT_RDWR);
		}
		atomic_store(&s->dead, true);
		tcp_worker_kick(s->w);
	}
}

static bool tcp_stalled(struct rh_lane *lane, uint64_t now, int timeout_ms)
{
	struct tcp_lane *tl = lane->tp;

	if (!tl) {
		return false;
	}
	for (int i = 0; i < TCP_MAX_STREAMS; i++) {
		struct tcp_stream *s = tl_s(tl, i);
		struct tcp_info ti;
		socklen_t len = sizeof(ti);

		if (!s || s->fd < 0 || s->state != ST_READY) {
			continue;
		}
		if (getsockopt(s->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0) {
			continue;
		}
		if (ti.tcpi_unacked == 0) {
			s->stall_since_ms = 0;
			continue;
		}
		if (ti.tcpi_bytes_acked != s->last_acked || s->stall_since_ms == 0) {
			s->last_acked = ti.tcpi_bytes_acked;
			s->stall_since_ms = now;
			continue;
		}
		if (now - s->stall_since_ms >= (uint64_t)timeout_ms) {
			return true;
		}
	}
	return false;
}

static bool tcp_lost(struct rh_lane *lane, uint64_t quiet_ms)
{
	struct tcp_lane *tl = lane->tp;

	if (!tl) {
		return false;
	}
	for (int i = 0; i < TCP_MAX_STREAMS; i++) {
		struct tcp_stream *s = tl_s(tl, i);
		struct tcp_info ti;
		socklen_t len = sizeof(ti);

		if (!s || s->fd < 0 || s->state != ST_READY ||
		    getsockopt(s->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0) {
			continue;
		}
		if (tcp_info_lost(&ti, quiet_ms)) {
			return true;
		}
	}
	return false;
}

static uint64_t tcp_progress(struct rh_lane *lane)
{
	struct tcp_lane *tl = lane->tp;
	uint64_t sum = 0;

	if (!tl) {
		return 0;
	}
	for (int i = 0; i < TCP_MAX_STREAMS; i++) {
		struct tcp_stream *s = tl_s(tl, i);
		struct tcp_info ti;
		socklen_t len = sizeof(ti);

		if (!s || s->fd < 0 || s->state != ST_READY) {
			continue;
		}
		if (getsockopt(s->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0) {
			sum += ti.tcpi_bytes_acked + ti.tcpi_bytes_received;
		}
	}
	return sum;
}

static int tcp_ports(struct rh_lane *lane, uint16_t *lports, uint16_t *rports, int max)
{
	struct tcp_lane *tl = lane->tp;
	int n = 0;

	if (!tl) {
		return 0;
	}
	for (int i = 0; i < TCP_MAX_STREAMS && n < max; i++) {
		struct tcp_stream *s = tl_s(tl, i);
		struct sockaddr_in a, b;
		socklen_t la = sizeof(a), lb = sizeof(b);

		if (!s || s->fd < 0 || getsockname(s->fd, (struct sockaddr *)&a, &la) < 0 ||
		    getpeername(s->fd, (struct sockaddr *)&b, &lb) < 0 || a.sin_family != AF_INET) {
			continue;
		}
		lports[n] = ntohs(a.sin_port);
		rports[n] = ntohs(b.sin_port);
		n++;
	}
	return n;
}

static int tcp_start(int nthreads)
{
	workers = calloc((size_t)nthreads, sizeof(*workers));
	if (!workers) {
		return -ENOMEM;
	}
	nworkers = nthreads;
	atomic_store(&next_worker, 0);
	tcp_guard_init();
	for (int i = 0; i < nthreads; i++) {
		workers[i].epfd = workers[i].evfd = -1; /* what tcp_stop() closes after a failure */
	}
	for (int i = 0; i < nthreads; i++) {
		struct tcp_worker *w = &workers[i];
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
		char name[16];
		int rc;

		pthread_mutex_init(&w->mu, NULL);
		atomic_init(&w->kicked, false);
		atomic_init(&w->stop, false);
		w->epfd = epoll_create1(EPOLL_CLOEXEC);
		if (w->epfd < 0) {
			return -errno;
		}
		w->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (w->evfd < 0 || epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->evfd, &ev) < 0) {
			return -errno;
		}
		w->scratch = malloc(TCP_SCRATCH);
		if (!w->scratch) {
			return -ENOMEM;
		}
		rc = pthread_create(&w->th, NULL, tcp_worker_main, w);
		if (rc != 0) {
			return -rc;
		}
		w->started = true;
		snprintf(name, sizeof(name), "railhop-io%u", (unsigned)i % 100);
		pthread_setname_np(w->th, name);
	}
	return 0;
}

static void tcp_stop(void)
{
	for (int i = 0; i < nworkers; i++) {
		atomic_store(&workers[i].stop, true);
		atomic_store(&workers[i].kicked, false);
		if (workers[i].evfd >= 0) {
			tcp_worker_kick(&workers[i]);
		}
	}
	for (int i = 0; i < nworkers; i++) {
		if (workers[i].started) {
			pthread_join(workers[i].th, NULL);
		}
	}
	/* Reaping may still kick a worker (a stream of a closing connection): only after
	 * every worker is joined are their queues final. */
	for (int i = 0; i < nworkers; i++) {
		tcp_worker_reap_all(&workers[i]);
	}
	tcp_guard_fini();
	for (int i = 0; i < nworkers; i++) {
		struct tcp_worker *w = &workers[i];

		if (w->epfd >= 0) {
			close(w->epfd);
		}
		if (w->evfd >= 0) {
			close(w->evfd);
		}
		free(w->scratch);
		pthread_mutex_destroy(&w->mu);
	}
	free(workers);
	workers = NULL;
	nworkers = 0;
}

const struct lane_ops tcp_lane_ops = {
	.name = "tcp",
	.start = tcp_start,
	.stop = tcp_stop,
	.listen = tcp_listen,
	.open = tcp_open,
	.kick = tcp_kick,
	.fence = tcp_fence,
	.stalled = tcp_stalled,
	.lost = tcp_lost,
	.progress = tcp_progress,
	.ports = tcp_ports,
	.probe = tcp_probe,
};
