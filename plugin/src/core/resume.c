/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The resume protocol (design: FAILREQ -> RESUME -> replay): the receiver answers a sender's
 * FAILREQ with its completion record (rh_resume_on_failreq), the sender applies a RESUME in
 * named phases (rh_resume_apply): stale ones dropped, the dead lanes fenced, retired lanes taken
 * back, the receiver's lost clear-to-send records taken, every unacknowledged request confirmed
 * or queued for replay from the first chunk the receiver lacks. Detection, backups and
 * fail-back are failover.c's. All functions run with the connection lock held.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../log.h"
#include "../probes.h"
#include "conn.h"
#include "health.h"
#include "sched.h"

static int cmp_sreq(const void *a, const void *b)
{
	const struct rh_sreq *x = *(struct rh_sreq *const *)a, *y = *(struct rh_sreq *const *)b;

	if (x->seq != y->seq) {
		return x->seq < y->seq ? -1 : 1;
	}
	return x->slot - y->slot;
}

void rh_resume_on_failreq(struct rh_conn *c, const struct rh_hdr *h, const uint8_t *p)
{
	uint32_t dead[RH_MAX_DEAD];
	int ndead = 0;

	if (rh_dead_get(p, h->len, &ndead, dead) < 0) {
		return;
	}
	for (int k = 0; k < ndead; k++) {
		for (int i = 0; i < c->nlanes; i++) {
			if (c->lanes[i]->id == dead[k] && c->lanes[i]->state != RH_LANE_DEAD) {
				/* The peer timed out on it: this NIC's agent hears of it too, marked
				 * EREMOTEIO (seen by the peer: the fault may be at its end, so it is
				 * suspicion of this NIC, not evidence against it). */
				rh_conn_lane_event(c, c->lanes[i], RH_EVT_LANE_TIMEOUT, -EREMOTEIO,
						   0, 0);
				rh_conn_fence_lane(c, c->lanes[i]);
			}
		}
	}
	if (!rh_conn_epoch_take(c, h->epoch) || rh_conn_epoch_bump(c) < 0) {
		return; /* rh_core_rx_ctrl checked the bound: only exhaustion gets here */
	}
	rh_conn_queue_resume(c, true);
	if (!c->fo.active && !c->fo.await_first) {
		/* moved because the peer detected it: this side's marks start here */
		rh_marks_start(c, ndead ? rh_conn_lane_by_id(c, dead[0]) : NULL, -EREMOTEIO,
			       "the peer lost the lane");
	}
	if (!c->fo.active) {
		RH_PROBE4(replay_queued, c->id, c->epoch, rh_conn_active_lanes(c), (uint64_t)0);
		rh_marks_moved(c, 0);
	}
	INFO("conn %016llx (recv): peer asked to resume, epoch %u", (unsigned long long)c->id,
	     c->epoch);
}

/* Replay of s starts at its first chunk the receiver has not placed; the receiver's runs are
 * kept only when they fit the message (a record from a confused peer replays everything). */
static void take_placed_runs(struct rh_conn *c, struct rh_sreq *s, const struct rh_run *runs,
			     int nruns)
{
	uint64_t end = nruns ? (uint64_t)runs[nruns - 1].start + runs[nruns - 1].count : 0;

	(void)c;
	s->nskip = 0;
	if (nruns > 0 && end <= s->nchunks && rh_sched_skip_placed(runs, nruns, 0) < s->nchunks) {
		memcpy(s->skip, runs, sizeof(runs[0]) * (size_t)nruns);
		s->nskip = nruns;
	}
}

static uint64_t replay_bytes(struct rh_conn *c, struct rh_sreq *s)
{
	uint64_t skipped = rh_sched_runs_chunks(s->skip, s->nskip) * c->chunk;

	s->next_chunk = rh_sched_skip_placed(s->skip, s->nskip, 0);
	/* every chunk is full but the last one, which a run may cover */
	if (s->nskip &&
	    (uint64_t)s->skip[s->nskip - 1].start + s->skip[s->nskip - 1].count == s->nchunks) {
		skipped -= s->nchunks * c->chunk - s->size;
	}
	return s->size - skipped;
}

/*
 * A RESUME on the sender, in phases. rh_resume_apply() reads the record and runs them in order;
 * each phase is one step of the move as the design describes it.
 */

