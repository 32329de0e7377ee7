/* SPDX-License-Identifier: Apache-2.0 */
#include "match.h"

int rh_match_tag(const struct rh_cts_slot *recs, int nrecs, int32_t tag, int *slot)
{
	for (int i = 0; i < nrecs; i++) {
		const struct rh_cts_slot *r = &recs[i];
		uint8_t all = (uint8_t)((1u << r->cts.n) - 1);

		if (!r->present) {
			return -1;
		}
		if ((r->matched & all) == all) {
			continue;
		}
		/* First (multi-)receive with free slots: the send must fit one of them. */
		for (int s = 0; s < r->cts.n; s++) {
			if (!(r->matched & (1u << s)) && r->cts.tags[s] == tag) {
				*slot = s;
				return i;
			}
		}
		return -1;
	}
	return -1;
}
