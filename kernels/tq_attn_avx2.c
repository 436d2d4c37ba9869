/* tq_attn_avx2.c — AVX2 + FMA + F16C inner loops of the fused attention
 * (contracts in tq_attn_internal.h).  Compiles to nothing useful off x86-64.
 *
 * Same structure as the AVX-512 file with 8 lanes: vpermps looks up 8
 * entries, so 16-entry codebooks are two lookups and a blend on index bit 3;
 * scores run 2 tokens x 4 rows with one transposed reduction of the 8
 * vectors; accumulation holds 4 rows x 16 dims per pass.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tq_attn_internal.h"
#include "tq_avx2.h"

static inline __m256i zext8(const uint8_t *p)
{
	return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

static inline __m256i srl(__m256i v, int n)
{
	return _mm256_srl_epi32(v, _mm_cvtsi32_si128(n));
}

/* c[idx & 15] from two 8-entry halves */
static inline __m256 lookup16(__m256 lo, __m256 hi, __m256i idx)
{
	__m256 a = _mm256_permutevar8x32_ps(lo, idx), b = _mm256_permutevar8x32_ps(hi, idx);
	return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

/* tq4 / tq3 / tq2 blocks into the tile by byte shuffles (tq_avx2.h); 0 when
 * the dim is not one tq_cent_block handles */
static int decode_cent_avx2(const tq_codec *c, const uint8_t *src, int n, float *tile, float *scale)
{
	struct tq_cent_tab tb;

	if (!tq_cent_ok(c))
		return 0;
	tq_cent_tab_make(c, &tb);
	for (int t = 0; t < n; t++, src += c->block_bytes) {
		memcpy(&scale[t], src, 4);
		tq_cent_block(c, &tb, src + 4, tile + (size_t)t * c->dim);
	}
	return 1;
}

/* A codebook of up to 32 entries in four registers, and c[idx & 31] from
 * it: 8 entries by one vpermps, 16 by two and a blend on bit 3, 32 by four
 * and another blend on bit 4. */
struct cb32 {
	__m256 t[4];
	int levels;
};

static inline __attribute__((always_inline)) void cb32_load(struct cb32 *c, const tq_codebook *cb)
{
	for (int i = 0; i < 4; i++)
		c->t[i] = _mm256_loadu_ps(cb->centroid + 8 * i);
	c->levels = cb->levels;
}

static inline __attribute__((always_inline)) __m256 cb32_get(const struct cb32 *c, __m256i v)
{
	if (c->levels <= 8)
		return _mm256_permutevar8x32_ps(c->t[0], v);
	if (c->levels <= 16)
		return lookup16(c->t[0], c->t[1], v);
	return _mm256_blendv_ps(lookup16(c->t[0], c->t[1], v), lookup16(c->t[2], c->t[3], v),
				_mm256_castsi256_ps(_mm256_slli_epi32(v, 27)));
}

/* o[j] = s * cb[idx[j]], j < h (a multiple of 8) — the same product as the
 * portable decoder */
static void tqo_lookup_avx2(const tq_codebook *cb, float s, const uint8_t *idx, int h, float *o)
{
	struct cb32 c;
	const __m256 sv = _mm256_set1_ps(s);

	cb32_load(&c, cb);
	for (int k = 0; k < h; k += 8)
		_mm256_storeu_ps(o + k, _mm256_mul_ps(cb32_get(&c, zext8(idx + k)), sv));
}

/* The planes of a half of h values (h a power of two, 32 <= h <= 256) into
 * index vectors acc[h/8], as the AVX-512 file does with 16 lanes: S >= 8:
 * 8-byte runs of a segment, one shift; S = 4: the plane repeated to 8
 * bytes, lane j of group g shifted by w*((8g + j)/4). */
static inline __attribute__((always_inline)) void tqo_plane(__m256i *acc, const uint8_t *pl, int h, int w,
							   int off)
{
	const int S = h * w / 8;
	const __m256i m = _mm256_set1_epi32((1 << w) - 1);

	if (S >= 8) {
		const int nseg = 8 / w; /* out of the loop's test: UBSan's division check there voided the unroll pragma */
		_Pragma("GCC unroll 16")
		for (int seg = 0; seg < nseg; seg++)
			_Pragma("GCC unroll 16")
			for (int b = 0; b < S; b += 8) {
				__m256i v = _mm256_and_si256(srl(zext8(pl + b), w * seg), m);
				acc[(seg * S + b) / 8] = _mm256_or_si256(acc[(seg * S + b) / 8], _mm256_slli_epi32(v, off));
			}
		return;
	}
	uint32_t u4;
	memcpy(&u4, pl, 4);
	const __m256i r = _mm256_cvtepu8_epi32(_mm_set1_epi32((int)u4));
	__m256i sh = _mm256_mullo_epi32(_mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0), _mm256_set1_epi32(w));
	const __m256i step = _mm256_set1_epi32(2 * w);
	_Pragma("GCC unroll 32")
	for (int g = 0; g < h / 8; g++, sh = _mm256_add_epi32(sh, step))
		acc[g] = _mm256_or_si256(acc[g], _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(r, sh), m), off));
}

static inline __attribute__((always_inline)) void tqo_half_h(const tq_codebook *cb, float s, const uint8_t *pl,
							    int h, float *o)
{
	__m256i acc[TQ_DIM_MAX / 2 / 8];
	struct cb32 c;
	const __m256 sv = _mm256_set1_ps(s);

	cb32_load(&c, cb);

	_Pragma("GCC unroll 32")
	for (int g = 0; g < h / 8; g++)
		acc[g] = _mm256_setzero_si256();
	switch (cb->bits) { /* planes: widest first, lowest bits (tq_layout.h) */
	case 5: tqo_plane(acc, pl, h, 4, 0); tqo_plane(acc, pl + h / 2, h, 1, 4); break;
	case 4: tqo_plane(acc, pl, h, 4, 0); break;
	case 3: tqo_plane(acc, pl, h, 2, 0); tqo_plane(acc, pl + h / 4, h, 1, 2); break;
	case 2: tqo_plane(acc, pl, h, 2, 0); break;
	default: tqo_plane(acc, pl, h, 1, 0); break;
	}
	_Pragma("GCC unroll 32")
	for (int g = 0; g < h / 8; g++)
		_mm256_storeu_ps(o + 8 * g, _mm256_mul_ps(cb32_get(&c, acc[g]), sv));
}

static void tqo_half_direct(const tq_codebook *cb, float s, const uint8_t *pl, int h, float *o)
{
	switch (h) {
	case 32: tqo_half_h(cb, s, pl, 32, o); break;
	case 64: tqo_half_h(cb, s, pl, 64, o); break;
	case 128: tqo_half_h(cb, s, pl, 128, o); break;
	default: tqo_half_h(cb, s, pl, 256, o); break;
	}
}

/* One tq*o half: straight from the planes where h is a power of two in
 * [32, 256] and the width at most 5; else unpacked by words first. */
static void tqo_half_avx2(const tq_codebook *cb, float s, const uint8_t *pl, int h, float *o)
{
	uint8_t idx[TQ_DIM_MAX / 2];

	if (h >= 32 && h <= TQ_DIM_MAX / 2 && !(h & (h - 1)) && cb->bits <= 5) {
		tqo_half_direct(cb, s, pl, h, o);
		return;
	}
	tq_unpack_planes(pl, h, cb->bits, idx);
	tqo_lookup_avx2(cb, s, idx, h, o);
}

