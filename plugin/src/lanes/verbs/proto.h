/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The verbs lane's protocol, as pure functions (unit-tested in plugin/tests/test_verbs_proto.c):
 *
 *  - the 32-bit immediate of an RDMA write: it names an *advert* and a chunk, never a sequence
 *    number or an epoch. The receiver gives every advert (the address and key of a posted
 *    buffer for one (seq, slot) at one epoch, answered to the sender's request) an id from a
 *    table of VERBS_NADV entries, and keeps the full seq, slot and epoch in the entry. An id is
 *    given again only once no write naming its previous use can still arrive:
 *      (a) every chunk the advert asked for has been written (each chunk is written once per
 *          advert: the advert carries the chunks already placed, which the sender skips), or
 *      (b) the sender's RETIRE for it arrived on the queue pair that carried its writes (RC
 *          delivers in order: nothing the sender posted before the RETIRE follows it), or
 *      (c) the receiver moved that queue pair to the error state (its responder drops every
 *          later packet) when it fenced the lane.
 *    So an immediate cannot alias across resumes, however many happen while writes are
 *    outstanding: the ofi lane's narrow layout carries 5 bits of epoch and 10 of seq and
 *    expands them against a reference, which aliases after 16 resumes in one write window;
 *    here nothing is expanded. A full table holds the receiver's answer back (-EAGAIN), it
 *    never reuses a live id;
 *  - the queue pair's address exchanged inside the lane's authenticated hello (qpn, psn, GID,
 *    MTU);
 *  - the verdict on a work completion's status and on an asynchronous event: which scope fails
 *    (nothing, the queue pair's lane, every lane of the NIC) and why.
 */
#ifndef RH_VERBS_PROTO_H
#define RH_VERBS_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../ofi/proto.h"

#define VERBS_IMM_ADV_BITS 12
#define VERBS_IMM_CHUNK_BITS 20 /* 2^20 chunks: 128 GiB messages at 128 KiB chunks */
#define VERBS_NADV (1u << VERBS_IMM_ADV_BITS)
#define VERBS_IMM_CHUNK_MAX ((1u << VERBS_IMM_CHUNK_BITS) - 1)

/* -ERANGE when adv or chunk does not fit. */
int verbs_imm_encode(uint32_t adv, uint64_t chunk, uint32_t *imm);
void verbs_imm_decode(uint32_t imm, uint32_t *adv, uint32_t *chunk);

/* --- the receiver's advert ids --- */

enum verbs_adv_state { VERBS_ADV_FREE = 0, VERBS_ADV_LIVE };

struct verbs_advid {
	uint8_t state;
	uint32_t lane_id; /* the lane (queue pair) it was given on: writes come only there */
	uint64_t seq;
	int slot;
	uint32_t epoch;
	uint64_t want; /* chunks the sender will write against it */
	uint64_t got; /* written so far */
};

struct verbs_adv_ids {
	struct verbs_advid e[VERBS_NADV];
	uint32_t next; /* round robin: a freed id rests as long as possible */
	uint32_t nlive;
};

void verbs_adv_init(struct verbs_adv_ids *t);
/* A fresh id for an advert of (seq, slot, epoch) on lane_id that the sender will write `want`
 * chunks against (want >= 1). -EAGAIN when every id is live, -EINVAL when want is 0. */
int verbs_adv_alloc(struct verbs_adv_ids *t, uint32_t lane_id, uint64_t seq, int slot,
		    uint32_t epoch, uint64_t want);
/* The live advert a write with id `adv` completed on lane_id belongs to; NULL when the id is not
 * live or was given on another lane (a protocol error: the lane fails). */
struct verbs_advid *verbs_adv_find(struct verbs_adv_ids *t, uint32_t adv, uint32_t lane_id);
/* One write against the live id completed; true when that was its last (the id is free). */
bool verbs_adv_written(struct verbs_adv_ids *t, uint32_t adv);
/* The sender's RETIRE for adv arrived on lane_id: false when adv is not live there. */
bool verbs_adv_retire(struct verbs_adv_ids *t, uint32_t adv, uint32_t lane_id);
/* The lane's queue pair is in the error state here: every id given on it is free. Returns how
 * many. */
uint32_t verbs_adv_lane_fenced(struct verbs_adv_ids *t, uint32_t lane_id);

/* --- the lane's use of the ids (fence.c) ---
 *
 * The receiver keeps one id table per lane (lane_id 0: a lane has one queue pair) next to the
 * ofi advert records of lanes/ofi/proto.h, and frees an id by (b): the sender's next ADV_REQ
 * for the same record (seq % RH_RING, slot) is its RETIRE, since the sender stops writing
 * against an advert before it asks for that record's next one and RC delivers the request
 * after every write posted before it; and by (c): the table goes with the lane, after its
 * queue pair was destroyed. Chunks of one message may go over several lanes, so the count of
 * (a) is not known to the receiver and the lane gives want = VERBS_ADV_WANT_ANY. */
#define VERBS_ADV_WANT_ANY UINT64_MAX

/* An ADV carries its id ahead of the ofi advert body (lanes/ofi/proto.h). */
#define VERBS_ADV_ID_LEN 4
void verbs_adv_id_put(uint32_t id, uint8_t *b);
/* -EPROTO when short or the id is outside the table. */
int verbs_adv_id_get(const uint8_t *b, size_t len, uint32_t *id);

/* The DATA frame header of a completed write with immediate imm on lane_id: the advert the id
 * names must be live on that lane and its record (rr, indexed by the advert's full seq and
 * slot) must still hold it; seq and epoch come whole from the advert, nothing is expanded, so
 * no number of resumes while the write was in flight can alias it. -ENOENT when the id names
 * no live advert of the lane, -EPROTO when the record does not hold it or the chunk lies
 * outside the message or the buffer. *adv is set to the id either way. */
int verbs_write_hdr(struct verbs_adv_ids *t, uint32_t lane_id, const struct ofi_rrec_table *rr,
		    uint32_t imm, uint64_t chunk_size, uint64_t conn_id, struct rh_hdr *h,
		    uint32_t *adv);

/* --- the queue pair's address, inside the lane's hello --- */

struct verbs_qp_info {
	uint32_t qpn; /* 24 bits */
	uint32_t psn; /* 24 bits */
	uint8_t gid[16];
	uint8_t mtu; /* enum ibv_mtu of the sender's active MTU */
};

#define VERBS_QP_INFO_LEN 25
void verbs_qp_info_put(const struct verbs_qp_info *q, uint8_t *b);
/* -EPROTO when short, qpn or psn above 24 bits, or mtu outside 1..5 (256..4096 bytes). */
int verbs_qp_info_get(const uint8_t *b, size_t len, struct verbs_qp_info *q);
/* The peer's queue pair address from the transport bytes of its authenticated hello, before
 * any queue pair is moved towards it: exactly VERBS_QP_INFO_LEN bytes (-EPROTO when truncated
 * or longer), a valid verbs_qp_info whose qpn is not one of the special queue pairs 0 and 1
 * (-EPROTO), and a GID that is the RoCE v2 IPv4-mapped GID of peer_ip (network order: the
 * address of the peer NIC the handshake connected to or came from), -EADDRNOTAVAIL otherwise
 * (a GID of another NIC or host would send the writes there). */
int verbs_peer_qp_info(const uint8_t *tp, size_t tp_len, uint32_t peer_ip, struct verbs_qp_info *q);
/* The IPv4-mapped GID (::ffff:a.b.c.d) of ip (network order). */
void verbs_gid_of_ipv4(uint32_t ip, uint8_t gid[16]);

/* --- failure signals --- */

enum verbs_scope {
	VERBS_OK = 0, /* nothing fails */
	VERBS_FAIL_LANE, /* the lane of the queue pair */
	VERBS_FAIL_NIC, /* every lane on the device's port */
	VERBS_NIC_UP, /* the port came back: fail-back may probe */
};

struct verbs_verdict {
	enum verbs_scope scope;
	int err; /* negative errno for the core (rh_core_lane_error) */
	const char *why;
};

/* A work completion's status (enum ibv_wc_status). */
struct verbs_verdict verbs_wc_verdict(int status);
/* An asynchronous event's type (enum ibv_event_type). */
struct verbs_verdict verbs_async_verdict(int event_type);

#endif
