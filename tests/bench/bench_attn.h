/* bench_attn.h — what the CPU (bench_attn.c) and the CUDA
 * (bench_attn_cuda.c) halves of `tqbench attn` share: the synthetic data and
 * the options of `--backend cuda`. */
#ifndef TQ_BENCH_ATTN_H
#define TQ_BENCH_ATTN_H

#include <math.h>
#include <stdint.h>

#include "tq_codec.h"

#define NQH 32
#define NKV 8
#define DIM 128

/* ---- synthetic data -------------------------------------------------------- */

struct rng { uint64_t s; };
static inline double urand(struct rng *r)
{
	r->s = r->s * 6364136223846793005ULL + 1442695040888963407ULL;
	return (double)(r->s >> 11) * (1.0 / 9007199254740992.0);
}
static inline float gauss(struct rng *r)
{
	double u = urand(r) + 1e-300, v = urand(r);
	return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Keys shaped like post-RoPE keys of real models: non-zero channel means and
 * a few channels (4 of 128) with 5-10x the magnitude of the rest. */
static inline float chan_mean(int j) { return (float)((j * 37 % 11) - 5) * 0.15f; }
static inline float chan_amp(int j) { return (j % 32 == 7) ? 8.0f : (j % 32 == 19 ? 5.0f : 1.0f); }

static inline void gen_key(struct rng *r, float *k, int dim)
{
	for (int j = 0; j < dim; j++)
		k[j] = chan_mean(j) + chan_amp(j) * gauss(r);
}
static inline void gen_value(struct rng *r, float *v, int dim)
{
	for (int j = 0; j < dim; j++)
		v[j] = gauss(r);
}
/* queries weigh the large channels too (so they matter to the scores) */
static inline void gen_query(struct rng *r, float *q, int dim)
{
	for (int j = 0; j < dim; j++)
		q[j] = (chan_amp(j) > 1.0f ? 0.5f : 1.0f) * gauss(r);
}

/* ---- --backend cuda ------------------------------------------------------------ */

#define ATTN_CUDA_MAX_LIST  16     /* entries of --ctx / --batch */
#define ATTN_CUDA_MAX_BATCH 256    /* sessions (host threads, streams) */

struct attn_cuda_opts {
	int device;                          /* --device                          */
	uint32_t ctx[ATTN_CUDA_MAX_LIST];    /* --ctx list                        */
	int n_ctx;
	int batch[ATTN_CUDA_MAX_LIST];       /* --batch list                      */
	int n_batch;
	enum tq_codec_id k, v;
	uint32_t page_tokens;
	int threads;                         /* host threads: data, CPU encoding, */
					     /* the CPU baselines of the append   */
	int reps;                            /* timed calls per session           */
	int json;
	int baseline;                        /* run scripts/bench-sdpa.py         */
	uint32_t check_max;                  /* tq_attend_ref check up to this ctx */
	int layers;                          /* append: layers of the model       */
	uint32_t bulk;                       /* append: tokens of the bulk call   */
	float sparse;                        /* --sparse: > 0 also times sparse-V */
	float q_scale;                       /* --q-scale: queries times this     */
	int phases;                          /* --phases N: N calls with the tiled */
					     /* kernel's phase clocks (tqbench-phases) */
};

/* 0, 1 (a failure or a failed check), 2 (bad options) or 77 (no usable
 * CUDA device: the reason is on stderr). */
int bench_attn_cuda(const struct attn_cuda_opts *o);

#endif
