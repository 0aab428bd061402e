/* merge.c: pool verdicts: uploads through staging slots and race-free remaps in runs. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <fcntl.h>

#include "dedup.h"
#include "log.h"
#include "util.h"

/*
 * DOC: merging a run of guest pages onto pool slots
 *
 * A MAP verdict is advice. The page was write-protected before it was hashed
 * and stays protected while it is HASHED: any write faults into the dedup
 * thread, which is this thread, so while we run no write can land. For each
 * run of consecutive guest pages that got consecutive slots of one segment:
 *
 *   1. every page must still be HASHED (a fault since then made it DIRTY);
 *   2. all 4096 bytes must equal the slot, read through our read-only
 *      mapping of the segment; a page that differs is dropped and splits
 *      the run;
 *   3. mmap(MAP_PRIVATE | MAP_FIXED) replaces the run in one call;
 *   4. MAP_FIXED dropped the userfaultfd registration: register and
 *      write-protect the new range before anyone is woken;
 *   5. UFFDIO_WAKE: a writer that faulted meanwhile retries, faults again on
 *      the new protected mapping and is handled like any shared-page write
 *      (DIRTY, DROP, unprotect, copy-on-write), so no write is lost;
 *   6. MADV_POPULATE_READ maps the shared pages in one call;
 *   7. pagemap: a page that is no longer file-backed was copied on write in
 *      the short window before step 4; it is dirty, its reference dropped.
 *
 * Each run costs at most two VMAs (the file mapping and a split of the
 * anonymous one); runs that would exceed the VMA budget are skipped and
 * their references dropped, the guest keeps its private copy.
 */

#define VMM_MAX_SEGS     (1u << 20) /* segment ids beyond this are garbage */
#define VMM_BAD_MAX      256        /* garbage completions before we hang up */
#define VMM_RECOUNT_NS   100000000ull
#define VMM_PIPELINE     1024       /* merge after this many completions */
#define VMM_MERGE_MIN    512        /* verdicts that make a batch worth remapping now */
#define VMM_MERGE_WAIT_NS 10000000ull /* or the oldest verdict has waited this long */
#define VMM_CMP_PAGES    16         /* slots read per pread for the compare */
#define PM_PRESENT       (1ull << 63)
#define PM_FILE          (1ull << 61)

int vmm_merge__init(struct vmm_dedup *dd)
{
	dd->staging_busy = calloc(1u << 16, 1);
	dd->cmpbuf = aligned_alloc(PROTO_PAGE_SIZE, VMM_CMP_PAGES * PROTO_PAGE_SIZE);
	return dd->staging_busy && dd->cmpbuf ? 0 : -ENOMEM;
}

void vmm_merge__connected(struct vmm_dedup *dd)
{
	memset(dd->staging_busy, 0, 1u << 16);
	dd->staging_free = dd->pool.hdr.staging_slots;
	dd->bad_conn = 0;
}

void vmm_merge__reset(struct vmm_dedup *dd)
{
	for (uint32_t i = 0; i < dd->nsegs; i++) {
		struct vmm_seg *s = &dd->segs[i];

		if (s->ro) {
			munmap(s->ro, s->pages * PROTO_PAGE_SIZE);
			if (dd->vma_used)
				dd->vma_used--;
		}
		if (s->fd >= 0)
			close(s->fd);
		s->fd = -1;
		s->ro = NULL;
		s->pages = 0;
	}
	dd->nmapv = 0;
	dd->upq_len = 0;
	dd->upq_head = 0;
	dd->staging_free = 0;
}

void vmm_merge__fini(struct vmm_dedup *dd)
{
	vmm_merge__reset(dd);
	free(dd->segs);
	free(dd->mapv);
	free(dd->upq);
	free(dd->staging_busy);
	free(dd->cmpbuf);
}

static void vmm_merge_bad(struct vmm_dedup *dd, const struct proto_cqe *c, const char *why)
{
	dd->st.bad_verdicts++;
	dd->bad_conn++;
	if (dd->st.bad_verdicts <= 10 || log_get_level() >= LOG_DEBUG)
		log_warn("dedup: ignoring completion (page %llu verdict %u seg %u slot %u): %s",
			 (unsigned long long)c->page, c->verdict, c->seg, c->slot, why);
}

