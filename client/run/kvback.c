/* kvback.c — tqkv-run's KV backends: the interface, exact fp32, and the
 * kernels in-process (the tqkvd backend is kvback_daemon.c). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvback_internal.h"
#include "tq_attn.h"
#include "tq_page.h"
#include "tq_xform.h"
#include "tqkv_ring.h"

static int geom_check(const struct tqr_kv_geom *g, tqr_error *err)
{
	if (g->n_layers < 1 || g->n_kv_heads < 1 || g->n_q_heads < 1 ||
	    g->n_q_heads % g->n_kv_heads || g->max_tokens < 1 || g->n_kv_heads > (int)TQ_KV_HEADS_MAX ||
	    g->n_q_heads > TQ_ATTN_MAX_HEADS)
		return tqr_fail(err, -EINVAL, "KV geometry: %d layers, %d KV heads, %d query heads, %d tokens",
				g->n_layers, g->n_kv_heads, g->n_q_heads, g->max_tokens);
	if (tq_dim_check(g->head_dim, NULL) < 0)
		return tqr_fail(err, -EINVAL, "KV geometry: head_dim %d is not supported", g->head_dim);
	return 0;
}

int tqr_kv_alloc(tqr_kv **out, const struct tqr_kv_geom *g, const struct kv_ops *ops,
		    tqr_error *err)
{
	tqr_kv *kv;
	int rc;

	*out = NULL;
	if ((rc = geom_check(g, err)) < 0)
		return rc;
	kv = calloc(1, sizeof(*kv));
	if (!kv || !(kv->len = calloc((size_t)g->n_layers, sizeof(int)))) {
		free(kv);
		return tqr_fail(err, -ENOMEM, "out of memory");
	}
	kv->ops = ops;
	kv->g = *g;
	*out = kv;
	return 0;
}

void tqr_kv_free(tqr_kv *kv)
{
	if (!kv)
		return;
	if (kv->ops)
		kv->ops->destroy(kv);
	free(kv->len);
	free(kv);
}

const char *tqr_kv_name(const tqr_kv *kv)
{
	return kv->name;
}

static int all_finite(const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!isfinite(x[i]))
			return 0;
	return 1;
}

int tqr_kv_append_attend(tqr_kv *kv, int layer, int pos0, int n, const float *q,
			 const float *k, const float *v, float *out, tqr_error *err)
{
	const struct tqr_kv_geom *g = &kv->g;
	int rc;

	if (layer < 0 || layer >= g->n_layers)
		return tqr_fail(err, -EINVAL, "%s: layer %d out of range [0, %d)", kv->name, layer, g->n_layers);
	if (pos0 != kv->len[layer])
		return tqr_fail(err, -EINVAL, "%s: layer %d holds %d tokens, the append starts at position %d",
				kv->name, layer, kv->len[layer], pos0);
	if (n < 1 || n > TQ_ATTN_MAX_Q)
		return tqr_fail(err, -EINVAL, "%s: %d tokens in one append", kv->name, n);
	if (n > g->max_tokens - pos0)
		return tqr_fail(err, -ENOSPC, "%s: layer %d would hold %d tokens, more than the %d it was opened for",
				kv->name, layer, pos0 + n, g->max_tokens);
	rc = kv->ops->append_attend(kv, layer, pos0, n, q, k, v, out, err);
	if (rc < 0)
		return rc;
	kv->len[layer] = pos0 + n;
	if ((uint64_t)kv->len[layer] > kv->peak_tokens)
		kv->peak_tokens = (uint64_t)kv->len[layer];
	return 0;
}

int tqr_kv_reset(tqr_kv *kv, tqr_error *err)
{
	int rc = kv->ops->reset(kv, err);

	if (rc < 0)
		return rc;
	memset(kv->len, 0, sizeof(int) * (size_t)kv->g.n_layers);
	return 0;
}

void tqr_kv_stats(const tqr_kv *kv, struct tqr_kv_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->tokens = (uint64_t)kv->len[0];
	st->peak_tokens = kv->peak_tokens;
	st->bytes_per_token = kv->bytes_per_token;
	st->fp16_per_token = (uint64_t)kv->g.n_layers * kv->g.n_kv_heads * 4u * kv->g.head_dim;
	st->resident_bytes = kv->ops->resident(kv);
}

/* ---- exact: fp32 cache, straightforward attention ------------------------------ */

