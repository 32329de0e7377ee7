/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Plugin side of the control plane: the health-table reader (seqlock + CRC over copies the
 * reader pread()s into its own memory) and the lane-event sender (AF_UNIX SOCK_SEQPACKET). See
 * ctl.h for the API and railhop/ctl_table.h for the bytes.
 *
 * Why pread and not a shared mapping: a file mapped MAP_SHARED that anyone truncates raises
 * SIGBUS in every process that touches the lost pages, i.e. one truncate(2) would kill every
 * NCCL job on the node. pread() of a truncated file returns a short count instead, which is
 * just a table that fails its checks. The table is 12 KiB and the ticker reads it every 20 ms:
 * one 64-byte pread per poll when nothing changed (the header holds seq and the heartbeat),
 * two more on a change: ~1 us per poll. (A sealed memfd handed over agent.sock would keep reads
 * free of system calls but needs a new socket protocol and fd passing across every container
 * boundary; the poll rate does not justify that.)
 *
 * Why a torn copy is never accepted: the agent bumps `seq` to an odd value before it touches
 * the payload and to the next even value after. The reader reads `seq`, copies the table, and
 * reads `seq` again; the copy is used only when both reads returned the same even value, i.e. no
 * write overlapped the copy. On weakly ordered CPUs the Python writer cannot emit a release
 * fence, so the CRC over the payload is checked as well: a copy must pass both.
 *
 * Whose table: only a regular file owned by root or by the agent's configured uid
 * (opts.agent_uid; unset: this process's own uid), writable by its owner alone, is read. A job
 * that can write the run directory therefore cannot feed other users' jobs a table.
 */
#define _GNU_SOURCE
#include "ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define RH_CTL_READ_TRIES 64
#define DEFAULT_POLL_NS 500000000ull
#define DEFAULT_RECONNECT_NS 1000000000ull
#define STALE_HEARTBEATS 8ull

#define CTL_LOG(ctl, lvl, ...)                                                          \
	do {                                                                            \
		if ((ctl)->opts.log) {                                                  \
			(ctl)->opts.log((ctl)->opts.log_arg, (lvl), __func__, __LINE__, \
					__VA_ARGS__);                                   \
		}                                                                       \
	} while (0)
#define CTL_WARN(ctl, ...) CTL_LOG(ctl, RH_CTL_LOG_WARN, __VA_ARGS__)
#define CTL_INFO(ctl, ...) CTL_LOG(ctl, RH_CTL_LOG_INFO, __VA_ARGS__)
#define CTL_TRACE(ctl, ...) CTL_LOG(ctl, RH_CTL_LOG_TRACE, __VA_ARGS__)
#define STAT_INC(ctl, field) __atomic_fetch_add(&(ctl)->stats.field, 1, __ATOMIC_RELAXED)

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() __asm__ __volatile__("" ::: "memory")
#endif

/* One open table file (one agent instance). Retired files stay open until rh_ctl_close() so
 * that a snapshot racing with a remap never reads a closed (or reused) descriptor. */
struct rh_ctl_map {
	int fd;
	uint64_t id;
	dev_t dev;
	ino_t ino;
	uint32_t agent_pid;
	uint64_t agent_start_ticks;
	uint64_t generation;
	int same_pidns;
	int dead; /* atomic: the agent process is gone */
	int warned; /* atomic: a corruption of this table was logged */
	uint64_t bad_seq; /* atomic: seq + 1 of a copy found corrupt (0: none) */
	struct rh_ctl_map *retired_next;
};

struct rh_ctl {
	struct rh_ctl_opts opts;
	char table_path[PATH_MAX];
	struct sockaddr_un sock_addr;
	uint64_t my_pidns;
	struct rh_ctl_map *cur; /* atomic */
	struct rh_ctl_map *retired;
	uint64_t next_map_id;
	pthread_mutex_t poll_lock;
	uint64_t last_poll_ns; /* atomic */
	dev_t bad_dev; /* last rejected file (a freed inode number may be reused: ctime too) */
	ino_t bad_ino;
	struct timespec bad_ctime;
	int bad_rc; /* what rejected it */
	int absent_logged;
	pthread_mutex_t sock_lock;
	int sock_fd;
	uint64_t last_connect_ns;
	int connect_warned;
	struct rh_ctl_stats stats;
};

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- CRC-32 (IEEE 802.3, reflected, as zlib) ---- */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++) {
			c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
		}
		crc_table[i] = c;
	}
}

