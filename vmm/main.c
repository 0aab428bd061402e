/* main.c: the pvisor command line: `pvisor run` starts a VM, `pvisor ctl` talks to one. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/un.h>
#include <unistd.h>

#include "acpi.h"
#include "api.h"
#include "blk.h"
#include "boot.h"
#include "config.h"
#include "ctl.h"
#include "kvm.h"
#include "log.h"
#include "mem.h"
#include "proto.h"
#include "serial.h"
#include "synth.h"
#include "workload.h"

#define VMM_SUN_PATH_MAX sizeof(((struct sockaddr_un *)0)->sun_path)

/*
 * The kernel command line every KVM guest starts with (--cmdline is appended):
 *  console=ttyS0   the 16550A at 0x3f8 (vmm/serial.c) is the console;
 *  reboot=acpi     reboot through the FADT reset register, which ends the VM;
 *  panic=-1        a panic reboots at once instead of hanging, so the VM ends;
 *  pci=off         there is no PCI bus: skip probing config space port by port;
 *  8250.nr_uarts=1 only COM1 exists: skip probing the other 3 legacy ports.
 * No i8042 options are needed: the FADT says there is no 8042, so Linux skips it.
 */
#define VMM_KVM_CMDLINE "console=ttyS0 reboot=acpi panic=-1 pci=off 8250.nr_uarts=1"

/* virtio-mmio windows (0x200 bytes each) and their IOAPIC inputs, as in the DSDT */
#define VMM_VIRTIO_MMIO_BASE 0xd0000000ull
#define VMM_VIRTIO_MMIO_STEP 0x1000ull
#define VMM_VIRTIO_MMIO_SIZE 0x200u
#define VMM_VIRTIO_GSI_BASE  5u

enum vmm_guest { VMM_GUEST_KVM, VMM_GUEST_SYNTHETIC };

/* struct vmm_opts - every setting of `pvisor run`, filled from vmm_keys */
struct vmm_opts {
	char config[PATH_MAX];          /* --config: file read before the flags */
	uint64_t mem;                   /* guest RAM bytes */
	uint64_t vcpus;                 /* vCPU threads (synthetic: share the start-up fill) */
	int guest;                      /* enum vmm_guest */
	char kernel[PATH_MAX];          /* KVM: bzImage */
	char initrd[PATH_MAX];          /* KVM: initrd, empty for none */
	char cmdline[1024];             /* KVM: appended to VMM_KVM_CMDLINE */
	char disk[PATH_MAX + 3];        /* KVM: virtio-blk image, PATH or PATH,ro */
	int dedup;                      /* enum vmm_dedup_mode */
	char pool[VMM_SUN_PATH_MAX];    /* pool control socket */
	char domain[PROTO_DOMAIN_MAX];  /* sharing domain */
	char name[PROTO_DOMAIN_MAX];    /* VM name; empty means vm-<pid> */
	char api_sock[VMM_SUN_PATH_MAX];/* API socket path; empty means none */
	uint64_t dedup_cpu;             /* dedup thread CPU cap, percent of one core */
	int workload;                   /* enum wl_kind, or VMM_WL_NONE */
	uint64_t data_size;             /* bytes of the workload region from gpa 0 */
	uint64_t seed;                  /* workload seed */
	uint64_t instance;              /* per-instance seed (unique-random) */
	int log_level;                  /* enum log_level */
};

static const char *const vmm_guest_names[] = { "kvm", "synthetic", NULL };
static const char *const vmm_dedup_names[] = { "physical", "ksm", "off", NULL };
/* wl_names in enum wl_kind order, then "none" at VMM_WL_NONE. */
static const char *const vmm_workload_names[] = { "repeated", "shared-random", "unique-random",
						  "zeros", "patterns", "none", NULL };
_Static_assert(WL_COUNT == 5 && VMM_WL_NONE == 5, "vmm_workload_names must follow enum wl_kind");

#define O(f) offsetof(struct vmm_opts, f)
#define L(f) sizeof(((struct vmm_opts *)0)->f)

