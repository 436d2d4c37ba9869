/* tq_attn_neon.c — aarch64 NEON (ARMv8.0 Advanced SIMD) inner loops of the
 * fused attention (contracts in tq_attn_internal.h).  Compiles to a NULL
 * getter off aarch64.
 *
 * One 16-value slice decoder (slice16) serves the tile decoders and the
 * register-direct d = 128 kernels.  Codebook lookups are four one-register
 * tbl's on byte planes of the float codebook (byte b of centroid i at
 * position i of plane b) and two zip levels that put the bytes back into
 * floats: no gathers, no 4-register tbl.  Scores hold 2 tokens x 4 rows of
 * 4-lane partial sums and reduce them with two pairwise adds; softmax runs
 * one register per token (lane = query row, the layout of s); accumulation
 * holds 4 rows x 16 dims (16 registers) and adds each token with four
 * by-lane FMAs (vfmaq_laneq_f32, lane = row), so a block is decoded once per
 * 4 query rows.  Not bit-exact with the oracle (FMA, the exp2 polynomial):
 * test_attn compares within its tolerance.
 */
#include "tq_attn_internal.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <string.h>
#include <sys/auxv.h>

#include "tq_neon.h"

#define AI static inline __attribute__((always_inline))

/* ---- slice decoder ----------------------------------------------------------- */

/* Byte planes of a codebook replicated to 16 entries: p[b][i] = byte b of
 * centroid[i mod L]. */
struct cbtab {
	uint8x16_t p[4];
};

/* b[k][i] = byte k of centroid[i mod L], i < n (16 or 32) */
static void cb_bytes(const tq_codebook *cb, int n, uint8_t b[4][32])
{
	int L = cb->levels;

	for (int i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, &cb->centroid[L ? i % L : 0], 4);
		_Pragma("GCC unroll 16")
		for (int k = 0; k < 4; k++)
			b[k][i] = (uint8_t)(u >> (8 * k));
	}
}

static void cbtab_of(struct cbtab *tb, const tq_codebook *cb)
{
	uint8_t b[4][32];

	cb_bytes(cb, 16, b);
	_Pragma("GCC unroll 16")
	for (int k = 0; k < 4; k++)
		tb->p[k] = vld1q_u8(b[k]);
}

static void cbtab_init(struct cbtab *tb, const tq_codec *c)
{
	cbtab_of(tb, &c->cb);
}

/* The same for codebooks of up to 32 entries (tq4o's 5-bit half): two
 * registers per byte plane, looked up by vqtbl2q. */
struct cbtab32 {
	uint8x16x2_t p[4];
};

static void cbtab32_of(struct cbtab32 *tb, const tq_codebook *cb)
{
	uint8_t b[4][32];

	cb_bytes(cb, 32, b);
	for (int k = 0; k < 4; k++) {
		tb->p[k].val[0] = vld1q_u8(b[k]);
		tb->p[k].val[1] = vld1q_u8(b[k] + 16);
	}
}

/* bytes b0..b3 of 16 floats to the floats, o[0..3] */
AI void bytes_to_f32(uint8x16_t b0, uint8x16_t b1, uint8x16_t b2, uint8x16_t b3, float32x4_t o[4])
{
	uint16x8_t l0 = vreinterpretq_u16_u8(vzip1q_u8(b0, b1)), h0 = vreinterpretq_u16_u8(vzip1q_u8(b2, b3));
	uint16x8_t l1 = vreinterpretq_u16_u8(vzip2q_u8(b0, b1)), h1 = vreinterpretq_u16_u8(vzip2q_u8(b2, b3));

	o[0] = vreinterpretq_f32_u16(vzip1q_u16(l0, h0));
	o[1] = vreinterpretq_f32_u16(vzip2q_u16(l0, h0));
	o[2] = vreinterpretq_f32_u16(vzip1q_u16(l1, h1));
	o[3] = vreinterpretq_f32_u16(vzip2q_u16(l1, h1));
}

/* 16 indices (< 32) to 16 centroids in o[0..3]. */
AI void lookup32(const struct cbtab32 *tb, uint8x16_t idx, float32x4_t o[4])
{
	bytes_to_f32(vqtbl2q_u8(tb->p[0], idx), vqtbl2q_u8(tb->p[1], idx), vqtbl2q_u8(tb->p[2], idx),
		     vqtbl2q_u8(tb->p[3], idx), o);
}

/* 16 indices (< 16) to 16 centroids in o[0..3]. */
AI void lookup16(const struct cbtab *tb, uint8x16_t idx, float32x4_t o[4])
{
	bytes_to_f32(vqtbl1q_u8(tb->p[0], idx), vqtbl1q_u8(tb->p[1], idx), vqtbl1q_u8(tb->p[2], idx),
		     vqtbl1q_u8(tb->p[3], idx), o);
}

