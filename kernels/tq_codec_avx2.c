/* tq_codec_avx2.c — AVX2 + FMA + F16C codec paths, bit-identical to
 * tq_codec_ref.c under the contract in tq_internal.h.
 *
 * One shape for every dim: [dim] float buffers on the stack walked in
 * 8-lane chunks (dims are multiples of 8, so there is never a tail).  The
 * 16-lane sums of squares use two accumulators (lanes 0-7 and 8-15); the
 * FWHT runs its three in-register stages as a permute and an FMA with a ±1
 * vector (exact) and the rest as plain add/sub; the dense matvec is a column
 * axpy accumulated in j order (mul, then add); indices come from the
 * reference's binary search, one vpermps per step.  As in the AVX-512 path,
 * an unusual vector (NaN/Inf, an overflowing sum, a non-finite header, a
 * zero extreme in q4a, a denormal q8 maximum) goes to the scalar reference.
 *
 * Thread context: reentrant; all state is on the stack.
 */
#include "tq_internal.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <float.h>
#include <immintrin.h>
#include <stdint.h>

#include "tq_avx2.h"

#define AI static inline __attribute__((always_inline))

#define NT_MIN_BYTES (16u << 20)
#define PF_AHEAD 1024

/* ---- helpers ------------------------------------------------------------------- */

/* l[i] += l[i+8], +4, +2, +1 over lanes lo (0-7) and hi (8-15). */
AI float hsum16(__m256 lo, __m256 hi)
{
	__m256 s8 = _mm256_add_ps(lo, hi);
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

AI __m256 ld8(const void *row, enum tq_dtype dt, int k)
{
	if (dt == TQ_DTYPE_F32)
		return _mm256_loadu_ps((const float *)row + 8 * k);
	__m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + 8 * k));
	if (dt == TQ_DTYPE_F16)
		return _mm256_cvtph_ps(h);
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AI void st8(float *p, __m256 v, int nt)
{
	if (nt)
		_mm256_stream_ps(p, v);
	else
		_mm256_storeu_ps(p, v);
}

AI __m256i absbits_max(__m256i acc, __m256 v)
{
	return _mm256_max_epu32(acc, _mm256_and_si256(_mm256_castps_si256(v),
						      _mm256_set1_epi32(0x7fffffff)));
}

AI uint32_t hmax_u32(__m256i v)
{
	__m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
	m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
	return (uint32_t)_mm_cvtsi128_si32(m);
}

/* 8 dword lanes (each < 256) to 8 bytes at p. */
AI void st_idx8(uint8_t *p, __m256i q)
{
	__m128i w = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
	_mm_storel_epi64((__m128i *)p, _mm_packus_epi16(w, w));
}

/* 8 dword lanes in [-127, 127] to 8 signed bytes at p. */
AI void st_q8(int8_t *p, __m256i q)
{
	__m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
	_mm_storel_epi64((__m128i *)p, _mm_packs_epi16(w, w));
}

/* ---- per-call tables ------------------------------------------------------------ */

struct ctx {
	const tq_codec *c;
	int d, nc, bits, levels;
	uint32_t bb;
	float isd;
	__m256 first;            /* broadcast bound[L/2 - 1]                        */
	__m256 bt[3];            /* step s = L/4 >> j: bt[j][lo / 2s] = bound[lo + s - 1] */
	__m256 s2[2];            /* second step: broadcast bound[L/4 - 1], bound[3L/4 - 1] */
	__m256 t4;               /* the 4-entry step (L 8: third, L 16: third of four), */
				 /* in both lanes, by lo / (L / 4)                   */
	__m256 ctab[2];          /* centroid[k mod L], k = 0..15                     */
	int cent;                /* tq_cent_ok: decode through ctb                   */
	struct tq_cent_tab ctb;  /* the centroids' byte planes (tq_avx2.h)           */
	struct tqo_half {        /* tq3o / tq4o: each half's codebook                */
		__m256 bt[5][2]; /* step j (s = L/2 >> j): bound[lo + s - 1] by lo / 2s, */
				 /* 2^j entries (16 in two vectors)                   */
		__m256 b0, b1[2], b2; /* steps 0 and 1 broadcast, step 2 in both lanes */
		__m256 ct[4];    /* centroid[k], k < L (32 in four vectors)           */
		__m256 sq[4];    /* centroid[k]² as the reference's products; sym: the */
		int sym;         /* first L/2 (the codebook symmetric bit for bit)     */
	} ho[2];
};

static void tqo_half_init(struct tqo_half *t, const tq_codebook *cb)
{
	const int L = cb->levels;
	float b[16], c[32] = { 0 };

	memset(t, 0, sizeof(*t));
	for (int j = 0, s = L / 2; s >= 1; s >>= 1, j++) {
		memset(b, 0, sizeof(b));
		for (int lo = 0, i = 0; lo < L; lo += 2 * s, i++)
			b[i] = cb->bound[lo + s - 1];
		t->bt[j][0] = _mm256_loadu_ps(b);
		t->bt[j][1] = _mm256_loadu_ps(b + 8);
	}
	memcpy(c, cb->centroid, sizeof(float) * (size_t)L);
	for (int k = 0; k < 4; k++)
		t->ct[k] = _mm256_loadu_ps(c + 8 * k);
	/* the squares the sum of squares takes (fl(c * c): the reference's
	 * products), folded to the first half where c[L - 1 - k] = -c[k] */
	float sq[32] = { 0 };
	t->sym = L >= 16;
	for (int k = 0; k < L; k++) {
		const float m = -c[L - 1 - k];
		t->sym &= memcmp(&m, &c[k], sizeof(m)) == 0;
	}
	for (int k = 0; k < L; k++)
		sq[k] = c[k] * c[k];
	for (int k = 0; k < 4; k++)
		t->sq[k] = _mm256_loadu_ps(sq + 8 * k);
	/* quant_gen's first steps without a cross-lane permute: the first
	 * bound, the second step's two, the third's four in both lanes */
	const int q = L / 4;
	float t4[8] = { 0 };
	for (int i = 0; L >= 8 && i < 4; i++) /* L 4: two steps only */
		t4[i] = t4[i + 4] = cb->bound[i * q + q / 2 - 1];
	t->b0 = _mm256_set1_ps(cb->bound[L / 2 - 1]);
	t->b1[0] = _mm256_set1_ps(cb->bound[L / 4 - 1]);
	t->b1[1] = _mm256_set1_ps(cb->bound[3 * L / 4 - 1]);
	t->b2 = _mm256_loadu_ps(t4);
}

