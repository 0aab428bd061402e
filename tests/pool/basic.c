/* basic.c: two clients, same content: OFFER/UPLOAD/MAP, bytes, counters, DROP, recycling. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tclient.h"

int main(void)
{
	struct t_pool pool;
	struct t_client a, b;
	struct proto_cqe ma, mb, v;
	struct json_object *s;
	uint8_t page[PROTO_PAGE_SIZE], other[PROTO_PAGE_SIZE];
	uint8_t *m;

	t_pool_start(&pool, "", NULL);
	t_connect(&a, pool.sock, "default", 1024);
	t_connect(&b, pool.sock, "default", 1024);
	t_fill(page, 1);

	/* First OFFER: candidate only, no answer. */
	t_offer(&a, 10, page);
	t_check(t_no_cqe(&a, 100), "first OFFER must not be answered");
	s = t_stat(pool.sock, false);
	t_check(t_stat_get(s, "candidates") == 1, "candidates %lld", (long long)t_stat_get(s, "candidates"));
	t_check(t_stat_get(s, "pages_shared") == 0, "nothing stored yet");
	json_object_put(s);

	/* Re-offering the same page replaces its candidate instead of matching it. */
	t_offer(&a, 10, page);
	t_check(t_no_cqe(&a, 100), "re-OFFER of the same page must not self-match");

	t_offer(&b, 20, page);
	t_check(t_wait_cqe(&b, &v, 2000) && v.verdict == PROTO_V_UPLOAD, "expected UPLOAD");
	t_upload(&b, 20, page, 3);
	t_check(t_wait_cqe(&b, &mb, 2000) && mb.verdict == PROTO_V_MAP && mb.staging == 3,
		"uploader MAP with staging 3");
	t_check(t_wait_cqe(&a, &ma, 2000) && ma.verdict == PROTO_V_MAP && ma.page == 10,
		"candidate MAP");
	t_check(ma.seg == mb.seg && ma.slot == mb.slot && ma.staging == PROTO_NO_STAGING,
		"same slot for both");

	m = t_map_slot(&a, ma.seg, ma.slot);
	t_check(!memcmp(m, page, sizeof(page)), "segment bytes differ from the uploaded page");
	munmap(m, PROTO_PAGE_SIZE);

	s = t_stat(pool.sock, true);
	t_check(t_stat_get(s, "pages_shared") == 1, "pages_shared");
	t_check(t_stat_get(s, "pages_sharing") == 1, "pages_sharing");
	t_check(t_stat_get(s, "candidates") == 0, "candidates after merge");
	t_check(t_stat_get(s, "uploads") == 1, "uploads");
	t_check(t_stat_get(s, "merges") == 2, "merges");
	t_check(t_stat_get(s, "bytes_saved") == 4096, "bytes_saved");
	t_check(t_stat_get(s, "audit_mismatches") == 0, "audit");
	t_check(t_stat_get(s, "clients") == 2, "clients");
	t_check(t_stat_client(s, a.client_id, "pages_mapped") == 1, "client a mapped");
	json_object_put(s);

	/* A third OFFER of a stable hash maps at once. */
	t_offer(&a, 11, page);
	t_check(t_wait_cqe(&a, &v, 2000) && v.verdict == PROTO_V_MAP && v.slot == ma.slot,
		"stable OFFER maps at once");

	/* DROP releases; the slot is freed when the last reference goes. */
	t_drop(&a, 11, v.seg, v.slot);
	t_drop(&a, 10, ma.seg, ma.slot);
	t_drop(&a, 10, ma.seg, ma.slot); /* twice: the second is not held any more */
	t_check(t_wait_cqe(&a, &v, 2000) && v.verdict == PROTO_V_EINVAL, "double DROP -> EINVAL");
	t_drop(&b, 20, mb.seg, mb.slot);
	t_check(t_no_cqe(&b, 100), "DROP is not answered");
	s = t_stat(pool.sock, false);
	t_check(t_stat_get(s, "pages_shared") == 0 && t_stat_get(s, "pages_mapped") == 0,
		"slot released");
	json_object_put(s);

	/* A new page reuses the freed slot. */
	t_fill(other, 2);
	t_merge(&a, 30, &b, 31, other, &ma, &mb);
	t_check(ma.seg == v.seg && ma.slot == v.slot, "freed slot %u/%u not recycled (got %u/%u)",
		v.seg, v.slot, ma.seg, ma.slot);
	m = t_map_slot(&b, mb.seg, mb.slot);
	t_check(!memcmp(m, other, sizeof(other)), "recycled slot bytes");
	munmap(m, PROTO_PAGE_SIZE);

	/* Consecutive pages of one uploader get consecutive slots. */
	{
		uint32_t first = 0;

		for (uint64_t i = 0; i < 8; i++) {
			t_fill(other, 100 + i);
			t_merge(&a, 100 + i, &b, 200 + i, other, &ma, &mb);
			if (!i)
				first = mb.slot;
			t_check(mb.slot == first + i, "page %llu got slot %u, wanted %u",
				(unsigned long long)i, mb.slot, first + (uint32_t)i);
		}
	}
	/* ZERO is counted once per page and saves a page; a later OFFER un-zeroes it. */
	{
		struct proto_sqe z = { .page = 500, .op = PROTO_OP_ZERO };

		t_submit(&a, &z);
		t_submit(&a, &z);
		t_check(t_no_cqe(&a, 100), "ZERO is not answered");
		s = t_stat(pool.sock, false);
		t_check(t_stat_get(s, "zero_pages") == 1, "zero_pages %lld",
			(long long)t_stat_get(s, "zero_pages"));
		t_check(t_stat_client(s, a.client_id, "zero_pages") == 1, "client zero_pages");
		json_object_put(s);
		t_fill(other, 999);
		t_offer(&a, 500, other);
		t_check(t_no_cqe(&a, 100), "OFFER of a new hash is not answered");
		s = t_stat(pool.sock, false);
		t_check(t_stat_get(s, "zero_pages") == 0, "OFFER did not clear the zero mark");
		json_object_put(s);
	}
	t_close(&a);
	t_close(&b);
	t_pool_stop(&pool);
	printf("PASS\n");
	return T_EXIT_PASS;
}
