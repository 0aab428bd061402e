/* dedup.c: the physical-dedup client: one thread for faults, hashing and the pool. */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dedup.h"
#include "log.h"
#include "uffd.h"
#include "util.h"

/*
 * DOC: the dedup client
 *
 * One thread owns everything below: the write-protect userfaultfd over guest
 * RAM, the pool's rings and control socket, and the timers, all in one poll
 * loop. Fault handling and merging are therefore serialised: a guest writer
 * that faults while a run is being merged sleeps in the kernel until the
 * merge is done (see merge.c).
 *
 * Every page has a state (enum vmm_pg). A page is hashed once per change:
 *
 *   NEW --sweep finds it populated--> WP, hash --> HASHED (offered)
 *   HASHED --write fault--> DIRTY (FORGET sent, unprotected)
 *   DIRTY --settled for VMM_SETTLE_MS--> WP, hash --> HASHED
 *   HASHED --MAP verdict, bytes equal--> remap --> SHARED (protected)
 *   SHARED --write fault--> DIRTY (DROP sent, copy on write)
 *   all-zero when hashed --> MADV_DONTNEED, WP marker --> ZERO
 *     (never in a range once remapped: see VMM_PG_FILEVMA)
 *
 * Work is picked in priority order: file-read hints, settled DIRTY pages,
 * then a sweep of /proc/self/pagemap over NEW pages that backs off to once a
 * second when it finds nothing. Hashing is capped at cpu_pct of one core.
 *
 * If the pool goes away the guest keeps every byte: shared pages stay mapped
 * (the mappings hold the segments) and become ORPHAN; HASHED pages go back to
 * NEW so that they are offered to the next pool; we retry every second. On
 * reconnect ORPHAN pages become NEW too and are offered to the new pool.
 *
 * Test knobs, read once at create from the environment (tests only):
 *   PVISOR_TEST_NO_WP=1           unprotect each run just before the compare,
 *                                 so a racing write can be lost (proves the
 *                                 race test can fail);
 *   PVISOR_TEST_MERGE_DELAY_US=N  sleep N us between compare and remap.
 */

#define VMM_SETTLE_MS        50          /* a dirty page waits this long before rehash */
#define VMM_BATCH            512         /* pages per hashing unit */
#define VMM_SWEEP_CHUNK      8192        /* pagemap entries per read */
#define VMM_SWEEP_BACKOFF_NS 1000000000ull
#define VMM_SWEEP_PACE_NS    5000000ull  /* between passes while content keeps coming */
#define VMM_RECONNECT_NS     1000000000ull
#define PM_PRESENT           (1ull << 63)
#define PM_SWAP              (1ull << 62)

void vmm_dedup_set_state(struct vmm_dedup *dd, uint64_t page, enum vmm_pg s)
{
	dd->count[dd->state[page] & VMM_PG_MASK]--;
	dd->count[s]++;
	dd->state[page] = (uint8_t)((dd->state[page] & (VMM_PG_QUEUED | VMM_PG_FILEVMA | VMM_PG_PINNED)) | s);
}

uint32_t vmm_dedup_now_us(const struct vmm_dedup *dd)
{
	return (uint32_t)((util_now_ns() - dd->t0_ns) / 1000);
}

static uint32_t vmm_dedup_now_ms(const struct vmm_dedup *dd)
{
	return (uint32_t)((util_now_ns() - dd->t0_ns) / 1000000);
}

void vmm_dedup_send(struct vmm_dedup *dd, uint16_t op, uint64_t page, const uint64_t *hash,
		    uint32_t seg, uint32_t slot)
{
	struct proto_sqe e = { .page = page, .op = op, .seg = seg, .slot = slot };

	if (!vmm_pool__up(&dd->pool))
		return;
	if (hash) {
		e.hash[0] = hash[0];
		e.hash[1] = hash[1];
	}
	if (vmm_pool__push(&dd->pool, &e))
		log_warn("dedup: out of memory queueing op %u for page %llu", op,
			 (unsigned long long)page);
}

int vmm_dedup_pagemap(struct vmm_dedup *dd, uint64_t first, uint64_t n, uint64_t *out)
{
	uint64_t va = (uint64_t)(uintptr_t)(dd->m->ram + first * PROTO_PAGE_SIZE);
	ssize_t r = pread(dd->pagemap_fd, out, n * 8, (off_t)(va / PROTO_PAGE_SIZE * 8));

	if (r != (ssize_t)(n * 8))
		return r < 0 ? -errno : -EIO;
	return 0;
}