static void ctx_init(struct ctx *e, const tq_codec *c)
{
	e->c = c;
	e->d = c->dim;
	e->nc = c->dim / 8;
	e->bits = c->bits;
	e->bb = c->block_bytes;
	e->isd = c->rot.inv_sqrt_dim;
	e->levels = 0;
	e->cent = 0;
	if (c->id == TQ_CODEC_TQ2 || c->id == TQ_CODEC_TQ3 || c->id == TQ_CODEC_TQ4) {
		const tq_codebook *cb = &c->cb;
		int L = cb->levels, j = 0;
		float ct[16];

		for (int k = 0; k < 16; k++)
			ct[k] = cb->centroid[k % L];
		e->levels = L;
		e->first = _mm256_set1_ps(cb->bound[L / 2 - 1]);
		for (int s = L / 4; s >= 1; s >>= 1, j++) {
			float t[8] = { 0 };
			for (int lo = 0, i = 0; lo < L; lo += 2 * s, i++)
				t[i] = cb->bound[lo + s - 1];
			e->bt[j] = _mm256_loadu_ps(t);
		}
		e->ctab[0] = _mm256_loadu_ps(ct);
		e->ctab[1] = _mm256_loadu_ps(ct + 8);
		e->cent = tq_cent_ok(c);
		if (e->cent)
			tq_cent_tab_make(c, &e->ctb);
		e->s2[0] = _mm256_set1_ps(cb->bound[L / 4 - 1]);
		e->s2[1] = _mm256_set1_ps(cb->bound[3 * L / 4 - 1]);
		if (L >= 8) {
			const int q = L / 4; /* the step's width s = q / 2: bound[lo + s - 1], lo = i q */
			float t[8];
			for (int i = 0; i < 4; i++)
				t[i] = t[i + 4] = cb->bound[i * q + q / 2 - 1];
			e->t4 = _mm256_loadu_ps(t);
		}
	}
	if (c->half) {
		tqo_half_init(&e->ho[0], &c->cb);
		tqo_half_init(&e->ho[1], &c->cb_b);
	}
}

/* The reference's binary search: index = number of bounds strictly below u.
 * L = e->levels as a constant (the callers switch on it), so the steps unroll
 * with immediate shifts: a run-time L left a loop with variable shifts that
 * cost half of tq4's encode. */
/* One step of it: s = half the interval, sh = log2(2 s) (the table index is lo / 2s). */
AI __m256i qstep(__m256i lo, __m256 u, __m256 bt, const int s, const int sh)
{
	__m256 b = _mm256_permutevar8x32_ps(bt, _mm256_srli_epi32(lo, sh));
	__m256i m = _mm256_castps_si256(_mm256_cmp_ps(u, b, _CMP_GT_OQ));
	return _mm256_or_si256(lo, _mm256_and_si256(m, _mm256_set1_epi32(s)));
}

/* Steps whose candidate bounds fit a lane stay in it (Zen 2/3 run in-lane
 * shuffles and blends two a cycle, cross-lane vpermps one): the second
 * step picks one of two bounds with the first step's mask (blend), a
 * 4-bound step looks its bound up with vpermilps; only tq4's last, 8-bound
 * step takes a vpermps. */
AI __m256i quant(const struct ctx *e, __m256 u, const int L)
{
	const __m256 m1 = _mm256_cmp_ps(u, e->first, _CMP_GT_OQ);
	__m256i lo = _mm256_and_si256(_mm256_castps_si256(m1), _mm256_set1_epi32(L / 2));
	const __m256 b2 = _mm256_blendv_ps(e->s2[0], e->s2[1], m1);
	lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(u, b2, _CMP_GT_OQ)),
						  _mm256_set1_epi32(L / 4)));
	if (L == 4)
		return lo;
	const __m256 b3 = _mm256_permutevar_ps(e->t4, _mm256_srli_epi32(lo, L == 16 ? 2 : 1));
	lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(u, b3, _CMP_GT_OQ)),
						  _mm256_set1_epi32(L / 8)));
	if (L == 8)
		return lo;
	return qstep(lo, u, e->bt[2], 1, 1); /* L == 16 */
}

/* Table lookup of 16 entries (t[0], t[1]) by the low 4 bits of q. */
AI __m256 lut16(const __m256 *t, __m256i q)
{
	__m256 a = _mm256_permutevar8x32_ps(t[0], q), b = _mm256_permutevar8x32_ps(t[1], q);
	return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(q, 28)));
}

/* The binary search over any codebook of L (4 .. 32, a constant) levels:
 * step j's candidate bound looked up by lo / 2s (the comparisons of
 * tq_cb_index, so the same index) — the first step against one bound, the
 * second a blend of two by the first's mask, the third an in-lane vpermilps
 * of four, as quant does; then vpermps of 8 (t->bt[3]) and 16 (t->bt[4]). */
AI __m256i quant_gen(const struct tqo_half *t, __m256 u, const int L)
{
	const __m256 m1 = _mm256_cmp_ps(u, t->b0, _CMP_GT_OQ);
	__m256i lo = _mm256_and_si256(_mm256_castps_si256(m1), _mm256_set1_epi32(L / 2));
	const __m256 b1 = _mm256_blendv_ps(t->b1[0], t->b1[1], m1);
	lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(u, b1, _CMP_GT_OQ)),
						  _mm256_set1_epi32(L / 4)));
	if (L == 4)
		return lo;
	const __m256 b2 = _mm256_permutevar_ps(t->b2, _mm256_srli_epi32(lo, __builtin_ctz((unsigned)L) - 2));
	lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(u, b2, _CMP_GT_OQ)),
						  _mm256_set1_epi32(L / 8)));
	for (int j = 3, s = L / 16, sh = __builtin_ctz((unsigned)L) - 3; s >= 1; s >>= 1, j++, sh--) {
		const __m256i i = _mm256_srli_epi32(lo, sh);
		const __m256 b = j == 3 ? _mm256_permutevar8x32_ps(t->bt[3][0], i) : lut16(t->bt[4], i);
		lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(u, b, _CMP_GT_OQ)),
							  _mm256_set1_epi32(s)));
	}
	return lo;
}

