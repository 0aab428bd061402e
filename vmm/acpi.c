/* acpi.c: ACPI tables for a KVM guest: RSDP, XSDT, FADT (hardware-reduced), MADT, DSDT. */
/*
 * DOC: table layout
 *
 * vmm_acpi__build() writes, from buf[0] (guest address `base`), each table at a
 * 16-byte aligned offset:
 *
 *   +0x000  RSDP  rev 2, 36 bytes, RsdtAddress 0, XsdtAddress -> XSDT
 *   +0x030  XSDT  36 + 2*8 bytes: FADT, MADT
 *   +0x070  FADT  rev 6.3, 276 bytes: HW_REDUCED_ACPI | RESET_REG_SUP | PWR_BUTTON |
 *                 SLP_BUTTON, X_DSDT -> DSDT, RESET_REG / SLEEP_CONTROL_REG /
 *                 SLEEP_STATUS_REG as 8-bit System I/O registers, IAPC_BOOT_ARCH says
 *                 no VGA, no MSI, no ASPM control, no CMOS RTC (and, by the missing
 *                 8042 bit, no keyboard controller), hypervisor vendor "PVISOR"
 *   +0x190  MADT  rev 5: LAPIC address 0xfee00000, flags 0 (no 8259 pair), one
 *                 IOAPIC (id 0, 0xfec00000, GSI base 0), one enabled Processor Local
 *                 APIC per vCPU (processor UID = APIC id = 0..n-1), no interrupt
 *                 source override (as Firecracker: KVM's default routing maps
 *                 GSI n to IOAPIC pin n and a hardware-reduced Linux uses no PIT)
 *   +...    DSDT  rev 2: Name(\_S5_, Package(){5, 0, 0, 0}), Scope(\_SB_){ COM1
 *                 (optional), VR00..VRnn (virtio-mmio) }
 *
 * There is no FACS (optional on hardware-reduced platforms) and no RSDT.
 *
 * The DSDT's AML is produced by the small encoder below: a byte writer with a
 * sticky -ENOSPC, and package lengths (PkgLength) written after their contents,
 * by moving the contents up by the 1..4 bytes the length needs.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "acpi.h"

#define ACPI_OEM_ID        "PVISOR"
#define ACPI_CREATOR_ID    "PVSR"
#define ACPI_HDR_LEN       36
#define ACPI_RSDP_LEN      36
#define ACPI_FADT_LEN      276
#define ACPI_MADT_HDR_LEN  44
#define ACPI_MAX_VCPUS     254     /* xAPIC ids are 8 bits and 0xff is broadcast */
#define ACPI_MAX_VIRTIO    256     /* device names VR00..VRFF */
#define ACPI_IOAPIC_PINS   24      /* KVM's in-kernel IOAPIC */

/* FADT offsets (ACPI 6.5 table 5.9) */
#define FADT_IAPC_BOOT_ARCH   109
#define FADT_FLAGS            112
#define FADT_RESET_REG        116
#define FADT_RESET_VALUE      128
#define FADT_MINOR_VERSION    131
#define FADT_X_DSDT           140
#define FADT_SLEEP_CONTROL    244
#define FADT_SLEEP_STATUS     256
#define FADT_HYPERVISOR_ID    268

/* FADT flags */
#define FADT_F_PWR_BUTTON     (1u << 4)   /* power button, if any, is a control method device */
#define FADT_F_SLP_BUTTON     (1u << 5)
#define FADT_F_RESET_REG_SUP  (1u << 10)
#define FADT_F_HW_REDUCED     (1u << 20)

/* IAPC_BOOT_ARCH flags; 8042 (bit 1) left clear: there is no keyboard controller */
#define IAPC_VGA_NOT_PRESENT  (1u << 2)
#define IAPC_MSI_NOT_PRESENT  (1u << 3)
#define IAPC_PCIE_ASPM        (1u << 4)
#define IAPC_CMOS_RTC_ABSENT  (1u << 5)

