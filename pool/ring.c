/* ring.c: a client's shared rings: copy SQEs out, validate, dispatch, post CQEs. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"
#include "pool.h"
#include "util.h"

/*
 * The ring memfd is shared with the client, which may write any byte of it
 * at any time. The pool therefore keeps its own copies of the indices it
 * owns (sq_head, cq_tail) and of the ring shape, reads the client's indices
 * once per use, and copies each SQE into its own memory before looking at it.
 */

#define POOL_RING_BUDGET 1024           /* SQEs per client per loop turn */
#define POOL_OVF_MAX     (64u * 1024)   /* queued verdicts before we give up on a client */

int pool_ring__create(struct pool_client *c)
{
	uint64_t size = proto_ring_size(PROTO_SQ_ENTRIES, PROTO_CQ_ENTRIES, PROTO_STAGING_SLOTS);
	struct proto_ring_hdr *h;
	int ret;

	c->ring_fd = memfd_create("pvisor-ring", MFD_CLOEXEC);
	if (c->ring_fd < 0)
		return -errno;
	if (ftruncate(c->ring_fd, (off_t)size) < 0)
		goto err;
	c->ring = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, c->ring_fd, 0);
	if (c->ring == MAP_FAILED) {
		c->ring = NULL;
		goto err;
	}
	c->ring_size = size;
	c->submit_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	c->complete_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (c->submit_efd < 0 || c->complete_efd < 0)
		goto err;
	c->sq_entries = PROTO_SQ_ENTRIES;
	c->cq_entries = PROTO_CQ_ENTRIES;
	c->staging_slots = PROTO_STAGING_SLOTS;
	h = (struct proto_ring_hdr *)c->ring;
	h->magic = PROTO_RING_MAGIC;
	h->version = PROTO_VERSION;
	h->sq_entries = c->sq_entries;
	h->cq_entries = c->cq_entries;
	h->staging_slots = c->staging_slots;
	h->sq_off = proto_ring_sq_off();
	h->cq_off = proto_ring_cq_off(c->sq_entries);
	h->staging_off = proto_ring_staging_off(c->sq_entries, c->cq_entries);
	h->size = size;
	c->sq_idx = (struct proto_ring_idx *)(c->ring + h->sq_off);
	c->sqes = (struct proto_sqe *)(c->sq_idx + 1);
	c->cq_idx = (struct proto_ring_idx *)(c->ring + h->cq_off);
	c->cqes = (struct proto_cqe *)(c->cq_idx + 1);
	c->staging = c->ring + h->staging_off;
	return 0;
err:
	ret = -errno;
	pool_ring__destroy(c);
	return ret;
}

void pool_ring__destroy(struct pool_client *c)
{
	if (c->ring)
		munmap(c->ring, c->ring_size);
	c->ring = NULL;
	if (c->ring_fd >= 0)
		close(c->ring_fd);
	if (c->submit_efd >= 0)
		close(c->submit_efd);
	if (c->complete_efd >= 0)
		close(c->complete_efd);
	c->ring_fd = c->submit_efd = c->complete_efd = -1;
	free(c->ovf);
	pool_meta_bytes -= (uint64_t)c->ovf_cap * sizeof(*c->ovf);
	c->ovf = NULL;
	c->ovf_cap = c->ovf_n = c->ovf_head = 0;
}

static void pool_ring_kill(struct pool_client *c, const char *why)
{
	if (!c->dead)
		log_warn("client %u (pid %d): %s; disconnecting it", c->id, (int)c->pid, why);
	c->dead = true;
}

/* Free CQ entries, or -1 if the client's head is impossible. */
static int64_t pool_ring_cq_room(struct pool_client *c)
{
	uint32_t head = proto_load_acquire(&c->cq_idx->head);
	uint32_t used = c->cq_tail - head;

	if (used > c->cq_entries) {
		pool_ring_kill(c, "completion ring head out of range");
		return -1;
	}
	return c->cq_entries - used;
}