/* centroid[q]² of a codebook of L (4 .. 32, a constant) levels: one
 * vpermps where 8 entries (or a symmetric 16's folded half) hold it, else
 * two or four; q >= L/2 folds to L - 1 - q = q ^ (L - 1) */
AI __m256 lut_sq(const struct tqo_half *t, __m256i q, const int L)
{
	if (L <= 8)
		return _mm256_permutevar8x32_ps(t->sq[0], q);
	if (t->sym) {
		const __m256i hi = _mm256_srai_epi32(_mm256_slli_epi32(q, 31 - __builtin_ctz((unsigned)L / 2)), 31);
		const __m256i f = _mm256_xor_si256(q, _mm256_and_si256(hi, _mm256_set1_epi32(L - 1)));
		return L == 16 ? _mm256_permutevar8x32_ps(t->sq[0], f) : lut16(t->sq, f);
	}
	if (L == 16)
		return lut16(t->sq, q);
	return _mm256_blendv_ps(lut16(t->sq, q), lut16(t->sq + 2, q), _mm256_castsi256_ps(_mm256_slli_epi32(q, 27)));
}

/* centroid[q] of a codebook of L (4 .. 32, a constant) levels */
AI __m256 lut_gen(const struct tqo_half *t, __m256i q, const int L)
{
	if (L <= 8)
		return _mm256_permutevar8x32_ps(t->ct[0], q);
	if (L == 16)
		return lut16(t->ct, q);
	return _mm256_blendv_ps(lut16(t->ct, q), lut16(t->ct + 2, q), _mm256_castsi256_ps(_mm256_slli_epi32(q, 27)));
}

/* ---- FWHT ------------------------------------------------------------------------ */

AI __m256 fwht8(__m256 a)
{
	const __m256 p1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
	const __m256 p2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
	const __m256 p4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);

	/* lower lane: a + partner; upper lane: partner - a (one rounding) */
	a = _mm256_fmadd_ps(a, p1, _mm256_permute_ps(a, 0xB1));
	a = _mm256_fmadd_ps(a, p2, _mm256_permute_ps(a, 0x4E));
	a = _mm256_fmadd_ps(a, p4, _mm256_permute2f128_ps(a, a, 0x01));
	return a;
}

/* The stages h >= 8 of the transform on u: [n] floats, n a power of two
 * >= 8.  Two stages per pass over memory (h and 2h on four vectors in
 * registers): the same additions in the same order as one stage at a time,
 * half the loads and stores. */
static void fwht_stages(float *u, int n)
{
	int h = 8;

	for (; 4 * h <= n; h <<= 2)
		for (int i = 0; i < n; i += 4 * h)
			for (int j = i; j < i + h; j += 8) {
				__m256 a = _mm256_loadu_ps(u + j), b = _mm256_loadu_ps(u + j + h);
				__m256 c = _mm256_loadu_ps(u + j + 2 * h), d = _mm256_loadu_ps(u + j + 3 * h);
				__m256 s0 = _mm256_add_ps(a, b), d0 = _mm256_sub_ps(a, b);
				__m256 s1 = _mm256_add_ps(c, d), d1 = _mm256_sub_ps(c, d);
				_mm256_storeu_ps(u + j, _mm256_add_ps(s0, s1));
				_mm256_storeu_ps(u + j + h, _mm256_add_ps(d0, d1));
				_mm256_storeu_ps(u + j + 2 * h, _mm256_sub_ps(s0, s1));
				_mm256_storeu_ps(u + j + 3 * h, _mm256_sub_ps(d0, d1));
			}
	if (h < n) /* one stage left */
		for (int j = 0; j < h; j += 8) {
			__m256 a = _mm256_loadu_ps(u + j), b = _mm256_loadu_ps(u + j + h);
			_mm256_storeu_ps(u + j, _mm256_add_ps(a, b));
			_mm256_storeu_ps(u + j + h, _mm256_sub_ps(a, b));
		}
}

/* u: [n] floats, n a power of two >= 8. */
static void fwht_mem(float *u, int n)
{
	for (int k = 0; k < n; k += 8)
		_mm256_storeu_ps(u + k, fwht8(_mm256_loadu_ps(u + k)));
	fwht_stages(u, n);
}

/* ---- dense rotation ---------------------------------------------------------------- */

AI void mv_block(const float *M, const float *x, int d, float *y, int c0, int NB, int nt)
{
	__m256 acc[8];

	for (int k = 0; k < NB; k++)
		acc[k] = _mm256_setzero_ps();
	for (int j = 0; j < d; j++) {
		const float *row = M + (size_t)j * d + 8 * c0;
		__m256 xj = _mm256_set1_ps(x[j]);
		for (int k = 0; k < NB; k++)
			acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_loadu_ps(row + 8 * k), xj));
	}
	for (int k = 0; k < NB; k++)
		st8(y + 8 * (c0 + k), acc[k], nt);
}

/* y[i] = sum over j of M[j][i] * x[j], j in order (mul, then add).
 * With M = mat_t this is R x; with M = mat, R^T x. */
static void dense_mv(const float *M, const float *x, int d, float *y, int nt)
{
	int nc = d / 8;

	for (int c0 = 0; c0 < nc; c0 += 8) {
		switch (nc - c0 < 8 ? nc - c0 : 8) {
		case 1: mv_block(M, x, d, y, c0, 1, nt); break;
		case 2: mv_block(M, x, d, y, c0, 2, nt); break;
		case 3: mv_block(M, x, d, y, c0, 3, nt); break;
		case 4: mv_block(M, x, d, y, c0, 4, nt); break;
		case 5: mv_block(M, x, d, y, c0, 5, nt); break;
		case 6: mv_block(M, x, d, y, c0, 6, nt); break;
		case 7: mv_block(M, x, d, y, c0, 7, nt); break;
		default: mv_block(M, x, d, y, c0, 8, nt); break;
		}
	}
}

/* ---- index planes (byte arrays; layout in tq_layout.h) ------------------------------- */

/* n bytes at p into a vector (n < 32: zero-filled beyond). */
AI __m256i ldb(const uint8_t *p, int n)
{
	if (n >= 32)
		return _mm256_loadu_si256((const __m256i *)p);
	if (n == 16)
		return _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)p));
	uint8_t t[32] = { 0 };
	memcpy(t, p, (size_t)n);
	return _mm256_loadu_si256((const __m256i *)t);
}

