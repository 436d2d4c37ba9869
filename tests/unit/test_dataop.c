/* test_dataop — the data operations on their own (no ring): what one huge
 * ATTEND costs a worker, during and after (issue 15 item 5), its passes
 * against one kernel call over all its queries, bit for bit, and attention
 * whose finite inputs overflow float range, for every key codec (item 8);
 * the tenant's sparse-V, reloaded. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "harness.h"
#include "config.h"
#include "dataop.h"
#include "pool.h"
#include "session.h"
#include "tenant.h"
#include "tq_attn.h"
#include "tq_threads.h"
#include "tq_xform.h"
#include "tqkv_ring.h"

#define MiB (1ull << 20)

struct fix {
	struct config cfg;
	struct tenant_table *tt;
	struct pool *pool;
	tq_cache *cache;
	struct kvstore *ks;
	struct session_table *st;
};

#define FIX_CONF "[pool]\npool_bytes = 64M\n[tenant t]\nlimit = 64M\nallow_uids = *\n"

static void fix_start(struct fix *f)
{
	char err[CONFIG_ERR_MAX], why[200];
	const char *text = FIX_CONF;
	struct pool_params pp = { .bytes = 64 * MiB, .page_bytes = 64 << 10, .numa_node = -1 };

	memset(f, 0, sizeof(*f));
	if (config_load_string(&f->cfg, "t.conf", text, err, sizeof(err)) != 0 ||
	    tenant_table_new(&f->tt, &f->cfg) < 0 || pool_new(&f->pool, &pp, why, sizeof(why)) < 0 ||
	    !(f->cache = tq_cache_new()) || kvstore_new(&f->ks, f->pool, f->cache) < 0 ||
	    session_table_new(&f->st, 16, kvstore_release, f->ks) < 0) {
		fprintf(stderr, "setup failed\n");
		exit(1);
	}
}

static void fix_stop(struct fix *f)
{
	session_table_free(f->st);
	kvstore_free(f->ks);
	tq_cache_free(f->cache);
	pool_free(f->pool);
	tenant_table_free(f->tt);
}

static struct session *fix_open(struct fix *f, const struct session_geom *g, uint64_t *id)
{
	struct session_info si;
	struct session *s;
	char why[200];

	if (session_open(f->st, tenant_find(f->tt, "t"), "", 1000, g, 7, 0, 0, &si, why, sizeof(why)) < 0 ||
	    session_acquire(f->st, si.id, 0, &s) < 0) {
		fprintf(stderr, "open: %s\n", why);
		exit(1);
	}
	*id = si.id;
	return s;
}

/* kB of anonymous memory this process holds (RssAnon), or of its peak (VmHWM). */
static long status_kb(const char *key)
{
	char line[256];
	long kb = -1;
	FILE *fp = fopen("/proc/self/status", "r");

	while (fp && fgets(line, sizeof(line), fp))
		if (!strncmp(line, key, strlen(key)))
			kb = strtol(line + strlen(key), NULL, 10);
	if (fp)
		fclose(fp);
	return kb;
}

static uint64_t rng = 0x1234567;
static float frand(void)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (float)(rng >> 40) / (float)(1 << 24) - 0.5f;
}

/* Buffers the test owns come from mmap and are touched before measuring,
 * so RssAnon before and after differ only by what the worker keeps. */
static void *touched(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		abort();
	memset(p, 0, bytes);
	return p;
}

/* Layer 0 of a session rebuilt outside the daemon: the same codecs (seeds
 * derived from the session's), the same page geometry, the same blocks. */
struct ref {
	tq_codec *kc, *vc;
	uint8_t **pages;              /* [pt.n_pages] */
	struct tq_page_table pt;
};

static void ref_free(struct ref *rf)
{
	for (uint32_t i = 0; rf->pages && i < rf->pt.n_pages; i++)
		free(rf->pages[i]);
	free(rf->pages);
	tq_codec_free(rf->kc);
	tq_codec_free(rf->vc);
	memset(rf, 0, sizeof(*rf));
}

