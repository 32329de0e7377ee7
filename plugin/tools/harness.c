/* SPDX-License-Identifier: Apache-2.0 */
/*
 * railhop-harness: drives an ncclNet plugin the way NCCL's proxy thread does (one thread
 * progressing every connection, up to --inflight requests each, NULL request = try later,
 * *request sometimes pre-set to 0x1 before irecv) and checks every byte.
 * CLI: usage() below. Output: one JSON object per line on stdout, {"type":"progress",...}
 * every --interval-ms (bytes in total and per connection, messages) and a final
 * {"type":"summary",...} (bytes, elapsed_s, data_errors, request_errors, first_error, gbps);
 * the receiver writes the connection handles into the --rendezvous directory, the sender reads
 * them (handle.<i>). Exit status (summary()): 0 every byte checked and no request failed (with
 * --expect-error: a request failed with ncclRemoteError/ncclSystemError and no data error),
 * 1 otherwise, 2 bad usage or devices, 3 the --deadline passed, 4 (when it would be 0) a
 * plugin thread still ran or the plugin logged after the teardown (teardown()).
 * tests/privileged/test_datapath*.py and test_teardown.py drive it.
 *
 * --order nccl follows NCCL's net transport and proxy thread instead of the
 * harness's own order: the receiver closes each listen comm as soon as its accept returned a
 * comm (recvProxyConnect); every buffer slot is registered on its own (regMr per buffer); at
 * the end deregMr, then closeSend/closeRecv, then finalize (v11+), never closeListen again.
 * --exit-open ends like a torch process that never destroys its process group: the summary
 * is printed and the process exits with every comm, registration and the context still open
 * (the plugin's threads running); the exit status must still be the run's.
 * --share K makes K consecutive connections channels of one comm, as NCCL's shared comms are:
 * only the first connects/accepts (and closes), each channel registers its own buffers and posts
 * its own messages with its own tag (100 + index in the comm) on the shared comm, interleaved.
 * tests/privileged/test_nccl_order.py drives both.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "live_threads.h"
#include "msg_pattern.h"
#include "nccl/net.h"

#define MAX_CONNS 256
#define MAX_INFLIGHT 32
#define MAX_SIZES 64
#define MAX_GROUP 8
#define END_MAGIC 0x4b524d444e454852ull /* "RHENDMRK" */

enum role { ROLE_RECV, ROLE_SEND };

static struct {
	const char *plugin;
	enum role role;
	const char *dir;
	int conns;
	int devs[64];
	int ndevs;
	size_t sizes[MAX_SIZES];
	int nsizes;
	long count;
	double duration;
	const char *stop_file; /* sender, --duration: stop early once this path exists */
	int inflight;
	int grouped;
	int interval_ms;
	double deadline;
	bool expect_error;
	uint64_t seed;
	int api;
	bool verbose;
	bool nccl_order; /* --order nccl */
	bool exit_open; /* --exit-open */
	int share; /* --share K: channels per comm */
} opt = { .conns = 1,
	  .count = -1,
	  .duration = -1,
	  .inflight = 8,
	  .grouped = 1,
	  .interval_ms = 100,
	  .deadline = 120,
	  .seed = 1,
	  .api = 11,
	  .share = 1 };

/* One version-free view of the table. */
static struct {
	int v;
	const void *t;
	void *ctx;
} net;

static double t0;
static void *lib;
static volatile int finalized; /* the host's side: the logger is gone after finalize */
static volatile int late_logs;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* NCCL's subsystem names of a line's flags ("ALL" for WARN lines, which carry every bit). */
static const char *subsys_name(unsigned long flags, char *buf, size_t cap)
{
	static const struct {
		unsigned long bit;
		const char *name;
	} names[] = {
		{ NCCL_INIT, "INIT" },		 { NCCL_NET, "NET" }, { NCCL_ENV, "ENV" },
		{ NCCL_BOOTSTRAP, "BOOTSTRAP" }, { NCCL_P2P, "P2P" }, { NCCL_PROXY, "PROXY" }
	};
	size_t n = 0;

	if (flags == (unsigned long)NCCL_ALL) {
		return "ALL";
	}
	buf[0] = 0;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if ((flags & names[i].bit) && n + strlen(names[i].name) + 2 < cap) {
			n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? "|" : "",
					      names[i].name);
		}
	}
	return n ? buf : "?";
}