AI void stb(uint8_t *p, __m256i v, int n)
{
	if (n >= 32) {
		_mm256_storeu_si256((__m256i *)p, v);
	} else if (n == 16) {
		_mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(v));
	} else {
		uint8_t t[32];
		_mm256_storeu_si256((__m256i *)t, v);
		memcpy(p, t, (size_t)n);
	}
}

/* The 1-bit plane of 64 indices (stride 8: byte j holds bit `bit` of
 * indices j + 8 s at bit s): the bits gathered by movemask (bit i of m =
 * index i's), then m's 8 x 8 bit matrix transposed (byte j of the result =
 * bit j of m's bytes; Hacker's Delight's transpose8).  Byte-wise loads and
 * stores of 8 (ldb / stb) went through memory and cost more than the
 * reference's scalar packing. */
AI void plane1_d64(const uint8_t *idx, int bit, uint8_t *out)
{
	const __m256i v0 = _mm256_loadu_si256((const __m256i *)(const void *)idx);
	const __m256i v1 = _mm256_loadu_si256((const __m256i *)(const void *)(idx + 32));
	uint64_t m = (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(v0, 7 - bit)) |
		     (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(v1, 7 - bit)) << 32, t;

	t = (m ^ (m >> 7)) & 0x00AA00AA00AA00AAull;
	m ^= t ^ (t << 7);
	t = (m ^ (m >> 14)) & 0x0000CCCC0000CCCCull;
	m ^= t ^ (t << 14);
	t = (m ^ (m >> 28)) & 0x00000000F0F0F0F0ull;
	m ^= t ^ (t << 28);
	memcpy(out, &m, 8);
}

/* The 1-bit plane of d indices (stride S = d / 8): bit `bit` of index
 * s S + j at bit s of byte j. */
AI void plane1(const uint8_t *idx, int d, const int bit, uint8_t *out)
{
	const __m256i mb = _mm256_set1_epi8((char)(1 << bit));
	const int S = d / 8;

	if (d == 64) {
		plane1_d64(idx, bit, out);
		return;
	}
	for (int j = 0; j < S; j += 32) {
		int n = S - j;
		__m256i o = _mm256_setzero_si256();
		_Pragma("GCC unroll 8")
		for (int s = 0; s < 8; s++) {
			__m256i t = _mm256_and_si256(ldb(idx + s * S + j, n), mb);
			t = s < bit ? _mm256_srli_epi16(t, bit - s) : _mm256_slli_epi16(t, s - bit);
			o = _mm256_or_si256(o, t);
		}
		stb(out + j, o, n);
	}
}

static void pack_gen(const uint8_t *idx, int d, int bits, uint8_t *out)
{
	const __m256i m3 = _mm256_set1_epi8(3);

	if (bits == 4 || bits == 5) { /* planes [4] or [4, 1] (tq4o's first half) */
		const __m256i m15 = _mm256_set1_epi8(15);
		int S = d / 2;
		for (int j = 0; j < S; j += 32) {
			int n = S - j;
			__m256i a = ldb(idx + j, n), b = ldb(idx + S + j, n);
			if (bits == 5) {
				a = _mm256_and_si256(a, m15);
				b = _mm256_and_si256(b, m15);
			}
			stb(out + j, _mm256_or_si256(a, _mm256_slli_epi16(b, 4)), n);
		}
		if (bits == 5)
			plane1(idx, d, 4, out + S);
		return;
	}
	int S = d / 4;
	for (int j = 0; j < S; j += 32) {
		int n = S - j;
		__m256i o = _mm256_and_si256(ldb(idx + j, n), m3);
		o = _mm256_or_si256(o, _mm256_slli_epi16(_mm256_and_si256(ldb(idx + S + j, n), m3), 2));
		o = _mm256_or_si256(o, _mm256_slli_epi16(_mm256_and_si256(ldb(idx + 2 * S + j, n), m3), 4));
		o = _mm256_or_si256(o, _mm256_slli_epi16(_mm256_and_si256(ldb(idx + 3 * S + j, n), m3), 6));
		stb(out + j, o, n);
	}
	if (bits == 3)
		plane1(idx, d, 2, out + S);
}

static void unpack_gen(const uint8_t *in, int d, int bits, uint8_t *idx)
{
	const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4), m15 = _mm256_set1_epi8(15);

	if (bits == 4) {
		int S = d / 2;
		for (int j = 0; j < S; j += 32) {
			int n = S - j;
			__m256i b = ldb(in + j, n);
			stb(idx + j, _mm256_and_si256(b, m15), n);
			stb(idx + S + j, _mm256_and_si256(_mm256_srli_epi16(b, 4), m15), n);
		}
		return;
	}
	int S = d / 4;
	for (int j = 0; j < S; j += 32) {
		int n = S - j;
		__m256i b = ldb(in + j, n);
		for (int s = 0; s < 4; s++)
			stb(idx + s * S + j, _mm256_and_si256(_mm256_srli_epi16(b, 2 * s), m3), n);
	}
	if (bits != 3)
		return;
	in += S;
	S = d / 8;
	for (int j = 0; j < S; j += 32) {
		int n = S - j;
		__m256i b = ldb(in + j, n);
		for (int s = 0; s < 8; s++) {
			__m256i t = s < 2 ? _mm256_slli_epi16(b, 2 - s) : _mm256_srli_epi16(b, s - 2);
			t = _mm256_or_si256(_mm256_and_si256(t, m4), ldb(idx + s * S + j, n));
			stb(idx + s * S + j, t, n);
		}
	}
}

/* ---- row kernels: 0 = block written, 1 = hand the vector to the reference ----------- */

AI void conv_row(const struct ctx *e, const void *row, enum tq_dtype dt, float *xb)
{
	int k = 0;

	do /* nc >= 1 */
		_mm256_store_ps(xb + 8 * k, ld8(row, dt, k));
	while (++k < e->nc);
}

/* y = R x; Hadamard: before the 1/sqrt(d) factor (applied by the caller). */
static void rotate_mem(const struct ctx *e, const float *xb, float *y)
{
	const struct tq_rotation *r = &e->c->rot;

	if (r->kind == TQ_ROT_HADAMARD) {
		for (int k = 0; k < e->nc; k++)
			_mm256_store_ps(y + 8 * k, fwht8(_mm256_mul_ps(_mm256_load_ps(xb + 8 * k),
								       _mm256_loadu_ps(r->sign + 8 * k))));
		fwht_stages(y, e->d);
	} else {
		dense_mv(r->mat_t, xb, e->d, y, 0);
	}
}

