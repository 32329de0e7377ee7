/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the plugin's control-plane reader and event sender (plugin/src/ctl.c) against a
 * writer written here from railhop/ctl_table.h alone (the agent's protocol, in C).
 *
 *   test_ctl                       run every test (exit 0 on success)
 *   test_ctl --reader DIR SECONDS  read DIR's table for SECONDS, check every accepted copy against
 *                                  the hammer pattern, print one JSON line (used by
 *                                  tests/unit/test_control_interop.py with the Python writer)
 *   test_ctl --send DIR N          send N events of a known pattern to DIR/agent.sock
 */
#define _GNU_SOURCE
#include "ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failures;

static inline void cpu_pause(void)
{
	__asm__ __volatile__("" ::: "memory");
}

#define CHECK(cond)                                                                              \
	do {                                                                                     \
		if (!(cond)) {                                                                   \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
			failures++;                                                              \
		}                                                                                \
	} while (0)
#define CHECK_EQ(a, b)                                                                    \
	do {                                                                              \
		long long _a = (long long)(a), _b = (long long)(b);                       \
		if (_a != _b) {                                                           \
			fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld != %lld)\n", \
				__FILE__, __LINE__, #a, #b, _a, _b);                      \
			failures++;                                                       \
		}                                                                         \
	} while (0)

static int verbose;

static void test_log(void *arg, int level, const char *func, int line, const char *fmt, ...)
{
	va_list ap;

	(void)arg;
	if (!verbose && level > RH_CTL_LOG_WARN) {
		return;
	}
	fprintf(stderr, "  [ctl %d %s:%d] ", level, func, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- a test writer: the agent's side of the protocol ---- */

struct writer {
	char dir[256];
	uint8_t *base;
	int fd;
	uint64_t publishes;
};

static struct rh_ctl_header *whdr(struct writer *w)
{
	return (struct rh_ctl_header *)w->base;
}

static struct rh_ctl_body *wbody(struct writer *w)
{
	return (struct rh_ctl_body *)(w->base + RH_CTL_BODY_OFFSET);
}

static struct rh_ctl_nic *wnics(struct writer *w)
{
	return (struct rh_ctl_nic *)(w->base + RH_CTL_NICS_OFFSET);
}

static struct rh_ctl_plan *wplans(struct writer *w)
{
	return (struct rh_ctl_plan *)(w->base + RH_CTL_PLANS_OFFSET);
}

static uint64_t pidns(void)
{
	struct stat st;

	return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static uint64_t start_ticks(pid_t pid)
{
	char path[64], buf[1024], *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	fd = open(path, O_RDONLY);
	if (fd < 0) {
		return 0;
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0) {
		return 0;
	}
	buf[n] = '\0';
	p = strrchr(buf, ')');
	for (int f = 3; p && f <= 22; f++) { /* p: the space before field f */
		p = strchr(p + 1, ' ');
	}
	return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* creates DIR/health.tbl by temp file + rename, like the agent */
static void writer_create(struct writer *w, const char *dir, pid_t pid, uint64_t generation,
			  uint32_t heartbeat_ms)
{
	char tmp[300], path[300];
	struct rh_ctl_header *h;

	memset(w, 0, sizeof(*w));
	snprintf(w->dir, sizeof(w->dir), "%s", dir);
	snprintf(tmp, sizeof(tmp), "%s/.health.tbl.tmp", dir);
	snprintf(path, sizeof(path), "%s/%s", dir, RH_CTL_TABLE_FILE);
	w->fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (w->fd < 0 || ftruncate(w->fd, RH_CTL_TABLE_SIZE) != 0) {
		perror("writer_create");
		exit(2);
	}
	w->base = mmap(NULL, RH_CTL_TABLE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, w->fd, 0);
	if (w->base == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	h = whdr(w);
	h->magic = RH_CTL_MAGIC;
	h->layout_version = RH_CTL_LAYOUT_VERSION;
	h->header_size = sizeof(*h);
	h->table_size = RH_CTL_TABLE_SIZE;
	h->max_nics = RH_CTL_MAX_NICS;
	h->max_backups = RH_CTL_MAX_BACKUPS;
	h->nic_rec_size = sizeof(struct rh_ctl_nic);
	h->plan_rec_size = sizeof(struct rh_ctl_plan);
	h->agent_pid = (uint32_t)pid;
	h->agent_start_ticks = start_ticks(pid);
	h->agent_pidns = pidns();
	h->generation = generation;
	h->heartbeat_ns = now_ns();
	wbody(w)->heartbeat_ms = heartbeat_ms;
	if (rename(tmp, path) != 0) {
		perror("rename");
		exit(2);
	}
}

static void writer_destroy(struct writer *w)
{
	munmap(w->base, RH_CTL_TABLE_SIZE);
	close(w->fd);
}

static void write_begin(struct writer *w)
{
	uint64_t s = __atomic_load_n(&whdr(w)->seq, __ATOMIC_RELAXED);

	__atomic_store_n(&whdr(w)->seq, s + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
}

static void write_end(struct writer *w)
{
	struct rh_ctl_body *b = wbody(w);
	uint32_t crc = rh_ctl_crc32(0, (uint8_t *)b + 4, sizeof(*b) - 4);
	uint64_t s;

	crc = rh_ctl_crc32(crc, wnics(w), b->nic_count * sizeof(struct rh_ctl_nic));
	crc = rh_ctl_crc32(crc, wplans(w), b->nic_count * sizeof(struct rh_ctl_plan));
	b->crc32 = crc;
	s = __atomic_load_n(&whdr(w)->seq, __ATOMIC_RELAXED);
	__atomic_store_n(&whdr(w)->seq, s + 1, __ATOMIC_RELEASE);
}

/* the hammer pattern: every field of publish k derives from k (Python mirrors it) */
static uint32_t pattern_count(uint64_t k)
{
	return 4 + (uint32_t)(k % 5);
}

static void pattern_fill(struct writer *w, uint64_t k)
{
	uint32_t n = pattern_count(k);

	wbody(w)->publish_count = k;
	wbody(w)->publish_ns = now_ns();
	wbody(w)->nic_count = (uint16_t)n;
	for (uint32_t i = 0; i < n; i++) {
		struct rh_ctl_nic *nic = &wnics(w)[i];
		struct rh_ctl_plan *plan = &wplans(w)[i];

		memset(nic, 0, sizeof(*nic));
		snprintf(nic->ifname, sizeof(nic->ifname), "nic%u", i);
		snprintf(nic->pci, sizeof(nic->pci), "%04u:00:%02x.0", (unsigned)(k % 10000),
			 i & 0xffu);
		nic->since_ns = k * 1000 + i;
		nic->changes = (uint32_t)k;
		nic->rail = (uint16_t)i;
		nic->state = (uint8_t)(1 + (k + i) % 4);
		nic->reason = (uint8_t)((k + i) % 11);
		nic->numa = (int16_t)(i % 2);
		nic->speed_mbps = (uint32_t)(k % 100000);
		memset(plan, 0, sizeof(*plan));
		plan->count = (uint8_t)((k + i) % (RH_CTL_MAX_BACKUPS + 1));
		plan->plan_version = (uint32_t)k;
		for (uint32_t j = 0; j < plan->count; j++) {
			plan->backups[j].local_nic = (uint16_t)((i + j + 1) % n);
			plan->backups[j].remote_rail = (uint16_t)j;
			plan->backups[j].weight = (uint16_t)((k + j) & 0xffff);
			plan->backups[j].distance = (uint8_t)(j % 5);
		}
	}
}

/* 0 when the view is exactly publish view->publish_count of the pattern (ignores `changes`) */
static int pattern_check(const struct rh_ctl_view *v)
{
	uint64_t k = v->publish_count;
	char buf[RH_CTL_PCI_LEN];

	if (v->nic_count != pattern_count(k)) {
		return -1;
	}
	for (uint32_t i = 0; i < v->nic_count; i++) {
		const struct rh_ctl_nic *nic = &v->nics[i];
		const struct rh_ctl_plan *plan = &v->plans[i];

		snprintf(buf, sizeof(buf), "nic%u", i);
		if (strcmp(nic->ifname, buf) != 0) {
			return -1;
		}
		snprintf(buf, sizeof(buf), "%04u:00:%02x.0", (unsigned)(k % 10000), i & 0xffu);
		if (strcmp(nic->pci, buf) != 0 || nic->since_ns != k * 1000 + i || nic->rail != i ||
		    nic->state != 1 + (k + i) % 4 || nic->reason != (k + i) % 11 ||
		    nic->numa != (int16_t)(i % 2) || nic->speed_mbps != k % 100000) {
			return -1;
		}
		if (plan->count != (k + i) % (RH_CTL_MAX_BACKUPS + 1) ||
		    plan->plan_version != (uint32_t)k) {
			return -1;
		}
		for (uint32_t j = 0; j < plan->count; j++) {
			const struct rh_ctl_backup *bk = &plan->backups[j];

			if (bk->local_nic != (i + j + 1) % v->nic_count || bk->remote_rail != j ||
			    bk->weight != ((k + j) & 0xffff) || bk->distance != j % 5) {
				return -1;
			}
		}
	}
	return 0;
}

static void writer_publish(struct writer *w, uint64_t k)
{
	write_begin(w);
	pattern_fill(w, k);
	write_end(w);
}

static void writer_heartbeat(struct writer *w, uint64_t ns)
{
	__atomic_store_n(&whdr(w)->heartbeat_ns, ns, __ATOMIC_RELAXED);
}

/* ---- helpers ---- */

static char *make_dir(void)
{
	static char dirs[16][64];
	static int next;
	char *d = dirs[next++ % 16];

	snprintf(d, 64, "/tmp/rh_test_ctl.XXXXXX");
	if (!mkdtemp(d)) {
		perror("mkdtemp");
		exit(2);
	}
	return d;
}

static void rm_dir(const char *d)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
	if (system(cmd) != 0) {
		fprintf(stderr, "cleanup of %s failed\n", d);
	}
}

static struct rh_ctl *open_ctl(const char *dir)
{
	struct rh_ctl_opts o = { .log = test_log, .poll_interval_ns = 1, .reconnect_ns = 1 };
	struct rh_ctl *ctl = NULL;

	CHECK_EQ(rh_ctl_open(dir, &o, &ctl), 0);
	return ctl;
}

static struct rh_ctl_view *new_view(void)
{
	struct rh_ctl_view *v = calloc(1, sizeof(*v));

	if (!v) {
		exit(2);
	}
	return v;
}

/* ---- tests ---- */

static void test_crc(void)
{
	CHECK_EQ(rh_ctl_crc32(0, "123456789", 9), 0xcbf43926u);
	CHECK_EQ(rh_ctl_crc32(rh_ctl_crc32(0, "1234", 4), "56789", 5), 0xcbf43926u);
	CHECK_EQ(rh_ctl_crc32(0, "", 0), 0);
}

static void test_no_agent(void)
{
	char *dir = make_dir();
	struct rh_ctl *ctl = open_ctl(dir);
	struct rh_ctl_view *v = new_view();
	struct rh_lane_event ev;
	struct rh_ctl_stats st;

	CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE);
	CHECK_EQ(rh_ctl_refresh(ctl), -ENOENT);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE);
	rh_lane_event_init(&ev, RH_EV_LANE_TIMEOUT);
	snprintf(ev.nic, sizeof(ev.nic), "nic0");
	CHECK_EQ(rh_ctl_send_event(ctl, &ev), -ENOTCONN);
	rh_ctl_stats(ctl, &st);
	CHECK_EQ(st.events_dropped, 1);
	CHECK_EQ(st.events_sent, 0);
	rh_ctl_close(ctl);
	/* a run dir that does not exist at all, and the default from the environment */
	setenv(RH_CTL_RUN_DIR_ENV, "/nonexistent/railhop-test", 1);
	CHECK_EQ(rh_ctl_open(NULL, NULL, &ctl), 0);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE);
	rh_ctl_close(ctl);
	unsetenv(RH_CTL_RUN_DIR_ENV);
	free(v);
	rm_dir(dir);
}

static void test_publish_and_cache(void)
{
	char *dir = make_dir();
	struct rh_ctl *ctl = open_ctl(dir);
	struct rh_ctl_view *v = new_view();
	struct writer w;
	struct rh_ctl_stats st;

	writer_create(&w, dir, getpid(), 7, 1000);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE); /* not mapped until poll */
	CHECK_EQ(rh_ctl_refresh(ctl), 1);
	CHECK_EQ(rh_ctl_refresh(ctl), 0);
	writer_publish(&w, 12);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	CHECK_EQ(v->changed, 1);
	CHECK_EQ(v->generation, 7);
	CHECK_EQ(v->agent_pid, getpid());
	CHECK_EQ(v->publish_count, 12);
	CHECK_EQ(pattern_check(v), 0);
	CHECK_EQ(rh_ctl_view_find(v, "nic2"), 2);
	CHECK_EQ(rh_ctl_view_find(v, "nic9"), -1);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	CHECK_EQ(v->changed, 0);
	writer_publish(&w, 13);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	CHECK_EQ(v->changed, 1);
	CHECK_EQ(v->publish_count, 13);
	CHECK_EQ(pattern_check(v), 0);
	rh_ctl_stats(ctl, &st);
	CHECK_EQ(st.snapshots_copied, 2);
	CHECK_EQ(st.remaps, 1);

	/* a writer in the middle of an update (odd seq) is never read: bounded retries */
	write_begin(&w);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -EAGAIN);
	pattern_fill(&w, 14);
	write_end(&w);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	CHECK_EQ(v->publish_count, 14);

	/* clean shutdown of the agent: flag set under the seqlock */
	write_begin(&w);
	wbody(&w)->flags |= RH_CTL_F_AGENT_GONE;
	write_end(&w);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE); /* cached, cheap */

	writer_destroy(&w);
	rh_ctl_close(ctl);
	free(v);
	rm_dir(dir);
}

static void test_heartbeat(void)
{
	char *dir = make_dir();
	struct rh_ctl *ctl = open_ctl(dir);
	struct rh_ctl_view *v = new_view();
	struct writer w;

	writer_create(&w, dir, getpid(), 1, 10); /* stale after 8 x 10 ms */
	writer_publish(&w, 1);
	CHECK_EQ(rh_ctl_refresh(ctl), 1);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	writer_heartbeat(&w, now_ns() - 200000000ull);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE);
	writer_heartbeat(&w, now_ns());
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	CHECK_EQ(pattern_check(v), 0);
	/* heartbeat_ms 0: the agent does not heartbeat, never stale by time */
	write_begin(&w);
	wbody(&w)->heartbeat_ms = 0;
	write_end(&w);
	writer_heartbeat(&w, 1);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	writer_destroy(&w);
	rh_ctl_close(ctl);
	free(v);
	rm_dir(dir);
}

