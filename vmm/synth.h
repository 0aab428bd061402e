/* synth.h: the synthetic guest, VMM threads that stand in for vCPUs on guest RAM. */
#ifndef PVISOR_VMM_SYNTH_H
#define PVISOR_VMM_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "workload.h"

struct vmm_mem;
struct vmm_synth;

/* Workload "none": the guest touches nothing at start. */
#define VMM_WL_NONE WL_COUNT

/* struct vmm_synth_cfg - what the synthetic guest writes at start */
struct vmm_synth_cfg {
	int workload;          /* enum wl_kind, or VMM_WL_NONE */
	uint64_t seed;         /* workload seed */
	uint64_t instance;     /* per-instance seed (unique-random) */
	uint64_t data_pages;   /* pages [0, data_pages) get the workload */
	unsigned vcpus;        /* threads that share the start-up fill and verify */
	int stop_fd;           /* eventfd written once when the guest ends by itself */
};

enum vmm_synth_op { VMM_SYNTH_FILL, VMM_SYNTH_VERIFY, VMM_SYNTH_DIGEST, VMM_SYNTH_POKE };

/* struct vmm_synth_cmd - one API request run on the guest's first vCPU thread */
struct vmm_synth_cmd {
	enum vmm_synth_op op;
	uint64_t first;        /* first guest page */
	uint64_t count;        /* pages, at least 1; the range lies inside guest RAM */
	int kind;              /* fill, verify: enum wl_kind */
	uint64_t seed;         /* fill, verify */
	uint64_t instance;     /* fill, verify */
	unsigned offset;       /* poke: byte offset inside each page, < 4096 */
	uint8_t byte;          /* poke: value written */
	/* results */
	int ret;               /* 0 or -errno */
	uint64_t mismatched;   /* verify: pages that differ */
	uint64_t first_bad;    /* verify: first page that differs (valid if mismatched) */
	uint64_t digest[2];    /* digest: XXH3-128 of the range, low word first */
	uint64_t ns;           /* time the operation took on the guest thread */
};

/* Start the vCPU threads; they fill and verify the workload, then wait for commands. */
int vmm_synth__start(struct vmm_synth **out, struct vmm_mem *mem, const struct vmm_synth_cfg *cfg);
/* Ask the threads to stop (a running fill or verify ends early); does not wait. */
void vmm_synth__interrupt(struct vmm_synth *s);
/* Stop the threads, wait for them and free everything. */
void vmm_synth__stop(struct vmm_synth *s);

/* Run @cmd on the first vCPU thread and wait for it. 0, or -ESHUTDOWN when stopping. */
int vmm_synth__call(struct vmm_synth *s, struct vmm_synth_cmd *cmd);

/* True once the start-up fill was written and verified. */
bool vmm_synth__ready(const struct vmm_synth *s);
/* True if the start-up verification failed (the guest then stops by itself). */
bool vmm_synth__failed(const struct vmm_synth *s);

#endif
