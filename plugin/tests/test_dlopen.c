/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The built plugin exports exactly ncclNetPlugin_v8..v12 (nothing else with default
 * visibility), each named "railhop", and init/devices/getProperties work for every version.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "nccl/net.h"

static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		   const char *fmt, ...)
{
	(void)level;
	(void)flags;
	(void)file;
	(void)line;
	(void)fmt;
}

static void check_exports(const char *path)
{
	char cmd[4096], line[512];
	int n = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "nm -D --defined-only '%s'", path);
	p = popen(cmd, "r");
	EXPECT(p != NULL);
	if (!p) {
		return;
	}
	while (fgets(line, sizeof(line), p)) {
		char addr[64], type[8], name[256];

		if (sscanf(line, "%63s %7s %255s", addr, type, name) != 3 ||
		    strncmp(name, "__odr_asan", 10) == 0) {
			continue; /* AddressSanitizer's ODR indicators (sanitizer builds only) */
		}
		if (strncmp(name, "ncclNetPlugin_v", 15) == 0) {
			int v = atoi(name + 15);

			EXPECT(v >= 8 && v <= 12);
			EXPECT(strcmp(type, "R") == 0 || strcmp(type, "D") == 0);
			n++;
		} else {
			fprintf(stderr, "unexpected exported symbol: %s", line);
			test_failures++;
		}
	}
	EXPECT_EQ(pclose(p), 0);
	EXPECT_EQ(n, 5);
}

/*
 * Connect and accept alternately in one thread (as NCCL's GDR probe does: neither may block),
 * within one process, then a grouped receive of two tagged messages (one empty) and close with
 * a receive still in flight.
 */
static void same_process_roundtrip(const ncclNet_v12_t *t, void *ctx)
{
	char handle[NCCL_NET_HANDLE_MAXSIZE], a[4096], b[8] = { 0 }, ra[4096], rb[64], spare[16];
	void *lc = NULL, *sc = NULL, *rc = NULL, *mh = NULL, *rmh = NULL, *sreq[2] = { 0 };
	void *rreq = NULL, *r2 = NULL;
	void *data[2] = { ra, rb }, *mhs[2];
	size_t sizes[2] = { sizeof(ra), sizeof(rb) };
	int tags[2] = { 7, 9 }, done = 0, got[2] = { -1, -1 }, spins = 0;

	EXPECT_EQ(t->listen(ctx, 0, handle, &lc), ncclSuccess);
	while ((!sc || !rc) && spins++ < 200000) {
		if (!sc) {
			EXPECT_EQ(t->connect(ctx, 0, handle, &sc, NULL), ncclSuccess);
		}
		if (!rc) {
			EXPECT_EQ(t->accept(lc, &rc, NULL), ncclSuccess);
		}
		usleep(50);
	}
	EXPECT(sc && rc);
	if (!sc || !rc) {
		return;
	}
	EXPECT_EQ(t->regMr(sc, a, sizeof(a), NCCL_PTR_HOST, &mh), ncclSuccess);
	EXPECT_EQ(t->regMr(rc, ra, sizeof(ra), NCCL_PTR_HOST, &rmh), ncclSuccess);
	EXPECT(t->regMr(sc, a, sizeof(a), NCCL_PTR_CUDA, &mh) != ncclSuccess);
	mhs[0] = mhs[1] = rmh;
	for (size_t i = 0; i < sizeof(a); i++) {
		a[i] = (char)(i * 7 + 1);
	}
	/* nothing posted yet: the send must be deferred ("try later") */
	EXPECT_EQ(t->isend(sc, a, sizeof(a), 7, mh, NULL, &sreq[0]), ncclSuccess);
	EXPECT(sreq[0] == NULL);
	rreq = (void *)0x1; /* NCCL_NET_OPTIONAL_RECV_COMPLETION pre-set */
	EXPECT_EQ(t->irecv(rc, 2, data, sizes, tags, mhs, NULL, &rreq), ncclSuccess);
	EXPECT(rreq != NULL && rreq != (void *)0x1);
	/* the tag-9 (empty) message first: tags pick the slot, not the order */
	for (spins = 0; (!sreq[0] || !sreq[1]) && spins < 200000; spins++) {
		if (!sreq[1]) {
			EXPECT_EQ(t->isend(sc, b, 0, 9, mh, NULL, &sreq[1]), ncclSuccess);
		}
		if (sreq[1] && !sreq[0]) {
			EXPECT_EQ(t->isend(sc, a, sizeof(a), 7, mh, NULL, &sreq[0]), ncclSuccess);
		}
		usleep(50);
	}
	for (spins = 0; !done && spins < 400000; spins++) {
		EXPECT_EQ(t->test(rreq, &done, got), ncclSuccess);
		usleep(10);
	}
	EXPECT(done);
	EXPECT_EQ(got[0], sizeof(a));
	EXPECT_EQ(got[1], 0);
	EXPECT(memcmp(a, ra, sizeof(a)) == 0);
	for (int i = 0; i < 2; i++) {
		done = 0;
		for (spins = 0; sreq[i] && !done && spins < 400000; spins++) {
			EXPECT_EQ(t->test(sreq[i], &done, NULL), ncclSuccess);
			usleep(10);
		}
		EXPECT(done);
	}
	/* close with a receive in flight: must return promptly */
	{
		size_t one = sizeof(spare);
		void *d = spare;

		EXPECT_EQ(t->irecv(rc, 1, &d, &one, tags, mhs, NULL, &r2), ncclSuccess);
		EXPECT(r2 != NULL);
	}
	EXPECT_EQ(t->deregMr(sc, mh), ncclSuccess);
	EXPECT_EQ(t->deregMr(rc, rmh), ncclSuccess);
	EXPECT_EQ(t->closeSend(sc), ncclSuccess);
	EXPECT_EQ(t->closeRecv(rc), ncclSuccess);
	EXPECT_EQ(t->closeListen(lc), ncclSuccess);
}

