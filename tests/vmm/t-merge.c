/* t-merge.c: four guests with the same random pages end up sharing them, bytes intact. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "tvmm.h"

#define T_GUESTS 4

int main(int argc, char **argv)
{
	uint64_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 16, pages = mib * 256;
	enum wl_kind kind = argc > 2 ? (enum wl_kind)wl_parse(argv[2]) : WL_SHARED_RANDOM;
	struct vmm_mem *m[T_GUESTS] = { 0 };
	struct vmm_mem_stats st;
	struct t_pool pool;
	int ret = T_FAIL;
	uint64_t shared = 0, first = UINT64_MAX, last = 0, hashed = 0, hash_ns = 0, cpu = 0;
	uint64_t pss0, pss1;
	double t0;

	log_init("t-merge", getenv("PVISOR_DEBUG") ? LOG_DEBUG : LOG_WARN);
	ret = t_pool_start(&pool);
	if (ret)
		return ret;
	ret = T_FAIL;
	for (int i = 0; i < T_GUESTS; i++) {
		char name[16];

		snprintf(name, sizeof(name), "g%d", i);
		m[i] = t_mem_cfg(&pool, name, mib, false);
		if (!m[i])
			goto out;
		t_fill(m[i], kind, (uint64_t)i, pages);
	}
	pss0 = t_pss_kib();
	t0 = t_now();
	for (int i = 0; i < T_GUESTS; i++)
		if (vmm_mem__start(m[i]))
			goto out;
	for (int i = 0; i < T_GUESTS; i++)
		shared += t_wait_shared(m[i], kind == WL_UNIQUE_RANDOM ? 0 : pages, 30);
	if (kind == WL_UNIQUE_RANDOM) {
		/* let every page be hashed, then measure the idle cost */
		for (int i = 0; i < T_GUESTS; i++)
			for (double end = t_now() + 30; t_now() < end;) {
				vmm_mem__stats(m[i], &st);
				if (st.pages_hashed >= pages)
					break;
				usleep(10000);
			}
	}
	printf("waited %.2f s\n", t_now() - t0);
	pss1 = t_pss_kib();
	for (int i = 0; i < T_GUESTS; i++) {
		vmm_mem__stats(m[i], &st);
		if (st.first_hash_ns && st.first_hash_ns < first)
			first = st.first_hash_ns;
		if (st.last_merge_ns > last)
			last = st.last_merge_ns;
		hashed += st.pages_hashed;
		hash_ns += st.hash_ns;
		cpu += st.dedup_cpu_ns;
		printf("g%d: shared %llu hashed %llu merges %llu fail %llu faults %llu merge_ns_avg %llu "
		       "cpu %.3f s bad %llu connected %d\n", i,
		       (unsigned long long)st.pages_shared, (unsigned long long)st.pages_hashed,
		       (unsigned long long)st.merges, (unsigned long long)st.merge_fail,
		       (unsigned long long)st.wp_faults, (unsigned long long)st.merge_ns_avg,
		       st.dedup_cpu_ns / 1e9, (unsigned long long)st.bad_verdicts, st.pool_connected);
	}
	printf("%s 4 x %llu MiB: first hash to last remap %.3f s, hashing %.2f GB/s (%llu pages), "
	       "dedup CPU %.3f s, PSS %llu -> %llu MiB\n", wl_names[kind], (unsigned long long)mib,
	       last > first ? (double)(last - first) / 1e9 : 0.0,
	       hash_ns ? (double)hashed * 4096 / (double)hash_ns : 0.0, (unsigned long long)hashed,
	       cpu / 1e9, (unsigned long long)pss0 / 1024, (unsigned long long)pss1 / 1024);
	if (kind == WL_UNIQUE_RANDOM) {
		uint64_t c0 = cpu, c1 = 0;

		sleep(5);
		for (int i = 0; i < T_GUESTS; i++) {
			vmm_mem__stats(m[i], &st);
			c1 += st.dedup_cpu_ns;
		}
		printf("idle dedup CPU over 5 s after hashing: %.4f s\n", (c1 - c0) / 1e9);
	}
	for (int i = 0; i < T_GUESTS; i++) {
		uint64_t bad = t_verify(m[i], kind, (uint64_t)i, pages);

		if (bad) {
			printf("FAIL: g%d has %llu pages with wrong bytes\n", i, (unsigned long long)bad);
			goto out;
		}
	}
	if (kind != WL_UNIQUE_RANDOM && shared < (uint64_t)T_GUESTS * pages * 9 / 10) {
		printf("FAIL: only %llu of %llu pages shared\n", (unsigned long long)shared,
		       (unsigned long long)(T_GUESTS * pages));
		goto out;
	}
	/* 4 copies of the guest data in PSS before; about one (split four ways) after */
	if (kind != WL_UNIQUE_RANDOM && pss1 >= pss0 - pss0 / 2) {
		printf("FAIL: PSS did not drop (%llu -> %llu KiB)\n", (unsigned long long)pss0,
		       (unsigned long long)pss1);
		goto out;
	}
	printf("PASS\n");
	ret = T_PASS;
out:
	for (int i = 0; i < T_GUESTS; i++)
		vmm_mem__destroy(m[i]);
	t_pool_stop(&pool);
	return ret;
}