AI uint8x16_t shr8(uint8x16_t v, int n)
{
	return vshlq_u8(v, vdupq_n_s8((int8_t)-n));
}

/* Values [i0, i0 + 16) of one block of codec id at dim d, unscaled (the
 * key/value frame), into o[0..3].  i0 % 16 == 0 and the plane strides are
 * multiples of 16 (tq4 and q4a: d % 32; tq2: d % 64; tq3: d % 128).
 * q4a applies its affine header here (its scale is 1). */
AI void slice16(const enum tq_codec_id id, const struct cbtab *tb, const uint8_t *b, int i0,
		const int d, float32x4_t o[4])
{
	switch (id) {
	case TQ_CODEC_TQ4: {
		const int h = d / 2;
		uint8x16_t v = vld1q_u8(b + 4 + (i0 < h ? i0 : i0 - h));
		lookup16(tb, i0 < h ? vandq_u8(v, vdupq_n_u8(15)) : vshrq_n_u8(v, 4), o);
		return;
	}
	case TQ_CODEC_TQ2: {
		const int s2 = d / 4;
		uint8x16_t v = vld1q_u8(b + 4 + i0 % s2);
		lookup16(tb, vandq_u8(shr8(v, 2 * (i0 / s2)), vdupq_n_u8(3)), o);
		return;
	}
	case TQ_CODEC_TQ3: {
		/* low 2 bits: 2-bit plane (stride d/4); bit 2: 1-bit plane (stride d/8) */
		const int s2 = d / 4, s1 = d / 8;
		uint8x16_t lo = vandq_u8(shr8(vld1q_u8(b + 4 + i0 % s2), 2 * (i0 / s2)), vdupq_n_u8(3));
		uint8x16_t hb = vld1q_u8(b + 4 + s2 + i0 % s1);
		uint8x16_t hi = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(2 - i0 / s1))), vdupq_n_u8(4));
		lookup16(tb, vorrq_u8(lo, hi), o);
		return;
	}
	case TQ_CODEC_Q8: {
		int8x16_t v = vld1q_s8((const int8_t *)(const void *)(b + 4 + i0));
		int16x8_t l = vmovl_s8(vget_low_s8(v)), h = vmovl_high_s8(v);
		o[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(l)));
		o[1] = vcvtq_f32_s32(vmovl_high_s16(l));
		o[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
		o[3] = vcvtq_f32_s32(vmovl_high_s16(h));
		return;
	}
	case TQ_CODEC_Q4A: {
		const int h = d / 2;
		uint16_t hs, hm;
		memcpy(&hs, b, 2);
		memcpy(&hm, b + 2, 2);
		const float32x4_t s = vdupq_n_f32(tq_f16_to_f32(hs)), mn = vdupq_n_f32(tq_f16_to_f32(hm));
		uint8x16_t v = vld1q_u8(b + 4 + (i0 < h ? i0 : i0 - h));
		v = i0 < h ? vandq_u8(v, vdupq_n_u8(15)) : vshrq_n_u8(v, 4);
		uint16x8_t l = vmovl_u8(vget_low_u8(v)), hh = vmovl_high_u8(v);
		o[0] = vaddq_f32(mn, vmulq_f32(s, vcvtq_f32_u32(vmovl_u16(vget_low_u16(l)))));
		o[1] = vaddq_f32(mn, vmulq_f32(s, vcvtq_f32_u32(vmovl_high_u16(l))));
		o[2] = vaddq_f32(mn, vmulq_f32(s, vcvtq_f32_u32(vmovl_u16(vget_low_u16(hh)))));
		o[3] = vaddq_f32(mn, vmulq_f32(s, vcvtq_f32_u32(vmovl_high_u16(hh))));
		return;
	}
	case TQ_CODEC_F16: {
		const uint16_t *p = (const uint16_t *)(const void *)b + i0;
		float16x8_t a = vreinterpretq_f16_u16(vld1q_u16(p)), c = vreinterpretq_f16_u16(vld1q_u16(p + 8));
		o[0] = vcvt_f32_f16(vget_low_f16(a));
		o[1] = vcvt_high_f32_f16(a);
		o[2] = vcvt_f32_f16(vget_low_f16(c));
		o[3] = vcvt_high_f32_f16(c);
		return;
	}
	default: { /* f32 */
		const float *p = (const float *)(const void *)b + i0;
		o[0] = vld1q_f32(p);
		o[1] = vld1q_f32(p + 4);
		o[2] = vld1q_f32(p + 8);
		o[3] = vld1q_f32(p + 12);
		return;
	}
	}
}

