/* SPDX-License-Identifier: GPL-2.0 */
/*
 * rh_usdt_lane.c - the handler of one lane USDT probe: up to four arguments, sign-extended, to the
 * ring buffer. Not compiled alone: railhop.sources.compose puts this text in plugin_usdt.bpf.c at
 * each `// @railhop-include "rh_usdt_lane.c"`, with RH_PROBE (probe name) and RH_PROBE_ID
 * (RH_USDT_*) defined. The loader passes RH_USE_<probe> when the probe is attached,
 * RH_NA_<probe> (its argument count) and RH_AT_<probe>_<n> (each argument's C type, from the ELF
 * note: -4@%edi -> __s32): bcc's argument readers accept only a destination of the exact size, and
 * a reader past the probe's argument count does not exist.
 */
#ifndef RH_COMPOSED
#error "rh_usdt_lane.c is composed into plugin_usdt.bpf.c by the railhop loader"
#endif

#if RH_CAT(RH_USE_, RH_PROBE)
int RH_CAT(rh_usdt_, RH_PROBE)(struct pt_regs *ctx)
{
	struct rh_usdt_ev *e = rh_usdt_reserve(RH_PROBE_ID);

	if (!e) {
		return 0;
	}
#if RH_CAT(RH_NA_, RH_PROBE) >= 1
	{
		RH_CAT(RH_AT_, RH_CAT(RH_PROBE, _1)) v = 0;

		bpf_usdt_readarg(1, ctx, &v);
		e->arg[0] = (__s64)v;
	}
#endif
#if RH_CAT(RH_NA_, RH_PROBE) >= 2
	{
		RH_CAT(RH_AT_, RH_CAT(RH_PROBE, _2)) v = 0;

		bpf_usdt_readarg(2, ctx, &v);
		e->arg[1] = (__s64)v;
	}
#endif
#if RH_CAT(RH_NA_, RH_PROBE) >= 3
	{
		RH_CAT(RH_AT_, RH_CAT(RH_PROBE, _3)) v = 0;

		bpf_usdt_readarg(3, ctx, &v);
		e->arg[2] = (__s64)v;
	}
#endif
#if RH_CAT(RH_NA_, RH_PROBE) >= 4
	{
		RH_CAT(RH_AT_, RH_CAT(RH_PROBE, _4)) v = 0;

		bpf_usdt_readarg(4, ctx, &v);
		e->arg[3] = (__s64)v;
	}
#endif
	rh_submit(e);
	return 0;
}
#endif
