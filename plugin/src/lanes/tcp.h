/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TCP lanes: each lane is 1..16 TCP streams between the two NICs' IPv4 addresses (bound to the
 * NIC address and SO_BINDTODEVICE), served by a pool of epoll I/O workers. Frames are written
 * with one sendmsg (header + payload from user memory); DATA payloads are received straight
 * into the posted buffer at the chunk's offset (no extra copy). Progress for stall detection is
 * the kernel's acknowledged byte count (TCP_INFO). After its hello exchange every stream's
 * frames carry tags (core/wire.h, core/auth.h struct rh_fmac): a frame whose tag does not
 * check fails the lane (one WARN) before anything of it is acted on; DATA payloads with
 * RAILHOP_CHECKSUM=1 carry a GMAC, checked before the chunk counts as placed.
 *
 * tcp.c: sockets, listeners, dialing, the lane_ops table (tcp_lane_ops); tcp_io.c: the epoll
 * workers (each stream's frame state machine, handshakes, reaping); tcp_guard.c: the listeners'
 * bounds (pending handshakes, descriptor reserve, accept backoff). This header is private to
 * the three.
 */
#ifndef RH_TCP_H
#define RH_TCP_H

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <linux/tcp.h> /* struct tcp_info with tcpi_bytes_acked */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../core/fmac.h"
#include "../log.h"
#include "../param.h"
#include "lanes.h"
#include "tcpstate.h"

#define TCP_MAX_STREAMS 16
#define TCP_RX_BUDGET (8u << 20)
#define TCP_SCRATCH (256u << 10)
#define TCP_CTRL_CAP (2 * (RH_HDR_LEN + RH_CTRL_MAX))
/* A control batch with a tag after every header (each frame is at least a header long). */
#define TCP_TXBUF_CAP (TCP_CTRL_CAP + (TCP_CTRL_CAP / RH_HDR_LEN + 1) * RH_TAG_LEN)
#define TCP_HDR_MAX (RH_HDR_LEN + 2 * RH_TAG_LEN) /* header, its tag, a payload tag */
#define TCP_HELLO_MAX 4096

/*
 * Bounds on the lane listeners: anyone who can reach a NIC can connect to them.
 *  - A connection accepted on a listener is a pending handshake until its hello has been
 *    handled; at most TCP_HS_MAX per listener and TCP_HS_MAX_SOURCE from one source address
 *    are pending: one more evicts the oldest handshake of the source that holds the most
 *    (tcp_pending_victim: the newcomer's own source when it is at its cap), so a flood cannot
 *    keep newer connections, a peer's lanes and probes among them, out, and a flood from
 *    several addresses evicts its own handshakes, never those of a source that holds fewer. The caps are wide because one connection opens STREAMS_PER_LANE (8) streams at
 *    once, and NCCL opens many connections to the same peer together.
 *  - The hello must arrive within TCP_HS_DEADLINE_MS of the accept.
 *  - Out of descriptors (EMFILE/ENFILE from accept4, or the probe reserve below cannot be
 *    refilled), the listener leaves its worker's poll set for TCP_ACCEPT_BACKOFF_MS instead of
 *    waking it again and again (it is level-triggered); waiting connections stay in the
 *    kernel's backlog meanwhile.
 *  - TCP_FD_RESERVE descriptors (on /dev/null) are kept for outgoing streams and probes: a
 *    socket() that fails with EMFILE/ENFILE gives one up and tries again, so the failure
 *    detection of live connections still gets descriptors while strangers hold the rest.
 */
#define TCP_HS_MAX 256
#define TCP_HS_MAX_SOURCE 128
#define TCP_HS_DEADLINE_MS 1000
#define TCP_ACCEPT_BACKOFF_MS 100
#define TCP_FD_RESERVE 16

/*
 * Ownership (docs/architecture.md "Object lifetimes"). A struct tcp_stream is made by
 * tcp_stream_new (open/probe: a core thread, connection lock held; an accepted one: its
 * worker), handed to its worker through w->pending (under w->mu) and from then on owned by
 * that worker thread, which alone reads, writes and frees it (stream_reap; tcp_stop reaps
 * what a joined worker still lists). While s->conn is set the stream holds a connection
 * reference; while a lane stream is attached (lane->tp, struct tcp_lane) it may use s->lane,
 * and the core's locked callbacks (kick, fence, stalled, lost, progress, ports) read it
 * through the lane's table under the connection lock. stream_reap reports what it owes the
 * core (control batch written, a counted chunk), detaches under the connection lock (from
 * then on no callback finds it) and only then closes the fd and frees it. Fence only sets
 * dead (atomic) and shuts the socket down: the worker reaps. A probe stream reports once
 * (rh_core_probe_done) before it goes. Nothing here points at a host object: DATA payloads
 * point into user memory only between rh_core_io_enter and rh_core_io_exit.
 */
enum tcp_kind {
	K_LISTENER, /* per-NIC lane listener */
	K_LANE, /* a stream of a lane (opened here or accepted) */
	K_ACCEPTED, /* accepted, waiting for the hello that says what it is */
	K_PROBE_OUT, /* outgoing probe */
	K_PROBE_REPLY, /* answering a probe; closed once the reply is written */
};

enum tcp_state { ST_CONNECTING, ST_HELLO_WAIT, ST_HELLO_IN, ST_READY };

struct tcp_worker;

struct tcp_stream {
	int fd;
	enum tcp_kind kind;
	enum tcp_state state;
	struct tcp_worker *w;
	struct rh_lane *lane;
	struct rh_conn *conn; /* reference held while set */
	int idx;
	int nic;
	int hs_nic; /* accepted on listener hs_nic - 1 (0: not accepted): see tcp_pending_del() */
	uint64_t deadline_ms;
	uint64_t cookie;
	atomic_bool dead; /* fenced: reap at the next scan */
	uint64_t drain_until_ms; /* graceful fence (closed conn): finish the control frame */
	bool failed;
	bool reap;
	bool in_list;
	bool rx_more; /* budget ran out: read again */
	/* frame MACs (after the hello exchange: fm_on) */
	struct rh_fmac fm;
	bool fm_on;
	bool pay_tx; /* our DATA frames carry a payload MAC (ours or the peer's hello asks) */
	uint8_t snonce[RH_NONCE_LEN]; /* opener: our hello's stream nonce */
	/* receive */
	uint8_t rxh[TCP_HDR_MAX];
	size_t rxh_got;
	size_t rxh_want; /* 0: the header and its tag; else the payload tag too */
	bool pay_mac; /* the DATA frame being received carries a payload tag */
	struct rh_hdr h;
	bool in_payload;
	char *dst;
	bool counted;
	size_t pay_got;
	uint8_t *rxbuf; /* control payloads */
	/* transmit */
	bool tx_active;
	bool tx_data;
	bool tx_core; /* the control batch came from rh_core_next_tx */
	bool eof;
	uint8_t txh[TCP_HDR_MAX];
	size_t txh_len; /* header bytes of the DATA frame (0: not sealed yet) */
	const char *txp;
	size_t txp_len;
	uint8_t *txbuf; /* control frames (tagged) / hello */
	size_t txbuf_len;
	uint8_t *ctlbuf; /* the core's control batch, before tagging */
	size_t ctl_len; /* its length (rh_core_ctrl_written) */
	size_t tx_off;
	/* stall detection (conn lock) */
	uint64_t last_acked;
	uint64_t stall_since_ms;
	struct tcp_stream *next;
};

/* lane->tp: the core attaches and detaches streams through its head (lane_ops.h). */
struct tcp_lane {
	struct rh_lane_streams st;
};
_Static_assert(TCP_MAX_STREAMS <= RH_LANE_MAX_STREAMS, "stream table");

static inline struct tcp_stream *tl_s(const struct tcp_lane *tl, int i)
{
	return tl->st.s[i];
}

struct tcp_worker {
	pthread_t th;
	bool started; /* th is joinable */
	int epfd;
	int evfd;
	atomic_bool kicked;
	atomic_bool stop; /* tcp_worker_main returns */
	pthread_mutex_t mu;
	struct tcp_stream *pending; /* added by other threads */
	struct tcp_stream *list; /* owned */
	uint8_t *scratch;
};

/* tcp.c */
struct tcp_stream *tcp_stream_new(int fd, enum tcp_kind kind);
int tcp_stream_add(struct tcp_stream *s);
void tcp_sock_tune(int fd);

/* tcp_io.c */
void tcp_worker_kick(struct tcp_worker *w);
void *tcp_worker_main(void *arg);
/* Release every stream a stopped worker still holds (its thread is joined). */
void tcp_worker_reap_all(struct tcp_worker *w);

/* tcp_guard.c: the listeners' bounds (see above) */
void tcp_guard_init(void);
void tcp_guard_fini(void);
int tcp_lane_socket(void); /* socket() for a lane or probe, from the reserve if need be */
bool tcp_fd_reserve_refill(void); /* false: at the descriptor limit */
void tcp_pending_add(int nic, struct tcp_stream *s, uint32_t src);
bool tcp_pending_del(struct tcp_stream *s); /* false: evicted meanwhile */
/* Pure: which of n pending handshakes (their source addresses, oldest first) a new one from
 * newcomer evicts, or -1 when there is room (TCP_HS_MAX, TCP_HS_MAX_SOURCE). */
int tcp_pending_victim(const uint32_t *src, int n, uint32_t newcomer);
void tcp_listener_backoff(struct tcp_stream *l, const char *why);
void tcp_listener_rearm(struct tcp_stream *l, uint64_t now);

#endif
