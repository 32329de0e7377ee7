/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stateful core through its seams: a fake transport (struct lane_ops) and fake control-plane
 * hooks (struct rh_ctl_hooks) record what the core asks of them.
 *  - conn.c: stream attach/detach (slot checks, the io reference, the lane state's release,
 *    connection references), ids;
 *  - failover.c: a lane failure with the agent's plan (events in order, the lane fenced, the
 *    backup on the planned pair), the same failure standalone (no hooks: the core ranks alone),
 *    the timing marks of a move (FAILOVER_END at the first completion, then FAIR_SHARE);
 *  - health.c: a NIC marked down moves its lanes, sources hold a NIC down independently.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "conn_fixture.h"
#include "core/auth.h"
#include "core/conn.h"
#include "core/health.h"
#include "core/sched.h"
#include "core/wire.h"
#include "param.h"

/* --- the fake transport --- */

static struct {
	int opens, fences, probes;
	int open_lnic[64], open_rnic[64];
	uint32_t fenced_id[64];
	int fail_opens; /* that many next opens fail at once with open_err */
	int open_err;
} tp;

static int fk_start(int nthreads)
{
	(void)nthreads;
	return 0;
}

static int fk_listen(int nic)
{
	rh_g.nics[nic].port = htons((uint16_t)(4000 + nic));
	return 0;
}

static int fk_open(struct rh_lane *lane, const struct rh_hello *hello, uint64_t conn_id,
		   uint32_t epoch, uint32_t ip, uint16_t port)
{
	(void)hello;
	(void)conn_id;
	(void)epoch;
	(void)ip;
	(void)port;
	if (tp.opens < 64) {
		tp.open_lnic[tp.opens] = lane->lnic;
		tp.open_rnic[tp.opens] = lane->rnic;
	}
	tp.opens++;
	if (tp.fail_opens > 0) {
		tp.fail_opens--;
		return tp.open_err;
	}
	lane->tp = calloc(1, sizeof(struct rh_lane_streams));
	return lane->tp ? 0 : -ENOMEM;
}

static void fk_kick(struct rh_lane *lane)
{
	(void)lane;
}

/* Releases at once: what a transport does asynchronously once its I/O stopped. */
static void fk_fence(struct rh_lane *lane)
{
	if (tp.fences < 64) {
		tp.fenced_id[tp.fences] = lane->id;
	}
	tp.fences++;
	free(lane->tp);
	lane->tp = NULL;
}

static bool fk_stalled(struct rh_lane *lane, uint64_t now_ms, int timeout_ms)
{
	(void)lane;
	(void)now_ms;
	(void)timeout_ms;
	return false;
}

static uint64_t fk_progress(struct rh_lane *lane)
{
	(void)lane;
	return 0;
}

static int fk_ports(struct rh_lane *lane, uint16_t *lports, uint16_t *rports, int max)
{
	(void)lane;
	(void)lports;
	(void)rports;
	(void)max;
	return 0;
}

static int fk_probe(struct rh_conn *conn, int lnic, uint32_t ip, uint16_t port, uint64_t cookie,
		    int timeout_ms)
{
	(void)conn;
	(void)lnic;
	(void)ip;
	(void)port;
	(void)cookie;
	(void)timeout_ms;
	tp.probes++;
	return 0;
}

static const struct lane_ops fake_ops = {
	.name = "fake",
	.start = fk_start,
	.listen = fk_listen,
	.open = fk_open,
	.kick = fk_kick,
	.fence = fk_fence,
	.stalled = fk_stalled,
	.progress = fk_progress,
	.ports = fk_ports,
	.probe = fk_probe,
};

/* --- the fake control plane --- */

static struct {
	int n;
	int type[64], lnic[64], err[64];
	uint64_t dur[64];
	struct rh_plan_entry plan[4];
	int nplan;
} ctl;

static void hk_lane_event(int type, uint64_t conn_id, uint32_t epoch, uint32_t lane, int lnic,
			  int err, uint64_t duration_ns, const struct rh_lane_info *info)
{
	(void)conn_id;
	(void)epoch;
	(void)lane;
	(void)info;
	if (ctl.n < 64) {
		ctl.dur[ctl.n] = duration_ns;
		ctl.type[ctl.n] = type;
		ctl.lnic[ctl.n] = lnic;
		ctl.err[ctl.n] = err;
	}
	ctl.n++;
}

static int hk_plan_for(int lnic, struct rh_plan_entry *out, int max)
{
	int n = 0;

	for (; lnic == 0 && n < ctl.nplan && n < max; n++) {
		out[n] = ctl.plan[n];
	}
	return n;
}

static bool hk_suspect(int nic)
{
	(void)nic;
	return false;
}

static const struct rh_ctl_hooks hooks = {
	.lane_event = hk_lane_event,
	.plan_for = hk_plan_for,
	.suspect = hk_suspect,
};

/* --- fixtures --- */

#define NNICS 3

static void setup_nics(void)
{
	rh_g.nnics = NNICS;
	EXPECT_EQ(rh_core_register_ops(&fake_ops), 0);
	for (int i = 0; i < NNICS; i++) {
		struct rh_nic *n = &rh_g.nics[i];

		memset(n, 0, sizeof(*n));
		snprintf(n->ifname, sizeof(n->ifname), "fk%d", i);
		n->ipv4 = htonl(0x0a000001u + (uint32_t)i);
		n->rail = 0;
		n->numa = -1;
		n->up = true;
		fk_listen(i);
	}
}

static int find_event(int from, int type)
{
	for (int i = from; i < ctl.n && i < 64; i++) {
		if (ctl.type[i] == type) {
			return i;
		}
	}
	return -1;
}

/* Lane id's state, or -1 when no lane has that id any more (a dead lane's slot is reused). */
static int lane_state(struct rh_conn *c, uint32_t id)
{
	for (int i = 0; i < c->nlanes; i++) {
		if (c->lanes[i]->id == id) {
			return c->lanes[i]->state;
		}
	}
	return -1;
}

/* --- conn.c --- */

static int released;

static void count_release(void *state)
{
	(void)state;
	released++;
}

