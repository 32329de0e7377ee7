/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi lanes, endpoints: creating, connecting and closing FI_EP_MSG endpoints, their bounce
 * buffers and send slots, and the lane handshake (HELLO / HELLO_ACK, as on TCP). All of it runs
 * on the I/O thread, except ofi_ep_new (any thread) and ofi_ep_connect (a connector thread,
 * connect.c, before the I/O thread sees the endpoint).
 */
#include "ofi.h"

/* --- endpoints --- */

struct ofi_ep *ofi_ep_new(enum ep_kind kind, int nic)
{
	struct ofi_ep *e = calloc(1, sizeof(*e));

	if (!e) {
		return NULL;
	}
	e->kind = kind;
	e->nic = nic;
	e->d = &ofi_doms[nic];
	e->st = ES_NEW;
	atomic_init(&e->fenced, false);
	atomic_init(&e->released, false);
	e->wait_fd[0] = e->wait_fd[1] = -1;
	atomic_init(&e->progress, 0);
	atomic_init(&e->outstanding, 0);
	return e;
}

/* A lane's first endpoint carries no writes (ofi_open adds it to the data endpoints): control
 * frames, advert requests and answers then never queue behind megabytes of writes on a
 * congested link (the provider delivers a message after the earlier writes of its endpoint).
 * Measured on the 200 Mbit/s fabric with four connections moved onto one NIC: FAILREQs and
 * RESUMEs took 1-2 s to cross when they shared an endpoint with writes, and connections
 * escalated. (A lane of a single endpoint, which ofi_open never makes, would mix both.) */
bool ofi_ep_ctrl_only(const struct ofi_ep *e)
{
	return e->idx == 0 && e->lane && e->lane->nstreams >= 2;
}

void ofi_ep_touch(struct ofi_ep *e, uint64_t bytes)
{
	atomic_fetch_add(&e->progress, bytes + 1);
}

int ofi_post_rx(struct ofi_ep *e, int i)
{
	struct ofi_rx *r = &e->rx[i];

	return fi_err(fi_recv(e->ep, r->buf, OFI_MSG_MAX, e->arena_desc, 0, &r->ctx));
}

/* Allocate the bounce buffers, open the CQ and EQ, bind and enable the endpoint. */
int ofi_ep_setup(struct ofi_ep *e, struct fi_info *info)
{
	struct fi_cq_attr cqa = { .format = FI_CQ_FORMAT_DATA,
				  .size = 4 * (OFI_NRX + OFI_NTX + OFI_NWR),
				  .wait_obj = ofi_wait_fds ? FI_WAIT_FD : FI_WAIT_NONE };
	struct fi_eq_attr eqa = { .size = 16,
				  .wait_obj = ofi_wait_fds ? FI_WAIT_FD : FI_WAIT_NONE };
	size_t asz = (size_t)(OFI_NRX + OFI_NTX) * OFI_MSG_MAX;
	int rc;

	e->arena = malloc(asz);
	if (!e->arena) {
		return -ENOMEM;
	}
	for (int i = 0; i < OFI_NRX; i++) {
		e->rx[i].ctx = (struct ofi_ctx){ .kind = CTX_RX, .idx = (uint16_t)i, .e = e };
		e->rx[i].buf = e->arena + (size_t)i * OFI_MSG_MAX;
	}
	for (int i = 0; i < OFI_NTX; i++) {
		e->tx[i].ctx = (struct ofi_ctx){ .kind = CTX_TX, .idx = (uint16_t)i, .e = e };
		e->tx[i].buf = e->arena + (size_t)(OFI_NRX + i) * OFI_MSG_MAX;
	}
	for (int i = 0; i < OFI_NWR; i++) {
		e->wr[i].ctx = (struct ofi_ctx){ .kind = CTX_WR, .idx = (uint16_t)i, .e = e };
	}
	if (e->d->mr_mode & FI_MR_LOCAL) {
		rc = fi_mr_reg(e->d->domain, e->arena, asz, FI_SEND | FI_RECV, 0,
			       (e->d->mr_mode & FI_MR_PROV_KEY) ? 0 : ofi_dom_key(e->d), 0,
			       &e->arena_mr, NULL);
		if (rc) {
			return fi_err(rc);
		}
		e->arena_desc = fi_mr_desc(e->arena_mr);
	}
	rc = fi_cq_open(e->d->domain, &cqa, &e->cq, e);
	if (rc == -FI_ENOSYS || rc == -FI_EINVAL) {
		if (ofi_wait_fds) {
			INFO("ofi: the provider has no FI_WAIT_FD completion queues, polling");
		}
		ofi_wait_fds = false;
		cqa.wait_obj = FI_WAIT_NONE;
		eqa.wait_obj = FI_WAIT_NONE;
		rc = fi_cq_open(e->d->domain, &cqa, &e->cq, e);
	}
	if (rc) {
		return fi_err(rc);
	}
	rc = fi_eq_open(e->d->fabric, &eqa, &e->eq, e);
	if (rc) {
		return fi_err(rc);
	}
	rc = fi_endpoint(e->d->domain, info, &e->ep, e);
	if (!rc) {
		rc = fi_ep_bind(e->ep, &e->eq->fid, 0);
	}
	if (!rc) {
		rc = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV);
	}
	if (!rc) {
		rc = fi_enable(e->ep);
	}
	if (rc) {
		return fi_err(rc);
	}
	for (int i = 0; i < OFI_NRX; i++) {
		rc = ofi_post_rx(e, i);
		if (rc) {
			return rc;
		}
	}
	if (ofi_wait_fds) {
		int fd;
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = e };

		if (fi_control(&e->cq->fid, FI_GETWAIT, &fd) == 0 &&
		    epoll_ctl(ofi_epfd, EPOLL_CTL_ADD, fd, &ev) == 0) {
			e->wait_fd[0] = fd;
		}
		if (fi_control(&e->eq->fid, FI_GETWAIT, &fd) == 0 &&
		    epoll_ctl(ofi_epfd, EPOLL_CTL_ADD, fd, &ev) == 0) {
			e->wait_fd[1] = fd;
		}
	}
	return 0;
}

