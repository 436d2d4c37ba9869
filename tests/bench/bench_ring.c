/* bench_ring — the data path's round trip through a real tqkvd.
 *
 *   tqbench ring [--clients N] [--iters N] [--ctx T] [--workers W]
 *                [--attn-threads A] [--json]
 *
 * Starts build/bin/tqkvd (next to tqbench) on a temporary run directory and
 * measures, with libtqkv:
 *   nop            round-trip latency of NOP (the ring's own cost)
 *   append_attend  the decode step: append 1 token's K/V and attend 1 query
 *                  (32 query heads, 8 KV heads, d = 128, tq4 K / tq3 V) over
 *                  a T-token context (default 4096)
 * with 1 client and with N client processes at once (throughput = all
 * clients' operations per second), and in the same run two baselines: the
 * floor, a futex ping-pong between two processes (each wakes the other and
 * sleeps), for NOP; and the same append + attend done in this process on
 * one thread without the ring, for the decode step.
 * --workers / --attn-threads set the daemon's data_workers and
 * attention_threads (defaults: one worker per CPU, 1 thread per call).
 * --backend cuda [--device N] puts the daemon's pool on GPU N (the GPU's
 * kernels run every append and attention); the decode step's baseline is
 * then the same work on the same GPU in a process of its own, no ring, as
 * two calls (tqc_append, tqc_attend) and as one (tqc_append_attend: the
 * attention queued behind the append, what tqkvd's workers call), and the
 * daemon's GetStats says how many of its steps waited once.  Without a
 * usable GPU it says why (tqkvd --gpus) and exits 77.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "tq_attn.h"
#include "tq_codec.h"
#include "tq_cuda.h"
#include "tq_page.h"
#include "tqkv.h"

struct opts {
	int clients, iters, ctx, json, workers, attn_threads;
	int cuda, device;          /* --backend cuda, --device */
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	int i = (int)(p * (n - 1) + 0.5);
	return v[i];
}

/* ---- the floor: futex ping-pong between two processes ----------------------- */
static long fx(uint32_t *a, int op, uint32_t v)
{
	return syscall(SYS_futex, a, op, v, NULL, NULL, 0);
}

static double futex_pingpong_p50(int iters, double *p99)
{
	uint32_t *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	double *lat = malloc(sizeof(double) * (size_t)iters);
	pid_t pid;

	w[0] = w[16] = 0; /* w[0]: ping, w[16]: pong (separate lines) */
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		for (uint32_t i = 1; i <= (uint32_t)iters + 100; i++) {
			while (__atomic_load_n(&w[0], __ATOMIC_ACQUIRE) < i)
				fx(&w[0], FUTEX_WAIT, i - 1);
			__atomic_store_n(&w[16], i, __ATOMIC_RELEASE);
			fx(&w[16], FUTEX_WAKE, 1);
		}
		_exit(0);
	}
	for (uint32_t i = 1; i <= (uint32_t)iters + 100; i++) {
		double t0 = bench_now();
		__atomic_store_n(&w[0], i, __ATOMIC_RELEASE);
		fx(&w[0], FUTEX_WAKE, 1);
		while (__atomic_load_n(&w[16], __ATOMIC_ACQUIRE) < i)
			fx(&w[16], FUTEX_WAIT, i - 1);
		if (i > 100)
			lat[i - 101] = (bench_now() - t0) * 1e6;
	}
	waitpid(pid, NULL, 0);
	munmap(w, 4096);
	double p50 = pct(lat, iters, 0.5);
	*p99 = pct(lat, iters, 0.99);
	free(lat);
	return p50;
}

/* ---- the daemon ---------------------------------------------------------------- */
static char run_dir[64];
static pid_t daemon_pid;

/* A program next to this one (build/bin), in out. */
static int sibling(const char *name, char *out, size_t n)
{
	char exe[PATH_MAX];
	ssize_t l = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (l <= 0)
		return -1;
	exe[l] = 0;
	*strrchr(exe, '/') = 0;
	return snprintf(out, n, "%s/%s", exe, name) < (int)n ? 0 : -1;
}

