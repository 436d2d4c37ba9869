/* tq_codec_neon.c — aarch64 NEON (ARMv8.0 Advanced SIMD) codec paths,
 * bit-identical to tq_codec_ref.c under the contract in tq_internal.h.
 *
 * The shape of the AVX2 path with 4 lanes: [dim] float buffers on the stack
 * walked in 4-lane chunks (dims are multiples of 8: never a tail).  The
 * 16-lane sums of squares use four accumulators (lanes 0-3, 4-7, 8-11,
 * 12-15); the FWHT runs its two in-register stages as unzip/zip + add/sub
 * (a+b and a-b, the reference's operand order) and the rest as plain
 * add/sub across registers; the dense matvec is a column axpy accumulated in
 * j order (vmulq, then vaddq: never vfmaq); an index is the count of bounds
 * strictly below the value (vcgtq, subtract the all-ones mask), and a
 * centroid is looked up with tbl on the codebook's bytes.  An unusual vector
 * (NaN/Inf, an overflowing sum, a non-finite header, a zero extreme in q4a,
 * a denormal q8 maximum, an fp16 overflow) goes to the scalar reference, as
 * on x86.  Only ARMv8.0 instructions: conversions f16 <-> f32 (FCVTL/FCVTN)
 * are baseline, no fp16 arithmetic is used.
 *
 * Thread context: reentrant; all state is on the stack.
 */
#include "tq_internal.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "tq_neon.h"

#define AI static inline __attribute__((always_inline))

/* ---- helpers ------------------------------------------------------------------- */

/* The contract's 16-lane sum, a[j] holding lanes 4j..4j+3:
 * l[i] += l[i+8], then +4, +2, +1. */
