/* stat.c: statistics as JSON (pool side) and the `pvisor-pool stat` command. */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "pool.h"
#include "util.h"

static void pool_stat_add(struct json_object *o, const char *key, uint64_t v)
{
	json_object_object_add(o, key, json_object_new_int64((int64_t)v));
}

static void pool_stat_counters(struct json_object *o, const struct pool_counters *c)
{
	pool_stat_add(o, "pages_mapped", c->pages_mapped);
	pool_stat_add(o, "candidates", c->candidates);
	pool_stat_add(o, "uploads", c->uploads);
	pool_stat_add(o, "upload_mismatches", c->upload_mismatches);
	pool_stat_add(o, "zero_pages", c->zero_pages);
	pool_stat_add(o, "merges", c->merges);
	pool_stat_add(o, "errors", c->errors);
	pool_stat_add(o, "nospace", c->nospace);
}

/* Rehash every live slot; a mismatch means a canonical page changed under us. */
static struct json_object *pool_stat_audit(struct pool *p, uint64_t *checked)
{
	struct json_object *bad = json_object_new_array();
	struct pool_store *s = &p->store;

	*checked = 0;
	for (uint32_t i = 0; i < s->nsegs; i++) {
		struct pool_seg *sg = s->segs[i];

		for (uint32_t slot = 0; sg && slot < sg->fresh; slot++) {
			struct pool_entry *e = sg->owner[slot];
			uint64_t h[2];

			if (!e)
				continue;
			(*checked)++;
			util_hash_page(sg->map + (uint64_t)slot * PROTO_PAGE_SIZE, h);
			if (h[0] != e->hash[0] || h[1] != e->hash[1]) {
				struct json_object *o = json_object_new_object();

				pool_stat_add(o, "seg", i);
				pool_stat_add(o, "slot", slot);
				json_object_array_add(bad, o);
			}
		}
	}
	return bad;
}

static struct json_object *pool_stat_clients(struct pool *p)
{
	struct json_object *arr = json_object_new_array();

	for (struct pool_client *c = p->clients; c; c = c->next) {
		struct json_object *o;

		if (!c->hello)
			continue;
		o = json_object_new_object();
		pool_stat_add(o, "id", c->id);
		pool_stat_add(o, "pid", (uint64_t)c->pid);
		json_object_object_add(o, "name", json_object_new_string(c->name));
		json_object_object_add(o, "domain", json_object_new_string(c->dom->name));
		json_object_object_add(o, "connected", json_object_new_boolean(c->sock >= 0));
		pool_stat_add(o, "guest_pages", c->guest_pages);
		pool_stat_counters(o, &c->cnt);
		pool_stat_add(o, "overflow", c->ovf_n);
		json_object_array_add(arr, o);
	}
	return arr;
}

static struct json_object *pool_stat_domains(struct pool *p)
{
	struct json_object *arr = json_object_new_array();

	for (struct pool_domain *d = p->domains; d; d = d->next) {
		struct json_object *o = json_object_new_object();

		json_object_object_add(o, "name", json_object_new_string(d->name));
		pool_stat_add(o, "clients", d->clients);
		pool_stat_add(o, "pages_shared", d->cnt.pages_shared);
		pool_stat_add(o, "pages_sharing", d->cnt.pages_sharing);
		pool_stat_counters(o, &d->cnt);
		pool_stat_add(o, "bytes_saved",
			      (d->cnt.pages_sharing + d->cnt.zero_pages) * PROTO_PAGE_SIZE);
		json_object_array_add(arr, o);
	}
	return arr;
}

