/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Warm standby lanes (RAILHOP_STANDBY_LANES, core/failover.c) through the core's seams, with
 * the stub transport (lane_stub.h) counting what the core asks of it:
 *  - the sender opens its standby on a backup pair once the connection is up; handshaken, it
 *    carries nothing (no control lane, no data lane);
 *  - a move promotes an eligible standby: its first frame (the FAILREQ) is handed out with no
 *    open() called; without a standby, or with none eligible, the move opens a lane as before;
 *  - a standby's own failure drops it (no move) and its replacement waits a backoff;
 *  - the accepting side keeps a standby out of its lanes until the peer sends on it;
 *  - standbys grow on use: a connection whose standby was promoted keeps
 *    min(used + 1, STANDBY_LANES_MAX) of them, never fewer than STANDBY_LANES;
 *  - the agent hears of a standby twice: a LANE_UP flagged standby when it is handshaken, one
 *    flagged promoted when it carries.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "conn_fixture.h"
#include "core/conn.h"
#include "core/health.h"
#include "core/wire.h"
#include "lane_stub.h"
#include "param.h"

static struct {
	int opens, fences;
	int open_lnic[64], open_rnic[64];
	unsigned open_flags[64];
} tp;

static int fk_listen(int nic)
{
	rh_g.nics[nic].port = htons((uint16_t)(4000 + nic));
	return 0;
}

static int fk_open(struct rh_lane *lane, const struct rh_hello *hello, uint64_t conn_id,
		   uint32_t epoch, uint32_t ip, uint16_t port)
{
	(void)conn_id, (void)epoch, (void)ip, (void)port;
	if (tp.opens < 64) {
		tp.open_lnic[tp.opens] = lane->lnic;
		tp.open_rnic[tp.opens] = lane->rnic;
		tp.open_flags[tp.opens] = hello->flags;
	}
	tp.opens++;
	lane->tp = calloc(1, sizeof(struct rh_lane_streams));
	return lane->tp ? 0 : -ENOMEM;
}

static void fk_fence(struct rh_lane *lane)
{
	tp.fences++;
	free(lane->tp);
	lane->tp = NULL;
}

static struct lane_ops fake_ops;

/* The control plane's lane events: type, lane id and flags (RH_EVT_F_*) of each. */
static struct {
	int n;
	int type[1024];
	uint32_t lane[1024], flags[1024];
} ev;

static void hk_lane_event(int type, uint64_t conn_id, uint32_t epoch, uint32_t lane, int lnic,
			  int err, uint64_t duration_ns, const struct rh_lane_info *info)
{
	(void)conn_id, (void)epoch, (void)lnic, (void)err, (void)duration_ns;
	if (ev.n < 1024) {
		ev.type[ev.n] = type;
		ev.lane[ev.n] = lane;
		ev.flags[ev.n] = info ? info->flags : 0;
	}
	ev.n++;
}

static const struct rh_ctl_hooks hooks = { .lane_event = hk_lane_event };

/* The flags of the LANE_UPs of lane id from event index from on, or'ed into *seen; how many. */
static int lane_ups(int from, uint32_t id, uint32_t *seen)
{
	int n = 0;

	*seen = 0;
	EXPECT(ev.n <= 1024); /* every event recorded */
	for (int i = from; i < ev.n && i < 1024; i++) {
		if (ev.type[i] == RH_EVT_LANE_UP && ev.lane[i] == id) {
			*seen |= ev.flags[i];
			n++;
		}
	}
	return n;
}

#define NNICS 3

static void setup(void)
{
	fake_ops = stub_lane_ops;
	fake_ops.name = "standby-fake";
	fake_ops.listen = fk_listen;
	fake_ops.open = fk_open;
	fake_ops.fence = fk_fence;
	rh_g.nnics = NNICS;
	EXPECT_EQ(rh_core_register_ops(&fake_ops), 0);
	rh_health_set_hooks(&hooks);
	for (int i = 0; i < NNICS; i++) {
		struct rh_nic *n = &rh_g.nics[i];

		memset(n, 0, sizeof(*n));
		snprintf(n->ifname, sizeof(n->ifname), "sb%d", i);
		n->ipv4 = htonl(0x0a000001u + (uint32_t)i);
		n->rail = 0;
		n->numa = -1;
		n->up = true;
		fk_listen(i);
	}
}

/* The standby lane the sender opened (the newest lane with the standby role). */
static struct rh_lane *standby_lane(struct rh_conn *c)
{
	struct rh_lane *s = NULL;