/* k, v: [n][n_kv_heads][head_dim] f32, as appended.  0 or -1. */
static int ref_build(struct ref *rf, struct fix *f, struct session *s, const struct session_geom *g,
		     const float *k, const float *v, uint32_t n)
{
	struct tq_codec_params kp = { .id = g->k_codec, .dim = (int)g->head_dim,
				      .seed = tqkv_seed_derive(session_seed(s), 0, 0) };
	struct tq_codec_params vp = { .id = g->v_codec, .dim = (int)g->head_dim,
				      .seed = tqkv_seed_derive(session_seed(s), 0, 1) };
	int pt = dataop_page_tokens(pool_page_bytes(f->pool), pool_page_tokens_align(f->pool), g);
	size_t row = g->head_dim;
	tq_error te;

	memset(rf, 0, sizeof(*rf));
	if (pt <= 0 || tq_codec_new(&rf->kc, f->cache, &kp, &te) < 0 ||
	    tq_codec_new(&rf->vc, f->cache, &vp, &te) < 0)
		goto fail;
	rf->pt.geom = (struct tq_page_geom){ .n_kv_heads = g->n_kv_heads, .page_tokens = (uint32_t)pt,
		.k_block_bytes = (uint32_t)tq_codec_block_bytes(rf->kc),
		.v_block_bytes = (uint32_t)tq_codec_block_bytes(rf->vc) };
	rf->pt.n_tokens = n;
	rf->pt.n_pages = tq_page_count(&rf->pt.geom, n);
	if (!(rf->pages = calloc(rf->pt.n_pages + 1, sizeof(*rf->pages))))
		goto fail;
	rf->pt.pages = (const uint8_t *const *)rf->pages;
	for (uint32_t i = 0; i < rf->pt.n_pages; i++)
		if (!(rf->pages[i] = aligned_alloc(TQ_PAGE_ALIGN, tq_page_bytes(&rf->pt.geom))))
			goto fail;
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t h = 0; h < g->n_kv_heads; h++) {
			uint8_t *page = rf->pages[t / (uint32_t)pt];
			const size_t at = ((size_t)t * g->n_kv_heads + h) * row;
			if (tq_encode(rf->kc, k + at, TQ_DTYPE_F32, 1,
				      page + tq_page_k_off(&rf->pt.geom, h, t % (uint32_t)pt), &te) < 0 ||
			    tq_encode(rf->vc, v + at, TQ_DTYPE_F32, 1,
				      page + tq_page_v_off(&rf->pt.geom, h, t % (uint32_t)pt), &te) < 0)
				goto fail;
		}
	return 0;
fail:
	ref_free(rf);
	return -1;
}

/* One tq_attend over all n_q queries (the kernel allocates its workspace):
 * what the daemon's passes must give bit for bit.  0 or a negative errno. */
static int ref_attend(const struct ref *rf, const struct session_geom *g, tq_threads *threads,
		      const float *q, const int32_t *pos, uint32_t n_q, float *out)
{
	struct tq_attn_params ap = {
		.k_codec = rf->kc, .v_codec = rf->vc, .n_q_heads = (int)g->n_q_heads, .kv = &rf->pt,
		.n_q = (int)n_q, .q = q, .q_dtype = TQ_DTYPE_F32, .q_pos = pos, .causal = 1,
		.out = out, .isa = TQ_ISA_AUTO, .threads = threads,
	};
	tq_error te;

	return tq_attend(&ap, &te);
}

/* The first query whose output differs from ref in any bit, or -1. */
static long first_diff(const float *a, const float *ref, uint32_t n_q, size_t row)
{
	for (uint32_t i = 0; i < n_q; i++)
		if (memcmp(a + (size_t)i * row, ref + (size_t)i * row, row * sizeof(float)))
			return i;
	return -1;
}

/* One ATTEND of 65,536 queries: its scratch is bounded while it runs (it
 * goes in passes) and given back after; its answers are those of one
 * kernel call over all the queries, bit for bit. */
static void test_big_attend_rss(void)
{
	struct fix f;
	struct dataop_ws ws = { 0 };
	struct dataop_res r;
	const struct session_geom g = { 1, 2, 8, 64, TQ_CODEC_Q8, TQ_CODEC_TQ4, 4096, 0 };
	const uint32_t ctx = 256, nq = 65536;
	const size_t row = 8 * 64, kvrow = 2 * 64;
	uint64_t id;

	fix_start(&f);
	struct session *s = fix_open(&f, &g, &id);
	float *k = touched(ctx * kvrow * 4), *v = touched(ctx * kvrow * 4);
	float *q = touched((size_t)nq * row * 4), *out = touched((size_t)nq * row * 4);
	int32_t *pos = touched((size_t)nq * 4);
	for (size_t i = 0; i < ctx * kvrow; i++) {
		k[i] = frand();
		v[i] = frand();
	}
	for (size_t i = 0; i < (size_t)nq * row; i++)
		q[i] = frand();
	for (uint32_t i = 0; i < nq; i++)
		pos[i] = (int32_t)(i % ctx);
	dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, ctx, &r);
	T_EQ(r.status, TQKV_ST_OK);
	/* warm: the small ops a worker does all day */
	dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, pos, 4, TQ_DTYPE_F32, out, &r);
	T_EQ(r.status, TQKV_ST_OK);

	/* "5" resets the peak (VmHWM) to the current RSS (Linux >= 4.0) */
	FILE *cr = fopen("/proc/self/clear_refs", "w");
	bool peak = cr && fputs("5", cr) >= 0 && fclose(cr) == 0;
	long before = status_kb("RssAnon:"), rss0 = status_kb("VmRSS:");
	dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, pos, nq, TQ_DTYPE_F32, out, &r);
	long after = status_kb("RssAnon:"), hwm = status_kb("VmHWM:");
	T_EQ(r.status, TQKV_ST_OK);
	T_EQ(r.res, (int)nq);
	fprintf(stderr, "    RssAnon before %ld kB, after %ld kB (+%ld kB); peak +%ld kB during the call; "
		"worker keeps %zu kB; queries %zu MiB\n", before, after, after - before,
		peak ? hwm - rss0 : -1L, (ws.attn_bytes + ws.q_bytes + ws.pos_bytes) >> 10,
		((size_t)nq * row * 4) >> 20);
	/* what one operation takes is bounded by the pass sizes, not by n_q */
