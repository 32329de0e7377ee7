/* SPDX-License-Identifier: Apache-2.0 */
/*
 * railhop control plane: the ONE description of the bytes shared between the agent (Python,
 * agent/railhop/control/layout.py mirrors this file and a test compares every offset) and the
 * plugin (C, plugin/src/ctl.c).
 *
 * Two channels live in $RAILHOP_RUN_DIR (default /run/railhop, the agent's, mode 0755):
 *
 * 1. health.tbl - the health table, written by the agent (mode 0644), read by every plugin with
 *    pread() into its own memory (a shared mapping of a truncated file would raise SIGBUS).
 *    Layout (all integers little-endian, every struct fixed-width with explicit padding):
 *
 *        offset  size   what
 *        0       64     struct rh_ctl_header   identity of the agent + seqlock + heartbeat
 *        64      64     struct rh_ctl_body     CRC, flags, publish counter, nic_count
 *        128     64*64  struct rh_ctl_nic      nics[RH_CTL_MAX_NICS], first nic_count used
 *        4224    128*64 struct rh_ctl_plan     plans[RH_CTL_MAX_NICS], plans[i] is for nics[i]
 *        12416          end (RH_CTL_TABLE_SIZE)
 *
 *    The header's static fields (magic .. generation) are written once, before the file is
 *    renamed into place, and never change; a restarted agent creates a new file (new inode,
 *    new generation). Everything from `seq` on changes in place:
 *    - body, nics and plans are protected by the seqlock `seq`: the writer stores seq+1 (odd),
 *      then the payload, then seq+2 (even). A reader copies the payload between two loads of
 *      an even, equal `seq`, then checks the CRC. A copy is accepted only if both hold, so a
 *      record torn by a concurrent write is never acted upon (see docs/control-plane.md).
 *    - `crc32` (IEEE 802.3, the one zlib.crc32 computes) covers body bytes 4..63, then
 *      nics[0..nic_count), then plans[0..nic_count), in that order.
 *    - `heartbeat_ns` is outside the seqlock: a single aligned 8-byte store of
 *      CLOCK_MONOTONIC every body.heartbeat_ms; a reader that sees it older than its stale
 *      limit treats the agent as gone and works alone.
 *
 * 2. agent.sock - an AF_UNIX SOCK_SEQPACKET socket (mode 0600, 0660 of a configured group, or
 *    0666) where plugins send lane events, one struct rh_lane_event per message. The agent
 *    checks SO_PEERCRED at accept, rate-limits per process and uid, clamps t_ns to its receive
 *    time and drops messages that are not exactly a valid event.
 */
#ifndef RAILHOP_CTL_TABLE_H
#define RAILHOP_CTL_TABLE_H

#include <stddef.h>
#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the railhop control table is little-endian; add byte swaps for this target"
#endif

#define RH_CTL_TABLE_FILE "health.tbl"
#define RH_CTL_SOCKET_FILE "agent.sock"
#define RH_CTL_RUN_DIR_ENV "RAILHOP_RUN_DIR"
#define RH_CTL_RUN_DIR_DEFAULT "/run/railhop"

#define RH_CTL_MAGIC 0x4c544852u /* bytes "RHTL" */
#define RH_CTL_LAYOUT_VERSION 2u /* 2: the policy's settings in the body */
/* body.layout_minor: a minor version keeps older readers of the same layout_version working
 * (its fields live in bytes that were reserved and zero before). 1: rail_rule,
 * distance_limit, min_rails_up, backup_lanes, nic.rail_peers. A reader uses a field only
 * when layout_minor is at least the minor that introduced it. */
#define RH_CTL_LAYOUT_MINOR 1u
#define RH_CTL_MAX_NICS 64
#define RH_CTL_MAX_BACKUPS 15
#define RH_CTL_IFNAME_LEN 16 /* IFNAMSIZ, NUL-padded, at least one NUL */
#define RH_CTL_PCI_LEN 16 /* "0000:17:00.0", NUL-padded, may be empty */
#define RH_CTL_NO_RAIL 0xffffu
#define RH_CTL_NO_NUMA (-1)
#define RH_CTL_NO_DISTANCE 0xffu

