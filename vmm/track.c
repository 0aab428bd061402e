/* track.c: how the plane learns of guest writes: write faults, or KVM's dirty log and device reports. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dedup.h"
#include "log.h"
#include "uffd.h"
#include "util.h"

/*
 * DOC: write tracking
 *
 * The plane must see every write to a page it has hashed, merged or
 * discarded. Two ways, chosen when the dedup thread starts:
 *
 * - Write protection (userfaultfd WP), for host-driven guests and for KVM
 *   guests without a dirty log: a hashed page is protected, and its first
 *   write, by any thread or by KVM on a vCPU's behalf, faults to the dedup
 *   thread, which undoes the page's sharing and lets the writer go on.
 *
 * - KVM's dirty log, for KVM guests (struct vmm_mem_vcpus.dirty_get). Hashing
 *   a page clears its dirty bit, which write-protects it in KVM's page tables
 *   only; KVM handles the next vCPU write itself and sets the bit again. The
 *   dedup thread reads the log every VMM_HARVEST_NS and with the vCPUs
 *   stopped before each batch of merges or discards, so a page written since
 *   its hash is never merged. A vCPU write to a merged page is copied on write
 *   by the kernel (the page is a private file mapping), so the copy exists
 *   before the plane DROPs the slot. No vCPU ever sleeps in a userfaultfd
 *   fault. That sleep, inside KVM's nested-paging fault handler, is what
 *   broke two guests booting in the nested test machine: Debian 6.1 under
 *   QEMU's emulated SVM overflowed the vCPU thread's kernel stack.
 *
 *   The log does not see host threads. Devices bracket the writes they
 *   leave to the kernel (io_uring reads into guest RAM) with
 *   vmm_mem__dma_begin/_end: a page inside an unfinished one is neither
 *   merged nor discarded, and a finished one counts as written at the next
 *   harvest. Writes a device makes itself (status bytes, used rings) happen
 *   between vmm_mem__dev_enter/_leave, which excludes a batch: the plane holds
 *   dev_lock and then dma_lock from the vCPUs' stop to their restart. Such a
 *   write is not reported; a page it changes fails the compare before a
 *   merge, or was copied on write from its slot.
 */

#define VMM_HARVEST_NS 10000000ull /* the dirty log is read at least this often */

int vmm_track_start(struct vmm_dedup *dd)
{
	uint64_t words = (dd->m->pages + 63) / 64;

	if (!dd->m->vcpus.dirty_get || !dd->m->vcpus.dirty_clear)
		return 0;
	dd->dirty_bm = calloc(words, sizeof(uint64_t));
	dd->clear_bm = calloc(words, sizeof(uint64_t));
	if (!dd->dirty_bm || !dd->clear_bm)
		return -ENOMEM;
	/* closing the userfaultfd unregisters guest RAM: nothing faults to us any more */
	if (dd->uffd >= 0)
		close(dd->uffd);
	dd->uffd = -1;
	__atomic_store_n(&dd->kvm_dirty, true, __ATOMIC_RELEASE);
	log_debug("dedup: tracking vCPU writes with KVM's dirty log");
	return 0;
}

void vmm_track_free(struct vmm_dedup *dd)
{
	free(dd->dirty_bm);
	free(dd->clear_bm);
	free(dd->dma);
	free(dd->dma_done);
}

/* KVM: clear the dirty bits of the pages set in clear_bm from word w0 on. */
static void vmm_track_clear(struct vmm_dedup *dd, uint64_t w0, uint64_t words)
{
	uint64_t first = w0 * 64, n = words * 64;
	int ret;

	if (n > dd->m->pages - first)
		n = dd->m->pages - first;
	ret = dd->m->vcpus.dirty_clear(dd->m->vcpus.opaque, first, n, dd->clear_bm + w0);
	if (ret)
		log_warn("dedup: KVM_CLEAR_DIRTY_LOG: %s; pages stay unmerged", strerror(-ret));
}

