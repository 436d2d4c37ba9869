/* tq_attn.c — fused attention: validation, ISA dispatch, work split across the
 * pool (row tiles x split-K), the chunk loop, the log-sum-exp merge, and the
 * portable scalar ops.  The per-ISA inner loops are in tq_attn_avx2.c,
 * tq_attn_avx512.c and tq_attn_neon.c; the oracle is tq_attn_ref.c.
 *
 * Work decomposition of one call: per KV head h, the rows are the (query
 * token i, head g of the group) pairs, r = i * G + g, rows_ph = n_q * G of
 * them.  Rows are cut into row tiles of at most RT_MAX rows and the tokens
 * into S splits of split_len tokens; a task is one (h, row tile, split).  Each
 * task keeps its partial (m, l, acc) per row in the workspace; when S > 1 a
 * second pass merges the splits (log-sum-exp), normalizes and applies the
 * V codec's inverse rotation.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tq_attn_internal.h"

#define RT_MAX      128    /* rows per row tile: p buffer + acc stay in L1/L2 */
#define SPLIT_MIN   512    /* tokens per split at least                       */
#define TASKS_PER_THREAD 3 /* split until tasks >= this x threads             */
#define LOG2E 1.4426950408889634

/* ---- validation (shared with the oracle) ---------------------------------- */

int tqa_validate(const struct tq_attn_params *p, struct tqa_shape *sh, tq_error *err)
{
	if (!p || !p->k_codec || !p->v_codec || !p->kv)
		return tq_fail(err, "attention: NULL params, codec or page table");
	const struct tq_page_table *kv = p->kv;
	const struct tq_page_geom *g = &kv->geom;
	int dim = tq_codec_dim(p->k_codec);

	if (tq_codec_dim(p->v_codec) != dim)
		return tq_fail(err, "attention: K dim %d != V dim %d", dim, tq_codec_dim(p->v_codec));
	if (!tq_page_geom_valid(g))
		return tq_fail(err, "attention: page geometry out of range");
	if (g->k_block_bytes != tq_codec_block_bytes(p->k_codec) ||
	    g->v_block_bytes != tq_codec_block_bytes(p->v_codec))
		return tq_fail(err, "attention: page block sizes %u/%u do not match the codecs (%zu/%zu)",
			       g->k_block_bytes, g->v_block_bytes, tq_codec_block_bytes(p->k_codec),
			       tq_codec_block_bytes(p->v_codec));
	if (p->n_q_heads < 1 || p->n_q_heads > TQ_ATTN_MAX_HEADS ||
	    p->n_q_heads % (int)g->n_kv_heads)
		return tq_fail(err, "attention: n_q_heads %d is not a multiple of n_kv_heads %u",
			       p->n_q_heads, g->n_kv_heads);
	if (p->n_q < 0 || p->n_q > TQ_ATTN_MAX_Q)
		return tq_fail(err, "attention: n_q %d out of range", p->n_q);
	if (p->plan_n_q && (p->plan_n_q < p->n_q || p->plan_n_q > TQ_ATTN_MAX_Q))
		return tq_fail(err, "attention: plan_n_q %d is neither 0 nor in [n_q %d, %d]",
			       p->plan_n_q, p->n_q, TQ_ATTN_MAX_Q);
	if (kv->n_pages < tq_page_count(g, kv->n_tokens))
		return tq_fail(err, "attention: %u pages cannot hold %u tokens", kv->n_pages, kv->n_tokens);
	if (kv->n_tokens && !kv->pages)
		return tq_fail(err, "attention: NULL page list");
	for (uint32_t i = 0, np = tq_page_count(g, kv->n_tokens); i < np; i++)
		if (!kv->pages[i])
			return tq_fail(err, "attention: page %u is NULL", i);
	if (!isfinite(p->scale))
		return tq_fail(err, "attention: scale is not finite");
	if (!(p->sparse_v >= 0.0f && p->sparse_v < 1.0f))
		return tq_fail(err, "attention: sparse_v must be in [0, 1)");
	if (p->isa != TQ_ISA_AUTO && p->isa != TQ_ISA_SCALAR && p->isa != TQ_ISA_AVX2 &&
	    p->isa != TQ_ISA_AVX512 && p->isa != TQ_ISA_NEON)
		return tq_fail(err, "attention: unknown isa %d", (int)p->isa);

	sh->dim = dim;
	sh->n_kv = (int)g->n_kv_heads;
	sh->group = p->n_q_heads / (int)g->n_kv_heads;
	sh->kv_len = kv->n_tokens;
	sh->scale = p->scale != 0.0f ? p->scale : (float)(1.0 / sqrt((double)dim));
	if (p->n_q == 0)
		return 0;

	if (!p->q || !p->out)
		return tq_fail(err, "attention: NULL q or out");
	if (!tq_dtype_size(p->q_dtype))
		return tq_fail(err, "attention: unknown query dtype %d", (int)p->q_dtype);
	if (p->causal && !p->q_pos)
		return tq_fail(err, "attention: causal attention needs q_pos");
	if (p->q_pos)
		for (int i = 0; i < p->n_q; i++)
			if (p->q_pos[i] < 0 || (uint32_t)p->q_pos[i] >= kv->n_tokens)
				return tq_fail(err, "attention: query %d at position %d, cache holds %u tokens",
					       i, (int)p->q_pos[i], kv->n_tokens);

	const long bad = tq_first_nonfinite(p->q, p->q_dtype, (size_t)p->n_q * (size_t)p->n_q_heads * (size_t)dim);
	if (bad >= 0) {
		const size_t i = (size_t)bad;
		return tq_fail(err, "attention: query %zu head %zu element %zu is not finite",
			       i / ((size_t)p->n_q_heads * dim), i / dim % (size_t)p->n_q_heads, i % (size_t)dim);
	}
	return 0;
}

