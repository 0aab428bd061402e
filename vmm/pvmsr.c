/* pvmsr.c: KVM's paravirtual MSRs pass through the VMM, so pages KVM writes stay out of the plane. */
#include <errno.h>
#include <linux/kvm.h>
#include <string.h>
#include <sys/ioctl.h>

#include "log.h"
#include "mem.h"
#include "pvmsr.h"

/*
 * DOC: pages KVM writes itself
 *
 * A Linux guest hands KVM guest-physical addresses through paravirtual MSRs:
 * kvm-clock's time structures, steal time, async page-fault data, PV EOI.
 * KVM then writes those pages from the kernel, through its own cached
 * mapping of the page, not through a fault on the VMM's mapping. Write
 * protection does not stop such writes, and remapping the page under KVM's
 * cache loses them: seen as a guest whose clock stopped once dedup touched
 * its kvm-clock page. So the VMM asks KVM to exit on writes to these MSRs
 * (an MSR filter), tells the memory plane to keep the page out of dedup for
 * good (vmm_mem__pin), and then gives the value to KVM unchanged
 * (KVM_SET_MSRS is host-initiated, the filter does not apply to it).
 */

#define PVMSR_KVM_BASE   0x4b564d00u /* MSR_KVM_WALL_CLOCK_NEW .. MSR_KVM_MIGRATION_CONTROL */
#define PVMSR_KVM_COUNT  9
#define PVMSR_OLD_BASE   0x11u       /* MSR_KVM_WALL_CLOCK, MSR_KVM_SYSTEM_TIME */
#define PVMSR_OLD_COUNT  2

/* The guest page an MSR value names, and how many bytes KVM writes there (0: none). */
static uint64_t vmm_pvmsr_area(uint32_t index, uint64_t data, uint64_t *gpa)
{
	switch (index) {
	case 0x11: case 0x4b564d00:           /* wall clock: written once, at the MSR write */
		*gpa = data;
		return 12;
	case 0x12: case 0x4b564d01:           /* kvm-clock: bit 0 enables */
		*gpa = data & ~1ull;
		return data & 1 ? 32 : 0;
	case 0x4b564d02:                      /* async PF: 64-byte aligned, bit 0 enables */
	case 0x4b564d03:                      /* steal time: same layout */
		*gpa = data & ~0x3full;
		return data & 1 ? 64 : 0;
	case 0x4b564d04:                      /* PV EOI: bit 0 enables */
		*gpa = data & ~1ull;
		return data & 1 ? 4 : 0;
	default:
		return 0;
	}
}

int vmm_pvmsr__setup(int vm_fd)
{
	static uint8_t deny[2] = { 0, 0 }; /* a 0 bit: the access exits to the VMM */
	struct kvm_enable_cap cap = { .cap = KVM_CAP_X86_USER_SPACE_MSR,
				      .args = { KVM_MSR_EXIT_REASON_FILTER } };
	struct kvm_msr_filter f = { .flags = KVM_MSR_FILTER_DEFAULT_ALLOW };

	f.ranges[0] = (struct kvm_msr_filter_range){ .flags = KVM_MSR_FILTER_WRITE,
		.nmsrs = PVMSR_KVM_COUNT, .base = PVMSR_KVM_BASE, .bitmap = deny };
	f.ranges[1] = (struct kvm_msr_filter_range){ .flags = KVM_MSR_FILTER_WRITE,
		.nmsrs = PVMSR_OLD_COUNT, .base = PVMSR_OLD_BASE, .bitmap = deny };
	if (ioctl(vm_fd, KVM_ENABLE_CAP, &cap) || ioctl(vm_fd, KVM_X86_SET_MSR_FILTER, &f))
		return -errno;
	return 0;
}

bool vmm_pvmsr__exit(int vcpu_fd, struct kvm_run *run, struct vmm_mem *mem)
{
	struct {
		struct kvm_msrs hdr;
		struct kvm_msr_entry e;
	} m = { .hdr = { .nmsrs = 1 } };
	uint64_t gpa = 0, len;

	if (run->exit_reason != KVM_EXIT_X86_WRMSR)
		return false;
	len = vmm_pvmsr_area(run->msr.index, run->msr.data, &gpa);
	if (len && vmm_mem__hva(mem, GPA(gpa), len))
		vmm_mem__pin(mem, GPA(gpa), len);
	m.e.index = run->msr.index;
	m.e.data = run->msr.data;
	/* KVM_SET_MSRS returns how many it set: 1, or 0 if KVM refuses the value */
	run->msr.error = ioctl(vcpu_fd, KVM_SET_MSRS, &m) == 1 ? 0 : 1;
	if (run->msr.error)
		log_debug("kvm: guest write of 0x%llx to MSR 0x%x refused by KVM",
			  (unsigned long long)run->msr.data, run->msr.index);
	return true;
}