static const float *decode_avx2(const tq_codec *c, const uint8_t *src, int n,
				float *tile, float *scale)
{
	const int d = c->dim;
	const size_t bb = c->block_bytes;

	if ((c->id == TQ_CODEC_TQ4 || c->id == TQ_CODEC_TQ3 || c->id == TQ_CODEC_TQ2) &&
	    decode_cent_avx2(c, src, n, tile, scale))
		return tile;
	switch (c->id) {
	case TQ_CODEC_TQ4: {
		if (d % 16)
			break;
		const __m256 lo = _mm256_loadu_ps(c->cb.centroid), hi = _mm256_loadu_ps(c->cb.centroid + 8);
		const int h = d / 2;
		for (int t = 0; t < n; t++, src += bb) {
			float *o = tile + (size_t)t * d;
			memcpy(&scale[t], src, 4);
			for (int k = 0; k < h; k += 8) {
				__m256i v = zext8(src + 4 + k);
				_mm256_storeu_ps(o + k, lookup16(lo, hi, v));
				_mm256_storeu_ps(o + h + k, lookup16(lo, hi, _mm256_srli_epi32(v, 4)));
			}
		}
		return tile;
	}
	case TQ_CODEC_TQ3: {
		if (d % 64)
			break;
		const __m256 cb = _mm256_loadu_ps(c->cb.centroid);
		const __m256i m3 = _mm256_set1_epi32(3), m4 = _mm256_set1_epi32(4);
		const int s2 = d / 4, s1 = d / 8;
		for (int t = 0; t < n; t++, src += bb) {
			const uint8_t *lo = src + 4, *hi = src + 4 + s2;
			float *o = tile + (size_t)t * d;
			memcpy(&scale[t], src, 4);
			for (int i0 = 0; i0 < d; i0 += 8) {
				__m256i a = _mm256_and_si256(srl(zext8(lo + i0 % s2), 2 * (i0 / s2)), m3);
				__m256i b = _mm256_and_si256(_mm256_slli_epi32(srl(zext8(hi + i0 % s1), i0 / s1), 2), m4);
				_mm256_storeu_ps(o + i0, _mm256_permutevar8x32_ps(cb, _mm256_or_si256(a, b)));
			}
		}
		return tile;
	}
	case TQ_CODEC_TQ2: {
		if (d % 32)
			break;
		float c8[8];
		_Pragma("GCC unroll 16")
		for (int i = 0; i < 8; i++)
			c8[i] = c->cb.centroid[i & 3];
		const __m256 cb = _mm256_loadu_ps(c8);
		const int s2 = d / 4;
		for (int t = 0; t < n; t++, src += bb) {
			float *o = tile + (size_t)t * d;
			memcpy(&scale[t], src, 4);
			for (int i0 = 0; i0 < d; i0 += 8)
				_mm256_storeu_ps(o + i0, _mm256_permutevar8x32_ps(
					cb, srl(zext8(src + 4 + i0 % s2), 2 * (i0 / s2))));
		}
		return tile;
	}
	case TQ_CODEC_Q8:
		for (int t = 0; t < n; t++, src += bb) {
			float *o = tile + (size_t)t * d;
			memcpy(&scale[t], src, 4);
			for (int k = 0; k < d; k += 8) {
				__m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(src + 4 + k));
				_mm256_storeu_ps(o + k, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
			}
		}
		return tile;
	case TQ_CODEC_Q4A: {
		if (d % 16)
			break;
		const int h = d / 2;
		const __m256i m15 = _mm256_set1_epi32(15);
		for (int t = 0; t < n; t++, src += bb) {
			uint16_t hs, hm;
			memcpy(&hs, src, 2);
			memcpy(&hm, src + 2, 2);
			const __m256 s = _mm256_set1_ps(tq_f16_to_f32(hs));
			const __m256 mn = _mm256_set1_ps(tq_f16_to_f32(hm));
			float *o = tile + (size_t)t * d;
			scale[t] = 1.0f;
			for (int k = 0; k < h; k += 8) {
				__m256i v = zext8(src + 4 + k);
				__m256 l = _mm256_cvtepi32_ps(_mm256_and_si256(v, m15));
				__m256 u = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
				_mm256_storeu_ps(o + k, _mm256_add_ps(mn, _mm256_mul_ps(s, l)));
				_mm256_storeu_ps(o + h + k, _mm256_add_ps(mn, _mm256_mul_ps(s, u)));
			}
		}
		return tile;
	}
	case TQ_CODEC_F16:
		for (int t = 0; t < n; t++, src += bb) {
			float *o = tile + (size_t)t * d;
			scale[t] = 1.0f;
			for (int k = 0; k < d; k += 8)
				_mm256_storeu_ps(o + k, _mm256_cvtph_ps(_mm_loadu_si128(
					(const __m128i *)(const void *)(src + 2 * k))));
		}
		return tile;
	case TQ_CODEC_TQ3O:
	case TQ_CODEC_TQ4O:
		tqa_decode_tqo(c, src, n, tile, scale, tqo_half_avx2);
		return tile;
	default:
		break;
	}
	return tqa_decode_scalar(c, src, n, tile, scale);
}

/* lane i = horizontal sum of v[i] */
static inline __m256 reduce8(const __m256 v[8])
{
	__m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
	__m256 c = _mm256_hadd_ps(v[4], v[5]), e = _mm256_hadd_ps(v[6], v[7]);
	__m256 ab = _mm256_hadd_ps(a, b), ce = _mm256_hadd_ps(c, e);
	return _mm256_add_ps(_mm256_permute2f128_ps(ab, ce, 0x20), _mm256_permute2f128_ps(ab, ce, 0x31));
}

static void scores_avx2(const float *q, const float *tile, const float *scale,
			int n, int dim, float *s)
{
	const float *q0 = q, *q1 = q + dim, *q2 = q + 2 * dim, *q3 = q + 3 * dim;

	for (int t = 0; t < n; t += 2) {
		const int two = t + 1 < n;
		const float *k0 = tile + (size_t)t * dim, *k1 = two ? k0 + dim : k0;
		__m256 a[8];
		_Pragma("GCC unroll 16")
		for (int i = 0; i < 8; i++)
			a[i] = _mm256_setzero_ps();
		for (int j = 0; j < dim; j += 8) {
			__m256 x0 = _mm256_loadu_ps(k0 + j), x1 = _mm256_loadu_ps(k1 + j);
			__m256 y0 = _mm256_loadu_ps(q0 + j), y1 = _mm256_loadu_ps(q1 + j);
			__m256 y2 = _mm256_loadu_ps(q2 + j), y3 = _mm256_loadu_ps(q3 + j);
			a[0] = _mm256_fmadd_ps(x0, y0, a[0]);
			a[1] = _mm256_fmadd_ps(x0, y1, a[1]);
			a[2] = _mm256_fmadd_ps(x0, y2, a[2]);
			a[3] = _mm256_fmadd_ps(x0, y3, a[3]);
			a[4] = _mm256_fmadd_ps(x1, y0, a[4]);
			a[5] = _mm256_fmadd_ps(x1, y1, a[5]);
			a[6] = _mm256_fmadd_ps(x1, y2, a[6]);
			a[7] = _mm256_fmadd_ps(x1, y3, a[7]);
		}
		__m256 z = reduce8(a);
		__m256 sc = _mm256_set_m128(_mm_set1_ps(scale[two ? t + 1 : t]), _mm_set1_ps(scale[t]));
		z = _mm256_mul_ps(z, sc);
		if (two)
			_mm256_storeu_ps(s + t * TQA_ROWS, z);
		else
			_mm_storeu_ps(s + t * TQA_ROWS, _mm256_castps256_ps128(z));
	}
}

/* 2^x, relative error < 2e-7; x < -125 (and NaN) gives 0.  No result is
 * subnormal (an Intel core takes a microcode assist for each instruction
 * that makes one: exp2_avx512). */
static inline __m256 exp2_avx2(__m256 x)
{
	__m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-125.0f), _CMP_NGE_UQ);
	x = _mm256_max_ps(x, _mm256_set1_ps(-125.0f));
	x = _mm256_min_ps(x, _mm256_set1_ps(127.0f));
	/* round to nearest even by adding 1.5 * 2^23 (|x| < 2^22): the sum's
	 * low mantissa bits are the integer, so no vroundps / vcvtps2dq */
	const __m256 magic = _mm256_set1_ps(12582912.0f);
	const __m256 t = _mm256_add_ps(x, magic);
	__m256 n = _mm256_sub_ps(t, magic);
	__m256 f = _mm256_sub_ps(x, n);
	__m256 p = _mm256_set1_ps(1.525273380405984e-05f);
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381606e-04f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-03f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618129107628477e-03f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550410866482158e-02f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402265069591007e-01f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471805599453e-01f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127)), 23);
	return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* lane = token * 4 + row within a register of 2 tokens */
static void softmax_avx2(float *s, int n, const int *vis, float *m, float *l, float *alpha)
{
	const __m256i tok = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);
	const __m256i visv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)vis));
	const __m256 ninf = _mm256_set1_ps(-INFINITY);
	const __m256 zero = _mm256_setzero_ps();
	__m256 mk[TQA_CHUNK / 2], v[TQA_CHUNK / 2];
	__m256 mx = ninf, bad = zero;   /* bad: 0, NaN after a visible score that is not finite */
	int nk = (n + 1) / 2;

	for (int k = 0; k < nk; k++) {
		mk[k] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(visv, _mm256_add_epi32(tok, _mm256_set1_epi32(2 * k))));
		v[k] = _mm256_loadu_ps(s + 8 * k);
		mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, v[k], mk[k]));
		bad = _mm256_fmadd_ps(_mm256_and_ps(mk[k], v[k]), zero, bad);
	}
	mx = _mm256_max_ps(mx, _mm256_permute2f128_ps(mx, mx, 0x01));
	__m256 mold = _mm256_broadcast_ps((const __m128 *)(const void *)m);
	__m256 mnew = _mm256_max_ps(mold, mx);
	__m256 live = _mm256_cmp_ps(mnew, ninf, _CMP_NEQ_OQ);
	__m256 al = _mm256_blendv_ps(_mm256_set1_ps(1.0f), exp2_avx2(_mm256_sub_ps(mold, mnew)), live);
	__m256 sum = _mm256_setzero_ps();
	for (int k = 0; k < nk; k++) {
		__m256 p = _mm256_and_ps(mk[k], exp2_avx2(_mm256_sub_ps(v[k], mnew)));
		sum = _mm256_add_ps(sum, p);
		_mm256_storeu_ps(s + 8 * k, p);
	}
	for (int k = nk; k < TQA_CHUNK / 2; k++)
		_mm256_storeu_ps(s + 8 * k, _mm256_setzero_ps());
	sum = _mm256_add_ps(sum, _mm256_permute2f128_ps(sum, sum, 0x01));
	bad = _mm256_add_ps(bad, _mm256_permute2f128_ps(bad, bad, 0x01));
	__m128 a4 = _mm256_castps256_ps128(al);
	_mm_storeu_ps(l, _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_loadu_ps(l), a4), _mm256_castps256_ps128(sum)),
				    _mm256_castps256_ps128(bad)));
	_mm_storeu_ps(m, _mm256_castps256_ps128(mnew));
	_mm_storeu_ps(alpha, a4);
}

