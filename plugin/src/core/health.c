/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NIC health (sources holding each local NIC down), carrier polling, the ticker thread and the
 * control-plane hooks (core/health.h). Marking a NIC down fails every lane on it; the ticker
 * polls carrier, the registered control plane and every connection's failure detection.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "../log.h"
#include "../param.h"
#include "conn.h"
#include "health.h"

static const struct rh_ctl_hooks *hooks; /* atomic; NULL: standalone */

void rh_health_set_hooks(const struct rh_ctl_hooks *h)
{
	__atomic_store_n(&hooks, h, __ATOMIC_RELEASE);
}

static const struct rh_ctl_hooks *ctl_hooks(void)
{
	return __atomic_load_n(&hooks, __ATOMIC_ACQUIRE);
}

void rh_health_lane_event(int type, uint64_t conn_id, uint32_t epoch, uint32_t lane, int lnic,
			  int err, uint64_t duration_ns, const struct rh_lane_info *info)
{
	const struct rh_ctl_hooks *h = ctl_hooks();

	if (h && h->lane_event) {
		h->lane_event(type, conn_id, epoch, lane, lnic, err, duration_ns, info);
	}
}

int rh_health_plan_for(int lnic, struct rh_plan_entry *out, int max)
{
	const struct rh_ctl_hooks *h = ctl_hooks();

	return h && h->plan_for ? h->plan_for(lnic, out, max) : 0;
}

bool rh_health_nic_suspect(int nic)
{
	const struct rh_ctl_hooks *h = ctl_hooks();

	return h && h->suspect && h->suspect(nic);
}

static uint32_t down_mask[RH_MAX_NICS]; /* sources holding each NIC down (ticker/API) */
static pthread_mutex_t health_mu = PTHREAD_MUTEX_INITIALIZER;
static bool down_by_carrier[RH_MAX_NICS]; /* ticker (and start, before the ticker runs) */

void rh_health_reset(void)
{
	pthread_mutex_lock(&health_mu);
	memset(down_mask, 0, sizeof(down_mask));
	memset(down_by_carrier, 0, sizeof(down_by_carrier));
	pthread_mutex_unlock(&health_mu);
	for (int i = 0; i < rh_g.nnics; i++) {
		__atomic_store_n(&rh_g.nics[i].up, true, __ATOMIC_RELEASE);
	}
}

void rh_health_shutdown(void)
{
	const struct rh_ctl_hooks *h = ctl_hooks();

	if (h && h->shutdown) {
		h->shutdown();
	}
}

void rh_nic_set_health_from(int nic, enum rh_health_src src, bool up)
{
	struct rh_conn *list[RH_SNAPSHOT_MAX];
	int n;
	bool now_up;

	if (nic < 0 || nic >= rh_g.nnics) {
		return;
	}
	pthread_mutex_lock(&health_mu);
	if (up) {
		down_mask[nic] &= ~(uint32_t)src;
	} else {
		down_mask[nic] |= (uint32_t)src;
	}
	now_up = down_mask[nic] == 0;
	pthread_mutex_unlock(&health_mu);
	if (__atomic_exchange_n(&rh_g.nics[nic].up, now_up, __ATOMIC_ACQ_REL) == now_up) {
		return;
	}
	WARN("NIC %s marked %s (%s)", rh_g.nics[nic].ifname, now_up ? "up" : "down",
	     src == RH_HEALTH_CARRIER ? "carrier" :
	     src == RH_HEALTH_AGENT   ? "agent" :
					"api");
	if (now_up) {
		return;
	}
	n = rh_registry_snapshot(list);
	for (int i = 0; i < n; i++) {
		struct rh_conn *c = list[i];

		pthread_mutex_lock(&c->mu);
		for (int k = 0; k < c->nlanes; k++) {
			struct rh_lane *l = c->lanes[k];

			if (l->lnic == nic && l->state != RH_LANE_DEAD) {
				rh_fo_lane_failed(c, l, -ENETDOWN, "local NIC down");
			}
		}
		pthread_mutex_unlock(&c->mu);
		rh_core_conn_put(c);
	}
}

void rh_nic_suspect(int nic)
{
	struct rh_conn *list[RH_SNAPSHOT_MAX];
	int n;

	if (nic < 0 || nic >= rh_g.nnics) {
		return;
	}
	n = rh_registry_snapshot(list);
	for (int i = 0; i < n; i++) {
		struct rh_conn *c = list[i];

		pthread_mutex_lock(&c->mu);
		for (int k = 0; k < c->nlanes && !c->err; k++) {
			struct rh_lane *l = c->lanes[k];

			if (l->lnic == nic) {
				rh_fo_confirm(c, l, "probe failed (NIC suspect)");
			}
		}
		pthread_mutex_unlock(&c->mu);
		rh_core_conn_put(c);
	}
}

void rh_nic_set_health(int nic, bool up)
{
	rh_nic_set_health_from(nic, RH_HEALTH_API, up);
}

int rh_nic_count(void)
{
	return rh_g.nnics;
}

const char *rh_nic_name(int nic)
{
	return nic >= 0 && nic < rh_g.nnics ? rh_g.nics[nic].ifname : "";
}

const char *rh_run_dir(void)
{
	return rh_param.RUN_DIR;
}

int64_t rh_agent_uid(void)
{
	return rh_param.AGENT_UID;
}

void rh_health_poll_carrier(void)
{
	for (int i = 0; i < rh_g.nnics; i++) {
		int c = rh_nic_read_carrier(rh_param.SYSFS_ROOT, rh_g.nics[i].ifname);

		if (c == 0 && !down_by_carrier[i]) {
			down_by_carrier[i] = true;
			rh_nic_set_health_from(i, RH_HEALTH_CARRIER, false);
		} else if (c == 1 && down_by_carrier[i]) {
			down_by_carrier[i] = false;
			rh_nic_set_health_from(i, RH_HEALTH_CARRIER, true);
		}
	}
}

static pthread_t ticker_th;
static atomic_bool ticker_stop;

/* Every 20 ms: carrier (every CARRIER_POLL ms), the control plane, every connection. */
static void *ticker(void *arg)
{
	uint64_t last_carrier = 0;

	(void)arg;
	while (!atomic_load(&ticker_stop)) {
		struct timespec ts = { 0, 20 * 1000 * 1000 };
		const struct rh_ctl_hooks *h;
		uint64_t now;

		nanosleep(&ts, NULL);
		now = rh_now_ms();
		if (rh_param.CARRIER_POLL > 0 &&
		    now - last_carrier >= (uint64_t)rh_param.CARRIER_POLL) {
			last_carrier = now;
			rh_health_poll_carrier();
		}
		h = ctl_hooks();
		if (h && h->poll) {
			h->poll(now);
		}
		rh_registry_tick(now);
	}
	return NULL;
}

int rh_health_start_ticker(void)
{
	int rc;

	atomic_store(&ticker_stop, false);
	rc = pthread_create(&ticker_th, NULL, ticker, NULL);
	if (rc != 0) {
		WARN("cannot start the ticker thread: %s", strerror(rc));
		return -rc;
	}
	pthread_setname_np(ticker_th, "railhop-tick");
	return 0;
}

void rh_health_stop_ticker(void)
{
	atomic_store(&ticker_stop, true);
	pthread_join(ticker_th, NULL); /* it sleeps 20 ms between rounds */
}
