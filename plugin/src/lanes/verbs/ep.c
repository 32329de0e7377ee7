/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verbs lanes, endpoints (lane.h): the handshake over TCP (hello with the queue pair's address,
 * reply with the peer's, the opener's go), the queue pair with its receive buffers and send
 * slots, and closing. Everything runs on the I/O thread except verbs_ep_new, verbs_ep_qp and
 * verbs_ep_push (the core's open/probe calls, handing new endpoints to it).
 */

#include "lane.h"

#include <sys/socket.h>

#define VB_HS_IN_MAX (RH_HDR_LEN + VB_HELLO_MAX)

struct vb_ep *verbs_ep_new(enum vb_kind kind, int nic)
{
	struct vb_ep *e = calloc(1, sizeof(*e));

	if (!e) {
		return NULL;
	}
	e->hin = malloc(VB_HS_IN_MAX);
	if (!e->hin) {
		free(e);
		return NULL;
	}
	e->kind = kind;
	e->nic = nic;
	e->d = &verbs_devs[nic];
	e->fd = -1;
	e->st = VS_NEW;
	atomic_init(&e->fenced, false);
	atomic_init(&e->progress, 0);
	atomic_init(&e->outstanding, 0);
	return e;
}

void verbs_ep_push(struct vb_ep *e)
{
	pthread_mutex_lock(&verbs_pend_mu);
	e->next = verbs_pending;
	verbs_pending = e;
	pthread_mutex_unlock(&verbs_pend_mu);
	verbs_io_kick();
}

void verbs_ep_touch(struct vb_ep *e, uint64_t bytes)
{
	atomic_fetch_add(&e->progress, bytes + 1);
}

uint8_t *verbs_hello_msg(const struct rh_hello *hello, uint8_t type, uint64_t conn_id,
			 uint32_t epoch, size_t *len)
{
	struct rh_hdr h = { .type = type, .conn_id = conn_id, .epoch = epoch };
	uint8_t *b = malloc(RH_HDR_LEN + VB_HELLO_MAX);
	int n;

	if (!b) {
		return NULL;
	}
	n = rh_hello_put(hello, b + RH_HDR_LEN, VB_HELLO_MAX);
	if (n < 0) {
		free(b);
		return NULL;
	}
	h.len = (uint32_t)n;
	rh_hdr_put(&h, b);
	*len = RH_HDR_LEN + (size_t)n;
	return b;
}

/* --- the queue pair --- */

int verbs_post_rx(struct vb_ep *e, int i)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(e->arena + (size_t)i * VB_MSG_MAX),
			       .length = VB_MSG_MAX,
			       .lkey = e->arena_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = vb_wrid(VB_CTX_RX, i), .sg_list = &sge, .num_sge = 1 },
			   *bad;
	int rc = ibv_post_recv(e->qp, &wr, &bad);

	return rc > 0 ? -rc : rc;
}

int verbs_ep_qp(struct vb_ep *e)
{
	size_t asz = (size_t)(VB_NRX + VB_NTX) * VB_MSG_MAX;
	uint64_t r = rh_now_ns() ^ (uintptr_t)e;
	int rc;

	if (!e->d->ok) {
		return -ENODEV;
	}
	e->arena = malloc(asz);
	if (!e->arena) {
		return -ENOMEM;
	}
	for (int i = 0; i < VB_NTX; i++) {
		e->tx[i].buf = e->arena + (size_t)(VB_NRX + i) * VB_MSG_MAX;
	}
	e->arena_mr = verbs_ib.reg_mr(e->d->pd, e->arena, asz, IBV_ACCESS_LOCAL_WRITE);
	if (!e->arena_mr) {
		return errno ? -errno : -ENOMEM;
	}
	e->cq = verbs_ib.create_cq(e->d->ctx, 2 * (VB_NRX + VB_NTX + VB_NWR), e, e->d->ch, 0);
	if (!e->cq) {
		return errno ? -errno : -ENOMEM;
	}
	verbs_qp_params_init(&e->qpp, e->d->port, e->d->gid_index, e->d->mtu, VB_NTX + VB_NWR);
	e->qpp.max_recv_wr = VB_NRX;
	e->qp = verbs_qp_create(e->d->pd, e->cq, &e->qpp);
	if (!e->qp) {
		return errno ? -errno : -ENOMEM;
	}
	rc = verbs_qp_init(e->qp, &e->qpp);
	for (int i = 0; i < VB_NRX && rc == 0; i++) {
		rc = verbs_post_rx(e, i);
	}
	e->psn = (uint32_t)((r ^ (r >> 24) ^ (r >> 48)) & 0xffffff);
	return rc;
}