#ifdef __SANITIZE_THREAD__
	peak = false; /* TSan's shadow of what the call touched counts in the peak */
#endif
	if (peak)
		T_ASSERT(hwm - rss0 < (long)((DATAOP_Q_CHUNK_BYTES + DATAOP_WS_CHUNK_BYTES) >> 10) + 8192);
	/* what stays is bounded by the cap, not by the operation's size */
	T_ASSERT(ws.attn_bytes + ws.q_bytes + ws.pos_bytes <= DATAOP_WS_KEEP);
	T_ASSERT(after - before < (long)(DATAOP_WS_KEEP >> 10) + 4096);

	/* the passes answer as one call over all the queries, bit for bit */
	struct ref rf;
	float *want = touched((size_t)nq * row * 4);
	T_EQ(ref_build(&rf, &f, s, &g, k, v, ctx), 0);
	T_EQ(ref_attend(&rf, &g, NULL, q, pos, nq, want), 0);
	long d = first_diff(out, want, nq, row);
	if (d >= 0)
		T_FAIL("query %ld: the ATTEND's passes differ from one call over all queries", d);
	ref_free(&rf);
	munmap(want, (size_t)nq * row * 4);
	session_release(s);
	dataop_ws_free(&ws);
	munmap(k, ctx * kvrow * 4);
	munmap(v, ctx * kvrow * 4);
	munmap(q, (size_t)nq * row * 4);
	munmap(out, (size_t)nq * row * 4);
	munmap(pos, (size_t)nq * 4);
	T_EQ(session_close(f.st, id, NULL), 0);
	fix_stop(&f);
}

/* With an attention pool and a long context the kernel splits the keys
 * (split-K) when a call has few row tiles for the pool; a pass of part of
 * the queries (here 1024 of them, then 1) would split where the whole call
 * does not, and round differently.  Every pass plans as the whole call:
 * the same bits. */
static void test_passes_bit_identical(void)
{
	struct fix f;
	struct dataop_ws ws = { 0 };
	struct dataop_res r;
	struct ref rf;
	/* q rows of 4 KiB: passes of at most 1024 queries; 8 threads want 24
	 * tasks, the whole call has 2 KV heads x 17 row tiles of 128 rows */
	const struct session_geom g = { 1, 2, 4, 256, TQ_CODEC_Q8, TQ_CODEC_TQ4, 4096, 0 };
	const uint32_t ctx = 1030, nq = 1025;
	const size_t row = 4 * 256, kvrow = 2 * 256;
	uint64_t id;

	fix_start(&f);
	T_EQ(tq_threads_new(&ws.threads, 8), 0);
	struct session *s = fix_open(&f, &g, &id);
	float *k = malloc(ctx * kvrow * 4), *v = malloc(ctx * kvrow * 4);
	float *q = malloc((size_t)nq * row * 4), *out = malloc((size_t)nq * row * 4);
	float *want = malloc((size_t)nq * row * 4);
	int32_t *pos = malloc((size_t)nq * 4);
	T_ASSERT(k && v && q && out && want && pos);
	for (size_t i = 0; i < ctx * kvrow; i++) {
		k[i] = frand();
		v[i] = frand();
	}
	for (size_t i = 0; i < (size_t)nq * row; i++)
		q[i] = frand();
	for (uint32_t i = 0; i < nq; i++)
		pos[i] = (int32_t)((i * 7919u) % ctx);
	dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, ctx, &r);
	T_EQ(r.status, TQKV_ST_OK);
	dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, pos, nq, TQ_DTYPE_F32, out, &r);
	T_EQ(r.status, TQKV_ST_OK);
	T_EQ(ref_build(&rf, &f, s, &g, k, v, ctx), 0);
	T_EQ(ref_attend(&rf, &g, ws.threads, q, pos, nq, want), 0);
	long d = first_diff(out, want, nq, row);
	if (d >= 0)
		T_FAIL("query %ld: the ATTEND's passes differ from one call over all queries", d);
	ref_free(&rf);
	free(k);
	free(v);
	free(q);
	free(out);
	free(want);
	free(pos);
	session_release(s);
	dataop_ws_free(&ws);
	T_EQ(session_close(f.st, id, NULL), 0);
	fix_stop(&f);
}

