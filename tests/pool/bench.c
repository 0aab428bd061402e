/* bench.c: merge throughput of the pool alone, OFFER -> UPLOAD -> MAP with two raw clients. */
#include <stdlib.h>
#include <string.h>

#include "tclient.h"
#include "util.h"

/*
 * Usage: PVISOR_POOL_BIN=build/pool/pvisor-pool build/tests/pool/pool-bench [pages]
 * Client A offers pages 0..N-1 (candidates), client B offers the same content
 * and uploads every page it is asked for; a round ends when both hold N MAPs.
 * Round 1 fills fresh store memory; then both DROP everything and round 2
 * merges new content into the recycled slots.
 */

#define BATCH 256

struct bench_map {
	uint32_t seg, slot;
};

static void bench_page(uint8_t *pages, uint64_t i, uint64_t salt, uint64_t out[2])
{
	uint8_t *pg = pages + (i % BATCH) * PROTO_PAGE_SIZE;
	uint64_t tag[2] = { i, salt };

	memcpy(pg, tag, sizeof(tag)); /* unique per page and round */
	util_hash_page(pg, out);
}

static void bench_record(struct bench_map *m, const struct proto_cqe *v, uint64_t *count)
{
	if (v->verdict != PROTO_V_MAP)
		t_fail("unexpected verdict %u", v->verdict);
	m[v->page] = (struct bench_map){ v->seg, v->slot };
	(*count)++;
}

/* One round; returns seconds. */
static double bench_round(struct t_client *a, struct t_client *b, uint8_t *pages, uint64_t n,
			  uint64_t salt, struct bench_map *ma, struct bench_map *mb)
{
	uint64_t t0 = util_now_ns(), mapped_a = 0, mapped_b = 0, sent = 0;
	struct proto_cqe v;

	for (uint64_t i = 0; i < n; i++) {
		struct proto_sqe q = { .page = i, .op = PROTO_OP_OFFER };

		bench_page(pages, i, salt, q.hash);
		t_submit(a, &q);
	}
	while (mapped_a < n || mapped_b < n) {
		while (sent < n && sent - mapped_b < BATCH) {
			struct proto_sqe q = { .page = sent, .op = PROTO_OP_OFFER };

			bench_page(pages, sent, salt, q.hash);
			t_submit(b, &q);
			sent++;
		}
		while (t_wait_cqe(b, &v, 0)) {
			if (v.verdict == PROTO_V_UPLOAD)
				t_upload(b, v.page, pages + (v.page % BATCH) * PROTO_PAGE_SIZE,
					 (uint32_t)(v.page % BATCH));
			else
				bench_record(mb, &v, &mapped_b);
		}
		while (t_wait_cqe(a, &v, 0))
			bench_record(ma, &v, &mapped_a);
		if (mapped_a < n && sent == n && mapped_b == n) {
			if (!t_wait_cqe(a, &v, 2000))
				t_fail("stalled at %llu/%llu", (unsigned long long)mapped_a,
				       (unsigned long long)n);
			bench_record(ma, &v, &mapped_a);
		}
	}
	return (util_now_ns() - t0) / 1e9;
}

static double bench_pool_cpu(pid_t pid)
{
	unsigned long ut = 0, st = 0;
	char path[64];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	if (fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		ut = st = 0;
	fclose(f);
	return (ut + st) / 100.0;
}

int main(int argc, char **argv)
{
	uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 0) : 65536;
	uint8_t *pages = malloc(BATCH * PROTO_PAGE_SIZE);
	struct bench_map *ma = calloc(n, sizeof(*ma)), *mb = calloc(n, sizeof(*mb));
	struct t_client a, b;
	struct json_object *s;
	struct t_pool pool;
	double sec, cpu0, cpu1;

	t_pool_start(&pool, "", "--log-level", "warn", NULL);
	t_connect(&a, pool.sock, "default", n);
	t_connect(&b, pool.sock, "default", n);
	for (int i = 0; i < BATCH; i++)
		t_fill(pages + (size_t)i * PROTO_PAGE_SIZE, 1 + (uint64_t)i);

	cpu0 = bench_pool_cpu(pool.pid);
	sec = bench_round(&a, &b, pages, n, 1, ma, mb);
	cpu1 = bench_pool_cpu(pool.pid);
	s = t_stat(pool.sock, false);
	printf("round 1 (fresh store memory): %llu pages in %.2f s = %.0f pages/s; pool CPU %.2f us/page\n",
	       (unsigned long long)n, sec, n / sec, (cpu1 - cpu0) * 1e6 / n);
	printf("metadata %lld bytes = %.1f bytes per shared page (1 entry, 2 refs, slot owner),"
	       " merge latency %lld us\n", (long long)t_stat_get(s, "metadata_bytes"),
	       (double)t_stat_get(s, "metadata_bytes") / n, (long long)t_stat_get(s, "merge_latency_us"));
	json_object_put(s);

	for (uint64_t i = 0; i < n; i++) {
		t_drop(&a, i, ma[i].seg, ma[i].slot);
		t_drop(&b, i, mb[i].seg, mb[i].slot);
	}
	s = t_stat(pool.sock, false);
	json_object_put(s);

	cpu0 = bench_pool_cpu(pool.pid);
	sec = bench_round(&a, &b, pages, n, 2, ma, mb);
	cpu1 = bench_pool_cpu(pool.pid);
	printf("round 2 (recycled slots):     %llu pages in %.2f s = %.0f pages/s; pool CPU %.2f us/page\n",
	       (unsigned long long)n, sec, n / sec, (cpu1 - cpu0) * 1e6 / n);
	t_close(&a);
	t_close(&b);
	t_pool_stop(&pool);
	free(pages);
	free(ma);
	free(mb);
	return 0;
}
