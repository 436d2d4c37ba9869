/* tq_avx2.h — AVX2 helpers shared by tq_codec_avx2.c, tq_attn_avx2.c and
 * tq_attn_avx512.c: the centroid codecs' indices turned into centroid floats
 * by byte shuffles, and tq3's index bytes (tq3_ix128).
 * Include only from files built with the AVX2 flags (*_avx2.c, *_avx512.c); kernels/
 * internal, not installed.
 *
 * A float centroid is 4 bytes; T[b] holds byte b of c[0..15] in both 128-bit
 * lanes, so 4 vpshufb look up 32 indices at once (in-lane shuffles, which
 * Zen 2/3 run two a cycle, where a cross-lane vpermps/vpmovzx is one) and 8
 * byte/word interleaves put the bytes back together.  The interleaves work
 * within lanes; one vpermd of the index bytes beforehand (lane 0: indices
 * 0-3, 8-11, 16-19, 24-27; lane 1: 4-7, 12-15, 20-23, 28-31) makes the 32
 * floats come out in order.  The bytes are the centroids' own: exact.
 */
#ifndef TQ_AVX2_H
#define TQ_AVX2_H

#include <immintrin.h>
#include <string.h>

#include "tq_internal.h"

struct tq_cent_tab { __m256i t[4]; };

static inline void tq_cent_tab_make(const tq_codec *c, struct tq_cent_tab *tb)
{
	uint8_t b[4][32];
	const int nc = 1 << c->bits;

	for (int i = 0; i < 16; i++) {
		uint32_t u = 0;
		if (i < nc)
			memcpy(&u, &c->cb.centroid[i], 4);
		for (int k = 0; k < 4; k++)
			b[k][i] = b[k][16 + i] = (uint8_t)(u >> (8 * k));
	}
	for (int k = 0; k < 4; k++)
		tb->t[k] = _mm256_loadu_si256((const __m256i *)(const void *)b[k]);
}

/* 32 index bytes (< 16, in order) -> c[idx] as 4 vectors of 8, in order */
static inline void tq_cent32v(const struct tq_cent_tab *tb, __m256i idx, __m256 f[4])
{
	const __m256i ix = _mm256_permutevar8x32_epi32(idx, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
	const __m256i b0 = _mm256_shuffle_epi8(tb->t[0], ix), b1 = _mm256_shuffle_epi8(tb->t[1], ix);
	const __m256i b2 = _mm256_shuffle_epi8(tb->t[2], ix), b3 = _mm256_shuffle_epi8(tb->t[3], ix);
	const __m256i l01 = _mm256_unpacklo_epi8(b0, b1), h01 = _mm256_unpackhi_epi8(b0, b1);
	const __m256i l23 = _mm256_unpacklo_epi8(b2, b3), h23 = _mm256_unpackhi_epi8(b2, b3);
	f[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(l01, l23));
	f[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(l01, l23));
	f[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(h01, h23));
	f[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(h01, h23));
}

/* the same, stored at o[0..31] */
static inline void tq_cent32(const struct tq_cent_tab *tb, __m256i idx, float *o)
{
	__m256 f[4];

	tq_cent32v(tb, idx, f);
	for (int k = 0; k < 4; k++)
		_mm256_storeu_ps(o + 8 * k, f[k]);
}

static inline __m256i tq_load32(const uint8_t *p)
{
	return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

/* A d = 128 tq3 block's 128 index bytes (< 8, in dim order) into o (32-byte
 * aligned): dim 32g + j has its low bits in byte j of the 2-bit plane at
 * shift 2g, its high bit in byte j % 16 of the 1-bit plane at shift 2g +
 * (j >= 16); in-lane shifts and masks, 32 dims per step. */
static inline void tq3_ix128(const uint8_t *blk, uint8_t *o)
{
	const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
	const __m256i x = tq_load32(blk + 4);
	const __m256i y = _mm256_srlv_epi64(_mm256_broadcastsi128_si256(
		_mm_loadu_si128((const __m128i *)(const void *)(blk + 36))), _mm256_set_epi64x(1, 1, 0, 0));
	__m256i *v = (__m256i *)(void *)o;

	_mm256_store_si256(v, _mm256_or_si256(_mm256_and_si256(x, m3),
					      _mm256_and_si256(_mm256_slli_epi16(y, 2), m4)));
	_mm256_store_si256(v + 1, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 2), m3),
						  _mm256_and_si256(y, m4)));
	_mm256_store_si256(v + 2, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 4), m3),
						  _mm256_and_si256(_mm256_srli_epi16(y, 2), m4)));
	_mm256_store_si256(v + 3, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 6), m3),
						  _mm256_and_si256(_mm256_srli_epi16(y, 4), m4)));
}