/* The tenant's sparse-V (tenant.sparse_v), reloaded: with it on, its
 * sessions' CPU attention skips value chunks, counts them (tenant_info,
 * what `tqctl tenants` shows) and moves each output by at most about
 * sparse_v x the largest value norm (test_attn checks the kernels' exact
 * bound); a reload back to 0 gives the exact bits again. */
static void test_tenant_sparse_v(void)
{
	struct fix f;
	struct dataop_ws ws = { 0 };
	struct dataop_res r;
	struct tenant_info ti;
	struct config next;
	char err[CONFIG_ERR_MAX];
	const struct session_geom g = { 1, 2, 8, 128, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 4096, 0 };
	const uint32_t ctx = 3000, nq = 2;
	const size_t row = 8 * 128, kvrow = 2 * 128;
	uint64_t id;

	fix_start(&f);
	T_EQ(tq_threads_new(&ws.threads, 2), 0);
	struct tenant *tn = tenant_find(f.tt, "t");
	struct session *s = fix_open(&f, &g, &id);
	float *k = malloc(ctx * kvrow * 4), *v = malloc(ctx * kvrow * 4);
	float *q = malloc(nq * row * 4), *exact = malloc(nq * row * 4), *out = malloc(nq * row * 4);
	int32_t pos[2] = { (int32_t)ctx - 1, (int32_t)ctx / 2 };
	T_ASSERT(k && v && q && exact && out);
	double vmax = 0.0;
	for (uint32_t t = 0; t < ctx; t++) {
		double n2 = 0.0;
		for (size_t j = 0; j < kvrow; j++) {
			k[t * kvrow + j] = frand();
			v[t * kvrow + j] = frand();
			n2 += (double)v[t * kvrow + j] * v[t * kvrow + j];
		}
		if (sqrt(n2) > vmax)
			vmax = sqrt(n2);
	}
	for (size_t i = 0; i < nq * row; i++)
		q[i] = 40.0f * frand(); /* sharp attention, as real models' heads often are */
	dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, ctx, &r);
	T_EQ(r.status, TQKV_ST_OK);

	/* off (the default): every chunk reached, none skipped */
	dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, pos, nq, TQ_DTYPE_F32, exact, &r);
	T_EQ(r.status, TQKV_ST_OK);
	tenant_get_info(tn, &ti);
	T_ASSERT(ti.sparse_v == 0.0f && ti.v_chunks > 0 && ti.v_skipped == 0);
	const uint64_t per_call = ti.v_chunks;

	/* on, by a reload */
	T_EQ(config_load_string(&next, "t.conf", FIX_CONF "sparse_v = 0.01\n", err, sizeof(err)), 0);
	tenant_table_apply(f.tt, &next);
	dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, pos, nq, TQ_DTYPE_F32, out, &r);
	T_EQ(r.status, TQKV_ST_OK);
	tenant_get_info(tn, &ti);
	T_ASSERT(ti.sparse_v == 0.01f);
	T_EQ(ti.v_chunks, 2 * per_call);
	T_ASSERT(ti.v_skipped > 0 && ti.v_skipped < per_call);
	double moved = 0.0;
	for (size_t i = 0; i < nq * 8; i++) {
		double d2 = 0.0;
		for (size_t j = 0; j < 128; j++) {
			double d = (double)out[i * 128 + j] - exact[i * 128 + j];
			d2 += d * d;
		}
		moved = sqrt(d2) > moved ? sqrt(d2) : moved;
	}
	if (getenv("TQ_TEST_VERBOSE"))
		fprintf(stderr, "  sparse-V 0.01: %llu of %llu value chunks skipped, outputs moved %.3g "
			"(0.01 x max |v| = %.3g)\n", (unsigned long long)ti.v_skipped,
			(unsigned long long)per_call, moved, 0.01 * vmax);
	/* the decoded values' norms exceed the inputs' by the codec's error */
	T_ASSERT(moved > 0.0 && moved <= 1.5 * 0.01 * vmax);

	/* off again: the exact bits, nothing more skipped */
	const uint64_t skipped = ti.v_skipped;
	T_EQ(config_load_string(&next, "t.conf", FIX_CONF "sparse_v = 0\n", err, sizeof(err)), 0);
	tenant_table_apply(f.tt, &next);
	dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, pos, nq, TQ_DTYPE_F32, out, &r);
	T_EQ(r.status, TQKV_ST_OK);
	T_ASSERT(memcmp(out, exact, nq * row * 4) == 0);
	tenant_get_info(tn, &ti);
	T_EQ(ti.v_chunks, 3 * per_call);
	T_EQ(ti.v_skipped, skipped);

	free(k);
	free(v);
	free(q);
	free(exact);
	free(out);
	session_release(s);
	dataop_ws_free(&ws);
	T_EQ(session_close(f.st, id, NULL), 0);
	fix_stop(&f);
}

