/* tqbench pressure — a production and a test model on one pool.
 *
 * In this process: the daemon's pool, tenants, sessions, page tables,
 * spill store and reclaimer (no ring).  Both models have the geometry of
 * --layers layers x 8 KV heads (32 query heads), d = 128, q8 K / tq4 V.
 *
 *   prod  (guaranteed, priority 90): one session with --ctx tokens decodes
 *         --steps tokens, one APPEND+ATTEND per layer each: the per-token
 *         latency (all layers) is measured.
 *   test  (no guarantee, priority 10): --sessions sessions score windows of
 *         --window tokens in chunks of 64 (APPEND + causal ATTEND per layer),
 *         interleaved as `tqkv-run ppl --sessions N` does: tokens/s.
 *
 * Runs, all in this process, one after the other:
 *   1. the spill tier alone: a session spilled whole and restored whole
 *      (dataop_spill / dataop_restore), 3 times: the write and read rates;
 *   2. test alone on a pool that holds its working set;
 *   3. prod alone on the small pool (its guarantee + half of test's set);
 *   4. both at once on the small pool: test's working set is 2x what the
 *      pool leaves it, so its pages go to the spill tier and come back;
 *   5. the reclaimer alone: a pool filled by test above the high mark,
 *      spilled down to the low mark: bytes freed per second of wall time,
 *      3 rounds, each against the tier's write rate (a session of as many
 *      bytes spilled whole, as in 1) just before and after it.
 *
 * Two cores: prod runs pinned to CPU 0, everything else (test, the
 * reclaimer thread, the spill I/O thread) to CPU 1, in every run, so prod
 * competes for memory, locks and the disk but not for its core.  With one
 * CPU, both share it and the figures say so. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "config.h"
#include "dataop.h"
#include "log.h"
#include "pool.h"
#include "reclaim.h"
#include "session.h"
#include "spill.h"
#include "tenant.h"
#include "tq_codec.h"
#include "tq_size.h"
#include "tqkv_ring.h"

#define MiB (1ull << 20)
#define CHUNK 64

struct bp_opts {
	const char *dir;
	uint32_t layers, ctx, steps, sessions, window;
};

/* One data path: config (tenants prod and test), pool, page tables,
 * sessions, spill store and reclaimer. */
struct world {
	struct config cfg;
	struct tenant_table *tt;
	struct pool *pool;
	tq_cache *cache;
	struct kvstore *ks;
	struct session_table *st;
	struct spill *sp;
	struct reclaim *rc;
};

static struct session_geom geom;
static float *kvbuf;      /* [CHUNK][32][128]: K, V ([CHUNK][8][128]) and queries */
static int ncpu;

