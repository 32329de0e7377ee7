/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A transport that does nothing, for unit tests that drive the core without a lane: every
 * mandatory lane_ops callback (core/lane_ops.h), so the table passes the core's registration
 * check. start and listen succeed; open and probe fail with -ENODEV (no lane or probe ever
 * gets anywhere); stalled says no. A test copies stub_lane_ops and replaces what it watches.
 */
#ifndef RH_TEST_LANE_STUB_H
#define RH_TEST_LANE_STUB_H

#include <errno.h>

#include "core/lane_ops.h"

static int stub_start(int nthreads)
{
	(void)nthreads;
	return 0;
}

static int stub_listen(int nic)
{
	(void)nic;
	return 0;
}

static int stub_open(struct rh_lane *l, const struct rh_hello *h, uint64_t id, uint32_t epoch,
		     uint32_t ip, uint16_t port)
{
	(void)l, (void)h, (void)id, (void)epoch, (void)ip, (void)port;
	return -ENODEV;
}

static void stub_lane(struct rh_lane *l)
{
	(void)l;
}

static bool stub_stalled(struct rh_lane *l, uint64_t now_ms, int timeout_ms)
{
	(void)l, (void)now_ms, (void)timeout_ms;
	return false;
}

static int stub_probe(struct rh_conn *conn, int lnic, uint32_t ip, uint16_t port, uint64_t cookie,
		      int timeout_ms)
{
	(void)conn, (void)lnic, (void)ip, (void)port, (void)cookie, (void)timeout_ms;
	return -ENODEV;
}

static const struct lane_ops stub_lane_ops = {
	.name = "stub",
	.start = stub_start,
	.listen = stub_listen,
	.open = stub_open,
	.kick = stub_lane,
	.fence = stub_lane,
	.stalled = stub_stalled,
	.probe = stub_probe,
};

#endif
