/* SPDX-License-Identifier: GPL-2.0 */
/*
 * blackhole.bpf.c - a silent blackhole for tests: a tc (clsact, direct-action) classifier that
 * drops every packet, carrier untouched. Stands in for `netem loss 100%` / `gact drop` on kernels
 * built without them (this project's VMs). Attach with tc on egress and/or ingress.
 */
#include <uapi/linux/pkt_cls.h>

int rh_blackhole(struct __sk_buff *skb)
{
	return TC_ACT_SHOT;
}
