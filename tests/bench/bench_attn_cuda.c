/* bench_attn_cuda.c — `tqbench attn --backend cuda`: the GPU kernels of
 * tq_cuda.h, and their baseline measured in the same run.
 *
 *   decode attention  tqc_attend, 1 query token at the last position, for
 *                     each --ctx and --batch B: B sessions (own pages, own
 *                     codec seeds, own queries), each attended by its own
 *                     host thread on its own tqc_ctx (CUDA stream), all
 *                     released at once — tqkvd's ring workers.  Figures: GPU
 *                     time per call (CUDA events: tqc_ctx_last_us) and wall
 *                     time per call (medians over every session's timed
 *                     calls), calls/s of all sessions, effective bandwidth =
 *                     the compressed bytes a call must read (K and V blocks
 *                     of every KV head over the context, tq_block_bytes) /
 *                     time, and its share of the device's peak.
 *   baseline          PyTorch scaled_dot_product_attention over a bf16 cache
 *                     of the same shape on the same GPU, batch B in one call
 *                     (scripts/bench-sdpa.py, run before any of our device
 *                     memory is allocated).  fused / sdpa compares one
 *                     decode step of all B sessions: the median GPU time of
 *                     a call at B = 1 (CUDA events on both sides), the wall
 *                     time of a round of B concurrent calls at B > 1.
 *   check             per context, one call against tq_attend_ref on the CPU
 *                     (relative error of the output norm; the contract is
 *                     1e-3), and session 0's output after each concurrent
 *                     run against the same reference.
 *   decode step       per context, session 0's last token appended again
 *                     and the attention after it (batch 1), as two calls and
 *                     as one tqc_append_attend (the attention queued behind
 *                     the append): GPU and wall time of each, and the GPU
 *                     time the append adds to the attention in the one call
 *                     (the target: <= 10 us a layer); the outputs of both
 *                     must be the same bits.
 *   quantize-append   tqc_append of one decode token into each layer of a
 *                     --layers model (GPU µs per layer; the target is
 *                     <= 10 µs) and of --bulk tokens at once (vectors/s),
 *                     each against tq_encode on the CPU; the blocks the GPU
 *                     wrote are compared byte for byte with tq_encode's.
 *
 * Pages: the synthetic K/V (bench_attn.h: keys shaped like post-RoPE keys)
 * are generated once for the longest context on --threads host threads;
 * every session encodes them with its own codec seeds (so its blocks are its
 * own) with tq_encode on the same threads, and the pages of all sessions are
 * copied into one device region (tqc_region_alloc, device memory) per
 * context.  The output says how long that took.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "bench_attn.h"
#include "tq_attn.h"
#include "tq_codec.h"
#include "tq_cuda.h"
#include "tq_threads.h"

#define WARMUP     5        /* untimed calls before the timed ones */
#define GEN_CHUNK  4096     /* tokens per synthetic-data task      */
#define CHECK_TOL  1e-3     /* tq_cuda.h: within 1e-3 of the output norm */
#define APPEND_TARGET_US 10.0
#define CPU_REPS_MAX 15     /* timed rounds of the CPU baselines   */

/* ---- helpers ------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Sorts v. */
static double median(double *v, size_t n)
{
	if (n == 0)
		return NAN;
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

/* ,"key":v — or null when v is not a finite number or !ok */
static void jnum(const char *key, double v, int ok)
{
	if (ok && isfinite(v))
		printf(",\"%s\":%.6g", key, v);
	else
		printf(",\"%s\":null", key);
}

/* ,"key":v as an integer (bytes, counts) — or null */
static void jint(const char *key, double v, int ok)
{
	if (ok && isfinite(v))
		printf(",\"%s\":%.0f", key, v);
	else
		printf(",\"%s\":null", key);
}

/* Host memory the GPU copies from quickly: pinned if the runtime gives it. */
static void *host_alloc(int device, size_t bytes, int *pinned)
{
	void *p = tqc_pinned_alloc(device, bytes);

	*pinned = p != NULL;
	if (!p)
		p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
	if (p)
		memset(p, 0, bytes);
	return p;
}

static void host_free(void *p, int pinned)
{
	if (pinned)
		tqc_pinned_free(p);
	else
		free(p);
}

static double rel_err(const float *a, const float *ref, size_t n)
{
	double d = 0.0, r = 0.0;

	for (size_t i = 0; i < n; i++) {
		double x = (double)a[i] - ref[i];
		d += x * x;
		r += (double)ref[i] * ref[i];
	}
	return sqrt(d) / (sqrt(r) + 1e-300);
}

static const char *mib(double bytes, char *buf, size_t n)
{
	if (bytes >= (double)(1ull << 30))
		snprintf(buf, n, "%.2f GiB", bytes / (double)(1ull << 30));
	else
		snprintf(buf, n, "%.1f MiB", bytes / (double)(1ull << 20));
	return buf;
}

/* ---- the bench's state ---------------------------------------------------------- */

struct sess {
	int idx;
	tqc_ctx *x;
	tq_codec *kc, *vc;
	float q[NQH * DIM];
	int32_t pos;
	float *out;                       /* [NQH][DIM], pinned if possible */
	int out_pinned;
	const uint8_t **pages;            /* device page pointers           */
	struct tq_page_table t;
	float sparse_v;                   /* the timed calls' (0: exact)    */
	struct tq_attn_stats *stats;      /* with sparse_v: shared, atomic  */
	/* one timed run */
	struct gate *gate;
	int reps;
	double *gpu_us, *wall_us;         /* [reps]                         */
	double t_end;
	int n_shared;                     /* timed calls planned as sharing */
	char plan[128];                   /* the GPU (tqc_attn_inflight)    */
	int rc;
	tq_error err;
};

struct synth {
	float *k, *v;                     /* [NKV][tmax][DIM] */
	uint32_t tmax;
};

struct sdpa_case {
	uint32_t ctx;
	int batch;
	int ok;
	double ms, bytes;
	char variant[16];
	char why[160];
};

struct baseline {
	int avail;
	char why[256];                    /* when !avail */
	char gpu[128];
	char torch[48];
	struct sdpa_case c[ATTN_CUDA_MAX_LIST * ATTN_CUDA_MAX_LIST];
	int n;
};

struct bench {
	const struct attn_cuda_opts *o;
	struct tqc_device_info dev;
	tq_cache *cbs;
	tq_threads *pool;
	struct sess *s;                   /* [max_batch] */
	int max_batch;
	struct synth d;
	struct baseline bl;
	struct tq_page_geom g;
	size_t page_bytes;
	double kv_bytes_per_token;        /* K + V blocks of all KV heads */
	int failed;
};

/* ---- synthetic K/V and the CPU encoding of the pages ---------------------------- */

static void synth_task(void *arg, int task, int thread)
{
	struct synth *d = arg;
	int side = task % 2;
	uint32_t h = (uint32_t)(task / 2) % NKV, c = (uint32_t)(task / 2) / NKV;
	uint32_t t0 = c * GEN_CHUNK, n = d->tmax - t0 < GEN_CHUNK ? d->tmax - t0 : GEN_CHUNK;
	struct rng r = { (0x9E3779B97F4A7C15ULL * (uint64_t)(task + 1)) ^ 0xD1B54A32D192ED03ULL };
	float *dst = (side ? d->v : d->k) + ((size_t)h * d->tmax + t0) * DIM;

	for (uint32_t i = 0; i < n; i++) {
		if (side)
			gen_value(&r, dst + (size_t)i * DIM, DIM);
		else
			gen_key(&r, dst + (size_t)i * DIM, DIM);
	}
	(void)thread;
}

struct enc_job {
	const struct synth *d;
	uint32_t T;
	const struct tq_page_geom *g;
	size_t page_bytes;
	const tq_codec *kc, *vc;
	uint8_t *mem;                     /* [n_pages][page_bytes] */
	int failed;
	tq_error err;
};

static void enc_task(void *arg, int task, int thread)
{
	struct enc_job *j = arg;
	uint32_t pt = j->g->page_tokens, p = (uint32_t)task / NKV, h = (uint32_t)task % NKV;
	uint32_t t0 = p * pt, n = j->T - t0 < pt ? j->T - t0 : pt;
	uint8_t *pg = j->mem + (size_t)p * j->page_bytes;
	size_t src = ((size_t)h * j->d->tmax + t0) * DIM;
	tq_error e;

	if (tq_encode(j->kc, j->d->k + src, TQ_DTYPE_F32, n, pg + tq_page_k_off(j->g, h, 0), &e) < 0 ||
	    tq_encode(j->vc, j->d->v + src, TQ_DTYPE_F32, n, pg + tq_page_v_off(j->g, h, 0), &e) < 0) {
		if (!__atomic_exchange_n(&j->failed, 1, __ATOMIC_ACQ_REL))
			j->err = e;
	}
	(void)thread;
}

/* ---- the baseline: scripts/bench-sdpa.py ------------------------------------------ */

/* 'it'\''s' */
static void sh_quote(char *dst, size_t n, const char *s)
{
	size_t o = 0;

	if (n < 3) {
		*dst = '\0';
		return;
	}
	dst[o++] = '\'';
	for (; *s && o + 6 < n; s++) {
		if (*s == '\'') {
			memcpy(dst + o, "'\\''", 4);
			o += 4;
		} else {
			dst[o++] = *s;
		}
	}
	dst[o++] = '\'';
	dst[o] = '\0';
}

/* scripts/bench-sdpa.py: under $TQ_SRC, the current directory (the
 * repository root), or next to the binary (build/bin/tqbench). */
static int find_script(char *path, size_t n)
{
	const char *src = getenv("TQ_SRC");
	char exe[4096];
	ssize_t len;

	if (src && *src) {
		snprintf(path, n, "%s/scripts/bench-sdpa.py", src);
		if (access(path, R_OK) == 0)
			return 0;
	}
	snprintf(path, n, "scripts/bench-sdpa.py");
	if (access(path, R_OK) == 0)
		return 0;
	if ((len = readlink("/proc/self/exe", exe, sizeof(exe) - 1)) > 0) {
		exe[len] = '\0';
		char *sl = strrchr(exe, '/');
		if (sl) {
			*sl = '\0';
			snprintf(path, n, "%s/../../scripts/bench-sdpa.py", exe);
			if (access(path, R_OK) == 0)
				return 0;
		}
	}
	return -1;
}

/* The value of "key" in a one-line JSON object: a pointer just past the colon. */
static const char *json_find(const char *line, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\"", key);
	if (!(p = strstr(line, pat)))
		return NULL;
	p += strlen(pat);
	while (*p == ' ')
		p++;
	if (*p++ != ':')
		return NULL;
	while (*p == ' ')
		p++;
	return p;
}