void tqa_q_row(const struct tq_attn_params *p, int dim, size_t row, float *dst)
{
	const size_t base = row * (size_t)dim;

	tq_to_f32((const uint8_t *)p->q + base * tq_dtype_size(p->q_dtype), p->q_dtype, (size_t)dim, dst);
}

/* ---- portable ops ------------------------------------------------------------ */

/* One tq*o half, portably: the indices unpacked (by words), then looked
 * up one by one. */
static void tqo_half_scalar(const tq_codebook *cb, float s, const uint8_t *pl, int h, float *o)
{
	uint8_t idx[TQ_DIM_MAX / 2];

	tq_unpack_planes(pl, h, cb->bits, idx);
	for (int j = 0; j < h; j++)
		o[j] = s * cb->centroid[idx[j]];
}

const float *tqa_decode_scalar(const tq_codec *c, const uint8_t *src, int n,
			       float *tile, float *scale)
{
	const int dim = c->dim;
	const size_t bb = c->block_bytes;
	uint8_t idx[TQ_DIM_MAX];

	switch (c->id) {
	case TQ_CODEC_F32:
		for (int t = 0; t < n; t++)
			scale[t] = 1.0f;
		return (const float *)(const void *)src; /* 4-byte aligned: tq_page.h */
	case TQ_CODEC_F16:
		for (int t = 0; t < n; t++, src += bb) {
			for (int j = 0; j < dim; j++) {
				uint16_t h;
				memcpy(&h, src + 2 * j, 2);
				tile[(size_t)t * dim + j] = tq_f16_to_f32(h);
			}
			scale[t] = 1.0f;
		}
		return tile;
	case TQ_CODEC_Q8:
		for (int t = 0; t < n; t++, src += bb) {
			memcpy(&scale[t], src, 4);
			for (int j = 0; j < dim; j++)
				tile[(size_t)t * dim + j] = (float)(int8_t)src[4 + j];
		}
		return tile;
	case TQ_CODEC_Q4A:
		for (int t = 0; t < n; t++, src += bb) {
			uint16_t hs, hm;
			memcpy(&hs, src, 2);
			memcpy(&hm, src + 2, 2);
			float s = tq_f16_to_f32(hs), mn = tq_f16_to_f32(hm);
			tq_unpack_planes(src + 4, dim, 4, idx);
			for (int j = 0; j < dim; j++)
				tile[(size_t)t * dim + j] = mn + s * (float)idx[j];
			scale[t] = 1.0f;
		}
		return tile;
	case TQ_CODEC_TQ3O:
	case TQ_CODEC_TQ4O: /* each half's scale folded into its values */
		tqa_decode_tqo(c, src, n, tile, scale, tqo_half_scalar);
		return tile;
	default: /* tq2 / tq3 / tq4 */
		for (int t = 0; t < n; t++, src += bb) {
			memcpy(&scale[t], src, 4);
			tq_unpack_planes(src + 4, dim, c->bits, idx);
			for (int j = 0; j < dim; j++)
				tile[(size_t)t * dim + j] = c->cb.centroid[idx[j]];
		}
		return tile;
	}
}

static void scores_scalar(const float *q, const float *tile, const float *scale,
			  int n, int dim, float *s)
{
	const float *q0 = q, *q1 = q + dim, *q2 = q + 2 * dim, *q3 = q + 3 * dim;

	for (int t = 0; t < n; t++) {
		const float *k = tile + (size_t)t * dim;
		float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f; /* 4 rows: 4 chains */
		for (int j = 0; j < dim; j++) {
			float kj = k[j];
			a0 += q0[j] * kj;
			a1 += q1[j] * kj;
			a2 += q2[j] * kj;
			a3 += q3[j] * kj;
		}
		s[t * TQA_ROWS + 0] = a0 * scale[t];
		s[t * TQA_ROWS + 1] = a1 * scale[t];
		s[t * TQA_ROWS + 2] = a2 * scale[t];
		s[t * TQA_ROWS + 3] = a3 * scale[t];
	}
}

