/* ev.c: the pool's event loop: io_uring multishot polls plus a timer list. */
#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "ev.h"
#include "log.h"
#include "util.h"

/*
 * Each watched fd has a slot in files[] indexed by fd. The poll request's
 * user_data carries (generation << 32 | fd), so a completion that arrives
 * after ev_del() (or after the fd number was reused) is recognised as stale
 * and dropped instead of calling a callback whose data is gone.
 */

/* struct ev_file - one watched fd */
struct ev_file {
	ev_file_fn *fn;    /* callback, NULL when not watched */
	void *data;        /* callback argument */
	int events;        /* EV_* bits asked for */
	uint32_t gen;      /* bumped by every ev_add/ev_del of this fd */
};

/* struct ev_timer - one pending timer, kept in an unsorted list (few timers) */
struct ev_timer {
	uint64_t id;           /* handle returned by ev_timer_add */
	uint64_t due_ns;       /* CLOCK_MONOTONIC deadline */
	ev_timer_fn *fn;
	void *data;
	struct ev_timer *next;
};

/* struct ev_loop - the loop */
struct ev_loop {
	struct io_uring ring;   /* poll requests live here */
	struct ev_file *files;  /* indexed by fd */
	int nfiles;             /* size of files[] */
	struct ev_timer *timers;
	uint64_t next_timer_id;
	ev_idle_fn *idle;       /* before-sleep hook */
	void *idle_data;
	bool stop;
};

#define EV_UD(fd, gen) (((uint64_t)(gen) << 32) | (uint32_t)(fd))
#define EV_UD_REMOVE UINT64_MAX /* completions of poll-remove requests */

int ev_create(struct ev_loop **out, unsigned entries)
{
	struct ev_loop *loop = calloc(1, sizeof(*loop));
	int ret;

	if (!loop)
		return -ENOMEM;
	ret = io_uring_queue_init(entries, &loop->ring, 0);
	if (ret) {
		free(loop);
		return ret;
	}
	*out = loop;
	return 0;
}

void ev_destroy(struct ev_loop *loop)
{
	struct ev_timer *t, *next;

	if (!loop)
		return;
	for (t = loop->timers; t; t = next) {
		next = t->next;
		free(t);
	}
	io_uring_queue_exit(&loop->ring);
	free(loop->files);
	free(loop);
}

static struct io_uring_sqe *ev_get_sqe(struct ev_loop *loop)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&loop->ring);

	if (!sqe) {
		io_uring_submit(&loop->ring);
		sqe = io_uring_get_sqe(&loop->ring);
	}
	return sqe;
}

static int ev_arm(struct ev_loop *loop, int fd)
{
	struct ev_file *f = &loop->files[fd];
	struct io_uring_sqe *sqe = ev_get_sqe(loop);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_multishot(sqe, fd, (unsigned)f->events);
	io_uring_sqe_set_data64(sqe, EV_UD(fd, f->gen));
	return 0;
}

int ev_add(struct ev_loop *loop, int fd, int events, ev_file_fn *fn, void *data)
{
	struct ev_file *f;

	if (fd < 0)
		return -EBADF;
	if (fd >= loop->nfiles) {
		int n = loop->nfiles ? loop->nfiles : 64;
		struct ev_file *nf;

		while (n <= fd)
			n *= 2;
		nf = realloc(loop->files, sizeof(*nf) * (size_t)n);
		if (!nf)
			return -ENOMEM;
		memset(nf + loop->nfiles, 0, sizeof(*nf) * (size_t)(n - loop->nfiles));
		loop->files = nf;
		loop->nfiles = n;
	}
	f = &loop->files[fd];
	if (f->fn)
		return -EEXIST;
	f->fn = fn;
	f->data = data;
	f->events = events;
	f->gen++;
	return ev_arm(loop, fd);
}

void ev_del(struct ev_loop *loop, int fd)
{
	struct ev_file *f;
	struct io_uring_sqe *sqe;

	if (fd < 0 || fd >= loop->nfiles || !loop->files[fd].fn)
		return;
	f = &loop->files[fd];
	sqe = ev_get_sqe(loop);
	if (sqe) {
		io_uring_prep_poll_remove(sqe, EV_UD(fd, f->gen));
		io_uring_sqe_set_data64(sqe, EV_UD_REMOVE);
	}
	/* The remove must reach the kernel before the caller closes fd. */
	io_uring_submit(&loop->ring);
	f->fn = NULL;
	f->data = NULL;
	f->gen++;
}

