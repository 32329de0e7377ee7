/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Connection state shared by the core modules (plugin.c: setup; conn.c: data path;
 * failover.c: failure handling; health.c: NIC health and the ticker). Private to core/: the
 * lanes see a connection only through core/lane_ops.h. A connection is one NCCL send or recv
 * comm; its lanes carry
 * frames (core/wire.h); all fields below are protected by mu unless noted.
 */
#ifndef RH_CONN_H
#define RH_CONN_H

/*
 * Ownership (issue 37; docs/architecture.md "Object lifetimes" has the table of every object).
 * The host (NCCL) frees or closes its objects whenever its order says so: a listen comm right
 * after its accept returned, send/recv comms, requests once test() said done, memory handles.
 * No plugin object keeps a pointer to a host object past the call that handed it over.
 *
 * struct rh_listen: the listen comm itself. Created by rh_listen, freed by rh_close_listen
 *   (host thread). Linked in rh_g.listens and read only under rh_g.mu; connections and lanes
 *   name it by id (rh_conn.listen_id) and find it with rh_listen_find() under rh_g.mu.
 * struct rh_conn: a send or recv comm (the host's pointer is the connection). Counted (refs):
 *   the first reference is the registry's, which becomes the host's once connect/accept hands
 *   it out (a listener's ready queue holds it until then; close_conn drops it); a closing
 *   connection waiting for its BYE gets a registry reference again, dropped by the ticker.
 *   Every transport stream/endpoint/probe holds one while its conn pointer is set
 *   (rh_core_hello, open, probe; dropped by rh_core_stream_detach or the probe's end), and
 *   rh_registry_snapshot() lends one per listed connection to the ticker and health code. The
 *   last rh_core_conn_put() frees it with its lanes, control queue and receive bitmaps. Fields
 *   under mu (lock order: rh_g.mu, then mu); closed/refs/active_io atomic. After close
 *   (closed set, active_io drained) no thread touches user memory for it.
 * struct rh_sreq / rh_rreq: the host's requests, slots inside the connection (sreqs[],
 *   rreqs[]), valid while it lives; reused once test() reported done. They point at user
 *   buffers (buf, bufs[]) only while in use; the transports reach those through the core
 *   (rh_core_next_tx, rh_core_rx_data) under the io guard, never keeping them.
 * Timers are fields (deadlines in struct rh_fo and struct rh_lane) read by the ticker thread
 *   under mu on a snapshot reference; nothing is queued to a timer.
 * struct rh_mr (core/plugin.c): a memory handle; see "Memory handles" there.
 */

#ifdef RH_LANE_BUILD
#error "core/conn.h is private to core/: a lane uses the core through core/lane_ops.h"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../nic.h"
#include "lane_ops.h"
#include "match.h"
#include "wire.h"

#define RH_MAX_RECV_OUT 32 /* NCCL_NET_MAX_REQUESTS */

enum rh_req_kind { RH_REQ_SEND = 0x5e, RH_REQ_RECV = 0x7e };

struct rh_conn;

struct rh_req {
	uint8_t kind;
	struct rh_conn *conn;
};

struct rh_sreq {
	struct rh_req r;
	bool used;
	bool acked;
	bool queued;
	uint64_t seq; /* matched receive */
	int slot;
	const char *buf;
	uint64_t size;
	uint64_t nchunks, next_chunk;
	uint32_t gen; /* RH_GEN_NEW until its first chunk is scheduled */
	uint64_t t_start_ns;
	struct rh_sreq *qnext;
	bool replay_unsent; /* replayed by the current move, not yet all handed to a lane */
	bool replay_unacked; /* replayed by the current move, not yet acknowledged */
	int nskip; /* replay: chunk runs the receiver already placed */
	struct rh_run skip[RH_RESUME_RUNS];
};

struct rh_rreq {
	struct rh_req r;
	bool used;
	bool complete;
	int err;
	uint64_t seq;
	int n;
	char *bufs[RH_MAX_RECVS];
	uint64_t sizes[RH_MAX_RECVS];
	int32_t tags[RH_MAX_RECVS];
	uint64_t total[RH_MAX_RECVS]; /* sender's size, UINT64_MAX until known */
	uint64_t got[RH_MAX_RECVS];
	uint64_t *bits[RH_MAX_RECVS]; /* chunks placed */
	int writers[RH_MAX_RECVS]; /* chunks being placed right now */
	uint8_t done_mask;
	uint64_t t_start_ns;
};