	for (int i = 0; i < c->nlanes; i++) {
		if (c->lanes[i]->standby && c->lanes[i]->state != RH_LANE_DEAD &&
		    (!s || c->lanes[i]->id > s->id)) {
			s = c->lanes[i];
		}
	}
	return s;
}

/* A sender with its standby opened by the ticker and handshaken (every stream ready). */
static struct rh_conn *conn_with_standby(struct rh_lane **primary, struct rh_lane **sb)
{
	struct rh_conn *c = fixture_ready_conn(true, NNICS, primary);
	int opens0 = tp.opens, ev0;
	uint32_t flags;

	*sb = NULL;
	if (!c) {
		return NULL;
	}
	pthread_mutex_lock(&c->mu);
	rh_fo_tick(c, rh_now_ms());
	*sb = standby_lane(c);
	pthread_mutex_unlock(&c->mu);
	EXPECT_EQ(tp.opens, opens0 + 1);
	EXPECT(*sb != NULL);
	if (!*sb) {
		return c;
	}
	EXPECT((tp.open_flags[opens0] & RH_HELLO_F_STANDBY) != 0); /* the peer is told */
	EXPECT((*sb)->lnic != 0 || (*sb)->rnic != 0); /* never the primary's pair */
	EXPECT_EQ((*sb)->state, RH_LANE_OPENING);
	ev0 = ev.n;
	for (int i = 0; i < (*sb)->nstreams; i++) {
		rh_core_stream_ready(*sb, NULL);
	}
	EXPECT_EQ((*sb)->state, RH_LANE_STANDBY);
	/* the agent hears of it as a standby: up, carrying nothing */
	EXPECT_EQ(lane_ups(ev0, (*sb)->id, &flags), 1);
	EXPECT_EQ(flags, (uint32_t)RH_EVT_F_STANDBY);
	return c;
}

static void test_standby_opened_and_idle(void)
{
	struct rh_lane *p, *sb;
	struct rh_conn *c = conn_with_standby(&p, &sb);
	struct rh_hdr h = { .type = RH_F_ACK };
	uint8_t buf[256];
	struct rh_tx tx;
	int opens0 = tp.opens;

	EXPECT(c && p && sb);
	if (!c || !sb) {
		return;
	}
	pthread_mutex_lock(&c->mu);
	EXPECT(c->ctrl_lane == p); /* control stays on the primary */
	EXPECT_EQ(rh_conn_active_lanes(c), 1); /* the standby is no data lane */
	rh_conn_queue_ctrl(c, &h, NULL, 0);
	rh_fo_tick(c, rh_now_ms()); /* one standby wanted, one there: nothing opened */
	EXPECT_EQ(tp.opens, opens0);
	pthread_mutex_unlock(&c->mu);
	EXPECT_EQ(rh_core_next_tx(sb, 0, buf, sizeof(buf), &tx), 0); /* carries nothing */
	EXPECT_EQ(rh_core_next_tx(p, 0, buf, sizeof(buf), &tx), 1);
	fixture_drop_conn(c);
}

static void test_move_promotes_standby(void)
{
	struct rh_lane *p, *sb;
	struct rh_conn *c = conn_with_standby(&p, &sb);
	uint8_t buf[256];
	struct rh_tx tx;
	struct rh_hdr h;
	int opens0 = tp.opens, ev0 = ev.n;
	uint32_t flags;
	size_t len0;

	EXPECT(c && p && sb);
	if (!c || !sb) {
		return;
	}
	pthread_mutex_lock(&c->mu);
	rh_fo_lane_failed(c, p, -ETIMEDOUT, "test: no progress");
	EXPECT(c->fo.active);
	EXPECT_EQ(sb->state, RH_LANE_ACTIVE); /* promoted */
	/* the agent's trace lists it among the lanes the move took: a LANE_UP, promoted */
	EXPECT_EQ(lane_ups(ev0, sb->id, &flags), 1);
	EXPECT_EQ(flags, (uint32_t)(RH_EVT_F_STANDBY | RH_EVT_F_PROMOTED));
	EXPECT(c->ctrl_lane == sb);
	EXPECT(sb->await_post);
	EXPECT_EQ(tp.opens, opens0); /* no transport open: BACKUP_LANES is 1 and it is there */
	EXPECT(c->ctrl_len > 0); /* the FAILREQ is queued on it */
	len0 = c->ctrl_len;
	/* not taken by the transport yet: no second FAILREQ piles up behind it, however late */
	rh_fo_tick(c, rh_now_ms() + 500); /* (within its answer deadline, 2 x PROBE_TIMEOUT) */
	EXPECT_EQ(c->ctrl_len, len0);
	pthread_mutex_unlock(&c->mu);
	/* the first frame the standby hands out is the FAILREQ, the move's first post */
	EXPECT_EQ(rh_core_next_tx(sb, 0, buf, sizeof(buf), &tx), 1);
	EXPECT(!tx.is_data);
	rh_hdr_get(buf, &h);
	EXPECT_EQ(h.type, RH_F_FAILREQ);
	EXPECT(!sb->await_post);
	EXPECT_EQ(tp.opens, opens0);
	pthread_mutex_lock(&c->mu);
	rh_fo_tick(c, rh_now_ms()); /* the move goes on: still no new lane, no standby yet */
	EXPECT_EQ(tp.opens, opens0);
	EXPECT_EQ(c->ctrl_len, 0u);
	rh_fo_tick(c, rh_now_ms() + 500); /* sent, unanswered (300 ms): sent again */
	EXPECT(c->ctrl_len > 0);
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);
}

