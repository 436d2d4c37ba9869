/* test_xform.c — the key/value transforms (kernels/tq_xform.h): exact in
 * attention, better scores through a 4-bit codec on keys with an offset and
 * outlier channels, modes, calibration rules, and the stored bytes. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tq_attn.h"
#include "tq_codec.h"
#include "tq_page.h"
#include "tq_xform.h"

#define D    64
#define NKV  2
#define NQH  6
#define PT   16u

static uint64_t rs;
static double urand(void)
{
	rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
	return (double)(rs >> 11) * (1.0 / 9007199254740992.0);
}
static float gauss(void)
{
	double u = urand() + 1e-12, v = urand();
	return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Keys like a real model's: a large shared offset per channel, a few
 * channels much larger than the rest; queries with outliers on the same
 * channels; values with a sink token (0) near zero. */
static void make_inputs(float *k, float *v, float *q, uint32_t n, uint32_t n_q)
{
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t h = 0; h < NKV; h++)
			for (uint32_t c = 0; c < D; c++) {
				size_t i = ((size_t)t * NKV + h) * D + c;
				float off = (float)((c * 37 + h * 5) % 11) - 5.0f;
				float amp = c % 16 == 3 ? 8.0f : 1.0f;
				k[i] = 1.5f * off + amp * gauss();
				v[i] = t == 0 ? 0.01f * gauss() : gauss() + 0.3f;
			}
	for (uint32_t t = 0; t < n_q; t++)
		for (uint32_t h = 0; h < NQH; h++)
			for (uint32_t c = 0; c < D; c++)
				q[((size_t)t * NQH + h) * D + c] = (c % 16 == 3 ? 0.05f : 0.3f) * gauss();
}

struct cache {
	tq_codec *kc, *vc;
	struct tq_page_geom g;
	uint8_t *pages[64];
	struct tq_page_table pt;
};

static int cache_build(struct cache *c, enum tq_codec_id kid, enum tq_codec_id vid, const float *k, const float *v,
		       uint32_t n)
{
	struct tq_codec_params kp = { .id = kid, .dim = D, .seed = 11 }, vp = { .id = vid, .dim = D, .seed = 12 };
	tq_error err;

	memset(c, 0, sizeof(*c));
	if (tq_codec_new(&c->kc, NULL, &kp, &err) || tq_codec_new(&c->vc, NULL, &vp, &err))
		return -1;
	c->g = (struct tq_page_geom){ .n_kv_heads = NKV, .page_tokens = PT,
				      .k_block_bytes = (uint32_t)tq_codec_block_bytes(c->kc),
				      .v_block_bytes = (uint32_t)tq_codec_block_bytes(c->vc) };
	c->pt.geom = c->g;
	c->pt.n_tokens = n;
	c->pt.n_pages = tq_page_count(&c->g, n);
	c->pt.pages = (const uint8_t *const *)c->pages;
	for (uint32_t p = 0; p < c->pt.n_pages; p++)
		if (!(c->pages[p] = aligned_alloc(TQ_PAGE_ALIGN, tq_page_bytes(&c->g))))
			return -1;
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t h = 0; h < NKV; h++) {
			uint8_t *pg = c->pages[t / PT];
			size_t i = ((size_t)t * NKV + h) * D;
			if (tq_encode(c->kc, k + i, TQ_DTYPE_F32, 1, pg + tq_page_k_off(&c->g, h, t % PT), &err) ||
			    tq_encode(c->vc, v + i, TQ_DTYPE_F32, 1, pg + tq_page_v_off(&c->g, h, t % PT), &err))
				return -1;
		}
	return 0;
}

static void cache_free(struct cache *c)
{
	for (uint32_t p = 0; p < c->pt.n_pages; p++)
		free(c->pages[p]);
	tq_codec_free(c->kc);
	tq_codec_free(c->vc);
}

/* Causal attention of n_q queries at the last positions, through the
 * transform (NULL: none), with the reference kernel. */
static int attend(enum tq_codec_id kid, enum tq_codec_id vid, tq_xf *xf, const float *k, const float *v,
		  const float *q, uint32_t n, uint32_t n_q, float *out)
{
	size_t wk = (size_t)n * NKV * D, wq = (size_t)n_q * NQH * D;
	float *k2 = malloc(wk * 4), *v2 = malloc(wk * 4), *q2 = malloc(wq * 4);
	int32_t pos[64];
	struct cache c;
	tq_error err;
	int rc = -1;

	if (!k2 || !v2 || !q2)
		goto out;
	if (xf) {
		tq_xf_keys(xf, k, TQ_DTYPE_F32, n, k2);
		tq_xf_values(xf, v, TQ_DTYPE_F32, n, v2);
		tq_xf_queries(xf, q, TQ_DTYPE_F32, n_q, q2);
	} else {
		memcpy(k2, k, wk * 4);
		memcpy(v2, v, wk * 4);
		memcpy(q2, q, wq * 4);
	}
	for (uint32_t i = 0; i < n_q; i++)
		pos[i] = (int32_t)(n - n_q + i);
	if (cache_build(&c, kid, vid, k2, v2, n) == 0) {
		struct tq_attn_params ap = {
			.k_codec = c.kc, .v_codec = c.vc, .n_q_heads = NQH, .kv = &c.pt, .n_q = (int)n_q,
			.q = q2, .q_dtype = TQ_DTYPE_F32, .q_pos = pos, .causal = 1, .out = out,
		};
		rc = tq_attend_ref(&ap, &err);
		if (rc == 0 && xf)
			tq_xf_output(xf, out, n_q);
	}
	cache_free(&c);
out:
	free(k2);
	free(v2);
	free(q2);
	return rc;
}

