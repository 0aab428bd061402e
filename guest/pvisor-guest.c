/* pvisor-guest.c: the in-guest agent: writes a workload, reports digests on the console, serves commands. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/reboot.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "pvg.h"

/*
 * DOC: pvisor-guest
 *
 * A static program that /init starts inside a KVM guest. It reads pvg.KEY=VALUE
 * words from /proc/cmdline, writes the workload into one page-aligned anonymous
 * region exactly as the host-driven synthetic guest writes guest RAM (page i =
 * wl_page(kind, seed, instance, i)), reads it back, and reports on stdout (the
 * console) in lines "PVG {json}". Events, in order:
 *
 *   start   the parameters and the guest's uptime when the agent began
 *   load    pvg.load=PATH was read: bytes, digest, seconds
 *   ready   the workload was written and verified: pages, digest, timings
 *   ...     one line per console command (event = the command's name)
 *   done    the agent ends; /init then powers off or reboots per pvg.exit
 *   error   bad parameters (exit 2), or a command it does not know
 *
 * Digest: XXH3-64 with seed 0 over the data bytes in page order, as 16 hex
 * digits ("digest"); "digest128" is XXH3-128 (seed 0) printed high half
 * first, which is exactly what `pvisor ctl digest 0 PAGES` prints for the
 * synthetic guest holding the same pages. `--host-digest` computes both on the
 * host without a guest.
 *
 * Exit status: 0 all start-up work passed, 1 it did not (a page differed, the
 * load failed, no memory), 2 bad parameters.
 */

/* struct pvg_agent - the agent's state between start-up and the last command */
struct pvg_agent {
	struct pvg_params p;   /* from the command line */
	struct pvg_data data;  /* the workload region */
	struct pvg_file file;  /* the last file loaded (kept mapped: its pages stay in RAM) */
	bool ok;               /* every start-up step passed */
	unsigned commands;     /* console commands answered */
};

/* struct pvg_reader - console input split into lines, with a deadline */
struct pvg_reader {
	char buf[1024];        /* bytes read, not yet a whole line */
	size_t len;            /* bytes in buf */
	bool eof;              /* stdin ended (host mode: the test closed the pipe) */
};

static const char *pvg_wl_name(int kind)
{
	return kind == PVG_WL_NONE ? "none" : wl_names[kind];
}

/* Seconds since the guest booted, from /proc/uptime; -1 if unreadable. */
static double pvg_uptime(void)
{
	double up = -1;
	FILE *f = fopen("/proc/uptime", "re");

	if (!f)
		return -1;
	if (fscanf(f, "%lf", &up) != 1)
		up = -1;
	fclose(f);
	return up;
}

static int pvg_read_proc_cmdline(char *buf, size_t len)
{
	int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	return 0;
}

static void pvg_report_start(const struct pvg_agent *a)
{
	struct pvg_line l;

	pvg_line_begin(&l, "start");
	pvg_line_str(&l, "version", PVISOR_VERSION);
	pvg_line_secs(&l, "uptime_s", pvg_uptime());
	pvg_line_str(&l, "workload", pvg_wl_name(a->p.workload));
	pvg_line_u64(&l, "pages", a->data.pages);
	pvg_line_u64(&l, "seed", a->p.seed);
	pvg_line_u64(&l, "instance", a->p.instance);
	pvg_line_str(&l, "load", a->p.load[0] ? a->p.load : NULL);
	pvg_line_u64(&l, "hold_s", a->p.hold_s);
	pvg_line_str(&l, "exit", pvg_exit_names[a->p.exit]);
	pvg_line_end(&l);
}

