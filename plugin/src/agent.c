/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Glue between the core and the agent's control plane (ctl.c): applies the shared-memory health
 * table to the local NICs and reports lane events. It plugs into the core as struct
 * rh_ctl_hooks (core/health.h, the only core header it uses): poll runs on the ticker thread,
 * the other hooks on any thread. The plugin works alone whenever the agent is absent, dies or
 * restarts (NICs it marked down are handed back to local detection).
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "core/health.h"
#include "ctl.h"
#include "log.h"
#include "param_node.h"

_Static_assert((int)RH_EVT_LANE_UP == (int)RH_EV_LANE_UP, "event type LANE_UP");
_Static_assert((int)RH_EVT_LANE_DOWN == (int)RH_EV_LANE_DOWN, "event type LANE_DOWN");
_Static_assert((int)RH_EVT_LANE_TIMEOUT == (int)RH_EV_LANE_TIMEOUT, "event type LANE_TIMEOUT");
_Static_assert((int)RH_EVT_LANE_ERROR == (int)RH_EV_LANE_ERROR, "event type LANE_ERROR");
_Static_assert((int)RH_EVT_FAILOVER_START == (int)RH_EV_FAILOVER_START,
	       "event type FAILOVER_START");
_Static_assert((int)RH_EVT_FAILOVER_END == (int)RH_EV_FAILOVER_END, "event type FAILOVER_END");
_Static_assert((int)RH_EVT_FAILBACK == (int)RH_EV_FAILBACK, "event type FAILBACK");
_Static_assert((int)RH_EVT_FAIR_SHARE == (int)RH_EV_FAIR_SHARE, "event type FAIR_SHARE");
_Static_assert((unsigned)RH_EVT_F_STANDBY == RH_EV_F_STANDBY, "event flag STANDBY");
_Static_assert((unsigned)RH_EVT_F_PROMOTED == RH_EV_F_PROMOTED, "event flag PROMOTED");

static struct rh_ctl *ctl; /* set once by the ticker; read by any thread */
static bool ctl_failed;
static bool suspect_by_agent[64]; /* written by the ticker thread (atomically) */
static struct rh_ctl_view view;
static bool down_by_agent[64];
/* The plans of the last accepted snapshot, by local NIC index (read by any thread). */
static pthread_mutex_t plan_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rh_plan_entry plans[64][RH_CTL_MAX_BACKUPS];
static int nplans[64];

static void ctl_log(void *arg, int level, const char *func, int line, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	(void)arg;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* The control plane's INFO lines say whether the agent is there: NCCL_INIT, as start-up. */
	if (level == RH_CTL_LOG_WARN) {
		rh_log(NCCL_LOG_WARN, RH_LOG_ALL, "ctl.c", line, func, "%s", msg);
	} else if (level == RH_CTL_LOG_INFO) {
		rh_log(NCCL_LOG_INFO, RH_LOG_INIT, "ctl.c", line, func, "%s", msg);
	} else {
		rh_log(NCCL_LOG_TRACE, RH_LOG_NET, "ctl.c", line, func, "%s", msg);
	}
}

static bool migrate_on_suspect; /* the node policy's health.migrate_on_suspect */

/* The table's codes in the policy's words (enum rh_ctl_rail_rule, enum rh_distance). */
static const char *rule_word(uint8_t code)
{
	switch (code) {
	case RH_CTL_RULE_SAME_RAIL:
		return "same-rail";
	case RH_CTL_RULE_ALLOWED_PAIRS:
		return "allowed-pairs";
	case RH_CTL_RULE_ANY:
		return "any";
	default:
		return NULL; /* not set by the policy (or a rule this plugin does not know) */
	}
}

static const char *distance_word(uint8_t code)
{
	static const char *const words[] = { "PIX", "PIX", "PXB", "PHB", "NODE", "SYS" };

	/* LOC (another port of the same device) is as near as PIX for a limit */
	return code <= RH_DIST_SYS ? words[code] : NULL;
}

static void apply_policy(const struct rh_ctl_view *v)
{
	struct rh_node_policy p = { .rail_rule = rule_word(v->rail_rule),
				    .distance_limit = distance_word(v->distance_limit),
				    .backup_lanes = v->backup_lanes };

	for (uint32_t i = 0; i < v->nic_count; i++) {
		uint16_t rail = v->nics[i].rail;

		if (rail < RH_NODE_RAIL_PEERS) {
			p.rail_peers[rail] |= v->nics[i].rail_peers;
		}
	}
	rh_params_apply_policy(&p);
}

/* The node policy's settings published with the table (env var > policy > default). */
static void apply_settings(const struct rh_ctl_view *v)
{
	bool mos = v->settings_flags & RH_CTL_S_MIGRATE_ON_SUSPECT;

	rh_params_apply_node(v->completion_ms, v->probe_ms, v->failback_interval_ms);
	apply_policy(v);
	if (mos != migrate_on_suspect) {
		migrate_on_suspect = mos;
		INFO_ENV("node policy: migrate_on_suspect %s (a SUSPECT NIC is %s)",
			 mos ? "on" : "off", mos ? "left at once, as DOWN" : "probed, kept");
	}
}