static double rel_err(const float *a, const float *b, size_t n)
{
	double e = 0, s = 0;
	for (size_t i = 0; i < n; i++) {
		e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		s += (double)b[i] * b[i];
	}
	return sqrt(e / s);
}

enum { N = 200, NQ = 32 };
static float K[N * NKV * D], V[N * NKV * D], Q[NQ * NQH * D];

/* Every mode is exact in attention: with the fp32 codec the outputs are
 * the untransformed outputs to rounding. */
static void test_exact_in_attention(void)
{
	static float ref[NQ * NQH * D], got[NQ * NQH * D];
	uint32_t modes[] = { TQ_XF_K_CENTER, TQ_XF_V_CENTER, TQ_XF_K_EQ_QK, TQ_XF_K_EQ_K,
			     TQ_XF_DEFAULT, TQ_XF_K_CENTER | TQ_XF_V_CENTER | TQ_XF_K_EQ_QK,
			     TQ_XF_K_SINK | TQ_XF_K_EQ_QK, TQ_XF_K_SINK | TQ_XF_V_CENTER, TQ_XF_V_EQ,
			     TQ_XF_V_CENTER | TQ_XF_V_EQ, TQ_XF_DEFAULT | TQ_XF_V_EQ };

	rs = t_seed();
	make_inputs(K, V, Q, N, NQ);
	T_EQ(attend(TQ_CODEC_F32, TQ_CODEC_F32, NULL, K, V, Q, N, NQ, ref), 0);
	for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		tq_xf *xf;
		T_EQ(tq_xf_new(&xf, modes[m], NKV, NQH, D, NULL, NULL), 0);
		T_EQ(tq_xf_calibrate(xf, K, V, Q, 64, NQ, TQ_DTYPE_F32), 0);
		/* K order needs a K codec with an outlier half (test_k_order) */
		T_EQ(tq_xf_applied(xf), modes[m] & ~(uint32_t)TQ_XF_K_ORDER);
		T_EQ(attend(TQ_CODEC_F32, TQ_CODEC_F32, xf, K, V, Q, N, NQ, got), 0);
		double e = rel_err(got, ref, (size_t)NQ * NQH * D);
		tq_xf_free(xf);
		if (!(e < 2e-6))
			T_FAIL("mode 0x%x: relative output error %.3g", modes[m], e);
	}
}

/* Through tq4 keys the default transform makes attention closer to exact
 * on keys with an offset and outlier channels (by a wide margin here). */
static void test_default_helps_tq4_keys(void)
{
	static float ref[NQ * NQH * D], plain[NQ * NQH * D], xfd[NQ * NQH * D];
	tq_xf *xf;

	rs = t_seed() ^ 0x55;
	make_inputs(K, V, Q, N, NQ);
	for (size_t i = 0; i < (size_t)NQ * NQH * D; i++)
		Q[i] *= 4.0f;                       /* peaky attention, where key errors show */
	T_EQ(attend(TQ_CODEC_F32, TQ_CODEC_F32, NULL, K, V, Q, N, NQ, ref), 0);
	T_EQ(attend(TQ_CODEC_TQ4, TQ_CODEC_F32, NULL, K, V, Q, N, NQ, plain), 0);
	T_EQ(tq_xf_new(&xf, TQ_XF_DEFAULT, NKV, NQH, D, NULL, NULL), 0);
	T_EQ(tq_xf_calibrate(xf, K, V, Q, 64, NQ, TQ_DTYPE_F32), 0);
	T_EQ(attend(TQ_CODEC_TQ4, TQ_CODEC_F32, xf, K, V, Q, N, NQ, xfd), 0);
	double ep = rel_err(plain, ref, (size_t)NQ * NQH * D), ex = rel_err(xfd, ref, (size_t)NQ * NQH * D);
	tq_xf_free(xf);
	fprintf(stderr, "  tq4 keys: output error %.4f plain, %.4f with %s\n", ep, ex, "k-center+k-eq-qk");
	T_ASSERT(ex < 0.7 * ep);
}

