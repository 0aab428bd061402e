/* t-dirtylog.c: the plane tracking a KVM-like guest through a dirty log, with a fake vCPU and device. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "proto.h"
#include "tvmm.h"

/*
 * The plane under test gets what vmm/kvm.c would give it (struct
 * vmm_mem_vcpus): pause/paused/resume over one "vCPU" thread, and a dirty
 * log with KVM's manual-protect semantics (every bit set at first; clear
 * takes bits out; the vCPU sets a page's bit before its write lands, as KVM
 * does when it makes the page writable). The vCPU honours pauses between
 * pages, as a real one leaves KVM_RUN. A second guest on the ordinary write
 * protection shares the same data.
 *
 * Checked: the pages merge; the vCPU's writes to merged pages read back and
 * the other guest's bytes do not change; every shared page written is given
 * back (DROP) because the log said so; a device write bracketed with
 * dma_begin/_end counts as a write too. Usage: t-vmm-dirtylog [nolog]
 * (nolog: the vCPU writes without setting bits; passes only if that is caught).
 */

#define T_MIB   8
#define T_PAGES (T_MIB * 256)

struct t_vcpu {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool pause_req, parked, stop;
	uint64_t todo;            /* pages still to write in this pass */
	uint8_t value;            /* byte the pass writes at the start of each page */
	bool log;                 /* set the dirty bit before each write */
	uint64_t bits[(T_PAGES + 63) / 64];
	struct vmm_mem *m;
	pthread_t th;
};

static struct t_vcpu t_cpu = { .lock = PTHREAD_MUTEX_INITIALIZER,
			       .cond = PTHREAD_COND_INITIALIZER, .log = true };

