/* SPDX-License-Identifier: Apache-2.0 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/tcp.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "tcpstate.h"

bool tcp_info_lost(const struct tcp_info *ti, uint64_t quiet_ms)
{
	uint64_t need_ms = 2 * (uint64_t)ti->tcpi_rtt / 1000;

	if (need_ms < 20) {
		need_ms = 20;
	}
	return ti->tcpi_ca_state == TCP_CA_Loss && ti->tcpi_unacked > 0 && quiet_ms >= need_ms;
}

/* Find INET_DIAG_INFO among the attributes after the inet_diag_msg of one answer. */
static int parse_answer(const struct nlmsghdr *nh, size_t len, struct tcp_info *out)
{
	const struct inet_diag_msg *m;
	const struct rtattr *a;
	/* signed, as the rtattr macros expect: RTA_NEXT subtracts the aligned length, up to 3
	 * bytes more than RTA_OK checked, and an unsigned count wrapped around and let the loop
	 * read past the message (found by plugin/fuzz/fuzz_tcpstate.c); the answer is at most
	 * the caller's 8 KiB */
	int left;

	if (!NLMSG_OK(nh, len)) {
		return -EPROTO;
	}
	if (nh->nlmsg_type == NLMSG_ERROR) {
		const struct nlmsgerr *e = NLMSG_DATA(nh);

		if (nh->nlmsg_len < NLMSG_LENGTH(sizeof(*e))) {
			return -EPROTO;
		}
		/* only a negative errno is an error: a positive one (no kernel sends it) returned
		 * as is would read as success to callers that test < 0, with *out never filled
		 * (found by plugin/fuzz/fuzz_tcpstate.c) */
		if (e->error > 0) {
			return -EPROTO;
		}
		return e->error ? e->error : -ENOENT;
	}
	if (nh->nlmsg_type != SOCK_DIAG_BY_FAMILY || nh->nlmsg_len < NLMSG_LENGTH(sizeof(*m))) {
		return -EPROTO;
	}
	m = NLMSG_DATA(nh);
	a = (const struct rtattr *)(m + 1);
	left = (int)(nh->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));
	for (; RTA_OK(a, left); a = RTA_NEXT(a, left)) {
		if (a->rta_type == INET_DIAG_INFO) {
			size_t n = RTA_PAYLOAD(a);

			memset(out, 0, sizeof(*out));
			memcpy(out, RTA_DATA(a), n < sizeof(*out) ? n : sizeof(*out));
			return 0;
		}
	}
	return -ENOENT;
}

int tcp_info_by_addr(uint32_t lip, uint16_t lport, uint32_t rip, uint16_t rport,
		     struct tcp_info *out)
{
	struct {
		struct nlmsghdr nh;
		struct inet_diag_req_v2 r;
	} req;
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	struct timeval tv = { 0, 100 * 1000 };
	union {
		struct nlmsghdr nh;
		char b[8192];
	} ans;
	ssize_t n;
	int fd, rc;

	memset(&req, 0, sizeof(req));
	req.nh.nlmsg_len = sizeof(req);
	req.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	req.nh.nlmsg_flags = NLM_F_REQUEST; /* an exact lookup, not a dump */
	req.r.sdiag_family = AF_INET;
	req.r.sdiag_protocol = IPPROTO_TCP;
	req.r.idiag_ext = 1u << (INET_DIAG_INFO - 1);
	req.r.idiag_states = ~0u;
	req.r.id.idiag_sport = htons(lport);
	req.r.id.idiag_dport = htons(rport);
	req.r.id.idiag_src[0] = lip;
	req.r.id.idiag_dst[0] = rip;
	req.r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
	req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
	fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (fd < 0) {
		return -errno;
	}
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    sendto(fd, &req, sizeof(req), 0, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	n = recv(fd, &ans, sizeof(ans), 0);
	rc = n < 0 ? -errno : parse_answer(&ans.nh, (size_t)n, out);
	close(fd);
	return rc;
}