/* V equalization: through tq4 values with a few loud channels the output
 * is closer to exact (the loud channels no longer set every row's norm,
 * so the quiet ones get finer steps); with the channel amplitudes below
 * the predicted error ratio is (Σ r)² / (d Σ r²) = 0.42. */
static void test_v_eq_helps_tq4_values(void)
{
	static float ref[NQ * NQH * D], plain[NQ * NQH * D], xfd[NQ * NQH * D];
	tq_xf *xf;

	rs = t_seed() ^ 0x5e;
	make_inputs(K, V, Q, N, NQ);
	for (size_t i = 0; i < (size_t)N * NKV * D; i++)
		if (i % D % 16 == 5)
			V[i] *= 8.0f;
	T_EQ(attend(TQ_CODEC_F32, TQ_CODEC_F32, NULL, K, V, Q, N, NQ, ref), 0);
	T_EQ(attend(TQ_CODEC_F32, TQ_CODEC_TQ4, NULL, K, V, Q, N, NQ, plain), 0);
	T_EQ(tq_xf_new(&xf, TQ_XF_V_EQ, NKV, NQH, D, NULL, NULL), 0);
	T_EQ(tq_xf_calibrate(xf, K, V, Q, 64, NQ, TQ_DTYPE_F32), 0);
	T_EQ(tq_xf_applied(xf), TQ_XF_V_EQ);
	T_EQ(tq_xf_touches_output(xf), 1);
	T_EQ(tq_xf_touches_queries(xf), 0);
	T_EQ(attend(TQ_CODEC_F32, TQ_CODEC_TQ4, xf, K, V, Q, N, NQ, xfd), 0);
	double ep = rel_err(plain, ref, (size_t)NQ * NQH * D), ex = rel_err(xfd, ref, (size_t)NQ * NQH * D);
	tq_xf_free(xf);
	fprintf(stderr, "  tq4 values: output error %.4f plain, %.4f with v-eq\n", ep, ex);
	T_ASSERT(ex < 0.8 * ep);
}

