/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Logging and error propagation. Messages go through the logger NCCL passed to init, prefixed
 * "NET/railhop", so NCCL_DEBUG / NCCL_DEBUG_SUBSYS apply as they do to NCCL's own lines; before
 * init and after the plugin has stopped only WARN reaches stderr. Subsystems follow NCCL:
 * WARN carries NCCL_ALL (shown whatever NCCL_DEBUG_SUBSYS says), INFO_INIT (initialisation, the
 * NIC list, the transport, the agent's presence) NCCL_INIT|NCCL_NET, INFO_ENV (parameters)
 * NCCL_ENV, plain INFO and TRACE NCCL_NET. NCCL's default subsystems are INIT,BOOTSTRAP,ENV, so
 * plain NCCL_DEBUG=INFO shows start-up and every failover; the data-path detail needs NET. Inside the plugin every function returns 0 or a
 * negative errno; ncclResult_t exists only in api_nccl.c; CHECK() propagates one.
 */
#ifndef RH_LOG_H
#define RH_LOG_H

#include "nccl/common.h"

void rh_log_set(ncclDebugLogger_t logger);
/* Forget the host's logger (plugin shutdown: the host may release it right after). */
void rh_log_clear(void);
void rh_log(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
	    const char *func, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#define RH_LOG_INIT ((unsigned long)(NCCL_INIT | NCCL_NET))
#define RH_LOG_ENV ((unsigned long)NCCL_ENV)
#define RH_LOG_NET ((unsigned long)NCCL_NET)
#define RH_LOG_ALL ((unsigned long)NCCL_ALL)

#define WARN(...) rh_log(NCCL_LOG_WARN, RH_LOG_ALL, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define INFO(...) rh_log(NCCL_LOG_INFO, RH_LOG_NET, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define INFO_INIT(...) rh_log(NCCL_LOG_INFO, RH_LOG_INIT, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define INFO_ENV(...) rh_log(NCCL_LOG_INFO, RH_LOG_ENV, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define TRACE(...) rh_log(NCCL_LOG_TRACE, RH_LOG_NET, __FILE__, __LINE__, __func__, __VA_ARGS__)

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
