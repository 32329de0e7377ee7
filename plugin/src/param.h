/* SPDX-License-Identifier: Apache-2.0 */
/*
 * All plugin parameters, one X-macro table: X(NAME, type, default, doc).
 * Each is read from the environment variable RAILHOP_<NAME> once, at init; the value and its
 * source (default|env) are logged once. Unknown RAILHOP_* names are warned about. The node
 * policy's values (COMPLETION_TIMEOUT, PROBE_TIMEOUT, FAILBACK_INTERVAL, RAIL_RULE,
 * DISTANCE_LIMIT, BACKUP_LANES) arrive later through the agent's health table and replace the
 * defaults, never a job's variable (rh_param_pick; param_node.h).
 */
#ifndef RH_PARAM_H
#define RH_PARAM_H

#include <stdbool.h>
#include <stdint.h>

#define RH_PARAMS(X)                                                                                \
	/* NICs to use: "ifname[:rail],..."; empty = auto-detect (up, non-loopback, IPv4). */       \
	X(NICS, str, "", "NIC list ifname[:rail],...; empty = auto-detect")                         \
	/* TCP streams per lane (primary lane); backup lanes get their share by weight, at    \
	 * least 1. 8: on a fast (unlimited veth, 2x H200 host) link 8 streams and 8 threads  \
	 * reached 1.10x NCCL Socket 4x4 where 4x4 reached 0.51x; on slow (200 Mbit/s) NICs   \
	 * 8 streams with kernel-sized buffers fill the link as 4 did (bench/, BENCHMARKS). */     \
	X(STREAMS_PER_LANE, int, 8, "TCP streams per lane")                                         \
	/* Bytes per chunk: the unit of striping, placement and replay. 128 KiB: a 512 KiB       \
	 * message (one NCCL step) is striped over 4 streams, so after a move its replay rides 4  \
	 * fresh TCP streams at once instead of one; on 4 x 1 Gbit/s the longest stall after a     \
	 * carrier loss went from 0.78 to 0.24 s and a blackhole's from 1.44 to 0.84 s, healthy \
	 * throughput unchanged (bench/resume_breakdown.py, BENCHMARKS). */  \
	X(CHUNK_SIZE, int, 131072, "chunk size in bytes")                                           \
	/* I/O worker threads (epoll) shared by all connections of the process. 0 = auto:    \
	 * one per online CPU, at most 8 (throughput on fast links is bound by these threads; \
	 * more threads than CPUs only add switching; 8 was the measured winner above). */      \
	X(NTHREADS, int, 0, "I/O worker threads, 0 = online CPUs capped at 8")                      \
	/* No progress on cleared-to-send data for this long (ms) makes a lane suspect. */          \
	X(COMPLETION_TIMEOUT, int, 1000, "completion timeout, ms")                                  \
	/* Deadline (ms) of a probe or a new lane's handshake round trip. */                        \
	X(PROBE_TIMEOUT, int, 300, "probe / lane handshake timeout, ms")                            \
	/* How often (ms) a failed original pair is probed for fail-back. */                        \
	X(FAILBACK_INTERVAL, int, 1000, "fail-back probe interval, ms")                             \
	/* Upper bound (ms) of the fail-back backoff applied to a flapping pair. */                 \
	X(FAILBACK_MAX_BACKOFF, int, 16000, "max fail-back backoff, ms")                            \
	/* Backup pairs, in the policy's words: "same-rail" = same rail on both ends,       \
	 * "allowed-pairs" = same rail or a pair of rails the node policy allows (the pairs     \
	 * come from the agent's table; without them it acts as same-rail), "any" = any rail.  \
	 * "same" (before issue 30) is still read, with a deprecation warning. */       \
	X(RAIL_RULE, str, "same-rail", "rail rule: same-rail|allowed-pairs|any")                    \
	/* Farthest backup NIC relative to the original one: PIX|PXB|PHB|NODE|SYS. */               \
	X(DISTANCE_LIMIT, str, "NODE", "distance limit: PIX|PXB|PHB|NODE|SYS")                      \
	/* Most backup lanes a connection spreads over when its pair fails. */                      \
	X(BACKUP_LANES, int, 3, "max backup lanes per connection")                                  \
	/* TCP streams of a backup lane of the largest weight (4); lighter ones in proportion,  \
	 * at least 1. 4 = half a primary lane. 8 against 4, same build, 1 Gbit/s, 5 ms queue, \
	 * agent, 5 rounds each (bench/resume_breakdown.py): carrier loss at fair share 1.0 s   \
	 * vs 2.5 s, but a blackhole 4.5 s vs 1.2 s, first completion and stall unchanged. */   \
	X(BACKUP_STREAMS, int, 4, "TCP streams of a full-weight backup lane")                       \
	/* Warm standby lanes per connection (0 = off): the sender side keeps this many extra  \
	 * lanes handshaken on its top backup pairs, carrying nothing, so that a move promotes  \
	 * one and posts its first frame without any connection set-up (a verbs lane: no queue \
	 * pair to bring to RTS at the worst moment). 1: the first backup a move would open is  \
	 * ready; more pairs still open as today (BACKUP_LANES). Each costs a lane's streams.   */    \
	X(STANDBY_LANES, int, 1, "warm standby lanes per connection, 0 = off")                      \
	/* Standbys grow on use: a connection whose moves promoted n standby lanes keeps        \
	 * min(n + 1, STANDBY_LANES_MAX) of them (never fewer than STANDBY_LANES): one that     \
	 * needed its standby is the likeliest to need another before its replacement is up.   */   \
	X(STANDBY_LANES_MAX, int, 2, "warm standby lanes of a connection that used one, at most")   \
	/* Agent rendezvous directory (health table, socket). */                                    \
	X(RUN_DIR, str, "/run/railhop", "agent run directory")                                      \
	/* uid the agent runs as when it is not root (0 = root): the health table and the agent   \
	 * socket are trusted only from root or this uid (0: or this process's own uid). */ \
	X(AGENT_UID, int, 0, "agent uid when not root; 0 = root (or this process's uid)")           \
	/* Prefix for /sys reads (tests point it at fixture trees). */                              \
	X(SYSFS_ROOT, str, "", "sysfs root prefix")                                                 \
	/* SO_SNDBUF/SO_RCVBUF of lane sockets in bytes. 0 = the kernel's autotuning, which    \
	 * sizes each buffer to the path's bandwidth-delay product (so to the NIC's real       \
	 * speed, also behind a shaper the plugin cannot see): a fixed 4 MiB per stream queued \
	 * ~0.7 s at 200 Mbit/s and got healthy lanes failed. A fixed size disables autotuning. */    \
	X(SOCKBUF, int, 0, "lane socket buffer size, 0 = kernel autotuning")                        \
	/* TCP_NOTSENT_LOWAT of lane sockets in bytes (0 = no limit): a stream takes a new chunk  \
	 * only when less than this is still unsent in its socket. Autotuned buffers grow to     \
	 * several MiB per stream; unbounded, a lane queued ~18 MB (0.7 s at 200 Mbit/s), all    \
	 * of it lost with the lane. 512 KiB (4 chunks) keeps the rate-limited fabric's       \
	 * throughput (128 KiB cost 5-8 %). */ \
	X(NOTSENT_LOWAT, int, 524288, "unsent bytes per lane socket, 0 = no limit")                 \
	/* TCP_RTO_MIN_US of lane sockets (Linux 6.15+; 0 = the kernel's 200 ms floor). The RTO  \
	 * is the smoothed RTT plus this floor: a lost tail segment on a fabric with sub-ms RTTs  \
	 * waited 200+ ms, and a silently dead path showed its first timeout (the agent's TCP     \
	 * loss signal) only then. */  \
	X(TCP_RTO_MIN_US, int, 20000, "TCP retransmission timeout floor, us, 0 = kernel")           \
	/* TCP_DELACK_MAX_US of lane sockets (Linux 6.15+; 0 = kernel, 40+ ms): acknowledgements \
	 * are delayed at most this long, well below the RTO floor, so a delayed ACK is never    \
	 * taken for a loss. */  \
	X(TCP_DELACK_MAX_US, int, 5000, "TCP delayed-ACK ceiling, us, 0 = kernel")                  \
	/* TCP congestion control of lane sockets (TCP_CONGESTION), "" = the system default. */     \
	X(TCP_CC, str, "", "TCP congestion control of lane sockets")                                \
	/* Local carrier poll interval (ms, 0 = off). */                                            \
	X(CARRIER_POLL, int, 100, "carrier poll interval, ms")                                      \
	/* Lane transport: tcp, ofi (libfabric FI_EP_MSG + FI_RMA; provider as libfabric /     \
	 * FI_PROVIDER pick it), verbs (RC queue pairs through libibverbs), auto = verbs where  \
	 * every NIC is an RDMA device, else ofi where an RDMA provider (verbs) offers it. */    \
	X(TRANSPORT, str, "auto", "lane transport: auto|tcp|ofi|verbs")                             \
	/* 1 = every DATA frame on TCP lanes carries a keyed payload MAC (GMAC, AES-128-GCM,    \
	 * under the stream's key; the hello asks the peer for it too), and one without it is   \
	 * refused: a chunk that does not match fails its lane and is replayed. Off by default:  \
	 * frame headers are always MACed; this adds the payload bytes (against an in-path       \
	 * attacker, and the hosts' buffers). */   \
	X(CHECKSUM, int, 0, "keyed payload MAC per DATA frame: 0|1")                                \
	/* verbs queue pairs (lanes/verbs/qp.c), NCCL's NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT and \
	 * defaults: the local ACK timeout is 4.096 us x 2^IB_TIMEOUT per try (20: ~4.3 s), a  \
	 * request is tried 1 + IB_RETRY_CNT times before IBV_WC_RETRY_EXC_ERR. The plugin's    \
	 * COMPLETION_TIMEOUT still detects a silent blackhole long before that. */   \
	X(IB_TIMEOUT, int, 20, "verbs QP local ACK timeout exponent, 1..31")                        \
	X(IB_RETRY_CNT, int, 7, "verbs QP transport retries, 0..7")

