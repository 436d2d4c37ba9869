/* tq_codec_avx512.c — AVX-512 (F/BW/DQ/VL) codec paths, bit-identical to
 * tq_codec_ref.c under the contract in tq_internal.h.
 *
 * Two shapes of the same arithmetic:
 *   - the register path, power-of-two dims 8..256 (Hadamard): a vector lives
 *     in d/16 zmm registers; the four in-register FWHT stages are a permute
 *     and an FMA with a ±1 vector (exact), the cross-register stages plain
 *     add/sub; indices come from a binary search with vpermps over the
 *     sorted bounds and are packed straight from the registers (d >= 128);
 *   - the memory path, every other dim (dense rotation, d = 512): [dim]
 *     float buffers on the stack, 16-lane chunks with a tail mask, the dense
 *     matvec as a column axpy accumulated in j order (mul, then add).
 * Anything unusual about one vector (NaN/Inf, a sum that overflows, a
 * non-finite block header, a zero minimum in q4a) is handed to the scalar
 * reference for that one vector, so errors and odd values follow it exactly.
 *
 * Thread context: reentrant; all state is on the stack.
 */
#include "tq_internal.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define AI static inline __attribute__((always_inline))

/* Decoded output of at least this many bytes goes out with non-temporal
 * stores (it would not fit the caches anyway). */
#define NT_MIN_BYTES (16u << 20)
/* Input rows prefetched this many bytes ahead. */
#define PF_AHEAD 1024

/* ---- small helpers ----------------------------------------------------------- */

/* Sum of the 16 lanes in the contract's order: l[i] += l[i+8], +4, +2, +1. */
AI float hsum16(__m512 a)
{
	__m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
	__m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
	__m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
	__m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
	return _mm_cvtss_f32(s1);
}

AI float sqrt_f(float x)
{
	return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(x)));
}

AI int finite_f(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	return (u & 0x7f800000u) != 0x7f800000u;
}

AI __mmask64 bmask(int n)
{
	return n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
}

/* Chunk k (16 elements) of an input row, converted to fp32 (exact). */
AI __m512 ld_chunk(const void *row, enum tq_dtype dt, int k, __mmask16 m)
{
	if (dt == TQ_DTYPE_F32)
		return _mm512_maskz_loadu_ps(m, (const float *)row + 16 * k);
	__m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + 16 * k);
	if (dt == TQ_DTYPE_F16)
		return _mm512_cvtph_ps(h);
	return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Store 16 floats, streaming when nt (dst 64-byte aligned, full chunk). */
AI void st_chunk(float *p, __m512 v, __mmask16 m, int nt)
{
	if (nt)
		_mm512_stream_ps(p, v);
	else if (m == 0xFFFF)
		_mm512_storeu_ps(p, v);
	else
		_mm512_mask_storeu_ps(p, m, v);
}

/* Largest |x| over the lanes, as bits: >= 0x7f800000 means a NaN or Inf. */
AI __m512i absbits_max(__m512i acc, __m512 v)
{
	return _mm512_max_epu32(acc, _mm512_and_si512(_mm512_castps_si512(v),
						      _mm512_set1_epi32(0x7fffffff)));
}

/* ---- per-call tables ------------------------------------------------------------ */

struct ctx {
	const tq_codec *c;
	int d, nc, bits, levels;
	__mmask16 mt;            /* lanes of the last chunk that hold values     */
	uint32_t bb;
	float isd;               /* rot.inv_sqrt_dim                             */
	__m512 first;            /* broadcast bound[L/2 - 1]                     */
	__m512 bt[3];            /* bt[j][k] = bound[k + s - 1], s = L/4 >> j     */
	__m512 ctab;             /* centroid[k mod L]                            */
	__m512 c2tab;            /* centroid[k mod L]^2 (the float product)       */
	/* grid quantizer (see grid_init); grid = 0 when it does not apply */
	int grid;
	__m512 ginvw, gnegc;     /* cell + 2^23 = u * invw + gnegc, rounded       */
	__m512 gclamp;           /* C: u is clamped to [-C, C] for the cell       */
	__m512i gbase[2];        /* [32] bounds in cells below                   */
	__m512 gbnd[2];          /* [32] the cell's bound, +Inf if none          */
};

/* Uniform-grid quantizer over N = 32 cells (16 when there are at most 7
 * bounds: one-table lookups).  pos(u) = u * invw + N/2 + 1/2 (exact reals of
 * the float constant invw), cell(u) = floor(pos(clamp(u, -C, C))), and C is
 * chosen so that every cell is in 0..N-1.  The grid has at most one bound
 * per cell, no bound within 2% of a cell edge, and all bounds inside
 * (-C, C) with C itself away from edges.  Then index = base[cell] +
 * (u > bound[cell]) is the count of bounds strictly below u: bounds in lower
 * cells are below u, bounds in higher cells above it, the cell's own one is
 * compared exactly (with u, not the clamped value: beyond ±C every bound is
 * on one side, and the table says so).
 * The cell comes from one fma: u * invw + (2^23 + 16) rounds (ulp 1) to
 * floor(pos) + 2^23 — except at an exact edge, where ties-to-even may give
 * the cell below; no bound is near an edge, and both neighbours then count
 * the same bounds.  The float's low mantissa bits are the cell, which
 * vpermt2ps reads directly.  The clamp is one vrangeps (abs-min, sign of u).
 * Returns 0 if no grid fits (the register path is then not used). */
static int grid_init(struct ctx *e, const float *b, int nb)
{
	const int N = nb <= 7 ? 16 : 32, half = N / 2;
	double gap = 1e30, best_margin = 0, ext = 0;
	float best_invw = 0, best_c = 0;

	if (nb < 1 || nb > 31)
		return 0;
	for (int i = 0; i + 1 < nb; i++)
		gap = b[i + 1] - b[i] < gap ? b[i + 1] - b[i] : gap;
	for (int i = 0; i < nb; i++)
		ext = fabs(b[i]) > ext ? fabs(b[i]) : ext;
	if (!(ext > 0))
		return 0;
	for (int t = 0; t < 32; t++) {
		/* the outermost bound sits half-3 .. half-1.1 cells from the centre */
		double w = ext / (half - 3.0 + t / 16.0);
		float invw = (float)(1.0 / w), C = (float)((half - 0.75) / invw);
		double margin = 1, pc = (double)C * invw;
		int prev = -1, ok = gap > 1.02 * w && pc < half - 0.6 && pc > ext * invw;
		for (int i = 0; i < nb && ok; i++) {
			double pos = (double)b[i] * invw + half + 0.5;
			int k = (int)floor(pos);
			double fr = pos - k;
			ok = k > prev && fabs(b[i]) < C;
			margin = fr < margin ? fr : margin;
			margin = 1 - fr < margin ? 1 - fr : margin;
			prev = k;
		}
		/* ±C: pos half + 0.5 ± pc, inside the grid and off the edges */
		double fc = half + 0.5 + pc - floor(half + 0.5 + pc);
		double fd = half + 0.5 - pc - floor(half + 0.5 - pc);
		margin = fc < margin ? fc : margin;
		margin = 1 - fc < margin ? 1 - fc : margin;
		margin = fd < margin ? fd : margin;
		margin = 1 - fd < margin ? 1 - fd : margin;
		if (ok && margin > best_margin) {
			best_margin = margin;
			best_invw = invw;
			best_c = C;
			if (margin >= 0.05)
				break; /* good enough: this runs once per encode call */
		}
	}
	if (best_margin < 0.02)
		return 0;
	int32_t base[32];
	float bnd[32];
	for (int k = 0, i = 0; k < 32; k++) {
		base[k] = i;
		bnd[k] = __builtin_inff();
		if (i < nb && (int)floor((double)b[i] * best_invw + half + 0.5) == k)
			bnd[k] = b[i++];
	}
	e->ginvw = _mm512_set1_ps(best_invw);
	e->gnegc = _mm512_set1_ps(8388608.0f + (float)half);
	e->gclamp = _mm512_set1_ps(best_c);
	e->gbase[0] = _mm512_loadu_si512(base);
	e->gbase[1] = _mm512_loadu_si512(base + 16);
	e->gbnd[0] = _mm512_loadu_ps(bnd);
	e->gbnd[1] = _mm512_loadu_ps(bnd + 16);
	return 1;
}