static void ep_cache_ports(struct ofi_ep *e)
{
	struct sockaddr_in a;
	size_t len = sizeof(a);

	if (fi_getname(&e->ep->fid, &a, &len) == 0 && a.sin_family == AF_INET) {
		e->lport = ntohs(a.sin_port);
		e->lip = a.sin_addr.s_addr;
	}
	len = sizeof(a);
	if (fi_getpeer(e->ep, &a, &len) == 0 && a.sin_family == AF_INET) {
		e->rport = ntohs(a.sin_port);
		e->rip = a.sin_addr.s_addr;
	}
}

/* Opener: endpoint to ip:port from the NIC's domain; connect. On a connector thread (the
 * provider may resolve the address and route synchronously here). */
int ofi_ep_connect(struct ofi_ep *e)
{
	struct fi_info *info = ofi_lf_dupinfo(e->d->info);
	struct sockaddr_in *sa;
	int rc;

	if (!info) {
		return -ENOMEM;
	}
	sa = calloc(1, sizeof(*sa));
	if (!sa) {
		ofi_lf_freeinfo(info);
		return -ENOMEM;
	}
	sa->sin_family = AF_INET;
	sa->sin_addr.s_addr = e->ip;
	sa->sin_port = e->port;
	free(info->dest_addr);
	info->dest_addr = sa;
	info->dest_addrlen = sizeof(*sa);
	rc = ofi_ep_setup(e, info);
	if (!rc) {
		rc = fi_err(fi_connect(e->ep, sa, NULL, 0));
	}
	ofi_lf_freeinfo(info);
	e->st = ES_CONNECTING;
	return rc;
}

int ofi_tx_free_slot(struct ofi_ep *e)
{
	for (int i = 0; i < OFI_NTX; i++) {
		if (!e->tx[i].busy) {
			return i;
		}
	}
	return -1;
}

/* Post messages queued behind a full provider queue, in order. */
int ofi_tx_flush(struct ofi_ep *e)
{
	while (e->txq_n) {
		struct ofi_tx *t = &e->tx[e->txq[e->txq_head]];
		ssize_t rc = fi_send(e->ep, t->buf, t->len, e->arena_desc, 0, &t->ctx);

		if (rc == -FI_EAGAIN) {
			return 0;
		}
		if (rc) {
			return fi_err(rc);
		}
		e->txq_head = (e->txq_head + 1) % OFI_NTX;
		e->txq_n--;
	}
	return 0;
}

