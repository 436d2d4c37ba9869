/* test_pressure_model — memory budgets under pressure, as a randomized model
 * test against the real pool, tenants, sessions, page tables, spill store
 * (io_uring) and reclaimer, in-process and single-threaded: the reclaimer
 * runs without its thread (reclaim_start_manual), so nothing moves between
 * steps and every step can be checked exactly.
 *
 * A run is TQ_MODEL_OPS (default 300,000; 100,000 in a sanitizer build;
 * make test-faults runs 1,000,000) random steps from the seed
 * TQ_MODEL_SEED (default fixed): open, append, attend (some appending),
 * truncate (one layer / all), close, evict, spill a session, prefetch, a
 * reclaim pass (sometimes with new watermarks), a budget change (limits
 * lowered below use, limits that are no multiple of the page size,
 * guarantees that must be refused) and a config reload merged and
 * validated the way main.c does it (budgets, priorities, watermarks,
 * admission wait, pressure action: fail or evict).  Four tenants share a
 * 512-page pool (4 KiB pages: the tenants' 1 MiB minimum limit is half of
 * it) and a 1,024-slot spill tier; admission is on (kvstore_set_reclaim).
 * Sessions have random geometries and codecs; most steps go to a few hot
 * sessions, so the others cool down into the tier; phases grow and shrink
 * the data, and some squeeze the tier by holding slots (ballast) until it
 * is full.  The model keeps every layer's expected page bytes, encoded
 * independently (its own codecs: same codec, dim and rotation seed).
 *
 * After every step:
 *   - per tenant: used = its sessions' resident bytes = (resident +
 *     read-ahead pages) x page size; spilled likewise; session counts;
 *     budgets and priorities as set;
 *   - pool pages in use = resident + read-ahead pages of all sessions, no
 *     pool page held twice; spill slots = spilled + read-ahead pages (+
 *     ballast), no slot held twice (the store's own count every 64th step:
 *     spill_stats is slow; TQ_MODEL_CHECK_ALL=1 every step); no KV state
 *     left by a closed or evicted session;
 *   - no tenant above its limit, except one whose limit was just lowered
 *     below its use: its use must not grow, and a reclaim pass brings it
 *     under the limit unless the tier is full;
 *   - spills (admission and passes): never from a tenant at or under its
 *     guarantee, never below it; least recently used sessions first,
 *     lower priorities first (unless the tier filled up and the read-ahead
 *     of the one taken out of turn, collected first, gave slots back); a
 *     requester above its guarantee never takes from a higher priority; a
 *     pass above the high mark ends under the low mark (to a page) or with
 *     nothing left to spill;
 *   - a POOL_FULL refusal (append, attend) only as reclaim.h allows: every
 *     tenant the requester may take from — any other tenant when it is
 *     within its guarantee (counting the pages it asked for), else those
 *     of its priority or lower and itself (less the pages asked for, its
 *     requesting session excluded) — holds less than a whole page above
 *     its guarantee; or the tier is full and pressure_action = fail;
 *   - TENANT_LIMIT (append, attend, prefetch) only when the tenant's
 *     other sessions hold less than the charge would take it over its
 *     limit (they are spilled for it first: reclaim_charge), or the tier
 *     is full; a prefetch's POOL_FULL as an append's;
 *   - each POOL_FULL answer counted once in its tenant's refusals, each
 *     TENANT_LIMIT once in limit_refusals, and nothing else counted there;
 *   - TENANT_LIMIT, MAX_TOKENS, NONFINITE, BAD_LAYER, BAD_POSITION exactly
 *     when they apply; a failed operation changes no token; explicit
 *     spills move exactly the pages they can;
 *   - the operated session's pages that came back from the tier or were
 *     written bit-identical to the model's (every resident page of every
 *     session every 4096 steps and at the end); attention bit-identical
 *     to tq_attend over the model's pages (whenever the layer had pages
 *     out, else every 4th attend).
 * At the end every session is closed: every pool page and spill slot free.
 *
 * A failed check prints the seed, the step and the operation; the run is
 * deterministic: TQ_MODEL_SEED=<seed> TQ_MODEL_OPS=<step + 1> replays it
 * (TQ_MODEL_LOG=info adds the reclaimer's decisions, TQ_MODEL_PROFILE=1
 * the time per kind of step). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "dataop.h"
#include "dataop_internal.h" /* white-box: the page tables are walked after every step */
#include "harness.h"
#include "devsim.h"
#include "kvfix.h"
#include "log.h"
#include "pool.h"
#include "reclaim.h"
#include "session.h"
#include "spill.h"
#include "tenant.h"
#include "tq_attn.h"
#include "tq_codec.h"
#include "tq_page.h"
#include "tqkv_ring.h"

#define KiB          1024ull
#define MiB          (1ull << 20)
#define PAGE         4096u
#define POOL_PAGES   512u
#define POOL_BYTES   ((uint64_t)POOL_PAGES * PAGE)       /* 2 MiB: limits are 1..2 MiB */
#define SPILL_SLOTS  1024u
#define MAX_SESS     32u                                 /* daemon.max_sessions here */
#define MODEL_MAX    (MAX_SESS + 1)
#define N_TEN        4
#define MAX_LAYERS   4
#define MAX_DIM      32
#define MAX_KV       2
#define MAX_Q        (2 * MAX_KV)
#define MAX_APPEND   4096u                               /* tokens per append at most */
#define MAX_TOK      4096u                               /* max_tokens per session at most */
#define MAX_NQ       3
#define SWEEP_EVERY  4096u                               /* full page comparison */
#define IN_POOL      (1u << 20)                          /* random input values, per dtype */
#define GONE_ID      (UINT64_C(1) << 40)                 /* session ids never handed out */

static const char *const TNAME[N_TEN] = { "prod", "test", "batch", "bulk" };

/* ---- the model ------------------------------------------------------------------ */

struct mlayer {
	uint32_t n_tokens;
	uint32_t cap;             /* shadow pages allocated                          */
	uint8_t **shadow;         /* [cap] expected page bytes (committed tokens)    */
	tq_codec *kc, *vc;        /* the model's own: same codec, dim and seed       */
};

struct msess {
	bool used;                /* slot taken                                      */
	bool evicted;
	uint64_t id;
	int tenant;
	struct session_geom g;
	uint64_t seed;
	uint64_t max_len;         /* per layer: max_tokens (INT32_MAX at most)       */
	struct tq_page_geom pg;
	struct mlayer layer[MAX_LAYERS];
};

/* Snapshots: what a step changed. */
struct tsnap {
	uint64_t used, spilled, limit, guar, sessions;
	int32_t prio;
	struct tenant_pressure pr;
};
struct ssnap {
	uint64_t id;
	int tenant;
	uint64_t resident, spilled;   /* bytes (session_info)                        */
	uint32_t res_pages, reading;  /* RESIDENT pages; read-ahead (READING) pages   */
	uint64_t last_access;
	bool open;
};
struct snap {
	struct tsnap t[N_TEN];
	struct ssnap s[MODEL_MAX];
	uint32_t n;
	uint64_t pool_used;           /* bytes */
	uint64_t slots_used, slots_total;
	uint64_t evicted_now[MODEL_MAX]; /* sessions the step evicted (pressure) */
	uint32_t n_evicted_now;
};

enum op {
	OP_OPEN, OP_APPEND, OP_ATTEND, OP_TRUNCATE, OP_CLOSE, OP_EVICT, OP_SPILL, OP_PREFETCH,
	OP_PASS, OP_BUDGET, OP_RELOAD, OP__COUNT
};
/* the statuses a step can see, short (the summary) */
static const char *const STNAME[TQKV_ST__COUNT] = {
	[TQKV_ST_OK] = "OK", [TQKV_ST_BAD_LAYER] = "BAD_LAYER", [TQKV_ST_NO_SESSION] = "NO_SESSION",
	[TQKV_ST_NONFINITE] = "NONFINITE", [TQKV_ST_BAD_POSITION] = "BAD_POSITION",
	[TQKV_ST_TENANT_LIMIT] = "TENANT_LIMIT", [TQKV_ST_POOL_FULL] = "POOL_FULL",
	[TQKV_ST_MAX_TOKENS] = "MAX_TOKENS", [TQKV_ST_EVICTED] = "EVICTED", [TQKV_ST_INTERNAL] = "INTERNAL",
};

static const char *const OPNAME[OP__COUNT] = {
	"open", "append", "attend", "truncate", "close", "evict", "spill", "prefetch", "pass", "budget", "reload",
};

struct model {
	struct kvfix kv;
	struct reclaim *rc;
	struct reclaim_params rp;
	struct config live;           /* the running config (reload merges into it)   */
	tq_cache *cache;              /* the model's codebooks                        */
	uint64_t seed, rng, step, n_steps;
	uint64_t now;                 /* virtual clock: session_acquire's now_ms      */
	char desc[320];               /* the current step, for failure reports        */
	/* expected budgets */
	uint64_t limit[N_TEN], guar[N_TEN];
	int32_t prio[N_TEN];
	bool over[N_TEN];             /* limit lowered below use, not yet back under  */
	uint64_t over_used[N_TEN];    /* its use then: it must not grow               */
	struct msess s[MODEL_MAX];
	struct snap pre, post;
	bool snapped;                 /* post is this step's                          */
	/* pool page / spill slot uniqueness */
	uint8_t *pool_base;
	uint32_t *page_stamp, *slot_stamp, stamp;
	/* scratch */
	struct dataop_ws ws;
	void *in[3];                  /* random inputs by dtype: [IN_POOL] f32, f16, bf16 */
	void *k;                      /* [MAX_APPEND][MAX_KV][MAX_DIM]: K with a NaN    */
	const void *kp, *vp;          /* this step's K and V                           */
	float q[MAX_NQ * MAX_Q * MAX_DIM];
	float out[MAX_NQ * MAX_Q * MAX_DIM], ref[MAX_NQ * MAX_Q * MAX_DIM];
	uint8_t *pre_state[MAX_LAYERS]; /* page states of the operated session before */
	uint32_t pre_pages[MAX_LAYERS];
	/* phase: how much the sessions grow; the hot sessions most steps use */
	int phase;
	uint64_t hot[4];
	/* ballast: slots the model holds itself, so that the tier fills up
	 * (other tenants' data, persistent sessions' copies) without the
	 * data to fill it */
	uint64_t *ballast;
	uint32_t n_ballast;
	/* counts */
	uint64_t ops[OP__COUNT];
	double op_s[OP__COUNT];       /* time per kind (TQ_MODEL_PROFILE=1 prints it) */
	uint64_t st_count[TQKV_ST__COUNT];
	uint64_t ctl_fail[OP__COUNT];
	uint64_t slots_total;
	bool check_all;               /* TQ_MODEL_CHECK_ALL=1: the store's counts every step */
	uint64_t held_sum, held_max;  /* pages (resident + spilled) over the steps    */
	uint64_t pages_compared, attends_compared, within_refusals, tier_full_steps, over_limit_set;
	uint64_t limit_refusals_tier; /* TENANT_LIMIT that spilling the others would have met: tier full */
	uint64_t pressure_evictions, pass_bytes;
	int ans_tenant;               /* the step's data-path answer: to a session of */
	uint32_t ans_status;          /* this tenant (-1: none), with this status      */
};

static struct model *M; /* for fail() */

static _Noreturn void fail(int line, const char *cond, const char *fmt, ...)
{
	va_list ap;
	char path[128];

	fprintf(stderr, "test_pressure_model.c:%d: check failed: %s\n  ", line, cond);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n  seed 0x%" PRIx64 ", step %" PRIu64 ": %s\n  replay: TQ_MODEL_SEED=0x%" PRIx64
		" TQ_MODEL_OPS=%" PRIu64 " build/tests/test_pressure_model\n", M->seed, M->step, M->desc, M->seed,
		M->step + 1);
	snprintf(path, sizeof(path), "%s/%s", M->kv.dir, SPILL_FILE);
	unlink(path);
	rmdir(M->kv.dir);
	exit(1);
}

#define CHECK(c, ...) do { if (!(c)) fail(__LINE__, #c, __VA_ARGS__); } while (0)