/* body.flags */
#define RH_CTL_F_AGENT_GONE 0x1u /* the agent shut down cleanly; readers work alone */

/* body.settings_flags */
#define RH_CTL_S_MIGRATE_ON_SUSPECT 0x1u /* treat a SUSPECT NIC as DOWN: move off it now */

/* body.rail_rule: the policy's rail rule, in its words; 0: not set by the policy */
enum rh_ctl_rail_rule {
	RH_CTL_RULE_UNSET = 0,
	RH_CTL_RULE_SAME_RAIL = 1, /* both ends on the same rail */
	RH_CTL_RULE_ALLOWED_PAIRS = 2, /* same rail, or rails paired in nic.rail_peers */
	RH_CTL_RULE_ANY = 3, /* every pair */
};
#define RH_CTL_MAX_PEER_RAIL 63 /* nic.rail_peers: one bit per remote rail 0..63 */

/* nic.state: what the agent believes about a NIC. 0 is never written for a used record. */
enum rh_nic_state {
	RH_NIC_UP = 1, /* healthy: use it */
	RH_NIC_SUSPECT = 2, /* signs of trouble: keep using, probe before trusting a lane */
	RH_NIC_DOWN = 3, /* unusable: move traffic off now, open nothing new on it */
	RH_NIC_RECOVERING = 4, /* looks healthy again, held off by flap damping: not yet */
};

/* nic.reason: why the NIC is in its state (the latest signal that moved it). */
enum rh_nic_reason {
	RH_REASON_NONE = 0,
	RH_REASON_CARRIER = 1, /* carrier lost / regained */
	RH_REASON_OPERSTATE = 2, /* netdev operstate */
	RH_REASON_PORT_STATE = 3, /* RDMA port state / verbs async event */
	RH_REASON_COUNTERS = 4, /* error counter rate over the policy threshold */
	RH_REASON_LANE_TIMEOUT = 5, /* a plugin reported a completion timeout on this NIC */
	RH_REASON_LANE_ERROR = 6, /* a plugin reported a transport error on this NIC */
	RH_REASON_TCP = 7, /* retransmits/resets seen by eBPF on lane sockets */
	RH_REASON_FLAPPING = 8, /* held down by flap damping */
	RH_REASON_DEVICE_FATAL = 9, /* device fatal error / removal */
	RH_REASON_ADMIN = 10, /* operator or policy */
	RH_REASON_OTHER = 255,
};

/* PCIe/NUMA distance classes, nearest first (as railhop.topology.DistanceClass and NCCL) */
enum rh_distance {
	RH_DIST_LOC = 0, /* same device (another port) */
	RH_DIST_PIX = 1, /* one PCIe switch */
	RH_DIST_PXB = 2, /* several PCIe switches */
	RH_DIST_PHB = 3, /* through the CPU's host bridge */
	RH_DIST_NODE = 4, /* across host bridges within one NUMA node */
	RH_DIST_SYS = 5, /* across the inter-socket link */
};

struct rh_ctl_header {
	uint32_t magic; /* RH_CTL_MAGIC */
	uint16_t layout_version; /* RH_CTL_LAYOUT_VERSION; another value: ignore the table */
	uint16_t header_size; /* sizeof(struct rh_ctl_header) */
	uint32_t table_size; /* RH_CTL_TABLE_SIZE; the file is at least this long */
	uint16_t max_nics; /* RH_CTL_MAX_NICS */
	uint16_t max_backups; /* RH_CTL_MAX_BACKUPS */
	uint16_t nic_rec_size; /* sizeof(struct rh_ctl_nic) */
	uint16_t plan_rec_size; /* sizeof(struct rh_ctl_plan) */
	uint32_t agent_pid; /* in the agent's pid namespace */
	uint64_t agent_start_ticks; /* field 22 of /proc/<pid>/stat: tells a reused pid apart */
	uint64_t agent_pidns; /* inode of the agent's /proc/self/ns/pid: pid checks need equality */
	uint64_t generation; /* new value at every agent start (previous generation + 1) */
	uint64_t seq; /* seqlock: odd while the writer is updating body/nics/plans */
	uint64_t heartbeat_ns; /* CLOCK_MONOTONIC of the agent's last heartbeat (not seqlocked) */
};