struct exact {
	float *k;       /* [n_layers][max_tokens][n_kv_heads * head_dim] */
	float *v;       /* [n_layers][max_tokens][n_kv_heads * head_dim] */
	float *att;     /* [max_tokens] scores of one (query, head)        */
};

static int exact_append_attend(tqr_kv *kv, int layer, int pos0, int n, const float *q,
			       const float *k, const float *v, float *out, tqr_error *err)
{
	struct exact *e = kv->priv;
	const struct tqr_kv_geom *g = &kv->g;
	int hd = g->head_dim, kvd = g->n_kv_heads * hd, qd = g->n_q_heads * hd;
	int grp = g->n_q_heads / g->n_kv_heads;
	size_t base = (size_t)layer * g->max_tokens * kvd;
	float *kc = e->k + base, *vc = e->v + base;
	float scale = 1.0f / sqrtf((float)hd);

	if (!all_finite(q, (size_t)n * qd) || !all_finite(k, (size_t)n * kvd) ||
	    !all_finite(v, (size_t)n * kvd))
		return tqr_fail(err, -EINVAL, "%s: NaN or Inf in layer %d's Q, K or V", kv->name, layer);
	memcpy(kc + (size_t)pos0 * kvd, k, sizeof(float) * (size_t)n * kvd);
	memcpy(vc + (size_t)pos0 * kvd, v, sizeof(float) * (size_t)n * kvd);
	for (int i = 0; i < n; i++) {
		int pos = pos0 + i;
		for (int h = 0; h < g->n_q_heads; h++) {
			const float *qh = q + (size_t)i * qd + (size_t)h * hd;
			float *oh = out + (size_t)i * qd + (size_t)h * hd;
			size_t ho = (size_t)(h / grp) * hd;
			float mx = -INFINITY, sum = 0.0f;

			for (int t = 0; t <= pos; t++) {
				const float *kt = kc + (size_t)t * kvd + ho;
				float s = 0.0f;
				for (int j = 0; j < hd; j++)
					s += qh[j] * kt[j];
				e->att[t] = s * scale;
				if (e->att[t] > mx)
					mx = e->att[t];
			}
			for (int t = 0; t <= pos; t++) {
				e->att[t] = expf(e->att[t] - mx);
				sum += e->att[t];
			}
			memset(oh, 0, sizeof(float) * hd);
			for (int t = 0; t <= pos; t++) {
				const float *vt = vc + (size_t)t * kvd + ho;
				float a = e->att[t] / sum;
				for (int j = 0; j < hd; j++)
					oh[j] += a * vt[j];
			}
		}
	}
	return 0;
}

static int exact_reset(tqr_kv *kv, tqr_error *err)
{
	return 0;
}

static uint64_t exact_resident(const tqr_kv *kv)
{
	return 2u * (uint64_t)kv->g.n_layers * kv->g.max_tokens * kv->g.n_kv_heads * kv->g.head_dim * 4u;
}

static void exact_destroy(tqr_kv *kv)
{
	struct exact *e = kv->priv;

	if (!e)
		return;
	free(e->k);
	free(e->v);
	free(e->att);
	free(e);
}

static const struct kv_ops exact_ops = {
	"exact", exact_append_attend, exact_reset, exact_resident, exact_destroy,
};

int tqr_kv_new_exact(tqr_kv **out, const struct tqr_kv_geom *g, tqr_error *err)
{
	struct exact *e;
	tqr_kv *kv;
	int rc;

	if ((rc = tqr_kv_alloc(&kv, g, &exact_ops, err)) < 0)
		return rc;
	size_t n = (size_t)g->n_layers * g->max_tokens * g->n_kv_heads * g->head_dim;
	kv->priv = e = calloc(1, sizeof(*e));
	if (!e || !(e->k = malloc(sizeof(float) * n)) || !(e->v = malloc(sizeof(float) * n)) ||
	    !(e->att = malloc(sizeof(float) * (size_t)g->max_tokens))) {
		tqr_kv_free(kv);
		return tqr_fail(err, -ENOMEM, "exact KV cache: out of memory for %d tokens", g->max_tokens);
	}
	snprintf(kv->name, sizeof(kv->name), "exact f32");
	kv->bytes_per_token = (uint64_t)g->n_layers * g->n_kv_heads * 2u * g->head_dim * 4u;
	*out = kv;
	return 0;
}

