/* boot.h: load a Linux bzImage, its initrd and command line into guest RAM (64-bit boot protocol). */
#ifndef PVISOR_VMM_BOOT_H
#define PVISOR_VMM_BOOT_H

#include <stdint.h>

struct vmm_mem;
struct vmm_acpi_cfg;
struct kvm_regs;
struct kvm_sregs;

/* Fixed guest addresses of what the loader writes below 1 MiB. */
#define VMM_BOOT_GDT_GPA       0x500ull    /* null, null, code64 (0x10), data (0x18), tss (0x20) */
#define VMM_BOOT_IDT_GPA       0x520ull    /* an empty IDT: the kernel loads its own */
#define VMM_BOOT_ZERO_PAGE_GPA 0x7000ull   /* struct boot_params, rsi at entry */
#define VMM_BOOT_STACK_GPA     0x8ff0ull   /* rsp at entry (the kernel sets its own at once) */
#define VMM_BOOT_PML4_GPA      0x9000ull   /* then the PDPT at 0xa000 and 4 PDs at 0xb000..0xefff */
#define VMM_BOOT_CMDLINE_GPA   0x20000ull
#define VMM_BOOT_CMDLINE_MAX   4096u       /* bytes including the NUL */
#define VMM_BOOT_KERNEL_GPA    0x100000ull /* protected-mode kernel of a relocatable bzImage */

/* struct vmm_boot_cfg - what to boot */
struct vmm_boot_cfg {
	const char *kernel;                  /* bzImage path */
	const char *initrd;                  /* initrd path, NULL or "" for none */
	const char *cmdline;                 /* the whole kernel command line */
	const struct vmm_acpi_cfg *acpi;     /* tables built at VMM_ACPI_TABLES_GPA */
};

/* struct vmm_boot_entry - the boot vCPU's state at the kernel's 64-bit entry point */
struct vmm_boot_entry {
	uint64_t rip;          /* protected-mode kernel + 0x200 (startup_64) */
	uint64_t rsi;          /* the zero page */
	uint64_t rsp;
	uint64_t cr3;          /* identity map of the first 4 GiB, 2 MiB pages */
	uint64_t gdt_base;
	uint16_t gdt_limit;
	uint64_t idt_base;
	uint16_t idt_limit;
};

/*
 * Check that path is a bzImage this loader can boot (boot protocol >= 2.06 with a
 * 64-bit entry point). Returns 0, -ENOEXEC ("not a bzImage: ..." logged) or
 * -errno from opening or reading the file (logged with the path).
 */
int vmm_boot__check_kernel(const char *path);

/*
 * Write the zero page, e820 map, command line, kernel, initrd, GDT, page tables
 * and ACPI tables into guest RAM and describe the entry state in *entry.
 * Returns 0, -ENOEXEC, -ENOSPC (does not fit in guest RAM) or -errno; logged.
 */
int vmm_boot__load(struct vmm_mem *mem, const struct vmm_boot_cfg *cfg,
		   struct vmm_boot_entry *entry);

/* Apply *entry to registers read from the boot vCPU (KVM_GET_REGS/SREGS). */
void vmm_boot__regs(const struct vmm_boot_entry *entry, struct kvm_regs *regs);
void vmm_boot__sregs(const struct vmm_boot_entry *entry, struct kvm_sregs *sregs);

#endif
