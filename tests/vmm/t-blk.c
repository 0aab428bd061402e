/* t-blk.c: virtio-blk over virtio-mmio, with the test playing the guest driver (no KVM). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <linux/virtio_blk.h>
#include <linux/virtio_config.h>
#include <linux/virtio_mmio.h>
#include <linux/virtio_ring.h>

#include "blk.h"
#include "log.h"
#include "mem.h"

/*
 * Guest RAM is 16 MiB with dedup off. A shadow copy holds what RAM must
 * contain: the test writes both, and copies into the shadow only the bytes
 * the device is expected to write (data read, status bytes, used ring). Every
 * check compares all 16 MiB, so a device write anywhere else is caught.
 */

#define T_PASS 0
#define T_FAIL 1
#define T_SKIP 77

#define T_RAM      (16ull << 20)
#define T_DISK     (4ull << 20)        /* backing file bytes */
#define T_Q        256u                /* QueueNum */
#define T_DESC     0x10000ull          /* descriptor table (16 * 256) */
#define T_AVAIL    0x11000ull
#define T_USED     0x12000ull
#define T_HDR      0x20000ull          /* request headers, 16 bytes each */
#define T_STATUS   0x30000ull          /* status bytes, 1 each */
#define T_DATA     0x100000ull         /* data buffers from here */

#define T_CHECK(cond, ...) do { if (!(cond)) { printf("FAIL %s:%d: ", __func__, __LINE__); \
	printf(__VA_ARGS__); printf("\n"); return T_FAIL; } } while (0)
#define T_RUN(call) do { if ((call) != T_PASS) return T_FAIL; } while (0)

/* struct t_drv - the fake guest: its RAM, the device, and the driver's ring state */
struct t_drv {
	struct vmm_mem *mem;
	uint8_t *ram;           /* hva of gpa 0 */
	uint8_t *shadow;        /* expected contents of all guest RAM */
	struct vmm_blk *blk;
	uint16_t avail_idx;     /* next avail slot (driver side) */
	uint16_t used_seen;     /* used elements consumed */
	uint16_t next_desc;     /* next free descriptor (reset per batch) */
	unsigned nreq;          /* requests in this batch */
	int irq_level;          /* atomic: line level from set_irq */
	int irq_raised;         /* atomic: times the line went up */
};

/* struct t_req - one request the test builds */
struct t_req {
	uint16_t head;
	uint32_t type;
	uint64_t sector;
	gpa_t status;
	uint8_t want_status;
	uint32_t want_used;     /* used length the device must report */
};

static uint8_t *t_file_bytes;  /* what the backing file holds */
static char t_path[64];

static void t_set_irq(void *opaque, uint32_t gsi, int level)
{
	struct t_drv *d = opaque;

	if (gsi != 9)
		abort();
	if (level && !__atomic_exchange_n(&d->irq_level, 1, __ATOMIC_SEQ_CST))
		__atomic_add_fetch(&d->irq_raised, 1, __ATOMIC_SEQ_CST);
	if (!level)
		__atomic_store_n(&d->irq_level, 0, __ATOMIC_SEQ_CST);
}

static uint32_t t_r32(struct t_drv *d, uint64_t off)
{
	uint32_t v;

	vmm_blk__mmio(d->blk, off, (uint8_t *)&v, 4, false);
	return v;
}

static void t_w32(struct t_drv *d, uint64_t off, uint32_t v)
{
	vmm_blk__mmio(d->blk, off, (uint8_t *)&v, 4, true);
}

/* A driver write into guest RAM: RAM and shadow both. */
static void t_gw(struct t_drv *d, uint64_t gpa, const void *src, size_t len)
{
	memcpy(d->ram + gpa, src, len);
	memcpy(d->shadow + gpa, src, len);
}

/* The device is allowed to have written [gpa, gpa+len): accept it into the shadow. */
static void t_accept(struct t_drv *d, uint64_t gpa, size_t len)
{
	memcpy(d->shadow + gpa, d->ram + gpa, len);
}

static int t_ram_unchanged(struct t_drv *d, const char *when)
{
	for (uint64_t i = 0; i < T_RAM; i++)
		T_CHECK(d->ram[i] == d->shadow[i], "%s: guest byte 0x%llx is 0x%02x, expected 0x%02x",
			when, (unsigned long long)i, d->ram[i], d->shadow[i]);
	return T_PASS;
}

static double t_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t t_rand(void)
{
	static uint64_t x = 0x9e3779b97f4a7c15ull;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return x;
}

static void t_fill_rand(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(t_rand() >> 24);
}

static uint64_t t_hinted(struct t_drv *d)
{
	struct vmm_mem_stats st;

	vmm_mem__stats(d->mem, &st);
	return st.pages_hinted;
}

/* Descriptor i := (addr, len, flags, next). */
static void t_desc(struct t_drv *d, uint16_t i, uint64_t addr, uint32_t len, uint16_t flags,
		   uint16_t next)
{
	struct vring_desc v = { .addr = addr, .len = len, .flags = flags, .next = next };

	t_gw(d, T_DESC + 16ull * i, &v, sizeof(v));
}

