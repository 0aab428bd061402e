/* dedup.c: the physical-dedup client (stub until the pool client lands). */
#include <errno.h>

#include "dedup.h"

int vmm_dedup__create(struct vmm_mem *m, struct vmm_dedup **out)
{
	return -ENOSYS;
}

int vmm_dedup__start(struct vmm_dedup *dd)
{
	return -ENOSYS;
}

void vmm_dedup__destroy(struct vmm_dedup *dd)
{
}

void vmm_dedup__hint(struct vmm_dedup *dd, uint64_t first, uint64_t n)
{
}
