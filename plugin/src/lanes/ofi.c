/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libfabric lanes: each lane is a control endpoint and 1..OFI_MAX_DATA data endpoints (FI_EP_MSG
 * with FI_RMA) between the two NICs' provider domains (one domain per NIC, matched by the NIC's
 * IPv4 address). The same
 * code runs over the tcp provider (CI) and RDMA providers offering FI_EP_MSG + FI_RMA (verbs).
 *
 * Messages (fi_send into pre-posted bounce buffers): the core's control frames (CTS, ACK,
 * RESUME, FAILREQ, BYE), the handshake (HELLO/HELLO_ACK, as on TCP), and the lane's own
 * ADV_REQ/ADV/EPOCH/DATA0 (ofi_imm.h). DATA moves one-sided: the sender's transport asks the
 * receiver's transport for an advert of (seq, slot) on the lane that carries the chunk
 * (ADV_REQ); the receiver registers the posted buffer in that lane's domain (lazily, through a
 * per-domain registration cache, so a buffer is registered once per domain and on a backup
 * NIC only when a lane there carries it) and answers with (address, key, size); the sender
 * then writes each chunk with fi_writedata, the 64-bit remote CQ data naming (seq, slot,
 * chunk, epoch). The receiver's CQ reports the completion; the transport rebuilds the frame
 * header and hands it to the core (rh_core_rx_data must return exactly the advertised
 * buffer + offset: the data is already in place, nothing is copied).
 *
 * THE FENCE. A write is placed by the receiver's provider, not by our code, so dropping stale
 * frames (epochs) is not enough: a write still in flight after a move must not land in a
 * buffer that was completed by the replay and re-posted by the application. Four rules:
 *  1. A fenced lane's endpoints are closed (fi_close) by the I/O thread before anything else
 *     it does; once closed the provider places nothing more through them. Every lane
 *     endpoint holds one core io reference (rh_core_io_enter) from creation until that
 *     close, so close_conn() cannot return (and the application cannot free a buffer) while
 *     a provider may still read or write user memory through the lane.
 *  2. After a resume at epoch M (the receiver's rx_min_epoch, the sender's resume_epoch) the
 *     sender drops every chunk of an older epoch it has not written yet and sends an EPOCH(M)
 *     marker on every endpoint of the connection; the provider orders a send after earlier
 *     writes on the same endpoint (FI_ORDER_SAW), so the marker arrives after the last
 *     old-epoch write of that endpoint has been placed.
 *  3. The receiver gives adverts of epoch >= M (every replayed chunk needs one; ADV_REQs of
 *     older epochs are answered STALE) only while the gate is open: no fenced endpoint of the
 *     connection is still open and every open endpoint of a lane that advertised before M
 *     has passed its marker (an advert is good for writes on every endpoint of its lane). A replayed chunk therefore cannot complete a receive (and free its buffer
 *     for reuse) while an older write to that buffer may still land. An endpoint that does not
 *     pass its marker within the completion timeout is failed (and so closed).
 *  4. The core replays an unacknowledged message from its first chunk, also the chunks the
 *     receiver already holds; such a write, issued at the new epoch, would pass the gate and
 *     could land after the receive completed. Each advert therefore carries the receiver's
 *     placed-chunk map (read after the gate) and the sender never writes those chunks again:
 *     every chunk of a receive is then written exactly once per epoch, so no write to its
 *     buffer is in flight when it completes.
 *
 * Threading: one I/O thread owns every endpoint, CQ and EQ (it is the only caller of
 * fi_* on them); lane_ops callbacks (conn lock held) only set flags and wake it. Progress is
 * the provider's (FI_PROGRESS_AUTO) or driven by this thread's CQ/EQ reads (manual).
 *
 * Memory: host memory only (NCCL_PTR_HOST). A provider reporting FI_HMEM with CUDA would let
 * the same registration path take device buffers (FI_MR_HMEM, fi_mr_regattr with iface CUDA
 * or a dmabuf fd); that is not built here (no such provider to test against).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "../core/conn.h"
#include "../core/sched.h"
#include "../log.h"
#include "../param.h"
#include "lane_ops.h"
#include "ofi_imm.h"
#include "tcpstate.h"

/* libfabric is loaded at run time, so the plugin still loads (and runs TCP lanes) on hosts
 * without it. Only these five functions are library symbols; every other fi_* call is an
 * inline wrapper around the objects' operation tables. */
static struct {
	int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
		       struct fi_info **);
	void (*freeinfo)(struct fi_info *);
	struct fi_info *(*dupinfo)(const struct fi_info *);
	int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
	const char *(*strerror)(int);
} lf;
static pthread_once_t lf_once = PTHREAD_ONCE_INIT;
static bool lf_ok;

static void lf_load_once(void)
{
	void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		INFO("ofi: libfabric.so.1 cannot be loaded: %s", dlerror());
		return;
	}
	*(void **)&lf.getinfo = dlsym(h, "fi_getinfo");
	*(void **)&lf.freeinfo = dlsym(h, "fi_freeinfo");
	*(void **)&lf.dupinfo = dlsym(h, "fi_dupinfo");
	*(void **)&lf.fabric = dlsym(h, "fi_fabric");
	*(void **)&lf.strerror = dlsym(h, "fi_strerror");
	lf_ok = lf.getinfo && lf.freeinfo && lf.dupinfo && lf.fabric && lf.strerror;
	if (!lf_ok) {
		WARN("ofi: libfabric.so.1 lacks fi_getinfo/fi_freeinfo/fi_dupinfo/fi_fabric/"
		     "fi_strerror");
	}
}

static bool lf_load(void)
{
	pthread_once(&lf_once, lf_load_once);
	return lf_ok;
}

#define fi_getinfo lf.getinfo
#define fi_freeinfo lf.freeinfo
#define fi_dupinfo lf.dupinfo
#define fi_fabric lf.fabric
#define fi_strerror lf.strerror

#define OFI_API FI_VERSION(1, 10)
#define OFI_MAX_DATA 4 /* data endpoints per lane */
#define OFI_MAX_STREAMS (OFI_MAX_DATA + 1) /* and the control endpoint (stream 0) */
#define OFI_NRX 16 /* bounce receive buffers per endpoint (16 KiB each) */
#define OFI_NTX 12 /* messages in flight per endpoint */
/* Chunks owned per endpoint (waiting for an advert or being written). Shallow on purpose: after a
 * resume the fence marker queues behind them (rule 2), so this bounds how long a replay waits
 * for the old writes to drain; 4 endpoints x 3 x 512 KiB keep a lane busy on these links. */
#define OFI_NWR 3
#define OFI_PEEK 16 /* queued messages whose adverts are asked for ahead of their chunks */
#define OFI_HELLO_MAX 4096
#define OFI_ACCEPT_MS 5000
/* An advert request unanswered for this many completion timeouts fails the lane: the
 * receiver's gate holds requests at most about one timeout (then it fails the blocker). */
#define OFI_ADV_WAIT_TIMEOUTS 3

enum ep_kind {
	EK_LANE, /* a stream of a lane, opened here */
	EK_ACCEPTED, /* accepted, waiting for the hello that says what it is */
	EK_LANE_IN, /* a stream of a lane, accepted */
	EK_PROBE_OUT,
	EK_PROBE_REPLY, /* answering a probe; closed once the answer left */
};

enum ep_state { ES_NEW, ES_CONNECTING, ES_HELLO_WAIT, ES_HELLO_IN, ES_READY, ES_CLOSED };

enum ctx_kind { CTX_RX = 1, CTX_TX, CTX_WR };

struct ofi_ep;

struct ofi_ctx {
	uint8_t kind;
	uint16_t idx;
	struct ofi_ep *e;
};

struct ofi_tx {
	struct ofi_ctx ctx;
	bool busy; /* posted, or queued behind a full provider queue */
	size_t len;
	size_t core_len; /* bytes of a core control batch (rh_core_ctrl_written) */
	uint8_t *buf;
};

enum wr_state { WR_FREE = 0, WR_WAIT, WR_POSTED };

struct ofi_wr {
	struct ofi_ctx ctx;
	uint8_t state;
	struct rh_hdr h;
	const char *payload;
};

struct ofi_rx {
	struct ofi_ctx ctx;
	uint8_t *buf;
};

struct ofi_dom {
	bool ok;
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_pep *pep;
	struct fid_eq *peq;
	int peq_fd;
	uint64_t mr_mode;
	bool rx_cq_data; /* writes with CQ data consume a posted receive (FI_RX_CQ_DATA) */
	pthread_mutex_t rc_mu;
	struct ofi_rcache rc;
	uint64_t next_key;
};

struct ofi_lane {
	struct ofi_ep *ep[OFI_MAX_STREAMS];
	int live;
	int npending; /* receiver: adverts waiting for the gate */
	/* receiver: an advert is good for a write on any endpoint of the lane, so whether the
	 * lane advertised before a resume decides which endpoints must pass their marker */
	bool adv_given;
	uint32_t max_adv_epoch; /* newest epoch advertised on this lane */
	/* ofi_stalled() (connection lock): [0] the control endpoint, [1] the data endpoints */
	uint64_t stall_mark[2], stall_since_ms[2];
	uint32_t ep_mark; /* sender: the resume epoch every endpoint must mark before requests */
	struct ofi_adv_table adv; /* sender: adverts received */
	struct ofi_rrec_table rrec; /* receiver: adverts given */
};