static void test_stream_attach(void)
{
	struct rh_conn *c = rh_conn_new(false);
	struct rh_lane *l;
	struct rh_lane_streams *st;
	int a, b, x;

	EXPECT(c != NULL);
	if (!c) {
		return;
	}
	pthread_mutex_lock(&c->mu);
	l = rh_conn_add_lane(c, 1, 0, 0, 2, false);
	pthread_mutex_unlock(&c->mu);
	EXPECT_EQ(atomic_load(&c->refs), 1);

	/* Each attach consumes the reference rh_core_hello() took: kept on success, dropped on
	 * failure. */
	rh_core_conn_get(c);
	EXPECT_EQ(rh_core_stream_attach(l, 0, 2, &a, sizeof(*st) + 64, false), 0);
	st = l->tp;
	EXPECT(st != NULL && st->s[0] == &a && st->live == 1);
	EXPECT_EQ(atomic_load(&c->refs), 2);
	rh_core_conn_get(c);
	EXPECT_EQ(rh_core_stream_attach(l, 0, 2, &x, sizeof(*st), false), -EPROTO); /* taken */
	rh_core_conn_get(c);
	EXPECT_EQ(rh_core_stream_attach(l, 2, 2, &x, sizeof(*st), false), -EPROTO); /* >= max */
	rh_core_conn_get(c);
	EXPECT_EQ(rh_core_stream_attach(l, -1, 2, &x, sizeof(*st), false), -EPROTO);
	EXPECT_EQ(atomic_load(&c->refs), 2);
	rh_core_conn_get(c);
	EXPECT_EQ(rh_core_stream_attach(l, 1, 2, &b, sizeof(*st), true), 0);
	EXPECT(l->tp == st && st->s[1] == &b && st->live == 2);
	EXPECT_EQ(atomic_load(&c->active_io), 1);
	EXPECT_EQ(atomic_load(&c->refs), 3);

	/* A stream that does not hold the slot clears nothing but drops its reference. */
	rh_core_conn_get(c);
	rh_core_stream_detach(c, l, 1, &x, count_release);
	EXPECT(l->tp == st && st->s[1] == &b && st->live == 2);
	rh_core_stream_detach(c, l, 0, &a, count_release);
	EXPECT(l->tp == st && st->s[0] == NULL && st->live == 1);
	EXPECT_EQ(released, 0);
	rh_core_stream_detach(c, l, 1, &b, count_release);
	EXPECT(l->tp == NULL);
	EXPECT_EQ(released, 1);
	EXPECT_EQ(atomic_load(&c->refs), 1);
	rh_core_io_exit(c);

	/* Only an OPENING lane takes streams; io refused once the user closed the connection. */
	pthread_mutex_lock(&c->mu);
	l->state = RH_LANE_ACTIVE;
	pthread_mutex_unlock(&c->mu);
	rh_core_conn_get(c);
	EXPECT_EQ(rh_core_stream_attach(l, 0, 2, &a, sizeof(*st), false), -EPROTO);
	pthread_mutex_lock(&c->mu);
	l->state = RH_LANE_OPENING;
	pthread_mutex_unlock(&c->mu);
	atomic_store(&c->closed, true);
	rh_core_conn_get(c);
	EXPECT_EQ(rh_core_stream_attach(l, 0, 2, &a, sizeof(*st), true), -ECONNABORTED);
	EXPECT(l->tp == NULL);
	EXPECT_EQ(atomic_load(&c->active_io), 0);
	EXPECT_EQ(atomic_load(&c->refs), 1);
	rh_core_conn_put(c);
}

static void test_ids(void)
{
	uint64_t first = rh_random_id();
	bool differ = false;

	for (int i = 0; i < 1000; i++) {
		uint64_t v = rh_random_id();

		EXPECT(v != 0 && v != UINT64_MAX);
		differ |= v != first;
	}
	EXPECT(differ);
}

/* --- failover.c --- */

static void test_failover_with_plan(void)
{
	struct rh_lane *l;
	struct rh_conn *c = fixture_ready_conn(true, NNICS, &l);
	int ev0 = ctl.n, opens0 = tp.opens, fences0 = tp.fences, e1, e2;

	EXPECT(c != NULL && l != NULL);
	if (!c || !l) {
		return;
	}
	ctl.nplan = 1;
	ctl.plan[0] = (struct rh_plan_entry){ .lnic = 1, .remote_rail = -1, .weight = 10000 };
	pthread_mutex_lock(&c->mu);
	rh_fo_lane_failed(c, l, -ETIMEDOUT, "test: no progress");
	EXPECT(lane_state(c, 0) == RH_LANE_DEAD || lane_state(c, 0) == -1);
	EXPECT_EQ(tp.fences, fences0 + 1);
	EXPECT_EQ(tp.fenced_id[fences0], 0);
	EXPECT_EQ(c->err, 0);
	EXPECT(c->fo.active);
	EXPECT(c->await_resume); /* the sender holds new chunks until the peer's RESUME */
	EXPECT(c->fo.bad_until_ms[0][0] > rh_now_ms());
	EXPECT(c->fo.primary_lost);
	pthread_mutex_unlock(&c->mu);
	/* The lane's timeout is reported before the failover starts, both on the failed NIC. */
	e1 = find_event(ev0, RH_EVT_LANE_TIMEOUT);
	e2 = find_event(ev0, RH_EVT_FAILOVER_START);
	EXPECT(e1 >= 0 && e2 > e1);
	EXPECT(e1 >= 0 && ctl.lnic[e1] == 0 && ctl.err[e1] == -ETIMEDOUT);
	EXPECT(e2 >= 0 && ctl.lnic[e2] == 0);
	/* The backup goes to the plan's local NIC, paired with the original remote NIC. */
	EXPECT(tp.opens > opens0);
	EXPECT_EQ(tp.open_lnic[opens0], 1); /* alone: (0, peer 1) */
	EXPECT_EQ(tp.open_rnic[opens0], 0);
	ctl.nplan = 0;
	fixture_drop_conn(c);
}

static void test_failover_standalone(void)
{
	struct rh_lane *l;
	struct rh_conn *c = fixture_ready_conn(true, NNICS, &l);
	int ev0 = ctl.n, opens0 = tp.opens;

	EXPECT(c != NULL && l != NULL);
	if (!c || !l) {
		return;
	}
	rh_health_set_hooks(NULL);
	pthread_mutex_lock(&c->mu);
	rh_fo_lane_failed(c, l, -EIO, "test: I/O error");
	EXPECT_EQ(c->err, 0);
	EXPECT(c->fo.active);
	pthread_mutex_unlock(&c->mu);
	EXPECT_EQ(ctl.n, ev0); /* no control plane: nothing reported */
	/* The core ranks alone: backup lanes, none on the failed pair (an I/O error marks it bad;
	 * a reset would not). */
	EXPECT(tp.opens > opens0);
	for (int i = opens0; i < tp.opens && i < 64; i++) {
		EXPECT(tp.open_lnic[i] != 0 || tp.open_rnic[i] != 0);
	}
	rh_health_set_hooks(&hooks);
	fixture_drop_conn(c);
}

/* FAILOVER_END is the first request completed after the move, not the move itself; FAIR_SHARE
 * follows when the completion rate is back to the baseline's share of the usable NICs. The
 * receiver's side: its RESUME record goes out when a backup lane is up. */
