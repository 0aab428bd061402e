/* t-badpool.c: a lying pool cannot change guest memory; the VMM hangs up on one that keeps lying. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "proto.h"
#include "tvmm.h"
#include "util.h"

/*
 * This test is the pool: a few lines of proto.h spoken by hand. After the
 * VMM offers its pages it answers with one honest MAP (the positive control:
 * the fake pool's protocol is right) and then with lies: a slot whose bytes
 * differ from the page, slots and pages out of range, a segment that does not
 * exist, an unknown verdict and staging slot, and finally a flood of garbage.
 * The guest must read back every byte it wrote, the honest MAP must merge,
 * and the VMM must hang up once the garbage keeps coming.
 */

#define T_PAGES   256
#define T_SLOTS   16
#define T_SQ      256
#define T_CQ      1024
#define T_STAGING 8

static int failures;
#define T_CHECK(cond, ...) do { if (!(cond)) { printf("FAIL: " __VA_ARGS__); printf("\n"); \
	failures++; } } while (0)

struct t_fake {
	int lsock, sock, seg_fd, ring_fd, sq_efd, cq_efd;
	uint8_t *ring, *seg;
	struct proto_ring_idx *sq_idx, *cq_idx;
	struct proto_cqe *cqes;
	uint32_t cq_tail;
	volatile int stop, hung_up;
	pthread_t thr;
};

static int t_fake_hello(struct t_fake *f)
{
	struct proto_hello h;
	struct proto_hello_reply r = { .seg_pages = T_SLOTS };
	struct proto_ring_hdr *rh;
	uint64_t size = proto_ring_size(T_SQ, T_CQ, T_STAGING);
	int fds[3];

	if (recv(f->sock, &h, sizeof(h), 0) != (ssize_t)sizeof(h) || h.hdr.type != PROTO_MSG_HELLO)
		return -EPROTO;
	f->ring_fd = memfd_create("t-ring", MFD_CLOEXEC);
	if (f->ring_fd < 0 || ftruncate(f->ring_fd, (off_t)size))
		return -errno;
	f->ring = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, f->ring_fd, 0);
	if (f->ring == MAP_FAILED)
		return -errno;
	rh = (struct proto_ring_hdr *)f->ring;
	*rh = (struct proto_ring_hdr){ .magic = PROTO_RING_MAGIC, .version = PROTO_VERSION,
		.sq_entries = T_SQ, .cq_entries = T_CQ, .staging_slots = T_STAGING,
		.sq_off = proto_ring_sq_off(), .cq_off = proto_ring_cq_off(T_SQ),
		.staging_off = proto_ring_staging_off(T_SQ, T_CQ), .size = size };
	f->sq_idx = (struct proto_ring_idx *)(f->ring + rh->sq_off);
	f->cq_idx = (struct proto_ring_idx *)(f->ring + rh->cq_off);
	f->cqes = (struct proto_cqe *)(f->cq_idx + 1);
	f->sq_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	f->cq_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	proto_hdr_init(&r.hdr, PROTO_MSG_HELLO_REPLY, sizeof(r), 0);
	r.client_id = 1;
	r.ring_size = size;
	fds[0] = f->ring_fd;
	fds[1] = f->sq_efd;
	fds[2] = f->cq_efd;
	return util_send_fds(f->sock, &r, sizeof(r), fds, 3) == (ssize_t)sizeof(r) ? 0 : -EIO;
}

