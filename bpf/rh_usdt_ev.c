/* SPDX-License-Identifier: GPL-2.0 */
/*
 * rh_usdt_ev.c - what the USDT programs (plugin_usdt.bpf.c, verbs_usdt.bpf.c) share after
 * rh_ringbuf.c: rh_usdt_reserve(), a ring-buffer record for one probe hit stamped with the probe
 * id and the process, and RH_CAT() for the per-probe names rh_usdt_lane.c builds. Not compiled
 * alone: the loader (railhop.sources.compose) puts it in front of the probe file, after
 * rh_ringbuf.c, because bcc rewrites map calls only in the text it compiles.
 */
#ifndef RH_COMPOSED
#error "rh_usdt_ev.c is put in front of a probe by the railhop loader, not compiled alone"
#endif

static __always_inline struct rh_usdt_ev *rh_usdt_reserve(__u32 probe)
{
	struct rh_usdt_ev *e = RH_RESERVE(struct rh_usdt_ev, RH_EV_USDT, RH_HOOK_USDT);

	if (e) {
		e->probe = probe;
		e->pid = bpf_get_current_pid_tgid() >> 32;
	}
	return e;
}

#define RH_CAT_(a, b) a##b
#define RH_CAT(a, b) RH_CAT_(a, b)
