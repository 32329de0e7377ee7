/* SPDX-License-Identifier: Apache-2.0 */
/*
 * struct lane_ops: the transport interface under the railhop core.
 *
 * A *lane* is one transport channel between a (local NIC, remote NIC) pair that belongs to one
 * railhop connection (one NCCL send/recv comm pair). A connection carries its traffic over one
 * or more lanes (the primary lane, plus backup lanes after a failover). A lane may consist of
 * several streams (TCP: several sockets) for bandwidth; the core does not see streams.
 *
 * Frames (core/wire.h) are the unit on every lane: a DATA frame carries one chunk of a message
 * placed at an offset of the receiver's posted buffer; control frames (CTS, ACK, RESUME,
 * FAILREQ, BYE) carry the protocol. Byte-stream transports (TCP) send the 48-byte header and
 * then the payload, and the receiving side asks the core where to place it (rh_core_rx_data).
 * One-sided transports (libfabric FI_RMA, lanes/ofi/) fit the same calls: next_tx() hands out
 * a chunk as for TCP; the sender's transport gets the receiver's buffer address and key from
 * the receiver's transport (an advert per lane, asked for ahead of time with rh_core_tx_peek(),
 * answered from rh_core_rx_buffer()), issues a write-with-immediate (immediate = seq/slot/
 * chunk/epoch) and the receiver's transport reports the completion from its CQ through
 * rh_core_rx_data()/rh_core_rx_data_done(), with no copy. Control frames go as small sends.
 *
 * Threading: transports run their own I/O threads. Callbacks into the core (rh_core_*) are made
 * WITHOUT the connection lock held; lane_ops callbacks marked "locked" are called by the core
 * with the connection lock held and must not block or call back into the core.
 */
#ifndef RH_CORE_LANE_OPS_H
#define RH_CORE_LANE_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../nic.h"
#include "lane_state.h"
#include "wire.h"

struct rh_conn;
struct rh_fmac;

#define RH_MAX_LANES 32 /* lanes per connection, over its lifetime */

/*
 * Lifetime of a lane: made by rh_conn_add_lane (connection lock held: a connect, a move, a
 * standby, or rh_core_hello for a lane the peer opens) in conn->lanes[], and freed only with
 * its connection (the last reference). A slot is reused, the struct wiped, once the lane is
 * DEAD, its transport released it (tp NULL: every stream detached) and no accepted stream is
 * between rh_core_hello and rh_core_stream_attach (attaching). So a transport object may keep
 * a struct rh_lane * exactly while it is attached to lane->tp (or, on the accepting side,
 * from rh_core_hello to its attach), together with its connection reference. Fields are
 * written under the connection lock; lane->tp belongs to the transport (see rh_lane_streams).
 * A lane refers to no host object.
 */
