/* tq_cuda_attn.cu — fused attention over paged, compressed K/V on the GPU:
 * the contract of tq_attend (tq_attn.h), every K/V codec pair, any head dim.
 *
 * Per pass over the query tokens (tq_cuda.c cuts a call into passes), on one
 * stream: attn_mma where its shapes apply — tiles of 32 keys staged in
 * shared memory, both products on the tensor cores, see "tiled decode"
 * below; it rotates its rows' queries and merges its splits itself — else
 * attn_prep, attn_main and attn_finish:
 *
 *   attn_prep    one warp per row (query token, query head): q in the K
 *                frame, pre-scaled for base-2 softmax: qrot = scale2 * R_k q
 *                (Hadamard: fwht(q * sign) / sqrt(d); dense: R_k q; identity
 *                for the unrotated codecs q4a / f16 / f32).
 *   attn_main    one CTA per (row block, split of the context, KV head), 4
 *                warps.  A row block is up to R rows of one KV head's rows
 *                r = i * G + g (so a block may span several query tokens and
 *                each decoded key and value serves all of them).  Lanes hold
 *                coordinates c = lane + 32 j (j < VPL): a B-bit index plane of
 *                width w and stride S = d w / 8 has coordinate c in byte c mod S
 *                at bits (c / S) w.  Each warp walks every 4th token of the
 *                split: decode the K block's coordinates, per row a dot product
 *                reduced across the warp (xor butterflies: every lane ends with
 *                the same bits), online softmax (running max m, sum l, alpha =
 *                2^(m_old - m_new)), then the V block's coordinates accumulated
 *                in the V frame.  The 4 warps merge in shared memory and the
 *                CTA writes its (m, l, acc) per row to the partials.
 *   attn_finish  one warp per row: log-sum-exp merge of the splits, acc / l,
 *                back to the original frame (R_v^T), out.
 *
 * Scores: tq: blockscale * sum q_rot[c] centroid[idx[c]]; q8: scale * sum
 * q_rot[c] int8[c]; q4a: sum q[c] (min + s q4[c]); f16 / f32: plain; tq3o /
 * tq4o: each half's bf16 scale times its own codebook's centroids, the
 * rotation block-diagonal (each half of q, and of the output, rotated by its
 * own half's Hadamard or dense transform) — as keys on attn_mma too (with
 * the Hadamard transform or none), as values on attn_main only.  Values
 * likewise with their own codec.
 *
 * Non-finite logits: a visible score that is +-Inf or NaN makes the row NaN,
 * never a plausible wrong number (the CPU contract): the running sum picks
 * up score * 0 (NaN for a non-finite score), and the merges keep a NaN sum
 * even where the split or warp saw no finite score.  A row that sees no key
 * (empty cache, no causal mask) is zeros.
 *
 * Block fields may be unaligned: block scales and fp16 headers are read
 * byte by byte; f16 / f32 payloads with 2- / 4-byte loads, which the page
 * layout aligns (page bases 64-byte aligned — the host checks — and f16 / f32
 * block sizes multiples of 16 bytes).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "tq_cuda.h" /* struct tqc_phase_rec, the phases' host calls */
#include "tq_cuda_device.cuh"

#define NEG_INF __int_as_float(0xff800000)
#define QNAN __int_as_float(0x7fc00000)

/* The (VPL, R) pairs the main kernel is built for: tqc_attn_vpl / _rows. */
constexpr int rows_for(int vpl)
{
	return vpl <= 4 ? 8 : 32 / vpl;
}

/* ---- small pieces ------------------------------------------------------------------ */

static __device__ __forceinline__ uint32_t ld_u16(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static __device__ __forceinline__ float ld_f32(const uint8_t *p)
{
	return __uint_as_float((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
			       (uint32_t)p[3] << 24);
}

/* Sum over the warp; every lane gets the same bits (a + b == b + a). */
static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o >= 1; o >>= 1)
		v += __shfl_xor_sync(FULL, v, o);
	return v;
}

/* Max over the warp; every lane gets the same value. */
static __device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
	for (int o = 16; o >= 1; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
	return v;
}

/* Byte offsets (in a block) of the index planes of width 4, 2 and 1 (0 where
 * the codec has no such plane: never read then). */
struct planes {
	int o4, o2, o1;
};

static __device__ __forceinline__ planes plane_offsets(int d, int bits)
{
	planes p = { 0, 0, 0 };
	int off = TQ_TQ_HEADER_BYTES; /* = TQ_Q4A_HEADER_BYTES */

	if (bits & 4) {
		p.o4 = off;
		off += d / 2;
	}
	if (bits & 2) {
		p.o2 = off;
		off += d / 4;
	}
	if (bits & 1)
		p.o1 = off;
	return p;
}

/* Where coordinate c (< d) sits in planes of width 4, 2 and 1, packed in one
 * word (the same for every codec of head dim d): a plane of width w has
 * stride S = d w / 8 and holds c in byte c - s S at bits [s w, s w + w), with
 * s = floor(c / S) = floor(8 c / d) >> log2(8 / w) (d is a multiple of 8).
 *   bits  0.. 7  byte in the 4-bit plane (< 256)   bit  8      s for w = 4
 *   bits  9..15  byte in the 2-bit plane (< 128)   bits 16..17 s for w = 2
 *   bits 18..23  byte in the 1-bit plane (< 64)    bits 24..26 s for w = 1 */
static __device__ __forceinline__ uint32_t plane_pos(int c, int d)
{
	const uint32_t k = (uint32_t)(8 * c / d); /* 0..7 */
	const uint32_t s4 = k >> 2, s2 = k >> 1, s1 = k;
	const uint32_t b4 = (uint32_t)c - s4 * (uint32_t)(d / 2), b2 = (uint32_t)c - s2 * (uint32_t)(d / 4),
		       b1 = (uint32_t)c - s1 * (uint32_t)(d / 8);

	return b4 | s4 << 8 | b2 << 9 | s2 << 16 | b1 << 18 | s1 << 24;
}

/* The index at `pos` (plane_pos) of a block's planes, `bits` wide (1..7);
 * widest plane first, holding the lowest bits. */
static __device__ __forceinline__ int plane_index(const uint8_t *b, uint32_t pos, int bits, planes p)
{
	int idx = 0, sh = 0;

	/* pos is loop-invariant in the token loop: without this opaque copy the
	 * compiler keeps every field of it, per codec, in registers across the
	 * loop (hundreds at VPL 16); re-extracting them costs a few ALU ops */
#ifdef __CUDA_ARCH__
	asm volatile("mov.b32 %0, %0;" : "+r"(pos));
#endif

	if (bits & 4) {
		idx = (b[p.o4 + (pos & 0xffu)] >> ((pos >> 6) & 4u)) & 15;
		sh = 4;
	}
	if (bits & 2) {
		idx |= ((b[p.o2 + ((pos >> 9) & 0x7fu)] >> ((pos >> 15) & 6u)) & 3) << sh;
		sh += 2;
	}
	if (bits & 1)
		idx |= ((b[p.o1 + ((pos >> 18) & 0x3fu)] >> ((pos >> 24) & 7u)) & 1) << sh;
	return idx;
}

/* How attn_main reads one codec's blocks: its id, bits, plane offsets and
 * centroids (shared memory); for tq*o, the second half's besides (its
 * planes at b_off, from the block's start; coordinates c >= half). */
struct dview {
	int id, d, bits;
	planes pl;
	const float *cent;
	int half, bits_b;
	uint32_t b_off;
	planes pl_b;
	const float *cent_b;
};

static __device__ __forceinline__ dview dview_of(const struct tqc_codec_desc &cd, const float *cent)
{
	dview v;

	v.id = cd.id;
	v.d = cd.dim;
	v.bits = cd.bits;
	v.cent = cent;
	v.cent_b = cent + TQC_CB_MAX;
	v.half = cd.half;
	v.bits_b = cd.bits_b;
	if (cd.half) {
		v.pl = plane_offsets(cd.half, cd.bits);
		v.pl_b = plane_offsets(cd.half, cd.bits_b);
		v.b_off = TQ_PLANES_BYTES(cd.half, cd.bits);
	} else {
		v.pl = plane_offsets(cd.dim, cd.bits);
		v.pl_b = v.pl;
		v.b_off = 0;
	}
	return v;
}

static __device__ __forceinline__ float bf16_to_f32(uint32_t h)
{
	return __uint_as_float(h << 16);
}

/* This lane's coordinates of one block, in the codec's frame, unscaled:
 * v[j] for c = lane + 32 j (0 past d).  Returns the block's scale (tq: the
 * norm correction; q8: max/127; others 1 — tq*o's two scales are applied
 * here, per half). */
template <int VPL>
static __device__ __forceinline__ float decode(const dview &dv, const uint8_t *b, int lane,
					       const uint32_t (&pos)[VPL], float (&v)[VPL])
{
	const int d = dv.d;

	switch (dv.id) {
	case TQ_CODEC_F32: {
		const float *f = reinterpret_cast<const float *>(b);
#pragma unroll
		for (int j = 0; j < VPL; j++) {
			const int c = lane + 32 * j;
			v[j] = c < d ? f[c] : 0.0f;
		}
		return 1.0f;
	}
	case TQ_CODEC_F16: {
		const uint16_t *hp = reinterpret_cast<const uint16_t *>(b);
#pragma unroll
		for (int j = 0; j < VPL; j++) {
			const int c = lane + 32 * j;
			v[j] = c < d ? f16_to_f32(hp[c]) : 0.0f;
		}
		return 1.0f;
	}
	case TQ_CODEC_Q8:
#pragma unroll
		for (int j = 0; j < VPL; j++) {
			const int c = lane + 32 * j;
			v[j] = c < d ? (float)(int8_t)b[TQ_Q8_HEADER_BYTES + c] : 0.0f;
		}
		return ld_f32(b);
	case TQ_CODEC_Q4A: {
		const float s = f16_to_f32(ld_u16(b)), mn = f16_to_f32(ld_u16(b + 2));
#pragma unroll
		for (int j = 0; j < VPL; j++) {
			const int c = lane + 32 * j;
			v[j] = c < d ? mn + s * (float)plane_index(b, pos[j], 4, dv.pl) : 0.0f;
		}
		return 1.0f;
	}
	case TQ_CODEC_TQ3O:
	case TQ_CODEC_TQ4O: {
		/* the halves' positions are not pos[] (that is for the whole
		 * dim): computed here, on the general kernel's rarer path */
		const int h = dv.half;
		const float sa = bf16_to_f32(ld_u16(b)), sb = bf16_to_f32(ld_u16(b + 2));
#pragma unroll
		for (int j = 0; j < VPL; j++) {
			const int c = lane + 32 * j;
			if (c >= d)
				v[j] = 0.0f;
			else if (c < h)
				v[j] = sa * dv.cent[plane_index(b, plane_pos(c, h), dv.bits, dv.pl)];
			else
				v[j] = sb * dv.cent_b[plane_index(b + dv.b_off, plane_pos(c - h, h), dv.bits_b, dv.pl_b)];
		}
		return 1.0f;
	}
	default: /* tq2 / tq3 / tq4 */
#pragma unroll
		for (int j = 0; j < VPL; j++) {
			const int c = lane + 32 * j;
			v[j] = c < d ? dv.cent[plane_index(b, pos[j], dv.bits, dv.pl)] : 0.0f;
		}
		return ld_f32(b);
	}
}

/* ---- prep: qrot = scale2 * R_k q ------------------------------------------------- */

/* One row's qrot into x[0..d) (shared memory), by one warp: Hadamard or none
 * (the dense rotation is attn_prep's alone). */
static __device__ __forceinline__ void qrot_row(const struct tqc_attn_args &a, const float *q, float *x, int lane)
{
	const struct tqc_codec_desc &kc = a.kc;
	const int d = kc.dim;

	if (kc.rot_kind == ROT_HADAMARD) {
		const int n = kc.half ? kc.half : d; /* tq*o: each half its own */
		for (int c = lane; c < d; c += 32)
			x[c] = q[c] * sign_of(kc, c);
		__syncwarp();
		for (int o = 0; o < d; o += n)
			warp_fwht(x + o, n, lane);
		for (int c = lane; c < d; c += 32)
			x[c] = (x[c] * kc.inv_sqrt_dim) * a.scale2;
	} else {
		for (int c = lane; c < d; c += 32)
			x[c] = q[c] * a.scale2;
	}
	__syncwarp();
}

/* Row rr of KV head h's row block numbering (rr = i * group + g) as its
 * query row [n_q][n_q_heads]: query token i, head h * group + g. */
static __device__ __forceinline__ size_t q_row(const struct tqc_attn_args &a, uint32_t h, int rr)
{
	return (size_t)(rr / a.group) * (size_t)a.n_q_heads + (size_t)h * (size_t)a.group + (size_t)(rr % a.group);
}

__global__ void __launch_bounds__(TQC_WARPS * 32) attn_prep(const __grid_constant__ struct tqc_attn_args a)
{
	__shared__ float s_x[TQC_WARPS][TQ_DIM_MAX];
	const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
	const size_t row = (size_t)blockIdx.x * TQC_WARPS + (size_t)warp;

	if (row >= (size_t)a.n_q * (size_t)a.n_q_heads)
		return; /* the whole warp */
	const struct tqc_codec_desc &kc = a.kc;
	const int d = kc.dim;
	const float *q = a.q + row * (size_t)d;
	float *o = a.qrot + row * (size_t)d;
	float *x = s_x[warp];

	if (kc.rot_kind != ROT_DENSE) {
		qrot_row(a, q, x, lane);
		for (int c = lane; c < d; c += 32)
			o[c] = x[c];
	} else {
		for (int c = lane; c < d; c += 32)
			x[c] = q[c];
		__syncwarp();
		/* R[i][j] = mat_t[j][i]; tq*o: block-diagonal, each half n x n */
		const int n = kc.half ? kc.half : d;
		for (int i = lane; i < d; i += 32) {
			const int base = i < n ? 0 : n;
			const float *mt = base ? kc.mat_t_b : kc.mat_t;
			float acc = 0.0f;
			for (int j = 0; j < n; j++)
				acc = fmaf(mt[(size_t)j * n + (i - base)], x[base + j], acc);
			o[i] = acc * a.scale2;
		}
	}
}

