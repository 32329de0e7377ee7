/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Writes the fuzz targets' seed corpora (plugin/fuzz/corpus/<target>/) from the real encoders:
 * frames and control payloads (core/wire.c), hellos and connect handles, the ofi lane's
 * messages and immediates, the verbs lane's (when built with verbs), health tables laid out
 * as the agent writes them (railhop/ctl_table.h) and the kernel's sock_diag answers. Each file is one input in its target's format
 * (the target's comment says which byte picks what).
 *
 *   gen_seeds <corpus dir>     (docs/fuzzing.md; the output is committed)
 */
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/wire.h"
#include "ctl.h"
#include "lanes/ofi/proto.h"
#ifdef RH_HAVE_VERBS
#include "lanes/verbs/proto.h"
#endif

static const char *root;
static int failures;

static void put(const char *target, const char *name, uint8_t mode, const uint8_t *b, size_t len)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, target);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%s/%s", root, target, name);
	f = fopen(path, "wb");
	if (!f || (mode != 0xff && fwrite(&mode, 1, 1, f) != 1) ||
	    (len && fwrite(b, 1, len, f) != len) || fclose(f) != 0) {
		fprintf(stderr, "gen_seeds: %s: %s\n", path, strerror(errno));
		failures++;
	}
}

#define NO_MODE 0xff /* the target takes the bytes as they are */

static void le32(uint8_t *b, uint32_t v)
{
	for (int i = 0; i < 4; i++) {
		b[i] = (uint8_t)(v >> (8 * i));
	}
}

static void le64(uint8_t *b, uint64_t v)
{
	for (int i = 0; i < 8; i++) {
		b[i] = (uint8_t)(v >> (8 * i));
	}
}

/* ---- core frames ---- */

static size_t frame(uint8_t *b, uint8_t type, uint8_t slot, uint32_t aux, const uint8_t *p,
		    size_t plen)
{
	struct rh_hdr h = { .type = type,
			    .slot = slot,
			    .len = (uint32_t)plen,
			    .conn_id = 0x1122334455667788ull,
			    .epoch = 3,
			    .aux = aux,
			    .seq = 41 };

	if (type == RH_F_DATA) {
		h.off = 131072;
		h.total = 131072 + plen + 4096;
	}
	rh_hdr_put(&h, b);
	if (plen) {
		memcpy(b + RH_HDR_LEN, p, plen);
	}
	return RH_HDR_LEN + plen;
}

static void fill_hello(struct rh_hello *h, int kind, int nnics, uint8_t tp_len)
{
	memset(h, 0, sizeof(*h));
	h->kind = (uint8_t)kind;
	h->from_sender = 1;
	h->nstreams = kind == RH_HELLO_PROBE ? 0 : 2;
	h->stream = kind == RH_HELLO_PROBE ? 0 : 1;
	h->lane_id = 5;
	h->listen_id = 0xabcdef01ull;
	h->chunk = 131072;
	h->src_nic = 1;
	h->dst_nic = 2;
	for (int i = 0; i < RH_NONCE_LEN; i++) {
		h->nonce[i] = (uint8_t)i;
		h->snonce[i] = (uint8_t)(0x80 + i);
	}
	memset(h->mac, 0x5a, sizeof(h->mac));
	h->flags = RH_HELLO_F_PMAC;
	h->nnics = nnics;
	for (int i = 0; i < nnics; i++) {
		h->nics[i].ipv4 = 0x0100000a + ((uint32_t)i << 24);
		h->nics[i].port = (uint16_t)(0x3930 + i);
		h->nics[i].rail = (int16_t)i;
		h->nics[i].numa = (int16_t)(i / 2);
		h->nics[i].up = i != 1;
		snprintf(h->nics[i].pci, sizeof(h->nics[i].pci), "0000:%02x:00.0", 0x17 + i);
	}
	h->tp_len = tp_len;
	for (int i = 0; i < tp_len; i++) {
		h->tp[i] = (uint8_t)(0xc0 + i);
	}
}

static int hello_bytes(int kind, int nnics, uint8_t tp_len, uint8_t *b, size_t cap)
{
	struct rh_hello h;

	fill_hello(&h, kind, nnics, tp_len);
	return rh_hello_put(&h, b, cap);
}