struct rh_lane {
	struct rh_conn *conn;
	const struct lane_ops *ops;
	uint32_t id; /* unique in the connection: even = opened by the sender side */
	int lnic, rnic; /* local NIC index, index into the peer's NIC table */
	enum rh_lane_state state; /* see lane_state.h; written under the connection lock */
	bool primary; /* the connection's original (local, remote) pair */
	bool opener; /* this side opened it */
	/* Opened as a warm standby (the hello's RH_HELLO_F_STANDBY): STANDBY once handshaken
	 * until promoted; stays set after the promotion (the role it was opened in). */
	bool standby;
	/* A move chose this lane (promoted or opened it): the first frame it hands out is the
	 * move's first post (rh_marks_first_post); t_decide_ns: when the move chose it. */
	bool await_post;
	uint64_t t_decide_ns;
	/* A standby a move promoted skipped the handshake that proves the peer reachable: the
	 * peer must answer on it (any frame the core reads from it) or answer the move (its
	 * RESUME) by this time, the handshake deadline it skipped, or the lane has failed
	 * (rh_standby_unanswered). 0: answered, or never promoted by a move. Apart from the
	 * OPENING deadlines below (lane_tick_opening): the promoted lane is ACTIVE and carries at
	 * once, and its answer is any frame read from it or the move's RESUME, not a stream's
	 * handshake; lane_tick_carrying checks it. */
	uint64_t t_answer_by_ms;
	int nstreams, nready; /* streams wanted / handshaken */
	int weight; /* spreading weight from the ranking */
	uint32_t share; /* the agent's plan share x 10000 (0: not from a plan, not gated) */
	uint64_t share_bytes; /* DATA bytes taken while share > 0 (the share gate's count) */
	bool share_wait; /* refused by the share gate: kick it when another lane takes a chunk */
	uint32_t retire_gen; /* DRAINING: carries only messages of older generations */
	uint64_t t_deadline_ms; /* OPENING: handshake deadline */
	/* OPENING: the deadline once the peer has answered (0: t_deadline_ms). A move found
	 * late gives an unanswered handshake the probe timeout only; one the peer answered is
	 * a healthy pair that is slow to set up, and keeps the usual handshake deadline. */
	uint64_t t_answered_deadline_ms;
	bool answered; /* OPENING: the peer answered one of its streams (rh_core_stream_answered) */
	uint64_t t_suspect_ms; /* SUSPECT: when the confirming probe started */
	uint64_t probe_cookie; /* SUSPECT: the probe's cookie */
	uint64_t progress_mark; /* ops->progress() at the last change seen by the ticker */
	uint64_t t_progress_ms; /* when the ticker last saw ops->progress() move */
	uint64_t suspect_mark; /* SUSPECT: ops->progress() when the probe started */
	bool bye_sent; /* DRAINING: retirement announced to the peer */
	int neof; /* streams closed in order by the peer */
	/* Accepting side: rh_core_hello() returned the lane to a transport thread that has not
	 * called rh_core_stream_attach() yet (it does next, the connection lock dropped in
	 * between). While non-zero the slot is not reused even if the lane dies meanwhile:
	 * reuse would hand that thread's stale pointer a different lane. */
	int attaching;
	void *tp; /* transport state; NULL once the transport released the lane */
};

/* One frame to transmit, filled by rh_core_next_tx(). */
struct rh_tx {
	uint8_t hdr[RH_HDR_LEN];
	const void *payload; /* DATA: user memory (valid until the message is acknowledged) */
	size_t len; /* DATA payload bytes */
	size_t ctrl_len; /* control bytes copied into the caller's buffer (headers included) */
	bool is_data;
};

