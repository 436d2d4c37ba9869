/* test_pool — the page pool over the host backend. */
#include <errno.h>
#include <string.h>

#include "harness.h"
#include "pool.h"

static struct pool *mk(uint64_t bytes, uint32_t page, int node)
{
	struct pool_params pp = { .bytes = bytes, .page_bytes = page, .numa_node = node, .hugepages = true };
	struct pool *p = NULL;
	char why[200];
	int r = pool_new(&p, &pp, why, sizeof(why));
	if (r < 0)
		fprintf(stderr, "  pool_new: %s\n", why);
	return p;
}

static void test_alloc_free_all(void)
{
	struct pool *p = mk(4u << 20, 64u << 10, -1);
	uint8_t *pg[64], *extra;
	struct pool_stats st;

	T_ASSERT(p);
	T_EQ(pool_page_bytes(p), 64u << 10);
	T_EQ(pool_pages_free_count(p), 64);
	T_EQ(pool_pages_alloc(p, 64, pg), 0);
	T_EQ(pool_pages_free_count(p), 0);
	/* distinct, aligned, inside one region, writable */
	for (int i = 0; i < 64; i++) {
		T_ASSERT(((uintptr_t)pg[i] & 4095) == 0);
		for (int j = 0; j < i; j++)
			T_ASSERT(pg[i] != pg[j]);
		memset(pg[i], i, 64u << 10);
	}
	for (int i = 0; i < 64; i++)
		T_EQ(pg[i][(64u << 10) - 1], i);
	T_EQ(pool_pages_alloc(p, 1, &extra), -ENOSPC);
	pool_stats(p, &st);
	T_EQ(st.pages_total, 64);
	T_EQ(st.pages_free, 0);
	T_EQ(st.pages_used_peak, 64);
	T_EQ(st.alloc_failures, 1);
	T_ASSERT(!strcmp(st.backend, "host"));
	T_ASSERT(st.resident_bytes >= (4u << 20));
	pool_pages_free(p, pg, 64);
	T_EQ(pool_pages_free_count(p), 64);
	pool_free(p);
}

static void test_all_or_nothing(void)
{
	struct pool *p = mk(1u << 20, 64u << 10, -1); /* 16 pages */
	uint8_t *a[16], *b[16];

	T_ASSERT(p);
	T_EQ(pool_pages_alloc(p, 10, a), 0);
	T_EQ(pool_pages_alloc(p, 7, b), -ENOSPC);
	T_EQ(pool_pages_free_count(p), 6);   /* nothing taken by the failed call */
	T_EQ(pool_pages_alloc(p, 6, b), 0);
	T_EQ(pool_pages_free_count(p), 0);
	/* free in a different order, then everything comes back */
	pool_pages_free(p, b, 6);
	pool_pages_free(p, a + 5, 5);
	pool_pages_free(p, a, 5);
	T_EQ(pool_pages_free_count(p), 16);
	T_EQ(pool_pages_alloc(p, 16, a), 0);
	pool_pages_free(p, a, 16);
	pool_free(p);
}

static void test_params(void)
{
	struct pool_params pp = { .bytes = 1u << 20, .page_bytes = 1000, .numa_node = -1 };
	struct pool *p = NULL;
	char why[200] = "";

	T_EQ(pool_new(&p, &pp, why, sizeof(why)), -EINVAL);
	T_ASSERT(!p && why[0]);
	pp.page_bytes = 64u << 10;
	pp.bytes = 1000;
	T_EQ(pool_new(&p, &pp, why, sizeof(why)), -EINVAL);
	pp.bytes = 1u << 20;
	pp.numa_node = 4095; /* no such node */
	T_EQ(pool_new(&p, &pp, why, sizeof(why)), -ENODEV);
	T_ASSERT(!p);
}

static void test_numa_node0(void)
{
	struct pool *p = mk(2u << 20, 64u << 10, 0);
	struct pool_stats st;
	uint8_t *pg;

	if (!p)
		t_skip("NUMA not available");
	pool_stats(p, &st);
	T_EQ(st.numa_node, 0);
	T_EQ(pool_pages_alloc(p, 1, &pg), 0);
	memset(pg, 1, 64u << 10);
	pool_pages_free(p, &pg, 1);
	pool_free(p);
}

int main(void)
{
	T_RUN(test_alloc_free_all);
	T_RUN(test_all_or_nothing);
	T_RUN(test_params);
	T_RUN(test_numa_node0);
	return t_done();
}