struct rh_ctl_body {
	uint32_t crc32; /* see the file comment */
	uint32_t flags; /* RH_CTL_F_* */
	uint64_t publish_count; /* number of publishes by this agent (1 after the first) */
	uint64_t publish_ns; /* CLOCK_MONOTONIC of this publish */
	uint16_t nic_count; /* records in use, <= RH_CTL_MAX_NICS */
	uint16_t layout_minor; /* RH_CTL_LAYOUT_MINOR of the writer; 0 before minors existed */
	uint32_t heartbeat_ms; /* the agent's heartbeat period; readers go stale after a multiple */
	/* The node policy's settings (policy file `timeouts`, `health.migrate_on_suspect`); a
	 * plugin applies each one unless the job set the RAILHOP_* variable. 0: not set by the
	 * policy (the plugin's built-in default applies). */
	uint32_t completion_ms; /* RAILHOP_COMPLETION_TIMEOUT */
	uint32_t probe_ms; /* RAILHOP_PROBE_TIMEOUT */
	uint32_t failback_interval_ms; /* RAILHOP_FAILBACK_INTERVAL */
	uint32_t settings_flags; /* RH_CTL_S_* */
	/* layout_minor >= 1 (older tables: zero bytes, not settings) */
	uint8_t rail_rule; /* enum rh_ctl_rail_rule: RAILHOP_RAIL_RULE */
	uint8_t distance_limit; /* enum rh_distance, NO_DISTANCE: not set: RAILHOP_DISTANCE_LIMIT */
	uint16_t min_rails_up; /* health.min_rails_up, 0: every rail (railhop status --check) */
	uint16_t backup_lanes; /* spreading.max_nics capped at 8: RAILHOP_BACKUP_LANES */
	uint8_t reserved1[10];
};

struct rh_ctl_nic {
	char ifname[RH_CTL_IFNAME_LEN]; /* netdev name, the key plugins look NICs up by */
	char pci[RH_CTL_PCI_LEN]; /* PCI address, empty if unknown */
	uint64_t since_ns; /* CLOCK_MONOTONIC when the NIC entered `state` */
	uint32_t changes; /* state changes seen by this agent: a reader notices down->up->down */
	uint16_t rail; /* RH_CTL_NO_RAIL if unknown */
	uint8_t state; /* enum rh_nic_state */
	uint8_t reason; /* enum rh_nic_reason */
	int16_t numa; /* RH_CTL_NO_NUMA if unknown */
	uint16_t reserved0;
	uint32_t speed_mbps; /* 0 if unknown */
	/* layout_minor >= 1, rail_rule allowed-pairs: bit r set when a lane from this NIC may
	 * join a remote NIC on rail r (its own rail included); 0 otherwise */
	uint64_t rail_peers;
};

/* One backup choice for the NIC the plan belongs to. */
struct rh_ctl_backup {
	uint16_t local_nic; /* index into nics[], < nic_count */
	uint16_t remote_rail; /* rail of the remote NIC to pair with; RH_CTL_NO_RAIL: any */
	uint16_t weight; /* share of the moved traffic x 10000 (the plugin gives the largest share
			  * of a plan the ranking's top weight, the others in proportion) */
	uint8_t distance; /* enum rh_distance of local_nic from the failed NIC, or NO_DISTANCE */
	uint8_t reserved;
};

