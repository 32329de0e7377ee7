/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi lanes, the dlopen shim: libfabric is loaded at run time, so the plugin still loads (and
 * runs TCP lanes) on hosts without it. Only five functions are library symbols; the lanes call
 * them through the ofi_lf_*() wrappers below (never under libfabric's own names, which would bind
 * to symbols the plugin does not link). Every other fi_* call is an inline wrapper around the
 * objects' operation tables.
 */
#include <dlfcn.h>
#include <signal.h>

#include "ofi.h"

static struct {
	int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
		       struct fi_info **);
	void (*freeinfo)(struct fi_info *);
	struct fi_info *(*dupinfo)(const struct fi_info *);
	int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
	const char *(*strerror)(int);
} lf;
static pthread_mutex_t lf_mu = PTHREAD_MUTEX_INITIALIZER;
static void *lf_handle;
static int lf_users;

/*
 * The host's signal dispositions survive loading and unloading libfabric. Debian's libfabric
 * links libpsm2, whose constructor installs its own handlers for SIGSEGV, SIGBUS, SIGILL,
 * SIGABRT, SIGINT and SIGTERM (they write "<prog>.80s-<pid>,<host>.btr" files into the working
 * directory) and whose destructor puts back what it found at load time.
 */
#define RH_NSIG 32 /* the classic signals, 1..31 */
struct sig_saved {
	struct sigaction sa[RH_NSIG];
};

static void sig_save(struct sig_saved *s)
{
	for (int i = 1; i < RH_NSIG; i++) {
		sigaction(i, NULL, &s->sa[i]);
	}
}

static void sig_restore(const struct sig_saved *s, const char *what)
{
	for (int i = 1; i < RH_NSIG; i++) {
		struct sigaction now;

		if (i == SIGKILL || i == SIGSTOP || sigaction(i, NULL, &now) < 0) {
			continue;
		}
		if (now.sa_handler != s->sa[i].sa_handler || now.sa_flags != s->sa[i].sa_flags) {
			sigaction(i, &s->sa[i], NULL);
			TRACE("ofi: %s changed the handler of signal %d: put back", what, i);
		}
	}
}

static bool lf_open_locked(void)
{
	struct sig_saved saved;

	sig_save(&saved);
	lf_handle = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
	sig_restore(&saved, "loading libfabric");
	if (!lf_handle) {
		INFO("ofi: libfabric.so.1 cannot be loaded: %s", dlerror());
		return false;
	}
	*(void **)&lf.getinfo = dlsym(lf_handle, "fi_getinfo");
	*(void **)&lf.freeinfo = dlsym(lf_handle, "fi_freeinfo");
	*(void **)&lf.dupinfo = dlsym(lf_handle, "fi_dupinfo");
	*(void **)&lf.fabric = dlsym(lf_handle, "fi_fabric");
	*(void **)&lf.strerror = dlsym(lf_handle, "fi_strerror");
	if (!lf.getinfo || !lf.freeinfo || !lf.dupinfo || !lf.fabric || !lf.strerror) {
		WARN("ofi: libfabric.so.1 lacks fi_getinfo/fi_freeinfo/fi_dupinfo/fi_fabric/"
		     "fi_strerror");
		dlclose(lf_handle);
		lf_handle = NULL;
		return false;
	}
	return true;
}

bool ofi_lf_load(void)
{
	bool ok;

	pthread_mutex_lock(&lf_mu);
	ok = lf_handle || lf_open_locked();
	if (ok) {
		lf_users++;
	}
	pthread_mutex_unlock(&lf_mu);
	return ok;
}

void ofi_lf_unload(void)
{
	pthread_mutex_lock(&lf_mu);
	if (lf_users > 0 && --lf_users == 0 && lf_handle) {
		struct sig_saved saved;

		sig_save(&saved);
		/* libfabric's destructor (when this was the last reference) finalizes every
		 * provider and stops what they started */
		dlclose(lf_handle);
		sig_restore(&saved, "unloading libfabric");
		lf_handle = NULL;
		memset(&lf, 0, sizeof(lf));
	}
	pthread_mutex_unlock(&lf_mu);
}

/* The wrappers are only called between ofi_lf_load() returning true and the matching ofi_lf_unload()
 * (ofi_start .. ofi_stop, or the provider check). */
int ofi_lf_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
		   const struct fi_info *hints, struct fi_info **info)
{
	return lf.getinfo(version, node, service, flags, hints, info);
}

void ofi_lf_freeinfo(struct fi_info *info)
{
	lf.freeinfo(info);
}

struct fi_info *ofi_lf_dupinfo(const struct fi_info *info)
{
	return lf.dupinfo(info);
}

int ofi_lf_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context)
{
	return lf.fabric(attr, fabric, context);
}

const char *ofi_lf_strerror(int errnum)
{
	return lf.strerror(errnum);
}
