/* bench_attn — fused attention over the compressed cache against its
 * baselines, measured in the same run:
 *
 *   fused_ms                 tq_attend on the K/V codec pair
 *   dequant_then_attend_ms   tq_decode of every block of the same pages to
 *                            fp32 pages, then the fp32 kernel (both on the pool)
 *   fp16_ms                  tq_attend over an fp16 cache (the f16 x f16 fast
 *                            path: F16C/AVX-512 conversion into L1 tiles)
 *   fp32_ms                  tq_attend over an fp32 cache
 *   read_bw_gbs              a read-only sum over 256 MiB on the same threads
 *   cos_vs_exact             mean cosine of the fused output against attention
 *                            on the uncompressed fp32 K/V (the fp32 path, which
 *                            the unit tests hold to the double oracle)
 *
 * Geometry: 32 query heads, 8 KV heads, head dim 128; decode = 1 query token at
 * the last position, prefill = 128 query tokens at the end of the context
 * (causal).  Each of --reps rounds times every figure once, in turn (so
 * outside load on a shared box hits them alike); the figures are medians.
 *
 * --quality: output cosine and top-1 agreement per codec pair on synthetic
 * keys shaped like real ones, plus the needle test (--trials, default 1000).
 *
 * --backend cuda: the GPU kernels of tq_cuda.h against PyTorch's SDPA on the
 * same GPU (bench_attn_cuda.c); this file parses its options.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_attn.h"
#include "tq_attn.h"
#include "tq_codec.h"
#include "tq_threads.h"

#define PREFILL_Q 128

/* ---- paged caches ---------------------------------------------------------- */

struct cache {
	tq_codec *kc, *vc;
	uint8_t *mem;                  /* [n_pages][page_bytes] */
	const uint8_t **pages;         /* [n_pages]             */
	struct tq_page_table t;
	size_t page_bytes;
};

static void cache_free(struct cache *c)
{
	tq_codec_free(c->kc);
	tq_codec_free(c->vc);
	free(c->mem);
	free(c->pages);
	memset(c, 0, sizeof(*c));
}

static int cache_new(struct cache *c, tq_cache *cbs, enum tq_codec_id kid, enum tq_codec_id vid,
		     int dim, int n_kv, uint32_t page_tokens, uint32_t len)
{
	struct tq_codec_params kp = { .id = kid, .dim = dim, .seed = 0xC0FFEE01 };
	struct tq_codec_params vp = { .id = vid, .dim = dim, .seed = 0xC0FFEE02 };
	tq_error err;

	memset(c, 0, sizeof(*c));
	if (tq_codec_new(&c->kc, cbs, &kp, &err) || tq_codec_new(&c->vc, cbs, &vp, &err)) {
		fprintf(stderr, "tqbench attn: %s\n", err.msg);
		return -EINVAL;
	}
	c->t.geom.n_kv_heads = (uint32_t)n_kv;
	c->t.geom.page_tokens = page_tokens;
	c->t.geom.k_block_bytes = (uint32_t)tq_codec_block_bytes(c->kc);
	c->t.geom.v_block_bytes = (uint32_t)tq_codec_block_bytes(c->vc);
	c->t.n_tokens = len;
	c->t.n_pages = tq_page_count(&c->t.geom, len);
	c->page_bytes = tq_page_bytes(&c->t.geom);
	/* as tqkvd's host pool (backend_host.c): transparent huge pages where
	 * the kernel gives them, so the pages cost the TLB what they cost the
	 * daemon */
	const size_t huge = 2u << 20, bytes = c->page_bytes * (c->t.n_pages ? c->t.n_pages : 1);
	const size_t whole = (bytes + huge - 1) / huge * huge;
	c->mem = aligned_alloc(huge, whole);
	if (c->mem)
		(void)madvise(c->mem, whole, MADV_HUGEPAGE);
	c->pages = calloc(c->t.n_pages + 1, sizeof(*c->pages));
	if (!c->mem || !c->pages)
		return -ENOMEM;
	for (uint32_t i = 0; i < c->t.n_pages; i++)
		c->pages[i] = c->mem + (size_t)i * c->page_bytes;
	c->t.pages = c->pages;
	return 0;
}

/* --resident N: page i of the table becomes page i % N, so the kernels do
 * the whole context's work on N pages that stay in cache — compute apart
 * from memory.  The caches all cycle alike (the fp32 oracle too), so the
 * outputs still match the exact one of the same table. */
static void cache_cycle(struct cache *c, uint32_t n)
{
	for (uint32_t i = n; i < c->t.n_pages; i++)
		c->pages[i] = c->pages[i % n];
}

/* Encodes k, v: [n_kv][len][dim] fp32 into the pages. */
static int cache_fill(struct cache *c, const float *k, const float *v)
{
	const struct tq_page_geom *g = &c->t.geom;
	tq_error err;
	int dim = tq_codec_dim(c->kc);

	for (uint32_t p = 0; p < c->t.n_pages; p++) {
		uint32_t t0 = p * g->page_tokens;
		uint32_t n = c->t.n_tokens - t0 < g->page_tokens ? c->t.n_tokens - t0 : g->page_tokens;
		for (uint32_t h = 0; h < g->n_kv_heads; h++) {
			size_t src = ((size_t)h * c->t.n_tokens + t0) * dim;
			uint8_t *pg = (uint8_t *)c->mem + (size_t)p * c->page_bytes;
			if (tq_encode(c->kc, k + src, TQ_DTYPE_F32, n, pg + tq_page_k_off(g, h, 0), &err) ||
			    tq_encode(c->vc, v + src, TQ_DTYPE_F32, n, pg + tq_page_v_off(g, h, 0), &err)) {
				fprintf(stderr, "tqbench attn: encode: %s\n", err.msg);
				return -EINVAL;
			}
		}
	}
	return 0;
}

/* ---- dequantize-then-attend: decode every page to an fp32 cache ------------ */

