/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <strings.h>

#include "log.h"
#include "param.h"
#include "param_node.h"

extern char **environ;

#define RH_PARAM_DEF_int(def) (def)
#define RH_PARAM_DEF_str(def) (def)
#define X(name, type, def, doc) .name = RH_PARAM_DEF_##type(def),
struct rh_params rh_param = { RH_PARAMS(X) };
const struct rh_params rh_param_defaults = { RH_PARAMS(X) };
#undef X
struct rh_param_env rh_param_env;
uint64_t rh_param_rail_peers[RH_RAIL_PEER_MAX + 1];

/* RAILHOP_* variables used by other railhop components (not plugin parameters). */
static const char *const other_names[] = {
	"PLUGIN_PATH",	"HARNESS_PATH", "HARNESS_VERBOSE", "POLICY",	 "TEST",
	"METRICS_PORT", "METRICS_ADDR", "TRACE_FILE",	   "LOG_FORMAT", NULL
};

int rh_parse_int(const char *s, int64_t min, int64_t max, int64_t *out)
{
	char *end;
	long long v;

	if (!s || !*s) {
		return -EINVAL;
	}
	errno = 0;
	v = strtoll(s, &end, 0);
	if (errno || *end || v < min || v > max) {
		return -EINVAL;
	}
	*out = v;
	return 0;
}

/* indexed by enum rh_rail_rule: the policy's words */
static const char *const rule_names[] = { "same-rail", "any", "allowed-pairs" };

int rh_parse_rail_rule(const char *s, enum rh_rail_rule *out)
{
	for (int i = 0; i <= RH_RAIL_ALLOWED_PAIRS; i++) {
		if (!strcasecmp(s, rule_names[i])) {
			*out = (enum rh_rail_rule)i;
			return 0;
		}
	}
	if (!strcasecmp(s, "same")) {
		*out = RH_RAIL_SAME;
		return 1;
	}
	return -EINVAL;
}

const char *rh_rail_rule_name(enum rh_rail_rule r)
{
	return r <= RH_RAIL_ALLOWED_PAIRS ? rule_names[r] : "?";
}

static const char *const dist_names[] = { "PIX", "PXB", "PHB", "NODE", "SYS" };

int rh_parse_dist(const char *s, enum rh_dist *out)
{
	for (int i = 0; i <= RH_DIST_SYS; i++) {
		if (!strcasecmp(s, dist_names[i])) {
			*out = (enum rh_dist)i;
			return 0;
		}
	}
	return -EINVAL;
}

const char *rh_dist_name(enum rh_dist d)
{
	return d <= RH_DIST_SYS ? dist_names[d] : "?";
}

