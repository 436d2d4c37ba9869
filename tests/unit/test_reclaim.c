/* test_reclaim — the reclaimer's policy against the real pool, tenants,
 * sessions, page tables and spill store (in-process): above the high mark
 * it spills down to the low mark from tenants above their guarantee,
 * lowest priority first, least recently used sessions first; a tenant at
 * or under its guarantee is never touched; a limit lowered at run time is
 * enforced by spilling; what was spilled comes back bit-identical;
 * admission on a full pool: a tenant within its guarantee waits while a
 * lower tenant is spilled, a tenant above it never takes from a higher
 * priority, and pool.pressure_action (fail / evict) when the tier is full;
 * with evict, two sessions waiting at once never evict each other, and a
 * waiter evicted meanwhile stops waiting at once. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "dataop.h"
#include "dataop_internal.h" /* white-box: a session's operation lock */
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
 * test 0 (priority 50); rp: watermarks, admission; spill_slots: the tier's
 * size in pages. */
static void fix_start_opts(struct fix *f, struct reclaim_params rp, uint64_t spill_slots, bool admit, bool manual)
{
	char why[512];

	kvfix_start(&f->kv, "[pool]\npool_bytes = 16M\n"
		    "[tenant prod]\nguaranteed = 6M\nlimit = 16M\npriority = 90\nallow_uids = *\n"
		    "[tenant test]\nlimit = 16M\npriority = 50\nallow_uids = *\n"
		    "[tenant batch]\nlimit = 16M\npriority = 10\nallow_uids = *\n", 16 * MiB, PAGE, spill_slots);
	if ((manual ? reclaim_start_manual : reclaim_start)(&f->rc, f->kv.pool, f->kv.tt, f->kv.st, f->kv.ks, &rp, why,
							     sizeof(why)) < 0) {
		fprintf(stderr, "setup failed: %s\n", why);
		exit(1);
	}
	if (admit) /* allocations kick the thread and wait on a full pool */
		kvstore_set_reclaim(f->kv.ks, f->rc);
}

static void fix_start_with(struct fix *f, struct reclaim_params rp, uint64_t spill_slots, bool admit)
{
	fix_start_opts(f, rp, spill_slots, admit, false);
}

/* watermarks 75 % / 50 %, no thread: passes run when the test calls them
 * (the thread's 1 s tick would also act while a slow run fills the pool) */
static void fix_start(struct fix *f)
{
	fix_start_opts(f, (struct reclaim_params){ 75, 50, 2000, CONFIG_PRESSURE_FAIL }, 512, false, true);
}

static void fix_stop(struct fix *f)
{
	kvstore_set_reclaim(f->kv.ks, NULL);
	reclaim_stop(f->rc);
	kvfix_stop(&f->kv);
}

/* 2 layers x 2 KV heads x 128, q8/tq4: about 2.5 MiB per 3,200 tokens */
static const struct session_geom G = { 2, 2, 4, 128, TQ_CODEC_Q8, TQ_CODEC_TQ4, 8192, 0 };

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
	T_EQ(tenant_set_budget(f.kv.tt, tenant_find(f.kv.tt, "test"), true, used / 2, false, 0, NULL, 0), 0);
	T_ASSERT(reclaim_pass(f.rc) >= used - used / 2);
	T_ASSERT(tenant_used_of(&f, "test") <= used / 2);
	T_ASSERT(info(&f, t2).spilled_bytes > 0); /* the least recently used first */
	/* a limit that is no multiple of the page size: down to it, not near it */
	uint64_t odd = tenant_used_of(&f, "test") - PAGE / 2 - 1000;
	T_EQ(tenant_set_budget(f.kv.tt, tenant_find(f.kv.tt, "test"), true, odd, false, 0, NULL, 0), 0);
	T_ASSERT(reclaim_pass(f.rc) >= PAGE);
	T_ASSERT(tenant_used_of(&f, "test") <= odd);
	/* the watermarks are checked; bad ones are refused with the reason */
	struct reclaim_params bad = { 50, 60, 2000, CONFIG_PRESSURE_FAIL };
	T_EQ(reclaim_set_params(f.rc, &bad, why, sizeof(why)), -EINVAL);
	T_ASSERT(strstr(why, "watermarks"));
	T_EQ(tenant_set_budget(f.kv.tt, tenant_find(f.kv.tt, "test"), true, 16 * MiB, false, 0, NULL, 0), 0);
	attend(&f, t1, TOK, after);
	T_ASSERT(memcmp(before, after, sizeof(after)) == 0);
	fix_stop(&f);
}

static void test_thread_acts_on_kick(void)
{
	struct fix f;

	fix_start_with(&f, (struct reclaim_params){ 75, 50, 2000, CONFIG_PRESSURE_FAIL }, 512, false);
	/* marks out of reach while the pool fills: the thread's 1 s tick must
	 * not act before the check (filling takes longer under TSan) */
	struct reclaim_params rp, hold = { 100, 99, 2000, CONFIG_PRESSURE_FAIL };
	reclaim_get_params(f.rc, &rp);
	MUST(reclaim_set_params(f.rc, &hold, (char[64]){ 0 }, 64) == 0);
	for (int i = 0; i < 6; i++)
		open_filled(&f, "batch", TOK, 20 + (uint64_t)i, 100 + (uint64_t)i);
	T_ASSERT(pool_used_bytes(&f) * 100 > 16 * MiB * 75);
	MUST(reclaim_set_params(f.rc, &rp, (char[64]){ 0 }, 64) == 0); /* a reload: kicks the thread */
	reclaim_kick(f.rc);
	for (int i = 0; i < 1000 && pool_used_bytes(&f) * 100 > 16 * MiB * 51; i++)
		usleep(10000);
	T_ASSERT(pool_used_bytes(&f) * 100 <= 16 * MiB * 51);
	fix_stop(&f);
}

/* Append `tokens` to both layers of session id: the first failure's status. */
static uint32_t append_more(struct fix *f, uint64_t id, uint32_t tokens, uint64_t seed, char *msg, size_t msglen)
{
	size_t n = (size_t)tokens * 2 * 128;
	float *k = malloc(n * 4), *v = malloc(n * 4);
	struct dataop_res r = { 0 };
	struct session *s;
	int e;

	MUST(k && v);
	for (size_t i = 0; i < n; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		k[i] = (float)(seed >> 40) / (float)(1 << 24) - 0.5f;
		v[i] = (float)(seed >> 20 & 0xfffff) / (float)(1 << 20) - 0.5f;
	}
	if ((e = session_acquire(f->kv.st, id, 5000, &s)) < 0) {
		free(k);
		free(v);
		return e == -ESTALE ? TQKV_ST_EVICTED : TQKV_ST_NO_SESSION;
	}
	for (uint32_t l = 0; l < G.n_layers && r.status == TQKV_ST_OK; l++)
		dataop_append(f->kv.ks, s, l, k, v, TQ_DTYPE_F32, tokens, &r);
	session_release(s);
	if (msg)
		snprintf(msg, msglen, "%s", r.msg);
	free(k);
	free(v);
	return r.status;
}

