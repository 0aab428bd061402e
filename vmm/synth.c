/* synth.c: the synthetic guest: VMM threads that write and check guest RAM like vCPUs. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "mem.h"
#include "proto.h"
#include "synth.h"
#include "util.h"

/*
 * DOC: the synthetic guest
 *
 * `--guest synthetic` replaces the vCPUs of a KVM guest with plain threads of
 * the VMM. They reach guest RAM only through vmm_mem__hva(), which is the very
 * mapping a KVM guest would see, so their writes race with the memory plane's
 * write protection and remaps exactly as a vCPU's stores would: a write to a
 * page being merged blocks on the userfaultfd and retries on the new mapping.
 * It exists for benchmarks and tests of the memory plane, not to run software.
 *
 * At start every thread writes its slice of the workload region, reads it back
 * and compares every byte with a fresh copy of the workload; the guest is
 * "ready" when all slices passed. From then on the first thread runs the API
 * commands (fill, verify, digest, poke) one at a time; the others have ended.
 * Commands never run on the dedup thread, so the plane sees them as guest
 * writes like any other.
 */

/* How many pages a thread handles between two looks at the stop flag. */
#define SYNTH_STOP_CHECK 256

/* struct vmm_synth - the guest's threads and the one-slot command mailbox */
struct vmm_synth {
	struct vmm_mem *mem;
	struct vmm_synth_cfg cfg;
	const char *wl_name;        /* the start-up workload's name, for logs */
	pthread_t *threads;         /* cfg.vcpus threads, [0] serves commands */
	unsigned started;           /* threads created, joined at stop */
	atomic_bool stop;           /* set once by vmm_synth__stop() */
	atomic_bool ready;          /* start-up region written and verified */
	atomic_bool failed;         /* start-up verification found a difference */
	uint64_t t_start;           /* util_now_ns() when the threads were started */
	pthread_mutex_t lock;       /* protects everything below */
	pthread_cond_t cond;        /* any change of the fields below */
	unsigned slices_done;       /* threads that finished their start-up slice */
	uint64_t bad_pages;         /* start-up pages that differed, over all slices */
	uint64_t first_bad;         /* lowest start-up page that differed */
	struct vmm_synth_cmd *cmd;  /* pending command, NULL if none */
	bool cmd_done;              /* thread 0 finished @cmd */
	bool serving_ended;         /* thread 0 left its command loop */
};

struct vmm_synth_slice {
	struct vmm_synth *s;
	unsigned idx;
};

static void *synth_hva(struct vmm_synth *s, uint64_t first, uint64_t count)
{
	return vmm_mem__hva(s->mem, GPA(first << PROTO_PAGE_SHIFT), count << PROTO_PAGE_SHIFT);
}

/* Write pages [first, first+count) of a workload straight into guest RAM. */
static int synth_fill(struct vmm_synth *s, uint64_t first, uint64_t count, int kind,
		      uint64_t seed, uint64_t instance)
{
	uint8_t *base = synth_hva(s, first, count);

	if (!base)
		return -ERANGE;
	for (uint64_t i = 0; i < count; i++) {
		if (i % SYNTH_STOP_CHECK == 0 && atomic_load(&s->stop))
			return -ESHUTDOWN;
		wl_page(kind, seed, instance, first + i, base + (i << PROTO_PAGE_SHIFT));
	}
	return 0;
}

/* Compare pages with a regenerated workload; counts differing pages. */
static int synth_verify(struct vmm_synth *s, uint64_t first, uint64_t count, int kind,
			uint64_t seed, uint64_t instance, uint64_t *bad, uint64_t *first_bad)
{
	static _Thread_local uint8_t want[PROTO_PAGE_SIZE] __attribute__((aligned(64)));
	const uint8_t *base = synth_hva(s, first, count);

	*bad = 0;
	*first_bad = 0;
	if (!base)
		return -ERANGE;
	for (uint64_t i = 0; i < count; i++) {
		if (i % SYNTH_STOP_CHECK == 0 && atomic_load(&s->stop))
			return -ESHUTDOWN;
		wl_page(kind, seed, instance, first + i, want);
		if (!memcmp(base + (i << PROTO_PAGE_SHIFT), want, PROTO_PAGE_SIZE))
			continue;
		if (!*bad)
			*first_bad = first + i;
		(*bad)++;
	}
	return 0;
}

