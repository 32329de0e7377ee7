/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport's registration with the core (core/lane_ops.h), with no lane linked in: this
 * binary links the core library alone, so it also shows that the core names no transport.
 *  - rh_core_check_ops: a table lacking mandatory callbacks is refused, naming each one;
 *  - init with no transport registered, or with a picker that finds none, or with one whose
 *    table lacks callbacks, fails with a clear WARN and leaves the plugin stopped;
 *  - a complete fake transport registered the way api_nccl.c does it starts and stops with
 *    the plugin's lifecycle (start, a listener per NIC, stop at the last finalize).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/lane_ops.h"
#include "lane_stub.h"
#include "rh.h"

/* --- a capturing logger: the WARN lines init leaves --- */

static char warns[16][256];
static int nwarns;

static void capture(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		    const char *fmt, ...)
{
	va_list ap;

	(void)flags;
	(void)file;
	(void)line;
	if (level != NCCL_LOG_WARN || nwarns >= 16) {
		return;
	}
	va_start(ap, fmt);
	vsnprintf(warns[nwarns++], sizeof(warns[0]), fmt, ap);
	va_end(ap);
}

static bool warned(const char *s)
{
	for (int i = 0; i < nwarns; i++) {
		if (strstr(warns[i], s)) {
			return true;
		}
	}
	return false;
}

/* --- a fake transport that counts what the core asks of it --- */

static struct {
	int starts, stops, listens;
} fk;

static int fk_start(int nthreads)
{
	(void)nthreads;
	fk.starts++;
	return 0;
}

static void fk_stop(void)
{
	fk.stops++;
}

static int fk_listen(int nic)
{
	rh_core_nic(nic)->port = htons((uint16_t)(5000 + nic));
	fk.listens++;
	return 0;
}

/* The stub transport with counting start, stop and listen; partial_ops lacks listen and probe,
 * nameless_ops its name (both filled in by main). */
static struct lane_ops fake_ops, partial_ops, nameless_ops;

static const struct lane_ops *pick_fake(void)
{
	return &fake_ops;
}

static const struct lane_ops *pick_partial(void)
{
	return &partial_ops;
}

static const struct lane_ops *pick_none(void)
{
	return NULL;
}

int main(void)
{
	char msg[160];

	fake_ops = stub_lane_ops;
	fake_ops.name = "fake";
	fake_ops.start = fk_start;
	fake_ops.stop = fk_stop;
	fake_ops.listen = fk_listen;
	partial_ops = fake_ops;
	partial_ops.name = "partial";
	partial_ops.listen = NULL;
	partial_ops.probe = NULL;
	nameless_ops = fake_ops;
	nameless_ops.name = NULL;
	setenv("RAILHOP_NICS", "lo", 1);
	setenv("RAILHOP_RUN_DIR", "/nonexistent/railhop-test", 1);

	/* The check itself. */
	EXPECT_EQ(rh_core_check_ops(&fake_ops, msg, sizeof(msg)), 0);
	EXPECT_EQ(msg[0], 0);
	EXPECT_EQ(rh_core_check_ops(&partial_ops, msg, sizeof(msg)), -EINVAL);
	EXPECT(strstr(msg, "transport partial lacks mandatory lane_ops: listen, probe") != NULL);
	EXPECT_EQ(rh_core_check_ops(&nameless_ops, msg, sizeof(msg)), -EINVAL);
	EXPECT(strstr(msg, "transport without a name") != NULL);
	EXPECT_EQ(rh_core_check_ops(NULL, msg, sizeof(msg)), -EINVAL);
	EXPECT(strstr(msg, "no transport registered") != NULL);

	/* Init before any registration: refused, plugin stopped. */
	nwarns = 0;
	EXPECT_EQ(rh_init_ctx(capture), -EPROTONOSUPPORT);
	EXPECT(warned("no transport registered"));
	EXPECT(!rh_running());

	/* A picker that finds nothing (it logs why itself): refused. */
	rh_core_set_transport(pick_none);
	EXPECT_EQ(rh_init_ctx(capture), -EPROTONOSUPPORT);
	EXPECT(!rh_running());

	/* A table lacking callbacks: refused before anything of it runs. */
	nwarns = 0;
	rh_core_set_transport(pick_partial);
	EXPECT_EQ(rh_init_ctx(capture), -EINVAL);
	EXPECT(warned("transport partial lacks mandatory lane_ops: listen, probe"));
	EXPECT(!rh_running());
	EXPECT_EQ(fk.starts, 0);

	/* Registered as api_nccl.c does: started with the plugin, a listener per NIC, stopped
	 * with the last context. */
	rh_core_set_transport(pick_fake);
	EXPECT_EQ(rh_init_ctx(capture), 0);
	EXPECT(rh_running());
	EXPECT_EQ(fk.starts, 1);
	EXPECT_EQ(fk.listens, 1);
	/* Another transport while this one runs: refused; the same one: fine. */
	EXPECT_EQ(rh_core_register_ops(&nameless_ops), -EBUSY);
	EXPECT_EQ(rh_core_register_ops(&fake_ops), 0);
	rh_finalize_ctx();
	EXPECT(!rh_running());
	EXPECT_EQ(fk.stops, 1);

	/* Stopped, a unit test may install a table directly (checked all the same). */
	EXPECT_EQ(rh_core_register_ops(&partial_ops), -EINVAL);
	EXPECT_EQ(rh_core_register_ops(&fake_ops), 0);
	TEST_DONE();
}
