/* test_codec_simd — every SIMD path this CPU runs against the scalar
 * reference: encoded bytes, decoded floats (memcmp), error codes, error
 * messages and the "nothing written at or after the bad vector" rule must be
 * identical, for every codec × input dtype × a spread of head dims. */
#include <errno.h>
#include <float.h>
#include <string.h>

#include "harness.h"
#include "tietest.h"
#include "tq_codec.h"
#include "tq_internal.h"

#define NV 48   /* vectors per batch */

static tq_cache *cache;
static const int dims[] = { 8, 16, 24, 64, 96, 128, 200, 256, 512 };
#define NDIMS ((int)(sizeof(dims) / sizeof(dims[0])))
static const enum tq_isa isas[] = { TQ_ISA_AVX2, TQ_ISA_AVX512, TQ_ISA_NEON };
#define NISAS ((int)(sizeof(isas) / sizeof(isas[0])))
static const enum tq_dtype dtypes[] = { TQ_DTYPE_F32, TQ_DTYPE_F16, TQ_DTYPE_BF16 };

/* ---- inputs --------------------------------------------------------------------- */

/* Write x[dim] as `dtype` into row (rounding to the narrow type). */
static void put_row(void *row, enum tq_dtype dt, const float *x, int dim)
{
	for (int i = 0; i < dim; i++) {
		if (dt == TQ_DTYPE_F32)
			((float *)row)[i] = x[i];
		else if (dt == TQ_DTYPE_F16)
			((uint16_t *)row)[i] = tq_f32_to_f16(x[i]);
		else
			((uint16_t *)row)[i] = tq_f32_to_bf16(x[i]);
	}
}

static float bits_f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* Vector kind k of a batch: Gaussian, outlier channels, tiny, huge,
 * zeros, signed zeros, ties for q4a / f16 rounding. */
static void gen_vec(struct tq_rng *r, int kind, float *x, int dim, enum tq_dtype dt, enum tq_codec_id id)
{
	double amp = 1.0;
	/* fp16 blocks and q4a's fp16 header have a bounded range */
	int narrow = dt == TQ_DTYPE_F16 || id == TQ_CODEC_F16 || id == TQ_CODEC_Q4A;

	switch (kind % 12) {
	case 0: case 1: case 2:
		amp = 1.0;
		break;
	case 3:
		amp = 1e-3;
		break;
	case 4:
		amp = narrow ? 1000.0 : 1e15;      /* huge, sums still finite */
		break;
	case 5:
		amp = dt == TQ_DTYPE_F16 ? 1e-5 : 1e-19;       /* squares underflow (denormal) */
		break;
	case 6:
		amp = dt == TQ_DTYPE_F16 ? 1e-7 : 1e-39;       /* denormal inputs */
		break;
	case 7:
		memset(x, 0, sizeof(float) * (size_t)dim);
		return;
	case 8: /* signed zeros and non-negative values: q4a's min is a zero */
		for (int i = 0; i < dim; i++) {
			uint64_t u = tq_rng_next(r);
			x[i] = (u & 3) == 0 ? 0.0f : (u & 3) == 1 ? -0.0f : (float)(u >> 40) * 0x1p-20f;
		}
		if (kind % 24 == 20)
			for (int i = 0; i < dim; i++)
				x[i] = -x[i]; /* non-positive: the max is a zero */
		return;
	case 9: /* q4a ties: min -1, max 14 → scale 1, values k + 0.5 */
		for (int i = 0; i < dim; i++)
			x[i] = -1.0f + (float)(tq_rng_next(r) % 15) + 0.5f;
		x[0] = -1.0f;
		x[dim - 1] = 14.0f;
		return;
	case 10: /* fp16 rounding ties and the edge of its range */
		for (int i = 0; i < dim; i++) {
			uint64_t u = tq_rng_next(r);
			static const float t[] = { 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0x1p-25f, 3 * 0x1p-25f,
						   65504.0f, 65519.0f, -65519.0f, 0x1p-14f, 0x1.ffcp-15f };
			/* bf16 rounds 65504 up to 65536: keep it inside fp16 there */
			x[i] = t[u % 9] * ((u >> 8) & 1 ? -1.0f : 1.0f) * (dt == TQ_DTYPE_BF16 ? 0.25f : 1.0f);
		}
		return;
	default: /* outlier channels */
		for (int i = 0; i < dim; i++)
			x[i] = (float)tq_rng_gauss(r) * (i % 17 == 3 ? 80.0f : 1.0f);
		return;
	}
	for (int i = 0; i < dim; i++)
		x[i] = (float)(tq_rng_gauss(r) * amp);
	if (kind % 12 == 1)
		for (int i = 0; i < dim; i += 7)
			x[i] = (float)(tq_rng_gauss(r) * 100.0);
}