static int json_get_num(const char *line, const char *key, double *out)
{
	const char *p = json_find(line, key);
	char *end;

	if (!p)
		return -1;
	*out = strtod(p, &end);
	return end == p ? -1 : 0;
}

static int json_get_str(const char *line, const char *key, char *out, size_t n)
{
	const char *p = json_find(line, key);
	size_t o = 0;

	if (!p || *p != '"' || n == 0)
		return -1;
	for (p++; *p && *p != '"'; p++) {
		if (*p == '\\' && p[1])
			p++;
		if (o + 1 < n)
			out[o++] = *p;
	}
	out[o] = '\0';
	return 0;
}

static void run_baseline(struct bench *b)
{
	const struct attn_cuda_opts *o = b->o;
	struct baseline *bl = &b->bl;
	char script[4200], qs[8500], qp[600], cmd[12000], ctxs[256] = "", batches[256] = "";
	char line[2048], last[256] = "", err[256] = "";
	const char *py = getenv("TQ_PYTHON");
	size_t l;
	FILE *f;

	if (!o->baseline) {
		snprintf(bl->why, sizeof(bl->why), "--no-baseline");
		return;
	}
	if (find_script(script, sizeof(script)) < 0) {
		snprintf(bl->why, sizeof(bl->why), "scripts/bench-sdpa.py not found: run from the "
			 "repository root or set TQ_SRC");
		return;
	}
	for (int i = 0; i < o->n_ctx; i++) {
		l = strlen(ctxs);
		snprintf(ctxs + l, sizeof(ctxs) - l, "%s%u", i ? "," : "", o->ctx[i]);
	}
	for (int i = 0; i < o->n_batch; i++) {
		l = strlen(batches);
		snprintf(batches + l, sizeof(batches) - l, "%s%d", i ? "," : "", o->batch[i]);
	}
	sh_quote(qs, sizeof(qs), script);
	sh_quote(qp, sizeof(qp), py && *py ? py : "python3");
	snprintf(cmd, sizeof(cmd), "%s %s --ctx %s --batch %s --q-heads %d --kv-heads %d --dim %d "
		 "--device %d --iters %d --warmup %d 2>&1", qp, qs, ctxs, batches, NQH, NKV, DIM,
		 o->device, o->reps, WARMUP);
	fflush(stdout);
	fflush(stderr);
	if (!(f = popen(cmd, "r"))) {
		snprintf(bl->why, sizeof(bl->why), "cannot run %s: %s", py && *py ? py : "python3",
			 strerror(errno));
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\r\n")] = '\0';
		if (line[0] != '{') {
			if (line[0])
				snprintf(last, sizeof(last), "%.200s", line);
			continue;
		}
		double ctx, batch;
		int has_case = json_get_num(line, "ctx", &ctx) == 0 && json_get_num(line, "batch", &batch) == 0;
		char why[160] = "";
		json_get_str(line, "error", why, sizeof(why));
		if (!has_case) {
			if (why[0])
				snprintf(err, sizeof(err), "%s", why);
			continue;
		}
		if (bl->n == (int)(sizeof(bl->c) / sizeof(bl->c[0])))
			continue;
		struct sdpa_case *c = &bl->c[bl->n++];
		memset(c, 0, sizeof(*c));
		c->ctx = (uint32_t)ctx;
		c->batch = (int)batch;
		if (why[0]) {
			snprintf(c->why, sizeof(c->why), "%s", why);
		} else if (json_get_num(line, "ms", &c->ms) == 0 && json_get_num(line, "bytes", &c->bytes) == 0) {
			c->ok = 1;
			json_get_str(line, "variant", c->variant, sizeof(c->variant));
			if (!bl->gpu[0])
				json_get_str(line, "gpu", bl->gpu, sizeof(bl->gpu));
			if (!bl->torch[0])
				json_get_str(line, "torch", bl->torch, sizeof(bl->torch));
		} else {
			snprintf(c->why, sizeof(c->why), "no ms/bytes in the script's line");
		}
	}
	int st = pclose(f);
	int ok = 0;
	for (int i = 0; i < bl->n; i++)
		ok += bl->c[i].ok;
	if (ok) {
		bl->avail = 1;
		return;
	}
	if (err[0])
		snprintf(bl->why, sizeof(bl->why), "%s", err);
	else if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 127)
		snprintf(bl->why, sizeof(bl->why), "%s not found (set TQ_PYTHON)",
			 py && *py ? py : "python3");
	else if (bl->n)
		snprintf(bl->why, sizeof(bl->why), "%s", bl->c[0].why);
	else if (last[0])
		snprintf(bl->why, sizeof(bl->why), "%s", last);
	else
		snprintf(bl->why, sizeof(bl->why), "bench-sdpa.py exited with status %d and no result",
			 st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

static const struct sdpa_case *sdpa_find(const struct baseline *bl, uint32_t ctx, int batch)
{
	for (int i = 0; i < bl->n; i++)
		if (bl->c[i].ctx == ctx && bl->c[i].batch == batch)
			return &bl->c[i];
	return NULL;
}

/* ---- concurrent decode calls ------------------------------------------------------ */

struct gate {
	pthread_mutex_t m;
	pthread_cond_t c;
	int ready, go, abort;
	double t0;
};

static struct tq_attn_params attn_params(const struct sess *s, const struct tq_page_table *t, float *out)
{
	struct tq_attn_params p = {
		.k_codec = s->kc, .v_codec = s->vc, .n_q_heads = NQH, .kv = t, .n_q = 1, .q = s->q,
		.q_dtype = TQ_DTYPE_F32, .q_pos = &s->pos, .causal = 1, .sparse_v = s->sparse_v, .stats = s->stats,
		.out = out,
	};
	return p;
}

static void *attn_thread(void *arg)
{
	struct sess *s = arg;
	struct gate *g = s->gate;
	struct tq_attn_params p = attn_params(s, &s->t, s->out);

	s->rc = 0;
	for (int i = 0; i < WARMUP && !s->rc; i++)
		s->rc = tqc_attend(s->x, &p, &s->err);
	pthread_mutex_lock(&g->m);
	g->ready++;
	pthread_cond_broadcast(&g->c);
	while (!g->go)
		pthread_cond_wait(&g->c, &g->m);
	int abort_run = g->abort;
	pthread_mutex_unlock(&g->m);
	s->n_shared = 0;
	for (int i = 0; i < s->reps && !s->rc && !abort_run; i++) {
		double t = bench_now();
		s->rc = tqc_attend(s->x, &p, &s->err);
		s->wall_us[i] = (bench_now() - t) * 1e6;
		s->gpu_us[i] = tqc_ctx_last_us(s->x);
		const char *plan = tqc_ctx_last_attn_plan(s->x);
		if (strstr(plan, "(GPU shared)")) {
			s->n_shared++;
			snprintf(s->plan, sizeof(s->plan), "%s", plan);
		}
	}
	s->t_end = bench_now();
	return NULL;
}

/* B sessions at once; medians over all B x reps calls.  0 or -1. */
static int run_batch(struct bench *b, int B, double *gpu_ms, double *wall_ms, double *round_ms)
{
	const int reps = b->o->reps;
	struct gate g = { .m = PTHREAD_MUTEX_INITIALIZER, .c = PTHREAD_COND_INITIALIZER };
	pthread_t *th = calloc((size_t)B, sizeof(*th));
	double *gpu = malloc((size_t)B * reps * sizeof(double)), *wall = malloc((size_t)B * reps * sizeof(double));
	int started = 0, rc = -1;

	if (!th || !gpu || !wall) {
		fprintf(stderr, "tqbench attn: out of memory\n");
		goto out;
	}
	for (int i = 0; i < B; i++) {
		struct sess *s = &b->s[i];
		s->gate = &g;
		s->reps = reps;
		s->gpu_us = gpu + (size_t)i * reps;
		s->wall_us = wall + (size_t)i * reps;
		s->rc = 0;
		int e = pthread_create(&th[i], NULL, attn_thread, s);
		if (e) {
			fprintf(stderr, "tqbench attn: pthread_create: %s\n", strerror(e));
			break;
		}
		started++;
	}
	pthread_mutex_lock(&g.m);
	if (started < B)
		g.abort = 1;
	else
		while (g.ready < B)
			pthread_cond_wait(&g.c, &g.m);
	g.go = 1;
	g.t0 = bench_now();
	pthread_cond_broadcast(&g.c);
	pthread_mutex_unlock(&g.m);
	double t_end = g.t0;
	for (int i = 0; i < started; i++) {
		pthread_join(th[i], NULL);
		if (b->s[i].t_end > t_end)
			t_end = b->s[i].t_end;
	}
	if (started < B)
		goto out;
	for (int i = 0; i < B; i++)
		if (b->s[i].rc) {
			fprintf(stderr, "tqbench attn: tqc_attend, session %d of %d: %s\n", i, B, b->s[i].err.msg);
			goto out;
		}
	*gpu_ms = median(gpu, (size_t)B * reps) / 1e3;
	*wall_ms = median(wall, (size_t)B * reps) / 1e3;
	*round_ms = (t_end - g.t0) * 1e3 / reps;
	rc = 0;
out:
	for (int i = 0; i < B; i++) {
		b->s[i].gate = NULL;
		b->s[i].gpu_us = b->s[i].wall_us = NULL;
	}
	free(th);
	free(gpu);
	free(wall);
	return rc;
}

/* The batch again with sparse-V at --sparse, after the exact one (gpu_ms,
 * round_ms): its time against the exact call's, the share of value chunks
 * skipped, how far session 0's output moved from its exact output (in L2,
 * relative to the output's norm; the bound is sparse_v x the largest value
 * norm). */
static void run_sparse(struct bench *b, int B, double gpu_ms, double round_ms, uint32_t T)
{
	const struct attn_cuda_opts *o = b->o;
	struct tq_attn_stats st = { 0, 0 };
	float *exact = malloc(sizeof(float) * NQH * DIM);
	double sg, sw, sr;

	if (!exact) {
		b->failed = 1;
		return;
	}
	memcpy(exact, b->s[0].out, sizeof(float) * NQH * DIM);
	for (int i = 0; i < B; i++) {
		b->s[i].sparse_v = o->sparse;
		b->s[i].stats = &st;
	}
	int rc = run_batch(b, B, &sg, &sw, &sr);
	for (int i = 0; i < B; i++) {
		b->s[i].sparse_v = 0.0f;
		b->s[i].stats = NULL;
	}
	if (rc < 0) {
		b->failed = 1;
		free(exact);
		return;
	}
	const double moved = rel_err(b->s[0].out, exact, (size_t)NQH * DIM);
	const double share = st.v_chunks ? (double)st.v_skipped / (double)st.v_chunks : NAN;
	const double step = B == 1 ? sg : sr, step0 = B == 1 ? gpu_ms : round_ms;
	if (o->json) {
		printf("{\"suite\":\"attn\",\"backend\":\"cuda\",\"mode\":\"decode-sparse\",\"ctx\":%u,\"batch\":%d,"
		       "\"k\":\"%s\",\"v\":\"%s\",\"q_scale\":%g,\"sparse_v\":%g", T, B, tq_codec_name(o->k),
		       tq_codec_name(o->v), (double)(o->q_scale > 0.0f ? o->q_scale : 1.0f), (double)o->sparse);
		jnum("gpu_ms", sg, 1);
		jnum("round_ms", sr, 1);
		jnum("exact_gpu_ms", gpu_ms, 1);
		jnum("exact_round_ms", round_ms, 1);
		jnum("vs_exact", step / step0, 1);
		jnum("skipped_share", share, st.v_chunks > 0);
		jnum("moved", moved, 1);
		printf("}\n");
	} else {
		printf("    sparse-V %g (queries x %g): GPU %.4f ms/call", (double)o->sparse,
		       (double)(o->q_scale > 0.0f ? o->q_scale : 1.0f), sg);
		if (B > 1)
			printf(", round %.4f ms", sr);
		printf(": %.3f x the exact call (%s); %.1f %% of %llu value chunks skipped; session 0's "
		       "output moved %.2e of its norm\n", step / step0, B == 1 ? "GPU time" : "round",
		       100.0 * share, (unsigned long long)st.v_chunks, moved);
	}
	free(exact);
}

/* ---- --phases: where the tiled kernel's time goes ------------------------------ */

/* The per-call figures of --phases (ns), medians over the calls. */
enum {
	PH_SPAN,      /* first CTA's entry to the last CTA's exit (%globaltimer) */
	PH_RAMP,      /* first to last CTA's entry */
	PH_TAIL,      /* first to last CTA's exit */
	PH_QROT_MED,  /* per CTA (median, max over CTAs): entry to the first barrier */
	PH_QROT_MAX,
	PH_TAB_MED,   /* the decode tables */
	PH_TAB_MAX,
	PH_TILE1_MED, /* the tables' barrier to warp 0's first tile landed */
	PH_TILE1_MAX,
	PH_LOOP_MED,  /* warp 0's first tile landed to the last warp out of the loop */
	PH_LOOP_MAX,
	PH_SPREAD_MED, /* the first warp out of the loop to the last */
	PH_SPREAD_MAX,
	PH_PART_MED,  /* the last warp out of the loop to the partials' barrier */
	PH_PART_MAX,
	PH_MERGE_MED, /* the merging CTAs: the partials' barrier to their exit */
	PH_MERGE_MAX,
	PH_CTA_MED,   /* a CTA's whole time, entry to exit */
	PH_CTA_MAX,
	PH_CRIT_START, /* the CTA that exits last: its entry after the first CTA's */
	PH_CRIT_CTA,   /* its own time */
	PH_NS_CYCLE,  /* ns per SM cycle: (gt_end - gt_entry) / (c_end - c_entry), median over CTAs */
	PH_N
};

static double ph_med(double *v, size_t n) { return n ? median(v, n) : NAN; }

static double ph_max(const double *v, size_t n)
{
	double m = NAN;
	for (size_t i = 0; i < n; i++)
		if (!(v[i] <= m))
			m = v[i];
	return m;
}

/* A CTA's record in order: written, its clocks rising phase by phase. */
static int ph_ok(const struct tqc_phase_rec *c)
{
	return c->written && c->c_entry <= c->c_qrot && c->c_qrot <= c->c_tables &&
	       (!c->c_tile1 || (c->c_tables <= c->c_tile1 && c->c_tile1 <= c->c_loop_first)) &&
	       c->c_loop_first <= c->c_loop_last && c->c_loop_last <= c->c_part && c->c_part <= c->c_end &&
	       c->gt_entry <= c->gt_end;
}

/* One call's records (n CTAs) into f[PH_N] (NaN where no record is in
 * order); the shape into the rest.  The number of records out of order
 * (left out of the figures), or -1 (out of memory). */
static int ph_call(const struct tqc_phase_rec *r, uint32_t n, double *f, uint32_t *sms, uint32_t *per_sm_max,
		   uint32_t *tiles_min, uint32_t *tiles_max)
{
	enum { NSM = 4096 };
	double *v[8];
	size_t nm = 0, m = 0;
	int bad = 0;
	uint32_t *on_sm = calloc(NSM, sizeof(uint32_t));

	for (int i = 0; i < 8; i++)
		v[i] = malloc(sizeof(double) * n);
	if (!on_sm || !v[0] || !v[1] || !v[2] || !v[3] || !v[4] || !v[5] || !v[6] || !v[7]) {
		for (int i = 0; i < 8; i++)
			free(v[i]);
		free(on_sm);
		return -1;
	}
	for (int k = 0; k < PH_N; k++)
		f[k] = NAN;
	uint64_t g0 = UINT64_MAX, g1 = 0, e_max = 0, x_min = UINT64_MAX;
	uint32_t crit = 0;
	*tiles_min = UINT32_MAX, *tiles_max = 0, *sms = 0, *per_sm_max = 0;
	/* cycles to ns: the median ratio over the CTAs (the globaltimer's
	 * resolution may be coarse; the median of many CTAs is not) */
	for (uint32_t i = 0; i < n; i++) {
		const struct tqc_phase_rec *c = &r[i];
		if (!ph_ok(c)) {
			bad++;
			continue;
		}
		if (c->c_end > c->c_entry && c->gt_end > c->gt_entry)
			v[0][m++] = (double)(c->gt_end - c->gt_entry) / (double)(c->c_end - c->c_entry);
		g0 = c->gt_entry < g0 ? c->gt_entry : g0;
		e_max = c->gt_entry > e_max ? c->gt_entry : e_max;
		x_min = c->gt_end < x_min ? c->gt_end : x_min;
		if (c->gt_end >= g1)
			g1 = c->gt_end, crit = i;
		*tiles_min = c->tiles < *tiles_min ? c->tiles : *tiles_min;
		*tiles_max = c->tiles > *tiles_max ? c->tiles : *tiles_max;
		if (c->smid < NSM && on_sm[c->smid]++ == 0)
			(*sms)++;
		if (c->smid < NSM && on_sm[c->smid] > *per_sm_max)
			*per_sm_max = on_sm[c->smid];
	}
	if ((uint32_t)bad == n)
		goto out;
	const double k = m ? median(v[0], m) : NAN;
	f[PH_NS_CYCLE] = k;
	f[PH_SPAN] = (double)(g1 - g0);
	f[PH_RAMP] = (double)(e_max - g0);
	f[PH_TAIL] = (double)(g1 - x_min);
	m = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct tqc_phase_rec *c = &r[i];
		if (!ph_ok(c))
			continue;
		const uint64_t t1 = c->c_tile1 ? c->c_tile1 : c->c_tables;
		v[0][m] = k * (double)(c->c_qrot - c->c_entry);
		v[1][m] = k * (double)(c->c_tables - c->c_qrot);
		v[2][m] = k * (double)(t1 - c->c_tables);
		v[3][m] = k * (double)(c->c_loop_last - t1);
		v[4][m] = k * (double)(c->c_loop_last - c->c_loop_first);
		v[5][m] = k * (double)(c->c_part - c->c_loop_last);
		v[7][m] = k * (double)(c->c_end - c->c_entry);
		if (c->last)
			v[6][nm++] = k * (double)(c->c_end - c->c_part);
		m++;
	}
	for (int i = 0; i < 6; i++) {
		f[PH_QROT_MED + 2 * i] = ph_med(v[i], m);
		f[PH_QROT_MAX + 2 * i] = ph_max(v[i], m);
	}
	f[PH_MERGE_MED] = ph_med(v[6], nm);
	f[PH_MERGE_MAX] = ph_max(v[6], nm);
	f[PH_CTA_MED] = ph_med(v[7], m);
	f[PH_CTA_MAX] = ph_max(v[7], m);
	f[PH_CRIT_START] = (double)(r[crit].gt_entry - g0);
	f[PH_CRIT_CTA] = k * (double)(r[crit].c_end - r[crit].c_entry);
out:
	for (int i = 0; i < 8; i++)
		free(v[i]);
	free(on_sm);
	return bad;
}

