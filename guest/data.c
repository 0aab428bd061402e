/* data.c: pvisor-guest's memory: the workload region, loaded files and their digests. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* xxHash compiled into this file: the agent is static and needs no libxxhash at run time. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "pvg.h"

#define PVG_PAGE 4096ull
/* One read(2) of a load: large enough that virtio-blk sees big requests. */
#define PVG_READ_CHUNK (4ull << 20)
/* Capacity for a file whose size fstat/BLKGETSIZE64 cannot tell (pipes, odd devices). */
#define PVG_LOAD_GUESS (16ull << 20)

static void *pvg_map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

int pvg_data__map(struct pvg_data *d, uint64_t pages)
{
	memset(d, 0, sizeof(*d));
	d->kind = WL_ZEROS;
	if (!pages)
		return 0;
	d->base = pvg_map(pages * PVG_PAGE);
	if (!d->base)
		return -errno;
	d->pages = pages;
	return 0;
}

void pvg_data__unmap(struct pvg_data *d)
{
	if (d->base)
		munmap(d->base, d->pages * PVG_PAGE);
	memset(d, 0, sizeof(*d));
}

void pvg_data__fill(struct pvg_data *d, int kind, uint64_t seed, uint64_t instance)
{
	for (uint64_t i = 0; i < d->pages; i++)
		wl_page(kind, seed, instance, i, d->base + i * PVG_PAGE);
	d->kind = kind;
	d->seed = seed;
	d->instance = instance;
}

uint64_t pvg_data__verify(const struct pvg_data *d, uint64_t *first_bad)
{
	static uint8_t want[PVG_PAGE] __attribute__((aligned(64)));
	uint64_t bad = 0;

	*first_bad = 0;
	for (uint64_t i = 0; i < d->pages; i++) {
		wl_page(d->kind, d->seed, d->instance, i, want);
		if (!memcmp(d->base + i * PVG_PAGE, want, PVG_PAGE))
			continue;
		if (!bad)
			*first_bad = i;
		bad++;
	}
	return bad;
}

/* Bytes the file holds if fstat or the block layer can tell; 0 if unknown. */
static uint64_t pvg_file_size(int fd, bool *is_blk)
{
	struct stat st;
	uint64_t sz = 0;

	*is_blk = false;
	if (fstat(fd, &st))
		return 0;
	if (S_ISREG(st.st_mode))
		return (uint64_t)st.st_size;
	if (S_ISBLK(st.st_mode) && !ioctl(fd, BLKGETSIZE64, &sz)) {
		*is_blk = true;
		return sz;
	}
	return 0;
}

/* Double the mapping (moving it if needed); 0 or -errno. */
static int pvg_file_grow(struct pvg_file *f)
{
	size_t len = f->map_len * 2;
	void *p;

	if (len > PVG_SIZE_MAX)
		return -EFBIG;
	p = mremap(f->base, f->map_len, len, MREMAP_MAYMOVE);
	if (p == MAP_FAILED)
		return -errno;
	f->base = p;
	f->map_len = len;
	return 0;
}

/* read(2) until EOF into f->base, growing it if the file is longer than expected. */
static int pvg_file_read_all(struct pvg_file *f, int fd)
{
	for (;;) {
		size_t room = f->map_len - f->bytes;
		ssize_t n;
		int ret;

		if (!room) {
			ret = pvg_file_grow(f);
			if (ret)
				return ret;
			continue;
		}
		n = read(fd, f->base + f->bytes, room < PVG_READ_CHUNK ? room : PVG_READ_CHUNK);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EINVAL && f->direct && !fcntl(fd, F_SETFL, 0)) {
			f->direct = false;   /* the device refuses O_DIRECT: go buffered */
			continue;
		}
		if (n < 0)
			return -errno;
		if (!n)
			return 0;
		f->bytes += (uint64_t)n;
	}
}

/*
 * Block devices are read with O_DIRECT so that virtio-blk puts the data
 * straight into this page-aligned memory (the guest pages the VMM's file-read
 * hints point at), not into the page cache first. The mapping has one spare
 * page so that the read that sees EOF never needs to grow it.
 */
int pvg_file__load(struct pvg_file *f, const char *path)
{
	uint64_t size;
	bool is_blk;
	int fd, ret;

	pvg_file__free(f);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size = pvg_file_size(fd, &is_blk);
	if (size > PVG_SIZE_MAX) {
		ret = -EFBIG;
		goto out_close;
	}
	if (is_blk && size % 512 == 0 && fcntl(fd, F_SETFL, O_DIRECT) == 0)
		f->direct = true;
	f->map_len = (size ? (size + PVG_PAGE - 1) / PVG_PAGE * PVG_PAGE : PVG_LOAD_GUESS) +
		     PVG_PAGE;
	f->base = pvg_map(f->map_len);
	if (!f->base) {
		ret = -errno;
		f->map_len = 0;
		goto out_close;
	}
	ret = pvg_file_read_all(f, fd);
	if (ret)
		pvg_file__free(f);
out_close:
	close(fd);
	return ret;
}

void pvg_file__free(struct pvg_file *f)
{
	if (f->base)
		munmap(f->base, f->map_len);
	memset(f, 0, sizeof(*f));
}

void pvg_digest(const void *buf, size_t len, char hex[17])
{
	snprintf(hex, 17, "%016llx", (unsigned long long)XXH3_64bits(buf, len));
}

static void pvg_hex128(XXH128_hash_t h, char hex[33])
{
	snprintf(hex, 33, "%016llx%016llx", (unsigned long long)h.high64,
		 (unsigned long long)h.low64);
}

void pvg_digest128(const void *buf, size_t len, char hex[33])
{
	pvg_hex128(XXH3_128bits(buf, len), hex);
}

void pvg_workload_digests(int kind, uint64_t seed, uint64_t instance, uint64_t pages,
			  char hex[17], char hex128[33])
{
	static uint8_t page[PVG_PAGE] __attribute__((aligned(64)));
	XXH3_state_t s64, s128;

	XXH3_64bits_reset(&s64);
	XXH3_128bits_reset(&s128);
	for (uint64_t i = 0; i < pages; i++) {
		wl_page(kind, seed, instance, i, page);
		XXH3_64bits_update(&s64, page, PVG_PAGE);
		XXH3_128bits_update(&s128, page, PVG_PAGE);
	}
	snprintf(hex, 17, "%016llx", (unsigned long long)XXH3_64bits_digest(&s64));
	pvg_hex128(XXH3_128bits_digest(&s128), hex128);
}
