/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Transport choice: one function that logs why (lanes.h). RAILHOP_TRANSPORT=tcp|ofi forces one;
 * auto takes libfabric only where an RDMA-class provider is found. NULL: the forced one is not
 * available (a clear error at init, never a silent fallback). The assembly point (api_nccl.c)
 * registers it with the core as the transport picker.
 */
#include <string.h>

#include "../log.h"
#include "../param.h"
#include "lanes.h"
#ifdef RH_HAVE_VERBS
#include "verbs/netdev.h"
#include "verbs/shim.h"
#endif

/* auto: verbs where every managed NIC is an RDMA device (sysfs) and libibverbs loads. */
static bool verbs_auto(void)
{
#ifdef RH_HAVE_VERBS
	const char *names[RH_MAX_NICS];
	char why[512];
	int n = rh_core_nic_count();

	for (int i = 0; i < n && i < RH_MAX_NICS; i++) {
		names[i] = rh_core_nic(i)->ifname;
	}
	if (!verbs_netdevs_rdma("", names, n, why, sizeof(why))) {
		INFO_INIT("transport auto: verbs not taken (%s)", why);
		return false;
	}
	if (!verbs_ib_load()) {
		INFO_INIT("transport auto: every NIC is an RDMA device (%s), but libibverbs.so.1 "
			  "does not load: verbs not taken",
			  why);
		return false;
	}
	verbs_ib_unload();
	INFO_INIT("transport verbs (auto: every NIC is an RDMA device: %s)", why);
	return true;
#else
	INFO_INIT("transport auto: verbs not taken (built without infiniband/verbs.h)");
	return false;
#endif
}

const struct lane_ops *rh_lanes_choose(void)
{
	const char *t = rh_param.TRANSPORT;

	if (!strcmp(t, "tcp")) {
		INFO_INIT("transport tcp (RAILHOP_TRANSPORT=tcp)");
		return &tcp_lane_ops;
	}
	if (!strcmp(t, "verbs")) {
#ifdef RH_HAVE_VERBS
		INFO_INIT("transport verbs (RAILHOP_TRANSPORT=verbs)");
		return &verbs_lane_ops;
#else
		WARN("RAILHOP_TRANSPORT=verbs, but this plugin was built without "
		     "infiniband/verbs.h (install libibverbs-dev and rebuild)");
		return NULL;
#endif
	}
	if (strcmp(t, "ofi") && strcmp(t, "auto")) {
		WARN("RAILHOP_TRANSPORT=%s: expected auto, tcp, ofi or verbs", t);
		return NULL;
	}
	if (!strcmp(t, "auto") && verbs_auto()) {
#ifdef RH_HAVE_VERBS
		return &verbs_lane_ops;
#endif
	}
#ifdef RH_HAVE_OFI
	if (!strcmp(t, "ofi")) {
		INFO_INIT("transport ofi (RAILHOP_TRANSPORT=ofi; libfabric picks the provider, "
			  "FI_PROVIDER narrows it)");
		return &ofi_lane_ops;
	}
	{
		char prov[64];

		if (ofi_rdma_provider(prov, sizeof(prov))) {
			INFO_INIT("transport ofi (libfabric provider %s offers FI_EP_MSG + FI_RMA)",
				  prov);
			return &ofi_lane_ops;
		}
	}
	INFO_INIT("transport tcp (no RDMA-class libfabric provider found)");
	return &tcp_lane_ops;
#else
	if (!strcmp(t, "ofi")) {
		WARN("RAILHOP_TRANSPORT=ofi, but this plugin was built without libfabric "
		     "(install libfabric-dev and rebuild)");
		return NULL;
	}
	INFO_INIT("transport tcp (built without libfabric)");
	return &tcp_lane_ops;
#endif
}
