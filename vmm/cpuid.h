/* cpuid.h: the CPUID a KVM guest's vCPUs see. */
#ifndef PVISOR_VMM_CPUID_H
#define PVISOR_VMM_CPUID_H

struct kvm_cpuid2;

/* KVM_GET_SUPPORTED_CPUID into a malloc'd table (free() it). 0 or -errno. */
int vmm_cpuid__get(int sys_fd, struct kvm_cpuid2 **out);
/*
 * KVM_SET_CPUID2 on one vCPU: @base patched for vCPU @id of @n (APIC ids,
 * topology, the hypervisor bit) and without the paravirtual features whose
 * guest pages KVM would write behind the memory plane (steal time, async page
 * faults, PV EOI). 0 or -errno.
 */
int vmm_cpuid__set(int vcpu_fd, const struct kvm_cpuid2 *base, unsigned id, unsigned n);

#endif