void tqa_softmax_scalar(float *s, int n, const int *vis, float *m, float *l, float *alpha)
{
	for (int r = 0; r < TQA_ROWS; r++) {
		float cm = -INFINITY, bad = 0.0f; /* 0, NaN after a score that is not finite */
		for (int t = 0; t < vis[r]; t++) {
			cm = fmaxf(cm, s[t * TQA_ROWS + r]);
			bad += s[t * TQA_ROWS + r] * 0.0f;
		}
		float mn = fmaxf(m[r], cm);
		if (mn == -INFINITY) { /* nothing visible yet, or no finite score */
			alpha[r] = 1.0f;
			l[r] += bad;
			for (int t = 0; t < TQA_CHUNK; t++)
				s[t * TQA_ROWS + r] = 0.0f;
			continue;
		}
		alpha[r] = exp2f(m[r] - mn); /* 0 when m was -inf */
		float sum = 0.0f;
		for (int t = 0; t < TQA_CHUNK; t++) {
			float v = t < vis[r] ? exp2f(s[t * TQA_ROWS + r] - mn) : 0.0f;
			s[t * TQA_ROWS + r] = v;
			sum += v;
		}
		l[r] = l[r] * alpha[r] + sum + bad;
		m[r] = mn;
	}
	(void)n;
}

static void accum_scalar(float *acc, const float *alpha, const float *w, const float *vscale,
			 const float *tile, int n, int dim)
{
	for (int r = 0; r < TQA_ROWS; r++) {
		float *a = acc + (size_t)r * dim;
		for (int j = 0; j < dim; j++)
			a[j] *= alpha[r];
		for (int t = 0; t < n; t++) {
			float wt = w[t * TQA_ROWS + r] * vscale[t];
			const float *v = tile + (size_t)t * dim;
			for (int j = 0; j < dim; j++)
				a[j] += wt * v[j];
		}
	}
}

const struct tqa_ops tqa_ops_scalar = {
	.isa = TQ_ISA_SCALAR,
	.decode = tqa_decode_scalar,
	.scores = scores_scalar,
	.softmax = tqa_softmax_scalar,
	.accum = accum_scalar,
};

/* tq_attn_avx2.c and tq_attn_avx512.c compile to nothing off x86-64;
 * tq_attn_neon.c has its own NULL getter off aarch64. */
#if !defined(__x86_64__)
const struct tqa_ops *tqa_ops_avx2(void) { return NULL; }
const struct tqa_ops *tqa_ops_avx512(void) { return NULL; }
const struct tqa_ops *tqa_ops_avx512_vnni(int vnni) { (void)vnni; return NULL; }
const struct tqa_ops *tqa_ops_avx2_vnni(int vnni) { (void)vnni; return NULL; }
#endif

/* ---- plan and workspace ------------------------------------------------------ */

struct plan {
	int n_threads;
	int rows_ph;          /* n_q * G                                     */
	int rt_rows;          /* rows per tile, multiple of TQA_ROWS           */
	int n_rt;             /* row tiles                                    */
	int rows_pad;         /* n_rt * rt_rows                               */
	int n_split;          /* S                                            */
	uint32_t split_len;   /* tokens per split, multiple of TQA_CHUNK      */
	/* workspace offsets (bytes) */
	size_t thr_bytes;     /* per-thread scratch                          */
	size_t off_qbuf, off_ktile, off_vtile, off_kscale, off_vscale, off_p, off_alpha, off_tmp;
	size_t off_qprep;     /* qprep_d128's rows                          */
	size_t off_kprep;     /* ktile_d128's prepared keys                 */
	size_t off_acc, off_ml; /* partials, after the per-thread areas      */
	size_t total;
};

static size_t al64(size_t x) { return (x + 63) & ~(size_t)63; }

/* Rows per row tile for rows_ph rows of a head: RT_MAX, or all of them
 * rounded up to TQA_ROWS. */
static int tile_rows(int rows_ph)
{
	int rt = rows_ph < RT_MAX ? (rows_ph + TQA_ROWS - 1) / TQA_ROWS * TQA_ROWS : RT_MAX;

	return rt ? rt : TQA_ROWS;
}

static int tile_count(int rows_ph)
{
	int rt = tile_rows(rows_ph), n = (rows_ph + rt - 1) / rt;

	return n ? n : 1;
}

static void plan_make(const struct tq_attn_params *p, const struct tqa_shape *sh, struct plan *pl)
{
	int d = sh->dim;

	memset(pl, 0, sizeof(*pl));
	pl->n_threads = tq_threads_count(p->threads);
	pl->rows_ph = p->n_q * sh->group;
	pl->rt_rows = tile_rows(pl->rows_ph);
	pl->n_rt = tile_count(pl->rows_ph);
	pl->rows_pad = pl->n_rt * pl->rt_rows;

	/* splits: enough tasks to balance the pool, none shorter than SPLIT_MIN;
	 * counted on the tiles of plan_n_q queries where the caller gives it
	 * (the split is all a row's bits depend on besides its own inputs) */
	int base_tasks = sh->n_kv * (p->plan_n_q > p->n_q ? tile_count(p->plan_n_q * sh->group) : pl->n_rt);
	int want = pl->n_threads > 1 ? (TASKS_PER_THREAD * pl->n_threads + base_tasks - 1) / base_tasks : 1;
	uint32_t max_split = sh->kv_len / SPLIT_MIN;
	if (max_split < 1)
		max_split = 1;
	pl->n_split = want < 1 ? 1 : ((uint32_t)want > max_split ? (int)max_split : want);
	uint32_t len = (sh->kv_len + (uint32_t)pl->n_split - 1) / (uint32_t)pl->n_split;
	len = (len + TQA_CHUNK - 1) / TQA_CHUNK * TQA_CHUNK;
	pl->split_len = len ? len : TQA_CHUNK;
	pl->n_split = sh->kv_len ? (int)((sh->kv_len + pl->split_len - 1) / pl->split_len) : 1;

	size_t o = 0;
	pl->off_qbuf = o;   o += al64((size_t)pl->rt_rows * d * 4);
	pl->off_ktile = o;  o += al64((size_t)TQA_CHUNK * d * 4);
	pl->off_vtile = o;  o += al64((size_t)TQA_CHUNK * d * 4);
	pl->off_kscale = o; o += al64(TQA_CHUNK * 4);
	pl->off_vscale = o; o += al64(TQA_CHUNK * 4);
	pl->off_p = o;      o += al64((size_t)pl->rt_rows * TQA_CHUNK * 4);
	pl->off_alpha = o;  o += al64((size_t)pl->rt_rows * 4);
	pl->off_tmp = o;    o += al64((size_t)2 * d * 4);
	pl->off_qprep = o;  o += al64((size_t)TQA_QPREP_BYTES * (pl->rt_rows / TQA_ROWS));
	pl->off_kprep = o;  o += al64((size_t)TQA_KTILE_BYTES);
	pl->thr_bytes = o;
	o = al64(o * (size_t)pl->n_threads);
	size_t rows_all = (size_t)pl->n_split * sh->n_kv * pl->rows_pad;
	pl->off_acc = o;    o += al64(rows_all * d * 4);
	pl->off_ml = o;     o += al64(rows_all * 2 * 4);
	pl->total = o + 64; /* room to align a caller's buffer */
}

