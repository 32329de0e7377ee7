/* SPDX-License-Identifier: Apache-2.0 */
/* Pure bookkeeping of the libfabric lane: see proto.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../core/sched.h"
#include "proto.h"

#define MASK(bits) ((1ull << (bits)) - 1)

const struct ofi_imm_layout ofi_imm_wide = { .seq = OFI_IMM_SEQ_BITS,
					     .slot = OFI_IMM_SLOT_BITS,
					     .chunk = OFI_IMM_CHUNK_BITS,
					     .epoch = OFI_IMM_EPOCH_BITS };
const struct ofi_imm_layout ofi_imm_narrow = { .seq = 10, .slot = 3, .chunk = 14, .epoch = 5 };

const struct ofi_imm_layout *ofi_imm_layout_for(size_t cq_data_size)
{
	if (cq_data_size >= 8) {
		return &ofi_imm_wide;
	}
	return cq_data_size >= 4 ? &ofi_imm_narrow : NULL;
}

int ofi_imm_encode(const struct ofi_imm_layout *l, const struct ofi_imm *im, uint64_t *out)
{
	uint64_t v;

	if (im->slot >= RH_MAX_RECVS || im->slot > MASK(l->slot) || im->chunk > MASK(l->chunk)) {
		return -ERANGE;
	}
	v = im->seq & MASK(l->seq);
	v |= (uint64_t)im->slot << l->seq;
	v |= im->chunk << (l->seq + l->slot);
	v |= ((uint64_t)im->epoch & MASK(l->epoch)) << (l->seq + l->slot + l->chunk);
	*out = v;
	return 0;
}

void ofi_imm_decode(const struct ofi_imm_layout *l, uint64_t v, struct ofi_imm *im)
{
	im->seq = v & MASK(l->seq);
	im->slot = (uint32_t)((v >> l->seq) & MASK(l->slot));
	im->chunk = (v >> (l->seq + l->slot)) & MASK(l->chunk);
	im->epoch = (uint32_t)((v >> (l->seq + l->slot + l->chunk)) & MASK(l->epoch));
}

static uint64_t dist(uint64_t a, uint64_t b)
{
	return a > b ? a - b : b - a;
}

uint64_t ofi_expand(uint64_t lo, int bits, uint64_t ref)
{
	uint64_t span = 1ull << bits;
	uint64_t cand = (ref & ~MASK(bits)) | (lo & MASK(bits)), best = cand;

	if (cand >= span && dist(cand - span, ref) <= dist(best, ref)) {
		best = cand - span;
	}
	if (cand + span > cand && dist(cand + span, ref) < dist(best, ref)) {
		best = cand + span;
	}
	return best;
}

/* --- little-endian helpers --- */

static void put_u32(uint8_t *b, uint32_t v)
{
	for (int i = 0; i < 4; i++) {
		b[i] = (uint8_t)(v >> (8 * i));
	}
}

static void put_u64(uint8_t *b, uint64_t v)
{
	for (int i = 0; i < 8; i++) {
		b[i] = (uint8_t)(v >> (8 * i));
	}
}

static uint32_t get_u32(const uint8_t *b)
{
	uint32_t v = 0;

	for (int i = 0; i < 4; i++) {
		v |= (uint32_t)b[i] << (8 * i);
	}
	return v;
}

static uint64_t get_u64(const uint8_t *b)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++) {
		v |= (uint64_t)b[i] << (8 * i);
	}
	return v;
}

size_t ofi_mhdr_put(uint8_t *b, enum ofi_mkind kind, uint32_t body_len)
{
	b[0] = (uint8_t)kind;
	b[1] = 'R';
	b[2] = 'H';
	b[3] = 0;
	put_u32(b + 4, body_len);
	return OFI_MHDR_LEN;
}

int ofi_mhdr_get(const uint8_t *b, size_t msg_len, enum ofi_mkind *kind, uint32_t *body_len)
{
	if (msg_len < OFI_MHDR_LEN || b[1] != 'R' || b[2] != 'H' || b[0] == 0 ||
	    b[0] >= OFI_M_MAX) {
		return -EPROTO;
	}
	*kind = (enum ofi_mkind)b[0];
	*body_len = get_u32(b + 4);
	if (*body_len > msg_len - OFI_MHDR_LEN) {
		return -EPROTO;
	}
	return 0;
}

size_t ofi_adv_req_put(const struct ofi_adv_req *r, uint8_t *b)
{
	put_u64(b, r->seq);
	put_u64(b + 8, r->total);
	put_u32(b + 16, r->epoch);
	b[20] = r->slot;
	return OFI_ADV_REQ_LEN;
}

