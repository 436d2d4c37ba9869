/* tq_attn_internal.h — what tq_attn.c shares with its ISA files; not installed.
 *
 * The fused driver (tq_attn.c) walks one KV head's tokens in chunks of at
 * most TQA_CHUNK tokens (a chunk never crosses a page) and, per chunk:
 *   1. decodes the K blocks into a tile in the key frame, unscaled, plus one
 *      scale per token (tq*: the block scale; q8: its scale; others: 1);
 *   2. per block of up to TQA_ROWS query rows (a row = one query token and one
 *      query head of the GQA group): scores, causal mask, online softmax;
 *   3. decodes the V blocks into a tile in the value frame (none of them
 *      when sparse-V skips the chunk) and accumulates
 *      acc[r] = acc[r] * alpha[r] + Σ_t w[t][r] v[t] with w = p · vscale.
 * Scores are kept in base 2: q is pre-multiplied by scale · log2(e).
 */
#ifndef TQ_ATTN_INTERNAL_H
#define TQ_ATTN_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "tq_internal.h"

#define TQA_CHUNK 32   /* tokens per tile                               */
#define TQA_ROWS  4    /* query rows per register block                 */
#define TQA_QPREP_BYTES 2048 /* qprep_d128's output, at most              */
#define TQA_KTILE_BYTES (TQA_CHUNK * 264) /* ktile_d128's output, at most */

/* Paced software prefetch.  tq_attn.c points the calling thread's cursor
 * at the chunk ahead that it prefetches (its K blocks, then its V blocks);
 * the register-direct d = 128 kernels of an ISA whose ops set pf_paced
 * advance it by one line per step of their token loops (TQA_PF_STEP), so
 * the lines go out spread over the chunk's work: issued in a few bursts,
 * the prefetches filled the core's miss buffers and the thread stalled on
 * them instead of computing (BENCHMARKS.md 2, "Prefetch at the kernels'
 * pace").  What the kernels leave, the driver issues when it moves the
 * cursor on.  Only ever read and written by its own thread. */
