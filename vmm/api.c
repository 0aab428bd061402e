/* api.c: the API socket thread and its commands (fill, verify, digest, poke, stats, quit). */
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "api.h"
#include "log.h"
#include "mem.h"
#include "proto.h"
#include "synth.h"
#include "workload.h"

/*
 * DOC: the API socket
 *
 * A SOCK_STREAM Unix socket served by one small thread with poll(). Each
 * request is one line of words ("verify 0 16384 shared-random 1"), each reply
 * one JSON object on one line with "ok" true or false and, when false, an
 * "error" string. Every number is checked before it reaches guest memory:
 * ranges must lie inside guest RAM, offsets inside a page, bytes in 0..255.
 * Commands that touch guest RAM run on the guest's first vCPU thread
 * (vmm_synth__call), never here and never on the dedup thread; stats and quit
 * are answered here so that a busy guest can still be watched and stopped.
 */

#define API_MAX_CLIENTS 16
#define API_MAX_WORDS   8
/* A client that does not read its reply within this time is dropped. */
#define API_SEND_TIMEOUT_S 2

struct api_client {
	int fd;                          /* -1 when the slot is free */
	size_t used;                     /* bytes in buf */
	char buf[VMM_API_LINE_MAX];      /* partial request line */
};

/* struct vmm_api - the listening socket, its thread and its clients */
struct vmm_api {
	struct vmm_api_cfg cfg;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* socket file to unlink */
	int listen_fd;
	int wake_fd;                     /* eventfd: stop the thread */
	pthread_t thread;
	struct api_client clients[API_MAX_CLIENTS];
};

struct api_req {
	int argc;
	char *argv[API_MAX_WORDS];
};

static struct json_object *api_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static struct json_object *api_error(const char *fmt, ...)
{
	struct json_object *r = json_object_new_object();
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	json_object_object_add(r, "ok", json_object_new_boolean(0));
	json_object_object_add(r, "error", json_object_new_string(msg));
	return r;
}

static struct json_object *api_ok(void)
{
	struct json_object *r = json_object_new_object();

	json_object_object_add(r, "ok", json_object_new_boolean(1));
	return r;
}