static uint64_t rnd64(struct model *m)
{
	uint64_t z = (m->rng += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* uniform in [0, n) */
static uint64_t rnd(struct model *m, uint64_t n)
{
	return n ? rnd64(m) % n : 0;
}

/* true with probability per_mille / 1000 */
static bool chance(struct model *m, unsigned per_mille)
{
	return rnd(m, 1000) < per_mille;
}

static uint64_t round_up(uint64_t x, uint64_t to)
{
	return (x + to - 1) / to * to;
}

static struct tenant *ten(struct model *m, int t)
{
	return tenant_find(m->kv.tt, TNAME[t]);
}

static struct kv_sess *kv_find(struct kvstore *ks, uint64_t id)
{
	struct kv_sess *kv = ks->bucket[id & (N_BUCKETS - 1)];

	while (kv && kv->id != id)
		kv = kv->next;
	return kv;
}

static struct msess *msess_of(struct model *m, uint64_t id)
{
	for (uint32_t i = 0; i < MODEL_MAX; i++)
		if (m->s[i].used && m->s[i].id == id)
			return &m->s[i];
	return NULL;
}

static uint32_t n_records(struct model *m)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < MODEL_MAX; i++)
		n += m->s[i].used;
	return n;
}

static const struct ssnap *ssnap_of(const struct snap *sn, uint64_t id)
{
	for (uint32_t i = 0; i < sn->n; i++)
		if (sn->s[i].id == id)
			return &sn->s[i];
	return NULL;
}

static void msess_drop(struct msess *ms)
{
	for (uint32_t l = 0; l < MAX_LAYERS; l++) {
		struct mlayer *L = &ms->layer[l];
		for (uint32_t i = 0; i < L->cap; i++)
			free(L->shadow[i]);
		free(L->shadow);
		tq_codec_free(L->kc);
		tq_codec_free(L->vc);
	}
	memset(ms, 0, sizeof(*ms));
}

/* The model's side of an eviction: the record stays, the data goes. */
static void msess_evicted(struct msess *ms)
{
	uint64_t id = ms->id;
	int t = ms->tenant;
	struct session_geom g = ms->g;

	msess_drop(ms);
	ms->used = true;
	ms->evicted = true;
	ms->id = id;
	ms->tenant = t;
	ms->g = g;
}

/* ---- checks after every step ----------------------------------------------------- */

/* Walk everything; check the accounting; fill sn. */
static void snap_take(struct model *m, struct snap *sn)
{
	static struct session_info si[MODEL_MAX];
	size_t n = 0;
	uint64_t t_used[N_TEN] = { 0 }, t_spilled[N_TEN] = { 0 }, t_sess[N_TEN] = { 0 };
	uint64_t all_held = 0, all_slots = 0, all_pages = 0, all_spilled = 0;
	uint32_t kv_count = 0;
	struct spill_stats ss;
	struct kvstore_stats ks;

	memset(sn, 0, sizeof(*sn));
	m->snapped = true;
	if (++m->stamp == 0) {
		memset(m->page_stamp, 0, POOL_PAGES * sizeof(*m->page_stamp));
		memset(m->slot_stamp, 0, SPILL_SLOTS * sizeof(*m->slot_stamp));
		m->stamp = 1;
	}
	for (uint32_t i = 0; i < m->n_ballast; i++)
		m->slot_stamp[m->ballast[i]] = m->stamp;
	for (int t = 0; t < N_TEN; t++) {
		struct tenant_info ti;
		tenant_get_info(ten(m, t), &ti);
		sn->t[t] = (struct tsnap){ ti.used, ti.spilled, ti.limit, ti.guaranteed, ti.sessions, ti.priority,
					   ti.pressure };
		CHECK(ti.limit == m->limit[t] && ti.guaranteed == m->guar[t] && ti.priority == m->prio[t],
		      "tenant %s: budget %" PRIu64 "/%" PRIu64 " priority %d, expected %" PRIu64 "/%" PRIu64 " %d",
		      TNAME[t], ti.limit, ti.guaranteed, ti.priority, m->limit[t], m->guar[t], m->prio[t]);
	}
	/* the model's sessions one by one (session_list, which sorts a copy of
	 * the table, every 64th step: the tenants' session counts catch a
	 * session the model does not know in between) */
	for (uint32_t i = 0; i < MODEL_MAX; i++) {
		if (!m->s[i].used)
			continue;
		int e = session_get_info(m->kv.st, m->s[i].id, &si[n]);
		CHECK(e == 0, "session %" PRIu64 ": session_get_info %d", m->s[i].id, e);
		n++;
	}
	if (m->check_all || m->step % 64 == 0 || m->step >= m->n_steps) {
		struct session_info *all = NULL;
		size_t n_all = 0;
		CHECK(session_list(m->kv.st, NULL, &all, &n_all) == 0, "session_list");
		CHECK(n_all == n, "%zu sessions listed, the model has %zu", n_all, n);
		for (size_t i = 0; i < n_all; i++)
			CHECK(msess_of(m, all[i].id) != NULL, "session %" PRIu64 " is not in the model", all[i].id);
		free(all);
	}
	for (size_t i = 0; i < n; i++) {
		struct msess *ms = msess_of(m, si[i].id);
		struct ssnap *s = &sn->s[sn->n++];
		CHECK(ms != NULL, "session %" PRIu64 " is not in the model", si[i].id);
		CHECK(strcmp(si[i].tenant, TNAME[ms->tenant]) == 0, "session %" PRIu64 ": tenant %s", si[i].id,
		      si[i].tenant);
		if (!ms->evicted && si[i].state == SESSION_EVICTED) {
			/* evicted by this step (pool.pressure_action = evict) */
			CHECK(si[i].evict_reason == TQKV_EVICT_PRESSURE, "session %" PRIu64 " evicted, reason %u",
			      si[i].id, si[i].evict_reason);
			sn->evicted_now[sn->n_evicted_now++] = si[i].id;
			msess_evicted(ms);
		}
		CHECK(si[i].state == (ms->evicted ? SESSION_EVICTED : SESSION_OPEN), "session %" PRIu64 " state %d",
		      si[i].id, si[i].state);
		*s = (struct ssnap){ .id = si[i].id, .tenant = ms->tenant, .resident = si[i].resident_bytes,
				     .spilled = si[i].spilled_bytes, .last_access = si[i].last_access_ms,
				     .open = !ms->evicted };
		t_used[ms->tenant] += si[i].resident_bytes;
		t_spilled[ms->tenant] += si[i].spilled_bytes;
		t_sess[ms->tenant]++;

		struct kv_sess *kv = kv_find(m->kv.ks, ms->id);
		uint64_t max_tok = 0;
		for (uint32_t l = 0; l < ms->g.n_layers && !ms->evicted; l++)
			max_tok = ms->layer[l].n_tokens > max_tok ? ms->layer[l].n_tokens : max_tok;
		CHECK(ms->evicted || si[i].tokens == max_tok, "session %" PRIu64 ": %" PRIu64 " tokens, the model %" PRIu64, ms->id,
		      si[i].tokens, max_tok);
		if (!kv) {
			/* no KV state: never used, or evicted (its memory given back) */
			CHECK(si[i].resident_bytes == 0 && si[i].spilled_bytes == 0,
			      "session %" PRIu64 " without KV state holds %" PRIu64 "+%" PRIu64 " bytes", ms->id,
			      si[i].resident_bytes, si[i].spilled_bytes);
			continue;
		}
		CHECK(!ms->evicted, "evicted session %" PRIu64 " still has KV state (leak)", ms->id);
		kv_count++;
		uint64_t res = 0, reading = 0, spilled = 0, pages = 0;
		for (uint32_t l = 0; l < kv->n_layers; l++) {
			struct kv_layer *L = &kv->layer[l];
			uint32_t r_l = 0, out_l = 0;
			CHECK(L->n_tokens == ms->layer[l].n_tokens, "session %" PRIu64 " layer %u: %u tokens, the model %u",
			      ms->id, l, L->n_tokens, ms->layer[l].n_tokens);
			CHECK(L->n_pages == tq_page_count(&kv->geom, L->n_tokens), "session %" PRIu64 " layer %u: %u pages "
			      "for %u tokens", ms->id, l, L->n_pages, L->n_tokens);
			for (uint32_t p = 0; p < L->n_pages; p++) {
				struct kv_page_meta *pm = &L->meta[p];
				switch (pm->state) {
				case PG_RESIDENT: {
					uint64_t off = (uint64_t)(L->pages[p] - m->pool_base);
					CHECK(L->pages[p] && L->pages[p] >= m->pool_base && off % PAGE == 0 &&
					      off / PAGE < POOL_PAGES, "session %" PRIu64 " layer %u page %u: %p is not a "
					      "pool page", ms->id, l, p, (void *)L->pages[p]);
					CHECK(m->page_stamp[off / PAGE] != m->stamp, "pool page %" PRIu64 " held twice "
					      "(session %" PRIu64 " layer %u page %u)", off / PAGE, ms->id, l, p);
					m->page_stamp[off / PAGE] = m->stamp;
					CHECK(!pm->clean, "a clean copy of a non-persistent page");
					res++;
					break;
				}
				case PG_SPILLED:
				case PG_READING:
					CHECK(pm->slot < SPILL_SLOTS && m->slot_stamp[pm->slot] != m->stamp,
					      "spill slot %" PRIu64 " out of range or held twice (session %" PRIu64
					      " layer %u page %u)", pm->slot, ms->id, l, p);
					m->slot_stamp[pm->slot] = m->stamp;
					if (pm->state == PG_READING)
						reading++, r_l++;
					else
						spilled++;
					out_l++;
					break;
				default:
					CHECK(0, "session %" PRIu64 " layer %u page %u in state %u between steps", ms->id, l, p,
					      pm->state);
				}
			}
			CHECK(L->n_out == out_l, "layer %u: n_out %u, %u pages out", l, L->n_out, out_l);
			CHECK((L->ra != NULL) == (r_l > 0), "layer %u: read-ahead %p with %u pages reading", l,
			      (void *)L->ra, r_l);
			pages += L->n_pages;
		}
		CHECK(kv->n_pages == pages && kv->n_spilled == spilled + reading && kv->max_len == max_tok,
		      "session %" PRIu64 ": n_pages %" PRIu64 " (%" PRIu64 "), n_spilled %" PRIu64 " (%" PRIu64 ")",
		      ms->id, kv->n_pages, pages, kv->n_spilled, spilled + reading);
		CHECK(si[i].resident_bytes == (res + reading) * PAGE && si[i].spilled_bytes == spilled * PAGE,
		      "session %" PRIu64 ": resident %" PRIu64 " spilled %" PRIu64 " bytes, pages: %" PRIu64
		      " resident + %" PRIu64 " reading, %" PRIu64 " spilled", ms->id, si[i].resident_bytes,
		      si[i].spilled_bytes, res, reading, spilled);
		s->res_pages = (uint32_t)res;
		s->reading = (uint32_t)reading;
		all_held += res + reading;
		all_slots += spilled + reading;
		all_pages += pages;
		all_spilled += spilled + reading;
	}
	CHECK(m->kv.ks->n == kv_count, "%u sessions have KV state, %u open ones found (leak)", m->kv.ks->n, kv_count);
	for (int t = 0; t < N_TEN; t++) {
		struct tsnap *ts = &sn->t[t];
		CHECK(ts->used == t_used[t], "tenant %s: used %" PRIu64 " != its sessions' resident bytes %" PRIu64,
		      TNAME[t], ts->used, t_used[t]);
		CHECK(ts->spilled == t_spilled[t], "tenant %s: spilled %" PRIu64 " != its sessions' %" PRIu64, TNAME[t],
		      ts->spilled, t_spilled[t]);
		CHECK(ts->sessions == t_sess[t], "tenant %s: %" PRIu64 " sessions, %" PRIu64 " listed", TNAME[t],
		      ts->sessions, t_sess[t]);
		if (ts->used <= ts->limit)
			m->over[t] = false;
		CHECK(ts->used <= ts->limit || (m->over[t] && ts->used <= m->over_used[t]),
		      "tenant %s: used %" PRIu64 " above its limit %" PRIu64 "%s", TNAME[t], ts->used, ts->limit,
		      m->over[t] ? " and growing" : "");
	}
	CHECK(m->guar[0] + m->guar[1] + m->guar[2] + m->guar[3] <= POOL_BYTES, "guarantees exceed the pool");
	sn->pool_used = (uint64_t)(POOL_PAGES - pool_pages_free_count(m->kv.pool)) * PAGE;
	CHECK(sn->pool_used == all_held * PAGE, "pool: %" PRIu64 " pages in use, sessions hold %" PRIu64,
	      sn->pool_used / PAGE, all_held);
	/* the store's own count: spill_stats sorts its latency samples, too
	 * slow for every step (~50 us): every 64th step (every step with
	 * TQ_MODEL_CHECK_ALL=1, to pin a leak to its step); the rules that
	 * depend on the tier's fill use the count of the walk */
	all_slots += m->n_ballast;
	sn->slots_used = all_slots;
	sn->slots_total = m->slots_total;
	if (m->check_all || m->step % 64 == 0 || m->step >= m->n_steps) {
		spill_stats(m->kv.sp, &ss);
		CHECK(ss.slots_used == all_slots, "spill: %" PRIu64 " slots in use, sessions hold %" PRIu64 " (a slot "
		      "leaked or was freed in steps %" PRIu64 "..%" PRIu64 ")", ss.slots_used, all_slots,
		      m->check_all ? m->step : m->step >= 64 ? m->step - 64 : 0, m->step);
		CHECK(ss.crc_failures == 0 && ss.io_errors == 0, "spill: %" PRIu64 " crc failures, %" PRIu64
		      " I/O errors", ss.crc_failures, ss.io_errors);
	}
	if (m->check_all || m->step % 8 == 0 || m->step >= m->n_steps)
		kvstore_stats(m->kv.ks, &ks);
	else
		ks = (struct kvstore_stats){ kv_count, all_pages, all_spilled, 0 };
	CHECK(ks.sessions == kv_count && ks.pages == all_pages && ks.spilled_pages == all_spilled,
	      "kvstore_stats: %u sessions %" PRIu64 " pages %" PRIu64 " spilled", ks.sessions, ks.pages,
	      ks.spilled_pages);
}

