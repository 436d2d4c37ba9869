/* test_attn — fused attention (every ISA path this CPU runs) against the
 * oracle on the same compressed pages; page layout; edge cases and errors;
 * split-K merge; sparse-V; the thread pool; passes planned as one call
 * (plan_n_q), bit for bit; logits beyond float range give NaN rows. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tq_attn.h"
#include "tq_attn_internal.h"
#include "tq_threads.h"

#define TOL 1e-4   /* max |fused - oracle| per output row, relative to the row's norm */
/* The same for the integer key scoring (AVX2, AVX-512) on attention twice as
 * peaked as the test matrix: measured 9e-5 (one query) and 1.4e-4 (five). */
#define TOL_INT 2e-4

static tq_cache *cache;
static tq_threads *pool3;

static const enum tq_codec_id all_codecs[] = {
	TQ_CODEC_TQ2, TQ_CODEC_TQ3, TQ_CODEC_TQ4, TQ_CODEC_Q8, TQ_CODEC_Q4A, TQ_CODEC_F16, TQ_CODEC_F32,
	TQ_CODEC_TQ3O, TQ_CODEC_TQ4O,
};
#define N_CODECS (int)(sizeof(all_codecs) / sizeof(all_codecs[0]))

/* ---- a compressed KV cache in pages ----------------------------------------- */

struct kv {
	tq_codec *kc, *vc;
	int dim, n_kv;
	uint32_t len;
	uint8_t **pages;                /* [n_pages] each tq_page_bytes()        */
	struct tq_page_table table;
};

static uint64_t rng_state;
static double urand(void)
{
	rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
	return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}
/* Box-Muller, both of a pair's values (half the log, sqrt and sin/cos:
 * under qemu, in the aarch64 check, these were much of the suite's time) */
static double gauss_spare;
static int gauss_have;
static void rng_seed(uint64_t seed)
{
	rng_state = seed;
	gauss_have = 0; /* a case's numbers from its seed alone */
}
static float gauss(void)
{
	if (gauss_have) {
		gauss_have = 0;
		return (float)gauss_spare;
	}
	double u = urand() + 1e-12, v = urand();
	double r = sqrt(-2.0 * log(u)), a = 6.283185307179586 * v;
	gauss_spare = r * sin(a);
	gauss_have = 1;
	return (float)(r * cos(a));
}

/* Keys with the structure of real ones: channel means, a few large channels. */
static void fill_kv(float *k, float *v, int n, int dim)
{
	for (int i = 0; i < n; i++)
		for (int j = 0; j < dim; j++) {
			float mean = (float)((j * 37 % 11) - 5) * 0.1f;
			float amp = (j % 29 == 3) ? 6.0f : 1.0f;
			k[(size_t)i * dim + j] = mean + amp * gauss();
			v[(size_t)i * dim + j] = gauss();
		}
}

static void kv_free(struct kv *c)
{
	if (c->pages)
		for (uint32_t i = 0; i < c->table.n_pages; i++)
			free(c->pages[i]);
	free(c->pages);
	tq_codec_free(c->kc);
	tq_codec_free(c->vc);
	memset(c, 0, sizeof(*c));
}

/* 0 or a negative errno; on success c is built (free with kv_free). */
static int kv_build(struct kv *c, enum tq_codec_id kid, enum tq_codec_id vid, int dim,
		    int n_kv, uint32_t page_tokens, uint32_t len, uint64_t seed)
{
	struct tq_codec_params kp = { .id = kid, .dim = dim, .seed = seed ^ 0x1111 };
	struct tq_codec_params vp = { .id = vid, .dim = dim, .seed = seed ^ 0x2222 };
	tq_error err;
	int rc;

	memset(c, 0, sizeof(*c));
	c->dim = dim;
	c->n_kv = n_kv;
	c->len = len;
	if ((rc = tq_codec_new(&c->kc, cache, &kp, &err)) || (rc = tq_codec_new(&c->vc, cache, &vp, &err))) {
		fprintf(stderr, "  codec: %s\n", err.msg);
		return rc;
	}
	struct tq_page_geom g = {
		.n_kv_heads = (uint32_t)n_kv, .page_tokens = page_tokens,
		.k_block_bytes = (uint32_t)tq_codec_block_bytes(c->kc),
		.v_block_bytes = (uint32_t)tq_codec_block_bytes(c->vc),
	};
	uint32_t np = tq_page_count(&g, len);
	c->table.geom = g;
	c->table.n_tokens = len;
	c->table.n_pages = np;
	c->pages = calloc(np ? np : 1, sizeof(*c->pages));
	c->table.pages = (const uint8_t *const *)c->pages;
	float *k = malloc((size_t)page_tokens * dim * sizeof(float));
	float *v = malloc((size_t)page_tokens * dim * sizeof(float));
	if (!c->pages || !k || !v) {
		rc = -ENOMEM;
		goto out;
	}
	rng_seed(seed);
	for (uint32_t p = 0; p < np; p++) {
		c->pages[p] = aligned_alloc(TQ_PAGE_ALIGN, tq_page_bytes(&g));
		if (!c->pages[p]) {
			rc = -ENOMEM;
			goto out;
		}
		memset(c->pages[p], 0xA5, tq_page_bytes(&g)); /* junk in unused slots */
		uint32_t n = len - p * page_tokens < page_tokens ? len - p * page_tokens : page_tokens;
		for (int h = 0; h < n_kv; h++) {
			fill_kv(k, v, (int)n, dim);
			if ((rc = tq_encode(c->kc, k, TQ_DTYPE_F32, n, c->pages[p] + tq_page_k_off(&g, (uint32_t)h, 0), &err)) ||
			    (rc = tq_encode(c->vc, v, TQ_DTYPE_F32, n, c->pages[p] + tq_page_v_off(&g, (uint32_t)h, 0), &err))) {
				fprintf(stderr, "  encode: %s\n", err.msg);
				goto out;
			}
		}
	}
	rc = 0;
out:
	free(k);
	free(v);
	return rc;
}

/* ---- compare the fused paths with the oracle ------------------------------- */

struct qset {
	int n_q, n_q_heads;
	float *q;          /* [n_q][n_q_heads][dim] */
	int32_t *pos;      /* [n_q]                 */
};

static void qset_make(struct qset *s, int n_q, int n_q_heads, int dim, const int32_t *pos)
{
	s->n_q = n_q;
	s->n_q_heads = n_q_heads;
	s->q = malloc((size_t)n_q * n_q_heads * dim * sizeof(float) + 4);
	s->pos = malloc((size_t)n_q * sizeof(int32_t) + 4);
	for (size_t i = 0; i < (size_t)n_q * n_q_heads * dim; i++)
		s->q[i] = gauss() * 1.5f;
	memcpy(s->pos, pos, (size_t)n_q * sizeof(int32_t));
}

static void qset_free(struct qset *s)
{
	free(s->q);
	free(s->pos);
}

static struct tq_attn_params params_for(const struct kv *c, const struct qset *s, float *out, int causal)
{
	struct tq_attn_params p = {
		.k_codec = c->kc, .v_codec = c->vc, .n_q_heads = s->n_q_heads, .kv = &c->table,
		.n_q = s->n_q, .q = s->q, .q_dtype = TQ_DTYPE_F32, .q_pos = s->pos,
		.causal = causal, .out = out,
	};
	return p;
}

/* Max over rows of max_j |a - b| / ||b_row||; a negative value on error. */
static double row_err(const float *a, const float *b, size_t rows, int dim)
{
	double worst = 0.0;
	for (size_t r = 0; r < rows; r++) {
		double n2 = 0.0, mx = 0.0;
		for (int j = 0; j < dim; j++) {
			double bj = b[r * dim + j], d = fabs((double)a[r * dim + j] - bj);
			n2 += bj * bj;
			if (!(d <= mx)) /* NaN-safe */
				mx = d;
		}
		double e = mx / (sqrt(n2) + 1e-12);
		if (!(e <= worst))
			worst = e;
	}
	return worst;
}