static void clear_plans(void)
{
	pthread_mutex_lock(&plan_mu);
	memset(nplans, 0, sizeof(nplans));
	pthread_mutex_unlock(&plan_mu);
}

/* Copy the agent's plans, translating its NIC records to our device indices. */
static void take_plans(void)
{
	pthread_mutex_lock(&plan_mu);
	memset(nplans, 0, sizeof(nplans));
	for (int i = 0; i < rh_nic_count() && i < 64; i++) {
		int k = rh_ctl_view_find(&view, rh_nic_name(i));
		const struct rh_ctl_plan *pl;

		if (k < 0) {
			continue;
		}
		pl = &view.plans[k];
		for (int b = 0; b < pl->count && b < RH_CTL_MAX_BACKUPS; b++) {
			const struct rh_ctl_backup *e = &pl->backups[b];
			int lnic = -1;

			if (e->local_nic >= view.nic_count) {
				continue;
			}
			for (int j = 0; j < rh_nic_count(); j++) {
				if (!strcmp(rh_nic_name(j), view.nics[e->local_nic].ifname)) {
					lnic = j;
				}
			}
			if (lnic < 0) {
				continue;
			}
			plans[i][nplans[i]].lnic = lnic;
			plans[i][nplans[i]].remote_rail =
				e->remote_rail == RH_CTL_NO_RAIL ? -1 : e->remote_rail;
			plans[i][nplans[i]].weight = e->weight ? e->weight : 1;
			nplans[i]++;
		}
	}
	pthread_mutex_unlock(&plan_mu);
}

static int agent_plan_for(int lnic, struct rh_plan_entry *out, int max)
{
	int n = 0;

	if (lnic < 0 || lnic >= 64) {
		return 0;
	}
	pthread_mutex_lock(&plan_mu);
	for (; n < nplans[lnic] && n < max; n++) {
		out[n] = plans[lnic][n];
	}
	pthread_mutex_unlock(&plan_mu);
	return n;
}

static void release_all(void)
{
	for (int i = 0; i < rh_nic_count() && i < 64; i++) {
		__atomic_store_n(&suspect_by_agent[i], false, __ATOMIC_RELAXED);
		if (down_by_agent[i]) {
			down_by_agent[i] = false;
			rh_nic_set_health_from(i, RH_HEALTH_AGENT, true);
		}
	}
}

/* Events that cannot be sent yet (before the first poll opens the control plane, or while the
 * agent socket is not connected) wait here, bounded: the oldest are kept, later ones dropped
 * and counted. The ticker retries them in order at every poll. */
#define RH_EVQ_MAX 64
static struct rh_lane_event evq[RH_EVQ_MAX];
static int evq_len;
static unsigned long evq_dropped;
static pthread_mutex_t evq_mu = PTHREAD_MUTEX_INITIALIZER;

static void enqueue(const struct rh_lane_event *ev)
{
	pthread_mutex_lock(&evq_mu);
	if (evq_len < RH_EVQ_MAX) {
		evq[evq_len] = *ev;
		__atomic_store_n(&evq_len, evq_len + 1, __ATOMIC_RELAXED); /* peeked unlocked */
	} else {
		evq_dropped++;
	}
	pthread_mutex_unlock(&evq_mu);
}

static void flush_queued(struct rh_ctl *c)
{
	int sent = 0;

	pthread_mutex_lock(&evq_mu);
	while (sent < evq_len && rh_ctl_send_event(c, &evq[sent]) != -ENOTCONN) {
		sent++; /* sent, or dropped for another reason (full socket, bad event) */
	}
	if (sent) {
		memmove(evq, evq + sent, (size_t)(evq_len - sent) * sizeof(evq[0]));
		__atomic_store_n(&evq_len, evq_len - sent, __ATOMIC_RELAXED);
		if (evq_dropped) {
			INFO("%lu lane event(s) dropped while the agent was not connected",
			     evq_dropped);
			evq_dropped = 0;
		}
	}
	pthread_mutex_unlock(&evq_mu);
}

static bool agent_suspect(int nic)
{
	return nic >= 0 && nic < 64 && __atomic_load_n(&suspect_by_agent[nic], __ATOMIC_RELAXED);
}