struct dq_job {
	const struct cache *src;
	struct cache *dst;    /* f32 / f32, same geometry */
};

static void dq_task(void *arg, int task, int thread)
{
	struct dq_job *j = arg;
	const struct tq_page_geom *gs = &j->src->t.geom, *gd = &j->dst->t.geom;
	uint32_t p = (uint32_t)task / gs->n_kv_heads, h = (uint32_t)task % gs->n_kv_heads;
	uint32_t t0 = p * gs->page_tokens;
	uint32_t n = j->src->t.n_tokens - t0 < gs->page_tokens ? j->src->t.n_tokens - t0 : gs->page_tokens;
	const uint8_t *ps = j->src->pages[p];
	uint8_t *pd = j->dst->mem + (size_t)p * j->dst->page_bytes;

	tq_decode(j->src->kc, ps + tq_page_k_off(gs, h, 0), n, (float *)(void *)(pd + tq_page_k_off(gd, h, 0)));
	tq_decode(j->src->vc, ps + tq_page_v_off(gs, h, 0), n, (float *)(void *)(pd + tq_page_v_off(gd, h, 0)));
	(void)thread;
}

/* ---- read bandwidth --------------------------------------------------------- */

struct bw_job {
	const uint64_t *buf;
	size_t words;
	int parts;
	uint64_t sum[256 * 8];
};