static uint64_t open_empty(struct fix *f, const char *tenant)
{
	struct session_info si;
	char why[200];

	MUST(session_open(f->kv.st, tenant_find(f->kv.tt, tenant), "", 1000, &G, 99, 0, 0, &si, why, sizeof(why)) == 0);
	return si.id;
}

/* The pool filled by batch to the last page (no waiting while it fills). */
static void fill_with_batch(struct fix *f, uint64_t *ids, int n_ids)
{
	struct reclaim_params rp;

	reclaim_get_params(f->rc, &rp);
	struct reclaim_params nowait = rp;
	nowait.admission_wait_ms = 0;
	MUST(reclaim_set_params(f->rc, &nowait, (char[64]){ 0 }, 64) == 0);
	for (int i = 0; i < n_ids; i++)
		ids[i] = open_filled(f, "batch", TOK, 40 + (uint64_t)i, 100 + (uint64_t)i);
	uint64_t last = open_empty(f, "batch");
	while (append_more(f, last, 64, 7, NULL, 0) == TQKV_ST_OK) {
	}
	while (append_more(f, last, 1, 7, NULL, 0) == TQKV_ST_OK) {
	}
	MUST(pool_pages_free_count(f->kv.pool) < 8);
	MUST(reclaim_set_params(f->rc, &rp, (char[64]){ 0 }, 64) == 0);
}

/* A tenant at its limit makes room by spilling its own least recently
 * used other sessions, within admission_wait, instead of being refused
 * (appends and spilled pages coming back alike); it never goes above the
 * limit, and is refused with the reason only when its other sessions hold
 * too little, without spilling them for nothing. */
static void test_limit_spills_own(void)
{
	struct fix f;
	static float before[2][OUT], after[OUT];
	char msg[256];

	fix_start_opts(&f, (struct reclaim_params){ 100, 99, 2000, CONFIG_PRESSURE_FAIL }, 512, true, true);
	/* (sessions open before the limit is lowered below what one may hold) */
	uint64_t t3 = open_empty(&f, "test");
	uint64_t t1 = open_filled(&f, "test", TOK, 11, 100), t2 = open_filled(&f, "test", TOK, 12, 200);
	attend(&f, t1, TOK, before[0]);
	attend(&f, t2, TOK, before[1]);
	struct tenant *tt = tenant_find(f.kv.tt, "test");
	uint64_t used0 = tenant_used(tt), limit = used0 + 4 * PAGE;
	T_EQ(tenant_set_budget(f.kv.tt, tt, true, limit, false, 0, NULL, 0), 0);
	/* a third session grows past the limit: t1 (least recently used) goes
	 * to the tier for it, t2 stays */
	T_EQ(append_more(&f, t3, 1600, 13, msg, sizeof(msg)), TQKV_ST_OK);
	T_ASSERT(tenant_used(tt) <= limit);
	T_ASSERT(info(&f, t1).spilled_bytes > 0);
	T_EQ(info(&f, t2).spilled_bytes, 0);
	struct tenant_info ti;
	tenant_get_info(tt, &ti);
	T_ASSERT(ti.pressure.waits >= 1 && ti.pressure.refusals == 0);
	/* t1's pages come back (t2 and t3 make room), bit-identical; then t2's */
	attend(&f, t1, TOK, after);
	T_ASSERT(memcmp(before[0], after, sizeof(after)) == 0);
	T_ASSERT(tenant_used(tt) <= limit);
	attend(&f, t2, TOK, after);
	T_ASSERT(memcmp(before[1], after, sizeof(after)) == 0);
	T_ASSERT(tenant_used(tt) <= limit);
	/* t3 alone would go over a limit lowered to its size: refused at
	 * once, with why, and the others are not spilled for nothing */
	T_EQ(tenant_set_budget(f.kv.tt, tt, true, info(&f, t3).resident_bytes + 2 * PAGE, false, 0, NULL, 0), 0);
	tenant_get_info(tt, &ti);
	uint64_t spilled = ti.pressure.spilled_bytes, used1 = tenant_used(tt);
	T_EQ(append_more(&f, t3, 1600, 14, msg, sizeof(msg)), TQKV_ST_TENANT_LIMIT);
	if (!strstr(msg, "its other sessions hold"))
		fprintf(stderr, "    %s\n", msg);
	T_ASSERT(strstr(msg, "its other sessions hold"));
	tenant_get_info(tt, &ti);
	T_EQ(ti.pressure.spilled_bytes, spilled);
	T_EQ(tenant_used(tt), used1);
	fix_stop(&f);
}

/* With admission_wait 0, or no spill tier, a tenant at its limit is
 * refused at once (TENANT_LIMIT), as before: nothing is spilled. */
static void test_limit_no_wait(void)
{
	struct fix f;
	char msg[256];

	fix_start_opts(&f, (struct reclaim_params){ 100, 99, 0, CONFIG_PRESSURE_FAIL }, 512, true, true);
	uint64_t t2 = open_empty(&f, "test");
	open_filled(&f, "test", TOK, 11, 100);
	struct tenant *tt = tenant_find(f.kv.tt, "test");
	T_EQ(tenant_set_budget(f.kv.tt, tt, true, tenant_used(tt) + PAGE, false, 0, NULL, 0), 0);
	T_EQ(append_more(&f, t2, 1600, 13, msg, sizeof(msg)), TQKV_ST_TENANT_LIMIT);
	T_ASSERT(strstr(msg, "admission_wait = 0"));
	struct tenant_info ti;
	tenant_get_info(tt, &ti);
	T_EQ(ti.pressure.spilled_bytes, 0);
	fix_stop(&f);
}

/* A tenant within its guarantee gets its pages on a full pool: the
 * lower-priority tenant above its guarantee is spilled for it, and the
 * wait is counted. */
static void test_admission_within_guarantee(void)
{
	struct fix f;
	static float before[5][OUT], after[OUT];
	uint64_t b[5];
	char msg[256];

	fix_start_with(&f, (struct reclaim_params){ 100, 99, 2000, CONFIG_PRESSURE_FAIL }, 512, true);
	fill_with_batch(&f, b, 5);
	for (int i = 0; i < 5; i++)
		attend(&f, b[i], TOK, before[i]);
	uint64_t p = open_empty(&f, "prod");
	T_EQ(append_more(&f, p, TOK, 3, msg, sizeof(msg)), TQKV_ST_OK);
	struct tenant_info prod, batch;
	tenant_get_info(tenant_find(f.kv.tt, "prod"), &prod);
	tenant_get_info(tenant_find(f.kv.tt, "batch"), &batch);
	T_ASSERT(prod.pressure.waits >= 1 && prod.pressure.refusals == 0);
	T_ASSERT(prod.pressure.wait_max_us < 2000000);
	T_ASSERT(batch.pressure.spilled_bytes >= prod.used);
	T_EQ(prod.pressure.spilled_bytes, 0);
	/* test (priority 50, no guarantee) may take from batch (priority 10)... */
	uint64_t t = open_empty(&f, "test");
	T_EQ(append_more(&f, t, 800, 5, msg, sizeof(msg)), TQKV_ST_OK);
	/* ...and batch's sessions come back bit-identical, spilling batch's
	 * others (never prod within its guarantee) to make room */
	uint64_t prod_used = tenant_used_of(&f, "prod");
	for (int i = 0; i < 5; i++) {
		attend(&f, b[i], TOK, after);
		T_ASSERT(memcmp(before[i], after, sizeof(after)) == 0);
	}
	T_EQ(tenant_used_of(&f, "prod"), prod_used);
	fix_stop(&f);
}