/* The CTA's partial (m, l, acc) per row: its nw warps' merged (log-sum-exp),
 * written to the partials of (KV head h, rows r0.., split).  Warp w's acc of
 * row r is at acc + w * warp_stride + r * row_stride; call after a barrier
 * (it has one of its own).  Each (row, warp)'s factor 2^(m_w - M) is taken
 * once, not per coordinate; a warp that saw nothing (m_w = -inf, its acc 0)
 * has factor 0 and adds nothing to l (a NaN sum still reaches the row). */
template <int R>
static __device__ __forceinline__ void cta_partials(const struct tqc_attn_args &a, const float (*s_m)[R],
						    const float (*s_l)[R], const float *acc, int warp_stride,
						    int row_stride, int r0, int nrows, int split, uint32_t h, int nw)
{
	constexpr int NWM = TQC_MMA_WARPS_MAX > TQC_WARPS ? TQC_MMA_WARPS_MAX : TQC_WARPS;
	__shared__ float s_f[NWM][R];
	const int d = a.kc.dim;
	const size_t pbase = (size_t)h * (size_t)a.rows_pad + (size_t)r0;

	if ((int)threadIdx.x < nrows) {
		const int r = (int)threadIdx.x;
		float M = NEG_INF, L = 0.0f;
		for (int w = 0; w < nw; w++)
			M = fmaxf(M, s_m[w][r]);
		for (int w = 0; w < nw; w++) {
			const float mw = s_m[w][r], lw = s_l[w][r];
			float f = 0.0f;
			if (!(mw == NEG_INF && !isnan(lw))) {
				f = exp2f(mw - M);
				L += lw * f;
			}
			s_f[w][r] = f;
		}
		const size_t pi = (pbase + (size_t)r) * (size_t)a.n_split + (size_t)split;
		a.part_ml[2 * pi] = M;
		a.part_ml[2 * pi + 1] = L;
	}
	__syncthreads();
	for (int e = (int)threadIdx.x; e < nrows * d; e += nw * 32) {
		const int r = e / d, c = e % d;
		float A = 0.0f;
		for (int w = 0; w < nw; w++)
			A += acc[w * warp_stride + r * row_stride + c] * s_f[w][r];
		const size_t pi = (pbase + (size_t)r) * (size_t)a.n_split + (size_t)split;
		a.part_acc[pi * (size_t)d + (size_t)c] = A;
	}
}

/* ---- main: partial softmax of one row block over one split ------------------------ */

/* SV: the sparse-V build (a.sparse_v > 0); the exact one holds nothing of it */
template <int VPL, int R, bool SV>
__global__ void __launch_bounds__(TQC_WARPS * 32, 4) attn_main(const __grid_constant__ struct tqc_attn_args a)
{
	static_assert(R * VPL <= 32 && R >= 1, "q and acc stay in registers");
	__shared__ float s_acc[TQC_WARPS][R][32 * VPL];
	__shared__ float s_m[TQC_WARPS][R], s_l[TQC_WARPS][R];
	/* the codebooks: [TQC_CB_MAX], then tq*o's second half's [TQC_CB_B_MAX] */
	__shared__ float s_ck[TQC_CB_MAX + TQC_CB_B_MAX], s_cv[TQC_CB_MAX + TQC_CB_B_MAX];

	const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
	const int split = (int)blockIdx.y;
	const uint32_t h = blockIdx.z;
	const int d = a.kc.dim;
	const int r0 = (int)blockIdx.x * R;
	const int nrows = min(R, a.rows_ph - r0);
	const struct tq_page_geom g = a.geom;

	if (threadIdx.x < TQC_CB_MAX) {
		s_ck[threadIdx.x] = a.kc.centroid[threadIdx.x];
		s_cv[threadIdx.x] = a.vc.centroid[threadIdx.x];
	} else if (threadIdx.x < TQC_CB_MAX + TQC_CB_B_MAX) {
		s_ck[threadIdx.x] = a.kc.centroid_b[threadIdx.x - TQC_CB_MAX];
		s_cv[threadIdx.x] = a.vc.centroid_b[threadIdx.x - TQC_CB_MAX];
	}

	/* the rows: q in registers, keys [0, lim) visible */
	float q[R][VPL];
	uint32_t lim[R], tmax = 0;
#pragma unroll
	for (int r = 0; r < R; r++) {
		lim[r] = 0;
#pragma unroll
		for (int j = 0; j < VPL; j++)
			q[r][j] = 0.0f;
		if (r < nrows) {
			const int qi = (r0 + r) / a.group;
			const float *qr = a.qrot + q_row(a, h, r0 + r) * d;
			lim[r] = a.causal ? (uint32_t)a.q_pos[qi] + 1u : a.kv_len;
#pragma unroll
			for (int j = 0; j < VPL; j++) {
				const int c = lane + 32 * j;
				if (c < d)
					q[r][j] = qr[c];
			}
		}
		tmax = max(tmax, lim[r]);
	}
	uint32_t pos[VPL];
#pragma unroll
	for (int j = 0; j < VPL; j++) {
		const int c = lane + 32 * j;
		pos[j] = c < d ? plane_pos(c, d) : 0u;
	}
	const dview kdv = dview_of(a.kc, s_ck), vdv = dview_of(a.vc, s_cv);
	__syncthreads(); /* s_ck, s_cv */

	float m[R], l[R], acc[R][VPL];
#pragma unroll
	for (int r = 0; r < R; r++) {
		m[r] = NEG_INF;
		l[r] = 0.0f;
#pragma unroll
		for (int j = 0; j < VPL; j++)
			acc[r][j] = 0.0f;
	}

	/* sparse-V (thr = a.sparse_v > 0): a key's value is neither decoded nor added while,
	 * for every row, the weight skipped so far (sk, in l's scale: rescaled
	 * by alpha as l is) plus the key's stays within thr of the row's
	 * running sum (tq_attn.c's rule, a key at a time) */
	float *sk = nullptr; /* each warp's rows' in shared memory: no registers held */
	uint32_t n_reached = 0, n_skipped = 0;
	if constexpr (SV) { /* (only this build has the array) */
		__shared__ float s_sk[TQC_WARPS][R];
		sk = s_sk[warp];
		if (lane < R)
			sk[lane] = 0.0f;
		__syncwarp();
	}

	const uint64_t kh = tq_page_k_off(&g, h, 0), vh = tq_page_v_off(&g, h, 0);
	const uint64_t tb = (uint64_t)split * a.split_len;
	uint64_t te = tb + a.split_len;
	te = te < a.kv_len ? te : a.kv_len;
	te = te < tmax ? te : tmax;
	for (uint64_t t64 = tb + (uint64_t)warp; t64 < te; t64 += TQC_WARPS) {
		const uint32_t t = (uint32_t)t64, page = t / g.page_tokens, slot = t % g.page_tokens;
		const uint8_t *pg = a.pages[page];

		float kv[VPL];
		const float ks = decode<VPL>(kdv, pg + kh + (uint64_t)slot * g.k_block_bytes, lane, pos, kv);
		float p[R], alpha[R];
#pragma unroll
		for (int r = 0; r < R; r++) {
			p[r] = 0.0f;
			alpha[r] = 1.0f;
			if (r < nrows && t < lim[r]) { /* the same for every lane */
				float dot = 0.0f;
#pragma unroll
				for (int j = 0; j < VPL; j++)
					dot = fmaf(q[r][j], kv[j], dot);
				const float sc = warp_sum(dot) * ks;
				const float mn = fmaxf(m[r], sc); /* a NaN score leaves m */
				alpha[r] = exp2f(m[r] - mn);      /* 0 when m was -inf      */
				p[r] = exp2f(sc - mn);
				/* sc * 0: NaN for a score that is not finite */
				l[r] = l[r] * alpha[r] + p[r] + sc * 0.0f;
				m[r] = mn;
			}
		}
		if constexpr (SV) {
			bool ok = true;
			float skr[R];
#pragma unroll
			for (int r = 0; r < R; r++) {
				skr[r] = sk[r] * alpha[r];
				ok &= skr[r] + p[r] <= a.sparse_v * l[r]; /* NaN: not skipped */
			}
			/* the same in every lane (butterfly sums): said once for all */
			const bool skip = __all_sync(FULL, ok);
			n_reached++;
			__syncwarp(); /* every lane read sk */
			if (lane < R) /* lane r writes row r's (the same in every lane) */
#pragma unroll
				for (int r = 0; r < R; r++)
					if (r == lane)
						sk[r] = skr[r] + (skip ? p[r] : 0.0f);
			__syncwarp();
			if (skip) {
				n_skipped++;
#pragma unroll
				for (int r = 0; r < R; r++)
#pragma unroll
					for (int j = 0; j < VPL; j++)
						acc[r][j] *= alpha[r];
				continue;
			}
		}
		float vv[VPL];
		const float vs = decode<VPL>(vdv, pg + vh + (uint64_t)slot * g.v_block_bytes, lane, pos, vv);
#pragma unroll
		for (int r = 0; r < R; r++) {
			if (r < nrows && t < lim[r]) {
				const float w = p[r] * vs;
#pragma unroll
				for (int j = 0; j < VPL; j++)
					acc[r][j] = fmaf(w, vv[j], acc[r][j] * alpha[r]);
			}
		}
	}
	if (SV && lane == 0 && n_reached) {
		atomicAdd(&a.sv_counts[0], (unsigned long long)n_reached);
		atomicAdd(&a.sv_counts[1], (unsigned long long)n_skipped);
	}

	/* merge the 4 warps; the CTA's partial per row */
#pragma unroll
	for (int r = 0; r < R; r++) {
		if (lane == 0) {
			s_m[warp][r] = m[r];
			s_l[warp][r] = l[r];
		}
#pragma unroll
		for (int j = 0; j < VPL; j++)
			s_acc[warp][r][lane + 32 * j] = acc[r][j];
	}
	__syncthreads();
	cta_partials<R>(a, s_m, s_l, &s_acc[0][0][0], R * 32 * VPL, 32 * VPL, r0, nrows, split, h, TQC_WARPS);
}

/* ---- finish: merge the splits, normalize, rotate back ------------------------------
 * One CTA per row: the splits' (m, l) reduced by all threads (max, then the
 * sum of l 2^(m - M)), each split's weight 2^(m - M) kept in shared memory,
 * then thread c sums w_s acc_s[c] over the splits (loads of many splits in
 * flight, not one after another), and the row goes back to the original
 * frame. */

#define FIN_THREADS (TQC_WARPS * 32)

/* The CTA's reduction of v (max or sum); every thread gets the result. */
template <bool MAX>
static __device__ __forceinline__ float cta_reduce(float v, float *scratch)
{
	const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);

	v = MAX ? warp_max(v) : warp_sum(v);
	__syncthreads(); /* scratch free from an earlier call */
	if (lane == 0)
		scratch[warp] = v;
	__syncthreads();
	v = scratch[0];
	for (int w = 1; w < TQC_WARPS; w++)
		v = MAX ? fmaxf(v, scratch[w]) : v + scratch[w];
	return v;
}

/* A partial written by another CTA of the same launch (the fused finish):
 * read through L2, never a stale L1 line. */
template <bool CG>
static __device__ __forceinline__ float ld_part(const float *p)
{
#ifdef __CUDA_ARCH__
	return CG ? __ldcg(p) : *p;
#else
	return *p;
#endif
}

/* several of them (float4: a lane's 4 coordinates; float2: a split's
 * (m, l)), aligned to their size, through L2 as ld_part<true> */
template <class T>
static __device__ __forceinline__ T ld_part_v(const T *p)
{
#ifdef __CUDA_ARCH__
	return __ldcg(p);
#else
	return *p;
#endif
}

/* Row `row` (query token i, head hq) finished by the whole CTA (attn_finish)
 * or by one warp (WARP: attn_mma's fused finish, its warps finishing rows
 * side by side, the partials of other CTAs read through L2): the splits'
 * partials merged, divided by the sum, rotated back, written to out.
 * Scratch in shared memory, the group's own: s_w [TQC_SPLITS_MAX],
 * s_y [TQ_DIM_MAX], s_red [TQC_WARPS] (CTA only). */