struct ofi_ep {
	enum ep_kind kind;
	enum ep_state st;
	int nic;
	struct ofi_dom *d;
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_eq *eq;
	struct fid_mr *arena_mr;
	void *arena_desc;
	uint8_t *arena;
	struct fi_info *cinfo; /* EK_ACCEPTED: the connection request */
	struct rh_lane *lane;
	struct rh_conn *conn; /* reference held while set */
	int idx;
	bool io_held;
	uint32_t ip;
	uint16_t port;
	uint64_t cookie;
	uint64_t deadline_ms;
	uint64_t t_fenced_ms;
	atomic_bool fenced;
	bool failed;
	bool probe_reported;
	uint8_t *hello; /* opener: the hello message to send once connected */
	size_t hello_len;
	struct ofi_rx rx[OFI_NRX];
	struct ofi_tx tx[OFI_NTX];
	struct ofi_wr wr[OFI_NWR];
	int ntx_busy;
	int txq[OFI_NTX]; /* slots not yet accepted by the provider (-FI_EAGAIN), in order */
	int txq_head, txq_n;
	int nwr_used;
	uint32_t mark_sent; /* sender: last EPOCH marker sent */
	uint32_t mark_seen; /* receiver: last EPOCH marker received */
	/* read by the core under the connection lock */
	atomic_uint_fast64_t progress;
	atomic_int outstanding;
	uint16_t lport, rport;
	uint32_t lip, rip; /* network order; with lport/rport the provider's socket, if any */
	uint64_t last_rx_ms; /* I/O thread: last message or write received from the peer */
	struct ofi_ep *next;
};

static struct ofi_dom doms[RH_MAX_NICS];
static pthread_t io_thread;
static int epfd = -1, evfd = -1;
static atomic_bool kicked;
static pthread_mutex_t pend_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ofi_ep *pending; /* created by other threads */
static struct ofi_ep *eps; /* owned by the I/O thread */
static bool wait_fds = true; /* the provider gives FI_WAIT_FD wait objects */

static void io_kick(void)
{
	uint64_t one = 1;

	if (!atomic_exchange(&kicked, true)) {
		if (write(evfd, &one, sizeof(one)) < 0) {
			atomic_store(&kicked, false);
		}
	}
}

/* libfabric returns 0 or -FI_Exxx (== -Exxx for the errno range) */
static int fi_err(ssize_t rc)
{
	return rc < 0 ? (int)rc : (rc > 0 ? -EIO : 0);
}

/* --- domains (one per NIC) --- */