/* --phases N: N calls of session 0 with attn_mma's phase clocks armed (a
 * build with TQC_PHASES: tqbench-phases), and where a CTA's time went. */
static void run_phases(struct bench *b, uint32_t T)
{
	const struct attn_cuda_opts *o = b->o;
	const int N = o->phases;
	const uint32_t cap = 1u << 16;
	struct tqc_phase_rec *r = malloc(sizeof(*r) * cap);
	double *f = malloc(sizeof(double) * PH_N * (size_t)N), col[1024], med[PH_N];
	struct sess *s = &b->s[0];
	struct tq_attn_params p = attn_params(s, &s->t, s->out);
	uint32_t n = 0, grid[3] = { 0, 0, 0 }, warps = 0, sms = 0, per_sm = 0, tmin = 0, tmax = 0;
	int bad = 0, calls = 0;
	char why[256];
	tq_error err;

	if (!r || !f) {
		fprintf(stderr, "tqbench attn: --phases: out of memory\n");
		b->failed = 1;
		goto out;
	}
	if (tqc_phases_arm(o->device, cap, why, sizeof(why)) < 0) {
		fprintf(stderr, "tqbench attn: --phases: %s\n", why);
		b->failed = 1;
		goto out;
	}
	for (; calls < N; calls++) {
		if (tqc_attend(s->x, &p, &err) < 0) {
			fprintf(stderr, "tqbench attn: --phases: tqc_attend: %s\n", err.msg);
			b->failed = 1;
			break;
		}
		if (strcmp(tqc_ctx_last_attn(s->x), "mma")) {
			fprintf(stderr, "tqbench attn: --phases: the call ran the %s kernel, which has no phase clocks\n",
				tqc_ctx_last_attn(s->x));
			b->failed = 1;
			break;
		}
		if (tqc_phases_take(r, cap, &n, why, sizeof(why)) < 0 || n == 0) {
			fprintf(stderr, "tqbench attn: --phases: %s\n", n ? why : "the call wrote no phase records");
			b->failed = 1;
			break;
		}
		int e = ph_call(r, n, f + (size_t)calls * PH_N, &sms, &per_sm, &tmin, &tmax);
		if (e < 0) {
			fprintf(stderr, "tqbench attn: --phases: out of memory\n");
			b->failed = 1;
			break;
		}
		bad += e;
		memcpy(grid, r[0].grid, sizeof(grid));
		warps = r[0].warps;
	}
	tqc_phases_disarm();
	if (calls < N)
		goto out;
	for (int k = 0; k < PH_N; k++) {
		int m = 0;
		for (int c = 0; c < N && m < 1024; c++)
			if (isfinite(f[(size_t)c * PH_N + k]))
				col[m++] = f[(size_t)c * PH_N + k];
		med[k] = m ? median(col, (size_t)m) : NAN;
	}
	if (bad) {
		fprintf(stderr, "tqbench attn: --phases: %d records out of order (a CTA's clocks must rise)\n", bad);
		b->failed = 1;
	}
	if (o->json) {
		static const char *const key[PH_N] = {
			"span_us", "ramp_us", "tail_us", "qrot_us", "qrot_max_us", "tables_us", "tables_max_us",
			"first_tile_us", "first_tile_max_us", "loop_us", "loop_max_us", "warp_spread_us",
			"warp_spread_max_us", "partials_us", "partials_max_us", "merge_us", "merge_max_us", "cta_us",
			"cta_max_us", "critical_start_us", "critical_cta_us", "ns_per_cycle",
		};
		printf("{\"suite\":\"attn\",\"backend\":\"cuda\",\"mode\":\"phases\",\"ctx\":%u,\"k\":\"%s\",\"v\":\"%s\","
		       "\"calls\":%d,\"ctas\":%u,\"grid\":[%u,%u,%u],\"warps\":%u,\"sms\":%u,\"ctas_per_sm_max\":%u,"
		       "\"tiles_min\":%u,\"tiles_max\":%u,\"out_of_order\":%d", T, tq_codec_name(o->k),
		       tq_codec_name(o->v), N, n, grid[0], grid[1], grid[2], warps, sms, per_sm, tmin, tmax, bad);
		for (int k = 0; k < PH_N; k++)
			jnum(key[k], k == PH_NS_CYCLE ? med[k] : med[k] / 1e3, isfinite(med[k]));
		printf("}\n");
	} else {
#define US(k) (med[k] / 1e3)
		printf("  phases (tiled kernel; medians of %d calls; per CTA: median / max over its %u CTAs):\n", N, n);
		printf("    %u CTAs (%u x %u splits x %u KV heads) of %u warps on %u SMs (at most %u an SM), "
		       "%u-%u tiles of 32 keys a CTA; SM clock %.0f MHz (by the timers)\n", n, grid[0], grid[1], grid[2],
		       warps, sms, per_sm, tmin, tmax, 1e3 / med[PH_NS_CYCLE]);
		printf("    kernel span %.2f us: CTAs start over %.2f us, end over %.2f us; a CTA %.2f / %.2f us\n",
		       US(PH_SPAN), US(PH_RAMP), US(PH_TAIL), US(PH_CTA_MED), US(PH_CTA_MAX));
		printf("    queries and codebooks %.2f / %.2f us; decode tables %.2f / %.2f; first tile's wait %.2f / %.2f\n",
		       US(PH_QROT_MED), US(PH_QROT_MAX), US(PH_TAB_MED), US(PH_TAB_MAX), US(PH_TILE1_MED),
		       US(PH_TILE1_MAX));
		printf("    tile loop %.2f / %.2f us (first to last warp out: %.2f / %.2f); partials %.2f / %.2f; "
		       "merge (the last CTA of each row block) %.2f / %.2f\n", US(PH_LOOP_MED), US(PH_LOOP_MAX),
		       US(PH_SPREAD_MED), US(PH_SPREAD_MAX), US(PH_PART_MED), US(PH_PART_MAX), US(PH_MERGE_MED),
		       US(PH_MERGE_MAX));
		printf("    the CTA that ends last: starts %.2f us after the first, runs %.2f us\n", US(PH_CRIT_START),
		       US(PH_CRIT_CTA));
#undef US
	}
out:
	free(r);
	free(f);
}