/* A decimal or 0x number in [0, max]; no sign, no junk. */
static int api_num(const char *s, uint64_t max, uint64_t *out)
{
	unsigned long long v;
	char *end;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || *end || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

/* argv[1], argv[2] = FIRST COUNT: a non-empty page range inside guest RAM. */
static struct json_object *api_range(struct vmm_api *a, struct api_req *rq, struct vmm_synth_cmd *c)
{
	uint64_t pages = vmm_mem__size(a->cfg.mem) >> PROTO_PAGE_SHIFT;

	if (api_num(rq->argv[1], UINT64_MAX, &c->first) || c->first >= pages)
		return api_error("FIRST '%s' is not a page of guest RAM (0..%" PRIu64 ")",
				 rq->argv[1], pages - 1);
	if (api_num(rq->argv[2], UINT64_MAX, &c->count) || !c->count ||
	    c->count > pages - c->first)
		return api_error("COUNT '%s' is not 1..%" PRIu64 " (pages left after page %" PRIu64 ")",
				 rq->argv[2], pages - c->first, c->first);
	return NULL;
}

/* argv[3..] = WORKLOAD SEED [INSTANCE] */
static struct json_object *api_workload(struct api_req *rq, struct vmm_synth_cmd *c)
{
	c->kind = wl_parse(rq->argv[3]);
	if (c->kind < 0)
		return api_error("unknown workload '%s' (repeated|shared-random|unique-random|zeros|patterns)",
				 rq->argv[3]);
	if (api_num(rq->argv[4], UINT64_MAX, &c->seed))
		return api_error("SEED '%s' is not a number", rq->argv[4]);
	c->instance = 0;
	if (rq->argc > 5 && api_num(rq->argv[5], UINT64_MAX, &c->instance))
		return api_error("INSTANCE '%s' is not a number", rq->argv[5]);
	return NULL;
}

/* Milliseconds with three decimals, printed as such (not as %.17g noise). */
static struct json_object *api_ms(uint64_t ns)
{
	char txt[32];

	snprintf(txt, sizeof(txt), "%.3f", (double)ns / 1e6);
	return json_object_new_double_s((double)ns / 1e6, txt);
}

/* Hand a parsed command to the guest thread. */
static struct json_object *api_call(struct vmm_api *a, struct vmm_synth_cmd *c)
{
	int ret;

	if (!a->cfg.synth)
		return api_error("fill, verify, digest and poke need --guest synthetic "
				 "(a KVM guest's RAM belongs to its own software)");
	if (!vmm_synth__ready(a->cfg.synth))
		return api_error("guest not ready yet (start-up fill still running)");
	ret = vmm_synth__call(a->cfg.synth, c);
	if (!ret)
		ret = c->ret;
	if (ret == -ESHUTDOWN)
		return api_error("guest is stopping");
	if (ret)
		return api_error("guest command failed: %s", strerror(-ret));
	return NULL;
}

static struct json_object *api_fill_verify(struct vmm_api *a, struct api_req *rq)
{
	struct vmm_synth_cmd c = { .op = strcmp(rq->argv[0], "fill") ? VMM_SYNTH_VERIFY : VMM_SYNTH_FILL };
	struct json_object *r;

	if ((r = api_range(a, rq, &c)) || (r = api_workload(rq, &c)) || (r = api_call(a, &c)))
		return r;
	if (c.op == VMM_SYNTH_VERIFY && c.mismatched) {
		r = api_error("%" PRIu64 " of %" PRIu64 " pages differ, first at page %" PRIu64,
			      c.mismatched, c.count, c.first_bad);
	} else {
		r = api_ok();
	}
	json_object_object_add(r, "pages", json_object_new_uint64(c.count));
	if (c.op == VMM_SYNTH_VERIFY) {
		json_object_object_add(r, "mismatched", json_object_new_uint64(c.mismatched));
		json_object_object_add(r, "first_bad", c.mismatched ?
				       json_object_new_uint64(c.first_bad) : NULL);
	}
	json_object_object_add(r, "ms", api_ms(c.ns));
	return r;
}

static struct json_object *api_digest(struct vmm_api *a, struct api_req *rq)
{
	struct vmm_synth_cmd c = { .op = VMM_SYNTH_DIGEST };
	struct json_object *r;
	char hex[33];

	if ((r = api_range(a, rq, &c)) || (r = api_call(a, &c)))
		return r;
	/* Canonical XXH128 order: high word first. */
	snprintf(hex, sizeof(hex), "%016" PRIx64 "%016" PRIx64, c.digest[1], c.digest[0]);
	r = api_ok();
	json_object_object_add(r, "pages", json_object_new_uint64(c.count));
	json_object_object_add(r, "digest", json_object_new_string(hex));
	json_object_object_add(r, "ms", api_ms(c.ns));
	return r;
}

static struct json_object *api_poke(struct vmm_api *a, struct api_req *rq)
{
	struct vmm_synth_cmd c = { .op = VMM_SYNTH_POKE };
	struct json_object *r;
	uint64_t v;

	if ((r = api_range(a, rq, &c)))
		return r;
	if (api_num(rq->argv[3], PROTO_PAGE_SIZE - 1, &v))
		return api_error("OFFSET '%s' is not 0..%u", rq->argv[3], PROTO_PAGE_SIZE - 1);
	c.offset = (unsigned)v;
	if (api_num(rq->argv[4], 255, &v))
		return api_error("BYTE '%s' is not 0..255", rq->argv[4]);
	c.byte = (uint8_t)v;
	if ((r = api_call(a, &c)))
		return r;
	r = api_ok();
	json_object_object_add(r, "pages", json_object_new_uint64(c.count));
	json_object_object_add(r, "ms", api_ms(c.ns));
	return r;
}

static struct json_object *api_stats(struct vmm_api *a, struct api_req *rq)
{
	struct json_object *r = api_ok();
	bool ready = !a->cfg.synth || vmm_synth__ready(a->cfg.synth); /* a KVM guest: always */

	vmm_mem__stats_json(a->cfg.mem, r);
	json_object_object_add(r, "ready", json_object_new_boolean(ready));
	json_object_object_add(r, "instance", json_object_new_uint64(a->cfg.instance));
	json_object_object_add(r, "workload", json_object_new_string(a->cfg.workload));
	json_object_object_add(r, "data_pages", json_object_new_uint64(a->cfg.data_pages));
	json_object_object_add(r, "pid", json_object_new_int64(getpid()));
	json_object_object_add(r, "name", json_object_new_string(a->cfg.name));
	return r;
}

static struct json_object *api_quit(struct vmm_api *a, struct api_req *rq)
{
	struct json_object *r = api_ok();

	json_object_object_add(r, "quitting", json_object_new_boolean(1));
	return r;
}

/* struct api_cmd - one command: its words and the handler that answers it */
static const struct api_cmd {
	const char *name;
	int min_args, max_args;  /* words after the command name */
	const char *usage;
	struct json_object *(*fn)(struct vmm_api *a, struct api_req *rq);
} api_cmds[] = {
	{ "fill", 4, 5, "fill FIRST COUNT WORKLOAD SEED [INSTANCE]", api_fill_verify },
	{ "verify", 4, 5, "verify FIRST COUNT WORKLOAD SEED [INSTANCE]", api_fill_verify },
	{ "digest", 2, 2, "digest FIRST COUNT", api_digest },
	{ "poke", 4, 4, "poke FIRST COUNT OFFSET BYTE", api_poke },
	{ "stats", 0, 0, "stats", api_stats },
	{ "quit", 0, 0, "quit", api_quit },
};

static struct json_object *api_dispatch(struct vmm_api *a, char *line, bool *quit)
{
	struct api_req rq = { 0 };
	char *save = NULL, *w;

	for (w = strtok_r(line, " \t\r", &save); w; w = strtok_r(NULL, " \t\r", &save)) {
		if (rq.argc == API_MAX_WORDS)
			return api_error("too many words in request");
		rq.argv[rq.argc++] = w;
	}
	if (!rq.argc)
		return api_error("empty request (commands: fill, verify, digest, poke, stats, quit)");
	for (size_t i = 0; i < sizeof(api_cmds) / sizeof(api_cmds[0]); i++) {
		const struct api_cmd *c = &api_cmds[i];

		if (strcmp(c->name, rq.argv[0]))
			continue;
		if (rq.argc - 1 < c->min_args || rq.argc - 1 > c->max_args)
			return api_error("usage: %s", c->usage);
		*quit = c->fn == api_quit;
		return c->fn(a, &rq);
	}
	return api_error("unknown command '%.64s' (commands: fill, verify, digest, poke, stats, quit)",
			 rq.argv[0]);
}

char *vmm_api__handle(struct vmm_api *a, const char *line, bool *quit)
{
	char buf[VMM_API_LINE_MAX];
	struct json_object *r;
	char *out = NULL;
	const char *s;

	*quit = false;
	if (strlen(line) >= sizeof(buf))
		r = api_error("request line longer than %d bytes", VMM_API_LINE_MAX - 1);
	else
		r = api_dispatch(a, strcpy(buf, line), quit);
	if (!r)
		return NULL;
	s = json_object_to_json_string_ext(r, JSON_C_TO_STRING_PLAIN);
	if (s && asprintf(&out, "%s\n", s) < 0)
		out = NULL;
	json_object_put(r);
	return out;
}

static void api_send(struct api_client *c, const char *reply)
{
	size_t len = strlen(reply), off = 0;

	while (off < len) {
		ssize_t n = send(c->fd, reply + off, len - off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			log_debug("api: dropping a client that does not read: %s",
				  n < 0 ? strerror(errno) : "short send");
			close(c->fd);
			c->fd = -1;
			return;
		}
		off += (size_t)n;
	}
}

static void api_answer(struct vmm_api *a, struct api_client *c, const char *line)
{
	bool quit = false;
	char *reply = vmm_api__handle(a, line, &quit);

	log_debug("api: '%.80s'", line);
	api_send(c, reply ? reply : "{\"ok\":false,\"error\":\"out of memory\"}\n");
	free(reply);
	if (quit) {
		uint64_t one = 1;

		log_info("api: quit requested");
		if (write(a->cfg.quit_fd, &one, sizeof(one)) < 0)
			log_warn("api: cannot signal quit: %s", strerror(errno));
	}
}

/* Read what the client sent and answer every complete line in it. */
static void api_client_read(struct vmm_api *a, struct api_client *c)
{
	ssize_t n = recv(c->fd, c->buf + c->used, sizeof(c->buf) - c->used, MSG_DONTWAIT);
	char *nl;

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		close(c->fd);
		c->fd = -1;
		return;
	}
	c->used += (size_t)n;
	while (c->fd >= 0 && (nl = memchr(c->buf, '\n', c->used))) {
		size_t len = (size_t)(nl - c->buf) + 1;

		*nl = '\0';
		api_answer(a, c, c->buf);
		memmove(c->buf, c->buf + len, c->used - len);
		c->used -= len;
	}
	if (c->fd >= 0 && c->used == sizeof(c->buf)) {
		/* No newline in a full buffer: answer once and hang up. */
		api_send(c, "{\"ok\":false,\"error\":\"request line too long\"}\n");
		if (c->fd >= 0)
			close(c->fd);
		c->fd = -1;
	}
}