/* grid: build the quantizer grid too (encode only). */
static void ctx_init(struct ctx *e, const tq_codec *c, int grid)
{
	e->c = c;
	e->d = c->dim;
	e->nc = (c->dim + 15) / 16;
	e->mt = (c->dim & 15) ? 0x00FF : 0xFFFF;
	e->bits = c->bits;
	e->bb = c->block_bytes;
	e->isd = c->rot.inv_sqrt_dim;
	e->levels = 0;
	e->grid = 0;
	if (c->id == TQ_CODEC_TQ2 || c->id == TQ_CODEC_TQ3 || c->id == TQ_CODEC_TQ4) {
		const tq_codebook *cb = &c->cb;
		int L = cb->levels, j = 0;
		float ct[16], c2[16];

		for (int k = 0; k < 16; k++) {
			ct[k] = cb->centroid[k % L];
			c2[k] = ct[k] * ct[k];
		}
		e->levels = L;
		e->first = _mm512_set1_ps(cb->bound[L / 2 - 1]);
		for (int s = L / 4; s >= 1; s >>= 1)
			e->bt[j++] = _mm512_loadu_ps(cb->bound + s - 1);
		e->ctab = _mm512_loadu_ps(ct);
		e->c2tab = _mm512_loadu_ps(c2);
		e->grid = grid ? grid_init(e, cb->bound, L - 1) : 0;
	}
}

/* Index = number of bounds strictly below u: the reference's binary search,
 * one vpermps per step after the first. */
AI __m512i quant(const struct ctx *e, __m512 u, int L)
{
	__m512i lo = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(u, e->first, _CMP_GT_OQ),
					    _mm512_set1_epi32(L / 2));
	int j = 0;
	#pragma GCC unroll 32
	for (int s = L / 4; s >= 1; s >>= 1, j++) {
		__m512 b = _mm512_permutexvar_ps(lo, e->bt[j]);
		lo = _mm512_mask_or_epi32(lo, _mm512_cmp_ps_mask(u, b, _CMP_GT_OQ), lo,
					  _mm512_set1_epi32(s));
	}
	return lo;
}

/* bits: the codec's (<= 3: the 16-cell grid of grid_init). */
AI __m512i quant_grid(const struct ctx *e, __m512 u, int bits)
{
	/* imm 0x02: abs-min of (u, C), sign of u = clamp(u, -C, C) */
	__m512 uc = _mm512_range_ps(u, e->gclamp, 0x02);
	__m512i k = _mm512_castps_si512(_mm512_fmadd_ps(uc, e->ginvw, e->gnegc));
	__m512i base = bits <= 3 ? _mm512_permutexvar_epi32(k, e->gbase[0])
				 : _mm512_permutex2var_epi32(e->gbase[0], k, e->gbase[1]);
	__m512 bnd = bits <= 3 ? _mm512_permutexvar_ps(k, e->gbnd[0])
			       : _mm512_permutex2var_ps(e->gbnd[0], k, e->gbnd[1]);
	return _mm512_mask_sub_epi32(base, _mm512_cmp_ps_mask(u, bnd, _CMP_GT_OQ), base,
				     _mm512_set1_epi32(-1));
}

/* ---- FWHT ------------------------------------------------------------------------ */

/* The stages h = 1, 2, 4 (and 8 when n > 8) inside one register. */
AI __m512 fwht16(__m512 a, int n)
{
	const __m512 p1 = _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
	const __m512 p2 = _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1);
	const __m512 p4 = _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1);
	const __m512 p8 = _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1);

	/* lower lane: a + partner; upper lane: partner - a (one rounding) */
	a = _mm512_fmadd_ps(a, p1, _mm512_permute_ps(a, 0xB1));
	a = _mm512_fmadd_ps(a, p2, _mm512_permute_ps(a, 0x4E));
	a = _mm512_fmadd_ps(a, p4, _mm512_shuffle_f32x4(a, a, 0xB1));
	if (n > 8)
		a = _mm512_fmadd_ps(a, p8, _mm512_shuffle_f32x4(a, a, 0x4E));
	return a;
}

AI void fwht_regs(__m512 *v, int nr, int n)
{
	#pragma GCC unroll 32
	for (int k = 0; k < nr; k++)
		v[k] = fwht16(v[k], n);
	#pragma GCC unroll 32
	for (int h = 1; h < nr; h <<= 1)
		#pragma GCC unroll 32
		for (int i = 0; i < nr; i += 2 * h)
			#pragma GCC unroll 32
			for (int j = i; j < i + h; j++) {
				__m512 a = v[j], b = v[j + h];
				v[j] = _mm512_add_ps(a, b);
				v[j + h] = _mm512_sub_ps(a, b);
			}
}

/* u: [n] floats, n a power of two >= 16. */
static void fwht_mem(float *u, int n)
{
	for (int k = 0; k < n; k += 16)
		_mm512_storeu_ps(u + k, fwht16(_mm512_loadu_ps(u + k), n));
	for (int h = 16; h < n; h <<= 1)
		for (int i = 0; i < n; i += 2 * h)
			for (int j = i; j < i + h; j += 16) {
				__m512 a = _mm512_loadu_ps(u + j), b = _mm512_loadu_ps(u + j + h);
				_mm512_storeu_ps(u + j, _mm512_add_ps(a, b));
				_mm512_storeu_ps(u + j + h, _mm512_sub_ps(a, b));
			}
}

/* ---- dense rotation ------------------------------------------------------------------ */

/* y[i] = sum over j of M[j][i] * x[j], j in order, mul then add, for the
 * chunks c0 .. c0+NB-1 (the last one's loads masked with ml, its store with
 * ms).  M: [d][d]. */
AI void mv_block(const float *M, const float *x, int d, float *y, int c0, int NB, __mmask16 ml,
		 __mmask16 ms, int nt)
{
	__m512 acc[8];

	for (int k = 0; k < NB; k++)
		acc[k] = _mm512_setzero_ps();
	for (int j = 0; j < d; j++) {
		const float *row = M + (size_t)j * d + 16 * c0;
		__m512 xj = _mm512_set1_ps(x[j]);
		for (int k = 0; k < NB; k++) {
			__m512 m = _mm512_maskz_loadu_ps(k == NB - 1 ? ml : 0xFFFF, row + 16 * k);
			acc[k] = _mm512_add_ps(acc[k], _mm512_mul_ps(m, xj));
		}
	}
	for (int k = 0; k < NB; k++)
		st_chunk(y + 16 * (c0 + k), acc[k], k == NB - 1 ? ms : 0xFFFF, nt);
}

/* y = column axpy over M's rows.  to_buf: y is a chunk buffer and gets
 * zeros in the tail lanes; else y is [d] and nothing past it is written.
 * With M = mat_t this is R x; with M = mat, R^T x. */
static void dense_mv(const float *M, const float *x, int d, float *y, int to_buf, int nt)
{
	int nc = (d + 15) / 16;
	__mmask16 mt = (d & 15) ? 0x00FF : 0xFFFF;

	for (int c0 = 0; c0 < nc; c0 += 8) {
		int nb = nc - c0 < 8 ? nc - c0 : 8;
		/* masked loads leave zeros in the tail lanes' accumulators */
		__mmask16 ml = c0 + nb == nc ? mt : 0xFFFF, ms = to_buf ? 0xFFFF : ml;
		switch (nb) {
		case 1: mv_block(M, x, d, y, c0, 1, ml, ms, nt); break;
		case 2: mv_block(M, x, d, y, c0, 2, ml, ms, nt); break;
		case 3: mv_block(M, x, d, y, c0, 3, ml, ms, nt); break;
		case 4: mv_block(M, x, d, y, c0, 4, ml, ms, nt); break;
		case 5: mv_block(M, x, d, y, c0, 5, ml, ms, nt); break;
		case 6: mv_block(M, x, d, y, c0, 6, ml, ms, nt); break;
		case 7: mv_block(M, x, d, y, c0, 7, ml, ms, nt); break;
		default: mv_block(M, x, d, y, c0, 8, ml, ms, nt); break;
		}
	}
}

/* ---- index planes ------------------------------------------------------------------- */

/* One plane of width w holding index bits [off, off + w) of idx[n]
 * (off + w <= 8: byte-wise 16-bit shifts then never carry across bytes). */
static void pack_plane(const uint8_t *idx, int n, int w, int off, uint8_t *out)
{
	const int S = n * w / 8;
	const __m512i mw = _mm512_set1_epi8((char)((1 << w) - 1));

	for (int j = 0; j < S; j += 64) {
		const __mmask64 m = bmask(S - j);
		__m512i o = _mm512_setzero_si512();
		for (int k = 0; k < 8 / w; k++) {
			__m512i t = _mm512_maskz_loadu_epi8(m, idx + k * S + j);
			t = _mm512_and_si512(_mm512_srl_epi16(t, _mm_cvtsi32_si128(off)), mw);
			o = _mm512_or_si512(o, _mm512_sll_epi16(t, _mm_cvtsi32_si128(k * w)));
		}
		_mm512_mask_storeu_epi8(out + j, m, o);
	}
}