/* ---- one context --------------------------------------------------------------- */

/* One layer's decode step of session 0 at context T, batch 1: its last
 * token appended again (the same K/V: the same blocks, so its pages do not
 * change) and the attention over the T tokens, as two calls (tqc_append,
 * tqc_attend) and as one (tqc_append_attend: the attention queued behind
 * the append), alternated.  Prints both, and what the append adds to the
 * attention's GPU time in the one call (the target: <= 10 us a
 * layer).  ref: the CPU oracle's output for the step, or NULL.  0 or -1. */
static int run_step(struct bench *b, uint32_t T, const float *ref)
{
	const struct attn_cuda_opts *o = b->o;
	const int reps = o->reps, dev = o->device;
	struct sess *s = &b->s[0];
	tqc_ctx *x = s->x;
	const size_t tok = (size_t)NKV * DIM, ob = sizeof(float) * NQH * DIM;
	int kp = 0, vp = 0, rc = -1, fused = 1;
	float *kin = host_alloc(dev, tok * sizeof(float), &kp), *vin = host_alloc(dev, tok * sizeof(float), &vp);
	float *out2 = malloc(ob), *out1 = malloc(ob);
	double *g2 = malloc(sizeof(double) * reps), *w2 = malloc(sizeof(double) * reps);
	double *g1 = malloc(sizeof(double) * reps), *w1 = malloc(sizeof(double) * reps);
	double *ga = malloc(sizeof(double) * reps), *ge = malloc(sizeof(double) * reps);
	tq_error e;
	uint32_t bad;
	int stage;

	if (!kin || !vin || !out2 || !out1 || !g2 || !w2 || !g1 || !w1 || !ga || !ge) {
		fprintf(stderr, "tqbench attn: step: out of host memory\n");
		goto out;
	}
	for (uint32_t h = 0; h < NKV; h++) { /* token T - 1, [NKV][DIM] */
		memcpy(kin + (size_t)h * DIM, b->d.k + ((size_t)h * b->d.tmax + T - 1) * DIM, DIM * sizeof(float));
		memcpy(vin + (size_t)h * DIM, b->d.v + ((size_t)h * b->d.tmax + T - 1) * DIM, DIM * sizeof(float));
	}
	struct tq_page_table at = s->t; /* the append's view: T - 1 tokens */
	at.n_tokens = T - 1;
	struct tqc_append a = { .k_codec = s->kc, .v_codec = s->vc, .kv = &at, .pos = T - 1, .n = 1, .k = kin,
				.v = vin, .dtype = TQ_DTYPE_F32 };
	struct tq_attn_params p2 = attn_params(s, &s->t, out2), p1 = attn_params(s, &s->t, out1);
	p2.sparse_v = p1.sparse_v = 0.0f; /* exact */
	p2.stats = p1.stats = NULL;
	for (int i = 0; i < WARMUP + reps; i++) {
		double t0 = bench_now();
		if (tqc_append(x, &a, &bad, &e) < 0)
			goto fail;
		const double ua = tqc_ctx_last_us(x);
		if (tqc_attend(x, &p2, &e) < 0)
			goto fail;
		const double t1 = bench_now(), ue = tqc_ctx_last_us(x);
		if (tqc_append_attend(x, &a, &p1, &bad, &stage, &e) < 0)
			goto fail;
		const double t2 = bench_now();
		fused &= tqc_ctx_last_fused(x);
		if (i >= WARMUP) {
			const int k = i - WARMUP;
			ga[k] = ua;
			ge[k] = ue;
			g2[k] = ua + ue;
			w2[k] = (t1 - t0) * 1e6;
			g1[k] = tqc_ctx_last_us(x);
			w1[k] = (t2 - t1) * 1e6;
		}
	}
	const int same = memcmp(out1, out2, ob) == 0;
	const double err = ref ? rel_err(out1, ref, (size_t)NQH * DIM) : NAN;
	const int ok = same && (!ref || err <= CHECK_TOL);
	const double ma = median(ga, reps), me = median(ge, reps), m2 = median(g2, reps), mw2 = median(w2, reps);
	const double m1 = median(g1, reps), mw1 = median(w1, reps), adds = m1 - me;
	if (o->json) {
		printf("{\"suite\":\"attn\",\"backend\":\"cuda\",\"mode\":\"decode-step\",\"ctx\":%u,\"batch\":1,"
		       "\"k\":\"%s\",\"v\":\"%s\",\"input\":\"%s\",\"fused\":%s", T, tq_codec_name(o->k),
		       tq_codec_name(o->v), kp && vp ? "pinned" : "pageable", fused ? "true" : "false");
		jnum("two_calls_gpu_us", m2, 1);
		jnum("append_gpu_us", ma, 1);
		jnum("attend_gpu_us", me, 1);
		jnum("two_calls_wall_us", mw2, 1);
		jnum("one_call_gpu_us", m1, 1);
		jnum("one_call_wall_us", mw1, 1);
		jnum("one_vs_two_wall", mw1 / mw2, 1);
		jnum("append_adds_gpu_us", adds, 1);
		printf(",\"target_us_per_layer\":%.0f,\"target_met\":%s", APPEND_TARGET_US,
		       adds <= APPEND_TARGET_US ? "true" : "false");
		jnum("rel_err", err, ref != NULL);
		printf(",\"check\":\"%s\"}\n", ok ? "ok" : "fail");
	} else {
		printf("  decode step of one layer (one token appended, then attention; batch 1, medians of %d):\n", reps);
		printf("    two calls: GPU %.2f us (append %.2f + attention %.2f), wall %.2f us\n", m2, ma, me, mw2);
		printf("    one call (tqc_append_attend, %s): GPU %.2f us, wall %.2f us: %.3f x the two calls' wall\n",
		       fused ? "attention queued behind the append" : "NOT queued: two calls", m1, mw1, mw1 / mw2);
		printf("    the append adds %.2f us of GPU time to the attention (target <= %.0f us a layer: %s)\n", adds,
		       APPEND_TARGET_US, adds <= APPEND_TARGET_US ? "met" : "MISSED");
		printf("    output: one call against two %s", same ? "identical" : "DIFFERENT");
		if (ref)
			printf("; against the CPU reference %.2e", err);
		printf(" (%s)\n", ok ? "ok" : "FAILED");
	}
	rc = ok && fused ? 0 : -1;
	goto out;
fail:
	fprintf(stderr, "tqbench attn: step at ctx %u: %s\n", T, e.msg);
out:
	host_free(kin, kp);
	host_free(vin, vp);
	free(out1);
	free(out2);
	free(g2);
	free(w2);
	free(g1);
	free(w1);
	free(ga);
	free(ge);
	return rc;
}

