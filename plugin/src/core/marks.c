/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The marks of a move as the application sees them: where it starts (detection, or the peer's
 * word), when it is applied, the first request completed after it (FAILOVER_END, the one WARN
 * line of the move), the replay sent and acknowledged, and when the connection's rate is back
 * at its fair share of the NICs left. failover.c and the data path call in here; all functions
 * run with the connection lock held.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../log.h"
#include "../probes.h"
#include "conn.h"
#include "health.h"

#define RH_RATE_WIN_MS 50 /* a rate window lasts at least this long ... */
#define RH_RATE_WIN_REQS 4 /* ... and holds at least this many completions */
#define RH_FAIR_GIVE_UP_MS 10000 /* no fair-share mark this long after the first completion */

/* The lane that carries traffic after a move: an active one, the primary first. */
static struct rh_lane *carrier_lane(struct rh_conn *c)
{
	struct rh_lane *best = NULL;

	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *l = c->lanes[i];

		if (l->state == RH_LANE_ACTIVE && (!best || (l->primary && !best->primary))) {
			best = l;
		}
	}
	return best;
}

/* The one WARN line of a move (grep-able as "railhop ... failover:"): the pair that failed, why,
 * where the traffic went and the time from detection to what `reached` names. */
void rh_marks_report_move(struct rh_conn *c, const char *reached)
{
	struct rh_lane *l = carrier_lane(c);
	char to[64];

	if (l) {
		snprintf(to, sizeof(to), "%s -> peer NIC %d", rh_g.nics[l->lnic].ifname, l->rnic);
	} else {
		snprintf(to, sizeof(to), "no active lane");
	}
	WARN("conn %016llx (%s): failover: %s -> peer NIC %d failed (%s); now on %s, %llu ms from "
	     "detection to %s",
	     (unsigned long long)c->id, c->is_send ? "send" : "recv",
	     c->fo.cause_lnic >= 0 && c->fo.cause_lnic < rh_g.nnics ?
		     rh_g.nics[c->fo.cause_lnic].ifname :
		     "?",
	     c->fo.cause_rnic, c->fo.cause[0] ? c->fo.cause : "?", to,
	     (unsigned long long)(rh_now_ms() - c->fo.t_detect_ms), reached);
}

uint64_t rh_marks_cpu_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) < 0) {
		return 0;
	}
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void rh_marks_decision(struct rh_conn *c, struct rh_lane *l, uint64_t cpu_ns)
{
	uint64_t now = rh_now_ns();

	RH_PROBE5(move_decision, c->id, l->id, l->standby, now - c->fo.t_detect_ns, cpu_ns);
	INFO("conn %016llx (%s): move decision: lane %u %s -> peer NIC %d (%s), %.3f ms after "
	     "detection, %.1f us of CPU",
	     (unsigned long long)c->id, c->is_send ? "send" : "recv", l->id,
	     rh_g.nics[l->lnic].ifname, l->rnic, l->standby ? "warm standby" : "new lane",
	     (now - c->fo.t_detect_ns) / 1e6, cpu_ns / 1e3);
}

void rh_marks_first_post(struct rh_conn *c, struct rh_lane *l, bool is_data)
{
	uint64_t now = rh_now_ns();

	l->await_post = false;
	RH_PROBE5(move_first_post, c->id, l->id, l->standby, now - c->fo.t_detect_ns,
		  now - l->t_decide_ns);
	INFO("conn %016llx (%s): move first post: lane %u (%s) %s, %.3f ms after detection, "
	     "%.3f ms after the decision",
	     (unsigned long long)c->id, c->is_send ? "send" : "recv", l->id,
	     l->standby ? "warm standby" : "new lane", is_data ? "data" : "control",
	     (now - c->fo.t_detect_ns) / 1e6, (now - l->t_decide_ns) / 1e6);
}

void rh_marks_first_completion(struct rh_conn *c)
{
	if (c->fo.report_pending) {
		c->fo.report_pending = false;
		rh_marks_report_move(c, "the first completion");
	}
}

/* A move of this connection starts (its detection here, or the peer's word): the timing
 * marks and the WARN line's cause start here; l is the lane it leaves (NULL: unknown). */
