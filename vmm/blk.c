/* blk.c: virtio-blk backed by a host file, reads and writes through io_uring. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <linux/fs.h>
#include <linux/virtio_blk.h>
#include <linux/virtio_ids.h>
#include <liburing.h>

#include "blk.h"
#include "log.h"
#include "mem.h"
#include "virtio.h"

/*
 * DOC: request flow
 *
 * A vCPU's QueueNotify write only rings `efd` (never waits for I/O). The
 * device thread has a read of `efd` pending in its io_uring, so one
 * io_uring_submit_and_wait() sleeps on both the doorbell and the I/O. When the
 * doorbell fires it pops every available chain (as long as a request slot is
 * free), parses it, and turns it into one readv/writev/fsync SQE straight over
 * the guest buffers' host addresses. Completions come back to the same thread,
 * which writes the status byte, hints the pages a read filled to the memory
 * plane, pushes the used element and raises the interrupt.
 *
 * A reset (Status = 0, vCPU thread, transport lock held) bumps `gen` and waits
 * on `idle` until every submitted request completed: the guest may reuse its
 * buffers as soon as the reset write returns. Completions of an older
 * generation are dropped without touching the rings.
 */

#define VMM_BLK_SECTOR      512u
#define VMM_BLK_SEG_MAX     (VMM_VIRTQ_MAX_CHAIN - 2)  /* header and status take two */
#define VMM_BLK_SLOTS       VMM_VIRTQ_NUM_MAX          /* requests in flight at most */
#define VMM_BLK_RING        (2 * VMM_BLK_SLOTS)        /* SQEs: one per slot, the doorbell, slack */
#define VMM_BLK_TAG_EFD     (~0ull)                    /* user_data of the doorbell read */
#define VMM_BLK_LOG_IOERR   8                          /* host I/O errors logged, then silence */

/* struct vmm_blk_req - one request submitted to io_uring */
struct vmm_blk_req {
	uint16_t head;              /* chain head, for the used ring */
	uint32_t type;              /* VIRTIO_BLK_T_IN / _OUT / _FLUSH */
	uint32_t gen;               /* device generation at submission (see DOC) */
	uint8_t *status;            /* host address of the status byte in guest RAM */
	uint64_t offset;            /* byte offset in the file */
	uint64_t total;             /* data bytes of the request */
	uint64_t done;              /* bytes transferred so far (short transfers resubmit) */
	unsigned niov;              /* entries in iov[] and hint[] */
	unsigned iov_first;         /* first iov not fully transferred yet */
	bool dma;                   /* hint[] ranges are announced with vmm_mem__dma_begin */
	struct iovec iov[VMM_BLK_SEG_MAX];     /* data buffers (host addresses into guest RAM) */
	struct { gpa_t gpa; uint64_t len; } hint[VMM_BLK_SEG_MAX];  /* same, as guest ranges */
};

/* struct vmm_blk - a virtio-blk device */
struct vmm_blk {
	struct vmm_virtio v;                /* transport; v.lock also guards the (L) fields */
	struct vmm_mem *mem;                /* guest RAM */
	int fd;                             /* the backing file */
	bool read_only;                     /* VIRTIO_BLK_F_RO offered, OUT refused */
	uint64_t capacity;                  /* size in 512-byte sectors */
	char id[VIRTIO_BLK_ID_BYTES];       /* GET_ID answer: the file's basename, NUL-padded */
	struct virtio_blk_config config;    /* device config space as the driver reads it */
	struct io_uring ring;               /* one per device, used by the device thread only */
	int efd;                            /* QueueNotify doorbell (eventfd) */
	uint64_t efd_buf;                   /* target of the pending doorbell read */
	pthread_t thread;                   /* the device thread */
	bool thread_started;
	bool stop;                          /* atomic: destroy asked the thread to end */
	pthread_cond_t idle;                /* (L) signalled when inflight drops to 0 */
	unsigned inflight;                  /* (L) requests submitted and not completed */
	uint32_t gen;                       /* (L) bumped by every reset */
	uint16_t free_slot[VMM_BLK_SLOTS];  /* (L) stack of free req[] indices */
	unsigned nfree;                     /* (L) entries in free_slot[] */
	unsigned io_errors;                 /* host I/O errors seen (device thread) */
	struct vmm_virtq_chain chain;       /* (L) scratch for the chain being parsed */
	struct vmm_blk_req req[VMM_BLK_SLOTS];
};