static void test_killed_agent(void)
{
	char *dir = make_dir();
	struct rh_ctl *ctl = open_ctl(dir);
	struct rh_ctl_view *v = new_view();
	struct writer w;
	pid_t child = fork();
	int status;

	if (child == 0) {
		pause();
		_exit(0);
	}
	/* the "agent" is the child; the heartbeat is fresh, only the pid check can tell */
	writer_create(&w, dir, child, 3, 0);
	writer_publish(&w, 5);
	CHECK_EQ(rh_ctl_refresh(ctl), 1);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	kill(child, SIGKILL);
	waitpid(child, &status, 0);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0); /* the hot path does no syscalls: not seen yet */
	CHECK_EQ(rh_ctl_refresh(ctl), 0);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE);
	writer_destroy(&w);

	/* a reused pid: same pid as a live process, another start time */
	writer_create(&w, dir, getpid(), 4, 0);
	whdr(&w)->agent_start_ticks += 1; /* not what /proc says: a different process */
	/* (written after rename: the statics are read at map time, and that is after this) */
	writer_publish(&w, 6);
	CHECK_EQ(rh_ctl_refresh(ctl), 1);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE);
	writer_destroy(&w);
	rh_ctl_close(ctl);
	free(v);
	rm_dir(dir);
}

static void test_restarted_agent(void)
{
	char *dir = make_dir();
	struct rh_ctl *ctl = open_ctl(dir);
	struct rh_ctl_view *v = new_view();
	struct writer w1, w2;
	uint64_t map1;

	writer_create(&w1, dir, getpid(), 10, 0);
	writer_publish(&w1, 100);
	CHECK_EQ(rh_ctl_refresh(ctl), 1);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	map1 = v->map_id;
	CHECK_EQ(v->generation, 10);
	/* the old agent dies without cleaning up, a new one replaces the file */
	writer_create(&w2, dir, getpid(), 11, 0);
	writer_publish(&w2, 1);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0); /* still the old mapping until poll */
	CHECK_EQ(v->generation, 10);
	CHECK_EQ(rh_ctl_refresh(ctl), 1);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	CHECK_EQ(v->changed, 1);
	CHECK_EQ(v->generation, 11);
	CHECK_EQ(v->publish_count, 1);
	CHECK(v->map_id != map1);
	CHECK_EQ(pattern_check(v), 0);
	/* the old writer scribbling on its (unlinked) file changes nothing */
	writer_publish(&w1, 101);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	CHECK_EQ(v->changed, 0);
	CHECK_EQ(v->generation, 11);
	writer_destroy(&w1);
	writer_destroy(&w2);
	rh_ctl_close(ctl);
	free(v);
	rm_dir(dir);
}

