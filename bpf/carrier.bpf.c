/* SPDX-License-Identifier: GPL-2.0 */
/*
 * carrier.bpf.c - netdev carrier loss, ahead of rtnetlink.
 *
 * One hook, three implementations chosen by the loader (the first that loads wins):
 *   RH_CARRIER_FENTRY  fentry on netif_carrier_off()/netif_carrier_on(): the instant itself.
 *   RH_CARRIER_RAW_TP  raw tracepoint qdisc_reset (dev_deactivate() in linkwatch); the device's
 *                      NOCARRIER state bit tells carrier loss from an administrative down.
 *   RH_CARRIER_TP      tracepoint qdisc:qdisc_reset, device name only (a proxy).
 * Kernel structs are read only at offsets from /sys/kernel/btf/vmlinux, passed as -D flags:
 *   RH_OFF_NETDEV_NAME, RH_OFF_NETDEV_IFINDEX, RH_OFF_NETDEV_STATE, RH_NOCARRIER_BIT,
 *   RH_OFF_QDISC_DEV_QUEUE, RH_OFF_NETDEV_QUEUE_DEV, and for the device's netns
 *   RH_OFF_NETDEV_NET + RH_OFF_NET_INUM (or RH_NO_NETNS).
 */
#include "railhop_events.h"

#ifndef RH_RINGBUF_PAGES
#define RH_RINGBUF_PAGES 16
#endif

BPF_RINGBUF_OUTPUT(rh_events, RH_RINGBUF_PAGES);
BPF_ARRAY(rh_drops, u64, 1);

static __always_inline struct rh_netdev_ev *rh_reserve(__u32 kind, __u32 hook)
{
	struct rh_netdev_ev *e = rh_events.ringbuf_reserve(sizeof(struct rh_netdev_ev));
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
	e->h.kind = kind;
	e->h.hook = hook;
	return e;
}

#if defined(RH_CARRIER_FENTRY) || defined(RH_CARRIER_RAW_TP)
static __always_inline void rh_fill_netdev(struct rh_netdev_ev *e, const char *dev)
{
#ifndef RH_NO_NETNS
	const char *net = 0;

	bpf_probe_read_kernel(&net, sizeof(net), dev + RH_OFF_NETDEV_NET);
	if (net) {
		bpf_probe_read_kernel(&e->netns_ino, sizeof(e->netns_ino), net + RH_OFF_NET_INUM);
	}
#endif
	bpf_probe_read_kernel(&e->ifindex, sizeof(e->ifindex), dev + RH_OFF_NETDEV_IFINDEX);
	bpf_probe_read_kernel_str(e->ifname, sizeof(e->ifname), dev + RH_OFF_NETDEV_NAME);
}
#endif

#ifdef RH_CARRIER_FENTRY
KFUNC_PROBE(netif_carrier_off, void *dev)
{
	struct rh_netdev_ev *e = rh_reserve(RH_EV_CARRIER_DOWN, RH_HOOK_FENTRY);

	if (!e) {
		return 0;
	}
	rh_fill_netdev(e, (const char *)dev);
	rh_events.ringbuf_submit(e, 0);
	return 0;
}

KFUNC_PROBE(netif_carrier_on, void *dev)
{
	struct rh_netdev_ev *e = rh_reserve(RH_EV_CARRIER_UP, RH_HOOK_FENTRY);

	if (!e) {
		return 0;
	}
	rh_fill_netdev(e, (const char *)dev);
	rh_events.ringbuf_submit(e, 0);
	return 0;
}
#endif

#ifdef RH_CARRIER_RAW_TP
RAW_TRACEPOINT_PROBE(qdisc_reset)
{
	const char *q = (const char *)ctx->args[0];
	const char *txq = 0;
	const char *dev = 0;
	unsigned long state = 0;
	struct rh_netdev_ev *e;

	bpf_probe_read_kernel(&txq, sizeof(txq), q + RH_OFF_QDISC_DEV_QUEUE);
	if (!txq) {
		return 0;
	}
	bpf_probe_read_kernel(&dev, sizeof(dev), txq + RH_OFF_NETDEV_QUEUE_DEV);
	if (!dev) {
		return 0;
	}
	bpf_probe_read_kernel(&state, sizeof(state), dev + RH_OFF_NETDEV_STATE);
	if (!(state & (1UL << RH_NOCARRIER_BIT))) {
		return 0; /* carrier still on: an administrative down, netlink reports it */
	}
	e = rh_reserve(RH_EV_CARRIER_DOWN, RH_HOOK_RAW_TP);
	if (!e) {
		return 0;
	}
	rh_fill_netdev(e, dev);
	rh_events.ringbuf_submit(e, 0);
	return 0;
}
#endif

#ifdef RH_CARRIER_TP
TRACEPOINT_PROBE(qdisc, qdisc_reset)
{
	struct rh_netdev_ev *e = rh_reserve(RH_EV_QDISC_RESET, RH_HOOK_TP);

	if (!e) {
		return 0;
	}
	TP_DATA_LOC_READ_CONST(e->ifname, dev, RH_IFNAMSIZ);
	rh_events.ringbuf_submit(e, 0);
	return 0;
}
#endif
