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
#include <string.h>

#include "tq_attn_internal.h"

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

static const float *decode_avx2(const tq_codec *c, const uint8_t *src, int n,
				float *tile, float *scale)
{
	const int d = c->dim;
	const size_t bb = c->block_bytes;

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

/* 2^x, relative error < 2e-7; x <= -127 gives 0. */
static inline __m256 exp2_avx2(__m256 x)
{
	__m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-127.0f), _CMP_LE_OQ);
	x = _mm256_max_ps(x, _mm256_set1_ps(-127.0f));
	x = _mm256_min_ps(x, _mm256_set1_ps(127.0f));
	__m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 f = _mm256_sub_ps(x, n);
	__m256 p = _mm256_set1_ps(1.525273380405984e-05f);
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381606e-04f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-03f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618129107628477e-03f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550410866482158e-02f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402265069591007e-01f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471805599453e-01f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
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

static const struct tqa_ops ops = {
	.isa = TQ_ISA_AVX2,
	.decode = decode_avx2,
	.scores = scores_avx2,
	.softmax = softmax_avx2,
	.accum = accum_avx2,
};

const struct tqa_ops *tqa_ops_avx2(void)
{
	return &ops;
}
#endif /* __x86_64__ */
