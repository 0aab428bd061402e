/* kvm.c: a KVM virtual machine: the VM, its vCPU threads, I/O exits and interrupt lines. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <asm/kvm_para.h>
#include <linux/kvm.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "acpi.h"
#include "boot.h"
#include "cpuid.h"
#include "kvm.h"
#include "log.h"
#include "mem.h"

/*
 * DOC: the VM and its vCPUs
 *
 * One VM with the in-kernel irqchip (PIC, IOAPIC, a LAPIC per vCPU) and PIT, and
 * one memslot over all of guest RAM: gpa == offset into the vmm_mem mapping,
 * so KVM reaches guest pages through the same host mapping the memory plane
 * write-protects and remaps (KVM follows remaps through MMU notifiers; its
 * writes to protected pages fault into the plane's userfaultfd like a thread's).
 *
 * Each vCPU is a thread looping on KVM_RUN. Port and MMIO exits are served on
 * that thread by the handler registered for the address; the table is fixed
 * before the vCPUs start, so lookups take no lock. The guest ends through
 * vmm_kvm__end (power off, reset, a crash, or the VMM asking): the first
 * reason sticks and stop_fd wakes main(), which calls vmm_kvm__stop: it sets
 * immediate_exit in every kvm_run and sends each thread VMM_KVM_KICK_SIG, whose
 * handler does nothing but make KVM_RUN return -EINTR.
 */

#define VMM_KVM_KICK_SIG        SIGUSR2
#define VMM_KVM_TSS_GPA         0xfffbd000ull   /* 3 pages KVM needs on Intel; harmless on AMD */
#define VMM_KVM_IDMAP_GPA       0xfffbc000ull   /* one page, just below the TSS */
#define VMM_KVM_MAX_RANGES      32
#define VMM_KVM_UNKNOWN_LOGGED  32              /* unknown accesses logged at debug level */

#define LAPIC_LVT0              0x350
#define LAPIC_LVT1              0x360
#define LAPIC_MODE_NMI          4
#define LAPIC_MODE_EXTINT       7

#define I8042_DATA_PORT         0x60
#define I8042_CMD_PORT          0x64
#define I8042_CMD_RESET         0xfe
#define CMOS_PORT               0x70

/* struct kvm_io_range - one device window in port or MMIO space */
struct kvm_io_range {
	uint64_t base;          /* first port or gpa */
	uint64_t len;           /* bytes */
	vmm_io_fn fn;
	void *opaque;
};

/* struct vmm_vcpu - one vCPU and its thread */
struct vmm_vcpu {
	struct vmm_kvm *k;
	unsigned id;            /* vCPU index == APIC id */
	int fd;                 /* KVM_CREATE_VCPU */
	struct kvm_run *run;    /* shared with KVM: exit details */
	pthread_t thread;
	bool started;           /* thread exists and must be joined */
	uint64_t pv_gpa[2 * VMM_KVM_PV_MSRS]; /* first and last page of each PV area, read at park; 0 = none */
};

/* struct vmm_kvm - the VM */
struct vmm_kvm {
	int sys_fd;             /* /dev/kvm */
	int vm_fd;
	int stop_fd;            /* eventfd written when the guest ends */
	bool dirty_log;         /* guest RAM's memslot keeps a dirty log (manual protect) */
	struct vmm_mem *mem;
	size_t run_size;        /* bytes of each vCPU's kvm_run mapping */
	struct kvm_cpuid2 *cpuid; /* KVM_GET_SUPPORTED_CPUID, patched per vCPU */
	unsigned nvcpus;
	struct vmm_vcpu vcpus[VMM_KVM_VCPUS_MAX];
	struct kvm_io_range pio[VMM_KVM_MAX_RANGES];
	struct kvm_io_range mmio[VMM_KVM_MAX_RANGES];
	unsigned npio, nmmio;
	bool started;           /* ranges are frozen */
	bool stopped;           /* vCPU threads joined */
	atomic_int end;         /* enum vmm_kvm_end */
	atomic_bool stopping;   /* vCPU threads leave at their next exit */
	atomic_bool pause_req;  /* vCPU threads park outside KVM_RUN (vmm_kvm__pause) */
	pthread_mutex_t park_lock; /* protects nparked, nrunning; with park_cond */
	pthread_cond_t park_cond;
	unsigned nparked;       /* threads parked */
	unsigned nrunning;      /* threads started and not yet returned */
	atomic_uint_fast64_t unknown_pio, unknown_mmio; /* accesses nobody handles */
};

