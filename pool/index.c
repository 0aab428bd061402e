/* index.c: the (domain, hash) index and the two-phase merge path. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "log.h"
#include "pool.h"
#include "util.h"

/*
 * DOC: how pages merge
 *
 * The index maps (sharing domain, XXH3-128 hash) to an entry. An entry goes
 * through the two phases of mm/ksm.c's unstable and stable trees, except
 * that hashes sent by the clients replace the tree walks:
 *
 * CAND: the first OFFER of a hash only remembers (client, page) as a
 *   candidate. Nothing is stored and nothing is answered: most pages are
 *   unique and must cost the pool nothing but an entry.
 *
 * UPLOADING: a second OFFER of that hash, from any page of any client of the
 *   same domain, makes the pool ask that page's owner to UPLOAD. Further
 *   OFFERs wait on the entry. If the uploader goes away (FORGET, a newer
 *   OFFER for its page, socket closed) or sends bytes that do not hash to the
 *   claimed hash, another candidate is asked; with one candidate left the
 *   entry falls back to CAND.
 *
 * STABLE: the uploaded bytes were copied out of the client's staging slot
 *   into a fresh store slot and hashed *by the pool*; only when that hash
 *   equals the entry's does the slot become canonical. Every candidate gets
 *   MAP and one reference per MAP. A later OFFER of the hash is answered MAP
 *   at once. A client never trusts MAP blindly either: it compares bytes.
 *
 * References: each client keeps its own map of page -> slot (refmap.c), so
 * DROP can only take back references that client was given. The entry's
 * @refs is the sum over clients; at zero the entry leaves the index and the
 * slot goes back to the store's free map to be recycled. A client whose
 * socket closes keeps its references (its mappings are still live) until
 * its process exits; candidates go at once since nobody can upload them.
 */

static uint64_t pool_index_seed[2];

static uint64_t pool_entry_key(const struct pool_domain *d, const uint64_t hash[2])
{
	/* Keyed, so that clients cannot aim all their hashes at one bucket. */
	return pool_mix64(hash[0] ^ pool_index_seed[0] ^ ((uint64_t)d->id << 40)) ^
	       pool_mix64(hash[1] ^ pool_index_seed[1]);
}

int pool_index__init(struct pool *p)
{
	if (getrandom(pool_index_seed, sizeof(pool_index_seed), 0) != sizeof(pool_index_seed))
		pool_index_seed[0] = util_now_ns();
	return pool_htab__init(&p->index, 1024);
}

void pool_index__fini(struct pool *p)
{
	pool_htab__fini(&p->index);
}

/* Apply @delta to one counter of the pool, the domain and the client. */
#define POOL_COUNT(p, c, field, delta) do {			\
		(p)->cnt.field += (delta);			\
		(c)->dom->cnt.field += (delta);			\
		(c)->cnt.field += (delta);			\
	} while (0)

static struct pool_entry *pool_entry_find(struct pool *p, struct pool_domain *d,
					  const uint64_t hash[2])
{
	uint64_t h = pool_entry_key(d, hash);

	for (struct pool_hnode *n = pool_htab__chain(&p->index, h); n; n = n->next) {
		struct pool_entry *e = (struct pool_entry *)n;

		if (n->h == h && e->dom == d && e->hash[0] == hash[0] && e->hash[1] == hash[1])
			return e;
	}
	return NULL;
}

static struct pool_entry *pool_entry_new(struct pool *p, struct pool_domain *d,
					 const uint64_t hash[2])
{
	struct pool_entry *e = pool_mem__alloc(sizeof(*e));

	if (!e)
		return NULL;
	e->hash[0] = hash[0];
	e->hash[1] = hash[1];
	e->dom = d;
	e->state = POOL_E_CAND;
	pool_htab__add(&p->index, &e->hn, pool_entry_key(d, hash));
	return e;
}

static void pool_entry_free(struct pool *p, struct pool_entry *e)
{
	if (e->state == POOL_E_STABLE) {
		pool_store__free(&p->store, e->seg, e->slot);
		p->cnt.pages_shared--;
		e->dom->cnt.pages_shared--;
	}
	pool_htab__del(&p->index, &e->hn);
	pool_mem__free(e, sizeof(*e));
}

static struct pool_cand *pool_cand_find(struct pool_client *c, uint64_t page)
{
	uint64_t h = pool_mix64(page);

