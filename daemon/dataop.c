/* dataop.c — per-session page tables and the append / attend / truncate
 * operations over them. */
#include "dataop.h"
#include "dataop_internal.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include "kvpersist.h"
#include "log.h"
#include "reclaim.h"
#include "spill.h"
#include "tq_page.h"
#include "tqkv_ring.h"

void dataop_res_set(struct dataop_res *r, int res, uint32_t status, uint32_t detail)
{
	r->res = res;
	r->status = status;
	r->detail = detail;
}

int kvstore_new(struct kvstore **out, struct pool *pool, tq_cache *cache)
{
	struct kvstore *ks = calloc(1, sizeof(*ks));

	*out = NULL;
	if (!ks)
		return -ENOMEM;
	ks->pool = pool;
	ks->cache = cache;
	ks->page_bytes = pool_page_bytes(pool);
	pthread_mutex_init(&ks->lock, NULL);
	*out = ks;
	return 0;
}


void kvstore_set_spill(struct kvstore *ks, struct spill *sp)
{
	ks->spill = sp;
}

void dataop_slot_release(struct kvstore *ks, struct kv_sess *kv, uint64_t slot)
{
	if (kv->p)
		kvp_defer_free(kv, slot);
	else
		spill_slot_free(ks->spill, slot);
}

/* Give back page i of L: its pool page, its spill slot, or both. */
static void page_drop(struct kvstore *ks, struct kv_sess *kv, struct kv_layer *L, uint32_t i)
{
	struct kv_page_meta *m = &L->meta[i];

	if (m->state == PG_SPILLED || (m->state == PG_RESIDENT && m->clean))
		dataop_slot_release(ks, kv, m->slot);
	if (m->state == PG_RESIDENT)
		pool_pages_free(ks->pool, &L->pages[i], 1);
	if (m->state == PG_SPILLED || m->state == PG_LOST)
		L->n_out--;
	L->pages[i] = NULL;
	m->state = PG_RESIDENT;
	m->clean = 0;
}

static void kv_sess_free(struct kvstore *ks, struct kv_sess *kv)
{
	if (!kv)
		return;
	if (kv->p)
		kvp_wt_collect(ks, kv);
	for (uint32_t l = 0; l < kv->n_layers; l++) {
		struct kv_layer *L = &kv->layer[l];
		dataop_readahead_finish(ks, NULL, kv, l); /* the session's bytes go with it */
		if (L->n_out == 0 && L->n_pages && !kv->p)
			pool_pages_free(ks->pool, L->pages, L->n_pages);
		else
			for (uint32_t i = 0; i < L->n_pages; i++)
				page_drop(ks, kv, L, i);
		free(L->pages);
		free(L->meta);
		tq_codec_free(L->kc);
		tq_codec_free(L->vc);
		tq_xf_free(L->xf);
	}
	kvp_sess_free(ks, kv); /* a closed persistent session's files and slots */
	pthread_mutex_destroy(&kv->lock);
	free(kv);
}

void kvstore_free(struct kvstore *ks)
{
	if (!ks)
		return;
	for (size_t b = 0; b < N_BUCKETS; b++) {
		while (ks->bucket[b]) {
			struct kv_sess *kv = ks->bucket[b];
			ks->bucket[b] = kv->next;
			kv_sess_free(ks, kv);
		}
	}
	pthread_mutex_destroy(&ks->lock);
	free(ks);
}

/* Session id's link in its bucket (*slot NULL: none); ks->lock held. */
static struct kv_sess **kv_slot(struct kvstore *ks, uint64_t id)
{
	struct kv_sess **pp = &ks->bucket[id & (N_BUCKETS - 1)];

	while (*pp && (*pp)->id != id)
		pp = &(*pp)->next;
	return pp;
}

void kvstore_ending(void *ctx, struct session *s)
{
	struct kvstore *ks = ctx;

	/* the hook's operation count keeps kv from being released meanwhile */
	pthread_mutex_lock(&ks->lock);
	struct kv_sess *kv = *kv_slot(ks, session_id(s));
	pthread_mutex_unlock(&ks->lock);
	kvp_sess_ending(ks, s, kv);
}

void kvstore_release(void *ctx, struct session *s)
{
	struct kvstore *ks = ctx;
	struct kv_sess **pp, *kv;

	pthread_mutex_lock(&ks->lock);
	pp = kv_slot(ks, session_id(s));
	kv = *pp;
	if (kv) {
		*pp = kv->next;
		ks->n--;
	}
	pthread_mutex_unlock(&ks->lock);
	/* No operation is in flight (the session module's contract), so the
	 * pages can go back without the session's KV lock. */
	kv_sess_free(ks, kv);
}

void kvstore_stats(struct kvstore *ks, struct kvstore_stats *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&ks->lock);
	out->sessions = ks->n;
	for (size_t b = 0; b < N_BUCKETS; b++)
		for (struct kv_sess *kv = ks->bucket[b]; kv; kv = kv->next) {
			out->pages += __atomic_load_n(&kv->n_pages, __ATOMIC_RELAXED);
			out->spilled_pages += __atomic_load_n(&kv->n_spilled, __ATOMIC_RELAXED);
			out->tokens += __atomic_load_n(&kv->max_len, __ATOMIC_RELAXED);
		}
	pthread_mutex_unlock(&ks->lock);
}

/* pg's heads and block sizes for geometry g (its page_tokens left): 0, or
 * -EINVAL on a bad geometry. */
static int blocks_of(const struct session_geom *g, struct tq_page_geom *pg)
{
	tq_error te;
	long kb = tq_block_bytes(g->k_codec, (int)g->head_dim, &te);
	long vb = tq_block_bytes(g->v_codec, (int)g->head_dim, &te);

	if (kb <= 0 || vb <= 0 || g->n_kv_heads < 1 || g->n_kv_heads > TQ_KV_HEADS_MAX)
		return -EINVAL;
	pg->n_kv_heads = g->n_kv_heads;
	pg->k_block_bytes = (uint32_t)kb;
	pg->v_block_bytes = (uint32_t)vb;
	return 0;
}

static int geom_of(uint32_t page_bytes, uint32_t align, const struct session_geom *g, struct tq_page_geom *pg)
{
	uint64_t per_token;
	uint32_t pt;

	if (blocks_of(g, pg) < 0)
		return -EINVAL;
	per_token = (uint64_t)pg->n_kv_heads * ((uint64_t)pg->k_block_bytes + pg->v_block_bytes);
	pt = (uint32_t)(page_bytes / per_token < TQ_PAGE_TOKENS_MAX ? page_bytes / per_token
								    : TQ_PAGE_TOKENS_MAX);
	/* The K and V regions are each rounded up to TQ_PAGE_ALIGN. */
	for (; pt > 0; pt--) {
		pg->page_tokens = pt;
		if (tq_page_bytes(pg) <= page_bytes)
			break;
	}
	if (pt == 0)
		return -E2BIG;
	/* cut to what the pool's kernels read fastest (fewer tokens fit too) */
	if (align > 1 && pt >= align)
		pg->page_tokens = pt -= pt % align;
	return (int)pt;
}

uint64_t dataop_page_bytes_min(uint32_t tokens, const struct session_geom *g)
{
	struct tq_page_geom pg = { .page_tokens = tokens };

	if (blocks_of(g, &pg) < 0)
		return 0;
	/* what page_bytes (a multiple of 4 KiB) must be */
	return ((uint64_t)tq_page_bytes(&pg) + 4095u) / 4096u * 4096u;
}

int dataop_page_tokens(uint32_t page_bytes, uint32_t align, const struct session_geom *g)
{
	struct tq_page_geom pg;

	return geom_of(page_bytes, align, g, &pg);
}

/* The KV state of s, created on first use. */
int dataop_kv_get(struct kvstore *ks, struct session *s, struct kv_sess **out)
{
	return dataop_kv_get_paged(ks, s, 0, out);
}

/* page_tokens: 0 for the pool's rule (geom_of), else the pages' own. */
int dataop_kv_get_paged(struct kvstore *ks, struct session *s, uint32_t page_tokens, struct kv_sess **out)
{
	const struct session_geom *g = session_geom(s);
	uint64_t id = session_id(s);
	struct kv_sess *kv, **pp;
	int r;

	pthread_mutex_lock(&ks->lock);
	pp = kv_slot(ks, id);
	kv = *pp;
	if (kv) {
		*out = kv;
		pthread_mutex_unlock(&ks->lock);
		return 0;
	}
	kv = calloc(1, sizeof(*kv) + sizeof(struct kv_layer) * g->n_layers);
	if (!kv) {
		r = -ENOMEM;
		goto fail;
	}
	if ((r = geom_of(ks->page_bytes, pool_page_tokens_align(ks->pool), g, &kv->geom)) < 0)
		goto fail;
	if (page_tokens) { /* the pages' own number of tokens, if a page holds them */
		struct tq_page_geom pg = kv->geom;
		pg.page_tokens = page_tokens;
		if (page_tokens > TQ_PAGE_TOKENS_MAX || tq_page_bytes(&pg) > ks->page_bytes) {
			r = -E2BIG;
			goto fail;
		}
		kv->geom = pg;
	}
	pthread_mutex_init(&kv->lock, NULL);
	kv->id = id;
	kv->n_layers = g->n_layers;
	kv->n_q_heads = g->n_q_heads;
	kv->dim = g->head_dim;
	kv->k_id = g->k_codec;
	kv->v_id = g->v_codec;
	kv->xform = g->kv_xform;
	kv->seed = session_seed(s);
	/* Positions are int32 (tq_attn.h): a layer holds at most INT32_MAX tokens. */
	kv->max_tokens = g->max_tokens < INT32_MAX ? g->max_tokens : INT32_MAX;
	kv->next = NULL;
	if (session_persistent(s) && ks->persist && (r = kvp_sess_new(ks, kv)) < 0) {
		pthread_mutex_destroy(&kv->lock);
		goto fail;
	}
	*pp = kv;
	ks->n++;
	*out = kv;
	pthread_mutex_unlock(&ks->lock);
	return 0;
fail:
	pthread_mutex_unlock(&ks->lock);
	free(kv);
	return r;
}

