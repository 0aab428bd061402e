/* bootmeter.c: time a VMM from start to a console marker and read its memory overhead there. */
/*
 * Usage: kvm-bootmeter --marker TEXT --guest-mem MiB [--timeout S] [--name N] [--stop]
 *                      -- CMD [ARG...]
 *
 * Starts CMD with its stdout on a pipe, copies every line through, and when a
 * line contains TEXT (the guest's init announcing itself) records the time since
 * the fork and reads /proc/PID/smaps: the VMM's overhead is its total Rss minus
 * the Rss of the guest RAM, taken as the anonymous mappings at least as large
 * as --guest-mem (pvisor maps guest RAM as one; QEMU as one, rounded up). Then it
 * waits for CMD to end (--stop: sends it SIGTERM at the marker, since only the way
 * to init is measured; in any case SIGKILL after --timeout) and prints one line:
 *   BOOTMETER {"name":N,"init_s":..,"rss_kib":..,"guest_kib":..,"overhead_kib":..,"exit":..}
 * Exit status: 0 when the marker was seen, 1 otherwise. Works for any VMM, so
 * pvisor and QEMU are measured the same way in the same run.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pid_t bm_child;

/* A guest that hangs without output must not hang the measurement. */
static void bm_alarm(int sig)
{
	(void)sig;
	kill(bm_child, SIGKILL);
}

static double bm_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Total Rss and guest-RAM Rss of pid, in KiB; 0 on success. */
static int bm_smaps(pid_t pid, unsigned long long guest_kib, unsigned long long *rss,
		    unsigned long long *guest)
{
	char path[64], line[512];
	unsigned long long lo, hi, kib, size_kib = 0;
	int anon = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -errno;
	*rss = *guest = 0;
	while (fgets(line, sizeof(line), f)) {
		char name[256] = "";

		if (sscanf(line, "%llx-%llx %*s %*s %*s %*s %255s", &lo, &hi, name) >= 2 &&
		    strchr(line, '-') < strchr(line, ' ')) {
			size_kib = (hi - lo) >> 10;
			anon = !name[0];
		} else if (sscanf(line, "Rss: %llu kB", &kib) == 1) {
			*rss += kib;
			if (anon && size_kib >= guest_kib)
				*guest += kib;
		}
	}
	fclose(f);
	return 0;
}

static void bm_usage(void)
{
	fprintf(stderr, "usage: kvm-bootmeter --marker TEXT --guest-mem MiB [--timeout S] "
			"[--name NAME] [--stop] -- CMD [ARG...]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *marker = NULL, *name = "vmm";
	unsigned long long guest_kib = 0, rss = 0, guest = 0;
	double timeout = 120, t0, t_init = -1;
	int i, fds[2], status = 0, seen = 0, stop = 0;
	char line[4096];
	pid_t pid;
	FILE *in;

	for (i = 1; i < argc && strcmp(argv[i], "--"); i++) {
		if (!strcmp(argv[i], "--stop")) {
			stop = 1;
			continue;
		}
		if (i + 1 >= argc)
			bm_usage();
		if (!strcmp(argv[i], "--marker"))
			marker = argv[++i];
		else if (!strcmp(argv[i], "--guest-mem"))
			guest_kib = strtoull(argv[++i], NULL, 10) << 10;
		else if (!strcmp(argv[i], "--timeout"))
			timeout = atof(argv[++i]);
		else if (!strcmp(argv[i], "--name"))
			name = argv[++i];
		else
			bm_usage();
	}
	if (!marker || !guest_kib || i + 1 >= argc)
		bm_usage();
	if (pipe(fds))
		return perror("pipe"), 1;
	t0 = bm_now();
	pid = fork();
	if (pid < 0)
		return perror("fork"), 1;
	if (!pid) {
		dup2(fds[1], 1);
		close(fds[0]);
		close(fds[1]);
		execvp(argv[i + 1], argv + i + 1);
		fprintf(stderr, "kvm-bootmeter: %s: %s\n", argv[i + 1], strerror(errno));
		_exit(127);
	}
	close(fds[1]);
	bm_child = pid;
	signal(SIGALRM, bm_alarm);
	alarm((unsigned)timeout + 1);
	in = fdopen(fds[0], "r");
	while (in && fgets(line, sizeof(line), in)) {
		fputs(line, stdout);
		fflush(stdout);
		if (!seen && strstr(line, marker)) {
			seen = 1;
			t_init = bm_now() - t0;
			bm_smaps(pid, guest_kib, &rss, &guest);
			if (stop)
				kill(pid, SIGTERM);
		}
	}
	waitpid(pid, &status, 0);
	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
		fprintf(stderr, "kvm-bootmeter: %s killed after %.0f s\n", name, timeout);
	printf("BOOTMETER {\"name\":\"%s\",\"init_s\":%.3f,\"rss_kib\":%llu,\"guest_kib\":%llu,"
	       "\"overhead_kib\":%llu,\"exit\":%d}\n", name, t_init, rss, guest, rss - guest,
	       WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	return seen ? 0 : 1;
}