/* What applying a RESUME did, for its marks and log line. */
struct resume_outcome {
	int acked; /* requests the receiver confirmed complete */
	int replayed; /* requests queued again */
	uint64_t bytes; /* bytes they will send again */
};

/* Phase 0: a RESUME older than the last one applied, or the same one again without a FAILREQ
 * of ours waiting for it, is stale. */
static bool resume_is_stale(const struct rh_conn *c, const struct rh_hdr *h)
{
	return h->epoch < c->resume_epoch || (h->epoch == c->resume_epoch && !c->await_resume);
}

/* Phase 1: the lanes the receiver names dead are fenced (reported to our agent as a timeout
 * seen by the peer); losing the primary schedules its fail-back. */
static void resume_fence_dead(struct rh_conn *c, const struct rh_resume *r)
{
	if (!c->fo.active && !c->fo.await_first) {
		/* the receiver moved on its own: this side's marks start here */
		rh_marks_start(c, r->ndead ? rh_conn_lane_by_id(c, r->dead[0]) : NULL, -EREMOTEIO,
			       "the peer lost the lane");
	}
	for (int k = 0; k < r->ndead; k++) {
		for (int i = 0; i < c->nlanes; i++) {
			struct rh_lane *l = c->lanes[i];

			if (l->id != r->dead[k] || l->state == RH_LANE_DEAD) {
				continue;
			}
			rh_conn_lane_event(c, l, RH_EVT_LANE_TIMEOUT, -EREMOTEIO, 0, 0);
			rh_conn_fence_lane(c, l);
			if (l->primary) {
				c->fo.primary_lost = true;
				c->fo.t_next_failback_ms = rh_now_ms() + (uint64_t)c->fo.backoff_ms;
			}
		}
	}
}

/* Phase 2: the peer lost the primary of a fail-back in progress: what it retired carries on. */
static void resume_take_back_retired(struct rh_conn *c)
{
	if (c->fo.primary_lost && !rh_fo_primary_alive(c) && rh_fo_reactivate_retired(c) > 0) {
		INFO("conn %016llx (send): the fail-back's lane was lost: retired lanes carry "
		     "traffic again",
		     (unsigned long long)c->id);
		rh_conn_pick_ctrl_lane(c);
	}
}

/* Phase 3: true when this RESUME must wait. The receiver moved on its own while our FAILREQ
 * was on its way; it will answer that with a newer epoch. Replaying now would put chunks on
 * the wire at an epoch about to be dropped (and, on one-sided lanes, writes the next resume's
 * fence must wait for), so only its dead lanes are taken and the answer awaited (the FAILREQ is
 * re-sent after 300 ms if it was lost). */
static bool resume_awaits_answer(struct rh_conn *c, const struct rh_hdr *h)
{
	if (!(c->await_resume && c->fo.failreq_out && h->aux != RH_RESUME_ANSWER)) {
		return false;
	}
	INFO("conn %016llx (send): RESUME at epoch %u while our FAILREQ is pending: waiting "
	     "for its answer",
	     (unsigned long long)c->id, h->epoch);
	return true;
}

/* Phase 4: clear-to-send records of the receiver's outstanding receives that this side has
 * not seen (lost with the lane) are taken, keeping matches already made for them. */
static void resume_take_cts(struct rh_conn *c, const struct rh_resume *r)
{
	for (int i = 0; i < r->nout; i++) {
		struct rh_cts cts = r->out[i];
		struct rh_cts_slot *s = &c->cts[cts.seq % RH_RING];
		uint8_t matched = 0;

		if (cts.seq < c->cts_base || (s->present && s->cts.seq == cts.seq) ||
		    cts.seq >= c->cts_base + RH_RING) {
			continue;
		}
		for (int k = 0; k < cts.n; k++) {
			struct rh_sreq *q = &c->sreqs[(cts.seq % RH_RING) * RH_MAX_RECVS + k];

			if (q->used && q->seq == cts.seq) {
				matched |= (uint8_t)(1u << k);
			}
		}
		s->cts = cts;
		s->present = true;
		s->matched = matched;
		if (cts.seq + 1 > c->cts_next) {
			c->cts_next = cts.seq + 1;
		}
	}
}