/* ---- local: tqkvd's kernels in this process ------------------------------------ */

struct local_layer {
	tq_codec *kc, *vc;
	tq_xf *xf;                /* o.kv_xform != 0: the layer's K/V transforms */
	uint8_t **pages;          /* [n_pages] TQ_PAGE_ALIGN-aligned pages */
	uint32_t n_pages;
};

struct local {
	struct tqr_kv_local_opts o;
	tq_cache *cache;
	tq_threads *threads;
	struct tq_page_geom pg;
	uint64_t page_bytes;
	struct local_layer *layer; /* [n_layers] */
	void *ws;                  /* tq_attend workspace */
	size_t ws_bytes;
	int32_t *pos;              /* [max_tokens] query positions */
	float *xk, *xv;            /* one token's K, V through the transform */
	float *xq;                 /* the queries through it */
	size_t xq_n;               /* floats xq holds */
};

/* Makes sure `layer` has pages for `tokens` tokens. */
static int local_reserve(struct local *lc, struct local_layer *ly, int tokens, tqr_error *err)
{
	uint32_t need = tq_page_count(&lc->pg, (uint32_t)tokens);

	if (need <= ly->n_pages)
		return 0;
	uint8_t **p = realloc(ly->pages, sizeof(*p) * need);
	if (!p)
		return tqr_fail(err, -ENOMEM, "local KV: out of memory for the page table");
	ly->pages = p;
	while (ly->n_pages < need) {
		p[ly->n_pages] = aligned_alloc(TQ_PAGE_ALIGN, lc->page_bytes);
		if (!p[ly->n_pages])
			return tqr_fail(err, -ENOMEM, "local KV: out of memory for a page of %llu bytes",
					(unsigned long long)lc->page_bytes);
		ly->n_pages++;
	}
	return 0;
}

