/* exit.c: a killed client's references go; a client that only closes its socket keeps them. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tclient.h"

#define N 32

/* Child: merge N pages with @peer's pages, map them, report ready, then sleep. */
static pid_t t_child(struct t_pool *pool, int ready_fd, bool close_socket)
{
	pid_t pid = fork();

	if (pid)
		return pid;
	{
		uint8_t page[PROTO_PAGE_SIZE];
		struct t_client c;
		struct proto_cqe v;

		t_connect(&c, pool->sock, "default", N);
		for (uint64_t i = 0; i < N; i++) {
			t_fill(page, 1000 + i);
			t_offer(&c, i, page);
			if (!t_wait_cqe(&c, &v, 2000) || v.verdict != PROTO_V_MAP)
				_exit(3);
			if (mmap(NULL, PROTO_PAGE_SIZE, PROT_READ, MAP_PRIVATE, t_seg_fd(&c, v.seg),
				 (off_t)v.slot * PROTO_PAGE_SIZE) == MAP_FAILED)
				_exit(4);
		}
		if (close_socket)
			t_close(&c);
		if (write(ready_fd, "r", 1) != 1)
			_exit(5);
		for (;;)
			pause();
	}
}

static void t_wait_ready(int fd, pid_t pid)
{
	char ch;
	int st;

	if (read(fd, &ch, 1) != 1) {
		waitpid(pid, &st, 0);
		t_fail("child failed (status 0x%x)", st);
	}
}

static int64_t t_wait_mapped(struct t_pool *pool, int64_t want)
{
	int64_t got = -1;

	for (int i = 0; i < 200; i++) {
		struct json_object *s = t_stat(pool->sock, false);

		got = t_stat_get(s, "pages_mapped");
		json_object_put(s);
		if (got == want)
			break;
		usleep(10000);
	}
	return got;
}

int main(void)
{
	uint8_t page[PROTO_PAGE_SIZE];
	struct json_object *s;
	struct t_pool pool;
	struct t_client a, b;
	struct proto_cqe ma, mb;
	int pfd[2];
	pid_t pid;
	int st;

	t_pool_start(&pool, "", NULL);
	t_connect(&a, pool.sock, "default", N);
	t_connect(&b, pool.sock, "default", N);
	for (uint64_t i = 0; i < N; i++) {
		t_fill(page, 1000 + i);
		t_merge(&a, i, &b, i, page, &ma, &mb);
	}
	t_check(t_wait_mapped(&pool, 2 * N) == 2 * N, "setup mapped");

	/* SIGKILL a mapping child: every reference of it goes, no slot leaks. */
	t_check(!pipe(pfd), "pipe");
	pid = t_child(&pool, pfd[1], false);
	t_wait_ready(pfd[0], pid);
	t_check(t_wait_mapped(&pool, 3 * N) == 3 * N, "child's maps not counted");
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	t_check(t_wait_mapped(&pool, 2 * N) == 2 * N, "killed child's references not released");
	s = t_stat(pool.sock, false);
	t_check(t_stat_get(s, "pages_shared") == N && t_stat_get(s, "pages_sharing") == N,
		"slots after kill");
	t_check(t_stat_get(s, "clients") == 2, "clients after kill");
	json_object_put(s);

	/* A child that closes its socket keeps its references until it exits. */
	pid = t_child(&pool, pfd[1], true);
	t_wait_ready(pfd[0], pid);
	usleep(100000);
	t_check(t_wait_mapped(&pool, 3 * N) == 3 * N, "socket close dropped references");
	s = t_stat(pool.sock, false);
	t_check(t_stat_get(s, "clients") == 2, "detached client still counted as connected");
	json_object_put(s);
	kill(pid, SIGTERM);
	waitpid(pid, &st, 0);
	t_check(t_wait_mapped(&pool, 2 * N) == 2 * N, "exited child's references not released");

	/* Everyone leaves: the store is empty. */
	t_close(&a);
	t_close(&b);
	s = t_stat(pool.sock, false);
	t_check(t_stat_get(s, "pages_mapped") == 2 * N, "same-process clients released on close");
	json_object_put(s);
	t_pool_stop(&pool);
	printf("PASS\n");
	return T_EXIT_PASS;
}