static struct fi_info *make_hints(void)
{
	struct fi_info *h = fi_dupinfo(NULL); /* fi_allocinfo(), through the loaded library */

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

bool rh_ofi_rdma_provider(char *name, size_t cap)
{
	struct fi_info *hints, *list = NULL;
	bool found = false;

	if (!lf_load()) {
		return false;
	}
	hints = make_hints();
	if (!hints) {
		return false;
	}
	/* Only verbs offers FI_EP_MSG + FI_RMA on RDMA hardware (efa is RDM-only): asking for it
	 * alone keeps init from probing every provider. */
	hints->fabric_attr->prov_name = strdup("verbs");
	if (fi_getinfo(OFI_API, NULL, NULL, 0, hints, &list) == 0) {
		for (struct fi_info *i = list; i && !found; i = i->next) {
			const char *p = i->fabric_attr->prov_name;

			if (p && (strstr(p, "verbs") || strstr(p, "efa"))) {
				snprintf(name, cap, "%s", p);
				found = true;
			}
		}
	}
	fi_freeinfo(list);
	fi_freeinfo(hints);
	return found;
}

/* Where the provider reports the NIC behind a domain, take its PCI path and speed. */
static void nic_attrs(int nic, const struct fi_info *i)
{
	struct rh_nic *n = &rh_g.nics[nic];

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

static int dom_open(int nic)
{
	struct ofi_dom *d = &doms[nic];
	struct fi_info *hints = make_hints(), *list = NULL, *pick = NULL;
	char node[INET_ADDRSTRLEN];
	int rc;

	if (!hints) {
		return -ENOMEM;
	}
	inet_ntop(AF_INET, &rh_g.nics[nic].ipv4, node, sizeof(node));
	rc = fi_getinfo(OFI_API, node, NULL, FI_SOURCE, hints, &list);
	fi_freeinfo(hints);
	if (rc) {
		WARN("ofi: no libfabric provider with FI_EP_MSG + FI_RMA for %s (%s): %s",
		     rh_g.nics[nic].ifname, node, fi_strerror(-rc));
		return rc < 0 ? rc : -ENODEV;
	}
	/* Prefer the domain named after the NIC (tcp provider: the ifname), else the first. */
	for (struct fi_info *i = list; i; i = i->next) {
		if (i->domain_attr->name && !strcmp(i->domain_attr->name, rh_g.nics[nic].ifname)) {
			pick = i;
			break;
		}
	}
	if (!pick) {
		pick = list;
	}
	d->info = fi_dupinfo(pick);
	fi_freeinfo(list);
	if (!d->info) {
		return -ENOMEM;
	}
	d->mr_mode = d->info->domain_attr->mr_mode;
	d->rx_cq_data = d->info->mode & FI_RX_CQ_DATA;
	pthread_mutex_init(&d->rc_mu, NULL);
	d->next_key = 1;
	rc = fi_fabric(d->info->fabric_attr, &d->fabric, NULL);
	if (!rc) {
		rc = fi_domain(d->fabric, d->info, &d->domain, NULL);
	}
	if (rc) {
		WARN("ofi: cannot open the %s domain %s for %s: %s",
		     d->info->fabric_attr->prov_name, d->info->domain_attr->name,
		     rh_g.nics[nic].ifname, fi_strerror(-rc));
		return rc;
	}
	nic_attrs(nic, d->info);
	d->ok = true;
	INFO("ofi: NIC %s -> provider %s, fabric %s, domain %s (mr_mode 0x%llx%s)",
	     rh_g.nics[nic].ifname, d->info->fabric_attr->prov_name, d->info->fabric_attr->name,
	     d->info->domain_attr->name, (unsigned long long)d->mr_mode,
	     d->rx_cq_data ? ", FI_RX_CQ_DATA" : "");
	return 0;
}

/* The registration cache: one memory region per page range per domain, made the first time a
 * lane of the domain needs it and kept until the application deregisters the buffer. */
static int mr_get(struct ofi_dom *d, const void *addr, size_t len, uint64_t *raddr, uint64_t *key,
		  void **desc)
{
	struct ofi_rc_entry *ent, n = { 0 };
	int rc = 0;

	pthread_mutex_lock(&d->rc_mu);
	ent = ofi_rc_find(&d->rc, (uintptr_t)addr, len);
	if (!ent) {
		struct fid_mr *mr;

		ofi_rc_range((uintptr_t)addr, len, &n.lo, &n.hi);
		rc = fi_mr_reg(d->domain, (void *)n.lo, n.hi - n.lo,
			       FI_REMOTE_WRITE | FI_WRITE | FI_SEND | FI_RECV, 0,
			       (d->mr_mode & FI_MR_PROV_KEY) ? 0 : d->next_key++, 0, &mr, NULL);
		if (rc) {
			WARN("ofi: fi_mr_reg of %zu bytes failed: %s", (size_t)(n.hi - n.lo),
			     fi_strerror(-rc));
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

static void ofi_forget(const void *addr, size_t size)
{
	struct ofi_rc_entry out[16];
	uintptr_t lo, hi;

	ofi_rc_range((uintptr_t)addr, size, &lo, &hi);
	for (int i = 0; i < rh_g.nnics; i++) {
		struct ofi_dom *d = &doms[i];
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

/* --- endpoints --- */

static struct ofi_ep *ep_new(enum ep_kind kind, int nic)
{
	struct ofi_ep *e = calloc(1, sizeof(*e));

	if (!e) {
		return NULL;
	}
	e->kind = kind;
	e->nic = nic;
	e->d = &doms[nic];
	e->st = ES_NEW;
	atomic_init(&e->fenced, false);
	atomic_init(&e->progress, 0);
	atomic_init(&e->outstanding, 0);
	return e;
}

static void ep_push(struct ofi_ep *e)
{
	pthread_mutex_lock(&pend_mu);
	e->next = pending;
	pending = e;
	pthread_mutex_unlock(&pend_mu);
	io_kick();
}

/* A lane's first endpoint carries no writes (ofi_open adds it to the data endpoints): control
 * frames, advert requests and answers then never queue behind megabytes of writes on a
 * congested link (the provider delivers a message after the earlier writes of its endpoint).
 * Measured on the 200 Mbit/s fabric with four connections moved onto one NIC: FAILREQs and
 * RESUMEs took 1-2 s to cross when they shared an endpoint with writes, and connections
 * escalated. (A lane of a single endpoint, which ofi_open never makes, would mix both.) */
static bool ep_ctrl_only(const struct ofi_ep *e)
{
	return e->idx == 0 && e->lane && e->lane->nstreams >= 2;
}

static void ep_touch(struct ofi_ep *e, uint64_t bytes)
{
	atomic_fetch_add(&e->progress, bytes + 1);
}

static int post_rx(struct ofi_ep *e, int i)
{
	struct ofi_rx *r = &e->rx[i];

	return fi_err(fi_recv(e->ep, r->buf, OFI_MSG_MAX, e->arena_desc, 0, &r->ctx));
}

/* Allocate the bounce buffers, open the CQ and EQ, bind and enable the endpoint. */
static int ep_setup(struct ofi_ep *e, struct fi_info *info)
{
	struct fi_cq_attr cqa = { .format = FI_CQ_FORMAT_DATA,
				  .size = 4 * (OFI_NRX + OFI_NTX + OFI_NWR),
				  .wait_obj = wait_fds ? FI_WAIT_FD : FI_WAIT_NONE };
	struct fi_eq_attr eqa = { .size = 16, .wait_obj = wait_fds ? FI_WAIT_FD : FI_WAIT_NONE };
	size_t asz = (size_t)(OFI_NRX + OFI_NTX) * OFI_MSG_MAX;
	int rc;

	e->arena = malloc(asz);
	if (!e->arena) {
		return -ENOMEM;
	}
	for (int i = 0; i < OFI_NRX; i++) {
		e->rx[i].ctx = (struct ofi_ctx){ .kind = CTX_RX, .idx = (uint16_t)i, .e = e };
		e->rx[i].buf = e->arena + (size_t)i * OFI_MSG_MAX;
	}
	for (int i = 0; i < OFI_NTX; i++) {
		e->tx[i].ctx = (struct ofi_ctx){ .kind = CTX_TX, .idx = (uint16_t)i, .e = e };
		e->tx[i].buf = e->arena + (size_t)(OFI_NRX + i) * OFI_MSG_MAX;
	}
	for (int i = 0; i < OFI_NWR; i++) {
		e->wr[i].ctx = (struct ofi_ctx){ .kind = CTX_WR, .idx = (uint16_t)i, .e = e };
	}
	if (e->d->mr_mode & FI_MR_LOCAL) {
		rc = fi_mr_reg(e->d->domain, e->arena, asz, FI_SEND | FI_RECV, 0,
			       (e->d->mr_mode & FI_MR_PROV_KEY) ? 0 : e->d->next_key++, 0,
			       &e->arena_mr, NULL);
		if (rc) {
			return fi_err(rc);
		}
		e->arena_desc = fi_mr_desc(e->arena_mr);
	}
	rc = fi_cq_open(e->d->domain, &cqa, &e->cq, e);
	if (rc == -FI_ENOSYS || rc == -FI_EINVAL) {
		if (wait_fds) {
			INFO("ofi: the provider has no FI_WAIT_FD completion queues, polling");
		}
		wait_fds = false;
		cqa.wait_obj = FI_WAIT_NONE;
		eqa.wait_obj = FI_WAIT_NONE;
		rc = fi_cq_open(e->d->domain, &cqa, &e->cq, e);
	}
	if (rc) {
		return fi_err(rc);
	}
	rc = fi_eq_open(e->d->fabric, &eqa, &e->eq, e);
	if (rc) {
		return fi_err(rc);
	}
	rc = fi_endpoint(e->d->domain, info, &e->ep, e);
	if (!rc) {
		rc = fi_ep_bind(e->ep, &e->eq->fid, 0);
	}
	if (!rc) {
		rc = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV);
	}
	if (!rc) {
		rc = fi_enable(e->ep);
	}
	if (rc) {
		return fi_err(rc);
	}
	for (int i = 0; i < OFI_NRX; i++) {
		rc = post_rx(e, i);
		if (rc) {
			return rc;
		}
	}
	if (wait_fds) {
		int fd;
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = e };

		if (fi_control(&e->cq->fid, FI_GETWAIT, &fd) == 0) {
			epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
		}
		if (fi_control(&e->eq->fid, FI_GETWAIT, &fd) == 0) {
			epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
		}
	}
	return 0;
}

static void ep_cache_ports(struct ofi_ep *e)
{
	struct sockaddr_in a;
	size_t len = sizeof(a);

	if (fi_getname(&e->ep->fid, &a, &len) == 0 && a.sin_family == AF_INET) {
		e->lport = ntohs(a.sin_port);
		e->lip = a.sin_addr.s_addr;
	}
	len = sizeof(a);
	if (fi_getpeer(e->ep, &a, &len) == 0 && a.sin_family == AF_INET) {
		e->rport = ntohs(a.sin_port);
		e->rip = a.sin_addr.s_addr;
	}
}

/* Opener: endpoint to ip:port from the NIC's domain; connect. */
static int ep_connect(struct ofi_ep *e)
{
	struct fi_info *info = fi_dupinfo(e->d->info);
	struct sockaddr_in *sa;
	int rc;

	if (!info) {
		return -ENOMEM;
	}
	sa = calloc(1, sizeof(*sa));
	if (!sa) {
		fi_freeinfo(info);
		return -ENOMEM;
	}
	sa->sin_family = AF_INET;
	sa->sin_addr.s_addr = e->ip;
	sa->sin_port = e->port;
	free(info->dest_addr);
	info->dest_addr = sa;
	info->dest_addrlen = sizeof(*sa);
	rc = ep_setup(e, info);
	if (!rc) {
		rc = fi_err(fi_connect(e->ep, sa, NULL, 0));
	}
	fi_freeinfo(info);
	e->st = ES_CONNECTING;
	return rc;
}

static int tx_free_slot(struct ofi_ep *e)
{
	for (int i = 0; i < OFI_NTX; i++) {
		if (!e->tx[i].busy) {
			return i;
		}
	}
	return -1;
}

/* Post messages queued behind a full provider queue, in order. */
static int tx_flush(struct ofi_ep *e)
{
	while (e->txq_n) {
		struct ofi_tx *t = &e->tx[e->txq[e->txq_head]];
		ssize_t rc = fi_send(e->ep, t->buf, t->len, e->arena_desc, 0, &t->ctx);

		if (rc == -FI_EAGAIN) {
			return 0;
		}
		if (rc) {
			return fi_err(rc);
		}
		e->txq_head = (e->txq_head + 1) % OFI_NTX;
		e->txq_n--;
	}
	return 0;
}

/* Send slot i (len bytes, header included); messages keep their order. On a hard error the
 * slot stays busy so that closing the endpoint accounts for it. */
static int tx_post(struct ofi_ep *e, int i, size_t len)
{
	struct ofi_tx *t = &e->tx[i];

	t->len = len;
	t->busy = true;
	e->ntx_busy++;
	atomic_fetch_add(&e->outstanding, 1);
	e->txq[(e->txq_head + e->txq_n) % OFI_NTX] = i;
	e->txq_n++;
	return tx_flush(e);
}

/* Send [header][body] as one message. -EAGAIN: no free slot, try again later. */
static int send_msg(struct ofi_ep *e, enum ofi_mkind kind, const void *body, size_t len)
{
	int i = tx_free_slot(e);
	struct ofi_tx *t;

	if (i < 0) {
		return -EAGAIN;
	}
	t = &e->tx[i];
	ofi_mhdr_put(t->buf, kind, (uint32_t)len);
	if (len && body != t->buf + OFI_MHDR_LEN) {
		memcpy(t->buf + OFI_MHDR_LEN, body, len);
	}
	t->core_len = 0;
	return tx_post(e, i, OFI_MHDR_LEN + len);
}

/* --- lane bookkeeping shared with the core (connection lock) --- */

static void ep_detach(struct ofi_ep *e)
{
	struct rh_conn *c = e->conn;

	if (!c) {
		return;
	}
	pthread_mutex_lock(&c->mu);
	if (e->lane && e->lane->tp) {
		struct ofi_lane *ol = e->lane->tp;

		if (e->idx >= 0 && e->idx < OFI_MAX_STREAMS && ol->ep[e->idx] == e) {
			ol->ep[e->idx] = NULL;
			if (--ol->live == 0) {
				e->lane->tp = NULL;
				ofi_adv_table_free(&ol->adv);
				free(ol);
			}
		}
	}
	pthread_mutex_unlock(&c->mu);
	e->lane = NULL;
	e->conn = NULL;
	rh_core_conn_put(c);
}

/* Close the endpoint: after fi_close returns the provider places and reads nothing more for
 * it (rule 1 of the fence). Then the io reference goes. */
static void ep_close(struct ofi_ep *e)
{
	if (e->st == ES_CLOSED) {
		return;
	}
	e->st = ES_CLOSED;
	if (e->ep) {
		fi_close(&e->ep->fid);
		e->ep = NULL;
	}
	if (e->cq) {
		fi_close(&e->cq->fid);
		e->cq = NULL;
	}
	if (e->eq) {
		fi_close(&e->eq->fid);
		e->eq = NULL;
	}
	if (e->arena_mr) {
		fi_close(&e->arena_mr->fid);
		e->arena_mr = NULL;
	}
	for (int i = 0; i < OFI_NTX; i++) {
		if (e->tx[i].busy && e->tx[i].core_len && e->lane) {
			rh_core_ctrl_written(e->lane, e->tx[i].core_len);
		}
		e->tx[i].busy = false;
	}
	atomic_store(&e->outstanding, 0);
	if (e->io_held) {
		e->io_held = false;
		rh_core_io_exit(e->conn);
	}
	if (e->kind == EK_PROBE_OUT && !e->probe_reported && e->conn) {
		e->probe_reported = true;
		rh_core_probe_done(e->conn, e->cookie, false);
	}
	if (e->cinfo) {
		fi_freeinfo(e->cinfo);
		e->cinfo = NULL;
	}
	if (e->kind == EK_LANE || e->kind == EK_LANE_IN) {
		ep_detach(e);
	} else if (e->conn) {
		rh_core_conn_put(e->conn);
		e->conn = NULL;
	}
}

/* A transport failure: a lane error for the core (which fences the lane), a failed probe. */
static void ep_fail(struct ofi_ep *e, int err, const char *why)
{
	if (e->failed) {
		return;
	}
	e->failed = true;
	if ((e->kind == EK_LANE || e->kind == EK_LANE_IN) && e->lane && !atomic_load(&e->fenced)) {
		TRACE("ofi: lane %u stream %d: %s (%s)", e->lane->id, e->idx, why, strerror(-err));
		rh_core_lane_error(e->lane, err);
	}
	ep_close(e);
}

/* --- receive side of messages --- */

static void on_hello(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	struct rh_hdr h, ah = { .type = RH_F_HELLO_ACK };
	struct rh_hello in, reply;
	struct rh_lane *lane;
	struct rh_conn *c;
	uint8_t *out;
	int n;

	if ((e->st != ES_HELLO_IN && !(e->st == ES_CONNECTING && e->kind == EK_ACCEPTED)) ||
	    len < RH_HDR_LEN || rh_hdr_get(b, &h) < 0 || h.type != RH_F_HELLO ||
	    h.len > len - RH_HDR_LEN || rh_hello_get(b + RH_HDR_LEN, h.len, &in) < 0) {
		ep_close(e);
		return;
	}
	if (in.kind == RH_HELLO_PROBE) {
		memset(&reply, 0, sizeof(reply));
		reply.kind = RH_HELLO_PROBE;
		reply.nstreams = 1;
		e->kind = EK_PROBE_REPLY;
	} else {
		lane = rh_core_hello(&h, &in, &reply);
		if (!lane) {
			ep_close(e);
			return;
		}
		c = lane->conn; /* reference taken by rh_core_hello */
		pthread_mutex_lock(&c->mu);
		if (lane->state != RH_LANE_OPENING || in.stream >= OFI_MAX_STREAMS ||
		    (lane->tp && ((struct ofi_lane *)lane->tp)->ep[in.stream]) ||
		    !rh_core_io_enter(c)) {
			pthread_mutex_unlock(&c->mu);
			rh_core_conn_put(c);
			ep_close(e);
			return;
		}
		e->io_held = true;
		if (!lane->tp) {
			lane->tp = calloc(1, sizeof(struct ofi_lane));
			if (!lane->tp) {
				pthread_mutex_unlock(&c->mu);
				rh_core_io_exit(c);
				e->io_held = false;
				rh_core_conn_put(c);
				ep_close(e);
				return;
			}
		}
		((struct ofi_lane *)lane->tp)->ep[in.stream] = e;
		((struct ofi_lane *)lane->tp)->live++;
		e->lane = lane;
		e->conn = c;
		e->idx = in.stream;
		e->kind = EK_LANE_IN;
		pthread_mutex_unlock(&c->mu);
	}
	out = malloc(RH_HDR_LEN + OFI_HELLO_MAX);
	if (!out) {
		ep_fail(e, -ENOMEM, "no memory");
		return;
	}
	n = rh_hello_put(&reply, out + RH_HDR_LEN, OFI_HELLO_MAX);
	ah.conn_id = h.conn_id;
	ah.epoch = h.epoch;
	ah.len = (uint32_t)(n > 0 ? n : 0);
	rh_hdr_put(&ah, out);
	n = send_msg(e, OFI_M_HELLO_ACK, out, RH_HDR_LEN + ah.len);
	free(out);
	if (n < 0) {
		ep_fail(e, n, "cannot answer the hello");
		return;
	}
	e->st = ES_READY;
	e->last_rx_ms = rh_now_ms();
	e->deadline_ms = 0;
	if (e->kind == EK_LANE_IN) {
		ep_cache_ports(e);
		rh_core_stream_ready(e->lane, NULL);
	}
}

static void on_hello_ack(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	struct rh_hdr h;
	struct rh_hello reply;

	if (e->st != ES_HELLO_WAIT || len < RH_HDR_LEN || rh_hdr_get(b, &h) < 0 ||
	    h.type != RH_F_HELLO_ACK || h.aux != 0 || h.len > len - RH_HDR_LEN ||
	    rh_hello_get(b + RH_HDR_LEN, h.len, &reply) < 0) {
		ep_fail(e, -ECONNREFUSED, "handshake refused");
		return;
	}
	if (e->kind == EK_PROBE_OUT) {
		e->probe_reported = true;
		rh_core_probe_done(e->conn, e->cookie, true);
		ep_close(e);
		return;
	}
	e->st = ES_READY;
	e->last_rx_ms = rh_now_ms();
	e->deadline_ms = 0;
	ep_cache_ports(e);
	rh_core_stream_ready(e->lane, &reply);
}

static void on_core(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	size_t o = 0;

	while (o + RH_HDR_LEN <= len) {
		struct rh_hdr h;

		if (rh_hdr_get(b + o, &h) < 0 || h.len > len - o - RH_HDR_LEN) {
			ep_fail(e, -EPROTO, "malformed control frame");
			return;
		}
		if (h.type == RH_F_DATA) { /* DATA travels as writes, never here */
			ep_fail(e, -EPROTO, "DATA frame in a control message");
			return;
		}
		rh_core_rx_ctrl(e->lane, &h, b + o + RH_HDR_LEN);
		o += RH_HDR_LEN + h.len;
	}
}

/* A chunk arrived (a write completion, or DATA0 for a zero-byte chunk): tell the core. */
static void deliver(struct ofi_ep *e, const struct rh_hdr *h, const char *expect)
{
	bool counted;
	char *dst = rh_core_rx_data(e->lane, h, &counted);

	if (dst && h->len && dst != expect) {
		/* the core would place it elsewhere than where it was written: never happens
		 * unless the two sides disagree about the buffer; a protocol failure */
		WARN("ofi: chunk %llu+%u of seq %llu was written to %p, the core expects %p",
		     (unsigned long long)h->off, h->len, (unsigned long long)h->seq, (void *)expect,
		     (void *)dst);
		rh_core_rx_data_done(e->lane, h, counted, false);
		ep_fail(e, -EPROTO, "placement mismatch");
		return;
	}
	rh_core_rx_data_done(e->lane, h, counted, true);
	ep_touch(e, h->len);
}

static void on_write(struct ofi_ep *e, uint64_t imm)
{
	struct ofi_lane *ol = e->lane ? e->lane->tp : NULL;
	struct rh_conn *c = e->conn;
	struct ofi_imm im;
	struct ofi_rrec *r;
	struct rh_hdr h;

	if (!ol || c->is_send) {
		return;
	}
	ofi_imm_decode(imm, &im);
	r = ofi_rrec_find(&ol->rrec, &im);
	ep_touch(e, 0);
	if (!r) {
		uint32_t ep = (uint32_t)ofi_expand(im.epoch, OFI_IMM_EPOCH_BITS,
						   __atomic_load_n(&c->epoch, __ATOMIC_RELAXED));
		uint32_t min = __atomic_load_n(&c->rx_min_epoch, __ATOMIC_ACQUIRE);

		if (ep >= min) {
			/* Only a write issued before the last resume may outlive its advert (its
			 * chunk is replayed); one of the current epoch would be lost here while
			 * the sender counts it written, so the lane fails and the replay has it. */
			WARN("ofi: lane %u: write of epoch %u for an unknown advert (seq %llu slot "
			     "%u)",
			     e->lane->id, ep, (unsigned long long)im.seq, im.slot);
			ep_fail(e, -EPROTO, "write for an unknown advert");
			return;
		}
		TRACE("ofi: write of epoch %u (< %u) for an unknown advert (seq %llu slot %u) "
		      "dropped",
		      ep, min, (unsigned long long)im.seq, im.slot);
		return;
	}
	if (ofi_rrec_hdr(r, &im, c->chunk, __atomic_load_n(&c->epoch, __ATOMIC_RELAXED), c->id,
			 &h) < 0) {
		ep_fail(e, -EPROTO, "write outside its advert");
		return;
	}
	deliver(e, &h, r->buf + h.off);
}

static void on_data0(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	struct rh_hdr h;

	if (len < RH_HDR_LEN || rh_hdr_get(b, &h) < 0 || h.type != RH_F_DATA || h.len != 0) {
		ep_fail(e, -EPROTO, "malformed DATA0");
		return;
	}
	deliver(e, &h, NULL);
}

/* Receiver: the gate of the fence (rule 3). */
static bool gate_open(struct rh_conn *c, uint32_t min_epoch, struct ofi_ep **blocker)
{
	uint32_t marks[RH_MAX_LANES * OFI_MAX_STREAMS] = { 0 }; /* each endpoint of a conn */
	int nopen = 0, nfenced = 0;

	*blocker = NULL;
	if (min_epoch == 0) {
		return true;
	}
	for (struct ofi_ep *o = eps; o; o = o->next) {
		struct ofi_lane *ol;

		if (o->conn != c || (o->kind != EK_LANE && o->kind != EK_LANE_IN) ||
		    o->st == ES_CLOSED) {
			continue;
		}
		if (atomic_load(&o->fenced)) {
			nfenced++;
			*blocker = o;
			continue;
		}
		ol = o->lane ? o->lane->tp : NULL;
		if (o->st != ES_READY || !ol || !ol->adv_given || ol->max_adv_epoch >= min_epoch) {
			continue;
		}
		if (nopen < (int)(sizeof(marks) / sizeof(marks[0]))) {
			marks[nopen++] = o->mark_seen;
		}
		if (o->mark_seen < min_epoch) {
			*blocker = o;
		}
	}
	return ofi_gate_open(min_epoch, marks, nopen, nfenced);
}

/* Receiver: answer the pending advert r on e (when the gate is open). Returns false when it
 * must wait. The buffer and its placed-chunk map are read now, after the gate: the map then
 * covers every chunk an older epoch placed. */
static bool answer_adv(struct ofi_ep *e, struct ofi_rrec *r, int slot, uint64_t now)
{
	static uint64_t placed[OFI_ADV_WORDS_MAX]; /* I/O thread only */
	static uint8_t body[OFI_ADV_LEN + 8 * OFI_ADV_WORDS_MAX];
	struct rh_conn *c = e->conn;
	struct ofi_adv_msg a = { .seq = r->seq, .slot = (uint8_t)slot, .epoch = r->epoch };
	uint32_t min_epoch = __atomic_load_n(&c->rx_min_epoch, __ATOMIC_ACQUIRE);
	struct ofi_ep *blocker;
	char *buf = NULL;
	uint64_t size = 0;
	void *desc;
	int rc, len;

	if (r->epoch >= min_epoch && !gate_open(c, min_epoch, &blocker)) {
		/* an endpoint still draining older writes is slow, not dead: only one that has
		 * received nothing for the completion timeout is failed (and so closed) */
		if (blocker && !atomic_load(&blocker->fenced) &&
		    now - r->t_pending_ms > (uint64_t)rh_param.COMPLETION_TIMEOUT &&
		    now - blocker->last_rx_ms > (uint64_t)rh_param.COMPLETION_TIMEOUT) {
			ep_fail(blocker, -ETIMEDOUT, "no fence marker from the sender");
		}
		return false;
	}
	rc = rh_core_rx_buffer(e->lane, r->seq, slot, r->epoch, &buf, &size, placed,
			       OFI_ADV_WORDS_MAX, &a.nwords);
	if (rc == -ESTALE) {
		a.status = OFI_ADV_STALE;
		a.nwords = 0;
	} else if (rc == -E2BIG) {
		WARN("ofi: receive of %llu bytes has too many chunks for an advert",
		     (unsigned long long)size);
		ep_fail(e, -EMSGSIZE, "message too large for an advert");
		return true;
	} else if (rc < 0) {
		a.status = OFI_ADV_GONE;
		a.nwords = 0;
	} else if ((rc = mr_get(e->d, buf, size ? size : 1, &a.addr, &a.key, &desc)) < 0) {
		ep_fail(e, rc, "cannot register the receive buffer");
		return true;
	} else {
		a.size = size;
		a.status = OFI_ADV_OK;
		r->buf = buf;
		r->size = size;
	}
	len = ofi_adv_put(&a, placed, body, sizeof(body));
	if (len < 0 || send_msg(e, OFI_M_ADV, body, (size_t)len) < 0) {
		return false; /* no send slot: later */
	}
	if (a.status == OFI_ADV_OK) {
		r->state = OFI_RREC_ADVERTISED;
		struct ofi_lane *ol = e->lane->tp;

		ol->adv_given = true;
		if (r->epoch > ol->max_adv_epoch) {
			ol->max_adv_epoch = r->epoch;
		}
	} else {
		r->state = OFI_RREC_NONE;
	}
	return true;
}

static void on_adv_req(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	struct ofi_lane *ol = e->lane ? e->lane->tp : NULL;
	struct ofi_adv_req q;
	struct ofi_rrec *r;

	if (!ol || ofi_adv_req_get(b, len, &q) < 0) {
		ep_fail(e, -EPROTO, "malformed ADV_REQ");
		return;
	}
	r = &ol->rrec.e[q.seq % RH_RING][q.slot];
	if (!ofi_rrec_take(r, &q)) {
		TRACE("ofi: lane %u: ADV_REQ seq %llu slot %u of epoch %u after one of epoch %u, "
		      "ignored",
		      e->lane->id, (unsigned long long)q.seq, q.slot, q.epoch, r->epoch);
		return;
	}
	if (r->state == OFI_RREC_PENDING) {
		ol->npending--;
	}
	memset(r, 0, sizeof(*r));
	r->seq = q.seq;
	r->epoch = q.epoch;
	r->total = q.total;
	r->t_pending_ms = rh_now_ms();
	r->state = OFI_RREC_PENDING;
	ol->npending++;
	if (answer_adv(e, r, q.slot, r->t_pending_ms)) {
		ol->npending--;
	}
}

static void on_adv(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	static uint64_t placed[OFI_ADV_WORDS_MAX]; /* I/O thread only */
	struct ofi_lane *ol = e->lane ? e->lane->tp : NULL;
	struct ofi_adv_msg a;

	if (!ol || ofi_adv_get(b, len, &a, placed, OFI_ADV_WORDS_MAX) < 0) {
		ep_fail(e, -EPROTO, "malformed ADV");
		return;
	}
	if (!ofi_adv_store(&ol->adv, &a, placed)) {
		return;
	}
	if (a.status != OFI_ADV_OK) {
		/* the receive is complete or a resume has passed: chunks waiting for it go (the
		 * resume replays whatever is still missing) */
		for (int i = 0; i < OFI_NWR; i++) {
			struct ofi_wr *w = &e->wr[i];

			if (w->state == WR_WAIT && w->h.seq == a.seq && w->h.slot == a.slot) {
				w->state = WR_FREE;
				e->nwr_used--;
			}
		}
		/* other streams of the lane may wait for it too */
		for (int s = 0; s < OFI_MAX_STREAMS; s++) {
			struct ofi_ep *o = ol->ep[s];

			for (int i = 0; o && o != e && i < OFI_NWR; i++) {
				struct ofi_wr *w = &o->wr[i];

				if (w->state == WR_WAIT && w->h.seq == a.seq &&
				    w->h.slot == a.slot) {
					w->state = WR_FREE;
					o->nwr_used--;
				}
			}
		}
	}
	ep_touch(e, 0);
}

static void on_msg(struct ofi_ep *e, const uint8_t *b, size_t len)
{
	enum ofi_mkind kind;
	uint32_t blen;

	if (ofi_mhdr_get(b, len, &kind, &blen) < 0) {
		ep_fail(e, -EPROTO, "malformed message");
		return;
	}
	b += OFI_MHDR_LEN;
	if (kind == OFI_M_HELLO) {
		on_hello(e, b, blen);
		return;
	}
	if (kind == OFI_M_HELLO_ACK) {
		on_hello_ack(e, b, blen);
		return;
	}
	if (e->st != ES_READY || (e->kind != EK_LANE && e->kind != EK_LANE_IN) ||
	    atomic_load(&e->fenced)) {
		return;
	}
	ep_touch(e, blen);
	switch (kind) {
	case OFI_M_CORE:
		on_core(e, b, blen);
		break;
	case OFI_M_ADV_REQ:
		on_adv_req(e, b, blen);
		break;
	case OFI_M_ADV:
		on_adv(e, b, blen);
		break;
	case OFI_M_EPOCH:
		if (blen >= 4) {
			uint32_t m = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
				     (uint32_t)b[3] << 24;

			if (m > e->mark_seen) {
				e->mark_seen = m;
			}
		}
		break;
	case OFI_M_DATA0:
		on_data0(e, b, blen);
		break;
	default:
		break;
	}
}

/* --- transmit side --- */

/* Post the write of chunk w (its advert is valid). Returns -EAGAIN to retry later. */
static int post_write(struct ofi_ep *e, struct ofi_lane *ol, struct ofi_wr *w)
{
	struct rh_conn *c = e->conn;
	struct ofi_imm im = { .seq = w->h.seq,
			      .slot = w->h.slot,
			      .chunk = w->h.off / c->chunk,
			      .epoch = w->h.epoch };
	uint64_t raddr, key, imm, lraddr, lkey;
	void *desc = NULL;
	ssize_t rc;
	int err;

	err = ofi_adv_target(&ol->adv, w->h.seq, w->h.slot, w->h.off, w->h.len, &raddr, &key);
	if (err == 0) {
		err = ofi_imm_encode(&im, &imm);
	}
	if (err < 0) {
		WARN("ofi: chunk %llu+%u of seq %llu does not fit its advert: %s",
		     (unsigned long long)w->h.off, w->h.len, (unsigned long long)w->h.seq,
		     strerror(-err));
		return err;
	}
	if (e->d->mr_mode & FI_MR_LOCAL) {
		err = mr_get(e->d, w->payload - w->h.off, w->h.total, &lraddr, &lkey, &desc);
		if (err < 0) {
			return err;
		}
	}
	rc = fi_writedata(e->ep, w->payload, w->h.len, desc, imm, 0, raddr, key, &w->ctx);
	if (rc == -FI_EAGAIN) {
		return -EAGAIN;
	}
	if (rc) {
		return fi_err(rc);
	}
	w->state = WR_POSTED;
	/* only posted operations count: a chunk waiting at the receiver's fence gate for its
	 * advert is not a stalled transport */
	atomic_fetch_add(&e->outstanding, 1);
	return 0;
}

static int send_epoch(struct ofi_ep *e, uint32_t m)
{
	uint8_t b[4] = { (uint8_t)m, (uint8_t)(m >> 8), (uint8_t)(m >> 16), (uint8_t)(m >> 24) };

	return send_msg(e, OFI_M_EPOCH, b, sizeof(b));
}

/* Sender: ask for the advert of (seq, slot) on the lane's control endpoint, or (a lane of one
 * endpoint, or the control endpoint busy) its least loaded one: the request travels behind
 * that endpoint's queued writes. */
static int request_adv(struct ofi_lane *ol, uint64_t seq, int slot, uint64_t total, uint32_t epoch)
{
	struct ofi_adv_req q = { .seq = seq, .total = total, .epoch = epoch, .slot = (uint8_t)slot };
	uint8_t body[OFI_ADV_REQ_LEN];
	struct ofi_ep *best = NULL;
	int rc;

	for (int i = 0; i < OFI_MAX_STREAMS; i++) {
		struct ofi_ep *o = ol->ep[i];

		if (!o || o->st != ES_READY || atomic_load(&o->fenced) ||
		    o->ntx_busy >= OFI_NTX - 1 || o->mark_sent < ol->ep_mark) {
			continue;
		}
		if (ep_ctrl_only(o)) {
			best = o; /* nothing queued ahead of it */
			break;
		}
		if (!best || o->nwr_used + o->txq_n < best->nwr_used + best->txq_n) {
			best = o;
		}
	}
	if (!best) {
		return -EAGAIN;
	}
	ofi_adv_req_put(&q, body);
	rc = send_msg(best, OFI_M_ADV_REQ, body, sizeof(body));
	if (rc == 0) {
		ofi_adv_requested(&ol->adv, seq, slot, epoch, rh_now_ms());
	}
	return rc;
}

/* Sender: ask for the adverts of the messages queued next, before their chunks are due. */
static void prefetch_adverts(struct ofi_ep *e, struct ofi_lane *ol)
{
	struct rh_tx_peek pk[OFI_PEEK];
	int n;

	if (ol->ep[0] != e && !(ol->ep[0] == NULL || ol->ep[0]->st != ES_READY)) {
		return; /* once per lane per pass: on its first endpoint */
	}
	n = rh_core_tx_peek(e->lane, pk, OFI_PEEK);
	for (int i = 0; i < n; i++) {
		if (pk[i].size == 0 || pk[i].epoch < e->mark_sent ||
		    ofi_adv_lookup(&ol->adv, pk[i].seq, pk[i].slot, e->mark_sent) != OFI_ADV_NONE) {
			continue;
		}
		if (request_adv(ol, pk[i].seq, pk[i].slot, pk[i].size, pk[i].epoch) < 0) {
			return;
		}
	}
}

/* Sender: move chunks that wait for adverts along (request, write, or drop when stale). */
static int pump_writes(struct ofi_ep *e, struct ofi_lane *ol, uint32_t m)
{
	int rc = 0;

	for (int i = 0; i < OFI_NWR && rc == 0; i++) {
		struct ofi_wr *w = &e->wr[i];

		if (w->state != WR_WAIT) {
			continue;
		}
		if (w->h.epoch < m) {
			/* rule 2: never write an older epoch after a resume (it is replayed) */
			w->state = WR_FREE;
			e->nwr_used--;
			continue;
		}
		switch (ofi_adv_lookup(&ol->adv, w->h.seq, w->h.slot, m)) {
		case OFI_ADV_VALID:
			if (ofi_adv_placed(&ol->adv, w->h.seq, w->h.slot,
					   w->h.off / e->conn->chunk)) {
				/* the receiver holds it already (a replay after a resume):
				 * writing it again could land after the receive completed */
				w->state = WR_FREE;
				e->nwr_used--;
				ep_touch(e, 0);
				continue;
			}
			rc = post_write(e, ol, w);
			break;
		case OFI_ADV_NONE:
			rc = request_adv(ol, w->h.seq, w->h.slot, w->h.total, w->h.epoch);
			break;
		default:
			/* requested: a lost request or answer must not become a silent stall
			 * (nothing is posted, so the lane's stall test cannot see it) */
			if (ofi_adv_overdue(&ol->adv, w->h.seq, w->h.slot, rh_now_ms(),
					    OFI_ADV_WAIT_TIMEOUTS *
						    (uint64_t)rh_param.COMPLETION_TIMEOUT)) {
				WARN("ofi: lane %u: no advert for seq %llu slot %u within %lld ms",
				     e->lane->id, (unsigned long long)w->h.seq, w->h.slot,
				     (long long)OFI_ADV_WAIT_TIMEOUTS *
					     (long long)rh_param.COMPLETION_TIMEOUT);
				return -ETIMEDOUT;
			}
			break;
		}
	}
	return rc == -EAGAIN ? 0 : rc;
}

static void pump(struct ofi_ep *e)
{
	struct ofi_lane *ol = e->lane ? e->lane->tp : NULL;
	struct rh_conn *c = e->conn;
	uint32_t m;
	int rc;

	if (!ol || e->st != ES_READY || atomic_load(&e->fenced)) {
		return;
	}
	rc = tx_flush(e);
	if (rc < 0) {
		ep_fail(e, rc, "send failed");
		return;
	}
	if (c->is_send) {
		m = __atomic_load_n(&c->resume_epoch, __ATOMIC_ACQUIRE);
		if (m > e->mark_sent) {
			if (send_epoch(e, m) < 0) {
				return; /* no slot: next round */
			}
			e->mark_sent = m;
		}
		if (m > ol->ep_mark) {
			ol->ep_mark = m;
		}
		rc = pump_writes(e, ol, e->mark_sent);
		if (rc < 0) {
			ep_fail(e, rc, "write failed");
			return;
		}
		prefetch_adverts(e, ol);
	} else {
		/* receiver: adverts waiting for the gate */
		uint64_t now = rh_now_ms();

		for (int s = 0; ol->npending > 0 && s < RH_RING * RH_MAX_RECVS; s++) {
			struct ofi_rrec *r = &ol->rrec.e[s / RH_MAX_RECVS][s % RH_MAX_RECVS];

			if (r->state == OFI_RREC_PENDING &&
			    answer_adv(e, r, s % RH_MAX_RECVS, now)) {
				ol->npending--;
			}
			if (e->st == ES_CLOSED) {
				return;
			}
		}
	}
	/* New frames from the core: control batches and chunks. Keep two send slots for the
	 * lane's own messages. */
	while (e->st == ES_READY && e->ntx_busy < OFI_NTX - 2 && e->nwr_used < OFI_NWR) {
		int t = tx_free_slot(e);
		struct rh_tx tx;

		if (t < 0 ||
		    rh_core_next_tx(e->lane, ep_ctrl_only(e) ? RH_STREAM_CTRL_ONLY : e->idx,
				    e->tx[t].buf + OFI_MHDR_LEN, OFI_MSG_MAX - OFI_MHDR_LEN,
				    &tx) <= 0) {
			break;
		}
		if (!tx.is_data) {
			ofi_mhdr_put(e->tx[t].buf, OFI_M_CORE, (uint32_t)tx.ctrl_len);
			e->tx[t].core_len = tx.ctrl_len;
			rc = tx_post(e, t, OFI_MHDR_LEN + tx.ctrl_len);
			if (rc < 0) {
				ep_fail(e, rc, "send failed");
				return;
			}
			continue;
		}
		{
			struct rh_hdr h;
			struct ofi_wr *w = NULL;

			rh_hdr_get(tx.hdr, &h);
			if (h.len == 0) {
				rc = send_msg(e, OFI_M_DATA0, tx.hdr, RH_HDR_LEN);
				if (rc < 0) { /* a slot was free: a provider failure */
					ep_fail(e, rc, "DATA0 send failed");
					return;
				}
				continue;
			}
			for (int i = 0; i < OFI_NWR; i++) {
				if (e->wr[i].state == WR_FREE) {
					w = &e->wr[i];
					break;
				}
			}
			w->state = WR_WAIT;
			w->h = h;
			w->payload = tx.payload;
			e->nwr_used++;
		}
		rc = pump_writes(e, ol, e->mark_sent);
		if (rc < 0) {
			ep_fail(e, rc, "write failed");
			return;
		}
	}
}

/* --- completions and events --- */

static void on_cq_entry(struct ofi_ep *e, const struct fi_cq_data_entry *ce)
{
	struct ofi_ctx *x = ce->op_context;

	if ((ce->flags & FI_REMOTE_CQ_DATA) || (x && x->kind == CTX_RX)) {
		e->last_rx_ms = rh_now_ms();
	}
	if ((ce->flags & FI_REMOTE_CQ_DATA) && (ce->flags & (FI_RMA | FI_REMOTE_WRITE))) {
		on_write(e, ce->data);
		if (x && x->kind == CTX_RX && e->st != ES_CLOSED) {
			int rc = post_rx(e, x->idx); /* FI_RX_CQ_DATA consumed it */

			if (rc < 0) {
				ep_fail(e, rc, "cannot post a receive");
			}
		}
		return;
	}
	if (!x) {
		return;
	}
	switch (x->kind) {
	case CTX_RX:
		on_msg(e, e->rx[x->idx].buf, ce->len);
		if (e->st != ES_CLOSED) {
			int rc = post_rx(e, x->idx);

			if (rc < 0) {
				ep_fail(e, rc, "cannot post a receive");
			}
		}
		break;
	case CTX_TX: {
		struct ofi_tx *t = &e->tx[x->idx];

		if (!t->busy) {
			break;
		}
		size_t core_len = t->core_len;

		t->busy = false;
		t->core_len = 0;
		e->ntx_busy--;
		atomic_fetch_sub(&e->outstanding, 1);
		if (core_len && e->lane) {
			rh_core_ctrl_written(e->lane, core_len);
		}
		ep_touch(e, core_len);
		if (e->kind == EK_PROBE_REPLY) {
			ep_close(e);
		}
		break;
	}
	case CTX_WR: {
		struct ofi_wr *w = &e->wr[x->idx];

		if (w->state == WR_POSTED) {
			ep_touch(e, w->h.len);
			w->state = WR_FREE;
			e->nwr_used--;
			atomic_fetch_sub(&e->outstanding, 1);
		}
		break;
	}
	default:
		break;
	}
}

/* Returns true when something happened. */
static bool poll_cq(struct ofi_ep *e)
{
	struct fi_cq_data_entry ce[16];
	bool any = false;

	while (e->cq && e->st != ES_CLOSED) {
		ssize_t n = fi_cq_read(e->cq, ce, 16);

		if (n == -FI_EAGAIN) {
			break;
		}
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry err = { 0 };

			if (fi_cq_readerr(e->cq, &err, 0) <= 0) {
				ep_fail(e, -EIO, "unreadable completion error");
			} else if (err.err != FI_ECANCELED) {
				ep_fail(e, err.err ? -(int)err.err : -EIO, "completion error");
			}
			return true;
		}
		if (n < 0) {
			ep_fail(e, fi_err(n), "CQ read failed");
			return true;
		}
		for (ssize_t i = 0; i < n && e->st != ES_CLOSED; i++) {
			on_cq_entry(e, &ce[i]);
		}
		any = true;
	}
	return any;
}

static bool poll_eq(struct ofi_ep *e)
{
	struct fi_eq_cm_entry ent;
	uint32_t ev;
	ssize_t n;

	if (!e->eq || e->st == ES_CLOSED) {
		return false;
	}
	n = fi_eq_read(e->eq, &ev, &ent, sizeof(ent), 0);
	if (n == -FI_EAGAIN) {
		return false;
	}
	if (n == -FI_EAVAIL) {
		struct fi_eq_err_entry err = { 0 };

		fi_eq_readerr(e->eq, &err, 0);
		ep_fail(e, err.err ? -err.err : -ECONNREFUSED, "connection failed");
		return true;
	}
	if (n < 0) {
		ep_fail(e, fi_err(n), "EQ read failed");
		return true;
	}
	if (ev == FI_CONNECTED) {
		if (e->st == ES_CONNECTING && e->hello) {
			int rc = send_msg(e, OFI_M_HELLO, e->hello, e->hello_len);

			free(e->hello);
			e->hello = NULL;
			if (rc < 0) {
				ep_fail(e, rc, "cannot send the hello");
				return true;
			}
			e->st = ES_HELLO_WAIT;
		} else if (e->st == ES_CONNECTING) {
			e->st = ES_HELLO_IN; /* accepted side */
		}
	} else if (ev == FI_SHUTDOWN) {
		/* Everything the peer sent before closing is in the CQ: read it first, so a BYE
		 * is seen before the close (an orderly close then is no failure). */
		poll_cq(e);
		if (e->st == ES_READY && e->lane && !atomic_load(&e->fenced) &&
		    (e->kind == EK_LANE || e->kind == EK_LANE_IN)) {
			e->failed = true;
			rh_core_stream_eof(e->lane); /* the core decides: BYE seen or a failure */
			ep_close(e);
		} else if (e->kind == EK_PROBE_REPLY || e->kind == EK_ACCEPTED) {
			ep_close(e);
		} else if (e->st != ES_CLOSED) {
			ep_fail(e, -ECONNRESET, "peer closed");
		}
	}
	return true;
}

/* The passive endpoint of a NIC: connection requests. */
static bool poll_pep(struct ofi_dom *d, int nic)
{
	struct fi_eq_cm_entry ent;
	uint32_t ev;
	ssize_t n;
	struct ofi_ep *e;
	int rc;

	if (!d->peq) {
		return false;
	}
	n = fi_eq_read(d->peq, &ev, &ent, sizeof(ent), 0);
	if (n == -FI_EAGAIN) {
		return false;
	}
	if (n == -FI_EAVAIL) {
		struct fi_eq_err_entry err = { 0 };

		/* a connection request that failed on the way: nothing to do but consume it */
		return fi_eq_readerr(d->peq, &err, 0) > 0;
	}
	if (n < 0) {
		return false;
	}
	if (ev != FI_CONNREQ) {
		return true; /* no other event carries anything for a passive endpoint */
	}
	e = ep_new(EK_ACCEPTED, nic);
	if (!e) {
		fi_reject(d->pep, ent.info->handle, NULL, 0);
		fi_freeinfo(ent.info);
		return true;
	}
	e->cinfo = ent.info;
	e->deadline_ms = rh_now_ms() + OFI_ACCEPT_MS;
	rc = ep_setup(e, ent.info);
	if (!rc) {
		rc = fi_err(fi_accept(e->ep, NULL, 0));
	}
	e->st = ES_CONNECTING;
	e->next = eps;
	eps = e;
	if (rc) {
		ep_close(e);
	}
	return true;
}

static void ep_start(struct ofi_ep *e)
{
	int rc = ep_connect(e);

	e->next = eps;
	eps = e;
	if (rc) {
		WARN("ofi: cannot open an endpoint from %s: %s", rh_g.nics[e->nic].ifname,
		     strerror(-rc));
		ep_fail(e, rc, "connect failed");
	}
}

static void ep_free(struct ofi_ep *e)
{
	free(e->hello);
	free(e->arena);
	free(e);
}

/* One pass over every endpoint. Returns true when anything moved. */
static bool io_pass(uint64_t now)
{
	bool busy = false;

	/* Rule 1 first: fenced endpoints close before anything else runs this pass. */
	for (struct ofi_ep *e = eps; e; e = e->next) {
		if (e->st == ES_CLOSED || !atomic_load(&e->fenced)) {
			continue;
		}
		/* a closing connection: let the last control messages (ACK, BYE) leave */
		if (e->conn && atomic_load(&e->conn->closed) && e->ntx_busy > 0 &&
		    now < e->t_fenced_ms + 100) {
			poll_cq(e);
			if (e->ntx_busy > 0) {
				continue;
			}
		}
		ep_close(e);
		busy = true;
	}
	for (int i = 0; i < rh_g.nnics; i++) {
		for (int k = 0; k < 16 && poll_pep(&doms[i], i); k++) {
			busy = true;
		}
	}
	for (struct ofi_ep *e = eps; e; e = e->next) {
		if (e->st == ES_CLOSED) {
			continue;
		}
		busy |= poll_eq(e);
		busy |= poll_cq(e);
		if (e->st != ES_CLOSED && e->deadline_ms && now > e->deadline_ms &&
		    e->st != ES_READY) {
			ep_fail(e, -ETIMEDOUT, "handshake timed out");
			continue;
		}
		pump(e);
	}
	for (struct ofi_ep **pp = &eps; *pp;) {
		struct ofi_ep *e = *pp;

		if (e->st == ES_CLOSED) {
			*pp = e->next;
			ep_free(e);
			continue;
		}
		pp = &e->next;
	}
	return busy;
}

static void io_wait(void)
{
	struct epoll_event ev[32];
	int timeout = wait_fds ? 20 : 1;

	if (wait_fds) {
		for (struct ofi_ep *e = eps; e; e = e->next) {
			struct fid *f[2];
			int n = 0;

			if (e->st == ES_CLOSED) {
				continue;
			}
			if (e->cq) {
				f[n++] = &e->cq->fid;
			}
			if (e->eq) {
				f[n++] = &e->eq->fid;
			}
			if (n && fi_trywait(e->d->fabric, f, n) != FI_SUCCESS) {
				return; /* something to read already */
			}
		}
		for (int i = 0; i < rh_g.nnics; i++) {
			struct fid *f;

			if (!doms[i].peq) {
				continue;
			}
			f = &doms[i].peq->fid;
			if (fi_trywait(doms[i].fabric, &f, 1) != FI_SUCCESS) {
				return;
			}
		}
	}
	int n = epoll_wait(epfd, ev, 32, timeout);

	for (int i = 0; i < n; i++) {
		if (!ev[i].data.ptr) {
			uint64_t v;

			if (read(evfd, &v, sizeof(v)) < 0) {
				/* drained already */
			}
			atomic_store(&kicked, false);
		}
	}
}

static void *io_main(void *arg)
{
	(void)arg;
	for (;;) {
		struct ofi_ep *list;
		bool busy;

		pthread_mutex_lock(&pend_mu);
		list = pending;
		pending = NULL;
		pthread_mutex_unlock(&pend_mu);
		while (list) {
			struct ofi_ep *e = list;

			list = e->next;
			ep_start(e);
		}
		busy = io_pass(rh_now_ms());
		if (!busy) {
			io_wait();
		}
	}
	return NULL;
}

/* --- lane_ops --- */

static int ofi_start(int nthreads)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };

	(void)nthreads; /* one I/O thread: libfabric providers progress on their own */
	if (!lf_load()) {
		WARN("RAILHOP_TRANSPORT=ofi, but libfabric.so.1 cannot be loaded (install libfabric1)");
		return -ELIBACC;
	}
	epfd = epoll_create1(EPOLL_CLOEXEC);
	evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (epfd < 0 || evfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, evfd, &ev) < 0) {
		return -errno;
	}
	atomic_init(&kicked, false);
	if (pthread_create(&io_thread, NULL, io_main, NULL) != 0) {
		return -EAGAIN;
	}
	pthread_detach(io_thread);
	pthread_setname_np(io_thread, "railhop-ofi");
	return 0;
}

/* Called at init, before the I/O thread serves the NIC: domain + passive endpoint. */
static int ofi_listen(int nic)
{
	struct ofi_dom *d = &doms[nic];
	struct fi_eq_attr eqa = { .size = 64, .wait_obj = FI_WAIT_FD };
	struct sockaddr_in sa;
	size_t len = sizeof(sa);
	int rc;

	rc = dom_open(nic);
	if (rc < 0) {
		return rc;
	}
	rc = fi_eq_open(d->fabric, &eqa, &d->peq, NULL);
	if (rc == -FI_ENOSYS || rc == -FI_EINVAL) {
		eqa.wait_obj = FI_WAIT_NONE;
		wait_fds = false;
		rc = fi_eq_open(d->fabric, &eqa, &d->peq, NULL);
	}
	if (!rc) {
		rc = fi_passive_ep(d->fabric, d->info, &d->pep, NULL);
	}
	if (!rc) {
		rc = fi_pep_bind(d->pep, &d->peq->fid, 0);
	}
	if (!rc) {
		rc = fi_listen(d->pep);
	}
	if (!rc) {
		rc = fi_getname(&d->pep->fid, &sa, &len);
	}
	if (rc) {
		WARN("ofi: cannot listen on %s: %s", rh_g.nics[nic].ifname, fi_strerror(-rc));
		return fi_err(rc);
	}
	if (wait_fds) {
		int fd;
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = d };

		if (fi_control(&d->peq->fid, FI_GETWAIT, &fd) == 0) {
			epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
		}
	}
	rh_g.nics[nic].port = sa.sin_port;
	INFO("ofi: lane listener on %s port %u", rh_g.nics[nic].ifname, ntohs(sa.sin_port));
	io_kick();
	return 0;
}

