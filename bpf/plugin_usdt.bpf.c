/* SPDX-License-Identifier: GPL-2.0 */
/*
 * plugin_usdt.bpf.c - the railhop plugin's USDT probes (provider "railhop"), attached by library
 * path so every process that maps the plugin is traced (the probes have no semaphores).
 *
 * Lane state probes (lane_up, lane_down, failover_start, failover_end, failback) go to the ring
 * buffer with up to four arguments. req_done(lane, bytes, latency_ns) is aggregated in the kernel
 * per (pid, lane): request count, bytes and a log2 latency histogram (rh_lane_stats).
 * RH_USE_<probe> and RH_AT_<probe>_<n> (argument types) come from the loader.
 */
#include "railhop_events.h"

#ifndef RH_RINGBUF_PAGES
#define RH_RINGBUF_PAGES 16
#endif
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

BPF_RINGBUF_OUTPUT(rh_events, RH_RINGBUF_PAGES);
BPF_ARRAY(rh_drops, u64, 1);
BPF_HASH(rh_lane_stats, struct rh_lane_key, struct rh_lane_stats, 4096);

static __always_inline struct rh_usdt_ev *rh_reserve(__u32 probe)
{
	struct rh_usdt_ev *e = rh_events.ringbuf_reserve(sizeof(struct rh_usdt_ev));
	int zero = 0;
	u64 *drops;

	if (!e) {
		drops = rh_drops.lookup(&zero);
		if (drops) {
			__sync_fetch_and_add(drops, 1);
		}
		return 0;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->h.ts_ns = bpf_ktime_get_ns();
	e->h.kind = RH_EV_USDT;
	e->h.hook = RH_HOOK_USDT;
	e->probe = probe;
	e->pid = bpf_get_current_pid_tgid() >> 32;
	return e;
}

/*
 * One function per lane probe, written out: bcc generates a reader per calling function and
 * argument number that only accepts a destination of the argument's exact size, so the loader
 * passes each argument's C type (RH_AT_<probe>_<n>, from the ELF note: -4@%edi -> __s32) and the
 * calls sit under preprocessor conditions, never past the probe's argument count.
 */
#ifdef RH_USE_lane_up
int rh_usdt_lane_up(struct pt_regs *ctx)
{
	struct rh_usdt_ev *e = rh_reserve(RH_USDT_LANE_UP);

	if (!e) {
		return 0;
	}
#ifdef RH_AT_lane_up_1
	{
		RH_AT_lane_up_1 v = 0;

		bpf_usdt_readarg(1, ctx, &v);
		e->arg[0] = (__s64)v;
	}
#endif
#ifdef RH_AT_lane_up_2
	{
		RH_AT_lane_up_2 v = 0;

		bpf_usdt_readarg(2, ctx, &v);
		e->arg[1] = (__s64)v;
	}
#endif
#ifdef RH_AT_lane_up_3
	{
		RH_AT_lane_up_3 v = 0;

		bpf_usdt_readarg(3, ctx, &v);
		e->arg[2] = (__s64)v;
	}
#endif
#ifdef RH_AT_lane_up_4
	{
		RH_AT_lane_up_4 v = 0;

		bpf_usdt_readarg(4, ctx, &v);
		e->arg[3] = (__s64)v;
	}
#endif
	rh_events.ringbuf_submit(e, 0);
	return 0;
}
#endif

#ifdef RH_USE_lane_down
int rh_usdt_lane_down(struct pt_regs *ctx)
{
	struct rh_usdt_ev *e = rh_reserve(RH_USDT_LANE_DOWN);

	if (!e) {
		return 0;
	}
#ifdef RH_AT_lane_down_1
	{
		RH_AT_lane_down_1 v = 0;

		bpf_usdt_readarg(1, ctx, &v);
		e->arg[0] = (__s64)v;
	}
#endif
#ifdef RH_AT_lane_down_2
	{
		RH_AT_lane_down_2 v = 0;

		bpf_usdt_readarg(2, ctx, &v);
		e->arg[1] = (__s64)v;
	}
#endif
#ifdef RH_AT_lane_down_3
	{
		RH_AT_lane_down_3 v = 0;

		bpf_usdt_readarg(3, ctx, &v);
		e->arg[2] = (__s64)v;
	}
#endif
#ifdef RH_AT_lane_down_4
	{
		RH_AT_lane_down_4 v = 0;

		bpf_usdt_readarg(4, ctx, &v);
		e->arg[3] = (__s64)v;
	}
#endif
	rh_events.ringbuf_submit(e, 0);
	return 0;
}
#endif

#ifdef RH_USE_failover_start
int rh_usdt_failover_start(struct pt_regs *ctx)
{
	struct rh_usdt_ev *e = rh_reserve(RH_USDT_FAILOVER_START);

	if (!e) {
		return 0;
	}
#ifdef RH_AT_failover_start_1
	{
		RH_AT_failover_start_1 v = 0;

		bpf_usdt_readarg(1, ctx, &v);
		e->arg[0] = (__s64)v;
	}
#endif
#ifdef RH_AT_failover_start_2
	{
		RH_AT_failover_start_2 v = 0;

		bpf_usdt_readarg(2, ctx, &v);
		e->arg[1] = (__s64)v;
	}
#endif
#ifdef RH_AT_failover_start_3
	{
		RH_AT_failover_start_3 v = 0;

		bpf_usdt_readarg(3, ctx, &v);
		e->arg[2] = (__s64)v;
	}
#endif
#ifdef RH_AT_failover_start_4
	{
		RH_AT_failover_start_4 v = 0;

		bpf_usdt_readarg(4, ctx, &v);
		e->arg[3] = (__s64)v;
	}
#endif
	rh_events.ringbuf_submit(e, 0);
	return 0;
}
#endif

#ifdef RH_USE_failover_end
int rh_usdt_failover_end(struct pt_regs *ctx)
{
	struct rh_usdt_ev *e = rh_reserve(RH_USDT_FAILOVER_END);

	if (!e) {
		return 0;
	}
#ifdef RH_AT_failover_end_1
	{
		RH_AT_failover_end_1 v = 0;

		bpf_usdt_readarg(1, ctx, &v);
		e->arg[0] = (__s64)v;
	}
#endif
#ifdef RH_AT_failover_end_2
	{
		RH_AT_failover_end_2 v = 0;

		bpf_usdt_readarg(2, ctx, &v);
		e->arg[1] = (__s64)v;
	}
#endif
#ifdef RH_AT_failover_end_3
	{
		RH_AT_failover_end_3 v = 0;

		bpf_usdt_readarg(3, ctx, &v);
		e->arg[2] = (__s64)v;
	}
#endif
#ifdef RH_AT_failover_end_4
	{
		RH_AT_failover_end_4 v = 0;

		bpf_usdt_readarg(4, ctx, &v);
		e->arg[3] = (__s64)v;
	}
#endif
	rh_events.ringbuf_submit(e, 0);
	return 0;
}
#endif

#ifdef RH_USE_failback
int rh_usdt_failback(struct pt_regs *ctx)
{
	struct rh_usdt_ev *e = rh_reserve(RH_USDT_FAILBACK);

	if (!e) {
		return 0;
	}
#ifdef RH_AT_failback_1
	{
		RH_AT_failback_1 v = 0;

		bpf_usdt_readarg(1, ctx, &v);
		e->arg[0] = (__s64)v;
	}
#endif
#ifdef RH_AT_failback_2
	{
		RH_AT_failback_2 v = 0;

		bpf_usdt_readarg(2, ctx, &v);
		e->arg[1] = (__s64)v;
	}
#endif
#ifdef RH_AT_failback_3
	{
		RH_AT_failback_3 v = 0;

		bpf_usdt_readarg(3, ctx, &v);
		e->arg[2] = (__s64)v;
	}
#endif
#ifdef RH_AT_failback_4
	{
		RH_AT_failback_4 v = 0;

		bpf_usdt_readarg(4, ctx, &v);
		e->arg[3] = (__s64)v;
	}
#endif
	rh_events.ringbuf_submit(e, 0);
	return 0;
}
#endif

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