static void test_calibration_rules(void)
{
	tq_xf *xf;

	rs = t_seed() ^ 0x77;
	make_inputs(K, V, Q, N, NQ);
	/* too few tokens: identity, frozen */
	T_EQ(tq_xf_new(&xf, TQ_XF_DEFAULT, NKV, NQH, D, NULL, NULL), 0);
	T_EQ(tq_xf_calibrate(xf, K, V, Q, TQ_XF_MIN_TOKENS - 1, 1, TQ_DTYPE_F32), 0);
	T_EQ(tq_xf_calibrated(xf), 1);
	T_EQ(tq_xf_applied(xf), TQ_XF_K_UNSHRINK);   /* needs no statistics */
	T_EQ(tq_xf_calibrate(xf, K, V, Q, 64, 1, TQ_DTYPE_F32), -EALREADY);
	/* emptied: calibrates again; no queries: no query-based equalization
	 * (the values' needs none) */
	tq_xf_reset(xf);
	T_EQ(tq_xf_calibrate(xf, K, V, NULL, 64, 0, TQ_DTYPE_F32), 0);
	T_EQ(tq_xf_applied(xf), TQ_XF_K_CENTER | TQ_XF_V_EQ | TQ_XF_K_UNSHRINK);
	T_EQ(tq_xf_touches_queries(xf), 0);   /* no K codec given: the factor is 1 */
	tq_xf_free(xf);
	/* mode 0 never applies anything */
	T_EQ(tq_xf_new(&xf, 0, NKV, NQH, D, NULL, NULL), 0);
	T_EQ(tq_xf_calibrate(xf, K, V, Q, 64, NQ, TQ_DTYPE_F32), 0);
	T_EQ(tq_xf_applied(xf), 0);
	tq_xf_free(xf);
	/* f16 input calibrates like its f32 values */
	{
		static uint16_t k16[64 * NKV * D], v16[64 * NKV * D];
		static float kf[64 * NKV * D], vf[64 * NKV * D], a[8 * NKV * D], b[8 * NKV * D];
		tq_xf *x1, *x2;
		for (size_t i = 0; i < 64 * NKV * D; i++) {
			k16[i] = tq_f32_to_f16(K[i]);
			v16[i] = tq_f32_to_f16(V[i]);
			kf[i] = tq_f16_to_f32(k16[i]);
			vf[i] = tq_f16_to_f32(v16[i]);
		}
		T_EQ(tq_xf_new(&x1, TQ_XF_K_CENTER | TQ_XF_K_EQ_K, NKV, NQH, D, NULL, NULL), 0);
		T_EQ(tq_xf_new(&x2, TQ_XF_K_CENTER | TQ_XF_K_EQ_K, NKV, NQH, D, NULL, NULL), 0);
		T_EQ(tq_xf_calibrate(x1, k16, v16, NULL, 64, 0, TQ_DTYPE_F16), 0);
		T_EQ(tq_xf_calibrate(x2, kf, vf, NULL, 64, 0, TQ_DTYPE_F32), 0);
		tq_xf_keys(x1, k16, TQ_DTYPE_F16, 8, a);
		tq_xf_keys(x2, kf, TQ_DTYPE_F32, 8, b);
		T_ASSERT(memcmp(a, b, sizeof(a)) == 0);
		tq_xf_free(x1);
		tq_xf_free(x2);
	}
	/* f32 rows near float's limit: the centres are clamped to
	 * ±TQ_XF_MEAN_MAX, so ordinary rows still transform to finite ones,
	 * and the stored statistics read back (their rms, beyond float's
	 * range unclamped, made the blob unreadable: a persistent session so
	 * calibrated could not have been restored); the K centre as the
	 * channel mean and as the first token's key (k-sink) */
	for (int sink = 0; sink < 2; sink++) {
		static float kb[16 * NKV * D], vb[16 * NKV * D], a[NKV * D], b[NKV * D];
		tq_xf *x1, *x2;
		tq_error e2;
		for (size_t i = 0; i < 16 * NKV * D; i++) {
			kb[i] = (i % 3 ? 2.5e38f : -3.0e38f) * (i % D < 2 ? 1.0f : 1e-3f);
			vb[i] = (i % 5 ? -3.3e38f : 3.1e38f) * (i % D < 2 ? 1.0f : 1e-3f);
		}
		const uint32_t m = (sink ? TQ_XF_K_SINK : TQ_XF_K_CENTER) | TQ_XF_V_CENTER | TQ_XF_K_EQ_K | TQ_XF_V_EQ;
		T_EQ(tq_xf_new(&x1, m, NKV, NQH, D, NULL, NULL), 0);
		T_EQ(tq_xf_new(&x2, m, NKV, NQH, D, NULL, NULL), 0);
		T_EQ(tq_xf_calibrate(x1, kb, vb, NULL, 16, 0, TQ_DTYPE_F32), 0);
		size_t nb = tq_xf_blob_bytes(x1);
		uint8_t *blob = malloc(nb);
		T_ASSERT(blob != NULL);
		tq_xf_blob_write(x1, blob);
		T_EQ(tq_xf_blob_read(x2, blob, nb, &e2), 0);
		for (uint32_t i = 0; i < NKV * D; i++)
			a[i] = (float)((int)(i % 7) - 3);
		tq_xf_keys(x2, a, TQ_DTYPE_F32, 1, b);
		for (uint32_t i = 0; i < NKV * D; i++)
			T_ASSERT(isfinite(b[i]));
		tq_xf_values(x2, a, TQ_DTYPE_F32, 1, b);
		for (uint32_t i = 0; i < NKV * D; i++)
			T_ASSERT(isfinite(b[i]));
		free(blob);
		tq_xf_free(x1);
		tq_xf_free(x2);
	}
	/* bad shapes and modes */
	tq_error err;
	T_EQ(tq_xf_new(&xf, TQ_XF_K_EQ_QK | TQ_XF_K_EQ_K, NKV, NQH, D, NULL, &err), -EINVAL);
	T_EQ(tq_xf_new(&xf, 0x100, NKV, NQH, D, NULL, &err), -EINVAL);
	T_EQ(tq_xf_new(&xf, 0, 4, 6, D, NULL, &err), -EINVAL);
}