/* Two spills at once from a tenant above its guarantee — the reclaimer's
 * pass and an admission, on a slow disk — each counted the whole excess as
 * its own to take (the tenant's use drops only as each write completes),
 * and prod went below its guarantee by up to an admission's batch (32
 * pages) per admission alongside.  Bytes being written out now count as
 * gone (the tenant's `spilling`); an admission that finds nothing else
 * waits for them to be free.  (Old: prod held 12 of its 14 MiB.) */
static void *pass_thread(void *arg)
{
	struct fix *f = arg;

	reclaim_pass(f->rc);
	return NULL;
}

static void test_concurrent_spills_keep_guarantee(void)
{
	struct fix f;
	struct tenant_info ti;
	char why[512], msg[256];
	const uint64_t g = 14 * MiB;
	struct reclaim_params rp = { 75, 50, 5000, CONFIG_PRESSURE_FAIL };

	kvfix_start(&f.kv, "[pool]\npool_bytes = 16M\n"
		    "[tenant prod]\nguaranteed = 14M\nlimit = 16M\npriority = 90\nallow_uids = *\n"
		    "[tenant test]\nguaranteed = 1M\nlimit = 16M\npriority = 50\nallow_uids = *\n", 16 * MiB, PAGE,
		    512);
	MUST(reclaim_start_manual(&f.rc, f.kv.pool, f.kv.tt, f.kv.st, f.kv.ks, &rp, why, sizeof(why)) == 0);
	/* prod fills the pool, ~2 MiB above its guarantee (no admission yet:
	 * an append on the full pool fails) */
	for (int i = 0; i < 6; i++)
		open_filled(&f, "prod", TOK, 60 + (uint64_t)i, 100 + (uint64_t)i);
	uint64_t last = open_empty(&f, "prod");
	while (append_more(&f, last, 64, 7, NULL, 0) == TQKV_ST_OK) {
	}
	while (append_more(&f, last, 1, 7, NULL, 0) == TQKV_ST_OK) {
	}
	T_ASSERT(tenant_used_of(&f, "prod") > g + MiB);
	kvstore_set_reclaim(f.kv.ks, f.rc);
	spill_fault_delay(f.kv.sp, 300000);
	pthread_t th;
	MUST(pthread_create(&th, NULL, pass_thread, &f) == 0);
	struct tenant *prod = tenant_find(f.kv.tt, "prod");
	for (int i = 0; i < 5000 && !tenant_spilling(prod); i++)
		usleep(1000);
	T_ASSERT(tenant_spilling(prod) > 0); /* the pass's writes are in flight */
	uint64_t t = open_empty(&f, "test");
	T_EQ(append_more(&f, t, 64, 5, msg, sizeof(msg)), TQKV_ST_OK); /* on the full pool: admission */
	MUST(pthread_join(th, NULL) == 0);
	spill_fault_delay(f.kv.sp, 0);
	tenant_get_info(prod, &ti);
	if (ti.used < g)
		fprintf(stderr, "    prod holds %" PRIu64 " bytes, guarantee %" PRIu64 "\n", ti.used, g);
	T_ASSERT(ti.used >= g);
	T_EQ(ti.spilling, 0);
	fix_stop(&f);
}

/* A tenant above its guarantee never takes from a higher priority: it is
 * refused at once, with the reason. */
static void test_admission_respects_priority(void)
{
	struct fix f;
	char msg[256];

	/* admission_wait 0: prod's last append that would take it past its
	 * limit (the whole pool) is refused, not made room for by spilling
	 * its own other sessions (test_limit_spills_own) */
	fix_start_with(&f, (struct reclaim_params){ 100, 99, 0, CONFIG_PRESSURE_FAIL }, 512, true);
	/* prod fills the pool, far above its 6 MiB guarantee */
	uint64_t p[6];
	for (int i = 0; i < 6; i++)
		p[i] = open_filled(&f, "prod", TOK, 60 + (uint64_t)i, 100);
	uint64_t last = open_empty(&f, "prod");
	while (append_more(&f, last, 64, 7, NULL, 0) == TQKV_ST_OK) {
	}
	(void)p;
	uint64_t t = open_empty(&f, "test");
	T_EQ(append_more(&f, t, 64, 5, msg, sizeof(msg)), TQKV_ST_POOL_FULL);
	if (!strstr(msg, "no tenant of this or a lower priority"))
		fprintf(stderr, "    %s\n", msg);
	T_ASSERT(strstr(msg, "no tenant of this or a lower priority"));
	struct tenant_info ti;
	tenant_get_info(tenant_find(f.kv.tt, "test"), &ti);
	T_EQ(ti.pressure.refusals, 1);
	tenant_get_info(tenant_find(f.kv.tt, "prod"), &ti);
	T_EQ(ti.pressure.spilled_bytes, 0);
	fix_stop(&f);
}

/* A spill tier that fills up: pressure_action = fail says so; = evict
 * drops batch's least recently used session, whose owner learns why. */
static void test_pressure_action(void)
{
	for (int evict = 0; evict < 2; evict++) {
		struct fix f;
		uint64_t b[5];
		char msg[256];

		/* a tier of 8 pages: the first spill fits, then it is full */
		fix_start_with(&f, (struct reclaim_params){ 100, 99, 500, evict ? CONFIG_PRESSURE_EVICT
										  : CONFIG_PRESSURE_FAIL }, 8, true);
		fill_with_batch(&f, b, 5);
		uint64_t p = open_empty(&f, "prod");
		uint32_t st = append_more(&f, p, TOK, 3, msg, sizeof(msg));
		struct tenant_info prod, batch;
		tenant_get_info(tenant_find(f.kv.tt, "prod"), &prod);
		tenant_get_info(tenant_find(f.kv.tt, "batch"), &batch);
		if (!evict) {
			T_EQ(st, TQKV_ST_POOL_FULL);
			T_ASSERT(strstr(msg, "nothing could be spilled") && strstr(msg, "spill tier is full"));
			T_EQ(batch.pressure.evictions, 0);
			T_EQ(prod.pressure.refusals, 1);
		} else {
			T_EQ(st, TQKV_ST_OK);
			T_ASSERT(batch.pressure.evictions >= 1);
			/* the least recently used batch session went; its owner is told why */
			struct session_info si;
			T_EQ(session_get_info(f.kv.st, b[0], &si), 0);
			T_EQ(si.state, SESSION_EVICTED);
			T_EQ(si.evict_reason, TQKV_EVICT_PRESSURE);
			T_ASSERT(strstr(si.evict_why, "memory pressure"));
			T_EQ(append_more(&f, b[0], 1, 1, NULL, 0), TQKV_ST_EVICTED);
			T_EQ(session_evict_reason(f.kv.st, b[0]), TQKV_EVICT_PRESSURE);
			T_EQ(prod.pressure.refusals, 0);
		}
		fix_stop(&f);
	}
}

