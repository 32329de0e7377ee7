/* SPDX-License-Identifier: Apache-2.0 */
#include <stdarg.h>
#include <stdio.h>

#include "log.h"

static ncclDebugLogger_t g_logger;

void rh_log_set(ncclDebugLogger_t logger)
{
	if (logger) {
		__atomic_store_n(&g_logger, logger, __ATOMIC_RELEASE);
	}
}

void rh_log_clear(void)
{
	__atomic_store_n(&g_logger, NULL, __ATOMIC_RELEASE);
}

void rh_log(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
	    const char *func, const char *fmt, ...)
{
	ncclDebugLogger_t logger = __atomic_load_n(&g_logger, __ATOMIC_ACQUIRE);
	char msg[768];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (logger) {
		logger(level, flags, file, line, "NET/railhop %s: %s", func, msg);
	} else if (level == NCCL_LOG_WARN) {
		fprintf(stderr, "railhop WARN %s:%d %s: %s\n", file, line, func, msg);
	}
}