static void api_accept(struct vmm_api *a)
{
	struct timeval tv = { .tv_sec = API_SEND_TIMEOUT_S };
	int fd = accept4(a->listen_fd, NULL, NULL, SOCK_CLOEXEC);

	if (fd < 0) {
		if (errno != EAGAIN && errno != EINTR)
			log_warn("api: accept: %s", strerror(errno));
		return;
	}
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	for (int i = 0; i < API_MAX_CLIENTS; i++) {
		if (a->clients[i].fd >= 0)
			continue;
		a->clients[i].fd = fd;
		a->clients[i].used = 0;
		return;
	}
	log_warn("api: more than %d clients; refusing one", API_MAX_CLIENTS);
	send(fd, "{\"ok\":false,\"error\":\"too many API clients\"}\n", 44, MSG_NOSIGNAL | MSG_DONTWAIT);
	close(fd);
}

static void *api_thread(void *arg)
{
	struct vmm_api *a = arg;
	struct pollfd pfd[2 + API_MAX_CLIENTS];
	int who[2 + API_MAX_CLIENTS];

	for (;;) {
		int n = 0;

		pfd[n++] = (struct pollfd){ .fd = a->wake_fd, .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = a->listen_fd, .events = POLLIN };
		for (int i = 0; i < API_MAX_CLIENTS; i++) {
			if (a->clients[i].fd < 0)
				continue;
			who[n] = i;
			pfd[n++] = (struct pollfd){ .fd = a->clients[i].fd, .events = POLLIN };
		}
		if (poll(pfd, (nfds_t)n, -1) < 0) {
			if (errno == EINTR)
				continue;
			log_err("api: poll: %s", strerror(errno));
			return NULL;
		}
		if (pfd[0].revents)
			return NULL;
		if (pfd[1].revents)
			api_accept(a);
		for (int i = 2; i < n; i++)
			if (pfd[i].revents)
				api_client_read(a, &a->clients[who[i]]);
	}
}

