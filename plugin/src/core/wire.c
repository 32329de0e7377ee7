/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <string.h>

#include "wire.h"

static void put16(uint8_t *b, uint16_t v)
{
	b[0] = v;
	b[1] = v >> 8;
}

static void put32(uint8_t *b, uint32_t v)
{
	for (int i = 0; i < 4; i++) {
		b[i] = v >> (8 * i);
	}
}

static void put64(uint8_t *b, uint64_t v)
{
	for (int i = 0; i < 8; i++) {
		b[i] = v >> (8 * i);
	}
}

static uint16_t get16(const uint8_t *b)
{
	return (uint16_t)(b[0] | b[1] << 8);
}

static uint32_t get32(const uint8_t *b)
{
	uint32_t v = 0;

	for (int i = 3; i >= 0; i--) {
		v = v << 8 | b[i];
	}
	return v;
}

static uint64_t get64(const uint8_t *b)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--) {
		v = v << 8 | b[i];
	}
	return v;
}

void rh_hdr_put(const struct rh_hdr *h, uint8_t *b)
{
	b[0] = h->type;
	b[1] = h->slot;
	put16(b + 2, h->flags);
	put32(b + 4, h->len);
	put64(b + 8, h->conn_id);
	put32(b + 16, h->epoch);
	put32(b + 20, h->aux);
	put64(b + 24, h->seq);
	put64(b + 32, h->off);
	put64(b + 40, h->total);
}

int rh_hdr_get(const uint8_t *b, struct rh_hdr *h)
{
	h->type = b[0];
	h->slot = b[1];
	h->flags = get16(b + 2);
	h->len = get32(b + 4);
	h->conn_id = get64(b + 8);
	h->epoch = get32(b + 16);
	h->aux = get32(b + 20);
	h->seq = get64(b + 24);
	h->off = get64(b + 32);
	h->total = get64(b + 40);
	if (h->type == 0 || h->type >= RH_F_MAX || h->slot >= RH_MAX_RECVS) {
		return -EPROTO;
	}
	if (h->type != RH_F_DATA && h->len > RH_CTRL_MAX) {
		return -EPROTO;
	}
	if (h->type == RH_F_DATA && (h->off > h->total || h->len > h->total - h->off)) {
		return -EPROTO;
	}
	return 0;
}

static int put_nic(const struct rh_peer_nic *n, uint8_t *b, size_t cap)
{
	size_t plen = strnlen(n->pci, RH_PCI_MAX - 1);

	if (cap < 12 + plen) {
		return -ENOSPC;
	}
	memcpy(b, &n->ipv4, 4);
	memcpy(b + 4, &n->port, 2);
	put16(b + 6, (uint16_t)n->rail);
	put16(b + 8, (uint16_t)n->numa);
	b[10] = n->up;
	b[11] = (uint8_t)plen;
	memcpy(b + 12, n->pci, plen);
	return (int)(12 + plen);
}

static int get_nic(const uint8_t *b, size_t len, struct rh_peer_nic *n)
{
	if (len < 12 || len < 12u + b[11] || b[11] >= RH_PCI_MAX) {
		return -EPROTO;
	}
	memcpy(&n->ipv4, b, 4);
	memcpy(&n->port, b + 4, 2);
	n->rail = (int16_t)get16(b + 6);
	n->numa = (int16_t)get16(b + 8);
	n->up = b[10];
	memcpy(n->pci, b + 12, b[11]);
	n->pci[b[11]] = 0;
	return 12 + b[11];
}

#define RH_HELLO_FIXED 93 /* magic .. mac, stream nonce, flags; then the NIC count, the NICs */

