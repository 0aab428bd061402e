/* hostile.c: garbage on the rings and the socket hurts only the client that sends it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "tclient.h"
#include "util.h"

#define PAGES 256

static void t_expect(struct t_client *c, uint32_t verdict, uint32_t staging, const char *what)
{
	struct proto_cqe v;

	t_check(t_wait_cqe(c, &v, 2000), "%s: no verdict", what);
	t_check(v.verdict == verdict, "%s: verdict %u, wanted %u", what, v.verdict, verdict);
	t_check(v.staging == staging, "%s: staging %u, wanted %u", what, v.staging, staging);
}

static void t_bad(struct t_client *x, struct proto_sqe q, uint32_t staging, const char *what)
{
	t_submit(x, &q);
	t_expect(x, PROTO_V_EINVAL, staging, what);
}

/* HELLO with a chosen version and domain; returns the reply status. */
static int t_hello_version(const char *sock, uint16_t version, const char *domain)
{
	struct proto_hello m = { .hdr = { .magic = PROTO_MAGIC, .version = version,
		.type = PROTO_MSG_HELLO, .len = sizeof(m) }, .guest_pages = 16 };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct proto_hello_reply r;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	t_check(!connect(fd, (struct sockaddr *)&sa, sizeof(sa)), "connect");
	snprintf(m.domain, sizeof(m.domain), "%s", domain);
	t_check(send(fd, &m, sizeof(m), 0) == sizeof(m), "send");
	t_check(recv(fd, &r, sizeof(r), 0) == sizeof(r), "no HELLO_REPLY");
	t_check(r.status == 0 || r.message[0], "refusal carries no message");
	if (r.status)
		t_check(recv(fd, &r, sizeof(r), 0) == 0, "pool kept a refused connection open");
	close(fd);
	return r.status;
}

