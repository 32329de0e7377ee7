/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TCP lanes: each lane is 1..16 TCP streams between the two NICs' IPv4 addresses (bound to the
 * NIC address and SO_BINDTODEVICE), served by a pool of epoll I/O workers. Frames are written
 * with one sendmsg (header + payload from user memory); DATA payloads are received straight
 * into the posted buffer at the chunk's offset (no extra copy). Progress for stall detection is
 * the kernel's acknowledged byte count (TCP_INFO).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <linux/tcp.h> /* struct tcp_info with tcpi_bytes_acked */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../core/conn.h"
#include "../log.h"
#include "../param.h"
#include "lane_ops.h"
#include "tcpstate.h"

#define TCP_MAX_STREAMS 16
#define TCP_RX_BUDGET (8u << 20)
#define TCP_SCRATCH (256u << 10)
#define TCP_CTRL_CAP (2 * (RH_HDR_LEN + RH_CTRL_MAX))
#define TCP_HELLO_MAX 4096

/*
 * Bounds on the lane listeners: anyone who can reach a NIC can connect to them.
 *  - A connection accepted on a listener is a pending handshake until its hello has been
 *    handled; at most TCP_HS_MAX per listener and TCP_HS_MAX_SOURCE from one source address
 *    are pending: one more evicts the oldest (of that source, when it is the source that is
 *    full), so a flood cannot keep newer connections, a peer's lanes and probes among them,
 *    out. The caps are wide because one connection opens STREAMS_PER_LANE (8) streams at
 *    once, and NCCL opens many connections to the same peer together.
 *  - The hello must arrive within TCP_HS_DEADLINE_MS of the accept.
 *  - Out of descriptors (EMFILE/ENFILE from accept4, or the probe reserve below cannot be
 *    refilled), the listener leaves its worker's poll set for TCP_ACCEPT_BACKOFF_MS instead of
 *    waking it again and again (it is level-triggered); waiting connections stay in the
 *    kernel's backlog meanwhile.
 *  - TCP_FD_RESERVE descriptors (on /dev/null) are kept for outgoing streams and probes: a
 *    socket() that fails with EMFILE/ENFILE gives one up and tries again, so the failure
 *    detection of live connections still gets descriptors while strangers hold the rest.
 */
#define TCP_HS_MAX 256
#define TCP_HS_MAX_SOURCE 128
#define TCP_HS_DEADLINE_MS 1000
#define TCP_ACCEPT_BACKOFF_MS 100
#define TCP_FD_RESERVE 16

enum tcp_kind {
	K_LISTENER, /* per-NIC lane listener */
	K_LANE, /* a stream of a lane (opened here or accepted) */
	K_ACCEPTED, /* accepted, waiting for the hello that says what it is */
	K_PROBE_OUT, /* outgoing probe */
	K_PROBE_REPLY, /* answering a probe; closed once the reply is written */
};

enum tcp_state { ST_CONNECTING, ST_HELLO_WAIT, ST_HELLO_IN, ST_READY };

struct tcp_worker;

struct tcp_stream {
	int fd;
	enum tcp_kind kind;
	enum tcp_state state;
	struct tcp_worker *w;
	struct rh_lane *lane;
	struct rh_conn *conn; /* reference held while set */
	int idx;
	int nic;
	int hs_nic; /* accepted on listener hs_nic - 1 (0: not accepted): see pending_del() */
	uint64_t deadline_ms;
	uint64_t cookie;
	atomic_bool dead; /* fenced: reap at the next scan */
	uint64_t drain_until_ms; /* graceful fence (closed conn): finish the control frame */
	bool failed;
	bool reap;
	bool in_list;
	bool rx_more; /* budget ran out: read again */
	/* receive */
	uint8_t rxh[RH_HDR_LEN];
	size_t rxh_got;
	struct rh_hdr h;
	bool in_payload;
	char *dst;
	bool counted;
	size_t pay_got;
	uint8_t *rxbuf; /* control payloads */
	/* transmit */
	bool tx_active;
	bool tx_data;
	bool tx_core; /* the control batch came from rh_core_next_tx */
	bool eof;
	uint8_t txh[RH_HDR_LEN];
	const char *txp;
	size_t txp_len;
	uint8_t *txbuf; /* control frames / hello */
	size_t txbuf_len;
	size_t tx_off;
	/* stall detection (conn lock) */
	uint64_t last_acked;
	uint64_t stall_since_ms;
	struct tcp_stream *next;
};