int rh_hello_put(const struct rh_hello *h, uint8_t *b, size_t cap)
{
	size_t o = RH_HELLO_FIXED;

	if (cap < o + 1 || h->nnics < 0 || h->nnics > RH_MAX_NICS || h->tp_len > RH_HELLO_TP_MAX) {
		return -ENOSPC;
	}
	put32(b, RH_MAGIC);
	b[4] = h->kind;
	b[5] = h->from_sender;
	b[6] = h->nstreams;
	b[7] = h->stream;
	put32(b + 8, h->lane_id);
	put64(b + 12, h->listen_id);
	put32(b + 20, h->chunk);
	put16(b + 24, (uint16_t)h->src_nic);
	put16(b + 26, (uint16_t)h->dst_nic);
	memcpy(b + 28, h->nonce, RH_NONCE_LEN);
	memcpy(b + 28 + RH_NONCE_LEN, h->mac, RH_MAC_LEN);
	memcpy(b + 28 + RH_NONCE_LEN + RH_MAC_LEN, h->snonce, RH_NONCE_LEN);
	b[RH_HELLO_FIXED - 1] = h->flags;
	b[o++] = (uint8_t)h->nnics;
	for (int i = 0; i < h->nnics; i++) {
		int r = put_nic(&h->nics[i], b + o, cap - o);

		if (r < 0) {
			return r;
		}
		o += r;
	}
	if (h->tp_len) {
		if (cap - o < 1u + h->tp_len) {
			return -ENOSPC;
		}
		b[o++] = h->tp_len;
		memcpy(b + o, h->tp, h->tp_len);
		o += h->tp_len;
	}
	return (int)o;
}

int rh_hello_get(const uint8_t *b, size_t len, struct rh_hello *h)
{
	size_t o = RH_HELLO_FIXED + 1;

	if (len < o || get32(b) != RH_MAGIC) {
		return -EPROTO;
	}
	h->kind = b[4];
	h->from_sender = b[5];
	h->nstreams = b[6];
	h->stream = b[7];
	h->lane_id = get32(b + 8);
	h->listen_id = get64(b + 12);
	h->chunk = get32(b + 20);
	h->src_nic = (int16_t)get16(b + 24);
	h->dst_nic = (int16_t)get16(b + 26);
	memcpy(h->nonce, b + 28, RH_NONCE_LEN);
	memcpy(h->mac, b + 28 + RH_NONCE_LEN, RH_MAC_LEN);
	memcpy(h->snonce, b + 28 + RH_NONCE_LEN + RH_MAC_LEN, RH_NONCE_LEN);
	h->flags = b[RH_HELLO_FIXED - 1];
	h->nnics = b[RH_HELLO_FIXED];
	if (h->kind < RH_HELLO_CONN || h->kind > RH_HELLO_PROBE || h->nnics > RH_MAX_NICS ||
	    h->stream >= h->nstreams + (h->kind == RH_HELLO_PROBE)) {
		return -EPROTO;
	}
	for (int i = 0; i < h->nnics; i++) {
		int r = get_nic(b + o, len - o, &h->nics[i]);

		if (r < 0) {
			return r;
		}
		o += r;
	}
	h->tp_len = 0;
	if (o < len) {
		size_t n = b[o];

		if (n == 0 || n > RH_HELLO_TP_MAX || len - o - 1 < n) {
			return -EPROTO;
		}
		h->tp_len = (uint8_t)n;
		memcpy(h->tp, b + o + 1, n);
	}
	return 0;
}

int rh_hello_mac_input(const struct rh_hello *h, bool reply, uint64_t conn_id, uint32_t epoch,
		       const uint8_t *bind1, const uint8_t *bind2, uint8_t *b, size_t cap)
{
	static const char label[2][16] = { "railhop hello\0\0", "railhop reply\0\0" };
	struct rh_hello m = *h;
	size_t o = 16;
	int n;

	if (cap < o + 12 + 2 * RH_NONCE_LEN) {
		return -ENOSPC;
	}
	memcpy(b, label[reply], 16);
	memset(m.mac, 0, sizeof(m.mac));
	n = rh_hello_put(&m, b + o, cap - o - 12 - 2 * RH_NONCE_LEN);
	if (n < 0) {
		return n;
	}
	o += (size_t)n;
	put64(b + o, conn_id);
	put32(b + o + 8, reply ? 0 : epoch);
	o += 12;
	for (int i = 0; i < 2; i++) {
		const uint8_t *bind = i ? bind2 : bind1;

		if (bind) {
			memcpy(b + o, bind, RH_NONCE_LEN);
		} else {
			memset(b + o, 0, RH_NONCE_LEN);
		}
		o += RH_NONCE_LEN;
	}
	return (int)o;
}

