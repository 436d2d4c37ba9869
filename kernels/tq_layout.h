/* tq_layout.h — every block layout of the codecs, defined once.
 *
 * Compiled by C (kernels, daemon, client, tests) and by CUDA (the .cu files in kernels/):
 * keep it free of anything but fixed-width types, macros and static_asserts.
 *
 * One block = one head vector of `dim` values (one token, one KV head).
 * Fields are little-endian and blocks are packed back to back with no
 * padding, so a field may be unaligned: read it with memcpy (C) or byte
 * loads (CUDA).  At dim = 128 every block size is a multiple of 4.
 *
 * Supported head dims: multiples of 8 from 8 to 512 (TQ_DIM_*).
 */
#ifndef TQ_LAYOUT_H
#define TQ_LAYOUT_H

#include <stdint.h>
#ifndef __cplusplus
#include <assert.h> /* static_assert */
#endif

#define TQ_DIM_MIN   8
#define TQ_DIM_MAX   512
#define TQ_DIM_ALIGN 8   /* a 1-bit plane of dim values fills whole bytes */
#define TQ_BITS_MAX  8   /* codebook / packing widths 1..8 */

/* Codec ids: an append-only enum.  Never renumber; the value is stored in
 * session records and spill files. */
enum tq_codec_id {
	TQ_CODEC_F16 = 0, /* uncompressed fp16                                 */
	TQ_CODEC_Q8  = 1, /* rotated, per-vector absmax scale + int8           */
	TQ_CODEC_Q4A = 2, /* per-vector affine 4-bit, no rotation (q4_1-like)  */
	TQ_CODEC_TQ2 = 3, /* TurboQuant 2-bit: rotation + Lloyd–Max codebook   */
	TQ_CODEC_TQ3 = 4, /* TurboQuant 3-bit                                  */
	TQ_CODEC_TQ4 = 5, /* TurboQuant 4-bit                                  */
	TQ_CODEC_F32 = 6, /* uncompressed fp32: the exact reference cache      */
	TQ_CODEC_TQ3O = 7, /* TurboQuant 3-bit, outlier half at 4 bits, rest 2 */
	TQ_CODEC_TQ4O = 8, /* TurboQuant 4-bit, outlier half at 5 bits, rest 3 */
	TQ_CODEC__COUNT
};

/* ---- bit planes -------------------------------------------------------------
 * A B-bit index (1 <= B <= 8) is split into planes of width 8, 4, 2 or 1 — the
 * binary decomposition of B, widest plane first, and the widest plane holds
 * the lowest bits of the index:
 *
 *   B:      1    2    3      4    5      6      7        8
 *   planes  [1]  [2]  [2,1]  [4]  [4,1]  [4,2]  [4,2,1]  [8]
 *
 * A plane of width w over dim values takes dim*w/8 bytes.  With k = 8/w
 * values per byte and S = dim/k the plane's stride, byte j (0 <= j < S)
 * holds value j + s*S at bits [s*w, s*w+w) for s = 0..k-1.  So a run of
 * consecutive values comes out of consecutive bytes with one shift and one
 * mask — e.g. 4 bits: byte j = idx[j] | idx[j + dim/2] << 4.  Planes follow
 * each other in the order above; unused bits do not exist (dim % 8 == 0).
 */
#define TQ_PLANES_BYTES(dim, bits) ((uint32_t)(dim) * (uint32_t)(bits) / 8u)

/* ---- tq2 / tq3 / tq4 (and any TurboQuant width B) ---------------------------
 *   offset 0: float32 scale = ||x|| / ||c[idx]||   (norm correction: the
 *             decoded vector R^T (scale * c[idx]) has the norm of x)
 *   offset 4: index planes, TQ_PLANES_BYTES(dim, B) bytes
 * c[] is the Lloyd–Max codebook of the unit-sphere marginal for (dim, B),
 * sorted ascending and symmetric (c[i] = -c[2^B-1-i]); idx_j = the number of
 * decision boundaries strictly below coordinate j of R x / ||x||. */
#define TQ_TQ_HEADER_BYTES 4u
#define TQ_TQ_BLOCK_BYTES(dim, bits) (TQ_TQ_HEADER_BYTES + TQ_PLANES_BYTES(dim, bits))

