/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Wire formats (pure encode/decode, little-endian, unit-tested):
 *  - the 48-byte frame header every lane frame starts with: type, slot, flags, payload length,
 *    connection id, epoch, aux, message seq, offset, total size. It carries no magic; on a
 *    byte-stream lane (TCP) every frame after the hello is followed by a 16-byte tag (auth.h,
 *    struct rh_fmac: a truncated HMAC-SHA256 under the stream's key over a direction byte, the
 *    implicit per-direction frame counter, the header and a control frame's payload), and a
 *    DATA frame with RH_FLAG_PMAC by a second 16-byte tag (the payload's GMAC), then the
 *    payload: hdr | tag | [payload tag] | payload. Beyond that, every DATA frame is checked
 *    against the receive the receiver itself posted (core/conn.c); a frame that fails either
 *    check fails the lane it came on;
 *  - control payloads: clear-to-send (CTS), RESUME (receiver's completion record), FAILREQ;
 *  - the lane handshake (HELLO / HELLO_ACK): the protocol magic, a nonce and an HMAC-SHA256
 *    (keyed by the connection secret) proving that the opener, and in the reply the acceptor,
 *    knows the secret; the first hello of a connection and its reply carry each side's full
 *    NIC table;
 *  - the 128-byte connect handle NCCL passes from listener to connector out of band: the
 *    protocol magic, the listener's NICs and the 128-bit connection secret.
 */
#ifndef RH_WIRE_H
#define RH_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../nic.h"
#include "sched.h"

#define RH_HDR_LEN 48
/* In every connect handle and lane handshake (not in frame headers). Bumped when the wire
 * protocol changes, so ranks running different plugin builds fail at connect with a clear
 * message instead of misreading each other. "RHH4": handles carry the connection secret,
 * hellos a nonce, a stream nonce and a MAC, and frames after the hello a tag (above). */
#define RH_MAGIC 0x34484852u /* "RHH4" */
#define RH_SECRET_LEN 16 /* per-listener (so per-connection) secret, only in the handle */
#define RH_NONCE_LEN 16
#define RH_MAC_LEN 32 /* HMAC-SHA256 */
#define RH_FLAG_PMAC 1u /* DATA: a payload tag follows the header tag (RAILHOP_CHECKSUM=1) */
#define RH_MAX_RECVS 8
#define RH_RING 64 /* > NCCL_NET_MAX_REQUESTS outstanding receives */
#define RH_CTRL_MAX 16384
#define RH_HANDLE_NICS 11 /* the first hello carries the full table */
#define RH_MAX_DEAD 16
#define RH_RESUME_ANSWER 1u /* RESUME aux: answers the sender's FAILREQ */

enum rh_ftype {
	RH_F_DATA = 1, /* seq/slot/off/len chunk of a message of total bytes; payload follows;
			* flags RH_FLAG_PMAC: the payload carries a GMAC */
	RH_F_CTS = 2, /* receiver posted receive seq: aux = n, payload = n x (tag, size) */
	RH_F_ACK = 3, /* receiver completed (seq, slot) with total bytes */
	RH_F_RESUME = 4, /* receiver's completion record after a failover (epoch = new epoch;
			  * aux = RH_RESUME_ANSWER when it answers the sender's FAILREQ) */
	RH_F_FAILREQ = 5, /* sender asks for a RESUME (payload: dead lane ids) */
	RH_F_BYE = 6, /* graceful retirement of lane aux (fail-back) */
	RH_F_HELLO = 7, /* lane handshake request */
	RH_F_HELLO_ACK = 8, /* lane handshake reply (aux = status) */
	RH_F_MAX
};

struct rh_hdr {
	uint8_t type;
	uint8_t slot;
	uint16_t flags;
	uint32_t len; /* payload bytes following the header */
	uint64_t conn_id;
	uint32_t epoch;
	uint32_t aux;
	uint64_t seq;
	uint64_t off;
	uint64_t total;
};

/* Epochs only grow and never wrap: a peer's epoch is taken only when it is at most
 * RH_EPOCH_AHEAD_MAX ahead of ours and below RH_EPOCH_LIMIT; a side whose own epoch would
 * reach RH_EPOCH_LIMIT fails the connection (4 billion failovers do not happen). */
#define RH_EPOCH_AHEAD_MAX (1u << 16)
#define RH_EPOCH_LIMIT (UINT32_MAX - RH_EPOCH_AHEAD_MAX)

static inline bool rh_epoch_ok(uint32_t ours, uint32_t peer)
{
	return peer < RH_EPOCH_LIMIT && (uint64_t)peer <= (uint64_t)ours + RH_EPOCH_AHEAD_MAX;
}

void rh_hdr_put(const struct rh_hdr *h, uint8_t *b);
/* -EPROTO for an unknown type, a slot >= RH_MAX_RECVS or an oversized control payload. */
int rh_hdr_get(const uint8_t *b, struct rh_hdr *h);

/* What each side knows about a NIC of the other side. */
struct rh_peer_nic {
	uint32_t ipv4; /* network order */
	uint16_t port; /* network order */
	int16_t rail;
	int16_t numa;
	bool up;
	char pci[RH_PCI_MAX];
};

enum rh_hello_kind {
	RH_HELLO_CONN = 1, /* first lane of a new connection (names the listen comm) */
	RH_HELLO_LANE = 2, /* extra lane of an existing connection (names conn id + epoch) */
	RH_HELLO_PROBE = 3, /* health probe: answered and closed */
};

/* This side wants a payload MAC on every DATA frame it receives (RAILHOP_CHECKSUM=1): its peer
 * adds one to the DATA frames it sends on the stream whatever its own setting. */
#define RH_HELLO_F_PMAC 1u
/* HELLO_LANE: the lane is a warm standby (carries nothing until promoted; core/lane_state.h) */
#define RH_HELLO_F_STANDBY 2u

/* Transport bytes a hello may carry for its lane's transport (a one-sided transport's queue
 * pair address, say): opaque to the core, under the MAC like every other field. */
#define RH_HELLO_TP_MAX 64

struct rh_hello {
	uint8_t kind;
	uint8_t from_sender; /* the opener is the data sender of the connection */
	uint8_t nstreams;
	uint8_t stream;
	uint32_t lane_id;
	uint64_t listen_id;
	uint32_t chunk;
	int16_t src_nic; /* opener's NIC index */
	int16_t dst_nic; /* NIC index of the listener at the other end */
	/* Request: the opener's fresh nonce. Reply to HELLO_CONN: the acceptor's connection nonce;
	 * to HELLO_LANE: zero. */
	uint8_t nonce[RH_NONCE_LEN];
	uint8_t mac[RH_MAC_LEN]; /* see rh_hello_mac_input(); zero in probes */
	/* Fresh per stream (request: the opener's; reply: the acceptor's): with the connection
	 * secret they key the stream's frame MACs (auth.h, rh_fmac_init), so no two streams, nor
	 * two attempts of one, share a key. Under the MAC. */
	uint8_t snonce[RH_NONCE_LEN];
	uint8_t flags; /* RH_HELLO_F_*; under the MAC */
	int nnics;
	struct rh_peer_nic nics[RH_MAX_NICS];
	/* The transport's bytes (RH_HELLO_TP_MAX): encoded after the NICs as a length byte and
	 * the bytes, only when tp_len > 0, so a hello without them is encoded as before. */
	uint8_t tp_len;
	uint8_t tp[RH_HELLO_TP_MAX];
};

/* Returns the encoded length or -ENOSPC (also when tp_len > RH_HELLO_TP_MAX). Decoding: -EPROTO
 * when malformed, the transport bytes' length included; a hello without them has tp_len 0. */
int rh_hello_put(const struct rh_hello *h, uint8_t *b, size_t cap);
int rh_hello_get(const uint8_t *b, size_t len, struct rh_hello *h);

/* What the MAC of a hello covers (HMAC-SHA256 keyed by the connection secret), written to b:
 * a label naming the direction (request or reply), the hello's encoding with the MAC zeroed
 * (the stream index and the stream count included: each stream's hello is signed on its own,
 * rh_core_sign_stream(), so a captured hello cannot join as another stream of its lane nor
 * claim a larger lane), the connection id, the epoch (request
 * only), and bind (RH_NONCE_LEN bytes each, may be NULL = zeros): the connection's nonces
 * from both sides (HELLO_LANE request) or the request's nonce (reply). Returns the length or
 * -ENOSPC. */
#define RH_MAC_INPUT_MAX 2048
int rh_hello_mac_input(const struct rh_hello *h, bool reply, uint64_t conn_id, uint32_t epoch,
		       const uint8_t *bind1, const uint8_t *bind2, uint8_t *b, size_t cap);

struct rh_cts {
	uint64_t seq;
	int n;
	int32_t tags[RH_MAX_RECVS];
	uint64_t sizes[RH_MAX_RECVS];
};

int rh_cts_put(const struct rh_cts *c, uint8_t *b, size_t cap);
int rh_cts_get(const uint8_t *b, size_t len, int n, struct rh_cts *c);

#define RH_RESUME_RUNS 16 /* placed runs listed per incomplete slot (more are left out) */

/* The receiver's completion record: everything below next_seq that is not listed is complete;
 * of a listed, incomplete slot the chunks in runs[][] are placed too (the sender replays only
 * the others). Listing fewer runs than were placed is always safe: the receiver ignores
 * chunks it already has. Runs are sorted, disjoint and non-empty (checked on decode). */
struct rh_resume {
	uint64_t next_seq;
	int ndead;
	uint32_t dead[RH_MAX_DEAD]; /* lane ids the sender must fence */
	int nout;
	struct rh_cts out[RH_RING]; /* posted, incomplete receives */
	uint8_t done[RH_RING]; /* per outstanding receive: mask of completed slots */
	uint8_t nruns[RH_RING][RH_MAX_RECVS];
	struct rh_run runs[RH_RING][RH_MAX_RECVS][RH_RESUME_RUNS];
};

int rh_resume_put(const struct rh_resume *r, uint8_t *b, size_t cap);
/* Encoded size of r without any runs (what rh_resume_put needs before runs are added). */
size_t rh_resume_base_len(const struct rh_resume *r);
int rh_resume_get(const uint8_t *b, size_t len, struct rh_resume *r);
/* FAILREQ payload: list of dead lane ids. */
int rh_dead_put(int ndead, const uint32_t *dead, uint8_t *b, size_t cap);
int rh_dead_get(const uint8_t *b, size_t len, int *ndead, uint32_t *dead);

/* The connect handle (<= 128 bytes): names the listen comm and every NIC listener, and
 * carries the connection secret (bytes 104..119). */
struct rh_handle {
	uint8_t nnics;
	uint8_t listen_nic;
	uint64_t listen_id;
	struct {
		uint32_t ipv4;
		uint16_t port;
		int8_t rail;
		uint8_t up;
	} nics[RH_HANDLE_NICS];
	uint8_t secret[RH_SECRET_LEN];
};

#define RH_HANDLE_LEN 128
#define RH_HANDLE_SECRET_OFF 104
#define RH_HANDLE_COOKIE_OFF 120 /* 8 bytes the connector uses to resume its state machine */

void rh_handle_put(const struct rh_handle *h, uint8_t *b);
int rh_handle_get(const uint8_t *b, struct rh_handle *h);

#endif