static int synth_digest(struct vmm_synth *s, uint64_t first, uint64_t count, uint64_t out[2])
{
	const void *base = synth_hva(s, first, count);

	if (!base)
		return -ERANGE;
	util_hash(base, count << PROTO_PAGE_SHIFT, out);
	return 0;
}

static int synth_poke(struct vmm_synth *s, uint64_t first, uint64_t count, unsigned offset,
		      uint8_t byte)
{
	volatile uint8_t *base = synth_hva(s, first, count);

	if (!base || offset >= PROTO_PAGE_SIZE)
		return -ERANGE;
	for (uint64_t i = 0; i < count; i++)
		base[(i << PROTO_PAGE_SHIFT) + offset] = byte;
	return 0;
}

static void synth_run_cmd(struct vmm_synth *s, struct vmm_synth_cmd *c)
{
	uint64_t t0 = util_now_ns();

	switch (c->op) {
	case VMM_SYNTH_FILL:
		c->ret = synth_fill(s, c->first, c->count, c->kind, c->seed, c->instance);
		break;
	case VMM_SYNTH_VERIFY:
		c->ret = synth_verify(s, c->first, c->count, c->kind, c->seed, c->instance,
				      &c->mismatched, &c->first_bad);
		break;
	case VMM_SYNTH_DIGEST:
		c->ret = synth_digest(s, c->first, c->count, c->digest);
		break;
	case VMM_SYNTH_POKE:
		c->ret = synth_poke(s, c->first, c->count, c->offset, c->byte);
		break;
	default:
		c->ret = -EINVAL;
	}
	c->ns = util_now_ns() - t0;
}

static void synth_signal_stop(struct vmm_synth *s)
{
	uint64_t one = 1;

	if (s->cfg.stop_fd >= 0 && write(s->cfg.stop_fd, &one, sizeof(one)) < 0)
		log_warn("synthetic guest: cannot signal the main thread: %s", strerror(errno));
}