int ofi_adv_req_get(const uint8_t *b, size_t len, struct ofi_adv_req *r)
{
	if (len < OFI_ADV_REQ_LEN || b[20] >= RH_MAX_RECVS) {
		return -EPROTO;
	}
	r->seq = get_u64(b);
	r->total = get_u64(b + 8);
	r->epoch = get_u32(b + 16);
	r->slot = b[20];
	return 0;
}

int ofi_adv_put(const struct ofi_adv_msg *a, const uint64_t *placed, uint8_t *b, size_t cap)
{
	size_t len = OFI_ADV_LEN + 8 * (size_t)a->nwords;

	if (len > cap) {
		return -ENOSPC;
	}
	put_u64(b, a->seq);
	put_u64(b + 8, a->addr);
	put_u64(b + 16, a->key);
	put_u64(b + 24, a->size);
	put_u32(b + 32, a->epoch);
	b[36] = a->slot;
	b[37] = a->status;
	put_u32(b + 38, a->nwords);
	for (uint32_t i = 0; i < a->nwords; i++) {
		put_u64(b + OFI_ADV_LEN + 8 * i, placed[i]);
	}
	return (int)len;
}

int ofi_adv_get(const uint8_t *b, size_t len, struct ofi_adv_msg *a, uint64_t *placed,
		uint32_t max_words)
{
	if (len < OFI_ADV_LEN || b[36] >= RH_MAX_RECVS || b[37] > OFI_ADV_GONE) {
		return -EPROTO;
	}
	a->seq = get_u64(b);
	a->addr = get_u64(b + 8);
	a->key = get_u64(b + 16);
	a->size = get_u64(b + 24);
	a->epoch = get_u32(b + 32);
	a->slot = b[36];
	a->status = b[37];
	a->nwords = get_u32(b + 38);
	if (a->nwords > max_words || len < OFI_ADV_LEN + 8 * (size_t)a->nwords) {
		return -EPROTO;
	}
	for (uint32_t i = 0; i < a->nwords; i++) {
		placed[i] = get_u64(b + OFI_ADV_LEN + 8 * i);
	}
	return 0;
}

/* --- sender adverts --- */

static struct ofi_adv *adv_at(struct ofi_adv_table *t, uint64_t seq, int slot)
{
	return &t->e[seq % RH_RING][slot];
}

enum ofi_adv_state ofi_adv_lookup(const struct ofi_adv_table *t, uint64_t seq, int slot,
				  uint32_t min_epoch)
{
	const struct ofi_adv *a = &t->e[seq % RH_RING][slot];

	if (a->state == OFI_ADV_NONE || a->seq != seq) {
		return OFI_ADV_NONE;
	}
	if (a->state == OFI_ADV_VALID && a->epoch < min_epoch) {
		return OFI_ADV_NONE; /* given before the last resume: ask again */
	}
	if (a->state == OFI_ADV_REQUESTED && a->epoch < min_epoch) {
		return OFI_ADV_NONE; /* that request is answered STALE or never */
	}
	return (enum ofi_adv_state)a->state;
}

void ofi_adv_requested(struct ofi_adv_table *t, uint64_t seq, int slot, uint32_t epoch,
		       uint64_t now_ms)
{
	struct ofi_adv *a = adv_at(t, seq, slot);

	free(a->placed);
	memset(a, 0, sizeof(*a));
	a->seq = seq;
	a->epoch = epoch;
	a->state = OFI_ADV_REQUESTED;
	a->t_req_ms = now_ms;
}

bool ofi_adv_overdue(const struct ofi_adv_table *t, uint64_t seq, int slot, uint64_t now_ms,
		     uint64_t limit_ms)
{
	const struct ofi_adv *a = &t->e[seq % RH_RING][slot];

	return a->state == OFI_ADV_REQUESTED && a->seq == seq && now_ms > a->t_req_ms &&
	       now_ms - a->t_req_ms > limit_ms;
}

bool ofi_adv_store(struct ofi_adv_table *t, const struct ofi_adv_msg *m, const uint64_t *placed)
{
	struct ofi_adv *a = adv_at(t, m->seq, m->slot);

	if (a->state != OFI_ADV_REQUESTED || a->seq != m->seq || a->epoch > m->epoch) {
		return false;
	}
	free(a->placed);
	a->placed = NULL;
	a->nwords = 0;
	if (m->status != OFI_ADV_OK) {
		a->state = OFI_ADV_NONE;
		return true;
	}
	if (m->nwords) {
		a->placed = malloc(8 * (size_t)m->nwords);
		if (!a->placed) {
			a->state = OFI_ADV_NONE; /* asked again */
			return true;
		}
		memcpy(a->placed, placed, 8 * (size_t)m->nwords);
		a->nwords = m->nwords;
	}
	a->addr = m->addr;
	a->key = m->key;
	a->size = m->size;
	a->epoch = m->epoch;
	a->state = OFI_ADV_VALID;
	return true;
}