AI float hsum16(const float32x4_t a[4])
{
	float32x4_t s0 = vaddq_f32(a[0], a[2]), s1 = vaddq_f32(a[1], a[3]);
	float32x4_t s = vaddq_f32(s0, s1);
	float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
	return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

AI int finite_f(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	return (u & 0x7f800000u) != 0x7f800000u;
}

AI float32x4_t ld4(const void *row, enum tq_dtype dt, int k)
{
	if (dt == TQ_DTYPE_F32)
		return vld1q_f32((const float *)row + 4 * k);
	uint16x4_t h = vld1_u16((const uint16_t *)row + 4 * k);
	if (dt == TQ_DTYPE_F16)
		return vcvt_f32_f16(vreinterpret_f16_u16(h));
	return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

AI uint32x4_t absbits_max(uint32x4_t acc, float32x4_t v)
{
	return vmaxq_u32(acc, vandq_u32(vreinterpretq_u32_f32(v), vdupq_n_u32(0x7fffffffu)));
}

/* ---- centroid search and lookup ---------------------------------------------------- */

/* Index of u: the number of bounds strictly below it (bounds broadcast in b). */
AI uint32x4_t quant(const float32x4_t *b, float32x4_t u, const int L)
{
	uint32x4_t q = vdupq_n_u32(0);

	_Pragma("GCC unroll 16")
	for (int i = 0; i < L - 1; i++)
		q = vsubq_u32(q, vcgtq_f32(u, b[i])); /* mask is all ones: -(-1) */
	return q;
}

/* Table of up to 16 floats (64 bytes) for tbl lookups. */
struct ftab {
	uint8x16x4_t t;
};

AI void ftab_init(struct ftab *ft, const float *c16)
{
	ft->t.val[0] = vreinterpretq_u8_f32(vld1q_f32(c16));
	ft->t.val[1] = vreinterpretq_u8_f32(vld1q_f32(c16 + 4));
	ft->t.val[2] = vreinterpretq_u8_f32(vld1q_f32(c16 + 8));
	ft->t.val[3] = vreinterpretq_u8_f32(vld1q_f32(c16 + 12));
}

/* Byte offsets of float q (q < 16) in each lane: 4q + {0, 1, 2, 3}. */
AI uint8x16_t boff(uint32x4_t q)
{
	return vreinterpretq_u8_u32(vmlaq_n_u32(vdupq_n_u32(0x03020100u), q, 0x04040404u));
}

/* t[q] for 4 lanes; L entries used (a tbl over 16, 32 or 64 bytes). */
AI float32x4_t lut(const struct ftab *ft, uint32x4_t q, const int L)
{
	uint8x16_t bi = boff(q);
	uint8x16_t r;

	if (L == 4) {
		r = vqtbl1q_u8(ft->t.val[0], bi);
	} else if (L == 8) {
		uint8x16x2_t t2 = { { ft->t.val[0], ft->t.val[1] } };
		r = vqtbl2q_u8(t2, bi);
	} else {
		r = vqtbl4q_u8(ft->t, bi);
	}
	return vreinterpretq_f32_u8(r);
}

/* rep[k]: byte 4k + i / 4 of a vector in lane i — the index of the float
 * that lane's byte belongs to, for floats 4k .. 4k + 3 */
static const uint8_t rep[4][16] = {
	{ 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3 },
	{ 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7 },
	{ 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11 },
	{ 12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15 },
};

/* 16 index bytes (each < 16) to 4 vectors of t[idx] (L entries). */
AI void lut16b(const struct ftab *ft, uint8x16_t idx, float32x4_t out[4], const int L)
{
	const uint8x16_t inc = vreinterpretq_u8_u32(vdupq_n_u32(0x03020100u));
	uint8x16_t i4 = vshlq_n_u8(idx, 2);

	_Pragma("GCC unroll 4")
	for (int k = 0; k < 4; k++) {
		uint8x16_t bi = vaddq_u8(vqtbl1q_u8(i4, vld1q_u8(rep[k])), inc);
		uint8x16_t r;
		if (L == 4) {
			r = vqtbl1q_u8(ft->t.val[0], bi);
		} else if (L == 8) {
			uint8x16x2_t t2 = { { ft->t.val[0], ft->t.val[1] } };
			r = vqtbl2q_u8(t2, bi);
		} else {
			r = vqtbl4q_u8(ft->t, bi);
		}
		out[k] = vreinterpretq_f32_u8(r);
	}
}

/* 8 lanes (two u32 vectors, each < 256) to 8 bytes at p. */
AI void st_idx8(uint8_t *p, uint32x4_t a, uint32x4_t b)
{
	uint16x8_t w = vcombine_u16(vmovn_u32(a), vmovn_u32(b));
	vst1_u8(p, vmovn_u16(w));
}

/* ---- FWHT ------------------------------------------------------------------------ */

/* Stages h = 1 and 2 on 8 values in two registers. */
AI void fwht8(float32x4_t *x, float32x4_t *y)
{
	float32x4_t e = vuzp1q_f32(*x, *y), o = vuzp2q_f32(*x, *y);
	float32x4_t s = vaddq_f32(e, o), d = vsubq_f32(e, o);
	float32x4_t a = vzip1q_f32(s, d), b = vzip2q_f32(s, d);    /* h = 1 done */
	float64x2_t a2 = vreinterpretq_f64_f32(a), b2 = vreinterpretq_f64_f32(b);
	float32x4_t e2 = vreinterpretq_f32_f64(vzip1q_f64(a2, b2)); /* a0 a1 b0 b1 */
	float32x4_t o2 = vreinterpretq_f32_f64(vzip2q_f64(a2, b2)); /* a2 a3 b2 b3 */
	float64x2_t s2 = vreinterpretq_f64_f32(vaddq_f32(e2, o2));
	float64x2_t d2 = vreinterpretq_f64_f32(vsubq_f32(e2, o2));
	*x = vreinterpretq_f32_f64(vzip1q_f64(s2, d2));
	*y = vreinterpretq_f32_f64(vzip2q_f64(s2, d2));
}

/* u: [n] floats, n a power of two >= 8. */
static void fwht_mem(float *u, int n)
{
	for (int k = 0; k < n; k += 8) {
		float32x4_t x = vld1q_f32(u + k), y = vld1q_f32(u + k + 4);
		fwht8(&x, &y);
		vst1q_f32(u + k, x);
		vst1q_f32(u + k + 4, y);
	}
	for (int h = 4; h < n; h <<= 1)
		for (int i = 0; i < n; i += 2 * h)
			for (int j = i; j < i + h; j += 4) {
				float32x4_t a = vld1q_f32(u + j), b = vld1q_f32(u + j + h);
				vst1q_f32(u + j, vaddq_f32(a, b));
				vst1q_f32(u + j + h, vsubq_f32(a, b));
			}
}

/* ---- dense rotation ---------------------------------------------------------------- */

AI void mv_block(const float *M, const float *x, int d, float *y, int c0, const int NB)
{
	float32x4_t acc[8];

	_Pragma("GCC unroll 8")
	for (int k = 0; k < NB; k++)
		acc[k] = vdupq_n_f32(0.0f);
	for (int j = 0; j < d; j++) {
		const float *row = M + (size_t)j * d + 4 * c0;
		float32x4_t xj = vdupq_n_f32(x[j]);
		_Pragma("GCC unroll 8")
		for (int k = 0; k < NB; k++)
			acc[k] = vaddq_f32(acc[k], vmulq_f32(vld1q_f32(row + 4 * k), xj));
	}
	_Pragma("GCC unroll 8")
	for (int k = 0; k < NB; k++)
		vst1q_f32(y + 4 * (c0 + k), acc[k]);
}

/* y[i] = sum over j of M[j][i] * x[j], j in order (mul, then add).
 * With M = mat_t this is R x; with M = mat, R^T x.  d % 8 == 0. */
static void dense_mv(const float *M, const float *x, int d, float *y)
{
	int nc = d / 4;

	for (int c0 = 0; c0 < nc; c0 += 8) {
		switch (nc - c0 < 8 ? nc - c0 : 8) {
		case 2: mv_block(M, x, d, y, c0, 2); break;
		case 4: mv_block(M, x, d, y, c0, 4); break;
		case 6: mv_block(M, x, d, y, c0, 6); break;
		default: mv_block(M, x, d, y, c0, 8); break;
		}
	}
}

/* ---- index planes (layout in tq_layout.h) ------------------------------------------
 * Vector code where the plane strides are multiples of 16 bytes, the
 * portable packer otherwise (small dims). */

static void pack_gen(const uint8_t *idx, int d, int bits, uint8_t *out)
{
	const uint8x16_t m3 = vdupq_n_u8(3), m4 = vdupq_n_u8(4);

	if (d % 128) {
		tq_pack_planes(idx, d, bits, out);
		return;
	}
	if (bits == 4) {
		int S = d / 2;
		for (int j = 0; j < S; j += 16)
			vst1q_u8(out + j, vorrq_u8(vld1q_u8(idx + j), vshlq_n_u8(vld1q_u8(idx + S + j), 4)));
		return;
	}
	int S = d / 4;
	for (int j = 0; j < S; j += 16) {
		uint8x16_t o = vandq_u8(vld1q_u8(idx + j), m3);
		o = vorrq_u8(o, vshlq_n_u8(vandq_u8(vld1q_u8(idx + S + j), m3), 2));
		o = vorrq_u8(o, vshlq_n_u8(vandq_u8(vld1q_u8(idx + 2 * S + j), m3), 4));
		o = vorrq_u8(o, vshlq_n_u8(vandq_u8(vld1q_u8(idx + 3 * S + j), m3), 6));
		vst1q_u8(out + j, o);
	}
	if (bits != 3)
		return;
	out += S;
	S = d / 8;
	for (int j = 0; j < S; j += 16) {
		uint8x16_t o = vshrq_n_u8(vandq_u8(vld1q_u8(idx + j), m4), 2);
		o = vorrq_u8(o, vshrq_n_u8(vandq_u8(vld1q_u8(idx + S + j), m4), 1));
		o = vorrq_u8(o, vandq_u8(vld1q_u8(idx + 2 * S + j), m4));
		o = vorrq_u8(o, vshlq_n_u8(vandq_u8(vld1q_u8(idx + 3 * S + j), m4), 1));
		o = vorrq_u8(o, vshlq_n_u8(vandq_u8(vld1q_u8(idx + 4 * S + j), m4), 2));
		o = vorrq_u8(o, vshlq_n_u8(vandq_u8(vld1q_u8(idx + 5 * S + j), m4), 3));
		o = vorrq_u8(o, vshlq_n_u8(vandq_u8(vld1q_u8(idx + 6 * S + j), m4), 4));
		o = vorrq_u8(o, vshlq_n_u8(vandq_u8(vld1q_u8(idx + 7 * S + j), m4), 5));
		vst1q_u8(out + j, o);
	}
}

static void unpack_gen(const uint8_t *in, int d, int bits, uint8_t *idx)
{
	const uint8x16_t m3 = vdupq_n_u8(3), m4 = vdupq_n_u8(4), m15 = vdupq_n_u8(15);

	if (d % 128) {
		tq_unpack_planes(in, d, bits, idx);
		return;
	}
	if (bits == 4) {
		int S = d / 2;
		for (int j = 0; j < S; j += 16) {
			uint8x16_t b = vld1q_u8(in + j);
			vst1q_u8(idx + j, vandq_u8(b, m15));
			vst1q_u8(idx + S + j, vshrq_n_u8(b, 4));
		}
		return;
	}
	int S = d / 4;
	for (int j = 0; j < S; j += 16) {
		uint8x16_t b = vld1q_u8(in + j);
		vst1q_u8(idx + j, vandq_u8(b, m3));
		vst1q_u8(idx + S + j, vandq_u8(vshrq_n_u8(b, 2), m3));
		vst1q_u8(idx + 2 * S + j, vandq_u8(vshrq_n_u8(b, 4), m3));
		vst1q_u8(idx + 3 * S + j, vshrq_n_u8(b, 6));
	}
	if (bits != 3)
		return;
	in += S;
	S = d / 8;
	for (int j = 0; j < S; j += 16) {
		uint8x16_t b = vld1q_u8(in + j);
#define HI(s, t) vst1q_u8(idx + (s) * S + j, vorrq_u8(vld1q_u8(idx + (s) * S + j), vandq_u8(t, m4)))
		HI(0, vshlq_n_u8(b, 2));
		HI(1, vshlq_n_u8(b, 1));
		HI(2, b);
		HI(3, vshrq_n_u8(b, 1));
		HI(4, vshrq_n_u8(b, 2));
		HI(5, vshrq_n_u8(b, 3));
		HI(6, vshrq_n_u8(b, 4));
		HI(7, vshrq_n_u8(b, 5));
#undef HI
	}
}

/* ---- per-call context ------------------------------------------------------------- */

struct ctx {
	const tq_codec *c;
	int d, nc, bits, levels;  /* nc: 4-lane chunks                                  */
	uint32_t bb;
	float isd;
	float32x4_t bnd[15];      /* bound[i] broadcast, i < levels - 1                 */
	float ct[16];             /* centroid[k mod L], k = 0..15                        */
	struct tqo_half {         /* tq3o / tq4o: each half's codebook                   */
		struct ftab bt[5]; /* step j (s = L/2 >> j): bound[lo + s - 1] by lo / 2s */
		struct ftab ct[2]; /* centroid[k], k < L (32 in two tables)              */
	} ho[2];
};

static void tqo_half_init(struct tqo_half *t, const tq_codebook *cb)
{
	const int L = cb->levels;
	float b[16], c[32] = { 0 };

	for (int j = 0, s = L / 2; s >= 1; s >>= 1, j++) {
		memset(b, 0, sizeof(b));
		for (int lo = 0, i = 0; lo < L; lo += 2 * s, i++)
			b[i] = cb->bound[lo + s - 1];
		ftab_init(&t->bt[j], b);
	}
	memcpy(c, cb->centroid, sizeof(float) * (size_t)L);
	ftab_init(&t->ct[0], c);
	ftab_init(&t->ct[1], c + 16);
}

static void ctx_init(struct ctx *e, const tq_codec *c)
{
	e->c = c;
	e->d = c->dim;
	e->nc = c->dim / 4;
	e->bits = c->bits;
	e->bb = c->block_bytes;
	e->isd = c->rot.inv_sqrt_dim;
	e->levels = 0;
	if (c->id == TQ_CODEC_TQ2 || c->id == TQ_CODEC_TQ3 || c->id == TQ_CODEC_TQ4) {
		const tq_codebook *cb = &c->cb;
		int L = cb->levels;

		e->levels = L;
		for (int i = 0; i < L - 1; i++)
			e->bnd[i] = vdupq_n_f32(cb->bound[i]);
		for (int k = 0; k < 16; k++)
			e->ct[k] = cb->centroid[k % L];
	}
	if (c->half) {
		tqo_half_init(&e->ho[0], &c->cb);
		tqo_half_init(&e->ho[1], &c->cb_b);
	}
}

/* ---- row kernels: 0 = block written, 1 = hand the vector to the reference ----------- */

AI void conv_row(const struct ctx *e, const void *row, enum tq_dtype dt, float *xb)
{
	int k = 0;

	do /* nc >= 2 (tells the compiler xb gets written) */
		vst1q_f32(xb + 4 * k, ld4(row, dt, k));
	while (++k < e->nc);
}

/* y = R x; Hadamard: before the 1/sqrt(d) factor (applied by the caller). */
static void rotate_mem(const struct ctx *e, const float *xb, float *y)
{
	const struct tq_rotation *r = &e->c->rot;

	if (r->kind == TQ_ROT_HADAMARD) {
		for (int k = 0; k < e->nc; k++)
			vst1q_f32(y + 4 * k, vmulq_f32(vld1q_f32(xb + 4 * k), vld1q_f32(r->sign + 4 * k)));
		fwht_mem(y, e->d);
	} else {
		dense_mv(r->mat_t, xb, e->d, y);
	}
}

/* x = R^T v, v already times the block's factor. */
static void unrotate_mem(const struct ctx *e, float *v, float *x)
{
	const struct tq_rotation *r = &e->c->rot;

	if (r->kind == TQ_ROT_HADAMARD) {
		fwht_mem(v, e->d);
		for (int k = 0; k < e->nc; k++)
			vst1q_f32(x + 4 * k, vmulq_f32(vld1q_f32(v + 4 * k), vld1q_f32(r->sign + 4 * k)));
	} else {
		dense_mv(r->mat, v, e->d, x);
	}
}

AI int enc_tq_L(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk, const int L)
{
	const struct tq_rotation *r = &e->c->rot;
	float xb[TQ_DIM_MAX] __attribute__((aligned(16))), u[TQ_DIM_MAX] __attribute__((aligned(16)));
	uint8_t idx[TQ_DIM_MAX + 8];
	float32x4_t acc[4];
	struct ftab ft;

	for (int i = 0; i < 4; i++)
		acc[i] = vdupq_n_f32(0.0f);
	conv_row(e, row, dt, xb);
	for (int k = 0; k < e->nc; k++) {
		float32x4_t v = vld1q_f32(xb + 4 * k);
		acc[k & 3] = vaddq_f32(acc[k & 3], vmulq_f32(v, v));
	}
	float ss = hsum16(acc);
	if (!(ss <= FLT_MAX))
		return 1;
	if (ss == 0.0f) {
		memset(blk, 0, e->bb);
		return 0;
	}
	float norm = sqrtf(ss), inv = 1.0f / norm;
	float fac = r->kind == TQ_ROT_HADAMARD ? inv * e->isd : inv;
	rotate_mem(e, xb, u);
	ftab_init(&ft, e->ct);
	const float32x4_t f = vdupq_n_f32(fac);
	for (int i = 0; i < 4; i++)
		acc[i] = vdupq_n_f32(0.0f);
	for (int k = 0; k < e->nc; k += 2) {
		uint32x4_t q0 = quant(e->bnd, vmulq_f32(vld1q_f32(u + 4 * k), f), L);
		uint32x4_t q1 = quant(e->bnd, vmulq_f32(vld1q_f32(u + 4 * k + 4), f), L);
		float32x4_t c0 = lut(&ft, q0, L), c1 = lut(&ft, q1, L);
		acc[k & 3] = vaddq_f32(acc[k & 3], vmulq_f32(c0, c0));
		acc[(k + 1) & 3] = vaddq_f32(acc[(k + 1) & 3], vmulq_f32(c1, c1));
		st_idx8(idx + 4 * k, q0, q1);
	}
	float scale = norm / sqrtf(hsum16(acc));
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

/* The binary search over any codebook of L (4 .. 32, a constant) levels:
 * step j's candidate bound (2^j of them) looked up by lo / 2s with tbl —
 * the comparisons of tq_cb_index, so the same index. */
AI uint32x4_t quant_gen(const struct tqo_half *t, float32x4_t u, const int L)
{
	uint32x4_t lo = vdupq_n_u32(0);

	_Pragma("GCC unroll 8")
	for (int j = 0, s = L / 2, sh = __builtin_ctz((unsigned)L); s >= 1; s >>= 1, j++, sh--) {
		const uint32x4_t i = vshlq_u32(lo, vdupq_n_s32(-sh));
		const float32x4_t b = lut(&t->bt[j], i, (1 << j) <= 4 ? 4 : 1 << j);
		lo = vorrq_u32(lo, vandq_u32(vcgtq_f32(u, b), vdupq_n_u32((uint32_t)s)));
	}
	return lo;
}

/* centroid[q] of a codebook of L (4 .. 32, a constant) levels */
AI float32x4_t lut_gen(const struct tqo_half *t, uint32x4_t q, const int L)
{
	if (L <= 16)
		return lut(&t->ct[0], q, L);
	const uint32x4_t q4 = vandq_u32(q, vdupq_n_u32(15));
	return vbslq_f32(vcgeq_u32(q, vdupq_n_u32(16)), lut(&t->ct[1], q4, 16), lut(&t->ct[0], q4, 16));
}

/* One half of a tq3o / tq4o block (tq_codec_ref.c's quantize, L levels, a
 * Hadamard rotation r of h >= 8 values): the bf16 scale to sc, the planes.
 * 1 when the reference must take the vector (its norm overflows, or the
 * scale rounds to inf). */
AI int enc_tqo_half(const struct tq_rotation *r, const struct tqo_half *t, int bits, const float *x, int h,
		    uint8_t *sc, uint8_t *planes, const int L)
{
	float u[TQ_DIM_MAX / 2] __attribute__((aligned(16)));
	uint8_t idx[TQ_DIM_MAX / 2 + 8];
	float32x4_t acc[4];
	const int nc = h / 4;

	for (int i = 0; i < 4; i++)
		acc[i] = vdupq_n_f32(0.0f);
	for (int k = 0; k < nc; k++) {
		const float32x4_t v = vld1q_f32(x + 4 * k);
		acc[k & 3] = vaddq_f32(acc[k & 3], vmulq_f32(v, v));
		vst1q_f32(u + 4 * k, vmulq_f32(v, vld1q_f32(r->sign + 4 * k)));
	}
	const float ss = hsum16(acc);
	if (!(ss <= FLT_MAX))
		return 1;
	if (ss == 0.0f) {
		memset(sc, 0, 2);
		memset(planes, 0, TQ_PLANES_BYTES(h, bits));
		return 0;
	}
	const float norm = sqrtf(ss), inv = 1.0f / norm;
	const float32x4_t f = vdupq_n_f32(inv * r->inv_sqrt_dim);
	fwht_mem(u, h);
	for (int i = 0; i < 4; i++)
		acc[i] = vdupq_n_f32(0.0f);
	for (int k = 0; k < nc; k += 2) {
		const uint32x4_t q0 = quant_gen(t, vmulq_f32(vld1q_f32(u + 4 * k), f), L);
		const uint32x4_t q1 = quant_gen(t, vmulq_f32(vld1q_f32(u + 4 * k + 4), f), L);
		const float32x4_t c0 = lut_gen(t, q0, L), c1 = lut_gen(t, q1, L);
		acc[k & 3] = vaddq_f32(acc[k & 3], vmulq_f32(c0, c0));
		acc[(k + 1) & 3] = vaddq_f32(acc[(k + 1) & 3], vmulq_f32(c1, c1));
		st_idx8(idx + 4 * k, q0, q1);
	}
	const uint16_t s16 = tq_f32_to_bf16(norm / sqrtf(hsum16(acc)));
	if ((s16 & 0x7f80u) == 0x7f80u)
		return 1;
	memcpy(sc, &s16, 2);
	tq_pack_planes(idx, h, bits, planes);
	return 0;
}

/* tq3o / tq4o (LA, LB: the halves' levels); 1: the reference takes the
 * vector (non-finite input, overflow, or halves that are not a power of
 * two: a dense rotation) */
AI int enc_tqo_L(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk, const int LA, const int LB)
{
	const tq_codec *c = e->c;
	const int h = c->half;
	float x[TQ_DIM_MAX] __attribute__((aligned(16)));
	uint8_t b[TQ_TQO_BLOCK_BYTES(TQ_DIM_MAX, 7)];

	if (c->rot.kind != TQ_ROT_HADAMARD || c->rot_b.kind != TQ_ROT_HADAMARD || h < 8)
		return 1;
	/* a NaN / Inf shows in a half's sum of squares: the reference then
	 * takes the vector and says which element */
	conv_row(e, row, dt, x);
	if (enc_tqo_half(&c->rot, &e->ho[0], c->cb.bits, x, h, b, b + TQ_TQO_HEADER_BYTES, LA) ||
	    enc_tqo_half(&c->rot_b, &e->ho[1], c->cb_b.bits, x + h, h, b + 2,
			 b + TQ_TQO_HEADER_BYTES + TQ_PLANES_BYTES(h, c->cb.bits), LB))
		return 1;
	memcpy(blk, b, e->bb); /* only a whole block: a vector that fails writes nothing */
	return 0;
}

static int enc_tqo(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	if (e->c->cb.levels == 32)
		return enc_tqo_L(e, row, dt, blk, 32, 8); /* tq4o */
	return enc_tqo_L(e, row, dt, blk, 16, 4);         /* tq3o */
}

AI int dec_tq_L(const struct ctx *e, const uint8_t *blk, float *x, const int L)
{
	const struct tq_rotation *r = &e->c->rot;
	float v[TQ_DIM_MAX] __attribute__((aligned(16)));
	uint8_t idx[TQ_DIM_MAX];
	float scale, t[16];
	struct ftab ft;

	memcpy(&scale, blk, 4);
	if (!finite_f(scale))
		return 1;
	const float f = r->kind == TQ_ROT_HADAMARD ? scale * e->isd : scale;
	for (int k = 0; k < 16; k++)
		t[k] = e->ct[k] * f;
	ftab_init(&ft, t);
	unpack_gen(blk + TQ_TQ_HEADER_BYTES, e->d, e->bits, idx);
	int k = 0;
	for (; k + 16 <= e->d; k += 16) {
		float32x4_t o[4];
		lut16b(&ft, vld1q_u8(idx + k), o, L);
		vst1q_f32(v + k, o[0]);
		vst1q_f32(v + k + 4, o[1]);
		vst1q_f32(v + k + 8, o[2]);
		vst1q_f32(v + k + 12, o[3]);
	}
	for (; k < e->d; k += 4) {
		uint32_t q[4] = { idx[k], idx[k + 1], idx[k + 2], idx[k + 3] };
		vst1q_f32(v + k, lut(&ft, vld1q_u32(q), L));
	}
	unrotate_mem(e, v, x);
	return 0;
}

static int dec_tq(const struct ctx *e, const uint8_t *blk, float *x)
{
	switch (e->levels) {
	case 4: return dec_tq_L(e, blk, x, 4);
	case 8: return dec_tq_L(e, blk, x, 8);
	default: return dec_tq_L(e, blk, x, 16);
	}
}

/* 16 index bytes (each < L, L up to 32) to 4 vectors of t[idx]: lo holds
 * entries 0..15, hi 16..31; a tbl index past a table gives zero bytes, so
 * the two lookups' bytes or'ed are the entry's (an add would turn -0 into
 * +0). */
AI void lut32b(const struct ftab *lo, const struct ftab *hi, uint8x16_t idx, float32x4_t out[4], const int L)
{
	if (L <= 16) {
		lut16b(lo, idx, out, L);
		return;
	}
	const uint8x16_t inc = vreinterpretq_u8_u32(vdupq_n_u32(0x03020100u));
	const uint8x16_t i4 = vshlq_n_u8(idx, 2); /* < 128 */

	_Pragma("GCC unroll 4")
	for (int k = 0; k < 4; k++) {
		const uint8x16_t bi = vaddq_u8(vqtbl1q_u8(i4, vld1q_u8(rep[k])), inc);
		out[k] = vreinterpretq_f32_u8(vorrq_u8(vqtbl4q_u8(lo->t, bi),
						       vqtbl4q_u8(hi->t, vsubq_u8(bi, vdupq_n_u8(64)))));
	}
}

/* One half of a tq3o / tq4o block (h a power of two >= 16, L levels): x =
 * R^T (scale * c[idx]) in the reference's order — each centroid times
 * scale / sqrt(h), the butterflies, the signs. */
AI void dec_tqo_half(const struct tq_rotation *r, const tq_codebook *cb, const uint8_t *planes, float scale,
		     const int h, float *x, const int L)
{
	float v[TQ_DIM_MAX / 2] __attribute__((aligned(16)));
	float t[32] = { 0 };
	struct ftab ft[2];
	const int bits = __builtin_ctz((unsigned)L);
	const float fs = scale * r->inv_sqrt_dim;

	for (int k = 0; k < L; k++)
		t[k] = cb->centroid[k] * fs;
	ftab_init(&ft[0], t);
	ftab_init(&ft[1], t + 16);
	_Pragma("GCC unroll 16")
	for (int k = 0; k < h; k += 16) {
		float32x4_t o[4];
		lut32b(&ft[0], &ft[1], tq_neon_unpack16(planes, h, bits, k), o, L);
		for (int i = 0; i < 4; i++)
			vst1q_f32(v + k + 4 * i, o[i]);
	}
	fwht_mem(v, h);
	for (int k = 0; k < h; k += 4)
		vst1q_f32(x + k, vmulq_f32(vld1q_f32(v + k), vld1q_f32(r->sign + k)));
}

AI void dec_tqo_halves(const tq_codec *c, const uint8_t *pa, float sa, float sb, const int h, float *x,
		       const int LA, const int LB)
{
	dec_tqo_half(&c->rot, &c->cb, pa, sa, h, x, LA);
	dec_tqo_half(&c->rot_b, &c->cb_b, pa + TQ_PLANES_BYTES(h, __builtin_ctz((unsigned)LA)), sb, h, x + h, LB);
}

/* tq3o / tq4o; 1: the reference takes the vector (a non-finite scale, or
 * halves this path does not rotate) */
static int dec_tqo(const struct ctx *e, const uint8_t *blk, float *x)
{
	const tq_codec *c = e->c;
	const int h = c->half;
	const uint8_t *pa = blk + TQ_TQO_HEADER_BYTES;
	float sa, sb;

	if (!tq_tqo_dec_scales(c, blk, 16, &sa, &sb))
		return 1;
	const int o4 = c->cb.levels == 32;
	/* d = 128 specialized (the hot shape) */
	if (h == 64)
		o4 ? dec_tqo_halves(c, pa, sa, sb, 64, x, 32, 8) : dec_tqo_halves(c, pa, sa, sb, 64, x, 16, 4);
	else
		o4 ? dec_tqo_halves(c, pa, sa, sb, h, x, 32, 8) : dec_tqo_halves(c, pa, sa, sb, h, x, 16, 4);
	return 0;
}

static int enc_q8(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	const struct tq_rotation *r = &e->c->rot;
	float xb[TQ_DIM_MAX] __attribute__((aligned(16))), y[TQ_DIM_MAX] __attribute__((aligned(16)));
	uint32x4_t amx = vdupq_n_u32(0);

	conv_row(e, row, dt, xb);
	rotate_mem(e, xb, y);
	const float32x4_t f = vdupq_n_f32(1.0f * e->isd);
	for (int k = 0; k < e->nc; k++) {
		float32x4_t v = vld1q_f32(y + 4 * k);
		if (r->kind == TQ_ROT_HADAMARD) {
			v = vmulq_f32(v, f);
			vst1q_f32(y + 4 * k, v);
		}
		amx = absbits_max(amx, v);
	}
	float amax, inv1;
	switch (tq_q8_plan(vmaxvq_u32(amx), &amax, &inv1)) {
	case TQ_Q8_REF:
		return 1;
	case TQ_Q8_ZERO:
		memset(blk, 0, e->bb);
		return 0;
	case TQ_Q8_OK:
		break;
	}
	const float32x4_t inv = vdupq_n_f32(inv1);
	const int32x4_t lo = vdupq_n_s32(-127), hi = vdupq_n_s32(127);
	int8_t *out = (int8_t *)(blk + TQ_Q8_HEADER_BYTES);
	for (int k = 0; k < e->nc; k += 2) {
		/* vcvtn: round to nearest, ties to even, as rintf */
		int32x4_t a = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(y + 4 * k), inv));
		int32x4_t b = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(y + 4 * k + 4), inv));
		a = vminq_s32(vmaxq_s32(a, lo), hi);
		b = vminq_s32(vmaxq_s32(b, lo), hi);
		vst1_s8(out + 4 * k, vmovn_s16(vcombine_s16(vmovn_s32(a), vmovn_s32(b))));
	}
	float scale = amax / 127.0f;
	memcpy(blk, &scale, 4);
	return 0;
}