static void qp_info(const struct vb_ep *e, struct rh_hello *h)
{
	struct verbs_qp_info q = { .qpn = e->qp->qp_num, .psn = e->psn, .mtu = (uint8_t)e->d->mtu };

	memcpy(q.gid, e->d->gid.raw, 16);
	verbs_qp_info_put(&q, h->tp);
	h->tp_len = VERBS_QP_INFO_LEN;
}

/* The queue pair to RTR and RTS towards the peer's address in an authenticated hello, once
 * that address proved to be the peer NIC's (verbs_peer_qp_info); a refused one leaves the queue
 * pair in INIT, where it sends and accepts nothing. */
int verbs_ep_connect_peer(struct vb_ep *e, const struct rh_hello *peer, uint32_t peer_ip)
{
	struct verbs_qp_info q;
	char ip[INET_ADDRSTRLEN];
	int rc = verbs_peer_qp_info(peer->tp, peer->tp_len, peer_ip, &q);

	if (rc < 0) {
		inet_ntop(AF_INET, &peer_ip, ip, sizeof(ip));
		WARN("verbs: refused the queue pair address of the peer at %s: %s", ip,
		     rc == -EADDRNOTAVAIL ? "its GID is not the IPv4-mapped GID of that address" :
					    "malformed transport bytes (length, QPN, PSN or MTU)");
		return rc;
	}
	return verbs_qp_ready(e->qp, &e->qpp, e->psn, &q);
}

int verbs_tx_free_slot(struct vb_ep *e)
{
	for (int i = 0; i < VB_NTX; i++) {
		if (!e->tx[i].busy) {
			return i;
		}
	}
	return -1;
}

/* Send slot i (len bytes, header included). On an error the slot stays busy so that closing
 * the endpoint accounts for it. */