/* The agent's plan for nics[i]: where its traffic goes when it is not usable. */
struct rh_ctl_plan {
	uint8_t count; /* entries used, <= RH_CTL_MAX_BACKUPS; 0: no plan (plugin ranks alone) */
	uint8_t reserved0;
	uint16_t reserved1;
	uint32_t plan_version; /* publish_count when this plan last changed */
	struct rh_ctl_backup backups[RH_CTL_MAX_BACKUPS]; /* best first */
};

#define RH_CTL_BODY_OFFSET 64
#define RH_CTL_NICS_OFFSET 128
#define RH_CTL_PLANS_OFFSET (RH_CTL_NICS_OFFSET + RH_CTL_MAX_NICS * 64)
#define RH_CTL_TABLE_SIZE (RH_CTL_PLANS_OFFSET + RH_CTL_MAX_NICS * 128)

_Static_assert(sizeof(struct rh_ctl_header) == 64, "header size");
_Static_assert(offsetof(struct rh_ctl_header, magic) == 0, "magic");
_Static_assert(offsetof(struct rh_ctl_header, layout_version) == 4, "layout_version");
_Static_assert(offsetof(struct rh_ctl_header, header_size) == 6, "header_size");
_Static_assert(offsetof(struct rh_ctl_header, table_size) == 8, "table_size");
_Static_assert(offsetof(struct rh_ctl_header, max_nics) == 12, "max_nics");
_Static_assert(offsetof(struct rh_ctl_header, max_backups) == 14, "max_backups");
_Static_assert(offsetof(struct rh_ctl_header, nic_rec_size) == 16, "nic_rec_size");
_Static_assert(offsetof(struct rh_ctl_header, plan_rec_size) == 18, "plan_rec_size");
_Static_assert(offsetof(struct rh_ctl_header, agent_pid) == 20, "agent_pid");
_Static_assert(offsetof(struct rh_ctl_header, agent_start_ticks) == 24, "agent_start_ticks");
_Static_assert(offsetof(struct rh_ctl_header, agent_pidns) == 32, "agent_pidns");
_Static_assert(offsetof(struct rh_ctl_header, generation) == 40, "generation");
_Static_assert(offsetof(struct rh_ctl_header, seq) == 48, "seq");
_Static_assert(offsetof(struct rh_ctl_header, heartbeat_ns) == 56, "heartbeat_ns");

_Static_assert(sizeof(struct rh_ctl_body) == 64, "body size");
_Static_assert(offsetof(struct rh_ctl_body, crc32) == 0, "crc32");
_Static_assert(offsetof(struct rh_ctl_body, flags) == 4, "flags");
_Static_assert(offsetof(struct rh_ctl_body, publish_count) == 8, "publish_count");
_Static_assert(offsetof(struct rh_ctl_body, publish_ns) == 16, "publish_ns");
_Static_assert(offsetof(struct rh_ctl_body, nic_count) == 24, "nic_count");
_Static_assert(offsetof(struct rh_ctl_body, layout_minor) == 26, "body layout_minor");
_Static_assert(offsetof(struct rh_ctl_body, heartbeat_ms) == 28, "heartbeat_ms");
_Static_assert(offsetof(struct rh_ctl_body, completion_ms) == 32, "completion_ms");
_Static_assert(offsetof(struct rh_ctl_body, probe_ms) == 36, "probe_ms");
_Static_assert(offsetof(struct rh_ctl_body, failback_interval_ms) == 40, "failback_interval_ms");
_Static_assert(offsetof(struct rh_ctl_body, settings_flags) == 44, "settings_flags");
_Static_assert(offsetof(struct rh_ctl_body, rail_rule) == 48, "body rail_rule");
_Static_assert(offsetof(struct rh_ctl_body, distance_limit) == 49, "body distance_limit");
_Static_assert(offsetof(struct rh_ctl_body, min_rails_up) == 50, "body min_rails_up");
_Static_assert(offsetof(struct rh_ctl_body, backup_lanes) == 52, "body backup_lanes");
_Static_assert(offsetof(struct rh_ctl_body, reserved1) == 54, "body reserved1");