static void write_file(const char *dir, const void *buf, size_t len)
{
	char tmp[300], path[300];
	int fd;

	snprintf(tmp, sizeof(tmp), "%s/.bad.tmp", dir);
	snprintf(path, sizeof(path), "%s/%s", dir, RH_CTL_TABLE_FILE);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || write(fd, buf, len) != (ssize_t)len || close(fd) != 0 ||
	    rename(tmp, path) != 0) {
		perror("write_file");
		exit(2);
	}
}

static void test_corrupt(void)
{
	char *dir = make_dir();
	struct rh_ctl *ctl = open_ctl(dir);
	struct rh_ctl_view *v = new_view();
	struct rh_ctl_stats st;
	struct writer w;
	uint8_t *img = calloc(1, RH_CTL_TABLE_SIZE);

	/* truncated file: never mapped (no SIGBUS) */
	writer_create(&w, dir, getpid(), 1, 0);
	writer_publish(&w, 3);
	memcpy(img, w.base, RH_CTL_TABLE_SIZE);
	writer_destroy(&w);
	write_file(dir, img, RH_CTL_TABLE_SIZE - 1);
	CHECK_EQ(rh_ctl_refresh(ctl), -EPROTO);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE);
	write_file(dir, img, 10);
	CHECK_EQ(rh_ctl_refresh(ctl), -EPROTO);
	/* bad magic, bad layout version, bad record size: rejected at map time */
	((struct rh_ctl_header *)img)->magic ^= 1;
	write_file(dir, img, RH_CTL_TABLE_SIZE);
	CHECK_EQ(rh_ctl_refresh(ctl), -EPROTO);
	CHECK_EQ(rh_ctl_refresh(ctl), -EPROTO); /* same file: logged once */
	((struct rh_ctl_header *)img)->magic ^= 1;
	((struct rh_ctl_header *)img)->layout_version = RH_CTL_LAYOUT_VERSION + 1;
	write_file(dir, img, RH_CTL_TABLE_SIZE);
	CHECK_EQ(rh_ctl_refresh(ctl), -EPROTO);
	((struct rh_ctl_header *)img)->layout_version = RH_CTL_LAYOUT_VERSION;
	((struct rh_ctl_header *)img)->nic_rec_size = 72;
	write_file(dir, img, RH_CTL_TABLE_SIZE);
	CHECK_EQ(rh_ctl_refresh(ctl), -EPROTO);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE);
	((struct rh_ctl_header *)img)->nic_rec_size = sizeof(struct rh_ctl_nic);
	/* a good file maps */
	write_file(dir, img, RH_CTL_TABLE_SIZE);
	CHECK_EQ(rh_ctl_refresh(ctl), 1);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	CHECK_EQ(pattern_check(v), 0);

	/* in-place corruption of a mapped table */
	writer_create(&w, dir, getpid(), 2, 0);
	writer_publish(&w, 8);
	CHECK_EQ(rh_ctl_refresh(ctl), 1);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	/* a flipped payload byte with a new seq: CRC mismatch */
	write_begin(&w);
	pattern_fill(&w, 9);
	write_end(&w);
	write_begin(&w);
	wnics(&w)[1].since_ns ^= 0x100; /* no CRC update */
	__atomic_store_n(&whdr(&w)->seq, whdr(&w)->seq + 1, __ATOMIC_RELEASE);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -EPROTO);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -EPROTO); /* remembered: no second full read */
	rh_ctl_stats(ctl, &st);
	CHECK(st.crc_errors >= 1 && st.crc_errors <= 64);
	/* the agent repairs it on its next publish */
	writer_publish(&w, 10);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	CHECK_EQ(pattern_check(v), 0);
	/* a CRC-clean table with nonsense records: bad state, plan index, unterminated name */
	write_begin(&w);
	pattern_fill(&w, 11);
	wnics(&w)[0].state = 9;
	write_end(&w);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -EPROTO);
	write_begin(&w);
	pattern_fill(&w, 12);
	wplans(&w)[0].backups[0].local_nic = 60;
	write_end(&w);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -EPROTO);
	write_begin(&w);
	pattern_fill(&w, 13);
	memset(wnics(&w)[2].ifname, 'x', RH_CTL_IFNAME_LEN);
	write_end(&w);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -EPROTO);
	write_begin(&w);
	pattern_fill(&w, 14);
	wbody(&w)->nic_count = RH_CTL_MAX_NICS + 1;
	write_end(&w);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -EPROTO);
	/* bad magic written in place */
	writer_publish(&w, 15);
	whdr(&w)->magic = 0;
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -EPROTO);
	whdr(&w)->magic = RH_CTL_MAGIC;
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	CHECK_EQ(v->publish_count, 15);
	CHECK_EQ(pattern_check(v), 0);
	writer_destroy(&w);
	free(img);
	rh_ctl_close(ctl);
	free(v);
	rm_dir(dir);
}

