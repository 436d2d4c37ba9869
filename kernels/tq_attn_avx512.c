/* tq_attn_avx512.c — AVX-512 (F/BW/DQ/VL) inner loops of the fused attention
 * (contracts in tq_attn_internal.h).  Built with the avx512 flags of the
 * Makefile; compiles to a NULL getter on other targets.
 *
 * Decoders turn the packed indices into 16-wide index vectors and look the
 * centroids up in registers with vpermps (which reads only the low 4 index
 * bits, so 2- and 3-bit codebooks are replicated to 16 entries and the bits
 * above the index need no masking).  Scores: 4 tokens x 4 rows of 16-lane
 * partial dot products, then one transposed reduction of the 16 vectors to
 * the 16 scores; at d = 128 the centroid codecs' and q8's keys are scored
 * as 16-bit integer dot products instead (see "integer key scoring" below).
 * Accumulation: 4 rows x 64 dims in registers per pass over the value tile,
 * weights broadcast from memory.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tq_attn_internal.h"
#include "tq_avx2.h"

static inline __m512i zext16(const uint8_t *p)
{
	return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
}

static inline __m512i srl(__m512i v, int n)
{
	return _mm512_srl_epi32(v, _mm_cvtsi32_si128(n));
}

/* c[v & 31] from a codebook of up to 32 entries in t0, t1: one permute
 * (of two tables past 16 entries) */
static inline __attribute__((always_inline)) __m512 cb32_get(__m512 t0, __m512 t1, int levels, __m512i v)
{
	return levels > 16 ? _mm512_permutex2var_ps(t0, v, t1) : _mm512_permutexvar_ps(v, t0);
}

/* o[j] = s * cb[idx[j]], j < h (a multiple of 8), the same product as the
 * portable decoder */
static void tqo_lookup_avx512(const tq_codebook *cb, float s, const uint8_t *idx, int h, float *o)
{
	const __m512 t0 = _mm512_loadu_ps(cb->centroid), t1 = _mm512_loadu_ps(cb->centroid + 16);
	const __m512 sv = _mm512_set1_ps(s);

	for (int k = 0; k < h; k += 16) {
		const __mmask16 m = h - k >= 16 ? 0xffff : (__mmask16)((1u << (h - k)) - 1u);
		__m512i v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, idx + k));
		_mm512_mask_storeu_ps(o + k, m, _mm512_mul_ps(cb32_get(t0, t1, cb->levels, v), sv));
	}
}

/* The planes of a half of h values (h a power of two, 32 <= h <= 256) into
 * index vectors acc[h/16] (tq_layout.h): a plane of width w has stride
 * S = h*w/8, a power of two, and byte b of it holds value b + s*S at bits
 * s*w.  S >= 16: each 16-byte run of a segment is 16 consecutive values,
 * one shift for all.  S = 4 or 8: the plane repeated to 16 bytes puts byte
 * (16g + j) mod S in lane j of group g, shifted lane by lane by
 * w*((16g + j)/S).  w is a constant at every call (inlined). */
static inline __attribute__((always_inline)) void tqo_plane(__m512i *acc, const uint8_t *pl, int h, int w,
							   int off)
{
	const int S = h * w / 8;
	const __m512i m = _mm512_set1_epi32((1 << w) - 1);

	if (S >= 16) {
		const int nseg = 8 / w; /* out of the loop's test: UBSan's division check there voided the unroll pragma */
		_Pragma("GCC unroll 16")
		for (int seg = 0; seg < nseg; seg++)
			_Pragma("GCC unroll 16")
			for (int b = 0; b < S; b += 16) {
				__m512i v = _mm512_and_si512(srl(zext16(pl + b), w * seg), m);
				acc[(seg * S + b) / 16] = _mm512_or_si512(acc[(seg * S + b) / 16], _mm512_slli_epi32(v, off));
			}
		return;
	}
	uint64_t u = 0;
	if (S == 8) {
		memcpy(&u, pl, 8);
	} else {
		uint32_t u4;
		memcpy(&u4, pl, 4);
		u = (uint64_t)u4 * 0x100000001ull;
	}
	const __m512i r = _mm512_cvtepu8_epi32(_mm_set1_epi64x((long long)u));
	const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
	__m512i sh = _mm512_mullo_epi32(_mm512_srli_epi32(iota, S == 8 ? 3 : 2), _mm512_set1_epi32(w));
	const __m512i step = _mm512_set1_epi32(w * 16 / S);
	_Pragma("GCC unroll 16")
	for (int g = 0; g < h / 16; g++, sh = _mm512_add_epi32(sh, step))
		acc[g] = _mm512_or_si512(acc[g], _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(r, sh), m), off));
}

/* o[j] = s * cb[idx_j] for a half whose h is a power of two in [32, 256]
 * (a constant where tqo_half_direct calls it) */
static inline __attribute__((always_inline)) void tqo_half_h(const tq_codebook *cb, float s, const uint8_t *pl,
							    int h, float *o)
{
	__m512i acc[TQ_DIM_MAX / 2 / 16];
	const __m512 t0 = _mm512_loadu_ps(cb->centroid), t1 = _mm512_loadu_ps(cb->centroid + 16);
	const __m512 sv = _mm512_set1_ps(s);

	_Pragma("GCC unroll 16")
	for (int g = 0; g < h / 16; g++)
		acc[g] = _mm512_setzero_si512();
	switch (cb->bits) { /* planes: widest first, lowest bits (tq_layout.h) */
	case 5: tqo_plane(acc, pl, h, 4, 0); tqo_plane(acc, pl + h / 2, h, 1, 4); break;
	case 4: tqo_plane(acc, pl, h, 4, 0); break;
	case 3: tqo_plane(acc, pl, h, 2, 0); tqo_plane(acc, pl + h / 4, h, 1, 2); break;
	case 2: tqo_plane(acc, pl, h, 2, 0); break;
	default: tqo_plane(acc, pl, h, 1, 0); break;
	}
	_Pragma("GCC unroll 16")
	for (int g = 0; g < h / 16; g++)
		_mm512_storeu_ps(o + 16 * g, _mm512_mul_ps(cb32_get(t0, t1, cb->levels, acc[g]), sv));
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
static void tqo_half_avx512(const tq_codebook *cb, float s, const uint8_t *pl, int h, float *o)
{
	uint8_t idx[TQ_DIM_MAX / 2];

	if (h >= 32 && h <= TQ_DIM_MAX / 2 && !(h & (h - 1)) && cb->bits <= 5) {
		tqo_half_direct(cb, s, pl, h, o);
		return;
	}
	tq_unpack_planes(pl, h, cb->bits, idx);
	tqo_lookup_avx512(cb, s, idx, h, o);
}

static const float *decode_avx512(const tq_codec *c, const uint8_t *src, int n,
				  float *tile, float *scale)
{
	const int d = c->dim;
	const size_t bb = c->block_bytes;

	switch (c->id) {
	case TQ_CODEC_TQ4: {
		if (d % 32)
			break;
		const __m512 cb = _mm512_loadu_ps(c->cb.centroid);
		const int h = d / 2;
		for (int t = 0; t < n; t++, src += bb) {
			const uint8_t *ix = src + 4;
			float *o = tile + (size_t)t * d;
			memcpy(&scale[t], src, 4);
			for (int k = 0; k < h; k += 16) {
				__m512i v = zext16(ix + k);
				_mm512_storeu_ps(o + k, _mm512_permutexvar_ps(v, cb));
				_mm512_storeu_ps(o + h + k, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), cb));
			}
		}
		return tile;
	}
	case TQ_CODEC_TQ3: {
		if (d % 128)
			break;
		float c16[16];
		for (int i = 0; i < 16; i++)
			c16[i] = c->cb.centroid[i & 7];
		const __m512 cb = _mm512_loadu_ps(c16);
		const __m512i m3 = _mm512_set1_epi32(3);
		/* value i: low bits in byte i % s2 of the 2-bit plane at shift
		 * 2 (i / s2); high bit in byte i % s1 of the 1-bit plane at shift
		 * i / s1 (s2 = d/4, s1 = d/8).  Walk i = a s2 + 16 b: the low
		 * shift is 2a and the high shift 2a + (16 b >= s1). */
		const int s2 = d / 4, s1 = d / 8;
		for (int t = 0; t < n; t++, src += bb) {
			const uint8_t *lo = src + 4, *hi = src + 4 + s2;
			float *o = tile + (size_t)t * d;
			memcpy(&scale[t], src, 4);
			for (int b = 0; b < s2; b += 16) {
				const __m512i lz = zext16(lo + b);
				const int hb = b >= s1;                       /* 0 or 1 */
				const __m512i hz = srl(zext16(hi + b - hb * s1), hb);
#define TQ3_SLICE(A)                                                                    \
	do {                                                                            \
		__m512i a_ = _mm512_srli_epi32(lz, 2 * (A));                            \
		__m512i h_ = (A) == 0 ? _mm512_slli_epi32(hz, 2)                         \
				      : _mm512_srli_epi32(hz, 2 * (A) - 2);             \
		_mm512_storeu_ps(o + (A) * s2 + b, _mm512_permutexvar_ps(               \
			_mm512_ternarylogic_epi32(m3, a_, h_, 0xCA), cb));              \
	} while (0)
				TQ3_SLICE(0);
				TQ3_SLICE(1);
				TQ3_SLICE(2);
				TQ3_SLICE(3);
#undef TQ3_SLICE
			}
		}
		return tile;
	}
	case TQ_CODEC_TQ2: {
		if (d % 64)
			break;
		float c16[16];
		_Pragma("GCC unroll 16")
		for (int i = 0; i < 16; i++)
			c16[i] = c->cb.centroid[i & 3];
		const __m512 cb = _mm512_loadu_ps(c16);
		const int s2 = d / 4;
		for (int t = 0; t < n; t++, src += bb) {
			const uint8_t *lo = src + 4;
			float *o = tile + (size_t)t * d;
			memcpy(&scale[t], src, 4);
			for (int i0 = 0; i0 < d; i0 += 16)
				_mm512_storeu_ps(o + i0, _mm512_permutexvar_ps(
					srl(zext16(lo + i0 % s2), 2 * (i0 / s2)), cb));
		}
		return tile;
	}
	case TQ_CODEC_Q8:
		if (d % 16)
			break;
		for (int t = 0; t < n; t++, src += bb) {
			float *o = tile + (size_t)t * d;
			memcpy(&scale[t], src, 4);
			for (int k = 0; k < d; k += 16) {
				__m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + 4 + k));
				_mm512_storeu_ps(o + k, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)));
			}
		}
		return tile;
	case TQ_CODEC_Q4A: {
		if (d % 32)
			break;
		const int h = d / 2;
		const __m512i m15 = _mm512_set1_epi32(15);
		for (int t = 0; t < n; t++, src += bb) {
			uint16_t hs, hm;
			memcpy(&hs, src, 2);
			memcpy(&hm, src + 2, 2);
			const __m512 s = _mm512_set1_ps(tq_f16_to_f32(hs));
			const __m512 mn = _mm512_set1_ps(tq_f16_to_f32(hm));
			float *o = tile + (size_t)t * d;
			scale[t] = 1.0f;
			for (int k = 0; k < h; k += 16) {
				__m512i v = zext16(src + 4 + k);
				__m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, m15));
				__m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
				_mm512_storeu_ps(o + k, _mm512_add_ps(mn, _mm512_mul_ps(s, lo)));
				_mm512_storeu_ps(o + h + k, _mm512_add_ps(mn, _mm512_mul_ps(s, hi)));
			}
		}
		return tile;
	}
	case TQ_CODEC_F16:
		if (d % 16)
			break;
		for (int t = 0; t < n; t++, src += bb) {
			float *o = tile + (size_t)t * d;
			scale[t] = 1.0f;
			for (int k = 0; k < d; k += 16)
				_mm512_storeu_ps(o + k, _mm512_cvtph_ps(_mm256_loadu_si256(
					(const __m256i *)(const void *)(src + 2 * k))));
		}
		return tile;
	case TQ_CODEC_TQ3O:
	case TQ_CODEC_TQ4O:
		tqa_decode_tqo(c, src, n, tile, scale, tqo_half_avx512);
		return tile;
	default:
		break;
	}
	return tqa_decode_scalar(c, src, n, tile, scale);
}

