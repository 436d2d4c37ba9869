/* tq_cuda_encode.cu — quantize-append on the GPU: the bytes of the CPU
 * reference encoder (tq_codec_ref.c: tq_encode_ref_row), for every codec,
 * rotation and head dim.
 *
 * Bit-exactness (tq_internal.h's contract): every float operation of the
 * reference is done here with the same operands, in the same order, with
 * IEEE round-to-nearest and no contraction — the file is compiled with
 * --fmad=false, and every such operation is spelled __fmul_rn / __fadd_rn /
 * __fsub_rn / __fdiv_rn / __fsqrt_rn besides (those are never fused), and
 * nothing here is built with -use_fast_math (denormals are kept: tiny inputs
 * and the q8 subnormal-max path depend on them).  Where the reference runs a
 * sequential loop the GPU either runs the same loop (sumsq16's 16 lane sums,
 * the dense rotation's dot products: one lane per output) or a parallel
 * form that computes each result with the same expression tree (FWHT
 * butterflies, element-wise maps), or an order-free reduction (max |y| over
 * finite values; q4a's min/max as a (value, index) reduction with ties to
 * the lower index, which is the first occurrence the reference's strict `<`
 * / `>` scan keeps — the sign of a zero min depends on it).
 *
 * One warp encodes one vector (one token, one KV head, K or V); 4 warps per
 * CTA.  Two kernels: enc_kernel, for every codec, rotation, head dim and
 * input alignment, stages the vector in shared memory; enc_reg<D>, for the
 * common shapes (tqc_enc_reg_dim: head dims 64 / 128 / 256, tq2..tq4 and q8
 * with the Hadamard rotation, aligned rows), keeps it in registers and is
 * about a third faster for a decode token (BENCHMARKS 2b).  Both write the
 * same bytes; test_cuda checks each against the reference.  A vector whose
 * input has a NaN/Inf or that the codec cannot represent reports itself in
 * the status word (tq_cuda_internal.h) and its block is zeroed (a zero
 * vector in every codec): the slot never keeps the bytes it held before —
 * a page's earlier owner's, another session's perhaps — for the attention
 * that a decode step queues behind the append (tqc_append_attend) reads
 * the slot before the host has seen the status.
 */
#include "tq_cuda_device.cuh"

/* ---- element conversions: ports of tq_codec.c's bit functions ------------------ */

static __device__ __forceinline__ bool finite_bits(uint32_t u)
{
	return (u & 0x7f800000u) != 0x7f800000u;
}

/* Element c of a row of `dtype` as fp32 bits: one load where the row is
 * aligned to the element (the usual case), else byte loads. */
static __device__ __forceinline__ uint32_t load_elem_bits(const uint8_t *row, int dtype, int c, bool aligned)
{
	if (dtype == DT_F32) {
		const uint8_t *p = row + 4 * (size_t)c;
		if (aligned)
			return *reinterpret_cast<const uint32_t *>(p);
		return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
	}
	const uint8_t *p = row + 2 * (size_t)c;
	const uint32_t h = aligned ? (uint32_t)*reinterpret_cast<const uint16_t *>(p) : (uint32_t)p[0] | (uint32_t)p[1] << 8;
	if (dtype == DT_F16)
		return __float_as_uint(f16_to_f32(h));
	return h << 16; /* bf16 */
}

