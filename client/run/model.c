/* model.c — llama2.c legacy checkpoints and the Llama forward pass (GGUF
 * models are read by model_gguf.c). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "model_internal.h"

void tqr_model_free(tqr_model *m)
{
	if (!m)
		return;
	free(m->file);
	free(m->rope_cos);
	free(m->rope_sin);
	free(m);
}

const struct tqr_config *tqr_model_config(const tqr_model *m)
{
	return &m->cfg;
}

static int32_t rd_i32(const unsigned char *p)
{
	return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

static int check_range(const char *path, const char *field, int v, int lo, int hi, tqr_error *err)
{
	if (v >= lo && v <= hi)
		return 0;
	return tqr_fail(err, -EINVAL, "%s: not a llama2.c legacy checkpoint: header field %s = %d is outside [%d, %d]",
			path, field, v, lo, hi);
}

/* Tensor table: name and element count, in file order. */
struct tensor {
	const char *name;
	uint64_t n;
	const float **dst;   /* NULL: skipped (freq_cis) */
	int check;           /* 1: must be finite */
};

/* The RoPE tables of m->cfg: angle pos * theta^(-2i / head_dim), in double. */
static int rope_init(tqr_model *m, const char *path, tqr_error *err)
{
	const struct tqr_config *c = &m->cfg;
	size_t half = (size_t)c->head_dim / 2, nrope = (size_t)c->seq_len * half;

	m->rope_cos = malloc(sizeof(float) * nrope);
	m->rope_sin = malloc(sizeof(float) * nrope);
	if (!m->rope_cos || !m->rope_sin)
		return tqr_fail(err, -ENOMEM, "%s: out of memory", path);
	for (int pos = 0; pos < c->seq_len; pos++)
		for (size_t i = 0; i < half; i++) {
			double freq = pow((double)c->rope_theta, -(double)(2 * i) / c->head_dim);
			double a = pos * freq;
			m->rope_cos[(size_t)pos * half + i] = (float)cos(a);
			m->rope_sin[(size_t)pos * half + i] = (float)sin(a);
		}
	return 0;
}

/* 1 when path starts with the GGUF magic (0 when it does not or cannot be read:
 * the llama2.c loader then says why). */
static int is_gguf(const char *path)
{
	unsigned char b[4];
	int fd = open(path, O_RDONLY | O_CLOEXEC), yes = 0;

	if (fd < 0)
		return 0;
	yes = read(fd, b, 4) == 4 && (uint32_t)rd_i32(b) == TQR_GGUF_MAGIC;
	close(fd);
	return yes;
}

static int load_gguf(tqr_model **out, const char *path, tqr_error *err)
{
	tqr_model *m = calloc(1, sizeof(*m));
	int rc;

	if (!m)
		return tqr_fail(err, -ENOMEM, "%s: out of memory", path);
	if ((rc = tqr_model_load_gguf(m, path, err)) < 0 || (rc = rope_init(m, path, err)) < 0) {
		tqr_model_free(m);
		return rc;
	}
	*out = m;
	return 0;
}

