/* boot.c: load a Linux bzImage, its initrd and command line into guest RAM (64-bit boot protocol). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/kvm.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "acpi.h"
#include "boot.h"
#include "log.h"
#include "mem.h"

/*
 * DOC: booting Linux without firmware
 *
 * Documentation/arch/x86/boot.rst, "64-bit boot protocol": the loader copies the
 * bzImage's setup header into a zeroed struct boot_params (the "zero page"),
 * fills in the command line, initrd and e820 memory map, loads the
 * protected-mode part of the image (everything after the (setup_sects + 1) *
 * 512 bytes of real-mode code) and jumps to its startup_64, 0x200 bytes in,
 * with paging on, an identity map covering the kernel, zero page and command
 * line, a GDT with a flat 64-bit code segment at __BOOT_CS (0x10) and data at
 * __BOOT_DS (0x18), interrupts off and rsi = the zero page. A relocatable
 * kernel (every distribution kernel) may be loaded anywhere; its decompressor
 * moves itself to a suitable (KASLR-chosen) place using the e820 map, and
 * avoids the initrd and command line. The real-mode setup code never runs, so
 * nothing here needs a BIOS: the kernel finds ACPI through acpi_rsdp_addr
 * (protocol >= 2.14) or by scanning 0xe0000..0xfffff, where the RSDP sits.
 */

/* Offsets in struct boot_params (arch/x86/include/uapi/asm/bootparam.h). */
#define BP_ACPI_RSDP_ADDR   0x070   /* u64 */
#define BP_E820_ENTRIES     0x1e8   /* u8 */
#define BP_HDR              0x1f1   /* struct setup_header */
#define BP_SETUP_SECTS      0x1f1   /* u8: 0 means 4 */
#define BP_JUMP             0x200   /* u16: short jump over the header: its end */
#define BP_HEADER           0x202   /* u32: "HdrS" */
#define BP_VERSION          0x206   /* u16 */
#define BP_TYPE_OF_LOADER   0x210   /* u8 */
#define BP_LOADFLAGS        0x211   /* u8 */
#define BP_RAMDISK_IMAGE    0x218   /* u32 */
#define BP_RAMDISK_SIZE     0x21c   /* u32 */
#define BP_CMD_LINE_PTR     0x228   /* u32 */
#define BP_INITRD_ADDR_MAX  0x22c   /* u32 (>= 2.03) */
#define BP_RELOCATABLE      0x234   /* u8 (>= 2.05) */
#define BP_XLOADFLAGS       0x236   /* u16 (>= 2.12) */
#define BP_CMDLINE_SIZE     0x238   /* u32 (>= 2.06), without the NUL */
#define BP_PREF_ADDRESS     0x258   /* u64 (>= 2.10) */
#define BP_INIT_SIZE        0x260   /* u32 (>= 2.10) */
#define BP_HDR_END_MAX      0x290   /* the header never reaches past this */
#define BP_E820_TABLE       0x2d0   /* struct boot_e820_entry[128], 20 bytes each */
#define BP_E820_MAX         128
#define BP_SIZE             4096

#define HDRS_MAGIC          0x53726448u  /* "HdrS" */
#define XLF_KERNEL_64       (1u << 0)
#define LOADFLAG_CAN_USE_HEAP (1u << 7)
#define LOADER_UNDEFINED    0xff

#define E820_RAM            1
#define E820_RESERVED       2
#define LOW_RAM_END         0x9fc00ull   /* the BIOS data area ends here on a PC */
#define HIGH_RAM_START      0x100000ull

/* GDT descriptors (flags: G, D/B, L, AVL in 15..12; access byte in 7..0). */
#define GDT_CODE64          0xa09bu      /* present, ring 0, code r/x, long mode, 4K granular */
#define GDT_DATA            0xc093u      /* present, ring 0, data r/w, 32-bit, 4K granular */
#define GDT_TSS             0x808bu      /* present, busy 64-bit TSS */
#define BOOT_CS             0x10
#define BOOT_DS             0x18
#define BOOT_TSS            0x20
#define GDT_ENTRIES         5