/* A promoted standby skipped its handshake: with nothing from the peer by the handshake's
 * deadline (2 x PROBE_TIMEOUT) it has failed (every rail down at the far end: the move must
 * go on to escalate, not wait on it for ever); a frame read from it in time keeps it. */
static void test_promoted_standby_must_be_answered(void)
{
	for (int answered = 0; answered < 2; answered++) {
		struct rh_lane *p, *sb;
		struct rh_conn *c = conn_with_standby(&p, &sb);
		struct rh_hdr h = { .type = RH_F_ACK };
		uint64_t by;
		uint32_t id;

		EXPECT(c && p && sb);
		if (!c || !sb) {
			return;
		}
		pthread_mutex_lock(&c->mu);
		rh_fo_lane_failed(c, p, -ETIMEDOUT, "test: no progress");
		EXPECT_EQ(sb->state, RH_LANE_ACTIVE); /* promoted */
		by = sb->t_answer_by_ms;
		id = sb->id;
		EXPECT(by >= rh_now_ms() + 2 * (uint64_t)rh_param.PROBE_TIMEOUT - 50);
		rh_fo_tick(c, by - 1); /* not yet */
		EXPECT_EQ(sb->state, RH_LANE_ACTIVE);
		h.conn_id = c->id;
		h.epoch = c->epoch;
		pthread_mutex_unlock(&c->mu);
		if (answered) {
			rh_core_rx_ctrl(sb, &h, NULL); /* the peer's first frame on it */
		}
		pthread_mutex_lock(&c->mu);
		rh_fo_tick(c, by);
		if (answered) {
			EXPECT_EQ(sb->state, RH_LANE_ACTIVE);
			EXPECT_EQ(sb->t_answer_by_ms, 0u);
		} else {
			/* failed: the move goes on without it (its slot may hold a new lane now) */
			for (int i = 0; i < c->nlanes; i++) {
				EXPECT(c->lanes[i]->id != id || c->lanes[i]->state == RH_LANE_DEAD);
			}
		}
		pthread_mutex_unlock(&c->mu);
		fixture_drop_conn(c);
	}
}

/* No standby (STANDBY_LANES=0), or none eligible (its pair known bad): the move opens. */
static void test_move_without_standby_opens(void)
{
	struct rh_lane *p, *sb;
	struct rh_conn *c;
	int opens0;

	rh_param.STANDBY_LANES = 0;
	c = fixture_ready_conn(true, NNICS, &p);
	EXPECT(c && p);
	if (c) {
		opens0 = tp.opens;
		pthread_mutex_lock(&c->mu);
		rh_fo_tick(c, rh_now_ms());
		EXPECT_EQ(tp.opens, opens0); /* no standby */
		rh_fo_lane_failed(c, p, -ETIMEDOUT, "test: no progress");
		EXPECT(tp.opens > opens0); /* a lane opened for the move */
		EXPECT(standby_lane(c) == NULL);
		pthread_mutex_unlock(&c->mu);
		fixture_drop_conn(c);
	}
	rh_param.STANDBY_LANES = 1;

	c = conn_with_standby(&p, &sb);
	EXPECT(c && p && sb);
	if (!c || !sb) {
		return;
	}
	pthread_mutex_lock(&c->mu);
	c->fo.bad_until_ms[sb->lnic][sb->rnic] = rh_now_ms() + 60000;
	opens0 = tp.opens;
	rh_fo_lane_failed(c, p, -ETIMEDOUT, "test: no progress");
	EXPECT_EQ(sb->state, RH_LANE_STANDBY); /* not eligible: left as it is */
	EXPECT(tp.opens > opens0);
	for (int i = opens0; i < tp.opens && i < 64; i++) {
		EXPECT(tp.open_lnic[i] != sb->lnic || tp.open_rnic[i] != sb->rnic);
		EXPECT((tp.open_flags[i] & RH_HELLO_F_STANDBY) == 0);
	}
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);
}

