/* pool.h: pvisor-pool's shared state: store, index, clients, domains, counters. */
#ifndef PVISOR_POOL_H
#define PVISOR_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto.h"

struct ev_loop;
struct pool;
struct pool_client;

/* --- settings (one table for file and CLI, see main.c) ------------------- */

enum pool_share { POOL_SHARE_DOMAIN = 0, POOL_SHARE_NONE = 1 };

/* struct pool_conf - every setting of the daemon */
struct pool_conf {
	char config[256];      /* config file path (CLI only) */
	char socket[108];      /* control socket path (sun_path size) */
	bool physical;         /* page sharing on; off refuses HELLO */
	uint64_t store_limit;  /* most bytes of store pages */
	uint64_t segment_size; /* bytes per store segment */
	int share;             /* enum pool_share */
	int log_level;         /* enum log_level */
	uint64_t max_clients;  /* most HELLO'd clients at once */
	uint64_t max_map_count; /* raise vm.max_map_count to this at start; 0 = leave */
};

/* --- intrusive hash table (htab.c) ---------------------------------------- */

/* struct pool_hnode - link embedded in every hashed object */
struct pool_hnode {
	struct pool_hnode *next; /* bucket chain */
	uint64_t h;              /* full hash of the key, for rehashing and quick compare */
};

/* struct pool_htab - chained table that doubles when it averages 2 per bucket */
struct pool_htab {
	struct pool_hnode **b; /* buckets */
	uint64_t mask;         /* buckets - 1 */
	uint64_t n;            /* nodes */
};

int pool_htab__init(struct pool_htab *t, uint64_t buckets);
void pool_htab__fini(struct pool_htab *t);
void pool_htab__add(struct pool_htab *t, struct pool_hnode *n, uint64_t h);
void pool_htab__del(struct pool_htab *t, struct pool_hnode *n);
/* First node of the chain @h falls in; callers compare n->h and the key. */
static inline struct pool_hnode *pool_htab__chain(struct pool_htab *t, uint64_t h)
{
	return t->b[h & t->mask];
}
/* Visit every node; @fn may delete the node it is given. */
void pool_htab__each(struct pool_htab *t, void (*fn)(struct pool_hnode *, void *), void *arg);
uint64_t pool_mix64(uint64_t x);

/* Heap accounting for metadata_bytes: every index/client allocation goes here. */
void *pool_mem__alloc(size_t size);
void pool_mem__free(void *p, size_t size);
extern uint64_t pool_meta_bytes;

/* --- store (store.c) ------------------------------------------------------ */

struct pool_entry;

/* struct pool_seg - one sealed memfd segment of seg_pages slots */
struct pool_seg {
	uint32_t id;               /* never reused, so a client's cached fd stays right */
	int fd;                    /* sealed memfd */
	uint8_t *map;              /* the pool's read-write mapping */
	uint64_t *freemap;         /* bit set = slot below @fresh that is free */
	struct pool_entry **owner; /* slot -> stable index entry, NULL when free */
	uint32_t fresh;            /* slots from here on were never used (untouched memory) */
	uint32_t used;             /* live slots */
	uint32_t nfree;            /* set bits in freemap */
	uint32_t empty_ticks;      /* 1 s ticks seen with no live slot */
};

/* struct pool_store - every segment and the byte budget */
struct pool_store {
	struct pool_seg **segs;  /* indexed by id; NULL once closed */
	uint32_t nsegs;          /* ids handed out so far */
	uint32_t seg_pages;      /* slots per segment */
	uint64_t limit;          /* store-limit in bytes */
	uint64_t bytes;          /* touched slots * page size, over open segments */
	uint32_t open_segs;      /* segments not closed */
	uint64_t live;           /* live slots */
};

/* struct pool_alloc_hint - where this client's last upload went */
struct pool_alloc_hint {
	uint64_t page;  /* guest page of the last upload */
	uint32_t seg;   /* its segment */
	uint32_t slot;  /* its slot */
	bool valid;
};

int pool_store__init(struct pool_store *s, uint64_t seg_size, uint64_t limit);
void pool_store__fini(struct pool_store *s);
/* Take a slot for guest page @page; -ENOSPC beyond the limit. */
int pool_store__alloc(struct pool_store *s, struct pool_alloc_hint *hint, uint64_t page,
		      uint32_t *seg, uint32_t *slot);