void rh_marks_start(struct rh_conn *c, struct rh_lane *l, int err, const char *why)
{
	c->fo.t_detect_ns = rh_now_ns();
	c->fo.cause_err = err < 0 ? -err : err;
	snprintf(c->fo.mark_cause, sizeof(c->fo.mark_cause), "%s", why);
	c->fo.from_lnic = l ? l->lnic : c->lnic_orig;
	c->fo.from_rnic = l ? l->rnic : c->rnic_orig;
	c->fo.await_fair = false;
	c->fo.failback_pending = false;
	c->fo.t_win_ns = c->fo.t_detect_ns;
	c->fo.win_bytes = 0;
	c->fo.win_reqs = 0;
}

/* The move is applied (sender: RESUME taken and the replay queued; receiver: RESUME record
 * sent): FAILOVER_END waits for the first request completed after it (rh_marks_completed). */
void rh_marks_moved(struct rh_conn *c, uint64_t bytes_replayed)
{
	c->fo.await_first = true;
	c->fo.await_fair = false;
	c->fo.t_moved_ns = rh_now_ns();
	c->fo.bytes_replayed = bytes_replayed;
}

void rh_marks_replay_progress(struct rh_conn *c, struct rh_sreq *s, bool acked)
{
	if (s->replay_unsent && (acked || s->next_chunk >= s->nchunks)) {
		s->replay_unsent = false;
		if (--c->fo.replay_unsent == 0) {
			RH_PROBE3(replay_sent, c->id, c->epoch, rh_now_ns() - c->fo.t_detect_ns);
			INFO("conn %016llx (send): replay sent, %.1f ms after detection",
			     (unsigned long long)c->id, (rh_now_ns() - c->fo.t_detect_ns) / 1e6);
		}
	}
	if (acked && s->replay_unacked) {
		s->replay_unacked = false;
		if (--c->fo.replay_unacked == 0) {
			RH_PROBE3(replay_acked, c->id, c->epoch, rh_now_ns() - c->fo.t_detect_ns);
			INFO("conn %016llx (send): replay acknowledged, %.1f ms after detection",
			     (unsigned long long)c->id, (rh_now_ns() - c->fo.t_detect_ns) / 1e6);
		}
	}
}

/* Local NICs this connection can use: up, and not the one a move left while no lane of the
 * connection is back on it (a blackholed NIC keeps its carrier). */
static int usable_nics(struct rh_conn *c, int left)
{
	int n = 0;

	for (int i = 0; i < rh_g.nnics; i++) {
		bool used = false;

		if (!rh_nic_is_up(i)) {
			continue;
		}
		for (int k = 0; k < c->nlanes && i == left; k++) {
			used |= c->lanes[k]->state == RH_LANE_ACTIVE && c->lanes[k]->lnic == i;
		}
		n += i != left || used;
	}
	return n;
}

static void peer_name(struct rh_conn *c, int rnic, char *out, size_t len)
{
	struct in_addr a = { .s_addr = rnic >= 0 && rnic < c->nrnics ? c->rnics[rnic].ipv4 : 0 };

	if (!inet_ntop(AF_INET, &a, out, (socklen_t)len)) {
		snprintf(out, len, "?");
	}
}