/* x = R^T v, v already times the block's factor. */
static void unrotate_mem(const struct ctx *e, float *v, float *x, int nt)
{
	const struct tq_rotation *r = &e->c->rot;

	if (r->kind == TQ_ROT_HADAMARD) {
		fwht_mem(v, e->d);
		for (int k = 0; k < e->nc; k++)
			st8(x + 8 * k, _mm256_mul_ps(_mm256_load_ps(v + 8 * k), _mm256_loadu_ps(r->sign + 8 * k)),
			    nt);
	} else {
		dense_mv(r->mat, v, e->d, x, nt);
	}
}

AI int enc_tq_L(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk, const int L)
{
	const struct tq_rotation *r = &e->c->rot;
	float xb[TQ_DIM_MAX] __attribute__((aligned(32))), u[TQ_DIM_MAX] __attribute__((aligned(32)));
	uint8_t idx[TQ_DIM_MAX + 8];
	__m256 acc[2] = { _mm256_setzero_ps(), _mm256_setzero_ps() };

	if (r->kind == TQ_ROT_HADAMARD) {
		/* one pass: the sum of squares, the signs and the transform's
		 * in-register stages; then the stages through memory */
		int k = 0;
		do { /* nc >= 1 */
			__m256 v = ld8(row, dt, k);
			acc[k & 1] = _mm256_add_ps(acc[k & 1], _mm256_mul_ps(v, v));
			_mm256_store_ps(u + 8 * k, fwht8(_mm256_mul_ps(v, _mm256_loadu_ps(r->sign + 8 * k))));
		} while (++k < e->nc);
	} else {
		conv_row(e, row, dt, xb);
		for (int k = 0; k < e->nc; k++) {
			__m256 v = _mm256_load_ps(xb + 8 * k);
			acc[k & 1] = _mm256_add_ps(acc[k & 1], _mm256_mul_ps(v, v));
		}
	}
	float ss = hsum16(acc[0], acc[1]);
	if (!(ss <= FLT_MAX))
		return 1;
	if (ss == 0.0f) {
		memset(blk, 0, e->bb);
		return 0;
	}
	float norm = sqrt_f(ss), inv = 1.0f / norm;
	float fac = r->kind == TQ_ROT_HADAMARD ? inv * e->isd : inv;
	if (r->kind == TQ_ROT_HADAMARD)
		fwht_stages(u, e->d);
	else
		rotate_mem(e, xb, u);
	const __m256 f = _mm256_set1_ps(fac);
	acc[0] = acc[1] = _mm256_setzero_ps();
	for (int k = 0; k < e->nc; k++) {
		__m256i q = quant(e, _mm256_mul_ps(_mm256_load_ps(u + 8 * k), f), L);
		__m256 cv = lut16(e->ctab, q);
		acc[k & 1] = _mm256_add_ps(acc[k & 1], _mm256_mul_ps(cv, cv));
		st_idx8(idx + 8 * k, q);
	}
	float scale = norm / sqrt_f(hsum16(acc[0], acc[1]));
	memcpy(blk, &scale, 4);
	pack_gen(idx, e->d, e->bits, blk + TQ_TQ_HEADER_BYTES);
	return 0;
}

static int enc_tq(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	switch (e->levels) {
	case 4: return enc_tq_L(e, row, dt, blk, 4);
	case 8: return enc_tq_L(e, row, dt, blk, 8);
	default: return enc_tq_L(e, row, dt, blk, 16);
	}
}

/* One half of a tq3o / tq4o block (tq_codec_ref.c's quantize, L levels, a
 * Hadamard rotation r of h >= 8 values): the bf16 scale to sc, the planes.
 * 1 when the reference must take the vector (its norm overflows, or the
 * scale rounds to inf). */
AI int enc_tqo_half(const struct tq_rotation *r, const struct tqo_half *t, int bits, const float *x, int h,
		    uint8_t *sc, uint8_t *planes, const int L)
{
	float u[TQ_DIM_MAX / 2] __attribute__((aligned(32)));
	uint8_t idx[TQ_DIM_MAX / 2 + 8];
	__m256 acc[2] = { _mm256_setzero_ps(), _mm256_setzero_ps() };
	const int nc = h / 8;

	_Pragma("GCC unroll 16")
	for (int k = 0; k < nc; k++) {
		const __m256 v = _mm256_loadu_ps(x + 8 * k);
		acc[k & 1] = _mm256_add_ps(acc[k & 1], _mm256_mul_ps(v, v));
		_mm256_store_ps(u + 8 * k, fwht8(_mm256_mul_ps(v, _mm256_loadu_ps(r->sign + 8 * k))));
	}
	const float ss = hsum16(acc[0], acc[1]);
	if (!(ss <= FLT_MAX))
		return 1;
	if (ss == 0.0f) {
		memset(sc, 0, 2);
		memset(planes, 0, TQ_PLANES_BYTES(h, bits));
		return 0;
	}
	const float norm = sqrt_f(ss), inv = 1.0f / norm;
	const __m256 f = _mm256_set1_ps(inv * r->inv_sqrt_dim);
	fwht_stages(u, h);
	acc[0] = acc[1] = _mm256_setzero_ps();
	_Pragma("GCC unroll 16")
	for (int k = 0; k < nc; k++) {
		const __m256i q = quant_gen(t, _mm256_mul_ps(_mm256_load_ps(u + 8 * k), f), L);
		acc[k & 1] = _mm256_add_ps(acc[k & 1], lut_sq(t, q, L));
		st_idx8(idx + 8 * k, q);
	}
	const uint16_t s16 = tq_f32_to_bf16(norm / sqrt_f(hsum16(acc[0], acc[1])));
	if ((s16 & 0x7f80u) == 0x7f80u)
		return 1;
	memcpy(sc, &s16, 2);
	if (h >= 64)
		pack_gen(idx, h, bits, planes);
	else /* planes of fewer than 8 bytes: the scalar packing is faster than ldb / stb's copies */
		tq_pack_planes(idx, h, bits, planes);
	return 0;
}

/* tq3o / tq4o (LA, LB: the halves' levels); 1: the reference takes the
 * vector (non-finite input, overflow, or halves this path does not rotate:
 * not a power of two) */