static int local_append_attend(tqr_kv *kv, int layer, int pos0, int n, const float *q,
			       const float *k, const float *v, float *out, tqr_error *err)
{
	struct local *lc = kv->priv;
	struct local_layer *ly = &lc->layer[layer];
	const struct tqr_kv_geom *g = &kv->g;
	int hd = g->head_dim, kvh = g->n_kv_heads;
	uint32_t pt = lc->pg.page_tokens;
	tq_error te = { { 0 } };
	int rc;

	if ((rc = local_reserve(lc, ly, pos0 + n, err)) < 0)
		return rc;
	/* The transform as tqkvd keeps it: calibrated by the append into the
	 * empty layer, from its keys, values and queries. */
	if (ly->xf) {
		size_t nq = (size_t)n * g->n_q_heads * hd;
		if (pos0 == 0) {
			tq_xf_reset(ly->xf);
			if ((rc = tq_xf_calibrate(ly->xf, k, v, q, (uint32_t)n, (uint32_t)n, TQ_DTYPE_F32)) < 0)
				return tqr_fail(err, rc, "%s: layer %d: kv transform calibration failed", kv->name, layer);
		}
		if (nq > lc->xq_n) {
			float *x = realloc(lc->xq, nq * sizeof(float));
			if (!x)
				return tqr_fail(err, -ENOMEM, "%s: out of memory", kv->name);
			lc->xq = x;
			lc->xq_n = nq;
		}
		if (tq_xf_touches_queries(ly->xf)) {
			tq_xf_queries(ly->xf, q, TQ_DTYPE_F32, (uint32_t)n, lc->xq);
			q = lc->xq;
		}
	}
	/* Encode into the slots past the layer's length: nothing becomes
	 * visible until the length moves, so a failure leaves the layer as
	 * it was. */
	for (int i = 0; i < n; i++) {
		uint32_t t = (uint32_t)(pos0 + i);
		uint8_t *page = ly->pages[t / pt];
		const float *krow = k + (size_t)i * kvh * hd, *vrow = v + (size_t)i * kvh * hd;
		if (ly->xf) {
			tq_xf_keys(ly->xf, krow, TQ_DTYPE_F32, 1, lc->xk);
			tq_xf_values(ly->xf, vrow, TQ_DTYPE_F32, 1, lc->xv);
			krow = lc->xk;
			vrow = lc->xv;
		}
		for (int h = 0; h < kvh; h++) {
			const float *src_k = krow + (size_t)h * hd;
			const float *src_v = vrow + (size_t)h * hd;
			if ((rc = tq_encode(ly->kc, src_k, TQ_DTYPE_F32, 1,
					    page + tq_page_k_off(&lc->pg, (uint32_t)h, t % pt), &te)) < 0 ||
			    (rc = tq_encode(ly->vc, src_v, TQ_DTYPE_F32, 1,
					    page + tq_page_v_off(&lc->pg, (uint32_t)h, t % pt), &te)) < 0)
				return tqr_fail(err, rc, "%s: layer %d token %d head %d: %s",
						kv->name, layer, pos0 + i, h, te.msg);
		}
	}
	for (int i = 0; i < n; i++)
		lc->pos[i] = pos0 + i;
	struct tq_page_table pt_ = {
		.pages = (const uint8_t *const *)ly->pages,
		.n_pages = ly->n_pages,
		.n_tokens = (uint32_t)(pos0 + n),
		.geom = lc->pg,
	};
	struct tq_attn_params ap = {
		.k_codec = ly->kc,
		.v_codec = ly->vc,
		.n_q_heads = g->n_q_heads,
		.kv = &pt_,
		.n_q = n,
		.q = q,
		.q_dtype = TQ_DTYPE_F32,
		.q_pos = lc->pos,
		.causal = 1,
		.out = out,
		.isa = TQ_ISA_AUTO,
		.threads = lc->threads,
		.sparse_v = lc->o.sparse_v,
	};
	if (lc->o.reference) {
		rc = tq_attend_ref(&ap, &te);
	} else {
		long need = tq_attn_workspace_bytes(&ap, &te);
		if (need < 0)
			return tqr_fail(err, (int)need, "%s: layer %d: %s", kv->name, layer, te.msg);
		if ((size_t)need > lc->ws_bytes) {
			void *ws = malloc((size_t)need);
			if (!ws)
				return tqr_fail(err, -ENOMEM, "%s: out of memory for a %ld-byte attention workspace",
						kv->name, need);
			free(lc->ws);
			lc->ws = ws;
			lc->ws_bytes = (size_t)need;
		}
		ap.workspace = lc->ws;
		ap.workspace_bytes = lc->ws_bytes;
		rc = tq_attend(&ap, &te);
	}
	if (rc < 0)
		return tqr_fail(err, rc, "%s: layer %d attention: %s", kv->name, layer, te.msg);
	if (ly->xf)
		tq_xf_output(ly->xf, out, (uint32_t)n);
	return 0;
}

static int local_reset(tqr_kv *kv, tqr_error *err)
{
	return 0; /* pages stay allocated and are overwritten */
}

static uint64_t local_resident(const tqr_kv *kv)
{
	const struct local *lc = kv->priv;
	uint64_t pages = 0;

	for (int l = 0; l < kv->g.n_layers; l++)
		pages += lc->layer[l].n_pages;
	return pages * lc->page_bytes;
}

static void local_destroy(tqr_kv *kv)
{
	struct local *lc = kv->priv;

	if (!lc)
		return;
	for (int l = 0; lc->layer && l < kv->g.n_layers; l++) {
		struct local_layer *ly = &lc->layer[l];
		for (uint32_t i = 0; i < ly->n_pages; i++)
			free(ly->pages[i]);
		free(ly->pages);
		tq_codec_free(ly->kc);
		tq_codec_free(ly->vc);
		tq_xf_free(ly->xf);
	}
	free(lc->layer);
	free(lc->xk);
	free(lc->xq);
	tq_threads_free(lc->threads);
	tq_cache_free(lc->cache);
	free(lc->ws);
	free(lc->pos);
	free(lc);
}

static const struct kv_ops local_ops = {
	"local", local_append_attend, local_reset, local_resident, local_destroy,
};