static void kvm_kick_handler(int sig)
{
	(void)sig; /* only there to interrupt KVM_RUN */
}

static int kvm_register(struct kvm_io_range *tab, unsigned *n, bool started, uint64_t base,
			uint64_t len, vmm_io_fn fn, void *opaque)
{
	if (started)
		return -EBUSY;
	if (!len || !fn || base + len < base)
		return -EINVAL;
	if (*n == VMM_KVM_MAX_RANGES)
		return -ENOSPC;
	for (unsigned i = 0; i < *n; i++)
		if (base < tab[i].base + tab[i].len && tab[i].base < base + len)
			return -EEXIST;
	tab[(*n)++] = (struct kvm_io_range){ .base = base, .len = len, .fn = fn, .opaque = opaque };
	return 0;
}

int vmm_kvm__register_mmio(struct vmm_kvm *k, uint64_t base, uint64_t len, vmm_io_fn fn,
			   void *opaque)
{
	return kvm_register(k->mmio, &k->nmmio, k->started, base, len, fn, opaque);
}

int vmm_kvm__register_pio(struct vmm_kvm *k, uint16_t port, uint16_t len, vmm_io_fn fn,
			  void *opaque)
{
	if ((uint32_t)port + len > 0x10000)
		return -EINVAL;
	return kvm_register(k->pio, &k->npio, k->started, port, len, fn, opaque);
}

int vmm_kvm__set_irq(struct vmm_kvm *k, uint32_t gsi, int level)
{
	struct kvm_irq_level irq = { .irq = gsi, .level = level ? 1 : 0 };

	if (ioctl(k->vm_fd, KVM_IRQ_LINE, &irq))
		return -errno;
	return 0;
}

void vmm_kvm__end(struct vmm_kvm *k, enum vmm_kvm_end why)
{
	int expect = VMM_KVM_RUNNING;
	uint64_t one = 1;

	if (atomic_compare_exchange_strong(&k->end, &expect, (int)why) &&
	    write(k->stop_fd, &one, sizeof(one)) != sizeof(one))
		log_err("kvm: cannot wake the main thread: %s", strerror(errno));
}

enum vmm_kvm_end vmm_kvm__ended(struct vmm_kvm *k)
{
	return (enum vmm_kvm_end)atomic_load(&k->end);
}

/* --- built-in ports: ACPI power, i8042 reset, a CMOS that reads as zero --- */

static void kvm_acpi_sleep(void *opaque, uint64_t off, uint8_t *data, uint32_t len, bool is_write)
{
	struct vmm_kvm *k = opaque;

	(void)off;
	if (!is_write) {
		memset(data, 0, len);
		return;
	}
	if ((data[0] & VMM_ACPI_SLP_EN) && VMM_ACPI_SLP_TYP(data[0]) == VMM_ACPI_S5_TYP) {
		log_info("guest: ACPI power off");
		vmm_kvm__end(k, VMM_KVM_POWEROFF);
	}
}

static void kvm_acpi_reset(void *opaque, uint64_t off, uint8_t *data, uint32_t len, bool is_write)
{
	struct vmm_kvm *k = opaque;

	(void)off;
	if (!is_write) {
		memset(data, 0, len);
		return;
	}
	if (data[0] == VMM_ACPI_RESET_VALUE) {
		log_info("guest: ACPI reset (reboot ends the VM)");
		vmm_kvm__end(k, VMM_KVM_RESET);
	}
}

/* i8042: only the CPU reset command matters; reads say "no data, input buffer empty". */
static void kvm_i8042(void *opaque, uint64_t off, uint8_t *data, uint32_t len, bool is_write)
{
	struct vmm_kvm *k = opaque;

	if (!is_write) {
		memset(data, 0, len);
		return;
	}
	if (off == I8042_CMD_PORT - I8042_DATA_PORT && data[0] == I8042_CMD_RESET) {
		log_info("guest: i8042 reset (reboot ends the VM)");
		vmm_kvm__end(k, VMM_KVM_RESET);
	}
}

/*
 * Registers that read as zero and ignore writes: the ACPI sleep status, and a CMOS
 * without RTC (zeros keep drivers from waiting on an update-in-progress bit of 0xff).
 */
static void kvm_zero_port(void *opaque, uint64_t off, uint8_t *data, uint32_t len, bool is_write)
{
	(void)opaque;
	(void)off;
	if (!is_write)
		memset(data, 0, len);
}

