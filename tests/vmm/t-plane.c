/* t-plane.c: copy-on-write, zero pages, pool loss, the VMA budget and pinned pages, one mode per run. */
#include <fcntl.h>
#include <liburing.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"
#include "proto.h"
#include "tvmm.h"
#include "util.h"

/* Usage: t-vmm-plane cow|zero|zero-after-merge|poolkill|vma|pinned */

#define T_MIB   8
#define T_PAGES (T_MIB * 256)

#define T_CHECK(cond, ...) do { if (!(cond)) { printf("FAIL: " __VA_ARGS__); printf("\n"); \
	return T_FAIL; } } while (0)

static struct vmm_mem_stats t_st(struct vmm_mem *m)
{
	struct vmm_mem_stats st;

	vmm_mem__stats(m, &st);
	return st;
}

static void t_write_pages(struct vmm_mem *m, uint64_t from, uint64_t n, uint64_t v)
{
	for (uint64_t p = from; p < from + n; p++)
		memset(vmm_mem__hva(m, GPA(p * PROTO_PAGE_SIZE), PROTO_PAGE_SIZE), (int)v, 64);
}

static uint64_t t_check_written(struct vmm_mem *m, uint64_t n, uint64_t v)
{
	uint8_t want[PROTO_PAGE_SIZE];
	uint64_t bad = 0;

	for (uint64_t p = 0; p < n; p++) {
		wl_page(WL_SHARED_RANDOM, 1, 0, p, want);
		memset(want, (int)v, 64);
		bad += !!memcmp(want, vmm_mem__hva(m, GPA(p * PROTO_PAGE_SIZE), PROTO_PAGE_SIZE),
				PROTO_PAGE_SIZE);
	}
	return bad;
}

/*
 * A merged page the guest then fills with zeros: its range is a private file
 * mapping now, where MADV_DONTNEED would bring the slot's bytes back instead
 * of zeros. The zeros must read back once the plane has hashed them again.
 */
static int t_zero_after_merge(struct t_pool *pool, struct vmm_mem **m)
{
	struct vmm_mem_stats st;
	uint64_t hashed, bad = 0;
	double end;

	for (int i = 0; i < 2; i++)
		t_fill(m[i], WL_SHARED_RANDOM, (uint64_t)i, T_PAGES);
	for (int i = 0; i < 2; i++)
		T_CHECK(t_wait_shared(m[i], T_PAGES, 30) == T_PAGES, "guest %d did not merge", i);
	hashed = t_st(m[0]).pages_hashed;
	for (uint64_t p = 0; p < T_PAGES; p++)
		memset(vmm_mem__hva(m[0], GPA(p * PROTO_PAGE_SIZE), PROTO_PAGE_SIZE), 0, PROTO_PAGE_SIZE);
	/* the writes broke copy-on-write; wait until every page was hashed again */
	end = t_now() + 20;
	do {
		usleep(20000);
		st = t_st(m[0]);
	} while (st.pages_hashed < hashed + T_PAGES && t_now() < end);
	usleep(200000);
	for (uint64_t p = 0; p < T_PAGES; p++)
		bad += !util_page_is_zero(vmm_mem__hva(m[0], GPA(p * PROTO_PAGE_SIZE), PROTO_PAGE_SIZE));
	printf("zero-after-merge: hashed %llu more, %llu pages not zero, zero %llu, shared %llu\n",
	       (unsigned long long)(st.pages_hashed - hashed), (unsigned long long)bad,
	       (unsigned long long)st.pages_zero, (unsigned long long)st.pages_shared);
	T_CHECK(st.pages_hashed >= hashed + T_PAGES, "the written pages were not hashed again");
	T_CHECK(bad == 0, "%llu zeroed pages read back other bytes: a lost write",
		(unsigned long long)bad);
	T_CHECK(!t_verify(m[1], WL_SHARED_RANDOM, 1, T_PAGES), "guest 1 changed");
	return T_PASS;
}

