/* test_model — tqkv-run's model loader, forward pass, tokenizer, sampler and
 * KV backends (client/run/model.c, tokenizer.c, sampler.c, kvback.c).
 *
 * The oracles here are deliberately independent of the code under test:
 *   - naive_forward(): its own checkpoint parser (stdio), one token at a
 *     time, double precision everywhere, its own RoPE, attention and FFN;
 *   - naive_encode(): llama2.c's quadratic BPE loop with linear vocabulary
 *     search.
 * Synthetic checkpoints and tokenizers (written by this test) cover the
 * format and every bad input; the real model in ../shared/data covers the
 * rest and is skipped (exit 77 after the other cases) when absent. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "kvback.h"
#include "model.h"
#include "sampler.h"
#include "tokenizer.h"

static char tmpdir[256];
static char data_dir[512];
static int have_data;

static void path_in(char *out, size_t n, const char *dir, const char *name)
{
	snprintf(out, n, "%s/%s", dir, name);
}

static int write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");

	if (!f)
		return -1;
	size_t w = fwrite(p, 1, n, f);
	return fclose(f) == 0 && w == n ? 0 : -1;
}

static void *read_all(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	char *b = NULL;
	long sz;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (sz = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (b = malloc((size_t)sz + 1)) && fread(b, 1, (size_t)sz, f) == (size_t)sz) {
		b[sz] = 0;
		*n = (size_t)sz;
	} else {
		free(b);
		b = NULL;
	}
	fclose(f);
	return b;
}

/* ---- synthetic checkpoints --------------------------------------------------- */

static uint64_t rng_state;
static double rnd(void) /* uniform in [-1, 1) */
{
	rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
	return (double)(rng_state >> 11) / (double)(1ULL << 52) - 1.0;
}

/* Header h[7] (vocab < 0: unshared classifier); weights uniform in ±scale,
 * RMS weights around 1.  extra: bytes appended (negative: cut off). */
static int make_ckpt(const char *path, const int32_t h[7], double scale, long extra)
{
	int dim = h[0], hid = h[1], L = h[2], nh = h[3], nkv = h[4], V = abs(h[5]), S = h[6];
	int hd = dim / nh;
	size_t n = (size_t)V * dim                     /* embedding */
		 + (size_t)L * dim                     /* rms_att   */
		 + (size_t)L * dim * dim * 2           /* wq, wo    */
		 + (size_t)L * nkv * hd * dim * 2      /* wk, wv    */
		 + (size_t)L * dim                     /* rms_ffn   */
		 + (size_t)L * hid * dim * 3           /* w1 w2 w3  */
		 + dim                                 /* rms_final */
		 + (size_t)S * hd                      /* freq_cis  */
		 + (h[5] < 0 ? (size_t)V * dim : 0);   /* wcls      */
	size_t bytes = 28 + 4 * n;
	unsigned char *b = calloc(1, bytes + (extra > 0 ? (size_t)extra : 0));
	float *w = (float *)(b + 28);
	int rc;

	if (!b)
		return -1;
	memcpy(b, h, 28);
	size_t o = 0;
	for (size_t i = 0; i < (size_t)V * dim; i++) w[o++] = (float)(scale * rnd());
	for (size_t i = 0; i < (size_t)L * dim; i++) w[o++] = (float)(1.0 + 0.2 * rnd());
	for (size_t i = 0; i < (size_t)L * dim * dim + (size_t)L * nkv * hd * dim * 2 + (size_t)L * dim * dim; i++)
		w[o++] = (float)(scale * rnd());
	for (size_t i = 0; i < (size_t)L * dim; i++) w[o++] = (float)(1.0 + 0.2 * rnd());
	for (size_t i = 0; i < (size_t)L * hid * dim * 3; i++) w[o++] = (float)(scale * rnd());
	for (size_t i = 0; i < (size_t)dim; i++) w[o++] = (float)(1.0 + 0.2 * rnd());
	o += (size_t)S * hd; /* freq_cis: zeros, unused */
	for (size_t i = 0; h[5] < 0 && i < (size_t)V * dim; i++) w[o++] = (float)(scale * rnd());
	rc = write_file(path, b, extra < 0 ? bytes - (size_t)(-extra) : bytes + (size_t)extra);
	free(b);
	return rc;
}

/* ---- the independent forward pass (double, one token at a time) --------------- */

struct naive {
	int dim, hid, L, nh, nkv, V, S, hd, kvd, shared;
	const float *emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *wcls;
	float *file;
	double *kc, *vc;   /* [L][S][kvd] */
};

static int naive_load(struct naive *m, const char *path)
{
	size_t n;
	unsigned char *b = read_all(path, &n);
	int32_t h[7];

	memset(m, 0, sizeof(*m));
	if (!b || n < 28)
		return -1;
	memcpy(h, b, 28);
	m->dim = h[0]; m->hid = h[1]; m->L = h[2]; m->nh = h[3]; m->nkv = h[4];
	m->V = abs(h[5]); m->shared = h[5] > 0; m->S = h[6];
	m->hd = m->dim / m->nh;
	m->kvd = m->nkv * m->hd;
	/* the weights, copied to an aligned array in file order */
	m->file = malloc(n - 28);
	memcpy(m->file, b + 28, n - 28);
	free(b);
	const float *p = m->file;
	m->emb = p;       p += (size_t)m->V * m->dim;
	m->rms_att = p;   p += (size_t)m->L * m->dim;
	m->wq = p;        p += (size_t)m->L * m->dim * m->dim;
	m->wk = p;        p += (size_t)m->L * m->kvd * m->dim;
	m->wv = p;        p += (size_t)m->L * m->kvd * m->dim;
	m->wo = p;        p += (size_t)m->L * m->dim * m->dim;
	m->rms_ffn = p;   p += (size_t)m->L * m->dim;
	m->w1 = p;        p += (size_t)m->L * m->hid * m->dim;
	m->w2 = p;        p += (size_t)m->L * m->dim * m->hid;
	m->w3 = p;        p += (size_t)m->L * m->hid * m->dim;
	m->rms_final = p; p += m->dim;
	p += (size_t)m->S * m->hd;
	m->wcls = m->shared ? m->emb : p;
	m->kc = calloc((size_t)m->L * m->S * m->kvd, sizeof(double));
	m->vc = calloc((size_t)m->L * m->S * m->kvd, sizeof(double));
	return 0;
}

static void naive_free(struct naive *m)
{
	free(m->file);
	free(m->kc);
	free(m->vc);
}

static void n_rmsnorm(double *o, const double *x, const float *w, int n)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += x[i] * x[i];
	double r = 1.0 / sqrt(ss / n + 1e-5);
	for (int i = 0; i < n; i++)
		o[i] = (double)w[i] * x[i] * r;
}

static void n_matvec(double *o, const double *x, const float *w, int in, int out)
{
	for (int i = 0; i < out; i++) {
		double s = 0;
		for (int j = 0; j < in; j++)
			s += (double)w[(size_t)i * in + j] * x[j];
		o[i] = s;
	}
}