static void accum_avx2(float *acc, const float *alpha, const float *wp, const float *vscale,
		       const float *tile, int n, int dim)
{
	/* w[t][r] = p[t][r] * vscale[t] */
	float w[TQA_CHUNK * TQA_ROWS] __attribute__((aligned(32)));
	for (int t = 0; t < n; t++)
		_mm_store_ps(w + 4 * t, _mm_mul_ps(_mm_loadu_ps(wp + 4 * t), _mm_set1_ps(vscale[t])));
	const __m256 al[4] = { _mm256_set1_ps(alpha[0]), _mm256_set1_ps(alpha[1]),
			       _mm256_set1_ps(alpha[2]), _mm256_set1_ps(alpha[3]) };
	int j0 = 0;

	for (; j0 + 16 <= dim; j0 += 16) {
		__m256 a[4][2];
		_Pragma("GCC unroll 16")
		for (int r = 0; r < 4; r++) {
			a[r][0] = _mm256_mul_ps(_mm256_loadu_ps(acc + (size_t)r * dim + j0), al[r]);
			a[r][1] = _mm256_mul_ps(_mm256_loadu_ps(acc + (size_t)r * dim + j0 + 8), al[r]);
		}
		for (int t = 0; t < n; t++) {
			const float *vt = tile + (size_t)t * dim + j0;
			__m256 v0 = _mm256_loadu_ps(vt), v1 = _mm256_loadu_ps(vt + 8);
			_Pragma("GCC unroll 16")
			for (int r = 0; r < 4; r++) {
				__m256 wr = _mm256_broadcast_ss(w + t * TQA_ROWS + r);
				a[r][0] = _mm256_fmadd_ps(wr, v0, a[r][0]);
				a[r][1] = _mm256_fmadd_ps(wr, v1, a[r][1]);
			}
		}
		_Pragma("GCC unroll 16")
		for (int r = 0; r < 4; r++) {
			_mm256_storeu_ps(acc + (size_t)r * dim + j0, a[r][0]);
			_mm256_storeu_ps(acc + (size_t)r * dim + j0 + 8, a[r][1]);
		}
	}
	for (; j0 < dim; j0 += 8) { /* dim % 8 == 0 */
		__m256 a[4];
		_Pragma("GCC unroll 16")
		for (int r = 0; r < 4; r++)
			a[r] = _mm256_mul_ps(_mm256_loadu_ps(acc + (size_t)r * dim + j0), al[r]);
		for (int t = 0; t < n; t++) {
			__m256 v = _mm256_loadu_ps(tile + (size_t)t * dim + j0);
			_Pragma("GCC unroll 16")
			for (int r = 0; r < 4; r++)
				a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + t * TQA_ROWS + r), v, a[r]);
		}
		_Pragma("GCC unroll 16")
		for (int r = 0; r < 4; r++)
			_mm256_storeu_ps(acc + (size_t)r * dim + j0, a[r]);
	}
}

/* ---- register-direct kernels at dim 128 ---------------------------------------
 * LD_<codec>(blk, k): dims [8k, 8k + 8) of one block, unscaled, k a constant
 * 0..15 after unrolling; SC_<codec>(blk): the block's scale.  vpermps reads
 * the low 3 index bits, so the 4-entry tq2 codebook is replicated to 8 and
 * tq4's 16 entries are two lookups and a blend on index bit 3; bits above
 * the index need no masking (tq3 values: accum_tq3, below).  Values of the
 * centroid codecs decoded here, inside the
 * passes, beat the tile (byte-shuffle decoder, then a pass over the tile)
 * end to end at 32k on Zen 3 (fused / fp16 0.52-0.58 against 0.58-0.69,
 * interleaved runs), though the tile wins in L1. */
#define D 128
#define LD_tq4(b, k) lookup16(lo, hi, (k) < 8 ? zext8((b) + 4 + 8 * (k))                          \
	: _mm256_srli_epi32(zext8((b) + 4 + 8 * ((k) - 8)), 4))
#define LD_tq2(b, k) _mm256_permutevar8x32_ps(cb,                                                    \
	_mm256_srli_epi32(zext8((b) + 4 + 8 * ((k) & 3)), 2 * ((k) >> 2)))
#define LD_q8(b, k) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(                                         \
	_mm_loadl_epi64((const __m128i *)(const void *)((b) + 4 + 8 * (k)))))
#define LD_f16(b, k) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)((b) + 16 * (k))))
#define LD_f32(b, k) _mm256_loadu_ps((const float *)(const void *)(b) + 8 * (k))

static inline float hdr_scale(const uint8_t *b)
{
	float f;
	memcpy(&f, b, 4);
	return f;
}
#define SC_tq4(b) hdr_scale(b)
#define SC_tq2(b) hdr_scale(b)
#define SC_q8(b) hdr_scale(b)
#define SC_f16(b) 1.0f
#define SC_f32(b) 1.0f

#define CB_tq4 const __m256 lo = _mm256_loadu_ps(c->cb.centroid), hi = _mm256_loadu_ps(c->cb.centroid + 8)
#define CB_tq2                                                                    \
	float c8[8];                                                              \
	for (int i_ = 0; i_ < 8; i_++)                                            \
		c8[i_] = c->cb.centroid[i_ & 3];                                  \
	const __m256 cb = _mm256_loadu_ps(c8)
#define CB_q8 (void)c
#define CB_f16 (void)c
#define CB_f32 (void)c

/* s[t][r] = scale_t * dot(q[r], block_t) for 4 query rows q: [4][128];
 * 2 tokens x 4 rows of 8-lane partial sums, then one transposed reduction. */
#define DEF_SCORES(C)                                                                         \
static void scores_##C(const tq_codec *c, const uint8_t *src, int n, const float *q, float *s) \
{                                                                                             \
	CB_##C;                                                                               \
	const size_t bb = c->block_bytes;                                                     \
	for (int t = 0; t < n; t += 2) {                                                      \
		TQA_PF_STEP(); /* paced prefetch: a line per 2 tokens */                      \
		const int two = t + 1 < n;                                                    \
		const uint8_t *b0 = src + (size_t)t * bb, *b1 = two ? b0 + bb : b0;           \
		__m256 a[8];                                                                  \
		_Pragma("GCC unroll 8")                                                       \
		for (int i = 0; i < 8; i++)                                                   \
			a[i] = _mm256_setzero_ps();                                           \
		_Pragma("GCC unroll 16")                                                      \
		for (int k = 0; k < D / 8; k++) {                                             \
			const __m256 k0 = LD_##C(b0, k), k1 = LD_##C(b1, k);                  \
			_Pragma("GCC unroll 4")                                               \
			for (int r = 0; r < 4; r++) {                                         \
				const __m256 qr = _mm256_loadu_ps(q + r * D + 8 * k);         \
				a[r] = _mm256_fmadd_ps(k0, qr, a[r]);                         \
				a[4 + r] = _mm256_fmadd_ps(k1, qr, a[4 + r]);                 \
			}                                                                     \
		}                                                                             \
		__m256 z = reduce8(a);                                                        \
		__m256 sc = _mm256_set_m128(_mm_set1_ps(SC_##C(b1)), _mm_set1_ps(SC_##C(b0))); \
		z = _mm256_mul_ps(z, sc);                                                     \
		if (two)                                                                      \
			_mm256_storeu_ps(s + t * TQA_ROWS, z);                                \
		else                                                                          \
			_mm_storeu_ps(s + t * TQA_ROWS, _mm256_castps256_ps128(z));           \
	}                                                                                     \
}

/* acc[r][:] = acc[r][:] * alpha[r] + Σ_t p[t][r] scale_t block_t, acc: [4][128];
 * 4 rows x 16 dims in registers per pass over the blocks. */
#define DEF_ACCUM(C)                                                                          \
static void accum_##C(const tq_codec *c, const uint8_t *src, int n, float *acc,              \
		      const float *alpha, const float *p)                                    \
{                                                                                             \
	CB_##C;                                                                               \
	const size_t bb = c->block_bytes;                                                     \
	float w[TQA_CHUNK * TQA_ROWS] __attribute__((aligned(32)));                           \
	for (int t = 0; t < n; t++) {                                                         \
		__m128 sc = _mm_set1_ps(SC_##C(src + (size_t)t * bb));                        \
		_mm_store_ps(w + 4 * t, _mm_mul_ps(_mm_loadu_ps(p + 4 * t), sc));            \
	}                                                                                     \
	_Pragma("GCC unroll 8")                                                               \
	for (int h = 0; h < D / 16; h++) {                                                    \
		__m256 a[8];                                                                  \
		_Pragma("GCC unroll 4")                                                       \
		for (int r = 0; r < 4; r++) {                                                 \
			const __m256 al = _mm256_set1_ps(alpha[r]);                           \
			a[2 * r] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * D + 16 * h), al); \
			a[2 * r + 1] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * D + 16 * h + 8), al); \
		}                                                                             \
		const uint8_t *b = src;                                                       \
		for (int t = 0; t < n; t++, b += bb) {                                        \
			if (!(t & 3))                                                         \
				TQA_PF_STEP(); /* a line per 4 tokens of each pass */         \
			const __m256 v0 = LD_##C(b, 2 * h), v1 = LD_##C(b, 2 * h + 1);        \
			_Pragma("GCC unroll 4")                                               \
			for (int r = 0; r < 4; r++) {                                         \
				const __m256 wr = _mm256_broadcast_ss(w + 4 * t + r);         \
				a[2 * r] = _mm256_fmadd_ps(wr, v0, a[2 * r]);                 \
				a[2 * r + 1] = _mm256_fmadd_ps(wr, v1, a[2 * r + 1]);         \
			}                                                                     \
		}                                                                             \
		_Pragma("GCC unroll 4")                                                       \
		for (int r = 0; r < 4; r++) {                                                 \
			_mm256_storeu_ps(acc + r * D + 16 * h, a[2 * r]);                    \
			_mm256_storeu_ps(acc + r * D + 16 * h + 8, a[2 * r + 1]);            \
		}                                                                             \
	}                                                                                     \
}

