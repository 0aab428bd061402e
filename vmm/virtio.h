/* virtio.h: the virtio-mmio transport (version 2) and split virtqueues over guest RAM. */
#ifndef PVISOR_VMM_VIRTIO_H
#define PVISOR_VMM_VIRTIO_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "mem.h"

/*
 * DOC: the transport
 *
 * A device (blk.c) embeds a struct vmm_virtio and hands every access to its
 * 0x200-byte MMIO window to vmm_virtio__mmio(). The transport owns the
 * registers of the virtio 1.2 spec, 4.2.2 (modern layout only: Version reads
 * 2, VIRTIO_F_VERSION_1 is always offered and must be accepted), feature
 * negotiation, device status, the interrupt status register and the split
 * virtqueues.
 *
 * Rings live in guest RAM. Their addresses are checked once, when the driver
 * sets QueueReady, and converted to host pointers through vmm_mem__hva();
 * every other guest value (avail index, head, descriptor next/addr/len) is
 * read once into a local and checked before it is used. A driver that breaks
 * the ring structure (head or next beyond QueueNum, a descriptor loop, a chain
 * longer than VMM_VIRTQ_MAX_CHAIN, indirect descriptors that were never
 * offered, an avail index more than QueueNum ahead) gets DEVICE_NEEDS_RESET
 * and a configuration interrupt; the device then ignores the queue until the
 * driver writes 0 to Status.
 *
 * Locking: `lock` protects all of the state below. The MMIO handler takes it
 * (vCPU threads), and device threads take it around vmm_virtq__pop/push. The
 * device callbacks are called with it held.
 */

#define VMM_VIRTIO_MMIO_SIZE   0x200u  /* register window per device */
#define VMM_VIRTIO_MAX_QUEUES  1u      /* virtio-blk uses one request queue */
#define VMM_VIRTQ_NUM_MAX      256u    /* QueueNumMax */
#define VMM_VIRTQ_MAX_CHAIN    128u    /* descriptors per chain (blk seg_max + 2) */

struct vmm_virtq_desc;
struct vmm_virtq_avail;
struct vmm_virtq_used;

/* struct vmm_virtq - one split virtqueue as the driver configured it */
struct vmm_virtq {
	uint16_t num;                   /* QueueNum written by the driver (not yet checked) */
	bool ready;                     /* QueueReady accepted: the pointers below are valid */
	uint64_t desc_gpa;              /* QueueDesc{Low,High} */
	uint64_t avail_gpa;             /* QueueDriver{Low,High} */
	uint64_t used_gpa;              /* QueueDevice{Low,High} */
	struct vmm_virtq_desc *desc;    /* hva of the descriptor table, num entries */
	struct vmm_virtq_avail *avail;  /* hva of the available ring */
	struct vmm_virtq_used *used;    /* hva of the used ring */
	uint16_t last_avail;            /* next avail ring slot the device will read */
	uint16_t used_idx;              /* next used ring slot the device will write */
};

/* struct vmm_virtq_seg - one descriptor of a chain, its buffer checked */
struct vmm_virtq_seg {
	gpa_t gpa;      /* buffer in guest RAM */
	void *hva;      /* host pointer to it, NULL if [gpa, gpa+len) is outside guest RAM */
	uint32_t len;   /* bytes */
	bool write;     /* device-writable (VRING_DESC_F_WRITE) */
};

/* struct vmm_virtq_chain - a descriptor chain popped from the available ring */
struct vmm_virtq_chain {
	uint16_t head;                 /* index of the first descriptor: goes to the used ring */
	uint16_t nseg;                 /* descriptors in seg[] */
	uint16_t nread;                /* the first nread are device-readable, the rest writable */
	bool bad;                      /* a buffer lies outside guest RAM, or readable after writable */
	struct vmm_virtq_seg seg[VMM_VIRTQ_MAX_CHAIN];
};

/* struct vmm_virtio_cfg - what a device tells the transport about itself */
struct vmm_virtio_cfg {
	struct vmm_mem *mem;            /* guest RAM */
	uint32_t device_id;             /* VIRTIO_ID_* */
	uint64_t features;              /* device features; VIRTIO_F_VERSION_1 is added */
	const void *config;             /* device config space (read-only to the driver) */
	uint32_t config_len;            /* bytes of it, at most 0x100 */
	unsigned nqueues;               /* 1..VMM_VIRTIO_MAX_QUEUES */
	/* QueueNotify for queue q (lock held, vCPU thread): must not wait for I/O */
	void (*notify)(void *opaque, unsigned q);
	/* the driver wrote 0 to Status (lock held): forget in-flight work before returning */
	void (*reset)(void *opaque);
	void *opaque;                   /* the device, for notify and reset */
	uint32_t gsi;                   /* interrupt line */
	void (*set_irq)(void *opaque, uint32_t gsi, int level);
	void *irq_opaque;
};

/* struct vmm_virtio - the transport state of one virtio-mmio device */
struct vmm_virtio {
	pthread_mutex_t lock;           /* protects everything here (see DOC above) */
	struct vmm_virtio_cfg cfg;      /* copy of what the device passed at init */
	uint64_t dev_features;          /* cfg.features | VIRTIO_F_VERSION_1 */
	uint64_t drv_features;          /* what the driver wrote (frozen at FEATURES_OK) */
	uint32_t dev_features_sel;      /* DeviceFeaturesSel */
	uint32_t drv_features_sel;      /* DriverFeaturesSel */
	uint32_t queue_sel;             /* QueueSel (may be out of range: reads 0) */
	uint32_t status;                /* device status bits (VIRTIO_CONFIG_S_*) */
	uint32_t isr;                   /* InterruptStatus: bit 0 used buffer, bit 1 config */
	uint32_t config_gen;            /* ConfigGeneration: bumped on reset */
	uint64_t guest_errors;          /* driver mistakes seen (logged only at first few) */
	struct vmm_virtq vq[VMM_VIRTIO_MAX_QUEUES];
};

/* Fill the transport (device reset state). 0 or -EINVAL. */
int vmm_virtio__init(struct vmm_virtio *v, const struct vmm_virtio_cfg *cfg);
void vmm_virtio__fini(struct vmm_virtio *v);
/* One access to the register window (takes the lock). Bad offsets/sizes read 0. */
void vmm_virtio__mmio(struct vmm_virtio *v, uint64_t offset, uint8_t *data, uint32_t len,
		      bool is_write);

/* The rest: lock held. */

/* True if the driver is running (DRIVER_OK, not NEEDS_RESET) and queue q is ready. */
bool vmm_virtio__live(struct vmm_virtio *v, unsigned q);
/*
 * Take the next chain from queue q's available ring: 1 = got one in *c (check
 * c->bad), 0 = ring empty, -EINVAL = the ring is broken (NEEDS_RESET was set).
 */
int vmm_virtq__pop(struct vmm_virtio *v, unsigned q, struct vmm_virtq_chain *c);
/* Return chain `head` with `len` bytes written into it, and interrupt the driver. */
void vmm_virtq__push(struct vmm_virtio *v, unsigned q, uint16_t head, uint32_t len);
/* The driver broke the protocol: set DEVICE_NEEDS_RESET, config interrupt; log `why`. */
void vmm_virtio__needs_reset(struct vmm_virtio *v, const char *why);
/* Count (and log the first few) driver mistakes that the device answers with an error. */
void vmm_virtio__guest_error(struct vmm_virtio *v, const char *why);

#endif