/* Codecs of layer l; called with kv->lock held. */
static int layer_codecs(struct kvstore *ks, struct kv_sess *kv, uint32_t l, struct dataop_res *r)
{
	struct kv_layer *L = &kv->layer[l];
	struct tq_codec_params cp = { .dim = (int)kv->dim, .isa = TQ_ISA_AUTO };
	tq_error te;
	int e;

	if (L->kc && L->vc && (L->xf || !kv->xform))
		return 0;
	if (!L->kc) {
		cp.id = kv->k_id;
		cp.seed = tqkv_seed_derive(kv->seed, l, 0);
		if ((e = tq_codec_new(&L->kc, ks->cache, &cp, &te)) < 0)
			goto fail;
	}
	if (!L->vc) {
		cp.id = kv->v_id;
		cp.seed = tqkv_seed_derive(kv->seed, l, 1);
		if ((e = tq_codec_new(&L->vc, ks->cache, &cp, &te)) < 0)
			goto fail;
	}
	/* recovery (kvpersist.c) may have made the transform before the codecs */
	if (L->xf)
		tq_xf_set_k_codec(L->xf, L->kc);
	else if (kv->xform &&
		 (e = tq_xf_new(&L->xf, kv->xform, kv->geom.n_kv_heads, kv->n_q_heads, kv->dim, L->kc, &te)) < 0)
		goto fail;
	return 0;
fail:
	dataop_res_set(r, e, e == -ENOMEM ? TQKV_ST_NOMEM : TQKV_ST_INTERNAL, l);
	snprintf(r->msg, sizeof(r->msg), "layer %u codec: %s", l, te.msg);
	return e;
}

/* Report a change of the session's longest layer to the session table. */
void dataop_update_tokens(struct session *s, struct kv_sess *kv)
{
	uint64_t m = 0, old = kv->max_len;

	for (uint32_t l = 0; l < kv->n_layers; l++)
		if (kv->layer[l].n_tokens > m)
			m = kv->layer[l].n_tokens;
	if (m == old)
		return;
	__atomic_store_n(&kv->max_len, m, __ATOMIC_RELAXED);
	session_set_tokens(s, m);
}

static int pages_get(struct kvstore *ks, struct session *s, uint32_t n, uint8_t **pages, char *why,
		     size_t whylen);

/* Charge s's tenant `bytes` with `charge` (session_charge or
 * session_restore_move): at once, or once the tenant's other sessions
 * were spilled to keep it within its limit (reclaim_charge: bounded
 * wait), or -ENOSPC with why ("" when there is no spill tier; counted in
 * the tenant's limit_refusals), or -ESTALE. */
static int charge_get(struct kvstore *ks, struct session *s, uint64_t bytes,
		      int (*charge)(struct session *, uint64_t), char *why, size_t whylen)
{
	struct reclaim *rc = __atomic_load_n(&ks->reclaim, __ATOMIC_ACQUIRE);
	int e = charge(s, bytes);

	why[0] = 0;
	if (e == -ENOSPC && rc && ks->spill)
		e = reclaim_charge(rc, s, bytes, charge, why, whylen);
	if (e == -ENOSPC && rc) /* (no reclaimer: start-up's journal replay, not a client's refusal) */
		tenant_note(session_tenant(s), TENANT_LIMIT_REFUSALS, 1);
	return e;
}

int dataop_layer_grow(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l, uint64_t new_len,
		      uint32_t *added, struct dataop_res *r)
{
	struct kv_layer *L = &kv->layer[l];
	uint32_t need, old_pages = L->n_pages;
	uint64_t charge;
	int e;

	*added = 0;
	if (new_len > kv->max_tokens) {
		dataop_res_set(r, -ENOSPC, TQKV_ST_MAX_TOKENS, 0);
		snprintf(r->msg, sizeof(r->msg), "layer %u has %u tokens, +%llu > max_tokens %llu", l,
			 L->n_tokens, (unsigned long long)(new_len - L->n_tokens),
			 (unsigned long long)kv->max_tokens);
		return r->res;
	}
	need = tq_page_count(&kv->geom, (uint32_t)new_len) - old_pages;
	if (old_pages + need > L->cap) {
		uint32_t cap = L->cap ? L->cap : 8;
		while (cap < old_pages + need)
			cap *= 2;
		uint8_t **np = realloc(L->pages, sizeof(*np) * cap);
		if (np)
			L->pages = np;
		struct kv_page_meta *nm = np ? realloc(L->meta, sizeof(*nm) * cap) : NULL;
		if (!nm) {
			dataop_res_set(r, -ENOMEM, TQKV_ST_NOMEM, 0);
			return r->res;
		}
		memset(nm + L->cap, 0, sizeof(*nm) * (cap - L->cap)); /* PG_RESIDENT */
		L->meta = nm;
		L->cap = cap;
	}
	if (!need)
		return 0;
	charge = (uint64_t)need * ks->page_bytes;
	char why[200];
	if ((e = charge_get(ks, s, charge, session_charge, why, sizeof(why))) < 0) {
		struct tenant *t = session_tenant(s);
		dataop_res_set(r, e, e == -ENOSPC ? TQKV_ST_TENANT_LIMIT : TQKV_ST_EVICTED, 0);
		if (e == -ENOSPC)
			snprintf(r->msg, sizeof(r->msg), "%u new page(s) of %u bytes; tenant '%s' holds %llu of "
				 "%llu bytes%s%.160s", need, ks->page_bytes, tenant_name(t),
				 (unsigned long long)tenant_used(t), (unsigned long long)tenant_limit(t),
				 why[0] ? ": " : "", why);
		else if (why[0])
			snprintf(r->msg, sizeof(r->msg), "%u new page(s): %s", need, why);
		return e;
	}
	if ((e = pages_get(ks, s, need, L->pages + old_pages, why, sizeof(why))) < 0) {
		session_uncharge(s, charge);
		dataop_res_set(r, e, e == -ESTALE ? TQKV_ST_EVICTED : TQKV_ST_POOL_FULL, 0);
		snprintf(r->msg, sizeof(r->msg), "%u new page(s): %s", need, why);
		return e;
	}
	for (uint32_t i = old_pages; i < old_pages + need; i++)
		L->meta[i] = (struct kv_page_meta){ .state = PG_RESIDENT };
	*added = need;
	return 0;
}

/* Give back the pages dataop_layer_grow added (an append that failed). */
void dataop_layer_shrink(struct kvstore *ks, struct session *s, struct kv_layer *L, uint32_t added)
{
	if (!added)
		return;
	pool_pages_free(ks->pool, L->pages + L->n_pages, added);
	session_uncharge(s, (uint64_t)added * ks->page_bytes);
}

/* ---- K/V transforms (kernels/tq_xform.h) ------------------------------------- */

static long first_nonfinite(const void *buf, enum tq_dtype dtype, size_t n, size_t row);

uint32_t dataop_kernel_status(int e)
{
	return e == -ENOTRECOVERABLE ? TQKV_ST_DEVICE_LOST : e == -ENOMEM ? TQKV_ST_NOMEM : TQKV_ST_INTERNAL;
}

/* The first append into an empty layer calibrates its transform, from
 * private copies of the first TQ_XF_CALIB_MAX tokens' K and V and of the
 * queries that came with them (APPEND_ATTEND; q may be NULL).  Non-finite
 * inputs fail the append (NONFINITE): a layer holding tokens is always
 * calibrated.  kv->lock held.  1 if this call calibrated the layer (the
 * caller resets it if the append fails afterwards), 0 if nothing to do,
 * or an error in r. */
static int layer_calibrate(struct kv_layer *L, const void *k, const void *v, const void *q, uint32_t n,
			   uint32_t n_q, uint32_t q_row, uint32_t kv_row, enum tq_dtype dtype,
			   struct dataop_res *r)
{
	const size_t es = tq_dtype_size(dtype);
	const uint32_t nk = n < TQ_XF_CALIB_MAX ? n : TQ_XF_CALIB_MAX;
	const uint32_t nq = !q ? 0 : n_q < TQ_XF_CALIB_MAX ? n_q : TQ_XF_CALIB_MAX;
	const size_t kb = (size_t)nk * kv_row * es, qb = (size_t)nq * q_row * es;
	uint8_t *buf;
	long bad;
	int e;