static inline float hdr_scale(enum tq_codec_id id, const uint8_t *b)
{
	float f = 1.0f;

	if (id == TQ_CODEC_TQ2 || id == TQ_CODEC_TQ3 || id == TQ_CODEC_TQ4 || id == TQ_CODEC_Q8)
		memcpy(&f, b, 4);
	return f;
}

/* ---- tile decode ------------------------------------------------------------------ */

AI void decode_tile(const enum tq_codec_id id, const tq_codec *c, const uint8_t *src, int n,
		    float *tile, float *scale)
{
	const int d = c->dim;
	const size_t bb = c->block_bytes;
	struct cbtab tb;

	cbtab_init(&tb, c);
	for (int t = 0; t < n; t++, src += bb) {
		float *o = tile + (size_t)t * d;
		scale[t] = hdr_scale(id, src);
		for (int i0 = 0; i0 < d; i0 += 16) {
			float32x4_t v[4];
			slice16(id, &tb, src, i0, d, v);
			vst1q_f32(o + i0, v[0]);
			vst1q_f32(o + i0 + 4, v[1]);
			vst1q_f32(o + i0 + 8, v[2]);
			vst1q_f32(o + i0 + 12, v[3]);
		}
	}
}

/* o[j] = s * cb[idx_j] for one tq*o half of h values, B-bit indices: the
 * indices from idx (unpacked already), or with idx NULL unpacked from the
 * planes in registers (tq_neon_unpack16: halves that are a power of two),
 * then byte-plane table lookups — the same product as the portable
 * decoder. */
AI void tqo_half_b(const tq_codebook *cb, float s, const uint8_t *pl, const uint8_t *idx, const int h,
		   float *o, const int B)
{
	struct cbtab32 tb32;
	struct cbtab tb16;
	float32x4_t v[4];

	if (B == 5)
		cbtab32_of(&tb32, cb);
	else
		cbtab_of(&tb16, cb);
	_Pragma("GCC unroll 16")
	for (int k = 0; k < h; k += 16) {
		const uint8x16_t ix = idx ? vld1q_u8(idx + k) : tq_neon_unpack16(pl, h, B, k);
		if (B == 5)
			lookup32(&tb32, ix, v);
		else
			lookup16(&tb16, ix, v);
		for (int i = 0; i < 4; i++)
			vst1q_f32(o + k + 4 * i, vmulq_n_f32(v[i], s));
	}
}

static void tqo_half_neon(const tq_codebook *cb, float s, const uint8_t *pl, int h, float *o)
{
	if (h & (h - 1)) { /* not a power of two: the portable unpacking */
		uint8_t idx[TQ_DIM_MAX / 2];
		tq_unpack_planes(pl, h, cb->bits, idx);
		if (cb->levels > 16)
			tqo_half_b(cb, s, pl, idx, h, o, 5);
		else
			tqo_half_b(cb, s, pl, idx, h, o, 4);
		return;
	}
	/* d = 128 (halves of 64) specialized */
	switch (h == 64 ? cb->bits : 0) {
	case 5: tqo_half_b(cb, s, pl, NULL, 64, o, 5); return;
	case 4: tqo_half_b(cb, s, pl, NULL, 64, o, 4); return;
	case 3: tqo_half_b(cb, s, pl, NULL, 64, o, 3); return;
	case 2: tqo_half_b(cb, s, pl, NULL, 64, o, 2); return;
	default: break;
	}
	switch (cb->bits) {
	case 5: tqo_half_b(cb, s, pl, NULL, h, o, 5); return;
	case 4: tqo_half_b(cb, s, pl, NULL, h, o, 4); return;
	case 3: tqo_half_b(cb, s, pl, NULL, h, o, 3); return;
	default: tqo_half_b(cb, s, pl, NULL, h, o, 2); return;
	}
}

