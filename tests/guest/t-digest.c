/* t-digest.c: pvisor-guest's digests against XXH3 computed here with libxxhash. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "workload.h"

/*
 * The agent carries its own inline xxHash and its own copy of the workload
 * generator; this test recomputes both digests from the shared library
 * (libxxhash + common's wl_page) and compares them with what the agent prints
 * in host mode (--host-digest, --file-digest), so a change in either side's
 * definition fails here. Usage: t-digest [PATH-TO-pvisor-guest]; default
 * $PVISOR_BUILD/guest/pvisor-guest.
 */

static int fails;

#define CHECK(cond, ...) do { \
	if (!(cond)) { printf("  not ok: " __VA_ARGS__); printf("\n"); fails++; } \
	else { printf("  ok: " __VA_ARGS__); printf("\n"); } } while (0)

static char agent[4096];

/* Run the agent with @args; its first output line (trimmed) into @out. Exit status or -1. */
static int run_agent(const char *args, char *out, size_t len)
{
	char cmd[8192];
	FILE *p;
	int st;

	snprintf(cmd, sizeof(cmd), "'%s' %s", agent, args);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	if (!fgets(out, (int)len, p))
		out[0] = '\0';
	out[strcspn(out, "\n")] = '\0';
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void hex64(uint64_t v, char out[17])
{
	snprintf(out, 17, "%016" PRIx64, v);
}

static void hex128(XXH128_hash_t h, char out[33])
{
	snprintf(out, 33, "%016" PRIx64 "%016" PRIx64, (uint64_t)h.high64, (uint64_t)h.low64);
}

/* XXH3 of a whole workload, materialised in memory as the guest holds it. */
static void workload_digests(int kind, uint64_t seed, uint64_t instance, uint64_t pages,
			     char h64[17], char h128[33])
{
	uint8_t *buf = malloc(pages * 4096 + 1);

	for (uint64_t i = 0; i < pages; i++)
		wl_page(kind, seed, instance, i, buf + i * 4096);
	hex64(XXH3_64bits(buf, pages * 4096), h64);
	hex128(XXH3_128bits(buf, pages * 4096), h128);
	free(buf);
}

static void check_workloads(void)
{
	static const struct { int kind; uint64_t seed, instance, pages; } cases[] = {
		{ WL_REPEATED, 3, 0, 64 }, { WL_SHARED_RANDOM, 7, 1, 1000 },
		{ WL_UNIQUE_RANDOM, 7, 2, 257 }, { WL_ZEROS, 1, 0, 16 }, { WL_PATTERNS, 1, 0, 9 },
	};
	char want64[17], want128[33], got[256], args[256];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *name = wl_names[cases[i].kind];
		int rc;

		workload_digests(cases[i].kind, cases[i].seed, cases[i].instance, cases[i].pages,
				 want64, want128);
		snprintf(args, sizeof(args), "--host-digest --workload %s --size %" PRIu64
			 " --seed %" PRIu64 " --instance %" PRIu64, name, cases[i].pages * 4096,
			 cases[i].seed, cases[i].instance);
		rc = run_agent(args, got, sizeof(got));
		CHECK(rc == 0 && !strcmp(got, want64), "%s XXH3-64: agent %s (exit %d), libxxhash %s",
		      name, got, rc, want64);
		strcat(args, " --digest128");
		rc = run_agent(args, got, sizeof(got));
		CHECK(rc == 0 && !strcmp(got, want128), "%s XXH3-128: agent %s, libxxhash %s", name,
		      got, want128);
	}
	/* after `write 11`: unique-random seed 11 of the same instance */
	workload_digests(WL_UNIQUE_RANDOM, 11, 4, 100, want64, want128);
	run_agent("--host-digest --workload zeros --size 400K --instance 4 --write-seed 11", got,
		  sizeof(got));
	CHECK(!strcmp(got, want64), "--write-seed 11: agent %s, libxxhash %s", got, want64);
	/* no workload: the digest of no bytes */
	hex64(XXH3_64bits(NULL, 0), want64);
	run_agent("--host-digest --workload none", got, sizeof(got));
	CHECK(!strcmp(got, want64), "workload none: agent %s, XXH3-64 of nothing %s", got, want64);
}

/* A file of odd length: the digest covers exactly its bytes, not the page padding. */
static void check_file(void)
{
	char path[] = "/tmp/pvg-digest.XXXXXX", want[17], got[256], args[4200];
	size_t len = 3 * 4096 + 123;
	uint8_t *buf = malloc(len);
	int fd = mkstemp(path);

	if (fd < 0 || !buf) {
		CHECK(0, "temp file: %s", strerror(errno));
		free(buf);
		return;
	}
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 131 + 7);
	CHECK(write(fd, buf, len) == (ssize_t)len, "wrote %zu bytes to %s", len, path);
	close(fd);
	hex64(XXH3_64bits(buf, len), want);
	snprintf(args, sizeof(args), "--file-digest '%s'", path);
	run_agent(args, got, sizeof(got));
	CHECK(!strcmp(got, want), "file digest: agent %s, libxxhash %s", got, want);
	unlink(path);
	free(buf);
}

int main(int argc, char **argv)
{
	const char *b = getenv("PVISOR_BUILD");

	if (argc > 1)
		snprintf(agent, sizeof(agent), "%s", argv[1]);
	else
		snprintf(agent, sizeof(agent), "%s/guest/pvisor-guest", b ? b : "build");
	if (access(agent, X_OK)) {
		printf("SKIP: no pvisor-guest at %s\n", agent);
		return 77;
	}
	check_workloads();
	check_file();
	printf("%s: %d check(s) failed\n", fails ? "FAIL" : "PASS", fails);
	return fails ? 1 : 0;
}