long tq_attn_workspace_bytes(const struct tq_attn_params *p, tq_error *err)
{
	struct tqa_shape sh;
	struct plan pl;
	int rc = tqa_validate(p, &sh, err);

	if (rc)
		return rc;
	plan_make(p, &sh, &pl);
	return (long)pl.total;
}

/* ---- the fused chunk loop ------------------------------------------------------ */

struct job {
	const struct tq_attn_params *p;
	const struct tqa_ops *ops;
	struct tqa_shape sh;
	struct plan pl;
	uint8_t *ws;          /* 64-byte aligned */
	float scale2;         /* softmax scale * log2(e) */
};

static inline float *acc_at(const struct job *jb, int s, int h, int r)
{
	size_t row = ((size_t)s * jb->sh.n_kv + h) * jb->pl.rows_pad + r;
	return (float *)(void *)(jb->ws + jb->pl.off_acc) + row * jb->sh.dim;
}

static inline float *ml_at(const struct job *jb, int s, int h, int r)
{
	size_t row = ((size_t)s * jb->sh.n_kv + h) * jb->pl.rows_pad + r;
	return (float *)(void *)(jb->ws + jb->pl.off_ml) + row * 2;
}

/* out row = R_v^T (acc / l), zeros when nothing was visible (empty cache).
 * Row r of a head's rows sees at least one key unless the cache is empty
 * or its position is negative: then a running max of -inf, or a max or sum
 * that is not finite, means the logits overflowed float range (finite
 * inputs can: q·k beyond 3.4e38; the softmax ops leave l NaN after any
 * score that is not finite), and the row is NaN — never a plausible wrong
 * number; callers that check outputs (tqkvd) report it. */
/* 1 where the values of a (KV head, row tile) of nrows rows go through the
 * register-direct accum_d128 (one row block at d = 128), else the tile
 * path: the same for every split of the tile. */
static int direct_values(const struct job *jb, int nrows)
{
	return nrows <= TQA_ROWS && jb->sh.dim == 128 && jb->ops->accum_d128[tq_codec_id(jb->p->v_codec)];
}

/* The order such a tile's acc rows are in: NULL where it is dim order (the
 * tile path, or a codec whose accum_d128 keeps it).  Every split of the
 * tile has the same, so task_merge adds like positions. */
static const uint8_t *acc_perm(const struct job *jb, int nrows)
{
	return direct_values(jb, nrows) ? jb->ops->accum_d128_perm[tq_codec_id(jb->p->v_codec)] : NULL;
}

static void finish_row(const struct job *jb, int r, const float *acc, const uint8_t *perm, float m,
		       float l, float *tmp, float *out)
{
	const struct tq_attn_params *p = jb->p;
	int d = jb->sh.dim;
	bool sees = p->kv->n_tokens > 0 && (!p->causal || p->q_pos[r / jb->sh.group] >= 0);

	if (m == -INFINITY && !sees) {
		memset(out, 0, (size_t)d * 4);
		return;
	}
	if (!isfinite(m) || !isfinite(l) || !(l > 0.0f)) {
		for (int j = 0; j < d; j++)
			out[j] = NAN;
		return;
	}
	float inv = 1.0f / l;
	if (perm)
		for (int j = 0; j < d; j++)
			tmp[perm[j]] = acc[j] * inv;
	else
		for (int j = 0; j < d; j++)
			tmp[j] = acc[j] * inv;
	tq_unrotate(jb->p->v_codec, tmp, out);
}

static size_t out_row(const struct job *jb, int h, int r)
{
	int qi = r / jb->sh.group, g = r % jb->sh.group;
	return ((size_t)qi * jb->p->n_q_heads + (size_t)h * jb->sh.group + g) * jb->sh.dim;
}