/* From a byte array idx[d] (the generic layout code of tq_layout.h). */
static void pack_w4(const uint8_t *idx, int S, uint8_t *out)
{
	for (int j = 0; j < S; j += 64) {
		__mmask64 m = bmask(S - j);
		__m512i a = _mm512_maskz_loadu_epi8(m, idx + j), b = _mm512_maskz_loadu_epi8(m, idx + S + j);
		_mm512_mask_storeu_epi8(out + j, m, _mm512_or_si512(a, _mm512_slli_epi16(b, 4)));
	}
}

static void pack_w2(const uint8_t *idx, int S, uint8_t *out)
{
	const __m512i m3 = _mm512_set1_epi8(3);

	for (int j = 0; j < S; j += 64) {
		__mmask64 m = bmask(S - j);
		__m512i o = _mm512_and_si512(_mm512_maskz_loadu_epi8(m, idx + j), m3);
		__m512i a1 = _mm512_and_si512(_mm512_maskz_loadu_epi8(m, idx + S + j), m3);
		__m512i a2 = _mm512_and_si512(_mm512_maskz_loadu_epi8(m, idx + 2 * S + j), m3);
		__m512i a3 = _mm512_and_si512(_mm512_maskz_loadu_epi8(m, idx + 3 * S + j), m3);
		o = _mm512_or_si512(o, _mm512_slli_epi16(a1, 2));
		o = _mm512_or_si512(o, _mm512_slli_epi16(a2, 4));
		o = _mm512_or_si512(o, _mm512_slli_epi16(a3, 6));
		_mm512_mask_storeu_epi8(out + j, m, o);
	}
}

/* The 1-bit plane of bit 2 (tq3). */
static void pack_w1(const uint8_t *idx, int S, uint8_t *out)
{
	const __m512i m4 = _mm512_set1_epi8(4);

	for (int j = 0; j < S; j += 64) {
		__mmask64 m = bmask(S - j);
		__m512i o = _mm512_setzero_si512();
		for (int s = 0; s < 8; s++) {
			__m512i t = _mm512_and_si512(_mm512_maskz_loadu_epi8(m, idx + s * S + j), m4);
			t = s < 2 ? _mm512_srli_epi16(t, 2 - s) : _mm512_slli_epi16(t, s - 2);
			o = _mm512_or_si512(o, t);
		}
		_mm512_mask_storeu_epi8(out + j, m, o);
	}
}

/* idx[d] into the planes of a `bits`-bit index: the widths tq2..tq4 use by
 * the kernels above, any other (tq4o's 5-bit half) plane by plane. */
static void pack_gen(const uint8_t *idx, int d, int bits, uint8_t *out)
{
	if (bits < 2 || bits > 4) {
		for (int w = 8, off = 0; w >= 1; w >>= 1) {
			if (!(bits & w))
				continue;
			pack_plane(idx, d, w, off, out);
			out += d * w / 8;
			off += w;
		}
	} else if (bits == 4) {
		pack_w4(idx, d / 2, out);
	} else {
		pack_w2(idx, d / 4, out);
		if (bits == 3)
			pack_w1(idx, d / 8, out + d / 4);
	}
}

static void unpack_gen(const uint8_t *in, int d, int bits, uint8_t *idx)
{
	if (bits == 4) {
		const __m512i m15 = _mm512_set1_epi8(15);
		int S = d / 2;
		for (int j = 0; j < S; j += 64) {
			__mmask64 m = bmask(S - j);
			__m512i b = _mm512_maskz_loadu_epi8(m, in + j);
			_mm512_mask_storeu_epi8(idx + j, m, _mm512_and_si512(b, m15));
			_mm512_mask_storeu_epi8(idx + S + j, m,
						_mm512_and_si512(_mm512_srli_epi16(b, 4), m15));
		}
		return;
	}
	const __m512i m3 = _mm512_set1_epi8(3), m4 = _mm512_set1_epi8(4);
	int S = d / 4;
	for (int j = 0; j < S; j += 64) {
		__mmask64 m = bmask(S - j);
		__m512i b = _mm512_maskz_loadu_epi8(m, in + j);
		for (int s = 0; s < 4; s++)
			_mm512_mask_storeu_epi8(idx + s * S + j, m,
						_mm512_and_si512(_mm512_srli_epi16(b, 2 * s), m3));
	}
	if (bits != 3)
		return;
	in += S;
	S = d / 8;
	for (int j = 0; j < S; j += 64) {
		__mmask64 m = bmask(S - j);
		__m512i b = _mm512_maskz_loadu_epi8(m, in + j);
		for (int s = 0; s < 8; s++) {
			uint8_t *p = idx + s * S + j;
			__m512i t = s < 2 ? _mm512_slli_epi16(b, 2 - s) : _mm512_srli_epi16(b, s - 2);
			t = _mm512_or_si512(_mm512_and_si512(t, m4), _mm512_maskz_loadu_epi8(m, p));
			_mm512_mask_storeu_epi8(p, m, t);
		}
	}
}

/* From index registers q[nr] (nr >= 8, lanes of register k = elements
 * 16k..16k+15).  Only the low `bits` bits of each lane are read. */
AI void pack_regs(const __m512i *q, int nr, int bits, uint8_t *out)
{
	if (bits == 4) {
		#pragma GCC unroll 32
		for (int k = 0; k < nr / 2; k++) {
			__m512i p = _mm512_or_si512(q[k], _mm512_slli_epi32(q[k + nr / 2], 4));
			_mm_storeu_si128((__m128i *)(out + 16 * k), _mm512_cvtepi32_epi8(p));
		}
		return;
	}
	const __m512i m3 = _mm512_set1_epi32(3);
	int r = nr / 4;
	#pragma GCC unroll 32
	for (int k = 0; k < r; k++) {
		__m512i p;
		if (bits == 2) {
			p = _mm512_ternarylogic_epi32(q[k], _mm512_slli_epi32(q[k + r], 2),
						      _mm512_slli_epi32(q[k + 2 * r], 4), 0xFE);
			p = _mm512_or_si512(p, _mm512_slli_epi32(q[k + 3 * r], 6));
		} else {
			/* A | (B & C) = 0xF8 */
			p = _mm512_and_si512(q[k], m3);
			p = _mm512_ternarylogic_epi32(p, _mm512_slli_epi32(q[k + r], 2),
						      _mm512_set1_epi32(3 << 2), 0xF8);
			p = _mm512_ternarylogic_epi32(p, _mm512_slli_epi32(q[k + 2 * r], 4),
						      _mm512_set1_epi32(3 << 4), 0xF8);
			p = _mm512_ternarylogic_epi32(p, _mm512_slli_epi32(q[k + 3 * r], 6),
						      _mm512_set1_epi32(3 << 6), 0xF8);
		}
		_mm_storeu_si128((__m128i *)(out + 16 * k), _mm512_cvtepi32_epi8(p));
	}
	if (bits != 3)
		return;
	out += 4 * nr;           /* d / 4 */
	r = nr / 8;
	#pragma GCC unroll 32
	for (int k = 0; k < r; k++) {
		/* byte l, bit s = bit 2 of lane l of register k + s*r: a test
		 * into a mask, then a masked byte add of 1 << s */
		__m128i p = _mm_setzero_si128();
		#pragma GCC unroll 32
		for (int s = 0; s < 8; s++)
			p = _mm_mask_add_epi8(p, _mm512_test_epi32_mask(q[k + s * r], _mm512_set1_epi32(4)), p,
					      _mm_set1_epi8((char)(1 << s)));
		_mm_storeu_si128((__m128i *)(out + 16 * k), p);
	}
}

/* The inverse: q[k] holds the index in its low bits; higher bits are
 * garbage that vpermps ignores (bits >= 4) or that the replicated table
 * absorbs (bits >= log2 L). */
AI void unpack_regs(const uint8_t *in, int nr, int bits, __m512i *q)
{
	if (bits == 4) {
		#pragma GCC unroll 32
		for (int k = 0; k < nr / 2; k++) {
			__m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(in + 16 * k)));
			q[k] = b;
			q[k + nr / 2] = _mm512_srli_epi32(b, 4);
		}
		return;
	}
	int r = nr / 4;
	#pragma GCC unroll 32
	for (int k = 0; k < r; k++) {
		__m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(in + 16 * k)));
		q[k] = b;
		q[k + r] = _mm512_srli_epi32(b, 2);
		q[k + 2 * r] = _mm512_srli_epi32(b, 4);
		q[k + 3 * r] = _mm512_srli_epi32(b, 6);
	}
	if (bits != 3)
		return;
	in += 4 * nr;
	r = nr / 8;
	#pragma GCC unroll 32
	for (int k = 0; k < r; k++) {
		__m512i h = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(in + 16 * k)));
		#pragma GCC unroll 32
		for (int s = 0; s < 8; s++) {
			__m512i t = s < 2 ? _mm512_slli_epi32(h, 2 - s) : _mm512_srli_epi32(h, s - 2);
			/* (A & C) | (B & ~C), C = 3: bits 0-1 from the 2-bit plane */
			q[k + s * r] = _mm512_ternarylogic_epi32(q[k + s * r], t, _mm512_set1_epi32(3), 0xE4);
		}
	}
}

