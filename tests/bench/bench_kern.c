/* bench_kern.c — `tqbench kern`: the fused attention's inner loops alone, per
 * token and KV head, on data that stays in L1.
 *
 * `tqbench attn` times whole calls, where memory, threads and the driver
 * blur what one inner loop gained; this suite times the three steps of one
 * row block (4 query rows of a GQA group) over one chunk (TQA_CHUNK tokens),
 * as tq_attn.c runs them at d = 128, for each key and value codec:
 *   scores  = qprep (amortized: once per call, excluded) + scores_d128, or
 *             the tile decoder + scores where an ISA has no d128 scorer;
 *   softmax = the online-softmax step;
 *   accum   = accum_d128, or the tile decoder + accum.
 * The baseline, measured in the same run, is the same steps over f16
 * blocks (our fp16 kernel's loops); `/f16` is the ratio of the two totals
 * (K codec's scores + softmax + V codec's accum, against f16's three).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "tq_attn_internal.h"

#define KD 128

static double best_ns(double a, double b)
{
	return a < b ? a : b;
}

/* ns per token of each step for codec c, best of `reps` timed batches */
static void kern_time(const struct tqa_ops *o, const tq_codec *c, const uint8_t *blk, int reps,
		      double *sc_ns, double *sm_ns, double *ac_ns)
{
	enum { N = TQA_CHUNK, ITER = 200 };
	static float q[TQA_ROWS * KD] __attribute__((aligned(64)));
	static uint8_t qp[TQA_QPREP_BYTES] __attribute__((aligned(64)));
	static float s[TQA_CHUNK * TQA_ROWS] __attribute__((aligned(64)));
	static float p[TQA_CHUNK * TQA_ROWS] __attribute__((aligned(64)));
	static float acc[TQA_ROWS * KD] __attribute__((aligned(64)));
	static float tile[TQA_CHUNK * KD] __attribute__((aligned(64)));
	static float scale[TQA_CHUNK];
	const int id = tq_codec_id(c);
	const int vis[TQA_ROWS] = { N, N, N, N };
	float m[TQA_ROWS], l[TQA_ROWS], al[TQA_ROWS];

	for (int i = 0; i < TQA_ROWS * KD; i++)
		q[i] = 0.05f * sinf(0.37f * (float)i + 1.0f);
	for (int i = 0; i < TQA_ROWS * KD; i++)
		acc[i] = 0.0f;
	const int prep = o->qprep_d128[id] && o->scores_d128[id];
	if (prep)
		o->qprep_d128[id](c, q, qp);
	const float *qq = prep ? (const float *)(const void *)qp : q;
	*sc_ns = *sm_ns = *ac_ns = INFINITY;
	for (int r = 0; r < reps; r++) {
		double t0 = bench_now();
		for (int it = 0; it < ITER; it++) {
			if (o->scores_d128[id]) {
				o->scores_d128[id](c, blk, N, qq, s);
			} else {
				const float *t = o->decode(c, blk, N, tile, scale);
				o->scores(q, t, scale, N, KD, s);
			}
			bench_sink(s);
		}
		double t1 = bench_now();
		for (int it = 0; it < ITER; it++) {
			memcpy(p, s, sizeof(p));
			for (int k = 0; k < TQA_ROWS; k++) {
				m[k] = -INFINITY;
				l[k] = 0.0f;
			}
			o->softmax(p, N, vis, m, l, al);
			bench_sink(p);
		}
		double t2 = bench_now();
		for (int it = 0; it < ITER; it++) {
			if (o->accum_d128[id]) {
				o->accum_d128[id](c, blk, N, acc, al, p);
			} else {
				const float *t = o->decode(c, blk, N, tile, scale);
				o->accum(acc, al, p, scale, t, N, KD);
			}
			bench_sink(acc);
		}
		double t3 = bench_now();
		*sc_ns = best_ns(*sc_ns, (t1 - t0) * 1e9 / (ITER * N));
		*sm_ns = best_ns(*sm_ns, (t2 - t1) * 1e9 / (ITER * N));
		*ac_ns = best_ns(*ac_ns, (t3 - t2) * 1e9 / (ITER * N));
	}
}

static const struct tqa_ops *kern_ops(enum tq_isa isa)
{
	switch (isa) {
	case TQ_ISA_SCALAR: return &tqa_ops_scalar;
	case TQ_ISA_AVX2: return tqa_ops_avx2();
	case TQ_ISA_AVX512: return tqa_ops_avx512();
	case TQ_ISA_NEON: return tqa_ops_neon();
	default: return NULL;
	}
}