/* The tenants in words, for failure messages. */
static const char *tenants_str(const struct snap *sn)
{
	static char buf[1024];
	int n = 0;

	for (int t = 0; t < N_TEN; t++) {
		uint32_t reading = 0;
		for (uint32_t i = 0; i < sn->n; i++)
			reading += sn->s[i].tenant == t ? sn->s[i].reading : 0;
		n += snprintf(buf + n, sizeof(buf) - (size_t)n, "%s%s: used %" PRIu64 " pages (%u read ahead), "
			      "guarantee %.2f, limit %.2f, priority %d", t ? "; " : "", TNAME[t], sn->t[t].used / PAGE,
			      reading, (double)sn->t[t].guar / PAGE, (double)sn->t[t].limit / PAGE, sn->t[t].prio);
	}
	return buf;
}

/* Is tenant t (other than the requester) out of pages it could give up:
 * less than a whole page above its guarantee?  (Read-ahead pages count:
 * they are charged pool pages nobody is using.) */
static bool exhausted(const struct snap *sn, int t)
{
	return sn->t[t].used < sn->t[t].guar + PAGE;
}

/* The requester's own tenant: also out when only the requesting session
 * holds its pages. */
static bool exhausted_self(struct model *m, const struct snap *sn, int t, uint64_t req)
{
	uint64_t others = 0;

	for (uint32_t i = 0; i < sn->n; i++)
		if (sn->s[i].tenant == t && sn->s[i].id != req)
			others += sn->s[i].resident;
	(void)m;
	return exhausted(sn, t) || others == 0;
}

static bool tier_full(const struct snap *sn)
{
	return sn->slots_used == sn->slots_total;
}

static void check_order(struct model *m, const uint64_t *spilled_by, int rt);

/* Could a spill of this step have found the tier full: did it spill more
 * pages than there were free slots before it?  (Nothing else takes slots;
 * restores and collected read-aheads give some back.) */
static bool tier_could_fill(struct model *m)
{
	uint64_t spilled = 0;

	for (int u = 0; u < N_TEN; u++)
		spilled += (m->post.t[u].pr.spilled_bytes - m->pre.t[u].pr.spilled_bytes) / PAGE;
	return m->pre.slots_total - m->pre.slots_used < spilled;
}
static const char *tenants_str(const struct snap *sn);

/* Spills a step made: by admission (requester req of tenant rt) or a
 * reclaim pass (req = 0, rt = -1).  See the header for the rules. */
static void check_spills(struct model *m, uint64_t req, int rt)
{
	const struct snap *a = &m->pre, *b = &m->post;

	for (int u = 0; u < N_TEN; u++) {
		uint64_t d = b->t[u].pr.spilled_bytes - a->t[u].pr.spilled_bytes;
		uint64_t ev = b->t[u].pr.evictions - a->t[u].pr.evictions;
		if (u == rt)
			continue;
		/* at or under its guarantee: never spilled, never evicted */
		CHECK(a->t[u].used > a->t[u].guar || (d == 0 && ev == 0),
		      "tenant %s (used %" PRIu64 " <= guarantee %" PRIu64 ") lost %" PRIu64 " bytes to spilling, "
		      "%" PRIu64 " sessions to eviction", TNAME[u], a->t[u].used, a->t[u].guar, d, ev);
		/* never below it by spilling or eviction (a limit that is no multiple of the
		 * page size wins: whole pages go until the tenant is under it) */
		uint64_t floor = a->t[u].used < a->t[u].guar ? a->t[u].used : a->t[u].guar;
		floor = floor < a->t[u].limit / PAGE * PAGE ? floor : a->t[u].limit / PAGE * PAGE;
		/* (an eviction may, when nothing fits the victim's excess and
		 * the requester's tenant is within its own guarantee) */
		const bool for_guarantee = ev && rt >= 0 && a->t[rt].used <= a->t[rt].guar;
		CHECK(for_guarantee || b->t[u].used >= floor, "tenant %s spilled or evicted below its guarantee: %" PRIu64 " -> %" PRIu64
		      " (guarantee %" PRIu64 ", limit %" PRIu64 ")", TNAME[u], a->t[u].used, b->t[u].used, a->t[u].guar,
		      a->t[u].limit);
		/* a requester above its guarantee never takes from a higher priority */
		if (rt >= 0 && a->t[rt].used > a->t[rt].guar)
			CHECK(a->t[u].prio <= a->t[rt].prio || (d == 0 && ev == 0),
			      "tenant %s (priority %d, above its guarantee) took %" PRIu64 " bytes / %" PRIu64 " sessions "
			      "from %s (priority %d)", TNAME[rt], a->t[rt].prio, d, ev, TNAME[u], a->t[u].prio);
	}
	/* least recently used sessions first, within a tenant */
	for (uint32_t i = 0; i < b->n; i++) {
		const struct ssnap *sb = &b->s[i], *pb = ssnap_of(a, sb->id);
		if (!pb || sb->id == req || !sb->open || sb->spilled <= pb->spilled)
			continue;
		for (uint32_t j = 0; j < b->n; j++) {
			const struct ssnap *sa = &b->s[j], *pa = ssnap_of(a, sa->id);
			if (!pa || sa->tenant != sb->tenant || sa->id == req || !sa->open || sa->id == sb->id)
				continue;
			bool older = pa->last_access < pb->last_access || (pa->last_access == pb->last_access &&
									      pa->id < pb->id);
			/* unless the tier may have filled up on the older one, and the
			 * newer one's read-ahead, collected before it was spilled,
			 * gave slots back */
			CHECK(!older || sa->resident == 0 || (tier_could_fill(m) && pb->reading),
			      "session %" PRIu64 " (last used %" PRIu64 ") was spilled while the older session %" PRIu64
			      " (last used %" PRIu64 ") of tenant %s kept %" PRIu64 " resident bytes (%u pages read "
			      "ahead; the newer one had %u, %" PRIu64 " slots free)", sb->id, pb->last_access, sa->id,
			      pa->last_access, TNAME[sa->tenant], sa->resident, sa->reading, pb->reading,
			      b->slots_total - b->slots_used);
		}
	}
	/* admission's order: lower priorities first */
	if (rt >= 0) {
		uint64_t by[N_TEN];
		for (int u = 0; u < N_TEN; u++)
			by[u] = b->t[u].pr.spilled_bytes - a->t[u].pr.spilled_bytes;
		check_order(m, by, rt);
	}
	/* evictions: only under pool.pressure_action = evict, never the requester */
	for (uint32_t i = 0; i < b->n_evicted_now; i++) {
		CHECK(m->rp.pressure_action == CONFIG_PRESSURE_EVICT && rt >= 0 && b->evicted_now[i] != req,
		      "session %" PRIu64 " evicted by pressure (action %d, requester %" PRIu64 ")", b->evicted_now[i],
		      m->rp.pressure_action, req);
		m->pressure_evictions++;
	}
}

/* Steps that must not spill or evict anything. */
static void check_no_spills(struct model *m)
{
	for (int u = 0; u < N_TEN; u++)
		CHECK(m->post.t[u].pr.spilled_bytes == m->pre.t[u].pr.spilled_bytes &&
		      m->post.t[u].pr.evictions == m->pre.t[u].pr.evictions, "tenant %s: spilled or evicted by a %s",
		      TNAME[u], m->desc);
	CHECK(m->post.n_evicted_now == 0, "a session was evicted by pressure");
}

/* Admission's order: a tenant was spilled only once every lower-priority
 * tenant (not the requester's) was out of whole pages above its
 * guarantee. */
static void check_order(struct model *m, const uint64_t *spilled_by, int rt)
{
	for (int x = 0; x < N_TEN; x++) {
		if (x == rt || !spilled_by[x])
			continue;
		/* the tier filled up on a lower one, and x's read-ahead,
		 * collected before it was spilled, gave slots back */
		uint32_t x_reading = 0;
		for (uint32_t i = 0; i < m->pre.n; i++)
			x_reading += m->pre.s[i].tenant == x ? m->pre.s[i].reading : 0;
		if (tier_could_fill(m) && x_reading)
			continue;
		for (int l = 0; l < N_TEN; l++) {
			if (l == rt || l == x || m->post.t[l].prio >= m->post.t[x].prio)
				continue;
			CHECK(exhausted(&m->post, l), "tenant %s (priority %d) was spilled (%" PRIu64 " bytes) while %s "
			      "(priority %d) still holds %" PRIu64 " bytes above its guarantee %" PRIu64 "; before: %s",
			      TNAME[x], m->post.t[x].prio, spilled_by[x], TNAME[l], m->post.t[l].prio,
			      m->post.t[l].used - m->post.t[l].guar, m->post.t[l].guar, tenants_str(&m->pre));
		}
	}
}

/* A POOL_FULL for session req of tenant rt that asked for n_pages: allowed
 * only when nothing the requester may take from holds a whole page above
 * its guarantee (reclaim.h's admission), or the tier is full and
 * pressure_action = fail.  The state after the step is the state at the
 * refusal for everyone but the requester, whose request was uncharged. */
static void check_refusal(struct model *m, uint64_t req, int rt, uint64_t n_pages)
{
	const struct snap *b = &m->post;
	bool within = b->t[rt].used + n_pages * PAGE <= b->t[rt].guar;

	if (within)
		m->within_refusals++;
	if (tier_full(b) && m->rp.pressure_action == CONFIG_PRESSURE_FAIL)
		return;
	for (int u = 0; u < N_TEN; u++) {
		bool eligible = u == rt ? !within : within || b->t[u].prio <= b->t[rt].prio;
		if (!eligible)
			continue;
		bool out = u == rt ? exhausted_self(m, b, u, req) : exhausted(b, u);
		CHECK(out, "tenant %s (priority %d, %s its guarantee: used %" PRIu64 " + %" PRIu64 " asked, guarantee "
		      "%" PRIu64 ") was refused a page while tenant %s (priority %d) holds %" PRIu64 " bytes above its "
		      "guarantee %" PRIu64 " (tier %" PRIu64 "/%" PRIu64 " slots, action %s)", TNAME[rt], b->t[rt].prio,
		      within ? "within" : "above", b->t[rt].used, n_pages * PAGE, b->t[rt].guar, TNAME[u],
		      b->t[u].prio, b->t[u].used - b->t[u].guar, b->t[u].guar, b->slots_used, b->slots_total,
		      m->rp.pressure_action == CONFIG_PRESSURE_EVICT ? "evict" : "fail");
	}
}

/* A TENANT_LIMIT for session req of tenant rt that asked for `bytes`:
 * allowed only when its other sessions hold less than the charge would
 * take the tenant over its limit (reclaim_charge spills them, least
 * recently used first, for admission_wait, before it refuses), or the
 * tier is full. */
