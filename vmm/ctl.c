/* ctl.c: `pvisor ctl`: send one command to a VM's API socket and print the JSON reply. */
#include <errno.h>
#include <json-c/json.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "ctl.h"
#include "log.h"
#include "util.h"

#define CTL_EXIT_OK    0
#define CTL_EXIT_FALSE 1
#define CTL_EXIT_USAGE 2
/* A command may run a while (a verify of all guest RAM); this is generous. */
#define CTL_DEFAULT_TIMEOUT_S 300
#define CTL_WAIT_READY_TIMEOUT_S 60
#define CTL_POLL_MS 100
#define CTL_REPLY_MAX (1u << 20)

/* struct ctl_opts - what the command line asked for */
struct ctl_opts {
	const char *sock;      /* --api-sock */
	double timeout;        /* --timeout, seconds */
	bool timeout_set;
	char line[VMM_API_LINE_MAX]; /* request words joined by spaces */
	bool wait_ready;       /* the command is wait-ready (client side) */
};

void vmm_ctl__usage(void)
{
	printf("usage: pvisor ctl --api-sock PATH [--timeout SEC] COMMAND [ARGS...]\n"
	       "Send one command to a running VM and print its JSON reply line.\n"
	       "Exit status: 0 if the reply has \"ok\": true, 1 if false, 2 for a usage error\n"
	       "or when the socket cannot be reached.\n\n"
	       "Commands (pages are 4 KiB guest pages):\n"
	       "  fill FIRST COUNT WORKLOAD SEED [INSTANCE]   write a workload into pages\n"
	       "  verify FIRST COUNT WORKLOAD SEED [INSTANCE] compare every byte with the workload\n"
	       "  digest FIRST COUNT                          XXH3-128 of the pages, in hex\n"
	       "  poke FIRST COUNT OFFSET BYTE                write BYTE at OFFSET in each page\n"
	       "  stats                                       memory-plane and guest figures\n"
	       "  quit                                        stop the VM (exit status 0)\n"
	       "  wait-ready [--timeout SEC]                  poll stats until the guest is ready\n"
	       "                                              (default %d s; exit 1 on time-out)\n"
	       "WORKLOAD: repeated|shared-random|unique-random|zeros|patterns\n",
	       CTL_WAIT_READY_TIMEOUT_S);
}

static int ctl_usage_err(const char *fmt, const char *arg)
{
	fprintf(stderr, "pvisor ctl: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, " (see pvisor ctl --help)\n");
	return CTL_EXIT_USAGE;
}

static int ctl_timeout(const char *s, struct ctl_opts *o)
{
	char *end;

	errno = 0;
	o->timeout = s ? strtod(s, &end) : -1;
	if (!s || errno || end == s || *end || !(o->timeout > 0) || o->timeout > 86400)
		return ctl_usage_err("--timeout needs a number of seconds (0 < SEC <= 86400), got '%s'",
				     s ? s : "nothing");
	o->timeout_set = true;
	return 0;
}

/* Flags may come before the command; --timeout also after it. */
static int ctl_parse(int argc, char **argv, struct ctl_opts *o)
{
	size_t used = 0;
	int words = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int ret;

		if (!strcmp(a, "--api-sock") || !strcmp(a, "--timeout")) {
			if (i + 1 >= argc)
				return ctl_usage_err("%s needs a value", a);
			if (a[2] == 'a')
				o->sock = argv[++i];
			else if ((ret = ctl_timeout(argv[++i], o)))
				return ret;
		} else if (!strncmp(a, "--api-sock=", 11)) {
			o->sock = a + 11;
		} else if (!strncmp(a, "--timeout=", 10)) {
			if ((ret = ctl_timeout(a + 10, o)))
				return ret;
		} else if (!words && !strncmp(a, "--", 2)) {
			return ctl_usage_err("unknown flag '%s' (known: --api-sock, --timeout, --help)", a);
		} else {
			if (strpbrk(a, "\n\r"))
				return ctl_usage_err("argument '%s' holds a line break", a);
			if (used + strlen(a) + 2 > sizeof(o->line))
				return ctl_usage_err("request longer than %s bytes", "511");
			used += (size_t)sprintf(o->line + used, "%s%s", words ? " " : "", a);
			words++;
		}
	}
	if (!o->sock || !*o->sock)
		return ctl_usage_err("%s", "--api-sock PATH is required");
	if (!words)
		return ctl_usage_err("%s", "no command given");
	o->wait_ready = !strcmp(o->line, "wait-ready");
	if (!strncmp(o->line, "wait-ready ", 11))
		return ctl_usage_err("wait-ready takes no arguments besides --timeout, got '%s'",
				     o->line + 11);
	if (!o->timeout_set)
		o->timeout = o->wait_ready ? CTL_WAIT_READY_TIMEOUT_S : CTL_DEFAULT_TIMEOUT_S;
	return 0;
}

