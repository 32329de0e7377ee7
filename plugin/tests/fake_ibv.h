/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A fake libibverbs device for the verbs lane's unit tests: fills the shim's table
 * (verbs_ib_use) and the context's inline operations (post_send, post_recv, poll_cq), keeps
 * each queue pair's state machine with the attribute masks the kernel checks per transition,
 * completes posted work requests with the status a test chose, flushes on ERROR.
 */
#ifndef RH_FAKE_IBV_H
#define RH_FAKE_IBV_H

#include <stdbool.h>
#include <stdint.h>

#include "../src/lanes/verbs/shim.h"

#define FAKE_CQ_DEPTH 256
#define FAKE_WR_LOG 256

struct fake_qp {
	struct ibv_qp qp;
	struct ibv_qp_attr attr; /* the attributes as last set */
	int nposted; /* send WRs posted and not completed */
	uint64_t posted_ids[FAKE_WR_LOG];
};

struct fake_wr_log {
	uint32_t qp_num;
	enum ibv_wr_opcode opcode;
	uint32_t imm; /* host order */
	uint64_t remote_addr;
	uint32_t rkey, len;
};

struct fake_ibv {
	struct ibv_device dev;
	struct ibv_context ctx;
	struct ibv_pd pd;
	int nqp_live, ncq_live, nmr_live, nreg; /* objects alive, registrations ever made */
	int ndmabuf;
	uint32_t next_qpn, next_key;
	/* what the next send completions report (IBV_WC_SUCCESS by default) and how many */
	enum ibv_wc_status next_status;
	int status_left;
	enum ibv_qp_state fail_to; /* a modify into this state fails with EINVAL (0: none) */
	struct ibv_async_event events[8]; /* pending async events, in order */
	int nevents, nacked;
	struct fake_wr_log log[FAKE_WR_LOG];
	int nlog;
};

extern struct fake_ibv fake;
extern const struct verbs_ib_fns fake_ibv_fns; /* reg_dmabuf_mr set */

void fake_ibv_reset(void);
static inline struct fake_qp *fake_qp_of(struct ibv_qp *qp)
{
	return (struct fake_qp *)qp;
}

#endif