#define PT_PRESENT_RW       0x3ull
#define PT_PS               0x80ull      /* 2 MiB page in a PD entry */
#define PT_IDENTITY_GIB     4            /* one PD per GiB */

#define CR0_PE              (1ull << 0)
#define CR0_ET              (1ull << 4)
#define CR0_NW              (1ull << 29)
#define CR0_CD              (1ull << 30)
#define CR0_PG              (1ull << 31)
#define CR4_PAE             (1ull << 5)
#define EFER_LME            (1ull << 8)
#define EFER_LMA            (1ull << 10)

static uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* struct boot_image - a bzImage's header and where its protected-mode part lies */
struct boot_image {
	uint8_t hdr[BP_SIZE];   /* the file's first 4 KiB (zero-padded): the setup header */
	uint64_t pm_offset;     /* file offset of the protected-mode kernel */
	uint64_t pm_size;       /* its length */
	uint16_t version;       /* boot protocol version */
};

/* Read the header and validate it; the reason for a refusal goes into why. */
static int boot_parse(int fd, const char *path, struct boot_image *img)
{
	const char *why = NULL;
	struct stat st;
	unsigned sects;
	ssize_t n;

	memset(img->hdr, 0, sizeof(img->hdr));
	if (fstat(fd, &st) || (n = pread(fd, img->hdr, sizeof(img->hdr), 0)) < 0) {
		int e = errno;

		log_err("--kernel %s: cannot read: %s", path, strerror(e));
		return -e;
	}
	sects = img->hdr[BP_SETUP_SECTS] ? img->hdr[BP_SETUP_SECTS] : 4;
	img->pm_offset = (uint64_t)(sects + 1) * 512;
	img->version = rd16(img->hdr + BP_VERSION);
	if (n < BP_HEADER + 4 || rd32(img->hdr + BP_HEADER) != HDRS_MAGIC)
		why = "no \"HdrS\" setup header at offset 0x202";
	else if (img->version < 0x206)
		why = "boot protocol older than 2.06";
	else if (img->version < 0x20c || !(rd16(img->hdr + BP_XLOADFLAGS) & XLF_KERNEL_64))
		why = "no 64-bit entry point (XLF_KERNEL_64; a 64-bit x86 kernel is needed)";
	else if ((uint64_t)st.st_size <= img->pm_offset)
		why = "file ends before the protected-mode kernel";
	if (why) {
		log_err("--kernel %s: not a bzImage: %s", path, why);
		return -ENOEXEC;
	}
	img->pm_size = (uint64_t)st.st_size - img->pm_offset;
	return 0;
}

int vmm_boot__check_kernel(const char *path)
{
	static struct boot_image img; /* 4 KiB: keep it off small thread stacks */
	int fd, ret;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		log_err("--kernel %s: %s", path, strerror(errno));
		return ret;
	}
	ret = boot_parse(fd, path, &img);
	close(fd);
	return ret;
}

