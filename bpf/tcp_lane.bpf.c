/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tcp_lane.bpf.c - TCP trouble on the plugin's lane sockets only.
 *
 * rh_lane_ports holds the ports of lane sockets (host byte order), filled from user space at run
 * time: value bit 0 = match as the local port, bit 1 = match as the remote port. Three hooks,
 * each as a raw tracepoint (socket fields at BTF offsets, needs no tracefs) or a tracepoint:
 *   retransmit  tcp_retransmit_skb         RH_RETRANS_RAW_TP | RH_RETRANS_TP (+RH_TP_RETRANS_HAS_ERR)
 *   error       inet_sk_error_report (TCP) RH_SKERR_RAW_TP   | RH_SKERR_TP
 *   loss        tcp_cong_state_set -> 4    RH_LOSS_RAW_TP    | RH_LOSS_TP
 * Raw tracepoint offsets: RH_OFF_SKC_DADDR, RH_OFF_SKC_RCV_SADDR, RH_OFF_SKC_DPORT,
 * RH_OFF_INET_SPORT, RH_OFF_SKC_FAMILY, RH_OFF_SKC_STATE, RH_OFF_SK_ERR, RH_OFF_SK_PROTOCOL,
 * RH_OFF_SKC_V6_DADDR, RH_OFF_SKC_V6_RCV_SADDR, and for the socket's netns RH_OFF_SKC_NET +
 * RH_OFF_NET_INUM (or RH_NO_NETNS).
 */
/* rh_events, rh_drops, RH_RESERVE() and rh_submit() come from the prelude rh_ringbuf.c */

#ifndef RH_MAX_LANE_PORTS
#define RH_MAX_LANE_PORTS 4096
#endif
#define RH_TCP_CA_LOSS 4
#define RH_AF_INET6 10
#define RH_IPPROTO_TCP 6

BPF_HASH(rh_lane_ports, u16, u8, RH_MAX_LANE_PORTS);

static __always_inline int rh_is_lane(__u16 sport, __u16 dport)
{
	u8 *v = rh_lane_ports.lookup(&sport);

	if (v && (*v & 1)) {
		return 1;
	}
	v = rh_lane_ports.lookup(&dport);
	return v && (*v & 2);
}

#if defined(RH_RETRANS_RAW_TP) || defined(RH_SKERR_RAW_TP) || defined(RH_LOSS_RAW_TP)
static __always_inline __u16 rh_be16(__u16 v)
{
	return (__u16)((v >> 8) | (v << 8));
}

/*
 * Reads the socket's ports (as the tracepoints do: inet_sport, not skc_num, which is zeroed when
 * a closing socket gives its port back); returns 0 when it is not a lane socket.
 */
static __always_inline int rh_sk_ports(const char *sk, __u16 *sport, __u16 *dport)
{
	__u16 be_sport = 0, be_dport = 0;

	bpf_probe_read_kernel(&be_sport, sizeof(be_sport), sk + RH_OFF_INET_SPORT);
	bpf_probe_read_kernel(&be_dport, sizeof(be_dport), sk + RH_OFF_SKC_DPORT);
	*sport = rh_be16(be_sport);
	*dport = rh_be16(be_dport);
	return rh_is_lane(*sport, *dport);
}

static __always_inline int rh_submit_sk(const char *sk, __u32 kind, __s32 value)
{
	__u16 sport = 0, dport = 0;
	__u8 state = 0;
	struct rh_tcp_ev *e;

	if (!rh_sk_ports(sk, &sport, &dport)) {
		return 0;
	}
	e = RH_RESERVE(struct rh_tcp_ev, kind, RH_HOOK_RAW_TP);
	if (!e) {
		return 0;
	}
	e->sport = sport;
	e->dport = dport;
	e->value = value;
	bpf_probe_read_kernel(&e->family, sizeof(e->family), sk + RH_OFF_SKC_FAMILY);
	bpf_probe_read_kernel(&state, sizeof(state), sk + RH_OFF_SKC_STATE);
	e->state = state;
#ifndef RH_NO_NETNS
	{
		const char *net = 0;

		bpf_probe_read_kernel(&net, sizeof(net), sk + RH_OFF_SKC_NET);
		if (net) {
			bpf_probe_read_kernel(&e->netns_ino, sizeof(e->netns_ino),
					      net + RH_OFF_NET_INUM);
		}
	}
#endif
	if (e->family == RH_AF_INET6) {
		bpf_probe_read_kernel(e->saddr, 16, sk + RH_OFF_SKC_V6_RCV_SADDR);
		bpf_probe_read_kernel(e->daddr, 16, sk + RH_OFF_SKC_V6_DADDR);
	} else {
		bpf_probe_read_kernel(e->saddr, 4, sk + RH_OFF_SKC_RCV_SADDR);
		bpf_probe_read_kernel(e->daddr, 4, sk + RH_OFF_SKC_DADDR);
	}
	rh_submit(e);
	return 0;
}
#endif