static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		   const char *fmt, ...)
{
	char sub[64];
	va_list ap;

	if (finalized) {
		late_logs++;
	}
	if (level > NCCL_LOG_WARN && !opt.verbose) {
		return;
	}
	/* The subsystems as NCCL_DEBUG_SUBSYS names them, so tests can check them. One line at a
	 * time: the plugin logs from several threads, and a test greps whole lines. */
	flockfile(stderr);
	fprintf(stderr, "[%8.3f] %s:%d [%s] ", now_s() - t0, file, line,
		subsys_name(flags, sub, sizeof(sub)));
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	funlockfile(stderr);
}

#define T(v) ((const ncclNet_v##v##_t *)net.t)
#define CALL(fn, ...)                           \
	(net.v == 8  ? T(8)->fn(__VA_ARGS__) :  \
	 net.v == 9  ? T(9)->fn(__VA_ARGS__) :  \
	 net.v == 10 ? T(10)->fn(__VA_ARGS__) : \
	 net.v == 11 ? T(11)->fn(__VA_ARGS__) : \
		       T(12)->fn(__VA_ARGS__))

static ncclResult_t n_init(void)
{
	ncclNetCommConfig_v11_t cfg = { .trafficClass = -1 };

	switch (net.v) {
	case 8:
		return T(8)->init(logger);
	case 9:
		return T(9)->init(logger);
	case 10:
		return T(10)->init(logger, NULL);
	case 11:
		return T(11)->init(&net.ctx, opt.seed, &cfg, logger, NULL);
	default:
		return T(12)->init(&net.ctx, opt.seed, &cfg, logger, NULL);
	}
}

static ncclResult_t n_listen(int dev, void *h, void **lc)
{
	if (net.v >= 11) {
		return net.v == 11 ? T(11)->listen(net.ctx, dev, h, lc) :
				     T(12)->listen(net.ctx, dev, h, lc);
	}
	return net.v == 8 ? T(8)->listen(dev, h, lc) :
	       net.v == 9 ? T(9)->listen(dev, h, lc) :
			    T(10)->listen(dev, h, lc);
}

static ncclResult_t n_connect(int dev, void *h, void **sc)
{
	ncclNetCommConfig_v10_t cfg = { .trafficClass = -1 };
	ncclNetDeviceHandle_v8_t *dh = NULL;

	switch (net.v) {
	case 8:
		return T(8)->connect(dev, h, sc, &dh);
	case 9:
		return T(9)->connect(dev, h, sc, &dh);
	case 10:
		return T(10)->connect(dev, &cfg, h, sc, &dh);
	case 11:
		return T(11)->connect(net.ctx, dev, h, sc, &dh);
	default:
		return T(12)->connect(net.ctx, dev, h, sc, &dh);
	}
}

static ncclResult_t n_isend(void *sc, void *data, size_t size, int tag, void *mh, void **req)
{
	switch (net.v) {
	case 8:
		return T(8)->isend(sc, data, (int)size, tag, mh, req);
	case 9:
		return T(9)->isend(sc, data, size, tag, mh, req);
	case 10:
		return T(10)->isend(sc, data, size, tag, mh, NULL, req);
	case 11:
		return T(11)->isend(sc, data, size, tag, mh, NULL, req);
	default:
		return T(12)->isend(sc, data, size, tag, mh, NULL, req);
	}
}

static ncclResult_t n_irecv(void *rc, int n, void **data, size_t *sizes, int *tags, void **mh,
			    void **req)
{
	int isz[MAX_GROUP];
	void *ph[MAX_GROUP] = { 0 };

	switch (net.v) {
	case 8:
		for (int i = 0; i < n; i++) {
			isz[i] = (int)sizes[i];
		}
		return T(8)->irecv(rc, n, data, isz, tags, mh, req);
	case 9:
		return T(9)->irecv(rc, n, data, sizes, tags, mh, req);
	case 10:
		return T(10)->irecv(rc, n, data, sizes, tags, mh, ph, req);
	case 11:
		return T(11)->irecv(rc, n, data, sizes, tags, mh, ph, req);
	default:
		return T(12)->irecv(rc, n, data, sizes, tags, mh, ph, req);
	}
}

/* Deterministic contents of message k of connection c (msg_pattern.h). */
static void fill(char *buf, size_t size, int c, long k)
{
	rh_msg_fill(opt.seed, buf, size, c, k);
}