/* f32 K/V, K[0] = 1e30 and q = 1e10, everything finite: q·k[0] overflows
 * to +inf.  The exact answer is V[0]; the daemon must say NONFINITE rather
 * than answer anything else. */
static void test_overflow_nonfinite(void)
{
	struct fix f;
	struct dataop_ws ws = { 0 };
	struct dataop_res r;
	const struct session_geom g = { 1, 1, 1, 64, TQ_CODEC_F32, TQ_CODEC_F32, 64, 0 };
	float k[4 * 64], v[4 * 64], q[64], out[64];
	int32_t pos = 3;
	uint64_t id;

	fix_start(&f);
	struct session *s = fix_open(&f, &g, &id);
	for (int i = 0; i < 4 * 64; i++) {
		k[i] = 0.0f;
		v[i] = 0.0f;
	}
	for (int j = 0; j < 64; j++) {
		k[j] = 1e30f;     /* key 0 */
		v[j] = 1.0f;      /* value 0: the exact answer is all ones */
		q[j] = 1e10f;
	}
	dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, 4, &r);
	T_EQ(r.status, TQKV_ST_OK);
	dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, &pos, 1, TQ_DTYPE_F32, out, &r);
	T_EQ(r.status, TQKV_ST_NONFINITE);
	T_ASSERT(r.res < 0);
	T_EQ(r.detail, 0);
	T_ASSERT(strstr(r.msg, "overflow"));
	/* every visible logit overflowing to -inf is caught as well */
	dataop_truncate(f.ks, s, 0, 0, 0, &r);
	T_EQ(r.status, TQKV_ST_OK);
	for (int i = 0; i < 4 * 64; i++)
		k[i] = 1e30f;
	for (int j = 0; j < 64; j++)
		q[j] = -1e10f;
	dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, 4, &r);
	T_EQ(r.status, TQKV_ST_OK);
	dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, &pos, 1, TQ_DTYPE_F32, out, &r);
	T_EQ(r.status, TQKV_ST_NONFINITE);
	/* the same session with ordinary values still answers, and right:
	 * V[0] is ones, the others zeros, so every output is key 0's weight */
	dataop_truncate(f.ks, s, 0, 0, 0, &r);
	for (int i = 0; i < 4 * 64; i++)
		k[i] = (float)(i % 7) * 0.01f;
	for (int j = 0; j < 64; j++)
		q[j] = 0.5f;
	dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, 4, &r);
	T_EQ(r.status, TQKV_ST_OK);
	pos = 3;
	dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, &pos, 1, TQ_DTYPE_F32, out, &r);
	T_EQ(r.status, TQKV_ST_OK);
	double e[4], sum = 0.0;
	for (int t = 0; t < 4; t++) {
		double dot = 0.0;
		for (int j = 0; j < 64; j++)
			dot += (double)q[j] * k[t * 64 + j];
		sum += e[t] = exp(dot / 8.0);
	}
	for (int j = 0; j < 64; j++)
		T_NEAR(out[j], e[0] / sum, 1e-5);
	session_release(s);
	dataop_ws_free(&ws);
	T_EQ(session_close(f.st, id, NULL), 0);
	fix_stop(&f);
}

/* Every key codec, through the tile path (d 64) and the register-direct
 * one (d 128): a key whose logit overflows to +inf is NONFINITE.  Codecs
 * that keep the values as given (f32, f16, q4a: no rotation, no scale
 * after the dot product) also get 32 keys whose products overflow both
 * ways (NaN logits, the exact logit is 0) before 8 ordinary ones: NONFINITE
 * too, where an unchecked path answers from the ordinary keys alone.
 * Ordinary values in the same session still answer. */