static const struct conf_key vmm_keys[] = {
	{ "config", CONF_STR, O(config), L(config), NULL, NULL, 0, 0,
	  "read settings from FILE (key = value lines; flags win)", true },
	{ "mem", CONF_SIZE, O(mem), 0, "256M", NULL, 1ull << 20, PROTO_MAX_GUEST_PAGES << PROTO_PAGE_SHIFT,
	  "guest RAM size, a multiple of 4 KiB (kvm: 2M..3G)", false },
	{ "vcpus", CONF_UINT, O(vcpus), 0, "1", NULL, 1, 64, "number of vCPUs", false },
	{ "guest", CONF_ENUM, O(guest), 0, "kvm", vmm_guest_names, 0, 0,
	  "kvm: a KVM guest; synthetic: VMM threads drive guest RAM instead of a vCPU "
	  "(for benchmarks and tests of the memory plane)", false },
	{ "kernel", CONF_STR, O(kernel), L(kernel), NULL, NULL, 0, 0,
	  "guest kernel, a 64-bit x86 Linux bzImage (kvm: required)", false },
	{ "initrd", CONF_STR, O(initrd), L(initrd), NULL, NULL, 0, 0,
	  "guest initrd or initramfs, loaded at the top of guest RAM (kvm; default: none)", false },
	{ "cmdline", CONF_STR, O(cmdline), L(cmdline), NULL, NULL, 0, 0,
	  "appended to the guest kernel command line \"" VMM_KVM_CMDLINE "\" (kvm)", false },
	{ "disk", CONF_STR, O(disk), L(disk), NULL, NULL, 0, 0,
	  "PATH or PATH,ro: a virtio-blk disk backed by a file or block device (kvm; default: none)",
	  false },
	{ "dedup", CONF_ENUM, O(dedup), 0, "physical", vmm_dedup_names, 0, 0,
	  "page sharing: through pvisor-pool, through Linux KSM, or none", false },
	{ "pool", CONF_STR, O(pool), L(pool), "/run/pvisor/pool.sock", NULL, 0, 0,
	  "pvisor-pool control socket (--dedup physical)", false },
	{ "domain", CONF_STR, O(domain), L(domain), "default", NULL, 0, 0,
	  "sharing domain: pages are shared only inside it ([A-Za-z0-9_.-])", false },
	{ "name", CONF_STR, O(name), L(name), NULL, NULL, 0, 0,
	  "VM name in stats (default: vm-<pid>)", false },
	{ "api-sock", CONF_STR, O(api_sock), L(api_sock), NULL, NULL, 0, 0,
	  "Unix socket for `pvisor ctl` (default: none)", false },
	{ "dedup-cpu", CONF_UINT, O(dedup_cpu), 0, "50", NULL, 1, 100,
	  "CPU cap of the dedup thread, percent of one core", false },
	{ "workload", CONF_ENUM, O(workload), 0, "none", vmm_workload_names, 0, 0,
	  "what the synthetic guest writes at start", false },
	{ "data-size", CONF_SIZE, O(data_size), 0, "64M", NULL, 4096, 0,
	  "size of the workload region from guest address 0; must fit in --mem", false },
	{ "seed", CONF_UINT, O(seed), 0, "1", NULL, 0, 0, "workload seed", false },
	{ "instance", CONF_UINT, O(instance), 0, "0", NULL, 0, 0,
	  "per-instance seed (unique-random differs per instance)", false },
	{ "log-level", CONF_LEVEL, O(log_level), 0, "info", NULL, 0, 0, "most verbose messages printed", false },
	CONF_END
};

#undef O
#undef L

static void vmm_usage(FILE *out)
{
	fprintf(out, "usage: pvisor run [--FLAG VALUE]...     start a VM\n"
		     "       pvisor ctl --api-sock PATH COMMAND [ARGS...]   talk to a running VM\n"
		     "       pvisor --help | run --help | ctl --help | --version\n\n"
		     "pvisor is a KVM VMM whose guest RAM is deduplicated with other VMs through\n"
		     "pvisor-pool (or KSM). `--guest synthetic` drives guest RAM from VMM threads\n"
		     "instead of a vCPU; it exists for benchmarks and tests of the memory plane.\n");
}