/* ---- exact ties on the codebook bounds: tietest.h ---------------------------------- */
static uint64_t rng_next(void *r)
{
	return tq_rng_next(r);
}

/* ---- comparisons ---------------------------------------------------------------------- */

static int n_checked, n_ties;

/* Encode with the reference and with `c` (a SIMD codec): same return, same
 * message, same bytes in all of dst (pre-filled with a pattern). */
static int cmp_encode(const tq_codec *ref, const tq_codec *c, const void *src, enum tq_dtype dt,
		      size_t n, int *rc_out)
{
	size_t bb = tq_codec_block_bytes(c), sz = bb * n;
	uint8_t *a = malloc(sz + 1), *b = malloc(sz + 1);
	tq_error ea = { "" }, eb = { "" };
	int ok;

	memset(a, 0xa5, sz + 1);
	memset(b, 0xa5, sz + 1);
	int ra = tq_encode_ref(ref, src, dt, n, a, &ea);
	int rb = tq_encode(c, src, dt, n, b, &eb);
	ok = ra == rb && !memcmp(a, b, sz + 1) && (ra == 0 || !strcmp(ea.msg, eb.msg));
	if (!ok) {
		size_t v = 0;
		while (v < n && !memcmp(a + v * bb, b + v * bb, bb))
			v++;
		fprintf(stderr, "    %s d=%d %s isa=%s: rc %d/%d msg '%s' / '%s', first differing block %zu\n",
			tq_codec_name(tq_codec_id(c)), tq_codec_dim(c), tq_dtype_name(dt),
			tq_isa_name(tq_codec_isa(c)), ra, rb, ea.msg, eb.msg, v);
	}
	if (rc_out)
		*rc_out = ra;
	free(a);
	free(b);
	n_checked++;
	return ok;
}

static int cmp_decode(const tq_codec *ref, const tq_codec *c, const uint8_t *blocks, size_t n)
{
	size_t sz = sizeof(float) * (size_t)tq_codec_dim(c) * n;
	float *a = malloc(sz + 4), *b = malloc(sz + 4);
	int ok;

	memset(a, 0x5a, sz + 4);
	memset(b, 0x5a, sz + 4);
	tq_decode_ref(ref, blocks, n, a);
	tq_decode(c, blocks, n, b);
	ok = !memcmp(a, b, sz + 4);
	if (!ok) {
		size_t i = 0;
		while (!memcmp(a + i, b + i, 4))
			i++;
		fprintf(stderr, "    decode %s d=%d isa=%s: first difference at float %zu (vector %zu): %a vs %a\n",
			tq_codec_name(tq_codec_id(c)), tq_codec_dim(c), tq_isa_name(tq_codec_isa(c)), i,
			i / (size_t)tq_codec_dim(c), a[i], b[i]);
	}
	free(a);
	free(b);
	return ok;
}

static int new_pair(enum tq_codec_id id, int dim, enum tq_isa isa, tq_codec **ref, tq_codec **c)
{
	struct tq_codec_params p = { .id = id, .dim = dim, .seed = 0x1234 + (uint64_t)dim, .isa = TQ_ISA_SCALAR };
	tq_error err;

	if (tq_codec_new(ref, cache, &p, &err) < 0) {
		fprintf(stderr, "    %s\n", err.msg);
		return -1;
	}
	p.isa = isa;
	if (tq_codec_new(c, cache, &p, &err) < 0) {
		fprintf(stderr, "    %s\n", err.msg);
		tq_codec_free(*ref);
		return -1;
	}
	return 0;
}