/* Start tracking writes to @pg (sorted ascending): their next write is seen. */
void vmm_track_protect(struct vmm_dedup *dd, const uint64_t *pg, unsigned n)
{
	uint64_t w0, w1;

	if (!n)
		return;
	if (!dd->kvm_dirty) {
		for (unsigned i = 0; i < n;) {
			unsigned j = i + 1;

			while (j < n && pg[j] == pg[j - 1] + 1)
				j++;
			vmm_track_protect_run(dd, pg[i], j - i);
			i = j;
		}
		return;
	}
	w0 = pg[0] / 64;
	w1 = pg[n - 1] / 64;
	memset(dd->clear_bm + w0, 0, (w1 - w0 + 1) * sizeof(uint64_t));
	for (unsigned i = 0; i < n; i++)
		dd->clear_bm[pg[i] / 64] |= 1ull << (pg[i] % 64);
	vmm_track_clear(dd, w0, w1 - w0 + 1);
}

void vmm_track_protect_run(struct vmm_dedup *dd, uint64_t first, uint64_t n)
{
	uint64_t w0 = first / 64, w1 = (first + n - 1) / 64;

	if (!n)
		return;
	if (!dd->kvm_dirty) {
		vmm_uffd__wp(dd->uffd, dd->m->ram + first * PROTO_PAGE_SIZE, n * PROTO_PAGE_SIZE,
			     true, false);
		return;
	}
	memset(dd->clear_bm + w0, 0, (w1 - w0 + 1) * sizeof(uint64_t));
	for (uint64_t p = first; p < first + n; p++)
		dd->clear_bm[p / 64] |= 1ull << (p % 64);
	vmm_track_clear(dd, w0, w1 - w0 + 1);
}

/* Write faults only: let writes to [first, first+n) through again (and wake their writers). */
void vmm_track_unprotect_run(struct vmm_dedup *dd, uint64_t first, uint64_t n, bool wake)
{
	if (!dd->kvm_dirty)
		vmm_uffd__wp(dd->uffd, dd->m->ram + first * PROTO_PAGE_SIZE, n * PROTO_PAGE_SIZE,
			     false, wake);
}

void vmm_track_unprotect(struct vmm_dedup *dd, uint64_t page, bool wake)
{
	vmm_track_unprotect_run(dd, page, 1, wake);
}

/*
 * A run was just remapped from a pool segment: the new VMA needs registering
 * and protecting for write faults. A dirty log needs nothing: the slot pages
 * are read-only, so a vCPU write copies on write and sets the page's bit.
 */
int vmm_track_remapped(struct vmm_dedup *dd, uint64_t first, uint64_t n)
{
	uint8_t *addr = dd->m->ram + first * PROTO_PAGE_SIZE;
	int ret;

	if (dd->kvm_dirty)
		return 0;
	ret = vmm_uffd__register_wp(dd->uffd, addr, n * PROTO_PAGE_SIZE);
	return ret ? ret : vmm_uffd__wp(dd->uffd, addr, n * PROTO_PAGE_SIZE, true, false);
}

/* Write faults only: wake writers that faulted on [first, first+n) during a remap. */
void vmm_track_wake(struct vmm_dedup *dd, uint64_t first, uint64_t n)
{
	if (!dd->kvm_dirty)
		vmm_uffd__wake(dd->uffd, dd->m->ram + first * PROTO_PAGE_SIZE, n * PROTO_PAGE_SIZE);
}

static bool vmm_track_tracked(const struct vmm_dedup *dd, uint64_t page)
{
	enum vmm_pg s = vmm_dedup_state(dd, page);

	return s == VMM_PG_HASHED || s == VMM_PG_SHARED || s == VMM_PG_ORPHAN || s == VMM_PG_ZERO;
}

/* Device writes finished since the last call (dma_lock held). */
static void vmm_track_dma_drain(struct vmm_dedup *dd)
{
	for (uint32_t i = 0; i < dd->ndone; i++)
		for (uint64_t p = dd->dma_done[i][0]; p < dd->dma_done[i][0] + dd->dma_done[i][1]; p++)
			if (vmm_track_tracked(dd, p))
				vmm_dedup_written(dd, p, true);
	dd->ndone = 0;
}

/*
 * KVM dirty log: read it and undo the sharing of every tracked page written
 * since. @force: now, not only once VMM_HARVEST_NS has passed (before a batch).
 */
