/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verbs lanes, the dlopen shim (shim.h): libibverbs.so.1 looked up at run time, one table of
 * its exported functions.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "../../log.h"
#include "shim.h"

struct verbs_ib_fns verbs_ib;

static pthread_mutex_t ib_mu = PTHREAD_MUTEX_INITIALIZER;
static void *ib_handle;
static int ib_users;
static bool ib_fake;

#define IB_SYM(field, name) (*(void **)&t.field = dlsym(ib_handle, name))

static bool ib_open_locked(void)
{
	struct verbs_ib_fns t;

	memset(&t, 0, sizeof(t));
	ib_handle = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!ib_handle) {
		INFO("verbs: libibverbs.so.1 cannot be loaded (install rdma-core's libibverbs1): %s",
		     dlerror());
		return false;
	}
	IB_SYM(get_device_list, "ibv_get_device_list");
	IB_SYM(free_device_list, "ibv_free_device_list");
	IB_SYM(get_device_name, "ibv_get_device_name");
	IB_SYM(open_device, "ibv_open_device");
	IB_SYM(close_device, "ibv_close_device");
	IB_SYM(alloc_pd, "ibv_alloc_pd");
	IB_SYM(dealloc_pd, "ibv_dealloc_pd");
	IB_SYM(reg_mr, "ibv_reg_mr");
	IB_SYM(reg_dmabuf_mr, "ibv_reg_dmabuf_mr");
	IB_SYM(dereg_mr, "ibv_dereg_mr");
	IB_SYM(create_cq, "ibv_create_cq");
	IB_SYM(destroy_cq, "ibv_destroy_cq");
	IB_SYM(create_qp, "ibv_create_qp");
	IB_SYM(destroy_qp, "ibv_destroy_qp");
	IB_SYM(modify_qp, "ibv_modify_qp");
	IB_SYM(query_port, "ibv_query_port");
	IB_SYM(query_gid, "ibv_query_gid");
	IB_SYM(get_async_event, "ibv_get_async_event");
	IB_SYM(ack_async_event, "ibv_ack_async_event");
	IB_SYM(wc_status_str, "ibv_wc_status_str");
	IB_SYM(create_comp_channel, "ibv_create_comp_channel");
	IB_SYM(destroy_comp_channel, "ibv_destroy_comp_channel");
	IB_SYM(get_cq_event, "ibv_get_cq_event");
	IB_SYM(ack_cq_events, "ibv_ack_cq_events");
	if (!t.create_comp_channel || !t.destroy_comp_channel || !t.get_cq_event ||
	    !t.ack_cq_events) {
		t.create_comp_channel = NULL; /* all four or none */
	}
	if (!t.get_device_list || !t.free_device_list || !t.get_device_name || !t.open_device ||
	    !t.close_device || !t.alloc_pd || !t.dealloc_pd || !t.reg_mr || !t.dereg_mr ||
	    !t.create_cq || !t.destroy_cq || !t.create_qp || !t.destroy_qp || !t.modify_qp ||
	    !t.query_port || !t.query_gid || !t.get_async_event || !t.ack_async_event ||
	    !t.wc_status_str) {
		WARN("verbs: libibverbs.so.1 lacks one of the functions the lane needs");
		dlclose(ib_handle);
		ib_handle = NULL;
		return false;
	}
	if (!t.reg_dmabuf_mr) {
		INFO("verbs: libibverbs.so.1 has no ibv_reg_dmabuf_mr (regMrDmaBuf not offered)");
	}
	verbs_ib = t;
	return true;
}

bool verbs_ib_load(void)
{
	bool ok = true;

	pthread_mutex_lock(&ib_mu);
	if (ib_fake) {
		ib_users++;
	} else if (ib_users > 0 || ib_open_locked()) {
		ib_users++;
	} else {
		ok = false;
	}
	pthread_mutex_unlock(&ib_mu);
	return ok;
}

void verbs_ib_unload(void)
{
	pthread_mutex_lock(&ib_mu);
	if (ib_users > 0 && --ib_users == 0 && ib_handle) {
		dlclose(ib_handle);
		ib_handle = NULL;
		memset(&verbs_ib, 0, sizeof(verbs_ib));
	}
	pthread_mutex_unlock(&ib_mu);
}

void verbs_ib_use(const struct verbs_ib_fns *fns)
{
	pthread_mutex_lock(&ib_mu);
	ib_fake = fns != NULL;
	if (fns) {
		verbs_ib = *fns;
	} else {
		memset(&verbs_ib, 0, sizeof(verbs_ib));
	}
	pthread_mutex_unlock(&ib_mu);
}
