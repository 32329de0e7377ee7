/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared by the libFuzzer targets (plugin/fuzz/fuzz_*.c, docs/fuzzing.md): the invariant check
 * that aborts (libFuzzer keeps the input as a crash), and the checks of the core's wire decoders
 * that more than one target reaches (a frame stream, a hello).
 */
#ifndef RH_FUZZ_COMMON_H
#define RH_FUZZ_COMMON_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/wire.h"
#include "fuzz_check.h"

/* A decoded hello: in bounds, and it encodes to a hello that decodes to the same fields; where
 * the input was canonical (each NIC's up byte 0 or 1, no NUL inside a PCI string, nothing after
 * the transport bytes) the encoding is the input itself. */
static inline void fuzz_check_hello(const uint8_t *b, size_t len, const struct rh_hello *h)
{
	static uint8_t enc[4096], mac[RH_MAC_INPUT_MAX];
	static struct rh_hello again;
	bool canonical = true;
	int n, m;

	FUZZ_CHECK(h->kind >= RH_HELLO_CONN && h->kind <= RH_HELLO_PROBE);
	FUZZ_CHECK(h->nnics >= 0 && h->nnics <= RH_MAX_NICS);
	FUZZ_CHECK(h->tp_len <= RH_HELLO_TP_MAX);
	/* a probe may name stream nstreams (a probe of a lane with no stream yet names 0 of 0) */
	FUZZ_CHECK(h->stream < h->nstreams + (h->kind == RH_HELLO_PROBE));
	for (int i = 0; i < h->nnics; i++) {
		size_t pl = strnlen(h->nics[i].pci, RH_PCI_MAX);

		FUZZ_CHECK(pl < RH_PCI_MAX);
	}
	n = rh_hello_put(h, enc, sizeof(enc));
	FUZZ_CHECK(n > 0 && (size_t)n <= sizeof(enc));
	memset(&again, 0, sizeof(again));
	FUZZ_CHECK(rh_hello_get(enc, (size_t)n, &again) == 0);
	FUZZ_CHECK(again.kind == h->kind && again.from_sender == h->from_sender &&
		   again.nstreams == h->nstreams && again.stream == h->stream &&
		   again.lane_id == h->lane_id && again.listen_id == h->listen_id &&
		   again.chunk == h->chunk && again.src_nic == h->src_nic &&
		   again.dst_nic == h->dst_nic && again.flags == h->flags &&
		   again.nnics == h->nnics && again.tp_len == h->tp_len);
	FUZZ_CHECK(!memcmp(again.nonce, h->nonce, RH_NONCE_LEN) &&
		   !memcmp(again.mac, h->mac, RH_MAC_LEN) &&
		   !memcmp(again.snonce, h->snonce, RH_NONCE_LEN) &&
		   !memcmp(again.tp, h->tp, h->tp_len));
	for (int i = 0; i < h->nnics; i++) {
		const struct rh_peer_nic *x = &h->nics[i], *y = &again.nics[i];

		FUZZ_CHECK(x->ipv4 == y->ipv4 && x->port == y->port && x->rail == y->rail &&
			   x->numa == y->numa && x->up == y->up && !strcmp(x->pci, y->pci));
	}
	/* canonical input: the up bytes, the PCI lengths and the end */
	{
		size_t o = 94;

		for (int i = 0; i < h->nnics && canonical; i++) {
			canonical = b[o + 10] <= 1 && strlen(h->nics[i].pci) == b[o + 11];
			o += 12u + b[o + 11];
		}
		if (canonical) {
			o += h->tp_len ? 1u + h->tp_len : 0;
			canonical = o == len;
		}
		if (canonical) {
			FUZZ_CHECK((size_t)n == len && !memcmp(enc, b, len));
		}
	}
	/* what the MAC covers: fits its buffer, or -ENOSPC (a hello too long to sign is refused) */
	m = rh_hello_mac_input(h, false, 1, 2, NULL, NULL, mac, sizeof(mac));
	FUZZ_CHECK(m == -ENOSPC || (m > 0 && (size_t)m <= sizeof(mac)));
}

/* A control payload of a frame whose header decoded: each decoder's result in bounds, and the
 * payload re-encoded byte for byte (these encodings are canonical). */
