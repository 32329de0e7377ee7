/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verbs lanes, the devices (lane.h): per local NIC the RDMA device and port behind it
 * (netdev.c), its protection domain, the RoCE v2 GID of the NIC's address, the active MTU, the
 * registration cache, and the TCP listener the lanes' hellos and the probes arrive on.
 */

#include "lane.h"

#include <fcntl.h>
#include <sys/socket.h>

/* No listener until verbs_dev_open: verbs_stop closes every NIC's device, opened or not, and
 * a zero lfd there closed descriptor 0 of the host process (found by the lifecycle test over
 * verbs, tests/vm/test_verbs_lifecycle.py). */
struct vb_dev verbs_devs[RH_MAX_NICS] = { [0 ... RH_MAX_NICS - 1] = { .lfd = -1 } };

static int find_device(struct vb_dev *d, const char *ifname)
{
	struct ibv_device **l;
	int n = 0, port = 0, rc;

	rc = verbs_netdev_ibdev("", ifname, d->name, sizeof(d->name), &port);
	if (rc < 0) {
		WARN("verbs: %s has no RDMA device (sysfs): %s", ifname, strerror(-rc));
		return rc;
	}
	d->port = (uint8_t)port;
	l = verbs_ib.get_device_list(&n);
	for (int i = 0; l && i < n; i++) {
		if (!strcmp(verbs_ib.get_device_name(l[i]), d->name)) {
			d->ctx = verbs_ib.open_device(l[i]);
			break;
		}
	}
	if (l) {
		verbs_ib.free_device_list(l);
	}
	if (!d->ctx) {
		WARN("verbs: cannot open RDMA device %s of %s", d->name, ifname);
		return -ENODEV;
	}
	return 0;
}

static int open_listener(struct vb_dev *d, uint32_t ip, uint16_t *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = ip };
	socklen_t len = sizeof(sa);
	int one = 1;

	d->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (d->lfd < 0) {
		return -errno;
	}
	setsockopt(d->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(d->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(d->lfd, 256) < 0 ||
	    getsockname(d->lfd, (struct sockaddr *)&sa, &len) < 0) {
		return -errno;
	}
	*port = sa.sin_port;
	return 0;
}

int verbs_dev_open(int nic)
{
	struct vb_dev *d = &verbs_devs[nic];
	struct rh_nic *n = rh_core_nic(nic);
	struct ibv_port_attr pa;
	uint16_t port = 0;
	int rc;

	memset(d, 0, sizeof(*d));
	d->lfd = -1;
	pthread_mutex_init(&d->mr_mu, NULL);
	rc = find_device(d, n->ifname);
	if (rc < 0) {
		goto fail;
	}
	if (fcntl(d->ctx->async_fd, F_SETFL, fcntl(d->ctx->async_fd, F_GETFL) | O_NONBLOCK) < 0) {
		rc = -errno;
		goto fail;
	}
	memset(&pa, 0, sizeof(pa));
	if (verbs_ib.query_port(d->ctx, d->port, &pa)) {
		rc = -EIO;
		goto fail;
	}
	d->mtu = pa.active_mtu;
	d->gid_index = verbs_gid_index("", d->name, d->port, n->ipv4);
	if (d->gid_index < 0) {
		rc = d->gid_index;
		WARN("verbs: %s (%s port %u) has no RoCE v2 GID for its address", n->ifname,
		     d->name, d->port);
		goto fail;
	}
	if (verbs_ib.query_gid(d->ctx, d->port, d->gid_index, &d->gid)) {
		rc = -EIO;
		goto fail;
	}
	d->pd = verbs_ib.alloc_pd(d->ctx);
	if (!d->pd) {
		rc = errno ? -errno : -ENOMEM;
		goto fail;
	}
	d->mrc.pd = d->pd;
	if (verbs_ib.create_comp_channel) {
		d->ch = verbs_ib.create_comp_channel(d->ctx);
		if (d->ch &&
		    fcntl(d->ch->fd, F_SETFL, fcntl(d->ch->fd, F_GETFL) | O_NONBLOCK) < 0) {
			verbs_ib.destroy_comp_channel(d->ch);
			d->ch = NULL;
		}
	}
	rc = open_listener(d, n->ipv4, &port);
	if (rc < 0) {
		WARN("verbs: cannot listen on %s: %s", n->ifname, strerror(-rc));
		goto fail;
	}
	n->port = port;
	atomic_store_explicit(&d->ok, true, memory_order_release);
	verbs_io_watch(d->lfd, NULL, VB_TAG_LISTEN(nic));
	verbs_io_watch(d->ctx->async_fd, NULL, VB_TAG_ASYNC(nic));
	if (d->ch) {
		verbs_io_watch(d->ch->fd, NULL, VB_TAG_CHAN(nic));
	}
	INFO("verbs: lane listener on %s port %u, device %s port %u, GID index %d, MTU %d",
	     n->ifname, ntohs(port), d->name, d->port, d->gid_index, 128 << d->mtu);
	return 0;
fail:
	verbs_dev_close(nic);
	return rc;
}

void verbs_dev_close(int nic)
{
	struct vb_dev *d = &verbs_devs[nic];

	atomic_store(&d->ok, false);
	if (d->lfd >= 0) {
		close(d->lfd);
		d->lfd = -1;
	}
	if (d->pd) {
		pthread_mutex_lock(&d->mr_mu);
		verbs_mr_clear(&d->mrc);
		pthread_mutex_unlock(&d->mr_mu);
		verbs_ib.dealloc_pd(d->pd);
		d->pd = NULL;
	}
	if (d->ch) {
		verbs_ib.destroy_comp_channel(d->ch);
		d->ch = NULL;
	}
	if (d->ctx) {
		verbs_ib.close_device(d->ctx);
		d->ctx = NULL;
	}
}

int verbs_dev_mr(struct vb_dev *d, const void *addr, size_t len, uint32_t *lkey, uint32_t *rkey)
{
	int rc;

	pthread_mutex_lock(&d->mr_mu);
	rc = verbs_mr_get(&d->mrc, addr, len ? len : 1, lkey, rkey);
	pthread_mutex_unlock(&d->mr_mu);
	return rc;
}

void verbs_forget(const void *addr, size_t size)
{
	for (int i = 0; i < RH_MAX_NICS; i++) {
		struct vb_dev *d = &verbs_devs[i];

		if (!d->pd) {
			continue;
		}
		pthread_mutex_lock(&d->mr_mu);
		verbs_mr_forget(&d->mrc, addr, size);
		pthread_mutex_unlock(&d->mr_mu);
	}
}