bool rh_param_known(const char *name)
{
#define X(pname, type, def, doc)     \
	if (!strcmp(name, #pname)) { \
		return true;         \
	}
	RH_PARAMS(X)
#undef X
	for (int i = 0; other_names[i]; i++) {
		if (!strcmp(name, other_names[i])) {
			return true;
		}
	}
	return false;
}

int64_t rh_param_pick(bool from_env, int64_t current, uint32_t policy, int64_t def)
{
	if (from_env) {
		return current;
	}
	return policy >= 10 ? (int64_t)policy : def;
}

static void apply_node(const char *name, bool from_env, int64_t *field, uint32_t policy_ms,
		       int64_t def)
{
	int64_t now = __atomic_load_n(field, __ATOMIC_RELAXED);
	int64_t want = rh_param_pick(from_env, now, policy_ms, def);

	if (want != now) {
		/* read by other threads without a lock: one aligned 8-byte store */
		__atomic_store_n(field, want, __ATOMIC_RELAXED);
		INFO_ENV("RAILHOP_%s=%lld (%s)", name, (long long)want,
			 policy_ms < 10 ? "default: the node policy sets none" :
					  "node policy, via the agent");
	}
}

void rh_params_apply_node(uint32_t completion_ms, uint32_t probe_ms, uint32_t failback_interval_ms)
{
	apply_node("COMPLETION_TIMEOUT", rh_param_env.COMPLETION_TIMEOUT,
		   &rh_param.COMPLETION_TIMEOUT, completion_ms,
		   rh_param_defaults.COMPLETION_TIMEOUT);
	apply_node("PROBE_TIMEOUT", rh_param_env.PROBE_TIMEOUT, &rh_param.PROBE_TIMEOUT, probe_ms,
		   rh_param_defaults.PROBE_TIMEOUT);
	apply_node("FAILBACK_INTERVAL", rh_param_env.FAILBACK_INTERVAL, &rh_param.FAILBACK_INTERVAL,
		   failback_interval_ms, rh_param_defaults.FAILBACK_INTERVAL);
}

/* The job's variable wins over the node policy: said once per parameter (one INFO line). */
static struct {
	bool rail_rule, distance_limit, backup_lanes;
} node_logged;

static void job_wins(bool *logged, const char *name, const char *job, const char *policy)
{
	if (!*logged && strcmp(job, policy) != 0) {
		*logged = true;
		INFO_ENV("RAILHOP_%s=%s: the job's variable wins over the node policy's %s", name,
			 job, policy);
	}
}

static void apply_str(const char *name, bool from_env, bool *logged, const char **field,
		      const char *policy, const char *def)
{
	const char *now = __atomic_load_n(field, __ATOMIC_RELAXED);
	const char *want = policy ? policy : def;

	if (from_env) {
		if (policy) {
			job_wins(logged, name, now, policy);
		}
		return;
	}
	if (strcmp(want, now) != 0) {
		/* read by other threads without a lock: one aligned pointer store of a string
		 * that lives as long as the process (a static name) */
		__atomic_store_n(field, want, __ATOMIC_RELAXED);
		INFO_ENV("RAILHOP_%s=%s (%s)", name, want,
			 policy ? "node policy, via the agent" :
				  "default: the node policy sets none");
	}
}

_Static_assert(RH_NODE_RAIL_PEERS == RH_RAIL_PEER_MAX + 1, "rail_peers rows");

void rh_params_apply_policy(const struct rh_node_policy *p)
{
	const char *rule = NULL, *dist = NULL;
	int64_t lanes_now = __atomic_load_n(&rh_param.BACKUP_LANES, __ATOMIC_RELAXED);
	int64_t lanes = p->backup_lanes >= 1 && p->backup_lanes <= 8 ? p->backup_lanes : 0;
	enum rh_rail_rule rr;
	enum rh_dist d;

	/* keep our own static names: the pointers stored in rh_param outlive p */
	if (p->rail_rule && rh_parse_rail_rule(p->rail_rule, &rr) >= 0) {
		rule = rule_names[rr];
	}
	if (p->distance_limit && rh_parse_dist(p->distance_limit, &d) == 0) {
		dist = dist_names[d];
	}
	for (int r = 0; r <= RH_RAIL_PEER_MAX; r++) {
		__atomic_store_n(&rh_param_rail_peers[r], p->rail_peers[r], __ATOMIC_RELAXED);
	}
	apply_str("RAIL_RULE", rh_param_env.RAIL_RULE, &node_logged.rail_rule, &rh_param.RAIL_RULE,
		  rule, rh_param_defaults.RAIL_RULE);
	apply_str("DISTANCE_LIMIT", rh_param_env.DISTANCE_LIMIT, &node_logged.distance_limit,
		  &rh_param.DISTANCE_LIMIT, dist, rh_param_defaults.DISTANCE_LIMIT);
	if (rh_param_env.BACKUP_LANES) {
		if (lanes && lanes != lanes_now && !node_logged.backup_lanes) {
			node_logged.backup_lanes = true;
			INFO_ENV("RAILHOP_BACKUP_LANES=%lld: the job's variable wins over the node "
				 "policy's %lld",
				 (long long)lanes_now, (long long)lanes);
		}
	} else {
		int64_t want = lanes ? lanes : rh_param_defaults.BACKUP_LANES;

		if (want != lanes_now) {
			__atomic_store_n(&rh_param.BACKUP_LANES, want, __ATOMIC_RELAXED);
			INFO_ENV("RAILHOP_BACKUP_LANES=%lld (%s)", (long long)want,
				 lanes ? "node policy, via the agent" :
					 "default: the node policy sets none");
		}
	}
}

static int load_int(const char *name, int64_t *v, bool *from_env)
{
	char env[64] = "RAILHOP_";
	const char *s;

	strncat(env, name, sizeof(env) - 9);
	s = getenv(env);
	*from_env = s != NULL;
	if (!s) {
		INFO_ENV("%s=%lld (default)", env, (long long)*v);
		return 0;
	}
	if (rh_parse_int(s, 0, INT64_MAX, v) < 0) {
		WARN("%s=\"%s\" is not a non-negative integer", env, s);
		return -EINVAL;
	}
	INFO_ENV("%s=%lld (env)", env, (long long)*v);
	return 0;
}

static int load_str(const char *name, const char **v, bool *from_env)
{
	char env[64] = "RAILHOP_";
	const char *s;

	strncat(env, name, sizeof(env) - 9);
	s = getenv(env);
	*from_env = s != NULL;
	if (!s) {
		INFO_ENV("%s=\"%s\" (default)", env, *v);
		return 0;
	}
	*v = s;
	INFO_ENV("%s=\"%s\" (env)", env, *v);
	return 0;
}

int rh_params_load(void)
{
	enum rh_rail_rule rr;
	enum rh_dist d;
	int rc = 0;

	/* every start begins from the defaults: a node policy's value applied while the plugin
	 * ran (agent.c) does not outlive it */
	rh_param = rh_param_defaults;
	memset(rh_param_rail_peers, 0, sizeof(rh_param_rail_peers));
	memset(&node_logged, 0, sizeof(node_logged));
#define RH_PARAM_LOAD_int(name) load_int(#name, &rh_param.name, &rh_param_env.name)
#define RH_PARAM_LOAD_str(name) load_str(#name, &rh_param.name, &rh_param_env.name)
#define X(name, type, def, doc)               \
	if (RH_PARAM_LOAD_##type(name) < 0) { \
		rc = -EINVAL;                 \
	}
	RH_PARAMS(X)
#undef X
	for (char **e = environ; e && *e; e++) {
		char name[128];
		const char *eq;

		if (strncmp(*e, "RAILHOP_", 8)) {
			continue;
		}
		eq = strchr(*e, '=');
		if (!eq || (size_t)(eq - *e - 8) >= sizeof(name)) {
			continue;
		}
		memcpy(name, *e + 8, eq - *e - 8);
		name[eq - *e - 8] = 0;
		if (!rh_param_known(name)) {
			WARN("unknown parameter RAILHOP_%s ignored", name);
		}
	}
	switch (rh_parse_rail_rule(rh_param.RAIL_RULE, &rr)) {
	case 0:
		break;
	case 1:
		WARN("RAILHOP_RAIL_RULE=\"%s\" is deprecated: use same-rail (the policy's word)",
		     rh_param.RAIL_RULE);
		rh_param.RAIL_RULE = rule_names[RH_RAIL_SAME];
		break;
	default:
		WARN("RAILHOP_RAIL_RULE=\"%s\": expected same-rail|allowed-pairs|any",
		     rh_param.RAIL_RULE);
		rc = -EINVAL;
	}
	if (rh_parse_dist(rh_param.DISTANCE_LIMIT, &d) < 0) {
		WARN("RAILHOP_DISTANCE_LIMIT=\"%s\": expected PIX|PXB|PHB|NODE|SYS",
		     rh_param.DISTANCE_LIMIT);
		rc = -EINVAL;
	}
	if (rh_param.NTHREADS == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		rh_param.NTHREADS = n < 1 ? 1 : n > 8 ? 8 : n;
		INFO_ENV("RAILHOP_NTHREADS=0: %lld I/O threads (online CPUs, at most 8)",
			 (long long)rh_param.NTHREADS);
	}
	if (rh_param.STREAMS_PER_LANE < 1 || rh_param.STREAMS_PER_LANE > 16 ||
	    rh_param.NTHREADS < 1 || rh_param.NTHREADS > 64 || rh_param.CHUNK_SIZE < 4096 ||
	    rh_param.CHUNK_SIZE > (64 << 20) || rh_param.COMPLETION_TIMEOUT < 10 ||
	    rh_param.PROBE_TIMEOUT < 10 || rh_param.FAILBACK_INTERVAL < 10 ||
	    rh_param.BACKUP_LANES < 1 || rh_param.BACKUP_LANES > 8 || rh_param.BACKUP_STREAMS < 1 ||
	    rh_param.BACKUP_STREAMS > 16 || rh_param.STANDBY_LANES < 0 ||
	    rh_param.STANDBY_LANES > 8 || rh_param.STANDBY_LANES_MAX < 0 ||
	    rh_param.STANDBY_LANES_MAX > 8 || rh_param.CHECKSUM < 0 || rh_param.CHECKSUM > 1 ||
	    rh_param.IB_TIMEOUT < 1 || rh_param.IB_TIMEOUT > 31 || rh_param.IB_RETRY_CNT < 0 ||
	    rh_param.IB_RETRY_CNT > 7) {
		WARN("parameter out of range (STREAMS_PER_LANE 1..16, NTHREADS 0..64, CHUNK_SIZE "
		     "4096..64MiB, timeouts >= 10 ms, BACKUP_LANES 1..8, BACKUP_STREAMS 1..16, "
		     "STANDBY_LANES 0..8, STANDBY_LANES_MAX 0..8, CHECKSUM 0|1, IB_TIMEOUT 1..31, "
		     "IB_RETRY_CNT 0..7)");
		rc = -EINVAL;
	}
	return rc;
}
