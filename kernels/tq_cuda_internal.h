/* tq_cuda_internal.h — the ABI between the host side (tq_cuda.c, gcc) and
 * the kernels (tq_cuda_encode.cu, tq_cuda_attn.cu, nvcc): kernel parameter
 * structs, passed by value (so a launch uploads nothing but its arguments),
 * and the extern "C" launchers.  Plain C11 / C++17: fixed-width types and
 * pointers only, the same layout on both sides (asserted below).
 *
 * Kernels run on the device that is current for the calling thread; a
 * launcher enqueues on `stream` (a cudaStream_t passed as void *, so this
 * header needs no CUDA include) and returns the cudaError_t of the launch
 * (0 = cudaSuccess) as an int.  They do not synchronize.
 */
#ifndef TQ_CUDA_INTERNAL_H
#define TQ_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tq_layout.h"
#include "tq_page.h"

#ifndef __cplusplus
#include <assert.h> /* static_assert */
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define TQC_WARPS   4     /* warps per CTA of every kernel (128 threads)        */
#define TQC_CB_MAX  32    /* codebook levels the kernels take: tq2 .. tq4, and  */
			  /* the first half of tq3o / tq4o (4 or 5 bits)       */
#define TQC_CB_B_MAX 8    /* the second half of tq3o / tq4o (2 or 3 bits)      */
#define TQC_SPLITS_MAX 1024 /* context splits of one attention pass (attn_finish) */

/* One codec, by value.  Built by the host from struct tq_codec
 * (tq_internal.h); the kernels never see a host pointer.
 *
 * tq3o / tq4o (half != 0): two TurboQuant vectors of dim/2 (tq_layout.h),
 * the first with `bits`, centroid, bound, sign bits [0, half), mat / mat_t;
 * the second with bits_b, centroid_b, bound_b, sign bits [half, dim),
 * mat_b / mat_t_b.  Both halves have the same rotation kind and
 * inv_sqrt_dim (1/sqrt(half)); the rotation of the whole vector is their
 * block-diagonal sum. */
struct tqc_codec_desc {
	int32_t id;                  /* enum tq_codec_id                              */
	int32_t dim;
	int32_t bits;                /* index bits: tq* 2..4, q4a 4 (q8 8, f16 16, f32 32); */
				     /* tq*o: the first half's (4 or 5)              */
	uint32_t block_bytes;
	int32_t rot_kind;            /* enum tq_rot_kind: 0 none, 1 Hadamard, 2 dense  */
	float inv_sqrt_dim;          /* Hadamard: 1/sqrt(dim) as the codec has it      */
				     /* (tq*o: 1/sqrt(half))                         */
	uint32_t sign_mask[TQ_DIM_MAX / 32]; /* Hadamard: bit i%32 of word i/32 set    */
				     /* = sign[i] is -1.0f                           */
	float centroid[TQC_CB_MAX];  /* tq*: [2^bits] ascending                        */
	float bound[TQC_CB_MAX];     /* tq*: [2^bits - 1] (the last entry unused)      */
	float h16_scale;             /* tq*, tq*o: tq_codebook.h16_scale (attn_mma's    */
				     /* FP16 tables); others 1                       */
	int32_t half;                /* tq*o: dim / 2; 0 for every other codec          */
	int32_t bits_b;              /* tq*o: the second half's index bits (2 or 3)    */
	float h16_scale_b;           /* tq*o: the second half's tq_codebook.h16_scale  */
				     /* (h16_scale: the first half's); others 1     */
	float centroid_b[TQC_CB_B_MAX]; /* tq*o: the second half's [2^bits_b]          */
	float bound_b[TQC_CB_B_MAX];    /* tq*o: [2^bits_b - 1]                        */
	const float *mat;            /* dense: R, [dim][dim] row-major, device memory  */
	const float *mat_t;          /* dense: R^T, [dim][dim] row-major, device memory */
				     /* (tq*o: the first half's, [half][half])      */
	const float *mat_b;          /* tq*o, dense: the second half's R, R^T          */
	const float *mat_t_b;
};

/* ---- quantize-append (tq_cuda_encode.cu) -------------------------------------
 * One warp per vector; vectors are numbered token-major, then K (side 0)
 * before V (side 1), then head: vec = (t * 2 + side) * n_kv + head — the
 * order in which the host names the first failing one. */

/* Per-vector status in the word *status: the kernel atomicMin's
 * (vec << 32 | code) for every failing vector; the host presets it to all
 * ones (nothing failed).  code: */