/* Read @path and report it as event @event ("load"); 0 or -errno. */
static int pvg_do_load(struct pvg_agent *a, const char *event, const char *path)
{
	double t0 = pvg_now(), dt;
	struct pvg_line l;
	char hex[17];
	int ret;

	ret = pvg_file__load(&a->file, path);
	dt = pvg_now() - t0;
	pvg_line_begin(&l, event);
	pvg_line_bool(&l, "ok", !ret);
	pvg_line_str(&l, "path", path);
	if (ret) {
		char msg[320];

		snprintf(msg, sizeof(msg), "cannot read %s: %s", path, strerror(-ret));
		pvg_line_str(&l, "error", msg);
	} else {
		pvg_digest(a->file.base, a->file.bytes, hex);
		pvg_line_u64(&l, "bytes", a->file.bytes);
		pvg_line_str(&l, "digest", hex);
		pvg_line_bool(&l, "direct", a->file.direct);
		pvg_line_secs(&l, "load_s", dt);
	}
	pvg_line_end(&l);
	return ret;
}

/* Put the data region's digests and the time they took on @l. */
static void pvg_line_digests(struct pvg_line *l, const struct pvg_data *d)
{
	double t0 = pvg_now();
	char hex[17], hex128[33];

	pvg_digest(d->base, d->pages * 4096, hex);
	pvg_digest128(d->base, d->pages * 4096, hex128);
	pvg_line_str(l, "digest", hex);
	pvg_line_str(l, "digest128", hex128);
	pvg_line_secs(l, "digest_s", pvg_now() - t0);
}

/* Start-up: map, fill and verify the workload, then report "ready". */
static int pvg_startup_fill(struct pvg_agent *a)
{
	uint64_t bad = 0, first_bad = 0;
	double t0, t_fill = 0, t_verify = 0;
	struct pvg_line l;

	if (a->data.pages) {
		t0 = pvg_now();
		pvg_data__fill(&a->data, a->p.workload, a->p.seed, a->p.instance);
		t_fill = pvg_now() - t0;
		bad = pvg_data__verify(&a->data, &first_bad);
		t_verify = pvg_now() - t0 - t_fill;
	}
	pvg_line_begin(&l, "ready");
	pvg_line_bool(&l, "ok", !bad);
	pvg_line_str(&l, "workload", pvg_wl_name(a->p.workload));
	pvg_line_u64(&l, "pages", a->data.pages);
	pvg_line_u64(&l, "seed", a->p.seed);
	pvg_line_u64(&l, "instance", a->p.instance);
	pvg_line_digests(&l, &a->data);
	pvg_line_u64(&l, "verify_mismatched", bad);
	if (bad)
		pvg_line_u64(&l, "first_bad", first_bad);
	pvg_line_secs(&l, "fill_s", t_fill);
	pvg_line_secs(&l, "verify_s", t_verify);
	pvg_line_secs(&l, "uptime_s", pvg_uptime());
	pvg_line_end(&l);
	return bad ? -EIO : 0;
}

static void pvg_reply_error(const char *event, const char *msg)
{
	struct pvg_line l;

	pvg_line_begin(&l, event);
	pvg_line_bool(&l, "ok", false);
	pvg_line_str(&l, "error", msg);
	pvg_line_end(&l);
}

static void pvg_cmd_verify(struct pvg_agent *a)
{
	double t0 = pvg_now();
	uint64_t first_bad, bad = pvg_data__verify(&a->data, &first_bad);
	struct pvg_line l;

	pvg_line_begin(&l, "verify");
	pvg_line_bool(&l, "ok", !bad);
	pvg_line_str(&l, "workload", a->data.pages ? wl_names[a->data.kind] : "none");
	pvg_line_u64(&l, "seed", a->data.seed);
	pvg_line_u64(&l, "pages", a->data.pages);
	pvg_line_u64(&l, "verify_mismatched", bad);
	if (bad)
		pvg_line_u64(&l, "first_bad", first_bad);
	pvg_line_secs(&l, "verify_s", pvg_now() - t0);
	pvg_line_digests(&l, &a->data);   /* what the region holds, right or wrong */
	pvg_line_end(&l);
}

