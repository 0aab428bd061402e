/* tvmm.h: helpers shared by the vmm memory-plane tests (t_ prefix, liburing style). */
#ifndef PVISOR_TESTS_TVMM_H
#define PVISOR_TESTS_TVMM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "mem.h"
#include "workload.h"

#define T_PASS 0
#define T_FAIL 1
#define T_SKIP 77

/* struct t_pool - a pvisor-pool this test started */
struct t_pool {
	pid_t pid;
	char dir[64];      /* temporary directory holding the socket and config */
	char sock[128];
	char conf[128];
};

/* Start a pool on a fresh socket; returns T_SKIP if the binary is missing. */
int t_pool_start(struct t_pool *p);
/* Restart on the same socket (after a kill). */
int t_pool_restart(struct t_pool *p);
void t_pool_kill(struct t_pool *p, int sig);
void t_pool_stop(struct t_pool *p);
/* `pvisor-pool stat --json` output, malloc'd, or NULL. */
char *t_pool_stat(struct t_pool *p);

/* Create and start a physical-dedup instance on @p of @mib MiB. */
struct vmm_mem *t_mem(struct t_pool *p, const char *name, uint64_t mib);
/* Same, started only if @start (fill first, then vmm_mem__start, to time the merge). */
struct vmm_mem *t_mem_cfg(struct t_pool *p, const char *name, uint64_t mib, bool start);
/* Write workload pages [0, pages) into guest RAM. */
void t_fill(struct vmm_mem *m, enum wl_kind k, uint64_t inst, uint64_t pages);
/* Compare guest RAM with the workload; number of pages that differ. */
uint64_t t_verify(struct vmm_mem *m, enum wl_kind k, uint64_t inst, uint64_t pages);
/* Poll stats until pages_shared >= want or @secs pass; returns pages_shared. */
uint64_t t_wait_shared(struct vmm_mem *m, uint64_t want, double secs);
/* Proportional set size of this process in KiB (smaps_rollup). */
uint64_t t_pss_kib(void);
uint64_t t_rss_kib(void);
double t_now(void);

#endif