static bool check(const char *buf, size_t size, int c, long k)
{
	return rh_msg_check(opt.seed, buf, size, c, k);
}

static bool is_end(const char *buf, size_t size)
{
	uint64_t v;

	if (size != 8) {
		return false;
	}
	memcpy(&v, buf, 8);
	return v == END_MAGIC;
}

struct slot {
	void *req;
	long k; /* first message of the request (group) */
	int n;
	bool end;
	char *buf[MAX_GROUP];
	void *mh[MAX_GROUP]; /* --order nccl: each buffer's own registration */
};

struct conn {
	void *comm;
	void *lc;
	int dev;
	void *mh;
	char *mem;
	size_t bufsz;
	struct slot s[MAX_INFLIGHT];
	int inflight;
	long next_k; /* next message to post */
	long done_msgs;
	unsigned long long bytes;
	bool finished; /* all messages moved (or end marker seen / sent) */
	long end_k; /* receiver, --duration: first message that was an end marker (-1) */
	bool end_posted;
	int nposts;
	uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
	bool connected;
};

static struct conn conns[MAX_CONNS];
static long data_errors, request_errors, total_msgs;
static int first_code = -1;
static double first_t;
static const char *first_where;
static double data_t0;
static int eff_inflight;

static void req_error(ncclResult_t r, const char *where)
{
	request_errors++;
	if (first_code < 0) {
		first_code = r;
		first_t = now_s() - t0;
		first_where = where;
		fprintf(stderr, "harness: %s failed with ncclResult %d at %.3f s\n", where, r,
			first_t);
	}
}

static size_t size_of(long k)
{
	return opt.sizes[k % opt.nsizes];
}

static unsigned long long total_bytes(void)
{
	unsigned long long b = 0;

	for (int i = 0; i < opt.conns; i++) {
		b += conns[i].bytes;
	}
	return b;
}

static void progress_line(void)
{
	printf("{\"type\":\"progress\",\"t\":%.3f,\"bytes\":%llu,\"per_conn\":[", now_s() - t0,
	       total_bytes());
	for (int i = 0; i < opt.conns; i++) {
		printf("%s%llu", i ? "," : "", conns[i].bytes);
	}
	printf("],\"msgs\":%ld}\n", total_msgs);
	fflush(stdout);
}

static int parse_list(const char *s, long long *out, int max)
{
	int n = 0;
	char *end;

	while (*s && n < max) {
		out[n++] = strtoll(s, &end, 0);
		if (end == s) {
			return -1;
		}
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',') {
			return -1;
		}
	}
	return n;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: railhop-harness --plugin PATH --role recv|send --rendezvous DIR [--conns N]\n"
		"  [--devs 0,1,..] [--sizes S[,S..]] [--count M | --duration SEC] [--inflight K]\n"
		"  [--grouped G] [--interval-ms MS] [--deadline SEC] [--expect-error] [--seed S]\n"
		"  [--api 8..12] [--stop-file PATH] [--order harness|nccl] [--exit-open] [--share K]\n"
		"  [--verbose]\n"
		"  (NCCL_DEBUG=INFO implies --verbose)\n");
	exit(2);
}