int rh_cts_put(const struct rh_cts *c, uint8_t *b, size_t cap)
{
	if (c->n < 1 || c->n > RH_MAX_RECVS || cap < 12u * c->n) {
		return -ENOSPC;
	}
	for (int i = 0; i < c->n; i++) {
		put32(b + 12 * i, (uint32_t)c->tags[i]);
		put64(b + 12 * i + 4, c->sizes[i]);
	}
	return 12 * c->n;
}

int rh_cts_get(const uint8_t *b, size_t len, int n, struct rh_cts *c)
{
	if (n < 1 || n > RH_MAX_RECVS || len != 12u * n) {
		return -EPROTO;
	}
	c->n = n;
	for (int i = 0; i < n; i++) {
		c->tags[i] = (int32_t)get32(b + 12 * i);
		c->sizes[i] = get64(b + 12 * i + 4);
	}
	return 0;
}

int rh_dead_put(int ndead, const uint32_t *dead, uint8_t *b, size_t cap)
{
	if (ndead < 0 || ndead > RH_MAX_DEAD || cap < 1 + 4u * ndead) {
		return -ENOSPC;
	}
	b[0] = (uint8_t)ndead;
	for (int i = 0; i < ndead; i++) {
		put32(b + 1 + 4 * i, dead[i]);
	}
	return 1 + 4 * ndead;
}

int rh_dead_get(const uint8_t *b, size_t len, int *ndead, uint32_t *dead)
{
	if (len < 1 || b[0] > RH_MAX_DEAD || len < 1u + 4u * b[0]) {
		return -EPROTO;
	}
	*ndead = b[0];
	for (int i = 0; i < *ndead; i++) {
		dead[i] = get32(b + 1 + 4 * i);
	}
	return 1 + 4 * *ndead;
}

size_t rh_resume_base_len(const struct rh_resume *r)
{
	size_t len = 1 + 4 * (size_t)r->ndead + 9;

	for (int i = 0; i < r->nout; i++) {
		len += 10 + 13 * (size_t)r->out[i].n; /* record, CTS entries, one run count each */
	}
	return len;
}

static int runs_put(const struct rh_run *runs, int n, uint8_t *b, size_t cap)
{
	if (n < 0 || n > RH_RESUME_RUNS || cap < 1 + 8 * (size_t)n) {
		return -ENOSPC;
	}
	b[0] = (uint8_t)n;
	for (int i = 0; i < n; i++) {
		put32(b + 1 + 8 * i, runs[i].start);
		put32(b + 5 + 8 * i, runs[i].count);
	}
	return 1 + 8 * n;
}

static int runs_get(const uint8_t *b, size_t len, struct rh_run *runs, uint8_t *n)
{
	uint64_t end = 0;

	if (len < 1 || b[0] > RH_RESUME_RUNS || len < 1 + 8 * (size_t)b[0]) {
		return -EPROTO;
	}
	*n = b[0];
	for (int i = 0; i < *n; i++) {
		runs[i].start = get32(b + 1 + 8 * i);
		runs[i].count = get32(b + 5 + 8 * i);
		if (runs[i].count == 0 || (i > 0 && runs[i].start < end)) {
			return -EPROTO; /* empty, unsorted or overlapping */
		}
		end = (uint64_t)runs[i].start + runs[i].count;
	}
	return 1 + 8 * *n;
}

