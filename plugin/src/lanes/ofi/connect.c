/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi lanes, connecting: the endpoints this side opens (lane streams, probes) are set up and
 * connected by a few connector threads, then handed to the I/O thread (ofi_pending).
 *
 * Why not on the I/O thread: the verbs provider resolves the peer's address and route inside
 * fi_endpoint, synchronously (rdma_cm, up to its resolve timeout). Towards a pair whose remote
 * end is dead (carrier lost at the far end, a blackhole) every attempt fails only after that
 * timeout, and a fail-back probe makes one every backoff. On the I/O thread each held every
 * lane of every connection of the process: in the VM lab (Soft-RoCE, emulated CPUs) the sender
 * logged "cannot open an endpoint from nic0: Connection timed out" every 2-3 s for the whole
 * outage, the healthy rails' lanes saw no progress, their backups' handshakes timed out, and
 * connections escalated with "no compatible NIC pair left".
 */
#include "ofi.h"

static pthread_t threads[OFI_CONNECTORS];
static int nthreads;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static struct ofi_ep *q_head, *q_tail; /* under ofi_pend_mu, oldest first */
static bool stopping; /* under ofi_pend_mu */

/* Hand a new endpoint to a connector thread (any thread). */
void ofi_ep_push(struct ofi_ep *e)
{
	pthread_mutex_lock(&ofi_pend_mu);
	e->next = NULL;
	if (q_tail) {
		q_tail->next = e;
	} else {
		q_head = e;
	}
	q_tail = e;
	pthread_cond_signal(&cv);
	pthread_mutex_unlock(&ofi_pend_mu);
}

/* The I/O thread takes it over, connected or with the error that stopped it. */
static void hand_over(struct ofi_ep *e)
{
	pthread_mutex_lock(&ofi_pend_mu);
	e->next = ofi_pending;
	ofi_pending = e;
	pthread_mutex_unlock(&ofi_pend_mu);
	ofi_io_kick();
}

static void *connector_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&ofi_pend_mu);
	for (;;) {
		struct ofi_ep *e;

		while (!q_head && !stopping) {
			pthread_cond_wait(&cv, &ofi_pend_mu);
		}
		if (stopping) {
			break;
		}
		e = q_head;
		q_head = e->next;
		if (!q_head) {
			q_tail = NULL;
		}
		pthread_mutex_unlock(&ofi_pend_mu);
		/* a lane fenced before its turn: nothing to connect, the I/O thread closes it */
		e->connect_rc = atomic_load(&e->fenced) ? -ECANCELED : ofi_ep_connect(e);
		hand_over(e);
		pthread_mutex_lock(&ofi_pend_mu);
	}
	pthread_mutex_unlock(&ofi_pend_mu);
	return NULL;
}

int ofi_connectors_start(void)
{
	pthread_mutex_lock(&ofi_pend_mu);
	stopping = false;
	pthread_mutex_unlock(&ofi_pend_mu);
	for (nthreads = 0; nthreads < OFI_CONNECTORS; nthreads++) {
		int rc = pthread_create(&threads[nthreads], NULL, connector_main, NULL);

		if (rc != 0) {
			return -rc;
		}
		pthread_setname_np(threads[nthreads], "railhop-ofi-conn");
	}
	return 0;
}

/* Join the connector threads (each finishes the connect it is in: bounded by the provider's
 * resolve and connect timeouts); endpoints still queued move to ofi_pending, where the stop
 * closes them with the rest. */
void ofi_connectors_stop(void)
{
	pthread_mutex_lock(&ofi_pend_mu);
	stopping = true;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&ofi_pend_mu);
	for (int i = 0; i < nthreads; i++) {
		pthread_join(threads[i], NULL);
	}
	nthreads = 0;
	pthread_mutex_lock(&ofi_pend_mu);
	while (q_head) {
		struct ofi_ep *e = q_head;

		q_head = e->next;
		e->next = ofi_pending;
		ofi_pending = e;
	}
	q_tail = NULL;
	pthread_mutex_unlock(&ofi_pend_mu);
}
