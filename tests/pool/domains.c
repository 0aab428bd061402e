/* domains.c: pages are shared inside a sharing domain only; share=none shares nothing. */
#include <errno.h>
#include <string.h>

#include "tclient.h"

int main(void)
{
	uint8_t page[PROTO_PAGE_SIZE];
	struct t_client a, b, c;
	struct proto_cqe v, ma, mc;
	struct json_object *s;
	struct t_pool pool;

	t_fill(page, 9);
	t_pool_start(&pool, "", NULL);
	t_connect(&a, pool.sock, "tenant-a", 64);
	t_connect(&b, pool.sock, "tenant-b", 64);
	t_connect(&c, pool.sock, "tenant-a", 64);

	/* Same content in two domains: both stay candidates, nothing is stored. */
	t_offer(&a, 1, page);
	t_offer(&b, 1, page);
	t_check(t_no_cqe(&a, 150) && t_no_cqe(&b, 150), "pages shared across domains");
	s = t_stat(pool.sock, false);
	t_check(t_stat_get(s, "candidates") == 2 && t_stat_get(s, "pages_shared") == 0,
		"cross-domain state");
	t_check(t_stat_domain(s, "tenant-a", "candidates") == 1, "tenant-a candidates");
	t_check(t_stat_domain(s, "tenant-b", "candidates") == 1, "tenant-b candidates");
	json_object_put(s);

	/* Same domain: shared. */
	t_offer(&c, 2, page);
	t_check(t_wait_cqe(&c, &v, 2000) && v.verdict == PROTO_V_UPLOAD, "same-domain UPLOAD");
	t_upload(&c, 2, page, 0);
	t_check(t_wait_cqe(&c, &mc, 2000) && mc.verdict == PROTO_V_MAP, "same-domain MAP");
	t_check(t_wait_cqe(&a, &ma, 2000) && ma.verdict == PROTO_V_MAP && ma.slot == mc.slot,
		"candidate MAP in tenant-a");
	t_check(t_no_cqe(&b, 150), "tenant-b got a verdict");
	s = t_stat(pool.sock, false);
	t_check(t_stat_domain(s, "tenant-a", "pages_shared") == 1, "tenant-a pages_shared");
	t_check(t_stat_domain(s, "tenant-a", "pages_sharing") == 1, "tenant-a pages_sharing");
	t_check(t_stat_domain(s, "tenant-b", "pages_shared") == 0, "tenant-b pages_shared");
	t_check(t_stat_domain(s, "tenant-b", "candidates") == 1, "tenant-b candidate kept");
	json_object_put(s);
	t_close(&a);
	t_close(&b);
	t_close(&c);
	t_pool_stop(&pool);

	/* share = none: every OFFER is answered UNSHARED. */
	t_pool_start(&pool, "share = none\n", NULL);
	t_connect(&a, pool.sock, "default", 64);
	t_connect(&b, pool.sock, "default", 64);
	t_offer(&a, 1, page);
	t_offer(&b, 1, page);
	t_check(t_wait_cqe(&a, &v, 2000) && v.verdict == PROTO_V_UNSHARED, "a not UNSHARED");
	t_check(t_wait_cqe(&b, &v, 2000) && v.verdict == PROTO_V_UNSHARED, "b not UNSHARED");
	s = t_stat(pool.sock, false);
	t_check(t_stat_get(s, "candidates") == 0 && t_stat_get(s, "pages_shared") == 0,
		"share=none stored something");
	json_object_put(s);
	t_close(&a);
	t_close(&b);
	t_pool_stop(&pool);
	/* physical = off: HELLO is refused with a message naming the key. */
	{
		char msg[80];

		t_pool_start(&pool, "physical = off\n", NULL);
		t_check(t_hello(&a, pool.sock, "default", "x", 64, msg, sizeof(msg)) == -EOPNOTSUPP,
			"physical=off did not refuse HELLO");
		t_check(strstr(msg, "physical"), "refusal does not name the key: %s", msg);
		t_close(&a);
		t_pool_stop(&pool);
	}
	printf("PASS\n");
	return T_EXIT_PASS;
}
