/* t-util.c: the FIFO grower keeps items in order across the wrap, and fails without losing any. */
#include <stdio.h>
#include <stdlib.h>

#include "util.h"

static int failures;
#define T_CHECK(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

int main(void)
{
	uint32_t *q = NULL, cap = 0, head = 0, len = 0, next = 0, want = 0;

	/* Push 5000 and pop 3 of every 4, so the ring wraps before each growth. */
	for (int round = 0; round < 5000; round++) {
		if (len == cap)
			T_CHECK(util_fifo_grow((void **)&q, &cap, &head, len, sizeof(*q), 4) == 0);
		q[(head + len++) % cap] = next++;
		if (round % 4 != 3 && len) {
			T_CHECK(q[head] == want);
			want++;
			head = (head + 1) % cap;
			len--;
		}
	}
	T_CHECK(cap >= 4 && (cap & (cap - 1)) == 0);
	for (; len; len--, head = (head + 1) % cap, want++)
		T_CHECK(q[head] == want);
	T_CHECK(want == next);
	free(q);
	return failures ? 1 : 0;
}