/* ---- row kernels --------------------------------------------------------------------
 * Encode kernels return 0 when the block is written and 1 when the vector
 * must go to the reference (nothing written). */

#define RMAX 16   /* register path: d <= 256 */

AI void ld_regs(__m512 *x, const void *row, enum tq_dtype dt, int nr, int d)
{
	#pragma GCC unroll 32
	for (int k = 0; k < nr; k++)
		x[k] = ld_chunk(row, dt, k, d < 16 ? 0x00FF : 0xFFFF);
}

/* NV = 2 interleaves two vectors' dependency chains (sum of squares →
 * sqrt → scale → quantize → centroid sum → sqrt): one vector's chain is
 * longer than its throughput cost, and the out-of-order window holds only
 * about one.  Returns 0 when every block is written; 1 (nothing written)
 * when a vector is zero or not finite — the caller then takes the vectors
 * one at a time. */
AI int enc_tq_rn(const struct ctx *e, const uint8_t *row, size_t rb, enum tq_dtype dt, uint8_t *blk,
		 int d, int bits, int NV)
{
	const int nr = d < 16 ? 1 : d / 16;
	const uint32_t *sign_bits = e->c->rot.sign_bits;
	__m512 x[2][RMAX];
	__m512i q[2][RMAX];
	float norm[2], fac[2];

	#pragma GCC unroll 2
	for (int v = 0; v < NV; v++) {
		ld_regs(x[v], row + v * rb, dt, nr, d);
		__m512 acc = _mm512_mul_ps(x[v][0], x[v][0]);
		#pragma GCC unroll 32
		for (int k = 1; k < nr; k++)
			acc = _mm512_add_ps(acc, _mm512_mul_ps(x[v][k], x[v][k]));
		float ss = hsum16(acc);
		if (!(ss <= FLT_MAX) || (NV > 1 && ss == 0.0f))
			return 1;
		if (ss == 0.0f) {
			memset(blk, 0, e->bb);
			return 0;
		}
		norm[v] = sqrt_f(ss);
		fac[v] = (1.0f / norm[v]) * e->isd;
	}
	#pragma GCC unroll 2
	for (int v = 0; v < NV; v++) {
		/* x is finite here: a sign flip is the multiply by -1 */
		#pragma GCC unroll 32
		for (int k = 0; k < nr; k++)
			x[v][k] = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x[v][k]),
				_mm512_maskz_loadu_epi32(d < 16 ? 0x00FF : 0xFFFF, sign_bits + 16 * k)));
		fwht_regs(x[v], nr, d);
	}
	#pragma GCC unroll 2
	for (int v = 0; v < NV; v++) {
		const __m512 f = _mm512_set1_ps(fac[v]);
		__m512 a2 = _mm512_setzero_ps();
		#pragma GCC unroll 32
		for (int k = 0; k < nr; k++) {
			q[v][k] = quant_grid(e, _mm512_mul_ps(x[v][k], f), bits);
			__m512 c2 = _mm512_maskz_permutexvar_ps(d < 16 ? 0x00FF : 0xFFFF, q[v][k], e->c2tab);
			a2 = k ? _mm512_add_ps(a2, c2) : c2;
		}
		float scale = norm[v] / sqrt_f(hsum16(a2));
		uint8_t *out = blk + v * e->bb;
		memcpy(out, &scale, 4);
		if (nr >= 8) {
			pack_regs(q[v], nr, bits, out + TQ_TQ_HEADER_BYTES);
		} else {
			uint8_t idx[128];
			#pragma GCC unroll 32
			for (int k = 0; k < nr; k++)
				_mm_storeu_si128((__m128i *)(idx + 16 * k), _mm512_cvtepi32_epi8(q[v][k]));
			pack_gen(idx, d, bits, out + TQ_TQ_HEADER_BYTES);
		}
	}
	return 0;
}

AI int enc_tq_r(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk, int d, int bits)
{
	return enc_tq_rn(e, row, 0, dt, blk, d, bits, 1);
}

/* Returns 1 (nothing written) when the header is not finite. */
AI int dec_tq_r(const struct ctx *e, const uint8_t *blk, float *x, int d, int bits, int nt)
{
	const int nr = d < 16 ? 1 : d / 16;
	const __mmask16 m = d < 16 ? 0x00FF : 0xFFFF;
	const float *sign = e->c->rot.sign;
	__m512 v[RMAX];
	__m512i q[RMAX];
	float scale;

	memcpy(&scale, blk, 4);
	if (!finite_f(scale))
		return 1;
	const __m512 tab = _mm512_mul_ps(e->ctab, _mm512_set1_ps(scale * e->isd));
	if (nr >= 8) {
		unpack_regs(blk + TQ_TQ_HEADER_BYTES, nr, bits, q);
	} else {
		uint8_t idx[128] = { 0 };
		unpack_gen(blk + TQ_TQ_HEADER_BYTES, d, bits, idx);
		#pragma GCC unroll 32
		for (int k = 0; k < nr; k++)
			q[k] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(idx + 16 * k)));
	}
	#pragma GCC unroll 32
	for (int k = 0; k < nr; k++)
		v[k] = _mm512_permutexvar_ps(q[k], tab);
	fwht_regs(v, nr, d);
	#pragma GCC unroll 32
	for (int k = 0; k < nr; k++)
		st_chunk(x + 16 * k, _mm512_mul_ps(v[k], _mm512_maskz_loadu_ps(m, sign + 16 * k)), m, nt);
	return 0;
}

AI int enc_q8_r(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk, int d)
{
	const int nr = d < 16 ? 1 : d / 16;
	const __mmask16 m = d < 16 ? 0x00FF : 0xFFFF;
	const float *sign = e->c->rot.sign;
	__m512 x[RMAX];

	ld_regs(x, row, dt, nr, d);
	#pragma GCC unroll 32
	for (int k = 0; k < nr; k++)
		x[k] = _mm512_mul_ps(x[k], _mm512_maskz_loadu_ps(m, sign + 16 * k));
	fwht_regs(x, nr, d);
	const __m512 f = _mm512_set1_ps(1.0f * e->isd);
	__m512i amx = _mm512_setzero_si512();
	#pragma GCC unroll 32
	for (int k = 0; k < nr; k++) {
		x[k] = _mm512_mul_ps(x[k], f);
		amx = absbits_max(amx, x[k]);
	}
	uint32_t ab = _mm512_reduce_max_epu32(amx);
	float amax, inv1;
	switch (tq_q8_plan(ab, &amax, &inv1)) {
	case TQ_Q8_REF:
		return 1;
	case TQ_Q8_ZERO:
		memset(blk, 0, e->bb);
		return 0;
	case TQ_Q8_OK:
		break;
	}
	const __m512 inv = _mm512_set1_ps(inv1);
	int8_t *out = (int8_t *)(blk + TQ_Q8_HEADER_BYTES);
	#pragma GCC unroll 32
	for (int k = 0; k < nr; k++) {
		__m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(x[k], inv));
		r = _mm512_max_epi32(r, _mm512_set1_epi32(-127));
		__m128i b = _mm512_cvtsepi32_epi8(r);
		if (d < 16)
			_mm_storel_epi64((__m128i *)out, b);
		else
			_mm_storeu_si128((__m128i *)(out + 16 * k), b);
	}
	float scale = amax / 127.0f;
	memcpy(blk, &scale, 4);
	return 0;
}

AI int dec_q8_r(const struct ctx *e, const uint8_t *blk, float *x, int d, int nt)
{
	const int nr = d < 16 ? 1 : d / 16;
	const __mmask16 m = d < 16 ? 0x00FF : 0xFFFF;
	const float *sign = e->c->rot.sign;
	const int8_t *in = (const int8_t *)(blk + TQ_Q8_HEADER_BYTES);
	__m512 v[RMAX];
	float scale;

	memcpy(&scale, blk, 4);
	if (!finite_f(scale))
		return 1;
	const __m512 f = _mm512_set1_ps(scale * e->isd);
	#pragma GCC unroll 32
	for (int k = 0; k < nr; k++) {
		__m128i b = _mm_maskz_loadu_epi8(m, in + 16 * k);
		v[k] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), f);
	}
	fwht_regs(v, nr, d);
	#pragma GCC unroll 32
	for (int k = 0; k < nr; k++)
		st_chunk(x + 16 * k, _mm512_mul_ps(v[k], _mm512_maskz_loadu_ps(m, sign + 16 * k)), m, nt);
	return 0;
}