/* concurrent writer hammering while readers read: no accepted copy may be torn */
struct hammer {
	struct rh_ctl *ctl;
	struct writer *w;
	int stop;
	uint64_t accepted, distinct, bad, again;
};

static void *hammer_reader(void *arg)
{
	struct hammer *hm = arg;
	struct rh_ctl_view *v = new_view();
	uint64_t last = 0;

	while (!__atomic_load_n(&hm->stop, __ATOMIC_ACQUIRE)) {
		int rc = rh_ctl_snapshot(hm->ctl, v);

		if (rc == -EAGAIN) {
			__atomic_fetch_add(&hm->again, 1, __ATOMIC_RELAXED);
			continue;
		}
		if (rc != 0 || pattern_check(v) != 0 || v->publish_count < last) {
			__atomic_fetch_add(&hm->bad, 1, __ATOMIC_RELAXED);
			continue;
		}
		__atomic_fetch_add(&hm->accepted, 1, __ATOMIC_RELAXED);
		if (v->changed) {
			__atomic_fetch_add(&hm->distinct, 1, __ATOMIC_RELAXED);
		}
		last = v->publish_count;
	}
	free(v);
	return NULL;
}

static void test_hammer(void)
{
	char *dir = make_dir();
	struct writer w;
	struct hammer hm = { 0 };
	pthread_t th[2];
	struct rh_ctl_stats st;
	uint64_t k = 1, end, t0, rnd = 0x9e3779b97f4a7c15ull;

	writer_create(&w, dir, getpid(), 1, 0);
	writer_publish(&w, k);
	hm.ctl = open_ctl(dir);
	hm.w = &w;
	for (int i = 0; i < 2; i++) {
		pthread_create(&th[i], NULL, hammer_reader, &hm);
	}
	/*
	 * Back-to-back publishes with random gaps of 0..~4 us (a reader that starts a copy in a gap
	 * often overlaps the next publish), until 0.5 s have passed and the readers accepted 20
	 * distinct publishes, or 10 s on a machine too busy for that.
	 */
	t0 = now_ns();
	end = t0 + 10000000000ull;
	while (now_ns() < end && (now_ns() - t0 < 500000000ull ||
				  __atomic_load_n(&hm.distinct, __ATOMIC_RELAXED) < 20)) {
		uint64_t gap_end;

		writer_publish(&w, ++k);
		rnd ^= rnd << 13;
		rnd ^= rnd >> 7;
		rnd ^= rnd << 17;
		gap_end = now_ns() + ((rnd & 1) ? (rnd & 4095) : 0); /* half back-to-back */
		while (now_ns() < gap_end) {
			cpu_pause();
		}
		if ((k & 1023) == 0) {
			sched_yield();
		}
	}
	__atomic_store_n(&hm.stop, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
	}
	rh_ctl_stats(hm.ctl, &st);
	printf("  hammer: %" PRIu64 " publishes, %" PRIu64 " copies accepted (%" PRIu64
	       " distinct), %" PRIu64 " torn copies retried, %" PRIu64 " crc retries, %" PRIu64
	       " EAGAIN, %" PRIu64 " bad\n",
	       k, hm.accepted, hm.distinct, st.torn_retries, st.crc_errors, hm.again, hm.bad);
	CHECK_EQ(hm.bad, 0);
	CHECK(hm.distinct >= 20);
	writer_destroy(&w);
	rh_ctl_close(hm.ctl);
	rm_dir(dir);
}

