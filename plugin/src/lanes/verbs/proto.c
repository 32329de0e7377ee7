/* SPDX-License-Identifier: Apache-2.0 */
/* The verbs lane's protocol (proto.h): pure functions, no I/O. */
#include <errno.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "proto.h"

static void put32(uint8_t *b, uint32_t v)
{
	for (int i = 0; i < 4; i++) {
		b[i] = (uint8_t)(v >> (8 * i));
	}
}

static uint32_t get32(const uint8_t *b)
{
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

int verbs_imm_encode(uint32_t adv, uint64_t chunk, uint32_t *imm)
{
	if (adv >= VERBS_NADV || chunk > VERBS_IMM_CHUNK_MAX) {
		return -ERANGE;
	}
	*imm = (uint32_t)chunk | (adv << VERBS_IMM_CHUNK_BITS);
	return 0;
}

void verbs_imm_decode(uint32_t imm, uint32_t *adv, uint32_t *chunk)
{
	*chunk = imm & VERBS_IMM_CHUNK_MAX;
	*adv = imm >> VERBS_IMM_CHUNK_BITS;
}

void verbs_adv_init(struct verbs_adv_ids *t)
{
	memset(t, 0, sizeof(*t));
}

static void adv_free(struct verbs_adv_ids *t, struct verbs_advid *a)
{
	a->state = VERBS_ADV_FREE;
	t->nlive--;
}

int verbs_adv_alloc(struct verbs_adv_ids *t, uint32_t lane_id, uint64_t seq, int slot,
		    uint32_t epoch, uint64_t want)
{
	if (want == 0) {
		return -EINVAL;
	}
	if (t->nlive >= VERBS_NADV) {
		return -EAGAIN;
	}
	for (uint32_t i = 0; i < VERBS_NADV; i++) {
		uint32_t id = (t->next + i) % VERBS_NADV;
		struct verbs_advid *a = &t->e[id];

		if (a->state != VERBS_ADV_FREE) {
			continue;
		}
		*a = (struct verbs_advid){ .state = VERBS_ADV_LIVE,
					   .lane_id = lane_id,
					   .seq = seq,
					   .slot = slot,
					   .epoch = epoch,
					   .want = want };
		t->nlive++;
		t->next = (id + 1) % VERBS_NADV;
		return (int)id;
	}
	return -EAGAIN;
}

struct verbs_advid *verbs_adv_find(struct verbs_adv_ids *t, uint32_t adv, uint32_t lane_id)
{
	struct verbs_advid *a;

	if (adv >= VERBS_NADV) {
		return NULL;
	}
	a = &t->e[adv];
	return a->state == VERBS_ADV_LIVE && a->lane_id == lane_id ? a : NULL;
}

bool verbs_adv_written(struct verbs_adv_ids *t, uint32_t adv)
{
	struct verbs_advid *a;

	if (adv >= VERBS_NADV || t->e[adv].state != VERBS_ADV_LIVE) {
		return false;
	}
	a = &t->e[adv];
	if (++a->got < a->want) {
		return false;
	}
	adv_free(t, a);
	return true;
}

bool verbs_adv_retire(struct verbs_adv_ids *t, uint32_t adv, uint32_t lane_id)
{
	struct verbs_advid *a = verbs_adv_find(t, adv, lane_id);

	if (!a) {
		return false;
	}
	adv_free(t, a);
	return true;
}

uint32_t verbs_adv_lane_fenced(struct verbs_adv_ids *t, uint32_t lane_id)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < VERBS_NADV; i++) {
		if (t->e[i].state == VERBS_ADV_LIVE && t->e[i].lane_id == lane_id) {
			adv_free(t, &t->e[i]);
			n++;
		}
	}
	return n;
}

void verbs_adv_id_put(uint32_t id, uint8_t *b)
{
	put32(b, id);
}

int verbs_adv_id_get(const uint8_t *b, size_t len, uint32_t *id)
{
	if (len < VERBS_ADV_ID_LEN) {
		return -EPROTO;
	}
	*id = get32(b);
	return *id < VERBS_NADV ? 0 : -EPROTO;
}

int verbs_write_hdr(struct verbs_adv_ids *t, uint32_t lane_id, const struct ofi_rrec_table *rr,
		    uint32_t imm, uint64_t chunk_size, uint64_t conn_id, struct rh_hdr *h,
		    uint32_t *adv)
{
	const struct verbs_advid *a;
	const struct ofi_rrec *r;
	struct ofi_imm im;
	uint32_t chunk;

	verbs_imm_decode(imm, adv, &chunk);
	a = verbs_adv_find(t, *adv, lane_id);
	if (!a) {
		return -ENOENT;
	}
	if (a->slot < 0 || a->slot >= RH_MAX_RECVS) {
		return -EPROTO;
	}
	r = &rr->e[a->seq % RH_RING][a->slot];
	if (r->state != OFI_RREC_ADVERTISED || r->seq != a->seq || r->epoch != a->epoch) {
		return -EPROTO;
	}
	/* the wide layout's expansion of the whole epoch against itself returns it unchanged:
	 * ofi_rrec_hdr cuts the chunk and bounds it by the record's buffer */
	im = (struct ofi_imm){
		.seq = a->seq, .slot = (uint32_t)a->slot, .chunk = chunk, .epoch = a->epoch
	};
	return ofi_rrec_hdr(&ofi_imm_wide, r, &im, chunk_size, a->epoch, conn_id, h);
}

