/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plugin's whole lifecycle over a real RDMA lane, repeated in one process: dlopen, init
 * (v12), connect to a railhop-harness receiver on another host (its handle from
 * RDV/round-<r>/handle.0), send MSGS messages of SIZE bytes in the harness's contents
 * (msg_pattern.h: the receiver checks every byte), close, finalize, dlclose. After each round
 * the process is back where it started: no thread, no descriptor, and no RDMA object (queue
 * pair, completion queue, memory region, protection domain) of a user process more on this
 * host's RDMA devices than before the round (`rdma resource show`, iproute2); during the round
 * there were more, so the count sees the plugin's objects. Driven by tests/vm/
 * test_verbs_lifecycle.py in the VM lab (RAILHOP_TRANSPORT=verbs), where this process is the
 * only verbs user of its guest.
 *
 * usage: verbs_lifecycle PLUGIN.so RDV ROUNDS MSGS SIZE SEED
 * One line per round on stdout ("round R ok ..." or what differed); exit 0 when every round
 * was clean, 1 otherwise, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "live_threads.h"
#include "msg_pattern.h"
#include "nccl/net.h"

#define TAG 100 /* the harness receiver's tag (ungrouped) */
#define WAIT_S 180.0 /* for the receiver's handle, the connection, a message */

static const char *const RDMA_KINDS[] = { "qp", "cq", "mr", "pd" };
#define NKINDS (sizeof(RDMA_KINDS) / sizeof(RDMA_KINDS[0]))

static atomic_bool armed; /* the logger may be called */
static atomic_int late_calls;