	if (!L->xf || !n || tq_xf_calibrated(L->xf))
		return 0;
	if (!(buf = malloc(2 * kb + qb + 1))) {
		dataop_res_set(r, -ENOMEM, TQKV_ST_NOMEM, 0);
		return r->res;
	}
	memcpy(buf, k, kb);
	memcpy(buf + kb, v, kb);
	if (nq)
		memcpy(buf + 2 * kb, q, qb);
	if ((bad = first_nonfinite(buf, dtype, (size_t)nk * kv_row, kv_row)) >= 0 ||
	    (bad = first_nonfinite(buf + kb, dtype, (size_t)nk * kv_row, kv_row)) >= 0) {
		free(buf);
		dataop_res_set(r, -EINVAL, TQKV_ST_NONFINITE, (uint32_t)bad);
		return r->res;
	}
	if ((bad = first_nonfinite(buf + 2 * kb, dtype, (size_t)nq * q_row, q_row)) >= 0) {
		free(buf);
		dataop_res_set(r, -EINVAL, TQKV_ST_NONFINITE, (uint32_t)bad);
		snprintf(r->msg, sizeof(r->msg), "query %ld is not finite", bad);
		return r->res;
	}
	e = tq_xf_calibrate(L->xf, buf, buf + kb, nq ? buf + 2 * kb : NULL, nk, nq, dtype);
	free(buf);
	if (e < 0) {
		dataop_res_set(r, e, e == -ENOMEM ? TQKV_ST_NOMEM : TQKV_ST_INTERNAL, 0);
		snprintf(r->msg, sizeof(r->msg), "kv transform calibration failed");
		return e;
	}
	return 1;
}

/* An attention that runs with an append in one call of the pool's
 * (pool_append_attend: one layer's decode step on a GPU pool): its
 * parameters, every one but the page table (the layer's with the new
 * tokens) and, with a K/V transform, the queries' (taken through it once
 * the append has calibrated it); where the transformed K/V go so that the
 * device reads them in place; and what became of it. */
struct fused_attn {
	const struct tq_attn_params *ap;
	float *qx;               /* [n_q][n_q_heads][dim]: the transformed queries  */
	float *xpin;             /* DATAOP_XPIN_BYTES registered with the pool       */
	int ran;                 /* 1: it ran, with result rc (te: why not 0)       */
	int rc;
	tq_error te;
};

/* The append proper; kv->lock held, codecs present, no page spilled.
 * q, n_q: the queries that came with the tokens (APPEND_ATTEND), or NULL.
 * fu (a GPU pool; NULL: none): the attention to run in the same call of
 * the pool's when it can (fu->ran says whether it did). */
static int append_locked(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l,
			 const void *k, const void *v, enum tq_dtype dtype, uint32_t n,
			 const void *q, uint32_t n_q, struct fused_attn *fu, struct dataop_res *r)
{
	struct kv_layer *L = &kv->layer[l];
	const struct tq_page_geom *g = &kv->geom;
	const uint32_t kv_row = g->n_kv_heads * kv->dim;
	size_t row = (size_t)kv->dim * tq_dtype_size(dtype);
	uint64_t new_len = (uint64_t)L->n_tokens + n;
	uint32_t added, tail = L->n_tokens / g->page_tokens, on_cpu = n;
	float *xk = NULL, *xv = NULL;   /* transformed rows (the codec's input) */
	float *xk_mem = NULL;           /* xk when allocated here              */
	uint32_t xrows = 0;             /* the tokens xk, xv hold              */
	int calibrated = 0;
	tq_error te;
	int e;

	/* a persistent session: its journal open before anything changes */
	if (kv->p && n && (e = kvp_journal_open(ks, s, kv, r)) < 0)
		return e;
	if (L->xf && n) {
		if ((calibrated = layer_calibrate(L, k, v, q, n, n_q, kv->n_q_heads * kv->dim, kv_row, dtype, r)) < 0)
			return calibrated;
		/* a persistent session's journal has the statistics before the
		 * tokens encoded through them */
		if (calibrated && kv->p && (e = kvp_journal_xform(ks, s, kv, l, r)) < 0)
			goto fail_xf;
	}
	if ((e = dataop_layer_grow(ks, s, kv, l, new_len, &added, r)) < 0)
		goto fail_xf;
	if (L->xf && n) {
		/* the transformed rows, once the tokens are admitted (max_tokens,
		 * the tenant's budget): the CPU encodes a token at a time; the
		 * GPU's kernels take a decode step's tokens where the device reads
		 * them in place (the worker's registered buffer), else passes of
		 * DATAOP_XF_PASS_BYTES */
		const size_t tok_x = 2 * (size_t)kv_row * sizeof(float); /* a token's K and V */
		const bool in_pin = pool_has_kernels(ks->pool) && fu && fu->xpin && n * tok_x <= DATAOP_XPIN_BYTES;
		size_t rows = !pool_has_kernels(ks->pool) ? 1 : in_pin ? n : DATAOP_XF_PASS_BYTES / tok_x;
		rows = rows < 1 ? 1 : rows > n ? n : rows;
		if (in_pin) {
			xk = fu->xpin;
		} else if (!(xk = xk_mem = malloc(rows * tok_x))) {
			dataop_layer_shrink(ks, s, L, added);
			dataop_res_set(r, -ENOMEM, TQKV_ST_NOMEM, 0);
			e = r->res;
			goto fail_xf;
		}
		xv = xk + rows * kv_row;
		xrows = (uint32_t)rows;
	}
	/* The tail page changes: a copy of it in a slot is stale now. */
	if (n && tail < L->n_pages && L->meta[tail].clean) {
		dataop_slot_release(ks, kv, L->meta[tail].slot);
		L->meta[tail].clean = 0;
	}
	if (n && pool_has_kernels(ks->pool)) {
		/* The tier's kernels (a GPU pool): the same blocks, computed there. */
		struct tq_page_table pt = {
			.pages = (const uint8_t *const *)L->pages,
			.n_pages = L->n_pages + added,
			.n_tokens = L->n_tokens,
			.geom = *g,
		};
		struct tqc_append a = {
			.k_codec = L->kc, .v_codec = L->vc, .kv = &pt,
			.pos = L->n_tokens, .n = n, .k = k, .v = v, .dtype = dtype,
		};
		uint32_t bad = UINT32_MAX; /* a vector's token only where the codec refused one */

		if (xk && !xk_mem) { /* all n in the registered buffer */
			tq_xf_keys(L->xf, k, dtype, n, xk);
			tq_xf_values(L->xf, v, dtype, n, xv);
			a.k = xk;
			a.v = xv;
			a.dtype = TQ_DTYPE_F32;
		}
		if (fu && !xk_mem) {
			/* the attention over the layer with these tokens, queued
			 * behind their append */
			struct tq_page_table apt = pt;
			struct tq_attn_params fap = *fu->ap;
			int stage = TQC_STAGE_APPEND;

			apt.n_tokens = (uint32_t)new_len;
			fap.kv = &apt;
			if (L->xf && tq_xf_touches_queries(L->xf)) {
				tq_xf_queries(L->xf, fap.q, fap.q_dtype, (uint32_t)fap.n_q, fu->qx);
				fap.q = fu->qx;
				fap.q_dtype = TQ_DTYPE_F32;
			}
			e = pool_append_attend(ks->pool, &a, &fap, &bad, &stage, &te);
			if (e == 0 || stage == TQC_STAGE_ATTEND) {
				fu->ran = 1; /* the append is good: the attention's result is the caller's */
				fu->rc = e;
				fu->te = te;
				e = 0;
			}
		} else if (!xk_mem) {
			e = pool_append(ks->pool, &a, &bad, &te);
		} else {
			/* passes of xrows tokens through the transform */
			e = 0;
			for (uint32_t c0 = 0; c0 < n && e == 0; c0 += xrows) {
				const uint32_t nc = n - c0 < xrows ? n - c0 : xrows;
				const size_t at = (size_t)c0 * g->n_kv_heads * row;
				tq_xf_keys(L->xf, (const uint8_t *)k + at, dtype, nc, xk);
				tq_xf_values(L->xf, (const uint8_t *)v + at, dtype, nc, xv);
				a.pos = L->n_tokens + c0;
				a.n = nc;
				a.k = xk;
				a.v = xv;
				a.dtype = TQ_DTYPE_F32;
				if ((e = pool_append(ks->pool, &a, &bad, &te)) < 0 && bad != UINT32_MAX)
					bad += c0; /* counted from the APPEND's first token */
			}
		}
		if (e < 0) {
			dataop_layer_shrink(ks, s, L, added);
			/* a vector the codec refused (bad: its token), else the
			 * call itself (its arguments: an internal error) */
			const bool refused = (e == -EINVAL || e == -ERANGE) && bad != UINT32_MAX;
			dataop_res_set(r, e, refused ? TQKV_ST_NONFINITE : dataop_kernel_status(e), refused ? bad : 0);
			snprintf(r->msg, sizeof(r->msg), "%s", te.msg);
			goto fail_xf;
		}
		on_cpu = 0;
	}
	for (uint32_t t = 0; t < on_cpu; t++) {
		uint32_t p = L->n_tokens + t;
		uint8_t *page = L->pages[p / g->page_tokens];
		uint32_t slot = p % g->page_tokens;
		const uint8_t *krow = (const uint8_t *)k + (size_t)t * g->n_kv_heads * row;
		const uint8_t *vrow = (const uint8_t *)v + (size_t)t * g->n_kv_heads * row;
		enum tq_dtype in = dtype;
		size_t in_row = row;

		if (xk) {
			tq_xf_keys(L->xf, krow, dtype, 1, xk);
			tq_xf_values(L->xf, vrow, dtype, 1, xv);
			krow = (const uint8_t *)xk;
			vrow = (const uint8_t *)xv;
			in = TQ_DTYPE_F32;
			in_row = (size_t)kv->dim * sizeof(float);
		}
		for (uint32_t h = 0; h < g->n_kv_heads; h++) {
			if ((e = tq_encode(L->kc, krow + h * in_row, in, 1, page + tq_page_k_off(g, h, slot), &te)) < 0 ||
			    (e = tq_encode(L->vc, vrow + h * in_row, in, 1, page + tq_page_v_off(g, h, slot), &te)) < 0) {
				dataop_layer_shrink(ks, s, L, added);
				dataop_res_set(r, e, e == -EINVAL || e == -ERANGE ? TQKV_ST_NONFINITE : TQKV_ST_INTERNAL, t);
				snprintf(r->msg, sizeof(r->msg), "token %u head %u: %s", t, h, te.msg);
				goto fail_xf;
			}
		}
	}
	free(xk_mem);
	xk_mem = NULL;
	/* A persistent session's journal has the tokens before they count. */
	if (kv->p && (e = kvp_journal_append(ks, s, kv, l, L->n_tokens, n, r)) < 0) {
		dataop_layer_shrink(ks, s, L, added);
		goto fail_xf;
	}
	L->n_pages += added;
	L->n_tokens = (uint32_t)new_len;
	__atomic_add_fetch(&kv->n_pages, added, __ATOMIC_RELAXED);
	dataop_update_tokens(s, kv);
	if (kv->p)
		kvp_write_through(ks, kv, l, tail, L->n_tokens / g->page_tokens);
	return 0;
fail_xf:
	free(xk_mem);
	if (calibrated)
		tq_xf_reset(L->xf);   /* the layer holds no token of this calibration */
	return e;
}

