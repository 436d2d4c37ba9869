/* tq_internal.h — what kernels/ files (and their tests) share; not installed.
 *
 * Bit-exactness contract between the scalar reference and the SIMD paths.
 * Every path computes the same float operations in the same order, so the
 * encoded blocks and decoded vectors are bit-identical:
 *   - sums of squares (||x||, ||c[idx]||) accumulate in 16 lanes (lane =
 *     i mod 16) with a separate multiply and add (no FMA), then the lanes
 *     reduce pairwise: l[i] += l[i+8], then +4, +2, +1  (tq_sumsq16);
 *   - the Walsh–Hadamard transform runs the standard butterflies
 *     (h = 1, 2, 4, …; a+b, a-b), which any vectorization reproduces exactly;
 *   - the dense rotation y = R x accumulates y_i over j = 0..dim-1 in order,
 *     multiply then add (no FMA);
 *   - scalar factors are computed once in float, in the order written in the
 *     reference, and then applied with one multiply per element.
 * SIMD code may use FMA only where an operand is exactly ±1 or 0 (then the
 * fused and unfused results agree), or where the result only selects a
 * candidate that an exact comparison then confirms (the AVX-512 grid
 * quantizer picks a cell with an FMA; the index comes from comparing u
 * with the cell's bound exactly).
 */
#ifndef TQ_INTERNAL_H
#define TQ_INTERNAL_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tq_codec.h"

enum tq_rot_kind { TQ_ROT_NONE = 0, TQ_ROT_HADAMARD = 1, TQ_ROT_DENSE = 2 };

/* y = R x with
 *   HADAMARD: R = (1/sqrt(dim)) H D,  D = diag(sign), H the Sylvester Hadamard
 *   DENSE:    R a Haar-random orthogonal matrix (QR of a Gaussian, sign-fixed) */
struct tq_rotation {
	int dim;
	enum tq_rot_kind kind;
	uint64_t seed;
	float inv_sqrt_dim;      /* HADAMARD: 1/sqrt(dim) as a float            */
	float *sign;             /* HADAMARD: [dim] of +1.0f / -1.0f             */
	uint32_t *sign_bits;     /* HADAMARD: [dim] 0 or 0x80000000 (xor masks)  */
	float *mat;              /* DENSE: [dim][dim] row-major, R[i][j]         */
	float *mat_t;            /* DENSE: [dim][dim] R transposed (column axpy) */
};

int tq_rotation_init(struct tq_rotation *r, int dim, uint64_t seed, tq_error *err);
void tq_rotation_destroy(struct tq_rotation *r);
/* Reference transforms; x and y may alias. */
void tq_rotation_apply_ref(const struct tq_rotation *r, const float *x, float *y);
void tq_rotation_inverse_ref(const struct tq_rotation *r, const float *y, float *x);
/* In-place unnormalized Walsh–Hadamard transform of n (power of two) floats. */
void tq_fwht_ref(float *v, int n);
/* The same butterflies in the same stages, so the same bits (each element's
 * sums do not depend on the order of a stage's independent butterflies),
 * written for the compiler's vectorizer: the first two stages on quads,
 * the rest four butterflies at a time.  And the rotations on it (tq_rotate,
 * tq_unrotate: the CPU attention's query rows and output rows).  The dense
 * rotation is the reference's.  test_codec compares them bit for bit. */
void tq_fwht(float *v, int n);
void tq_rotation_apply(const struct tq_rotation *r, const float *x, float *y);
void tq_rotation_inverse(const struct tq_rotation *r, const float *y, float *x);

/* Pack / unpack index planes (tq_layout.h).  idx: [dim] values < 2^bits. */
void tq_pack_planes(const uint8_t *idx, int dim, int bits, uint8_t *out);
void tq_unpack_planes(const uint8_t *in, int dim, int bits, uint8_t *idx);

/* Sum of squares in the 16-lane order of the contract above. */
float tq_sumsq16(const float *x, int n);

/* Index of v in a codebook: the number of bounds strictly below v. */
static inline int tq_cb_index(const tq_codebook *cb, float v)
{
	int lo = 0, step = cb->levels >> 1;
	/* binary search over the sorted bounds; equals a linear count */
	while (step > 0) {
		if (v > cb->bound[lo + step - 1])
			lo += step;
		step >>= 1;
	}
	return lo;
}

/* q8's plan for a vector from max|y_j| (the float's bits, as SIMD paths
 * reduce them with an unsigned max over |y| bits):
 *   TQ_Q8_REF   a NaN/Inf in y, or a subnormal max (127 / max overflows):
 *               SIMD paths hand the vector to the reference encoder;
 *   TQ_Q8_ZERO  y is all zeros: the block is all zeros;
 *   TQ_Q8_OK    *amax = max|y|, *inv = 127 / max (the reference's factors). */