AI int enc_tqo_L(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk, const int h,
		 const int LA, const int LB)
{
	const tq_codec *c = e->c;
	float x[TQ_DIM_MAX] __attribute__((aligned(32)));
	uint8_t b[TQ_TQO_BLOCK_BYTES(TQ_DIM_MAX, 7)];

	if (c->rot.kind != TQ_ROT_HADAMARD || c->rot_b.kind != TQ_ROT_HADAMARD || h < 8)
		return 1;
	/* a NaN / Inf shows in a half's sum of squares: the reference then
	 * takes the vector and says which element */
	const float *xs = x; /* fp32 rows as they are (the halves load them unaligned) */
	if (dt == TQ_DTYPE_F32)
		xs = (const float *)row;
	else
		conv_row(e, row, dt, x);
	if (enc_tqo_half(&c->rot, &e->ho[0], c->cb.bits, xs, h, b, b + TQ_TQO_HEADER_BYTES, LA) ||
	    enc_tqo_half(&c->rot_b, &e->ho[1], c->cb_b.bits, xs + h, h, b + 2,
			 b + TQ_TQO_HEADER_BYTES + TQ_PLANES_BYTES(h, c->cb.bits), LB))
		return 1;
	memcpy(blk, b, e->bb); /* only a whole block: a vector that fails writes nothing */
	return 0;
}

static int enc_tqo(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	const int o4 = e->c->cb.levels == 32, h = e->c->half;
	/* d = 128 specialized (the hot shape) */
	if (h == 64)
		return o4 ? enc_tqo_L(e, row, dt, blk, 64, 32, 8) : enc_tqo_L(e, row, dt, blk, 64, 16, 4);
	return o4 ? enc_tqo_L(e, row, dt, blk, h, 32, 8) : enc_tqo_L(e, row, dt, blk, h, 16, 4);
}

/* Indices [j0, j0 + 8) of a half of h values (h a power of two) from its
 * planes (tq_layout.h): plane p (width w, stride S = h w / 8 bytes) holds
 * index j's bits in byte j mod S at bit w (j / S).  Planes of fewer than 8
 * bytes are copied out (nothing past them is read) and spread by a byte
 * shuffle. */
AI __m256i unpack8(const uint8_t *planes, const int h, const int bits, int j0)
{
	const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	__m256i q = _mm256_setzero_si256();

	_Pragma("GCC unroll 3")
	for (int w = 4, sh = 0; w >= 1; w >>= 1) {
		if (!(bits & w))
			continue;
		const int S = h * w / 8, lgw = __builtin_ctz((unsigned)w);
		__m128i b;
		__m256i cnt;
		if (S >= 8) {
			b = _mm_loadl_epi64((const __m128i *)(const void *)(planes + (j0 & (S - 1))));
			cnt = _mm256_set1_epi32(w * (j0 / S));
		} else {
			uint64_t u = 0;
			memcpy(&u, planes, (size_t)S);
			b = _mm_shuffle_epi8(_mm_cvtsi64_si128((long long)u),
					     _mm_and_si128(_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0),
							   _mm_set1_epi8((char)(S - 1))));
			cnt = _mm256_sll_epi32(_mm256_srl_epi32(_mm256_add_epi32(iota, _mm256_set1_epi32(j0)),
								_mm_cvtsi32_si128(__builtin_ctz((unsigned)S))),
					       _mm_cvtsi32_si128(lgw));
		}
		const __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(b), cnt),
						   _mm256_set1_epi32((1 << w) - 1));
		q = _mm256_or_si256(q, _mm256_sll_epi32(v, _mm_cvtsi32_si128(sh)));
		planes += S;
		sh += w;
	}
	return q;
}

/* One half of a tq3o / tq4o block (h a power of two >= 8, L levels): x =
 * R^T (scale * c[idx]) in the reference's order — each centroid times
 * scale / sqrt(h), the butterflies, the signs. */
AI void dec_tqo_half(const struct tq_rotation *r, const struct tqo_half *t, const uint8_t *planes, float scale,
		     const int h, const int bits, float *x, int nt, const int L)
{
	float v[TQ_DIM_MAX / 2] __attribute__((aligned(32)));
	const __m256 f = _mm256_set1_ps(scale * r->inv_sqrt_dim);

	_Pragma("GCC unroll 16")
	for (int k = 0; k < h; k += 8)
		_mm256_store_ps(v + k, fwht8(_mm256_mul_ps(lut_gen(t, unpack8(planes, h, bits, k), L), f)));
	fwht_stages(v, h);
	_Pragma("GCC unroll 16")
	for (int k = 0; k < h; k += 8)
		st8(x + k, _mm256_mul_ps(_mm256_load_ps(v + k), _mm256_loadu_ps(r->sign + k)), nt);
}

AI void dec_tqo_halves(const struct ctx *e, const uint8_t *pa, float sa, float sb, const int h, float *x,
		       int nt, const int LA, const int LB)
{
	const tq_codec *c = e->c;
	const int ba = __builtin_ctz((unsigned)LA), bb = __builtin_ctz((unsigned)LB);

	dec_tqo_half(&c->rot, &e->ho[0], pa, sa, h, ba, x, nt, LA);
	dec_tqo_half(&c->rot_b, &e->ho[1], pa + TQ_PLANES_BYTES(h, ba), sb, h, bb, x + h, nt, LB);
}

/* tq3o / tq4o; 1: the reference takes the vector (a non-finite scale, or
 * halves this path does not rotate) */
