/* SPDX-License-Identifier: Apache-2.0 */
/*
 * USDT probes (provider "railhop"): free when not traced.
 *   lane_up(conn_id, lane_id, lnic, rnic)     lane_down(conn_id, lane_id, lnic, err)
 *   failover_start(conn_id, lane_id, err)     failback(conn_id, lane_id)
 *   lane_suspect(conn_id, lane_id, lnic)
 * The marks of a move past failover_start, in order (duration_ns: since failover_start):
 *   replay_queued(conn_id, epoch, nactive, bytes_replayed): sender: the peer's RESUME applied,
 *     every unacknowledged message queued again; receiver: its RESUME record sent
 *   replay_sent(conn_id, epoch, duration_ns)  sender: the last replayed chunk handed to a lane
 *   replay_acked(conn_id, epoch, duration_ns) sender: every replayed message acknowledged
 *   failover_end(conn_id, epoch, nactive, duration_ns): the first request COMPLETED after the
 *     move (sender: acknowledged by the receiver; receiver: every byte placed)
 *   fair_share(conn_id, epoch, duration_ns, rate_Bps): the connection's completion rate is back
 *     within 90 % of its share of the usable NICs (its rate before x usable after / before)
 *   req_done(lane, bytes, latency_ns): lane = id of the lane that delivered the last chunk
 *   (receiver) or the acknowledgement (sender); a message may be striped over several lanes.
 */
#ifndef RH_PROBES_H
#define RH_PROBES_H

#if defined(RH_HAVE_SDT)
#include <sys/sdt.h>
#define RH_PROBE2(n, a, b) DTRACE_PROBE2(railhop, n, a, b)
#define RH_PROBE3(n, a, b, c) DTRACE_PROBE3(railhop, n, a, b, c)
#define RH_PROBE4(n, a, b, c, d) DTRACE_PROBE4(railhop, n, a, b, c, d)
#else
#define RH_PROBE2(n, a, b) ((void)(a), (void)(b))
#define RH_PROBE3(n, a, b, c) ((void)(a), (void)(b), (void)(c))
#define RH_PROBE4(n, a, b, c, d) ((void)(a), (void)(b), (void)(c), (void)(d))
#endif

#endif
