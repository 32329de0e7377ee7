/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libfabric lanes: each lane is a control endpoint and 1..OFI_MAX_DATA data endpoints (FI_EP_MSG
 * with FI_RMA) between the two NICs' provider domains (one domain per NIC, matched by the NIC's
 * IPv4 address). The same
 * code runs over the tcp provider (CI) and RDMA providers offering FI_EP_MSG + FI_RMA (verbs).
 *
 * Messages (fi_send into pre-posted bounce buffers): the core's control frames (CTS, ACK,
 * RESUME, FAILREQ, BYE), the handshake (HELLO/HELLO_ACK, as on TCP), and the lane's own
 * ADV_REQ/ADV/EPOCH/DATA0 (proto.h). DATA moves one-sided: the sender's transport asks the
 * receiver's transport for an advert of (seq, slot) on the lane that carries the chunk
 * (ADV_REQ); the receiver registers the posted buffer in that lane's domain (lazily, through a
 * per-domain registration cache, so a buffer is registered once per domain and on a backup
 * NIC only when a lane there carries it) and answers with (address, key, size); the sender
 * then writes each chunk with fi_writedata, the 64-bit remote CQ data naming (seq, slot,
 * chunk, epoch). The receiver's CQ reports the completion; the transport rebuilds the frame
 * header and hands it to the core (rh_core_rx_data must return exactly the advertised
 * buffer + offset: the data is already in place, nothing is copied).
 *
 * The files of this directory, one per phase:
 *   shim.c      libfabric loaded at run time (dlopen), called through ofi_lf_*() wrappers
 *   domain.c    one provider domain per NIC, its passive endpoint, the registration cache
 *   endpoint.c  endpoints: create, connect, send slots, handshake, close
 *   connect.c   the connector threads (set-up and connect of the endpoints this side opens)
 *   closer.c    the closer threads (fi_close of closed endpoints' provider objects)
 *   fence.c     adverts and one-sided writes, with the four rules of the fence (THE FENCE)
 *   io.c        the I/O thread, message dispatch, the pump, completion and event queues
 *   ops.c       the lane_ops table (ofi_lane_ops)
 *   proto.c     the pure bookkeeping they share (unit-tested): immediates, messages, tables
 *
 * Threading: one I/O thread owns every endpoint, CQ and EQ (it is the only caller of
 * fi_* on them, except a connector thread before it hands a new endpoint over and a closer
 * thread after the I/O thread closed one: the provider calls that can block on a dead peer);
 * lane_ops callbacks (conn lock held) only set flags and wake it. Progress is
 * the provider's (FI_PROGRESS_AUTO) or driven by this thread's CQ/EQ reads (manual).
 *
 * Memory: host memory only (NCCL_PTR_HOST). A provider reporting FI_HMEM with CUDA would let
 * the same registration path take device buffers (FI_MR_HMEM, fi_mr_regattr with iface CUDA
 * or a dmabuf fd); that is not built here (no such provider to test against).
 */
#ifndef RH_OFI_H
#define RH_OFI_H

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "../../core/sched.h"
#include "../../log.h"
#include "../../param.h"
#include "../lanes.h"
#include "../tcpstate.h"
#include "proto.h"

/* shim.c: the five library symbols (every other fi_* call is an inline wrapper around the
 * objects' operation tables). ofi_lf_load() is false when libfabric.so.1 is missing. */
bool ofi_lf_load(void); /* counted: each true return needs its ofi_lf_unload() */
void ofi_lf_unload(void);
int ofi_lf_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
		   const struct fi_info *hints, struct fi_info **info);
void ofi_lf_freeinfo(struct fi_info *info);
struct fi_info *ofi_lf_dupinfo(const struct fi_info *info);
int ofi_lf_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);
const char *ofi_lf_strerror(int errnum);

