/* test_ring_abi — proto/tqkv_ring.h: layouts, seeds, status strings. */
#include <errno.h>
#include <string.h>

#include "harness.h"
#include "tqkv_ring.h"

static void test_layout(void)
{
	struct tqkv_ring_layout l;

	T_EQ(tqkv_ring_layout(64, 128, 1u << 20, &l), 0);
	T_EQ(l.sq_off, 4096);
	T_EQ(l.cq_off, 4096 + 64 * 128);
	T_EQ(l.arena_off % TQKV_RING_ALIGN, 0);
	T_ASSERT(l.arena_off >= l.cq_off + 128 * 32);
	T_EQ(l.total_bytes, l.arena_off + (1u << 20));
	/* arena rounded up to whole pages */
	T_EQ(tqkv_ring_layout(1, 1, 1, &l), 0);
	T_EQ(l.total_bytes - l.arena_off, 4096);
	/* bounds */
	T_EQ(tqkv_ring_layout(3, 8, 4096, &l), -EINVAL);          /* not a power of two */
	T_EQ(tqkv_ring_layout(16, 8, 4096, &l), -EINVAL);         /* cq < sq */
	T_EQ(tqkv_ring_layout(8192, 8192, 4096, &l), -EINVAL);    /* sq too deep */
	T_EQ(tqkv_ring_layout(8, 8, 0, &l), -EINVAL);
	T_EQ(tqkv_ring_layout(8, 8, TQKV_ARENA_BYTES_MAX + 1, &l), -EINVAL);
	T_EQ(tqkv_ring_layout(TQKV_SQ_ENTRIES_MAX, TQKV_CQ_ENTRIES_MAX, TQKV_ARENA_BYTES_MAX, &l), 0);
}

static void test_lines(void)
{
	/* each writer's words on its own cache line */
	size_t client[] = { offsetof(struct tqkv_ring_hdr, sq_tail), offsetof(struct tqkv_ring_hdr, cq_head) };
	size_t daemon[] = { offsetof(struct tqkv_ring_hdr, sq_head), offsetof(struct tqkv_ring_hdr, cq_tail),
			    offsetof(struct tqkv_ring_hdr, state) };
	for (size_t i = 0; i < 2; i++)
		for (size_t j = 0; j < 3; j++)
			T_ASSERT(client[i] / 64 != daemon[j] / 64);
	T_ASSERT(offsetof(struct tqkv_ring_hdr, sq_head) / 64 != offsetof(struct tqkv_ring_hdr, cq_tail) / 64);
}

static void test_seed(void)
{
	/* pinned values: persistence depends on them never changing */
	T_ASSERT(tqkv_seed_derive(0, 0, 0) == UINT64_C(0xe220a8397b1dcdaf));
	T_ASSERT(tqkv_seed_derive(1, 2, 1) != tqkv_seed_derive(1, 2, 0));
	T_ASSERT(tqkv_seed_derive(1, 2, 1) != tqkv_seed_derive(1, 3, 1));
	T_ASSERT(tqkv_seed_derive(1, 2, 1) != tqkv_seed_derive(2, 2, 1));
	/* distinct over a grid */
	uint64_t v[64];
	int n = 0;
	for (uint32_t l = 0; l < 32; l++)
		for (uint32_t k = 0; k < 2; k++)
			v[n++] = tqkv_seed_derive(42, l, k);
	for (int i = 0; i < n; i++)
		for (int j = 0; j < i; j++)
			T_ASSERT(v[i] != v[j]);
}

static void test_status(void)
{
	for (uint32_t s = 0; s < TQKV_ST__COUNT; s++) {
		T_ASSERT(tqkv_status_str(s) != NULL);
		T_ASSERT(strcmp(tqkv_status_str(s), "unknown status") != 0);
	}
	T_ASSERT(!strcmp(tqkv_status_str(TQKV_ST__COUNT), "unknown status"));
	T_ASSERT(!strcmp(tqkv_status_str(0xffff), "unknown status"));
}

int main(void)
{
	T_RUN(test_layout);
	T_RUN(test_lines);
	T_RUN(test_seed);
	T_RUN(test_status);
	return t_done();
}
