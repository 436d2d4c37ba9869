/* model_internal.h — what model.c (llama2.c checkpoints, the forward pass)
 * and model_gguf.c (GGUF llama models) share: the model's body. */
#ifndef TQR_MODEL_INTERNAL_H
#define TQR_MODEL_INTERNAL_H

#include "model.h"

struct tqr_model {
	struct tqr_config cfg;
	void *file;               /* malloc'd: the checkpoint or the dequantized weights; w points into it */
	struct tqr_weights w;
	float *rope_cos;          /* [seq_len][head_dim / 2] */
	float *rope_sin;          /* [seq_len][head_dim / 2] */
};

/* Header bounds: generous for real models, tight enough that every size
 * computed from them fits in 64 bits with room to spare. */
#define TQR_DIM_MAX     65536
#define TQR_HIDDEN_MAX  (1 << 20)
#define TQR_LAYERS_MAX  1024
#define TQR_HEADS_MAX   1024
#define TQR_VOCAB_MAX   (1 << 22)
#define TQR_SEQ_MAX     (1 << 20)

/* Loads a GGUF llama model into m (zeroed): cfg (rope_theta, norm_eps from
 * the metadata), file (the weights dequantized to fp32) and w.  The RoPE
 * tables are left to the caller.  Errors as tqr_model_load(). */
int tqr_model_load_gguf(tqr_model *m, const char *path, tqr_error *err);

#endif /* TQR_MODEL_INTERNAL_H */