/* pool.pressure_action = evict takes a session only when all of it fits
 * within its tenant's excess over its guarantee; when none fits, only for
 * a requester within its own guarantee (which then wins), the smallest
 * session that covers the request.  Batch (guarantee 2 MiB) holds one
 * session of ~5 MiB, prod (within its 13 MiB guarantee) the rest of the
 * pool; then prod, or test (no guarantee, a higher priority than batch),
 * asks for more pages than an 8-page tier can make room for.  (Old:
 * batch's session went for either.) */
static void test_evict_fits_excess(void)
{
	for (int within = 0; within < 2; within++) {
		struct fix f;
		struct session_info si;
		char why[512], msg[256] = "";
		struct reclaim_params rp = { 100, 99, 500, CONFIG_PRESSURE_EVICT };

		kvfix_start(&f.kv, "[pool]\npool_bytes = 16M\n"
			    "[tenant prod]\nguaranteed = 13M\nlimit = 16M\npriority = 90\nallow_uids = *\n"
			    "[tenant test]\nlimit = 16M\npriority = 50\nallow_uids = *\n"
			    "[tenant batch]\nguaranteed = 2M\nlimit = 16M\npriority = 10\nallow_uids = *\n",
			    16 * MiB, PAGE, 8);
		MUST(reclaim_start_manual(&f.rc, f.kv.pool, f.kv.tt, f.kv.st, f.kv.ks, &rp, why, sizeof(why)) == 0);
		uint64_t bs = open_empty(&f, "batch");
		MUST(append_more(&f, bs, 7000, 11, NULL, 0) == TQKV_ST_OK);
		const char *req = within ? "prod" : "test";
		uint64_t p = 0;
		for (int k = 0; k < 8 && pool_pages_free_count(f.kv.pool) >= 8; k++) {
			p = open_empty(&f, "prod"); /* (a session holds 8,192 tokens at most) */
			while (append_more(&f, p, 64, 13, NULL, 0) == TQKV_ST_OK) {
			}
		}
		while (append_more(&f, p, 1, 13, NULL, 0) == TQKV_ST_OK) {
		}
		MUST(pool_pages_free_count(f.kv.pool) < 8);
		kvstore_set_reclaim(f.kv.ks, f.rc);
		uint64_t q = open_empty(&f, req);
		uint32_t st = append_more(&f, q, 2000, 14, msg, sizeof(msg));
		T_EQ(session_get_info(f.kv.st, bs, &si), 0);
		if (within) {
			if (st != TQKV_ST_OK)
				fprintf(stderr, "    prod within its guarantee: %s\n", msg);
			T_EQ(st, TQKV_ST_OK);
			T_EQ(si.state, SESSION_EVICTED);
			T_EQ(si.evict_reason, TQKV_EVICT_PRESSURE);
		} else {
			T_EQ(st, TQKV_ST_POOL_FULL);
			if (!strstr(msg, "more than its tenant has above its guarantee"))
				fprintf(stderr, "    test above its guarantee: %s\n", msg);
			T_ASSERT(strstr(msg, "more than its tenant has above its guarantee"));
			T_EQ(si.state, SESSION_OPEN);
			T_ASSERT(tenant_used_of(&f, "batch") >= 2 * MiB);
		}
		fix_stop(&f);
	}
}