static void t_set_pause(struct t_vcpu *c, bool on)
{
	pthread_mutex_lock(&c->lock);
	c->pause_req = on;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

static void t_pause(void *o) { t_set_pause(o, true); }
static void t_resume(void *o) { t_set_pause(o, false); }

static bool t_paused(void *o)
{
	struct t_vcpu *c = o;
	bool p;

	pthread_mutex_lock(&c->lock);
	p = c->parked;
	pthread_mutex_unlock(&c->lock);
	return p;
}

static int t_dirty_get(void *o, uint64_t *bitmap)
{
	struct t_vcpu *c = o;

	pthread_mutex_lock(&c->lock);
	memcpy(bitmap, c->bits, sizeof(c->bits));
	pthread_mutex_unlock(&c->lock);
	return 0;
}

static int t_dirty_clear(void *o, uint64_t first, uint64_t n, uint64_t *bits)
{
	struct t_vcpu *c = o;

	if (first % 64 || (n % 64 && first + n != T_PAGES) || first + n > T_PAGES)
		return -22; /* what KVM refuses with EINVAL */
	pthread_mutex_lock(&c->lock);
	for (uint64_t w = 0; w < (n + 63) / 64; w++)
		c->bits[first / 64 + w] &= ~bits[w];
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* The vCPU: parked whenever a pause is asked for, else writes its pass. */
static void *t_vcpu_main(void *arg)
{
	struct t_vcpu *c = arg;

	pthread_mutex_lock(&c->lock);
	while (!c->stop) {
		if (c->pause_req || !c->todo) {
			c->parked = true;
			pthread_cond_broadcast(&c->cond);
			pthread_cond_wait(&c->cond, &c->lock);
			c->parked = false;
			continue;
		}
		uint64_t p = T_PAGES - c->todo--;

		if (c->log)
			c->bits[p / 64] |= 1ull << (p % 64);
		/* the write itself: a page of the pool copies on write in the kernel */
		memset(vmm_mem__hva(c->m, GPA(p * PROTO_PAGE_SIZE), 64), c->value, 64);
		if (!c->todo)
			pthread_cond_broadcast(&c->cond);
	}
	c->parked = true;
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

static void t_vcpu_write_all(struct t_vcpu *c, uint8_t value)
{
	pthread_mutex_lock(&c->lock);
	c->value = value;
	c->todo = T_PAGES;
	pthread_cond_broadcast(&c->cond);
	while (c->todo)
		pthread_cond_wait(&c->cond, &c->lock);
	pthread_mutex_unlock(&c->lock);
}

static uint64_t t_bad_pages(struct vmm_mem *m, uint8_t value)
{
	uint8_t want[PROTO_PAGE_SIZE];
	uint64_t bad = 0;

	for (uint64_t p = 0; p < T_PAGES; p++) {
		wl_page(WL_SHARED_RANDOM, 1, 0, p, want);
		memset(want, value, 64);
		bad += !!memcmp(want, vmm_mem__hva(m, GPA(p * PROTO_PAGE_SIZE), PROTO_PAGE_SIZE),
				PROTO_PAGE_SIZE);
	}
	return bad;
}

static struct vmm_mem_stats t_wait(struct vmm_mem *m, bool (*done)(const struct vmm_mem_stats *),
				   double secs)
{
	struct vmm_mem_stats st;
	double end = t_now() + secs;

	do {
		usleep(20000);
		vmm_mem__stats(m, &st);
	} while (!done(&st) && t_now() < end);
	return st;
}

static bool t_all_shared(const struct vmm_mem_stats *st) { return st->pages_shared == T_PAGES; }
static bool t_none_shared(const struct vmm_mem_stats *st) { return st->pages_shared == 0; }
static bool t_reshared(const struct vmm_mem_stats *st) { return st->pages_shared >= 1; }

static int t_run(struct t_pool *pool, struct vmm_mem **m)
{
	struct vmm_mem_vcpus v = { .pause = t_pause, .paused = t_paused, .resume = t_resume,
				   .dirty_get = t_dirty_get, .dirty_clear = t_dirty_clear,
				   .opaque = &t_cpu };
	struct vmm_mem_stats st;
	uint64_t bad, cow0;

	vmm_mem__set_vcpus(m[0], &v);
	memset(t_cpu.bits, 0xff, sizeof(t_cpu.bits)); /* KVM_DIRTY_LOG_INITIALLY_SET */
	t_fill(m[0], WL_SHARED_RANDOM, 0, T_PAGES);
	t_fill(m[1], WL_SHARED_RANDOM, 1, T_PAGES);
	if (vmm_mem__start(m[0])) {
		printf("FAIL: cannot start the plane\n");
		return T_FAIL;
	}
	st = t_wait(m[0], t_all_shared, 30);
	printf("merged: shared %llu, wp_faults %llu (want 0: no write protection)\n",
	       (unsigned long long)st.pages_shared, (unsigned long long)st.wp_faults);
	if (st.pages_shared != T_PAGES || st.wp_faults) {
		printf("FAIL: want every page merged through the dirty log\n");
		return T_FAIL;
	}
	/* the vCPU writes every shared page while the plane keeps working */
	t_vcpu_write_all(&t_cpu, 0xc3);
	st = t_wait(m[0], t_none_shared, 10);
	bad = t_bad_pages(m[0], 0xc3);
	printf("vCPU wrote %d pages: %llu read back wrong, shared %llu, cow_breaks %llu\n", T_PAGES,
	       (unsigned long long)bad, (unsigned long long)st.pages_shared,
	       (unsigned long long)st.cow_breaks);
	if (bad) {
		printf("FAIL: %llu of the vCPU's writes were lost\n", (unsigned long long)bad);
		return T_FAIL;
	}
	if (t_verify(m[1], WL_SHARED_RANDOM, 1, T_PAGES)) {
		printf("FAIL: the other guest's bytes changed\n");
		return T_FAIL;
	}
	if (st.pages_shared || st.cow_breaks < T_PAGES) {
		printf("FAIL: written shared pages were not given back (the log was not read)\n");
		return T_FAIL;
	}
	/* a device write into page 7, bracketed; the page is private now, so share it again first */
	wl_page(WL_SHARED_RANDOM, 1, 0, 7, vmm_mem__hva(m[0], GPA(7 * PROTO_PAGE_SIZE), PROTO_PAGE_SIZE));
	t_cpu.bits[0] |= 1ull << 7; /* as KVM would for the vCPU write above */
	st = t_wait(m[0], t_reshared, 10);
	cow0 = st.cow_breaks;
	vmm_mem__dma_begin(m[0], GPA(7 * PROTO_PAGE_SIZE), PROTO_PAGE_SIZE);
	memset(vmm_mem__hva(m[0], GPA(7 * PROTO_PAGE_SIZE), 64), 0x5a, 64);
	vmm_mem__dma_end(m[0], GPA(7 * PROTO_PAGE_SIZE), PROTO_PAGE_SIZE);
	st = t_wait(m[0], t_none_shared, 10);
	printf("device write: shared %llu, cow_breaks %llu -> %llu, byte %#x\n",
	       (unsigned long long)st.pages_shared, (unsigned long long)cow0,
	       (unsigned long long)st.cow_breaks,
	       *(uint8_t *)vmm_mem__hva(m[0], GPA(7 * PROTO_PAGE_SIZE + 63), 1));
	if (*(uint8_t *)vmm_mem__hva(m[0], GPA(7 * PROTO_PAGE_SIZE + 63), 1) != 0x5a ||
	    st.pages_shared || st.cow_breaks != cow0 + 1) {
		printf("FAIL: the device's write was not counted as a write\n");
		return T_FAIL;
	}
	return T_PASS;
}

int main(int argc, char **argv)
{
	struct vmm_mem *m[2] = { 0 };
	struct t_pool pool;
	int ret;

	log_init("t-dirtylog", getenv("PVISOR_DEBUG") ? LOG_DEBUG : LOG_WARN);
	t_cpu.log = !(argc > 1 && !strcmp(argv[1], "nolog"));
	ret = t_pool_start(&pool);
	if (ret)
		return ret;
	ret = T_FAIL;
	m[0] = t_mem_cfg(&pool, "kvmlike", T_MIB, false);
	m[1] = t_mem(&pool, "other", T_MIB);
	if (!m[0] || !m[1])
		goto out;
	t_cpu.m = m[0];
	if (pthread_create(&t_cpu.th, NULL, t_vcpu_main, &t_cpu))
		goto out;
	ret = t_run(&pool, m);
	if (!t_cpu.log) {
		/* the control: without the log the test must have failed */
		ret = ret == T_FAIL ? T_PASS : T_FAIL;
		printf("%s: the test %s the vCPU's unlogged writes\n", ret ? "FAIL" : "PASS",
		       ret ? "did not notice" : "noticed");
	}
	vmm_mem__stop(m[0]);
	pthread_mutex_lock(&t_cpu.lock);
	t_cpu.stop = true;
	pthread_cond_broadcast(&t_cpu.cond);
	pthread_mutex_unlock(&t_cpu.lock);
	pthread_join(t_cpu.th, NULL);
	if (!ret && t_cpu.log)
		printf("PASS\n");
out:
	for (int i = 0; i < 2; i++)
		vmm_mem__destroy(m[i]);
	t_pool_stop(&pool);
	return ret;
}
