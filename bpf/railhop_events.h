/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * railhop_events.h - the records every railhop BPF program writes to its ring buffer.
 *
 * Plain fixed-width structs, no kernel types, no implicit padding: the Python decoders in
 * agent/railhop/sources/decode.py mirror them with struct format strings, and
 * tests/unit/test_sources_layout.py compiles this header to check that both agree.
 * Every record starts with struct rh_hdr; kind says which struct follows.
 */
#ifndef RAILHOP_EVENTS_H
#define RAILHOP_EVENTS_H

#define RH_IFNAMSIZ 16
#define RH_DEVNAME_LEN 32
#define RH_NAME_LEN 32
#define RH_MSG_LEN 64

/* struct rh_hdr.kind */
#define RH_EV_CARRIER_DOWN 1 /* rh_netdev_ev: netif_carrier_off() */
#define RH_EV_CARRIER_UP 2 /* rh_netdev_ev: netif_carrier_on() */
#define RH_EV_QDISC_RESET 3 /* rh_netdev_ev: qdisc reset by dev_deactivate() (carrier proxy) */
#define RH_EV_TCP_RETRANS 4 /* rh_tcp_ev: value = err of __tcp_retransmit_skb() */
#define RH_EV_TCP_ERROR 5 /* rh_tcp_ev: value = socket error (ETIMEDOUT, ...) */
#define RH_EV_TCP_LOSS 6 /* rh_tcp_ev: value = new congestion state (4 = TCP_CA_Loss) */
#define RH_EV_DEVLINK_HEALTH 7 /* rh_drv_ev: dev, name = reporter, msg */
#define RH_EV_CM_EVENT 8 /* rh_drv_ev: a = rdma_cm_event_type, b = status */
#define RH_EV_CM_REMOVE 9 /* rh_drv_ev: dev = RDMA device removed */
#define RH_EV_MLX5_CMD 10 /* rh_drv_ev: name = command, msg = status, a = status, b = syndrome */
#define RH_EV_IB_EVENT 11 /* rh_drv_ev: a = ib_event_type, b = port (fentry, kprobe) */
#define RH_EV_USDT 12 /* rh_usdt_ev: a plugin USDT probe fired */
#define RH_EV_DEV_CLOSE 13 /* rh_netdev_ev: qdisc reset by dev_close() (admin down, unregister) */

/* struct rh_hdr.hook: which kind of hook produced the record */
#define RH_HOOK_FENTRY 1
#define RH_HOOK_RAW_TP 2
#define RH_HOOK_TP 3
#define RH_HOOK_USDT 4
#define RH_HOOK_KPROBE 5

/* railhop USDT probes (struct rh_usdt_ev.probe) */
#define RH_USDT_LANE_UP 1
#define RH_USDT_LANE_DOWN 2
#define RH_USDT_FAILOVER_START 3
#define RH_USDT_FAILOVER_END 4
#define RH_USDT_FAILBACK 5
#define RH_USDT_REQ_DONE 6
#define RH_USDT_FAIR_SHARE 7
#define RH_USDT_VERBS_WC_ERR 8 /* verbs_wc_err(qp_num, nic, status, vendor_err) */
#define RH_USDT_VERBS_ASYNC 9 /* verbs_async(nic, event_type, qp_num, port) */
#define RH_USDT_STANDBY_PROMOTED 10 /* standby_promoted(conn, lane, lnic, rnic) */

struct rh_hdr {
	__u64 ts_ns; /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u32 kind; /* RH_EV_* */
	__u32 hook; /* RH_HOOK_* */
}; /* 16 bytes */

struct rh_netdev_ev {
	struct rh_hdr h;
	__s32 ifindex; /* in the device's netns; 0 when the hook cannot see it (tracepoint) */
	__u32 netns_ino; /* inode of the device's netns; 0 when unknown (tracepoint) */
	char ifname[RH_IFNAMSIZ];
}; /* 40 bytes */

struct rh_tcp_ev {
	struct rh_hdr h;
	__u16 sport; /* host byte order */
	__u16 dport; /* host byte order */
	__u16 family; /* AF_INET 2, AF_INET6 10 */
	__u16 state; /* TCP state, when known */
	__s32 value; /* meaning depends on kind */
	__u32 netns_ino; /* inode of the socket's netns; 0 when unknown (tracepoint) */
	__u8 saddr[16]; /* IPv4 in the first 4 bytes */
	__u8 daddr[16];
}; /* 64 bytes */

struct rh_drv_ev {
	struct rh_hdr h;
	__s32 a;
	__s32 b;
	char dev[RH_DEVNAME_LEN];
	char name[RH_NAME_LEN];
	char msg[RH_MSG_LEN];
}; /* 152 bytes */

struct rh_usdt_ev {
	struct rh_hdr h;
	__u32 probe; /* RH_USDT_* */
	__u32 pid; /* tgid of the process that fired it */
	__s64 arg[4]; /* probe arguments in order, sign-extended; unused ones 0 */
}; /* 56 bytes */

#endif /* RAILHOP_EVENTS_H */