/* The passes of the tq3 / tq4 value kernels over the chunk's index bytes
 * ix [n][128] (IX_PAD zero bytes before and after: the loads reach 3
 * bytes past either end): 4 rows x 16 dims in
 * registers per pass.  The 8 dims 32B + 4m + b (m = 0..7) of one vector
 * come from one unaligned load at ix + 32B + b: dword m's low byte is dim
 * 32B + 4m + b's index, and vpermps reads its low 3 bits only — no
 * widening (a vpmovzxbd per 8 dims took port 5 beside the vpermps, which
 * the FMAs' ports left no room for).  So acc is kept in acc_order2: the
 * pass over [32B, 32B + 32) holds b = 0, 1, then b = 2, 3.  fold (tq4):
 * the index byte's bit 7 is the value's sign (accum_tq4), moved to the
 * float's by a second load 3 bytes earlier (its top byte is the same). */
#define IX_PAD 32
static inline __attribute__((always_inline)) __m256 ix_value(__m256 cb, const uint8_t *ip, const int fold)
{
	const __m256 v = _mm256_permutevar8x32_ps(cb, _mm256_loadu_si256((const __m256i *)(const void *)ip));
	if (!fold)
		return v;
	const __m256 sg = _mm256_loadu_ps((const float *)(const void *)(ip - 3));
	return _mm256_xor_ps(v, _mm256_and_ps(sg, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u))));
}

/* position p of an acc row holds dim acc_order2[p] (tqa_ops.accum_d128_perm) */
#define AO(p) (((p) & ~31) | (((p) & 7) << 2) | (((p) >> 3) & 3))
static const uint8_t acc_order2[128] = TQA_ORDER128(AO);
#undef AO

static inline __attribute__((always_inline)) void ix_passes_(const uint8_t *ix, int n, const float *w, float *acc,
							     const float *alpha, __m256 cb, const int fold,
							     struct tqa_pf *pf_)
{
	_Pragma("GCC unroll 8")
	for (int h = 0; h < D / 16; h++) {
		__m256 a[8];
		_Pragma("GCC unroll 4")
		for (int r = 0; r < 4; r++) {
			const __m256 al = _mm256_set1_ps(alpha[r]);
			a[2 * r] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * D + 16 * h), al);
			a[2 * r + 1] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * D + 16 * h + 8), al);
		}
		const uint8_t *ip = ix + 32 * (h >> 1) + 2 * (h & 1);
		for (int t = 0; t < n; t++, ip += D) {
			if (pf_ && !(t & 3))
				tqa_pf_step(pf_); /* a line per 4 tokens of each pass */
			const __m256 v0 = ix_value(cb, ip, fold), v1 = ix_value(cb, ip + 1, fold);
			_Pragma("GCC unroll 4")
			for (int r = 0; r < 4; r++) {
				const __m256 wr = _mm256_broadcast_ss(w + 4 * t + r);
				a[2 * r] = _mm256_fmadd_ps(wr, v0, a[2 * r]);
				a[2 * r + 1] = _mm256_fmadd_ps(wr, v1, a[2 * r + 1]);
			}
		}
		_Pragma("GCC unroll 4")
		for (int r = 0; r < 4; r++) {
			_mm256_storeu_ps(acc + r * D + 16 * h, a[2 * r]);
			_mm256_storeu_ps(acc + r * D + 16 * h + 8, a[2 * r + 1]);
		}
	}
}

/* The passes with the prefetch steps only where the driver paces them
 * (the cursor in progress): a check in the loop of a chunk it does not
 * pace cost tq4 / tq3 about 5 % (BENCHMARKS.md 2). */
static inline __attribute__((always_inline)) void ix_passes(const uint8_t *ix, int n, const float *w, float *acc,
							    const float *alpha, __m256 cb, const int fold)
{
	if (tqa_pf_cur.i < 2)
		ix_passes_(ix, n, w, acc, alpha, cb, fold, &tqa_pf_cur);
	else
		ix_passes_(ix, n, w, acc, alpha, cb, fold, NULL);
}

/* tq3 values: the index bytes of the chunk first, by in-lane byte shifts and
 * masks (32 dims per step, as the tile decoder does), then the passes look
 * them up with one load and one vpermps per 8 dims (ix_value): the slice
 * decoder took two vpmovzxbd, four shifts and masks and the vpermps per 8
 * dims, in every pass.  Passes of 12 accumulators (24 dims, the table a
 * memory operand so that nothing spills) were no faster, 12.0-12.2 ns a
 * token against 11.6-11.8 in `tqbench kern`: the loop is bound by the FMA
 * ports (64 vfmadd231ps ymm a token, 32 cycles), not by their latency. */
static void accum_tq3(const tq_codec *c, const uint8_t *src, int n, float *acc,
		      const float *alpha, const float *p)
{
	const __m256 cb = _mm256_loadu_ps(c->cb.centroid);
	const size_t bb = c->block_bytes;
	float w[TQA_CHUNK * TQA_ROWS] __attribute__((aligned(32)));
	uint8_t ixb[TQA_CHUNK * D + 2 * IX_PAD] __attribute__((aligned(32)));
	uint8_t *ix = ixb + IX_PAD;

	memset(ixb, 0, IX_PAD);
	memset(ix + (size_t)n * D, 0, IX_PAD);
	for (int t = 0; t < n; t++) {
		const uint8_t *b = src + (size_t)t * bb;
		__m128 sc = _mm_set1_ps(hdr_scale(b));
		_mm_store_ps(w + 4 * t, _mm_mul_ps(_mm_loadu_ps(p + 4 * t), sc));
		tq3_ix128(b, ix + (size_t)t * D);
	}
	ix_passes(ix, n, w, acc, alpha, cb, 0);
}

/* tq4 values the same way.  The 16-entry codebook is symmetric bit for bit
 * (c[15 - i] = -c[i], tq_codebook.c), so c[i] = ±c[j] with j the low 3 bits
 * of i ^ (i >= 8 ? 7 : 0) and the sign bit 3 of i: the index byte is made
 * that once per chunk (the sign moved to the byte's bit 7), and per 8 dims
 * the passes take a vpmovsxbd, one vpermps over c[0..7] and a sign flip
 * (and + xor) instead of two vpermps and a blend. */
static inline __m256i tq4_fold(__m256i i, __m256i m8, __m256i mf7)
{
	/* i >= 8: i ^ 0xf7 = 0xf8 | (7 - (i & 7)), a negative byte whose low
	 * 3 bits index c[0..7] (vpermps reads no more); i < 8: i itself */
	return _mm256_xor_si256(i, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(i, m8), m8), mf7));
}

static void accum_tq4(const tq_codec *c, const uint8_t *src, int n, float *acc,
		      const float *alpha, const float *p)
{
	const __m256 cb = _mm256_loadu_ps(c->cb.centroid);
	const __m256i m15 = _mm256_set1_epi8(15), m8 = _mm256_set1_epi8(8), mf7 = _mm256_set1_epi8((char)0xf7);
	const size_t bb = c->block_bytes;
	float w[TQA_CHUNK * TQA_ROWS] __attribute__((aligned(32)));
	uint8_t ixb[TQA_CHUNK * D + 2 * IX_PAD] __attribute__((aligned(32)));
	uint8_t *ix = ixb + IX_PAD;

	memset(ixb, 0, IX_PAD);
	memset(ix + (size_t)n * D, 0, IX_PAD);
	for (int t = 0; t < n; t++) {
		const uint8_t *b = src + (size_t)t * bb;
		__m128 sc = _mm_set1_ps(hdr_scale(b));
		_mm_store_ps(w + 4 * t, _mm_mul_ps(_mm_loadu_ps(p + 4 * t), sc));
		const __m256i x0 = tq_load32(b + 4), x1 = tq_load32(b + 36);
		__m256i *o = (__m256i *)(void *)(ix + (size_t)t * D);
		_mm256_store_si256(o, tq4_fold(_mm256_and_si256(x0, m15), m8, mf7));
		_mm256_store_si256(o + 1, tq4_fold(_mm256_and_si256(x1, m15), m8, mf7));
		_mm256_store_si256(o + 2, tq4_fold(_mm256_and_si256(_mm256_srli_epi16(x0, 4), m15), m8, mf7));
		_mm256_store_si256(o + 3, tq4_fold(_mm256_and_si256(_mm256_srli_epi16(x1, 4), m15), m8, mf7));
	}
	ix_passes(ix, n, w, acc, alpha, cb, 1);
}