struct rh_params {
#define RH_PARAM_FIELD_int(name) int64_t name
#define RH_PARAM_FIELD_str(name) const char *name
#define X(name, type, def, doc) RH_PARAM_FIELD_##type(name);
	RH_PARAMS(X)
#undef X
};

enum rh_rail_rule { RH_RAIL_SAME = 0, RH_RAIL_ANY = 1, RH_RAIL_ALLOWED_PAIRS = 2 };
/* Rails 0..RH_RAIL_PEER_MAX have a row in rh_param_rail_peers. */
#define RH_RAIL_PEER_MAX 63
/* PCIe/NUMA distance classes, nearest first (as NCCL's PATH_*). */
enum rh_dist { RH_DIST_PIX = 0, RH_DIST_PXB, RH_DIST_PHB, RH_DIST_NODE, RH_DIST_SYS };

/* Which parameters the job set (RAILHOP_<NAME> present in the environment at load). */
struct rh_param_env {
#define X(name, type, def, doc) bool name;
	RH_PARAMS(X)
#undef X
};

extern struct rh_params rh_param;
extern const struct rh_params rh_param_defaults;
extern struct rh_param_env rh_param_env;
/* allowed-pairs: rh_param_rail_peers[r] has bit q set when a lane from a NIC on rail r may
 * join a remote NIC on rail q (from the node policy via the table; all 0 without it). Written
 * by the agent glue with relaxed atomic stores, read the same way. */
