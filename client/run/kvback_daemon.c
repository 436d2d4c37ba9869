/* kvback_daemon.c — tqkv-run's KV cache in a tqkvd session, through libtqkv.
 *
 * Every step is one APPEND_ATTEND per layer: a decode step's token, or a
 * prompt chunk's K/V with its queries attending causally.  The chunk's
 * queries must come with its append: the daemon calibrates a layer's
 * k-eq-qk transform from the queries of the append that fills it.  A new
 * sequence (ppl windows) truncates every layer to 0. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvback_internal.h"
#include "tqkv.h"

struct daemon {
	tqkv *c;
	tqkv_session *s;
	int32_t *pos;     /* [max_tokens] query positions */
};

static const char *last_error(int rc)
{
	const char *m = tqkv_last_error();

	return m && *m ? m : tqkv_strerror(rc);
}

static int daemon_append_attend(tqr_kv *kv, int layer, int pos0, int n, const float *q,
				const float *k, const float *v, float *out, tqr_error *err)
{
	struct daemon *d = kv->priv;
	struct tqkv_result res;
	tqkv_req *req;
	int rc;

	for (int i = 0; i < n; i++)
		d->pos[i] = pos0 + i;
	rc = tqkv_submit_append_attend(d->s, (uint32_t)layer, k, v, (uint32_t)n, q, d->pos, (uint32_t)n,
				       TQKV_F32, out, &req);
	if (rc >= 0)
		rc = tqkv_wait(req, &res);
	if (rc < 0)
		return tqr_fail(err, rc, "%s: layer %d, positions %d..%d: %s", kv->name, layer, pos0,
				pos0 + n - 1, last_error(rc));
	if (res.n_tokens != (uint64_t)pos0 + (uint64_t)n)
		return tqr_fail(err, -EPROTO, "%s: layer %d holds %llu tokens after an append, expected %d",
				kv->name, layer, (unsigned long long)res.n_tokens, pos0 + n);
	return 0;
}

static int daemon_reset(tqr_kv *kv, tqr_error *err)
{
	struct daemon *d = kv->priv;
	int rc = tqkv_truncate(d->s, TQKV_ALL_LAYERS, 0);

	if (rc < 0)
		return tqr_fail(err, rc, "%s: truncate: %s", kv->name, last_error(rc));
	return 0;
}

static uint64_t daemon_resident(const tqr_kv *kv)
{
	return 0; /* the daemon's pages are not visible from here (tqctl session ID) */
}

static void daemon_destroy(tqr_kv *kv)
{
	struct daemon *d = kv->priv;

	if (!d)
		return;
	if (d->s)
		tqkv_session_close(d->s);
	tqkv_disconnect(d->c);
	free(d->pos);
	free(d);
}

static const struct kv_ops daemon_ops = {
	"tqkvd", daemon_append_attend, daemon_reset, daemon_resident, daemon_destroy,
};

int tqr_kv_new_daemon(tqr_kv **out, const struct tqr_kv_geom *g, const struct tqr_kv_daemon_opts *o,
		      tqr_error *err)
{
	struct daemon *d;
	tqr_kv *kv;
	long kb, vb;
	int rc;

	if ((rc = tqr_kv_alloc(&kv, g, &daemon_ops, err)) < 0)
		return rc;
	kb = tq_block_bytes(o->k_codec, g->head_dim, NULL);
	vb = tq_block_bytes(o->v_codec, g->head_dim, NULL);
	if (kb < 0 || vb < 0) {
		rc = tqr_fail(err, -EINVAL, "tqkvd: codecs %s/%s at head_dim %d", tq_codec_name(o->k_codec),
			      tq_codec_name(o->v_codec), g->head_dim);
		goto fail;
	}
	kv->priv = d = calloc(1, sizeof(*d));
	if (!d || !(d->pos = malloc(sizeof(int32_t) * (size_t)g->max_tokens))) {
		rc = tqr_fail(err, -ENOMEM, "tqkvd: out of memory");
		goto fail;
	}
	/* the arena holds one operation: a chunk's K, V, Q, positions and output */
	uint64_t per_tok = 4u * (uint64_t)g->head_dim * (2u * g->n_kv_heads + 2u * g->n_q_heads) + 4u;
	struct tqkv_connect_opts co = {
		.run_dir = o->run_dir,
		.arena_bytes = per_tok * (uint64_t)g->max_tokens + (1u << 20),
	};
	if ((rc = tqkv_connect(&d->c, &co)) < 0) {
		rc = tqr_fail(err, rc, "cannot reach tqkvd in %s: %s (is the daemon running? --run-dir, or --local)",
			      o->run_dir, last_error(rc));
		goto fail;
	}
	struct tqkv_session_params sp = {
		.tenant = o->tenant,
		.n_layers = (uint32_t)g->n_layers,
		.n_kv_heads = (uint32_t)g->n_kv_heads,
		.n_q_heads = (uint32_t)g->n_q_heads,
		.head_dim = (uint32_t)g->head_dim,
		.k_codec = tq_codec_name(o->k_codec),
		.v_codec = tq_codec_name(o->v_codec),
		.max_tokens = (uint64_t)g->max_tokens,
		.has_seed = 1,
		.seed = o->rotation_seed,
		.kv_transform = o->kv_transform,
	};
	if ((rc = tqkv_session_open(d->c, &sp, &d->s)) < 0) {
		d->s = NULL;
		rc = tqr_fail(err, rc, "tqkvd: cannot open a session (%d layers, %d/%d heads, head_dim %d, %s/%s, "
			      "transform %s, %d tokens): %s", g->n_layers, g->n_q_heads, g->n_kv_heads, g->head_dim,
			      sp.k_codec, sp.v_codec, sp.kv_transform ? sp.kv_transform : "(the daemon's)",
			      g->max_tokens, last_error(rc));
		goto fail;
	}
	snprintf(kv->name, sizeof(kv->name), "tqkvd %s/%s, session %llu", sp.k_codec, sp.v_codec,
		 (unsigned long long)tqkv_session_id(d->s));
	kv->bytes_per_token = (uint64_t)g->n_layers * g->n_kv_heads * (uint64_t)(kb + vb);
	*out = kv;
	return 0;
fail:
	tqr_kv_free(kv);
	return rc;
}