struct rh_listen;

/* Failover state (failover.c). */
struct rh_fo {
	bool active; /* a move is in progress */
	uint64_t t_detect_ms; /* first detection of the current move */
	uint64_t t_detect_ns; /* the same, for the timing marks (probes, lane events, WARN) */
	/* Timing of the current move past the resume (rh_marks_completed): */
	bool await_first; /* moved: FAILOVER_END at the first request completed after the move */
	bool await_fair; /* first completion seen: FAIR_SHARE when the rate is back */
	uint64_t t_moved_ns; /* sender: RESUME applied, receiver: RESUME record sent */
	uint64_t t_first_ns; /* first completion after the move */
	uint64_t bytes_replayed;
	int replay_unsent, replay_unacked; /* sender: replayed requests not yet sent / acked */
	int cause_err; /* the failure that started the move, for the WARN line */
	char mark_cause[48];
	int from_lnic, from_rnic; /* pair the move left */
	bool failback_pending; /* sender: fail-back done, WARN at its first completion */
	uint64_t t_failback_ns;
	/* Completion rate (windows of >= RH_RATE_WIN_MS and >= RH_RATE_WIN_REQS completions):
	 * the baseline is a moving average over windows outside any move; the fair-share target
	 * is 90 % of it scaled by the usable local NICs after / before the move. */
	uint64_t t_win_ns, win_bytes;
	int win_reqs;
	uint64_t base_Bps, target_Bps;
	int base_nics;
	/* What started the current move, for its one WARN line (logged by the sender at the first
	 * completion after RESUME, by the receiver when it sends RESUME). */
	int cause_lnic, cause_rnic;
	char cause[96];
	bool report_pending; /* sender: RESUME applied, first completion not yet seen */
	int report_lnic, report_rnic; /* sender: a lane carrying traffic after the move */
	uint64_t t_escalate_ms; /* fail requests if still no usable lane by then */
	int reprobes; /* rounds of pairs re-probed after all of them failed, this move */
	bool found_late; /* the last failure was found by the completion timeout (ETIMEDOUT) */
	bool notify; /* FAILREQ (sender) / RESUME (receiver) still to be sent */
	int ndead;
	uint32_t dead[RH_MAX_DEAD];
	/* Fail-back of the original pair (driven by the sender side). */
	bool primary_lost;
	uint64_t t_next_failback_ms;
	int backoff_ms;
	uint64_t t_primary_up_ms;
	uint64_t failback_cookie; /* non-zero while a fail-back probe is in flight */
	uint64_t t_failback_probe_ms; /* when the probe of the current fail-back was sent */
	uint64_t t_last_failreq_ms;
	bool failreq_out; /* sender: FAILREQ sent, no RESUME answering it applied yet */
	uint64_t t_close_ms; /* closing: force-fence deadline */
	/* Warm standby lanes (sender side opens them, tick_standby): the next attempt to open
	 * one, and the backoff after a standby failed (0: none failed since one came up). */
	uint64_t t_standby_next_ms;
	int standby_backoff_ms;
	int standby_used; /* standby lanes promoted so far (grows the standbys kept) */
	/* Pairs that failed during this connection (until fail-back heals them). */
	uint64_t bad_until_ms[RH_MAX_NICS][RH_MAX_NICS];
};

