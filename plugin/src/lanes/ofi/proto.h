/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The ofi lane's protocol and bookkeeping (lanes/ofi/), as pure functions (unit-tested):
 *
 *  - the 64-bit remote CQ data ("immediate") of a DATA write: low bits of the message seq, the
 *    receive slot, the chunk index and low bits of the epoch; the receiver expands the
 *    truncated fields against what it knows (its receive window, its epoch);
 *  - the lane's own messages (sent with fi_send next to the core's control frames):
 *    ADV_REQ (sender -> receiver: "tell me where (seq, slot) goes"), ADV (the answer: remote
 *    address, key and size of the posted buffer, or STALE), EPOCH (the sender's fence marker),
 *    DATA0 (a zero-byte chunk: its immediate as a message, there is nothing to write);
 *  - the sender's advert table (seq, slot) -> (address, key, size, epoch, chunks the receiver
 *    already holds) and the bounds check of every write against its advert;
 *  - the receiver's advert records, which turn a write completion back into a frame header;
 *  - the per-domain registration cache: address ranges -> memory region.
 */
#ifndef RH_OFI_PROTO_H
#define RH_OFI_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../core/wire.h"

/* The immediate data of a write: which advert (seq, slot), which chunk, which epoch. Its
 * layout follows the provider's CQ data size (fi_domain_attr.cq_data_size): 8 bytes (tcp) take
 * the wide layout; 4 bytes (verbs: the 32-bit immediate of an RDMA write) the narrow one,
 * whose fields are shorter (seq and epoch are expanded against a reference on receipt, so
 * only their low bits travel; a message has at most 2^14 chunks). */
#define OFI_IMM_SEQ_BITS 20
#define OFI_IMM_SLOT_BITS 3
#define OFI_IMM_CHUNK_BITS 25
#define OFI_IMM_EPOCH_BITS 16

struct ofi_imm_layout {
	uint8_t seq, slot, chunk, epoch; /* bits, low to high */
};

extern const struct ofi_imm_layout ofi_imm_wide; /* 20/3/25/16: 8 bytes of CQ data */
extern const struct ofi_imm_layout ofi_imm_narrow; /* 10/3/14/5: 4 bytes of CQ data */

/* The layout that fits cq_data_size bytes; NULL below 4. */
const struct ofi_imm_layout *ofi_imm_layout_for(size_t cq_data_size);

struct ofi_imm {
	uint64_t seq; /* full on encode; low l->seq bits after decode */
	uint32_t slot;
	uint64_t chunk; /* chunk index within the message */
	uint32_t epoch; /* full on encode; low l->epoch bits after decode */
};

/* -ERANGE when the slot or the chunk index does not fit. */
int ofi_imm_encode(const struct ofi_imm_layout *l, const struct ofi_imm *im, uint64_t *out);
void ofi_imm_decode(const struct ofi_imm_layout *l, uint64_t v, struct ofi_imm *im);
/* The value whose low `bits` bits are lo that is nearest to ref (ties: the lower one). */
uint64_t ofi_expand(uint64_t lo, int bits, uint64_t ref);

/* --- lane messages: [8-byte header][body] --- */

enum ofi_mkind {
	OFI_M_CORE = 1, /* body: one or more core frames (header + payload), as on a TCP stream */
	OFI_M_HELLO = 2, /* body: core HELLO frame */
	OFI_M_HELLO_ACK = 3, /* body: core HELLO_ACK frame */
	OFI_M_ADV_REQ = 4,
	OFI_M_ADV = 5,
	OFI_M_EPOCH = 6,
	OFI_M_DATA0 = 7,
	OFI_M_MAX
};

#define OFI_MHDR_LEN 8
#define OFI_MSG_MAX (OFI_MHDR_LEN + RH_HDR_LEN + RH_CTRL_MAX)