static int vmm_merge_grow(void **arr, uint32_t *cap, uint32_t need, size_t elem)
{
	uint32_t ncap;
	void *n;

	if (need <= *cap)
		return 0;
	ncap = *cap ? *cap : 256;
	while (ncap < need)
		ncap *= 2;
	n = realloc(*arr, (size_t)ncap * elem);
	if (!n)
		return -ENOMEM;
	*arr = n;
	*cap = ncap;
	return 0;
}

static void vmm_merge_upq_push(struct vmm_dedup *dd, uint64_t page)
{
	if (dd->upq_len == dd->upq_cap &&
	    util_fifo_grow((void **)&dd->upq, &dd->upq_cap, &dd->upq_head, dd->upq_len,
			   sizeof(*dd->upq), 1024))
		return; /* the page stays HASHED, merely unshared */
	dd->upq[(dd->upq_head + dd->upq_len) % dd->upq_cap] = (uint32_t)page;
	dd->upq_len++;
}

static void vmm_merge_map_verdict(struct vmm_dedup *dd, const struct proto_cqe *c)
{
	uint32_t sp = dd->pool.seg_pages;

	if (c->seg >= VMM_MAX_SEGS || c->slot >= sp ||
	    (uint64_t)c->seg * sp + c->slot > UINT32_MAX) {
		vmm_merge_bad(dd, c, "segment or slot out of range");
		return;
	}
	if (vmm_dedup_state(dd, c->page) != VMM_PG_HASHED) {
		/* written since the offer: we will not map it, give the reference back */
		vmm_dedup_send(dd, PROTO_OP_DROP, c->page, NULL, c->seg, c->slot);
		return;
	}
	if (vmm_merge_grow((void **)&dd->mapv, &dd->mapv_cap, dd->nmapv + 1, sizeof(*dd->mapv))) {
		vmm_dedup_send(dd, PROTO_OP_DROP, c->page, NULL, c->seg, c->slot);
		return;
	}
	if (!dd->nmapv)
		dd->mapv_due_ns = util_now_ns() + VMM_MERGE_WAIT_NS;
	dd->mapv[dd->nmapv++] = (struct vmm_mapv){ .page = c->page, .seg = c->seg, .slot = c->slot };
}

static void vmm_merge_cqe(struct vmm_dedup *dd, const struct proto_cqe *c)
{
	if (c->staging != PROTO_NO_STAGING) {
		if (c->staging >= dd->pool.hdr.staging_slots || !dd->staging_busy[c->staging]) {
			vmm_merge_bad(dd, c, "unknown staging slot");
		} else {
			dd->staging_busy[c->staging] = 0;
			dd->staging_free++;
		}
	}
	if (c->page >= dd->m->pages) {
		vmm_merge_bad(dd, c, "page out of range");
		return;
	}
	switch (c->verdict) {
	case PROTO_V_MAP:
		vmm_merge_map_verdict(dd, c);
		break;
	case PROTO_V_UPLOAD:
		if (vmm_dedup_state(dd, c->page) == VMM_PG_HASHED)
			vmm_merge_upq_push(dd, c->page);
		break;
	case PROTO_V_MISMATCH:
		log_debug("dedup: pool says page %llu did not match its hash",
			  (unsigned long long)c->page);
		break;
	case PROTO_V_EINVAL:
		log_debug("dedup: pool refused an entry for page %llu (op %u)",
			  (unsigned long long)c->page, c->op);
		break;
	case PROTO_V_DONE:
	case PROTO_V_NOSPACE:
	case PROTO_V_UNSHARED:
		break;
	default:
		vmm_merge_bad(dd, c, "unknown verdict");
	}
}