int tqr_model_load(tqr_model **out, const char *path, tqr_error *err)
{
	struct tqr_config c = { 0 };
	unsigned char *buf = NULL;
	tqr_model *m = NULL;
	size_t len;
	int32_t h[7];
	int rc;

	*out = NULL;
	if (is_gguf(path))
		return load_gguf(out, path, err);
	if ((rc = tqr_file_read(path, (size_t)1 << 38, &buf, &len, err)) < 0)
		return rc;
	if (len >= 8 && (uint32_t)rd_i32(buf) == TQR_CKPT_MAGIC_AK42) {
		rc = tqr_fail(err, -EINVAL, "%s: a llama2.c version-%d export (magic \"ak42\"); tqkv-run reads the legacy fp32 format (export.py --version 0)",
			      path, rd_i32(buf + 4));
		goto fail;
	}
	if (len < TQR_CKPT_HEADER_BYTES) {
		rc = tqr_fail(err, -EINVAL, "%s: truncated: %zu bytes, a checkpoint header alone is %d",
			      path, len, TQR_CKPT_HEADER_BYTES);
		goto fail;
	}
	for (int i = 0; i < 7; i++)
		h[i] = rd_i32(buf + 4 * i);
	c.dim = h[0];
	c.hidden_dim = h[1];
	c.n_layers = h[2];
	c.n_heads = h[3];
	c.n_kv_heads = h[4];
	c.shared_classifier = h[5] > 0;
	c.vocab_size = h[5] > 0 ? h[5] : (h[5] == INT32_MIN ? 0 : -h[5]);
	c.seq_len = h[6];
	if ((rc = check_range(path, "dim", c.dim, 1, TQR_DIM_MAX, err)) < 0 ||
	    (rc = check_range(path, "hidden_dim", c.hidden_dim, 1, TQR_HIDDEN_MAX, err)) < 0 ||
	    (rc = check_range(path, "n_layers", c.n_layers, 1, TQR_LAYERS_MAX, err)) < 0 ||
	    (rc = check_range(path, "n_heads", c.n_heads, 1, TQR_HEADS_MAX, err)) < 0 ||
	    (rc = check_range(path, "n_kv_heads", c.n_kv_heads, 1, c.n_heads, err)) < 0 ||
	    (rc = check_range(path, "|vocab_size|", c.vocab_size, 3, TQR_VOCAB_MAX, err)) < 0 ||
	    (rc = check_range(path, "seq_len", c.seq_len, 1, TQR_SEQ_MAX, err)) < 0)
		goto fail;
	if (c.dim % c.n_heads || c.n_heads % c.n_kv_heads) {
		rc = tqr_fail(err, -EINVAL, "%s: inconsistent header: dim %d, n_heads %d, n_kv_heads %d (dim must be a multiple of n_heads, n_heads of n_kv_heads)",
			      path, c.dim, c.n_heads, c.n_kv_heads);
		goto fail;
	}
	c.head_dim = c.dim / c.n_heads;
	c.kv_dim = c.n_kv_heads * c.head_dim;

	if (!(m = calloc(1, sizeof(*m)))) {
		rc = tqr_fail(err, -ENOMEM, "%s: out of memory", path);
		goto fail;
	}
	uint64_t L = (uint64_t)c.n_layers, D = (uint64_t)c.dim, F = (uint64_t)c.hidden_dim;
	uint64_t QD = (uint64_t)c.n_heads * c.head_dim, KD = (uint64_t)c.kv_dim;
	uint64_t V = (uint64_t)c.vocab_size;
	struct tensor t[] = {
		{ "token_embedding", V * D, &m->w.token_embedding, 1 },
		{ "rms_att", L * D, &m->w.rms_att, 1 },
		{ "wq", L * QD * D, &m->w.wq, 1 },
		{ "wk", L * KD * D, &m->w.wk, 1 },
		{ "wv", L * KD * D, &m->w.wv, 1 },
		{ "wo", L * D * QD, &m->w.wo, 1 },
		{ "rms_ffn", L * D, &m->w.rms_ffn, 1 },
		{ "w1", L * F * D, &m->w.w1, 1 },
		{ "w2", L * D * F, &m->w.w2, 1 },
		{ "w3", L * F * D, &m->w.w3, 1 },
		{ "rms_final", D, &m->w.rms_final, 1 },
		/* freq_cis_real and _imag; head_dim may be odd here (refused below) */
		{ "freq_cis", ((uint64_t)c.seq_len * (uint64_t)c.head_dim / 2) * 2, NULL, 0 },
		{ "wcls", c.shared_classifier ? 0 : V * D, &m->w.wcls, 1 },
	};
	uint64_t want = TQR_CKPT_HEADER_BYTES;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		want += 4 * t[i].n;
	if (len != want) {
		rc = tqr_fail(err, -EINVAL, "%s: %s: the file has %zu bytes, the header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, vocab_size %d%s, seq_len %d) implies %llu",
			      path, len < want ? "truncated" : "wrong size", len, c.dim, c.hidden_dim,
			      c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
			      c.shared_classifier ? "" : " unshared", c.seq_len, (unsigned long long)want);
		goto fail;
	}
	if (c.head_dim % 2 || tq_dim_check(c.head_dim, NULL) < 0) {
		rc = tqr_fail(err, -EOPNOTSUPP, "%s: head_dim %d (dim %d / n_heads %d) is not supported: tqkvd's codecs take multiples of %d from %d to %d",
			      path, c.head_dim, c.dim, c.n_heads, TQ_DIM_ALIGN, TQ_DIM_MIN, TQ_DIM_MAX);
		goto fail;
	}
	/* The buffer comes from malloc, so offset 28 is 4-byte aligned. */
	const float *p = (const float *)(buf + TQR_CKPT_HEADER_BYTES);
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		if (t[i].dst)
			*t[i].dst = p;
		for (uint64_t j = 0; t[i].check && j < t[i].n; j++)
			if (!isfinite(p[j])) {
				rc = tqr_fail(err, -EINVAL, "%s: tensor %s has a non-finite value at element %llu (byte %llu)",
					      path, t[i].name, (unsigned long long)j,
					      (unsigned long long)((const unsigned char *)(p + j) - buf));
				goto fail;
			}
		p += t[i].n;
	}
	if (c.shared_classifier)
		m->w.wcls = m->w.token_embedding;

	c.rope_theta = 10000.0f;
	c.norm_eps = 1e-5f;
	m->cfg = c;
	if ((rc = rope_init(m, path, err)) < 0)
		goto fail;
	m->file = buf;
	*out = m;
	return 0;
