/* tq_cuda_attn.cu — fused attention over paged, compressed K/V on the GPU:
 * the contract of tq_attend (tq_attn.h), every K/V codec pair, any head dim.
 *
 * Per pass over the query tokens (tq_cuda.c cuts a call into passes), three
 * kernels on one stream:
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
 * q_rot[c] int8[c]; q4a: sum q[c] (min + s q4[c]); f16 / f32: plain.  Values
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

/* This lane's coordinates of one block, in the codec's frame, unscaled:
 * v[j] for c = lane + 32 j (0 past d).  Returns the block's scale (tq: the
 * norm correction; q8: max/127; others 1). */
template <int VPL>
static __device__ __forceinline__ float decode(int id, int d, int bits, const uint8_t *b, int lane,
					const uint32_t (&pos)[VPL], planes pl, const float *cent, float (&v)[VPL])
{
	switch (id) {
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
			v[j] = c < d ? mn + s * (float)plane_index(b, pos[j], 4, pl) : 0.0f;
		}
		return 1.0f;
	}
	default: /* tq2 / tq3 / tq4 */
#pragma unroll
		for (int j = 0; j < VPL; j++) {
			const int c = lane + 32 * j;
			v[j] = c < d ? cent[plane_index(b, pos[j], bits, pl)] : 0.0f;
		}
		return ld_f32(b);
	}
}

/* ---- prep: qrot = scale2 * R_k q ------------------------------------------------- */

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

	if (kc.rot_kind == ROT_HADAMARD) {
		for (int c = lane; c < d; c += 32)
			x[c] = q[c] * sign_of(kc, c);
		__syncwarp();
		warp_fwht(x, d, lane);
		for (int c = lane; c < d; c += 32)
			o[c] = (x[c] * kc.inv_sqrt_dim) * a.scale2;
	} else if (kc.rot_kind == ROT_DENSE) {
		for (int c = lane; c < d; c += 32)
			x[c] = q[c];
		__syncwarp();
		const float *mt = kc.mat_t; /* R[i][j] = mat_t[j][i] */
		for (int i = lane; i < d; i += 32) {
			float acc = 0.0f;
			for (int j = 0; j < d; j++)
				acc = fmaf(mt[(size_t)j * d + i], x[j], acc);
			o[i] = acc * a.scale2;
		}
	} else {
		for (int c = lane; c < d; c += 32)
			o[c] = q[c] * a.scale2;
	}
}

/* ---- main: partial softmax of one row block over one split ------------------------ */