static int kvm_builtin_ports(struct vmm_kvm *k)
{
	int ret;

	if ((ret = vmm_kvm__register_pio(k, VMM_ACPI_SLEEP_CTL_PORT, 1, kvm_acpi_sleep, k)) ||
	    (ret = vmm_kvm__register_pio(k, VMM_ACPI_SLEEP_STS_PORT, 1, kvm_zero_port, k)) ||
	    (ret = vmm_kvm__register_pio(k, VMM_ACPI_RESET_PORT, 1, kvm_acpi_reset, k)) ||
	    (ret = vmm_kvm__register_pio(k, I8042_DATA_PORT, 5, kvm_i8042, k)) ||
	    (ret = vmm_kvm__register_pio(k, CMOS_PORT, 2, kvm_zero_port, k)))
		return ret;
	return 0;
}

/* --- exits --- */

static const struct kvm_io_range *kvm_find(const struct kvm_io_range *tab, unsigned n,
					   uint64_t addr, uint32_t len)
{
	for (unsigned i = 0; i < n; i++)
		if (addr >= tab[i].base && addr - tab[i].base + len <= tab[i].len)
			return &tab[i];
	return NULL;
}

static void kvm_unknown(atomic_uint_fast64_t *count, const char *space, uint64_t addr,
			uint32_t len, bool is_write)
{
	uint64_t n = atomic_fetch_add(count, 1);

	if (n < VMM_KVM_UNKNOWN_LOGGED)
		log_debug("kvm: unhandled %s %s at 0x%" PRIx64 " (%u bytes)%s", space,
			  is_write ? "write" : "read", addr, len,
			  n + 1 == VMM_KVM_UNKNOWN_LOGGED ? "; not logging more" : "");
}

static void kvm_exit_io(struct vmm_kvm *k, struct kvm_run *run)
{
	uint8_t *data = (uint8_t *)run + run->io.data_offset;
	bool is_write = run->io.direction == KVM_EXIT_IO_OUT;
	uint32_t size = run->io.size;
	const struct kvm_io_range *r = kvm_find(k->pio, k->npio, run->io.port, size);

	/* rep ins/outs: count items of size bytes, one after the other */
	for (uint32_t i = 0; i < run->io.count; i++, data += size) {
		if (r) {
			r->fn(r->opaque, run->io.port - r->base, data, size, is_write);
			continue;
		}
		if (!is_write)
			memset(data, 0xff, size); /* an empty ISA bus floats high */
		kvm_unknown(&k->unknown_pio, "port", run->io.port, size, is_write);
	}
}

static void kvm_exit_mmio(struct vmm_kvm *k, struct kvm_run *run)
{
	uint32_t len = run->mmio.len;
	const struct kvm_io_range *r;

	if (len > sizeof(run->mmio.data))
		len = sizeof(run->mmio.data);
	r = kvm_find(k->mmio, k->nmmio, run->mmio.phys_addr, len);
	if (r) {
		r->fn(r->opaque, run->mmio.phys_addr - r->base, run->mmio.data, len,
		      run->mmio.is_write);
		return;
	}
	if (!run->mmio.is_write)
		memset(run->mmio.data, 0, len);
	kvm_unknown(&k->unknown_mmio, "MMIO", run->mmio.phys_addr, len, run->mmio.is_write);
}

/* The guest reset itself through a triple fault: say where it was, if KVM still knows. */
static void kvm_exit_shutdown(struct vmm_vcpu *v)
{
	struct kvm_regs regs = { 0 };
	struct kvm_sregs sregs = { 0 };

	ioctl(v->fd, KVM_GET_REGS, &regs);
	ioctl(v->fd, KVM_GET_SREGS, &sregs);
	/* AMD's KVM resets the vCPU before it reports the shutdown: the state is lost. */
	if (regs.rip == 0xfff0 && sregs.cs.base == 0xffff0000ull)
		log_err("guest crashed: vCPU %u triple fault (KVM_EXIT_SHUTDOWN); registers at the "
			"fault are lost (KVM reset the vCPU, as on AMD); an exception the guest could "
			"not handle: too early for its handlers, or a broken kernel image", v->id);
	else
		log_err("guest crashed: vCPU %u triple fault (KVM_EXIT_SHUTDOWN) at rip 0x%llx, "
			"rsp 0x%llx, cr0 0x%llx, cr3 0x%llx, cr4 0x%llx, efer 0x%llx; an exception "
			"the guest could not handle: too early for its handlers, or a broken kernel "
			"image", v->id, regs.rip, regs.rsp, sregs.cr0, sregs.cr3, sregs.cr4, sregs.efer);
}