static void test_standby_failure_is_no_move(void)
{
	struct rh_lane *p, *sb;
	struct rh_conn *c = conn_with_standby(&p, &sb);
	uint64_t now, next;
	int opens0 = tp.opens, slnic, srnic;
	uint32_t sb_id;

	EXPECT(c && p && sb);
	if (!c || !sb) {
		return;
	}
	slnic = sb->lnic;
	srnic = sb->rnic;
	sb_id = sb->id;
	rh_core_lane_error(sb, -EIO);
	pthread_mutex_lock(&c->mu);
	now = rh_now_ms();
	EXPECT_EQ(sb->state, RH_LANE_DEAD);
	EXPECT(!c->fo.active);
	EXPECT(!c->await_resume);
	/* no FAILREQ: the one control frame is the BYE that drops the peer's end of it */
	EXPECT_EQ(c->ctrl_len, (size_t)RH_HDR_LEN);
	if (c->ctrl_len == RH_HDR_LEN) {
		struct rh_hdr h;

		rh_hdr_get(c->ctrl, &h);
		EXPECT_EQ(h.type, RH_F_BYE);
		EXPECT_EQ(h.aux, sb_id);
	}
	EXPECT_EQ(p->state, RH_LANE_ACTIVE);
	EXPECT(!c->fo.primary_lost);
	EXPECT(c->fo.bad_until_ms[sb->lnic][sb->rnic] > now); /* its pair held off */
	next = c->fo.t_standby_next_ms;
	EXPECT(next > now);
	rh_fo_tick(c, next - 1); /* within the backoff: no replacement */
	EXPECT_EQ(tp.opens, opens0);
	rh_fo_tick(c, next);
	EXPECT_EQ(tp.opens, opens0 + 1); /* replaced, on another pair */
	EXPECT(tp.open_lnic[opens0] != slnic || tp.open_rnic[opens0] != srnic);
	EXPECT((tp.open_flags[opens0] & RH_HELLO_F_STANDBY) != 0);
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);
}

/* The accepting side: a lane accepted with the standby role is no data lane and not the
 * control lane until the peer sends on it. */
static void test_acceptor_keeps_standby_apart(void)
{
	struct rh_lane *p, *sb;
	struct rh_conn *c = fixture_ready_conn(false, NNICS, &p);
	struct rh_hdr h = { .type = RH_F_ACK }; /* ignored by a receiver once read */
	uint32_t flags;
	int ev0;

	EXPECT(c && p);
	if (!c) {
		return;
	}
	pthread_mutex_lock(&c->mu);
	sb = rh_conn_add_lane(c, 2, 1, 1, 1, false);
	EXPECT(sb != NULL);
	if (sb) {
		sb->standby = true; /* what rh_core_hello sets from RH_HELLO_F_STANDBY */
		sb->tp = calloc(1, sizeof(struct rh_lane_streams));
	}
	pthread_mutex_unlock(&c->mu);
	if (!sb) {
		fixture_drop_conn(c);
		return;
	}
	rh_core_stream_ready(sb, NULL);
	pthread_mutex_lock(&c->mu);
	EXPECT_EQ(sb->state, RH_LANE_STANDBY);
	EXPECT_EQ(rh_conn_active_lanes(c), 1);
	EXPECT(c->ctrl_lane == p);
	h.conn_id = c->id;
	h.epoch = c->epoch;
	pthread_mutex_unlock(&c->mu);
	ev0 = ev.n;
	rh_core_rx_ctrl(sb, &h, NULL);
	pthread_mutex_lock(&c->mu);
	EXPECT_EQ(sb->state, RH_LANE_ACTIVE); /* the peer promoted it */
	EXPECT_EQ(lane_ups(ev0, sb->id, &flags), 1);
	EXPECT_EQ(flags, (uint32_t)(RH_EVT_F_STANDBY | RH_EVT_F_PROMOTED));
	EXPECT_EQ(rh_conn_active_lanes(c), 2);
	pthread_mutex_unlock(&c->mu);
	fixture_drop_conn(c);
}