static const enum tq_isa isas[] = { TQ_ISA_SCALAR, TQ_ISA_AVX2, TQ_ISA_AVX512, TQ_ISA_NEON };

/* A path the cases run: supported here, and named in TQ_TEST_ISAS (a
 * comma-separated list of tq_isa_name()s; unset: every path).  The
 * aarch64 run under qemu (scripts/check-aarch64.sh) names neon: the
 * scalar path is the same C code the native run tests, and emulating it
 * took half of that run's time. */
static bool isa_on(enum tq_isa isa)
{
	const char *only = getenv("TQ_TEST_ISAS"), *name = tq_isa_name(isa);
	size_t n = strlen(name);

	if (!tq_attn_isa_supported(isa))
		return false;
	if (!only || !*only)
		return true;
	for (const char *p = only; (p = strstr(p, name)); p += n)
		if ((p == only || p[-1] == ',') && (p[n] == 0 || p[n] == ','))
			return true;
	return false;
}

/* Runs the oracle and every supported ISA (with and without the pool);
 * returns the worst relative row error, or -1 on a failed call. */
static double compare(struct tq_attn_params p, const char *what)
{
	size_t rows = (size_t)p.n_q * p.n_q_heads;
	int dim = tq_codec_dim(p.k_codec);
	float *ref = malloc(rows * dim * sizeof(float) + 4);
	float *out = malloc(rows * dim * sizeof(float) + 4);
	double worst = 0.0;
	tq_error err;

	p.out = ref;
	if (tq_attend_ref(&p, &err)) {
		fprintf(stderr, "  %s: ref: %s\n", what, err.msg);
		worst = -1;
		goto out;
	}
	for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
		if (!isa_on(isas[i]))
			continue;
		for (int pooled = 0; pooled < 2; pooled++) {
			p.isa = isas[i];
			p.out = out;
			p.threads = pooled ? pool3 : NULL;
			memset(out, 0xFF, rows * dim * sizeof(float)); /* NaN until written */
			int rc = tq_attend(&p, &err);
			if (rc) {
				fprintf(stderr, "  %s %s: rc %d: %s\n", what, tq_isa_name(isas[i]), rc, err.msg);
				worst = -1;
				goto out;
			}
			double e = row_err(out, ref, rows, dim);
			if (!(e <= TOL) || getenv("TQ_TEST_VERBOSE"))
				fprintf(stderr, "  %s %s%s: error %.3g\n", what, tq_isa_name(isas[i]),
					pooled ? " pooled" : "", e);
			if (!(e <= worst))
				worst = e;
		}
	}
out:
	free(ref);
	free(out);
	return worst;
}

/* One codec pair at one shape: decode (one query, last position) and causal
 * prefill (queries at assorted positions, some past a page boundary). */
static double check_shape(enum tq_codec_id kid, enum tq_codec_id vid, int dim, int n_kv, int group,
			  uint32_t page_tokens, uint32_t len)
{
	struct kv c;
	struct qset s1, s2;
	char what[96];
	double w1, w2;

	if (kv_build(&c, kid, vid, dim, n_kv, page_tokens, len, t_seed() + (uint64_t)kid * 7 + vid))
		return -1;
	snprintf(what, sizeof(what), "K %s V %s d %d G %d T %u", tq_codec_name(kid), tq_codec_name(vid),
		 dim, group, len);
	int32_t last = (int32_t)len - 1;
	qset_make(&s1, 1, n_kv * group, dim, &last);
	w1 = compare(params_for(&c, &s1, NULL, 1), what);
	int32_t pos[5] = { 0, (int32_t)page_tokens - 1, (int32_t)page_tokens, (int32_t)len / 2, last };
	qset_make(&s2, 5, n_kv * group, dim, pos);
	w2 = compare(params_for(&c, &s2, NULL, 1), what);
	qset_free(&s1);
	qset_free(&s2);
	kv_free(&c);
	if (w1 < 0 || w2 < 0)
		return -1;
	return w1 > w2 ? w1 : w2;
}

static void test_all_pairs_d128(void)
{
	for (int i = 0; i < N_CODECS; i++)
		for (int j = 0; j < N_CODECS; j++) {
			/* 2 KV heads x GQA 4; pages of 48 tokens (chunks end at page
			 * ends, not only at multiples of 32); 203 tokens = 5 pages */
			double e = check_shape(all_codecs[i], all_codecs[j], 128, 2, 4, 48, 203);
			T_ASSERT(e >= 0);
			T_ASSERT(e <= TOL);
		}
}

static void test_dims_and_groups(void)
{
	static const struct { enum tq_codec_id k, v; } pairs[] = {
		{ TQ_CODEC_TQ4, TQ_CODEC_TQ3 }, { TQ_CODEC_Q8, TQ_CODEC_TQ4 }, { TQ_CODEC_TQ2, TQ_CODEC_TQ2 },
		{ TQ_CODEC_F16, TQ_CODEC_F16 }, { TQ_CODEC_Q4A, TQ_CODEC_Q4A }, { TQ_CODEC_TQ3, TQ_CODEC_F32 },
		{ TQ_CODEC_TQ4O, TQ_CODEC_TQ3O },
	};
	static const int dims[] = { 64, 128, 256, 40 };   /* 40: dense rotation, masked tails */
	static const int groups[] = { 1, 4, 8 };

	for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++)
		for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++)
			for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
				if (dims[d] == 128 && groups[g] == 4)
					continue; /* covered above */
				if (tq_block_bytes(pairs[i].k, dims[d], NULL) < 0 ||
				    tq_block_bytes(pairs[i].v, dims[d], NULL) < 0)
					continue; /* tq*o: dims of 16s */
				double e = check_shape(pairs[i].k, pairs[i].v, dims[d], 2, groups[g], 64, 150);
				T_ASSERT(e >= 0);
				T_ASSERT(e <= TOL);
			}
}

/* Long context: split-K across the pool, merged with log-sum-exp. */
static void test_split_k(void)
{
	struct kv c;
	struct qset s;
	int32_t pos[3] = { 6999, 3000, 100 };

	T_ASSERT(kv_build(&c, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 128, 2, 256, 7000, t_seed()) == 0);
	qset_make(&s, 3, 8, 128, pos);
	struct tq_attn_params p = params_for(&c, &s, NULL, 1);
	double e = compare(p, "split-K causal");
	p.causal = 0;
	double e2 = compare(p, "split-K full");
	qset_free(&s);
	/* one query (decode: the register-direct kernels, whose accumulators
	 * may keep their own dim order through the merge) */
	qset_make(&s, 1, 8, 128, pos);
	double e3 = compare(params_for(&c, &s, NULL, 1), "split-K decode");
	qset_free(&s);
	kv_free(&c);
	T_ASSERT(e >= 0 && e <= TOL);
	T_ASSERT(e2 >= 0 && e2 <= TOL);
	T_ASSERT(e3 >= 0 && e3 <= TOL);
}

/* Query dtypes: f16/bf16 queries go through the same conversion in both. */
static void test_query_dtypes(void)
{
	struct kv c;
	struct qset s;
	int32_t pos[2] = { 10, 99 };

	T_ASSERT(kv_build(&c, TQ_CODEC_TQ4, TQ_CODEC_TQ4, 128, 2, 32, 100, t_seed()) == 0);
	qset_make(&s, 2, 8, 128, pos);
	uint16_t *h = malloc(2 * 8 * 128 * 2);
	for (int i = 0; i < 2 * 8 * 128; i++)
		h[i] = tq_f32_to_f16(s.q[i]);
	struct tq_attn_params p = params_for(&c, &s, NULL, 1);
	p.q = h;
	p.q_dtype = TQ_DTYPE_F16;
	double e1 = compare(p, "f16 q");
	for (int i = 0; i < 2 * 8 * 128; i++)
		h[i] = tq_f32_to_bf16(s.q[i]);
	p.q_dtype = TQ_DTYPE_BF16;
	double e2 = compare(p, "bf16 q");
	free(h);
	qset_free(&s);
	kv_free(&c);
	T_ASSERT(e1 >= 0 && e1 <= TOL);
	T_ASSERT(e2 >= 0 && e2 <= TOL);
}