static const float *decode_neon(const tq_codec *c, const uint8_t *src, int n,
				float *tile, float *scale)
{
	const int d = c->dim;

	switch (c->id) {
	case TQ_CODEC_TQ4:
		if (d % 32)
			break;
		decode_tile(TQ_CODEC_TQ4, c, src, n, tile, scale);
		return tile;
	case TQ_CODEC_TQ3:
		if (d % 128)
			break;
		decode_tile(TQ_CODEC_TQ3, c, src, n, tile, scale);
		return tile;
	case TQ_CODEC_TQ2:
		if (d % 64)
			break;
		decode_tile(TQ_CODEC_TQ2, c, src, n, tile, scale);
		return tile;
	case TQ_CODEC_Q8:
		if (d % 16)
			break;
		decode_tile(TQ_CODEC_Q8, c, src, n, tile, scale);
		return tile;
	case TQ_CODEC_Q4A:
		if (d % 32)
			break;
		decode_tile(TQ_CODEC_Q4A, c, src, n, tile, scale);
		return tile;
	case TQ_CODEC_F16:
		if (d % 16)
			break;
		decode_tile(TQ_CODEC_F16, c, src, n, tile, scale);
		return tile;
	case TQ_CODEC_TQ3O:
	case TQ_CODEC_TQ4O:
		if (d % 32)
			break;
		tqa_decode_tqo(c, src, n, tile, scale, tqo_half_neon);
		return tile;
	default:
		break;
	}
	return tqa_decode_scalar(c, src, n, tile, scale);
}

/* ---- scores ------------------------------------------------------------------------- */

/* [sum a[0], sum a[1], sum a[2], sum a[3]] */
AI float32x4_t reduce4(const float32x4_t a[4])
{
	return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));
}

static void scores_neon(const float *q, const float *tile, const float *scale,
			int n, int dim, float *s)
{
	const float *q0 = q, *q1 = q + dim, *q2 = q + 2 * dim, *q3 = q + 3 * dim;

	for (int t = 0; t < n; t += 2) {
		const int two = t + 1 < n;
		const float *k0 = tile + (size_t)t * dim, *k1 = two ? k0 + dim : k0;
		float32x4_t a[4], b[4];
		_Pragma("GCC unroll 16")
		for (int r = 0; r < 4; r++)
			a[r] = b[r] = vdupq_n_f32(0.0f);
		for (int j = 0; j < dim; j += 4) {
			float32x4_t x0 = vld1q_f32(k0 + j), x1 = vld1q_f32(k1 + j);
			float32x4_t y0 = vld1q_f32(q0 + j), y1 = vld1q_f32(q1 + j);
			float32x4_t y2 = vld1q_f32(q2 + j), y3 = vld1q_f32(q3 + j);
			a[0] = vfmaq_f32(a[0], x0, y0);
			a[1] = vfmaq_f32(a[1], x0, y1);
			a[2] = vfmaq_f32(a[2], x0, y2);
			a[3] = vfmaq_f32(a[3], x0, y3);
			b[0] = vfmaq_f32(b[0], x1, y0);
			b[1] = vfmaq_f32(b[1], x1, y1);
			b[2] = vfmaq_f32(b[2], x1, y2);
			b[3] = vfmaq_f32(b[3], x1, y3);
		}
		vst1q_f32(s + t * TQA_ROWS, vmulq_n_f32(reduce4(a), scale[t]));
		if (two)
			vst1q_f32(s + (t + 1) * TQA_ROWS, vmulq_n_f32(reduce4(b), scale[t + 1]));
	}
}

/* ---- softmax ------------------------------------------------------------------------ */

/* 2^x, relative error < 2e-7; x < -125 (and NaN) gives 0, so 2^-inf = 0,
 * and no result is subnormal (as on x86, where each one costs a microcode
 * assist: exp2_avx512). */
AI float32x4_t exp2_neon(float32x4_t x)
{
	uint32x4_t live = vcgeq_f32(x, vdupq_n_f32(-125.0f));
	x = vmaxnmq_f32(x, vdupq_n_f32(-125.0f));
	x = vminnmq_f32(x, vdupq_n_f32(127.0f));
	float32x4_t n = vrndnq_f32(x);
	float32x4_t f = vsubq_f32(x, n);
	float32x4_t p = vdupq_n_f32(1.525273380405984e-05f);
	p = vfmaq_f32(vdupq_n_f32(1.5403530393381606e-04f), p, f);
	p = vfmaq_f32(vdupq_n_f32(1.3333558146428443e-03f), p, f);
	p = vfmaq_f32(vdupq_n_f32(9.618129107628477e-03f), p, f);
	p = vfmaq_f32(vdupq_n_f32(5.550410866482158e-02f), p, f);
	p = vfmaq_f32(vdupq_n_f32(2.402265069591007e-01f), p, f);
	p = vfmaq_f32(vdupq_n_f32(6.931471805599453e-01f), p, f);
	p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
	int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
	float32x4_t r = vmulq_f32(p, vreinterpretq_f32_s32(e));
	return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(r), live));
}