template <int VPL, int R>
__global__ void __launch_bounds__(TQC_WARPS * 32, 4) attn_main(const __grid_constant__ struct tqc_attn_args a)
{
	static_assert(R * VPL <= 32 && R >= 1, "q and acc stay in registers");
	__shared__ float s_acc[TQC_WARPS][R][32 * VPL];
	__shared__ float s_m[TQC_WARPS][R], s_l[TQC_WARPS][R];
	__shared__ float s_ck[TQC_CB_MAX], s_cv[TQC_CB_MAX];

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
			const int rr = r0 + r, qi = rr / a.group, gi = rr % a.group;
			const float *qr = a.qrot + ((size_t)qi * a.n_q_heads + (size_t)h * a.group + gi) * d;
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
	const int kid = a.kc.id, vid = a.vc.id, kbits = a.kc.bits, vbits = a.vc.bits;
	const planes kp = plane_offsets(d, kbits), vp = plane_offsets(d, vbits);
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

	const uint64_t kh = tq_page_k_off(&g, h, 0), vh = tq_page_v_off(&g, h, 0);
	const uint64_t tb = (uint64_t)split * a.split_len;
	uint64_t te = tb + a.split_len;
	te = te < a.kv_len ? te : a.kv_len;
	te = te < tmax ? te : tmax;
	for (uint64_t t64 = tb + (uint64_t)warp; t64 < te; t64 += TQC_WARPS) {
		const uint32_t t = (uint32_t)t64, page = t / g.page_tokens, slot = t % g.page_tokens;
		const uint8_t *pg = a.pages[page];

		float kv[VPL];
		const float ks = decode<VPL>(kid, d, kbits, pg + kh + (uint64_t)slot * g.k_block_bytes, lane, pos,
					     kp, s_ck, kv);
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
		float vv[VPL];
		const float vs = decode<VPL>(vid, d, vbits, pg + vh + (uint64_t)slot * g.v_block_bytes, lane, pos,
					     vp, s_cv, vv);
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
	const size_t pbase = (size_t)h * (size_t)a.rows_pad + (size_t)r0;
	for (int e = (int)threadIdx.x; e < nrows * d; e += TQC_WARPS * 32) {
		const int r = e / d, c = e % d;
		float M = NEG_INF, L = 0.0f, A = 0.0f;
		for (int w = 0; w < TQC_WARPS; w++)
			M = fmaxf(M, s_m[w][r]);
		for (int w = 0; w < TQC_WARPS; w++) {
			const float mw = s_m[w][r], lw = s_l[w][r];
			if (mw == NEG_INF && !isnan(lw))
				continue; /* saw nothing (a NaN sum must reach the row) */
			const float f = exp2f(mw - M);
			L += lw * f;
			A += s_acc[w][r][c] * f;
		}
		const size_t pi = (pbase + (size_t)r) * (size_t)a.n_split + (size_t)split;
		a.part_acc[pi * (size_t)d + (size_t)c] = A;
		if (c == 0) {
			a.part_ml[2 * pi] = M;
			a.part_ml[2 * pi + 1] = L;
		}
	}
}

/* ---- finish: merge the splits, normalize, rotate back ------------------------------ */

__global__ void __launch_bounds__(TQC_WARPS * 32) attn_finish(const __grid_constant__ struct tqc_attn_args a)
{
	__shared__ float s_y[TQC_WARPS][TQ_DIM_MAX];
	const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
	const size_t row = (size_t)blockIdx.x * TQC_WARPS + (size_t)warp;

	if (row >= (size_t)a.n_q * (size_t)a.n_q_heads)
		return; /* the whole warp */
	const struct tqc_codec_desc &vc = a.vc;
	const int d = vc.dim;
	const int i = (int)(row / (size_t)a.n_q_heads), hq = (int)(row % (size_t)a.n_q_heads);
	const int h = hq / a.group, gi = hq % a.group;
	const size_t base = ((size_t)h * (size_t)a.rows_pad + (size_t)i * a.group + gi) * (size_t)a.n_split;
	const float *ml = a.part_ml + 2 * base;
	float *o = a.out + row * (size_t)d;
	float *y = s_y[warp];

	float M = NEG_INF, L = 0.0f;
	for (int s = 0; s < a.n_split; s++)
		M = fmaxf(M, ml[2 * s]);
	for (int s = 0; s < a.n_split; s++) {
		if (ml[2 * s] == NEG_INF && !isnan(ml[2 * s + 1]))
			continue;
		L += ml[2 * s + 1] * exp2f(ml[2 * s] - M);
	}
	/* positions are checked (0 <= q_pos < kv_len): a row sees a key unless
	 * the cache is empty (then it is not causal) */
	const bool sees = a.kv_len > 0;
	if (M == NEG_INF && !sees) {
		for (int c = lane; c < d; c += 32)
			o[c] = 0.0f;
		return;
	}
	if (!isfinite(M) || !isfinite(L) || !(L > 0.0f)) {
		for (int c = lane; c < d; c += 32)
			o[c] = QNAN; /* a logit beyond float range */
		return;
	}
	const float inv = 1.0f / L;
	for (int c = lane; c < d; c += 32) {
		float A = 0.0f;
		for (int s = 0; s < a.n_split; s++) {
			if (ml[2 * s] == NEG_INF && !isnan(ml[2 * s + 1]))
				continue;
			A += a.part_acc[(base + (size_t)s) * (size_t)d + (size_t)c] * exp2f(ml[2 * s] - M);
		}
		y[c] = A * inv;
	}
	__syncwarp();
	if (vc.rot_kind == ROT_HADAMARD) {
		/* R^T y = D H (y / sqrt(d)) */
		for (int c = lane; c < d; c += 32)
			y[c] *= vc.inv_sqrt_dim;
		__syncwarp();
		warp_fwht(y, d, lane);
		for (int c = lane; c < d; c += 32)
			o[c] = y[c] * sign_of(vc, c);
	} else if (vc.rot_kind == ROT_DENSE) {
		const float *mat = vc.mat; /* (R^T y)_j = sum_i R[i][j] y_i */
		for (int j = lane; j < d; j += 32) {
			float acc = 0.0f;
			for (int k = 0; k < d; k++)
				acc = fmaf(mat[(size_t)k * d + j], y[k], acc);
			o[j] = acc;
		}
	} else {
		for (int c = lane; c < d; c += 32)
			o[c] = y[c];
	}
}

/* The launcher (tests/simt/ runs the kernels above on the CPU with its own). */
#ifndef TQC_SIMT
/* ---- launcher ------------------------------------------------------------------------ */

template <int VPL>
static void launch_main(const struct tqc_attn_args *a, cudaStream_t st)
{
	const dim3 grid((unsigned)a->n_rb, (unsigned)a->n_split, (unsigned)a->n_kv);

	attn_main<VPL, rows_for(VPL)><<<grid, TQC_WARPS * 32, 0, st>>>(*a);
}

extern "C" int tqc_launch_attend(const struct tqc_attn_args *a, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	const int vpl = tqc_attn_vpl(a->kc.dim);
	const size_t rows = (size_t)a->n_q * (size_t)a->n_q_heads;
	const unsigned row_ctas = (unsigned)((rows + TQC_WARPS - 1) / TQC_WARPS);
	cudaError_t e;

	(void)cudaGetLastError(); /* a stale error of an earlier call is not this launch's */
	/* the host planned for the kernel that runs: the same rows per block */
	if (a->rows_blk != rows_for(vpl) || a->rows_blk != tqc_attn_rows(vpl) || a->vc.dim != a->kc.dim ||
	    a->n_rb < 1 || a->n_split < 1 || a->n_split > 65535 || a->n_kv < 1 || a->n_kv > 65535 ||
	    a->rows_pad != a->n_rb * a->rows_blk || a->rows_ph > a->rows_pad || rows == 0)
		return (int)cudaErrorInvalidValue;
	attn_prep<<<row_ctas, TQC_WARPS * 32, 0, st>>>(*a);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return (int)e;
	switch (vpl) {
	case 1: launch_main<1>(a, st); break;
	case 2: launch_main<2>(a, st); break;
	case 4: launch_main<4>(a, st); break;
	case 8: launch_main<8>(a, st); break;
	case 16: launch_main<16>(a, st); break;
	default: return (int)cudaErrorInvalidValue;
	}
	if ((e = cudaGetLastError()) != cudaSuccess)
		return (int)e;
	attn_finish<<<row_ctas, TQC_WARPS * 32, 0, st>>>(*a);
	return (int)cudaGetLastError();
}
#endif /* TQC_SIMT */
