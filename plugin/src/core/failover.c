/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Failover: detection (transport errors, no progress within the completion timeout confirmed
 * by a probe, local NIC down), backup choice (rank.c) with spreading, the resume protocol
 * (FAILREQ -> RESUME -> replay of every unacknowledged message: resume.c), fail-back with flap damping,
 * and escalation when no compatible pair is left.
 *
 * The data path calls in here at few points: a lane error, a lane coming up, a probe result
 * and the periodic tick; the RESUME/FAILREQ control frames go to resume.c. All functions run
 * with the connection lock held.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../log.h"
#include "../param.h"
#include "../probes.h"
#include "health.h"
#include "conn.h"
#include "rank.h"
#include "sched.h"

#define RH_STABLE_MS 10000 /* a primary up this long resets the fail-back backoff */

/* The one place that decides fatal vs recoverable for a lane failure (logs the reason). */
static int classify(struct rh_conn *c, int err, const char **why)
{
	if (c->peer_closed) {
		*why = "peer closed the connection";
		return -ECONNRESET;
	}
	if (!rh_any_local_up()) {
		*why = "every local NIC is down";
		return -ENETDOWN;
	}
	(void)err;
	*why = NULL;
	return 0; /* recoverable: move the traffic */
}

static int count_state(struct rh_conn *c, enum rh_lane_state st)
{
	int n = 0;

	for (int i = 0; i < c->nlanes; i++) {
		n += c->lanes[i]->state == st;
	}
	return n;
}

bool rh_fo_primary_alive(struct rh_conn *c)
{
	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *l = c->lanes[i];

		if (l->primary && l->state != RH_LANE_DEAD && l->state != RH_LANE_DRAINING) {
			return true;
		}
	}
	return false;
}

/* Most pairs tried at once when nothing carries the traffic any more: the candidate pairs are
 * all opened (each handshake is the pair's health probe) in parallel, so escalation takes one
 * probe round (plus one re-probe), not one round per BACKUP_LANES pairs. */
#define RH_PAR_PROBES 8

/* The primary a fail-back moved to is lost again before the lanes it retired drained: they
 * carry traffic again. A DRAINING lane takes only messages begun before its retirement, so with
 * the new primary gone and nothing else ACTIVE the connection would move nothing until the next
 * fail-back probe answered (up to FAILBACK_MAX_BACKOFF apart: 33-48 s gaps in the long soak,
 * bench/soak.py). A lane whose BYE went out is closing and stays retired. */
int rh_fo_reactivate_retired(struct rh_conn *c)
{
	int n = 0;

	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *l = c->lanes[i];

		if (l->state == RH_LANE_DRAINING && !l->bye_sent) {
			l->state = RH_LANE_ACTIVE;
			l->retire_gen = 0;
			n++;
		}
	}
	return n;
}