static int bench_kern_main(int argc, char **argv)
{
	static const enum tq_codec_id ids[] = { TQ_CODEC_TQ4, TQ_CODEC_TQ3, TQ_CODEC_TQ2, TQ_CODEC_Q8,
						TQ_CODEC_F16, TQ_CODEC_TQ4O, TQ_CODEC_TQ3O };
	enum { NC = sizeof(ids) / sizeof(ids[0]) };
	enum tq_isa isa = tq_isa_best();
	int json = 0, reps = 25;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
			int v = tq_isa_from_name(argv[++i]);
			if (v < 0 || v == TQ_ISA_AUTO) {
				fprintf(stderr, "tqbench kern: unknown isa %s\n", argv[i]);
				return 2;
			}
			isa = (enum tq_isa)v;
		} else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
			reps = atoi(argv[++i]);
			if (reps < 1 || reps > 100000) {
				fprintf(stderr, "tqbench kern: --reps wants 1..100000\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: tqbench kern [--isa scalar|avx2|avx512|neon] [--reps R] [--json]\n"
			       "  The fused attention's inner loops (tq_attn_internal.h) at d = 128, one\n"
			       "  row block of 4 query rows over one chunk of %d tokens, in L1: ns per\n"
			       "  token and KV head of the key scoring (the query preparation excluded:\n"
			       "  once per call), the softmax step and the value accumulation, best of R\n"
			       "  (default 25) batches, for each codec.  Baseline in the same run: f16\n"
			       "  blocks through the same steps (our fp16 kernel).  Default --isa: the\n"
			       "  best this CPU runs.\n", TQA_CHUNK);
			return 0;
		} else {
			fprintf(stderr, "tqbench kern: unknown option %s (try --help)\n", argv[i]);
			return 2;
		}
	}
	if (!tq_attn_isa_supported(isa) || !kern_ops(isa)) {
		fprintf(stderr, "tqbench kern: isa %s not available here\n", tq_isa_name(isa));
		return 1;
	}
	const struct tqa_ops *o = kern_ops(isa);
	tq_cache *cache = tq_cache_new();
	double sc[NC], sm[NC], ac[NC];
	float *x = malloc((size_t)TQA_CHUNK * KD * sizeof(float));
	if (!cache || !x) {
		fprintf(stderr, "tqbench kern: out of memory\n");
		return 1;
	}
	for (int i = 0; i < TQA_CHUNK * KD; i++)
		x[i] = sinf(0.11f * (float)i) + 0.3f * cosf(0.53f * (float)i);
	/* pass 0 warms the core up (its clock rises under load: the first
	 * figures of a cold run read up to 1.4 x slower); pass 1 is reported */
	for (int pass = 0; pass < 2; pass++) {
		for (int ci = 0; ci < NC; ci++) {
			struct tq_codec_params cp = { .id = ids[ci], .dim = KD, .seed = 11 };
			tq_codec *c;
			tq_error err;
			if (tq_codec_new(&c, cache, &cp, &err)) {
				fprintf(stderr, "tqbench kern: %s\n", err.msg);
				return 1;
			}
			uint8_t *blk = aligned_alloc(64, ((size_t)TQA_CHUNK * tq_codec_block_bytes(c) + 63) & ~(size_t)63);
			if (!blk || tq_encode(c, x, TQ_DTYPE_F32, TQA_CHUNK, blk, &err)) {
				fprintf(stderr, "tqbench kern: encode %s failed\n", tq_codec_name(ids[ci]));
				return 1;
			}
			kern_time(o, c, blk, pass ? reps : 1 + reps / 5, &sc[ci], &sm[ci], &ac[ci]);
			free(blk);
			tq_codec_free(c);
		}
	}
	const int f16 = 4; /* ids[4] */
	const double base = sc[f16] + sm[f16] + ac[f16];
	if (!json)
		printf("kern d %d  chunk %d  4 rows  isa %s  ns per token and KV head (in L1)\n"
		       "  %-5s %8s %8s %8s   %s\n", KD, TQA_CHUNK, tq_attn_isa_label(isa), "codec", "scores",
		       "softmax", "accum", "K scores + softmax + V accum, / f16");
	for (int ci = 0; ci < NC; ci++) {
		if (json)
			printf("{\"suite\":\"kern\",\"isa\":\"%s\",\"dim\":%d,\"codec\":\"%s\",\"scores_ns\":%.3f,"
			       "\"softmax_ns\":%.3f,\"accum_ns\":%.3f,\"f16_total_ns\":%.3f}\n",
			       tq_isa_name(isa), KD, tq_codec_name(ids[ci]), sc[ci], sm[ci], ac[ci], base);
		else
			printf("  %-5s %8.2f %8.2f %8.2f   as K and V: %.2f ns, %.3f x f16\n",
			       tq_codec_name(ids[ci]), sc[ci], sm[ci], ac[ci], sc[ci] + sm[ci] + ac[ci],
			       (sc[ci] + sm[ci] + ac[ci]) / base);
	}
	if (!json) {
		/* the pairs of BENCHMARKS.md section 2 */
		const double p43 = sc[0] + sm[0] + ac[1], p84 = sc[3] + sm[3] + ac[0];
		printf("  K tq4 / V tq3: %.2f ns, %.3f x f16;  K q8 / V tq4: %.2f ns, %.3f x f16\n", p43,
		       p43 / base, p84, p84 / base);
		const double po3 = sc[5] + sm[5] + ac[1];
		printf("  K tq4o / V tq3: %.2f ns, %.3f x f16\n", po3, po3 / base);
	}
	free(x);
	tq_cache_free(cache);
	return 0;
}

TQ_BENCH_SUITE(kern, "kern [--isa I] [--reps R] [--json]", bench_kern_main)
