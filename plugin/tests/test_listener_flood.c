/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A flood of idle connections against a lane listener in a process short of descriptors
 * (RLIMIT_NOFILE 128): a child process keeps 300 connections to the listener open, sending
 * nothing, and opens a new one for each the plugin closes. Meanwhile a live connection of the
 * same process moves checked 1 MiB messages. Asserts: the process uses little CPU (the
 * listener must not spin on EMFILE), every message arrives intact and in time (the live
 * connection never fails), the plugin closes the idle connections (handshake deadline) and a
 * new connection can still be made through the listener once the flood stops.
 *
 * usage: test_listener_flood PLUGIN.so  (RAILHOP_NICS=lo RAILHOP_TRANSPORT=tcp)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "nccl/net.h"

#define FLOOD 300
#define MSG (1u << 20)
#define WINDOW_S 3.0

/* RAILHOP_TEST_VERBOSE=1: the plugin's warnings on stderr. */
static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		   const char *fmt, ...)
{
	va_list ap;

	(void)flags;
	if (level > NCCL_LOG_WARN || !getenv("RAILHOP_TEST_VERBOSE")) {
		return;
	}
	fprintf(stderr, "%s:%d ", file, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static int dial(uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = port };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 &&
	    errno != EINPROGRESS) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* The child: FLOOD idle connections, each one the plugin closes replaced, until stop_fd is
 * readable; writes 'r' to event_fd once all FLOOD are dialed and 'c' once the plugin has closed
 * FLOOD / 3 of them, and at the end how many the plugin closed to report_fd. */
static void flood(uint16_t port, int stop_fd, int event_fd, int report_fd)
{
	struct pollfd p[FLOOD + 1];
	long closed = 0;
	int told = 0;

	for (int i = 0; i < FLOOD; i++) {
		p[i].fd = dial(port);
		p[i].events = POLLIN | POLLRDHUP;
		if (p[i].fd < 0 && getenv("RAILHOP_TEST_VERBOSE")) {
			fprintf(stderr, "flood: connection %d: %s\n", i, strerror(errno));
		}
	}
	p[FLOOD].fd = stop_fd;
	p[FLOOD].events = POLLIN;
	if (write(event_fd, "r", 1) != 1) {
		_exit(1);
	}
	for (;;) {
		if (poll(p, FLOOD + 1, 1000) < 0 && errno != EINTR) {
			break;
		}
		if (p[FLOOD].revents) {
			break;
		}
		for (int i = 0; i < FLOOD; i++) {
			char b;

			if (p[i].fd >= 0 && !p[i].revents) {
				continue;
			}
			if (p[i].fd >= 0 && recv(p[i].fd, &b, 1, MSG_DONTWAIT) > 0) {
				continue; /* the plugin never answers an idle connection */
			}
			if (p[i].fd >= 0) {
				close(p[i].fd);
				closed++;
			}
			p[i].fd = dial(port);
		}
		if (!told && closed >= FLOOD / 3) {
			told = write(event_fd, "c", 1) == 1;
		}
	}
	if (write(report_fd, &closed, sizeof(closed)) != sizeof(closed)) {
		_exit(1);
	}
	_exit(0);
}

struct pair {
	void *lc, *sc, *rc;
};

static int one_message(const ncclNet_v12_t *t, struct pair *p, char *src, char *dst, int k);

/* Waits (at most secs) for the byte want on fd; 0 when it came. */
static int wait_event(int fd, char want, double secs)
{
	double end = now_s() + secs;
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char b;

	while (now_s() < end) {
		int n = poll(&p, 1, (int)((end - now_s()) * 1000) + 1);

		if (n < 0 && errno != EINTR) {
			return -1;
		}
		if (n > 0) {
			if (read(fd, &b, 1) != 1) {
				return -1; /* the child is gone */
			}
			if (b == want) {
				return 0;
			}
		}
	}
	return -1;
}

/* WINDOW_S seconds of one checked message every 100 ms; returns the CPU used per second. */
static double window(const ncclNet_v12_t *t, struct pair *p, char *src, char *dst, int *msgs,
		     int *bad)
{
	double cpu0 = cpu_s(), t0 = now_s();

	while (now_s() - t0 < WINDOW_S) {
		*bad += one_message(t, p, src, dst, *msgs) != 0;
		(*msgs)++;
		usleep(100 * 1000);
	}
	return (cpu_s() - cpu0) / (now_s() - t0);
}

static int make_pair(const ncclNet_v12_t *t, void *ctx, struct pair *p, double secs)
{
	char handle[NCCL_NET_HANDLE_MAXSIZE] = { 0 };
	double end = now_s() + secs;

	memset(p, 0, sizeof(*p));
	if (t->listen(ctx, 0, handle, &p->lc) != ncclSuccess) {
		return -1;
	}
	while ((!p->sc || !p->rc) && now_s() < end) {
		if (!p->sc && t->connect(ctx, 0, handle, &p->sc, NULL) != ncclSuccess) {
			return -1;
		}
		if (!p->rc && t->accept(p->lc, &p->rc, NULL) != ncclSuccess) {
			return -1;
		}
		usleep(100);
	}
	return p->sc && p->rc ? 0 : -1;
}

static void close_pair(const ncclNet_v12_t *t, struct pair *p)
{
	if (p->sc) {
		EXPECT_EQ(t->closeSend(p->sc), ncclSuccess);
	}
	if (p->rc) {
		EXPECT_EQ(t->closeRecv(p->rc), ncclSuccess);
	}
	if (p->lc) {
		EXPECT_EQ(t->closeListen(p->lc), ncclSuccess);
	}
}

/* One checked message over the pair; 0 when it arrived intact within 5 s. */
static int one_message(const ncclNet_v12_t *t, struct pair *p, char *src, char *dst, int k)
{
	void *smh = NULL, *rmh = NULL, *sreq = NULL, *rreq = NULL, *data = dst;
	size_t size = MSG;
	int tag = 1, sdone = 0, rdone = 0, got = -1, rc = 0;
	double end = now_s() + 5;

	for (size_t i = 0; i < MSG; i++) {
		src[i] = (char)(i * 31 + (size_t)k);
	}
	memset(dst, 0, MSG);
	if (t->regMr(p->sc, src, MSG, NCCL_PTR_HOST, &smh) != ncclSuccess ||
	    t->regMr(p->rc, dst, MSG, NCCL_PTR_HOST, &rmh) != ncclSuccess ||
	    t->irecv(p->rc, 1, &data, &size, &tag, &rmh, NULL, &rreq) != ncclSuccess) {
		return -1;
	}
	while (!sreq && now_s() < end) {
		if (t->isend(p->sc, src, MSG, tag, smh, NULL, &sreq) != ncclSuccess) {
			return -1;
		}
	}
	while (sreq && (!sdone || !rdone) && now_s() < end) {
		if ((!sdone && t->test(sreq, &sdone, NULL) != ncclSuccess) ||
		    (!rdone && t->test(rreq, &rdone, &got) != ncclSuccess)) {
			rc = -1;
			break;
		}
		usleep(50);
	}
	if (rc == 0 && (!sdone || !rdone || got != (int)MSG || memcmp(src, dst, MSG) != 0)) {
		rc = -1;
	}
	t->deregMr(p->sc, smh);
	t->deregMr(p->rc, rmh);
	return rc;
}

int main(int argc, char **argv)
{
	struct rlimit rl = { 128, 128 };
	char *src = malloc(MSG), *dst = malloc(MSG);
	const ncclNet_v12_t *t;
	ncclNetCommConfig_v12_t cfg = { -1 };
	struct pair live, late;
	int go[2], stop[2], event[2], report[2], msgs = 0, bad = 0, reached;
	double base, flooded, t_flood, t_closed = -1;
	long closed = -1;
	uint16_t port;
	void *lib, *ctx = NULL;
	pid_t child;
	int status;

	if (argc != 2 || !src || !dst) {
		fprintf(stderr, "usage: test_listener_flood PLUGIN.so\n");
		return 2;
	}
	/* The flooding child first, with the descriptor limit the test started with; it waits
	 * for the listener's port. */
	if (pipe(go) < 0 || pipe(stop) < 0 || pipe(event) < 0 || pipe(report) < 0) {
		return 1;
	}
	child = fork();
	if (child == 0) {
		struct rlimit mine;

		if (getrlimit(RLIMIT_NOFILE, &mine) == 0 && mine.rlim_cur < mine.rlim_max) {
			mine.rlim_cur = mine.rlim_max; /* room for FLOOD sockets */
			setrlimit(RLIMIT_NOFILE, &mine);
		}
		close(go[1]);
		close(stop[1]);
		close(event[0]);
		close(report[0]);
		if (read(go[0], &port, sizeof(port)) != sizeof(port)) {
			_exit(1);
		}
		flood(port, stop[0], event[1], report[1]);
	}
	close(go[0]);
	close(stop[0]);
	close(event[1]);
	close(report[1]);
	lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	t = lib ? dlsym(lib, "ncclNetPlugin_v12") : NULL;
	if (!t) {
		fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
		return 1;
	}
	EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
	EXPECT_EQ(t->init(&ctx, 1, &cfg, logger, NULL), ncclSuccess);
	EXPECT_EQ(make_pair(t, ctx, &live, 10), 0);
	if (test_failures) {
		TEST_DONE();
	}
	/* The lane listener's port: this process's TCP socket listening on 127.0.0.1. */
	{
		FILE *f = fopen("/proc/net/tcp", "r");
		char line[512];

		port = 0;
		while (f && fgets(line, sizeof(line), f) && !port) {
			unsigned la, lp, st;
			unsigned long inode;
			char target[64];

			if (sscanf(line, " %*d: %x:%x %*x:%*x %x %*s %*s %*s %*s %*s %lu", &la, &lp,
				   &st, &inode) != 4 ||
			    st != 0x0A || la != htonl(INADDR_LOOPBACK)) {
				continue;
			}
			snprintf(target, sizeof(target), "socket:[%lu]", inode);
			for (int fd = 0; fd < 128 && !port; fd++) {
				char fdpath[64], path[64];
				ssize_t n;

				snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", fd);
				n = readlink(fdpath, path, sizeof(path) - 1);
				if (n > 0) {
					path[n] = 0;
					port = strcmp(path, target) ? 0 : htons((uint16_t)lp);
				}
			}
		}
		if (f) {
			fclose(f);
		}
		EXPECT(port != 0);
	}
	/* The same traffic without, then with the flood: what the flood costs in CPU. */
	base = window(t, &live, src, dst, &msgs, &bad);
	if (write(go[1], &port, sizeof(port)) != sizeof(port)) {
		return 1;
	}
	close(go[1]);
	/* the flood is under way: all its connections dialed (they need no answer) */
	EXPECT_EQ(wait_event(event[0], 'r', 10), 0);
	t_flood = now_s();
	flooded = window(t, &live, src, dst, &msgs, &bad);
	/* The plugin closes idle connections at their handshake deadline (1 s): a third of the
	 * flood closed, waited for with an upper bound (it usually came during the window). */
	reached = wait_event(event[0], 'c', 10) == 0;
	if (reached) {
		t_closed = now_s() - t_flood;
	}
	close(stop[1]);
	if (read(report[0], &closed, sizeof(closed)) != sizeof(closed)) {
		closed = -1;
	}
	waitpid(child, &status, 0);
	fprintf(stderr,
		"flood: %d idle connections kept up, %ld closed by the plugin (a third seen %.2f s after "
		"the flood began); %d messages (%d bad); CPU %.3f of a core without the flood, "
		"%.3f with it\n",
		FLOOD, closed, t_closed, msgs, bad, base, flooded);
	EXPECT_EQ(bad, 0);
	EXPECT(msgs >= 20);
	/* A listener spinning on EMFILE takes all the CPU it can get (on a busy two-core machine
	 * that was still 0.25 of a core); accepting and dropping a few hundred idle connections a
	 * second costs a few hundredths. */
	EXPECT(flooded - base < 0.10);
	/* The idle connections were closed by the handshake deadline (1 s). */
	EXPECT(reached);
	EXPECT(closed >= FLOOD / 3);
	/* Once the flood is gone, the listener accepts again. */
	EXPECT_EQ(make_pair(t, ctx, &late, 10), 0);
	if (!test_failures) {
		EXPECT_EQ(one_message(t, &late, src, dst, 1), 0);
	}
	close_pair(t, &late);
	close_pair(t, &live);
	EXPECT_EQ(t->finalize(ctx), ncclSuccess);
	free(src);
	free(dst);
	TEST_DONE();
}
