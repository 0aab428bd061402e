/* main.c: pvisor-pool's entry point: settings, socket, signals, event loop. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "config.h"
#include "ev.h"
#include "log.h"
#include "pool.h"
#include "util.h"

/*
 * Usage:
 *   pvisor-pool [--config FILE] [--key value ...]   run the daemon
 *   pvisor-pool stat [--socket PATH] [--json] [--audit]
 * Settings come from the config file first, then the flags (which win).
 */

static const char *const pool_share_words[] = { "domain", "none", NULL };

#define POOL_OFF(f) offsetof(struct pool_conf, f)
static const struct conf_key pool_keys[] = {
	{ .name = "config", .type = CONF_STR, .off = POOL_OFF(config),
	  .len = sizeof(((struct pool_conf *)0)->config), .def = "/etc/pvisor/pool.conf",
	  .help = "config file (a missing default file is fine)", .cli_only = true },
	{ .name = "socket", .type = CONF_STR, .off = POOL_OFF(socket),
	  .len = sizeof(((struct pool_conf *)0)->socket), .def = "/run/pvisor/pool.sock",
	  .help = "control socket path" },
	{ .name = "physical", .type = CONF_BOOL, .off = POOL_OFF(physical), .def = "on",
	  .help = "share physical pages between clients (off: refuse every HELLO)" },
	{ .name = "store-limit", .type = CONF_SIZE, .off = POOL_OFF(store_limit), .def = "4G",
	  .min = PROTO_PAGE_SIZE, .help = "most bytes of canonical pages the store holds" },
	{ .name = "segment-size", .type = CONF_SIZE, .off = POOL_OFF(segment_size), .def = "64M",
	  .min = 64 * 1024, .max = 1ull << 32, .help = "bytes per store segment (multiple of 4K)" },
	{ .name = "share", .type = CONF_ENUM, .off = POOL_OFF(share), .def = "domain",
	  .values = pool_share_words, .help = "share pages inside a sharing domain, or not at all" },
	{ .name = "log-level", .type = CONF_LEVEL, .off = POOL_OFF(log_level), .def = "info",
	  .help = "most verbose level logged" },
	{ .name = "max-clients", .type = CONF_UINT, .off = POOL_OFF(max_clients), .def = "256",
	  .min = 1, .max = 65536, .help = "most VMMs connected at once" },
	{ .name = "vm-max-map-count", .type = CONF_UINT, .off = POOL_OFF(max_map_count), .def = "0",
	  .max = 1ull << 31,
	  .help = "raise sysctl vm.max_map_count to at least this at start (0: leave it)" },
	CONF_END
};

static void pool_usage(FILE *out)
{
	fprintf(out, "usage: pvisor-pool [--key value ...]\n"
		     "       pvisor-pool stat [--socket PATH] [--json] [--audit]\n\n"
		     "The per-host page pool of pvisor. Every key can also be set in the config\n"
		     "file as 'key = value'; a flag wins over the file.\n\n");
	conf_usage(pool_keys, out);
	fprintf(out, "  %-34s %s\n", "--help", "this text");
	fprintf(out, "  %-34s %s\n", "--version", "print the version");
}

static void pool_load_conf(struct pool_conf *conf, int argc, char **argv)
{
	char err[1024];
	int idx = 1;

	if (conf_load_all(pool_keys, conf, argc, argv, &idx, err, sizeof(err)))
		log_die(2, "%s", err);
	if (idx < argc)
		log_die(2, "unexpected argument '%s' (see --help)", argv[idx]);
	if (conf->segment_size % PROTO_PAGE_SIZE)
		log_die(2, "segment-size %llu is not a multiple of %u",
			(unsigned long long)conf->segment_size, PROTO_PAGE_SIZE);
	if (!conf->socket[0])
		log_die(2, "socket must not be empty");
}

/*
 * Every run a VMM remaps is one VMA, and a VMM that reaches vm.max_map_count
 * cannot even munmap; VMMs keep a budget below it, so a larger limit means
 * more sharing. Raising it is host policy, hence a key and not a default.
 */