static void check_limit_refusal(struct model *m, uint64_t req, int rt, uint64_t bytes)
{
	const struct snap *b = &m->post;
	uint64_t others = 0, over = b->t[rt].used + bytes - b->t[rt].limit;

	for (uint32_t i = 0; i < b->n; i++)
		if (b->s[i].tenant == rt && b->s[i].id != req)
			others += b->s[i].resident;
	if (others >= over)
		m->limit_refusals_tier++;
	CHECK(others < over || tier_full(b) || tier_could_fill(m), "tenant %s refused %" PRIu64 " bytes at its "
	      "limit %" PRIu64 " (used %" PRIu64 ") while its other sessions held %" PRIu64 " resident bytes (tier "
	      "%" PRIu64 "/%" PRIu64 " slots)", TNAME[rt], bytes, b->t[rt].limit, b->t[rt].used, others,
	      b->slots_used, b->slots_total);
}

/* Compare the committed token blocks of page p of layer l with the model's. */
static void page_compare(struct model *m, struct msess *ms, struct kv_sess *kv, uint32_t l, uint32_t p)
{
	const struct tq_page_geom *g = &kv->geom;
	struct mlayer *ML = &ms->layer[l];
	const uint8_t *want = ML->shadow[p];
	uint32_t first = p * g->page_tokens;
	static uint8_t real[PAGE];
	char why[256];

	/* through the pool: its pages may not be host memory (devsim) */
	CHECK(pool_copy(m->kv.pool, real, kv->layer[l].pages[p], PAGE, why, sizeof(why)) == 0,
	      "session %" PRIu64 " layer %u page %u: copy: %s", ms->id, l, p, why);
	uint32_t nt = ML->n_tokens - first < g->page_tokens ? ML->n_tokens - first : g->page_tokens;

	for (uint32_t h = 0; h < g->n_kv_heads; h++) {
		uint64_t ko = tq_page_k_off(g, h, 0), vo = tq_page_v_off(g, h, 0);
		CHECK(memcmp(real + ko, want + ko, (size_t)nt * g->k_block_bytes) == 0 &&
		      memcmp(real + vo, want + vo, (size_t)nt * g->v_block_bytes) == 0,
		      "session %" PRIu64 " layer %u page %u (tokens %u..%u) head %u: bytes differ from the model's",
		      ms->id, l, p, first, first + nt - 1, h);
	}
	m->pages_compared++;
}

/* The operated session's state before the step: which pages were out. */
/* A data-path operation of session ms answered r (check_counted checks
 * the tenants' refusal counters against it after the step). */
static void answered(struct model *m, const struct msess *ms, const struct dataop_res *r)
{
	m->ans_tenant = ms->tenant;
	m->ans_status = r->status;
}

/* The step's POOL_FULL is counted once in its tenant's refusals, its
 * TENANT_LIMIT once in limit_refusals, and nothing else is (a waiter
 * evicted meanwhile answers EVICTED: no refusal; this model's prefetch
 * answers only OK, TENANT_LIMIT or POOL_FULL, so its later layers never
 * meet the limit after another failure). */
static void check_counted(struct model *m)
{
	for (int u = 0; u < N_TEN; u++) {
		const struct tenant_pressure *a = &m->pre.t[u].pr, *b = &m->post.t[u].pr;
		bool mine = u == m->ans_tenant;
		uint64_t want_full = mine && m->ans_status == TQKV_ST_POOL_FULL;
		uint64_t want_limit = mine && m->ans_status == TQKV_ST_TENANT_LIMIT;
		CHECK(b->refusals - a->refusals == want_full && b->limit_refusals - a->limit_refusals == want_limit,
		      "tenant %s: refusals +%" PRIu64 ", limit_refusals +%" PRIu64 " for a step that answered %s",
		      TNAME[u], b->refusals - a->refusals, b->limit_refusals - a->limit_refusals,
		      m->ans_tenant < 0 ? "nothing" : tqkv_status_str(m->ans_status));
	}
}

static void pre_states(struct model *m, struct msess *ms)
{
	struct kv_sess *kv = ms && !ms->evicted ? kv_find(m->kv.ks, ms->id) : NULL;

	for (uint32_t l = 0; l < MAX_LAYERS; l++) {
		m->pre_pages[l] = 0;
		if (!kv || l >= kv->n_layers)
			continue;
		struct kv_layer *L = &kv->layer[l];
		free(m->pre_state[l]);
		m->pre_state[l] = malloc(L->n_pages + 1);
		CHECK(m->pre_state[l] != NULL, "out of memory");
		for (uint32_t p = 0; p < L->n_pages; p++)
			m->pre_state[l][p] = L->meta[p].state;
		m->pre_pages[l] = L->n_pages;
	}
}

/* After a step on ms: every page that came back, every page written from
 * `from_page[l]` on, and (all = true) every resident page. */
static void compare_session(struct model *m, struct msess *ms, const uint32_t *from_page, bool all)
{
	struct kv_sess *kv;

	if (!ms || ms->evicted || !(kv = kv_find(m->kv.ks, ms->id)))
		return;
	for (uint32_t l = 0; l < kv->n_layers; l++) {
		struct kv_layer *L = &kv->layer[l];
		for (uint32_t p = 0; p < L->n_pages; p++) {
			if (L->meta[p].state != PG_RESIDENT)
				continue;
			bool back = p < m->pre_pages[l] && m->pre_state[l][p] != PG_RESIDENT;
			if (all || back || (from_page && p >= from_page[l]) || p >= m->pre_pages[l])
				page_compare(m, ms, kv, l, p);
		}
	}
}

static void sweep(struct model *m)
{
	for (uint32_t i = 0; i < MAX_LAYERS; i++)
		m->pre_pages[i] = 0;
	for (uint32_t i = 0; i < MODEL_MAX; i++)
		if (m->s[i].used)
			compare_session(m, &m->s[i], NULL, true);
}

/* ---- inputs and the model's encoding ------------------------------------------------ */

static enum tq_dtype pick_dtype(struct model *m)
{
	uint64_t r = rnd(m, 10);
	return r < 8 ? TQ_DTYPE_F32 : r == 8 ? TQ_DTYPE_F16 : TQ_DTYPE_BF16;
}

/* Random values in [-1, 1) in each dtype, made once: a step's inputs are
 * windows of them at random offsets. */
static void inputs_new(struct model *m)
{
	uint64_t x = m->seed | 1;

	for (int d = 0; d < 3; d++) {
		m->in[d] = malloc((size_t)IN_POOL * (d ? 2 : 4));
		CHECK(m->in[d] != NULL, "out of memory");
	}
	for (uint32_t i = 0; i < IN_POOL; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		float f = (float)((int64_t)(x >> 40) - (1 << 23)) / (float)(1 << 23);
		((float *)m->in[TQ_DTYPE_F32])[i] = f;
		((uint16_t *)m->in[TQ_DTYPE_F16])[i] = tq_f32_to_f16(f);
		((uint16_t *)m->in[TQ_DTYPE_BF16])[i] = tq_f32_to_bf16(f);
	}
}

/* n tokens of K and V for ms ([n][n_kv][dim] of dtype) in m->kp, m->vp;
 * nan_at: a token whose first K value is NaN (or -1). */
static void gen_kv(struct model *m, struct msess *ms, uint32_t n, enum tq_dtype dt, int64_t nan_at)
{
	size_t row = (size_t)ms->g.n_kv_heads * ms->g.head_dim, cnt = (size_t)n * row, es = tq_dtype_size(dt);
	const uint8_t *base = m->in[dt];

	m->kp = base + rnd(m, IN_POOL - cnt + 1) * es;
	m->vp = base + rnd(m, IN_POOL - cnt + 1) * es;
	if (nan_at >= 0) {
		memcpy(m->k, m->kp, cnt * es);
		if (dt == TQ_DTYPE_F32)
			((float *)m->k)[nan_at * row] = __builtin_nanf("");
		else
			((uint16_t *)m->k)[nan_at * row] = dt == TQ_DTYPE_F16 ? 0x7e00 : 0x7fc0;
		m->kp = m->k;
	}
}

/* The model's copy of an append of n tokens to layer l (inputs in m->kp/vp). */
static void model_append(struct model *m, struct msess *ms, uint32_t l, uint32_t n, enum tq_dtype dt)
{
	struct mlayer *L = &ms->layer[l];
	const struct tq_page_geom *g = &ms->pg;
	size_t row = (size_t)ms->g.head_dim * tq_dtype_size(dt);
	uint32_t need = tq_page_count(g, L->n_tokens + n);
	tq_error te;

	if (need > L->cap) {
		uint32_t cap = L->cap ? L->cap : 4;
		while (cap < need)
			cap *= 2;
		L->shadow = realloc(L->shadow, cap * sizeof(*L->shadow));
		CHECK(L->shadow != NULL, "out of memory");
		for (uint32_t i = L->cap; i < cap; i++) {
			L->shadow[i] = aligned_alloc(TQ_PAGE_ALIGN, PAGE);
			CHECK(L->shadow[i] != NULL, "out of memory");
			memset(L->shadow[i], 0, PAGE);
		}
		L->cap = cap;
	}
	for (uint32_t t = 0; t < n; t++) {
		uint32_t p = L->n_tokens + t;
		uint8_t *page = L->shadow[p / g->page_tokens];
		uint32_t slot = p % g->page_tokens;
		const uint8_t *kr = (const uint8_t *)m->kp + (size_t)t * g->n_kv_heads * row;
		const uint8_t *vr = (const uint8_t *)m->vp + (size_t)t * g->n_kv_heads * row;
		for (uint32_t h = 0; h < g->n_kv_heads; h++) {
			CHECK(tq_encode(L->kc, kr + h * row, dt, 1, page + tq_page_k_off(g, h, slot), &te) == 0 &&
			      tq_encode(L->vc, vr + h * row, dt, 1, page + tq_page_v_off(g, h, slot), &te) == 0,
			      "model encode: %s", te.msg);
		}
	}
	L->n_tokens += n;
}

/* ---- the steps ------------------------------------------------------------------- */

/* A random session record (open or evicted); NULL when there is none. */
static struct msess *pick_session(struct model *m)
{
	uint32_t n = n_records(m), k;

	if (!n)
		return NULL;
	k = (uint32_t)rnd(m, n);
	for (uint32_t i = 0; i < MODEL_MAX; i++)
		if (m->s[i].used && k-- == 0)
			return &m->s[i];
	return NULL;
}

static const enum tq_codec_id CODECS[] = { TQ_CODEC_F16, TQ_CODEC_Q8, TQ_CODEC_Q4A, TQ_CODEC_TQ2,
					   TQ_CODEC_TQ3, TQ_CODEC_TQ4, TQ_CODEC_F32 };