static void seeds_frames(void)
{
	static uint8_t b[4 * RH_CTRL_MAX], p[RH_CTRL_MAX];
	static struct rh_resume r;
	struct rh_cts cts = { .seq = 41, .n = 3 };
	uint32_t dead[3] = { 1, 4, 9 };
	size_t o = 0;
	int n;

	for (int i = 0; i < cts.n; i++) {
		cts.tags[i] = i - 1;
		cts.sizes[i] = 1000u << i;
	}
	n = rh_cts_put(&cts, p, sizeof(p));
	o = frame(b, RH_F_CTS, 0, (uint32_t)cts.n, p, (size_t)n);
	put("frames", "cts", NO_MODE, b, o);

	n = rh_dead_put(3, dead, p, sizeof(p));
	o = frame(b, RH_F_FAILREQ, 0, 0, p, (size_t)n);
	put("frames", "failreq", NO_MODE, b, o);

	memset(&r, 0, sizeof(r));
	r.next_seq = 44;
	r.ndead = 1;
	r.dead[0] = 2;
	r.nout = 2;
	for (int i = 0; i < r.nout; i++) {
		r.out[i].seq = 42 + (uint64_t)i;
		r.out[i].n = 2;
		r.out[i].tags[0] = 7;
		r.out[i].sizes[0] = 1 << 20;
		r.out[i].tags[1] = 8;
		r.out[i].sizes[1] = 4096;
		r.done[i] = 2;
		r.nruns[i][0] = 2;
		r.runs[i][0][0] = (struct rh_run){ .start = 0, .count = 3 };
		r.runs[i][0][1] = (struct rh_run){ .start = 5, .count = 1 };
	}
	n = rh_resume_put(&r, p, sizeof(p));
	o = frame(b, RH_F_RESUME, 0, RH_RESUME_ANSWER, p, (size_t)n);
	put("frames", "resume", NO_MODE, b, o);

	n = hello_bytes(RH_HELLO_CONN, 3, 0, p, sizeof(p));
	o = frame(b, RH_F_HELLO, 0, 0, p, (size_t)n);
	put("frames", "hello", NO_MODE, b, o);
	n = hello_bytes(RH_HELLO_LANE, 0, 0, p, sizeof(p));
	o = frame(b, RH_F_HELLO_ACK, 0, 0, p, (size_t)n);
	put("frames", "hello_ack", NO_MODE, b, o);

	/* a control message as a lane sends it: CTS, ACK, BYE, a zero-byte DATA, FAILREQ */
	n = rh_cts_put(&cts, p, sizeof(p));
	o = frame(b, RH_F_CTS, 1, (uint32_t)cts.n, p, (size_t)n);
	o += frame(b + o, RH_F_ACK, 2, 0, NULL, 0);
	o += frame(b + o, RH_F_BYE, 0, 4, NULL, 0);
	o += frame(b + o, RH_F_DATA, 3, 0, NULL, 0);
	n = rh_dead_put(2, dead, p, sizeof(p));
	o += frame(b + o, RH_F_FAILREQ, 0, 0, p, (size_t)n);
	put("frames", "stream", NO_MODE, b, o);
}

/* ---- hellos and handles ---- */

static void seeds_hello(void)
{
	uint8_t b[4096];
	struct rh_handle h = { .nnics = 4, .listen_nic = 1, .listen_id = 0x0102030405060708ull };
	int n;

	n = hello_bytes(RH_HELLO_CONN, 4, 0, b, sizeof(b));
	put("hello", "conn_4nics", 0, b, (size_t)n);
	n = hello_bytes(RH_HELLO_LANE, 0, 0, b, sizeof(b));
	put("hello", "lane", 0, b, (size_t)n);
	n = hello_bytes(RH_HELLO_PROBE, 0, 0, b, sizeof(b));
	put("hello", "probe", 0, b, (size_t)n);
	/* the verbs lane's queue pair address rides in the transport bytes */
	n = hello_bytes(RH_HELLO_LANE, 1, 25, b, sizeof(b));
	put("hello", "lane_tp", 0, b, (size_t)n);
	n = hello_bytes(RH_HELLO_CONN, RH_MAX_NICS, RH_HELLO_TP_MAX, b, sizeof(b));
	put("hello", "conn_full", 0, b, (size_t)n);

	for (int i = 0; i < h.nnics; i++) {
		h.nics[i].ipv4 = 0x0100000a + ((uint32_t)i << 24);
		h.nics[i].port = (uint16_t)(0x3930 + i);
		h.nics[i].rail = (int8_t)i;
		h.nics[i].up = 1;
	}
	memset(h.secret, 0xa5, sizeof(h.secret));
	rh_handle_put(&h, b);
	put("hello", "handle", 1, b, RH_HANDLE_LEN);
	h.nnics = RH_HANDLE_NICS;
	h.listen_nic = RH_HANDLE_NICS - 1;
	rh_handle_put(&h, b);
	put("hello", "handle_full", 1, b, RH_HANDLE_LEN);
}