/* Software prefetch.  The hardware streamers fetch a head's blocks
 * well within a 4 KiB page but stall at each page edge and across the
 * jump from one pool page to the next, and a decode call with GQA does
 * too little work per byte to hide that: on a Xeon with AVX-512, 32k
 * K tq4 / V tq3 took 4.8 ms without, 3.0 ms with (fp16: 9.1 -> 7.4 ms;
 * BENCHMARKS.md).  The chunk PF_AHEAD chunks ahead is fetched (into L2)
 * in three pieces spread over the chunk's work — its first K half
 * before the scores, the second with the first V half before the
 * values, the rest after them — as one burst of every line filled the
 * core's miss buffers and stalled the scoring behind it (3.6 ms).
 * Where blocks are larger than PF_PACE_BLOCK bytes (q8 keys, f16, f32)
 * even those pieces stalled the thread on its prefetches (a fifth of
 * K q8 / V tq4's time at 32k, in the prefetch instructions): there the
 * register-direct kernels issue the lines themselves, one per step of
 * their token loops (TQA_PF_STEP, tq_attn_internal.h), and the driver
 * only points them at the chunk — 32k K q8 / V tq4 13-18 % faster, fp16
 * 16-18 %; tq4 / tq3 blocks (68 and 52 bytes) timed the same either way
 * and keep the pieces (BENCHMARKS.md 2, "Prefetch at the kernels' pace"). */
enum { PF_AHEAD = 3, PF_PACE_BLOCK = 96 };

struct pf_chunk {
	const uint8_t *k, *v;
	size_t kn, vn;   /* bytes */
};

/* Lines [from, to) bytes of p into L2 (p may be NULL when from == to). */
static void prefetch_lines(const uint8_t *p, size_t from, size_t to)
{
	for (size_t o = from; o < to; o += 64)
		__builtin_prefetch(p + o, 0, 2);
}

__thread struct tqa_pf tqa_pf_cur TQA_PF_TLS;

/* Points the thread's cursor at chunk c after issuing what the kernels
 * left of the one before (paced prefetch, tq_attn_internal.h). */
static void pf_paced_next(const struct pf_chunk *c)
{
	struct tqa_pf *f = &tqa_pf_cur;

	while (f->i < 2)
		tqa_pf_step(f);
	f->p[0] = c->k;
	f->n[0] = c->kn;
	f->p[1] = c->v;
	f->n[1] = c->vn;
	f->o = 0;
	f->i = c->kn ? 0 : c->vn ? 1 : 2;
}

/* The chunk starting at token tn of head h, or an empty one at or past t1. */
static struct pf_chunk pf_chunk_at(const struct tq_page_table *kv, uint32_t h, uint32_t tn,
				   uint32_t t1)
{
	struct pf_chunk c = { NULL, NULL, 0, 0 };
	if (tn >= t1)
		return c;
	const struct tq_page_geom *g = &kv->geom;
	uint32_t slot = tn % g->page_tokens;
	uint32_t n = g->page_tokens - slot < TQA_CHUNK ? g->page_tokens - slot : TQA_CHUNK;
	const uint8_t *pg = kv->pages[tn / g->page_tokens];
	c.k = pg + tq_page_k_off(g, h, slot);
	c.v = pg + tq_page_v_off(g, h, slot);
	c.kn = (size_t)n * g->k_block_bytes;
	c.vn = (size_t)n * g->v_block_bytes;
	return c;
}