static int ctl_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int ret = -errno;

		close(fd);
		return ret;
	}
	return fd;
}

/* Send @line and read one reply line into a malloc'ed string (no newline). */
static int ctl_exchange(int fd, const char *line, uint64_t deadline_ns, char **reply)
{
	size_t len = strlen(line), used = 0, cap = 4096;
	char *buf;

	if (send(fd, line, len, MSG_NOSIGNAL) != (ssize_t)len || send(fd, "\n", 1, MSG_NOSIGNAL) != 1)
		return errno ? -errno : -EIO;
	buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	for (;;) {
		uint64_t now = util_now_ns();
		struct pollfd p = { .fd = fd, .events = POLLIN };
		char *nl;
		ssize_t n;

		if (now >= deadline_ns || poll(&p, 1, (int)((deadline_ns - now) / 1000000) + 1) == 0) {
			free(buf);
			return -ETIMEDOUT;
		}
		if (used + 1 >= cap) {
			char *nb = cap >= CTL_REPLY_MAX ? NULL : realloc(buf, cap * 2);

			if (!nb) {
				free(buf);
				return -EMSGSIZE;
			}
			buf = nb;
			cap *= 2;
		}
		n = recv(fd, buf + used, cap - used - 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			free(buf);
			return n < 0 ? -errno : -ECONNRESET;
		}
		used += (size_t)n;
		buf[used] = '\0';
		nl = memchr(buf, '\n', used);
		if (nl) {
			*nl = '\0';
			*reply = buf;
			return 0;
		}
	}
}

/* 1 if the reply's "ok" is true, 0 if false, -EBADMSG if it is not a reply. */
static int ctl_reply_flag(const char *reply, const char *key)
{
	struct json_object *r = json_tokener_parse(reply), *v;
	int ret = -EBADMSG;

	if (r && json_object_object_get_ex(r, key, &v) && json_object_is_type(v, json_type_boolean))
		ret = json_object_get_boolean(v);
	json_object_put(r);
	return ret;
}

static int ctl_once(const struct ctl_opts *o)
{
	uint64_t deadline = util_now_ns() + (uint64_t)(o->timeout * 1e9);
	char *reply = NULL;
	int fd, ret;

	fd = ctl_connect(o->sock);
	if (fd < 0) {
		fprintf(stderr, "pvisor ctl: cannot connect to API socket %s: %s\n", o->sock,
			strerror(-fd));
		return CTL_EXIT_USAGE;
	}
	ret = ctl_exchange(fd, o->line, deadline, &reply);
	close(fd);
	if (ret) {
		fprintf(stderr, "pvisor ctl: no reply from %s: %s\n", o->sock, strerror(-ret));
		return CTL_EXIT_FALSE;
	}
	printf("%s\n", reply);
	ret = ctl_reply_flag(reply, "ok");
	free(reply);
	if (ret < 0) {
		fprintf(stderr, "pvisor ctl: the reply from %s is not a JSON object with \"ok\"\n",
			o->sock);
		return CTL_EXIT_FALSE;
	}
	return ret ? CTL_EXIT_OK : CTL_EXIT_FALSE;
}

/* Poll stats until "ready" is true; a VM still starting may not listen yet. */
static int ctl_wait_ready(const struct ctl_opts *o)
{
	uint64_t deadline = util_now_ns() + (uint64_t)(o->timeout * 1e9);
	char last[160] = "no attempt";

	while (util_now_ns() < deadline) {
		struct timespec ts = { .tv_nsec = CTL_POLL_MS * 1000000L };
		char *reply = NULL;
		int fd, ret;

		fd = ctl_connect(o->sock);
		if (fd < 0) {
			snprintf(last, sizeof(last), "cannot connect: %s", strerror(-fd));
		} else {
			ret = ctl_exchange(fd, "stats", deadline, &reply);
			close(fd);
			if (ret)
				snprintf(last, sizeof(last), "no reply: %s", strerror(-ret));
			else if (ctl_reply_flag(reply, "ready") == 1) {
				printf("%s\n", reply);
				free(reply);
				return CTL_EXIT_OK;
			} else
				snprintf(last, sizeof(last), "not ready yet");
			free(reply);
		}
		nanosleep(&ts, NULL);
	}
	fprintf(stderr, "pvisor ctl: %s did not become ready within %g s (last: %s)\n", o->sock,
		o->timeout, last);
	return CTL_EXIT_FALSE;
}

int vmm_ctl__main(int argc, char **argv)
{
	struct ctl_opts o = { 0 };
	int ret;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			vmm_ctl__usage();
			return CTL_EXIT_OK;
		}
	}
	ret = ctl_parse(argc, argv, &o);
	if (ret)
		return ret;
	return o.wait_ready ? ctl_wait_ready(&o) : ctl_once(&o);
}