#define TQC_ST_NONFINITE 0x10000u  /* | element: NaN or Inf input (-EINVAL)           */
#define TQC_ST_RANGE     0x20000u  /* the codec cannot represent the vector (-ERANGE) */
#define TQC_ST_ELEM_MASK 0x0ffffu

#define TQC_ENC_PAGES_INLINE 8 /* page bases a launch carries in its arguments */

struct tqc_enc_args {
	struct tqc_codec_desc kc, vc;
	const uint8_t *const *pages; /* device: page bases; slot s of this launch is   */
				     /* in pages[s / page_tokens] at s % page_tokens  */
				     /* (NULL: page_inline has them)                  */
	const uint8_t *page_inline[TQC_ENC_PAGES_INLINE]; /* a decode token's pages   */
	struct tq_page_geom geom;
	uint32_t slot0;              /* slot of token 0 of this launch in pages[]       */
	uint32_t n_tok;              /* tokens of this launch (n_tok * 2 * n_kv < 2^31) */
	int32_t dtype;               /* enum tq_dtype of k and v                        */
	int32_t general;             /* 1: enc_kernel even where enc_reg applies         */
				     /* (TQ_CUDA_ENC=general; tqc_enc_reg_dim)        */
	const uint8_t *k;            /* device: [n_tok][n_kv][dim] of dtype, any alignment */
	const uint8_t *v;
	unsigned long long *status;  /* device: one word, see above; ~0 between launches */
	uint32_t *done;              /* device: CTAs finished; 0 between launches       */
	unsigned long long *report;  /* host-mapped: the last CTA moves *status here,   */
				     /* then resets *status and *done                  */
};

int tqc_launch_encode(const struct tqc_enc_args *a, void *stream);

/* The head dim of the register-resident encoder (enc_reg<D, O>) that takes
 * a launch, or 0 for the general enc_kernel: K and V codecs tq2..tq4, q8,
 * tq3o or tq4o (O: a launch with one of the last two) with the Hadamard
 * rotation, one head dim of 64, 128 or 256, and rows aligned to their
 * element (the row stride is). */
static inline int tqc_enc_reg_dim(const struct tqc_enc_args *a)
{
	const int d = a->kc.dim;
	const uintptr_t esz = a->dtype == 0 /* f32 */ ? 4 : 2;
	const struct tqc_codec_desc *c[2] = { &a->kc, &a->vc };

	if (a->general || a->vc.dim != d || (d != 64 && d != 128 && d != 256) ||
	    (((uintptr_t)a->k | (uintptr_t)a->v) & (esz - 1)))
		return 0;
	for (int i = 0; i < 2; i++)
		if (c[i]->rot_kind != 1 /* Hadamard */ ||
		    !(c[i]->id == TQ_CODEC_Q8 || c[i]->id == TQ_CODEC_TQ2 || c[i]->id == TQ_CODEC_TQ3 ||
		      c[i]->id == TQ_CODEC_TQ4 || c[i]->id == TQ_CODEC_TQ3O || c[i]->id == TQ_CODEC_TQ4O))
			return 0;
	return d;
}

/* ---- attention (tq_cuda_attn.cu) ----------------------------------------------
 * Per pass over the query tokens:
 *   prep    qrot[row] = scale2 * R_k q[row]            (one warp per row;
 *           not for the tiled kernels, which rotate their rows themselves)
 *   main    per (row block, split, KV head): online softmax over the split's
 *           tokens, partial (m, l, acc) per row in the V frame (attn_main,
 *           or the tiled attn_mma)
 *   finish  per row: log-sum-exp merge of the splits, acc / l, R_v^T, out
 *           (attn_finish; attn_mma's last CTA per row block does it itself)
 * A row is (query token i, query head hq); within KV head h the rows are
 * r = i * group + g (hq = h * group + g), cut into row blocks of `rows_blk`
 * rows: one block may span several query tokens. */

/* Values per lane (coordinate c = lane + 32 * j, j < vpl) and rows per row
 * block of the main kernel for a head dim: the kernel is built for these
 * (vpl, rows) pairs only; rows * vpl <= 32 keeps q and the accumulators in
 * registers. */
static inline int tqc_attn_vpl(int dim)
{
	int need = (dim + 31) / 32, v = 1;

	while (v < need)
		v <<= 1;
	return v; /* 1, 2, 4, 8 or 16 for dims 8 .. 512 */
}

static inline int tqc_attn_rows(int vpl)
{
	return vpl <= 4 ? 8 : 32 / vpl; /* 8, 8, 8, 4, 2 */
}