bool rh_resume_confirms(const struct rh_resume *r, const struct rh_sreq *s, int *k)
{
	*k = -1;
	for (int i = 0; i < r->nout; i++) {
		if (r->out[i].seq == s->seq) {
			*k = i;
		}
	}
	return *k >= 0 ? (r->done[*k] & (1u << s->slot)) != 0 : s->seq < r->next_seq;
}

/* Phase 5: every unacknowledged request is either confirmed complete by the record or queued
 * again, in (seq, slot) order, from its first chunk the receiver does not hold. */
static void resume_queue_replay(struct rh_conn *c, const struct rh_resume *r,
				struct resume_outcome *out)
{
	struct rh_sreq *list[RH_RING * RH_MAX_RECVS];
	int n = 0;

	c->qhead = c->qtail = NULL;
	for (int i = 0; i < RH_RING * RH_MAX_RECVS; i++) {
		struct rh_sreq *s = &c->sreqs[i];
		int k;

		s->queued = false;
		if (!s->used || s->acked) {
			continue;
		}
		s->replay_unsent = s->replay_unacked = false;
		if (rh_resume_confirms(r, s, &k)) {
			s->acked = true;
			out->acked++;
			continue;
		}
		if (k >= 0) {
			take_placed_runs(c, s, r->runs[k][s->slot], r->nruns[k][s->slot]);
		}
		out->bytes += replay_bytes(c, s);
		list[n++] = s;
	}
	qsort(list, n, sizeof(list[0]), cmp_sreq);
	c->fo.replay_unsent = c->fo.replay_unacked = n;
	if (n == 0) {
		INFO("conn %016llx (send): nothing to replay", (unsigned long long)c->id);
	}
	for (int i = 0; i < n; i++) {
		list[i]->replay_unsent = list[i]->replay_unacked = true;
		list[i]->qnext = NULL;
		list[i]->queued = true;
		if (c->qtail) {
			c->qtail->qnext = list[i];
		} else {
			c->qhead = list[i];
		}
		c->qtail = list[i];
		out->replayed++;
	}
}

/* Phase 6: the move is applied: its marks, its log line, and the lanes woken. */
static void resume_applied(struct rh_conn *c, const struct resume_outcome *out)
{
	c->await_resume = false;
	if (c->fo.active) {
		/* Requests the receiver confirmed complete now; otherwise the first ACK does. */
		c->fo.report_pending = true;
		if (out->acked > 0 || out->replayed == 0) {
			rh_marks_first_completion(c);
		}
	}
	c->fo.active = false;
	c->fo.notify = false;
	RH_PROBE4(replay_queued, c->id, c->epoch, rh_conn_active_lanes(c), out->bytes);
	rh_marks_moved(c, out->bytes);
	INFO("conn %016llx (send): RESUME applied at epoch %u: %d confirmed, %d replayed (%llu "
	     "bytes) on %d lanes",
	     (unsigned long long)c->id, c->epoch, out->acked, out->replayed,
	     (unsigned long long)out->bytes, rh_conn_active_lanes(c));
	rh_conn_kick_data(c);
}

int rh_resume_apply(struct rh_conn *c, const struct rh_hdr *h, const uint8_t *p)
{
	struct resume_outcome out = { 0 };
	struct rh_resume *r = NULL;
	int rc = 0;

	if (resume_is_stale(c, h)) {
		goto out;
	}
	r = malloc(sizeof(*r)); /* 64 KiB: too large for the I/O thread's stack */
	if (!r) {
		rc = -ENOMEM;
		goto out;
	}
	if (rh_resume_get(p, h->len, r) < 0) {
		WARN("conn %016llx (send): malformed RESUME record ignored",
		     (unsigned long long)c->id);
		rc = -EPROTO;
		goto out;
	}
	resume_fence_dead(c, r);
	if (!rh_conn_epoch_take(c, h->epoch)) {
		goto out; /* out of bounds: rh_core_rx_ctrl refuses such frames before this */
	}
	resume_take_back_retired(c);
	if (resume_awaits_answer(c, h)) {
		goto out;
	}
	c->fo.failreq_out = false;
	c->resume_epoch = h->epoch;
	rh_standby_answered(c, NULL); /* the peer answered the move */
	resume_take_cts(c, r);
	resume_queue_replay(c, r, &out);
	resume_applied(c, &out);
out:
	free(r);
	return rc;
}