/* 0 if nobody listens on @sa (a leftover socket file), -EADDRINUSE if someone does. */
static int api_probe(const struct sockaddr_un *sa)
{
	int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int ret;

	if (probe < 0)
		return -errno;
	ret = connect(probe, (const struct sockaddr *)sa, sizeof(*sa)) ? 0 : -EADDRINUSE;
	close(probe);
	return ret;
}

/* Bind and listen on @path; returns the socket or -errno. */
static int api_listen(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, ret;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		ret = -errno;
		if (ret != -EADDRINUSE || (ret = api_probe(&sa)))
			goto err;
		unlink(path);
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			ret = -errno;
			goto err;
		}
	}
	/* Only the owner may drive guest memory. */
	if (chmod(path, 0600) < 0 || listen(fd, API_MAX_CLIENTS) < 0) {
		ret = -errno;
		unlink(path);
		goto err;
	}
	return fd;
err:
	close(fd);
	return ret;
}

int vmm_api__start(struct vmm_api **out, const struct vmm_api_cfg *cfg)
{
	struct vmm_api *a = calloc(1, sizeof(*a));
	int ret;

	if (!a)
		return -ENOMEM;
	a->cfg = *cfg;
	for (int i = 0; i < API_MAX_CLIENTS; i++)
		a->clients[i].fd = -1;
	a->wake_fd = eventfd(0, EFD_CLOEXEC);
	if (a->wake_fd < 0) {
		ret = -errno;
		goto err_free;
	}
	a->listen_fd = api_listen(cfg->path);
	if (a->listen_fd < 0) {
		ret = a->listen_fd;
		goto err_wake;
	}
	snprintf(a->path, sizeof(a->path), "%s", cfg->path);
	ret = -pthread_create(&a->thread, NULL, api_thread, a);
	if (ret)
		goto err_listen;
	pthread_setname_np(a->thread, "api");
	*out = a;
	return 0;

err_listen:
	close(a->listen_fd);
	unlink(a->path);
err_wake:
	close(a->wake_fd);
err_free:
	free(a);
	return ret;
}

void vmm_api__stop(struct vmm_api *a)
{
	uint64_t one = 1;

	if (!a)
		return;
	if (write(a->wake_fd, &one, sizeof(one)) < 0)
		log_warn("api: cannot wake the API thread: %s", strerror(errno));
	pthread_join(a->thread, NULL);
	for (int i = 0; i < API_MAX_CLIENTS; i++)
		if (a->clients[i].fd >= 0)
			close(a->clients[i].fd);
	close(a->listen_fd);
	unlink(a->path);
	close(a->wake_fd);
	free(a);
}
