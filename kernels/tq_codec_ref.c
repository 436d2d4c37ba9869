/* tq_codec_ref.c — the scalar reference codec: the oracle for every SIMD path
 * and the fast path on CPUs without one.  Each step is written in the float
 * operation order of the contract in tq_internal.h. */
#include <math.h>

#include "tq_internal.h"

static inline void put_f32(uint8_t *p, float v) { memcpy(p, &v, 4); }
static inline float get_f32(const uint8_t *p) { float v; memcpy(&v, p, 4); return v; }
static inline void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline uint16_t get_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

static int fail_row(tq_error *err, int code, size_t row, const char *what, int elem)
{
	if (err && elem >= 0)
		snprintf(err->msg, sizeof(err->msg), "vector %zu: %s at element %d", row, what, elem);
	else if (err)
		snprintf(err->msg, sizeof(err->msg), "vector %zu: %s", row, what);
	return code;
}

/* Rotated coordinates of x scaled by 1/||x|| (tq) — contract order:
 * HADAMARD: t = fwht(x * sign); u = t * ((1/norm) * inv_sqrt_dim)
 * DENSE:    y = R x;           u = y * (1/norm) */
static void rotate_scaled(const struct tq_rotation *r, const float *x, float inv_norm, float *u)
{
	int d = r->dim;

	if (r->kind == TQ_ROT_HADAMARD) {
		float fac = inv_norm * r->inv_sqrt_dim;
		for (int i = 0; i < d; i++)
			u[i] = x[i] * r->sign[i];
		tq_fwht_ref(u, d);
		for (int i = 0; i < d; i++)
			u[i] = u[i] * fac;
	} else {
		for (int i = 0; i < d; i++) {
			float acc = 0.0f;
			const float *row = r->mat + (size_t)i * d;
			for (int j = 0; j < d; j++)
				acc = acc + row[j] * x[j];
			u[i] = acc;
		}
		for (int i = 0; i < d; i++)
			u[i] = u[i] * inv_norm;
	}
}

/* x = R^T (v * fac) — contract order:
 * HADAMARD: t = fwht(v * (fac * inv_sqrt_dim)); x = t * sign
 * DENSE:    w = v * fac; x = R^T w (accumulated over rows in order) */
static void unrotate_scaled(const struct tq_rotation *r, float *v, float fac, float *x)
{
	int d = r->dim;

	if (r->kind == TQ_ROT_HADAMARD) {
		float f = fac * r->inv_sqrt_dim;
		for (int i = 0; i < d; i++)
			v[i] = v[i] * f;
		tq_fwht_ref(v, d);
		for (int i = 0; i < d; i++)
			x[i] = v[i] * r->sign[i];
	} else {
		for (int i = 0; i < d; i++)
			v[i] = v[i] * fac;
		for (int j = 0; j < d; j++) {
			float acc = 0.0f;
			const float *col = r->mat_t + (size_t)j * d;
			for (int i = 0; i < d; i++)
				acc = acc + col[i] * v[i];
			x[j] = acc;
		}
	}
}

/* One TurboQuant vector of d values (a tq block, or a half of a tq*o one)
 * with rotation r and codebook cb: its planes, and *scale = ||x|| /
 * ||c[idx]|| (the norm correction); a zero vector gives zero planes and a
 * scale of 0.  -ERANGE when the norm overflows. */
static int quantize(const struct tq_rotation *r, const tq_codebook *cb, int d, const float *x, float *scale,
		    uint8_t *planes)
{
	float u[TQ_DIM_MAX], cv[TQ_DIM_MAX];
	uint8_t idx[TQ_DIM_MAX];
	float ss = tq_sumsq16(x, d);

	if (!isfinite(ss))
		return -ERANGE;
	if (ss == 0.0f) {
		*scale = 0.0f;
		memset(planes, 0, TQ_PLANES_BYTES(d, cb->bits));
		return 0;
	}
	float norm = sqrtf(ss);
	rotate_scaled(r, x, 1.0f / norm, u);
	for (int i = 0; i < d; i++) {
		idx[i] = (uint8_t)tq_cb_index(cb, u[i]);
		cv[i] = cb->centroid[idx[i]];
	}
	*scale = norm / sqrtf(tq_sumsq16(cv, d));
	tq_pack_planes(idx, d, cb->bits, planes);
	return 0;
}

/* x = R^T (scale * c[idx]) for the d values of planes. */
static void dequantize(const struct tq_rotation *r, const tq_codebook *cb, int d, const uint8_t *planes,
		       float scale, float *x)
{
	uint8_t idx[TQ_DIM_MAX];
	float v[TQ_DIM_MAX];

	tq_unpack_planes(planes, d, cb->bits, idx);
	for (int i = 0; i < d; i++)
		v[i] = cb->centroid[idx[i]];
	unrotate_scaled(r, v, scale, x);
}

