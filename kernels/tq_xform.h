/* tq_xform.h — transforms of one layer's keys and values that attention
 * undoes exactly, so a codec sees vectors it quantizes better.
 *
 * Per KV head h and channel c, with statistics from the layer's first
 * append (its calibration):
 *
 *   K centering     k' = k − μk              softmax is invariant to the
 *                                             per-query constant q·μk: no
 *                                             correction at all
 *   K equalization  k' = (k − μk) / s,  q' = q ∘ s     (q'·k' = q·(k − μk))
 *                   s_c = sqrt(rms k_c / rms q_c) (TQ_XF_K_EQ_QK: needs the
 *                   calibration's queries) or sqrt(rms k_c) (TQ_XF_K_EQ_K),
 *                   normalized to geometric mean 1.  With a rotation after
 *                   it, the score's quantization error is about
 *                   Σ q_c² s_c² · Σ k_c² / s_c², which the first choice
 *                   minimizes (Cauchy–Schwarz).
 *   V centering     v' = v − μv, out += μv   (the weights sum to one)
 *   V equalization  v' = (v − μv) / t,  out = out' ∘ t + μv  (Σ p = 1:
 *                   exact); t_c = sqrt(rms v'_c), geometric mean 1.  The
 *                   output's quantization error is about Σ t_c² · Σ v_c²/t_c²
 *                   (the rotation spreads each row's error evenly over its
 *                   channels, then ∘ t weights them): minimal for this t.
 *   K sink centring k' = k − k0 (TQ_XF_K_SINK, instead of μk): the first
 *                   token's key — the attention sink's, which takes much of
 *                   the weight in late layers — becomes 0 and encodes
 *                   exactly; the other keys keep their offset from it
 *
 *   K order         k'' = P k',  q'' = P q'  (a permutation of the
 *                   channels, the same for keys and queries: q''·k'' =
 *                   q'·k'), most important first, importance E[k'_c²] ·
 *                   E[q'_c²] (E[k'_c²] alone without queries; after
 *                   centering, the same with or without equalization).
 *                   Applied only with a K codec that gives its first half
 *                   more bits (tq3o, tq4o: tq_layout.h) — the paper's
 *                   outlier channels; with the others it would change nothing.
 *
 * and one correction that needs no statistics, K unshrink: a norm-corrected
 * TurboQuant key shrinks every logit by about sqrt(1 − D) on average
 * (tq_codec_shrink: tq4 0.9954, tq3 0.983) — softer attention than the
 * exact one; queries × 1/shrink undo it (no effect for q8, f16, f32; each
 * half of tq3o / tq4o by its own factor, tq_codec_shrink_at).
 *
 * Why K centering pays: real keys carry a large shared offset (RoPE'd
 * channels with a bias); the codec spends its bits on the vector's norm,
 * mostly offset.  Why V centering is off by default: attention-sink tokens
 * (BOS) take much of the weight and have values near zero; centering gives
 * them a large v' and so a large error (BENCHMARKS.md 4a has the figures).
 *
 * Lifecycle: a layer's transform is calibrated by the first append to the
 * empty layer (and again after the layer is emptied by a truncation), from
 * that append's keys (values, queries); it is frozen until then.  An append
 * of fewer than TQ_XF_MIN_TOKENS tokens calibrates to the identity (too few
 * tokens for a mean) but for K unshrink; so does a mode of 0.  Equalization from queries falls
 * back to none when the calibrating append brought no queries.  What was
 * applied is tq_xf_applied().
 *
 * The same code runs in tqkvd and in tqkv-run's in-process backend, so the
 * two give the same bits.  Nothing here allocates after tq_xf_new, logs, or
 * keeps global state; an object is used by one thread at a time.
 */
#ifndef TQ_XFORM_H
#define TQ_XFORM_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>

#include "tq_codec.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
	TQ_XF_K_CENTER = 1u << 0,  /* keys minus their channel mean          */
	TQ_XF_V_CENTER = 1u << 1,  /* values minus theirs, added back         */
	TQ_XF_K_EQ_QK  = 1u << 2,  /* channel scales from keys and queries    */
	TQ_XF_K_EQ_K   = 1u << 3,  /* channel scales from keys alone          */
	TQ_XF_K_UNSHRINK = 1u << 4, /* queries × 1/tq_codec_shrink(K codec)   */
	TQ_XF_K_SINK   = 1u << 5,  /* keys minus the first token's key         */
	TQ_XF_V_EQ     = 1u << 6,  /* values / channel scales, output × them  */
	TQ_XF_K_ORDER  = 1u << 7,  /* keys' loudest channels first (tq*o)     */
};
#define TQ_XF_MASK    0xffu
/* The default for new sessions (measured: BENCHMARKS.md 4a). */
#define TQ_XF_DEFAULT (TQ_XF_K_CENTER | TQ_XF_V_EQ | TQ_XF_K_EQ_QK | TQ_XF_K_UNSHRINK | TQ_XF_K_ORDER)
#define TQ_XF_MIN_TOKENS 8u
/* A calibration reads at most this many tokens (and queries): the first. */
#define TQ_XF_CALIB_MAX  512u
/* Scales are clamped to [1/TQ_XF_SCALE_MAX, TQ_XF_SCALE_MAX]. */
#define TQ_XF_SCALE_MAX 256.0f
/* Means (and the K sink's key) are clamped to ±TQ_XF_MEAN_MAX, 3.4e38 /
 * 512: (x − μ) / s then stays finite for every |x| below 6.6e35, so only
 * inputs that large can overflow the transforms (the daemon refuses such a
 * row, NONFINITE).  Any centre is exact — attention undoes whichever
 * constant is taken off — so the clamp costs only absurd data its
 * centering; stored statistics beyond it are refused. */
