/* poolconn.c: the VMM's connection to pvisor-pool: handshake, ring access, segment fetch. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "poolconn.h"
#include "util.h"

#define VMM_POOL_TIMEOUT_MS 3000        /* a pool that takes longer to answer is gone */
#define VMM_POOL_MAX_ENTRIES (1u << 20) /* refuse absurd ring shapes */
#define VMM_POOL_MAX_STAGING (1u << 16)
#define VMM_POOL_STALL_NS 100000000ull  /* re-ring a doorbell nobody answered */

void vmm_pool__init(struct vmm_pool *p)
{
	memset(p, 0, sizeof(*p));
	p->sock = p->sq_efd = p->cq_efd = -1;
}

void vmm_pool__close(struct vmm_pool *p)
{
	if (p->ring)
		munmap(p->ring, p->ring_size);
	if (p->sock >= 0)
		close(p->sock);
	if (p->sq_efd >= 0)
		close(p->sq_efd);
	if (p->cq_efd >= 0)
		close(p->cq_efd);
	free(p->bl);
	vmm_pool__init(p);
}

/* Wait for one reply of @type; fds ride along. Bytes received or -errno. */
static ssize_t vmm_pool_recv(struct vmm_pool *p, uint16_t type, void *buf, size_t len,
			     int *fds, int *nfds)
{
	struct pollfd pfd = { .fd = p->sock, .events = POLLIN };
	struct proto_hdr *h = buf;
	ssize_t n;
	int r;

	do
		r = poll(&pfd, 1, VMM_POOL_TIMEOUT_MS);
	while (r < 0 && errno == EINTR);
	if (r == 0)
		return -ETIMEDOUT;
	if (r < 0)
		return -errno;
	n = util_recv_fds(p->sock, buf, len, fds, nfds);
	if (n == 0)
		return -ECONNRESET;
	if (n < 0)
		return n;
	if ((size_t)n < sizeof(*h) || h->magic != PROTO_MAGIC || h->version != PROTO_VERSION ||
	    h->type != type || h->len != (uint32_t)n) {
		for (int i = 0; nfds && i < *nfds; i++)
			close(fds[i]);
		return -EPROTO;
	}
	return n;
}

static int vmm_pool_check_ring(struct vmm_pool *p)
{
	struct proto_ring_hdr *h = &p->hdr;

	memcpy(h, p->ring, sizeof(*h));
	if (h->magic != PROTO_RING_MAGIC || h->version != PROTO_VERSION ||
	    !h->sq_entries || (h->sq_entries & (h->sq_entries - 1)) ||
	    !h->cq_entries || (h->cq_entries & (h->cq_entries - 1)) ||
	    h->sq_entries > VMM_POOL_MAX_ENTRIES || h->cq_entries > VMM_POOL_MAX_ENTRIES ||
	    !h->staging_slots || h->staging_slots > VMM_POOL_MAX_STAGING ||
	    h->sq_off != proto_ring_sq_off() || h->cq_off != proto_ring_cq_off(h->sq_entries) ||
	    h->staging_off != proto_ring_staging_off(h->sq_entries, h->cq_entries) ||
	    h->size != proto_ring_size(h->sq_entries, h->cq_entries, h->staging_slots) ||
	    h->size > p->ring_size)
		return -EPROTO;
	p->sq_idx = (struct proto_ring_idx *)(p->ring + h->sq_off);
	p->sqes = (struct proto_sqe *)(p->sq_idx + 1);
	p->cq_idx = (struct proto_ring_idx *)(p->ring + h->cq_off);
	p->cqes = (struct proto_cqe *)(p->cq_idx + 1);
	p->staging = p->ring + h->staging_off;
	p->sq_tail = proto_load_acquire(&p->sq_idx->tail);
	p->cq_head = proto_load_acquire(&p->cq_idx->head);
	return 0;
}

static int vmm_pool_map_ring(struct vmm_pool *p, int memfd, uint64_t size)
{
	struct stat st;
	void *r;

	if (size < proto_ring_staging_off(1, 1) || size > (1ull << 32) || fstat(memfd, &st) ||
	    (uint64_t)st.st_size < size)
		return -EPROTO;
	r = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (r == MAP_FAILED)
		return -errno;
	p->ring = r;
	p->ring_size = size;
	return vmm_pool_check_ring(p);
}

static int vmm_pool_hello(struct vmm_pool *p, const char *domain, const char *name,
			  uint64_t guest_pages)
{
	struct proto_hello h = { .guest_pages = guest_pages };
	struct proto_hello_reply r;
	int fds[3], nfds = 3, ret;
	ssize_t n;

	proto_hdr_init(&h.hdr, PROTO_MSG_HELLO, sizeof(h), 0);
	snprintf(h.domain, sizeof(h.domain), "%s", domain);
	snprintf(h.name, sizeof(h.name), "%s", name);
	n = util_send_fds(p->sock, &h, sizeof(h), NULL, 0);
	if (n < 0)
		return (int)n;
	n = vmm_pool_recv(p, PROTO_MSG_HELLO_REPLY, &r, sizeof(r), fds, &nfds);
	if (n < 0)
		return (int)n;
	if ((size_t)n != sizeof(r) || r.status != 0 || nfds != 3) {
		r.message[sizeof(r.message) - 1] = '\0';
		if ((size_t)n == sizeof(r) && r.status)
			log_warn("pool: HELLO refused (%d): %s", r.status, r.message);
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		return (size_t)n == sizeof(r) && r.status < 0 ? r.status : -EPROTO;
	}
	p->sq_efd = fds[1];
	p->cq_efd = fds[2];
	p->client_id = r.client_id;
	p->seg_pages = r.seg_pages;
	ret = r.seg_pages ? vmm_pool_map_ring(p, fds[0], r.ring_size) : -EPROTO;
	close(fds[0]);
	return ret;
}