#define OFI_API FI_VERSION(1, 10)
#define OFI_MAX_DATA 4 /* data endpoints per lane */
#define OFI_MAX_STREAMS (OFI_MAX_DATA + 1) /* and the control endpoint (stream 0) */
#define OFI_NRX 16 /* bounce receive buffers per endpoint (16 KiB each) */
#define OFI_NTX 12 /* messages in flight per endpoint */
/* Chunks owned per endpoint (waiting for an advert or being written). Shallow on purpose: after a
 * resume the fence marker queues behind them (rule 2), so this bounds how long a replay waits
 * for the old writes to drain; 4 endpoints x 3 chunks keep a lane busy on these links (with
 * 128 KiB chunks as with 512 KiB: 1.001x at 4 x 200 Mbit/s, BENCHMARKS). */
#define OFI_NWR 3
#define OFI_PEEK 16 /* queued messages whose adverts are asked for ahead of their chunks */
#define OFI_HELLO_MAX 4096
#define OFI_ACCEPT_MS 5000
/* An advert request unanswered for this many completion timeouts fails the lane: the
 * receiver's gate holds requests at most about one timeout (then it fails the blocker). */
#define OFI_ADV_WAIT_TIMEOUTS 3

/*
 * Ownership (docs/architecture.md "Object lifetimes"). A struct ofi_ep is made by ofi_ep_new:
 * an opener's or a probe's by ofi_open/ofi_probe (connection lock held), queued to a connector
 * thread (connect.c, under ofi_pend_mu), then handed to ofi_pending; an accepted one by the
 * I/O thread. From ofi_pending on it is the I/O thread's alone (ofi_eps). Closing: the I/O
 * thread marks it ES_CLOSED and hands its provider objects (not the endpoint) to a closer in
 * a struct close_req (closer.c, under its mu); the closer reads the endpoint only for a log
 * line and sets released; the I/O thread then finishes the close (ofi_ep_closed: send-slot
 * accounting, the io reference, the probe's report, the detach from the lane under the
 * connection lock, the connection reference) and frees it. An endpoint whose closer was
 * abandoned at the stop is leaked with its connection reference, never freed under it.
 * e->lane is used only while e is attached to lane->tp (struct ofi_lane, freed by
 * lane_release with the last endpoint); e->conn holds a reference while set. The core's
 * locked callbacks read endpoints through the lane's table under the connection lock.
 * Registration cache entries (struct ofi_dom rc, under rc_mu): made by the I/O thread
 * (ofi_mr_get) for a receive's page range, dropped by ofi_forget (the host's deregMr thread,
 * only pages no live handle covers: core/plugin.c) or ofi_dom_close at the stop. Adverts and
 * writes point into user memory only while the core's io guard holds.
 */
enum ep_kind {
	EK_LANE, /* a stream of a lane, opened here */
	EK_ACCEPTED, /* accepted, waiting for the hello that says what it is */
	EK_LANE_IN, /* a stream of a lane, accepted */
	EK_PROBE_OUT,
	EK_PROBE_REPLY, /* answering a probe; closed once the answer left */
};

enum ep_state { ES_NEW, ES_CONNECTING, ES_HELLO_WAIT, ES_HELLO_IN, ES_READY, ES_CLOSED };

enum ctx_kind { CTX_RX = 1, CTX_TX, CTX_WR };

struct ofi_ep;

struct ofi_ctx {
	uint8_t kind;
	uint16_t idx;
	struct ofi_ep *e;
};

struct ofi_tx {
	struct ofi_ctx ctx;
	bool busy; /* posted, or queued behind a full provider queue */
	size_t len;
	size_t core_len; /* bytes of a core control batch (rh_core_ctrl_written) */
	uint8_t *buf;
};

enum wr_state { WR_FREE = 0, WR_WAIT, WR_POSTED };

struct ofi_wr {
	struct ofi_ctx ctx;
	uint8_t state;
	struct rh_hdr h;
	const char *payload;
};

struct ofi_rx {
	struct ofi_ctx ctx;
	uint8_t *buf;
};

struct ofi_dom {
	/* set (release) once ofi_listen() has opened everything below: the I/O thread, which
	 * runs from ofi_start() on, serves the domain only from then */
	atomic_bool served;
	bool ok;
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_pep *pep;
	struct fid_eq *peq;
	int peq_fd;
	uint64_t mr_mode;
	bool rx_cq_data; /* writes with CQ data consume a posted receive (FI_RX_CQ_DATA) */
	const struct ofi_imm_layout *imm; /* the write immediate's layout (cq_data_size) */
	pthread_mutex_t rc_mu;
	struct ofi_rcache rc;
	uint64_t next_key; /* atomic: ofi_dom_key() (the I/O and connector threads) */
};