/* s[t] is one register: lane r = query row r. */
static void softmax_neon(float *s, int n, const int *vis, float *m, float *l, float *alpha)
{
	const int32x4_t visv = vld1q_s32(vis);
	const float32x4_t ninf = vdupq_n_f32(-INFINITY), zero = vdupq_n_f32(0.0f);
	float32x4_t v[TQA_CHUNK];
	uint32x4_t mk[TQA_CHUNK];
	float32x4_t mx = ninf, bad = zero; /* bad: 0, NaN after a visible score that is not finite */

	for (int t = 0; t < n; t++) {
		mk[t] = vcltq_s32(vdupq_n_s32(t), visv);
		v[t] = vld1q_f32(s + t * TQA_ROWS);
		float32x4_t vv = vbslq_f32(mk[t], v[t], zero);
		mx = vmaxq_f32(mx, vbslq_f32(mk[t], v[t], ninf));
		bad = vaddq_f32(bad, vmulq_f32(vv, zero));
	}
	float32x4_t mold = vld1q_f32(m);
	float32x4_t mnew = vmaxq_f32(mold, mx);
	uint32x4_t live = vmvnq_u32(vceqq_f32(mnew, ninf));
	float32x4_t al = vbslq_f32(live, exp2_neon(vsubq_f32(mold, mnew)), vdupq_n_f32(1.0f));
	float32x4_t sum = zero;
	for (int t = 0; t < n; t++) {
		float32x4_t p = vbslq_f32(vandq_u32(mk[t], live), exp2_neon(vsubq_f32(v[t], mnew)), zero);
		sum = vaddq_f32(sum, p);
		vst1q_f32(s + t * TQA_ROWS, p);
	}
	for (int t = n; t < TQA_CHUNK; t++)
		vst1q_f32(s + t * TQA_ROWS, zero);
	vst1q_f32(l, vaddq_f32(vaddq_f32(vmulq_f32(vld1q_f32(l), al), sum), bad));
	vst1q_f32(m, mnew);
	vst1q_f32(alpha, al);
}

/* ---- accumulation ---------------------------------------------------------------------- */

/* a[r][j] += w4[r] * v[j] for 4 rows, 4 vectors (16 dims). */
AI void fma_rows(float32x4_t a[16], const float32x4_t v[4], float32x4_t w4)
{
	_Pragma("GCC unroll 16")
	for (int j = 0; j < 4; j++) {
		a[0 * 4 + j] = vfmaq_laneq_f32(a[0 * 4 + j], v[j], w4, 0);
		a[1 * 4 + j] = vfmaq_laneq_f32(a[1 * 4 + j], v[j], w4, 1);
		a[2 * 4 + j] = vfmaq_laneq_f32(a[2 * 4 + j], v[j], w4, 2);
		a[3 * 4 + j] = vfmaq_laneq_f32(a[3 * 4 + j], v[j], w4, 3);
	}
}

static void accum_neon(float *acc, const float *alpha, const float *wp, const float *vscale,
		       const float *tile, int n, int dim)
{
	/* w[t][r] = p[t][r] * vscale[t]: one register per token, lane = row */
	float w[TQA_CHUNK * TQA_ROWS] __attribute__((aligned(16)));
	for (int t = 0; t < n; t++)
		vst1q_f32(w + 4 * t, vmulq_n_f32(vld1q_f32(wp + 4 * t), vscale[t]));
	const float32x4_t al[4] = { vdupq_n_f32(alpha[0]), vdupq_n_f32(alpha[1]),
				    vdupq_n_f32(alpha[2]), vdupq_n_f32(alpha[3]) };
	int j0 = 0;

	for (; j0 + 16 <= dim; j0 += 16) {
		float32x4_t a[16];
		_Pragma("GCC unroll 16")
		for (int r = 0; r < 4; r++)
			_Pragma("GCC unroll 16")
			for (int j = 0; j < 4; j++)
				a[r * 4 + j] = vmulq_f32(vld1q_f32(acc + (size_t)r * dim + j0 + 4 * j), al[r]);
		const float *vt = tile + j0;
		for (int t = 0; t < n; t++, vt += dim) {
			float32x4_t v[4] = { vld1q_f32(vt), vld1q_f32(vt + 4), vld1q_f32(vt + 8), vld1q_f32(vt + 12) };
			fma_rows(a, v, vld1q_f32(w + 4 * t));
		}
		_Pragma("GCC unroll 16")
		for (int r = 0; r < 4; r++)
			_Pragma("GCC unroll 16")
			for (int j = 0; j < 4; j++)
				vst1q_f32(acc + (size_t)r * dim + j0 + 4 * j, a[r * 4 + j]);
	}
	for (; j0 < dim; j0 += 4) { /* dim % 8 == 0: 8 or fewer dims left */
		float32x4_t a[4];
		_Pragma("GCC unroll 16")
		for (int r = 0; r < 4; r++)
			a[r] = vmulq_f32(vld1q_f32(acc + (size_t)r * dim + j0), al[r]);
		for (int t = 0; t < n; t++) {
			float32x4_t v = vld1q_f32(tile + (size_t)t * dim + j0), w4 = vld1q_f32(w + 4 * t);
			a[0] = vfmaq_laneq_f32(a[0], v, w4, 0);
			a[1] = vfmaq_laneq_f32(a[1], v, w4, 1);
			a[2] = vfmaq_laneq_f32(a[2], v, w4, 2);
			a[3] = vfmaq_laneq_f32(a[3], v, w4, 3);
		}
		_Pragma("GCC unroll 16")
		for (int r = 0; r < 4; r++)
			vst1q_f32(acc + (size_t)r * dim + j0, a[r]);
	}
}

