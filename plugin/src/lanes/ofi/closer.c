/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi lanes, closing: the provider objects of a closed endpoint (endpoint, CQ, EQ, the bounce
 * buffers' registration) are released by a few closer threads, not by the I/O thread.
 *
 * Why: the verbs provider's fi_close of an endpoint towards a peer that does not answer blocks
 * until rdma_cm gives up on it. Measured in the VM lab (Soft-RoCE, a blackhole on one rail,
 * bench/vm_failover.py): fi_close of a probe endpoint still connecting to the dead pair held the
 * I/O thread for 21.7 s, of fenced lane endpoints 0.1-2.6 s, a CQ's 0.9 s; while it blocked no
 * endpoint of the process was progressed (healthy rails included) and no connection request
 * or event was read, so the backups' handshakes and the re-probe went unanswered and the move
 * escalated ("no NIC pair left to try").
 *
 * The I/O thread marks the endpoint closed (it reads and posts nothing more on it), takes its
 * wait fds out of its epoll set and queues the objects here (a bounded queue: when it is full,
 * or no closer runs, the I/O thread closes them itself, as before). A closer closes them and
 * sets e->released; only then does the I/O thread finish the close (ofi_ep_closed: the io
 * reference, the probe's report, the detach from the lane) and free the endpoint, so rule 1 of
 * the fence holds (nothing of the application's memory is released while the provider may still
 * place into it) and a lane endpoint being closed still holds the receiver's gate (rule 3).
 */
#include "ofi.h" /* first: _GNU_SOURCE */

#include <dlfcn.h>
#include <time.h>

struct close_req {
	struct ofi_ep *e;
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_eq *eq;
	struct fid_mr *mr;
	struct close_req *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static pthread_t threads[OFI_CLOSERS];
static int nthreads;
static struct close_req *q_head, *q_tail; /* under mu, oldest first */
static int q_len; /* under mu: queued, not yet taken by a closer */
static bool running; /* under mu: closers take requests */
static unsigned gen; /* under mu: a closer of an older generation was abandoned */

/* The provider objects of e, in the order they must go (the endpoint before what it is bound
 * to). Any thread; the caller owns them. */
static void release(struct fid_ep *ep, struct fid_cq *cq, struct fid_eq *eq, struct fid_mr *mr,
		    const struct ofi_ep *e)
{
	uint64_t t0 = ofi_us();

	if (ep) {
		fi_close(&ep->fid);
	}
	if (cq) {
		fi_close(&cq->fid);
	}
	if (eq) {
		fi_close(&eq->fid);
	}
	if (mr) {
		fi_close(&mr->fid);
	}
	if (ofi_us() - t0 > OFI_SLOW_US) {
		INFO("ofi: closing an endpoint of nic%d (kind %d) took %llu ms", e->nic,
		     (int)e->kind, (unsigned long long)((ofi_us() - t0) / 1000));
	}
}

static void take(struct ofi_ep *e, struct close_req *r)
{
	r->e = e;
	r->ep = e->ep;
	r->cq = e->cq;
	r->eq = e->eq;
	r->mr = e->arena_mr;
	e->ep = NULL;
	e->cq = NULL;
	e->eq = NULL;
	e->arena_mr = NULL;
}

/* I/O thread (or the stop, with the I/O thread joined): close e's provider objects now. */
void ofi_ep_release_now(struct ofi_ep *e)
{
	struct close_req r;

	take(e, &r);
	release(r.ep, r.cq, r.eq, r.mr, e);
}

/* I/O thread: hand e's provider objects to a closer. False (nothing taken) when no closer runs
 * or the queue is full: the caller closes them itself. */
bool ofi_closer_push(struct ofi_ep *e)
{
	struct close_req *r = malloc(sizeof(*r));

	if (!r) {
		return false;
	}
	pthread_mutex_lock(&mu);
	if (!running || q_len >= OFI_CLOSE_QUEUE) {
		pthread_mutex_unlock(&mu);
		free(r);
		return false;
	}
	take(e, r);
	r->next = NULL;
	if (q_tail) {
		q_tail->next = r;
	} else {
		q_head = r;
	}
	q_tail = r;
	q_len++;
	pthread_cond_signal(&cv);
	pthread_mutex_unlock(&mu);
	return true;
}

static void *closer_main(void *arg)
{
	unsigned my_gen = (unsigned)(uintptr_t)arg;

	pthread_mutex_lock(&mu);
	for (;;) {
		struct close_req *r;

		while (!q_head && running && gen == my_gen) {
			pthread_cond_wait(&cv, &mu);
		}
		if (!q_head || gen != my_gen) {
			break; /* stopped with nothing left, or abandoned */
		}
		r = q_head;
		q_head = r->next;
		if (!q_head) {
			q_tail = NULL;
		}
		q_len--;
		pthread_mutex_unlock(&mu);
		release(r->ep, r->cq, r->eq, r->mr, r->e);
		pthread_mutex_lock(&mu);
		if (gen != my_gen) {
			free(r); /* abandoned at the stop: the endpoint is leaked, nobody to tell */
			break;
		}
		atomic_store_explicit(&r->e->released, true, memory_order_release);
		free(r);
		ofi_io_kick(); /* under mu: the stop closes the eventfd only after the join */
	}
	pthread_mutex_unlock(&mu);
	return NULL;
}

int ofi_closers_start(void)
{
	pthread_mutex_lock(&mu);
	running = true;
	gen++;
	pthread_mutex_unlock(&mu);
	for (nthreads = 0; nthreads < OFI_CLOSERS; nthreads++) {
		int rc = pthread_create(&threads[nthreads], NULL, closer_main,
					(void *)(uintptr_t)gen);

		if (rc != 0) {
			return -rc;
		}
		pthread_setname_np(threads[nthreads], "railhop-ofi-cls");
	}
	return 0;
}

/* Keep this plugin mapped for good: a closer abandoned inside fi_close returns into its code. */
static void pin_self(void)
{
	Dl_info di;

	if (dladdr((void *)pin_self, &di) && di.dli_fname &&
	    !dlopen(di.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) {
		WARN("ofi: cannot pin the plugin in memory: %s", dlerror());
	}
}

/* Let the closers finish the queue and join them, at most OFI_CLOSER_JOIN_MS in all. Returns
 * false when one is still inside the provider at the bound: it is abandoned (it exits when its
 * fi_close returns, touching nothing of ours), its endpoint keeps released false, and the
 * caller must leave libfabric and the domains alone. */
bool ofi_closers_stop(void)
{
	bool joined[OFI_CLOSERS] = { false };
	struct timespec dl;
	bool all = true;

	pthread_mutex_lock(&mu);
	running = false;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += OFI_CLOSER_JOIN_MS / 1000;
	for (int i = 0; i < nthreads; i++) {
		joined[i] = pthread_timedjoin_np(threads[i], NULL, &dl) == 0;
		all &= joined[i];
	}
	pthread_mutex_lock(&mu);
	if (!all) {
		WARN("ofi: a provider close still blocks %d s into the stop: leaving it (and "
		     "libfabric) behind",
		     OFI_CLOSER_JOIN_MS / 1000);
		gen++; /* abandon them */
		for (int i = 0; i < nthreads; i++) {
			if (!joined[i]) {
				pthread_detach(threads[i]);
			}
		}
		pin_self();
	}
	nthreads = 0;
	/* requests no closer took (only when abandoned): their endpoints stay unreleased */
	while (q_head) {
		struct close_req *r = q_head;

		q_head = r->next;
		free(r);
	}
	q_tail = NULL;
	q_len = 0;
	pthread_mutex_unlock(&mu);
	return all;
}