int tqr_kv_new_local(tqr_kv **out, const struct tqr_kv_geom *g, const struct tqr_kv_local_opts *o,
		     tqr_error *err)
{
	struct local *lc;
	tq_error te = { { 0 } };
	tqr_kv *kv;
	long kb, vb;
	int rc;

	if ((rc = tqr_kv_alloc(&kv, g, &local_ops, err)) < 0)
		return rc;
	snprintf(kv->name, sizeof(kv->name), "local %s/%s", tq_codec_name(o->k_codec),
		 tq_codec_name(o->v_codec));
	if ((kb = tq_block_bytes(o->k_codec, g->head_dim, &te)) < 0 ||
	    (vb = tq_block_bytes(o->v_codec, g->head_dim, &te)) < 0) {
		rc = tqr_fail(err, -EINVAL, "%s: %s", kv->name, te.msg);
		goto fail;
	}
	if (o->threads < 1 || o->threads > TQ_THREADS_MAX || o->page_tokens < 0 ||
	    o->page_tokens > (int)TQ_PAGE_TOKENS_MAX) {
		rc = tqr_fail(err, -EINVAL, "%s: %d threads, %d tokens per page", kv->name, o->threads,
			      o->page_tokens);
		goto fail;
	}
	kv->priv = lc = calloc(1, sizeof(*lc));
	if (!lc || !(lc->layer = calloc((size_t)g->n_layers, sizeof(*lc->layer))) ||
	    !(lc->pos = malloc(sizeof(int32_t) * (size_t)g->max_tokens)) || !(lc->cache = tq_cache_new())) {
		rc = tqr_fail(err, -ENOMEM, "%s: out of memory", kv->name);
		goto fail;
	}
	lc->o = *o;
	lc->pg = (struct tq_page_geom){
		.n_kv_heads = (uint32_t)g->n_kv_heads,
		.page_tokens = (uint32_t)(o->page_tokens ? o->page_tokens : 64),
		.k_block_bytes = (uint32_t)kb,
		.v_block_bytes = (uint32_t)vb,
	};
	lc->page_bytes = tq_page_bytes(&lc->pg);
	if (o->threads > 1 && (rc = tq_threads_new(&lc->threads, o->threads)) < 0) {
		rc = tqr_fail(err, rc, "%s: cannot start %d attention threads", kv->name, o->threads);
		goto fail;
	}
	for (int l = 0; l < g->n_layers; l++) {
		struct tq_codec_params kp = { o->k_codec, g->head_dim, tqkv_seed_derive(o->rotation_seed, (uint32_t)l, 0), TQ_ISA_AUTO };
		struct tq_codec_params vp = { o->v_codec, g->head_dim, tqkv_seed_derive(o->rotation_seed, (uint32_t)l, 1), TQ_ISA_AUTO };
		if ((rc = tq_codec_new(&lc->layer[l].kc, lc->cache, &kp, &te)) < 0 ||
		    (rc = tq_codec_new(&lc->layer[l].vc, lc->cache, &vp, &te)) < 0) {
			rc = tqr_fail(err, rc, "%s: layer %d codec: %s", kv->name, l, te.msg);
			goto fail;
		}
		if (o->kv_xform && (rc = tq_xf_new(&lc->layer[l].xf, o->kv_xform, (uint32_t)g->n_kv_heads,
						   (uint32_t)g->n_q_heads, (uint32_t)g->head_dim,
						   lc->layer[l].kc, &te)) < 0) {
			rc = tqr_fail(err, rc, "%s: %s", kv->name, te.msg);
			goto fail;
		}
	}
	if (o->kv_xform) {
		if (!(lc->xk = malloc(2 * sizeof(float) * (size_t)g->n_kv_heads * g->head_dim))) {
			rc = tqr_fail(err, -ENOMEM, "%s: out of memory", kv->name);
			goto fail;
		}
		lc->xv = lc->xk + (size_t)g->n_kv_heads * g->head_dim;
	}
	kv->bytes_per_token = (uint64_t)g->n_layers * g->n_kv_heads * (uint64_t)(kb + vb);
	*out = kv;
	return 0;
fail:
	tqr_kv_free(kv);
	return rc;
}