static int any_isa(void)
{
	for (int i = 0; i < NISAS; i++)
		if (tq_isa_supported(isas[i]))
			return 1;
	return 0;
}

/* ---- cases ---------------------------------------------------------------------------- */

/* Good inputs of every kind: encode identical; decode of the blocks identical. */
static void test_encode_decode(void)
{
	struct tq_rng rng;
	float x[TQ_DIM_MAX];

	tq_rng_seed(&rng, t_seed());
	for (int ii = 0; ii < NISAS; ii++) {
		if (!tq_isa_supported(isas[ii]))
			continue;
		for (int id = 0; id < TQ_CODEC__COUNT; id++)
			for (int di = 0; di < NDIMS; di++) {
				int d = dims[di];
				tq_codec *ref, *c;
				if (tq_block_bytes((enum tq_codec_id)id, d, NULL) < 0)
					continue; /* tq*o: dims of 16s */
				T_ASSERT(new_pair((enum tq_codec_id)id, d, isas[ii], &ref, &c) == 0);
				T_EQ(tq_codec_isa(c), isas[ii]); /* tq*o too */
				size_t bb = tq_codec_block_bytes(c);
				uint8_t *src = malloc(4u * TQ_DIM_MAX * NV), *blk = malloc(bb * NV);
				for (int t = 0; t < 3; t++) {
					enum tq_dtype dt = dtypes[t];
					size_t rb = tq_dtype_size(dt) * (size_t)d;
					for (int v = 0; v < NV; v++) {
						gen_vec(&rng, v + t, x, d, dt, (enum tq_codec_id)id);
						put_row(src + v * rb, dt, x, d);
					}
					int rc;
					int ok = cmp_encode(ref, c, src, dt, NV, &rc);
					if (ok && rc == 0) {
						tq_encode_ref(ref, src, dt, NV, blk, NULL);
						ok = cmp_decode(ref, c, blk, NV);
					}
					if (!ok || rc != 0) {
						if (rc != 0)
							fprintf(stderr, "    unexpected rc %d\n", rc);
						free(src);
						free(blk);
						tq_codec_free(ref);
						tq_codec_free(c);
						T_FAIL("%s d=%d %s %s", tq_codec_name((enum tq_codec_id)id), d,
						       tq_dtype_name(dt), tq_isa_name(isas[ii]));
					}
				}
				free(src);
				free(blk);
				tq_codec_free(ref);
				tq_codec_free(c);
			}
	}
}

/* Rotated coordinates exactly on a codebook bound (index = bounds strictly below). */
static void test_bound_ties(void)
{
	struct tq_rng rng;
	float x[TQ_DIM_MAX];

	tq_rng_seed(&rng, t_seed() ^ 0x77);
	for (int ii = 0; ii < NISAS; ii++) {
		if (!tq_isa_supported(isas[ii]))
			continue;
		for (int id = TQ_CODEC_TQ2; id <= TQ_CODEC_TQ4; id++)
			for (int di = 0; di < NDIMS; di++) {
				int d = dims[di], found = 0;
				tq_codec *ref, *c;
				if (tq_block_bytes((enum tq_codec_id)id, d, NULL) < 0)
					continue; /* tq*o: dims of 16s */
				T_ASSERT(new_pair((enum tq_codec_id)id, d, isas[ii], &ref, &c) == 0);
				float *src = malloc(sizeof(float) * TQ_DIM_MAX * 4);
				for (int v = 0; v < 4; v++) {
					if (tie_make(ref, rng_next, &rng, x))
						found++;
					memcpy(src + (size_t)v * d, x, sizeof(float) * (size_t)d);
				}
				n_ties += found;
				int ok = cmp_encode(ref, c, src, TQ_DTYPE_F32, 4, NULL);
				free(src);
				tq_codec_free(ref);
				tq_codec_free(c);
				if (!ok)
					T_FAIL("tie vectors: %s d=%d", tq_codec_name((enum tq_codec_id)id), d);
			}
	}
	fprintf(stderr, "    %d vectors with a coordinate exactly on a bound\n", n_ties);
	T_ASSERT(n_ties >= 20);
}

