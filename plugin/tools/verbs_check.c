/* SPDX-License-Identifier: Apache-2.0 */
/*
 * railhop-verbs-check: the verbs lane's device phases (lanes/verbs/) on a real RDMA device,
 * between two hosts (the Soft-RoCE VM lab's guests, tests/vm/test_verbs.py). It is not the lane:
 * the queue pair address and the receiver's buffer travel over a plain TCP socket here, where
 * the lane puts them inside its authenticated hello.
 *
 *   railhop-verbs-check recv DEV LOCAL_IP PORT BYTES ROUNDS IDLE_S
 *   railhop-verbs-check send DEV LOCAL_IP PEER_IP PORT BYTES ROUNDS
 *
 * Both open DEV through the dlopen shim, pick the RoCE v2 GID of LOCAL_IP from sysfs, create an
 * RC queue pair with RAILHOP_IB_TIMEOUT / RAILHOP_IB_RETRY_CNT (the plugin's parameters) and
 * connect it
 * RESET -> INIT -> RTR -> RTS. Per round the sender writes BYTES in 64 KiB chunks with
 * RDMA_WRITE_WITH_IMM (immediate: advert id = round, chunk index) into the receiver's
 * registered buffer; the receiver checks every byte of every chunk its completions name, then
 * acknowledges the round. A failed completion ends the side that sees it with its verdict
 * (exit 3); the receiver ends, exit 0, after IDLE_S seconds without a completion once at least
 * one round was received (a sender that lost the path cannot say goodbye over it). One JSON
 * line on stdout, with the device's async events read at the end (verbs_async_read: type,
 * verdict); "round N" progress lines on stderr.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../src/lanes/verbs/verbs.h"
#include "../src/param.h"

#define CHUNK (64u << 10)
#define DEPTH 64

struct peer_msg {
	uint8_t qp[VERBS_QP_INFO_LEN];
	uint64_t addr, size;
	uint32_t rkey;
} __attribute__((packed));

struct side {
	const char *dev;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct verbs_mr_cache mrc;
	struct verbs_qp_params p;
	struct verbs_qp_info me;
	char *buf;
	uint64_t bytes;
	uint32_t lkey, rkey;
	int sock;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint8_t pattern(uint64_t round, uint64_t off)
{
	return (uint8_t)((off * 131u + round * 7u + (off >> 12)) ^ 0x5a);
}

static int fail_out(const char *role, const char *what, int err)
{
	printf("{\"role\": \"%s\", \"error\": \"%s: %s\"}\n", role, what, strerror(-err));
	return 2;
}

static int open_dev(struct side *s, uint32_t ip)
{
	struct ibv_device **l;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	int n = 0;

	l = verbs_ib.get_device_list(&n);
	for (int i = 0; l && i < n; i++) {
		if (!strcmp(verbs_ib.get_device_name(l[i]), s->dev)) {
			s->ctx = verbs_ib.open_device(l[i]);
		}
	}
	if (l) {
		verbs_ib.free_device_list(l);
	}
	if (!s->ctx) {
		return -ENODEV;
	}
	/* async events are read (verbs_async_read) when the run ends, never waited for */
	if (fcntl(s->ctx->async_fd, F_SETFL, fcntl(s->ctx->async_fd, F_GETFL) | O_NONBLOCK)) {
		return -errno;
	}
	memset(&pa, 0, sizeof(pa));
	if (verbs_ib.query_port(s->ctx, 1, &pa)) {
		return -EIO;
	}
	if (pa.state != IBV_PORT_ACTIVE) {
		return -ENETDOWN;
	}
	verbs_qp_params_init(&s->p, 1, verbs_gid_index("", s->dev, 1, ip), pa.active_mtu, DEPTH);
	if (s->p.gid_index < 0) {
		return s->p.gid_index;
	}
	if (verbs_ib.query_gid(s->ctx, 1, s->p.gid_index, &gid)) {
		return -EIO;
	}
	s->pd = verbs_ib.alloc_pd(s->ctx);
	s->cq = s->pd ? verbs_ib.create_cq(s->ctx, 2 * DEPTH, NULL, NULL, 0) : NULL;
	if (!s->cq) {
		return -ENOMEM;
	}
	s->qp = verbs_qp_create(s->pd, s->cq, &s->p);
	if (!s->qp) {
		return -errno;
	}
	s->mrc.pd = s->pd;
	s->buf = aligned_alloc(4096, (s->bytes + 4095) & ~4095ull);
	if (!s->buf) {
		return -ENOMEM;
	}
	memset(s->buf, 0, s->bytes);
	if (verbs_mr_get(&s->mrc, s->buf, s->bytes, &s->lkey, &s->rkey)) {
		return -EIO;
	}
	s->me.qpn = s->qp->qp_num;
	if (getrandom(&s->me.psn, sizeof(s->me.psn), 0) != sizeof(s->me.psn)) {
		return -EIO;
	}
	s->me.psn &= 0xffffff;
	memcpy(s->me.gid, gid.raw, 16);
	s->me.mtu = (uint8_t)s->p.mtu;
	return 0;
}