/* Read len bytes of fd from offset into guest RAM at gpa. */
static int boot_read(struct vmm_mem *mem, int fd, uint64_t off, gpa_t gpa, uint64_t len)
{
	uint8_t *dst = vmm_mem__hva(mem, gpa, len);

	if (!dst)
		return -ENOSPC;
	while (len) {
		ssize_t n = pread(fd, dst, len > (1u << 30) ? 1u << 30 : len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (!n)
			return -EIO; /* the file shrank under us */
		dst += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

static void boot_e820_add(uint8_t *zp, uint64_t addr, uint64_t size, uint32_t type)
{
	uint8_t *e = zp + BP_E820_TABLE + 20 * zp[BP_E820_ENTRIES];

	wr64(e, addr);
	wr64(e + 8, size);
	wr32(e + 16, type);
	zp[BP_E820_ENTRIES]++;
}

/* The zero page: setup header from the image, our fields, the memory map. */
static int boot_zero_page(struct vmm_mem *mem, const struct boot_image *img, const char *cmdline,
			  uint64_t initrd_gpa, uint64_t initrd_size)
{
	uint64_t size = vmm_mem__size(mem);
	uint8_t *zp = vmm_mem__hva(mem, GPA(VMM_BOOT_ZERO_PAGE_GPA), BP_SIZE);
	size_t hdr_end = BP_HEADER + (img->hdr[BP_JUMP + 1] & 0xff);
	size_t max_cmd = VMM_BOOT_CMDLINE_MAX - 1;
	char *cmd = vmm_mem__hva(mem, GPA(VMM_BOOT_CMDLINE_GPA), VMM_BOOT_CMDLINE_MAX);

	if (!zp || !cmd)
		return -ENOSPC;
	memset(zp, 0, BP_SIZE);
	if (hdr_end > BP_HDR_END_MAX)
		hdr_end = BP_HDR_END_MAX;
	memcpy(zp + BP_HDR, img->hdr + BP_HDR, hdr_end - BP_HDR);
	if (rd32(zp + BP_CMDLINE_SIZE) < max_cmd)
		max_cmd = rd32(zp + BP_CMDLINE_SIZE);
	if (strlen(cmdline) > max_cmd) {
		log_err("kernel command line is %zu bytes; this kernel takes at most %zu",
			strlen(cmdline), max_cmd);
		return -E2BIG;
	}
	strcpy(cmd, cmdline);
	zp[BP_TYPE_OF_LOADER] = LOADER_UNDEFINED;
	zp[BP_LOADFLAGS] |= LOADFLAG_CAN_USE_HEAP;
	wr32(zp + BP_CMD_LINE_PTR, (uint32_t)VMM_BOOT_CMDLINE_GPA);
	wr32(zp + BP_RAMDISK_IMAGE, (uint32_t)initrd_gpa);
	wr32(zp + BP_RAMDISK_SIZE, (uint32_t)initrd_size);
	wr64(zp + BP_ACPI_RSDP_ADDR, VMM_ACPI_TABLES_GPA);
	boot_e820_add(zp, 0, LOW_RAM_END, E820_RAM);
	boot_e820_add(zp, LOW_RAM_END, HIGH_RAM_START - LOW_RAM_END, E820_RESERVED);
	boot_e820_add(zp, HIGH_RAM_START, size - HIGH_RAM_START, E820_RAM);
	return 0;
}

static uint64_t boot_gdt_entry(uint16_t flags, uint32_t base, uint32_t limit)
{
	return ((uint64_t)(base & 0xff000000u) << 32) | ((uint64_t)(flags & 0xf0ffu) << 40) |
	       ((uint64_t)(limit & 0x000f0000u) << 32) | ((uint64_t)(base & 0x00ffffffu) << 16) |
	       (uint64_t)(limit & 0xffffu);
}

/* GDT, empty IDT and the identity page tables. */
static int boot_cpu_tables(struct vmm_mem *mem, struct vmm_boot_entry *e)
{
	uint64_t gdt[GDT_ENTRIES] = {
		[BOOT_CS / 8] = boot_gdt_entry(GDT_CODE64, 0, 0xfffff),
		[BOOT_DS / 8] = boot_gdt_entry(GDT_DATA, 0, 0xfffff),
		[BOOT_TSS / 8] = boot_gdt_entry(GDT_TSS, 0, 0xfffff),
	};
	uint64_t *pml4 = vmm_mem__hva(mem, GPA(VMM_BOOT_PML4_GPA), 0x1000);
	uint64_t *pdpt = vmm_mem__hva(mem, GPA(VMM_BOOT_PML4_GPA + 0x1000), 0x1000);
	uint64_t *pd = vmm_mem__hva(mem, GPA(VMM_BOOT_PML4_GPA + 0x2000), 0x1000 * PT_IDENTITY_GIB);
	void *g = vmm_mem__hva(mem, GPA(VMM_BOOT_GDT_GPA), sizeof(gdt));
	void *idt = vmm_mem__hva(mem, GPA(VMM_BOOT_IDT_GPA), 8);

	if (!pml4 || !pdpt || !pd || !g || !idt)
		return -ENOSPC;
	memcpy(g, gdt, sizeof(gdt));
	memset(idt, 0, 8);
	memset(pml4, 0, 0x1000);
	memset(pdpt, 0, 0x1000);
	pml4[0] = (VMM_BOOT_PML4_GPA + 0x1000) | PT_PRESENT_RW;
	for (uint64_t i = 0; i < PT_IDENTITY_GIB; i++) {
		pdpt[i] = (VMM_BOOT_PML4_GPA + 0x2000 + i * 0x1000) | PT_PRESENT_RW;
		for (uint64_t j = 0; j < 512; j++)
			pd[i * 512 + j] = ((i * 512 + j) << 21) | PT_PRESENT_RW | PT_PS;
	}
	e->cr3 = VMM_BOOT_PML4_GPA;
	e->gdt_base = VMM_BOOT_GDT_GPA;
	e->gdt_limit = sizeof(gdt) - 1;
	e->idt_base = VMM_BOOT_IDT_GPA;
	e->idt_limit = 7;
	e->rsp = VMM_BOOT_STACK_GPA;
	e->rsi = VMM_BOOT_ZERO_PAGE_GPA;
	return 0;
}

/* Where the protected-mode kernel goes: 1 MiB, or pref_address if it cannot move. */
static uint64_t boot_kernel_gpa(const struct boot_image *img)
{
	if (img->hdr[BP_RELOCATABLE])
		return VMM_BOOT_KERNEL_GPA;
	return rd64(img->hdr + BP_PREF_ADDRESS);
}

/* Put the initrd as high as the kernel allows, above the kernel's working area. */
static int boot_initrd(struct vmm_mem *mem, const struct boot_image *img, const char *path,
		       uint64_t kernel_end, uint64_t *gpa, uint64_t *size)
{
	uint64_t top = vmm_mem__size(mem), max = (uint64_t)rd32(img->hdr + BP_INITRD_ADDR_MAX) + 1;
	struct stat st;
	int fd, ret;

	*gpa = *size = 0;
	if (!path || !*path)
		return 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		ret = -errno;
		log_err("--initrd %s: %s", path, strerror(errno));
		goto out;
	}
	if (max > 1 && max < top)
		top = max;
	if ((uint64_t)st.st_size > top || ((top - (uint64_t)st.st_size) & ~0xfffull) < kernel_end) {
		log_err("--initrd %s: %" PRIu64 " MiB do not fit in guest RAM above the kernel "
			"(%" PRIu64 " MiB); raise --mem", path, (uint64_t)st.st_size >> 20,
			kernel_end >> 20);
		ret = -ENOSPC;
		goto out;
	}
	*size = (uint64_t)st.st_size;
	*gpa = (top - *size) & ~0xfffull;
	ret = boot_read(mem, fd, 0, GPA(*gpa), *size);
	if (ret)
		log_err("--initrd %s: cannot read: %s", path, strerror(-ret));
	else
		vmm_mem__hint(mem, GPA(*gpa), *size);
out:
	if (fd >= 0)
		close(fd);
	return ret;
}

static int boot_kernel(struct vmm_mem *mem, const struct vmm_boot_cfg *cfg,
		       struct boot_image *img, uint64_t *load, uint64_t *end)
{
	uint64_t init_size;
	int fd, ret;

	fd = open(cfg->kernel, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		log_err("--kernel %s: %s", cfg->kernel, strerror(errno));
		return ret;
	}
	ret = boot_parse(fd, cfg->kernel, img);
	if (ret)
		goto out;
	*load = boot_kernel_gpa(img);
	/*
	 * The kernel needs init_size bytes to decompress into, from its load address
	 * or, if relocatable and loaded lower, from pref_address (LOAD_PHYSICAL_ADDR).
	 */
	init_size = rd32(img->hdr + BP_INIT_SIZE);
	if (init_size < img->pm_size)
		init_size = img->pm_size;
	*end = *load + init_size;
	if (rd64(img->hdr + BP_PREF_ADDRESS) > *load && rd64(img->hdr + BP_PREF_ADDRESS) < (1ull << 32))
		*end = rd64(img->hdr + BP_PREF_ADDRESS) + init_size;
	if (*load < HIGH_RAM_START || *end > vmm_mem__size(mem)) {
		log_err("--kernel %s: needs guest RAM [0x%" PRIx64 ", 0x%" PRIx64 "); raise --mem",
			cfg->kernel, *load, *end);
		ret = -ENOSPC;
		goto out;
	}
	ret = boot_read(mem, fd, img->pm_offset, GPA(*load), img->pm_size);
	if (ret)
		log_err("--kernel %s: cannot read: %s", cfg->kernel, strerror(-ret));
	else
		vmm_mem__hint(mem, GPA(*load), img->pm_size);
out:
	close(fd);
	return ret;
}

int vmm_boot__load(struct vmm_mem *mem, const struct vmm_boot_cfg *cfg,
		   struct vmm_boot_entry *entry)
{
	static struct boot_image img;
	uint64_t load = 0, end = 0, initrd_gpa, initrd_size;
	void *acpi = vmm_mem__hva(mem, GPA(VMM_ACPI_TABLES_GPA), VMM_ACPI_TABLES_MAX);
	size_t used;
	int ret;

	memset(entry, 0, sizeof(*entry));
	if (!acpi || vmm_mem__size(mem) <= HIGH_RAM_START)
		return -ENOSPC;
	ret = boot_kernel(mem, cfg, &img, &load, &end);
	if (ret)
		return ret;
	ret = boot_initrd(mem, &img, cfg->initrd, end, &initrd_gpa, &initrd_size);
	if (ret)
		return ret;
	ret = boot_zero_page(mem, &img, cfg->cmdline, initrd_gpa, initrd_size);
	if (ret)
		return ret;
	ret = boot_cpu_tables(mem, entry);
	if (ret)
		return ret;
	ret = vmm_acpi__build(acpi, VMM_ACPI_TABLES_GPA, VMM_ACPI_TABLES_MAX, cfg->acpi, &used);
	if (ret) {
		log_err("cannot build the ACPI tables: %s", strerror(-ret));
		return ret;
	}
	entry->rip = load + 0x200;
	log_debug("boot: protocol %u.%02u, kernel at 0x%" PRIx64 " (%" PRIu64 " KiB), initrd at "
		  "0x%" PRIx64 " (%" PRIu64 " KiB), ACPI %zu bytes", img.version >> 8,
		  img.version & 0xff, load, img.pm_size >> 10, initrd_gpa, initrd_size >> 10, used);
	return 0;
}

void vmm_boot__regs(const struct vmm_boot_entry *e, struct kvm_regs *regs)
{
	memset(regs, 0, sizeof(*regs));
	regs->rflags = 0x2; /* bit 1 is always set; interrupts off */
	regs->rip = e->rip;
	regs->rsp = regs->rbp = e->rsp;
	regs->rsi = e->rsi;
}

/* A kvm_segment from the GDT descriptor the guest would load for selector sel. */
static void boot_segment(struct kvm_segment *s, uint16_t sel, uint16_t flags)
{
	memset(s, 0, sizeof(*s));
	s->base = 0;
	s->limit = 0xffffffffu;   /* limit 0xfffff, 4 KiB granular */
	s->selector = sel;
	s->type = flags & 0xf;
	s->present = (flags >> 7) & 1;
	s->dpl = (flags >> 5) & 3;
	s->db = (flags >> 14) & 1;
	s->s = (flags >> 4) & 1;
	s->l = (flags >> 13) & 1;
	s->g = (flags >> 15) & 1;
	s->avl = (flags >> 12) & 1;
	s->unusable = !s->present;
}

void vmm_boot__sregs(const struct vmm_boot_entry *e, struct kvm_sregs *sregs)
{
	boot_segment(&sregs->cs, BOOT_CS, GDT_CODE64);
	boot_segment(&sregs->ds, BOOT_DS, GDT_DATA);
	sregs->es = sregs->fs = sregs->gs = sregs->ss = sregs->ds;
	boot_segment(&sregs->tr, BOOT_TSS, GDT_TSS);
	sregs->gdt.base = e->gdt_base;
	sregs->gdt.limit = e->gdt_limit;
	sregs->idt.base = e->idt_base;
	sregs->idt.limit = e->idt_limit;
	sregs->cr0 = (sregs->cr0 & ~(CR0_CD | CR0_NW)) | CR0_PE | CR0_ET | CR0_PG;
	sregs->cr3 = e->cr3;
	sregs->cr4 |= CR4_PAE;
	sregs->efer |= EFER_LME | EFER_LMA;
}
