/* tclient.h: test helpers that run a pvisor-pool and speak proto.h as a raw client. */
#ifndef PVISOR_TCLIENT_H
#define PVISOR_TCLIENT_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "proto.h"

#define T_EXIT_PASS 0
#define T_EXIT_FAIL 1
#define T_EXIT_SKIP 77

/* Fail the test with a message naming the line. */
#define t_fail(...) do {						\
		fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);	\
		fprintf(stderr, __VA_ARGS__);				\
		fputc('\n', stderr);					\
		t_pool_cleanup();					\
		exit(T_EXIT_FAIL);					\
	} while (0)
#define t_check(cond, ...) do { if (!(cond)) t_fail(__VA_ARGS__); } while (0)

/* struct t_pool - one pvisor-pool started for a test */
struct t_pool {
	pid_t pid;
	char dir[128];     /* temporary directory */
	char sock[192];    /* socket path inside it */
	char conf[192];    /* config file path */
	char log[192];     /* pool's stderr */
};

/* struct t_client - a raw protocol client */
struct t_client {
	int sock, submit_efd, complete_efd;
	uint8_t *ring;
	uint64_t ring_size;
	struct proto_ring_hdr hdr;  /* copy of what the pool wrote */
	struct proto_ring_idx *sq, *cq;
	struct proto_sqe *sqes;
	struct proto_cqe *cqes;
	uint8_t *staging;
	uint32_t client_id, seg_pages;
	int segfd[64];              /* cached segment fds, -1 unknown */
};

/* Start a pool with @conf_text as its config file and extra flags (NULL terminated). */
void t_pool_start(struct t_pool *p, const char *conf_text, ...);
void t_pool_stop(struct t_pool *p);
/* Kill any pool still running (called by t_fail). */
void t_pool_cleanup(void);
const char *t_pool_bin(void);

/* Connect and HELLO; returns 0 or the pool's negative status (reply in @msg). */
int t_hello(struct t_client *c, const char *sock, const char *domain, const char *name,
	    uint64_t guest_pages, char *msg, size_t msglen);
void t_connect(struct t_client *c, const char *sock, const char *domain, uint64_t pages);
void t_close(struct t_client *c);

void t_submit(struct t_client *c, const struct proto_sqe *q);
/* Like t_submit, but false if the ring stays full for @ms. */
bool t_try_submit(struct t_client *c, const struct proto_sqe *q, int ms);
void t_offer(struct t_client *c, uint64_t page, const void *data);
void t_upload(struct t_client *c, uint64_t page, const void *data, uint32_t staging);
void t_drop(struct t_client *c, uint64_t page, uint32_t seg, uint32_t slot);
/* Next completion within @ms; false on timeout. */
bool t_wait_cqe(struct t_client *c, struct proto_cqe *out, int ms);
/* Expect no completion within @ms. */
bool t_no_cqe(struct t_client *c, int ms);
/* A sealed segment fd (cached). */
int t_seg_fd(struct t_client *c, uint32_t seg);
/* Map one slot read-only, MAP_PRIVATE; munmap(ptr, 4096) after. */
void *t_map_slot(struct t_client *c, uint32_t seg, uint32_t slot);

/* Fetch the pool's statistics; json_object_put() the result. */
struct json_object *t_stat(const char *sock, bool audit);
int64_t t_stat_get(struct json_object *o, const char *key);
/* Counter of the client with pool id @id in client_list, -1 if absent. */
int64_t t_stat_client(struct json_object *o, uint32_t id, const char *key);
int64_t t_stat_domain(struct json_object *o, const char *name, const char *key);

/* A page filled from @seed. */
void t_fill(void *page, uint64_t seed);

/* Two clients of @pool share page content: OFFER, OFFER, UPLOAD, MAP, MAP. */
void t_merge(struct t_client *a, uint64_t pa, struct t_client *b, uint64_t pb,
	     const void *data, struct proto_cqe *ma, struct proto_cqe *mb);

#endif