static void close_dev(struct side *s)
{
	if (s->qp) {
		verbs_ib.destroy_qp(s->qp);
	}
	verbs_mr_clear(&s->mrc);
	if (s->cq) {
		verbs_ib.destroy_cq(s->cq);
	}
	if (s->pd) {
		verbs_ib.dealloc_pd(s->pd);
	}
	if (s->ctx) {
		verbs_ib.close_device(s->ctx);
	}
	free(s->buf);
	if (s->sock >= 0) {
		close(s->sock);
	}
}

static int full_io(int fd, void *b, size_t len, bool wr, int timeout_ms)
{
	size_t done = 0;

	while (done < len) {
		struct pollfd pf = { .fd = fd, .events = wr ? POLLOUT : POLLIN };
		ssize_t n;

		if (poll(&pf, 1, timeout_ms) <= 0) {
			return -ETIMEDOUT;
		}
		n = wr ? write(fd, (char *)b + done, len - done) :
			 read(fd, (char *)b + done, len - done);
		if (n <= 0) {
			return n == 0 ? -ECONNRESET : -errno;
		}
		done += (size_t)n;
	}
	return 0;
}

/* The queue pair addresses and the receiver's buffer, both ways; then RTS. */
static int exchange(struct side *s, struct peer_msg *peer)
{
	struct peer_msg m = { .addr = (uintptr_t)s->buf, .size = s->bytes, .rkey = s->rkey };
	struct verbs_qp_info r;
	int rc;

	verbs_qp_info_put(&s->me, m.qp);
	rc = full_io(s->sock, &m, sizeof(m), true, 30000);
	if (!rc) {
		rc = full_io(s->sock, peer, sizeof(*peer), false, 30000);
	}
	if (!rc) {
		rc = verbs_qp_info_get(peer->qp, sizeof(peer->qp), &r);
	}
	if (!rc) {
		rc = verbs_qp_connect(s->qp, &s->p, s->me.psn, &r);
	}
	return rc;
}

/* The device's pending async events as a JSON list (type, scope, err, port, qp_num). */
static const char *async_json(struct side *s)
{
	static char out[1024];
	struct verbs_async a;
	size_t n = 0;

	n += (size_t)snprintf(out + n, sizeof(out) - n, "[");
	for (int i = 0; i < 8 && verbs_async_read(s->ctx, &a) == 0; i++) {
		n += (size_t)snprintf(out + n, sizeof(out) - n,
				      "%s{\"type\": %d, \"scope\": %d, \"err\": %d, \"port\": %d, "
				      "\"qp_num\": %u}",
				      i ? ", " : "", a.type, a.v.scope, a.v.err, a.port, a.qp_num);
		if (n >= sizeof(out) - 2) {
			break;
		}
	}
	snprintf(out + n, sizeof(out) - n, "]");
	return out;
}

static void print_fail(struct side *s, const char *role, const struct verbs_poll_fail *f,
		       uint64_t rounds, double since_ok_ms)
{
	printf("{\"role\": \"%s\", \"rounds\": %llu, \"fail\": {\"status\": %d, "
	       "\"status_str\": \"%s\", \"scope\": %d, \"err\": %d, \"why\": \"%s\", "
	       "\"qp_num\": %u, \"ms_since_last_ok\": %.1f}, \"async\": %s}\n",
	       role, (unsigned long long)rounds, f->status,
	       verbs_ib.wc_status_str((enum ibv_wc_status)f->status), f->v.scope, f->v.err,
	       f->v.why, f->qp_num, since_ok_ms, async_json(s));
}

struct rx_state {
	struct side *s;
	uint64_t round, got, bad;
	bool proto_err;
};