/* Answer SEG_REQ: segment 0 exists, every other one does not. */
static void *t_fake_main(void *arg)
{
	struct t_fake *f = arg;

	f->sock = accept(f->lsock, NULL, NULL);
	if (f->sock < 0 || t_fake_hello(f)) {
		printf("FAIL: fake pool handshake\n");
		exit(T_FAIL);
	}
	while (!f->stop) {
		struct pollfd pfd = { .fd = f->sock, .events = POLLIN };
		struct proto_seg_req q;
		struct proto_seg_reply r = { .pages = T_SLOTS };
		ssize_t n;

		if (poll(&pfd, 1, 50) <= 0)
			continue;
		n = recv(f->sock, &q, sizeof(q), 0);
		if (n <= 0) {
			f->hung_up = 1;
			break;
		}
		if (n != (ssize_t)sizeof(q) || q.hdr.type != PROTO_MSG_SEG_REQ)
			continue;
		proto_hdr_init(&r.hdr, PROTO_MSG_SEG_REPLY, sizeof(r), 0);
		r.seg = q.seg;
		r.status = q.seg == 0 ? 0 : -ENOENT;
		util_send_fds(f->sock, &r, sizeof(r), &f->seg_fd, q.seg == 0 ? 1 : 0);
	}
	return NULL;
}

static void t_post(struct t_fake *f, uint64_t page, uint32_t verdict, uint32_t seg, uint32_t slot,
		   uint32_t staging)
{
	uint64_t one = 1;

	f->cqes[f->cq_tail & (T_CQ - 1)] = (struct proto_cqe){ .page = page, .verdict = verdict,
		.seg = seg, .slot = slot, .staging = staging, .op = PROTO_OP_OFFER };
	proto_store_release(&f->cq_idx->tail, ++f->cq_tail);
	if (write(f->cq_efd, &one, sizeof(one)) != sizeof(one))
		perror("eventfd");
}

static struct vmm_mem_stats t_st(struct vmm_mem *m)
{
	struct vmm_mem_stats st;

	vmm_mem__stats(m, &st);
	return st;
}