/* ---- the spill tier: spill, restore --------------------------------------------------- */

void dataop_io_done(void *ctx, int res, const char *why)
{
	struct io_one *o = ctx;

	o->res = res;
	snprintf(o->why, sizeof(o->why), "%s", why ? why : "");
	__atomic_sub_fetch(&o->b->pending, 1, __ATOMIC_RELEASE); /* o may be gone after this */
}

void dataop_io_fail(struct io_one *o, int res)
{
	char why[64];

	snprintf(why, sizeof(why), "spill: %s", strerror(-res));
	dataop_io_done(o, res, why);
}

static bool batch_done(void *arg)
{
	struct io_batch *b = arg;
	return __atomic_load_n(&b->pending, __ATOMIC_ACQUIRE) == 0;
}

void dataop_batch_wait(struct kvstore *ks, struct io_batch *b)
{
	if (!batch_done(b))
		spill_wait(ks->spill, batch_done, b);
}

struct spill_page_hdr dataop_hdr_of(const struct kv_sess *kv, uint32_t l, uint32_t i)
{
	const struct kv_layer *L = &kv->layer[l];
	struct spill_page_hdr h;
	uint32_t first = i * kv->geom.page_tokens;

	memset(&h, 0, sizeof(h));
	h.session_id = kv->id;
	h.generation = L->meta[i].gen;
	h.rotation_seed = kv->seed;
	h.layer = l;
	h.page_index = i;
	h.n_tokens = L->n_tokens - first < kv->geom.page_tokens ? L->n_tokens - first : kv->geom.page_tokens;
	h.k_codec = (uint8_t)kv->k_id;
	h.v_codec = (uint8_t)kv->v_id;
	return h;
}

/* Reading spilled pages back.  One layer's reads are a batch that belongs
 * to the layer (L->ra) from reads_start until reads_finish collects it
 * under kv->lock; the I/O callbacks touch only the batch.  An operation on
 * a layer starts and finishes its batch at once; it also starts layer
 * l + 1's without waiting (read-ahead), so a decode step that walks the
 * layers overlaps one layer's attention with the next one's reads, and
 * the next operation on l + 1 (or a truncate, a spill, the session's end)
 * collects it. */
struct kv_readahead {
	struct io_batch b;
	uint32_t n;
	uint32_t *idx;            /* [n] page indices */
	uint8_t **fresh;          /* [n] pool pages being read into */
	struct io_one *io;        /* [n] */
};

static void ra_free(struct kv_readahead *ra)
{
	free(ra->idx);
	free(ra->fresh);
	free(ra->io);
	free(ra);
}

/* Start reading layer l's spilled pages back: charge the tenant, take
 * pool pages, submit.  r == NULL: best effort (read-ahead), nothing said;
 * else 0 or an error in r (TENANT_LIMIT, NOMEM, POOL_FULL). */
static int reads_start(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l, struct dataop_res *r)
{
	struct kv_layer *L = &kv->layer[l];
	struct kv_readahead *ra;
	uint32_t n = 0, k = 0;
	int e;

	if (!L->n_out || L->ra)
		return 0;
	for (uint32_t i = 0; i < L->n_pages; i++) {
		if (L->meta[i].state == PG_LOST)
			return 0; /* the layer is unusable: restore_layer_locked says so */
		n += L->meta[i].state == PG_SPILLED;
	}
	if (!n)
		return 0;
	if (!(ra = calloc(1, sizeof(*ra))) || !(ra->idx = calloc(n, sizeof(*ra->idx))) ||
	    !(ra->fresh = calloc(n, sizeof(*ra->fresh))) || !(ra->io = calloc(n, sizeof(*ra->io)))) {
		if (ra)
			ra_free(ra);
		if (r)
			dataop_res_set(r, -ENOMEM, TQKV_ST_NOMEM, 0);
		return -ENOMEM;
	}
	/* read-ahead never waits for the reclaimer: it tries once */
	char why[200];
	why[0] = 0;
	if ((e = r ? charge_get(ks, s, (uint64_t)n * ks->page_bytes, session_restore_move, why, sizeof(why))
		   : session_restore_move(s, (uint64_t)n * ks->page_bytes)) < 0) {
		if (r) {
			struct tenant *t = session_tenant(s);
			dataop_res_set(r, e, e == -ESTALE ? TQKV_ST_EVICTED : TQKV_ST_TENANT_LIMIT, 0);
			snprintf(r->msg, sizeof(r->msg), "restoring %u spilled page(s) of layer %u; tenant '%s' holds "
				 "%llu of %llu bytes%s%.150s", n, l, tenant_name(t), (unsigned long long)tenant_used(t),
				 (unsigned long long)tenant_limit(t), why[0] ? ": " : "", why);
		}
		ra_free(ra);
		return e;
	}
	if ((e = r ? pages_get(ks, s, n, ra->fresh, why, sizeof(why)) : pool_pages_alloc(ks->pool, n, ra->fresh)) < 0) {
		session_spill_move(s, (uint64_t)n * ks->page_bytes); /* undo */
		if (r) {
			dataop_res_set(r, e, e == -ESTALE ? TQKV_ST_EVICTED : TQKV_ST_POOL_FULL, 0);
			snprintf(r->msg, sizeof(r->msg), "restoring %u spilled page(s) of layer %u: %s", n, l, why);
		}
		ra_free(ra);
		return e;
	}
	ra->n = n;
	ra->b.pending = n;
	for (uint32_t i = 0; i < L->n_pages; i++) {
		if (L->meta[i].state != PG_SPILLED)
			continue;
		struct spill_page_hdr h = dataop_hdr_of(kv, l, i);
		ra->idx[k] = i;
		ra->io[k].b = &ra->b;
		L->meta[i].state = PG_READING;
		if ((e = spill_read(ks->spill, L->meta[i].slot, &h, ra->fresh[k], dataop_io_done, &ra->io[k],
				      r ? 0 : SPILL_BACKGROUND)) < 0)
			dataop_io_fail(&ra->io[k], e);
		k++;
	}
	L->ra = ra;
	return 0;
}

/* Wait for layer l's batch and take its pages: the ones that came back
 * become resident; a failed one is spilled again (-EIO: the next read
 * retries) or lost (failed its checks: never served, never retried).
 * s == NULL: the session is going away (no accounting).  r: the first
 * failure (DATA_LOSS before SPILL_IO), or NULL to say nothing. */
static int reads_finish(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l,
			struct dataop_res *r)
{
	struct kv_layer *L = &kv->layer[l];
	struct kv_readahead *ra = L->ra;
	uint32_t bad_page = 0;
	int err = 0;

