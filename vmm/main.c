/* main.c: the pvisor command line: `pvisor run` starts a VM, `pvisor ctl` talks to one. */
#include <errno.h>
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

#include "api.h"
#include "config.h"
#include "ctl.h"
#include "log.h"
#include "mem.h"
#include "proto.h"
#include "synth.h"
#include "workload.h"

#define VMM_SUN_PATH_MAX sizeof(((struct sockaddr_un *)0)->sun_path)

enum vmm_guest { VMM_GUEST_KVM, VMM_GUEST_SYNTHETIC };

/* struct vmm_opts - every setting of `pvisor run`, filled from vmm_keys */
struct vmm_opts {
	char config[PATH_MAX];          /* --config: file read before the flags */
	uint64_t mem;                   /* guest RAM bytes */
	uint64_t vcpus;                 /* vCPU threads (synthetic: share the start-up fill) */
	int guest;                      /* enum vmm_guest */
	char kernel[PATH_MAX];          /* KVM only, not used yet */
	char initrd[PATH_MAX];          /* KVM only, not used yet */
	char cmdline[1024];             /* KVM only, not used yet */
	char disk[PATH_MAX];            /* KVM only, not used yet */
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
	  "guest RAM size, a multiple of 4 KiB", false },
	{ "vcpus", CONF_UINT, O(vcpus), 0, "1", NULL, 1, 64, "number of vCPUs", false },
	{ "guest", CONF_ENUM, O(guest), 0, "kvm", vmm_guest_names, 0, 0,
	  "kvm: a KVM guest; synthetic: VMM threads drive guest RAM instead of a vCPU "
	  "(for benchmarks and tests of the memory plane)", false },
	{ "kernel", CONF_STR, O(kernel), L(kernel), NULL, NULL, 0, 0, "guest kernel image (kvm)", false },
	{ "initrd", CONF_STR, O(initrd), L(initrd), NULL, NULL, 0, 0, "guest initrd (kvm)", false },
	{ "cmdline", CONF_STR, O(cmdline), L(cmdline), NULL, NULL, 0, 0, "guest kernel command line (kvm)", false },
	{ "disk", CONF_STR, O(disk), L(disk), NULL, NULL, 0, 0, "guest block device image (kvm)", false },
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

/* KVM guests come with a later change; until then say why nothing runs. */
static void vmm_kvm_refuse(void)
{
	if (access("/dev/kvm", F_OK))
		log_die(1, "--guest kvm: there is no /dev/kvm on this host (%s); "
			"use --guest synthetic to exercise the memory plane without KVM",
			strerror(errno));
	log_die(1, "--guest kvm: KVM guests are not implemented yet; use --guest synthetic");
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
	struct vmm_synth *synth;
	struct vmm_api *api;
	int sig_fd;                     /* signalfd for SIGTERM and SIGINT */
	int stop_fd;                    /* eventfd: quit or a failed guest */
};

/* Sleep until SIGTERM/SIGINT or a quit; returns the exit status. */
static int vmm_wait(struct vmm_vm *vm)
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
	}
	return vmm_synth__failed(vm->synth) ? 1 : 0;
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
	sigset_t sigs;
	int ret, status;

	log_info("guest: synthetic: VMM threads drive guest RAM instead of a vCPU "
		 "(for benchmarks and tests of the memory plane)");
	log_info("%s: %" PRIu64 " MiB, %" PRIu64 " vCPU(s), dedup %s, domain %s, workload %s",
		 o->name, o->mem >> 20, o->vcpus, vmm_dedup_names[o->dedup], o->domain, wl);
	/* Block before any thread exists so that only the signalfd sees them. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	vm.sig_fd = signalfd(-1, &sigs, SFD_CLOEXEC);
	vm.stop_fd = eventfd(0, EFD_CLOEXEC);
	if (vm.sig_fd < 0 || vm.stop_fd < 0)
		log_die(1, "signalfd/eventfd: %s", strerror(errno));
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

	status = vmm_wait(&vm);
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
		vmm_kvm_refuse();
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