/* ---- register-direct kernels at dim 128 ----------------------------------------------
 * One body per kernel over slice16 with the codec id a constant. */
#define D 128

/* s[t][r] = scale_t * dot(q[r], block_t) for 4 query rows q: [4][128];
 * two blocks per pass, each decoded once for the 4 rows. */
AI void scores_d128_body(const enum tq_codec_id id, const tq_codec *c, const uint8_t *src, int n,
			 const float *q, float *s)
{
	const size_t bb = c->block_bytes;
	struct cbtab tb;

	cbtab_init(&tb, c);
	for (int t = 0; t < n; t += 2) {
		const int two = t + 1 < n;
		const uint8_t *b0 = src + (size_t)t * bb, *b1 = two ? b0 + bb : b0;
		float32x4_t a[4], b[4];
		_Pragma("GCC unroll 16")
		for (int r = 0; r < 4; r++)
			a[r] = b[r] = vdupq_n_f32(0.0f);
		_Pragma("GCC unroll 16")
		for (int i0 = 0; i0 < D; i0 += 16) {
			float32x4_t k0[4], k1[4];
			slice16(id, &tb, b0, i0, D, k0);
			slice16(id, &tb, b1, i0, D, k1);
			_Pragma("GCC unroll 16")
			for (int j = 0; j < 4; j++) {
				const float *qj = q + i0 + 4 * j;
				float32x4_t y0 = vld1q_f32(qj), y1 = vld1q_f32(qj + D);
				float32x4_t y2 = vld1q_f32(qj + 2 * D), y3 = vld1q_f32(qj + 3 * D);
				a[0] = vfmaq_f32(a[0], k0[j], y0);
				a[1] = vfmaq_f32(a[1], k0[j], y1);
				a[2] = vfmaq_f32(a[2], k0[j], y2);
				a[3] = vfmaq_f32(a[3], k0[j], y3);
				b[0] = vfmaq_f32(b[0], k1[j], y0);
				b[1] = vfmaq_f32(b[1], k1[j], y1);
				b[2] = vfmaq_f32(b[2], k1[j], y2);
				b[3] = vfmaq_f32(b[3], k1[j], y3);
			}
		}
		vst1q_f32(s + t * TQA_ROWS, vmulq_n_f32(reduce4(a), hdr_scale(id, b0)));
		if (two)
			vst1q_f32(s + (t + 1) * TQA_ROWS, vmulq_n_f32(reduce4(b), hdr_scale(id, b1)));
	}
}

/* acc[r][:] = acc[r][:] * alpha[r] + Σ_t p[t][r] scale_t block_t, acc: [4][128];
 * 4 rows x 16 dims in 16 registers per pass, a block's 16 values decoded
 * once per pass (so once in all). */
AI void accum_d128_body(const enum tq_codec_id id, const tq_codec *c, const uint8_t *src, int n,
			float *acc, const float *alpha, const float *p)
{
	const size_t bb = c->block_bytes;
	float w[TQA_CHUNK * TQA_ROWS] __attribute__((aligned(16)));
	struct cbtab tb;

	cbtab_init(&tb, c);
	for (int t = 0; t < n; t++)
		vst1q_f32(w + 4 * t, vmulq_n_f32(vld1q_f32(p + 4 * t), hdr_scale(id, src + (size_t)t * bb)));
	const float32x4_t al[4] = { vdupq_n_f32(alpha[0]), vdupq_n_f32(alpha[1]),
				    vdupq_n_f32(alpha[2]), vdupq_n_f32(alpha[3]) };
	_Pragma("GCC unroll 16")
	for (int i0 = 0; i0 < D; i0 += 16) {
		float32x4_t a[16];
		_Pragma("GCC unroll 16")
		for (int r = 0; r < 4; r++)
			_Pragma("GCC unroll 16")
			for (int j = 0; j < 4; j++)
				a[r * 4 + j] = vmulq_f32(vld1q_f32(acc + r * D + i0 + 4 * j), al[r]);
		const uint8_t *b = src;
		for (int t = 0; t < n; t++, b += bb) {
			float32x4_t v[4];
			slice16(id, &tb, b, i0, D, v);
			fma_rows(a, v, vld1q_f32(w + 4 * t));
		}
		_Pragma("GCC unroll 16")
		for (int r = 0; r < 4; r++)
			_Pragma("GCC unroll 16")
			for (int j = 0; j < 4; j++)
				vst1q_f32(acc + r * D + i0 + 4 * j, a[r * 4 + j]);
	}
}

