/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NCCL's subsystem conventions: start-up lines (NIC list, transport) carry NCCL_INIT,
 * parameters NCCL_ENV, WARN every subsystem, so NCCL's default NCCL_DEBUG_SUBSYS
 * (INIT,BOOTSTRAP,ENV) shows them under plain NCCL_DEBUG=INFO. A capturing logger records the
 * level and flags of each line the plugin's functions emit.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lanes/lanes.h"
#include "log.h"
#include "nic.h"
#include "param.h"

#define MAXLINES 256
#define DEFAULT_SUBSYS ((unsigned long)(NCCL_INIT | NCCL_BOOTSTRAP | NCCL_ENV))

static struct {
	ncclDebugLogLevel level;
	unsigned long flags;
	char msg[256];
} lines[MAXLINES];
static int nlines;

static void capture(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		    const char *fmt, ...)
{
	va_list ap;

	(void)file;
	(void)line;
	if (nlines >= MAXLINES) {
		return;
	}
	lines[nlines].level = level;
	lines[nlines].flags = flags;
	va_start(ap, fmt);
	vsnprintf(lines[nlines].msg, sizeof(lines[nlines].msg), fmt, ap);
	va_end(ap);
	nlines++;
}

/* Index of the first captured line containing s, or -1. */
static int find(const char *s)
{
	for (int i = 0; i < nlines; i++) {
		if (strstr(lines[i].msg, s)) {
			return i;
		}
	}
	return -1;
}

/* What NCCL does with a line under NCCL_DEBUG=INFO and the default NCCL_DEBUG_SUBSYS. */
static int shown_by_default(int i)
{
	return i >= 0 && lines[i].level <= NCCL_LOG_INFO && (lines[i].flags & DEFAULT_SUBSYS);
}

int main(void)
{
	struct rh_nic nics[RH_MAX_NICS];
	int i, n;

	rh_log_set(capture);

	/* Parameters: NCCL_ENV, each with its source. */
	setenv("RAILHOP_CHUNK_SIZE", "262144", 1);
	EXPECT_EQ(rh_params_load(), 0);
	i = find("RAILHOP_CHUNK_SIZE=262144 (env)");
	EXPECT(i >= 0);
	EXPECT(i >= 0 && lines[i].level == NCCL_LOG_INFO && lines[i].flags == NCCL_ENV);
	EXPECT(shown_by_default(i));
	i = find("RAILHOP_TRANSPORT=\"auto\" (default)");
	EXPECT(i >= 0 && lines[i].flags == NCCL_ENV);

	/* A bad parameter: WARN, every subsystem. */
	nlines = 0;
	setenv("RAILHOP_CHUNK_SIZE", "lots", 1);
	EXPECT(rh_params_load() < 0);
	i = find("RAILHOP_CHUNK_SIZE=\"lots\"");
	EXPECT(i >= 0 && lines[i].level == NCCL_LOG_WARN &&
	       lines[i].flags == (unsigned long)NCCL_ALL);
	unsetenv("RAILHOP_CHUNK_SIZE");
	EXPECT_EQ(rh_params_load(), 0);

	/* The NIC list: NCCL_INIT|NCCL_NET. lo has 127.0.0.1 on every Linux host. */
	nlines = 0;
	setenv("RAILHOP_NICS", "=lo:3", 1);
	EXPECT_EQ(rh_params_load(), 0);
	n = rh_nic_discover(nics, RH_MAX_NICS);
	EXPECT_EQ(n, 1);
	i = find("NIC 0: lo 127.0.0.1 rail 3");
	EXPECT(i >= 0 && lines[i].level == NCCL_LOG_INFO &&
	       lines[i].flags == (unsigned long)(NCCL_INIT | NCCL_NET));
	EXPECT(shown_by_default(i));

	/* The transport chosen, and why: NCCL_INIT|NCCL_NET. */
	nlines = 0;
	setenv("RAILHOP_TRANSPORT", "tcp", 1);
	EXPECT_EQ(rh_params_load(), 0);
	EXPECT(rh_lanes_choose() != NULL);
	i = find("transport tcp (RAILHOP_TRANSPORT=tcp)");
	EXPECT(i >= 0 && lines[i].flags == (unsigned long)(NCCL_INIT | NCCL_NET));
	EXPECT(shown_by_default(i));

	/* Data-path detail stays under NCCL_NET only: hidden by default. */
	nlines = 0;
	INFO("detail %d", 1);
	EXPECT_EQ(nlines, 1);
	EXPECT(lines[0].flags == NCCL_NET && !shown_by_default(0));
	EXPECT(strstr(lines[0].msg, "detail 1") != NULL);

	rh_log_clear();
	TEST_DONE();
}