void vmm_dedup_mark_dirty(struct vmm_dedup *dd, uint64_t page)
{
	vmm_dedup_set_state(dd, page, VMM_PG_DIRTY);
	dd->ref[page] = vmm_dedup_now_ms(dd);
	if (dd->state[page] & VMM_PG_QUEUED)
		return;
	dd->state[page] |= VMM_PG_QUEUED;
	dd->dq[(dd->dq_head + dd->dq_len) % dd->m->pages] = (uint32_t)page;
	dd->dq_len++;
}

/* --- write faults ------------------------------------------------------ */

/*
 * A write to a shared page: make the guest's private copy before the slot's
 * reference goes back to the pool. Once DROPped, the pool may recycle the slot
 * and write another page's bytes into it; a writer still mapping the slot would
 * then copy those bytes. So unprotect without waking, take the copy here
 * (MADV_POPULATE_WRITE breaks copy-on-write without changing a byte), and only
 * then DROP and wake. A concurrent writer that copied first is fine too.
 */
static void vmm_dedup_copy_out(struct vmm_dedup *dd, uint64_t page)
{
	uint8_t *p = dd->m->ram + page * PROTO_PAGE_SIZE;

	vmm_uffd__wp(dd->uffd, p, PROTO_PAGE_SIZE, false, false);
	if (madvise(p, PROTO_PAGE_SIZE, MADV_POPULATE_WRITE))
		__atomic_fetch_add(p, 0, __ATOMIC_SEQ_CST); /* older kernels: a write that changes nothing */
}

/*
 * Page @page was written: withdraw its offer, give back its slot, queue it to
 * be hashed again. @copied: the writer's private copy exists already (the
 * kernel copied on write for KVM or a device); otherwise take it here first.
 */
void vmm_dedup_written(struct vmm_dedup *dd, uint64_t page, bool copied)
{
	uint64_t ref = dd->ref[page];

	switch (vmm_dedup_state(dd, page)) {
	case VMM_PG_HASHED:
		vmm_dedup_send(dd, PROTO_OP_FORGET, page, NULL, 0, 0);
		vmm_dedup_mark_dirty(dd, page);
		break;
	case VMM_PG_SHARED:
		dd->st.cow_breaks++;
		if (!copied)
			vmm_dedup_copy_out(dd, page);
		vmm_dedup_send(dd, PROTO_OP_DROP, page, NULL, (uint32_t)(ref / dd->pool.seg_pages),
			       (uint32_t)(ref % dd->pool.seg_pages));
		vmm_dedup_mark_dirty(dd, page);
		break;
	case VMM_PG_ORPHAN:
		dd->st.cow_breaks++;
		if (!copied)
			vmm_dedup_copy_out(dd, page);
		vmm_dedup_mark_dirty(dd, page);
		break;
	case VMM_PG_ZERO:
		vmm_dedup_mark_dirty(dd, page);
		break;
	default:
		break; /* NEW or already DIRTY: nothing to undo */
	}
}

static void vmm_dedup_fault(struct vmm_dedup *dd, uint64_t addr)
{
	uint64_t base = (uint64_t)(uintptr_t)dd->m->ram, page;

	if (addr < base || addr - base >= dd->m->size)
		return;
	page = (addr - base) / PROTO_PAGE_SIZE;
	dd->st.wp_faults++;
	vmm_dedup_written(dd, page, false);
	vmm_track_unprotect(dd, page, true);
}

void vmm_dedup_faults(struct vmm_dedup *dd)
{
	struct uffd_msg msg[64];
	ssize_t n;

	if (dd->uffd < 0)
		return; /* KVM dirty log: nothing faults to us */
	while ((n = read(dd->uffd, msg, sizeof(msg))) > 0) {
		for (ssize_t i = 0; i < n / (ssize_t)sizeof(msg[0]); i++) {
			uint64_t addr = msg[i].arg.pagefault.address & ~(uint64_t)(PROTO_PAGE_SIZE - 1);

			if (msg[i].event != UFFD_EVENT_PAGEFAULT)
				continue;
			if (msg[i].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP)
				vmm_dedup_fault(dd, addr);
			else
				vmm_uffd__wake(dd->uffd, (void *)(uintptr_t)addr, PROTO_PAGE_SIZE);
		}
	}
}

/* --- hashing ------------------------------------------------------------ */