static void pool_raise_map_count(uint64_t want)
{
	const char *path = "/proc/sys/vm/max_map_count";
	unsigned long long cur = 0;
	bool ok;
	FILE *f;

	if (!want)
		return;
	f = fopen(path, "r");
	if (!f || fscanf(f, "%llu", &cur) != 1) {
		log_warn("vm-max-map-count: cannot read %s: %s", path, strerror(errno));
		if (f)
			fclose(f);
		return;
	}
	fclose(f);
	if (cur >= want)
		return;
	f = fopen(path, "w");
	ok = f && fprintf(f, "%llu\n", (unsigned long long)want) > 0;
	if (f && fclose(f))
		ok = false;
	if (!ok) {
		log_warn("vm-max-map-count: cannot raise %s from %llu to %llu: %s (run as root, or "
			 "set vm.max_map_count in /etc/sysctl.d)", path, cur,
			 (unsigned long long)want, strerror(errno));
		return;
	}
	log_info("raised vm.max_map_count from %llu to %llu", cur, (unsigned long long)want);
}

static void pool_signal(struct ev_loop *loop, int fd, void *data, int events)
{
	struct signalfd_siginfo si;

	if (read(fd, &si, sizeof(si)) != sizeof(si))
		return;
	log_info("signal %u: stopping", si.ssi_signo);
	ev_stop(loop);
}

static int pool_signals(struct pool *p)
{
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
		return -errno;
	signal(SIGPIPE, SIG_IGN);
	p->signal_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	if (p->signal_fd < 0)
		return -errno;
	return ev_add(p->loop, p->signal_fd, EV_READ, pool_signal, p);
}

static int64_t pool_tick(struct ev_loop *loop, uint64_t id, void *data)
{
	struct pool *p = data;

	p->merges_per_sec = p->cnt.merges - p->merges_last;
	p->merges_last = p->cnt.merges;
	pool_store__reap(&p->store);
	if (!(++p->ticks % 5))
		pool_index__expire(p);
	return 1000;
}

/* Clients do not ring us when they make CQ room, so queued verdicts are polled. */
static int64_t pool_flush_tick(struct ev_loop *loop, uint64_t id, void *data)
{
	struct pool *p = data;
	bool any = false;

	for (struct pool_client *c = p->clients; c; c = c->next) {
		if (c->ovf_n)
			pool_ring__flush(c);
		/* Safety net for a client that lost a doorbell race. */
		if (c->ring && !c->dead && !c->pending &&
		    proto_load_acquire(&c->sq_idx->tail) != c->sq_head)
			c->pending = true;
		pool_ring__kick(c);
		any |= c->ovf_n != 0;
	}
	return any ? 1 : 100;
}

static int pool_run(struct pool *p)
{
	int ret;

	ret = ev_create(&p->loop, 256);
	if (ret) {
		log_err("io_uring setup failed: %s", strerror(-ret));
		return ret;
	}
	ret = pool_index__init(p);
	if (ret)
		goto out_loop;
	ret = pool_store__init(&p->store, p->conf.segment_size, p->conf.store_limit);
	if (ret)
		goto out_index;
	ret = pool_signals(p);
	if (ret) {
		log_err("cannot set up signals: %s", strerror(-ret));
		goto out_store;
	}
	ret = pool_client__listen(p);
	if (ret)
		goto out_signal;
	pool_raise_map_count(p->conf.max_map_count);
	ev_set_idle(p->loop, pool_client__idle, p);
	ev_timer_add(p->loop, 1000, pool_tick, p);
	ev_timer_add(p->loop, 100, pool_flush_tick, p);
	p->start_ns = util_now_ns();
	log_info("listening on %s (store-limit %llu MiB, segment %llu KiB, share %s)",
		 p->conf.socket, (unsigned long long)(p->conf.store_limit >> 20),
		 (unsigned long long)(p->conf.segment_size >> 10), pool_share_words[p->conf.share]);
	ret = ev_run(p->loop);
	pool_client__free_all(p);
	ev_del(p->loop, p->listen_fd);
	close(p->listen_fd);
	unlink(p->conf.socket);
out_signal:
	close(p->signal_fd);
out_store:
	pool_store__fini(&p->store);
out_index:
	pool_index__fini(p);
out_loop:
	ev_destroy(p->loop);
	return ret;
}

int main(int argc, char **argv)
{
	struct pool p = { .listen_fd = -1, .signal_fd = -1 };

	log_init("pvisor-pool", LOG_INFO);
	if (argc > 1 && !strcmp(argv[1], "stat"))
		return pool_stat__cli(argc - 1, argv + 1);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			pool_usage(stdout);
			return 0;
		}
		if (!strcmp(argv[i], "--version")) {
			printf("pvisor-pool %s\n", PVISOR_VERSION);
			return 0;
		}
	}
	pool_load_conf(&p.conf, argc, argv);
	log_set_level(p.conf.log_level);
	return pool_run(&p) ? 1 : 0;
}