	for (struct pool_hnode *n = pool_htab__chain(&c->pages, h); n; n = n->next) {
		struct pool_cand *k = (struct pool_cand *)n;

		if (n->h == h && k->page == page)
			return k;
	}
	return NULL;
}

static bool pool_client_alive(struct pool_client *c)
{
	return c->sock >= 0 && c->ring && !c->dead;
}

/* The uploader went away: ask another candidate, or fall back to CAND. */
static void pool_entry_settle(struct pool *p, struct pool_entry *e)
{
	if (e->state == POOL_E_STABLE)
		return;
	if (!e->ncands) {
		pool_entry_free(p, e);
		return;
	}
	if (e->state != POOL_E_UPLOADING || e->uploader)
		return;
	if (e->ncands < 2) {
		e->state = POOL_E_CAND;
		return;
	}
	for (struct pool_cand *k = e->cands; k; k = k->next) {
		if (pool_client_alive(k->c)) {
			e->uploader = k;
			pool_ring__post(k->c, k->page, PROTO_V_UPLOAD, 0, 0, PROTO_NO_STAGING,
					PROTO_OP_OFFER);
			return;
		}
	}
	e->state = POOL_E_CAND;
}

/* Unlink a candidate (or zero mark) from its entry and its client, and free it. */
static void pool_cand_remove(struct pool *p, struct pool_cand *k, bool settle)
{
	struct pool_client *c = k->c;
	struct pool_entry *e = k->e;

	pool_htab__del(&c->pages, &k->hn);
	if (e) {
		if (k->prev)
			k->prev->next = k->next;
		else
			e->cands = k->next;
		if (k->next)
			k->next->prev = k->prev;
		e->ncands--;
		if (e->uploader == k)
			e->uploader = NULL;
		POOL_COUNT(p, c, candidates, -1);
	} else {
		POOL_COUNT(p, c, zero_pages, -1);
	}
	pool_mem__free(k, sizeof(*k));
	if (e && settle)
		pool_entry_settle(p, e);
}

static struct pool_cand *pool_cand_add(struct pool *p, struct pool_client *c, uint64_t page,
				       struct pool_entry *e)
{
	struct pool_cand *k = pool_mem__alloc(sizeof(*k));

	if (!k)
		return NULL;
	k->page = page;
	k->c = c;
	k->e = e;
	pool_htab__add(&c->pages, &k->hn, pool_mix64(page));
	if (e) {
		/* Append: the oldest candidate is asked first when an uploader fails. */
		struct pool_cand **pp = &e->cands;

		while (*pp) {
			k->prev = *pp;
			pp = &(*pp)->next;
		}
		*pp = k;
		e->ncands++;
		POOL_COUNT(p, c, candidates, 1);
	} else {
		POOL_COUNT(p, c, zero_pages, 1);
	}
	return k;
}

/* Give @c one reference on stable @e at @page and tell it to map. */
static int pool_ref_map(struct pool *p, struct pool_client *c, struct pool_entry *e,
			uint64_t page, uint32_t staging, uint32_t op)
{
	if (pool_refmap__add(&c->refmap, page, pool_store__gslot(&p->store, e->seg, e->slot)))
		return -ENOMEM;
	if (e->refs++) {
		p->cnt.pages_sharing++;
		e->dom->cnt.pages_sharing++;
	}
	POOL_COUNT(p, c, pages_mapped, 1);
	pool_ring__post(c, page, PROTO_V_MAP, e->seg, e->slot, staging, op);
	return 0;
}

/* @c gave back one reference on @e; the last one frees the slot. */
static void pool_ref_put(struct pool *p, struct pool_client *c, struct pool_entry *e)
{
	POOL_COUNT(p, c, pages_mapped, -1);
	if (--e->refs) {
		p->cnt.pages_sharing--;
		e->dom->cnt.pages_sharing--;
	} else {
		pool_entry_free(p, e);
	}
}

