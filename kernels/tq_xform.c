/* tq_xform.c — see tq_xform.h. */
#include "tq_xform.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XF_MAGIC   0x46585154u  /* "TQXF" */
#define XF_VERSION 1u
#define XF_HDR     32u

struct tq_xf {
	uint32_t mode, applied, n_kv, n_q, dim;
	uint32_t calibrated, calib_tokens;
	float k_rms, v_rms;       /* for the summary */
	float k_gain;             /* K unshrink: 1 / tq_codec_shrink(K codec) */
	uint32_t k_half;          /* the K codec's first half (tq*o), else 0 */
	float k_gain_b;           /* K unshrink past k_half: the second half's */
	uint32_t *k_perm;         /* K order: [n_kv][dim], position j holds channel k_perm[j] */
	float *row;               /* [dim] scratch (K order's permutation)      */
	float *k_mean;            /* [n_kv][dim] */
	float *k_scale;           /* [n_kv][dim] */
	float *v_mean;            /* [n_kv][dim] */
	float *v_scale;           /* [n_kv][dim] */
};

static const struct {
	uint32_t bit;
	const char *name;
} xf_names[] = {
	{ TQ_XF_K_CENTER, "k-center" },
	{ TQ_XF_K_SINK, "k-sink" },
	{ TQ_XF_V_CENTER, "v-center" },
	{ TQ_XF_V_EQ, "v-eq" },
	{ TQ_XF_K_EQ_QK, "k-eq-qk" },
	{ TQ_XF_K_EQ_K, "k-eq-k" },
	{ TQ_XF_K_UNSHRINK, "k-unshrink" },
	{ TQ_XF_K_ORDER, "k-order" },
};

int tq_xf_mode_check(uint32_t mode, tq_error *err)
{
	if (mode & ~TQ_XF_MASK) {
		if (err)
			snprintf(err->msg, sizeof(err->msg), "kv transform 0x%x: unknown bits 0x%x", mode,
				 mode & ~TQ_XF_MASK);
		return -EINVAL;
	}
	if ((mode & TQ_XF_K_CENTER) && (mode & TQ_XF_K_SINK)) {
		if (err)
			snprintf(err->msg, sizeof(err->msg), "kv transform: k-center and k-sink exclude each other");
		return -EINVAL;
	}
	if ((mode & TQ_XF_K_EQ_QK) && (mode & TQ_XF_K_EQ_K)) {
		if (err)
			snprintf(err->msg, sizeof(err->msg), "kv transform: k-eq-qk and k-eq-k exclude each other");
		return -EINVAL;
	}
	return 0;
}

const char *tq_xf_mode_str(uint32_t mode, char *buf, size_t len)
{
	size_t o = 0;

	if (!len)
		return buf;
	buf[0] = 0;
	for (size_t i = 0; i < sizeof(xf_names) / sizeof(xf_names[0]); i++) {
		if (!(mode & xf_names[i].bit))
			continue;
		int w = snprintf(buf + o, len - o, "%s%s", o ? "+" : "", xf_names[i].name);
		if (w < 0 || (size_t)w >= len - o)
			return buf;
		o += (size_t)w;
	}
	if (mode & ~TQ_XF_MASK)
		snprintf(buf + o, len - o, "%s0x%x", o ? "+" : "", mode & ~TQ_XF_MASK);
	else if (!o)
		snprintf(buf, len, "none");
	return buf;
}

int tq_xf_mode_parse(const char *s, uint32_t *mode)
{
	uint32_t m = 0;
	char word[32];

	if (!s)
		return -EINVAL;
	while (*s) {
		size_t n = strcspn(s, ",+ ");
		if (n) {
			size_t i;
			if (n >= sizeof(word))
				return -EINVAL;
			memcpy(word, s, n);
			word[n] = 0;
			if (!strcmp(word, "none")) {
				/* nothing */
			} else if (!strcmp(word, "default")) {
				m |= TQ_XF_DEFAULT;
			} else {
				for (i = 0; i < sizeof(xf_names) / sizeof(xf_names[0]); i++)
					if (!strcmp(word, xf_names[i].name))
						break;
				if (i == sizeof(xf_names) / sizeof(xf_names[0]))
					return -EINVAL;
				m |= xf_names[i].bit;
			}
		}
		s += n;
		if (*s)
			s++;
	}
	if (tq_xf_mode_check(m, NULL) < 0)
		return -EINVAL;
	*mode = m;
	return 0;
}