struct rh_conn {
	pthread_mutex_t mu;
	atomic_int refs;
	atomic_int active_io; /* transport threads inside user memory */
	atomic_bool closed; /* user closed it: no new access to user memory */
	uint64_t id;
	bool is_send;
	bool ready; /* first lane up: connect/accept may return it */
	bool registered; /* in the global registry */
	bool peer_closed; /* peer said BYE: lane EOFs are not failures */
	bool accepted;
	int err; /* sticky fatal error (negative errno) */
	int dev; /* NCCL device (local NIC) */
	int lnic_orig, rnic_orig;
	uint32_t epoch; /* current epoch (max of both sides) */
	uint32_t rx_min_epoch; /* receiver: DATA frames of older epochs are dropped */
	uint32_t gen; /* scheduling generation, bumped at fail-back */
	uint64_t chunk;
	uint64_t t_connect_deadline_ms;
	uint64_t remote_listen_id; /* connector: the listen comm named by the handle */
	int connect_attempts;
	uint64_t t_connect_retry_ms; /* connector: next set-up attempt after a transient error */
	int connect_backoff_ms;
	int nrnics;
	struct rh_peer_nic rnics[RH_MAX_NICS];
	struct rh_lane *lanes[RH_MAX_LANES];
	int nlanes;
	uint32_t next_lane_id;
	struct rh_lane *ctrl_lane;
	uint8_t *ctrl; /* pending control frames (headers + payloads) */
	size_t ctrl_len, ctrl_cap;
	atomic_size_t ctrl_inflight; /* handed to a transport, not yet written */
	/* Sender. */
	struct rh_cts_slot cts[RH_RING];
	uint64_t cts_base; /* oldest sequence not yet fully matched */
	uint64_t cts_next; /* one past the highest sequence received */
	struct rh_sreq sreqs[RH_RING * RH_MAX_RECVS];
	struct rh_sreq *qhead, *qtail;
	uint32_t resume_epoch; /* last RESUME applied */
	bool await_resume; /* FAILREQ sent: no new chunks until the RESUME */
	/* Receiver. */
	struct rh_rreq rreqs[RH_RING];
	uint64_t rx_next_seq;
	int nrecv_out;
	uint64_t t_rx_progress_ms; /* last chunk placed or receive posted */
	/* Authentication (plugin.c): the connection secret (from the handle), the connection
	 * nonces of both sides ([0] connector's, in HELLO_CONN; [1] acceptor's, in its reply),
	 * the nonce of each lane this side opened (by slot in lanes[]) and the ids of lanes the
	 * peer opened (newest, and a window of 64 below it: a replayed hello is refused). */
	uint8_t key[RH_SECRET_LEN];
	uint8_t conn_nonce[2][RH_NONCE_LEN];
	bool have_nonces;
	uint8_t lane_nonce[RH_MAX_LANES][RH_NONCE_LEN];
	bool peer_lane_any;
	uint32_t peer_lane_max;
	uint64_t peer_lane_seen;
	/* Acceptor: the id of the listener that founded it (0 once that listener is closed).
	 * Never a pointer: NCCL frees the listen comm as soon as its accept returns, while
	 * the peer's later lanes still say hello; rh_listen_find() looks it up under g.mu. */
	uint64_t listen_id;
	struct rh_conn *lnext; /* the listener's ready queue (g.mu) */
	struct rh_conn *gnext;
	struct rh_fo fo;
};

#define RH_LISTEN_SEEN 64

/* The lane ids a listener has seen the peer use on one connection (peer_lane_* of struct
 * rh_conn), kept by the listener: a connection re-founded after a failed first attempt (same
 * id and nonce) starts from it, so the first attempt's captured hello stays refused. */
struct rh_listen_rec {
	uint64_t conn_id;
	bool any;
	uint32_t max;
	uint64_t seen;
};

struct rh_listen {
	uint64_t id;
	int dev;
	bool closed;
	uint8_t secret[RH_SECRET_LEN]; /* in the handle only; keys its connections' hellos */
	uint64_t seen[RH_LISTEN_SEEN]; /* ids of its last connections that became ready */
	unsigned nseen;
	struct rh_listen_rec rec[RH_LISTEN_SEEN]; /* its last connections, written at creation */
	unsigned nrec;
	struct rh_conn *ready_head, *ready_tail;
	struct rh_listen *next;
};

struct rh_global {
	pthread_mutex_t mu; /* registry; lock order: g.mu before any conn.mu */
	int nnics;
	struct rh_nic nics[RH_MAX_NICS];
	struct rh_conn *conns;
	struct rh_listen *listens;
	uint64_t next_listen_id;
	const struct lane_ops *ops;
};

extern struct rh_global rh_g;

