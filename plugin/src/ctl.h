/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plugin's side of the control plane: reads the agent's health table (shared memory,
 * layout in railhop/ctl_table.h) and sends lane events to the agent's socket.
 *
 * Self-contained: depends on nothing of the plugin core; logs through the callback the core
 * passes in. Every function returns 0 or a negative errno.
 *
 * Threads: rh_ctl_snapshot() may run in any number of threads at once, each with its own view,
 * concurrently with rh_ctl_refresh() and rh_ctl_send_event(). rh_ctl_close() must run alone.
 *
 * Cost: rh_ctl_snapshot() reads the table with pread() into the caller's memory (never a
 * shared mapping: a truncated file cannot raise SIGBUS); when nothing was published since the
 * view was filled it is one 64-byte pread and a clock read, on a change two more preads (12 KiB).
 * rh_ctl_refresh() is the slow path (stat, open, owner check, /proc) and rate-limits itself;
 * call it from a timer or the progress loop at any rate. rh_ctl_send_event() makes one
 * non-blocking send (plus a connect at most once per reconnect interval when disconnected).
 */
#ifndef RAILHOP_CTL_H
#define RAILHOP_CTL_H

#include <stdint.h>

#include "railhop/ctl_table.h"

enum rh_ctl_log_level {
	RH_CTL_LOG_WARN = 0,
	RH_CTL_LOG_INFO = 1,
	RH_CTL_LOG_TRACE = 2,
};

/* printf-style logger; `func`/`line` name the caller inside ctl.c */
typedef void (*rh_ctl_log_fn)(void *arg, int level, const char *func, int line, const char *fmt,
			      ...) __attribute__((format(printf, 5, 6)));

struct rh_ctl_opts {
	rh_ctl_log_fn log; /* NULL: silent */
	void *log_arg;
	uint64_t stale_ns; /* heartbeat older than this: agent gone. 0: 8 x its heartbeat period */
	uint64_t poll_interval_ns; /* rh_ctl_refresh() does real work at most this often. 0: 500 ms */
	uint64_t reconnect_ns; /* min time between socket connect attempts. 0: 1 s */
	/* the uid the agent runs as when not root: the table file and the socket's server must
	 * belong to root or to this uid. <= 0: root or this process's own uid */
	int64_t agent_uid;
};

/*
 * A consistent copy of the table. Zero it before the first rh_ctl_snapshot(); afterwards keep
 * passing the same view: it is also the cache that makes an unchanged table cheap to read.
 * Only meaningful after rh_ctl_snapshot() returned 0.
 */
struct rh_ctl_view {
	uint64_t map_id; /* which mapping this copy came from (0: none yet) */
	uint64_t seq; /* seqlock value of the copy */
	uint64_t generation; /* the agent's generation: changes when the agent restarts */
	uint64_t publish_count;
	uint64_t publish_ns;
	uint32_t agent_pid;
	uint32_t flags; /* RH_CTL_F_* */
	uint32_t nic_count;
	uint32_t heartbeat_ms; /* the agent's heartbeat period */
	/* the node policy's settings (struct rh_ctl_body); 0: not set by the policy */
	uint32_t completion_ms;
	uint32_t probe_ms;
	uint32_t failback_interval_ms;
	uint32_t settings_flags; /* RH_CTL_S_* */
	/* layout_minor >= 1 (the reader zeroes them, distance_limit = NO_DISTANCE, for older
	 * tables); the NIC records' rail_peers likewise */
	uint32_t layout_minor;
	uint8_t rail_rule; /* enum rh_ctl_rail_rule */
	uint8_t distance_limit; /* enum rh_distance or RH_CTL_NO_DISTANCE */
	uint16_t min_rails_up;
	uint16_t backup_lanes;
	int changed; /* 1 when this call copied a new publish (or a new agent), else 0 */
	struct rh_ctl_nic nics[RH_CTL_MAX_NICS];
	struct rh_ctl_plan plans[RH_CTL_MAX_NICS];
};

struct rh_ctl_stats {
	uint64_t snapshots_copied; /* full copies accepted */
	uint64_t torn_retries; /* copies thrown away because the writer was active */
	uint64_t crc_errors; /* copies whose CRC did not match */
	uint64_t proto_errors; /* tables rejected: bad magic/version/size/record */
	uint64_t stale; /* snapshots refused because the agent is gone or silent */
	uint64_t remaps; /* tables (re)mapped: agent (re)starts seen */
	uint64_t events_sent;
	uint64_t events_dropped; /* not sent: no agent, socket full, or error */
	uint64_t connects; /* successful connections to the agent socket */
};

/* Ownership: the struct rh_ctl is the agent glue's (agent.c): opened by the ticker's first
 * poll, published atomically, closed by the plugin stop's shutdown hook after the ticker and
 * every I/O thread are joined. Lane events are copied by value (connection id, lane id,
 * ports), never a pointer to a connection or lane; queued ones wait in agent.c's evq (evq_mu).
 */
struct rh_ctl;

/*
 * Opens the control plane of run_dir (NULL: $RAILHOP_RUN_DIR, else /run/railhop). Succeeds even
 * when no agent runs: snapshots then return -ESTALE and events are dropped until one appears.
 * Fails only with -ENOMEM, -ENAMETOOLONG or -EINVAL.
 */
int rh_ctl_open(const char *run_dir, const struct rh_ctl_opts *opts, struct rh_ctl **out);

/*
 * Slow path, rate-limited: opens the table when it appears or when a restarted agent replaced
 * it, checks that the agent process still exists (same pid namespace only), reconnects the
 * socket. Returns 1 when a new table was opened, 0 otherwise, negative errno on failure
 * (-ENOENT: no table; -EPROTO: the table is corrupt; -EPERM: the table is not owned by root or
 * the agent's uid, or others may write it).
 */
int rh_ctl_refresh(struct rh_ctl *ctl);

/*
 * Copies the table into *view if it changed since the view was filled.
 * 0: *view is valid (view->changed says whether it is new).
 * -ESTALE: no table, the agent shut down, died or stopped its heartbeat: work alone.
 * -EAGAIN: the writer kept the table busy through every retry: try later.
 * -EPROTO: the table is corrupt (magic, version, sizes, CRC, records) or truncated: work alone.
 * On any error *view is invalidated.
 */
int rh_ctl_snapshot(struct rh_ctl *ctl, struct rh_ctl_view *view);

/* index of ifname in the view, or -1 */
int rh_ctl_view_find(const struct rh_ctl_view *view, const char *ifname);

/* fills magic, version, size, type, pid and t_ns (CLOCK_MONOTONIC now); zeroes the rest */
void rh_lane_event_init(struct rh_lane_event *ev, uint16_t type);

/*
 * Sends one event without blocking. -EAGAIN: the socket is full (dropped), -ENOTCONN: no agent
 * (dropped), -EINVAL: bad event. Never blocks, never raises SIGPIPE.
 */
int rh_ctl_send_event(struct rh_ctl *ctl, const struct rh_lane_event *ev);

void rh_ctl_stats(const struct rh_ctl *ctl, struct rh_ctl_stats *out);

/* CRC-32 (IEEE 802.3, as zlib.crc32): crc = rh_ctl_crc32(crc, buf, len), start with 0 */
uint32_t rh_ctl_crc32(uint32_t crc, const void *buf, uint64_t len);

void rh_ctl_close(struct rh_ctl *ctl);

#endif /* RAILHOP_CTL_H */