static void on_rx(void *arg, const struct ibv_wc *wc)
{
	struct rx_state *st = arg;
	uint32_t adv, chunk;
	uint64_t off, len;

	if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM) {
		st->proto_err = true;
		return;
	}
	verbs_imm_decode(ntohl(wc->imm_data), &adv, &chunk);
	off = (uint64_t)chunk * CHUNK;
	if (adv != st->round % VERBS_NADV || off >= st->s->bytes) {
		st->proto_err = true;
		return;
	}
	len = st->s->bytes - off < CHUNK ? st->s->bytes - off : CHUNK;
	for (uint64_t i = 0; i < len; i++) {
		if ((uint8_t)st->s->buf[off + i] != pattern(st->round, off + i)) {
			st->bad++;
		}
	}
	st->got++;
}

static int post_recvs(struct side *s, int n)
{
	for (int i = 0; i < n; i++) {
		struct ibv_recv_wr wr = { .wr_id = 1 }, *bad;

		if (ibv_post_recv(s->qp, &wr, &bad)) {
			return -EIO;
		}
	}
	return 0;
}

static int run_recv(struct side *s, uint64_t rounds, int idle_s)
{
	struct rx_state st = { .s = s };
	uint64_t nchunks = (s->bytes + CHUNK - 1) / CHUNK;
	struct verbs_poll_fail f;
	double last = now_s();
	int nfail;

	if (post_recvs(s, DEPTH)) {
		return fail_out("recv", "post_recv", -EIO);
	}
	while (st.round < rounds) {
		uint64_t before = st.got;
		int n = verbs_cq_drain(s->cq, DEPTH, on_rx, &st, &f, &nfail);

		if (n < 0 || st.proto_err) {
			return fail_out("recv", "completion", n < 0 ? n : -EPROTO);
		}
		if (nfail) {
			print_fail(s, "recv", &f, st.round, (now_s() - last) * 1e3);
			return 3;
		}
		if (st.got > before) {
			last = now_s();
			if (post_recvs(s, (int)(st.got - before))) {
				return fail_out("recv", "post_recv", -EIO);
			}
		}
		if (st.got == nchunks) {
			uint8_t ack = 1;

			st.got = 0;
			st.round++;
			fprintf(stderr, "round %llu\n", (unsigned long long)st.round);
			if (full_io(s->sock, &ack, 1, true, 1000)) {
				break; /* the sender is gone or its path is: the idle rule ends us */
			}
		}
		if (now_s() - last > idle_s) {
			break;
		}
		if (n == 0) {
			usleep(100);
		}
	}
	printf("{\"role\": \"recv\", \"rounds\": %llu, \"bad_bytes\": %llu, \"partial\": %llu, "
	       "\"gid_index\": %d, \"mtu\": %d, \"async\": %s}\n",
	       (unsigned long long)st.round, (unsigned long long)st.bad, (unsigned long long)st.got,
	       s->p.gid_index, 128 << s->p.mtu, async_json(s));
	return st.bad || st.round == 0 ? 1 : 0;
}

static void on_tx(void *arg, const struct ibv_wc *wc)
{
	(void)wc;
	(*(uint64_t *)arg)++;
}

static int run_send(struct side *s, const struct peer_msg *peer, uint64_t rounds)
{
	uint64_t nchunks = (s->bytes + CHUNK - 1) / CHUNK;
	struct verbs_poll_fail f;
	double t0 = now_s(), last = t0;
	int nfail;

	if (peer->size != s->bytes) {
		return fail_out("send", "buffer sizes differ", -EINVAL);
	}
	for (uint64_t r = 0; r < rounds; r++) {
		uint64_t posted = 0, done = 0;
		uint8_t ack;

		for (uint64_t i = 0; i < s->bytes; i++) {
			s->buf[i] = (char)pattern(r, i);
		}
		while (done < nchunks) {
			while (posted < nchunks && posted - done < DEPTH) {
				uint64_t off = posted * CHUNK;
				struct ibv_sge sge = {
					.addr = (uintptr_t)s->buf + off,
					.length = (uint32_t)(s->bytes - off < CHUNK ?
								     s->bytes - off :
								     CHUNK),
					.lkey = s->lkey,
				};
				struct ibv_send_wr wr, *bad;
				uint32_t imm;

				memset(&wr, 0, sizeof(wr));
				verbs_imm_encode((uint32_t)(r % VERBS_NADV), posted, &imm);
				wr.wr_id = posted;
				wr.sg_list = &sge;
				wr.num_sge = 1;
				wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
				wr.send_flags = IBV_SEND_SIGNALED;
				wr.imm_data = htonl(imm);
				wr.wr.rdma.remote_addr = peer->addr + off;
				wr.wr.rdma.rkey = peer->rkey;
				if (ibv_post_send(s->qp, &wr, &bad)) {
					return fail_out("send", "post_send", -EIO);
				}
				posted++;
			}
			{
				uint64_t before = done;
				int n = verbs_cq_drain(s->cq, DEPTH, on_tx, &done, &f, &nfail);

				if (n < 0) {
					return fail_out("send", "poll", n);
				}
				if (nfail) {
					print_fail(s, "send", &f, r, (now_s() - last) * 1e3);
					return 3;
				}
				if (done > before) {
					last = now_s();
				} else {
					usleep(50);
				}
			}
		}
		if (full_io(s->sock, &ack, 1, false, 60000)) {
			return fail_out("send", "round acknowledgement", -ETIMEDOUT);
		}
	}
	printf("{\"role\": \"send\", \"rounds\": %llu, \"bytes\": %llu, \"seconds\": %.3f, "
	       "\"gid_index\": %d, \"mtu\": %d}\n",
	       (unsigned long long)rounds, (unsigned long long)(rounds * s->bytes), now_s() - t0,
	       s->p.gid_index, 128 << s->p.mtu);
	return 0;
}