template <bool WARP>
static __device__ void finish_row(const struct tqc_attn_args &a, size_t row, float *s_w, float *s_y, float *s_red)
{
	const int tid = WARP ? (int)(threadIdx.x & 31u) : (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int nthr = WARP ? 32 : FIN_THREADS;
	const struct tqc_codec_desc &vc = a.vc;
	const int d = vc.dim, ns = a.n_split;
	const int i = (int)(row / (size_t)a.n_q_heads), hq = (int)(row % (size_t)a.n_q_heads);
	const int h = hq / a.group, gi = hq % a.group;
	const size_t base = ((size_t)h * (size_t)a.rows_pad + (size_t)i * a.group + gi) * (size_t)ns;
	const float *ml = a.part_ml + 2 * base;
	float *o = a.out + row * (size_t)d;
	/* one warp: the first U splits' partials of the lane's first 4
	 * coordinates asked for first, so that they fly with the splits' m
	 * and l (whose first 32 come in one 8-byte load a lane, kept for the
	 * sum): two round trips to L2 where there were four */
	constexpr int U = 16;
	const int nc4 = d / 4;
	const float4 *pa = reinterpret_cast<const float4 *>(a.part_acc + base * (size_t)d);
	float4 v[U];
	float2 ml0 = make_float2(NEG_INF, 0.0f);
	if (WARP) {
#pragma unroll
		for (int u = 0; u < U; u++)
			v[u] = u < ns && lane < nc4 ? ld_part_v(pa + (size_t)u * (size_t)nc4 + lane)
						    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		if (lane < ns)
			ml0 = ld_part_v(reinterpret_cast<const float2 *>(ml) + lane);
	}

	/* a split that saw nothing has m = -inf and l = 0 (a NaN l must reach
	 * the row: a logit beyond float range) */
	float M = WARP ? ml0.x : NEG_INF;
	for (int s = WARP ? tid + 32 : tid; s < ns; s += nthr)
		M = fmaxf(M, ld_part<WARP>(ml + 2 * s));
	M = WARP ? warp_max(M) : cta_reduce<true>(M, s_red);
	float L = 0.0f;
	for (int s = tid; s < ns; s += nthr) {
		const bool kept = WARP && s == tid;
		const float m = kept ? ml0.x : ld_part<WARP>(ml + 2 * s), l = kept ? ml0.y : ld_part<WARP>(ml + 2 * s + 1);
		const bool none = m == NEG_INF && !isnan(l);
		const float w = none ? 0.0f : exp2f(m - M);
		s_w[s] = w;
		L += none ? 0.0f : l * w;
	}
	if (WARP) { /* publishes s_w */
		L = warp_sum(L);
		__syncwarp();
	} else {
		L = cta_reduce<false>(L, s_red); /* its barriers publish s_w */
	}
	/* positions are checked (0 <= q_pos < kv_len): a row sees a key unless
	 * the cache is empty (then it is not causal) */
	if (M == NEG_INF && !(a.kv_len > 0)) {
		for (int c = tid; c < d; c += nthr)
			o[c] = 0.0f;
		return;
	}
	if (!isfinite(M) || !isfinite(L) || !(L > 0.0f)) {
		for (int c = tid; c < d; c += nthr)
			o[c] = QNAN; /* a logit beyond float range */
		return;
	}
	const float inv = 1.0f / L;
	if (WARP) {
		/* one warp: a lane's 4 coordinates a 16-byte load, 16 splits'
		 * loads in flight at once (a round trip to L2 per 16 splits, not
		 * per split and coordinate group); the first 16 are in v already */
		for (int c4 = lane; c4 < nc4; c4 += 32) {
			float4 A = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			for (int s = 0; s < ns; s += U) {
				if (s > 0 || c4 != lane) {
#pragma unroll
					for (int u = 0; u < U; u++)
						v[u] = s + u < ns ? ld_part_v(pa + (size_t)(s + u) * (size_t)nc4 + c4)
								  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
				}
#pragma unroll
				for (int u = 0; u < U; u++) {
					const float w = s + u < ns ? s_w[s + u] : 0.0f;
					A.x = fmaf(w, v[u].x, A.x);
					A.y = fmaf(w, v[u].y, A.y);
					A.z = fmaf(w, v[u].z, A.z);
					A.w = fmaf(w, v[u].w, A.w);
				}
			}
			s_y[4 * c4] = A.x * inv;
			s_y[4 * c4 + 1] = A.y * inv;
			s_y[4 * c4 + 2] = A.z * inv;
			s_y[4 * c4 + 3] = A.w * inv;
		}
	} else
	for (int c = tid; c < d; c += nthr) {
		const float *pa = a.part_acc + base * (size_t)d + (size_t)c;
		float A0 = 0.0f, A1 = 0.0f, A2 = 0.0f, A3 = 0.0f;
		int s = 0;
		for (; s + 4 <= ns; s += 4) {
			A0 = fmaf(s_w[s], ld_part<WARP>(pa + (size_t)s * d), A0);
			A1 = fmaf(s_w[s + 1], ld_part<WARP>(pa + (size_t)(s + 1) * d), A1);
			A2 = fmaf(s_w[s + 2], ld_part<WARP>(pa + (size_t)(s + 2) * d), A2);
			A3 = fmaf(s_w[s + 3], ld_part<WARP>(pa + (size_t)(s + 3) * d), A3);
		}
		for (; s < ns; s++)
			A0 = fmaf(s_w[s], ld_part<WARP>(pa + (size_t)s * d), A0);
		s_y[c] = ((A0 + A1) + (A2 + A3)) * inv;
	}
	if (WARP)
		__syncwarp();
	else
		__syncthreads();
	const int n = vc.half ? vc.half : d; /* tq*o: each half rotated back by its own */
	if (vc.rot_kind == ROT_HADAMARD) {
		/* R^T y = D H (y / sqrt(d)): one warp's transform */
		if (warp == 0) {
			for (int c = lane; c < d; c += 32)
				s_y[c] *= vc.inv_sqrt_dim;
			__syncwarp();
			for (int b = 0; b < d; b += n)
				warp_fwht(s_y + b, n, lane);
			for (int c = lane; c < d; c += 32)
				o[c] = s_y[c] * sign_of(vc, c);
		}
	} else if (vc.rot_kind == ROT_DENSE) {
		/* (R^T y)_j = sum_i R[i][j] y_i */
		for (int j = tid; j < d; j += nthr) {
			const int base = j < n ? 0 : n;
			const float *mat = base ? vc.mat_b : vc.mat;
			float acc = 0.0f;
			for (int k = 0; k < n; k++)
				acc = fmaf(mat[(size_t)k * n + (j - base)], s_y[base + k], acc);
			o[j] = acc;
		}
	} else {
		for (int c = tid; c < d; c += nthr)
			o[c] = s_y[c];
	}
	if (WARP)
		__syncwarp(); /* s_w, s_y free for the warp's next row */
}

/* ---- tiled decode: pieces ------------------------------------------------------- */

/* The tiles' copies: bulk (below) on sm_90 — where they were measured
 * (BENCHMARKS 2b) — and in the emulator, else cp.async of 16 bytes by every
 * lane (sm_80, sm_100, sm_121; the emulator's second build,
 * TQC_SIMT_CP_ASYNC, runs that path).  On sm_100 and sm_121 the bulk path
 * would spill more in the tq3o / tq4o builds at d 128 (ptxas, CUDA 13.0:
 * 32-72 bytes against 20-36), and no such GPU has measured either path. */
#if (defined(TQC_SIMT) && !defined(TQC_SIMT_CP_ASYNC)) || \
	(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1000)
#define TQC_BULK 1
#else
#define TQC_BULK 0
#endif
#if !TQC_BULK
/* 16 bytes global -> shared without registers (sm_80+) */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
#ifdef __CUDA_ARCH__
	const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
#else
	memcpy(dst, src, 16);
#endif
}

static __device__ __forceinline__ void cp_async_commit(void)
{
#ifdef __CUDA_ARCH__
	asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/* wait until at most N of this thread's groups are in flight */
template <int N>
static __device__ __forceinline__ void cp_async_wait(void)
{
#ifdef __CUDA_ARCH__
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
#endif /* !TQC_BULK */

/* A tile's K and V blocks by the bulk-copy engine (sm_90: cp.async.bulk,
 * TMA without a tensor map), completing on an mbarrier of the warp's stage:
 * one lane arms the barrier with the bytes to come and issues two copies
 * (the K run, the V run), every lane waits on the stage's phase.  Against
 * 16-byte cp.async by every lane (sm_80, and before: BENCHMARKS 2b) it
 * takes the copy's address arithmetic out of the tile loop.  The emulator
 * (TQC_SIMT) runs this path: it defers each copy to the first wait on its
 * barrier, so a read of a stage before its wait sees stale bytes, and a
 * wait on a phase that is not coming aborts (on a GPU it would hang). */
#ifdef TQC_SIMT
struct tqc_mbar {
	uint32_t phase, armed, tx, n;
	struct { void *dst; const void *src; uint32_t bytes; } cp[2];
};
#else
typedef uint64_t tqc_mbar;
#endif

#if TQC_BULK
static __device__ __forceinline__ void mbar_init(tqc_mbar *b)
{
#ifdef TQC_SIMT
	memset(b, 0, sizeof(*b));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"((unsigned)__cvta_generic_to_shared(b)) : "memory");
	/* the barrier initialised before the bulk copies (async proxy) use it */
	asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
	(void)b;
#endif
}

/* generic-proxy writes to shared memory (the rotated queries, sq) ordered
 * before bulk copies into the same bytes */
static __device__ __forceinline__ void fence_proxy_async(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* one lane: arm b for `bytes`, then the copies (16-byte aligned, multiples
 * of 16 bytes) */
static __device__ __forceinline__ void mbar_expect(tqc_mbar *b, uint32_t bytes)
{
#ifdef TQC_SIMT
	if (b->armed) {
		fprintf(stderr, "simt: mbarrier armed twice in one phase\n");
		abort();
	}
	b->armed = 1, b->tx = bytes, b->n = 0;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
			     (unsigned)__cvta_generic_to_shared(b)),
		     "r"(bytes)
		     : "memory");
#else
	(void)b, (void)bytes;
#endif
}

static __device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, tqc_mbar *b)
{
#ifdef TQC_SIMT
	if (!b->armed || b->n == 2 || bytes > b->tx || (bytes & 15u) || ((uintptr_t)dst & 15u) || ((uintptr_t)src & 15u)) {
		fprintf(stderr, "simt: bulk copy of %u bytes not armed, past its barrier's bytes or misaligned\n", bytes);
		abort();
	}
	b->cp[b->n].dst = dst, b->cp[b->n].src = src, b->cp[b->n].bytes = bytes;
	b->n++;
	b->tx -= bytes;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
			     (unsigned)__cvta_generic_to_shared(dst)),
		     "l"(src), "r"(bytes), "r"((unsigned)__cvta_generic_to_shared(b))
		     : "memory");
#else
	(void)dst, (void)src, (void)bytes, (void)b;
#endif
}

/* every lane: until the phase of parity `parity` has completed */
static __device__ __forceinline__ void mbar_wait(tqc_mbar *b, uint32_t parity)
{
#ifdef TQC_SIMT
	if (b->armed) { /* the first lane to wait lands the copies */
		if (b->tx) {
			fprintf(stderr, "simt: mbarrier waited on with %u bytes never copied\n", b->tx);
			abort();
		}
		for (uint32_t i = 0; i < b->n; i++)
			memcpy(b->cp[i].dst, b->cp[i].src, b->cp[i].bytes);
		b->armed = 0;
		b->phase ^= 1u;
	}
	if ((b->phase & 1u) == parity) {
		fprintf(stderr,
			"simt: wait on an mbarrier phase that never completes (a GPU hangs): phase %u, parity %u, "
			"block (%u, %u, %u), thread %u\n",
			b->phase, parity, blockIdx.x, blockIdx.y, blockIdx.z, (unsigned)threadIdx.x);
		abort();
	}
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	const unsigned a = (unsigned)__cvta_generic_to_shared(b);
	uint32_t done;
	do {
		asm volatile("{\n\t.reg .pred p;\n\t"
			     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
			     "selp.u32 %0, 1, 0, p;\n\t}\n"
			     : "=r"(done)
			     : "r"(a), "r"(parity)
			     : "memory");
	} while (!done);
#else
	(void)b, (void)parity;
#endif
}
#endif /* TQC_BULK */

/* index bits of a tiled codec: tq2..4; q8 -> 8; the keys' tq3o / tq4o ->
 * TB_TQ3O / TB_TQ4O (attn_mma's switches) */
#define TB_TQ3O 13
#define TB_TQ4O 14
static __device__ __forceinline__ int tiled_bits(const struct tqc_codec_desc &c)
{
	return c.id == TQ_CODEC_Q8     ? 8
	       : c.id == TQ_CODEC_TQ3O ? TB_TQ3O
	       : c.id == TQ_CODEC_TQ4O ? TB_TQ4O
				       : c.bits;
}

#ifdef TQC_SIMT
#define TILED_SMEM(name) alignas(16) static uint8_t name[TQC_SIMT_DYN_SMEM]
#else
#define TILED_SMEM(name) extern __shared__ __align__(16) uint8_t name[]
#endif

/* ---- tiled decode: attn_mma ------------------------------------------------------
 *
 * attn_mma<D, NWC> (tqc_attn_tiled_ok says where it applies) reads the cache
 * the way the memory system wants it read: each of the CTA's NW warps
 * (tq_cuda_internal.h: two CTAs of 6 an SM, or one of up to 12) walks its
 * split in tiles of TQC_TILE (32) tokens, tiles w, w + NW, ... for warp w,
 * and copies the next tile's K and V blocks (two runs of 32 contiguous
 * blocks in one page, 16-byte aligned) into its own shared memory with
 * cp.async while it computes on the current one; its first tile is asked
 * for before the set-up (tables, rotated queries), so it flies meanwhile.
 * Both products run on the tensor cores as mma.sync m16n8k16 with FP16
 * inputs and FP32 accumulation (sm_80+):
 *   scores  S (16 tokens x 8 rows) += K (16 tokens x 16) Q^T;
 *   values  O^T (16 coordinates x 8 rows) += V^T (16 x 16 tokens) P^T, P the
 *           softmax weights times each token's V block scale.
 * Rows are the N dimension: TQC_TILE_ROWS (8) rows per block, those past the
 * pass's rows zero; lane (g, q) = (lane / 4, lane % 4) holds the scores and
 * the output of rows 2q and 2q + 1, so the online softmax never moves data
 * across rows.
 *
 * Decoding is a table lookup per pair of values.  An FP16 register holds
 * two values, and the order of the coordinates inside a dot product is
 * free, so a K register pairs coordinates c and c + D/2 of one token — one
 * byte in every codec (tq4 nibbles; tq2 / tq3 2-bit fields 4 bits apart and
 * 1-bit fields 4 bits apart; see pair_codes) — and a V register pairs two
 * tokens' values of one coordinate (two such nibbles side by side).  That
 * byte indexes a 256-entry table of FP16 pairs in shared memory, kept in
 * 32 copies (one per lane, 4 bytes apart: every lookup of a warp hits its
 * own bank), K's and V's side by side; one PRMT builds the address
 * (code << 8 | lane << 2) from the code byte.  q8 needs no table: int8 -> FP16 by the exponent trick
 * (0x6400 | (x ^ 0x80)) - 1152.
 *
 * Precision.  FP16 keeps 11 significant bits.  The values (V) tolerate that
 * (their errors average out); the scores do not (a logit error becomes a
 * relative weight error of the same size), so:
 *   - codebook entries are scaled by the codec's h16_scale before rounding:
 *     the host picked the scale at which the entries land closest to FP16
 *     numbers (relative error ~1e-4 at tq4, far less at tq2 / tq3; q8's
 *     integers are exact); the scale is divided out of the block scale;
 *   - queries go in two parts, hi + lo (both FP16: about 22 bits), so S =
 *     K Qh + K Ql, after scaling each row by a power of two rho that brings
 *     its largest |q| into [256, 512) (FP16's range; divided out too);
 *   - P times the V block scale is scaled by a power of two 2^-E per warp,
 *     raised as larger block scales arrive (the accumulator rescaled with
 *     the softmax's alpha), so no weight overflows FP16.
 * Non-finite scores make the row NaN as in attn_main; a row sees a key only
 * below its causal limit and the split's end. */