/* Append a descriptor to the chain being built; returns its index. */
static uint16_t t_add(struct t_drv *d, uint64_t addr, uint32_t len, bool write, bool more)
{
	uint16_t i = d->next_desc++;

	t_desc(d, i, addr, len, (write ? VRING_DESC_F_WRITE : 0) | (more ? VRING_DESC_F_NEXT : 0),
	       (uint16_t)(i + 1));
	return i;
}

/* Header descriptor of a new request (status byte preset to 0xee). */
static uint16_t t_hdr(struct t_drv *d, struct t_req *r, uint32_t type, uint64_t sector)
{
	struct virtio_blk_outhdr h = { .type = type, .sector = sector };
	uint64_t hgpa = T_HDR + 16ull * d->nreq;
	uint8_t ee = 0xee;

	r->type = type;
	r->sector = sector;
	r->status = GPA(T_STATUS + d->nreq);
	r->want_status = VIRTIO_BLK_S_OK;
	r->want_used = 1;
	t_gw(d, hgpa, &h, sizeof(h));
	t_gw(d, r->status.v, &ee, 1);
	d->nreq++;
	r->head = t_add(d, hgpa, sizeof(h), false, true);
	return r->head;
}

static void t_status_desc(struct t_drv *d, struct t_req *r)
{
	t_add(d, r->status.v, 1, true, false);
}