void pool_index__offer(struct pool *p, struct pool_client *c, const struct proto_sqe *q)
{
	struct pool_cand *k = pool_cand_find(c, q->page);
	struct pool_entry *e;

	if (k)
		pool_cand_remove(p, k, true); /* the page changed since: that hash is stale */
	if (p->conf.share == POOL_SHARE_NONE) {
		pool_ring__post(c, q->page, PROTO_V_UNSHARED, 0, 0, PROTO_NO_STAGING, q->op);
		return;
	}
	e = pool_entry_find(p, c->dom, q->hash);
	if (e && e->state == POOL_E_STABLE) {
		if (pool_ref_map(p, c, e, q->page, PROTO_NO_STAGING, q->op))
			pool_ring__post(c, q->page, PROTO_V_NOSPACE, 0, 0, PROTO_NO_STAGING, q->op);
		return;
	}
	if (!e)
		e = pool_entry_new(p, c->dom, q->hash);
	k = e ? pool_cand_add(p, c, q->page, e) : NULL;
	if (!k) {
		if (e && !e->ncands)
			pool_entry_free(p, e);
		pool_ring__post(c, q->page, PROTO_V_NOSPACE, 0, 0, PROTO_NO_STAGING, q->op);
		return;
	}
	if (e->state != POOL_E_CAND || e->ncands < 2)
		return;
	if (!pool_store__has_room(&p->store)) {
		pool_ring__post(c, q->page, PROTO_V_NOSPACE, 0, 0, PROTO_NO_STAGING, q->op);
		return;
	}
	/* A duplicate: the newest offerer holds the bytes right now, ask it. */
	e->state = POOL_E_UPLOADING;
	e->uploader = k;
	e->dup_ns = util_now_ns();
	pool_ring__post(c, q->page, PROTO_V_UPLOAD, 0, 0, PROTO_NO_STAGING, q->op);
}

/* Store is full: the uploader and everyone waiting on @e keep their pages private. */
static void pool_entry_nospace(struct pool *p, struct pool_entry *e, struct pool_client *c,
			       const struct proto_sqe *q)
{
	pool_ring__post(c, q->page, PROTO_V_NOSPACE, 0, 0, q->staging, q->op);
	while (e->cands) {
		struct pool_cand *k = e->cands;

		if (k->c != c || k->page != q->page)
			pool_ring__post(k->c, k->page, PROTO_V_NOSPACE, 0, 0, PROTO_NO_STAGING,
					PROTO_OP_OFFER);
		pool_cand_remove(p, k, false);
	}
	pool_entry_free(p, e);
}

/* The uploaded bytes are canonical now: map every candidate onto them. */
static void pool_entry_stabilise(struct pool *p, struct pool_entry *e, struct pool_cand *up,
				 const struct proto_sqe *q)
{
	struct pool_client *uc = up->c;

	e->state = POOL_E_STABLE;
	e->uploader = NULL;
	p->store.segs[e->seg]->owner[e->slot] = e;
	p->cnt.pages_shared++;
	e->dom->cnt.pages_shared++;
	POOL_COUNT(p, uc, uploads, 1);
	while (e->cands) {
		struct pool_cand *k = e->cands;
		struct pool_client *kc = k->c;
		uint64_t page = k->page;
		bool mine = k == up;

		pool_cand_remove(p, k, false);
		pool_ref_map(p, kc, e, page, mine ? q->staging : PROTO_NO_STAGING,
			     mine ? q->op : PROTO_OP_OFFER);
	}
	if (e->dup_ns) {
		p->lat_sum_ns += util_now_ns() - e->dup_ns;
		p->lat_n++;
	}
}

void pool_index__upload(struct pool *p, struct pool_client *c, const struct proto_sqe *q)
{
	struct pool_cand *k = pool_cand_find(c, q->page);
	struct pool_entry *e = k ? k->e : NULL;
	uint64_t got[2];
	uint8_t *dst;
	int ret;

	if (!e || e->state == POOL_E_STABLE || e->hash[0] != q->hash[0] ||
	    e->hash[1] != q->hash[1]) {
		/* Stale (the page was re-offered or forgotten since) or unasked. */
		pool_ring__post(c, q->page, PROTO_V_DONE, 0, 0, q->staging, q->op);
		return;
	}
	ret = pool_store__alloc(&p->store, &c->hint, q->page, &e->seg, &e->slot);
	if (ret) {
		pool_entry_nospace(p, e, c, q);
		return;
	}
	/* Copy first, then hash our copy: the client can rewrite staging at will. */
	dst = pool_store__page(&p->store, e->seg, e->slot);
	memcpy(dst, c->staging + (uint64_t)q->staging * PROTO_PAGE_SIZE, PROTO_PAGE_SIZE);
	util_hash_page(dst, got);
	if (got[0] != e->hash[0] || got[1] != e->hash[1]) {
		pool_store__free(&p->store, e->seg, e->slot);
		c->hint.valid = false;
		POOL_COUNT(p, c, upload_mismatches, 1);
		log_debug("client %u: upload of page %llu does not match its hash", c->id,
			  (unsigned long long)q->page);
		pool_ring__post(c, q->page, PROTO_V_MISMATCH, 0, 0, q->staging, q->op);
		pool_cand_remove(p, k, true);
		return;
	}
	pool_entry_stabilise(p, e, k, q);
}