/* A bad vector at position `bad` of a batch: same code, same message, the
 * blocks before it written, nothing at or after it. */
static void test_bad_inputs(void)
{
	struct tq_rng rng;
	float x[TQ_DIM_MAX];

	tq_rng_seed(&rng, t_seed() ^ 0x99);
	for (int ii = 0; ii < NISAS; ii++) {
		if (!tq_isa_supported(isas[ii]))
			continue;
		for (int id = 0; id < TQ_CODEC__COUNT; id++)
			for (int di = 0; di < NDIMS; di += 2) {
				int d = dims[di];
				tq_codec *ref, *c;
				if (tq_block_bytes((enum tq_codec_id)id, d, NULL) < 0)
					continue; /* tq*o: dims of 16s */
				T_ASSERT(new_pair((enum tq_codec_id)id, d, isas[ii], &ref, &c) == 0);
				uint8_t *src = malloc(4u * TQ_DIM_MAX * 8);
				int ok = 1;
				for (int t = 0; t < 3 && ok; t++)
					for (int kind = 0; kind < 7 && ok; kind++) {
						enum tq_dtype dt = dtypes[t];
						size_t rb = tq_dtype_size(dt) * (size_t)d;
						int bad = (int)(tq_rng_next(&rng) % 8), el = (int)(tq_rng_next(&rng) % (uint64_t)d);
						for (int v = 0; v < 8; v++) {
							gen_vec(&rng, 0, x, d, dt, (enum tq_codec_id)id);
							if (v == bad) {
								switch (kind) {
								case 0: x[el] = bits_f(0x7fc00000u); break;             /* qNaN */
								case 1: x[el] = bits_f(0xff800000u); break;             /* -Inf */
								case 2: x[el] = bits_f(0x7f800001u); break;             /* sNaN */
								case 3: for (int i = 0; i < d; i++) x[i] = 1e20f; break;   /* norm overflows */
								case 4: x[el] = 70000.0f; break;                        /* beyond fp16 */
								case 5: x[el] = 3e38f; x[(el + 1) % d] = -3e38f; break; /* range overflows */
								default: for (int i = 0; i < d; i++) x[i] = -65520.0f - (float)i; break;
								}
							}
							put_row(src + v * rb, dt, x, d);
						}
						int rc;
						ok = cmp_encode(ref, c, src, dt, 8, &rc);
						if (ok && kind <= 1 && rc != -EINVAL) {
							fprintf(stderr, "    NaN/Inf not refused: rc %d\n", rc);
							ok = 0;
						}
					}
				free(src);
				tq_codec_free(ref);
				tq_codec_free(c);
				if (!ok)
					T_FAIL("%s d=%d %s", tq_codec_name((enum tq_codec_id)id), d, tq_isa_name(isas[ii]));
			}
	}
}

/* Arbitrary block bytes (random planes and headers, NaN/Inf headers,
 * fp16 NaN payloads): decoded floats identical. */
