/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verbs lanes, the lane_ops table (verbs_lane_ops): the core's calls. Callbacks with the
 * connection lock held only set flags, create the opener's queue pair and wake the I/O thread.
 */

#include "lane.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>

static bool io_started, ib_held;

static void verbs_stop(void);

static int verbs_start(int nthreads)
{
	int rc;

	(void)nthreads; /* one I/O thread: the devices move the bytes */
	if (!verbs_ib_load()) {
		WARN("RAILHOP_TRANSPORT=verbs, but libibverbs.so.1 cannot be loaded (install "
		     "ibverbs-providers / rdma-core)");
		return -ELIBACC;
	}
	ib_held = true;
	verbs_epfd = epoll_create1(EPOLL_CLOEXEC);
	verbs_evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (verbs_epfd < 0 || verbs_evfd < 0) {
		return -errno;
	}
	verbs_io_watch(verbs_evfd, NULL, VB_TAG_KICK);
	atomic_store(&verbs_kicked, false);
	atomic_store(&verbs_io_stop, false);
	rc = pthread_create(&verbs_io_thread, NULL, verbs_io_main, NULL);
	if (rc != 0) {
		return -rc;
	}
	io_started = true;
	pthread_setname_np(verbs_io_thread, "railhop-verbs");
	return 0;
}

static void verbs_stop(void)
{
	if (io_started) {
		atomic_store(&verbs_io_stop, true);
		atomic_store(&verbs_kicked, false);
		verbs_io_kick();
		pthread_join(verbs_io_thread, NULL);
		io_started = false;
	}
	for (;;) {
		struct vb_ep *e;

		pthread_mutex_lock(&verbs_pend_mu);
		e = verbs_eps ? verbs_eps : verbs_pending;
		if (e && e == verbs_eps) {
			verbs_eps = e->next;
		} else if (e) {
			verbs_pending = e->next;
		}
		pthread_mutex_unlock(&verbs_pend_mu);
		if (!e) {
			break;
		}
		atomic_store(&e->fenced, true);
		verbs_ep_free(e);
	}
	for (int i = 0; i < RH_MAX_NICS; i++) {
		verbs_dev_close(i);
	}
	if (verbs_epfd >= 0) {
		close(verbs_epfd);
		verbs_epfd = -1;
	}
	if (verbs_evfd >= 0) {
		close(verbs_evfd);
		verbs_evfd = -1;
	}
	if (ib_held) {
		ib_held = false;
		verbs_ib_unload();
	}
}

static int verbs_listen(int nic)
{
	int rc = verbs_dev_open(nic);

	if (rc == 0) {
		verbs_io_kick();
	}
	return rc;
}

static int verbs_open(struct rh_lane *lane, const struct rh_hello *hello, uint64_t conn_id,
		      uint32_t epoch, uint32_t ip, uint16_t port)
{
	struct rh_hello h = *hello;
	struct vb_lane *vl;
	struct vb_ep *e;
	int rc;

	if (!atomic_load(&verbs_devs[lane->lnic].ok)) {
		return -ENODEV;
	}
	lane->nstreams = 1; /* one queue pair per lane */
	vl = calloc(1, sizeof(*vl));
	e = verbs_ep_new(VK_LANE, lane->lnic);
	if (!vl || !e) {
		rc = -ENOMEM;
		goto fail;
	}
	rc = verbs_ep_qp(e);
	if (rc < 0) {
		goto fail;
	}
	h.stream = 0;
	h.nstreams = 1;
	{
		struct verbs_qp_info q = { .qpn = e->qp->qp_num,
					   .psn = e->psn,
					   .mtu = (uint8_t)e->d->mtu };

		memcpy(q.gid, e->d->gid.raw, 16);
		verbs_qp_info_put(&q, h.tp);
		h.tp_len = VERBS_QP_INFO_LEN;
	}
	rc = rh_core_sign_stream(lane, &h);
	if (rc < 0) {
		goto fail;
	}
	e->hout = verbs_hello_msg(&h, RH_F_HELLO, conn_id, epoch, &e->hout_len);
	if (!e->hout) {
		rc = -ENOMEM;
		goto fail;
	}
	if (!rh_core_io_enter(lane->conn)) {
		rc = -ECONNABORTED;
		goto fail;
	}
	lane->tp = vl;
	e->lane = lane;
	e->conn = lane->conn;
	rh_core_conn_get(lane->conn);
	e->io_held = true;
	e->ip = ip;
	e->port = port;
	vl->st.s[0] = e;
	vl->st.live = 1;
	verbs_ep_push(e);
	return 0;
fail:
	if (e) {
		verbs_ep_free(e);
	}
	free(vl);
	return rc;
}