static void test_one_token(void)
{
	struct kv c;
	struct qset s;
	int32_t pos = 0;
	float out[4 * 64], v[64];

	T_ASSERT(kv_build(&c, TQ_CODEC_TQ3, TQ_CODEC_TQ4, 64, 1, 16, 1, t_seed()) == 0);
	qset_make(&s, 1, 4, 64, &pos);
	struct tq_attn_params p = params_for(&c, &s, out, 1);
	T_ASSERT(compare(p, "one token") <= TOL);
	/* one visible token: the output is that token's decoded value */
	T_EQ(tq_attend(&p, NULL), 0);
	tq_decode_ref(c.vc, c.pages[0] + tq_page_v_off(&c.table.geom, 0, 0), 1, v);
	for (int h = 0; h < 4; h++)
		for (int j = 0; j < 64; j++)
			T_NEAR(out[h * 64 + j], v[j], 1e-5);
	qset_free(&s);
	kv_free(&c);
}

static void test_errors(void)
{
	struct kv c, c0;
	struct qset s;
	int32_t pos[2] = { 5, 9 };
	float out[2 * 8 * 128];
	tq_error err;

	T_ASSERT(kv_build(&c, TQ_CODEC_TQ4, TQ_CODEC_Q8, 128, 2, 8, 10, t_seed()) == 0);
	T_ASSERT(kv_build(&c0, TQ_CODEC_TQ4, TQ_CODEC_Q8, 128, 2, 8, 0, t_seed()) == 0);
	qset_make(&s, 2, 8, 128, pos);
	struct tq_attn_params p = params_for(&c, &s, out, 1);
	T_EQ(tq_attend(&p, &err), 0);

	/* empty cache: no keys; causal positions are all past the cache */
	struct tq_attn_params e = params_for(&c0, &s, out, 1);
	T_EQ(tq_attend(&e, &err), -EINVAL);
	T_EQ(tq_attend_ref(&e, &err), -EINVAL);
	e.causal = 0;
	e.q_pos = NULL;
	memset(out, 0x7F, sizeof(out));
	T_EQ(tq_attend(&e, &err), 0);
	for (int i = 0; i < 2 * 8 * 128; i++)
		T_ASSERT(out[i] == 0.0f);
	/* zero queries: nothing to do */
	e.n_q = 0;
	T_EQ(tq_attend(&e, &err), 0);

	/* positions past the cache, negative, missing */
	s.pos[1] = 10;
	T_EQ(tq_attend(&p, &err), -EINVAL);
	T_EQ(tq_attend_ref(&p, &err), -EINVAL);
	s.pos[1] = -1;
	T_EQ(tq_attend(&p, &err), -EINVAL);
	s.pos[1] = 9;
	p.q_pos = NULL;
	T_EQ(tq_attend(&p, &err), -EINVAL);
	p.q_pos = s.pos;

	/* NaN / Inf in queries, in every dtype */
	s.q[8 * 128 + 77] = NAN;
	T_EQ(tq_attend(&p, &err), -EINVAL);
	T_EQ(tq_attend_ref(&p, &err), -EINVAL);
	s.q[8 * 128 + 77] = INFINITY;
	T_EQ(tq_attend(&p, &err), -EINVAL);
	s.q[8 * 128 + 77] = 0.5f;
	T_EQ(tq_attend(&p, &err), 0);
	uint16_t h[2 * 8 * 128];
	for (int i = 0; i < 2 * 8 * 128; i++)
		h[i] = tq_f32_to_f16(s.q[i]);
	h[3] = 0x7C00; /* +inf */
	p.q = h;
	p.q_dtype = TQ_DTYPE_F16;
	T_EQ(tq_attend(&p, &err), -EINVAL);
	h[3] = 0x7FC0; /* bf16 NaN */
	p.q_dtype = TQ_DTYPE_BF16;
	T_EQ(tq_attend(&p, &err), -EINVAL);
	p.q = s.q;
	p.q_dtype = TQ_DTYPE_F32;

	/* shapes and codecs */
	p.n_q_heads = 7;
	T_EQ(tq_attend(&p, &err), -EINVAL);
	p.n_q_heads = 8;
	p.v_codec = c.kc; /* tq4 blocks are not the pages' q8 blocks */
	T_EQ(tq_attend(&p, &err), -EINVAL);
	p.v_codec = c.vc;
	p.scale = NAN;
	T_EQ(tq_attend(&p, &err), -EINVAL);
	p.scale = 0.0f;
	p.sparse_v = 1.5f;
	T_EQ(tq_attend(&p, &err), -EINVAL);
	p.sparse_v = 0.0f;
	p.out = NULL;
	T_EQ(tq_attend(&p, &err), -EINVAL);
	p.out = out;

	/* workspace: too small, then exactly the size asked for */
	long need = tq_attn_workspace_bytes(&p, &err);
	T_ASSERT(need > 0);
	void *ws = malloc((size_t)need);
	p.workspace = ws;
	p.workspace_bytes = (size_t)need - 1;
	T_EQ(tq_attend(&p, &err), -ENOSPC);
	p.workspace_bytes = (size_t)need;
	T_EQ(tq_attend(&p, &err), 0);
	free(ws);
	qset_free(&s);
	kv_free(&c);
	kv_free(&c0);
}

/* A scale other than the default, non-causal prefill, all ISAs. */
static void test_scale_noncausal(void)
{
	struct kv c;
	struct qset s;
	int32_t pos[4] = { 0, 1, 2, 3 };

	T_ASSERT(kv_build(&c, TQ_CODEC_Q8, TQ_CODEC_TQ2, 128, 1, 100, 333, t_seed()) == 0);
	qset_make(&s, 4, 4, 128, pos);
	struct tq_attn_params p = params_for(&c, &s, NULL, 0);
	p.scale = 0.3f;
	double e = compare(p, "scale 0.3, not causal");
	qset_free(&s);
	kv_free(&c);
	T_ASSERT(e >= 0 && e <= TOL);
}

/* Sparse-V: a negligible threshold changes nothing measurable; a real one
 * skips values and stays close (final weights skipped are < threshold). */
/* The largest decoded value norm of the cache (the sparse-V bound's scale). */
static double max_v_norm(const struct kv *c)
{
	float v[TQ_DIM_MAX];
	double mx = 0.0;
	const struct tq_page_geom *g = &c->table.geom;

	for (uint32_t t = 0; t < c->len; t++)
		for (int h = 0; h < c->n_kv; h++) {
			const uint8_t *blk = c->pages[t / g->page_tokens] +
					     tq_page_v_off(g, (uint32_t)h, t % g->page_tokens);
			if (tq_decode_ref(c->vc, blk, 1, v))
				return INFINITY;
			double n2 = 0.0;
			for (int j = 0; j < c->dim; j++)
				n2 += (double)v[j] * v[j];
			if (sqrt(n2) > mx)
				mx = sqrt(n2);
		}
	return mx;
}

/* Sparse-V's contract: at most sparse_v of each row's attention mass is
 * skipped, so each output row moves (in L2) by at most sparse_v times the
 * largest value norm from the same call without skipping; and it does skip. */