static void vmm_run_usage(void)
{
	printf("usage: pvisor run [--FLAG VALUE]...\n"
	       "Start a VM. Every flag is also a `key = value` line for --config FILE; flags win.\n"
	       "--guest synthetic drives guest RAM from VMM threads instead of a vCPU: it\n"
	       "writes --workload into [0, --data-size), verifies it, then serves the API\n"
	       "socket. It exists for benchmarks and tests of the memory plane.\n"
	       "SIZE takes K, M, G or T suffixes (powers of 1024).\n\n");
	conf_usage(vmm_keys, stdout);
}

static bool vmm_domain_ok(const char *d)
{
	if (!*d)
		return false;
	for (; *d; d++)
		if (!((*d >= 'a' && *d <= 'z') || (*d >= 'A' && *d <= 'Z') ||
		      (*d >= '0' && *d <= '9') || strchr("_.-", *d)))
			return false;
	return true;
}

/* Checks that span keys, or that the table cannot express. Dies with status 2. */
static void vmm_opts_check(struct vmm_opts *o)
{
	if (o->mem % PROTO_PAGE_SIZE)
		log_die(2, "--mem: %" PRIu64 " bytes is not a multiple of 4 KiB", o->mem);
	if (o->data_size % PROTO_PAGE_SIZE)
		log_die(2, "--data-size: %" PRIu64 " bytes is not a multiple of 4 KiB", o->data_size);
	if (o->workload != VMM_WL_NONE && o->data_size > o->mem)
		log_die(2, "--data-size: %" PRIu64 " bytes do not fit in --mem (%" PRIu64 " bytes)",
			o->data_size, o->mem);
	if (!vmm_domain_ok(o->domain))
		log_die(2, "--domain: '%s' must be 1..%d characters of A-Z a-z 0-9 _ . -", o->domain,
			PROTO_DOMAIN_MAX - 1);
	for (const char *c = o->name; *c; c++)
		if (*c <= ' ' || *c > '~')
			log_die(2, "--name: '%s' must be printable characters without spaces", o->name);
	if (!*o->name)
		snprintf(o->name, sizeof(o->name), "vm-%d", (int)getpid());
	if (o->dedup == VMM_DEDUP_PHYSICAL && !*o->pool)
		log_die(2, "--pool: a socket path is needed with --dedup physical");
	if (o->guest == VMM_GUEST_SYNTHETIC && (*o->kernel || *o->initrd || *o->cmdline || *o->disk))
		log_die(2, "--kernel, --initrd, --cmdline and --disk need --guest kvm "
			"(a synthetic guest runs no software)");
}

/* Settings: defaults, then --config FILE, then the flags. Dies with status 2. */
static void vmm_opts_load(struct vmm_opts *o, int argc, char **argv)
{
	char err[1024];
	int idx = 1;

	if (conf_load_all(vmm_keys, o, argc, argv, &idx, err, sizeof(err)))
		log_die(2, "%s", err);
	if (idx < argc)
		log_die(2, "unexpected argument '%s' (flags are --key value; see pvisor run --help)",
			argv[idx]);
	vmm_opts_check(o);
}

static void vmm_log_stats(struct vmm_mem *mem)
{
	struct vmm_mem_stats st = { 0 };

	vmm_mem__stats(mem, &st);
	log_info("exit: pages %" PRIu64 ": private %" PRIu64 ", shared %" PRIu64 ", zero %" PRIu64
		 "; saved %.1f MiB; merges %" PRIu64 " (refused %" PRIu64 ", cow breaks %" PRIu64 ")",
		 st.pages, st.pages_private, st.pages_shared, st.pages_zero,
		 (double)st.bytes_saved / (1 << 20), st.merges, st.merge_fail, st.cow_breaks);
	log_info("exit: time to merge avg %.3f ms, last %.3f ms; dedup CPU %.3f s; "
		 "pages hashed %" PRIu64 "; pool %s",
		 st.merge_ns_avg / 1e6, st.merge_ns_last / 1e6, st.dedup_cpu_ns / 1e9,
		 st.pages_hashed, st.pool_connected ? "connected" : "not connected");
}