static int tcp_setup(struct side *s, bool listen_side, uint32_t lip, uint32_t pip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	if (fd < 0) {
		return -errno;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (listen_side) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };

		a.sin_addr.s_addr = lip;
		if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 1) ||
		    poll(&pf, 1, 60000) != 1) {
			close(fd);
			return -ETIMEDOUT;
		}
		s->sock = accept(fd, NULL, NULL);
		close(fd);
		return s->sock < 0 ? -errno : 0;
	}
	{
		struct sockaddr_in l = { .sin_family = AF_INET, .sin_addr.s_addr = lip };

		if (bind(fd, (struct sockaddr *)&l, sizeof(l))) {
			close(fd);
			return -errno;
		}
	}
	a.sin_addr.s_addr = pip;
	for (int i = 0; i < 300; i++) {
		if (!connect(fd, (struct sockaddr *)&a, sizeof(a))) {
			s->sock = fd;
			return 0;
		}
		usleep(100000);
	}
	close(fd);
	return -ECONNREFUSED;
}

int main(int argc, char **argv)
{
	struct side s = { .sock = -1 };
	struct peer_msg peer;
	bool recv_side = argc == 8 && !strcmp(argv[1], "recv");
	bool send_side = argc == 8 && !strcmp(argv[1], "send");
	const char *role = recv_side ? "recv" : "send";
	uint32_t lip, pip = 0;
	uint64_t rounds;
	int rc, port;

	if (!recv_side && !send_side) {
		fprintf(stderr,
			"usage: %s recv DEV LOCAL_IP PORT BYTES ROUNDS IDLE_S\n"
			"       %s send DEV LOCAL_IP PEER_IP PORT BYTES ROUNDS\n",
			argv[0], argv[0]);
		return 2;
	}
	s.dev = argv[2];
	if (inet_pton(AF_INET, argv[3], &lip) != 1 ||
	    (send_side && inet_pton(AF_INET, argv[4], &pip) != 1)) {
		fprintf(stderr, "bad IPv4 address\n");
		return 2;
	}
	port = atoi(argv[recv_side ? 4 : 5]);
	s.bytes = strtoull(argv[recv_side ? 5 : 6], NULL, 10);
	rounds = strtoull(argv[recv_side ? 6 : 7], NULL, 10);
	if (port <= 0 || port > 65535 || s.bytes == 0 || s.bytes > (1ull << 30) || rounds == 0) {
		fprintf(stderr, "bad port, size (1..1 GiB) or round count\n");
		return 2;
	}
	if (rh_params_load() < 0) {
		return fail_out(role, "RAILHOP_* parameters", -EINVAL);
	}
	if (!verbs_ib_load()) {
		return fail_out(role, "libibverbs.so.1", -ENOENT);
	}
	rc = open_dev(&s, lip);
	if (rc) {
		rc = fail_out(role, "device set-up", rc);
		goto out;
	}
	rc = tcp_setup(&s, recv_side, lip, pip, port);
	if (!rc) {
		rc = exchange(&s, &peer);
	}
	if (rc) {
		rc = fail_out(role, "connection set-up", rc);
		goto out;
	}
	rc = recv_side ? run_recv(&s, rounds, atoi(argv[7])) : run_send(&s, &peer, rounds);
out:
	fflush(stdout);
	close_dev(&s);
	verbs_ib_unload();
	return rc;
}