static void step_open(struct model *m)
{
	struct session_geom g = { 0 }; /* kv_xform 0: the model keeps no transforms */
	struct session_info si;
	char why[256];
	tq_error te;
	int t = (int)rnd(m, N_TEN);
	uint64_t seed = rnd64(m);
	static const uint32_t dims[] = { 8, 16, 32 };

	g.n_layers = 1 + (uint32_t)rnd(m, MAX_LAYERS);
	g.n_layers = g.n_layers < 2 && chance(m, 500) ? 2 : g.n_layers; /* read-ahead needs two */
	g.n_kv_heads = 1 + (uint32_t)rnd(m, MAX_KV);
	g.n_q_heads = g.n_kv_heads * (1 + (uint32_t)rnd(m, 2));
	g.head_dim = dims[rnd(m, 3)];
	g.k_codec = CODECS[rnd(m, sizeof(CODECS) / sizeof(CODECS[0]))];
	g.v_codec = CODECS[rnd(m, sizeof(CODECS) / sizeof(CODECS[0]))];
	uint64_t bpt = (uint64_t)g.n_layers * g.n_kv_heads *
		       (uint64_t)(tq_block_bytes(g.k_codec, (int)g.head_dim, &te) +
				  tq_block_bytes(g.v_codec, (int)g.head_dim, &te));
	uint64_t fit = m->limit[t] / bpt;
	/* sizes: mostly small sessions, some large ones, a few that cannot fit */
	if (chance(m, 30))
		g.max_tokens = fit + 1 + rnd(m, 100);
	else
		g.max_tokens = 16 + rnd(m, (chance(m, 500) ? MAX_TOK / 4 : MAX_TOK) - 16);
	if (g.max_tokens <= MAX_TOK && g.max_tokens > fit)
		g.max_tokens = fit;
	snprintf(m->desc, sizeof(m->desc), "open tenant %s: %u layers, %u/%u heads, dim %u, %s/%s, max_tokens %" PRIu64
		 " (%" PRIu64 " bytes/token, limit %" PRIu64 ")", TNAME[t], g.n_layers, g.n_kv_heads, g.n_q_heads,
		 g.head_dim, tq_codec_name(g.k_codec), tq_codec_name(g.v_codec), g.max_tokens, bpt, m->limit[t]);
	int want = g.max_tokens * bpt > m->limit[t] ? -ENOSPC : n_records(m) >= MAX_SESS ? -EUSERS : 0;
	int r = session_open(m->kv.st, ten(m, t), "", 1000, &g, seed, 0, ++m->now, &si, why, sizeof(why));
	CHECK(r == want, "session_open: %d (%s), expected %d", r, why, want);
	if (r < 0) {
		m->ctl_fail[OP_OPEN]++;
		return; /* checked by the loop */
	}
	struct msess *ms = NULL;
	for (uint32_t i = 0; i < MODEL_MAX && !ms; i++)
		if (!m->s[i].used)
			ms = &m->s[i];
	CHECK(ms != NULL, "model full");
	memset(ms, 0, sizeof(*ms));
	ms->used = true;
	ms->id = si.id;
	ms->tenant = t;
	ms->g = g;
	ms->seed = seed;
	ms->max_len = g.max_tokens < INT32_MAX ? g.max_tokens : INT32_MAX;
	int pt = dataop_page_tokens(PAGE, pool_page_tokens_align(m->kv.pool), &g);
	CHECK(pt > 0, "page tokens %d", pt);
	ms->pg = (struct tq_page_geom){ g.n_kv_heads, (uint32_t)pt,
					(uint32_t)tq_block_bytes(g.k_codec, (int)g.head_dim, &te),
					(uint32_t)tq_block_bytes(g.v_codec, (int)g.head_dim, &te) };
	CHECK(tq_page_bytes(&ms->pg) <= PAGE, "page geometry");
	for (uint32_t l = 0; l < g.n_layers; l++) {
		struct tq_codec_params cp = { .id = g.k_codec, .dim = (int)g.head_dim,
					      .seed = tqkv_seed_derive(seed, l, 0), .isa = TQ_ISA_AUTO };
		CHECK(tq_codec_new(&ms->layer[l].kc, m->cache, &cp, &te) == 0, "codec: %s", te.msg);
		cp.id = g.v_codec;
		cp.seed = tqkv_seed_derive(seed, l, 1);
		CHECK(tq_codec_new(&ms->layer[l].vc, m->cache, &cp, &te) == 0, "codec: %s", te.msg);
	}
}

/* session_acquire for ms as a data operation would: 0 and *s, or the status
 * (checked against the model: NO_SESSION for a closed id, EVICTED). */
static int acquire(struct model *m, struct msess *ms, uint64_t id, uint64_t now, struct session **s)
{
	int e = session_acquire(m->kv.st, id, now, s);

	if (!ms) {
		CHECK(e == -ENOENT, "acquire of a closed session: %d", e);
		m->st_count[TQKV_ST_NO_SESSION]++;
		return -1;
	}
	if (ms->evicted) {
		CHECK(e == -ESTALE, "acquire of an evicted session: %d", e);
		m->st_count[TQKV_ST_EVICTED]++;
		return -1;
	}
	CHECK(e == 0, "acquire: %d", e);
	return 0;
}

/* A random open session; NULL when there is none. */
static struct msess *pick_open(struct model *m)
{
	uint32_t n = 0, k;

	for (uint32_t i = 0; i < MODEL_MAX; i++)
		n += m->s[i].used && !m->s[i].evicted;
	if (!n)
		return NULL;
	k = (uint32_t)rnd(m, n);
	for (uint32_t i = 0; i < MODEL_MAX; i++)
		if (m->s[i].used && !m->s[i].evicted && k-- == 0)
			return &m->s[i];
	return NULL;
}

/* A session for a data step: mostly open ones; sometimes any record (an
 * evicted one) or an id that is gone.  *id: the id to use. */
static struct msess *pick_data_session(struct model *m, uint64_t *id)
{
	struct msess *ms = NULL;

	/* locality: most steps go to a few hot sessions (the rest of the data
	 * cools down into the tier), the others anywhere */
	if (chance(m, 850)) {
		uint64_t h = m->hot[rnd(m, 4)];
		ms = h ? msess_of(m, h) : NULL;
		ms = ms && !ms->evicted ? ms : NULL;
	}
	if (!ms)
		ms = chance(m, 950) ? pick_open(m) : pick_session(m);

	if (!ms || chance(m, 5)) {
		*id = GONE_ID + rnd(m, 1000); /* never handed out here */
		return NULL;
	}
	*id = ms->id;
	return ms;
}

/* Checks of a failed or successful append (or attend with an append) of
 * n tokens to layer l of ms, which had old_len tokens. */
static void check_append_result(struct model *m, struct msess *ms, uint32_t l, uint32_t old_len, uint32_t n,
				int64_t nan_at, const struct dataop_res *r)
{
	struct kv_sess *kv = kv_find(m->kv.ks, ms->id);
	struct kv_layer *L = &kv->layer[l];
	const struct tsnap *t = &m->post.t[ms->tenant];
	uint32_t spilled_l = 0;
	uint64_t new_len = (uint64_t)old_len + n;

	for (uint32_t p = 0; p < L->n_pages; p++)
		spilled_l += L->meta[p].state == PG_SPILLED;
	uint64_t need = tq_page_count(&ms->pg, (uint32_t)(new_len < UINT32_MAX ? new_len : UINT32_MAX)) - L->n_pages;
	switch (r->status) {
	case TQKV_ST_OK:
		CHECK(new_len <= ms->max_len && nan_at < 0, "append of %u to %u tokens (max %" PRIu64 ", NaN at %" PRId64
		      ") succeeded", n, old_len, ms->max_len, nan_at);
		break;
	case TQKV_ST_MAX_TOKENS:
		CHECK(new_len > ms->max_len && spilled_l == 0, "MAX_TOKENS: %" PRIu64 " tokens of %" PRIu64 " (%u "
		      "pages still spilled)", new_len, ms->max_len, spilled_l);
		break;
	case TQKV_ST_TENANT_LIMIT:
		if (spilled_l)
			CHECK(t->used + spilled_l * PAGE > t->limit, "TENANT_LIMIT restoring %u pages: used %" PRIu64
			      " limit %" PRIu64, spilled_l, t->used, t->limit);
		else
			CHECK(new_len <= ms->max_len && t->used + need * PAGE > t->limit, "TENANT_LIMIT for %" PRIu64
			      " new pages: used %" PRIu64 " limit %" PRIu64, need, t->used, t->limit);
		check_limit_refusal(m, ms->id, ms->tenant, (spilled_l ? spilled_l : need) * PAGE);
		break;
	case TQKV_ST_POOL_FULL:
		CHECK(spilled_l || new_len <= ms->max_len, "POOL_FULL past max_tokens");
		check_refusal(m, ms->id, ms->tenant, spilled_l ? spilled_l : need);
		break;
	case TQKV_ST_NONFINITE:
		CHECK(nan_at >= 0 && r->detail == (uint32_t)nan_at && new_len <= ms->max_len && spilled_l == 0,
		      "NONFINITE detail %u (NaN at %" PRId64 ")", r->detail, nan_at);
		break;
	default:
		CHECK(0, "status %u (%s): %s", r->status, tqkv_status_str(r->status), r->msg);
	}
}

static void do_truncate(struct model *m, struct msess *ms, uint64_t id, uint32_t l, bool all, uint64_t pos,
			uint64_t len);

static void step_append(struct model *m)
{
	uint64_t id;
	struct msess *ms = pick_data_session(m, &id);
	struct session *s;
	struct dataop_res r;
	uint32_t l = ms ? (uint32_t)rnd(m, ms->g.n_layers) : 0, n;
	enum tq_dtype dt = pick_dtype(m);
	uint64_t room = ms && !ms->evicted ? ms->max_len - ms->layer[l].n_tokens : 0;
	uint32_t pt = ms && ms->pg.page_tokens ? ms->pg.page_tokens : 64;

	/* a full layer: mostly, the client drops its older half first (counted
	 * as a truncate) */
	if (ms && !ms->evicted && !room && chance(m, 850)) {
		m->ops[OP_APPEND]--;
		m->ops[OP_TRUNCATE]++;
		do_truncate(m, ms, id, l, false, ms->max_len / 2, ms->max_len);
		return;
	}
	/* phase 0 grows the sessions, 1 holds, 2 shrinks them */
	uint64_t r100 = rnd(m, 100);
	if (r100 < (m->phase == 0 ? 40u : 60u))
		n = 1 + (uint32_t)rnd(m, 16);
	else if (r100 < (m->phase == 0 ? 92u : 96u))
		n = 1 + (uint32_t)rnd(m, 2 * pt);
	else
		n = 1 + (uint32_t)rnd(m, 8 * pt);
	if (n > room && room && chance(m, 900))
		n = 1 + (uint32_t)rnd(m, room);
	if (chance(m, 30))
		n = (uint32_t)(room + 1 + rnd(m, 8)); /* past max_tokens */
	if (n > MAX_APPEND)
		n = MAX_APPEND;
	int64_t nan_at = chance(m, 10) ? (int64_t)rnd(m, n) : -1;
	bool bad_layer = ms && chance(m, 5);
	if (bad_layer)
		l = ms->g.n_layers;
	snprintf(m->desc, sizeof(m->desc), "append session %" PRIu64 "%s layer %u: %u tokens (%s), NaN at %" PRId64
		 ", layer length %u, max %" PRIu64, id, ms ? (ms->evicted ? " (evicted)" : "") : " (closed)", l, n,
		 tq_dtype_name(dt), nan_at, ms && !ms->evicted && !bad_layer ? ms->layer[l].n_tokens : 0,
		 ms ? ms->max_len : 0);
	pre_states(m, ms);
	if (acquire(m, ms, id, ++m->now, &s) < 0)
		return;
	gen_kv(m, ms, n, dt, nan_at);
	dataop_append(m->kv.ks, s, l, m->kp, m->vp, dt, n, &r);
	session_release(s);
	answered(m, ms, &r);
	m->st_count[r.status < TQKV_ST__COUNT ? r.status : TQKV_ST_INTERNAL]++;
	if (bad_layer) {
		CHECK(r.status == TQKV_ST_BAD_LAYER, "status %u for layer %u of %u", r.status, l, ms->g.n_layers);
		snap_take(m, &m->post);
		check_spills(m, ms->id, ms->tenant);
		return;
	}
	uint32_t from[MAX_LAYERS] = { 0 }, old_len = ms->layer[l].n_tokens;
	for (uint32_t i = 0; i < MAX_LAYERS; i++)
		from[i] = UINT32_MAX;
	if (r.status == TQKV_ST_OK) {
		from[l] = old_len / ms->pg.page_tokens; /* the pages written */
		model_append(m, ms, l, n, dt);
	}
	snap_take(m, &m->post);
	check_spills(m, ms->id, ms->tenant);
	if (!ms->evicted) {
		check_append_result(m, ms, l, old_len, n, nan_at, &r);
		compare_session(m, ms, from, false);
	}
}

