/* SPDX-License-Identifier: GPL-2.0 */
/*
 * verbs_usdt.bpf.c - the verbs lane's completion probes (plugin/src/probes.h, fired in
 * plugin/src/lanes/verbs/poll.c), attached by library path like plugin_usdt.bpf.c.
 *
 * verbs_wc(qp_num, nic, status, bytes, post_ns) fires for every completion: it is aggregated in
 * the kernel per (pid, nic) (completions, error completions, bytes, post-to-completion time) and
 * read from rh_verbs_stats; no per-completion record crosses into user space.
 * verbs_wc_err(qp_num, nic, status, vendor_err) and verbs_async(nic, event_type, qp_num, port)
 * go to the ring buffer as rh_usdt_ev records (rare: a queue pair fails once, then flushes).
 * RH_USE_<probe>, RH_NA_<probe> and RH_AT_<probe>_<n> come from the loader.
 */
/* rh_events, rh_drops, RH_RESERVE() and rh_submit() come from the prelude rh_ringbuf.c,
 * rh_usdt_reserve() and RH_CAT() from rh_usdt_ev.c */

struct rh_verbs_key {
	__u32 pid;
	__s32 nic; /* the plugin's NIC index, -1 when the lane did not name it */
};

struct rh_verbs_stats {
	__u64 wcs; /* completions */
	__u64 errs; /* completions with an error status (flushes included) */
	__u64 flushes; /* IBV_WC_WR_FLUSH_ERR among them */
	__u64 bytes; /* byte_len of the successful ones */
	__u64 timed; /* completions that carried their post time */
	__u64 post_ns_sum; /* their post-to-completion times */
};

BPF_HASH(rh_verbs_stats, struct rh_verbs_key, struct rh_verbs_stats, 4096);

#define RH_WC_FLUSH 5 /* IBV_WC_WR_FLUSH_ERR */

/* the ring-buffer probes: one function each, the text of rh_usdt_lane.c (see plugin_usdt.bpf.c) */
#define RH_PROBE verbs_wc_err
#define RH_PROBE_ID RH_USDT_VERBS_WC_ERR
// @railhop-include "rh_usdt_lane.c"
#undef RH_PROBE
#undef RH_PROBE_ID

#define RH_PROBE verbs_async
#define RH_PROBE_ID RH_USDT_VERBS_ASYNC
// @railhop-include "rh_usdt_lane.c"
#undef RH_PROBE
#undef RH_PROBE_ID

#ifdef RH_USE_verbs_wc
int rh_usdt_verbs_wc(struct pt_regs *ctx)
{
	struct rh_verbs_key key = { .pid = bpf_get_current_pid_tgid() >> 32 };
	struct rh_verbs_stats zero = {}, *st;
	RH_AT_verbs_wc_2 nic = 0;
	RH_AT_verbs_wc_3 status = 0;
	RH_AT_verbs_wc_4 bytes = 0;
	RH_AT_verbs_wc_5 age = 0;

	bpf_usdt_readarg(2, ctx, &nic);
	bpf_usdt_readarg(3, ctx, &status);
	bpf_usdt_readarg(4, ctx, &bytes);
	bpf_usdt_readarg(5, ctx, &age);
	key.nic = (__s32)nic;
	st = rh_verbs_stats.lookup_or_try_init(&key, &zero);
	if (!st) {
		return 0;
	}
	__sync_fetch_and_add(&st->wcs, 1);
	if (status != 0) {
		__sync_fetch_and_add(&st->errs, 1);
		if (status == RH_WC_FLUSH) {
			__sync_fetch_and_add(&st->flushes, 1);
		}
	} else {
		__sync_fetch_and_add(&st->bytes, (__u64)bytes);
	}
	if (age != 0) {
		__sync_fetch_and_add(&st->timed, 1);
		__sync_fetch_and_add(&st->post_ns_sum, (__u64)age);
	}
	return 0;
}
#endif