static void test_mode_names(void)
{
	uint32_t m;
	char buf[64];

	T_EQ(tq_xf_mode_parse("default", &m), 0);
	T_EQ(m, TQ_XF_DEFAULT);
	T_EQ(tq_xf_mode_parse("none", &m), 0);
	T_EQ(m, 0);
	T_EQ(tq_xf_mode_parse("k-center,v-center+k-eq-k", &m), 0);
	T_EQ(m, TQ_XF_K_CENTER | TQ_XF_V_CENTER | TQ_XF_K_EQ_K);
	T_ASSERT(strcmp(tq_xf_mode_str(m, buf, sizeof(buf)), "k-center+v-center+k-eq-k") == 0);
	T_ASSERT(strcmp(tq_xf_mode_str(0, buf, sizeof(buf)), "none") == 0);
	T_EQ(tq_xf_mode_parse("k-eq-qk,k-eq-k", &m), -EINVAL);
	T_EQ(tq_xf_mode_parse("k-center+k-sink", &m), -EINVAL);
	T_EQ(tq_xf_mode_parse("k-sink+k-eq-qk+k-unshrink", &m), 0);
	T_EQ(m, TQ_XF_K_SINK | TQ_XF_K_EQ_QK | TQ_XF_K_UNSHRINK);
	T_ASSERT(strcmp(tq_xf_mode_str(m, buf, sizeof(buf)), "k-sink+k-eq-qk+k-unshrink") == 0);
	T_EQ(tq_xf_mode_parse("default+v-eq", &m), 0);
	T_EQ(m, TQ_XF_DEFAULT | TQ_XF_V_EQ);
	T_ASSERT(strcmp(tq_xf_mode_str(m, buf, sizeof(buf)), "k-center+v-eq+k-eq-qk+k-unshrink+k-order") == 0);
	/* every valid mode's name fits TQ_XF_NAME_MAX whole and parses back
	 * (the longest, k-center+v-center+v-eq+k-eq-qk+k-unshrink+k-order, is 49) */
	for (uint32_t v = 0; v <= TQ_XF_MASK; v++) {
		char nb[TQ_XF_NAME_MAX + 8];
		uint32_t back;
		if (tq_xf_mode_check(v, NULL) < 0)
			continue;
		tq_xf_mode_str(v, nb, sizeof(nb));
		T_ASSERT(strlen(nb) < TQ_XF_NAME_MAX - 1);
		T_EQ(tq_xf_mode_parse(nb, &back), 0);
		T_EQ(back, v);
	}
	T_EQ(tq_xf_mode_parse("k-centre", &m), -EINVAL);
	T_EQ(tq_xf_mode_parse("a-very-long-word-that-is-not-a-mode-at-all", &m), -EINVAL);
}

/* The stored bytes: a round trip gives the same transform; damaged or
 * mismatched bytes are refused and leave the object as it was. */
static void test_blob(void)
{
	static float a[16 * NKV * D], b[16 * NKV * D];
	tq_xf *x1, *x2, *x3;
	tq_error err;
	uint8_t *buf;
	size_t n;

	rs = t_seed() ^ 0x99;
	make_inputs(K, V, Q, N, NQ);
	T_EQ(tq_xf_new(&x1, TQ_XF_K_CENTER | TQ_XF_V_CENTER | TQ_XF_K_EQ_QK | TQ_XF_V_EQ, NKV, NQH, D, NULL, NULL), 0);
	T_EQ(tq_xf_new(&x2, TQ_XF_K_CENTER | TQ_XF_V_CENTER | TQ_XF_K_EQ_QK | TQ_XF_V_EQ, NKV, NQH, D, NULL, NULL), 0);
	T_EQ(tq_xf_new(&x3, TQ_XF_K_CENTER, NKV, NQH, D, NULL, NULL), 0);
	T_EQ(tq_xf_blob_bytes(x1), 0);
	T_EQ(tq_xf_calibrate(x1, K, V, Q, 100, NQ, TQ_DTYPE_F32), 0);
	n = tq_xf_blob_bytes(x1);
	T_EQ(n, 32 + 4 * NKV * D * 4);
	T_ASSERT((buf = malloc(n)) != NULL);
	tq_xf_blob_write(x1, buf);
	T_EQ(tq_xf_blob_read(x2, buf, n, &err), 0);
	T_EQ(tq_xf_applied(x2), tq_xf_applied(x1));
	T_EQ(tq_xf_calib_tokens(x2), 100);
	tq_xf_keys(x1, K, TQ_DTYPE_F32, 16, a);
	tq_xf_keys(x2, K, TQ_DTYPE_F32, 16, b);
	T_ASSERT(memcmp(a, b, sizeof(a)) == 0);
	tq_xf_queries(x1, Q, TQ_DTYPE_F32, 2, a);
	tq_xf_queries(x2, Q, TQ_DTYPE_F32, 2, b);
	T_ASSERT(memcmp(a, b, 2 * NQH * D * 4) == 0);
	tq_xf_values(x1, V, TQ_DTYPE_F32, 16, a);
	tq_xf_values(x2, V, TQ_DTYPE_F32, 16, b);
	T_ASSERT(memcmp(a, b, sizeof(a)) == 0);
	/* parts beyond the session's mode */
	T_EQ(tq_xf_blob_read(x3, buf, n, &err), -EBADMSG);
	T_EQ(tq_xf_calibrated(x3), 0);
	/* every truncation */
	for (size_t cut = 0; cut < n; cut += 29)
		T_EQ(tq_xf_blob_read(x2, buf, cut, &err), -EBADMSG);
	/* a NaN mean; a scale of 0 */
	float nan = NAN, zero = 0;
	memcpy(buf + 32 + 40, &nan, 4);
	T_EQ(tq_xf_blob_read(x2, buf, n, &err), -EBADMSG);
	tq_xf_blob_write(x1, buf);
	memcpy(buf + 32 + NKV * D * 4 + 8, &zero, 4);
	T_EQ(tq_xf_blob_read(x2, buf, n, &err), -EBADMSG);
	tq_xf_blob_write(x1, buf);                        /* a V scale out of range */
	memcpy(buf + 32 + 3 * NKV * D * 4 + 12, &(float){ 1e6f }, 4);
	T_EQ(tq_xf_blob_read(x2, buf, n, &err), -EBADMSG);
	/* a mean no calibration makes (finite, but (x - mean) / s overflows
	 * for every x: fuzz_xform found it), K's and V's */
	for (int part = 0; part < 2; part++) {
		tq_xf_blob_write(x1, buf);
		memcpy(buf + 32 + 2 * part * NKV * D * 4 + 20, &(float){ part ? -2.4e38f : 1e36f }, 4);
		T_EQ(tq_xf_blob_read(x2, buf, n, &err), -EBADMSG);
		T_ASSERT(strstr(err.msg, "channel mean") != NULL);
	}
	/* x2 still holds the good state */
	tq_xf_keys(x2, K, TQ_DTYPE_F32, 16, b);
	tq_xf_keys(x1, K, TQ_DTYPE_F32, 16, a);
	T_ASSERT(memcmp(a, b, sizeof(a)) == 0);
	/* summary */
	struct tq_xf_summary s;
	tq_xf_summarize(x1, &s);
	T_EQ(s.calibrated, 1);
	T_EQ(s.calib_tokens, 100);
	T_ASSERT(s.k_mean_norm > 0.3f * s.k_rms && s.scale_min < 1 && s.scale_max > 1);
	free(buf);
	tq_xf_free(x1);
	tq_xf_free(x2);
	tq_xf_free(x3);
}