static uint64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Two batch sessions of 7,000 tokens (about 5.3 MiB each, room left for
 * 400 more), the rest of the pool held by prod within its guarantee (no
 * candidate for batch's admission): each batch session is the other's
 * only candidate.  No waiting while they fill it. */
static void fill_with_two(struct fix *f, uint64_t *x, uint64_t *y)
{
	struct reclaim_params rp;

	reclaim_get_params(f->rc, &rp);
	struct reclaim_params nowait = rp;
	nowait.admission_wait_ms = 0;
	MUST(reclaim_set_params(f->rc, &nowait, (char[64]){ 0 }, 64) == 0);
	*x = open_empty(f, "batch");
	*y = open_empty(f, "batch");
	MUST(append_more(f, *x, 7000, 11, NULL, 0) == TQKV_ST_OK);
	MUST(append_more(f, *y, 7000, 12, NULL, 0) == TQKV_ST_OK);
	uint64_t p = open_empty(f, "prod");
	while (append_more(f, p, 64, 13, NULL, 0) == TQKV_ST_OK) {
	}
	while (append_more(f, p, 1, 13, NULL, 0) == TQKV_ST_OK) {
	}
	MUST(pool_pages_free_count(f->kv.pool) < 8);
	MUST(tenant_used_of(f, "prod") <= 6 * MiB);
	MUST(reclaim_set_params(f->rc, &rp, (char[64]){ 0 }, 64) == 0);
}

/* One operation that needs new pages on the full pool, on its own thread:
 * the session is acquired first (an operation in flight), then it waits
 * at the barrier (if any), then appends 400 tokens to each layer. */
struct racer {
	struct fix *f;
	uint64_t id;
	pthread_barrier_t *bar;
	pthread_t thread;
	uint32_t status;
	uint64_t ms;              /* how long the append took */
	int done;                 /* atomic */
	char msg[256];
};

static void *racer_main(void *arg)
{
	struct racer *r = arg;
	enum { NTOK = 400 };
	const size_t n = (size_t)NTOK * 2 * 128;
	float *k = malloc(n * 4), *v = malloc(n * 4);
	struct dataop_res res = { 0 };
	struct session *s;
	uint64_t seed = r->id;

	MUST(k && v);
	for (size_t i = 0; i < n; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		k[i] = (float)(seed >> 40) / (float)(1 << 24) - 0.5f;
		v[i] = (float)(seed >> 20 & 0xfffff) / (float)(1 << 20) - 0.5f;
	}
	int e = session_acquire(r->f->kv.st, r->id, 6000, &s);
	if (r->bar)
		pthread_barrier_wait(r->bar);
	if (e < 0) {
		r->status = e == -ESTALE ? TQKV_ST_EVICTED : TQKV_ST_NO_SESSION;
	} else {
		uint64_t t0 = mono_ms();
		for (uint32_t l = 0; l < G.n_layers && res.status == TQKV_ST_OK; l++)
			dataop_append(r->f->kv.ks, s, l, k, v, TQ_DTYPE_F32, NTOK, &res);
		r->ms = mono_ms() - t0;
		session_release(s);
		r->status = res.status;
		snprintf(r->msg, sizeof(r->msg), "%s", res.msg);
	}
	free(k);
	free(v);
	__atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static bool racer_done(struct racer *r)
{
	return __atomic_load_n(&r->done, __ATOMIC_ACQUIRE) != 0;
}

/* pressure_action = evict without a spill tier.  A session waiting for
 * pages evicts the only other one, which an operation holds (its memory
 * comes back only when that operation returns); meanwhile an operator
 * evicts the waiter: it must stop waiting at once (EVICTED), not sit out
 * admission_wait and then take pages for an evicted session. */
static void test_waiter_evicted(void)
{
	struct fix f;
	uint64_t x, y;
	struct session *held;

	fix_start_with(&f, (struct reclaim_params){ 100, 99, 3000, CONFIG_PRESSURE_EVICT }, 8, true);
	fill_with_two(&f, &x, &y);
	kvstore_set_spill(f.kv.ks, NULL); /* a tqkvd without a spill tier */
	MUST(session_acquire(f.kv.st, y, 0, &held) == 0); /* y: an operation in flight */
	struct racer rx = { .f = &f, .id = x };
	MUST(pthread_create(&rx.thread, NULL, racer_main, &rx) == 0);
	/* x evicts y (busy, but not waiting) and waits for its memory */
	for (int i = 0; i < 200 && info(&f, y).state == SESSION_OPEN; i++)
		usleep(5000);
	T_EQ(info(&f, y).state, SESSION_EVICTED);
	T_EQ(info(&f, y).evict_reason, TQKV_EVICT_PRESSURE);
	usleep(100000);
	T_ASSERT(!racer_done(&rx)); /* y's operation still holds its pages */
	uint64_t t0 = mono_ms();
	T_EQ(session_evict(f.kv.st, x, NULL), 0);
	for (int i = 0; i < 400 && !racer_done(&rx); i++)
		usleep(5000);
	uint64_t waited = mono_ms() - t0;
	fprintf(stderr, "    the evicted waiter returned %u after %llu ms (%s)\n", rx.status,
		(unsigned long long)waited, rx.msg);
	T_ASSERT(racer_done(&rx) && waited < 1000);
	session_release(held);
	pthread_join(rx.thread, NULL);
	T_EQ(rx.status, TQKV_ST_EVICTED);
	T_ASSERT(strstr(rx.msg, "evicted or closed while it waited"));
	T_EQ(info(&f, x).evict_reason, TQKV_EVICT_OPERATOR);
	struct tenant_info bi;
	tenant_get_info(tenant_find(f.kv.tt, "batch"), &bi);
	T_EQ(bi.pressure.refusals, 0); /* evicted, not refused */
	/* both gave their memory back; nothing was charged for the failed append */
	T_EQ(info(&f, x).resident_bytes, 0);
	T_EQ(info(&f, y).resident_bytes, 0);
	T_EQ(tenant_used_of(&f, "batch"), 0);
	T_EQ(pool_used_bytes(&f), tenant_used_of(&f, "prod"));
	fix_stop(&f);
}

/* pool.pressure_action = fail: the only pages to take belong to a session
 * an operator evicted while an operation held it; they come back when it
 * returns, so a waiter waits for them rather than being refused at once. */
static void test_waits_for_evicted_memory(void)
{
	struct fix f;
	uint64_t x, y;
	struct session *held;

	fix_start_with(&f, (struct reclaim_params){ 100, 99, 3000, CONFIG_PRESSURE_FAIL }, 512, true);
	fill_with_two(&f, &x, &y);
	MUST(session_acquire(f.kv.st, x, 0, &held) == 0);
	T_EQ(session_evict(f.kv.st, x, NULL), 0);
	T_ASSERT(info(&f, x).resident_bytes > 0); /* not yet: the operation holds it */
	struct racer ry = { .f = &f, .id = y };
	MUST(pthread_create(&ry.thread, NULL, racer_main, &ry) == 0);
	usleep(150000);
	T_ASSERT(!racer_done(&ry)); /* waiting, not refused */
	session_release(held);
	pthread_join(ry.thread, NULL);
	fprintf(stderr, "    the waiter returned %u after %llu ms %s\n", ry.status, (unsigned long long)ry.ms,
		ry.msg);
	T_EQ(ry.status, TQKV_ST_OK);
	T_EQ(info(&f, x).resident_bytes, 0);
	fix_stop(&f);
}

/* The same, but the evicted session is closed while its operation still
 * holds it: out of the table, its memory still on its way back.  The
 * waiter waits for it (it took "not in the table" for "given back" and
 * was refused at once: no session left to evict). */
static void test_waits_for_closed_memory(void)
{
	struct fix f;
	uint64_t x, y;
	struct session *held;
	struct session_info si;

	fix_start_with(&f, (struct reclaim_params){ 100, 99, 3000, CONFIG_PRESSURE_EVICT }, 8, true);
	fill_with_two(&f, &x, &y);
	kvstore_set_spill(f.kv.ks, NULL);
	MUST(session_acquire(f.kv.st, y, 0, &held) == 0);
	struct racer rx = { .f = &f, .id = x };
	MUST(pthread_create(&rx.thread, NULL, racer_main, &rx) == 0);
	for (int i = 0; i < 200 && info(&f, y).state == SESSION_OPEN; i++)
		usleep(5000);
	T_EQ(info(&f, y).state, SESSION_EVICTED);
	T_EQ(session_close(f.kv.st, y, NULL), 0); /* its owner closes it; the operation still runs */
	T_EQ(session_get_info(f.kv.st, y, &si), -ENOENT);
	usleep(150000);
	T_ASSERT(!racer_done(&rx)); /* waiting for y's memory, not refused */
	session_release(held);
	pthread_join(rx.thread, NULL);
	fprintf(stderr, "    the waiter returned %u after %llu ms %s\n", rx.status, (unsigned long long)rx.ms, rx.msg);
	T_EQ(rx.status, TQKV_ST_OK);
	T_EQ(info(&f, x).state, SESSION_OPEN);
	T_EQ(session_table_pending_release(f.kv.st), 0);
	fix_stop(&f);
}

/* pressure_action = evict without a spill tier: two sessions that hold the
 * pool between them both need pages at once.  Each is the other's only
 * candidate.  They must never evict each other (each would hold the
 * memory the other waits for until admission_wait ran out: both lost,
 * both refused), nor wait for each other until admission_wait (3 s): one
 * is evicted before it waits, or the later waiter gives way (POOL_FULL)
 * and the earlier evicts it once its operation has returned; the other
 * gets its pages. */
static void test_two_waiters(void)
{
	int gave_way = 0;

	for (int round = 0; round < 4; round++) {
		struct fix f;
		uint64_t x, y;
		pthread_barrier_t bar;

		fix_start_with(&f, (struct reclaim_params){ 100, 99, 3000, CONFIG_PRESSURE_EVICT }, 8, true);
		fill_with_two(&f, &x, &y);
		kvstore_set_spill(f.kv.ks, NULL);
		uint64_t tx = info(&f, x).tokens, ty = info(&f, y).tokens;
		MUST(pthread_barrier_init(&bar, NULL, 2) == 0);
		struct racer r[2] = { { .f = &f, .id = x, .bar = &bar }, { .f = &f, .id = y, .bar = &bar } };
		for (int i = 0; i < 2; i++)
			MUST(pthread_create(&r[i].thread, NULL, racer_main, &r[i]) == 0);
		for (int i = 0; i < 2; i++)
			pthread_join(r[i].thread, NULL);
		pthread_barrier_destroy(&bar);
		fprintf(stderr, "    round %d: x %u after %llu ms, y %u after %llu ms%s\n", round, r[0].status,
			(unsigned long long)r[0].ms, r[1].status, (unsigned long long)r[1].ms,
			r[0].status == TQKV_ST_OK || r[1].status == TQKV_ST_OK ? "" : " (both refused)");
		if (r[0].status != TQKV_ST_OK && r[1].status != TQKV_ST_OK)
			fprintf(stderr, "    x: %s\n    y: %s\n", r[0].msg, r[1].msg);
		/* one got its pages, the other was evicted or gave way (and was
		 * evicted then), well before admission_wait */
		const int w = r[0].status == TQKV_ST_OK ? 0 : 1;
		T_EQ(r[w].status, TQKV_ST_OK);
		T_ASSERT(r[!w].status == TQKV_ST_EVICTED || r[!w].status == TQKV_ST_POOL_FULL);
		gave_way += r[!w].status == TQKV_ST_POOL_FULL;
		struct tenant_info bi;
		tenant_get_info(tenant_find(f.kv.tt, "batch"), &bi);
		T_EQ(bi.pressure.refusals, r[!w].status == TQKV_ST_POOL_FULL); /* EVICTED is none */
		T_EQ(bi.pressure.limit_refusals, 0);
		T_ASSERT(r[0].ms < 2000 && r[1].ms < 2000);
		uint64_t ok = r[0].status == TQKV_ST_OK ? x : y, gone = ok == x ? y : x;
		T_EQ(info(&f, ok).state, SESSION_OPEN);
		T_EQ(info(&f, gone).state, SESSION_EVICTED);
		T_EQ(info(&f, gone).resident_bytes, 0);
		T_EQ(info(&f, ok).tokens, (ok == x ? tx : ty) + 400);
		fix_stop(&f);
	}
	fprintf(stderr, "    %d of 4 rounds had both waiting at once (the later gave way)\n", gave_way);
}

static struct kv_sess *kv_of(struct fix *f, uint64_t id)
{
	struct kv_sess *kv = f->kv.ks->bucket[id & (N_BUCKETS - 1)];

	while (kv && kv->id != id)
		kv = kv->next;
	MUST(kv);
	return kv;
}

/* Session y as if an operation of it waited for memory (white-box: its
 * operation lock held, the wait's mark set) since since_us; waiting_end
 * undoes it. */
static struct session *waiting_begin(struct fix *f, uint64_t y, uint64_t since_us, bool at_limit, bool stuck,
				     struct kv_sess **ky)
{
	struct session *sy;

	*ky = kv_of(f, y);
	MUST(session_acquire(f->kv.st, y, 0, &sy) == 0);
	pthread_mutex_lock(&(*ky)->lock);
	session_admit_begin(sy, since_us, at_limit, PAGE);
	session_admit_stuck(sy, stuck);
	return sy;
}

static void waiting_end(struct session *sy, struct kv_sess *ky)
{
	session_admit_end(sy);
	pthread_mutex_unlock(&ky->lock);
	session_release(sy);
}

/* x's and y's 400-token appends at once (racers released together);
 * both returned. */
static void race_pair(struct fix *f, uint64_t x, uint64_t y, struct racer *rx, struct racer *ry)
{
	pthread_barrier_t bar;

	MUST(pthread_barrier_init(&bar, NULL, 2) == 0);
	*rx = (struct racer){ .f = f, .id = x, .bar = &bar };
	*ry = (struct racer){ .f = f, .id = y, .bar = &bar };
	MUST(pthread_create(&rx->thread, NULL, racer_main, rx) == 0);
	MUST(pthread_create(&ry->thread, NULL, racer_main, ry) == 0);
	pthread_join(rx->thread, NULL);
	pthread_join(ry->thread, NULL);
	pthread_barrier_destroy(&bar);
	rx->bar = ry->bar = NULL;
}

/* Has racer r returned within 5 s? */
static bool racer_returns(struct racer *r)
{
	for (int i = 0; i < 1000 && !racer_done(r); i++)
		usleep(5000);
	return racer_done(r);
}

/* Tenant test at its limit; x's 400-token append (a racer) can only get
 * room from y's pages.  y = 3,000 tokens, x = 1,000; the limit 1 page
 * above their use. */
static void limit_two(struct fix *f, uint64_t *x, uint64_t *y)
{
	fix_start_opts(f, (struct reclaim_params){ 100, 99, 10000, CONFIG_PRESSURE_FAIL }, 512, true, true);
	*x = open_empty(f, "test");
	*y = open_empty(f, "test");
	MUST(append_more(f, *y, 3000, 21, NULL, 0) == TQKV_ST_OK);
	MUST(append_more(f, *x, 1000, 22, NULL, 0) == TQKV_ST_OK);
	struct tenant *t = tenant_find(f->kv.tt, "test");
	MUST(tenant_set_budget(f->kv.tt, t, true, tenant_used(t) + PAGE, false, 0, NULL, 0) == 0);
}

/* At its limit, a session waits for a sibling whose pages an operation
 * holds (busy: they become spillable when it returns), and for the charge
 * of a sibling closed in an operation (out of the table until it
 * returns): it was refused at once ("no pages left to spill"). */
static void test_limit_waits_for_busy_and_closed(void)
{
	for (int closed = 0; closed < 2; closed++) {
		struct fix f;
		uint64_t x, y;
		struct session *held = NULL;
		struct kv_sess *ky = NULL;

		limit_two(&f, &x, &y);
		if (closed) {
			MUST(session_acquire(f.kv.st, y, 0, &held) == 0);
			T_EQ(session_close(f.kv.st, y, NULL), 0);
		} else {
			ky = kv_of(&f, y);
			pthread_mutex_lock(&ky->lock); /* y: an operation in flight */
		}
		struct racer rx = { .f = &f, .id = x };
		MUST(pthread_create(&rx.thread, NULL, racer_main, &rx) == 0);
		usleep(150000);
		T_ASSERT(!racer_done(&rx)); /* waiting, not refused */
		if (closed)
			session_release(held);
		else
			pthread_mutex_unlock(&ky->lock);
		pthread_join(rx.thread, NULL);
		fprintf(stderr, "    %s sibling: the append returned %u after %llu ms %s\n", closed ? "closed" : "busy",
			rx.status, (unsigned long long)rx.ms, rx.msg);
		T_EQ(rx.status, TQKV_ST_OK);
		T_ASSERT(rx.ms < 5000); /* admission_wait is 10 s */
		T_ASSERT(tenant_used_of(&f, "test") <= tenant_limit(tenant_find(f.kv.tt, "test")));
		if (!closed)
			T_ASSERT(info(&f, y).spilled_bytes > 0);
		fix_stop(&f);
	}
}

/* ...but not for a sibling that itself waits at the limit since before
 * it: that one waits for the requester's pages (each waiting for the
 * other's until admission_wait ran out stalled two ring workers).  With
 * only such a sibling's pages to take, the append is refused at once,
 * with why; with a third, idle sibling, that one is spilled (the waiter,
 * first in LRU order, does not end the scan). */
static void test_limit_not_behind_waiter(void)
{
	for (int third = 0; third < 2; third++) {
		struct fix f;
		uint64_t x, y, z = 0;
		struct session *sy;

		limit_two(&f, &x, &y);
		if (third) {
			struct tenant *t = tenant_find(f.kv.tt, "test");
			MUST(tenant_set_budget(f.kv.tt, t, true, 16 * MiB, false, 0, NULL, 0) == 0);
			z = open_empty(&f, "test");
			MUST(append_more(&f, z, 3000, 23, NULL, 0) == TQKV_ST_OK);
			MUST(tenant_set_budget(f.kv.tt, t, true, tenant_used(t) + PAGE, false, 0, NULL, 0) == 0);
		}
		/* y waits at the limit, since long ago, for pages operations hold */
		struct kv_sess *ky;
		sy = waiting_begin(&f, y, 1, true, true, &ky);
		struct racer rx = { .f = &f, .id = x };
		MUST(pthread_create(&rx.thread, NULL, racer_main, &rx) == 0);
		T_ASSERT(racer_returns(&rx));
		waiting_end(sy, ky);
		pthread_join(rx.thread, NULL);
		fprintf(stderr, "    %s: the append returned %u after %llu ms: %s\n", third ? "a third sibling" : "alone",
			rx.status, (unsigned long long)rx.ms, rx.msg);
		T_EQ(info(&f, y).spilled_bytes, 0);
		if (third) {
			T_EQ(rx.status, TQKV_ST_OK);
			T_ASSERT(info(&f, z).spilled_bytes > 0);
		} else {
			T_EQ(rx.status, TQKV_ST_TENANT_LIMIT);
			T_ASSERT(strstr(rx.msg, "its other sessions hold"));
		}
		struct tenant_info ti;
		tenant_get_info(tenant_find(f.kv.tt, "test"), &ti);
		T_EQ(ti.pressure.limit_refusals, third ? 0 : 1); /* counted (limit_two's appends fit) */
		T_EQ(ti.pressure.refusals, 0);
		T_ASSERT(rx.ms < 2500); /* admission_wait is 10 s */
		fix_stop(&f);
	}
}

/* Two sessions of one tenant at its limit append at once, each needing
 * the other's pages: answered within moments (the later waiter gives way,
 * or one spills the other before it began), never after admission_wait
 * (10 s) with both ring workers stalled; at least one gets its pages, and
 * the tenant stays within its limit. */
static void test_limit_two_waiters(void)
{
	for (int round = 0; round < 4; round++) {
		struct fix f;
		uint64_t x, y;
		struct racer rx, ry;

		limit_two(&f, &x, &y); /* either holds enough for the other's 400 tokens */
		struct tenant *t = tenant_find(f.kv.tt, "test");
		race_pair(&f, x, y, &rx, &ry);
		fprintf(stderr, "    round %d: x %u after %llu ms, y %u after %llu ms\n", round, rx.status,
			(unsigned long long)rx.ms, ry.status, (unsigned long long)ry.ms);
		T_ASSERT(rx.ms < 5000 && ry.ms < 5000);
		T_ASSERT(rx.status == TQKV_ST_OK || ry.status == TQKV_ST_OK);
		T_ASSERT(rx.status == TQKV_ST_OK || rx.status == TQKV_ST_TENANT_LIMIT);
		T_ASSERT(ry.status == TQKV_ST_OK || ry.status == TQKV_ST_TENANT_LIMIT);
		T_ASSERT(tenant_used(t) <= tenant_limit(t));
		fix_stop(&f);
	}
}

/* Every free page of the pool, taken out of it (*n of them in *pages). */
static void take_free_pages(struct fix *f, uint8_t ***pages, uint32_t *n)
{
	*n = pool_pages_free_count(f->kv.pool);
	*pages = calloc(*n ? *n : 1, sizeof(**pages));
	MUST(*pages && (!*n || pool_pages_alloc(f->kv.pool, *n, *pages) == 0));
}

static void give_pages_back(struct fix *f, uint8_t **pages, uint32_t n)
{
	if (n)
		pool_pages_free(f->kv.pool, pages, n);
	free(pages);
}

/* Two sessions of one tenant above its guarantee append at once on a full
 * pool, each able to take only the other's pages: both wait for pool pages
 * (limit out of reach), or one at the limit and one for the pool (limit
 * a few pages above their use).  Any two memory waiters that could take
 * each other's pages used to wait for each other until admission_wait
 * (10 s), two ring workers stalled: the later gives way now.  At least one
 * gets its pages; the tenant stays within its limit. */
static void test_memory_waiters_give_way(void)
{
	for (int round = 0; round < 8; round++) {
		struct fix f;
		uint64_t x, y;
		uint8_t **held;
		uint32_t n_held;

		limit_two(&f, &x, &y);
		struct tenant *t = tenant_find(f.kv.tt, "test");
		MUST(tenant_set_budget(f.kv.tt, t, true, round < 4 ? 16 * MiB : tenant_used(t) + 4 * PAGE, false, 0,
				       NULL, 0) == 0);
		take_free_pages(&f, &held, &n_held);
		uint64_t tx = info(&f, x).tokens, ty = info(&f, y).tokens;
		struct racer rx, ry;
		race_pair(&f, x, y, &rx, &ry);
		fprintf(stderr, "    round %d (%s): x %u after %llu ms, y %u after %llu ms\n", round,
			round < 4 ? "pool" : "limit and pool", rx.status, (unsigned long long)rx.ms, ry.status,
			(unsigned long long)ry.ms);
		if (rx.status != TQKV_ST_OK)
			fprintf(stderr, "      x: %s\n", rx.msg);
		if (ry.status != TQKV_ST_OK)
			fprintf(stderr, "      y: %s\n", ry.msg);
		T_ASSERT(rx.ms < 5000 && ry.ms < 5000);
		T_ASSERT(rx.status == TQKV_ST_OK || ry.status == TQKV_ST_OK);
		const struct racer *rr[2] = { &rx, &ry };
		for (int i = 0; i < 2; i++) {
			uint32_t st = rr[i]->status;
			T_ASSERT(st == TQKV_ST_OK || st == TQKV_ST_POOL_FULL || st == TQKV_ST_TENANT_LIMIT);
		}
		/* an append that failed in its second layer keeps its first */
		T_ASSERT(info(&f, x).tokens >= tx + (rx.status == TQKV_ST_OK ? 400 : 0));
		T_ASSERT(info(&f, y).tokens >= ty + (ry.status == TQKV_ST_OK ? 400 : 0));
		T_ASSERT(tenant_used(t) <= tenant_limit(t));
		give_pages_back(&f, held, n_held);
		fix_stop(&f);
	}
}

/* The rule in each direction, y an operation held in its wait (white-box):
 * the later waiter x gives way to y when y waits since before it, is stuck
 * (waits for pages operations hold) and could take x's pages — x is
 * refused at once, saying so — and waits for y otherwise: y waits since
 * after x; y still gets pages elsewhere (not stuck); y waits for the pool
 * while its tenant is within its guarantee (less what y asks for: then it
 * cannot take its own tenant's pages); y's tenant has a lower priority
 * than x's (it cannot take them). */
static void test_waiter_gives_way_to_earlier(void)
{
	enum { Y_POOL_EARLIER, Y_LIMIT_EARLIER, Y_POOL_LATER, Y_POOL_NOT_STUCK, Y_POOL_WITHIN, Y_LOWER_PRIO, N_CASES };
	static const char *const name[N_CASES] = { "x at the limit, y for the pool since before",
						   "x for the pool, y at the limit since before",
						   "x for the pool, y for the pool since after",
						   "x at the limit, y for the pool since before, not stuck",
						   "x at the limit, y for the pool within its guarantee",
						   "x for the pool, y of a lower priority for the pool since before" };

	for (int c = 0; c < N_CASES; c++) {
		struct fix f;
		uint64_t x, y;
		struct session *sy;
		uint8_t **held = NULL;
		uint32_t n_held = 0;
		const bool x_pool = c == Y_LIMIT_EARLIER || c == Y_POOL_LATER || c == Y_LOWER_PRIO;

		limit_two(&f, &x, &y); /* x at the limit of tenant test (guarantee 0) */
		struct tenant *t = tenant_find(f.kv.tt, "test");
		if (c == Y_LOWER_PRIO) { /* y: batch's, all its pages above its guarantee (0) */
			MUST(session_close(f.kv.st, y, NULL) == 0);
			y = open_empty(&f, "batch");
			MUST(append_more(&f, y, 3000, 24, NULL, 0) == TQKV_ST_OK);
		}
		if (c == Y_POOL_WITHIN) /* within it even with y's request: its waiters spill other tenants */
			MUST(tenant_set_budget(f.kv.tt, t, false, 0, true, tenant_limit(t), NULL, 0) == 0);
		if (x_pool) { /* x waits for the pool, not the limit */
			MUST(tenant_set_budget(f.kv.tt, t, true, 16 * MiB, false, 0, NULL, 0) == 0);
			take_free_pages(&f, &held, &n_held);
		}
		struct kv_sess *ky;
		sy = waiting_begin(&f, y, c == Y_POOL_LATER ? UINT64_MAX : 1, c == Y_LIMIT_EARLIER, c != Y_POOL_NOT_STUCK,
				   &ky);
		struct racer rx = { .f = &f, .id = x };
		MUST(pthread_create(&rx.thread, NULL, racer_main, &rx) == 0);
		const bool waits = c != Y_POOL_EARLIER && c != Y_LIMIT_EARLIER;
		if (waits) {
			usleep(200000);
			T_ASSERT(!racer_done(&rx)); /* waiting for y, not refused */
		} else {
			T_ASSERT(racer_returns(&rx));
		}
		waiting_end(sy, ky);
		pthread_join(rx.thread, NULL);
		fprintf(stderr, "    %s: the append returned %u after %llu ms: %s\n", name[c], rx.status,
			(unsigned long long)rx.ms, rx.msg);
		T_ASSERT(rx.ms < 5000); /* admission_wait is 10 s */
		if (waits) {
			T_EQ(rx.status, TQKV_ST_OK); /* y's pages, once its operation returned */
			T_ASSERT(info(&f, y).spilled_bytes > 0);
		} else {
			T_EQ(info(&f, y).spilled_bytes, 0);
			T_EQ(rx.status, x_pool ? TQKV_ST_POOL_FULL : TQKV_ST_TENANT_LIMIT);
			T_ASSERT(strstr(rx.msg, x_pool ? "or earlier waiters'" : "held by earlier waiters"));
		}
		T_ASSERT(tenant_used(t) <= tenant_limit(t));
		if (held)
			give_pages_back(&f, held, n_held);
		fix_stop(&f);
	}
}

/* A prefetch that meets the limit with nothing to take but a busy
 * sibling's pages waits admission_wait once, not once per layer (an
 * 80-layer session's OP_RESTORE would have held its worker 80 x 2 s);
 * a later layer that fits at once still comes back. */
static void test_prefetch_waits_once(void)
{
	struct fix f;
	struct session *s;
	struct dataop_res r;
	uint64_t spilled;
	char why[256];

	fix_start_opts(&f, (struct reclaim_params){ 100, 99, 1000, CONFIG_PRESSURE_FAIL }, 512, true, true);
	uint64_t x = open_filled(&f, "test", TOK, 31, 100), y = open_filled(&f, "test", TOK, 32, 200);
	MUST(session_acquire(f.kv.st, x, 0, &s) == 0);
	MUST(dataop_spill(f.kv.ks, s, UINT64_MAX, &spilled, why, sizeof(why)) == 0 && spilled > 0);
	dataop_truncate(f.kv.ks, s, 1, 0, 100, &r); /* layer 1: 2 pages out, layer 0: 20 */
	MUST(r.status == TQKV_ST_OK);
	session_release(s);
	struct tenant *t = tenant_find(f.kv.tt, "test");
	T_EQ(tenant_set_budget(f.kv.tt, t, true, tenant_used(t) + PAGE, false, 0, NULL, 0), 0);
	struct kv_sess *ky = kv_of(&f, y);
	pthread_mutex_lock(&ky->lock); /* y: an operation in flight all along */
	MUST(session_acquire(f.kv.st, x, 0, &s) == 0);
	uint64_t t0 = mono_ms();
	dataop_prefetch(f.kv.ks, s, &r);
	uint64_t took = mono_ms() - t0;
	session_release(s);
	pthread_mutex_unlock(&ky->lock);
	fprintf(stderr, "    prefetch of 2 layers: %u after %llu ms: %s\n", r.status, (unsigned long long)took, r.msg);
	T_EQ(r.status, TQKV_ST_TENANT_LIMIT);
	T_ASSERT(took >= 950 && took < 1900); /* once 1 s, not twice */
	/* layer 1 fits at once: it came back; layer 0 is still out */
	struct kv_sess *kx = kv_of(&f, x);
	T_EQ(kx->layer[1].n_out, 0);
	T_ASSERT(kx->layer[0].n_out > 0);
	fix_stop(&f);
}

int main(void)
{
	log_set_level(LOG_WARNING);
	T_RUN(test_watermarks_and_order);
	T_RUN(test_lowered_limit);
	T_RUN(test_thread_acts_on_kick);
	T_RUN(test_admission_within_guarantee);
	T_RUN(test_admission_respects_priority);
	T_RUN(test_concurrent_spills_keep_guarantee);
	T_RUN(test_evict_fits_excess);
	T_RUN(test_limit_spills_own);
	T_RUN(test_limit_no_wait);
	T_RUN(test_limit_waits_for_busy_and_closed);
	T_RUN(test_limit_not_behind_waiter);
	T_RUN(test_limit_two_waiters);
	T_RUN(test_memory_waiters_give_way);
	T_RUN(test_waiter_gives_way_to_earlier);
	T_RUN(test_prefetch_waits_once);
	T_RUN(test_pressure_action);
	T_RUN(test_waiter_evicted);
	T_RUN(test_two_waiters);
	T_RUN(test_waits_for_evicted_memory);
	T_RUN(test_waits_for_closed_memory);
	return t_done();
}