/* `write SEED`: every page gets private bytes, wl_page(unique-random, SEED, instance, i). */
static void pvg_cmd_write(struct pvg_agent *a, const char *arg)
{
	double t0 = pvg_now(), dt;
	struct pvg_line l;
	uint64_t seed;

	if (!arg || pvg_parse_u64(arg, &seed)) {
		pvg_reply_error("write", "usage: write SEED (a decimal number)");
		return;
	}
	pvg_data__fill(&a->data, WL_UNIQUE_RANDOM, seed, a->p.instance);
	dt = pvg_now() - t0;
	pvg_line_begin(&l, "write");
	pvg_line_bool(&l, "ok", true);
	pvg_line_u64(&l, "seed", seed);
	pvg_line_u64(&l, "pages", a->data.pages);
	pvg_line_secs(&l, "write_s", dt);
	pvg_line_digests(&l, &a->data);
	pvg_line_end(&l);
}

static void pvg_cmd_digest(struct pvg_agent *a)
{
	struct pvg_line l;

	pvg_line_begin(&l, "digest");
	pvg_line_bool(&l, "ok", true);
	pvg_line_u64(&l, "pages", a->data.pages);
	pvg_line_digests(&l, &a->data);
	pvg_line_end(&l);
}

/* `poke PAGE`: flip the first byte of one data page, so that tests can see `verify` fail. */
static void pvg_cmd_poke(struct pvg_agent *a, const char *arg)
{
	struct pvg_line l;
	uint64_t page;

	if (!arg || pvg_parse_u64(arg, &page) || page >= a->data.pages) {
		pvg_reply_error("poke", "usage: poke PAGE (a data page: 0 to pages-1)");
		return;
	}
	a->data.base[page * 4096] ^= 0xff;
	pvg_line_begin(&l, "poke");
	pvg_line_bool(&l, "ok", true);
	pvg_line_u64(&l, "page", page);
	pvg_line_end(&l);
}

static void pvg_cmd_sleep(const char *arg)
{
	struct timespec ts = { 0 };
	struct pvg_line l;
	uint64_t s;

	if (!arg || pvg_parse_u64(arg, &s) || s > PVG_SECONDS_MAX) {
		pvg_reply_error("sleep", "usage: sleep SECONDS (0 to 86400)");
		return;
	}
	ts.tv_sec = (time_t)s;
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
	pvg_line_begin(&l, "sleep");
	pvg_line_bool(&l, "ok", true);
	pvg_line_u64(&l, "s", s);
	pvg_line_end(&l);
}

/* One console line; returns true for `quit`. */
static bool pvg_dispatch(struct pvg_agent *a, char *line)
{
	char *save = NULL, *cmd = strtok_r(line, " \t\r", &save);
	char *arg = strtok_r(NULL, " \t\r", &save), *extra = strtok_r(NULL, " \t\r", &save);
	struct pvg_line l;

	if (!cmd)
		return false;   /* empty line */
	a->commands++;
	if (extra && strcmp(cmd, "load")) {
		char msg[96];

		snprintf(msg, sizeof(msg), "%s: too many arguments", cmd);
		pvg_reply_error(strlen(cmd) < 16 ? cmd : "error", msg);
	} else if (!strcmp(cmd, "verify")) {
		pvg_cmd_verify(a);
	} else if (!strcmp(cmd, "write")) {
		pvg_cmd_write(a, arg);
	} else if (!strcmp(cmd, "digest")) {
		pvg_cmd_digest(a);
	} else if (!strcmp(cmd, "load")) {
		if (!arg || extra)
			pvg_reply_error("load", "usage: load PATH (one absolute path, no spaces)");
		else
			pvg_do_load(a, "load", arg);
	} else if (!strcmp(cmd, "poke")) {
		pvg_cmd_poke(a, arg);
	} else if (!strcmp(cmd, "sleep")) {
		pvg_cmd_sleep(arg);
	} else if (!strcmp(cmd, "quit")) {
		pvg_line_begin(&l, "quit");
		pvg_line_bool(&l, "ok", true);
		pvg_line_end(&l);
		return true;
	} else {
		pvg_report_error("command", cmd,
				 "unknown command; known: verify, write SEED, digest, load PATH, "
				 "poke PAGE, sleep S, quit");
	}
	return false;
}