struct tqa_pf {
	const uint8_t *p[2];   /* K blocks, then V blocks                */
	size_t n[2];           /* bytes of each                          */
	size_t o;              /* next line's offset in p[i]             */
	int i;                 /* 0, 1: the range in progress; 2: done   */
};
/* The calling thread's cursor.  Initial-exec TLS, so a step addresses it
 * %fs-relative and holds no register in the loops (a pointer to it, taken
 * once per kernel call, cost K q8 / V tq4 3-4 % on AVX2); the sanitizers'
 * builds take the default model, as ld cannot relax their accesses. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TQA_PF_TLS
#else
#define TQA_PF_TLS __attribute__((tls_model("initial-exec")))
#endif
extern __thread struct tqa_pf tqa_pf_cur TQA_PF_TLS;
#define TQA_PF_STEP() tqa_pf_step(&tqa_pf_cur)

static inline __attribute__((always_inline)) void tqa_pf_step(struct tqa_pf *f)
{
	if (f->i < 2) {
		__builtin_prefetch(f->p[f->i] + f->o, 0, 2);
		f->o += 64;
		if (f->o >= f->n[f->i]) {
			f->o = 0;
			f->i++;
			if (f->i == 1 && !f->n[1])
				f->i = 2;
		}
	}
}

struct tqa_ops {
	enum tq_isa isa;
	/* 1: every scores_d128, scores_ktile_d128 and accum_d128 kernel paces
	 * the prefetch cursor (tqa_pf_step); 0: tq_attn.c prefetches each
	 * chunk in three bursts itself */
	int pf_paced;
	/* Decode n (1..TQA_CHUNK) consecutive blocks of codec c starting at
	 * src into tile [n][dim] (may return src itself for f32, whose blocks
	 * are already that) and scale[n].  Returns the tile to read. */
	const float *(*decode)(const tq_codec *c, const uint8_t *src, int n,
			       float *tile, float *scale);
	/* s[t][r] = scale[t] * dot(q[r], tile[t]) for t < n, r < TQA_ROWS.
	 * q: [TQA_ROWS][dim] (unused rows may hold anything finite);
	 * s: [TQA_CHUNK][TQA_ROWS].  Entries t >= n are left untouched. */
	void (*scores)(const float *q, const float *tile, const float *scale,
		       int n, int dim, float *s);
	/* Online-softmax step for one row block.  s: [TQA_CHUNK][TQA_ROWS]
	 * scores (base 2); vis[r]: tokens 0..vis[r]-1 of this chunk are visible
	 * to row r (0 <= vis[r] <= n).  Updates m[r] (running max, -inf when
	 * nothing seen yet) and l[r] (running sum), writes alpha[r] (factor
	 * for the old accumulator) and turns s into p = 2^(s - m_new), 0 for
	 * invisible entries, for t < TQA_CHUNK.  A visible score that is not
	 * finite (a logit beyond float range) makes l[r] NaN, which every
	 * later step keeps: the row comes out NaN, never silently wrong. */
	void (*softmax)(float *s, int n, const int *vis, float *m, float *l, float *alpha);
	/* acc[r][:] = acc[r][:] * alpha[r] + Σ_{t<n} w[t][r] vscale[t] tile[t][:]
	 * for r < TQA_ROWS.  acc: [TQA_ROWS][dim]; w: [TQA_CHUNK][TQA_ROWS];
	 * vscale: [n]; tile: [n][dim]. */
	void (*accum)(float *acc, const float *alpha, const float *w, const float *vscale,
		      const float *tile, int n, int dim);

	/* Register-direct variants for dim 128, one row block (decode): the
	 * blocks are decoded in registers and used at once, with no tile.
	 * Indexed by codec id; NULL where a codec has none.
	 *   scores_d128: as decode + scores on the n blocks at src;
	 *   accum_d128:  as decode + accum on the n blocks at src. */
	void (*scores_d128[TQ_CODEC__COUNT])(const tq_codec *c, const uint8_t *src, int n,
					     const float *q, float *s);
	/* Optional, per codec: the query rows' preparation for scores_d128
	 * (e.g. integer rows for integer dot products), once per task and row
	 * block: reads the 4 rows q [TQA_ROWS][128] (rotated, pre-scaled),
	 * writes qp (TQA_QPREP_BYTES, 64-byte aligned); scores_d128 then gets
	 * qp in place of q.  Where a codec has one, its scores_d128 is not
	 * the float dot product: the oracle tolerance still holds (test_attn). */
	void (*qprep_d128[TQ_CODEC__COUNT])(const tq_codec *c, const float *q, void *qp);
	/* Optional, per codec with qprep_d128: a chunk's n key blocks at src
	 * prepared once (e.g. their integer centroids, with qp's tables) into
	 * kt (TQA_KTILE_BYTES, 64-byte aligned), and scores_d128's scores
	 * computed from kt — the same bits — for every row block of a call
	 * with several (prefill), which would otherwise each take the blocks
	 * apart again. */
	void (*ktile_d128[TQ_CODEC__COUNT])(const tq_codec *c, const uint8_t *src, int n, const void *qp,
					    void *kt);
	void (*scores_ktile_d128[TQ_CODEC__COUNT])(const tq_codec *c, const void *kt, int n, const float *qp,
						   float *s);
	void (*accum_d128[TQ_CODEC__COUNT])(const tq_codec *c, const uint8_t *src, int n,
					    float *acc, const float *alpha, const float *w);
	/* Where a codec's accum_d128 keeps acc in an order of its own (the one
	 * its decoder gives for free): position i of each acc row holds dim
	 * accum_d128_perm[c][i].  NULL: dim order.  The driver reorders a row
	 * once, when it finishes it (tq_attn.c: acc_perm, finish_row). */
	const uint8_t *accum_d128_perm[TQ_CODEC__COUNT];
};

/* A uint8_t[128] initializer whose entry p is F(p): the accumulator orders
 * of accum_d128_perm, each given by its formula. */
#define TQA_P4_(F, p) F(p), F((p) + 1), F((p) + 2), F((p) + 3)
#define TQA_P16_(F, p) TQA_P4_(F, p), TQA_P4_(F, (p) + 4), TQA_P4_(F, (p) + 8), TQA_P4_(F, (p) + 12)
#define TQA_ORDER128(F)                                                                  \
	{ TQA_P16_(F, 0), TQA_P16_(F, 16), TQA_P16_(F, 32), TQA_P16_(F, 48),             \
	  TQA_P16_(F, 64), TQA_P16_(F, 80), TQA_P16_(F, 96), TQA_P16_(F, 112) }