#define VMM_PAUSE_WAIT_NS 2000000000ull /* vCPUs that do not stop for this long: skip */

/*
 * Keep the pages the hypervisor writes out of dedup (VMM_PG_PINNED). Called
 * with the vCPUs parked, so a page it names now is one no merge or discard of
 * this batch may touch. A HASHED page is withdrawn from the pool and left
 * unprotected; a SHARED or ZERO one keeps its protection, and the next write,
 * KVM's included (it maps the page for writing through the VMM's page tables),
 * breaks it through the fault path as usual.
 */
static void vmm_dedup_pin_hv(struct vmm_dedup *dd)
{
	uint64_t gpa[VMM_MEM_HV_PAGES_MAX];
	unsigned n;

	if (!dd->m->vcpus.hv_pages)
		return;
	n = dd->m->vcpus.hv_pages(dd->m->vcpus.opaque, gpa, VMM_MEM_HV_PAGES_MAX);
	for (unsigned i = 0; i < n; i++) {
		uint64_t page = gpa[i] / PROTO_PAGE_SIZE;

		if (gpa[i] >= dd->m->size || (dd->state[page] & VMM_PG_PINNED))
			continue;
		dd->state[page] |= VMM_PG_PINNED;
		dd->st.pages_pinned++;
		log_debug("dedup: page %llu pinned: the hypervisor writes it",
			  (unsigned long long)page);
		if (vmm_dedup_state(dd, page) == VMM_PG_HASHED) {
			vmm_dedup_written(dd, page, true); /* FORGET; never hashed again */
			vmm_track_unprotect(dd, page, false);
		}
	}
}

/*
 * KVM guests: every vCPU out of KVM_RUN before pages are compared and
 * remapped, or found zero and discarded (see struct vmm_mem_vcpus). A vCPU may be blocked in a write fault
 * on a protected page, which only this thread resolves, so keep serving
 * faults while waiting. Returns false (merge nothing) if the vCPUs do not
 * stop within VMM_PAUSE_WAIT_NS.
 */
bool vmm_dedup_pause_vcpus(struct vmm_dedup *dd)
{
	const struct vmm_mem_vcpus *v = &dd->m->vcpus;
	uint64_t until = util_now_ns() + VMM_PAUSE_WAIT_NS;

	if (!v->pause)
		return true;
	v->pause(v->opaque);
	while (!v->paused(v->opaque)) {
		struct pollfd p = { .fd = dd->uffd, .events = POLLIN };

		if (util_now_ns() > until) {
			log_warn("dedup: vCPUs did not stop within %llu ms; work skipped",
				 (unsigned long long)(VMM_PAUSE_WAIT_NS / 1000000));
			v->resume(v->opaque);
			return false;
		}
		if (poll(&p, 1, 1) > 0)
			vmm_dedup_faults(dd);
	}
	/* from here to resume: no vCPU runs, no device write starts or ends */
	vmm_track_hold(dd);
	vmm_dedup_pin_hv(dd);
	vmm_track_harvest(dd, true);
	return true;
}

void vmm_dedup_resume_vcpus(struct vmm_dedup *dd)
{
	vmm_track_release(dd);
	if (dd->m->vcpus.resume)
		dd->m->vcpus.resume(dd->m->vcpus.opaque);
}

static void vmm_dedup_discard_zero(struct vmm_dedup *dd, const uint64_t *pg, unsigned n)
{
	if (!n || !vmm_dedup_pause_vcpus(dd))
		return; /* not discarded: the pages stay protected as NEW, the sweep comes back */
	for (unsigned i = 0; i < n;) {
		unsigned j = i + 1;

		while (j < n && pg[j] == pg[j - 1] + 1)
			j++;
		/*
		 * Protect again: a fault served while the vCPUs were stopping unprotected
		 * its page. With the vCPUs parked and host writers held by the
		 * protection (or by dev_lock and the in-flight list, see track.c), a
		 * page still zero now is zero when it goes.
		 */
		vmm_track_protect_run(dd, pg[i], j - i);
		for (unsigned k = i, z; k < j; k = z) {
			uint8_t *p = dd->m->ram + pg[k] * PROTO_PAGE_SIZE;

			for (z = k; z < j && !(dd->state[pg[z]] & VMM_PG_PINNED) &&
			     !vmm_track_dma_busy(dd, pg[z]) &&
			     util_page_is_zero(p + (uint64_t)(z - k) * PROTO_PAGE_SIZE); z++)
				;
			if (z == k) {
				z++; /* written meanwhile: left as it is, the sweep comes back */
				continue;
			}
			if (madvise(p, (uint64_t)(z - k) * PROTO_PAGE_SIZE, MADV_DONTNEED))
				continue;
			/* with WP_UNPOPULATED (or a dirty log) the next write is tracked */
			vmm_track_protect_run(dd, pg[k], z - k);
			for (unsigned q = k; q < z; q++) {
				vmm_dedup_set_state(dd, pg[q], VMM_PG_ZERO);
				vmm_dedup_send(dd, PROTO_OP_ZERO, pg[q], NULL, 0, 0);
			}
		}
		i = j;
	}
	vmm_dedup_resume_vcpus(dd);
}