static __device__ __forceinline__ void store_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static __device__ __forceinline__ void store_u16(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

/* ---- warp-level pieces of the reference (x, u: this warp's shared rows) ------- */

/* tq_sumsq16: lane i < 16 sums x[j]^2 over j = i (mod 16) in order, then the
 * lanes reduce pairwise (l[i] += l[i+8], +4, +2, +1).  Every lane gets l[0]. */
static __device__ float warp_sumsq16(const float *x, int d, int lane)
{
	float l = 0.0f;

	if (lane < 16)
		for (int i = lane; i < d; i += 16)
			l = __fadd_rn(l, __fmul_rn(x[i], x[i]));
	for (int w = 8; w >= 1; w >>= 1) {
		float o = __shfl_down_sync(FULL, l, w);
		if (lane < w)
			l = __fadd_rn(l, o);
	}
	return __shfl_sync(FULL, l, 0);
}

/* One rotation's view: the whole codec's, or one half of a tq*o codec's
 * (its dim, the first of its sign bits, its R^T). */
struct rot_view {
	int dim, sign_at;
	const float *mat_t;
};

static __device__ __forceinline__ rot_view rot_whole(const struct tqc_codec_desc *cd)
{
	return rot_view{ cd->dim, 0, cd->mat_t };
}

/* rotate_scaled(r, x, inv_norm, u) of tq_codec_ref.c:
 *   Hadamard: u = fwht(x * sign) * (inv_norm * inv_sqrt_dim)
 *   dense:    u_i = (sum_j in order of R[i][j] * x[j]) * inv_norm
 * x must be visible to the warp (after __syncwarp); u is, on return. */
static __device__ void warp_rotate_scaled(const struct tqc_codec_desc *cd, rot_view r, const float *x,
					  float inv_norm, float *u, int lane)
{
	const int d = r.dim;

	if (cd->rot_kind == ROT_HADAMARD) {
		const float fac = __fmul_rn(inv_norm, cd->inv_sqrt_dim);
		for (int i = lane; i < d; i += 32) {
			u[i] = __fmul_rn(x[i], sign_of(*cd, r.sign_at + i));
		}
		__syncwarp();
		warp_fwht(u, d, lane);
		for (int i = lane; i < d; i += 32)
			u[i] = __fmul_rn(u[i], fac);
	} else {
		/* R[i][j] = mat_t[j * d + i]: lanes read consecutive floats */
		const float *mt = r.mat_t;
		for (int i = lane; i < d; i += 32) {
			float acc = 0.0f;
			for (int j = 0; j < d; j++)
				acc = __fadd_rn(acc, __fmul_rn(mt[(size_t)j * d + i], x[j]));
			u[i] = __fmul_rn(acc, inv_norm);
		}
	}
	__syncwarp();
}

/* tq_pack_planes for bits 1..7 (planes of width 4, 2, 1; widest first, with
 * the lowest bits): a plane of width w has stride S = d * w / 8 and byte j
 * holds index j + s * S at bits [s * w, s * w + w). */
static __device__ void warp_pack_planes(const uint8_t *idx, int d, int bits, uint8_t *out, int lane)
{
	int shift = 0;

	for (int w = 4; w >= 1; w >>= 1) {
		if (!(bits & w))
			continue;
		const int k = 8 / w, stride = d / k;
		const unsigned mask = (1u << w) - 1u;
		for (int j = lane; j < stride; j += 32) {
			unsigned byte = 0;
			for (int s = 0; s < k; s++)
				byte |= ((unsigned)(idx[j + s * stride] >> shift) & mask) << (s * w);
			out[j] = (uint8_t)byte;
		}
		out += stride;
		shift += w;
	}
}

static __device__ void warp_zero_block(uint8_t *blk, uint32_t bytes, int lane)
{
	for (uint32_t j = (uint32_t)lane; j < bytes; j += 32)
		blk[j] = 0;
}

/* Vector vec's block in the pages (token vec / 2 n_kv, K or V, KV head),
 * and its size into *bytes unless NULL. */
static __device__ __forceinline__ uint8_t *vec_block(const struct tqc_enc_args &a, uint32_t vec, uint32_t *bytes)
{
	const struct tq_page_geom &g = a.geom;
	const uint32_t n_kv = g.n_kv_heads;
	const uint32_t t = vec / (2u * n_kv), side = vec / n_kv % 2u, head = vec % n_kv;
	const uint32_t s = a.slot0 + t, pi = s / g.page_tokens, sl = s % g.page_tokens;
	const uint8_t *pg = a.pages ? a.pages[pi] : a.page_inline[pi];

	if (bytes)
		*bytes = side ? g.v_block_bytes : g.k_block_bytes;
	return (uint8_t *)pg + (side ? tq_page_v_off(&g, head, sl) : tq_page_k_off(&g, head, sl));
}

/* ---- the codecs: 0, or TQC_ST_RANGE (nothing written; the kernel zeroes the block) */

/* quantize() of tq_codec_ref.c without the packing: one TurboQuant vector
 * — a tq block, or half B (0 or 1) of a tq*o one — of the `d` values at x,
 * with `bits`: its indices into ib[0, d), and *scale = ||x|| / ||c[idx]||
 * (0 for a zero vector, whose indices are 0).  x (visible) is clobbered;
 * tab is the warp's scratch for the codebook's bounds and centroids.
 * 0, or TQC_ST_RANGE. */
template <int B>
static __device__ uint32_t quantize(const struct tqc_codec_desc *cd, rot_view r, int bits, float *x, float *u,
				    uint8_t *ib, float *tab, float *scale, int lane)
{
	const int d = r.dim;
	const float ss = warp_sumsq16(x, d, lane);

	if (!finite_bits(__float_as_uint(ss)))
		return TQC_ST_RANGE;
	if (ss == 0.0f) {
		for (int i = lane; i < d; i += 32)
			ib[i] = 0;
		__syncwarp();
		*scale = 0.0f;
		return 0;
	}
	const float norm = __fsqrt_rn(ss);
	/* the bounds and centroids into shared memory (constant indices: no
	 * dynamic indexing of the parameter block) */
	float *sb = tab, *sc = tab + TQC_CB_MAX;
	__syncwarp(); /* the other half is done with tab */
	if (lane == 0) {
#pragma unroll
		for (int b = 0; b < (B ? TQC_CB_B_MAX : TQC_CB_MAX); b++) {
			sb[b] = B ? cd->bound_b[b] : cd->bound[b];
			sc[b] = B ? cd->centroid_b[b] : cd->centroid[b];
		}
	}
	warp_rotate_scaled(cd, r, x, __fdiv_rn(1.0f, norm), u, lane); /* ends with a __syncwarp */
	/* idx = tq_cb_index: the number of bounds strictly below u, by binary
	 * search over the 2^bits - 1 sorted bounds (as the reference);
	 * cv = centroid[idx] goes to x, no longer needed */
	for (int i = lane; i < d; i += 32) {
		const float v = u[i];
		int idx = 0;
		for (int step = 1 << (bits - 1); step; step >>= 1)
			if (v > sb[idx + step - 1])
				idx += step;
		ib[i] = (uint8_t)idx;
		x[i] = sc[idx];
	}
	__syncwarp();
	*scale = __fdiv_rn(norm, __fsqrt_rn(warp_sumsq16(x, d, lane)));
	return 0;
}

/* encode_tq */
static __device__ uint32_t enc_tq(const struct tqc_codec_desc *cd, float *x, float *u, uint8_t *ib, float *tab,
				  uint8_t *blk, int lane)
{
	float scale;
	const uint32_t st = quantize<0>(cd, rot_whole(cd), cd->bits, x, u, ib, tab, &scale, lane);

	if (st)
		return st;
	if (lane == 0)
		store_u32(blk, __float_as_uint(scale));
	warp_pack_planes(ib, cd->dim, cd->bits, blk + TQ_TQ_HEADER_BYTES, lane);
	return 0;
}

/* tq_f32_to_bf16 (round to nearest even; NaN -> quiet NaN). */
static __device__ __forceinline__ uint32_t f32_to_bf16(float f)
{
	uint32_t x = __float_as_uint(f);

	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (x >> 16) | 0x40u;
	x += 0x7fffu + ((x >> 16) & 1u);
	return x >> 16;
}

/* encode_tqo: the two halves (the second's indices after the first's in ib),
 * each scale rounded to bf16; one that rounds up to inf fails the vector.
 * The block is written only once both halves succeeded. */
static __device__ uint32_t enc_tqo(const struct tqc_codec_desc *cd, float *x, float *u, uint8_t *ib, float *tab,
				   uint8_t *blk, int lane)
{
	const int h = cd->half;
	float sa, sb;
	uint32_t st;

	if ((st = quantize<0>(cd, rot_view{ h, 0, cd->mat_t }, cd->bits, x, u, ib, tab, &sa, lane)) ||
	    (st = quantize<1>(cd, rot_view{ h, h, cd->mat_t_b }, cd->bits_b, x + h, u, ib + h, tab, &sb, lane)))
		return st;
	const uint32_t ha = f32_to_bf16(sa), hb = f32_to_bf16(sb);
	if ((ha & 0x7f80u) == 0x7f80u || (hb & 0x7f80u) == 0x7f80u)
		return TQC_ST_RANGE;
	if (lane == 0) {
		store_u16(blk, ha);
		store_u16(blk + 2, hb);
	}
	uint8_t *pa = blk + TQ_TQO_HEADER_BYTES;
	warp_pack_planes(ib, h, cd->bits, pa, lane);
	warp_pack_planes(ib + h, h, cd->bits_b, pa + TQ_PLANES_BYTES(h, cd->bits), lane);
	return 0;
}

/* encode_q8's scale, from each lane's "saw a non-finite y" and max |y| bits
 * (non-negative finite floats order as their bits): TQC_ST_RANGE (the
 * rotation overflowed), or 0 with *amax (0: the block is all zeros) and the
 * factors q = rint(y * pre * inv) takes — pre 2^64 (exact) where amax is
 * subnormal and 127 / amax would overflow. */
static __device__ __forceinline__ uint32_t q8_scale(bool bad, unsigned amax_bits, float *amax, float *pre, float *inv)
{
	if (__any_sync(FULL, bad))
		return TQC_ST_RANGE;
	*amax = __uint_as_float(__reduce_max_sync(FULL, amax_bits));
	*pre = 1.0f;
	*inv = *amax == 0.0f ? 0.0f : __fdiv_rn(127.0f, *amax);
	if (*amax != 0.0f && !finite_bits(__float_as_uint(*inv))) {
		*pre = 0x1.0p64f;
		*inv = __fdiv_rn(127.0f, __fmul_rn(*amax, *pre));
	}
	return 0;
}

/* y as an int8 code of encode_q8 */
static __device__ __forceinline__ uint8_t q8_code(float y, float pre, float inv)
{
	const float r = rintf(__fmul_rn(__fmul_rn(y, pre), inv));
	return (uint8_t)(int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
}

/* encode_q8 */
static __device__ uint32_t enc_q8(const struct tqc_codec_desc *cd, const float *x, float *u, uint8_t *blk,
			   int lane)
{
	const int d = cd->dim;
	bool bad = false;
	unsigned amax_bits = 0;

	warp_rotate_scaled(cd, rot_whole(cd), x, 1.0f, u, lane);
	for (int i = lane; i < d; i += 32) {
		const uint32_t b = __float_as_uint(u[i]);
		bad |= !finite_bits(b);
		amax_bits = max(amax_bits, b & 0x7fffffffu);
	}
	float amax, pre, inv;
	if (q8_scale(bad, amax_bits, &amax, &pre, &inv))
		return TQC_ST_RANGE;
	if (amax == 0.0f) {
		warp_zero_block(blk, cd->block_bytes, lane);
		return 0;
	}
	for (int i = lane; i < d; i += 32)
		blk[TQ_Q8_HEADER_BYTES + i] = q8_code(u[i], pre, inv);
	if (lane == 0)
		store_u32(blk, __float_as_uint(__fdiv_rn(amax, 127.0f)));
	return 0;
}

/* encode_q4a */
static __device__ uint32_t enc_q4a(const struct tqc_codec_desc *cd, const float *x, uint8_t *ib, uint8_t *blk,
			    int lane)
{
	const int d = cd->dim;
	float mn = 0.0f, mx = 0.0f;
	int mni = -1, mxi = -1;

	/* this lane's elements in index order: the first occurrence wins (strict
	 * compares, as the reference's scan) */
	for (int i = lane; i < d; i += 32) {
		const float v = x[i];
		if (mni < 0 || v < mn) {
			mn = v;
			mni = i;
		}
		if (mxi < 0 || v > mx) {
			mx = v;
			mxi = i;
		}
	}
	/* across lanes: the smaller (larger) value, on equal values (-0 == +0)
	 * the lower index — a total order, so every lane ends with the element
	 * the sequential scan keeps */
	for (int o = 16; o >= 1; o >>= 1) {
		const float omn = __shfl_xor_sync(FULL, mn, o), omx = __shfl_xor_sync(FULL, mx, o);
		const int omni = __shfl_xor_sync(FULL, mni, o), omxi = __shfl_xor_sync(FULL, mxi, o);
		if (omni >= 0 && (mni < 0 || omn < mn || (omn == mn && omni < mni))) {
			mn = omn;
			mni = omni;
		}
		if (omxi >= 0 && (mxi < 0 || omx > mx || (omx == mx && omxi < mxi))) {
			mx = omx;
			mxi = omxi;
		}
	}
	const float range = __fsub_rn(mx, mn);
	const uint32_t sh = f32_to_f16(__fdiv_rn(range, 15.0f)), mh = f32_to_f16(mn);
	if (!finite_bits(__float_as_uint(range)) || (sh & 0x7c00u) == 0x7c00u || (mh & 0x7c00u) == 0x7c00u)
		return TQC_ST_RANGE;
	const float s = f16_to_f32(sh), m = f16_to_f32(mh);
	const float inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
	for (int i = lane; i < d; i += 32) {
		const float r = rintf(__fmul_rn(__fsub_rn(x[i], m), inv));
		ib[i] = (uint8_t)(r > 15.0f ? 15 : r < 0.0f ? 0 : (int)r);
	}
	__syncwarp();
	if (lane == 0) {
		store_u16(blk, sh);
		store_u16(blk + 2, mh);
	}
	warp_pack_planes(ib, d, 4, blk + TQ_Q4A_HEADER_BYTES, lane);
	return 0;
}

/* encode_f16 */
static __device__ uint32_t enc_f16(const struct tqc_codec_desc *cd, const float *x, uint8_t *blk, int lane)
{
	const int d = cd->dim;
	bool bad = false;

	for (int i = lane; i < d; i += 32)
		if ((f32_to_f16(x[i]) & 0x7c00u) == 0x7c00u)
			bad = true;
	if (__any_sync(FULL, bad))
		return TQC_ST_RANGE;
	for (int i = lane; i < d; i += 32)
		store_u16(blk + 2 * i, f32_to_f16(x[i]));
	return 0;
}

/* f32: the converted floats' bits */
static __device__ uint32_t enc_f32(const struct tqc_codec_desc *cd, const float *x, uint8_t *blk, int lane)
{
	for (int i = lane; i < cd->dim; i += 32)
		store_u32(blk + 4 * i, __float_as_uint(x[i]));
	return 0;
}

/* ---- the kernel ------------------------------------------------------------------ */

/* One vector: its status (0, or TQC_ST_* | element). */
static __device__ uint32_t enc_vector(const struct tqc_enc_args &a, uint32_t vec, float *x, float *u, uint8_t *ib,
				      float *tab, int lane)
{
	const uint32_t n_kv = a.geom.n_kv_heads;
	const uint32_t t = vec / (2u * n_kv), side = vec / n_kv % 2u, head = vec % n_kv;
	const struct tqc_codec_desc *cd = side ? &a.vc : &a.kc;
	const int d = cd->dim;
	const size_t esz = a.dtype == DT_F32 ? 4 : 2;
	const uint8_t *row = (side ? a.v : a.k) + ((size_t)t * n_kv + head) * (size_t)d * esz;

	/* tq_row_to_f32: convert, and find the first NaN/Inf.  The row is
	 * often in host memory (a client's registered arena): every load of
	 * the lane is issued before the first is used (one round trip over
	 * the bus, not one per element — the stores to x could alias row as
	 * far as the compiler knows) */
	const bool aligned = ((uintptr_t)row & (esz - 1)) == 0;
	uint32_t eb[TQ_DIM_MAX / 32];
#pragma unroll
	for (int j = 0; j < TQ_DIM_MAX / 32; j++) {
		const int i = lane + 32 * j;
		eb[j] = i < d ? load_elem_bits(row, a.dtype, i, aligned) : 0u;
	}
	unsigned bad = 0xffffffffu;
#pragma unroll
	for (int j = 0; j < TQ_DIM_MAX / 32; j++) {
		const int i = lane + 32 * j;
		if (i < d) {
			x[i] = __uint_as_float(eb[j]);
			if (!finite_bits(eb[j]) && bad == 0xffffffffu)
				bad = (unsigned)i;
		}
	}
	bad = __reduce_min_sync(FULL, bad);
	__syncwarp();
	if (bad != 0xffffffffu)
		return TQC_ST_NONFINITE | bad;

	uint8_t *blk = vec_block(a, vec, nullptr);

	switch (cd->id) {
	case TQ_CODEC_TQ2:
	case TQ_CODEC_TQ3:
	case TQ_CODEC_TQ4: return enc_tq(cd, x, u, ib, tab, blk, lane);
	case TQ_CODEC_TQ3O:
	case TQ_CODEC_TQ4O: return enc_tqo(cd, x, u, ib, tab, blk, lane);
	case TQ_CODEC_Q8: return enc_q8(cd, x, u, blk, lane);
	case TQ_CODEC_Q4A: return enc_q4a(cd, x, ib, blk, lane);
	case TQ_CODEC_F16: return enc_f16(cd, x, blk, lane);
	default: return enc_f32(cd, x, blk, lane); /* the host admits only the 9 ids */
	}
}

/* The end of a launch, called by every thread of a CTA (TQC_WARPS warps) with
 * its warp's status st (vec << 32 | code, ~0 for none): the first failing
 * vector's is the minimum over the launch (atomicMin into *status); the CTA
 * that finishes last moves it to the host-mapped *report and resets
 * *status and *done for the next launch, so a launch needs no copies before
 * or after it.  Only thread 0 takes part, after the CTA's barrier, and
 * fences only where it wrote a status and in the last CTA.  The host reads
 * *report after the stream has synchronised, which makes the kernel's
 * writes to mapped memory visible. */
static __device__ void enc_finish(const struct tqc_enc_args &a, unsigned long long st, unsigned long long *s_st)
{
	if ((threadIdx.x & 31u) == 0)
		s_st[threadIdx.x >> 5] = st;
	__syncthreads();
	if (threadIdx.x != 0)
		return;
	unsigned long long m = ~0ull;
	for (int w = 0; w < TQC_WARPS; w++)
		m = s_st[w] < m ? s_st[w] : m;
	if (m != ~0ull) {
		atomicMin(a.status, m);
		__threadfence(); /* the status before this CTA's count */
	}
	if (atomicAdd(a.done, 1u) == gridDim.x - 1u) {
		__threadfence(); /* every other CTA's status, before reading it */
		*(volatile unsigned long long *)a.report = atomicExch(a.status, ~0ull);
		*(volatile uint32_t *)a.done = 0u;
	}
}

/* One warp per vector, any codec, rotation, head dim and input alignment. */
__global__ void __launch_bounds__(TQC_WARPS * 32) enc_kernel(const __grid_constant__ struct tqc_enc_args a)
{
	__shared__ float s_x[TQC_WARPS][TQ_DIM_MAX];
	__shared__ float s_u[TQC_WARPS][TQ_DIM_MAX];
	__shared__ uint8_t s_ib[TQC_WARPS][TQ_DIM_MAX];     /* indices */
	__shared__ float s_tab[TQC_WARPS][2 * TQC_CB_MAX]; /* a codebook's bounds, centroids */
	__shared__ unsigned long long s_st[TQC_WARPS];

	const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
	const uint32_t vec = blockIdx.x * TQC_WARPS + (uint32_t)warp;
	unsigned long long st = ~0ull;

	if (vec < a.n_tok * 2u * a.geom.n_kv_heads) { /* the whole warp */
		const uint32_t r = enc_vector(a, vec, s_x[warp], s_u[warp], s_ib[warp], s_tab[warp], lane);
		if (r) {
			uint32_t bytes;
			uint8_t *blk = vec_block(a, vec, &bytes);
			warp_zero_block(blk, bytes, lane); /* the slot keeps nothing */
			st = (unsigned long long)vec << 32 | r;
		}
	}
	enc_finish(a, st, s_st);
}

/* ---- the register path: d 64, 128, 256; Hadamard; tq2..4 and q8; aligned rows ---
 *
 * The same bytes as enc_kernel (and the reference) by the same operations,
 * with the vector in registers instead of shared memory: lane l holds
 * coordinates c = l + 32 e, e < E = D / 32.  Loads coalesce; the FWHT's
 * strides below 32 are shuffles and the larger ones register pairs; the
 * codebook sits one entry per lane (bound[l], centroid[l]), so the binary
 * search and the centroid lookup are shuffles.  A decode token's launch is a
 * handful of warps that each run one dependent chain: what it costs is the
 * chain's latency and the instructions fetched (the kernel is small, and its
 * instruction cache is cold at every launch), which this path cuts to a
 * fraction of enc_kernel's. */

/* Row elements c = lane + 32 e as floats (tq_row_to_f32); the first
 * non-finite element's index, or ~0.  Every load is issued before the first
 * is used: a row in host memory costs one round trip over the bus. */
template <int D>
static __device__ __forceinline__ uint32_t reg_load(const uint8_t *row, int dtype, float (&x)[D / 32], int lane)
{
	constexpr int E = D / 32;
	uint32_t eb[E];

	if (dtype == DT_F32) {
		const uint32_t *p = reinterpret_cast<const uint32_t *>(row);
#pragma unroll
		for (int e = 0; e < E; e++)
			eb[e] = p[lane + 32 * e];
	} else {
		const uint16_t *p = reinterpret_cast<const uint16_t *>(row);
#pragma unroll
		for (int e = 0; e < E; e++)
			eb[e] = p[lane + 32 * e];
#pragma unroll
		for (int e = 0; e < E; e++)
			eb[e] = dtype == DT_F16 ? __float_as_uint(f16_to_f32(eb[e])) : eb[e] << 16;
	}
	uint32_t bad = ~0u;
#pragma unroll
	for (int e = E - 1; e >= 0; e--) {
		x[e] = __uint_as_float(eb[e]);
		if (!finite_bits(eb[e]))
			bad = (uint32_t)(lane + 32 * e); /* the lowest e wins */
	}
	return __reduce_min_sync(FULL, bad);
}

/* tq_sumsq16 (warp_sumsq16's order): lane i < 16 adds the squares of
 * c = i, i + 16, i + 32, ... — its own (e) and lane i + 16's, alternately. */
template <int E>
static __device__ __forceinline__ float reg_sumsq16(const float (&x)[E], int lane)
{
	float l = 0.0f;

#pragma unroll
	for (int e = 0; e < E; e++) {
		const float sq = __fmul_rn(x[e], x[e]);
		const float hi = __shfl_down_sync(FULL, sq, 16);
		l = __fadd_rn(__fadd_rn(l, sq), hi);
	}
#pragma unroll
	for (int w = 8; w >= 1; w >>= 1) {
		const float o = __shfl_down_sync(FULL, l, w);
		if (lane < w)
			l = __fadd_rn(l, o);
	}
	return __shfl_sync(FULL, l, 0);
}

/* x = fwht(x * sign) (warp_rotate_scaled's Hadamard, before its scaling) */
template <int D>
static __device__ __forceinline__ void reg_hadamard(const struct tqc_codec_desc *cd, float (&x)[D / 32], int lane)
{
#pragma unroll
	for (int e = 0; e < D / 32; e++)
		x[e] = __fmul_rn(x[e], (cd->sign_mask[e] >> lane) & 1u ? -1.0f : 1.0f);
	reg_fwht<D / 32>(x, lane);
}

/* One plane of width W (tq_pack_planes): S = D W / 8 bytes, byte j holding
 * the W bits at `shift` of indices j + s S, s < 8 / W, at bits s W.  Byte j
 * = 32 r + lane is this lane's; index j + s S is coordinate 32 r + s S + lane
 * — in this lane (S a multiple of 32) or, for S < 32 (then r = 0 and only
 * lanes < S store), in lane lane + (s S mod 32): either way at the same e
 * for every lane, known at compile time. */
template <int D, int W>
static __device__ __forceinline__ void reg_plane(const uint32_t (&idx)[D / 32], int shift, uint8_t *out, int lane)
{
	constexpr int K = 8 / W, S = D * W / 8, R = (S + 31) / 32;

#pragma unroll
	for (int r = 0; r < R; r++) {
		uint32_t byte = 0;
#pragma unroll
		for (int s = 0; s < K; s++) {
			const int base = 32 * r + s * S, e = base >> 5, off = base & 31;
			uint32_t v = idx[e];
			if (off)
				v = __shfl_sync(FULL, v, (lane + off) & 31);
			byte |= ((v >> shift) & ((1u << W) - 1u)) << (s * W);
		}
		if (32 * r + lane < S)
			out[32 * r + lane] = (uint8_t)byte;
	}
}

/* quantize() of tq_codec_ref.c, after the rotation, on a vector of E
 * registers (a tq block, or a half of a tq*o one): x its rotated values
 * (fwht(x * sign), before the scaling), ss the tq_sumsq16 of its values
 * before, finite.  Its indices into idx, the norm correction returned (0,
 * with indices 0, for a zero vector, as the reference).  The codebook sits
 * one entry per lane: bound[lane % CB], centroid[lane % CB] (CB: the
 * arrays' length, 32 or 8). */
template <int E, int CB>
static __device__ __forceinline__ float reg_quantize(const float *bound, const float *centroid, int bits,
						     float inv_sqrt_dim, float ss, float (&x)[E], uint32_t (&idx)[E],
						     int lane)
{
	float scale = 0.0f;

#pragma unroll
	for (int e = 0; e < E; e++)
		idx[e] = 0;
	if (ss != 0.0f) {
		const float norm = __fsqrt_rn(ss);
		const float fac = __fmul_rn(__fdiv_rn(1.0f, norm), inv_sqrt_dim);
		const int i = CB == 32 ? lane : lane % CB;
		const float bnd = bound[i], cen = centroid[i];
#pragma unroll
		for (int e = 0; e < E; e++)
			x[e] = __fmul_rn(x[e], fac);
		/* tq_cb_index: the reference's binary search over the sorted
		 * bounds, the same comparisons */
		for (int step = 1 << (bits - 1); step; step >>= 1)
#pragma unroll
			for (int e = 0; e < E; e++)
				if (x[e] > __shfl_sync(FULL, bnd, (int)idx[e] + step - 1))
					idx[e] += (uint32_t)step;
#pragma unroll
		for (int e = 0; e < E; e++)
			x[e] = __shfl_sync(FULL, cen, (int)idx[e]);
		scale = __fdiv_rn(norm, __fsqrt_rn(reg_sumsq16(x, lane)));
	}
	return scale;
}

/* tq_pack_planes of a B-bit index over D values (B = 2..MAXB, MAXB 4 or 5:
 * planes [2], [2, 1], [4], [4, 1]) */
template <int D, int MAXB>
static __device__ __forceinline__ void reg_planes(const uint32_t (&idx)[D / 32], int bits, uint8_t *pl, int lane)
{
	if (bits == 4 || (MAXB == 5 && bits == 5)) {
		reg_plane<D, 4>(idx, 0, pl, lane);
		if (MAXB == 5 && bits == 5)
			reg_plane<D, 1>(idx, 4, pl + TQ_PLANES_BYTES(D, 4), lane);
	} else {
		reg_plane<D, 2>(idx, 0, pl, lane);
		if (bits == 3)
			reg_plane<D, 1>(idx, 2, pl + TQ_PLANES_BYTES(D, 2), lane);
	}
}

/* encode_tq: 0, or TQC_ST_RANGE (nothing written). */
template <int D>
static __device__ uint32_t reg_tq(const struct tqc_codec_desc *cd, float (&x)[D / 32], uint8_t *blk, int lane)
{
	constexpr int E = D / 32;
	const float ss = reg_sumsq16(x, lane);
	uint32_t idx[E];

	/* the rotation needs the norm only for its scaling: its shuffles run
	 * beside the norm's (one chain of latencies, not two) */
	reg_hadamard<D>(cd, x, lane);
	if (!finite_bits(__float_as_uint(ss)))
		return TQC_ST_RANGE;
	const float scale = reg_quantize<E, TQC_CB_MAX>(cd->bound, cd->centroid, cd->bits, cd->inv_sqrt_dim, ss, x, idx,
							lane);
	if (lane == 0)
		store_u32(blk, __float_as_uint(scale));
	reg_planes<D, 4>(idx, cd->bits, blk + TQ_TQ_HEADER_BYTES, lane);
	return 0;
}

/* encode_tqo (enc_tqo's steps): each half of H = D / 2 values in E / 2
 * registers, its own norm, Hadamard transform (the register FWHT stopped
 * before the stage that pairs the halves), codebook and bf16 scale; 0, or
 * TQC_ST_RANGE (nothing written). */
template <int D>
static __device__ uint32_t reg_tqo(const struct tqc_codec_desc *cd, float (&x)[D / 32], uint8_t *blk, int lane)
{
	constexpr int E = D / 32, EH = E / 2, H = D / 2;
	float xa[EH], xb[EH];
	uint32_t ia[EH], ib[EH];

#pragma unroll
	for (int e = 0; e < EH; e++)
		xa[e] = x[e], xb[e] = x[EH + e];
	const float ssa = reg_sumsq16(xa, lane), ssb = reg_sumsq16(xb, lane);
#pragma unroll
	for (int e = 0; e < E; e++)
		x[e] = __fmul_rn(x[e], (cd->sign_mask[e] >> lane) & 1u ? -1.0f : 1.0f);
	reg_fwht<E>(x, lane, EH);
#pragma unroll
	for (int e = 0; e < EH; e++)
		xa[e] = x[e], xb[e] = x[EH + e];
	if (!finite_bits(__float_as_uint(ssa)) || !finite_bits(__float_as_uint(ssb)))
		return TQC_ST_RANGE;
	const float sa = reg_quantize<EH, TQC_CB_MAX>(cd->bound, cd->centroid, cd->bits, cd->inv_sqrt_dim, ssa, xa, ia,
						      lane);
	const float sb = reg_quantize<EH, TQC_CB_B_MAX>(cd->bound_b, cd->centroid_b, cd->bits_b, cd->inv_sqrt_dim, ssb,
							xb, ib, lane);
	const uint32_t ha = f32_to_bf16(sa), hb = f32_to_bf16(sb);
	if ((ha & 0x7f80u) == 0x7f80u || (hb & 0x7f80u) == 0x7f80u)
		return TQC_ST_RANGE;
	if (lane == 0)
		store_u32(blk, ha | hb << 16);
	uint8_t *pa = blk + TQ_TQO_HEADER_BYTES;
	reg_planes<H, 5>(ia, cd->bits, pa, lane);
	reg_planes<H, 3>(ib, cd->bits_b, pa + TQ_PLANES_BYTES(H, cd->bits), lane);
	return 0;
}

/* encode_q8 (enc_q8's steps) */
template <int D>
static __device__ uint32_t reg_q8(const struct tqc_codec_desc *cd, float (&x)[D / 32], uint8_t *blk, int lane)
{
	constexpr int E = D / 32;
	const float fac = __fmul_rn(1.0f, cd->inv_sqrt_dim);
	bool bad = false;
	unsigned amax_bits = 0;

	reg_hadamard<D>(cd, x, lane);
#pragma unroll
	for (int e = 0; e < E; e++) {
		x[e] = __fmul_rn(x[e], fac);
		const uint32_t b = __float_as_uint(x[e]);
		bad |= !finite_bits(b);
		amax_bits = max(amax_bits, b & 0x7fffffffu);
	}
	float amax, pre, inv;
	if (q8_scale(bad, amax_bits, &amax, &pre, &inv))
		return TQC_ST_RANGE;
	if (amax == 0.0f) {
		warp_zero_block(blk, TQ_Q8_BLOCK_BYTES(D), lane);
		return 0;
	}
#pragma unroll
	for (int e = 0; e < E; e++)
		blk[TQ_Q8_HEADER_BYTES + lane + 32 * e] = q8_code(x[e], pre, inv);
	if (lane == 0)
		store_u32(blk, __float_as_uint(__fdiv_rn(amax, 127.0f)));
	return 0;
}

/* One warp per vector, TQC_WARPS a CTA, as enc_kernel.  (For a decode token
 * CTAs of 1, 2 or 4 warps took the same time; one CTA of a warp per vector,
 * whose finish needs no atomics, was slower: BENCHMARKS 2b.)  O: a launch
 * with a tq3o / tq4o codec (a build of its own: the others' kernel, whose
 * instructions a decode token fetches cold, stays as small as it was). */
template <int D, int O>
__global__ void __launch_bounds__(TQC_WARPS * 32) enc_reg(const __grid_constant__ struct tqc_enc_args a)
{
	__shared__ unsigned long long s_st[TQC_WARPS];

	const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
	const uint32_t vec = blockIdx.x * TQC_WARPS + (uint32_t)warp;
	const uint32_t n_kv = a.geom.n_kv_heads;
	unsigned long long st = ~0ull;

	if (vec < a.n_tok * 2u * n_kv) { /* the whole warp */
		const uint32_t t = vec / (2u * n_kv), side = vec / n_kv % 2u, head = vec % n_kv;
		const struct tqc_codec_desc *cd = side ? &a.vc : &a.kc;
		const size_t esz = a.dtype == DT_F32 ? 4 : 2;
		const uint8_t *row = (side ? a.v : a.k) + ((size_t)t * n_kv + head) * (size_t)D * esz;
		float x[D / 32];
		uint32_t r = reg_load<D>(row, a.dtype, x, lane);
		uint32_t blk_bytes;
		uint8_t *blk = vec_block(a, vec, &blk_bytes);

		if (r != ~0u) {
			r |= TQC_ST_NONFINITE;
		} else {
			if (cd->id == TQ_CODEC_Q8) {
				r = reg_q8<D>(cd, x, blk, lane);
			} else {
				if constexpr (O != 0)
					r = cd->half ? reg_tqo<D>(cd, x, blk, lane) : reg_tq<D>(cd, x, blk, lane);
				else
					r = reg_tq<D>(cd, x, blk, lane);
			}
		}
		if (r) {
			warp_zero_block(blk, blk_bytes, lane); /* the slot keeps nothing */
			st = (unsigned long long)vec << 32 | r;
		}
	}
	enc_finish(a, st, s_st);
}

/* The launcher (tests/simt/ runs the kernels above on the CPU with its own). */
#ifndef TQC_SIMT
extern "C" int tqc_launch_encode(const struct tqc_enc_args *a, void *stream)
{
	const uint32_t nvec = a->n_tok * 2u * a->geom.n_kv_heads;

	(void)cudaGetLastError(); /* a stale error of an earlier call is not this launch's */
	if (nvec == 0)
		return 0;
	const dim3 grid((nvec + TQC_WARPS - 1) / TQC_WARPS), block(TQC_WARPS * 32);
	cudaStream_t st = (cudaStream_t)stream;
	const bool o = a->kc.half || a->vc.half;
	switch (tqc_enc_reg_dim(a)) {
	case 64: o ? enc_reg<64, 1><<<grid, block, 0, st>>>(*a) : enc_reg<64, 0><<<grid, block, 0, st>>>(*a); break;
	case 128: o ? enc_reg<128, 1><<<grid, block, 0, st>>>(*a) : enc_reg<128, 0><<<grid, block, 0, st>>>(*a); break;
	case 256: o ? enc_reg<256, 1><<<grid, block, 0, st>>>(*a) : enc_reg<256, 0><<<grid, block, 0, st>>>(*a); break;
	default: enc_kernel<<<grid, block, 0, st>>>(*a); break;
	}
	return (int)cudaGetLastError();
}
#endif /* TQC_SIMT */