/* ---- tq3o / tq4o: outlier channels at more bits ----------------------------
 * The vector is two TurboQuant vectors of dim/2: its first half (the
 * channels a transform put first — tq_xform.h's K order puts the keys'
 * loudest channels there) at B + 1 bits and its second half at B - 1
 * (B = 3 for tq3o, 4 for tq4o), each with its own rotation (seeds
 * tq_codec.h says), its own codebook (the unit-sphere marginal for dim/2)
 * and its own norm correction:
 *   offset 0: bf16 scale of the first half  = ||x_a|| / ||c_a[idx_a]||
 *   offset 2: bf16 scale of the second half = ||x_b|| / ||c_b[idx_b]||
 *             (rounded to nearest even: fp32's range, so the vectors tq3 /
 *             tq4 take are taken; a relative error of at most 2^-9 on the
 *             norm, against a direction error of 5-10 % from the indices)
 *   offset 4: the first half's index planes,  TQ_PLANES_BYTES(dim/2, B+1)
 *   then:     the second half's index planes, TQ_PLANES_BYTES(dim/2, B-1)
 * Exactly the bytes of tqB (dim a multiple of 16, so each half's planes
 * fill whole bytes).  The paper's outlier configurations (2.5 and 3.5 bits)
 * split channels the same way, with other proportions. */
#define TQ_TQO_HEADER_BYTES 4u
#define TQ_TQO_BLOCK_BYTES(dim, bits) \
	(TQ_TQO_HEADER_BYTES + TQ_PLANES_BYTES((dim) / 2u, (bits) + 1u) + TQ_PLANES_BYTES((dim) / 2u, (bits) - 1u))
#define TQ_TQO_DIM_ALIGN 16

/* ---- q8 -----------------------------------------------------------------------
 *   offset 0: float32 scale = max_j |y_j| / 127, y = R x
 *   offset 4: int8 q[dim], q_j = rint(y_j * (127 / max|y|)), in [-127, 127]
 * decode: x = R^T (scale * q) */
#define TQ_Q8_HEADER_BYTES 4u
#define TQ_Q8_BLOCK_BYTES(dim) (TQ_Q8_HEADER_BYTES + (uint32_t)(dim))

/* ---- q4a (per-vector affine 4-bit, no rotation) -----------------------------
 *   offset 0: fp16 scale = (max - min) / 15   (rounded to fp16)
 *   offset 2: fp16 min                         (rounded to fp16)
 *   offset 4: 4-bit plane (byte j = q[j] | q[j + dim/2] << 4),
 *             q_j = clamp(rint((x_j - min) / scale), 0, 15) using the
 *             fp16-rounded scale and min
 * decode: x_j = min + scale * q_j.  Same bytes as tq4: 68 at dim = 128. */
#define TQ_Q4A_HEADER_BYTES 4u
#define TQ_Q4A_BLOCK_BYTES(dim) (TQ_Q4A_HEADER_BYTES + TQ_PLANES_BYTES(dim, 4))

/* ---- f16 / f32 ----------------------------------------------------------------
 *   fp16[dim] (round to nearest even; |x| > 65504 is rejected, not saturated)
 *   fp32[dim] */
#define TQ_F16_BLOCK_BYTES(dim) (2u * (uint32_t)(dim))
#define TQ_F32_BLOCK_BYTES(dim) (4u * (uint32_t)(dim))

/* C11 (assert.h) and C++ (the keyword, for the .cu files) alike */
static_assert(TQ_TQ_BLOCK_BYTES(128, 2) == 36, "tq2 block at d=128");
static_assert(TQ_TQ_BLOCK_BYTES(128, 3) == 52, "tq3 block at d=128");
static_assert(TQ_TQ_BLOCK_BYTES(128, 4) == 68, "tq4 block at d=128");
static_assert(TQ_Q8_BLOCK_BYTES(128) == 132, "q8 block at d=128");
static_assert(TQ_Q4A_BLOCK_BYTES(128) == 68, "q4a block at d=128");
static_assert(TQ_F16_BLOCK_BYTES(128) == 256, "f16 block at d=128");
static_assert(TQ_F32_BLOCK_BYTES(128) == 512, "f32 block at d=128");
static_assert(TQ_TQ_BLOCK_BYTES(TQ_DIM_MIN, 1) == 5, "1-bit plane at the smallest dim is one byte");
static_assert(TQ_TQ_BLOCK_BYTES(TQ_DIM_MAX, 8) == 516, "8-bit planes at the largest dim");
static_assert(TQ_DIM_MIN % TQ_DIM_ALIGN == 0 && TQ_DIM_MAX % TQ_DIM_ALIGN == 0, "dim bounds");
static_assert(TQ_TQO_BLOCK_BYTES(128, 4) == TQ_TQ_BLOCK_BYTES(128, 4), "tq4o: the bytes of tq4");
static_assert(TQ_TQO_BLOCK_BYTES(64, 3) == TQ_TQ_BLOCK_BYTES(64, 3), "tq3o: the bytes of tq3");
static_assert(TQ_CODEC__COUNT == 9, "codec ids are append-only");

#endif /* TQ_LAYOUT_H */