/* lane i of the result = horizontal sum of v[i] */
static inline __m512 reduce16(__m512 v[16])
{
	__m512 w[8], x[4];
	_Pragma("GCC unroll 16")
	for (int k = 0; k < 8; k++)
		w[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]),
				     _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
	_Pragma("GCC unroll 16")
	for (int k = 0; k < 4; k++)
		x[k] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * k], w[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
				     _mm512_shuffle_ps(w[2 * k], w[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
	__m512 y01 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
				   _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
	__m512 y23 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(2, 0, 2, 0)),
				   _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 1, 3, 1)));
	return _mm512_add_ps(_mm512_shuffle_f32x4(y01, y23, _MM_SHUFFLE(2, 0, 2, 0)),
			     _mm512_shuffle_f32x4(y01, y23, _MM_SHUFFLE(3, 1, 3, 1)));
}

static void scores_avx512(const float *q, const float *tile, const float *scale,
			  int n, int dim, float *s)
{
	const int d16 = dim & ~15;
	const __mmask16 tail = (__mmask16)((1u << (dim & 15)) - 1u);
	const __m512i bidx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
	const float *q0 = q, *q1 = q + dim, *q2 = q + 2 * dim, *q3 = q + 3 * dim;
	int t = 0;

	/* Groups of 4 tokens, the last one padded with its own first token:
	 * a token's score comes out of the same lane of the same reduction
	 * whether the chunk ends after it or not (a row's bits must not
	 * depend on the other rows of its call: plan_n_q). */
	for (; t < n; t += 4) {
		const float *k0 = tile + (size_t)t * dim;
		const float *k1 = t + 1 < n ? k0 + dim : k0, *k2 = t + 2 < n ? k0 + 2 * dim : k0;
		const float *k3 = t + 3 < n ? k0 + 3 * dim : k0;
		const int left = n - t < 4 ? n - t : 4;
		__m512 a[16];
		_Pragma("GCC unroll 16")
		for (int i = 0; i < 16; i++)
			a[i] = _mm512_setzero_ps();
		int j = 0;
#define SC_STEP(LD)                                                           \
	do {                                                                  \
		__m512 kk[4] = { LD(k0 + j), LD(k1 + j), LD(k2 + j), LD(k3 + j) }; \
		__m512 qq[4] = { LD(q0 + j), LD(q1 + j), LD(q2 + j), LD(q3 + j) }; \
		_Pragma("GCC unroll 16")                                              \
		for (int i = 0; i < 4; i++)                                   \
			_Pragma("GCC unroll 16")                                             \
			for (int r = 0; r < 4; r++)                           \
				a[i * 4 + r] = _mm512_fmadd_ps(kk[i], qq[r], a[i * 4 + r]); \
	} while (0)
#define LDU(p) _mm512_loadu_ps(p)
#define LDM(p) _mm512_maskz_loadu_ps(tail, p)
		for (; j < d16; j += 16)
			SC_STEP(LDU);
		if (tail)
			SC_STEP(LDM);
		__m512 z = reduce16(a);
		__m128 sc4 = _mm_maskz_loadu_ps((__mmask8)((1u << left) - 1u), scale + t);
		__m512 sc = _mm512_permutexvar_ps(bidx, _mm512_castps128_ps512(sc4));
		_mm512_mask_storeu_ps(s + t * TQA_ROWS, (__mmask16)((1u << (4 * left)) - 1u), _mm512_mul_ps(z, sc));
	}
#undef SC_STEP
#undef LDU
#undef LDM
}

/* 2^x, relative error < 2e-7; x < -125 (and NaN) gives 0, so 2^-inf = 0.
 * No result is subnormal: an Intel core takes a microcode assist (about
 * 150 cycles) for each instruction that makes one, and every online-
 * softmax step starting a row (m = -inf) or with invisible lanes did —
 * `tqbench kern`'s softmax read 3.4 ns a token on a Xeon, 2.3 after. */
static inline __m512 exp2_avx512(__m512 x)
{
	const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
	x = _mm512_max_ps(x, _mm512_set1_ps(-125.0f));
	x = _mm512_min_ps(x, _mm512_set1_ps(128.0f));
	__m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 f = _mm512_sub_ps(x, n);
	__m512 p = _mm512_set1_ps(1.525273380405984e-05f);
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381606e-04f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-03f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-02f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-01f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-01f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
	return _mm512_maskz_scalef_ps(live, p, n);
}

/* max / sum over the 4 token lanes of each row: lane = token * 4 + row */
static inline __m512 rowmax(__m512 v)
{
	v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
	return _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
}

static inline __m512 rowsum(__m512 v)
{
	v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
	return _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
}