/* Open backup lanes so the moved traffic spreads over the best healthy pairs. */
static void open_backups(struct rh_conn *c)
{
	struct rh_pair p[RH_PAR_PROBES];
	uint64_t now = rh_now_ms();
	int want, have, n, deadline = 2 * (int)rh_param.PROBE_TIMEOUT;

	if (rh_fo_primary_alive(c)) {
		return;
	}
	rh_fo_reactivate_retired(c);
	/* Count lanes that can carry the moved traffic: not ones the peer is still opening
	 * towards us (they may never complete), not ones already without progress (they may be
	 * silently dead too). */
	have = 0;
	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *l = c->lanes[i];

		if (l->state == RH_LANE_ACTIVE) {
			have += !(l->tp &&
				  l->ops->stalled(l, now, (int)rh_param.COMPLETION_TIMEOUT / 4));
		} else {
			have += l->state == RH_LANE_OPENING && l->opener;
		}
	}
	want = (int)rh_param.BACKUP_LANES;
	if (have < want || have == 0) {
		/* warm standbys first: their first frame needs no set-up */
		have += rh_standby_promote(c, (want > have ? want : 1) - have, now);
	}
	if (have == 0 && c->fo.active) {
		/* Nothing left: try every candidate pair at once. A failure found by the completion
		 * timeout has spent most of the escalation budget (timeout + 2 probe timeouts): each
		 * handshake gets the probe timeout. One found at once (local NIC down, a reset) has
		 * not: the usual handshake deadline, so that a healthy pair slow to answer is not
		 * given up. Soak seed 30855 on a loaded CI host: ofi handshakes of 300-420 ms, the
		 * never-faulted rail's lane timed out at 300 ms and its re-probe came up after 301. */
		want = RH_PAR_PROBES;
		deadline = c->fo.found_late ? (int)rh_param.PROBE_TIMEOUT :
					      2 * (int)rh_param.PROBE_TIMEOUT;
	}
	if (want > RH_PAR_PROBES) {
		want = RH_PAR_PROBES;
	}
	if (have >= want) {
		return;
	}
	if (c->fo.active && now >= c->fo.t_escalate_ms && count_state(c, RH_LANE_ACTIVE) == 0) {
		return; /* past the escalation bound: only lanes already in flight may still save it */
	}
	n = rh_backup_plan_pairs(c, p, want - have);
	if (n == 0) {
		n = rh_backup_rank(c, p, want - have, false);
	}
	if (n == 0 && have == 0 && c->fo.active && c->fo.reprobes < 1 &&
	    now + (uint64_t)rh_param.PROBE_TIMEOUT <= c->fo.t_escalate_ms) {
		/* Every candidate failed its probe: probe them all once more before giving up (a
		 * probe lost to congestion must not end the connection). */
		c->fo.reprobes++;
		n = rh_backup_rank(c, p, want, true);
		if (n) {
			INFO("conn %016llx: every backup pair failed, re-probing %d",
			     (unsigned long long)c->id, n);
		}
	}
	for (int i = 0; i < n; i++) {
		uint64_t cpu0 = rh_marks_cpu_ns();
		struct rh_lane *l = rh_backup_add_lane(c, &p[i], false);

		if (!l) {
			break;
		}
		l->await_post = true;
		l->t_decide_ns = rh_now_ns();
		/* answered by the peer, the handshake keeps the usual deadline (lane_tick_opening) */
		l->t_answered_deadline_ms = now + 2 * (uint64_t)rh_param.PROBE_TIMEOUT;
		if (rh_conn_open_lane(c, l, RH_HELLO_LANE, deadline) < 0) {
			l->state = RH_LANE_DEAD;
			c->fo.bad_until_ms[p[i].local][p[i].remote] =
				now + (uint64_t)rh_param.FAILBACK_INTERVAL;
			continue;
		}
		rh_marks_decision(c, l, rh_marks_cpu_ns() - cpu0);
	}
}

static void send_notify(struct rh_conn *c);

/* A standby came up (handshake.c): during a move it carries at once (open_backups promotes it). */
void rh_fo_standby_up(struct rh_conn *c, struct rh_lane *l)
{
	(void)l;
	c->fo.standby_backoff_ms = 0;
	if (c->err || atomic_load(&c->closed)) {
		return;
	}
	if (c->fo.active ||
	    (c->ready && !rh_fo_primary_alive(c) && count_state(c, RH_LANE_ACTIVE) == 0)) {
		/* came up during a move: it carries now */
		open_backups(c);
		send_notify(c);
	}
}

static void send_notify(struct rh_conn *c)
{
	uint8_t buf[1 + 4 * RH_MAX_DEAD];
	struct rh_hdr h = { .type = RH_F_FAILREQ };
	int len;

	if (!c->fo.notify || !c->ctrl_lane || c->ctrl_lane->state != RH_LANE_ACTIVE) {
		return;
	}
	c->fo.notify = false;
	if (c->is_send) {
		len = rh_dead_put(c->fo.ndead, c->fo.dead, buf, sizeof(buf));
		rh_conn_queue_ctrl(c, &h, buf, (size_t)len);
		c->fo.ndead = 0;
		c->fo.t_last_failreq_ms = rh_now_ms();
		c->fo.failreq_out = true;
	} else {
		if (rh_conn_epoch_bump(c) < 0) {
			return;
		}
		rh_conn_queue_resume(c, false);
		if (c->fo.active) {
			rh_marks_report_move(c, "RESUME sent");
		}
		c->fo.active = false;
		RH_PROBE4(replay_queued, c->id, c->epoch, rh_conn_active_lanes(c), (uint64_t)0);
		rh_marks_moved(c, 0);
		INFO("conn %016llx (recv): resume record sent, epoch %u", (unsigned long long)c->id,
		     c->epoch);
	}
}

/* Append to buf at *off, never past len (snprintf's truncation kept: the report is a log line). */
static void put(char *buf, size_t len, size_t *off, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void put(char *buf, size_t len, size_t *off, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*off >= len) {
		return;
	}
	va_start(ap, fmt);
	n = vsnprintf(buf + *off, len - *off, fmt, ap);
	va_end(ap);
	if (n > 0) {
		*off = *off + (size_t)n < len ? *off + (size_t)n : len - 1;
	}
}