/* byte permute (PTX prmt): result byte i = byte (s >> 4i) & 7 of b:a */
static __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s)
{
#ifdef __CUDA_ARCH__
	return __byte_perm(a, b, s);
#else
	const uint64_t x = (uint64_t)b << 32 | a;
	uint32_t r = 0;
	for (int i = 0; i < 4; i++)
		r |= (uint32_t)(x >> (8 * ((s >> (4 * i)) & 7u)) & 0xffu) << (8 * i);
	return r;
#endif
}

/* two floats as an FP16 pair (round to nearest even), lo in the low half */
static __device__ __forceinline__ uint32_t h2pack(float lo, float hi)
{
#ifdef __CUDA_ARCH__
	uint32_t r;
	asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
	return r;
#else
	return f32_to_f16(lo) | f32_to_f16(hi) << 16;
#endif
}

static __device__ __forceinline__ uint16_t h1pack(float x)
{
#ifdef __CUDA_ARCH__
	uint16_t r;
	asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(r) : "f"(x));
	return r;
#else
	return (uint16_t)f32_to_f16(x);
#endif
}

/* the low / high half of an FP16 pair as a float */
static __device__ __forceinline__ float h2lo(uint32_t h)
{
#ifdef __CUDA_ARCH__
	float f;
	asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"((uint16_t)(h & 0xffffu)));
	return f;
#else
	return f16_to_f32(h & 0xffffu);
#endif
}

static __device__ __forceinline__ float h2hi(uint32_t h)
{
	return h2lo(h >> 16);
}

/* a - b on FP16 pairs */
static __device__ __forceinline__ uint32_t h2sub(uint32_t a, uint32_t b)
{
#ifdef __CUDA_ARCH__
	uint32_t r;
	asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
	return r;
#else
	return f32_to_f16(f16_to_f32(a & 0xffffu) - f16_to_f32(b & 0xffffu)) |
	       f32_to_f16(f16_to_f32(a >> 16) - f16_to_f32(b >> 16)) << 16;
#endif
}

/* 2^x for x <= 0 (softmax weights): the hardware's approximation, results
 * below 2^-126 flushed to 0 (exp2f adds a subnormal path) */
static __device__ __forceinline__ float ex2(float x)
{
#ifdef __CUDA_ARCH__
	float r;
	asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
	return r;
#else
	return exp2f(x);
#endif
}

/* log2 x for x > 0: the hardware's approximation (sparse-V's bound) */
static __device__ __forceinline__ float lg2(float x)
{
#ifdef __CUDA_ARCH__
	float r;
	asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
	return r;
#else
	return log2f(x);
#endif
}

/* 2^n exactly (n >= -126; 0 below) */
static __device__ __forceinline__ float pow2i(int n)
{
	return n < -126 ? 0.0f : __uint_as_float((uint32_t)(n + 127) << 23);
}

static __device__ __forceinline__ int iclamp(int x, int lo, int hi)
{
	return x < lo ? lo : x > hi ? hi : x;
}

/* floor(log2 x) of a finite x > 0 (normal) */
static __device__ __forceinline__ int ilog2f(float x)
{
	return (int)((__float_as_uint(x) >> 23) & 0xffu) - 127;
}

/* c += A B, A 16x16, B 16x8, FP16 pairs, FP32 C — PTX's m16n8k16 fragments:
 * a[0] row g cols 2q, 2q+1; a[1] row g+8; a[2] row g cols 2q+8, 2q+9;
 * a[3] row g+8 cols 2q+8, 2q+9; b0 rows 2q, 2q+1 col g; b1 rows 2q+8, 2q+9;
 * c0, c1 row g cols 2q, 2q+1; c2, c3 row g+8 (the lower index in the low
 * half).  The emulator gathers the fragments through a per-warp buffer. */
static __device__ __forceinline__ void mma_h16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#ifdef __CUDA_ARCH__
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
		     "{%0,%1,%2,%3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
	static uint32_t xa[TQC_MMA_WARPS_MAX][32][4], xb[TQC_MMA_WARPS_MAX][32][2];
	const int lane = (int)(threadIdx.x & 31u), w = (int)(threadIdx.x >> 5), g = lane >> 2, q = lane & 3;
	for (int e = 0; e < 4; e++)
		xa[w][lane][e] = a[e];
	xb[w][lane][0] = b0;
	xb[w][lane][1] = b1;
	__syncwarp();
	auto half = [](uint32_t v, int k) { return f16_to_f32(k & 1 ? v >> 16 : v & 0xffffu); };
	for (int k = 0; k < 16; k++) {
		const int qq = (k & 7) >> 1, hk = k >> 3;
		const float a0 = half(xa[w][g * 4 + qq][2 * hk], k), a8 = half(xa[w][g * 4 + qq][2 * hk + 1], k);
		const float bb0 = half(xb[w][(2 * q) * 4 + qq][hk], k), bb1 = half(xb[w][(2 * q + 1) * 4 + qq][hk], k);
		c[0] = fmaf(a0, bb0, c[0]);
		c[1] = fmaf(a0, bb1, c[1]);
		c[2] = fmaf(a8, bb0, c[2]);
		c[3] = fmaf(a8, bb1, c[3]);
	}
	__syncwarp();
#endif
}

/* The decode tables (shared memory, offset 0): row `code` at code * 256:
 * K's pair for that code in 32 copies (lane l's at 4 l), then V's. */
#define LUT_ROW 256u
#define LUT_V 128u
static_assert(TQC_MMA_LUT_BYTES == 256u * LUT_ROW, "decode tables");

/* the table entry of code byte e of w: one PRMT puts the code above the
 * lane's offset byte, lane4 = lane * 4 */
template <uint32_t OFF>
static __device__ __forceinline__ uint32_t lut(const uint8_t *tab, uint32_t w, int e, uint32_t lane4)
{
	return *reinterpret_cast<const uint32_t *>(tab + OFF + prmt(w, lane4, 0x5504u | (uint32_t)e << 4));
}

template <int N>
static __device__ __forceinline__ void ld_words(const uint8_t *p, uint32_t (&w)[N])
{
#pragma unroll
	for (int i = 0; i < N; i++)
		w[i] = reinterpret_cast<const uint32_t *>(p)[i];
}

/* The pair codes of pairs p0 .. p0 + 4N - 1 of a tq block (pair p:
 * coordinates p and p + D/2), one byte each, four to a word: bits 0-3 the
 * index of p, bits 4-7 that of p + D/2 (tq4); tq3: bits 0-1 / 4-5 the low
 * index bits, bits 2 / 6 the high bits, bits 3 / 7 other coordinates' (the
 * tables ignore them); tq2: bits 0-1 / 4-5, the rest ignored.  A B-bit tq
 * index has its low 2 (or 4) bits in the 2- (4-) bit plane of stride
 * S2 = D/4 (D/2) and tq3's high bit in the 1-bit plane of stride S1 = D/8:
 * p sits in byte p % S at bits w (p / S) of a plane of width w, and p + D/2
 * 4 bits higher.  4N divides D/8 and p0 is a multiple of 4N, so the whole
 * run shares its shifts. */
template <int D, int B, int N>
static __device__ __forceinline__ void pair_codes(const uint8_t *blk, uint32_t p0, uint32_t (&w)[N])
{
	const uint8_t *pl = blk + 4; /* the planes, after the 4-byte header */
	if (B == 4) {
		ld_words<N>(pl + p0, w);
	} else {
		constexpr uint32_t S2 = D / 4, S1 = D / 8;
		uint32_t x[N];
		ld_words<N>(pl + p0 % S2, x);
		const uint32_t s2 = 2u * (p0 / S2);
		if (B == 2) {
#pragma unroll
			for (int i = 0; i < N; i++)
				w[i] = x[i] >> s2;
		} else {
			uint32_t y[N];
			ld_words<N>(pl + S2 + p0 % S1, y);
			const uint32_t s1 = p0 / S1;
#pragma unroll
			for (int i = 0; i < N; i++)
				w[i] = ((x[i] >> s2) & 0x33333333u) | (((y[i] >> s1) << 2) & 0xccccccccu);
		}
	}
}

/* The same for a tq3o / tq4o key (n = D/2 coordinates a half): pair p is
 * the first half's coordinate p and the second half's p (coordinate p +
 * D/2), its code the first half's BA-bit index (BA = 4: tq3o, 5: tq4o) in
 * bits 0 .. BA-1 and the second half's (2 or 3 bits) above.  The first
 * half's planes: a 4-bit plane of stride n/2 (tq4o: then a 1-bit plane of
 * stride n/8); the second half's, after them: a 2-bit plane of stride n/4
 * (tq4o: then a 1-bit plane of stride n/8).  D >= 64 and p0 a multiple of 4
 * keep the four pairs of a word in one byte run of every plane. */
template <int D, int BA>
static __device__ __forceinline__ uint32_t tqo_pair_codes(const uint8_t *blk, uint32_t p0)
{
	constexpr uint32_t n = D / 2, S4 = n / 2, S2 = n / 4, S1 = n / 8;
	static_assert(S1 % 4 == 0, "four pairs in one byte run of a 1-bit plane");
	const uint8_t *pa = blk + 4, *pb = pa + n * BA / 8;
	const uint32_t *w4 = reinterpret_cast<const uint32_t *>(pa + p0 % S4);
	const uint32_t *w2 = reinterpret_cast<const uint32_t *>(pb + p0 % S2);
	uint32_t ia = (*w4 >> (4u * (p0 / S4))) & 0x0f0f0f0fu, ib = (*w2 >> (2u * (p0 / S2))) & 0x03030303u;
	if (BA == 5) {
		const uint32_t *a1 = reinterpret_cast<const uint32_t *>(pa + S4 + p0 % S1);
		const uint32_t *b1 = reinterpret_cast<const uint32_t *>(pb + S2 + p0 % S1);
		ia |= ((*a1 >> (p0 / S1)) & 0x01010101u) << 4;
		ib |= ((*b1 >> (p0 / S1)) & 0x01010101u) << 2;
	}
	return ia | ib << BA;
}

/* q8: int8 bytes e of x (low half) and y (high half) as an FP16 pair; x, y
 * already XORed with 0x80808080 */
static __device__ __forceinline__ uint32_t q8_pair(uint32_t x, uint32_t y, int e)
{
	const uint32_t u = prmt(x, y, (uint32_t)e | (uint32_t)(4 + e) << 4);
	return h2sub(prmt(u, 0x64646464u, 0x4140u), 0x64806480u); /* (1024 + x + 128) - 1152 */
}

/* The B fragments of Q^T for k-step j: hi and lo parts of rows g and pairs
 * P = q D/8 + 2 j (b0) and P + 1 (b1), in registers (D <= 128) or shared
 * memory (D = 256: [D/16][32] x 4 words). */
struct alignas(16) u32x4 {
	uint32_t x, y, z, w;
};

template <int D>
struct qfrags {
	static constexpr bool REG = D <= 128;
	uint32_t r[REG ? D / 16 : 1][4];
	const u32x4 *s;
	__device__ __forceinline__ u32x4 get(int j, int lane) const
	{
		if constexpr (REG)
			return u32x4{ r[j][0], r[j][1], r[j][2], r[j][3] };
		else
			return s[j * 32 + lane];
	}
};

/* S (tokens 16 mt + g, + 8 x rows 2q, 2q + 1) = K Q^T for both halves of
 * the tile: sc[2 mt + hi][k] (hi: token + 8).  Lane q's K registers hold
 * pairs q D/8 + 2j (cols 2q, 2q + 1) and + 1 (cols 2q + 8, 2q + 9) of k-step
 * j: code bytes 2j and 2j + 1 of its run of D/8 pairs.
 *
 * tq3o / tq4o (KB = TB_TQ3O / TB_TQ4O): a pair's low FP16 is the first
 * half's coordinate and its high one the second half's, so Q^T's fragments
 * with their high (low) halves zeroed give the first (second) half's sums
 * apart — four products a k-step instead of two, the codes decoded once —
 * and sc = their sums times each half's bf16 block scale over its table
 * scale (ia, ib: 1 / h16_scale of each half), the block scale applied here
 * (the caller's is 1). */
