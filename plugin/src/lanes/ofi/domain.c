/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi lanes, set-up: one provider domain per NIC (matched by the NIC's IPv4 address), its
 * passive endpoint for incoming lanes, and the per-domain registration cache (a buffer is
 * registered once per domain, lazily, and dropped when the application deregisters it).
 */
#include "ofi.h"

struct ofi_dom ofi_doms[RH_MAX_NICS];

/* --- domains (one per NIC) --- */

static struct fi_info *make_hints(void)
{
	struct fi_info *h = ofi_lf_dupinfo(NULL); /* fi_allocinfo(), through the loaded library */

	if (!h) {
		return NULL;
	}
	h->ep_attr->type = FI_EP_MSG;
	h->caps = FI_MSG | FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
	h->mode = FI_RX_CQ_DATA;
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	h->domain_attr->threading = FI_THREAD_SAFE;
	h->addr_format = FI_SOCKADDR_IN;
	return h;
}

bool ofi_rdma_provider(char *name, size_t cap)
{
	struct fi_info *hints, *list = NULL;
	bool found = false;

	if (!ofi_lf_load()) {
		return false;
	}
	hints = make_hints();
	if (!hints) {
		ofi_lf_unload();
		return false;
	}
	/* Only verbs offers FI_EP_MSG + FI_RMA on RDMA hardware (efa is RDM-only): asking for it
	 * alone keeps init from probing every provider. */
	hints->fabric_attr->prov_name = strdup("verbs");
	if (ofi_lf_getinfo(OFI_API, NULL, NULL, 0, hints, &list) == 0) {
		for (struct fi_info *i = list; i && !found; i = i->next) {
			const char *p = i->fabric_attr->prov_name;

			if (p && (strstr(p, "verbs") || strstr(p, "efa"))) {
				snprintf(name, cap, "%s", p);
				found = true;
			}
		}
	}
	ofi_lf_freeinfo(list);
	ofi_lf_freeinfo(hints);
	ofi_lf_unload(); /* ofi_start loads it again if it is chosen */
	return found;
}

/* Where the provider reports the NIC behind a domain, take its PCI path and speed. */
static void nic_attrs(int nic, const struct fi_info *i)
{
	struct rh_nic *n = rh_core_nic(nic);

	if (!i->nic) {
		return;
	}
	if (i->nic->link_attr && i->nic->link_attr->speed && n->speed <= 0) {
		n->speed = (int)(i->nic->link_attr->speed / 1000000);
	}
	if (i->nic->bus_attr && i->nic->bus_attr->bus_type == FI_BUS_PCI && !n->pci[0]) {
		const struct fi_pci_attr *p = &i->nic->bus_attr->attr.pci;
		char path[96], real[PATH_MAX];

		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%04x:%02x:%02x.%x", p->domain_id,
			 p->bus_id, p->device_id, p->function_id);
		if (realpath(path, real) && strlen(real) < sizeof(n->pci)) {
			memcpy(n->pci, real, strlen(real) + 1);
		}
	}
}

int ofi_dom_open(int nic)
{
	struct ofi_dom *d = &ofi_doms[nic];
	struct fi_info *hints = make_hints(), *list = NULL, *pick = NULL;
	char node[INET_ADDRSTRLEN];
	int rc;

	if (!hints) {
		return -ENOMEM;
	}
	inet_ntop(AF_INET, &rh_core_nic(nic)->ipv4, node, sizeof(node));
	rc = -FI_ENODATA;
	if (getenv("FI_PROVIDER")) {
		/* the user's choice: libfabric applies it */
		rc = ofi_lf_getinfo(OFI_API, node, NULL, FI_SOURCE, hints, &list);
	}
	/* Else only the providers that offer FI_EP_MSG + FI_RMA, the RDMA one first: asking
	 * for them by name keeps libfabric from running every other provider's getinfo (psm2,
	 * psm3, opx, efa, ... initialise their libraries and devices there). */
	for (size_t k = 0; rc && !getenv("FI_PROVIDER") && k < 2; k++) {
		static const char *const usable[] = { "verbs", "tcp" };

		free(hints->fabric_attr->prov_name);
		hints->fabric_attr->prov_name = strdup(usable[k]);
		rc = ofi_lf_getinfo(OFI_API, node, NULL, FI_SOURCE, hints, &list);
	}
	ofi_lf_freeinfo(hints);
	if (rc) {
		WARN("ofi: no libfabric provider with FI_EP_MSG + FI_RMA for %s (%s): %s",
		     rh_core_nic(nic)->ifname, node, ofi_lf_strerror(-rc));
		return rc < 0 ? rc : -ENODEV;
	}
	/* Prefer the domain named after the NIC (tcp provider: the ifname), else the first. */
	for (struct fi_info *i = list; i; i = i->next) {
		if (i->domain_attr->name &&
		    !strcmp(i->domain_attr->name, rh_core_nic(nic)->ifname)) {
			pick = i;
			break;
		}
	}
	if (!pick) {
		pick = list;
	}
	d->info = ofi_lf_dupinfo(pick);
	ofi_lf_freeinfo(list);
	if (!d->info) {
		return -ENOMEM;
	}
	d->mr_mode = d->info->domain_attr->mr_mode;
	d->rx_cq_data = d->info->mode & FI_RX_CQ_DATA;
	d->imm = ofi_imm_layout_for(d->info->domain_attr->cq_data_size);
	if (!d->imm) {
		WARN("ofi: the %s domain %s carries %zu bytes of CQ data, the lane needs 4",
		     d->info->fabric_attr->prov_name, d->info->domain_attr->name,
		     d->info->domain_attr->cq_data_size);
		return -ENOTSUP;
	}
	pthread_mutex_init(&d->rc_mu, NULL);
	d->next_key = 1;
	rc = ofi_lf_fabric(d->info->fabric_attr, &d->fabric, NULL);
	if (!rc) {
		rc = fi_domain(d->fabric, d->info, &d->domain, NULL);
	}
	if (rc) {
		WARN("ofi: cannot open the %s domain %s for %s: %s",
		     d->info->fabric_attr->prov_name, d->info->domain_attr->name,
		     rh_core_nic(nic)->ifname, ofi_lf_strerror(-rc));
		return rc;
	}
	nic_attrs(nic, d->info);
	d->ok = true;
	INFO("ofi: NIC %s -> provider %s, fabric %s, domain %s (mr_mode 0x%llx%s)",
	     rh_core_nic(nic)->ifname, d->info->fabric_attr->prov_name, d->info->fabric_attr->name,
	     d->info->domain_attr->name, (unsigned long long)d->mr_mode,
	     d->rx_cq_data ? ", FI_RX_CQ_DATA" : "");
	return 0;
}

