/* tq_attn.h — attention over one layer's compressed, paged KV cache (CPU).
 *
 *   out[i][h] = Σ_t softmax_t(scale · q[i][h] · k[t][h / G]) · v[t][h / G]
 *
 * over the keys t visible to query i (t <= q_pos[i] when causal, all
 * kv_len keys otherwise), G = n_q_heads / n_kv_heads (GQA).  K and V blocks
 * are read from the pages (tq_page.h) through their codecs, which may differ
 * and carry their own rotations.
 *
 * Two implementations with the same contract and the same validation:
 *   tq_attend      the fused path: q rotated once into the key frame; scores
 *                  from codebook lookups; online softmax per chunk of 32
 *                  tokens; values accumulated in the value frame; one
 *                  inverse rotation per query head; the query heads of a GQA
 *                  group share each decoded key and value; long contexts
 *                  split across the pool (split-K, log-sum-exp merge).
 *                  Scalar, AVX2+FMA and AVX-512 paths, chosen at run time.
 *   tq_attend_ref  the oracle: every block decoded with tq_decode_ref, then
 *                  exact attention with double accumulators.
 * They agree to about 1e-6 of the output norm (the tests hold them to 1e-4).
 *
 * Thread safety: both functions are reentrant; the parameters are only read.
 * Concurrent calls need their own workspace (or NULL); calls sharing a pool
 * are serialized by the pool (tq_threads.h), so daemon workers that must not
 * wait for each other should each own a pool.  Nothing here logs or keeps
 * global state.
 */
#ifndef TQ_ATTN_H
#define TQ_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "tq_codec.h"
#include "tq_page.h"
#include "tq_threads.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TQ_ATTN_MAX_Q     65536   /* query tokens per call                 */
#define TQ_ATTN_MAX_HEADS 1024    /* n_q_heads                             */

/* What sparse-V did in a call, per (KV head, row tile): chunks of keys whose
 * values were accumulated, and those skipped.  Added to, never reset. */
struct tq_attn_stats {
	uint64_t v_chunks;           /* value chunks the call reached (run or skipped) */
	uint64_t v_skipped;          /* of them, skipped by sparse_v                   */
};

struct tq_attn_params {
	/* codecs of the layer (same dim); blocks must match kv->geom */
	const tq_codec *k_codec;
	const tq_codec *v_codec;
	int n_q_heads;               /* multiple of kv->geom.n_kv_heads            */

	const struct tq_page_table *kv; /* the layer: pages, geometry, kv_len    */

	int n_q;                     /* query tokens, 0 .. TQ_ATTN_MAX_Q           */
	const void *q;               /* [n_q][n_q_heads][dim] of q_dtype           */
	enum tq_dtype q_dtype;       /* f32, f16 or bf16; NaN/Inf -> -EINVAL       */
	const int32_t *q_pos;        /* [n_q] positions; required when causal,     */
				     /* each in [0, kv_len) (else -EINVAL)          */
	int causal;                  /* 1: query i sees keys t <= q_pos[i]         */
	float scale;                 /* softmax scale; 0 means 1/sqrt(dim)         */
	float sparse_v;              /* skip values (decode and accumulation) as   */
				     /* long as, for every head of the group, the  */
				     /* weight skipped stays at most this fraction */
				     /* of the row's attention mass: the output    */
				     /* moves by at most sparse_v x max |v|; 0 =   */
				     /* off (exact).  Fused paths only (CPU, GPU). */
	struct tq_attn_stats *stats; /* NULL, or counts added to (atomically: one */
				     /* call's threads, or several calls, share); */
				     /* the oracle leaves them; tqc_attend counts  */
				     /* only with sparse_v > 0 (tq_cuda.h)         */

	float *out;                  /* [n_q][n_q_heads][dim] fp32                 */

	enum tq_isa isa;             /* TQ_ISA_AUTO = tq_isa_best() (TQ_ISA env    */
				     /* caps it); a pinned ISA the CPU lacks       */
				     /* (tq_attn_isa_supported) is -EOPNOTSUPP      */
	tq_threads *threads;         /* NULL: everything on the calling thread     */
	int plan_n_q;                /* 0, or n_q .. TQ_ATTN_MAX_Q: split the keys */
				     /* across the pool as for plan_n_q queries.   */
				     /* With sparse_v off nothing else of a call   */
				     /* changes a row's bits, so passes over parts */
				     /* of one call's queries, each with plan_n_q  */
				     /* = the whole count, give the call's bits    */
	void *workspace;             /* NULL: allocated per call (-ENOMEM)         */
	size_t workspace_bytes;      /* >= tq_attn_workspace_bytes() if given      */
};

/* Fused attention.  0, or -EINVAL (bad shapes, codecs, positions, non-finite
 * queries, plan_n_q; err says which), -EOPNOTSUPP (ISA), -ENOMEM, -ENOSPC
 * (workspace too small).  With kv_len == 0 and no causal mask the output is
 * zeros.  Finite inputs whose logits leave float range (|q·k|·scale beyond
 * 3.4e38, to ±inf or NaN, for any key a row sees) give that row NaN, on
 * every ISA and codec, never a plausible wrong number: check outputs where
 * that matters (tqkvd answers NONFINITE).  On error `out` may be partly
 * written. */
int tq_attend(const struct tq_attn_params *p, tq_error *err);

/* Workspace tq_attend needs for these parameters and the pool in p->threads
 * (the same value for any q/out contents): > 0 bytes, or a negative errno. */
long tq_attn_workspace_bytes(const struct tq_attn_params *p, tq_error *err);

/* 1 if tq_attend can run `isa` pinned on this CPU (AUTO: always).  The
 * attention paths need only the CPU features, not the codec's SIMD paths. */
int tq_attn_isa_supported(enum tq_isa isa);
/* The ISA's name with the optional extensions its attention uses on this
 * CPU ("avx512+vnni", "avx2+avxvnni", "neon+dotprod"; else the name): what
 * benchmarks print, as these change the key scoring's speed. */
const char *tq_attn_isa_label(enum tq_isa isa);

/* The oracle (slow, allocates; ignores isa, threads, plan_n_q, workspace,
 * sparse_v, stats). */
int tq_attend_ref(const struct tq_attn_params *p, tq_error *err);

#ifdef __cplusplus
}
#endif
#endif /* TQ_ATTN_H */
