/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verbs lanes (RAILHOP_TRANSPORT=verbs, docs/transports.md): RC queue pairs driven through
 * libibverbs directly, so the failover core sees each queue pair's state, its error completions
 * and its async events. The files of this directory, one per phase:
 *   shim.[ch]   libibverbs dlopened, its exported functions in one table (verbs_ib)
 *   proto.[ch]  the pure protocol: write immediates naming adverts, advert ids, the QP address
 *               codec, the verdicts on completions and events (unit-tested)
 *   gid.c       the RoCE v2 GID of a NIC address, from sysfs (root= for fixtures)
 *   netdev.[ch] the RDMA device and port behind a network interface, from sysfs (root=)
 *   qp.c        queue pairs: create, RESET -> INIT -> RTR -> RTS, to ERROR, re-create
 *   poll.c      completion queues: drain, classify, the first failure; the completion probes
 *   mr.c        one registration cache per protection domain; dmabuf registration
 * This header is their private one.
 *
 * Status: these are the lane's device-level phases with their unit tests against a fake
 * device (plugin/tests/fake_ibv.c). The lane_ops table (connection set-up inside the
 * authenticated hello, the advert/write data path, the I/O thread) is not built yet, so
 * RAILHOP_TRANSPORT does not offer verbs.
 */
#ifndef RH_VERBS_H
#define RH_VERBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../ofi/proto.h" /* the registration cache's pure range table (ofi_rc_*) */
#include "netdev.h"
#include "proto.h"
#include "shim.h"

/* --- gid.c --- */

/* The index of the RoCE v2 GID of IPv4 address ip (network order) on port `port` of device dev,
 * read from <root>/sys/class/infiniband/<dev>/ports/<port>/gids/<i> and
 * gid_attrs/types/<i> (root "" for the live system). -ENOENT when there is none (the address is
 * not on that device, or only a RoCE v1 GID carries it), -errno when sysfs cannot be read. */
int verbs_gid_index(const char *root, const char *dev, int port, uint32_t ip);

/* --- qp.c --- */

struct verbs_qp_params {
	uint8_t port;
	int gid_index;
	enum ibv_mtu mtu; /* the port's active MTU, at most the peer's */
	uint8_t timeout; /* RAILHOP_IB_TIMEOUT: 4.096 us x 2^timeout per try */
	uint8_t retry_cnt; /* RAILHOP_IB_RETRY_CNT */
	uint8_t rnr_retry; /* 7: retry without limit (the receiver always has buffers posted) */
	uint32_t max_send_wr, max_recv_wr;
};

/* The parameters of a queue pair on port `port` whose source GID is gid_index and whose path MTU
 * is at most mtu (the port's active MTU): timeout and retry count from RAILHOP_IB_TIMEOUT /
 * RAILHOP_IB_RETRY_CNT (rh_param), unlimited RNR retries, `depth` work requests each way. */
void verbs_qp_params_init(struct verbs_qp_params *p, uint8_t port, int gid_index, enum ibv_mtu mtu,
			  uint32_t depth);
/* An RC queue pair on pd with both work queues on cq (RESET state). NULL with errno set. */
struct ibv_qp *verbs_qp_create(struct ibv_pd *pd, struct ibv_cq *cq,
			       const struct verbs_qp_params *p);
/* RESET -> INIT -> RTR -> RTS towards the peer's queue pair `remote` (from its authenticated
 * hello), this side sending from local_psn. 0 or -errno (the step that failed is logged). */
int verbs_qp_connect(struct ibv_qp *qp, const struct verbs_qp_params *p, uint32_t local_psn,
		     const struct verbs_qp_info *remote);
/* The two halves of verbs_qp_connect: RESET -> INIT (receives may be posted from then on), and
 * INIT -> RTR -> RTS. 0 or -errno (logged). */