/* The open listener with this id, or NULL (it was closed: the host freed it). g.mu held. */
struct rh_listen *rh_listen_find(uint64_t id);

/* Local NIC i is usable now (no health source holds it down). */
static inline bool rh_nic_is_up(int i)
{
	return __atomic_load_n(&rh_g.nics[i].up, __ATOMIC_ACQUIRE);
}

static inline bool rh_any_local_up(void)
{
	for (int i = 0; i < rh_g.nnics; i++) {
		if (rh_nic_is_up(i)) {
			return true;
		}
	}
	return false;
}

/* conn.c (locked = caller holds c->mu; rh_now_ms/rh_now_ns are in lane_ops.h) */
/* A random id, never 0 nor UINT64_MAX, never blocking (connection, listen and probe ids). */
uint64_t rh_random_id(void);
struct rh_conn *rh_conn_new(bool is_send);
void rh_conn_get(struct rh_conn *c);
void rh_rreq_free_bits(struct rh_rreq *q);
struct rh_lane *rh_conn_add_lane(struct rh_conn *c, uint32_t id, int lnic, int rnic, int nstreams,
				 bool opener); /* locked */
int rh_conn_open_lane(struct rh_conn *c, struct rh_lane *l, int kind, int timeout_ms); /* locked */
/* Open a new connection's primary lane on the pair rh_backup_initial_pair() picks (connect,
 * and again after its first lane failed before the connection was ready). */
int rh_conn_start_connect(struct rh_conn *c); /* locked */
void rh_conn_fence_lane(struct rh_conn *c, struct rh_lane *l); /* locked */
void rh_conn_kick_data(struct rh_conn *c); /* locked */
void rh_conn_pick_ctrl_lane(struct rh_conn *c); /* locked */
int rh_conn_queue_ctrl(struct rh_conn *c, struct rh_hdr *h, const uint8_t *p,
		       size_t len); /* locked */
void rh_conn_fail(struct rh_conn *c, int err, const char *why); /* locked */
int rh_conn_active_lanes(struct rh_conn *c); /* locked */
struct rh_lane *rh_conn_lane_by_id(struct rh_conn *c, uint32_t id); /* locked; NULL: none */
void rh_conn_local_hello(struct rh_conn *c, struct rh_hello *h);
/* Take a peer's epoch e (a hello, FAILREQ, RESUME): false when it is out of bounds
 * (rh_epoch_ok), which the caller treats as a protocol error of the lane it came on. */
bool rh_conn_epoch_take(struct rh_conn *c, uint32_t e); /* locked */
/* Start a new epoch; fails the connection when the epoch space is exhausted. */
int rh_conn_epoch_bump(struct rh_conn *c); /* locked */
/* Report a lane event to the control plane (l may be NULL: the connection's original pair). */
void rh_conn_lane_event(struct rh_conn *c, struct rh_lane *l, int type, int err,
			uint64_t duration_ns, uint64_t bytes_replayed); /* locked */

/* data.c */
int rh_conn_queue_resume(struct rh_conn *c, bool answer);
int rh_conn_queue_bye(struct rh_conn *c); /* locked */
bool rh_conn_rx_waiting(struct rh_conn *c); /* locked */

/* plugin.c */
/* Fill the nonce and MAC of the hello that opens lane l. */
int rh_conn_sign_hello(struct rh_conn *c, struct rh_lane *l, struct rh_hello *h); /* locked */
/* Referenced copy of the registry (at most RH_SNAPSHOT_MAX connections), for work that takes
 * each connection's lock in turn; the caller drops each reference. */
#define RH_SNAPSHOT_MAX 1024
int rh_registry_snapshot(struct rh_conn **list);
/* The registry (caller holds rh_g.mu): add a connection; find one by id and direction. */
void rh_registry_add(struct rh_conn *c);
struct rh_conn *rh_registry_find(uint64_t id, bool is_send);
/* The ticker's pass: failure detection on every connection, closed ones dropped. */
void rh_registry_tick(uint64_t now_ms);