static void test_sparse_v(void)
{
	enum { NQ = 5, ROWS = NQ * 32 };
	struct kv c;
	static const int32_t poss[NQ] = { 2999, 1500, 257, 2000, 31 };
	float *ref = malloc(ROWS * 128 * sizeof(float)), *full = malloc(ROWS * 128 * sizeof(float));
	float *out = malloc(ROWS * 128 * sizeof(float));
	tq_error err;

	T_ASSERT(ref && full && out);
	T_ASSERT(kv_build(&c, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 128, 8, 256, 3000, t_seed()) == 0);
	const double vmax = max_v_norm(&c);
	T_ASSERT(vmax > 0.0 && vmax < 1e3);
	/* one query token (the register-direct decode path), then five (row
	 * blocks through the tile path, causal limits inside chunks) */
	for (int nq = 1; nq <= NQ; nq += NQ - 1) {
		struct qset s;
		const int rows = nq * 32;
		qset_make(&s, nq, 32, 128, poss);
		for (int i = 0; i < rows * 128; i++)
			s.q[i] *= 2.0f; /* peaky attention, as in real models */
		struct tq_attn_params p = params_for(&c, &s, ref, 1);
		T_EQ(tq_attend_ref(&p, &err), 0);
		for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
			if (!isa_on(isas[i]))
				continue;
			p.isa = isas[i];
			p.out = full;
			p.sparse_v = 0.0f;
			struct tq_attn_stats st0 = { 0, 0 }, st = { 0, 0 };
			p.stats = &st0;
			T_EQ(tq_attend(&p, &err), 0);
			/* every chunk reached, none skipped: at one query token
			 * each of the 8 KV heads' 3000 keys in 94 chunks (the
			 * splits and pages start on chunk boundaries) */
			T_ASSERT(st0.v_chunks > 0 && st0.v_skipped == 0);
			if (nq == 1)
				T_EQ(st0.v_chunks, 8u * 94u);
			p.out = out;
			p.sparse_v = 1e-30f;
			p.stats = &st;
			T_EQ(tq_attend(&p, &err), 0);
			T_EQ(st.v_chunks, st0.v_chunks);
			/* skipping only tokens no row weighs changes no bit */
			T_ASSERT(row_err(out, full, (size_t)rows, 128) == 0.0);
			/* against the oracle: this attention is twice as peaked as
			 * the rest of the matrix, and the integer key scoring's
			 * logit error grows with the logits (ARCHITECTURE.md,
			 * "Prepared-row key scoring"): TOL_INT for those paths */
			const double oe = row_err(full, ref, (size_t)rows, 128);
			if (getenv("TQ_TEST_VERBOSE"))
				fprintf(stderr, "  %s, %d queries: %.3g from the oracle\n", tq_isa_name(isas[i]), nq, oe);
			T_ASSERT(oe <= (isas[i] == TQ_ISA_AVX2 || isas[i] == TQ_ISA_AVX512 ? TOL_INT : TOL));
			static const float eps[] = { 1e-3f, 1e-2f, 0.1f };
			for (size_t e = 0; e < sizeof(eps) / sizeof(eps[0]); e++) {
				p.sparse_v = eps[e];
				st.v_chunks = st.v_skipped = 0;
				T_EQ(tq_attend(&p, &err), 0);
				/* the same chunks reached; some skipped, counted */
				T_EQ(st.v_chunks, st0.v_chunks);
				T_ASSERT(st.v_skipped > 0 && st.v_skipped < st.v_chunks);
				double worst = 0.0, moved = 0.0;
				for (int r = 0; r < rows; r++) {
					double d2 = 0.0;
					for (int j = 0; j < 128; j++) {
						double d = (double)out[r * 128 + j] - full[r * 128 + j];
						d2 += d * d;
					}
					double dn = sqrt(d2);
					if (!(dn / (eps[e] * vmax) <= worst))
						worst = dn / (eps[e] * vmax);
					if (dn > moved)
						moved = dn;
				}
				if (getenv("TQ_TEST_VERBOSE") || !(worst <= 1.0 + 1e-3))
					fprintf(stderr, "  sparse-V %g, %d queries, %s: moved %.3g, %.3f of the bound\n",
						(double)eps[e], nq, tq_isa_name(isas[i]), moved, worst);
				T_ASSERT(worst <= 1.0 + 1e-3);
				T_ASSERT(moved > 1e-6); /* values were skipped: the result moved */
				if (getenv("TQ_TEST_VERBOSE"))
					fprintf(stderr, "  sparse-V %g, %d queries, %s: %llu of %llu value chunks skipped\n",
						(double)eps[e], nq, tq_isa_name(isas[i]),
						(unsigned long long)st.v_skipped, (unsigned long long)st.v_chunks);
			}
			p.stats = NULL;
		}
		qset_free(&s);
	}
	kv_free(&c);
	free(ref);
	free(full);
	free(out);
}

/* Every SIMD path this CPU has must be available to attention (a build
 * that silently lost one would otherwise pass with fewer paths tested). */
static void test_isa_available(void)
{
	T_ASSERT(tq_attn_isa_supported(TQ_ISA_SCALAR));
#if defined(__x86_64__)
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
		T_ASSERT(tq_attn_isa_supported(TQ_ISA_AVX2));
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
		T_ASSERT(tq_attn_isa_supported(TQ_ISA_AVX512));
#endif
#if defined(__aarch64__)
	T_ASSERT(tq_attn_isa_supported(TQ_ISA_NEON)); /* Advanced SIMD is baseline on aarch64 */
#endif
}

static void test_page_layout(void)
{
	struct tq_page_geom g = { .n_kv_heads = 8, .page_tokens = 256, .k_block_bytes = 68, .v_block_bytes = 52 };
	T_EQ(tq_page_k_bytes(&g), 8 * 256 * 68);
	T_EQ(tq_page_v_offset(&g), 139264);
	T_EQ(tq_page_bytes(&g), 139264 + 8 * 256 * 52);
	T_EQ(tq_page_k_off(&g, 3, 5), (3 * 256 + 5) * 68);
	T_EQ(tq_page_v_off(&g, 7, 255), 139264 + (7 * 256 + 255) * 52);
	struct tq_page_geom o = { .n_kv_heads = 1, .page_tokens = 3, .k_block_bytes = 36, .v_block_bytes = 52 };
	T_EQ(tq_page_v_offset(&o), 128);
	T_EQ(tq_page_bytes(&o), 320);
	T_EQ(tq_page_count(&o, 0), 0);
	T_EQ(tq_page_count(&o, 3), 1);
	T_EQ(tq_page_count(&o, 4), 2);
	T_ASSERT(tq_page_geom_valid(&g));
	o.page_tokens = 0;
	T_ASSERT(!tq_page_geom_valid(&o));
}

/* ---- the thread pool ------------------------------------------------------ */

struct count_job {
	_Atomic int hits[1000];
	_Atomic int bad_thread;
	int n_threads;
};

static void count_task(void *arg, int task, int thread)
{
	struct count_job *j = arg;
	atomic_fetch_add(&j->hits[task], 1);
	if (thread < 0 || thread >= j->n_threads)
		atomic_store(&j->bad_thread, 1);
}

static void *hammer(void *arg)
{
	static struct count_job jobs[2];
	struct count_job *j = &jobs[arg != NULL];
	long bad = 0;

	for (int rep = 0; rep < 200; rep++) {
		memset(j, 0, sizeof(*j));
		j->n_threads = 3;
		tq_threads_run(pool3, count_task, j, 1000);
		for (int i = 0; i < 1000; i++)
			bad += atomic_load(&j->hits[i]) != 1;
		bad += atomic_load(&j->bad_thread);
	}
	return (void *)bad;
}

static void pause_spin(void)
{
	for (volatile int z = 0; z < 2000; z++)
		;
}

/* A worker late for a job must not claim a task of it with the next job's
 * parameters: with a pause between publishing a job and opening its tasks
 * (where the caller may be preempted), jobs of 2 and of 200 tasks in turn
 * each run every task exactly once.  (Before the claims were closed first,
 * about one task in two of the 200 ran twice here.) */