struct tcp_lane {
	struct tcp_stream *s[TCP_MAX_STREAMS];
	int live;
};

struct tcp_worker {
	pthread_t th;
	bool started; /* th is joinable */
	int epfd;
	int evfd;
	atomic_bool kicked;
	atomic_bool stop;
	pthread_mutex_t mu;
	struct tcp_stream *pending; /* added by other threads */
	struct tcp_stream *list; /* owned */
	uint8_t *scratch;
};

static struct tcp_worker *workers;
static int nworkers;
static atomic_uint next_worker;

/* The pending handshakes of one NIC's listener, oldest first (mu), and its backoff state
 * (the listener's worker only). */
struct tcp_pending {
	struct tcp_stream *s;
	uint32_t src;
};

struct tcp_lsn {
	pthread_mutex_t mu;
	int n;
	struct tcp_pending p[TCP_HS_MAX];
	unsigned long evicted;
	bool off; /* out of the poll set until backoff_until_ms */
	uint64_t backoff_until_ms;
	uint64_t t_warned_ms;
	unsigned long backoffs;
};

static struct tcp_lsn lsns[RH_MAX_NICS];

static int fd_reserve[TCP_FD_RESERVE];
static int nreserve;
static pthread_mutex_t reserve_mu = PTHREAD_MUTEX_INITIALIZER;

/* Refill the reserve; true when it is full (false: the process is at its descriptor limit). */
static bool fd_reserve_refill(void)
{
	bool full;

	pthread_mutex_lock(&reserve_mu);
	while (nreserve < TCP_FD_RESERVE) {
		int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

		if (fd < 0) {
			break;
		}
		fd_reserve[nreserve++] = fd;
	}
	full = nreserve == TCP_FD_RESERVE;
	pthread_mutex_unlock(&reserve_mu);
	return full;
}

/* Give up one reserved descriptor (socket() failed with EMFILE/ENFILE); false if none left. */
static bool fd_reserve_take(void)
{
	bool took = false;

	pthread_mutex_lock(&reserve_mu);
	if (nreserve > 0) {
		close(fd_reserve[--nreserve]);
		took = true;
	}
	pthread_mutex_unlock(&reserve_mu);
	return took;
}

static void fd_reserve_release(void)
{
	pthread_mutex_lock(&reserve_mu);
	while (nreserve > 0) {
		close(fd_reserve[--nreserve]);
	}
	pthread_mutex_unlock(&reserve_mu);
}

static int lane_socket(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0 && (errno == EMFILE || errno == ENFILE) && fd_reserve_take()) {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	}
	return fd;
}

static void pending_remove_at(struct tcp_lsn *ls, int i)
{
	__atomic_store_n(&ls->p[i].s->hs_nic, 0, __ATOMIC_RELAXED);
	memmove(&ls->p[i], &ls->p[i + 1], (size_t)(ls->n - i - 1) * sizeof(ls->p[0]));
	ls->n--;
}

static void worker_kick(struct tcp_worker *w);

/* List a connection just accepted on NIC nic's listener (before anyone else can see it),
 * evicting the oldest pending handshake when a cap is reached. */
static void pending_add(int nic, struct tcp_stream *s, uint32_t src)
{
	struct tcp_lsn *ls = &lsns[nic];
	int same = 0, oldest_same = -1, victim = -1;

	pthread_mutex_lock(&ls->mu);
	for (int i = 0; i < ls->n; i++) {
		if (ls->p[i].src == src && same++ == 0) {
			oldest_same = i;
		}
	}
	if (same >= TCP_HS_MAX_SOURCE) {
		victim = oldest_same;
	} else if (ls->n >= TCP_HS_MAX) {
		victim = 0;
	}
	if (victim >= 0) {
		struct tcp_stream *v = ls->p[victim].s;

		pending_remove_at(ls, victim);
		atomic_store(&v->dead, true); /* its worker reaps it at the next scan */
		worker_kick(v->w);
		ls->evicted++;
	}
	__atomic_store_n(&s->hs_nic, nic + 1, __ATOMIC_RELAXED);
	ls->p[ls->n].s = s;
	ls->p[ls->n].src = src;
	ls->n++;
	pthread_mutex_unlock(&ls->mu);
}