static void kvm_exit_system_event(struct vmm_vcpu *v)
{
	switch (v->run->system_event.type) {
	case KVM_SYSTEM_EVENT_SHUTDOWN:
		log_info("guest: shutdown (vCPU %u)", v->id);
		vmm_kvm__end(v->k, VMM_KVM_POWEROFF);
		break;
	case KVM_SYSTEM_EVENT_RESET:
		log_info("guest: reset (vCPU %u); reboot ends the VM", v->id);
		vmm_kvm__end(v->k, VMM_KVM_RESET);
		break;
	default:
		log_err("guest crashed: vCPU %u system event %u", v->id, v->run->system_event.type);
		vmm_kvm__end(v->k, VMM_KVM_FAILED);
		break;
	}
}

/* Serve one exit; false when this vCPU must stop. */
static bool kvm_exit(struct vmm_vcpu *v)
{
	struct kvm_run *run = v->run;

	switch (run->exit_reason) {
	case KVM_EXIT_IO:
		kvm_exit_io(v->k, run);
		return true;
	case KVM_EXIT_MMIO:
		kvm_exit_mmio(v->k, run);
		return true;
	case KVM_EXIT_INTR:
	case KVM_EXIT_HLT:   /* not seen with the in-kernel LAPIC; run again */
		return true;
	case KVM_EXIT_SHUTDOWN:
		kvm_exit_shutdown(v);
		break;
	case KVM_EXIT_SYSTEM_EVENT:
		kvm_exit_system_event(v);
		return false;
	case KVM_EXIT_FAIL_ENTRY:
		log_err("guest crashed: vCPU %u cannot enter the guest (KVM_EXIT_FAIL_ENTRY, "
			"hardware reason 0x%llx)", v->id,
			(unsigned long long)run->fail_entry.hardware_entry_failure_reason);
		break;
	case KVM_EXIT_INTERNAL_ERROR:
		log_err("guest crashed: vCPU %u KVM internal error, suberror %u", v->id,
			run->internal.suberror);
		break;
	default:
		log_err("guest crashed: vCPU %u unexpected KVM exit reason %u", v->id, run->exit_reason);
		break;
	}
	vmm_kvm__end(v->k, VMM_KVM_FAILED);
	return false;
}

/*
 * KVM's paravirtual pages. The guest hands KVM a guest address through an MSR
 * and KVM writes there itself: kvm-clock through a cached kernel mapping of
 * the page, which neither write protection nor a remap can see (the plane
 * would merge or discard bytes KVM has changed behind it, and the guest's
 * clock stops). The plane therefore keeps these pages out of dedup; it learns
 * them here, from each vCPU's MSRs read while the vCPU is parked, which is
 * exactly when the plane merges. cpuid.c hides the other paravirtual
 * features, so that the guest hands out no more such pages than its clock
 * needs.
 */
static const struct { uint32_t index; uint32_t len; } kvm_pv_msrs[VMM_KVM_PV_MSRS] = {
	{ MSR_KVM_WALL_CLOCK, 12 },      /* struct pvclock_wall_clock */
	{ MSR_KVM_SYSTEM_TIME, 32 },     /* struct pvclock_vcpu_time_info */
	{ MSR_KVM_WALL_CLOCK_NEW, 12 },
	{ MSR_KVM_SYSTEM_TIME_NEW, 32 },
	{ MSR_KVM_ASYNC_PF_EN, 64 },     /* struct kvm_vcpu_pv_apf_data */
	{ MSR_KVM_STEAL_TIME, 64 },      /* struct kvm_steal_time */
	{ MSR_KVM_PV_EOI_EN, 4 },
};
_Static_assert(2 * VMM_KVM_PV_MSRS * VMM_KVM_VCPUS_MAX <= VMM_MEM_HV_PAGES_MAX,
	       "the plane's hv_pages buffer holds every vCPU's PV pages");

static void kvm_vcpu_pv_read(struct vmm_vcpu *v)
{
	struct { struct kvm_msrs hdr; struct kvm_msr_entry e[VMM_KVM_PV_MSRS]; } m;
	int n;

	memset(&m, 0, sizeof(m));
	m.hdr.nmsrs = VMM_KVM_PV_MSRS;
	for (unsigned i = 0; i < VMM_KVM_PV_MSRS; i++)
		m.e[i].index = kvm_pv_msrs[i].index;
	/* KVM_GET_MSRS stops at the first MSR it does not know: the rest count as unset */
	n = ioctl(v->fd, KVM_GET_MSRS, &m);
	for (int i = 0; i < VMM_KVM_PV_MSRS; i++) {
		/* low bits are enable and option flags, never part of the (aligned) address */
		uint64_t gpa = i < n ? m.e[i].data & ~0x3full : 0;

		v->pv_gpa[2 * i] = gpa & ~0xfffull;
		v->pv_gpa[2 * i + 1] = gpa ? (gpa + kvm_pv_msrs[i].len - 1) & ~0xfffull : 0;
	}
}

