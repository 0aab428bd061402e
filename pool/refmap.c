/* refmap.c: the references one client holds, four bytes per mapped guest page. */
#include <errno.h>

#include "pool.h"

/*
 * DOC: a client's references
 *
 * Almost every reference is the only one a client holds at its page, so the
 * map is a flat array of u32 per guest page (global slot + 1, 0 for none),
 * cut into POOL_REFMAP_CHUNK-page chunks that are allocated when a page in
 * them is first mapped: a client that maps 16K pages costs 64 KiB, not a
 * hash node per page. The rare second reference at the same page (a MAP
 * that crossed the client's DROP of an older one, or a global slot too large
 * for 32 bits) goes to a small hash table beside it.
 */

#define POOL_REFMAP_SHIFT 10
#define POOL_REFMAP_CHUNK (1u << POOL_REFMAP_SHIFT)

int pool_refmap__init(struct pool_refmap *r, uint64_t guest_pages)
{
	r->nchunks = (guest_pages + POOL_REFMAP_CHUNK - 1) >> POOL_REFMAP_SHIFT;
	r->chunk = pool_mem__alloc(sizeof(*r->chunk) * (r->nchunks ? r->nchunks : 1));
	if (!r->chunk)
		return -ENOMEM;
	if (pool_htab__init(&r->extra, 16)) {
		pool_mem__free(r->chunk, sizeof(*r->chunk) * (r->nchunks ? r->nchunks : 1));
		r->chunk = NULL;
		return -ENOMEM;
	}
	return 0;
}

static void pool_refmap_free_extra(struct pool_hnode *n, void *arg)
{
	pool_mem__free(n, sizeof(struct pool_ref));
}

void pool_refmap__fini(struct pool_refmap *r)
{
	if (!r->chunk)
		return;
	for (uint64_t i = 0; i < r->nchunks; i++)
		pool_mem__free(r->chunk[i], sizeof(uint32_t) * POOL_REFMAP_CHUNK);
	pool_mem__free(r->chunk, sizeof(*r->chunk) * (r->nchunks ? r->nchunks : 1));
	r->chunk = NULL;
	pool_htab__each(&r->extra, pool_refmap_free_extra, NULL);
	pool_htab__fini(&r->extra);
}

static uint64_t pool_refmap_key(uint64_t page, uint64_t gslot)
{
	return pool_mix64(page ^ pool_mix64(gslot));
}

static struct pool_ref *pool_refmap_extra(struct pool_refmap *r, uint64_t page, uint64_t gslot)
{
	uint64_t h = pool_refmap_key(page, gslot);

	for (struct pool_hnode *n = pool_htab__chain(&r->extra, h); n; n = n->next) {
		struct pool_ref *x = (struct pool_ref *)n;

		if (n->h == h && x->page == page && x->gslot == gslot)
			return x;
	}
	return NULL;
}

/* The array cell of @page, allocating its chunk if @create; NULL if none. */
static uint32_t *pool_refmap_cell(struct pool_refmap *r, uint64_t page, bool create)
{
	uint64_t ci = page >> POOL_REFMAP_SHIFT;

	if (ci >= r->nchunks)
		return NULL;
	if (!r->chunk[ci] && create)
		r->chunk[ci] = pool_mem__alloc(sizeof(uint32_t) * POOL_REFMAP_CHUNK);
	return r->chunk[ci] ? &r->chunk[ci][page & (POOL_REFMAP_CHUNK - 1)] : NULL;
}

int pool_refmap__add(struct pool_refmap *r, uint64_t page, uint64_t gslot)
{
	uint32_t *cell = pool_refmap_cell(r, page, true);
	struct pool_ref *x;

	if (cell && !*cell && gslot < UINT32_MAX) {
		*cell = (uint32_t)gslot + 1;
		return 0;
	}
	x = pool_refmap_extra(r, page, gslot);
	if (!x) {
		x = pool_mem__alloc(sizeof(*x));
		if (!x)
			return -ENOMEM;
		x->page = page;
		x->gslot = gslot;
		pool_htab__add(&r->extra, &x->hn, pool_refmap_key(page, gslot));
	}
	x->count++;
	return 0;
}

int pool_refmap__del(struct pool_refmap *r, uint64_t page, uint64_t gslot)
{
	uint32_t *cell = pool_refmap_cell(r, page, false);
	struct pool_ref *x;

	if (cell && *cell && *cell - 1 == gslot) {
		*cell = 0;
		return 0;
	}
	x = pool_refmap_extra(r, page, gslot);
	if (!x)
		return -ENOENT;
	if (!--x->count) {
		pool_htab__del(&r->extra, &x->hn);
		pool_mem__free(x, sizeof(*x));
	}
	return 0;
}

struct pool_refmap_each_arg {
	void (*fn)(uint64_t page, uint64_t gslot, void *arg);
	void *arg;
};

static void pool_refmap_each_extra(struct pool_hnode *n, void *arg)
{
	struct pool_refmap_each_arg *a = arg;
	struct pool_ref *x = (struct pool_ref *)n;

	for (uint32_t i = 0; i < x->count; i++)
		a->fn(x->page, x->gslot, a->arg);
}

void pool_refmap__each(struct pool_refmap *r, void (*fn)(uint64_t page, uint64_t gslot, void *arg),
		       void *arg)
{
	struct pool_refmap_each_arg a = { .fn = fn, .arg = arg };

	for (uint64_t ci = 0; ci < r->nchunks; ci++) {
		if (!r->chunk[ci])
			continue;
		for (uint32_t i = 0; i < POOL_REFMAP_CHUNK; i++)
			if (r->chunk[ci][i])
				fn((ci << POOL_REFMAP_SHIFT) + i, r->chunk[ci][i] - 1, arg);
	}
	pool_htab__each(&r->extra, pool_refmap_each_extra, &a);
}
