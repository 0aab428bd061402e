/* t-config.c: the config table parses files and flags alike, the flag wins, errors name the culprit. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

struct t_settings {
	char config[64];
	char path[64];
	bool flag;
	int mode;
	uint64_t size;
	uint64_t count;
	int level;
};

static const char *const t_modes[] = { "domain", "none", NULL };

static const struct conf_key t_keys[] = {
	{ "config", CONF_STR, offsetof(struct t_settings, config), 64, "/nonexistent/default.conf", NULL, 0, 0, "file", true },
	{ "path", CONF_STR, offsetof(struct t_settings, path), 64, "/run/x", NULL, 0, 0, "a path", false },
	{ "physical", CONF_BOOL, offsetof(struct t_settings, flag), 0, "off", NULL, 0, 0, "a bool", false },
	{ "share", CONF_ENUM, offsetof(struct t_settings, mode), 0, "domain", t_modes, 0, 0, "an enum", false },
	{ "store-limit", CONF_SIZE, offsetof(struct t_settings, size), 0, "4G", NULL, 4096, 0, "a size", false },
	{ "count", CONF_UINT, offsetof(struct t_settings, count), 0, "3", NULL, 1, 10, "a number", false },
	{ "log-level", CONF_LEVEL, offsetof(struct t_settings, level), 0, "info", NULL, 0, 0, "a level", false },
	CONF_END
};

static int failures;

#define T_CHECK(cond)                                                        \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			failures++;                                          \
		}                                                            \
	} while (0)

static void t_write(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f || fputs(text, f) < 0 || fclose(f)) {
		perror(path);
		exit(1);
	}
}

int main(void)
{
	char err[1024], path[] = "/tmp/t-config-XXXXXX";
	struct t_settings s;
	uint64_t v;
	int fd, idx;

	fd = mkstemp(path);
	if (fd < 0)
		return 1;
	close(fd);

	T_CHECK(conf_defaults(t_keys, &s, err, sizeof(err)) == 0);
	T_CHECK(!strcmp(s.path, "/run/x") && !s.flag && s.mode == 0);
	T_CHECK(s.size == 4ull << 30 && s.count == 3 && s.level == 2);

	T_CHECK(conf_parse_size("64M", &v) == 0 && v == 64ull << 20);
	T_CHECK(conf_parse_size("2GiB", &v) == 0 && v == 2ull << 30);
	T_CHECK(conf_parse_size("4096", &v) == 0 && v == 4096);
	T_CHECK(conf_parse_size("12Q", &v) == -EINVAL);
	T_CHECK(conf_parse_size("-1", &v) == -EINVAL);
	T_CHECK(conf_parse_size("99999999999999999999T", &v) == -EINVAL);

	/* A file sets values; comments and blank lines are ignored. */
	t_write(path, "# comment\n\nphysical = on   # trailing\nshare=none\nstore-limit = 1G\n");
	T_CHECK(conf_load(t_keys, &s, path, true, err, sizeof(err)) == 0);
	T_CHECK(s.flag && s.mode == 1 && s.size == 1ull << 30);

	/* The flag wins over the file. */
	{
		char *argv[] = { "prog", "--share", "domain", "--physical", "--count=7", "rest", NULL };

		idx = 1;
		T_CHECK(conf_parse_args(t_keys, &s, 6, argv, &idx, err, sizeof(err)) == 0);
		T_CHECK(s.mode == 0 && s.flag && s.count == 7 && idx == 5);
		T_CHECK(!strcmp(conf_find_arg(6, argv, "share"), "domain"));
	}

	/* Errors name the file, the line, the key and the allowed values. */
	t_write(path, "physical = on\nshare = maybe\n");
	T_CHECK(conf_load(t_keys, &s, path, true, err, sizeof(err)) == -EINVAL);
	T_CHECK(strstr(err, path) && strstr(err, ":2:") && strstr(err, "share") &&
		strstr(err, "domain|none"));
	t_write(path, "bogus = 1\n");
	T_CHECK(conf_load(t_keys, &s, path, true, err, sizeof(err)) == -ENOENT);
	T_CHECK(strstr(err, ":1:") && strstr(err, "bogus"));
	t_write(path, "just words\n");
	T_CHECK(conf_load(t_keys, &s, path, true, err, sizeof(err)) == -EINVAL);
	T_CHECK(strstr(err, ":1:") && strstr(err, "key = value"));
	T_CHECK(conf_load(t_keys, &s, "/nonexistent/x.conf", true, err, sizeof(err)) == -ENOENT);
	T_CHECK(strstr(err, "/nonexistent/x.conf") != NULL);
	T_CHECK(conf_load(t_keys, &s, "/nonexistent/x.conf", false, err, sizeof(err)) == 0);
	{
		char *argv[] = { "prog", "--count", "11", NULL };
		char *argv2[] = { "prog", "--nope", "1", NULL };
		char *argv3[] = { "prog", "--count", NULL };

		idx = 1;
		T_CHECK(conf_parse_args(t_keys, &s, 3, argv, &idx, err, sizeof(err)) == -EINVAL);
		T_CHECK(strstr(err, "--count") && strstr(err, "1..10"));
		idx = 1;
		T_CHECK(conf_parse_args(t_keys, &s, 3, argv2, &idx, err, sizeof(err)) == -ENOENT);
		T_CHECK(strstr(err, "--nope") != NULL);
		idx = 1;
		T_CHECK(conf_parse_args(t_keys, &s, 2, argv3, &idx, err, sizeof(err)) == -EINVAL);
	}
	/* The whole start-up sequence: a missing default file is fine, the flag wins. */
	{
		char *argv[] = { "prog", "--count", "9", NULL };
		char *argv2[] = { "prog", "--config", path, "--count", "8", NULL };
		char *argv3[] = { "prog", "--config", "/nonexistent/named.conf", NULL };

		idx = 1;
		T_CHECK(conf_load_all(t_keys, &s, 3, argv, &idx, err, sizeof(err)) == 0);
		T_CHECK(s.count == 9 && s.mode == 0 && !s.flag);
		t_write(path, "physical = on\ncount = 2\n");
		idx = 1;
		T_CHECK(conf_load_all(t_keys, &s, 5, argv2, &idx, err, sizeof(err)) == 0);
		T_CHECK(s.flag && s.count == 8 && idx == 5);
		idx = 1;
		T_CHECK(conf_load_all(t_keys, &s, 3, argv3, &idx, err, sizeof(err)) == -ENOENT);
		T_CHECK(strstr(err, "/nonexistent/named.conf") != NULL);
		t_write(path, "config = /x\n");
		idx = 1;
		T_CHECK(conf_load_all(t_keys, &s, 5, argv2, &idx, err, sizeof(err)) == -EINVAL);
	}
	unlink(path);
	if (failures)
		fprintf(stderr, "t-config: %d checks failed\n", failures);
	return failures ? 1 : 0;
}