static void test_move_timing_marks(void)
{
	struct rh_lane *l, *b = NULL;
	struct rh_conn *c = fixture_ready_conn(false, NNICS, &l);
	struct timespec pause = { .tv_nsec = 2000000 };
	uint64_t deadline;
	int e_end, e_fair = -1;

	EXPECT(c != NULL && l != NULL);
	if (!c || !l) {
		return;
	}
	ctl.n = 0;
	pthread_mutex_lock(&c->mu);
	c->fo.base_Bps = 1000; /* a baseline far below any rate below: fair share at once */
	c->fo.base_nics = NNICS;
	rh_fo_lane_failed(c, l, -ETIMEDOUT, "test: no progress");
	EXPECT(c->fo.active);
	for (int i = 0; i < c->nlanes && !b; i++) {
		b = c->lanes[i]->state == RH_LANE_OPENING ? c->lanes[i] : NULL;
	}
	EXPECT(b != NULL);
	if (b) {
		b->state = RH_LANE_ACTIVE; /* its handshake completed */
		rh_fo_lane_up(c, b);
	}
	EXPECT(!c->fo.active); /* RESUME record sent: moved */
	EXPECT(c->fo.await_first);
	EXPECT_EQ(find_event(0, RH_EVT_FAILOVER_END), -1); /* nothing completed yet */
	rh_marks_completed(c, 1u << 19);
	e_end = find_event(0, RH_EVT_FAILOVER_END);
	EXPECT(e_end >= 0 && ctl.dur[e_end] > 0 && ctl.lnic[e_end] == 0);
	EXPECT(!c->fo.await_first && c->fo.await_fair);
	/* the target: 90 % of the baseline x usable NICs after / before; the NIC the move left
	 * counts only while a lane of this connection is back on it (ranking alone may pair the
	 * same local NIC with another peer NIC) */
	EXPECT(b != NULL);
	if (b) {
		int after = b->lnic == 0 ? NNICS : NNICS - 1;

		EXPECT_EQ(c->fo.target_Bps, 1000u * 9 / 10 * (uint64_t)after / NNICS);
	}
	deadline = rh_now_ms() + 2000;
	while (e_fair < 0 && rh_now_ms() < deadline) {
		rh_marks_completed(c, 1u << 19);
		e_fair = find_event(0, RH_EVT_FAIR_SHARE);
		pthread_mutex_unlock(&c->mu);
		nanosleep(&pause, NULL);
		pthread_mutex_lock(&c->mu);
	}
	EXPECT(e_fair > e_end && ctl.dur[e_fair] >= ctl.dur[e_end]);
	EXPECT(!c->fo.await_fair);
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);
}

/* Soak seed 30855: past the escalation bound with no ACTIVE lane, but one lane's confirming
 * probe in flight (the pair was healthy, only slow) and another lane still opening, the core
 * failed the connection at once. Now those lanes get to their own deadlines (no new pair is
 * tried past the bound), and a hard cap behind those deadlines still ends it. */
static struct rh_conn *conn_with_lanes_in_flight(struct rh_lane **suspect, struct rh_lane **opening)
{
	struct rh_lane *l, *b[RH_MAX_LANES];
	struct rh_conn *c = fixture_ready_conn(true, NNICS, &l);
	int nb = 0;

	if (!c || !l) {
		return c;
	}
	pthread_mutex_lock(&c->mu);
	rh_fo_lane_failed(c, l, -ETIMEDOUT, "test: no progress");
	for (int i = 0; i < c->nlanes; i++) {
		if (c->lanes[i]->state == RH_LANE_OPENING) {
			b[nb++] = c->lanes[i];
		}
	}
	EXPECT(nb >= 2);
	*suspect = nb >= 2 ? b[0] : NULL;
	*opening = nb >= 2 ? b[1] : NULL;
	if (nb >= 2) {
		b[0]->state = RH_LANE_ACTIVE; /* it carried traffic, then stalled: probed now */
		rh_fo_confirm(c, b[0], "test: no progress");
		EXPECT_EQ(b[0]->state, RH_LANE_SUSPECT);
	}
	for (int i = 2; i < nb; i++) {
		rh_conn_fence_lane(c, b[i]);
	}
	pthread_mutex_unlock(&c->mu);
	return c;
}

static void test_escalation_waits_for_lanes_in_flight(void)
{
	struct rh_lane *s = NULL, *o = NULL;
	struct rh_conn *c = conn_with_lanes_in_flight(&s, &o);
	int opens0;

	EXPECT(c != NULL && s != NULL && o != NULL);
	if (!c || !s || !o) {
		return;
	}
	pthread_mutex_lock(&c->mu);
	c->fo.t_escalate_ms = rh_now_ms() - 1; /* a completion timeout since the last failure */
	opens0 = tp.opens;
	rh_fo_tick(c, rh_now_ms());
	EXPECT_EQ(c->err, 0);
	EXPECT_EQ(tp.opens, opens0); /* no new pair past the bound */
	EXPECT_EQ(s->state, RH_LANE_SUSPECT);
	EXPECT_EQ(o->state, RH_LANE_OPENING);
	/* The probe answers: the lane carries the traffic again, nothing was given up. */
	rh_fo_probe_done(c, s->probe_cookie, true);
	EXPECT_EQ(s->state, RH_LANE_ACTIVE);
	rh_fo_tick(c, rh_now_ms());
	EXPECT_EQ(c->err, 0);
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);

	/* The same lanes past the hard cap behind their deadlines: a clean error, no hang. */
	c = conn_with_lanes_in_flight(&s, &o);
	EXPECT(c != NULL && s != NULL);
	if (!c || !s) {
		return;
	}
	pthread_mutex_lock(&c->mu);
	c->fo.t_escalate_ms = rh_now_ms() - 2 * (uint64_t)rh_param.PROBE_TIMEOUT - 201;
	rh_fo_tick(c, rh_now_ms());
	EXPECT_EQ(c->err, -EHOSTUNREACH);
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);
}

/* Outside a move (its RESUME done), a lane failing while it opens (a fail-back's) with every
 * carrying lane under its confirming probe must not fail the connection on the last move's
 * stale escalation bound: the lanes in flight have their own deadlines. Before, the connection
 * was failed ("no compatible NIC pair left", 3 lanes in flight, the carrier-loss loop over
 * verbs). */
static void test_no_escalation_outside_a_move_with_lanes_in_flight(void)
{
	struct rh_lane *s = NULL, *o = NULL;
	struct rh_conn *c = conn_with_lanes_in_flight(&s, &o);

	EXPECT(c != NULL && s != NULL && o != NULL);
	if (!c || !s || !o) {
		if (c) {
			fixture_drop_conn(c);
		}
		return;
	}
	pthread_mutex_lock(&c->mu);
	c->fo.active = false; /* the move ended long ago */
	c->fo.t_escalate_ms = rh_now_ms() - 2 * (uint64_t)rh_param.PROBE_TIMEOUT - 1000;
	rh_fo_lane_failed(c, o, -ETIMEDOUT, "test: transport error while opening");
	EXPECT_EQ(c->err, 0);
	EXPECT_EQ(s->state, RH_LANE_SUSPECT);
	/* the probe fails: a move with a fresh bound, the connection still stands */
	rh_fo_probe_done(c, s->probe_cookie, false);
	EXPECT_EQ(c->err, 0);
	EXPECT(c->fo.active);
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);
}

/* Nothing left after a failure: every candidate pair opens at once. Found by the completion
 * timeout (most of the escalation budget spent), each handshake gets the probe timeout; found
 * at once (local NIC down), the usual 2x. Soak seed 30855 (ofi, loaded CI host): the move off a
 * NIC that went down gave the never-faulted rail 300 ms, its handshake took longer twice and
 * the connection was given up with that rail healthy. */