char *pool_stat__json(struct pool *p, bool audit)
{
	struct json_object *o = json_object_new_object();
	uint64_t checked;
	char *out;

	pool_stat_add(o, "pages_shared", p->cnt.pages_shared);
	pool_stat_add(o, "pages_sharing", p->cnt.pages_sharing);
	pool_stat_counters(o, &p->cnt);
	pool_stat_add(o, "bytes_saved", (p->cnt.pages_sharing + p->cnt.zero_pages) * PROTO_PAGE_SIZE);
	pool_stat_add(o, "metadata_bytes", pool_meta_bytes);
	pool_stat_add(o, "store_bytes", p->store.bytes);
	pool_stat_add(o, "store_limit", p->store.limit);
	pool_stat_add(o, "segments", p->store.open_segs);
	pool_stat_add(o, "segment_pages", p->store.seg_pages);
	pool_stat_add(o, "live_slots", p->store.live);
	pool_stat_add(o, "index_entries", p->index.n);
	pool_stat_add(o, "merges_per_sec", p->merges_per_sec);
	pool_stat_add(o, "merge_latency_us", p->lat_n ? p->lat_sum_ns / p->lat_n / 1000 : 0);
	pool_stat_add(o, "clients", p->nhello);
	pool_stat_add(o, "uptime_s", (util_now_ns() - p->start_ns) / 1000000000ull);
	json_object_object_add(o, "share", json_object_new_string(
				       p->conf.share == POOL_SHARE_NONE ? "none" : "domain"));
	if (audit) {
		struct json_object *bad = pool_stat_audit(p, &checked);

		pool_stat_add(o, "audit_checked", checked);
		pool_stat_add(o, "audit_mismatches", json_object_array_length(bad));
		json_object_object_add(o, "audit_bad_slots", bad);
	}
	json_object_object_add(o, "client_list", pool_stat_clients(p));
	json_object_object_add(o, "domains", pool_stat_domains(p));
	out = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
	return out;
}

/* --- the stat subcommand ------------------------------------------------- */

static int pool_stat_fetch(const char *path, bool audit, char **out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct proto_stat_req req;
	char *buf = malloc(PROTO_MSG_MAX), *text = NULL;
	size_t used = 0;
	int fd, ret;

	proto_hdr_init(&req.hdr, PROTO_MSG_STAT_REQ, sizeof(req),
		       PROTO_STAT_JSON | (audit ? PROTO_STAT_AUDIT : 0));
	if (!buf)
		return -ENOMEM;
	if (strlen(path) >= sizeof(sa.sun_path)) {
		free(buf);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    send(fd, &req, sizeof(req), MSG_NOSIGNAL) != sizeof(req)) {
		ret = -errno;
		goto out;
	}
	for (;;) {
		struct proto_hdr *h = (struct proto_hdr *)buf;
		ssize_t n = recv(fd, buf, PROTO_MSG_MAX, 0);
		char *t;

		if (n < (ssize_t)sizeof(*h) || h->magic != PROTO_MAGIC ||
		    h->type != PROTO_MSG_STAT_REPLY || h->len != (size_t)n) {
			ret = n < 0 ? -errno : -EPROTO;
			goto out;
		}
		t = realloc(text, used + (size_t)n);
		if (!t) {
			ret = -ENOMEM;
			goto out;
		}
		text = t;
		memcpy(text + used, buf + sizeof(*h), (size_t)n - sizeof(*h));
		used += (size_t)n - sizeof(*h);
		text[used] = '\0';
		if (!(h->flags & PROTO_STAT_MORE))
			break;
	}
	*out = text;
	text = NULL;
	ret = 0;
out:
	if (fd >= 0)
		close(fd);
	free(text);
	free(buf);
	return ret;
}

static uint64_t pool_stat_get(struct json_object *o, const char *key)
{
	struct json_object *v;

	return json_object_object_get_ex(o, key, &v) ? (uint64_t)json_object_get_int64(v) : 0;
}

static const char *pool_stat_str(struct json_object *o, const char *key)
{
	struct json_object *v;

	return json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : "";
}