static void vmm_merge_uploads(struct vmm_dedup *dd)
{
	uint32_t slots = dd->pool.hdr.staging_slots;

	while (dd->upq_len && dd->staging_free && vmm_pool__up(&dd->pool)) {
		uint64_t page = dd->upq[dd->upq_head], h[2];
		const uint8_t *src = dd->m->ram + page * PROTO_PAGE_SIZE;
		uint32_t s = 0;
		struct proto_sqe e;

		dd->upq_head = (dd->upq_head + 1) % dd->upq_cap;
		dd->upq_len--;
		if (vmm_dedup_state(dd, page) != VMM_PG_HASHED)
			continue;
		/*
		 * Lowest free slot first: the same few staging pages are reused,
		 * so the ring costs only as much memory as uploads in flight.
		 */
		while (s < slots && dd->staging_busy[s])
			s++;
		if (s == slots)
			break;
		/* the page is protected, so copy and hash see the same bytes */
		memcpy(vmm_pool__staging(&dd->pool, s), src, PROTO_PAGE_SIZE);
		util_hash_page(src, h);
		dd->staging_busy[s] = 1;
		dd->staging_free--;
		e = (struct proto_sqe){ .page = page, .hash = { h[0], h[1] }, .op = PROTO_OP_UPLOAD,
					.staging = s };
		if (vmm_pool__push(&dd->pool, &e)) {
			dd->staging_busy[s] = 0;
			dd->staging_free++;
		}
	}
}

static uint64_t vmm_merge_count_maps(void)
{
	char buf[65536];
	uint64_t lines = 0;
	ssize_t n;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		for (ssize_t i = 0; i < n; i++)
			lines += buf[i] == '\n';
	close(fd);
	return lines;
}

/* True if @need more VMAs fit the budget; corrects the estimate now and then. */
static bool vmm_merge_vma_fits(struct vmm_dedup *dd, uint64_t need)
{
	uint64_t now, real;

	if (dd->vma_used + need <= dd->vma_budget)
		return true;
	now = util_now_ns();
	if (now - dd->vma_recount_ns < VMM_RECOUNT_NS)
		return false;
	dd->vma_recount_ns = now;
	real = vmm_merge_count_maps();
	dd->vma_used = real > dd->vma_base ? real - dd->vma_base : 0;
	return dd->vma_used + need <= dd->vma_budget;
}

void vmm_merge__count_vmas(struct vmm_dedup *dd)
{
	dd->vma_base = vmm_merge_count_maps();
}

static struct vmm_seg *vmm_merge_seg(struct vmm_dedup *dd, uint32_t id)
{
	struct vmm_seg *s;
	uint64_t pages;
	void *ro;
	int fd, ret;

	if (id >= dd->nsegs) {
		uint32_t cap = dd->nsegs, old = dd->nsegs;

		if (vmm_merge_grow((void **)&dd->segs, &cap, id + 1, sizeof(*dd->segs)))
			return NULL;
		for (uint32_t i = old; i < cap; i++)
			dd->segs[i] = (struct vmm_seg){ .fd = -1 };
		dd->nsegs = cap;
	}
	s = &dd->segs[id];
	if (s->fd >= 0)
		return s;
	if (!vmm_merge_vma_fits(dd, 1))
		return NULL;
	ret = vmm_pool__seg(&dd->pool, id, &fd, &pages);
	if (ret == -EPROTO || ret == -ETIMEDOUT || ret == -ECONNRESET || ret == -EPIPE) {
		vmm_dedup_disconnect(dd, "segment request failed");
		return NULL;
	}
	if (ret) {
		log_warn("dedup: pool refused segment %u: %s", id, strerror(-ret));
		return NULL;
	}
	ro = mmap(NULL, pages * PROTO_PAGE_SIZE, PROT_READ, MAP_PRIVATE, fd, 0);
	if (ro == MAP_FAILED) {
		log_warn("dedup: cannot map segment %u: %s", id, strerror(errno));
		close(fd);
		return NULL;
	}
	dd->vma_used++;
	*s = (struct vmm_seg){ .fd = fd, .ro = ro, .pages = pages };
	return s;
}

static void vmm_merge_drop(struct vmm_dedup *dd, const struct vmm_mapv *v, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		vmm_dedup_send(dd, PROTO_OP_DROP, v[i].page, NULL, v[i].seg, v[i].slot);
}