static void parse_args(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "plugin", 1, 0, 'p' },
		{ "role", 1, 0, 'r' },
		{ "rendezvous", 1, 0, 'd' },
		{ "conns", 1, 0, 'c' },
		{ "devs", 1, 0, 'D' },
		{ "sizes", 1, 0, 's' },
		{ "count", 1, 0, 'n' },
		{ "duration", 1, 0, 't' },
		{ "inflight", 1, 0, 'k' },
		{ "grouped", 1, 0, 'g' },
		{ "interval-ms", 1, 0, 'i' },
		{ "deadline", 1, 0, 'T' },
		{ "expect-error", 0, 0, 'e' },
		{ "seed", 1, 0, 'S' },
		{ "api", 1, 0, 'a' },
		{ "verbose", 0, 0, 'v' },
		{ "stop-file", 1, 0, 'F' },
		{ "order", 1, 0, 'o' },
		{ "exit-open", 0, 0, 'x' },
		{ "share", 1, 0, 'C' },
		{ 0, 0, 0, 0 },
	};
	long long tmp[MAX_SIZES];
	int c, n;

	opt.sizes[0] = 1 << 20;
	opt.nsizes = 1;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'p':
			opt.plugin = optarg;
			break;
		case 'r':
			if (!strcmp(optarg, "recv")) {
				opt.role = ROLE_RECV;
			} else if (!strcmp(optarg, "send")) {
				opt.role = ROLE_SEND;
			} else {
				usage();
			}
			break;
		case 'd':
			opt.dir = optarg;
			break;
		case 'c':
			opt.conns = atoi(optarg);
			break;
		case 'D':
			n = parse_list(optarg, tmp, 64);
			if (n <= 0) {
				usage();
			}
			for (int i = 0; i < n; i++) {
				opt.devs[i] = (int)tmp[i];
			}
			opt.ndevs = n;
			break;
		case 's':
			n = parse_list(optarg, tmp, MAX_SIZES);
			if (n <= 0) {
				usage();
			}
			for (int i = 0; i < n; i++) {
				if (tmp[i] < 0) {
					usage();
				}
				opt.sizes[i] = (size_t)tmp[i];
			}
			opt.nsizes = n;
			break;
		case 'n':
			opt.count = atol(optarg);
			break;
		case 't':
			opt.duration = atof(optarg);
			break;
		case 'F':
			opt.stop_file = optarg;
			break;
		case 'k':
			opt.inflight = atoi(optarg);
			break;
		case 'g':
			opt.grouped = atoi(optarg);
			break;
		case 'i':
			opt.interval_ms = atoi(optarg);
			break;
		case 'T':
			opt.deadline = atof(optarg);
			break;
		case 'e':
			opt.expect_error = true;
			break;
		case 'S':
			opt.seed = strtoull(optarg, NULL, 0);
			break;
		case 'a':
			opt.api = atoi(optarg);
			break;
		case 'v':
			opt.verbose = true;
			break;
		case 'o':
			if (!strcmp(optarg, "nccl")) {
				opt.nccl_order = true;
			} else if (strcmp(optarg, "harness")) {
				usage();
			}
			break;
		case 'x':
			opt.exit_open = true;
			break;
		case 'C':
			opt.share = atoi(optarg);
			break;
		default:
			usage();
		}
	}
	/* Like NCCL: NCCL_DEBUG=INFO (or TRACE) shows the plugin's INFO lines too. */
	if (getenv("NCCL_DEBUG") && (!strcasecmp(getenv("NCCL_DEBUG"), "INFO") ||
				     !strcasecmp(getenv("NCCL_DEBUG"), "TRACE"))) {
		opt.verbose = true;
	}
	if (!opt.plugin || !opt.dir || opt.conns < 1 || opt.conns > MAX_CONNS || opt.inflight < 1 ||
	    opt.inflight > MAX_INFLIGHT || opt.grouped < 1 || opt.grouped > MAX_GROUP ||
	    opt.api < 8 || opt.api > 12 || (opt.count < 0 && opt.duration < 0) ||
	    (opt.count >= 0 && opt.duration >= 0) || opt.interval_ms < 1) {
		usage();
	}
	/* A shared comm matches receives strictly in posting order: a --duration receiver posts
	 * past its end marker, and those receives would hold the other channels' sends forever. */
	if (opt.share < 1 || opt.share > MAX_GROUP || opt.conns % opt.share ||
	    (opt.share > 1 && (opt.grouped > 1 || opt.count < 0))) {
		fprintf(stderr, "--share: 1..%d, dividing --conns, with --grouped 1 and --count\n",
			MAX_GROUP);
		exit(2);
	}
	if (opt.stop_file && opt.duration < 0) {
		fprintf(stderr, "--stop-file needs --duration\n");
		exit(2);
	}
	if (opt.count >= 0 && opt.count % opt.grouped) {
		fprintf(stderr, "--count must be a multiple of --grouped\n");
		exit(2);
	}
}

static int summary(int rc_if_ok)
{
	double el = now_s() - (data_t0 ? data_t0 : t0);
	unsigned long long b = total_bytes();
	int rc;

	printf("{\"type\":\"summary\",\"role\":\"%s\",\"msgs\":%ld,\"bytes\":%llu,"
	       "\"elapsed_s\":%.3f,\"data_errors\":%ld,\"request_errors\":%ld,\"first_error\":",
	       opt.role == ROLE_SEND ? "send" : "recv", total_msgs, b, el, data_errors,
	       request_errors);
	if (first_code >= 0) {
		printf("{\"code\":%d,\"t\":%.3f,\"where\":\"%s\"}", first_code, first_t,
		       first_where);
	} else {
		printf("null");
	}
	printf(",\"gbps\":%.3f,\"inflight\":%d}\n", el > 0 ? b * 8.0 / el / 1e9 : 0.0,
	       eff_inflight);
	fflush(stdout);
	if (rc_if_ok == 3) {
		return 3;
	}
	if (opt.expect_error) {
		rc = (request_errors > 0 && data_errors == 0 &&
		      (first_code == ncclRemoteError || first_code == ncclSystemError)) ?
			     0 :
			     1;
	} else {
		rc = (data_errors == 0 && request_errors == 0) ? 0 : 1;
	}
	return rc;
}