int verbs_tx_post(struct vb_ep *e, int i, size_t len)
{
	struct vb_tx *t = &e->tx[i];
	struct ibv_sge sge = { .addr = (uintptr_t)t->buf,
			       .length = (uint32_t)len,
			       .lkey = e->arena_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = vb_wrid(VB_CTX_TX, i),
				  .sg_list = &sge,
				  .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	int rc;

	t->len = len;
	t->busy = true;
	e->ntx_busy++;
	atomic_fetch_add(&e->outstanding, 1);
	rc = ibv_post_send(e->qp, &wr, &bad);
	return rc > 0 ? -rc : rc;
}

/* Send [header][body] as one message. -EAGAIN: no free slot, try again later. */
int verbs_send_msg(struct vb_ep *e, enum ofi_mkind kind, const void *body, size_t len)
{
	int i = verbs_tx_free_slot(e);
	struct vb_tx *t;

	if (i < 0) {
		return -EAGAIN;
	}
	t = &e->tx[i];
	ofi_mhdr_put(t->buf, kind, (uint32_t)len);
	if (len && body != t->buf + OFI_MHDR_LEN) {
		memcpy(t->buf + OFI_MHDR_LEN, body, len);
	}
	t->core_len = 0;
	return verbs_tx_post(e, i, OFI_MHDR_LEN + len);
}

/* --- closing --- */

static void lane_release(void *tp)
{
	struct vb_lane *vl = tp;

	ofi_adv_table_free(&vl->adv);
	free(vl->ids);
	vl->ids = NULL;
}

static void hs_close(struct vb_ep *e)
{
	if (e->fd >= 0) {
		close(e->fd); /* leaves the epoll set with its last descriptor */
		e->fd = -1;
	}
	free(e->hout);
	e->hout = NULL;
}

/* Close: after ibv_destroy_qp returns the device places and reads nothing more for the queue
 * pair (rule 1 of the fence); then the io reference goes. */
void verbs_ep_close(struct vb_ep *e)
{
	if (e->st == VS_CLOSED) {
		return;
	}
	e->st = VS_CLOSED;
	hs_close(e);
	if (e->qp) {
		verbs_qp_error(e->qp);
		verbs_ib.destroy_qp(e->qp);
		e->qp = NULL;
	}
	if (e->cq) {
		verbs_ib.destroy_cq(e->cq);
		e->cq = NULL;
	}
	if (e->arena_mr) {
		verbs_ib.dereg_mr(e->arena_mr);
		e->arena_mr = NULL;
	}
	for (int i = 0; i < VB_NTX; i++) {
		if (e->tx[i].busy && e->tx[i].core_len && e->lane) {
			rh_core_ctrl_written(e->lane, e->tx[i].core_len);
		}
		e->tx[i].busy = false;
	}
	e->ntx_busy = 0;
	atomic_store(&e->outstanding, 0);
	if (e->io_held) {
		e->io_held = false;
		rh_core_io_exit(e->conn);
	}
	if (e->kind == VK_PROBE_OUT && !e->probe_reported && e->conn) {
		e->probe_reported = true;
		rh_core_probe_done(e->conn, e->cookie, false);
	}
	if ((e->kind == VK_LANE || e->kind == VK_LANE_IN) && e->conn) {
		rh_core_stream_detach(e->conn, e->lane, 0, e, lane_release);
		e->lane = NULL;
		e->conn = NULL;
	} else if (e->conn) {
		rh_core_conn_put(e->conn);
		e->conn = NULL;
	}
}

void verbs_ep_free(struct vb_ep *e)
{
	verbs_ep_close(e);
	free(e->hin);
	free(e->arena);
	free(e);
}

/* Why an accepted handshake was refused before its hello named a lane (hs_read_hello,
 * on_hello; a hello the core refuses, -EACCES, has the core's own WARN). */
static const char *hs_refusal(int err)
{
	switch (err) {
	case -EPROTO:
		return "not a hello frame";
	case -EMSGSIZE:
		return "a hello length above what the lane accepts";
	case -EBADMSG:
		return "a malformed hello";
	case -ENOPROTOOPT:
		return "not a verbs lane's hello (stream count or queue pair address length)";
	case -EPIPE:
		return "closed before a whole hello";
	case -ETIMEDOUT:
		return "no whole hello before the handshake deadline";
	default:
		return strerror(-err);
	}
}

/* A refused handshake is logged at most once a second (anyone who reaches a NIC can send
 * many); the ones left out are counted into the next line. I/O thread only. */
static void hs_refused(struct vb_ep *e, const char *why)
{
	static uint64_t last_ms;
	static unsigned quiet;
	uint64_t now = rh_now_ms();
	struct sockaddr_in pa;
	socklen_t pl = sizeof(pa);
	char ip[INET_ADDRSTRLEN] = "?";

	if (last_ms && now - last_ms < 1000) {
		quiet++;
		return;
	}
	last_ms = now;
	if (e->fd >= 0 && getpeername(e->fd, (struct sockaddr *)&pa, &pl) == 0) {
		inet_ntop(AF_INET, &pa.sin_addr, ip, sizeof(ip));
	}
	WARN("verbs: refused a handshake on the lane listener of %s from %s: %s (%u more refused "
	     "since the last such line)",
	     rh_core_nic(e->nic)->ifname, ip, why, quiet);
	quiet = 0;
}

void verbs_ep_fail(struct vb_ep *e, int err, const char *why)
{
	if (e->failed) {
		return;
	}
	e->failed = true;
	if (e->kind == VK_ACCEPTED && err != -EACCES) {
		hs_refused(e, hs_refusal(err));
	}
	if ((e->kind == VK_LANE || e->kind == VK_LANE_IN) && e->lane && !atomic_load(&e->fenced)) {
		WARN("verbs: lane %u (%s): %s (%s)", e->lane->id, rh_core_nic(e->nic)->ifname, why,
		     strerror(-err));
		rh_core_lane_error(e->lane, err);
	}
	verbs_ep_close(e);
}

/* --- the handshake --- */

/* A lane's handshake (TCP connect, hello, reply, go) has as long as the core gives a lane to
 * open: two probe timeouts and VB_HS_MS. */
static uint64_t verbs_hs_ms(void)
{
	return VB_HS_MS + 2 * (uint64_t)rh_param.PROBE_TIMEOUT;
}

void verbs_ep_start(struct vb_ep *e)
{
	struct sockaddr_in la = { .sin_family = AF_INET,
				  .sin_addr.s_addr = rh_core_nic(e->nic)->ipv4 };
	struct sockaddr_in ra = { .sin_family = AF_INET,
				  .sin_addr.s_addr = e->ip,
				  .sin_port = e->port };
	int rc = 0;

	e->next = verbs_eps;
	verbs_eps = e;
	e->deadline_ms = e->deadline_ms ? e->deadline_ms : rh_now_ms() + verbs_hs_ms();
	e->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (e->fd < 0 || bind(e->fd, (struct sockaddr *)&la, sizeof(la)) < 0 ||
	    (connect(e->fd, (struct sockaddr *)&ra, sizeof(ra)) < 0 && errno != EINPROGRESS)) {
		rc = -errno;
	}
	e->st = VS_CONNECTING;
	if (rc == 0) {
		verbs_io_watch(e->fd, e, 0);
		verbs_ep_hs_io(e);
		return;
	}
	verbs_ep_fail(e, rc, "cannot connect the handshake");
}

/* Anyone who reaches a NIC can connect to its listener: at most VB_HS_MAX accepted handshakes
 * wait for their hello; one more closes the oldest of them (each also has its deadline). */
static void hs_room(void)
{
	struct vb_ep *oldest = NULL;
	int n = 0;

	for (struct vb_ep *o = verbs_eps; o; o = o->next) {
		if (o->kind != VK_ACCEPTED || o->st != VS_HELLO_IN) {
			continue;
		}
		n++;
		if (!oldest || o->deadline_ms < oldest->deadline_ms) {
			oldest = o;
		}
	}
	if (n >= VB_HS_MAX && oldest) {
		hs_refused(oldest, "too many handshakes wait for their hello: closed the oldest");
		verbs_ep_close(oldest);
	}
}

void verbs_ep_accept(int nic, int lfd)
{
	for (int k = 0; k < 16; k++) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct vb_ep *e;

		if (fd < 0) {
			return;
		}
		hs_room();
		e = verbs_ep_new(VK_ACCEPTED, nic);
		if (!e) {
			close(fd);
			return;
		}
		e->fd = fd;
		e->st = VS_HELLO_IN;
		e->deadline_ms = rh_now_ms() + verbs_hs_ms();
		e->next = verbs_eps;
		verbs_eps = e;
		verbs_io_watch(fd, e, 0);
		verbs_ep_hs_io(e);
	}
}

