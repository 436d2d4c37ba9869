/* model_gguf.c — llama models from GGUF files: configuration from the
 * metadata, weights dequantized to fp32 in llama2.c's layout (model.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model_internal.h"

/* A metadata integer in [lo, hi]; `dflt` < 0: required. */
static int meta_int(const tqr_gguf *g, const char *path, const char *key, long dflt, long lo, long hi,
		    int *out, tqr_error *err)
{
	int64_t v;
	int rc = tqr_gguf_get_i64(g, key, &v, err);

	if (rc == -ENOENT && dflt >= 0) {
		*out = (int)dflt;
		return 0;
	}
	if (rc < 0)
		return rc;
	if (v < lo || v > hi)
		return tqr_fail(err, -EINVAL, "%s: metadata %s = %lld is outside [%ld, %ld]", path, key,
				(long long)v, lo, hi);
	*out = (int)v;
	return 0;
}

/* One weight of the llama layout: GGUF name (per layer: blk.N.<name>),
 * shape [ne1][ne0] (ne1 = 0: a vector), where it goes. */
struct spec {
	const char *name;
	int per_layer;
	uint64_t ne0, ne1;
	const float **dst;
};

/* The tensor `name` with the shape the metadata imply, in a type tqkv-run
 * reads (its bytes lie inside the file: gguf.c checked that): 0 and *out,
 * or an error.  Every tensor is checked before the fp32 weights are
 * allocated, so their size is bounded by the file's, not by metadata. */
