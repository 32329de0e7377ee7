/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Backup pairs for a connection: the agent's plan for its original NIC when there is one,
 * else the core's own ranking (rank.c: rail rule, distance limit, load), never a pair in use
 * or one that failed recently; and the pair of a new connection, avoiding NICs known down.
 * failover.c opens the lanes. All functions run with the connection lock held.
 */
#include <errno.h>

#include "../log.h"
#include "../param.h"
#include "conn.h"
#include "health.h"
#include "rank.h"

static void fill_rank_nics(struct rh_conn *c, struct rh_rank_nic *loc, struct rh_rank_nic *rem)
{
	for (int i = 0; i < rh_g.nnics; i++) {
		loc[i].rail = rh_g.nics[i].rail;
		loc[i].numa = rh_g.nics[i].numa;
		loc[i].pci = rh_g.nics[i].pci;
		loc[i].up = rh_nic_is_up(i);
		loc[i].load = 0;
	}
	for (int i = 0; i < c->nrnics; i++) {
		rem[i].rail = c->rnics[i].rail;
		rem[i].numa = c->rnics[i].numa;
		rem[i].pci = c->rnics[i].pci;
		rem[i].up = c->rnics[i].up || c->rnics[i].port;
		rem[i].load = 0;
	}
	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *l = c->lanes[i];

		if (l->state != RH_LANE_DEAD && !l->primary) {
			loc[l->lnic].load++;
			rem[l->rnic].load++;
		}
	}
}

/* Rank candidate pairs for this connection (excluding pairs in use and, unless
 * ignore_bad, pairs that failed recently). */
int rh_backup_rank(struct rh_conn *c, struct rh_pair *out, int max, bool ignore_bad)
{
	struct rh_rank_nic loc[RH_MAX_NICS], rem[RH_MAX_NICS];
	bool excl[RH_MAX_NICS * RH_MAX_NICS] = { 0 };
	uint64_t peers[RH_RAIL_PEER_MAX + 1];
	struct rh_rank_in in;
	uint64_t now = rh_now_ms();

	rh_parse_rail_rule(__atomic_load_n(&rh_param.RAIL_RULE, __ATOMIC_RELAXED), &in.rule);
	for (int r = 0; r <= RH_RAIL_PEER_MAX; r++) {
		peers[r] = __atomic_load_n(&rh_param_rail_peers[r], __ATOMIC_RELAXED);
	}
	in.rail_peers = peers;
	rh_parse_dist(__atomic_load_n(&rh_param.DISTANCE_LIMIT, __ATOMIC_RELAXED), &in.limit);
	fill_rank_nics(c, loc, rem);
	for (int l = 0; l < rh_g.nnics; l++) {
		for (int r = 0; r < c->nrnics; r++) {
			excl[l * c->nrnics + r] = !ignore_bad && c->fo.bad_until_ms[l][r] > now;
		}
	}
	for (int i = 0; i < c->nlanes; i++) {
		struct rh_lane *l = c->lanes[i];

		/* a lane whose pair lies outside the tables (the peer's NIC table changed under
		 * it, or its hello named NICs that do not exist) excludes nothing */
		if (l->state != RH_LANE_DEAD && !l->bye_sent && l->lnic >= 0 &&
		    l->lnic < rh_g.nnics && l->rnic >= 0 && l->rnic < c->nrnics) {
			excl[l->lnic * c->nrnics + l->rnic] = true;
		}
	}
	in.local = loc;
	in.nlocal = rh_g.nnics;
	in.remote = rem;
	in.nremote = c->nrnics;
	in.orig_local = c->lnic_orig;
	in.orig_remote = c->rnic_orig;
	in.exclude = excl;
	return rh_rank_pairs(&in, out, max);
}