static void n_rope(double *v, int n, int hd, int pos)
{
	for (int i = 0; i < n; i += 2) {
		int k = i % hd;
		double ang = pos / pow(10000.0, (double)k / hd);
		double a = v[i], b = v[i + 1];
		v[i] = a * cos(ang) - b * sin(ang);
		v[i + 1] = a * sin(ang) + b * cos(ang);
	}
}

/* logits[V] for `token` at `pos`; the cache holds positions < pos. */
static void naive_step(struct naive *m, int token, int pos, double *logits)
{
	int D = m->dim, F = m->hid;
	double *x = calloc(D, 8), *xb = calloc(D, 8), *q = calloc(D, 8), *att = calloc(D, 8);
	double *o = calloc(D, 8), *h1 = calloc(F, 8), *h3 = calloc(F, 8), *sc = calloc(m->S, 8);

	for (int i = 0; i < D; i++)
		x[i] = m->emb[(size_t)token * D + i];
	for (int l = 0; l < m->L; l++) {
		double *kr = m->kc + ((size_t)l * m->S + pos) * m->kvd;
		double *vr = m->vc + ((size_t)l * m->S + pos) * m->kvd;
		n_rmsnorm(xb, x, m->rms_att + (size_t)l * D, D);
		n_matvec(q, xb, m->wq + (size_t)l * D * D, D, D);
		n_matvec(kr, xb, m->wk + (size_t)l * m->kvd * D, D, m->kvd);
		n_matvec(vr, xb, m->wv + (size_t)l * m->kvd * D, D, m->kvd);
		n_rope(q, D, m->hd, pos);
		n_rope(kr, m->kvd, m->hd, pos);
		for (int h = 0; h < m->nh; h++) {
			int kh = h / (m->nh / m->nkv);
			double mx = -INFINITY, sum = 0;
			for (int t = 0; t <= pos; t++) {
				const double *k = m->kc + ((size_t)l * m->S + t) * m->kvd + kh * m->hd;
				double s = 0;
				for (int j = 0; j < m->hd; j++)
					s += q[h * m->hd + j] * k[j];
				sc[t] = s / sqrt((double)m->hd);
				if (sc[t] > mx)
					mx = sc[t];
			}
			for (int t = 0; t <= pos; t++)
				sum += (sc[t] = exp(sc[t] - mx));
			for (int j = 0; j < m->hd; j++) {
				double a = 0;
				for (int t = 0; t <= pos; t++)
					a += sc[t] / sum * m->vc[((size_t)l * m->S + t) * m->kvd + kh * m->hd + j];
				att[h * m->hd + j] = a;
			}
		}
		n_matvec(o, att, m->wo + (size_t)l * D * D, D, D);
		for (int i = 0; i < D; i++)
			x[i] += o[i];
		n_rmsnorm(xb, x, m->rms_ffn + (size_t)l * D, D);
		n_matvec(h1, xb, m->w1 + (size_t)l * F * D, D, F);
		n_matvec(h3, xb, m->w3 + (size_t)l * F * D, D, F);
		for (int i = 0; i < F; i++)
			h1[i] = h1[i] / (1.0 + exp(-h1[i])) * h3[i];
		n_matvec(o, h1, m->w2 + (size_t)l * D * F, F, D);
		for (int i = 0; i < D; i++)
			x[i] += o[i];
	}
	n_rmsnorm(xb, x, m->rms_final, D);
	n_matvec(logits, xb, m->wcls, D, m->V);
	free(x); free(xb); free(q); free(att); free(o); free(h1); free(h3); free(sc);
}

/* The tqr logits of tokens[0..n) run in chunks of `chunk` through `kv`:
 * [n][vocab]. */
static int run_logits(const tqr_model *m, tqr_kv *kv, const int *tokens, int n, int chunk, float *out)
{
	const struct tqr_config *c = tqr_model_config(m);
	tqr_forward *f = NULL;
	tqr_error err;
	int rc = tqr_forward_new(&f, m, chunk, &err);

	for (int pos = 0; rc == 0 && pos < n; pos += chunk) {
		int k = n - pos < chunk ? n - pos : chunk;
		rc = tqr_forward_run(f, kv, tokens + pos, k, pos, out + (size_t)pos * c->vocab_size, 1, &err);
	}
	if (rc)
		fprintf(stderr, "  run_logits: %s\n", err.msg);
	tqr_forward_free(f);
	return rc;
}

static struct tqr_kv_geom geom_of(const tqr_model *m)
{
	const struct tqr_config *c = tqr_model_config(m);
	return (struct tqr_kv_geom){ c->n_layers, c->n_kv_heads, c->n_heads, c->head_dim, c->seq_len };
}

/* max |tqr - naive| over all positions of `tokens` */
static double forward_vs_naive(const char *path, const int *tokens, int n, int chunk, double *max_abs)
{
	tqr_model *m = NULL;
	tqr_kv *kv = NULL;
	tqr_error err;
	struct naive nv;
	double worst = -1;

	if (tqr_model_load(&m, path, &err) < 0) {
		fprintf(stderr, "  load: %s\n", err.msg);
		return -1;
	}
	struct tqr_kv_geom g = geom_of(m);
	int V = tqr_model_config(m)->vocab_size;
	float *lg = malloc(sizeof(float) * (size_t)n * V);
	double *ref = malloc(sizeof(double) * V);
	if (tqr_kv_new_exact(&kv, &g, &err) == 0 && run_logits(m, kv, tokens, n, chunk, lg) == 0 &&
	    naive_load(&nv, path) == 0) {
		worst = 0;
		*max_abs = 0;
		for (int p = 0; p < n; p++) {
			naive_step(&nv, tokens[p], p, ref);
			for (int j = 0; j < V; j++) {
				double d = fabs(lg[(size_t)p * V + j] - ref[j]);
				if (d > worst)
					worst = d;
				if (fabs(ref[j]) > *max_abs)
					*max_abs = fabs(ref[j]);
			}
		}
		naive_free(&nv);
	}
	free(lg);
	free(ref);
	tqr_kv_free(kv);
	tqr_model_free(m);
	return worst;
}

static void test_forward_synthetic(void)
{
	/* shared and unshared classifiers, GQA 2:1 and 1:1, head_dim 8 and 16 */
	static const int32_t hs[][7] = {
		{ 32, 48, 2, 4, 2, 40, 32 },
		{ 32, 40, 3, 2, 2, -37, 24 },
		{ 64, 96, 1, 8, 1, 50, 40 },
	};
	char path[400];
	int tokens[24];

	for (size_t k = 0; k < sizeof(hs) / sizeof(hs[0]); k++) {
		double mx;
		rng_state = t_seed() + k;
		path_in(path, sizeof(path), tmpdir, "syn.bin");
		T_ASSERT(make_ckpt(path, hs[k], 0.3, 0) == 0);
		for (int i = 0; i < 24; i++)
			tokens[i] = (int)((rnd() + 1) * 0.5 * abs(hs[k][5])) % abs(hs[k][5]);
		static const int chunks[] = { 1, 8, 20 };
		for (int ci = 0; ci < 3; ci++) {
			double d = forward_vs_naive(path, tokens, 20, chunks[ci], &mx);
			T_ASSERT(d >= 0);
			T_ASSERT(mx > 0.1); /* the logits are not trivially small */
			T_NEAR(d, 0, 1e-4);
		}
	}
}