/* MADT structure types */
#define MADT_LAPIC   0
#define MADT_IOAPIC  1

/* AML opcodes (ACPI 6.5 section 20) */
#define AML_ZERO          0x00
#define AML_ONE           0x01
#define AML_NAME          0x08
#define AML_BYTE          0x0a
#define AML_WORD          0x0b
#define AML_DWORD         0x0c
#define AML_STRING        0x0d
#define AML_QWORD         0x0e
#define AML_SCOPE         0x10
#define AML_BUFFER        0x11
#define AML_PACKAGE       0x12
#define AML_EXT           0x5b
#define AML_EXT_DEVICE    0x82
#define AML_ROOT          0x5c    /* '\' */

/* Resource descriptors (ACPI 6.5 section 6.4) */
#define RES_IO            0x47    /* small: I/O port, 7 bytes of body */
#define RES_END           0x79    /* small: end tag + checksum byte */
#define RES_MEM32_FIXED   0x86    /* large: 9 bytes of body */
#define RES_EXT_IRQ       0x89    /* large: extended interrupt */
#define RES_IRQ_CONSUMER  0x01
#define RES_IRQ_EDGE      0x02    /* clear: level */
#define RES_IRQ_LOW       0x04    /* clear: active high */

/* struct aml - a bounded byte writer for one table body */
struct aml {
	uint8_t *buf;   /* output */
	size_t len;     /* bytes written */
	size_t cap;     /* bytes available */
	int err;        /* 0 or -ENOSPC, sticky: later writes do nothing */
};