static int check_tensor(const tqr_gguf *g, const char *path, const char *name, uint64_t ne0, uint64_t ne1,
			const struct tqr_gguf_tensor **out, tqr_error *err)
{
	const struct tqr_gguf_tensor *t = tqr_gguf_tensor_find(g, name);
	int is_vec = ne1 == 0;

	if (!t)
		return tqr_fail(err, -EINVAL, "%s: tensor %s is missing", path, name);
	if (t->ne[0] != ne0 || t->ne[1] != (is_vec ? 1 : ne1) || t->ne[2] != 1 || t->ne[3] != 1) {
		if (is_vec)
			return tqr_fail(err, -EINVAL, "%s: tensor %s is [%llu, %llu, %llu, %llu]; the metadata imply [%llu]",
					path, name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
					(unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
					(unsigned long long)ne0);
		return tqr_fail(err, -EINVAL, "%s: tensor %s is [%llu, %llu, %llu, %llu]; the metadata imply [%llu, %llu]",
				path, name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
				(unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
				(unsigned long long)ne0, (unsigned long long)ne1);
	}
	if (!tqr_ggml_dequant_supported(t->type))
		return tqr_fail(err, -EOPNOTSUPP, "%s: tensor %s is %s: tqkv-run loads F32, F16, BF16, Q8_0, Q4_0 and Q4_1",
				path, name, tqr_ggml_type_name(t->type));
	*out = t;
	return 0;
}

static int load_tensor(const tqr_gguf *g, const char *path, const char *name, uint64_t ne0, uint64_t ne1,
		       float *dst, tqr_error *err)
{
	const struct tqr_gguf_tensor *t;
	int rc;

	if ((rc = check_tensor(g, path, name, ne0, ne1, &t, err)) < 0)
		return rc;
	tqr_ggml_dequant(t->type, t->data, t->n_elems, dst);
	for (uint64_t j = 0; j < t->n_elems; j++)
		if (!isfinite(dst[j]))
			return tqr_fail(err, -EINVAL, "%s: tensor %s has a non-finite value at element %llu", path,
					name, (unsigned long long)j);
	return 0;
}

int tqr_model_load_gguf(tqr_model *m, const char *path, tqr_error *err)
{
	struct tqr_config c = { 0 };
	tqr_gguf *g = NULL;
	const char *s;
	size_t n;
	float *buf = NULL;
	int rc, v = 0;

	if ((rc = tqr_gguf_open(&g, path, err)) < 0)
		return rc;
	if ((rc = tqr_gguf_get_str(g, "general.architecture", &s, &n, err)) < 0)
		goto fail;
	if (n != 5 || memcmp(s, "llama", 5)) {
		rc = tqr_fail(err, -EOPNOTSUPP, "%s: general.architecture is '%.*s': tqkv-run runs llama models",
			      path, (int)(n > 64 ? 64 : n), s);
		goto fail;
	}
	if ((rc = meta_int(g, path, "llama.embedding_length", -1, 1, TQR_DIM_MAX, &c.dim, err)) < 0 ||
	    (rc = meta_int(g, path, "llama.feed_forward_length", -1, 1, TQR_HIDDEN_MAX, &c.hidden_dim, err)) < 0 ||
	    (rc = meta_int(g, path, "llama.block_count", -1, 1, TQR_LAYERS_MAX, &c.n_layers, err)) < 0 ||
	    (rc = meta_int(g, path, "llama.attention.head_count", -1, 1, TQR_HEADS_MAX, &c.n_heads, err)) < 0 ||
	    (rc = meta_int(g, path, "llama.attention.head_count_kv", c.n_heads, 1, c.n_heads, &c.n_kv_heads, err)) < 0 ||
	    (rc = meta_int(g, path, "llama.context_length", -1, 1, TQR_SEQ_MAX, &c.seq_len, err)) < 0)
		goto fail;
	if (c.dim % c.n_heads || c.n_heads % c.n_kv_heads) {
		rc = tqr_fail(err, -EINVAL, "%s: inconsistent metadata: embedding_length %d, head_count %d, head_count_kv %d",
			      path, c.dim, c.n_heads, c.n_kv_heads);
		goto fail;
	}
	c.head_dim = c.dim / c.n_heads;
	c.kv_dim = c.n_kv_heads * c.head_dim;
	if (c.head_dim % 2 || tq_dim_check(c.head_dim, NULL) < 0) {
		rc = tqr_fail(err, -EOPNOTSUPP, "%s: head_dim %d (embedding_length %d / head_count %d) is not supported: tqkvd's codecs take multiples of %d from %d to %d",
			      path, c.head_dim, c.dim, c.n_heads, TQ_DIM_ALIGN, TQ_DIM_MIN, TQ_DIM_MAX);
		goto fail;
	}
	/* what this forward pass does not do: partial or scaled RoPE, other
	 * head sizes, experts */
	static const char *const same_as_head_dim[] = {
		"llama.rope.dimension_count", "llama.attention.key_length", "llama.attention.value_length",
	};
	for (size_t i = 0; i < sizeof(same_as_head_dim) / sizeof(same_as_head_dim[0]); i++) {
		if ((rc = meta_int(g, path, same_as_head_dim[i], c.head_dim, 1, TQR_DIM_MAX, &v, err)) < 0)
			goto fail;
		if (v != c.head_dim) {
			rc = tqr_fail(err, -EOPNOTSUPP, "%s: %s = %d differs from head_dim %d: not supported",
				      path, same_as_head_dim[i], v, c.head_dim);
			goto fail;
		}
	}
	if ((rc = meta_int(g, path, "llama.expert_count", 0, 0, INT32_MAX, &v, err)) < 0)
		goto fail;
	if (v > 0) {
		rc = tqr_fail(err, -EOPNOTSUPP, "%s: llama.expert_count = %d: mixture-of-experts models are not supported",
			      path, v);
		goto fail;
	}
	if (tqr_gguf_get_str(g, "llama.rope.scaling.type", &s, &n, NULL) == 0 &&
	    !(n == 0 || (n == 4 && !memcmp(s, "none", 4)))) {
		rc = tqr_fail(err, -EOPNOTSUPP, "%s: llama.rope.scaling.type '%.*s' is not supported", path,
			      (int)(n > 64 ? 64 : n), s);
		goto fail;
	}
	if (tqr_gguf_tensor_find(g, "rope_freqs.weight")) {
		rc = tqr_fail(err, -EOPNOTSUPP, "%s: tensor rope_freqs.weight (scaled RoPE frequencies) is not supported",
			      path);
		goto fail;
	}
	c.rope_theta = 10000.0f;
	c.norm_eps = 1e-5f;
	if ((rc = tqr_gguf_get_f32(g, "llama.rope.freq_base", &c.rope_theta, err)) < 0 && rc != -ENOENT)
		goto fail;
	if ((rc = tqr_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &c.norm_eps, err)) < 0 &&
	    rc != -ENOENT)
		goto fail;
	if (!(c.rope_theta > 1.0f) || !(c.norm_eps > 0.0f && c.norm_eps < 1.0f)) {
		rc = tqr_fail(err, -EINVAL, "%s: rope.freq_base %g must be > 1, layer_norm_rms_epsilon %g in (0, 1)",
			      path, (double)c.rope_theta, (double)c.norm_eps);
		goto fail;
	}

	/* the vocabulary is the embedding's */
	const struct tqr_gguf_tensor *emb = tqr_gguf_tensor_find(g, "token_embd.weight");
	if (!emb) {
		rc = tqr_fail(err, -EINVAL, "%s: tensor token_embd.weight is missing", path);
		goto fail;
	}
	if (emb->ne[1] < 3 || emb->ne[1] > TQR_VOCAB_MAX) {
		rc = tqr_fail(err, -EINVAL, "%s: token_embd.weight has %llu rows: the vocabulary must be in [3, %d]",
			      path, (unsigned long long)emb->ne[1], TQR_VOCAB_MAX);
		goto fail;
	}
	c.vocab_size = (int)emb->ne[1];
	if ((rc = meta_int(g, path, "llama.vocab_size", c.vocab_size, 0, TQR_VOCAB_MAX, &v, err)) < 0)
		goto fail;
	if (v != c.vocab_size) {
		rc = tqr_fail(err, -EINVAL, "%s: llama.vocab_size %d differs from token_embd.weight's %d rows", path,
			      v, c.vocab_size);
		goto fail;
	}
	c.shared_classifier = !tqr_gguf_tensor_find(g, "output.weight");

	uint64_t D = (uint64_t)c.dim, F = (uint64_t)c.hidden_dim, KD = (uint64_t)c.kv_dim, V = (uint64_t)c.vocab_size;
	struct tqr_weights *w = &m->w;
	const struct spec sp[] = {
		{ "token_embd.weight", 0, D, V, &w->token_embedding },
		{ "attn_norm.weight", 1, D, 0, &w->rms_att },
		{ "attn_q.weight", 1, D, D, &w->wq },
		{ "attn_k.weight", 1, D, KD, &w->wk },
		{ "attn_v.weight", 1, D, KD, &w->wv },
		{ "attn_output.weight", 1, D, D, &w->wo },
		{ "ffn_norm.weight", 1, D, 0, &w->rms_ffn },
		{ "ffn_gate.weight", 1, D, F, &w->w1 },
		{ "ffn_down.weight", 1, F, D, &w->w2 },
		{ "ffn_up.weight", 1, D, F, &w->w3 },
		{ "output_norm.weight", 0, D, 0, &w->rms_final },
		{ "output.weight", 0, D, V, c.shared_classifier ? NULL : &w->wcls },
	};
	const size_t nsp = sizeof(sp) / sizeof(sp[0]);
	uint64_t total = 0, off[sizeof(sp) / sizeof(sp[0])];
	for (size_t i = 0; i < nsp; i++) {
		off[i] = total;
		if (sp[i].dst)
			total += (sp[i].per_layer ? (uint64_t)c.n_layers : 1) * sp[i].ne0 * (sp[i].ne1 ? sp[i].ne1 : 1);
	}
	for (size_t i = 0; i < nsp; i++)
		for (int l = 0; sp[i].dst && l < (sp[i].per_layer ? c.n_layers : 1); l++) {
			const struct tqr_gguf_tensor *t;
			char name[64];
			if (sp[i].per_layer)
				snprintf(name, sizeof(name), "blk.%d.%s", l, sp[i].name);
			else
				snprintf(name, sizeof(name), "%s", sp[i].name);
			if ((rc = check_tensor(g, path, name, sp[i].ne0, sp[i].ne1, &t, err)) < 0)
				goto fail;
		}
	if (total > ((uint64_t)1 << 36) || !(buf = malloc(sizeof(float) * (size_t)total))) {
		rc = tqr_fail(err, -ENOMEM, "%s: out of memory for %llu fp32 weights", path, (unsigned long long)total);
		goto fail;
	}
	for (size_t i = 0; i < nsp; i++) {
		if (!sp[i].dst)
			continue;
		uint64_t per = sp[i].ne0 * (sp[i].ne1 ? sp[i].ne1 : 1);
		for (int l = 0; l < (sp[i].per_layer ? c.n_layers : 1); l++) {
			char name[64];
			if (sp[i].per_layer)
				snprintf(name, sizeof(name), "blk.%d.%s", l, sp[i].name);
			else
				snprintf(name, sizeof(name), "%s", sp[i].name);
			if ((rc = load_tensor(g, path, name, sp[i].ne0, sp[i].ne1, buf + off[i] + (uint64_t)l * per,
					      err)) < 0)
				goto fail;
		}
		*sp[i].dst = buf + off[i];
	}
	if (c.shared_classifier)
		w->wcls = w->token_embedding;
	m->cfg = c;
	m->file = buf;
	tqr_gguf_free(g);
	return 0;
fail:
	free(buf);
	memset(&m->w, 0, sizeof(m->w));
	tqr_gguf_free(g);
	return rc;
}