static uint8_t *hello_msg(const struct rh_hello *hello, uint64_t conn_id, uint32_t epoch,
			  size_t *len)
{
	struct rh_hdr h = { .type = RH_F_HELLO, .conn_id = conn_id, .epoch = epoch };
	uint8_t *b = malloc(RH_HDR_LEN + OFI_HELLO_MAX);
	int n;

	if (!b) {
		return NULL;
	}
	n = rh_hello_put(hello, b + RH_HDR_LEN, OFI_HELLO_MAX);
	if (n < 0) {
		free(b);
		return NULL;
	}
	h.len = (uint32_t)n;
	rh_hdr_put(&h, b);
	*len = RH_HDR_LEN + (size_t)n;
	return b;
}

static int ofi_open(struct rh_lane *lane, const struct rh_hello *hello, uint64_t conn_id,
		    uint32_t epoch, uint32_t ip, uint16_t port)
{
	struct ofi_lane *ol;
	struct rh_hello h = *hello;
	struct ofi_ep *e[OFI_MAX_STREAMS] = { 0 };
	int n;

	if (!doms[lane->lnic].ok) {
		return -ENODEV;
	}
	/* the core's stream count is the lane's data endpoints; stream 0 is added for control */
	if (lane->nstreams > OFI_MAX_DATA) {
		lane->nstreams = OFI_MAX_DATA;
	}
	lane->nstreams += 1;
	n = lane->nstreams;
	ol = calloc(1, sizeof(*ol));
	if (!ol) {
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		e[i] = ep_new(EK_LANE, lane->lnic);
		h.stream = (uint8_t)i;
		h.nstreams = (uint8_t)n;
		if (!e[i] || !(e[i]->hello = hello_msg(&h, conn_id, epoch, &e[i]->hello_len))) {
			goto fail;
		}
	}
	for (int i = 0; i < n; i++) {
		if (!rh_core_io_enter(lane->conn)) {
			for (int k = 0; k < i; k++) {
				rh_core_io_exit(lane->conn);
			}
			for (int k = 0; k < n; k++) {
				if (e[k]) {
					ep_free(e[k]);
				}
			}
			free(ol);
			return -ECONNABORTED;
		}
	}
	lane->tp = ol;
	for (int i = 0; i < n; i++) {
		e[i]->lane = lane;
		e[i]->conn = lane->conn;
		rh_conn_get(lane->conn);
		e[i]->io_held = true;
		e[i]->idx = i;
		e[i]->ip = ip;
		e[i]->port = port;
		ol->ep[i] = e[i];
		ol->live++;
		ep_push(e[i]);
	}
	return 0;
fail:
	for (int k = 0; k < n; k++) {
		if (e[k]) {
			ep_free(e[k]);
		}
	}
	free(ol);
	return -ENOMEM;
}