static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		   const char *fmt, ...)
{
	va_list ap;

	(void)flags;
	if (!atomic_load(&armed)) {
		atomic_fetch_add(&late_calls, 1);
		fprintf(stderr, "logger called after finalize from %s:%d\n", file, line);
		return;
	}
	if (level > NCCL_LOG_INFO) {
		return;
	}
	va_start(ap, fmt);
	fprintf(stderr, "plugin: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Objects of kind on this host's RDMA devices that belong to a user process (their line names
 * a pid; the kernel's own name none); -1 when `rdma resource show` fails. With show, the lines
 * go to stderr. */
static int rdma_user_objects(const char *kind, bool show)
{
	char cmd[128], line[1024];
	int n = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "rdma resource show %s 2>&1", kind);
	p = popen(cmd, "r");
	if (!p) {
		return -1;
	}
	while (fgets(line, sizeof(line), p)) {
		if (strstr(line, " pid ")) {
			n++;
			if (show) {
				fprintf(stderr, "  %s", line);
			}
		}
	}
	return pclose(p) == 0 ? n : -1;
}

static void rdma_counts(int out[NKINDS], bool show)
{
	for (size_t i = 0; i < NKINDS; i++) {
		out[i] = rdma_user_objects(RDMA_KINDS[i], show);
	}
}

/* The receiver's handle, written by the harness (rename: whole or absent). */
static bool read_handle(const char *rdv, int round, char *handle)
{
	char path[4096];
	double end = now_s() + WAIT_S;

	snprintf(path, sizeof(path), "%s/round-%d/handle.0", rdv, round);
	while (now_s() < end) {
		FILE *f = fopen(path, "rb");

		if (f) {
			size_t got = fread(handle, 1, NCCL_NET_HANDLE_MAXSIZE, f);

			fclose(f);
			if (got == NCCL_NET_HANDLE_MAXSIZE) {
				return true;
			}
		}
		usleep(20000);
	}
	fprintf(stderr, "round %d: no handle at %s within %.0f s\n", round, path, WAIT_S);
	return false;
}

struct args {
	const char *plugin, *rdv;
	int rounds, msgs;
	size_t size;
	uint64_t seed;
};

/* Send the messages on sc, one at a time, each until it completes (bounded). */
static void send_all(const ncclNet_v12_t *t, void *sc, const struct args *a, char *buf,
		     int during[NKINDS])
{
	void *mh = NULL;

	EXPECT_EQ(t->regMr(sc, buf, a->size, NCCL_PTR_HOST, &mh), ncclSuccess);
	for (int k = 0; k < a->msgs && !test_failures; k++) {
		void *req = NULL;
		int done = 0;
		double end = now_s() + WAIT_S;

		rh_msg_fill(a->seed, buf, a->size, 0, k);
		while (!req && now_s() < end) {
			EXPECT_EQ(t->isend(sc, buf, a->size, TAG, mh, NULL, &req), ncclSuccess);
			if (!req) {
				usleep(100);
			}
		}
		EXPECT(req != NULL);
		while (req && !done && now_s() < end) {
			EXPECT_EQ(t->test(req, &done, NULL), ncclSuccess);
			if (!done) {
				usleep(100);
			}
		}
		EXPECT(done);
		if (k == 0) {
			rdma_counts(during, false); /* the lane's objects exist now */
		}
	}
	EXPECT_EQ(t->deregMr(sc, mh), ncclSuccess);
}

static void round_v12(void *lib, const struct args *a, int r, char *buf, int during[NKINDS])
{
	const ncclNet_v12_t *t = dlsym(lib, "ncclNetPlugin_v12");
	ncclNetCommConfig_v12_t cfg = { -1 };
	char handle[NCCL_NET_HANDLE_MAXSIZE] = { 0 };
	ncclNetDeviceHandle_v12_t *dh = NULL;
	void *ctx = NULL, *sc = NULL;
	double end;
	int ndev = 0;

	EXPECT(t != NULL);
	if (!t) {
		return;
	}
	EXPECT_EQ(t->init(&ctx, a->seed + (uint64_t)r, &cfg, logger, NULL), ncclSuccess);
	EXPECT_EQ(t->devices(&ndev), ncclSuccess);
	EXPECT(ndev >= 1);
	if (read_handle(a->rdv, r, handle)) {
		end = now_s() + WAIT_S;
		while (!sc && now_s() < end) {
			EXPECT_EQ(t->connect(ctx, 0, handle, &sc, &dh), ncclSuccess);
			if (!sc) {
				usleep(1000);
			}
		}
		EXPECT(sc != NULL);
	} else {
		test_failures++;
	}
	if (sc) {
		send_all(t, sc, a, buf, during);
		EXPECT_EQ(t->closeSend(sc), ncclSuccess);
	}
	EXPECT_EQ(t->finalize(ctx), ncclSuccess);
}

static void *nothing(void *arg)
{
	return arg;
}

int main(int argc, char **argv)
{
	struct args a;
	char *buf;
	pthread_t th;

	if (argc != 7) {
		fprintf(stderr, "usage: verbs_lifecycle PLUGIN.so RDV ROUNDS MSGS SIZE SEED\n");
		return 2;
	}
	a = (struct args){ .plugin = argv[1],
			   .rdv = argv[2],
			   .rounds = atoi(argv[3]),
			   .msgs = atoi(argv[4]),
			   .size = strtoull(argv[5], NULL, 0),
			   .seed = strtoull(argv[6], NULL, 0) };
	buf = a.size ? malloc(a.size) : NULL;
	if (a.rounds < 1 || a.msgs < 1 || !buf) {
		fprintf(stderr, "verbs_lifecycle: bad ROUNDS, MSGS or SIZE\n");
		return 2;
	}
	/* A sanitizer runtime may start a helper thread with the first thread: not ours. */
	pthread_create(&th, NULL, nothing, NULL);
	pthread_join(th, NULL);
	for (int r = 0; r < a.rounds; r++) {
		int threads0 = live_threads(), fds0 = open_fds(), threads, fds;
		int before[NKINDS], during[NKINDS] = { 0 }, after[NKINDS];
		int failures0 = test_failures;
		void *lib;

		rdma_counts(before, false);
		for (size_t i = 0; i < NKINDS; i++) {
			EXPECT(before[i] >= 0); /* `rdma resource show` works here */
		}
		lib = dlopen(a.plugin, RTLD_NOW | RTLD_LOCAL);
		EXPECT(lib != NULL);
		if (!lib) {
			fprintf(stderr, "%s\n", dlerror());
			break;
		}
		atomic_store(&armed, true);
		round_v12(lib, &a, r, buf, during);
		atomic_store(&armed, false); /* finalized: the host may release the logger */
		EXPECT_EQ(dlclose(lib), 0);
		threads = live_threads();
		fds = open_fds();
		rdma_counts(after, false);
		EXPECT_EQ(threads, threads0);
		EXPECT_EQ(fds, fds0);
		printf("round %d threads %d -> %d fds %d -> %d", r, threads0, threads, fds0, fds);
		for (size_t i = 0; i < NKINDS; i++) {
			printf(" %s %d/%d/%d", RDMA_KINDS[i], before[i], during[i], after[i]);
			EXPECT(during[i] > before[i]); /* the count sees the plugin's objects */
			EXPECT_EQ(after[i], before[i]);
		}
		printf(" %s\n", test_failures == failures0 ? "ok" : "FAILED");
		fflush(stdout);
		if (test_failures != failures0) {
			fprintf(stderr, "round %d: RDMA objects of user processes left:\n", r);
			for (size_t i = 0; i < NKINDS; i++) {
				rdma_user_objects(RDMA_KINDS[i], true);
			}
			break;
		}
	}
	EXPECT_EQ(atomic_load(&late_calls), 0);
	free(buf);
	TEST_DONE();
}