int tq_xf_new(tq_xf **out, uint32_t mode, uint32_t n_kv_heads, uint32_t n_q_heads, uint32_t dim,
	      const tq_codec *k_codec, tq_error *err)
{
	tq_xf *xf;
	size_t n;
	int e;

	*out = NULL;
	if ((e = tq_xf_mode_check(mode, err)) < 0)
		return e;
	if (!n_kv_heads || !dim || !n_q_heads || n_q_heads % n_kv_heads || n_kv_heads > 65536 || dim > 4096) {
		if (err)
			snprintf(err->msg, sizeof(err->msg), "kv transform: bad shape (%u kv heads, %u q heads, dim %u)",
				 n_kv_heads, n_q_heads, dim);
		return -EINVAL;
	}
	n = (size_t)n_kv_heads * dim;
	if (!(xf = calloc(1, sizeof(*xf))) || !(xf->k_mean = calloc(4 * n + dim, sizeof(float))) ||
	    !(xf->k_perm = calloc(n, sizeof(uint32_t)))) {
		if (xf)
			free(xf->k_mean);
		free(xf);
		if (err)
			snprintf(err->msg, sizeof(err->msg), "kv transform: out of memory");
		return -ENOMEM;
	}
	xf->k_scale = xf->k_mean + n;
	xf->v_mean = xf->k_mean + 2 * n;
	xf->v_scale = xf->k_mean + 3 * n;
	xf->row = xf->k_mean + 4 * n;
	xf->mode = mode;
	xf->n_kv = n_kv_heads;
	xf->n_q = n_q_heads;
	xf->dim = dim;
	tq_xf_set_k_codec(xf, k_codec);
	tq_xf_reset(xf);
	*out = xf;
	return 0;
}

void tq_xf_free(tq_xf *xf)
{
	if (!xf)
		return;
	free(xf->k_mean);
	free(xf->k_perm);
	free(xf);
}

void tq_xf_set_k_codec(tq_xf *xf, const tq_codec *k_codec)
{
	xf->k_gain = k_codec ? (float)(1.0 / tq_codec_shrink_at(k_codec, 0)) : 1.0f;
	xf->k_half = k_codec && tq_codec_parts(k_codec) == 2 && (uint32_t)tq_codec_dim(k_codec) == xf->dim
		     ? xf->dim / 2 : 0;
	xf->k_gain_b = xf->k_half ? (float)(1.0 / tq_codec_shrink_at(k_codec, (int)xf->dim - 1)) : xf->k_gain;
}

int tq_xf_calibrated(const tq_xf *xf) { return (int)xf->calibrated; }
uint32_t tq_xf_applied(const tq_xf *xf) { return xf->calibrated ? xf->applied : 0; }
uint32_t tq_xf_calib_tokens(const tq_xf *xf) { return xf->calib_tokens; }

void tq_xf_reset(tq_xf *xf)
{
	size_t n = (size_t)xf->n_kv * xf->dim;

	memset(xf->k_mean, 0, n * sizeof(float));
	memset(xf->v_mean, 0, n * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		xf->k_scale[i] = xf->v_scale[i] = 1.0f;
		xf->k_perm[i] = (uint32_t)(i % xf->dim);
	}
	xf->applied = 0;
	xf->calibrated = 0;
	xf->calib_tokens = 0;
	xf->k_rms = xf->v_rms = 0;
}