/* ---- memory path (dense rotation, d = 512, unrotated codecs) ------------------------- */

/* xb: [nc*16], zeros beyond d. */
AI void conv_row(const struct ctx *e, const void *row, enum tq_dtype dt, float *xb)
{
	int k = 0;

	do /* nc >= 1 */
		_mm512_store_ps(xb + 16 * k, ld_chunk(row, dt, k, k == e->nc - 1 ? e->mt : 0xFFFF));
	while (++k < e->nc);
}

/* y = R x (scaled by fac for Hadamard; unscaled for dense), whole chunks. */
static void rotate_mem(const struct ctx *e, const float *xb, float *y)
{
	const struct tq_rotation *r = &e->c->rot;

	if (r->kind == TQ_ROT_HADAMARD) {
		for (int k = 0; k < e->nc; k++)
			_mm512_store_ps(y + 16 * k, _mm512_mul_ps(_mm512_load_ps(xb + 16 * k),
								  _mm512_loadu_ps(r->sign + 16 * k)));
		fwht_mem(y, e->d);
	} else {
		dense_mv(r->mat_t, xb, e->d, y, 1, 0);
	}
}

static int enc_tq_m(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	const struct tq_rotation *r = &e->c->rot;
	float xb[TQ_DIM_MAX] __attribute__((aligned(64))), u[TQ_DIM_MAX] __attribute__((aligned(64)));
	uint8_t idx[TQ_DIM_MAX + 16];
	int nc = e->nc;

	conv_row(e, row, dt, xb);
	__m512 acc = _mm512_setzero_ps();
	for (int k = 0; k < nc; k++) {
		__m512 v = _mm512_load_ps(xb + 16 * k);
		acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
	}
	float ss = hsum16(acc);
	if (!(ss <= FLT_MAX))
		return 1;
	if (ss == 0.0f) {
		memset(blk, 0, e->bb);
		return 0;
	}
	float norm = sqrt_f(ss), inv = 1.0f / norm;
	float fac = r->kind == TQ_ROT_HADAMARD ? inv * e->isd : inv;
	rotate_mem(e, xb, u);
	const __m512 f = _mm512_set1_ps(fac);
	__m512 a2 = _mm512_setzero_ps();
	for (int k = 0; k < nc; k++) {
		__m512i q = quant(e, _mm512_mul_ps(_mm512_load_ps(u + 16 * k), f), e->levels);
		a2 = _mm512_add_ps(a2, _mm512_maskz_permutexvar_ps(k == nc - 1 ? e->mt : 0xFFFF, q,
								   e->c2tab));
		_mm_storeu_si128((__m128i *)(idx + 16 * k), _mm512_cvtepi32_epi8(q));
	}
	float scale = norm / sqrt_f(hsum16(a2));
	memcpy(blk, &scale, 4);
	pack_gen(idx, e->d, e->bits, blk + TQ_TQ_HEADER_BYTES);
	return 0;
}

/* v: [nc*16] values of the block times the scalar factor, in the rotated
 * frame; writes x = R^T v (Hadamard: fwht then signs). */
static void unrotate_mem(const struct ctx *e, float *v, float *x, int nt)
{
	const struct tq_rotation *r = &e->c->rot;

	if (r->kind == TQ_ROT_HADAMARD) {
		fwht_mem(v, e->d);
		for (int k = 0; k < e->nc; k++)
			st_chunk(x + 16 * k, _mm512_mul_ps(_mm512_load_ps(v + 16 * k),
							  _mm512_loadu_ps(r->sign + 16 * k)), 0xFFFF, nt);
	} else {
		dense_mv(r->mat, v, e->d, x, 0, nt && !(e->d & 15));
	}
}

static int dec_tq_m(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{
	const struct tq_rotation *r = &e->c->rot;
	float v[TQ_DIM_MAX] __attribute__((aligned(64)));
	uint8_t idx[TQ_DIM_MAX + 16] = { 0 };
	float scale;

	memcpy(&scale, blk, 4);
	if (!finite_f(scale))
		return 1;
	float f = r->kind == TQ_ROT_HADAMARD ? scale * e->isd : scale;
	const __m512 tab = _mm512_mul_ps(e->ctab, _mm512_set1_ps(f));
	unpack_gen(blk + TQ_TQ_HEADER_BYTES, e->d, e->bits, idx);
	for (int k = 0; k < e->nc; k++) {
		__m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(idx + 16 * k)));
		_mm512_store_ps(v + 16 * k, _mm512_permutexvar_ps(q, tab));
	}
	unrotate_mem(e, v, x, nt);
	return 0;
}

static int enc_q8_m(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	const struct tq_rotation *r = &e->c->rot;
	float xb[TQ_DIM_MAX] __attribute__((aligned(64))), y[TQ_DIM_MAX] __attribute__((aligned(64)));
	int nc = e->nc;

	conv_row(e, row, dt, xb);
	rotate_mem(e, xb, y);
	const __m512 f = _mm512_set1_ps(1.0f * e->isd);
	__m512i amx = _mm512_setzero_si512();
	for (int k = 0; k < nc; k++) {
		__m512 v = _mm512_load_ps(y + 16 * k);
		if (r->kind == TQ_ROT_HADAMARD) {
			v = _mm512_mul_ps(v, f);
			_mm512_store_ps(y + 16 * k, v);
		}
		amx = absbits_max(amx, v);
	}
	uint32_t ab = _mm512_reduce_max_epu32(amx);
	float amax, inv1;
	switch (tq_q8_plan(ab, &amax, &inv1)) {
	case TQ_Q8_REF:
		return 1;
	case TQ_Q8_ZERO:
		memset(blk, 0, e->bb);
		return 0;
	case TQ_Q8_OK:
		break;
	}
	const __m512 inv = _mm512_set1_ps(inv1);
	int8_t *out = (int8_t *)(blk + TQ_Q8_HEADER_BYTES);
	for (int k = 0; k < nc; k++) {
		__m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(y + 16 * k), inv));
		q = _mm512_max_epi32(q, _mm512_set1_epi32(-127));
		_mm512_mask_cvtsepi32_storeu_epi8(out + 16 * k, k == nc - 1 ? e->mt : 0xFFFF, q);
	}
	float scale = amax / 127.0f;
	memcpy(blk, &scale, 4);
	return 0;
}

static int dec_q8_m(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{
	const struct tq_rotation *r = &e->c->rot;
	const int8_t *in = (const int8_t *)(blk + TQ_Q8_HEADER_BYTES);
	float v[TQ_DIM_MAX] __attribute__((aligned(64)));
	float scale;

	memcpy(&scale, blk, 4);
	if (!finite_f(scale))
		return 1;
	const __m512 f = _mm512_set1_ps(r->kind == TQ_ROT_HADAMARD ? scale * e->isd : scale);
	for (int k = 0; k < e->nc; k++) {
		__m128i b = _mm_maskz_loadu_epi8(k == e->nc - 1 ? e->mt : 0xFFFF, in + 16 * k);
		_mm512_store_ps(v + 16 * k, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), f));
	}
	unrotate_mem(e, v, x, nt);
	return 0;
}

static int enc_q4a_m(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	float xb[TQ_DIM_MAX] __attribute__((aligned(64)));
	uint8_t q[TQ_DIM_MAX + 16];
	int nc = e->nc, d = e->d;

	conv_row(e, row, dt, xb);
	__m512 vmin = _mm512_set1_ps(xb[0]), vmax = vmin;
	__m512i amx = _mm512_setzero_si512();
	for (int k = 0; k < nc; k++) {
		__m512 v = _mm512_load_ps(xb + 16 * k);
		__mmask16 m = k == nc - 1 ? e->mt : 0xFFFF;
		vmin = _mm512_mask_min_ps(vmin, m, vmin, v);
		vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
		amx = absbits_max(amx, v);
	}
	if (_mm512_reduce_max_epu32(amx) >= 0x7f800000u)
		return 1;
	float mn = _mm512_reduce_min_ps(vmin), mx = _mm512_reduce_max_ps(vmax);
	/* A zero extreme: its sign (and so the fp16 min's bytes) comes from the
	 * reference's fminf/fmaxf on ±0, which C leaves to libm and lets the
	 * compiler commute — only the reference itself can say. */
	if (mn == 0.0f || mx == 0.0f)
		return 1;
	float range = mx - mn;
	uint16_t sh = tq_f32_to_f16(range / 15.0f), mh = tq_f32_to_f16(mn);
	if (!finite_f(range) || (sh & 0x7c00u) == 0x7c00u || (mh & 0x7c00u) == 0x7c00u)
		return 1;
	float s = tq_f16_to_f32(sh), mf = tq_f16_to_f32(mh);
	float inv = s > 0.0f ? 1.0f / s : 0.0f;
	const __m512 vm = _mm512_set1_ps(mf), vi = _mm512_set1_ps(inv);
	const __m512 zero = _mm512_setzero_ps(), fifteen = _mm512_set1_ps(15.0f);
	for (int k = 0; k < nc; k++) {
		__m512 t = _mm512_mul_ps(_mm512_sub_ps(_mm512_load_ps(xb + 16 * k), vm), vi);
		/* clamping before rounding = clamping after (rint is monotone) */
		t = _mm512_min_ps(_mm512_max_ps(t, zero), fifteen);
		_mm_storeu_si128((__m128i *)(q + 16 * k), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(t)));
	}
	memcpy(blk, &sh, 2);
	memcpy(blk + 2, &mh, 2);
	pack_w4(q, d / 2, blk + TQ_Q4A_HEADER_BYTES);
	return 0;
}