	if (!ra)
		return 0;
	dataop_batch_wait(ks, &ra->b);
	for (uint32_t k = 0; k < ra->n; k++) {
		uint32_t i = ra->idx[k];
		struct io_one *o = &ra->io[k];
		if (o->res == 0) {
			if (s)
				tenant_note(session_tenant(s), TENANT_RESTORED, ks->page_bytes);
			L->pages[i] = ra->fresh[k];
			/* a persistent session's copy stays: a checkpoint names it */
			if (kv->p)
				L->meta[i].clean = 1;
			else
				spill_slot_free(ks->spill, L->meta[i].slot);
			L->meta[i].state = PG_RESIDENT;
			L->n_out--;
			__atomic_sub_fetch(&kv->n_spilled, 1, __ATOMIC_RELAXED);
			continue;
		}
		pool_pages_free(ks->pool, &ra->fresh[k], 1);
		if (s)
			session_spill_move(s, ks->page_bytes);
		if (o->res == -EBADMSG) {
			dataop_slot_release(ks, kv, L->meta[i].slot);
			if (s)
				session_unspill(s, ks->page_bytes);
			L->meta[i].state = PG_LOST;
			__atomic_sub_fetch(&kv->n_spilled, 1, __ATOMIC_RELAXED);
			log_err("session %llu layer %u page %u lost: %s", (unsigned long long)kv->id, l, i, o->why);
		} else {
			L->meta[i].state = PG_SPILLED;
		}
		if (r && (!err || o->res == -EBADMSG)) {
			err = o->res;
			bad_page = i;
			snprintf(r->msg, sizeof(r->msg), "layer %u page %u: %.200s", l, i, o->why);
		}
	}
	L->ra = NULL;
	ra_free(ra);
	if (err)
		dataop_res_set(r, err, err == -EBADMSG		 ? TQKV_ST_DATA_LOSS
				       : err == -ENOTRECOVERABLE ? TQKV_ST_DEVICE_LOST /* the copy into a lost GPU */
								 : TQKV_ST_SPILL_IO, bad_page);
	return err;
}

void dataop_readahead_finish(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l)
{
	reads_finish(ks, s, kv, l, NULL);
}

/* DATA_LOSS in r if a page of layer l was lost (its copy failed its checks). */
static int layer_lost(struct kv_sess *kv, uint32_t l, struct dataop_res *r)
{
	struct kv_layer *L = &kv->layer[l];

	for (uint32_t i = 0; L->n_out && i < L->n_pages; i++) {
		if (L->meta[i].state == PG_LOST) {
			uint32_t t0 = i * kv->geom.page_tokens;
			dataop_res_set(r, -EBADMSG, TQKV_ST_DATA_LOSS, i);
			snprintf(r->msg, sizeof(r->msg), "layer %u page %u (tokens from %u) was lost: its spilled copy "
				 "failed its checks; truncate the layer to %u or close the session", l, i, t0, t0);
			return r->res;
		}
	}
	return 0;
}

/* Bring layer l's spilled pages back into the pool before an operation
 * uses them (kv->lock held: no other operation of this session runs, and
 * nothing can spill them meanwhile): its read-ahead, or reads started now;
 * layer l + 1's reads go out behind them before we wait, so the disk does
 * not idle between layers.  0, or an error in r: TENANT_LIMIT, POOL_FULL,
 * SPILL_IO (the page stays spilled: a retry may work) or DATA_LOSS (its
 * copy failed its checks: never served). */
static int dataop_restore_layer_locked(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l,
				       struct dataop_res *r)
{
	bool ahead = kv->layer[l].ra != NULL; /* its read-ahead is in flight */
	int e;

	if (!ahead && ((e = layer_lost(kv, l, r)) < 0 || (e = reads_start(ks, s, kv, l, r)) < 0))
		return e;
	if (l + 1 < kv->n_layers)
		reads_start(ks, s, kv, l + 1, NULL);
	e = reads_finish(ks, s, kv, l, ahead ? NULL : r);
	/* what a read-ahead could not bring back: said, and retried once */
	if (ahead && ((e = layer_lost(kv, l, r)) < 0 || (e = reads_start(ks, s, kv, l, r)) < 0 ||
		      (e = reads_finish(ks, s, kv, l, r)) < 0))
		return e;
	return e;
}

/* The session's page tables, locked (try: -EBUSY at once when an
 * operation holds them), for a spill: 0, or an error with why. */
static int spill_lock(struct kvstore *ks, struct session *s, bool try, struct kv_sess **kv, char *why,
		      size_t whylen)
{
	int e;

	why[0] = 0;
	if (!ks->spill) {
		snprintf(why, whylen, "this tqkvd has no spill tier");
		return -EOPNOTSUPP;
	}
	if ((e = dataop_kv_get(ks, s, kv)) < 0) {
		snprintf(why, whylen, "session state: %s", strerror(-e));
		return e;
	}
	if (!try) {
		pthread_mutex_lock(&(*kv)->lock);
	} else if (pthread_mutex_trylock(&(*kv)->lock) != 0) {
		snprintf(why, whylen, "an operation is using the session");
		return -EBUSY;
	}
	return 0;
}

int dataop_spill(struct kvstore *ks, struct session *s, uint64_t want, uint64_t *spilled, char *why, size_t whylen)
{
	struct kv_sess *kv;
	int e;

	*spilled = 0;
	if ((e = spill_lock(ks, s, false, &kv, why, whylen)) < 0)
		return e;
	e = dataop_spill_locked(ks, s, kv, want, spilled, why, whylen);
	pthread_mutex_unlock(&kv->lock);
	return e;
}

void kvstore_set_reclaim(struct kvstore *ks, struct reclaim *rc)
{
	__atomic_store_n(&ks->reclaim, rc, __ATOMIC_RELEASE);
}

/* n pool pages for s, whose tenant is charged for them already: at once,
 * or after the reclaimer made room (bounded wait), or -ENOSPC with why
 * (-ESTALE: s was evicted or closed while it waited). */
static int pages_get(struct kvstore *ks, struct session *s, uint32_t n, uint8_t **pages, char *why,
		     size_t whylen)
{
	struct reclaim *rc = __atomic_load_n(&ks->reclaim, __ATOMIC_ACQUIRE);
	int e = pool_pages_alloc(ks->pool, n, pages);

	if (e == 0) {
		if (rc)
			reclaim_note_alloc(rc);
		return 0;
	}
	if (e == -ENOSPC && rc)
		return reclaim_admit(rc, s, n, pages, why, whylen);
	snprintf(why, whylen, "%u of the pool's pages are free", pool_pages_free_count(ks->pool));
	return e;
}

/* Page i of L leaves the pool for its slot (written, or a clean copy). */
static void page_out(struct kvstore *ks, struct session *s, struct kv_sess *kv, struct kv_layer *L, uint32_t i)
{
	pool_pages_free(ks->pool, &L->pages[i], 1);
	L->pages[i] = NULL;
	L->meta[i].state = PG_SPILLED;
	L->meta[i].clean = 0;
	L->n_out++;
	__atomic_add_fetch(&kv->n_spilled, 1, __ATOMIC_RELAXED);
	session_spill_move(s, ks->page_bytes);
	tenant_note(session_tenant(s), TENANT_SPILLED, ks->page_bytes);
}

/* A spill in flight: its writes submitted, kv->lock held until it is
 * finished (spill_finish). */
struct dataop_spill_op {
	struct kvstore *ks;
	struct session *s;
	struct kv_sess *kv;
	struct io_batch b;
	uint64_t n_cand, spilled;
	struct { uint32_t l, i; } *cand;
	struct io_one *io;
	int err;
	bool unlock;              /* finishing unlocks kv->lock */
	char why[320];
};

/* Choose up to `want` bytes of s's coldest resident pages and submit
 * their writes (clean pages go at once).  0 with *out, or -ENOMEM. */
static int spill_start_locked(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint64_t want,
			      struct dataop_spill_op **out)
{
	struct dataop_spill_op *op = calloc(1, sizeof(*op));
	uint64_t n_want;
	int e;