/* QueueNotify (vCPU thread, transport lock held): ring the doorbell, nothing else. */
static void vmm_blk_notify(void *opaque, unsigned q)
{
	struct vmm_blk *b = opaque;
	uint64_t one = 1;

	(void)q;
	/* never blocks: the device thread drains the counter long before 2^64 - 2 */
	if (write(b->efd, &one, sizeof(one)) < 0)
		log_warn("blk: doorbell: %s", strerror(errno));
}

/* Status = 0 (transport lock held): wait for the I/O in flight, forget it. */
static void vmm_blk_reset(void *opaque)
{
	struct vmm_blk *b = opaque;

	b->gen++;
	while (b->inflight)
		pthread_cond_wait(&b->idle, &b->v.lock);
}

/* Copy n bytes out of readable segments [0, nread) starting at byte `skip`. */
static bool vmm_blk_copy_in(const struct vmm_virtq_chain *c, uint64_t skip, void *dst, size_t n)
{
	uint8_t *d = dst;

	for (unsigned i = 0; i < c->nread && n; i++) {
		const struct vmm_virtq_seg *s = &c->seg[i];
		uint64_t take;

		if (skip >= s->len) {
			skip -= s->len;
			continue;
		}
		take = s->len - skip < n ? s->len - skip : n;
		memcpy(d, (uint8_t *)s->hva + skip, take);
		d += take;
		n -= take;
		skip = 0;
	}
	return n == 0;
}

/*
 * Data buffers: segments [from, to), less `skip` bytes at the front and `trim`
 * at the back of the last one (the header and the status byte may share a
 * descriptor with data: VERSION_1 implies any layout). Zero-length parts are dropped.
 */
static void vmm_blk_gather(struct vmm_blk_req *r, const struct vmm_virtq_chain *c,
			   unsigned from, unsigned to, uint64_t skip, uint64_t trim)
{
	r->niov = 0;
	r->total = 0;
	for (unsigned i = from; i < to; i++) {
		const struct vmm_virtq_seg *s = &c->seg[i];
		uint64_t len = s->len;

		if (i == to - 1)
			len = len > trim ? len - trim : 0;
		if (skip >= len) {
			skip -= len;
			continue;
		}
		len -= skip;
		r->iov[r->niov].iov_base = (uint8_t *)s->hva + skip;
		r->iov[r->niov].iov_len = len;
		r->hint[r->niov].gpa = GPA(s->gpa.v + skip);
		r->hint[r->niov].len = len;
		r->niov++;
		r->total += len;
		skip = 0;
	}
}

/* GET_ID: the id string into the data buffers; returns the bytes written. */
static uint32_t vmm_blk_get_id(struct vmm_blk *b, struct vmm_blk_req *r)
{
	uint32_t n = 0;

	for (unsigned i = 0; i < r->niov && n < sizeof(b->id); i++) {
		size_t take = sizeof(b->id) - n < r->iov[i].iov_len ? sizeof(b->id) - n : r->iov[i].iov_len;

		memcpy(r->iov[i].iov_base, b->id + n, take);
		n += take;
	}
	return n;
}

/* Check an IN/OUT request's range and buffers; VIRTIO_BLK_S_OK if it may go. */
static uint8_t vmm_blk_check_rw(struct vmm_blk *b, struct vmm_blk_req *r, uint64_t sector)
{
	if (r->type == VIRTIO_BLK_T_OUT && b->read_only) {
		vmm_virtio__guest_error(&b->v, "write to a read-only disk refused");
		return VIRTIO_BLK_S_IOERR;
	}
	if (r->total % VMM_BLK_SECTOR) {
		vmm_virtio__guest_error(&b->v, "request length not a multiple of 512");
		return VIRTIO_BLK_S_IOERR;
	}
	if (sector > b->capacity || r->total / VMM_BLK_SECTOR > b->capacity - sector) {
		vmm_virtio__guest_error(&b->v, "request beyond the end of the disk");
		return VIRTIO_BLK_S_IOERR;
	}
	r->offset = sector * VMM_BLK_SECTOR;
	return VIRTIO_BLK_S_OK;
}