void pool_store__free(struct pool_store *s, uint32_t seg, uint32_t slot);
/* Close segments that stayed empty for a tick (returns their memory). */
void pool_store__reap(struct pool_store *s);
/* Could an alloc succeed right now? */
bool pool_store__has_room(struct pool_store *s);
struct pool_seg *pool_store__seg(struct pool_store *s, uint32_t seg);
/* One number for (seg, slot), as the refmap keeps it. */
static inline uint64_t pool_store__gslot(const struct pool_store *s, uint32_t seg, uint32_t slot)
{
	return (uint64_t)seg * s->seg_pages + slot;
}
static inline uint8_t *pool_store__page(struct pool_store *s, uint32_t seg, uint32_t slot)
{
	return s->segs[seg]->map + (uint64_t)slot * PROTO_PAGE_SIZE;
}

/* --- domains and counters ------------------------------------------------- */

/* struct pool_counters - figures kept globally, per domain and per client */
struct pool_counters {
	uint64_t pages_shared;      /* live slots */
	uint64_t pages_sharing;     /* references beyond the first, per slot */
	uint64_t pages_mapped;      /* references held (per client: its own) */
	uint64_t candidates;        /* (client, page) remembered with a hash, no slot */
	uint64_t uploads;           /* UPLOADs that became a stable slot */
	uint64_t upload_mismatches; /* UPLOADs whose bytes did not hash as claimed */
	uint64_t zero_pages;        /* pages clients reported discarded as zero */
	uint64_t merges;            /* MAP verdicts sent */
	uint64_t errors;            /* EINVAL verdicts sent */
	uint64_t nospace;           /* NOSPACE verdicts sent */
};

/* struct pool_domain - a sharing domain; pages never cross domains */
struct pool_domain {
	char name[PROTO_DOMAIN_MAX];
	uint32_t id;                 /* mixed into index keys */
	uint32_t clients;            /* HELLO'd clients not yet released */
	struct pool_counters cnt;
	struct pool_domain *next;
};

/* --- index (index.c) ------------------------------------------------------ */

enum pool_entry_state {
	POOL_E_CAND,      /* one or more candidates, nothing stored */
	POOL_E_UPLOADING, /* a candidate was asked to upload; the rest wait */
	POOL_E_STABLE,    /* the content is in a slot; refs references */
};

/* struct pool_cand - a client's page remembered under a hash (or as zero) */
struct pool_cand {
	struct pool_hnode hn;      /* in the client's page table, keyed by page */
	uint64_t page;             /* guest page index */
	struct pool_client *c;     /* owner */
	struct pool_entry *e;      /* entry it waits on; NULL for a zero page */
	struct pool_cand *prev, *next; /* entry's candidate list */
};

/* struct pool_entry - one (domain, hash) in the index */
struct pool_entry {
	struct pool_hnode hn;        /* in pool.index */
	uint64_t hash[2];            /* XXH3-128 */
	struct pool_domain *dom;
	uint8_t state;               /* enum pool_entry_state */
	uint32_t seg, slot;          /* STABLE: where the bytes are */
	uint32_t refs;               /* STABLE: references held by clients */
	uint32_t ncands;             /* length of the candidate list */
	struct pool_cand *cands;     /* candidates and waiters */
	struct pool_cand *uploader;  /* UPLOADING: the one asked */
	uint64_t dup_ns;             /* when the duplicate was found (for latency) */
};

/* struct pool_ref - a client's extra references at one page on one slot (refmap.c) */
struct pool_ref {
	struct pool_hnode hn;     /* in pool_refmap.extra, keyed by (page, gslot) */
	uint64_t page;
	uint64_t gslot;           /* seg * seg_pages + slot */
	uint32_t count;           /* MAPs sent minus DROPs */
};

/* struct pool_refmap - the references one client holds (refmap.c) */
struct pool_refmap {
	uint32_t **chunk;         /* per 1024 guest pages: gslot + 1 per page, 0 = none */
	uint64_t nchunks;
	struct pool_htab extra;   /* second and later references at a page */
};

int pool_refmap__init(struct pool_refmap *r, uint64_t guest_pages);
void pool_refmap__fini(struct pool_refmap *r);
int pool_refmap__add(struct pool_refmap *r, uint64_t page, uint64_t gslot);
/* Take back one reference; -ENOENT if the client holds none there. */
int pool_refmap__del(struct pool_refmap *r, uint64_t page, uint64_t gslot);
/* Call @fn once per reference held. */
void pool_refmap__each(struct pool_refmap *r, void (*fn)(uint64_t page, uint64_t gslot, void *arg),
		       void *arg);