/* The tiled decode kernel (attn_mma): 32-key tiles of each warp copied to
 * shared memory ahead of use (bulk copies on sm_90, cp.async elsewhere; two
 * stages), scores and values on the tensor cores.  It takes head dims 64 /
 * 128 / 256, K and V codecs tq2 / tq3 / tq4 / q8 (a 4-byte header, then
 * index planes or int8) and K codecs tq3o / tq4o besides (two halves, each its own bf16 scale, codebook and
 * rotation), pages of a multiple of 32 tokens (tiles never straddle a page
 * and start 16-byte aligned) and keys rotated by a Hadamard transform (one,
 * or one per half) or not at all (it rotates its rows' queries itself: no
 * attn_prep); row blocks of TQC_TILE_ROWS rows (the mma's N).  Where it
 * does not apply, attn_main. */
#define TQC_TILE 32
#define TQC_TILE_ROWS 8
static inline int tqc_attn_tiled_codec(int32_t id)
{
	return id == TQ_CODEC_TQ2 || id == TQ_CODEC_TQ3 || id == TQ_CODEC_TQ4 || id == TQ_CODEC_Q8;
}

static inline int tqc_attn_tiled_k_codec(int32_t id)
{
	return tqc_attn_tiled_codec(id) || id == TQ_CODEC_TQ3O || id == TQ_CODEC_TQ4O;
}

static inline int tqc_attn_tiled_ok(const struct tqc_codec_desc *kc, const struct tqc_codec_desc *vc,
				    uint32_t page_tokens)
{
	const int d = kc->dim;

	return d == vc->dim && (d == 64 || d == 128 || d == 256) && tqc_attn_tiled_k_codec(kc->id) &&
	       tqc_attn_tiled_codec(vc->id) && page_tokens % TQC_TILE == 0 &&
	       kc->rot_kind != 2 /* dense: attn_prep rotates the queries */;
}

/* Its shared memory (dynamic): the decode tables (256 codes x 32 lane
 * copies x K and V pairs), Q^T's fragments where they do not stay in
 * registers (d 256: [d/16][32] x 16 bytes), FP16 weights [8][TILE] per warp,
 * then each warp's TQC_MMA_STAGES stages of its tiles' K and V blocks (the
 * warps' partial sums reuse their own stages at the end).  16 table copies
 * and 3 stages were measured slower (BENCHMARKS 2b). */
#define TQC_MMA_LUT_BYTES 65536u
#define TQC_MMA_QF_BYTES(dim) ((dim) > 128 ? (size_t)(dim) * 32u : (size_t)0)
#define TQC_MMA_STAGES 2u /* tiles per warp in shared memory: 1 computed on, 1 in flight */
#define TQC_MMA_STATIC_SMEM 1024u     /* the two-CTA build's static shared memory, at most */
#define TQC_MMA_STATIC_SMEM_ONE 1536u /* the one-CTA build's (up to 12 warps' sums), at most */
/* Warps per attn_mma CTA (tqc_attn_args.mma_warps, chosen by the host).
 * An SM wants as many warps as fit, and two CTAs rather than one (one's
 * set-up and finish overlap the other's tiles): TQC_MMA_WARPS_PAIR warps in
 * each of two CTAs where their shared memory and registers fit (small
 * blocks: tq2..4 keys), else one CTA of as many warps as its shared memory
 * holds, up to what the registers allow (168 a thread at d <= 128: 12 warps;
 * 232 at d = 256: 8); at least 4, or attn_main runs.  (One CTA of 16 warps
 * at 128 registers was measured: slower for tq4 / tq3 than 2 x 6.) */
#define TQC_MMA_WARPS_MIN 4
#define TQC_MMA_WARPS_PAIR 6
#define TQC_MMA_WARPS_MAX 12
static inline int tqc_attn_mma_warps_max(int dim)
{
	return dim > 128 ? 8 : TQC_MMA_WARPS_MAX;
}

static inline size_t tqc_attn_mma_smem(int dim, uint32_t k_block_bytes, uint32_t v_block_bytes, int warps)
{
	const size_t w = (size_t)warps;

	return TQC_MMA_LUT_BYTES + TQC_MMA_QF_BYTES(dim) + w * TQC_TILE_ROWS * TQC_TILE * 2u +
	       w * TQC_MMA_STAGES * TQC_TILE * ((size_t)k_block_bytes + v_block_bytes);
}

/* The most warps whose shared memory fits smem_max bytes a block, or 0
 * where not even TQC_MMA_WARPS_MIN do (counting the larger, one-CTA
 * build's static shared memory). */
