/* report.c: pvisor-guest's `PVG {json}` report lines on the console. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pvg.h"

/*
 * Every report is one line "PVG " + a flat JSON object whose first key is
 * "event", written with a single write(2) so that kernel messages on the same
 * console can only come between lines, not inside one. A line that would not
 * fit is cut at a key boundary, never in the middle of a value.
 */

double pvg_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Append formatted text; if it does not fit, the append is dropped as a whole. */
static void pvg_line_add(struct pvg_line *l, const char *fmt, ...)
{
	size_t room = sizeof(l->buf) - l->len;
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(l->buf + l->len, room, fmt, ap);
	va_end(ap);
	/* keep 3 bytes for the closing "}\n" and the terminator */
	if (n < 0 || (size_t)n + 3 > room) {
		l->buf[l->len] = '\0';
		return;
	}
	l->len += (size_t)n;
}

/* A JSON string body: quotes, backslashes and control bytes escaped. */
static void pvg_escape(const char *s, char *out, size_t outlen)
{
	size_t o = 0;

	for (; *s && o + 7 < outlen; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\') {
			out[o++] = '\\';
			out[o++] = (char)c;
		} else if (c < 0x20 || c == 0x7f) {
			o += (size_t)snprintf(out + o, outlen - o, "\\u%04x", c);
		} else {
			out[o++] = (char)c;
		}
	}
	out[o] = '\0';
}

void pvg_line_begin(struct pvg_line *l, const char *event)
{
	l->len = 0;
	pvg_line_add(l, "PVG {\"event\":\"%s\"", event);
}

void pvg_line_str(struct pvg_line *l, const char *key, const char *val)
{
	char esc[1024];

	if (!val) {
		pvg_line_add(l, ",\"%s\":null", key);
		return;
	}
	pvg_escape(val, esc, sizeof(esc));
	pvg_line_add(l, ",\"%s\":\"%s\"", key, esc);
}

void pvg_line_u64(struct pvg_line *l, const char *key, uint64_t val)
{
	pvg_line_add(l, ",\"%s\":%" PRIu64, key, val);
}

void pvg_line_i64(struct pvg_line *l, const char *key, int64_t val)
{
	pvg_line_add(l, ",\"%s\":%" PRId64, key, val);
}

void pvg_line_secs(struct pvg_line *l, const char *key, double s)
{
	pvg_line_add(l, ",\"%s\":%.3f", key, s);
}

void pvg_line_bool(struct pvg_line *l, const char *key, bool val)
{
	pvg_line_add(l, ",\"%s\":%s", key, val ? "true" : "false");
}

void pvg_line_end(struct pvg_line *l)
{
	size_t off = 0;

	memcpy(l->buf + l->len, "}\n", 3);
	l->len += 2;
	while (off < l->len) {
		ssize_t n = write(STDOUT_FILENO, l->buf + off, l->len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;   /* the console is gone: nobody left to tell */
		off += (size_t)n;
	}
}

void pvg_report_error(const char *context_key, const char *context, const char *msg)
{
	struct pvg_line l;

	pvg_line_begin(&l, "error");
	pvg_line_bool(&l, "ok", false);
	if (context_key)
		pvg_line_str(&l, context_key, context);
	pvg_line_str(&l, "error", msg);
	pvg_line_end(&l);
}