/* ---- integer key scoring at dim 128 --------------------------------------------
 * q·k for tq2/tq3/tq4 and q8 keys as 16-bit integer dot products (vpmaddwd:
 * 16 dims per instruction, twice an FMA's 8, and no float decode of the
 * keys): about half the cycles of the float path for tq4 keys on Zen 3.
 * qprep turns each query row into int16 q_j = rint(q_j · Q / max|q|) and,
 * for the centroid codecs, the codebook into int16 c_i = rint(c_i · C /
 * max|c|), split into a low-byte and a high-byte table, so one vpshufb pair
 * and one byte interleave turn 32 packed indices into 32 int16 centroids.
 *
 * Range: tq*: a lane of one 64-dim half sums 8 products (four vpmaddwd, or
 * a vpmaddwd and three vpdpwssd), converted once, and the halves are summed
 * in float.  8 · 23170² could leave int32, so qprep_rows bounds each lane's
 * sum of |q_j| · max|c| by 2^31 (lane_bound) and scales a row down below Q
 * where it would not fit: a rotated query is near Gaussian and its lanes
 * stay well inside, so rows keep their 15 bits; only a row with its large
 * entries crowded into one lane's dims loses some (test_attn's flat row
 * against a key of top centroids).  tq*o: the same, each half's sum times
 * its own scale.
 * q8 codes are exact (|code| <= 127), so its rows get the full 32767.
 *
 * Accuracy: rounding q and c to 15 bits perturbs a logit by about 1e-5 of
 * |q| |k| (measured: tests/bench/attn --quality prints it), far below the
 * 4-bit codecs' own error, and the output stays inside test_attn's oracle
 * tolerance (1e-4 of the row's norm; measured worst 5e-5 over its cases).
 *
 * The byte interleave works within 128-bit lanes, so 32 indices of dims
 * 32g .. 32g+31 come out as A = dims [0..7, 16..23] and B = [8..15, 24..31]
 * of the group; qprep stores the centroid codecs' query rows in that order.
 *
 * qp: int16 q[4][128] | float fac[4] (max|q_r| / (Q · C)) | CL[32] | CH[32] */
#define QP_FAC 1024
#define QP_CL  1040
#define QP_CH  1072
#define QLIM_TQ 23170.0f
#define CLIM_TQ 23170.0f
#define QLIM_Q8 32767.0f

static_assert(QP_CH + 32 <= TQA_QPREP_BYTES, "qprep layout fits");

/* The largest |sum| one int32 lane of DOT_KIND_TQ's two chains can reach
 * for the int16 row o against centroids of magnitude at most cmax: lane i
 * of chain c takes the words 32g + {0, 16} + 2i + {0, 1}, g = 2c, 2c + 1. */
static int64_t lane_bound(const int16_t *o, int cmax)
{
	int64_t worst = 0;

	for (int ch = 0; ch < 2; ch++)
		for (int i = 0; i < 8; i++) {
			int64_t sum = 0;
			for (int g = 2 * ch; g < 2 * ch + 2; g++)
				for (int k = 0; k < 32; k += 16)
					sum += abs(o[32 * g + k + 2 * i]) + abs(o[32 * g + k + 2 * i + 1]);
			if (sum > worst)
				worst = sum;
		}
	return worst * cmax;
}

/* rows q [4][128] -> int16 [4][128]; perm: the centroid codecs' order;
 * cmax > 0: DOT_KIND_TQ's rows, scaled down where a lane could leave int32 */
static void qprep_rows(const float *q, int perm, float qlim, float csc, int cmax, uint8_t *qp)
{
	float *fac = (float *)(void *)(qp + QP_FAC);

	for (int r = 0; r < TQA_ROWS; r++) {
		const float *qr = q + r * D;
		__m256 mx = _mm256_setzero_ps();
		const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
		for (int j = 0; j < D; j += 8)
			mx = _mm256_max_ps(mx, _mm256_and_ps(absm, _mm256_loadu_ps(qr + j)));
		__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
		m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
		m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
		float m = _mm_cvtss_f32(m4);
		/* max 0: every product is 0.  max inf (a scaled row beyond float
		 * range): the factor is inf, the scores inf or NaN, and the row
		 * comes out NaN as the softmax contract says.  A row so small
		 * that Q / max overflows (max < 7e-35: its logits are 0 to float
		 * precision) takes 2^100, finite, so the bound below ends. */
		float sqs = m > 0.0f && m <= 3.4e38f ? fminf(qlim / m, 0x1p100f) : 0.0f;
		int16_t *o = (int16_t *)(void *)qp + r * D;
again:;
		const __m256 sq = _mm256_set1_ps(sqs);
		for (int j = 0; j < D; j += 32) {
			__m256i v[4];
			for (int i = 0; i < 4; i++)
				v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(qr + j + 8 * i), sq));
			/* natural order: n0 = dims j..j+15, n1 = j+16..j+31 */
			__m256i n0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[0], v[1]), 0xD8);
			__m256i n1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[2], v[3]), 0xD8);
			if (perm) {
				__m256i a = _mm256_permute2x128_si256(n0, n1, 0x20);
				__m256i b = _mm256_permute2x128_si256(n0, n1, 0x31);
				n0 = a;
				n1 = b;
			}
			_mm256_storeu_si256((__m256i *)(void *)(o + j), n0);
			_mm256_storeu_si256((__m256i *)(void *)(o + j + 16), n1);
		}
		if (cmax > 0 && sqs > 0.0f) {
			const int64_t b = lane_bound(o, cmax);
			if (b > INT32_MAX) {
				sqs *= (float)((double)INT32_MAX / (double)b) * 0.999f;
				goto again;
			}
		}
		fac[r] = sqs > 0.0f ? 1.0f / (sqs * csc) : m / (qlim * csc);
	}
}

/* Entries from..from+15 of a codebook of `levels` (0 past them) times csc
 * as int16, split into a low-byte and a high-byte vpshufb table (32 bytes
 * each: the 16 entries in both 128-bit lanes). */
static void byte_tables(const tq_codebook *cb, int from, float csc, uint8_t *lo, uint8_t *hi)
{
	for (int i = 0; i < 16; i++) {
		const int v = from + i < cb->levels ? (int)lrintf(cb->centroid[from + i] * csc) : 0;
		const uint16_t u = (uint16_t)(int16_t)v;
		lo[i] = lo[16 + i] = (uint8_t)u;
		hi[i] = hi[16 + i] = (uint8_t)(u >> 8);
	}
}

static void qprep_cb(const tq_codec *c, const float *q, void *qpv)
{
	uint8_t *qp = qpv;
	const float csc = tqa_cb_int_scale(&c->cb, CLIM_TQ);

	byte_tables(&c->cb, 0, csc, qp + QP_CL, qp + QP_CH);
	qprep_rows(q, 1, QLIM_TQ, csc, (int)CLIM_TQ, qp);
}

static void qprep_q8(const tq_codec *c, const float *q, void *qp)
{
	(void)c;
	qprep_rows(q, 0, QLIM_Q8, 1.0f, 0, qp);
}

/* 32 indices (bytes < 16) -> int16 centroids, A/B halves as above */
#define CENT(ix, ka, kb)                                                                    \
	do {                                                                                \
		const __m256i l_ = _mm256_shuffle_epi8(cl, ix), h_ = _mm256_shuffle_epi8(ch, ix); \
		ka = _mm256_unpacklo_epi8(l_, h_);                                          \
		kb = _mm256_unpackhi_epi8(l_, h_);                                          \
	} while (0)

/* group g (dims 32g .. 32g+31) of block b as 32 index bytes */
#define IX_tq4(b, g) ((g) < 2 ? _mm256_and_si256(x##b[(g)], m15)                               \
	: _mm256_and_si256(_mm256_srli_epi16(x##b[(g) - 2], 4), m15))
#define IX_tq3(b, g) _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x##b[0], 2 * (g)), m3),   \
	_mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi64(y##b, _mm256_set_epi64x(              \
		2 * (g) + 1, 2 * (g) + 1, 2 * (g), 2 * (g))), m1), 2))
#define IX_tq2(b, g) _mm256_and_si256(_mm256_srli_epi16(x##b[0], 2 * (g)), m3)
#define XL_tq4(b, p) const __m256i x##b[2] = { _mm256_loadu_si256((const __m256i *)(const void *)((p) + 4)), \
					      _mm256_loadu_si256((const __m256i *)(const void *)((p) + 36)) }