static void test_threads_late_worker(void)
{
	tq_threads *t;
	struct count_job *j = calloc(1, sizeof(*j));
	long bad = 0;

	T_ASSERT(j != NULL);
	T_EQ(tq_threads_new(&t, 4), 0);
	tq_threads_test_pause = pause_spin;
	for (int rep = 0; rep < 4000; rep++) {
		const int n = rep % 2 ? 200 : 2;
		memset(j, 0, sizeof(*j));
		j->n_threads = 4;
		tq_threads_run(t, count_task, j, n);
		for (int i = 0; i < n; i++)
			bad += atomic_load(&j->hits[i]) != 1;
	}
	tq_threads_test_pause = NULL;
	tq_threads_free(t);
	free(j);
	T_EQ(bad, 0);
}

static void test_threads(void)
{
	tq_threads *t;
	struct count_job *j = calloc(1, sizeof(*j));

	T_EQ(tq_threads_new(&t, 0), -EINVAL);
	T_EQ(tq_threads_new(&t, 4), 0);
	T_EQ(tq_threads_count(t), 4);
	T_EQ(tq_threads_count(NULL), 1);
	for (int rep = 0; rep < 500; rep++) {
		int n = rep % 7 == 0 ? 1 : rep % 50 + 1;
		memset(j, 0, sizeof(*j));
		j->n_threads = 4;
		T_EQ(tq_threads_run(t, count_task, j, n), 0);
		for (int i = 0; i < n; i++)
			T_EQ(atomic_load(&j->hits[i]), 1);
		T_EQ(atomic_load(&j->bad_thread), 0);
	}
	T_EQ(tq_threads_run(t, count_task, j, -1), -EINVAL);
	T_EQ(tq_threads_run(NULL, count_task, j, 3), 0);
	tq_threads_free(t);
	tq_threads_free(NULL);
	free(j);

	/* two callers sharing one pool are serialized, each job complete */
	pthread_t a, b;
	void *ra, *rb;
	pthread_create(&a, NULL, hammer, NULL);
	pthread_create(&b, NULL, hammer, (void *)1);
	pthread_join(a, &ra);
	pthread_join(b, &rb);
	T_EQ((long)ra, 0);
	T_EQ((long)rb, 0);
}

/* plan_n_q: the queries of one call run as several calls, each planned as
 * the whole (plan_n_q = its n_q), give the whole call's bits on every ISA,
 * with the pool splitting the keys (1100 tokens: a pass of a few queries
 * alone would be split in 2, the whole call's 5 row tiles x 2 KV heads are
 * not) — also where the keys are scored from a prepared tile for calls of
 * several row blocks and from their bytes for a lone one (ktile_d128: q8,
 * tq4, tq3, tq4o keys).  Out of range: -EINVAL. */
static void plan_n_q_for(enum tq_codec_id kid);
static void test_plan_n_q(void)
{
	static const enum tq_codec_id kids[] = { TQ_CODEC_Q8, TQ_CODEC_TQ4, TQ_CODEC_TQ3, TQ_CODEC_TQ4O };
	for (size_t ki = 0; ki < sizeof(kids) / sizeof(kids[0]); ki++)
		plan_n_q_for(kids[ki]);
}

static void plan_n_q_for(enum tq_codec_id kid)
{
	enum { NQ = 130, G = 4, D = 128 };
	struct kv c;
	struct qset s;
	int32_t pos[NQ];
	tq_error err;

	for (int i = 0; i < NQ; i++)
		pos[i] = 1099 - 7 * i;
	T_ASSERT(kv_build(&c, kid, TQ_CODEC_TQ4, D, 2, 256, 1100, t_seed()) == 0);
	qset_make(&s, NQ, 2 * G, D, pos);
	const size_t row = (size_t)2 * G * D;
	float *whole = malloc(NQ * row * sizeof(float)), *part = malloc(NQ * row * sizeof(float));
	T_ASSERT(whole && part);
	for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
		if (!isa_on(isas[i]))
			continue;
		struct tq_attn_params p = params_for(&c, &s, whole, 1);
		p.isa = isas[i];
		p.threads = pool3;
		T_EQ(tq_attend(&p, &err), 0);
		/* passes of 1, 3, 5, ... queries */
		for (int q0 = 0, n = 1; q0 < NQ; q0 += n, n += 2) {
			if (n > NQ - q0)
				n = NQ - q0;
			p.n_q = n;
			p.plan_n_q = NQ;
			p.q = s.q + (size_t)q0 * row;
			p.q_pos = pos + q0;
			p.out = part + (size_t)q0 * row;
			T_EQ(tq_attend(&p, &err), 0);
		}
		for (int q = 0; q < NQ; q++)
			if (memcmp(whole + q * row, part + q * row, row * sizeof(float)))
				T_FAIL("%s, K %s: query %d differs between the whole call and its pass",
				       tq_isa_name(isas[i]), tq_codec_name(kid), q);
		p.n_q = 2;
		p.plan_n_q = 1;
		T_EQ(tq_attend(&p, &err), -EINVAL);
		T_ASSERT(strstr(err.msg, "plan_n_q"));
		p.plan_n_q = TQ_ATTN_MAX_Q + 1;
		T_EQ(tq_attn_workspace_bytes(&p, &err), -EINVAL);
	}
	free(whole);
	free(part);
	qset_free(&s);
	kv_free(&c);
}

/* Key scoring that is not the float dot product (ops with qprep_d128: the
 * integer scoring of the AVX2 path) against the exact dot product of the
 * decoded keys, in double: the logit error it adds, relative to |q| |k|.
 * Rotated queries are near Gaussian, so the error is what rounding q and c
 * to 15 bits gives: measured rms 3-5e-6, worst 2-5e-5 over seeds (AVX2);
 * the bounds checked are about 4x those.  A flat row against a key of top
 * centroids checks that no integer sum leaves its range (AVX-512 sums a
 * token's 8 products per lane before converting: qprep_rows scales such
 * rows down).  TQ_TEST_VERBOSE prints the figures. */
static const struct tqa_ops *isa_ops(enum tq_isa isa)
{
	if (!isa_on(isa))
		return NULL;
	switch (isa) {
	case TQ_ISA_AVX2: return tqa_ops_avx2();
	case TQ_ISA_AVX512: return tqa_ops_avx512();
	case TQ_ISA_NEON: return tqa_ops_neon();
	default: return NULL;
	}
}