static int dec_q8(const struct ctx *e, const uint8_t *blk, float *x)
{
	const struct tq_rotation *r = &e->c->rot;
	const int8_t *in = (const int8_t *)(blk + TQ_Q8_HEADER_BYTES);
	float v[TQ_DIM_MAX] __attribute__((aligned(16)));
	float scale;

	memcpy(&scale, blk, 4);
	if (!finite_f(scale))
		return 1;
	const float32x4_t f = vdupq_n_f32(r->kind == TQ_ROT_HADAMARD ? scale * e->isd : scale);
	for (int k = 0; k < e->d; k += 8) {
		int16x8_t w = vmovl_s8(vld1_s8(in + k));
		float32x4_t a = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
		float32x4_t b = vcvtq_f32_s32(vmovl_s16(vget_high_s16(w)));
		vst1q_f32(v + k, vmulq_f32(a, f));
		vst1q_f32(v + k + 4, vmulq_f32(b, f));
	}
	unrotate_mem(e, v, x);
	return 0;
}

static int enc_q4a(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	float xb[TQ_DIM_MAX] __attribute__((aligned(16)));
	uint8_t q[TQ_DIM_MAX + 8];
	uint32x4_t amx = vdupq_n_u32(0);

	conv_row(e, row, dt, xb);
	float32x4_t vmin = vld1q_f32(xb), vmax = vmin;
	for (int k = 0; k < e->nc; k++) {
		float32x4_t v = vld1q_f32(xb + 4 * k);
		vmin = vminq_f32(vmin, v);
		vmax = vmaxq_f32(vmax, v);
		amx = absbits_max(amx, v);
	}
	if (vmaxvq_u32(amx) >= 0x7f800000u)
		return 1;
	float mn = vminvq_f32(vmin), mx = vmaxvq_f32(vmax);
	/* a zero extreme: which of ±0 the reference keeps depends on the order
	 * of its compares, which a lane-parallel min does not reproduce */
	if (mn == 0.0f || mx == 0.0f)
		return 1;
	float range = mx - mn;
	uint16_t sh = tq_f32_to_f16(range / 15.0f), mh = tq_f32_to_f16(mn);
	if (!finite_f(range) || (sh & 0x7c00u) == 0x7c00u || (mh & 0x7c00u) == 0x7c00u)
		return 1;
	float s = tq_f16_to_f32(sh), mf = tq_f16_to_f32(mh);
	float inv = s > 0.0f ? 1.0f / s : 0.0f;
	const float32x4_t vm = vdupq_n_f32(mf), vi = vdupq_n_f32(inv);
	const float32x4_t zero = vdupq_n_f32(0.0f), fifteen = vdupq_n_f32(15.0f);
	for (int k = 0; k < e->nc; k += 2) {
		float32x4_t a = vmulq_f32(vsubq_f32(vld1q_f32(xb + 4 * k), vm), vi);
		float32x4_t b = vmulq_f32(vsubq_f32(vld1q_f32(xb + 4 * k + 4), vm), vi);
		/* clamping before rounding = clamping after (rint is monotone) */
		a = vminq_f32(vmaxq_f32(a, zero), fifteen);
		b = vminq_f32(vmaxq_f32(b, zero), fifteen);
		st_idx8(q + 4 * k, vcvtnq_u32_f32(a), vcvtnq_u32_f32(b));
	}
	memcpy(blk, &sh, 2);
	memcpy(blk + 2, &mh, 2);
	pack_gen(q, e->d, 4, blk + TQ_Q4A_HEADER_BYTES);
	return 0;
}