static void softmax_avx512(float *s, int n, const int *vis, float *m, float *l, float *alpha)
{
	const __m512i tok = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
	const __m512i visv = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)vis));
	const __m512 ninf = _mm512_set1_ps(-INFINITY);
	const __m512 zero = _mm512_setzero_ps();
	__mmask16 mk[TQA_CHUNK / 4];
	__m512 v[TQA_CHUNK / 4];
	__m512 mx = ninf, bad = zero;   /* bad: 0, NaN after a visible score that is not finite */
	int nk = (n + 3) / 4;

	for (int k = 0; k < nk; k++) {
		mk[k] = _mm512_cmplt_epi32_mask(_mm512_add_epi32(tok, _mm512_set1_epi32(4 * k)), visv);
		v[k] = _mm512_loadu_ps(s + 16 * k);
		mx = _mm512_mask_max_ps(mx, mk[k], mx, v[k]);
		bad = _mm512_mask3_fmadd_ps(v[k], zero, bad, mk[k]);
	}
	mx = rowmax(mx);
	__m512 mold = _mm512_broadcast_f32x4(_mm_loadu_ps(m));
	__m512 mnew = _mm512_max_ps(mold, mx);
	__mmask16 live = _mm512_cmp_ps_mask(mnew, ninf, _CMP_NEQ_OQ);
	/* alpha = 2^(m_old - m_new); 1 where nothing is visible yet */
	__m512 al = _mm512_mask_blend_ps(live, _mm512_set1_ps(1.0f),
					 exp2_avx512(_mm512_sub_ps(mold, mnew)));
	__m512 sum = _mm512_setzero_ps();
	for (int k = 0; k < nk; k++) {
		__m512 p = _mm512_maskz_mov_ps(mk[k], exp2_avx512(_mm512_sub_ps(v[k], mnew)));
		sum = _mm512_add_ps(sum, p);
		_mm512_storeu_ps(s + 16 * k, p);
	}
	for (int k = nk; k < TQA_CHUNK / 4; k++)
		_mm512_storeu_ps(s + 16 * k, _mm512_setzero_ps());
	sum = rowsum(sum);
	bad = rowsum(bad);
	__m128 l4 = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_loadu_ps(l), _mm512_castps512_ps128(al)),
					  _mm512_castps512_ps128(sum)), _mm512_castps512_ps128(bad));
	/* rows with nothing visible keep m = -inf, l = 0 */
	_mm_storeu_ps(l, l4);
	_mm_storeu_ps(m, _mm512_castps512_ps128(mnew));
	_mm_storeu_ps(alpha, _mm512_castps512_ps128(al));
}

static void accum_avx512(float *acc, const float *alpha, const float *wp, const float *vscale,
			 const float *tile, int n, int dim)
{
	/* w[t][r] = p[t][r] * vscale[t], 4 tokens per register */
	float w[TQA_CHUNK * TQA_ROWS] __attribute__((aligned(64)));
	const __m512i bidx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
	for (int t = 0; t < n; t += 4) {
		__mmask16 mk = n - t >= 4 ? (__mmask16)0xFFFF : (__mmask16)((1u << (4 * (n - t))) - 1u);
		__m128 vs = _mm_maskz_loadu_ps((__mmask8)(n - t >= 4 ? 0xF : (1u << (n - t)) - 1u), vscale + t);
		__m512 sc = _mm512_permutexvar_ps(bidx, _mm512_castps128_ps512(vs));
		_mm512_store_ps(w + 4 * t, _mm512_maskz_mul_ps(mk, _mm512_maskz_loadu_ps(mk, wp + 4 * t), sc));
	}
	const __m512 al0 = _mm512_set1_ps(alpha[0]), al1 = _mm512_set1_ps(alpha[1]);
	const __m512 al2 = _mm512_set1_ps(alpha[2]), al3 = _mm512_set1_ps(alpha[3]);
	const size_t ld = (size_t)dim;
	int j0 = 0;

	for (; j0 + 64 <= dim; j0 += 64) {
		float *p0 = acc + j0, *p1 = p0 + ld, *p2 = p1 + ld, *p3 = p2 + ld;
#define LA(p, o, al) __m512 p##_##o = _mm512_mul_ps(_mm512_loadu_ps(p + 16 * o), al)
		LA(p0, 0, al0); LA(p0, 1, al0); LA(p0, 2, al0); LA(p0, 3, al0);
		LA(p1, 0, al1); LA(p1, 1, al1); LA(p1, 2, al1); LA(p1, 3, al1);
		LA(p2, 0, al2); LA(p2, 1, al2); LA(p2, 2, al2); LA(p2, 3, al2);
		LA(p3, 0, al3); LA(p3, 1, al3); LA(p3, 2, al3); LA(p3, 3, al3);
#undef LA
		const float *vt = tile + j0;
		const float *wt = w;
		for (int t = 0; t < n; t++, vt += ld, wt += TQA_ROWS) {
			__m512 v0 = _mm512_loadu_ps(vt), v1 = _mm512_loadu_ps(vt + 16);
			__m512 v2 = _mm512_loadu_ps(vt + 32), v3 = _mm512_loadu_ps(vt + 48);
#define FR(p, r)                                                           \
	do {                                                               \
		__m512 wr = _mm512_set1_ps(wt[r]);                         \
		p##_0 = _mm512_fmadd_ps(wr, v0, p##_0);                    \
		p##_1 = _mm512_fmadd_ps(wr, v1, p##_1);                    \
		p##_2 = _mm512_fmadd_ps(wr, v2, p##_2);                    \
		p##_3 = _mm512_fmadd_ps(wr, v3, p##_3);                    \
	} while (0)
			FR(p0, 0); FR(p1, 1); FR(p2, 2); FR(p3, 3);
#undef FR
		}
#define ST(p, o) _mm512_storeu_ps(p + 16 * o, p##_##o)
		ST(p0, 0); ST(p0, 1); ST(p0, 2); ST(p0, 3);
		ST(p1, 0); ST(p1, 1); ST(p1, 2); ST(p1, 3);
		ST(p2, 0); ST(p2, 1); ST(p2, 2); ST(p2, 3);
		ST(p3, 0); ST(p3, 1); ST(p3, 2); ST(p3, 3);
#undef ST
	}
	for (; j0 < dim; j0 += 16) {
		const __mmask16 mk = dim - j0 >= 16 ? (__mmask16)0xFFFF
						    : (__mmask16)((1u << (dim - j0)) - 1u);
		float *p0 = acc + j0, *p1 = p0 + ld, *p2 = p1 + ld, *p3 = p2 + ld;
		__m512 a0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, p0), al0);
		__m512 a1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, p1), al1);
		__m512 a2 = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, p2), al2);
		__m512 a3 = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, p3), al3);
		for (int t = 0; t < n; t++) {
			__m512 v = _mm512_maskz_loadu_ps(mk, tile + (size_t)t * dim + j0);
			const float *wt = w + t * TQA_ROWS;
			a0 = _mm512_fmadd_ps(_mm512_set1_ps(wt[0]), v, a0);
			a1 = _mm512_fmadd_ps(_mm512_set1_ps(wt[1]), v, a1);
			a2 = _mm512_fmadd_ps(_mm512_set1_ps(wt[2]), v, a2);
			a3 = _mm512_fmadd_ps(_mm512_set1_ps(wt[3]), v, a3);
		}
		_mm512_mask_storeu_ps(p0, mk, a0);
		_mm512_mask_storeu_ps(p1, mk, a1);
		_mm512_mask_storeu_ps(p2, mk, a2);
		_mm512_mask_storeu_ps(p3, mk, a3);
	}
}

/* ---- register-direct kernels at dim 128 ---------------------------------------
 * LD_<codec>(blk, k): dims [16k, 16k + 16) of one block, unscaled, k a
 * constant 0..7 after unrolling; SC_<codec>(blk): the block's scale. */
#define D 128
/* tq4 (acc in acc_order: below): the 64 index bytes as 16 dwords, dword m
 * holding dims 4m + b (b = 0..3) in the low nibbles of its bytes and dims
 * 64 + 4m + b in the high ones; vpermps reads 4 bits, so a shift by 8b
 * (+ 4 for the high half) is the whole decode: no widening */
#define LD_tq4(b, k) _mm512_permutexvar_ps(_mm512_srli_epi32(                                       \
	_mm512_loadu_si512((const void *)((b) + 4)), 8 * ((k) & 3) + 4 * ((k) >> 2)), cb)
#define LD_tq2(b, k) _mm512_permutexvar_ps(                                                          \
	_mm512_srli_epi32(zext16((b) + 4 + 16 * ((k) & 1)), 2 * ((k) >> 1)), cb)
#define LD_q8(b, k) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(                                         \
	_mm_loadu_si128((const __m128i *)(const void *)((b) + 4 + 16 * (k)))))
#define LD_f16(b, k) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)((b) + 32 * (k))))
#define LD_f32(b, k) _mm512_loadu_ps((const float *)(const void *)(b) + 16 * (k))

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

#define CB_tq4 const __m512 cb = _mm512_loadu_ps(c->cb.centroid)
#define CB_tq3                                                                    \
	float c16[16];                                                            \
	for (int i_ = 0; i_ < 16; i_++)                                           \
		c16[i_] = c->cb.centroid[i_ & 7];                                 \
	const __m512 cb = _mm512_loadu_ps(c16)
#define CB_tq2                                                                    \
	float c16[16];                                                            \
	for (int i_ = 0; i_ < 16; i_++)                                           \
		c16[i_] = c->cb.centroid[i_ & 3];                                 \
	const __m512 cb = _mm512_loadu_ps(c16)
#define CB_q8 (void)c
#define CB_f16 (void)c
#define CB_f32 (void)c