static void test_key_scoring_error(void)
{
	enum { D = 128, NT = 96 };
	static const enum tq_codec_id kids[] = { TQ_CODEC_TQ2, TQ_CODEC_TQ3, TQ_CODEC_TQ4, TQ_CODEC_Q8,
						 TQ_CODEC_TQ4O, TQ_CODEC_TQ3O };
	float *k = malloc(NT * D * sizeof(float)), *v = malloc(NT * D * sizeof(float));
	float q[TQA_ROWS * D], tile[TQA_CHUNK * D], scale[TQA_CHUNK], s[TQA_CHUNK * TQA_ROWS];
	uint8_t *blk = malloc(NT * 132 + 64), *qp = aligned_alloc(64, TQA_QPREP_BYTES);
	int tested = 0;

	T_ASSERT(k && v && blk && qp);
	for (size_t ii = 0; ii < sizeof(isas) / sizeof(isas[0]); ii++) {
		const struct tqa_ops *o = isa_ops(isas[ii]);
		for (size_t ci = 0; o && ci < sizeof(kids) / sizeof(kids[0]); ci++) {
			enum tq_codec_id id = kids[ci];
			if (!o->qprep_d128[id] || !o->scores_d128[id])
				continue;
			struct tq_codec_params cp = { .id = id, .dim = D, .seed = t_seed() + ci };
			tq_codec *c;
			tq_error err;
			T_ASSERT(tq_codec_new(&c, cache, &cp, &err) == 0);
			rng_seed(t_seed() ^ (0x51 + ci));
			fill_kv(k, v, NT, D);
			T_ASSERT(tq_encode(c, k, TQ_DTYPE_F32, NT, blk, &err) == 0);
			/* one key of every index at its largest (the top centroid in
			 * every dim; q8: code 127 or -1 by byte), against the flat
			 * row below: each lane's 8 products at their largest, past
			 * int32 for a path that sums them unchecked */
			const size_t bb = (size_t)tq_codec_block_bytes(c);
			memset(blk + (NT - 1) * bb + 4, 0xFF, bb - 4);
			double worst = 0.0, sum2 = 0.0;
			int cnt = 0;
			for (int trial = 0; trial < 8; trial++) {
				double qn[TQA_ROWS];
				for (int r = 0; r < TQA_ROWS; r++) {
					qn[r] = 0.0;
					/* rotated, scale2-scaled rows: Gaussian, one with a spike */
					for (int j = 0; j < D; j++) {
						q[r * D + j] = gauss() * 0.2f * (r == 3 && j == trial ? 8.0f : 1.0f);
						if (r == 2 && trial >= 6) /* flat: every |q_j| the largest */
							q[r * D + j] = trial == 6 ? 0.2f : -0.2f;
						qn[r] += (double)q[r * D + j] * q[r * D + j];
					}
					qn[r] = sqrt(qn[r]);
				}
				o->qprep_d128[id](c, q, qp);
				for (int t0 = 0; t0 < NT; t0 += TQA_CHUNK) {
					const uint8_t *b = blk + (size_t)t0 * tq_codec_block_bytes(c);
					o->scores_d128[id](c, b, TQA_CHUNK, (const float *)(const void *)qp, s);
					const float *kt = tqa_decode_scalar(c, b, TQA_CHUNK, tile, scale);
					for (int t = 0; t < TQA_CHUNK; t++) {
						double kn = 0.0;
						for (int j = 0; j < D; j++)
							kn += (double)kt[t * D + j] * kt[t * D + j];
						kn = sqrt(kn) * fabs(scale[t]);
						for (int r = 0; r < TQA_ROWS; r++) {
							double dot = 0.0;
							for (int j = 0; j < D; j++)
								dot += (double)q[r * D + j] * kt[t * D + j];
							dot *= scale[t];
							double e = fabs(s[t * TQA_ROWS + r] - dot) / (qn[r] * kn + 1e-30);
							if (!(e <= worst))
								worst = e;
							sum2 += e * e;
							cnt++;
						}
					}
				}
			}
			double rms = sqrt(sum2 / cnt);
			if (getenv("TQ_TEST_VERBOSE") || !(worst <= 2e-4) || !(rms <= 4e-5))
				fprintf(stderr, "  %s %s key scoring: logit error / (|q| |k|): rms %.2g, max %.2g\n",
					tq_isa_name(isas[ii]), tq_codec_name(id), rms, worst);
			T_ASSERT(worst <= 2e-4);
			T_ASSERT(rms <= 4e-5);
			tested++;
			tq_codec_free(c);
		}
	}
	if (getenv("TQ_TEST_VERBOSE"))
		fprintf(stderr, "  key scorings other than the float dot product tested: %d\n", tested);
	free(k);
	free(v);
	free(blk);
	free(qp);
}

/* One ISA's plain and VNNI ops (the ISA's getter picks the latter where
 * the CPU has it): the same scores, bit for bit (the same integer sums),
 * direct and from the prepared tile — every integer-scored key codec,
 * queries with spikes and zeros, a short last chunk. */
static void vnni_compare(const char *what, const struct tqa_ops *plain, const struct tqa_ops *vnni,
			 const struct tqa_ops *picked)
{
	enum { D = 128, NT = 70 };
	static const enum tq_codec_id kids[] = { TQ_CODEC_TQ2, TQ_CODEC_TQ3, TQ_CODEC_TQ4, TQ_CODEC_Q8,
						 TQ_CODEC_TQ4O, TQ_CODEC_TQ3O };

	if (!plain || !vnni) {
		fprintf(stderr, "    no %s on this CPU: nothing to compare\n", what);
		return;
	}
	T_ASSERT(picked == vnni);
	float *k = malloc(NT * D * sizeof(float)), *v = malloc(NT * D * sizeof(float));
	float q[TQA_ROWS * D], s0[TQA_CHUNK * TQA_ROWS], s1[TQA_CHUNK * TQA_ROWS];
	uint8_t *blk = malloc(NT * 132 + 64), *qp = aligned_alloc(64, TQA_QPREP_BYTES);
	uint8_t *kt = aligned_alloc(64, TQA_KTILE_BYTES);
	T_ASSERT(k && v && blk && qp && kt);
	for (size_t ci = 0; ci < sizeof(kids) / sizeof(kids[0]); ci++) {
		const enum tq_codec_id id = kids[ci];
		struct tq_codec_params cp = { .id = id, .dim = D, .seed = t_seed() + ci };
		tq_codec *c;
		tq_error err;
		T_ASSERT(tq_codec_new(&c, cache, &cp, &err) == 0);
		rng_seed(t_seed() ^ (0x71 + ci));
		fill_kv(k, v, NT, D);
		T_ASSERT(tq_encode(c, k, TQ_DTYPE_F32, NT, blk, &err) == 0);
		const size_t bb = tq_codec_block_bytes(c);
		for (int trial = 0; trial < 6; trial++) {
			for (int j = 0; j < TQA_ROWS * D; j++)
				q[j] = trial == 5 && j < D ? 0.0f : gauss() * (j % 37 == trial ? 30.0f : 1.0f);
			plain->qprep_d128[id](c, q, qp);
			for (int t0 = 0; t0 < NT; t0 += TQA_CHUNK) {
				const int n = NT - t0 < TQA_CHUNK ? NT - t0 : TQA_CHUNK;
				const float *qf = (const float *)(const void *)qp;
				memset(s0, 0, sizeof(s0));
				memset(s1, 0, sizeof(s1));
				plain->scores_d128[id](c, blk + (size_t)t0 * bb, n, qf, s0);
				vnni->scores_d128[id](c, blk + (size_t)t0 * bb, n, qf, s1);
				T_ASSERT(memcmp(s0, s1, sizeof(s0)) == 0);
				/* the prepared-key tile's scorers too (prefill), both:
				 * the plain one is what a CPU without VNNI runs (Zen 3),
				 * and nothing else runs it on a machine with VNNI */
				if (plain->ktile_d128[id] && vnni->scores_ktile_d128[id]) {
					plain->ktile_d128[id](c, blk + (size_t)t0 * bb, n, qp, kt);
					memset(s1, 0, sizeof(s1));
					vnni->scores_ktile_d128[id](c, kt, n, qf, s1);
					T_ASSERT(memcmp(s0, s1, sizeof(s0)) == 0);
					T_ASSERT(plain->scores_ktile_d128[id]);
					memset(s1, 0, sizeof(s1));
					plain->scores_ktile_d128[id](c, kt, n, qf, s1);
					T_ASSERT(memcmp(s0, s1, sizeof(s0)) == 0);
				}
			}
		}
		tq_codec_free(c);
	}
	free(k);
	free(v);
	free(blk);
	free(qp);
	free(kt);
}

/* AVX512-VNNI against AVX-512 without it; AVX-VNNI against AVX2 without it */
static void test_key_scoring_vnni(void)
{
	vnni_compare("AVX512-VNNI", tq_attn_isa_supported(TQ_ISA_AVX512) ? tqa_ops_avx512_vnni(0) : NULL,
		     tqa_ops_avx512_vnni(1), tqa_ops_avx512());
	vnni_compare("AVX-VNNI", tq_attn_isa_supported(TQ_ISA_AVX2) ? tqa_ops_avx2_vnni(0) : NULL,
		     tqa_ops_avx2_vnni(1), tqa_ops_avx2());
}

/* NEON with DotProd scores q8 keys in integers: bit for bit the same as
 * this plain-C twin of its method (rows to int16 at 32639 / max|q|, exact
 * integer dot products, then (float) sum · fac · scale), and NaN rows for a
 * query row holding a NaN.  Runs under qemu on x86 CI machines. */