static void escalation_round_deadlines(int err, uint64_t want_ms)
{
	struct rh_lane *l = NULL;
	struct rh_conn *c = fixture_ready_conn(true, NNICS, &l);
	uint64_t t0;
	int opened = 0;

	EXPECT(c != NULL && l != NULL);
	if (!c || !l) {
		return;
	}
	pthread_mutex_lock(&c->mu);
	t0 = rh_now_ms();
	rh_fo_lane_failed(c, l, err, "test: the only lane");
	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *b = c->lanes[i];

		if (b->state == RH_LANE_OPENING && b->opener) {
			opened++;
			EXPECT(b->t_deadline_ms >= t0 + want_ms &&
			       b->t_deadline_ms <= rh_now_ms() + want_ms);
		}
	}
	EXPECT(opened >= 2); /* every other pair at once */
	EXPECT_EQ(c->err, 0);
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);
}

static void test_escalation_round_deadlines(void)
{
	escalation_round_deadlines(-ETIMEDOUT, (uint64_t)rh_param.PROBE_TIMEOUT);
	escalation_round_deadlines(-ENETDOWN, 2 * (uint64_t)rh_param.PROBE_TIMEOUT);
	escalation_round_deadlines(-ECONNRESET, 2 * (uint64_t)rh_param.PROBE_TIMEOUT);
}

/* The VM lab over verbs (completion timeout 8 s, probe timeout 10 s), a blackhole under load
 * (bench/vm_failover.py: 9 of 14 rounds escalated): the move's first round of backup handshakes
 * timed out at the probe timeout, past an escalation bound of one completion timeout, so no pair
 * was re-probed and the connection was given up with healthy rails left. The bound must cover
 * that round and one re-probe; the failed pair stays held off for the move (its 1 s hold-off
 * ran out during the round, and the ranking then tried it alone instead of re-probing every
 * pair); with nothing left after the re-probe it still escalates at once. */
static int fail_round(struct rh_conn *c, uint64_t took_ms)
{
	struct rh_lane *b[RH_MAX_LANES];
	int nb = 0;

	for (int i = 0; i < c->nlanes; i++) {
		if (c->lanes[i]->state == RH_LANE_OPENING && c->lanes[i]->opener) {
			b[nb++] = c->lanes[i];
		}
	}
	/* the round's time passed: every deadline of the move is that much nearer */
	c->fo.t_escalate_ms -= took_ms;
	for (int i = 0; i < RH_MAX_NICS; i++) {
		for (int j = 0; j < RH_MAX_NICS; j++) {
			uint64_t *u = &c->fo.bad_until_ms[i][j];

			*u = *u > took_ms ? *u - took_ms : 0;
		}
	}
	for (int i = 0; i < nb && !c->err; i++) {
		rh_fo_lane_failed(c, b[i], -ETIMEDOUT, "test: handshake timed out");
	}
	return nb;
}

static void test_escalation_bound_covers_a_reprobe(void)
{
	int ct = rh_param.COMPLETION_TIMEOUT, pt = rh_param.PROBE_TIMEOUT;
	struct rh_lane *l = NULL;
	struct rh_conn *c;
	int opens0;

	rh_param.COMPLETION_TIMEOUT = 8000;
	rh_param.PROBE_TIMEOUT = 10000;
	c = fixture_ready_conn(true, NNICS, &l);
	EXPECT(c != NULL && l != NULL);
	if (!c || !l) {
		goto out;
	}
	pthread_mutex_lock(&c->mu);
	rh_fo_lane_failed(c, l, -ETIMEDOUT, "test: no progress, probe failed"); /* found late */
	/* the first round: every handshake times out at the probe timeout (a tick late) */
	opens0 = tp.opens;
	EXPECT(fail_round(c, (uint64_t)rh_param.PROBE_TIMEOUT + 50) >= 2);
	EXPECT_EQ(c->err, 0);
	EXPECT_EQ(c->fo.reprobes, 1);
	/* every pair re-probed, not the failed one alone once its 1 s hold-off ran out */
	EXPECT(tp.opens - opens0 >= 2);
	/* the re-probe fails the same way: nothing left, a clean error at once */
	EXPECT(fail_round(c, (uint64_t)rh_param.PROBE_TIMEOUT + 50) >= 1);
	EXPECT_EQ(c->err, -EHOSTUNREACH);
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);
out:
	rh_param.COMPLETION_TIMEOUT = ct;
	rh_param.PROBE_TIMEOUT = pt;
}

/* A move found by the completion timeout gives each parallel handshake the probe timeout. One
 * the peer has answered (a stream accepted: rh_core_stream_answered; or a stream handshaken) is a
 * healthy pair slow to set up its endpoints, and keeps the usual 2x deadline; an unanswered one
 * is given up at the probe timeout. Before, the answered ones were given up with it and held
 * off: with no other pair the connection escalated with "no compatible NIC pair left". */
/* A lane's state by its id (a dead lane's slot is reused by the next one opened). */
static int lane_state_of(struct rh_conn *c, uint32_t id)
{
	for (int i = 0; i < c->nlanes; i++) {
		if (c->lanes[i]->id == id) {
			return (int)c->lanes[i]->state;
		}
	}
	return (int)RH_LANE_DEAD;
}

static void test_answered_handshake_keeps_its_deadline(void)
{
	struct rh_lane *l = NULL, *ans = NULL, *half = NULL, *silent = NULL;
	struct rh_conn *c = fixture_ready_conn(true, NNICS, &l);
	uint64_t t0, probe = (uint64_t)rh_param.PROBE_TIMEOUT;
	uint32_t ans_id, half_id, silent_id;

	EXPECT(c != NULL && l != NULL);
	if (!c || !l) {
		return;
	}
	pthread_mutex_lock(&c->mu);
	t0 = rh_now_ms();
	rh_fo_lane_failed(c, l, -ETIMEDOUT, "test: no progress"); /* found late */
	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *b = c->lanes[i];

		if (b->state != RH_LANE_OPENING || !b->opener) {
			continue;
		}
		if (!ans) {
			ans = b;
		} else if (!half && b->nstreams >= 2) {
			half = b;
		} else if (!silent) {
			silent = b;
		}
	}
	EXPECT(ans != NULL && half != NULL && silent != NULL);
	if (!ans || !half || !silent) {
		pthread_mutex_unlock(&c->mu);
		fixture_drop_conn(c);
		return;
	}
	ans_id = ans->id;
	half_id = half->id;
	silent_id = silent->id;
	EXPECT(silent->t_deadline_ms <= rh_now_ms() + probe); /* the found-late round */
	pthread_mutex_unlock(&c->mu);
	rh_core_stream_answered(ans); /* the transport: the peer accepted a stream */
	rh_core_stream_ready(half, NULL); /* one stream of several handshaken */
	pthread_mutex_lock(&c->mu);
	EXPECT_EQ(half->state, RH_LANE_OPENING);
	/* Past the probe timeout: the silent pair is given up, the answered ones still open. */
	rh_fo_tick(c, t0 + probe + 50);
	EXPECT_EQ(lane_state_of(c, ans_id), RH_LANE_OPENING);
	EXPECT_EQ(lane_state_of(c, half_id), RH_LANE_OPENING);
	EXPECT_EQ(lane_state_of(c, silent_id), RH_LANE_DEAD);
	EXPECT_EQ(c->err, 0);
	/* The answered lane completes: the connection carries on, nothing escalated. */
	pthread_mutex_unlock(&c->mu);
	for (int i = 0; i < ans->nstreams; i++) {
		rh_core_stream_ready(ans, NULL);
	}
	pthread_mutex_lock(&c->mu);
	EXPECT_EQ(lane_state_of(c, ans_id), RH_LANE_ACTIVE);
	EXPECT_EQ(c->err, 0);
	/* An answered handshake still has a bound: its full deadline. */
	rh_fo_tick(c, rh_now_ms() + 2 * probe + 50);
	EXPECT_EQ(lane_state_of(c, half_id), RH_LANE_DEAD);
	EXPECT_EQ(lane_state_of(c, ans_id), RH_LANE_ACTIVE);
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);
}