static int listen_at(const char *dir)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s/%s", dir, RH_CTL_SOCKET_FILE);
	unlink(a.sun_path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 8) != 0) {
		perror("listen_at");
		exit(2);
	}
	return fd;
}

static void test_events(void)
{
	char *dir = make_dir();
	struct rh_ctl *ctl = open_ctl(dir);
	struct rh_lane_event ev, got;
	struct rh_ctl_stats st;
	int lfd, cfd, sent = 0, rc = 0;
	uint64_t t0;

	rh_lane_event_init(&ev, RH_EV_LANE_UP);
	CHECK_EQ(ev.magic, RH_EV_MAGIC);
	CHECK_EQ(ev.size, sizeof(ev));
	CHECK_EQ(ev.pid, getpid());
	CHECK(ev.t_ns > 0);
	snprintf(ev.nic, sizeof(ev.nic), "nic1");
	snprintf(ev.remote_nic, sizeof(ev.remote_nic), "nic1");
	ev.conn_id = 0x1122334455667788ull;
	ev.epoch = 3;
	ev.nports = 2;
	ev.local_ports[0] = 40000;
	ev.local_ports[1] = 40001;
	ev.remote_ports[0] = 5000;
	ev.remote_ports[1] = 5001;
	CHECK_EQ(rh_ctl_send_event(ctl, &ev), -ENOTCONN); /* no agent yet */

	lfd = listen_at(dir);
	CHECK_EQ(rh_ctl_send_event(ctl, &ev), 0); /* connects on demand */
	cfd = accept(lfd, NULL, NULL);
	CHECK(cfd >= 0);
	CHECK_EQ(recv(cfd, &got, sizeof(got) + 1, 0), sizeof(got));
	CHECK(memcmp(&got, &ev, sizeof(ev)) == 0);

	/* invalid events never leave */
	got = ev;
	got.type = 99;
	CHECK_EQ(rh_ctl_send_event(ctl, &got), -EINVAL);
	got = ev;
	memset(got.nic, 'a', sizeof(got.nic));
	CHECK_EQ(rh_ctl_send_event(ctl, &got), -EINVAL);
	got = ev;
	got.nports = 9;
	CHECK_EQ(rh_ctl_send_event(ctl, &got), -EINVAL);

	/* an agent that does not read: sends fail with EAGAIN, never block */
	t0 = now_ns();
	for (int i = 0; i < 100000 && rc == 0; i++) {
		rc = rh_ctl_send_event(ctl, &ev);
		sent += rc == 0;
	}
	CHECK_EQ(rc, -EAGAIN);
	CHECK(sent > 0);
	CHECK(now_ns() - t0 < 5000000000ull);

	/* agent restart: old connection closed, new listener; the next send reconnects */
	close(cfd);
	close(lfd);
	lfd = listen_at(dir);
	rc = rh_ctl_send_event(ctl, &ev);
	CHECK_EQ(rc, 0);
	cfd = accept(lfd, NULL, NULL);
	CHECK(cfd >= 0);
	CHECK_EQ(recv(cfd, &got, sizeof(got), MSG_DONTWAIT), sizeof(got));
	CHECK(memcmp(&got, &ev, sizeof(ev)) == 0);
	rh_ctl_stats(ctl, &st);
	CHECK_EQ(st.connects, 2);
	CHECK_EQ(st.events_sent, (uint64_t)sent + 2);
	close(cfd);
	close(lfd);
	rh_ctl_close(ctl);
	rm_dir(dir);
}

