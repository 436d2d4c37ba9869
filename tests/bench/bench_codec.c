/* bench_codec — `tqbench codec`: quantize / dequantize throughput of each
 * codec on one thread, fp32 input streaming from memory, next to memcpy of
 * the same input bytes and the scalar reference, measured in the same run.
 *
 *   tqbench codec [--dim D] [--codec C] [--n N] [--reps R] [--isa I] [--json]
 *
 * Each figure is the best of R repetitions over N vectors (default 262144:
 * 128 MiB of fp32 input at d = 128, well beyond the caches).  mse: mean of
 * ||x - decode(encode(x))||^2 over 4096 random unit vectors (fast path).
 * bit_exact: the fast path's blocks and decoded floats equal the reference's.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "tq_codec.h"

struct opts {
	int dim;
	int codec;           /* -1: all */
	size_t n;
	int reps;
	enum tq_isa isa;
	int json;
};

/* xorshift64* + a sum of four uniforms: Gaussian enough for throughput, and
 * fast to fill 128 MiB with. */
static uint64_t rs = 0x9e3779b97f4a7c15ULL;
static inline uint64_t rnd(void)
{
	rs ^= rs >> 12;
	rs ^= rs << 25;
	rs ^= rs >> 27;
	return rs * 0x2545f4914f6cdd1dULL;
}
static inline float rnd_gauss(void)
{
	uint64_t u = rnd();
	float s = (float)(u & 0xffff) + (float)((u >> 16) & 0xffff) + (float)((u >> 32) & 0xffff) +
		  (float)(u >> 48);
	return (s - 131070.0f) * (1.0f / 37837.0f); /* mean 0, sd ~1 */
}

static void *xalloc(size_t bytes)
{
	void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
	if (!p) {
		fprintf(stderr, "tqbench codec: out of memory (%zu bytes)\n", bytes);
		exit(1);
	}
	memset(p, 0, bytes); /* fault the pages in before any timing */
	return p;
}

static double mse_unit(const tq_codec *c, int dim)
{
	const int nv = 4096;
	float *x = xalloc(sizeof(float) * (size_t)dim * nv), *y = xalloc(sizeof(float) * (size_t)dim * nv);
	uint8_t *b = xalloc(tq_codec_block_bytes(c) * nv);
	double sum = 0;

	for (int v = 0; v < nv; v++) {
		float *xv = x + (size_t)v * dim;
		double n2 = 0;
		for (int i = 0; i < dim; i++) {
			xv[i] = rnd_gauss();
			n2 += (double)xv[i] * xv[i];
		}
		for (int i = 0; i < dim; i++)
			xv[i] = (float)(xv[i] / sqrt(n2));
	}
	if (tq_encode(c, x, TQ_DTYPE_F32, nv, b, NULL) < 0 || tq_decode(c, b, nv, y) < 0) {
		sum = NAN;
	} else {
		for (size_t i = 0; i < (size_t)dim * nv; i++)
			sum += (double)(x[i] - y[i]) * (x[i] - y[i]);
		sum /= nv;
	}
	free(x);
	free(y);
	free(b);
	return sum;
}

struct result {
	const char *codec, *isa;
	int dim;
	size_t n;
	double mse, q, dq, rq, rdq, mc;
	int exact;
};

static int run_one(const struct opts *o, enum tq_codec_id id, tq_cache *cache, struct result *res)
{
	struct tq_codec_params p = { .id = id, .dim = o->dim, .seed = 42, .isa = o->isa };
	tq_codec *c = NULL;
	tq_error err;
	size_t n = o->n, d = (size_t)o->dim, in_bytes = n * d * sizeof(float);
	int r;

	if ((r = tq_codec_new(&c, cache, &p, &err)) < 0) {
		fprintf(stderr, "tqbench codec: %s\n", err.msg);
		return r;
	}
	size_t bb = tq_codec_block_bytes(c);
	float *src = xalloc(in_bytes), *out = xalloc(in_bytes), *out_ref = xalloc(in_bytes);
	uint8_t *blk = xalloc(bb * n), *blk_ref = xalloc(bb * n);

	for (size_t i = 0; i < n * d; i++)
		src[i] = rnd_gauss();

	double best_mc = 1e30, best_q = 1e30, best_dq = 1e30, best_rq = 1e30, best_rdq = 1e30;
	for (int rep = 0; rep < o->reps; rep++) {
		double t0 = bench_now();
		memcpy(out, src, in_bytes);
		bench_sink(out);
		double t1 = bench_now();
		if ((r = tq_encode(c, src, TQ_DTYPE_F32, n, blk, &err)) < 0)
			goto fail;
		bench_sink(blk);
		double t2 = bench_now();
		tq_decode(c, blk, n, out);
		bench_sink(out);
		double t3 = bench_now();
		best_mc = fmin(best_mc, t1 - t0);
		best_q = fmin(best_q, t2 - t1);
		best_dq = fmin(best_dq, t3 - t2);
	}
	/* the reference is slow: fewer repetitions */
	for (int rep = 0; rep < (o->reps + 1) / 2; rep++) {
		double t0 = bench_now();
		if ((r = tq_encode_ref(c, src, TQ_DTYPE_F32, n, blk_ref, &err)) < 0)
			goto fail;
		bench_sink(blk_ref);
		double t1 = bench_now();
		tq_decode_ref(c, blk_ref, n, out_ref);
		bench_sink(out_ref);
		double t2 = bench_now();
		best_rq = fmin(best_rq, t1 - t0);
		best_rdq = fmin(best_rdq, t2 - t1);
	}
	res->exact = !memcmp(blk, blk_ref, bb * n) && !memcmp(out, out_ref, in_bytes);
	res->codec = tq_codec_name(id);
	res->isa = tq_isa_name(tq_codec_isa(c));
	res->dim = o->dim;
	res->n = n;
	res->mc = (double)n / best_mc;
	res->q = (double)n / best_q;
	res->dq = (double)n / best_dq;
	res->rq = (double)n / best_rq;
	res->rdq = (double)n / best_rdq;
	res->mse = mse_unit(c, o->dim);
	r = 0;
	goto done;
fail:
	fprintf(stderr, "tqbench codec: %s\n", err.msg);
done:
	free(src);
	free(out);
	free(out_ref);
	free(blk);
	free(blk_ref);
	tq_codec_free(c);
	return r;
}