/* The escalation's WARN detail (soak seed 30855: a never-faulted rail was given up and the log
 * could not say whether that pair was held off, never tried, or its lane timed out): the pairs
 * held off with the time left, the local NICs down, the re-probes and the lanes in flight. */
static void test_stuck_report(void)
{
	struct rh_lane *l = NULL;
	struct rh_conn *c;
	char buf[512];
	size_t n;

	rh_nic_set_health(2, false);
	c = fixture_ready_conn(true, NNICS, &l);
	EXPECT(c != NULL && l != NULL);
	if (!c || !l) {
		rh_nic_set_health(2, true);
		return;
	}
	pthread_mutex_lock(&c->mu);
	rh_fo_lane_failed(c, l, -ETIMEDOUT, "test: no progress"); /* fk0 -> 0 held off */
	n = rh_fo_stuck_report(c, rh_now_ms(), buf, sizeof(buf));
	EXPECT_EQ(n, strlen(buf));
	EXPECT(strstr(buf, " 0 re-probe(s)") != NULL);
	EXPECT(strstr(buf, "held off: fk0->0 (") != NULL);
	EXPECT(strstr(buf, "fk1->") == NULL); /* opened, not held off */
	EXPECT(strstr(buf, "local NICs down: fk2") != NULL);
	EXPECT(strstr(buf, " 0 lane(s) in flight") == NULL); /* the backups are opening */
	/* Past the hold-off nothing is listed; a short buffer is cut, still terminated. */
	n = rh_fo_stuck_report(c, rh_now_ms() + (uint64_t)rh_param.FAILBACK_INTERVAL + 1, buf,
			       sizeof(buf));
	EXPECT(strstr(buf, "held off: none;") != NULL);
	n = rh_fo_stuck_report(c, rh_now_ms(), buf, 16);
	EXPECT(n < 16 && strlen(buf) == n);
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);
	rh_nic_set_health(2, true);
}

/* A lane naming NICs outside the tables (an accepted hello's indices, or a peer NIC table
 * that shrank under it) must not make ranking write outside its pair table: the replay of
 * bit-flipped lane bytes (issue 17, item 9) crashed the receiver there (ASan: stack overflow
 * in rank_ex). */
/* A fail-back retires the backups (DRAINING: they finish only messages begun before), then the
 * peer's RESUME reports the fail-back's new primary dead before they drained. The backups must
 * carry new messages again; before, they stayed DRAINING and the connection moved nothing until
 * the next fail-back probe answered, up to FAILBACK_MAX_BACKOFF later (33-48 s gaps in the long
 * soak, bench/soak.py). */
static void test_lost_failback_reactivates_retired_lanes(void)
{
	struct rh_lane *l, *b, *p2;
	struct rh_conn *c = fixture_ready_conn(true, NNICS, &l);
	struct rh_resume *r = calloc(1, sizeof(*r));
	uint8_t buf[512];
	struct rh_hdr h = { .type = RH_F_RESUME };
	int len;

	EXPECT(c != NULL && l != NULL && r != NULL);
	if (!c || !l || !r) {
		free(r);
		return;
	}
	pthread_mutex_lock(&c->mu);
	/* moved: the primary is gone, a backup on NIC 1 carries the traffic */
	b = rh_conn_add_lane(c, c->next_lane_id, 1, 1, 2, false);
	c->next_lane_id += 2;
	EXPECT(b != NULL);
	if (b) {
		rh_conn_open_lane(c, b, RH_HELLO_LANE, 1000);
		b->state = RH_LANE_ACTIVE;
	}
	rh_conn_fence_lane(c, l);
	c->fo.primary_lost = true;
	/* fail-back: a new lane on the original pair comes up and retires the backup */
	p2 = rh_conn_add_lane(c, c->next_lane_id, 0, 0, 2, true);
	c->next_lane_id += 2;
	EXPECT(p2 != NULL);
	if (b && p2) {
		rh_conn_open_lane(c, p2, RH_HELLO_LANE, 1000);
		p2->state = RH_LANE_ACTIVE;
		rh_fo_lane_up(c, p2);
		EXPECT_EQ(b->state, RH_LANE_DRAINING);
		EXPECT(!rh_sched_lane_may_carry(b->state, b->retire_gen, RH_GEN_NEW));
		/* the receiver lost the new primary's lane and says so in its RESUME record */
		r->next_seq = 0;
		r->ndead = 1;
		r->dead[0] = p2->id;
		len = rh_resume_put(r, buf, sizeof(buf));
		EXPECT(len > 0);
		h.conn_id = c->id;
		h.epoch = c->epoch + 1;
		h.len = (uint32_t)len;
		EXPECT_EQ(rh_resume_apply(c, &h, buf), 0);
		EXPECT_EQ(lane_state(c, p2->id), RH_LANE_DEAD);
		EXPECT(c->fo.primary_lost);
		EXPECT_EQ(b->state, RH_LANE_ACTIVE);
		EXPECT(rh_sched_lane_may_carry(b->state, b->retire_gen, RH_GEN_NEW));
		EXPECT(c->ctrl_lane == b);
		EXPECT_EQ(c->err, 0);
		/* a record that does not parse is refused and logged, nothing else changes; the
		 * same RESUME again is stale */
		h.epoch = c->epoch + 1;
		h.len = 2;
		memset(buf, 0xff, 2);
		EXPECT_EQ(rh_resume_apply(c, &h, buf), -EPROTO);
		EXPECT_EQ(c->err, 0);
		EXPECT_EQ(b->state, RH_LANE_ACTIVE);
		h.epoch = c->resume_epoch;
		EXPECT_EQ(rh_resume_apply(c, &h, buf), 0);
		EXPECT_EQ(c->err, 0);
	}
	pthread_mutex_unlock(&c->mu);
	free(r);
	fixture_drop_conn(c);
}