/* Issue 19, 1: a truncated table must not kill the reader. On a shared mapping the first touch
 * of a page past the new end raised SIGBUS; a child process reads while the parent truncates
 * and restores the file, and must end by exit(0), not by a signal. */
static void test_truncate(void)
{
	char *dir = make_dir();
	struct rh_ctl *ctl = open_ctl(dir);
	struct rh_ctl_view *v = new_view();
	char path[300];
	struct writer w;
	int status = 0, reaped = 0;
	pid_t child;

	writer_create(&w, dir, getpid(), 1, 0);
	snprintf(path, sizeof(path), "%s/%s", dir, RH_CTL_TABLE_FILE);
	CHECK_EQ(rh_ctl_refresh(ctl), 1);
	writer_publish(&w, 5);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	/* a truncate while nothing runs: the next snapshot reports a corrupt table */
	CHECK_EQ(truncate(path, 100), 0);
	v->map_id = 0; /* force a full copy */
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -EPROTO);
	CHECK_EQ(truncate(path, 0), 0);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -EPROTO);
	CHECK_EQ(truncate(path, RH_CTL_TABLE_SIZE), 0);
	munmap(w.base, RH_CTL_TABLE_SIZE);
	w.base = mmap(NULL, RH_CTL_TABLE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, w.fd, 0);
	CHECK(w.base != MAP_FAILED);

	/* truncates racing with reads: the reader child must survive every one */
	child = fork();
	if (child == 0) {
		uint64_t end = now_ns() + 1000000000ull;
		long ok = 0, bad = 0;

		while (now_ns() < end) {
			int rc = rh_ctl_snapshot(ctl, v);

			v->map_id = 0;
			ok += rc == 0;
			bad += rc == -EPROTO;
		}
		_exit(ok + bad > 0 ? 0 : 3);
	}
	CHECK(child > 0);
	for (int i = 0; i < 2000 && !reaped; i++) {
		CHECK_EQ(ftruncate(w.fd, (i & 1) ? RH_CTL_TABLE_SIZE : 64), 0);
		if (i & 1) {
			writer_publish(&w, 6 + (uint64_t)i);
		}
		sched_yield();
		reaped = waitpid(child, &status, WNOHANG) == child;
	}
	CHECK_EQ(ftruncate(w.fd, RH_CTL_TABLE_SIZE), 0);
	if (!reaped) {
		CHECK_EQ(waitpid(child, &status, 0), child);
	}
	if (WIFSIGNALED(status)) {
		fprintf(stderr, "reader killed by signal %d while the table was truncated\n",
			WTERMSIG(status));
	}
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	writer_destroy(&w);
	rh_ctl_close(ctl);
	free(v);
	rm_dir(dir);
}

/* Issue 19, 2: the table is trusted only from root or the agent's uid, and only when no one
 * else may write it. */