static void run_ctx(struct bench *b, uint32_t T)
{
	const struct attn_cuda_opts *o = b->o;
	const int dev = o->device;
	int Bmax = b->max_batch;
	uint32_t n_pages = tq_page_count(&b->g, T);
	size_t sess_bytes = (size_t)n_pages * b->page_bytes;
	uint8_t *region = NULL, *stage = NULL;
	int stage_pinned = 0;
	const uint8_t **host_pages = NULL;
	float *ref = NULL, *out = NULL;
	char why[512], m1[32], m2[32];
	double t_enc = 0.0, t_copy = 0.0, t_ref = 0.0, err0 = NAN;
	int check = 0; /* 0 skipped, 1 ok, -1 failed */
	double bytes_call = (double)T * b->kv_bytes_per_token;
	const char *mode_desc = "";

	/* the pages of every session: encoded here, copied into one device region */
	void *mem = NULL;
	if (tqc_region_alloc(dev, (uint64_t)sess_bytes * Bmax, 0, &mem, why, sizeof(why)) < 0) {
		fprintf(stderr, "tqbench attn: ctx %u: %d sessions need %s of device memory: %s\n", T, Bmax,
			mib((double)sess_bytes * Bmax, m1, sizeof(m1)), why);
		b->failed = 1;
		return;
	}
	region = mem;
	if (!(stage = host_alloc(dev, sess_bytes, &stage_pinned)) ||
	    !(host_pages = calloc(n_pages, sizeof(*host_pages))) ||
	    !(ref = malloc(sizeof(float) * NQH * DIM)) || !(out = malloc(sizeof(float) * NQH * DIM))) {
		fprintf(stderr, "tqbench attn: ctx %u: out of host memory\n", T);
		b->failed = 1;
		goto out;
	}
	for (int i = Bmax - 1; i >= 0; i--) { /* session 0 last: its pages stay in `stage` */
		struct sess *s = &b->s[i];
		struct enc_job j = { .d = &b->d, .T = T, .g = &b->g, .page_bytes = b->page_bytes,
				     .kc = s->kc, .vc = s->vc, .mem = stage };
		double t = bench_now();
		tq_threads_run(b->pool, enc_task, &j, (int)(n_pages * NKV));
		t_enc += bench_now() - t;
		if (j.failed) {
			fprintf(stderr, "tqbench attn: ctx %u: tq_encode: %s\n", T, j.err.msg);
			b->failed = 1;
			goto out;
		}
		t = bench_now();
		if (tqc_copy(dev, region + (size_t)i * sess_bytes, stage, sess_bytes, why, sizeof(why)) < 0) {
			fprintf(stderr, "tqbench attn: ctx %u: tqc_copy: %s\n", T, why);
			b->failed = 1;
			goto out;
		}
		t_copy += bench_now() - t;
		free(s->pages);
		if (!(s->pages = calloc(n_pages, sizeof(*s->pages)))) {
			b->failed = 1;
			goto out;
		}
		for (uint32_t p = 0; p < n_pages; p++)
			s->pages[p] = region + (size_t)i * sess_bytes + (size_t)p * b->page_bytes;
		s->t = (struct tq_page_table){ .pages = s->pages, .n_pages = n_pages, .n_tokens = T, .geom = b->g };
		s->pos = (int32_t)(T - 1);
	}
	for (uint32_t p = 0; p < n_pages; p++)
		host_pages[p] = stage + (size_t)p * b->page_bytes;
	struct tq_page_table host_t = b->s[0].t;
	host_t.pages = host_pages;

	/* the check: one call against the CPU oracle on the same pages */
	if (T <= o->check_max) {
		struct sess *s = &b->s[0];
		struct tq_attn_params p = attn_params(s, &s->t, out), pr = attn_params(s, &host_t, ref);
		tq_error e;
		if (tqc_attend(s->x, &p, &e) < 0) {
			fprintf(stderr, "tqbench attn: ctx %u: tqc_attend: %s\n", T, e.msg);
			b->failed = 1;
			goto out;
		}
		double t = bench_now();
		if (tq_attend_ref(&pr, &e) < 0) {
			fprintf(stderr, "tqbench attn: ctx %u: tq_attend_ref: %s\n", T, e.msg);
			b->failed = 1;
			goto out;
		}
		t_ref = bench_now() - t;
		err0 = rel_err(out, ref, (size_t)NQH * DIM);
		check = err0 <= CHECK_TOL ? 1 : -1;
		if (check < 0)
			b->failed = 1;
	}

	if (!o->json) {
		printf("\nattn decode (cuda), ctx %u: K %s V %s, %d query heads / %d KV heads, d %d, "
		       "%u-token pages, %.0f B/token\n", T, tq_codec_name(o->k), tq_codec_name(o->v), NQH, NKV,
		       DIM, b->g.page_tokens, b->kv_bytes_per_token);
		printf("  pages: %d session%s x %u pages (%s each, %s in all) encoded on the CPU in %.2f s "
		       "(%d threads), copied to the device in %.2f s%s\n", Bmax, Bmax > 1 ? "s" : "", n_pages,
		       mib((double)sess_bytes, m1, sizeof(m1)), mib((double)sess_bytes * Bmax, m2, sizeof(m2)),
		       t_enc, tq_threads_count(b->pool), t_copy, stage_pinned ? "" : " (from pageable memory)");
		if (check)
			printf("  check: one call vs tq_attend_ref on the CPU: rel err %.2e of the output norm "
			       "(%s, contract <= %.0e; the reference took %.2f s)\n", err0,
			       check > 0 ? "ok" : "FAILED", CHECK_TOL, t_ref);
		else
			printf("  check: skipped (ctx %u > --check-max %u: tq_attend_ref is slow)\n", T, o->check_max);
	}

	for (int bi = 0; bi < o->n_batch; bi++) {
		int B = o->batch[bi];
		double gpu_ms, wall_ms, round_ms;
		if (run_batch(b, B, &gpu_ms, &wall_ms, &round_ms) < 0) {
			b->failed = 1;
			continue;
		}
		double calls_s = B / (round_ms * 1e-3);
		double eff = bytes_call / (gpu_ms * 1e-3) / 1e9, all = bytes_call * calls_s / 1e9;
		double peak = b->dev.peak_gbps;
		/* session 0 after the concurrent run: its last output */
		double errc = NAN;
		if (check)
			errc = rel_err(b->s[0].out, ref, (size_t)NQH * DIM);
		int checkc = !check ? 0 : errc <= CHECK_TOL ? 1 : -1;
		if (checkc < 0)
			b->failed = 1;
		const struct sdpa_case *sc = b->bl.avail ? sdpa_find(&b->bl, T, B) : NULL;
		int have_sdpa = sc && sc->ok;
		double step = B == 1 ? gpu_ms : round_ms;
		mode_desc = B == 1 ? "GPU time" : "wall time of a round of concurrent calls";

		/* the timed calls planned for a shared GPU, and one's plan */
		int n_sh = 0;
		const char *sh_plan = "";
		for (int i = 0; i < B; i++) {
			n_sh += b->s[i].n_shared;
			if (b->s[i].n_shared)
				sh_plan = b->s[i].plan;
		}
		if (o->json) {
			printf("{\"suite\":\"attn\",\"backend\":\"cuda\",\"mode\":\"decode\",\"device\":%d,\"gpu\":", dev);
			json_str(b->dev.name);
			printf(",\"ctx\":%u,\"batch\":%d,\"k\":\"%s\",\"v\":\"%s\",\"n_q\":1,\"n_q_heads\":%d,"
			       "\"n_kv_heads\":%d,\"dim\":%d,\"page_tokens\":%u,\"reps\":%d,\"host_threads\":%d,"
			       "\"encode_s\":%.3f,\"kv_bytes_per_token\":%.0f,\"bytes_per_call\":%.0f",
			       T, B, tq_codec_name(o->k), tq_codec_name(o->v), NQH, NKV, DIM, b->g.page_tokens,
			       o->reps, tq_threads_count(b->pool), t_enc, b->kv_bytes_per_token, bytes_call);
			jnum("gpu_ms", gpu_ms, 1);
			jnum("wall_ms", wall_ms, 1);
			jnum("round_ms", round_ms, 1);
			jnum("calls_per_s", calls_s, 1);
			jnum("eff_gbps", eff, 1);
			jnum("eff_vs_peak", eff / peak, peak > 0);
			jnum("all_gbps", all, 1);
			jnum("all_vs_peak", all / peak, peak > 0);
			jnum("peak_gbps", peak, peak > 0);
			jnum("rel_err", err0, check != 0);
			jnum("rel_err_concurrent", errc, check != 0);
			printf(",\"calls_shared\":%d", n_sh);
			printf(",\"check\":\"%s\",\"baseline\":", !check ? "skipped" : check > 0 && checkc > 0 ? "ok" : "fail");
			if (have_sdpa) {
				printf("\"sdpa\"");
			} else {
				char bw[400];
				snprintf(bw, sizeof(bw), "%s (%s)", o->baseline ? "unavailable" : "not run",
					 !b->bl.avail ? b->bl.why
					 : sc ? sc->why : "the script gave no result for this case");
				json_str(bw);
			}
			jnum("sdpa_ms", have_sdpa ? sc->ms : NAN, have_sdpa);
			jint("sdpa_bytes", have_sdpa ? sc->bytes : NAN, have_sdpa);
			jnum("sdpa_gbps", have_sdpa ? sc->bytes / (sc->ms * 1e-3) / 1e9 : NAN, have_sdpa);
			printf(",\"sdpa_variant\":");
			if (have_sdpa)
				json_str(sc->variant);
			else
				printf("null");
			jnum("fused_step_ms", step, 1);
			printf(",\"fused_step\":\"%s\"", B == 1 ? "gpu" : "wall");
			jnum("fused_vs_sdpa", have_sdpa ? step / sc->ms : NAN, have_sdpa);
			jnum("speedup", have_sdpa ? sc->ms / step : NAN, have_sdpa);
			printf("}\n");
		} else {
			if (B == 1) { /* the plan every session of this context ran */
				printf("  kernel: %s\n", tqc_ctx_last_attn_plan(b->s[0].x));
			} else { /* calls that started beside another split for a shared GPU */
				printf("  kernel: %d of %d calls planned for a shared GPU%s%s\n", n_sh, B * o->reps,
				       n_sh ? ": " : "", sh_plan);
			}
			printf("  batch %d: GPU %.4f ms/call (median of %d), wall %.4f ms/call, %.0f calls/s",
			       B, gpu_ms, B * o->reps, wall_ms, calls_s);
			if (B > 1)
				printf(" (round of %d calls: %.4f ms)", B, round_ms);
			printf("\n    reads %.1f MB/call: %.1f GB/s effective, %.1f %% of %.0f GB/s peak; "
			       "all sessions %.1f GB/s, %.1f %%\n", bytes_call / 1e6, eff,
			       peak > 0 ? 100.0 * eff / peak : NAN, peak, all, peak > 0 ? 100.0 * all / peak : NAN);
			if (have_sdpa)
				printf("    sdpa bf16 (%s): %.4f ms/step, %.1f MB, %.1f GB/s;  fused / sdpa %.3f "
				       "(%s), speedup %.2fx\n", sc->variant, sc->ms, sc->bytes / 1e6,
				       sc->bytes / (sc->ms * 1e-3) / 1e9, step / sc->ms, mode_desc, sc->ms / step);
			else if (b->bl.avail)
				printf("    sdpa: unavailable (%s)\n", sc ? sc->why : "the script gave no result for this case");
			if (check && B > 1)
				printf("    session 0's output after the concurrent run: rel err %.2e (%s)\n", errc,
				       checkc > 0 ? "ok" : "FAILED");
			else if (check && checkc < 0)
				printf("    the output of the last timed call: rel err %.2e (FAILED)\n", errc);
		}
		if (o->sparse > 0.0f)
			run_sparse(b, B, gpu_ms, round_ms, T);
		fflush(stdout);
	}
	if (run_step(b, T, check ? ref : NULL) < 0)
		b->failed = 1;
	if (o->phases > 0)
		run_phases(b, T);
out:
	for (int i = 0; i < Bmax; i++) {
		free(b->s[i].pages);
		b->s[i].pages = NULL;
	}
	if (stage)
		host_free(stage, stage_pinned);
	free(host_pages);
	free(ref);
	free(out);
	tqc_region_free(dev, region, 0); /* not NULL here */
}

