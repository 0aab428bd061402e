/* bench.c: merge throughput of the pool alone, OFFER -> UPLOAD -> MAP with two raw clients. */
#include <stdlib.h>
#include <string.h>

#include "tclient.h"
#include "util.h"

/*
 * Usage: PVISOR_POOL_BIN=build/pool/pvisor-pool build/tests/pool/pool-bench [pages]
 * Client A offers pages 0..N-1 (candidates), client B offers the same content
 * and uploads every page it is asked for; we time until both hold N MAPs.
 */

#define BATCH 256

int main(int argc, char **argv)
{
	uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 0) : 65536, t0, t1, mapped_a = 0;
	uint64_t mapped_b = 0, sent = 0;
	uint8_t *pages = malloc(BATCH * PROTO_PAGE_SIZE);
	struct t_client a, b;
	struct json_object *s;
	struct t_pool pool;
	struct proto_cqe v;

	t_pool_start(&pool, "", "--log-level", "warn", NULL);
	t_connect(&a, pool.sock, "default", n);
	t_connect(&b, pool.sock, "default", n);
	for (int i = 0; i < BATCH; i++)
		t_fill(pages + (size_t)i * PROTO_PAGE_SIZE, 1 + (uint64_t)i);

	t0 = util_now_ns();
	for (uint64_t i = 0; i < n; i++) {
		struct proto_sqe q = { .page = i, .op = PROTO_OP_OFFER };
		uint8_t *pg = pages + (i % BATCH) * PROTO_PAGE_SIZE;

		memcpy(pg, &i, sizeof(i)); /* unique per page */
		util_hash_page(pg, q.hash);
		t_submit(&a, &q);
	}
	while (mapped_a < n || mapped_b < n) {
		while (sent < n && sent - mapped_b < BATCH) {
			struct proto_sqe q = { .page = sent, .op = PROTO_OP_OFFER };
			uint8_t *pg = pages + (sent % BATCH) * PROTO_PAGE_SIZE;

			memcpy(pg, &sent, sizeof(sent));
			util_hash_page(pg, q.hash);
			t_submit(&b, &q);
			sent++;
		}
		while (t_wait_cqe(&b, &v, 0)) {
			if (v.verdict == PROTO_V_UPLOAD) {
				uint8_t *pg = pages + (v.page % BATCH) * PROTO_PAGE_SIZE;

				t_upload(&b, v.page, pg, (uint32_t)(v.page % BATCH));
			} else if (v.verdict == PROTO_V_MAP) {
				mapped_b++;
			} else {
				t_fail("unexpected verdict %u", v.verdict);
			}
		}
		while (t_wait_cqe(&a, &v, 0))
			mapped_a += v.verdict == PROTO_V_MAP;
		if (mapped_a < n && sent == n && mapped_b == n) {
			if (!t_wait_cqe(&a, &v, 2000))
			{
				s = t_stat(pool.sock, false);
				t_fail("stalled at %llu/%llu: %s", (unsigned long long)mapped_a,
				       (unsigned long long)n, json_object_to_json_string(s));
			}
			mapped_a += v.verdict == PROTO_V_MAP;
		}
	}
	t1 = util_now_ns();
	{
		char path[64];
		unsigned long ut = 0, st = 0;
		FILE *f;

		snprintf(path, sizeof(path), "/proc/%d/stat", (int)pool.pid);
		f = fopen(path, "r");
		if (f && fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
				&ut, &st) == 2)
			printf("pool CPU: %.2f s user + %.2f s system = %.2f us per merged page\n",
			       ut / 100.0, st / 100.0, (ut + st) * 1e4 / n);
		if (f)
			fclose(f);
	}
	s = t_stat(pool.sock, false);
	printf("pages %llu: %.0f pages/s merged (%.2f us/page), metadata %lld bytes = %.1f bytes/page"
	       " (2 refs per slot), merge latency %lld us, store %lld bytes\n",
	       (unsigned long long)n, n / ((t1 - t0) / 1e9), (t1 - t0) / 1e3 / n,
	       (long long)t_stat_get(s, "metadata_bytes"),
	       (double)t_stat_get(s, "metadata_bytes") / n,
	       (long long)t_stat_get(s, "merge_latency_us"), (long long)t_stat_get(s, "store_bytes"));
	json_object_put(s);
	t_close(&a);
	t_close(&b);
	t_pool_stop(&pool);
	free(pages);
	return 0;
}