static void print_json(const struct result *r)
{
	printf("{\"suite\":\"codec\",\"codec\":\"%s\",\"dim\":%d,\"isa\":\"%s\",\"n\":%zu,"
	       "\"mse\":%.6g,\"quant_vps\":%.0f,\"dequant_vps\":%.0f,\"ref_quant_vps\":%.0f,"
	       "\"ref_dequant_vps\":%.0f,\"memcpy_vps\":%.0f,\"quant_vs_memcpy\":%.3f,"
	       "\"dequant_vs_memcpy\":%.3f,\"bit_exact\":%s}\n",
	       r->codec, r->dim, r->isa, r->n, r->mse, r->q, r->dq, r->rq, r->rdq, r->mc, r->q / r->mc,
	       r->dq / r->mc, r->exact ? "true" : "false");
	fflush(stdout);
}

static void print_row(const struct result *r, int header)
{
	if (header)
		printf("%-5s %5s %-7s %9s %9s %9s %9s %9s %9s %7s %7s %5s\n", "codec", "dim", "isa", "mse",
		       "quant", "dequant", "ref_q", "ref_dq", "memcpy", "q/mc", "dq/mc", "exact");
	printf("%-5s %5d %-7s %9.5f %8.2fM %8.2fM %8.2fM %8.2fM %8.2fM %7.3f %7.3f %5s\n", r->codec,
	       r->dim, r->isa, r->mse, r->q / 1e6, r->dq / 1e6, r->rq / 1e6, r->rdq / 1e6, r->mc / 1e6,
	       r->q / r->mc, r->dq / r->mc, r->exact ? "yes" : "NO");
	fflush(stdout);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tqbench codec [--dim D] [--codec C] [--n N] [--reps R] [--isa I] [--json]\n"
		   "  --dim D     head dim (default 128)\n"
		   "  --codec C   f16|q8|q4a|tq2|tq3|tq4|f32|tq3o|tq4o (default: all)\n"
		   "  --n N       vectors per measurement (default 262144; at least 256k to stream)\n"
		   "  --reps R    repetitions, best kept (default 5)\n"
		   "  --isa I     auto|scalar|avx2|avx512|neon (default auto)\n"
		   "  --json      JSON Lines instead of a table\n"
		   "Figures are vectors per second, one thread, fp32 input; memcpy copies the\n"
		   "same fp32 input bytes in the same run.\n");
}

static int bench_codec_main(int argc, char **argv)
{
	struct opts o = { .dim = 128, .codec = -1, .n = 262144, .reps = 5, .isa = TQ_ISA_AUTO, .json = 0 };
	tq_cache *cache;
	int r = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--json")) {
			o.json = 1;
		} else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		} else if (v && !strcmp(a, "--dim")) {
			o.dim = atoi(v), i++;
		} else if (v && !strcmp(a, "--n")) {
			o.n = strtoull(v, NULL, 0), i++;
		} else if (v && !strcmp(a, "--reps")) {
			o.reps = atoi(v), i++;
		} else if (v && !strcmp(a, "--codec")) {
			if ((o.codec = tq_codec_from_name(v)) < 0) {
				fprintf(stderr, "tqbench codec: unknown codec '%s'\n", v);
				return 2;
			}
			i++;
		} else if (v && !strcmp(a, "--isa")) {
			int isa = tq_isa_from_name(v);
			if (isa >= 0) {
				o.isa = (enum tq_isa)isa;
			} else {
				fprintf(stderr, "tqbench codec: unknown isa '%s'\n", v);
				return 2;
			}
			i++;
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (tq_dim_check(o.dim, NULL) < 0 || o.n == 0 || o.reps < 1) {
		fprintf(stderr, "tqbench codec: bad --dim, --n or --reps\n");
		return 2;
	}
	if (o.n < 262144)
		fprintf(stderr, "tqbench codec: note: --n %zu is below 256k vectors; the data may sit in cache\n", o.n);
	cache = tq_cache_new();
	/* tq first: the codecs the targets are about */
	static const enum tq_codec_id order[] = { TQ_CODEC_TQ4, TQ_CODEC_TQ3, TQ_CODEC_TQ2, TQ_CODEC_Q8,
						  TQ_CODEC_Q4A, TQ_CODEC_F16, TQ_CODEC_F32, TQ_CODEC_TQ4O,
						  TQ_CODEC_TQ3O };
	_Static_assert(sizeof(order) / sizeof(order[0]) == TQ_CODEC__COUNT, "every codec once");
	int first = 1;
	for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++) {
		struct result res;
		if (o.codec >= 0 && (int)order[k] != o.codec)
			continue;
		if ((r = run_one(&o, order[k], cache, &res)) < 0)
			break;
		if (o.json)
			print_json(&res);
		else
			print_row(&res, first);
		first = 0;
	}
	tq_cache_free(cache);
	return r < 0 ? 1 : 0;
}

TQ_BENCH_SUITE(codec, "codec [--dim D] [--codec C] [--n N] [--reps R] [--isa I] [--json]", bench_codec_main)