static void step_attend(struct model *m)
{
	uint64_t id;
	struct msess *ms = pick_data_session(m, &id);
	struct session *s;
	struct dataop_res r;
	uint32_t l = ms ? (uint32_t)rnd(m, ms->g.n_layers) : 0;
	uint32_t n_app = chance(m, 200) ? 1 + (uint32_t)rnd(m, 8) : 0, n_q = chance(m, 800) ? 1 : 1 + (uint32_t)rnd(m, MAX_NQ);
	int32_t pos[MAX_NQ];
	uint64_t len = ms && !ms->evicted ? ms->layer[l].n_tokens : 0;
	bool bad_pos = chance(m, 10);

	if (ms && !ms->evicted && len + n_app > ms->max_len && chance(m, 800))
		n_app = 0;
	for (uint32_t i = 0; i < n_q; i++)
		pos[i] = len + n_app ? (int32_t)rnd(m, len + n_app) : 0;
	if (bad_pos || len + n_app == 0)
		pos[rnd(m, n_q)] = (int32_t)(len + n_app);
	snprintf(m->desc, sizeof(m->desc), "attend session %" PRIu64 "%s layer %u: %u queries, append %u, layer "
		 "length %" PRIu64, id, ms ? (ms->evicted ? " (evicted)" : "") : " (closed)", l, n_q, n_app, len);
	pre_states(m, ms);
	if (acquire(m, ms, id, ++m->now, &s) < 0)
		return;
	uint32_t row = ms->g.n_q_heads * ms->g.head_dim;
	for (uint32_t i = 0; i < n_q * row; i++)
		m->q[i] = (float)((int64_t)(rnd64(m) >> 40) - (1 << 23)) / (float)(1 << 23);
	if (n_app)
		gen_kv(m, ms, n_app, TQ_DTYPE_F32, -1);
	dataop_attend(m->kv.ks, s, &m->ws, l, m->kp, m->vp, n_app, m->q, pos, n_q, TQ_DTYPE_F32, m->out, &r);
	session_release(s);
	answered(m, ms, &r);
	m->st_count[r.status < TQKV_ST__COUNT ? r.status : TQKV_ST_INTERNAL]++;
	uint32_t from[MAX_LAYERS] = { 0 };
	for (uint32_t i = 0; i < MAX_LAYERS; i++)
		from[i] = UINT32_MAX;
	if (r.status == TQKV_ST_BAD_POSITION) {
		CHECK(bad_pos || len + n_app == 0, "BAD_POSITION");
		snap_take(m, &m->post);
		/* checked before anything happens: nothing moved */
		const struct ssnap *a = ssnap_of(&m->pre, id), *b = ssnap_of(&m->post, id);
		CHECK(a && b && a->resident == b->resident && a->spilled == b->spilled, "BAD_POSITION moved pages");
		check_spills(m, id, ms->tenant);
		return;
	}
	CHECK(!bad_pos && len + n_app > 0, "bad position accepted: status %u", r.status);
	if (r.status == TQKV_ST_OK) {
		from[l] = (uint32_t)len / ms->pg.page_tokens;
		if (n_app)
			model_append(m, ms, l, n_app, TQ_DTYPE_F32);
	}
	snap_take(m, &m->post);
	check_spills(m, id, ms->tenant);
	if (ms->evicted)
		return;
	check_append_result(m, ms, l, (uint32_t)len, n_app, -1, &r);
	compare_session(m, ms, from, false);
	if (r.status != TQKV_ST_OK)
		return;
	/* the same attention over the model's pages, bit for bit: whenever the
	 * layer had pages out, else every 4th time (the page bytes are
	 * compared anyway) */
	bool was_out = false;
	for (uint32_t p = 0; p < m->pre_pages[l] && !was_out; p++)
		was_out = m->pre_state[l][p] != PG_RESIDENT;
	if (!was_out && !chance(m, 250))
		return;
	struct mlayer *ML = &ms->layer[l];
	struct tq_page_table pt = { .pages = (const uint8_t *const *)ML->shadow,
				    .n_pages = tq_page_count(&ms->pg, ML->n_tokens), .n_tokens = ML->n_tokens,
				    .geom = ms->pg };
	struct tq_attn_params ap = { .k_codec = ML->kc, .v_codec = ML->vc, .n_q_heads = (int)ms->g.n_q_heads,
				     .kv = &pt, .n_q = (int)n_q, .q = m->q, .q_dtype = TQ_DTYPE_F32, .q_pos = pos,
				     .causal = 1, .out = m->ref, .isa = TQ_ISA_AUTO, .plan_n_q = (int)n_q };
	tq_error te;
	CHECK(tq_attend(&ap, &te) == 0, "model attention: %s", te.msg);
	CHECK(memcmp(m->out, m->ref, (size_t)n_q * row * sizeof(float)) == 0,
	      "attention differs from the model's (layer %u, %u tokens)", l, ML->n_tokens);
	m->attends_compared++;
}

static void do_truncate(struct model *m, struct msess *ms, uint64_t id, uint32_t l, bool all, uint64_t pos,
			uint64_t len)
{
	struct session *s;
	struct dataop_res r;

	snprintf(m->desc, sizeof(m->desc), "truncate session %" PRIu64 "%s %s%u to %" PRIu64 " (length %" PRIu64 ")",
		 id, ms ? (ms->evicted ? " (evicted)" : "") : " (closed)", all ? "all layers, not " : "layer ", l, pos,
		 len);
	pre_states(m, ms);
	if (acquire(m, ms, id, ++m->now, &s) < 0)
		return;
	dataop_truncate(m->kv.ks, s, l, all, pos, &r);
	session_release(s);
	m->st_count[r.status < TQKV_ST__COUNT ? r.status : TQKV_ST_INTERNAL]++;
	CHECK(r.status == TQKV_ST_OK, "truncate: status %u", r.status);
	for (uint32_t i = 0; i < ms->g.n_layers; i++)
		if ((all || i == l) && ms->layer[i].n_tokens > pos)
			ms->layer[i].n_tokens = (uint32_t)pos;
	snap_take(m, &m->post);
	check_no_spills(m);
	compare_session(m, ms, NULL, false);
}

static void step_truncate(struct model *m)
{
	uint64_t id;
	struct msess *ms = pick_data_session(m, &id);
	bool all = chance(m, 300);
	uint32_t l = ms ? (uint32_t)rnd(m, ms->g.n_layers) : 0;
	uint64_t len = 0;

	if (ms && !ms->evicted)
		for (uint32_t i = 0; i < ms->g.n_layers; i++)
			if ((all || i == l) && ms->layer[i].n_tokens > len)
				len = ms->layer[i].n_tokens;
	/* mostly the last few pages; deep cuts when shrinking */
	uint32_t pt = ms ? ms->pg.page_tokens : 1;
	uint64_t cut = rnd(m, (len < 2 * pt ? len : 2 * pt) + 1);
	uint64_t pos = m->phase == 2 || chance(m, 200) ? rnd(m, len + 1) : len - cut;
	if (chance(m, 100))
		pos = len + rnd(m, 10);
	do_truncate(m, ms, id, l, all, pos, len);
}

static void step_close(struct model *m)
{
	struct msess *ms = pick_session(m);
	uint64_t released = 0, id = ms && !chance(m, 20) ? ms->id : GONE_ID + rnd(m, 100);

	snprintf(m->desc, sizeof(m->desc), "close session %" PRIu64 "%s", id,
		 ms && id == ms->id ? (ms->evicted ? " (evicted)" : "") : " (no such id)");
	int e = session_close(m->kv.st, id, &released);
	if (!ms || id != ms->id) {
		CHECK(e == -ENOENT, "close of an unknown id: %d", e);
		m->ctl_fail[OP_CLOSE]++;
		snap_take(m, &m->post);
		return;
	}
	const struct ssnap *a = ssnap_of(&m->pre, id);
	CHECK(e == 0 && a && released == a->resident + a->spilled, "close: %d, released %" PRIu64, e, released);
	msess_drop(ms);
	snap_take(m, &m->post);
	check_no_spills(m);
}

static void step_evict(struct model *m)
{
	struct msess *ms = pick_session(m);
	struct session_info si;

	if (!ms)
		return;
	snprintf(m->desc, sizeof(m->desc), "evict session %" PRIu64 "%s", ms->id, ms->evicted ? " (evicted)" : "");
	int e = session_evict(m->kv.st, ms->id, &si);
	if (ms->evicted) {
		CHECK(e == -EALREADY, "evict of an evicted session: %d", e);
		m->ctl_fail[OP_EVICT]++;
	} else {
		CHECK(e == 0 && si.state == SESSION_EVICTED && si.evict_reason == TQKV_EVICT_OPERATOR &&
		      si.resident_bytes == 0 && si.spilled_bytes == 0, "evict: %d, state %d, %" PRIu64 "+%" PRIu64
		      " bytes left", e, si.state, si.resident_bytes, si.spilled_bytes);
		msess_evicted(ms);
	}
	snap_take(m, &m->post);
	check_no_spills(m);
}

static void step_spill(struct model *m)
{
	uint64_t id, got = 0;
	struct msess *ms = pick_data_session(m, &id);
	struct session *s;
	char why[512] = "";
	uint64_t want = chance(m, 200) ? UINT64_MAX : chance(m, 500) ? (1 + rnd(m, 16)) * PAGE : rnd(m, 40 * PAGE);

	snprintf(m->desc, sizeof(m->desc), "spill session %" PRIu64 "%s: %" PRIu64 " bytes", id,
		 ms ? (ms->evicted ? " (evicted)" : "") : " (closed)", want);
	if (acquire(m, ms, id, 0, &s) < 0)
		return;
	int e = dataop_spill(m->kv.ks, s, want, &got, why, sizeof(why));
	session_release(s);
	snap_take(m, &m->post);
	const struct ssnap *a = ssnap_of(&m->pre, id);
	uint64_t n_want = want / PAGE + (want % PAGE != 0);
	/* read-ahead pages are collected first: they can go, and give their
	 * slots back */
	uint64_t can = a->res_pages + a->reading, free_slots = m->pre.slots_total - m->pre.slots_used + a->reading;
	uint64_t k = n_want < can ? n_want : can;
	uint64_t expect = k < free_slots ? k : free_slots;
	int e_want = expect < k && expect == 0 ? -ENOSPC : 0;
	CHECK(e == e_want && got == expect * PAGE, "dataop_spill: %d (%s), %" PRIu64 " bytes; expected %d, %" PRIu64
	      " pages (%" PRIu64 " wanted, %u resident + %u read-ahead, %" PRIu64 " free slots)", e, why, got, e_want,
	      expect, n_want, a->res_pages, a->reading, free_slots);
	if (e < 0)
		m->ctl_fail[OP_SPILL]++;
	for (int u = 0; u < N_TEN; u++)
		CHECK(m->post.t[u].pr.spilled_bytes - m->pre.t[u].pr.spilled_bytes == (u == ms->tenant ? got : 0),
		      "tenant %s spilled counter", TNAME[u]);
	CHECK(m->post.n_evicted_now == 0, "spill evicted a session");
}

static void step_prefetch(struct model *m)
{
	uint64_t id;
	struct msess *ms = pick_data_session(m, &id);
	struct session *s;
	struct dataop_res r;

	snprintf(m->desc, sizeof(m->desc), "prefetch session %" PRIu64 "%s", id,
		 ms ? (ms->evicted ? " (evicted)" : "") : " (closed)");
	pre_states(m, ms);
	if (acquire(m, ms, id, ++m->now, &s) < 0)
		return;
	dataop_prefetch(m->kv.ks, s, &r);
	session_release(s);
	answered(m, ms, &r);
	m->st_count[r.status < TQKV_ST__COUNT ? r.status : TQKV_ST_INTERNAL]++;
	CHECK(r.status == TQKV_ST_OK || r.status == TQKV_ST_TENANT_LIMIT || r.status == TQKV_ST_POOL_FULL,
	      "prefetch: status %u (%s)", r.status, r.msg);
	snap_take(m, &m->post);
	check_spills(m, id, ms->tenant);
	if (r.status == TQKV_ST_OK && !ms->evicted) {
		const struct ssnap *b = ssnap_of(&m->post, id);
		CHECK(b->spilled == 0 && b->reading == 0, "prefetch OK with pages still out");
	}
	if (r.status == TQKV_ST_TENANT_LIMIT || r.status == TQKV_ST_POOL_FULL) {
		/* layers come back in order and the first refused for memory
		 * ends the prefetch: the refused one is the first still out */
		struct kv_sess *kv = kv_find(m->kv.ks, id);
		const struct tsnap *t = &m->post.t[ms->tenant];
		uint32_t n = 0;
		for (uint32_t l = 0; kv && l < kv->n_layers && !n; l++)
			for (uint32_t p = 0; p < kv->layer[l].n_pages; p++)
				n += kv->layer[l].meta[p].state == PG_SPILLED;
		CHECK(n > 0, "prefetch refused (%s) with no layer left out", r.msg);
		if (r.status == TQKV_ST_TENANT_LIMIT) {
			CHECK(t->used + (uint64_t)n * PAGE > t->limit, "prefetch: TENANT_LIMIT restoring %u pages: used "
			      "%" PRIu64 " limit %" PRIu64, n, t->used, t->limit);
			check_limit_refusal(m, id, ms->tenant, (uint64_t)n * PAGE);
		} else {
			check_refusal(m, id, ms->tenant, n);
		}
	}
	compare_session(m, ms, NULL, false);
}

/* Random watermarks (sometimes invalid: low >= high). */
static void pick_marks(struct model *m, uint32_t *high, uint32_t *low)
{
	/* mostly a realistic band (marks far down spill most of the pool,
	 * which later steps read back: slow, and no more telling) */
	bool wide = chance(m, 50);
	*high = wide ? 40 + (uint32_t)rnd(m, 61) : 70 + (uint32_t)rnd(m, 31);
	*low = wide ? (uint32_t)rnd(m, *high) : *high - 1 - (uint32_t)rnd(m, 6);
	if (chance(m, 50))
		*low = *high + (uint32_t)rnd(m, 3);
}