static int dec_q4a_m(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{
	uint8_t q[TQ_DIM_MAX + 16] = { 0 };
	uint16_t sh, mh;

	memcpy(&sh, blk, 2);
	memcpy(&mh, blk + 2, 2);
	if ((sh & 0x7c00u) == 0x7c00u || (mh & 0x7c00u) == 0x7c00u)
		return 1;
	const __m512 vs = _mm512_set1_ps(tq_f16_to_f32(sh)), vm = _mm512_set1_ps(tq_f16_to_f32(mh));
	unpack_gen(blk + TQ_Q4A_HEADER_BYTES, e->d, 4, q);
	for (int k = 0; k < e->nc; k++) {
		__m512 t = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * k))));
		st_chunk(x + 16 * k, _mm512_add_ps(vm, _mm512_mul_ps(vs, t)),
			 k == e->nc - 1 ? e->mt : 0xFFFF, nt && !(e->d & 15));
	}
	return 0;
}

static int enc_f16_m(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	uint16_t h[TQ_DIM_MAX];
	__m256i mx = _mm256_setzero_si256();

	for (int k = 0; k < e->nc; k++) {
		__mmask16 m = k == e->nc - 1 ? e->mt : 0xFFFF;
		__m256i v = _mm512_cvtps_ph(ld_chunk(row, dt, k, m), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		mx = _mm256_max_epu16(mx, _mm256_and_si256(v, _mm256_set1_epi16(0x7fff)));
		_mm256_mask_storeu_epi16(h + 16 * k, m, v);
	}
	/* any lane >= 0x7c00: an Inf or NaN came out (beyond range, or bad input) */
	if (_mm256_movemask_epi8(_mm256_cmpgt_epi16(mx, _mm256_set1_epi16(0x7bff))))
		return 1;
	memcpy(blk, h, e->bb);
	return 0;
}

/* The row is read once: the values checked are the values stored, even
 * when another process rewrites it meanwhile (a client's shared arena). */
static int enc_f32_m(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	float x[TQ_DIM_MAX + 16] __attribute__((aligned(64)));
	__m512i amx = _mm512_setzero_si512();

	for (int k = 0; k < e->nc; k++) {
		__m512 v = ld_chunk(row, dt, k, k == e->nc - 1 ? e->mt : 0xFFFF);   /* masked lanes: zero */
		amx = absbits_max(amx, v);
		_mm512_store_ps(x + 16 * k, v);
	}
	if (_mm512_reduce_max_epu32(amx) >= 0x7f800000u)
		return 1;
	memcpy(blk, x, e->bb);
	return 0;
}

static int dec_f16_m(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{
	for (int k = 0; k < e->nc; k++) {
		__mmask16 m = k == e->nc - 1 ? e->mt : 0xFFFF;
		__m256i h = _mm256_maskz_loadu_epi16(m, blk + 32 * k);
		__m512 f = _mm512_cvtph_ps(h);
		__mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
		if (nan) {
			/* the reference keeps a NaN's payload as it is (no quieting) */
			__m512i w = _mm512_cvtepu16_epi32(h);
			__m512i b = _mm512_ternarylogic_epi32(
				_mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x8000)), 16),
				_mm512_set1_epi32(0x7f800000),
				_mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x3ff)), 13), 0xFE);
			f = _mm512_mask_mov_ps(f, nan, _mm512_castsi512_ps(b));
		}
		st_chunk(x + 16 * k, f, m, nt && !(e->d & 15));
	}
	return 0;
}

/* ---- batch drivers ------------------------------------------------------------------- */

/* ---- tq3o / tq4o (two TurboQuant halves; tq_layout.h) -------------------------------- */

/* One half of h values (a power of two >= 16, Hadamard rotation): the
 * reference's quantize() in the contract's order — sums of squares in 16
 * lanes, the butterflies, the factor, then each index by the same binary
 * search over the bounds (permutes of a 32-entry table, exact compares).
 * Writes the bf16 scale to sc and the planes; 1 when the reference must
 * take the vector (its norm overflows, or the scale rounds to inf). */
AI int enc_tqo_half(const struct tq_rotation *r, const tq_codebook *cb, const float *x, const int h, uint8_t *sc,
		    uint8_t *planes, const int L)
{
	float u[TQ_DIM_MAX / 2] __attribute__((aligned(64)));
	uint8_t idx[TQ_DIM_MAX / 2];
	__m512 acc = _mm512_setzero_ps();

	_Pragma("GCC unroll 16")
	for (int k = 0; k < h; k += 16) {
		__m512 v = _mm512_loadu_ps(x + k);
		acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
	}
	float ss = hsum16(acc);
	if (!(ss <= FLT_MAX))
		return 1;
	if (ss == 0.0f) {
		memset(sc, 0, 2);
		memset(planes, 0, TQ_PLANES_BYTES(h, cb->bits));
		return 0;
	}
	const float norm = sqrt_f(ss), inv = 1.0f / norm;
	const __m512 f = _mm512_set1_ps(inv * r->inv_sqrt_dim);
	_Pragma("GCC unroll 16")
	for (int k = 0; k < h; k += 16)
		_mm512_store_ps(u + k, _mm512_mul_ps(_mm512_loadu_ps(x + k), _mm512_loadu_ps(r->sign + k)));
	fwht_mem(u, h);
	const __m512 b0 = _mm512_loadu_ps(cb->bound), b1 = _mm512_loadu_ps(cb->bound + 16);
	const __m512 c0 = _mm512_loadu_ps(cb->centroid), c1 = _mm512_loadu_ps(cb->centroid + 16);
	__m512 a2 = _mm512_setzero_ps();
	_Pragma("GCC unroll 16")
	for (int k = 0; k < h; k += 16) {
		const __m512 uv = _mm512_mul_ps(_mm512_load_ps(u + k), f);
		__m512i lo = _mm512_setzero_si512();
		_Pragma("GCC unroll 8")
		for (int step = L >> 1; step > 0; step >>= 1) {
			const __m512 b = _mm512_permutex2var_ps(b0, _mm512_add_epi32(lo, _mm512_set1_epi32(step - 1)), b1);
			lo = _mm512_mask_add_epi32(lo, _mm512_cmp_ps_mask(uv, b, _CMP_GT_OQ), lo, _mm512_set1_epi32(step));
		}
		const __m512 cv = _mm512_permutex2var_ps(c0, lo, c1);
		a2 = _mm512_add_ps(a2, _mm512_mul_ps(cv, cv));
		_mm_storeu_si128((__m128i *)(void *)(idx + k), _mm512_cvtepi32_epi8(lo));
	}
	const uint16_t s16 = tq_f32_to_bf16(norm / sqrt_f(hsum16(a2)));
	if ((s16 & 0x7f80u) == 0x7f80u)
		return 1;
	memcpy(sc, &s16, 2);
	pack_gen(idx, h, cb->bits, planes);
	return 0;
}

/* Both halves (LA, LB: their levels) into a local block, copied out only
 * when both succeed. */
AI int enc_tqo_hl(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk, const int h,
		  const int LA, const int LB)
{
	const tq_codec *c = e->c;
	float x[TQ_DIM_MAX] __attribute__((aligned(64)));
	uint8_t b[TQ_TQO_BLOCK_BYTES(TQ_DIM_MAX, 7)];

	/* a NaN / Inf shows in a half's sum of squares: the reference then
	 * takes the vector and says which element */
	const float *xs = x; /* fp32 rows as they are (the halves load them unaligned) */
	if (dt == TQ_DTYPE_F32)
		xs = (const float *)row;
	else
		conv_row(e, row, dt, x);
	if (enc_tqo_half(&c->rot, &c->cb, xs, h, b, b + TQ_TQO_HEADER_BYTES, LA) ||
	    enc_tqo_half(&c->rot_b, &c->cb_b, xs + h, h, b + 2,
			 b + TQ_TQO_HEADER_BYTES + TQ_PLANES_BYTES(h, __builtin_ctz((unsigned)LA)), LB))
		return 1;
	memcpy(blk, b, e->bb); /* only a whole block: a vector that fails writes nothing */
	return 0;
}

