/* t-workload.c: workloads are deterministic, shared where they should be and unique where not. */
#include <stdio.h>
#include <string.h>

#include "proto.h"
#include "util.h"
#include "workload.h"

static int failures;
#define T_CHECK(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

int main(void)
{
	static unsigned char a[PROTO_PAGE_SIZE], b[PROTO_PAGE_SIZE];
	uint64_t h1[2], h2[2];

	T_CHECK(wl_parse("shared-random") == WL_SHARED_RANDOM);
	T_CHECK(wl_parse("nope") < 0);
	for (int k = 0; k < WL_COUNT; k++)
		T_CHECK(wl_parse(wl_names[k]) == k);

	wl_page(WL_SHARED_RANDOM, 7, 0, 5, a);
	wl_page(WL_SHARED_RANDOM, 7, 3, 5, b);
	T_CHECK(!memcmp(a, b, sizeof(a)));            /* same in every instance */
	wl_page(WL_SHARED_RANDOM, 7, 0, 6, b);
	T_CHECK(memcmp(a, b, sizeof(a)));             /* differs across pages */
	wl_page(WL_UNIQUE_RANDOM, 7, 0, 5, a);
	wl_page(WL_UNIQUE_RANDOM, 7, 1, 5, b);
	T_CHECK(memcmp(a, b, sizeof(a)));             /* differs across instances */
	wl_page(WL_REPEATED, 7, 0, 1, a);
	wl_page(WL_REPEATED, 7, 2, 900, b);
	T_CHECK(!memcmp(a, b, sizeof(a)));
	wl_page(WL_ZEROS, 7, 0, 1, a);
	T_CHECK(util_page_is_zero(a));
	a[4095] = 1;
	T_CHECK(!util_page_is_zero(a));
	wl_page(WL_PATTERNS, 7, 0, 1, a);
	wl_page(WL_PATTERNS, 7, 0, 5, b);
	T_CHECK(!memcmp(a, b, sizeof(a)) && a[0] == 'B');

	util_hash_page(a, h1);
	util_hash(b, sizeof(b), h2);
	T_CHECK(h1[0] == h2[0] && h1[1] == h2[1]);
	b[17] ^= 1;
	util_hash_page(b, h2);
	T_CHECK(h1[0] != h2[0] || h1[1] != h2[1]);
	return failures ? 1 : 0;
}