/* Take one line out of r->buf into @out if there is one. */
static bool pvg_take_line(struct pvg_reader *r, char *out, size_t outlen)
{
	char *nl = memchr(r->buf, '\n', r->len);
	size_t n;

	if (!nl && r->len < sizeof(r->buf) && !(r->eof && r->len))
		return false;
	/* no newline: a full buffer or the last bytes before EOF count as one line */
	n = nl ? (size_t)(nl - r->buf) : r->len;
	snprintf(out, outlen, "%.*s", (int)n, r->buf);
	n += nl ? 1 : 0;
	memmove(r->buf, r->buf + n, r->len - n);
	r->len -= n;
	return true;
}

/* Next console line before @deadline: 1 a line, 0 the deadline passed, -1 EOF. */
static int pvg_read_line(struct pvg_reader *r, double deadline, char *out, size_t outlen)
{
	for (;;) {
		struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
		double left = deadline - pvg_now();
		ssize_t n;

		if (pvg_take_line(r, out, outlen))
			return 1;
		if (r->eof)
			return -1;
		if (left <= 0)
			return 0;
		n = poll(&pfd, 1, (int)(left * 1000) + 1);   /* left <= PVG_SECONDS_MAX */
		if (n < 0 && errno != EINTR)
			return -1;
		if (n <= 0)
			continue;
		n = read(STDIN_FILENO, r->buf + r->len, sizeof(r->buf) - r->len);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			r->eof = true;
		else
			r->len += (size_t)n;
	}
}

/* A console echoes what the harness types; turn that off so only PVG lines come back. */
static void pvg_console_quiet(void)
{
	struct termios t;

	if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &t))
		return;
	t.c_lflag &= ~(tcflag_t)(ECHO | ECHONL);
	tcsetattr(STDIN_FILENO, TCSANOW, &t);
}

/* Serve commands for up to pvg.hold seconds; returns why it stopped. */
static const char *pvg_serve(struct pvg_agent *a)
{
	struct pvg_reader r = { .len = 0 };
	double deadline = pvg_now() + a->p.hold_s;
	char line[sizeof(r.buf) + 1];

	if (!a->p.hold_s)
		return "no-hold";
	pvg_console_quiet();
	for (;;) {
		int got = pvg_read_line(&r, deadline, line, sizeof(line));

		if (got == 0)
			return "hold-expired";
		if (got < 0)
			return "eof";
		if (pvg_dispatch(a, line))
			return "quit";
	}
}

/* As PID 1 there is no /init to act on pvg.exit: do it here. */
static void pvg_exit_as_init(int how)
{
	sync();
	if (how == PVG_EXIT_POWEROFF)
		reboot(RB_POWER_OFF);
	else if (how == PVG_EXIT_REBOOT)
		reboot(RB_AUTOBOOT);
	for (;;)
		pause();
}

static int pvg_agent_run(const struct pvg_params *p)
{
	struct pvg_agent a = { .p = *p, .ok = true };
	const char *reason;
	struct pvg_line l;
	int ret;

	ret = pvg_data__map(&a.data, p->workload == PVG_WL_NONE ? 0 : p->size / 4096);
	pvg_report_start(&a);
	if (ret) {
		pvg_report_error(NULL, NULL, "cannot map the workload region; lower pvg.size "
				 "or give the guest more memory");
		a.ok = false;
	}
	if (p->load[0] && pvg_do_load(&a, "load", p->load))
		a.ok = false;
	if (!ret && pvg_startup_fill(&a))
		a.ok = false;
	reason = pvg_serve(&a);
	pvg_line_begin(&l, "done");
	pvg_line_bool(&l, "ok", a.ok);
	pvg_line_str(&l, "reason", reason);
	pvg_line_u64(&l, "commands", a.commands);
	pvg_line_str(&l, "exit", pvg_exit_names[p->exit]);
	pvg_line_secs(&l, "uptime_s", pvg_uptime());
	pvg_line_end(&l);
	if (getpid() == 1)
		pvg_exit_as_init(p->exit);
	pvg_file__free(&a.file);
	pvg_data__unmap(&a.data);
	return a.ok ? 0 : 1;
}