int rh_resume_put(const struct rh_resume *r, uint8_t *b, size_t cap)
{
	int o = rh_dead_put(r->ndead, r->dead, b, cap);

	if (o < 0 || cap < (size_t)o + 9 || r->nout < 0 || r->nout > RH_RING) {
		return -ENOSPC;
	}
	put64(b + o, r->next_seq);
	b[o + 8] = (uint8_t)r->nout;
	o += 9;
	for (int i = 0; i < r->nout; i++) {
		int l;

		if (cap < (size_t)o + 10) {
			return -ENOSPC;
		}
		put64(b + o, r->out[i].seq);
		b[o + 8] = (uint8_t)r->out[i].n;
		b[o + 9] = r->done[i];
		o += 10;
		l = rh_cts_put(&r->out[i], b + o, cap - o);
		if (l < 0) {
			return l;
		}
		o += l;
		for (int k = 0; k < r->out[i].n; k++) {
			l = runs_put(r->runs[i][k], r->nruns[i][k], b + o, cap - o);
			if (l < 0) {
				return l;
			}
			o += l;
		}
	}
	return o;
}

int rh_resume_get(const uint8_t *b, size_t len, struct rh_resume *r)
{
	int o = rh_dead_get(b, len, &r->ndead, r->dead);

	if (o < 0 || len < (size_t)o + 9) {
		return -EPROTO;
	}
	r->next_seq = get64(b + o);
	r->nout = b[o + 8];
	o += 9;
	if (r->nout > RH_RING) {
		return -EPROTO;
	}
	for (int i = 0; i < r->nout; i++) {
		int n;

		if (len < (size_t)o + 10) {
			return -EPROTO;
		}
		r->out[i].seq = get64(b + o);
		n = b[o + 8];
		r->done[i] = b[o + 9];
		o += 10;
		if (n < 1 || n > RH_MAX_RECVS || len < (size_t)o + 12u * n) {
			return -EPROTO;
		}
		if (rh_cts_get(b + o, 12u * n, n, &r->out[i]) < 0) {
			return -EPROTO;
		}
		r->out[i].seq = get64(b + o - 10);
		o += 12 * n;
		for (int k = 0; k < n; k++) {
			int l = runs_get(b + o, len - o, r->runs[i][k], &r->nruns[i][k]);

			if (l < 0) {
				return -EPROTO;
			}
			o += l;
		}
	}
	return (size_t)o == len ? 0 : -EPROTO;
}

void rh_handle_put(const struct rh_handle *h, uint8_t *b)
{
	memset(b, 0, RH_HANDLE_LEN);
	put32(b, RH_MAGIC);
	b[4] = h->nnics;
	b[5] = h->listen_nic;
	put64(b + 8, h->listen_id);
	memcpy(b + RH_HANDLE_SECRET_OFF, h->secret, RH_SECRET_LEN);
	for (int i = 0; i < h->nnics && i < RH_HANDLE_NICS; i++) {
		uint8_t *p = b + 16 + 8 * i;

		memcpy(p, &h->nics[i].ipv4, 4);
		memcpy(p + 4, &h->nics[i].port, 2);
		p[6] = (uint8_t)h->nics[i].rail;
		p[7] = h->nics[i].up;
	}
}

int rh_handle_get(const uint8_t *b, struct rh_handle *h)
{
	if (get32(b) != RH_MAGIC || b[4] == 0 || b[4] > RH_HANDLE_NICS || b[5] >= b[4]) {
		return -EINVAL;
	}
	h->nnics = b[4];
	h->listen_nic = b[5];
	h->listen_id = get64(b + 8);
	memcpy(h->secret, b + RH_HANDLE_SECRET_OFF, RH_SECRET_LEN);
	for (int i = 0; i < h->nnics; i++) {
		const uint8_t *p = b + 16 + 8 * i;

		memcpy(&h->nics[i].ipv4, p, 4);
		memcpy(&h->nics[i].port, p + 4, 2);
		h->nics[i].rail = (int8_t)p[6];
		h->nics[i].up = p[7];
	}
	return 0;
}
