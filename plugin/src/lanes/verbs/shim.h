/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verbs lanes, the dlopen shim: libibverbs.so.1 is loaded at run time, so the plugin gains no
 * link dependency and still loads (and runs its other lanes) on hosts without rdma-core. The
 * lane calls the library's exported functions only through the table verbs_ib (never under
 * their own names, which would bind to symbols the plugin does not link, and several of which
 * are macros in <infiniband/verbs.h>); ibv_post_send, ibv_post_recv, ibv_poll_cq and
 * ibv_req_notify_cq are inline calls through the context's operation table and need no symbol.
 *
 * Unit tests fill the table with a fake device instead (verbs_ib_use(), plugin/tests/fake_ibv.c),
 * so the lane's set-up, state transitions and completion handling run without hardware.
 */
#ifndef RH_VERBS_SHIM_H
#define RH_VERBS_SHIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

struct verbs_ib_fns {
	struct ibv_device **(*get_device_list)(int *num);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *dev);
	struct ibv_context *(*open_device)(struct ibv_device *dev);
	int (*close_device)(struct ibv_context *ctx);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
	/* optional (rdma-core >= 34): NULL when the library lacks it */
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len,
					uint64_t iova, int fd, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
				    struct ibv_comp_channel *channel, int comp_vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*destroy_qp)(struct ibv_qp *qp);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
	/* the exported symbol fills the leading, compatible part of struct ibv_port_attr */
	int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
	int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
	int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *ev);
	void (*ack_async_event)(struct ibv_async_event *ev);
	const char *(*wc_status_str)(enum ibv_wc_status status);
	/* optional: completion channels (NULL: the lane polls its completion queues) */
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
	int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
	int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
};

/* The table in use: the loaded library's, or a test's (verbs_ib_use). */
extern struct verbs_ib_fns verbs_ib;

/* Load libibverbs.so.1 (counted: each true return needs its verbs_ib_unload()). False, with one
 * message saying why, when it is absent or lacks a mandatory function. */
bool verbs_ib_load(void);
void verbs_ib_unload(void);
/* Tests: use fns (every mandatory entry set) instead of the library; NULL: back to none. */
void verbs_ib_use(const struct verbs_ib_fns *fns);

#endif
