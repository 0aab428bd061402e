/* htab.c: the intrusive chained hash table under the index and client tables. */
#include <errno.h>
#include <stdlib.h>

#include "pool.h"

uint64_t pool_meta_bytes;

void *pool_mem__alloc(size_t size)
{
	void *p = calloc(1, size);

	if (p)
		pool_meta_bytes += size;
	return p;
}

void pool_mem__free(void *p, size_t size)
{
	if (!p)
		return;
	pool_meta_bytes -= size;
	free(p);
}

/* splitmix64's finaliser: keys are often small and sequential (page numbers). */
uint64_t pool_mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

int pool_htab__init(struct pool_htab *t, uint64_t buckets)
{
	t->b = pool_mem__alloc(sizeof(*t->b) * buckets);
	if (!t->b)
		return -ENOMEM;
	t->mask = buckets - 1;
	t->n = 0;
	return 0;
}

void pool_htab__fini(struct pool_htab *t)
{
	if (t->b)
		pool_mem__free(t->b, sizeof(*t->b) * (t->mask + 1));
	t->b = NULL;
	t->n = 0;
}

/* Double the buckets; on allocation failure the table just gets longer chains. */
static void pool_htab_grow(struct pool_htab *t)
{
	uint64_t nb = (t->mask + 1) * 2;
	struct pool_hnode **b = pool_mem__alloc(sizeof(*b) * nb);

	if (!b)
		return;
	for (uint64_t i = 0; i <= t->mask; i++) {
		struct pool_hnode *n = t->b[i], *next;

		for (; n; n = next) {
			next = n->next;
			n->next = b[n->h & (nb - 1)];
			b[n->h & (nb - 1)] = n;
		}
	}
	pool_mem__free(t->b, sizeof(*t->b) * (t->mask + 1));
	t->b = b;
	t->mask = nb - 1;
}

void pool_htab__add(struct pool_htab *t, struct pool_hnode *n, uint64_t h)
{
	if (t->n >= 2 * (t->mask + 1))
		pool_htab_grow(t);
	n->h = h;
	n->next = t->b[h & t->mask];
	t->b[h & t->mask] = n;
	t->n++;
}

void pool_htab__del(struct pool_htab *t, struct pool_hnode *n)
{
	for (struct pool_hnode **pp = &t->b[n->h & t->mask]; *pp; pp = &(*pp)->next) {
		if (*pp == n) {
			*pp = n->next;
			t->n--;
			return;
		}
	}
}

void pool_htab__each(struct pool_htab *t, void (*fn)(struct pool_hnode *, void *), void *arg)
{
	if (!t->b)
		return;
	for (uint64_t i = 0; i <= t->mask; i++) {
		struct pool_hnode *n = t->b[i], *next;

		for (; n; n = next) {
			next = n->next;
			fn(n, arg);
		}
	}
}