/* Write the message header; returns OFI_MHDR_LEN. */
size_t ofi_mhdr_put(uint8_t *b, enum ofi_mkind kind, uint32_t body_len);
/* -EPROTO when the kind is unknown or the body is longer than the message. */
int ofi_mhdr_get(const uint8_t *b, size_t msg_len, enum ofi_mkind *kind, uint32_t *body_len);

struct ofi_adv_req {
	uint64_t seq;
	uint64_t total; /* sender's message size (the receiver needs it to cut chunks) */
	uint32_t epoch; /* epoch of the chunk that needs the advert */
	uint8_t slot;
};

enum ofi_adv_status { OFI_ADV_OK = 0, OFI_ADV_STALE = 1, OFI_ADV_GONE = 2 };

/* An ADV carries the receiver's map of the chunks it already holds (bit i = chunk i placed):
 * the sender never writes those again, so after a resume every chunk of a receive is written
 * exactly once per epoch and no redundant write can land after the receive completed. */
struct ofi_adv_msg {
	uint64_t seq;
	uint64_t addr; /* remote address of offset 0 of the buffer (VA or MR offset) */
	uint64_t key;
	uint64_t size;
	uint32_t epoch;
	uint8_t slot;
	uint8_t status;
	uint32_t nwords; /* placed-chunk map words that follow */
};

#define OFI_ADV_REQ_LEN 21
#define OFI_ADV_LEN 42 /* without the map */
/* Most map words an ADV carries: messages of up to this many x 64 chunks. */
#define OFI_ADV_WORDS_MAX ((RH_CTRL_MAX - OFI_ADV_LEN) / 8)

size_t ofi_adv_req_put(const struct ofi_adv_req *r, uint8_t *b);
int ofi_adv_req_get(const uint8_t *b, size_t len, struct ofi_adv_req *r);
/* Returns the encoded length, or -ENOSPC when the map does not fit in cap. */
int ofi_adv_put(const struct ofi_adv_msg *a, const uint64_t *placed, uint8_t *b, size_t cap);
/* Decodes the map into placed (at most max_words; -EPROTO when longer or truncated). */
int ofi_adv_get(const uint8_t *b, size_t len, struct ofi_adv_msg *a, uint64_t *placed,
		uint32_t max_words);

/* --- sender: adverts received, per lane --- */

enum ofi_adv_state { OFI_ADV_NONE = 0, OFI_ADV_REQUESTED, OFI_ADV_VALID };

struct ofi_adv {
	uint64_t seq;
	uint64_t addr, key, size;
	uint32_t epoch;
	uint8_t state;
	uint32_t nwords;
	uint64_t *placed; /* chunks the receiver held when it answered (owned) */
	uint64_t t_req_ms; /* REQUESTED: when the request left */
};

struct ofi_adv_table {
	struct ofi_adv e[RH_RING][RH_MAX_RECVS];
};

/* What a chunk of (seq, slot) needs: OFI_ADV_VALID (write now), OFI_ADV_REQUESTED (wait for
 * the answer) or OFI_ADV_NONE (send an ADV_REQ). Adverts given before the resume epoch
 * min_epoch are not used any more. */
enum ofi_adv_state ofi_adv_lookup(const struct ofi_adv_table *t, uint64_t seq, int slot,
				  uint32_t min_epoch);
void ofi_adv_requested(struct ofi_adv_table *t, uint64_t seq, int slot, uint32_t epoch,
		       uint64_t now_ms);
/* A request of (seq, slot) has waited more than limit_ms for its answer. The receiver holds a
 * request back only while its fence gate is closed, and fails the endpoint that keeps it
 * closed after the completion timeout, so a longer wait means a lost request or answer. */
bool ofi_adv_overdue(const struct ofi_adv_table *t, uint64_t seq, int slot, uint64_t now_ms,
		     uint64_t limit_ms);
/* Store an ADV answer and its placed-chunk map (OK: valid, otherwise forgotten). Returns false
 * when it answers nothing this table asked for; -ENOMEM is reported as true with the advert
 * forgotten (asked again). */