void verbs_qp_info_put(const struct verbs_qp_info *q, uint8_t *b)
{
	put32(b, q->qpn);
	put32(b + 4, q->psn);
	memcpy(b + 8, q->gid, 16);
	b[24] = q->mtu;
}

int verbs_qp_info_get(const uint8_t *b, size_t len, struct verbs_qp_info *q)
{
	if (len < VERBS_QP_INFO_LEN) {
		return -EPROTO;
	}
	q->qpn = get32(b);
	q->psn = get32(b + 4);
	memcpy(q->gid, b + 8, 16);
	q->mtu = b[24];
	if (q->qpn > 0xffffff || q->psn > 0xffffff || q->mtu < IBV_MTU_256 ||
	    q->mtu > IBV_MTU_4096) {
		return -EPROTO;
	}
	return 0;
}

void verbs_gid_of_ipv4(uint32_t ip, uint8_t gid[16])
{
	memset(gid, 0, 16);
	gid[10] = 0xff;
	gid[11] = 0xff;
	memcpy(gid + 12, &ip, 4);
}

int verbs_peer_qp_info(const uint8_t *tp, size_t tp_len, uint32_t peer_ip, struct verbs_qp_info *q)
{
	uint8_t want[16];
	int rc;

	if (tp_len != VERBS_QP_INFO_LEN) {
		return -EPROTO;
	}
	rc = verbs_qp_info_get(tp, tp_len, q);
	if (rc < 0) {
		return rc;
	}
	if (q->qpn < 2) {
		return -EPROTO;
	}
	verbs_gid_of_ipv4(peer_ip, want);
	return memcmp(q->gid, want, 16) ? -EADDRNOTAVAIL : 0;
}

struct verbs_verdict verbs_wc_verdict(int status)
{
	switch (status) {
	case IBV_WC_SUCCESS:
		return (struct verbs_verdict){ VERBS_OK, 0, "success" };
	case IBV_WC_RETRY_EXC_ERR:
		return (struct verbs_verdict){
			VERBS_FAIL_LANE, -ETIMEDOUT,
			"transport retries exhausted (no ACK from the peer)"
		};
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return (struct verbs_verdict){ VERBS_FAIL_LANE, -ETIMEDOUT,
					       "receiver-not-ready retries exhausted" };
	case IBV_WC_WR_FLUSH_ERR:
		return (struct verbs_verdict){ VERBS_FAIL_LANE, -ECANCELED,
					       "flushed: the queue pair is in the error state" };
	case IBV_WC_REM_ACCESS_ERR:
		return (struct verbs_verdict){ VERBS_FAIL_LANE, -EACCES,
					       "remote access error (key or bounds)" };
	case IBV_WC_REM_INV_REQ_ERR:
	case IBV_WC_REM_OP_ERR:
	case IBV_WC_BAD_RESP_ERR:
		return (struct verbs_verdict){ VERBS_FAIL_LANE, -EPROTO,
					       "the peer refused the request" };
	case IBV_WC_LOC_LEN_ERR:
	case IBV_WC_LOC_QP_OP_ERR:
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
	case IBV_WC_MW_BIND_ERR:
		return (struct verbs_verdict){ VERBS_FAIL_LANE, -EIO, "local work request error" };
	case IBV_WC_FATAL_ERR:
		return (struct verbs_verdict){ VERBS_FAIL_NIC, -EIO, "fatal device error" };
	default:
		return (struct verbs_verdict){ VERBS_FAIL_LANE, -EIO, "error completion" };
	}
}

struct verbs_verdict verbs_async_verdict(int event_type)
{
	switch (event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_PATH_MIG_ERR:
		return (struct verbs_verdict){ VERBS_FAIL_LANE, -EIO, "queue pair error event" };
	case IBV_EVENT_CQ_ERR:
		return (struct verbs_verdict){ VERBS_FAIL_NIC, -EIO, "completion queue overrun" };
	case IBV_EVENT_PORT_ERR:
		return (struct verbs_verdict){ VERBS_FAIL_NIC, -ENETDOWN, "port went down" };
	case IBV_EVENT_DEVICE_FATAL:
		return (struct verbs_verdict){ VERBS_FAIL_NIC, -ENODEV, "device fatal error" };
	case IBV_EVENT_GID_CHANGE:
		return (struct verbs_verdict){ VERBS_FAIL_NIC, -EADDRNOTAVAIL,
					       "GID table changed (address moved)" };
	case IBV_EVENT_PORT_ACTIVE:
		return (struct verbs_verdict){ VERBS_NIC_UP, 0, "port active" };
	default:
		return (struct verbs_verdict){ VERBS_OK, 0, "informational event" };
	}
}
