/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verbs lanes, the lane itself (RAILHOP_TRANSPORT=verbs): one RC queue pair per lane between
 * the RDMA devices of the lane's two NICs, carrying the core's control frames and the lane's
 * own messages as sends into pre-posted receive buffers, and DATA one-sided: the receiver
 * advertises the posted buffer of (seq, slot) (address, rkey, the chunks it already holds),
 * the sender writes each chunk with IBV_WR_RDMA_WRITE_WITH_IMM from the user's memory into the
 * user's memory (no copy on either side), and the receiver's completion names the chunk.
 *
 * Connection set-up: the lane's hello goes over a short-lived TCP connection from the local NIC
 * to the peer NIC's lane listener (the listener port the core advertises); the hello and its
 * reply carry each side's queue pair address (verbs_qp_info: QPN, PSN, RoCE v2 GID, MTU) in
 * their transport bytes, under the hello's MAC (core/wire.h), so a peer's queue pair is only
 * ever taken from an authenticated frame. The opener creates its queue pair and posts its
 * receives (INIT) before its hello leaves; the acceptor connects its own (RTR, RTS) before it
 * replies; the opener connects on the reply and sends one "go" byte, after which the acceptor
 * may send (a send to a queue pair that is not yet RTR would wait for a full retry timeout).
 * Probes are the same hello exchange without a queue pair.
 *
 * Adverts and the fence follow the ofi lane (lanes/ofi/fence.c, its THE FENCE comment; the
 * pure tables of lanes/ofi/proto.c are shared). The immediate does not: it names the advert
 * (a 12-bit id the receiver gave it, carried in the ADV) and the chunk (20 bits), and the
 * receiver takes seq, slot and epoch whole from its table of ids (proto.h), so a write still
 * in flight across any number of resumes resolves to the advert it was posted against; an
 * immediate that names no live advert of the lane fails the lane (-EPROTO), it is never
 * placed by a guess.
 * Rule 1 here: a fenced lane's queue pair is moved to the error state and destroyed before
 * anything else the I/O thread does; once ibv_destroy_qp returns the device places and reads
 * nothing more for it.
 *
 * Failure signals: an error completion fails the lane (verbs_wc_verdict), an asynchronous QP
 * event fails its lane and a port error every lane of the NIC (verbs_async_verdict); the core's
 * failover moves the connection and replays; a lane that comes back (fail-back) is a new lane
 * with a new queue pair.
 *
 * Files: dev.c (per-NIC device, protection domain, registration cache, listener), ep.c
 * (endpoints: handshake, queue pair, send slots, close), fence.c (adverts and writes), io.c
 * (the one I/O thread, woken by the NICs' completion channels), ops.c (the lane_ops table, verbs_lane_ops).
 */
#ifndef RH_VERBS_LANE_H
#define RH_VERBS_LANE_H

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../log.h"
#include "../../param.h"
#include "../lanes.h"
#include "verbs.h"

#define VB_NRX 32 /* receive buffers per queue pair */
#define VB_NTX 16 /* sends in flight per queue pair */
#define VB_NWR 8 /* chunks owned per lane (waiting for an advert or being written) */
#define VB_PEEK 16 /* queued messages whose adverts are asked for ahead of their chunks */
#define VB_MSG_MAX OFI_MSG_MAX
#define VB_HELLO_MAX 4096
#define VB_HS_MS 2000 /* a handshake's time beyond two probe timeouts (ep.c) */
#define VB_ADV_WAIT_TIMEOUTS 3
#define VB_HS_MAX 256 /* accepted handshakes waiting for their hello (ep.c) */

/*
 * Ownership (docs/architecture.md "Object lifetimes"). A struct vb_ep is made by
 * verbs_ep_new (open/probe, connection lock held, handed over by verbs_ep_push under
 * verbs_pend_mu; or the I/O thread for an accepted handshake) and is the I/O thread's alone
 * from verbs_pending on; it closes it (verbs_ep_close: queue pair to error and destroyed
 * first, then the io reference, the probe's report, the detach under the connection lock, the
 * connection reference) and frees it. There is no closer thread. e->lane only while attached
 * to lane->tp (struct vb_lane, freed with its endpoint); e->conn holds a reference while set.
 * The per-device registration cache (vb_dev mrc, under mr_mu) is filled by the I/O thread
 * (verbs_dev_mr) and emptied by verbs_forget (the host's deregMr thread: only pages no live
 * handle covers, core/plugin.c) and at the stop. No host object is referred to.
 */
enum vb_kind {
	VK_LANE, /* opened here */
	VK_ACCEPTED, /* accepted, waiting for the hello that says what it is */
	VK_LANE_IN, /* accepted lane */
	VK_PROBE_OUT,
	VK_PROBE_REPLY, /* answering a probe; closed once the answer left */
};

enum vb_state {
	VS_NEW,
	VS_CONNECTING, /* opener: TCP connect in progress */
	VS_HELLO_WAIT, /* opener: hello sent, waiting for the reply */
	VS_HELLO_IN, /* acceptor: waiting for the hello */
	VS_GO_WAIT, /* acceptor: replied, waiting for the opener's go */
	VS_READY,
	VS_CLOSED
};

enum vb_ctx { VB_CTX_RX = 1, VB_CTX_TX, VB_CTX_WR };

static inline uint64_t vb_wrid(enum vb_ctx k, int idx)
{
	return (uint64_t)k << 32 | (uint32_t)idx;
}

struct vb_tx {
	bool busy;
	size_t len;
	size_t core_len;
	uint8_t *buf;
};

enum vb_wr_state { VWR_FREE = 0, VWR_WAIT, VWR_POSTED };

struct vb_wr {
	uint8_t state;
	struct rh_hdr h;
	const char *payload;
	uint64_t post_ns; /* rh_now_ns() at ibv_post_send, for the verbs_wc probe */
};

struct vb_dev {
	atomic_bool ok; /* set (release) once verbs_dev_open() opened everything below */
	char name[64];
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint8_t port;
	int gid_index;
	union ibv_gid gid;
	enum ibv_mtu mtu;
	int lfd; /* the lane listener (TCP, the hellos) */
	struct ibv_comp_channel *ch; /* completion events of every CQ of the NIC (NULL: polled) */
	pthread_mutex_t mr_mu; /* the cache: the I/O thread and forget() */
	struct verbs_mr_cache mrc;
};

/* lane->tp */
struct vb_lane {
	struct rh_lane_streams st; /* one stream: struct vb_ep * */
	int npending;
	bool adv_given;
	uint32_t max_adv_epoch;
	uint64_t stall_mark, stall_since_ms;
	struct ofi_adv_table adv; /* sender: adverts received */
	uint16_t adv_id[RH_RING][RH_MAX_RECVS]; /* sender: their advert ids + 1 (0: none) */
	struct ofi_rrec_table rrec; /* receiver: adverts given */
	uint16_t rrec_id[RH_RING][RH_MAX_RECVS]; /* receiver: their advert ids + 1 (0: none) */
	/* receiver: the ids of the adverts given (proto.h); allocated with the first advert (a
	 * sending lane needs none), freed with the lane */
	struct verbs_adv_ids *ids;
};

struct vb_ep {
	enum vb_kind kind;
	enum vb_state st;
	int nic;
	struct vb_dev *d;
	int fd; /* the handshake's TCP connection (-1 once done) */
	uint8_t *hin; /* handshake bytes received */
	size_t hin_got;
	uint8_t *hout; /* handshake bytes to send */
	size_t hout_len, hout_off;
	struct ibv_cq *cq;
	bool armed; /* cq asked for its next completion event (not delivered yet) */
	struct ibv_qp *qp;
	struct verbs_qp_params qpp;
	uint32_t psn;
	struct ibv_mr *arena_mr;
	uint8_t *arena;
	struct vb_tx tx[VB_NTX];
	struct vb_wr wr[VB_NWR];
	int ntx_busy, nwr_used;
	struct rh_lane *lane;
	struct rh_conn *conn; /* reference held while set */
	bool io_held;
	uint32_t ip;
	uint16_t port;
	uint64_t cookie;
	uint64_t deadline_ms;
	uint64_t t_fenced_ms;
	atomic_bool fenced;
	bool failed;
	bool probe_reported;
	uint32_t mark_sent, mark_seen;
	atomic_uint_fast64_t progress;
	atomic_int outstanding;
	uint64_t last_rx_ms;
	struct vb_ep *next;
};

/* dev.c */
extern struct vb_dev verbs_devs[RH_MAX_NICS];
int verbs_dev_open(int nic);
void verbs_dev_close(int nic);
int verbs_dev_mr(struct vb_dev *d, const void *addr, size_t len, uint32_t *lkey, uint32_t *rkey);
void verbs_forget(const void *addr, size_t size);

/* ep.c */
struct vb_ep *verbs_ep_new(enum vb_kind kind, int nic);
void verbs_ep_push(struct vb_ep *e);
int verbs_ep_qp(struct vb_ep *e); /* CQ, QP (INIT), arena, receives posted */
void verbs_ep_start(struct vb_ep *e);
/* RTR/RTS towards the queue pair address in the peer's authenticated hello, refused (-EPROTO,
 * -EADDRNOTAVAIL, the queue pair left in INIT) unless it is the peer NIC's at peer_ip. */
int verbs_ep_connect_peer(struct vb_ep *e, const struct rh_hello *peer, uint32_t peer_ip);
void verbs_ep_accept(int nic, int fd);
void verbs_ep_hs_io(struct vb_ep *e); /* the handshake socket is ready */
void verbs_ep_close(struct vb_ep *e);
void verbs_ep_free(struct vb_ep *e);
void verbs_ep_fail(struct vb_ep *e, int err, const char *why);
void verbs_ep_touch(struct vb_ep *e, uint64_t bytes);
int verbs_post_rx(struct vb_ep *e, int i);
int verbs_send_msg(struct vb_ep *e, enum ofi_mkind kind, const void *body, size_t len);
int verbs_tx_free_slot(struct vb_ep *e);
int verbs_tx_post(struct vb_ep *e, int i, size_t len);
uint8_t *verbs_hello_msg(const struct rh_hello *hello, uint8_t type, uint64_t conn_id,
			 uint32_t epoch, size_t *len);

/* fence.c */
bool verbs_answer_adv(struct vb_ep *e, struct ofi_rrec *r, int slot, uint64_t now);
void verbs_on_adv(struct vb_ep *e, const uint8_t *b, size_t len);
void verbs_on_adv_req(struct vb_ep *e, const uint8_t *b, size_t len);
void verbs_on_data0(struct vb_ep *e, const uint8_t *b, size_t len);
void verbs_on_write(struct vb_ep *e, uint32_t imm);
void verbs_prefetch_adverts(struct vb_ep *e, struct vb_lane *vl);
int verbs_pump_writes(struct vb_ep *e, struct vb_lane *vl, uint32_t m);
int verbs_send_epoch(struct vb_ep *e, uint32_t m);

/* io.c */
extern pthread_t verbs_io_thread;
extern atomic_bool verbs_io_stop;
extern int verbs_epfd, verbs_evfd;
extern atomic_bool verbs_kicked;
extern pthread_mutex_t verbs_pend_mu;
extern struct vb_ep *verbs_pending;
extern struct vb_ep *verbs_eps;
void verbs_io_kick(void);
void *verbs_io_main(void *arg);
/* Watch fd for input (ptr: an endpoint, edge-triggered, input and output; NULL: a per-NIC
 * descriptor named by tag, level-triggered input). */
void verbs_io_watch(int fd, void *ptr, uint64_t tag);

/* epoll tags for the per-NIC descriptors (data.u64 below VB_TAG_MAX; endpoints by pointer) */
#define VB_TAG_KICK 0
#define VB_TAG_LISTEN(nic) (1 + 3 * (uint64_t)(nic))
#define VB_TAG_ASYNC(nic) (2 + 3 * (uint64_t)(nic))
#define VB_TAG_CHAN(nic) (3 + 3 * (uint64_t)(nic))
#define VB_TAG_MAX (1 + 3 * RH_MAX_NICS)

#endif