static int ofi_probe(struct rh_conn *conn, int lnic, uint32_t ip, uint16_t port, uint64_t cookie,
		     int timeout_ms)
{
	struct rh_hello h = { .kind = RH_HELLO_PROBE, .nstreams = 0 };
	struct ofi_ep *e;

	if (!doms[lnic].ok) {
		return -ENODEV;
	}
	e = ep_new(EK_PROBE_OUT, lnic);
	if (!e) {
		return -ENOMEM;
	}
	e->hello = hello_msg(&h, 0, 0, &e->hello_len);
	if (!e->hello) {
		free(e);
		return -ENOMEM;
	}
	e->conn = conn;
	rh_conn_get(conn);
	e->cookie = cookie;
	e->ip = ip;
	e->port = port;
	e->deadline_ms = rh_now_ms() + (uint64_t)timeout_ms;
	ep_push(e);
	return 0;
}

static void ofi_kick(struct rh_lane *lane)
{
	if (lane->tp) {
		io_kick();
	}
}

static void ofi_fence(struct rh_lane *lane)
{
	struct ofi_lane *ol = lane->tp;
	uint64_t now = rh_now_ms();

	if (!ol) {
		return;
	}
	for (int i = 0; i < OFI_MAX_STREAMS; i++) {
		if (ol->ep[i] && !atomic_load(&ol->ep[i]->fenced)) {
			ol->ep[i]->t_fenced_ms = now;
			atomic_store(&ol->ep[i]->fenced, true);
		}
	}
	io_kick();
}