#define DEF_D128(C, ID)                                                                       \
static void scores_##C(const tq_codec *c, const uint8_t *src, int n, const float *q, float *s) \
{                                                                                             \
	scores_d128_body(ID, c, src, n, q, s);                                                \
}                                                                                             \
static void accum_##C(const tq_codec *c, const uint8_t *src, int n, float *acc,              \
		      const float *alpha, const float *p)                                    \
{                                                                                             \
	accum_d128_body(ID, c, src, n, acc, alpha, p);                                        \
}
DEF_D128(tq4, TQ_CODEC_TQ4)
DEF_D128(tq3, TQ_CODEC_TQ3)
DEF_D128(tq2, TQ_CODEC_TQ2)
DEF_D128(q8, TQ_CODEC_Q8)
DEF_D128(f16, TQ_CODEC_F16)
DEF_D128(f32, TQ_CODEC_F32)
#undef DEF_D128
#undef D

/* ---- q8 keys by dot-product instructions (ARMv8.2 DotProd) ----------------------
 * q8 keys are int8 codes, so with the query rows in integers q·k needs no
 * float decode of the keys at all: SDOT multiplies 16 int8 pairs into four
 * int32 lanes per instruction (4 dims each), four times a float FMA's
 * lanes.  A query row becomes int16 q_j = rint(q_j · Q / max|q|) (15 bits,
 * as the x86 paths' q8 rows), split q = 256 h + l with h, l int8 (h =
 * (q + 128) >> 8, l in [-128, 127]; Q = 32639 keeps h <= 127), and
 * q·k = 256 (h·k) + l·k: two SDOTs per 16 dims, so per token and row block
 * 64 SDOTs where the float path takes 128 FMAs plus the 128 codes' int8 ->
 * float conversions.  Exact integers: a lane sums 32 products of at most
 * 128 · 127, so 256 |h·k| + |l·k| < 2^28 per lane and 2^30 over the four;
 * the float epilogue is (float) sum · fac_r · scale_t, which
 * test_key_scoring_dot reproduces bit for bit from q in plain C.
 *
 * qp: int8 h[4][128] | int8 l[4][128] | float fac[4] (max|q_r| / Q) */
#define D128 128
#define QD_L 512
#define QD_FAC 1024
#define QLIM_DOT 32639.0f
static_assert(QD_FAC + 16 <= TQA_QPREP_BYTES, "qprep layout fits");

static void qprep_q8_dot(const tq_codec *c, const float *q, void *qpv)
{
	int8_t *qh = qpv, *ql = qh + QD_L;
	float *fac = (float *)(void *)(qh + QD_FAC);

	(void)c;
	for (int r = 0; r < TQA_ROWS; r++) {
		const float *qr = q + r * D128;
		float32x4_t mx = vdupq_n_f32(0.0f);
		for (int j = 0; j < D128; j += 4)
			mx = vmaxq_f32(mx, vabsq_f32(vld1q_f32(qr + j))); /* NaN propagates */
		const float m = vmaxvq_f32(mx);
		/* max 0: every product is 0.  max inf or NaN: the factor is
		 * too, and the row's scores come out NaN (the softmax's
		 * contract), as on x86.  A row so small that Q / max overflows
		 * (its logits are 0 to float precision) takes 2^100, as on x86:
		 * an infinite scale would narrow saturated codes. */
		const int tiny = m > 0.0f && !(QLIM_DOT / m <= 0x1p100f);
		const float sq = tiny ? 0x1p100f : m > 0.0f && m <= 3.4e38f ? QLIM_DOT / m : 0.0f;
		fac[r] = tiny ? 0x1p-100f : m / QLIM_DOT;
		for (int j = 0; j < D128; j += 8) {
			const int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(qr + j), sq));
			const int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(qr + j + 4), sq));
			const int16x8_t v = vcombine_s16(vmovn_s32(a), vmovn_s32(b));
			const int16x8_t h = vshrq_n_s16(vaddq_s16(v, vdupq_n_s16(128)), 8);
			const int16x8_t l = vsubq_s16(v, vshlq_n_s16(h, 8));
			vst1_s8(qh + r * D128 + j, vmovn_s16(h));
			vst1_s8(ql + r * D128 + j, vmovn_s16(l));
		}
	}
}

