/* seal.c: a client can never write a canonical page, by any route. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tclient.h"

int main(void)
{
	struct t_pool pool;
	struct t_client a, b;
	struct proto_cqe ma, mb;
	uint8_t page[PROTO_PAGE_SIZE], junk[PROTO_PAGE_SIZE];
	struct json_object *s;
	char path[64];
	off_t off;
	void *w;
	uint8_t *m;
	int fd, fd2;

	t_pool_start(&pool, "", NULL);
	t_connect(&a, pool.sock, "default", 64);
	t_connect(&b, pool.sock, "default", 64);
	t_fill(page, 7);
	memset(junk, 0xa5, sizeof(junk));
	t_merge(&a, 1, &b, 2, page, &ma, &mb);
	fd = t_seg_fd(&a, ma.seg);
	off = (off_t)ma.slot * PROTO_PAGE_SIZE;

	t_check(fcntl(fd, F_GET_SEALS) == (F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW |
					   F_SEAL_SEAL), "seals are 0x%x", fcntl(fd, F_GET_SEALS));
	w = mmap(NULL, PROTO_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off);
	t_check(w == MAP_FAILED, "MAP_SHARED|PROT_WRITE of the segment fd succeeded");
	t_check(pwrite(fd, junk, sizeof(junk), off) < 0, "pwrite to the segment succeeded");
	t_check(ftruncate(fd, 0) < 0, "ftruncate succeeded");

	/* Reopen through /proc: O_RDWR may work, writing must not. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	fd2 = open(path, O_RDWR);
	if (fd2 >= 0) {
		w = mmap(NULL, PROTO_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, off);
		t_check(w == MAP_FAILED, "MAP_SHARED|PROT_WRITE through /proc reopen succeeded");
		t_check(pwrite(fd2, junk, sizeof(junk), off) < 0, "pwrite through /proc succeeded");
		t_check(fallocate(fd2, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off,
				  PROTO_PAGE_SIZE) < 0, "hole punch succeeded");
		close(fd2);
	}

	/* A private writable mapping copies on write; the segment stays as it was. */
	m = mmap(NULL, PROTO_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, off);
	t_check(m != MAP_FAILED, "MAP_PRIVATE mapping: %s", strerror(errno));
	t_check(!memcmp(m, page, sizeof(page)), "mapped bytes differ");
	memset(m, 0x5a, PROTO_PAGE_SIZE);
	munmap(m, PROTO_PAGE_SIZE);
	m = t_map_slot(&b, mb.seg, mb.slot);
	t_check(!memcmp(m, page, sizeof(page)), "canonical page changed after a private write");
	munmap(m, PROTO_PAGE_SIZE);

	s = t_stat(pool.sock, true);
	t_check(t_stat_get(s, "audit_checked") == 1 && t_stat_get(s, "audit_mismatches") == 0,
		"audit after write attempts");
	json_object_put(s);
	t_close(&a);
	t_close(&b);
	t_pool_stop(&pool);
	printf("PASS\n");
	return T_EXIT_PASS;
}