/* Step 7: pages copied on write between the remap and the protection. */
static void vmm_merge_check_cow(struct vmm_dedup *dd, const struct vmm_mapv *v, uint32_t n)
{
	uint64_t pm[512];

	for (uint32_t off = 0; off < n; off += 512) {
		uint32_t cnt = n - off < 512 ? n - off : 512;

		if (vmm_dedup_pagemap(dd, v[off].page, cnt, pm))
			return;
		for (uint32_t i = 0; i < cnt; i++) {
			uint64_t page = v[off + i].page;

			if (!(pm[i] & PM_PRESENT) || (pm[i] & PM_FILE))
				continue;
			dd->st.cow_breaks++;
			vmm_dedup_send(dd, PROTO_OP_DROP, page, NULL, v[off + i].seg, v[off + i].slot);
			vmm_dedup_mark_dirty(dd, page);
			vmm_track_unprotect(dd, page, true);
		}
	}
}

static void vmm_merge_remap(struct vmm_dedup *dd, struct vmm_seg *s, const struct vmm_mapv *v,
			    uint32_t n)
{
	uint64_t len = (uint64_t)n * PROTO_PAGE_SIZE, now;
	uint32_t now_us;
	uint8_t *addr;
	void *r;
	int ret;

	if (!n)
		return; /* an empty piece of a split run: v may point past the batch */
	addr = dd->m->ram + v[0].page * PROTO_PAGE_SIZE;
	if (!vmm_merge_vma_fits(dd, 2)) {
		dd->st.vma_skipped += n;
		vmm_merge_drop(dd, v, n);
		return;
	}
	if (dd->test_merge_delay_us)
		usleep((useconds_t)dd->test_merge_delay_us);
	r = mmap(addr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, s->fd,
		 (off_t)v[0].slot * PROTO_PAGE_SIZE);
	if (r == MAP_FAILED) {
		log_warn("dedup: remap of %u pages failed: %s", n, strerror(errno));
		dd->st.vma_skipped += n;
		vmm_merge_drop(dd, v, n);
		return;
	}
	dd->vma_used += 2;
	ret = vmm_track_remapped(dd, v[0].page, n);
	if (ret)
		log_err("dedup: cannot protect a remapped run: %s", strerror(-ret));
	now = util_now_ns();
	now_us = vmm_dedup_now_us(dd);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t ns = (uint64_t)(uint32_t)(now_us - dd->ref[v[i].page]) * 1000;

		vmm_dedup_set_state(dd, v[i].page, VMM_PG_SHARED);
		dd->state[v[i].page] |= VMM_PG_FILEVMA;
		dd->ref[v[i].page] = v[i].seg * dd->pool.seg_pages + v[i].slot;
		dd->st.merges++;
		dd->st.merge_ns_last = ns;
		dd->merge_ns_sum += ns;
	}
	dd->st.merge_ns_avg = dd->merge_ns_sum / dd->st.merges;
	dd->st.last_merge_ns = now;
	vmm_track_wake(dd, v[0].page, n);
	if (madvise(addr, len, MADV_POPULATE_READ) && errno != EINVAL)
		log_debug("dedup: MADV_POPULATE_READ: %s", strerror(errno));
	vmm_merge_check_cow(dd, v, n);
}

/*
 * Does page v[i] hold the bytes of its slot? The slots are read with pread
 * into a small buffer that stays mapped, VMM_CMP_PAGES at a time: touching
 * each slot through a fresh mapping costs a page fault per page (~11 us
 * here), a hundred times the compare itself.
 */
static bool vmm_merge_same(struct vmm_dedup *dd, struct vmm_seg *s, const struct vmm_mapv *v,
			   uint32_t i, uint32_t n)
{
	uint64_t off;

	if (i < dd->cmp_first || i >= dd->cmp_first + dd->cmp_n) {
		uint32_t cnt = n - i < VMM_CMP_PAGES ? n - i : VMM_CMP_PAGES;
		ssize_t got;

		off = (uint64_t)v[i].slot * PROTO_PAGE_SIZE;
		got = pread(s->fd, dd->cmpbuf, (size_t)cnt * PROTO_PAGE_SIZE, (off_t)off);
		dd->cmp_first = i;
		dd->cmp_n = got > 0 ? (uint32_t)(got / PROTO_PAGE_SIZE) : 0;
		if (!dd->cmp_n)
			return false;
	}
	return !memcmp(dd->m->ram + v[i].page * PROTO_PAGE_SIZE,
		       dd->cmpbuf + (uint64_t)(i - dd->cmp_first) * PROTO_PAGE_SIZE, PROTO_PAGE_SIZE);
}