/* The first channel of a comm owns it (--share). */
static bool owns_comm(int i)
{
	return i % opt.share == 0;
}

/* The tag of connection i's messages: a shared comm's channels differ by tag. */
static int tag_base(int i)
{
	return 100 + i % opt.share;
}

/* NCCL's destroy: every registration first, then the comms (a shared comm once), then any
 * listen comm still open (the harness's own order keeps them until here). */
static void close_all(void)
{
	for (int i = 0; i < opt.conns; i++) {
		struct conn *c = &conns[i];

		if (c->comm && c->mh) {
			CALL(deregMr, c->comm, c->mh);
		}
		for (int s = 0; c->comm && s < MAX_INFLIGHT; s++) {
			for (int g = 0; g < MAX_GROUP; g++) {
				if (c->s[s].mh[g]) {
					CALL(deregMr, c->comm, c->s[s].mh[g]);
				}
			}
		}
	}
	for (int i = 0; i < opt.conns; i++) {
		struct conn *c = &conns[i];

		if (c->comm && owns_comm(i)) {
			if (opt.role == ROLE_SEND) {
				CALL(closeSend, c->comm);
			} else {
				CALL(closeRecv, c->comm);
			}
		}
		if (c->lc) {
			CALL(closeListen, c->lc);
		}
	}
}

static int threads0; /* before the plugin was loaded */

static void *nothing(void *arg)
{
	return arg;
}

/* Tear down as NCCL 2.23+ does: deregister, close every comm and listener, finalize the
 * context, unload the plugin. By then the plugin must have stopped: a thread of it still
 * running would execute unmapped code, a log call would reach a logger the host released.
 * Exit status 4 when either happened (rc otherwise). */
static int teardown(int rc)
{
	int threads;

	close_all();
	if (net.v == 11) {
		T(11)->finalize(net.ctx);
	} else if (net.v == 12) {
		T(12)->finalize(net.ctx);
	}
	finalized = 1;
	dlclose(lib);
	threads = live_threads();
	if (threads != threads0 || late_logs) {
		fprintf(stderr,
			"harness: after finalize and dlclose: %d plugin thread(s) still running, "
			"%d log call(s)\n",
			threads - threads0, late_logs);
		return rc ? rc : 4;
	}
	return rc;
}

static int setup(double deadline)
{
	char path[4096], tmp[4200];

	for (int i = 0; i < opt.conns; i++) {
		conns[i].dev = opt.devs[(i / opt.share) % opt.ndevs];
		conns[i].end_k = -1;
	}
	if (opt.role == ROLE_RECV) {
		for (int i = 0; i < opt.conns; i += opt.share) {
			ncclResult_t r = n_listen(conns[i].dev, conns[i].handle, &conns[i].lc);
			FILE *f;

			if (r != ncclSuccess) {
				req_error(r, "accept");
				return -1;
			}
			snprintf(path, sizeof(path), "%s/handle.%d", opt.dir, i);
			snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
			f = fopen(tmp, "wb");
			if (!f || fwrite(conns[i].handle, 1, NCCL_NET_HANDLE_MAXSIZE, f) !=
					  NCCL_NET_HANDLE_MAXSIZE) {
				perror("write handle");
				return -1;
			}
			fclose(f);
			if (rename(tmp, path) < 0) {
				perror("rename handle");
				return -1;
			}
		}
	}
	for (;;) {
		int ready = 0;

		for (int i = 0; i < opt.conns; i++) {
			struct conn *c = &conns[i];
			ncclResult_t r;
			ncclNetDeviceHandle_v8_t *dh = NULL;

			if (c->comm) {
				ready++;
				continue;
			}
			if (!owns_comm(i)) {
				/* a channel of the comm its first channel (just before) holds */
				c->comm = conns[i - i % opt.share].comm;
				ready += c->comm != NULL;
				continue;
			}
			if (opt.role == ROLE_RECV) {
				r = CALL(accept, c->lc, &c->comm, &dh);
				if (r != ncclSuccess) {
					req_error(r, "accept");
					return -1;
				}
				if (c->comm && opt.nccl_order) {
					/* recvProxyConnect: the listen comm goes at once */
					r = CALL(closeListen, c->lc);
					c->lc = NULL;
					if (r != ncclSuccess) {
						req_error(r, "accept");
						return -1;
					}
				}
			} else {
				if (!c->connected) {
					FILE *f;

					snprintf(path, sizeof(path), "%s/handle.%d", opt.dir, i);
					f = fopen(path, "rb");
					if (!f) {
						continue;
					}
					if (fread(c->handle, 1, NCCL_NET_HANDLE_MAXSIZE, f) !=
					    NCCL_NET_HANDLE_MAXSIZE) {
						fclose(f);
						continue;
					}
					fclose(f);
					c->connected = true;
				}
				r = n_connect(c->dev, c->handle, &c->comm);
				if (r != ncclSuccess) {
					req_error(r, "connect");
					return -1;
				}
			}
		}
		if (ready == opt.conns) {
			return 0;
		}
		if (now_s() > deadline) {
			fprintf(stderr, "harness: deadline during connection setup (%d/%d)\n",
				ready, opt.conns);
			return -2;
		}
		usleep(1000);
	}
}