/* Protect, then hash: @pg sorted ascending, no duplicates. */
static void vmm_dedup_hash_pages(struct vmm_dedup *dd, const uint64_t *pg, unsigned n,
				 uint16_t flags)
{
	uint64_t zero[VMM_BATCH], t = util_now_ns();
	unsigned nzero = 0;
	uint32_t now_us = vmm_dedup_now_us(dd);

	vmm_track_protect(dd, pg, n);
	if (!dd->st.first_hash_ns)
		dd->st.first_hash_ns = t;
	for (unsigned i = 0; i < n; i++) {
		const uint8_t *p = dd->m->ram + pg[i] * PROTO_PAGE_SIZE;
		struct proto_sqe e = { .page = pg[i], .op = PROTO_OP_OFFER, .flags = flags };

		dd->st.pages_hashed++;
		if (!dd->test_no_zero && !(dd->state[pg[i]] & VMM_PG_FILEVMA) && util_page_is_zero(p)) {
			zero[nzero++] = pg[i];
			continue;
		}
		util_hash_page(p, e.hash);
		vmm_dedup_set_state(dd, pg[i], VMM_PG_HASHED);
		dd->ref[pg[i]] = now_us;
		vmm_pool__push(&dd->pool, &e);
	}
	vmm_dedup_discard_zero(dd, zero, nzero);
	dd->st.hash_ns += util_now_ns() - t;
}

static int vmm_dedup_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static bool vmm_dedup_wants_hash(const struct vmm_dedup *dd, uint64_t page)
{
	enum vmm_pg s = vmm_dedup_state(dd, page);

	return (s == VMM_PG_NEW || s == VMM_PG_DIRTY) && !(dd->state[page] & VMM_PG_PINNED);
}

static unsigned vmm_dedup_take_hints(struct vmm_dedup *dd, uint64_t *pg, unsigned max)
{
	unsigned n = 0;

	pthread_mutex_lock(&dd->hint_lock);
	while (dd->nhints && n < max) {
		uint64_t *h = dd->hints[dd->nhints - 1];

		while (h[1] && n < max) {
			if (vmm_dedup_wants_hash(dd, h[0]))
				pg[n++] = h[0];
			h[0]++;
			h[1]--;
		}
		if (!h[1])
			dd->nhints--;
	}
	pthread_mutex_unlock(&dd->hint_lock);
	return n;
}

static unsigned vmm_dedup_take_dirty(struct vmm_dedup *dd, uint64_t *pg, unsigned max)
{
	uint32_t now_ms = vmm_dedup_now_ms(dd);
	unsigned n = 0;

	while (dd->dq_len && n < max) {
		uint64_t page = dd->dq[dd->dq_head];

		if (vmm_dedup_state(dd, page) == VMM_PG_DIRTY &&
		    now_ms - dd->ref[page] < VMM_SETTLE_MS)
			break;
		dd->dq_head = (dd->dq_head + 1) % dd->m->pages;
		dd->dq_len--;
		dd->state[page] &= (uint8_t)~VMM_PG_QUEUED;
		if (vmm_dedup_wants_hash(dd, page))
			pg[n++] = page;
	}
	return n;
}

/* True if [first, first+n) holds a NEW page at all (skips the pagemap read). */
static bool vmm_dedup_any_new(const struct vmm_dedup *dd, uint64_t first, uint64_t n)
{
	for (uint64_t i = first; i < first + n; i++)
		if (vmm_dedup_state(dd, i) == VMM_PG_NEW)
			return true;
	return false;
}