void vmm_track_harvest(struct vmm_dedup *dd, bool force)
{
	uint64_t now, words = (dd->m->pages + 63) / 64;
	int ret;

	if (!dd->kvm_dirty)
		return;
	now = util_now_ns();
	if (!force && now < dd->harvest_at_ns)
		return;
	dd->harvest_at_ns = now + VMM_HARVEST_NS;
	ret = dd->m->vcpus.dirty_get(dd->m->vcpus.opaque, dd->dirty_bm);
	if (ret) {
		log_warn("dedup: KVM_GET_DIRTY_LOG: %s", strerror(-ret));
		return;
	}
	for (uint64_t w = 0; w < words; w++) {
		uint64_t bits = dd->dirty_bm[w];

		while (bits) {
			uint64_t page = w * 64 + (uint64_t)__builtin_ctzll(bits);

			bits &= bits - 1;
			if (page < dd->m->pages && vmm_track_tracked(dd, page))
				vmm_dedup_written(dd, page, true);
		}
	}
	if (!dd->dma_held)
		pthread_mutex_lock(&dd->dma_lock);
	vmm_track_dma_drain(dd);
	if (!dd->dma_held)
		pthread_mutex_unlock(&dd->dma_lock);
}

/* Around a batch, vCPUs stopped: no device write starts or ends until release. */
void vmm_track_hold(struct vmm_dedup *dd)
{
	if (!dd->kvm_dirty)
		return;
	pthread_mutex_lock(&dd->dev_lock);
	pthread_mutex_lock(&dd->dma_lock);
	dd->dma_held = true;
}

void vmm_track_release(struct vmm_dedup *dd)
{
	if (!dd->dma_held)
		return;
	dd->dma_held = false;
	pthread_mutex_unlock(&dd->dma_lock);
	pthread_mutex_unlock(&dd->dev_lock);
}

/* Is a device write into @page under way? (dma_lock held; always false without a dirty log) */
bool vmm_track_dma_busy(const struct vmm_dedup *dd, uint64_t page)
{
	for (uint32_t i = 0; i < dd->ndma; i++)
		if (page >= dd->dma[i][0] && page < dd->dma[i][0] + dd->dma[i][1])
			return true;
	return false;
}

static int vmm_track_push(uint64_t (**arr)[2], uint32_t *len, uint32_t *cap, uint64_t first,
			  uint64_t n)
{
	if (*len == *cap) {
		uint32_t c = *cap ? *cap * 2 : 64;
		void *p = realloc(*arr, (size_t)c * sizeof(**arr));

		if (!p)
			return -ENOMEM;
		*arr = p;
		*cap = c;
	}
	(*arr)[*len][0] = first;
	(*arr)[(*len)++][1] = n;
	return 0;
}

void vmm_track__dma_begin(struct vmm_dedup *dd, uint64_t first, uint64_t n)
{
	if (!__atomic_load_n(&dd->kvm_dirty, __ATOMIC_ACQUIRE))
		return; /* write protection catches device writes too */
	pthread_mutex_lock(&dd->dma_lock);
	if (vmm_track_push(&dd->dma, &dd->ndma, &dd->dma_cap, first, n))
		log_err("dedup: out of memory recording a device write; sharing may lose it");
	pthread_mutex_unlock(&dd->dma_lock);
}

void vmm_track__dma_end(struct vmm_dedup *dd, uint64_t first, uint64_t n)
{
	if (!__atomic_load_n(&dd->kvm_dirty, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&dd->dma_lock);
	for (uint32_t i = 0; i < dd->ndma; i++) {
		if (dd->dma[i][0] == first && dd->dma[i][1] == n) {
			dd->dma[i][0] = dd->dma[dd->ndma - 1][0];
			dd->dma[i][1] = dd->dma[--dd->ndma][1];
			break;
		}
	}
	if (vmm_track_push(&dd->dma_done, &dd->ndone, &dd->done_cap, first, n))
		log_err("dedup: out of memory recording a device write; sharing may lose it");
	pthread_mutex_unlock(&dd->dma_lock);
}
