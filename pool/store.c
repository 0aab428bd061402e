/* store.c: sealed memfd segments holding canonical pages, and slot allocation. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"
#include "pool.h"

/*
 * A segment is sized once, mapped read-write here and then sealed, so that
 * clients (which map it MAP_PRIVATE) can never write it: F_SEAL_FUTURE_WRITE
 * keeps our existing writable mapping but refuses every new writable one.
 * The seals also refuse hole punching, so a free slot keeps its memory until
 * it is reused or the whole segment is closed. Slots below @fresh have been
 * touched; the freemap tracks which of those are free again.
 */

int pool_store__init(struct pool_store *s, uint64_t seg_size, uint64_t limit)
{
	memset(s, 0, sizeof(*s));
	s->seg_pages = (uint32_t)(seg_size / PROTO_PAGE_SIZE);
	s->limit = limit;
	return 0;
}

static void pool_seg_close(struct pool_store *s, struct pool_seg *sg)
{
	size_t words = (s->seg_pages + 63) / 64;

	s->bytes -= (uint64_t)sg->fresh * PROTO_PAGE_SIZE;
	s->open_segs--;
	s->segs[sg->id] = NULL;
	munmap(sg->map, (size_t)s->seg_pages * PROTO_PAGE_SIZE);
	close(sg->fd);
	pool_mem__free(sg->freemap, words * 8);
	pool_mem__free(sg->owner, sizeof(*sg->owner) * s->seg_pages);
	pool_mem__free(sg, sizeof(*sg));
}

void pool_store__fini(struct pool_store *s)
{
	for (uint32_t i = 0; i < s->nsegs; i++)
		if (s->segs[i])
			pool_seg_close(s, s->segs[i]);
	pool_mem__free(s->segs, sizeof(*s->segs) * s->nsegs);
	s->segs = NULL;
}

struct pool_seg *pool_store__seg(struct pool_store *s, uint32_t seg)
{
	return seg < s->nsegs ? s->segs[seg] : NULL;
}

static int pool_seg_memfd(struct pool_store *s, uint32_t id, uint8_t **map)
{
	size_t size = (size_t)s->seg_pages * PROTO_PAGE_SIZE;
	char name[32];
	int fd, ret;

	snprintf(name, sizeof(name), "pvisor-seg-%u", id);
	fd = memfd_create(name, MFD_ALLOW_SEALING | MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0)
		goto err;
	*map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (*map == MAP_FAILED)
		goto err;
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW |
		  F_SEAL_SEAL) < 0) {
		ret = -errno;
		munmap(*map, size);
		close(fd);
		return ret;
	}
	return fd;
err:
	ret = -errno;
	close(fd);
	return ret;
}

static struct pool_seg *pool_seg_open(struct pool_store *s)
{
	size_t words = (s->seg_pages + 63) / 64;
	struct pool_seg **segs, *sg;
	int fd;

	segs = pool_mem__alloc(sizeof(*segs) * (s->nsegs + 1));
	sg = pool_mem__alloc(sizeof(*sg));
	if (!segs || !sg)
		goto err;
	sg->freemap = pool_mem__alloc(words * 8);
	sg->owner = pool_mem__alloc(sizeof(*sg->owner) * s->seg_pages);
	if (!sg->freemap || !sg->owner)
		goto err;
	fd = pool_seg_memfd(s, s->nsegs, &sg->map);
	if (fd < 0) {
		log_err("cannot create store segment: %s", strerror(-fd));
		goto err;
	}
	sg->fd = fd;
	sg->id = s->nsegs;
	if (s->segs)
		memcpy(segs, s->segs, sizeof(*segs) * s->nsegs);
	pool_mem__free(s->segs, sizeof(*s->segs) * s->nsegs);
	s->segs = segs;
	s->segs[s->nsegs++] = sg;
	s->open_segs++;
	log_debug("store: segment %u open (%u pages)", sg->id, s->seg_pages);
	return sg;
err:
	if (sg) {
		pool_mem__free(sg->freemap, words * 8);
		pool_mem__free(sg->owner, sizeof(*sg->owner) * s->seg_pages);
	}
	pool_mem__free(sg, sizeof(*sg));
	pool_mem__free(segs, sizeof(*segs) * (s->nsegs + 1));
	return NULL;
}

static bool pool_seg_is_free(struct pool_seg *sg, uint32_t slot)
{
	return sg->freemap[slot / 64] & (1ull << (slot % 64));
}

/*
 * Fault fresh slots in ahead of use, a chunk per call: a first-touch fault on
 * shared memory costs microseconds each, one MADV_POPULATE_WRITE far less.
 */
#define POOL_POPULATE_PAGES 64