bool ofi_adv_store(struct ofi_adv_table *t, const struct ofi_adv_msg *a, const uint64_t *placed);
/* The receiver already held chunk idx of (seq, slot) when it gave the valid advert. */
bool ofi_adv_placed(const struct ofi_adv_table *t, uint64_t seq, int slot, uint64_t idx);
void ofi_adv_table_free(struct ofi_adv_table *t);
/* Remote address of chunk [off, off + len) of (seq, slot); -ERANGE when it would write
 * outside the advertised buffer, -ENOENT without a valid advert. */
int ofi_adv_target(const struct ofi_adv_table *t, uint64_t seq, int slot, uint64_t off,
		   uint64_t len, uint64_t *raddr, uint64_t *key);

/* --- receiver: adverts given, per lane --- */

enum ofi_rrec_state { OFI_RREC_NONE = 0, OFI_RREC_PENDING, OFI_RREC_ADVERTISED };

struct ofi_rrec {
	uint64_t seq;
	uint64_t total;
	uint64_t size;
	char *buf;
	uint32_t epoch;
	uint8_t state;
	uint64_t t_pending_ms; /* PENDING: since when */
};

struct ofi_rrec_table {
	struct ofi_rrec e[RH_RING][RH_MAX_RECVS];
};

/* Whether the receiver takes request q into record r (the record of q's seq and slot). A
 * request older than the one the record holds for the same receive is not taken: requests
 * travel on any endpoint of the lane, so one issued before a resume can arrive after the
 * sender's newer one, and taking it would drop the newer request (the sender would wait for
 * its answer forever) or an advert in use (its writes would be dropped as unknown). The sender
 * ignores answers older than its request, so the old one needs none. */
bool ofi_rrec_take(const struct ofi_rrec *r, const struct ofi_adv_req *q);
/* The record a write with immediate im (decoded, truncated) belongs to, or NULL. */
struct ofi_rrec *ofi_rrec_find(const struct ofi_imm_layout *l, struct ofi_rrec_table *t,
			       const struct ofi_imm *im);
/* Rebuild the DATA frame header of a completed write: off/len from the chunk index and the
 * sender's total, full seq from the record, full epoch from ref_epoch. -EPROTO when the chunk
 * is outside the message or the buffer. */
int ofi_rrec_hdr(const struct ofi_imm_layout *l, const struct ofi_rrec *r, const struct ofi_imm *im,
		 uint64_t chunk, uint32_t ref_epoch, uint64_t conn_id, struct rh_hdr *h);

/* The fence gate (see fence.c): adverts of resume epoch min_epoch may be given once every open
 * endpoint of the connection has passed the sender's marker for it and no fenced endpoint is
 * still open. */
bool ofi_gate_open(uint32_t min_epoch, const uint32_t *marks, int nopen, int nfenced_open);

/* --- per-domain registration cache --- */

struct ofi_rc_entry {
	uintptr_t lo, hi; /* [lo, hi) */
	void *mr; /* struct fid_mr * */
	void *desc;
	uint64_t key;
};

struct ofi_rcache {
	struct ofi_rc_entry *e;
	int n, cap;
};

/* The page-aligned range registered for [a, a + len). */
void ofi_rc_range(uintptr_t a, size_t len, uintptr_t *lo, uintptr_t *hi);
/* The entry covering [a, a + len), or NULL. */
struct ofi_rc_entry *ofi_rc_find(struct ofi_rcache *c, uintptr_t a, size_t len);
int ofi_rc_insert(struct ofi_rcache *c, const struct ofi_rc_entry *ent);
/* Remove every entry overlapping [lo, hi) into out (at most max); returns how many. */
int ofi_rc_take(struct ofi_rcache *c, uintptr_t lo, uintptr_t hi, struct ofi_rc_entry *out,
		int max);
void ofi_rc_free(struct ofi_rcache *c);

#endif
