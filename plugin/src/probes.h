/* SPDX-License-Identifier: Apache-2.0 */
/*
 * USDT probes (provider "railhop"): free when not traced.
 *   lane_up(conn_id, lane_id, lnic, rnic)     lane_down(conn_id, lane_id, lnic, err)
 *   failover_start(conn_id, lane_id, err)     failback(conn_id, lane_id)
 *   lane_suspect(conn_id, lane_id, lnic)
 * The marks of a move past failover_start, in order (duration_ns: since failover_start):
 *   replay_queued(conn_id, epoch, nactive, bytes_replayed): sender: the peer's RESUME applied,
 *     every unacknowledged message queued again; receiver: its RESUME record sent
 *   move_decision(conn_id, lane_id, standby, duration_ns, cpu_ns): a move chose lane_id
 *     (standby 1: a warm standby promoted, 0: a new lane opened); cpu_ns: the deciding
 *     thread's CPU time for choosing and readying it (a new lane: its transport's open())
 *   move_first_post(conn_id, lane_id, standby, duration_ns, since_decision_ns): the first
 *     frame that lane hands to its transport (a control frame: FAILREQ / RESUME, or data)
 *   standby_promoted(conn_id, lane_id, lnic, rnic): a warm standby lane carries from now on
 *     (this side's move, or the peer sent on it)
 *   replay_sent(conn_id, epoch, duration_ns)  sender: the last replayed chunk handed to a lane
 *   replay_acked(conn_id, epoch, duration_ns) sender: every replayed message acknowledged
 *   failover_end(conn_id, epoch, nactive, duration_ns): the first request COMPLETED after the
 *     move (sender: acknowledged by the receiver; receiver: every byte placed)
 *   fair_share(conn_id, epoch, duration_ns, rate_Bps): the connection's completion rate is back
 *     within 90 % of its share of the usable NICs (its rate before x usable after / before)
 *   req_done(lane, bytes, latency_ns): lane = id of the lane that delivered the last chunk
 *   (receiver) or the acknowledgement (sender); a message may be striped over several lanes.
 * The verbs lane's completion tracing (lanes/verbs/poll.c; nic: the plugin's NIC index, -1 when
 * the caller did not name it; qp_num: the local queue pair's number):
 *   verbs_wc(qp_num, nic, status, bytes, post_ns): every work completion read; status is the
 *     enum ibv_wc_status, bytes the completion's byte_len (what the device reports: set for
 *     receive completions, 0 for error completions), post_ns the time since its work request
 *     was posted (CLOCK_MONOTONIC ns, 0 when the lane did not give the post time)
 *   verbs_wc_err(qp_num, nic, status, vendor_err): every completion with an error status
 *     (flush errors included: a queue pair in ERROR flushes what it still holds)
 *   verbs_async(nic, event_type, qp_num, port): every asynchronous event read (enum
 *     ibv_event_type; qp_num for queue pair events, port for port events, 0 otherwise)
 */
#ifndef RH_PROBES_H
#define RH_PROBES_H

#if defined(RH_HAVE_SDT)
#include <sys/sdt.h>
#define RH_PROBE2(n, a, b) DTRACE_PROBE2(railhop, n, a, b)
#define RH_PROBE3(n, a, b, c) DTRACE_PROBE3(railhop, n, a, b, c)
#define RH_PROBE4(n, a, b, c, d) DTRACE_PROBE4(railhop, n, a, b, c, d)
#define RH_PROBE5(n, a, b, c, d, e) DTRACE_PROBE5(railhop, n, a, b, c, d, e)
#else
#define RH_PROBE2(n, a, b) ((void)(a), (void)(b))
#define RH_PROBE3(n, a, b, c) ((void)(a), (void)(b), (void)(c))
#define RH_PROBE4(n, a, b, c, d) ((void)(a), (void)(b), (void)(c), (void)(d))
#define RH_PROBE5(n, a, b, c, d, e) ((void)(a), (void)(b), (void)(c), (void)(d), (void)(e))
#endif

#endif
