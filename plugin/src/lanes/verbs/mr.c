/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory registration (verbs.h): one cache per protection domain, so a buffer is registered once
 * per NIC and on a backup NIC only when a lane there carries it. The range table is the ofi
 * lane's pure one (ofi_rc_*, lanes/ofi/proto.c, built in every plugin).
 */
#include <errno.h>

#include "../../log.h"
#include "verbs.h"

#define VERBS_MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

int verbs_mr_get(struct verbs_mr_cache *c, const void *addr, size_t len, uint32_t *lkey,
		 uint32_t *rkey)
{
	struct ofi_rc_entry *hit = ofi_rc_find(&c->rc, (uintptr_t)addr, len);
	struct ofi_rc_entry ent = { 0 };
	struct ibv_mr *mr;
	int rc;

	if (!hit) {
		ofi_rc_range((uintptr_t)addr, len, &ent.lo, &ent.hi);
		mr = verbs_ib.reg_mr(c->pd, (void *)ent.lo, ent.hi - ent.lo, VERBS_MR_ACCESS);
		if (!mr) {
			rc = errno ? -errno : -ENOMEM;
			WARN("verbs: reg_mr of %zu bytes: %d", (size_t)(ent.hi - ent.lo), rc);
			return rc;
		}
		ent.mr = mr;
		rc = ofi_rc_insert(&c->rc, &ent);
		if (rc) {
			verbs_ib.dereg_mr(mr);
			return rc;
		}
		hit = ofi_rc_find(&c->rc, (uintptr_t)addr, len);
	}
	mr = hit->mr;
	*lkey = mr->lkey;
	*rkey = mr->rkey;
	return 0;
}

void verbs_mr_forget(struct verbs_mr_cache *c, const void *addr, size_t size)
{
	struct ofi_rc_entry out[16];
	int n;

	do {
		n = ofi_rc_take(&c->rc, (uintptr_t)addr, (uintptr_t)addr + size, out, 16);
		for (int i = 0; i < n; i++) {
			verbs_ib.dereg_mr(out[i].mr);
		}
	} while (n == 16);
}

void verbs_mr_clear(struct verbs_mr_cache *c)
{
	verbs_mr_forget(c, (const void *)0, UINTPTR_MAX);
	ofi_rc_free(&c->rc);
}

int verbs_mr_dmabuf(struct ibv_pd *pd, int fd, uint64_t offset, size_t len, uint64_t iova,
		    struct ibv_mr **out)
{
	if (!verbs_ib.reg_dmabuf_mr) {
		return -EOPNOTSUPP;
	}
	*out = verbs_ib.reg_dmabuf_mr(pd, offset, len, iova, fd, VERBS_MR_ACCESS);
	if (!*out) {
		return errno ? -errno : -EIO;
	}
	return 0;
}