/*
 * Turn the chain into a request. Returns -1 if it must go to io_uring, else
 * the status to complete it with now (*used = bytes written into the chain).
 */
static int vmm_blk_parse(struct vmm_blk *b, const struct vmm_virtq_chain *c,
			 struct vmm_blk_req *r, uint32_t *used)
{
	struct virtio_blk_outhdr hdr;
	uint8_t st;

	*used = 1;
	if (c->bad) {
		vmm_virtio__guest_error(&b->v, "buffer outside guest RAM, or readable after writable");
		return VIRTIO_BLK_S_IOERR;
	}
	if (!vmm_blk_copy_in(c, 0, &hdr, sizeof(hdr))) {
		vmm_virtio__guest_error(&b->v, "request header shorter than 16 bytes");
		return VIRTIO_BLK_S_IOERR;
	}
	r->type = hdr.type;
	switch (hdr.type) {
	case VIRTIO_BLK_T_IN:
	case VIRTIO_BLK_T_GET_ID:
		/* every writable byte but the status one */
		vmm_blk_gather(r, c, c->nread, c->nseg, 0, 1);
		if (hdr.type == VIRTIO_BLK_T_GET_ID) {
			*used += vmm_blk_get_id(b, r);
			return VIRTIO_BLK_S_OK;
		}
		break;
	case VIRTIO_BLK_T_OUT:
		vmm_blk_gather(r, c, 0, c->nread, sizeof(hdr), 0);
		break;
	case VIRTIO_BLK_T_FLUSH:
		r->niov = 0;
		return -1;
	default:
		return VIRTIO_BLK_S_UNSUPP;
	}
	st = vmm_blk_check_rw(b, r, hdr.sector);
	if (st != VIRTIO_BLK_S_OK)
		return st;
	if (!r->total)
		return VIRTIO_BLK_S_OK;
	return -1;
}

/* Queue the (remaining part of the) request on the ring. 0 or -EBUSY (SQ full). */
static int vmm_blk_prep(struct vmm_blk *b, struct vmm_blk_req *r)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring);
	unsigned n = r->niov - r->iov_first;

	if (!sqe)
		return -EBUSY;
	if (r->type == VIRTIO_BLK_T_FLUSH)
		io_uring_prep_fsync(sqe, b->fd, 0);
	else if (r->type == VIRTIO_BLK_T_IN)
		io_uring_prep_readv(sqe, b->fd, r->iov + r->iov_first, n, r->offset + r->done);
	else
		io_uring_prep_writev(sqe, b->fd, r->iov + r->iov_first, n, r->offset + r->done);
	io_uring_sqe_set_data64(sqe, (uint64_t)(r - b->req));
	return 0;
}

/* Finish a request (lock held): status byte, hints, used ring, slot back. */
static void vmm_blk_finish(struct vmm_blk *b, struct vmm_blk_req *r, uint8_t st, uint32_t used)
{
	if (r->dma)
		for (unsigned i = 0; i < r->niov; i++)
			vmm_mem__dma_end(b->mem, r->hint[i].gpa, r->hint[i].len);
	r->dma = false;
	if (r->gen == b->gen) {
		*r->status = st;
		if (st == VIRTIO_BLK_S_OK && r->type == VIRTIO_BLK_T_IN)
			for (unsigned i = 0; i < r->niov; i++)
				vmm_mem__hint(b->mem, r->hint[i].gpa, r->hint[i].len);
		vmm_virtq__push(&b->v, 0, r->head, used);
	}
	b->free_slot[b->nfree++] = (uint16_t)(r - b->req);
}