/* 1: the reference takes the vector (non-finite input, overflow, or halves
 * this path does not rotate: not a power of two of at least 16) */
static int enc_tqo_m(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	const tq_codec *c = e->c;
	const int h = c->half, o4 = c->cb.levels == 32;

	if (c->rot.kind != TQ_ROT_HADAMARD || c->rot_b.kind != TQ_ROT_HADAMARD || h < 16)
		return 1;
	/* d = 128 specialized (the hot shape) */
	if (h == 64)
		return o4 ? enc_tqo_hl(e, row, dt, blk, 64, 32, 8) : enc_tqo_hl(e, row, dt, blk, 64, 16, 4);
	return o4 ? enc_tqo_hl(e, row, dt, blk, h, 32, 8) : enc_tqo_hl(e, row, dt, blk, h, 16, 4);
}

/* Indices [j0, j0 + 16) of a half of h values (h a power of two) from its
 * planes (tq_layout.h): plane p (width w, stride S = h w / 8 bytes) holds
 * index j's bits in byte j mod S at bit w (j / S).  Planes of fewer than
 * 16 bytes are loaded masked (nothing past them is read) and spread by a
 * byte shuffle. */
AI __m512i unpack16(const uint8_t *planes, const int h, const int bits, int j0)
{
	const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
	__m512i q = _mm512_setzero_si512();

	_Pragma("GCC unroll 3")
	for (int w = 4, sh = 0; w >= 1; w >>= 1) {
		if (!(bits & w))
			continue;
		const int S = h * w / 8, lgw = __builtin_ctz((unsigned)w);
		__m128i b;
		__m512i cnt;
		if (S >= 16) {
			b = _mm_loadu_si128((const __m128i *)(const void *)(planes + (j0 & (S - 1))));
			cnt = _mm512_set1_epi32(w * (j0 / S));
		} else {
			const __m128i sel = _mm_and_si128(_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
							  _mm_set1_epi8((char)(S - 1)));
			b = _mm_shuffle_epi8(_mm_maskz_loadu_epi8((__mmask16)((1u << S) - 1u), planes), sel);
			cnt = _mm512_sll_epi32(_mm512_srl_epi32(_mm512_add_epi32(iota, _mm512_set1_epi32(j0)),
								_mm_cvtsi32_si128(__builtin_ctz((unsigned)S))),
					       _mm_cvtsi32_si128(lgw));
		}
		const __m512i v = _mm512_and_si512(_mm512_srlv_epi32(_mm512_cvtepu8_epi32(b), cnt),
						   _mm512_set1_epi32((1 << w) - 1));
		q = _mm512_or_si512(q, _mm512_sll_epi32(v, _mm_cvtsi32_si128(sh)));
		planes += S;
		sh += w;
	}
	return q;
}

/* One half of h values (a power of two >= 16): x = R^T (scale * c[idx]) in
 * the reference's order — each centroid times scale / sqrt(h), the
 * butterflies, the signs. */
AI void dec_tqo_half(const struct tq_rotation *r, const tq_codebook *cb, const uint8_t *planes, float scale,
		     const int h, const int bits, float *x, int nt)
{
	float v[TQ_DIM_MAX / 2] __attribute__((aligned(64)));
	const __m512 f = _mm512_set1_ps(scale * r->inv_sqrt_dim);
	const __m512 c0 = _mm512_loadu_ps(cb->centroid), c1 = _mm512_loadu_ps(cb->centroid + 16);

	_Pragma("GCC unroll 16")
	for (int k = 0; k < h; k += 16)
		_mm512_store_ps(v + k, _mm512_mul_ps(_mm512_permutex2var_ps(c0, unpack16(planes, h, bits, k), c1), f));
	fwht_mem(v, h);
	_Pragma("GCC unroll 16")
	for (int k = 0; k < h; k += 16)
		st_chunk(x + k, _mm512_mul_ps(_mm512_load_ps(v + k), _mm512_loadu_ps(r->sign + k)), 0xFFFF, nt);
}

AI void dec_tqo_halves(const tq_codec *c, const uint8_t *pa, float sa, float sb, const int h, const int ba,
		       const int bb, float *x, int nt)
{
	dec_tqo_half(&c->rot, &c->cb, pa, sa, h, ba, x, nt);
	dec_tqo_half(&c->rot_b, &c->cb_b, pa + TQ_PLANES_BYTES(h, ba), sb, h, bb, x + h, nt);
}

/* 1: the reference takes the vector (a non-finite scale, or halves this
 * path does not rotate) */