int verbs_qp_init(struct ibv_qp *qp, const struct verbs_qp_params *p);
int verbs_qp_ready(struct ibv_qp *qp, const struct verbs_qp_params *p, uint32_t local_psn,
		   const struct verbs_qp_info *remote);
/* Move to ERROR: outstanding work requests flush, the responder drops later packets (the
 * receiver's fence). 0 or -errno. */
int verbs_qp_error(struct ibv_qp *qp);

/* --- poll.c --- */

struct verbs_poll_fail {
	uint32_t qp_num;
	uint64_t wr_id;
	int status; /* enum ibv_wc_status */
	struct verbs_verdict v;
};

/* Completion handler for successful completions (the lane's data path). */
typedef void (*verbs_wc_fn)(void *arg, const struct ibv_wc *wc);

/* Drain up to max completions of cq: successful ones go to fn, the first error completion is
 * reported in *fail (further errors of the same drain are flush errors of the same queue pairs
 * and only counted). Returns the completions read (>= 0), or -EIO when polling failed.
 * Every completion fires the verbs_wc probe (probes.h), error ones verbs_wc_err too, with
 * nic -1 and no post time: verbs_cq_drain_traced names them. */
int verbs_cq_drain(struct ibv_cq *cq, int max, verbs_wc_fn fn, void *arg,
		   struct verbs_poll_fail *fail, int *nfail);

/* What the completion probes report of a completion queue's completions: the plugin's index of
 * the lane's NIC and, when the lane keeps them, its work requests' post times. */
struct verbs_cq_trace {
	int nic; /* the plugin's NIC index, -1 unknown */
	/* CLOCK_MONOTONIC ns at which wc's work request was posted, 0 unknown; NULL: none known */
	uint64_t (*post_ns)(void *arg, const struct ibv_wc *wc);
	void *arg;
};

/* verbs_cq_drain with the probes' NIC index and post times from tr (NULL: as verbs_cq_drain). */
int verbs_cq_drain_traced(struct ibv_cq *cq, int max, verbs_wc_fn fn, void *arg,
			  struct verbs_poll_fail *fail, int *nfail,
			  const struct verbs_cq_trace *tr);

/* One asynchronous event of a device, read and acknowledged. */
struct verbs_async {
	int type; /* enum ibv_event_type */
	uint32_t qp_num; /* queue pair events */
	int port; /* port events */
	struct verbs_verdict v;
};

/* Read one pending asynchronous event of ctx (the lane's I/O thread makes ctx->async_fd
 * non-blocking and polls it) and acknowledge it. 0, or -EAGAIN when none is pending. Fires the
 * verbs_async probe (probes.h) with nic -1. */
int verbs_async_read(struct ibv_context *ctx, struct verbs_async *out);
/* verbs_async_read whose probe names the plugin's NIC index nic. */
int verbs_async_read_nic(struct ibv_context *ctx, int nic, struct verbs_async *out);

/* --- mr.c --- */

struct verbs_mr_cache {
	struct ibv_pd *pd;
	struct ofi_rcache rc;
};

/* The registration covering [addr, addr + len) in the cache's protection domain (registered
 * page-aligned on the first use, kept until forgotten). 0 with the keys, or -errno. */
int verbs_mr_get(struct verbs_mr_cache *c, const void *addr, size_t len, uint32_t *lkey,
		 uint32_t *rkey);
/* The application deregistered [addr, addr + size): drop the overlapping registrations. */
void verbs_mr_forget(struct verbs_mr_cache *c, const void *addr, size_t size);
/* Every registration of the cache released. */
void verbs_mr_clear(struct verbs_mr_cache *c);
/* A dmabuf registration (regMrDmaBuf): -EOPNOTSUPP when the library has no
 * ibv_reg_dmabuf_mr. */
int verbs_mr_dmabuf(struct ibv_pd *pd, int fd, uint64_t offset, size_t len, uint64_t iova,
		    struct ibv_mr **out);

#endif
