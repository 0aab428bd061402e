/* log.c: leveled logging to stderr with a monotonic timestamp. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

static const char *log_prog = "pvisor";
static enum log_level log_level_cur = LOG_INFO;
static const char *const log_names[] = { "error", "warn", "info", "debug" };

void log_init(const char *prog, enum log_level level)
{
	log_prog = prog;
	log_level_cur = level;
}

void log_set_level(enum log_level level) { log_level_cur = level; }
enum log_level log_get_level(void) { return log_level_cur; }

int log_level_parse(const char *s)
{
	for (int i = 0; i <= LOG_DEBUG; i++)
		if (!strcmp(s, log_names[i]))
			return i;
	return -EINVAL;
}

static void log_vmsg(enum log_level level, const char *fmt, va_list ap)
{
	struct timespec ts;
	char buf[1024];

	clock_gettime(CLOCK_MONOTONIC, &ts);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	/* One fprintf per line so lines from several threads do not interleave. */
	fprintf(stderr, "[%5ld.%03ld] %s: %s%s\n", (long)ts.tv_sec,
		ts.tv_nsec / 1000000, log_prog,
		level == LOG_ERROR ? "error: " : level == LOG_WARN ? "warning: " : "",
		buf);
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	va_list ap;

	if (level > log_level_cur)
		return;
	va_start(ap, fmt);
	log_vmsg(level, fmt, ap);
	va_end(ap);
}

void log_die(int status, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vmsg(LOG_ERROR, fmt, ap);
	va_end(ap);
	exit(status);
}