/* The handshake of an accepted connection ended (its hello arrived, or it is reaped). Returns
 * false when it had been evicted meanwhile (it must then be dropped, never used). */
static bool pending_del(struct tcp_stream *s)
{
	struct tcp_lsn *ls;
	bool listed = false;
	int nic = __atomic_load_n(&s->hs_nic, __ATOMIC_RELAXED) - 1;

	if (nic < 0) {
		return !atomic_load(&s->dead);
	}
	ls = &lsns[nic];
	pthread_mutex_lock(&ls->mu);
	for (int i = 0; i < ls->n; i++) {
		if (ls->p[i].s == s) {
			pending_remove_at(ls, i);
			listed = true;
			break;
		}
	}
	pthread_mutex_unlock(&ls->mu);
	return listed;
}

static void worker_kick(struct tcp_worker *w)
{
	uint64_t one = 1;

	if (!atomic_exchange(&w->kicked, true)) {
		if (write(w->evfd, &one, sizeof(one)) < 0) {
			atomic_store(&w->kicked, false);
		}
	}
}

static struct tcp_stream *stream_new(int fd, enum tcp_kind kind)
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

static int stream_add(struct tcp_stream *s)
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
	worker_kick(w);
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
static void sock_tune(int fd)
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
	const char *ifname = rh_g.nics[nic].ifname;

	sock_tune(fd);
	if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, ifname, strlen(ifname) + 1) < 0) {
		if (errno != EPERM || geteuid() == 0) {
			return -errno;
		}
		/* Unprivileged: binding to the NIC's address still picks the source. */
	}
	if (bind_addr) {
		sa.sin_addr.s_addr = rh_g.nics[nic].ipv4;
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
	rh_g.nics[nic].port = sa.sin_port;
	s = stream_new(fd, K_LISTENER);
	if (!s) {
		close(fd);
		return -ENOMEM;
	}
	s->nic = nic;
	INFO("lane listener on %s port %u", rh_g.nics[nic].ifname, ntohs(sa.sin_port));
	return stream_add(s);
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

	fd = lane_socket();
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
	s = stream_new(fd, kind);
	if (!s) {
		close(fd);
		*err = -ENOMEM;
		return NULL;
	}
	s->txbuf = malloc(TCP_CTRL_CAP);
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
		s = dial(lane->lnic, ip, port, K_LANE, &h, conn_id, epoch, &err);
		if (!s) {
			break;
		}
		s->lane = lane;
		s->conn = lane->conn;
		rh_conn_get(lane->conn);
		s->idx = i;
		tl->s[i] = s;
		tl->live++;
		if ((err = stream_add(s)) < 0) {
			break;
		}
	}
	if (err < 0) {
		for (int i = 0; i < TCP_MAX_STREAMS; i++) {
			if (tl->s[i]) {
				atomic_store(&tl->s[i]->dead, true);
				worker_kick(tl->s[i]->w);
			}
		}
		if (tl->live == 0) {
			lane->tp = NULL;
			free(tl);
		}
		WARN("cannot open lane from %s: %s", rh_g.nics[lane->lnic].ifname, strerror(-err));
	}
	return err;
}

static int tcp_probe(struct rh_conn *conn, int lnic, uint32_t ip, uint16_t port, uint64_t cookie,
		     int timeout_ms)
{
	struct rh_hello h = { .kind = RH_HELLO_PROBE, .nstreams = 0 };
	struct tcp_stream *s;
	int err = 0;

	s = dial(lnic, ip, port, K_PROBE_OUT, &h, 0, 0, &err);
	if (!s) {
		return err;
	}
	s->conn = conn;
	rh_conn_get(conn);
	s->cookie = cookie;
	s->deadline_ms = rh_now_ms() + (uint64_t)timeout_ms;
	return stream_add(s);
}