static void test_overflow_every_codec(void)
{
	static const enum tq_codec_id kcs[] = {
		TQ_CODEC_F32, TQ_CODEC_F16, TQ_CODEC_Q4A, TQ_CODEC_Q8, TQ_CODEC_TQ2, TQ_CODEC_TQ3, TQ_CODEC_TQ4,
	};
	static const uint32_t dims[] = { 64, 128 };
	enum { T = 40, DMAX = 128 };
	static float k[T * DMAX], v[T * DMAX];
	float q[DMAX], out[DMAX];
	struct fix f;
	struct dataop_ws ws = { 0 };
	struct dataop_res r;
	uint64_t id;

	fix_start(&f);
	for (size_t c = 0; c < sizeof(kcs) / sizeof(kcs[0]); c++)
		for (size_t di = 0; di < 2; di++) {
			const uint32_t d = dims[di];
			const struct session_geom g = { 1, 1, 1, d, kcs[c], TQ_CODEC_TQ4, T, 0 };
			/* keys within each codec's range (fp16 values; a tq norm
			 * whose square fits fp32); |q·k| · scale beyond 3.4e38 */
			const bool f16 = kcs[c] == TQ_CODEC_F16 || kcs[c] == TQ_CODEC_Q4A;
			const bool tq = tq_codec_rotated(kcs[c]) && kcs[c] != TQ_CODEC_Q8;
			const float big = f16 ? 60000.0f : tq ? 1e18f : 1e30f;
			const float qbig = f16 ? 1e34f : tq ? 1e22f : 1e10f;
			int32_t pos;
			struct session *s = fix_open(&f, &g, &id);

			for (uint32_t i = 0; i < T * d; i++) {
				k[i] = frand();
				v[i] = frand();
			}
			for (uint32_t j = 0; j < d; j++) {
				k[j] = big;
				q[j] = qbig;
			}
			dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, 4, &r);
			if (r.status != TQKV_ST_OK)
				T_FAIL("K %s d %u: append: status %u: %s", tq_codec_name(kcs[c]), d, r.status, r.msg);
			pos = 3;
			dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, &pos, 1, TQ_DTYPE_F32, out, &r);
			if (r.status != TQKV_ST_NONFINITE)
				T_FAIL("K %s d %u, +inf logit: status %u, out[0] %g", tq_codec_name(kcs[c]), d,
				       r.status, out[0]);

			if (!tq_codec_rotated(kcs[c])) {
				dataop_truncate(f.ks, s, 0, 0, 0, &r);
				for (uint32_t i = 0; i < 32 * d; i++)
					k[i] = (i & 1) ? -big : big;
				dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, T, &r);
				T_EQ(r.status, TQKV_ST_OK);
				pos = T - 1;
				dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, &pos, 1, TQ_DTYPE_F32, out, &r);
				if (r.status != TQKV_ST_NONFINITE)
					T_FAIL("K %s d %u, NaN logits: status %u, out[0] %g", tq_codec_name(kcs[c]),
					       d, r.status, out[0]);
			}

			dataop_truncate(f.ks, s, 0, 0, 0, &r);
			for (uint32_t i = 0; i < T * d; i++)
				k[i] = frand();
			for (uint32_t j = 0; j < d; j++)
				q[j] = frand();
			dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, T, &r);
			pos = T - 1;
			dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, &pos, 1, TQ_DTYPE_F32, out, &r);
			T_EQ(r.status, TQKV_ST_OK);
			session_release(s);
			T_EQ(session_close(f.st, id, NULL), 0);
		}
	dataop_ws_free(&ws);
	fix_stop(&f);
}

/* ---- K/V transforms (kernels/tq_xform.h) ------------------------------------ */

enum { XL = 2, XKV = 2, XQ = 6, XD = 64, XN = 40 };

static uint64_t xrs;
static float xg(void)
{
	xrs = xrs * 6364136223846793005ULL + 1442695040888963407ULL;
	double u = (double)(xrs >> 11) * (1.0 / 9007199254740992.0) + 1e-12;
	xrs = xrs * 6364136223846793005ULL + 1442695040888963407ULL;
	double w = (double)(xrs >> 11) * (1.0 / 9007199254740992.0);
	return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w));
}

/* keys with a channel offset and outliers (what the transforms are for) */
static void x_fill(float *k, float *v, float *q, uint32_t n)
{
	for (uint32_t i = 0; i < n * XKV * XD; i++) {
		k[i] = (float)((i % XD) * 7 % 5) - 2.0f + ((i % XD) % 16 == 5 ? 6.0f : 1.0f) * xg();
		v[i] = xg();
	}
	for (uint32_t i = 0; i < n * XQ * XD; i++)
		q[i] = 0.3f * xg();
}

/* What tqkvd must compute, built here from the kernels alone: the same
 * codecs, calibration, transformed encoding and attention. */
struct xref {
	tq_codec *kc, *vc;
	tq_xf *xf;
	struct tq_page_geom g;
	uint8_t *pages[8];
	uint32_t n;
};