static void first_completion(struct rh_conn *c, uint64_t now)
{
	uint64_t dur = now - c->fo.t_detect_ns;
	int before = c->fo.base_nics, after = usable_nics(c, c->fo.from_lnic);
	char peer[INET_ADDRSTRLEN];

	c->fo.await_first = false;
	c->fo.t_first_ns = now;
	RH_PROBE4(failover_end, c->id, c->epoch, rh_conn_active_lanes(c), dur);
	rh_conn_lane_event(c, NULL, RH_EVT_FAILOVER_END, 0, dur, c->fo.bytes_replayed);
	peer_name(c, c->fo.from_rnic, peer, sizeof(peer));
	/* INFO: the move's WARN line is rh_marks_report_move()'s */
	INFO("conn %016llx (%s): failover off %s -> peer %s (NIC %d), cause: %s (%s); first "
	     "completion %.1f ms after detection (moved at +%.1f ms, %llu bytes replayed, %d "
	     "lane(s))",
	     (unsigned long long)c->id, c->is_send ? "send" : "recv",
	     rh_g.nics[c->fo.from_lnic].ifname, peer, c->fo.from_rnic, c->fo.mark_cause,
	     strerror(c->fo.cause_err), dur / 1e6, (c->fo.t_moved_ns - c->fo.t_detect_ns) / 1e6,
	     (unsigned long long)c->fo.bytes_replayed, rh_conn_active_lanes(c));
	/* Fair share: this connection's part of the NICs left, 90 % of the baseline scaled by
	 * usable NICs after / before (no baseline yet: no mark). */
	c->fo.await_fair = c->fo.base_Bps > 0 && before > 0 && after > 0;
	if (c->fo.await_fair) {
		c->fo.target_Bps = c->fo.base_Bps * 9 / 10 * (uint64_t)after / (uint64_t)before;
	}
	c->fo.t_win_ns = now;
	c->fo.win_bytes = 0;
	c->fo.win_reqs = 0;
}

static void rate_window(struct rh_conn *c, uint64_t now, uint64_t rate)
{
	if (c->fo.await_fair) {
		if (rate >= c->fo.target_Bps) {
			uint64_t dur = now - c->fo.t_detect_ns;

			c->fo.await_fair = false;
			RH_PROBE4(fair_share, c->id, c->epoch, dur, rate);
			rh_conn_lane_event(c, NULL, RH_EVT_FAIR_SHARE, 0, dur, 0);
			INFO("conn %016llx (%s): at fair share %.1f ms after detection (%.1f ms after "
			     "the first completion): %.1f MB/s >= %.1f MB/s",
			     (unsigned long long)c->id, c->is_send ? "send" : "recv", dur / 1e6,
			     (now - c->fo.t_first_ns) / 1e6, rate / 1e6, c->fo.target_Bps / 1e6);
		} else if (now - c->fo.t_first_ns > RH_FAIR_GIVE_UP_MS * 1000000ull) {
			c->fo.await_fair = false;
			INFO("conn %016llx: not back at fair share %d ms after the first completion "
			     "(%.1f MB/s < %.1f MB/s)",
			     (unsigned long long)c->id, RH_FAIR_GIVE_UP_MS, rate / 1e6,
			     c->fo.target_Bps / 1e6);
		}
		return;
	}
	if (!c->fo.active && !c->fo.await_first) {
		c->fo.base_Bps = c->fo.base_Bps ? c->fo.base_Bps - c->fo.base_Bps / 8 + rate / 8 :
						  rate;
		c->fo.base_nics = usable_nics(c, -1);
	}
}

void rh_marks_completed(struct rh_conn *c, uint64_t bytes)
{
	uint64_t now = rh_now_ns();

	if (c->fo.await_first && !c->fo.active) {
		first_completion(c, now);
		return; /* the window starts here */
	}
	if (c->fo.failback_pending) {
		char peer[INET_ADDRSTRLEN];

		c->fo.failback_pending = false;
		peer_name(c, c->rnic_orig, peer, sizeof(peer));
		INFO("conn %016llx (send): fail-back to %s -> peer %s (NIC %d), cause: the original "
		     "pair answers again; first completion %.1f ms after the fail-back",
		     (unsigned long long)c->id, rh_g.nics[c->lnic_orig].ifname, peer, c->rnic_orig,
		     (now - c->fo.t_failback_ns) / 1e6);
	}
	if (!c->fo.t_win_ns) {
		c->fo.t_win_ns = now;
		return;
	}
	c->fo.win_bytes += bytes;
	c->fo.win_reqs++;
	if (c->fo.win_reqs >= RH_RATE_WIN_REQS &&
	    now - c->fo.t_win_ns >= RH_RATE_WIN_MS * 1000000ull) {
		rate_window(
			c, now,
			(uint64_t)((double)c->fo.win_bytes * 1e9 / (double)(now - c->fo.t_win_ns)));
		c->fo.t_win_ns = now;
		c->fo.win_bytes = 0;
		c->fo.win_reqs = 0;
	}
}