extern uint64_t rh_param_rail_peers[RH_RAIL_PEER_MAX + 1];

/* Pure: the value of a parameter the node policy may set (the agent publishes it through the
 * health table; 0 = not set there). Precedence: the job's RAILHOP_* variable (from_env: keep
 * current), then the policy's value (>= 10; smaller ones are not valid timeouts), then the
 * built-in default def. */
int64_t rh_param_pick(bool from_env, int64_t current, uint32_t policy, int64_t def);

/* Load every parameter from getenv (logs once). Returns 0 or -EINVAL for a bad value. */
int rh_params_load(void);
/* Pure parsers (unit-tested). Return 0 or -EINVAL. */
int rh_parse_int(const char *s, int64_t min, int64_t max, int64_t *out);
/* rh_parse_rail_rule: 0, 1 for the deprecated spelling "same" (= same-rail), or -EINVAL. */
int rh_parse_rail_rule(const char *s, enum rh_rail_rule *out);
const char *rh_rail_rule_name(enum rh_rail_rule r);
int rh_parse_dist(const char *s, enum rh_dist *out);
const char *rh_dist_name(enum rh_dist d);
/* True when name (without the RAILHOP_ prefix) is a known parameter or a known non-plugin name. */
bool rh_param_known(const char *name);

#endif