#define FMA4(i, kk)                                                               \
	a[(i) * 4 + 0] = _mm512_fmadd_ps(kk, q0, a[(i) * 4 + 0]);                 \
	a[(i) * 4 + 1] = _mm512_fmadd_ps(kk, q1, a[(i) * 4 + 1]);                 \
	a[(i) * 4 + 2] = _mm512_fmadd_ps(kk, q2, a[(i) * 4 + 2]);                 \
	a[(i) * 4 + 3] = _mm512_fmadd_ps(kk, q3, a[(i) * 4 + 3])

/* s[t][r] = scale_t * dot(q[r], block_t) for 4 query rows q: [4][128]. */
#define DEF_SCORES(C)                                                                         \
static void scores_##C(const tq_codec *c, const uint8_t *src, int n, const float *q, float *s) \
{                                                                                             \
	CB_##C;                                                                               \
	const size_t bb = c->block_bytes;                                                     \
	const __m512i bidx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0); \
	int t = 0;                                                                            \
	for (; t < n; t += 4) {   /* the last group padded: see scores_avx512 */               \
		TQA_PF_STEP(); /* paced prefetch: two lines per 4 tokens */                    \
		TQA_PF_STEP();                                                                 \
		const uint8_t *b0 = src + (size_t)t * bb;                                     \
		const uint8_t *b1 = t + 1 < n ? b0 + bb : b0, *b2 = t + 2 < n ? b0 + 2 * bb : b0; \
		const uint8_t *b3 = t + 3 < n ? b0 + 3 * bb : b0;                             \
		const int left = n - t < 4 ? n - t : 4;                                       \
		__m512 a[16];                                                                 \
		_Pragma("GCC unroll 16")                                                      \
		for (int i = 0; i < 16; i++)                                                  \
			a[i] = _mm512_setzero_ps();                                           \
		_Pragma("GCC unroll 8")                                                       \
		for (int k = 0; k < D / 16; k++) {                                            \
			const __m512 q0 = _mm512_loadu_ps(q + 16 * k);                        \
			const __m512 q1 = _mm512_loadu_ps(q + D + 16 * k);                    \
			const __m512 q2 = _mm512_loadu_ps(q + 2 * D + 16 * k);                \
			const __m512 q3 = _mm512_loadu_ps(q + 3 * D + 16 * k);                \
			__m512 k0 = LD_##C(b0, k);                                            \
			FMA4(0, k0);                                                          \
			__m512 k1 = LD_##C(b1, k);                                            \
			FMA4(1, k1);                                                          \
			__m512 k2 = LD_##C(b2, k);                                            \
			FMA4(2, k2);                                                          \
			__m512 k3 = LD_##C(b3, k);                                            \
			FMA4(3, k3);                                                          \
		}                                                                             \
		__m512 z = reduce16(a);                                                       \
		__m128 sc4 = _mm_setr_ps(SC_##C(b0), SC_##C(b1), SC_##C(b2), SC_##C(b3));     \
		__m512 sc = _mm512_permutexvar_ps(bidx, _mm512_castps128_ps512(sc4));         \
		_mm512_mask_storeu_ps(s + t * TQA_ROWS, (__mmask16)((1u << (4 * left)) - 1u), \
				      _mm512_mul_ps(z, sc));                                  \
	}                                                                                     \
}

/* acc[r][:] = acc[r][:] * alpha[r] + Σ_t p[t][r] scale_t block_t, acc: [4][128]. */
#define DEF_ACCUM(C)                                                                          \
static void accum_##C(const tq_codec *c, const uint8_t *src, int n, float *acc,              \
		      const float *alpha, const float *p)                                    \
{                                                                                             \
	CB_##C;                                                                               \
	const size_t bb = c->block_bytes;                                                     \
	float w[TQA_CHUNK * TQA_ROWS] __attribute__((aligned(64)));                           \
	for (int t = 0; t < n; t++) {                                                         \
		__m128 sc = _mm_set1_ps(SC_##C(src + (size_t)t * bb));                        \
		_mm_store_ps(w + 4 * t, _mm_mul_ps(_mm_loadu_ps(p + 4 * t), sc));            \
	}                                                                                     \
	_Pragma("GCC unroll 2")                                                               \
	for (int h = 0; h < 2; h++) {                                                         \
		__m512 a[16];                                                                 \
		_Pragma("GCC unroll 4")                                                       \
		for (int r = 0; r < 4; r++) {                                                 \
			const __m512 al = _mm512_set1_ps(alpha[r]);                           \
			_Pragma("GCC unroll 4")                                               \
			for (int k = 0; k < 4; k++)                                           \
				a[r * 4 + k] = _mm512_mul_ps(_mm512_loadu_ps(                 \
					acc + r * D + 64 * h + 16 * k), al);                  \
		}                                                                             \
		const uint8_t *b = src;                                                       \
		for (int t = 0; t < n; t++, b += bb) {                                        \
			TQA_PF_STEP(); /* a line per token of each pass */                    \
			__m512 v0 = LD_##C(b, 4 * h + 0), v1 = LD_##C(b, 4 * h + 1);          \
			__m512 v2 = LD_##C(b, 4 * h + 2), v3 = LD_##C(b, 4 * h + 3);          \
			_Pragma("GCC unroll 4")                                               \
			for (int r = 0; r < 4; r++) {                                         \
				const __m512 wr = _mm512_set1_ps(w[4 * t + r]);               \
				a[r * 4 + 0] = _mm512_fmadd_ps(wr, v0, a[r * 4 + 0]);         \
				a[r * 4 + 1] = _mm512_fmadd_ps(wr, v1, a[r * 4 + 1]);         \
				a[r * 4 + 2] = _mm512_fmadd_ps(wr, v2, a[r * 4 + 2]);         \
				a[r * 4 + 3] = _mm512_fmadd_ps(wr, v3, a[r * 4 + 3]);         \
			}                                                                     \
		}                                                                             \
		_Pragma("GCC unroll 4")                                                       \
		for (int r = 0; r < 4; r++)                                                   \
			_Pragma("GCC unroll 4")                                               \
			for (int k = 0; k < 4; k++)                                           \
				_mm512_storeu_ps(acc + r * D + 64 * h + 16 * k, a[r * 4 + k]); \
	}                                                                                     \
}

/* ---- integer key scoring at dim 128 --------------------------------------------
 * The AVX2 path's scheme (tq_attn_avx2.c) on 512-bit registers: query rows
 * as int16 (q_j = rint(q_j · Q / max|q|)) once per task and row block, the
 * codebook as int16 (c_i = rint(c_i · C / max|c|)), and q·k as vpmaddwd
 * (32 dims per instruction where the float path does 16 per FMA), with no
 * float decode of the keys.  The centroids come from one vpermw per 32
 * indices over the codebook replicated to 32 entries, so vpermw's 5 index
 * bits need no masking above the codec's own bits (as vpermps's 4 in the
 * float path).  The query rows stay in natural order (tq4: in the order
 * its word-wise index extraction gives, tq4_qdim): vpermw does not move
 * dims between lanes.
 *
 * Range: a lane sums a token's 8 products (4 vpmaddwd / vpdpwssd in a
 * row) and is converted once.  q8: codes are exact (|code| <= 127), 8
 * products of at most 32767 · 127.  tq*: 8 products of at most 23170² could
 * leave int32 (the AVX2 path converts after 4), so qprep_rows bounds each
 * lane's sum of |q_j| · max|c| by 2^31 and scales a row down below Q where
 * it would not fit: a rotated query is near Gaussian and its lanes' sums
 * stay around a third of the bound, so rows keep their 15 bits (the
 * accuracy of the AVX2 path: tests/unit/test_attn.c measures it); only a
 * row with its large entries crowded into one lane's dims loses some.
 * tq*o keep one int32 per half (4 products: no bound needed).
 *
 * qp: int16 q[4][128] | float fac[4] (1 / (q scale · C)) | int16 cb[32] */
#define QP_FAC 1024
#define QP_CB  1088
#define QLIM_TQ 23170.0f
#define CLIM_TQ 23170.0f
#define QLIM_Q8 32767.0f

#define QP_CB2 1152 /* tq*o: the second half's table */
#define QP_CSC 1216 /* tq*o: 1 / each half's codebook scale */
static_assert(QP_CB2 + 64 <= QP_CSC && QP_CSC + 8 <= TQA_QPREP_BYTES, "qprep layout fits");

/* tq4's scorer takes each block's nibble plane as 16-bit words (IXW_tq4):
 * the row dims it pairs with k[0..3] are, in this order, the even dims of
 * [0, 64), the odd ones, the even dims of [64, 128), the odd ones. */
static inline int tq4_qdim(int j)
{
	return (j & 64) | 2 * (j & 31) | ((j >> 5) & 1);
}

/* The largest |sum| one int32 lane of DOT4 can reach for the int16 row o
 * against int16 keys of magnitude at most cmax: lane i takes the words
 * 32g + 2i and 32g + 2i + 1 of the row, g = 0..3. */
static int64_t lane_bound(const int16_t *o, int cmax)
{
	int64_t worst = 0;

	for (int i = 0; i < 16; i++) {
		int64_t sum = 0;
		for (int g = 0; g < 4; g++)
			sum += abs(o[32 * g + 2 * i]) + abs(o[32 * g + 2 * i + 1]);
		if (sum > worst)
			worst = sum;
	}
	return worst * cmax;
}

static void qprep_rows(const float *q, float qlim, float csc, int cmax, int tq4, uint8_t *qp)
{
	float *fac = (float *)(void *)(qp + QP_FAC);

	for (int r = 0; r < TQA_ROWS; r++) {
		const float *qr = q + r * D;
		__m512 mx = _mm512_setzero_ps();
		for (int j = 0; j < D; j += 16)
			mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(qr + j)));
		const float m = _mm512_reduce_max_ps(mx);
		/* max 0: every product is 0.  max inf: the factor is inf, the
		 * scores inf or NaN, and the row comes out NaN as the softmax
		 * contract says (as in the AVX2 path).  A row so small that Q /
		 * max overflows (max < 7e-35: its logits are 0 to float
		 * precision) takes 2^100, finite, so the bound below ends. */
		float sq = m > 0.0f && m <= 3.4e38f ? fminf(qlim / m, 0x1p100f) : 0.0f;
		int16_t *o = (int16_t *)(void *)qp + r * D, nat[D] __attribute__((aligned(32)));
		for (;;) {
			const __m512 sv = _mm512_set1_ps(sq);
			for (int j = 0; j < D; j += 16)
				_mm256_store_si256((__m256i *)(void *)(nat + j), _mm512_cvtsepi32_epi16(
					_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(qr + j), sv))));
			for (int j = 0; j < D; j++)
				o[j] = nat[tq4 ? tq4_qdim(j) : j];
			/* a row whose large entries crowd into one lane's 8 dims:
			 * scaled down until no lane can leave int32 */
			const int64_t b = lane_bound(o, cmax);
			if (b <= INT32_MAX)
				break;
			sq *= (float)((double)INT32_MAX / (double)b) * 0.999f;
		}
		fac[r] = sq > 0.0f ? 1.0f / (sq * csc) : m / (qlim * csc);
	}
}