/* Every wait has a bound: a sender whose lanes are all gone without a failover of its own (the
 * peer's RESUME fenced them) and with requests not yet acknowledged starts a move on the next
 * tick: backups open and the escalation bound runs. Before, it waited for a fail-back probe. */
static void test_no_lane_left_starts_a_move(void)
{
	struct rh_lane *l;
	struct rh_conn *c = fixture_ready_conn(true, NNICS, &l);
	int opens0 = tp.opens;

	EXPECT(c != NULL && l != NULL);
	if (!c || !l) {
		return;
	}
	pthread_mutex_lock(&c->mu);
	rh_fo_tick(c, rh_now_ms());
	EXPECT(!c->fo.active); /* nothing to carry: no move */
	c->sreqs[0].used = true; /* a request in flight, not acknowledged */
	c->sreqs[0].acked = false;
	rh_fo_tick(c, rh_now_ms());
	EXPECT(!c->fo.active); /* its lane is ACTIVE: no move */
	rh_conn_fence_lane(c, l); /* as a RESUME naming it dead does, without rh_fo_lane_failed */
	EXPECT_EQ(tp.opens, opens0);
	rh_fo_tick(c, rh_now_ms());
	EXPECT(c->fo.active);
	EXPECT(c->await_resume);
	EXPECT(tp.opens > opens0); /* backups opening */
	EXPECT_EQ(c->err, 0);
	c->sreqs[0].used = false;
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);
}

static void test_ranking_ignores_stray_lane(void)
{
	struct rh_lane *l, *stray;
	struct rh_conn *c = fixture_ready_conn(true, NNICS, &l);
	int opens0 = tp.opens;

	EXPECT(c != NULL && l != NULL);
	if (!c || !l) {
		return;
	}
	rh_health_set_hooks(NULL);
	pthread_mutex_lock(&c->mu);
	stray = rh_conn_add_lane(c, 7, 0, 0, 1, false);
	EXPECT(stray != NULL);
	if (stray) {
		stray->state = RH_LANE_DRAINING; /* carries nothing new: backups are wanted */
		stray->lnic = 134234112; /* as a flipped bit left it */
		stray->rnic = 40000;
	}
	rh_fo_lane_failed(c, l, -EIO, "test: I/O error");
	EXPECT_EQ(c->err, 0);
	pthread_mutex_unlock(&c->mu);
	/* ranked and opened backups on real pairs */
	EXPECT(tp.opens > opens0);
	for (int i = opens0; i < tp.opens && i < 64; i++) {
		EXPECT(tp.open_lnic[i] >= 0 && tp.open_lnic[i] < NNICS);
		EXPECT(tp.open_rnic[i] >= 0 && tp.open_rnic[i] < NNICS);
	}
	if (stray) {
		stray->lnic = 0; /* fence/free paths index by it */
		stray->rnic = 0;
	}
	rh_health_set_hooks(&hooks);
	fixture_drop_conn(c);
}

/* --- health.c --- */

static void test_nic_health(void)
{
	struct rh_lane *l;
	struct rh_conn *c = fixture_ready_conn(false, NNICS, &l);
	int ev0 = ctl.n, opens0 = tp.opens, e;

	EXPECT(c != NULL && l != NULL);
	if (!c || !l) {
		return;
	}
	pthread_mutex_lock(&rh_g.mu);
	c->gnext = rh_g.conns;
	rh_g.conns = c;
	c->registered = true;
	pthread_mutex_unlock(&rh_g.mu);

	EXPECT_EQ(rh_nic_count(), NNICS);
	EXPECT(strcmp(rh_nic_name(1), "fk1") == 0);
	EXPECT(strcmp(rh_nic_name(NNICS), "") == 0);

	rh_nic_set_health(0, false);
	EXPECT(!rh_g.nics[0].up);
	pthread_mutex_lock(&c->mu);
	EXPECT(lane_state(c, 0) == RH_LANE_DEAD || lane_state(c, 0) == -1);
	EXPECT_EQ(c->err, 0);
	pthread_mutex_unlock(&c->mu);
	e = find_event(ev0, RH_EVT_LANE_ERROR);
	EXPECT(e >= 0 && ctl.lnic[e] == 0 && ctl.err[e] == -ENETDOWN);
	/* Every backup avoids the NIC that went down. */
	EXPECT(tp.opens > opens0);
	for (int i = opens0; i < tp.opens && i < 64; i++) {
		EXPECT(tp.open_lnic[i] != 0);
	}

	/* Each source holds the NIC down on its own: carrier keeps it down after the API. */
	rh_nic_set_health_from(0, RH_HEALTH_CARRIER, false);
	rh_nic_set_health(0, true);
	EXPECT(!rh_g.nics[0].up);
	rh_nic_set_health_from(0, RH_HEALTH_CARRIER, true);
	EXPECT(rh_g.nics[0].up);
	rh_nic_set_health(NNICS + 5, false); /* out of range: ignored */

	pthread_mutex_lock(&rh_g.mu);
	rh_g.conns = c->gnext;
	c->registered = false;
	pthread_mutex_unlock(&rh_g.mu);
	fixture_drop_conn(c);
}

/* --- set-up retries (issue 29, 9) --- */

/* A connector that has not connected yet, deadline `deadline_ms` from now. */
static struct rh_conn *setup_conn(int deadline_ms)
{
	struct rh_conn *c = rh_conn_new(true);

	fixture_peer_nics(c, NNICS);
	c->t_connect_deadline_ms = rh_now_ms() + (uint64_t)deadline_ms;
	return c;
}

static struct rh_lane *opening_lane(struct rh_conn *c)
{
	for (int i = 0; i < c->nlanes; i++) {
		if (c->lanes[i]->state == RH_LANE_OPENING && c->lanes[i]->tp) {
			return c->lanes[i];
		}
	}
	return NULL;
}

/* Ticks until a lane is opening or the connection failed (bounded by `ms`). */
static struct rh_lane *tick_until_opening(struct rh_conn *c, int ms)
{
	uint64_t end = rh_now_ms() + (uint64_t)ms;
	struct timespec ts = { 0, 5 * 1000 * 1000 };
	struct rh_lane *l = NULL;

	while (!c->err && !(l = opening_lane(c)) && rh_now_ms() < end) {
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&c->mu);
		rh_fo_tick(c, rh_now_ms());
		pthread_mutex_unlock(&c->mu);
	}
	return l;
}