/* struct vmm_vm - everything a running VM holds, torn down in reverse */
struct vmm_vm {
	struct vmm_mem *mem;
	struct vmm_synth *synth;        /* --guest synthetic */
	struct vmm_kvm *kvm;            /* --guest kvm */
	struct vmm_serial *serial;      /* kvm: COM1 */
	struct vmm_blk *blk;            /* kvm: --disk */
	struct vmm_api *api;
	int sig_fd;                     /* signalfd for SIGTERM and SIGINT */
	int stop_fd;                    /* eventfd: quit, a failed or finished guest */
};

/* Sleep until SIGTERM/SIGINT or a quit; true when a signal ended it. */
static bool vmm_wait(struct vmm_vm *vm)
{
	struct pollfd p[2] = { { .fd = vm->sig_fd, .events = POLLIN },
			       { .fd = vm->stop_fd, .events = POLLIN } };

	while (poll(p, 2, -1) < 0)
		if (errno != EINTR)
			log_die(1, "poll: %s", strerror(errno));
	if (p[0].revents) {
		struct signalfd_siginfo si;

		if (read(vm->sig_fd, &si, sizeof(si)) == sizeof(si))
			log_info("%s: stopping", strsignal((int)si.ssi_signo));
		return true;
	}
	return false;
}

/* Block SIGTERM/SIGINT before any thread exists so that only the signalfd sees them. */
static void vmm_signals(struct vmm_vm *vm)
{
	sigset_t sigs;

	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	vm->sig_fd = signalfd(-1, &sigs, SFD_CLOEXEC);
	vm->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (vm->sig_fd < 0 || vm->stop_fd < 0)
		log_die(1, "signalfd/eventfd: %s", strerror(errno));
}

static int vmm_run_synthetic(struct vmm_opts *o)
{
	struct vmm_mem_cfg mcfg = { .size = o->mem, .dedup = o->dedup, .pool_path = o->pool,
				    .domain = o->domain, .name = o->name,
				    .cpu_pct = (unsigned)o->dedup_cpu };
	struct vmm_synth_cfg scfg = { .workload = o->workload, .seed = o->seed,
				      .instance = o->instance, .vcpus = (unsigned)o->vcpus };
	const char *wl = vmm_workload_names[o->workload];
	struct vmm_vm vm = { .sig_fd = -1, .stop_fd = -1 };
	int ret, status;

	log_info("guest: synthetic: VMM threads drive guest RAM instead of a vCPU "
		 "(for benchmarks and tests of the memory plane)");
	log_info("%s: %" PRIu64 " MiB, %" PRIu64 " vCPU(s), dedup %s, domain %s, workload %s",
		 o->name, o->mem >> 20, o->vcpus, vmm_dedup_names[o->dedup], o->domain, wl);
	vmm_signals(&vm);
	scfg.stop_fd = vm.stop_fd;
	scfg.data_pages = o->workload == VMM_WL_NONE ? 0 : o->data_size >> PROTO_PAGE_SHIFT;

	ret = vmm_mem__create(&vm.mem, &mcfg);
	if (ret)
		log_die(1, "cannot create %" PRIu64 " MiB of guest RAM: %s", o->mem >> 20, strerror(-ret));
	ret = vmm_mem__start(vm.mem);
	if (ret) {
		log_err("cannot start the memory plane (--dedup %s): %s", vmm_dedup_names[o->dedup],
			strerror(-ret));
		goto err_mem;
	}
	ret = vmm_synth__start(&vm.synth, vm.mem, &scfg);
	if (ret) {
		log_err("cannot start the synthetic guest: %s", strerror(-ret));
		goto err_mem;
	}
	if (*o->api_sock) {
		struct vmm_api_cfg acfg = { .path = o->api_sock, .mem = vm.mem, .synth = vm.synth,
					    .name = o->name, .workload = wl, .instance = o->instance,
					    .data_pages = scfg.data_pages, .quit_fd = vm.stop_fd };

		ret = vmm_api__start(&vm.api, &acfg);
		if (ret) {
			log_err("--api-sock %s: %s", o->api_sock, ret == -EADDRINUSE ?
				"another process is listening on it" : strerror(-ret));
			goto err_synth;
		}
		log_info("api: listening on %s", o->api_sock);
	}

	vmm_wait(&vm);
	status = vmm_synth__failed(vm.synth) ? 1 : 0;
	/* Interrupt the guest first so the API thread is not stuck in a long command. */
	vmm_synth__interrupt(vm.synth);
	vmm_api__stop(vm.api);
	vmm_synth__stop(vm.synth);
	vmm_log_stats(vm.mem);
	vmm_mem__destroy(vm.mem);
	close(vm.stop_fd);
	close(vm.sig_fd);
	return status;

err_synth:
	vmm_synth__stop(vm.synth);
err_mem:
	vmm_mem__destroy(vm.mem);
	close(vm.stop_fd);
	close(vm.sig_fd);
	return 1;
}