static inline int tqc_attn_mma_warps(int dim, uint32_t k_block_bytes, uint32_t v_block_bytes, size_t smem_max)
{
	for (int w = tqc_attn_mma_warps_max(dim); w >= TQC_MMA_WARPS_MIN; w--)
		if (tqc_attn_mma_smem(dim, k_block_bytes, v_block_bytes, w) + TQC_MMA_STATIC_SMEM_ONE <= smem_max)
			return w;
	return 0;
}

struct tqc_attn_args {
	struct tqc_codec_desc kc, vc;
	const uint8_t *const *pages; /* device: [n_pages] page bases (64-byte aligned)  */
	struct tq_page_geom geom;
	uint32_t kv_len;             /* keys in the layer                               */
	int32_t n_q;                 /* query tokens of this pass                       */
	int32_t n_q_heads;
	int32_t group;               /* n_q_heads / n_kv                                */
	int32_t n_kv;
	int32_t causal;              /* 1: row i sees keys t <= q_pos[i]                */
	float scale2;                /* softmax scale * log2(e)                         */
	int32_t rows_ph;             /* rows per KV head: n_q * group                   */
	int32_t rows_blk;            /* rows per row block: tqc_attn_rows(vpl) or TQC_TILE_ROWS */
	int32_t n_rb;                /* row blocks per KV head                          */
	int32_t rows_pad;            /* n_rb * rows_blk                                 */
	int32_t n_split;             /* splits of the context, >= 1                     */
	uint32_t split_len;          /* tokens per split, >= 1 (tiled: a multiple of TQC_TILE) */
	int32_t tiled;               /* 1: attn_mma, rows_blk = TQC_TILE_ROWS; 0: attn_main */
	int32_t mma_warps;           /* tiled: warps per CTA (tqc_attn_mma_warps)        */
	float sparse_v;              /* > 0: sparse-V's threshold (tq_attn.h); 0: exact   */
	const int32_t *q_pos;        /* device: [n_q] (causal only, else unused)         */
	const float *q;              /* device: [n_q][n_q_heads][dim] fp32               */
	float *qrot;                 /* device: [n_q][n_q_heads][dim], prep's output     */
	float *part_acc;             /* device: [n_kv][rows_pad][n_split][dim]           */
	float *part_ml;              /* device: [n_kv][rows_pad][n_split][2]: m, l        */
	float *out;                  /* device-accessible: [n_q][n_q_heads][dim]         */
	uint32_t *counters;          /* device, tiled: [n_kv][n_rb] finished splits, 0   */
				     /* between launches (the last CTA merges, resets) */
	unsigned long long *sv_counts; /* device, sparse_v > 0: [2] value chunks       */
				     /* reached, skipped (added to; tiles of TQC_TILE  */
				     /* keys a warp in attn_mma, single keys in attn_main) */
};

int tqc_launch_attend(const struct tqc_attn_args *a, void *stream);
/* CTAs of attn_mma<dim> (ko: its build for tq3o / tq4o keys) with `warps`
 * warps and `smem` bytes of dynamic shared memory that run at once on one SM
 * of the current device (registers and shared memory); 0 if the runtime
 * cannot tell. */
int tqc_attn_mma_ctas_per_sm(int dim, size_t smem, int warps, int ko);

/* The layout both compilers must agree on. */
#define TQC_DESC_BYTES 456
static_assert(sizeof(struct tqc_codec_desc) == TQC_DESC_BYTES, "tqc_codec_desc layout");
static_assert(offsetof(struct tqc_codec_desc, mat) == 424, "tqc_codec_desc layout");
static_assert(sizeof(struct tqc_enc_args) == 2 * TQC_DESC_BYTES + 8 + 64 + 16 + 16 + 40, "tqc_enc_args layout");
static_assert(offsetof(struct tqc_enc_args, k) == 2 * TQC_DESC_BYTES + 8 + 64 + 16 + 16, "tqc_enc_args layout");
/* 16 four-byte fields, then the pointers */
static_assert(offsetof(struct tqc_attn_args, q_pos) == 2 * TQC_DESC_BYTES + 8 + 16 + 16 * 4, "tqc_attn_args layout");
static_assert(sizeof(struct tqc_attn_args) == 2 * TQC_DESC_BYTES + 8 + 16 + 16 * 4 + 8 * 8, "tqc_attn_args layout");
static_assert(TQ_DIM_MAX % 32 == 0, "sign mask words");

#ifdef __cplusplus
}
#endif
#endif /* TQ_CUDA_INTERNAL_H */