size_t rh_fo_stuck_report(struct rh_conn *c, uint64_t now, char *buf, size_t len)
{
	size_t off = 0;
	int held = 0, down = 0;

	if (!len) {
		return 0;
	}
	buf[0] = '\0';
	put(buf, len, &off,
	    "%llu ms into the move, %d re-probe(s), %d lane(s) in flight; held off:",
	    (unsigned long long)(c->fo.active && now >= c->fo.t_detect_ms ?
					 now - c->fo.t_detect_ms :
					 0),
	    c->fo.reprobes, count_state(c, RH_LANE_OPENING) + count_state(c, RH_LANE_SUSPECT));
	for (int l = 0; l < rh_g.nnics; l++) {
		for (int r = 0; r < c->nrnics; r++) {
			if (c->fo.bad_until_ms[l][r] > now) {
				put(buf, len, &off, " %s->%d (%llu ms)", rh_g.nics[l].ifname, r,
				    (unsigned long long)(c->fo.bad_until_ms[l][r] - now));
				held++;
			}
		}
	}
	put(buf, len, &off, "%s; local NICs down:", held ? "" : " none");
	for (int l = 0; l < rh_g.nnics; l++) {
		if (!rh_nic_is_up(l)) {
			put(buf, len, &off, " %s", rh_g.nics[l].ifname);
			down++;
		}
	}
	put(buf, len, &off, "%s", down ? "" : " none");
	return off;
}

static void escalate_if_stuck(struct rh_conn *c, uint64_t now)
{
	if (c->err || count_state(c, RH_LANE_ACTIVE) > 0) {
		return;
	}
	/* Fail when nothing is left to try: every pair failed its probe and its re-probe, and no
	 * lane is still opening or being probed. A completion timeout after the last confirmed
	 * lane failure (t_escalate_ms) no new pair is tried, but lanes already in flight get to
	 * their own deadlines (a handshake: 2x the probe timeout; a confirming probe: the probe
	 * timeout + 200 ms): failing at t_escalate_ms while the one healthy pair's lane was being
	 * probed gave up a connection with a rail left (soak seed 30855). The grace below is the
	 * hard bound behind those deadlines. */
	uint64_t grace = 2 * (uint64_t)rh_param.PROBE_TIMEOUT + 200;

	/* The hard bound counts only within a move: outside one (a fail-back's lane failing while
	 * opening, the carrying lanes all under their confirming probes on a loaded host) the
	 * escalation bound of the last move is stale, and the connection was failed with three
	 * lanes in flight (the carrier-loss loop over verbs, round 4). Those lanes have their own
	 * deadlines; a failed probe starts a move with a fresh bound. */
	if (count_state(c, RH_LANE_OPENING) + count_state(c, RH_LANE_SUSPECT) == 0 ||
	    (c->fo.active && now >= c->fo.t_escalate_ms + grace)) {
		char why[512];

		/* the one line that says why no pair was left (soak seed 30855: a rail never
		 * faulted was given up, and the log could not tell whether it was held off) */
		rh_fo_stuck_report(c, now, why, sizeof(why));
		WARN("conn %016llx (%s): no NIC pair left to try: %s", (unsigned long long)c->id,
		     c->is_send ? "send" : "recv", why);
		rh_conn_fail(c, rh_any_local_up() ? -EHOSTUNREACH : -ENETDOWN,
			     "no compatible NIC pair left");
	}
}

/* A failure that needs the data moved: the escalation bound counts from now, and the first
 * failure of a move sets its start, marks, cause and FAILOVER_START (a move that had no
 * completion yet keeps its start: the stall the application sees began there). l: the lane that
 * failed, or NULL when none did (start_move_without_lane: the cause is the original pair). */
static void begin_move(struct rh_conn *c, struct rh_lane *l, int err, const char *why, uint64_t now)
{
	/* The bound covers the backup pairs' first probe round (a handshake: up to 2x the probe
	 * timeout) and the start of one complete re-probe (open_backups). With a probe timeout
	 * above the completion timeout (the VM lab over verbs: 10 s, 8 s) it ran out before the
	 * first round had failed: no pair was ever re-probed, and a blackhole under load gave up
	 * connections with healthy rails left (bench/vm_failover.py: 9 of 14 rounds). Nothing
	 * left to try still escalates at once (escalate_if_stuck). */
	uint64_t bound = (uint64_t)rh_param.COMPLETION_TIMEOUT;

	if (bound < 3 * (uint64_t)rh_param.PROBE_TIMEOUT) {
		bound = 3 * (uint64_t)rh_param.PROBE_TIMEOUT;
	}
	c->fo.t_escalate_ms = now + bound;
	c->fo.reprobes = 0;
	c->fo.found_late = err == -ETIMEDOUT || err == -ESTALE;
	if (!c->fo.active) {
		c->fo.active = true;
		c->fo.t_detect_ms = now;
		if (!c->fo.await_first) {
			rh_marks_start(c, l, err, why);
		}
		c->fo.await_first = false;
		c->fo.report_pending = false;
		c->fo.cause_lnic = l ? l->lnic : c->lnic_orig;
		c->fo.cause_rnic = l ? l->rnic : c->rnic_orig;
		snprintf(c->fo.cause, sizeof(c->fo.cause), "%s: %s", why,
			 strerror(err < 0 ? -err : err));
		RH_PROBE3(failover_start, c->id, l ? l->id : 0u, err);
		if (l) {
			rh_conn_lane_event(c, l, RH_EVT_FAILOVER_START, err, 0, 0);
		}
	}
	c->fo.notify = true;
	if (c->is_send) {
		c->await_resume = true;
	}
}