/* --disk PATH[,ro]: split off ",ro". */
static const char *vmm_disk_path(struct vmm_opts *o, bool *read_only)
{
	size_t n = strlen(o->disk);

	*read_only = n > 3 && !strcmp(o->disk + n - 3, ",ro");
	if (*read_only)
		o->disk[n - 3] = '\0';
	return o->disk;
}

/* Everything a user can get wrong is reported before anything starts. Dies with 1 or 2. */
static void vmm_kvm_check(struct vmm_opts *o, bool disk_ro)
{
	int fd;

	/* First: without KVM nothing else matters, and the way out is --guest synthetic. */
	fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		log_die(1, "--guest kvm: no /dev/kvm on this host; load kvm-intel or kvm-amd, or use "
			"--guest synthetic to exercise the memory plane without KVM");
	if (fd < 0)
		log_die(1, "--guest kvm: cannot open /dev/kvm: %s; check its permissions "
			"(or use --guest synthetic)", strerror(errno));
	close(fd);
	if (!*o->kernel)
		log_die(2, "--kernel: a bzImage is needed for --guest kvm");
	if (o->mem > VMM_KVM_MEM_MAX || o->mem < (2u << 20))
		log_die(2, "--mem: %" PRIu64 " MiB is outside 2M..3G for a KVM guest "
			"(guest RAM ends where the MMIO hole starts)", o->mem >> 20);
	if (o->vcpus > VMM_KVM_VCPUS_MAX)
		log_die(2, "--vcpus: at most %d for a KVM guest", VMM_KVM_VCPUS_MAX);
	if (vmm_boot__check_kernel(o->kernel))
		exit(2); /* logged with the reason */
	if (*o->initrd && (fd = open(o->initrd, O_RDONLY | O_CLOEXEC)) < 0)
		log_die(2, "--initrd %s: %s", o->initrd, strerror(errno));
	if (*o->initrd)
		close(fd);
	if (*o->disk && (fd = open(o->disk, (disk_ro ? O_RDONLY : O_RDWR) | O_CLOEXEC)) < 0)
		log_die(2, "--disk %s: %s%s", o->disk, strerror(errno),
			errno == EACCES || errno == EROFS ? " (add ,ro for a read-only disk)" : "");
	if (*o->disk)
		close(fd);
}

static void vmm_kvm_irq(void *opaque, uint32_t gsi, int level)
{
	int ret = vmm_kvm__set_irq(opaque, gsi, level);

	if (ret)
		log_debug("kvm: interrupt line %u: %s", gsi, strerror(-ret));
}

/* COM1 and, with --disk, one virtio-blk device; fills the ACPI device list. */
static int vmm_kvm_devices(struct vmm_vm *vm, struct vmm_opts *o, bool disk_ro,
			   struct vmm_acpi_mmio *virtio, unsigned *nvirtio)
{
	struct vmm_serial_cfg scfg = { .out_fd = STDOUT_FILENO, .in_fd = STDIN_FILENO,
				       .quit_fd = vm->stop_fd, .gsi = VMM_SERIAL_COM1_GSI,
				       .set_irq = vmm_kvm_irq, .irq_opaque = vm->kvm };
	int ret;

