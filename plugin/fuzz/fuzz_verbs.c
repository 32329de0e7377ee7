/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the verbs lane's decoders (lanes/verbs/proto.c). Byte 0 picks one, the rest
 * is its input:
 *   0: verbs_qp_info_get (the queue pair address);
 *   1: verbs_peer_qp_info: 4 bytes of the peer's IPv4 address, then a hello's transport bytes;
 *   2: an ADV as the verbs lane receives it (lanes/verbs/fence.c): verbs_adv_id_get, then
 *      ofi_adv_get of the rest;
 *   3: a write's immediate: 4 bytes of immediate, 4 of chunk size, then ADV_REQs of 21 bytes
 *      each followed by 8 bytes of buffer size: each request the receiver answered gets an
 *      advert id (verbs_adv_alloc) and a record, then verbs_write_hdr decodes the immediate.
 * Checks: the encodings re-encode byte for byte, an accepted peer address is the peer's mapped
 * GID and no special queue pair, an immediate re-encodes to its value, and a rebuilt DATA
 * header names the advert's seq, slot and epoch, lies inside the record's buffer and is one
 * rh_hdr_get accepts.
 */
#include "fuzz_common.h"
#include "lanes/verbs/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t le(const uint8_t *b, int n)
{
	uint64_t v = 0;

	for (int i = n - 1; i >= 0; i--) {
		v = v << 8 | b[i];
	}
	return v;
}

static void check_qp_info(const uint8_t *b, size_t len)
{
	struct verbs_qp_info q;
	uint8_t enc[VERBS_QP_INFO_LEN];

	if (verbs_qp_info_get(b, len, &q) < 0) {
		return;
	}
	FUZZ_CHECK(q.qpn <= 0xffffff && q.psn <= 0xffffff && q.mtu >= 1 && q.mtu <= 5);
	verbs_qp_info_put(&q, enc);
	FUZZ_CHECK(!memcmp(enc, b, sizeof(enc)));
}

static void check_peer(const uint8_t *b, size_t len)
{
	struct verbs_qp_info q;
	uint8_t gid[16];
	uint32_t ip;

	if (len < 4) {
		return;
	}
	memcpy(&ip, b, 4);
	if (verbs_peer_qp_info(b + 4, len - 4, ip, &q) < 0) {
		return;
	}
	verbs_gid_of_ipv4(ip, gid);
	FUZZ_CHECK(len - 4 == VERBS_QP_INFO_LEN && q.qpn >= 2 && !memcmp(q.gid, gid, 16));
	check_qp_info(b + 4, len - 4);
}

static void check_adv(const uint8_t *b, size_t len)
{
	static uint64_t placed[OFI_ADV_WORDS_MAX];
	static uint8_t enc[OFI_ADV_LEN + 8 * OFI_ADV_WORDS_MAX];
	struct ofi_adv_msg a;
	uint32_t id;
	uint8_t ib[VERBS_ADV_ID_LEN];
	int n;

	if (verbs_adv_id_get(b, len, &id) < 0) {
		return;
	}
	FUZZ_CHECK(id < VERBS_NADV);
	verbs_adv_id_put(id, ib);
	FUZZ_CHECK(!memcmp(ib, b, sizeof(ib)));
	if (ofi_adv_get(b + VERBS_ADV_ID_LEN, len - VERBS_ADV_ID_LEN, &a, placed,
			OFI_ADV_WORDS_MAX) < 0) {
		return;
	}
	n = ofi_adv_put(&a, placed, enc, sizeof(enc));
	FUZZ_CHECK(n > 0 && !memcmp(enc, b + VERBS_ADV_ID_LEN, (size_t)n));
}

static void check_write(const uint8_t *b, size_t len)
{
	static struct verbs_adv_ids t;
	static struct ofi_rrec_table rr;
	uint32_t imm, adv, chunk, again;
	uint64_t chunk_size;
	const struct verbs_advid *a;
	struct rh_hdr h;
	uint8_t hb[RH_HDR_LEN];
	int rc;

	if (len < 8) {
		return;
	}
	imm = (uint32_t)le(b, 4);
	verbs_imm_decode(imm, &adv, &chunk);
	FUZZ_CHECK(adv < VERBS_NADV && chunk <= VERBS_IMM_CHUNK_MAX);
	FUZZ_CHECK(verbs_imm_encode(adv, chunk, &again) == 0 && again == imm);
	chunk_size = le(b + 4, 4);
	if (chunk_size == 0) {
		chunk_size = 1; /* the lane's chunk size is never 0 (RAILHOP_CHUNK) */
	}
	b += 8;
	len -= 8;
	verbs_adv_init(&t);
	memset(&rr, 0, sizeof(rr));
	/* the receiver's answers, as lanes/verbs/fence.c gives them */
	for (; len >= OFI_ADV_REQ_LEN + 8; b += OFI_ADV_REQ_LEN + 8, len -= OFI_ADV_REQ_LEN + 8) {
		struct ofi_adv_req q;
		struct ofi_rrec *r;
		int id;

		if (ofi_adv_req_get(b, len, &q) < 0) {
			continue;
		}
		r = &rr.e[q.seq % RH_RING][q.slot];
		*r = (struct ofi_rrec){ .seq = q.seq,
					.total = q.total,
					.size = le(b + OFI_ADV_REQ_LEN, 8),
					.epoch = q.epoch,
					.state = OFI_RREC_ADVERTISED };
		id = verbs_adv_alloc(&t, 0, q.seq, q.slot, q.epoch, VERBS_ADV_WANT_ANY);
		FUZZ_CHECK(id >= 0 || (id == -EAGAIN && t.nlive == VERBS_NADV));
	}
	rc = verbs_write_hdr(&t, 0, &rr, imm, chunk_size, 7, &h, &adv);
	FUZZ_CHECK(adv == imm >> VERBS_IMM_CHUNK_BITS);
	if (rc < 0) {
		return;
	}
	a = verbs_adv_find(&t, adv, 0);
	FUZZ_CHECK(a && h.type == RH_F_DATA && h.seq == a->seq && h.slot == a->slot &&
		   h.epoch == a->epoch);
	{
		const struct ofi_rrec *r = &rr.e[a->seq % RH_RING][a->slot];

		FUZZ_CHECK(h.total == r->total && h.off + h.len <= r->size && h.len <= chunk_size);
	}
	rh_hdr_put(&h, hb);
	FUZZ_CHECK(rh_hdr_get(hb, &h) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1) {
		return 0;
	}
	switch (data[0] % 4) {
	case 0:
		check_qp_info(data + 1, size - 1);
		break;
	case 1:
		check_peer(data + 1, size - 1);
		break;
	case 2:
		check_adv(data + 1, size - 1);
		break;
	default:
		check_write(data + 1, size - 1);
		break;
	}
	return 0;
}
