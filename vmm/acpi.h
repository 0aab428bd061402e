/* acpi.h: ACPI tables for a KVM guest (RSDP, XSDT, FADT, MADT, DSDT) and the power ports. */
#ifndef PVISOR_VMM_ACPI_H
#define PVISOR_VMM_ACPI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Power: the FADT is hardware-reduced (no PM1 blocks, no SCI, no legacy PIC), so
 * the guest turns itself off through the FADT's SLEEP_CONTROL_REG and restarts
 * through its RESET_REG, both 8-bit registers in I/O space:
 *
 *  - a byte written to VMM_ACPI_SLEEP_CTL_PORT with SLP_EN (bit 5) set and
 *    SLP_TYP (bits 2-4) == VMM_ACPI_S5_TYP is power off (Linux writes 0x34);
 *  - VMM_ACPI_SLEEP_STS_PORT is the sleep status register: reads may return 0,
 *    writes (Linux clears WAK_STS, bit 7, before sleeping) are ignored;
 *  - VMM_ACPI_RESET_VALUE written to VMM_ACPI_RESET_PORT is reboot.
 *
 * Linux finds S5's SLP_TYP in the DSDT's Name(_S5_, Package(){5, 0, 0, 0}).
 */
#define VMM_ACPI_SLEEP_CTL_PORT 0x600
#define VMM_ACPI_SLEEP_STS_PORT 0x601
#define VMM_ACPI_RESET_PORT     0x602
#define VMM_ACPI_RESET_VALUE    0x1
#define VMM_ACPI_S5_TYP         5
#define VMM_ACPI_SLP_EN         (1u << 5)               /* bit in the sleep control byte */
#define VMM_ACPI_SLP_TYP(v)     (((v) >> 2) & 7u)       /* SLP_TYP of a sleep control byte */

#define VMM_ACPI_TABLES_GPA     0xe0000ull   /* RSDP here, the other tables follow */
#define VMM_ACPI_TABLES_MAX     0x10000ull   /* up to 0xf0000 */

#define VMM_ACPI_LAPIC_ADDR     0xfee00000u  /* MADT local APIC address */
#define VMM_ACPI_IOAPIC_ADDR    0xfec00000u  /* the one IOAPIC, GSI base 0 */

/* COM1 as a DSDT device (PNP0501), so Linux maps its interrupt through the IOAPIC */
#define VMM_ACPI_COM1_PORT      0x3f8
#define VMM_ACPI_COM1_GSI       4            /* edge, active high */

/*
 * struct vmm_acpi_mmio - one virtio-mmio device announced in the DSDT
 *
 * The DSDT entry is Device(Vnnn){ _HID "LNRO0005", _UID i, _CRS {
 * Memory32Fixed(ReadWrite, base, size), Interrupt(ResourceConsumer, Level,
 * ActiveHigh, Exclusive){gsi} } }. The interrupt is LEVEL triggered: the
 * device must hold the line high (vmm_kvm__set_irq(gsi, 1)) while its
 * InterruptStatus register is non-zero and lower it (level 0) when the guest's
 * InterruptACK write clears the last bit. A pulse (1 then 0) also works with
 * a level IOAPIC pin, but holding the line is what keeps no interrupt lost.
 */
struct vmm_acpi_mmio {
	uint64_t base;   /* guest physical address of the register window, < 4 GiB */
	uint32_t size;   /* window length in bytes (0x200) */
	uint32_t gsi;    /* IOAPIC input, 0..23 */
};

/* struct vmm_acpi_cfg - what the tables describe */
struct vmm_acpi_cfg {
	unsigned vcpus;                      /* one LAPIC (MADT) per vCPU, APIC ids 0..n-1 */
	const struct vmm_acpi_mmio *virtio;  /* virtio-mmio devices for the DSDT */
	unsigned nvirtio;
	bool com1;                           /* also describe COM1 (0x3f8, GSI 4) */
};

/*
 * Build all tables into buf, which the guest sees at gpa `base`; *used gets the bytes
 * written. Returns 0 or -ENOSPC/-EINVAL. The RSDP is at buf[0].
 */
int vmm_acpi__build(void *buf, uint64_t base, size_t max, const struct vmm_acpi_cfg *cfg,
		    size_t *used);

#endif
