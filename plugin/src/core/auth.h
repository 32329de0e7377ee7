/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer authentication and integrity helpers:
 *  - secrets and nonces from getrandom(2);
 *  - HMAC-SHA256 from the system's libcrypto (OpenSSL 3): a hello proves that its sender knows
 *    the connection secret that only the connect handle carries (wire.h, rh_hello_mac_input);
 *  - frame MACs after the hello (struct rh_fmac, used by byte-stream transports): every
 *    stream's key is derived (HKDF-SHA256) from the connection secret, the connection id, the
 *    lane id, the stream index and count, and the stream nonces of both hellos; every frame
 *    header (and a control frame's payload) carries a truncated HMAC-SHA256 over a direction
 *    byte, an implicit per-direction frame counter and the bytes; optionally
 *    (RAILHOP_CHECKSUM=1) a DATA frame's payload carries a GMAC (AES-128-GCM with the payload
 *    as authenticated data, nonce = direction + that frame's counter) under a second key.
 */
#ifndef RH_AUTH_H
#define RH_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

/* Fill buf with n random bytes (getrandom, never a weaker fallback): 0 or -errno. */
int rh_auth_random(void *buf, size_t n);
/* Sign h (fills h->mac) / check h's MAC, as rh_hello_mac_input() describes. */
int rh_auth_sign(const uint8_t *key, struct rh_hello *h, bool reply, uint64_t conn_id,
		 uint32_t epoch, const uint8_t *bind1, const uint8_t *bind2);
bool rh_auth_verify(const uint8_t *key, const struct rh_hello *h, bool reply, uint64_t conn_id,
		    uint32_t epoch, const uint8_t *bind1, const uint8_t *bind2);
/* Constant-time comparison. */
bool rh_auth_equal(const void *a, const void *b, size_t n);

/* --- Frame MACs (one struct rh_fmac per stream, used by that stream's I/O thread only) --- */

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