template <int D, int KB>
static __device__ __forceinline__ void mma_scores(const uint8_t *kt, uint32_t kb, const uint8_t *tab,
						  const qfrags<D> &qf, int lane, float ia, float ib, float (&sc)[4][2])
{
	constexpr bool KO = KB == TB_TQ3O || KB == TB_TQ4O;
	const int g = lane >> 2, q = lane & 3;
	const uint32_t lane4 = (uint32_t)lane * 4u, p0 = (uint32_t)q * (D / 8);
	float s[2][4], s2[2][4];
#pragma unroll
	for (int mt = 0; mt < 2; mt++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			s[mt][e] = s2[mt][e] = 0.0f;
#pragma unroll
	for (int jw = 0; jw < D / 32; jw++) { /* one code word: k-steps 2 jw, 2 jw + 1 */
		uint32_t cw[4], cy[4];
#pragma unroll
		for (int u = 0; u < 4; u++) { /* tokens g + 8 u */
			const uint8_t *blk = kt + (uint32_t)(g + 8 * u) * kb;
			if (KB == 8) {
				cw[u] = *reinterpret_cast<const uint32_t *>(blk + 4 + p0 + 4 * jw) ^ 0x80808080u;
				cy[u] = *reinterpret_cast<const uint32_t *>(blk + 4 + D / 2 + p0 + 4 * jw) ^ 0x80808080u;
			} else if constexpr (KO) {
				cw[u] = tqo_pair_codes<D, KB == TB_TQ4O ? 5 : 4>(blk, p0 + 4u * (uint32_t)jw);
			} else {
				uint32_t w1[1];
				pair_codes<D, KB, 1>(blk, p0 + 4u * (uint32_t)jw, w1);
				cw[u] = w1[0];
			}
		}
#pragma unroll
		for (int jj = 0; jj < 2; jj++) {
			const u32x4 b = qf.get(2 * jw + jj, lane);
#pragma unroll
			for (int mt = 0; mt < 2; mt++) {
				uint32_t a[4];
				if (KB == 8) {
					a[0] = q8_pair(cw[2 * mt], cy[2 * mt], 2 * jj);
					a[1] = q8_pair(cw[2 * mt + 1], cy[2 * mt + 1], 2 * jj);
					a[2] = q8_pair(cw[2 * mt], cy[2 * mt], 2 * jj + 1);
					a[3] = q8_pair(cw[2 * mt + 1], cy[2 * mt + 1], 2 * jj + 1);
				} else {
					a[0] = lut<0>(tab, cw[2 * mt], 2 * jj, lane4);
					a[1] = lut<0>(tab, cw[2 * mt + 1], 2 * jj, lane4);
					a[2] = lut<0>(tab, cw[2 * mt], 2 * jj + 1, lane4);
					a[3] = lut<0>(tab, cw[2 * mt + 1], 2 * jj + 1, lane4);
				}
				if constexpr (KO) { /* s: the first half's hi + lo, s2: the second's */
					mma_h16(s[mt], a, b.x & 0xffffu, b.y & 0xffffu);
					mma_h16(s[mt], a, b.z & 0xffffu, b.w & 0xffffu);
					mma_h16(s2[mt], a, b.x & 0xffff0000u, b.y & 0xffff0000u);
					mma_h16(s2[mt], a, b.z & 0xffff0000u, b.w & 0xffff0000u);
				} else {
					mma_h16(s[mt], a, b.x, b.y);
					mma_h16(s2[mt], a, b.z, b.w);
				}
			}
		}
	}
	if constexpr (KO) {
#pragma unroll
		for (int u = 0; u < 4; u++) { /* token g + 8 u: s[u / 2][2 (u % 2) + k] */
			const uint32_t hw = *reinterpret_cast<const uint32_t *>(kt + (uint32_t)(g + 8 * u) * kb);
			const float fa = __uint_as_float(hw << 16) * ia, fb = __uint_as_float(hw & 0xffff0000u) * ib;
#pragma unroll
			for (int k = 0; k < 2; k++)
				sc[u][k] = s[u >> 1][2 * (u & 1) + k] * fa + s2[u >> 1][2 * (u & 1) + k] * fb;
		}
	} else {
#pragma unroll
		for (int mt = 0; mt < 2; mt++) {
			sc[2 * mt][0] = s[mt][0] + s2[mt][0];
			sc[2 * mt][1] = s[mt][1] + s2[mt][1];
			sc[2 * mt + 1][0] = s[mt][2] + s2[mt][2];
			sc[2 * mt + 1][1] = s[mt][3] + s2[mt][3];
		}
	}
}

/* acc[i] (coordinates p = g D/16 + i (row g) and p + D/2 (row g + 8) x rows
 * 2q, 2q + 1) += V^T P^T over the tile's 32 tokens.  k-step ks takes tokens
 * 16 ks + 2q, + 1 (cols 2q, 2q + 1) and + 8, + 9: their pair codes merged
 * nibble by nibble into token-pair codes.  pw: P as FP16 [8 rows][TILE]. */
template <int D, int VB>
static __device__ __forceinline__ void mma_values(const uint8_t *vt, uint32_t vb, const uint8_t *tab,
						  const uint16_t *pw, int lane, float (&acc)[D / 16][4])
{
	constexpr int NW = D / 64; /* code words per token: D/16 pairs */
	const int g = lane >> 2, q = lane & 3;
	const uint32_t lane4 = (uint32_t)lane * 4u, p0 = (uint32_t)g * (D / 16);
#pragma unroll
	for (int ks = 0; ks < 2; ks++) {
		const uint32_t *pr = reinterpret_cast<const uint32_t *>(pw + g * TQC_TILE + 16 * ks);
		const uint32_t b0 = pr[q], b1 = pr[q + 4];
		const int t0 = 16 * ks + 2 * q;
		const uint8_t *bl[4] = { vt + (uint32_t)t0 * vb, vt + (uint32_t)(t0 + 1) * vb,
					 vt + (uint32_t)(t0 + 8) * vb, vt + (uint32_t)(t0 + 9) * vb };
		if (VB == 8) {
#pragma unroll
			for (int kw = 0; kw < NW; kw++) {
				uint32_t lo[4], hi[4];
#pragma unroll
				for (int u = 0; u < 4; u++) {
					lo[u] = *reinterpret_cast<const uint32_t *>(bl[u] + 4 + p0 + 4 * kw) ^ 0x80808080u;
					hi[u] = *reinterpret_cast<const uint32_t *>(bl[u] + 4 + D / 2 + p0 + 4 * kw) ^
						0x80808080u;
				}
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const uint32_t a[4] = { q8_pair(lo[0], lo[1], e), q8_pair(hi[0], hi[1], e),
								q8_pair(lo[2], lo[3], e), q8_pair(hi[2], hi[3], e) };
					mma_h16(acc[4 * kw + e], a, b0, b1);
				}
			}
		} else {
			uint32_t x[4][NW];
#pragma unroll
			for (int u = 0; u < 4; u++)
				pair_codes<D, VB, NW>(bl[u], p0, x[u]);
#pragma unroll
			for (int kw = 0; kw < NW; kw++) {
				/* token-pair codes: low nibble the first token's index */
				const uint32_t l01 = (x[0][kw] & 0x0f0f0f0fu) | ((x[1][kw] << 4) & 0xf0f0f0f0u);
				const uint32_t h01 = ((x[0][kw] >> 4) & 0x0f0f0f0fu) | (x[1][kw] & 0xf0f0f0f0u);
				const uint32_t l23 = (x[2][kw] & 0x0f0f0f0fu) | ((x[3][kw] << 4) & 0xf0f0f0f0u);
				const uint32_t h23 = ((x[2][kw] >> 4) & 0x0f0f0f0fu) | (x[3][kw] & 0xf0f0f0f0u);
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const uint32_t a[4] = { lut<LUT_V>(tab, l01, e, lane4), lut<LUT_V>(tab, h01, e, lane4),
								lut<LUT_V>(tab, l23, e, lane4), lut<LUT_V>(tab, h23, e, lane4) };
					mma_h16(acc[4 * kw + e], a, b0, b1);
				}
			}
		}
	}
}

/* max or sum over the 8 lanes of a row pair (lanes q, q + 4, ..., q + 28) */
static __device__ __forceinline__ float group_max(float v)
{
	v = fmaxf(v, __shfl_xor_sync(FULL, v, 4));
	v = fmaxf(v, __shfl_xor_sync(FULL, v, 8));
	return fmaxf(v, __shfl_xor_sync(FULL, v, 16));
}

static __device__ __forceinline__ float group_sum(float v)
{
	v += __shfl_xor_sync(FULL, v, 4);
	v += __shfl_xor_sync(FULL, v, 8);
	return v + __shfl_xor_sync(FULL, v, 16);
}

/* ---- phase clocks (TQC_PHASES builds only: tq_cuda.h "profiling") ---------------
 * PH_AT(f): thread 0 stamps clock64 into its CTA's record's field f (at a
 * barrier every warp passes); ph_exit: each warp's lane 0 at its exit.
 * Without TQC_PHASES none of this exists (the builds the daemon runs). */
#ifdef TQC_PHASES
__device__ struct tqc_phase_rec *tqc_ph_recs; /* NULL: disarmed */
__device__ uint32_t tqc_ph_max;

static __device__ __forceinline__ unsigned long long ph_gtime(void)
{
#ifdef TQC_SIMT
	return (unsigned long long)clock64();
#else
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
#endif
}

static __device__ __forceinline__ uint32_t ph_smid(void)
{
#ifdef TQC_SIMT
	return 0u;
#else
	uint32_t s;
	asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
	return s;
#endif
}

/* this CTA's record, or NULL (disarmed, or past the records) */
static __device__ __forceinline__ struct tqc_phase_rec *ph_rec(void)
{
	const uint32_t i = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
	return tqc_ph_recs && i < tqc_ph_max ? tqc_ph_recs + i : nullptr;
}

static __device__ __forceinline__ void ph_exit(struct tqc_phase_rec *ph)
{
	if (ph && (threadIdx.x & 31u) == 0u) {
		atomicMax(reinterpret_cast<unsigned long long *>(&ph->c_end), (unsigned long long)clock64());
		atomicMax(reinterpret_cast<unsigned long long *>(&ph->gt_end), ph_gtime());
	}
}
#define PH_AT(f)                                                  \
	do {                                                      \
		if (ph && threadIdx.x == 0)                       \
			ph->f = (uint64_t)clock64();              \
	} while (0)
#define PH_EXIT() ph_exit(ph)
#else
#define PH_AT(f) do { } while (0)
#define PH_EXIT() do { } while (0)
#endif

/* NWC: the warps per CTA as a constant, TQC_MMA_WARPS_PAIR for two CTAs an
 * SM (as many registers as that allows), or 0: a.mma_warps, one CTA an SM
 * (mma_kernel picks).  KO: keys tq3o / tq4o (1) or tq2..tq4 / q8 (0), a
 * build each, so that neither's tile loop carries the other's code.  SV:
 * sparse-V (a.sparse_v > 0), a build of its own too, so that the exact
 * builds' code is what it was before sparse-V (the same SASS) and holds no
 * register for it. */

#define MMA_BOUNDS __launch_bounds__(32 * (NWC ? NWC : D > 128 ? 8 : TQC_MMA_WARPS_MAX), NWC ? 2 : 1)