/* Write what is pending; 1 when all of it left, 0 when the socket is full, -errno. */
static int hs_flush(struct vb_ep *e)
{
	while (e->hout && e->hout_off < e->hout_len) {
		ssize_t n =
			send(e->fd, e->hout + e->hout_off, e->hout_len - e->hout_off, MSG_NOSIGNAL);

		if (n < 0) {
			return errno == EAGAIN ? 0 : -errno;
		}
		e->hout_off += (size_t)n;
	}
	return 1;
}

/* Read until want bytes are in; 1 when they are, 0 for later, -errno (peer closed: -EPIPE). */
static int hs_read(struct vb_ep *e, size_t want)
{
	while (e->hin_got < want) {
		ssize_t n = recv(e->fd, e->hin + e->hin_got, want - e->hin_got, 0);

		if (n == 0) {
			return -EPIPE;
		}
		if (n < 0) {
			return errno == EAGAIN ? 0 : -errno;
		}
		e->hin_got += (size_t)n;
	}
	return 1;
}

/* A whole frame (header + hello) read: 1 with *h and *in, 0 for later, -errno. */
static int hs_read_hello(struct vb_ep *e, uint8_t type, struct rh_hdr *h, struct rh_hello *in)
{
	int rc = hs_read(e, RH_HDR_LEN);

	if (rc <= 0) {
		return rc;
	}
	/* the header's payload length (bytes 4..7): above what a hello takes, the frame is
	 * refused as too long (rh_hdr_get refuses any control frame above RH_CTRL_MAX) */
	if (e->hin[0] == type && (e->hin[4] | e->hin[5] << 8 | e->hin[6] << 16 |
				  (uint32_t)e->hin[7] << 24) > VB_HELLO_MAX) {
		return -EMSGSIZE;
	}
	if (rh_hdr_get(e->hin, h) < 0 || h->type != type) {
		return -EPROTO;
	}
	rc = hs_read(e, RH_HDR_LEN + h->len);
	if (rc <= 0) {
		return rc;
	}
	return rh_hello_get(e->hin + RH_HDR_LEN, h->len, in) < 0 ? -EBADMSG : 1;
}

static int set_out(struct vb_ep *e, uint8_t *b, size_t len)
{
	if (!b) {
		return -ENOMEM;
	}
	free(e->hout);
	e->hout = b;
	e->hout_len = len;
	e->hout_off = 0;
	return 0;
}