static void test_owner(void)
{
	char *dir = make_dir();
	struct rh_ctl_opts o = { .log = test_log, .poll_interval_ns = 1, .reconnect_ns = 1 };
	struct rh_ctl_view *v = new_view();
	struct rh_ctl *ctl = NULL;
	uid_t me = geteuid(), other = me == 0 ? 65534 : me + 1;
	char path[300];
	struct writer w;

	writer_create(&w, dir, getpid(), 1, 0);
	writer_publish(&w, 3);
	snprintf(path, sizeof(path), "%s/%s", dir, RH_CTL_TABLE_FILE);

	/* others may write it: refused whoever owns it */
	CHECK_EQ(chmod(path, 0666), 0);
	CHECK_EQ(rh_ctl_open(dir, &o, &ctl), 0);
	CHECK_EQ(rh_ctl_refresh(ctl), -EPERM);
	CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE);
	rh_ctl_close(ctl);
	CHECK_EQ(chmod(path, 0644), 0);

	if (me == 0) {
		/* root: a table of another uid is refused unless that uid is the agent's */
		CHECK_EQ(chown(path, other, (gid_t)-1), 0);
		CHECK_EQ(rh_ctl_open(dir, &o, &ctl), 0);
		CHECK_EQ(rh_ctl_refresh(ctl), -EPERM);
		CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE);
		rh_ctl_close(ctl);
		o.agent_uid = other;
	} else {
		/* not root: a table of our own uid is refused when the agent's uid is another */
		o.agent_uid = other;
		CHECK_EQ(rh_ctl_open(dir, &o, &ctl), 0);
		CHECK_EQ(rh_ctl_refresh(ctl), -EPERM);
		CHECK_EQ(rh_ctl_snapshot(ctl, v), -ESTALE);
		rh_ctl_close(ctl);
		o.agent_uid = me;
	}
	CHECK_EQ(rh_ctl_open(dir, &o, &ctl), 0);
	CHECK_EQ(rh_ctl_refresh(ctl), 0); /* opened by rh_ctl_open's first refresh */
	CHECK_EQ(rh_ctl_snapshot(ctl, v), 0);
	CHECK_EQ(v->publish_count, 3);
	rh_ctl_close(ctl);

	/* the socket: events go only to a server of root or the agent's uid */
	if (me != 0) {
		struct rh_lane_event ev;
		int lfd = listen_at(dir);

		rh_lane_event_init(&ev, RH_EV_LANE_UP);
		snprintf(ev.nic, sizeof(ev.nic), "nic0");
		o.agent_uid = other;
		CHECK_EQ(rh_ctl_open(dir, &o, &ctl), 0);
		CHECK_EQ(rh_ctl_send_event(ctl, &ev), -ENOTCONN);
		rh_ctl_close(ctl);
		o.agent_uid = me;
		CHECK_EQ(rh_ctl_open(dir, &o, &ctl), 0);
		CHECK_EQ(rh_ctl_send_event(ctl, &ev), 0);
		rh_ctl_close(ctl);
		close(lfd);
	} else {
		/* a server of uid `other` (a child that dropped to it) is refused */
		struct rh_lane_event ev;
		int ready[2], go[2], status = 0;
		char c = 0;
		pid_t child;

		CHECK_EQ(chmod(dir, 0777), 0);
		CHECK_EQ(pipe(ready), 0);
		CHECK_EQ(pipe(go), 0);
		child = fork();
		if (child == 0) {
			int lfd;

			close(ready[0]);
			close(go[1]);
			if (setgid(other) != 0 || setuid(other) != 0) {
				_exit(2);
			}
			lfd = listen_at(dir);
			if (write(ready[1], "x", 1) != 1 || read(go[0], &c, 1) < 0) {
				_exit(2);
			}
			close(lfd);
			_exit(0);
		}
		close(ready[1]);
		close(go[0]);
		CHECK_EQ(read(ready[0], &c, 1), 1); /* 0 (EOF) if the child failed */
		rh_lane_event_init(&ev, RH_EV_LANE_UP);
		snprintf(ev.nic, sizeof(ev.nic), "nic0");
		o.agent_uid = 0;
		CHECK_EQ(rh_ctl_open(dir, &o, &ctl), 0);
		CHECK_EQ(rh_ctl_send_event(ctl, &ev), -ENOTCONN);
		rh_ctl_close(ctl);
		o.agent_uid = other;
		CHECK_EQ(rh_ctl_open(dir, &o, &ctl), 0);
		CHECK_EQ(rh_ctl_send_event(ctl, &ev), 0);
		rh_ctl_close(ctl);
		close(go[1]); /* EOF: the child ends */
		CHECK_EQ(waitpid(child, &status, 0), child);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
		close(ready[0]);
	}
	writer_destroy(&w);
	free(v);
	rm_dir(dir);
}

/* ---- --reader mode for the Python interop test ---- */

static int reader_main(const char *dir, double seconds)
{
	struct rh_ctl_opts o = { .log = test_log, .poll_interval_ns = 1000000 };
	struct rh_ctl_view *v = new_view();
	struct rh_ctl *ctl;
	struct rh_ctl_stats st;
	uint64_t end = now_ns() + (uint64_t)(seconds * 1e9), accepted = 0, distinct = 0, bad = 0,
		 stale = 0, again = 0, proto = 0, last = 0, generation = 0, gens = 0;
	uint32_t settings[4] = { 0 }; /* the node policy's settings of the last accepted copy */

	if (rh_ctl_open(dir, &o, &ctl) != 0) {
		return 2;
	}
	while (now_ns() < end) {
		int rc;

		rh_ctl_refresh(ctl);
		rc = rh_ctl_snapshot(ctl, v);
		if (rc == -ESTALE) {
			stale++;
			continue;
		}
		if (rc == -EAGAIN) {
			again++;
			continue;
		}
		if (rc == -EPROTO) {
			proto++;
			continue;
		}
		if (v->generation != generation) {
			generation = v->generation;
			gens++;
			last = 0;
		}
		if (pattern_check(v) != 0 || v->publish_count < last) {
			if (bad++ < 3) {
				fprintf(stderr, "bad copy: publish %" PRIu64 "\n",
					v->publish_count);
			}
			continue;
		}
		accepted++;
		distinct += v->changed;
		last = v->publish_count;
		settings[0] = v->completion_ms;
		settings[1] = v->probe_ms;
		settings[2] = v->failback_interval_ms;
		settings[3] = v->settings_flags;
	}
	rh_ctl_stats(ctl, &st);
	printf("{\"accepted\": %" PRIu64 ", \"distinct\": %" PRIu64 ", \"bad\": %" PRIu64
	       ", \"stale\": %" PRIu64 ", \"again\": %" PRIu64 ", \"proto\": %" PRIu64
	       ", \"generations\": %" PRIu64 ", \"last_publish\": %" PRIu64
	       ", \"torn_retries\": %" PRIu64 ", \"crc_errors\": %" PRIu64
	       ", \"settings\": [%u, %u, %u, %u]}\n",
	       accepted, distinct, bad, stale, again, proto, gens, last, st.torn_retries,
	       st.crc_errors, settings[0], settings[1], settings[2], settings[3]);
	rh_ctl_close(ctl);
	free(v);
	return bad ? 1 : 0;
}