/* Send slot i (len bytes, header included); messages keep their order. On a hard error the
 * slot stays busy so that closing the endpoint accounts for it. */
int ofi_tx_post(struct ofi_ep *e, int i, size_t len)
{
	struct ofi_tx *t = &e->tx[i];

	t->len = len;
	t->busy = true;
	e->ntx_busy++;
	atomic_fetch_add(&e->outstanding, 1);
	e->txq[(e->txq_head + e->txq_n) % OFI_NTX] = i;
	e->txq_n++;
	return ofi_tx_flush(e);
}

/* Send [header][body] as one message. -EAGAIN: no free slot, try again later. */
int ofi_send_msg(struct ofi_ep *e, enum ofi_mkind kind, const void *body, size_t len)
{
	int i = ofi_tx_free_slot(e);
	struct ofi_tx *t;

	if (i < 0) {
		return -EAGAIN;
	}
	t = &e->tx[i];
	ofi_mhdr_put(t->buf, kind, (uint32_t)len);
	if (len && body != t->buf + OFI_MHDR_LEN) {
		memcpy(t->buf + OFI_MHDR_LEN, body, len);
	}
	t->core_len = 0;
	return ofi_tx_post(e, i, OFI_MHDR_LEN + len);
}

static void lane_release(void *tp)
{
	struct ofi_lane *ol = tp;

	ofi_adv_table_free(&ol->adv);
}

static void ep_detach(struct ofi_ep *e)
{
	struct rh_conn *c = e->conn;

	if (!c) {
		return;
	}
	rh_core_stream_detach(c, e->lane, e->idx, e, lane_release);
	e->lane = NULL;
	e->conn = NULL;
}

/* Close the endpoint (I/O thread): nothing is read or posted on it from now on. Its provider
 * objects go to a closer thread (closer.c), whose fi_close may block on a dead peer; once they
 * are released the I/O thread finishes the close (ofi_ep_closed) and frees it. Where no closer
 * takes them they are closed here, at once. */
void ofi_ep_close(struct ofi_ep *e)
{
	if (e->st == ES_CLOSED) {
		return;
	}
	e->st = ES_CLOSED;
	atomic_store(&e->outstanding, 0); /* nothing of it is a stalled transport any more */
	for (int i = 0; i < 2; i++) {
		if (e->wait_fd[i] >= 0) { /* before it closes: a ready fd would spin the I/O wait */
			epoll_ctl(ofi_epfd, EPOLL_CTL_DEL, e->wait_fd[i], NULL);
			e->wait_fd[i] = -1;
		}
	}
	if ((e->ep || e->cq || e->eq || e->arena_mr) && ofi_closer_push(e)) {
		e->closing = true;
		return;
	}
	ofi_ep_release_now(e);
	ofi_ep_closed(e);
}

/* The rest of the close, once the provider places and reads nothing more for the endpoint
 * (rule 1 of the fence): its send slots' accounting, then the io reference goes, a probe is
 * reported, a lane stream detached. */
void ofi_ep_closed(struct ofi_ep *e)
{
	for (int i = 0; i < OFI_NTX; i++) {
		if (e->tx[i].busy && e->tx[i].core_len && e->lane) {
			rh_core_ctrl_written(e->lane, e->tx[i].core_len);
		}
		e->tx[i].busy = false;
	}
	if (e->io_held) {
		e->io_held = false;
		rh_core_io_exit(e->conn);
	}
	if (e->kind == EK_PROBE_OUT && !e->probe_reported && e->conn) {
		e->probe_reported = true;
		rh_core_probe_done(e->conn, e->cookie, false);
	}
	if (e->cinfo) {
		ofi_lf_freeinfo(e->cinfo);
		e->cinfo = NULL;
	}
	if (e->kind == EK_LANE || e->kind == EK_LANE_IN) {
		ep_detach(e);
	} else if (e->conn) {
		rh_core_conn_put(e->conn);
		e->conn = NULL;
	}
}

/* A transport failure: a lane error for the core (which fences the lane), a failed probe. */
void ofi_ep_fail(struct ofi_ep *e, int err, const char *why)
{
	if (e->failed || e->st == ES_CLOSED) { /* closed: nothing more to say about it */
		return;
	}
	e->failed = true;
	if ((e->kind == EK_LANE || e->kind == EK_LANE_IN) && e->lane && !atomic_load(&e->fenced)) {
		TRACE("ofi: lane %u stream %d: %s (%s)", e->lane->id, e->idx, why, strerror(-err));
		rh_core_lane_error(e->lane, err);
	}
	ofi_ep_close(e);
}

