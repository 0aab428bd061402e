/* t-race.c: writes racing with merges are never lost (and are, with PVISOR_TEST_NO_WP=1). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "proto.h"
#include "tvmm.h"

/*
 * Guest A holds the reference content; guest B holds the same pages, and sixteen
 * writer threads keep toggling the first 8 bytes of B's pages between a
 * unique counter and the original word. A restored page is mergeable again,
 * so it is rehashed and merged while the writer comes back to it at a random
 * time, often inside the merge window (widened with PVISOR_TEST_MERGE_DELAY_US).
 * Before every write the writer checks that the page still holds what it
 * wrote last; afterwards every page is checked in full.
 *
 * Usage: t-vmm-race [nowp]. With nowp the plane runs without its merge write
 * protection and the test passes only if it catches a lost write.
 */

#define T_MIB      1
#define T_PAGES    (T_MIB * 256)
#define T_WRITERS  16
#define T_MERGES   1000
#define T_SECS     60

struct t_writer {
	pthread_t thr;
	struct vmm_mem *m;
	uint64_t lo, hi;           /* pages this writer owns */
	uint64_t *expect;          /* per page: first word we wrote last */
	uint64_t *orig;            /* per page: original first word */
	uint64_t lost;             /* reads that did not return the last write */
	uint64_t writes;
	int id;
};

static volatile int t_stop;

static uint64_t t_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void *t_writer_main(void *arg)
{
	struct t_writer *w = arg;
	uint64_t n = w->hi - w->lo, *next = calloc(n, 8), seed = 0x9e3779b97f4a7c15ull + w->id;
	uint64_t ctr = 1;

	while (!t_stop && next) {
		uint64_t now = (uint64_t)(t_now() * 1e6);

		for (uint64_t i = 0; i < n; i++) {
			uint64_t p = w->lo + i;
			volatile uint64_t *word = vmm_mem__hva(w->m, GPA(p * PROTO_PAGE_SIZE), 8);
			uint64_t v;

			if (next[i] > now)
				continue;
			if (*word != w->expect[p])
				w->lost++;
			if (w->expect[p] == w->orig[p]) {
				v = ((uint64_t)(w->id + 1) << 48) | ctr++;
				next[i] = now + 1000 + t_rand(&seed) % 20000;
			} else {
				v = w->orig[p];
				next[i] = now + 40000 + t_rand(&seed) % 120000;
			}
			*word = v;
			w->expect[p] = v;
			w->writes++;
			if (*word != v)
				w->lost++;
		}
		usleep(200);
	}
	free(next);
	return NULL;
}

static uint64_t t_final_check(struct vmm_mem *m, const uint64_t *expect)
{
	uint8_t want[PROTO_PAGE_SIZE];
	uint64_t bad = 0;

	for (uint64_t p = 0; p < T_PAGES; p++) {
		wl_page(WL_SHARED_RANDOM, 1, 0, p, want);
		memcpy(want, &expect[p], 8);
		if (memcmp(want, vmm_mem__hva(m, GPA(p * PROTO_PAGE_SIZE), PROTO_PAGE_SIZE),
			   PROTO_PAGE_SIZE))
			bad++;
	}
	return bad;
}

int main(int argc, char **argv)
{
	bool nowp = argc > 1 && !strcmp(argv[1], "nowp");
	struct t_writer w[T_WRITERS];
	struct vmm_mem *a = NULL, *b = NULL;
	struct vmm_mem_stats st;
	uint64_t *expect, *orig, base, lost = 0, writes = 0, bad;
	struct t_pool pool;
	int ret;
	double end;

	log_init("t-race", getenv("PVISOR_DEBUG") ? LOG_DEBUG : LOG_WARN);
	setenv("PVISOR_TEST_MERGE_DELAY_US", "2000", 0);
	if (nowp)
		setenv("PVISOR_TEST_NO_WP", "1", 1);
	else
		unsetenv("PVISOR_TEST_NO_WP");
	ret = t_pool_start(&pool);
	if (ret)
		return ret;
	ret = T_FAIL;
	expect = calloc(T_PAGES, 8);
	orig = calloc(T_PAGES, 8);
	a = t_mem(&pool, "ref", T_MIB);
	b = t_mem(&pool, "racer", T_MIB);
	if (!a || !b || !expect || !orig)
		goto out;
	t_fill(a, WL_SHARED_RANDOM, 0, T_PAGES);
	t_fill(b, WL_SHARED_RANDOM, 1, T_PAGES);
	for (uint64_t p = 0; p < T_PAGES; p++)
		orig[p] = expect[p] = *(uint64_t *)vmm_mem__hva(b, GPA(p * PROTO_PAGE_SIZE), 8);
	if (t_wait_shared(b, T_PAGES, 30) < T_PAGES) {
		printf("FAIL: initial merge did not happen\n");
		goto out;
	}
	vmm_mem__stats(b, &st);
	base = st.merges;
	for (int i = 0; i < T_WRITERS; i++) {
		w[i] = (struct t_writer){ .m = b, .lo = (uint64_t)i * T_PAGES / T_WRITERS,
					  .hi = (uint64_t)(i + 1) * T_PAGES / T_WRITERS,
					  .expect = expect, .orig = orig, .id = i };
		pthread_create(&w[i].thr, NULL, t_writer_main, &w[i]);
	}
	end = t_now() + T_SECS;
	do {
		usleep(100000);
		vmm_mem__stats(b, &st);
		lost = 0;
		for (int i = 0; i < T_WRITERS; i++)
			lost += w[i].lost;
		/* the control runs until it sees a loss (a window of 2 ms, so it takes a few
		 * hundred merges, sometimes over a thousand); the real test stops at T_MERGES */
	} while (t_now() < end && (nowp ? !lost : st.merges - base < T_MERGES));
	t_stop = 1;
	for (int i = 0; i < T_WRITERS; i++) {
		pthread_join(w[i].thr, NULL);
		lost += 0;
		writes += w[i].writes;
	}
	lost = 0;
	for (int i = 0; i < T_WRITERS; i++)
		lost += w[i].lost;
	bad = t_final_check(b, expect);
	vmm_mem__stats(b, &st);
	printf("%s: %llu merges during the race, %llu writes, %llu faults, %llu cow breaks, "
	       "%llu lost writes seen, %llu pages wrong at the end\n", nowp ? "no-wp" : "wp",
	       (unsigned long long)(st.merges - base), (unsigned long long)writes,
	       (unsigned long long)st.wp_faults, (unsigned long long)st.cow_breaks,
	       (unsigned long long)lost, (unsigned long long)bad);
	if (nowp) {
		ret = lost || bad ? T_PASS : T_FAIL;
		printf("%s: the race test %s a lost write without write protection\n",
		       ret ? "FAIL" : "PASS", ret ? "did not catch" : "caught");
	} else if (lost || bad) {
		printf("FAIL: writes were lost\n");
	} else if (st.merges - base < T_MERGES) {
		printf("FAIL: only %llu merges raced (want %d)\n",
		       (unsigned long long)(st.merges - base), T_MERGES);
	} else {
		printf("PASS\n");
		ret = T_PASS;
	}
out:
	t_stop = 1;
	vmm_mem__destroy(b);
	vmm_mem__destroy(a);
	t_pool_stop(&pool);
	free(expect);
	free(orig);
	return ret;
}