template <int D, int NWC, int KO, bool SV>
__global__ void MMA_BOUNDS attn_mma(const __grid_constant__ struct tqc_attn_args a)
{
	constexpr int R = TQC_TILE_ROWS; /* the mma's N */
	/* TQC_MMA_WARPS_MIN .. tqc_attn_mma_warps_max(D): attend_args_ok */
	const int NW = NWC ? NWC : a.mma_warps;
	constexpr bool ko = KO != 0; /* keys tq3o / tq4o (mma_ko chose this build) */
	static_assert(R == 8, "rows are the N of m16n8k16");
	TILED_SMEM(smem);
	__shared__ float s_m[NWC ? NWC : TQC_MMA_WARPS_MAX][R], s_l[NWC ? NWC : TQC_MMA_WARPS_MAX][R];
#if TQC_BULK
	/* each warp's stages' barriers */
	__shared__ tqc_mbar s_bar[NWC ? NWC : TQC_MMA_WARPS_MAX][TQC_MMA_STAGES];
#endif
	/* with cta_partials' s_f, s_rho and s_bad, s_last */
	static_assert(sizeof(s_m) + sizeof(s_l) + (TQC_BULK ? sizeof(uint64_t) * (NWC ? NWC : TQC_MMA_WARPS_MAX) * TQC_MMA_STAGES : 0) +
				      sizeof(float) * TQC_MMA_WARPS_MAX * R + 2 * sizeof(float) * R + 16 <=
			      (NWC ? TQC_MMA_STATIC_SMEM : TQC_MMA_STATIC_SMEM_ONE),
		      "static shared memory");

	const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
	const int g = lane >> 2, q = lane & 3;
	const int split = (int)blockIdx.y;
	const uint32_t h = blockIdx.z;
	const int r0 = (int)blockIdx.x * R;
	const int nrows = min(R, a.rows_ph - r0);
	const struct tq_page_geom geo = a.geom;
#ifdef TQC_PHASES
	struct tqc_phase_rec *const ph = ph_rec();
	if (ph && threadIdx.x == 0) {
		ph->gt_entry = ph_gtime();
		ph->c_entry = (uint64_t)clock64();
		ph->c_loop_first = ~(uint64_t)0; /* before the barriers: the warps' atomicMin */
		ph->smid = ph_smid();
		ph->grid[0] = gridDim.x, ph->grid[1] = gridDim.y, ph->grid[2] = gridDim.z;
		ph->warps = (uint32_t)NW;
		ph->written = 1u;
	}
#endif
	const uint32_t kb = geo.k_block_bytes, vb = geo.v_block_bytes, P = geo.page_tokens;
	const uint32_t stage_bytes = TQC_TILE * (kb + vb);
	const uint8_t *tab = smem;                                               /* the tables */
	uint8_t *qfs = smem + TQC_MMA_LUT_BYTES;                                 /* D = 256: Q^T */
	uint16_t *pw_all = reinterpret_cast<uint16_t *>(qfs + TQC_MMA_QF_BYTES(D));
	uint16_t *pw = pw_all + warp * R * TQC_TILE;                             /* this warp's [R][TILE] */
	uint8_t *stages = reinterpret_cast<uint8_t *>(pw_all + NW * R * TQC_TILE); /* all warps' */
	constexpr int NST = TQC_MMA_STAGES;
	static_assert(NST >= 2, "stages: one computed on, the rest in flight");
	uint8_t *stage0 = stages + (size_t)warp * NST * stage_bytes;                      /* this warp's */
	const int kbits = tiled_bits(a.kc), vbits = tiled_bits(a.vc);

	/* First of all, the loads the set-up would otherwise wait on, so that
	 * they fly during the tables' fill: each row's causal limit (lane r:
	 * row r's), this warp's rows' queries (rows w, w + NW: lane l holds
	 * coordinates l + 32 e) and the page of its first tile.  The split's
	 * tiles (n_fetch) ignore the rows' limits, not known yet: a tile past
	 * them (causal prefill only) is fetched and not used. */
	uint32_t my_lim = 0;
	if (lane < nrows)
		my_lim = a.causal ? (uint32_t)a.q_pos[(r0 + lane) / a.group] + 1u : a.kv_len;
	constexpr int QE = D / 32, QR = (R + TQC_MMA_WARPS_MIN - 1) / TQC_MMA_WARPS_MIN; /* rows a warp rotates, at most */
	float qv[QR][QE];
#pragma unroll
	for (int k = 0; k < QR; k++) {
		const int r = warp + k * NW;
#pragma unroll
		for (int e = 0; e < QE; e++)
			qv[k][e] = 0.0f;
		if (r < nrows) {
			const float *qp = a.q + q_row(a, h, r0 + r) * D;
#pragma unroll
			for (int e = 0; e < QE; e++)
				qv[k][e] = qp[lane + 32 * e];
		}
	}
	const uint64_t kh = tq_page_k_off(&geo, h, 0), vh = tq_page_v_off(&geo, h, 0);
	const uint32_t tb = (uint32_t)split * a.split_len;
	const uint32_t te0 = a.kv_len - tb < a.split_len ? a.kv_len : tb + a.split_len;
	const uint32_t n_fetch = te0 > tb ? (te0 - tb + TQC_TILE - 1) / TQC_TILE : 0;

	/* the next tile to fetch (f_i): its page (f_pi, its base loaded a tile
	 * ahead) and slot, advanced by NW tiles a step (no division per tile) */
	uint32_t f_i = (uint32_t)warp;
	uint32_t f_pi = (tb + f_i * TQC_TILE) / P, f_slot = (tb + f_i * TQC_TILE) % P;
	const uint8_t *f_pg = f_i < n_fetch ? a.pages[f_pi] : nullptr;
	auto advance = [&](uint32_t n) {
		f_i += NW;
		for (f_slot += NW * TQC_TILE; f_slot >= P; f_slot -= P)
			f_pi++;
		if (f_i < n)
			f_pg = a.pages[f_pi];
	};
#if TQC_BULK
	/* bulk copies: stage st's barrier, its phase's parity (bit st of
	 * phase) and whether a copy into it is in flight (bit st of busy) */
	tqc_mbar *bar = s_bar[warp];
	uint32_t phase = 0u, busy = 0u;
	if (lane == 0)
		for (int s = 0; s < NST; s++)
			mbar_init(&bar[s]);
	__syncwarp();
	auto fetch = [&](int st, uint32_t n) {
		if (f_i < n) {
			uint8_t *dst = stage0 + (size_t)st * stage_bytes;
			if (lane == 0) {
				mbar_expect(&bar[st], stage_bytes);
				bulk_copy(dst, f_pg + kh + (uint64_t)f_slot * kb, TQC_TILE * kb, &bar[st]);
				bulk_copy(dst + TQC_TILE * kb, f_pg + vh + (uint64_t)f_slot * vb, TQC_TILE * vb, &bar[st]);
			}
			__syncwarp(); /* armed before any lane waits on it */
			busy |= 1u << st;
		}
		advance(n);
	};
	auto landed = [&](int st) { /* stage st's copy (every lane) */
		mbar_wait(&bar[st], (phase >> st) & 1u);
		phase ^= 1u << st;
		busy &= ~(1u << st);
	};
#else
	/* one cp.async group per step, empty past the tiles (n); a tile's K
	 * blocks and V blocks are one run of 16-byte chunks in the stage */
	const uint32_t n_k16 = 2u * kb, n_16 = 2u * (kb + vb); /* chunks: TQC_TILE blocks = 2 x block bytes */
	auto fetch = [&](int st, uint32_t n) {
		if (f_i < n) {
			uint8_t *dst = stage0 + (size_t)st * stage_bytes;
			const uint8_t *ks = f_pg + kh + (uint64_t)f_slot * kb;
			const uint8_t *vs = f_pg + vh + (uint64_t)f_slot * vb - 16u * n_k16; /* + 16 j, j >= n_k16 */
			for (uint32_t j = (uint32_t)lane; j < n_16; j += 32)
				cp_async16(dst + 16u * j, (j < n_k16 ? ks : vs) + 16u * j);
		}
		cp_async_commit();
		advance(n);
	};
#endif

	/* the codebooks times their FP16 scales, for the tables: K's in
	 * s_cb[0..32) (tq3o / tq4o: the first half's), the second half's of
	 * tq3o / tq4o in s_cb[32..40), V's in s_cb[40..56) — in the weights'
	 * space, not used before the tiles (published by the barrier below) */
	float *s_cb = reinterpret_cast<float *>(pw_all);
	static_assert(TQC_MMA_WARPS_MIN * R * TQC_TILE * 2 >= 56 * sizeof(float), "codebooks in the weights' space");
	static_assert(TQC_CB_MAX == 32 && TQC_CB_B_MAX == 8, "codebook copies");
	if (threadIdx.x < 56) {
		const int i = (int)threadIdx.x;
		s_cb[i] = i < 32 ? a.kc.centroid[i] * a.kc.h16_scale
			  : i < 40 ? a.kc.centroid_b[i - 32] * a.kc.h16_scale_b
				   : a.vc.centroid[(i - 40) & 15] * a.vc.h16_scale;
	}
	if (warp != NW - 1)
		fetch(0, n_fetch);
	/* this warp's rows' qrot = scale2 R_k q (Hadamard or none), rotated in
	 * registers (strides below 32 by shuffles), into sq [R][SQS] — in the
	 * last warp's stages (it fits: attend_args_ok), so the other warps'
	 * first tiles can fly; the padded stride spreads the fragments' loads
	 * over the banks — with each row's scale rho = 2^k bringing its largest
	 * |q| into [256, 512) (1 for a zero row; a row with a non-finite q is
	 * NaN: s_bad).  Every warp runs QR slots whole (rows past R on zeros,
	 * not stored): no shuffle sits under a branch. */
	constexpr int SQS = D + 4;
	float *sq = reinterpret_cast<float *>(stages + (size_t)(NW - 1) * NST * stage_bytes);
	__shared__ float s_rho[R];
	__shared__ int s_bad[R];
	const bool had = a.kc.rot_kind == ROT_HADAMARD;
	const int qh_stop = ko ? QE / 2 : QE; /* tq3o / tq4o: each half its own transform */
#pragma unroll
	for (int k = 0; k < QR; k++) {
		const int r = warp + k * NW;
		float x[QE];
#pragma unroll
		for (int e = 0; e < QE; e++)
			x[e] = qv[k][e] * sign_of(a.kc, lane + 32 * e);
		reg_fwht<QE>(x, lane, qh_stop); /* unused without a rotation: no branch around it */
		float mx = 0.0f;
		bool bad = false;
#pragma unroll
		for (int e = 0; e < QE; e++) {
			x[e] = had ? (x[e] * a.kc.inv_sqrt_dim) * a.scale2 : qv[k][e] * a.scale2;
			bad |= !isfinite(x[e]);
			mx = fmaxf(mx, fabsf(x[e]));
		}
		mx = __uint_as_float(__reduce_max_sync(FULL, __float_as_uint(mx))); /* mx >= 0: ordered as bits */
		bad = __any_sync(FULL, bad);
		if (r < R) {
#pragma unroll
			for (int e = 0; e < QE; e++)
				sq[r * SQS + lane + 32 * e] = x[e];
			if (lane == 0) {
				s_rho[r] = bad || !(mx > 0.0f) ? 1.0f
							   : pow2i(iclamp(8 - ilog2f(fmaxf(mx, 0x1p-126f)), -126, 126));
				s_bad[r] = bad;
			}
		}
	}
	__syncthreads(); /* sq, s_rho, s_bad, s_cb */
	PH_AT(c_qrot);
	{ /* the tables: 16 bytes (4 of a row's 32 copies) a store: K's copies
	   * of a code's row, then V's; entry = (cb[lo nibble], cb[hi nibble])
	   * as FP16, the nibbles masked to the codec's index bits; tq3o / tq4o
	   * keys: (first half's cb[code's low 4 / 5 bits], second half's
	   * cb[the bits above]) (tqo_pair_codes) */
		const uint32_t ka = ko ? (uint32_t)a.kc.bits : 4u; /* the second entry's shift */
		const uint32_t mk = (1u << min(a.kc.bits, ko ? 5 : 4)) - 1u, mv = (1u << min(a.vc.bits, 4)) - 1u;
		const uint32_t mkb = ko ? (1u << a.kc.bits_b) - 1u : mk, okb = ko ? 32u : 0u;
		const bool k8 = tiled_bits(a.kc) == 8, v8 = tiled_bits(a.vc) == 8;
		u32x4 *t = reinterpret_cast<u32x4 *>(smem);
		constexpr int per_row = LUT_ROW / 16;
		for (int k = (int)threadIdx.x; k < 256 * per_row; k += NW * 32) {
			const uint32_t c = (uint32_t)(k / per_row);
			const bool vside = (k % per_row) >= per_row / 2;
			uint32_t v = 0u;
			if (vside && !v8)
				v = h2pack(s_cb[40u + (c & mv)], s_cb[40u + ((c >> 4) & mv)]);
			else if (!vside && !k8)
				v = h2pack(s_cb[c & mk], s_cb[okb + ((c >> ka) & mkb)]);
			t[k] = u32x4{ v, v, v, v };
		}
	}
	const float rho = s_rho[g];
	/* Q^T's fragments for lane (g, q): row g, pairs q D/8 + 2j (+ 1) */
	qfrags<D> qf;
#pragma unroll
	for (int j = 0; j < D / 16; j++) {
		const int pa = q * (D / 8) + 2 * j;
		const float *row = sq + g * SQS;
		const float v[4] = { row[pa] * rho, row[pa + D / 2] * rho, row[pa + 1] * rho, row[pa + 1 + D / 2] * rho };
		const uint32_t h0 = h2pack(v[0], v[1]), h1 = h2pack(v[2], v[3]);
		const uint32_t l0 = h2pack(v[0] - h2lo(h0), v[1] - h2hi(h0));
		const uint32_t l1 = h2pack(v[2] - h2lo(h1), v[3] - h2hi(h1));
		if constexpr (qfrags<D>::REG) {
			qf.r[j][0] = h0, qf.r[j][1] = h1, qf.r[j][2] = l0, qf.r[j][3] = l1;
		} else if (warp == 0) {
			reinterpret_cast<u32x4 *>(qfs)[j * 32 + lane] = u32x4{ h0, h1, l0, l1 };
		}
	}
	qf.s = reinterpret_cast<const u32x4 *>(qfs);
	/* this lane's rows 2q, 2q + 1: 1 / (K table scale * rho), NaN for a bad
	 * row (tq3o / tq4o: 1 / rho; mma_scores divides each half's table scale
	 * out, and applies the block scales) */
	const float ia = 1.0f / a.kc.h16_scale, ib = ko ? 1.0f / a.kc.h16_scale_b : 1.0f;
	float kinv[2];
	for (int k = 0; k < 2; k++)
		kinv[k] = s_bad[2 * q + k] ? QNAN : 1.0f / ((ko ? 1.0f : a.kc.h16_scale) * s_rho[2 * q + k]);
	/* keys [0, lim) visible to each row (rows past nrows: none) */
	const uint32_t lim[2] = { __shfl_sync(FULL, my_lim, 2 * q), __shfl_sync(FULL, my_lim, 2 * q + 1) };
	uint32_t tmax = my_lim; /* lanes 0 .. R - 1's largest, in every lane */
	for (int o = 1; o < R; o <<= 1)
		tmax = max(tmax, __shfl_xor_sync(FULL, tmax, o));
	tmax = __shfl_sync(FULL, tmax, 0);
	__syncthreads(); /* the tables, Q^T in shared memory; sq is free */
	PH_AT(c_tables);
	if (warp == NW - 1) {
#if TQC_BULK
		fence_proxy_async(); /* sq's stores before the copy over them */
#endif
		fetch(0, n_fetch);
	}
	const uint32_t te = te0 < tmax ? te0 : tmax;
	const uint32_t n_tile = te > tb ? (te - tb + TQC_TILE - 1) / TQC_TILE : 0;
#ifdef TQC_PHASES
	if (ph && threadIdx.x == 0)
		ph->tiles = n_tile;
#endif
	const uint32_t lim_e[2] = { lim[0] < te ? lim[0] : te, lim[1] < te ? lim[1] : te }; /* keys [0, lim_e) seen */

	/* the online softmax; acc holds sum p * vscale * 2^-E, l the lane's
	 * tokens' share of the row's sum */
	float m[2] = { NEG_INF, NEG_INF }, l[2] = { 0.0f, 0.0f }, acc[D / 16][4];
	int E = -126;
#pragma unroll
	for (int i = 0; i < D / 16; i++)
		acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

	/* sparse-V (thr = a.sparse_v > 0): a tile's values are neither decoded
	 * nor added while, for each of the 8 rows, the weight this warp skipped
	 * so far (sk: the row's, in every lane of its row pair's group;
	 * rescaled by alpha as l is) plus the tile's stays within
	 *     thr/2 x the warp's running sum + thr/(2 NW) x B,
	 * B a lower bound of the CTA's sum.  Both terms only grow, so at the
	 * end the NW warps skipped at most thr/2 of the sum of their sums plus
	 * NW x thr/(2 NW) of the CTA's: thr of the row's weight in this split,
	 * as tq_attn.c's rule (a warp's tile for its chunk; the split merge
	 * keeps the bound).  A warp's own sum alone would let it skip only
	 * what is small beside the tiles it walks (every NW-th), which rarely
	 * hold a sharp row's peaks.  B is a snapshot: at the iterations 0, 1,
	 * 3, 7, .. that every warp has, each warp publishes per row log2 of
	 * its weight (m + log2 l) in s_m or s_l in turn (free until the
	 * partials; a warp that reads one snapshot cannot be overtaken by a
	 * warp writing the next into the same array: the barrier between),
	 * and until the next snapshot each tile sums the last one's terms in
	 * the warp's scale (no register held across the tiles: the tq3o /
	 * tq4o builds have none to spare).  Taken at barriers, so the skips,
	 * and the bits, are the same every call.  B takes 0.999 of it, for the
	 * approximate log2 and 2^x, each term at most 2^64 of the warp's scale
	 * (a lower bound still, and finite); a NaN (a bad row) blocks every
	 * skip of its warps. */
	float sk[2] = { 0.0f, 0.0f };
	uint32_t n_skipped = 0; /* the tiles reached: the loop's count */

	uint32_t i = (uint32_t)warp;
	int st = 0;
	for (int s = 1; s < NST - 1; s++) /* stage 0's is in flight */
		fetch(s, n_tile);
	for (; i < n_tile; i += NW) {
		fetch(st == 0 ? NST - 1 : st - 1, n_tile); /* tile i + (NST - 1) NW */
#if TQC_BULK
		landed(st);
#else
		cp_async_wait<NST - 1>();
#endif
		__syncwarp();
#ifdef TQC_PHASES
		if (i == 0u)
			PH_AT(c_tile1); /* warp 0's first tile */
#endif

		const uint8_t *kt = stage0 + (size_t)st * stage_bytes, *vt = kt + TQC_TILE * kb;
		const uint32_t t0 = tb + i * TQC_TILE;
		/* scores of tokens g + 8u (sc[u]) for rows 2q, 2q + 1 */
		float sc[4][2];
		if constexpr (ko) {
			if (kbits == TB_TQ3O)
				mma_scores<D, TB_TQ3O>(kt, kb, tab, qf, lane, ia, ib, sc);
			else
				mma_scores<D, TB_TQ4O>(kt, kb, tab, qf, lane, ia, ib, sc);
		} else {
			switch (kbits) {
			case 2: mma_scores<D, 2>(kt, kb, tab, qf, lane, ia, ib, sc); break;
			case 3: mma_scores<D, 3>(kt, kb, tab, qf, lane, ia, ib, sc); break;
			case 4: mma_scores<D, 4>(kt, kb, tab, qf, lane, ia, ib, sc); break;
			default: mma_scores<D, 8>(kt, kb, tab, qf, lane, ia, ib, sc); break;
			}
		}
		/* a token's blocks past what a row sees (past the split, or the
		 * cache, or its causal limit) may be stale bytes: they count for
		 * nothing, not even the weights' scale */
		float vs[4], vmax = 0.0f;
		bool vis[4][2];
		uint32_t nonfin = 0;
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const uint32_t tt = (uint32_t)(g + 8 * u), t = t0 + tt;
			const float ks = ko ? 1.0f : __uint_as_float(*reinterpret_cast<const uint32_t *>(kt + tt * kb));
			vs[u] = __uint_as_float(*reinterpret_cast<const uint32_t *>(vt + tt * vb));
#pragma unroll
			for (int k = 0; k < 2; k++) {
				vis[u][k] = t < lim_e[k];
				sc[u][k] *= ks * kinv[k];
				nonfin |= vis[u][k] && !isfinite(sc[u][k]);
			}
			if (vis[u][0] || vis[u][1])
				vmax = fmaxf(vmax, fabsf(vs[u]));
		}
		/* the weights' scale: 2^-E with every p * |vscale| 2^-E < 2^15,
		 * over the tokens the lane's row pair sees (lanes q, q + 4, ...:
		 * E is the row pair's, as are the weights and sums it scales) */
		vmax = group_max(vmax);
		const int En = vmax > 0.0f && isfinite(vmax) ? iclamp(ilog2f(vmax) - 14, E, 113) : E;
		const float eshift = pow2i(E - En), vsc = pow2i(-En);
		E = En;
		float vsv[4];
#pragma unroll
		for (int u = 0; u < 4; u++)
			vsv[u] = vs[u] * vsc;
		/* a visible score that is not finite (a logit beyond float range)
		 * makes its row NaN: rare, so looked for per row only when some
		 * lane saw one */
		const bool any_bad = __any_sync(FULL, nonfin != 0u);
		float fac[2], alpha2[2], ps2[2];
#pragma unroll
		for (int k = 0; k < 2; k++) {
			bool ok[4];
			uint32_t badl = 0;
#pragma unroll
			for (int u = 0; u < 4; u++)
				ok[u] = vis[u][k];
			if (any_bad) {
				uint32_t b = 0;
#pragma unroll
				for (int u = 0; u < 4; u++) {
					b |= ok[u] && !isfinite(sc[u][k]);
					ok[u] = ok[u] && isfinite(sc[u][k]);
				}
				/* any lane of the row pair (lanes q, q + 4, ...) */
				badl = (__ballot_sync(FULL, b) >> q) & 0x11111111u;
			}
			float mx = NEG_INF;
#pragma unroll
			for (int u = 0; u < 4; u++)
				mx = fmaxf(mx, ok[u] ? sc[u][k] : NEG_INF);
			const float mn = fmaxf(m[k], group_max(mx));
			const float alpha = mn == NEG_INF ? 1.0f : ex2(m[k] - mn);
			float ps = 0.0f;
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const float p = ok[u] ? ex2(sc[u][k] - mn) : 0.0f;
				ps += p;
				pw[(2 * q + k) * TQC_TILE + g + 8 * u] = h1pack(ok[u] ? p * vsv[u] : 0.0f);
			}
			/* a visible score that is not finite makes the row NaN; l is
			 * this lane's share of the sum (alpha is the row's: the
			 * shares add up at the end) */
			l[k] = badl ? QNAN : l[k] * alpha + ps;
			m[k] = mn;
			fac[k] = alpha * eshift;
			alpha2[k] = alpha;
			ps2[k] = ps;
		}
		bool skip = false;
		if constexpr (SV) {
			const float thr_w = 0.5f * a.sparse_v, thr_b = 0.4995f * a.sparse_v / (float)NW;
			bool ok = true;
			float cm[2], lr[2];
#pragma unroll
			for (int k = 0; k < 2; k++) { /* the row's sums: its group's shares */
				cm[k] = group_sum(ps2[k]);
				lr[k] = group_sum(l[k]); /* every lane: no shuffle under a branch */
			}
			/* this warp's iteration, and the snapshot it reads: the last
			 * taken (n_all: the iterations every warp has) */
			const uint32_t it = (i - (uint32_t)warp) / (uint32_t)NW, n_all = n_tile / (uint32_t)NW;
			const uint32_t last = it < n_all ? it : n_all - 1u; /* n_all 0: no snapshot (b = 0) */
			/* snapshot k, taken at iteration 2^k - 1, in s_m (k even) or s_l */
			float (*pub)[R] = ((31 - __clz(last + 1u)) & 1) ? s_l : s_m;
			if ((it & (it + 1u)) == 0u && it < n_all) { /* 0, 1, 3, 7..: every warp has it */
#pragma unroll
				for (int k = 0; k < 2; k++)
					if (g == 0)
						pub[warp][2 * q + k] = lr[k] > 0.0f ? m[k] + lg2(lr[k])
									: lr[k] == 0.0f ? NEG_INF : QNAN;
				__syncthreads();
			}
#pragma unroll
			for (int k = 0; k < 2; k++) {
				float b = 0.0f;
				if (n_all) /* 2^-inf = 0; each term at most 2^64, finite; NaN stays */
					for (int j = 0; j < NW; j++) {
						const float x = pub[j][2 * q + k] - m[k];
						b += ex2(x > 64.0f ? 64.0f : x);
					}
				sk[k] *= alpha2[k];
				/* a row this warp saw nothing of (m -inf: no weight here) never
				 * holds a skip back; a NaN (bad row, or bound) always does */
				ok &= m[k] == NEG_INF || sk[k] + cm[k] <= thr_w * lr[k] + thr_b * b;
			}
			skip = __all_sync(FULL, ok);
			if (skip) {
				n_skipped++;
				sk[0] += cm[0];
				sk[1] += cm[1];
			}
		}
		if (__any_sync(FULL, fac[0] != 1.0f || fac[1] != 1.0f)) {
#pragma unroll
			for (int ii = 0; ii < D / 16; ii++) {
				acc[ii][0] *= fac[0];
				acc[ii][2] *= fac[0];
				acc[ii][1] *= fac[1];
				acc[ii][3] *= fac[1];
			}
		}
		if (!skip) {
			__syncwarp(); /* pw */
			switch (vbits) {
			case 2: mma_values<D, 2>(vt, vb, tab, pw, lane, acc); break;
			case 3: mma_values<D, 3>(vt, vb, tab, pw, lane, acc); break;
			case 4: mma_values<D, 4>(vt, vb, tab, pw, lane, acc); break;
			default: mma_values<D, 8>(vt, vb, tab, pw, lane, acc); break;
			}
		}
		__syncwarp(); /* the stage and pw are free again */
		st = st == NST - 1 ? 0 : st + 1;
	}
