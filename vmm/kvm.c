/* kvm.c: the KVM virtual machine: vCPU threads, exits, port and MMIO dispatch. */
