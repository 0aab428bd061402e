/* uffd.h: thin userfaultfd wrappers for write-protect tracking of guest RAM. */
#ifndef PVISOR_VMM_UFFD_H
#define PVISOR_VMM_UFFD_H

#include <stdbool.h>
#include <stdint.h>

/* Open a userfaultfd (non-blocking) with WP features; *features gets what the kernel gave. */
int vmm_uffd__open(int *out, uint64_t *features);
/* Register [addr, addr+len) in write-protect mode. */
int vmm_uffd__register_wp(int fd, void *addr, uint64_t len);
/* Set (protect) or clear write protection; clearing with wake lets blocked writers retry. */
int vmm_uffd__wp(int fd, void *addr, uint64_t len, bool protect, bool wake);
/* Wake writers blocked on [addr, addr+len) without changing protection. */
int vmm_uffd__wake(int fd, void *addr, uint64_t len);

#endif