#define DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))

/* s[t][r] = scale_t · fac_r · (q_r · code_t): per token, h·k over the row,
 * times 256, then l·k onto it, 4 accumulators (one per row).  Two tokens
 * per step took 8 (or 16) and GCC 12 spilled a third of them. */
DOTPROD static void scores_q8_dot(const tq_codec *c, const uint8_t *src, int n, const float *qpf, float *s)
{
	const int8_t *qh = (const int8_t *)(const void *)qpf, *ql = qh + QD_L;
	const float32x4_t f4 = vld1q_f32((const float *)(const void *)(qh + QD_FAC));
	const size_t bb = c->block_bytes;

	for (int t = 0; t < n; t++) {
		const uint8_t *b = src + (size_t)t * bb;
		const int8_t *kp = (const int8_t *)(const void *)(b + TQ_Q8_HEADER_BYTES);
		int32x4_t a[4];
		_Pragma("GCC unroll 4")
		for (int r = 0; r < 4; r++)
			a[r] = vdupq_n_s32(0);
		_Pragma("GCC unroll 2")
		for (int part = 0; part < 2; part++) {
			const int8_t *qx = part ? ql : qh;
			if (part) {
				_Pragma("GCC unroll 4")
				for (int r = 0; r < 4; r++)
					a[r] = vshlq_n_s32(a[r], 8);
			}
			_Pragma("GCC unroll 8")
			for (int j = 0; j < D128; j += 16) {
				const int8x16_t k = vld1q_s8(kp + j);
				_Pragma("GCC unroll 4")
				for (int r = 0; r < 4; r++)
					a[r] = vdotq_s32(a[r], vld1q_s8(qx + r * D128 + j), k);
			}
		}
		const int32x4_t z = vpaddq_s32(vpaddq_s32(a[0], a[1]), vpaddq_s32(a[2], a[3]));
		vst1q_f32(s + t * TQA_ROWS, vmulq_n_f32(vmulq_f32(vcvtq_f32_s32(z), f4), hdr_scale(TQ_CODEC_Q8, b)));
	}
}

#define OPS(QPREP_Q8, SCORES_Q8)                                                                \
	{                                                                                       \
		.isa = TQ_ISA_NEON,                                                             \
		.decode = decode_neon,                                                          \
		.scores = scores_neon,                                                          \
		.softmax = softmax_neon,                                                        \
		.accum = accum_neon,                                                            \
		.scores_d128 = {                                                                \
			[TQ_CODEC_TQ4] = scores_tq4, [TQ_CODEC_TQ3] = scores_tq3, [TQ_CODEC_TQ2] = scores_tq2, \
			[TQ_CODEC_Q8] = SCORES_Q8, [TQ_CODEC_F16] = scores_f16, [TQ_CODEC_F32] = scores_f32, \
		},                                                                              \
		.qprep_d128 = { [TQ_CODEC_Q8] = QPREP_Q8 },                                     \
		.accum_d128 = {                                                                 \
			[TQ_CODEC_TQ4] = accum_tq4, [TQ_CODEC_TQ3] = accum_tq3, [TQ_CODEC_TQ2] = accum_tq2, \
			[TQ_CODEC_Q8] = accum_q8, [TQ_CODEC_F16] = accum_f16, [TQ_CODEC_F32] = accum_f32, \
		},                                                                              \
	}

static const struct tqa_ops ops = OPS(NULL, scores_q8), ops_dot = OPS(qprep_q8_dot, scores_q8_dot);

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif

static int cpu_has_dotprod(void)
{
	return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
}

/* With DotProd (Cortex-A75 / Neoverse N1 and later: every DGX Spark core)
 * q8 keys are scored in integers. */
const struct tqa_ops *tqa_ops_neon(void)
{
	return cpu_has_dotprod() ? &ops_dot : &ops;
}

const struct tqa_ops *tqa_ops_neon_dot(int dot)
{
	return dot ? (cpu_has_dotprod() ? &ops_dot : NULL) : &ops;
}

#else /* not aarch64 */

const struct tqa_ops *tqa_ops_neon(void)
{
	return NULL;
}

const struct tqa_ops *tqa_ops_neon_dot(int dot)
{
	(void)dot;
	return NULL;
}

#endif /* __aarch64__ */