struct lane_ops {
	const char *name;
	/* Start the process-wide transport machinery (I/O threads). May run again after stop. */
	int (*start)(int nthreads);
	/* Stop it (plugin shutdown, also after a failed start or listen): join every thread the
	 * transport or its library started, close every descriptor, release every stream (their
	 * connection references go, and no callback into the core follows once it returns).
	 * Called with every connection closed and its lanes fenced, and no caller left in the
	 * other callbacks. */
	void (*stop)(void);
	/* Open the lane listener of local NIC nic (fills rh_g.nics[nic].port). Every NIC keeps one
	 * for the lanes of all connections and for probes. */
	int (*listen)(int nic);
	/* Start opening lane->nstreams streams from local NIC lane->lnic to ip:port and send the
	 * handshake hello (stream index filled in per stream). Non-blocking. The outcome arrives
	 * as rh_core_stream_ready() per stream or rh_core_lane_error(). Locked. */
	int (*open)(struct rh_lane *lane, const struct rh_hello *hello, uint64_t conn_id,
		    uint32_t epoch, uint32_t ip, uint16_t port);
	/* There is new work (data or control) for the lane: wake its I/O. Never blocks. Locked. */
	void (*kick)(struct rh_lane *lane);
	/* Fence the lane: stop all I/O on it, never block (a dead peer must not stall the caller).
	 * After fence returns, no user memory is touched for this lane once the core's
	 * active_io count drains; resources are released asynchronously and the transport sets
	 * lane->tp to NULL (under the connection lock) when done. Locked. */
	void (*fence)(struct rh_lane *lane);
	/* True when the lane has had data outstanding with no transport-level progress (TCP:
	 * no new acknowledged bytes while bytes are unacknowledged) for timeout_ms. Locked. */
	bool (*stalled)(struct rh_lane *lane, uint64_t now_ms, int timeout_ms);
	/* Optional. The transport's own verdict on a lane the core suspects and has seen no
	 * progress on for quiet_ms: true when the path is lost by the transport's account (TCP:
	 * a stream holding unacknowledged bytes is in RTO loss recovery and quiet_ms covers two
	 * of its smoothed RTTs, at least 20 ms: the retransmission after the timeout went
	 * unanswered, which a live but congested path answers within about one RTT). Locked. */
	bool (*lost)(struct rh_lane *lane, uint64_t quiet_ms);
	/* Bytes the transport has moved on the lane in either direction (TCP: acknowledged plus
	 * received, over every stream): a monotonic counter; "no progress" means it stands
	 * still. Locked. */
	uint64_t (*progress)(struct rh_lane *lane);
	/* Local and remote ports (host order) of the lane's streams, for the agent's per-socket
	 * probes; returns how many (<= max), 0 when the transport has none. Locked. */
	int (*ports)(struct rh_lane *lane, uint16_t *lports, uint16_t *rports, int max);
	/* Probe the (local NIC lnic, ip:port) pair: a handshake round trip with deadline
	 * timeout_ms; the result arrives as rh_core_probe_done(conn, cookie, ok). Locked. */
	int (*probe)(struct rh_conn *conn, int lnic, uint32_t ip, uint16_t port, uint64_t cookie,
		     int timeout_ms);
	/* Optional (transports that register memory): the application deregistered
	 * [addr, addr + size); drop cached registrations overlapping it. Any thread, no lock. */
	void (*forget)(const void *addr, size_t size);
};

/* --- Core entry points for transports (called without the connection lock) --- */

/* A handshake arrived on a listener. Returns the lane (with a connection reference taken) the
 * stream joins, or NULL to refuse; fills *reply with this side's hello. The caller passes a
 * lane it got to rh_core_stream_attach() next, whatever else happens (that ends the hold on
 * the lane's slot, rh_lane.attaching). */
struct rh_lane *rh_core_hello(const struct rh_hdr *hdr, const struct rh_hello *hello,
			      struct rh_hello *reply);
/* The hello of one stream of a lane the transport opens, after it set h->stream and
 * h->nstreams (the count it really opens): signed again, so that both are under the MAC.
 * 0 or -errno. Called from ops->open (the connection lock held). */
int rh_core_sign_stream(struct rh_lane *lane, struct rh_hello *h);
/* The acceptor's reply (filled by rh_core_hello() for the hello `in` of lane l) signed again
 * after the transport put its bytes in reply->tp (its queue pair address, say), so that they
 * are under the MAC the opener checks. 0 or -errno. Any thread, no lock. */
int rh_core_sign_reply(struct rh_lane *l, const struct rh_hello *in, struct rh_hello *reply);
/* The peer answered a stream of a lane this side opens (ofi: the connection request accepted),
 * before its hello's answer: the pair is alive, only slow to set up. The handshake is then
 * given up only at its full deadline (t_answered_deadline_ms). A stream handshaken
 * (rh_core_stream_ready) counts as an answer too. */
void rh_core_stream_answered(struct rh_lane *lane);
/* Health probes, bound to their connection's key (issue 29, 6: anyone answering for the
 * peer's address made a dead pair look healthy): the prober's hello for probe `cookie` of
 * connection c (fills *h and *conn_id; Locked, from ops->probe); the listener's answer to a
 * probe hello (false: refuse it; *reply filled when true); the prober's check of the reply
 * (its result is what rh_core_probe_done gets). */
int rh_core_probe_hello(struct rh_conn *c, uint64_t cookie, struct rh_hello *h, uint64_t *conn_id);
bool rh_core_probe_answer(const struct rh_hdr *hdr, const struct rh_hello *in,
			  struct rh_hello *reply);