static unsigned vmm_dedup_take_new(struct vmm_dedup *dd, uint64_t *pg, unsigned max,
				   uint64_t now)
{
	static __thread uint64_t pm[VMM_SWEEP_CHUNK];
	uint64_t pages = dd->m->pages, scanned = 0;
	unsigned n = 0;

	if (now < dd->sweep_at_ns)
		return 0;
	while (n < max && scanned < 4 * VMM_SWEEP_CHUNK) {
		uint64_t cnt, i;

		if (dd->sweep_pos >= pages) {
			dd->sweep_pos = 0;
			if (!dd->sweep_found) {
				dd->sweep_backoff_ns = dd->sweep_backoff_ns ? dd->sweep_backoff_ns * 2 :
							10000000ull;
				if (dd->sweep_backoff_ns > VMM_SWEEP_BACKOFF_NS)
					dd->sweep_backoff_ns = VMM_SWEEP_BACKOFF_NS;
				dd->sweep_at_ns = now + dd->sweep_backoff_ns;
				return n;
			}
			dd->sweep_found = false;
			dd->sweep_backoff_ns = 0;
			/*
			 * The last pass found content: the guest is still
			 * writing, so come back soon, not at once; a pass reads
			 * pagemap over every NEW page, written or not.
			 */
			dd->sweep_at_ns = now + VMM_SWEEP_PACE_NS;
			return n;
		}
		cnt = pages - dd->sweep_pos < VMM_SWEEP_CHUNK ? pages - dd->sweep_pos : VMM_SWEEP_CHUNK;
		scanned += cnt;
		if (!vmm_dedup_any_new(dd, dd->sweep_pos, cnt) ||
		    vmm_dedup_pagemap(dd, dd->sweep_pos, cnt, pm)) {
			dd->sweep_pos += cnt;
			continue;
		}
		for (i = 0; i < cnt && n < max; i++)
			if (vmm_dedup_state(dd, dd->sweep_pos + i) == VMM_PG_NEW &&
			    !(dd->state[dd->sweep_pos + i] & VMM_PG_PINNED) &&
			    (pm[i] & (PM_PRESENT | PM_SWAP)))
				pg[n++] = dd->sweep_pos + i;
		dd->sweep_pos += i;
	}
	if (n)
		dd->sweep_found = true;
	return n;
}

/* One unit of hashing work; true if there was any. */
static bool vmm_dedup_work(struct vmm_dedup *dd, uint64_t now)
{
	uint64_t pg[VMM_BATCH];
	unsigned n;

	if (!vmm_pool__up(&dd->pool) || vmm_pool__pending(&dd->pool) > dd->pool.hdr.sq_entries / 2 ||
	    now < dd->throttle_until_ns)
		return false;
	n = vmm_dedup_take_hints(dd, pg, VMM_BATCH);
	if (n) {
		qsort(pg, n, sizeof(pg[0]), vmm_dedup_cmp_u64);
		vmm_dedup_hash_pages(dd, pg, n, PROTO_SQE_FILE_READ);
		return true;
	}
	n = vmm_dedup_take_dirty(dd, pg, VMM_BATCH);
	if (n < VMM_BATCH)
		n += vmm_dedup_take_new(dd, pg + n, VMM_BATCH - n, now);
	if (!n)
		return false;
	qsort(pg, n, sizeof(pg[0]), vmm_dedup_cmp_u64);
	for (unsigned i = 1, k = 1; i <= n; i++) {
		if (i == n) {
			n = k;
			break;
		}
		if (pg[i] != pg[k - 1])
			pg[k++] = pg[i];
	}
	vmm_dedup_hash_pages(dd, pg, n, 0);
	return true;
}

/* Keep busy / (busy + idle) under cpu_pct by pausing hashing after each unit. */
static void vmm_dedup_throttle(struct vmm_dedup *dd, uint64_t now)
{
	uint64_t cpu = util_thread_cpu_ns(), used = cpu - dd->cpu_mark_ns;
	unsigned pct = dd->m->cpu_pct;

	dd->cpu_mark_ns = cpu;
	if (pct >= 100)
		return;
	dd->throttle_until_ns = now + used * (100 - pct) / pct;
}

/* --- the pool connection ----------------------------------------------- */