fail:
	tqr_model_free(m); /* m->file is still NULL: buf is freed below */
	free(buf);
	return rc;
}

/* ---- forward pass ------------------------------------------------------------ */

struct tqr_forward {
	const tqr_model *m;
	int max_chunk;
	/* [max_chunk][...] activations, one row per token of the chunk */
	float *x;     /* [dim] residual stream            */
	float *xb;    /* [dim] normed input of a block    */
	float *xb2;   /* [dim] block output               */
	float *q;     /* [n_heads * head_dim]             */
	float *k;     /* [kv_dim]                         */
	float *v;     /* [kv_dim]                         */
	float *att;   /* [n_heads * head_dim]             */
	float *hb;    /* [hidden_dim]                     */
	float *hb2;   /* [hidden_dim]                     */
	float *xt;    /* matmul scratch: [max(dim, hidden_dim)][max_chunk] */
};

void tqr_forward_free(tqr_forward *f)
{
	if (!f)
		return;
	free(f->x);
	free(f->xb);
	free(f->xb2);
	free(f->q);
	free(f->k);
	free(f->v);
	free(f->att);
	free(f->hb);
	free(f->hb2);
	free(f->xt);
	free(f);
}

int tqr_forward_new(tqr_forward **out, const tqr_model *m, int max_chunk, tqr_error *err)
{
	const struct tqr_config *c = &m->cfg;
	tqr_forward *f;
	size_t n;

	*out = NULL;
	if (max_chunk < 1 || max_chunk > c->seq_len)
		return tqr_fail(err, -EINVAL, "chunk of %d tokens: must be in [1, seq_len %d]",
				max_chunk, c->seq_len);
	if (!(f = calloc(1, sizeof(*f))))
		return tqr_fail(err, -ENOMEM, "out of memory");
	f->m = m;
	f->max_chunk = max_chunk;
	n = (size_t)max_chunk;
	f->x = malloc(sizeof(float) * n * (size_t)c->dim);
	f->xb = malloc(sizeof(float) * n * (size_t)c->dim);
	f->xb2 = malloc(sizeof(float) * n * (size_t)c->dim);
	f->q = malloc(sizeof(float) * n * (size_t)c->dim);
	f->k = malloc(sizeof(float) * n * (size_t)c->kv_dim);
	f->v = malloc(sizeof(float) * n * (size_t)c->kv_dim);
	f->att = malloc(sizeof(float) * n * (size_t)c->dim);
	f->hb = malloc(sizeof(float) * n * (size_t)c->hidden_dim);
	f->hb2 = malloc(sizeof(float) * n * (size_t)c->hidden_dim);
	f->xt = malloc(sizeof(float) * n * (size_t)(c->hidden_dim > c->dim ? c->hidden_dim : c->dim));
	if (!f->x || !f->xb || !f->xb2 || !f->q || !f->k || !f->v || !f->att || !f->hb || !f->hb2 || !f->xt) {
		tqr_forward_free(f);
		return tqr_fail(err, -ENOMEM, "out of memory for activations of %d tokens", max_chunk);
	}
	*out = f;
	return 0;
}