static void pin(int cpu)
{
	cpu_set_t set;

	if (ncpu < 2)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static int world_new(struct world *w, const char *dir, uint64_t pool_bytes, uint64_t prod_guarantee,
		     uint64_t spill_bytes)
{
	char text[1024], err[CONFIG_ERR_MAX] = "", why[512] = "";
	struct pool_params pp = { .bytes = pool_bytes, .page_bytes = 64 << 10, .numa_node = -1, .hugepages = true };
	struct spill_params sp = { .dir = dir, .bytes = spill_bytes, .page_bytes = 64 << 10 };
	struct reclaim_params rp = { 90, 80, 2000, CONFIG_PRESSURE_FAIL };

	memset(w, 0, sizeof(*w));
	snprintf(text, sizeof(text), "[pool]\npool_bytes = %" PRIu64 "\n"
		 "[tenant prod]\nguaranteed = %" PRIu64 "\npriority = 90\nallow_uids = *\n"
		 "[tenant test]\npriority = 10\nallow_uids = *\n", pool_bytes, prod_guarantee);
	if (config_load_string(&w->cfg, "bench.conf", text, err, sizeof(err)) != 0 ||
	    tenant_table_new(&w->tt, &w->cfg) < 0 || pool_new(&w->pool, &pp, why, sizeof(why)) < 0 ||
	    !(w->cache = tq_cache_new()) || kvstore_new(&w->ks, w->pool, w->cache) < 0 ||
	    session_table_new(&w->st, 1024, kvstore_release, w->ks) < 0 ||
	    spill_open(&w->sp, &sp, why, sizeof(why)) < 0 ||
	    reclaim_start(&w->rc, w->pool, w->tt, w->st, w->ks, &rp, why, sizeof(why)) < 0) {
		fprintf(stderr, "tqbench pressure: setup: %s %s\n", err, why);
		return -1;
	}
	kvstore_set_spill(w->ks, w->sp);
	kvstore_set_reclaim(w->ks, w->rc);
	return 0;
}

static void world_free(struct world *w, const char *dir)
{
	char path[512];

	kvstore_set_reclaim(w->ks, NULL);
	reclaim_stop(w->rc);
	session_table_free(w->st);
	kvstore_free(w->ks);
	spill_close(w->sp);
	tq_cache_free(w->cache);
	pool_free(w->pool);
	tenant_table_free(w->tt);
	snprintf(path, sizeof(path), "%s/%s", dir, SPILL_FILE);
	unlink(path);
}

static uint64_t open_session(struct world *w, const char *tenant, uint64_t max_tokens)
{
	struct session_geom g = geom;
	struct session_info si;
	char why[512];

	g.max_tokens = max_tokens;
	if (session_open(w->st, tenant_find(w->tt, tenant), "", 0, &g, 7, 0, 0, &si, why, sizeof(why)) < 0) {
		fprintf(stderr, "tqbench pressure: open: %s\n", why);
		exit(1);
	}
	return si.id;
}

/* n tokens appended to every layer of session id, with n causal queries
 * attended when attend (the queries are the keys: any values do). */
static void step(struct world *w, uint64_t id, struct dataop_ws *ws, uint32_t n, uint32_t pos0, int attend,
		 float *out, const char *who)
{
	struct session *s;
	struct dataop_res r;
	int32_t pos[CHUNK];

	for (uint32_t i = 0; i < n; i++)
		pos[i] = (int32_t)(pos0 + i);
	if (session_acquire(w->st, id, 1, &s) < 0) {
		fprintf(stderr, "tqbench pressure: %s: session %" PRIu64 " is gone\n", who, id);
		exit(1);
	}
	for (uint32_t l = 0; l < geom.n_layers; l++) {
		if (attend)
			dataop_attend(w->ks, s, ws, l, kvbuf, kvbuf, n, kvbuf, pos, n, TQ_DTYPE_F32, out, &r);
		else
			dataop_append(w->ks, s, l, kvbuf, kvbuf, TQ_DTYPE_F32, n, &r);
		if (r.res < 0) {
			fprintf(stderr, "tqbench pressure: %s: layer %u: %s: %s\n", who, l, tqkv_status_str(r.status),
				r.msg);
			exit(1);
		}
	}
	session_release(s);
}

/* ---- test: windows scored by interleaved sessions -------------------------------- */
struct test_run {
	struct world *w;
	const struct bp_opts *o;
	double tokens_per_s;
	volatile int *stop_when_done; /* set to 1 at the end (prod's loop watches it) */
};

static void *test_main(void *arg)
{
	struct test_run *t = arg;
	const struct bp_opts *o = t->o;
	struct dataop_ws ws = { 0 };
	float *out = malloc((size_t)CHUNK * 32 * 128 * sizeof(float));
	uint64_t *ids = calloc(o->sessions, sizeof(*ids));

	pin(1);
	for (uint32_t i = 0; i < o->sessions; i++)
		ids[i] = open_session(t->w, "test", o->window);
	double t0 = bench_now();
	for (uint32_t pos = 0; pos < o->window; pos += CHUNK)
		for (uint32_t i = 0; i < o->sessions; i++)
			step(t->w, ids[i], &ws, o->window - pos < CHUNK ? o->window - pos : CHUNK, pos, 1, out, "test");
	t->tokens_per_s = (double)o->sessions * o->window / (bench_now() - t0);
	for (uint32_t i = 0; i < o->sessions; i++)
		session_close(t->w->st, ids[i], NULL);
	if (t->stop_when_done)
		*t->stop_when_done = 1;
	dataop_ws_free(&ws);
	free(ids);
	free(out);
	return NULL;
}

/* ---- prod: one decoding session --------------------------------------------------- */
static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

struct prod_run {
	struct world *w;
	const struct bp_opts *o;
	volatile int *other_done;  /* NULL: run --steps; else until *other_done too */
	double p50_ms, p99_ms;
	uint32_t tokens;
};

static void *prod_main(void *arg)
{
	struct prod_run *p = arg;
	const struct bp_opts *o = p->o;
	struct dataop_ws ws = { 0 };
	float out[32 * 128];
	uint32_t cap = o->steps * 4;
	double *lat = malloc(cap * sizeof(*lat));

	pin(0);
	uint64_t id = open_session(p->w, "prod", (uint64_t)o->ctx + cap);
	for (uint32_t pos = 0; pos < o->ctx; pos += CHUNK)
		step(p->w, id, &ws, o->ctx - pos < CHUNK ? o->ctx - pos : CHUNK, pos, 0, out, "prod");
	uint32_t n = 0;
	/* alone: cap tokens, as many as it decodes at most under pressure,
	 * so both p99s come from samples of the same size */
	while (n < cap && (!p->other_done || n < o->steps || !*p->other_done)) {
		double t0 = bench_now();
		step(p->w, id, &ws, 1, o->ctx + n, 1, out, "prod");
		lat[n++] = (bench_now() - t0) * 1e3;
	}
	qsort(lat, n, sizeof(*lat), cmp_d);
	p->p50_ms = lat[n / 2];
	p->p99_ms = lat[n * 99 / 100];
	p->tokens = n;
	session_close(p->w->st, id, NULL);
	dataop_ws_free(&ws);
	free(lat);
	return NULL;
}

/* ---- the spill tier alone ------------------------------------------------------------ */
static int spill_rates(struct world *w, uint32_t tokens, double *wr, double *rd)
{
	double wv[3], rv[3];
	uint64_t done;
	char why[512];
	struct dataop_ws ws = { 0 };
	float out[CHUNK * 32 * 128];
	uint64_t id = open_session(w, "test", tokens);
	struct session *s;

	for (uint32_t pos = 0; pos < tokens; pos += CHUNK)
		step(w, id, &ws, tokens - pos < CHUNK ? tokens - pos : CHUNK, pos, 0, out, "spill");
	if (session_acquire(w->st, id, 0, &s) < 0)
		return -1;
	struct session_info si;
	session_get_info(w->st, id, &si);
	uint64_t bytes = si.resident_bytes;
	/* a first round writes the file's unwritten extents once */
	if (dataop_spill(w->ks, s, UINT64_MAX, &done, why, sizeof(why)) < 0 || dataop_restore(w->ks, s, why, sizeof(why)) < 0)
		goto fail;
	for (int i = 0; i < 3; i++) {
		double t0 = bench_now();
		if (dataop_spill(w->ks, s, UINT64_MAX, &done, why, sizeof(why)) < 0)
			goto fail;
		double t1 = bench_now();
		if (dataop_restore(w->ks, s, why, sizeof(why)) < 0)
			goto fail;
		wv[i] = (double)bytes / (t1 - t0);
		rv[i] = (double)bytes / (bench_now() - t1);
	}
	session_release(s);
	session_close(w->st, id, NULL);
	dataop_ws_free(&ws);
	qsort(wv, 3, sizeof(double), cmp_d);
	qsort(rv, 3, sizeof(double), cmp_d);
	*wr = wv[1];
	*rd = rv[1];
	return 0;
fail:
	fprintf(stderr, "tqbench pressure: spill tier: %s\n", why);
	return -1;
}

/* The reclaimer alone: test's sessions fill the pool above the high
 * mark with no allocation waiting; then the thread is kicked and timed
 * until the pool is at the low mark. */
static double reclaim_rate(struct world *w, uint32_t window, uint64_t *freed)
{
	struct dataop_ws ws = { 0 };
	float *out = malloc((size_t)CHUNK * 32 * 128 * sizeof(float));
	struct reclaim_params hold = { 100, 99, 0, CONFIG_PRESSURE_FAIL }, rp = { 90, 50, 2000, CONFIG_PRESSURE_FAIL };
	char why[256];
	uint64_t ids[4096];
	uint32_t n = 0, total = pool_pages_total(w->pool);
	uint32_t per = (window + (uint32_t)dataop_page_tokens(64 << 10, 0, &geom) - 1) /
		       (uint32_t)dataop_page_tokens(64 << 10, 0, &geom) * geom.n_layers;

	reclaim_set_params(w->rc, &hold, why, sizeof(why));
	while (n < 4096 && pool_pages_free_count(w->pool) >= per + total / 50) {
		ids[n] = open_session(w, "test", window);
		for (uint32_t pos = 0; pos < window; pos += CHUNK)
			step(w, ids[n], &ws, window - pos < CHUNK ? window - pos : CHUNK, pos, 0, out, "fill");
		n++;
	}
	uint32_t used0 = total - pool_pages_free_count(w->pool);
	double t0 = bench_now();
	reclaim_set_params(w->rc, &rp, why, sizeof(why)); /* kicks the thread */
	while ((uint64_t)(total - pool_pages_free_count(w->pool)) * 100 > (uint64_t)total * 50 && bench_now() - t0 < 60)
		usleep(200);
	double dt = bench_now() - t0;
	*freed = (uint64_t)(used0 - (total - pool_pages_free_count(w->pool))) * pool_page_bytes(w->pool);
	for (uint32_t i = 0; i < n; i++)
		session_close(w->st, ids[i], NULL);
	dataop_ws_free(&ws);
	free(out);
	return (double)*freed / dt;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tqbench pressure [--dir DIR] [--layers L] [--ctx T] [--steps N] [--sessions S]\n"
		   "                        [--window W] [--isa scalar|avx2|avx512|neon] [--json]\n"
		   "  --dir DIR     where the spill files go (default build/bench-pressure)\n"
		   "  --layers L    layers of both models (default 16; 8 KV heads, 32 query heads, d 128)\n"
		   "  --ctx T       prod's context before it decodes (default 2048)\n"
		   "  --steps N     prod decodes 4 N tokens alone, and under pressure for as long\n"
		   "                as test runs (at least N, at most 4 N) (default 200)\n"
		   "  --sessions S  test's sessions (default 16) ...\n"
		   "  --window W    ... each scoring W tokens (default 1024): the working set is\n"
		   "                S x W tokens; the small pool leaves test half of it\n"
		   "  --isa I       cap the kernels' ISA; default: the best\n");
}