static void task_compute(void *arg, int task, int thread)
{
	/* a private copy: the job lives on the caller's stack, next to lines
	 * the caller writes while it runs tasks itself (false sharing) */
	const struct job jcopy = *(const struct job *)arg;
	const struct job *jb = &jcopy;
	const struct tq_attn_params *p = jb->p;
	const struct tqa_ops *ops = jb->ops;
	const struct plan *pl = &jb->pl;
	const int d = jb->sh.dim, G = jb->sh.group;
	const struct tq_page_table *kv = p->kv;
	const struct tq_page_geom *geom = &kv->geom;
	const uint32_t pt = geom->page_tokens;
	uint8_t *tw = jb->ws + (size_t)thread * pl->thr_bytes;
	float *qbuf = (float *)(void *)(tw + pl->off_qbuf);     /* [rt_rows][d]            */
	float *ktile = (float *)(void *)(tw + pl->off_ktile);   /* [CHUNK][d]              */
	float *vtile = (float *)(void *)(tw + pl->off_vtile);   /* [CHUNK][d]              */
	float *kscale = (float *)(void *)(tw + pl->off_kscale); /* [CHUNK]                 */
	float *vscale = (float *)(void *)(tw + pl->off_vscale); /* [CHUNK]                 */
	float *pbuf = (float *)(void *)(tw + pl->off_p);        /* [blocks][CHUNK][ROWS]   */
	float *abuf = (float *)(void *)(tw + pl->off_alpha);    /* [blocks][ROWS]          */
	float *tmp = (float *)(void *)(tw + pl->off_tmp);       /* [2][d]                  */
	uint8_t *qprep = tw + pl->off_qprep;                     /* [blocks][QPREP_BYTES]   */
	uint8_t *kprep_t = tw + pl->off_kprep;                   /* [KTILE_BYTES]           */

	const int s = task % pl->n_split;
	const int rt = task / pl->n_split % pl->n_rt;
	const int h = task / pl->n_split / pl->n_rt;
	const int r0 = rt * pl->rt_rows;
	const int nrows = (pl->rows_ph - r0) < pl->rt_rows ? pl->rows_ph - r0 : pl->rt_rows;
	const int nblk = (nrows + TQA_ROWS - 1) / TQA_ROWS;
	uint32_t lim[RT_MAX];   /* keys visible to each row: [0, lim)      */
	uint32_t blim[RT_MAX / TQA_ROWS];
	uint32_t tmax = 0;

	/* q rows, rotated into the key frame and pre-scaled (base-2 scores) */
	for (int i = 0; i < nblk * TQA_ROWS; i++) {
		float *qr = qbuf + (size_t)i * d;
		if (i >= nrows) {
			memset(qr, 0, (size_t)d * 4);
			lim[i] = 0;
			continue;
		}
		int r = r0 + i, qi = r / G, g = r % G;
		tqa_q_row(p, d, (size_t)qi * p->n_q_heads + (size_t)h * G + g, tmp);
		tq_rotate(p->k_codec, tmp, qr);
		for (int j = 0; j < d; j++)
			qr[j] *= jb->scale2;
		lim[i] = p->causal ? (uint32_t)p->q_pos[qi] + 1 : jb->sh.kv_len;
	}
	for (int b = 0; b < nblk; b++) {
		blim[b] = 0;
		for (int i = 0; i < TQA_ROWS; i++)
			if (lim[b * TQA_ROWS + i] > blim[b])
				blim[b] = lim[b * TQA_ROWS + i];
		if (blim[b] > tmax)
			tmax = blim[b];
	}

	/* partial state of these rows for split s */
	float *acc0 = acc_at(jb, s, h, r0);   /* [nblk*ROWS][d] */
	float *ml0 = ml_at(jb, s, h, r0);     /* [nblk*ROWS][2] */
	float mrow[RT_MAX], lrow[RT_MAX];
	float srow[RT_MAX];   /* sparse-V: weight skipped, in the scale of lrow */
	memset(acc0, 0, (size_t)nblk * TQA_ROWS * d * 4);
	for (int i = 0; i < nblk * TQA_ROWS; i++) {
		mrow[i] = -INFINITY;
		lrow[i] = 0.0f;
		srow[i] = 0.0f;
	}

	/* d = 128: keys scored straight from their blocks — by every row block
	 * where the codec's scoring prepares the rows (its bits differ from
	 * the tile path's, and a row's bits must not depend on how many rows
	 * share its call: plan_n_q), else when there is one row block (the
	 * register-direct float kernels give the tile path's bits) */
	const enum tq_codec_id kid = tq_codec_id(p->k_codec), vid = tq_codec_id(p->v_codec);
	const int direct = nblk == 1 && d == 128, dvals = direct_values(jb, nrows);
	const int kprep = d == 128 && ops->scores_d128[kid] && ops->qprep_d128[kid];
	if (kprep)
		for (int b = 0; b < nblk; b++)
			ops->qprep_d128[kid](p->k_codec, qbuf + (size_t)b * TQA_ROWS * d,
					     qprep + (size_t)b * TQA_QPREP_BYTES);

	const float thr = p->sparse_v;
	uint64_t v_chunks = 0, v_skipped = 0;
	/* the kernels pace the prefetches where both of this task's kernels
	 * are register-direct ones of an ISA that paces them and a block is
	 * larger than PF_PACE_BLOCK (above) */
	const int paced = ops->pf_paced && (kprep || (direct && ops->scores_d128[kid])) && dvals &&
			  (geom->k_block_bytes > PF_PACE_BLOCK || geom->v_block_bytes > PF_PACE_BLOCK);
	tqa_pf_cur.i = 2; /* nothing of another task's or call's */
	uint32_t t0 = (uint32_t)s * pl->split_len;
	uint32_t t1 = t0 + pl->split_len < jb->sh.kv_len ? t0 + pl->split_len : jb->sh.kv_len;
	if (t1 > tmax)
		t1 = tmax;

	for (uint32_t t = t0; t < t1;) {
		uint32_t page = t / pt, slot = t % pt;
		int n = TQA_CHUNK;
		if ((uint32_t)n > pt - slot)
			n = (int)(pt - slot);
		if ((uint32_t)n > t1 - t)
			n = (int)(t1 - t);
		const uint8_t *pg = kv->pages[page];
		const uint8_t *kb = pg + tq_page_k_off(geom, (uint32_t)h, slot);
		const uint8_t *vb = pg + tq_page_v_off(geom, (uint32_t)h, slot);

		const struct pf_chunk pf = pf_chunk_at(kv, (uint32_t)h, t + (uint32_t)n +
						       (PF_AHEAD - 1) * TQA_CHUNK, t1);
		if (paced)
			pf_paced_next(&pf);
		else
			prefetch_lines(pf.k, 0, pf.kn / 2);
		const float *kt = NULL;
		if (!kprep && !(direct && ops->scores_d128[kid]))
			kt = ops->decode(p->k_codec, kb, n, ktile, kscale);
		/* several row blocks: the keys taken apart once (same bits) */
		const int ktiled = kprep && nblk > 1 && ops->ktile_d128[kid] && ops->scores_ktile_d128[kid];
		if (ktiled)
			ops->ktile_d128[kid](p->k_codec, kb, n, qprep, kprep_t);
		int active[RT_MAX / TQA_ROWS];
		int any = 0;
		for (int b = 0; b < nblk; b++) {
			active[b] = t < blim[b];
			if (!active[b])
				continue;
			any = 1;
			float *sb = pbuf + (size_t)b * TQA_CHUNK * TQA_ROWS;
			int vis[TQA_ROWS];
			for (int i = 0; i < TQA_ROWS; i++) {
				uint32_t l = lim[b * TQA_ROWS + i];
				vis[i] = l <= t ? 0 : (l - t >= (uint32_t)n ? n : (int)(l - t));
			}
			if (kt)
				ops->scores(qbuf + (size_t)b * TQA_ROWS * d, kt, kscale, n, d, sb);
			else if (ktiled)
				ops->scores_ktile_d128[kid](p->k_codec, kprep_t, n,
							    (const float *)(const void *)(qprep + (size_t)b * TQA_QPREP_BYTES),
							    sb);
			else
				ops->scores_d128[kid](p->k_codec, kb, n,
						      kprep ? (const float *)(const void *)(qprep + (size_t)b * TQA_QPREP_BYTES)
							    : qbuf, sb);
			ops->softmax(sb, n, vis, mrow + b * TQA_ROWS, lrow + b * TQA_ROWS,
				     abuf + b * TQA_ROWS);
		}
		if (!any)
			break;

		/* values: every token, or (sparse-V) none of this chunk's when
		 * its weights still fit every row's skip budget: a row's skipped
		 * weight stays at most thr times its running sum lrow, which only
		 * grows, so at most thr of the row's final attention mass is left
		 * out (per split, and so after the merge); srow follows lrow's
		 * rescaling by alpha when the running max moves.  Whole chunks
		 * only: skipping single tokens cut chunks into runs that cost
		 * more than the values they saved (BENCHMARKS.md 2), and away
		 * from a sharp attention's peaks whole chunks are negligible. */
		int nv = n;
		const float *vt;
		if (thr > 0.0f) {
			int skip = 1;
			float cm[RT_MAX];
			for (int b = 0; b < nblk; b++) {
				if (!active[b])
					continue;
				const float *sb = pbuf + (size_t)b * TQA_CHUNK * TQA_ROWS;
				for (int i = 0; i < TQA_ROWS; i++) {
					float m = 0.0f;
					for (int j = 0; j < n; j++)
						m += sb[j * TQA_ROWS + i];
					const int r = b * TQA_ROWS + i;
					srow[r] *= abuf[r];
					cm[r] = m;
					if (!(srow[r] + m <= thr * lrow[r]))
						skip = 0;
				}
			}
			if (skip) {
				nv = 0;
				v_skipped++;
				for (int b = 0; b < nblk; b++)
					if (active[b])
						for (int i = 0; i < TQA_ROWS; i++)
							srow[b * TQA_ROWS + i] += cm[b * TQA_ROWS + i];
			}
		}
		if (!paced) {
			prefetch_lines(pf.k, pf.kn / 2, pf.kn);
			prefetch_lines(pf.v, 0, pf.vn / 2);
		}
		/* nv = 0 (a skipped chunk) still applies alpha */
		if (dvals) {
			ops->accum_d128[vid](p->v_codec, vb, nv, acc0, abuf, pbuf);
		} else {
			vt = nv ? ops->decode(p->v_codec, vb, n, vtile, vscale) : vtile;
			for (int b = 0; b < nblk; b++) {
				if (!active[b])
					continue;
				ops->accum(acc0 + (size_t)b * TQA_ROWS * d, abuf + b * TQA_ROWS,
					   pbuf + (size_t)b * TQA_CHUNK * TQA_ROWS, vscale, vt, nv, d);
			}
		}
		if (!paced)
			prefetch_lines(pf.v, pf.vn / 2, pf.vn);
		v_chunks++;
		t += (uint32_t)n;
	}
	tqa_pf_cur.i = 2;
	if (p->stats && v_chunks) {
		__atomic_fetch_add(&p->stats->v_chunks, v_chunks, __ATOMIC_RELAXED);
		__atomic_fetch_add(&p->stats->v_skipped, v_skipped, __ATOMIC_RELAXED);
	}

	if (pl->n_split == 1) {
		const uint8_t *perm = acc_perm(jb, nrows);
		for (int i = 0; i < nrows; i++)
			finish_row(jb, r0 + i, acc0 + (size_t)i * d, perm, mrow[i], lrow[i], tmp,
				   p->out + out_row(jb, h, r0 + i));
		return;
	}
	for (int i = 0; i < nblk * TQA_ROWS; i++) {
		ml0[2 * i] = mrow[i];
		ml0[2 * i + 1] = lrow[i];
	}
}

