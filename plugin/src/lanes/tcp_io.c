/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TCP lanes, the epoll workers: each stream's receive and transmit state machines (frame header,
 * then the payload straight into the posted buffer or from user memory), handshakes on
 * accepted streams, probes, and reaping (tcp.h).
 */
#include "tcp.h"

/* A frame of the peer that fails its MAC check: one WARN, and the lane fails (failover). */
static void stream_fail(struct tcp_stream *s, int err);

static void mac_fail(struct tcp_stream *s, const char *what)
{
	WARN("conn %016llx lane %u stream %d: %s (frame %llu from the peer, type %u): a forged, "
	     "replayed or corrupted frame; failing the lane",
	     (unsigned long long)rh_core_conn_id(s->conn), s->lane->id, s->idx, what,
	     (unsigned long long)s->fm.pay_ctr, s->h.type);
	stream_fail(s, -EBADMSG);
}

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

	tcp_pending_del(s);
	epoll_ctl(s->w->epfd, EPOLL_CTL_DEL, s->fd, NULL);
	if (s->tx_core && s->lane) {
		s->tx_core = false;
		rh_core_ctrl_written(s->lane, s->ctl_len);
	}
	if (s->in_payload && s->counted && s->lane) {
		s->counted = false;
		rh_core_rx_data_done(s->lane, &s->h, true, false);
	}
	if (c) {
		/* out of the lane's table first: no thread reaches the fd once it is closed */
		rh_core_stream_detach(c, s->lane, s->idx, s, NULL);
	}
	close(s->fd);
	if (s->fm_on) {
		rh_fmac_free(&s->fm);
	}
	free(s->rxbuf);
	free(s->txbuf);
	free(s->ctlbuf);
	free(s);
}

static void do_tx(struct tcp_stream *s);