/* Pop and start every available request we have a slot for (device thread). */
static void vmm_blk_process(struct vmm_blk *b)
{
	struct vmm_virtq_chain *c = &b->chain;

	pthread_mutex_lock(&b->v.lock);
	vmm_mem__dev_enter(b->mem); /* GET_ID, status bytes and the used ring are written here */
	while (b->nfree && vmm_virtq__pop(&b->v, 0, c) > 0) {
		const struct vmm_virtq_seg *s = &c->seg[c->nseg - 1];
		struct vmm_blk_req *r = &b->req[b->free_slot[--b->nfree]];
		uint32_t used;
		int st;

		if (!s->write || !s->len || !s->hva) {
			b->nfree++;
			vmm_virtio__needs_reset(&b->v, "request without a writable status byte at its end");
			break;
		}
		r->head = c->head;
		r->gen = b->gen;
		r->status = (uint8_t *)s->hva + s->len - 1;
		r->done = 0;
		r->iov_first = 0;
		r->dma = false;
		st = vmm_blk_parse(b, c, r, &used);
		if (st < 0 && r->type == VIRTIO_BLK_T_IN) {
			/* the read lands in guest RAM behind the plane's back until it completes */
			for (unsigned i = 0; i < r->niov; i++)
				vmm_mem__dma_begin(b->mem, r->hint[i].gpa, r->hint[i].len);
			r->dma = true;
		}
		if (st < 0 && vmm_blk_prep(b, r) < 0)
			st = VIRTIO_BLK_S_IOERR;
		if (st >= 0)
			vmm_blk_finish(b, r, (uint8_t)st, used);
		else
			b->inflight++;
	}
	vmm_mem__dev_leave(b->mem);
	pthread_mutex_unlock(&b->v.lock);
}

/* Skip `n` transferred bytes in the iov list after a short read or write. */
static void vmm_blk_advance(struct vmm_blk_req *r, uint64_t n)
{
	r->done += n;
	while (n && r->iov_first < r->niov) {
		struct iovec *v = &r->iov[r->iov_first];

		if (n < v->iov_len) {
			v->iov_base = (uint8_t *)v->iov_base + n;
			v->iov_len -= n;
			return;
		}
		n -= v->iov_len;
		r->iov_first++;
	}
}

/* One completion from io_uring (device thread). */
static void vmm_blk_complete(struct vmm_blk *b, struct vmm_blk_req *r, int res)
{
	uint8_t st = VIRTIO_BLK_S_OK;
	uint32_t used = 1;

	if (res < 0 || (res == 0 && r->type != VIRTIO_BLK_T_FLUSH)) {
		if (b->io_errors++ < VMM_BLK_LOG_IOERR)
			log_warn("blk: %s at byte %llu: %s", r->type == VIRTIO_BLK_T_IN ? "read" :
				 r->type == VIRTIO_BLK_T_OUT ? "write" : "flush",
				 (unsigned long long)(r->offset + r->done),
				 res < 0 ? strerror(-res) : "unexpected end of file");
		st = VIRTIO_BLK_S_IOERR;
	} else if (r->type != VIRTIO_BLK_T_FLUSH) {
		vmm_blk_advance(r, (uint64_t)res);
		if (r->done < r->total && vmm_blk_prep(b, r) == 0)
			return; /* short transfer: the rest is queued, same slot */
		if (r->done < r->total)
			st = VIRTIO_BLK_S_IOERR;
		else if (r->type == VIRTIO_BLK_T_IN)
			used += r->total > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)r->total;
	}
	pthread_mutex_lock(&b->v.lock);
	vmm_mem__dev_enter(b->mem);
	vmm_blk_finish(b, r, st, used);
	vmm_mem__dev_leave(b->mem);
	if (!--b->inflight)
		pthread_cond_broadcast(&b->idle);
	pthread_mutex_unlock(&b->v.lock);
}

/* Keep a read of the doorbell pending in the ring. */
static void vmm_blk_arm_doorbell(struct vmm_blk *b)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring);

	if (!sqe) {
		/* cannot happen: the ring has room for every slot and the doorbell */
		log_err("blk: no SQE for the doorbell; the disk stops answering");
		return;
	}
	io_uring_prep_read(sqe, b->efd, &b->efd_buf, sizeof(b->efd_buf), 0);
	io_uring_sqe_set_data64(sqe, VMM_BLK_TAG_EFD);
}