/* --- clients (client.c, ring.c) -------------------------------------------- */

/* struct pool_client - one control connection, and after HELLO a VMM */
struct pool_client {
	uint32_t id;               /* stats id, never reused */
	struct pool *p;
	int sock;                  /* -1 once detached */
	int pidfd;                 /* -1 before HELLO */
	pid_t pid;
	uid_t uid;
	bool hello;                /* HELLO accepted */
	char name[PROTO_DOMAIN_MAX];
	struct pool_domain *dom;
	uint64_t guest_pages;

	/* shared ring memfd; everything in it is untrusted */
	int ring_fd, submit_efd, complete_efd;
	uint8_t *ring;
	uint64_t ring_size;
	struct proto_ring_idx *sq_idx, *cq_idx;
	struct proto_sqe *sqes;
	struct proto_cqe *cqes;
	uint8_t *staging;
	uint32_t sq_entries, cq_entries, staging_slots;
	uint32_t sq_head;          /* the pool's own consumer index, never read back */
	uint32_t cq_tail;          /* the pool's own producer index, never read back */
	bool pending;              /* SQEs left after the fairness cap */
	bool dead;                 /* detach requested while in a callback */
	bool kick;                 /* CQ went non-empty: ring complete_efd before sleeping */

	/* verdicts that did not fit in the CQ, in order */
	struct proto_cqe *ovf;
	uint32_t ovf_head, ovf_n, ovf_cap;

	struct pool_htab pages;    /* page -> struct pool_cand */
	struct pool_refmap refmap; /* references held, by page */
	struct pool_alloc_hint hint;
	struct pool_counters cnt;
	struct pool_client *prev, *next;
};

/* struct pool - the daemon */
struct pool {
	struct pool_conf conf;
	struct ev_loop *loop;
	int listen_fd, signal_fd;
	struct pool_store store;
	struct pool_htab index;        /* (domain, hash) -> struct pool_entry */
	struct pool_domain *domains;
	uint32_t next_domain_id;
	struct pool_client *clients;   /* every connection, HELLO'd or not */
	uint32_t next_client_id;
	uint32_t nhello;               /* HELLO'd and still connected */
	struct pool_counters cnt;
	uint64_t lat_sum_ns, lat_n;    /* merge latency: dup found -> MAPs posted */
	uint64_t merges_last, merges_per_sec;
	uint64_t start_ns;
	uint64_t ticks;                /* 1 s timer runs */
};

/* index.c: the merge path */
int pool_index__init(struct pool *p);
void pool_index__fini(struct pool *p);
void pool_index__offer(struct pool *p, struct pool_client *c, const struct proto_sqe *e);
void pool_index__upload(struct pool *p, struct pool_client *c, const struct proto_sqe *e);
void pool_index__drop(struct pool *p, struct pool_client *c, const struct proto_sqe *e);
void pool_index__forget(struct pool *p, struct pool_client *c, uint64_t page);
void pool_index__zero(struct pool *p, struct pool_client *c, uint64_t page);
/* Socket gone: forget candidates (they cannot upload), keep references. */
void pool_index__detach(struct pool *p, struct pool_client *c);
/* Re-ask uploads that got no answer for a while (run every few seconds). */
void pool_index__expire(struct pool *p);
/* Process gone: release every reference. */
void pool_index__release(struct pool *p, struct pool_client *c);

/* ring.c: the shared rings */
int pool_ring__create(struct pool_client *c);
void pool_ring__destroy(struct pool_client *c);
/* Queue a verdict for @c (CQ, else overflow list). */
void pool_ring__post(struct pool_client *c, uint64_t page, uint32_t verdict, uint32_t seg,
		     uint32_t slot, uint32_t staging, uint32_t op);
/* Serve up to the fairness cap of SQEs; returns true if more are left. */
bool pool_ring__serve(struct pool_client *c);
/* Ring the complete eventfd if this batch made the CQ non-empty. */
void pool_ring__kick(struct pool_client *c);
/* Move overflowed verdicts into the CQ where there is room. */
void pool_ring__flush(struct pool_client *c);

/* client.c: control connections */
int pool_client__listen(struct pool *p);
void pool_client__detach(struct pool_client *c, const char *why);
void pool_client__free_all(struct pool *p);
bool pool_client__idle(struct ev_loop *loop, void *data);

/* stat.c: statistics */
char *pool_stat__json(struct pool *p, bool audit);
int pool_stat__cli(int argc, char **argv);

#endif