bool rh_core_probe_check(struct rh_conn *c, uint64_t cookie, const struct rh_hello *reply);
/* The frame MACs of stream `stream` of the lane (byte-stream transports, after its hello
 * exchange: before the stream's first frame either way): f keyed from the connection secret
 * and the stream nonces of the opener's hello and of the acceptor's reply (auth.h,
 * rh_fmac_init). 0 or -errno; release with rh_fmac_free(). */
int rh_core_frame_key(struct rh_lane *lane, int stream, const uint8_t *nonce_open,
		      const uint8_t *nonce_acc, struct rh_fmac *f);
/* A stream of the lane finished its handshake; reply is the peer's hello (opener side) or
 * NULL (accepting side). */
void rh_core_stream_ready(struct rh_lane *lane, const struct rh_hello *reply);
/* Next frame for stream `stream` of the lane. Control frames (stream 0 of the connection's
 * control lane only) are copied into ctrl (cap bytes). Returns 1 with *tx filled, 0 when there
 * is nothing to send. RH_STREAM_CTRL_ONLY: stream 0 of a transport that keeps it free of data
 * (control only, never a chunk). */
#define RH_STREAM_CTRL_ONLY (-1)
int rh_core_next_tx(struct rh_lane *lane, int stream, uint8_t *ctrl, size_t cap, struct rh_tx *tx);
/* A DATA header arrived: returns where to place the payload, or NULL to discard it.
 * *counted is set when the chunk counts towards completion (then rx_data_done must follow). */
void *rh_core_rx_data(struct rh_lane *lane, const struct rh_hdr *hdr, bool *counted);
void rh_core_rx_data_done(struct rh_lane *lane, const struct rh_hdr *hdr, bool counted, bool ok);
/* A control frame arrived. */
void rh_core_rx_ctrl(struct rh_lane *lane, const struct rh_hdr *hdr, const uint8_t *payload);
/* The transport failed on the lane (err: negative errno). */
void rh_core_lane_error(struct rh_lane *lane, int err);
/* The peer closed one stream of the lane in order (TCP FIN after all its frames were read).
 * When every stream has, the lane is closed by the peer: quiet if the peer said BYE, else a
 * failure. This keeps a peer's last frames on one stream from racing its close on another. */
void rh_core_stream_eof(struct rh_lane *lane);
/* A control batch returned by rh_core_next_tx() has left (or was lost with its stream). */
void rh_core_ctrl_written(struct rh_lane *lane, size_t len);
void rh_core_probe_done(struct rh_conn *conn, uint64_t cookie, bool ok);
/* One-sided transports: the posted buffer of receive (seq, slot) that a chunk of the given
 * epoch will be written to, for an advert, and the map of the chunks already placed in it
 * (placed[0..*nwords), bit i = chunk i; -E2BIG when it needs more than max_words). -ESTALE
 * when that epoch is older than the last resume (the sender replays at a newer one), -ENOENT
 * when the receive is not posted or that slot is already complete. */
int rh_core_rx_buffer(struct rh_lane *lane, uint64_t seq, int slot, uint32_t epoch, char **buf,
		      uint64_t *size, uint64_t *placed, uint32_t max_words, uint32_t *nwords);
/* One-sided transports: the messages queued for sending that the lane may carry, in order (at
 * most max), so the transport can ask for their adverts before their first chunk is due. */
struct rh_tx_peek {
	uint64_t seq;
	uint64_t size;
	uint32_t epoch; /* the epoch their next chunks will carry */
	int slot;
};
int rh_core_tx_peek(struct rh_lane *lane, struct rh_tx_peek *out, int max);
/* Guards around every transport access to user memory (see fence()). Returns false when the
 * connection is closing and the access must not start. */
bool rh_core_io_enter(struct rh_conn *conn);
void rh_core_io_exit(struct rh_conn *conn);

void rh_core_conn_get(struct rh_conn *conn);
void rh_core_conn_put(struct rh_conn *conn);

/* --- Core services for transports (no lock needed unless noted) --- */

/* Monotonic clock. */
uint64_t rh_now_ms(void);
uint64_t rh_now_ns(void);
/* Local NIC nic (0 <= nic < rh_core_nic_count()): name, address, properties; a transport fills
 * in the port of its lane listener (listen()) and properties only it knows. */