unsigned vmm_kvm__hv_pages(void *opaque, uint64_t *gpa, unsigned max)
{
	struct vmm_kvm *k = opaque;
	unsigned n = 0;

	for (unsigned i = 0; i < k->nvcpus; i++)
		for (unsigned j = 0; j < 2 * VMM_KVM_PV_MSRS && k->vcpus[i].started; j++)
			if (k->vcpus[i].pv_gpa[j] && n < max)
				gpa[n++] = k->vcpus[i].pv_gpa[j];
	return n;
}

/* Wait outside KVM_RUN until vmm_kvm__resume or the VM stops. */
static void kvm_vcpu_park(struct vmm_vcpu *v)
{
	struct vmm_kvm *k = v->k;

	kvm_vcpu_pv_read(v); /* before counting as parked: the plane reads pv_gpa then */
	pthread_mutex_lock(&k->park_lock);
	k->nparked++;
	pthread_cond_broadcast(&k->park_cond);
	while (atomic_load(&k->pause_req) && !atomic_load(&k->stopping))
		pthread_cond_wait(&k->park_cond, &k->park_lock);
	k->nparked--;
	pthread_mutex_unlock(&k->park_lock);
}

static void *kvm_vcpu_thread(void *arg)
{
	struct vmm_vcpu *v = arg;
	struct vmm_kvm *k = v->k;
	sigset_t kick;

	sigemptyset(&kick);
	sigaddset(&kick, VMM_KVM_KICK_SIG);
	pthread_sigmask(SIG_UNBLOCK, &kick, NULL);
	while (!atomic_load(&v->k->stopping)) {
		if (atomic_load(&k->pause_req)) {
			kvm_vcpu_park(v);
			continue;
		}
		if (ioctl(v->fd, KVM_RUN, 0) < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			log_err("guest crashed: vCPU %u: KVM_RUN: %s", v->id, strerror(errno));
			vmm_kvm__end(v->k, VMM_KVM_FAILED);
			break;
		}
		if (!kvm_exit(v))
			break;
	}
	pthread_mutex_lock(&k->park_lock);
	k->nrunning--;
	pthread_cond_broadcast(&k->park_cond);
	pthread_mutex_unlock(&k->park_lock);
	return NULL;
}

/* Kick every vCPU out of KVM_RUN: immediate_exit for a thread about to enter, the signal inside. */
static void kvm_kick_all(struct vmm_kvm *k)
{
	for (unsigned i = 0; i < k->nvcpus; i++) {
		struct vmm_vcpu *v = &k->vcpus[i];

		if (!v->started)
			continue;
		__atomic_store_n(&v->run->immediate_exit, 1, __ATOMIC_SEQ_CST);
		pthread_kill(v->thread, VMM_KVM_KICK_SIG);
	}
}

void vmm_kvm__pause(void *opaque)
{
	struct vmm_kvm *k = opaque;

	atomic_store(&k->pause_req, true);
	kvm_kick_all(k);
}

bool vmm_kvm__paused(void *opaque)
{
	struct vmm_kvm *k = opaque;
	bool all;

	pthread_mutex_lock(&k->park_lock);
	all = k->nparked >= k->nrunning;
	pthread_mutex_unlock(&k->park_lock);
	return all;
}

void vmm_kvm__resume(void *opaque)
{
	struct vmm_kvm *k = opaque;

	pthread_mutex_lock(&k->park_lock);
	if (!atomic_load(&k->stopping))
		for (unsigned i = 0; i < k->nvcpus; i++)
			if (k->vcpus[i].started)
				__atomic_store_n(&k->vcpus[i].run->immediate_exit, 0, __ATOMIC_SEQ_CST);
	atomic_store(&k->pause_req, false);
	pthread_cond_broadcast(&k->park_cond);
	pthread_mutex_unlock(&k->park_lock);
}

/* --- setup --- */