static int dec_q4a(const struct ctx *e, const uint8_t *blk, float *x)
{
	uint8_t q[TQ_DIM_MAX];
	uint16_t sh, mh;

	memcpy(&sh, blk, 2);
	memcpy(&mh, blk + 2, 2);
	if ((sh & 0x7c00u) == 0x7c00u || (mh & 0x7c00u) == 0x7c00u)
		return 1;
	const float32x4_t vs = vdupq_n_f32(tq_f16_to_f32(sh)), vm = vdupq_n_f32(tq_f16_to_f32(mh));
	unpack_gen(blk + TQ_Q4A_HEADER_BYTES, e->d, 4, q);
	for (int k = 0; k < e->d; k += 8) {
		uint16x8_t w = vmovl_u8(vld1_u8(q + k));
		float32x4_t a = vcvtq_f32_u32(vmovl_u16(vget_low_u16(w)));
		float32x4_t b = vcvtq_f32_u32(vmovl_u16(vget_high_u16(w)));
		/* t = s * q, then min + t: two roundings, as the reference */
		vst1q_f32(x + k, vaddq_f32(vm, vmulq_f32(vs, a)));
		vst1q_f32(x + k + 4, vaddq_f32(vm, vmulq_f32(vs, b)));
	}
	return 0;
}