/* ---- quantize-append ------------------------------------------------------------ */

/* Tokens [0, n) in `host` (pages, page_bytes each, contiguous) against tq_encode
 * of k / v ([n][NKV][DIM] fp32): how many blocks differ, or -1. */
static long check_blocks(const tq_codec *kc, const tq_codec *vc, const struct tq_page_geom *g,
			 size_t page_bytes, const uint8_t *host, const float *k, const float *v, uint32_t n)
{
	uint8_t blk[2048 + 64];
	long bad = 0;

	for (uint32_t t = 0; t < n; t++) {
		const uint8_t *pg = host + (size_t)(t / g->page_tokens) * page_bytes;
		uint32_t slot = t % g->page_tokens;
		for (uint32_t h = 0; h < NKV; h++) {
			size_t src = ((size_t)t * NKV + h) * DIM;
			if (tq_encode(kc, k + src, TQ_DTYPE_F32, 1, blk, NULL) < 0)
				return -1;
			bad += memcmp(blk, pg + tq_page_k_off(g, h, slot), g->k_block_bytes) != 0;
			if (tq_encode(vc, v + src, TQ_DTYPE_F32, 1, blk, NULL) < 0)
				return -1;
			bad += memcmp(blk, pg + tq_page_v_off(g, h, slot), g->v_block_bytes) != 0;
		}
	}
	return bad;
}

struct cpu_enc_job {
	const tq_codec *kc, *vc;
	const float *k, *v;
	size_t n;                 /* vectors per side */
	uint8_t *kout, *vout;
	int parts;
};

static void cpu_enc_task(void *arg, int task, int thread)
{
	struct cpu_enc_job *j = arg;
	size_t per = (j->n + (size_t)j->parts - 1) / (size_t)j->parts, a = (size_t)task * per;
	size_t n = a >= j->n ? 0 : j->n - a < per ? j->n - a : per;

	if (n) {
		tq_encode(j->kc, j->k + a * DIM, TQ_DTYPE_F32, n, j->kout + a * tq_codec_block_bytes(j->kc), NULL);
		tq_encode(j->vc, j->v + a * DIM, TQ_DTYPE_F32, n, j->vout + a * tq_codec_block_bytes(j->vc), NULL);
	}
	(void)thread;
}