/* 1 if tq_cent_block handles codec c's dim: whole 32-byte loads of the
 * planes — tq4 at d % 64 == 0 (plane d/2 bytes), tq2 at d % 128 == 0 (d/4),
 * tq3 at d == 128 or d % 256 == 0 (d/4 and d/8) */
static inline int tq_cent_ok(const tq_codec *c)
{
	const int d = c->dim;

	switch (c->id) {
	case TQ_CODEC_TQ4: return d % 64 == 0;
	case TQ_CODEC_TQ2: return d % 128 == 0;
	case TQ_CODEC_TQ3: return d == 128 || d % 256 == 0;
	default: return 0;
	}
}

/* The index planes pl of one block (tq_layout.h) -> the d unscaled
 * centroids at o (tq_cent_ok(c) must hold) */
static inline void tq_cent_block(const tq_codec *c, const struct tq_cent_tab *tb, const uint8_t *pl, float *o)
{
	const int d = c->dim;
	const __m256i m15 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);

	switch (c->id) {
	case TQ_CODEC_TQ4: /* byte j: idx j | idx j + d/2 << 4 */
		for (int j = 0; j < d / 2; j += 32) {
			const __m256i x = tq_load32(pl + j);
			tq_cent32(tb, _mm256_and_si256(x, m15), o + j);
			tq_cent32(tb, _mm256_and_si256(_mm256_srli_epi16(x, 4), m15), o + d / 2 + j);
		}
		return;
	case TQ_CODEC_TQ2: /* byte j: idx j + s d/4 at bits 2s */
		for (int j = 0; j < d / 4; j += 32) {
			const __m256i x = tq_load32(pl + j);
			for (int sh = 0; sh < 4; sh++)
				tq_cent32(tb, _mm256_and_si256(_mm256_srli_epi16(x, 2 * sh), m3), o + sh * (d / 4) + j);
		}
		return;
	default: /* tq3: 2-bit plane (d/4 bytes), then 1-bit plane (d/8) */
		break;
	}
	const int s2 = d / 4, s1 = d / 8;
	if (d == 128) {
		/* dims 32g + i: low bits at 2g of byte i of the 2-bit plane; the
		 * high bit at 2g (i < 16) or 2g + 1 (i >= 16) of byte i % 16 of
		 * the 1-bit plane: lane 1 of y holds the plane shifted by one,
		 * then both move alike */
		const __m256i x = tq_load32(pl);
		const __m256i y = _mm256_srlv_epi64(_mm256_broadcastsi128_si256(
			_mm_loadu_si128((const __m128i *)(const void *)(pl + 32))), _mm256_set_epi64x(1, 1, 0, 0));
		const __m256i m4 = _mm256_set1_epi8(4);
		tq_cent32(tb, _mm256_or_si256(_mm256_and_si256(x, m3),
					      _mm256_and_si256(_mm256_slli_epi16(y, 2), m4)), o);
		tq_cent32(tb, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 2), m3),
					      _mm256_and_si256(y, m4)), o + 32);
		tq_cent32(tb, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 4), m3),
					      _mm256_and_si256(_mm256_srli_epi16(y, 2), m4)), o + 64);
		tq_cent32(tb, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 6), m3),
					      _mm256_and_si256(_mm256_srli_epi16(y, 4), m4)), o + 96);
		return;
	}
	/* d % 256 == 0: 32 dims at a time from 32 bytes of each plane */
	for (int g = 0; g < d; g += 32) {
		__m256i lo = _mm256_and_si256(_mm256_srli_epi16(tq_load32(pl + g % s2), 2 * (g / s2)), m3);
		__m256i hb = _mm256_srli_epi16(tq_load32(pl + s2 + g % s1), g / s1);
		tq_cent32(tb, _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hb, m1), 2)), o + g);
	}
}

#endif /* TQ_AVX2_H */