static void qprep_cb(const tq_codec *c, const float *q, void *qpv)
{
	uint8_t *qp = qpv;
	const int nc = 1 << c->bits;
	const float csc = tqa_cb_int_scale(&c->cb, CLIM_TQ);
	int16_t *cb = (int16_t *)(void *)(qp + QP_CB);
	for (int i = 0; i < 32; i++)
		cb[i] = (int16_t)lrintf(c->cb.centroid[i & (nc - 1)] * csc);
	qprep_rows(q, QLIM_TQ, csc, (int)CLIM_TQ, c->id == TQ_CODEC_TQ4, qp);
}

static void qprep_q8(const tq_codec *c, const float *q, void *qp)
{
	(void)c;
	qprep_rows(q, QLIM_Q8, 1.0f, 127, 0, qp);
}

/* tq3o / tq4o (d = 128: two halves of 64): each half's codebook on its own
 * integer scale (its largest centroid at CLIM_TQ), each table replicated
 * to 32 entries; the rows' factors leave the codebook scale out (1), and
 * the scorer divides each half's sum by its scale (QP_CSC). */
static void qprep_tqo(const tq_codec *c, const float *q, void *qpv)
{
	uint8_t *qp = qpv;
	const float ca = tqa_cb_int_scale(&c->cb, CLIM_TQ), cb = tqa_cb_int_scale(&c->cb_b, CLIM_TQ);
	int16_t *ta = (int16_t *)(void *)(qp + QP_CB), *tb = (int16_t *)(void *)(qp + QP_CB2);
	float *inv = (float *)(void *)(qp + QP_CSC);

	for (int i = 0; i < 32; i++) {
		ta[i] = (int16_t)lrintf(c->cb.centroid[i & (c->cb.levels - 1)] * ca);
		tb[i] = (int16_t)lrintf(c->cb_b.centroid[i & (c->cb_b.levels - 1)] * cb);
	}
	inv[0] = 1.0f / ca;
	inv[1] = 1.0f / cb;
	qprep_rows(q, QLIM_TQ, 1.0f, 0, 0, qp); /* per-half sums of 4: no bound */
}

/* IXW_<codec>(blk, g): the 32 indices of dims [32g, 32g + 32) of one block
 * as 16-bit lanes; only their low 5 bits are defined (vpermw reads no more).
 * IXL_<codec>(blk): what a block's groups share, loaded once. */
/* tq4: byte j of the 64 holds dim j in its low nibble, dim j + 64 in its
 * high one, so 16-bit word m holds dims 2m, 2m + 64, 2m + 1, 2m + 65 at
 * bits 0, 4, 8, 12: the plane's words shifted by 0, 8, 4 and 12 index the
 * dims tq4_qdim lists (bit 4 is the next nibble's: the table is
 * replicated), with no widening */
#define IXL_tq4(b) const __m512i w0_##b = _mm512_loadu_si512((const void *)(b + 4))
#define IXW_tq4(b, g) ((g) == 0 ? w0_##b : _mm512_srli_epi16(w0_##b, (g) == 1 ? 8 : (g) == 2 ? 4 : 12))
/* tq3: low bits of dim 32g + j in byte j of the 2-bit plane at shift 2g;
 * high bit in byte j % 16 of the 1-bit plane at shift 2g + (j >= 16) */
#define IXL_tq3(b) const __m512i w0_##b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(             \
			(const __m256i *)(const void *)(b + 4))),                              \
		     h_##b = _mm512_srlv_epi16(_mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(  \
			_mm_loadu_si128((const __m128i *)(const void *)(b + 36)))), hsh)
#define IXW_tq3(b, g) _mm512_ternarylogic_epi32(m3, _mm512_srli_epi16(w0_##b, 2 * (g)),         \
	(g) == 0 ? _mm512_slli_epi16(h_##b, 2) : _mm512_srli_epi16(h_##b, 2 * (g) - 2), 0xCA)
#define IXL_tq2(b) const __m512i w0_##b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(             \
			(const __m256i *)(const void *)(b + 4)))
#define IXW_tq2(b, g) _mm512_srli_epi16(w0_##b, 2 * (g))

static inline __m512i qrow16(const int16_t *qi, int off)
{
	return _mm512_load_si512((const void *)(qi + off));
}

/* The int32 sum of the products of two pairs of int16 vectors: madd, then
 * add (MADD2), or madd then one vpdpwssd (MADD2_VNNI, AVX512-VNNI) — the
 * same integer sum (at most 4 products of 23170^2: no overflow, no
 * saturation), so the same bits, one instruction fewer. */
#define MADD2(a0, b0, a1, b1) _mm512_add_epi32(_mm512_madd_epi16(a0, b0), _mm512_madd_epi16(a1, b1))
#define MADD2_VNNI(a0, b0, a1, b1) _mm512_dpwssd_epi32(_mm512_madd_epi16(a0, b0), a1, b1)
/* The same for four pairs: a token's whole row in one int32 per lane (8
 * products; qprep_rows keeps each lane's sum inside int32), converted once. */
#define MADD4(a0, b0, a1, b1, a2, b2, a3, b3) _mm512_add_epi32(MADD2(a0, b0, a1, b1), MADD2(a2, b2, a3, b3))
#define MADD4_VNNI(a0, b0, a1, b1, a2, b2, a3, b3)                                             \
	_mm512_dpwssd_epi32(_mm512_dpwssd_epi32(MADD2_VNNI(a0, b0, a1, b1), a2, b2), a3, b3)
#define VNNI __attribute__((target("avx512vnni")))

/* Integer key scoring in two steps, so that a chunk's keys can be prepared
 * once and scored by many row blocks (prefill) with the same bits as the
 * direct scorers (decode):
 *   load  one block -> k[4]: its int16 centroids (or q8 codes) of dims
 *         [32g, 32g + 32), and its scales (KL_*);
 *   dot   k[4] x the 4 int16 rows -> a[i * 4 + r] (KD_*), the same code
 *         for a block loaded from its bytes or from the prepared tile.
 * Three kinds of dot: TQ (tq2/3/4: two 64-dim int32 sums, in float, then
 * the block's scale after the reduction), Q8 (one int32 sum over the row),
 * TQO (tq*o: each half's sum times its scale before the reduction). */
enum { KIND_TQ, KIND_Q8, KIND_TQO };

#define KL_tq(C, b, k)                                                                          \
	IXL_##C(b);                                                                             \
	_Pragma("GCC unroll 4")                                                                 \
	for (int g = 0; g < 4; g++)                                                             \
		k[g] = _mm512_permutexvar_epi16(IXW_##C(b, g), cb)
#define KL_tq4(b, k) KL_tq(tq4, b, k)
#define KL_tq3(b, k) KL_tq(tq3, b, k)
#define KL_tq2(b, k) KL_tq(tq2, b, k)
#define KL_q8(b, k)                                                                             \
	_Pragma("GCC unroll 4")                                                                 \
	for (int g = 0; g < 4; g++)                                                             \
		k[g] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)((b) + 4 + 32 * g)))