int rh_backup_initial_pair(struct rh_conn *c, int *lnic, int *rnic)
{
	struct rh_pair p[1];
	uint64_t now = rh_now_ms();

	if (rh_nic_is_up(c->lnic_orig) && c->fo.bad_until_ms[c->lnic_orig][c->rnic_orig] <= now) {
		*lnic = c->lnic_orig;
		*rnic = c->rnic_orig;
		return 0;
	}
	if (rh_backup_rank(c, p, 1, false) < 1) {
		WARN("conn %016llx: no usable NIC pair for a new connection",
		     (unsigned long long)c->id);
		return rh_any_local_up() ? -EHOSTUNREACH : -ENETDOWN;
	}
	INFO("conn %016llx: pair %s -> peer NIC %d is down or unreachable, connecting %s -> peer "
	     "NIC %d instead",
	     (unsigned long long)c->id, rh_g.nics[c->lnic_orig].ifname, c->rnic_orig,
	     rh_g.nics[p[0].local].ifname, p[0].remote);
	*lnic = p[0].local;
	*rnic = p[0].remote;
	return 0;
}

/* The agent's plan for the original local NIC, applied to this connection's peer: pairs whose
 * local NIC is up and whose pair is neither in use nor known bad. Empty without a plan. */
int rh_backup_plan_pairs(struct rh_conn *c, struct rh_pair *out, int max)
{
	struct rh_plan_entry e[16];
	uint64_t now = rh_now_ms();
	int ne = rh_health_plan_for(c->lnic_orig, e, 16), n = 0, wmax = 0;

	/* Plan weights are shares (the agent writes share x 10000); the ranking's weights are
	 * 1..4 (4 = RAILHOP_BACKUP_STREAMS streams): the largest share maps to 4, the others in
	 * proportion, a zero share (a fallback) to 1. */
	for (int i = 0; i < ne; i++) {
		wmax = e[i].weight > wmax ? e[i].weight : wmax;
	}

	for (int i = 0; i < ne && n < max; i++) {
		int best = -1;

		if (e[i].lnic >= rh_g.nnics || !rh_nic_is_up(e[i].lnic)) {
			continue;
		}
		for (int r = 0; r < c->nrnics; r++) {
			bool used = c->fo.bad_until_ms[e[i].lnic][r] > now;

			if (e[i].remote_rail >= 0 && c->rnics[r].rail != e[i].remote_rail) {
				continue;
			}
			for (int k = 0; k < c->nlanes; k++) {
				used |= c->lanes[k]->state != RH_LANE_DEAD &&
					!c->lanes[k]->bye_sent && c->lanes[k]->lnic == e[i].lnic &&
					c->lanes[k]->rnic == r;
			}
			for (int k = 0; k < n; k++) {
				used |= out[k].local == e[i].lnic && out[k].remote == r;
			}
			if (!used && (best < 0 || r == c->rnic_orig)) {
				best = r;
			}
		}
		if (best >= 0) {
			out[n].local = e[i].lnic;
			out[n].remote = best;
			out[n].dist = RH_DIST_NODE;
			out[n].share = (uint32_t)e[i].weight;
			out[n].weight = wmax > 0 ? (4 * e[i].weight + wmax / 2) / wmax : 1;
			if (out[n].weight < 1) {
				out[n].weight = 1;
			}
			n++;
		}
	}
	if (n) {
		INFO("conn %016llx: %d backup pair(s) from the agent's plan",
		     (unsigned long long)c->id, n);
	}
	return n;
}

/* A lane on backup pair p (not opened yet): the streams of its weight, its plan share. A
 * standby is sized as the backup lane a move would open there, so a promotion loses nothing. */
struct rh_lane *rh_backup_add_lane(struct rh_conn *c, const struct rh_pair *p, bool standby)
{
	int ns = (int)rh_param.BACKUP_STREAMS * p->weight / 4;
	struct rh_lane *l;

	if (ns < 1) {
		ns = 1;
	}
	l = rh_conn_add_lane(c, c->next_lane_id, p->local, p->remote, ns, true);
	if (!l) {
		return NULL;
	}
	c->next_lane_id += 2;
	l->standby = standby;
	l->weight = p->weight;
	l->share = p->share;
	l->share_bytes = 0;
	l->share_wait = false;
	return l;
}