int ofi_adv_target(const struct ofi_adv_table *t, uint64_t seq, int slot, uint64_t off,
		   uint64_t len, uint64_t *raddr, uint64_t *key)
{
	const struct ofi_adv *a = &t->e[seq % RH_RING][slot];

	if (a->state != OFI_ADV_VALID || a->seq != seq) {
		return -ENOENT;
	}
	if (off > a->size || len > a->size - off) {
		return -ERANGE;
	}
	*raddr = a->addr + off;
	*key = a->key;
	return 0;
}

bool ofi_adv_placed(const struct ofi_adv_table *t, uint64_t seq, int slot, uint64_t idx)
{
	const struct ofi_adv *a = &t->e[seq % RH_RING][slot];

	return a->state == OFI_ADV_VALID && a->seq == seq && idx / 64 < a->nwords &&
	       (a->placed[idx / 64] >> (idx % 64)) & 1;
}

void ofi_adv_table_free(struct ofi_adv_table *t)
{
	for (int i = 0; i < RH_RING; i++) {
		for (int s = 0; s < RH_MAX_RECVS; s++) {
			free(t->e[i][s].placed);
			t->e[i][s].placed = NULL;
		}
	}
}

/* --- receiver records --- */

bool ofi_rrec_take(const struct ofi_rrec *r, const struct ofi_adv_req *q)
{
	return r->state == OFI_RREC_NONE || r->seq != q->seq || q->epoch >= r->epoch;
}

struct ofi_rrec *ofi_rrec_find(const struct ofi_imm_layout *l, struct ofi_rrec_table *t,
			       const struct ofi_imm *im)
{
	struct ofi_rrec *r;

	if (im->slot >= RH_MAX_RECVS) {
		return NULL;
	}
	r = &t->e[im->seq % RH_RING][im->slot];
	if (r->state != OFI_RREC_ADVERTISED || (r->seq & MASK(l->seq)) != im->seq) {
		return NULL;
	}
	return r;
}

int ofi_rrec_hdr(const struct ofi_imm_layout *l, const struct ofi_rrec *r, const struct ofi_imm *im,
		 uint64_t chunk, uint32_t ref_epoch, uint64_t conn_id, struct rh_hdr *h)
{
	uint64_t off, len;

	if (!rh_sched_chunk(r->total, chunk, im->chunk, &off, &len) || off + len > r->size) {
		return -EPROTO;
	}
	memset(h, 0, sizeof(*h));
	h->type = RH_F_DATA;
	h->slot = (uint8_t)im->slot;
	h->len = (uint32_t)len;
	h->conn_id = conn_id;
	h->epoch = (uint32_t)ofi_expand(im->epoch, l->epoch, ref_epoch);
	h->seq = r->seq;
	h->off = off;
	h->total = r->total;
	return 0;
}

bool ofi_gate_open(uint32_t min_epoch, const uint32_t *marks, int nopen, int nfenced_open)
{
	if (nfenced_open > 0) {
		return false;
	}
	for (int i = 0; i < nopen; i++) {
		if (marks[i] < min_epoch) {
			return false;
		}
	}
	return true;
}

/* --- registration cache --- */

void ofi_rc_range(uintptr_t a, size_t len, uintptr_t *lo, uintptr_t *hi)
{
	uintptr_t page = 4096;

	*lo = a & ~(page - 1);
	*hi = (a + len + page - 1) & ~(page - 1);
	if (*hi == *lo) {
		*hi = *lo + page;
	}
}

struct ofi_rc_entry *ofi_rc_find(struct ofi_rcache *c, uintptr_t a, size_t len)
{
	for (int i = 0; i < c->n; i++) {
		if (c->e[i].lo <= a && a + len <= c->e[i].hi) {
			return &c->e[i];
		}
	}
	return NULL;
}

int ofi_rc_insert(struct ofi_rcache *c, const struct ofi_rc_entry *ent)
{
	if (c->n == c->cap) {
		int cap = c->cap ? 2 * c->cap : 16;
		struct ofi_rc_entry *n = realloc(c->e, sizeof(*n) * (size_t)cap);

		if (!n) {
			return -ENOMEM;
		}
		c->e = n;
		c->cap = cap;
	}
	c->e[c->n++] = *ent;
	return 0;
}

int ofi_rc_take(struct ofi_rcache *c, uintptr_t lo, uintptr_t hi, struct ofi_rc_entry *out, int max)
{
	int n = 0;

	for (int i = 0; i < c->n && n < max;) {
		if (c->e[i].lo < hi && lo < c->e[i].hi) {
			out[n++] = c->e[i];
			c->e[i] = c->e[--c->n];
			continue;
		}
		i++;
	}
	return n;
}

void ofi_rc_free(struct ofi_rcache *c)
{
	free(c->e);
	memset(c, 0, sizeof(*c));
}
