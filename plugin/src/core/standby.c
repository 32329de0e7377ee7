/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Warm standby lanes (RAILHOP_STANDBY_LANES, grown on use up to RAILHOP_STANDBY_LANES_MAX):
 * the sender side keeps that many extra lanes handshaken on its top backup pairs (the agent's
 * plan, else the core's ranking: never a NIC known down, a pair in use or one that failed
 * recently, never the original pair). They carry nothing (lane state STANDBY: the scheduler
 * and the control lane skip it), so a move promotes one and its first frame (the FAILREQ,
 * then the replay) goes out without any set-up; the promotion is a lane event (LANE_UP,
 * flagged promoted) for the agent's trace. Both sides agree through the hello's
 * RH_HELLO_F_STANDBY; each side promotes on its own move (failover.c's open_backups), or when
 * the peer sends on the lane. A standby's own failure drops it (no move) and its replacement
 * waits a backoff. All functions run with the connection lock held.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../log.h"
#include "../param.h"
#include "../probes.h"
#include "conn.h"
#include "health.h"
#include "rank.h"

#define RH_STANDBY_MAX 8 /* RAILHOP_STANDBY_LANES(_MAX)'s upper bound (param.c) */

static bool standby_eligible(struct rh_conn *c, struct rh_lane *l, uint64_t now)
{
	return l->state == RH_LANE_STANDBY && l->tp && rh_nic_is_up(l->lnic) &&
	       c->fo.bad_until_ms[l->lnic][l->rnic] <= now;
}

static void standby_promote(struct rh_conn *c, struct rh_lane *l, const char *why, uint64_t now)
{
	l->state = RH_LANE_ACTIVE;
	l->t_progress_ms = 0;
	c->fo.standby_used++; /* grown on use: rh_standby_wanted() */
	RH_PROBE4(standby_promoted, c->id, l->id, l->lnic, l->rnic);
	/* the agent's trace lists the lanes a move took: a standby's LANE_UP (flag promoted) */
	rh_conn_lane_event(c, l, RH_EVT_LANE_UP, 0, 0, 0);
	INFO("conn %016llx (%s): standby lane %u %s -> peer NIC %d promoted (%s)",
	     (unsigned long long)c->id, c->is_send ? "send" : "recv", l->id,
	     rh_g.nics[l->lnic].ifname, l->rnic, why);
	/* its replacement opens once the move is over, not before the next interval */
	c->fo.t_standby_next_ms = now + (uint64_t)rh_param.FAILBACK_INTERVAL;
}

/* A move: promote up to max eligible standby lanes; returns how many. */
int rh_standby_promote(struct rh_conn *c, int max, uint64_t now)
{
	int n = 0;

	for (int i = 0; i < c->nlanes && n < max; i++) {
		struct rh_lane *l = c->lanes[i];
		uint64_t cpu0;

		if (!standby_eligible(c, l, now)) {
			continue;
		}
		cpu0 = rh_marks_cpu_ns();
		l->await_post = true;
		l->t_decide_ns = rh_now_ns();
		/* the handshake deadline a new lane would have had: an idle standby whose far end
		 * died (every rail down at the switch) must not hold the move open for ever */
		l->t_answer_by_ms = now + 2 * (uint64_t)rh_param.PROBE_TIMEOUT;
		standby_promote(c, l, "a move", now);
		rh_marks_decision(c, l, rh_marks_cpu_ns() - cpu0);
		n++;
	}
	if (n) {
		rh_conn_pick_ctrl_lane(c);
		rh_conn_kick_data(c);
	}
	return n;
}

void rh_standby_answered(struct rh_conn *c, struct rh_lane *l)
{
	if (l) {
		l->t_answer_by_ms = 0;
		return;
	}
	for (int i = 0; i < c->nlanes; i++) {
		c->lanes[i]->t_answer_by_ms = 0;
	}
}

bool rh_standby_unanswered(const struct rh_lane *l, uint64_t now)
{
	return l->t_answer_by_ms && now >= l->t_answer_by_ms;
}

void rh_standby_peer_sent(struct rh_conn *c, struct rh_lane *l, const char *why)
{
	if (l->state != RH_LANE_STANDBY || c->err || atomic_load(&c->closed)) {
		return;
	}
	standby_promote(c, l, why, rh_now_ms());
	rh_fo_lane_up(c, l);
}

/* A standby lane failed (while opening or idle): dropped, not a move; its pair is held off
 * like any failed pair and the next standby waits a backoff (doubling while they keep
 * failing, up to FAILBACK_MAX_BACKOFF). */
void rh_standby_failed(struct rh_conn *c, struct rh_lane *l, int err, const char *why, uint64_t now)
{
	int b = c->fo.standby_backoff_ms ? 2 * c->fo.standby_backoff_ms :
					   (int)rh_param.FAILBACK_INTERVAL;
	bool was_standby = l->state == RH_LANE_STANDBY;

	rh_fo_lane_down(c, l, err, false); /* evidence for the agent, as any lane's failure */
	if (c->err || atomic_load(&c->closed)) {
		return;
	}
	INFO("conn %016llx (%s): standby lane %u %s -> peer NIC %d dropped: %s (%s)",
	     (unsigned long long)c->id, c->is_send ? "send" : "recv", l->id,
	     rh_g.nics[l->lnic].ifname, l->rnic, why, strerror(err < 0 ? -err : err));
	if (l->opener && was_standby) {
		/* the acceptor drops its end too: a lane whose NIC went down may never see the
		 * close, and an idle standby has nothing else that would fail it */
		struct rh_hdr bye = { .type = RH_F_BYE, .aux = l->id };

		rh_conn_queue_ctrl(c, &bye, NULL, 0);
	}
	if (err != -ECONNRESET && err != -EPIPE && err != -ESTALE) {
		c->fo.bad_until_ms[l->lnic][l->rnic] = now + (uint64_t)rh_param.FAILBACK_INTERVAL;
	}
	if (b > (int)rh_param.FAILBACK_MAX_BACKOFF) {
		b = (int)rh_param.FAILBACK_MAX_BACKOFF;
	}
	c->fo.standby_backoff_ms = b;
	c->fo.t_standby_next_ms = now + (uint64_t)b;
}

/* Sized small, grown on use: STANDBY_LANES (0: off, and no growth) until a standby is
 * promoted; then min(used + 1, STANDBY_LANES_MAX), never below STANDBY_LANES nor above
 * RH_STANDBY_MAX. */
int rh_standby_wanted(const struct rh_conn *c)
{
	int base = (int)rh_param.STANDBY_LANES, grown = c->fo.standby_used + 1;

	if (base <= 0) {
		return 0;
	}
	if (grown > (int)rh_param.STANDBY_LANES_MAX) {
		grown = (int)rh_param.STANDBY_LANES_MAX;
	}
	if (c->fo.standby_used > 0 && grown > base) {
		base = grown;
	}
	return base > RH_STANDBY_MAX ? RH_STANDBY_MAX : base;
}

/* The sender keeps rh_standby_wanted() standby lanes (opening or STANDBY) outside a move, on
 * the pairs a move would take first; a failed or promoted one is replaced after its backoff. */
void rh_standby_tick(struct rh_conn *c, uint64_t now)
{
	struct rh_pair p[RH_STANDBY_MAX];
	int want = rh_standby_wanted(c), have = 0, n;

	if (!c->is_send || !c->ready || c->fo.active || want <= 0 ||
	    now < c->fo.t_standby_next_ms || !c->have_nonces) {
		return;
	}
	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *l = c->lanes[i];

		have += l->standby && (l->state == RH_LANE_STANDBY || l->state == RH_LANE_OPENING);
	}
	if (have >= want) {
		return;
	}
	/* nothing to open now (no pair left, or the lane table full): look again later */
	c->fo.t_standby_next_ms = now + (uint64_t)rh_param.FAILBACK_INTERVAL;
	n = rh_backup_plan_pairs(c, p, want - have);
	if (n == 0) {
		n = rh_backup_rank(c, p, want - have, false);
	}
	for (int i = 0; i < n; i++) {
		struct rh_lane *l;

		if (p[i].local == c->lnic_orig && p[i].remote == c->rnic_orig) {
			continue; /* the original pair is the primary's, never a standby's */
		}
		l = rh_backup_add_lane(c, &p[i], true);
		if (!l) {
			break;
		}
		if (rh_conn_open_lane(c, l, RH_HELLO_LANE, 2 * (int)rh_param.PROBE_TIMEOUT) < 0) {
			rh_standby_failed(c, l, -EHOSTUNREACH, "cannot open", now);
		}
	}
}
