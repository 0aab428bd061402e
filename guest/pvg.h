/* pvg.h: pvisor-guest's parameters, its data regions and its PVG report lines. */
#ifndef PVISOR_PVG_H
#define PVISOR_PVG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workload.h"

/* Workload "none": no data region at all. */
#define PVG_WL_NONE WL_COUNT
/* Largest pvg.size: far above any guest we run, small enough that page counts never overflow. */
#define PVG_SIZE_MAX (1ull << 40)
/* Longest pvg.hold and `sleep`: one day. */
#define PVG_SECONDS_MAX 86400u

enum pvg_exit { PVG_EXIT_POWEROFF, PVG_EXIT_REBOOT, PVG_EXIT_NONE };

extern const char *const pvg_exit_names[];   /* NULL terminated, enum pvg_exit order */

/* struct pvg_params - everything the agent reads from the kernel command line */
struct pvg_params {
	int workload;          /* enum wl_kind, or PVG_WL_NONE */
	uint64_t size;         /* bytes of workload, a multiple of 4096 */
	uint64_t seed;         /* workload seed */
	uint64_t instance;     /* per-instance seed (unique-random) */
	char load[256];        /* file or device to read at start, "" for none */
	unsigned hold_s;       /* serve console commands this long after "ready" */
	int exit;              /* enum pvg_exit: what /init does when the agent ends */
};

/* Defaults: no workload, 64M, seed 1, instance 0, no load, no hold, power off. */
void pvg_params__init(struct pvg_params *p);
/*
 * Apply every pvg.KEY=VALUE word of @cmdline (other words are the kernel's and
 * are skipped; a later word wins). Returns 0, or -EINVAL with a message that
 * names the key, the bad value and what is allowed in @err.
 */
int pvg_params__parse(struct pvg_params *p, const char *cmdline, char *err, size_t errlen);
/* "64M", "4096", "1G" -> bytes; -EINVAL if not a number with an optional K/M/G/T suffix. */
/* Decimal u64 with no sign, no junk and no overflow; -EINVAL otherwise. */
int pvg_parse_u64(const char *s, uint64_t *out);

/* struct pvg_data - the workload region and what it is supposed to hold */
struct pvg_data {
	uint8_t *base;         /* page-aligned anonymous mapping, NULL if pages == 0 */
	uint64_t pages;        /* 4 KiB pages in the region */
	int kind;              /* enum wl_kind the pages hold now (after `write`: unique-random) */
	uint64_t seed;         /* seed of what the pages hold now */
	uint64_t instance;     /* instance of what the pages hold now */
};

/* Map @pages pages; 0 or -errno. */
int pvg_data__map(struct pvg_data *d, uint64_t pages);
void pvg_data__unmap(struct pvg_data *d);
/* Write page i = wl_page(kind, seed, instance, i) for every page and remember it. */
void pvg_data__fill(struct pvg_data *d, int kind, uint64_t seed, uint64_t instance);
/* Count pages that differ from what the region should hold; *first_bad the lowest. */
uint64_t pvg_data__verify(const struct pvg_data *d, uint64_t *first_bad);

/* struct pvg_file - a whole file or block device read into page-aligned memory */
struct pvg_file {
	uint8_t *base;         /* anonymous mapping of map_len bytes, NULL if none */
	size_t map_len;        /* mapped bytes, a multiple of 4096 */
	uint64_t bytes;        /* bytes read: the file's size */
	bool direct;           /* read with O_DIRECT (straight into this memory) */
};

/* Read all of @path; 0 or -errno (the file is then empty). Replaces what @f held. */
int pvg_file__load(struct pvg_file *f, const char *path);
void pvg_file__free(struct pvg_file *f);

/*
 * The digest every report carries: XXH3-64 (seed 0) over the bytes, printed as
 * 16 lower-case hex digits. digest128 is XXH3-128 (seed 0), printed high 64
 * bits first: the very string `pvisor ctl digest 0 PAGES` gives for the
 * host-driven synthetic guest holding the same bytes.
 */
void pvg_digest(const void *buf, size_t len, char hex[17]);
void pvg_digest128(const void *buf, size_t len, char hex[33]);
/* The same two digests of a workload without materialising it (host mode). */
void pvg_workload_digests(int kind, uint64_t seed, uint64_t instance, uint64_t pages,
			  char hex[17], char hex128[33]);

/* struct pvg_line - one `PVG {json}` report line being built */
struct pvg_line {
	char buf[2048];        /* "PVG {" ... */
	size_t len;            /* bytes used; stays below sizeof(buf) */
};

void pvg_line_begin(struct pvg_line *l, const char *event);
void pvg_line_str(struct pvg_line *l, const char *key, const char *val);
void pvg_line_u64(struct pvg_line *l, const char *key, uint64_t val);
void pvg_line_i64(struct pvg_line *l, const char *key, int64_t val);
void pvg_line_secs(struct pvg_line *l, const char *key, double s);
void pvg_line_bool(struct pvg_line *l, const char *key, bool val);
/* Close the object and write the line to stdout in one write(2). */
void pvg_line_end(struct pvg_line *l);
/* PVG {"event":"error","ok":false,"error":MSG} plus any context key. */
void pvg_report_error(const char *context_key, const char *context, const char *msg);

/* Seconds on CLOCK_MONOTONIC. */
double pvg_now(void);

#endif
