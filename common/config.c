/* config.c: parse config files and --key value flags against one key table. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"

static const char *const conf_bool_words[] = { "on", "off", "yes", "no", "true",
					       "false", "1", "0", NULL };
static const char *const conf_level_words[] = { "error", "warn", "info", "debug", NULL };

static void conf_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void conf_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static const struct conf_key *conf_lookup(const struct conf_key *keys, const char *name,
					  size_t namelen)
{
	for (; keys->name; keys++)
		if (strlen(keys->name) == namelen && !strncmp(keys->name, name, namelen))
			return keys;
	return NULL;
}

/* "a|b|c" into buf, for error messages and --help. */
static void conf_join(const char *const *words, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (; *words && used < len; words++)
		used += snprintf(buf + used, len - used, "%s%s", used ? "|" : "", *words);
}

int conf_parse_size(const char *s, uint64_t *out)
{
	static const struct { const char *suffix; unsigned shift; } units[] = {
		{ "", 0 }, { "K", 10 }, { "KiB", 10 }, { "M", 20 }, { "MiB", 20 },
		{ "G", 30 }, { "GiB", 30 }, { "T", 40 }, { "TiB", 40 },
	};
	char *end;
	unsigned long long v;

	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -EINVAL;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcasecmp(end, units[i].suffix))
			continue;
		if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
			return -EINVAL;
		*out = (uint64_t)v << units[i].shift;
		return 0;
	}
	return -EINVAL;
}

static int conf_word_index(const char *const *words, const char *val)
{
	for (int i = 0; words[i]; i++)
		if (!strcmp(words[i], val))
			return i;
	return -1;
}

static int conf_set_key(const struct conf_key *k, void *obj, const char *val,
			char *err, size_t errlen)
{
	char *field = (char *)obj + k->off;
	char allowed[256];
	uint64_t v;
	char *end;
	int i;

	switch (k->type) {
	case CONF_STR:
		if (strlen(val) >= k->len) {
			conf_err(err, errlen, "value for '%s' is too long (at most %zu characters)",
				 k->name, k->len - 1);
			return -EINVAL;
		}
		strcpy(field, val);
		return 0;
	case CONF_BOOL:
		i = conf_word_index(conf_bool_words, val);
		if (i < 0) {
			conf_err(err, errlen, "bad value '%s' for '%s' (allowed: on, off)", val, k->name);
			return -EINVAL;
		}
		*(bool *)field = !(i & 1);
		return 0;
	case CONF_ENUM:
	case CONF_LEVEL:
		i = conf_word_index(k->type == CONF_ENUM ? k->values : conf_level_words, val);
		if (i < 0) {
			conf_join(k->type == CONF_ENUM ? k->values : conf_level_words, allowed,
				  sizeof(allowed));
			conf_err(err, errlen, "bad value '%s' for '%s' (allowed: %s)", val, k->name,
				 allowed);
			return -EINVAL;
		}
		*(int *)field = i;
		return 0;
	case CONF_SIZE:
	case CONF_UINT:
		if (k->type == CONF_SIZE) {
			if (conf_parse_size(val, &v)) {
				conf_err(err, errlen, "bad size '%s' for '%s' (a number with an optional K, M, G or T suffix)",
					 val, k->name);
				return -EINVAL;
			}
		} else {
			errno = 0;
			v = strtoull(val, &end, 0);
			if (errno || end == val || *end || *val == '-') {
				conf_err(err, errlen, "bad number '%s' for '%s'", val, k->name);
				return -EINVAL;
			}
		}
		if (v < k->min || (k->max && v > k->max)) {
			conf_err(err, errlen, "value '%s' for '%s' is out of range (%" PRIu64 "..%" PRIu64 ")",
				 val, k->name, k->min, k->max);
			return -EINVAL;
		}
		*(uint64_t *)field = v;
		return 0;
	}
	return -EINVAL;
}

int conf_defaults(const struct conf_key *keys, void *obj, char *err, size_t errlen)
{
	for (; keys->name; keys++) {
		int ret;

		if (!keys->def) {
			if (keys->type == CONF_STR)
				((char *)obj + keys->off)[0] = '\0';
			continue;
		}
		ret = conf_set_key(keys, obj, keys->def, err, errlen);
		if (ret)
			return ret;
	}
	return 0;
}

static void conf_unknown(const struct conf_key *keys, const char *key, const char *how,
			 char *err, size_t errlen)
{
	char known[1024];
	size_t used = 0;

	known[0] = '\0';
	for (; keys->name && used < sizeof(known); keys++)
		used += snprintf(known + used, sizeof(known) - used, "%s%s", used ? ", " : "",
				 keys->name);
	conf_err(err, errlen, "unknown %s '%s' (known: %s)", how, key, known);
}

int conf_set(const struct conf_key *keys, void *obj, const char *key, const char *val,
	     char *err, size_t errlen)
{
	const struct conf_key *k = conf_lookup(keys, key, strlen(key));

	if (!k) {
		conf_unknown(keys, key, "key", err, errlen);
		return -ENOENT;
	}
	return conf_set_key(k, obj, val, err, errlen);
}

static char *conf_trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