/* MSRs a fresh x86 CPU would have; a failing one is noted, not fatal. */
static void kvm_vcpu_msrs(struct vmm_vcpu *v)
{
	static const struct { uint32_t index; uint64_t data; } msrs[] = {
		{ 0x174, 0 },                 /* IA32_SYSENTER_CS */
		{ 0x175, 0 },                 /* IA32_SYSENTER_ESP */
		{ 0x176, 0 },                 /* IA32_SYSENTER_EIP */
		{ 0xc0000081, 0 },            /* STAR */
		{ 0xc0000082, 0 },            /* LSTAR */
		{ 0xc0000083, 0 },            /* CSTAR */
		{ 0xc0000084, 0 },            /* SYSCALL_MASK */
		{ 0xc0000102, 0 },            /* KERNEL_GS_BASE */
		{ 0x1a0, 1 },                 /* IA32_MISC_ENABLE: fast strings */
		{ 0x2ff, (1u << 11) | 6 },    /* MTRRdefType: MTRRs on, default write-back */
	};
	struct { struct kvm_msrs hdr; struct kvm_msr_entry e[1]; } m;

	for (size_t i = 0; i < sizeof(msrs) / sizeof(msrs[0]); i++) {
		memset(&m, 0, sizeof(m));
		m.hdr.nmsrs = 1;
		m.e[0].index = msrs[i].index;
		m.e[0].data = msrs[i].data;
		if (ioctl(v->fd, KVM_SET_MSRS, &m) != 1)
			log_debug("kvm: vCPU %u: MSR 0x%x not set", v->id, msrs[i].index);
	}
}

/* LINT0 delivers the PIC's interrupts (ExtINT), LINT1 is NMI, as firmware leaves them. */
static int kvm_vcpu_lapic(struct vmm_vcpu *v)
{
	struct kvm_lapic_state lapic;
	uint32_t lvt;

	if (ioctl(v->fd, KVM_GET_LAPIC, &lapic))
		return -errno;
	memcpy(&lvt, lapic.regs + LAPIC_LVT0, 4);
	lvt = (lvt & ~0x700u) | (LAPIC_MODE_EXTINT << 8);
	memcpy(lapic.regs + LAPIC_LVT0, &lvt, 4);
	memcpy(&lvt, lapic.regs + LAPIC_LVT1, 4);
	lvt = (lvt & ~0x700u) | (LAPIC_MODE_NMI << 8);
	memcpy(lapic.regs + LAPIC_LVT1, &lvt, 4);
	if (ioctl(v->fd, KVM_SET_LAPIC, &lapic))
		return -errno;
	return 0;
}

static int kvm_vcpu_create(struct vmm_kvm *k, struct vmm_vcpu *v, unsigned id)
{
	struct kvm_fpu fpu = { .fcw = 0x37f, .mxcsr = 0x1f80 }; /* x87 and SSE reset values */
	const char *what;
	void *run;
	int ret;

	v->k = k;
	v->id = id;
	v->fd = ioctl(k->vm_fd, KVM_CREATE_VCPU, (unsigned long)id);
	if (v->fd < 0) {
		what = "KVM_CREATE_VCPU";
		goto err;
	}
	run = mmap(NULL, k->run_size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, 0);
	if (run == MAP_FAILED) {
		what = "mmap kvm_run";
		goto err;
	}
	v->run = run;
	what = "KVM_SET_CPUID2";
	if ((ret = vmm_cpuid__set(v->fd, k->cpuid, v->id, k->nvcpus)))
		goto err_ret;
	kvm_vcpu_msrs(v);
	what = "KVM_SET_LAPIC";
	if ((ret = kvm_vcpu_lapic(v)))
		goto err_ret;
	what = "KVM_SET_FPU";
	if (ioctl(v->fd, KVM_SET_FPU, &fpu))
		goto err;
	return 0;
err:
	ret = -errno;
err_ret:
	log_err("kvm: vCPU %u: %s: %s", id, what, strerror(-ret));
	return ret;
}

int vmm_kvm__dirty_get(void *opaque, uint64_t *bitmap)
{
	struct vmm_kvm *k = opaque;
	struct kvm_dirty_log log = { .slot = 0, .dirty_bitmap = bitmap };

	return ioctl(k->vm_fd, KVM_GET_DIRTY_LOG, &log) ? -errno : 0;
}

int vmm_kvm__dirty_clear(void *opaque, uint64_t first, uint64_t n, uint64_t *bits)
{
	struct vmm_kvm *k = opaque;
	struct kvm_clear_dirty_log log = { .slot = 0, .num_pages = (uint32_t)n,
					   .first_page = first, .dirty_bitmap = bits };

	if (n > UINT32_MAX)
		return -EINVAL;
	return ioctl(k->vm_fd, KVM_CLEAR_DIRTY_LOG, &log) ? -errno : 0;
}