extern const struct tqa_ops tqa_ops_scalar;
/* NULL when this build has no such path. */
const struct tqa_ops *tqa_ops_avx2(void);
/* The AVX2 ops with (vnni 1: NULL where the CPU lacks AVX-VNNI) or without
 * its VEX vpdpwssd key scoring, whichever tqa_ops_avx2 picks (tests). */
const struct tqa_ops *tqa_ops_avx2_vnni(int vnni);
const struct tqa_ops *tqa_ops_avx512(void);
/* The AVX-512 ops with (vnni 1: NULL where the CPU lacks it) or without
 * AVX512-VNNI's key scoring, whichever tqa_ops_avx512 picks (tests). */
const struct tqa_ops *tqa_ops_avx512_vnni(int vnni);
const struct tqa_ops *tqa_ops_neon(void);
/* The NEON ops with (dot 1: NULL where the CPU lacks DotProd) or without
 * its integer q8 key scoring, whichever tqa_ops_neon picks (tests). */
const struct tqa_ops *tqa_ops_neon_dot(int dot);

/* The portable decoder (any codec, any dim): used by the scalar ops and as
 * the fallback of the SIMD decoders for dims they do not specialize. */
const float *tqa_decode_scalar(const tq_codec *c, const uint8_t *src, int n,
			       float *tile, float *scale);
/* The factor that maps a codebook (a centroid codec's, or a tq*o half's)
 * to integers of at most lim in magnitude (the integer key scoring's
 * qprep_d128: AVX2, AVX-512). */
static inline float tqa_cb_int_scale(const tq_codebook *cb, float lim)
{
	float cm = 0.0f;

	for (int i = 0; i < cb->levels; i++) {
		const float a = cb->centroid[i] < 0.0f ? -cb->centroid[i] : cb->centroid[i];
		if (a > cm)
			cm = a;
	}
	return cm > 0.0f ? lim / cm : 1.0f;
}

/* The tq*o tile decoders' token loop (tq_layout.h): each block's two
 * halves through half(codebook, bf16 scale as float, the half's planes, h,
 * out), which writes out[j] = scale * centroid[idx_j]; the tile's scale is
 * 1.  Every path's half function gives the portable one's products. */
typedef void (*tqa_tqo_half_fn)(const tq_codebook *cb, float s, const uint8_t *pl, int h, float *o);
static inline void tqa_decode_tqo(const tq_codec *c, const uint8_t *src, int n, float *tile, float *scale,
				  tqa_tqo_half_fn half)
{
	const int h = c->half;

	for (int t = 0; t < n; t++, src += c->block_bytes) {
		uint16_t sa, sb;
		float *o = tile + (size_t)t * c->dim;
		memcpy(&sa, src, 2);
		memcpy(&sb, src + 2, 2);
		half(&c->cb, tq_bf16_to_f32(sa), src + TQ_TQO_HEADER_BYTES, h, o);
		half(&c->cb_b, tq_bf16_to_f32(sb), src + TQ_TQO_HEADER_BYTES + TQ_PLANES_BYTES(h, c->cb.bits), h,
		     o + h);
		scale[t] = 1.0f;
	}
}

/* Portable softmax step (also used by the AVX2 ops). */
void tqa_softmax_scalar(float *s, int n, const int *vis, float *m, float *l, float *alpha);



/* ---- shared by tq_attn.c and tq_attn_ref.c ---- */
#include "tq_attn.h"

/* The checked shape of a call. */
struct tqa_shape {
	int dim;
	int n_kv;             /* KV heads                                   */
	int group;            /* G = n_q_heads / n_kv                       */
	uint32_t kv_len;
	float scale;          /* the softmax scale in effect                */
};

/* Validates everything tq_attend and tq_attend_ref check (both return the
 * same errors); scans q for NaN/Inf.  0 or a negative errno. */
int tqa_validate(const struct tq_attn_params *p, struct tqa_shape *sh, tq_error *err);
/* Row i (query token, head) of q as fp32: dst [dim]. */
void tqa_q_row(const struct tq_attn_params *p, int dim, size_t row, float *dst);
#endif /* TQ_ATTN_INTERNAL_H */