static void test_forward_real(void)
{
	char mpath[600], tpath[600];
	const char *prompt = "Once upon a time, there was a little girl named Lily.";
	tqr_tok *t = NULL;
	tqr_error err;
	int toks[96];
	double mx, d;
	long n;

	if (!have_data)
		return;
	path_in(mpath, sizeof(mpath), data_dir, "stories260K.bin");
	path_in(tpath, sizeof(tpath), data_dir, "tok512.bin");
	T_ASSERT(tqr_tok_load(&t, tpath, 512, &err) == 0);
	n = tqr_tok_encode(t, prompt, strlen(prompt), 1, 0, toks, &err);
	tqr_tok_free(t);
	T_ASSERT(n > 5 && n < 60);
	/* then some arbitrary ids, rare ones included */
	for (int i = 0; i < 8; i++)
		toks[n++] = (i * 67 + 3) % 512;
	d = forward_vs_naive(mpath, toks, (int)n, 5, &mx);
	fprintf(stderr, "  real model, %ld tokens: max |logit| %.3f, max |diff| vs naive %.3g\n", n, mx, d);
	T_ASSERT(d >= 0);
	T_ASSERT(mx > 1.0);
	T_NEAR(d, 0, 1e-4);
}

/* Chunking never changes a token's bits on the exact path. */
static void test_chunk_invariance(void)
{
	static const int32_t h[7] = { 32, 48, 2, 4, 2, 40, 48 };
	char path[400];
	int tokens[45];
	tqr_model *m = NULL;
	tqr_error err;
	float *a, *b;

	rng_state = t_seed() ^ 77;
	path_in(path, sizeof(path), tmpdir, "chunk.bin");
	T_ASSERT(make_ckpt(path, h, 0.3, 0) == 0);
	T_ASSERT(tqr_model_load(&m, path, &err) == 0);
	for (int i = 0; i < 45; i++)
		tokens[i] = (i * 7 + 3) % 40;
	a = malloc(sizeof(float) * 45 * 40);
	b = malloc(sizeof(float) * 45 * 40);
	struct tqr_kv_geom g = geom_of(m);
	int same = 1;
	for (int chunk = 2; chunk <= 45 && same; chunk += 9) {
		tqr_kv *k1 = NULL, *k2 = NULL;
		if (tqr_kv_new_exact(&k1, &g, &err) || tqr_kv_new_exact(&k2, &g, &err) ||
		    run_logits(m, k1, tokens, 45, 1, a) || run_logits(m, k2, tokens, 45, chunk, b))
			same = -1;
		else if (memcmp(a, b, sizeof(float) * 45 * 40))
			same = 0;
		tqr_kv_free(k1);
		tqr_kv_free(k2);
	}
	free(a);
	free(b);
	tqr_model_free(m);
	T_EQ(same, 1);
}

/* The kernels' f32 codec through pages and tq_attend vs the exact cache. */
static void local_vs_exact(const char *path, const int *tokens, int n, enum tq_codec_id kc,
			   enum tq_codec_id vc, int reference, double tol)
{
	tqr_model *m = NULL;
	tqr_kv *ex = NULL, *lo = NULL;
	tqr_error err;

	T_ASSERT(tqr_model_load(&m, path, &err) == 0);
	struct tqr_kv_geom g = geom_of(m);
	int V = tqr_model_config(m)->vocab_size;
	struct tqr_kv_local_opts o = { kc, vc, 42, 2, 16, reference, 0.0f, 0 };
	float *a = malloc(sizeof(float) * (size_t)n * V), *b = malloc(sizeof(float) * (size_t)n * V);
	int rc = tqr_kv_new_exact(&ex, &g, &err);
	if (!rc)
		rc = tqr_kv_new_local(&lo, &g, &o, &err);
	if (rc)
		fprintf(stderr, "  %s\n", err.msg);
	if (!rc)
		rc = run_logits(m, ex, tokens, n, 7, a);
	if (!rc)
		rc = run_logits(m, lo, tokens, n, 7, b);
	double worst = 0;
	for (size_t i = 0; !rc && i < (size_t)n * V; i++)
		if (fabs(a[i] - b[i]) > worst)
			worst = fabs(a[i] - b[i]);
	struct tqr_kv_stats st = { 0 };
	if (!rc)
		tqr_kv_stats(lo, &st);
	tqr_kv_free(ex);
	tqr_kv_free(lo);
	tqr_model_free(m);
	free(a);
	free(b);
	T_EQ(rc, 0);
	T_EQ(st.tokens, n);
	T_EQ(st.bytes_per_token, (uint64_t)g.n_layers * g.n_kv_heads *
		 (uint64_t)(tq_block_bytes(kc, g.head_dim, NULL) + tq_block_bytes(vc, g.head_dim, NULL)));
	T_ASSERT(st.resident_bytes >= st.tokens * st.bytes_per_token);
	T_NEAR(worst, 0, tol);
}

/* The fused kernel path against the oracle (tq_attend_ref), same codecs:
 * what tqkv-run --local and tqkvd run vs the slow twin, through the whole
 * model (the SIMD path the CPU picks; TQ_ISA=scalar|avx2 caps it). */
static void fused_vs_ref(const char *path, const int *tokens, int n, enum tq_codec_id kc,
			 enum tq_codec_id vc, double tol)
{
	tqr_model *m = NULL;
	tqr_kv *a = NULL, *b = NULL;
	tqr_error err;

	T_ASSERT(tqr_model_load(&m, path, &err) == 0);
	struct tqr_kv_geom g = geom_of(m);
	int V = tqr_model_config(m)->vocab_size;
	struct tqr_kv_local_opts fo = { kc, vc, 42, 1, 0, 0, 0.0f, 0 }, ro = { kc, vc, 42, 1, 0, 1, 0.0f, 0 };
	float *la = malloc(sizeof(float) * (size_t)n * V), *lb = malloc(sizeof(float) * (size_t)n * V);
	int rc = tqr_kv_new_local(&a, &g, &fo, &err);
	if (!rc)
		rc = tqr_kv_new_local(&b, &g, &ro, &err);
	if (!rc)
		rc = run_logits(m, a, tokens, n, 48, la);
	if (!rc)
		rc = run_logits(m, b, tokens, n, 48, lb);
	double worst = 0;
	for (size_t i = 0; !rc && i < (size_t)n * V; i++)
		if (fabs(la[i] - lb[i]) > worst)
			worst = fabs(la[i] - lb[i]);
	tqr_kv_free(a);
	tqr_kv_free(b);
	tqr_model_free(m);
	free(la);
	free(lb);
	T_EQ(rc, 0);
	if (worst > tol)
		T_FAIL("%s/%s: fused vs reference attention, max |logit diff| %.3g > %.3g",
		       tq_codec_name(kc), tq_codec_name(vc), worst, tol);
}

