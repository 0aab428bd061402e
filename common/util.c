/* util.c: clocks, page hashing and fd passing shared by pool and vmm. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <xxh_x86dispatch.h>

#include "proto.h"
#include "util.h"

uint64_t util_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t util_thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void util_hash(const void *buf, size_t len, uint64_t out[2])
{
	XXH128_hash_t h = XXH3_128bits_dispatch(buf, len);

	out[0] = h.low64;
	out[1] = h.high64;
}

void util_hash_page(const void *page, uint64_t out[2])
{
	util_hash(page, PROTO_PAGE_SIZE, out);
}

bool util_page_is_zero(const void *page)
{
	const uint64_t *w = page;

	for (unsigned i = 0; i < PROTO_PAGE_SIZE / 8; i += 8)
		if (w[i] | w[i + 1] | w[i + 2] | w[i + 3] | w[i + 4] | w[i + 5] | w[i + 6] | w[i + 7])
			return false;
	return true;
}

int util_fifo_grow(void **buf, uint32_t *cap, uint32_t *head, uint32_t len, size_t elem,
		   uint32_t min_cap)
{
	uint32_t ncap = *cap ? *cap * 2 : min_cap;
	uint8_t *n, *old = *buf;

	if (ncap < min_cap)
		ncap = min_cap;
	n = malloc((size_t)ncap * elem);
	if (!n)
		return -ENOMEM;
	for (uint32_t i = 0; i < len; i++)
		memcpy(n + (size_t)i * elem, old + (size_t)((*head + i) % *cap) * elem, elem);
	free(old);
	*buf = n;
	*cap = ncap;
	*head = 0;
	return 0;
}

ssize_t util_send_fds(int sock, const void *buf, size_t len, const int *fds, int nfds)
{
	char ctl[CMSG_SPACE(sizeof(int) * 8)];
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (nfds < 0 || nfds > 8)
		return -EINVAL;
	if (nfds) {
		struct cmsghdr *c;

		memset(ctl, 0, sizeof(ctl));
		msg.msg_control = ctl;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	do
		n = sendmsg(sock, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

ssize_t util_recv_fds(int sock, void *buf, size_t len, int *fds, int *nfds)
{
	char ctl[CMSG_SPACE(sizeof(int) * 8)];
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
			      .msg_control = ctl, .msg_controllen = sizeof(ctl) };
	int want = nfds ? *nfds : 0, got = 0;
	ssize_t n;

	do
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		int cnt;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		cnt = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int i = 0; i < cnt; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (got < want)
				fds[got++] = fd;
			else
				close(fd); /* never leak fds a peer pushed at us */
		}
	}
	if (nfds)
		*nfds = got;
	if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		for (int i = 0; i < got; i++)
			close(fds[i]);
		if (nfds)
			*nfds = 0;
		return -EMSGSIZE;
	}
	return n;
}
