/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the health table reader (ctl.c), through its real I/O path. The agent
 * writes the table (railhop/ctl_table.h) as a file the plugin reads with pread: each input
 * becomes that file in a private run directory, then rh_ctl_open (which maps it: the header
 * check), rh_ctl_snapshot (seqlock, header, CRC, records) and rh_ctl_view_find run on it.
 *
 * Byte 0 of the input steers, the rest is the file:
 *   bit 0: write the body's CRC over the file's body, NICs and plans (random bytes would
 *          almost never reach the record checks otherwise);
 *   bit 1: zero-pad the file to RH_CTL_TABLE_SIZE (shorter files are refused at open);
 *   bit 2: set the heartbeat to now (a fresh agent; else it is whatever the bytes say).
 * Checks, whenever the snapshot accepted a copy (the view is valid, live or stale): the file
 * has the magic, layout and sizes; its CRC matches; nic_count is in bounds; every record names
 * a printable, NUL-terminated interface and PCI address, a known state and a plan whose
 * backups are NICs of the table; rh_ctl_view_find finds each interface at or before its index.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char run_dir[64];
static char table_path[128];
static uint8_t file[RH_CTL_TABLE_SIZE + 4096];

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void cleanup(void)
{
	if (run_dir[0]) {
		nftw(run_dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
	}
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");

	snprintf(run_dir, sizeof(run_dir), "%s/rh-fuzz-ctl-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (strlen(run_dir) >= sizeof(run_dir) - 1 || !mkdtemp(run_dir)) {
		perror("fuzz_ctl: mkdtemp");
		abort();
	}
	snprintf(table_path, sizeof(table_path), "%s/%s", run_dir, RH_CTL_TABLE_FILE);
	atexit(cleanup);
}

static uint32_t file_crc(const uint8_t *f, uint32_t n)
{
	uint32_t crc = rh_ctl_crc32(0, f + RH_CTL_BODY_OFFSET + 4, sizeof(struct rh_ctl_body) - 4);

	crc = rh_ctl_crc32(crc, f + RH_CTL_NICS_OFFSET, (uint64_t)n * sizeof(struct rh_ctl_nic));
	return rh_ctl_crc32(crc, f + RH_CTL_PLANS_OFFSET, (uint64_t)n * sizeof(struct rh_ctl_plan));
}

/* The property ctl.c's name check promises, written again on purpose: an oracle that called
 * the code under test would agree with any bug in it. */
static int printable(const char *s, size_t cap, int may_be_empty)
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

static void check_view(const struct rh_ctl_view *v, const uint8_t *f, size_t len)
{
	struct rh_ctl_header h;
	struct rh_ctl_body b;

	FUZZ_CHECK(len >= RH_CTL_TABLE_SIZE);
	memcpy(&h, f, sizeof(h));
	memcpy(&b, f + RH_CTL_BODY_OFFSET, sizeof(b));
	FUZZ_CHECK(h.magic == RH_CTL_MAGIC && h.layout_version == RH_CTL_LAYOUT_VERSION &&
		   h.table_size == RH_CTL_TABLE_SIZE && h.max_nics == RH_CTL_MAX_NICS &&
		   h.seq % 2 == 0 && h.seq == v->seq);
	FUZZ_CHECK(v->nic_count <= RH_CTL_MAX_NICS && v->nic_count == b.nic_count);
	FUZZ_CHECK(file_crc(f, v->nic_count) == b.crc32);
	for (uint32_t i = 0; i < v->nic_count; i++) {
		const struct rh_ctl_nic *nic = &v->nics[i];
		const struct rh_ctl_plan *plan = &v->plans[i];
		int at;

		FUZZ_CHECK(printable(nic->ifname, sizeof(nic->ifname), 0));
		FUZZ_CHECK(printable(nic->pci, sizeof(nic->pci), 1));
		FUZZ_CHECK(nic->state >= RH_NIC_UP && nic->state <= RH_NIC_RECOVERING);
		FUZZ_CHECK(plan->count <= RH_CTL_MAX_BACKUPS);
		for (uint32_t k = 0; k < plan->count; k++) {
			FUZZ_CHECK(plan->backups[k].local_nic < v->nic_count);
		}
		FUZZ_CHECK(v->layout_minor >= 1 || nic->rail_peers == 0);
		at = rh_ctl_view_find(v, nic->ifname);
		FUZZ_CHECK(at >= 0 && (uint32_t)at <= i);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct rh_ctl_view view;
	struct rh_ctl_opts opts = { 0 };
	struct rh_ctl *ctl;
	size_t len;
	uint8_t mode;
	int fd, rc;

	if (!run_dir[0]) {
		setup();
	}
	if (size < 1 || size - 1 > sizeof(file)) {
		return 0;
	}
	mode = data[0];
	len = size - 1;
	memcpy(file, data + 1, len);
	if ((mode & 2) && len < RH_CTL_TABLE_SIZE) {
		memset(file + len, 0, RH_CTL_TABLE_SIZE - len);
		len = RH_CTL_TABLE_SIZE;
	}
	if ((mode & 4) && len >= sizeof(struct rh_ctl_header)) {
		struct timespec ts;
		uint64_t now;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
		memcpy(file + offsetof(struct rh_ctl_header, heartbeat_ns), &now, sizeof(now));
	}
	if ((mode & 1) && len >= RH_CTL_TABLE_SIZE) {
		struct rh_ctl_body b;

		memcpy(&b, file + RH_CTL_BODY_OFFSET, sizeof(b));
		if (b.nic_count <= RH_CTL_MAX_NICS) {
			b.crc32 = file_crc(file, b.nic_count);
			memcpy(file + RH_CTL_BODY_OFFSET, &b.crc32, sizeof(b.crc32));
		}
	}
	/* a new file each time: the reader remembers a rejected one by inode and ctime */
	unlink(table_path);
	fd = open(table_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	FUZZ_CHECK(fd >= 0);
	FUZZ_CHECK(write(fd, file, len) == (ssize_t)len);
	close(fd);

	opts.poll_interval_ns = 1;
	FUZZ_CHECK(rh_ctl_open(run_dir, &opts, &ctl) == 0);
	memset(&view, 0, sizeof(view));
	rc = rh_ctl_snapshot(ctl, &view);
	FUZZ_CHECK(rc == 0 || rc == -ESTALE || rc == -EAGAIN || rc == -EPROTO);
	if (view.map_id != 0) {
		check_view(&view, file, len);
		/* unchanged: the cached path answers from the view */
		rc = rh_ctl_snapshot(ctl, &view);
		FUZZ_CHECK(rc == 0 || rc == -ESTALE);
		FUZZ_CHECK(view.changed == 0 && view.map_id != 0);
	} else {
		FUZZ_CHECK(rc != 0);
	}
	rh_ctl_close(ctl);
	return 0;
}