int vmm_pool__connect(struct vmm_pool *p, const char *path, const char *domain,
		      const char *name, uint64_t guest_pages)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int ret;

	vmm_pool__init(p);
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	p->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (p->sock < 0)
		return -errno;
	if (connect(p->sock, (struct sockaddr *)&sa, sizeof(sa))) {
		ret = -errno;
		goto err;
	}
	ret = vmm_pool_hello(p, domain, name, guest_pages);
	if (ret)
		goto err;
	return 0;
err:
	vmm_pool__close(p);
	return ret;
}

static bool vmm_pool_ring_put(struct vmm_pool *p, const struct proto_sqe *e)
{
	uint32_t head = proto_load_acquire(&p->sq_idx->head);

	/* A head beyond our tail means the pool is lying; treat the ring as full. */
	if (p->sq_tail - head >= p->hdr.sq_entries)
		return false;
	p->sqes[p->sq_tail & (p->hdr.sq_entries - 1)] = *e;
	p->sq_tail++;
	return true;
}

int vmm_pool__push(struct vmm_pool *p, const struct proto_sqe *e)
{
	if (!p->bl_len && vmm_pool_ring_put(p, e))
		return 0;
	if (p->bl_len == p->bl_cap &&
	    util_fifo_grow((void **)&p->bl, &p->bl_cap, &p->bl_head, p->bl_len, sizeof(*p->bl), 1024))
		return -ENOMEM;
	p->bl[(p->bl_head + p->bl_len) % p->bl_cap] = *e;
	p->bl_len++;
	return 0;
}

int vmm_pool__flush(struct vmm_pool *p)
{
	uint32_t old, head;
	uint64_t one = 1, now;

	if (!vmm_pool__up(p))
		return -ENOTCONN;
	old = proto_load_acquire(&p->sq_idx->tail);
	while (p->bl_len && vmm_pool_ring_put(p, &p->bl[p->bl_head])) {
		p->bl_head = (p->bl_head + 1) % p->bl_cap;
		p->bl_len--;
	}
	proto_store_release(&p->sq_idx->tail, p->sq_tail);
	head = proto_load_acquire(&p->sq_idx->head);
	now = util_now_ns();
	/* Ring on empty -> non-empty, and again if the pool seems to have missed it. */
	if ((old != p->sq_tail && head == old) ||
	    (head != p->sq_tail && now - p->rung_ns > VMM_POOL_STALL_NS)) {
		if (write(p->sq_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
			return -errno;
		p->rung_ns = now;
	}
	return 0;
}

uint32_t vmm_pool__pending(const struct vmm_pool *p)
{
	if (!vmm_pool__up(p))
		return 0;
	return p->sq_tail - proto_load_acquire(&p->sq_idx->head) + p->bl_len;
}

bool vmm_pool__pop(struct vmm_pool *p, struct proto_cqe *out)
{
	uint32_t tail = proto_load_acquire(&p->cq_idx->tail);

	if (tail == p->cq_head || tail - p->cq_head > p->hdr.cq_entries)
		return false;
	*out = p->cqes[p->cq_head & (p->hdr.cq_entries - 1)];
	p->cq_head++;
	proto_store_release(&p->cq_idx->head, p->cq_head);
	return true;
}

void vmm_pool__ack(struct vmm_pool *p)
{
	uint64_t v;

	if (p->cq_efd >= 0 && read(p->cq_efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_debug("pool: complete eventfd: %s", strerror(errno));
}

int vmm_pool__seg(struct vmm_pool *p, uint32_t seg, int *fd, uint64_t *pages)
{
	struct proto_seg_req q = { .seg = seg };
	struct proto_seg_reply r;
	int fds[1], nfds = 1;
	struct stat st;
	ssize_t n;

	proto_hdr_init(&q.hdr, PROTO_MSG_SEG_REQ, sizeof(q), 0);
	n = util_send_fds(p->sock, &q, sizeof(q), NULL, 0);
	if (n < 0)
		return (int)n;
	n = vmm_pool_recv(p, PROTO_MSG_SEG_REPLY, &r, sizeof(r), fds, &nfds);
	if (n < 0)
		return (int)n;
	if ((size_t)n != sizeof(r) || r.seg != seg || (r.status == 0) != (nfds == 1)) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		return -EPROTO;
	}
	if (r.status)
		return r.status < 0 ? r.status : -EPROTO;
	if (!r.pages || r.pages > (1ull << 30) || fstat(fds[0], &st) ||
	    (uint64_t)st.st_size < r.pages * PROTO_PAGE_SIZE) {
		close(fds[0]);
		return -EPROTO;
	}
	*fd = fds[0];
	*pages = r.pages;
	return 0;
}