static void pool_ring_kick(struct pool_client *c)
{
	uint64_t one = 1;

	if (write(c->complete_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_debug("client %u: complete eventfd: %s", c->id, strerror(errno));
}

/*
 * Write @n verdicts into the CQ; the caller checked there is room. The CQ was
 * empty, and the client may be asleep, if its head equals our old tail after
 * we published the new tail (store tail, full fence, load head; the client
 * stores head, fences and reloads tail before it sleeps).
 */
static void pool_ring_put(struct pool_client *c, const struct proto_cqe *v, uint32_t n,
			  bool *was_empty)
{
	uint32_t old = c->cq_tail;

	for (uint32_t i = 0; i < n; i++)
		c->cqes[(c->cq_tail + i) & (c->cq_entries - 1)] = v[i];
	c->cq_tail += n;
	proto_store_release(&c->cq_idx->tail, c->cq_tail);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (proto_load_acquire(&c->cq_idx->head) == old)
		*was_empty = true;
}

static int pool_ring_ovf_push(struct pool_client *c, const struct proto_cqe *v)
{
	if (c->ovf_n == c->ovf_cap) {
		uint32_t old = c->ovf_cap;

		if ((old ? old * 2 : 256) > POOL_OVF_MAX)
			return -ENOSPC;
		if (util_fifo_grow((void **)&c->ovf, &c->ovf_cap, &c->ovf_head, c->ovf_n,
				   sizeof(*c->ovf), 256))
			return -ENOMEM;
		pool_meta_bytes += (uint64_t)(c->ovf_cap - old) * sizeof(*c->ovf);
	}
	c->ovf[(c->ovf_head + c->ovf_n) % c->ovf_cap] = *v;
	c->ovf_n++;
	return 0;
}

void pool_ring__flush(struct pool_client *c)
{
	bool was_empty = false;

	if (!c->ring || c->dead)
		return;
	while (c->ovf_n) {
		int64_t room = pool_ring_cq_room(c);

		if (room <= 0)
			break;
		pool_ring_put(c, &c->ovf[c->ovf_head], 1, &was_empty);
		c->ovf_head = (c->ovf_head + 1) % c->ovf_cap;
		c->ovf_n--;
	}
	if (!c->ovf_n && c->ovf_cap > 256) {
		/* A burst is over: give its backlog's memory back. */
		free(c->ovf);
		pool_meta_bytes -= (uint64_t)c->ovf_cap * sizeof(*c->ovf);
		c->ovf = NULL;
		c->ovf_cap = c->ovf_head = 0;
	}
	if (was_empty)
		c->kick = true;
}

void pool_ring__kick(struct pool_client *c)
{
	if (c->kick && c->ring && !c->dead)
		pool_ring_kick(c);
	c->kick = false;
}

static void pool_ring_count(struct pool *p, struct pool_client *c, uint32_t verdict)
{
	uint64_t *g = NULL, *d = NULL, *mine = NULL;

	switch (verdict) {
	case PROTO_V_MAP:
		g = &p->cnt.merges, d = &c->dom->cnt.merges, mine = &c->cnt.merges;
		break;
	case PROTO_V_EINVAL:
		g = &p->cnt.errors, d = &c->dom->cnt.errors, mine = &c->cnt.errors;
		break;
	case PROTO_V_NOSPACE:
		g = &p->cnt.nospace, d = &c->dom->cnt.nospace, mine = &c->cnt.nospace;
		break;
	default:
		return;
	}
	(*g)++;
	(*d)++;
	(*mine)++;
}

void pool_ring__post(struct pool_client *c, uint64_t page, uint32_t verdict, uint32_t seg,
		     uint32_t slot, uint32_t staging, uint32_t op)
{
	struct proto_cqe v = { .page = page, .verdict = verdict, .seg = seg, .slot = slot,
			       .staging = staging, .op = op };
	bool was_empty = false;
	int64_t room;

	if (!c->ring || c->dead)
		return; /* detached: a MAP's reference stays until the process exits */
	pool_ring_count(c->p, c, verdict);
	room = c->ovf_n ? 0 : pool_ring_cq_room(c);
	if (room < 0)
		return;
	if (room == 0) {
		if (pool_ring_ovf_push(c, &v))
			pool_ring_kill(c, "does not consume its completion ring");
		return;
	}
	pool_ring_put(c, &v, 1, &was_empty);
	/* One doorbell per batch, rung before the loop sleeps (pool_client__idle). */
	if (was_empty)
		c->kick = true;
}

static void pool_ring_einval(struct pool_client *c, const struct proto_sqe *q)
{
	uint32_t staging = q->op == PROTO_OP_UPLOAD && q->staging < c->staging_slots ?
			   q->staging : PROTO_NO_STAGING;

	pool_ring__post(c, q->page, PROTO_V_EINVAL, q->seg, q->slot, staging, q->op);
}

/* One SQE, already copied into pool memory. */
static void pool_ring_exec(struct pool_client *c, const struct proto_sqe *q)
{
	struct pool *p = c->p;

	if (q->op < PROTO_OP_OFFER || q->op > PROTO_OP_ZERO || (q->flags & ~PROTO_SQE_FILE_READ) ||
	    q->page >= c->guest_pages ||
	    (q->op == PROTO_OP_UPLOAD && q->staging >= c->staging_slots) ||
	    (q->op == PROTO_OP_DROP && !pool_store__seg(&p->store, q->seg))) {
		pool_ring_einval(c, q);
		return;
	}
	switch (q->op) {
	case PROTO_OP_OFFER:
		pool_index__offer(p, c, q);
		break;
	case PROTO_OP_UPLOAD:
		pool_index__upload(p, c, q);
		break;
	case PROTO_OP_DROP:
		pool_index__drop(p, c, q);
		break;
	case PROTO_OP_FORGET:
		pool_index__forget(p, c, q->page);
		break;
	case PROTO_OP_ZERO:
		pool_index__zero(p, c, q->page);
		break;
	}
}

bool pool_ring__serve(struct pool_client *c)
{
	uint32_t tail, n = 0;

	if (!c->ring || c->dead)
		return false;
	pool_ring__flush(c);
	tail = proto_load_acquire(&c->sq_idx->tail);
	if (tail - c->sq_head > c->sq_entries) {
		pool_ring_kill(c, "submission ring tail out of range");
		return false;
	}
	while (c->sq_head != tail && n < POOL_RING_BUDGET && !c->dead) {
		struct proto_sqe q;

		memcpy(&q, &c->sqes[c->sq_head & (c->sq_entries - 1)], sizeof(q));
		/* From here on only the copy counts, even if the client rewrites the slot. */
		__asm__ volatile("" ::: "memory");
		c->sq_head++;
		n++;
		pool_ring_exec(c, &q);
	}
	if (c->dead)
		return false;
	proto_store_release(&c->sq_idx->head, c->sq_head);
	/*
	 * A client that saw our old head skipped the doorbell. Store head, full
	 * fence, load tail: with the client doing store tail, fence, load head,
	 * one of the two always sees the other's entry (Dekker).
	 */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	tail = proto_load_acquire(&c->sq_idx->tail);
	return tail != c->sq_head;
}
