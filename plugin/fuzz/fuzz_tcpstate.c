/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the answer to the TCP lanes' sock_diag lookup (lanes/tcpstate.c,
 * parse_answer: the netlink message the kernel sends back for a socket the plugin does not own,
 * libfabric's tcp provider's). The source is included to reach the static parser; the input is
 * the received datagram, in a buffer aligned as tcp_info_by_addr's. Checks: a found tcp_info
 * came from an INET_DIAG_INFO attribute inside the message, and the loss verdict reads it.
 */
#include "../src/lanes/tcpstate.c"

#include <stdio.h>
#include <stdlib.h>

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static union {
		struct nlmsghdr nh;
		char b[8192];
	} ans;
	struct tcp_info ti;
	int rc;

	if (size > sizeof(ans)) {
		return 0;
	}
	memset(&ans, 0, sizeof(ans));
	memcpy(ans.b, data, size);
	rc = parse_answer(&ans.nh, size, &ti);
	if (rc == 0) {
		FUZZ_CHECK(size >= NLMSG_LENGTH(sizeof(struct inet_diag_msg)) + RTA_LENGTH(0));
		FUZZ_CHECK(ans.nh.nlmsg_type == SOCK_DIAG_BY_FAMILY && ans.nh.nlmsg_len <= size);
		(void)tcp_info_lost(&ti, 1000);
	} else {
		FUZZ_CHECK(rc < 0);
	}
	return 0;
}