static int daemon_start(const struct opts *o)
{
	char bin[PATH_MAX + 16], conf[128], spill[96];
	FILE *f;

	if (sibling("tqkvd", bin, sizeof(bin)) < 0)
		return -1;
	snprintf(run_dir, sizeof(run_dir), "/tmp/tqbench-ring.XXXXXX");
	if (!mkdtemp(run_dir))
		return -1;
	snprintf(conf, sizeof(conf), "%s/tqkvd.conf", run_dir);
	snprintf(spill, sizeof(spill), "%s/spill", run_dir);
	f = fopen(conf, "w");
	if (!f)
		return -1;
	fprintf(f, "[daemon]\nlog_level = warning\ndata_workers = %d\nattention_threads = %d\n"
		   "[pool]\npool_bytes = 2G\n", o->workers, o->attn_threads);
	if (o->cuda)
		fprintf(f, "backend = cuda\ndevice = %d\n", o->device);
	fprintf(f, "[tenant default]\nallow_uids = *\n");
	fclose(f);
	fflush(stdout);
	daemon_pid = fork();
	if (daemon_pid == 0) {
		execl(bin, bin, "--config", conf, "--run-dir", run_dir, "--spill-dir", spill, (char *)NULL);
		fprintf(stderr, "tqbench ring: cannot run %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	for (int i = 0; i < 100; i++) {
		/* data channel only: gRPC must not be initialized in this process,
		 * which forks the clients (gRPC core does not survive fork) */
		struct tqkv_connect_opts co = { .run_dir = run_dir, .flags = TQKV_CONNECT_NO_CONTROL };
		tqkv *c;
		if (tqkv_connect(&c, &co) == 0) {
			tqkv_disconnect(c);
			return 0;
		}
		if (waitpid(daemon_pid, NULL, WNOHANG) == daemon_pid)
			return -1;
		usleep(50000);
	}
	return -1;
}

static void daemon_stop(void)
{
	char p[128];

	if (daemon_pid > 0) {
		kill(daemon_pid, SIGTERM);
		waitpid(daemon_pid, NULL, 0);
	}
	snprintf(p, sizeof(p), "rm -rf '%s'", run_dir);
	if (system(p) != 0) {
		/* leave it */
	}
}

/* ---- one client ------------------------------------------------------------------- */
#define NQ 32
#define NKV 8
#define D 128

struct client_res {
	double t0, t1;   /* measured window, CLOCK_MONOTONIC seconds */
	int n;
	double lat[];    /* µs */
};

/* Start barrier: clients set up (connect, session, prefill), then start together. */
static uint32_t *barrier;

static void fill_f16(uint16_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		p[i] = tq_f32_to_f16((float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f);
	}
}

/* op 0: NOP, op 1: APPEND_ATTEND at ctx tokens.  Latencies into r->lat. */
static int run_client(const struct opts *o, int op, struct client_res *r, int id)
{
	struct tqkv_connect_opts co = { .run_dir = run_dir };
	struct tqkv_session_params sp = { .n_layers = 1, .n_kv_heads = NKV, .n_q_heads = NQ, .head_dim = D,
					  .k_codec = "tq4", .v_codec = "tq3", .max_tokens = (uint64_t)o->ctx + 256 };
	tqkv *c = NULL;
	tqkv_session *s = NULL;
	uint16_t *k = malloc(sizeof(uint16_t) * 512 * NKV * D), *v = malloc(sizeof(uint16_t) * 512 * NKV * D);
	uint16_t *q = malloc(sizeof(uint16_t) * NQ * D);
	float *out = malloc(sizeof(float) * NQ * D);
	int rc = -1, warm = o->iters / 10 + 10;

	if (tqkv_connect(&c, &co) < 0) {
		fprintf(stderr, "tqbench ring: connect: %s\n", tqkv_last_error());
		goto out;
	}
	fill_f16(k, 512 * NKV * D, 1u + (uint32_t)id);
	fill_f16(v, 512 * NKV * D, 2u + (uint32_t)id);
	fill_f16(q, NQ * D, 3u + (uint32_t)id);
	if (op == 1) {
		if (tqkv_session_open(c, &sp, &s) < 0) {
			fprintf(stderr, "tqbench ring: session: %s\n", tqkv_last_error());
			goto out;
		}
		for (int t = 0; t < o->ctx; t += 512) {
			int n = o->ctx - t < 512 ? o->ctx - t : 512;
			if (tqkv_append(s, 0, k, v, (uint32_t)n, TQKV_F16) < 0)
				goto out;
		}
	}
	__atomic_add_fetch(&barrier[0], 1, __ATOMIC_SEQ_CST);
	while (!__atomic_load_n(&barrier[16], __ATOMIC_ACQUIRE))
		usleep(100);
	for (int i = 0; i < warm + o->iters; i++) {
		if (i == warm)
			r->t0 = bench_now();
		double t0 = bench_now();
		int e;
		if (op == 0) {
			e = tqkv_nop(c);
		} else {
			int32_t pos = o->ctx + (i % 64);
			e = tqkv_append_attend(s, 0, k + (size_t)(i % 512) * NKV * D, v + (size_t)(i % 512) * NKV * D,
					       1, q, &pos, 1, TQKV_F16, out);
		}
		double dt = (bench_now() - t0) * 1e6;
		if (e < 0) {
			fprintf(stderr, "tqbench ring: op: %s (%s)\n", tqkv_strerror(e), tqkv_last_error());
			goto out;
		}
		if (i >= warm)
			r->lat[i - warm] = dt;
		/* keep the context at ctx..ctx+63 (not timed) */
		if (op == 1 && i % 64 == 63 && tqkv_truncate(s, 0, (uint64_t)o->ctx) < 0)
			goto out;
	}
	r->t1 = bench_now();
	r->n = o->iters;
	rc = 0;
out:
	if (s)
		tqkv_session_close(s);
	tqkv_disconnect(c);
	free(k);
	free(v);
	free(q);
	free(out);
	return rc;
}

/* The baseline of the decode step: the same work in this process, no ring —
 * encode 1 token's K/V into the next slot of a paged tq4/tq3 cache of ctx
 * tokens (pages of the daemon's default 64 KiB), then attend 1 query, on
 * the calling thread (attention_threads = 1).  p50 in µs, or < 0. */
static double inproc_append_attend_p50(const struct opts *o)
{
	struct tq_codec_params kp = { TQ_CODEC_TQ4, D, 11, TQ_ISA_AUTO }, vp = { TQ_CODEC_TQ3, D, 12, TQ_ISA_AUTO };
	tq_codec *kc = NULL, *vc = NULL;
	struct tq_page_geom g = { NKV, 0, 0, 0 };
	uint8_t **pages = NULL;
	uint32_t n_pages = 0, cap_tokens = (uint32_t)o->ctx + 64;
	uint16_t *k = malloc(sizeof(uint16_t) * NKV * D), *v = malloc(sizeof(uint16_t) * NKV * D);
	uint16_t *q = malloc(sizeof(uint16_t) * NQ * D);
	float *out = malloc(sizeof(float) * NQ * D);
	double *lat = malloc(sizeof(double) * (size_t)o->iters), p50 = -1;
	int iters = o->iters;

	if (!k || !v || !q || !out || !lat || tq_codec_new(&kc, NULL, &kp, NULL) < 0 ||
	    tq_codec_new(&vc, NULL, &vp, NULL) < 0)
		goto out;
	g.k_block_bytes = (uint32_t)tq_codec_block_bytes(kc);
	g.v_block_bytes = (uint32_t)tq_codec_block_bytes(vc);
	for (g.page_tokens = 65536 / (NKV * (g.k_block_bytes + g.v_block_bytes)) + 1;
	     g.page_tokens > 1 && tq_page_bytes(&g) > 65536;)
		g.page_tokens--;
	n_pages = tq_page_count(&g, cap_tokens);
	pages = calloc(n_pages, sizeof(*pages));
	if (!pages)
		goto out;
	for (uint32_t i = 0; i < n_pages; i++)
		if (!(pages[i] = aligned_alloc(TQ_PAGE_ALIGN, tq_page_bytes(&g))))
			goto out;
	fill_f16(q, NQ * D, 3u);
	for (uint32_t t = 0; t < cap_tokens; t++) {
		uint8_t *pg = pages[t / g.page_tokens];
		fill_f16(k, NKV * D, 1u + t);
		fill_f16(v, NKV * D, 2u + t);
		for (uint32_t h = 0; h < NKV; h++) {
			tq_encode(kc, k + h * D, TQ_DTYPE_F16, 1, pg + tq_page_k_off(&g, h, t % g.page_tokens), NULL);
			tq_encode(vc, v + h * D, TQ_DTYPE_F16, 1, pg + tq_page_v_off(&g, h, t % g.page_tokens), NULL);
		}
	}
	for (int i = 0; i < iters; i++) {
		uint32_t t = (uint32_t)o->ctx + (uint32_t)(i % 64);
		uint8_t *pg = pages[t / g.page_tokens];
		int32_t pos = (int32_t)t;
		struct tq_page_table pt = { (const uint8_t *const *)pages, n_pages, t + 1, g };
		struct tq_attn_params ap = { .k_codec = kc, .v_codec = vc, .n_q_heads = NQ, .kv = &pt, .n_q = 1,
					     .q = q, .q_dtype = TQ_DTYPE_F16, .q_pos = &pos, .causal = 1, .out = out };
		double t0 = bench_now();
		for (uint32_t h = 0; h < NKV; h++) {
			tq_encode(kc, k + h * D, TQ_DTYPE_F16, 1, pg + tq_page_k_off(&g, h, t % g.page_tokens), NULL);
			tq_encode(vc, v + h * D, TQ_DTYPE_F16, 1, pg + tq_page_v_off(&g, h, t % g.page_tokens), NULL);
		}
		if (tq_attend(&ap, NULL) < 0)
			goto out;
		lat[i] = (bench_now() - t0) * 1e6;
	}
	p50 = pct(lat, iters, 0.5);
out:
	for (uint32_t i = 0; pages && i < n_pages; i++)
		free(pages[i]);
	free(pages);
	tq_codec_free(kc);
	tq_codec_free(vc);
	free(k);
	free(v);
	free(q);
	free(out);
	free(lat);
	return p50;
}

/* The baseline of the decode step on a GPU: the same work (1 token's f16
 * K/V appended after a ctx-token tq4/tq3 cache in device memory, 1 query
 * attended) on GPU dev, no ring, one thread, as two calls (tqc_append,
 * tqc_attend) and as one (tqc_append_attend), alternated; inputs and output
 * in pinned memory, as a client's registered arena.  In a process of its
 * own, so that this one, which forks the clients, never initializes CUDA.
 * p50s in µs into two[0] / one[0] (the one call's fused flag in one[1]),
 * or -1 with the reason on stderr. */
static int gpu_append_attend_p50(const struct opts *o, double *two, double *one)
{
	double *res = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pid_t pid;
	int st;

	if (res == MAP_FAILED)
		return -1;
	res[0] = res[1] = res[2] = -1;
	fflush(stdout);
	if ((pid = fork()) == 0) {
		struct tq_codec_params kp = { TQ_CODEC_TQ4, D, 11, TQ_ISA_AUTO }, vp = { TQ_CODEC_TQ3, D, 12, TQ_ISA_AUTO };
		tq_codec *kc = NULL, *vc = NULL;
		struct tq_page_geom g = { NKV, 256, 0, 0 };
		tqc_ctx *x = NULL;
		tq_error e;
		char why[256];
		void *mem = NULL;
		const uint32_t cap = (uint32_t)o->ctx + 64, chunk = 512;
		const int iters = o->iters;
		uint16_t *k = tqc_pinned_alloc(o->device, sizeof(uint16_t) * chunk * NKV * D);
		uint16_t *v = tqc_pinned_alloc(o->device, sizeof(uint16_t) * chunk * NKV * D);
		uint16_t *q = tqc_pinned_alloc(o->device, sizeof(uint16_t) * NQ * D);
		float *out = tqc_pinned_alloc(o->device, sizeof(float) * NQ * D);
		double *l2 = malloc(sizeof(double) * (size_t)iters), *l1 = malloc(sizeof(double) * (size_t)iters);
		uint32_t bad;
		int stage, fused = 1;

		if (!k || !v || !q || !out || !l2 || !l1 || tq_codec_new(&kc, NULL, &kp, &e) < 0 ||
		    tq_codec_new(&vc, NULL, &vp, &e) < 0 || tqc_ctx_new(&x, o->device, &e) < 0) {
			fprintf(stderr, "tqbench ring: GPU baseline: %s\n", k && v && q && out ? e.msg : "no pinned memory");
			_exit(1);
		}
		g.k_block_bytes = (uint32_t)tq_codec_block_bytes(kc);
		g.v_block_bytes = (uint32_t)tq_codec_block_bytes(vc);
		const uint32_t n_pages = tq_page_count(&g, cap);
		const size_t pb = tq_page_bytes(&g);
		const uint8_t **pages = calloc(n_pages, sizeof(*pages));
		if (!pages || tqc_region_alloc(o->device, (uint64_t)pb * n_pages, 0, &mem, why, sizeof(why)) < 0) {
			fprintf(stderr, "tqbench ring: GPU baseline: %s\n", pages ? why : "out of memory");
			_exit(1);
		}
		for (uint32_t i = 0; i < n_pages; i++)
			pages[i] = (const uint8_t *)mem + (size_t)i * pb;
		struct tq_page_table pt = { pages, n_pages, 0, g };
		for (uint32_t t = 0; t < (uint32_t)o->ctx; t += chunk) { /* the cache, by the GPU's encoder */
			uint32_t n = (uint32_t)o->ctx - t < chunk ? (uint32_t)o->ctx - t : chunk;
			fill_f16(k, (size_t)n * NKV * D, 1u + t);
			fill_f16(v, (size_t)n * NKV * D, 2u + t);
			struct tqc_append a = { .k_codec = kc, .v_codec = vc, .kv = &pt, .pos = t, .n = n, .k = k, .v = v,
						.dtype = TQ_DTYPE_F16 };
			if (tqc_append(x, &a, &bad, &e) < 0) {
				fprintf(stderr, "tqbench ring: GPU baseline: %s\n", e.msg);
				_exit(1);
			}
		}
		fill_f16(k, NKV * D, 5u);
		fill_f16(v, NKV * D, 6u);
		fill_f16(q, NQ * D, 3u);
		for (int i = 0; i < iters + 20; i++) {
			const uint32_t t = (uint32_t)o->ctx + (uint32_t)(i % 64);
			int32_t pos = (int32_t)t;
			struct tq_page_table at = { pages, n_pages, t, g }, qt = { pages, n_pages, t + 1, g };
			struct tqc_append a = { .k_codec = kc, .v_codec = vc, .kv = &at, .pos = t, .n = 1, .k = k, .v = v,
						.dtype = TQ_DTYPE_F16 };
			struct tq_attn_params ap = { .k_codec = kc, .v_codec = vc, .n_q_heads = NQ, .kv = &qt, .n_q = 1,
						     .q = q, .q_dtype = TQ_DTYPE_F16, .q_pos = &pos, .causal = 1,
						     .out = out };
			double t0 = bench_now();
			if (tqc_append(x, &a, &bad, &e) < 0 || tqc_attend(x, &ap, &e) < 0)
				break;
			double t1 = bench_now();
			if (tqc_append_attend(x, &a, &ap, &bad, &stage, &e) < 0)
				break;
			double t2 = bench_now();
			fused &= tqc_ctx_last_fused(x);
			if (i >= 20) {
				l2[i - 20] = (t1 - t0) * 1e6;
				l1[i - 20] = (t2 - t1) * 1e6;
			}
			if (i == iters + 19) {
				res[0] = pct(l2, iters, 0.5);
				res[1] = pct(l1, iters, 0.5);
				res[2] = fused;
			}
		}
		if (res[0] < 0)
			fprintf(stderr, "tqbench ring: GPU baseline: %s\n", e.msg);
		_exit(res[0] < 0);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
		munmap(res, 4096);
		return -1;
	}
	two[0] = res[0];
	one[0] = res[1];
	one[1] = res[2];
	munmap(res, 4096);
	return 0;
}

/* The daemon's GetStats field `key` (tqctl next to this program, a process
 * of its own: gRPC stays out of this one), or -1. */
static double daemon_stat(const char *key)
{
	char ctl[PATH_MAX + 16], cmd[PATH_MAX + 256], line[8192];
	double v = -1;
	FILE *p;

	if (sibling("tqctl", ctl, sizeof(ctl)) < 0)
		return -1;
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s/control.sock' stats --json 2>/dev/null", ctl, run_dir);
	fflush(stdout);
	if (!(p = popen(cmd, "r")))
		return -1;
	size_t n = fread(line, 1, sizeof(line) - 1, p);
	line[n] = 0;
	pclose(p);
	char pat[96];
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	const char *at = strstr(line, pat);
	if (at) {
		at += strlen(pat);
		while (*at == ' ' || *at == '"')
			at++;
		v = strtod(at, NULL);
	}
	return v;
}

/* N clients in N processes; results in shared memory. */
/* side (NULL: not read): the daemon's counters of the data path's time once
 * the clients are set up, just before they start (daemon_side's order) */
static const char *const daemon_side[5] = { "data_ops_run", "data_op_queue_us", "data_op_run_us", "gpu_busy_us",
					    "gpu_call_us" };

static int run_clients(const struct opts *o, int op, int n, double *p50, double *p99, double *ops, double *side)
{
	size_t one = sizeof(struct client_res) + sizeof(double) * (size_t)o->iters;
	size_t bytes = one * (size_t)n;
	uint8_t *shm = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pid_t pid[64];
	int bad = 0;

	barrier[0] = barrier[16] = 0;
	fflush(stdout); /* the children must not inherit unwritten output */
	for (int i = 0; i < n; i++) {
		pid[i] = fork();
		if (pid[i] == 0)
			_exit(run_client(o, op, (struct client_res *)(void *)(shm + one * (size_t)i), i) ? 1 : 0);
	}
	while (__atomic_load_n(&barrier[0], __ATOMIC_ACQUIRE) < (uint32_t)n) {
		int st;
		pid_t d = waitpid(-1, &st, WNOHANG);
		if (d > 0) { /* a client died during set-up */
			__atomic_store_n(&barrier[16], 1, __ATOMIC_RELEASE);
			break;
		}
		usleep(1000);
	}
	for (int i = 0; side && i < 5; i++)
		side[i] = daemon_stat(daemon_side[i]);
	__atomic_store_n(&barrier[16], 1, __ATOMIC_RELEASE);
	for (int i = 0; i < n; i++) {
		int st;
		if (waitpid(pid[i], &st, 0) != pid[i])
			st = 1;
		bad |= !WIFEXITED(st) || WEXITSTATUS(st);
	}
	if (bad) {
		munmap(shm, bytes);
		return -1;
	}
	double *all = malloc(sizeof(double) * (size_t)o->iters * (size_t)n);
	double t0 = 1e300, t1 = 0, total = 0;
	for (int i = 0; i < n; i++) {
		struct client_res *r = (void *)(shm + one * (size_t)i);
		memcpy(all + (size_t)i * o->iters, r->lat, sizeof(double) * (size_t)o->iters);
		total += r->n;
		t0 = r->t0 < t0 ? r->t0 : t0;
		t1 = r->t1 > t1 ? r->t1 : t1;
	}
	/* all clients' operations over the wall time from the first start to the last end */
	*ops = total / (t1 - t0);
	*p50 = pct(all, o->iters * n, 0.5);
	*p99 = pct(all, o->iters * n, 0.99);
	free(all);
	munmap(shm, bytes);
	return 0;
}

static int bench_ring_main(int argc, char **argv)
{
	struct opts o = { .clients = 4, .iters = 20000, .ctx = 4096, .attn_threads = 1 };
	int iters_set = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			o.json = 1;
		else if (!strcmp(argv[i], "--clients") && i + 1 < argc)
			o.clients = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			o.iters = atoi(argv[++i]), iters_set = 1;
		else if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
			o.ctx = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--workers") && i + 1 < argc)
			o.workers = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--attn-threads") && i + 1 < argc)
			o.attn_threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--backend") && i + 1 < argc && (!strcmp(argv[i + 1], "host") ||
									    !strcmp(argv[i + 1], "cuda")))
			o.cuda = !strcmp(argv[++i], "cuda");
		else if (!strcmp(argv[i], "--device") && i + 1 < argc)
			o.device = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: tqbench ring [--clients N] [--iters N] [--ctx T] [--workers W] "
					"[--attn-threads A] [--backend host|cuda] [--device N] [--json]\n");
			return strcmp(argv[i], "--help") ? 2 : 0;
		}
	}
	if (o.clients < 1 || o.clients > 64 || o.iters < 10 || o.ctx < 1 || o.ctx > 1 << 20 ||
	    o.workers < 0 || o.workers > 256 || o.attn_threads < 1 || o.attn_threads > 256 || o.device < 0 ||
	    o.device > 255) {
		fprintf(stderr, "tqbench ring: --clients 1..64, --iters >= 10, --ctx 1..2^20, "
				"--workers 0..256, --attn-threads 1..256, --device 0..255\n");
		return 2;
	}
	if (o.cuda) { /* a usable GPU, as tqkvd finds it (this process stays CUDA-free) */
		char bin[PATH_MAX + 16], cmd[PATH_MAX + 64], why[512] = "";
		FILE *p;
		int st = -1;
		if (sibling("tqkvd", bin, sizeof(bin)) == 0) {
			snprintf(cmd, sizeof(cmd), "'%s' --gpus 2>&1", bin);
			fflush(stdout);
			if ((p = popen(cmd, "r"))) {
				size_t n = fread(why, 1, sizeof(why) - 1, p);
				why[n] = 0;
				st = pclose(p);
			}
		}
		if (st != 0) {
			why[strcspn(why, "\n")] = 0;
			fprintf(stderr, "tqbench ring: --backend cuda: %s\n", *why ? why : "tqkvd --gpus did not run");
			return 77;
		}
	}
	barrier = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	double fx99, fx50 = futex_pingpong_p50(o.iters, &fx99);
	if (daemon_start(&o) < 0) {
		fprintf(stderr, "tqbench ring: tqkvd did not start (build it first: make)\n");
		daemon_stop();
		return 1;
	}
	if (!o.json) {
		/* the daemon's kernels pick the same ISA (TQ_ISA caps both) */
		if (o.cuda)
			printf("pool on GPU %d (the daemon's kernels and the baseline of the decode step run there)\n",
			       o.device);
		else
			printf("ISA %s (the daemon's kernels and the in-process baseline)\n", tq_isa_name(tq_isa_best()));
		printf("futex ping-pong between two processes (the floor): p50 %.2f us, p99 %.2f us\n", fx50, fx99);
		printf("%-14s %7s %9s %9s %12s   %s\n", "op", "clients", "p50_us", "p99_us", "ops_per_s",
		       "p50 vs baseline");
	} else {
		printf("{\"suite\":\"ring\",\"op\":\"futex_pingpong\",\"clients\":1,\"p50_us\":%.3f,\"p99_us\":%.3f,"
		       "\"ops_per_s\":%.0f,\"futex_pingpong_p50_us\":%.3f}\n", fx50, fx99, 1e6 / fx50, fx50);
	}
	int rc = 0;
	for (int op = 0; op < 2 && !rc; op++) {
		struct opts oo = o;
		if (op == 1 && !iters_set)
			oo.iters = 2000;
		int ns[2] = { 1, o.clients };
		double base50 = -1, two50 = -1, one[2] = { -1, 0 };
		if (op == 1 && o.cuda) {
			if (gpu_append_attend_p50(&oo, &two50, one) < 0) {
				fprintf(stderr, "tqbench ring: the GPU baseline failed\n");
				rc = 1;
				break;
			}
			base50 = one[0];
			if (!o.json)
				printf("(baseline of append_attend on the GPU, no ring, 1 thread: one call p50 %.2f us%s, "
				       "two calls p50 %.2f us)\n", one[0], one[1] > 0 ? "" : " (NOT queued: two calls)",
				       two50);
		} else if (op == 1 && (base50 = inproc_append_attend_p50(&oo)) < 0) {
			fprintf(stderr, "tqbench ring: the in-process baseline failed\n");
			rc = 1;
			break;
		}
		if (op == 1 && !o.cuda && !o.json)
			printf("(in-process baseline of append_attend, no ring, 1 thread: p50 %.2f us)\n", base50);
		for (int k = 0; k < (o.clients > 1 ? 2 : 1); k++) {
			double p50, p99, ops;
			/* the daemon's side of the decode steps: queued, in a worker, on the GPU */
			double d0[5] = { -1, -1, -1, -1, -1 }, d1[5];
			if (run_clients(&oo, op, ns[k], &p50, &p99, &ops, op ? d0 : NULL) < 0) {
				fprintf(stderr, "tqbench ring: a client failed (%s, %d clients)\n",
					op ? "append_attend" : "nop", ns[k]);
				rc = 1;
				break;
			}
			const char *name = op ? "append_attend" : "nop";
			/* the ratio to this run's baseline: the futex floor for NOP,
			 * the same work in-process for the decode step */
			double base = op ? base50 : fx50;
			if (o.json) {
				printf("{\"suite\":\"ring\",\"op\":\"%s\",\"clients\":%d,\"p50_us\":%.3f,\"p99_us\":%.3f,"
				       "\"ops_per_s\":%.0f,\"futex_pingpong_p50_us\":%.3f,\"%s\":%.3f,\"p50_vs_baseline\":%.3f,"
				       "\"ctx\":%d,\"k_codec\":\"tq4\",\"v_codec\":\"tq3\",\"q_heads\":%d,\"kv_heads\":%d,"
				       "\"head_dim\":%d,\"workers\":%d,\"attn_threads\":%d,\"isa\":\"%s\",\"backend\":\"%s\"",
				       name, ns[k], p50, p99, ops, fx50, op ? "inproc_p50_us" : "baseline_p50_us", base,
				       p50 / base, op ? o.ctx : 0, NQ, NKV, D, o.workers, o.attn_threads,
				       tq_isa_name(tq_isa_best()), o.cuda ? "cuda" : "host");
				if (op == 1 && o.cuda)
					printf(",\"gpu_two_calls_p50_us\":%.3f,\"gpu_one_call_queued\":%s", two50,
					       one[1] > 0 ? "true" : "false");
				printf("}\n");
			} else {
				printf("%-14s %7d %9.2f %9.2f %12.0f   %.3f x %s\n", name, ns[k], p50, p99, ops, p50 / base,
				       !op ? "futex floor" : o.cuda ? "the GPU call, no ring" : "in-process");
			}
			for (int i = 0; i < 5; i++)
				d1[i] = op ? daemon_stat(daemon_side[i]) : -1;
			const double nrun = d1[0] - d0[0];
			if (op == 1 && nrun > 0 && d0[0] >= 0 && d0[1] >= 0 && d0[2] >= 0) {
				/* means over the timed steps, their warm-up, the truncates and closes */
				const double qd = (d1[1] - d0[1]) / nrun, rn = (d1[2] - d0[2]) / nrun;
				const double gp = o.cuda && d0[3] >= 0 ? (d1[3] - d0[3]) / nrun : -1;
				const double gc = o.cuda && d0[4] >= 0 ? (d1[4] - d0[4]) / nrun : -1;
				if (o.json)
					printf("{\"suite\":\"ring\",\"op\":\"daemon_side\",\"clients\":%d,\"ops_run\":%.0f,"
					       "\"queued_us_mean\":%.3f,\"worker_us_mean\":%.3f,\"gpu_call_us_mean\":%.3f,"
					       "\"gpu_us_mean\":%.3f}\n", ns[k], nrun, qd, rn, gc, gp);
				else
					printf("    in tqkvd, means of %.0f ops: %.2f us queued for a worker, %.2f us in one%s",
					       nrun, qd, rn, gp >= 0 ? "" : "\n");
				if (!o.json && gp >= 0)
					printf(": %.2f us in the GPU call, %.2f us of it GPU time\n", gc, gp);
			}
			fflush(stdout);
		}
	}
	if (!rc && o.cuda) { /* the daemon's side: did its decode steps wait once? */
		double steps = daemon_stat("gpu_decode_steps"), one = daemon_stat("gpu_decode_steps_one_wait");
		double fails = daemon_stat("gpu_kernel_failures"), busy = daemon_stat("gpu_busy_us");
		if (o.json)
			printf("{\"suite\":\"ring\",\"op\":\"gpu_stats\",\"backend\":\"cuda\",\"decode_steps\":%.0f,"
			       "\"decode_steps_one_wait\":%.0f,\"kernel_failures\":%.0f,\"gpu_busy_us\":%.0f}\n", steps,
			       one, fails, busy);
		else
			printf("tqkvd: %.0f decode steps in one call, %.0f of them with one wait; %.0f kernel failures; "
			       "%.3f s of GPU time\n", steps, one, fails, busy / 1e6);
		if (steps <= 0 || one != steps || fails != 0)
			rc = 1; /* every step is a decode token's: each must have waited once */
	}
	daemon_stop();
	return rc;
}

TQ_BENCH_SUITE(ring, "ring [--clients N] [--iters N] [--ctx T] [--workers W] [--attn-threads A] "
		     "[--backend host|cuda] [--device N] [--json]",
	       bench_ring_main)