/* ---- the ofi lane ---- */

static void seeds_ofi(void)
{
	static uint8_t b[OFI_MSG_MAX + 64];
	static uint64_t placed[4] = { 0x5, 0, 0xffffffffffffffffull, 1 };
	struct ofi_adv_req q = { .seq = 1000, .total = 1 << 20, .epoch = 2, .slot = 1 };
	struct ofi_adv_msg a = { .seq = 1000,
				 .addr = 0x7f0000001000ull,
				 .key = 0x1234,
				 .size = 1 << 20,
				 .epoch = 2,
				 .slot = 1,
				 .status = OFI_ADV_OK,
				 .nwords = 4 };
	struct ofi_imm im = { .seq = 1000, .slot = 1, .chunk = 3, .epoch = 2 };
	struct rh_cts cts = { .seq = 41, .n = 1, .tags = { 9 }, .sizes = { 4096 } };
	uint64_t v;
	size_t o, body;
	int n;

	/* CORE: a CTS and an ACK */
	o = OFI_MHDR_LEN;
	n = rh_cts_put(&cts, b + 256, 64);
	o += frame(b + o, RH_F_CTS, 0, 1, b + 256, (size_t)n);
	o += frame(b + o, RH_F_ACK, 0, 0, NULL, 0);
	ofi_mhdr_put(b, OFI_M_CORE, (uint32_t)(o - OFI_MHDR_LEN));
	put("ofi", "msg_core", 0, b, o);
	/* HELLO: a hello frame */
	n = hello_bytes(RH_HELLO_CONN, 2, 0, b + 1024, 2048);
	o = OFI_MHDR_LEN + frame(b + OFI_MHDR_LEN, RH_F_HELLO, 0, 0, b + 1024, (size_t)n);
	ofi_mhdr_put(b, OFI_M_HELLO, (uint32_t)(o - OFI_MHDR_LEN));
	put("ofi", "msg_hello", 0, b, o);
	/* EPOCH marker */
	ofi_mhdr_put(b, OFI_M_EPOCH, 4);
	le32(b + OFI_MHDR_LEN, 7);
	put("ofi", "msg_epoch", 0, b, OFI_MHDR_LEN + 4);
	/* ADV_REQ and ADV, bare and as messages */
	ofi_adv_req_put(&q, b);
	put("ofi", "adv_req", 1, b, OFI_ADV_REQ_LEN);
	n = ofi_adv_put(&a, placed, b, sizeof(b));
	put("ofi", "adv", 2, b, (size_t)n);
	a.status = OFI_ADV_STALE;
	a.nwords = 0;
	n = ofi_adv_put(&a, placed, b, sizeof(b));
	put("ofi", "adv_stale", 2, b, (size_t)n);
	body = ofi_adv_req_put(&q, b + OFI_MHDR_LEN);
	ofi_mhdr_put(b, OFI_M_ADV_REQ, (uint32_t)body);
	put("ofi", "msg_adv_req", 0, b, OFI_MHDR_LEN + body);
	/* immediates (wide: 8 bytes, narrow: 4), a reference, the record's request, size, chunk */
	for (int w = 0; w < 2; w++) {
		const struct ofi_imm_layout *l = w ? &ofi_imm_narrow : &ofi_imm_wide;
		int width = w ? 4 : 8;

		if (ofi_imm_encode(l, &im, &v) < 0) {
			failures++;
			continue;
		}
		o = 0;
		for (int i = 0; i < width; i++) {
			b[o++] = (uint8_t)(v >> (8 * i));
		}
		le64(b + o, 1003); /* reference seq/epoch */
		o += 8;
		o += ofi_adv_req_put(&q, b + o);
		le64(b + o, 1 << 20); /* the posted buffer's size */
		le32(b + o + 8, 131072); /* chunk size */
		o += 12;
		put("ofi", w ? "imm_narrow" : "imm_wide", w ? 4 : 3, b, o);
	}
}