static void test_key_scoring_dot(void)
{
	enum { D = 128, NT = 70 };
	const struct tqa_ops *dot = tqa_ops_neon_dot(1);

	if (!dot) {
		fprintf(stderr, "    no NEON DotProd on this CPU or build: nothing to compare\n");
		return;
	}
	T_ASSERT(tqa_ops_neon() == dot);
	T_ASSERT(dot->qprep_d128[TQ_CODEC_Q8] && dot->scores_d128[TQ_CODEC_Q8]);
	float *k = malloc(NT * D * sizeof(float)), *v = malloc(NT * D * sizeof(float));
	float q[TQA_ROWS * D], s[TQA_CHUNK * TQA_ROWS];
	uint8_t *blk = malloc(NT * 132 + 64), *qp = aligned_alloc(64, TQA_QPREP_BYTES);
	struct tq_codec_params cp = { .id = TQ_CODEC_Q8, .dim = D, .seed = t_seed() };
	tq_codec *c;
	tq_error err;

	T_ASSERT(k && v && blk && qp);
	T_ASSERT(tq_codec_new(&c, cache, &cp, &err) == 0);
	rng_seed(t_seed() ^ 0x3d);
	fill_kv(k, v, NT, D);
	T_ASSERT(tq_encode(c, k, TQ_DTYPE_F32, NT, blk, &err) == 0);
	const size_t bb = tq_codec_block_bytes(c);
	for (int trial = 0; trial < 7; trial++) {
		/* 5: a zero row; 6: a NaN in row 2 */
		for (int j = 0; j < TQA_ROWS * D; j++)
			q[j] = trial == 5 && j < D ? 0.0f : gauss() * (j % 37 == trial ? 30.0f : 1.0f);
		if (trial == 6)
			q[2 * D + 17] = NAN;
		dot->qprep_d128[TQ_CODEC_Q8](c, q, qp);
		for (int t0 = 0; t0 < NT; t0 += TQA_CHUNK) {
			const int n = NT - t0 < TQA_CHUNK ? NT - t0 : TQA_CHUNK;
			dot->scores_d128[TQ_CODEC_Q8](c, blk + (size_t)t0 * bb, n, (const float *)(const void *)qp, s);
			for (int r = 0; r < TQA_ROWS; r++) {
				const float *qr = q + r * D;
				float m = 0.0f;
				int nan = 0;
				for (int j = 0; j < D; j++) {
					nan |= isnan(qr[j]);
					m = fabsf(qr[j]) > m ? fabsf(qr[j]) : m;
				}
				const float sq = m > 0.0f && m <= 3.4e38f ? 32639.0f / m : 0.0f, fac = m / 32639.0f;
				for (int t = 0; t < n; t++) {
					const uint8_t *b = blk + (size_t)(t0 + t) * bb;
					const float got = s[t * TQA_ROWS + r];
					if (nan) {
						T_ASSERT(isnan(got));
						continue;
					}
					float sc;
					memcpy(&sc, b, 4);
					int32_t sum = 0;
					for (int j = 0; j < D; j++)
						sum += (int32_t)lrintf(qr[j] * sq) * (int8_t)b[TQ_Q8_HEADER_BYTES + j];
					const float want = ((float)sum * fac) * sc;
					if (memcmp(&got, &want, 4) != 0)
						T_FAIL("trial %d token %d row %d: %a, twin %a", trial, t0 + t, r, got, want);
				}
			}
		}
	}
	tq_codec_free(c);
	free(k);
	free(v);
	free(blk);
	free(qp);
}

/* The online-softmax step of every ISA makes no subnormal weight: a weight
 * below 2^-125 of the row's max is 0.  (Each instruction that produces a
 * subnormal costs an Intel core a microcode assist, about 150 cycles: with
 * sharp attention — `tqbench attn --q-scale 16` — the AVX-512 kernels once
 * ran 12 x slower, fp16 included.)  Scores spread over 0 .. -240 in base 2,
 * rows starting (m = -inf) and continuing, chunks cut short; the weights and
 * the running sums stay within 1e-6 of the scalar step's. */
/* Queries so small that the integer scorers' scale (Q / max|q|) leaves
 * float range: every path must finish, with logits 0 to float precision
 * (the oracle: the values' plain mean), decode and prefill alike. */
static void test_tiny_queries(void)
{
	static const struct { enum tq_codec_id k, v; } pairs[] = {
		{ TQ_CODEC_TQ4, TQ_CODEC_TQ3 }, { TQ_CODEC_Q8, TQ_CODEC_TQ4 }, { TQ_CODEC_TQ4O, TQ_CODEC_TQ3 },
	};
	int32_t pos[3] = { 299, 150, 20 };

	for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
		struct kv c;
		T_ASSERT(kv_build(&c, pairs[i].k, pairs[i].v, 128, 2, 64, 300, t_seed() + i) == 0);
		for (int nq = 1; nq <= 3; nq += 2)
			for (int e = 0; e < 2; e++) {
				struct qset s;
				qset_make(&s, nq, 8, 128, pos);
				for (size_t j = 0; j < (size_t)nq * 8 * 128; j++)
					s.q[j] *= e ? 1e-30f : 1e-37f;
				double err = compare(params_for(&c, &s, NULL, 1), "tiny queries");
				T_ASSERT(err >= 0 && err <= TOL);
				qset_free(&s);
			}
		kv_free(&c);
	}
}

/* Every ISA's value-accumulator orders (accum_d128_perm) are permutations
 * of the 128 dims, and only where the codec has an accum_d128. */
static void test_accum_orders(void)
{
	int seen_any = 0;

	for (size_t ii = 0; ii < sizeof(isas) / sizeof(isas[0]); ii++) {
		const struct tqa_ops *o = isa_ops(isas[ii]);
		for (int id = 0; o && id < TQ_CODEC__COUNT; id++) {
			const uint8_t *perm = o->accum_d128_perm[id];
			if (!perm)
				continue;
			T_ASSERT(o->accum_d128[id] != NULL);
			int hit[128] = { 0 };
			for (int p = 0; p < 128; p++) {
				T_ASSERT(perm[p] < 128);
				hit[perm[p] & 127]++;
			}
			for (int j = 0; j < 128; j++)
				T_EQ(hit[j], 1);
			seen_any = 1;
		}
	}
	if (getenv("TQ_TEST_VERBOSE"))
		fprintf(stderr, "  accumulator orders checked: %s\n", seen_any ? "yes" : "none on this CPU");
}

static void test_softmax_no_subnormal(void)
{
	float s0[TQA_CHUNK * TQA_ROWS], s1[TQA_CHUNK * TQA_ROWS];
	int tested = 0;

	for (size_t ii = 0; ii < sizeof(isas) / sizeof(isas[0]); ii++) {
		const struct tqa_ops *o = isa_ops(isas[ii]);
		if (!o)
			continue;
		tested++;
		rng_seed(t_seed() ^ 0x5f);
		for (int trial = 0; trial < 40; trial++) {
			const int n = trial % 5 == 4 ? 1 + trial % TQA_CHUNK : TQA_CHUNK;
			int vis[TQA_ROWS];
			float m0[TQA_ROWS], l0[TQA_ROWS], a0[TQA_ROWS], m1[TQA_ROWS], l1[TQA_ROWS], a1[TQA_ROWS];
			for (int r = 0; r < TQA_ROWS; r++) {
				vis[r] = r == 3 ? n / 2 : n;
				m0[r] = m1[r] = trial % 2 ? -INFINITY : 5.0f;
				l0[r] = l1[r] = trial % 2 ? 0.0f : 1.0f;
			}
			for (int i = 0; i < TQA_CHUNK * TQA_ROWS; i++)
				s0[i] = s1[i] = (float)(urand() * -240.0);
			tqa_softmax_scalar(s0, n, vis, m0, l0, a0);
			o->softmax(s1, n, vis, m1, l1, a1);
			for (int i = 0; i < n * TQA_ROWS; i++) {
				T_ASSERT(s1[i] == 0.0f || s1[i] >= FLT_MIN);
				T_ASSERT(fabsf(s1[i] - s0[i]) <= 1e-6f);
			}
			for (int r = 0; r < TQA_ROWS; r++) {
				T_ASSERT(m1[r] == m0[r]);
				T_ASSERT(fabsf(l1[r] - l0[r]) <= 1e-6f * l0[r]);
				T_ASSERT(fabsf(a1[r] - a0[r]) <= 1e-6f);
			}
		}
	}
	T_ASSERT(tested > 0);
}