	ret = vmm_serial__create(&vm->serial, &scfg);
	if (!ret)
		ret = vmm_kvm__register_pio(vm->kvm, VMM_SERIAL_COM1_PORT, VMM_SERIAL_PORTS,
					    vmm_serial__io, vm->serial);
	if (ret) {
		log_err("cannot set up the serial console: %s", strerror(-ret));
		return ret;
	}
	*nvirtio = 0;
	if (*o->disk) {
		struct vmm_blk_cfg bcfg = { .path = o->disk, .read_only = disk_ro, .mem = vm->mem,
					    .gsi = VMM_VIRTIO_GSI_BASE, .set_irq = vmm_kvm_irq,
					    .irq_opaque = vm->kvm };

		ret = vmm_blk__create(&vm->blk, &bcfg);
		if (!ret)
			ret = vmm_kvm__register_mmio(vm->kvm, VMM_VIRTIO_MMIO_BASE, VMM_VIRTIO_MMIO_SIZE,
						     vmm_blk__mmio, vm->blk);
		if (ret) {
			log_err("--disk %s: %s", o->disk, strerror(-ret));
			return ret;
		}
		virtio[(*nvirtio)++] = (struct vmm_acpi_mmio){ .base = VMM_VIRTIO_MMIO_BASE,
							       .size = VMM_VIRTIO_MMIO_SIZE,
							       .gsi = VMM_VIRTIO_GSI_BASE };
	}
	return 0;
}

/* Memory plane, VM, devices, guest image; the vCPUs do not run yet. */
static int vmm_kvm_build(struct vmm_vm *vm, struct vmm_opts *o, bool disk_ro,
			 struct vmm_boot_entry *entry)
{
	struct vmm_mem_cfg mcfg = { .size = o->mem, .dedup = o->dedup, .pool_path = o->pool,
				    .domain = o->domain, .name = o->name,
				    .cpu_pct = (unsigned)o->dedup_cpu };
	/* physical dedup tracks vCPU writes with KVM's dirty log (see track.c) */
	struct vmm_kvm_cfg kcfg = { .vcpus = (unsigned)o->vcpus, .stop_fd = vm->stop_fd,
				    .dirty_log = o->dedup == VMM_DEDUP_PHYSICAL };
	static char cmdline[VMM_BOOT_CMDLINE_MAX];
	struct vmm_acpi_mmio virtio[1];
	struct vmm_acpi_cfg acfg = { .vcpus = (unsigned)o->vcpus, .virtio = virtio, .com1 = true };
	struct vmm_boot_cfg bcfg = { .kernel = o->kernel, .initrd = o->initrd, .cmdline = cmdline,
				     .acpi = &acfg };
	int ret;

	ret = vmm_mem__create(&vm->mem, &mcfg);
	if (ret) {
		log_err("cannot create %" PRIu64 " MiB of guest RAM: %s", o->mem >> 20, strerror(-ret));
		return ret;
	}
	kcfg.mem = vm->mem;
	ret = vmm_kvm__create(&vm->kvm, &kcfg);
	if (ret) {
		log_err("cannot create the KVM guest: %s", strerror(-ret));
		return ret;
	}
	ret = vmm_kvm_devices(vm, o, disk_ro, virtio, &acfg.nvirtio);
	if (ret)
		return ret;
	snprintf(cmdline, sizeof(cmdline), "%s%s%s", VMM_KVM_CMDLINE, *o->cmdline ? " " : "",
		 o->cmdline);
	log_debug("guest command line: %s", cmdline);
	ret = vmm_boot__load(vm->mem, &bcfg, entry);
	if (ret)
		return ret;
	/* the plane stops the vCPUs around remaps; see struct vmm_mem_vcpus */
	vmm_mem__set_vcpus(vm->mem, &(struct vmm_mem_vcpus){ .pause = vmm_kvm__pause,
		.paused = vmm_kvm__paused, .resume = vmm_kvm__resume,
		.hv_pages = vmm_kvm__hv_pages, .dirty_get = vmm_kvm__dirty_get,
		.dirty_clear = vmm_kvm__dirty_clear, .opaque = vm->kvm });
	ret = vmm_mem__start(vm->mem);
	if (ret)
		log_err("cannot start the memory plane (--dedup %s): %s", vmm_dedup_names[o->dedup],
			strerror(-ret));
	return ret;
}