uint32_t rh_ctl_crc32(uint32_t crc, const void *buf, uint64_t len)
{
	const uint8_t *p = buf;

	pthread_once(&crc_once, crc_init);
	crc = ~crc;
	while (len--) {
		crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	}
	return ~crc;
}

/* ---- table validation (pure) ---- */

static int check_header(const struct rh_ctl_header *h)
{
	if (h->magic != RH_CTL_MAGIC || h->layout_version != RH_CTL_LAYOUT_VERSION ||
	    h->header_size != sizeof(struct rh_ctl_header) || h->table_size != RH_CTL_TABLE_SIZE ||
	    h->max_nics != RH_CTL_MAX_NICS || h->max_backups != RH_CTL_MAX_BACKUPS ||
	    h->nic_rec_size != sizeof(struct rh_ctl_nic) ||
	    h->plan_rec_size != sizeof(struct rh_ctl_plan)) {
		return -EPROTO;
	}
	return 0;
}

static int name_ok(const char *s, size_t cap, int may_be_empty)
{
	size_t n = strnlen(s, cap);

	if (n == cap || (n == 0 && !may_be_empty)) {
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		if (s[i] <= ' ' || s[i] > '~' || s[i] == '/') {
			return 0;
		}
	}
	return 1;
}

static uint32_t body_crc(const struct rh_ctl_body *b, const struct rh_ctl_nic *nics,
			 const struct rh_ctl_plan *plans, uint32_t n)
{
	uint32_t crc = rh_ctl_crc32(0, (const uint8_t *)b + 4, sizeof(*b) - 4);

	crc = rh_ctl_crc32(crc, nics, (uint64_t)n * sizeof(*nics));
	return rh_ctl_crc32(crc, plans, (uint64_t)n * sizeof(*plans));
}

/* the records of a CRC-clean copy must still make sense: the agent may have a bug */
static int check_records(const struct rh_ctl_view *v)
{
	for (uint32_t i = 0; i < v->nic_count; i++) {
		const struct rh_ctl_nic *nic = &v->nics[i];
		const struct rh_ctl_plan *plan = &v->plans[i];

		if (!name_ok(nic->ifname, sizeof(nic->ifname), 0) ||
		    !name_ok(nic->pci, sizeof(nic->pci), 1) || nic->state < RH_NIC_UP ||
		    nic->state > RH_NIC_RECOVERING || plan->count > RH_CTL_MAX_BACKUPS) {
			return -EPROTO;
		}
		for (uint32_t k = 0; k < plan->count; k++) {
			if (plan->backups[k].local_nic >= v->nic_count) {
				return -EPROTO;
			}
		}
	}
	return 0;
}

/* ---- /proc helpers (slow path only) ---- */

static uint64_t pidns_inode(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* field 22 (starttime) of /proc/<pid>/stat; -ENOENT when the process does not exist */
static int proc_start_ticks(uint32_t pid, uint64_t *out)
{
	char path[64], buf[1024];
	ssize_t n;
	int fd;
	char *p;

	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		return -errno;
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0) {
		return -EIO;
	}
	buf[n] = '\0';
	p = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
	if (!p) {
		return -EIO;
	}
	p++;
	for (int field = 3; field < 22; field++) { /* skip state .. itrealvalue */
		p = strchr(p + 1, ' ');
		if (!p) {
			return -EIO;
		}
	}
	*out = strtoull(p + 1, NULL, 10);
	return 0;
}

/* ---- open / close ---- */