static int dec_tqo(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{
	const tq_codec *c = e->c;
	const int h = c->half;
	const uint8_t *pa = blk + TQ_TQO_HEADER_BYTES;
	float sa, sb;

	if (!tq_tqo_dec_scales(c, blk, 8, &sa, &sb))
		return 1;
	const int o4 = c->cb.levels == 32;
	/* d = 128 specialized (the hot shape) */
	if (h == 64)
		o4 ? dec_tqo_halves(e, pa, sa, sb, 64, x, nt, 32, 8) : dec_tqo_halves(e, pa, sa, sb, 64, x, nt, 16, 4);
	else
		o4 ? dec_tqo_halves(e, pa, sa, sb, h, x, nt, 32, 8) : dec_tqo_halves(e, pa, sa, sb, h, x, nt, 16, 4);
	return 0;
}

static int dec_tq(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{
	const struct tq_rotation *r = &e->c->rot;
	float v[TQ_DIM_MAX] __attribute__((aligned(32)));
	uint8_t idx[TQ_DIM_MAX + 8];
	float scale;

	memcpy(&scale, blk, 4);
	if (!finite_f(scale))
		return 1;
	const __m256 f = _mm256_set1_ps(r->kind == TQ_ROT_HADAMARD ? scale * e->isd : scale);
	if (e->cent) {
		/* centroids by byte shuffles (tq_avx2.h), then times the factor
		 * (the same products as the pre-scaled table's) and, for the
		 * Hadamard rotation, its in-register stages in the same pass */
		tq_cent_block(e->c, &e->ctb, blk + TQ_TQ_HEADER_BYTES, v);
		if (r->kind != TQ_ROT_HADAMARD) {
			for (int k = 0; k < e->nc; k++)
				_mm256_store_ps(v + 8 * k, _mm256_mul_ps(_mm256_load_ps(v + 8 * k), f));
			dense_mv(r->mat, v, e->d, x, nt);
			return 0;
		}
		for (int k = 0; k < e->nc; k++)
			_mm256_store_ps(v + 8 * k, fwht8(_mm256_mul_ps(_mm256_load_ps(v + 8 * k), f)));
		fwht_stages(v, e->d);
		for (int k = 0; k < e->nc; k++)
			st8(x + 8 * k, _mm256_mul_ps(_mm256_load_ps(v + 8 * k), _mm256_loadu_ps(r->sign + 8 * k)), nt);
		return 0;
	}
	const __m256 t[2] = { _mm256_mul_ps(e->ctab[0], f), _mm256_mul_ps(e->ctab[1], f) };
	unpack_gen(blk + TQ_TQ_HEADER_BYTES, e->d, e->bits, idx);
	for (int k = 0; k < e->nc; k++) {
		__m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(idx + 8 * k)));
		_mm256_store_ps(v + 8 * k, lut16(t, q));
	}
	unrotate_mem(e, v, x, nt);
	return 0;
}

static int enc_q8(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	const struct tq_rotation *r = &e->c->rot;
	float xb[TQ_DIM_MAX] __attribute__((aligned(32))), y[TQ_DIM_MAX] __attribute__((aligned(32)));
	__m256i amx = _mm256_setzero_si256();

	conv_row(e, row, dt, xb);
	rotate_mem(e, xb, y);
	const __m256 f = _mm256_set1_ps(1.0f * e->isd);
	for (int k = 0; k < e->nc; k++) {
		__m256 v = _mm256_load_ps(y + 8 * k);
		if (r->kind == TQ_ROT_HADAMARD) {
			v = _mm256_mul_ps(v, f);
			_mm256_store_ps(y + 8 * k, v);
		}
		amx = absbits_max(amx, v);
	}
	uint32_t ab = hmax_u32(amx);
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
	const __m256 inv = _mm256_set1_ps(inv1);
	int8_t *out = (int8_t *)(blk + TQ_Q8_HEADER_BYTES);
	for (int k = 0; k < e->nc; k++) {
		__m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(y + 8 * k), inv));
		q = _mm256_min_epi32(_mm256_max_epi32(q, _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
		st_q8(out + 8 * k, q);
	}
	float scale = amax / 127.0f;
	memcpy(blk, &scale, 4);
	return 0;
}

static int dec_q8(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{
	const struct tq_rotation *r = &e->c->rot;
	const int8_t *in = (const int8_t *)(blk + TQ_Q8_HEADER_BYTES);
	float v[TQ_DIM_MAX] __attribute__((aligned(32)));
	float scale;

	memcpy(&scale, blk, 4);
	if (!finite_f(scale))
		return 1;
	const __m256 f = _mm256_set1_ps(r->kind == TQ_ROT_HADAMARD ? scale * e->isd : scale);
	for (int k = 0; k < e->nc; k++) {
		__m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(in + 8 * k)));
		_mm256_store_ps(v + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(q), f));
	}
	unrotate_mem(e, v, x, nt);
	return 0;
}

static int enc_q4a(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	float xb[TQ_DIM_MAX] __attribute__((aligned(32)));
	uint8_t q[TQ_DIM_MAX + 8];
	__m256i amx = _mm256_setzero_si256();

	conv_row(e, row, dt, xb);
	__m256 vmin = _mm256_load_ps(xb), vmax = vmin;
	for (int k = 0; k < e->nc; k++) {
		__m256 v = _mm256_load_ps(xb + 8 * k);
		vmin = _mm256_min_ps(vmin, v);
		vmax = _mm256_max_ps(vmax, v);
		amx = absbits_max(amx, v);
	}
	if (hmax_u32(amx) >= 0x7f800000u)
		return 1;
	__m128 m4 = _mm_min_ps(_mm256_castps256_ps128(vmin), _mm256_extractf128_ps(vmin, 1));
	__m128 x4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
	m4 = _mm_min_ps(m4, _mm_movehl_ps(m4, m4));
	x4 = _mm_max_ps(x4, _mm_movehl_ps(x4, x4));
	float mn = _mm_cvtss_f32(_mm_min_ss(m4, _mm_movehdup_ps(m4)));
	float mx = _mm_cvtss_f32(_mm_max_ss(x4, _mm_movehdup_ps(x4)));
	/* a zero extreme: its sign comes from the reference's fminf/fmaxf on
	 * ±0, which C leaves to libm and lets the compiler commute */
	if (mn == 0.0f || mx == 0.0f)
		return 1;
	float range = mx - mn;
	uint16_t sh = tq_f32_to_f16(range / 15.0f), mh = tq_f32_to_f16(mn);
	if (!finite_f(range) || (sh & 0x7c00u) == 0x7c00u || (mh & 0x7c00u) == 0x7c00u)
		return 1;
	float s = tq_f16_to_f32(sh), mf = tq_f16_to_f32(mh);
	float inv = s > 0.0f ? 1.0f / s : 0.0f;
	const __m256 vm = _mm256_set1_ps(mf), vi = _mm256_set1_ps(inv);
	for (int k = 0; k < e->nc; k++) {
		__m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_load_ps(xb + 8 * k), vm), vi);
		/* clamping before rounding = clamping after (rint is monotone) */
		t = _mm256_min_ps(_mm256_max_ps(t, _mm256_setzero_ps()), _mm256_set1_ps(15.0f));
		st_idx8(q + 8 * k, _mm256_cvtps_epi32(t));
	}
	memcpy(blk, &sh, 2);
	memcpy(blk + 2, &mh, 2);
	pack_gen(q, e->d, 4, blk + TQ_Q4A_HEADER_BYTES);
	return 0;
}