__attribute__((target("avx2")))
static uint64_t sum_words_avx2(const uint64_t *p, size_t n)
{
	uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
	for (size_t i = 0; i + 8 <= n; i += 8) {
		a0 += p[i]; a1 += p[i + 1]; a2 += p[i + 2]; a3 += p[i + 3];
		a4 += p[i + 4]; a5 += p[i + 5]; a6 += p[i + 6]; a7 += p[i + 7];
	}
	return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

static uint64_t sum_words(const uint64_t *p, size_t n)
{
	uint64_t a0 = 0, a1 = 0;
	for (size_t i = 0; i + 2 <= n; i += 2) {
		a0 += p[i];
		a1 += p[i + 1];
	}
	return a0 + a1;
}

static void bw_task(void *arg, int task, int thread)
{
	struct bw_job *j = arg;
	size_t per = j->words / (size_t)j->parts;
	const uint64_t *p = j->buf + per * (size_t)task;
#if defined(__x86_64__)
	j->sum[task * 8] = __builtin_cpu_supports("avx2") ? sum_words_avx2(p, per) : sum_words(p, per);
#else
	j->sum[task * 8] = sum_words(p, per);
#endif
	(void)thread;
}

/* GB/s of one read-only pass over j->buf on the pool. */
static double read_bw_once(tq_threads *pool, struct bw_job *j)
{
	double t = bench_now();
	tq_threads_run(pool, bw_task, j, j->parts);
	t = bench_now() - t;
	bench_sink(j->sum);
	return (double)j->words * 8 / t / 1e9;
}

static struct bw_job *bw_new(tq_threads *pool)
{
	struct bw_job *j = calloc(1, sizeof(*j));
	size_t bytes = (size_t)256 << 20;
	uint64_t *buf = aligned_alloc(64, bytes);

	if (!j || !buf) {
		free(j);
		free(buf);
		return NULL;
	}
	for (size_t i = 0; i < bytes / 8; i++)
		buf[i] = i;
	j->buf = buf;
	j->words = bytes / 8;
	j->parts = tq_threads_count(pool);
	return j;
}

static void bw_free(struct bw_job *j)
{
	if (j)
		free((void *)j->buf);
	free(j);
}

/* ---- timing -------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double time_one(struct tq_attn_params *p)
{
	double t = bench_now();
	tq_attend(p, NULL);
	t = bench_now() - t;
	bench_sink(p->out);
	return t * 1e3;
}

static double cos_rows(const float *a, const float *b, size_t rows, int dim)
{
	double sum = 0.0;
	for (size_t r = 0; r < rows; r++) {
		double ab = 0, aa = 0, bb = 0;
		for (int j = 0; j < dim; j++) {
			double x = a[r * dim + j], y = b[r * dim + j];
			ab += x * y;
			aa += x * x;
			bb += y * y;
		}
		sum += ab / (sqrt(aa * bb) + 1e-300);
	}
	return sum / (double)rows;
}

/* ---- the perf run ------------------------------------------------------------- */

struct opts {
	uint32_t ctx;
	enum tq_codec_id k, v;
	int threads;
	int prefill;
	int json;
	int reps;
	uint32_t page_tokens;
	float sparse;
	float q_scale;        /* queries times this: sharper attention */
	uint32_t resident;    /* > 0: the page tables cycle over this many pages */
	enum tq_isa isa;
	int quality;
	int trials;
	double margin;
};

static int run_perf(const struct opts *o)
{
	tq_cache *cbs = tq_cache_new();
	tq_threads *pool = NULL;
	struct cache cq = { 0 }, c16 = { 0 }, c32 = { 0 }, cdq = { 0 };
	float *k = NULL, *v = NULL, *q = NULL, *out = NULL, *exact = NULL, *dq_out = NULL;
	struct bw_job *bwj = NULL;
	void *ws = NULL;
	int rc = 1;
	const uint32_t T = o->ctx;
	const int n_q = o->prefill ? PREFILL_Q : 1;
	struct rng r = { 12345 };

	if (!cbs || tq_threads_new(&pool, o->threads)) {
		fprintf(stderr, "tqbench attn: cannot create the pool\n");
		goto out;
	}
	if ((uint32_t)n_q > T) {
		fprintf(stderr, "tqbench attn: --ctx must be at least %d in this mode\n", n_q);
		goto out;
	}
	k = malloc((size_t)NKV * T * DIM * sizeof(float));
	v = malloc((size_t)NKV * T * DIM * sizeof(float));
	q = malloc((size_t)n_q * NQH * DIM * sizeof(float));
	out = malloc((size_t)n_q * NQH * DIM * sizeof(float));
	exact = malloc((size_t)n_q * NQH * DIM * sizeof(float));
	if (!k || !v || !q || !out || !exact)
		goto out;
	for (size_t i = 0; i < (size_t)NKV * T; i++) {
		gen_key(&r, k + i * DIM, DIM);
		gen_value(&r, v + i * DIM, DIM);
	}
	for (int i = 0; i < n_q * NQH; i++)
		gen_query(&r, q + (size_t)i * DIM, DIM);
	for (size_t i = 0; i < (size_t)n_q * NQH * DIM; i++)
		q[i] *= o->q_scale;
	int32_t pos[PREFILL_Q];
	for (int i = 0; i < n_q; i++)
		pos[i] = (int32_t)(T - (uint32_t)n_q + (uint32_t)i);

	if (cache_new(&cq, cbs, o->k, o->v, DIM, NKV, o->page_tokens, T) || cache_fill(&cq, k, v) ||
	    cache_new(&c16, cbs, TQ_CODEC_F16, TQ_CODEC_F16, DIM, NKV, o->page_tokens, T) ||
	    cache_fill(&c16, k, v) ||
	    cache_new(&c32, cbs, TQ_CODEC_F32, TQ_CODEC_F32, DIM, NKV, o->page_tokens, T) ||
	    cache_fill(&c32, k, v) ||
	    cache_new(&cdq, cbs, TQ_CODEC_F32, TQ_CODEC_F32, DIM, NKV, o->page_tokens, T))
		goto out;
	if (o->resident) {
		cache_cycle(&cq, o->resident);
		cache_cycle(&c16, o->resident);
		cache_cycle(&c32, o->resident);
		cache_cycle(&cdq, o->resident);
	}
	free(k);
	free(v);
	k = v = NULL;

	struct tq_attn_params p = {
		.k_codec = cq.kc, .v_codec = cq.vc, .n_q_heads = NQH, .kv = &cq.t,
		.n_q = n_q, .q = q, .q_dtype = TQ_DTYPE_F32, .q_pos = pos, .causal = 1,
		.out = out, .isa = o->isa, .threads = pool, .sparse_v = o->sparse,
	};
	/* one workspace, big enough for every run (same shapes) */
	tq_error err;
	long need = tq_attn_workspace_bytes(&p, &err);
	if (need < 0) {
		fprintf(stderr, "tqbench attn: %s\n", err.msg);
		goto out;
	}
	ws = malloc((size_t)need);
	p.workspace = ws;
	p.workspace_bytes = (size_t)need;

	struct tq_attn_params p16 = p;
	p16.k_codec = c16.kc; p16.v_codec = c16.vc; p16.kv = &c16.t; p16.sparse_v = 0;
	struct tq_attn_params p32 = p;
	p32.k_codec = c32.kc; p32.v_codec = c32.vc; p32.kv = &c32.t; p32.sparse_v = 0; p32.out = exact;
	struct tq_attn_params pdq = p32;
	pdq.kv = &cdq.t;
	dq_out = malloc((size_t)n_q * NQH * DIM * sizeof(float));
	pdq.out = dq_out;
	struct dq_job dj = { &cq, &cdq };
	bwj = bw_new(pool);
	if (!dq_out || !bwj)
		goto out;
	if (tq_attend(&p, &err) || tq_attend(&p16, &err) || tq_attend(&p32, &err) || tq_attend(&pdq, &err)) {
		fprintf(stderr, "tqbench attn: %s\n", err.msg);
		goto out;
	}

	/* Rounds of (read bw, fused, fp16, fp32, dequant-then-attend), so that
	 * load from elsewhere on a shared box hits every figure alike; medians. */
	int reps = o->reps > 64 ? 64 : o->reps;
	double vbw[64], vf[64], v16[64], v32[64], vdq[64];
	read_bw_once(pool, bwj); /* warm-up */
	for (int i = 0; i < reps; i++) {
		vbw[i] = read_bw_once(pool, bwj);
		vf[i] = time_one(&p);
		v16[i] = time_one(&p16);
		v32[i] = time_one(&p32);
		double t = bench_now();
		tq_threads_run(pool, dq_task, &dj, (int)(cq.t.n_pages * NKV));
		tq_attend(&pdq, NULL);
		vdq[i] = (bench_now() - t) * 1e3;
	}
	double bw = median(vbw, reps), fused = median(vf, reps), f16 = median(v16, reps);
	double f32 = median(v32, reps), dq = median(vdq, reps);

	/* accuracy of this run's fused output against fp32 attention */
	tq_attend(&p, NULL);
	double cs = cos_rows(out, exact, (size_t)n_q * NQH, DIM);
	double bpt = (double)NKV * (cq.t.geom.k_block_bytes + cq.t.geom.v_block_bytes);
	enum tq_isa isa = o->isa == TQ_ISA_AUTO ? tq_isa_best() : o->isa;
	const char *mode = o->prefill ? "prefill" : "decode";

	if (o->json) {
		printf("{\"suite\":\"attn\",\"mode\":\"%s\",\"ctx\":%u,\"k\":\"%s\",\"v\":\"%s\","
		       "\"threads\":%d,\"isa\":\"%s\",\"sparse_v\":%g,\"n_q\":%d,\"n_q_heads\":%d,"
		       "\"n_kv_heads\":%d,\"dim\":%d,\"page_tokens\":%u,\"resident_pages\":%u,"
		       "\"fused_ms\":%.4f,\"dequant_then_attend_ms\":%.4f,\"fp16_ms\":%.4f,"
		       "\"fp32_ms\":%.4f,\"kv_bytes_per_token\":%.0f,\"cos_vs_exact\":%.6f,"
		       "\"read_bw_gbs\":%.2f,\"fp16_stream_gbs\":%.2f,\"fused_vs_fp16\":%.3f,"
		       "\"dequant_vs_fused\":%.2f}\n",
		       mode, T, tq_codec_name(o->k), tq_codec_name(o->v), o->threads, tq_isa_name(isa),
		       o->sparse, n_q, NQH, NKV, DIM, o->page_tokens, o->resident, fused, dq, f16, f32, bpt, cs, bw,
		       (double)T * NKV * 512 / (f16 * 1e-3) / 1e9, fused / f16, dq / fused);
	} else {
		printf("attn %s ctx %u  K %s V %s  threads %d  isa %s%s", mode, T, tq_codec_name(o->k),
		       tq_codec_name(o->v), o->threads, tq_attn_isa_label(isa), o->sparse > 0 ? "  sparse-V on" : "");
		if (o->resident)
			printf("  resident: %u of %u pages (%.1f MB; fp16 %.1f MB)", o->resident, cq.t.n_pages,
			       (double)o->resident * (double)cq.page_bytes / 1e6,
			       (double)o->resident * (double)c16.page_bytes / 1e6);
		printf("\n");
		printf("  fused                 %9.3f ms\n", fused);
		if (o->prefill)
			printf("  fp16 KV (f16 x f16)   %9.3f ms\n", f16);
		else
			printf("  fp16 KV (f16 x f16)   %9.3f ms   (streams %.1f GB/s, %.0f %% of read bw)\n", f16,
			       (double)T * NKV * 512 / (f16 * 1e-3) / 1e9,
			       100.0 * (double)T * NKV * 512 / (f16 * 1e-3) / 1e9 / bw);
		printf("  fp32 KV               %9.3f ms\n", f32);
		printf("  dequant, then fp32    %9.3f ms\n", dq);
		printf("  read bandwidth        %9.1f GB/s\n", bw);
		printf("  KV bytes per token    %9.0f     cos vs exact %.6f\n", bpt, cs);
		printf("  fused / fp16 %.3f   dequant / fused %.2f\n", fused / f16, dq / fused);
	}
	rc = 0;
out:
	free(ws);
	free(k);
	free(v);
	free(q);
	free(out);
	free(exact);
	free(dq_out);
	bw_free(bwj);
	cache_free(&cq);
	cache_free(&c16);
	cache_free(&c32);
	cache_free(&cdq);
	tq_threads_free(pool);
	tq_cache_free(cbs);
	return rc;
}

/* ---- quality ------------------------------------------------------------------ */

static const enum tq_codec_id q_codecs[] = {
	TQ_CODEC_TQ2, TQ_CODEC_TQ3, TQ_CODEC_TQ4, TQ_CODEC_Q8, TQ_CODEC_Q4A, TQ_CODEC_F16,
};
#define NQC (int)(sizeof(q_codecs) / sizeof(q_codecs[0]))

/* s[t] = q . k[t] for t < n; kt: [dim][n] (transposed, so the loop vectorizes) */
static void scores_t(const float *q, const float *kt, int dim, int n, float *restrict s)
{
	for (int t = 0; t < n; t++)
		s[t] = 0.0f;
	for (int j = 0; j < dim; j++) {
		const float *restrict row = kt + (size_t)j * n;
		float qj = q[j];
		for (int t = 0; t < n; t++)
			s[t] += qj * row[t];
	}
}

static int argmax(const float *s, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (s[i] > s[b])
			b = i;
	return b;
}

static int run_quality(const struct opts *o)
{
	const uint32_t T = 4096;
	const int n_q = 16;
	tq_cache *cbs = tq_cache_new();
	struct rng r = { 777 };
	float *k = malloc((size_t)NKV * T * DIM * 4), *v = malloc((size_t)NKV * T * DIM * 4);
	float *q = malloc((size_t)n_q * NQH * DIM * 4);
	float *exact = malloc((size_t)n_q * NQH * DIM * 4), *out = malloc((size_t)n_q * NQH * DIM * 4);
	float *kd = malloc((size_t)T * DIM * 4), *kt = malloc((size_t)T * DIM * 4);
	float *s = malloc((size_t)T * 4), *se = malloc((size_t)T * 4);
	int32_t pos[16];
	int rc = 1;
	tq_error err;

	if (!cbs || !k || !v || !q || !exact || !out || !kd || !kt || !s || !se)
		goto out;
	for (size_t i = 0; i < (size_t)NKV * T; i++) {
		gen_key(&r, k + i * DIM, DIM);
		gen_value(&r, v + i * DIM, DIM);
	}
	for (int i = 0; i < n_q * NQH; i++)
		gen_query(&r, q + (size_t)i * DIM, DIM);
	for (int i = 0; i < n_q; i++)
		pos[i] = (int32_t)(T - 1 - (uint32_t)i * 200);

	/* exact attention on the fp32 cache, and the exact top-1 key per row */
	struct cache c32;
	if (cache_new(&c32, cbs, TQ_CODEC_F32, TQ_CODEC_F32, DIM, NKV, 256, T) || cache_fill(&c32, k, v))
		goto out;
	struct tq_attn_params p = {
		.k_codec = c32.kc, .v_codec = c32.vc, .n_q_heads = NQH, .kv = &c32.t, .n_q = n_q,
		.q = q, .q_dtype = TQ_DTYPE_F32, .q_pos = pos, .causal = 1, .out = exact,
	};
	if (tq_attend_ref(&p, &err)) {
		fprintf(stderr, "tqbench attn: %s\n", err.msg);
		goto out;
	}
	int top_exact[16 * NQH];
	for (int h = 0; h < NKV; h++) {
		for (uint32_t t = 0; t < T; t++)
			for (int j = 0; j < DIM; j++)
				kt[(size_t)j * T + t] = k[((size_t)h * T + t) * DIM + j];
		for (int i = 0; i < n_q; i++)
			for (int g = 0; g < NQH / NKV; g++) {
				int row = i * NQH + h * (NQH / NKV) + g;
				scores_t(q + (size_t)row * DIM, kt, DIM, pos[i] + 1, se);
				top_exact[row] = argmax(se, pos[i] + 1);
			}
	}
	cache_free(&c32);

	if (o->json == 0)
		printf("quality: d %d, %u tokens, %d KV heads, %d query heads, %d query tokens (causal)\n"
		       "  %-5s %-5s %10s %8s %12s\n", DIM, T, NKV, NQH, n_q, "K", "V", "cos", "top1", "bytes/token");
	for (int a = 0; a < NQC; a++) {
		/* top-1 agreement depends on K only: decoded keys vs exact keys */
		struct tq_codec_params kp = { .id = q_codecs[a], .dim = DIM, .seed = 0xC0FFEE01 };
		tq_codec *kc;
		if (tq_codec_new(&kc, cbs, &kp, &err))
			goto out;
		uint8_t *blk = malloc((size_t)T * tq_codec_block_bytes(kc));
		int agree = 0;
		for (int h = 0; h < NKV; h++) {
			tq_encode(kc, k + (size_t)h * T * DIM, TQ_DTYPE_F32, T, blk, NULL);
			tq_decode_ref(kc, blk, T, kd);
			for (uint32_t t = 0; t < T; t++)
				for (int j = 0; j < DIM; j++)
					kt[(size_t)j * T + t] = kd[(size_t)t * DIM + j];
			for (int i = 0; i < n_q; i++)
				for (int g = 0; g < NQH / NKV; g++) {
					int row = i * NQH + h * (NQH / NKV) + g;
					scores_t(q + (size_t)row * DIM, kt, DIM, pos[i] + 1, s);
					agree += argmax(s, pos[i] + 1) == top_exact[row];
				}
		}
		free(blk);
		tq_codec_free(kc);
		for (int b = 0; b < NQC; b++) {
			struct cache c;
			if (cache_new(&c, cbs, q_codecs[a], q_codecs[b], DIM, NKV, 256, T) || cache_fill(&c, k, v))
				goto out;
			struct tq_attn_params pc = p;
			pc.k_codec = c.kc;
			pc.v_codec = c.vc;
			pc.kv = &c.t;
			pc.out = out;
			if (tq_attend(&pc, &err)) {
				fprintf(stderr, "tqbench attn: %s\n", err.msg);
				cache_free(&c);
				goto out;
			}
			double cs = cos_rows(out, exact, (size_t)n_q * NQH, DIM);
			double top1 = (double)agree / (n_q * NQH);
			double bpt = (double)NKV * (c.t.geom.k_block_bytes + c.t.geom.v_block_bytes);
			if (o->json)
				printf("{\"suite\":\"attn\",\"mode\":\"quality\",\"k\":\"%s\",\"v\":\"%s\",\"ctx\":%u,"
				       "\"cos_vs_exact\":%.6f,\"top1_agree\":%.4f,\"kv_bytes_per_token\":%.0f}\n",
				       tq_codec_name(q_codecs[a]), tq_codec_name(q_codecs[b]), T, cs, top1, bpt);
			else
				printf("  %-5s %-5s %10.6f %8.4f %12.0f\n", tq_codec_name(q_codecs[a]),
				       tq_codec_name(q_codecs[b]), cs, top1, bpt);
			cache_free(&c);
		}
	}
	rc = 0;
out:
	free(k); free(v); free(q); free(exact); free(out); free(kd); free(kt); free(s); free(se);
	tq_cache_free(cbs);
	return rc;
}

/* Needle: among N = 65536 distractor keys, plant one whose exact score is
 * (1 + margin) x the best distractor's; count how often it stays top-1 when
 * all keys (needle and distractors) go through each codec.  The distractors
 * are drawn once; each trial draws a new query and a new needle. */
static int run_needle(const struct opts *o)
{
	enum { N = 65536, NC = 3 };
	static const enum tq_codec_id nc[NC] = { TQ_CODEC_TQ4, TQ_CODEC_TQ3, TQ_CODEC_Q4A };
	tq_cache *cbs = tq_cache_new();
	tq_codec *c[NC] = { 0 };
	float *k = malloc((size_t)N * DIM * 4), *kt = malloc((size_t)N * DIM * 4);
	float *kdt[NC] = { 0 };
	float *s = malloc((size_t)N * 4);
	uint8_t *blk = malloc((size_t)N * 4 * DIM);
	struct rng r = { 4242 };
	int rc = 1;
	tq_error err;

	if (!cbs || !k || !kt || !s || !blk)
		goto out;
	for (size_t i = 0; i < N; i++)
		gen_key(&r, k + i * DIM, DIM);
	for (size_t i = 0; i < N; i++)
		for (int j = 0; j < DIM; j++)
			kt[(size_t)j * N + i] = k[i * DIM + j];
	for (int ci = 0; ci < NC; ci++) {
		struct tq_codec_params kp = { .id = nc[ci], .dim = DIM, .seed = 0xC0FFEE01 + (uint64_t)ci };
		if (tq_codec_new(&c[ci], cbs, &kp, &err) || !(kdt[ci] = malloc((size_t)N * DIM * 4)))
			goto out;
		tq_encode(c[ci], k, TQ_DTYPE_F32, N, blk, NULL);
		/* decoded keys, transposed: [DIM][N] */
		for (size_t i = 0; i < N; i += 128) {
			float tmp[128 * DIM];
			tq_decode_ref(c[ci], blk + i * tq_codec_block_bytes(c[ci]), 128, tmp);
			for (size_t a = 0; a < 128; a++)
				for (int j = 0; j < DIM; j++)
					kdt[ci][(size_t)j * N + i + a] = tmp[a * DIM + j];
		}
	}
	/* margins: the one asked for, or a sweep */
	double margins[4] = { 0.05, 0.10, 0.20, 0.30 };
	int nm = 4;
	if (o->margin > 0) {
		margins[0] = o->margin;
		nm = 1;
	}
	int hits[NC][4] = { { 0 } };
	for (int trial = 0; trial < o->trials; trial++) {
		float q[DIM], k0[DIM], nk[DIM], dn[DIM];
		uint8_t nb[4 * DIM];
		float dbest[NC];
		gen_query(&r, q, DIM);
		scores_t(q, kt, DIM, N, s);
		float best = s[argmax(s, N)];
		for (int ci = 0; ci < NC; ci++) {
			scores_t(q, kdt[ci], DIM, N, s);
			dbest[ci] = s[argmax(s, N)];
		}
		/* needle = a fresh key moved along q until its exact score is
		 * (1 + margin) x the best distractor's */
		gen_key(&r, k0, DIM);
		double qq = 0, qk = 0;
		for (int j = 0; j < DIM; j++) {
			qq += (double)q[j] * q[j];
			qk += (double)q[j] * k0[j];
		}
		for (int mi = 0; mi < nm; mi++) {
			double beta = ((1.0 + margins[mi]) * best - qk) / qq;
			for (int j = 0; j < DIM; j++)
				nk[j] = k0[j] + (float)(beta * q[j]);
			for (int ci = 0; ci < NC; ci++) {
				tq_encode(c[ci], nk, TQ_DTYPE_F32, 1, nb, NULL);
				tq_decode_ref(c[ci], nb, 1, dn);
				float ns = 0.0f;
				for (int j = 0; j < DIM; j++)
					ns += q[j] * dn[j];
				hits[ci][mi] += ns > dbest[ci];
			}
		}
	}
	for (int mi = 0; mi < nm; mi++)
		for (int ci = 0; ci < NC; ci++) {
			double rate = (double)hits[ci][mi] / o->trials;
			if (o->json)
				printf("{\"suite\":\"attn\",\"mode\":\"needle\",\"k\":\"%s\",\"distractors\":%d,"
				       "\"trials\":%d,\"margin\":%.3f,\"top1_rate\":%.4f}\n",
				       tq_codec_name(nc[ci]), N, o->trials, margins[mi], rate);
			else
				printf("needle: K %-4s  %d distractors, margin %2.0f %%: top-1 in %4d of %d trials (%.1f %%)\n",
				       tq_codec_name(nc[ci]), N, margins[mi] * 100, hits[ci][mi], o->trials,
				       100.0 * rate);
		}
	rc = 0;
out:
	for (int ci = 0; ci < NC; ci++) {
		tq_codec_free(c[ci]);
		free(kdt[ci]);
	}
	free(k); free(kt); free(s); free(blk);
	tq_cache_free(cbs);
	return rc;
}

/* ---- command line ------------------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tqbench attn --ctx N [--k C] [--v C] [--threads T] [--mode decode|prefill]\n"
		"                    [--json] [--reps R] [--page-tokens P] [--sparse THR]\n"
		"                    [--q-scale X] [--resident N]\n"
		"                    [--isa scalar|avx2|avx512|neon]\n"
		"       tqbench attn --quality [--trials N] [--margin M] [--json]\n"
		"       tqbench attn --backend cuda [--device N] [--ctx N,N,..] [--batch B,B,..]\n"
		"                    [--k C] [--v C] [--reps R] [--page-tokens P] [--threads T]\n"
		"                    [--no-baseline] [--check-max N] [--layers L] [--bulk N] [--json]\n"
		"                    [--sparse THR] [--q-scale X] [--phases N]\n"
		"  32 query heads, 8 KV heads, d = 128; decode = 1 query, prefill = 128 queries.\n"
		"  Defaults: --ctx 8192 --k tq4 --v tq3 --threads 2 --mode decode --reps 15\n"
		"  --page-tokens 256 --isa: the best this CPU runs.  --quality: output cosine and\n"
		"  top-1 agreement per codec pair, then the needle test (default 1000 trials;\n"
		"  the needle's exact score is (1 + margin) x the best distractor's; without\n"
		"  --margin, margins 0.05 0.10 0.20 0.30).  --sparse THR: sparse-V (at most THR\n"
		"  of each head's attention mass skipped; the baselines never skip).  --q-scale X:\n"
		"  the queries times X (default 1), for attention sharper than the synthetic\n"
		"  default's.  --resident N: every cache's page table cycles over its first N\n"
		"  pages (page i reads page i %% N), so the same work runs on a cache that stays\n"
		"  in the CPU's caches: the kernels' compute apart from memory.\n"
		"\n"
		"  --backend cpu|cuda   cpu (default): the CPU kernels against their CPU baselines,\n"
		"                       as above.  cuda: the GPU kernels (tq_cuda.h) on device\n"
		"                       --device N (default 0), decode only:\n"
		"    - tqc_attend, 1 query token at the last position, at each --ctx (default\n"
		"      8192,32768,131072; a k suffix multiplies by 1024) and each --batch (default\n"
		"      1,16): B sessions with their own pages and codec seeds, each attended by\n"
		"      its own host thread on its own context (stream), as tqkvd's workers do.\n"
		"      Per case: GPU time per call (median, CUDA events), wall time per call,\n"
		"      calls/s of all sessions, effective bandwidth (compressed K+V bytes of the\n"
		"      context / time) against the device's peak, and one call checked against\n"
		"      tq_attend_ref on the CPU (relative error of the output norm) up to\n"
		"      --check-max tokens (default 131072).  --reps: timed calls per session\n"
		"      (default 50, after 5 warm-up calls).\n"
		"    - the baseline, in the same run: PyTorch scaled_dot_product_attention over\n"
		"      a bf16 cache of the same shape (scripts/bench-sdpa.py, found under\n"
		"      $TQ_SRC, the current directory or next to the binary; run with\n"
		"      $TQ_PYTHON, default python3); fused / sdpa compares the time of one decode step of\n"
		"      all B sessions: GPU time at B = 1, wall time per round at B > 1.\n"
		"      Without python3 or torch: \"baseline: unavailable (why)\".  --no-baseline\n"
		"      skips it.\n"
		"    - --sparse THR: each batch again with sparse-V at THR, in the same run: its\n"
		"      time against the exact call's, the share of value chunks skipped and how\n"
		"      far session 0's output moved from the exact one (sparse-V skips on sharp\n"
		"      attention: --q-scale X multiplies the queries, as on the CPU).\n"
		"    - --phases N (tqbench-phases, `make phases`: kernels with phase clocks):\n"
		"      after the batches, N calls of session 0 with the tiled kernel's clocks\n"
		"      read back: where a CTA's time goes (queries, decode tables, first\n"
		"      tile, tile loop, partials, merge), how the CTAs start and end across\n"
		"      the GPU; medians over the calls.  Other builds refuse it with why.\n"
		"    - tqc_append: one decode token (all KV heads, K and V) into each of --layers\n"
		"      layers (default 32): GPU time per layer (target <= 10 us); and --bulk\n"
		"      tokens at once (default 4096) in vectors/s; both against tq_encode on the\n"
		"      CPU, and the GPU's blocks checked byte for byte against it.\n"
		"    --threads: host threads for the synthetic data, the CPU encoding of the\n"
		"    pages and the bulk append's CPU baseline (default: every CPU; the decode\n"
		"    token's CPU baseline runs on one thread).  No usable CUDA device:\n"
		"    the reason on stderr and exit status 77.\n");
}

/* "8192,32k,131072": 1..ATTN_CUDA_MAX_LIST integers in [1, max]; a k suffix
 * multiplies by 1024.  The count, or -1. */
static int parse_list(const char *s, uint64_t max, uint64_t *out)
{
	int n = 0;

	for (;;) {
		char *end;
		if (n == ATTN_CUDA_MAX_LIST || *s < '0' || *s > '9')
			return -1;
		errno = 0;
		unsigned long long x = strtoull(s, &end, 10);
		if (errno || end == s)
			return -1;
		if (*end == 'k' || *end == 'K') {
			x *= 1024;
			end++;
		}
		if (x < 1 || x > max)
			return -1;
		out[n++] = x;
		if (*end == '\0')
			return n;
		if (*end != ',')
			return -1;
		s = end + 1;
	}
}

static int bench_attn_main(int argc, char **argv)
{
	struct opts o = {
		.ctx = 8192, .k = TQ_CODEC_TQ4, .v = TQ_CODEC_TQ3, .threads = 2, .reps = 15,
		.page_tokens = 256, .trials = 1000, .margin = 0.0, .q_scale = 1.0f,
	};
	o.isa = tq_attn_isa_supported(TQ_ISA_AVX512) ? TQ_ISA_AVX512
		: tq_attn_isa_supported(TQ_ISA_AVX2) ? TQ_ISA_AVX2
		: tq_attn_isa_supported(TQ_ISA_NEON) ? TQ_ISA_NEON : TQ_ISA_SCALAR;
	/* --backend cuda: its own options, and the CPU-only ones refused */
	int cuda = 0, device = 0, no_baseline = 0, layers = 32, phases = 0;
	int threads_set = 0, reps_set = 0;
	const char *ctx_arg = NULL, *batch_arg = NULL, *cpu_only = NULL, *cuda_only = NULL;
	uint32_t check_max = 131072, bulk = 4096;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		int id;
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(a, "--json")) {
			o.json = 1;
		} else if (!strcmp(a, "--quality")) {
			o.quality = 1;
			cpu_only = a;
		} else if (!strcmp(a, "--no-baseline")) {
			no_baseline = 1;
			cuda_only = a;
		} else if (!val) {
			fprintf(stderr, "tqbench attn: %s needs a value\n", a);
			return 2;
		} else if (!strcmp(a, "--ctx")) {
			ctx_arg = val; i++;
		} else if (!strcmp(a, "--k") || !strcmp(a, "--v")) {
			if ((id = tq_codec_from_name(val)) < 0) {
				fprintf(stderr, "tqbench attn: unknown codec %s\n", val);
				return 2;
			}
			if (a[2] == 'k')
				o.k = (enum tq_codec_id)id;
			else
				o.v = (enum tq_codec_id)id;
			i++;
		} else if (!strcmp(a, "--threads")) {
			o.threads = atoi(val); i++;
			threads_set = 1;
		} else if (!strcmp(a, "--mode")) {
			o.prefill = !strcmp(val, "prefill");
			if (!o.prefill && strcmp(val, "decode")) {
				fprintf(stderr, "tqbench attn: --mode decode|prefill\n");
				return 2;
			}
			if (o.prefill)
				cpu_only = "--mode prefill";
			i++;
		} else if (!strcmp(a, "--reps")) {
			o.reps = atoi(val); i++;
			reps_set = 1;
		} else if (!strcmp(a, "--page-tokens")) {
			o.page_tokens = (uint32_t)strtoul(val, NULL, 0); i++;
		} else if (!strcmp(a, "--sparse")) {
			o.sparse = strtof(val, NULL); i++;
		} else if (!strcmp(a, "--q-scale")) {
			o.q_scale = strtof(val, NULL); i++;
			if (!(o.q_scale > 0.0f && o.q_scale <= 64.0f)) {
				fprintf(stderr, "tqbench attn: --q-scale wants (0, 64]\n");
				return 2;
			}
		} else if (!strcmp(a, "--resident")) {
			char *end;
			unsigned long n = strtoul(val, &end, 0);
			i++;
			cpu_only = a;
			if (end == val || *end || n < 1 || n > UINT32_MAX) {
				fprintf(stderr, "tqbench attn: --resident wants a page count >= 1\n");
				return 2;
			}
			o.resident = (uint32_t)n;
		} else if (!strcmp(a, "--trials")) {
			o.trials = atoi(val); i++;
			cpu_only = a;
		} else if (!strcmp(a, "--margin")) {
			o.margin = strtod(val, NULL); i++;
			cpu_only = a;
		} else if (!strcmp(a, "--isa")) {
			int isa = tq_isa_from_name(val);
			if (isa >= 0) {
				o.isa = (enum tq_isa)isa;
			} else {
				fprintf(stderr, "tqbench attn: unknown isa %s\n", val);
				return 2;
			}
			cpu_only = a;
			i++;
		} else if (!strcmp(a, "--backend")) {
			if (!strcmp(val, "cuda"))
				cuda = 1;
			else if (!strcmp(val, "cpu"))
				cuda = 0;
			else {
				fprintf(stderr, "tqbench attn: --backend cpu|cuda, not %s\n", val);
				return 2;
			}
			i++;
		} else if (!strcmp(a, "--device") || !strcmp(a, "--batch") || !strcmp(a, "--check-max") ||
			   !strcmp(a, "--layers") || !strcmp(a, "--bulk") || !strcmp(a, "--phases")) {
			char *end;
			errno = 0;
			long x = strtol(val, &end, 0);
			if (!strcmp(a, "--batch")) {
				batch_arg = val;
			} else if (errno || end == val || *end || x < 0 || x > (1L << 30)) {
				fprintf(stderr, "tqbench attn: %s %s: not a count\n", a, val);
				return 2;
			} else if (!strcmp(a, "--device")) {
				device = (int)x;
			} else if (!strcmp(a, "--check-max")) {
				check_max = (uint32_t)x;
			} else if (!strcmp(a, "--layers")) {
				layers = (int)x;
			} else if (!strcmp(a, "--phases")) {
				if (x < 1 || x > 1000) {
					fprintf(stderr, "tqbench attn: --phases %s: calls in 1 .. 1000\n", val);
					return 2;
				}
				phases = (int)x;
			} else {
				bulk = (uint32_t)x;
			}
			cuda_only = a;
			i++;
		} else {
			fprintf(stderr, "tqbench attn: unknown option %s\n", a);
			usage(stderr);
			return 2;
		}
	}
	if (cuda) {
		struct attn_cuda_opts co = {
			.device = device, .k = o.k, .v = o.v, .page_tokens = o.page_tokens,
			.threads = o.threads, .reps = reps_set ? o.reps : 50, .json = o.json,
			.baseline = !no_baseline, .check_max = check_max, .layers = layers, .bulk = bulk,
			.sparse = o.sparse, .q_scale = o.q_scale, .phases = phases,
		};
		uint64_t l[ATTN_CUDA_MAX_LIST];
		int n;

		if (cpu_only) {
			fprintf(stderr, "tqbench attn: %s is not an option of --backend cuda\n", cpu_only);
			return 2;
		}
		if (!threads_set) {
			long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
			co.threads = ncpu < 1 ? 1 : ncpu > TQ_THREADS_MAX ? TQ_THREADS_MAX : (int)ncpu;
		}
		if ((n = parse_list(ctx_arg ? ctx_arg : "8192,32768,131072", UINT32_MAX, l)) < 0) {
			fprintf(stderr, "tqbench attn: --ctx %s: a comma list of 1 to %d contexts\n", ctx_arg,
				ATTN_CUDA_MAX_LIST);
			return 2;
		}
		for (int i = 0; i < n; i++)
			co.ctx[i] = (uint32_t)l[i];
		co.n_ctx = n;
		if ((n = parse_list(batch_arg ? batch_arg : "1,16", ATTN_CUDA_MAX_BATCH, l)) < 0) {
			fprintf(stderr, "tqbench attn: --batch %s: a comma list of 1 to %d batch sizes, "
					"each 1 to %d\n", batch_arg, ATTN_CUDA_MAX_LIST, ATTN_CUDA_MAX_BATCH);
			return 2;
		}
		for (int i = 0; i < n; i++)
			co.batch[i] = (int)l[i];
		co.n_batch = n;
		if (co.threads < 1 || co.threads > TQ_THREADS_MAX || co.reps < 1 || co.reps > 100000 ||
		    co.page_tokens < 1 || co.page_tokens > TQ_PAGE_TOKENS_MAX || co.layers < 1 ||
		    co.layers > 1024 || co.bulk < 1 || co.bulk > (1u << 20) || !(co.sparse >= 0.0f && co.sparse < 1.0f)) {
			fprintf(stderr, "tqbench attn: bad option value\n");
			return 2;
		}
		return bench_attn_cuda(&co);
	}
	if (cuda_only) {
		fprintf(stderr, "tqbench attn: %s needs --backend cuda\n", cuda_only);
		return 2;
	}
	if (ctx_arg) {
		if (strchr(ctx_arg, ',')) {
			fprintf(stderr, "tqbench attn: a list of contexts needs --backend cuda\n");
			return 2;
		}
		o.ctx = (uint32_t)strtoul(ctx_arg, NULL, 0);
	}
	if (o.threads < 1 || o.threads > TQ_THREADS_MAX || o.reps < 1 || o.ctx < 1 ||
	    o.page_tokens < 1 || o.page_tokens > TQ_PAGE_TOKENS_MAX || o.trials < 1) {
		fprintf(stderr, "tqbench attn: bad option value\n");
		return 2;
	}
	if (!tq_attn_isa_supported(o.isa)) {
		fprintf(stderr, "tqbench attn: isa %s not available here\n", tq_isa_name(o.isa));
		return 2;
	}
	if (o.quality)
		return run_quality(&o) || run_needle(&o);
	return run_perf(&o);
}

TQ_BENCH_SUITE(attn, "attn --ctx N [--k C] [--v C] [--threads T] [--mode decode|prefill] [--json] | --quality\n"
		     "                 | --backend cuda [--device N] [--ctx N,..] [--batch B,..] [--json]",
	       bench_attn_main)