static void test_setup_retries_transient_errors(void)
{
	struct rh_conn *c = setup_conn(10000);
	struct rh_lane *l;
	int opens0 = tp.opens, rc;

	/* 8 connections at once over verbs on fresh Soft-RoCE nodes: 3 of 8 failed at once with
	 * EHOSTUNREACH (address resolution in progress). Now: retried until the deadline. */
	tp.fail_opens = 6; /* 50 + 100 + ... + 1000 ms of backoff: 2.6 s */
	tp.open_err = -EHOSTUNREACH;
	pthread_mutex_lock(&c->mu);
	rc = rh_fo_connect(c);
	pthread_mutex_unlock(&c->mu);
	EXPECT_EQ(rc, 0);
	EXPECT_EQ(c->err, 0);
	l = tick_until_opening(c, 8000);
	EXPECT(l != NULL);
	EXPECT_EQ(c->err, 0);
	EXPECT_EQ(tp.fail_opens, 0);
	EXPECT(tp.opens - opens0 >= 7);
	/* the founding lane then fails asynchronously (no route yet): retried too */
	tp.fail_opens = 2;
	pthread_mutex_lock(&c->mu);
	rh_fo_lane_failed(c, l, -ENETUNREACH, "connect");
	pthread_mutex_unlock(&c->mu);
	EXPECT_EQ(c->err, 0);
	l = tick_until_opening(c, 8000);
	EXPECT(l != NULL);
	EXPECT_EQ(c->err, 0);
	fixture_drop_conn(c);

	/* a transient error past the deadline fails the connection with that error */
	c = setup_conn(300);
	tp.fail_opens = 1000;
	pthread_mutex_lock(&c->mu);
	rc = rh_fo_connect(c);
	pthread_mutex_unlock(&c->mu);
	EXPECT_EQ(rc, 0);
	EXPECT(tick_until_opening(c, 3000) == NULL);
	EXPECT_EQ(c->err, -EHOSTUNREACH);
	fixture_drop_conn(c);

	/* an error that is not transient fails at once, as before */
	c = setup_conn(10000);
	tp.fail_opens = 1;
	tp.open_err = -EACCES;
	pthread_mutex_lock(&c->mu);
	rc = rh_fo_connect(c);
	pthread_mutex_unlock(&c->mu);
	EXPECT_EQ(rc, -EACCES);
	EXPECT(!rh_fo_transient_setup_err(-EACCES) && rh_fo_transient_setup_err(-EHOSTUNREACH));
	tp.fail_opens = 0;
	fixture_drop_conn(c);
}

/* --- handshake.c: what a captured hello can still do (issue 29, 3) --- */

static struct rh_listen test_ls = { .id = 77, .dev = 0 };

/* A connector's hello for lane `lane_id`, stream `stream` of `nstreams`, signed as the
 * connector signs it (rh_core_sign_stream). */
static void founding_hello(struct rh_hello *h, struct rh_hdr *hdr, uint64_t conn_id,
			   const uint8_t *nonce, uint32_t lane_id, int stream, int nstreams)
{
	memset(h, 0, sizeof(*h));
	memset(hdr, 0, sizeof(*hdr));
	hdr->conn_id = conn_id;
	hdr->epoch = 1;
	h->kind = RH_HELLO_CONN;
	h->from_sender = 1;
	h->lane_id = lane_id;
	h->listen_id = test_ls.id;
	h->chunk = 1u << 19;
	h->src_nic = 0;
	h->dst_nic = 0;
	h->nnics = NNICS;
	for (int i = 0; i < NNICS; i++) {
		h->nics[i].ipv4 = htonl(0x0a000101u + (uint32_t)i);
		h->nics[i].port = htons(5000);
		h->nics[i].up = true;
	}
	memcpy(h->nonce, nonce, RH_NONCE_LEN);
	h->stream = (uint8_t)stream;
	h->nstreams = (uint8_t)nstreams;
	EXPECT_EQ(rh_auth_sign(test_ls.secret, h, false, conn_id, 1, NULL, NULL), 0);
}

static int stream_dummy[16];

/* rh_core_hello + attach as a transport does; the lane, or NULL when refused. */
static struct rh_lane *offer(const struct rh_hdr *hdr, const struct rh_hello *h, int *refs)
{
	struct rh_hello reply;
	struct rh_lane *l = rh_core_hello(hdr, h, &reply);

	if (!l) {
		return NULL;
	}
	/* a transport's bytes put in the reply (a queue pair address) go under its MAC */
	EXPECT(rh_auth_verify(l->conn->key, &reply, true, l->conn->id, 0, h->nonce, NULL));
	reply.tp_len = 3;
	memcpy(reply.tp, "qp1", 3);
	EXPECT(!rh_auth_verify(l->conn->key, &reply, true, l->conn->id, 0, h->nonce, NULL));
	EXPECT_EQ(rh_core_sign_reply(l, h, &reply), 0);
	EXPECT(rh_auth_verify(l->conn->key, &reply, true, l->conn->id, 0, h->nonce, NULL));
	reply.tp[2] ^= 1;
	EXPECT(!rh_auth_verify(l->conn->key, &reply, true, l->conn->id, 0, h->nonce, NULL));
	if (rh_core_stream_attach(l, h->stream, 16, &stream_dummy[h->stream & 15],
				  sizeof(struct rh_lane_streams), false) < 0) {
		return NULL; /* the reference was dropped */
	}
	(*refs)++;
	return l;
}

static void forget_conn(struct rh_conn *c, int refs)
{
	pthread_mutex_lock(&rh_g.mu);
	for (struct rh_conn **pp = &rh_g.conns; *pp; pp = &(*pp)->gnext) {
		if (*pp == c) {
			*pp = c->gnext;
			c->registered = false;
			break;
		}
	}
	pthread_mutex_unlock(&rh_g.mu);
	while (refs-- > 0) {
		rh_core_conn_put(c);
	}
	fixture_drop_conn(c);
}

static void test_captured_hellos(void)
{
	uint64_t id = rh_random_id();
	uint8_t nonce[RH_NONCE_LEN];
	struct rh_hello h, forged;
	struct rh_hdr hdr;
	struct rh_lane *l, *again;
	struct rh_conn *c;
	int refs = 0;

	EXPECT_EQ(rh_auth_random(test_ls.secret, RH_SECRET_LEN), 0);
	EXPECT_EQ(rh_auth_random(nonce, RH_NONCE_LEN), 0);
	pthread_mutex_lock(&rh_g.mu);
	test_ls.next = rh_g.listens;
	rh_g.listens = &test_ls;
	pthread_mutex_unlock(&rh_g.mu);

	/* the lane's first stream: a lane of 8 streams */
	founding_hello(&h, &hdr, id, nonce, 0, 0, 8);
	l = offer(&hdr, &h, &refs);
	EXPECT(l != NULL);
	if (!l) {
		return;
	}
	c = l->conn;
	EXPECT_EQ(l->nstreams, 8);
	/* a copy of it as stream 15 (beyond the lane, within the transport's 16): its MAC did not
	 * cover the index, so it attached and the real 8th stream was refused */
	forged = h;
	forged.stream = 15;
	EXPECT(offer(&hdr, &forged, &refs) == NULL);
	forged.stream = 7; /* another index of the lane */
	EXPECT(offer(&hdr, &forged, &refs) == NULL);
	forged = h;
	forged.nstreams = 16; /* a larger lane */
	EXPECT(offer(&hdr, &forged, &refs) == NULL);
	/* signed, but an index beyond its own count, or a count other than its lane's */
	founding_hello(&forged, &hdr, id, nonce, 0, 9, 8);
	EXPECT(offer(&hdr, &forged, &refs) == NULL);
	founding_hello(&forged, &hdr, id, nonce, 0, 1, 4);
	EXPECT(offer(&hdr, &forged, &refs) == NULL);
	/* the real streams all attach */
	for (int i = 1; i < 8; i++) {
		founding_hello(&forged, &hdr, id, nonce, 0, i, 8);
		EXPECT(offer(&hdr, &forged, &refs) == l);
	}

	/* the first attempt fails before the connection is ready; the connector re-founds it
	 * (same id and nonce, next lane id) on a new connection object */
	forget_conn(c, refs);
	refs = 0;
	founding_hello(&forged, &hdr, id, nonce, 2, 0, 8);
	again = offer(&hdr, &forged, &refs);
	EXPECT(again != NULL);
	if (!again) {
		return;
	}
	/* the captured first hello (lane 0) opened a second lane of the live connection: the
	 * listener's record, written when the first attempt was created, refuses it now */
	founding_hello(&h, &hdr, id, nonce, 0, 0, 8);
	EXPECT(offer(&hdr, &h, &refs) == NULL);
	forget_conn(again->conn, refs);

	pthread_mutex_lock(&rh_g.mu);
	rh_g.listens = test_ls.next;
	pthread_mutex_unlock(&rh_g.mu);
}

