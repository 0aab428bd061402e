/* workload.c: generate the pages of each named workload. */
#include <errno.h>
#include <string.h>

#include "proto.h"
#include "workload.h"

const char *const wl_names[] = { "repeated", "shared-random", "unique-random", "zeros",
				 "patterns", NULL };

int wl_parse(const char *name)
{
	for (int i = 0; i < WL_COUNT; i++)
		if (!strcmp(wl_names[i], name))
			return i;
	return -EINVAL;
}

/* splitmix64: fast, stateless from its input, good enough to defeat dedup. */
static uint64_t wl_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void wl_random(uint64_t key, void *buf)
{
	uint64_t *w = buf;

	for (unsigned i = 0; i < PROTO_PAGE_SIZE / 8; i++)
		w[i] = wl_mix(key + i * 0x9e3779b97f4a7c15ull);
}

void wl_page(enum wl_kind kind, uint64_t seed, uint64_t instance, uint64_t page, void *buf)
{
	switch (kind) {
	case WL_REPEATED:
		wl_random(wl_mix(seed ^ 0x7265706561746564ull), buf);
		return;
	case WL_SHARED_RANDOM:
		wl_random(wl_mix(wl_mix(seed) + page), buf);
		return;
	case WL_UNIQUE_RANDOM:
		wl_random(wl_mix(wl_mix(wl_mix(seed) ^ (instance + 1) * 0xa24baed4963ee407ull) + page),
			  buf);
		return;
	case WL_PATTERNS:
		memset(buf, 'A' + (int)(page % 4), PROTO_PAGE_SIZE);
		return;
	case WL_ZEROS:
	default:
		memset(buf, 0, PROTO_PAGE_SIZE);
		return;
	}
}