static int enc_f16(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	uint16_t h[TQ_DIM_MAX];
	uint16x4_t mx = vdup_n_u16(0);

	for (int k = 0; k < e->nc; k++) {
		/* FCVTN rounds to nearest even (FPCR default), overflow to Inf */
		uint16x4_t v = vreinterpret_u16_f16(vcvt_f16_f32(ld4(row, dt, k)));
		mx = vmax_u16(mx, vand_u16(v, vdup_n_u16(0x7fff)));
		vst1_u16(h + 4 * k, v);
	}
	/* a lane >= 0x7c00: Inf or NaN came out (beyond range, or bad input) */
	if (vmaxv_u16(mx) >= 0x7c00u)
		return 1;
	memcpy(blk, h, e->bb);
	return 0;
}

/* The row is read once: the values checked are the values stored, even
 * when another process rewrites it meanwhile (a client's shared arena). */
static int enc_f32(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk)
{
	float x[TQ_DIM_MAX];
	uint32x4_t amx = vdupq_n_u32(0);

	for (int k = 0; k < e->nc; k++) {
		float32x4_t v = ld4(row, dt, k);
		amx = absbits_max(amx, v);
		vst1q_f32(x + 4 * k, v);
	}
	if (vmaxvq_u32(amx) >= 0x7f800000u)
		return 1;
	memcpy(blk, x, e->bb);
	return 0;
}