static void step_pass(struct model *m)
{
	struct reclaim_params p = m->rp, got;
	char why[256] = "";
	bool set = chance(m, 500);

	if (set)
		pick_marks(m, &p.high_pct, &p.low_pct);
	snprintf(m->desc, sizeof(m->desc), "reclaim pass, watermarks %u%%/%u%%%s", p.high_pct, p.low_pct,
		 set ? " (set first)" : "");
	if (set) {
		int e = reclaim_set_params(m->rc, &p, why, sizeof(why));
		bool ok = p.low_pct < p.high_pct;
		CHECK(e == (ok ? 0 : -EINVAL), "reclaim_set_params: %d (%s)", e, why);
		reclaim_get_params(m->rc, &got);
		if (ok)
			m->rp = p;
		else
			m->ctl_fail[OP_PASS]++;
		CHECK(got.high_pct == m->rp.high_pct && got.low_pct == m->rp.low_pct &&
		      got.admission_wait_ms == m->rp.admission_wait_ms && got.pressure_action == m->rp.pressure_action,
		      "reclaim params %u/%u, expected %u/%u", got.high_pct, got.low_pct, m->rp.high_pct, m->rp.low_pct);
	}
	uint64_t spilled = reclaim_pass(m->rc);
	m->pass_bytes += spilled;
	snap_take(m, &m->post);
	check_spills(m, 0, -1);
	const struct snap *a = &m->pre, *b = &m->post;
	uint64_t sum = 0, step1 = 0, by2[N_TEN] = { 0 };
	for (int u = 0; u < N_TEN; u++) {
		uint64_t d = b->t[u].pr.spilled_bytes - a->t[u].pr.spilled_bytes;
		uint64_t over = a->t[u].used > a->t[u].limit ? round_up(a->t[u].used - a->t[u].limit, PAGE) : 0;
		uint64_t s1 = d < over ? d : over;
		sum += d;
		step1 += s1;
		by2[u] = d - s1;
		/* 1. down to its limit (unless the tier is full) */
		CHECK(b->t[u].used <= b->t[u].limit || tier_full(b), "tenant %s still above its limit after a pass: %"
		      PRIu64 " > %" PRIu64 " (tier %" PRIu64 "/%" PRIu64 ")", TNAME[u], b->t[u].used, b->t[u].limit,
		      b->slots_used, b->slots_total);
	}
	CHECK(spilled == sum, "reclaim_pass returned %" PRIu64 ", tenants lost %" PRIu64, spilled, sum);
	CHECK(b->n_evicted_now == 0, "a pass evicted");
	/* 2. above the high mark (after step 1): down to the low mark, lowest
	 * priority first, unless nothing more can go */
	uint64_t total = POOL_BYTES, after1 = a->pool_used - step1;
	if (after1 * 100 > total * m->rp.high_pct) {
		bool all_out = true;
		for (int u = 0; u < N_TEN; u++)
			all_out &= exhausted(b, u);
		CHECK(b->pool_used < total * m->rp.low_pct / 100 + PAGE || all_out || tier_full(b),
		      "pool at %" PRIu64 " pages after a pass (low mark %u%%), tenants above their guarantees: %s",
		      b->pool_used / PAGE, m->rp.low_pct, tenants_str(b));
		check_order(m, by2, -1);
	} else {
		for (int u = 0; u < N_TEN; u++)
			CHECK(by2[u] == 0, "tenant %s spilled %" PRIu64 " bytes below the high mark", TNAME[u], by2[u]);
	}
}

/* A budget change: the result tenant_set_budget must give. */
static void step_budget(struct model *m)
{
	int t = (int)rnd(m, N_TEN);
	bool sl = chance(m, 600), sg = !sl || chance(m, 300);
	uint64_t lim = 0, g = 0, used = m->pre.t[t].used;
	char why[256] = "";

	if (sl) {
		uint64_t r = rnd(m, 100);
		if (r < 65)
			lim = (256 + rnd(m, 257)) * PAGE;
		else if (r < 80)
			lim = MiB + rnd(m, MiB + 1);
		else if (r < 95 && used > MiB)
			lim = MiB + rnd(m, used - MiB); /* below its use */
		else
			lim = chance(m, 500) ? rnd(m, MiB) : POOL_BYTES + 1 + rnd(m, MiB);
	}
	if (sg) {
		uint64_t r = rnd(m, 100);
		g = r < 60 ? rnd(m, 129) * PAGE : r < 80 ? rnd(m, 512 * KiB) : (128 + rnd(m, 385)) * PAGE;
	}
	uint64_t nl = sl ? lim : m->limit[t], ng = sg ? g : m->guar[t], others = 0;
	for (int u = 0; u < N_TEN; u++)
		others += u == t ? 0 : m->guar[u];
	int want = nl < MiB || nl > POOL_BYTES || ng > nl ? -EINVAL : others + ng > POOL_BYTES ? -ENOSPC : 0;
	snprintf(m->desc, sizeof(m->desc), "budget tenant %s: limit %s%" PRIu64 ", guaranteed %s%" PRIu64 " (used %"
		 PRIu64 ", others' guarantees %" PRIu64 ")", TNAME[t], sl ? "" : "kept ", nl, sg ? "" : "kept ", ng,
		 used, others);
	int e = tenant_set_budget(m->kv.tt, ten(m, t), sl, lim, sg, g, why, sizeof(why));
	CHECK(e == want, "tenant_set_budget: %d (%s), expected %d", e, why, want);
	if (e == 0) {
		m->limit[t] = nl;
		m->guar[t] = ng;
		if (used > nl && !m->over[t]) {
			m->over[t] = true;
			m->over_used[t] = used;
			m->over_limit_set++;
		}
	} else {
		m->ctl_fail[OP_BUDGET]++;
	}
	snap_take(m, &m->post);
	check_no_spills(m);
}

/* A reload, the way main.c does it: the new file merged into the running
 * config, validated against the pool, applied to the tenants and the
 * reclaimer. */
static void step_reload(struct model *m)
{
	static struct config next, merged;
	char text[2048], err[CONFIG_ERR_MAX], notes[1024], why[256];
	uint32_t high, low;
	uint64_t lim[N_TEN], g[N_TEN], gsum = 0;
	int32_t pr[N_TEN];
	static const uint64_t waits[] = { 2000, 5000, 60000 };
	uint64_t wait = waits[rnd(m, 3)];
	int action = chance(m, 400) ? CONFIG_PRESSURE_EVICT : CONFIG_PRESSURE_FAIL;
	bool bad_g = false, bad_sum;
	int n;

	pick_marks(m, &high, &low);
	n = snprintf(text, sizeof(text), "[pool]\npool_bytes = 16M\npage_bytes = 4K\nhigh_watermark = %u\n"
		     "low_watermark = %u\nadmission_wait = %" PRIu64 "ms\npressure_action = %s\n", high, low, wait,
		     action == CONFIG_PRESSURE_EVICT ? "evict" : "fail");
	for (int t = 0; t < N_TEN; t++) {
		lim[t] = chance(m, 800) ? (256 + rnd(m, 257)) * PAGE : MiB + rnd(m, MiB + 1);
		g[t] = chance(m, 500) ? 0 : chance(m, 800) ? rnd(m, 97) * PAGE : rnd(m, 600 * KiB);
		if (chance(m, 20))
			g[t] = lim[t] + PAGE; /* refused at load */
		bad_g |= g[t] > lim[t];
		gsum += g[t];
		pr[t] = (int32_t)rnd(m, 101);
		n += snprintf(text + n, sizeof(text) - (size_t)n, "[tenant %s]\nguaranteed = %" PRIu64 "\nlimit = %" PRIu64
			      "\npriority = %d\nallow_uids = *\n", TNAME[t], g[t], lim[t], pr[t]);
	}
	bad_sum = gsum > POOL_BYTES;
	snprintf(m->desc, sizeof(m->desc), "reload: marks %u%%/%u%%, wait %" PRIu64 " ms, %s; limits %" PRIu64 "/%"
		 PRIu64 "/%" PRIu64 "/%" PRIu64 ", guarantees %" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64
		 ", priorities %d/%d/%d/%d", high, low, wait, action ? "evict" : "fail", lim[0], lim[1], lim[2], lim[3],
		 g[0], g[1], g[2], g[3], pr[0], pr[1], pr[2], pr[3]);
	bool load_ok = low < high && !bad_g;
	int e = config_load_string(&next, "reload.conf", text, err, sizeof(err));
	CHECK((e == 0) == load_ok, "config_load_string: %d (%s)", e, err);
	if (e == 0) {
		memcpy(&merged, &m->live, sizeof(merged));
		config_apply_reload(&merged, &next, notes, sizeof(notes), NULL, 0);
		e = config_validate(&merged, err, sizeof(err));
		CHECK((e == 0) == !bad_sum, "config_validate of the merged config: %d (%s)", e, err);
	}
	if (e < 0) {
		m->ctl_fail[OP_RELOAD]++;
		snap_take(m, &m->post);
		return;
	}
	memcpy(&m->live, &merged, sizeof(merged));
	tenant_table_apply(m->kv.tt, &m->live);
	struct reclaim_params rp = { m->live.high_watermark, m->live.low_watermark, m->live.admission_wait_ms,
				     m->live.pressure_action };
	CHECK(reclaim_set_params(m->rc, &rp, why, sizeof(why)) == 0, "reclaim_set_params: %s", why);
	CHECK(rp.high_pct == high && rp.low_pct == low && rp.admission_wait_ms == wait && rp.pressure_action == action,
	      "reloaded reclaim params");
	m->rp = rp;
	for (int t = 0; t < N_TEN; t++) {
		m->limit[t] = lim[t];
		m->guar[t] = g[t];
		m->prio[t] = pr[t];
		if (m->pre.t[t].used > lim[t] && !m->over[t]) {
			m->over[t] = true;
			m->over_used[t] = m->pre.t[t].used;
			m->over_limit_set++;
		}
	}
	snap_take(m, &m->post);
	check_no_spills(m);
}

/* ---- the run --------------------------------------------------------------------- */

/* Hold up to n slots of the tier (as many as are free). */
static void ballast_set(struct model *m, uint32_t n)
{
	snprintf(m->desc, sizeof(m->desc), "ballast: %u slots of the tier held", n);
	while (m->n_ballast > n)
		spill_slot_free(m->kv.sp, m->ballast[--m->n_ballast]);
	while (m->n_ballast < n && spill_slot_alloc(m->kv.sp, &m->ballast[m->n_ballast]) == 0)
		m->n_ballast++;
	snap_take(m, &m->pre);
}

static const unsigned WEIGHT[OP__COUNT] = {
	[OP_OPEN] = 20, [OP_APPEND] = 350, [OP_ATTEND] = 150, [OP_TRUNCATE] = 40, [OP_CLOSE] = 10,
	[OP_EVICT] = 3, [OP_SPILL] = 6, [OP_PREFETCH] = 10, [OP_PASS] = 8, [OP_BUDGET] = 15, [OP_RELOAD] = 5,
};

static enum op pick_op(struct model *m)
{
	unsigned w[OP__COUNT], sum = 0;

	uint32_t n = n_records(m);