void pool_index__drop(struct pool *p, struct pool_client *c, const struct proto_sqe *q)
{
	struct pool_seg *seg = pool_store__seg(&p->store, q->seg);

	/* Only a reference this client was given, at the page it was given for. */
	if (!seg || q->slot >= p->store.seg_pages || !seg->owner[q->slot] ||
	    pool_refmap__del(&c->refmap, q->page, pool_store__gslot(&p->store, q->seg, q->slot))) {
		pool_ring__post(c, q->page, PROTO_V_EINVAL, q->seg, q->slot, PROTO_NO_STAGING,
				q->op);
		return;
	}
	pool_ref_put(p, c, seg->owner[q->slot]);
}

void pool_index__forget(struct pool *p, struct pool_client *c, uint64_t page)
{
	struct pool_cand *k = pool_cand_find(c, page);

	if (k)
		pool_cand_remove(p, k, true);
}

void pool_index__zero(struct pool *p, struct pool_client *c, uint64_t page)
{
	struct pool_cand *k = pool_cand_find(c, page);

	if (k && !k->e)
		return; /* already counted */
	if (k)
		pool_cand_remove(p, k, true);
	pool_cand_add(p, c, page, NULL);
}

static void pool_detach_one(struct pool_hnode *n, void *arg)
{
	struct pool_cand *k = (struct pool_cand *)n;

	if (k->e)
		pool_cand_remove(arg, k, true);
}

void pool_index__detach(struct pool *p, struct pool_client *c)
{
	pool_htab__each(&c->pages, pool_detach_one, p);
}

static void pool_release_cand(struct pool_hnode *n, void *arg)
{
	pool_cand_remove(arg, (struct pool_cand *)n, true);
}

struct pool_release_arg {
	struct pool *p;
	struct pool_client *c;
};

static void pool_release_ref(uint64_t page, uint64_t gslot, void *arg)
{
	struct pool_release_arg *a = arg;
	struct pool_store *st = &a->p->store;

	pool_ref_put(a->p, a->c, st->segs[gslot / st->seg_pages]->owner[gslot % st->seg_pages]);
}

void pool_index__release(struct pool *p, struct pool_client *c)
{
	struct pool_release_arg a = { .p = p, .c = c };

	pool_htab__each(&c->pages, pool_release_cand, p);
	pool_refmap__each(&c->refmap, pool_release_ref, &a);
	pool_refmap__fini(&c->refmap);
}

#define POOL_UPLOAD_TIMEOUT_NS (5ull * 1000000000ull)

/*
 * An asked uploader that never answers would leave its waiters waiting
 * forever: after POOL_UPLOAD_TIMEOUT_NS ask the next live candidate instead.
 * The old uploader's candidate stays, so a late UPLOAD from it still counts.
 */
static void pool_index_expire_one(struct pool_hnode *n, void *arg)
{
	struct pool_entry *e = (struct pool_entry *)n;
	uint64_t now = *(uint64_t *)arg;
	struct pool_cand *k;

	if (e->state != POOL_E_UPLOADING || now - e->dup_ns < POOL_UPLOAD_TIMEOUT_NS)
		return;
	k = e->uploader ? e->uploader->next : NULL;
	for (uint32_t i = 0; i < e->ncands; i++, k = k ? k->next : NULL) {
		if (!k)
			k = e->cands;
		if (k != e->uploader && pool_client_alive(k->c))
			break;
	}
	e->dup_ns = now;
	if (!k || k == e->uploader)
		return;
	log_debug("client %u: upload of page %llu timed out; asking client %u",
		  e->uploader ? e->uploader->c->id : 0, (unsigned long long)
		  (e->uploader ? e->uploader->page : 0), k->c->id);
	e->uploader = k;
	pool_ring__post(k->c, k->page, PROTO_V_UPLOAD, 0, 0, PROTO_NO_STAGING, PROTO_OP_OFFER);
}

void pool_index__expire(struct pool *p)
{
	uint64_t now = util_now_ns();

	pool_htab__each(&p->index, pool_index_expire_one, &now);
}