#ifdef RH_HAVE_VERBS
static void seeds_verbs(void)
{
	uint8_t b[1024];
	struct verbs_qp_info qi = { .qpn = 0x1234, .psn = 0xabcde, .mtu = 3 };
	struct ofi_adv_msg a = { .seq = 77,
				 .addr = 0x1000,
				 .key = 0x99,
				 .size = 1 << 16,
				 .epoch = 1,
				 .slot = 2,
				 .nwords = 1 };
	struct ofi_adv_req q = { .seq = 77, .total = 1 << 16, .epoch = 1, .slot = 2 };
	uint64_t placed = 1;
	uint32_t ip = 0x0200000a, imm; /* 10.0.0.2, network order */
	size_t o;
	int n;

	verbs_gid_of_ipv4(ip, qi.gid);
	verbs_qp_info_put(&qi, b);
	put("verbs", "qp_info", 0, b, VERBS_QP_INFO_LEN);
	memcpy(b, &ip, 4);
	verbs_qp_info_put(&qi, b + 4);
	put("verbs", "peer_qp_info", 1, b, 4 + VERBS_QP_INFO_LEN);
	verbs_adv_id_put(5, b);
	n = ofi_adv_put(&a, &placed, b + VERBS_ADV_ID_LEN, sizeof(b) - VERBS_ADV_ID_LEN);
	put("verbs", "adv", 2, b, VERBS_ADV_ID_LEN + (size_t)n);
	/* one request answered (advert id 0), a write of its chunk 1 */
	if (verbs_imm_encode(0, 1, &imm) < 0) {
		failures++;
		return;
	}
	le32(b, imm);
	le32(b + 4, 16384);
	o = 8 + ofi_adv_req_put(&q, b + 8);
	le64(b + o, 1 << 16);
	o += 8;
	put("verbs", "write", 3, b, o);
}
#endif

/* ---- the health table, as the agent lays it out ---- */

static uint32_t table_crc(const uint8_t *f, uint32_t n)
{
	uint32_t crc = rh_ctl_crc32(0, f + RH_CTL_BODY_OFFSET + 4, sizeof(struct rh_ctl_body) - 4);

	crc = rh_ctl_crc32(crc, f + RH_CTL_NICS_OFFSET, (uint64_t)n * sizeof(struct rh_ctl_nic));
	return rh_ctl_crc32(crc, f + RH_CTL_PLANS_OFFSET, (uint64_t)n * sizeof(struct rh_ctl_plan));
}

static void table(uint8_t *f, uint16_t nics, uint16_t minor, uint32_t flags)
{
	struct rh_ctl_header h = { .magic = RH_CTL_MAGIC,
				   .layout_version = RH_CTL_LAYOUT_VERSION,
				   .header_size = sizeof(struct rh_ctl_header),
				   .table_size = RH_CTL_TABLE_SIZE,
				   .max_nics = RH_CTL_MAX_NICS,
				   .max_backups = RH_CTL_MAX_BACKUPS,
				   .nic_rec_size = sizeof(struct rh_ctl_nic),
				   .plan_rec_size = sizeof(struct rh_ctl_plan),
				   .agent_pid = 1,
				   .generation = 3,
				   .seq = 10 };
	struct rh_ctl_body b = { .flags = flags,
				 .publish_count = 5,
				 .nic_count = nics,
				 .layout_minor = minor,
				 .heartbeat_ms = 100,
				 .completion_ms = 2000,
				 .rail_rule = RH_CTL_RULE_ALLOWED_PAIRS,
				 .distance_limit = RH_DIST_PHB,
				 .min_rails_up = 1,
				 .backup_lanes = 2 };

	memset(f, 0, RH_CTL_TABLE_SIZE);
	for (uint16_t i = 0; i < nics; i++) {
		struct rh_ctl_nic nic = { .rail = i,
					  .state = (uint8_t)(RH_NIC_UP + i % 4),
					  .reason = RH_REASON_CARRIER,
					  .numa = (int16_t)(i / 2),
					  .speed_mbps = 100000,
					  .rail_peers = 1ull << i };
		struct rh_ctl_plan plan = { .count = nics > 1 ? 1 : 0, .plan_version = 5 };

		snprintf(nic.ifname, sizeof(nic.ifname), "eth%u", i);
		snprintf(nic.pci, sizeof(nic.pci), "0000:%02x:00.0", 0x17 + i);
		plan.backups[0] = (struct rh_ctl_backup){ .local_nic = (uint16_t)((i + 1) % nics),
							  .remote_rail = RH_CTL_NO_RAIL,
							  .weight = 10000,
							  .distance = RH_DIST_PIX };
		memcpy(f + RH_CTL_NICS_OFFSET + i * sizeof(nic), &nic, sizeof(nic));
		memcpy(f + RH_CTL_PLANS_OFFSET + i * sizeof(plan), &plan, sizeof(plan));
	}
	memcpy(f, &h, sizeof(h));
	memcpy(f + RH_CTL_BODY_OFFSET, &b, sizeof(b));
	b.crc32 = table_crc(f, nics);
	memcpy(f + RH_CTL_BODY_OFFSET, &b, sizeof(b));
}