static int encode_tq(const tq_codec *c, const float *x, uint8_t *blk)
{
	float scale;
	int r = quantize(&c->rot, &c->cb, c->dim, x, &scale, blk + TQ_TQ_HEADER_BYTES);

	if (r == 0)
		put_f32(blk, scale);
	return r;
}

static void decode_tq(const tq_codec *c, const uint8_t *blk, float *x)
{
	dequantize(&c->rot, &c->cb, c->dim, blk + TQ_TQ_HEADER_BYTES, get_f32(blk), x);
}

/* tq*o: the two halves (tq_layout.h), each scale rounded to bf16; one that
 * rounds up to inf fails the vector (-ERANGE). */
static int encode_tqo(const tq_codec *c, const float *x, uint8_t *blk)
{
	const int h = c->half;
	uint8_t *pa = blk + TQ_TQO_HEADER_BYTES, *pb = pa + TQ_PLANES_BYTES(h, c->cb.bits);
	float sa, sb;
	int r;

	if ((r = quantize(&c->rot, &c->cb, h, x, &sa, pa)) < 0 ||
	    (r = quantize(&c->rot_b, &c->cb_b, h, x + h, &sb, pb)) < 0)
		return r;
	const uint16_t ha = tq_f32_to_bf16(sa), hb = tq_f32_to_bf16(sb);
	if ((ha & 0x7f80u) == 0x7f80u || (hb & 0x7f80u) == 0x7f80u)
		return -ERANGE;
	put_u16(blk, ha);
	put_u16(blk + 2, hb);
	return 0;
}

static void decode_tqo(const tq_codec *c, const uint8_t *blk, float *x)
{
	const int h = c->half;
	const uint8_t *pa = blk + TQ_TQO_HEADER_BYTES;

	dequantize(&c->rot, &c->cb, h, pa, tq_bf16_to_f32(get_u16(blk)), x);
	dequantize(&c->rot_b, &c->cb_b, h, pa + TQ_PLANES_BYTES(h, c->cb.bits), tq_bf16_to_f32(get_u16(blk + 2)),
		   x + h);
}

static int encode_q8(const tq_codec *c, const float *x, uint8_t *blk)
{
	int d = c->dim;
	float y[TQ_DIM_MAX], amax = 0.0f;
	int8_t *q = (int8_t *)(blk + TQ_Q8_HEADER_BYTES);

	rotate_scaled(&c->rot, x, 1.0f, y);
	for (int i = 0; i < d; i++) {
		if (!isfinite(y[i]))
			return -ERANGE; /* the rotation overflowed */
		amax = fmaxf(amax, fabsf(y[i]));
	}
	if (amax == 0.0f) {
		memset(blk, 0, c->block_bytes);
		return 0;
	}
	float inv = 127.0f / amax, pre = 1.0f;
	if (!isfinite(inv)) {
		/* amax is subnormal: scale y by 2^64 (exact) before the reciprocal */
		pre = 0x1.0p64f;
		inv = 127.0f / (amax * pre);
	}
	for (int i = 0; i < d; i++) {
		float r = rintf((y[i] * pre) * inv);
		q[i] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
	}
	put_f32(blk, amax / 127.0f);
	return 0;
}

static void decode_q8(const tq_codec *c, const uint8_t *blk, float *x)
{
	int d = c->dim;
	float v[TQ_DIM_MAX];
	const int8_t *q = (const int8_t *)(blk + TQ_Q8_HEADER_BYTES);

	for (int i = 0; i < d; i++)
		v[i] = (float)q[i];
	unrotate_scaled(&c->rot, v, get_f32(blk), x);
}

static int encode_q4a(const tq_codec *c, const float *x, uint8_t *blk)
{
	int d = c->dim;
	float mn = x[0], mx = x[0];
	uint8_t q[TQ_DIM_MAX];

	/* plain compares, not fminf/fmaxf: which zero wins (±0) must not
	 * depend on the compiler or libm — it decides the stored min's sign */
	for (int i = 1; i < d; i++) {
		mn = x[i] < mn ? x[i] : mn;
		mx = x[i] > mx ? x[i] : mx;
	}
	float range = mx - mn;
	uint16_t sh = tq_f32_to_f16(range / 15.0f), mh = tq_f32_to_f16(mn);
	if (!isfinite(range) || (sh & 0x7c00u) == 0x7c00u || (mh & 0x7c00u) == 0x7c00u)
		return -ERANGE;
	float s = tq_f16_to_f32(sh), m = tq_f16_to_f32(mh);
	float inv = s > 0.0f ? 1.0f / s : 0.0f;
	for (int i = 0; i < d; i++) {
		float r = rintf((x[i] - m) * inv);
		q[i] = (uint8_t)(r > 15.0f ? 15 : r < 0.0f ? 0 : (int)r);
	}
	put_u16(blk, sh);
	put_u16(blk + 2, mh);
	tq_pack_planes(q, d, 4, blk + TQ_Q4A_HEADER_BYTES);
	return 0;
}

