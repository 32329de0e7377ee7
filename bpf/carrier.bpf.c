/* SPDX-License-Identifier: GPL-2.0 */
/*
 * carrier.bpf.c - netdev carrier loss, ahead of rtnetlink.
 *
 * One hook, three implementations chosen by the loader (the first that loads wins):
 *   RH_CARRIER_FENTRY  fentry on netif_carrier_off()/netif_carrier_on(): the instant itself.
 *   RH_CARRIER_RAW_TP  raw tracepoint qdisc_reset, which dev_deactivate() calls for each queue
 *                      (a) in linkwatch after a carrier loss: the device's NOCARRIER state bit is
 *                      set -> RH_EV_CARRIER_DOWN; (b) in dev_close() of an administrative down
 *                      (or an unregister): __LINK_STATE_START is already clear, carrier not yet
 *                      off -> RH_EV_DEV_CLOSE. Both come before the RTM_NEWLINK of the change.
 *                      A running device with carrier (a tc qdisc change) is not reported.
 *   RH_CARRIER_TP      tracepoint qdisc:qdisc_reset, device name only (a proxy).
 * Kernel structs are read only at offsets from /sys/kernel/btf/vmlinux, passed as -D flags:
 *   RH_OFF_NETDEV_NAME, RH_OFF_NETDEV_IFINDEX, RH_OFF_NETDEV_STATE, RH_NOCARRIER_BIT, RH_START_BIT,
 *   RH_OFF_QDISC_DEV_QUEUE, RH_OFF_NETDEV_QUEUE_DEV, and for the device's netns
 *   RH_OFF_NETDEV_NET + RH_OFF_NET_INUM (or RH_NO_NETNS).
 */
/* rh_events, rh_drops, RH_RESERVE() and rh_submit() come from the prelude rh_ringbuf.c */

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
	struct rh_netdev_ev *e =
		RH_RESERVE(struct rh_netdev_ev, RH_EV_CARRIER_DOWN, RH_HOOK_FENTRY);

	if (!e) {
		return 0;
	}
	rh_fill_netdev(e, (const char *)dev);
	rh_submit(e);
	return 0;
}

KFUNC_PROBE(netif_carrier_on, void *dev)
{
	struct rh_netdev_ev *e = RH_RESERVE(struct rh_netdev_ev, RH_EV_CARRIER_UP, RH_HOOK_FENTRY);

	if (!e) {
		return 0;
	}
	rh_fill_netdev(e, (const char *)dev);
	rh_submit(e);
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
	__u32 kind;

	bpf_probe_read_kernel(&txq, sizeof(txq), q + RH_OFF_QDISC_DEV_QUEUE);
	if (!txq) {
		return 0;
	}
	bpf_probe_read_kernel(&dev, sizeof(dev), txq + RH_OFF_NETDEV_QUEUE_DEV);
	if (!dev) {
		return 0;
	}
	bpf_probe_read_kernel(&state, sizeof(state), dev + RH_OFF_NETDEV_STATE);
	if (state & (1UL << RH_NOCARRIER_BIT)) {
		kind = RH_EV_CARRIER_DOWN;
	} else if (!(state & (1UL << RH_START_BIT))) {
		kind = RH_EV_DEV_CLOSE;
	} else {
		return 0; /* running with carrier: a qdisc change, not a link event */
	}
	e = RH_RESERVE(struct rh_netdev_ev, kind, RH_HOOK_RAW_TP);
	if (!e) {
		return 0;
	}
	rh_fill_netdev(e, dev);
	rh_submit(e);
	return 0;
}
#endif

#ifdef RH_CARRIER_TP
TRACEPOINT_PROBE(qdisc, qdisc_reset)
{
	struct rh_netdev_ev *e = RH_RESERVE(struct rh_netdev_ev, RH_EV_QDISC_RESET, RH_HOOK_TP);

	if (!e) {
		return 0;
	}
	TP_DATA_LOC_READ_CONST(e->ifname, dev, RH_IFNAMSIZ);
	rh_submit(e);
	return 0;
}
#endif