static void rmsnorm(float *o, const float *x, const float *w, int n, float eps)
{
	float ss = 0.0f;

	for (int j = 0; j < n; j++)
		ss += x[j] * x[j];
	ss /= (float)n;
	ss += eps;
	ss = 1.0f / sqrtf(ss);
	for (int j = 0; j < n; j++)
		o[j] = w[j] * (ss * x[j]);
}

/* out[t][i] = Σ_j w[i][j] x[t][j] for t < n: w [d_out][d_in], x [n][d_in],
 * out [n][d_out]; xt: scratch of [d_in][n].  Every sum runs over j in order
 * from 0.0f, so a token gets the same bits whatever the chunk: tokens are
 * taken 8 at a time from the transposed input (independent accumulators, one
 * vector wide), the rest one by one. */
#define MM_BLOCK 8
/* Left out of the sanitizer builds' instrumentation: plain loops over the
 * shapes tqr_model_load checked, which instrumented took three quarters of
 * a sanitized model run (smollm2: 144 s under ASan, 187 s under UBSan, most
 * of it here); everything around them stays checked.  And out of the
 * coverage build's (make coverage): a counter in the inner loop keeps it
 * from vectorizing, and smollm2 then ran for minutes. */
__attribute__((no_sanitize("address", "undefined"), no_profile_instrument_function))
static void matmul(float *out, const float *x, const float *w, int n, int d_in, int d_out,
		   float *xt)
{
	int nb = n / MM_BLOCK * MM_BLOCK;

	for (int t = 0; t < nb; t++)
		for (int j = 0; j < d_in; j++)
			xt[(size_t)j * n + t] = x[(size_t)t * d_in + j];
	/* the tokens past the last whole block (all of them when decoding one):
	 * 8 output rows at a time, 8 independent sums in j order each, so the
	 * adds do not wait on each other (one chain ran at an add's latency) */
	int i8 = d_out / 8 * 8;
	for (int t = nb; t < n; t++) {
		const float *xr = x + (size_t)t * d_in;
		for (int i = 0; i < i8; i += 8) {
			const float *w0 = w + (size_t)i * d_in;
			float s[8] = { 0 };
			for (int j = 0; j < d_in; j++) {
				const float xj = xr[j];
				for (int u = 0; u < 8; u++)
					s[u] += w0[(size_t)u * d_in + j] * xj;
			}
			for (int u = 0; u < 8; u++)
				out[(size_t)t * d_out + i + u] = s[u];
		}
	}
	for (int i = 0; i < d_out; i++) {
		const float *wi = w + (size_t)i * d_in;
		for (int t0 = 0; t0 < nb; t0 += MM_BLOCK) {
			float acc[MM_BLOCK] = { 0 };
			for (int j = 0; j < d_in; j++) {
				const float *xj = xt + (size_t)j * n + t0;
				for (int u = 0; u < MM_BLOCK; u++)
					acc[u] += wi[j] * xj[u];
			}
			for (int u = 0; u < MM_BLOCK; u++)
				out[(size_t)(t0 + u) * d_out + i] = acc[u];
		}
		for (int t = nb; t < n && i >= i8; t++) {
			const float *xr = x + (size_t)t * d_in;
			float s = 0.0f;
			for (int j = 0; j < d_in; j++)
				s += wi[j] * xr[j];
			out[(size_t)t * d_out + i] = s;
		}
	}
}