static int bench_pressure_main(int argc, char **argv)
{
	struct bp_opts o = { "build/bench-pressure", 16, 2048, 200, 16, 1024 };
	int json = 0;

	for (int i = 1; i < argc; i++) {
		uint32_t *u = !strcmp(argv[i], "--layers") ? &o.layers : !strcmp(argv[i], "--ctx") ? &o.ctx
			    : !strcmp(argv[i], "--steps") ? &o.steps : !strcmp(argv[i], "--sessions") ? &o.sessions
			    : !strcmp(argv[i], "--window") ? &o.window : NULL;
		if (u && i + 1 < argc) {
			*u = (uint32_t)strtoul(argv[++i], NULL, 0);
		} else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
			o.dir = argv[++i];
		} else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
			const char *isa = argv[++i];
			if (tq_isa_from_name(isa) <= TQ_ISA_AUTO) {
				fprintf(stderr, "tqbench pressure: unknown isa %s\n", isa);
				return 2;
			}
			setenv("TQ_ISA", isa, 1); /* caps TQ_ISA_AUTO */
		} else if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else {
			usage(!strcmp(argv[i], "--help") ? stdout : stderr);
			return strcmp(argv[i], "--help") ? 2 : 0;
		}
	}
	if (o.layers < 1 || o.layers > 128 || o.ctx < CHUNK || o.ctx > 65536 || o.steps < 10 || o.steps > 100000 ||
	    o.sessions < 2 || o.sessions > 1024 || o.window < CHUNK || o.window > 65536) {
		usage(stderr);
		return 2;
	}
	mkdir("build", 0755);
	if (mkdir(o.dir, 0750) < 0 && errno != EEXIST) {
		fprintf(stderr, "tqbench pressure: %s: %s\n", o.dir, strerror(errno));
		return 1;
	}
	log_set_level(LOG_WARNING);
	ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
	pin(1); /* this thread and the ones it starts: reclaimer, spill I/O */

	geom = (struct session_geom){ o.layers, 8, 32, 128, TQ_CODEC_Q8, TQ_CODEC_TQ4, 1, 0 };
	int pt = dataop_page_tokens(64 << 10, 0, &geom);
	uint64_t page = 64 << 10;
	uint64_t sess_bytes = ((uint64_t)o.window + (uint64_t)pt - 1) / (uint64_t)pt * o.layers * page;
	uint64_t set = sess_bytes * o.sessions;
	uint64_t prod_bytes = ((uint64_t)o.ctx + (uint64_t)o.steps * 4 + (uint64_t)pt) / (uint64_t)pt * o.layers * page;
	uint64_t prod_g = (prod_bytes + MiB - 1) / MiB * MiB;
	uint64_t small = prod_g + set / 2, big = prod_g + set + set / 2;
	small = (small + MiB - 1) / MiB * MiB;
	big = (big + MiB - 1) / MiB * MiB;
	small = small < 4 * MiB ? 4 * MiB : small; /* pool.pool_bytes' least */
	big = big < 8 * MiB ? 8 * MiB : big;
	size_t nkv = (size_t)CHUNK * 32 * 128;
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	kvbuf = malloc(nkv * sizeof(float));
	for (size_t i = 0; i < nkv; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		kvbuf[i] = (float)(rng >> 40) / (float)(1 << 24) - 0.5f;
	}
	const char *isa = tq_isa_name(tq_isa_best()); /* after TQ_ISA (--isa) caps it */
	char a[32], b[32], c[32];
	tq_size_format_human(set, a, sizeof(a));
	tq_size_format_human(small, b, sizeof(b));
	tq_size_format_human(prod_g, c, sizeof(c));
	if (!json)
		printf("tqbench pressure: %u layers x 8 KV heads (32 q) x d128, q8/tq4, isa %s; %d CPUs (%s)\n"
		       "  test: %u sessions x %u tokens = %s; small pool %s (prod guaranteed %s); spill in %s\n",
		       o.layers, isa, ncpu, ncpu >= 2 ? "prod pinned to CPU 0, the rest to CPU 1" : "shared",
		       o.sessions, o.window, a, b, c, o.dir);

	struct world w;
	/* 1. the spill tier alone */
	double wr, rd;
	if (world_new(&w, o.dir, big, prod_g, 4 * big) < 0 || spill_rates(&w, o.window * 4, &wr, &rd) < 0)
		return 1;
	/* 2. test alone, its set held by the pool */
	struct tenant_info ti;
	tenant_get_info(tenant_find(w.tt, "test"), &ti);
	uint64_t spilled_before = ti.pressure.spilled_bytes;
	struct test_run ta = { &w, &o, 0, NULL };
	pthread_t th;
	pthread_create(&th, NULL, test_main, &ta);
	pthread_join(th, NULL);
	tenant_get_info(tenant_find(w.tt, "test"), &ti);
	uint64_t alone_spilled = ti.pressure.spilled_bytes - spilled_before;
	world_free(&w, o.dir);

	/* 3. prod alone on the small pool */
	if (world_new(&w, o.dir, small, prod_g, 4 * big) < 0)
		return 1;
	struct prod_run pa = { &w, &o, NULL, 0, 0, 0 };
	pthread_create(&th, NULL, prod_main, &pa);
	pthread_join(th, NULL);

	/* 4. both */
	volatile int test_done = 0;
	struct test_run tp = { &w, &o, 0, &test_done };
	struct prod_run pp = { &w, &o, &test_done, 0, 0, 0 };
	pthread_t th2;
	struct reclaim_stats rs0, rs1;
	reclaim_stats(w.rc, &rs0);
	struct spill_stats ss0, ss1;
	spill_stats(w.sp, &ss0);
	double t0 = bench_now();
	pthread_create(&th2, NULL, prod_main, &pp);
	pthread_create(&th, NULL, test_main, &tp);
	pthread_join(th, NULL);
	pthread_join(th2, NULL);
	double dt = bench_now() - t0;
	reclaim_stats(w.rc, &rs1);
	spill_stats(w.sp, &ss1);
	struct tenant_info tprod, ttest;
	tenant_get_info(tenant_find(w.tt, "prod"), &tprod);
	tenant_get_info(tenant_find(w.tt, "test"), &ttest);
	double restore_rate = (double)(ss1.bytes_read - ss0.bytes_read) / dt;
	double reclaim_busy = (rs1.busy_us - rs0.busy_us) > 0
		? (double)(rs1.spilled_bytes - rs0.spilled_bytes) / ((double)(rs1.busy_us - rs0.busy_us) * 1e-6) : 0;

	/* 5. the reclaimer alone, 3 rounds; each paired with the tier's write
	 * rate (a session of as many bytes spilled whole, as in 1) just before
	 * and just after it (the disk of a cloud VM swings by 2x within
	 * seconds) */
	uint64_t freed;
	double rr[3], wrr[3], rrate = 0;
	/* a session of about what the reclaimer frees (45 % of the pool) */
	uint32_t base_tokens = (uint32_t)(small * 45 / 100 / (sess_bytes / o.window));
	for (int k = 0; k < 3; k++) {
		double before, after, rd2;
		if (spill_rates(&w, base_tokens, &before, &rd2) < 0)
			return 1;
		rr[k] = reclaim_rate(&w, o.window, &freed);
		if (spill_rates(&w, base_tokens, &after, &rd2) < 0)
			return 1;
		wrr[k] = rr[k] / ((before + after) / 2);
		rrate += rr[k] / 3;
	}
	qsort(wrr, 3, sizeof(double), cmp_d);
	world_free(&w, o.dir);

	double lat_ratio = pp.p99_ms / pa.p99_ms, thr_ratio = tp.tokens_per_s / ta.tokens_per_s;
	if (json) {
		printf("{\"suite\":\"pressure\",\"isa\":\"%s\",\"cpus\":%d,\"layers\":%u,\"test_set_bytes\":%" PRIu64
		       ",\"pool_bytes\":%" PRIu64 ",\"spill_write_Bps\":%.0f,\"spill_read_Bps\":%.0f,"
		       "\"prod_alone_p50_ms\":%.3f,\"prod_alone_p99_ms\":%.3f,\"prod_p50_ms\":%.3f,\"prod_p99_ms\":%.3f,"
		       "\"prod_p99_ratio\":%.3f,\"prod_waits\":%" PRIu64 ",\"prod_wait_max_us\":%" PRIu64
		       ",\"test_alone_tps\":%.0f,\"test_tps\":%.0f,\"test_ratio\":%.3f,\"test_restore_Bps\":%.0f,"
		       "\"restore_fraction\":%.3f,\"reclaim_Bps\":%.0f,\"reclaim_ratio\":%.3f,\"reclaim_busy_Bps\":%.0f}\n",
		       isa, ncpu, o.layers, set, small, wr, rd, pa.p50_ms, pa.p99_ms, pp.p50_ms, pp.p99_ms, lat_ratio,
		       tprod.pressure.waits, tprod.pressure.wait_max_us, ta.tokens_per_s, tp.tokens_per_s, thr_ratio,
		       restore_rate, restore_rate / rd, rrate, wrr[1], reclaim_busy);
		return 0;
	}
	printf("  spill tier alone:      write %.2f GB/s, read %.2f GB/s (whole session, median of 3)\n", wr / 1e9,
	       rd / 1e9);
	printf("  prod per-token p99:    %.3f ms under pressure vs %.3f ms alone = %.2fx (target <= 1.2)\n",
	       pp.p99_ms, pa.p99_ms, lat_ratio);
	printf("  prod per-token p50:    %.3f ms vs %.3f ms alone; %u tokens; %" PRIu64 " allocation waits, "
	       "longest %" PRIu64 " us; spilled %" PRIu64 " B\n", pp.p50_ms, pa.p50_ms, pp.tokens, tprod.pressure.waits,
	       tprod.pressure.wait_max_us, tprod.pressure.spilled_bytes);
	printf("  test throughput:       %.0f tok/s under pressure vs %.0f alone = %.2fx (target >= 0.5; alone "
	       "spilled %" PRIu64 " B)\n", tp.tokens_per_s, ta.tokens_per_s, thr_ratio, alone_spilled);
	printf("  test restores:         %.2f GB/s = %.2f of the tier's read rate; spilled %.2f GB, restored %.2f GB\n",
	       restore_rate / 1e9, restore_rate / rd, (double)ttest.pressure.spilled_bytes / 1e9,
	       (double)ttest.pressure.restored_bytes / 1e9);
	printf("  reclaimer:             frees %.2f GB/s (%.0f MiB to the low mark, mean of 3) = %.2f of the tier's "
	       "write rate (median of 3 ratios to a whole-session spill just before and after; target >= 0.8);\n"
	       "                         %.2f GB/s while spilling during run 4\n", rrate / 1e9, (double)freed / MiB,
	       wrr[1], reclaim_busy / 1e9);
	return 0;
}

TQ_BENCH_SUITE(pressure, "pressure [--dir DIR] [--layers L] [--ctx T] [--steps N] [--sessions S] [--window W] "
	       "[--isa I] [--json]", bench_pressure_main)