#define XL_tq3(b, p) const __m256i x##b[1] = { _mm256_loadu_si256((const __m256i *)(const void *)((p) + 4)) }; \
	const __m256i y##b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)((p) + 36)))
#define XL_tq2(b, p) const __m256i x##b[1] = { _mm256_loadu_si256((const __m256i *)(const void *)((p) + 4)) }

static inline __m256i qrow(const int16_t *qi, int off)
{
	return _mm256_load_si256((const __m256i *)(const void *)(qi + off));
}

/* tq4o / tq3o at d = 128 (tq_layout.h): two bf16 scales, the first half's
 * planes (64 dims at B + 1 bits), the second's (64 at B - 1).  Each half's
 * codebook on its own int16 scale (its largest centroid at CLIM_TQ), as
 * lo / hi byte tables of 16 entries; tq4o's 32-entry first half is two
 * such tables, each index looked up in both (vpshufb zeroes the lanes
 * whose index byte has bit 7 set: ix + 0x70 saturated for entries 0-15,
 * ix - 16 for 16-31) and the results or'ed.  The halves' scales (divided
 * by their codebook scales) weigh each group's float sum.
 * qp: as above, then A0L A0H A1L A1H BL BH [32 bytes each] | float inv[2] */
#define QP_TQO 1104
#define QP_TQO_INV (QP_TQO + 6 * 32)
static_assert(QP_CH + 32 <= QP_TQO && QP_TQO_INV + 8 <= TQA_QPREP_BYTES, "qprep layout fits");

static void qprep_tqo(const tq_codec *c, const float *q, void *qpv)
{
	uint8_t *qp = qpv;
	const float ca = tqa_cb_int_scale(&c->cb, CLIM_TQ), cb = tqa_cb_int_scale(&c->cb_b, CLIM_TQ);
	float *inv = (float *)(void *)(qp + QP_TQO_INV);

	byte_tables(&c->cb, 0, ca, qp + QP_TQO, qp + QP_TQO + 32);        /* A0L A0H */
	byte_tables(&c->cb, 16, ca, qp + QP_TQO + 64, qp + QP_TQO + 96);  /* A1L A1H */
	byte_tables(&c->cb_b, 0, cb, qp + QP_TQO + 128, qp + QP_TQO + 160); /* BL BH */
	inv[0] = 1.0f / ca;
	inv[1] = 1.0f / cb;
	qprep_rows(q, 1, QLIM_TQ, 1.0f, (int)CLIM_TQ, qp); /* a half's 8 products per lane */
}

/* 32 indices (bytes < 32) -> int16 centroids of a 32-entry table */
#define CENT32(ix, ka, kb)                                                                  \
	do {                                                                                \
		const __m256i i0_ = _mm256_adds_epu8(ix, c70), i1_ = _mm256_sub_epi8(ix, c16);   \
		const __m256i l_ = _mm256_or_si256(_mm256_shuffle_epi8(a0l, i0_), _mm256_shuffle_epi8(a1l, i1_)); \
		const __m256i h_ = _mm256_or_si256(_mm256_shuffle_epi8(a0h, i0_), _mm256_shuffle_epi8(a1h, i1_)); \
		ka = _mm256_unpacklo_epi8(l_, h_);                                          \
		kb = _mm256_unpackhi_epi8(l_, h_);                                          \
	} while (0)
#define CENT16(ix, ka, kb, tl, th)                                                          \
	do {                                                                                \
		const __m256i l_ = _mm256_shuffle_epi8(tl, ix), h_ = _mm256_shuffle_epi8(th, ix); \
		ka = _mm256_unpacklo_epi8(l_, h_);                                          \
		kb = _mm256_unpackhi_epi8(l_, h_);                                          \
	} while (0)

/* Integer key scoring in two steps (as the AVX-512 path: a chunk's keys
 * can be prepared once for many row blocks, with the direct scorers'
 * bits):
 *   load  one block -> k[8]: per 32-dim group g its centroids ka, kb (the
 *         A / B dims above) as k[2g], k[2g + 1] — q8: its codes of dims
 *         [16j, 16j + 16) as k[j] — and its scales sa, sb (tq*o: each
 *         half's bf16 scale over its codebook scale; others: the block's);
 *   dot   k[8] x the 4 rows into f[ao .. ao + 3]. */
enum { KIND_TQ, KIND_Q8, KIND_TQO };

#define LOAD_KIND_TQ(C, b, k, sa, sb)                                                       \
	do {                                                                                \
		XL_##C(0, b);                                                               \
		_Pragma("GCC unroll 4")                                                     \
		for (int g = 0; g < 4; g++)                                                 \
			CENT(IX_##C(0, g), k[2 * g], k[2 * g + 1]);                         \
		sa = sb = hdr_scale(b);                                                     \
	} while (0)
#define LOAD_KIND_Q8(C, b, k, sa, sb)                                                       \
	do {                                                                                \
		_Pragma("GCC unroll 8")                                                     \
		for (int j = 0; j < 8; j++)                                                 \
			k[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)((b) + 4 + 16 * j))); \
		sa = sb = hdr_scale(b);                                                     \
	} while (0)
#define LOAD_KIND_TQO(C, b, k, sa, sb) LOAD_TQO_##C(b, k, sa, sb)
#define LOAD_TQO_tq4o(b, k, sa, sb) LOAD_TQO(4, b, k, sa, sb)
#define LOAD_TQO_tq3o(b, k, sa, sb) LOAD_TQO(3, b, k, sa, sb)
#define LOAD_TQO(O, b, k, sa, sb)                                                           \
	do {                                                                                \
		uint16_t hd_[2];                                                            \
		memcpy(hd_, (b), 4);                                                        \
		sa = tq_bf16_to_f32(hd_[0]) * inv[0];                                                \
		sb = tq_bf16_to_f32(hd_[1]) * inv[1];                                                \
		const __m256i x_ = _mm256_loadu_si256((const __m256i *)(const void *)((b) + 4)); \
		__m256i i0, i1, i2, i3;                                                     \
		i0 = _mm256_and_si256(x_, m15);                                             \
		i1 = _mm256_and_si256(_mm256_srli_epi16(x_, 4), m15);                       \
		const __m256i w_ = _mm256_broadcastsi128_si256(_mm_loadu_si128(             \
			(const __m128i *)(const void *)((b) + (O == 4 ? 44 : 36))));       \
		i2 = _mm256_and_si256(_mm256_srlv_epi64(w_, sw0), m3);                      \
		i3 = _mm256_and_si256(_mm256_srlv_epi64(w_, sw1), m3);                      \
		if (O == 4) {                                                               \
			uint64_t ya_, yb_;                                                  \
			memcpy(&ya_, (b) + 36, 8);                                          \
			memcpy(&yb_, (b) + 60, 8);                                          \
			const __m256i y1_ = _mm256_set1_epi64x((long long)ya_);             \
			const __m256i y2_ = _mm256_set1_epi64x((long long)yb_);             \
			i0 = _mm256_or_si256(i0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi64(y1_, sh0), m1), 4)); \
			i1 = _mm256_or_si256(i1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi64(y1_, sh1), m1), 4)); \
			i2 = _mm256_or_si256(i2, _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi64(y2_, sh0), m1), 2)); \
			i3 = _mm256_or_si256(i3, _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi64(y2_, sh1), m1), 2)); \
			CENT32(i0, k[0], k[1]);                                             \
			CENT32(i1, k[2], k[3]);                                             \
		} else {                                                                    \
			CENT16(i0, k[0], k[1], a0l, a0h);                                   \
			CENT16(i1, k[2], k[3], a0l, a0h);                                   \
		}                                                                           \
		CENT16(i2, k[4], k[5], bl, bh);                                             \
		CENT16(i3, k[6], k[7], bl, bh);                                             \
	} while (0)

/* The int32 sums of int16 products: acc + a·b by pairs (ACC), and two
 * pairs' (PAIR) — vpmaddwd then vpaddd, or with AVX-VNNI (Alder Lake,
 * Sierra Forest, Zen 5 and later; picked at run time) vpdpwssd: the same
 * integer sums (no overflow, no saturation: see Range above), so the same
 * bits, one instruction fewer per pair.  The scorers below are built once
 * with each (PAIR / ACC defined before their instances). */
#define ACC_PLAIN(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#define PAIR_PLAIN(a0, b0, a1, b1) _mm256_add_epi32(_mm256_madd_epi16(a0, b0), _mm256_madd_epi16(a1, b1))
#define ACC_VNNI(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#define PAIR_VNNI(a0, b0, a1, b1) _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(a0, b0), a1, b1)
#define VNNI __attribute__((target("avxvnni")))

/* tq*: each half of the row (8 products per lane, bounded by qprep_rows)
 * summed in int32 and converted once */
#define DOT4_PLAIN(a0, b0, a1, b1, a2, b2, a3, b3)                                          \
	_mm256_add_epi32(PAIR_PLAIN(a0, b0, a1, b1), PAIR_PLAIN(a2, b2, a3, b3))