bool rh_fo_transient_setup_err(int err)
{
	/* Address or route resolution still in progress (seen with 8 connections at once over
	 * libfabric's verbs provider on fresh Soft-RoCE nodes: EHOSTUNREACH), or a handshake
	 * that timed out: worth another try within the connect deadline. */
	switch (-err) {
	case EHOSTUNREACH:
	case ENETUNREACH:
	case EADDRNOTAVAIL:
	case ETIMEDOUT:
	case EAGAIN:
		return true;
	default:
		return false;
	}
}

#define RH_CONNECT_BACKOFF_MIN_MS 50
#define RH_CONNECT_BACKOFF_MAX_MS 1000

/* A transient set-up error: another attempt after the backoff, if the deadline allows. */
static bool schedule_connect_retry(struct rh_conn *c, int err, uint64_t now)
{
	int b = c->connect_backoff_ms ? c->connect_backoff_ms : RH_CONNECT_BACKOFF_MIN_MS;

	if (!rh_fo_transient_setup_err(err) || now + (uint64_t)b >= c->t_connect_deadline_ms) {
		return false;
	}
	c->t_connect_retry_ms = now + (uint64_t)b;
	c->connect_backoff_ms = b * 2 > RH_CONNECT_BACKOFF_MAX_MS ? RH_CONNECT_BACKOFF_MAX_MS :
								    b * 2;
	INFO("conn %016llx: connection set-up: %s, retrying in %d ms", (unsigned long long)c->id,
	     strerror(-err), b);
	return true;
}

int rh_fo_connect(struct rh_conn *c)
{
	uint64_t now = rh_now_ms();
	int rc;

	c->t_connect_retry_ms = 0;
	rc = rh_conn_start_connect(c); /* a lane that could not open is fenced there */
	if (rc >= 0) {
		return 0;
	}
	return schedule_connect_retry(c, rc, now) ? 0 : rc;
}

/* The connector's founding lane failed before the connection was ready: another pair (a bounded
 * number of times), and after a transient error another attempt until the connect deadline;
 * the acceptor's side just fails (the connector starts over). */
static void setup_lane_failed(struct rh_conn *c, struct rh_lane *l, int err, uint64_t now)
{
	int rc = err;

	if (!c->is_send || !l->opener) {
		rh_conn_fail(c, -EHOSTUNREACH, "connection setup failed");
		return;
	}
	if (c->connect_attempts < 2 * rh_g.nnics + 2) {
		rc = rh_fo_connect(c);
		if (rc == 0) {
			return;
		}
	}
	if (schedule_connect_retry(c, rc, now) || schedule_connect_retry(c, err, now)) {
		return;
	}
	rh_conn_fail(c, rc, "cannot establish the connection");
}

void rh_fo_lane_down(struct rh_conn *c, struct rh_lane *l, int err, bool quiet)
{
	if (!quiet && !c->err && !atomic_load(&c->closed)) {
		/* before the fence: the transport still knows the lane's ports */
		rh_conn_lane_event(c, l,
				   err == -ETIMEDOUT || err == -ESTALE ? RH_EVT_LANE_TIMEOUT :
									 RH_EVT_LANE_ERROR,
				   err, 0, 0);
	}
	rh_conn_fence_lane(c, l);
	RH_PROBE4(lane_down, c->id, l->id, l->lnic, err);
}

