/* t-acpi.c: ACPI tables: checksums, the RSDP->XSDT->FADT/MADT->DSDT chain, bounds, and iasl's reading. */
/*
 * Builds the tables for (1 vCPU, no devices), (4 vCPUs, 2 virtio-mmio) and
 * (2 vCPUs, 200 virtio-mmio + COM1, which needs 3-byte AML package lengths),
 * walks them the way a guest does, shows that the walker catches a corrupted
 * checksum, checks -ENOSPC/-EINVAL, and, if iasl (acpica-tools) is installed,
 * disassembles every table and looks for what Linux needs in the text.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "acpi.h"

static int failures;
static bool quiet;   /* the corruption test expects the walker to complain */
#define complain(...) do { if (!quiet) fprintf(stderr, __VA_ARGS__); } while (0)
#define T_CHECK(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

#define BASE VMM_ACPI_TABLES_GPA
#define MAXB VMM_ACPI_TABLES_MAX

/* struct tables - where the walker found each table (offsets into the buffer) */
struct tables {
	size_t xsdt, fadt, madt, dsdt;
	unsigned lapics, ioapics, entries;
};

static uint64_t le(const uint8_t *p, unsigned n)
{
	uint64_t v = 0;

	while (n--)
		v = (v << 8) | p[n];
	return v;
}

static uint8_t sum(const uint8_t *p, size_t n)
{
	uint8_t s = 0;

	while (n--)
		s += *p++;
	return s;
}

/* Offset of the table at guest address gpa, or 0 with a message if it is bad. */
static size_t table_at(const uint8_t *b, size_t used, uint64_t gpa, const char *sig)
{
	size_t off, len;

	if (gpa < BASE || gpa - BASE + 36 > used) {
		complain("%s: address 0x%llx outside the tables\n", sig, (unsigned long long)gpa);
		return 0;
	}
	off = gpa - BASE;
	len = le(b + off + 4, 4);
	if (memcmp(b + off, sig, 4) || len < 36 || off + len > used) {
		complain("%s: bad signature or length %zu at +0x%zx\n", sig, len, off);
		return 0;
	}
	if (sum(b + off, len)) {
		complain("%s: checksum wrong\n", sig);
		return 0;
	}
	return off;
}

/* Walk RSDP -> XSDT -> FADT -> DSDT and XSDT -> MADT; 0 if every table is sound. */
static int walk(const uint8_t *b, size_t used, struct tables *t)
{
	size_t n;

	memset(t, 0, sizeof(*t));
	if (used < 36 || memcmp(b, "RSD PTR ", 8) || b[15] != 2 || le(b + 20, 4) != 36) {
		complain("RSDP: bad signature, revision or length\n");
		return -1;
	}
	if (sum(b, 20) || sum(b, 36)) {
		complain("RSDP: checksum or extended checksum wrong\n");
		return -1;
	}
	t->xsdt = table_at(b, used, le(b + 24, 8), "XSDT");
	if (!t->xsdt)
		return -1;
	n = (le(b + t->xsdt + 4, 4) - 36) / 8;
	t->entries = (unsigned)n;
	for (size_t i = 0; i < n; i++) {
		uint64_t gpa = le(b + t->xsdt + 36 + 8 * i, 8);

		const uint8_t *sig = gpa >= BASE && gpa - BASE + 4 <= used ? b + gpa - BASE : NULL;

		if (sig && !memcmp(sig, "FACP", 4)) {
			t->fadt = table_at(b, used, gpa, "FACP");
		} else if (sig && !memcmp(sig, "APIC", 4)) {
			t->madt = table_at(b, used, gpa, "APIC");
		} else {
			complain("XSDT entry %zu: unknown table\n", i);
			return -1;
		}
	}
	if (!t->fadt || !t->madt)
		return -1;
	t->dsdt = table_at(b, used, le(b + t->fadt + 140, 8), "DSDT");
	if (!t->dsdt)
		return -1;
	for (size_t p = t->madt + 44; p < t->madt + le(b + t->madt + 4, 4); p += b[p + 1]) {
		if (b[p + 1] < 2) {
			complain("MADT: zero-length entry\n");
			return -1;
		}
		t->lapics += b[p] == 0;
		t->ioapics += b[p] == 1;
	}
	return 0;
}

static unsigned count(const uint8_t *hay, size_t n, const char *needle)
{
	size_t k = strlen(needle);
	unsigned c = 0;

	for (size_t i = 0; i + k <= n; i++)
		c += !memcmp(hay + i, needle, k);
	return c;
}

