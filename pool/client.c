/* client.c: the control socket: accept, peer checks, HELLO, SEG_REQ, STAT_REQ, exit. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "ev.h"
#include "log.h"
#include "pool.h"
#include "util.h"

#define POOL_MAX_PENDING_CONNS 64 /* connections that have not sent HELLO */

static void pool_client_ready(struct ev_loop *loop, int fd, void *data, int events);
static void pool_client_submit(struct ev_loop *loop, int fd, void *data, int events);
static void pool_client_exited(struct ev_loop *loop, int fd, void *data, int events);

static int pool_mkdir_parent(const char *path)
{
	char buf[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char *dir;

	snprintf(buf, sizeof(buf), "%s", path);
	dir = dirname(buf);
	for (char *s = dir + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = '\0';
		if (mkdir(dir, 0755) < 0 && errno != EEXIST)
			return -errno;
		*s = '/';
	}
	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/* Remove a socket file left by a dead pool, but never steal a live one. */
static int pool_clear_stale(const struct sockaddr_un *sa)
{
	struct stat st;
	int fd, ret;

	if (lstat(sa->sun_path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	ret = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
	close(fd);
	if (!ret)
		return -EADDRINUSE;
	if (errno != ECONNREFUSED && errno != ENOENT)
		return -errno;
	log_info("removing stale socket %s", sa->sun_path);
	return unlink(sa->sun_path) < 0 && errno != ENOENT ? -errno : 0;
}

static struct pool_client *pool_client_new(struct pool *p, int sock)
{
	struct pool_client *c = pool_mem__alloc(sizeof(*c));

	if (!c)
		return NULL;
	c->p = p;
	c->sock = sock;
	c->pidfd = c->ring_fd = c->submit_efd = c->complete_efd = -1;
	c->id = ++p->next_client_id;
	c->next = p->clients;
	if (p->clients)
		p->clients->prev = c;
	p->clients = c;
	return c;
}

static void pool_client_free(struct pool_client *c)
{
	struct pool *p = c->p;

	if (c->prev)
		c->prev->next = c->next;
	else
		p->clients = c->next;
	if (c->next)
		c->next->prev = c->prev;
	pool_htab__fini(&c->pages);
	pool_refmap__fini(&c->refmap);
	pool_mem__free(c, sizeof(*c));
}

static int pool_peer_ok(struct pool_client *c)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (getsockopt(c->sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return -errno;
	c->pid = cred.pid;
	c->uid = cred.uid;
	if (cred.uid != 0 && cred.uid != getuid()) {
		log_warn("refusing connection from pid %d uid %u (only root or uid %u)",
			 (int)cred.pid, cred.uid, getuid());
		return -EPERM;
	}
	return 0;
}

static uint32_t pool_pending_conns(struct pool *p)
{
	uint32_t n = 0;

	for (struct pool_client *c = p->clients; c; c = c->next)
		n += c->sock >= 0 && !c->hello;
	return n;
}

static void pool_accept(struct ev_loop *loop, int fd, void *data, int events)
{
	struct pool *p = data;

	for (;;) {
		struct timeval tv = { .tv_sec = 1 };
		struct pool_client *c;
		int s = accept4(fd, NULL, NULL, SOCK_CLOEXEC);

		if (s < 0) {
			if (errno != EAGAIN && errno != EINTR)
				log_warn("accept: %s", strerror(errno));
			return;
		}
		if (pool_pending_conns(p) >= POOL_MAX_PENDING_CONNS) {
			log_warn("too many connections without HELLO; refusing one");
			close(s);
			continue;
		}
		/* Replies are small; a peer that does not read them gets cut off. */
		setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		c = pool_client_new(p, s);
		if (!c) {
			close(s);
			continue;
		}
		if (pool_peer_ok(c) || ev_add(loop, s, EV_READ, pool_client_ready, c)) {
			close(s);
			pool_client_free(c);
			continue;
		}
		log_debug("connection %u from pid %d", c->id, (int)c->pid);
	}
}

int pool_client__listen(struct pool *p)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, ret;

	if (strlen(p->conf.socket) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, p->conf.socket);
	ret = pool_mkdir_parent(sa.sun_path);
	if (ret) {
		log_err("cannot create the directory of %s: %s", sa.sun_path, strerror(-ret));
		return ret;
	}
	ret = pool_clear_stale(&sa);
	if (ret) {
		log_err("%s: %s", sa.sun_path, ret == -EADDRINUSE ?
			"another pool is listening there" : strerror(-ret));
		return ret;
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(sa.sun_path, 0660) < 0 ||
	    listen(fd, 64) < 0) {
		ret = -errno;
		log_err("cannot listen on %s: %s", sa.sun_path, strerror(errno));
		close(fd);
		return ret;
	}
	ret = ev_add(p->loop, fd, EV_READ, pool_accept, p);
	if (ret) {
		close(fd);
		unlink(sa.sun_path);
		return ret;
	}
	p->listen_fd = fd;
	return 0;
}

static int pool_send(struct pool_client *c, void *msg, uint32_t len, uint16_t type,
		     uint32_t flags, const int *fds, int nfds)
{
	struct proto_hdr *h = msg;
	ssize_t n;

	proto_hdr_init(h, type, len, flags);
	n = util_send_fds(c->sock, msg, len, fds, nfds);
	if (n < 0)
		return (int)n;
	return n == len ? 0 : -EIO;
}

static struct pool_domain *pool_domain_get(struct pool *p, const char *name)
{
	struct pool_domain *d;

	for (d = p->domains; d; d = d->next)
		if (!strcmp(d->name, name))
			return d;
	d = pool_mem__alloc(sizeof(*d));
	if (!d)
		return NULL;
	snprintf(d->name, sizeof(d->name), "%s", name);
	d->id = ++p->next_domain_id;
	d->next = p->domains;
	p->domains = d;
	return d;
}

static bool pool_domain_valid(const char *s, size_t max)
{
	size_t len = strnlen(s, max);

	if (!len || len == max)
		return false;
	for (size_t i = 0; i < len; i++) {
		char ch = s[i];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == '-'))
			return false;
	}
	return true;
}

/* Check a HELLO; returns 0 or -errno with a reason in @why. */
static int pool_hello_check(struct pool *p, struct pool_client *c, const struct proto_hello *m,
			    size_t len, char *why, size_t whylen)
{
	if (len != sizeof(*m) || m->hdr.len != sizeof(*m)) {
		snprintf(why, whylen, "HELLO must be %zu bytes", sizeof(*m));
		return -EPROTO;
	}
	if (c->hello) {
		snprintf(why, whylen, "HELLO sent twice");
		return -EINVAL;
	}
	if (!p->conf.physical) {
		snprintf(why, whylen, "page sharing is off in this pool (physical = off)");
		return -EOPNOTSUPP;
	}
	if (!pool_domain_valid(m->domain, sizeof(m->domain))) {
		snprintf(why, whylen, "bad domain: 1-%d chars of [A-Za-z0-9_.-]", PROTO_DOMAIN_MAX - 1);
		return -EINVAL;
	}
	if (strnlen(m->name, sizeof(m->name)) == sizeof(m->name)) {
		snprintf(why, whylen, "name is not NUL terminated");
		return -EINVAL;
	}
	if (!m->guest_pages || m->guest_pages > PROTO_MAX_GUEST_PAGES) {
		snprintf(why, whylen, "guest_pages must be 1..%llu",
			 (unsigned long long)PROTO_MAX_GUEST_PAGES);
		return -EINVAL;
	}
	if (p->nhello >= p->conf.max_clients) {
		snprintf(why, whylen, "too many clients (max-clients = %llu)",
			 (unsigned long long)p->conf.max_clients);
		return -EBUSY;
	}
	return 0;
}

static int pool_hello_setup(struct pool *p, struct pool_client *c, const struct proto_hello *m)
{
	int ret;

	c->pidfd = (int)syscall(SYS_pidfd_open, c->pid, 0);
	if (c->pidfd < 0)
		return -errno;
	c->dom = pool_domain_get(p, m->domain);
	if (!c->dom || pool_htab__init(&c->pages, 256) || pool_refmap__init(&c->refmap, m->guest_pages))
		return -ENOMEM;
	ret = pool_ring__create(c);
	if (ret)
		return ret;
	ret = ev_add(p->loop, c->submit_efd, EV_READ, pool_client_submit, c);
	if (!ret)
		ret = ev_add(p->loop, c->pidfd, EV_READ, pool_client_exited, c);
	return ret;
}

static int pool_hello(struct pool *p, struct pool_client *c, const void *buf, size_t len)
{
	const struct proto_hello *m = buf;
	struct proto_hello_reply r = { .seg_pages = p->store.seg_pages };
	int ret, fds[3];

	ret = pool_hello_check(p, c, m, len, r.message, sizeof(r.message));
	if (!ret) {
		ret = pool_hello_setup(p, c, m);
		if (ret)
			snprintf(r.message, sizeof(r.message), "pool cannot set up: %s", strerror(-ret));
	}
	r.status = ret;
	if (ret) {
		log_warn("client %u (pid %d): HELLO refused: %s", c->id, (int)c->pid, r.message);
		pool_send(c, &r, sizeof(r), PROTO_MSG_HELLO_REPLY, 0, NULL, 0);
		return ret; /* caller closes; the half-built client is freed there */
	}
	c->hello = true;
	c->guest_pages = m->guest_pages;
	for (size_t i = 0; i < sizeof(c->name) - 1 && m->name[i]; i++)
		c->name[i] = m->name[i] >= 0x20 && m->name[i] < 0x7f ? m->name[i] : '?';
	c->dom->clients++;
	p->nhello++;
	r.client_id = c->id;
	r.ring_size = c->ring_size;
	fds[0] = c->ring_fd;
	fds[1] = c->submit_efd;
	fds[2] = c->complete_efd;
	ret = pool_send(c, &r, sizeof(r), PROTO_MSG_HELLO_REPLY, 0, fds, 3);
	/* The pool keeps its mapping; the client holds the memfd now. */
	close(c->ring_fd);
	c->ring_fd = -1;
	log_info("client %u: pid %d name '%s' domain '%s' %llu pages", c->id, (int)c->pid,
		 c->name, c->dom->name, (unsigned long long)c->guest_pages);
	return ret;
}

static int pool_seg_req(struct pool *p, struct pool_client *c, const void *buf, size_t len)
{
	const struct proto_seg_req *m = buf;
	struct proto_seg_reply r = { .status = -EINVAL };
	struct pool_seg *sg;

	if (len != sizeof(*m) || !c->hello)
		return -EPROTO;
	r.seg = m->seg;
	sg = pool_store__seg(&p->store, m->seg);
	if (!sg) {
		r.status = -ENOENT;
		return pool_send(c, &r, sizeof(r), PROTO_MSG_SEG_REPLY, 0, NULL, 0);
	}
	r.status = 0;
	r.pages = p->store.seg_pages;
	return pool_send(c, &r, sizeof(r), PROTO_MSG_SEG_REPLY, 0, &sg->fd, 1);
}

static int pool_stat_req(struct pool *p, struct pool_client *c, const void *buf, size_t len)
{
	const struct proto_stat_req *m = buf;
	const size_t chunk = PROTO_MSG_MAX - sizeof(struct proto_hdr);
	char *json, *msg;
	size_t total, off = 0;
	int ret = 0;

	if (len != sizeof(*m))
		return -EPROTO;
	json = pool_stat__json(p, m->hdr.flags & PROTO_STAT_AUDIT);
	msg = malloc(PROTO_MSG_MAX);
	if (!json || !msg) {
		free(json);
		free(msg);
		return -ENOMEM;
	}
	total = strlen(json);
	do {
		size_t n = total - off < chunk ? total - off : chunk;

		memcpy(msg + sizeof(struct proto_hdr), json + off, n);
		off += n;
		ret = pool_send(c, msg, (uint32_t)(sizeof(struct proto_hdr) + n),
				PROTO_MSG_STAT_REPLY, off < total ? PROTO_STAT_MORE : 0, NULL, 0);
	} while (!ret && off < total);
	free(msg);
	free(json);
	return ret;
}

/* One control message; a nonzero return closes the connection. */
static int pool_client_msg(struct pool *p, struct pool_client *c, const void *buf, size_t len)
{
	const struct proto_hdr *h = buf;

	if (len < sizeof(*h) || h->magic != PROTO_MAGIC || h->version != PROTO_VERSION ||
	    h->len != len) {
		if (len >= sizeof(*h) && h->type == PROTO_MSG_HELLO) {
			struct proto_hello_reply r = { .status = -EPROTO };

			snprintf(r.message, sizeof(r.message),
				 "bad magic or protocol version (pool speaks %d)", PROTO_VERSION);
			pool_send(c, &r, sizeof(r), PROTO_MSG_HELLO_REPLY, 0, NULL, 0);
		}
		log_warn("connection %u (pid %d): bad message header", c->id, (int)c->pid);
		return -EPROTO;
	}
	switch (h->type) {
	case PROTO_MSG_HELLO:
		return pool_hello(p, c, buf, len);
	case PROTO_MSG_SEG_REQ:
		return pool_seg_req(p, c, buf, len);
	case PROTO_MSG_STAT_REQ:
		return pool_stat_req(p, c, buf, len);
	}
	log_warn("connection %u: unknown message type %u", c->id, h->type);
	return -EPROTO;
}

static void pool_client_ready(struct ev_loop *loop, int fd, void *data, int events)
{
	struct pool_client *c = data;
	char buf[256];

	for (;;) {
		/* Plain recv: fds a peer pushes at us are discarded by the kernel. */
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);

		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (n <= 0 || (size_t)n > sizeof(buf) || pool_client_msg(c->p, c, buf, (size_t)n)) {
			pool_client__detach(c, n == 0 ? "closed its socket" : "protocol error");
			return;
		}
	}
}

static void pool_client_submit(struct ev_loop *loop, int fd, void *data, int events)
{
	struct pool_client *c = data;
	uint64_t v;

	if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_debug("client %u: submit eventfd: %s", c->id, strerror(errno));
	c->pending = pool_ring__serve(c);
	if (c->dead)
		pool_client__detach(c, "bad ring");
}

/* Free everything of @c now: its process is gone (or the pool stops). */
static void pool_client_release(struct pool_client *c)
{
	struct pool *p = c->p;

	if (c->sock >= 0)
		pool_client__detach(c, "exited");
	if (c->hello) {
		pool_index__release(p, c);
		c->dom->clients--;
	}
	if (c->pidfd >= 0) {
		ev_del(p->loop, c->pidfd);
		close(c->pidfd);
	}
	pool_client_free(c);
}

static void pool_client_exited(struct ev_loop *loop, int fd, void *data, int events)
{
	struct pool_client *c = data;

	log_info("client %u: process %d exited; releasing %llu references", c->id, (int)c->pid,
		 (unsigned long long)c->cnt.pages_mapped);
	pool_client_release(c);
}

void pool_client__detach(struct pool_client *c, const char *why)
{
	struct pool *p = c->p;

	if (c->sock < 0)
		return;
	log_info("client %u (pid %d): %s; %s", c->id, (int)c->pid, why,
		 c->hello ? "keeping its references until it exits" : "closed");
	ev_del(p->loop, c->sock);
	close(c->sock);
	c->sock = -1;
	c->dead = true;
	if (c->submit_efd >= 0)
		ev_del(p->loop, c->submit_efd);
	pool_ring__destroy(c);
	if (!c->hello) {
		if (c->pidfd >= 0) {
			ev_del(p->loop, c->pidfd);
			close(c->pidfd);
		}
		pool_client_free(c);
		return;
	}
	p->nhello--;
	pool_index__detach(p, c);
}

/*
 * Before the loop sleeps: detach clients marked dead from inside the merge
 * path, and serve clients that hit the fairness cap. Returns true while
 * some client still has SQEs waiting.
 */
bool pool_client__idle(struct ev_loop *loop, void *data)
{
	struct pool *p = data;
	struct pool_client *c, *next;
	bool more = false;

	for (c = p->clients; c; c = next) {
		next = c->next;
		if (c->dead && c->sock >= 0) {
			pool_client__detach(c, "misbehaved");
			continue;
		}
		if (c->pending)
			c->pending = pool_ring__serve(c);
		if (c->ovf_n)
			pool_ring__flush(c);
		pool_ring__kick(c);
		more |= c->pending;
	}
	/* Serving may have marked clients dead again; next turn detaches them. */
	for (c = p->clients; c; c = c->next)
		more |= c->dead && c->sock >= 0;
	return more;
}

void pool_client__free_all(struct pool *p)
{
	while (p->clients)
		pool_client_release(p->clients);
	/* Domains live as long as the daemon (their ids key the index). */
	while (p->domains) {
		struct pool_domain *d = p->domains;

		p->domains = d->next;
		pool_mem__free(d, sizeof(*d));
	}
}