#define KD_TQ(k, i)                                                                             \
	_Pragma("GCC unroll 4")                                                                 \
	for (int r = 0; r < 4; r++)                                                             \
		a[(i) * 4 + r] = _mm512_cvtepi32_ps(DOT4(k[0], qrow16(qi, r * D), k[1], qrow16(qi, r * D + 32), \
							 k[2], qrow16(qi, r * D + 64), k[3], qrow16(qi, r * D + 96)))
#define KD_Q8 KD_TQ
#define KD_TQO(k, sa, sb, i)                                                                    \
	_Pragma("GCC unroll 4")                                                                 \
	for (int r = 0; r < 4; r++)                                                             \
		a[(i) * 4 + r] = _mm512_fmadd_ps(                                               \
			_mm512_cvtepi32_ps(PAIR(k[0], qrow16(qi, r * D), k[1], qrow16(qi, r * D + 32))), sa, \
			_mm512_mul_ps(_mm512_cvtepi32_ps(PAIR(k[2], qrow16(qi, r * D + 64), k[3], qrow16(qi, r * D + 96))), sb))

/* tq4o / tq3o at d = 128 (tq_layout.h): a 4-byte header of two bf16
 * scales, then the first half's planes (64 dims at B + 1 bits), then the
 * second's (64 at B - 1).  The indices of each half's two 32-dim groups as
 * 16-bit lanes (only the low 5 bits defined: vpermw reads no more; the
 * tables are replicated to 32 entries):
 *   tq4o first half: low 4 bits in the 32-byte nibble plane (dims j and
 *     j + 32 in byte j), bit 4 in the 8-byte bit plane (dim c: byte c % 8,
 *     bit c / 8) moved to bit 4 by a per-lane shift;
 *   tq4o second half: low 2 bits in the 16-byte crumb plane (dim c: byte
 *     c % 16, bits 2 (c / 16)), bit 2 in its own 8-byte bit plane;
 *   tq3o first half: the nibble plane alone; second half: the crumb plane
 *   alone.
 * The halves' scales leave as sa, sb: bf16 over the half's codebook scale. */
static inline __m512i ld_u64x4(const uint8_t *p) /* 8 bytes, 4 times, as 32 x u16 */
{
	uint64_t v;
	memcpy(&v, p, 8);
	return _mm512_cvtepu8_epi16(_mm256_set1_epi64x((long long)v));
}

static inline __m512i ld_u128x2(const uint8_t *p) /* 16 bytes, twice, as 32 x u16 */
{
	return _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p)));
}

/* lane j of 32: a, b, c or d by j / 8 (e, f by j / 16) */
#define SH8(a, b, c, d) _mm512_set_epi64(0x000##d##000##d##000##d##000##d##LL, 0x000##d##000##d##000##d##000##d##LL, \
	0x000##c##000##c##000##c##000##c##LL, 0x000##c##000##c##000##c##000##c##LL,                         \
	0x000##b##000##b##000##b##000##b##LL, 0x000##b##000##b##000##b##000##b##LL,                         \
	0x000##a##000##a##000##a##000##a##LL, 0x000##a##000##a##000##a##000##a##LL)
#define SH16(e, f) SH8(e, e, f, f)
/* the constants KL_tqo uses */
#define TQO_CONSTS                                                                              \
	const __m512i cba = _mm512_loadu_si512((const void *)(qp + QP_CB));                    \
	const __m512i cbb = _mm512_loadu_si512((const void *)(qp + QP_CB2));                   \
	const __m512i m15 = _mm512_set1_epi16(15); /* m3: SCORER_HEAD's */                      \
	const __m512i sha0 = SH8(4, 3, 2, 1), sh8 = SH8(0, 1, 2, 3), sh8b = SH8(4, 5, 6, 7);   \
	const __m512i shw0 = SH16(0, 2), shw1 = SH16(4, 6);                                     \
	const float *inv_ = (const float *)(const void *)(qp + QP_CSC);                        \
	(void)m15; (void)sha0; (void)sh8; (void)sh8b

#define KL_tqo(O, b, k, sa, sb)                                                                 \
	do {                                                                                    \
		const __m512i wa_ = _mm512_cvtepu8_epi16(_mm256_loadu_si256(                   \
			(const __m256i *)(const void *)((b) + 4)));                             \
		__m512i ia0_ = wa_, ia1_ = _mm512_srli_epi16(wa_, 4), ib0_, ib1_;               \
		if (O == 4) {                                                                   \
			const __m512i ha_ = ld_u64x4((b) + 36), wb_ = ld_u128x2((b) + 44);      \
			const __m512i hb_ = ld_u64x4((b) + 60);                                 \
			ia0_ = _mm512_ternarylogic_epi32(m15, ia0_, _mm512_sllv_epi16(ha_, sha0), 0xCA); \
			ia1_ = _mm512_ternarylogic_epi32(m15, ia1_, _mm512_srlv_epi16(ha_, sh8), 0xCA);  \
			ib0_ = _mm512_ternarylogic_epi32(m3, _mm512_srlv_epi16(wb_, shw0),       \
				_mm512_slli_epi16(_mm512_srlv_epi16(hb_, sh8), 2), 0xCA);       \
			ib1_ = _mm512_ternarylogic_epi32(m3, _mm512_srlv_epi16(wb_, shw1),       \
				_mm512_slli_epi16(_mm512_srlv_epi16(hb_, sh8b), 2), 0xCA);      \
		} else {                                                                        \
			const __m512i wb_ = ld_u128x2((b) + 36);                                \
			ib0_ = _mm512_srlv_epi16(wb_, shw0);                                    \
			ib1_ = _mm512_srlv_epi16(wb_, shw1);                                    \
		}                                                                               \
		k[0] = _mm512_permutexvar_epi16(ia0_, cba);                                     \
		k[1] = _mm512_permutexvar_epi16(ia1_, cba);                                     \
		k[2] = _mm512_permutexvar_epi16(ib0_, cbb);                                     \
		k[3] = _mm512_permutexvar_epi16(ib1_, cbb);                                     \
		uint16_t h_[2];                                                                 \
		memcpy(h_, (b), 4);                                                             \
		sa = tq_bf16_to_f32(h_[0]) * inv_[0];                                                    \
		sb = tq_bf16_to_f32(h_[1]) * inv_[1];                                                    \
	} while (0)
#define KL_tq4o(b, k, sa, sb) KL_tqo(4, b, k, sa, sb)
#define KL_tq3o(b, k, sa, sb) KL_tqo(3, b, k, sa, sb)

/* The prepared tile of a chunk (TQA_KTILE_BYTES): per token its k[4]
 * (256 bytes), then per token two floats (tq*o: sa, sb; others: the
 * block's scale twice). */
#define KT_K(kt, t) ((__m512i *)(void *)((uint8_t *)(kt) + (size_t)(t) * 256))
#define KT_S(kt) ((float *)(void *)((uint8_t *)(kt) + TQA_CHUNK * 256))
static_assert(TQA_CHUNK * (256 + 8) <= TQA_KTILE_BYTES, "prepared key tile fits");

/* The scorers: 4 tokens x 4 rows, the last group padded with its own
 * first token (a token's score must not depend on how many share its call:
 * plan_n_q).  Token i's k[] and scales from its block's bytes (TOKEN_B) or
 * from token t of the prepared tile (TOKEN_T). */
#define TOKEN_B(C, K, bp, i)                                                                    \
	do {                                                                                    \
		__m512i k_[4];                                                                  \
		float sa_ = 1.0f, sb_ = 1.0f;                                                   \
		LOAD_##K(C, bp, k_, sa_, sb_);                                                  \
		DOT_##K(k_, sa_, sb_, i);                                                       \
		sc_[i] = sa_;                                                                   \
		(void)sb_;                                                                      \
	} while (0)
#define TOKEN_T(K, t, i)                                                                        \
	do {                                                                                    \
		const __m512i *k_ = KT_K(kt, t);                                                \
		const float sa_ = KT_S(kt)[2 * (t)], sb_ = KT_S(kt)[2 * (t) + 1];               \
		DOT_##K(k_, sa_, sb_, i);                                                       \
		sc_[i] = sa_;                                                                   \
		(void)sb_;                                                                      \
	} while (0)
#define LOAD_KIND_TQ(C, b, k, sa, sb) do { KL_##C(b, k); sa = sb = hdr_scale(b); } while (0)
#define LOAD_KIND_Q8(C, b, k, sa, sb) do { KL_q8(b, k); sa = sb = hdr_scale(b); } while (0)
#define LOAD_KIND_TQO(C, b, k, sa, sb) KL_##C(b, k, sa, sb)
#define DOT_KIND_TQ(k, sa, sb, i) KD_TQ(k, i)
#define DOT_KIND_Q8(k, sa, sb, i) KD_Q8(k, i)
#define DOT_KIND_TQO(k, sa, sb, i) KD_TQO(k, _mm512_set1_ps(sa), _mm512_set1_ps(sb), i)