int main(void)
{
	uint8_t page[PROTO_PAGE_SIZE], c2[PROTO_PAGE_SIZE], junk[PROTO_PAGE_SIZE];
	struct t_client h, h2, x;
	struct proto_cqe mh, mh2, v;
	struct json_object *s;
	struct t_pool pool;
	uint8_t *hm;

	t_pool_start(&pool, "", NULL);
	t_connect(&h, pool.sock, "default", PAGES);
	t_connect(&h2, pool.sock, "default", PAGES);
	t_connect(&x, pool.sock, "default", PAGES);
	t_fill(page, 42);
	t_merge(&h, 1, &h2, 1, page, &mh, &mh2);
	hm = t_map_slot(&h, mh.seg, mh.slot);

	/* Malformed entries, each answered EINVAL, staging released where valid. */
	t_bad(&x, (struct proto_sqe){ .op = 99 }, PROTO_NO_STAGING, "bad op");
	t_bad(&x, (struct proto_sqe){ .op = 0 }, PROTO_NO_STAGING, "op 0");
	t_bad(&x, (struct proto_sqe){ .op = PROTO_OP_OFFER, .page = PAGES }, PROTO_NO_STAGING,
	      "page out of range");
	t_bad(&x, (struct proto_sqe){ .op = PROTO_OP_OFFER, .page = ~0ull }, PROTO_NO_STAGING,
	      "page ~0");
	t_bad(&x, (struct proto_sqe){ .op = PROTO_OP_OFFER, .flags = 0x80 }, PROTO_NO_STAGING,
	      "bad flags");
	t_bad(&x, (struct proto_sqe){ .op = PROTO_OP_UPLOAD, .staging = 100000 }, PROTO_NO_STAGING,
	      "staging out of range");
	t_bad(&x, (struct proto_sqe){ .op = PROTO_OP_UPLOAD, .page = PAGES + 1, .staging = 5 }, 5,
	      "bad page with good staging releases staging");
	t_bad(&x, (struct proto_sqe){ .op = PROTO_OP_DROP, .seg = 12345 }, PROTO_NO_STAGING,
	      "segment out of range");
	t_bad(&x, (struct proto_sqe){ .op = PROTO_OP_DROP, .seg = mh.seg, .slot = 1u << 30 },
	      PROTO_NO_STAGING, "slot out of range");
	t_bad(&x, (struct proto_sqe){ .op = PROTO_OP_DROP, .page = 1, .seg = mh.seg, .slot = mh.slot },
	      PROTO_NO_STAGING, "DROP of someone else's reference");

	/* Unasked UPLOAD: nothing to do, staging back. */
	t_upload(&x, 3, page, 7);
	t_expect(&x, PROTO_V_DONE, 7, "unasked upload");

	/* UPLOAD whose bytes do not match: MISMATCH, the honest candidate is kept. */
	t_fill(c2, 43);
	memset(junk, 0x11, sizeof(junk));
	t_offer(&h, 2, c2);
	t_offer(&x, 2, c2);
	t_expect(&x, PROTO_V_UPLOAD, PROTO_NO_STAGING, "x asked to upload");
	{
		struct proto_sqe q = { .op = PROTO_OP_UPLOAD, .page = 2, .staging = 9 };

		util_hash_page(c2, q.hash);
		memcpy(x.staging + 9 * PROTO_PAGE_SIZE, junk, sizeof(junk));
		t_submit(&x, &q);
	}
	t_expect(&x, PROTO_V_MISMATCH, 9, "lying upload");
	t_check(t_no_cqe(&h, 100), "honest candidate got a verdict from a lying upload");
	t_merge(&h, 2, &h2, 2, c2, &mh, &v); /* h re-offers: fine, replaces its candidate */
	s = t_stat(pool.sock, false);
	t_check(t_stat_get(s, "upload_mismatches") == 1, "upload_mismatches");
	json_object_put(s);

	/* An uploader that never answers: after the timeout the other candidate is asked. */
	t_fill(c2, 45);
	t_offer(&h, 7, c2);
	t_offer(&x, 7, c2);
	t_expect(&x, PROTO_V_UPLOAD, PROTO_NO_STAGING, "x asked to upload (and stays silent)");
	t_check(t_wait_cqe(&h, &v, 12000) && v.verdict == PROTO_V_UPLOAD && v.page == 7,
		"silent uploader was never replaced");
	t_upload(&h, 7, c2, 1);
	t_expect(&h, PROTO_V_MAP, 1, "replacement upload maps");
	t_expect(&x, PROTO_V_MAP, PROTO_NO_STAGING, "silent candidate still mapped");

	/* Flood: many bad entries and never consume the CQ -> disconnected. */
	{
		struct t_client f;
		struct proto_sqe q = { .op = 77 };

		t_connect(&f, pool.sock, "default", PAGES);
		for (int i = 0; i < 80000; i++)
			if (!t_try_submit(&f, &q, 500))
				break; /* the pool stopped serving us: expected */
		usleep(200000);
		t_check(recv(f.sock, junk, sizeof(junk), MSG_DONTWAIT) == 0,
			"flooding client still connected");
		t_close(&f);
	}

	/* Bogus SQ tail (more than the ring holds): disconnected. */
	{
		struct t_client f;
		uint64_t one = 1;

		t_connect(&f, pool.sock, "default", PAGES);
		f.sq->tail = f.sq->head + f.hdr.sq_entries + 17;
		t_check(write(f.submit_efd, &one, 8) == 8, "kick");
		usleep(200000);
		t_check(recv(f.sock, junk, sizeof(junk), MSG_DONTWAIT) == 0,
			"client with a bogus SQ tail still connected");
		t_close(&f);
	}

	/* Scribbled header and CQ head: the pool never reads the header back. */
	{
		struct t_client f;
		struct proto_sqe q = { .op = 77 };

		t_connect(&f, pool.sock, "default", PAGES);
		memset(f.ring, 0xff, sizeof(struct proto_ring_hdr));
		f.cq->head = 0xdeadbeef;
		f.cq->tail = 12345;
		t_submit(&f, &q);
		usleep(200000);
		t_check(recv(f.sock, junk, sizeof(junk), MSG_DONTWAIT) == 0,
			"client with a scribbled CQ head still connected");
		t_close(&f);
	}

	/* Control socket garbage. */
	t_check(t_hello_version(pool.sock, PROTO_VERSION + 1, "default") == -EPROTO,
		"wrong version not refused with -EPROTO");
	t_check(t_hello_version(pool.sock, PROTO_VERSION, "bad domain!") == -EINVAL,
		"bad domain not refused");
	t_check(t_hello_version(pool.sock, PROTO_VERSION, "") == -EINVAL, "empty domain not refused");

	/* The honest clients are still served and nothing in the store changed. */
	t_check(!memcmp(hm, page, sizeof(page)), "honest client's mapped page changed");
	t_fill(c2, 44);
	t_merge(&h, 5, &h2, 5, c2, &mh, &v);
	s = t_stat(pool.sock, true);
	t_check(t_stat_get(s, "audit_mismatches") == 0, "store audit found changed pages");
	t_check(t_stat_get(s, "audit_checked") == 4, "audit checked %lld",
		(long long)t_stat_get(s, "audit_checked"));
	t_check(t_stat_get(s, "errors") >= 10, "errors counter");
	json_object_put(s);
	munmap(hm, PROTO_PAGE_SIZE);
	t_close(&h);
	t_close(&h2);
	t_close(&x);
	t_pool_stop(&pool);
	printf("PASS\n");
	return T_EXIT_PASS;
}