static void agent_poll(uint64_t now_ms)
{
	struct rh_ctl_opts o = { .log = ctl_log, .agent_uid = rh_agent_uid() };
	int rc;

	(void)now_ms;
	if (!ctl) {
		if (ctl_failed) {
			return;
		}
		struct rh_ctl *c = NULL;

		rc = rh_ctl_open(rh_run_dir(), &o, &c);
		if (rc == 0) {
			__atomic_store_n(&ctl, c, __ATOMIC_RELEASE);
			flush_queued(c);
		}
		if (rc < 0) {
			ctl_failed = true;
			pthread_mutex_lock(&evq_mu);
			__atomic_store_n(&evq_len, 0, __ATOMIC_RELAXED);
			pthread_mutex_unlock(&evq_mu);
			WARN("agent control plane unavailable (%s): working alone", strerror(-rc));
			return;
		}
	}
	rh_ctl_refresh(ctl);
	if (__atomic_load_n(&evq_len, __ATOMIC_RELAXED) > 0) {
		flush_queued(ctl);
	}
	rc = rh_ctl_snapshot(ctl, &view);
	if (rc < 0) {
		release_all(); /* no agent (or a corrupt table): local detection only */
		clear_plans();
		return;
	}
	if (!view.changed) {
		return;
	}
	take_plans();
	apply_settings(&view);
	for (int i = 0; i < rh_nic_count() && i < 64; i++) {
		int k = rh_ctl_view_find(&view, rh_nic_name(i));
		bool down;

		if (k < 0) {
			continue;
		}
		/* DOWN: move now. RECOVERING: held off by flap damping, not usable yet. SUSPECT: as
		 * DOWN when the node policy says migrate_on_suspect. */
		down = view.nics[k].state == RH_NIC_DOWN ||
		       view.nics[k].state == RH_NIC_RECOVERING ||
		       (migrate_on_suspect && view.nics[k].state == RH_NIC_SUSPECT);
		if (view.nics[k].state == RH_NIC_SUSPECT && !suspect_by_agent[i]) {
			INFO("agent marks %s suspect (reason %u): probing its lanes",
			     rh_nic_name(i), view.nics[k].reason);
			rh_nic_suspect(i);
		}
		__atomic_store_n(&suspect_by_agent[i], view.nics[k].state == RH_NIC_SUSPECT,
				 __ATOMIC_RELAXED);
		if (down != down_by_agent[i]) {
			down_by_agent[i] = down;
			INFO_INIT("agent marks %s %s (reason %u)", rh_nic_name(i),
				  down ? "down" : "up", view.nics[k].reason);
			rh_nic_set_health_from(i, RH_HEALTH_AGENT, !down);
		}
	}
}

static void ipv4_mapped(uint8_t out[16], uint32_t ip)
{
	memset(out, 0, 16);
	if (ip) {
		out[10] = 0xff;
		out[11] = 0xff;
		memcpy(out + 12, &ip, 4);
	}
}

static void agent_lane_event(int type, uint64_t conn_id, uint32_t epoch, uint32_t lane, int lnic,
			     int err, uint64_t duration_ns, const struct rh_lane_info *info)
{
	struct rh_ctl *c = __atomic_load_n(&ctl, __ATOMIC_ACQUIRE);
	struct rh_lane_event ev;

	if (lnic < 0 || lnic >= rh_nic_count() || (!c && ctl_failed)) {
		return;
	}
	rh_lane_event_init(&ev, (uint16_t)type);
	ev.conn_id = conn_id;
	ev.epoch = epoch;
	ev.lane = lane;
	ev.error = err < 0 ? -err : err;
	ev.duration_ns = duration_ns;
	snprintf(ev.nic, sizeof(ev.nic), "%s", rh_nic_name(lnic));
	if (info) {
		int n = info->nports < RH_EV_MAX_PORTS ? info->nports : RH_EV_MAX_PORTS;

		snprintf(ev.remote_nic, sizeof(ev.remote_nic), "%s", info->rnic);
		ipv4_mapped(ev.local_addr, info->laddr);
		ipv4_mapped(ev.remote_addr, info->raddr);
		ev.nports = (uint16_t)(n > 0 ? n : 0);
		for (int i = 0; i < n; i++) {
			ev.local_ports[i] = info->lports[i];
			ev.remote_ports[i] = info->rports[i];
		}
		ev.bytes_replayed = info->bytes_replayed;
		ev.flags = info->flags;
	}
	if (!c || __atomic_load_n(&evq_len, __ATOMIC_RELAXED) > 0 ||
	    rh_ctl_send_event(c, &ev) == -ENOTCONN) {
		enqueue(&ev); /* keeps the order: queued ones go first */
	}
}

/* Plugin shutdown (no ticker or I/O thread left): close the control plane (table mapping,
 * agent socket) and forget its state, so a later start begins afresh. */
static void agent_shutdown(void)
{
	struct rh_ctl *c = __atomic_exchange_n(&ctl, NULL, __ATOMIC_ACQ_REL);

	if (c) {
		rh_ctl_close(c);
	}
	ctl_failed = false;
	memset(suspect_by_agent, 0, sizeof(suspect_by_agent));
	memset(down_by_agent, 0, sizeof(down_by_agent));
	memset(&view, 0, sizeof(view));
	clear_plans();
	pthread_mutex_lock(&evq_mu);
	__atomic_store_n(&evq_len, 0, __ATOMIC_RELAXED);
	evq_dropped = 0;
	pthread_mutex_unlock(&evq_mu);
}

static const struct rh_ctl_hooks agent_hooks = {
	.lane_event = agent_lane_event,
	.plan_for = agent_plan_for,
	.suspect = agent_suspect,
	.poll = agent_poll,
	.shutdown = agent_shutdown,
};

void rh_agent_register(void)
{
	rh_health_set_hooks(&agent_hooks);
}