/* the 16 sums -> s: times the rows' factors, and (not tq*o) the tokens' scales */
#define FINISH(K)                                                                               \
	do {                                                                                    \
		__m512 z_ = _mm512_mul_ps(reduce16(a), fac);                                    \
		if (K != KIND_TQO) {                                                            \
			const __m128 sc4_ = _mm_loadu_ps(sc_);                                  \
			z_ = _mm512_mul_ps(z_, _mm512_permutexvar_ps(bidx, _mm512_castps128_ps512(sc4_))); \
		}                                                                               \
		_mm512_mask_storeu_ps(s + t * TQA_ROWS, (__mmask16)((1u << (4 * left)) - 1u), z_); \
	} while (0)

#define SCORER_HEAD                                                                             \
	const uint8_t *qp = (const uint8_t *)(const void *)qf;                                  \
	const int16_t *qi = (const int16_t *)(const void *)qp;                                  \
	const __m512i cb = _mm512_loadu_si512((const void *)(qp + QP_CB));                     \
	const __m512i m3 = _mm512_set1_epi16(3);                                                \
	const __m512i hsh = _mm512_set_epi64(0x0001000100010001LL, 0x0001000100010001LL,       \
					     0x0001000100010001LL, 0x0001000100010001LL, 0, 0, 0, 0); \
	const __m512i bidx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);  \
	const __m512 fac = _mm512_broadcast_f32x4(_mm_loadu_ps((const float *)(const void *)(qp + QP_FAC))); \
	(void)cb; (void)m3; (void)hsh

/* scores_d128 of codec C (dot kind K) */
#define DEF_ISCORES(C, K, NAME, ATTR)                                                           \
ATTR static void NAME(const tq_codec *c, const uint8_t *src, int n, const float *qf, float *s)  \
{                                                                                               \
	SCORER_HEAD;                                                                            \
	TQO_CONSTS_##K;                                                                         \
	const size_t bb = c->block_bytes;                                                       \
	for (int t = 0; t < n; t += 4) {                                                        \
		TQA_PF_STEP(); /* paced prefetch: two lines per 4 tokens */                     \
		TQA_PF_STEP();                                                                  \
		const uint8_t *b0 = src + (size_t)t * bb;                                       \
		const uint8_t *b1 = t + 1 < n ? b0 + bb : b0, *b2 = t + 2 < n ? b0 + 2 * bb : b0; \
		const uint8_t *b3 = t + 3 < n ? b0 + 3 * bb : b0;                               \
		const int left = n - t < 4 ? n - t : 4;                                         \
		__m512 a[16];                                                                   \
		float sc_[4];                                                                   \
		TOKEN_B(C, K, b0, 0);                                                           \
		TOKEN_B(C, K, b1, 1);                                                           \
		TOKEN_B(C, K, b2, 2);                                                           \
		TOKEN_B(C, K, b3, 3);                                                           \
		FINISH(K);                                                                      \
	}                                                                                       \
}
#define TQO_CONSTS_KIND_TQ ((void)0)
#define TQO_CONSTS_KIND_Q8 ((void)0)
#define TQO_CONSTS_KIND_TQO TQO_CONSTS

/* the same scores from the chunk's prepared tile (scores_ktile_d128) */
#define DEF_TSCORES(K, NAME, ATTR)                                                              \
ATTR static void NAME(const tq_codec *c, const void *kt, int n, const float *qf, float *s)     \
{                                                                                               \
	SCORER_HEAD;                                                                            \
	(void)c;                                                                                \
	for (int t = 0; t < n; t += 4) {                                                        \
		TQA_PF_STEP(); /* paced prefetch: two lines per 4 tokens */                     \
		TQA_PF_STEP();                                                                  \
		const int t1 = t + 1 < n ? t + 1 : t, t2 = t + 2 < n ? t + 2 : t;               \
		const int t3 = t + 3 < n ? t + 3 : t;                                           \
		const int left = n - t < 4 ? n - t : 4;                                         \
		__m512 a[16];                                                                   \
		float sc_[4];                                                                   \
		TOKEN_T(K, t, 0);                                                               \
		TOKEN_T(K, t1, 1);                                                              \
		TOKEN_T(K, t2, 2);                                                              \
		TOKEN_T(K, t3, 3);                                                              \
		FINISH(K);                                                                      \
	}                                                                                       \
}

/* ktile_d128 of codec C: each block's k[4] and scales into the tile */
#define DEF_KTILE(C, K)                                                                         \
static void ktile_##C(const tq_codec *c, const uint8_t *src, int n, const void *qv, void *kt)   \
{                                                                                               \
	const float *qf = (const float *)qv;                                                    \
	SCORER_HEAD;                                                                            \
	TQO_CONSTS_##K;                                                                         \
	(void)qi; (void)bidx; (void)fac;                                                        \
	for (int t = 0; t < n; t++) {                                                           \
		const uint8_t *b = src + (size_t)t * c->block_bytes;                            \
		__m512i k_[4];                                                                  \
		float sa_ = 1.0f, sb_ = 1.0f;                                                   \
		LOAD_##K(C, b, k_, sa_, sb_);                                                   \
		_Pragma("GCC unroll 4")                                                         \
		for (int g = 0; g < 4; g++)                                                     \
			_mm512_store_si512((void *)(KT_K(kt, t) + g), k_[g]);                   \
		KT_S(kt)[2 * t] = sa_;                                                          \
		KT_S(kt)[2 * t + 1] = sb_;                                                      \
	}                                                                                       \
}

#define PAIR MADD2
#define DOT4 MADD4
DEF_ISCORES(tq4, KIND_TQ, iscores_tq4, )
DEF_ISCORES(tq3, KIND_TQ, iscores_tq3, )
DEF_ISCORES(tq2, KIND_TQ, iscores_tq2, )
DEF_ISCORES(q8, KIND_Q8, iscores_q8, )
DEF_ISCORES(tq4o, KIND_TQO, iscores_tq4o, )
DEF_ISCORES(tq3o, KIND_TQO, iscores_tq3o, )
DEF_TSCORES(KIND_TQ, tscores_tq, )
DEF_TSCORES(KIND_Q8, tscores_q8, )
DEF_TSCORES(KIND_TQO, tscores_tqo, )
#undef PAIR
#undef DOT4
#define PAIR MADD2_VNNI
#define DOT4 MADD4_VNNI
DEF_ISCORES(tq4, KIND_TQ, iscores_vnni_tq4, VNNI)
DEF_ISCORES(tq3, KIND_TQ, iscores_vnni_tq3, VNNI)
DEF_ISCORES(tq2, KIND_TQ, iscores_vnni_tq2, VNNI)
DEF_ISCORES(q8, KIND_Q8, iscores_vnni_q8, VNNI)
DEF_ISCORES(tq4o, KIND_TQO, iscores_vnni_tq4o, VNNI)
DEF_ISCORES(tq3o, KIND_TQO, iscores_vnni_tq3o, VNNI)
DEF_TSCORES(KIND_TQ, tscores_vnni_tq, VNNI)
DEF_TSCORES(KIND_Q8, tscores_vnni_q8, VNNI)
DEF_TSCORES(KIND_TQO, tscores_vnni_tqo, VNNI)
#undef PAIR
#undef DOT4
DEF_KTILE(tq4, KIND_TQ)
DEF_KTILE(tq3, KIND_TQ)
DEF_KTILE(tq2, KIND_TQ)
DEF_KTILE(q8, KIND_Q8)
DEF_KTILE(tq4o, KIND_TQO)
DEF_KTILE(tq3o, KIND_TQO)

DEF_SCORES(f16)
DEF_SCORES(f32)
DEF_ACCUM(tq4)

/* The order accum_tq4 and accum_tq3 keep acc in: position 64h + 16b + m
 * holds dim 64h + 4m + b, the order their dword-wise decoders give. */
#define AO(p) (((p) & 64) | (((p) & 15) << 2) | (((p) >> 4) & 3))
static const uint8_t acc_order[128] = TQA_ORDER128(AO);
#undef AO

/* A d = 128 tq3 block's 128 index bytes into o (64-byte aligned), in dim
 * order, only their low 3 bits defined (vpermps over the codebook
 * replicated to 16 reads 4): dim 32g + j has its low bits in byte j of the
 * 2-bit plane at shift 2g, its high bit in byte j % 16 of the 1-bit plane
 * at bit 2g + (j >= 16) (tq_layout.h).  Both planes broadcast by the loads
 * themselves; each 64 dims one per-half shift of the low bits, one
 * rotation of the high bits (by 64-bit lanes: a bit moves within its
 * byte) and a merge. */