static int t_setup(struct t_fake *f, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	f->lsock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	unlink(path);
	if (f->lsock < 0 || bind(f->lsock, (struct sockaddr *)&sa, sizeof(sa)) || listen(f->lsock, 4))
		return -errno;
	f->seg_fd = memfd_create("t-seg", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (f->seg_fd < 0 || ftruncate(f->seg_fd, T_SLOTS * PROTO_PAGE_SIZE))
		return -errno;
	f->seg = mmap(NULL, T_SLOTS * PROTO_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED,
		      f->seg_fd, 0);
	return f->seg == MAP_FAILED ? -errno : 0;
}

int main(void)
{
	struct vmm_mem_cfg cfg = { .size = T_PAGES * PROTO_PAGE_SIZE, .dedup = VMM_DEDUP_PHYSICAL,
				   .domain = "default", .name = "badpool", .cpu_pct = 100 };
	static uint8_t before[T_PAGES][PROTO_PAGE_SIZE], honest[PROTO_PAGE_SIZE];
	char dir[] = "/tmp/t-badpool-XXXXXX", path[64];
	struct t_fake f = { .sock = -1 };
	struct vmm_mem *m;
	double end;
	uint8_t *ram;

	log_init("t-badpool", LOG_WARN);
	if (!mkdtemp(dir))
		return T_FAIL;
	snprintf(path, sizeof(path), "%s/pool.sock", dir);
	if (t_setup(&f, path)) {
		printf("FAIL: fake pool setup: %s\n", strerror(errno));
		return T_FAIL;
	}
	cfg.pool_path = path;
	if (vmm_mem__create(&m, &cfg)) {
		printf("SKIP: cannot create the memory plane (userfaultfd needs root here?)\n");
		return T_SKIP;
	}
	ram = vmm_mem__hva(m, GPA(0), cfg.size);
	t_fill(m, WL_SHARED_RANDOM, 0, T_PAGES);
	memcpy(before, ram, sizeof(before));
	/* slot 0 holds page 5 exactly; slot 1 holds other bytes */
	memcpy(f.seg, before[5], PROTO_PAGE_SIZE);
	memcpy(honest, before[5], PROTO_PAGE_SIZE);
	memset(f.seg + PROTO_PAGE_SIZE, 0xee, PROTO_PAGE_SIZE);
	fcntl(f.seg_fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	pthread_create(&f.thr, NULL, t_fake_main, &f);
	vmm_mem__start(m);

	/* Wait until the VMM has offered (hashed and protected) its pages. */
	for (end = t_now() + 20; t_now() < end && !f.sq_idx; usleep(10000))
		;
	while (t_now() < end && proto_load_acquire(&f.sq_idx->tail) < 200)
		usleep(10000);
	T_CHECK(f.sq_idx && proto_load_acquire(&f.sq_idx->tail) >= 200, "the VMM never offered its pages");

	t_post(&f, 5, PROTO_V_MAP, 0, 0, PROTO_NO_STAGING);      /* honest */
	t_post(&f, 6, PROTO_V_MAP, 0, 1, PROTO_NO_STAGING);      /* other bytes */
	t_post(&f, 7, PROTO_V_MAP, 0, 99, PROTO_NO_STAGING);     /* slot out of range */
	t_post(&f, 1u << 30, PROTO_V_MAP, 0, 0, PROTO_NO_STAGING); /* page out of range */
	t_post(&f, 8, PROTO_V_MAP, 7, 0, PROTO_NO_STAGING);      /* no such segment */
	t_post(&f, 9, 99, 0, 0, PROTO_NO_STAGING);                /* unknown verdict */
	t_post(&f, 10, PROTO_V_DONE, 0, 0, 5000);                 /* unknown staging */
	t_post(&f, 11, PROTO_V_UPLOAD, 0, 0, PROTO_NO_STAGING);  /* upload nobody offered? fine */
	for (end = t_now() + 5; t_now() < end && (t_st(m).merges < 1 || t_st(m).merge_fail < 1);)
		usleep(10000);
	usleep(200000);
	{
		struct vmm_mem_stats st = t_st(m);

		printf("after the lies: merges %llu, refused %llu, bad verdicts %llu, connected %d\n",
		       (unsigned long long)st.merges, (unsigned long long)st.merge_fail,
		       (unsigned long long)st.bad_verdicts, st.pool_connected);
		T_CHECK(st.merges == 1, "the honest MAP did not merge (merges %llu)",
			(unsigned long long)st.merges);
		T_CHECK(st.merge_fail >= 1, "a MAP onto different bytes was not refused");
		T_CHECK(st.bad_verdicts >= 4, "garbage verdicts not counted (%llu)",
			(unsigned long long)st.bad_verdicts);
		T_CHECK(st.pool_connected, "a handful of bad verdicts already cost the connection");
	}
	T_CHECK(!memcmp(ram, before, sizeof(before)), "guest memory changed under a lying pool");

	/* A pool that keeps lying is hung up on; the guest keeps every byte. */
	for (int i = 0; i < 400; i++)
		t_post(&f, 12, 1000 + i, 0, 0, PROTO_NO_STAGING);
	for (end = t_now() + 5; t_now() < end && !f.hung_up;)
		usleep(10000);
	T_CHECK(f.hung_up, "the VMM kept talking to a pool that sends only garbage");
	T_CHECK(!t_st(m).pool_connected, "stats still say connected");
	T_CHECK(!memcmp(ram, before, sizeof(before)), "guest memory changed after the flood");

	/* The merged page is the guest's own: a write copies, the segment stays. */
	{
		uint8_t want = (uint8_t)~before[5][0];

		ram[5 * PROTO_PAGE_SIZE] = want;
		T_CHECK(ram[5 * PROTO_PAGE_SIZE] == want, "write to a merged page lost");
	}
	T_CHECK(!memcmp(f.seg, honest, PROTO_PAGE_SIZE), "a guest write reached the pool's segment");

	f.stop = 1;
	pthread_join(f.thr, NULL);
	vmm_mem__destroy(m);
	unlink(path);
	rmdir(dir);
	if (!failures)
		printf("PASS\n");
	return failures ? T_FAIL : T_PASS;
}