/* The registration cache: one memory region per page range per domain, made the first time a
 * lane of the domain needs it and kept until the application deregisters the buffer. */
int ofi_mr_get(struct ofi_dom *d, const void *addr, size_t len, uint64_t *raddr, uint64_t *key,
	       void **desc)
{
	struct ofi_rc_entry *ent, n = { 0 };
	int rc = 0;

	pthread_mutex_lock(&d->rc_mu);
	ent = ofi_rc_find(&d->rc, (uintptr_t)addr, len);
	if (!ent) {
		struct fid_mr *mr;

		uint64_t t0 = ofi_us();

		ofi_rc_range((uintptr_t)addr, len, &n.lo, &n.hi);
		rc = fi_mr_reg(d->domain, (void *)n.lo, n.hi - n.lo,
			       FI_REMOTE_WRITE | FI_WRITE | FI_SEND | FI_RECV, 0,
			       (d->mr_mode & FI_MR_PROV_KEY) ? 0 : ofi_dom_key(d), 0, &mr, NULL);
		ofi_slow_check(t0, "fi_mr_reg (a receive buffer)", NULL);
		if (rc) {
			WARN("ofi: fi_mr_reg of %zu bytes failed: %s", (size_t)(n.hi - n.lo),
			     ofi_lf_strerror(-rc));
			goto out;
		}
		n.mr = mr;
		n.key = fi_mr_key(mr);
		n.desc = fi_mr_desc(mr);
		rc = ofi_rc_insert(&d->rc, &n);
		if (rc < 0) {
			fi_close(&mr->fid);
			goto out;
		}
		ent = &d->rc.e[d->rc.n - 1];
	}
	*raddr = (d->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)addr :
						  (uint64_t)((uintptr_t)addr - ent->lo);
	*key = ent->key;
	*desc = ent->desc;
out:
	pthread_mutex_unlock(&d->rc_mu);
	return rc < 0 ? rc : (rc ? -EIO : 0);
}

/* Plugin stop (no endpoint left): registrations, passive endpoint, domain, fabric. */
void ofi_dom_close(int nic)
{
	struct ofi_dom *d = &ofi_doms[nic];
	struct ofi_rc_entry out[16];
	int n;

	if (d->info) {
		pthread_mutex_lock(&d->rc_mu);
		do {
			n = ofi_rc_take(&d->rc, 0, UINTPTR_MAX, out, 16);
			for (int k = 0; k < n; k++) {
				fi_close(&((struct fid_mr *)out[k].mr)->fid);
			}
		} while (n == 16);
		ofi_rc_free(&d->rc);
		pthread_mutex_unlock(&d->rc_mu);
		pthread_mutex_destroy(&d->rc_mu);
	}
	if (d->pep) {
		fi_close(&d->pep->fid);
	}
	if (d->peq) {
		fi_close(&d->peq->fid);
	}
	if (d->domain) {
		fi_close(&d->domain->fid);
	}
	if (d->fabric) {
		fi_close(&d->fabric->fid);
	}
	if (d->info) {
		ofi_lf_freeinfo(d->info);
	}
	memset(d, 0, sizeof(*d));
}

void ofi_forget(const void *addr, size_t size)
{
	struct ofi_rc_entry out[16];
	uintptr_t lo, hi;

	ofi_rc_range((uintptr_t)addr, size, &lo, &hi);
	for (int i = 0; i < rh_core_nic_count(); i++) {
		struct ofi_dom *d = &ofi_doms[i];
		int n;

		if (!d->ok) {
			continue;
		}
		pthread_mutex_lock(&d->rc_mu);
		do {
			n = ofi_rc_take(&d->rc, lo, hi, out, 16);
			for (int k = 0; k < n; k++) {
				fi_close(&((struct fid_mr *)out[k].mr)->fid);
			}
		} while (n == 16);
		pthread_mutex_unlock(&d->rc_mu);
	}
}
