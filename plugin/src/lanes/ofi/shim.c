/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi lanes, the dlopen shim: libfabric is loaded at run time, so the plugin still loads (and
 * runs TCP lanes) on hosts without it. Only five functions are library symbols; the lanes call
 * them through the lf_*() wrappers below (never under libfabric's own names, which would bind
 * to symbols the plugin does not link). Every other fi_* call is an inline wrapper around the
 * objects' operation tables.
 */
#include <dlfcn.h>

#include "ofi.h"

static struct {
	int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
		       struct fi_info **);
	void (*freeinfo)(struct fi_info *);
	struct fi_info *(*dupinfo)(const struct fi_info *);
	int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
	const char *(*strerror)(int);
} lf;
static pthread_once_t lf_once = PTHREAD_ONCE_INIT;
static bool lf_ok;

static void lf_load_once(void)
{
	void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		INFO("ofi: libfabric.so.1 cannot be loaded: %s", dlerror());
		return;
	}
	*(void **)&lf.getinfo = dlsym(h, "fi_getinfo");
	*(void **)&lf.freeinfo = dlsym(h, "fi_freeinfo");
	*(void **)&lf.dupinfo = dlsym(h, "fi_dupinfo");
	*(void **)&lf.fabric = dlsym(h, "fi_fabric");
	*(void **)&lf.strerror = dlsym(h, "fi_strerror");
	lf_ok = lf.getinfo && lf.freeinfo && lf.dupinfo && lf.fabric && lf.strerror;
	if (!lf_ok) {
		WARN("ofi: libfabric.so.1 lacks fi_getinfo/fi_freeinfo/fi_dupinfo/fi_fabric/"
		     "fi_strerror");
	}
}

bool lf_load(void)
{
	pthread_once(&lf_once, lf_load_once);
	return lf_ok;
}

/* The wrappers are only called after lf_load() returned true (ofi_start, or the provider check
 * before it). */
int lf_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
	       const struct fi_info *hints, struct fi_info **info)
{
	return lf.getinfo(version, node, service, flags, hints, info);
}

void lf_freeinfo(struct fi_info *info)
{
	lf.freeinfo(info);
}

struct fi_info *lf_dupinfo(const struct fi_info *info)
{
	return lf.dupinfo(info);
}

int lf_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context)
{
	return lf.fabric(attr, fabric, context);
}

const char *lf_strerror(int errnum)
{
	return lf.strerror(errnum);
}