static void put_le(uint8_t *p, uint64_t v, unsigned bytes)
{
	for (unsigned i = 0; i < bytes; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint8_t acpi_sum(const uint8_t *p, size_t len)
{
	uint8_t s = 0;

	while (len--)
		s += *p++;
	return s;
}

static void aml_bytes(struct aml *a, const void *p, size_t n)
{
	if (a->err)
		return;
	if (n > a->cap - a->len) {
		a->err = -ENOSPC;
		return;
	}
	memcpy(a->buf + a->len, p, n);
	a->len += n;
}

static void aml_byte(struct aml *a, uint8_t b)
{
	aml_bytes(a, &b, 1);
}

/* A NameSeg: exactly four characters ("_HID", "VR00"). */
static void aml_nameseg(struct aml *a, const char *seg)
{
	aml_bytes(a, seg, 4);
}

/* The shortest integer encoding: Zero, One, Byte/Word/DWord/QWord prefix. */
static void aml_int(struct aml *a, uint64_t v)
{
	uint8_t b[9];
	unsigned n;

	if (v == 0 || v == 1) {
		aml_byte(a, v ? AML_ONE : AML_ZERO);
		return;
	}
	if (v <= 0xff) {
		b[0] = AML_BYTE;
		n = 1;
	} else if (v <= 0xffff) {
		b[0] = AML_WORD;
		n = 2;
	} else if (v <= 0xffffffffull) {
		b[0] = AML_DWORD;
		n = 4;
	} else {
		b[0] = AML_QWORD;
		n = 8;
	}
	put_le(b + 1, v, n);
	aml_bytes(a, b, n + 1);
}

/* A 32-bit integer always as DWord (EISA ids read best that way in disassembly). */
static void aml_dword(struct aml *a, uint32_t v)
{
	uint8_t b[5] = { AML_DWORD };

	put_le(b + 1, v, 4);
	aml_bytes(a, b, sizeof(b));
}

static void aml_string(struct aml *a, const char *s)
{
	aml_byte(a, AML_STRING);
	aml_bytes(a, s, strlen(s) + 1);
}

/* Start a PkgLength-prefixed object body; returns where its length goes. */
static size_t aml_pkg_open(struct aml *a)
{
	return a->len;
}

/*
 * End the body opened at `start`: the PkgLength counts itself and everything
 * after it. One byte holds up to 63; longer lengths take 2..4 bytes, the first
 * with the byte count in bits 7-6 and the low nibble in bits 3-0.
 */
static void aml_pkg_close(struct aml *a, size_t start)
{
	size_t body = a->len - start, total;
	unsigned n;

	if (a->err)
		return;
	for (n = 1; n <= 4; n++) {
		total = body + n;
		if (n == 1 ? total <= 0x3f : total < (1ull << (4 + 8 * (n - 1))))
			break;
	}
	if (n > 4 || n > a->cap - a->len) {
		a->err = -ENOSPC;
		return;
	}
	memmove(a->buf + start + n, a->buf + start, body);
	a->len += n;
	if (n == 1) {
		a->buf[start] = (uint8_t)total;
		return;
	}
	a->buf[start] = (uint8_t)(((n - 1) << 6) | (total & 0xf));
	for (unsigned i = 1; i < n; i++)
		a->buf[start + i] = (uint8_t)(total >> (4 + 8 * (i - 1)));
}

/* Name(seg, <value written next by the caller>) */
static void aml_name(struct aml *a, const char *seg)
{
	aml_byte(a, AML_NAME);
	aml_nameseg(a, seg);
}

/* Buffer(){bytes}: a ResourceTemplate is a buffer ending in an end tag. */
static void aml_buffer(struct aml *a, const uint8_t *p, size_t n)
{
	size_t pkg;

	aml_byte(a, AML_BUFFER);
	pkg = aml_pkg_open(a);
	aml_int(a, n);
	aml_bytes(a, p, n);
	aml_pkg_close(a, pkg);
}

/*
 * A compressed EISA id ("PNP0501" -> 0x0105d041): three letters of five bits
 * and four hex digits, stored big-endian in the low bytes of a DWord.
 */
static uint32_t aml_eisaid(const char *id)
{
	uint32_t v = 0;
	unsigned i;

	for (i = 0; i < 3; i++)
		v = (v << 5) | (uint32_t)((id[i] - 0x40) & 0x1f);
	for (i = 3; i < 7; i++) {
		char c = id[i];
		v = (v << 4) | (uint32_t)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
	}
	return ((v >> 24) & 0xff) | ((v >> 8) & 0xff00) | ((v << 8) & 0xff0000) | (v << 24);
}

/* Extended Interrupt descriptor with one GSI; returns its length (9). */
static size_t res_irq(uint8_t *p, uint32_t gsi, uint8_t flags)
{
	p[0] = RES_EXT_IRQ;
	put_le(p + 1, 6, 2);
	p[3] = flags;
	p[4] = 1;
	put_le(p + 5, gsi, 4);
	return 9;
}

/* Memory32Fixed descriptor; returns its length (12). */
static size_t res_mem32(uint8_t *p, uint32_t base, uint32_t size, bool rw)
{
	p[0] = RES_MEM32_FIXED;
	put_le(p + 1, 9, 2);
	p[3] = rw;
	put_le(p + 4, base, 4);
	put_le(p + 8, size, 4);
	return 12;
}

/* IO(Decode16, port, port, 1, len) descriptor; returns its length (8). */
static size_t res_io(uint8_t *p, uint16_t port, uint8_t len)
{
	p[0] = RES_IO;
	p[1] = 1;
	put_le(p + 2, port, 2);
	put_le(p + 4, port, 2);
	p[6] = 1;
	p[7] = len;
	return 8;
}

/* End tag; checksum 0 means "treat as valid" (what iasl emits). */
static size_t res_end(uint8_t *p)
{
	p[0] = RES_END;
	p[1] = 0;
	return 2;
}

/* Device(VRnn){ _HID "LNRO0005", _UID i, _CCA 1, _CRS {Memory32Fixed, Interrupt} } */
static void aml_virtio_dev(struct aml *a, unsigned i, const struct vmm_acpi_mmio *d)
{
	uint8_t crs[32];
	size_t n = 0, pkg;
	char seg[5];

	snprintf(seg, sizeof(seg), "VR%02X", i & 0xff);
	aml_byte(a, AML_EXT);
	aml_byte(a, AML_EXT_DEVICE);
	pkg = aml_pkg_open(a);
	aml_nameseg(a, seg);
	aml_name(a, "_HID");
	aml_string(a, "LNRO0005");
	aml_name(a, "_UID");
	aml_int(a, i);
	aml_name(a, "_CCA");       /* DMA is cache coherent (as QEMU and Firecracker say) */
	aml_int(a, 1);
	n += res_mem32(crs + n, (uint32_t)d->base, d->size, true);
	n += res_irq(crs + n, d->gsi, RES_IRQ_CONSUMER);   /* level, active high, exclusive */
	n += res_end(crs + n);
	aml_name(a, "_CRS");
	aml_buffer(a, crs, n);
	aml_pkg_close(a, pkg);
}

/*
 * Device(COM1){ _HID EisaId("PNP0501"), _UID 0, _CRS {IO 0x3f8/8, Interrupt 4} }:
 * on a hardware-reduced platform Linux sets no ISA IRQs up in the IOAPIC
 * (nr_legacy_irqs() is 0), so the legacy ttyS0 at IRQ 4 cannot get its
 * interrupt; 8250_pnp takes the port over with the GSI described here.
 */
static void aml_com1(struct aml *a)
{
	uint8_t crs[32];
	size_t n = 0, pkg;

	aml_byte(a, AML_EXT);
	aml_byte(a, AML_EXT_DEVICE);
	pkg = aml_pkg_open(a);
	aml_nameseg(a, "COM1");
	aml_name(a, "_HID");
	aml_dword(a, aml_eisaid("PNP0501"));
	aml_name(a, "_UID");
	aml_int(a, 0);
	n += res_io(crs + n, VMM_ACPI_COM1_PORT, 8);
	n += res_irq(crs + n, VMM_ACPI_COM1_GSI, RES_IRQ_CONSUMER | RES_IRQ_EDGE);
	n += res_end(crs + n);
	aml_name(a, "_CRS");
	aml_buffer(a, crs, n);
	aml_pkg_close(a, pkg);
}

/* Name(\_S5_, Package(){5, 0, 0, 0}): SLP_TYP for S5 (a and b), two reserved. */
static void aml_s5(struct aml *a)
{
	size_t pkg;

	aml_byte(a, AML_NAME);
	aml_byte(a, AML_ROOT);
	aml_nameseg(a, "_S5_");
	aml_byte(a, AML_PACKAGE);
	pkg = aml_pkg_open(a);
	aml_byte(a, 4);
	aml_int(a, VMM_ACPI_S5_TYP);
	aml_int(a, 0);
	aml_int(a, 0);
	aml_int(a, 0);
	aml_pkg_close(a, pkg);
}

/* The DSDT body (the AML after the header). */
static void aml_dsdt_body(struct aml *a, const struct vmm_acpi_cfg *cfg)
{
	size_t pkg;

	aml_s5(a);
	aml_byte(a, AML_SCOPE);
	pkg = aml_pkg_open(a);
	aml_byte(a, AML_ROOT);
	aml_nameseg(a, "_SB_");
	if (cfg->com1)
		aml_com1(a);
	for (unsigned i = 0; i < cfg->nvirtio; i++)
		aml_virtio_dev(a, i, &cfg->virtio[i]);
	aml_pkg_close(a, pkg);
}

/* The 36-byte header every table but the RSDP starts with; checksum set later. */
static void acpi_header(uint8_t *t, const char *sig, uint32_t len, uint8_t rev,
			const char *table_id)
{
	memcpy(t, sig, 4);
	put_le(t + 4, len, 4);
	t[8] = rev;
	memcpy(t + 10, ACPI_OEM_ID, 6);
	memcpy(t + 16, table_id, 8);
	put_le(t + 24, 1, 4);                   /* OEM revision */
	memcpy(t + 28, ACPI_CREATOR_ID, 4);
	put_le(t + 32, 1, 4);                   /* creator revision */
}

static void acpi_checksum(uint8_t *t, size_t len, size_t at)
{
	t[at] = 0;
	t[at] = (uint8_t)-acpi_sum(t, len);
}

/* A Generic Address Structure for an 8-bit register in System I/O space. */
static void acpi_gas_io8(uint8_t *p, uint16_t port)
{
	p[0] = 1;       /* SystemIO */
	p[1] = 8;       /* bit width */
	p[2] = 0;       /* bit offset */
	p[3] = 1;       /* access size: byte */
	put_le(p + 4, port, 8);
}

static void acpi_rsdp(uint8_t *t, uint64_t xsdt)
{
	memcpy(t, "RSD PTR ", 8);
	memcpy(t + 9, ACPI_OEM_ID, 6);
	t[15] = 2;                              /* revision: ACPI 2.0+ (has XSDT) */
	put_le(t + 20, ACPI_RSDP_LEN, 4);
	put_le(t + 24, xsdt, 8);
	acpi_checksum(t, 20, 8);                /* first 20 bytes (ACPI 1.0 part) */
	acpi_checksum(t, ACPI_RSDP_LEN, 32);    /* extended checksum: all 36 */
}

static void acpi_xsdt(uint8_t *t, const uint64_t *entries, unsigned n)
{
	uint32_t len = ACPI_HDR_LEN + 8 * n;

	acpi_header(t, "XSDT", len, 1, "PVISXSDT");
	for (unsigned i = 0; i < n; i++)
		put_le(t + ACPI_HDR_LEN + 8 * i, entries[i], 8);
	acpi_checksum(t, len, 9);
}

static void acpi_fadt(uint8_t *t, uint64_t dsdt)
{
	acpi_header(t, "FACP", ACPI_FADT_LEN, 6, "PVISFACP");
	put_le(t + FADT_IAPC_BOOT_ARCH, IAPC_VGA_NOT_PRESENT | IAPC_MSI_NOT_PRESENT |
	       IAPC_PCIE_ASPM | IAPC_CMOS_RTC_ABSENT, 2);
	put_le(t + FADT_FLAGS, FADT_F_HW_REDUCED | FADT_F_RESET_REG_SUP | FADT_F_PWR_BUTTON |
	       FADT_F_SLP_BUTTON, 4);
	acpi_gas_io8(t + FADT_RESET_REG, VMM_ACPI_RESET_PORT);
	t[FADT_RESET_VALUE] = VMM_ACPI_RESET_VALUE;
	t[FADT_MINOR_VERSION] = 3;              /* FADT 6.3 */
	put_le(t + FADT_X_DSDT, dsdt, 8);
	acpi_gas_io8(t + FADT_SLEEP_CONTROL, VMM_ACPI_SLEEP_CTL_PORT);
	acpi_gas_io8(t + FADT_SLEEP_STATUS, VMM_ACPI_SLEEP_STS_PORT);
	memcpy(t + FADT_HYPERVISOR_ID, "PVISOR\0\0", 8);
	acpi_checksum(t, ACPI_FADT_LEN, 9);
}

static size_t acpi_madt_len(unsigned vcpus)
{
	return ACPI_MADT_HDR_LEN + 12 + 8 * (size_t)vcpus;
}

static void acpi_madt(uint8_t *t, unsigned vcpus)
{
	size_t len = acpi_madt_len(vcpus);
	uint8_t *p = t + ACPI_MADT_HDR_LEN;

	acpi_header(t, "APIC", (uint32_t)len, 5, "PVISAPIC");
	put_le(t + 36, VMM_ACPI_LAPIC_ADDR, 4);
	put_le(t + 40, 0, 4);                   /* flags: no PCAT_COMPAT (no 8259s) */
	p[0] = MADT_IOAPIC;
	p[1] = 12;
	p[2] = 0;                               /* id 0: what KVM's IOAPIC reports */
	put_le(p + 4, VMM_ACPI_IOAPIC_ADDR, 4);
	put_le(p + 8, 0, 4);                    /* GSI base */
	p += 12;
	for (unsigned i = 0; i < vcpus; i++, p += 8) {
		p[0] = MADT_LAPIC;
		p[1] = 8;
		p[2] = (uint8_t)i;                  /* ACPI processor UID */
		p[3] = (uint8_t)i;                  /* APIC id */
		put_le(p + 4, 1, 4);                /* enabled */
	}
	acpi_checksum(t, len, 9);
}

static int acpi_check_cfg(const struct vmm_acpi_cfg *cfg)
{
	if (cfg->vcpus == 0 || cfg->vcpus > ACPI_MAX_VCPUS)
		return -EINVAL;
	if (cfg->nvirtio > ACPI_MAX_VIRTIO || (cfg->nvirtio && !cfg->virtio))
		return -EINVAL;
	for (unsigned i = 0; i < cfg->nvirtio; i++) {
		const struct vmm_acpi_mmio *d = &cfg->virtio[i];

		if (d->size == 0 || d->base > 0xffffffffull - (d->size - 1))
			return -EINVAL;
		if (d->gsi >= ACPI_IOAPIC_PINS)
			return -EINVAL;
	}
	return 0;
}

static size_t acpi_align16(size_t off)
{
	return (off + 15) & ~(size_t)15;
}

/*
 * Lay out and write every table; offsets relative to buf, addresses in the
 * tables are base + offset. The DSDT goes last because only it has a variable,
 * AML-encoded size.
 */
int vmm_acpi__build(void *buf, uint64_t base, size_t max, const struct vmm_acpi_cfg *cfg,
		    size_t *used)
{
	size_t xsdt_off, fadt_off, madt_off, dsdt_off, end;
	uint8_t *b = buf;
	uint64_t entries[2];
	struct aml a;
	int ret;

	if (!buf || !cfg || !used || base % 16 || base > UINT64_MAX - max)
		return -EINVAL;
	ret = acpi_check_cfg(cfg);
	if (ret)
		return ret;
	xsdt_off = acpi_align16(ACPI_RSDP_LEN);
	fadt_off = acpi_align16(xsdt_off + ACPI_HDR_LEN + sizeof(entries));
	madt_off = acpi_align16(fadt_off + ACPI_FADT_LEN);
	dsdt_off = acpi_align16(madt_off + acpi_madt_len(cfg->vcpus));
	if (dsdt_off + ACPI_HDR_LEN > max)
		return -ENOSPC;
	memset(b, 0, dsdt_off + ACPI_HDR_LEN);

	a = (struct aml){ .buf = b + dsdt_off + ACPI_HDR_LEN,
			  .cap = max - dsdt_off - ACPI_HDR_LEN };
	aml_dsdt_body(&a, cfg);
	if (a.err)
		return a.err;
	end = dsdt_off + ACPI_HDR_LEN + a.len;
	acpi_header(b + dsdt_off, "DSDT", (uint32_t)(ACPI_HDR_LEN + a.len), 2, "PVISDSDT");
	acpi_checksum(b + dsdt_off, ACPI_HDR_LEN + a.len, 9);

	acpi_madt(b + madt_off, cfg->vcpus);
	acpi_fadt(b + fadt_off, base + dsdt_off);
	entries[0] = base + fadt_off;
	entries[1] = base + madt_off;
	acpi_xsdt(b + xsdt_off, entries, 2);
	acpi_rsdp(b, base + xsdt_off);
	*used = end;
	return 0;
}
