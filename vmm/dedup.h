/* dedup.h: internal interface between guest RAM (mem.c) and the physical-dedup client. */
#ifndef PVISOR_VMM_DEDUP_H
#define PVISOR_VMM_DEDUP_H

#include <pthread.h>
#include <stdint.h>

#include "mem.h"

#include "poolconn.h"

/* Per-page state, the low bits of vmm_dedup.state[]. */
enum vmm_pg {
	VMM_PG_NEW = 0,     /* never hashed (maybe never touched); found by the sweep */
	VMM_PG_HASHED,      /* clean, write-protected, offered to the pool */
	VMM_PG_DIRTY,       /* written since its last hash; on the dirty queue */
	VMM_PG_SHARED,      /* mapped from a pool slot, write-protected */
	VMM_PG_ORPHAN,      /* mapped from a slot of a pool we lost; offered again on reconnect */
	VMM_PG_ZERO,        /* all zero, discarded, write-protected marker */
	VMM_PG_COMPRESSED,  /* reserved: compressed tier */
	VMM_PG_DAX,         /* reserved: DAX window */
	VMM_PG_NSTATES,
};
#define VMM_PG_MASK   0x0f
#define VMM_PG_QUEUED 0x80 /* the page index is on the dirty queue */
/*
 * The page lies in a range once remapped from a pool segment: its VMA is a
 * private FILE mapping for good. MADV_DONTNEED there would not give zeros back
 * but the segment's bytes, so such a page is never discarded as zero; it is
 * hashed and offered like any other page.
 */
#define VMM_PG_FILEVMA 0x40
/*
 * The hypervisor writes the page through its own mapping (kvm-clock and the
 * other paravirtual areas: struct vmm_mem_vcpus.hv_pages). Write protection
 * does not see those writes, so the page is never hashed, merged or discarded
 * again; it stays private. Set for good, like VMM_PG_FILEVMA.
 */
#define VMM_PG_PINNED 0x20

/* struct vmm_seg - a store segment we learned about */
struct vmm_seg {
	int fd;            /* sealed memfd, -1 until fetched */
	uint8_t *ro;       /* read-only private mapping used to compare before a remap */
	uint64_t pages;    /* size in pages, from SEG_REPLY, checked against fstat */
};

/* struct vmm_mapv - one MAP verdict waiting for the run builder */
struct vmm_mapv {
	uint64_t page;     /* guest page */
	uint32_t seg;      /* segment id */
	uint32_t slot;     /* page inside the segment */
};

/* struct vmm_dedup - the dedup thread and everything only it touches */
struct vmm_dedup {
	struct vmm_mem *m;
	pthread_t thread;
	bool thread_started;
	bool stop;                    /* set by destroy, read with atomics */
	int uffd;                     /* write-protect userfaultfd over guest RAM */
	uint64_t uffd_features;       /* what UFFDIO_API granted */
	int ctl_efd;                  /* wakes the thread: stop, hints */
	int pagemap_fd;               /* /proc/self/pagemap */
	uint8_t *state;               /* enum vmm_pg | VMM_PG_QUEUED, one byte per page */
	uint32_t *ref;                /* SHARED/ORPHAN: global slot; HASHED: hash time (us);
				       * DIRTY: dirty time (ms) */
	uint64_t count[VMM_PG_NSTATES]; /* pages in each state */
	uint32_t *dq;                 /* dirty FIFO of page indices, capacity m->pages */
	uint64_t dq_head, dq_len;
	pthread_mutex_t hint_lock;    /* protects the hint list (any thread adds) */
	uint64_t (*hints)[2];         /* (first page, count) ranges */
	uint32_t nhints, hint_cap;
	uint64_t sweep_pos;           /* next page the NEW sweep looks at */
	uint64_t sweep_at_ns;         /* no sweep before this time (backoff) */
	uint64_t sweep_backoff_ns;    /* grows while passes find nothing */
	bool sweep_found;             /* this pass found populated NEW pages */
	struct vmm_pool pool;         /* the connection, or sock -1 */
	uint64_t reconnect_at_ns;     /* next connection attempt */
	struct vmm_seg *segs;         /* indexed by segment id */
	uint32_t nsegs;
	uint8_t *cmpbuf;              /* VMM_CMP_PAGES slots read for the compare */
	uint32_t cmp_first, cmp_n;    /* run index of cmpbuf's first page, pages held */
	uint8_t *staging_busy;        /* per staging slot: an UPLOAD names it */
	uint32_t staging_free;
	uint32_t *upq;                /* pages with an UPLOAD verdict waiting for staging */
	uint32_t upq_head, upq_len, upq_cap;
	struct vmm_mapv *mapv;        /* MAP verdicts of this round */
	uint32_t nmapv, mapv_cap;
	uint64_t mapv_due_ns;         /* merge the batch by then even if it is small */
	uint64_t vma_budget;          /* VMAs the plane may add */
	uint64_t vma_used;            /* upper bound of the VMAs it added */
	uint64_t vma_base;            /* process VMAs when the plane started */
	uint64_t max_map_count;       /* vm.max_map_count at start */
	uint64_t vma_recount_ns;      /* last time vma_used was corrected from /proc/self/maps */
	bool ever_connected;          /* a later connection counts as a reconnect */
	uint64_t bad_conn;            /* garbage completions on this connection */
	bool test_no_wp;              /* PVISOR_TEST_NO_WP: unprotect before compare */
	uint64_t test_merge_delay_us; /* PVISOR_TEST_MERGE_DELAY_US */
	bool test_no_merge;           /* PVISOR_TEST_NO_MERGE: verdicts dropped, nothing remapped */
	bool test_no_zero;            /* PVISOR_TEST_NO_ZERO: zero pages hashed like any other */
	uint64_t t0_ns;               /* epoch of the us/ms stamps in ref[] */
	uint64_t throttle_until_ns;   /* no hashing before this (CPU cap) */
	uint64_t cpu_mark_ns;         /* thread CPU at the last throttle decision */
	uint64_t merge_ns_sum;        /* for merge_ns_avg */
	struct vmm_mem_stats st;      /* the thread's own counters */
	/* write tracking (track.c) */
	bool kvm_dirty;               /* vCPU writes come from KVM's dirty log: no uffd at all */
	uint64_t *dirty_bm;           /* KVM_GET_DIRTY_LOG copy, one bit per page */
	uint64_t *clear_bm;           /* scratch bitmap for KVM_CLEAR_DIRTY_LOG */
	uint64_t harvest_at_ns;       /* next periodic read of the dirty log */
	pthread_mutex_t dev_lock;     /* devices writing guest RAM (vmm_mem__dev_enter); the
				       * plane holds it across a batch, then dma_lock */
	pthread_mutex_t dma_lock;     /* the lists below; held by the plane across a batch */
	uint64_t (*dma)[2];           /* device writes in flight: (first page, count) */
	uint32_t ndma, dma_cap;
	uint64_t (*dma_done)[2];      /* device writes finished since the last harvest */
	uint32_t ndone, done_cap;
	bool dma_held;                /* the plane holds dma_lock (inside a paused batch) */
};

