/* acpi.c: ACPI tables for a KVM guest: RSDP, XSDT, FADT (hardware-reduced), MADT, DSDT. */
