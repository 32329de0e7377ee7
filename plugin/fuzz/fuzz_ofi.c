/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the ofi lane's decoders (lanes/ofi/proto.c). Byte 0 picks one, the rest is
 * its input:
 *   0: a lane message: ofi_mhdr_get, then a CORE message's body as frames (fuzz_common.h) and a
 *      HELLO / HELLO_ACK message's body as one frame;
 *   1: ofi_adv_req_get (ADV_REQ body);
 *   2: ofi_adv_get (ADV body with its placed-chunk map);
 *   3, 4: a write's immediate in the wide (8 bytes) or the narrow (4 bytes) layout:
 *      ofi_imm_decode, ofi_expand of its seq and epoch, then ofi_rrec_find and ofi_rrec_hdr
 *      against a receiver record taken from the following ADV_REQ bytes (the sender's seq,
 *      total and epoch) and 8 bytes of buffer size and 4 of chunk size.
 * Checks: the encodings re-encode byte for byte (the message header but for its unchecked
 * byte 3), an immediate re-encodes to its value, an expanded number keeps the low bits and lies
 * within one span of the reference, and a rebuilt DATA header is one rh_hdr_get accepts, inside
 * the record's buffer.
 */
#include "fuzz_common.h"
#include "lanes/ofi/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t le(const uint8_t *b, int n)
{
	uint64_t v = 0;

	for (int i = n - 1; i >= 0; i--) {
		v = v << 8 | b[i];
	}
	return v;
}

static void check_msg(const uint8_t *b, size_t len)
{
	enum ofi_mkind kind;
	uint32_t blen;
	uint8_t enc[OFI_MHDR_LEN];
	struct rh_hdr h;

	if (ofi_mhdr_get(b, len, &kind, &blen) < 0) {
		return;
	}
	FUZZ_CHECK(kind >= OFI_M_CORE && kind < OFI_M_MAX && blen <= len - OFI_MHDR_LEN);
	FUZZ_CHECK(ofi_mhdr_put(enc, kind, blen) == OFI_MHDR_LEN);
	FUZZ_CHECK(!memcmp(enc, b, 3) && !memcmp(enc + 4, b + 4, 4));
	b += OFI_MHDR_LEN;
	if (kind == OFI_M_CORE) {
		fuzz_frames(b, blen);
	} else if ((kind == OFI_M_HELLO || kind == OFI_M_HELLO_ACK) && blen >= RH_HDR_LEN &&
		   rh_hdr_get(b, &h) == 0 && h.len <= blen - RH_HDR_LEN) {
		/* lanes/ofi/endpoint.c: the hello frame's header, then its payload */
		fuzz_check_hdr(b, &h);
		fuzz_check_payload(&h, b + RH_HDR_LEN, h.len);
	}
}

static void check_adv_req(const uint8_t *b, size_t len)
{
	struct ofi_adv_req r;
	uint8_t enc[OFI_ADV_REQ_LEN];

	if (ofi_adv_req_get(b, len, &r) < 0) {
		return;
	}
	FUZZ_CHECK(r.slot < RH_MAX_RECVS);
	FUZZ_CHECK(ofi_adv_req_put(&r, enc) == OFI_ADV_REQ_LEN && !memcmp(enc, b, sizeof(enc)));
}

static void check_adv(const uint8_t *b, size_t len)
{
	static uint64_t placed[OFI_ADV_WORDS_MAX];
	static uint8_t enc[OFI_ADV_LEN + 8 * OFI_ADV_WORDS_MAX];
	struct ofi_adv_msg a;
	int n;

	if (ofi_adv_get(b, len, &a, placed, OFI_ADV_WORDS_MAX) < 0) {
		return;
	}
	FUZZ_CHECK(a.slot < RH_MAX_RECVS && a.status <= OFI_ADV_GONE);
	FUZZ_CHECK(a.nwords <= OFI_ADV_WORDS_MAX && OFI_ADV_LEN + 8 * (size_t)a.nwords <= len);
	n = ofi_adv_put(&a, placed, enc, sizeof(enc));
	FUZZ_CHECK(n == (int)(OFI_ADV_LEN + 8 * (size_t)a.nwords) && !memcmp(enc, b, (size_t)n));
}

static void check_expand(uint64_t lo, int bits, uint64_t ref)
{
	uint64_t mask = (1ull << bits) - 1, v = ofi_expand(lo, bits, ref);

	FUZZ_CHECK((v & mask) == (lo & mask));
	FUZZ_CHECK((v > ref ? v - ref : ref - v) <= mask);
}

static void check_imm(const struct ofi_imm_layout *l, const uint8_t *b, size_t len, int width)
{
	static struct ofi_rrec_table t;
	int bits = l->seq + l->slot + l->chunk + l->epoch;
	uint64_t v, enc, chunk;
	struct ofi_adv_req q;
	struct ofi_imm im;
	struct ofi_rrec *r;
	struct rh_hdr h;
	uint8_t hb[RH_HDR_LEN];

	if (len < (size_t)width + 8) {
		return;
	}
	v = le(b, width);
	ofi_imm_decode(l, v, &im);
	FUZZ_CHECK(ofi_imm_encode(l, &im, &enc) == 0);
	FUZZ_CHECK(enc == (bits == 64 ? v : v & ((1ull << bits) - 1)));
	check_expand(im.seq, l->seq, le(b + width, 8));
	check_expand(im.epoch, l->epoch, le(b + width, 8));
	b += width + 8;
	len -= (size_t)width + 8;
	/* the receiver's record of an ADV_REQ it answered, with its buffer size */
	if (len < OFI_ADV_REQ_LEN + 12 || ofi_adv_req_get(b, len, &q) < 0) {
		return;
	}
	memset(&t, 0, sizeof(t));
	r = &t.e[q.seq % RH_RING][q.slot];
	r->seq = q.seq;
	r->total = q.total;
	r->epoch = q.epoch;
	r->size = le(b + OFI_ADV_REQ_LEN, 8);
	r->state = OFI_RREC_ADVERTISED;
	chunk = le(b + OFI_ADV_REQ_LEN + 8, 4);
	if (chunk == 0) {
		chunk = 1; /* the lane's chunk size is never 0 (RAILHOP_CHUNK) */
	}
	r = ofi_rrec_find(l, &t, &im);
	if (!r || ofi_rrec_hdr(l, r, &im, chunk, q.epoch, 7, &h) < 0) {
		return;
	}
	FUZZ_CHECK(h.type == RH_F_DATA && h.seq == r->seq && h.total == r->total);
	FUZZ_CHECK(h.off + h.len <= r->size && h.len <= chunk);
	FUZZ_CHECK((h.epoch & ((1ull << l->epoch) - 1)) == im.epoch);
	rh_hdr_put(&h, hb);
	FUZZ_CHECK(rh_hdr_get(hb, &h) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1) {
		return 0;
	}
	switch (data[0] % 5) {
	case 0:
		check_msg(data + 1, size - 1);
		break;
	case 1:
		check_adv_req(data + 1, size - 1);
		break;
	case 2:
		check_adv(data + 1, size - 1);
		break;
	case 3:
		check_imm(&ofi_imm_wide, data + 1, size - 1, 8);
		break;
	default:
		check_imm(&ofi_imm_narrow, data + 1, size - 1, 4);
		break;
	}
	return 0;
}