/* Lane level, unlike TCP's per-stream test: progress comes in whole operations here (a
 * 512 KiB write completes at once), and on a link shared by many endpoints one of them can
 * wait longer than the timeout for its next completion while the lane moves data. The data
 * endpoints are stalled when some of them has work outstanding and none completed anything for
 * the timeout (a dead link stops them all); the control endpoint is judged on its own, so its
 * adverts cannot hide data endpoints stuck in TCP retransmission back-off after a flap. */
static bool ofi_stalled(struct rh_lane *lane, uint64_t now, int timeout_ms)
{
	struct ofi_lane *ol = lane->tp;
	bool busy[2] = { false, false }, stalled = false;
	uint64_t p[2] = { 0, 0 };

	if (!ol) {
		return false;
	}
	for (int i = 0; i < OFI_MAX_STREAMS; i++) {
		struct ofi_ep *e = ol->ep[i];
		int g;

		if (!e || e->st != ES_READY) {
			continue;
		}
		g = ep_ctrl_only(e) ? 0 : 1;
		busy[g] |= atomic_load(&e->outstanding) > 0;
		p[g] += atomic_load(&e->progress);
	}
	for (int g = 0; g < 2; g++) {
		if (!busy[g]) {
			ol->stall_since_ms[g] = 0;
		} else if (p[g] != ol->stall_mark[g] || ol->stall_since_ms[g] == 0) {
			ol->stall_mark[g] = p[g];
			ol->stall_since_ms[g] = now;
		} else if (now - ol->stall_since_ms[g] >= (uint64_t)timeout_ms) {
			stalled = true;
		}
	}
	return stalled;
}