	memcpy(w, WEIGHT, sizeof(w));
	if (m->phase == 2) { /* shrinking: more closes and truncates */
		w[OP_CLOSE] *= 3;
		w[OP_TRUNCATE] *= 3;
	} else if (m->phase == 0) { /* growing: sessions fill up, the tier too */
		w[OP_CLOSE] /= 4;
		w[OP_EVICT] /= 2;
		w[OP_TRUNCATE] /= 4;
	}
	/* keep between a few and the table's maximum of sessions, mostly */
	if (n < 10)
		w[OP_OPEN] *= 4, w[OP_CLOSE] /= 4;
	else if (n >= MAX_SESS - 4)
		w[OP_OPEN] /= 4;
	for (int i = 0; i < OP__COUNT; i++)
		sum += w[i];
	uint64_t r = rnd(m, sum);
	for (int i = 0; i < OP__COUNT; i++) {
		if (r < w[i])
			return (enum op)i;
		r -= w[i];
	}
	return OP_APPEND;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* make test's run: 300,000 steps (about 20 s on a Zen 3 core), 100,000 under
 * a sanitizer (ASan about 5x slower, UBSan 1.5x); `make test-faults` runs
 * 1,000,000 */
#ifdef TQ_SANITIZER
#define DEFAULT_OPS 100000ull
#else
#define DEFAULT_OPS 300000ull
#endif

static void run_model(const struct backend_ops *be, uint64_t default_ops)
{
	static struct model model;
	struct model *m = &model;
	char why[256];
	const char *e_seed = getenv("TQ_MODEL_SEED"), *e_ops = getenv("TQ_MODEL_OPS");

	memset(m, 0, sizeof(*m));
	M = m;
	kvfix_backend = be;
	m->seed = e_seed ? strtoull(e_seed, NULL, 0) : 0x7e57a11ce5eedull;
	m->n_steps = e_ops ? strtoull(e_ops, NULL, 0) : default_ops;
	m->check_all = getenv("TQ_MODEL_CHECK_ALL") && atoi(getenv("TQ_MODEL_CHECK_ALL"));
	m->rng = m->seed;
	snprintf(m->desc, sizeof(m->desc), "setup");
	kvfix_start(&m->kv, "[pool]\npool_bytes = 16M\npage_bytes = 4K\nhigh_watermark = 90\nlow_watermark = 80\n"
		    "admission_wait = 10s\npressure_action = fail\n"
		    "[tenant prod]\nguaranteed = 512K\nlimit = 2M\npriority = 90\nallow_uids = *\n"
		    "[tenant test]\nguaranteed = 256K\nlimit = 1536K\npriority = 50\nallow_uids = *\n"
		    "[tenant batch]\nlimit = 2M\npriority = 10\nallow_uids = *\n"
		    "[tenant bulk]\nlimit = 1M\npriority = 10\nallow_uids = *\n", POOL_BYTES, PAGE, SPILL_SLOTS);
	session_table_set_max(m->kv.st, MAX_SESS, 0);
	memcpy(&m->live, &m->kv.cfg, sizeof(m->live));
	m->rp = (struct reclaim_params){ m->live.high_watermark, m->live.low_watermark, m->live.admission_wait_ms,
					 m->live.pressure_action };
	CHECK(reclaim_start_manual(&m->rc, m->kv.pool, m->kv.tt, m->kv.st, m->kv.ks, &m->rp, why, sizeof(why)) == 0,
	      "reclaim: %s", why);
	kvstore_set_reclaim(m->kv.ks, m->rc);
	for (int t = 0; t < N_TEN; t++) {
		const struct tenant_conf *tc = config_tenant(&m->live, TNAME[t]);
		m->limit[t] = tc->limit;
		m->guar[t] = tc->guaranteed;
		m->prio[t] = tc->priority;
	}
	/* the pool's region: its pages are base + i * PAGE */
	{
		static uint8_t *pages[POOL_PAGES];
		CHECK(pool_pages_alloc(m->kv.pool, POOL_PAGES, pages) == 0, "pool");
		m->pool_base = pages[0];
		for (uint32_t i = 1; i < POOL_PAGES; i++)
			m->pool_base = pages[i] < m->pool_base ? pages[i] : m->pool_base;
		for (uint32_t i = 0; i < POOL_PAGES; i++)
			CHECK((uint64_t)(pages[i] - m->pool_base) < (uint64_t)POOL_PAGES * PAGE, "pool not contiguous");
		pool_pages_free(m->kv.pool, pages, POOL_PAGES);
	}
	struct spill_stats ss0;
	spill_stats(m->kv.sp, &ss0);
	m->slots_total = ss0.slots_total;
	CHECK(m->slots_total == SPILL_SLOTS, "%" PRIu64 " spill slots", m->slots_total);
	m->ballast = calloc(SPILL_SLOTS, sizeof(*m->ballast));
	m->page_stamp = calloc(POOL_PAGES, sizeof(*m->page_stamp));
	m->slot_stamp = calloc(SPILL_SLOTS, sizeof(*m->slot_stamp));
	m->k = malloc((size_t)MAX_APPEND * MAX_KV * MAX_DIM * sizeof(float));
	CHECK((m->cache = tq_cache_new()) && m->ballast && m->page_stamp && m->slot_stamp && m->k, "out of memory");
	inputs_new(m);
	fprintf(stderr, "    seed 0x%" PRIx64 ", %" PRIu64 " steps; pool %u pages of %u bytes, spill tier %u slots (%s)\n",
		m->seed, m->n_steps, POOL_PAGES, PAGE, SPILL_SLOTS, spill_engine(m->kv.sp));

	double t0 = now_s();
	snap_take(m, &m->pre);
	for (m->step = 0; m->step < m->n_steps; m->step++) {
		if (m->step % 20000 == 0) /* grow 40 %, hold 30 %, shrink 30 % of the time */
			m->phase = chance(m, 400) ? 0 : chance(m, 500) ? 1 : 2;
		if (m->step % 5000 == 0) /* the tier squeezed in some phases */
			ballast_set(m, chance(m, 300) ? (uint32_t)(SPILL_SLOTS - 50 - rnd(m, 250)) : 0);
		if (m->step % 1000 == 0) /* a new hot set */
			for (int i = 0; i < 4; i++) {
				struct msess *h = pick_open(m);
				m->hot[i] = h ? h->id : 0;
			}
		enum op op = pick_op(m);
		m->ops[op]++;
		snprintf(m->desc, sizeof(m->desc), "%s", OPNAME[op]);
		m->snapped = false;
		m->ans_tenant = -1;
		double ts = now_s();
		switch (op) {
		case OP_OPEN: step_open(m); break;
		case OP_APPEND: step_append(m); break;
		case OP_ATTEND: step_attend(m); break;
		case OP_TRUNCATE: step_truncate(m); break;
		case OP_CLOSE: step_close(m); break;
		case OP_EVICT: step_evict(m); break;
		case OP_SPILL: step_spill(m); break;
		case OP_PREFETCH: step_prefetch(m); break;
		case OP_PASS: step_pass(m); break;
		case OP_BUDGET: step_budget(m); break;
		case OP_RELOAD: step_reload(m); break;
		default: break;
		}
		/* every step ends checked (the ones that stopped early too) */
		if (!m->snapped) {
			snap_take(m, &m->post);
			check_no_spills(m);
		}
		check_counted(m);
		m->op_s[op] += now_s() - ts;
		m->tier_full_steps += tier_full(&m->post);
		uint64_t held = m->post.pool_used / PAGE + m->post.slots_used;
		m->held_sum += held;
		m->held_max = held > m->held_max ? held : m->held_max;
		m->pre = m->post;
		if ((m->step + 1) % SWEEP_EVERY == 0)
			sweep(m);
	}
	snprintf(m->desc, sizeof(m->desc), "the end: every session closed");
	sweep(m);
	ballast_set(m, 0);
	double dt = now_s() - t0;

	/* every session closed: every page and slot free */
	for (uint32_t i = 0; i < MODEL_MAX; i++) {
		if (!m->s[i].used)
			continue;
		CHECK(session_close(m->kv.st, m->s[i].id, NULL) == 0, "close %" PRIu64, m->s[i].id);
		msess_drop(&m->s[i]);
	}
	snap_take(m, &m->post);
	struct spill_stats ss;
	spill_stats(m->kv.sp, &ss);
	CHECK(pool_pages_free_count(m->kv.pool) == POOL_PAGES && ss.slots_used == 0 && tenant_table_used(m->kv.tt) == 0,
	      "after closing everything: %u pages free of %u, %" PRIu64 " slots in use", pool_pages_free_count(m->kv.pool),
	      POOL_PAGES, ss.slots_used);
	for (int t = 0; t < N_TEN; t++)
		CHECK(m->post.t[t].spilled == 0 && m->post.t[t].sessions == 0, "tenant %s not empty", TNAME[t]);

	/* the summary */
	uint64_t sp = 0, rs = 0, waits = 0, refusals = 0;
	for (int t = 0; t < N_TEN; t++) {
		sp += m->post.t[t].pr.spilled_bytes;
		rs += m->post.t[t].pr.restored_bytes;
		waits += m->post.t[t].pr.waits;
		refusals += m->post.t[t].pr.refusals;
	}
	char line[2048];
	int n = snprintf(line, sizeof(line), "model: %" PRIu64 " ops (", m->n_steps);
	for (int i = 0; i < OP__COUNT; i++)
		n += snprintf(line + n, sizeof(line) - (size_t)n, "%s%s %" PRIu64, i ? ", " : "", OPNAME[i], m->ops[i]);
	n += snprintf(line + n, sizeof(line) - (size_t)n, "); statuses:");
	for (int s = 0; s < TQKV_ST__COUNT; s++)
		if (m->st_count[s])
			n += snprintf(line + n, sizeof(line) - (size_t)n, " %s %" PRIu64, STNAME[s] ? STNAME[s] :
				      tqkv_status_str((uint32_t)s), m->st_count[s]);
	n += snprintf(line + n, sizeof(line) - (size_t)n, "; refused control ops:");
	for (int i = 0; i < OP__COUNT; i++)
		if (m->ctl_fail[i])
			n += snprintf(line + n, sizeof(line) - (size_t)n, " %s %" PRIu64, OPNAME[i], m->ctl_fail[i]);
	snprintf(line + n, sizeof(line) - (size_t)n, "; spilled %.1f MiB (passes %.1f MiB), restored %.1f MiB; "
		 "admission waits %" PRIu64 ", refusals %" PRIu64 " (%" PRIu64 " within the guarantee; TENANT_LIMIT "
		 "with the tier full %" PRIu64 "), pressure "
		 "evictions %" PRIu64 "; limits lowered below use %" PRIu64 "; steps with the tier full %" PRIu64
		 "; pages held (pool + tier) mean %" PRIu64 ", max %" PRIu64 "; pages compared %" PRIu64
		 ", attentions compared %" PRIu64 "; %.1f s", (double)sp / MiB,
		 (double)m->pass_bytes / MiB, (double)rs / MiB, waits, refusals, m->within_refusals, m->limit_refusals_tier,
		 m->pressure_evictions, m->over_limit_set, m->tier_full_steps,
		 m->n_steps ? m->held_sum / m->n_steps : 0, m->held_max, m->pages_compared,
		 m->attends_compared, dt);
	fprintf(stderr, "    %s\n", line);
	if (getenv("TQ_MODEL_PROFILE"))
		for (int i = 0; i < OP__COUNT; i++)
			fprintf(stderr, "    %-9s %8" PRIu64 " steps %7.2f s %6.1f us/step\n", OPNAME[i], m->ops[i], m->op_s[i],
				m->ops[i] ? m->op_s[i] * 1e6 / (double)m->ops[i] : 0.0);

	for (int l = 0; l < MAX_LAYERS; l++)
		free(m->pre_state[l]);
	free(m->ballast);
	free(m->page_stamp);
	free(m->slot_stamp);
	free(m->k);
	for (int d = 0; d < 3; d++)
		free(m->in[d]);
	dataop_ws_free(&m->ws);
	tq_cache_free(m->cache);
	kvstore_set_reclaim(m->kv.ks, NULL);
	reclaim_stop(m->rc);
	kvfix_stop(&m->kv);
	kvfix_backend = NULL;
}

static void test_pressure_model(void)
{
	run_model(NULL, DEFAULT_OPS);
}

/* The same model on a pool whose pages the host cannot touch (devsim.h: the
 * GPU tier's plumbing — kernels through the backend, spill through staging
 * copies — without a GPU).  Fewer steps: the simulated tier copies more. */
static void test_pressure_model_devsim(void)
{
	struct devsim_stats ds;

	run_model(&backend_devsim, DEFAULT_OPS / 4);
	devsim_stats(&ds);
	fprintf(stderr, "    devsim: %" PRIu64 " appends, %" PRIu64 " attentions, %" PRIu64 " copies to and %" PRIu64
		" from the device (%.1f MiB)\n", ds.appends, ds.attends, ds.copies_to_dev, ds.copies_from_dev,
		(double)ds.copy_bytes / (1 << 20));
	T_ASSERT(ds.appends > 0 && ds.attends > 0 && ds.copies_to_dev > 0 && ds.copies_from_dev > 0);
}

int main(void)
{
	/* the reclaimer's decisions are logged at info: TQ_MODEL_LOG=info
	 * shows them when replaying a failure */
	const char *lv = getenv("TQ_MODEL_LOG");
	log_set_level(lv && log_level_from_name(lv) >= 0 ? log_level_from_name(lv) : LOG_ERR);
	T_RUN(test_pressure_model);
	T_RUN(test_pressure_model_devsim);
	return t_done();
}