static int alloc_buffers(void)
{
	size_t maxsz = 8;
	double total;

	for (int i = 0; i < opt.nsizes; i++) {
		if (opt.sizes[i] > maxsz) {
			maxsz = opt.sizes[i];
		}
	}
	maxsz = (maxsz + 4095) & ~(size_t)4095;
	/* Bound memory: at most 4 GiB of buffers in all. */
	eff_inflight = opt.inflight;
	total = (double)maxsz * opt.grouped * opt.conns;
	while (eff_inflight > 1 && total * eff_inflight > 4.0 * (1 << 30)) {
		eff_inflight--;
	}
	if (eff_inflight != opt.inflight) {
		fprintf(stderr, "harness: --inflight reduced to %d to bound memory\n",
			eff_inflight);
	}
	for (int i = 0; i < opt.conns; i++) {
		struct conn *c = &conns[i];
		size_t len = maxsz * opt.grouped * eff_inflight;

		c->bufsz = maxsz;
		c->mem =
			mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (c->mem == MAP_FAILED) {
			perror("mmap");
			return -1;
		}
		if (!opt.nccl_order &&
		    CALL(regMr, c->comm, c->mem, len, NCCL_PTR_HOST, &c->mh) != ncclSuccess) {
			req_error(ncclInternalError, "isend");
			return -1;
		}
		for (int s = 0; s < eff_inflight; s++) {
			for (int g = 0; g < opt.grouped; g++) {
				c->s[s].buf[g] = c->mem + (size_t)(s * opt.grouped + g) * maxsz;
				if (opt.nccl_order &&
				    CALL(regMr, c->comm, c->s[s].buf[g], maxsz, NCCL_PTR_HOST,
					 &c->s[s].mh[g]) != ncclSuccess) {
					req_error(ncclInternalError, "isend");
					return -1;
				}
			}
		}
	}
	return 0;
}