static void test_fused_vs_ref(void)
{
	static const int32_t h8[7] = { 32, 48, 2, 4, 2, 40, 128 }, h16[7] = { 64, 48, 2, 4, 2, 40, 128 };
	char path[400], mp[600];
	int tokens[120];

	for (int i = 0; i < 120; i++)
		tokens[i] = (i * 13 + 1) % 40;
	rng_state = t_seed() ^ 5;
	path_in(path, sizeof(path), tmpdir, "fused.bin");
	T_ASSERT(make_ckpt(path, h8, 0.3, 0) == 0);
	fused_vs_ref(path, tokens, 120, TQ_CODEC_Q8, TQ_CODEC_TQ4, 1e-4);
	fused_vs_ref(path, tokens, 120, TQ_CODEC_TQ3, TQ_CODEC_Q4A, 1e-4);
	T_ASSERT(make_ckpt(path, h16, 0.3, 0) == 0);
	fused_vs_ref(path, tokens, 120, TQ_CODEC_TQ4, TQ_CODEC_F16, 1e-4);
	if (!have_data)
		return;
	path_in(mp, sizeof(mp), data_dir, "stories260K.bin");
	for (int i = 0; i < 120; i++)
		tokens[i] = (i * 37 + 11) % 512;
	fused_vs_ref(mp, tokens, 120, TQ_CODEC_Q8, TQ_CODEC_TQ4, 1e-4);
}

static void test_local_f32(void)
{
	static const int32_t h[7] = { 32, 48, 2, 4, 2, 40, 48 };
	char path[400];
	int tokens[40];

	rng_state = t_seed() ^ 99;
	path_in(path, sizeof(path), tmpdir, "local.bin");
	T_ASSERT(make_ckpt(path, h, 0.3, 0) == 0);
	for (int i = 0; i < 40; i++)
		tokens[i] = (i * 11 + 5) % 40;
	local_vs_exact(path, tokens, 40, TQ_CODEC_F32, TQ_CODEC_F32, 0, 1e-4);
	local_vs_exact(path, tokens, 40, TQ_CODEC_F32, TQ_CODEC_F32, 1, 1e-4);
}

/* ---- perplexity on the real text ------------------------------------------------ */

static double window_ppl(const tqr_model *m, tqr_kv *kv, const int *toks, int windows, int wlen)
{
	const struct tqr_config *c = tqr_model_config(m);
	tqr_forward *f = NULL;
	tqr_error err;
	double nll = 0;
	long count = 0;
	float *lg = malloc(sizeof(float) * 64 * (size_t)c->vocab_size);

	if (tqr_forward_new(&f, m, 64, &err) < 0)
		count = -1;
	for (int w = 0; count >= 0 && w < windows; w++) {
		long r = tqr_forward_score(f, kv, toks + (size_t)w * wlen, wlen, 0, lg, &nll, NULL, NULL, &err);
		count = r < 0 ? -1 : count + r;
	}
	if (count < 0)
		fprintf(stderr, "  score: %s\n", err.msg);
	tqr_forward_free(f);
	free(lg);
	return count > 0 ? nll / (double)count : -1;
}

static void test_ppl_f16(void)
{
	char mp[600], tp[600], xp[600];
	tqr_model *m = NULL;
	tqr_tok *tok = NULL;
	tqr_kv *ex = NULL, *f16 = NULL, *t2 = NULL;
	tqr_error err;
	size_t tlen;
	char *text;

	if (!have_data)
		return;
	path_in(mp, sizeof(mp), data_dir, "stories260K.bin");
	path_in(tp, sizeof(tp), data_dir, "tok512.bin");
	path_in(xp, sizeof(xp), data_dir, "tinystories-dev.txt");
	T_ASSERT(tqr_model_load(&m, mp, &err) == 0);
	T_ASSERT(tqr_tok_load(&tok, tp, 512, &err) == 0);
	T_ASSERT((text = read_all(xp, &tlen)) != NULL);
	int *toks = malloc(sizeof(int) * (tlen + 3));
	long nt = tqr_tok_encode(tok, text, tlen, 1, 0, toks, &err);
	const int wlen = tqr_model_config(m)->seq_len, windows = 2;
	T_ASSERT(nt >= (long)wlen * windows);
	struct tqr_kv_geom g = geom_of(m);
	struct tqr_kv_local_opts of16 = { TQ_CODEC_F16, TQ_CODEC_F16, 1, 1, 0, 0, 0.0f, 0 };
	struct tqr_kv_local_opts otq2 = { TQ_CODEC_TQ2, TQ_CODEC_TQ2, 1, 1, 0, 0, 0.0f, 0 };
	T_ASSERT(tqr_kv_new_exact(&ex, &g, &err) == 0);
	T_ASSERT(tqr_kv_new_local(&f16, &g, &of16, &err) == 0);
	T_ASSERT(tqr_kv_new_local(&t2, &g, &otq2, &err) == 0);
	double a = window_ppl(m, ex, toks, windows, wlen);
	double b = window_ppl(m, f16, toks, windows, wlen);
	double c = window_ppl(m, t2, toks, windows, wlen);
	fprintf(stderr, "  %d windows: nats/token exact %.5f, f16 %.5f, tq2 %.5f; ppl %.4f %.4f %.4f\n",
		windows, a, b, c, exp(a), exp(b), exp(c));
	tqr_kv_free(ex);
	tqr_kv_free(f16);
	tqr_kv_free(t2);
	tqr_tok_free(tok);
	tqr_model_free(m);
	free(toks);
	free(text);
	/* data README: about 1.42 nats/token for this model on TinyStories */
	T_ASSERT(a > 1.2 && a < 1.7);
	T_NEAR(exp(b) / exp(a), 1.0, 1e-3);
	/* 2-bit keys must cost something, or the codec path is not in use */
	T_ASSERT(c > a + 0.01);
}

/* ---- bad checkpoints -------------------------------------------------------------- */

static int load_fails(const char *path, int want_rc, const char *want_msg)
{
	tqr_model *m = NULL;
	tqr_error err = { { 0 } };
	int rc = tqr_model_load(&m, path, &err);

	if (rc >= 0) {
		tqr_model_free(m);
		fprintf(stderr, "  %s loaded\n", path);
		return 0;
	}
	if (!strstr(err.msg, want_msg) || (want_rc && rc != want_rc)) {
		fprintf(stderr, "  rc %d, message '%s' (want %d, '%s')\n", rc, err.msg, want_rc, want_msg);
		return 0;
	}
	return 1;
}