/* Handle every completion ready; returns true if the doorbell rang. */
static bool vmm_blk_reap(struct vmm_blk *b)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	bool rang = false;

	io_uring_for_each_cqe(&b->ring, head, cqe) {
		uint64_t tag = io_uring_cqe_get_data64(cqe);

		n++;
		if (tag == VMM_BLK_TAG_EFD)
			rang = true;
		else if (tag < VMM_BLK_SLOTS)
			vmm_blk_complete(b, &b->req[tag], cqe->res);
	}
	io_uring_cq_advance(&b->ring, n);
	return rang;
}

static bool vmm_blk_idle(struct vmm_blk *b)
{
	bool idle;

	pthread_mutex_lock(&b->v.lock);
	idle = b->inflight == 0;
	pthread_mutex_unlock(&b->v.lock);
	return idle;
}

static void *vmm_blk_thread(void *arg)
{
	struct vmm_blk *b = arg;
	int err;

	vmm_blk_arm_doorbell(b);
	for (;;) {
		err = io_uring_submit_and_wait(&b->ring, 1);
		if (err < 0 && err != -EINTR && err != -EAGAIN && err != -EBUSY) {
			log_err("blk: io_uring_submit_and_wait: %s; the disk stops answering",
				strerror(-err));
			break;
		}
		if (vmm_blk_reap(b) && !__atomic_load_n(&b->stop, __ATOMIC_ACQUIRE))
			vmm_blk_arm_doorbell(b);
		if (__atomic_load_n(&b->stop, __ATOMIC_ACQUIRE)) {
			if (vmm_blk_idle(b))
				break;
			continue;
		}
		/* also after plain completions: freed slots may let waiting chains in */
		vmm_blk_process(b);
	}
	return NULL;
}

/* Open the backing file and find its size in sectors. */
static int vmm_blk_open(struct vmm_blk *b, const char *path, bool ro)
{
	struct stat st;
	uint64_t bytes;

	b->fd = open(path, (ro ? O_RDONLY : O_RDWR) | O_CLOEXEC);
	if (b->fd < 0) {
		int err = -errno;

		log_err("blk: cannot open %s %s: %s%s", path, ro ? "read-only" : "read-write",
			strerror(errno), !ro && (errno == EACCES || errno == EROFS) ?
			" (use --disk PATH,ro for a read-only disk)" : "");
		return err;
	}
	if (fstat(b->fd, &st) < 0)
		return -errno;
	if (S_ISREG(st.st_mode)) {
		bytes = (uint64_t)st.st_size;
	} else if (S_ISBLK(st.st_mode)) {
		if (ioctl(b->fd, BLKGETSIZE64, &bytes) < 0)
			return -errno;
	} else {
		log_err("blk: %s is neither a regular file nor a block device", path);
		return -EINVAL;
	}
	if (bytes % VMM_BLK_SECTOR)
		log_warn("blk: %s: size %llu is not a multiple of 512; the last %llu bytes are not visible",
			 path, (unsigned long long)bytes, (unsigned long long)(bytes % VMM_BLK_SECTOR));
	b->capacity = bytes / VMM_BLK_SECTOR;
	return 0;
}

/* Config space and GET_ID string. */
static void vmm_blk_describe(struct vmm_blk *b, const char *path)
{
	const char *base = strrchr(path, '/');
	size_t n;

	base = base ? base + 1 : path;
	if (!*base)
		base = "pvisor-blk";
	/* NUL-padded, not necessarily NUL-terminated: exactly the spec's 20 bytes */
	n = strlen(base) < sizeof(b->id) ? strlen(base) : sizeof(b->id);
	memcpy(b->id, base, n);
	b->config.capacity = b->capacity;
	b->config.seg_max = VMM_BLK_SEG_MAX;
	b->config.blk_size = VMM_BLK_SECTOR;
}