/* ---- --send mode: N events of a known pattern, for the Python server (interop test) ---- */

static int send_main(const char *dir, int n)
{
	struct rh_ctl_opts o = { .log = test_log, .reconnect_ns = 1 };
	struct rh_lane_event ev;
	struct rh_ctl *ctl;
	int sent = 0;

	if (rh_ctl_open(dir, &o, &ctl) != 0) {
		return 2;
	}
	for (int i = 0; i < n; i++) {
		rh_lane_event_init(&ev, (uint16_t)(1 + i % 7));
		snprintf(ev.nic, sizeof(ev.nic), "nic%d", i % 4);
		if (i % 2) {
			snprintf(ev.remote_nic, sizeof(ev.remote_nic), "peer%d", i % 3);
		}
		ev.conn_id = 1000 + (uint64_t)i;
		ev.epoch = (uint32_t)i * 3;
		ev.lane = (uint32_t)i % 5;
		ev.duration_ns = (uint64_t)i * 1000;
		ev.error = i % 3 ? 0 : 110;
		ev.nports = (uint16_t)(i % (RH_EV_MAX_PORTS + 1));
		for (int p = 0; p < ev.nports; p++) {
			ev.local_ports[p] = (uint16_t)(40000 + i + p);
			ev.remote_ports[p] = (uint16_t)(50000 + i + p);
		}
		ev.local_addr[10] = ev.local_addr[11] = 0xff; /* ::ffff:10.77.<i%4>.1 */
		ev.local_addr[12] = 10;
		ev.local_addr[13] = 77;
		ev.local_addr[14] = (uint8_t)(i % 4);
		ev.local_addr[15] = 1;
		/* a full socket is dropped by design; the test reads fast, so retry briefly */
		for (int tries = 0; tries < 1000; tries++) {
			int rc = rh_ctl_send_event(ctl, &ev);

			if (rc == 0) {
				sent++;
				break;
			}
			usleep(1000);
		}
	}
	printf("{\"sent\": %d, \"pid\": %d}\n", sent, getpid());
	rh_ctl_close(ctl);
	return sent == n ? 0 : 1;
}

/* ---- --dump mode: one snapshot's node policy, for the Python layout-minor tests ---- */

static int dump_main(const char *dir)
{
	struct rh_ctl_opts o = { .log = test_log, .poll_interval_ns = 1000000 };
	struct rh_ctl_view *v = new_view();
	uint64_t end = now_ns() + 5000000000ull;
	struct rh_ctl *ctl;
	int rc = -EAGAIN;

	if (rh_ctl_open(dir, &o, &ctl) != 0) {
		return 2;
	}
	while (rc != 0 && now_ns() < end) {
		rh_ctl_refresh(ctl);
		rc = rh_ctl_snapshot(ctl, v);
		if (rc != 0) {
			usleep(2000);
		}
	}
	if (rc == 0) {
		printf("{\"layout_minor\": %u, \"rail_rule\": %u, \"distance_limit\": %u, "
		       "\"min_rails_up\": %u, \"backup_lanes\": %u, \"completion_ms\": %u, "
		       "\"rail_peers\": [",
		       v->layout_minor, v->rail_rule, v->distance_limit, v->min_rails_up,
		       v->backup_lanes, v->completion_ms);
		for (uint32_t i = 0; i < v->nic_count; i++) {
			printf("%s\"%" PRIu64 "\"", i ? ", " : "", v->nics[i].rail_peers);
		}
		printf("]}\n");
	}
	rh_ctl_close(ctl);
	free(v);
	return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	verbose = getenv("RAILHOP_TEST_VERBOSE") != NULL;
	if (argc == 3 && strcmp(argv[1], "--dump") == 0) {
		return dump_main(argv[2]);
	}
	if (argc == 4 && strcmp(argv[1], "--reader") == 0) {
		return reader_main(argv[2], atof(argv[3]));
	}
	if (argc == 4 && strcmp(argv[1], "--send") == 0) {
		return send_main(argv[2], atoi(argv[3]));
	}
	signal(SIGPIPE, SIG_IGN);
	test_crc();
	test_no_agent();
	test_publish_and_cache();
	test_heartbeat();
	test_killed_agent();
	test_restarted_agent();
	test_corrupt();
	test_hammer();
	test_events();
	test_truncate();
	test_owner();
	if (failures) {
		fprintf(stderr, "test_ctl: %d check(s) failed\n", failures);
		return 1;
	}
	printf("test_ctl: all tests passed\n");
	return 0;
}
