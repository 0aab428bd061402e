/* dedup.h: internal interface between guest RAM (mem.c) and the physical-dedup client. */
#ifndef PVISOR_VMM_DEDUP_H
#define PVISOR_VMM_DEDUP_H

#include <pthread.h>
#include <stdint.h>

#include "mem.h"

struct vmm_dedup;

/* struct vmm_mem - one guest's RAM and its memory plane */
struct vmm_mem {
	uint8_t *ram;                 /* host mapping of guest RAM, page aligned */
	uint64_t size;                /* bytes of guest RAM */
	uint64_t pages;               /* size / 4096 */
	enum vmm_dedup_mode mode;     /* chosen at create, never changes */
	unsigned cpu_pct;             /* dedup thread CPU cap, 1..100 */
	uint64_t vma_budget;          /* from the cfg; 0 = derive */
	char *pool_path;              /* owned copies of the cfg strings */
	char *domain;
	char *name;
	struct vmm_dedup *dd;         /* physical mode only */
	bool started;                 /* vmm_mem__start done */
	pthread_mutex_t stats_lock;   /* protects pub */
	struct vmm_mem_stats pub;     /* snapshot published by the dedup thread */
};

/* Set up the client (uffd, page table); the thread starts in vmm_dedup__start. */
int vmm_dedup__create(struct vmm_mem *m, struct vmm_dedup **out);
int vmm_dedup__start(struct vmm_dedup *dd);
/* Stop and join the thread, wake every blocked writer, free everything. */
void vmm_dedup__destroy(struct vmm_dedup *dd);
/* Queue [first, first+n) for hashing ahead of everything else (any thread). */
void vmm_dedup__hint(struct vmm_dedup *dd, uint64_t first, uint64_t n);

#endif