static void decode_q4a(const tq_codec *c, const uint8_t *blk, float *x)
{
	int d = c->dim;
	uint8_t q[TQ_DIM_MAX];
	float s = tq_f16_to_f32(get_u16(blk)), m = tq_f16_to_f32(get_u16(blk + 2));

	tq_unpack_planes(blk + TQ_Q4A_HEADER_BYTES, d, 4, q);
	for (int i = 0; i < d; i++) {
		float t = s * (float)q[i];
		x[i] = m + t;
	}
}

static int encode_f16(const tq_codec *c, const float *x, uint8_t *blk)
{
	for (int i = 0; i < c->dim; i++) {
		uint16_t h = tq_f32_to_f16(x[i]);
		if ((h & 0x7c00u) == 0x7c00u)
			return -ERANGE;
		put_u16(blk + 2 * i, h);
	}
	return 0;
}

static void decode_f16(const tq_codec *c, const uint8_t *blk, float *x)
{
	for (int i = 0; i < c->dim; i++)
		x[i] = tq_f16_to_f32(get_u16(blk + 2 * i));
}

int tq_encode_ref_row(const tq_codec *c, const void *row, enum tq_dtype dtype, size_t v,
		      uint8_t *out, tq_error *err)
{
	float x[TQ_DIM_MAX];
	uint8_t blk[TQ_F32_BLOCK_BYTES(TQ_DIM_MAX)];
	int bad, r;

	if (tq_row_to_f32(row, dtype, c->dim, x, &bad) < 0)
		return fail_row(err, -EINVAL, v, "NaN or Inf", bad);
	/* encode into a local block, so a failing vector writes nothing */
	switch (c->id) {
	case TQ_CODEC_TQ2:
	case TQ_CODEC_TQ3:
	case TQ_CODEC_TQ4: r = encode_tq(c, x, blk); break;
	case TQ_CODEC_TQ3O:
	case TQ_CODEC_TQ4O: r = encode_tqo(c, x, blk); break;
	case TQ_CODEC_Q8: r = encode_q8(c, x, blk); break;
	case TQ_CODEC_Q4A: r = encode_q4a(c, x, blk); break;
	case TQ_CODEC_F16: r = encode_f16(c, x, blk); break;
	case TQ_CODEC_F32: memcpy(blk, x, c->block_bytes); r = 0; break;
	default: return tq_fail(err, "unknown codec id %d", (int)c->id);
	}
	if (r < 0)
		return fail_row(err, r, v, c->id == TQ_CODEC_F16 ?
				"a value is beyond the fp16 range" :
				"values too large to encode (norm or range overflows fp32/fp16)", -1);
	memcpy(out, blk, c->block_bytes);
	return 0;
}

static int ref_encode(const tq_codec *c, const void *src, enum tq_dtype dtype, size_t n, void *dst,
		      tq_error *err)
{
	size_t esz = tq_dtype_size(dtype), row_bytes = esz * (size_t)c->dim;

	if (!esz)
		return tq_fail(err, "unknown input element type %d", (int)dtype);
	for (size_t v = 0; v < n; v++) {
		int r = tq_encode_ref_row(c, (const uint8_t *)src + v * row_bytes, dtype, v,
					  (uint8_t *)dst + v * c->block_bytes, err);
		if (r < 0)
			return r;
	}
	return 0;
}

static int ref_decode(const tq_codec *c, const void *src, size_t n, float *dst)
{
	for (size_t v = 0; v < n; v++) {
		const uint8_t *blk = (const uint8_t *)src + v * c->block_bytes;
		float *x = dst + v * (size_t)c->dim;

		switch (c->id) {
		case TQ_CODEC_TQ2:
		case TQ_CODEC_TQ3:
		case TQ_CODEC_TQ4: decode_tq(c, blk, x); break;
		case TQ_CODEC_TQ3O:
		case TQ_CODEC_TQ4O: decode_tqo(c, blk, x); break;
		case TQ_CODEC_Q8: decode_q8(c, blk, x); break;
		case TQ_CODEC_Q4A: decode_q4a(c, blk, x); break;
		case TQ_CODEC_F16: decode_f16(c, blk, x); break;
		case TQ_CODEC_F32: memcpy(x, blk, c->block_bytes); break;
		default: return -EINVAL;
		}
	}
	return 0;
}

const struct tq_codec_ops tq_codec_ops_scalar = {
	.isa = TQ_ISA_SCALAR,
	.encode = ref_encode,
	.decode = ref_decode,
};