static int dec_q4a(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{
	uint8_t q[TQ_DIM_MAX + 8];
	uint16_t sh, mh;

	memcpy(&sh, blk, 2);
	memcpy(&mh, blk + 2, 2);
	if ((sh & 0x7c00u) == 0x7c00u || (mh & 0x7c00u) == 0x7c00u)
		return 1;
	const __m256 vs = _mm256_set1_ps(tq_f16_to_f32(sh)), vm = _mm256_set1_ps(tq_f16_to_f32(mh));
	unpack_gen(blk + TQ_Q4A_HEADER_BYTES, e->d, 4, q);
	for (int k = 0; k < e->nc; k++) {
		__m256 t = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * k))));
		st8(x + 8 * k, _mm256_add_ps(vm, _mm256_mul_ps(vs, t)), nt);
	}
	return 0;
}

static int enc_f16(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	uint16_t h[TQ_DIM_MAX];
	__m128i mx = _mm_setzero_si128();

	for (int k = 0; k < e->nc; k++) {
		__m128i v = _mm256_cvtps_ph(ld8(row, dt, k), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		mx = _mm_max_epu16(mx, _mm_and_si128(v, _mm_set1_epi16(0x7fff)));
		_mm_storeu_si128((__m128i *)(h + 8 * k), v);
	}
	/* a lane >= 0x7c00: Inf or NaN came out (beyond range, or bad input) */
	if (_mm_movemask_epi8(_mm_cmpgt_epi16(mx, _mm_set1_epi16(0x7bff))))
		return 1;
	memcpy(blk, h, e->bb);
	return 0;
}

/* The row is read once: the values checked are the values stored, even
 * when another process rewrites it meanwhile (a client's shared arena). */
static int enc_f32(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	float x[TQ_DIM_MAX] __attribute__((aligned(32)));
	__m256i amx = _mm256_setzero_si256();

	for (int k = 0; k < e->nc; k++) {
		__m256 v = ld8(row, dt, k);
		amx = absbits_max(amx, v);
		_mm256_store_ps(x + 8 * k, v);
	}
	if (hmax_u32(amx) >= 0x7f800000u)
		return 1;
	memcpy(blk, x, e->bb);
	return 0;
}

static int dec_f16(const struct ctx *e, const uint8_t *blk, float *x, int nt)
{
	for (int k = 0; k < e->nc; k++) {
		__m128i h = _mm_loadu_si128((const __m128i *)(blk + 16 * k));
		__m256 f = _mm256_cvtph_ps(h);
		__m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
		if (!_mm256_testz_ps(nan, nan)) {
			/* the reference keeps a NaN's payload as it is (no quieting) */
			__m256i w = _mm256_cvtepu16_epi32(h);
			__m256i b = _mm256_or_si256(
				_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
						_mm256_set1_epi32(0x7f800000)),
				_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x3ff)), 13));
			f = _mm256_blendv_ps(f, _mm256_castsi256_ps(b), nan);
		}
		st8(x + 8 * k, f, nt);
	}
	return 0;
}

/* ---- batch drivers ------------------------------------------------------------------- */

typedef int (*enc_fn)(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk);
typedef int (*dec_fn)(const struct ctx *e, const uint8_t *blk, float *x, int nt);

static int avx2_encode(const tq_codec *c, const void *src, enum tq_dtype dt, size_t n, void *dst,
		       tq_error *err)
{
	struct ctx e;
	enc_fn fn;
	size_t rb = tq_dtype_size(dt) * (size_t)c->dim;
	const uint8_t *s = src;
	uint8_t *out = dst;

	if (!rb)
		return tq_fail(err, "unknown input element type %d", (int)dt);
	switch (c->id) {
	case TQ_CODEC_TQ2:
	case TQ_CODEC_TQ3:
	case TQ_CODEC_TQ4: fn = enc_tq; break;
	case TQ_CODEC_Q8: fn = enc_q8; break;
	case TQ_CODEC_Q4A: fn = enc_q4a; break;
	case TQ_CODEC_F16: fn = enc_f16; break;
	case TQ_CODEC_F32: fn = enc_f32; break;
	case TQ_CODEC_TQ3O:
	case TQ_CODEC_TQ4O: fn = enc_tqo; break;
	default: return tq_fail(err, "unknown codec id %d", (int)c->id);
	}
	ctx_init(&e, c);
	for (size_t v = 0; v < n; v++, s += rb, out += e.bb) {
		_mm_prefetch((const char *)s + PF_AHEAD, _MM_HINT_T0);
		if (fn(&e, s, dt, out)) {
			int r = tq_encode_ref_row(c, s, dt, v, out, err);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

static int avx2_decode(const tq_codec *c, const void *src, size_t n, float *dst)
{
	struct ctx e;
	dec_fn fn;
	const uint8_t *s = src;
	int nt = (size_t)n * c->dim * 4 >= NT_MIN_BYTES && !((uintptr_t)dst & 31);

	switch (c->id) {
	case TQ_CODEC_TQ2:
	case TQ_CODEC_TQ3:
	case TQ_CODEC_TQ4: fn = dec_tq; break;
	case TQ_CODEC_Q8: fn = dec_q8; break;
	case TQ_CODEC_Q4A: fn = dec_q4a; break;
	case TQ_CODEC_F16: fn = dec_f16; break;
	case TQ_CODEC_F32: memcpy(dst, src, n * c->block_bytes); return 0;
	case TQ_CODEC_TQ3O:
	case TQ_CODEC_TQ4O: fn = dec_tqo; break;
	default: return -EINVAL;
	}
	ctx_init(&e, c);
	for (size_t v = 0; v < n; v++, s += e.bb, dst += e.d)
		if (fn(&e, s, dst, nt))
			tq_decode_ref(c, s, 1, dst);
	if (nt)
		_mm_sfence();
	return 0;
}

static const struct tq_codec_ops ops_avx2 = {
	.isa = TQ_ISA_AVX2,
	.encode = avx2_encode,
	.decode = avx2_decode,
};

const struct tq_codec_ops *tq_codec_ops_avx2(void)
{
	return &ops_avx2;
}

#else /* no AVX2 in this build (non-x86): the scalar path serves */

const struct tq_codec_ops *tq_codec_ops_avx2(void)
{
	return NULL;
}

#endif