/* Host mode: the digests the agent would report after start-up (and a `write`). */
static int pvg_host_digest(const struct pvg_params *p, bool write, uint64_t write_seed,
			   bool want128)
{
	uint64_t pages = p->workload == PVG_WL_NONE ? 0 : p->size / 4096;
	int kind = write ? WL_UNIQUE_RANDOM : p->workload;
	uint64_t seed = write ? write_seed : p->seed;
	char hex[17], hex128[33];

	if (kind == PVG_WL_NONE)
		kind = WL_ZEROS;   /* no pages: the digest of no bytes */
	pvg_workload_digests(kind, seed, p->instance, pages, hex, hex128);
	printf("%s\n", want128 ? hex128 : hex);
	return 0;
}

/* Host mode: the digest `load PATH` would report for this file. */
static int pvg_file_digest(const char *path, bool want128)
{
	struct pvg_file f = { .base = NULL };
	char hex[33], msg[320];
	int ret = pvg_file__load(&f, path);

	if (ret) {
		snprintf(msg, sizeof(msg), "cannot read %s: %s", path, strerror(-ret));
		pvg_report_error("path", path, msg);
		return 1;
	}
	if (want128)
		pvg_digest128(f.base, f.bytes, hex);
	else
		pvg_digest(f.base, f.bytes, hex);
	printf("%s\n", hex);
	pvg_file__free(&f);
	return 0;
}

static void pvg_usage(FILE *f)
{
	fprintf(f,
		"Usage: pvisor-guest [OPTIONS]\n"
		"In a guest (started by /init): read pvg.* from /proc/cmdline, write and verify\n"
		"the workload, report `PVG {json}` lines on stdout, serve console commands.\n"
		"\n"
		"Kernel command line (defaults in brackets):\n"
		"  pvg.workload=repeated|shared-random|unique-random|zeros|patterns|none [none]\n"
		"  pvg.size=SIZE      workload bytes, K/M/G suffix, multiple of 4K [64M]\n"
		"  pvg.seed=N [1]  pvg.instance=N [0]\n"
		"  pvg.load=PATH      read a whole file or device (e.g. /dev/vda) at start\n"
		"  pvg.hold=SECONDS   serve console commands this long after \"ready\" [0]\n"
		"  pvg.exit=poweroff|reboot|none   what /init does afterwards [poweroff]\n"
		"Console commands: verify, write SEED, digest, load PATH, poke PAGE, sleep S, quit\n"
		"\n"
		"Options:\n"
		"  --cmdline STRING   parse STRING instead of /proc/cmdline (also: $PVG_CMDLINE)\n"
		"  --workload W --size S --seed N --instance N --load PATH --hold S --exit E\n"
		"                     the same as pvg.KEY=VALUE, applied after the command line\n"
		"  --host-digest      print the digest the agent reports in \"ready\", and exit\n"
		"  --write-seed N     with --host-digest: the digest after `write N`\n"
		"  --file-digest PATH print the digest `load PATH` reports, and exit\n"
		"  --digest128        with --host-digest/--file-digest: print XXH3-128 (32 hex,\n"
		"                     as `pvisor ctl digest`) instead of XXH3-64 (16 hex)\n"
		"  --help             this text\n"
		"Digest: XXH3-64, seed 0, over the data bytes in page order.\n"
		"Exit: 0 ok, 1 start-up verification or load failed, 2 bad parameters.\n");
}

/* struct pvg_cli - what main() gathered from argv */
struct pvg_cli {
	const char *cmdline;   /* --cmdline, or NULL */
	char extra[1024];      /* flags turned into pvg.KEY=VALUE words */
	const char *file;      /* --file-digest PATH */
	bool host_digest;      /* --host-digest */
	bool want128;          /* --digest128 */
	bool write;            /* --write-seed given */
	uint64_t write_seed;   /* --write-seed */
};