static void run_append(struct bench *b)
{
	const struct attn_cuda_opts *o = b->o;
	const int dev = o->device, L = o->layers, reps = o->reps;
	const uint32_t ntok = WARMUP + (uint32_t)reps, nb = o->bulk;
	const struct tq_page_geom *g = &b->g;
	uint32_t dec_pages = tq_page_count(g, ntok), bulk_pages = tq_page_count(g, nb);
	size_t dec_bytes = (size_t)dec_pages * b->page_bytes, bulk_bytes = (size_t)bulk_pages * b->page_bytes;
	tq_codec **kc = calloc((size_t)L, sizeof(*kc)), **vc = calloc((size_t)L, sizeof(*vc));
	const uint8_t **ptrs = calloc((size_t)L * dec_pages + bulk_pages, sizeof(*ptrs));
	float *dk = NULL, *dv = NULL, *bk = NULL, *bv = NULL;
	int dk_p = 0, dv_p = 0, bk_p = 0, bv_p = 0;
	double *gpu = malloc((size_t)L * reps * sizeof(double)), *wall = malloc((size_t)L * reps * sizeof(double));
	double *tok_gpu = malloc((size_t)reps * sizeof(double)), *tok_wall = malloc((size_t)reps * sizeof(double));
	double *cpu = malloc((size_t)L * reps * sizeof(double));
	uint8_t *region = NULL, *back = NULL, *scratch = NULL;
	tqc_ctx *x = b->s[0].x;
	char why[512];
	tq_error e;
	uint32_t bad_tok;
	int pinned_in;
	struct rng r = { 0xA99E4D };

	if (!kc || !vc || !ptrs || !gpu || !wall || !tok_gpu || !tok_wall || !cpu)
		goto oom;
	for (int l = 0; l < L; l++) {
		struct tq_codec_params kp = { .id = o->k, .dim = DIM, .seed = 0xA11CE000 + 2 * (uint64_t)l };
		struct tq_codec_params vp = { .id = o->v, .dim = DIM, .seed = 0xA11CE001 + 2 * (uint64_t)l };
		if (tq_codec_new(&kc[l], b->cbs, &kp, &e) < 0 || tq_codec_new(&vc[l], b->cbs, &vp, &e) < 0) {
			fprintf(stderr, "tqbench attn: append: %s\n", e.msg);
			b->failed = 1;
			goto out;
		}
	}
	size_t dec_in = (size_t)ntok * NKV * DIM * sizeof(float), bulk_in = (size_t)nb * NKV * DIM * sizeof(float);
	if (!(dk = host_alloc(dev, dec_in, &dk_p)) || !(dv = host_alloc(dev, dec_in, &dv_p)) ||
	    !(bk = host_alloc(dev, bulk_in, &bk_p)) || !(bv = host_alloc(dev, bulk_in, &bv_p)) ||
	    !(back = malloc(dec_bytes > bulk_bytes ? dec_bytes : bulk_bytes)) ||
	    !(scratch = malloc((size_t)nb * NKV * b->kv_bytes_per_token / NKV)))
		goto oom;
	pinned_in = dk_p && dv_p && bk_p && bv_p;
	for (size_t i = 0; i < (size_t)ntok * NKV; i++) {
		gen_key(&r, dk + i * DIM, DIM);
		gen_value(&r, dv + i * DIM, DIM);
	}
	for (size_t i = 0; i < (size_t)nb * NKV; i++) {
		gen_key(&r, bk + i * DIM, DIM);
		gen_value(&r, bv + i * DIM, DIM);
	}
	void *mem = NULL;
	if (tqc_region_alloc(dev, (uint64_t)dec_bytes * L + bulk_bytes, 0, &mem, why, sizeof(why)) < 0) {
		fprintf(stderr, "tqbench attn: append: %s\n", why);
		b->failed = 1;
		goto out;
	}
	region = mem;
	for (size_t i = 0; i < (size_t)L * dec_pages + bulk_pages; i++)
		ptrs[i] = region + i * b->page_bytes;

	/* one decode token into every layer, ntok times (the first WARMUP untimed) */
	for (uint32_t t = 0; t < ntok; t++) {
		double t_tok = bench_now(), g_tok = 0.0;
		for (int l = 0; l < L; l++) {
			struct tq_page_table pt = { .pages = ptrs + (size_t)l * dec_pages, .n_pages = dec_pages,
						    .n_tokens = t, .geom = *g };
			struct tqc_append a = { .k_codec = kc[l], .v_codec = vc[l], .kv = &pt, .pos = t, .n = 1,
						.k = dk + (size_t)t * NKV * DIM, .v = dv + (size_t)t * NKV * DIM,
						.dtype = TQ_DTYPE_F32 };
			double t0 = bench_now();
			if (tqc_append(x, &a, &bad_tok, &e) < 0) {
				fprintf(stderr, "tqbench attn: tqc_append (layer %d, token %u): %s\n", l, t, e.msg);
				b->failed = 1;
				goto out;
			}
			double w = (bench_now() - t0) * 1e6, gu = tqc_ctx_last_us(x);
			if (t >= WARMUP) {
				size_t k = (size_t)(t - WARMUP) * L + (size_t)l;
				gpu[k] = gu;
				wall[k] = w;
				g_tok += gu;
			}
		}
		if (t >= WARMUP) {
			tok_wall[t - WARMUP] = (bench_now() - t_tok) * 1e6;
			tok_gpu[t - WARMUP] = g_tok;
		}
	}
	const char *dec_kern = tqc_ctx_last_append(x); /* a static string */
	/* the blocks of the first and the last layer, byte for byte */
	long dec_bad = 0;
	for (int l = 0; l < L; l += L > 1 ? L - 1 : 1) {
		if (tqc_copy(dev, back, region + (size_t)l * dec_bytes, dec_bytes, why, sizeof(why)) < 0) {
			fprintf(stderr, "tqbench attn: append: tqc_copy: %s\n", why);
			b->failed = 1;
			goto out;
		}
		long bad = check_blocks(kc[l], vc[l], g, b->page_bytes, back, dk, dv, ntok);
		dec_bad = bad < 0 || dec_bad < 0 ? -1 : dec_bad + bad;
	}
	/* the CPU baseline: tq_encode of the same token (all KV heads) on one thread */
	for (int t = 0; t < reps; t++)
		for (int l = 0; l < L; l++) {
			const float *ks = dk + (size_t)(t + WARMUP) * NKV * DIM, *vs = dv + (size_t)(t + WARMUP) * NKV * DIM;
			double t0 = bench_now();
			tq_encode(kc[l], ks, TQ_DTYPE_F32, NKV, scratch, NULL);
			tq_encode(vc[l], vs, TQ_DTYPE_F32, NKV, scratch + NKV * g->k_block_bytes, NULL);
			cpu[(size_t)t * L + l] = (bench_now() - t0) * 1e6;
		}
	double gpu_l = median(gpu, (size_t)L * reps), wall_l = median(wall, (size_t)L * reps);
	double gpu_t = median(tok_gpu, (size_t)reps), wall_t = median(tok_wall, (size_t)reps);
	double cpu_l = median(cpu, (size_t)L * reps);

	/* bulk: nb tokens at once into one layer */
	struct tq_page_table bt = { .pages = ptrs + (size_t)L * dec_pages, .n_pages = bulk_pages, .n_tokens = 0,
				    .geom = *g };
	struct tqc_append ba = { .k_codec = kc[0], .v_codec = vc[0], .kv = &bt, .pos = 0, .n = nb,
				 .k = bk, .v = bv, .dtype = TQ_DTYPE_F32 };
	for (int i = 0; i < WARMUP + reps; i++) {
		double t0 = bench_now();
		if (tqc_append(x, &ba, &bad_tok, &e) < 0) {
			fprintf(stderr, "tqbench attn: tqc_append (%u tokens): %s\n", nb, e.msg);
			b->failed = 1;
			goto out;
		}
		if (i >= WARMUP) {
			wall[i - WARMUP] = (bench_now() - t0) * 1e6;
			gpu[i - WARMUP] = tqc_ctx_last_us(x);
		}
	}
	double bgpu = median(gpu, (size_t)reps), bwall = median(wall, (size_t)reps);
	const char *bulk_kern = tqc_ctx_last_append(x);
	if (tqc_copy(dev, back, region + (size_t)L * dec_bytes, bulk_bytes, why, sizeof(why)) < 0) {
		fprintf(stderr, "tqbench attn: append: tqc_copy: %s\n", why);
		b->failed = 1;
		goto out;
	}
	long bulk_bad = check_blocks(kc[0], vc[0], g, b->page_bytes, back, bk, bv, nb);
	/* the CPU baseline: the same vectors through tq_encode on the pool */
	struct cpu_enc_job cj = { .kc = kc[0], .vc = vc[0], .k = bk, .v = bv, .n = (size_t)nb * NKV,
				  .kout = scratch, .vout = scratch + (size_t)nb * NKV * g->k_block_bytes,
				  .parts = tq_threads_count(b->pool) };
	int cr = reps < CPU_REPS_MAX ? reps : CPU_REPS_MAX;
	tq_threads_run(b->pool, cpu_enc_task, &cj, cj.parts); /* warm-up */
	for (int i = 0; i < cr; i++) {
		double t0 = bench_now();
		tq_threads_run(b->pool, cpu_enc_task, &cj, cj.parts);
		cpu[i] = (bench_now() - t0) * 1e6;
	}
	double bcpu = median(cpu, (size_t)cr);
	double vecs = 2.0 * nb * NKV;
	int identical = dec_bad == 0 && bulk_bad == 0;
	if (!identical)
		b->failed = 1;

	const char *in = pinned_in ? "pinned" : "pageable";
	if (o->json) {
		printf("{\"suite\":\"attn\",\"backend\":\"cuda\",\"mode\":\"append_decode\",\"device\":%d,\"gpu\":", dev);
		json_str(b->dev.name);
		printf(",\"k\":\"%s\",\"v\":\"%s\",\"layers\":%d,\"n_kv_heads\":%d,\"dim\":%d,\"page_tokens\":%u,"
		       "\"dtype\":\"f32\",\"input\":\"%s\",\"kernel\":\"%s\",\"calls\":%d",
		       tq_codec_name(o->k), tq_codec_name(o->v), L, NKV, DIM, g->page_tokens, in, dec_kern, L * reps);
		jnum("gpu_us_per_layer", gpu_l, 1);
		jnum("wall_us_per_layer", wall_l, 1);
		jnum("gpu_us_per_token", gpu_t, 1);
		jnum("wall_us_per_token", wall_t, 1);
		printf(",\"target_us_per_layer\":%.0f,\"target_met\":%s", APPEND_TARGET_US,
		       gpu_l <= APPEND_TARGET_US ? "true" : "false");
		jnum("cpu_us_per_layer", cpu_l, 1);
		jnum("gpu_vs_cpu", gpu_l / cpu_l, 1);
		jnum("wall_vs_cpu", wall_l / cpu_l, 1);
		printf(",\"blocks_identical\":%s}\n", dec_bad == 0 ? "true" : "false");
		printf("{\"suite\":\"attn\",\"backend\":\"cuda\",\"mode\":\"append_bulk\",\"device\":%d,\"gpu\":", dev);
		json_str(b->dev.name);
		printf(",\"k\":\"%s\",\"v\":\"%s\",\"tokens\":%u,\"vectors\":%.0f,\"n_kv_heads\":%d,\"dim\":%d,"
		       "\"page_tokens\":%u,\"dtype\":\"f32\",\"input\":\"%s\",\"kernel\":\"%s\",\"calls\":%d",
		       tq_codec_name(o->k), tq_codec_name(o->v), nb, vecs, NKV, DIM, g->page_tokens, in, bulk_kern, reps);
		jnum("gpu_ms", bgpu / 1e3, 1);
		jnum("wall_ms", bwall / 1e3, 1);
		jnum("gpu_vectors_per_s", vecs / (bgpu * 1e-6), 1);
		jnum("wall_vectors_per_s", vecs / (bwall * 1e-6), 1);
		printf(",\"cpu_threads\":%d", cj.parts);
		jnum("cpu_vectors_per_s", vecs / (bcpu * 1e-6), 1);
		jnum("gpu_vs_cpu_speedup", bcpu / bgpu, 1);
		printf(",\"blocks_identical\":%s}\n", bulk_bad == 0 ? "true" : "false");
	} else {
		printf("\nquantize-append (tqc_append): K %s V %s, d %d, %d KV heads, f32 input in %s host memory, "
		       "%u-token pages\n", tq_codec_name(o->k), tq_codec_name(o->v), DIM, NKV, in, g->page_tokens);
		printf("  decode token, %d layer%s (%s kernel): GPU %.2f us/layer (median of %d calls; target <= %.0f us: "
		       "%s), wall %.2f us/layer\n", L, L > 1 ? "s" : "", dec_kern, gpu_l, L * reps, APPEND_TARGET_US,
		       gpu_l <= APPEND_TARGET_US ? "met" : "MISSED", wall_l);
		printf("    per token, all %d layer%s: GPU %.1f us, wall %.1f us\n", L, L > 1 ? "s" : "", gpu_t, wall_t);
		printf("    CPU tq_encode of the same token (1 thread): %.2f us/layer;  GPU / CPU %.2f, wall / CPU %.2f\n",
		       cpu_l, gpu_l / cpu_l, wall_l / cpu_l);
		printf("  bulk, %u tokens (%.0f vectors, K and V; %s kernel): GPU %.3f ms = %.1f M vectors/s, wall %.3f "
		       "ms = %.1f M vectors/s\n", nb, vecs, bulk_kern, bgpu / 1e3, vecs / bgpu, bwall / 1e3, vecs / bwall);
		printf("    CPU tq_encode (%d threads): %.3f ms = %.1f M vectors/s;  GPU speedup %.2fx\n", cj.parts,
		       bcpu / 1e3, vecs / bcpu, bcpu / bgpu);
		char layers_s[48];
		if (L > 1)
			snprintf(layers_s, sizeof(layers_s), "layers 0 and %d", L - 1);
		else
			snprintf(layers_s, sizeof(layers_s), "layer 0");
		printf("  blocks vs tq_encode: decode (%s, %u tokens) %s, bulk %s\n", layers_s, ntok,
		       dec_bad == 0 ? "identical" : dec_bad < 0 ? "NOT CHECKED (encode failed)" : "DIFFER",
		       bulk_bad == 0 ? "identical" : bulk_bad < 0 ? "NOT CHECKED (encode failed)" : "DIFFER");
		if (dec_bad > 0 || bulk_bad > 0)
			printf("    %ld of %.0f decode blocks and %ld of %.0f bulk blocks differ\n", dec_bad,
			       2.0 * ntok * NKV * (L > 1 ? 2 : 1), bulk_bad, vecs);
	}
	goto out;
oom:
	fprintf(stderr, "tqbench attn: append: out of host memory\n");
	b->failed = 1;
out:
	if (region)
		tqc_region_free(dev, region, 0);
	for (int l = 0; kc && vc && l < L; l++) {
		tq_codec_free(kc[l]);
		tq_codec_free(vc[l]);
	}
	free(kc);
	free(vc);
	free(ptrs);
	if (dk)
		host_free(dk, dk_p);
	if (dv)
		host_free(dv, dv_p);
	if (bk)
		host_free(bk, bk_p);
	if (bv)
		host_free(bv, bv_p);
	free(back);
	free(scratch);
	free(gpu);
	free(wall);
	free(tok_gpu);
	free(tok_wall);
	free(cpu);
}

