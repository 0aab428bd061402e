/* config.h: one table of keys serves the config file and the command line. */
#ifndef PVISOR_CONFIG_H
#define PVISOR_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/*
 * Every setting a program has is declared once in a struct conf_key table
 * (the model is Redis's config.c). The config file holds `key = value` lines
 * with `#` comments; the command line takes the same keys as `--key value`
 * or `--key=value`. main() loads the file first and the flags second, so a
 * flag always wins. Both report errors the same way: which key, which value,
 * what is allowed; file errors also name the file and line.
 */

enum conf_type {
	CONF_STR,   /* char[len] */
	CONF_BOOL,  /* bool; on|off|yes|no|true|false|1|0 */
	CONF_ENUM,  /* int, index into values[] */
	CONF_SIZE,  /* uint64_t bytes; suffixes K M G T (powers of 1024), KiB MiB GiB */
	CONF_UINT,  /* uint64_t */
	CONF_LEVEL, /* int log level: error|warn|info|debug */
};

/* struct conf_key - one setting */
struct conf_key {
	const char *name;          /* file key, and --name on the command line */
	enum conf_type type;
	size_t off;                /* offset of the field in the settings struct */
	size_t len;                /* CONF_STR: size of the char array */
	const char *def;           /* default, parsed like any other value; NULL = empty/0 */
	const char *const *values; /* CONF_ENUM: allowed values, NULL terminated */
	uint64_t min, max;         /* CONF_SIZE, CONF_UINT: inclusive bounds (max 0 = none) */
	const char *help;          /* one line for --help */
	bool cli_only;             /* refused in a config file (e.g. "config" itself) */
};

#define CONF_END { .name = NULL }

/* Set every key of @keys in @obj to its default. */
int conf_defaults(const struct conf_key *keys, void *obj, char *err, size_t errlen);

/*
 * Set one key from text. Returns 0, -ENOENT for an unknown key (err lists the
 * known ones) or -EINVAL for a bad value (err gives the allowed values).
 */
int conf_set(const struct conf_key *keys, void *obj, const char *key,
	     const char *val, char *err, size_t errlen);

/*
 * Read a config file. A missing file is an error only if @must_exist.
 * Returns 0 or -errno; err then reads "FILE:LINE: what was wrong".
 */
int conf_load(const struct conf_key *keys, void *obj, const char *path,
	      bool must_exist, char *err, size_t errlen);

/*
 * Parse --key value / --key=value pairs from argv[*idx] on, stopping at the
 * first argument that does not start with "--" or right after "--". Unknown
 * flags and bad values are errors. *idx is left at the first unparsed argument.
 */
int conf_parse_args(const struct conf_key *keys, void *obj, int argc,
		    char **argv, int *idx, char *err, size_t errlen);

/*
 * What every program does at start: defaults, then the config file (the one
 * named by --config, which must exist, else the "config" key's default if
 * the table has one, which may be missing), then the flags from argv[*idx].
 * Returns 0 or -errno with err set; *idx as for conf_parse_args().
 */
int conf_load_all(const struct conf_key *keys, void *obj, int argc, char **argv, int *idx,
		  char *err, size_t errlen);

/* Find the value of --name / --name=value in argv without parsing the rest. */
const char *conf_find_arg(int argc, char **argv, const char *name);

/* "64M" -> 67108864. Returns 0 or -EINVAL (also on overflow). */
int conf_parse_size(const char *s, uint64_t *out);

/* One line per key: flag, value kind, default, allowed values, help. */
void conf_usage(const struct conf_key *keys, FILE *out);

#endif
