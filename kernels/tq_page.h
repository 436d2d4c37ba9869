/* tq_page.h — the paged KV layout, defined once for C (kernels, daemon pool,
 * tests) and CUDA: fixed-width types, inline offset helpers and
 * static_asserts only.
 *
 * A page holds `page_tokens` consecutive tokens of one (session, layer) for
 * all KV heads, keys first, then values:
 *
 *   offset 0:        K  [n_kv_heads][page_tokens][k_block_bytes]
 *   offset v_offset: V  [n_kv_heads][page_tokens][v_block_bytes]
 *   v_offset = K bytes rounded up to TQ_PAGE_ALIGN; page bytes = V end
 *   rounded up to TQ_PAGE_ALIGN.
 *
 * Blocks are the codec blocks of tq_layout.h (K and V may use different
 * codecs).  One KV head's run of tokens inside a page is contiguous, so a
 * kernel streams [page_tokens][block_bytes] per head and page.  Token t of the
 * layer lives in page t / page_tokens at slot t % page_tokens; slots at or past
 * the layer's token count are unused (their bytes are never read).
 *
 * A page table lists one layer's pages in token order.  Page bases are
 * TQ_PAGE_ALIGN-aligned (the pool allocates whole pages); on CUDA they are
 * device pointers.
 */
#ifndef TQ_PAGE_H
#define TQ_PAGE_H

#include <stdint.h>
#ifndef __cplusplus
#include <assert.h> /* static_assert */
#endif

#if defined(__CUDACC__)
#define TQ_PAGE_FN static inline __host__ __device__
#else
#define TQ_PAGE_FN static inline
#endif

#define TQ_PAGE_LAYOUT_ID  1u         /* bumped whenever the layout below changes:  */
					/* spilled pages record it (daemon/spill.h)    */
#define TQ_PAGE_ALIGN      64u        /* cache line; also the alignment of v_offset */
#define TQ_PAGE_TOKENS_MAX 65536u     /* tokens per page, upper bound */
#define TQ_KV_HEADS_MAX    1024u

/* The geometry of every page of one (session, layer). */
struct tq_page_geom {
	uint32_t n_kv_heads;      /* 1 .. TQ_KV_HEADS_MAX                       */
	uint32_t page_tokens;     /* 1 .. TQ_PAGE_TOKENS_MAX tokens per page     */
	uint32_t k_block_bytes;   /* tq_block_bytes(k codec, dim)               */
	uint32_t v_block_bytes;   /* tq_block_bytes(v codec, dim)               */
};

/* One layer's pages, in token order. */
struct tq_page_table {
	const uint8_t *const *pages; /* [n_pages] page bases, each tq_page_bytes() long */
	uint32_t n_pages;            /* >= tq_page_count(geom, n_tokens)            */
	uint32_t n_tokens;           /* the layer's KV length (tokens 0..n_tokens-1) */
	struct tq_page_geom geom;
};

TQ_PAGE_FN uint64_t tq_page_round_up(uint64_t x)
{
	return (x + (TQ_PAGE_ALIGN - 1u)) & ~(uint64_t)(TQ_PAGE_ALIGN - 1u);
}

/* Bytes of the K region: [n_kv_heads][page_tokens][k_block_bytes]. */
TQ_PAGE_FN uint64_t tq_page_k_bytes(const struct tq_page_geom *g)
{
	return (uint64_t)g->n_kv_heads * g->page_tokens * g->k_block_bytes;
}

/* Offset of the V region (K bytes rounded up to TQ_PAGE_ALIGN). */
TQ_PAGE_FN uint64_t tq_page_v_offset(const struct tq_page_geom *g)
{
	return tq_page_round_up(tq_page_k_bytes(g));
}

/* Bytes of one page (a multiple of TQ_PAGE_ALIGN). */
TQ_PAGE_FN uint64_t tq_page_bytes(const struct tq_page_geom *g)
{
	return tq_page_round_up(tq_page_v_offset(g) +
				(uint64_t)g->n_kv_heads * g->page_tokens * g->v_block_bytes);
}

/* Offset of the K block of (head, slot) in a page; slot < page_tokens. */
TQ_PAGE_FN uint64_t tq_page_k_off(const struct tq_page_geom *g, uint32_t head, uint32_t slot)
{
	return ((uint64_t)head * g->page_tokens + slot) * g->k_block_bytes;
}

/* Offset of the V block of (head, slot) in a page. */
TQ_PAGE_FN uint64_t tq_page_v_off(const struct tq_page_geom *g, uint32_t head, uint32_t slot)
{
	return tq_page_v_offset(g) + ((uint64_t)head * g->page_tokens + slot) * g->v_block_bytes;
}

/* Pages needed for n_tokens tokens. */
TQ_PAGE_FN uint32_t tq_page_count(const struct tq_page_geom *g, uint32_t n_tokens)
{
	return (uint32_t)(((uint64_t)n_tokens + g->page_tokens - 1u) / g->page_tokens);
}

/* 1 if the geometry is within bounds (block sizes > 0, counts in range). */
TQ_PAGE_FN int tq_page_geom_valid(const struct tq_page_geom *g)
{
	return g->n_kv_heads >= 1u && g->n_kv_heads <= TQ_KV_HEADS_MAX &&
	       g->page_tokens >= 1u && g->page_tokens <= TQ_PAGE_TOKENS_MAX &&
	       g->k_block_bytes >= 1u && g->k_block_bytes <= 4u * 512u &&
	       g->v_block_bytes >= 1u && g->v_block_bytes <= 4u * 512u;
}

/* C11 (assert.h) and C++ (the keyword, for the .cu files) alike */
static_assert(sizeof(struct tq_page_geom) == 16, "tq_page_geom is four u32");
static_assert(TQ_PAGE_ALIGN == 64u && (TQ_PAGE_ALIGN & (TQ_PAGE_ALIGN - 1u)) == 0, "page alignment");
/* Worst case (1024 heads x 65536 tokens x 2048-byte f32 blocks at d = 512, K and
 * V) stays well inside uint64_t offsets. */
static_assert((uint64_t)TQ_KV_HEADS_MAX * TQ_PAGE_TOKENS_MAX * 2048u * 2u < ((uint64_t)1 << 50),
	      "page offsets fit in 64 bits");

#endif /* TQ_PAGE_H */
