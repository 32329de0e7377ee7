/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Logging and error propagation. Messages go through the logger NCCL passed to init (so
 * NCCL_DEBUG / NCCL_DEBUG_SUBSYS=NET apply), prefixed "railhop"; before init and after the
 * plugin has stopped only WARN reaches stderr. Inside the plugin every function returns 0 or a
 * negative errno; ncclResult_t exists only in api_nccl.c; CHECK() propagates one.
 */
#ifndef RH_LOG_H
#define RH_LOG_H

#include "nccl/common.h"

void rh_log_set(ncclDebugLogger_t logger);
/* Forget the host's logger (plugin shutdown: the host may release it right after). */
void rh_log_clear(void);
void rh_log(ncclDebugLogLevel level, const char *file, int line, const char *func, const char *fmt,
	    ...) __attribute__((format(printf, 5, 6)));

#define WARN(...) rh_log(NCCL_LOG_WARN, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define INFO(...) rh_log(NCCL_LOG_INFO, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define TRACE(...) rh_log(NCCL_LOG_TRACE, __FILE__, __LINE__, __func__, __VA_ARGS__)

/* Propagate a negative errno result. */
#define CHECK(call)                                            \
	do {                                                   \
		int rh_rc_ = (call);                           \
		if (rh_rc_ < 0) {                              \
			TRACE("%s failed: %d", #call, rh_rc_); \
			return rh_rc_;                         \
		}                                              \
	} while (0)

#endif