/* K unshrink: through tq4 (tq3) keys the logits' regression slope on the
 * exact ones is tq_codec_shrink (a norm-corrected codec shrinks them);
 * with the queries scaled by the transform it is 1. */
static void test_unshrink(void)
{
	static const enum tq_codec_id ids[] = { TQ_CODEC_TQ4, TQ_CODEC_TQ3 };
	enum { NV = 4000 };
	static float k[NV * D], kd[NV * D];
	float q[NQH * D], xq[NQH * D];

	rs = t_seed() ^ 0x1234;
	for (size_t i = 0; i < (size_t)NV * D; i++)
		k[i] = gauss();
	for (size_t i = 0; i < (size_t)NQH * D; i++)
		q[i] = gauss();
	for (size_t c = 0; c < 2; c++) {
		struct tq_codec_params p = { .id = ids[c], .dim = D, .seed = 5 };
		tq_codec *kc;
		tq_xf *xf;
		tq_error err;
		uint8_t *blk;
		T_EQ(tq_codec_new(&kc, NULL, &p, &err), 0);
		T_ASSERT((blk = malloc(tq_codec_block_bytes(kc) * NV)) != NULL);
		T_EQ(tq_encode(kc, k, TQ_DTYPE_F32, NV, blk, &err), 0);
		T_EQ(tq_decode(kc, blk, NV, kd), 0);
		T_EQ(tq_xf_new(&xf, TQ_XF_K_UNSHRINK, NKV, NQH, D, kc, NULL), 0);
		T_EQ(tq_xf_calibrate(xf, k, k, NULL, 1, 0, TQ_DTYPE_F32), 0);
		T_EQ(tq_xf_touches_queries(xf), 1);
		tq_xf_queries(xf, q, TQ_DTYPE_F32, 1, xq);
		double sxy = 0, sxx = 0, sxy2 = 0;
		for (int t = 0; t < NV; t++)
			for (int h = 0; h < NQH; h++) {
				double a = 0, b = 0, b2 = 0;
				for (int j = 0; j < D; j++) {
					a += (double)q[h * D + j] * k[(size_t)t * D + j];
					b += (double)q[h * D + j] * kd[(size_t)t * D + j];
					b2 += (double)xq[h * D + j] * kd[(size_t)t * D + j];
				}
				sxy += a * b;
				sxy2 += a * b2;
				sxx += a * a;
			}
		double shrink = tq_codec_shrink(kc);
		fprintf(stderr, "  %s: shrink %.5f predicted, slope %.5f measured; with unshrink %.5f\n",
			tq_codec_name(ids[c]), shrink, sxy / sxx, sxy2 / sxx);
		T_NEAR(sxy / sxx, shrink, 0.004);
		T_NEAR(sxy2 / sxx, 1.0, 0.004);
		T_ASSERT(shrink < 0.999);
		tq_xf_free(xf);
		tq_codec_free(kc);
		free(blk);
	}
}

/* K sink centring: the first token's key becomes the zero vector (its
 * block encodes exactly), and the centre survives the stored bytes. */
