/* uffd.c: thin userfaultfd wrappers for write-protect tracking of guest RAM. */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "uffd.h"

#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1 << 12)
#endif

int vmm_uffd__open(int *out, uint64_t *features)
{
	struct uffdio_api api = { .api = UFFD_API };
	uint64_t want = UFFD_FEATURE_WP_UNPOPULATED | UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
	int fd, ret;

	/*
	 * Not UFFD_USER_MODE_ONLY: KVM writes guest RAM from the kernel (get_user_pages
	 * on a vCPU's write, io_uring copying a disk read into a guest buffer), and
	 * those faults on write-protected pages must reach this uffd too, not fail
	 * with EFAULT. That needs CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1.
	 */
	fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		ret = -errno;
		log_err("uffd: userfaultfd: %s", strerror(errno));
		return ret;
	}
	/* Ask for what we want first; the kernel refuses unknown features as a whole. */
	api.features = want;
	if (ioctl(fd, UFFDIO_API, &api)) {
		close(fd);
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
		if (fd < 0)
			return -errno;
		api = (struct uffdio_api){ .api = UFFD_API, .features = 0 };
		if (ioctl(fd, UFFDIO_API, &api)) {
			ret = -errno;
			log_err("uffd: UFFDIO_API: %s", strerror(errno));
			close(fd);
			return ret;
		}
	}
	if (!(api.features & UFFD_FEATURE_PAGEFAULT_FLAG_WP)) {
		log_err("uffd: kernel has no userfaultfd write protection");
		close(fd);
		return -EOPNOTSUPP;
	}
	if (!(api.features & UFFD_FEATURE_WP_UNPOPULATED))
		log_warn("uffd: no WP_UNPOPULATED: discarded zero pages are not tracked");
	*features = api.features;
	*out = fd;
	return 0;
}

int vmm_uffd__register_wp(int fd, void *addr, uint64_t len)
{
	struct uffdio_register reg = {
		.range = { .start = (uint64_t)(uintptr_t)addr, .len = len },
		.mode = UFFDIO_REGISTER_MODE_WP,
	};

	if (ioctl(fd, UFFDIO_REGISTER, &reg))
		return -errno;
	return 0;
}

int vmm_uffd__wp(int fd, void *addr, uint64_t len, bool protect, bool wake)
{
	struct uffdio_writeprotect wp = {
		.range = { .start = (uint64_t)(uintptr_t)addr, .len = len },
		/* the kernel refuses WP together with DONTWAKE: protecting never wakes */
		.mode = protect ? UFFDIO_WRITEPROTECT_MODE_WP :
			  wake ? 0 : UFFDIO_WRITEPROTECT_MODE_DONTWAKE,
	};

	while (ioctl(fd, UFFDIO_WRITEPROTECT, &wp)) {
		if (errno != EAGAIN)
			return -errno;
	}
	return 0;
}

int vmm_uffd__wake(int fd, void *addr, uint64_t len)
{
	struct uffdio_range r = { .start = (uint64_t)(uintptr_t)addr, .len = len };

	if (ioctl(fd, UFFDIO_WAKE, &r))
		return -errno;
	return 0;
}
