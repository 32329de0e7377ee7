/* SPDX-License-Identifier: GPL-2.0 */
/*
 * rh_ringbuf.c - the ring buffer every railhop probe writes its records to, its drop counter, and
 * rh_reserve(). Not compiled alone: the loader (railhop.sources.compose) puts this text in front
 * of each probe file whose ProbeSpec names it as a prelude, because bcc rewrites map calls
 * (rh_events.ringbuf_reserve, rh_drops.lookup) only in the text it compiles, never in an
 * #included header.
 */
#ifndef RH_COMPOSED
#error "rh_ringbuf.c is put in front of a probe by the railhop loader, not compiled alone"
#endif
#include "railhop_events.h"

#ifndef RH_RINGBUF_PAGES
#define RH_RINGBUF_PAGES 16
#endif

BPF_RINGBUF_OUTPUT(rh_events, RH_RINGBUF_PAGES);
BPF_ARRAY(rh_drops, u64, 1);

/*
 * A zeroed record of `size` bytes with its header filled in, or 0 (counted in rh_drops) when the
 * ring buffer is full. `size` must be a compile-time constant: use RH_RESERVE().
 */
static __always_inline void *rh_reserve(__u64 size, __u32 kind, __u32 hook)
{
	struct rh_hdr *h = rh_events.ringbuf_reserve(size);
	int zero = 0;
	u64 *drops;

	if (!h) {
		drops = rh_drops.lookup(&zero);
		if (drops) {
			__sync_fetch_and_add(drops, 1);
		}
		return 0;
	}
	__builtin_memset(h, 0, size);
	h->ts_ns = bpf_ktime_get_ns();
	h->kind = kind;
	h->hook = hook;
	return h;
}

#define RH_RESERVE(type, kind, hook) ((type *)rh_reserve(sizeof(type), (kind), (hook)))

static __always_inline void rh_submit(void *rec)
{
	rh_events.ringbuf_submit(rec, 0);
}