static inline float load1(const void *p, enum tq_dtype dtype, size_t i)
{
	if (dtype == TQ_DTYPE_F32)
		return ((const float *)p)[i];
	if (dtype == TQ_DTYPE_F16)
		return tq_f16_to_f32(((const uint16_t *)p)[i]);
	return tq_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* A centre within ±TQ_XF_MEAN_MAX (tq_xform.h) */
static float clamp_mean(double m)
{
	return (float)(m > TQ_XF_MEAN_MAX ? TQ_XF_MEAN_MAX : m < -TQ_XF_MEAN_MAX ? -TQ_XF_MEAN_MAX : m);
}

/* Channel means of rows [n][n_kv][dim] into mean[n_kv][dim] (double sums,
 * clamped); returns the rms of the rows' norms (at most FLT_MAX). */
static float rows_mean(const void *x, enum tq_dtype dtype, uint32_t n, uint32_t n_kv, uint32_t dim,
		       float *mean, double *acc)
{
	size_t w = (size_t)n_kv * dim;
	double sq = 0;

	memset(acc, 0, w * sizeof(double));
	for (uint32_t t = 0; t < n; t++)
		for (size_t i = 0; i < w; i++) {
			double a = load1(x, dtype, (size_t)t * w + i);
			acc[i] += a;
			sq += a * a;
		}
	for (size_t i = 0; i < w; i++)
		mean[i] = clamp_mean(acc[i] / n);
	/* finite rows' norms can pass float's range: the stored rms must stay
	 * finite, or the statistics would not read back (tq_xf_blob_read) */
	const double rms = sqrt(sq / ((double)n * n_kv));
	return (float)(rms < FLT_MAX ? rms : FLT_MAX);
}

/* Channel scales s[0..d) (0 where a channel had no signal) to geometric
 * mean 1 over the channels that had one (lsum: their logs, nl: how many);
 * the others get 1; all clamped to the allowed range. */
static void scales_normalize(float *s, uint32_t d, double lsum, uint32_t nl)
{
	double gm = nl ? exp(lsum / nl) : 1;

	for (uint32_t c = 0; c < d; c++) {
		float x = s[c] > 0 ? (float)(s[c] / gm) : 1.0f;
		if (x > TQ_XF_SCALE_MAX)
			x = TQ_XF_SCALE_MAX;
		if (x < 1.0f / TQ_XF_SCALE_MAX)
			x = 1.0f / TQ_XF_SCALE_MAX;
		s[c] = x;
	}
}

/* perm[0..d) = the channels by importance, descending (ties: the lower
 * channel first, so the order is deterministic); insertion sort: d <= 512,
 * once per calibration. */
static void order_channels(const double *imp, uint32_t d, uint32_t *perm)
{
	for (uint32_t j = 0; j < d; j++) {
		uint32_t c = j, i = j;
		double v = isfinite(imp[c]) ? imp[c] : 0;
		while (i > 0) {
			double u = isfinite(imp[perm[i - 1]]) ? imp[perm[i - 1]] : 0;
			if (u >= v)
				break;
			perm[i] = perm[i - 1];
			i--;
		}
		perm[i] = c;
	}
}

int tq_xf_calibrate(tq_xf *xf, const void *k, const void *v, const void *q, uint32_t n, uint32_t n_q,
		    enum tq_dtype dtype)
{
	const uint32_t d = xf->dim, G = xf->n_q / xf->n_kv;
	const size_t w = (size_t)xf->n_kv * d;
	double *acc;

	if (xf->calibrated)
		return -EALREADY;
	if (n > TQ_XF_CALIB_MAX)
		n = TQ_XF_CALIB_MAX;
	if (n_q > TQ_XF_CALIB_MAX)
		n_q = TQ_XF_CALIB_MAX;
	xf->calibrated = 1;
	xf->calib_tokens = n;
	xf->applied = xf->mode & TQ_XF_K_UNSHRINK;   /* needs no statistics */
	if (n < TQ_XF_MIN_TOKENS || !(xf->mode & ~(uint32_t)TQ_XF_K_UNSHRINK))
		return 0;
	if (!(acc = malloc(2 * w * sizeof(double)))) {
		xf->calibrated = 0;
		return -ENOMEM;
	}
	xf->k_rms = rows_mean(k, dtype, n, xf->n_kv, d, xf->k_mean, acc);
	xf->v_rms = rows_mean(v, dtype, n, xf->n_kv, d, xf->v_mean, acc);
	if (xf->mode & TQ_XF_K_SINK) {
		/* the centre is the first token's key: that key (the attention
		 * sink's, where a sequence starts with one) encodes exactly */
		for (size_t i = 0; i < w; i++)
			xf->k_mean[i] = clamp_mean(load1(k, dtype, i));
		xf->applied |= TQ_XF_K_SINK;
	} else if (xf->mode & TQ_XF_K_CENTER) {
		xf->applied |= TQ_XF_K_CENTER;
	} else {
		memset(xf->k_mean, 0, w * sizeof(float));
	}
	if (xf->mode & TQ_XF_V_CENTER)
		xf->applied |= TQ_XF_V_CENTER;
	else
		memset(xf->v_mean, 0, w * sizeof(float));

	uint32_t eq = xf->mode & (TQ_XF_K_EQ_QK | TQ_XF_K_EQ_K);
	const int order = (xf->mode & TQ_XF_K_ORDER) && xf->k_half;
	const int have_q = q && n_q;
	if (eq == TQ_XF_K_EQ_QK && !have_q)
		eq = 0;                  /* no queries: nothing to balance against */
	if (eq || order) {
		double *kss = acc, *qss = acc + w;
		memset(acc, 0, 2 * w * sizeof(double));
		/* second moments of the (centered) keys, and of the group's queries */
		for (uint32_t t = 0; t < n; t++)
			for (size_t i = 0; i < w; i++) {
				double a = (double)load1(k, dtype, (size_t)t * w + i) - xf->k_mean[i];
				kss[i] += a * a;
			}
		if (eq == TQ_XF_K_EQ_QK || (order && have_q))
			for (uint32_t t = 0; t < n_q; t++)
				for (uint32_t h = 0; h < xf->n_q; h++)
					for (uint32_t c = 0; c < d; c++) {
						double a = load1(q, dtype, ((size_t)t * xf->n_q + h) * d + c);
						qss[(size_t)(h / G) * d + c] += a * a;
					}
		for (uint32_t h = 0; eq && h < xf->n_kv; h++) {
			float *s = xf->k_scale + (size_t)h * d;
			double lsum = 0;
			uint32_t nl = 0;
			for (uint32_t c = 0; c < d; c++) {
				size_t i = (size_t)h * d + c;
				double r = sqrt(kss[i] / n);
				if (eq == TQ_XF_K_EQ_QK)
					r = qss[i] > 0 ? r / sqrt(qss[i] / ((double)n_q * G)) : 0;
				/* s_c = sqrt(r); channels with no signal get the mean */
				s[c] = r > 1e-30 && isfinite(r) ? (float)sqrt(r) : 0;
				if (s[c] > 0) {
					lsum += log(s[c]);
					nl++;
				}
			}
			scales_normalize(s, d, lsum, nl);
		}
		xf->applied |= eq;
		if (order) {
			/* importance E[k'_c²] E[q'_c²] = E[(k_c - μ_c)²] E[q_c²]: the
			 * equalization's s_c cancels */
			for (size_t i = 0; i < w; i++)
				kss[i] = have_q ? kss[i] * qss[i] : kss[i];
			for (uint32_t h = 0; h < xf->n_kv; h++)
				order_channels(kss + (size_t)h * d, d, xf->k_perm + (size_t)h * d);
			xf->applied |= TQ_XF_K_ORDER;
		}
	}
	if (xf->mode & TQ_XF_V_EQ) {
		double *vss = acc;
		memset(acc, 0, w * sizeof(double));
		for (uint32_t t = 0; t < n; t++)
			for (size_t i = 0; i < w; i++) {
				double a = (double)load1(v, dtype, (size_t)t * w + i) - xf->v_mean[i];
				vss[i] += a * a;
			}
		for (uint32_t h = 0; h < xf->n_kv; h++) {
			float *s = xf->v_scale + (size_t)h * d;
			double lsum = 0;
			uint32_t nl = 0;
			for (uint32_t c = 0; c < d; c++) {
				double r = sqrt(vss[(size_t)h * d + c] / n);
				s[c] = r > 1e-30 && isfinite(r) ? (float)sqrt(r) : 0;
				if (s[c] > 0) {
					lsum += log(s[c]);
					nl++;
				}
			}
			scales_normalize(s, d, lsum, nl);
		}
		xf->applied |= TQ_XF_V_EQ;
	}
	free(acc);
	return 0;
}

/* x[j] = x[perm[j]] in place, through the transform's scratch row. */
static void permute_row(const tq_xf *xf, float *x, const uint32_t *perm)
{
	memcpy(xf->row, x, sizeof(float) * xf->dim);
	for (uint32_t j = 0; j < xf->dim; j++)
		x[j] = xf->row[perm[j]];
}

void tq_xf_keys(const tq_xf *xf, const void *k, enum tq_dtype dtype, uint32_t n, float *out)
{
	const size_t w = (size_t)xf->n_kv * xf->dim;
	const uint32_t a = tq_xf_applied(xf);

	const size_t es = tq_dtype_size(dtype);

	/* a row at a time, each part a loop of its own (the same operations
	 * per element as one loop: the same bits, vectorized) */
	for (uint32_t t = 0; t < n; t++) {
		float *o = out + (size_t)t * w;
		tq_to_f32((const uint8_t *)k + (size_t)t * w * es, dtype, w, o);
		if (a & (TQ_XF_K_CENTER | TQ_XF_K_SINK))
			for (size_t i = 0; i < w; i++)
				o[i] -= xf->k_mean[i];
		if (a & (TQ_XF_K_EQ_QK | TQ_XF_K_EQ_K))
			for (size_t i = 0; i < w; i++)
				o[i] /= xf->k_scale[i];
		if (a & TQ_XF_K_ORDER)
			for (uint32_t h = 0; h < xf->n_kv; h++)
				permute_row(xf, out + (size_t)t * w + (size_t)h * xf->dim,
					    xf->k_perm + (size_t)h * xf->dim);
	}
}

void tq_xf_values(const tq_xf *xf, const void *v, enum tq_dtype dtype, uint32_t n, float *out)
{
	const size_t w = (size_t)xf->n_kv * xf->dim;
	const uint32_t a = tq_xf_applied(xf);

	const size_t es = tq_dtype_size(dtype);

	for (uint32_t t = 0; t < n; t++) {
		float *o = out + (size_t)t * w;
		tq_to_f32((const uint8_t *)v + (size_t)t * w * es, dtype, w, o);
		if (a & TQ_XF_V_CENTER)
			for (size_t i = 0; i < w; i++)
				o[i] -= xf->v_mean[i];
		if (a & TQ_XF_V_EQ)
			for (size_t i = 0; i < w; i++)
				o[i] /= xf->v_scale[i];
	}
}

void tq_xf_queries(const tq_xf *xf, const void *q, enum tq_dtype dtype, uint32_t n_q, float *out)
{
	const uint32_t d = xf->dim, G = xf->n_q / xf->n_kv;
	const size_t w = (size_t)xf->n_q * d;
	const uint32_t a = tq_xf_applied(xf);
	const int scaled = (a & (TQ_XF_K_EQ_QK | TQ_XF_K_EQ_K)) != 0;
	const int unshrink = (a & TQ_XF_K_UNSHRINK) != 0;
	/* K unshrink's factor at codec position j: each half of a tq*o its own */
	const uint32_t half = xf->k_half ? xf->k_half : d;
	const float ga = xf->k_gain, gb = xf->k_gain_b;

	tq_to_f32(q, dtype, (size_t)n_q * w, out);
	for (uint32_t t = 0; t < n_q; t++)
		for (uint32_t h = 0; h < xf->n_q; h++) {
			const float *s = xf->k_scale + (size_t)(h / G) * d;
			float *o = out + (size_t)t * w + (size_t)h * d;
			if (scaled)
				for (uint32_t c = 0; c < d; c++)
					o[c] *= s[c];
			if (a & TQ_XF_K_ORDER)
				permute_row(xf, o, xf->k_perm + (size_t)(h / G) * d);
			if (unshrink) { /* by codec position: after the order */
				for (uint32_t j = 0; j < half; j++)
					o[j] *= ga;
				for (uint32_t j = half; j < d; j++)
					o[j] *= gb;
			}
		}
}

void tq_xf_output(const tq_xf *xf, float *out, uint32_t n_q)
{
	const uint32_t d = xf->dim, G = xf->n_q / xf->n_kv;

	const uint32_t a = tq_xf_applied(xf);

	if (!(a & (TQ_XF_V_CENTER | TQ_XF_V_EQ)))
		return;
	for (uint32_t t = 0; t < n_q; t++)
		for (uint32_t h = 0; h < xf->n_q; h++) {
			const float *m = xf->v_mean + (size_t)(h / G) * d;
			const float *s = xf->v_scale + (size_t)(h / G) * d;
			float *o = out + ((size_t)t * xf->n_q + h) * d;
			/* (v_mean is 0 and v_scale 1 where the part is not applied) */
			for (uint32_t c = 0; c < d; c++)
				o[c] = o[c] * s[c] + m[c];
		}
}

int tq_xf_touches_queries(const tq_xf *xf)
{
	return (tq_xf_applied(xf) & (TQ_XF_K_EQ_QK | TQ_XF_K_EQ_K | TQ_XF_K_ORDER)) != 0 ||
	       ((tq_xf_applied(xf) & TQ_XF_K_UNSHRINK) && (xf->k_gain != 1.0f || xf->k_gain_b != 1.0f));
}

int tq_xf_touches_output(const tq_xf *xf)
{
	return (tq_xf_applied(xf) & (TQ_XF_V_CENTER | TQ_XF_V_EQ)) != 0;
}

/* ---- bytes ------------------------------------------------------------------
 * header (XF_HDR bytes, little-endian u32): magic, version, applied,
 * calib_tokens, n_kv, dim, k_rms (f32 bits), v_rms (f32 bits); then
 * k_mean (the K centre) if K_CENTER or K_SINK, k_scale if a K equalization,
 * v_mean if V_CENTER, v_scale if V_EQ, each [n_kv][dim] f32; then k_perm if
 * K_ORDER, [n_kv][dim] u32 (each head's a permutation of 0..dim-1).  An uncalibrated transform has no bytes (0). */

static void put32(uint8_t *p, uint32_t x)
{
	p[0] = (uint8_t)x;
	p[1] = (uint8_t)(x >> 8);
	p[2] = (uint8_t)(x >> 16);
	p[3] = (uint8_t)(x >> 24);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* The stored arrays, in this order, each present when its part is applied */
#define XF_PARTS 4
static const uint32_t part_bits[XF_PARTS] = {
	TQ_XF_K_CENTER | TQ_XF_K_SINK, TQ_XF_K_EQ_QK | TQ_XF_K_EQ_K, TQ_XF_V_CENTER, TQ_XF_V_EQ,
};

static uint32_t parts(uint32_t applied)
{
	return !!(applied & (TQ_XF_K_CENTER | TQ_XF_K_SINK)) + !!(applied & (TQ_XF_K_EQ_QK | TQ_XF_K_EQ_K)) +
	       !!(applied & TQ_XF_V_CENTER) + !!(applied & TQ_XF_V_EQ);
}

static size_t blob_len(uint32_t applied, size_t w)
{
	return XF_HDR + ((size_t)parts(applied) + !!(applied & TQ_XF_K_ORDER)) * w * 4;
}

size_t tq_xf_blob_bytes(const tq_xf *xf)
{
	if (!xf->calibrated)
		return 0;
	return blob_len(xf->applied, (size_t)xf->n_kv * xf->dim);
}

void tq_xf_blob_write(const tq_xf *xf, uint8_t *buf)
{
	const size_t w = (size_t)xf->n_kv * xf->dim;
	const float *arr[XF_PARTS] = { xf->k_mean, xf->k_scale, xf->v_mean, xf->v_scale };
	uint8_t *p = buf + XF_HDR;

	if (!xf->calibrated)
		return;
	memset(buf, 0, XF_HDR);
	put32(buf, XF_MAGIC);
	put32(buf + 4, XF_VERSION);
	put32(buf + 8, xf->applied);
	put32(buf + 12, xf->calib_tokens);
	put32(buf + 16, xf->n_kv);
	put32(buf + 20, xf->dim);
	put32(buf + 24, f2u(xf->k_rms));
	put32(buf + 28, f2u(xf->v_rms));
	for (int a = 0; a < XF_PARTS; a++) {
		if (!(xf->applied & part_bits[a]))
			continue;
		for (size_t i = 0; i < w; i++, p += 4)
			put32(p, f2u(arr[a][i]));
	}
	if (xf->applied & TQ_XF_K_ORDER)
		for (size_t i = 0; i < w; i++, p += 4)
			put32(p, xf->k_perm[i]);
}

#define BAD(...) do { snprintf(err->msg, sizeof(err->msg), __VA_ARGS__); return -EBADMSG; } while (0)

int tq_xf_blob_read(tq_xf *xf, const uint8_t *buf, size_t len, tq_error *err)
{
	const size_t w = (size_t)xf->n_kv * xf->dim;
	float *arr[XF_PARTS] = { xf->k_mean, xf->k_scale, xf->v_mean, xf->v_scale };
	uint32_t applied;
	float k_rms, v_rms;
	const uint8_t *p;

	if (len < XF_HDR)
		BAD("kv transform: %zu bytes, shorter than its header", len);
	if (get32(buf) != XF_MAGIC || get32(buf + 4) != XF_VERSION)
		BAD("kv transform: bad magic or version %u", get32(buf + 4));
	applied = get32(buf + 8);
	if (tq_xf_mode_check(applied, NULL) < 0 || (applied & ~xf->mode))
		BAD("kv transform: parts 0x%x not in the session's mode 0x%x", applied, xf->mode);
	if (get32(buf + 16) != xf->n_kv || get32(buf + 20) != xf->dim)
		BAD("kv transform: shape %u x %u, the session's is %u x %u", get32(buf + 16), get32(buf + 20),
		    xf->n_kv, xf->dim);
	if ((applied & ~(uint32_t)TQ_XF_K_UNSHRINK) && get32(buf + 12) < TQ_XF_MIN_TOKENS)
		BAD("kv transform: calibrated on %u tokens, fewer than %u", get32(buf + 12), TQ_XF_MIN_TOKENS);
	k_rms = u2f(get32(buf + 24));
	v_rms = u2f(get32(buf + 28));
	if (!isfinite(k_rms) || !isfinite(v_rms) || k_rms < 0 || v_rms < 0)
		BAD("kv transform: bad rms");
	if (len != blob_len(applied, w))
		BAD("kv transform: %zu bytes, its parts need %zu", len, blob_len(applied, w));
	/* check everything before changing anything */
	p = buf + XF_HDR;
	for (int a = 0; a < XF_PARTS; a++) {
		if (!(applied & part_bits[a]))
			continue;
		for (size_t i = 0; i < w; i++, p += 4) {
			float x = u2f(get32(p));
			if (!isfinite(x))
				BAD("kv transform: a non-finite statistic");
			if ((a == 1 || a == 3) && !(x >= 1.0f / TQ_XF_SCALE_MAX && x <= TQ_XF_SCALE_MAX))
				BAD("kv transform: channel scale %g out of range", (double)x);
			if ((a == 0 || a == 2) && !(x >= -TQ_XF_MEAN_MAX && x <= TQ_XF_MEAN_MAX))
				BAD("kv transform: channel mean %g beyond +-%g", (double)x, (double)TQ_XF_MEAN_MAX);
		}
	}
	if (applied & TQ_XF_K_ORDER) {
		/* each head's order must be a permutation of its channels */
		uint8_t *seen = calloc(xf->dim, 1);
		if (!seen)
			BAD("kv transform: out of memory");
		for (uint32_t h = 0; h < xf->n_kv; h++) {
			memset(seen, 0, xf->dim);
			for (uint32_t j = 0; j < xf->dim; j++) {
				uint32_t c = get32(p + ((size_t)h * xf->dim + j) * 4);
				if (c >= xf->dim || seen[c]) {
					free(seen);
					BAD("kv transform: head %u's channel order is not a permutation", h);
				}
				seen[c] = 1;
			}
		}
		free(seen);
	}
	tq_xf_reset(xf);
	p = buf + XF_HDR;
	for (int a = 0; a < XF_PARTS; a++) {
		if (!(applied & part_bits[a]))
			continue;
		for (size_t i = 0; i < w; i++, p += 4)
			arr[a][i] = u2f(get32(p));
	}
	if (applied & TQ_XF_K_ORDER)
		for (size_t i = 0; i < w; i++, p += 4)
			xf->k_perm[i] = get32(p);
	xf->applied = applied;
	xf->calib_tokens = get32(buf + 12);
	xf->k_rms = k_rms;
	xf->v_rms = v_rms;
	xf->calibrated = 1;
	return 0;
}

void tq_xf_summarize(const tq_xf *xf, struct tq_xf_summary *out)
{
	const uint32_t d = xf->dim;

	memset(out, 0, sizeof(*out));
	out->calibrated = xf->calibrated;
	out->applied = tq_xf_applied(xf);
	out->calib_tokens = xf->calib_tokens;
	out->k_rms = xf->k_rms;
	out->v_rms = xf->v_rms;
	out->scale_min = out->scale_max = 1.0f;
	for (uint32_t h = 0; h < xf->n_kv; h++) {
		double kk = 0, vv = 0;
		for (uint32_t c = 0; c < d; c++) {
			size_t i = (size_t)h * d + c;
			kk += (double)xf->k_mean[i] * xf->k_mean[i];
			vv += (double)xf->v_mean[i] * xf->v_mean[i];
			if (out->applied & (TQ_XF_K_EQ_QK | TQ_XF_K_EQ_K)) {
				if (xf->k_scale[i] < out->scale_min)
					out->scale_min = xf->k_scale[i];
				if (xf->k_scale[i] > out->scale_max)
					out->scale_max = xf->k_scale[i];
			}
		}
		out->k_mean_norm += (float)(sqrt(kk) / xf->n_kv);
		out->v_mean_norm += (float)(sqrt(vv) / xf->n_kv);
	}
}
