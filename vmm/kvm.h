/* kvm.h: a KVM virtual machine: the VM, its vCPU threads, I/O exits and interrupt lines. */
#ifndef PVISOR_VMM_KVM_H
#define PVISOR_VMM_KVM_H

#include <stdbool.h>
#include <stdint.h>

struct vmm_mem;
struct vmm_boot_entry;
struct vmm_kvm; /* opaque; one per VM */

/*
 * A device's handler for a port or MMIO window: offset from the registered base,
 * len 1, 2, 4 (or 8), data is filled on a read (is_write false) and holds the
 * guest's bytes on a write. Called on the vCPU thread that exited.
 */
typedef void (*vmm_io_fn)(void *opaque, uint64_t offset, uint8_t *data, uint32_t len,
			  bool is_write);

/* Largest guest RAM: the MMIO hole (virtio-mmio, IOAPIC, LAPIC) starts at 3 GiB. */
#define VMM_KVM_MEM_MAX (3ull << 30)
#define VMM_KVM_VCPUS_MAX 64
#define VMM_KVM_PV_MSRS   7  /* paravirtual MSRs that name a guest page KVM writes */

/* How a VM ended, in order of precedence (the first non-running reason sticks). */
enum vmm_kvm_end {
	VMM_KVM_RUNNING = 0,
	VMM_KVM_POWEROFF,   /* ACPI S5 or KVM_SYSTEM_EVENT_SHUTDOWN: exit 0 */
	VMM_KVM_RESET,      /* ACPI reset, i8042 0xfe or KVM_SYSTEM_EVENT_RESET: exit 0 */
	VMM_KVM_STOPPED,    /* the VMM asked (signal, API quit): exit 0 */
	VMM_KVM_FAILED,     /* triple fault, failed entry, internal error: exit 1 */
};

/* struct vmm_kvm_cfg - what the VM is built from */
struct vmm_kvm_cfg {
	struct vmm_mem *mem;  /* guest RAM, gpa 0..size, size <= VMM_KVM_MEM_MAX */
	unsigned vcpus;       /* 1..VMM_KVM_VCPUS_MAX */
	int stop_fd;          /* eventfd written once when the guest ends (any reason) */
	bool dirty_log;       /* keep KVM's dirty log of guest RAM (vmm_kvm__dirty_*) */
};

/*
 * Open /dev/kvm and build the VM: irqchip, PIT, one memslot over guest RAM, the
 * vCPUs with CPUID, MSRs and LAPIC set, and the built-in ports (ACPI power,
 * i8042 reset, a silent CMOS). Nothing runs yet. Returns 0, -ENOENT when there
 * is no /dev/kvm, -E2BIG when guest RAM is too large, or -errno (logged).
 */
int vmm_kvm__create(struct vmm_kvm **out, const struct vmm_kvm_cfg *cfg);

/* Devices register their windows before vmm_kvm__start (-EBUSY after, -EEXIST on overlap). */
int vmm_kvm__register_mmio(struct vmm_kvm *k, uint64_t base, uint64_t len, vmm_io_fn fn,
			   void *opaque);
int vmm_kvm__register_pio(struct vmm_kvm *k, uint16_t port, uint16_t len, vmm_io_fn fn,
			  void *opaque);

/* Drive interrupt line gsi (KVM_IRQ_LINE); safe from any thread. */
int vmm_kvm__set_irq(struct vmm_kvm *k, uint32_t gsi, int level);

/* Put the boot vCPU at the kernel's entry and start every vCPU thread. */
int vmm_kvm__start(struct vmm_kvm *k, const struct vmm_boot_entry *entry);

/* Record why the VM ends (first reason wins) and write stop_fd. Any thread. */
void vmm_kvm__end(struct vmm_kvm *k, enum vmm_kvm_end why);
enum vmm_kvm_end vmm_kvm__ended(struct vmm_kvm *k);

/* Kick every vCPU out of KVM_RUN and join the threads. Idempotent. */
void vmm_kvm__stop(struct vmm_kvm *k);
/*
 * For the memory plane (struct vmm_mem_vcpus, opaque = the vmm_kvm): ask every
 * vCPU thread to leave KVM_RUN and park (does not wait), tell whether all have,
 * and let them run again. A stopped VM counts as paused.
 */
void vmm_kvm__pause(void *opaque);
bool vmm_kvm__paused(void *opaque);
void vmm_kvm__resume(void *opaque);
/*
 * Also for the plane, valid while paused: the guest pages KVM itself writes
 * (kvm-clock and the other paravirtual areas the vCPUs' MSRs name), which must
 * stay out of dedup. Fills up to max addresses, returns how many (duplicates
 * possible).
 */
unsigned vmm_kvm__hv_pages(void *opaque, uint64_t *gpa, unsigned max);
/*
 * KVM's dirty log of guest RAM (cfg.dirty_log), in manual-protect mode with
 * every page initially dirty: _get copies one bit per page (pages / 64 words)
 * and clears nothing; _clear clears the bits set in @bits for pages
 * [first, first + n) and write-protects those pages again, so that their next
 * vCPU write sets the bit. first is a multiple of 64; n is too, or reaches the
 * end of RAM. Any thread; 0 or -errno.
 */
int vmm_kvm__dirty_get(void *opaque, uint64_t *bitmap);
int vmm_kvm__dirty_clear(void *opaque, uint64_t first, uint64_t n, uint64_t *bits);
/* Stop, then close the vCPUs and the VM. NULL is fine. */
void vmm_kvm__destroy(struct vmm_kvm *k);

#endif