int main(int argc, char **argv)
{
	void *lib;
	int ndev = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: test_dlopen PLUGIN.so\n");
		return 2;
	}
	check_exports(argv[1]);
	lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	EXPECT(lib != NULL);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		TEST_DONE();
	}
	/* Internal symbols are hidden. */
	EXPECT(dlsym(lib, "rh_init") == NULL);
	EXPECT(dlsym(lib, "tcp_lane_ops") == NULL);
	{
		const ncclNet_v8_t *t = dlsym(lib, "ncclNetPlugin_v8");
		ncclNetProperties_v8_t p;

		EXPECT(t && strcmp(t->name, "railhop") == 0);
		EXPECT_EQ(t->init(logger), ncclSuccess);
		EXPECT_EQ(t->devices(&ndev), ncclSuccess);
		EXPECT(ndev >= 1);
		EXPECT_EQ(t->getProperties(0, &p), ncclSuccess);
		EXPECT(strcmp(p.name, "lo") == 0);
		EXPECT_EQ(p.ptrSupport, NCCL_PTR_HOST);
		EXPECT_EQ(p.maxRecvs, 8);
		EXPECT_EQ(p.guid, 0);
		EXPECT(p.speed > 0);
		EXPECT(t->regMrDmaBuf == NULL);
		EXPECT(t->getProperties(ndev, &p) != ncclSuccess);
	}
	{
		const ncclNet_v9_t *t = dlsym(lib, "ncclNetPlugin_v9");
		ncclNetProperties_v9_t p;

		EXPECT(t && strcmp(t->name, "railhop") == 0);
		EXPECT_EQ(t->init(logger), ncclSuccess);
		EXPECT_EQ(t->getProperties(0, &p), ncclSuccess);
		EXPECT_EQ(p.vProps.ndevs, 1);
		EXPECT_EQ(p.vProps.devs[0], 0);
		EXPECT_EQ(p.maxP2pBytes, NCCL_MAX_NET_SIZE_V8); /* int sizes in test() */
		EXPECT(t->makeVDevice == NULL);
	}
	{
		const ncclNet_v10_t *t = dlsym(lib, "ncclNetPlugin_v10");
		ncclNetProperties_v10_t p;

		EXPECT(t && strcmp(t->name, "railhop") == 0);
		EXPECT_EQ(t->init(logger, NULL), ncclSuccess);
		EXPECT_EQ(t->getProperties(0, &p), ncclSuccess);
		EXPECT_EQ(p.netDeviceType, NCCL_NET_DEVICE_HOST);
	}
	{
		const ncclNet_v11_t *t = dlsym(lib, "ncclNetPlugin_v11");
		ncclNetProperties_v11_t p;
		ncclNetCommConfig_v11_t cfg = { -1 };
		void *ctx = NULL;

		EXPECT(t && strcmp(t->name, "railhop") == 0);
		EXPECT_EQ(t->init(&ctx, 7, &cfg, logger, NULL), ncclSuccess);
		EXPECT(ctx != NULL);
		EXPECT_EQ(t->getProperties(0, &p), ncclSuccess);
		EXPECT_EQ(p.maxMultiRequestSize, 1);
		EXPECT_EQ(t->setNetAttr(ctx, NULL), ncclSuccess);
		EXPECT_EQ(t->finalize(ctx), ncclSuccess);
	}
	{
		const ncclNet_v12_t *t = dlsym(lib, "ncclNetPlugin_v12");
		ncclNetProperties_v12_t p;
		ncclNetCommConfig_v12_t cfg = { -1 };
		void *ctx = NULL;
		char handle[NCCL_NET_HANDLE_MAXSIZE];
		void *lc = NULL, *rc = (void *)1;

		EXPECT(t && strcmp(t->name, "railhop") == 0);
		EXPECT_EQ(t->init(&ctx, 8, &cfg, logger, NULL), ncclSuccess);
		EXPECT_EQ(t->getProperties(0, &p), ncclSuccess);
		EXPECT_EQ(p.railId, 0);
		EXPECT_EQ(p.planeId, -1);
		/* listen + a non-blocking accept with nobody connecting */
		EXPECT_EQ(t->listen(ctx, 0, handle, &lc), ncclSuccess);
		EXPECT(lc != NULL);
		EXPECT_EQ(t->accept(lc, &rc, NULL), ncclSuccess);
		EXPECT(rc == NULL);
		EXPECT_EQ(t->closeListen(lc), ncclSuccess);
		same_process_roundtrip(t, ctx);
		EXPECT_EQ(t->finalize(ctx), ncclSuccess);
	}
	/* NCCL >= 2.28 dlcloses the plugin when the last communicator goes: state survives. */
	dlclose(lib);
	lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	EXPECT(lib != NULL);
	if (lib) {
		const ncclNet_v11_t *t = dlsym(lib, "ncclNetPlugin_v11");
		ncclNetCommConfig_v11_t cfg = { -1 };
		void *ctx = NULL;

		EXPECT_EQ(t->init(&ctx, 9, &cfg, logger, NULL), ncclSuccess);
		EXPECT_EQ(t->devices(&ndev), ncclSuccess);
		EXPECT(ndev >= 1);
		EXPECT_EQ(t->finalize(ctx), ncclSuccess);
	}
	TEST_DONE();
}