static void test_decode_any_bytes(void)
{
	struct tq_rng rng;

	tq_rng_seed(&rng, t_seed() ^ 0x55);
	for (int ii = 0; ii < NISAS; ii++) {
		if (!tq_isa_supported(isas[ii]))
			continue;
		for (int id = 0; id < TQ_CODEC__COUNT; id++)
			for (int di = 0; di < NDIMS; di++) {
				int d = dims[di];
				tq_codec *ref, *c;
				if (tq_block_bytes((enum tq_codec_id)id, d, NULL) < 0)
					continue; /* tq*o: dims of 16s */
				T_ASSERT(new_pair((enum tq_codec_id)id, d, isas[ii], &ref, &c) == 0);
				size_t bb = tq_codec_block_bytes(c);
				uint8_t *blk = malloc(bb * NV);
				for (size_t i = 0; i < bb * NV; i++)
					blk[i] = (uint8_t)tq_rng_next(&rng);
				for (int v = 0; v < NV; v++) {
					uint8_t *p = blk + (size_t)v * bb;
					float h;
					uint16_t hh[2];
					switch (v % 6) {
					case 0: h = (float)tq_rng_gauss(&rng); break;
					case 1: h = 0.0f; break;
					case 2: h = 3e38f; break;                    /* overflows inside */
					case 3: h = bits_f(0x7fa00001u); break;      /* NaN */
					case 4: h = bits_f(0x7f800000u); break;      /* Inf */
					default: continue;                           /* raw bytes */
					}
					if (id == TQ_CODEC_Q4A) {
						hh[0] = tq_f32_to_f16(h);
						hh[1] = tq_f32_to_f16((float)tq_rng_gauss(&rng));
						memcpy(p, hh, 4);
					} else if (tq_codec_id_parts((enum tq_codec_id)id) == 2) {
						/* h as either half's bf16 scale (its top 16 bits:
						 * NaN, Inf and the overflowing one stay so) */
						uint32_t u;
						memcpy(&u, &h, 4);
						hh[v & 1] = (uint16_t)(u >> 16);
						hh[!(v & 1)] = tq_f32_to_bf16((float)tq_rng_gauss(&rng));
						memcpy(p, hh, 4);
					} else if (id != TQ_CODEC_F16 && id != TQ_CODEC_F32) {
						memcpy(p, &h, 4);
					}
				}
				int ok = cmp_decode(ref, c, blk, NV);
				free(blk);
				tq_codec_free(ref);
				tq_codec_free(c);
				if (!ok)
					T_FAIL("%s d=%d %s", tq_codec_name((enum tq_codec_id)id), d, tq_isa_name(isas[ii]));
			}
	}
}

/* A codec sharing ref's rotation and codebook: id changed (same dim and
 * seed give the same rotation), path pinned to isa, its tables prepared.
 * Free with clone_free(). */
static tq_codec *clone_codec(const tq_codec *ref, enum tq_codec_id id, enum tq_isa isa)
{
	tq_codec *c = malloc(sizeof(*c));
	const tq_codebook *cb;

	*c = *ref;
	c->id = id;
	c->bits = tq_codec_bits(id);
	c->block_bytes = (uint32_t)tq_block_bytes(id, ref->dim, NULL);
	if ((id == TQ_CODEC_TQ2 || id == TQ_CODEC_TQ3 || id == TQ_CODEC_TQ4) &&
	    tq_cache_get(cache, ref->dim, c->bits, &cb, NULL) == 0)
		c->cb = *cb;
	c->ops = isa == TQ_ISA_AVX2 ? tq_codec_ops_avx2() : isa == TQ_ISA_AVX512 ? tq_codec_ops_avx512()
		 : isa == TQ_ISA_NEON ? tq_codec_ops_neon() : &tq_codec_ops_scalar;
	c->isa_ctx = c->ops->prepare ? c->ops->prepare(c) : NULL;
	return c;
}

static void clone_free(tq_codec *c)
{
	free(c->isa_ctx);
	free(c);
}

/* Every supported dim, the rotated codecs and q4a on Gaussian and outlier
 * vectors, f32 input: the shapes the lists above do not name.  Dense
 * rotations take a while to build, so by default the dims above 256 are
 * sampled; TQ_TEST_FULL=1 runs all 64. */