static int t_cow(struct t_pool *pool, struct vmm_mem **m)
{
	struct vmm_mem_stats st;
	double end;

	for (int i = 0; i < 3; i++)
		t_fill(m[i], WL_SHARED_RANDOM, (uint64_t)i, T_PAGES);
	for (int i = 0; i < 3; i++)
		T_CHECK(t_wait_shared(m[i], T_PAGES, 30) == T_PAGES, "guest %d did not merge", i);
	t_write_pages(m[0], 0, T_PAGES, 0xab);
	T_CHECK(!t_check_written(m[0], T_PAGES, 0xab), "the writer's bytes did not read back");
	for (int i = 1; i < 3; i++)
		T_CHECK(!t_verify(m[i], WL_SHARED_RANDOM, (uint64_t)i, T_PAGES),
			"guest %d changed when guest 0 wrote", i);
	end = t_now() + 10;
	do {
		usleep(20000);
		st = t_st(m[0]);
	} while (st.pages_shared && t_now() < end);
	printf("writer: shared %llu cow_breaks %llu faults %llu\n",
	       (unsigned long long)st.pages_shared, (unsigned long long)st.cow_breaks,
	       (unsigned long long)st.wp_faults);
	T_CHECK(st.cow_breaks >= T_PAGES && st.pages_shared == 0, "references not dropped");
	char *stat = t_pool_stat(pool);
	if (stat) {
		printf("pool stat after the writes: %.600s\n", stat);
		free(stat);
	}
	return T_PASS;
}

static int t_zero(struct t_pool *pool, struct vmm_mem **m)
{
	uint64_t rss0, rss1;
	struct vmm_mem_stats st;
	double end = t_now() + 20;

	/* a fresh guest, filled before its plane starts, so RSS shows the whole fill */
	vmm_mem__destroy(m[0]);
	m[0] = t_mem_cfg(pool, "zero", T_MIB, false);
	T_CHECK(m[0], "cannot create the guest");
	/* a non-zero byte then zero again: the page is populated with zeros */
	for (uint64_t p = 0; p < T_PAGES; p++)
		*(volatile uint8_t *)vmm_mem__hva(m[0], GPA(p * PROTO_PAGE_SIZE), 1) = 1;
	t_fill(m[0], WL_ZEROS, 0, T_PAGES);
	rss0 = t_rss_kib();
	T_CHECK(!vmm_mem__start(m[0]), "cannot start the plane");
	do {
		usleep(20000);
		st = t_st(m[0]);
	} while (st.pages_zero < T_PAGES && t_now() < end);
	rss1 = t_rss_kib();
	printf("zero: %llu pages discarded, RSS %llu -> %llu KiB\n",
	       (unsigned long long)st.pages_zero, (unsigned long long)rss0,
	       (unsigned long long)rss1);
	T_CHECK(st.pages_zero == T_PAGES, "zero pages not discarded");
	T_CHECK(rss1 + T_MIB * 1024 / 2 < rss0, "RSS did not drop");
	T_CHECK(!t_verify(m[0], WL_ZEROS, 0, T_PAGES), "discarded pages do not read zero");
	t_write_pages(m[0], 5, 1, 0x5a);
	T_CHECK(*(uint8_t *)vmm_mem__hva(m[0], GPA(5 * PROTO_PAGE_SIZE + 63), 1) == 0x5a,
		"write to a discarded page did not read back");
	usleep(300000);
	st = t_st(m[0]);
	T_CHECK(st.pages_zero == T_PAGES - 1, "written zero page still counted as zero (%llu)",
		(unsigned long long)st.pages_zero);
	T_CHECK(*(uint8_t *)vmm_mem__hva(m[0], GPA(5 * PROTO_PAGE_SIZE + 63), 1) == 0x5a,
		"written page lost its byte after rehash");
	return T_PASS;
}