uint64_t ev_timer_add(struct ev_loop *loop, int64_t ms, ev_timer_fn *fn, void *data)
{
	struct ev_timer *t = calloc(1, sizeof(*t));

	if (!t)
		return 0;
	t->id = ++loop->next_timer_id;
	t->due_ns = util_now_ns() + (uint64_t)ms * 1000000ull;
	t->fn = fn;
	t->data = data;
	t->next = loop->timers;
	loop->timers = t;
	return t->id;
}

void ev_timer_del(struct ev_loop *loop, uint64_t id)
{
	for (struct ev_timer **pp = &loop->timers; *pp; pp = &(*pp)->next) {
		if ((*pp)->id == id) {
			struct ev_timer *t = *pp;

			*pp = t->next;
			free(t);
			return;
		}
	}
}

void ev_set_idle(struct ev_loop *loop, ev_idle_fn *fn, void *data)
{
	loop->idle = fn;
	loop->idle_data = data;
}

void ev_stop(struct ev_loop *loop) { loop->stop = true; }

static void ev_run_timers(struct ev_loop *loop)
{
	uint64_t now = util_now_ns();
	struct ev_timer **pp = &loop->timers;

	while (*pp) {
		struct ev_timer *t = *pp;
		int64_t next;

		if (t->due_ns > now) {
			pp = &t->next;
			continue;
		}
		next = t->fn(loop, t->id, t->data);
		/* The callback may have deleted timers; look the timer up again. */
		for (pp = &loop->timers; *pp && *pp != t; pp = &(*pp)->next)
			;
		if (!*pp)
			pp = &loop->timers;
		else if (next == EV_NOMORE) {
			*pp = t->next;
			free(t);
		} else {
			t->due_ns = now + (uint64_t)next * 1000000ull;
			pp = &t->next;
		}
		if (loop->stop)
			return;
	}
}

/* Nanoseconds until the nearest timer, capped at one second. */
static uint64_t ev_next_wait(struct ev_loop *loop)
{
	uint64_t now = util_now_ns(), wait = 1000000000ull;

	for (struct ev_timer *t = loop->timers; t; t = t->next) {
		if (t->due_ns <= now)
			return 0;
		if (t->due_ns - now < wait)
			wait = t->due_ns - now;
	}
	return wait;
}

static void ev_dispatch(struct ev_loop *loop, struct io_uring_cqe *cqe)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	int fd = (int)(uint32_t)ud;
	uint32_t gen = (uint32_t)(ud >> 32);
	struct ev_file *f;

	if (ud == EV_UD_REMOVE || fd >= loop->nfiles)
		return;
	f = &loop->files[fd];
	if (!f->fn || f->gen != gen)
		return; /* stale: the fd was deleted after this poll fired */
	if (!(cqe->flags & IORING_CQE_F_MORE) && ev_arm(loop, fd))
		log_err("cannot re-arm poll on fd %d", fd);
	if (cqe->res < 0) {
		if (cqe->res == -ECANCELED)
			return;
		log_warn("poll on fd %d failed: %s", fd, strerror(-cqe->res));
		f->fn(loop, fd, f->data, EV_READ | EV_WRITE);
		return;
	}
	f->fn(loop, fd, f->data, cqe->res);
}

int ev_run(struct ev_loop *loop)
{
	loop->stop = false;
	while (!loop->stop) {
		struct __kernel_timespec ts;
		struct io_uring_cqe *cqe;
		uint64_t wait;
		int ret;

		wait = ev_next_wait(loop);
		if (loop->idle && loop->idle(loop, loop->idle_data))
			wait = 0;
		if (loop->stop)
			break;
		ts.tv_sec = (long long)(wait / 1000000000ull);
		ts.tv_nsec = (long long)(wait % 1000000000ull);
		ret = io_uring_submit_and_wait_timeout(&loop->ring, &cqe, wait ? 1 : 0, &ts, NULL);
		if (ret < 0 && ret != -ETIME && ret != -EINTR && ret != -EAGAIN) {
			log_err("io_uring wait failed: %s", strerror(-ret));
			return ret;
		}
		while (!loop->stop && !io_uring_peek_cqe(&loop->ring, &cqe)) {
			/* Copy it out: the callback may submit and the CQ may move. */
			struct io_uring_cqe copy = *cqe;

			io_uring_cqe_seen(&loop->ring, cqe);
			ev_dispatch(loop, &copy);
		}
		ev_run_timers(loop);
	}
	return 0;
}