/* Post at most one request on connection i. Returns 1 if posted, 0 if not, -1 on error. */
static int post(int i, bool stop_sending)
{
	struct conn *c = &conns[i];
	struct slot *sl = NULL;
	int G = opt.grouped;

	if (c->finished || c->end_posted || c->end_k >= 0 || c->inflight >= eff_inflight) {
		return 0;
	}
	if (opt.count >= 0 && c->next_k >= opt.count) {
		return 0;
	}
	for (int s = 0; s < eff_inflight; s++) {
		if (!c->s[s].req) {
			sl = &c->s[s];
			break;
		}
	}
	if (!sl) {
		return 0;
	}
	if (opt.role == ROLE_RECV) {
		size_t sizes[MAX_GROUP];
		int tags[MAX_GROUP];
		void *mh[MAX_GROUP];
		void *req = (c->nposts++ % 2 == 0 && G == 1) ? (void *)0x1 : (void *)0x2;
		ncclResult_t r;

		for (int g = 0; g < G; g++) {
			sizes[g] = c->bufsz;
			tags[g] = tag_base(i) + g;
			mh[g] = opt.nccl_order ? sl->mh[g] : c->mh;
		}
		r = n_irecv(c->comm, G, (void **)sl->buf, sizes, tags, mh, &req);
		if (r != ncclSuccess) {
			req_error(r, "irecv");
			return -1;
		}
		if (req == (void *)0x1 || req == (void *)0x2) {
			if (req == (void *)0x1) {
				fprintf(stderr, "harness: plugin left *request == 0x1\n");
				req_error(ncclInternalError, "irecv");
				return -1;
			}
			/* 0x2 left means the plugin did not write *request */
			fprintf(stderr, "harness: plugin did not write *request\n");
			req_error(ncclInternalError, "irecv");
			return -1;
		}
		if (!req) {
			return 0;
		}
		sl->req = req;
		sl->k = c->next_k;
		sl->n = G;
		c->next_k += G;
		c->inflight++;
		return 1;
	}
	/* sender: one request per message; a group is G isends with tags 100+g, posted in
	 * reverse slot order so the plugin's tag matching is exercised. */
	{
		long k = c->next_k;
		int g = (int)(k % G);
		int tag_slot = G - 1 - g;
		long msg = (k / G) * G + tag_slot;
		size_t sz = size_of(msg);
		void *req = NULL;
		ncclResult_t r;
		bool end = stop_sending;

		if (end) {
			sz = 8;
			memcpy(sl->buf[0], &(uint64_t){ END_MAGIC }, 8);
		} else {
			fill(sl->buf[0], sz, i, msg);
		}
		r = n_isend(c->comm, sl->buf[0], sz, tag_base(i) + tag_slot,
			    opt.nccl_order ? sl->mh[0] : c->mh, &req);
		if (r != ncclSuccess) {
			req_error(r, "isend");
			return -1;
		}
		if (!req) {
			return 0;
		}
		sl->req = req;
		sl->k = msg;
		sl->n = 1;
		sl->end = end;
		c->next_k++;
		c->inflight++;
		if (end && (c->next_k % G) == 0) {
			c->end_posted = true;
		}
		return 1;
	}
}

/* Returns the number of requests that completed, or -1 on a request error. */
static int test_all(int i)
{
	struct conn *c = &conns[i];
	int ndone = 0;

	for (int s = 0; s < eff_inflight; s++) {
		struct slot *sl = &c->s[s];
		int done = 0, sizes[MAX_GROUP];
		ncclResult_t r;

		if (!sl->req) {
			continue;
		}
		r = CALL(test, sl->req, &done, sizes);
		if (r != ncclSuccess) {
			req_error(r, "test");
			return -1;
		}
		if (!done) {
			continue;
		}
		sl->req = NULL;
		c->inflight--;
		ndone++;
		if (opt.role == ROLE_SEND) {
			if (!sl->end) {
				c->done_msgs++;
				total_msgs++;
				c->bytes += size_of(sl->k);
			}
			continue;
		}
		for (int g = 0; g < sl->n; g++) {
			long k = sl->k + g;
			size_t want = size_of(k);

			if (opt.duration >= 0 && is_end(sl->buf[g], (size_t)sizes[g])) {
				if (c->end_k < 0 || k < c->end_k) {
					c->end_k = k;
				}
				continue;
			}
			if ((size_t)sizes[g] != want || !check(sl->buf[g], want, i, k)) {
				if (data_errors++ < 5) {
					fprintf(stderr,
						"harness: data error conn %d msg %ld size %d "
						"(want %zu)\n",
						i, k, sizes[g], want);
				}
			}
			c->done_msgs++;
			total_msgs++;
			c->bytes += (size_t)sizes[g];
		}
	}
	if (opt.count >= 0 && c->done_msgs >= opt.count && c->inflight == 0) {
		c->finished = true;
	}
	/* Every message before the end marker arrived (receives complete out of order). */
	if (opt.role == ROLE_RECV && c->end_k >= 0 && c->done_msgs >= c->end_k) {
		c->finished = true;
	}
	if (opt.role == ROLE_SEND && c->end_posted && c->inflight == 0) {
		c->finished = true;
	}
	return ndone;
}

/* Like NCCL's proxy thread, the loop polls; after a run of idle rounds it gives the CPU up
 * for a moment so that on a small host the plugin's own threads (and the peer process) are
 * not starved by two spinning harnesses. */
