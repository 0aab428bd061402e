/* pvmsr.h: KVM's paravirtual MSRs through the VMM (see the DOC in pvmsr.c). */
#ifndef PVISOR_VMM_PVMSR_H
#define PVISOR_VMM_PVMSR_H

#include <stdbool.h>

struct kvm_run;
struct vmm_mem;

/* Make guest writes to KVM's paravirtual MSRs exit to the VMM. 0 or -errno. */
int vmm_pvmsr__setup(int vm_fd);
/* A KVM_EXIT_X86_WRMSR: pin the page it names, pass the value to KVM. False: not ours. */
bool vmm_pvmsr__exit(int vcpu_fd, struct kvm_run *run, struct vmm_mem *mem);

#endif
