/* cpuid.c: the CPUID a KVM guest's vCPUs see: KVM's supported table, patched per vCPU. */
#include <asm/kvm_para.h>
#include <errno.h>
#include <linux/kvm.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "cpuid.h"

/*
 * Paravirtual features hidden from the guest: each makes KVM write a guest
 * page it was told about through an MSR, behind the memory plane's back. The
 * clock (kvm-clock) stays; kvm.c keeps its page out of dedup instead.
 */
#define CPUID_PV_OFF ((1u << KVM_FEATURE_ASYNC_PF) | (1u << KVM_FEATURE_STEAL_TIME) | \
		      (1u << KVM_FEATURE_PV_EOI) | (1u << KVM_FEATURE_ASYNC_PF_VMEXIT) | \
		      (1u << KVM_FEATURE_ASYNC_PF_INT))

int vmm_cpuid__get(int sys_fd, struct kvm_cpuid2 **out)
{
	for (unsigned n = 64; n <= 4096; n *= 2) {
		struct kvm_cpuid2 *c = calloc(1, sizeof(*c) + n * sizeof(c->entries[0]));

		if (!c)
			return -ENOMEM;
		c->nent = n;
		if (!ioctl(sys_fd, KVM_GET_SUPPORTED_CPUID, c)) {
			*out = c;
			return 0;
		}
		free(c);
		if (errno != E2BIG)
			return -errno;
	}
	return -E2BIG;
}

/* Leaf 0xB (x2APIC topology): one thread per core, n cores, this vCPU's APIC id. */
static void cpuid_topology(struct kvm_cpuid_entry2 *e, unsigned id, unsigned n)
{
	unsigned shift = 0;

	while ((1u << shift) < n)
		shift++;
	e->edx = id;
	if (e->index == 0) {
		e->eax = 0;
		e->ebx = 1;
		e->ecx = (1u << 8) | 0;       /* level 0: SMT */
	} else if (e->index == 1) {
		e->eax = shift;
		e->ebx = n;
		e->ecx = (2u << 8) | 1;       /* level 1: core */
	} else {
		e->eax = e->ebx = 0;
		e->ecx = e->index;            /* invalid level: the end */
	}
}

int vmm_cpuid__set(int vcpu_fd, const struct kvm_cpuid2 *base, unsigned id, unsigned n)
{
	size_t sz = sizeof(*base) + base->nent * sizeof(base->entries[0]);
	struct kvm_cpuid2 *c = malloc(sz);
	int ret = 0;

	if (!c)
		return -ENOMEM;
	memcpy(c, base, sz);
	for (unsigned i = 0; i < c->nent; i++) {
		struct kvm_cpuid_entry2 *e = &c->entries[i];

		if (e->function == 1) {
			/* initial APIC id in EBX[31:24], logical processors in EBX[23:16] */
			e->ebx = (e->ebx & 0xffffu) | (id << 24) | ((n & 0xffu) << 16);
			/* "running under a hypervisor": Linux then finds KVM's leaves (kvm-clock) */
			e->ecx |= 1u << 31;
		} else if (e->function == 0xb || e->function == 0x1f) {
			cpuid_topology(e, id, n);
		} else if (e->function == KVM_CPUID_FEATURES) {
			e->eax &= ~CPUID_PV_OFF;
		}
	}
	if (ioctl(vcpu_fd, KVM_SET_CPUID2, c))
		ret = -errno;
	free(c);
	return ret;
}