static int count_standbys(struct rh_conn *c)
{
	int n = 0;

	for (int i = 0; i < c->nlanes; i++) {
		n += c->lanes[i]->state == RH_LANE_STANDBY;
	}
	return n;
}

/* A used standby grows the count: the move's promotion counts, and once the peer sent on it
 * (its promotion) the ticker opens min(used + 1, STANDBY_LANES_MAX) new ones. */
static void test_standbys_grow_on_use(void)
{
	for (int max = 1; max <= 3; max++) {
		struct rh_lane *p, *sb;
		struct rh_conn *c = conn_with_standby(&p, &sb);
		struct rh_hdr h = { .type = RH_F_ACK };
		int opens0,
			want = max < 2 ? 1 : 2; /* used 1: min(2, max), at least STANDBY_LANES */

		EXPECT(c && p && sb);
		if (!c || !sb) {
			return;
		}
		rh_param.STANDBY_LANES_MAX = max;
		pthread_mutex_lock(&c->mu);
		EXPECT_EQ(rh_standby_wanted(c), 1); /* sized small: none used yet */
		h.conn_id = c->id;
		h.epoch = c->epoch;
		pthread_mutex_unlock(&c->mu);
		rh_core_rx_ctrl(sb, &h, NULL); /* the peer's move promoted it: it carries now */
		pthread_mutex_lock(&c->mu);
		EXPECT_EQ(sb->state, RH_LANE_ACTIVE);
		EXPECT_EQ(c->fo.standby_used, 1);
		EXPECT_EQ(rh_standby_wanted(c), want);
		opens0 = tp.opens;
		rh_fo_tick(c, c->fo.t_standby_next_ms - 1); /* the move's time: nothing opened */
		EXPECT_EQ(tp.opens, opens0);
		rh_fo_tick(c, c->fo.t_standby_next_ms);
		EXPECT_EQ(tp.opens, opens0 + want);
		for (int i = opens0; i < tp.opens && i < 64; i++) {
			EXPECT((tp.open_flags[i] & RH_HELLO_F_STANDBY) != 0);
			EXPECT(tp.open_lnic[i] != sb->lnic || tp.open_rnic[i] != sb->rnic);
		}
		/* handshaken, they are enough: the next look opens nothing */
		for (int i = 0; i < c->nlanes; i++) {
			struct rh_lane *l = c->lanes[i];

			for (int k = 0; l->state == RH_LANE_OPENING && k < l->nstreams; k++) {
				pthread_mutex_unlock(&c->mu);
				rh_core_stream_ready(l, NULL);
				pthread_mutex_lock(&c->mu);
			}
		}
		EXPECT_EQ(count_standbys(c), want);
		opens0 = tp.opens;
		rh_fo_tick(c, c->fo.t_standby_next_ms);
		EXPECT_EQ(tp.opens, opens0);
		pthread_mutex_unlock(&c->mu);
		fixture_drop_conn(c);
	}
	rh_param.STANDBY_LANES_MAX = 2;

	/* a move's promotion counts too; STANDBY_LANES=0 keeps them off whatever was used */
	{
		struct rh_lane *p, *sb;
		struct rh_conn *c = conn_with_standby(&p, &sb);

		EXPECT(c && p && sb);
		if (!c || !sb) {
			return;
		}
		pthread_mutex_lock(&c->mu);
		rh_fo_lane_failed(c, p, -ETIMEDOUT, "test: no progress");
		EXPECT_EQ(sb->state, RH_LANE_ACTIVE);
		EXPECT_EQ(c->fo.standby_used, 1);
		EXPECT_EQ(rh_standby_wanted(c), 2);
		rh_param.STANDBY_LANES = 0;
		EXPECT_EQ(rh_standby_wanted(c), 0);
		rh_param.STANDBY_LANES = 1;
		pthread_mutex_unlock(&c->mu);
		fixture_drop_conn(c);
	}
}

int main(void)
{
	setup();
	rh_param.STANDBY_LANES = 1;
	rh_param.STANDBY_LANES_MAX = 2;
	rh_param.BACKUP_LANES = 1;
	test_standby_opened_and_idle();
	test_move_promotes_standby();
	test_promoted_standby_must_be_answered();
	test_move_without_standby_opens();
	test_standby_failure_is_no_move();
	test_acceptor_keeps_standby_apart();
	test_standbys_grow_on_use();
	TEST_DONE();
}
