/* mem.c: guest RAM allocation, bounds-checked access and the choice of dedup mode. */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dedup.h"
#include "log.h"
#include "mem.h"
#include "proto.h"

static uint64_t vmm_mem_read_u64(const char *path, uint64_t def)
{
	char buf[64];
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return def;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return def;
	buf[n] = '\0';
	return strtoull(buf, NULL, 10);
}

static int vmm_mem_check_cfg(const struct vmm_mem_cfg *cfg)
{
	if (!cfg->size || cfg->size % PROTO_PAGE_SIZE) {
		log_err("mem: guest size %llu is not a positive multiple of 4096",
			(unsigned long long)cfg->size);
		return -EINVAL;
	}
	if (cfg->size / PROTO_PAGE_SIZE > PROTO_MAX_GUEST_PAGES) {
		log_err("mem: guest size %llu exceeds the limit of %llu pages",
			(unsigned long long)cfg->size, (unsigned long long)PROTO_MAX_GUEST_PAGES);
		return -EINVAL;
	}
	if (cfg->dedup != VMM_DEDUP_PHYSICAL && cfg->dedup != VMM_DEDUP_KSM &&
	    cfg->dedup != VMM_DEDUP_OFF)
		return -EINVAL;
	if (cfg->dedup == VMM_DEDUP_PHYSICAL && (!cfg->pool_path || !cfg->pool_path[0])) {
		log_err("mem: dedup=physical needs a pool socket path");
		return -EINVAL;
	}
	if (cfg->cpu_pct > 100)
		return -EINVAL;
	return 0;
}

static int vmm_mem_dup_strings(struct vmm_mem *m, const struct vmm_mem_cfg *cfg)
{
	m->pool_path = strdup(cfg->pool_path ? cfg->pool_path : "");
	m->domain = strdup(cfg->domain && cfg->domain[0] ? cfg->domain : "default");
	m->name = strdup(cfg->name && cfg->name[0] ? cfg->name : "pvisor");
	if (!m->pool_path || !m->domain || !m->name)
		return -ENOMEM;
	if (strlen(m->domain) >= PROTO_DOMAIN_MAX || strlen(m->name) >= PROTO_DOMAIN_MAX) {
		log_err("mem: domain and name must be shorter than %d bytes", PROTO_DOMAIN_MAX);
		return -EINVAL;
	}
	return 0;
}

static void vmm_mem_free(struct vmm_mem *m)
{
	if (m->ram)
		munmap(m->ram, m->size);
	pthread_mutex_destroy(&m->stats_lock);
	free(m->pool_path);
	free(m->domain);
	free(m->name);
	free(m);
}

int vmm_mem__create(struct vmm_mem **out, const struct vmm_mem_cfg *cfg)
{
	struct vmm_mem *m;
	void *ram;
	int ret;

	ret = vmm_mem_check_cfg(cfg);
	if (ret)
		return ret;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	pthread_mutex_init(&m->stats_lock, NULL);
	m->size = cfg->size;
	m->pages = cfg->size / PROTO_PAGE_SIZE;
	m->mode = cfg->dedup;
	m->cpu_pct = cfg->cpu_pct ? cfg->cpu_pct : 100;
	m->vma_budget = cfg->vma_budget;
	m->pub.pages = m->pages;
	ret = vmm_mem_dup_strings(m, cfg);
	if (ret)
		goto err;

	ram = mmap(NULL, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		   -1, 0);
	if (ram == MAP_FAILED) {
		ret = -errno;
		log_err("mem: cannot map %llu bytes of guest RAM: %s",
			(unsigned long long)m->size, strerror(errno));
		goto err;
	}
	m->ram = ram;

	if (m->mode == VMM_DEDUP_PHYSICAL) {
		/* Sharing is per 4 KiB page; a THP would be split at the first remap anyway. */
		if (madvise(m->ram, m->size, MADV_NOHUGEPAGE))
			log_warn("mem: MADV_NOHUGEPAGE: %s", strerror(errno));
		ret = vmm_dedup__create(m, &m->dd);
		if (ret)
			goto err;
	}
	*out = m;
	return 0;
err:
	vmm_mem_free(m);
	return ret;
}

void vmm_mem__set_vcpus(struct vmm_mem *m, const struct vmm_mem_vcpus *v)
{
	if (!m->started)
		m->vcpus = *v;
}

int vmm_mem__start(struct vmm_mem *m)
{
	static bool ksm_warned;
	int ret = 0;

	if (m->started)
		return 0;
	switch (m->mode) {
	case VMM_DEDUP_PHYSICAL:
		ret = vmm_dedup__start(m->dd);
		break;
	case VMM_DEDUP_KSM:
		if (madvise(m->ram, m->size, MADV_MERGEABLE)) {
			ret = -errno;
			log_err("mem: MADV_MERGEABLE: %s", strerror(errno));
			break;
		}
		if (vmm_mem_read_u64("/sys/kernel/mm/ksm/run", 0) != 1 && !ksm_warned) {
			ksm_warned = true;
			log_warn("mem: /sys/kernel/mm/ksm/run is not 1: KSM will merge nothing");
		}
		break;
	case VMM_DEDUP_OFF:
		break;
	}
	if (!ret)
		m->started = true;
	return ret;
}