void rh_fo_lane_failed(struct rh_conn *c, struct rh_lane *l, int err, const char *why)
{
	uint64_t now = rh_now_ms();
	bool was_opening = l->state == RH_LANE_OPENING;
	bool graceful = l->state == RH_LANE_DRAINING && l->bye_sent;
	const char *fatal_why;
	int fatal;

	if (l->state == RH_LANE_DEAD) {
		return;
	}
	if (l->state == RH_LANE_STANDBY || (l->standby && was_opening && c->ready)) {
		rh_standby_failed(c, l, err, why, now);
		return;
	}
	rh_fo_lane_down(c, l, err, graceful);
	if (graceful || c->err || atomic_load(&c->closed)) {
		return;
	}
	/* INFO: the move's one WARN line is rh_marks_report_move()'s */
	INFO("conn %016llx (%s): lane %u %s -> peer NIC %d failed: %s (%s)",
	     (unsigned long long)c->id, c->is_send ? "send" : "recv", l->id,
	     rh_g.nics[l->lnic].ifname, l->rnic, why, strerror(err < 0 ? -err : err));
	if (err != -ECONNRESET && err != -EPIPE && err != -ESTALE) {
		c->fo.bad_until_ms[l->lnic][l->rnic] = now + (uint64_t)rh_param.FAILBACK_INTERVAL;
	}
	if (!c->ready) {
		setup_lane_failed(c, l, err, now);
		return;
	}
	fatal = classify(c, err, &fatal_why);
	if (fatal) {
		rh_conn_fail(c, fatal, fatal_why);
		return;
	}
	if (l->primary && !was_opening) {
		c->fo.primary_lost = true;
		if (c->fo.t_primary_up_ms && now - c->fo.t_primary_up_ms < RH_STABLE_MS) {
			c->fo.backoff_ms *= 2; /* flapping: hold the pair off longer */
			if (c->fo.backoff_ms > rh_param.FAILBACK_MAX_BACKOFF) {
				c->fo.backoff_ms = (int)rh_param.FAILBACK_MAX_BACKOFF;
			}
		} else {
			c->fo.backoff_ms = (int)rh_param.FAILBACK_INTERVAL;
		}
		c->fo.t_next_failback_ms = now + (uint64_t)c->fo.backoff_ms;
	}
	if (!was_opening) {
		if (c->fo.ndead < RH_MAX_DEAD) {
			c->fo.dead[c->fo.ndead++] = l->id;
		}
		/* Escalation is bounded from the latest confirmed failure of a lane that carried
		 * traffic: with no compatible pair left that is within 2x the completion timeout
		 * of the last progress. */
		begin_move(c, l, err, why, now);
	}
	/* Within a move a failed pair stays held off up to the escalation bound: only the re-probe
	 * round tries it again. With the VM lab's timeouts its 1 s hold-off (FAILBACK_INTERVAL)
	 * ran out while the first round of backups was in flight; when that round failed, the
	 * ranking found the failed pair again and tried it alone, and the healthy pairs were never
	 * re-probed (bench/vm_failover.py, a blackhole on nic0: "held off: nic0->0"). */
	if (c->fo.active && err != -ECONNRESET && err != -EPIPE && err != -ESTALE &&
	    c->fo.bad_until_ms[l->lnic][l->rnic] < c->fo.t_escalate_ms) {
		c->fo.bad_until_ms[l->lnic][l->rnic] = c->fo.t_escalate_ms;
	}
	open_backups(c);
	send_notify(c);
	escalate_if_stuck(c, now);
}

void rh_fo_lane_up(struct rh_conn *c, struct rh_lane *l)
{
	if (c->is_send && l->primary && c->fo.primary_lost) {
		c->fo.primary_lost = false;
		c->fo.t_primary_up_ms = rh_now_ms();
		c->gen++;
		for (int i = 0; i < c->nlanes; i++) {
			struct rh_lane *o = c->lanes[i];

			if (o != l && o->state == RH_LANE_ACTIVE && !o->primary) {
				o->state = RH_LANE_DRAINING;
				o->retire_gen = c->gen;
			}
		}
		c->fo.failback_pending = true;
		c->fo.t_failback_ns = rh_now_ns();
		RH_PROBE2(failback, c->id, l->id);
		rh_conn_lane_event(c, l, RH_EVT_FAILBACK, 0, 0, 0);
		WARN("conn %016llx (send): fail-back: %s -> peer NIC %d is healthy again (probe "
		     "answered); traffic back on it %llu ms after the probe",
		     (unsigned long long)c->id, rh_g.nics[l->lnic].ifname, l->rnic,
		     (unsigned long long)(c->fo.t_failback_probe_ms ?
						  c->fo.t_primary_up_ms -
							  c->fo.t_failback_probe_ms :
						  0));
	}
	rh_conn_pick_ctrl_lane(c);
	send_notify(c);
	rh_conn_kick_data(c);
}

/* The ticker's view of bytes moving on a lane (either direction). */
static void track_progress(struct rh_lane *l, uint64_t now)
{
	uint64_t p;

	if (!l->tp || !l->ops->progress) {
		return;
	}
	p = l->ops->progress(l);
	if (p != l->progress_mark || !l->t_progress_ms) {
		l->progress_mark = p;
		l->t_progress_ms = now;
	}
}

/* A suspect lane whose probe failed but whose transport moved bytes since the probe started is
 * slow (queued behind a full link, a probe lost to congestion), not dead. */
static bool moved_since_suspect(struct rh_lane *l)
{
	return l->tp && l->ops->progress && l->ops->progress(l) != l->suspect_mark;
}

