/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TCP lanes, the listeners' bounds (tcp.h): the pending handshakes of each listener, the
 * descriptor reserve for outgoing streams and probes, and the accept backoff.
 */
#include <fcntl.h>

#include "tcp.h"

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
bool tcp_fd_reserve_refill(void)
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

int tcp_lane_socket(void)
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

int tcp_pending_victim(const uint32_t *src, int n, uint32_t newcomer)
{
	int same = 0, oldest_same = -1, best = -1, best_count = 0;

	for (int i = 0; i < n; i++) {
		if (src[i] == newcomer && same++ == 0) {
			oldest_same = i;
		}
	}
	if (same >= TCP_HS_MAX_SOURCE) {
		return oldest_same;
	}
	if (n < TCP_HS_MAX) {
		return -1;
	}
	/* Full: the oldest handshake of the source holding the most (the newcomer's own counts
	 * one more, as it is about to add one). O(n^2) over at most 256 entries, on accept only. */
	for (int i = 0; i < n; i++) {
		int count = src[i] == newcomer ? 1 : 0;
		bool first = true;

		for (int k = 0; k < n; k++) {
			if (src[k] == src[i]) {
				first = first && k >= i;
				count++;
			}
		}
		if (first && count > best_count) {
			best = i;
			best_count = count;
		}
	}
	return best;
}

/* List a connection just accepted on NIC nic's listener (before anyone else can see it),
 * evicting a pending handshake when a cap is reached (tcp_pending_victim). */
void tcp_pending_add(int nic, struct tcp_stream *s, uint32_t src)
{
	struct tcp_lsn *ls = &lsns[nic];
	uint32_t srcs[TCP_HS_MAX];
	int victim;

	pthread_mutex_lock(&ls->mu);
	for (int i = 0; i < ls->n; i++) {
		srcs[i] = ls->p[i].src;
	}
	victim = tcp_pending_victim(srcs, ls->n, src);
	if (victim >= 0) {
		struct tcp_stream *v = ls->p[victim].s;

		pending_remove_at(ls, victim);
		atomic_store(&v->dead, true); /* its worker reaps it at the next scan */
		tcp_worker_kick(v->w);
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
bool tcp_pending_del(struct tcp_stream *s)
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

/* Out of descriptors: take the listener out of its worker's poll set for a while (the worker's
 * scan puts it back). */
void tcp_listener_backoff(struct tcp_stream *l, const char *why)
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
		     rh_core_nic(l->nic)->ifname, why, TCP_ACCEPT_BACKOFF_MS, ls->backoffs,
		     ls->evicted);
	}
}

void tcp_listener_rearm(struct tcp_stream *l, uint64_t now)
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

void tcp_guard_init(void)
{
	for (int i = 0; i < RH_MAX_NICS; i++) {
		memset(&lsns[i], 0, sizeof(lsns[i]));
		pthread_mutex_init(&lsns[i].mu, NULL);
	}
	tcp_fd_reserve_refill();
}

void tcp_guard_fini(void)
{
	for (int i = 0; i < RH_MAX_NICS; i++) {
		pthread_mutex_destroy(&lsns[i].mu);
	}
	fd_reserve_release();
}