static int xref_attend(struct xref *x, const float *k, const float *v, const float *q, uint32_t n, float *out)
{
	float xk[XKV * XD], xv[XKV * XD], *xq = malloc(sizeof(float) * n * XQ * XD);
	int32_t pos[XN];
	tq_error te;
	int rc = -1;

	if (!xq)
		return -1;
	if (x->n == 0 && tq_xf_calibrate(x->xf, k, v, q, n, n, TQ_DTYPE_F32) < 0)
		goto out;
	for (uint32_t t = 0; t < n; t++) {
		uint32_t p = x->n + t;
		if (!x->pages[p / x->g.page_tokens] &&
		    !(x->pages[p / x->g.page_tokens] = aligned_alloc(TQ_PAGE_ALIGN, tq_page_bytes(&x->g))))
			goto out;
		uint8_t *pg = x->pages[p / x->g.page_tokens];
		tq_xf_keys(x->xf, k + (size_t)t * XKV * XD, TQ_DTYPE_F32, 1, xk);
		tq_xf_values(x->xf, v + (size_t)t * XKV * XD, TQ_DTYPE_F32, 1, xv);
		for (uint32_t h = 0; h < XKV; h++)
			if (tq_encode(x->kc, xk + h * XD, TQ_DTYPE_F32, 1, pg + tq_page_k_off(&x->g, h, p % x->g.page_tokens), &te) ||
			    tq_encode(x->vc, xv + h * XD, TQ_DTYPE_F32, 1, pg + tq_page_v_off(&x->g, h, p % x->g.page_tokens), &te))
				goto out;
	}
	x->n += n;
	for (uint32_t i = 0; i < n; i++)
		pos[i] = (int32_t)(x->n - n + i);
	tq_xf_queries(x->xf, q, TQ_DTYPE_F32, n, xq);
	struct tq_page_table pt = { .pages = (const uint8_t *const *)x->pages, .n_pages = tq_page_count(&x->g, x->n),
				    .n_tokens = x->n, .geom = x->g };
	struct tq_attn_params ap = { .k_codec = x->kc, .v_codec = x->vc, .n_q_heads = XQ, .kv = &pt, .n_q = (int)n,
				     .q = xq, .q_dtype = TQ_DTYPE_F32, .q_pos = pos, .causal = 1, .out = out,
				     .plan_n_q = (int)n };
	if ((rc = tq_attend(&ap, &te)) == 0)
		tq_xf_output(x->xf, out, n);
out:
	free(xq);
	return rc;
}

/* tqkvd with kv_xform set: each layer calibrated by its first append
 * (APPEND_ATTEND: with its queries), the answers bit-identical to the
 * kernels run by hand with the same transform; the statistics reported;
 * a layer emptied calibrates again; a first append with a NaN fails and
 * leaves the layer uncalibrated; too short a first append is the identity;
 * a plain APPEND first gives centering without query-based equalization. */
