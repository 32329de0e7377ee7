/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plugin's lifecycle as NCCL 2.23+ drives it: dlopen, init, a loopback transfer (every
 * byte checked), close every comm and listener, finalize, dlclose; 20 times in one process.
 * Even rounds use the v12 table (init/finalize per context), odd rounds the v10 table (no
 * finalize: the last close stops the plugin). After each round the process is back where it
 * started: no thread and no descriptor left, and the logger the host passed is never called
 * once the plugin has been finalized (the host may release it then). The transport is the
 * environment's (RAILHOP_TRANSPORT=tcp|ofi|auto); ctest runs all three.
 *
 * usage: test_lifecycle PLUGIN.so [ROUNDS]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "live_threads.h"
#include "nccl/net.h"

#define MSG (1u << 20)

static atomic_bool armed; /* the host's logger is valid */
static atomic_int late_calls; /* logger calls while it was not */

static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		   const char *fmt, ...)
{
	(void)level;
	(void)flags;
	(void)fmt;
	if (!atomic_load(&armed)) {
		atomic_fetch_add(&late_calls, 1);
		fprintf(stderr, "logger called after finalize from %s:%d\n", file, line);
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The ops both tables share (v10 and v12 agree on these signatures). */
struct ops {
	ncclResult_t (*accept)(void *, void **, ncclNetDeviceHandle_v10_t **);
	ncclResult_t (*regMr)(void *, void *, size_t, int, void **);
	ncclResult_t (*deregMr)(void *, void *);
	ncclResult_t (*isend)(void *, void *, size_t, int, void *, void *, void **);
	ncclResult_t (*irecv)(void *, int, void **, size_t *, int *, void **, void **, void **);
	ncclResult_t (*test)(void *, int *, int *);
	ncclResult_t (*closeSend)(void *);
	ncclResult_t (*closeRecv)(void *);
	ncclResult_t (*closeListen)(void *);
};

struct pair {
	void *lc, *sc, *rc;
};

/* Send MSG bytes from sc to rc and check them. */
static void transfer(const struct ops *o, struct pair *p, char *src, char *dst)
{
	void *smh = NULL, *rmh = NULL, *sreq = NULL, *rreq = NULL, *data = dst;
	size_t size = MSG;
	int tag = 3, sdone = 0, rdone = 0, got = -1;
	double end = now_s() + 30;

	for (size_t i = 0; i < MSG; i++) {
		src[i] = (char)(i * 131 + 7);
	}
	memset(dst, 0, MSG);
	EXPECT_EQ(o->regMr(p->sc, src, MSG, NCCL_PTR_HOST, &smh), ncclSuccess);
	EXPECT_EQ(o->regMr(p->rc, dst, MSG, NCCL_PTR_HOST, &rmh), ncclSuccess);
	EXPECT_EQ(o->irecv(p->rc, 1, &data, &size, &tag, &rmh, NULL, &rreq), ncclSuccess);
	EXPECT(rreq != NULL);
	while (!sreq && now_s() < end) {
		EXPECT_EQ(o->isend(p->sc, src, MSG, tag, smh, NULL, &sreq), ncclSuccess);
	}
	EXPECT(sreq != NULL);
	while ((!sdone || !rdone) && sreq && rreq && now_s() < end) {
		if (!sdone) {
			EXPECT_EQ(o->test(sreq, &sdone, NULL), ncclSuccess);
		}
		if (!rdone) {
			EXPECT_EQ(o->test(rreq, &rdone, &got), ncclSuccess);
		}
		if (!sdone || !rdone) {
			usleep(20);
		}
	}
	EXPECT(sdone && rdone);
	EXPECT_EQ(got, MSG);
	EXPECT(memcmp(src, dst, MSG) == 0);
	EXPECT_EQ(o->deregMr(p->sc, smh), ncclSuccess);
	EXPECT_EQ(o->deregMr(p->rc, rmh), ncclSuccess);
}

static void close_pair(const struct ops *o, struct pair *p)
{
	if (p->sc) {
		EXPECT_EQ(o->closeSend(p->sc), ncclSuccess);
	}
	if (p->rc) {
		EXPECT_EQ(o->closeRecv(p->rc), ncclSuccess);
	}
	if (p->lc) {
		EXPECT_EQ(o->closeListen(p->lc), ncclSuccess);
	}
}

#define OPS_OF(t)                                                                    \
	{                                                                            \
		.accept = (t)->accept, .regMr = (t)->regMr, .deregMr = (t)->deregMr, \
		.isend = (t)->isend, .irecv = (t)->irecv, .test = (t)->test,         \
		.closeSend = (t)->closeSend, .closeRecv = (t)->closeRecv,            \
		.closeListen = (t)->closeListen,                                     \
	}

/* v12: a context per round, finalize at the end. */
static void round_v12(void *lib, char *src, char *dst)
{
	const ncclNet_v12_t *t = dlsym(lib, "ncclNetPlugin_v12");
	ncclNetCommConfig_v12_t cfg = { -1 };
	char handle[NCCL_NET_HANDLE_MAXSIZE] = { 0 };
	struct pair p = { 0 };
	void *ctx = NULL;
	double end = now_s() + 30;
	int ndev = 0;

	EXPECT(t != NULL);
	if (!t) {
		return;
	}
	struct ops o = OPS_OF(t);

	EXPECT_EQ(t->init(&ctx, 42, &cfg, logger, NULL), ncclSuccess);
	EXPECT_EQ(t->devices(&ndev), ncclSuccess);
	EXPECT(ndev >= 1);
	EXPECT_EQ(t->listen(ctx, 0, handle, &p.lc), ncclSuccess);
	while ((!p.sc || !p.rc) && now_s() < end) {
		if (!p.sc) {
			EXPECT_EQ(t->connect(ctx, 0, handle, &p.sc, NULL), ncclSuccess);
		}
		if (!p.rc) {
			EXPECT_EQ(t->accept(p.lc, &p.rc, NULL), ncclSuccess);
		}
	}
	EXPECT(p.sc && p.rc);
	if (p.sc && p.rc) {
		transfer(&o, &p, src, dst);
	}
	close_pair(&o, &p); /* as NCCL: every comm and listener, then finalize */
	EXPECT_EQ(t->finalize(ctx), ncclSuccess);
}

/* v10: one init, no finalize; closing the last comm and listener stops the plugin. */
static void round_v10(void *lib, char *src, char *dst)
{
	const ncclNet_v10_t *t = dlsym(lib, "ncclNetPlugin_v10");
	ncclNetCommConfig_v10_t cfg = { -1 };
	char handle[NCCL_NET_HANDLE_MAXSIZE] = { 0 };
	struct pair p = { 0 };
	double end = now_s() + 30;
	int ndev = 0;

	EXPECT(t != NULL);
	if (!t) {
		return;
	}
	struct ops o = OPS_OF(t);

	EXPECT_EQ(t->init(logger, NULL), ncclSuccess);
	EXPECT_EQ(t->devices(&ndev), ncclSuccess);
	EXPECT(ndev >= 1);
	EXPECT_EQ(t->listen(0, handle, &p.lc), ncclSuccess);
	while ((!p.sc || !p.rc) && now_s() < end) {
		if (!p.sc) {
			EXPECT_EQ(t->connect(0, &cfg, handle, &p.sc, NULL), ncclSuccess);
		}
		if (!p.rc) {
			EXPECT_EQ(t->accept(p.lc, &p.rc, NULL), ncclSuccess);
		}
	}
	EXPECT(p.sc && p.rc);
	if (p.sc && p.rc) {
		transfer(&o, &p, src, dst);
	}
	close_pair(&o, &p);
}

static void *nothing(void *arg)
{
	return arg;
}

int main(int argc, char **argv)
{
	int rounds = argc > 2 ? atoi(argv[2]) : 20;
	char *src = malloc(MSG), *dst = malloc(MSG);
	pthread_t th;

	if (argc < 2 || rounds < 1 || !src || !dst) {
		fprintf(stderr, "usage: test_lifecycle PLUGIN.so [ROUNDS]\n");
		return 2;
	}
	/* A sanitizer runtime may start a helper thread with the first thread: not ours. */
	pthread_create(&th, NULL, nothing, NULL);
	pthread_join(th, NULL);
	for (int r = 0; r < rounds; r++) {
		int threads0 = live_threads(), fds0 = open_fds();
		void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
		int threads, fds;

		EXPECT(lib != NULL);
		if (!lib) {
			fprintf(stderr, "%s\n", dlerror());
			break;
		}
		atomic_store(&armed, true);
		if (r % 2 == 0) {
			round_v12(lib, src, dst);
		} else {
			round_v10(lib, src, dst);
		}
		/* Stopped: the host may release the logger now, and unload the library. */
		atomic_store(&armed, false);
		threads = live_threads();
		fds = open_fds();
		if (threads != threads0 || fds != fds0) {
			fprintf(stderr, "round %d (%s): threads %d -> %d, descriptors %d -> %d\n",
				r, r % 2 ? "v10" : "v12", threads0, threads, fds0, fds);
		}
		EXPECT_EQ(threads, threads0);
		EXPECT_EQ(fds, fds0);
		EXPECT_EQ(dlclose(lib), 0);
		EXPECT_EQ(live_threads(), threads0);
		EXPECT_EQ(open_fds(), fds0);
		if (test_failures) {
			fprintf(stderr, "round %d failed\n", r);
			break;
		}
	}
	EXPECT_EQ(atomic_load(&late_calls), 0);
	free(src);
	free(dst);
	TEST_DONE();
}