void rh_fo_probe_done(struct rh_conn *c, uint64_t cookie, bool ok)
{
	uint64_t now = rh_now_ms();

	if (c->err || atomic_load(&c->closed)) {
		return;
	}
	if (cookie == c->fo.failback_cookie) {
		c->fo.failback_cookie = 0;
		if (!ok || !c->fo.primary_lost || rh_fo_primary_alive(c)) {
			c->fo.t_next_failback_ms = now + (uint64_t)c->fo.backoff_ms;
			return;
		}
		struct rh_lane *l = rh_conn_add_lane(c, c->next_lane_id, c->lnic_orig, c->rnic_orig,
						     (int)rh_param.STREAMS_PER_LANE, true);
		if (l) {
			c->next_lane_id += 2;
			c->fo.bad_until_ms[c->lnic_orig][c->rnic_orig] = 0;
			if (rh_conn_open_lane(c, l, RH_HELLO_LANE,
					      2 * (int)rh_param.PROBE_TIMEOUT) < 0) {
				l->state = RH_LANE_DEAD;
			}
		}
		c->fo.t_next_failback_ms = now + (uint64_t)c->fo.backoff_ms;
		return;
	}
	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *l = c->lanes[i];

		if (l->state != RH_LANE_SUSPECT || l->probe_cookie != cookie) {
			continue;
		}
		if (ok && l->tp && l->ops->stalled(l, now, (int)rh_param.COMPLETION_TIMEOUT)) {
			/* The pair answers at once but this lane's transport is stuck (e.g. TCP in
			 * retransmission backoff after a flap): replace it, the pair stays good. */
			rh_fo_lane_failed(c, l, -ESTALE, "stuck although the pair answers");
		} else if (ok || moved_since_suspect(l)) {
			INFO("conn %016llx: lane %u slow but alive (%s)", (unsigned long long)c->id,
			     l->id, ok ? "probe answered" : "bytes still moving");
			l->state = RH_LANE_ACTIVE;
			l->t_suspect_ms = now; /* grace: a full timeout before suspecting again */
			rh_conn_kick_data(c);
		} else {
			rh_fo_lane_failed(c, l, -ETIMEDOUT, "no progress, probe failed");
		}
	}
}

static bool drained(struct rh_conn *c, uint32_t retire_gen)
{
	for (int i = 0; i < RH_RING * RH_MAX_RECVS; i++) {
		struct rh_sreq *s = &c->sreqs[i];

		if (s->used && !s->acked && s->gen != RH_GEN_NEW && s->gen < retire_gen) {
			return false;
		}
	}
	return true;
}

void rh_fo_confirm(struct rh_conn *c, struct rh_lane *l, const char *why)
{
	if (c->err || atomic_load(&c->closed) || !l->tp ||
	    (l->state != RH_LANE_ACTIVE && l->state != RH_LANE_DRAINING) || l->bye_sent) {
		return;
	}
	l->state = RH_LANE_SUSPECT;
	l->t_suspect_ms = rh_now_ms();
	l->suspect_mark = l->ops->progress ? l->ops->progress(l) : 0;
	l->probe_cookie = rh_random_id();
	RH_PROBE3(lane_suspect, c->id, l->id, l->lnic);
	if (l->ops->probe(c, l->lnic, c->rnics[l->rnic].ipv4, c->rnics[l->rnic].port,
			  l->probe_cookie, (int)rh_param.PROBE_TIMEOUT) < 0) {
		rh_fo_lane_failed(c, l, -ETIMEDOUT, why);
	}
}

static bool unacked_work(struct rh_conn *c)
{
	for (int i = 0; i < RH_RING * RH_MAX_RECVS; i++) {
		if (c->sreqs[i].used && !c->sreqs[i].acked) {
			return true;
		}
	}
	return false;
}

/* Every wait has a bound: a sender with unacknowledged requests and no lane that carries or may
 * carry them (nothing ACTIVE, OPENING or SUSPECT, nothing retired to take back) while no move is
 * in progress starts one, as if its last lane had failed. Backups open; with no pair left, the
 * escalation bound applies. (How it can happen: a RESUME that names lanes dead is applied
 * without a failover of our own; see rh_fo_reactivate_retired.) */
static void start_move_without_lane(struct rh_conn *c, uint64_t now)
{
	WARN("conn %016llx (send): no lane left to carry its unacknowledged requests and no "
	     "move in progress: starting one",
	     (unsigned long long)c->id);
	begin_move(c, NULL, -ENOLINK, "no lane left", now);
}

/*
 * The ticker's pass over one connection (every 20 ms), in phases; each runs only while the
 * connection stands (a phase may fail it).
 */

/* The share gate's backstop: a lane it held back waits for another lane's next chunk; if those
 * lanes left (failed, suspect, retired) the tick wakes it. */
