/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A ready connection for the core's unit tests (test_failover.c, test_standby.c): a peer of
 * nnics NICs on rail 0, its primary lane (local NIC 0 -> peer NIC 0) ACTIVE and the control
 * lane. The sending side opened that lane itself (through the registered transport's open);
 * the receiving side accepted it from the peer (lane 1, a bare stream table). Needs the core's
 * private header (a test of core/ is built with it) and a transport registered.
 */
#ifndef RH_TEST_CONN_FIXTURE_H
#define RH_TEST_CONN_FIXTURE_H

#include <arpa/inet.h>
#include <stdlib.h>

#include "core/conn.h"
#include "core/wire.h"

/* A new id, the chunk size and the peer's NIC table (nnics NICs, rail 0, all up). */
static inline void fixture_peer_nics(struct rh_conn *c, int nnics)
{
	c->id = rh_random_id();
	c->chunk = 1u << 19;
	c->nrnics = nnics;
	for (int i = 0; i < nnics; i++) {
		c->rnics[i].ipv4 = htonl(0x0a000101u + (uint32_t)i);
		c->rnics[i].port = htons(5000);
		c->rnics[i].rail = 0;
		c->rnics[i].numa = -1;
		c->rnics[i].up = true;
	}
}

static inline struct rh_conn *fixture_ready_conn(bool is_send, int nnics, struct rh_lane **primary)
{
	struct rh_conn *c = rh_conn_new(is_send);
	struct rh_lane *l;

	*primary = NULL;
	if (!c) {
		return NULL;
	}
	fixture_peer_nics(c, nnics);
	pthread_mutex_lock(&c->mu);
	l = rh_conn_add_lane(c, is_send ? 0 : 1, 0, 0, 2, is_send);
	if (l) {
		c->next_lane_id = is_send ? 2 : 3;
		if (is_send) {
			rh_conn_open_lane(c, l, RH_HELLO_CONN, 1000);
		} else {
			l->tp = calloc(1, sizeof(struct rh_lane_streams));
		}
		l->state = RH_LANE_ACTIVE;
		c->ready = true;
		c->have_nonces = true; /* as after the founding hello's proven reply */
		rh_conn_pick_ctrl_lane(c);
	}
	pthread_mutex_unlock(&c->mu);
	*primary = l;
	return c;
}

/* Close it as the user would: every lane fenced, the test's reference dropped. */
static inline void fixture_drop_conn(struct rh_conn *c)
{
	pthread_mutex_lock(&c->mu);
	atomic_store(&c->closed, true);
	for (int i = 0; i < c->nlanes; i++) {
		rh_conn_fence_lane(c, c->lanes[i]);
	}
	pthread_mutex_unlock(&c->mu);
	rh_core_conn_put(c);
}

#endif