/* dedup.c */
void vmm_dedup_set_state(struct vmm_dedup *dd, uint64_t page, enum vmm_pg s);
static inline enum vmm_pg vmm_dedup_state(const struct vmm_dedup *dd, uint64_t page)
{
	return (enum vmm_pg)(dd->state[page] & VMM_PG_MASK);
}
uint32_t vmm_dedup_now_us(const struct vmm_dedup *dd);
void vmm_dedup_send(struct vmm_dedup *dd, uint16_t op, uint64_t page, const uint64_t *hash,
		    uint32_t seg, uint32_t slot);
void vmm_dedup_disconnect(struct vmm_dedup *dd, const char *why);
int vmm_dedup_pagemap(struct vmm_dedup *dd, uint64_t first, uint64_t n, uint64_t *out);
void vmm_dedup_mark_dirty(struct vmm_dedup *dd, uint64_t page);
/* KVM guests: park every vCPU (serving faults meanwhile); false if they did not stop. */
bool vmm_dedup_pause_vcpus(struct vmm_dedup *dd);
void vmm_dedup_resume_vcpus(struct vmm_dedup *dd);
/* Serve every pending write fault (the uffd is non-blocking). */
void vmm_dedup_faults(struct vmm_dedup *dd);

/* merge.c */
int vmm_merge__init(struct vmm_dedup *dd);
/* A new connection: every staging slot is free. */
void vmm_merge__connected(struct vmm_dedup *dd);
/* Read every completion, upload, merge; false if the pool must be dropped. */
void vmm_merge__completions(struct vmm_dedup *dd);
/* Forget all per-connection merge state (segments, staging, queues). */
void vmm_merge__reset(struct vmm_dedup *dd);
void vmm_merge__fini(struct vmm_dedup *dd);
/* Remember how many VMAs the process had before the plane added any. */
void vmm_merge__count_vmas(struct vmm_dedup *dd);

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
	uint64_t pages_hinted;        /* atomic; any mode: the dedup thread never sees off/ksm */
	struct vmm_mem_vcpus vcpus;   /* KVM guests: paused around remaps; .pause NULL otherwise */
};

/* track.c: how the plane learns of writes (see the DOC there). */
int vmm_track_start(struct vmm_dedup *dd);
void vmm_track_free(struct vmm_dedup *dd);
void vmm_track_protect(struct vmm_dedup *dd, const uint64_t *pg, unsigned n);
void vmm_track_protect_run(struct vmm_dedup *dd, uint64_t first, uint64_t n);
void vmm_track_unprotect(struct vmm_dedup *dd, uint64_t page, bool wake);
void vmm_track_unprotect_run(struct vmm_dedup *dd, uint64_t first, uint64_t n, bool wake);
int vmm_track_remapped(struct vmm_dedup *dd, uint64_t first, uint64_t n);
void vmm_track_wake(struct vmm_dedup *dd, uint64_t first, uint64_t n);
void vmm_track_harvest(struct vmm_dedup *dd, bool force);
void vmm_track_hold(struct vmm_dedup *dd);
void vmm_track_release(struct vmm_dedup *dd);
bool vmm_track_dma_busy(const struct vmm_dedup *dd, uint64_t page);
void vmm_track__dma_begin(struct vmm_dedup *dd, uint64_t first, uint64_t n);
void vmm_track__dma_end(struct vmm_dedup *dd, uint64_t first, uint64_t n);
/* dedup.c: the page was written (fault, dirty log or device): undo its sharing. */
void vmm_dedup_written(struct vmm_dedup *dd, uint64_t page, bool copied);

/* Set up the client (uffd, page table); the thread starts in vmm_dedup__start. */
int vmm_dedup__create(struct vmm_mem *m, struct vmm_dedup **out);
int vmm_dedup__start(struct vmm_dedup *dd);
/* Stop and join the thread; the guest keeps every byte and mapping. Idempotent. */
void vmm_dedup__stop(struct vmm_dedup *dd);
/* Stop and join the thread, wake every blocked writer, free everything. */
void vmm_dedup__destroy(struct vmm_dedup *dd);
/* Queue [first, first+n) for hashing ahead of everything else (any thread). */
void vmm_dedup__hint(struct vmm_dedup *dd, uint64_t first, uint64_t n);

#endif