struct rh_nic *rh_core_nic(int nic);
int rh_core_nic_count(void);
/* What a transport reads about a connection: fixed at creation (id, direction, chunk size) or
 * atomic. rx_min_epoch (receiver) and resume_epoch (sender) are the epoch of the last resume
 * applied (acquire: what the resume wrote is visible). */
uint64_t rh_core_conn_id(const struct rh_conn *conn);
bool rh_core_conn_is_send(const struct rh_conn *conn);
uint64_t rh_core_conn_chunk(const struct rh_conn *conn);
bool rh_core_conn_closed(struct rh_conn *conn); /* the user closed it */
uint32_t rh_core_conn_epoch(struct rh_conn *conn);
uint32_t rh_core_conn_rx_min_epoch(struct rh_conn *conn);
uint32_t rh_core_conn_resume_epoch(struct rh_conn *conn);

/* --- Streams of a lane (the transport's lane state, lane->tp, starts with this head) --- */
/* The opening side builds lane->tp itself in open() (called locked); streams accepted for a lane
 * join it through rh_core_stream_attach(); every stream leaves through rh_core_stream_detach(). */

#define RH_LANE_MAX_STREAMS 16
struct rh_lane_streams {
	void *s[RH_LANE_MAX_STREAMS]; /* the transport's stream objects, by stream index */
	int live; /* streams attached; the lane state goes with the last */
};
/* Accepting side: attach stream object s as stream idx of lane, which rh_core_hello() returned
 * (with a connection reference, which s keeps). Under the connection lock: the lane must still
 * be OPENING, idx < max and that slot free; lane->tp (tp_size bytes, zeroed, starting with
 * struct rh_lane_streams) is allocated for the first stream; io: an io reference
 * (rh_core_io_enter) is taken for s as well. 0, or -EPROTO (not OPENING, bad or taken slot),
 * -ECONNABORTED (io refused: the connection is closing), -ENOMEM; on error the connection
 * reference is dropped and nothing is attached. */
int rh_core_stream_attach(struct rh_lane *lane, int idx, int max, void *s, size_t tp_size, bool io);
/* Detach stream object s (stream idx of lane; lane may be NULL: nothing to detach) and drop the
 * connection reference it holds. Under the connection lock: when s still holds its slot it is
 * cleared, and when it was the lane's last stream, release(lane->tp) runs (may be NULL), the
 * state is freed and lane->tp set to NULL. */
void rh_core_stream_detach(struct rh_conn *conn, struct rh_lane *lane, int idx, void *s,
			   void (*release)(void *tp));

/* --- Registration (the assembly point, api_nccl.c) --- */

/* The core never names a transport: the assembly point hands it a picker before the first
 * rh_init() (as the agent glue hands it struct rh_ctl_hooks). pick() runs at every start of
 * the plugin, after the parameters are loaded and before any lane exists, under the core's
 * lifecycle lock; it returns the transport to use, or NULL when the one asked for is not
 * available (having logged why). NULL pick (the default): init fails, "no transport
 * registered". */
typedef const struct lane_ops *(*rh_transport_pick_fn)(void);
void rh_core_set_transport(rh_transport_pick_fn pick);
/* Check ops as the Linux RDMA core checks a device at registration: a name and every
 * mandatory callback (start, listen, open, kick, fence, stalled, probe; stop, lost, progress,
 * ports and forget are optional) present. 0, or -EINVAL with one WARN naming the transport and
 * the callbacks it lacks (msg, when not NULL, receives the same text, cap bytes). */
int rh_core_check_ops(const struct lane_ops *ops, char *msg, size_t cap);
/* Check ops (rh_core_check_ops) and make it the transport of every lane opened from now on:
 * what start does with pick()'s answer, and what a unit test driving the core without the
 * plugin's lifecycle calls. Never while the plugin runs with another transport (-EBUSY). */
int rh_core_register_ops(const struct lane_ops *ops);

#endif