/* VM-wide state: TSS and identity map (Intel needs them), irqchip, PIT, RAM. */
static int kvm_vm_setup(struct vmm_kvm *k)
{
	uint64_t size = vmm_mem__size(k->mem), idmap = VMM_KVM_IDMAP_GPA;
	struct kvm_pit_config pit = { .flags = 0 };
	struct kvm_userspace_memory_region slot = {
		.slot = 0, .guest_phys_addr = 0, .memory_size = size,
		.userspace_addr = (uint64_t)(uintptr_t)vmm_mem__hva(k->mem, GPA(0), size),
	};
	const char *what;
	int ret;

	what = "KVM_SET_TSS_ADDR";
	if (ioctl(k->vm_fd, KVM_SET_TSS_ADDR, (unsigned long)VMM_KVM_TSS_GPA))
		goto err;
	what = "KVM_SET_IDENTITY_MAP_ADDR";
	if (ioctl(k->vm_fd, KVM_SET_IDENTITY_MAP_ADDR, &idmap))
		goto err;
	what = "KVM_CREATE_IRQCHIP";
	if (ioctl(k->vm_fd, KVM_CREATE_IRQCHIP, 0))
		goto err;
	what = "KVM_CREATE_PIT2";
	if (ioctl(k->vm_fd, KVM_CREATE_PIT2, &pit))
		goto err;
	if (k->dirty_log) {
		/* manual protect, all set: nothing is write-protected until the plane asks */
		struct kvm_enable_cap cap = { .cap = KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
			.args = { KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE | KVM_DIRTY_LOG_INITIALLY_SET } };

		what = "KVM_ENABLE_CAP(MANUAL_DIRTY_LOG_PROTECT2)";
		if (ioctl(k->vm_fd, KVM_ENABLE_CAP, &cap))
			goto err;
		slot.flags = KVM_MEM_LOG_DIRTY_PAGES;
	}
	what = "KVM_SET_USER_MEMORY_REGION";
	errno = EFAULT;
	if (!slot.userspace_addr || ioctl(k->vm_fd, KVM_SET_USER_MEMORY_REGION, &slot))
		goto err;
	return 0;
err:
	ret = -errno;
	log_err("kvm: %s: %s", what, strerror(-ret));
	return ret;
}

static int kvm_open(struct vmm_kvm *k)
{
	int ver, ret;

	k->sys_fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (k->sys_fd < 0)
		return -errno; /* main() explains; ENOENT is the common case */
	ver = ioctl(k->sys_fd, KVM_GET_API_VERSION, 0);
	if (ver != KVM_API_VERSION) {
		log_err("kvm: /dev/kvm speaks API %d, pvisor needs %d", ver, KVM_API_VERSION);
		return -EOPNOTSUPP;
	}
	ret = ioctl(k->sys_fd, KVM_GET_VCPU_MMAP_SIZE, 0);
	if (ret < (int)sizeof(struct kvm_run)) {
		log_err("kvm: KVM_GET_VCPU_MMAP_SIZE: %s", strerror(errno));
		return -EOPNOTSUPP;
	}
	k->run_size = (size_t)ret;
	if (ioctl(k->sys_fd, KVM_CHECK_EXTENSION, KVM_CAP_IMMEDIATE_EXIT) <= 0) {
		log_err("kvm: the kernel lacks KVM_CAP_IMMEDIATE_EXIT (Linux >= 4.11 needed)");
		return -EOPNOTSUPP;
	}
	k->vm_fd = ioctl(k->sys_fd, KVM_CREATE_VM, 0);
	if (k->vm_fd < 0) {
		ret = -errno;
		log_err("kvm: KVM_CREATE_VM: %s", strerror(errno));
		return ret;
	}
	return 0;
}

int vmm_kvm__create(struct vmm_kvm **out, const struct vmm_kvm_cfg *cfg)
{
	struct sigaction sa = { .sa_handler = kvm_kick_handler }; /* no SA_RESTART */
	struct vmm_kvm *k;
	int ret;

	if (vmm_mem__size(cfg->mem) > VMM_KVM_MEM_MAX)
		return -E2BIG;
	if (!cfg->vcpus || cfg->vcpus > VMM_KVM_VCPUS_MAX)
		return -EINVAL;
	k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	k->sys_fd = k->vm_fd = -1;
	k->mem = cfg->mem;
	k->stop_fd = cfg->stop_fd;
	k->dirty_log = cfg->dirty_log;
	pthread_mutex_init(&k->park_lock, NULL);
	pthread_cond_init(&k->park_cond, NULL);
	for (unsigned i = 0; i < VMM_KVM_VCPUS_MAX; i++)
		k->vcpus[i].fd = -1;
	sigemptyset(&sa.sa_mask);
	if (sigaction(VMM_KVM_KICK_SIG, &sa, NULL)) {
		ret = -errno;
		goto err;
	}
	if ((ret = kvm_open(k)) || (ret = kvm_vm_setup(k)) || (ret = kvm_builtin_ports(k)))
		goto err;
	if ((ret = vmm_cpuid__get(k->sys_fd, &k->cpuid))) {
		log_err("kvm: KVM_GET_SUPPORTED_CPUID: %s", strerror(-ret));
		goto err;
	}
	for (k->nvcpus = 0; k->nvcpus < cfg->vcpus; k->nvcpus++) {
		ret = kvm_vcpu_create(k, &k->vcpus[k->nvcpus], k->nvcpus);
		if (ret)
			goto err;
	}
	*out = k;
	return 0;
err:
	vmm_kvm__destroy(k);
	return ret;
}