static void tcp_kick(struct rh_lane *lane)
{
	struct tcp_lane *tl = lane->tp;

	if (!tl) {
		return;
	}
	for (int i = 0; i < TCP_MAX_STREAMS; i++) {
		if (tl->s[i]) {
			worker_kick(tl->s[i]->w);
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
		struct tcp_stream *s = tl->s[i];

		if (!s || atomic_load(&s->dead)) {
			continue;
		}
		if (atomic_load(&lane->conn->closed)) {
			/* Closing: let the last control frames (ACK, BYE) leave, bounded. */
			s->drain_until_ms = rh_now_ms() + 100;
		} else {
			shutdown(s->fd, SHUT_RDWR);
		}
		atomic_store(&s->dead, true);
		worker_kick(s->w);
	}
}

static bool tcp_stalled(struct rh_lane *lane, uint64_t now, int timeout_ms)
{
	struct tcp_lane *tl = lane->tp;

	if (!tl) {
		return false;
	}
	for (int i = 0; i < TCP_MAX_STREAMS; i++) {
		struct tcp_stream *s = tl->s[i];
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
		struct tcp_stream *s = tl->s[i];
		struct tcp_info ti;
		socklen_t len = sizeof(ti);

		if (!s || s->fd < 0 || s->state != ST_READY ||
		    getsockopt(s->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0) {
			continue;
		}
		if (rh_tcp_info_lost(&ti, quiet_ms)) {
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
		struct tcp_stream *s = tl->s[i];
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
		struct tcp_stream *s = tl->s[i];
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

/* --- worker --- */

static void stream_fail(struct tcp_stream *s, int err)
{
	if (s->failed) {
		return;
	}
	s->failed = true;
	s->reap = true;
	switch (s->kind) {
	case K_LANE:
		if (!atomic_load(&s->dead) && s->lane) {
			rh_core_lane_error(s->lane, err);
		}
		break;
	case K_PROBE_OUT:
		rh_core_probe_done(s->conn, s->cookie, false);
		break;
	default:
		break;
	}
}

/* Orderly close by the peer at a frame boundary. */
static void stream_eof(struct tcp_stream *s)
{
	if (s->kind != K_LANE || s->state != ST_READY || atomic_load(&s->dead)) {
		stream_fail(s, -ECONNRESET);
		return;
	}
	s->failed = true;
	s->reap = true;
	rh_core_stream_eof(s->lane);
}

static void stream_reap(struct tcp_stream *s)
{
	struct rh_conn *c = s->conn;

	pending_del(s);
	epoll_ctl(s->w->epfd, EPOLL_CTL_DEL, s->fd, NULL);
	if (s->tx_core && s->lane) {
		s->tx_core = false;
		rh_core_ctrl_written(s->lane, s->txbuf_len);
	}
	if (s->in_payload && s->counted && s->lane) {
		s->counted = false;
		rh_core_rx_data_done(s->lane, &s->h, true, false);
	}
	if (c) {
		pthread_mutex_lock(&c->mu);
		close(s->fd);
		s->fd = -1;
		if (s->lane && s->lane->tp) {
			struct tcp_lane *tl = s->lane->tp;

			if (tl->s[s->idx] == s) {
				tl->s[s->idx] = NULL;
				if (--tl->live == 0) {
					s->lane->tp = NULL;
					free(tl);
				}
			}
		}
		pthread_mutex_unlock(&c->mu);
		rh_core_conn_put(c);
	} else {
		close(s->fd);
	}
	free(s->rxbuf);
	free(s->txbuf);
	free(s);
}

static void do_tx(struct tcp_stream *s);

static void on_accept_hello(struct tcp_stream *s)
{
	struct rh_hello in, reply;
	struct rh_hdr h = { .type = RH_F_HELLO_ACK, .conn_id = s->h.conn_id, .epoch = s->h.epoch };
	struct rh_lane *lane;
	int len;

	if (!pending_del(s) || rh_hello_get(s->rxbuf, s->h.len, &in) < 0) {
		s->reap = true; /* evicted while its hello arrived, or a bad hello */
		return;
	}
	if (!s->txbuf && !(s->txbuf = malloc(TCP_CTRL_CAP))) {
		s->reap = true;
		return;
	}
	if (in.kind == RH_HELLO_PROBE) {
		memset(&reply, 0, sizeof(reply));
		reply.kind = RH_HELLO_PROBE;
		reply.nstreams = 1;
		s->kind = K_PROBE_REPLY;
	} else {
		lane = rh_core_hello(&s->h, &in, &reply);
		if (!lane) {
			s->reap = true;
			return;
		}
		pthread_mutex_lock(&lane->conn->mu);
		if (lane->state != RH_LANE_OPENING || in.stream >= TCP_MAX_STREAMS ||
		    (lane->tp && ((struct tcp_lane *)lane->tp)->s[in.stream])) {
			pthread_mutex_unlock(&lane->conn->mu);
			rh_core_conn_put(lane->conn);
			s->reap = true;
			return;
		}
		if (!lane->tp) {
			lane->tp = calloc(1, sizeof(struct tcp_lane));
			if (!lane->tp) {
				pthread_mutex_unlock(&lane->conn->mu);
				rh_core_conn_put(lane->conn);
				s->reap = true;
				return;
			}
		}
		((struct tcp_lane *)lane->tp)->s[in.stream] = s;
		((struct tcp_lane *)lane->tp)->live++;
		s->lane = lane;
		s->conn = lane->conn; /* reference taken by rh_core_hello */
		s->idx = in.stream;
		s->kind = K_LANE;
		pthread_mutex_unlock(&lane->conn->mu);
	}
	len = rh_hello_put(&reply, s->txbuf + RH_HDR_LEN, TCP_HELLO_MAX);
	h.len = (uint32_t)len;
	rh_hdr_put(&h, s->txbuf);
	s->txbuf_len = RH_HDR_LEN + (size_t)len;
	s->tx_active = true;
	s->tx_data = false;
	s->tx_off = 0;
	s->state = ST_READY;
	s->deadline_ms = 0;
	if (s->kind == K_LANE) {
		rh_core_stream_ready(s->lane, NULL);
	}
	do_tx(s);
}

static void on_hello_ack(struct tcp_stream *s)
{
	struct rh_hello reply;

	if (s->h.aux != 0 || rh_hello_get(s->rxbuf, s->h.len, &reply) < 0) {
		stream_fail(s, -ECONNREFUSED);
		return;
	}
	if (s->kind == K_PROBE_OUT) {
		rh_core_probe_done(s->conn, s->cookie, true);
		s->failed = true; /* result delivered */
		s->reap = true;
		return;
	}
	s->state = ST_READY;
	rh_core_stream_ready(s->lane, &reply);
}

/* A complete frame (header + payload) arrived. */
static void on_frame(struct tcp_stream *s)
{
	switch (s->state) {
	case ST_HELLO_IN:
		if (s->h.type == RH_F_HELLO) {
			on_accept_hello(s);
		} else {
			s->reap = true;
		}
		return;
	case ST_HELLO_WAIT:
		if (s->h.type == RH_F_HELLO_ACK) {
			on_hello_ack(s);
		} else {
			stream_fail(s, -EPROTO);
		}
		return;
	case ST_READY:
		if (s->kind != K_LANE) {
			return;
		}
		if (s->h.type == RH_F_DATA) {
			bool counted = s->counted;

			s->counted = false;
			rh_core_rx_data_done(s->lane, &s->h, counted, true);
		} else {
			rh_core_rx_ctrl(s->lane, &s->h, s->rxbuf);
		}
		return;
	default:
		stream_fail(s, -EPROTO);
	}
}

static void do_rx(struct tcp_stream *s)
{
	size_t budget = 0;

	s->rx_more = false;
	while (!s->reap && !atomic_load(&s->dead)) {
		ssize_t n;

		if (budget >= TCP_RX_BUDGET) {
			s->rx_more = true;
			return;
		}
		if (!s->in_payload) {
			n = recv(s->fd, s->rxh + s->rxh_got, RH_HDR_LEN - s->rxh_got, 0);
			if (n == 0 && s->rxh_got == 0) {
				stream_eof(s);
				return;
			}
			if (n == 0) {
				stream_fail(s, -ECONNRESET);
				return;
			}
			if (n < 0) {
				goto io_end;
			}
			s->rxh_got += (size_t)n;
			if (s->rxh_got < RH_HDR_LEN) {
				continue;
			}
			s->rxh_got = 0;
			if (rh_hdr_get(s->rxh, &s->h) < 0) {
				stream_fail(s, -EPROTO);
				return;
			}
			s->in_payload = true;
			s->pay_got = 0;
			s->dst = NULL;
			s->counted = false;
			if (s->h.type == RH_F_DATA) {
				if (s->state != ST_READY || s->kind != K_LANE) {
					stream_fail(s, -EPROTO);
					return;
				}
				s->dst = rh_core_rx_data(s->lane, &s->h, &s->counted);
			} else if (!s->rxbuf && !(s->rxbuf = malloc(RH_CTRL_MAX))) {
				stream_fail(s, -ENOMEM);
				return;
			}
		}
		if (s->pay_got < s->h.len) {
			size_t want = s->h.len - s->pay_got;

			if (s->h.type != RH_F_DATA) {
				n = recv(s->fd, s->rxbuf + s->pay_got, want, 0);
			} else if (s->dst && rh_core_io_enter(s->conn)) {
				n = recv(s->fd, s->dst + s->pay_got, want, 0);
				rh_core_io_exit(s->conn);
			} else {
				s->dst = NULL;
				n = recv(s->fd, s->w->scratch,
					 want < TCP_SCRATCH ? want : TCP_SCRATCH, 0);
			}
			if (n == 0) {
				stream_fail(s, -ECONNRESET);
				return;
			}
			if (n < 0) {
				goto io_end;
			}
			s->pay_got += (size_t)n;
			budget += (size_t)n;
			if (s->pay_got < s->h.len) {
				continue;
			}
		}
		s->in_payload = false;
		if (s->h.type == RH_F_DATA && !s->dst && s->counted) {
			/* discarded after all (connection closing): release the chunk */
			s->counted = false;
			rh_core_rx_data_done(s->lane, &s->h, true, false);
			continue;
		}
		on_frame(s);
	}
	return;
io_end:
	if (errno == EAGAIN || errno == EWOULDBLOCK) {
		return;
	}
	if (errno == EINTR) {
		s->rx_more = true;
		return;
	}
	stream_fail(s, -ECONNRESET);
}

static void do_tx(struct tcp_stream *s)
{
	while (!s->reap && !atomic_load(&s->dead)) {
		struct iovec iov[2];
		struct msghdr msg = { .msg_iov = iov };
		bool user = false;
		ssize_t n;
		size_t total;

		if (!s->tx_active) {
			struct rh_tx tx;

			if (s->state != ST_READY || s->kind != K_LANE) {
				return;
			}
			if (!s->txbuf && !(s->txbuf = malloc(TCP_CTRL_CAP))) {
				stream_fail(s, -ENOMEM);
				return;
			}
			if (rh_core_next_tx(s->lane, s->idx, s->txbuf, TCP_CTRL_CAP, &tx) <= 0) {
				return;
			}
			s->tx_active = true;
			s->tx_off = 0;
			s->tx_data = tx.is_data;
			if (tx.is_data) {
				memcpy(s->txh, tx.hdr, RH_HDR_LEN);
				s->txp = tx.payload;
				s->txp_len = tx.len;
			} else {
				s->txbuf_len = tx.ctrl_len;
				s->tx_core = true;
			}
		}
		if (s->tx_data) {
			total = RH_HDR_LEN + s->txp_len;
			if (s->tx_off < RH_HDR_LEN) {
				iov[0].iov_base = s->txh + s->tx_off;
				iov[0].iov_len = RH_HDR_LEN - s->tx_off;
				iov[1].iov_base = (void *)s->txp;
				iov[1].iov_len = s->txp_len;
				msg.msg_iovlen = s->txp_len ? 2 : 1;
			} else {
				iov[0].iov_base = (void *)(s->txp + (s->tx_off - RH_HDR_LEN));
				iov[0].iov_len = total - s->tx_off;
				msg.msg_iovlen = 1;
			}
			user = s->txp_len > 0;
		} else {
			total = s->txbuf_len;
			iov[0].iov_base = s->txbuf + s->tx_off;
			iov[0].iov_len = total - s->tx_off;
			msg.msg_iovlen = 1;
		}
		if (user && !rh_core_io_enter(s->conn)) {
			return; /* closing: the lane is being fenced */
		}
		n = sendmsg(s->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (user) {
			rh_core_io_exit(s->conn);
		}
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
				return;
			}
			stream_fail(s, -errno);
			return;
		}
		s->tx_off += (size_t)n;
		if (s->tx_off < total) {
			continue;
		}
		s->tx_active = false;
		if (s->tx_core) {
			s->tx_core = false;
			rh_core_ctrl_written(s->lane, s->txbuf_len);
		}
		if (s->state == ST_CONNECTING || s->state == ST_HELLO_WAIT) {
			s->state = ST_HELLO_WAIT; /* hello written: wait for the answer */
			return;
		}
		if (s->kind == K_PROBE_REPLY) {
			s->reap = true;
			return;
		}
	}
}

/* Finish writing the current control frame of a fenced stream (closing connection). */
static void drain_ctrl(struct tcp_stream *s)
{
	while (s->tx_active) {
		ssize_t n = send(s->fd, s->txbuf + s->tx_off, s->txbuf_len - s->tx_off,
				 MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n <= 0) {
			if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
				return;
			}
			s->tx_active = false;
			break;
		}
		s->tx_off += (size_t)n;
		s->tx_active = s->tx_off < s->txbuf_len;
	}
	if (s->tx_core) {
		s->tx_core = false;
		rh_core_ctrl_written(s->lane, s->txbuf_len);
	}
}

/* Out of descriptors: take the listener out of its worker's poll set for a while (the worker's
 * scan puts it back). */
static void listener_backoff(struct tcp_stream *l, const char *why)
{
	struct tcp_lsn *ls = &lsns[l->nic];
	uint64_t now = rh_now_ms();

	epoll_ctl(l->w->epfd, EPOLL_CTL_DEL, l->fd, NULL);
	ls->off = true;
	ls->backoff_until_ms = now + TCP_ACCEPT_BACKOFF_MS;
	ls->backoffs++;
	if (now - ls->t_warned_ms >= 10000) {
		ls->t_warned_ms = now;
		WARN("lane listener on %s: %s; not accepting for %d ms (%lu backoffs, %lu pending "
		     "handshakes evicted so far)",
		     rh_g.nics[l->nic].ifname, why, TCP_ACCEPT_BACKOFF_MS, ls->backoffs,
		     ls->evicted);
	}
}

static void listener_rearm(struct tcp_stream *l, uint64_t now)
{
	struct tcp_lsn *ls = &lsns[l->nic];
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = l };

	if (!ls->off || now < ls->backoff_until_ms) {
		return;
	}
	if (epoll_ctl(l->w->epfd, EPOLL_CTL_ADD, l->fd, &ev) == 0) {
		ls->off = false;
	} else {
		ls->backoff_until_ms = now + TCP_ACCEPT_BACKOFF_MS;
	}
}

static void on_listener(struct tcp_stream *l)
{
	/* a bounded batch per wake-up: the listener is level-triggered, the rest comes next */
	for (int k = 0; k < 64; k++) {
		struct sockaddr_in sa = { 0 };
		socklen_t len = sizeof(sa);
		struct tcp_stream *s;
		int fd;

		if (!fd_reserve_refill()) {
			listener_backoff(l,
					 "descriptor limit reached (probe reserve not refilled)");
			return;
		}
		fd = accept4(l->fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
			    errno == ENOMEM) {
				listener_backoff(l, strerror(errno));
			}
			return;
		}
		sock_tune(fd);
		s = stream_new(fd, K_ACCEPTED);
		if (!s) {
			close(fd);
			continue;
		}
		s->state = ST_HELLO_IN;
		s->nic = l->nic;
		s->deadline_ms = rh_now_ms() + TCP_HS_DEADLINE_MS;
		pending_add(l->nic, s, sa.sin_family == AF_INET ? sa.sin_addr.s_addr : 0);
		stream_add(s);
	}
}

static void on_events(struct tcp_stream *s, uint32_t ev)
{
	if (s->reap) {
		return;
	}
	if (s->kind == K_LISTENER) {
		on_listener(s);
		return;
	}
	if (s->state == ST_CONNECTING) {
		int err = 0;
		socklen_t len = sizeof(err);

		if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
			return;
		}
		getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
		if (err || (ev & (EPOLLERR | EPOLLHUP))) {
			stream_fail(s, -(err ? err : ECONNREFUSED));
			return;
		}
		do_tx(s); /* the hello */
		if (s->state == ST_CONNECTING) {
			s->state = ST_HELLO_WAIT;
		}
	}
	if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
		do_rx(s);
	}
	if (ev & EPOLLOUT) {
		do_tx(s);
	}
}

