/* blk.h: virtio-blk over virtio-mmio, backed by a host file through io_uring. */
#ifndef PVISOR_VMM_BLK_H
#define PVISOR_VMM_BLK_H

#include <stdbool.h>
#include <stdint.h>

struct vmm_mem;
struct vmm_blk; /* opaque; one per --disk */

/* struct vmm_blk_cfg - what a virtio-blk device is built from */
struct vmm_blk_cfg {
	const char *path;      /* host file (or block device) */
	bool read_only;        /* --disk PATH,ro */
	struct vmm_mem *mem;   /* guest RAM: descriptors and buffers are gpa in it */
	uint32_t gsi;          /* interrupt line the device raises */
	/* raise (level=1) or lower (level=0) the line; called from the device's threads */
	void (*set_irq)(void *opaque, uint32_t gsi, int level);
	void *irq_opaque;
};

/* Open the file, set up the io_uring and start the device thread. 0 or -errno. */
int vmm_blk__create(struct vmm_blk **out, const struct vmm_blk_cfg *cfg);
/*
 * The MMIO handler for the device's 0x200-byte window: offset from the window base;
 * len 1, 2, 4 (or 8); is_write says whether data is read from or written to. Matches
 * vmm_io_fn (vmm/kvm.h) so it can be registered directly with opaque = struct vmm_blk *.
 */
void vmm_blk__mmio(void *opaque, uint64_t offset, uint8_t *data, uint32_t len, bool is_write);
/* Stop the device thread, wait for I/O in flight, close the file. NULL is fine. */
void vmm_blk__destroy(struct vmm_blk *b);

#endif