/* Acceptor: the hello arrived. */
static int on_hello(struct vb_ep *e, const struct rh_hdr *h, struct rh_hello *in)
{
	struct rh_hello reply;
	struct rh_lane *lane;
	uint8_t *out;
	size_t len = 0;
	int rc;

	if (in->kind == RH_HELLO_PROBE) {
		if (!rh_core_probe_answer(h, in, &reply)) {
			return -EACCES;
		}
		e->kind = VK_PROBE_REPLY;
		out = verbs_hello_msg(&reply, RH_F_HELLO_ACK, h->conn_id, h->epoch, &len);
		return set_out(e, out, len);
	}
	if (in->nstreams != 1 || in->tp_len != VERBS_QP_INFO_LEN) {
		return -ENOPROTOOPT; /* not a verbs lane's hello: nothing was taken yet */
	}
	lane = rh_core_hello(h, in, &reply);
	if (!lane) {
		return -EACCES;
	}
	if (rh_core_stream_attach(lane, 0, 1, e, sizeof(struct vb_lane), true) < 0) {
		return -EPROTO; /* the reference was dropped */
	}
	e->io_held = true;
	e->lane = lane;
	e->conn = lane->conn;
	e->kind = VK_LANE_IN;
	rc = verbs_ep_qp(e);
	if (rc == 0) {
		struct sockaddr_in pa;
		socklen_t pl = sizeof(pa);

		rc = getpeername(e->fd, (struct sockaddr *)&pa, &pl) < 0 ? -errno : 0;
		if (rc == 0) {
			rc = verbs_ep_connect_peer(e, in, pa.sin_addr.s_addr);
		}
	}
	if (rc == 0) {
		qp_info(e, &reply);
		rc = rh_core_sign_reply(lane, in, &reply);
	}
	if (rc == 0) {
		out = verbs_hello_msg(&reply, RH_F_HELLO_ACK, h->conn_id, h->epoch, &len);
		rc = set_out(e, out, len);
	}
	return rc;
}

/* Opener: the reply arrived (its MAC is checked by the core before the queue pair moves). */
static int on_reply(struct vb_ep *e, const struct rh_hdr *h, const struct rh_hello *reply)
{
	static const uint8_t go = 'G';
	int rc;

	if (h->aux != 0) {
		return -ECONNREFUSED;
	}
	if (e->kind == VK_PROBE_OUT) {
		e->probe_reported = true;
		rh_core_probe_done(e->conn, e->cookie,
				   rh_core_probe_check(e->conn, e->cookie, reply));
		verbs_ep_close(e);
		return 0;
	}
	if (reply->tp_len != VERBS_QP_INFO_LEN) {
		return -EPROTO;
	}
	e->st = VS_READY;
	e->deadline_ms = 0;
	e->last_rx_ms = rh_now_ms();
	rh_core_stream_ready(e->lane, reply);
	if (atomic_load(&e->fenced)) {
		return 0; /* refused by the core (the reply did not prove the secret): fenced */
	}
	rc = verbs_ep_connect_peer(e, reply, e->ip);
	if (rc == 0 && send(e->fd, &go, 1, MSG_NOSIGNAL) != 1) {
		rc = -EPIPE;
	}
	hs_close(e);
	return rc;
}

void verbs_ep_hs_io(struct vb_ep *e)
{
	struct rh_hdr h;
	struct rh_hello in;
	int rc = 0;

	if (e->fd < 0 || e->st == VS_CLOSED) {
		return;
	}
	switch (e->st) {
	case VS_CONNECTING: {
		int err = 0;
		socklen_t l = sizeof(err);

		if (getsockopt(e->fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0 || err) {
			rc = err ? -err : -errno;
			break;
		}
		rc = hs_flush(e);
		if (rc == 1 && e->hout) {
			e->st = VS_HELLO_WAIT;
			e->hin_got = 0;
		} else {
			rc = rc < 0 ? rc : 0;
			break;
		}
	}
		/* fall through */
	case VS_HELLO_WAIT:
		rc = hs_read_hello(e, RH_F_HELLO_ACK, &h, &in);
		if (rc == 1) {
			rc = on_reply(e, &h, &in);
		}
		break;
	case VS_HELLO_IN:
		rc = hs_read_hello(e, RH_F_HELLO, &h, &in);
		if (rc == 1) {
			rc = on_hello(e, &h, &in);
			if (rc == 0) {
				e->st = VS_GO_WAIT;
				e->hin_got = 0;
				rc = hs_flush(e);
				if (rc == 1 && e->kind == VK_PROBE_REPLY) {
					verbs_ep_close(e);
					return;
				}
				rc = rc < 0 ? rc : 0;
			}
		}
		break;
	case VS_GO_WAIT:
		rc = hs_flush(e);
		if (rc == 1 && e->kind == VK_PROBE_REPLY) {
			verbs_ep_close(e);
			return;
		}
		if (rc == 1) {
			rc = hs_read(e, 1);
			if (rc == 1 && e->hin[0] == 'G') {
				hs_close(e);
				e->st = VS_READY;
				e->deadline_ms = 0;
				e->last_rx_ms = rh_now_ms();
				rh_core_stream_ready(e->lane, NULL);
				return;
			}
			rc = rc == 1 ? -EPROTO : rc;
		}
		break;
	default:
		break;
	}
	if (rc < 0) {
		verbs_ep_fail(e, rc, "handshake failed");
	}
}
