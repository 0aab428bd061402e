/* tvmm.c: helpers shared by the vmm memory-plane tests: a private pool, fill and verify. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "proto.h"
#include "tvmm.h"

static const char *t_pool_bin(void)
{
	const char *b = getenv("PVISOR_POOL_BIN");

	return b && *b ? b : "build/pool/pvisor-pool";
}

double t_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int t_pool_spawn(struct t_pool *p)
{
	const char *bin = t_pool_bin();

	unlink(p->sock);
	p->pid = fork();
	if (p->pid < 0)
		return T_FAIL;
	if (!p->pid) {
		/* A test that dies must not leave its pool holding meson's output pipe. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execl(bin, bin, "--socket", p->sock, "--config", p->conf, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		struct stat st;
		int status;

		if (!stat(p->sock, &st))
			return T_PASS;
		if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
			fprintf(stderr, "pool exited early (status %d)\n", status);
			p->pid = 0;
			return T_FAIL;
		}
		usleep(10000);
	}
	fprintf(stderr, "pool socket %s never appeared\n", p->sock);
	return T_FAIL;
}

int t_pool_start(struct t_pool *p)
{
	const char *bin = t_pool_bin();
	int fd;

	memset(p, 0, sizeof(*p));
	if (access(bin, X_OK)) {
		printf("SKIP: pool binary %s not found\n", bin);
		return T_SKIP;
	}
	snprintf(p->dir, sizeof(p->dir), "/tmp/pvisor-tvmm-XXXXXX");
	if (!mkdtemp(p->dir))
		return T_FAIL;
	snprintf(p->sock, sizeof(p->sock), "%s/pool.sock", p->dir);
	snprintf(p->conf, sizeof(p->conf), "%s/pool.conf", p->dir);
	fd = open(p->conf, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	if (fd < 0)
		return T_FAIL;
	close(fd);
	return t_pool_spawn(p);
}

int t_pool_restart(struct t_pool *p)
{
	return t_pool_spawn(p);
}

void t_pool_kill(struct t_pool *p, int sig)
{
	if (p->pid <= 0)
		return;
	kill(p->pid, sig);
	waitpid(p->pid, NULL, 0);
	p->pid = 0;
}

void t_pool_stop(struct t_pool *p)
{
	t_pool_kill(p, SIGTERM);
	unlink(p->sock);
	unlink(p->conf);
	if (p->dir[0])
		rmdir(p->dir);
}

char *t_pool_stat(struct t_pool *p)
{
	char cmd[512], *buf;
	size_t len = 0, cap = 1 << 20;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "%s stat --socket %s --json 2>/dev/null", t_pool_bin(), p->sock);
	f = popen(cmd, "r");
	if (!f)
		return NULL;
	buf = malloc(cap);
	if (buf)
		len = fread(buf, 1, cap - 1, f);
	pclose(f);
	if (buf)
		buf[len] = '\0';
	return buf;
}

struct vmm_mem *t_mem(struct t_pool *p, const char *name, uint64_t mib)
{
	return t_mem_cfg(p, name, mib, true);
}

struct vmm_mem *t_mem_cfg(struct t_pool *p, const char *name, uint64_t mib, bool start)
{
	struct vmm_mem_cfg cfg = {
		.size = mib << 20, .dedup = VMM_DEDUP_PHYSICAL, .pool_path = p->sock,
		.domain = "default", .name = name, .cpu_pct = 100,
	};
	struct vmm_mem *m;
	int ret = vmm_mem__create(&m, &cfg);

	if (ret) {
		fprintf(stderr, "vmm_mem__create: %s\n", strerror(-ret));
		return NULL;
	}
	ret = start ? vmm_mem__start(m) : 0;
	if (ret) {
		fprintf(stderr, "vmm_mem__start: %s\n", strerror(-ret));
		vmm_mem__destroy(m);
		return NULL;
	}
	return m;
}

void t_fill(struct vmm_mem *m, enum wl_kind k, uint64_t inst, uint64_t pages)
{
	for (uint64_t i = 0; i < pages; i++)
		wl_page(k, 1, inst, i, vmm_mem__hva(m, GPA(i * PROTO_PAGE_SIZE), PROTO_PAGE_SIZE));
}

uint64_t t_verify(struct vmm_mem *m, enum wl_kind k, uint64_t inst, uint64_t pages)
{
	static __thread uint8_t want[PROTO_PAGE_SIZE];
	uint64_t bad = 0;

	for (uint64_t i = 0; i < pages; i++) {
		wl_page(k, 1, inst, i, want);
		if (memcmp(want, vmm_mem__hva(m, GPA(i * PROTO_PAGE_SIZE), PROTO_PAGE_SIZE),
			   PROTO_PAGE_SIZE))
			bad++;
	}
	return bad;
}

uint64_t t_wait_shared(struct vmm_mem *m, uint64_t want, double secs)
{
	struct vmm_mem_stats st;
	double end = t_now() + secs;

	for (;;) {
		vmm_mem__stats(m, &st);
		if (st.pages_shared >= want || t_now() > end)
			return st.pages_shared;
		usleep(10000);
	}
}

static uint64_t t_rollup(const char *key)
{
	char line[256];
	uint64_t v = 0;
	FILE *f = fopen("/proc/self/smaps_rollup", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, strlen(key)))
			v = strtoull(line + strlen(key), NULL, 10);
	fclose(f);
	return v;
}

uint64_t t_pss_kib(void)
{
	return t_rollup("Pss:");
}

uint64_t t_rss_kib(void)
{
	return t_rollup("Rss:");
}