static int vmm_blk_transport(struct vmm_blk *b, const struct vmm_blk_cfg *cfg)
{
	struct vmm_virtio_cfg vc = {
		.mem = cfg->mem,
		.device_id = VIRTIO_ID_BLOCK,
		.features = (1ull << VIRTIO_BLK_F_SEG_MAX) | (1ull << VIRTIO_BLK_F_BLK_SIZE) |
			    (1ull << VIRTIO_BLK_F_FLUSH) | (cfg->read_only ? 1ull << VIRTIO_BLK_F_RO : 0),
		.config = &b->config,
		.config_len = sizeof(b->config),
		.nqueues = 1,
		.notify = vmm_blk_notify,
		.reset = vmm_blk_reset,
		.opaque = b,
		.gsi = cfg->gsi,
		.set_irq = cfg->set_irq,
		.irq_opaque = cfg->irq_opaque,
	};

	return vmm_virtio__init(&b->v, &vc);
}

/* The device thread starts with every signal blocked: signals belong to main(). */
static int vmm_blk_start(struct vmm_blk *b)
{
	sigset_t all, old;
	int err;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	err = pthread_create(&b->thread, NULL, vmm_blk_thread, b);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (err)
		return -err;
	pthread_setname_np(b->thread, "pvisor-blk");
	b->thread_started = true;
	return 0;
}

int vmm_blk__create(struct vmm_blk **out, const struct vmm_blk_cfg *cfg)
{
	struct vmm_blk *b;
	int err;

	if (!cfg->path || !cfg->mem)
		return -EINVAL;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->mem = cfg->mem;
	b->read_only = cfg->read_only;
	b->efd = -1;
	err = vmm_blk_open(b, cfg->path, cfg->read_only);
	if (err)
		goto err_file;
	vmm_blk_describe(b, cfg->path);
	for (unsigned i = 0; i < VMM_BLK_SLOTS; i++)
		b->free_slot[b->nfree++] = (uint16_t)(VMM_BLK_SLOTS - 1 - i);
	err = vmm_blk_transport(b, cfg);
	if (err)
		goto err_file;
	err = -pthread_cond_init(&b->idle, NULL);
	if (err)
		goto err_transport;
	/* blocking: io_uring may answer a read of an O_NONBLOCK fd with -EAGAIN instead of
	 * waiting (older kernels), which would spin the device thread */
	b->efd = eventfd(0, EFD_CLOEXEC);
	if (b->efd < 0) {
		err = -errno;
		goto err_cond;
	}
	err = io_uring_queue_init(VMM_BLK_RING, &b->ring, 0);
	if (err) {
		log_err("blk: io_uring_queue_init: %s (is io_uring disabled by kernel.io_uring_disabled?)",
			strerror(-err));
		goto err_efd;
	}
	err = vmm_blk_start(b);
	if (err)
		goto err_ring;
	*out = b;
	return 0;

err_ring:
	io_uring_queue_exit(&b->ring);
err_efd:
	close(b->efd);
err_cond:
	pthread_cond_destroy(&b->idle);
err_transport:
	vmm_virtio__fini(&b->v);
err_file:
	if (b->fd >= 0)
		close(b->fd);
	free(b);
	return err;
}

void vmm_blk__mmio(void *opaque, uint64_t offset, uint8_t *data, uint32_t len, bool is_write)
{
	struct vmm_blk *b = opaque;

	vmm_virtio__mmio(&b->v, offset, data, len, is_write);
}

void vmm_blk__destroy(struct vmm_blk *b)
{
	uint64_t one = 1;

	if (!b)
		return;
	if (b->thread_started) {
		__atomic_store_n(&b->stop, true, __ATOMIC_RELEASE);
		if (write(b->efd, &one, sizeof(one)) < 0)
			log_warn("blk: stop doorbell: %s", strerror(errno));
		pthread_join(b->thread, NULL);
	}
	io_uring_queue_exit(&b->ring);
	close(b->efd);
	pthread_cond_destroy(&b->idle);
	vmm_virtio__fini(&b->v);
	close(b->fd);
	free(b);
}