/* lane->tp: the core attaches and detaches endpoints through its head (lane_ops.h). */
struct ofi_lane {
	struct rh_lane_streams st; /* struct ofi_ep *, read through ol_ep() */
	int npending; /* receiver: adverts waiting for the gate */
	/* receiver: an advert is good for a write on any endpoint of the lane, so whether the
	 * lane advertised before a resume decides which endpoints must pass their marker */
	bool adv_given;
	uint32_t max_adv_epoch; /* newest epoch advertised on this lane */
	/* ofi_stalled() (connection lock): [0] the control endpoint, [1] the data endpoints */
	uint64_t stall_mark[2], stall_since_ms[2];
	uint32_t ep_mark; /* sender: the resume epoch every endpoint must mark before requests */
	struct ofi_adv_table adv; /* sender: adverts received */
	struct ofi_rrec_table rrec; /* receiver: adverts given */
};

struct ofi_ep {
	enum ep_kind kind;
	enum ep_state st;
	int nic;
	struct ofi_dom *d;
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_eq *eq;
	struct fid_mr *arena_mr;
	void *arena_desc;
	uint8_t *arena;
	struct fi_info *cinfo; /* EK_ACCEPTED: the connection request */
	struct rh_lane *lane;
	struct rh_conn *conn; /* reference held while set */
	int idx;
	bool io_held;
	uint32_t ip;
	uint16_t port;
	uint64_t cookie;
	uint64_t deadline_ms;
	uint64_t t_fenced_ms;
	atomic_bool fenced;
	/* closed (ES_CLOSED) with its provider objects at a closer (closer.c): the I/O thread
	 * finishes the close (ofi_ep_closed) once released is set, and frees it after */
	bool closing;
	atomic_bool released;
	bool was_ready; /* reached ES_READY: the peer may have written through it */
	int wait_fd[2]; /* the CQ's and the EQ's wait fds in ofi_epfd, or -1 */
	bool failed;
	bool probe_reported;
	int connect_rc; /* opener: what ofi_ep_connect returned (connector thread) */
	uint8_t *hello; /* opener: the hello message to send once connected */
	size_t hello_len;
	struct ofi_rx rx[OFI_NRX];
	struct ofi_tx tx[OFI_NTX];
	struct ofi_wr wr[OFI_NWR];
	int ntx_busy;
	int txq[OFI_NTX]; /* slots not yet accepted by the provider (-FI_EAGAIN), in order */
	int txq_head, txq_n;
	int nwr_used;
	uint32_t mark_sent; /* sender: last EPOCH marker sent */
	uint32_t mark_seen; /* receiver: last EPOCH marker received */
	/* read by the core under the connection lock */
	atomic_uint_fast64_t progress;
	atomic_int outstanding;
	uint16_t lport, rport;
	uint32_t lip, rip; /* network order; with lport/rport the provider's socket, if any */
	uint64_t last_rx_ms; /* I/O thread: last message or write received from the peer */
	struct ofi_ep *next;
};

_Static_assert(OFI_MAX_STREAMS <= RH_LANE_MAX_STREAMS, "stream table");

static inline struct ofi_ep *ol_ep(const struct ofi_lane *ol, int i)
{
	return ol->st.s[i];
}

/* libfabric returns 0 or -FI_Exxx (== -Exxx for the errno range) */
static inline int fi_err(ssize_t rc)
{
	return rc < 0 ? (int)rc : (rc > 0 ? -EIO : 0);
}

/* domain.c */
extern struct ofi_dom ofi_doms[RH_MAX_NICS];
int ofi_dom_open(int nic);
void ofi_dom_close(int nic);
int ofi_mr_get(struct ofi_dom *d, const void *addr, size_t len, uint64_t *raddr, uint64_t *key,
	       void **desc);
void ofi_forget(const void *addr, size_t size);

