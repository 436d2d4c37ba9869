/* model.h — the models tqkv-run loads (llama2.c checkpoints, GGUF llama
 * models) and its forward pass.
 *
 * tqr_model_load() tells the formats apart by their first bytes.
 *
 * GGUF (model_gguf.c, read with gguf.h): general.architecture "llama";
 * dimensions from llama.* metadata (embedding_length, feed_forward_length,
 * block_count, attention.head_count[_kv], context_length), rope.freq_base
 * (default 10000) and attention.layer_norm_rms_epsilon; tensors
 * token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
 * ffn_norm, ffn_gate (w1), ffn_up (w3), ffn_down (w2)}, output_norm and
 * output (absent: the classifier is the token embedding), each F32, F16,
 * BF16, Q8_0, Q4_0 or Q4_1, dequantized to fp32 at load (4 bytes per
 * parameter: SmolLM2-135M takes 538 MB).  llama.cpp's converter permutes
 * the Q and K rows so that RoPE rotates adjacent pairs, as here.
 *
 * llama2.c checkpoint format: llama2.c's legacy fp32 export ("v0"), little-endian:
 *   int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
 *   (vocab_size < 0: the classifier is stored separately, |vocab_size| tokens)
 *   then fp32 tensors, in this order:
 *     token_embedding [vocab][dim]
 *     rms_att         [n_layers][dim]
 *     wq              [n_layers][n_heads * head_dim][dim]
 *     wk              [n_layers][n_kv_heads * head_dim][dim]
 *     wv              [n_layers][n_kv_heads * head_dim][dim]
 *     wo              [n_layers][dim][n_heads * head_dim]
 *     rms_ffn         [n_layers][dim]
 *     w1              [n_layers][hidden_dim][dim]
 *     w2              [n_layers][dim][hidden_dim]
 *     w3              [n_layers][hidden_dim][dim]
 *     rms_final       [dim]
 *     freq_cis_real   [seq_len][head_dim / 2]   (unused: RoPE is recomputed)
 *     freq_cis_imag   [seq_len][head_dim / 2]   (unused)
 *     wcls            [vocab][dim]              (only when vocab_size < 0)
 * head_dim = dim / n_heads.  The file's length must be exactly what the
 * header implies; every weight must be finite.  The later llama2.c exports
 * (magic "ak42", versions 1 and 2) are recognised and refused by name.
 *
 * The forward pass (Llama): RMSNorm (eps norm_eps), RoPE (theta rope_theta,
 * pairs of adjacent dims within each head; llama2.c: 1e-5 and 10000), GQA attention through a KV backend
 * (kvback.h), SwiGLU FFN, final RMSNorm, classifier.  Matrix products
 * accumulate in fp32 in index order; the RoPE angles are computed in double.
 */
#ifndef TQR_MODEL_H
#define TQR_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kvback.h"
#include "tqr_util.h"

#define TQR_CKPT_HEADER_BYTES 28
#define TQR_CKPT_MAGIC_AK42   0x616b3432  /* "ak42": llama2.c export v1/v2 */

struct tqr_config {
	int dim;
	int hidden_dim;
	int n_layers;
	int n_heads;
	int n_kv_heads;
	int vocab_size;          /* always > 0 here */
	int seq_len;
	int head_dim;            /* dim / n_heads */
	int kv_dim;              /* n_kv_heads * head_dim */
	int shared_classifier;   /* 1: wcls is the token embedding */
	float rope_theta;        /* RoPE base: 10000 for llama2.c checkpoints */
	float norm_eps;          /* RMSNorm epsilon: 1e-5 for llama2.c checkpoints */
};

typedef struct tqr_model tqr_model;

/* -errno of open/read, -EINVAL (format, sizes, non-finite weights; the
 * message names the field or tensor), -EOPNOTSUPP (a head_dim the codecs do
 * not support; an architecture, a weight type or a feature of a GGUF model
 * that tqkv-run does not run), -ENOMEM.  Immutable afterwards; shareable between threads. */
int tqr_model_load(tqr_model **out, const char *path, tqr_error *err);
void tqr_model_free(tqr_model *m);
/* Lowers the context (seq_len) to ctx tokens, 2 <= ctx <= the file's:
 * before any forward state or KV backend is made for the model. */
int tqr_model_limit_context(tqr_model *m, int ctx, tqr_error *err);
const struct tqr_config *tqr_model_config(const tqr_model *m);

/* The weights (pointers into the model). */
struct tqr_weights {
	const float *token_embedding, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn;
	const float *w1, *w2, *w3, *rms_final, *wcls;
};

/* Activations for chunks of up to max_chunk tokens.  One per thread. */
typedef struct tqr_forward tqr_forward;
int tqr_forward_new(tqr_forward **out, const tqr_model *m, int max_chunk, tqr_error *err);
void tqr_forward_free(tqr_forward *f);

/* Runs tokens[0..n) at positions pos0 .. pos0 + n - 1 (1 <= n <= max_chunk,
 * pos0 + n <= seq_len) through the model, with the KV cache in `kv` (which
 * must hold exactly pos0 tokens per layer; it holds pos0 + n afterwards).
 * logits: NULL, or [n][vocab] when all_logits, else [vocab] for the last
 * token.  -EINVAL for a bad token id or range, or the backend's error. */
int tqr_forward_run(tqr_forward *f, tqr_kv *kv, const int *tokens, int n, int pos0,
		    float *logits, int all_logits, tqr_error *err);

/* Called with each chunk's logits rows that were scored: [rows][vocab]. */
typedef int (*tqr_logits_fn)(void *arg, const float *logits, int rows);

/* Teacher-forced scoring of one sequence from position 0: empties `kv`, runs
 * tokens[0..n) (2 <= n <= seq_len) in chunks of max_chunk tokens and adds
 * -log p(tokens[i + 1] | tokens[0..i]) for first <= i < n - 1 to *nll
 * (natural log, softmax in double); the positions before `first` (0 <=
 * first <= n - 2) are context only — llama.cpp's perplexity scores the
 * second half of each chunk, first = n / 2.  logits: scratch of
 * [max_chunk][vocab].  on_logits (may be NULL) gets the scored rows.
 * Returns the number of tokens scored (n - 1 - first), or a negative errno
 * (the backend's, on_logits', or -EINVAL). */
long tqr_forward_score(tqr_forward *f, tqr_kv *kv, const int *tokens, int n, int first, float *logits,
		       double *nll, tqr_logits_fn on_logits, void *arg, tqr_error *err);
/* One chunk of the same: the max_chunk tokens at pos (a multiple of
 * max_chunk; pos 0 empties `kv` first) of the n-token sequence, whose
 * earlier chunks `kv` holds.  Several sequences can so be scored
 * interleaved, one kv each, with the bits of scoring them one by one.
 * Returns the rows scored, or a negative errno. */
long tqr_forward_score_chunk(tqr_forward *f, tqr_kv *kv, const int *tokens, int n, int pos, int first,
			     float *logits, double *nll, tqr_logits_fn on_logits, void *arg, tqr_error *err);

#endif /* TQR_MODEL_H */
