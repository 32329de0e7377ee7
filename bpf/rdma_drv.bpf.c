/* SPDX-License-Identifier: GPL-2.0 */
/*
 * rdma_drv.bpf.c - RDMA and NIC driver trouble, where the running kernel has the hooks.
 *
 *   devlink   tracepoint devlink:devlink_health_report            RH_DEVLINK_TP
 *   cm_event  tracepoint rdma_cma:cm_event_handler, error events  RH_CM_EVENT_TP
 *             (bit n of RH_CM_ERROR_MASK set = report event n)
 *   cm_remove tracepoint rdma_cma:cm_remove_one                   RH_CM_REMOVE_TP
 *   mlx5_cmd  tracepoint mlx5:mlx5_cmd (failed FW commands only)  RH_MLX5_CMD_TP
 *   ib_event  fentry ib_dispatch_event (all RDMA async events)    RH_IB_EVENT_FENTRY, or
 *             kprobe ib_dispatch_event where fentry cannot attach  RH_IB_EVENT_KPROBE, with
 *             RH_OFF_IBEV_DEVICE, RH_OFF_IBEV_PORT, RH_OFF_IBEV_EVENT, RH_OFF_IBDEV_NAME
 */
/* rh_events, rh_drops, RH_RESERVE() and rh_submit() come from the prelude rh_ringbuf.c */

#ifndef RH_CM_ERROR_MASK
/* ADDR_ERROR 1, ROUTE_ERROR 3, CONNECT_ERROR 6, UNREACHABLE 7, REJECTED 8, DEVICE_REMOVAL 11,
 * MULTICAST_ERROR 13 */
#define RH_CM_ERROR_MASK 0x29caUL
#endif

#ifdef RH_DEVLINK_TP
TRACEPOINT_PROBE(devlink, devlink_health_report)
{
	struct rh_drv_ev *e = RH_RESERVE(struct rh_drv_ev, RH_EV_DEVLINK_HEALTH, RH_HOOK_TP);

	if (!e) {
		return 0;
	}
	TP_DATA_LOC_READ_CONST(e->dev, dev_name, RH_DEVNAME_LEN);
	TP_DATA_LOC_READ_CONST(e->name, reporter_name, RH_NAME_LEN);
	TP_DATA_LOC_READ_CONST(e->msg, msg, RH_MSG_LEN);
	rh_submit(e);
	return 0;
}
#endif

#ifdef RH_CM_EVENT_TP
TRACEPOINT_PROBE(rdma_cma, cm_event_handler)
{
	unsigned long ev = args->event;
	struct rh_drv_ev *e;

	if (ev >= 64 || !((RH_CM_ERROR_MASK >> ev) & 1)) {
		return 0;
	}
	e = RH_RESERVE(struct rh_drv_ev, RH_EV_CM_EVENT, RH_HOOK_TP);
	if (!e) {
		return 0;
	}
	e->a = (__s32)ev;
	e->b = args->status;
	rh_submit(e);
	return 0;
}
#endif

#ifdef RH_CM_REMOVE_TP
TRACEPOINT_PROBE(rdma_cma, cm_remove_one)
{
	struct rh_drv_ev *e = RH_RESERVE(struct rh_drv_ev, RH_EV_CM_REMOVE, RH_HOOK_TP);

	if (!e) {
		return 0;
	}
	TP_DATA_LOC_READ_CONST(e->dev, name, RH_DEVNAME_LEN);
	rh_submit(e);
	return 0;
}
#endif

#ifdef RH_MLX5_CMD_TP
TRACEPOINT_PROBE(mlx5, mlx5_cmd)
{
	struct rh_drv_ev *e = RH_RESERVE(struct rh_drv_ev, RH_EV_MLX5_CMD, RH_HOOK_TP);

	if (!e) {
		return 0;
	}
	TP_DATA_LOC_READ_CONST(e->name, command_str, RH_NAME_LEN);
	TP_DATA_LOC_READ_CONST(e->msg, status_str, RH_MSG_LEN);
	e->a = args->status;
	e->b = (__s32)args->syndrome;
	rh_submit(e);
	return 0;
}
#endif

#if defined(RH_IB_EVENT_FENTRY) || defined(RH_IB_EVENT_KPROBE)
/* One record of an RDMA async event: ev is the struct ib_event ib_dispatch_event() got. */
static __always_inline int rh_ib_event(const char *ev, __u32 hook)
{
	const char *ibdev = 0;
	struct rh_drv_ev *e = RH_RESERVE(struct rh_drv_ev, RH_EV_IB_EVENT, hook);

	if (!e) {
		return 0;
	}
	bpf_probe_read_kernel(&e->a, sizeof(e->a), ev + RH_OFF_IBEV_EVENT);
	bpf_probe_read_kernel(&e->b, sizeof(e->b), ev + RH_OFF_IBEV_PORT);
	bpf_probe_read_kernel(&ibdev, sizeof(ibdev), ev + RH_OFF_IBEV_DEVICE);
	if (ibdev) {
		bpf_probe_read_kernel_str(e->dev, sizeof(e->dev), ibdev + RH_OFF_IBDEV_NAME);
	}
	rh_submit(e);
	return 0;
}
#endif

#ifdef RH_IB_EVENT_FENTRY
KFUNC_PROBE(ib_dispatch_event, void *event)
{
	return rh_ib_event((const char *)event, RH_HOOK_FENTRY);
}
#endif

#ifdef RH_IB_EVENT_KPROBE
#include <uapi/linux/ptrace.h> /* struct pt_regs, whose registers bcc reads the arguments from */

int kprobe__ib_dispatch_event(struct pt_regs *ctx, void *event)
{
	return rh_ib_event((const char *)event, RH_HOOK_KPROBE);
}
#endif