/* failover.c: detection, moves, RESUME, fail-back (the rh_fo_* family lives there alone) */
void rh_fo_lane_failed(struct rh_conn *c, struct rh_lane *l, int err, const char *why); /* locked */
/* Lane l is down: the agent's evidence (a lane event, unless quiet: a graceful retirement),
 * the fence, the lane_down probe; the caller decides what follows (a move, a dropped standby). */
void rh_fo_lane_down(struct rh_conn *c, struct rh_lane *l, int err, bool quiet); /* locked */
void rh_fo_lane_up(struct rh_conn *c, struct rh_lane *l); /* locked */
/* A warm standby lane finished its handshake (STANDBY): a move in progress promotes it. */
void rh_fo_standby_up(struct rh_conn *c, struct rh_lane *l); /* locked */

/* standby.c: warm standby lanes (RAILHOP_STANDBY_LANES) */
/* A move: promote up to max eligible standby lanes (STANDBY, local NIC up, pair not held off)
 * to ACTIVE, the control lane re-picked; returns how many. */
int rh_standby_promote(struct rh_conn *c, int max, uint64_t now); /* locked */
/* The peer sent a frame on standby lane l: it promoted the lane, so this side does too. */
void rh_standby_peer_sent(struct rh_conn *c, struct rh_lane *l, const char *why); /* locked */
/* Standby lane l failed (idle, or while opening): dropped, no move; the peer told (BYE). */
void rh_standby_failed(struct rh_conn *c, struct rh_lane *l, int err, const char *why,
		       uint64_t now); /* locked */
/* How many standbys the connection keeps: STANDBY_LANES, grown on use (STANDBY_LANES_MAX). */
int rh_standby_wanted(const struct rh_conn *c); /* locked */
/* The ticker's phase (sender, outside a move): open standbys up to rh_standby_wanted(). */
void rh_standby_tick(struct rh_conn *c, uint64_t now); /* locked */
/* The peer answered on lane l (a frame read from it), or answered the move (l NULL: every
 * promoted lane): no answer deadline any more. */
void rh_standby_answered(struct rh_conn *c, struct rh_lane *l); /* locked */
/* True when lane l, a standby a move promoted, has had no answer by its deadline. */
bool rh_standby_unanswered(const struct rh_lane *l, uint64_t now); /* locked */
void rh_fo_probe_done(struct rh_conn *c, uint64_t cookie, bool ok); /* locked */
void rh_fo_tick(struct rh_conn *c, uint64_t now); /* locked */
/* Connector: opens the founding lane; a transient error (address resolution in progress, no
 * route yet: rh_fo_transient_setup_err) schedules another attempt with backoff until
 * t_connect_deadline_ms instead of failing. 0, or the negative errno that failed it. */
int rh_fo_connect(struct rh_conn *c); /* locked */
bool rh_fo_transient_setup_err(int err);
/* Start the confirming probe of lane l now (ACTIVE/DRAINING lanes only). */
void rh_fo_confirm(struct rh_conn *c, struct rh_lane *l, const char *why); /* locked */
/* The original pair carries traffic (a primary lane neither dead nor retired). */
bool rh_fo_primary_alive(struct rh_conn *c); /* locked */
/* Retired lanes not yet closed (DRAINING, no BYE sent) carry traffic again; returns how many. */
int rh_fo_reactivate_retired(struct rh_conn *c); /* locked */
/* Why a move found no pair (the escalation's WARN detail): the pairs held off after failing
 * (with the ms left), the local NICs down, the re-probes done and the lanes still in flight,
 * written to buf (always terminated); returns the length written. */
size_t rh_fo_stuck_report(struct rh_conn *c, uint64_t now, char *buf, size_t len); /* locked */

/* resume.c: the resume protocol */
/* Receiver: a FAILREQ arrived: fence the lanes it names dead, start a new epoch, answer with
 * the completion record. */
void rh_resume_on_failreq(struct rh_conn *c, const struct rh_hdr *h, const uint8_t *p); /* locked */
/* Sender: a RESUME arrived: fence the lanes it names dead, take the receiver's records, queue
 * the replay (or wait for the answer to our own FAILREQ). 0 (applied, stale or waiting),
 * -EPROTO (the record does not parse: ignored, logged), -ENOMEM (the caller fails the
 * connection: the move cannot be applied). */