/* Rotates each head's adjacent pairs (2i, 2i + 1) by pos * theta^(-2i/hd). */
static void rope(const tqr_model *m, float *vec, int n_heads, int pos)
{
	int hd = m->cfg.head_dim, half = hd / 2;
	const float *cs = m->rope_cos + (size_t)pos * half;
	const float *sn = m->rope_sin + (size_t)pos * half;

	for (int h = 0; h < n_heads; h++) {
		float *x = vec + (size_t)h * hd;
		for (int i = 0; i < half; i++) {
			float a = x[2 * i], b = x[2 * i + 1];
			x[2 * i] = a * cs[i] - b * sn[i];
			x[2 * i + 1] = a * sn[i] + b * cs[i];
		}
	}
}

int tqr_forward_run(tqr_forward *f, tqr_kv *kv, const int *tokens, int n, int pos0,
		    float *logits, int all_logits, tqr_error *err)
{
	const tqr_model *m = f->m;
	const struct tqr_config *c = &m->cfg;
	const struct tqr_weights *w = &m->w;
	int D = c->dim, KD = c->kv_dim, F = c->hidden_dim, rc;

	if (n < 1 || n > f->max_chunk)
		return tqr_fail(err, -EINVAL, "chunk of %d tokens: must be in [1, %d]", n, f->max_chunk);
	if (pos0 < 0 || pos0 > c->seq_len - n)
		return tqr_fail(err, -EINVAL, "positions %d..%d are beyond the model's seq_len %d",
				pos0, pos0 + n - 1, c->seq_len);
	for (int t = 0; t < n; t++) {
		if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
			return tqr_fail(err, -EINVAL, "token id %d at position %d is outside the vocabulary [0, %d)",
					tokens[t], pos0 + t, c->vocab_size);
		memcpy(f->x + (size_t)t * D, w->token_embedding + (size_t)tokens[t] * D, sizeof(float) * D);
	}

	for (int l = 0; l < c->n_layers; l++) {
		size_t lD = (size_t)l * D;
		for (int t = 0; t < n; t++)
			rmsnorm(f->xb + (size_t)t * D, f->x + (size_t)t * D, w->rms_att + lD, D, c->norm_eps);
		matmul(f->q, f->xb, w->wq + (size_t)l * D * D, n, D, D, f->xt);
		matmul(f->k, f->xb, w->wk + (size_t)l * KD * D, n, D, KD, f->xt);
		matmul(f->v, f->xb, w->wv + (size_t)l * KD * D, n, D, KD, f->xt);
		for (int t = 0; t < n; t++) {
			rope(m, f->q + (size_t)t * D, c->n_heads, pos0 + t);
			rope(m, f->k + (size_t)t * KD, c->n_kv_heads, pos0 + t);
		}
		rc = tqr_kv_append_attend(kv, l, pos0, n, f->q, f->k, f->v, f->att, err);
		if (rc < 0)
			return rc;
		matmul(f->xb2, f->att, w->wo + (size_t)l * D * D, n, D, D, f->xt);
		for (size_t i = 0; i < (size_t)n * D; i++)
			f->x[i] += f->xb2[i];

		for (int t = 0; t < n; t++)
			rmsnorm(f->xb + (size_t)t * D, f->x + (size_t)t * D, w->rms_ffn + lD, D, c->norm_eps);
		matmul(f->hb, f->xb, w->w1 + (size_t)l * F * D, n, D, F, f->xt);
		matmul(f->hb2, f->xb, w->w3 + (size_t)l * F * D, n, D, F, f->xt);
		for (size_t i = 0; i < (size_t)n * F; i++) {
			float a = f->hb[i];
			a *= 1.0f / (1.0f + expf(-a));   /* SiLU */
			f->hb[i] = a * f->hb2[i];
		}
		matmul(f->xb, f->hb, w->w2 + (size_t)l * D * F, n, F, D, f->xt);
		for (size_t i = 0; i < (size_t)n * D; i++)
			f->x[i] += f->xb[i];
	}
	if (!logits)
		return 0;
	int first = all_logits ? 0 : n - 1;
	for (int t = first; t < n; t++)
		rmsnorm(f->xb + (size_t)t * D, f->x + (size_t)t * D, w->rms_final, D, c->norm_eps);
	matmul(logits, f->xb + (size_t)first * D, w->wcls, n - first, D, c->vocab_size, f->xt);
	return 0;
}