void vmm_dedup_disconnect(struct vmm_dedup *dd, const char *why)
{
	if (!vmm_pool__up(&dd->pool))
		return;
	log_warn("dedup: lost the pool (%s); the guest keeps running, retrying every second", why);
	vmm_merge__reset(dd);
	vmm_pool__close(&dd->pool);
	/* offered pages are offered again to the next pool; shared ones stay mapped */
	for (uint64_t p = 0; p < dd->m->pages; p++) {
		enum vmm_pg s = vmm_dedup_state(dd, p);

		if (s == VMM_PG_HASHED)
			vmm_dedup_set_state(dd, p, VMM_PG_NEW);
		else if (s == VMM_PG_SHARED)
			vmm_dedup_set_state(dd, p, VMM_PG_ORPHAN);
	}
	dd->st.pool_connected = false;
	dd->reconnect_at_ns = util_now_ns() + VMM_RECONNECT_NS;
}

static void vmm_dedup_connect(struct vmm_dedup *dd, uint64_t now)
{
	struct vmm_mem *m = dd->m;
	int ret;

	ret = vmm_pool__connect(&dd->pool, m->pool_path, m->domain, m->name, m->pages);
	if (ret) {
		dd->reconnect_at_ns = now + VMM_RECONNECT_NS;
		if (!dd->ever_connected && !dd->st.pool_reconnects++)
			log_warn("dedup: cannot reach the pool at %s: %s (retrying every second)",
				 m->pool_path, strerror(-ret));
		return;
	}
	if (!dd->ever_connected)
		dd->st.pool_reconnects = 0;
	else
		dd->st.pool_reconnects++;
	dd->ever_connected = true;
	dd->st.pool_connected = true;
	vmm_merge__connected(dd);
	/*
	 * Pages still mapped from a lost pool's segments are offered to this
	 * one: otherwise a VM started after a pool restart could never share
	 * with them. They stay mapped (and shared with the VMs that map the same
	 * old slot) until a MAP from the new pool replaces them.
	 */
	for (uint64_t p = 0; p < m->pages; p++)
		if (vmm_dedup_state(dd, p) == VMM_PG_ORPHAN)
			vmm_dedup_set_state(dd, p, VMM_PG_NEW);
	dd->sweep_pos = 0;
	dd->sweep_at_ns = 0;
	dd->sweep_backoff_ns = 0;
	log_info("dedup: connected to the pool at %s as client %u", m->pool_path,
		 dd->pool.client_id);
}

/* The pool never speaks unasked on the control socket: anything there is EOF or garbage. */
static void vmm_dedup_check_sock(struct vmm_dedup *dd, short revents)
{
	char c;
	ssize_t n;

	if (revents & (POLLERR | POLLHUP | POLLNVAL)) {
		vmm_dedup_disconnect(dd, "control socket closed");
		return;
	}
	if (!(revents & POLLIN))
		return;
	n = recv(dd->pool.sock, &c, 1, MSG_DONTWAIT);
	if (n < 0 && errno == EAGAIN)
		return;
	vmm_dedup_disconnect(dd, n == 0 ? "control socket closed" : "unsolicited control message");
}

/* --- the thread ---------------------------------------------------------- */

static void vmm_dedup_publish(struct vmm_dedup *dd)
{
	struct vmm_mem_stats *st = &dd->st;

	st->pages = dd->m->pages;
	st->pages_shared = dd->count[VMM_PG_SHARED] + dd->count[VMM_PG_ORPHAN];
	st->pages_zero = dd->count[VMM_PG_ZERO];
	st->pages_private = dd->count[VMM_PG_HASHED] + dd->count[VMM_PG_DIRTY];
	st->bytes_saved = (st->pages_shared + st->pages_zero) * PROTO_PAGE_SIZE;
	st->dedup_cpu_ns = util_thread_cpu_ns();
	pthread_mutex_lock(&dd->m->stats_lock);
	dd->m->pub = *st;
	pthread_mutex_unlock(&dd->m->stats_lock);
}

static int vmm_dedup_timeout(struct vmm_dedup *dd, uint64_t now, bool busy)
{
	uint64_t wake = now + 1000000000ull;

	if (busy || dd->nhints)
		wake = dd->throttle_until_ns > now ? dd->throttle_until_ns : now;
	if (dd->dq_len) {
		uint64_t due = dd->t0_ns + ((uint64_t)dd->ref[dd->dq[dd->dq_head]] + VMM_SETTLE_MS) *
			       1000000ull;

		if (due < wake)
			wake = due;
	}
	if (vmm_pool__up(&dd->pool)) {
		if (dd->sweep_at_ns < wake)
			wake = dd->sweep_at_ns;
		if (dd->nmapv && dd->mapv_due_ns < wake)
			wake = dd->mapv_due_ns;
		if (now + 100000000ull < wake)
			wake = now + 100000000ull; /* doorbell safety net */
	} else if (dd->reconnect_at_ns < wake) {
		wake = dd->reconnect_at_ns;
	}
	if (dd->kvm_dirty && dd->harvest_at_ns < wake)
		wake = dd->harvest_at_ns; /* COW breaks reach the pool promptly */
	if (wake > now && wake < dd->throttle_until_ns && (busy || dd->nhints))
		wake = dd->throttle_until_ns;
	return wake <= now ? 0 : (int)((wake - now + 999999) / 1000000);
}

