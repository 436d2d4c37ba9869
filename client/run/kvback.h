/* kvback.h — where tqkv-run keeps its KV cache.  One interface, three
 * backends (rows of an ops table in kvback.c):
 *
 *   exact   a plain fp32 cache in this process and straightforward float
 *           attention: the reference (`--local --kv f32`);
 *   local   the tqkvd kernels in this process: K/V encoded with tq_codec into
 *           pages of kernels/tq_page.h, attention by tq_attend
 *           (`--local --k C --v C`);
 *   daemon  a tqkvd session through libtqkv (the default).
 *
 * The forward pass hands a backend, per layer, the new tokens' K (after
 * RoPE), V and Q and gets the causal attention output back; the backend
 * appends the K/V to that layer and attends the queries over everything the
 * layer holds.  Shapes:
 *   q, out: [n][n_q_heads][head_dim] fp32
 *   k, v:   [n][n_kv_heads][head_dim] fp32
 * Query i sits at position pos0 + i and sees keys 0 .. pos0 + i; pos0 must be
 * the layer's current length.
 *
 * A tqr_kv is used by one thread at a time.
 */
#ifndef TQR_KVBACK_H
#define TQR_KVBACK_H

#include <stdint.h>

#include "tq_codec.h"
#include "tqr_util.h"

struct tqr_kv_geom {
	int n_layers;
	int n_kv_heads;
	int n_q_heads;      /* a multiple of n_kv_heads */
	int head_dim;
	int max_tokens;     /* per layer */
};

struct tqr_kv_stats {
	uint64_t tokens;          /* tokens held now (layer 0)                               */
	uint64_t peak_tokens;     /* the most tokens held at once since creation             */
	uint64_t bytes_per_token; /* n_layers * n_kv_heads * (K block + V block)             */
	uint64_t fp16_per_token;  /* the same for an fp16 cache: n_layers * n_kv_heads * 4 * head_dim */
	uint64_t resident_bytes;  /* what the backend holds now (pages, rounding); 0 = unknown */
};

typedef struct tqr_kv tqr_kv;

/* Backends.  0, -EINVAL (geometry, codecs), -ENOMEM, or what the daemon said. */
int tqr_kv_new_exact(tqr_kv **out, const struct tqr_kv_geom *g, tqr_error *err);

struct tqr_kv_local_opts {
	enum tq_codec_id k_codec, v_codec;
	uint64_t rotation_seed;   /* the session seed: layer l's K and V codecs use   */
				  /* tqkv_seed_derive(seed, l, 0 / 1) like tqkvd     */
	int threads;              /* attention threads (>= 1)                        */
	int page_tokens;          /* tokens per page (0 = 64)                         */
	int reference;            /* 1: tq_attend_ref (the oracle) instead of tq_attend */
	float sparse_v;           /* tq_attn_params.sparse_v (0: off)                */
	uint32_t kv_xform;        /* TQ_XF_* K/V transforms (kernels/tq_xform.h),    */
				  /* calibrated as tqkvd does; 0: none               */
};
int tqr_kv_new_local(tqr_kv **out, const struct tqr_kv_geom *g, const struct tqr_kv_local_opts *o,
		     tqr_error *err);

struct tqr_kv_daemon_opts {
	const char *run_dir;      /* tqkvd's run directory (control.sock, data.sock) */
	const char *tenant;       /* NULL: "default"                                  */
	enum tq_codec_id k_codec, v_codec;
	uint64_t rotation_seed;   /* passed to the session: the same codecs as local  */
	const char *kv_transform; /* the session's K/V transforms (tqkv_session_params */
				  /* .kv_transform); NULL: the daemon's default      */
};
/* Connects to tqkvd and opens an ephemeral session (closed when this
 * process's connection ends).  The daemon's error is in err.  (kvback_daemon.c,
 * linked with libtqkv.) */
int tqr_kv_new_daemon(tqr_kv **out, const struct tqr_kv_geom *g, const struct tqr_kv_daemon_opts *o,
		      tqr_error *err);

void tqr_kv_free(tqr_kv *kv);

/* The backend's name for messages: "exact f32", "local q8/tq4", ... */
const char *tqr_kv_name(const tqr_kv *kv);

/* Appends n tokens to `layer` and attends their queries (see above).
 * -EINVAL (pos0 is not the layer's length, n out of range, non-finite
 * values), -ENOSPC (beyond max_tokens), or the kernel's / daemon's error. */
int tqr_kv_append_attend(tqr_kv *kv, int layer, int pos0, int n, const float *q,
			 const float *k, const float *v, float *out, tqr_error *err);

/* Empties every layer (a new sequence starts at position 0). */
int tqr_kv_reset(tqr_kv *kv, tqr_error *err);

void tqr_kv_stats(const tqr_kv *kv, struct tqr_kv_stats *st);

#endif /* TQR_KVBACK_H */