static int verbs_probe(struct rh_conn *conn, int lnic, uint32_t ip, uint16_t port, uint64_t cookie,
		       int timeout_ms)
{
	struct rh_hello h;
	struct vb_ep *e;
	uint64_t conn_id;
	int rc;

	if (!atomic_load(&verbs_devs[lnic].ok)) {
		return -ENODEV;
	}
	if ((rc = rh_core_probe_hello(conn, cookie, &h, &conn_id)) < 0) {
		return rc;
	}
	e = verbs_ep_new(VK_PROBE_OUT, lnic);
	if (!e) {
		return -ENOMEM;
	}
	e->hout = verbs_hello_msg(&h, RH_F_HELLO, conn_id, 0, &e->hout_len);
	if (!e->hout) {
		verbs_ep_free(e);
		return -ENOMEM;
	}
	e->conn = conn;
	rh_core_conn_get(conn);
	e->cookie = cookie;
	e->ip = ip;
	e->port = port;
	e->deadline_ms = rh_now_ms() + (uint64_t)timeout_ms;
	verbs_ep_push(e);
	return 0;
}

static void verbs_kick(struct rh_lane *lane)
{
	if (lane->tp) {
		verbs_io_kick();
	}
}

static void verbs_fence(struct rh_lane *lane)
{
	struct vb_lane *vl = lane->tp;
	struct vb_ep *e = vl ? vl->st.s[0] : NULL;

	if (e && !atomic_load(&e->fenced)) {
		e->t_fenced_ms = rh_now_ms();
		atomic_store(&e->fenced, true);
	}
	verbs_io_kick();
}

/* Work outstanding on the queue pair (sends or writes posted) and no completion for the
 * timeout: the peer does not acknowledge (a blackhole long before the retry count is spent). */
static bool verbs_stalled(struct rh_lane *lane, uint64_t now, int timeout_ms)
{
	struct vb_lane *vl = lane->tp;
	struct vb_ep *e = vl ? vl->st.s[0] : NULL;
	uint64_t p;

	if (!e || e->st != VS_READY || atomic_load(&e->outstanding) <= 0) {
		if (vl) {
			vl->stall_since_ms = 0;
		}
		return false;
	}
	p = atomic_load(&e->progress);
	if (p != vl->stall_mark || vl->stall_since_ms == 0) {
		vl->stall_mark = p;
		vl->stall_since_ms = now;
		return false;
	}
	return now - vl->stall_since_ms >= (uint64_t)timeout_ms;
}

static uint64_t verbs_progress(struct rh_lane *lane)
{
	struct vb_lane *vl = lane->tp;
	struct vb_ep *e = vl ? vl->st.s[0] : NULL;

	return e ? atomic_load(&e->progress) : 0;
}

const struct lane_ops verbs_lane_ops = {
	.name = "verbs",
	.start = verbs_start,
	.stop = verbs_stop,
	.listen = verbs_listen,
	.open = verbs_open,
	.kick = verbs_kick,
	.fence = verbs_fence,
	.stalled = verbs_stalled,
	.progress = verbs_progress,
	.probe = verbs_probe,
	.forget = verbs_forget,
};