/* A lane rh_core_hello returned keeps its slot until its stream attaches (issue 37, 1): it
 * dies in between (deadline, connection failure) and another lane is added meanwhile; that
 * one must not take the slot, or the stale pointer attaches the stream to it. */
static void test_hello_holds_slot_until_attach(void)
{
	uint64_t id = rh_random_id();
	uint8_t nonce[RH_NONCE_LEN];
	struct rh_hello h, reply;
	struct rh_hdr hdr;
	struct rh_lane *l, *other, *reused;
	struct rh_conn *c;

	EXPECT_EQ(rh_auth_random(test_ls.secret, RH_SECRET_LEN), 0);
	EXPECT_EQ(rh_auth_random(nonce, RH_NONCE_LEN), 0);
	pthread_mutex_lock(&rh_g.mu);
	test_ls.next = rh_g.listens;
	rh_g.listens = &test_ls;
	pthread_mutex_unlock(&rh_g.mu);

	founding_hello(&h, &hdr, id, nonce, 0, 0, 1);
	l = rh_core_hello(&hdr, &h, &reply); /* a conn reference for the stream */
	EXPECT(l != NULL);
	if (!l) {
		return;
	}
	c = l->conn;
	pthread_mutex_lock(&c->mu);
	rh_conn_fence_lane(c, l); /* dead before its stream attached: tp still NULL */
	other = rh_conn_add_lane(c, 41, 0, 0, 1, false);
	EXPECT(other != NULL && other != l);
	EXPECT_EQ(l->id, 0); /* not wiped */
	pthread_mutex_unlock(&c->mu);
	/* the late attach finds its own, dead lane: refused, the reference dropped */
	EXPECT_EQ(rh_core_stream_attach(l, 0, 16, &stream_dummy[0], sizeof(struct rh_lane_streams),
					false),
		  -EPROTO);
	pthread_mutex_lock(&c->mu);
	reused = rh_conn_add_lane(c, 43, 0, 0, 1, false); /* now the slot is free again */
	EXPECT(reused == l);
	pthread_mutex_unlock(&c->mu);
	forget_conn(c, 0); /* the stream's reference went with the refused attach */

	pthread_mutex_lock(&rh_g.mu);
	rh_g.listens = test_ls.next;
	pthread_mutex_unlock(&rh_g.mu);
}

/* --- probes bound to the connection's key (issue 29, 6) --- */

static void test_probe_replies_prove_the_key(void)
{
	struct rh_lane *l1, *l2;
	struct rh_conn *peer =
		fixture_ready_conn(true, NNICS, &l1); /* the side that answers (its listener) */
	struct rh_conn *me = fixture_ready_conn(false, NNICS, &l2); /* the side that probes */
	struct rh_hello h, reply, stranger;
	struct rh_hdr hdr = { .type = RH_F_HELLO };
	uint64_t id, cookie = rh_random_id();

	EXPECT(peer && me);
	if (!peer || !me) {
		return;
	}
	me->id = peer->id;
	EXPECT_EQ(rh_auth_random(peer->key, RH_SECRET_LEN), 0);
	memcpy(me->key, peer->key, RH_SECRET_LEN);
	EXPECT_EQ(rh_auth_random(peer->conn_nonce, sizeof(peer->conn_nonce)), 0);
	memcpy(me->conn_nonce, peer->conn_nonce, sizeof(me->conn_nonce));
	pthread_mutex_lock(&rh_g.mu);
	rh_registry_add(peer);
	pthread_mutex_unlock(&rh_g.mu);

	pthread_mutex_lock(&me->mu);
	EXPECT_EQ(rh_core_probe_hello(me, cookie, &h, &id), 0);
	pthread_mutex_unlock(&me->mu);
	hdr.conn_id = id;
	EXPECT(rh_core_probe_answer(&hdr, &h, &reply));
	EXPECT(rh_core_probe_check(me, cookie, &reply));
	/* anyone answering for the peer's address (the old listener's unproven reply) */
	memset(&stranger, 0, sizeof(stranger));
	stranger.kind = RH_HELLO_PROBE;
	stranger.nstreams = 1;
	EXPECT(!rh_core_probe_check(me, cookie, &stranger));
	/* a proven reply to another probe does not answer this one */
	EXPECT(!rh_core_probe_check(me, cookie + 1, &reply));
	/* a probe that does not prove the secret, or names no live connection, gets no answer */
	h.mac[0] ^= 1;
	EXPECT(!rh_core_probe_answer(&hdr, &h, &reply));
	h.mac[0] ^= 1;
	hdr.conn_id = id + 1;
	EXPECT(!rh_core_probe_answer(&hdr, &h, &reply));

	pthread_mutex_lock(&rh_g.mu);
	rh_g.conns = peer->gnext;
	peer->registered = false;
	pthread_mutex_unlock(&rh_g.mu);
	fixture_drop_conn(peer);
	fixture_drop_conn(me);
}

int main(void)
{
	rh_param.STANDBY_LANES =
		0; /* these count the lanes a move opens: standbys in test_standby */
	setup_nics();
	rh_health_set_hooks(&hooks);
	test_stream_attach();
	test_ids();
	test_failover_with_plan();
	test_failover_standalone();
	test_move_timing_marks();
	test_escalation_waits_for_lanes_in_flight();
	test_ranking_ignores_stray_lane();
	test_lost_failback_reactivates_retired_lanes();
	test_no_lane_left_starts_a_move();
	test_nic_health();
	test_setup_retries_transient_errors();
	test_captured_hellos();
	test_hello_holds_slot_until_attach();
	test_probe_replies_prove_the_key();
	test_stuck_report(); /* last: they fill the fake hooks' 64 event slots */
	test_escalation_round_deadlines();
	test_answered_handshake_keeps_its_deadline();
	test_no_escalation_outside_a_move_with_lanes_in_flight();
	test_escalation_bound_covers_a_reprobe();
	TEST_DONE();
}