/* the table without its trailing zero bytes: the target's bit 1 pads it back */
static void put_table(const char *name, const uint8_t *f, uint8_t mode)
{
	size_t len = RH_CTL_TABLE_SIZE;

	while (len > RH_CTL_NICS_OFFSET && f[len - 1] == 0) {
		len--;
	}
	put("ctl", name, mode | 2, f, len);
}

static void seeds_ctl(void)
{
	static uint8_t f[RH_CTL_TABLE_SIZE];

	/* bit 2: a fresh heartbeat; the CRC is the agent's own (bit 0 clear) */
	table(f, 4, RH_CTL_LAYOUT_MINOR, 0);
	put_table("table_4nics", f, 4);
	table(f, 0, RH_CTL_LAYOUT_MINOR, 0);
	put_table("table_empty", f, 4);
	table(f, 2, 0, 0);
	put_table("table_minor0", f, 4);
	table(f, 3, RH_CTL_LAYOUT_MINOR, RH_CTL_F_AGENT_GONE);
	put_table("table_gone", f, 4);
	table(f, RH_CTL_MAX_NICS, RH_CTL_LAYOUT_MINOR, 0);
	put_table("table_full", f, 4);
	/* a stale heartbeat (bit 2 clear), the CRC computed by the target (bit 0) */
	table(f, 1, RH_CTL_LAYOUT_MINOR, 0);
	put_table("table_stale", f, 1);
	/* the whole file, unpadded: a table shorter than its size is refused at open */
	table(f, 1, RH_CTL_LAYOUT_MINOR, 0);
	put("ctl", "table_short", 4, f, RH_CTL_TABLE_SIZE - 1);
}

/* ---- the sock_diag answer the TCP lanes' loss check reads (lanes/tcpstate.c) ---- */

static void seeds_tcpstate(void)
{
	union {
		struct nlmsghdr nh;
		uint8_t b[1024];
	} u;
	struct inet_diag_msg *m;
	struct rtattr *a;
	struct nlmsgerr *e;
	struct tcp_info ti;

	memset(&u, 0, sizeof(u));
	memset(&ti, 0, sizeof(ti));
	ti.tcpi_ca_state = TCP_CA_Loss;
	ti.tcpi_unacked = 3;
	ti.tcpi_rtt = 20000;
	u.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	m = NLMSG_DATA(&u.nh);
	m->idiag_family = AF_INET;
	a = (struct rtattr *)(m + 1);
	/* another attribute first, then INET_DIAG_INFO */
	a->rta_type = INET_DIAG_MARK;
	a->rta_len = RTA_LENGTH(4);
	a = (struct rtattr *)((uint8_t *)a + RTA_ALIGN(a->rta_len));
	a->rta_type = INET_DIAG_INFO;
	a->rta_len = RTA_LENGTH(sizeof(ti));
	memcpy(RTA_DATA(a), &ti, sizeof(ti));
	u.nh.nlmsg_len = (uint32_t)((uint8_t *)a + RTA_ALIGN(a->rta_len) - u.b);
	put("tcpstate", "diag_info", NO_MODE, u.b, u.nh.nlmsg_len);

	memset(&u, 0, sizeof(u));
	u.nh.nlmsg_type = NLMSG_ERROR;
	u.nh.nlmsg_len = NLMSG_LENGTH(sizeof(*e));
	e = NLMSG_DATA(&u.nh);
	e->error = -ENOENT;
	put("tcpstate", "error_enoent", NO_MODE, u.b, u.nh.nlmsg_len);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
		return 2;
	}
	root = argv[1];
	mkdir(root, 0755);
	seeds_frames();
	seeds_hello();
	seeds_ofi();
#ifdef RH_HAVE_VERBS
	seeds_verbs();
#endif
	seeds_ctl();
	seeds_tcpstate();
	return failures ? 1 : 0;
}