static void on_accept_hello(struct tcp_stream *s)
{
	struct rh_hello in, reply;
	struct rh_hdr h = { .type = RH_F_HELLO_ACK, .conn_id = s->h.conn_id, .epoch = s->h.epoch };
	struct rh_lane *lane;
	int len;

	if (!tcp_pending_del(s) || rh_hello_get(s->rxbuf, s->h.len, &in) < 0) {
		s->reap = true; /* evicted while its hello arrived, or a bad hello */
		return;
	}
	if (!s->txbuf && !(s->txbuf = malloc(TCP_TXBUF_CAP))) {
		s->reap = true;
		return;
	}
	if (in.kind == RH_HELLO_PROBE) {
		if (!rh_core_probe_answer(&s->h, &in, &reply)) {
			s->reap = true;
			return;
		}
		s->kind = K_PROBE_REPLY;
	} else {
		lane = rh_core_hello(&s->h, &in, &reply);
		if (!lane) {
			s->reap = true;
			return;
		}
		if (rh_core_stream_attach(lane, in.stream, TCP_MAX_STREAMS, s,
					  sizeof(struct tcp_lane), false) < 0) {
			s->reap = true;
			return;
		}
		s->lane = lane;
		s->conn = lane->conn; /* reference taken by rh_core_hello */
		s->idx = in.stream;
		s->kind = K_LANE;
		if (rh_core_frame_key(lane, in.stream, in.snonce, reply.snonce, &s->fm) < 0) {
			stream_fail(s, -EIO);
			return;
		}
		s->fm_on = true;
		s->pay_tx = rh_param.CHECKSUM || (in.flags & RH_HELLO_F_PMAC);
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

static void ofi_on_hello_ack(struct tcp_stream *s)
{
	struct rh_hello reply;

	if (s->h.aux != 0 || rh_hello_get(s->rxbuf, s->h.len, &reply) < 0) {
		stream_fail(s, -ECONNREFUSED);
		return;
	}
	if (s->kind == K_PROBE_OUT) {
		rh_core_probe_done(s->conn, s->cookie,
				   rh_core_probe_check(s->conn, s->cookie, &reply));
		s->failed = true; /* result delivered */
		s->reap = true;
		return;
	}
	if (rh_core_frame_key(s->lane, s->idx, s->snonce, reply.snonce, &s->fm) < 0) {
		stream_fail(s, -EIO);
		return;
	}
	s->fm_on = true;
	s->pay_tx = rh_param.CHECKSUM || (reply.flags & RH_HELLO_F_PMAC);
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
			ofi_on_hello_ack(s);
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
			bool ok = !s->pay_mac ||
				  rh_fmac_pay_end(&s->fm, s->rxh + RH_HDR_LEN + RH_TAG_LEN);

			s->counted = false;
			rh_core_rx_data_done(s->lane, &s->h, counted, ok);
			if (!ok) {
				mac_fail(s, "DATA payload failed its MAC check");
			}
		} else if (!rh_fmac_open(&s->fm, s->rxh, s->rxbuf, s->h.len, s->rxh + RH_HDR_LEN)) {
			mac_fail(s, "control frame failed its MAC check");
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
			size_t want = s->rxh_want ? s->rxh_want :
				      s->fm_on	  ? RH_HDR_LEN + RH_TAG_LEN :
						    RH_HDR_LEN;

			n = recv(s->fd, s->rxh + s->rxh_got, want - s->rxh_got, 0);
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
			if (s->rxh_got < want) {
				continue;
			}
			if (!s->rxh_want) {
				if (rh_hdr_get(s->rxh, &s->h) < 0) {
					stream_fail(s, -EPROTO);
					return;
				}
				if (s->fm_on && s->h.type == RH_F_DATA &&
				    (s->h.flags & RH_FLAG_PMAC)) {
					s->rxh_want = TCP_HDR_MAX; /* and its payload tag */
					continue;
				}
			}
			s->rxh_got = 0;
			s->rxh_want = 0;
			s->in_payload = true;
			s->pay_mac = false;
			s->pay_got = 0;
			s->dst = NULL;
			s->counted = false;
			if (s->h.type == RH_F_DATA) {
				if (s->state != ST_READY || s->kind != K_LANE || !s->fm_on) {
					stream_fail(s, -EPROTO);
					return;
				}
				/* nothing of a DATA frame is taken before its header checks */
				if (!rh_fmac_open(&s->fm, s->rxh, NULL, 0, s->rxh + RH_HDR_LEN)) {
					mac_fail(s, "DATA header failed its MAC check");
					return;
				}
				if (rh_fmac_pay_policy(&s->h, rh_param.CHECKSUM) < 0) {
					mac_fail(s, "DATA frame without the payload MAC that "
						    "RAILHOP_CHECKSUM=1 requires");
					return;
				}
				s->pay_mac = s->h.flags & RH_FLAG_PMAC;
				if (s->pay_mac && rh_fmac_pay_begin(&s->fm) < 0) {
					stream_fail(s, -EIO);
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
				if (n > 0 && s->pay_mac &&
				    rh_fmac_pay_update(&s->fm, s->dst + s->pay_got, (size_t)n) <
					    0) {
					s->pay_mac = false; /* cannot check: refuse the chunk */
					n = -1;
					errno = EIO;
				}
				rh_core_io_exit(s->conn);
			} else {
				s->dst = NULL;
				n = recv(s->fd, s->w->scratch,
					 want < TCP_SCRATCH ? want : TCP_SCRATCH, 0);
				if (n > 0 && s->pay_mac &&
				    rh_fmac_pay_update(&s->fm, s->w->scratch, (size_t)n) < 0) {
					n = -1;
					errno = EIO;
				}
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

/* Tag the core's control batch (ctlbuf) into txbuf: every frame's header, its tag (over the
 * header and the frame's payload), its payload. */
static int seal_ctrl(struct tcp_stream *s)
{
	size_t i = 0, o = 0;

	while (i + RH_HDR_LEN <= s->ctl_len) {
		struct rh_hdr h;
		size_t len;

		if (rh_hdr_get(s->ctlbuf + i, &h) < 0 || h.len > s->ctl_len - i - RH_HDR_LEN) {
			return -EPROTO;
		}
		len = h.len;
		memcpy(s->txbuf + o, s->ctlbuf + i, RH_HDR_LEN);
		if (rh_fmac_seal(&s->fm, s->ctlbuf + i, s->ctlbuf + i + RH_HDR_LEN, len,
				 s->txbuf + o + RH_HDR_LEN) < 0) {
			return -EIO;
		}
		memcpy(s->txbuf + o + RH_HDR_LEN + RH_TAG_LEN, s->ctlbuf + i + RH_HDR_LEN, len);
		i += RH_HDR_LEN + len;
		o += RH_HDR_LEN + RH_TAG_LEN + len;
	}
	s->txbuf_len = o;
	return i == s->ctl_len ? 0 : -EPROTO;
}

/* Tag the DATA frame in txh (header, header tag, the payload's tag when RAILHOP_CHECKSUM=1
 * here or the peer's hello asked for it):
 * -ECONNABORTED when the connection is closing (its memory must not be read). */
static int seal_data(struct tcp_stream *s)
{
	size_t hl = RH_HDR_LEN + RH_TAG_LEN;

	if (s->pay_tx) {
		int rc;

		s->txh[2] |= RH_FLAG_PMAC; /* flags, little-endian: under the header's tag */
		if (!rh_core_io_enter(s->conn)) {
			return -ECONNABORTED;
		}
		rc = rh_fmac_pay_seal(&s->fm, s->txp, s->txp_len, s->txh + hl);
		rh_core_io_exit(s->conn);
		if (rc < 0) {
			return rc;
		}
		hl += RH_TAG_LEN;
	}
	if (rh_fmac_seal(&s->fm, s->txh, NULL, 0, s->txh + RH_HDR_LEN) < 0) {
		return -EIO;
	}
	s->txh_len = hl;
	return 0;
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
			if ((!s->txbuf && !(s->txbuf = malloc(TCP_TXBUF_CAP))) ||
			    (!s->ctlbuf && !(s->ctlbuf = malloc(TCP_CTRL_CAP)))) {
				stream_fail(s, -ENOMEM);
				return;
			}
			if (!s->fm_on ||
			    rh_core_next_tx(s->lane, s->idx, s->ctlbuf, TCP_CTRL_CAP, &tx) <= 0) {
				return;
			}
			s->tx_active = true;
			s->tx_off = 0;
			s->tx_data = tx.is_data;
			if (tx.is_data) {
				memcpy(s->txh, tx.hdr, RH_HDR_LEN);
				s->txh_len = 0;
				s->txp = tx.payload;
				s->txp_len = tx.len;
			} else {
				s->ctl_len = tx.ctrl_len;
				s->tx_core = true;
				if (seal_ctrl(s) < 0) {
					stream_fail(s, -EIO);
					return;
				}
			}
		}
		if (s->tx_data && !s->txh_len) {
			int rc = seal_data(s);

			if (rc == -ECONNABORTED) {
				return; /* closing: the lane is being fenced */
			}
			if (rc < 0) {
				stream_fail(s, rc);
				return;
			}
		}
		if (s->tx_data) {
			total = s->txh_len + s->txp_len;
			if (s->tx_off < s->txh_len) {
				iov[0].iov_base = s->txh + s->tx_off;
				iov[0].iov_len = s->txh_len - s->tx_off;
				iov[1].iov_base = (void *)s->txp;
				iov[1].iov_len = s->txp_len;
				msg.msg_iovlen = s->txp_len ? 2 : 1;
			} else {
				iov[0].iov_base = (void *)(s->txp + (s->tx_off - s->txh_len));
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
			rh_core_ctrl_written(s->lane, s->ctl_len);
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
		rh_core_ctrl_written(s->lane, s->ctl_len);
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

		if (!tcp_fd_reserve_refill()) {
			tcp_listener_backoff(
				l, "descriptor limit reached (probe reserve not refilled)");
			return;
		}
		fd = accept4(l->fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
			    errno == ENOMEM) {
				tcp_listener_backoff(l, strerror(errno));
			}
			return;
		}
		tcp_sock_tune(fd);
		s = tcp_stream_new(fd, K_ACCEPTED);
		if (!s) {
			close(fd);
			continue;
		}
		s->state = ST_HELLO_IN;
		s->nic = l->nic;
		s->deadline_ms = rh_now_ms() + TCP_HS_DEADLINE_MS;
		tcp_pending_add(l->nic, s, sa.sin_family == AF_INET ? sa.sin_addr.s_addr : 0);
		tcp_stream_add(s);
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

void *tcp_worker_main(void *arg)
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
				tcp_listener_rearm(s, now);
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

void tcp_worker_reap_all(struct tcp_worker *w)
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