static int t_poolkill(struct t_pool *pool, struct vmm_mem **m)
{
	double end;

	t_fill(m[0], WL_SHARED_RANDOM, 0, T_PAGES);
	t_fill(m[1], WL_SHARED_RANDOM, 1, T_PAGES);
	/* kill it while the merge is in flight */
	usleep(30000);
	t_pool_kill(pool, SIGKILL);
	printf("killed the pool with %llu + %llu pages shared\n",
	       (unsigned long long)t_st(m[0]).pages_shared,
	       (unsigned long long)t_st(m[1]).pages_shared);
	usleep(300000);
	for (int i = 0; i < 2; i++)
		T_CHECK(!t_verify(m[i], WL_SHARED_RANDOM, (uint64_t)i, T_PAGES),
			"guest %d lost bytes when the pool died", i);
	t_write_pages(m[0], 0, 16, 0x11);
	T_CHECK(!t_pool_restart(pool), "cannot restart the pool");
	/* new content after the restart must merge through the new pool */
	t_fill(m[2], WL_SHARED_RANDOM, 2, T_PAGES);
	end = t_now() + 20;
	while (t_now() < end && (t_st(m[2]).pages_shared <= T_PAGES / 2 ||
				 !t_st(m[0]).pool_connected))
		usleep(20000);
	printf("after restart: merges %llu/%llu/%llu, reconnects %u, shared %llu\n",
	       (unsigned long long)t_st(m[0]).merges, (unsigned long long)t_st(m[1]).merges,
	       (unsigned long long)t_st(m[2]).merges, t_st(m[0]).pool_reconnects,
	       (unsigned long long)t_st(m[2]).pages_shared);
	T_CHECK(t_st(m[0]).pool_connected && t_st(m[0]).pool_reconnects >= 1, "no reconnect");
	T_CHECK(t_st(m[2]).pages_shared > T_PAGES / 2, "no merges through the restarted pool");
	T_CHECK(t_check_written(m[0], 16, 0x11) == 0, "guest 0 lost its writes");
	T_CHECK(!t_verify(m[1], WL_SHARED_RANDOM, 1, T_PAGES), "guest 1 lost bytes");
	T_CHECK(!t_verify(m[2], WL_SHARED_RANDOM, 2, T_PAGES), "guest 2 lost bytes");
	return T_PASS;
}

/*
 * A page the hypervisor writes behind the plane's back, the way KVM writes
 * kvm-clock: here io_uring writes into a registered (pinned) buffer, which
 * write protection does not see either. The test's fake vCPUs name the page
 * through hv_pages; the plane must neither discard it as zero nor merge it,
 * or the write lands in a page the guest no longer maps.
 */
#define T_PIN_PAGE 3

static void t_nop(void *opaque) { (void)opaque; }
static bool t_true(void *opaque) { (void)opaque; return true; }

static unsigned t_hv_pages(void *opaque, uint64_t *gpa, unsigned max)
{
	(void)opaque;
	if (!max)
		return 0;
	gpa[0] = T_PIN_PAGE * PROTO_PAGE_SIZE + 100; /* any address inside the page */
	return 1;
}

static int t_hv_write(struct io_uring *ring, uint8_t *page, int fd)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	struct io_uring_cqe *cqe;
	int ret;

	io_uring_prep_read_fixed(sqe, fd, page, PROTO_PAGE_SIZE, 0, 0);
	io_uring_submit(ring);
	if (io_uring_wait_cqe(ring, &cqe))
		return -1;
	ret = cqe->res;
	io_uring_cqe_seen(ring, cqe);
	return ret;
}