void ofi_on_hello(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	struct rh_hdr h, ah = { .type = RH_F_HELLO_ACK };
	struct rh_hello in, reply;
	struct rh_lane *lane;
	struct rh_conn *c;
	uint8_t *out;
	int n;

	if ((e->st != ES_HELLO_IN && !(e->st == ES_CONNECTING && e->kind == EK_ACCEPTED)) ||
	    len < RH_HDR_LEN || rh_hdr_get(b, &h) < 0 || h.type != RH_F_HELLO ||
	    h.len > len - RH_HDR_LEN || rh_hello_get(b + RH_HDR_LEN, h.len, &in) < 0) {
		ofi_ep_close(e);
		return;
	}
	if (in.kind == RH_HELLO_PROBE) {
		if (!rh_core_probe_answer(&h, &in, &reply)) {
			ofi_ep_close(e);
			return;
		}
		e->kind = EK_PROBE_REPLY;
	} else {
		lane = rh_core_hello(&h, &in, &reply);
		if (!lane) {
			ofi_ep_close(e);
			return;
		}
		c = lane->conn; /* reference taken by rh_core_hello */
		if (rh_core_stream_attach(lane, in.stream, OFI_MAX_STREAMS, e,
					  sizeof(struct ofi_lane), true) < 0) {
			ofi_ep_close(e);
			return;
		}
		e->io_held = true;
		e->lane = lane;
		e->conn = c;
		e->idx = in.stream;
		e->kind = EK_LANE_IN;
	}
	out = malloc(RH_HDR_LEN + OFI_HELLO_MAX);
	if (!out) {
		ofi_ep_fail(e, -ENOMEM, "no memory");
		return;
	}
	n = rh_hello_put(&reply, out + RH_HDR_LEN, OFI_HELLO_MAX);
	ah.conn_id = h.conn_id;
	ah.epoch = h.epoch;
	ah.len = (uint32_t)(n > 0 ? n : 0);
	rh_hdr_put(&ah, out);
	n = ofi_send_msg(e, OFI_M_HELLO_ACK, out, RH_HDR_LEN + ah.len);
	free(out);
	if (n < 0) {
		ofi_ep_fail(e, n, "cannot answer the hello");
		return;
	}
	e->st = ES_READY;
	e->was_ready = true;
	e->last_rx_ms = rh_now_ms();
	e->deadline_ms = 0;
	if (e->kind == EK_LANE_IN) {
		ep_cache_ports(e);
		rh_core_stream_ready(e->lane, NULL);
	}
}

void ofi_on_hello_ack(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	struct rh_hdr h;
	struct rh_hello reply;

	if (e->st != ES_HELLO_WAIT || len < RH_HDR_LEN || rh_hdr_get(b, &h) < 0 ||
	    h.type != RH_F_HELLO_ACK || h.aux != 0 || h.len > len - RH_HDR_LEN ||
	    rh_hello_get(b + RH_HDR_LEN, h.len, &reply) < 0) {
		ofi_ep_fail(e, -ECONNREFUSED, "handshake refused");
		return;
	}
	if (e->kind == EK_PROBE_OUT) {
		e->probe_reported = true;
		rh_core_probe_done(e->conn, e->cookie,
				   rh_core_probe_check(e->conn, e->cookie, &reply));
		ofi_ep_close(e);
		return;
	}
	e->st = ES_READY;
	e->was_ready = true;
	e->last_rx_ms = rh_now_ms();
	e->deadline_ms = 0;
	ep_cache_ports(e);
	rh_core_stream_ready(e->lane, &reply);
}

/* The I/O thread takes over an endpoint a connector thread set up (e->connect_rc). */
void ofi_ep_start(struct ofi_ep *e)
{
	int rc = e->connect_rc;

	e->next = ofi_eps;
	ofi_eps = e;
	if (rc) {
		WARN("ofi: cannot open an endpoint from %s: %s", rh_core_nic(e->nic)->ifname,
		     strerror(-rc));
		ofi_ep_fail(e, rc, "connect failed");
	}
}

void ofi_ep_free(struct ofi_ep *e)
{
	free(e->hello);
	free(e->arena);
	free(e);
}
