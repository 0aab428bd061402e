/* ev.h: a small ae.c-like event loop on io_uring poll requests and timers. */
#ifndef PVISOR_POOL_EV_H
#define PVISOR_POOL_EV_H

#include <stdbool.h>
#include <stdint.h>

#define EV_READ  0x1 /* POLLIN */
#define EV_WRITE 0x4 /* POLLOUT */
#define EV_NOMORE (-1)

struct ev_loop;

/* Called when @fd is ready; @events holds the poll bits that fired. */
typedef void ev_file_fn(struct ev_loop *loop, int fd, void *data, int events);
/* Called when a timer is due; returns the next delay in ms or EV_NOMORE. */
typedef int64_t ev_timer_fn(struct ev_loop *loop, uint64_t id, void *data);
/* Called before the loop sleeps; returns true if it has work left (no sleep). */
typedef bool ev_idle_fn(struct ev_loop *loop, void *data);

int ev_create(struct ev_loop **out, unsigned entries);
void ev_destroy(struct ev_loop *loop);

/* Watch @fd until ev_del(); one watch per fd. Returns 0 or -errno. */
int ev_add(struct ev_loop *loop, int fd, int events, ev_file_fn *fn, void *data);
/* Stop watching @fd. Safe from inside its own callback; call before close(fd). */
void ev_del(struct ev_loop *loop, int fd);

/* Run @fn after @ms milliseconds, then as often as it asks. Returns the id. */
uint64_t ev_timer_add(struct ev_loop *loop, int64_t ms, ev_timer_fn *fn, void *data);
void ev_timer_del(struct ev_loop *loop, uint64_t id);

void ev_set_idle(struct ev_loop *loop, ev_idle_fn *fn, void *data);

/* Dispatch events until ev_stop(). Returns 0 or -errno from io_uring. */
int ev_run(struct ev_loop *loop);
void ev_stop(struct ev_loop *loop);

#endif
