/* SPDX-License-Identifier: Apache-2.0 */
/* The TCP loss verdict (pure) and tcp_info of a socket found by its 4-tuple (sock_diag): a
 * loopback connection is looked up and compared with its own TCP_INFO. */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "lanes/tcp.h"
#include "lanes/tcpstate.h"

static void test_verdict(void)
{
	struct tcp_info ti;

	memset(&ti, 0, sizeof(ti));
	ti.tcpi_ca_state = TCP_CA_Loss;
	ti.tcpi_unacked = 3;
	ti.tcpi_rtt = 5000; /* 5 ms: the 20 ms floor applies */
	EXPECT(!tcp_info_lost(&ti, 19));
	EXPECT(tcp_info_lost(&ti, 20));
	ti.tcpi_rtt = 40000; /* 40 ms: two RTTs */
	EXPECT(!tcp_info_lost(&ti, 79));
	EXPECT(tcp_info_lost(&ti, 80));
	ti.tcpi_unacked = 0; /* nothing outstanding: not lost */
	EXPECT(!tcp_info_lost(&ti, 1000));
	ti.tcpi_unacked = 3;
	ti.tcpi_ca_state = TCP_CA_Recovery; /* fast recovery: the path answers */
	EXPECT(!tcp_info_lost(&ti, 1000));
}

static void test_lookup(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sockaddr_in la, ra;
	socklen_t len = sizeof(a);
	struct tcp_info own, found;
	int l, c, s;

	l = socket(AF_INET, SOCK_STREAM, 0);
	c = socket(AF_INET, SOCK_STREAM, 0);
	EXPECT(l >= 0 && c >= 0);
	EXPECT_EQ(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
	EXPECT_EQ(listen(l, 1), 0);
	EXPECT_EQ(getsockname(l, (struct sockaddr *)&a, &len), 0);
	EXPECT_EQ(connect(c, (struct sockaddr *)&a, sizeof(a)), 0);
	s = accept(l, NULL, NULL);
	EXPECT(s >= 0);
	len = sizeof(la);
	EXPECT_EQ(getsockname(c, (struct sockaddr *)&la, &len), 0);
	len = sizeof(ra);
	EXPECT_EQ(getpeername(c, (struct sockaddr *)&ra, &len), 0);
	len = sizeof(own);
	EXPECT_EQ(getsockopt(c, IPPROTO_TCP, TCP_INFO, &own, &len), 0);
	EXPECT_EQ(tcp_info_by_addr(la.sin_addr.s_addr, ntohs(la.sin_port), ra.sin_addr.s_addr,
				   ntohs(ra.sin_port), &found),
		  0);
	EXPECT_EQ(found.tcpi_state, own.tcpi_state);
	EXPECT_EQ(found.tcpi_snd_mss, own.tcpi_snd_mss);
	EXPECT_EQ(found.tcpi_ca_state, TCP_CA_Open);
	/* no socket with that 4-tuple (the peer port of another connection) */
	EXPECT_EQ(tcp_info_by_addr(la.sin_addr.s_addr, ntohs(la.sin_port), ra.sin_addr.s_addr,
				   (uint16_t)(ntohs(ra.sin_port) + 1), &found),
		  -ENOENT);
	close(s);
	close(c);
	close(l);
}

/* Issue 29, 6: two addresses x 128 pending handshakes filled the listener, and one more
 * evicted the oldest pending handshake whoever's it was: a legitimate peer's lane. Now the
 * source holding the most loses its oldest. */
static void test_eviction_is_fair_per_source(void)
{
	uint32_t src[TCP_HS_MAX];
	const uint32_t peer = 7, a = 100, b = 200;
	int n = 0, v;

	src[n++] = peer; /* the peer's handshake is the oldest */
	for (int i = 0; i < TCP_HS_MAX_SOURCE; i++) {
		src[n++] = a;
	}
	for (; n < TCP_HS_MAX; n++) {
		src[n] = b;
	}
	EXPECT_EQ(tcp_pending_victim(src, n, b), 1); /* a and b tie at 128: the older source */
	v = tcp_pending_victim(src, n, a); /* a is at its cap: its own oldest */
	EXPECT_EQ(v, 1);
	v = tcp_pending_victim(src, n, 9); /* a stranger: the biggest source's oldest */
	EXPECT_EQ(src[v], a);
	EXPECT(src[v] != peer);
	v = tcp_pending_victim(src, n, peer); /* the peer's new stream: not its own old one */
	EXPECT(v >= 0 && src[v] != peer);
	EXPECT_EQ(tcp_pending_victim(src, 3, 9), -1); /* room */
}

int main(void)
{
	test_verdict();
	test_lookup();
	test_eviction_is_fair_per_source();
	TEST_DONE();
}