static void *worker_main(void *arg)
{
	struct tcp_worker *w = arg;
	struct epoll_event evs[64];
	uint64_t last_scan = 0;

	while (!atomic_load(&w->stop)) {
		bool more = false, scan = false;
		uint64_t now;
		int n;

		for (struct tcp_stream *s = w->list; s; s = s->next) {
			more |= s->rx_more;
		}
		n = epoll_wait(w->epfd, evs, 64, more ? 0 : 20);
		for (int i = 0; i < n; i++) {
			if (!evs[i].data.ptr) {
				uint64_t v;

				if (read(w->evfd, &v, sizeof(v)) < 0) {
					/* nothing: the counter was already drained */
				}
				atomic_store(&w->kicked, false);
				scan = true;
				continue;
			}
			on_events(evs[i].data.ptr, evs[i].events);
		}
		pthread_mutex_lock(&w->mu);
		while (w->pending) {
			struct tcp_stream *s = w->pending;

			w->pending = s->next;
			s->next = w->list;
			w->list = s;
			s->in_list = true;
			scan = true;
		}
		pthread_mutex_unlock(&w->mu);
		now = rh_now_ms();
		if (now - last_scan >= 20) {
			scan = true;
			last_scan = now;
		}
		for (struct tcp_stream **pp = &w->list; *pp;) {
			struct tcp_stream *s = *pp;

			if (s->rx_more && !s->reap) {
				do_rx(s);
			}
			if (scan && s->kind == K_LISTENER) {
				listener_rearm(s, now);
			}
			if (scan && !s->reap && s->kind != K_LISTENER) {
				if (atomic_load(&s->dead)) {
					if (s->tx_active && !s->tx_data &&
					    now < s->drain_until_ms) {
						drain_ctrl(s);
					}
					s->reap = !s->tx_active || now >= s->drain_until_ms;
				} else if (s->deadline_ms && now > s->deadline_ms &&
					   s->state != ST_READY) {
					stream_fail(s, -ETIMEDOUT);
					s->reap = true;
				} else if (s->state != ST_CONNECTING) {
					do_tx(s);
				}
			}
			if (s->reap) {
				if (s->kind == K_PROBE_OUT && !s->failed) {
					s->failed = true;
					rh_core_probe_done(s->conn, s->cookie, false);
				}
				*pp = s->next;
				stream_reap(s);
				continue;
			}
			pp = &s->next;
		}
	}
	return NULL;
}