static void *vmm_dedup_main(void *arg)
{
	struct vmm_dedup *dd = arg;
	bool busy = true;

	dd->cpu_mark_ns = util_thread_cpu_ns();
	while (!__atomic_load_n(&dd->stop, __ATOMIC_ACQUIRE)) {
		struct pollfd pfd[4] = {
			{ .fd = dd->uffd, .events = POLLIN },
			{ .fd = dd->ctl_efd, .events = POLLIN },
			{ .fd = dd->pool.sock, .events = POLLIN },
			{ .fd = dd->pool.cq_efd, .events = POLLIN },
		};
		uint64_t now = util_now_ns(), v;

		if (poll(pfd, 4, vmm_dedup_timeout(dd, now, busy)) < 0 && errno != EINTR)
			log_warn("dedup: poll: %s", strerror(errno));
		if (pfd[1].revents && read(dd->ctl_efd, &v, sizeof(v)) < 0)
			log_debug("dedup: control eventfd: %s", strerror(errno));
		vmm_dedup_faults(dd);
		vmm_track_harvest(dd, false);
		if (vmm_pool__up(&dd->pool))
			vmm_dedup_check_sock(dd, pfd[2].revents);
		if (vmm_pool__up(&dd->pool)) {
			vmm_pool__ack(&dd->pool);
			vmm_merge__completions(dd);
			vmm_dedup_faults(dd);
		}
		now = util_now_ns();
		if (!vmm_pool__up(&dd->pool) && now >= dd->reconnect_at_ns)
			vmm_dedup_connect(dd, now);
		busy = vmm_dedup_work(dd, now);
		if (busy)
			vmm_dedup_throttle(dd, util_now_ns());
		if (vmm_pool__up(&dd->pool) && vmm_pool__flush(&dd->pool))
			vmm_dedup_disconnect(dd, "doorbell failed");
		vmm_dedup_publish(dd);
	}
	return NULL;
}

/* --- lifecycle ----------------------------------------------------------- */

static uint64_t vmm_dedup_env(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 10) : 0;
}

static void vmm_dedup_vma_budget(struct vmm_dedup *dd)
{
	char buf[32] = "";
	ssize_t n;
	uint64_t headroom;
	int fd = open("/proc/sys/vm/max_map_count", O_RDONLY | O_CLOEXEC);

	dd->max_map_count = 65530;
	if (fd >= 0) {
		n = read(fd, buf, sizeof(buf) - 1);
		if (n > 0)
			dd->max_map_count = strtoull(buf, NULL, 10);
		close(fd);
	}
	vmm_merge__count_vmas(dd);
	headroom = dd->max_map_count / 10 + 1000;
	if (dd->m->vma_budget)
		dd->vma_budget = dd->m->vma_budget;
	else if (dd->max_map_count > dd->vma_base + headroom)
		dd->vma_budget = dd->max_map_count - dd->vma_base - headroom;
	else
		dd->vma_budget = 0;
	log_debug("dedup: vm.max_map_count %llu, %llu VMAs in use, budget %llu",
		  (unsigned long long)dd->max_map_count, (unsigned long long)dd->vma_base,
		  (unsigned long long)dd->vma_budget);
}

static void vmm_dedup_free(struct vmm_dedup *dd)
{
	if (dd->uffd >= 0)
		close(dd->uffd); /* wakes every blocked writer: they retry unprotected */
	if (dd->ctl_efd >= 0)
		close(dd->ctl_efd);
	if (dd->pagemap_fd >= 0)
		close(dd->pagemap_fd);
	vmm_merge__fini(dd);
	vmm_pool__close(&dd->pool);
	pthread_mutex_destroy(&dd->hint_lock);
	pthread_mutex_destroy(&dd->dma_lock);
	pthread_mutex_destroy(&dd->dev_lock);
	vmm_track_free(dd);
	free(dd->hints);
	free(dd->dq);
	free(dd->ref);
	free(dd->state);
	free(dd);
}

