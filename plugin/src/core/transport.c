/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport's registration with the core (core/lane_ops.h): the assembly point hands the
 * core a picker, the core runs it at each start and checks the table it returns for the
 * mandatory callbacks before any lane uses it, as the Linux RDMA core checks a device's ops in
 * ib_register_device(). The core names no transport: which tables exist is the lanes' business
 * and which one runs is the assembly point's.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../log.h"
#include "../rh.h"
#include "conn.h"

static rh_transport_pick_fn transport_pick;

void rh_core_set_transport(rh_transport_pick_fn pick)
{
	__atomic_store_n(&transport_pick, pick, __ATOMIC_RELEASE);
}

int rh_core_check_ops(const struct lane_ops *ops, char *msg, size_t cap)
{
	/* The callbacks the core calls without looking first. */
	const struct {
		const char *name;
		bool present;
	} need[] = {
		{ "start", ops && ops->start }, { "listen", ops && ops->listen },
		{ "open", ops && ops->open },	{ "kick", ops && ops->kick },
		{ "fence", ops && ops->fence }, { "stalled", ops && ops->stalled },
		{ "probe", ops && ops->probe },
	};
	char missing[96] = "";
	size_t off = 0;
	char buf[160];

	if (!ops) {
		snprintf(buf, sizeof(buf), "no transport registered");
	} else {
		for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
			if (!need[i].present && off < sizeof(missing)) {
				off += (size_t)snprintf(missing + off, sizeof(missing) - off,
							"%s%s", off ? ", " : "", need[i].name);
			}
		}
		if (!ops->name || !ops->name[0]) {
			snprintf(buf, sizeof(buf), "transport without a name%s%s",
				 off ? ": lacks " : "", missing);
		} else if (off) {
			snprintf(buf, sizeof(buf), "transport %s lacks mandatory lane_ops: %s",
				 ops->name, missing);
		} else {
			if (msg && cap) {
				msg[0] = 0;
			}
			return 0;
		}
	}
	WARN("%s", buf);
	if (msg && cap) {
		snprintf(msg, cap, "%s", buf);
	}
	return -EINVAL;
}

static int install(const struct lane_ops *ops)
{
	int rc = rh_core_check_ops(ops, NULL, 0);

	if (rc == 0) {
		rh_g.ops = ops;
	}
	return rc;
}

int rh_core_register_ops(const struct lane_ops *ops)
{
	if (rh_running() && rh_g.ops && rh_g.ops != ops) {
		WARN("transport %s registered while the plugin runs over %s",
		     ops && ops->name ? ops->name : "(null)", rh_g.ops->name);
		return -EBUSY;
	}
	return install(ops);
}

int rh_transport_start(void)
{
	rh_transport_pick_fn pick = __atomic_load_n(&transport_pick, __ATOMIC_ACQUIRE);
	const struct lane_ops *ops;

	if (!pick) {
		WARN("no transport registered (the assembly point calls rh_core_set_transport() "
		     "before init)");
		return -EPROTONOSUPPORT;
	}
	ops = pick();
	if (!ops) {
		return -EPROTONOSUPPORT; /* the picker said why */
	}
	return install(ops);
}