/* ---- the run -------------------------------------------------------------------- */

int bench_attn_cuda(const struct attn_cuda_opts *o)
{
	struct bench b = { .o = o };
	char why[512];
	tq_error e;
	int n, rc = 1;

	/* the device, first: no usable one is a skip (77), not a failure */
	n = tqc_device_count(why, sizeof(why));
	if (n <= 0) {
		fprintf(stderr, "tqbench attn: --backend cuda: no usable CUDA device: %s\n",
			n == 0 ? "the driver reports no device" : why);
		return 77;
	}
	if (o->device >= n) {
		fprintf(stderr, "tqbench attn: --backend cuda: no CUDA device %d (the driver sees %d)\n", o->device, n);
		return 2;
	}
	if (tqc_device_query(o->device, &b.dev, why, sizeof(why)) < 0) {
		fprintf(stderr, "tqbench attn: --backend cuda: no usable CUDA device: device %d: %s\n", o->device, why);
		return 77;
	}
	const struct tqc_device_info *d = &b.dev;
	if (o->json) {
		printf("{\"suite\":\"attn\",\"backend\":\"cuda\",\"mode\":\"device\",\"device\":%d,\"gpu\":", o->device);
		json_str(d->name);
		printf(",\"sm\":\"%d%d\",\"sms\":%d,\"total_bytes\":%llu,\"free_bytes\":%llu,\"peak_gbps\":%.1f,"
		       "\"unified\":%d,\"driver\":\"%d.%d\",\"runtime\":\"%d.%d\",\"cuda_built\":%d}\n",
		       d->cc_major, d->cc_minor, d->sms, (unsigned long long)d->total_bytes,
		       (unsigned long long)d->free_bytes, d->peak_gbps, tqc_device_unified(d),
		       d->driver_version / 1000, d->driver_version % 1000 / 10, d->runtime_version / 1000,
		       d->runtime_version % 1000 / 10, tqc_built());
	} else {
		printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB (%.1f GiB free), %.0f GB/s peak; driver %d.%d, "
		       "runtime %d.%d\n", o->device, d->name, d->cc_major, d->cc_minor, d->sms,
		       (double)d->total_bytes / (1ull << 30), (double)d->free_bytes / (1ull << 30), d->peak_gbps,
		       d->driver_version / 1000, d->driver_version % 1000 / 10, d->runtime_version / 1000,
		       d->runtime_version % 1000 / 10);
	}
	fflush(stdout);

	/* the baseline before any of our device memory exists */
	run_baseline(&b);
	if (!b.bl.avail) {
		/* the human line; with --json it goes to stderr (stdout is JSON lines) */
		fprintf(o->json ? stderr : stdout, "baseline: %s (%s)\n", o->baseline ? "unavailable" : "not run",
			b.bl.why);
	} else {
		if (!o->json)
			printf("baseline: PyTorch %s scaled_dot_product_attention, bf16 K/V cache, batch B in one "
			       "call, on %s\n", b.bl.torch[0] ? b.bl.torch : "?", b.bl.gpu[0] ? b.bl.gpu : "?");
		if (b.bl.gpu[0] && strcmp(b.bl.gpu, d->name))
			fprintf(stderr, "tqbench attn: warning: the baseline ran on '%s', not on '%s' "
					"(CUDA_DEVICE_ORDER?)\n", b.bl.gpu, d->name);
	}

	/* the geometry, the codecs and contexts of every session */
	long kb = tq_block_bytes(o->k, DIM, &e), vb = kb < 0 ? -1 : tq_block_bytes(o->v, DIM, &e);
	if (kb < 0 || vb < 0) {
		fprintf(stderr, "tqbench attn: %s\n", e.msg);
		return 2;
	}
	b.g = (struct tq_page_geom){ .n_kv_heads = NKV, .page_tokens = o->page_tokens,
				     .k_block_bytes = (uint32_t)kb, .v_block_bytes = (uint32_t)vb };
	b.page_bytes = tq_page_bytes(&b.g);
	b.kv_bytes_per_token = (double)NKV * (double)(kb + vb);
	for (int i = 0; i < o->n_batch; i++)
		if (o->batch[i] > b.max_batch)
			b.max_batch = o->batch[i];
	if (!(b.cbs = tq_cache_new()) || tq_threads_new(&b.pool, o->threads) < 0 ||
	    !(b.s = calloc((size_t)b.max_batch, sizeof(*b.s)))) {
		fprintf(stderr, "tqbench attn: out of memory\n");
		goto out;
	}
	for (int i = 0; i < b.max_batch; i++) {
		struct sess *s = &b.s[i];
		struct tq_codec_params kp = { .id = o->k, .dim = DIM, .seed = 0xC0FFEE01 + ((uint64_t)i << 8) };
		struct tq_codec_params vp = { .id = o->v, .dim = DIM, .seed = 0xC0FFEE02 + ((uint64_t)i << 8) };
		struct rng r = { 1000 + (uint64_t)i };
		s->idx = i;
		if (tq_codec_new(&s->kc, b.cbs, &kp, &e) < 0 || tq_codec_new(&s->vc, b.cbs, &vp, &e) < 0) {
			fprintf(stderr, "tqbench attn: %s\n", e.msg);
			goto out;
		}
		if (tqc_ctx_new(&s->x, o->device, &e) < 0) {
			fprintf(stderr, "tqbench attn: tqc_ctx_new (session %d): %s\n", i, e.msg);
			goto out;
		}
		if (!(s->out = host_alloc(o->device, sizeof(float) * NQH * DIM, &s->out_pinned))) {
			fprintf(stderr, "tqbench attn: out of memory\n");
			goto out;
		}
		for (int h = 0; h < NQH; h++)
			gen_query(&r, s->q + (size_t)h * DIM, DIM);
		for (int j = 0; j < NQH * DIM; j++)
			s->q[j] *= o->q_scale > 0.0f ? o->q_scale : 1.0f;
	}

	/* the synthetic K/V, once, for the longest context */
	for (int i = 0; i < o->n_ctx; i++)
		if (o->ctx[i] > b.d.tmax)
			b.d.tmax = o->ctx[i];
	size_t elems = (size_t)NKV * b.d.tmax * DIM;
	if (!(b.d.k = malloc(elems * sizeof(float))) || !(b.d.v = malloc(elems * sizeof(float)))) {
		fprintf(stderr, "tqbench attn: %u tokens of fp32 K/V need %.1f GiB of host memory\n", b.d.tmax,
			2.0 * elems * sizeof(float) / (1ull << 30));
		goto out;
	}
	double t = bench_now();
	tq_threads_run(b.pool, synth_task, &b.d, (int)(2 * NKV * ((b.d.tmax + GEN_CHUNK - 1) / GEN_CHUNK)));
	t = bench_now() - t;
	if (!o->json)
		printf("synthetic K/V: %u tokens x %d KV heads x d %d (fp32) generated in %.2f s on %d threads; "
		       "%d session%s, own codec seeds and queries, same source vectors\n",
		       b.d.tmax, NKV, DIM, t, tq_threads_count(b.pool), b.max_batch, b.max_batch > 1 ? "s" : "");

	for (int i = 0; i < o->n_ctx; i++)
		run_ctx(&b, o->ctx[i]);
	free(b.d.k);
	free(b.d.v);
	b.d.k = b.d.v = NULL;
	run_append(&b);
	rc = b.failed ? 1 : 0;
	if (b.failed)
		fprintf(stderr, "tqbench attn: --backend cuda: a step failed or a check did not pass (see above)\n");
out:
	for (int i = 0; b.s && i < b.max_batch; i++) {
		struct sess *s = &b.s[i];
		if (s->x)
			tqc_ctx_free(s->x);
		tq_codec_free(s->kc);
		tq_codec_free(s->vc);
		if (s->out)
			host_free(s->out, s->out_pinned);
		free(s->pages);
	}
	free(b.s);
	free(b.d.k);
	free(b.d.v);
	tq_threads_free(b.pool);
	tq_cache_free(b.cbs);
	return rc;
}