/* One thread's share of the start-up region: write it all, then check it all. */
static void synth_startup_slice(struct vmm_synth *s, unsigned idx)
{
	uint64_t n = s->cfg.data_pages, v = s->cfg.vcpus;
	uint64_t first = n * idx / v, count = n * (idx + 1) / v - first;
	uint64_t bad = 0, first_bad = 0;
	int ret = 0;

	if (s->cfg.workload != VMM_WL_NONE && count) {
		ret = synth_fill(s, first, count, s->cfg.workload, s->cfg.seed, s->cfg.instance);
		if (!ret)
			ret = synth_verify(s, first, count, s->cfg.workload, s->cfg.seed,
					   s->cfg.instance, &bad, &first_bad);
		if (ret && ret != -ESHUTDOWN)
			log_err("vCPU %u: start-up fill of pages %" PRIu64 "..%" PRIu64 " failed: %s",
				idx, first, first + count - 1, strerror(-ret));
	}
	pthread_mutex_lock(&s->lock);
	if (ret && ret != -ESHUTDOWN && !bad)
		bad = count ? count : 1;
	if (bad && (!s->bad_pages || first_bad < s->first_bad))
		s->first_bad = first_bad;
	s->bad_pages += bad;
	s->slices_done++;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

/* Thread 0, after all slices: declare the guest ready or failed. */
static bool synth_startup_wait(struct vmm_synth *s)
{
	uint64_t ms;
	bool ok;

	pthread_mutex_lock(&s->lock);
	while (s->slices_done < s->cfg.vcpus && !atomic_load(&s->stop))
		pthread_cond_wait(&s->cond, &s->lock);
	ok = !s->bad_pages && s->slices_done == s->cfg.vcpus;
	pthread_mutex_unlock(&s->lock);
	if (atomic_load(&s->stop))
		return false;
	ms = (util_now_ns() - s->t_start) / 1000000;
	if (!ok) {
		log_err("start-up verification failed: %" PRIu64 " of %" PRIu64
			" pages of %s differ, first at page %" PRIu64,
			s->bad_pages, s->cfg.data_pages, s->wl_name, s->first_bad);
		atomic_store(&s->failed, true);
		synth_signal_stop(s);
		return false;
	}
	if (s->cfg.workload == VMM_WL_NONE)
		log_info("ready: no workload, guest RAM untouched");
	else
		log_info("ready: %" PRIu64 " pages of %s written and verified in %" PRIu64 " ms",
			 s->cfg.data_pages, s->wl_name, ms);
	atomic_store(&s->ready, true);
	return true;
}

static void synth_serve(struct vmm_synth *s)
{
	pthread_mutex_lock(&s->lock);
	for (;;) {
		struct vmm_synth_cmd *c;

		while (!(s->cmd && !s->cmd_done) && !atomic_load(&s->stop))
			pthread_cond_wait(&s->cond, &s->lock);
		if (atomic_load(&s->stop))
			break;
		c = s->cmd;
		pthread_mutex_unlock(&s->lock);
		synth_run_cmd(s, c);
		pthread_mutex_lock(&s->lock);
		s->cmd_done = true;
		pthread_cond_broadcast(&s->cond);
	}
	pthread_mutex_unlock(&s->lock);
}

static void *synth_thread(void *arg)
{
	struct vmm_synth_slice *sl = arg;
	struct vmm_synth *s = sl->s;
	unsigned idx = sl->idx;

	free(sl);
	synth_startup_slice(s, idx);
	if (idx == 0 && synth_startup_wait(s))
		synth_serve(s);
	if (idx == 0) {
		pthread_mutex_lock(&s->lock);
		s->serving_ended = true;
		pthread_cond_broadcast(&s->cond);
		pthread_mutex_unlock(&s->lock);
	}
	return NULL;
}

static int synth_spawn(struct vmm_synth *s, unsigned idx)
{
	struct vmm_synth_slice *sl = malloc(sizeof(*sl));
	char name[16];
	int ret;

	if (!sl)
		return -ENOMEM;
	sl->s = s;
	sl->idx = idx;
	ret = -pthread_create(&s->threads[idx], NULL, synth_thread, sl);
	if (ret) {
		free(sl);
		return ret;
	}
	s->started++;
	snprintf(name, sizeof(name), "vcpu%u", idx);
	pthread_setname_np(s->threads[idx], name);
	return 0;
}

int vmm_synth__start(struct vmm_synth **out, struct vmm_mem *mem, const struct vmm_synth_cfg *cfg)
{
	struct vmm_synth *s;
	int ret;

	if (!cfg->vcpus || cfg->workload < 0 || cfg->workload > VMM_WL_NONE ||
	    cfg->data_pages > (vmm_mem__size(mem) >> PROTO_PAGE_SHIFT))
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->threads = calloc(cfg->vcpus, sizeof(*s->threads));
	if (!s->threads) {
		ret = -ENOMEM;
		goto err_free;
	}
	s->mem = mem;
	s->cfg = *cfg;
	s->wl_name = cfg->workload == VMM_WL_NONE ? "none" : wl_names[cfg->workload];
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	s->t_start = util_now_ns();
	for (unsigned i = 0; i < cfg->vcpus; i++) {
		ret = synth_spawn(s, i);
		if (ret)
			goto err_stop;
	}
	*out = s;
	return 0;

err_stop:
	vmm_synth__stop(s);
	return ret;
err_free:
	free(s);
	return ret;
}

void vmm_synth__interrupt(struct vmm_synth *s)
{
	pthread_mutex_lock(&s->lock);
	atomic_store(&s->stop, true);
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

void vmm_synth__stop(struct vmm_synth *s)
{
	if (!s)
		return;
	vmm_synth__interrupt(s);
	for (unsigned i = 0; i < s->started; i++)
		pthread_join(s->threads[i], NULL);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
	free(s->threads);
	free(s);
}

int vmm_synth__call(struct vmm_synth *s, struct vmm_synth_cmd *cmd)
{
	int ret = 0;

	pthread_mutex_lock(&s->lock);
	/* One caller at a time: wait for the mailbox to empty. */
	while (s->cmd && !s->serving_ended)
		pthread_cond_wait(&s->cond, &s->lock);
	if (s->serving_ended || atomic_load(&s->stop)) {
		ret = -ESHUTDOWN;
		goto out;
	}
	s->cmd = cmd;
	s->cmd_done = false;
	pthread_cond_broadcast(&s->cond);
	while (!s->cmd_done && !s->serving_ended)
		pthread_cond_wait(&s->cond, &s->lock);
	if (!s->cmd_done)
		ret = -ESHUTDOWN;
	s->cmd = NULL;
	pthread_cond_broadcast(&s->cond);
out:
	pthread_mutex_unlock(&s->lock);
	return ret;
}

bool vmm_synth__ready(const struct vmm_synth *s)
{
	return atomic_load(&((struct vmm_synth *)s)->ready);
}

bool vmm_synth__failed(const struct vmm_synth *s)
{
	return atomic_load(&((struct vmm_synth *)s)->failed);
}