static inline void fuzz_check_payload(const struct rh_hdr *h, const uint8_t *p, size_t len)
{
	static struct rh_resume r;
	static struct rh_hello hello;
	static uint8_t enc[RH_CTRL_MAX + 64];
	struct rh_cts cts;
	uint32_t dead[RH_MAX_DEAD];
	int ndead, n;

	switch (h->type) {
	case RH_F_CTS:
		if (rh_cts_get(p, len, (int)h->aux, &cts) == 0) {
			FUZZ_CHECK(cts.n >= 1 && cts.n <= RH_MAX_RECVS &&
				   (size_t)cts.n * 12 == len);
			n = rh_cts_put(&cts, enc, sizeof(enc));
			FUZZ_CHECK(n >= 0 && (size_t)n == len && !memcmp(enc, p, len));
		}
		break;
	case RH_F_RESUME:
		if (rh_resume_get(p, len, &r) == 0) {
			FUZZ_CHECK(r.ndead >= 0 && r.ndead <= RH_MAX_DEAD);
			FUZZ_CHECK(r.nout >= 0 && r.nout <= RH_RING);
			for (int i = 0; i < r.nout; i++) {
				FUZZ_CHECK(r.out[i].n >= 1 && r.out[i].n <= RH_MAX_RECVS);
				for (int k = 0; k < r.out[i].n; k++) {
					uint64_t end = 0;

					FUZZ_CHECK(r.nruns[i][k] <= RH_RESUME_RUNS);
					for (int j = 0; j < r.nruns[i][k]; j++) {
						const struct rh_run *u = &r.runs[i][k][j];

						FUZZ_CHECK(u->count > 0 &&
							   (j == 0 || u->start >= end));
						end = (uint64_t)u->start + u->count;
					}
				}
			}
			FUZZ_CHECK(rh_resume_base_len(&r) <= len);
			n = rh_resume_put(&r, enc, sizeof(enc));
			FUZZ_CHECK(n >= 0 && (size_t)n == len && !memcmp(enc, p, len));
		}
		break;
	case RH_F_FAILREQ:
		n = rh_dead_get(p, len, &ndead, dead);
		if (n >= 0) {
			FUZZ_CHECK(ndead >= 0 && ndead <= RH_MAX_DEAD && (size_t)n <= len);
			FUZZ_CHECK(rh_dead_put(ndead, dead, enc, sizeof(enc)) == n &&
				   !memcmp(enc, p, (size_t)n));
		}
		break;
	case RH_F_HELLO:
	case RH_F_HELLO_ACK:
		memset(&hello, 0, sizeof(hello));
		if (rh_hello_get(p, len, &hello) == 0) {
			fuzz_check_hello(p, len, &hello);
		}
		break;
	default:
		break;
	}
}

/* A frame header that decoded: in bounds, and re-encoded byte for byte. */
static inline void fuzz_check_hdr(const uint8_t *b, const struct rh_hdr *h)
{
	uint8_t enc[RH_HDR_LEN];

	FUZZ_CHECK(h->type >= RH_F_DATA && h->type < RH_F_MAX && h->slot < RH_MAX_RECVS);
	FUZZ_CHECK(h->type == RH_F_DATA || h->len <= RH_CTRL_MAX);
	FUZZ_CHECK(h->type != RH_F_DATA || (h->off <= h->total && h->len <= h->total - h->off));
	rh_hdr_put(h, enc);
	FUZZ_CHECK(!memcmp(enc, b, RH_HDR_LEN));
}

/* Frames back to back, as a lane's control message body (lanes/ofi/io.c on_core) or a byte
 * stream without tags carries them: header, payload, header, ...; stops at the first header
 * that does not decode or a payload longer than what is left. */
static inline void fuzz_frames(const uint8_t *b, size_t len)
{
	size_t o = 0;

	while (o + RH_HDR_LEN <= len) {
		struct rh_hdr h;

		if (rh_hdr_get(b + o, &h) < 0) {
			return;
		}
		fuzz_check_hdr(b + o, &h);
		o += RH_HDR_LEN;
		if (h.len > len - o) {
			return;
		}
		fuzz_check_payload(&h, b + o, h.len);
		o += h.len;
	}
}

#endif
