/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TCP socket state for the lanes' loss verdict (lane_ops.lost): the verdict itself from a
 * socket's tcp_info (pure), and the tcp_info of a socket the plugin does not own, found by
 * its address 4-tuple through the kernel's sock_diag netlink interface (libfabric's tcp
 * provider keeps its sockets to itself).
 */
#ifndef RH_TCPSTATE_H
#define RH_TCPSTATE_H

#include <stdbool.h>
#include <stdint.h>

struct tcp_info; /* <linux/tcp.h>, as the TCP lane uses it */

/* A socket holding unacknowledged bytes is in RTO loss recovery and the lane has been quiet
 * for two of its smoothed RTTs (at least 20 ms): the retransmission after the timeout went
 * unanswered, which a live but congested path answers within about one RTT. */
bool tcp_info_lost(const struct tcp_info *ti, uint64_t quiet_ms);

/* tcp_info of the IPv4 TCP socket local lip:lport <-> remote rip:rport (addresses in network
 * order, ports in host order), in this process's network namespace. Returns 0, -ENOENT when
 * there is no such socket, or another negative errno. Bounded: one netlink round trip with
 * a 100 ms receive timeout. */
int tcp_info_by_addr(uint32_t lip, uint16_t lport, uint32_t rip, uint16_t rport,
		     struct tcp_info *out);

#endif