static void test_kv_transform(void)
{
	static const uint32_t modes[] = { TQ_XF_DEFAULT, TQ_XF_K_CENTER | TQ_XF_V_CENTER | TQ_XF_K_EQ_K };
	static float k[XN * XKV * XD], v[XN * XKV * XD], q[XN * XQ * XD], out[XN * XQ * XD], ref[XN * XQ * XD];
	struct tq_xf_summary sum[XL];

	for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		/* the default mode over tq4o keys: K order applies too */
		const enum tq_codec_id kid = m == 0 ? TQ_CODEC_TQ4O : TQ_CODEC_TQ4;
		const struct session_geom g = { XL, XKV, XQ, XD, kid, TQ_CODEC_TQ3, 256, modes[m] };
		struct fix f;
		struct dataop_ws ws = { 0 };
		struct dataop_res r;
		struct xref x[XL];
		uint64_t id;
		int32_t pos[XN];
		tq_error te;

		fix_start(&f);
		struct session *s = fix_open(&f, &g, &id);
		T_EQ(dataop_xf_summary(f.ks, s, sum, XL), -ENOENT);
		memset(x, 0, sizeof(x));
		for (uint32_t l = 0; l < XL; l++) {
			struct tq_codec_params kp = { kid, XD, tqkv_seed_derive(session_seed(s), l, 0), TQ_ISA_AUTO };
			struct tq_codec_params vp = { TQ_CODEC_TQ3, XD, tqkv_seed_derive(session_seed(s), l, 1), TQ_ISA_AUTO };
			T_EQ(tq_codec_new(&x[l].kc, NULL, &kp, &te), 0);
			T_EQ(tq_codec_new(&x[l].vc, NULL, &vp, &te), 0);
			T_EQ(tq_xf_new(&x[l].xf, modes[m], XKV, XQ, XD, x[l].kc, &te), 0);
			x[l].g = (struct tq_page_geom){ XKV, (uint32_t)dataop_page_tokens(64 << 10, 0, &g),
							(uint32_t)tq_codec_block_bytes(x[l].kc),
							(uint32_t)tq_codec_block_bytes(x[l].vc) };
		}
		xrs = 99 + m;
		/* prefill 32 tokens, then 8 decode steps, both layers */
		for (uint32_t step = 0; step < 9; step++) {
			uint32_t n = step ? 1 : 32, p0 = step ? 31 + step : 0;
			for (uint32_t l = 0; l < XL; l++) {
				x_fill(k, v, q, n);
				for (uint32_t i = 0; i < n; i++)
					pos[i] = (int32_t)(p0 + i);
				dataop_attend(f.ks, s, &ws, l, k, v, n, q, pos, n, TQ_DTYPE_F32, out, &r);
				T_EQ(r.status, TQKV_ST_OK);
				T_EQ(xref_attend(&x[l], k, v, q, n, ref), 0);
				if (memcmp(out, ref, sizeof(float) * n * XQ * XD))
					T_FAIL("mode 0x%x step %u layer %u: tqkvd differs from the kernels", modes[m], step, l);
			}
		}
		T_EQ(dataop_xf_summary(f.ks, s, sum, XL), 0);
		for (uint32_t l = 0; l < XL; l++) {
			T_EQ(sum[l].calibrated, 1);
			T_EQ(sum[l].applied, modes[m]);
			T_EQ(sum[l].calib_tokens, 32);
			T_ASSERT(sum[l].k_mean_norm > 0.5f * sum[l].k_rms);
		}
		/* emptied: calibrates again, here from a plain APPEND (no queries) */
		dataop_truncate(f.ks, s, 0, 1, 0, &r);
		T_EQ(r.status, TQKV_ST_OK);
		T_EQ(dataop_xf_summary(f.ks, s, sum, XL), 0);
		T_EQ(sum[0].calibrated, 0);
		x_fill(k, v, q, 20);
		dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, 20, &r);
		T_EQ(r.status, TQKV_ST_OK);
		T_EQ(dataop_xf_summary(f.ks, s, sum, XL), 0);
		T_EQ(sum[0].calib_tokens, 20);
		T_EQ(sum[0].applied, modes[m] & ~(uint32_t)TQ_XF_K_EQ_QK);
		/* a NaN in the append that would calibrate: refused, uncalibrated */
		dataop_truncate(f.ks, s, 1, 0, 0, &r);
		x_fill(k, v, q, 20);
		v[3 * XKV * XD + 5] = NAN;
		dataop_append(f.ks, s, 1, k, v, TQ_DTYPE_F32, 20, &r);
		T_EQ(r.status, TQKV_ST_NONFINITE);
		T_EQ(r.n_tokens, 0);
		T_EQ(dataop_xf_summary(f.ks, s, sum, XL), 0);
		T_EQ(sum[1].calibrated, 0);
		/* too few tokens: the identity, frozen while the layer holds tokens */
		x_fill(k, v, q, 4);
		dataop_append(f.ks, s, 1, k, v, TQ_DTYPE_F32, TQ_XF_MIN_TOKENS - 1, &r);
		T_EQ(r.status, TQKV_ST_OK);
		x_fill(k, v, q, 20);
		dataop_append(f.ks, s, 1, k, v, TQ_DTYPE_F32, 20, &r);
		T_EQ(dataop_xf_summary(f.ks, s, sum, XL), 0);
		T_EQ(sum[1].calibrated, 1);
		T_EQ(sum[1].applied, modes[m] & TQ_XF_K_UNSHRINK);
		T_EQ(sum[1].calib_tokens, TQ_XF_MIN_TOKENS - 1);
		for (uint32_t l = 0; l < XL; l++) {
			for (uint32_t i = 0; i < 8 && x[l].pages[i]; i++)
				free(x[l].pages[i]);
			tq_codec_free(x[l].kc);
			tq_codec_free(x[l].vc);
			tq_xf_free(x[l].xf);
		}
		session_release(s);
		dataop_ws_free(&ws);
		T_EQ(session_close(f.st, id, NULL), 0);
		fix_stop(&f);
	}
}

int main(void)
{
	T_RUN(test_big_attend_rss);
	T_RUN(test_passes_bit_identical);
	T_RUN(test_overflow_nonfinite);
	T_RUN(test_overflow_every_codec);
	T_RUN(test_kv_transform);
	T_RUN(test_tenant_sparse_v);
	return t_done();
}