static const struct option pvg_options[] = {
	{ "cmdline", required_argument, NULL, 'c' },
	{ "workload", required_argument, NULL, 'w' },
	{ "size", required_argument, NULL, 's' },
	{ "seed", required_argument, NULL, 'S' },
	{ "instance", required_argument, NULL, 'i' },
	{ "load", required_argument, NULL, 'l' },
	{ "hold", required_argument, NULL, 'H' },
	{ "exit", required_argument, NULL, 'e' },
	{ "host-digest", no_argument, NULL, 'D' },
	{ "write-seed", required_argument, NULL, 'W' },
	{ "file-digest", required_argument, NULL, 'F' },
	{ "digest128", no_argument, NULL, '8' },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

/* Append " pvg.NAME=VALUE" for a flag; -E2BIG if the flags are absurdly long. */
static int pvg_cli_word(struct pvg_cli *c, const char *name, const char *val)
{
	size_t used = strlen(c->extra);
	int n = snprintf(c->extra + used, sizeof(c->extra) - used, " pvg.%s=%s", name, val);

	return n < 0 || (size_t)n >= sizeof(c->extra) - used ? -E2BIG : 0;
}

/* 0 to go on, or the exit status main() should return. */
static int pvg_cli_parse(struct pvg_cli *c, int argc, char **argv)
{
	int opt, idx;

	opterr = 0;   /* the PVG error line says it, once */
	while ((opt = getopt_long(argc, argv, "h", pvg_options, &idx)) != -1) {
		switch (opt) {
		case 'c': c->cmdline = optarg; break;
		case 'D': c->host_digest = true; break;
		case 'F': c->file = optarg; break;
		case '8': c->want128 = true; break;
		case 'h': pvg_usage(stdout); return -1;
		case 'W':
			if (pvg_parse_u64(optarg, &c->write_seed)) {
				pvg_report_error("option", "--write-seed",
						 "--write-seed needs a decimal number");
				return 2;
			}
			c->write = true;
			break;
		case '?':
			pvg_report_error("option", argv[optind - 1],
					 "unknown option or missing value; see pvisor-guest --help");
			return 2;
		default:
			if (pvg_cli_word(c, pvg_options[idx].name, optarg)) {
				pvg_report_error(NULL, NULL, "options too long");
				return 2;
			}
		}
	}
	if (optind < argc) {
		pvg_report_error("argument", argv[optind],
				 "unexpected argument; see pvisor-guest --help");
		return 2;
	}
	return 0;
}

/* The command line, then the flags: *p filled, or an error reported. 0 or exit status. */
static int pvg_load_params(const struct pvg_cli *c, struct pvg_params *p)
{
	static char proc[4096];
	const char *cmdline = c->cmdline ? c->cmdline : getenv("PVG_CMDLINE");
	char err[512];
	int ret;

	pvg_params__init(p);
	if (!cmdline && !c->host_digest) {
		ret = pvg_read_proc_cmdline(proc, sizeof(proc));
		if (ret) {
			snprintf(err, sizeof(err), "cannot read /proc/cmdline: %s; mount /proc or "
				 "pass --cmdline", strerror(-ret));
			pvg_report_error(NULL, NULL, err);
			return 2;
		}
		cmdline = proc;
	}
	if ((cmdline && pvg_params__parse(p, cmdline, err, sizeof(err))) ||
	    pvg_params__parse(p, c->extra, err, sizeof(err))) {
		pvg_report_error(NULL, NULL, err);
		return 2;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct pvg_cli c = { .cmdline = NULL };
	struct pvg_params p;
	int ret;

	signal(SIGPIPE, SIG_IGN);
	ret = pvg_cli_parse(&c, argc, argv);
	if (ret)
		return ret < 0 ? 0 : ret;
	if (c.file)
		return pvg_file_digest(c.file, c.want128);
	ret = pvg_load_params(&c, &p);
	if (ret)
		return ret;
	if (c.host_digest)
		return pvg_host_digest(&p, c.write, c.write_seed, c.want128);
	if (c.write) {
		pvg_report_error("option", "--write-seed", "--write-seed needs --host-digest");
		return 2;
	}
	return pvg_agent_run(&p);
}