void vmm_mem__stop(struct vmm_mem *m)
{
	if (m && m->dd)
		vmm_dedup__stop(m->dd);
}

void vmm_mem__destroy(struct vmm_mem *m)
{
	if (!m)
		return;
	if (m->dd)
		vmm_dedup__destroy(m->dd);
	vmm_mem_free(m);
}

uint64_t vmm_mem__size(const struct vmm_mem *m)
{
	return m->size;
}

void *vmm_mem__hva(struct vmm_mem *m, gpa_t gpa, uint64_t len)
{
	if (gpa.v > m->size || len > m->size - gpa.v)
		return NULL;
	return m->ram + gpa.v;
}

void vmm_mem__hint(struct vmm_mem *m, gpa_t gpa, uint64_t len)
{
	uint64_t first, last;

	if (!len || gpa.v >= m->size)
		return;
	if (len > m->size - gpa.v)
		len = m->size - gpa.v;
	first = gpa.v / PROTO_PAGE_SIZE;
	last = (gpa.v + len - 1) / PROTO_PAGE_SIZE;
	__atomic_add_fetch(&m->pages_hinted, last - first + 1, __ATOMIC_RELAXED);
	if (m->dd)
		vmm_dedup__hint(m->dd, first, last - first + 1);
}

/* Clip [gpa, gpa+len) to guest RAM as pages; false if nothing is left. */
static bool vmm_mem_pages(const struct vmm_mem *m, gpa_t gpa, uint64_t len, uint64_t *first,
			  uint64_t *n)
{
	if (!len || gpa.v >= m->size)
		return false;
	if (len > m->size - gpa.v)
		len = m->size - gpa.v;
	*first = gpa.v / PROTO_PAGE_SIZE;
	*n = (gpa.v + len - 1) / PROTO_PAGE_SIZE - *first + 1;
	return true;
}

void vmm_mem__dma_begin(struct vmm_mem *m, gpa_t gpa, uint64_t len)
{
	uint64_t first, n;

	if (m->dd && vmm_mem_pages(m, gpa, len, &first, &n))
		vmm_track__dma_begin(m->dd, first, n);
}

void vmm_mem__dev_enter(struct vmm_mem *m)
{
	if (m->dd)
		pthread_mutex_lock(&m->dd->dev_lock);
}

void vmm_mem__dev_leave(struct vmm_mem *m)
{
	if (m->dd)
		pthread_mutex_unlock(&m->dd->dev_lock);
}

void vmm_mem__dma_end(struct vmm_mem *m, gpa_t gpa, uint64_t len)
{
	uint64_t first, n;

	if (m->dd && vmm_mem_pages(m, gpa, len, &first, &n))
		vmm_track__dma_end(m->dd, first, n);
}

/* KSM keeps its own per-process count of merged pages. */
static void vmm_mem_ksm_stats(struct vmm_mem_stats *out)
{
	char buf[512], *p;
	ssize_t n;
	int fd = open("/proc/self/ksm_stat", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	p = strstr(buf, "ksm_merging_pages ");
	if (p)
		out->pages_shared = strtoull(p + strlen("ksm_merging_pages "), NULL, 10);
	out->bytes_saved = out->pages_shared * PROTO_PAGE_SIZE;
}

void vmm_mem__stats(struct vmm_mem *m, struct vmm_mem_stats *out)
{
	pthread_mutex_lock(&m->stats_lock);
	*out = m->pub;
	pthread_mutex_unlock(&m->stats_lock);
	out->pages = m->pages;
	out->pages_hinted = __atomic_load_n(&m->pages_hinted, __ATOMIC_RELAXED);
	if (m->mode == VMM_DEDUP_KSM && m->started)
		vmm_mem_ksm_stats(out);
}

#define VMM_JSON_U64(obj, st, f) json_object_object_add(obj, #f, json_object_new_int64((int64_t)(st).f))

void vmm_mem__stats_json(struct vmm_mem *m, struct json_object *obj)
{
	static const char *const modes[] = { "physical", "ksm", "off" };
	struct vmm_mem_stats st;

	vmm_mem__stats(m, &st);
	json_object_object_add(obj, "dedup", json_object_new_string(modes[m->mode]));
	VMM_JSON_U64(obj, st, pages);
	VMM_JSON_U64(obj, st, pages_private);
	VMM_JSON_U64(obj, st, pages_shared);
	VMM_JSON_U64(obj, st, pages_zero);
	VMM_JSON_U64(obj, st, pages_hashed);
	VMM_JSON_U64(obj, st, merges);
	VMM_JSON_U64(obj, st, merge_fail);
	VMM_JSON_U64(obj, st, cow_breaks);
	VMM_JSON_U64(obj, st, wp_faults);
	VMM_JSON_U64(obj, st, vma_skipped);
	VMM_JSON_U64(obj, st, bytes_saved);
	VMM_JSON_U64(obj, st, merge_ns_last);
	VMM_JSON_U64(obj, st, merge_ns_avg);
	VMM_JSON_U64(obj, st, dedup_cpu_ns);
	json_object_object_add(obj, "pool_connected", json_object_new_boolean(st.pool_connected));
	VMM_JSON_U64(obj, st, pool_reconnects);
	VMM_JSON_U64(obj, st, pages_hinted);
	VMM_JSON_U64(obj, st, pages_pinned);
}