static int vmm_kvm_api(struct vmm_vm *vm, struct vmm_opts *o)
{
	struct vmm_api_cfg acfg = { .path = o->api_sock, .mem = vm->mem, .synth = NULL,
				    .name = o->name, .workload = "none", .instance = o->instance,
				    .quit_fd = vm->stop_fd };
	int ret;

	if (!*o->api_sock)
		return 0;
	ret = vmm_api__start(&vm->api, &acfg);
	if (ret) {
		log_err("--api-sock %s: %s", o->api_sock, ret == -EADDRINUSE ?
			"another process is listening on it" : strerror(-ret));
		return ret;
	}
	log_info("api: listening on %s", o->api_sock);
	return 0;
}

/* Tear down in reverse: vCPUs first, so no device is called after it is gone. */
static void vmm_kvm_teardown(struct vmm_vm *vm)
{
	vmm_kvm__stop(vm->kvm);
	vmm_mem__stop(vm->mem); /* its thread calls into the VM (pause, dirty log) */
	vmm_api__stop(vm->api);
	vmm_blk__destroy(vm->blk);
	vmm_serial__destroy(vm->serial);
	vmm_kvm__destroy(vm->kvm);
	if (vm->mem) {
		vmm_log_stats(vm->mem);
		vmm_mem__destroy(vm->mem);
	}
	close(vm->stop_fd);
	close(vm->sig_fd);
}

static int vmm_run_kvm(struct vmm_opts *o)
{
	struct vmm_vm vm = { .sig_fd = -1, .stop_fd = -1 };
	struct vmm_boot_entry entry;
	bool disk_ro;
	int ret, status;

	vmm_disk_path(o, &disk_ro);
	vmm_kvm_check(o, disk_ro);
	log_info("%s: %" PRIu64 " MiB, %" PRIu64 " vCPU(s), dedup %s, domain %s, kernel %s%s%s",
		 o->name, o->mem >> 20, o->vcpus, vmm_dedup_names[o->dedup], o->domain, o->kernel,
		 *o->disk ? ", disk " : "", o->disk);
	vmm_signals(&vm);
	ret = vmm_kvm_build(&vm, o, disk_ro, &entry);
	if (!ret)
		ret = vmm_kvm_api(&vm, o);
	if (!ret)
		ret = vmm_kvm__start(vm.kvm, &entry);
	if (ret) {
		vmm_kvm_teardown(&vm);
		return 1;
	}
	if (vmm_wait(&vm) || vmm_kvm__ended(vm.kvm) == VMM_KVM_RUNNING)
		vmm_kvm__end(vm.kvm, VMM_KVM_STOPPED); /* a signal, API quit or Ctrl-A x */
	status = vmm_kvm__ended(vm.kvm) == VMM_KVM_FAILED ? 1 : 0;
	vmm_kvm_teardown(&vm);
	return status;
}

static int vmm_run(int argc, char **argv)
{
	static struct vmm_opts o; /* PATH_MAX fields: too big for the stack */

	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			vmm_run_usage();
			return 0;
		}
	}
	vmm_opts_load(&o, argc, argv);
	log_set_level(o.log_level);
	if (o.guest == VMM_GUEST_KVM)
		return vmm_run_kvm(&o);
	return vmm_run_synthetic(&o);
}

int main(int argc, char **argv)
{
	log_init("pvisor", LOG_INFO);
	if (argc < 2) {
		vmm_usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "run"))
		return vmm_run(argc - 1, argv + 1);
	if (!strcmp(argv[1], "ctl"))
		return vmm_ctl__main(argc - 1, argv + 1);
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		vmm_usage(stdout);
		printf("\n");
		vmm_run_usage();
		printf("\n");
		vmm_ctl__usage();
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("pvisor %s\n", PVISOR_VERSION);
		return 0;
	}
	log_die(2, "unknown command '%s' (commands: run, ctl; see pvisor --help)", argv[1]);
}