_Static_assert(sizeof(struct rh_ctl_nic) == 64, "nic size");
_Static_assert(offsetof(struct rh_ctl_nic, ifname) == 0, "ifname");
_Static_assert(offsetof(struct rh_ctl_nic, pci) == 16, "pci");
_Static_assert(offsetof(struct rh_ctl_nic, since_ns) == 32, "since_ns");
_Static_assert(offsetof(struct rh_ctl_nic, changes) == 40, "changes");
_Static_assert(offsetof(struct rh_ctl_nic, rail) == 44, "rail");
_Static_assert(offsetof(struct rh_ctl_nic, state) == 46, "state");
_Static_assert(offsetof(struct rh_ctl_nic, reason) == 47, "reason");
_Static_assert(offsetof(struct rh_ctl_nic, numa) == 48, "numa");
_Static_assert(offsetof(struct rh_ctl_nic, reserved0) == 50, "nic reserved0");
_Static_assert(offsetof(struct rh_ctl_nic, speed_mbps) == 52, "speed_mbps");
_Static_assert(offsetof(struct rh_ctl_nic, rail_peers) == 56, "nic rail_peers");

_Static_assert(sizeof(struct rh_ctl_backup) == 8, "backup size");
_Static_assert(offsetof(struct rh_ctl_backup, local_nic) == 0, "local_nic");
_Static_assert(offsetof(struct rh_ctl_backup, remote_rail) == 2, "remote_rail");
_Static_assert(offsetof(struct rh_ctl_backup, weight) == 4, "weight");
_Static_assert(offsetof(struct rh_ctl_backup, distance) == 6, "distance");
_Static_assert(offsetof(struct rh_ctl_backup, reserved) == 7, "backup reserved");

_Static_assert(sizeof(struct rh_ctl_plan) == 128, "plan size");
_Static_assert(offsetof(struct rh_ctl_plan, count) == 0, "count");
_Static_assert(offsetof(struct rh_ctl_plan, plan_version) == 4, "plan_version");
_Static_assert(offsetof(struct rh_ctl_plan, backups) == 8, "backups");

_Static_assert(RH_CTL_PLANS_OFFSET == 4224, "plans offset");
_Static_assert(RH_CTL_TABLE_SIZE == 12416, "table size");

/*
 * Lane events: plugin -> agent, one per SOCK_SEQPACKET message, exactly sizeof(struct
 * rh_lane_event) bytes. Messages of another size, magic, version or type, with names that are
 * not NUL-terminated printable ASCII, or with nports > RH_EV_MAX_PORTS are dropped and counted.
 */
#define RH_EV_MAGIC 0x56454852u /* bytes "RHEV" */
#define RH_EV_VERSION 1u
#define RH_EV_MAX_PORTS 8
#define RH_EV_MAX_MSG 512 /* the agent never reads more than this from one message */

enum rh_lane_event_type {
	RH_EV_LANE_UP = 1, /* a lane finished its handshake; ports name its TCP streams */
	RH_EV_LANE_DOWN = 2, /* a lane was closed on purpose (connection close, fail-back) */
	RH_EV_LANE_TIMEOUT = 3, /* no progress on a cleared-to-send chunk for the timeout */
	RH_EV_LANE_ERROR = 4, /* a transport error; `error` holds the errno */
	RH_EV_FAILOVER_START = 5, /* a connection starts leaving `nic` */
	/* the first request completed (acknowledged by the receiver) after the move; duration_ns
	 * since the start */
	RH_EV_FAILOVER_END = 6,
	RH_EV_FAILBACK = 7, /* traffic returned to the original pair `nic`/`remote_nic` */
	/* the moved connection's completion rate is back within 90 % of its share of the NICs left
	 * (its rate before the move x usable NICs after / before); duration_ns since the start */
	RH_EV_FAIR_SHARE = 8,
};

/* flags of a LANE_UP (an agent that does not know them ignores them: it reads a promotion as
 * one more LANE_UP of a lane it already has, which is what it is) */