enum tq_q8_plan { TQ_Q8_OK = 0, TQ_Q8_ZERO = 1, TQ_Q8_REF = 2 };
static inline enum tq_q8_plan tq_q8_plan(uint32_t amax_bits, float *amax, float *inv)
{
	if (amax_bits >= 0x7f800000u)
		return TQ_Q8_REF;
	memcpy(amax, &amax_bits, 4);
	if (*amax == 0.0f)
		return TQ_Q8_ZERO;
	*inv = 127.0f / *amax;
	return *inv <= 3.4028234663852886e38f ? TQ_Q8_OK : TQ_Q8_REF;
}

/* One ISA's implementation of the batch calls.  src rows are converted to
 * fp32 first; `conv` is scratch of [dim] floats owned by the caller. */
struct tq_codec_ops {
	enum tq_isa isa;
	/* Optional: build the path's per-codec tables once, in tq_codec_new
	 * (returns malloc'ed memory, freed with the codec, or NULL on ENOMEM).
	 * encode/decode then find them in c->isa_ctx. */
	void *(*prepare)(const tq_codec *c);
	int (*encode)(const tq_codec *c, const void *src, enum tq_dtype dtype, size_t n,
		      void *dst, tq_error *err);
	int (*decode)(const tq_codec *c, const void *src, size_t n, float *dst);
};

struct tq_codec {
	enum tq_codec_id id;
	int dim;
	int bits;                /* index bits for tq*, 8 for q8, 4 for q4a     */
	uint32_t block_bytes;
	uint64_t seed;
	struct tq_rotation rot;  /* kind NONE for q4a / f16 / f32; tq*o: the    */
				 /* first half's (dim/2)                        */
	tq_codebook cb;          /* tq* only; tq*o: the first half's (bits + 1) */
	int half;                /* tq*o: dim/2; 0 for every other codec        */
	struct tq_rotation rot_b; /* tq*o: the second half's rotation           */
	tq_codebook cb_b;        /* tq*o: the second half's codebook (bits - 1) */
	const struct tq_codec_ops *ops;
	void *isa_ctx;           /* ops->prepare's tables, read-only afterwards */
};

extern const struct tq_codec_ops tq_codec_ops_scalar;

/* A tq3o / tq4o block's two bf16 scales as floats, or 0 when a SIMD
 * decoder must hand the block to the reference: a half that is not a
 * power of two of at least min_h values (a dense rotation), or a scale
 * that is Inf or NaN (the reference's arithmetic then decides the bits). */
static inline int tq_tqo_dec_scales(const tq_codec *c, const uint8_t *blk, int min_h, float *sa, float *sb)
{
	uint16_t ha, hb;

	memcpy(&ha, blk, 2);
	memcpy(&hb, blk + 2, 2);
	if (c->rot.kind != TQ_ROT_HADAMARD || c->rot_b.kind != TQ_ROT_HADAMARD || c->half < min_h ||
	    (ha & 0x7f80u) == 0x7f80u || (hb & 0x7f80u) == 0x7f80u)
		return 0;
	*sa = tq_bf16_to_f32(ha);
	*sb = tq_bf16_to_f32(hb);
	return 1;
}
/* The reference encoder for one row, reported as vector v of a batch (the
 * SIMD paths hand it the vectors they do not take: non-finite values,
 * overflow, subnormal extremes).  Writes out only on success. */
int tq_encode_ref_row(const tq_codec *c, const void *row, enum tq_dtype dtype, size_t v,
		      uint8_t *out, tq_error *err);
/* NULL when this build has no such path (AVX2/AVX-512 off x86-64, NEON off
 * aarch64). */
const struct tq_codec_ops *tq_codec_ops_avx2(void);
const struct tq_codec_ops *tq_codec_ops_avx512(void);
const struct tq_codec_ops *tq_codec_ops_neon(void);

/* Convert one row of `dtype` to fp32 and check it: 0, or -EINVAL with the
 * element index in *bad when a value is NaN or Inf. */
int tq_row_to_f32(const void *src, enum tq_dtype dtype, int dim, float *dst, int *bad);

__attribute__((format(printf, 2, 3)))
static inline int tq_fail(tq_error *err, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* Deterministic double-precision log/exp from + - * / only (no libm), so
 * codebooks and rotations come out the same on every machine. */
double tq_det_log(double x);
double tq_det_exp(double x);

/* xoshiro256** seeded through splitmix64: the one PRNG of kernels/. */
struct tq_rng { uint64_t s[4]; };
void tq_rng_seed(struct tq_rng *r, uint64_t seed);
uint64_t tq_rng_next(struct tq_rng *r);
double tq_rng_uniform(struct tq_rng *r);   /* [0, 1), 53 bits */
double tq_rng_gauss(struct tq_rng *r);     /* N(0,1), Marsaglia polar with tq_det_log */

#endif /* TQ_INTERNAL_H */