#if TQC_BULK
	/* copies still in flight (tiles fetched past the rows' limits) land
	 * before the stages take the partials */
	for (int s = 0; s < NST; s++)
		if (busy & (1u << s))
			landed(s);
	__syncwarp();
#else
	cp_async_wait<0>();
#endif
#ifdef TQC_PHASES
	if (ph && lane == 0) {
		const unsigned long long t = (unsigned long long)clock64();
		atomicMin(reinterpret_cast<unsigned long long *>(&ph->c_loop_first), t);
		atomicMax(reinterpret_cast<unsigned long long *>(&ph->c_loop_last), t);
	}
#endif

	if (SV && lane == 0 && n_tile > (uint32_t)warp) {
		atomicAdd(&a.sv_counts[0], (unsigned long long)((n_tile - (uint32_t)warp + NW - 1) / NW));
		atomicAdd(&a.sv_counts[1], (unsigned long long)n_skipped);
	}

	/* this warp's (m, l, acc): acc into its own first stage, [R][D], in the
	 * V frame (2^E / the V table's scale) */
	float *wacc = reinterpret_cast<float *>(stage0);
	l[0] = group_sum(l[0]);
	l[1] = group_sum(l[1]);
	/* (m, l) into s_m, s_l: here; with sparse-V, where its snapshots in
	 * them are read no more (below; one copy of the lines each, as a
	 * lambda taking m and l changed the exact builds' SASS on sm_90) */
	if constexpr (!SV) {
		if (g == 0) {
			s_m[warp][2 * q] = m[0], s_m[warp][2 * q + 1] = m[1];
			s_l[warp][2 * q] = l[0], s_l[warp][2 * q + 1] = l[1];
		}
		__syncwarp();
	}
	const float vfin = pow2i(E) / a.vc.h16_scale;
#pragma unroll
	for (int k = 0; k < 2; k++)
#pragma unroll
		for (int ii = 0; ii < D / 16; ii++) {
			const int p = g * (D / 16) + ii;
			wacc[(2 * q + k) * D + p] = acc[ii][k] * vfin;
			wacc[(2 * q + k) * D + p + D / 2] = acc[ii][k + 2] * vfin;
		}
	if constexpr (SV) {
		__syncthreads(); /* every warp is past its tiles */
		if (g == 0) {
			s_m[warp][2 * q] = m[0], s_m[warp][2 * q + 1] = m[1];
			s_l[warp][2 * q] = l[0], s_l[warp][2 * q + 1] = l[1];
		}
	}
	__syncthreads();
	cta_partials<R>(a, s_m, s_l, reinterpret_cast<const float *>(stages), (int)(NST * stage_bytes / 4u), D, r0,
			nrows, split, h, NW);

	/* the fused finish: the CTA that completes a (row block, KV head) last
	 * merges its splits (attn_finish's work, without its launch) and
	 * resets the count for the next launch */
	__shared__ bool s_last;
	__syncthreads(); /* every thread's partials are written */
	PH_AT(c_part);
	const uint32_t ci = h * (uint32_t)a.n_rb + blockIdx.x;
	if (threadIdx.x == 0) {
		/* release: the CTA's writes, ordered before this thread's fence by
		 * the barrier, before the count; acquire (the last CTA): the other
		 * CTAs' partials after it (the fence also drops this SM's L1
		 * lines).  One thread fences, not every thread. */
		__threadfence();
		const bool last = atomicAdd(&a.counters[ci], 1u) == (uint32_t)a.n_split - 1u;
		if (last)
			__threadfence();
		s_last = last;
	}
	__syncthreads();
	if (!s_last) {
		PH_EXIT();
		return;
	}
#ifdef TQC_PHASES
	if (ph && threadIdx.x == 0)
		ph->last = 1u;
#endif
	/* a warp per row, its scratch in the tables' space (free now) */
	static_assert(R * (TQC_SPLITS_MAX + TQ_DIM_MAX) * 4 <= TQC_MMA_LUT_BYTES, "finish scratch"); /* warps < R */
	float *s_w = reinterpret_cast<float *>(smem) + warp * (TQC_SPLITS_MAX + TQ_DIM_MAX);
	for (int r = warp; r < nrows; r += NW)
		finish_row<true>(a, q_row(a, h, r0 + r), s_w, s_w + TQC_SPLITS_MAX, nullptr);
	if (threadIdx.x == 0)
		a.counters[ci] = 0u;
	PH_EXIT();
}

#undef MMA_BOUNDS