#if defined(RH_RETRANS_TP) || defined(RH_SKERR_TP) || defined(RH_LOSS_TP)
/* Copies the address fields every TCP/sock tracepoint used here has. */
#define RH_TP_ADDRS(e, args)                                                \
	do {                                                                \
		(e)->sport = (args)->sport;                                 \
		(e)->dport = (args)->dport;                                 \
		(e)->family = (args)->family;                               \
		if ((args)->family == RH_AF_INET6) {                        \
			__builtin_memcpy((e)->saddr, (args)->saddr_v6, 16); \
			__builtin_memcpy((e)->daddr, (args)->daddr_v6, 16); \
		} else {                                                    \
			__builtin_memcpy((e)->saddr, (args)->saddr, 4);     \
			__builtin_memcpy((e)->daddr, (args)->daddr, 4);     \
		}                                                           \
	} while (0)
#endif

#ifdef RH_RETRANS_RAW_TP
RAW_TRACEPOINT_PROBE(tcp_retransmit_skb)
{
	__s32 err = 0;

#ifdef RH_RAW_RETRANS_HAS_ERR
	err = (__s32)ctx->args[2];
#endif
	return rh_submit_sk((const char *)ctx->args[0], RH_EV_TCP_RETRANS, err);
}
#endif

#ifdef RH_RETRANS_TP
TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
	struct rh_tcp_ev *e;

	if (!rh_is_lane(args->sport, args->dport)) {
		return 0;
	}
	e = RH_RESERVE(struct rh_tcp_ev, RH_EV_TCP_RETRANS, RH_HOOK_TP);
	if (!e) {
		return 0;
	}
	RH_TP_ADDRS(e, args);
	e->state = (__u16)args->state;
#ifdef RH_TP_RETRANS_HAS_ERR
	e->value = args->err;
#endif
	rh_submit(e);
	return 0;
}
#endif

#ifdef RH_SKERR_RAW_TP
RAW_TRACEPOINT_PROBE(inet_sk_error_report)
{
	const char *sk = (const char *)ctx->args[0];
	__u16 proto = 0;
	__s32 err = 0;

	bpf_probe_read_kernel(&proto, sizeof(proto), sk + RH_OFF_SK_PROTOCOL);
	if (proto != RH_IPPROTO_TCP) {
		return 0;
	}
	bpf_probe_read_kernel(&err, sizeof(err), sk + RH_OFF_SK_ERR);
	return rh_submit_sk(sk, RH_EV_TCP_ERROR, err);
}
#endif

#ifdef RH_SKERR_TP
TRACEPOINT_PROBE(sock, inet_sk_error_report)
{
	struct rh_tcp_ev *e;

	if (args->protocol != RH_IPPROTO_TCP || !rh_is_lane(args->sport, args->dport)) {
		return 0;
	}
	e = RH_RESERVE(struct rh_tcp_ev, RH_EV_TCP_ERROR, RH_HOOK_TP);
	if (!e) {
		return 0;
	}
	RH_TP_ADDRS(e, args);
	e->value = args->error;
	rh_submit(e);
	return 0;
}
#endif

#ifdef RH_LOSS_RAW_TP
RAW_TRACEPOINT_PROBE(tcp_cong_state_set)
{
	__u8 ca_state = (__u8)ctx->args[1];

	if (ca_state != RH_TCP_CA_LOSS) {
		return 0;
	}
	return rh_submit_sk((const char *)ctx->args[0], RH_EV_TCP_LOSS, ca_state);
}
#endif

#ifdef RH_LOSS_TP
TRACEPOINT_PROBE(tcp, tcp_cong_state_set)
{
	struct rh_tcp_ev *e;

	if (args->cong_state != RH_TCP_CA_LOSS || !rh_is_lane(args->sport, args->dport)) {
		return 0;
	}
	e = RH_RESERVE(struct rh_tcp_ev, RH_EV_TCP_LOSS, RH_HOOK_TP);
	if (!e) {
		return 0;
	}
	RH_TP_ADDRS(e, args);
	e->value = args->cong_state;
	rh_submit(e);
	return 0;
}
#endif