static void pool_seg_populate(struct pool_store *s, struct pool_seg *sg, uint32_t slot)
{
	uint32_t n = s->seg_pages - slot < POOL_POPULATE_PAGES ? s->seg_pages - slot :
		     POOL_POPULATE_PAGES;

	if (madvise(sg->map + (uint64_t)slot * PROTO_PAGE_SIZE, (size_t)n * PROTO_PAGE_SIZE,
		    MADV_POPULATE_WRITE) < 0)
		log_debug("store: populate segment %u: %s", sg->id, strerror(errno));
}

/* Take @slot of @sg if it is free or the first fresh one. */
static bool pool_seg_take(struct pool_store *s, struct pool_seg *sg, uint32_t slot)
{
	if (slot >= s->seg_pages)
		return false;
	if (slot < sg->fresh && pool_seg_is_free(sg, slot)) {
		sg->freemap[slot / 64] &= ~(1ull << (slot % 64));
		sg->nfree--;
	} else if (slot == sg->fresh && s->bytes + PROTO_PAGE_SIZE <= s->limit) {
		if (!(slot % POOL_POPULATE_PAGES))
			pool_seg_populate(s, sg, slot);
		sg->fresh++;
		s->bytes += PROTO_PAGE_SIZE;
	} else {
		return false;
	}
	sg->used++;
	s->live++;
	return true;
}

static bool pool_seg_take_any(struct pool_store *s, struct pool_seg *sg, uint32_t *slot)
{
	if (sg->nfree) {
		for (uint32_t w = 0; w < (s->seg_pages + 63) / 64; w++) {
			if (sg->freemap[w]) {
				*slot = w * 64 + (uint32_t)__builtin_ctzll(sg->freemap[w]);
				return pool_seg_take(s, sg, *slot);
			}
		}
	}
	*slot = sg->fresh;
	return pool_seg_take(s, sg, *slot);
}

bool pool_store__has_room(struct pool_store *s)
{
	if (s->bytes + PROTO_PAGE_SIZE <= s->limit)
		return true;
	for (uint32_t i = 0; i < s->nsegs; i++)
		if (s->segs[i] && s->segs[i]->nfree)
			return true;
	return false;
}

/*
 * Slot choice, in order: the slot after this client's last upload when the
 * page follows its last page (so the client maps the run with one mmap),
 * then a recycled slot (its memory is already paid for), then fresh slots of
 * the newest segment, then a new segment.
 */
int pool_store__alloc(struct pool_store *s, struct pool_alloc_hint *hint, uint64_t page,
		      uint32_t *seg, uint32_t *slot)
{
	struct pool_seg *sg;

	if (hint && hint->valid && page == hint->page + 1) {
		sg = pool_store__seg(s, hint->seg);
		if (sg && pool_seg_take(s, sg, hint->slot + 1)) {
			*seg = sg->id;
			*slot = hint->slot + 1;
			goto out;
		}
	}
	for (uint32_t i = 0; i < s->nsegs; i++) {
		sg = s->segs[i];
		if (sg && sg->nfree && pool_seg_take_any(s, sg, slot)) {
			*seg = sg->id;
			goto out;
		}
	}
	sg = s->nsegs ? s->segs[s->nsegs - 1] : NULL;
	if (!sg || sg->fresh >= s->seg_pages) {
		if (s->bytes + PROTO_PAGE_SIZE > s->limit)
			return -ENOSPC;
		sg = pool_seg_open(s);
		if (!sg)
			return -ENOMEM;
	}
	if (!pool_seg_take_any(s, sg, slot))
		return -ENOSPC;
	*seg = sg->id;
out:
	if (hint) {
		hint->page = page;
		hint->seg = *seg;
		hint->slot = *slot;
		hint->valid = true;
	}
	return 0;
}

/* The slot's count reached zero: recycle it, close the segment if it emptied. */
void pool_store__free(struct pool_store *s, uint32_t seg, uint32_t slot)
{
	struct pool_seg *sg = pool_store__seg(s, seg);

	if (!sg || slot >= sg->fresh || pool_seg_is_free(sg, slot))
		return;
	sg->owner[slot] = NULL;
	sg->freemap[slot / 64] |= 1ull << (slot % 64);
	sg->nfree++;
	sg->used--;
	s->live--;
}

/*
 * Once a second: close segments that stayed empty for a whole tick. Not at
 * once, so that a burst of frees followed by new uploads reuses memory that
 * is already faulted in; the newest segment stays, fresh slots come from it.
 */
void pool_store__reap(struct pool_store *s)
{
	for (uint32_t i = 0; i + 1 < s->nsegs; i++) {
		struct pool_seg *sg = s->segs[i];

		if (!sg)
			continue;
		if (sg->used)
			sg->empty_ticks = 0;
		else if (sg->empty_ticks++ >= 1)
			pool_seg_close(s, sg);
	}
}
