/* util.h: small helpers every module uses: clocks, page hashing, fd passing. */
#ifndef PVISOR_UTIL_H
#define PVISOR_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t util_now_ns(void);
/* This thread's CPU time in nanoseconds. */
uint64_t util_thread_cpu_ns(void);

/* XXH3-128 of one 4 KiB page through xxHash's x86 dispatcher (AVX-512 where present). */
void util_hash_page(const void *page, uint64_t out[2]);
/* XXH3-128 of any buffer, same dispatcher. */
void util_hash(const void *buf, size_t len, uint64_t out[2]);
/* True if all 4096 bytes are zero. */
bool util_page_is_zero(const void *page);

/*
 * Grow a ring-buffer FIFO of @elem-byte items (@len of them, starting at
 * *head in *cap slots): double *cap, at least to @min_cap, and move the items
 * to the front. Returns 0 or -ENOMEM, which leaves the old buffer as it was.
 */
int util_fifo_grow(void **buf, uint32_t *cap, uint32_t *head, uint32_t len, size_t elem,
		   uint32_t min_cap);

/*
 * SOCK_SEQPACKET message with up to @nfds fds (SCM_RIGHTS). send returns
 * bytes sent or -errno; recv returns bytes received (0 on EOF) or -errno and
 * stores received fds in fds[], setting *nfds; extra fds are closed.
 */
ssize_t util_send_fds(int sock, const void *buf, size_t len, const int *fds, int nfds);
ssize_t util_recv_fds(int sock, void *buf, size_t len, int *fds, int *nfds);

#endif