int tqr_model_limit_context(tqr_model *m, int ctx, tqr_error *err)
{
	if (ctx < 2 || ctx > m->cfg.seq_len)
		return tqr_fail(err, -EINVAL, "a context of %d tokens: must be in [2, the model's %d]", ctx,
				m->cfg.seq_len);
	m->cfg.seq_len = ctx;
	return 0;
}

long tqr_forward_score_chunk(tqr_forward *f, tqr_kv *kv, const int *tokens, int n, int pos, int first,
			     float *logits, double *nll, tqr_logits_fn on_logits, void *arg, tqr_error *err)
{
	const struct tqr_config *c = &f->m->cfg;
	int V = c->vocab_size, rc;
	int m = n - pos < f->max_chunk ? n - pos : f->max_chunk;
	int rows = pos + m < n ? m : m - 1;   /* the last token predicts nothing */

	if (n < 2 || n > c->seq_len)
		return tqr_fail(err, -EINVAL, "a scored sequence has %d tokens: must be in [2, seq_len %d]",
				n, c->seq_len);
	if (pos < 0 || pos >= n || pos % f->max_chunk)
		return tqr_fail(err, -EINVAL, "chunk at position %d of a %d-token sequence (chunks of %d)", pos, n,
				f->max_chunk);
	if (first < 0 || first > n - 2)
		return tqr_fail(err, -EINVAL, "scoring from position %d of a %d-token sequence", first, n);
	if (pos == 0 && (rc = tqr_kv_reset(kv, err)) < 0)
		return rc;
	if ((rc = tqr_forward_run(f, kv, tokens + pos, m, pos, logits, 1, err)) < 0)
		return rc;
	/* row i predicts token pos + i + 1; rows before `first` are context */
	int skip = first - pos > 0 ? (first - pos < rows ? first - pos : rows) : 0;
	for (int i = skip; i < rows; i++) {
		const float *lg = logits + (size_t)i * V;
		double mx = lg[0], s = 0;
		for (int j = 1; j < V; j++)
			if (lg[j] > mx)
				mx = lg[j];
		for (int j = 0; j < V; j++)
			s += exp((double)lg[j] - mx);
		*nll += mx + log(s) - (double)lg[tokens[pos + i + 1]];
	}
	if (on_logits && rows > skip && (rc = on_logits(arg, logits + (size_t)skip * V, rows - skip)) < 0)
		return tqr_fail(err, rc, "writing logits: %s", strerror(-rc));
	return rows - skip;
}

long tqr_forward_score(tqr_forward *f, tqr_kv *kv, const int *tokens, int n, int first, float *logits,
		       double *nll, tqr_logits_fn on_logits, void *arg, tqr_error *err)
{
	long count = 0;

	if (n < 2)
		return tqr_forward_score_chunk(f, kv, tokens, n, 0, first, logits, nll, on_logits, arg, err);
	for (int pos = 0; pos < n; pos += f->max_chunk) {
		long rows = tqr_forward_score_chunk(f, kv, tokens, n, pos, first, logits, nll, on_logits, arg, err);
		if (rows < 0)
			return rows;
		count += rows;
	}
	return count;
}