static void test_sink(void)
{
	static float xk[4 * NKV * D], b[4 * NKV * D];
	tq_xf *x1, *x2;
	tq_error err;
	uint8_t buf[32 + 2 * NKV * D * 4];

	rs = t_seed() ^ 0x5151;
	make_inputs(K, V, Q, N, NQ);
	T_EQ(tq_xf_new(&x1, TQ_XF_K_SINK | TQ_XF_K_EQ_QK, NKV, NQH, D, NULL, NULL), 0);
	T_EQ(tq_xf_new(&x2, TQ_XF_K_SINK | TQ_XF_K_EQ_QK, NKV, NQH, D, NULL, NULL), 0);
	T_EQ(tq_xf_calibrate(x1, K, V, Q, 64, NQ, TQ_DTYPE_F32), 0);
	T_EQ(tq_xf_applied(x1), TQ_XF_K_SINK | TQ_XF_K_EQ_QK);
	tq_xf_keys(x1, K, TQ_DTYPE_F32, 4, xk);
	for (int i = 0; i < NKV * D; i++)
		T_EQ(xk[i], 0.0f);
	T_ASSERT(xk[NKV * D + 3] != 0.0f);
	T_EQ(tq_xf_blob_bytes(x1), sizeof(buf));
	tq_xf_blob_write(x1, buf);
	T_EQ(tq_xf_blob_read(x2, buf, sizeof(buf), &err), 0);
	tq_xf_keys(x2, K, TQ_DTYPE_F32, 4, b);
	T_ASSERT(memcmp(xk, b, sizeof(b)) == 0);
	tq_xf_free(x1);
	tq_xf_free(x2);
}

/* K order: with a tq4o K codec the keys' and queries' channels are put in
 * the same order (scores unchanged), the loud ones first where the codec
 * has 5 bits; the output through tq4o keys is then closer to exact than
 * without the order and than through tq4 keys at the same bytes.  Not
 * applied with a codec without an outlier half.  The order is stored and
 * checked (a repeated channel is refused). */