/* Over a provider whose endpoints are TCP sockets (libfabric's tcp provider), the same verdict
 * as the TCP lane's, read through sock_diag by each data endpoint's address 4-tuple. Other
 * providers have no such socket (the lookup finds none): their lanes wait for the probe. */
static bool ofi_lost(struct rh_lane *lane, uint64_t quiet_ms)
{
	struct ofi_lane *ol = lane->tp;

	for (int i = 0; ol && i < OFI_MAX_STREAMS; i++) {
		struct ofi_ep *e = ol->ep[i];
		struct tcp_info ti;

		if (!e || e->st != ES_READY || !e->lport || !e->rport || ep_ctrl_only(e) ||
		    rh_tcp_info_by_addr(e->lip, e->lport, e->rip, e->rport, &ti) < 0) {
			continue;
		}
		if (rh_tcp_info_lost(&ti, quiet_ms)) {
			return true;
		}
	}
	return false;
}

static uint64_t ofi_progress(struct rh_lane *lane)
{
	struct ofi_lane *ol = lane->tp;
	uint64_t sum = 0;

	for (int i = 0; ol && i < OFI_MAX_STREAMS; i++) {
		if (ol->ep[i]) {
			sum += atomic_load(&ol->ep[i]->progress);
		}
	}
	return sum;
}

static int ofi_ports(struct rh_lane *lane, uint16_t *lports, uint16_t *rports, int max)
{
	struct ofi_lane *ol = lane->tp;
	int n = 0;

	for (int i = 0; ol && i < OFI_MAX_STREAMS && n < max; i++) {
		struct ofi_ep *e = ol->ep[i];

		if (e && e->lport && e->rport) {
			lports[n] = e->lport;
			rports[n] = e->rport;
			n++;
		}
	}
	return n;
}

const struct lane_ops rh_ofi_ops = {
	.name = "ofi",
	.start = ofi_start,
	.listen = ofi_listen,
	.open = ofi_open,
	.kick = ofi_kick,
	.fence = ofi_fence,
	.stalled = ofi_stalled,
	.lost = ofi_lost,
	.progress = ofi_progress,
	.ports = ofi_ports,
	.probe = ofi_probe,
	.forget = ofi_forget,
};
