/* workload.h: the deterministic guest-memory workloads every guest and test uses. */
#ifndef PVISOR_WORKLOAD_H
#define PVISOR_WORKLOAD_H

#include <stdint.h>

/*
 * A workload is a pure function of (kind, seed, instance, page index): the
 * synthetic guest writes it, the in-guest agent writes it, and readback
 * verification regenerates it and compares every byte. Names are the same
 * on every command line and in every report.
 */
enum wl_kind {
	WL_REPEATED,      /* one seeded random page in every page */
	WL_SHARED_RANDOM, /* seeded random pages, same in every instance */
	WL_UNIQUE_RANDOM, /* random pages seeded per instance */
	WL_ZEROS,         /* touched, all zero */
	WL_PATTERNS,      /* pages cycle through four patterns A, B, C, D */
	WL_COUNT,
};

extern const char *const wl_names[]; /* NULL terminated, indexed by enum wl_kind */

/* Name -> kind, or -EINVAL. */
int wl_parse(const char *name);

/* Write the 4096 bytes of page @page of the workload into @buf. */
void wl_page(enum wl_kind kind, uint64_t seed, uint64_t instance, uint64_t page, void *buf);

#endif