	*out = NULL;
	if (!op)
		return -ENOMEM;
	op->ks = ks;
	op->s = s;
	op->kv = kv;
	n_want = want / ks->page_bytes + (want % ks->page_bytes != 0);
	if (kv->p)
		kvp_wt_collect(ks, kv); /* no page is read by a write-through meanwhile */
	/* Read-ahead pages are charged pool pages that no operation uses yet:
	 * collect them, so they can go like any resident page (left READING,
	 * an idle session's read-ahead would hold them where neither the
	 * reclaimer nor admission could take them back). */
	for (uint32_t l = 0; l < kv->n_layers; l++)
		dataop_readahead_finish(ks, s, kv, l);
	/* Coldest first: full pages, oldest tokens first, every layer; then
	 * the layers' tail pages (the next appends write there). */
	uint64_t resident = __atomic_load_n(&kv->n_pages, __ATOMIC_RELAXED);
	if (!(op->cand = calloc(resident + 1, sizeof(*op->cand))) || !(op->io = calloc(resident + 1, sizeof(*op->io)))) {
		free(op->cand);
		free(op);
		return -ENOMEM;
	}
	for (int pass = 0; pass < 2 && !op->err; pass++) {
		uint32_t max_pages = 0;
		for (uint32_t l = 0; l < kv->n_layers; l++)
			max_pages = kv->layer[l].n_pages > max_pages ? kv->layer[l].n_pages : max_pages;
		for (uint32_t i = 0; i < max_pages && op->n_cand < n_want && !op->err; i++) {
			for (uint32_t l = 0; l < kv->n_layers && op->n_cand < n_want; l++) {
				struct kv_layer *L = &kv->layer[l];
				if (i >= L->n_pages || L->meta[i].state != PG_RESIDENT)
					continue;
				bool full = (uint64_t)(i + 1) * kv->geom.page_tokens <= L->n_tokens;
				if (full != (pass == 0))
					continue;
				if (L->meta[i].clean) { /* its copy is on disk already */
					page_out(ks, s, kv, L, i);
					op->spilled += ks->page_bytes;
					n_want--;
					continue;
				}
				uint64_t slot;
				if (spill_slot_alloc(ks->spill, &slot) < 0) {
					struct spill_stats st;
					spill_stats(ks->spill, &st);
					snprintf(op->why, sizeof(op->why), "the spill tier is full (%llu of %llu slots in use)",
						 (unsigned long long)st.slots_used, (unsigned long long)st.slots_total);
					op->err = -ENOSPC;
					break;
				}
				L->meta[i].slot = slot;
				L->meta[i].gen = ++kv->gen_next;
				L->meta[i].state = PG_WRITING;
				op->cand[op->n_cand].l = l;
				op->cand[op->n_cand].i = i;
				op->n_cand++;
			}
		}
	}
	op->b.pending = (uint32_t)op->n_cand;
	for (uint64_t k = 0; k < op->n_cand; k++) {
		struct kv_layer *L = &kv->layer[op->cand[k].l];
		struct spill_page_hdr h = dataop_hdr_of(kv, op->cand[k].l, op->cand[k].i);
		op->io[k].b = &op->b;
		if ((e = spill_write(ks->spill, L->meta[op->cand[k].i].slot, &h, L->pages[op->cand[k].i],
				     dataop_io_done, &op->io[k], 0)) < 0)
			dataop_io_fail(&op->io[k], e);
	}
	*out = op;
	return 0;
}

/* Wait for op's writes, let the written pages go, free op (and unlock
 * the session when op took its lock): what spill_start_locked began. */
static int spill_finish(struct dataop_spill_op *op, uint64_t *spilled, char *why, size_t whylen)
{
	struct kvstore *ks = op->ks;
	struct kv_sess *kv = op->kv;
	int err = op->err;

	dataop_batch_wait(ks, &op->b);
	if (err)
		snprintf(why, whylen, "%s", op->why);
	for (uint64_t k = 0; k < op->n_cand; k++) {
		struct kv_layer *L = &kv->layer[op->cand[k].l];
		uint32_t i = op->cand[k].i;
		if (op->io[k].res == 0) {
			page_out(ks, op->s, kv, L, i);
			op->spilled += ks->page_bytes;
		} else {
			spill_slot_free(ks->spill, L->meta[i].slot);
			L->meta[i].state = PG_RESIDENT;
			if (!err || err == -ENOSPC) {
				err = op->io[k].res;
				snprintf(why, whylen, "layer %u page %u: %s", op->cand[k].l, i, op->io[k].why);
			}
		}
	}
	*spilled = op->spilled;
	if (op->unlock)
		pthread_mutex_unlock(&kv->lock);
	free(op->cand);
	free(op->io);
	free(op);
	return *spilled || !err ? 0 : err;
}

int dataop_spill_locked(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint64_t want,
			uint64_t *spilled, char *why, size_t whylen)
{
	struct dataop_spill_op *op;

	*spilled = 0;
	if (spill_start_locked(ks, s, kv, want, &op) < 0) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	return spill_finish(op, spilled, why, whylen);
}

int dataop_spill_start(struct kvstore *ks, struct session *s, uint64_t want, struct dataop_spill_op **op,
		       char *why, size_t whylen)
{
	struct kv_sess *kv;
	int e;

	*op = NULL;
	if ((e = spill_lock(ks, s, true, &kv, why, whylen)) < 0)
		return e;
	if ((e = spill_start_locked(ks, s, kv, want, op)) < 0) {
		pthread_mutex_unlock(&kv->lock);
		snprintf(why, whylen, "out of memory");
		return e;
	}
	(*op)->unlock = true;
	return 0;
}

int dataop_spill_stopped(const struct dataop_spill_op *op)
{
	return op->err;
}

int dataop_spill_finish(struct dataop_spill_op *op, uint64_t *spilled, char *why, size_t whylen)
{
	why[0] = 0;
	return spill_finish(op, spilled, why, whylen);
}

void dataop_prefetch(struct kvstore *ks, struct session *s, struct dataop_res *r)
{
	struct kv_sess *kv;
	struct dataop_res lr;
	int e;

	memset(r, 0, sizeof(*r));
	if ((e = dataop_kv_get(ks, s, &kv)) < 0) {
		dataop_res_set(r, e, e == -ENOMEM ? TQKV_ST_NOMEM : TQKV_ST_GEOMETRY, 0);
		return;
	}
	dataop_res_set(r, 0, TQKV_ST_OK, 0);
	pthread_mutex_lock(&kv->lock);
	bool short_mem = false;
	for (uint32_t l = 0; l < kv->n_layers; l++) {
		if (short_mem) {
			/* memory was short: the rest come back only where they fit
			 * at once (read-ahead's terms), each would otherwise wait
			 * pool.admission_wait again and likely fail alike */
			if (reads_start(ks, s, kv, l, NULL) == 0)
				reads_finish(ks, s, kv, l, NULL);
			continue;
		}
		memset(&lr, 0, sizeof(lr));
		if (dataop_restore_layer_locked(ks, s, kv, l, &lr) < 0) {
			if (r->res == 0)
				*r = lr; /* the first failure; the other layers still come back */
			if (lr.status == TQKV_ST_EVICTED)
				break;
			short_mem |= lr.status == TQKV_ST_TENANT_LIMIT || lr.status == TQKV_ST_POOL_FULL;
		}
	}
	r->n_tokens = kv->max_len;
	pthread_mutex_unlock(&kv->lock);
}

int dataop_restore(struct kvstore *ks, struct session *s, char *why, size_t whylen)
{
	struct dataop_res r;

	dataop_prefetch(ks, s, &r);
	snprintf(why, whylen, "%s", r.res < 0 ? r.msg : "");
	return r.res < 0 ? r.res : 0;
}

static int check_args(struct kv_sess *kv, uint32_t layer, enum tq_dtype dtype, struct dataop_res *r)
{
	if (layer >= kv->n_layers) {
		dataop_res_set(r, -EINVAL, TQKV_ST_BAD_LAYER, layer);
		return r->res;
	}
	if (dtype != TQ_DTYPE_F32 && dtype != TQ_DTYPE_F16 && dtype != TQ_DTYPE_BF16) {
		dataop_res_set(r, -EINVAL, TQKV_ST_BAD_DTYPE, (uint32_t)dtype);
		return r->res;
	}
	return 0;
}

void dataop_append(struct kvstore *ks, struct session *s, uint32_t layer, const void *k,
		   const void *v, enum tq_dtype dtype, uint32_t n, struct dataop_res *r)
{
	struct kv_sess *kv;
	int e;

	memset(r, 0, sizeof(*r));
	if ((e = dataop_kv_get(ks, s, &kv)) < 0) {
		dataop_res_set(r, e, e == -ENOMEM ? TQKV_ST_NOMEM : TQKV_ST_GEOMETRY, 0);
		return;
	}
	if (check_args(kv, layer, dtype, r) < 0)
		return;
	pthread_mutex_lock(&kv->lock);
	if (layer_codecs(ks, kv, layer, r) == 0 && dataop_restore_layer_locked(ks, s, kv, layer, r) == 0 &&
	    append_locked(ks, s, kv, layer, k, v, dtype, n, NULL, 0, NULL, r) == 0)
		dataop_res_set(r, (int)n, TQKV_ST_OK, 0);
	r->n_tokens = kv->layer[layer].n_tokens;
	pthread_mutex_unlock(&kv->lock);
}

/* The index of the first row (of `row` values) of buf holding a NaN or an
 * Inf, or -1. */
static long first_nonfinite(const void *buf, enum tq_dtype dtype, size_t n, size_t row)
{
	const long i = tq_first_nonfinite(buf, dtype, n);

	return i < 0 ? -1 : (long)((size_t)i / row);
}

/* Copy n values of dtype from src (shared memory) to dst and check that
 * each is finite.  Returns the index of the first bad row, or -1. */
static long copy_finite(void *dst, const void *src, enum tq_dtype dtype, size_t n, size_t row)
{
	memcpy(dst, src, n * tq_dtype_size(dtype));
	return first_nonfinite(dst, dtype, n, row);
}

/* Worker scratch comes straight from mmap, so what a trim gives back
 * really leaves the process (malloc would keep it in an arena).  Contents
 * are not kept across a resize: every user fills its buffer after
 * reserving it. */
static int ws_reserve(void **buf, size_t *have, size_t need)
{
	void *p;

	if (*have >= need)
		return 0;
	need = (need + 65535) & ~(size_t)65535;
	p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -ENOMEM;
	if (*buf)
		munmap(*buf, *have);
	*buf = p;
	*have = need;
	return 0;
}