static int tcp_start(int nthreads)
{
	workers = calloc((size_t)nthreads, sizeof(*workers));
	if (!workers) {
		return -ENOMEM;
	}
	nworkers = nthreads;
	atomic_store(&next_worker, 0);
	for (int i = 0; i < RH_MAX_NICS; i++) {
		memset(&lsns[i], 0, sizeof(lsns[i]));
		pthread_mutex_init(&lsns[i].mu, NULL);
	}
	fd_reserve_refill();
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
		rc = pthread_create(&w->th, NULL, worker_main, w);
		if (rc != 0) {
			return -rc;
		}
		w->started = true;
		snprintf(name, sizeof(name), "railhop-io%u", (unsigned)i % 100);
		pthread_setname_np(w->th, name);
	}
	return 0;
}

/* Release every stream a stopped worker still holds (its thread is joined). */
static void worker_reap_all(struct tcp_worker *w)
{
	for (;;) {
		struct tcp_stream *s;

		pthread_mutex_lock(&w->mu);
		s = w->list ? w->list : w->pending;
		if (s == w->list && s) {
			w->list = s->next;
		} else if (s) {
			w->pending = s->next;
		}
		pthread_mutex_unlock(&w->mu);
		if (!s) {
			return;
		}
		atomic_store(&s->dead, true);
		if (s->kind == K_PROBE_OUT && !s->failed) {
			s->failed = true;
			rh_core_probe_done(s->conn, s->cookie, false);
		}
		stream_reap(s); /* listeners too: they hold no connection */
	}
}

static void tcp_stop(void)
{
	for (int i = 0; i < nworkers; i++) {
		atomic_store(&workers[i].stop, true);
		atomic_store(&workers[i].kicked, false);
		if (workers[i].evfd >= 0) {
			worker_kick(&workers[i]);
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
		worker_reap_all(&workers[i]);
	}
	for (int i = 0; i < RH_MAX_NICS; i++) {
		pthread_mutex_destroy(&lsns[i].mu);
	}
	fd_reserve_release();
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

const struct lane_ops rh_tcp_ops = {
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