/* Log-sum-exp merge of the splits of one (KV head, row tile). */
static void task_merge(void *arg, int task, int thread)
{
	const struct job *jb = arg;
	const struct plan *pl = &jb->pl;
	const int d = jb->sh.dim;
	const int rt = task % pl->n_rt, h = task / pl->n_rt;
	const int r0 = rt * pl->rt_rows;
	const int nrows = (pl->rows_ph - r0) < pl->rt_rows ? pl->rows_ph - r0 : pl->rt_rows;
	float *tmp = (float *)(void *)(jb->ws + (size_t)thread * pl->thr_bytes + pl->off_tmp);
	float *sum = tmp + d;
	const uint8_t *perm = acc_perm(jb, nrows);

	for (int i = 0; i < nrows; i++) {
		float M = -INFINITY;
		for (int s = 0; s < pl->n_split; s++)
			M = fmaxf(M, ml_at(jb, s, h, r0 + i)[0]);
		float L = 0.0f;
		memset(sum, 0, (size_t)d * 4);
		if (M != -INFINITY) {
			for (int s = 0; s < pl->n_split; s++) {
				const float *ml = ml_at(jb, s, h, r0 + i);
				/* nothing seen, unless a score that was not
				 * finite left l NaN: that must reach the row */
				if (ml[0] == -INFINITY && !isnan(ml[1]))
					continue;
				float f = exp2f(ml[0] - M);
				const float *a = acc_at(jb, s, h, r0 + i);
				L += ml[1] * f;
				for (int j = 0; j < d; j++)
					sum[j] += a[j] * f;
			}
		}
		finish_row(jb, r0 + i, sum, perm, M, L, tmp, jb->p->out + out_row(jb, h, r0 + i));
	}
}