/* One "key = value" line; comments and blank lines were removed by the caller. */
static int conf_line(const struct conf_key *keys, void *obj, char *line, char *err,
		     size_t errlen)
{
	const struct conf_key *k;
	char *eq = strchr(line, '=');
	char *key, *val;

	if (!eq) {
		conf_err(err, errlen, "expected 'key = value', got '%s'", line);
		return -EINVAL;
	}
	*eq = '\0';
	key = conf_trim(line);
	val = conf_trim(eq + 1);
	k = conf_lookup(keys, key, strlen(key));
	if (!k) {
		conf_unknown(keys, key, "key", err, errlen);
		return -ENOENT;
	}
	if (k->cli_only) {
		conf_err(err, errlen, "'%s' can only be given on the command line", key);
		return -EINVAL;
	}
	return conf_set_key(k, obj, val, err, errlen);
}

int conf_load(const struct conf_key *keys, void *obj, const char *path, bool must_exist,
	      char *err, size_t errlen)
{
	char line[1024], msg[768];
	unsigned lineno = 0;
	int ret = 0;
	FILE *f;

	f = fopen(path, "r");
	if (!f) {
		ret = -errno;
		if (ret == -ENOENT && !must_exist)
			return 0;
		conf_err(err, errlen, "%s: cannot open config file: %s", path, strerror(-ret));
		return ret;
	}
	while (fgets(line, sizeof(line), f)) {
		char *hash, *s;

		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			conf_err(err, errlen, "%s:%u: line longer than %zu characters", path,
				 lineno, sizeof(line) - 2);
			ret = -EINVAL;
			break;
		}
		hash = strchr(line, '#');
		if (hash)
			*hash = '\0';
		s = conf_trim(line);
		if (!*s)
			continue;
		ret = conf_line(keys, obj, s, msg, sizeof(msg));
		if (ret) {
			conf_err(err, errlen, "%s:%u: %s", path, lineno, msg);
			break;
		}
	}
	fclose(f);
	return ret;
}

const char *conf_find_arg(int argc, char **argv, const char *name)
{
	size_t n = strlen(name);

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strcmp(a, "--"))
			break;
		if (strncmp(a, "--", 2) || strncmp(a + 2, name, n))
			continue;
		if (a[2 + n] == '=')
			return a + 3 + n;
		if (!a[2 + n] && i + 1 < argc)
			return argv[i + 1];
	}
	return NULL;
}

int conf_parse_args(const struct conf_key *keys, void *obj, int argc, char **argv, int *idx,
		    char *err, size_t errlen)
{
	char msg[768];
	int i = *idx;

	while (i < argc && !strncmp(argv[i], "--", 2)) {
		const char *name = argv[i] + 2, *eq, *val;
		const struct conf_key *k;
		int ret;

		if (!*name) {
			i++;
			break;
		}
		eq = strchr(name, '=');
		k = conf_lookup(keys, name, eq ? (size_t)(eq - name) : strlen(name));
		if (!k) {
			char flag[128];

			snprintf(flag, sizeof(flag), "--%.*s", eq ? (int)(eq - name) : (int)strlen(name),
				 name);
			conf_unknown(keys, flag, "flag", msg, sizeof(msg));
			conf_err(err, errlen, "%s (see --help)", msg);
			*idx = i;
			return -ENOENT;
		}
		if (eq) {
			val = eq + 1;
			i++;
		} else if (k->type == CONF_BOOL &&
			   (i + 1 >= argc || conf_word_index(conf_bool_words, argv[i + 1]) < 0)) {
			val = "on"; /* a bare boolean flag switches it on */
			i++;
		} else if (i + 1 < argc) {
			val = argv[i + 1];
			i += 2;
		} else {
			conf_err(err, errlen, "flag --%s needs a value", k->name);
			*idx = i;
			return -EINVAL;
		}
		ret = conf_set_key(k, obj, val, msg, sizeof(msg));
		if (ret) {
			conf_err(err, errlen, "--%s: %s", k->name, msg);
			*idx = i;
			return ret;
		}
	}
	*idx = i;
	return 0;
}

int conf_load_all(const struct conf_key *keys, void *obj, int argc, char **argv, int *idx,
		  char *err, size_t errlen)
{
	const struct conf_key *k = conf_lookup(keys, "config", strlen("config"));
	const char *file = conf_find_arg(argc, argv, "config");
	int ret;

	ret = conf_defaults(keys, obj, err, errlen);
	if (ret)
		return ret;
	if (file)
		ret = conf_load(keys, obj, file, true, err, errlen);
	else if (k && k->def && *k->def)
		ret = conf_load(keys, obj, k->def, false, err, errlen);
	if (ret)
		return ret;
	return conf_parse_args(keys, obj, argc, argv, idx, err, errlen);
}

void conf_usage(const struct conf_key *keys, FILE *out)
{
	static const char *const kinds[] = { "STR", "on|off", "", "SIZE", "N", "" };
	char allowed[256], flag[320];

	for (; keys->name; keys++) {
		const char *kind = kinds[keys->type];

		if (keys->type == CONF_ENUM) {
			conf_join(keys->values, allowed, sizeof(allowed));
			kind = allowed;
		} else if (keys->type == CONF_LEVEL) {
			conf_join(conf_level_words, allowed, sizeof(allowed));
			kind = allowed;
		}
		snprintf(flag, sizeof(flag), "--%s %s", keys->name, kind);
		fprintf(out, "  %-34s %s", flag, keys->help ? keys->help : "");
		if (keys->def && *keys->def)
			fprintf(out, " (default: %s)", keys->def);
		fputc('\n', out);
	}
}