int rh_ctl_open(const char *run_dir, const struct rh_ctl_opts *opts, struct rh_ctl **out)
{
	struct rh_ctl *ctl;
	int n;

	*out = NULL;
	if (!run_dir || !run_dir[0]) {
		run_dir = getenv(RH_CTL_RUN_DIR_ENV);
	}
	if (!run_dir || !run_dir[0]) {
		run_dir = RH_CTL_RUN_DIR_DEFAULT;
	}
	ctl = calloc(1, sizeof(*ctl));
	if (!ctl) {
		return -ENOMEM;
	}
	if (opts) {
		ctl->opts = *opts;
	}
	if (!ctl->opts.poll_interval_ns) {
		ctl->opts.poll_interval_ns = DEFAULT_POLL_NS;
	}
	if (!ctl->opts.reconnect_ns) {
		ctl->opts.reconnect_ns = DEFAULT_RECONNECT_NS;
	}
	n = snprintf(ctl->table_path, sizeof(ctl->table_path), "%s/%s", run_dir, RH_CTL_TABLE_FILE);
	ctl->sock_addr.sun_family = AF_UNIX;
	if (n < 0 || (size_t)n >= sizeof(ctl->table_path) ||
	    (size_t)snprintf(ctl->sock_addr.sun_path, sizeof(ctl->sock_addr.sun_path), "%s/%s",
			     run_dir, RH_CTL_SOCKET_FILE) >= sizeof(ctl->sock_addr.sun_path)) {
		free(ctl);
		return -ENAMETOOLONG;
	}
	ctl->my_pidns = pidns_inode("/proc/self/ns/pid");
	ctl->sock_fd = -1;
	ctl->next_map_id = 1;
	pthread_mutex_init(&ctl->poll_lock, NULL);
	pthread_mutex_init(&ctl->sock_lock, NULL);
	CTL_INFO(ctl, "railhop control plane in %s", run_dir);
	rh_ctl_refresh(ctl);
	*out = ctl;
	return 0;
}

void rh_ctl_close(struct rh_ctl *ctl)
{
	struct rh_ctl_map *m, *next;

	if (!ctl) {
		return;
	}
	m = __atomic_load_n(&ctl->cur, __ATOMIC_ACQUIRE);
	if (m) {
		m->retired_next = ctl->retired;
		ctl->retired = m;
	}
	for (m = ctl->retired; m; m = next) {
		next = m->retired_next;
		close(m->fd);
		free(m);
	}
	if (ctl->sock_fd >= 0) {
		close(ctl->sock_fd);
	}
	pthread_mutex_destroy(&ctl->poll_lock);
	pthread_mutex_destroy(&ctl->sock_lock);
	free(ctl);
}

void rh_ctl_stats(const struct rh_ctl *ctl, struct rh_ctl_stats *out)
{
	const uint64_t *src = (const uint64_t *)&ctl->stats;
	uint64_t *dst = (uint64_t *)out;

	for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++) {
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
	}
}

/* ---- slow path: (re)mapping and agent liveness ---- */

/* whether uid may own the agent's table or socket: root, or the configured agent uid (unset:
 * this process's own uid, which can only fool itself) */
static int owner_ok(const struct rh_ctl *ctl, uid_t uid)
{
	if (uid == 0) {
		return 1;
	}
	if (ctl->opts.agent_uid > 0) {
		return (int64_t)uid == ctl->opts.agent_uid;
	}
	return uid == geteuid();
}

/* reads exactly len bytes at off; -EPROTO on a short read (a truncated file), else -errno */
static int pread_all(int fd, void *buf, size_t len, off_t off)
{
	ssize_t n;

	do {
		n = pread(fd, buf, len, off);
	} while (n < 0 && errno == EINTR);
	if (n < 0) {
		return -errno;
	}
	return (size_t)n == len ? 0 : -EPROTO;
}

