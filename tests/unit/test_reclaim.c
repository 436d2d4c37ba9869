/* test_reclaim — the reclaimer's policy against the real pool, tenants,
 * sessions, page tables and spill store (in-process): above the high mark
 * it spills down to the low mark from tenants above their guarantee,
 * lowest priority first, least recently used sessions first; a tenant at
 * or under its guarantee is never touched; a limit lowered at run time is
 * enforced by spilling; what was spilled comes back bit-identical. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "dataop.h"
#include "harness.h"
#include "kvfix.h"
#include "log.h"
#include "pool.h"
#include "reclaim.h"
#include "session.h"
#include "spill.h"
#include "tenant.h"
#include "tq_codec.h"
#include "tqkv_ring.h"

#define MiB  (1ull << 20)
#define PAGE (64u << 10)
#define MUST(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #x); exit(1); } } while (0)

struct fix {
	struct kvfix kv;
	struct reclaim *rc;
};

/* 16 MiB pool: prod guaranteed 6 MiB (priority 90), batch 0 (priority 10),
 * test 0 (priority 50); watermarks 75 % / 50 %. */
static void fix_start(struct fix *f)
{
	char why[512];
	struct reclaim_params rp = { 75, 50 };

	kvfix_start(&f->kv, "[pool]\npool_bytes = 16M\n"
		    "[tenant prod]\nguaranteed = 6M\nlimit = 16M\npriority = 90\nallow_uids = *\n"
		    "[tenant test]\nlimit = 16M\npriority = 50\nallow_uids = *\n"
		    "[tenant batch]\nlimit = 16M\npriority = 10\nallow_uids = *\n", 16 * MiB, PAGE, 512);
	if (reclaim_start(&f->rc, f->kv.pool, f->kv.tt, f->kv.st, f->kv.ks, &rp, why, sizeof(why)) < 0) {
		fprintf(stderr, "setup failed: %s\n", why);
		exit(1);
	}
}

static void fix_stop(struct fix *f)
{
	reclaim_stop(f->rc);
	kvfix_stop(&f->kv);
}

/* 2 layers x 2 KV heads x 128, q8/tq4: about 2.5 MiB per 3,200 tokens */
static const struct session_geom G = { 2, 2, 4, 128, TQ_CODEC_Q8, TQ_CODEC_TQ4, 8192 };

/* A session of tenant `tenant` with `tokens` per layer, last used at now_ms. */
static uint64_t open_filled(struct fix *f, const char *tenant, uint32_t tokens, uint64_t seed, uint64_t now_ms)
{
	struct session_info si;
	struct session *s;
	struct dataop_res r;
	char why[200];
	size_t n = (size_t)tokens * 2 * 128;
	float *k = malloc(n * 4), *v = malloc(n * 4);

	MUST(k && v);
	MUST(session_open(f->kv.st, tenant_find(f->kv.tt, tenant), "", 1000, &G, seed, 0, 0, &si, why, sizeof(why)) == 0);
	for (size_t i = 0; i < n; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		k[i] = (float)(seed >> 40) / (float)(1 << 24) - 0.5f;
		v[i] = (float)(seed >> 20 & 0xfffff) / (float)(1 << 20) - 0.5f;
	}
	MUST(session_acquire(f->kv.st, si.id, now_ms, &s) == 0);
	for (uint32_t l = 0; l < G.n_layers; l++) {
		dataop_append(f->kv.ks, s, l, k, v, TQ_DTYPE_F32, tokens, &r);
		MUST(r.status == TQKV_ST_OK);
	}
	session_release(s);
	free(k);
	free(v);
	return si.id;
}

/* Attention over both layers at 3 positions (restores what is spilled). */
static void attend(struct fix *f, uint64_t id, uint32_t tokens, float *out)
{
	struct dataop_ws ws = { 0 };
	struct dataop_res r;
	struct session *s;
	float q[3 * 4 * 128];
	int32_t pos[3] = { 0, (int32_t)tokens / 2, (int32_t)tokens - 1 };

	for (int i = 0; i < 3 * 4 * 128; i++)
		q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
	MUST(session_acquire(f->kv.st, id, 0, &s) == 0);
	for (uint32_t l = 0; l < 2; l++) {
		dataop_attend(f->kv.ks, s, &ws, l, NULL, NULL, 0, q, pos, 3, TQ_DTYPE_F32, out + l * 3 * 4 * 128, &r);
		MUST(r.status == TQKV_ST_OK);
	}
	session_release(s);
	dataop_ws_free(&ws);
}

static struct session_info info(struct fix *f, uint64_t id)
{
	struct session_info si;
	MUST(session_get_info(f->kv.st, id, &si) == 0);
	return si;
}

static uint64_t tenant_used_of(struct fix *f, const char *name)
{
	return tenant_used(tenant_find(f->kv.tt, name));
}

static uint64_t pool_used_bytes(struct fix *f)
{
	struct pool_stats ps;
	pool_stats(f->kv.pool, &ps);
	return (uint64_t)(ps.pages_total - ps.pages_free) * ps.page_bytes;
}