static void pool_stat_print(struct json_object *o)
{
	static const char *const global[] = {
		"pages_shared", "pages_sharing", "candidates", "uploads", "upload_mismatches",
		"zero_pages", "bytes_saved", "metadata_bytes", "store_bytes", "segments", "merges",
		"merges_per_sec", "merge_latency_us", "errors", "nospace", "clients",
		"audit_checked", "audit_mismatches",
	};
	struct json_object *arr;

	for (size_t i = 0; i < ARRAY_SIZE(global); i++) {
		if (!strncmp(global[i], "audit", 5) && !json_object_object_get_ex(o, global[i], NULL))
			continue;
		printf("%-18s %llu\n", global[i], (unsigned long long)pool_stat_get(o, global[i]));
	}
	if (json_object_object_get_ex(o, "client_list", &arr) && json_object_array_length(arr)) {
		printf("\n%5s %8s %-16s %-12s %4s %10s %10s %8s %8s %7s\n", "id", "pid", "name",
		       "domain", "conn", "mapped", "cands", "uploads", "zero", "errors");
		for (size_t i = 0; i < json_object_array_length(arr); i++) {
			struct json_object *c = json_object_array_get_idx(arr, i), *v;
			bool conn = json_object_object_get_ex(c, "connected", &v) &&
				    json_object_get_boolean(v);

			printf("%5llu %8llu %-16s %-12s %4s %10llu %10llu %8llu %8llu %7llu\n",
			       (unsigned long long)pool_stat_get(c, "id"),
			       (unsigned long long)pool_stat_get(c, "pid"), pool_stat_str(c, "name"),
			       pool_stat_str(c, "domain"), conn ? "yes" : "no",
			       (unsigned long long)pool_stat_get(c, "pages_mapped"),
			       (unsigned long long)pool_stat_get(c, "candidates"),
			       (unsigned long long)pool_stat_get(c, "uploads"),
			       (unsigned long long)pool_stat_get(c, "zero_pages"),
			       (unsigned long long)pool_stat_get(c, "errors"));
		}
	}
	if (json_object_object_get_ex(o, "domains", &arr) && json_object_array_length(arr)) {
		printf("\n%-16s %7s %12s %13s %10s %12s\n", "domain", "clients", "pages_shared",
		       "pages_sharing", "cands", "bytes_saved");
		for (size_t i = 0; i < json_object_array_length(arr); i++) {
			struct json_object *d = json_object_array_get_idx(arr, i);

			printf("%-16s %7llu %12llu %13llu %10llu %12llu\n", pool_stat_str(d, "name"),
			       (unsigned long long)pool_stat_get(d, "clients"),
			       (unsigned long long)pool_stat_get(d, "pages_shared"),
			       (unsigned long long)pool_stat_get(d, "pages_sharing"),
			       (unsigned long long)pool_stat_get(d, "candidates"),
			       (unsigned long long)pool_stat_get(d, "bytes_saved"));
		}
	}
}

int pool_stat__cli(int argc, char **argv)
{
	const char *path = "/run/pvisor/pool.sock";
	bool json = false, audit = false;
	struct json_object *o;
	char *text = NULL;
	int ret;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = true;
		} else if (!strcmp(argv[i], "--audit")) {
			audit = true;
		} else if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
			path = argv[++i];
		} else if (!strncmp(argv[i], "--socket=", 9)) {
			path = argv[i] + 9;
		} else if (!strcmp(argv[i], "--help")) {
			printf("usage: pvisor-pool stat [--socket PATH] [--json] [--audit]\n"
			       "  --socket PATH  pool control socket (default: %s)\n"
			       "  --json         print the raw JSON\n"
			       "  --audit        rehash every stored page and report changed ones\n",
			       path);
			return 0;
		} else {
			log_die(2, "stat: unknown argument '%s' (see stat --help)", argv[i]);
		}
	}
	ret = pool_stat_fetch(path, audit, &text);
	if (ret) {
		fprintf(stderr, "pvisor-pool stat: no pool running at %s: %s\n", path, strerror(-ret));
		return 1;
	}
	if (json) {
		printf("%s\n", text);
		free(text);
		return 0;
	}
	o = json_tokener_parse(text);
	free(text);
	if (!o) {
		fprintf(stderr, "pvisor-pool stat: the pool sent bad JSON\n");
		return 1;
	}
	pool_stat_print(o);
	json_object_put(o);
	return 0;
}