int rh_resume_apply(struct rh_conn *c, const struct rh_hdr *h, const uint8_t *p); /* locked */
/* What the receiver's record r says of send request s: true when s is complete there (its
 * slot done, or its sequence below the record's next and not listed); *k: the index of its
 * receive in r->out (its placed runs), -1 when not listed. Pure. */
bool rh_resume_confirms(const struct rh_resume *r, const struct rh_sreq *s, int *k);

/* backup.c: choose the (local, remote) pair of a new connection, avoiding NICs known down;
 * rank candidate backup pairs (excluding pairs in use and, unless ignore_bad, pairs that failed
 * recently); the agent's plan applied to this connection (empty without a plan). */
struct rh_pair;
int rh_backup_initial_pair(struct rh_conn *c, int *lnic, int *rnic); /* locked */
int rh_backup_rank(struct rh_conn *c, struct rh_pair *out, int max, bool ignore_bad); /* locked */
int rh_backup_plan_pairs(struct rh_conn *c, struct rh_pair *out, int max); /* locked */
/* A lane on backup pair p, added (not opened): the streams of its weight, its plan share. */
struct rh_lane *rh_backup_add_lane(struct rh_conn *c, const struct rh_pair *p,
				   bool standby); /* locked */

/* marks.c: the timing marks of a move */
/* A move starts: its detection here or the peer's word; l is the lane it leaves (or NULL). */
void rh_marks_start(struct rh_conn *c, struct rh_lane *l, int err, const char *why); /* locked */
/* The move is applied (sender: RESUME taken, replay queued; receiver: RESUME record sent). */
void rh_marks_moved(struct rh_conn *c, uint64_t bytes_replayed); /* locked */
/* The move's one WARN line: the pair that failed, why, where the traffic went, and the time
 * from detection to what `reached` names. */
void rh_marks_report_move(struct rh_conn *c, const char *reached); /* locked */
/* The calling thread's CPU time, ns (what a decision costs the thread that makes it). */
uint64_t rh_marks_cpu_ns(void);
/* A move chose lane l (promoted a standby, or opened it): the decision mark; cpu_ns: the
 * deciding thread's CPU time spent choosing and readying it. */
void rh_marks_decision(struct rh_conn *c, struct rh_lane *l, uint64_t cpu_ns); /* locked */
/* The first frame a lane chosen by a move hands to its transport (rh_core_next_tx). */
void rh_marks_first_post(struct rh_conn *c, struct rh_lane *l, bool is_data); /* locked */
/* A send request completed: the first one after a move logs the move's WARN line. */
void rh_marks_first_completion(struct rh_conn *c); /* locked */
/* A request completed (sender: acknowledged by the receiver; receiver: every byte placed):
 * the first-completion and fair-share marks of a move and the rate they are measured by. */
void rh_marks_completed(struct rh_conn *c, uint64_t bytes); /* locked */
/* Sender: request s was acknowledged (acked) or its last replayed chunk handed to a lane. */
void rh_marks_replay_progress(struct rh_conn *c, struct rh_sreq *s, bool acked); /* locked */

/* transport.c: run the registered picker and install the transport it returns, checked
 * (rh_core_check_ops): 0, -EPROTONOSUPPORT (none registered, or none available), -EINVAL. */
int rh_transport_start(void);

/* health.c (core/health.h is the public half) */
struct rh_lane_info;
struct rh_plan_entry;
void rh_health_poll_carrier(void);
/* Plugin start/stop: every NIC up again, the ticker thread started / stopped and joined, the
 * control plane's shutdown hook. */
void rh_health_reset(void);
int rh_health_start_ticker(void);
void rh_health_stop_ticker(void);
void rh_health_shutdown(void);
/* The registered control plane's hooks; standalone (no hooks): no-op, 0, false. */
void rh_health_lane_event(int type, uint64_t conn_id, uint32_t epoch, uint32_t lane, int lnic,
			  int err, uint64_t duration_ns, const struct rh_lane_info *info);
int rh_health_plan_for(int lnic, struct rh_plan_entry *out, int max);
bool rh_health_nic_suspect(int nic);

#endif
