/* SPDX-License-Identifier: Apache-2.0 */
/* Completion queues (verbs.h): successful completions to the data path, errors to a verdict. */
#include <errno.h>

#include "verbs.h"

#define VERBS_POLL_BATCH 16

int verbs_cq_drain(struct ibv_cq *cq, int max, verbs_wc_fn fn, void *arg,
		   struct verbs_poll_fail *fail, int *nfail)
{
	struct ibv_wc wc[VERBS_POLL_BATCH];
	int total = 0;

	*nfail = 0;
	while (total < max) {
		int want = max - total < VERBS_POLL_BATCH ? max - total : VERBS_POLL_BATCH;
		int n = ibv_poll_cq(cq, want, wc);

		if (n < 0) {
			return -EIO;
		}
		for (int i = 0; i < n; i++) {
			if (wc[i].status == IBV_WC_SUCCESS) {
				fn(arg, &wc[i]);
				continue;
			}
			if ((*nfail)++ == 0) {
				fail->qp_num = wc[i].qp_num;
				fail->wr_id = wc[i].wr_id;
				fail->status = wc[i].status;
				fail->v = verbs_wc_verdict(wc[i].status);
			}
		}
		total += n;
		if (n < want) {
			break;
		}
	}
	return total;
}