/* endpoint.c */
void ofi_ep_close(struct ofi_ep *e);
void ofi_ep_closed(struct ofi_ep *e);
bool ofi_ep_ctrl_only(const struct ofi_ep *e);
void ofi_ep_fail(struct ofi_ep *e, int err, const char *why);
void ofi_ep_free(struct ofi_ep *e);
struct ofi_ep *ofi_ep_new(enum ep_kind kind, int nic);
int ofi_ep_connect(struct ofi_ep *e);
int ofi_ep_setup(struct ofi_ep *e, struct fi_info *info);
void ofi_ep_start(struct ofi_ep *e);
void ofi_ep_touch(struct ofi_ep *e, uint64_t bytes);
void ofi_on_hello(struct ofi_ep *e, const uint8_t *b, size_t len);
void ofi_on_hello_ack(struct ofi_ep *e, const uint8_t *b, size_t len);
int ofi_post_rx(struct ofi_ep *e, int i);
int ofi_send_msg(struct ofi_ep *e, enum ofi_mkind kind, const void *body, size_t len);
int ofi_tx_flush(struct ofi_ep *e);
int ofi_tx_free_slot(struct ofi_ep *e);
int ofi_tx_post(struct ofi_ep *e, int i, size_t len);

/* fence.c */
bool ofi_answer_adv(struct ofi_ep *e, struct ofi_rrec *r, int slot, uint64_t now);
void ofi_on_adv(struct ofi_ep *e, const uint8_t *b, size_t len);
void ofi_on_adv_req(struct ofi_ep *e, const uint8_t *b, size_t len);
void ofi_on_data0(struct ofi_ep *e, const uint8_t *b, size_t len);
void ofi_on_write(struct ofi_ep *e, uint64_t imm);
void ofi_prefetch_adverts(struct ofi_ep *e, struct ofi_lane *ol);
int ofi_pump_writes(struct ofi_ep *e, struct ofi_lane *ol, uint32_t m);
int ofi_send_epoch(struct ofi_ep *e, uint32_t m);

/* io.c: the I/O thread's state (ofi_pending under ofi_pend_mu, the rest its own) */
extern pthread_t ofi_io_thread;
extern atomic_bool ofi_io_stop; /* ofi_io_main returns */
extern int ofi_epfd, ofi_evfd;
extern atomic_bool ofi_kicked;
extern pthread_mutex_t ofi_pend_mu;
extern struct ofi_ep *ofi_pending; /* created by other threads */
extern struct ofi_ep *ofi_eps; /* owned by the I/O thread */
extern atomic_bool ofi_wait_fds; /* the provider gives FI_WAIT_FD wait objects */
void ofi_io_kick(void);
void *ofi_io_main(void *arg);
/* A step of the I/O thread that held it longer than OFI_SLOW_US is logged (WARN, with what it
 * was): while it runs no endpoint of the process is progressed. */
#define OFI_SLOW_US 100000
uint64_t ofi_us(void);
void ofi_slow_check(uint64_t t0, const char *what, const struct ofi_ep *e);

/* connect.c: the connector threads (set-up and connect of the endpoints this side opens) */
#define OFI_CONNECTORS 4
void ofi_ep_push(struct ofi_ep *e); /* any thread: connect it, then hand it to the I/O thread */
int ofi_connectors_start(void);
void ofi_connectors_stop(void);

/* closer.c: the closer threads (fi_close of closed endpoints' provider objects, off the I/O
 * thread: the verbs provider's close blocks while rdma_cm waits on a dead peer) */
#define OFI_CLOSERS 4
#define OFI_CLOSE_QUEUE 256 /* endpoints waiting for a closer; beyond, closed inline */
#define OFI_CLOSER_JOIN_MS 30000 /* the stop waits this long for closes in progress */
bool ofi_closer_push(struct ofi_ep *e);
void ofi_ep_release_now(struct ofi_ep *e);
int ofi_closers_start(void);
bool ofi_closers_stop(void);

/* A registration key of the domain (any thread). */
static inline uint64_t ofi_dom_key(struct ofi_dom *d)
{
	return __atomic_fetch_add(&d->next_key, 1, __ATOMIC_RELAXED);
}

#endif
