/* tclient.c: shared test helpers: start/stop a pool, a raw ring client, stats. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tclient.h"
#include "util.h"

static struct t_pool *t_running;

const char *t_pool_bin(void)
{
	const char *b = getenv("PVISOR_POOL_BIN");

	return b && *b ? b : "build/pool/pvisor-pool";
}

static void t_write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f) {
		fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
		exit(T_EXIT_FAIL);
	}
	fputs(text ? text : "", f);
	fclose(f);
}

static bool t_sock_up(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	bool ok;

	if (strlen(path) >= sizeof(sa.sun_path))
		return false;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	ok = !connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	close(fd);
	return ok;
}

void t_pool_start(struct t_pool *p, const char *conf_text, ...)
{
	const char *bin = t_pool_bin();
	char *argv[32];
	int argc = 0;
	va_list ap;

	if (access(bin, X_OK)) {
		printf("SKIP: pool binary %s not found (set PVISOR_POOL_BIN)\n", bin);
		exit(T_EXIT_SKIP);
	}
	snprintf(p->dir, sizeof(p->dir), "/tmp/pvpool-test-XXXXXX");
	if (!mkdtemp(p->dir))
		t_fail("mkdtemp: %s", strerror(errno));
	snprintf(p->sock, sizeof(p->sock), "%s/run/pool.sock", p->dir);
	snprintf(p->conf, sizeof(p->conf), "%s/pool.conf", p->dir);
	snprintf(p->log, sizeof(p->log), "%s/pool.log", p->dir);
	t_write_file(p->conf, conf_text);
	argv[argc++] = (char *)bin;
	argv[argc++] = "--config";
	argv[argc++] = p->conf;
	argv[argc++] = "--socket";
	argv[argc++] = p->sock;
	va_start(ap, conf_text);
	for (char *a; argc < 30 && (a = va_arg(ap, char *));)
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;
	p->pid = fork();
	if (p->pid == 0) {
		int fd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		/* A test that dies must not leave its pool behind. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(fd, 2);
		execv(bin, argv);
		_exit(127);
	}
	t_running = p;
	for (int i = 0; i < 200; i++) {
		int st;

		if (t_sock_up(p->sock))
			return;
		if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
			p->pid = 0;
			t_fail("pool exited at start (see %s)", p->log);
		}
		usleep(10000);
	}
	t_fail("pool did not come up at %s", p->sock);
}

void t_pool_stop(struct t_pool *p)
{
	int st = 0;

	if (p->pid > 0) {
		kill(p->pid, SIGTERM);
		waitpid(p->pid, &st, 0);
		p->pid = 0;
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "pool log:\n");
			t_running = NULL;
			t_fail("pool did not exit cleanly (status 0x%x)", st);
		}
	}
	if (!getenv("T_KEEP")) {
		char cmd[256];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", p->dir);
		if (system(cmd))
			fprintf(stderr, "cannot remove %s\n", p->dir);
	}
	t_running = NULL;
}

void t_pool_cleanup(void)
{
	if (t_running && t_running->pid > 0) {
		char cmd[300];

		snprintf(cmd, sizeof(cmd), "tail -20 '%s' >&2", t_running->log);
		if (system(cmd) != 0)
			fprintf(stderr, "(no pool log)\n");
		kill(t_running->pid, SIGKILL);
		waitpid(t_running->pid, NULL, 0);
		t_running->pid = 0;
	}
}

static int t_sock_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (strlen(path) >= sizeof(sa.sun_path))
		t_fail("socket path too long: %s", path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		t_fail("connect %s: %s", path, strerror(errno));
	return fd;
}

int t_hello(struct t_client *c, const char *sock, const char *domain, const char *name,
	    uint64_t guest_pages, char *msg, size_t msglen)
{
	struct proto_hello m = { .guest_pages = guest_pages };
	struct proto_hello_reply r;
	int fds[3], nfds = 3;
	ssize_t n;

	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < 64; i++)
		c->segfd[i] = -1;
	c->submit_efd = c->complete_efd = -1;
	c->sock = t_sock_connect(sock);
	proto_hdr_init(&m.hdr, PROTO_MSG_HELLO, sizeof(m), 0);
	snprintf(m.domain, sizeof(m.domain), "%s", domain);
	snprintf(m.name, sizeof(m.name), "%s", name);
	if (send(c->sock, &m, sizeof(m), 0) != sizeof(m))
		t_fail("send HELLO: %s", strerror(errno));
	n = util_recv_fds(c->sock, &r, sizeof(r), fds, &nfds);
	if (n != sizeof(r) || r.hdr.type != PROTO_MSG_HELLO_REPLY)
		t_fail("bad HELLO reply (%zd bytes)", n);
	if (msg)
		snprintf(msg, msglen, "%.*s", (int)sizeof(r.message), r.message);
	if (r.status)
		return r.status;
	if (nfds != 3)
		t_fail("HELLO reply carried %d fds", nfds);
	c->ring = mmap(NULL, r.ring_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (c->ring == MAP_FAILED)
		t_fail("mmap ring: %s", strerror(errno));
	close(fds[0]);
	c->ring_size = r.ring_size;
	c->submit_efd = fds[1];
	c->complete_efd = fds[2];
	c->client_id = r.client_id;
	c->seg_pages = r.seg_pages;
	memcpy(&c->hdr, c->ring, sizeof(c->hdr));
	t_check(c->hdr.magic == PROTO_RING_MAGIC && c->hdr.size == r.ring_size, "ring header");
	c->sq = (struct proto_ring_idx *)(c->ring + c->hdr.sq_off);
	c->sqes = (struct proto_sqe *)(c->sq + 1);
	c->cq = (struct proto_ring_idx *)(c->ring + c->hdr.cq_off);
	c->cqes = (struct proto_cqe *)(c->cq + 1);
	c->staging = c->ring + c->hdr.staging_off;
	return 0;
}

void t_connect(struct t_client *c, const char *sock, const char *domain, uint64_t pages)
{
	char msg[80];
	int ret = t_hello(c, sock, domain, "test", pages, msg, sizeof(msg));

	if (ret)
		t_fail("HELLO refused: %d %s", ret, msg);
}

void t_close(struct t_client *c)
{
	if (c->ring)
		munmap(c->ring, c->ring_size);
	c->ring = NULL;
	for (int i = 0; i < 64; i++)
		if (c->segfd[i] >= 0)
			close(c->segfd[i]);
	if (c->sock >= 0)
		close(c->sock);
	if (c->submit_efd >= 0)
		close(c->submit_efd);
	if (c->complete_efd >= 0)
		close(c->complete_efd);
	c->sock = c->submit_efd = c->complete_efd = -1;
}

bool t_try_submit(struct t_client *c, const struct proto_sqe *q, int ms)
{
	uint32_t tail = c->sq->tail, head;
	uint64_t one = 1;

	for (int i = 0; (head = proto_load_acquire(&c->sq->head)), tail - head >= c->hdr.sq_entries;
	     i++) {
		if (i >= ms)
			return false;
		usleep(1000);
	}
	c->sqes[tail & (c->hdr.sq_entries - 1)] = *q;
	proto_store_release(&c->sq->tail, tail + 1);
	/* Store tail, full fence, load head: the pool does the mirror image. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	head = proto_load_acquire(&c->sq->head);
	if (tail == head && write(c->submit_efd, &one, sizeof(one)) != sizeof(one))
		t_fail("submit eventfd: %s", strerror(errno));
	return true;
}

void t_submit(struct t_client *c, const struct proto_sqe *q)
{
	if (!t_try_submit(c, q, 5000))
		t_fail("submission ring stays full");
}

void t_offer(struct t_client *c, uint64_t page, const void *data)
{
	struct proto_sqe q = { .page = page, .op = PROTO_OP_OFFER };

	util_hash_page(data, q.hash);
	t_submit(c, &q);
}

void t_upload(struct t_client *c, uint64_t page, const void *data, uint32_t staging)
{
	struct proto_sqe q = { .page = page, .op = PROTO_OP_UPLOAD, .staging = staging };

	util_hash_page(data, q.hash);
	memcpy(c->staging + (uint64_t)staging * PROTO_PAGE_SIZE, data, PROTO_PAGE_SIZE);
	t_submit(c, &q);
}

void t_drop(struct t_client *c, uint64_t page, uint32_t seg, uint32_t slot)
{
	struct proto_sqe q = { .page = page, .op = PROTO_OP_DROP, .seg = seg, .slot = slot };

	t_submit(c, &q);
}

bool t_wait_cqe(struct t_client *c, struct proto_cqe *out, int ms)
{
	uint64_t deadline = util_now_ns() + (uint64_t)ms * 1000000ull;

	for (;;) {
		uint32_t head = c->cq->head, tail = proto_load_acquire(&c->cq->tail);
		struct pollfd pfd = { .fd = c->complete_efd, .events = POLLIN };
		uint64_t v;

		if (head != tail) {
			*out = c->cqes[head & (c->hdr.cq_entries - 1)];
			proto_store_release(&c->cq->head, head + 1);
			return true;
		}
		if (util_now_ns() >= deadline)
			return false;
		poll(&pfd, 1, 10);
		if ((pfd.revents & POLLIN) && read(c->complete_efd, &v, sizeof(v)) < 0)
			v = 0;
	}
}

bool t_no_cqe(struct t_client *c, int ms)
{
	struct proto_cqe v;

	return !t_wait_cqe(c, &v, ms);
}

int t_seg_fd(struct t_client *c, uint32_t seg)
{
	struct proto_seg_req m = { .seg = seg };
	struct proto_seg_reply r;
	int fd = -1, nfds = 1;

	if (seg < 64 && c->segfd[seg] >= 0)
		return c->segfd[seg];
	proto_hdr_init(&m.hdr, PROTO_MSG_SEG_REQ, sizeof(m), 0);
	if (send(c->sock, &m, sizeof(m), 0) != sizeof(m))
		t_fail("send SEG_REQ: %s", strerror(errno));
	if (util_recv_fds(c->sock, &r, sizeof(r), &fd, &nfds) != sizeof(r) ||
	    r.hdr.type != PROTO_MSG_SEG_REPLY)
		t_fail("bad SEG_REPLY");
	if (r.status || nfds != 1)
		t_fail("SEG_REQ %u refused: %d", seg, r.status);
	if (seg < 64)
		c->segfd[seg] = fd;
	return fd;
}

void *t_map_slot(struct t_client *c, uint32_t seg, uint32_t slot)
{
	int fd = t_seg_fd(c, seg);
	void *p = mmap(NULL, PROTO_PAGE_SIZE, PROT_READ, MAP_PRIVATE, fd,
		       (off_t)slot * PROTO_PAGE_SIZE);

	if (p == MAP_FAILED)
		t_fail("mmap slot %u/%u: %s", seg, slot, strerror(errno));
	if (seg >= 64)
		close(fd);
	return p;
}

struct json_object *t_stat(const char *sock, bool audit)
{
	struct proto_stat_req m;
	char *buf = malloc(PROTO_MSG_MAX), *text = calloc(1, 1);
	size_t used = 0;
	struct json_object *o;
	int fd = t_sock_connect(sock);

	proto_hdr_init(&m.hdr, PROTO_MSG_STAT_REQ, sizeof(m),
		       PROTO_STAT_JSON | (audit ? PROTO_STAT_AUDIT : 0));
	if (send(fd, &m, sizeof(m), 0) != sizeof(m))
		t_fail("send STAT_REQ");
	for (;;) {
		struct proto_hdr *h = (struct proto_hdr *)buf;
		ssize_t n = recv(fd, buf, PROTO_MSG_MAX, 0);

		if (n < (ssize_t)sizeof(*h) || h->type != PROTO_MSG_STAT_REPLY || h->len != n)
			t_fail("bad STAT_REPLY");
		text = realloc(text, used + (size_t)n + 1);
		memcpy(text + used, buf + sizeof(*h), (size_t)n - sizeof(*h));
		used += (size_t)n - sizeof(*h);
		text[used] = '\0';
		if (!(h->flags & PROTO_STAT_MORE))
			break;
	}
	close(fd);
	o = json_tokener_parse(text);
	if (!o)
		t_fail("stat JSON does not parse: %s", text);
	free(text);
	free(buf);
	return o;
}

int64_t t_stat_get(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v))
		t_fail("stat has no '%s'", key);
	return json_object_get_int64(v);
}

static struct json_object *t_find(struct json_object *o, const char *arr, const char *key,
				  const char *sval, int64_t ival)
{
	struct json_object *a, *v;

	if (!json_object_object_get_ex(o, arr, &a))
		t_fail("stat has no '%s'", arr);
	for (size_t i = 0; i < json_object_array_length(a); i++) {
		struct json_object *e = json_object_array_get_idx(a, i);

		if (!json_object_object_get_ex(e, key, &v))
			continue;
		if (sval ? !strcmp(json_object_get_string(v), sval) : json_object_get_int64(v) == ival)
			return e;
	}
	return NULL;
}

int64_t t_stat_client(struct json_object *o, uint32_t id, const char *key)
{
	struct json_object *e = t_find(o, "client_list", "id", NULL, id);

	return e ? t_stat_get(e, key) : -1;
}

int64_t t_stat_domain(struct json_object *o, const char *name, const char *key)
{
	struct json_object *e = t_find(o, "domains", "name", name, 0);

	return e ? t_stat_get(e, key) : -1;
}

void t_fill(void *page, uint64_t seed)
{
	uint64_t *w = page, x = seed * 0x9e3779b97f4a7c15ull + 1;

	for (unsigned i = 0; i < PROTO_PAGE_SIZE / 8; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		w[i] = x;
	}
}

void t_merge(struct t_client *a, uint64_t pa, struct t_client *b, uint64_t pb,
	     const void *data, struct proto_cqe *ma, struct proto_cqe *mb)
{
	struct proto_cqe v;

	t_offer(a, pa, data);
	t_offer(b, pb, data);
	t_check(t_wait_cqe(b, &v, 2000), "no verdict for the second OFFER");
	t_check(v.verdict == PROTO_V_UPLOAD && v.page == pb, "expected UPLOAD, got %u", v.verdict);
	t_upload(b, pb, data, 0);
	t_check(t_wait_cqe(b, mb, 2000), "no verdict for UPLOAD");
	t_check(mb->verdict == PROTO_V_MAP && mb->page == pb && mb->staging == 0,
		"expected MAP to uploader, got %u", mb->verdict);
	t_check(t_wait_cqe(a, ma, 2000), "first candidate got no MAP");
	t_check(ma->verdict == PROTO_V_MAP && ma->page == pa && ma->seg == mb->seg &&
		ma->slot == mb->slot, "candidate MAP differs");
}