/* opens the file at table_path if it is not the one open now; 1: new table, 0: same file */
static int map_table(struct rh_ctl *ctl)
{
	struct rh_ctl_map *cur = __atomic_load_n(&ctl->cur, __ATOMIC_ACQUIRE), *m;
	struct rh_ctl_header h;
	struct stat st;
	int fd, rc;

	if (stat(ctl->table_path, &st) != 0) {
		rc = -errno;
		if (!ctl->absent_logged) {
			CTL_INFO(ctl, "no agent table at %s (%s): working alone until one appears",
				 ctl->table_path, strerror(-rc));
			ctl->absent_logged = 1;
		}
		return rc;
	}
	if (cur && cur->dev == st.st_dev && cur->ino == st.st_ino) {
		return 0;
	}
	if (st.st_dev == ctl->bad_dev && st.st_ino == ctl->bad_ino &&
	    st.st_ctim.tv_sec == ctl->bad_ctime.tv_sec &&
	    st.st_ctim.tv_nsec == ctl->bad_ctime.tv_nsec) {
		return ctl->bad_rc; /* already rejected and logged */
	}
	fd = open(ctl->table_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		return -errno;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < RH_CTL_TABLE_SIZE) {
		CTL_WARN(ctl, "agent table %s is not a regular file of >= %d bytes: ignored",
			 ctl->table_path, RH_CTL_TABLE_SIZE);
		rc = -EPROTO;
		goto reject;
	}
	if (!owner_ok(ctl, st.st_uid) || (st.st_mode & (S_IWGRP | S_IWOTH))) {
		CTL_WARN(
			ctl,
			"agent table %s is owned by uid %u with mode %o: only a table of root or the "
			"agent's uid (RAILHOP_AGENT_UID), writable by its owner alone, is trusted: "
			"ignored, working alone",
			ctl->table_path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
		rc = -EPERM;
		goto reject;
	}
	rc = pread_all(fd, &h, sizeof(h), 0);
	if (rc == 0 && check_header(&h) != 0) {
		CTL_WARN(
			ctl,
			"agent table %s has magic %#x layout %u (want %#x layout %u) or other sizes: "
			"ignored, working alone",
			ctl->table_path, h.magic, h.layout_version, RH_CTL_MAGIC,
			RH_CTL_LAYOUT_VERSION);
		rc = -EPROTO;
	}
	if (rc != 0) {
		goto reject;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		close(fd);
		return -ENOMEM;
	}
	m->fd = fd;
	m->id = ctl->next_map_id++;
	m->dev = st.st_dev;
	m->ino = st.st_ino;
	m->agent_pid = h.agent_pid;
	m->agent_start_ticks = h.agent_start_ticks;
	m->generation = h.generation;
	m->same_pidns = ctl->my_pidns && h.agent_pidns == ctl->my_pidns;
	if (cur) {
		cur->retired_next = ctl->retired;
		ctl->retired = cur;
	}
	__atomic_store_n(&ctl->cur, m, __ATOMIC_RELEASE);
	STAT_INC(ctl, remaps);
	ctl->absent_logged = 0;
	CTL_INFO(ctl, "agent table %s: agent pid %u generation %llu%s", ctl->table_path,
		 h.agent_pid, (unsigned long long)h.generation, cur ? " (agent restarted)" : "");
	return 1;
reject:
	close(fd);
	STAT_INC(ctl, proto_errors);
	ctl->bad_dev = st.st_dev;
	ctl->bad_ino = st.st_ino;
	ctl->bad_ctime = st.st_ctim;
	ctl->bad_rc = rc;
	return rc;
}

static void check_agent_alive(struct rh_ctl *ctl)
{
	struct rh_ctl_map *m = __atomic_load_n(&ctl->cur, __ATOMIC_ACQUIRE);
	uint64_t ticks = 0;
	int rc;

	if (!m || !m->same_pidns || __atomic_load_n(&m->dead, __ATOMIC_RELAXED)) {
		return;
	}
	rc = proc_start_ticks(m->agent_pid, &ticks);
	if (rc == -ENOENT || (rc == 0 && ticks != m->agent_start_ticks)) {
		__atomic_store_n(&m->dead, 1, __ATOMIC_RELEASE);
		CTL_WARN(ctl, "agent pid %u (generation %llu) is gone: working alone", m->agent_pid,
			 (unsigned long long)m->generation);
	}
}

static int sock_connect_locked(struct rh_ctl *ctl, uint64_t now);

int rh_ctl_refresh(struct rh_ctl *ctl)
{
	uint64_t now = mono_ns(), last = __atomic_load_n(&ctl->last_poll_ns, __ATOMIC_RELAXED);
	int rc;

	if (last && now - last < ctl->opts.poll_interval_ns) {
		return 0;
	}
	if (pthread_mutex_trylock(&ctl->poll_lock) != 0) {
		return 0; /* another thread is polling */
	}
	__atomic_store_n(&ctl->last_poll_ns, now, __ATOMIC_RELAXED);
	rc = map_table(ctl);
	check_agent_alive(ctl);
	pthread_mutex_unlock(&ctl->poll_lock);

	if (pthread_mutex_trylock(&ctl->sock_lock) == 0) {
		if (ctl->sock_fd < 0 && now - ctl->last_connect_ns >= ctl->opts.reconnect_ns) {
			sock_connect_locked(ctl, now);
		}
		pthread_mutex_unlock(&ctl->sock_lock);
	}
	return rc;
}

/* ---- hot path: snapshot ---- */

static void invalidate(struct rh_ctl_view *v)
{
	v->map_id = 0;
	v->seq = 0;
}

static int check_live(struct rh_ctl *ctl, struct rh_ctl_view *v, uint64_t hb, uint32_t heartbeat_ms)
{
	uint64_t stale = ctl->opts.stale_ns, now;

	if (v->flags & RH_CTL_F_AGENT_GONE) {
		STAT_INC(ctl, stale);
		return -ESTALE;
	}
	if (!stale) {
		stale = STALE_HEARTBEATS * heartbeat_ms * 1000000ull;
	}
	if (stale) {
		now = mono_ns();
		if (now > hb && now - hb > stale) {
			STAT_INC(ctl, stale);
			return -ESTALE;
		}
	}
	return 0;
}

int rh_ctl_snapshot(struct rh_ctl *ctl, struct rh_ctl_view *v)
{
	struct rh_ctl_map *m = __atomic_load_n(&ctl->cur, __ATOMIC_ACQUIRE);
	uint8_t buf[RH_CTL_TABLE_SIZE]; /* 12 KiB: this call's private copy */
	struct rh_ctl_header hc;
	struct rh_ctl_body b;
	int crc_bad = 0, rc;

	v->changed = 0;
	if (!m || __atomic_load_n(&m->dead, __ATOMIC_ACQUIRE)) {
		invalidate(v);
		STAT_INC(ctl, stale);
		return -ESTALE;
	}
	for (int tries = 0; tries < RH_CTL_READ_TRIES; tries++) {
		uint64_t s1, s2;
		uint32_t n;

		rc = pread_all(m->fd, &hc, sizeof(hc), 0);
		if (rc != 0) {
			goto io;
		}
		s1 = hc.seq;
		if (s1 & 1) {
			cpu_relax();
			continue;
		}
		if (hc.magic != RH_CTL_MAGIC) {
			goto proto;
		}
		if (__atomic_load_n(&m->bad_seq, __ATOMIC_RELAXED) == s1 + 1) {
			goto proto; /* this very publish was already found corrupt */
		}
		if (v->map_id == m->id && v->seq == s1) {
			/* unchanged since the view was filled: heartbeat_ms is in the cached body */
			return check_live(ctl, v, hc.heartbeat_ns, v->heartbeat_ms);
		}
		rc = pread_all(m->fd, buf, sizeof(buf), 0);
		if (rc == 0) {
			rc = pread_all(m->fd, &s2, sizeof(s2), offsetof(struct rh_ctl_header, seq));
		}
		if (rc != 0) {
			goto io;
		}
		memcpy(&hc, buf, sizeof(hc));
		if (hc.seq != s1 || s2 != s1) {
			STAT_INC(ctl, torn_retries);
			cpu_relax();
			continue;
		}
		memcpy(&b, buf + RH_CTL_BODY_OFFSET, sizeof(b));
		if (check_header(&hc) != 0 || b.nic_count > RH_CTL_MAX_NICS) {
			__atomic_store_n(&m->bad_seq, s1 + 1, __ATOMIC_RELAXED);
			goto proto;
		}
		n = b.nic_count;
		memcpy(v->nics, buf + RH_CTL_NICS_OFFSET, n * sizeof(struct rh_ctl_nic));
		memcpy(v->plans, buf + RH_CTL_PLANS_OFFSET, n * sizeof(struct rh_ctl_plan));
		if (body_crc(&b, v->nics, v->plans, n) != b.crc32) {
			/* a write we could not see (weak ordering) or real corruption: retry */
			STAT_INC(ctl, crc_errors);
			crc_bad = 1;
			cpu_relax();
			continue;
		}
		v->map_id = m->id;
		v->seq = s1;
		v->generation = hc.generation;
		v->agent_pid = hc.agent_pid;
		v->publish_count = b.publish_count;
		v->publish_ns = b.publish_ns;
		v->flags = b.flags;
		v->nic_count = n;
		v->heartbeat_ms = b.heartbeat_ms;
		v->completion_ms = b.completion_ms;
		v->probe_ms = b.probe_ms;
		v->failback_interval_ms = b.failback_interval_ms;
		v->settings_flags = b.settings_flags;
		v->layout_minor = b.layout_minor;
		if (b.layout_minor >= 1) {
			v->rail_rule = b.rail_rule;
			v->distance_limit = b.distance_limit;
			v->min_rails_up = b.min_rails_up;
			v->backup_lanes = b.backup_lanes;
		} else {
			/* a table from before minor 1: those bytes are reserved, not settings */
			v->rail_rule = RH_CTL_RULE_UNSET;
			v->distance_limit = RH_CTL_NO_DISTANCE;
			v->min_rails_up = 0;
			v->backup_lanes = 0;
			for (uint32_t i = 0; i < n; i++) {
				v->nics[i].rail_peers = 0;
			}
		}
		if (check_records(v) != 0) {
			__atomic_store_n(&m->bad_seq, s1 + 1, __ATOMIC_RELAXED);
			goto proto;
		}
		v->changed = 1;
		STAT_INC(ctl, snapshots_copied);
		return check_live(ctl, v, hc.heartbeat_ns, b.heartbeat_ms);
	}
	invalidate(v);
	if (crc_bad) {
		__atomic_store_n(&m->bad_seq, hc.seq + 1, __ATOMIC_RELAXED);
		goto proto;
	}
	return -EAGAIN;
io:
	/* a truncated (short read) or unreadable table: no bad_seq (it is not this publish's
	 * content), the next snapshot reads the file again */
	invalidate(v);
	STAT_INC(ctl, proto_errors);
	if (!__atomic_exchange_n(&m->warned, 1, __ATOMIC_RELAXED)) {
		CTL_WARN(ctl, "agent table %s (generation %llu) cannot be read (%s): working alone",
			 ctl->table_path, (unsigned long long)m->generation,
			 rc == -EPROTO ? "truncated" : strerror(-rc));
	}
	return -EPROTO;
proto:
	invalidate(v);
	STAT_INC(ctl, proto_errors);
	if (!__atomic_exchange_n(&m->warned, 1, __ATOMIC_RELAXED)) {
		CTL_WARN(ctl,
			 "agent table %s (generation %llu) is corrupt: ignoring it, working alone",
			 ctl->table_path, (unsigned long long)m->generation);
	}
	return -EPROTO;
}

int rh_ctl_view_find(const struct rh_ctl_view *v, const char *ifname)
{
	for (uint32_t i = 0; i < v->nic_count; i++) {
		if (strncmp(v->nics[i].ifname, ifname, RH_CTL_IFNAME_LEN) == 0) {
			return (int)i;
		}
	}
	return -1;
}

/* ---- lane events ---- */

void rh_lane_event_init(struct rh_lane_event *ev, uint16_t type)
{
	memset(ev, 0, sizeof(*ev));
	ev->magic = RH_EV_MAGIC;
	ev->version = RH_EV_VERSION;
	ev->size = sizeof(*ev);
	ev->type = type;
	ev->pid = (uint32_t)getpid();
	ev->t_ns = mono_ns();
}

static int sock_connect_locked(struct rh_ctl *ctl, uint64_t now)
{
	int fd, rc;

	ctl->last_connect_ns = now;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		return -errno;
	}
	if (connect(fd, (const struct sockaddr *)&ctl->sock_addr, sizeof(ctl->sock_addr)) != 0) {
		rc = -errno;
		close(fd);
		if (!ctl->connect_warned) {
			CTL_INFO(ctl, "agent socket %s: %s (lane events dropped until it is up)",
				 ctl->sock_addr.sun_path, strerror(-rc));
			ctl->connect_warned = 1;
		}
		return rc;
	}
	{
		struct ucred cred;
		socklen_t len = sizeof(cred);

		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
		    !owner_ok(ctl, cred.uid)) {
			close(fd);
			if (!ctl->connect_warned) {
				CTL_WARN(
					ctl,
					"agent socket %s is served by uid %d, not root or the agent's "
					"uid (RAILHOP_AGENT_UID): lane events not sent",
					ctl->sock_addr.sun_path,
					len == sizeof(cred) ? (int)cred.uid : -1);
				ctl->connect_warned = 1;
			}
			return -EPERM;
		}
	}
	ctl->sock_fd = fd;
	ctl->connect_warned = 0;
	STAT_INC(ctl, connects);
	CTL_INFO(ctl, "connected to agent socket %s", ctl->sock_addr.sun_path);
	return 0;
}