static void tick_share_gate(struct rh_conn *c, uint64_t now)
{
	(void)now;
	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *l = c->lanes[i];

		if (l->share_wait && l->state == RH_LANE_ACTIVE) {
			l->share_wait = false;
			l->ops->kick(l);
		}
	}
}

/* A lane whose handshake is past its deadline failed; one the peer has answered (a stream
 * accepted or handshaken) only past its answered deadline. A move found by the completion
 * timeout gives its backups the probe timeout (open_backups); a healthy pair the peer had
 * answered but whose other endpoints were still being set up (one I/O thread, a loaded or
 * emulated CPU) was given up with it and held off, and the connection escalated with "no
 * compatible NIC pair left" (the ofi soak under load, and the carrier-loss loop over verbs). */
static void lane_tick_opening(struct rh_conn *c, struct rh_lane *l, uint64_t now)
{
	if (now <= l->t_deadline_ms) {
		return;
	}
	if ((l->answered || l->nready > 0) && now <= l->t_answered_deadline_ms) {
		return;
	}
	rh_fo_lane_failed(c, l, -ETIMEDOUT,
			  l->answered || l->nready > 0 ? "handshake timed out (peer answered)" :
							 "handshake timed out");
}

/* A retired lane: fenced 2 s after its BYE; its BYE sent once the messages it carries are
 * acknowledged (sender, the control lane elsewhere). True when the lane was handled here. */
static bool lane_tick_retiring(struct rh_conn *c, struct rh_lane *l, uint64_t now)
{
	if (l->state != RH_LANE_DRAINING) {
		return false;
	}
	if (l->bye_sent) {
		if (now > l->t_suspect_ms + 2000) {
			rh_conn_fence_lane(c, l);
		}
		return true;
	}
	if (c->is_send && drained(c, l->retire_gen) && c->ctrl_lane && c->ctrl_lane != l) {
		struct rh_hdr bye = { .type = RH_F_BYE, .aux = l->id };

		rh_conn_queue_ctrl(c, &bye, NULL, 0);
		l->bye_sent = true;
		l->t_suspect_ms = now;
		return true;
	}
	return false;
}

/* A lane carrying traffic (ACTIVE, or DRAINING before its BYE): the transport's loss verdict
 * while the agent suspects the NIC fails it at once; no progress for the completion timeout
 * starts the confirming probe. */
static void lane_tick_carrying(struct rh_conn *c, struct rh_lane *l, uint64_t now)
{
	int timeout = (int)rh_param.COMPLETION_TIMEOUT;
	int early = timeout - (int)rh_param.PROBE_TIMEOUT;

	if (early < timeout / 2) {
		early = timeout / 2;
	}
	track_progress(l, now);
	if (lane_tick_retiring(c, l, now)) {
		return;
	}
	if (rh_standby_unanswered(l, now)) {
		rh_fo_lane_failed(c, l, -ETIMEDOUT, "promoted standby: no answer from the peer");
		return;
	}
	/* While the agent suspects the NIC (its suspicion may have come, and been answered,
	 * before this lane's trouble began), a lane that has moved nothing for 100 ms and whose
	 * transport says the path is lost fails at once. */
	if (l->ops->lost && l->tp && rh_health_nic_suspect(l->lnic) &&
	    now >= l->t_progress_ms + 100 && l->ops->lost(l, now - l->t_progress_ms)) {
		rh_fo_lane_failed(c, l, -ETIMEDOUT, "transport lost the path (NIC suspect)");
		return;
	}
	/* Sender side: the transport makes no progress on cleared-to-send data. Receiver side:
	 * posted receives see no data for the timeout; the probe tells a failed link from an
	 * idle peer. The confirming probe starts early enough to be answered (or not) by the
	 * time the completion timeout expires. */
	if (now - l->t_suspect_ms >= (uint64_t)timeout && l->tp &&
	    (l->ops->stalled(l, now, early) ||
	     (l->state == RH_LANE_ACTIVE && l == c->ctrl_lane && rh_conn_rx_waiting(c) &&
	      now - c->t_rx_progress_ms >= (uint64_t)early &&
	      now - l->t_progress_ms >= (uint64_t)early))) {
		INFO("conn %016llx: lane %u made no progress for %d ms, probing",
		     (unsigned long long)c->id, l->id, early);
		rh_fo_confirm(c, l, "no progress");
	}
}

/* A lane under its confirming probe: failed when the transport confirms the loss before the
 * probe's deadline, or when the deadline passes with nothing moved; ACTIVE again when it
 * moved. */