#define DOT4_VNNI(a0, b0, a1, b1, a2, b2, a3, b3)                                           \
	_mm256_dpwssd_avx_epi32(_mm256_dpwssd_avx_epi32(PAIR_VNNI(a0, b0, a1, b1), a2, b2), a3, b3)
#define DOT_HALF(k, r, h)                                                                   \
	_mm256_cvtepi32_ps(DOT4(k[4 * (h)], qrow(qi, (r) * D + 64 * (h)), k[4 * (h) + 1],         \
				qrow(qi, (r) * D + 64 * (h) + 16), k[4 * (h) + 2],                   \
				qrow(qi, (r) * D + 64 * (h) + 32), k[4 * (h) + 3],                   \
				qrow(qi, (r) * D + 64 * (h) + 48)))
#define DOT_KIND_TQ(k, sa, sb)                                                              \
	_Pragma("GCC unroll 4")                                                             \
	for (int r = 0; r < 4; r++)                                                         \
		f[r + ao] = _mm256_add_ps(DOT_HALF(k, r, 0), DOT_HALF(k, r, 1))
/* q8: a lane sums 16 products of at most 32767 · 127: int32 holds them */
#define DOT_KIND_Q8(k, sa, sb)                                                              \
	do {                                                                                \
		__m256i a_[4];                                                              \
		_Pragma("GCC unroll 4")                                                     \
		for (int r = 0; r < 4; r++)                                                 \
			a_[r] = _mm256_setzero_si256();                                     \
		_Pragma("GCC unroll 8")                                                     \
		for (int j = 0; j < 8; j++)                                                 \
			_Pragma("GCC unroll 4")                                             \
			for (int r = 0; r < 4; r++)                                         \
				a_[r] = ACC(a_[r], k[j], qrow(qi, r * D + 16 * j));              \
		_Pragma("GCC unroll 4")                                                     \
		for (int r = 0; r < 4; r++)                                                 \
			f[ao + r] = _mm256_cvtepi32_ps(a_[r]);                              \
	} while (0)
/* tq*o: each half's int32 sum (a tq* half's: 8 products per lane, bounded
 * by qprep_rows) converted once and times the half's scale */
#define DOT_KIND_TQO(k, sa, sb)                                                             \
	do {                                                                                \
		const __m256 sav_ = _mm256_set1_ps(sa), sbv_ = _mm256_set1_ps(sb);         \
		_Pragma("GCC unroll 4")                                                     \
		for (int r = 0; r < 4; r++)                                                 \
			f[r + ao] = _mm256_fmadd_ps(DOT_HALF(k, r, 0), sav_,                \
						    _mm256_mul_ps(DOT_HALF(k, r, 1), sbv_)); \
	} while (0)

/* The prepared tile (TQA_KTILE_BYTES): per token its k[8] (256 bytes),
 * then per token sa, sb. */
#define KT_K(kt, t) ((const __m256i *)(const void *)((const uint8_t *)(kt) + (size_t)(t) * 256))
#define KT_S(kt) ((float *)(void *)((uint8_t *)(kt) + TQA_CHUNK * 256))
static_assert(TQA_CHUNK * (256 + 8) <= TQA_KTILE_BYTES, "prepared key tile fits");

#define SCORER_HEAD                                                                           \
	const uint8_t *qp = (const uint8_t *)(const void *)qf;                                \
	const int16_t *qi = (const int16_t *)(const void *)qp;                                \
	const __m256i cl = _mm256_loadu_si256((const __m256i *)(const void *)(qp + QP_CL));  \
	const __m256i ch = _mm256_loadu_si256((const __m256i *)(const void *)(qp + QP_CH));  \
	const __m256i m15 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1); \
	const __m128 fac = _mm_loadu_ps((const float *)(const void *)(qp + QP_FAC));          \
	const __m256 fac2 = _mm256_set_m128(fac, fac);                                        \
	(void)cl; (void)ch; (void)m15; (void)m3; (void)m1; (void)fac2
/* what LOAD_TQO reads besides */
#define TQO_HEAD                                                                              \
	const uint8_t *tb = qp + QP_TQO;                                                      \
	const __m256i a0l = _mm256_loadu_si256((const __m256i *)(const void *)tb);           \
	const __m256i a0h = _mm256_loadu_si256((const __m256i *)(const void *)(tb + 32));    \
	const __m256i a1l = _mm256_loadu_si256((const __m256i *)(const void *)(tb + 64));    \
	const __m256i a1h = _mm256_loadu_si256((const __m256i *)(const void *)(tb + 96));    \
	const __m256i bl = _mm256_loadu_si256((const __m256i *)(const void *)(tb + 128));    \
	const __m256i bh = _mm256_loadu_si256((const __m256i *)(const void *)(tb + 160));    \
	const float *inv = (const float *)(const void *)(qp + QP_TQO_INV);                    \
	const __m256i c70 = _mm256_set1_epi8(0x70), c16 = _mm256_set1_epi8(16);               \
	/* qword k of a group: bytes 8k .. 8k+7; the crumb plane's lanes by 16 */             \
	const __m256i sh0 = _mm256_set_epi64x(3, 2, 1, 0), sh1 = _mm256_set_epi64x(7, 6, 5, 4); \
	const __m256i sw0 = _mm256_set_epi64x(2, 2, 0, 0), sw1 = _mm256_set_epi64x(6, 6, 4, 4); \
	(void)a1l; (void)a1h; (void)c70; (void)c16; (void)sh0; (void)sh1
#define HEAD_KIND_TQ ((void)0)
#define HEAD_KIND_Q8 ((void)0)
#define HEAD_KIND_TQO TQO_HEAD

/* 2 tokens x 4 rows -> s: times the rows' factors and (not tq*o) the tokens' scales */
#define FINISH(K, s0, s1)                                                                     \
	do {                                                                                  \
		__m256 z = _mm256_mul_ps(reduce8(f), fac2);                                   \
		if (K != KIND_TQO)                                                            \
			z = _mm256_mul_ps(z, _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0))); \
		if (two)                                                                      \
			_mm256_storeu_ps(s + t * TQA_ROWS, z);                                \
		else                                                                          \
			_mm_storeu_ps(s + t * TQA_ROWS, _mm256_castps256_ps128(z));           \
	} while (0)

/* scores_d128 of codec C (dot kind K): 2 tokens at a time */
#define DEF_ISCORES(C, K, NAME, ATTR)                                                         \
ATTR static void NAME(const tq_codec *c, const uint8_t *src, int n, const float *qf, float *s) \
{                                                                                             \
	SCORER_HEAD;                                                                          \
	HEAD_##K;                                                                             \
	const size_t bb = c->block_bytes;                                                     \
	for (int t = 0; t < n; t += 2) {                                                      \
		TQA_PF_STEP(); /* paced prefetch: a line per 2 tokens */                      \
		const int two = t + 1 < n;                                                    \
		const uint8_t *b0 = src + (size_t)t * bb, *b1 = two ? b0 + bb : b0;           \
		__m256 f[8];                                                                  \
		_Pragma("GCC unroll 8")                                                       \
		for (int i = 0; i < 8; i++)                                                   \
			f[i] = _mm256_setzero_ps();                                           \
		__m256i k0[8], k1[8];                                                         \
		float sa0, sb0, sa1, sb1;                                                     \
		LOAD_##K(C, b0, k0, sa0, sb0);                                                \
		LOAD_##K(C, b1, k1, sa1, sb1);                                                \
		int ao = 0;                                                                   \
		DOT_##K(k0, sa0, sb0);                                                        \
		ao = 4;                                                                       \
		DOT_##K(k1, sa1, sb1);                                                        \
		(void)ao; (void)sb0; (void)sb1;                                               \
		FINISH(K, sa0, sa1);                                                          \
	}                                                                                     \
}

/* the same from the chunk's prepared tile (scores_ktile_d128) */
#define DEF_TSCORES(K, NAME, ATTR)                                                            \
ATTR static void NAME(const tq_codec *c, const void *kt, int n, const float *qf, float *s)   \
{                                                                                             \
	SCORER_HEAD;                                                                          \
	(void)c;                                                                              \
	for (int t = 0; t < n; t += 2) {                                                      \
		TQA_PF_STEP(); /* paced prefetch: a line per 2 tokens */                      \
		const int two = t + 1 < n, u = two ? t + 1 : t;                              \
		__m256 f[8];                                                                  \
		_Pragma("GCC unroll 8")                                                       \
		for (int i = 0; i < 8; i++)                                                   \
			f[i] = _mm256_setzero_ps();                                           \
		const __m256i *k0 = KT_K(kt, t), *k1 = KT_K(kt, u);                           \
		const float sa0 = KT_S(kt)[2 * t], sb0 = KT_S(kt)[2 * t + 1];                 \
		const float sa1 = KT_S(kt)[2 * u], sb1 = KT_S(kt)[2 * u + 1];                 \
		int ao = 0;                                                                   \
		DOT_##K(k0, sa0, sb0);                                                        \
		ao = 4;                                                                       \
		DOT_##K(k1, sa1, sb1);                                                        \
		(void)ao; (void)sb0; (void)sb1;                                               \
		FINISH(K, sa0, sa1);                                                          \
	}                                                                                     \
}

