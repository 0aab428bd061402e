/* api.h: the VMM's API socket: one text command per line, one JSON reply per line. */
#ifndef PVISOR_VMM_API_H
#define PVISOR_VMM_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vmm_mem;
struct vmm_synth;
struct vmm_api;

/* Longest request line, newline included; longer lines are refused. */
#define VMM_API_LINE_MAX 512

/* struct vmm_api_cfg - what the API serves and how it tells main() to quit */
struct vmm_api_cfg {
	const char *path;        /* Unix socket path to listen on */
	struct vmm_mem *mem;     /* guest RAM, for stats and range checks */
	struct vmm_synth *synth; /* runs the guest-memory commands; NULL for a KVM guest */
	const char *name;        /* VM name, reported by stats */
	const char *workload;    /* start-up workload name, reported by stats */
	uint64_t instance;       /* reported by stats */
	uint64_t data_pages;     /* start-up workload pages, reported by stats */
	int quit_fd;             /* eventfd written when a client sends quit */
};

/*
 * Bind the socket (replacing a stale one nobody listens on) and start the API
 * thread. Returns 0, -EADDRINUSE if a live VM owns the path, or -errno.
 */
int vmm_api__start(struct vmm_api **out, const struct vmm_api_cfg *cfg);
/* Stop the thread, close every connection and remove the socket file. */
void vmm_api__stop(struct vmm_api *a);

/*
 * Answer one request line (no newline): a malloc'ed JSON object followed by a
 * newline, or NULL when out of memory. *quit is set for a valid quit.
 */
char *vmm_api__handle(struct vmm_api *a, const char *line, bool *quit);

#endif