static int dec_tqo_m(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{
	const tq_codec *c = e->c;
	const int h = c->half;
	const uint8_t *pa = blk + TQ_TQO_HEADER_BYTES;
	float sa, sb;

	if (!tq_tqo_dec_scales(c, blk, 16, &sa, &sb))
		return 1;
	/* d = 128 specialized (the hot shape): tq4o, tq3o */
	if (h == 64 && c->cb.bits == 5)
		dec_tqo_halves(c, pa, sa, sb, 64, 5, 3, x, nt);
	else if (h == 64 && c->cb.bits == 4)
		dec_tqo_halves(c, pa, sa, sb, 64, 4, 2, x, nt);
	else
		dec_tqo_halves(c, pa, sa, sb, h, c->cb.bits, c->cb_b.bits, x, nt);
	return 0;
}

typedef int (*enc_fn)(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk);
typedef int (*dec_fn)(const struct ctx *e, const uint8_t *blk, float *x, int nt);

AI int enc_loop(const struct ctx *e, enc_fn fn, const void *src, enum tq_dtype dt, size_t n,
		uint8_t *dst, tq_error *err)
{
	size_t rb = tq_dtype_size(dt) * (size_t)e->d;
	const uint8_t *s = src;

	for (size_t v = 0; v < n; v++, s += rb, dst += e->bb) {
		_mm_prefetch((const char *)s + PF_AHEAD, _MM_HINT_T0);
		if (fn(e, s, dt, dst)) {
			int r = tq_encode_ref_row(e->c, s, dt, v, dst, err);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

typedef int (*enc2_fn)(const struct ctx *e, const uint8_t *row, size_t rb, enum tq_dtype dt,
		       uint8_t *blk);

/* Two vectors per step when the kernel can; a pair it declines goes
 * through the one-vector kernel (and the reference) in order. */
AI int enc_loop2(const struct ctx *e, enc2_fn fn2, enc_fn fn, const void *src, enum tq_dtype dt,
		 size_t n, uint8_t *dst, tq_error *err)
{
	size_t rb = tq_dtype_size(dt) * (size_t)e->d, v = 0;
	const uint8_t *s = src;

	for (; v + 2 <= n; v += 2, s += 2 * rb, dst += 2 * e->bb) {
		_mm_prefetch((const char *)s + PF_AHEAD, _MM_HINT_T0);
		_mm_prefetch((const char *)s + PF_AHEAD + 64, _MM_HINT_T0);
		if (fn2(e, s, rb, dt, dst)) {
			for (int i = 0; i < 2; i++)
				if (fn(e, s + i * rb, dt, dst + i * e->bb)) {
					int r = tq_encode_ref_row(e->c, s + i * rb, dt, v + i, dst + i * e->bb, err);
					if (r < 0)
						return r;
				}
		}
	}
	if (v < n && fn(e, s, dt, dst)) {
		int r = tq_encode_ref_row(e->c, s, dt, v, dst, err);
		if (r < 0)
			return r;
	}
	return 0;
}

AI void dec_loop(const struct ctx *e, dec_fn fn, const uint8_t *src, size_t n, float *dst, int nt)
{
	for (size_t v = 0; v < n; v++, src += e->bb, dst += e->d)
		if (fn(e, src, dst, nt))
			tq_decode_ref(e->c, src, 1, dst);
}

/* Register-path instances: d = 128 fully specialized (the hot shape), the
 * other power-of-two dims specialized on d only. */
#define ENC_TQ(D, B, T, name) \
	static int name(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk) \
	{ (void)dt; return enc_tq_r(e, row, T, blk, D, B); } \
	static int name##_x2(const struct ctx *e, const uint8_t *row, size_t rb, enum tq_dtype dt, \
			     uint8_t *blk) \
	{ (void)dt; return enc_tq_rn(e, row, rb, T, blk, D, B, 2); }
ENC_TQ(128, 2, TQ_DTYPE_F32, enc_tq2_128_f32)
ENC_TQ(128, 3, TQ_DTYPE_F32, enc_tq3_128_f32)
ENC_TQ(128, 4, TQ_DTYPE_F32, enc_tq4_128_f32)
ENC_TQ(128, 2, TQ_DTYPE_F16, enc_tq2_128_f16)
ENC_TQ(128, 3, TQ_DTYPE_F16, enc_tq3_128_f16)
ENC_TQ(128, 4, TQ_DTYPE_F16, enc_tq4_128_f16)
ENC_TQ(128, 2, TQ_DTYPE_BF16, enc_tq2_128_bf16)
ENC_TQ(128, 3, TQ_DTYPE_BF16, enc_tq3_128_bf16)
ENC_TQ(128, 4, TQ_DTYPE_BF16, enc_tq4_128_bf16)

#define ENC_TQ_D(D) \
	static int enc_tq_d##D(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk) \
	{ \
		switch (e->bits) { \
		case 2: return enc_tq_r(e, row, dt, blk, D, 2); \
		case 3: return enc_tq_r(e, row, dt, blk, D, 3); \
		default: return enc_tq_r(e, row, dt, blk, D, 4); \
		} \
	} \
	static int dec_tq_d##D(const struct ctx *e, const uint8_t *blk, float *x, int nt) \
	{ \
		switch (e->bits) { \
		case 2: return dec_tq_r(e, blk, x, D, 2, nt); \
		case 3: return dec_tq_r(e, blk, x, D, 3, nt); \
		default: return dec_tq_r(e, blk, x, D, 4, nt); \
		} \
	} \
	static int enc_q8_d##D(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk) \
	{ return enc_q8_r(e, row, dt, blk, D); } \
	static int dec_q8_d##D(const struct ctx *e, const uint8_t *blk, float *x, int nt) \
	{ return dec_q8_r(e, blk, x, D, nt); }
ENC_TQ_D(8)
ENC_TQ_D(16)
ENC_TQ_D(32)
ENC_TQ_D(64)
ENC_TQ_D(128)
ENC_TQ_D(256)

static int dec_tq2_128(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{ return dec_tq_r(e, blk, x, 128, 2, nt); }
static int dec_tq3_128(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{ return dec_tq_r(e, blk, x, 128, 3, nt); }
static int dec_tq4_128(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{ return dec_tq_r(e, blk, x, 128, 4, nt); }

static int is_tq(const tq_codec *c)
{
	return c->id == TQ_CODEC_TQ2 || c->id == TQ_CODEC_TQ3 || c->id == TQ_CODEC_TQ4;
}

/* The tables of ctx_init (the quantizer grid's search costs 100–150 ns),
 * built once per codec in tq_codec_new. */
static void *avx512_prepare(const tq_codec *c)
{
	struct ctx *e = aligned_alloc(64, (sizeof(struct ctx) + 63) & ~(size_t)63);

	if (e)
		ctx_init(e, c, 1);
	return e;
}

static int avx512_encode(const tq_codec *c, const void *src, enum tq_dtype dt, size_t n, void *dst,
			 tq_error *err)
{
	/* a local copy: the kernels' stores through uint8_t * may alias
	 * anything, so tables read through a pointer would be reloaded */
	struct ctx ec = *(const struct ctx *)c->isa_ctx;
	const struct ctx *e = &ec;
	enc_fn fn = NULL;
	int reg = c->rot.kind == TQ_ROT_HADAMARD && c->dim <= 256;

	if (!tq_dtype_size(dt))
		return tq_fail(err, "unknown input element type %d", (int)dt);
	if (c->half)
		return enc_loop(e, enc_tqo_m, src, dt, n, dst, err);
	if (is_tq(c) && !e->grid)
		reg = 0; /* the register path quantizes on the grid only */
	if (is_tq(c) && reg && c->dim == 128) {
		/* one loop per instance, so each kernel inlines into its loop */
		switch ((c->bits - 2) * 3 + (int)dt) {
		case 0: return enc_loop2(e, enc_tq2_128_f32_x2, enc_tq2_128_f32, src, dt, n, dst, err);
		case 1: return enc_loop2(e, enc_tq2_128_f16_x2, enc_tq2_128_f16, src, dt, n, dst, err);
		case 2: return enc_loop2(e, enc_tq2_128_bf16_x2, enc_tq2_128_bf16, src, dt, n, dst, err);
		case 3: return enc_loop2(e, enc_tq3_128_f32_x2, enc_tq3_128_f32, src, dt, n, dst, err);
		case 4: return enc_loop2(e, enc_tq3_128_f16_x2, enc_tq3_128_f16, src, dt, n, dst, err);
		case 5: return enc_loop2(e, enc_tq3_128_bf16_x2, enc_tq3_128_bf16, src, dt, n, dst, err);
		case 6: return enc_loop2(e, enc_tq4_128_f32_x2, enc_tq4_128_f32, src, dt, n, dst, err);
		case 7: return enc_loop2(e, enc_tq4_128_f16_x2, enc_tq4_128_f16, src, dt, n, dst, err);
		default: return enc_loop2(e, enc_tq4_128_bf16_x2, enc_tq4_128_bf16, src, dt, n, dst, err);
		}
	} else if (is_tq(c) || c->id == TQ_CODEC_Q8) {
		int q8 = c->id == TQ_CODEC_Q8;
		switch (reg ? c->dim : 0) {
		case 8: fn = q8 ? enc_q8_d8 : enc_tq_d8; break;
		case 16: fn = q8 ? enc_q8_d16 : enc_tq_d16; break;
		case 32: fn = q8 ? enc_q8_d32 : enc_tq_d32; break;
		case 64: fn = q8 ? enc_q8_d64 : enc_tq_d64; break;
		case 128: fn = q8 ? enc_q8_d128 : enc_tq_d128; break;
		case 256: fn = q8 ? enc_q8_d256 : enc_tq_d256; break;
		default: fn = q8 ? enc_q8_m : enc_tq_m; break;
		}
	} else if (c->id == TQ_CODEC_Q4A) {
		fn = enc_q4a_m;
	} else if (c->id == TQ_CODEC_F16) {
		fn = enc_f16_m;
	} else if (c->id == TQ_CODEC_F32) {
		fn = enc_f32_m;
	} else {
		return tq_fail(err, "unknown codec id %d", (int)c->id);
	}
	return enc_loop(e, fn, src, dt, n, dst, err);
}

static int avx512_decode(const tq_codec *c, const void *src, size_t n, float *dst)
{
	struct ctx ec = *(const struct ctx *)c->isa_ctx;
	const struct ctx *e = &ec;
	dec_fn fn;
	int reg = c->rot.kind == TQ_ROT_HADAMARD && c->dim <= 256;
	int nt = (size_t)n * c->dim * 4 >= NT_MIN_BYTES && !((uintptr_t)dst & 63) && !(c->dim & 15);

	if (c->half) {
		dec_loop(e, dec_tqo_m, src, n, dst, nt);
		goto done;
	}
	if (is_tq(c) && reg && c->dim == 128) {
		switch (c->bits) {
		case 2: dec_loop(e, dec_tq2_128, src, n, dst, nt); break;
		case 3: dec_loop(e, dec_tq3_128, src, n, dst, nt); break;
		default: dec_loop(e, dec_tq4_128, src, n, dst, nt); break;
		}
		goto done;
	}
	if (is_tq(c) || c->id == TQ_CODEC_Q8) {
		int q8 = c->id == TQ_CODEC_Q8;
		switch (reg ? c->dim : 0) {
		case 8: fn = q8 ? dec_q8_d8 : dec_tq_d8; break;
		case 16: fn = q8 ? dec_q8_d16 : dec_tq_d16; break;
		case 32: fn = q8 ? dec_q8_d32 : dec_tq_d32; break;
		case 64: fn = q8 ? dec_q8_d64 : dec_tq_d64; break;
		case 128: fn = q8 ? dec_q8_d128 : dec_tq_d128; break;
		case 256: fn = q8 ? dec_q8_d256 : dec_tq_d256; break;
		default: fn = q8 ? dec_q8_m : dec_tq_m; break;
		}
	} else if (c->id == TQ_CODEC_Q4A) {
		fn = dec_q4a_m;
	} else if (c->id == TQ_CODEC_F16) {
		fn = dec_f16_m;
	} else if (c->id == TQ_CODEC_F32) {
		memcpy(dst, src, n * c->block_bytes);
		return 0;
	} else {
		return -EINVAL;
	}
	dec_loop(e, fn, src, n, dst, nt);
done:
	if (nt)
		_mm_sfence();
	return 0;
}

static const struct tq_codec_ops ops_avx512 = {
	.isa = TQ_ISA_AVX512,
	.prepare = avx512_prepare,
	.encode = avx512_encode,
	.decode = avx512_decode,
};

const struct tq_codec_ops *tq_codec_ops_avx512(void)
{
	return &ops_avx512;
}

#else /* no AVX-512 in this build (non-x86): the scalar path serves */

const struct tq_codec_ops *tq_codec_ops_avx512(void)
{
	return NULL;
}

#endif