/* ktile_d128 of codec C */
#define DEF_KTILE(C, K)                                                                       \
static void ktile_##C(const tq_codec *c, const uint8_t *src, int n, const void *qv, void *kt) \
{                                                                                             \
	const float *qf = (const float *)qv;                                                  \
	SCORER_HEAD;                                                                          \
	HEAD_##K;                                                                             \
	(void)qi;                                                                             \
	for (int t = 0; t < n; t++) {                                                         \
		const uint8_t *b = src + (size_t)t * c->block_bytes;                          \
		__m256i k_[8];                                                                \
		float sa_, sb_;                                                               \
		LOAD_##K(C, b, k_, sa_, sb_);                                                 \
		_Pragma("GCC unroll 8")                                                       \
		for (int j = 0; j < 8; j++)                                                   \
			_mm256_store_si256((__m256i *)(void *)((uint8_t *)kt + (size_t)t * 256 + 32 * j), k_[j]); \
		KT_S(kt)[2 * t] = sa_;                                                        \
		KT_S(kt)[2 * t + 1] = sb_;                                                    \
	}                                                                                     \
}

/* q8 direct: the two tokens' codes interleaved step by step (16 of the 8
 * codes' registers at once spill with AVX2's 16): integer sums, so the
 * same bits as DOT_KIND_Q8's order */
#define DEF_ISCORES_Q8(NAME, ATTR)                                                            \
ATTR static void NAME(const tq_codec *c, const uint8_t *src, int n, const float *qf, float *s) \
{                                                                                             \
	SCORER_HEAD;                                                                          \
	const size_t bb = c->block_bytes;                                                     \
	for (int t = 0; t < n; t += 2) {                                                      \
		TQA_PF_STEP(); /* paced prefetch: a line per 2 tokens */                      \
		const int two = t + 1 < n;                                                    \
		const uint8_t *b0 = src + (size_t)t * bb, *b1 = two ? b0 + bb : b0;           \
		__m256i a[8];                                                                 \
		_Pragma("GCC unroll 8")                                                       \
		for (int i = 0; i < 8; i++)                                                   \
			a[i] = _mm256_setzero_si256();                                        \
		_Pragma("GCC unroll 8")                                                       \
		for (int k = 0; k < D / 16; k++) {                                            \
			const __m256i k0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(b0 + 4 + 16 * k))); \
			const __m256i k1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(b1 + 4 + 16 * k))); \
			_Pragma("GCC unroll 4")                                               \
			for (int r = 0; r < 4; r++) {                                         \
				const __m256i qv = qrow(qi, r * D + 16 * k);                  \
				a[r] = ACC(a[r], k0, qv);                                     \
				a[4 + r] = ACC(a[4 + r], k1, qv);                             \
			}                                                                     \
		}                                                                             \
		__m256 f[8];                                                                  \
		_Pragma("GCC unroll 8")                                                       \
		for (int i = 0; i < 8; i++)                                                   \
			f[i] = _mm256_cvtepi32_ps(a[i]);                                      \
		FINISH(KIND_Q8, hdr_scale(b0), hdr_scale(b1));                                \
	}                                                                                     \
}

#define PAIR PAIR_PLAIN
#define ACC ACC_PLAIN
#define DOT4 DOT4_PLAIN
DEF_ISCORES(tq4, KIND_TQ, iscores_tq4, )
DEF_ISCORES(tq3, KIND_TQ, iscores_tq3, )
DEF_ISCORES(tq2, KIND_TQ, iscores_tq2, )
DEF_ISCORES_Q8(iscores_q8, )
DEF_ISCORES(tq4o, KIND_TQO, iscores_tq4o, )
DEF_ISCORES(tq3o, KIND_TQO, iscores_tq3o, )
DEF_TSCORES(KIND_TQ, tscores_tq, )
DEF_TSCORES(KIND_Q8, tscores_q8, )
DEF_TSCORES(KIND_TQO, tscores_tqo, )
#undef PAIR
#undef ACC
#undef DOT4
#define DOT4 DOT4_VNNI
#define PAIR PAIR_VNNI
#define ACC ACC_VNNI
DEF_ISCORES(tq4, KIND_TQ, iscores_vnni_tq4, VNNI)
DEF_ISCORES(tq3, KIND_TQ, iscores_vnni_tq3, VNNI)
DEF_ISCORES(tq2, KIND_TQ, iscores_vnni_tq2, VNNI)
DEF_ISCORES_Q8(iscores_vnni_q8, VNNI)
DEF_ISCORES(tq4o, KIND_TQO, iscores_vnni_tq4o, VNNI)
DEF_ISCORES(tq3o, KIND_TQO, iscores_vnni_tq3o, VNNI)
DEF_TSCORES(KIND_TQ, tscores_vnni_tq, VNNI)
DEF_TSCORES(KIND_Q8, tscores_vnni_q8, VNNI)
DEF_TSCORES(KIND_TQO, tscores_vnni_tqo, VNNI)
#undef PAIR
#undef ACC
#undef DOT4
DEF_KTILE(tq4, KIND_TQ)
DEF_KTILE(tq3, KIND_TQ)
DEF_KTILE(tq2, KIND_TQ)
DEF_KTILE(q8, KIND_Q8)
DEF_KTILE(tq4o, KIND_TQO)
DEF_KTILE(tq3o, KIND_TQO)

DEF_SCORES(f16)
DEF_SCORES(f32)
DEF_ACCUM(tq2)
DEF_ACCUM(q8)
DEF_ACCUM(f16)
DEF_ACCUM(f32)
#undef D

#define OPS(ISC, TSC)                                                                         \
	{                                                                                       \
		.isa = TQ_ISA_AVX2,                                                             \
		.pf_paced = 1,                                                                  \
		.decode = decode_avx2,                                                          \
		.scores = scores_avx2,                                                          \
		.softmax = softmax_avx2,                                                        \
		.accum = accum_avx2,                                                            \
		.scores_d128 = {                                                                \
			[TQ_CODEC_TQ4] = ISC##tq4, [TQ_CODEC_TQ3] = ISC##tq3, [TQ_CODEC_TQ2] = ISC##tq2, \
			[TQ_CODEC_Q8] = ISC##q8, [TQ_CODEC_F16] = scores_f16, [TQ_CODEC_F32] = scores_f32, \
			[TQ_CODEC_TQ4O] = ISC##tq4o, [TQ_CODEC_TQ3O] = ISC##tq3o,              \
		},                                                                              \
		.qprep_d128 = {                                                                 \
			[TQ_CODEC_TQ4] = qprep_cb, [TQ_CODEC_TQ3] = qprep_cb, [TQ_CODEC_TQ2] = qprep_cb, \
			[TQ_CODEC_Q8] = qprep_q8, [TQ_CODEC_TQ4O] = qprep_tqo, [TQ_CODEC_TQ3O] = qprep_tqo, \
		},                                                                              \
		.ktile_d128 = {                                                                 \
			[TQ_CODEC_TQ4] = ktile_tq4, [TQ_CODEC_TQ3] = ktile_tq3, [TQ_CODEC_TQ2] = ktile_tq2, \
			[TQ_CODEC_Q8] = ktile_q8, [TQ_CODEC_TQ4O] = ktile_tq4o, [TQ_CODEC_TQ3O] = ktile_tq3o, \
		},                                                                              \
		.scores_ktile_d128 = {                                                          \
			[TQ_CODEC_TQ4] = TSC##tq, [TQ_CODEC_TQ3] = TSC##tq, [TQ_CODEC_TQ2] = TSC##tq, \
			[TQ_CODEC_Q8] = TSC##q8, [TQ_CODEC_TQ4O] = TSC##tqo, [TQ_CODEC_TQ3O] = TSC##tqo, \
		},                                                                              \
		.accum_d128 = {                                                                 \
			[TQ_CODEC_TQ4] = accum_tq4, [TQ_CODEC_TQ3] = accum_tq3, [TQ_CODEC_TQ2] = accum_tq2, \
			[TQ_CODEC_Q8] = accum_q8, [TQ_CODEC_F16] = accum_f16, [TQ_CODEC_F32] = accum_f32, \
		},                                                                              \
		.accum_d128_perm = { [TQ_CODEC_TQ4] = acc_order2, [TQ_CODEC_TQ3] = acc_order2 }, \
	}

static const struct tqa_ops ops = OPS(iscores_, tscores_), ops_vnni = OPS(iscores_vnni_, tscores_vnni_);

/* With AVX-VNNI the integer key scoring saves one instruction per pair of
 * products (BENCHMARKS.md 2), the same bits. */
const struct tqa_ops *tqa_ops_avx2(void)
{
	return __builtin_cpu_supports("avxvnni") ? &ops_vnni : &ops;
}

const struct tqa_ops *tqa_ops_avx2_vnni(int vnni)
{
	return vnni ? (__builtin_cpu_supports("avxvnni") ? &ops_vnni : NULL) : &ops;
}
#endif /* __x86_64__ */