static int t_pinned(struct t_pool *pool, struct vmm_mem **m)
{
	struct vmm_mem_vcpus fake = { .pause = t_nop, .paused = t_true, .resume = t_nop,
				      .hv_pages = t_hv_pages };
	uint8_t want[PROTO_PAGE_SIZE], *pin;
	char path[] = "/tmp/t-pinned-XXXXXX";
	struct io_uring ring;
	struct iovec iov;
	struct vmm_mem_stats st;
	int fd, ret = T_FAIL;

	(void)pool;
	vmm_mem__destroy(m[0]);
	m[0] = t_mem_cfg(pool, "pinned", T_MIB, false);
	T_CHECK(m[0], "cannot create the guest");
	vmm_mem__set_vcpus(m[0], &fake);
	t_fill(m[0], WL_SHARED_RANDOM, 0, T_PAGES);
	t_fill(m[1], WL_SHARED_RANDOM, 1, T_PAGES);
	pin = vmm_mem__hva(m[0], GPA(T_PIN_PAGE * PROTO_PAGE_SIZE), PROTO_PAGE_SIZE);
	memset(pin, 0, PROTO_PAGE_SIZE); /* populated and zero: the first thing the plane drops */
	for (size_t i = 0; i < sizeof(want); i++)
		want[i] = (uint8_t)(i * 7 + 1);
	fd = mkstemp(path);
	T_CHECK(fd >= 0 && write(fd, want, sizeof(want)) == sizeof(want), "temporary file");
	unlink(path);
	iov = (struct iovec){ .iov_base = pin, .iov_len = PROTO_PAGE_SIZE };
	if (io_uring_queue_init(4, &ring, 0) || io_uring_register_buffers(&ring, &iov, 1)) {
		printf("FAIL: io_uring with a registered buffer\n");
		goto out_fd;
	}
	if (vmm_mem__start(m[0])) {
		printf("FAIL: cannot start the plane\n");
		goto out_ring;
	}
	t_wait_shared(m[0], T_PAGES - 1, 30);
	if (t_hv_write(&ring, pin, fd) != PROTO_PAGE_SIZE) {
		printf("FAIL: io_uring read into the registered buffer\n");
		goto out_ring;
	}
	usleep(300000); /* time for the plane to act on the page if it were going to */
	if (memcmp(pin, want, sizeof(want))) {
		printf("FAIL: the hypervisor's write to page %d was lost\n", T_PIN_PAGE);
		goto out_ring;
	}
	st = t_st(m[0]);
	printf("pinned: shared %llu zero %llu pinned %llu\n", (unsigned long long)st.pages_shared,
	       (unsigned long long)st.pages_zero, (unsigned long long)st.pages_pinned);
	if (st.pages_shared < T_PAGES - 1 || st.pages_pinned != 1 || st.pages_zero) {
		printf("FAIL: want %d pages merged, the hypervisor's page pinned, none discarded\n",
		       T_PAGES - 1);
		goto out_ring;
	}
	if (t_verify(m[0], WL_SHARED_RANDOM, 0, T_PIN_PAGE) ||
	    t_verify(m[1], WL_SHARED_RANDOM, 1, T_PAGES)) {
		printf("FAIL: other pages changed\n");
		goto out_ring;
	}
	ret = T_PASS;
out_ring:
	io_uring_queue_exit(&ring);
out_fd:
	close(fd);
	return ret;
}

static char t_old_max[32];

static void t_restore_max(void)
{
	int fd;

	if (!t_old_max[0])
		return;
	fd = open("/proc/sys/vm/max_map_count", O_WRONLY);
	if (fd >= 0) {
		if (write(fd, t_old_max, strlen(t_old_max)) < 0)
			perror("restore vm.max_map_count");
		close(fd);
	}
	t_old_max[0] = '\0';
}

static void t_restore_sig(int sig)
{
	t_restore_max();
	signal(sig, SIG_DFL);
	raise(sig);
}