static int build(uint8_t *b, size_t max, unsigned vcpus, unsigned ndev, bool com1,
		 struct vmm_acpi_mmio *devs, size_t *used)
{
	struct vmm_acpi_cfg cfg = { .vcpus = vcpus, .virtio = devs, .nvirtio = ndev, .com1 = com1 };

	for (unsigned i = 0; i < ndev; i++)
		devs[i] = (struct vmm_acpi_mmio){ 0xd0000000ull + i * 0x1000, 0x200, 5 + i % 19 };
	return vmm_acpi__build(b, BASE, max, &cfg, used);
}

/* One configuration: build, walk, check the fields Linux relies on; false if unwalkable. */
static bool check_config(uint8_t *b, unsigned vcpus, unsigned ndev, bool com1, size_t *used,
			 struct tables *t)
{
	static struct vmm_acpi_mmio devs[256];
	const uint8_t *f;

	if (build(b, MAXB, vcpus, ndev, com1, devs, used) != 0 || *used > MAXB ||
	    walk(b, *used, t) != 0) {
		fprintf(stderr, "tables for %u vCPUs, %u devices: not built or not walkable\n",
			vcpus, ndev);
		failures++;
		return false;
	}
	T_CHECK(t->entries == 2);
	T_CHECK(t->lapics == vcpus && t->ioapics == 1);
	f = b + t->fadt;
	T_CHECK(f[8] == 6 && le(f + 4, 4) == 276);
	T_CHECK(le(f + 112, 4) & (1u << 20));                      /* HW_REDUCED_ACPI */
	T_CHECK(le(f + 112, 4) & (1u << 10));                      /* RESET_REG_SUP */
	T_CHECK(f[116] == 1 && f[117] == 8 && le(f + 120, 8) == VMM_ACPI_RESET_PORT);
	T_CHECK(f[128] == VMM_ACPI_RESET_VALUE);
	T_CHECK(f[244] == 1 && f[245] == 8 && le(f + 248, 8) == VMM_ACPI_SLEEP_CTL_PORT);
	T_CHECK(f[256] == 1 && f[257] == 8 && le(f + 260, 8) == VMM_ACPI_SLEEP_STS_PORT);
	T_CHECK(!memcmp(f + 268, "PVISOR", 6));
	T_CHECK(le(b + t->madt + 36, 4) == VMM_ACPI_LAPIC_ADDR);
	T_CHECK(count(b + t->dsdt, le(b + t->dsdt + 4, 4), "LNRO0005") == ndev);
	T_CHECK(count(b + t->dsdt, le(b + t->dsdt + 4, 4), "_S5_") == 1);
	T_CHECK(count(b + t->dsdt, le(b + t->dsdt + 4, 4), "COM1") == com1);
	return true;
}

/* Every too-small buffer fails with -ENOSPC and writes nothing past its end. */
static void check_nospc(size_t need)
{
	static struct vmm_acpi_mmio devs[2];
	static uint8_t b[MAXB + 64];
	size_t used = 0;

	for (size_t max = 0; max < need; max += (max < 64 ? 1 : 7)) {
		memset(b, 0xa5, max + 64);
		T_CHECK(build(b, max, 4, 2, true, devs, &used) == -ENOSPC);
		T_CHECK(count(b + max, 64, "\xa5") == 64);
	}
	T_CHECK(build(b, need, 4, 2, true, devs, &used) == 0 && used == need);
}

static void check_einval(uint8_t *b)
{
	struct vmm_acpi_mmio d = { 0xd0000000ull, 0x200, 24 };
	struct vmm_acpi_cfg cfg = { .vcpus = 0 };
	size_t used;

	T_CHECK(vmm_acpi__build(b, BASE, MAXB, &cfg, &used) == -EINVAL);
	cfg = (struct vmm_acpi_cfg){ .vcpus = 255 };
	T_CHECK(vmm_acpi__build(b, BASE, MAXB, &cfg, &used) == -EINVAL);
	cfg = (struct vmm_acpi_cfg){ .vcpus = 1, .virtio = &d, .nvirtio = 1 };
	T_CHECK(vmm_acpi__build(b, BASE, MAXB, &cfg, &used) == -EINVAL);   /* GSI 24 */
	d = (struct vmm_acpi_mmio){ 0xfffff000ull, 0x2000, 5 };
	T_CHECK(vmm_acpi__build(b, BASE, MAXB, &cfg, &used) == -EINVAL);   /* past 4 GiB */
	cfg.virtio = NULL;
	T_CHECK(vmm_acpi__build(b, BASE, MAXB, &cfg, &used) == -EINVAL);
	cfg = (struct vmm_acpi_cfg){ .vcpus = 1 };
	T_CHECK(vmm_acpi__build(b, BASE + 4, MAXB, &cfg, &used) == -EINVAL); /* unaligned RSDP */
}

