/* SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>

#include "rank.h"

/* Split a /sys/devices/pciDDDD:BB/... path into its components after "/sys/devices/". */
static int pci_components(const char *path, const char *comp[], int len[], int max)
{
	const char *p = strstr(path, "/devices/");
	int n = 0;

	if (!p) {
		return 0;
	}
	p += strlen("/devices/");
	while (*p && n < max) {
		const char *e = strchr(p, '/');
		int l = e ? (int)(e - p) : (int)strlen(p);

		comp[n] = p;
		len[n] = l;
		n++;
		if (!e) {
			break;
		}
		p = e + 1;
	}
	return n;
}

enum rh_dist rh_nic_distance(const char *pci_a, int numa_a, const char *pci_b, int numa_b)
{
	const char *ca[32], *cb[32];
	int la[32], lb[32], na, nb, common = 0;

	if (pci_a && pci_b && *pci_a && *pci_b) {
		na = pci_components(pci_a, ca, la, 32);
		nb = pci_components(pci_b, cb, lb, 32);
		if (na >= 2 && nb >= 2 && strncmp(ca[0], "pci", 3) == 0) {
			while (common < na && common < nb && la[common] == lb[common] &&
			       !strncmp(ca[common], cb[common], la[common])) {
				common++;
			}
			if (common == na && common == nb) {
				return RH_DIST_PIX; /* same device (another port) */
			}
			if (common == 0) {
				/* Different host bridges: NUMA decides. */
				return numa_a == numa_b ? RH_DIST_NODE : RH_DIST_SYS;
			}
			/* Same parent bridge: PIX; share a switch below the root port: PXB. */
			if (common == na - 1 && common == nb - 1 && common >= 2) {
				return RH_DIST_PIX;
			}
			if (common >= 2) {
				return RH_DIST_PXB;
			}
			return RH_DIST_PHB;
		}
	}
	return numa_a == numa_b ? RH_DIST_NODE : RH_DIST_SYS;
}

struct scored {
	struct rh_pair p;
	int key[5];
};

static int cmp_scored(const void *a, const void *b)
{
	const struct scored *x = a, *y = b;

	for (int i = 0; i < 5; i++) {
		if (x->key[i] != y->key[i]) {
			return x->key[i] < y->key[i] ? -1 : 1;
		}
	}
	return 0;
}

/* The rail rule: may a lane join a local NIC on rail lr with a remote NIC on rail rr? */
static bool rails_allowed(const struct rh_rank_in *in, int lr, int rr)
{
	switch (in->rule) {
	case RH_RAIL_ANY:
		return true;
	case RH_RAIL_ALLOWED_PAIRS:
		if (lr == rr) {
			return true;
		}
		return in->rail_peers && lr >= 0 && lr <= RH_RAIL_PEER_MAX && rr >= 0 &&
		       rr <= RH_RAIL_PEER_MAX && (in->rail_peers[lr] >> rr & 1);
	case RH_RAIL_SAME:
	default:
		return lr == rr;
	}
}

int rh_rank_pairs(const struct rh_rank_in *in, struct rh_pair *out, int max)
{
	int ncand = 0, nout = 0;
	struct scored *c;
	const struct rh_rank_nic *ol = NULL, *orr = NULL;

	if (in->nlocal <= 0 || in->nremote <= 0 || max <= 0) {
		return 0;
	}
	c = calloc((size_t)in->nlocal * in->nremote, sizeof(*c));
	if (!c) {
		return 0;
	}
	if (in->orig_local >= 0 && in->orig_local < in->nlocal) {
		ol = &in->local[in->orig_local];
	}
	if (in->orig_remote >= 0 && in->orig_remote < in->nremote) {
		orr = &in->remote[in->orig_remote];
	}
	for (int l = 0; l < in->nlocal; l++) {
		for (int r = 0; r < in->nremote; r++) {
			const struct rh_rank_nic *a = &in->local[l], *b = &in->remote[r];
			enum rh_dist dl = RH_DIST_PIX, dr = RH_DIST_PIX;
			struct scored *s;

			if (!a->up || !b->up || (in->exclude && in->exclude[l * in->nremote + r])) {
				continue;
			}
			if (!rails_allowed(in, a->rail, b->rail)) {
				continue;
			}
			if (ol && l != in->orig_local) {
				dl = rh_nic_distance(ol->pci, ol->numa, a->pci, a->numa);
			}
			if (orr && r != in->orig_remote) {
				dr = rh_nic_distance(orr->pci, orr->numa, b->pci, b->numa);
			}
			if (dl > in->limit || dr > in->limit) {
				continue;
			}
			s = &c[ncand++];
			s->p.local = l;
			s->p.remote = r;
			s->p.dist = dl > dr ? dl : dr;
			s->p.weight = 1;
			s->p.share = 0;
			/* Nearest first, then least loaded, then the original's rail, then order. */
			s->key[0] = s->p.dist;
			s->key[1] = a->load + b->load;
			s->key[2] = (ol && a->rail == ol->rail) ? 0 : 1;
			s->key[3] = l;
			s->key[4] = r;
		}
	}
	qsort(c, ncand, sizeof(*c), cmp_scored);
	/* Spread: first one pair per distinct local and remote NIC, then the rest. */
	for (int pass = 0; pass < 2 && nout < max; pass++) {
		for (int i = 0; i < ncand && nout < max; i++) {
			bool lused = false, rused = false, taken = false;

			for (int j = 0; j < nout; j++) {
				lused |= out[j].local == c[i].p.local;
				rused |= out[j].remote == c[i].p.remote;
				taken |= out[j].local == c[i].p.local &&
					 out[j].remote == c[i].p.remote;
			}
			if (taken || (pass == 0 && (lused || rused))) {
				continue;
			}
			out[nout] = c[i].p;
			/* Weight: healthy bandwidth share; nearer and less loaded get more. */
			out[nout].weight = 4 - (c[i].p.dist >= RH_DIST_NODE) - (c[i].key[1] > 0);
			nout++;
		}
	}
	free(c);
	return nout;
}
