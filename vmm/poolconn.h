/* poolconn.h: the VMM's connection to pvisor-pool: control socket, rings, segments. */
#ifndef PVISOR_VMM_POOLCONN_H
#define PVISOR_VMM_POOLCONN_H

#include <stdbool.h>
#include <stdint.h>

#include "proto.h"

/* struct vmm_pool - one live connection; every field is reset by vmm_pool__close */
struct vmm_pool {
	int sock;                      /* SOCK_SEQPACKET control socket, -1 when down */
	int sq_efd;                    /* doorbell we ring after submitting */
	int cq_efd;                    /* doorbell the pool rings after completing */
	uint8_t *ring;                 /* the shared ring memfd, mapped read-write */
	uint64_t ring_size;            /* bytes mapped at ring */
	struct proto_ring_hdr hdr;     /* our validated copy of the ring header */
	struct proto_ring_idx *sq_idx; /* submission ring indices (we produce) */
	struct proto_ring_idx *cq_idx; /* completion ring indices (we consume) */
	struct proto_sqe *sqes;        /* sq_entries submission entries */
	struct proto_cqe *cqes;        /* cq_entries completion entries */
	uint8_t *staging;              /* staging_slots pages for uploads */
	uint32_t sq_tail;              /* our producer position (never read back) */
	uint32_t cq_head;              /* our consumer position (never read back) */
	uint32_t seg_pages;            /* pages per store segment, from HELLO_REPLY */
	uint32_t client_id;            /* the pool's id for us */
	struct proto_sqe *bl;          /* backlog of entries that did not fit the ring */
	uint32_t bl_head, bl_len, bl_cap; /* circular backlog */
	uint64_t rung_ns;              /* last doorbell, for the stall safety net */
};

void vmm_pool__init(struct vmm_pool *p);
/* Connect, HELLO, map the ring. 0 or -errno; on error nothing is left open. */
int vmm_pool__connect(struct vmm_pool *p, const char *path, const char *domain,
		      const char *name, uint64_t guest_pages);
void vmm_pool__close(struct vmm_pool *p);
static inline bool vmm_pool__up(const struct vmm_pool *p) { return p->sock >= 0; }

/* Queue one entry (ring, or backlog when the ring is full). 0 or -ENOMEM. */
int vmm_pool__push(struct vmm_pool *p, const struct proto_sqe *e);
/* Move backlog into the ring and ring the doorbell if the pool may sleep. */
int vmm_pool__flush(struct vmm_pool *p);
/* Entries not yet consumed by the pool, backlog included. */
uint32_t vmm_pool__pending(const struct vmm_pool *p);
/* Copy out the next completion; false when the ring is empty. */
bool vmm_pool__pop(struct vmm_pool *p, struct proto_cqe *out);
/* Drain the completion doorbell. */
void vmm_pool__ack(struct vmm_pool *p);
/* SEG_REQ: receive the segment's fd and size in pages. 0, -errno from the pool, or -EPROTO. */
int vmm_pool__seg(struct vmm_pool *p, uint32_t seg, int *fd, uint64_t *pages);
/* Pointer to staging slot @s (caller checked s < staging_slots). */
static inline uint8_t *vmm_pool__staging(struct vmm_pool *p, uint32_t s)
{
	return p->staging + (uint64_t)s * PROTO_PAGE_SIZE;
}

#endif