static void test_bad_checkpoints(void)
{
	char p[400];
	const int32_t ok[7] = { 32, 48, 2, 4, 2, 40, 16 };
	int32_t h[7];

	path_in(p, sizeof(p), tmpdir, "bad.bin");
	rng_state = 5;
	T_ASSERT(make_ckpt(p, ok, 0.1, 0) == 0);
	{
		tqr_model *m = NULL;
		tqr_error err;
		T_EQ(tqr_model_load(&m, p, &err), 0);
		T_EQ(tqr_model_config(m)->head_dim, 8);
		T_EQ(tqr_model_config(m)->shared_classifier, 1);
		tqr_model_free(m);
	}
	path_in(p, sizeof(p), tmpdir, "missing.bin");
	T_ASSERT(load_fails(p, -ENOENT, "No such file"));
	path_in(p, sizeof(p), tmpdir, "bad.bin");
	T_ASSERT(make_ckpt(p, ok, 0.1, -1) == 0);
	T_ASSERT(load_fails(p, -EINVAL, "truncated"));
	T_ASSERT(make_ckpt(p, ok, 0.1, -4000) == 0);
	T_ASSERT(load_fails(p, -EINVAL, "truncated"));
	T_ASSERT(make_ckpt(p, ok, 0.1, 4) == 0);
	T_ASSERT(load_fails(p, -EINVAL, "wrong size"));
	T_ASSERT(write_file(p, "", 0) == 0);
	T_ASSERT(load_fails(p, -EINVAL, "truncated"));
	T_ASSERT(write_file(p, ok, 20) == 0);
	T_ASSERT(load_fails(p, -EINVAL, "truncated"));
	/* llama2.c v1 export: magic "ak42", version 1 */
	{
		int32_t v1[64] = { 0x616b3432, 1, 32, 48, 2, 4, 2, 40, 16 };
		T_ASSERT(write_file(p, v1, sizeof(v1)) == 0);
		T_ASSERT(load_fails(p, -EINVAL, "ak42"));
	}
	/* header fields out of range or inconsistent */
	const struct { int field; int32_t value; const char *msg; } bad[] = {
		{ 0, 0, "dim" }, { 0, -64, "dim" }, { 1, 0, "hidden_dim" }, { 2, 0, "n_layers" },
		{ 2, 100000, "n_layers" }, { 3, 0, "n_heads" }, { 4, 8, "n_kv_heads" }, { 4, 3, "inconsistent" },
		{ 5, 2, "vocab_size" }, { 5, INT32_MIN, "vocab_size" }, { 6, 0, "seq_len" }, { 3, 5, "inconsistent" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memcpy(h, ok, sizeof(h));
		h[bad[i].field] = bad[i].value;
		unsigned char buf[64] = { 0 };
		memcpy(buf, h, 28);
		T_ASSERT(write_file(p, buf, sizeof(buf)) == 0);
		if (!load_fails(p, -EINVAL, bad[i].msg))
			T_FAIL("header case %zu (field %d = %d) not refused", i, bad[i].field, bad[i].value);
	}
	/* a well-formed file whose head_dim the codecs cannot take: 48/4 = 12 */
	const int32_t hd12[7] = { 48, 64, 1, 4, 4, 20, 8 };
	T_ASSERT(make_ckpt(p, hd12, 0.1, 0) == 0);
	T_ASSERT(load_fails(p, -EOPNOTSUPP, "head_dim 12"));
	const int32_t hd4[7] = { 16, 32, 1, 4, 2, 20, 8 };
	T_ASSERT(make_ckpt(p, hd4, 0.1, 0) == 0);
	T_ASSERT(load_fails(p, -EOPNOTSUPP, "head_dim 4"));
	/* a NaN weight */
	{
		size_t n;
		T_ASSERT(make_ckpt(p, ok, 0.1, 0) == 0);
		unsigned char *b = read_all(p, &n);
		T_ASSERT(b != NULL);
		float nan = NAN;
		memcpy(b + 28 + 4 * 40 * 32 + 4 * 5, &nan, 4); /* rms_att[5] */
		T_ASSERT(write_file(p, b, n) == 0);
		free(b);
		T_ASSERT(load_fails(p, -EINVAL, "rms_att has a non-finite value at element 5"));
	}
	/* a directory */
	T_ASSERT(load_fails(tmpdir, -EINVAL, "not a regular file"));
}

/* ---- tokenizer ---------------------------------------------------------------------- */

struct tokspec {
	const char *s;
	float score;
};

/* Writes a tokenizer.bin: <unk> <s> </s>, 256 byte tokens, then `extra`. */
static int make_tok(const char *path, const struct tokspec *extra, int n_extra, int max_len,
		    int *vocab)
{
	FILE *f = fopen(path, "wb");
	int32_t ml = max_len;
	char b[16];

	if (!f)
		return -1;
	fwrite(&ml, 4, 1, f);
	*vocab = 0;
	for (int i = 0; i < 3 + 256 + n_extra; i++, (*vocab)++) {
		const char *s;
		float sc = 0;
		if (i < 3) {
			s = i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>";
		} else if (i < 259) {
			snprintf(b, sizeof(b), "<0x%02X>", i - 3);
			s = b;
		} else {
			s = extra[i - 259].s;
			sc = extra[i - 259].score;
		}
		int32_t n = (int32_t)strlen(s);
		fwrite(&sc, 4, 1, f);
		fwrite(&n, 4, 1, f);
		fwrite(s, 1, (size_t)n, f);
	}
	return fclose(f);
}

/* llama2.c's encoder, quadratic, with linear lookups. */
static int lin_lookup(const tqr_tok *t, const char *s, size_t n)
{
	for (int i = 0; i < tqr_tok_vocab_size(t); i++) {
		size_t m;
		const char *v = tqr_tok_str(t, i, &m);
		if (m == n && !memcmp(v, s, n))
			return i;
	}
	return -1;
}

static int naive_encode(const tqr_tok *t, const char *text, size_t len, int *out)
{
	int n = 0;
	char buf[64];

	if (len)
		out[n++] = lin_lookup(t, " ", 1);
	for (size_t i = 0; i < len;) {
		size_t j = i + 1;
		while (j < len && ((unsigned char)text[j] & 0xC0) == 0x80 && j - i < 4)
			j++;
		int id = lin_lookup(t, text + i, j - i);
		if (id >= 0) {
			out[n++] = id;
		} else {
			for (size_t k = i; k < j; k++) {
				snprintf(buf, sizeof(buf), "<0x%02X>", (unsigned char)text[k]);
				out[n++] = lin_lookup(t, buf, 6);
			}
		}
		i = j;
	}
	for (;;) {
		float best = -1e30f;
		int best_id = -1, best_i = -1;
		for (int i = 0; i + 1 < n; i++) {
			size_t a, b;
			const char *sa = tqr_tok_str(t, out[i], &a), *sb = tqr_tok_str(t, out[i + 1], &b);
			memcpy(buf, sa, a);
			memcpy(buf + a, sb, b);
			int id = lin_lookup(t, buf, a + b);
			if (id >= 0 && tqr_tok_score(t, id) > best) {
				best = tqr_tok_score(t, id);
				best_id = id;
				best_i = i;
			}
		}
		if (best_i < 0)
			break;
		out[best_i] = best_id;
		memmove(out + best_i + 1, out + best_i + 2, sizeof(int) * (size_t)(n - best_i - 2));
		n--;
	}
	return n;
}

static int encode_agrees(const tqr_tok *t, const char *s, size_t n)
{
	int *a = malloc(sizeof(int) * (n + 3)), *b = malloc(sizeof(int) * (n + 3));
	tqr_error err;
	long na = tqr_tok_encode(t, s, n, 0, 0, a, &err);
	int nb = naive_encode(t, s, n, b), ok = na == nb && !memcmp(a, b, sizeof(int) * (size_t)nb);

	if (!ok)
		fprintf(stderr, "  encode of %zu bytes '%.40s': %ld tokens vs naive %d\n", n, s, na, nb);
	free(a);
	free(b);
	return ok;
}

static void test_tok_synthetic(void)
{
	/* merges with tied scores, so the leftmost rule matters */
	static const struct tokspec ex[] = {
		{ " ", -1 }, { "a", -1 }, { "b", -1 }, { "c", -1 }, { "ab", -2 }, { "ba", -2 },
		{ "bc", -2 }, { "aa", -3 }, { "aaa", -3 }, { "abc", -2 }, { " a", -4 }, { " ab", -2 },
		{ "cab", -5 }, { "\xc3\xa9", -1 }, { "\xc3\xa9\xc3\xa9", -2 }, { "ca", -2 }, { "abab", -6 },
	};
	char p[400], s[64];
	int vocab;
	tqr_tok *t = NULL;
	tqr_error err;
	static const char *alpha[] = { "a", "b", "c", " ", "\xc3\xa9", "d", "\xe2\x82", "\xff", "\xc3" };

	path_in(p, sizeof(p), tmpdir, "tok.bin");
	T_ASSERT(make_tok(p, ex, (int)(sizeof(ex) / sizeof(ex[0])), 8, &vocab) == 0);
	T_ASSERT(tqr_tok_load(&t, p, vocab, &err) == 0);
	T_ASSERT(encode_agrees(t, "", 0));
	T_ASSERT(encode_agrees(t, "aaaa", 4));
	T_ASSERT(encode_agrees(t, "abababcab", 9));
	rng_state = t_seed();
	for (int k = 0; k < 400; k++) {
		size_t n = 0;
		int len = 1 + k % 20;
		for (int i = 0; i < len; i++) {
			const char *a = alpha[(int)((rnd() + 1) * 4.5) % 9];
			memcpy(s + n, a, strlen(a));
			n += strlen(a);
		}
		if (!encode_agrees(t, s, n))
			T_FAIL("random string %d differs", k);
	}
	/* BOS/EOS framing */
	int ids[16];
	T_EQ(tqr_tok_encode(t, "ab", 2, 1, 1, ids, &err), 3); /* " "+"a"+"b" -> " ab" */
	T_EQ(ids[0], TQR_TOK_BOS);
	T_EQ(ids[1], lin_lookup(t, " ab", 3));
	T_EQ(ids[2], TQR_TOK_EOS);
	/* decoding: byte tokens, and BOS drops the dummy prefix's space */
	const char *piece;
	size_t pn;
	T_EQ(tqr_tok_decode(t, 0, 3 + 0xff, &piece, &pn), 0);
	T_EQ(pn, 1);
	T_EQ((unsigned char)piece[0], 0xff);
	T_EQ(tqr_tok_decode(t, TQR_TOK_BOS, ids[1], &piece, &pn), 0);
	T_ASSERT(pn == 2 && !memcmp(piece, "ab", 2));
	T_EQ(tqr_tok_decode(t, 5, ids[1], &piece, &pn), 0);
	T_ASSERT(pn == 3 && !memcmp(piece, " ab", 3));
	T_EQ(tqr_tok_decode(t, 0, vocab, &piece, &pn), -EINVAL);
	T_EQ(tqr_tok_decode(t, 0, -1, &piece, &pn), -EINVAL);
	tqr_tok_free(t);

	/* a vocabulary without byte tokens cannot encode an unknown byte */
	FILE *f = fopen(p, "wb");
	int32_t ml = 8, n3 = 3, n1 = 1;
	float z = 0;
	const char *sp[] = { "<unk>", "<s>", "</s>" };
	fwrite(&ml, 4, 1, f);
	for (int i = 0; i < 3; i++) {
		fwrite(&z, 4, 1, f);
		int32_t n = (int32_t)strlen(sp[i]);
		fwrite(&n, 4, 1, f);
		fwrite(sp[i], 1, (size_t)n, f);
	}
	fwrite(&z, 4, 1, f); fwrite(&n1, 4, 1, f); fwrite(" ", 1, 1, f);
	fwrite(&z, 4, 1, f); fwrite(&n3, 4, 1, f); fwrite("abc", 1, 3, f);
	fclose(f);
	T_ASSERT(tqr_tok_load(&t, p, 5, &err) == 0);
	T_EQ(tqr_tok_encode(t, "x", 1, 0, 0, ids, &err), -EILSEQ);
	T_ASSERT(strstr(err.msg, "0x78") != NULL);
	tqr_tok_free(t);
}

static void test_tok_real(void)
{
	char tp[600], xp[600];
	tqr_tok *t = NULL;
	tqr_error err;
	size_t tlen;
	char *text;

	if (!have_data)
		return;
	path_in(tp, sizeof(tp), data_dir, "tok512.bin");
	path_in(xp, sizeof(xp), data_dir, "tinystories-dev.txt");
	T_ASSERT(tqr_tok_load(&t, tp, 512, &err) == 0);
	T_ASSERT((text = read_all(xp, &tlen)) != NULL);
	/* fast vs naive on slices (naive is quadratic: keep them short) */
	for (size_t off = 0; off + 200 < tlen && off < 60000; off += 2999)
		if (!encode_agrees(t, text + off, 200))
			T_FAIL("slice at %zu differs", off);
	/* the README's prompt */
	const char *pr = "Once upon a time, there was a little girl named Lily.";
	T_ASSERT(encode_agrees(t, pr, strlen(pr)));
	/* decode(encode(x)) == x for the first 20 kB */
	size_t n = tlen < 20000 ? tlen : 20000;
	int *ids = malloc(sizeof(int) * (n + 3));
	long k = tqr_tok_encode(t, text, n, 1, 0, ids, &err);
	T_ASSERT(k > 1 && k < (long)n);
	char *back = malloc(n + 64);
	size_t bn = 0;
	for (long i = 1; i < k && bn < n + 32; i++) {
		const char *pc;
		size_t pn;
		T_EQ(tqr_tok_decode(t, ids[i - 1], ids[i], &pc, &pn), 0);
		if (bn + pn > n + 32)
			break;
		memcpy(back + bn, pc, pn);
		bn += pn;
	}
	int same = bn == n && !memcmp(back, text, n);
	free(back);
	free(ids);
	free(text);
	tqr_tok_free(t);
	T_ASSERT(same);
}

static int tok_fails(const char *path, int vocab, const char *want)
{
	tqr_tok *t = NULL;
	tqr_error err = { { 0 } };
	int rc = tqr_tok_load(&t, path, vocab, &err);

	tqr_tok_free(t);
	if (rc >= 0 || !strstr(err.msg, want)) {
		fprintf(stderr, "  rc %d '%s' (want '%s')\n", rc, err.msg, want);
		return 0;
	}
	return 1;
}

static void test_tok_bad(void)
{
	static const struct tokspec ex[] = { { "ab", 1 }, { "abcd", 2 } };
	char p[400];
	size_t n;
	int vocab;
	unsigned char *b;

	path_in(p, sizeof(p), tmpdir, "tokbad.bin");
	T_ASSERT(make_tok(p, ex, 2, 8, &vocab) == 0);
	T_ASSERT((b = read_all(p, &n)) != NULL);
	T_ASSERT(tok_fails(p, vocab + 1, "mismatch"));
	T_ASSERT(tok_fails(p, vocab - 1, "mismatch"));
	T_ASSERT(tok_fails(p, 2, "too small"));
	T_ASSERT(write_file(p, b, n - 1) == 0);
	T_ASSERT(tok_fails(p, vocab, "truncated"));
	T_ASSERT(write_file(p, b, n - 6) == 0);
	T_ASSERT(tok_fails(p, vocab, "truncated"));
	T_ASSERT(write_file(p, b, 2) == 0);
	T_ASSERT(tok_fails(p, vocab, "too short"));
	/* the last token ("abcd") is longer than max_token_length */
	int32_t ml = 3;
	memcpy(b, &ml, 4);
	T_ASSERT(write_file(p, b, n) == 0);
	T_ASSERT(tok_fails(p, vocab, "max_token_length"));
	ml = 0;
	memcpy(b, &ml, 4);
	T_ASSERT(write_file(p, b, n) == 0);
	T_ASSERT(tok_fails(p, vocab, "max_token_length"));
	ml = 8;
	memcpy(b, &ml, 4);
	/* a negative length: token 0's length field */
	int32_t neg = -5;
	unsigned char *c = malloc(n);
	memcpy(c, b, n);
	memcpy(c + 8, &neg, 4);
	T_ASSERT(write_file(p, c, n) == 0);
	T_ASSERT(tok_fails(p, vocab, "length -5"));
	/* a NaN score on token 0 */
	memcpy(c, b, n);
	float nan = NAN;
	memcpy(c + 4, &nan, 4);
	T_ASSERT(write_file(p, c, n) == 0);
	T_ASSERT(tok_fails(p, vocab, "non-finite score"));
	free(c);
	free(b);
}

/* Random corruption of a valid tokenizer and of a checkpoint's header: every
 * load fails cleanly or yields a usable object (ASan/UBSan builds check the
 * "cleanly"). */
static void test_corruption(void)
{
	static const struct tokspec ex[] = { { " ", -1 }, { "a", -1 }, { "ab", -2 }, { " ab", -3 } };
	const int32_t h[7] = { 16, 24, 1, 2, 1, 12, 8 };
	char tp[400], mp[400], cp[400];
	unsigned char *tb, *mb;
	size_t tn, mn;
	int vocab, loaded = 0, refused = 0;

	path_in(tp, sizeof(tp), tmpdir, "fz_tok.bin");
	path_in(mp, sizeof(mp), tmpdir, "fz_model.bin");
	path_in(cp, sizeof(cp), tmpdir, "fz_case.bin");
	rng_state = t_seed() ^ 0xf022;
	T_ASSERT(make_tok(tp, ex, 4, 8, &vocab) == 0);
	T_ASSERT(make_ckpt(mp, h, 0.2, 0) == 0);
	T_ASSERT((tb = read_all(tp, &tn)) != NULL);
	T_ASSERT((mb = read_all(mp, &mn)) != NULL);
	unsigned char *w = malloc(tn > mn ? tn : mn);
	for (int it = 0; it < 400; it++) {
		int is_tok = it % 2 == 0;
		const unsigned char *src = is_tok ? tb : mb;
		size_t n = is_tok ? tn : mn;
		memcpy(w, src, n);
		/* a few byte or int32 overwrites; tokenizers anywhere, checkpoints
		 * in the header; sometimes a truncation */
		int edits = 1 + it % 4;
		for (int e = 0; e < edits; e++) {
			size_t span = is_tok ? n : 28;
			size_t at = (size_t)((rnd() + 1) * 0.5 * (double)span) % span;
			if (it % 3 == 0 && at + 4 <= n) {
				int32_t v = (int32_t)(rnd() * 70000.0);
				memcpy(w + at, &v, 4);
			} else {
				w[at] = (unsigned char)((rnd() + 1) * 128);
			}
		}
		if (it % 7 == 0)
			n = (size_t)((rnd() + 1) * 0.5 * (double)n);
		T_ASSERT(write_file(cp, w, n) == 0);
		tqr_error err;
		if (is_tok) {
			tqr_tok *t = NULL;
			if (tqr_tok_load(&t, cp, vocab, &err) == 0) {
				int ids[32];
				long k = tqr_tok_encode(t, "ab a\xc3\xa9", 6, 1, 1, ids, &err);
				for (long i = 1; i < k; i++) {
					const char *pc;
					size_t pn;
					T_EQ(tqr_tok_decode(t, ids[i - 1], ids[i], &pc, &pn), 0);
				}
				loaded++;
			} else {
				T_ASSERT(err.msg[0] != 0);
				refused++;
			}
			tqr_tok_free(t);
		} else {
			tqr_model *m = NULL;
			if (tqr_model_load(&m, cp, &err) == 0) {
				/* the header still matches the file: run a few tokens */
				struct tqr_kv_geom g = geom_of(m);
				tqr_kv *kv = NULL;
				int V = tqr_model_config(m)->vocab_size, toks[3] = { 0, V - 1, 1 % V };
				float *lg = malloc(sizeof(float) * 3 * (size_t)V);
				if (g.max_tokens >= 3 && tqr_kv_new_exact(&kv, &g, &err) == 0)
					T_EQ(run_logits(m, kv, toks, 3, 2, lg), 0);
				tqr_kv_free(kv);
				free(lg);
				loaded++;
			} else {
				T_ASSERT(err.msg[0] != 0);
				refused++;
			}
			tqr_model_free(m);
		}
	}
	free(w);
	free(tb);
	free(mb);
	fprintf(stderr, "  400 corrupted files: %d loaded, %d refused with a message\n", loaded, refused);
	T_ASSERT(loaded > 0 && refused > 0);
}

/* ---- sampler ------------------------------------------------------------------------ */

static void test_sampler(void)
{
	tqr_sampler *s = NULL, *s2 = NULL;
	tqr_error err;
	float lg[6], base[6] = { 1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.9f };
	int counts[6] = { 0 };

	T_EQ(tqr_sampler_new(&s, 6, -1.0f, 0.9f, 1, &err), -EINVAL);
	T_EQ(tqr_sampler_new(&s, 6, 1.0f, 1.5f, 1, &err), -EINVAL);
	T_EQ(tqr_sampler_new(&s, 6, NAN, 0.5f, 1, &err), -EINVAL);
	/* greedy */
	T_EQ(tqr_sampler_new(&s, 6, 0.0f, 0.9f, 1, &err), 0);
	memcpy(lg, base, sizeof(lg));
	T_EQ(tqr_sample(s, lg), 1);
	tqr_sampler_free(s);
	/* a seed reproduces a run; another seed gives another run */
	T_EQ(tqr_sampler_new(&s, 6, 1.0f, 0.0f, 1234, &err), 0);
	T_EQ(tqr_sampler_new(&s2, 6, 1.0f, 0.0f, 1234, &err), 0);
	int diff = 0;
	for (int i = 0; i < 200; i++) {
		float a[6], b[6];
		memcpy(a, base, sizeof(a));
		memcpy(b, base, sizeof(b));
		int x = tqr_sample(s, a), y = tqr_sample(s2, b);
		diff += x != y;
		counts[x]++;
	}
	T_EQ(diff, 0);
	tqr_sampler_free(s2);
	/* multinomial: frequencies follow softmax(base) */
	for (int i = 0; i < 19800; i++) {
		memcpy(lg, base, sizeof(lg));
		counts[tqr_sample(s, lg)]++;
	}
	double z = 0;
	for (int i = 0; i < 6; i++)
		z += exp(base[i]);
	for (int i = 0; i < 6; i++)
		T_NEAR(counts[i] / 20000.0, exp(base[i]) / z, 0.015);
	tqr_sampler_free(s);
	/* top-p 0.5: probabilities 0.37 (id 1), 0.33 (id 5), 0.22 (id 2), ...:
	 * the nucleus is {1, 5}; both appear, nothing else does */
	T_EQ(tqr_sampler_new(&s, 6, 1.0f, 0.5f, 99, &err), 0);
	memset(counts, 0, sizeof(counts));
	for (int i = 0; i < 2000; i++) {
		memcpy(lg, base, sizeof(lg));
		counts[tqr_sample(s, lg)]++;
	}
	tqr_sampler_free(s);
	T_ASSERT(counts[1] > 0 && counts[5] > 0);
	T_EQ(counts[1] + counts[5], 2000);
	/* the uniform generator stays in [0, 1) */
	T_EQ(tqr_sampler_new(&s, 6, 1.0f, 0.0f, 0, &err), 0);
	double mean = 0;
	for (int i = 0; i < 10000; i++) {
		float u = tqr_sampler_uniform(s);
		T_ASSERT(u >= 0.0f && u < 1.0f);
		mean += u;
	}
	tqr_sampler_free(s);
	T_NEAR(mean / 10000, 0.5, 0.02);
}

/* ---- backend errors ------------------------------------------------------------------- */

static void backend_errors(tqr_kv *kv, const struct tqr_kv_geom *g)
{
	size_t qd = (size_t)g->n_q_heads * g->head_dim, kd = (size_t)g->n_kv_heads * g->head_dim;
	float *q = calloc(qd * 4, 4), *k = calloc(kd * 4, 4), *v = calloc(kd * 4, 4), *o = calloc(qd * 4, 4);
	tqr_error err;
	struct tqr_kv_stats st;

	for (size_t i = 0; i < kd * 4; i++)
		k[i] = v[i] = (float)(i % 7) * 0.1f;
	T_EQ(tqr_kv_append_attend(kv, 0, 1, 1, q, k, v, o, &err), -EINVAL);  /* gap */
	T_EQ(tqr_kv_append_attend(kv, g->n_layers, 0, 1, q, k, v, o, &err), -EINVAL);
	T_EQ(tqr_kv_append_attend(kv, 0, 0, 0, q, k, v, o, &err), -EINVAL);
	T_EQ(tqr_kv_append_attend(kv, 0, 0, 3, q, k, v, o, &err), 0);
	T_EQ(tqr_kv_append_attend(kv, 0, 0, 1, q, k, v, o, &err), -EINVAL);  /* overlap */
	T_EQ(tqr_kv_append_attend(kv, 0, 3, 2, q, k, v, o, &err), -ENOSPC); /* max_tokens 4 */
	k[2] = NAN;
	T_EQ(tqr_kv_append_attend(kv, 0, 3, 1, q, k, v, o, &err), -EINVAL);
	k[2] = 0;
	tqr_kv_stats(kv, &st);
	T_EQ(st.tokens, 3);   /* the failed appends left the layer as it was */
	T_EQ(tqr_kv_append_attend(kv, 0, 3, 1, q, k, v, o, &err), 0);
	T_EQ(tqr_kv_reset(kv, &err), 0);
	tqr_kv_stats(kv, &st);
	T_EQ(st.tokens, 0);
	T_EQ(st.peak_tokens, 4);
	T_EQ(tqr_kv_append_attend(kv, 0, 0, 2, q, k, v, o, &err), 0);
	free(q); free(k); free(v); free(o);
}

static void test_backend_errors(void)
{
	struct tqr_kv_geom g = { 2, 2, 4, 8, 4 }, bad = { 2, 3, 4, 8, 4 }, bad_hd = { 2, 2, 4, 12, 4 };
	struct tqr_kv_local_opts o = { TQ_CODEC_Q8, TQ_CODEC_TQ4, 7, 1, 2, 0, 0.0f, 0 };
	tqr_kv *kv = NULL;
	tqr_error err;

	T_EQ(tqr_kv_new_exact(&kv, &bad, &err), -EINVAL);
	T_EQ(tqr_kv_new_local(&kv, &bad_hd, &o, &err), -EINVAL);
	T_EQ(tqr_kv_new_exact(&kv, &g, &err), 0);
	backend_errors(kv, &g);
	tqr_kv_free(kv);
	T_EQ(tqr_kv_new_local(&kv, &g, &o, &err), 0);
	backend_errors(kv, &g);
	tqr_kv_free(kv);
}

int main(void)
{
	const char *dd = getenv("TQ_DATA"), *src = getenv("TQ_SRC"), *td = getenv("TMPDIR");
	struct stat st;

	snprintf(tmpdir, sizeof(tmpdir), "%s/test_model.XXXXXX", td && *td ? td : "/tmp");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	if (dd)
		snprintf(data_dir, sizeof(data_dir), "%s", dd);
	else
		snprintf(data_dir, sizeof(data_dir), "%s/../shared/data", src ? src : ".");
	char probe[600];
	path_in(probe, sizeof(probe), data_dir, "stories260K.bin");
	have_data = stat(probe, &st) == 0;

	T_RUN(test_bad_checkpoints);
	T_RUN(test_forward_synthetic);
	T_RUN(test_chunk_invariance);
	T_RUN(test_local_f32);
	T_RUN(test_fused_vs_ref);
	T_RUN(test_tok_synthetic);
	T_RUN(test_tok_bad);
	T_RUN(test_corruption);
	T_RUN(test_sampler);
	T_RUN(test_backend_errors);
	T_RUN(test_forward_real);
	T_RUN(test_tok_real);
	T_RUN(test_ppl_f16);

	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
	int rc = t_done();
	if (rc == 0 && !have_data)
		t_skip("../shared/data is absent: the real-model cases were skipped (the synthetic ones passed)");
	return rc;
}