static int dec_f16(const struct ctx *e, const uint8_t *blk, float *x)
{
	for (int k = 0; k < e->nc; k++) {
		uint16x4_t h = vld1_u16((const uint16_t *)(const void *)(blk + 8 * k));
		float32x4_t f = vcvt_f32_f16(vreinterpret_f16_u16(h));
		uint32x4_t num = vceqq_f32(f, f);
		if (vminvq_u32(num) == 0) {
			/* the reference keeps a NaN's payload as it is (no quieting) */
			uint32x4_t w = vmovl_u16(h);
			uint32x4_t b = vorrq_u32(vorrq_u32(vshlq_n_u32(vandq_u32(w, vdupq_n_u32(0x8000)), 16),
							   vdupq_n_u32(0x7f800000u)),
						 vshlq_n_u32(vandq_u32(w, vdupq_n_u32(0x3ff)), 13));
			f = vbslq_f32(num, f, vreinterpretq_f32_u32(b));
		}
		vst1q_f32(x + 4 * k, f);
	}
	return 0;
}

/* ---- batch drivers ------------------------------------------------------------------- */

typedef int (*enc_fn)(const struct ctx *e, const void *row, enum tq_dtype dt, uint8_t *blk);
typedef int (*dec_fn)(const struct ctx *e, const uint8_t *blk, float *x);

static int neon_encode(const tq_codec *c, const void *src, enum tq_dtype dt, size_t n, void *dst,
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
		if (fn(&e, s, dt, out)) {
			int r = tq_encode_ref_row(c, s, dt, v, out, err);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

static int neon_decode(const tq_codec *c, const void *src, size_t n, float *dst)
{
	struct ctx e;
	dec_fn fn;
	const uint8_t *s = src;

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
		if (fn(&e, s, dst))
			tq_decode_ref(c, s, 1, dst);
	return 0;
}

static const struct tq_codec_ops ops_neon = {
	.isa = TQ_ISA_NEON,
	.encode = neon_encode,
	.decode = neon_decode,
};

const struct tq_codec_ops *tq_codec_ops_neon(void)
{
	return &ops_neon;
}

#else /* not aarch64: the other paths serve */

const struct tq_codec_ops *tq_codec_ops_neon(void)
{
	return NULL;
}

#endif