int vmm_kvm__start(struct vmm_kvm *k, const struct vmm_boot_entry *entry)
{
	struct vmm_vcpu *bsp = &k->vcpus[0];
	struct kvm_sregs sregs;
	struct kvm_regs regs;
	sigset_t kick, old;
	int ret = 0;

	if (k->started)
		return -EBUSY;
	if (ioctl(bsp->fd, KVM_GET_SREGS, &sregs))
		return -errno;
	vmm_boot__sregs(entry, &sregs);
	vmm_boot__regs(entry, &regs);
	if (ioctl(bsp->fd, KVM_SET_SREGS, &sregs) || ioctl(bsp->fd, KVM_SET_REGS, &regs)) {
		ret = -errno;
		log_err("kvm: cannot set the boot vCPU's registers: %s", strerror(errno));
		return ret;
	}
	k->started = true;
	log_debug("kvm: starting %u vCPU(s), entry 0x%llx", k->nvcpus, regs.rip);
	/* Threads start with the kick signal blocked; each unblocks it itself. */
	sigemptyset(&kick);
	sigaddset(&kick, VMM_KVM_KICK_SIG);
	pthread_sigmask(SIG_BLOCK, &kick, &old);
	for (unsigned i = 0; i < k->nvcpus; i++) {
		struct vmm_vcpu *v = &k->vcpus[i];
		char name[16];

		pthread_mutex_lock(&k->park_lock);
		k->nrunning++; /* before the thread exists: it decrements when it returns */
		pthread_mutex_unlock(&k->park_lock);
		ret = -pthread_create(&v->thread, NULL, kvm_vcpu_thread, v);
		if (ret) {
			pthread_mutex_lock(&k->park_lock);
			k->nrunning--;
			pthread_mutex_unlock(&k->park_lock);
			log_err("kvm: cannot start vCPU %u: %s", i, strerror(-ret));
			break;
		}
		v->started = true;
		snprintf(name, sizeof(name), "vcpu%u", i);
		pthread_setname_np(v->thread, name);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return ret;
}

void vmm_kvm__stop(struct vmm_kvm *k)
{
	if (!k || k->stopped)
		return;
	pthread_mutex_lock(&k->park_lock);
	atomic_store(&k->stopping, true);
	pthread_cond_broadcast(&k->park_cond);
	pthread_mutex_unlock(&k->park_lock);
	kvm_kick_all(k);
	for (unsigned i = 0; i < k->nvcpus; i++) {
		if (k->vcpus[i].started)
			pthread_join(k->vcpus[i].thread, NULL);
		k->vcpus[i].started = false;
	}
	k->stopped = true;
	if (atomic_load(&k->unknown_pio) || atomic_load(&k->unknown_mmio))
		log_debug("kvm: unhandled accesses: %" PRIuFAST64 " port, %" PRIuFAST64 " MMIO",
			  atomic_load(&k->unknown_pio), atomic_load(&k->unknown_mmio));
}

void vmm_kvm__destroy(struct vmm_kvm *k)
{
	if (!k)
		return;
	vmm_kvm__stop(k);
	for (unsigned i = 0; i < VMM_KVM_VCPUS_MAX; i++) {
		struct vmm_vcpu *v = &k->vcpus[i];

		if (v->run)
			munmap(v->run, k->run_size);
		if (v->fd >= 0)
			close(v->fd);
	}
	free(k->cpuid);
	if (k->vm_fd >= 0)
		close(k->vm_fd);
	if (k->sys_fd >= 0)
		close(k->sys_fd);
	pthread_cond_destroy(&k->park_cond);
	pthread_mutex_destroy(&k->park_lock);
	free(k);
}