/* The whole of a text file, NUL-terminated (malloc'd), or NULL. */
static char *read_text(const char *path)
{
	char *text = NULL;
	FILE *f = fopen(path, "rb");
	long sz;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (sz = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (text = calloc(1, (size_t)sz + 1)) && fread(text, 1, (size_t)sz, f) != (size_t)sz) {
		free(text);
		text = NULL;
	}
	fclose(f);
	return text;
}

/* Run a shell command in dir with its output to dir/log; the output (malloc'd) or NULL. */
static char *run_in(const char *dir, const char *what, const char *log)
{
	char cmd[1200], path[512];

	snprintf(cmd, sizeof(cmd), "cd '%s' && %s > '%s' 2>&1", dir, what, log);
	if (system(cmd) != 0) {
		fprintf(stderr, "'%s' failed; see %s/%s\n", what, dir, log);
		return NULL;
	}
	snprintf(path, sizeof(path), "%s/%s", dir, log);
	return read_text(path);
}

/* Write one table to dir/name.dat, disassemble it, return the .dsl text (malloc'd). */
static char *iasl_table(const char *dir, const char *name, const uint8_t *t)
{
	char path[512], cmd[256];
	size_t len = le(t + 4, 4);
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s.dat", dir, name);
	f = fopen(path, "wb");
	if (!f || fwrite(t, 1, len, f) != len || fclose(f))
		return NULL;
	snprintf(cmd, sizeof(cmd), "iasl -d '%s.dat'", name);
	free(run_in(dir, cmd, "iasl.log"));
	snprintf(path, sizeof(path), "%s/%s.dsl", dir, name);
	return read_text(path);
}

static unsigned count_str(const char *text, const char *needle)
{
	return text ? count((const uint8_t *)text, strlen(text), needle) : 0;
}

/* Disassemble each table of one configuration and look for what Linux reads. */
static void check_iasl(const char *dir, const uint8_t *b, const struct tables *t,
		       unsigned vcpus, unsigned ndev, bool com1)
{
	char *dsdt = iasl_table(dir, "dsdt", b + t->dsdt);
	char *fadt = iasl_table(dir, "facp", b + t->fadt);
	char *madt = iasl_table(dir, "apic", b + t->madt);
	char *xsdt = iasl_table(dir, "xsdt", b + t->xsdt);
	uint8_t bad[44 + 12 + 8 * 254];
	char want[64];

	T_CHECK(dsdt && fadt && madt && xsdt);
	T_CHECK(count_str(dsdt, "\"LNRO0005\"") == ndev);
	T_CHECK(count_str(dsdt, "Name (\\_S5, Package (0x04)") == 1);
	T_CHECK(count_str(dsdt, "Memory32Fixed (ReadWrite,") == ndev);
	T_CHECK(count_str(dsdt, "Interrupt (ResourceConsumer, Level, ActiveHigh, Exclusive, ,, )") == ndev);
	if (ndev) {
		T_CHECK(count_str(dsdt, "0xD0000000,         // Address Base") == 1);
		snprintf(want, sizeof(want), "0x%08X,         // Address Base", 0xd0000000u + (ndev - 1) * 0x1000);
		T_CHECK(count_str(dsdt, want) == 1);
		T_CHECK(count_str(dsdt, "0x00000005,") == (ndev + 18) / 19);
	}
	T_CHECK(count_str(dsdt, "EisaId (\"PNP0501\")") == com1);
	T_CHECK(count_str(fadt, "Hardware Reduced (V5) : 1") == 1);
	T_CHECK(count_str(fadt, "Reset Register Supported (V2) : 1") == 1);
	T_CHECK(count_str(fadt, "0000000000000600") == 1);       /* sleep control */
	T_CHECK(count_str(fadt, "0000000000000601") == 1);       /* sleep status */
	T_CHECK(count_str(fadt, "0000000000000602") == 1);       /* reset register */
	T_CHECK(count_str(madt, "[Processor Local APIC]") == vcpus);
	T_CHECK(count_str(madt, "[I/O APIC]") == 1);
	T_CHECK(count_str(madt, "FEC00000") == 1);
	/* iasl flags a bad checksum or length in a comment and a parse problem as an error */
	T_CHECK(!count_str(dsdt, "Incorrect") && !count_str(fadt, "Incorrect") &&
		!count_str(madt, "Incorrect") && !count_str(xsdt, "Incorrect"));
	T_CHECK(!count_str(dsdt, "Error") && !count_str(dsdt, "Unknown"));
	free(dsdt);
	/* ACPICA's interpreter (Linux's) loads FADT+DSDT+MADT and evaluates what Linux reads */
	if (ndev) {
		dsdt = run_in(dir, "acpiexec -b 'evaluate \\_S5_; evaluate \\_SB.VR01._CRS' "
			      "facp.dat dsdt.dat apic.dat", "acpiexec.log");
		T_CHECK(count_str(dsdt, "[Package] Contains 4 Elements:") == 1);
		T_CHECK(count_str(dsdt, "86 09 00 01 00 10 00 D0 00 02 00 00 89 06 00 01") == 1);
		T_CHECK(count_str(dsdt, "Exception") == 0 && count_str(dsdt, "Error") == 0);
		free(dsdt);
	}
	/* and iasl's own checksum check is live: it reports a corrupted copy */
	memcpy(bad, b + t->madt, le(b + t->madt + 4, 4));
	bad[9] ^= 0x40;
	dsdt = iasl_table(dir, "bad", bad);
	T_CHECK(count_str(dsdt, "Incorrect checksum") == 1);
	free(dsdt);
	free(fadt);
	free(madt);
	free(xsdt);
}