static void ws_drop(void **buf, size_t *have)
{
	if (*buf)
		munmap(*buf, *have);
	*buf = NULL;
	*have = 0;
}

/* After an operation: a worker keeps at most DATAOP_WS_KEEP of scratch. */
static void ws_trim(struct dataop_ws *ws)
{
	if (ws->attn_bytes + ws->q_bytes + ws->pos_bytes + ws->qx_bytes <= DATAOP_WS_KEEP)
		return;
	ws_drop(&ws->attn, &ws->attn_bytes);
	ws_drop(&ws->q, &ws->q_bytes);
	ws_drop((void **)&ws->qx, &ws->qx_bytes);
	ws_drop((void **)&ws->pos, &ws->pos_bytes);
}

/* The worker's buffer for a decode step's transformed K/V on a GPU pool,
 * registered with the pool so that the device reads it in place
 * (DATAOP_XPIN_BYTES, made on first use), or NULL: the append then stages
 * them and runs on its own (registration refused, which is not asked
 * again; or a buffer registered with another pool). */
static float *ws_xpin(struct dataop_ws *ws, struct pool *pool)
{
	char why[200];
	void *p;

	if (ws->xpin || ws->xpin_failed)
		return ws->xpin_pool == pool ? ws->xpin : NULL;
	p = mmap(NULL, DATAOP_XPIN_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED || pool_host_register(pool, p, DATAOP_XPIN_BYTES, why, sizeof(why)) < 0) {
		if (p != MAP_FAILED)
			munmap(p, DATAOP_XPIN_BYTES);
		else
			snprintf(why, sizeof(why), "mmap: %s", strerror(errno));
		log_warning("a worker's buffer for transformed K/V could not be registered with the pool's device (%s): "
			 "its decode steps on sessions with a K/V transform append and attend in two calls", why);
		ws->xpin_failed = 1;
		return NULL;
	}
	ws->xpin = p;
	ws->xpin_pool = pool;
	return ws->xpin;
}

/* Queries per pass of one ATTEND on a GPU pool: as many as their copy
 * fits DATAOP_Q_CHUNK_BYTES (at least one).  The GPU's own passes bound
 * its buffers; the CPU kernel's workspace (attend_chunk) is not used. */
static uint32_t gpu_chunk(uint32_t n_q, size_t q_row_bytes)
{
	size_t c = DATAOP_Q_CHUNK_BYTES / q_row_bytes;

	return c < 1 ? 1 : c > n_q ? n_q : (uint32_t)c;
}

/* Queries per pass of one ATTEND on the CPU: as many as their copy fits
 * DATAOP_Q_CHUNK_BYTES, halved until the kernel's workspace fits
 * DATAOP_WS_CHUNK_BYTES (at least one query per pass), so what one
 * operation takes is bounded whatever n_q and the context length.  Every
 * pass plans its split of the keys as the whole call would (plan_n_q):
 * the answers are bit-identical to one pass over all n_q queries (with
 * the tenant's sparse-V off; with it on, each pass skips by its own rows,
 * within the same bound on what moves).
 * ap->q_pos must hold all n_q positions; ap->q at least the first pass. */
static uint32_t attend_chunk(struct tq_attn_params *ap, uint32_t n_q, size_t q_row_bytes)
{
	uint32_t c = DATAOP_Q_CHUNK_BYTES / q_row_bytes;
	tq_error te;

	if (c > n_q)
		c = n_q;
	if (c < 1)
		c = 1;
	ap->plan_n_q = (int)n_q;
	for (;;) {
		ap->n_q = (int)c;
		long wsb = tq_attn_workspace_bytes(ap, &te);
		if (c == 1 || (wsb >= 0 && (size_t)wsb <= DATAOP_WS_CHUNK_BYTES))
			return c;
		c = (c + 1) / 2;
	}
}

void dataop_attend(struct kvstore *ks, struct session *s, struct dataop_ws *ws, uint32_t layer,
		   const void *k, const void *v, uint32_t n_append, const void *q,
		   const void *pos, uint32_t n_q, enum tq_dtype dtype, float *out,
		   struct dataop_res *r)
{
	struct kv_sess *kv;
	struct kv_layer *L;
	size_t row, q_row_bytes;
	uint64_t new_len;
	long bad, wsb;
	size_t pos_bytes = (size_t)n_q * sizeof(int32_t);
	uint32_t chunk;
	tq_error te;
	int e;
	/* the tier's kernels (a GPU pool) or the CPU's */
	const bool gpu = pool_has_kernels(ks->pool);

	memset(r, 0, sizeof(*r));
	if ((e = dataop_kv_get(ks, s, &kv)) < 0) {
		dataop_res_set(r, e, e == -ENOMEM ? TQKV_ST_NOMEM : TQKV_ST_GEOMETRY, 0);
		return;
	}
	if (check_args(kv, layer, dtype, r) < 0)
		return;
	row = (size_t)kv->n_q_heads * kv->dim;
	q_row_bytes = row * tq_dtype_size(dtype);
	if (ws_reserve((void **)&ws->pos, &ws->pos_bytes, pos_bytes + 1) < 0) {
		dataop_res_set(r, -ENOMEM, TQKV_ST_NOMEM, 0);
		return;
	}
	/* Private copies first: the client may change its arena at any time.
	 * Queries are checked in place here (before anything is appended) and
	 * again as each pass copies them. */
	memcpy(ws->pos, pos, pos_bytes);
	bad = first_nonfinite(q, dtype, (size_t)n_q * row, row);
	pthread_mutex_lock(&kv->lock);
	L = &kv->layer[layer];
	if (bad >= 0) { /* the CQE still reports the layer's length */
		dataop_res_set(r, -EINVAL, TQKV_ST_NONFINITE, (uint32_t)bad);
		goto out;
	}
	new_len = (uint64_t)L->n_tokens + n_append;
	for (uint32_t i = 0; i < n_q; i++) {
		if (ws->pos[i] < 0 || (uint64_t)ws->pos[i] >= new_len) {
			dataop_res_set(r, -EINVAL, TQKV_ST_BAD_POSITION, i);
			goto out;
		}
	}
	if (layer_codecs(ks, kv, layer, r) < 0 || dataop_restore_layer_locked(ks, s, kv, layer, r) < 0)
		goto out;
	struct tq_page_table pt; /* the layer's, once the tokens are in */
	struct tq_attn_params ap = {
		.k_codec = L->kc,
		.v_codec = L->vc,
		.n_q_heads = (int)kv->n_q_heads,
		.kv = &pt,
		.q_dtype = dtype,
		.causal = 1,
		.isa = TQ_ISA_AUTO,
		.threads = ws->threads,
	};
	/* the tenant's sparse-V: read once per call, so a reload applies from
	 * the next one (the GPU kernels count value chunks only with it on) */
	struct tenant *tn = session_tenant(s);
	ap.sparse_v = tenant_sparse_v(tn);
	ap.stats = tenant_attn_stats(tn);
	ap.q_pos = ws->pos;
	ap.out = out;
	/* One layer's decode step on a GPU pool: the append and the attention
	 * in one call (pool_append_attend), the attention queued behind the
	 * append, when the queries are one pass (with a K/V transform, the
	 * transformed K/V in the worker's registered buffer; the queries go
	 * through the transform once the append has calibrated it) */
	struct fused_attn fu = { .ap = &ap };
	const bool fuse = gpu && n_append && gpu_chunk(n_q, q_row_bytes) >= n_q &&
			  pool_has_append_attend(ks->pool) && (!L->xf || (fu.xpin = ws_xpin(ws, ks->pool)));
	if (fuse) {
		if (ws_reserve(&ws->q, &ws->q_bytes, (size_t)n_q * q_row_bytes + 1) < 0 ||
		    (L->xf && ws_reserve((void **)&ws->qx, &ws->qx_bytes, (size_t)n_q * row * sizeof(float) + 1) < 0)) {
			dataop_res_set(r, -ENOMEM, TQKV_ST_NOMEM, 0);
			goto out;
		}
		fu.qx = ws->qx;
		if ((bad = copy_finite(ws->q, q, dtype, (size_t)n_q * row, row)) >= 0) {
			dataop_res_set(r, -EINVAL, TQKV_ST_NONFINITE, (uint32_t)bad);
			goto out;
		}
		ap.n_q = (int)n_q;
		ap.q = ws->q;
	}
	/* the queries' scratch for the largest pass (a CPU plan only halves
	 * it), before the append: once its tokens are in, the operation no
	 * longer fails for want of memory */
	if (n_append && !fuse) {
		const uint32_t c0 = gpu_chunk(n_q, q_row_bytes);
		if (ws_reserve(&ws->q, &ws->q_bytes, (size_t)c0 * q_row_bytes + 1) < 0 ||
		    (L->xf && ws_reserve((void **)&ws->qx, &ws->qx_bytes, (size_t)c0 * row * sizeof(float) + 1) < 0)) {
			dataop_res_set(r, -ENOMEM, TQKV_ST_NOMEM, 0);
			goto out;
		}
	}
	if (n_append && append_locked(ks, s, kv, layer, k, v, dtype, n_append, q, n_q, fuse ? &fu : NULL, r) < 0)
		goto out;