static void test_k_order(void)
{
	static float ref[NQ * NQH * D], o_ord[NQ * NQH * D], o_none[NQ * NQH * D], o_tq4[NQ * NQH * D];
	static float a[16 * NKV * D], b[16 * NKV * D], qa[2 * NQH * D], qb[2 * NQH * D];
	const uint32_t base = TQ_XF_K_CENTER | TQ_XF_K_EQ_QK | TQ_XF_K_UNSHRINK;
	struct tq_codec_params pk = { .id = TQ_CODEC_TQ4O, .dim = D, .seed = 11 };
	struct tq_codec_params p4 = { .id = TQ_CODEC_TQ4, .dim = D, .seed = 11 };
	tq_codec *k4o, *k4;
	tq_xf *xo, *xn, *x4, *x2;
	tq_error err;

	rs = t_seed() ^ 0x0d;
	make_inputs(K, V, Q, N, NQ);
	/* 4 channels loud in keys and queries alike: real keys' outliers */
	for (uint32_t t = 0; t < N; t++)
		for (uint32_t i = 0; i < NKV * D; i++)
			if (i % D % 16 == 6)
				K[(size_t)t * NKV * D + i] *= 6.0f;
	for (uint32_t i = 0; i < NQ * NQH * D; i++)
		Q[i] *= i % D % 16 == 6 ? 12.0f : 3.0f;
	T_ASSERT(tq_codec_new(&k4o, NULL, &pk, &err) == 0 && tq_codec_new(&k4, NULL, &p4, &err) == 0);
	T_EQ(tq_xf_new(&xo, base | TQ_XF_K_ORDER, NKV, NQH, D, k4o, NULL), 0);
	T_EQ(tq_xf_new(&xn, base, NKV, NQH, D, k4o, NULL), 0);
	T_EQ(tq_xf_new(&x4, base | TQ_XF_K_ORDER, NKV, NQH, D, k4, NULL), 0);
	T_EQ(tq_xf_calibrate(xo, K, V, Q, 64, NQ, TQ_DTYPE_F32), 0);
	T_EQ(tq_xf_calibrate(xn, K, V, Q, 64, NQ, TQ_DTYPE_F32), 0);
	T_EQ(tq_xf_calibrate(x4, K, V, Q, 64, NQ, TQ_DTYPE_F32), 0);
	T_EQ(tq_xf_applied(xo), base | TQ_XF_K_ORDER);
	T_EQ(tq_xf_applied(x4), base);                 /* tq4: nothing to order for */
	T_EQ(tq_xf_touches_queries(xo), 1);

	/* exact: the scores are q·(k - μ) over the per-half shrink factors,
	 * whatever the order */
	tq_xf_keys(xo, K, TQ_DTYPE_F32, 16, a);
	tq_xf_queries(xo, Q, TQ_DTYPE_F32, 2, qa);
	tq_xf_keys(xn, K, TQ_DTYPE_F32, 16, b);
	tq_xf_queries(xn, Q, TQ_DTYPE_F32, 2, qb);
	int loud_first = 0;
	for (uint32_t h = 0; h < NQH; h++)
		for (uint32_t t = 0; t < 16; t++) {
			const uint32_t g = h / (NQH / NKV);
			double so = 0, sn = 0, mag = 0;
			for (uint32_t j = 0; j < D; j++) {
				/* undo the per-half gain: compare the plain products */
				double ga = 1.0 / tq_codec_shrink_at(k4o, (int)j);
				so += qa[h * D + j] / ga * a[(t * NKV + g) * D + j];
				sn += qb[h * D + j] / ga * b[(t * NKV + g) * D + j];
				mag += fabs(qb[h * D + j] * b[(t * NKV + g) * D + j]);
			}
			if (!(fabs(so - sn) <= 1e-5 * mag))
				T_FAIL("head %u token %u: score %g with the order, %g without", h, t, so, sn);
		}
	/* the loud channels come first: find where each channel of the
	 * unordered row went (the values of a row are distinct) */
	for (uint32_t g = 0; g < NKV; g++)
		for (uint32_t c = 6; c < D; c += 16) {
			uint32_t j = 0;
			while (j < D && a[(5 * NKV + g) * D + j] != b[(5 * NKV + g) * D + c])
				j++;
			loud_first += j < D / 2;
		}
	T_EQ(loud_first, NKV * D / 16);

	/* through the codec: closer to exact */
	T_EQ(attend(TQ_CODEC_F32, TQ_CODEC_F32, NULL, K, V, Q, N, NQ, ref), 0);
	T_EQ(attend(TQ_CODEC_TQ4O, TQ_CODEC_F32, xo, K, V, Q, N, NQ, o_ord), 0);
	T_EQ(attend(TQ_CODEC_TQ4O, TQ_CODEC_F32, xn, K, V, Q, N, NQ, o_none), 0);
	T_EQ(attend(TQ_CODEC_TQ4, TQ_CODEC_F32, x4, K, V, Q, N, NQ, o_tq4), 0);
	double eo = rel_err(o_ord, ref, (size_t)NQ * NQH * D), en = rel_err(o_none, ref, (size_t)NQ * NQH * D),
	       e4 = rel_err(o_tq4, ref, (size_t)NQ * NQH * D);
	fprintf(stderr, "  tq4o keys: output error %.4f with k-order, %.4f without; tq4 keys %.4f\n", eo, en, e4);
	T_ASSERT(eo < 0.7 * en && eo < 0.9 * e4);

	/* stored and read back; a repeated channel refused */
	size_t n = tq_xf_blob_bytes(xo);
	uint8_t *buf = malloc(n);
	T_ASSERT(buf && n == 32 + 3 * NKV * D * 4);     /* K centre, K scales, the order */
	tq_xf_blob_write(xo, buf);
	T_EQ(tq_xf_new(&x2, base | TQ_XF_K_ORDER, NKV, NQH, D, k4o, NULL), 0);
	T_EQ(tq_xf_blob_read(x2, buf, n, &err), 0);
	T_EQ(tq_xf_applied(x2), base | TQ_XF_K_ORDER);
	tq_xf_keys(x2, K, TQ_DTYPE_F32, 16, b);
	T_ASSERT(memcmp(a, b, sizeof(a)) == 0);
	tq_xf_queries(x2, Q, TQ_DTYPE_F32, 2, qb);
	T_ASSERT(memcmp(qa, qb, sizeof(qa)) == 0);
	memcpy(buf + n - 4, buf + n - 8, 4);             /* head 1's last two channels the same */
	T_EQ(tq_xf_blob_read(x2, buf, n, &err), -EBADMSG);
	T_ASSERT(strstr(err.msg, "not a permutation"));
	tq_xf_blob_write(xo, buf);
	memcpy(buf + n - 4, &(uint32_t){ D }, 4);        /* a channel out of range */
	T_EQ(tq_xf_blob_read(x2, buf, n, &err), -EBADMSG);
	T_EQ(tq_xf_blob_read(xn, buf, n, &err), -EBADMSG); /* k-order not in xn's mode */
	tq_xf_keys(x2, K, TQ_DTYPE_F32, 16, b);           /* x2 kept the good state */
	T_ASSERT(memcmp(a, b, sizeof(a)) == 0);
	free(buf);
	tq_xf_free(xo);
	tq_xf_free(xn);
	tq_xf_free(x4);
	tq_xf_free(x2);
	tq_codec_free(k4o);
	tq_codec_free(k4);
}

int main(void)
{
	T_RUN(test_mode_names);
	T_RUN(test_exact_in_attention);
	T_RUN(test_default_helps_tq4_keys);
	T_RUN(test_v_eq_helps_tq4_values);
	T_RUN(test_calibration_rules);
	T_RUN(test_blob);
	T_RUN(test_unshrink);
	T_RUN(test_sink);
	T_RUN(test_k_order);
	return t_done();
}