/* One run: consecutive pages, consecutive slots, one segment. */
static void vmm_merge_run(struct vmm_dedup *dd, const struct vmm_mapv *v, uint32_t n)
{
	struct vmm_seg *s = vmm_merge_seg(dd, v[0].seg);
	uint32_t start = 0;

	if (!vmm_pool__up(&dd->pool))
		return;
	if (!s || v[0].slot + (uint64_t)n > s->pages) {
		if (s)
			dd->st.bad_verdicts++;
		else
			dd->st.vma_skipped += n;
		vmm_merge_drop(dd, v, n);
		return;
	}
	if (dd->test_no_wp)
		vmm_track_unprotect_run(dd, v[0].page, n, false);
	dd->cmp_first = dd->cmp_n = 0; /* cmpbuf holds nothing of this run yet */
	for (uint32_t i = 0; i < n; i++) {
		/* a page a device is writing into is not merged (dirty-log tracking) */
		bool hashed = vmm_dedup_state(dd, v[i].page) == VMM_PG_HASHED &&
			      !vmm_track_dma_busy(dd, v[i].page);

		if (hashed && vmm_merge_same(dd, s, v, i, n))
			continue;
		if (hashed)
			dd->st.merge_fail++;
		vmm_merge_remap(dd, s, v + start, i - start);
		vmm_dedup_send(dd, PROTO_OP_DROP, v[i].page, NULL, v[i].seg, v[i].slot);
		start = i + 1;
	}
	vmm_merge_remap(dd, s, v + start, n - start);
}

static int vmm_merge_cmp(const void *a, const void *b)
{
	const struct vmm_mapv *x = a, *y = b;

	return x->page < y->page ? -1 : x->page > y->page;
}

static void vmm_merge_batch(struct vmm_dedup *dd)
{
	uint32_t n = dd->nmapv, i = 0;

	if (!n)
		return;
	dd->nmapv = 0;
	qsort(dd->mapv, n, sizeof(*dd->mapv), vmm_merge_cmp);
	if (dd->test_no_merge || !vmm_dedup_pause_vcpus(dd)) {
		vmm_merge_drop(dd, dd->mapv, n);
		return;
	}
	while (i < n && vmm_pool__up(&dd->pool)) {
		uint32_t j = i + 1;

		while (j < n && dd->mapv[j].page == dd->mapv[j - 1].page + 1 &&
		       dd->mapv[j].seg == dd->mapv[i].seg &&
		       dd->mapv[j].slot == dd->mapv[j - 1].slot + 1)
			j++;
		vmm_merge_run(dd, dd->mapv + i, j - i);
		i = j;
	}
	vmm_dedup_resume_vcpus(dd);
}

void vmm_merge__completions(struct vmm_dedup *dd)
{
	struct proto_cqe c;
	unsigned n = 0;

	while (vmm_pool__up(&dd->pool) && vmm_pool__pop(&dd->pool, &c)) {
		vmm_merge_cqe(dd, &c);
		if (dd->bad_conn > VMM_BAD_MAX) {
			vmm_dedup_disconnect(dd, "pool keeps sending garbage");
			return;
		}
		/* pipeline: never hold a whole working set of verdicts */
		if (++n % VMM_PIPELINE == 0) {
			vmm_merge_uploads(dd);
			vmm_merge_batch(dd);
			vmm_pool__flush(&dd->pool);
		}
	}
	if (!vmm_pool__up(&dd->pool))
		return;
	vmm_merge_uploads(dd);
	/*
	 * Verdicts trickle in; remapping each handful costs a TLB shootdown of
	 * every CPU the guest runs on. Wait up to VMM_MERGE_WAIT_NS for a batch
	 * worth a shootdown (the pages stay protected meanwhile).
	 */
	if (dd->nmapv >= VMM_MERGE_MIN || (dd->nmapv && util_now_ns() >= dd->mapv_due_ns))
		vmm_merge_batch(dd);
}