static inline void tq3_ix128_z(const uint8_t *blk, uint8_t *o)
{
	const __m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(blk + 4)));
	const __m512i y = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)(blk + 36)));
	const __m512i m3 = _mm512_set1_epi8(3);
	/* bit s of each byte of the 1-bit plane -> bit 2, s = 128-bit lane
	 * (+ 4 for dims 64..127): a rotation right by s - 2 */
	const __m512i ha = _mm512_set_epi64(1, 1, 0, 0, 63, 63, 62, 62), hb = _mm512_set_epi64(5, 5, 4, 4, 3, 3, 2, 2);
	/* the 2-bit plane's shift per 256-bit half: 2g */
	const __m512i la = _mm512_set_epi64(0x0002000200020002LL, 0x0002000200020002LL, 0x0002000200020002LL,
					    0x0002000200020002LL, 0, 0, 0, 0);
	const __m512i lb = _mm512_add_epi16(la, _mm512_set1_epi16(4));

	_mm512_store_si512((void *)o, _mm512_ternarylogic_epi32(m3, _mm512_srlv_epi16(x, la),
								 _mm512_rorv_epi64(y, ha), 0xCA));
	_mm512_store_si512((void *)(o + 64), _mm512_ternarylogic_epi32(m3, _mm512_srlv_epi16(x, lb),
									_mm512_rorv_epi64(y, hb), 0xCA));
}

/* accum_tq3's passes over the chunk's index bytes ix, with the prefetch
 * steps (pf) or without (NULL: nothing paced; the check in the loop cost
 * tq4 / tq3 a few per cent, as on AVX2). */
static inline __attribute__((always_inline)) void tq3_passes_z(const uint8_t *ix, int n, const float *w, float *acc,
								const float *alpha, __m512 cb, struct tqa_pf *pf)
{
	_Pragma("GCC unroll 2")
	for (int h = 0; h < 2; h++) {
		__m512 a[16];
		_Pragma("GCC unroll 4")
		for (int r = 0; r < 4; r++) {
			const __m512 al = _mm512_set1_ps(alpha[r]);
			_Pragma("GCC unroll 4")
			for (int k = 0; k < 4; k++)
				a[r * 4 + k] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * D + 64 * h + 16 * k), al);
		}
		const uint8_t *ip = ix + 64 * h;
		for (int t = 0; t < n; t++, ip += D) {
			if (pf)
				tqa_pf_step(pf); /* a line per token of each pass */
			const __m512 v0 = _mm512_permutexvar_ps(_mm512_loadu_si512((const void *)ip), cb);
			const __m512 v1 = _mm512_permutexvar_ps(_mm512_loadu_si512((const void *)(ip + 1)), cb);
			const __m512 v2 = _mm512_permutexvar_ps(_mm512_loadu_si512((const void *)(ip + 2)), cb);
			const __m512 v3 = _mm512_permutexvar_ps(_mm512_loadu_si512((const void *)(ip + 3)), cb);
			_Pragma("GCC unroll 4")
			for (int r = 0; r < 4; r++) {
				const __m512 wr = _mm512_set1_ps(w[4 * t + r]);
				a[r * 4 + 0] = _mm512_fmadd_ps(wr, v0, a[r * 4 + 0]);
				a[r * 4 + 1] = _mm512_fmadd_ps(wr, v1, a[r * 4 + 1]);
				a[r * 4 + 2] = _mm512_fmadd_ps(wr, v2, a[r * 4 + 2]);
				a[r * 4 + 3] = _mm512_fmadd_ps(wr, v3, a[r * 4 + 3]);
			}
		}
		_Pragma("GCC unroll 4")
		for (int r = 0; r < 4; r++)
			_Pragma("GCC unroll 4")
			for (int k = 0; k < 4; k++)
				_mm512_storeu_ps(acc + r * D + 64 * h + 16 * k, a[r * 4 + k]);
	}
}

/* tq3 values: the chunk's index bytes first (tq3_ix128_z), then the passes
 * look them up 16 dims per unaligned load at byte b of each 64: dword m's
 * low byte is dim 4m + b's index, and vpermps reads its low 4 bits — one
 * load and one vpermps per 16 dims, acc in acc_order (a vpmovzxbd per 16
 * dims, in dim order, was 5-10 % slower in `tqbench kern`; shifts of one
 * load in place of the loads, 1-2 %). */
static void accum_tq3(const tq_codec *c, const uint8_t *src, int n, float *acc,
		      const float *alpha, const float *p)
{
	CB_tq3;
	const size_t bb = c->block_bytes;
	float w[TQA_CHUNK * TQA_ROWS] __attribute__((aligned(64)));
	uint8_t ix[TQA_CHUNK * D + 64] __attribute__((aligned(64)));

	memset(ix + (size_t)n * D, 0, 64); /* the last loads' 3 bytes past the tokens */
	for (int t = 0; t < n; t++) {
		const uint8_t *b = src + (size_t)t * bb;
		__m128 sc = _mm_set1_ps(hdr_scale(b));
		_mm_store_ps(w + 4 * t, _mm_mul_ps(_mm_loadu_ps(p + 4 * t), sc));
		tq3_ix128_z(b, ix + (size_t)t * D);
	}
	if (tqa_pf_cur.i < 2)
		tq3_passes_z(ix, n, w, acc, alpha, cb, &tqa_pf_cur);
	else
		tq3_passes_z(ix, n, w, acc, alpha, cb, NULL);
}
DEF_ACCUM(tq2)
DEF_ACCUM(q8)
DEF_ACCUM(f16)
DEF_ACCUM(f32)
#undef D

#define OPS(ISC, TSC)                                                                              \
	{                                                                                       \
		.isa = TQ_ISA_AVX512,                                                           \
		.pf_paced = 1,                                                                  \
		.decode = decode_avx512,                                                        \
		.scores = scores_avx512,                                                        \
		.softmax = softmax_avx512,                                                      \
		.accum = accum_avx512,                                                          \
		.scores_d128 = {                                                                \
			[TQ_CODEC_TQ4] = ISC##tq4, [TQ_CODEC_TQ3] = ISC##tq3, [TQ_CODEC_TQ2] = ISC##tq2, \
			[TQ_CODEC_Q8] = ISC##q8, [TQ_CODEC_F16] = scores_f16, [TQ_CODEC_F32] = scores_f32, \
			[TQ_CODEC_TQ4O] = ISC##tq4o, [TQ_CODEC_TQ3O] = ISC##tq3o,              \
		},                                                                              \
		.ktile_d128 = {                                                                 \
			[TQ_CODEC_TQ4] = ktile_tq4, [TQ_CODEC_TQ3] = ktile_tq3, [TQ_CODEC_TQ2] = ktile_tq2, \
			[TQ_CODEC_Q8] = ktile_q8, [TQ_CODEC_TQ4O] = ktile_tq4o, [TQ_CODEC_TQ3O] = ktile_tq3o, \
		},                                                                              \
		.scores_ktile_d128 = {                                                          \
			[TQ_CODEC_TQ4] = TSC##tq, [TQ_CODEC_TQ3] = TSC##tq, [TQ_CODEC_TQ2] = TSC##tq, \
			[TQ_CODEC_Q8] = TSC##q8, [TQ_CODEC_TQ4O] = TSC##tqo, [TQ_CODEC_TQ3O] = TSC##tqo, \
		},                                                                              \
		.qprep_d128 = {                                                                 \
			[TQ_CODEC_TQ4] = qprep_cb, [TQ_CODEC_TQ3] = qprep_cb, [TQ_CODEC_TQ2] = qprep_cb, \
			[TQ_CODEC_Q8] = qprep_q8, [TQ_CODEC_TQ4O] = qprep_tqo, [TQ_CODEC_TQ3O] = qprep_tqo, \
		},                                                                              \
		.accum_d128 = {                                                                 \
			[TQ_CODEC_TQ4] = accum_tq4, [TQ_CODEC_TQ3] = accum_tq3, [TQ_CODEC_TQ2] = accum_tq2, \
			[TQ_CODEC_Q8] = accum_q8, [TQ_CODEC_F16] = accum_f16, [TQ_CODEC_F32] = accum_f32, \
		},                                                                              \
		.accum_d128_perm = { [TQ_CODEC_TQ4] = acc_order, [TQ_CODEC_TQ3] = acc_order },   \
	}

static const struct tqa_ops ops = OPS(iscores_, tscores_), ops_vnni = OPS(iscores_vnni_, tscores_vnni_);

/* With AVX512-VNNI (Ice Lake, Zen 4 and later) the integer key scoring
 * saves one instruction per pair of products: 13 % faster key scores in
 * `tqbench kern` on Zen 4 (BENCHMARKS.md 2), the same bits. */
const struct tqa_ops *tqa_ops_avx512(void)
{
	return __builtin_cpu_supports("avx512vnni") ? &ops_vnni : &ops;
}

const struct tqa_ops *tqa_ops_avx512_vnni(int vnni)
{
	return vnni ? (__builtin_cpu_supports("avx512vnni") ? &ops_vnni : NULL) : &ops;
}
#endif /* __x86_64__ */