__global__ void __launch_bounds__(FIN_THREADS) attn_finish(const __grid_constant__ struct tqc_attn_args a)
{
	__shared__ float s_w[TQC_SPLITS_MAX];
	__shared__ float s_y[TQ_DIM_MAX];
	__shared__ float s_red[TQC_WARPS];

	finish_row<false>(a, blockIdx.x, s_w, s_y, s_red);
}

/* The host planned for the kernel that runs: the same rows per block. */
static bool attend_args_ok(const struct tqc_attn_args *a)
{
	const size_t rows = (size_t)a->n_q * (size_t)a->n_q_heads;
	const int vpl = tqc_attn_vpl(a->kc.dim);
	const int want = !a->tiled ? tqc_attn_rows(vpl)
				   : tqc_attn_tiled_ok(&a->kc, &a->vc, a->geom.page_tokens) ? TQC_TILE_ROWS : 0;

	/* attn_mma's stages also hold its warps' partial sums, and the last
	 * warp's the rows' qrot at a padded stride (the fused finish's scratch
	 * is in the tables' space: static_assert there) */
	const bool scratch_fits = (size_t)TQC_MMA_STAGES * TQC_TILE * (a->geom.k_block_bytes + a->geom.v_block_bytes) >=
				  (size_t)TQC_TILE_ROWS * ((size_t)a->kc.dim + 4u) * 4u;

	const bool warps_ok = !a->tiled || (a->mma_warps >= TQC_MMA_WARPS_MIN &&
					     a->mma_warps <= tqc_attn_mma_warps_max(a->kc.dim));

	/* sparse-V: a threshold in [0, 1) (NaN refused), and its counts where it is on */
	const bool sv_ok = a->sparse_v >= 0.0f && a->sparse_v < 1.0f && (a->sparse_v == 0.0f || a->sv_counts);

	return a->rows_blk == want && want > 0 && (a->tiled || a->rows_blk == rows_for(vpl)) && warps_ok && sv_ok &&
	       (!a->tiled || (a->split_len % TQC_TILE == 0 && a->counters && scratch_fits)) &&
	       (a->tiled == 0 || a->tiled == 1) &&
	       a->vc.dim == a->kc.dim && a->n_rb >= 1 &&
	       a->n_split >= 1 && a->n_split <= TQC_SPLITS_MAX && a->n_kv >= 1 && a->n_kv <= 65535 &&
	       a->rows_pad == a->n_rb * a->rows_blk && a->rows_ph <= a->rows_pad && rows > 0;
}

/* The attn_mma that runs `warps` warps a CTA at head dim `dim` for keys
 * tq3o / tq4o (ko) or not: the two-CTA build for TQC_MMA_WARPS_PAIR (d <=
 * 128), else the one-CTA one (mma_config in tq_cuda.c chose the count);
 * NULL for another dim. */
typedef void (*mma_kernel_fn)(const struct tqc_attn_args);
template <int KO, bool SV>
static mma_kernel_fn mma_kernel_ko(int dim, bool pair)
{
	switch (dim) {
	case 64: return pair ? attn_mma<64, TQC_MMA_WARPS_PAIR, KO, SV> : attn_mma<64, 0, KO, SV>;
	case 128: return pair ? attn_mma<128, TQC_MMA_WARPS_PAIR, KO, SV> : attn_mma<128, 0, KO, SV>;
	case 256: return attn_mma<256, 0, KO, SV>;
	default: return nullptr;
	}
}

/* sv: the sparse-V build (the same registers and shared memory, so the
 * exact build's occupancy stands for it) */
static mma_kernel_fn mma_kernel(int dim, int warps, bool ko, bool sv)
{
	const bool pair = warps == TQC_MMA_WARPS_PAIR;

	if (sv)
		return ko ? mma_kernel_ko<1, true>(dim, pair) : mma_kernel_ko<0, true>(dim, pair);
	return ko ? mma_kernel_ko<1, false>(dim, pair) : mma_kernel_ko<0, false>(dim, pair);
}

/* tq3o / tq4o keys: attn_mma's KO build */
static bool mma_ko(const struct tqc_codec_desc &kc)
{
	return kc.id == TQ_CODEC_TQ3O || kc.id == TQ_CODEC_TQ4O;
}

/* Let kernel k ask for smem bytes of dynamic shared memory.  Past 48 KiB a
 * kernel must: until it has, its launch fails and the occupancy query counts
 * 0 CTAs (the runtime's rules; the emulator's fake runtime keeps them).
 * The limit is the kernel's, for every thread, and layouts of one kernel
 * need different sizes: a worker setting a lower one would fail another's
 * launch between that one's own set and launch.  So it only ever rises (a
 * launch that needs less runs under a higher limit). */
static cudaError_t mma_smem_allow(const void *k, size_t smem)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	/* the limits set, per device (the attribute is the device's) and
	 * kernel; past the table a limit is never lowered either: raised to
	 * the device's most, once */
	static struct { const void *k; int dev; size_t smem; } set[256];
	static int n_set;
	cudaError_t e = cudaSuccess;
	int i, dev = 0;

	if (smem <= (48u << 10))
		return cudaSuccess;
	if ((e = cudaGetDevice(&dev)) != cudaSuccess)
		return e;
	pthread_mutex_lock(&lock);
	for (i = 0; i < n_set && !(set[i].k == k && set[i].dev == dev); i++) {
	}
	if (i == n_set && n_set == (int)(sizeof(set) / sizeof(set[0]))) {
		int most = 0;
		if ((e = cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) == cudaSuccess)
			e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
						 most > (int)smem ? most : (int)smem);
	} else if (i == n_set || set[i].smem < smem) {
		e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
		if (e == cudaSuccess && i < n_set)
			set[i].smem = smem;
		else if (e == cudaSuccess)
			set[n_set++] = { k, dev, smem };
	}
	pthread_mutex_unlock(&lock);
	return e;
}

extern "C" int tqc_attn_mma_ctas_per_sm(int dim, size_t smem, int warps, int ko)
{
	const mma_kernel_fn k = mma_kernel(dim, warps, ko != 0, false);
	int n = 0;

	if (!k || mma_smem_allow((const void *)k, smem) != cudaSuccess ||
	    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, (const void *)k, warps * 32, smem) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	return n;
}

/* ---- phase clocks: the host's side (tq_cuda.h "profiling") ---------------------- */
#ifdef TQC_PHASES
static struct tqc_phase_rec *ph_dev; /* the armed records (device), ph_cap of them */
static uint32_t ph_cap;
static int ph_device;

static int ph_fail(cudaError_t e, const char *what, char *why, size_t whylen)
{
	if (why && whylen)
		snprintf(why, whylen, "%s: %s", what, cudaGetErrorString(e));
	return -EIO;
}

/* the records' addresses into the kernels' symbols (NULL: disarmed) */
static cudaError_t ph_publish(struct tqc_phase_rec *recs, uint32_t cap)
{
#ifdef TQC_SIMT
	tqc_ph_recs = recs, tqc_ph_max = cap;
	return cudaSuccess;
#else
	cudaError_t e = cudaMemcpyToSymbol(tqc_ph_recs, &recs, sizeof(recs));
	return e != cudaSuccess ? e : cudaMemcpyToSymbol(tqc_ph_max, &cap, sizeof(cap));
#endif
}

/* zeroes n records from a host buffer of zeros (no cudaMemset: one path
 * for the emulator's runtime too) */
static cudaError_t ph_clear(uint32_t n)
{
	void *z = calloc(n, sizeof(struct tqc_phase_rec));
	if (!z)
		return cudaErrorMemoryAllocation;
	cudaError_t e = cudaMemcpy(ph_dev, z, (size_t)n * sizeof(struct tqc_phase_rec), cudaMemcpyHostToDevice);
	free(z);
	return e;
}

extern "C" void tqc_phases_disarm(void)
{
	if (!ph_dev)
		return;
	(void)cudaSetDevice(ph_device);
	(void)ph_publish(nullptr, 0u);
	(void)cudaFree(ph_dev);
	ph_dev = nullptr;
	ph_cap = 0u;
}

extern "C" int tqc_phases_arm(int device, uint32_t max_ctas, char *why, size_t whylen)
{
	cudaError_t e;

	if (max_ctas < 1u || max_ctas > (1u << 20)) {
		if (why && whylen)
			snprintf(why, whylen, "phase records: %u CTAs is not in 1 .. 2^20", max_ctas);
		return -EINVAL;
	}
	tqc_phases_disarm();
	if ((e = cudaSetDevice(device)) != cudaSuccess)
		return ph_fail(e, "cudaSetDevice", why, whylen);
	if ((e = cudaMalloc((void **)&ph_dev, (size_t)max_ctas * sizeof(struct tqc_phase_rec))) != cudaSuccess) {
		ph_dev = nullptr;
		return ph_fail(e, "cudaMalloc (phase records)", why, whylen);
	}
	ph_cap = max_ctas;
	ph_device = device;
	if ((e = ph_clear(max_ctas)) != cudaSuccess || (e = ph_publish(ph_dev, max_ctas)) != cudaSuccess) {
		tqc_phases_disarm();
		return ph_fail(e, "arming the phase records", why, whylen);
	}
	return 0;
}

extern "C" int tqc_phases_take(struct tqc_phase_rec *out, uint32_t max, uint32_t *n, char *why, size_t whylen)
{
	cudaError_t e;

	*n = 0;
	if (!ph_dev) {
		if (why && whylen)
			snprintf(why, whylen, "phase records: not armed");
		return -EINVAL;
	}
	const uint32_t take = max < ph_cap ? max : ph_cap;
	if ((e = cudaSetDevice(ph_device)) != cudaSuccess ||
	    (e = cudaMemcpy(out, ph_dev, (size_t)take * sizeof(*out), cudaMemcpyDeviceToHost)) != cudaSuccess ||
	    (e = ph_clear(ph_cap)) != cudaSuccess)
		return ph_fail(e, "reading the phase records", why, whylen);
	if (take && out[0].written) {
		const uint64_t ctas = (uint64_t)out[0].grid[0] * out[0].grid[1] * out[0].grid[2];
		*n = ctas < take ? (uint32_t)ctas : take;
	}
	return 0;
}
#else
static int ph_none(char *why, size_t whylen)
{
	if (why && whylen)
		snprintf(why, whylen, "these kernels were built without phase clocks (TQC_PHASES): "
				      "`make phases` builds build/bin/tqbench-phases");
	return -ENOTSUP;
}

extern "C" int tqc_phases_arm(int device, uint32_t max_ctas, char *why, size_t whylen) { return ph_none(why, whylen); }
extern "C" int tqc_phases_take(struct tqc_phase_rec *out, uint32_t max, uint32_t *n, char *why, size_t whylen)
{
	*n = 0;
	return ph_none(why, whylen);
}
extern "C" void tqc_phases_disarm(void) {}
#endif

/* The launcher (tests/simt/ runs the kernels above on the CPU with its own). */
#ifndef TQC_SIMT
/* ---- launcher ------------------------------------------------------------------------ */

template <int VPL>
static void launch_main(const struct tqc_attn_args *a, cudaStream_t st)
{
	const dim3 grid((unsigned)a->n_rb, (unsigned)a->n_split, (unsigned)a->n_kv);

	if (a->sparse_v > 0.0f)
		attn_main<VPL, rows_for(VPL), true><<<grid, TQC_WARPS * 32, 0, st>>>(*a);
	else
		attn_main<VPL, rows_for(VPL), false><<<grid, TQC_WARPS * 32, 0, st>>>(*a);
}

static cudaError_t launch_mma(const struct tqc_attn_args *a, cudaStream_t st)
{
	const dim3 grid((unsigned)a->n_rb, (unsigned)a->n_split, (unsigned)a->n_kv);
	const size_t smem = tqc_attn_mma_smem(a->kc.dim, a->geom.k_block_bytes, a->geom.v_block_bytes, a->mma_warps);
	const mma_kernel_fn k = mma_kernel(a->kc.dim, a->mma_warps, mma_ko(a->kc), a->sparse_v > 0.0f);
	cudaError_t e;

	if (!k)
		return cudaErrorInvalidValue;
	if ((e = mma_smem_allow((const void *)k, smem)) != cudaSuccess) /* the host checked the device's limit */
		return e;
	k<<<grid, a->mma_warps * 32, smem, st>>>(*a);
	return cudaSuccess;
}


extern "C" int tqc_launch_attend(const struct tqc_attn_args *a, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	const int vpl = tqc_attn_vpl(a->kc.dim);
	const size_t rows = (size_t)a->n_q * (size_t)a->n_q_heads;
	const unsigned row_ctas = (unsigned)((rows + TQC_WARPS - 1) / TQC_WARPS);
	cudaError_t e;

	(void)cudaGetLastError(); /* a stale error of an earlier call is not this launch's */
	if (!attend_args_ok(a))
		return (int)cudaErrorInvalidValue;
	if (!a->tiled) { /* the tiled kernels rotate their rows' queries */
		attn_prep<<<row_ctas, TQC_WARPS * 32, 0, st>>>(*a);
		if ((e = cudaGetLastError()) != cudaSuccess)
			return (int)e;
	}
	if (a->tiled) {
		if ((e = launch_mma(a, st)) != cudaSuccess)
			return (int)e;
	} else {
		switch (vpl) {
		case 1: launch_main<1>(a, st); break;
		case 2: launch_main<2>(a, st); break;
		case 4: launch_main<4>(a, st); break;
		case 8: launch_main<8>(a, st); break;
		case 16: launch_main<16>(a, st); break;
		default: return (int)cudaErrorInvalidValue;
		}
	}
	if ((e = cudaGetLastError()) != cudaSuccess)
		return (int)e;
	if (!a->tiled) /* attn_mma finishes its rows itself */
		attn_finish<<<(unsigned)rows, FIN_THREADS, 0, st>>>(*a);
	return (int)cudaGetLastError();
}
#endif /* TQC_SIMT */
