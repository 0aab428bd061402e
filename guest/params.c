/* params.c: pvisor-guest's pvg.KEY=VALUE parameters from the kernel command line. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "pvg.h"

const char *const pvg_exit_names[] = { "poweroff", "reboot", "none", NULL };

/* struct pvg_key - one pvg.KEY: its name, its parser and what it accepts */
struct pvg_key {
	const char *name;      /* after "pvg." */
	int (*set)(struct pvg_params *p, const char *val);
	const char *allowed;   /* for the error message */
};

void pvg_params__init(struct pvg_params *p)
{
	memset(p, 0, sizeof(*p));
	p->workload = PVG_WL_NONE;
	p->size = 64ull << 20;
	p->seed = 1;
	p->exit = PVG_EXIT_POWEROFF;
}

int pvg_parse_u64(const char *s, uint64_t *out)
{
	unsigned long long v;
	char *end;

	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

static int pvg_word(const char *const *words, const char *val)
{
	for (int i = 0; words[i]; i++)
		if (!strcmp(words[i], val))
			return i;
	return -EINVAL;
}

static int pvg_set_workload(struct pvg_params *p, const char *val)
{
	int w = strcmp(val, "none") ? wl_parse(val) : PVG_WL_NONE;

	if (w < 0)
		return w;
	p->workload = w;
	return 0;
}

static int pvg_set_size(struct pvg_params *p, const char *val)
{
	uint64_t v;

	if (conf_parse_size(val, &v) || !v || v % 4096 || v > PVG_SIZE_MAX)
		return -EINVAL;
	p->size = v;
	return 0;
}

static int pvg_set_seed(struct pvg_params *p, const char *val)
{
	return pvg_parse_u64(val, &p->seed);
}

static int pvg_set_instance(struct pvg_params *p, const char *val)
{
	return pvg_parse_u64(val, &p->instance);
}

static int pvg_set_load(struct pvg_params *p, const char *val)
{
	if (*val != '/' || strlen(val) >= sizeof(p->load))
		return -EINVAL;
	strcpy(p->load, val);
	return 0;
}

static int pvg_set_hold(struct pvg_params *p, const char *val)
{
	uint64_t v;

	if (pvg_parse_u64(val, &v) || v > PVG_SECONDS_MAX)
		return -EINVAL;
	p->hold_s = (unsigned)v;
	return 0;
}

static int pvg_set_exit(struct pvg_params *p, const char *val)
{
	int e = pvg_word(pvg_exit_names, val);

	if (e < 0)
		return e;
	p->exit = e;
	return 0;
}

static const struct pvg_key pvg_keys[] = {
	{ "workload", pvg_set_workload,
	  "repeated|shared-random|unique-random|zeros|patterns|none" },
	{ "size", pvg_set_size, "a multiple of 4K up to 1T with an optional K, M or G suffix, e.g. 64M" },
	{ "seed", pvg_set_seed, "a decimal number" },
	{ "instance", pvg_set_instance, "a decimal number" },
	{ "load", pvg_set_load, "an absolute path of at most 255 bytes, e.g. /dev/vda" },
	{ "hold", pvg_set_hold, "seconds, 0 to 86400" },
	{ "exit", pvg_set_exit, "poweroff|reboot|none" },
	{ NULL, NULL, NULL },
};

static void pvg_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* One word "pvg.KEY=VALUE" (already known to start with "pvg."). */
static int pvg_apply(struct pvg_params *p, const char *word, char *err, size_t errlen)
{
	const char *name = word + 4, *eq = strchr(name, '=');
	size_t nlen = eq ? (size_t)(eq - name) : strlen(name);

	for (const struct pvg_key *k = pvg_keys; k->name; k++) {
		if (strlen(k->name) != nlen || strncmp(k->name, name, nlen))
			continue;
		if (!eq) {
			pvg_err(err, errlen, "pvg.%s needs a value: pvg.%s=VALUE (%s)", k->name,
				k->name, k->allowed);
			return -EINVAL;
		}
		if (k->set(p, eq + 1)) {
			pvg_err(err, errlen, "pvg.%s: bad value '%.64s'; allowed: %s", k->name, eq + 1,
				k->allowed);
			return -EINVAL;
		}
		return 0;
	}
	pvg_err(err, errlen, "unknown parameter '%.*s'; known: pvg.workload, pvg.size, pvg.seed, "
		"pvg.instance, pvg.load, pvg.hold, pvg.exit", (int)(nlen + 4 > 64 ? 64 : nlen + 4),
		word);
	return -EINVAL;
}

int pvg_params__parse(struct pvg_params *p, const char *cmdline, char *err, size_t errlen)
{
	char word[512];
	const char *s = cmdline;

	while (*s) {
		size_t n;

		while (isspace((unsigned char)*s))
			s++;
		n = strcspn(s, " \t\r\n");
		if (!n)
			break;
		if (!strncmp(s, "pvg.", 4)) {
			if (n >= sizeof(word)) {
				pvg_err(err, errlen, "parameter '%.32s...' is longer than %zu bytes", s,
					sizeof(word) - 1);
				return -EINVAL;
			}
			memcpy(word, s, n);
			word[n] = '\0';
			if (pvg_apply(p, word, err, errlen))
				return -EINVAL;
		}
		s += n;
	}
	return 0;
}