#define RH_EV_F_STANDBY 0x1u /* the lane is a warm standby: handshaken, carries nothing yet */
/* a warm standby a move (or the peer) promoted: it carries from now on, without a handshake
 * (its first LANE_UP, with RH_EV_F_STANDBY alone, came when it was opened) */
#define RH_EV_F_PROMOTED 0x2u

struct rh_lane_event {
	uint32_t magic; /* RH_EV_MAGIC */
	uint16_t version; /* RH_EV_VERSION */
	uint16_t size; /* sizeof(struct rh_lane_event) */
	uint16_t type; /* enum rh_lane_event_type */
	uint16_t nports; /* ports used in local_ports/remote_ports, <= RH_EV_MAX_PORTS */
	uint32_t pid; /* the sender's getpid() (its own pid namespace) */
	uint64_t conn_id; /* the plugin's connection id, unique within the process */
	uint32_t epoch; /* the connection's lane epoch */
	uint32_t lane; /* lane index within the connection */
	uint64_t t_ns; /* CLOCK_MONOTONIC when it happened */
	uint64_t duration_ns; /* FAILOVER_END, FAIR_SHARE: since START; else 0 */
	int32_t error; /* errno-style cause (positive), 0 if none */
	uint32_t flags; /* RH_EV_F_*; unknown bits are ignored */
	char nic[RH_CTL_IFNAME_LEN]; /* local NIC of the lane (non-empty) */
	char remote_nic[RH_CTL_IFNAME_LEN]; /* remote NIC, may be empty */
	uint8_t local_addr[16]; /* IPv6 or IPv4-mapped (::ffff:a.b.c.d), zero if unknown */
	uint8_t remote_addr[16];
	uint16_t local_ports[RH_EV_MAX_PORTS]; /* host byte order; unused entries 0 */
	uint16_t remote_ports[RH_EV_MAX_PORTS];
	uint64_t bytes_replayed; /* FAILOVER_END (sender side): bytes queued again; else 0 */
};

_Static_assert(sizeof(struct rh_lane_event) == 160, "event size");
_Static_assert(offsetof(struct rh_lane_event, magic) == 0, "ev magic");
_Static_assert(offsetof(struct rh_lane_event, version) == 4, "ev version");
_Static_assert(offsetof(struct rh_lane_event, size) == 6, "ev size");
_Static_assert(offsetof(struct rh_lane_event, type) == 8, "ev type");
_Static_assert(offsetof(struct rh_lane_event, nports) == 10, "ev nports");
_Static_assert(offsetof(struct rh_lane_event, pid) == 12, "ev pid");
_Static_assert(offsetof(struct rh_lane_event, conn_id) == 16, "ev conn_id");
_Static_assert(offsetof(struct rh_lane_event, epoch) == 24, "ev epoch");
_Static_assert(offsetof(struct rh_lane_event, lane) == 28, "ev lane");
_Static_assert(offsetof(struct rh_lane_event, t_ns) == 32, "ev t_ns");
_Static_assert(offsetof(struct rh_lane_event, duration_ns) == 40, "ev duration_ns");
_Static_assert(offsetof(struct rh_lane_event, error) == 48, "ev error");
_Static_assert(offsetof(struct rh_lane_event, flags) == 52, "ev flags");
_Static_assert(offsetof(struct rh_lane_event, nic) == 56, "ev nic");
_Static_assert(offsetof(struct rh_lane_event, remote_nic) == 72, "ev remote_nic");
_Static_assert(offsetof(struct rh_lane_event, local_addr) == 88, "ev local_addr");
_Static_assert(offsetof(struct rh_lane_event, remote_addr) == 104, "ev remote_addr");
_Static_assert(offsetof(struct rh_lane_event, local_ports) == 120, "ev local_ports");
_Static_assert(offsetof(struct rh_lane_event, remote_ports) == 136, "ev remote_ports");
_Static_assert(offsetof(struct rh_lane_event, bytes_replayed) == 152, "ev bytes_replayed");

#endif /* RAILHOP_CTL_TABLE_H */