/* Interleave the pages so that every merged page is its own run (its own VMA). */
static int t_vma(struct t_pool *pool, struct vmm_mem **m)
{
	struct vmm_mem_stats st;
	double end = t_now() + 20;

	for (uint64_t p = 0; p < T_PAGES; p += 2) {
		wl_page(WL_SHARED_RANDOM, 1, 0, p, vmm_mem__hva(m[0], GPA(p * 4096), 4096));
		wl_page(WL_SHARED_RANDOM, 1, 0, p, vmm_mem__hva(m[1], GPA(p * 4096), 4096));
		wl_page(WL_UNIQUE_RANDOM, 1, 0, p + 1, vmm_mem__hva(m[0], GPA((p + 1) * 4096), 4096));
		wl_page(WL_UNIQUE_RANDOM, 1, 1, p + 1, vmm_mem__hva(m[1], GPA((p + 1) * 4096), 4096));
	}
	do {
		usleep(50000);
		st = t_st(m[1]);
	} while (t_now() < end && st.pages_shared + st.vma_skipped < T_PAGES / 2);
	printf("vma: shared %llu skipped %llu of %d candidates\n",
	       (unsigned long long)st.pages_shared, (unsigned long long)st.vma_skipped,
	       T_PAGES / 2);
	T_CHECK(st.vma_skipped > 0, "the budget never stopped a merge");
	T_CHECK(st.pages_shared > 0, "nothing merged at all");
	for (uint64_t p = 0; p < T_PAGES; p++) {
		uint8_t want[4096];

		wl_page(p % 2 ? WL_UNIQUE_RANDOM : WL_SHARED_RANDOM, 1, 1, p, want);
		T_CHECK(!memcmp(want, vmm_mem__hva(m[1], GPA(p * 4096), 4096), 4096),
			"page %llu corrupted", (unsigned long long)p);
	}
	/* the process must still be able to create mappings */
	void *x = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	T_CHECK(x != MAP_FAILED, "mmap fails: the plane ate the VMA limit");
	munmap(x, 4096);
	return T_PASS;
}

static int t_vma_setup(void)
{
	char buf[64];
	FILE *f = fopen("/proc/self/maps", "r");
	int lines = 0, fd;
	ssize_t n;

	while (f && fgets(buf, sizeof(buf), f))
		lines += !!strchr(buf, '\n');
	if (f)
		fclose(f);
	fd = open("/proc/sys/vm/max_map_count", O_RDWR);
	if (fd < 0) {
		printf("SKIP: cannot open vm.max_map_count for writing\n");
		return T_SKIP;
	}
	n = read(fd, t_old_max, sizeof(t_old_max) - 1);
	t_old_max[n > 0 ? n : 0] = '\0';
	t_old_max[strcspn(t_old_max, "\n")] = '\0';
	atexit(t_restore_max);
	signal(SIGINT, t_restore_sig);
	signal(SIGTERM, t_restore_sig);
	signal(SIGSEGV, t_restore_sig);
	signal(SIGABRT, t_restore_sig);
	/* room for what the process has, the segments, ~400 runs and the 10% + 1000 headroom */
	n = snprintf(buf, sizeof(buf), "%d", (lines + 1200) * 10 / 9 + 1000);
	if (pwrite(fd, buf, (size_t)n, 0) != n) {
		close(fd);
		printf("SKIP: cannot write vm.max_map_count\n");
		return T_SKIP;
	}
	close(fd);
	printf("vm.max_map_count %s -> %s (process has %d VMAs)\n", t_old_max, buf, lines);
	return T_PASS;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "cow";
	struct vmm_mem *m[3] = { 0 };
	struct t_pool pool;
	int ret;

	log_init("t-plane", getenv("PVISOR_DEBUG") ? LOG_DEBUG : LOG_WARN);
	if (!strcmp(mode, "vma") && (ret = t_vma_setup()))
		return ret;
	ret = t_pool_start(&pool);
	if (ret)
		return ret;
	ret = T_FAIL;
	for (int i = 0; i < 3; i++) {
		char name[16];

		snprintf(name, sizeof(name), "p%d", i);
		m[i] = t_mem(&pool, name, T_MIB);
		if (!m[i])
			goto out;
	}
	if (!strcmp(mode, "cow"))
		ret = t_cow(&pool, m);
	else if (!strcmp(mode, "zero"))
		ret = t_zero(&pool, m);
	else if (!strcmp(mode, "zero-after-merge"))
		ret = t_zero_after_merge(&pool, m);
	else if (!strcmp(mode, "poolkill"))
		ret = t_poolkill(&pool, m);
	else if (!strcmp(mode, "vma"))
		ret = t_vma(&pool, m);
	else if (!strcmp(mode, "pinned"))
		ret = t_pinned(&pool, m);
	if (!ret)
		printf("PASS\n");
out:
	for (int i = 0; i < 3; i++)
		vmm_mem__destroy(m[i]);
	t_pool_stop(&pool);
	t_restore_max();
	return ret;
}