	pt = (struct tq_page_table){
		.pages = (const uint8_t *const *)L->pages,
		.n_pages = L->n_pages,
		.n_tokens = L->n_tokens,
		.geom = kv->geom,
	};
	if (fu.ran) {
		chunk = n_q; /* one pass, done */
	} else {
		ap.q = q; /* planning checks the first pass's queries in place */
		chunk = gpu ? gpu_chunk(n_q, q_row_bytes) : attend_chunk(&ap, n_q, q_row_bytes);
		/* reserved above when this call appended: no failure here then */
		if (ws_reserve(&ws->q, &ws->q_bytes, (size_t)chunk * q_row_bytes + 1) < 0 ||
		    (L->xf && ws_reserve((void **)&ws->qx, &ws->qx_bytes, (size_t)chunk * row * sizeof(float) + 1) < 0)) {
			dataop_res_set(r, -ENOMEM, TQKV_ST_NOMEM, 0);
			goto out;
		}
	}
	for (uint32_t q0 = 0; q0 < n_q; q0 += chunk) {
		uint32_t nq = n_q - q0 < chunk ? n_q - q0 : chunk;
		float *o = out + (size_t)q0 * row;

		if (fu.ran) { /* with the append */
			e = fu.rc;
			te = fu.te;
		} else {
			if ((bad = copy_finite(ws->q, (const uint8_t *)q + (size_t)q0 * q_row_bytes, dtype,
					       (size_t)nq * row, row)) >= 0) {
				dataop_res_set(r, -EINVAL, TQKV_ST_NONFINITE, q0 + (uint32_t)bad);
				goto out;
			}
			ap.n_q = (int)nq;
			ap.q = ws->q;
			if (L->xf && tq_xf_touches_queries(L->xf)) {
				tq_xf_queries(L->xf, ws->q, dtype, nq, ws->qx);
				ap.q = ws->qx;
				ap.q_dtype = TQ_DTYPE_F32;
			}
			ap.q_pos = ws->pos + q0;
			ap.out = o;
			if (!gpu && ((wsb = tq_attn_workspace_bytes(&ap, &te)) < 0 ||
				     ws_reserve(&ws->attn, &ws->attn_bytes, (size_t)wsb) < 0)) {
				e = wsb < 0 ? (int)wsb : -ENOMEM;
				dataop_res_set(r, e, e == -ENOMEM ? TQKV_ST_NOMEM : TQKV_ST_INTERNAL, 0);
				snprintf(r->msg, sizeof(r->msg), "attention workspace: %s",
					 wsb < 0 ? te.msg : "out of memory");
				goto out;
			}
			ap.workspace = ws->attn;
			ap.workspace_bytes = ws->attn_bytes;
			e = gpu ? pool_attend(ks->pool, &ap, &te) : tq_attend(&ap, &te);
		}
		if (e < 0) {
			dataop_res_set(r, e, dataop_kernel_status(e), 0);
			snprintf(r->msg, sizeof(r->msg), "attention: %s", te.msg);
			goto out;
		}
		if (L->xf)
			tq_xf_output(L->xf, o, nq);
		/* Finite inputs can still overflow (q·k beyond FLT_MAX): the
		 * kernels then leave NaN in the row, never a wrong number. */
		if ((bad = first_nonfinite(o, TQ_DTYPE_F32, (size_t)nq * row, row)) >= 0) {
			dataop_res_set(r, -ERANGE, TQKV_ST_NONFINITE, q0 + (uint32_t)bad);
			snprintf(r->msg, sizeof(r->msg), "attention overflowed float range for query %u "
				 "(logits or outputs beyond 3.4e38)", q0 + (uint32_t)bad);
			goto out;
		}
	}
	dataop_res_set(r, (int)n_q, TQKV_ST_OK, 0);
out:
	r->n_tokens = L->n_tokens;
	pthread_mutex_unlock(&kv->lock);
	ws_trim(ws);
}

void dataop_truncate_layer(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l,
			   uint64_t pos)
{
	struct kv_layer *L = &kv->layer[l];
	uint32_t keep;

	dataop_readahead_finish(ks, s, kv, l);
	if (pos >= L->n_tokens)
		return;
	if (kv->p)
		kvp_wt_collect(ks, kv); /* pages it drops may be being written through */
	L->n_tokens = (uint32_t)pos;
	if (!pos && L->xf)
		tq_xf_reset(L->xf);   /* emptied: the next append calibrates again */
	keep = tq_page_count(&kv->geom, L->n_tokens);
	if (keep < L->n_pages) {
		uint32_t drop = L->n_pages - keep;
		uint64_t resident = 0, spilled = 0;
		for (uint32_t i = keep; i < L->n_pages; i++) {
			if (L->meta[i].state == PG_RESIDENT)
				resident += ks->page_bytes;
			else if (L->meta[i].state == PG_SPILLED)
				spilled += ks->page_bytes, __atomic_sub_fetch(&kv->n_spilled, 1, __ATOMIC_RELAXED);
			page_drop(ks, kv, L, i);
		}
		if (resident)
			session_uncharge(s, resident);
		if (spilled)
			session_unspill(s, spilled);
		L->n_pages = keep;
		__atomic_sub_fetch(&kv->n_pages, drop, __ATOMIC_RELAXED);
	}
}

void dataop_truncate(struct kvstore *ks, struct session *s, uint32_t layer, int all_layers,
		     uint64_t pos, struct dataop_res *r)
{
	struct kv_sess *kv;
	int e;

	memset(r, 0, sizeof(*r));
	if ((e = dataop_kv_get(ks, s, &kv)) < 0) {
		dataop_res_set(r, e, e == -ENOMEM ? TQKV_ST_NOMEM : TQKV_ST_GEOMETRY, 0);
		return;
	}
	if (!all_layers && layer >= kv->n_layers) {
		dataop_res_set(r, -EINVAL, TQKV_ST_BAD_LAYER, layer);
		return;
	}
	pthread_mutex_lock(&kv->lock);
	/* A persistent session's journal has the truncation before it happens. */
	if (kv->p && kvp_journal_truncate(ks, s, kv, all_layers ? PERSIST_ALL_LAYERS : layer, pos, r) < 0)
		goto out;
	for (uint32_t l = all_layers ? 0 : layer; l < (all_layers ? kv->n_layers : layer + 1); l++)
		dataop_truncate_layer(ks, s, kv, l, pos);
	dataop_update_tokens(s, kv);
	dataop_res_set(r, 0, TQKV_ST_OK, 0);
out:
	r->n_tokens = all_layers ? kv->max_len : kv->layer[layer].n_tokens;
	pthread_mutex_unlock(&kv->lock);
}

uint32_t dataop_session_page_tokens(struct kvstore *ks, uint64_t id)
{
	uint32_t pt = 0;

	pthread_mutex_lock(&ks->lock); /* kv leaves the table, and is freed, under it */
	struct kv_sess *kv = *kv_slot(ks, id);
	if (kv)
		pt = kv->geom.page_tokens; /* set once, at creation */
	pthread_mutex_unlock(&ks->lock);
	return pt;
}

int dataop_xf_summary(struct kvstore *ks, struct session *s, struct tq_xf_summary *out, uint32_t n_layers)
{
	uint64_t id = session_id(s);
	struct kv_sess *kv;

	if (n_layers != session_geom(s)->n_layers)
		return -EINVAL;
	memset(out, 0, sizeof(*out) * n_layers);
	pthread_mutex_lock(&ks->lock);
	kv = *kv_slot(ks, id);
	pthread_mutex_unlock(&ks->lock);
	if (!kv)
		return -ENOENT;
	/* kv lives while the caller holds the session (kvstore_release).  The
	 * control plane must not wait behind a long operation (a spill or a
	 * restore of many pages): at most DATAOP_XF_WAIT_MS, then -EBUSY. */
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_nsec += (long)DATAOP_XF_WAIT_MS * 1000000L;
	dl.tv_sec += dl.tv_nsec / 1000000000L;
	dl.tv_nsec %= 1000000000L;
	if (pthread_mutex_timedlock(&kv->lock, &dl) != 0)
		return -EBUSY;
	for (uint32_t l = 0; l < n_layers; l++)
		if (kv->layer[l].xf)
			tq_xf_summarize(kv->layer[l].xf, &out[l]);
	pthread_mutex_unlock(&kv->lock);
	return 0;
}

void dataop_ws_free(struct dataop_ws *ws)
{
	if (!ws)
		return;
	if (ws->xpin) {
		pool_host_unregister(ws->xpin_pool, ws->xpin);
		munmap(ws->xpin, DATAOP_XPIN_BYTES);
	}
	ws_drop(&ws->attn, &ws->attn_bytes);
	ws_drop(&ws->q, &ws->q_bytes);
	ws_drop((void **)&ws->pos, &ws->pos_bytes);
	ws_drop((void **)&ws->qx, &ws->qx_bytes);
	tq_threads_free(ws->threads);
	memset(ws, 0, sizeof(*ws));
}

struct pool *kvstore_pool(struct kvstore *ks)
{
	return ks->pool;
}