#define TQ_XF_MEAN_MAX (FLT_MAX / (2.0f * TQ_XF_SCALE_MAX))

typedef struct tq_xf tq_xf;

/* A mode is valid when it has no unknown bits, at most one of the two
 * equalizations and at most one K centre: 0, or -EINVAL with err. */
int tq_xf_mode_check(uint32_t mode, tq_error *err);
/* "k-center+k-eq-qk", "none", ... into buf (always terminated); a buffer
 * of TQ_XF_NAME_MAX bytes holds any mode's name whole (test_xform checks). */
#define TQ_XF_NAME_MAX 96
const char *tq_xf_mode_str(uint32_t mode, char *buf, size_t len);
/* Parse a comma/plus separated list ("k-center,k-eq-qk", "none",
 * "default"): 0 and *mode, or -EINVAL. */
int tq_xf_mode_parse(const char *s, uint32_t *mode);

/* A transform for one layer of n_kv_heads × dim (n_q_heads a multiple),
 * uncalibrated; k_codec: the layer's K codec (K unshrink's factor), or
 * NULL (no unshrink: factor 1).  -EINVAL (mode, shapes), -ENOMEM. */
int tq_xf_new(tq_xf **out, uint32_t mode, uint32_t n_kv_heads, uint32_t n_q_heads, uint32_t dim,
	      const tq_codec *k_codec, tq_error *err);
void tq_xf_free(tq_xf *xf);
/* The K codec, when it comes after tq_xf_new (NULL then): K unshrink's
 * factors and whether K order applies (at calibration) depend on it. */
void tq_xf_set_k_codec(tq_xf *xf, const tq_codec *k_codec);
/* Back to uncalibrated (the layer was emptied). */
void tq_xf_reset(tq_xf *xf);
int tq_xf_calibrated(const tq_xf *xf);
/* The parts in use after calibration (a subset of the mode); 0 before. */
uint32_t tq_xf_applied(const tq_xf *xf);
uint32_t tq_xf_calib_tokens(const tq_xf *xf);

/* Calibrate from n tokens: k, v [n][n_kv_heads][dim], q [n_q][n_q_heads][dim]
 * or NULL, all of dtype; only the first TQ_XF_CALIB_MAX of each are read,
 * and those must be finite (the caller has checked).  Only on an
 * uncalibrated transform (-EALREADY otherwise). */
int tq_xf_calibrate(tq_xf *xf, const void *k, const void *v, const void *q, uint32_t n, uint32_t n_q,
		    enum tq_dtype dtype);

/* Keys / values of n tokens into fp32 rows ready for the codec; queries of
 * n_q tokens into fp32 rows ready for attention.  In and out either do not
 * overlap or are the same fp32 buffer (element-wise).  Before calibration (or with nothing applied) these convert only. */
void tq_xf_keys(const tq_xf *xf, const void *k, enum tq_dtype dtype, uint32_t n, float *out);
void tq_xf_values(const tq_xf *xf, const void *v, enum tq_dtype dtype, uint32_t n, float *out);
void tq_xf_queries(const tq_xf *xf, const void *q, enum tq_dtype dtype, uint32_t n_q, float *out);
/* Attention's output rows [n_q][n_q_heads][dim]: the value mean added back
 * (V centering; otherwise nothing). */
void tq_xf_output(const tq_xf *xf, float *out, uint32_t n_q);
/* Does the transform change anything at attention time (queries scaled,
 * outputs corrected)? */
int tq_xf_touches_queries(const tq_xf *xf);
int tq_xf_touches_output(const tq_xf *xf);

/* The frozen statistics as bytes (stored with persistent sessions):
 * size, then the bytes (little-endian floats; only the parts applied). */
size_t tq_xf_blob_bytes(const tq_xf *xf);
void tq_xf_blob_write(const tq_xf *xf, uint8_t *buf);
/* Load a calibrated state from untrusted bytes: checks magic, shapes
 * against xf's, flags against its mode, sizes, finite values and scale
 * range.  0, or -EBADMSG with err (xf then unchanged). */
int tq_xf_blob_read(tq_xf *xf, const uint8_t *buf, size_t len, tq_error *err);

/* What an operator sees (tqctl session). */
struct tq_xf_summary {
	uint32_t applied;          /* TQ_XF_* in use; 0 when not calibrated  */
	uint32_t calibrated;       /* 0/1                                     */
	uint32_t calib_tokens;
	float k_rms;               /* rms of the calibration keys' norms      */
	float k_mean_norm;         /* mean over heads of |μk|                 */
	float v_rms, v_mean_norm;
	float scale_min, scale_max; /* equalization's channel scales (1, 1 if none) */
};
void tq_xf_summarize(const tq_xf *xf, struct tq_xf_summary *out);

#ifdef __cplusplus
}
#endif
#endif /* TQ_XFORM_H */
