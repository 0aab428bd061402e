/* mem.h: guest RAM and its memory plane (per-page state, dedup modes, stats). */
#ifndef PVISOR_VMM_MEM_H
#define PVISOR_VMM_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct json_object;
struct vmm_mem; /* opaque; one per guest */

/*
 * A guest physical address. Its own type so that a host pointer and a guest
 * address never mix; convert only through vmm_mem__hva(), which checks bounds.
 */
typedef struct { uint64_t v; } gpa_t;
#define GPA(x) ((gpa_t){ .v = (x) })

enum vmm_dedup_mode { VMM_DEDUP_PHYSICAL, VMM_DEDUP_KSM, VMM_DEDUP_OFF };

/* struct vmm_mem_cfg - how to build guest RAM and its memory plane */
struct vmm_mem_cfg {
	uint64_t size;            /* bytes of guest RAM, multiple of 4096 */
	enum vmm_dedup_mode dedup;
	const char *pool_path;    /* pool control socket (physical) */
	const char *domain;       /* sharing domain declared to the pool */
	const char *name;         /* this VM's name in pool stats */
	unsigned cpu_pct;         /* cap on the dedup thread's CPU, percent of one core (1..100) */
	uint64_t vma_budget;      /* max VMAs the plane may create; 0 = derive from vm.max_map_count */
};

/* struct vmm_mem_stats - per-VM figures, for the API socket and the exit log */
struct vmm_mem_stats {
	uint64_t pages;            /* guest RAM pages */
	uint64_t pages_private;    /* populated, not shared, not zero-discarded */
	uint64_t pages_shared;     /* mapped from a pool slot */
	uint64_t pages_zero;       /* discarded as all-zero */
	uint64_t pages_hashed;     /* hash operations done (a page hashed twice counts twice) */
	uint64_t merges;           /* pages remapped to a pool slot */
	uint64_t merge_fail;       /* MAP verdicts refused because the bytes differed */
	uint64_t cow_breaks;       /* shared pages the guest wrote (reference dropped) */
	uint64_t wp_faults;        /* write faults on protected pages handled */
	uint64_t vma_skipped;      /* merges skipped to stay inside the VMA budget */
	uint64_t bytes_saved;      /* (shared + zero) * 4096 */
	uint64_t merge_ns_last;    /* time from a page's hash to its remap, last merge */
	uint64_t merge_ns_avg;     /* same, average over all merges */
	uint64_t dedup_cpu_ns;     /* CPU time of the dedup thread */
	bool pool_connected;
	uint32_t pool_reconnects;
	/* added after the first interface: */
	uint64_t bad_verdicts;     /* completions from the pool that were ignored as garbage */
	uint64_t hash_ns;          /* wall time spent hashing (pages_hashed / hash_ns = rate) */
	uint64_t first_hash_ns;    /* CLOCK_MONOTONIC of the first hash, 0 if none */
	uint64_t last_merge_ns;    /* CLOCK_MONOTONIC of the latest remap, 0 if none */
	uint64_t pages_hinted;     /* pages reported filled by device reads (vmm_mem__hint) */
	uint64_t pages_pinned;     /* kept out of dedup: the hypervisor writes them (hv_pages) */
};

/*
 * struct vmm_mem_vcpus - how the plane stops a KVM guest's vCPUs around a batch
 * of remaps or zero-page discards (DESIGN.md's second design). Write
 * protection alone holds a vCPU's writes off a page being merged; stopping the
 * vCPUs as well means no guest access at all can race the compare, the remap
 * or the discard, whatever KVM caches. It was added while a guest corruption
 * was being chased that turned out to be something else (see VMM_PG_FILEVMA);
 * it is kept as a safety net until it has been measured against its cost.
 * Host threads (devices) stay covered by write protection alone.
 */
struct vmm_mem_vcpus {
	void (*pause)(void *opaque);   /* ask every vCPU to leave KVM_RUN; must not wait */
	bool (*paused)(void *opaque);  /* true once no vCPU is inside KVM_RUN */
	void (*resume)(void *opaque);
	/*
	 * While paused: guest pages the hypervisor writes through its own mapping
	 * (KVM's paravirtual areas). The plane never hashes, merges or discards
	 * them again. Fills up to max addresses, returns how many. May be NULL.
	 */
	unsigned (*hv_pages)(void *opaque, uint64_t *gpa, unsigned max);
#define VMM_MEM_HV_PAGES_MAX 1024 /* the plane asks for at most this many */
	/*
	 * KVM's dirty log of guest RAM (vmm_kvm__dirty_get/_clear), or NULL. With
	 * it the plane learns of vCPU writes from the log instead of write faults:
	 * no vCPU ever sleeps in a userfaultfd fault, KVM handles its
	 * write-protection faults itself, and a write to a shared page is copied
	 * on write by the kernel. Host threads then report their writes with
	 * vmm_mem__dma_begin/_end.
	 */
	int (*dirty_get)(void *opaque, uint64_t *bitmap);
	int (*dirty_clear)(void *opaque, uint64_t first, uint64_t n, uint64_t *bits);
	void *opaque;
};

/* Map guest RAM and set up the plane; the dedup thread is not started yet. */
int vmm_mem__create(struct vmm_mem **out, const struct vmm_mem_cfg *cfg);
/* Before vmm_mem__start: the vCPUs to pause around remaps (KVM guests). */
void vmm_mem__set_vcpus(struct vmm_mem *m, const struct vmm_mem_vcpus *v);
/* Start the dedup thread (physical), or MADV_MERGEABLE (ksm); no-op for off. */
int vmm_mem__start(struct vmm_mem *m);
/*
 * Stop the dedup thread; guest RAM stays as it is. For KVM guests, call it
 * before the VM goes: the thread pauses the vCPUs and reads the dirty log.
 */
void vmm_mem__stop(struct vmm_mem *m);
/* Stop the dedup thread, print nothing, unmap guest RAM. */
void vmm_mem__destroy(struct vmm_mem *m);

uint64_t vmm_mem__size(const struct vmm_mem *m);
/* Host pointer for [gpa, gpa+len), or NULL if any of it lies outside guest RAM. */
void *vmm_mem__hva(struct vmm_mem *m, gpa_t gpa, uint64_t len);

/* Pages [gpa, gpa+len) were just filled by a file read: hash them first. */
void vmm_mem__hint(struct vmm_mem *m, gpa_t gpa, uint64_t len);
/*
 * A host thread (a device) is about to write [gpa, gpa+len) of guest RAM, and
 * has finished. Between the two the plane neither merges nor discards those
 * pages; after _end it treats them as written. Needed when the plane tracks
 * writes with KVM's dirty log, which sees only vCPU writes; harmless
 * otherwise. _begin may wait for a merge batch to finish (milliseconds).
 */
void vmm_mem__dma_begin(struct vmm_mem *m, gpa_t gpa, uint64_t len);
void vmm_mem__dma_end(struct vmm_mem *m, gpa_t gpa, uint64_t len);
/*
 * A device writes guest RAM itself between these (status bytes, used rings,
 * small copies): no batch of merges or discards runs meanwhile, so such a
 * write never lands in a page being replaced. Do not nest; _dma_begin/_end
 * may be called inside.
 */
void vmm_mem__dev_enter(struct vmm_mem *m);
void vmm_mem__dev_leave(struct vmm_mem *m);

void vmm_mem__stats(struct vmm_mem *m, struct vmm_mem_stats *out);
/* Add the stats as members of a json-c object. */
void vmm_mem__stats_json(struct vmm_mem *m, struct json_object *obj);

#endif