/* Put the heads on the avail ring, then notify. */
static void t_kick(struct t_drv *d, const uint16_t *heads, unsigned n)
{
	uint16_t idx;

	for (unsigned i = 0; i < n; i++) {
		t_gw(d, T_AVAIL + 4 + 2ull * (d->avail_idx % T_Q), &heads[i], 2);
		d->avail_idx++;
	}
	idx = d->avail_idx;
	__atomic_store_n((uint16_t *)(d->ram + T_AVAIL + 2), idx, __ATOMIC_RELEASE);
	memcpy(d->shadow + T_AVAIL + 2, &idx, 2);
	t_w32(d, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
}

/* Wait until the used index reaches `want` consumed elements. */
static int t_wait_used(struct t_drv *d, uint16_t want)
{
	uint16_t *used_idx = (uint16_t *)(d->ram + T_USED + 2);
	double end = t_now() + 10;

	/* acquire: the used elements and status bytes were written before the index */
	while (__atomic_load_n(used_idx, __ATOMIC_ACQUIRE) != want && t_now() < end)
		usleep(200);
	T_CHECK(__atomic_load_n(used_idx, __ATOMIC_ACQUIRE) == want, "used idx %u, expected %u",
		__atomic_load_n(used_idx, __ATOMIC_ACQUIRE), want);
	return T_PASS;
}

/* Interrupt raised; ISR bit 0; ACK lowers the line. */
static int t_ack(struct t_drv *d, uint32_t bits)
{
	uint32_t isr = t_r32(d, VIRTIO_MMIO_INTERRUPT_STATUS);

	T_CHECK(__atomic_load_n(&d->irq_level, __ATOMIC_SEQ_CST) == 1, "interrupt line not raised");
	T_CHECK((isr & bits) == bits, "InterruptStatus 0x%x, expected bits 0x%x", isr, bits);
	t_w32(d, VIRTIO_MMIO_INTERRUPT_ACK, isr);
	T_CHECK(t_r32(d, VIRTIO_MMIO_INTERRUPT_STATUS) == 0, "ISR not cleared by ACK");
	T_CHECK(__atomic_load_n(&d->irq_level, __ATOMIC_SEQ_CST) == 0, "line not lowered by ACK");
	return T_PASS;
}

/* Submit the batch, wait for all of it, check used elements and status bytes. */
static int t_run_batch(struct t_drv *d, struct t_req *r, unsigned n)
{
	uint16_t heads[T_Q];
	bool seen[T_Q] = { false };

	for (unsigned i = 0; i < n; i++)
		heads[i] = r[i].head;
	t_kick(d, heads, n);
	T_RUN(t_wait_used(d, (uint16_t)(d->used_seen + n)));
	for (unsigned k = 0; k < n; k++) {
		struct vring_used_elem e;
		unsigned i;

		memcpy(&e, d->ram + T_USED + 4 + 8ull * ((d->used_seen + k) % T_Q), sizeof(e));
		for (i = 0; i < n && (r[i].head != e.id || seen[i]); i++)
			;
		T_CHECK(i < n, "used element with unknown head %u", e.id);
		seen[i] = true;
		T_CHECK(e.len == r[i].want_used, "request %u (type %u): used len %u, expected %u",
			i, r[i].type, e.len, r[i].want_used);
		T_CHECK(d->ram[r[i].status.v] == r[i].want_status,
			"request %u (type %u sector %llu): status %u, expected %u", i, r[i].type,
			(unsigned long long)r[i].sector, d->ram[r[i].status.v], r[i].want_status);
		t_accept(d, r[i].status.v, 1);
	}
	d->used_seen = (uint16_t)(d->used_seen + n);
	t_accept(d, T_USED, 6 + 8ull * T_Q);
	T_RUN(t_ack(d, VIRTIO_MMIO_INT_VRING));
	d->next_desc = 0;
	d->nreq = 0;
	return T_PASS;
}

/* Read values to check the features word pair. */
static uint64_t t_features(struct t_drv *d)
{
	uint64_t f;

	t_w32(d, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
	f = (uint64_t)t_r32(d, VIRTIO_MMIO_DEVICE_FEATURES) << 32;
	t_w32(d, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
	return f | t_r32(d, VIRTIO_MMIO_DEVICE_FEATURES);
}

/* The virtio-mmio init sequence (spec 3.1.1 and 4.2.3). */
static int t_init(struct t_drv *d, bool ro)
{
	uint64_t want = (1ull << VIRTIO_F_VERSION_1) | (1ull << VIRTIO_BLK_F_SEG_MAX) |
			(1ull << VIRTIO_BLK_F_BLK_SIZE) | (1ull << VIRTIO_BLK_F_FLUSH);
	uint64_t f, cap = 0, zero = 0;
	uint32_t u;

	T_CHECK(t_r32(d, VIRTIO_MMIO_MAGIC_VALUE) == 0x74726976, "bad magic");
	T_CHECK(t_r32(d, VIRTIO_MMIO_VERSION) == 2, "version not 2");
	T_CHECK(t_r32(d, VIRTIO_MMIO_DEVICE_ID) == 2, "device id not 2 (block)");
	t_w32(d, VIRTIO_MMIO_STATUS, 0);
	T_CHECK(t_r32(d, VIRTIO_MMIO_STATUS) == 0, "status not 0 after reset");
	t_w32(d, VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
	t_w32(d, VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER);
	f = t_features(d);
	if (ro)
		want |= 1ull << VIRTIO_BLK_F_RO;
	T_CHECK(f == want, "device features 0x%llx, expected 0x%llx", (unsigned long long)f,
		(unsigned long long)want);
	t_w32(d, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
	t_w32(d, VIRTIO_MMIO_DRIVER_FEATURES, (uint32_t)f);
	t_w32(d, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
	t_w32(d, VIRTIO_MMIO_DRIVER_FEATURES, (uint32_t)(f >> 32));
	t_w32(d, VIRTIO_MMIO_STATUS, 0xb); /* ACK | DRIVER | FEATURES_OK */
	T_CHECK(t_r32(d, VIRTIO_MMIO_STATUS) == 0xb, "FEATURES_OK refused");
	/* config space: capacity as one 8-byte read and as two 4-byte reads */
	vmm_blk__mmio(d->blk, VIRTIO_MMIO_CONFIG, (uint8_t *)&cap, 8, false);
	T_CHECK(cap == T_DISK / 512, "capacity %llu sectors", (unsigned long long)cap);
	u = t_r32(d, VIRTIO_MMIO_CONFIG + 4);
	T_CHECK(u == 0, "capacity high half %u", u);
	T_CHECK(t_r32(d, VIRTIO_MMIO_CONFIG + 20) == 512, "blk_size not 512");
	u = t_r32(d, VIRTIO_MMIO_CONFIG + 12);
	T_CHECK(u >= 2 && u <= T_Q, "seg_max %u", u);
	/* queue 0 */
	t_w32(d, VIRTIO_MMIO_QUEUE_SEL, 0);
	T_CHECK(t_r32(d, VIRTIO_MMIO_QUEUE_READY) == 0, "queue ready before setup");
	T_CHECK(t_r32(d, VIRTIO_MMIO_QUEUE_NUM_MAX) == 256, "QueueNumMax not 256");
	t_gw(d, T_AVAIL, &zero, 8);
	t_gw(d, T_USED, &zero, 8);
	d->avail_idx = 0;
	d->used_seen = 0;
	d->next_desc = 0;
	d->nreq = 0;
	t_w32(d, VIRTIO_MMIO_QUEUE_NUM, T_Q);
	t_w32(d, VIRTIO_MMIO_QUEUE_DESC_LOW, (uint32_t)T_DESC);
	t_w32(d, VIRTIO_MMIO_QUEUE_DESC_HIGH, 0);
	t_w32(d, VIRTIO_MMIO_QUEUE_AVAIL_LOW, (uint32_t)T_AVAIL);
	t_w32(d, VIRTIO_MMIO_QUEUE_AVAIL_HIGH, 0);
	t_w32(d, VIRTIO_MMIO_QUEUE_USED_LOW, (uint32_t)T_USED);
	t_w32(d, VIRTIO_MMIO_QUEUE_USED_HIGH, 0);
	t_w32(d, VIRTIO_MMIO_QUEUE_READY, 1);
	T_CHECK(t_r32(d, VIRTIO_MMIO_QUEUE_READY) == 1, "queue not ready");
	t_w32(d, VIRTIO_MMIO_STATUS, 0xf);
	T_CHECK(t_r32(d, VIRTIO_MMIO_STATUS) == 0xf, "DRIVER_OK not kept");
	return T_PASS;
}

/* A read request whose data is split over `nseg` buffers at the given gpas/lengths. */
static void t_read(struct t_drv *d, struct t_req *r, uint64_t sector, const uint64_t *gpa,
		   const uint32_t *len, unsigned nseg, uint64_t *hint_pages)
{
	uint32_t total = 0;

	t_hdr(d, r, VIRTIO_BLK_T_IN, sector);
	for (unsigned i = 0; i < nseg; i++) {
		t_add(d, gpa[i], len[i], true, true);
		total += len[i];
		*hint_pages += (gpa[i] + len[i] - 1) / 4096 - gpa[i] / 4096 + 1;
	}
	t_status_desc(d, r);
	r->want_used = total + 1;
}

/* Data landed where it should: accept those bytes into the shadow after checking. */
static int t_check_read(struct t_drv *d, uint64_t sector, const uint64_t *gpa,
			const uint32_t *len, unsigned nseg)
{
	uint64_t off = sector * 512;

	for (unsigned i = 0; i < nseg; i++) {
		T_CHECK(!memcmp(d->ram + gpa[i], t_file_bytes + off, len[i]),
			"sector %llu segment %u: guest bytes differ from the file",
			(unsigned long long)sector, i);
		t_accept(d, gpa[i], len[i]);
		off += len[i];
	}
	return T_PASS;
}

/* Reads of several sizes and offsets, several at once, multi-descriptor chains. */
static int t_reads(struct t_drv *d)
{
	static const uint64_t g1[] = { T_DATA }, g2[] = { T_DATA + 0x10100, T_DATA + 0x11000,
		T_DATA + 0x13000 }, g4[] = { T_DATA + 0x40000 + 7 };
	static const uint32_t l1[] = { 512 }, l2[] = { 512, 4096, 3584 }, l4[] = { 1024 };
	uint64_t g3[16], hint_pages = 0, before = t_hinted(d);
	uint32_t l3[16];
	struct t_req r[4];
	int raised = d->irq_raised;

	for (unsigned i = 0; i < 16; i++) {
		g3[i] = T_DATA + 0x20000 + 4096ull * i;
		l3[i] = 4096;
	}
	t_read(d, &r[0], 0, g1, l1, 1, &hint_pages);
	t_read(d, &r[1], 7, g2, l2, 3, &hint_pages);
	t_read(d, &r[2], 100, g3, l3, 16, &hint_pages);
	t_read(d, &r[3], T_DISK / 512 - 2, g4, l4, 1, &hint_pages);  /* the last two sectors */
	T_RUN(t_run_batch(d, r, 4));
	T_CHECK(d->irq_raised > raised, "no interrupt for the reads");
	T_RUN(t_check_read(d, 0, g1, l1, 1));
	T_RUN(t_check_read(d, 7, g2, l2, 3));
	T_RUN(t_check_read(d, 100, g3, l3, 16));
	T_RUN(t_check_read(d, T_DISK / 512 - 2, g4, l4, 1));
	T_CHECK(t_hinted(d) - before == hint_pages, "pages_hinted grew by %llu, expected %llu",
		(unsigned long long)(t_hinted(d) - before), (unsigned long long)hint_pages);
	T_RUN(t_ram_unchanged(d, "after reads"));
	printf("ok: 4 reads (1..16 segments), %llu pages hinted\n", (unsigned long long)hint_pages);
	return T_PASS;
}

/* 64 single-page reads at scattered sectors in one batch (many in flight at once). */
static int t_many_reads(struct t_drv *d)
{
	struct t_req r[64];
	uint64_t g[64], sec[64], hints = 0;
	uint32_t l[64];

	for (unsigned i = 0; i < 64; i++) {
		g[i] = T_DATA + 0x100000 + 4096ull * i;
		l[i] = 4096;
		sec[i] = t_rand() % (T_DISK / 512 - 8);
		t_read(d, &r[i], sec[i], &g[i], &l[i], 1, &hints);
	}
	T_RUN(t_run_batch(d, r, 64));
	for (unsigned i = 0; i < 64; i++)
		T_RUN(t_check_read(d, sec[i], &g[i], &l[i], 1));
	T_RUN(t_ram_unchanged(d, "after 64 reads"));
	printf("ok: 64 concurrent reads\n");
	return T_PASS;
}

/* Bytes of the backing file at a sector, read with plain pread. */
static int t_file_range(uint8_t *dst, uint64_t sector, size_t len)
{
	int fd = open(t_path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? -1 : pread(fd, dst, len, (off_t)(sector * 512));

	if (fd >= 0)
		close(fd);
	T_CHECK(n == (ssize_t)len, "pread %s: %s", t_path, n < 0 ? strerror(errno) : "short");
	return T_PASS;
}

/* Write then read back; header+data and data+status sharing descriptors; FLUSH. */
static int t_write_read(struct t_drv *d)
{
	uint64_t gw = T_DATA + 0x200000, gr = T_DATA + 0x210000;
	uint8_t buf[8192], ee = 0xee, file[8192];
	struct virtio_blk_outhdr h = { .type = VIRTIO_BLK_T_OUT, .sector = 60 };
	struct t_req r[3];

	t_fill_rand(buf, sizeof(buf));
	t_gw(d, gw, buf, 4096);
	/* request 0: OUT sector 50, 4 KiB over three descriptors */
	t_hdr(d, &r[0], VIRTIO_BLK_T_OUT, 50);
	t_add(d, gw, 1024, false, true);
	t_add(d, gw + 1024, 2048, false, true);
	t_add(d, gw + 3072, 1024, false, true);
	t_status_desc(d, &r[0]);
	/* request 1: OUT sector 60, header and 4 KiB of data in one descriptor */
	t_gw(d, gw + 0x2000, &h, sizeof(h));
	t_gw(d, gw + 0x2000 + sizeof(h), buf + 4096, 4096);
	r[1] = (struct t_req){ .type = VIRTIO_BLK_T_OUT, .sector = 60, .status = GPA(T_STATUS + 200),
			       .want_used = 1 };
	t_gw(d, r[1].status.v, &ee, 1);
	r[1].head = t_add(d, gw + 0x2000, sizeof(h) + 4096, false, true);
	t_status_desc(d, &r[1]);
	/* request 2: FLUSH */
	t_hdr(d, &r[2], VIRTIO_BLK_T_FLUSH, 0);
	t_status_desc(d, &r[2]);
	T_RUN(t_run_batch(d, r, 3));
	T_RUN(t_file_range(file, 50, 4096));
	T_RUN(t_file_range(file + 4096, 60, 4096));
	T_CHECK(!memcmp(file, buf, 8192), "the file does not hold the bytes written");
	memcpy(t_file_bytes + 50 * 512, buf, 4096);
	memcpy(t_file_bytes + 60 * 512, buf + 4096, 4096);
	/* read sector 50 back, the data and the status byte sharing one descriptor */
	t_hdr(d, &r[0], VIRTIO_BLK_T_IN, 50);
	r[0].status = GPA(gr + 4096);
	r[0].want_used = 4097;
	t_gw(d, gr + 4096, &ee, 1);
	t_add(d, gr, 4097, true, false);
	T_RUN(t_run_batch(d, r, 1));
	T_CHECK(!memcmp(d->ram + gr, buf, 4096), "read back differs from what was written");
	t_accept(d, gr, 4097);
	T_RUN(t_ram_unchanged(d, "after write/read"));
	printf("ok: write, flush, read back (shared descriptors)\n");
	return T_PASS;
}

/* GET_ID, an unknown request type, and a notify for a queue that does not exist. */
static int t_misc(struct t_drv *d)
{
	uint64_t gid = T_DATA + 0x300000;
	const char *base = strrchr(t_path, '/') + 1;
	char want[VIRTIO_BLK_ID_BYTES] = { 0 };
	struct t_req r[2];

	t_w32(d, VIRTIO_MMIO_QUEUE_NOTIFY, 7);
	t_w32(d, VIRTIO_MMIO_QUEUE_NOTIFY, 0xffffffff);
	memcpy(want, base, strlen(base) < sizeof(want) ? strlen(base) : sizeof(want));
	t_hdr(d, &r[0], VIRTIO_BLK_T_GET_ID, 0);
	t_add(d, gid, VIRTIO_BLK_ID_BYTES, true, true);
	t_status_desc(d, &r[0]);
	r[0].want_used = VIRTIO_BLK_ID_BYTES + 1;
	t_hdr(d, &r[1], 99, 0);
	t_status_desc(d, &r[1]);
	r[1].want_status = VIRTIO_BLK_S_UNSUPP;
	T_RUN(t_run_batch(d, r, 2));
	T_CHECK(!memcmp(d->ram + gid, want, sizeof(want)), "GET_ID answered '%.20s', expected '%.20s'",
		(char *)d->ram + gid, want);
	t_accept(d, gid, VIRTIO_BLK_ID_BYTES);
	T_RUN(t_ram_unchanged(d, "after GET_ID"));
	printf("ok: GET_ID '%.20s', unknown type UNSUPP, bad QueueNotify ignored\n", want);
	return T_PASS;
}

/* Requests the device must answer with IOERR while staying alive; nothing else written. */
static int t_ioerr(struct t_drv *d)
{
	uint64_t g = T_DATA + 0x400000, before = t_hinted(d);
	struct t_req r[8];
	uint16_t h;

	/* 0: data buffer partly beyond guest RAM */
	t_hdr(d, &r[0], VIRTIO_BLK_T_IN, 0);
	t_add(d, T_RAM - 100, 4096, true, true);
	t_status_desc(d, &r[0]);
	/* 1: address + length wrap around 2^64 */
	t_hdr(d, &r[1], VIRTIO_BLK_T_IN, 0);
	t_add(d, 0xfffffffffffff000ull, 0x2000, true, true);
	t_status_desc(d, &r[1]);
	/* 2: read past the end of the disk (last sector + one more) */
	t_hdr(d, &r[2], VIRTIO_BLK_T_IN, T_DISK / 512 - 1);
	t_add(d, g, 1024, true, true);
	t_status_desc(d, &r[2]);
	/* 3: sector so large that sector * 512 overflows */
	t_hdr(d, &r[3], VIRTIO_BLK_T_IN, 1ull << 62);
	t_add(d, g + 0x1000, 512, true, true);
	t_status_desc(d, &r[3]);
	/* 4: length not a multiple of 512 */
	t_hdr(d, &r[4], VIRTIO_BLK_T_IN, 0);
	t_add(d, g + 0x2000, 100, true, true);
	t_status_desc(d, &r[4]);
	/* 5: header shorter than 16 bytes */
	h = t_hdr(d, &r[5], VIRTIO_BLK_T_IN, 0);
	t_desc(d, h, T_HDR + 16ull * 5, 8, VRING_DESC_F_NEXT, (uint16_t)(h + 1));
	t_add(d, g + 0x3000, 512, true, true);
	t_status_desc(d, &r[5]);
	/* 6: a readable descriptor after a writable one */
	t_hdr(d, &r[6], VIRTIO_BLK_T_IN, 0);
	t_add(d, g + 0x4000, 512, true, true);
	t_add(d, g + 0x5000, 512, false, true);
	t_status_desc(d, &r[6]);
	/* 7: the whole of guest RAM as one buffer: in RAM, but far past the disk's end */
	t_hdr(d, &r[7], VIRTIO_BLK_T_IN, 0);
	t_add(d, 0, (uint32_t)T_RAM, true, true);
	t_status_desc(d, &r[7]);
	for (unsigned i = 0; i < 8; i++)
		r[i].want_status = VIRTIO_BLK_S_IOERR;
	T_RUN(t_run_batch(d, r, 8));
	T_CHECK(t_hinted(d) == before, "failed reads hinted pages");
	T_RUN(t_ram_unchanged(d, "after refused requests"));
	T_CHECK(!(t_r32(d, VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET), "NEEDS_RESET set");
	printf("ok: 8 bad requests answered IOERR, guest RAM otherwise unchanged\n");
	return T_PASS;
}

/* Broken rings: each must end in DEVICE_NEEDS_RESET with no used element. */
enum t_broken { T_LOOP, T_HEAD_BEYOND, T_NEXT_BEYOND, T_AVAIL_JUMP, T_STATUS_RO, T_INDIRECT,
		T_TOO_LONG, T_NBROKEN };
static const char *const t_broken_name[] = { "descriptor loop", "head beyond QueueNum",
	"next beyond QueueNum", "avail index jump", "read-only status", "indirect descriptor",
	"chain of 200 descriptors" };

static void t_break(struct t_drv *d, enum t_broken how)
{
	uint64_t g = T_DATA + 0x500000;
	uint16_t head = 0, idx;
	struct t_req r;

	t_hdr(d, &r, VIRTIO_BLK_T_IN, 0);
	switch (how) {
	case T_LOOP:
		t_add(d, g, 512, true, true);
		t_desc(d, 1, g, 512, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 0);
		break;
	case T_HEAD_BEYOND:
		head = T_Q + 3;
		break;
	case T_NEXT_BEYOND:
		t_desc(d, 0, T_HDR, 16, VRING_DESC_F_NEXT, 300);
		break;
	case T_AVAIL_JUMP:
		t_add(d, g, 512, true, true);
		t_status_desc(d, &r);
		idx = (uint16_t)(d->avail_idx + T_Q + 1);
		t_gw(d, T_AVAIL + 2, &idx, 2);
		t_w32(d, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
		return;
	case T_STATUS_RO:
		t_add(d, g, 512, true, true);
		t_add(d, r.status.v, 1, false, false);
		break;
	case T_INDIRECT:
		t_desc(d, 0, g, 16, VRING_DESC_F_INDIRECT, 0);
		break;
	case T_TOO_LONG:
		for (unsigned i = 0; i < 199; i++)
			t_add(d, g + 512ull * i, 512, true, true);
		t_status_desc(d, &r);
		break;
	case T_NBROKEN:
		break;
	}
	t_kick(d, &head, 1);
}

static int t_wait_needs_reset(struct t_drv *d)
{
	double end = t_now() + 10;

	while (!(t_r32(d, VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET) && t_now() < end)
		usleep(200);
	T_CHECK(t_r32(d, VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET, "no NEEDS_RESET");
	return T_PASS;
}

static int t_broken_rings(struct t_drv *d)
{
	for (unsigned how = 0; how < T_NBROKEN; how++) {
		T_RUN(t_init(d, false));
		t_break(d, how);
		T_RUN(t_wait_needs_reset(d));
		T_RUN(t_ack(d, VIRTIO_MMIO_INT_CONFIG));
		usleep(10000);
		T_CHECK(__atomic_load_n((uint16_t *)(d->ram + T_USED + 2), __ATOMIC_ACQUIRE) == 0,
			"%s: a used element appeared",
			t_broken_name[how]);
		T_RUN(t_ram_unchanged(d, t_broken_name[how]));
		printf("ok: %s -> NEEDS_RESET\n", t_broken_name[how]);
	}
	/* after a reset the device works again */
	T_RUN(t_init(d, false));
	return t_many_reads(d);
}

/* Queue and feature setup the device must refuse. */
static int t_bad_setup(struct t_drv *d)
{
	t_w32(d, VIRTIO_MMIO_STATUS, 0);
	t_w32(d, VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER);
	t_w32(d, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
	t_w32(d, VIRTIO_MMIO_DRIVER_FEATURES, 0);  /* no VERSION_1: a legacy driver */
	t_w32(d, VIRTIO_MMIO_STATUS, 0xb);
	T_CHECK(!(t_r32(d, VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK),
		"FEATURES_OK kept without VERSION_1");
	/* rings reaching beyond guest RAM */
	t_w32(d, VIRTIO_MMIO_STATUS, 0);
	t_w32(d, VIRTIO_MMIO_QUEUE_NUM, T_Q);
	t_w32(d, VIRTIO_MMIO_QUEUE_DESC_LOW, (uint32_t)(T_RAM - 16));
	t_w32(d, VIRTIO_MMIO_QUEUE_DESC_HIGH, 0);
	t_w32(d, VIRTIO_MMIO_QUEUE_AVAIL_LOW, (uint32_t)T_AVAIL);
	t_w32(d, VIRTIO_MMIO_QUEUE_USED_LOW, (uint32_t)T_USED);
	t_w32(d, VIRTIO_MMIO_QUEUE_READY, 1);
	T_CHECK(t_r32(d, VIRTIO_MMIO_QUEUE_READY) == 0, "queue beyond RAM accepted");
	T_CHECK(t_r32(d, VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET, "no NEEDS_RESET");
	/* a 64-bit descriptor address above RAM, and a QueueNum that is not a power of 2 */
	t_w32(d, VIRTIO_MMIO_STATUS, 0);
	t_w32(d, VIRTIO_MMIO_QUEUE_DESC_LOW, (uint32_t)T_DESC);
	t_w32(d, VIRTIO_MMIO_QUEUE_DESC_HIGH, 1);
	t_w32(d, VIRTIO_MMIO_QUEUE_AVAIL_LOW, (uint32_t)T_AVAIL);
	t_w32(d, VIRTIO_MMIO_QUEUE_USED_LOW, (uint32_t)T_USED);
	t_w32(d, VIRTIO_MMIO_QUEUE_NUM, T_Q);
	t_w32(d, VIRTIO_MMIO_QUEUE_READY, 1);
	T_CHECK(t_r32(d, VIRTIO_MMIO_QUEUE_READY) == 0, "descriptors at 4 GiB + 64 KiB accepted");
	t_w32(d, VIRTIO_MMIO_STATUS, 0);
	t_w32(d, VIRTIO_MMIO_QUEUE_DESC_LOW, (uint32_t)T_DESC);
	t_w32(d, VIRTIO_MMIO_QUEUE_AVAIL_LOW, (uint32_t)T_AVAIL);
	t_w32(d, VIRTIO_MMIO_QUEUE_USED_LOW, (uint32_t)T_USED);
	t_w32(d, VIRTIO_MMIO_QUEUE_NUM, 100);
	t_w32(d, VIRTIO_MMIO_QUEUE_READY, 1);
	T_CHECK(t_r32(d, VIRTIO_MMIO_QUEUE_READY) == 0, "QueueNum 100 accepted");
	T_RUN(t_ram_unchanged(d, "after bad setup"));
	printf("ok: legacy features, rings outside RAM, QueueNum 100 refused\n");
	return T_PASS;
}

/* A read-only disk: OUT refused, file unchanged, reads and FLUSH still work. */
static int t_read_only(struct t_drv *d)
{
	uint64_t g = T_DATA + 0x600000, hints = 0;
	uint8_t junk[4096], file[4096];
	uint32_t l = 4096;
	struct t_req r[3];

	T_RUN(t_init(d, true));
	memset(junk, 0x77, sizeof(junk));
	t_gw(d, g, junk, sizeof(junk));
	t_hdr(d, &r[0], VIRTIO_BLK_T_OUT, 8);
	t_add(d, g, 4096, false, true);
	t_status_desc(d, &r[0]);
	r[0].want_status = VIRTIO_BLK_S_IOERR;
	t_hdr(d, &r[1], VIRTIO_BLK_T_FLUSH, 0);
	t_status_desc(d, &r[1]);
	t_read(d, &r[2], 8, &(uint64_t){ g + 0x1000 }, &l, 1, &hints);
	T_RUN(t_run_batch(d, r, 3));
	T_RUN(t_check_read(d, 8, &(uint64_t){ g + 0x1000 }, &l, 1));
	T_RUN(t_file_range(file, 8, sizeof(file)));
	T_CHECK(!memcmp(file, t_file_bytes + 8 * 512, sizeof(file)), "read-only file was written");
	T_RUN(t_ram_unchanged(d, "read-only"));
	printf("ok: read-only disk refuses writes, reads and flushes\n");
	return T_PASS;
}

/* Reset with reads in flight: once the Status = 0 write returns, the device writes nothing. */
static int t_reset_inflight(struct t_drv *d, unsigned delay_us)
{
	uint8_t *snap = malloc(T_RAM);
	uint16_t heads[64];
	struct t_req r[64];
	uint64_t hints = 0;
	uint32_t l = 64 << 10;
	int same;

	T_CHECK(snap, "malloc");
	T_RUN(t_init(d, false));
	for (unsigned i = 0; i < 64; i++) {
		uint64_t g = T_DATA + 0x700000 + (64ull << 10) * i;

		t_read(d, &r[i], t_rand() % (T_DISK / 512 - 128), &g, &l, 1, &hints);
		heads[i] = r[i].head;
	}
	t_kick(d, heads, 64);
	usleep(delay_us);  /* 0: reset before the device pops; else: while reads run */
	t_w32(d, VIRTIO_MMIO_STATUS, 0);
	memcpy(snap, d->ram, T_RAM);
	usleep(50000);
	same = !memcmp(snap, d->ram, T_RAM);
	free(snap);
	T_CHECK(same, "the device wrote guest RAM after the reset returned");
	T_CHECK(t_r32(d, VIRTIO_MMIO_STATUS) == 0, "status not 0 after reset");
	T_CHECK(__atomic_load_n(&d->irq_level, __ATOMIC_SEQ_CST) == 0, "line still up after reset");
	memcpy(d->shadow, d->ram, T_RAM);  /* what the reads did before the reset is allowed */
	printf("ok: reset %u us after 64 reads were queued, %u completed before it\n",
	       delay_us, (unsigned)__atomic_load_n((uint16_t *)(d->ram + T_USED + 2), __ATOMIC_ACQUIRE));
	T_RUN(t_init(d, false));
	return t_many_reads(d);
}

/* An idle device must sleep: the process uses (almost) no CPU for 200 ms. */
static int t_idle_cpu(void)
{
	struct timespec a, b;
	double used;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
	usleep(200000);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
	used = (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
	T_CHECK(used < 0.05, "idle device used %.3f s of CPU in 0.2 s", used);
	return T_PASS;
}

static int t_open(struct t_drv *d, bool ro)
{
	struct vmm_blk_cfg cfg = { .path = t_path, .read_only = ro, .mem = d->mem, .gsi = 9,
				   .set_irq = t_set_irq, .irq_opaque = d };
	int err = vmm_blk__create(&d->blk, &cfg);

	if (err == -ENOSYS || err == -EPERM) {
		printf("SKIP: io_uring unavailable: %s\n", strerror(-err));
		return T_SKIP;
	}
	T_CHECK(!err, "vmm_blk__create(%s): %s", t_path, strerror(-err));
	return T_PASS;
}

static int t_make_disk(void)
{
	int fd;

	strcpy(t_path, "/tmp/t-blk-XXXXXX");
	fd = mkstemp(t_path);
	T_CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
	t_file_bytes = malloc(T_DISK);
	T_CHECK(t_file_bytes, "malloc");
	t_fill_rand(t_file_bytes, T_DISK);
	T_CHECK(write(fd, t_file_bytes, T_DISK) == (ssize_t)T_DISK, "write %s", t_path);
	close(fd);
	return T_PASS;
}

static int t_all(struct t_drv *d)
{
	int ret = t_open(d, false);

	if (ret != T_PASS)
		return ret;
	T_RUN(t_init(d, false));
	T_RUN(t_idle_cpu());
	T_RUN(t_reads(d));
	T_RUN(t_many_reads(d));
	T_RUN(t_write_read(d));
	T_RUN(t_misc(d));
	T_RUN(t_ioerr(d));
	T_RUN(t_broken_rings(d));
	T_RUN(t_bad_setup(d));
	T_RUN(t_reset_inflight(d, 0));
	T_RUN(t_reset_inflight(d, 100));
	T_RUN(t_reset_inflight(d, 400));
	vmm_blk__destroy(d->blk);
	T_RUN(t_open(d, true));
	T_RUN(t_read_only(d));
	return T_PASS;
}

int main(void)
{
	struct vmm_mem_cfg mc = { .size = T_RAM, .dedup = VMM_DEDUP_OFF, .name = "t-blk" };
	struct t_drv d = { 0 };
	int ret, err;

	log_init("t-blk", LOG_WARN);
	err = vmm_mem__create(&d.mem, &mc);
	if (err) {
		printf("FAIL: vmm_mem__create: %s\n", strerror(-err));
		return T_FAIL;
	}
	d.ram = vmm_mem__hva(d.mem, GPA(0), T_RAM);
	d.shadow = calloc(1, T_RAM);
	ret = d.shadow ? t_make_disk() : T_FAIL;
	if (ret == T_PASS)
		ret = t_all(&d);
	vmm_blk__destroy(d.blk);
	vmm_mem__destroy(d.mem);
	if (t_path[0])
		unlink(t_path);
	free(t_file_bytes);
	free(d.shadow);
	printf("%s\n", ret == T_PASS ? "PASS" : ret == T_SKIP ? "SKIP" : "FAIL");
	return ret;
}
