/* SPDX-License-Identifier: GPL-2.0 */
/*
 * plugin_usdt.bpf.c - the railhop plugin's USDT probes (provider "railhop"), attached by library
 * path so every process that maps the plugin is traced (the probes have no semaphores).
 *
 * Lane state probes (lane_up, lane_down, failover_start, failover_end, failback, fair_share,
 * standby_promoted) go to the ring buffer with up to four arguments. req_done(lane, bytes, latency_ns) is aggregated in the kernel
 * per (pid, lane): request count, bytes and a log2 latency histogram (rh_lane_stats).
 * RH_USE_<probe>, RH_NA_<probe> (argument count) and RH_AT_<probe>_<n> (argument types) come
 * from the loader.
 */
/* rh_events, rh_drops, RH_RESERVE() and rh_submit() come from the prelude rh_ringbuf.c,
 * rh_usdt_reserve() and RH_CAT() from rh_usdt_ev.c */
#define RH_LAT_BUCKETS 40

struct rh_lane_key {
	__u32 pid;
	__u32 lane;
};

struct rh_lane_stats {
	__u64 reqs;
	__u64 bytes;
	__u64 lat_sum_ns;
	__u64 lat_log2[RH_LAT_BUCKETS]; /* bucket i: latency in [2^i, 2^(i+1)) ns, 0 in bucket 0 */
};

BPF_HASH(rh_lane_stats, struct rh_lane_key, struct rh_lane_stats, 4096);

/*
 * One function per lane probe, each the text of rh_usdt_lane.c composed in by the loader with
 * RH_PROBE (the probe name) and RH_PROBE_ID set: bcc generates the argument readers per calling
 * function and rewrites bpf_usdt_readarg() only in the text it compiles, so the function body
 * cannot live in a macro or an #included header.
 */
#define RH_PROBE lane_up
#define RH_PROBE_ID RH_USDT_LANE_UP
// @railhop-include "rh_usdt_lane.c"
#undef RH_PROBE
#undef RH_PROBE_ID

#define RH_PROBE lane_down
#define RH_PROBE_ID RH_USDT_LANE_DOWN
// @railhop-include "rh_usdt_lane.c"
#undef RH_PROBE
#undef RH_PROBE_ID

#define RH_PROBE failover_start
#define RH_PROBE_ID RH_USDT_FAILOVER_START
// @railhop-include "rh_usdt_lane.c"
#undef RH_PROBE
#undef RH_PROBE_ID

#define RH_PROBE failover_end
#define RH_PROBE_ID RH_USDT_FAILOVER_END
// @railhop-include "rh_usdt_lane.c"
#undef RH_PROBE
#undef RH_PROBE_ID

#define RH_PROBE failback
#define RH_PROBE_ID RH_USDT_FAILBACK
// @railhop-include "rh_usdt_lane.c"
#undef RH_PROBE
#undef RH_PROBE_ID

#define RH_PROBE fair_share
#define RH_PROBE_ID RH_USDT_FAIR_SHARE
// @railhop-include "rh_usdt_lane.c"
#undef RH_PROBE
#undef RH_PROBE_ID

#define RH_PROBE standby_promoted
#define RH_PROBE_ID RH_USDT_STANDBY_PROMOTED
// @railhop-include "rh_usdt_lane.c"
#undef RH_PROBE
#undef RH_PROBE_ID

#ifdef RH_USE_req_done
int rh_usdt_req_done(struct pt_regs *ctx)
{
	struct rh_lane_key key = { .pid = bpf_get_current_pid_tgid() >> 32 };
	struct rh_lane_stats zero = {}, *st;
	RH_AT_req_done_1 lane = 0;
	RH_AT_req_done_2 bytes = 0;
	RH_AT_req_done_3 lat = 0;
	__u64 ulat;
	__u32 bucket = 0;

	bpf_usdt_readarg(1, ctx, &lane);
	bpf_usdt_readarg(2, ctx, &bytes);
	bpf_usdt_readarg(3, ctx, &lat);
	key.lane = (__u32)lane;
	ulat = (__u64)lat;
	st = rh_lane_stats.lookup_or_try_init(&key, &zero);
	if (!st) {
		return 0;
	}
#pragma unroll
	for (int i = 1; i < RH_LAT_BUCKETS; i++) {
		if (ulat >> i) {
			bucket = i;
		}
	}
	__sync_fetch_and_add(&st->reqs, 1);
	__sync_fetch_and_add(&st->bytes, (__u64)bytes);
	__sync_fetch_and_add(&st->lat_sum_ns, ulat);
	if (bucket < RH_LAT_BUCKETS) {
		__sync_fetch_and_add(&st->lat_log2[bucket], 1);
	}
	return 0;
}
#endif
