/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Frame MACs after the hello (part of the API the lanes use): one struct rh_fmac per stream of
 * a byte-stream lane, used by that stream's I/O thread only. The stream's keys are derived
 * (HKDF-SHA256, OpenSSL EVP_KDF) from the connection secret, the connection id, the lane id,
 * the stream index and count, and the stream nonces of both hellos (rh_core_frame_key() in
 * lane_ops.h does it for a transport); every frame header (and a control frame's payload)
 * carries a truncated HMAC-SHA256 (EVP_MAC) over a direction byte, an implicit per-direction
 * frame counter and the bytes; with RAILHOP_CHECKSUM=1 a DATA frame's payload carries a GMAC
 * (AES-128-GCM with the payload as authenticated data, nonce = direction + that frame's
 * counter) under a second key. The wire layout is in wire.h.
 */
#ifndef RH_FMAC_H
#define RH_FMAC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#define RH_TAG_LEN 16 /* truncated HMAC-SHA256 (headers), GMAC tag (payloads) */
#define RH_FM_TX 0
#define RH_FM_RX 1

struct evp_mac_ctx_st;
struct evp_cipher_ctx_st;

struct rh_fmac {
	struct evp_mac_ctx_st *hmac; /* keyed with the stream's header key */
	struct evp_cipher_ctx_st *gcm[2]; /* keyed with its payload key, by direction */
	uint64_t ctr[2]; /* frames sealed (RH_FM_TX) / opened (RH_FM_RX) so far */
	uint64_t pay_ctr; /* counter of the DATA frame last opened (its payload's nonce) */
	uint8_t dir; /* direction byte of our frames: 0 = this side opened the stream */
};

/* Derive the stream's keys and set f up (counters at 0). nonce_open/nonce_acc: the stream
 * nonces of the opener's hello and of the acceptor's reply (RH_NONCE_LEN each). 0, -EIO
 * (libcrypto failed) or -ENOMEM; on error f holds nothing to free. */
int rh_fmac_init(struct rh_fmac *f, const uint8_t *secret, uint64_t conn_id, uint32_t lane_id,
		 int stream, int nstreams, const uint8_t *nonce_open, const uint8_t *nonce_acc,
		 bool opener);
void rh_fmac_free(struct rh_fmac *f);
/* Tag of our next frame: hdr (RH_HDR_LEN bytes, encoded) and p (len bytes: a control frame's
 * payload; DATA passes none, its payload has its own MAC). Advances the send counter. 0 or
 * -EIO. */
int rh_fmac_seal(struct rh_fmac *f, const uint8_t *hdr, const void *p, size_t len, uint8_t *tag);
/* Check the tag of the peer's next frame (as seal made it); advances the receive counter
 * either way (a frame that fails ends the stream). */
bool rh_fmac_open(struct rh_fmac *f, const uint8_t *hdr, const void *p, size_t len,
		  const uint8_t *tag);
/* Payload GMAC of the DATA frame we seal next (call before rh_fmac_seal of its header). */
int rh_fmac_pay_seal(struct rh_fmac *f, const void *p, size_t len, uint8_t *tag);
/* Payload GMAC of the DATA frame last opened, fed as its bytes arrive: begin, update*, end
 * (true when the tag matches). */
int rh_fmac_pay_begin(struct rh_fmac *f);
int rh_fmac_pay_update(struct rh_fmac *f, const void *p, size_t len);
bool rh_fmac_pay_end(struct rh_fmac *f, const uint8_t *tag);
/* Pure policy of a DATA frame's payload MAC: 0 when the frame may be taken, -EBADMSG when it
 * lacks one that required (RAILHOP_CHECKSUM=1 at the receiver) asks for. */
int rh_fmac_pay_policy(const struct rh_hdr *h, bool required);

#endif