static void lane_tick_suspect(struct rh_conn *c, struct rh_lane *l, uint64_t now)
{
	if (l->ops->lost && !moved_since_suspect(l) && l->ops->lost(l, now - l->t_suspect_ms)) {
		rh_fo_lane_failed(c, l, -ETIMEDOUT, "transport lost the path");
	} else if (now > l->t_suspect_ms + (uint64_t)rh_param.PROBE_TIMEOUT + 200) {
		if (moved_since_suspect(l)) {
			l->state = RH_LANE_ACTIVE;
			l->t_suspect_ms = now;
		} else {
			rh_fo_lane_failed(c, l, -ETIMEDOUT, "probe timed out");
		}
	}
}

/* Every lane by its state, until one fails the connection. */
static void tick_lanes(struct rh_conn *c, uint64_t now)
{
	for (int i = 0; i < c->nlanes && !c->err; i++) {
		struct rh_lane *l = c->lanes[i];

		switch (l->state) {
		case RH_LANE_OPENING:
			lane_tick_opening(c, l, now);
			break;
		case RH_LANE_ACTIVE:
		case RH_LANE_DRAINING:
			lane_tick_carrying(c, l, now);
			break;
		case RH_LANE_SUSPECT:
			lane_tick_suspect(c, l, now);
			break;
		default:
			break;
		}
	}
}

/* A sender with unacknowledged requests and nothing that carries or may carry them starts a
 * move (start_move_without_lane). */
static void tick_no_lane_left(struct rh_conn *c, uint64_t now)
{
	int may_carry = count_state(c, RH_LANE_ACTIVE) + count_state(c, RH_LANE_SUSPECT);

	for (int i = 0; i < c->nlanes; i++) {
		/* a standby being opened carries nothing until a move promotes it */
		may_carry += c->lanes[i]->state == RH_LANE_OPENING && !c->lanes[i]->standby;
	}
	if (c->is_send && c->ready && !c->fo.active && unacked_work(c) && may_carry == 0 &&
	    rh_fo_reactivate_retired(c) == 0) {
		start_move_without_lane(c, now);
	}
}

/* A move in progress: the FAILREQ sent again when it (or its answer) may have been lost,
 * backups opened, the peer told, escalation when nothing is left to try. */
static void tick_move(struct rh_conn *c, uint64_t now)
{
	if (!c->fo.active) {
		return;
	}
	/* The FAILREQ or its answer may have been lost: sent again, but only once the last one
	 * left the control queue. A control lane whose transport is slow to take it (a verbs I/O
	 * thread fencing queue pairs for 3 s under emulation) piled up ten, each answered by a
	 * RESUME and a full replay (bench/vm_switchover.py, a promoted standby). */
	if (c->is_send && c->await_resume && !c->fo.notify && c->ctrl_len == 0 &&
	    now - c->fo.t_last_failreq_ms > 300) {
		c->fo.notify = true;
	}
	open_backups(c);
	send_notify(c);
	escalate_if_stuck(c, now);
}

/* Fail-back (sender): the original pair, lost and its NIC up again, is probed when its backoff
 * allows; the answer arrives in rh_fo_probe_done. */
static void tick_failback(struct rh_conn *c, uint64_t now)
{
	if (!(c->is_send && c->fo.primary_lost && !c->fo.active && !c->fo.failback_cookie &&
	      now >= c->fo.t_next_failback_ms && rh_nic_is_up(c->lnic_orig) &&
	      !rh_fo_primary_alive(c))) {
		return;
	}
	c->fo.failback_cookie = rh_random_id();
	c->fo.t_failback_probe_ms = now;
	if (rh_g.ops->probe(c, c->lnic_orig, c->rnics[c->rnic_orig].ipv4,
			    c->rnics[c->rnic_orig].port, c->fo.failback_cookie,
			    (int)rh_param.PROBE_TIMEOUT) < 0) {
		c->fo.failback_cookie = 0;
		c->fo.t_next_failback_ms = now + (uint64_t)c->fo.backoff_ms;
	}
}

/* Connector: the set-up attempt a transient error put off (rh_fo_connect). */
static void tick_connect_retry(struct rh_conn *c, uint64_t now)
{
	int rc;

	if (c->ready || !c->is_send || !c->t_connect_retry_ms || now < c->t_connect_retry_ms) {
		return;
	}
	rc = rh_fo_connect(c);
	if (rc < 0) {
		rh_conn_fail(c, rc, "cannot establish the connection before its deadline");
	}
}

void rh_fo_tick(struct rh_conn *c, uint64_t now)
{
	static void (*const phases[])(struct rh_conn *, uint64_t) = {
		tick_connect_retry, tick_share_gate, tick_lanes,      tick_no_lane_left,
		tick_move,	    tick_failback,   rh_standby_tick,
	};

	for (size_t i = 0; i < sizeof(phases) / sizeof(phases[0]); i++) {
		if (c->err || atomic_load(&c->closed)) {
			break;
		}
		phases[i](c, now);
	}
}