/* Every ISA's tile decoder against the portable one, bit for bit (they
 * return the codebook's own floats), at every dim class, from blocks that
 * end exactly where their allocation ends into a tile of exactly n rows:
 * a decoder that reads past a block or writes past a row shows here (and
 * under ASan, at the allocation's edge). */
static void test_tile_decoders(void)
{
	static const int dims[] = { 8, 40, 64, 96, 128, 192, 256, 384, 512 };
	const int n = 5;

	for (size_t ii = 0; ii < sizeof(isas) / sizeof(isas[0]); ii++) {
		const struct tqa_ops *o = isa_ops(isas[ii]);
		for (size_t di = 0; o && di < sizeof(dims) / sizeof(dims[0]); di++) {
			for (int ci = 0; ci < N_CODECS; ci++) {
				const int d = dims[di];
				struct tq_codec_params cp = { .id = all_codecs[ci], .dim = d, .seed = 77 + di };
				if (tq_block_bytes(all_codecs[ci], d, NULL) < 0)
					continue; /* tq*o: dims of 16s */
				tq_codec *c;
				tq_error err;
				T_ASSERT(tq_codec_new(&c, cache, &cp, &err) == 0);
				const size_t bb = tq_codec_block_bytes(c);
				float *x = malloc((size_t)n * d * sizeof(float));
				uint8_t *blk = malloc((size_t)n * bb);
				float *tile = malloc((size_t)n * d * sizeof(float)), *ref = malloc((size_t)n * d * sizeof(float));
				float sc[TQA_CHUNK], scr[TQA_CHUNK];
				T_ASSERT(x && blk && tile && ref);
				for (int i = 0; i < n * d; i++)
					x[i] = gauss();
				T_ASSERT(tq_encode(c, x, TQ_DTYPE_F32, (size_t)n, blk, &err) == 0);
				const float *a = o->decode(c, blk, n, tile, sc);
				const float *b = tqa_decode_scalar(c, blk, n, ref, scr);
				if (memcmp(a, b, (size_t)n * d * sizeof(float)) || memcmp(sc, scr, (size_t)n * sizeof(float)))
					T_FAIL("%s tile decoder, %s d=%d: differs from the portable one",
					       tq_isa_name(isas[ii]), tq_codec_name(all_codecs[ci]), d);
				free(x);
				free(blk);
				free(tile);
				free(ref);
				tq_codec_free(c);
			}
		}
	}
}

/* f32 keys: key t of every KV head := x[dim] (their blocks are the values). */
static void kv_set_key(struct kv *c, uint32_t t, const float *x)
{
	const struct tq_page_geom *g = &c->table.geom;

	for (int h = 0; h < c->n_kv; h++)
		memcpy(c->pages[t / g->page_tokens] + tq_page_k_off(g, (uint32_t)h, t % g->page_tokens), x,
		       (size_t)c->dim * sizeof(float));
}

/* Query row r of out is all NaN (want) or all finite and within TOL of ref. */
static int row_ok(const float *out, const float *ref, size_t r, int dim, int want_nan)
{
	for (int j = 0; j < dim; j++)
		if (want_nan ? !isnan(out[r * dim + j]) : !isfinite(out[r * dim + j]))
			return 0;
	return want_nan || row_err(out + r * dim, ref + r * dim, 1, dim) <= TOL;
}

/* Finite inputs whose logits leave float range (f32 keys: the test sets
 * every product): (a) one key's logit +inf; (b) every logit -inf; (c) NaN
 * logits (products overflowing both ways) in a whole chunk before ordinary
 * keys; (d) NaN logits filling the last split of a split-K call, next to a
 * query that sees only ordinary keys.  Every ISA, pooled or not, tile
 * (d 64) and register-direct (d 128) paths: those rows are NaN — never a
 * finite number — and the ordinary one matches the oracle. */
static void test_overflow(void)
{
	static float big[128], alt[128], qb[2 * 128];
	float out[2 * 128], ref[2 * 128];
	tq_error err;

	for (int j = 0; j < 128; j++) {
		big[j] = 1e30f;
		alt[j] = (j & 1) ? -1e30f : 1e30f;
	}
	for (int dim = 64; dim <= 128; dim += 64)
		for (int cs = 0; cs < 4; cs++) {
			const uint32_t len = cs == 3 ? 2000 : 40;
			const int nq = cs == 3 ? 2 : 1;
			int32_t pos[2] = { (int32_t)len - 1, 1000 };
			struct kv c;

			T_ASSERT(kv_build(&c, TQ_CODEC_F32, TQ_CODEC_F32, dim, 1, 256, len, t_seed()) == 0);
			for (uint32_t t = 0; t < len; t++)
				if ((cs == 0 && t == 0) || cs == 1)
					kv_set_key(&c, t, big);
				else if ((cs == 2 && t < 32) || (cs == 3 && t >= 1300))
					kv_set_key(&c, t, alt);
			for (int j = 0; j < dim; j++) {
				qb[j] = cs == 1 ? -1e10f : 1e10f;
				qb[dim + j] = gauss();
			}
			struct qset s = { .n_q = nq, .n_q_heads = 1, .q = qb, .pos = pos };
			struct tq_attn_params p = params_for(&c, &s, ref, 1);
			T_EQ(tq_attend_ref(&p, &err), 0);
			for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
				if (!isa_on(isas[i]))
					continue;
				for (int pooled = 0; pooled < 2; pooled++) {
					p.isa = isas[i];
					p.threads = pooled ? pool3 : NULL;
					p.out = out;
					T_EQ(tq_attend(&p, &err), 0);
					if (!row_ok(out, ref, 0, dim, 1) || (nq > 1 && !row_ok(out, ref, 1, dim, 0)))
						T_FAIL("case %c d %d %s%s: out[0] %g, out[%d] %g", 'a' + cs, dim,
						       tq_isa_name(isas[i]), pooled ? " pooled" : "", out[0], dim,
						       out[dim]);
				}
			}
			kv_free(&c);
		}
}

int main(void)
{
	cache = tq_cache_new();
	if (!cache || tq_threads_new(&pool3, 3))
		return 1;
	fprintf(stderr, "best ISA: %s; attention paths tested:", tq_isa_name(tq_isa_best()));
	for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++)
		if (isa_on(isas[i]))
			fprintf(stderr, " %s", tq_isa_name(isas[i]));
	fputc('\n', stderr);
	T_RUN(test_isa_available);
	T_RUN(test_page_layout);
	T_RUN(test_threads);
	T_RUN(test_threads_late_worker);
	T_RUN(test_errors);
	T_RUN(test_one_token);
	T_RUN(test_all_pairs_d128);
	T_RUN(test_dims_and_groups);
	T_RUN(test_split_k);
	T_RUN(test_query_dtypes);
	T_RUN(test_scale_noncausal);
	T_RUN(test_sparse_v);
	T_RUN(test_plan_n_q);
	T_RUN(test_key_scoring_error);
	T_RUN(test_key_scoring_vnni);
	T_RUN(test_key_scoring_dot);
	T_RUN(test_tile_decoders);
	T_RUN(test_overflow);
	T_RUN(test_softmax_no_subnormal);
	T_RUN(test_accum_orders);
	T_RUN(test_tiny_queries);
	tq_threads_free(pool3);
	tq_cache_free(cache);
	return t_done();
}