#define IDLE_ROUNDS 64
#define IDLE_NAP_NS 50000

static void idle_nap(int *idle, bool worked)
{
	struct timespec ts = { 0, IDLE_NAP_NS };

	if (worked) {
		*idle = 0;
	} else if (++*idle >= IDLE_ROUNDS) {
		nanosleep(&ts, NULL);
	}
}

int main(int argc, char **argv)
{
	bool worked;
	char sym[32];
	double deadline, next_report, stop_at = 0;
	bool stop_asked = false;
	int ndev = 0, rc;

	t0 = now_s();
	setvbuf(stdout, NULL, _IOLBF, 0);
	parse_args(argc, argv);
	opt.verbose |= getenv("RAILHOP_HARNESS_VERBOSE") != NULL;
	deadline = t0 + opt.deadline;
	{
		/* a sanitizer runtime starts a helper thread with the first thread: not ours */
		pthread_t th;

		if (pthread_create(&th, NULL, nothing, NULL) == 0) {
			pthread_join(th, NULL);
		}
		threads0 = live_threads();
	}
	lib = dlopen(opt.plugin, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "harness: dlopen: %s\n", dlerror());
		return 2;
	}
	snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", opt.api);
	net.t = dlsym(lib, sym);
	net.v = opt.api;
	if (!net.t) {
		fprintf(stderr, "harness: %s not found\n", sym);
		return 2;
	}
	if (n_init() != ncclSuccess || CALL(devices, &ndev) != ncclSuccess || ndev <= 0) {
		fprintf(stderr, "harness: plugin init failed\n");
		return 2;
	}
	if (opt.ndevs == 0) {
		for (int i = 0; i < ndev && i < 64; i++) {
			opt.devs[i] = i;
		}
		opt.ndevs = ndev < 64 ? ndev : 64;
	}
	for (int i = 0; i < opt.ndevs; i++) {
		if (opt.devs[i] < 0 || opt.devs[i] >= ndev) {
			fprintf(stderr, "harness: device %d out of range (%d)\n", opt.devs[i],
				ndev);
			return 2;
		}
	}
	fprintf(stderr, "harness: %s %s api v%d, %d devices, %d conns\n", opt.plugin,
		opt.role == ROLE_SEND ? "send" : "recv", opt.api, ndev, opt.conns);
	rc = setup(deadline);
	if (rc < 0) {
		return teardown(summary(rc == -2 ? 3 : 1));
	}
	if (alloc_buffers() < 0) {
		return teardown(summary(1));
	}
	data_t0 = now_s();
	if (opt.duration >= 0) {
		stop_at = data_t0 + opt.duration;
	}
	next_report = now_s() + opt.interval_ms / 1000.0;
	for (int idle = 0;; idle_nap(&idle, worked)) {
		int finished = 0;
		double now = now_s();
		bool stop = opt.duration >= 0 && (now >= stop_at || stop_asked);

		worked = false;
		for (int i = 0; i < opt.conns; i++) {
			int guard = 0, n;

			/* A finished receiver's remaining receives lie past the end marker and never
			 * complete; once the peer has closed, testing them would only see it go. */
			if (conns[i].finished) {
				finished++;
				continue;
			}
			n = test_all(i);
			if (n < 0) {
				goto out;
			}
			worked |= n > 0;
			while (guard++ < eff_inflight) {
				int p = post(i, opt.role == ROLE_SEND && stop);

				if (p < 0) {
					goto out;
				}
				if (p == 0) {
					break;
				}
				worked = true;
			}
			finished += conns[i].finished;
		}
		if (finished == opt.conns) {
			break;
		}
		if (now >= next_report) {
			progress_line();
			next_report = now + opt.interval_ms / 1000.0;
			/* the caller's end of a --duration run: what it waited for has happened
			 * (bytes moved, a fail-back), however long that took on a loaded host */
			if (opt.stop_file && !stop_asked && access(opt.stop_file, F_OK) == 0) {
				stop_asked = true;
			}
		}
		if (now > deadline) {
			fprintf(stderr, "harness: deadline reached\n");
			progress_line();
			return teardown(summary(3));
		}
	}
out:
	progress_line();
	rc = summary(0);
	if (opt.exit_open) {
		/* torch: no destroy, no close, no finalize; exit() with the plugin running */
		fflush(NULL);
		exit(rc);
	}
	return teardown(rc);
}