int vmm_dedup__create(struct vmm_mem *m, struct vmm_dedup **out)
{
	struct vmm_dedup *dd = calloc(1, sizeof(*dd));
	int ret = -ENOMEM;

	if (!dd)
		return -ENOMEM;
	dd->m = m;
	dd->uffd = dd->ctl_efd = dd->pagemap_fd = -1;
	pthread_mutex_init(&dd->hint_lock, NULL);
	pthread_mutex_init(&dd->dma_lock, NULL);
	pthread_mutex_init(&dd->dev_lock, NULL);
	vmm_pool__init(&dd->pool);
	dd->t0_ns = util_now_ns();
	dd->count[VMM_PG_NEW] = m->pages;
	dd->test_no_wp = vmm_dedup_env("PVISOR_TEST_NO_WP") != 0;
	dd->test_merge_delay_us = vmm_dedup_env("PVISOR_TEST_MERGE_DELAY_US");
	dd->test_no_merge = vmm_dedup_env("PVISOR_TEST_NO_MERGE") != 0;
	dd->test_no_zero = vmm_dedup_env("PVISOR_TEST_NO_ZERO") != 0;
	dd->state = calloc(m->pages, 1);
	dd->ref = calloc(m->pages, sizeof(*dd->ref));
	dd->dq = calloc(m->pages, sizeof(*dd->dq));
	if (!dd->state || !dd->ref || !dd->dq || vmm_merge__init(dd))
		goto err;
	ret = vmm_uffd__open(&dd->uffd, &dd->uffd_features);
	if (ret)
		goto err;
	ret = vmm_uffd__register_wp(dd->uffd, m->ram, m->size);
	if (ret) {
		log_err("dedup: cannot register guest RAM for write protection: %s", strerror(-ret));
		goto err;
	}
	dd->ctl_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	dd->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (dd->ctl_efd < 0 || dd->pagemap_fd < 0) {
		ret = -errno;
		log_err("dedup: eventfd or /proc/self/pagemap: %s", strerror(errno));
		goto err;
	}
	vmm_dedup_vma_budget(dd);
	if (dd->test_no_wp || dd->test_merge_delay_us)
		log_warn("dedup: test knobs on: no_wp=%d merge_delay_us=%llu", dd->test_no_wp,
			 (unsigned long long)dd->test_merge_delay_us);
	*out = dd;
	return 0;
err:
	vmm_dedup_free(dd);
	return ret;
}

int vmm_dedup__start(struct vmm_dedup *dd)
{
	int ret = vmm_track_start(dd);

	if (ret)
		return ret;
	ret = pthread_create(&dd->thread, NULL, vmm_dedup_main, dd);
	if (ret)
		return -ret;
	pthread_setname_np(dd->thread, "dedup");
	dd->thread_started = true;
	return 0;
}

void vmm_dedup__stop(struct vmm_dedup *dd)
{
	uint64_t one = 1;

	if (!dd->thread_started)
		return;
	__atomic_store_n(&dd->stop, true, __ATOMIC_RELEASE);
	if (write(dd->ctl_efd, &one, sizeof(one)) < 0)
		log_debug("dedup: stop doorbell: %s", strerror(errno));
	pthread_join(dd->thread, NULL);
	dd->thread_started = false;
}

void vmm_dedup__destroy(struct vmm_dedup *dd)
{
	vmm_dedup__stop(dd);
	vmm_dedup_free(dd);
}

void vmm_dedup__hint(struct vmm_dedup *dd, uint64_t first, uint64_t n)
{
	uint64_t one = 1;

	pthread_mutex_lock(&dd->hint_lock);
	if (dd->nhints == dd->hint_cap) {
		uint32_t cap = dd->hint_cap ? dd->hint_cap * 2 : 64;
		void *h = realloc(dd->hints, sizeof(*dd->hints) * cap);

		if (!h) {
			pthread_mutex_unlock(&dd->hint_lock);
			return; /* a hint is only a priority; the sweep finds the pages anyway */
		}
		dd->hints = h;
		dd->hint_cap = cap;
	}
	dd->hints[dd->nhints][0] = first;
	dd->hints[dd->nhints][1] = n;
	dd->nhints++;
	pthread_mutex_unlock(&dd->hint_lock);
	if (write(dd->ctl_efd, &one, sizeof(one)) < 0)
		log_debug("dedup: hint doorbell: %s", strerror(errno));
}