/* Flip each byte of each table in turn: the walk must fail every time. */
static void check_corruption(uint8_t *b, size_t used, const struct tables *good)
{
	const size_t at[] = { 0, good->xsdt, good->fadt, good->madt, good->dsdt };
	struct tables t;
	unsigned missed = 0;

	quiet = true;

	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
		size_t len = i ? le(b + at[i] + 4, 4) : 36;

		for (size_t off = at[i]; off < at[i] + len; off++) {
			b[off] ^= 0x40;
			missed += walk(b, used, &t) == 0;
			b[off] ^= 0x40;
		}
	}
	quiet = false;
	T_CHECK(missed == 0);
	T_CHECK(walk(b, used, &t) == 0);
}

/* Make a temp dir for iasl, or explain why that part is skipped. */
static bool iasl_dir(char *dir, size_t n)
{
	if (system("command -v iasl >/dev/null 2>&1") != 0) {
		printf("t-acpi: iasl not installed (Debian: apt-get install acpica-tools); "
		       "skipping the disassembly checks\n");
		return false;
	}
	snprintf(dir, n, "/tmp/t-acpi.XXXXXX");
	return mkdtemp(dir) != NULL;
}

int main(void)
{
	static uint8_t b[MAXB];
	static const struct { unsigned vcpus, ndev; bool com1; } cfgs[] = {
		{ 1, 0, false }, { 4, 2, false }, { 2, 200, true },
	};
	char dir[64], cmd[128];
	bool iasl = iasl_dir(dir, sizeof(dir));
	struct tables t;
	size_t used, need = 0;

	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		if (!check_config(b, cfgs[i].vcpus, cfgs[i].ndev, cfgs[i].com1, &used, &t))
			continue;
		printf("t-acpi: %u vCPUs, %u virtio%s: %zu bytes, DSDT %zu bytes at +0x%zx\n",
		       cfgs[i].vcpus, cfgs[i].ndev, cfgs[i].com1 ? ", COM1" : "", used,
		       (size_t)le(b + t.dsdt + 4, 4), t.dsdt);
		if (iasl)
			check_iasl(dir, b, &t, cfgs[i].vcpus, cfgs[i].ndev, cfgs[i].com1);
	}

	/* the walker is shown to work: any flipped byte inside any table is caught */
	if (check_config(b, 4, 2, false, &used, &t))
		check_corruption(b, used, &t);

	struct vmm_acpi_mmio devs[2];
	T_CHECK(build(b, MAXB, 4, 2, true, devs, &need) == 0);
	check_nospc(need);
	check_einval(b);
	if (iasl && !failures) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		T_CHECK(system(cmd) == 0);
	} else if (iasl) {
		fprintf(stderr, "t-acpi: iasl output kept in %s\n", dir);
	}
	return failures ? 1 : 0;
}