enum { TOK = 3200, OUT = 2 * 3 * 4 * 128 };

static void test_watermarks_and_order(void)
{
	struct fix f;
	static float before[5][OUT], after[OUT];

	fix_start(&f);
	/* prod: 2 sessions (within its 6 MiB guarantee); test: 1; batch: 2,
	 * its first one least recently used */
	uint64_t p1 = open_filled(&f, "prod", TOK, 1, 1000), p2 = open_filled(&f, "prod", TOK, 2, 1001);
	uint64_t t1 = open_filled(&f, "test", TOK, 3, 1002);
	uint64_t b_old = open_filled(&f, "batch", TOK, 4, 500), b_new = open_filled(&f, "batch", TOK, 5, 2000);
	uint64_t ids[5] = { p1, p2, t1, b_old, b_new };
	for (int i = 0; i < 5; i++)
		attend(&f, ids[i], TOK, before[i]);
	uint64_t prod0 = tenant_used_of(&f, "prod"), used0 = pool_used_bytes(&f);
	fprintf(stderr, "    pool %llu KiB used of 16 MiB; prod %llu KiB\n", (unsigned long long)used0 >> 10,
		(unsigned long long)prod0 >> 10);
	T_ASSERT(used0 * 100 > 16 * MiB * 75); /* above the high mark */
	T_ASSERT(prod0 <= 6 * MiB);

	uint64_t got = reclaim_pass(f.rc);
	T_ASSERT(got > 0);
	T_ASSERT(pool_used_bytes(&f) * 100 <= 16 * MiB * 50 + PAGE * 100); /* at the low mark (to a page) */
	T_EQ(tenant_used_of(&f, "prod"), prod0);                           /* within its guarantee: untouched */
	/* batch (priority 10) went first, its least recently used session first */
	T_ASSERT(info(&f, b_old).spilled_bytes > 0);
	T_ASSERT(info(&f, b_old).resident_bytes == 0 || info(&f, b_new).spilled_bytes == 0);
	if (got <= info(&f, b_old).spilled_bytes + info(&f, b_new).spilled_bytes)
		T_EQ(info(&f, t1).spilled_bytes, 0); /* test (priority 50) only when batch had no more */
	/* a pass under the high mark does nothing */
	T_EQ(reclaim_pass(f.rc), 0);

	/* every session reads back bit-identical */
	for (int i = 0; i < 5; i++) {
		attend(&f, ids[i], TOK, after);
		T_ASSERT(memcmp(before[i], after, sizeof(after)) == 0);
	}
	struct reclaim_stats rs;
	reclaim_stats(f.rc, &rs);
	T_ASSERT(rs.spilled_bytes == got && rs.decisions >= 1 && rs.failures == 0);
	fix_stop(&f);
}

static void test_lowered_limit(void)
{
	struct fix f;
	static float before[OUT], after[OUT];
	char why[256];

	fix_start(&f);
	uint64_t t1 = open_filled(&f, "test", TOK, 7, 1000), t2 = open_filled(&f, "test", TOK, 8, 900);
	attend(&f, t1, TOK, before);
	uint64_t used = tenant_used_of(&f, "test");
	/* a limit below current use is accepted; the reclaimer brings the
	 * tenant down by spilling, although the pool is not under pressure */
	T_EQ(tenant_set_budget(f.kv.tt, tenant_find(f.kv.tt, "test"), true, used / 2, false, 0), 0);
	T_ASSERT(reclaim_pass(f.rc) >= used - used / 2);
	T_ASSERT(tenant_used_of(&f, "test") <= used / 2);
	T_ASSERT(info(&f, t2).spilled_bytes > 0); /* the least recently used first */
	/* the watermarks are checked; bad ones are refused with the reason */
	struct reclaim_params bad = { 50, 60 };
	T_EQ(reclaim_set_params(f.rc, &bad, why, sizeof(why)), -EINVAL);
	T_ASSERT(strstr(why, "watermarks"));
	T_EQ(tenant_set_budget(f.kv.tt, tenant_find(f.kv.tt, "test"), true, 16 * MiB, false, 0), 0);
	attend(&f, t1, TOK, after);
	T_ASSERT(memcmp(before, after, sizeof(after)) == 0);
	fix_stop(&f);
}

static void test_thread_acts_on_kick(void)
{
	struct fix f;

	fix_start(&f);
	for (int i = 0; i < 6; i++)
		open_filled(&f, "batch", TOK, 20 + (uint64_t)i, 100 + (uint64_t)i);
	T_ASSERT(pool_used_bytes(&f) * 100 > 16 * MiB * 75);
	reclaim_kick(f.rc);
	for (int i = 0; i < 200 && pool_used_bytes(&f) * 100 > 16 * MiB * 51; i++)
		usleep(10000);
	T_ASSERT(pool_used_bytes(&f) * 100 <= 16 * MiB * 51);
	fix_stop(&f);
}

int main(void)
{
	log_set_level(LOG_WARNING);
	T_RUN(test_watermarks_and_order);
	T_RUN(test_lowered_limit);
	T_RUN(test_thread_acts_on_kick);
	return t_done();
}