static void test_all_dims(void)
{
	struct tq_rng rng;
	float x[TQ_DIM_MAX];
	static const enum tq_codec_id ids[] = { TQ_CODEC_TQ2, TQ_CODEC_TQ3, TQ_CODEC_TQ4, TQ_CODEC_Q8, TQ_CODEC_Q4A };
	int full = getenv("TQ_TEST_FULL") && atoi(getenv("TQ_TEST_FULL"));

	tq_rng_seed(&rng, t_seed() ^ 0x33);
	for (int d = TQ_DIM_MIN; d <= TQ_DIM_MAX; d += TQ_DIM_ALIGN) {
		if (!full && d > 256 && d != 264 && d != 320 && d != 384 && d != 440 && d != 504 && d != 512)
			continue;
		struct tq_codec_params p = { .id = TQ_CODEC_TQ4, .dim = d, .seed = 77, .isa = TQ_ISA_SCALAR };
		tq_codec *base;
		T_ASSERT(tq_codec_new(&base, cache, &p, NULL) == 0);
		float *src = malloc(sizeof(float) * (size_t)d * 4);
		uint8_t *blk = malloc(4u * TQ_F32_BLOCK_BYTES(TQ_DIM_MAX));
		for (int v = 0; v < 4; v++) {
			gen_vec(&rng, v == 3 ? 11 : 0, x, d, TQ_DTYPE_F32, TQ_CODEC_TQ4);
			memcpy(src + (size_t)v * d, x, sizeof(float) * (size_t)d);
		}
		int ok = 1;
		for (int k = 0; k < 5 && ok; k++) {
			tq_codec *ref = clone_codec(base, ids[k], TQ_ISA_SCALAR);
			if (ids[k] == TQ_CODEC_Q4A)
				ref->rot.kind = TQ_ROT_NONE; /* unrotated; mat/sign unused */
			for (int ii = 0; ii < NISAS && ok; ii++) {
				if (!tq_isa_supported(isas[ii]))
					continue;
				tq_codec *c = clone_codec(ref, ids[k], isas[ii]);
				int rc;
				ok = cmp_encode(ref, c, src, TQ_DTYPE_F32, 4, &rc) && rc == 0;
				if (ok) {
					tq_encode_ref(ref, src, TQ_DTYPE_F32, 4, blk, NULL);
					ok = cmp_decode(ref, c, blk, 4);
				}
				clone_free(c);
				if (!ok)
					fprintf(stderr, "    %s d=%d %s\n", tq_codec_name(ids[k]), d, tq_isa_name(isas[ii]));
			}
			clone_free(ref);
		}
		free(src);
		free(blk);
		tq_codec_free(base);
		if (!ok)
			T_FAIL("every-dim sweep");
	}
}

/* Large batches take the streaming-store decode path. */
static void test_large_batch(void)
{
	struct tq_rng rng;
	const size_t n = 40000; /* 20 MiB of output at d = 128 */
	float *x = malloc(sizeof(float) * 128 * n), *a = NULL, *b = NULL;
	uint8_t *blk = NULL;

	tq_rng_seed(&rng, t_seed() ^ 0x11);
	for (size_t i = 0; i < 128 * n; i++)
		x[i] = (float)tq_rng_gauss(&rng);
	a = aligned_alloc(64, sizeof(float) * 128 * n);
	b = aligned_alloc(64, sizeof(float) * 128 * n);
	blk = malloc(TQ_TQ_BLOCK_BYTES(128, 4) * n);
	for (int ii = 0; ii < 2 * NISAS; ii++) {
		const enum tq_codec_id id = ii < NISAS ? TQ_CODEC_TQ4 : TQ_CODEC_TQ4O; /* same bytes */
		if (!tq_isa_supported(isas[ii % NISAS]))
			continue;
		tq_codec *ref, *c;
		T_ASSERT(new_pair(id, 128, isas[ii % NISAS], &ref, &c) == 0);
		int ok = cmp_encode(ref, c, x, TQ_DTYPE_F32, n, NULL);
		tq_encode_ref(ref, x, TQ_DTYPE_F32, n, blk, NULL);
		tq_decode_ref(ref, blk, n, a);
		tq_decode(c, blk, n, b);
		ok = ok && !memcmp(a, b, sizeof(float) * 128 * n);
		tq_codec_free(ref);
		tq_codec_free(c);
		if (!ok) {
			free(x); free(a); free(b); free(blk);
			T_FAIL("large batch, %s %s", tq_codec_name(id), tq_isa_name(isas[ii % NISAS]));
		}
	}
	free(x);
	free(a);
	free(b);
	free(blk);
}

int main(void)
{
	if (!any_isa())
		t_skip("no SIMD path on this CPU or build (the scalar path is the only one)");
	cache = tq_cache_new();
	for (int ii = 0; ii < NISAS; ii++)
		fprintf(stderr, "    %s: %s\n", tq_isa_name(isas[ii]),
			tq_isa_supported(isas[ii]) ? "tested" : "not supported here, skipped");
	T_RUN(test_encode_decode);
	T_RUN(test_bound_ties);
	T_RUN(test_bad_inputs);
	T_RUN(test_decode_any_bytes);
	T_RUN(test_all_dims);
	T_RUN(test_large_batch);
	tq_cache_free(cache);
	return t_done();
}
