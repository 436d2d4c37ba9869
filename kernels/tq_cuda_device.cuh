/* tq_cuda_device.cuh — device helpers both kernel files use (tq_cuda_encode.cu,
 * tq_cuda_attn.cu), defined once.  Included by .cu files only (and by
 * tests/simt/, which compiles them as C++ with its own intrinsics).  The
 * layout facts the kernels rely on are static_asserted by tq_layout.h and
 * tq_page.h for C++ as for C; what the kernels assume beyond them is
 * asserted here. */
#ifndef TQ_CUDA_DEVICE_CUH
#define TQ_CUDA_DEVICE_CUH

#include <stdint.h>

#include "tq_cuda_internal.h"
#include "tq_layout.h"
#include "tq_page.h"

static_assert(TQ_TQ_HEADER_BYTES == 4 && TQ_Q8_HEADER_BYTES == 4 && TQ_Q4A_HEADER_BYTES == 4, "headers");
static_assert(TQ_PAGE_ALIGN == 64u, "page alignment: f16 / f32 payload loads are aligned");
static_assert(TQ_F16_BLOCK_BYTES(TQ_DIM_ALIGN) % 4 == 0 && TQ_F32_BLOCK_BYTES(TQ_DIM_ALIGN) % 4 == 0,
	      "f16 / f32 blocks keep 4-byte alignment");
static_assert(TQ_DIM_MAX == 512 && TQ_DIM_MIN == 8 && TQ_DIM_ALIGN == 8, "head dims");
static_assert(TQ_CODEC_F16 == 0 && TQ_CODEC_Q8 == 1 && TQ_CODEC_Q4A == 2 && TQ_CODEC_TQ2 == 3 &&
	      TQ_CODEC_TQ3 == 4 && TQ_CODEC_TQ4 == 5 && TQ_CODEC_F32 == 6 && TQ_CODEC_TQ3O == 7 &&
	      TQ_CODEC_TQ4O == 8, "codec ids");
static_assert(TQ_TQO_HEADER_BYTES == 4, "tq*o: two bf16 scales");

#define FULL 0xffffffffu
/* enum tq_rot_kind and enum tq_dtype (tq_internal.h, tq_codec.h: C headers
 * the .cu files do not include) */
#define ROT_HADAMARD 1
#define ROT_DENSE 2
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2

/* tq_f16_to_f32 (exact). */
static __device__ __forceinline__ float f16_to_f32(uint32_t h)
{
	uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;

	if (exp == 0x1f)
		bits = sign | 0x7f800000u | (man << 13);
	else if (exp == 0) /* zero or subnormal: man * 2^-24, exact in float */
		bits = __float_as_uint(__fmul_rn(__uint2float_rn(man), 0x1.0p-24f)) | sign;
	else
		bits = sign | ((exp + 112u) << 23) | (man << 13);
	return __uint_as_float(bits);
}

/* tq_f32_to_f16: round to nearest even; overflow -> inf, NaN -> quiet NaN. */
static __device__ __forceinline__ uint32_t f32_to_f16(float f)
{
	uint32_t x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu,
		 man = x & 0x7fffffu;

	if (exp == 0xff)
		return sign | 0x7c00u | (man ? 0x200u : 0u);
	int e = (int)exp - 127 + 15;
	if (e >= 0x1f)
		return sign | 0x7c00u;
	if (e <= 0) {
		if (e < -10)
			return sign;
		uint32_t m = man | 0x800000u;
		int shift = 14 - e;   /* 14 .. 24 */
		uint32_t half = m >> shift, rem = m & ((1u << shift) - 1u), mid = 1u << (shift - 1);
		if (rem > mid || (rem == mid && (half & 1u)))
			half++;
		return sign | half;
	}
	uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (half & 1u)))
		half++; /* may carry into the exponent, up to inf: as the reference */
	return half;
}

/* +1 or -1: the Hadamard sign of coordinate c. */
static __device__ __forceinline__ float sign_of(const struct tqc_codec_desc &cd, int c)
{
	return (cd.sign_mask[c >> 5] >> (c & 31)) & 1u ? -1.0f : 1.0f;
}

/* tq_fwht_ref in place on this warp's shared row: stage h pairs (j, j + h)
 * for every j with bit h clear — each butterfly the reference's a + b, a - b
 * (never fused), so every output is the reference's expression tree. */
static __device__ void warp_fwht(float *u, int d, int lane)
{
	for (int h = 1; h < d; h <<= 1) {
		for (int p = lane; p < d / 2; p += 32) {
			const int j = ((p & ~(h - 1)) << 1) | (p & (h - 1));
			const float a = u[j], b = u[j + h];
			u[j] = __fadd_rn(a, b);
			u[j + h] = __fsub_rn(a, b);
		}
		__syncwarp();
	}
}

/* tq_fwht_ref on a vector held in registers, coordinate c = lane + 32 e in
 * x[e] (E values a lane): stage h pairs (c, c + h) for c with bit h clear
 * into (a + b, a - b), h = 1, 2, 4, ... as warp_fwht — strides below 32 by
 * shfl_xor (the upper lane computes partner - own: the reference's a - b),
 * the larger ones register pairs; each butterfly the reference's operands,
 * never fused.  Every lane of the warp calls it (shuffles): keep it out of
 * branches a warp could take apart.  hstop < E stops before the register
 * stage h = hstop: the transforms of the vector's E / hstop consecutive
 * parts of 32 hstop coordinates each (tq3o / tq4o: hstop = E / 2, each
 * half its own). */
template <int E>
static __device__ __forceinline__ void reg_fwht(float (&x)[E], int lane, int hstop = E)
{
#pragma unroll
	for (int h = 1; h < 32; h <<= 1) {
		const bool upper = lane & h;
#pragma unroll
		for (int e = 0; e < E; e++) {
			const float o = __shfl_xor_sync(FULL, x[e], h);
			x[e] = upper ? __fsub_rn(o, x[e]) : __fadd_rn(x[e], o);
		}
	}
#pragma unroll
	for (int h = 1; h < E; h <<= 1)
#pragma unroll
		for (int e = 0; e < E; e++)
			if (!(e & h) && h < hstop) {
				const float a = x[e], b = x[e + h];
				x[e] = __fadd_rn(a, b);
				x[e + h] = __fsub_rn(a, b);
			}
}

#endif /* TQ_CUDA_DEVICE_CUH */