/* The attention paths depend only on the CPU (not on the codec's SIMD
 * paths): AVX2 needs AVX2+FMA+F16C, AVX-512 needs F/BW/DQ/VL as well, NEON
 * the baseline Advanced SIMD of aarch64 (the codec's probe says). */
static const struct tqa_ops *ops_for(enum tq_isa isa)
{
	switch (isa) {
	case TQ_ISA_SCALAR:
		return &tqa_ops_scalar;
#if defined(__x86_64__)
	case TQ_ISA_AVX2:
		if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		    __builtin_cpu_supports("f16c"))
			return tqa_ops_avx2();
		return NULL;
	case TQ_ISA_AVX512:
		if (ops_for(TQ_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
		    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
		    __builtin_cpu_supports("avx512vl"))
			return tqa_ops_avx512();
		return NULL;
#endif
#if defined(__aarch64__)
	case TQ_ISA_NEON:
		return tq_isa_supported(TQ_ISA_NEON) ? tqa_ops_neon() : NULL;
#endif
	default:
		return NULL;
	}
}

const char *tq_attn_isa_label(enum tq_isa isa)
{
	switch (isa) {
	case TQ_ISA_AVX512: return tqa_ops_avx512_vnni(1) ? "avx512+vnni" : "avx512";
	case TQ_ISA_AVX2: return tqa_ops_avx2_vnni(1) ? "avx2+avxvnni" : "avx2";
	case TQ_ISA_NEON: return tqa_ops_neon_dot(1) ? "neon+dotprod" : "neon";
	default: return tq_isa_name(isa);
	}
}

int tq_attn_isa_supported(enum tq_isa isa)
{
	return isa == TQ_ISA_AUTO || ops_for(isa) != NULL;
}

int tq_attend(const struct tq_attn_params *p, tq_error *err)
{
	struct job jb;
	void *owned = NULL;
	int rc = tqa_validate(p, &jb.sh, err);

	if (rc)
		return rc;
	if (p->n_q == 0)
		return 0;

	enum tq_isa isa = p->isa;
	if (isa == TQ_ISA_AUTO) {
		isa = tq_isa_best();
		jb.ops = ops_for(isa);
		if (!jb.ops)
			jb.ops = &tqa_ops_scalar;
	} else {
		jb.ops = ops_for(isa);
		if (!jb.ops) {
			if (err)
				snprintf(err->msg, sizeof(err->msg), "attention: ISA %s not available",
					 tq_isa_name(isa));
			return -EOPNOTSUPP;
		}
	}

	jb.p = p;
	plan_make(p, &jb.sh, &jb.pl);
	jb.scale2 = (float)((double)jb.sh.scale * LOG2E);
	if (p->workspace) {
		if (p->workspace_bytes < jb.pl.total) {
			if (err)
				snprintf(err->msg, sizeof(err->msg),
					 "attention: workspace of %zu bytes, %zu needed",
					 p->workspace_bytes, jb.pl.total);
			return -ENOSPC;
		}
		jb.ws = (uint8_t *)(((uintptr_t)p->workspace + 63) & ~(uintptr_t)63);
	} else {
		owned = malloc(jb.pl.total);
		if (!owned) {
			if (err)
				snprintf(err->msg, sizeof(err->msg), "attention: out of memory");
			return -ENOMEM;
		}
		jb.ws = (uint8_t *)(((uintptr_t)owned + 63) & ~(uintptr_t)63);
	}

	int n_tasks = jb.sh.n_kv * jb.pl.n_rt * jb.pl.n_split;
	rc = tq_threads_run(p->threads, task_compute, &jb, n_tasks);
	if (!rc && jb.pl.n_split > 1)
		rc = tq_threads_run(p->threads, task_merge, &jb, jb.sh.n_kv * jb.pl.n_rt);
	free(owned);
	return rc;
}