static int event_ok(const struct rh_lane_event *ev)
{
	return ev->magic == RH_EV_MAGIC && ev->version == RH_EV_VERSION &&
	       ev->size == sizeof(*ev) && ev->type >= RH_EV_LANE_UP &&
	       ev->type <= RH_EV_FAIR_SHARE && ev->nports <= RH_EV_MAX_PORTS &&
	       name_ok(ev->nic, sizeof(ev->nic), 0) &&
	       name_ok(ev->remote_nic, sizeof(ev->remote_nic), 1);
}

int rh_ctl_send_event(struct rh_ctl *ctl, const struct rh_lane_event *ev)
{
	int rc = -ENOTCONN;
	uint64_t now;

	if (!event_ok(ev)) {
		STAT_INC(ctl, events_dropped);
		return -EINVAL;
	}
	pthread_mutex_lock(&ctl->sock_lock);
	for (int attempt = 0; attempt < 2; attempt++) {
		if (ctl->sock_fd < 0) {
			now = mono_ns();
			if (ctl->last_connect_ns && attempt == 0 &&
			    now - ctl->last_connect_ns < ctl->opts.reconnect_ns) {
				rc = -ENOTCONN;
				break;
			}
			if (sock_connect_locked(ctl, now) != 0) {
				rc = -ENOTCONN;
				break;
			}
		}
		if (send(ctl->sock_fd, ev, sizeof(*ev), MSG_DONTWAIT | MSG_NOSIGNAL) ==
		    (ssize_t)sizeof(*ev)) {
			rc = 0;
			break;
		}
		rc = -errno;
		if (rc == -EAGAIN || rc == -EWOULDBLOCK || rc == -ENOBUFS || rc == -EINTR) {
			rc = -EAGAIN;
			break;
		}
		/* the agent went away (restart): reconnect once at once */
		CTL_TRACE(ctl, "agent socket send: %s, reconnecting", strerror(-rc));
		close(ctl->sock_fd);
		ctl->sock_fd = -1;
		rc = -ENOTCONN;
	}
	pthread_mutex_unlock(&ctl->sock_lock);
	if (rc == 0) {
		STAT_INC(ctl, events_sent);
	} else {
		STAT_INC(ctl, events_dropped);
	}
	return rc;
}
