/* test_codec — the reference codec: codebooks, rotations, packing, codecs,
 * distortion against the paper's figures, and every bad input. */
#include <errno.h>
#include <string.h>

#include "harness.h"
#include "tq_codec.h"
#include "tq_internal.h"

/* Golden hashes (FNV-1a of the bytes) of seeded objects; see test_determinism. */
#define GOLDEN_DENSE    0xccf54ef8de95aab2ULL
#define GOLDEN_HADAMARD 0x14d50123796fa025ULL
#define GOLDEN_CODEBOOK 0x4ad537603bbf8d31ULL
#define GOLDEN_BLOCK    0xa43fc96b75790a1fULL

static tq_cache *cache;

static void rand_unit(struct tq_rng *r, float *x, int d)
{
	double n = 0;
	for (int i = 0; i < d; i++) {
		x[i] = (float)tq_rng_gauss(r);
		n += (double)x[i] * x[i];
	}
	for (int i = 0; i < d; i++)
		x[i] = (float)(x[i] / sqrt(n));
}

static uint64_t fnv(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 0xcbf29ce484222325ULL;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

/* Plain TurboQuant-mse (rotation + Lloyd–Max, no norm correction) on unit
 * vectors: the quantity the paper reports. */
static double lm_mse(int dim, int bits, int nvec, uint64_t seed)
{
	struct tq_rotation rot;
	const tq_codebook *cb;
	struct tq_rng rng;
	float x[TQ_DIM_MAX], y[TQ_DIM_MAX], xr[TQ_DIM_MAX];
	double sum = 0;

	if (tq_rotation_init(&rot, dim, seed, NULL) < 0 || tq_cache_get(cache, dim, bits, &cb, NULL) < 0)
		return -1;
	tq_rng_seed(&rng, seed ^ 0xabcdef);
	for (int v = 0; v < nvec; v++) {
		rand_unit(&rng, x, dim);
		tq_rotation_apply_ref(&rot, x, y);
		for (int i = 0; i < dim; i++)
			y[i] = cb->centroid[tq_cb_index(cb, y[i])];
		tq_rotation_inverse_ref(&rot, y, xr);
		for (int i = 0; i < dim; i++)
			sum += (double)(x[i] - xr[i]) * (x[i] - xr[i]);
	}
	tq_rotation_destroy(&rot);
	return sum / nvec;
}

static void test_mse_paper_d128(void)
{
	const double want[5] = { 0, 0.360, 0.116, 0.0340, 0.0093 };
	for (int b = 1; b <= 4; b++) {
		double mse = lm_mse(128, b, 100000, t_seed() + (uint64_t)b);
		fprintf(stderr, "    d=128 %d bit: mse %.5f (target %.4f)\n", b, mse, want[b]);
		T_NEAR(mse, want[b], 0.02 * want[b]);
	}
}

static void test_mse_codebook_theory(void)
{
	const int dims[] = { 64, 256, 96 }; /* 96: the dense rotation */
	for (int k = 0; k < 3; k++)
		for (int b = 1; b <= 4; b++) {
			const tq_codebook *cb;
			T_ASSERT(tq_cache_get(cache, dims[k], b, &cb, NULL) == 0);
			double theory = cb->distortion * dims[k];
			double mse = lm_mse(dims[k], b, 30000, t_seed() + 17 * (uint64_t)b);
			fprintf(stderr, "    d=%d %d bit: mse %.5f theory %.5f\n", dims[k], b, mse, theory);
			T_NEAR(mse, theory, 0.03 * theory);
		}
}

/* The codecs keep ||x|| (norm correction): on unit vectors their MSE is
 * 2 - 2 E[<y, c>/||c||] ≈ 2 - 2 sqrt(1 - D) for D the codebook distortion. */
static void test_codec_mse_norm_corrected(void)
{
	const enum tq_codec_id ids[] = { TQ_CODEC_TQ2, TQ_CODEC_TQ3, TQ_CODEC_TQ4 };
	for (int k = 0; k < 3; k++) {
		tq_codec *c;
		struct tq_codec_params p = { ids[k], 128, 7, TQ_ISA_SCALAR };
		struct tq_rng rng;
		float x[128], xr[128];
		uint8_t blk[128];
		double sum = 0;
		int n = 20000;

		T_ASSERT(tq_codec_new(&c, cache, &p, NULL) == 0);
		tq_rng_seed(&rng, t_seed());
		for (int v = 0; v < n; v++) {
			rand_unit(&rng, x, 128);
			T_ASSERT(tq_encode(c, x, TQ_DTYPE_F32, 1, blk, NULL) == 0);
			tq_decode(c, blk, 1, xr);
			for (int i = 0; i < 128; i++)
				sum += (double)(x[i] - xr[i]) * (x[i] - xr[i]);
		}
		double D = c->cb.distortion * 128, pred = 2 - 2 * sqrt(1 - D);
		fprintf(stderr, "    %s: mse %.5f predicted %.5f (plain Lloyd–Max %.5f)\n",
			tq_codec_name(ids[k]), sum / n, pred, D);
		T_NEAR(sum / n, pred, 0.03 * pred);
		tq_codec_free(c);
	}
}

static void test_norm_preserved(void)
{
	const int dims[] = { 8, 24, 64, 96, 128, 200, 256, 512 };
	const enum tq_codec_id ids[] = { TQ_CODEC_TQ2, TQ_CODEC_TQ3, TQ_CODEC_TQ4 };
	struct tq_rng rng;
	float x[TQ_DIM_MAX], xr[TQ_DIM_MAX];
	uint8_t blk[1024];

	tq_rng_seed(&rng, t_seed());
	for (int di = 0; di < 8; di++)
		for (int k = 0; k < 3; k++) {
			tq_codec *c;
			struct tq_codec_params p = { ids[k], dims[di], 99, TQ_ISA_SCALAR };
			T_ASSERT(tq_codec_new(&c, cache, &p, NULL) == 0);
			for (int v = 0; v < 200; v++) {
				double scale = pow(10.0, -3 + 6 * tq_rng_uniform(&rng)), n0 = 0, n1 = 0;
				for (int i = 0; i < dims[di]; i++)
					x[i] = (float)(scale * tq_rng_gauss(&rng) + (i % 7 == 0 ? 3 * scale : 0));
				T_ASSERT(tq_encode(c, x, TQ_DTYPE_F32, 1, blk, NULL) == 0);
				tq_decode(c, blk, 1, xr);
				for (int i = 0; i < dims[di]; i++) {
					n0 += (double)x[i] * x[i];
					n1 += (double)xr[i] * xr[i];
				}
				if (fabs(sqrt(n1) / sqrt(n0) - 1) > 1e-4)
					T_FAIL("%s d=%d: norm %.8g decoded %.8g", tq_codec_name(ids[k]),
					       dims[di], sqrt(n0), sqrt(n1));
			}
			tq_codec_free(c);
		}
}

static void test_rotation_orthogonal(void)
{
	const int dims[] = { 8, 16, 24, 96, 128, 200, 256, 512 };
	for (int di = 0; di < 8; di++) {
		int d = dims[di];
		struct tq_rotation r;
		float *cols = malloc(sizeof(float) * d * d), e[TQ_DIM_MAX], back[TQ_DIM_MAX];
		double worst = 0, worst_rt = 0;

		T_ASSERT(tq_rotation_init(&r, d, 1234 + d, NULL) == 0);
		T_EQ(r.kind, (d & (d - 1)) ? TQ_ROT_DENSE : TQ_ROT_HADAMARD);
		for (int j = 0; j < d; j++) {
			memset(e, 0, sizeof(e));
			e[j] = 1;
			tq_rotation_apply_ref(&r, e, cols + (size_t)j * d);
			tq_rotation_inverse_ref(&r, cols + (size_t)j * d, back);
			for (int i = 0; i < d; i++)
				worst_rt = fmax(worst_rt, fabs(back[i] - e[i]));
		}
		for (int a = 0; a < d; a++)
			for (int b = a; b < d; b++) {
				double dot = 0;
				for (int i = 0; i < d; i++)
					dot += (double)cols[(size_t)a * d + i] * cols[(size_t)b * d + i];
				worst = fmax(worst, fabs(dot - (a == b)));
			}
		fprintf(stderr, "    d=%d: max |R^T R - I| %.2e, round trip %.2e\n", d, worst, worst_rt);
		T_ASSERT(worst < 1e-5);
		T_ASSERT(worst_rt < 1e-5);
		tq_rotation_destroy(&r);
		free(cols);
	}
}

/* Same seed → same bytes, in this run and on every machine: the golden
 * hashes below were computed once and must never change (a change breaks
 * every stored cache and spill file). */
static void test_determinism(void)
{
	struct tq_rotation r;
	float x[200], y[200];
	uint8_t b1[256], b2[256];
	tq_codec *c1, *c2;
	struct tq_codec_params p = { TQ_CODEC_TQ3, 128, 42, TQ_ISA_SCALAR };
	const tq_codebook *cb;

	T_ASSERT(tq_rotation_init(&r, 200, 42, NULL) == 0);
	uint64_t h_dense = fnv(r.mat, sizeof(float) * 200 * 200);
	tq_rotation_destroy(&r);
	T_ASSERT(tq_rotation_init(&r, 128, 42, NULL) == 0);
	uint64_t h_had = fnv(r.sign, sizeof(float) * 128);
	tq_rotation_destroy(&r);
	T_ASSERT(tq_cache_get(cache, 128, 4, &cb, NULL) == 0);
	uint64_t h_cb = fnv(cb->centroid, sizeof(float) * 16);

	for (int i = 0; i < 128; i++)
		x[i] = (float)sin(i * 0.37) + 0.01f * (float)i;
	T_ASSERT(tq_codec_new(&c1, NULL, &p, NULL) == 0);
	T_ASSERT(tq_codec_new(&c2, cache, &p, NULL) == 0);
	T_ASSERT(tq_encode(c1, x, TQ_DTYPE_F32, 1, b1, NULL) == 0);
	T_ASSERT(tq_encode(c2, x, TQ_DTYPE_F32, 1, b2, NULL) == 0);
	T_ASSERT(!memcmp(b1, b2, 52));
	uint64_t h_blk = fnv(b1, 52);
	tq_codec_free(c1);
	tq_codec_free(c2);
	(void)y;
	fprintf(stderr, "    golden: dense %#llx hadamard %#llx codebook %#llx block %#llx\n",
		(unsigned long long)h_dense, (unsigned long long)h_had, (unsigned long long)h_cb,
		(unsigned long long)h_blk);
	T_EQ(h_dense, GOLDEN_DENSE);
	T_EQ(h_had, GOLDEN_HADAMARD);
	T_EQ(h_cb, GOLDEN_CODEBOOK);
	T_EQ(h_blk, GOLDEN_BLOCK);
}

static void test_pack_exhaustive(void)
{
	const int dims[] = { 8, 16, 24, 40, 64, 128, 136, 512 };
	uint8_t idx[TQ_DIM_MAX], back[TQ_DIM_MAX], packed[TQ_DIM_MAX + 8];

	for (int bits = 1; bits <= 8; bits++)
		for (int di = 0; di < 8; di++) {
			int d = dims[di], L = 1 << bits;
			/* every position sees every value */
			for (int shift = 0; shift < L; shift++) {
				for (int i = 0; i < d; i++)
					idx[i] = (uint8_t)((i * 5 + shift) % L);
				memset(packed, 0xee, sizeof(packed));
				tq_pack_planes(idx, d, bits, packed);
				T_EQ(packed[TQ_PLANES_BYTES(d, bits)], 0xee); /* writes exactly its bytes */
				tq_unpack_planes(packed, d, bits, back);
				if (memcmp(idx, back, (size_t)d))
					T_FAIL("bits %d dim %d shift %d: round trip differs", bits, d, shift);
			}
		}
	/* the documented layouts */
	for (int i = 0; i < 128; i++)
		idx[i] = (uint8_t)((i * 11) & 15);
	tq_pack_planes(idx, 128, 4, packed);
	for (int j = 0; j < 64; j++)
		T_EQ(packed[j], idx[j] | idx[j + 64] << 4);
	for (int i = 0; i < 128; i++)
		idx[i] = (uint8_t)((i * 3) & 7);
	tq_pack_planes(idx, 128, 3, packed);
	for (int j = 0; j < 32; j++)
		T_EQ(packed[j], (idx[j] & 3) | (idx[j + 32] & 3) << 2 | (idx[j + 64] & 3) << 4 |
				(idx[j + 96] & 3) << 6);
	for (int j = 0; j < 16; j++) {
		int byte = 0;
		for (int s = 0; s < 8; s++)
			byte |= (idx[j + 16 * s] >> 2) << s;
		T_EQ(packed[32 + j], byte);
	}
}

static void test_block_sizes(void)
{
	T_EQ(tq_block_bytes(TQ_CODEC_TQ2, 128, NULL), 36);
	T_EQ(tq_block_bytes(TQ_CODEC_TQ3, 128, NULL), 52);
	T_EQ(tq_block_bytes(TQ_CODEC_TQ4, 128, NULL), 68);
	T_EQ(tq_block_bytes(TQ_CODEC_Q8, 128, NULL), 132);
	T_EQ(tq_block_bytes(TQ_CODEC_Q4A, 128, NULL), 68);
	T_EQ(tq_block_bytes(TQ_CODEC_F16, 128, NULL), 256);
	for (int i = 0; i < TQ_CODEC__COUNT; i++)
		T_EQ(tq_codec_from_name(tq_codec_name(i)), i);
	T_EQ(tq_codec_from_name("tq9"), -EINVAL);
	T_EQ(tq_codec_from_name(NULL), -EINVAL);
}

static void test_bad_params(void)
{
	const int bad_dims[] = { 0, -8, 4, 7, 12, 100, 520, 1024 };
	tq_error err;
	tq_codec *c = (tq_codec *)1;
	tq_codebook cb;

	for (int i = 0; i < 8; i++) {
		struct tq_codec_params p = { TQ_CODEC_TQ4, bad_dims[i], 1, TQ_ISA_AUTO };
		err.msg[0] = 0;
		T_EQ(tq_codec_new(&c, cache, &p, &err), -EINVAL);
		T_ASSERT(c == NULL);
		T_ASSERT(strstr(err.msg, "head dim") != NULL);
		T_EQ(tq_block_bytes(TQ_CODEC_TQ4, bad_dims[i], NULL), -EINVAL);
	}
	struct tq_codec_params p = { (enum tq_codec_id)99, 128, 1, TQ_ISA_AUTO };
	T_EQ(tq_codec_new(&c, cache, &p, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "codec") != NULL);
	T_EQ(tq_codebook_solve(&cb, 128, 0, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "bits") != NULL);
	T_EQ(tq_codebook_solve(&cb, 128, 9, NULL), -EINVAL);
	T_EQ(tq_codebook_solve(&cb, 7, 4, NULL), -EINVAL);
	T_EQ(tq_codebook_solve(&cb, 513, 4, NULL), -EINVAL);
	T_EQ(tq_codebook_solve(&cb, 9, 3, NULL), 0); /* codebooks: any dim in range */
	const tq_codebook *cp;
	T_EQ(tq_cache_get(cache, 600, 3, &cp, &err), -EINVAL);
}

static void test_bad_vectors(void)
{
	const float bad_vals[] = { NAN, INFINITY, -INFINITY };
	for (int id = 0; id < TQ_CODEC__COUNT; id++)
		for (int bv = 0; bv < 3; bv++)
			for (int dt = 0; dt < 3; dt++) {
				tq_codec *c;
				tq_error err;
				struct tq_codec_params p = { (enum tq_codec_id)id, 64, 5, TQ_ISA_SCALAR };
				uint16_t src16[3 * 64];
				float src[3 * 64];
				uint8_t dst[3 * 256 + 1];
				size_t bb;

				T_ASSERT(tq_codec_new(&c, cache, &p, NULL) == 0);
				bb = tq_codec_block_bytes(c);
				for (int i = 0; i < 3 * 64; i++)
					src[i] = (float)sin(i);
				src[64 + 10] = bad_vals[bv]; /* vector 1, element 10 */
				for (int i = 0; i < 3 * 64; i++)
					src16[i] = dt == 1 ? tq_f32_to_f16(src[i]) : tq_f32_to_bf16(src[i]);
				memset(dst, 0xa5, sizeof(dst));
				err.msg[0] = 0;
				int r = tq_encode(c, dt == 0 ? (void *)src : (void *)src16, (enum tq_dtype)dt,
						  3, dst, &err);
				T_EQ(r, -EINVAL);
				T_ASSERT(strstr(err.msg, "vector 1") && strstr(err.msg, "element 10"));
				for (size_t i = bb; i < 3 * bb; i++)
					if (dst[i] != 0xa5)
						T_FAIL("%s: byte %zu written after the bad vector", tq_codec_name(id), i);
				/* the vector before it is complete */
				float back[64];
				tq_decode(c, dst, 1, back);
				if (id == TQ_CODEC_F32 && dt == 0)
					T_ASSERT(!memcmp(back, src, sizeof(back)));
				tq_codec_free(c);
			}
}

static void test_zero_and_range(void)
{
	float x[128] = { 0 }, back[128];
	uint8_t blk[512];

	for (int id = 0; id < TQ_CODEC__COUNT; id++) {
		tq_codec *c;
		struct tq_codec_params p = { (enum tq_codec_id)id, 128, 5, TQ_ISA_SCALAR };
		tq_error err;
		T_ASSERT(tq_codec_new(&c, cache, &p, NULL) == 0);
		memset(x, 0, sizeof(x));
		T_EQ(tq_encode(c, x, TQ_DTYPE_F32, 1, blk, NULL), 0);
		memset(back, 0xff, sizeof(back));
		tq_decode(c, blk, 1, back);
		for (int i = 0; i < 128; i++)
			if (back[i] != 0.0f)
				T_FAIL("%s: zero vector decodes to %g at %d", tq_codec_name(id), back[i], i);
		/* finite but too large for the format */
		for (int i = 0; i < 128; i++)
			x[i] = (i & 1) ? 3e38f : -3e38f;
		int r = tq_encode(c, x, TQ_DTYPE_F32, 1, blk, &err);
		if (id == TQ_CODEC_F32) {
			T_EQ(r, 0);
		} else {
			T_EQ(r, -ERANGE);
			/* the message names the vector and ends there: no stray element number */
			size_t n = strlen(err.msg);
			T_ASSERT(strncmp(err.msg, "vector 0: ", 10) == 0 && n > 10);
			if (err.msg[n - 1] >= '0' && err.msg[n - 1] <= '9')
				T_FAIL("%s: message ends in a number: '%s'", tq_codec_name(id), err.msg);
		}
		x[0] = 70000.0f;
		for (int i = 1; i < 128; i++)
			x[i] = 1.0f;
		r = tq_encode(c, x, TQ_DTYPE_F32, 1, blk, &err);
		T_EQ(r, id == TQ_CODEC_F16 ? -ERANGE : 0);
		tq_codec_free(c);
	}
}

/* Every codec decodes close to its input; f16/f32 exactly where they can. */
/* Subnormal magnitudes: q8's reciprocal would overflow; still encoded. */
static void test_subnormal(void)
{
	float x[64], back[64];
	uint8_t blk[256];
	tq_codec *c;
	struct tq_codec_params p = { TQ_CODEC_Q8, 64, 5, TQ_ISA_SCALAR };
	double num = 0, den = 0;

	T_ASSERT(tq_codec_new(&c, cache, &p, NULL) == 0);
	for (int i = 0; i < 64; i++)
		x[i] = 1e-39f * (float)sin(i + 0.5);
	T_EQ(tq_encode(c, x, TQ_DTYPE_F32, 1, blk, NULL), 0);
	tq_decode(c, blk, 1, back);
	for (int i = 0; i < 64; i++) {
		num += ((double)back[i] - x[i]) * ((double)back[i] - x[i]);
		den += (double)x[i] * x[i];
	}
	T_ASSERT(den > 0 && num / den < 1e-2);
	tq_codec_free(c);
}

static void test_codec_accuracy(void)
{
	const double max_rel_mse[TQ_CODEC__COUNT] = {
		[TQ_CODEC_F16] = 1e-6, [TQ_CODEC_Q8] = 1e-4, [TQ_CODEC_Q4A] = 0.02,
		[TQ_CODEC_TQ2] = 0.13, [TQ_CODEC_TQ3] = 0.04, [TQ_CODEC_TQ4] = 0.011,
		[TQ_CODEC_F32] = 0,
		/* isotropic vectors: no outlier channels, so the mean of the two
		 * halves' distortions, above tq3 / tq4's */
		[TQ_CODEC_TQ3O] = 0.07, [TQ_CODEC_TQ4O] = 0.02,
	};
	struct tq_rng rng;
	tq_rng_seed(&rng, t_seed());
	for (int id = 0; id < TQ_CODEC__COUNT; id++)
		for (int dt = 0; dt < 3; dt++) {
			tq_codec *c;
			struct tq_codec_params p = { (enum tq_codec_id)id, 96, 5, TQ_ISA_SCALAR };
			float x[96 * 64], xin[96 * 64], back[96 * 64];
			uint16_t h[96 * 64];
			uint8_t blk[64 * 384];
			double num = 0, den = 0;

			T_ASSERT(tq_codec_new(&c, cache, &p, NULL) == 0);
			for (int i = 0; i < 96 * 64; i++) {
				x[i] = (float)tq_rng_gauss(&rng) * 2.0f;
				h[i] = dt == 1 ? tq_f32_to_f16(x[i]) : tq_f32_to_bf16(x[i]);
				xin[i] = dt == 0 ? x[i] : dt == 1 ? tq_f16_to_f32(h[i]) : tq_bf16_to_f32(h[i]);
			}
			T_EQ(tq_encode(c, dt ? (void *)h : (void *)x, (enum tq_dtype)dt, 64, blk, NULL), 0);
			T_EQ(tq_decode(c, blk, 64, back), 0);
			for (int i = 0; i < 96 * 64; i++) {
				num += (double)(back[i] - xin[i]) * (back[i] - xin[i]);
				den += (double)xin[i] * xin[i];
			}
			if (num / den > max_rel_mse[id])
				T_FAIL("%s from %s: relative mse %.3g > %.3g", tq_codec_name(id),
				       tq_dtype_name(dt), num / den, max_rel_mse[id]);
			if ((id == TQ_CODEC_F32 || (id == TQ_CODEC_F16 && dt == 1)) && num != 0)
				T_FAIL("%s from %s is not exact", tq_codec_name(id), tq_dtype_name(dt));
			tq_codec_free(c);
		}
}

/* tq_to_f32 (rows, branch-free) against tq_f16_to_f32 / tq_bf16_to_f32 on
 * every 16-bit pattern, bit for bit (NaNs' payloads too); tq_first_nonfinite
 * against isfinite of the converted values, with one bad element at every
 * place around its blocks' edges and none. */
static void test_row_conversion_and_finite(void)
{
	static uint16_t h[0x10000];
	static float f[0x10000];
	static uint32_t u[1100];

	for (uint32_t i = 0; i < 0x10000; i++)
		h[i] = (uint16_t)i;
	for (int bf = 0; bf < 2; bf++) {
		tq_to_f32(h, bf ? TQ_DTYPE_BF16 : TQ_DTYPE_F16, 0x10000, f);
		for (uint32_t i = 0; i < 0x10000; i++) {
			const float r = bf ? tq_bf16_to_f32((uint16_t)i) : tq_f16_to_f32((uint16_t)i);
			uint32_t rb, fb;
			memcpy(&rb, &r, 4);
			memcpy(&fb, &f[i], 4);
			if (rb != fb) {
				fprintf(stderr, "%s 0x%04x: row %08x, element %08x\n", bf ? "bf16" : "f16", i, fb, rb);
				T_ASSERT(0);
			}
		}
		/* every pattern's verdict: the first non-finite of the whole table */
		long first = -1;
		for (uint32_t i = 0; i < 0x10000 && first < 0; i++)
			if (!isfinite(bf ? tq_bf16_to_f32((uint16_t)i) : tq_f16_to_f32((uint16_t)i)))
				first = (long)i;
		T_EQ(tq_first_nonfinite(h, bf ? TQ_DTYPE_BF16 : TQ_DTYPE_F16, 0x10000), first);
	}
	const uint32_t bad[4] = { 0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffffffffu };
	const size_t lens[] = { 0, 1, 255, 256, 257, 511, 512, 513, 1100 };
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		const size_t n = lens[li];
		for (size_t i = 0; i < n; i++)
			u[i] = 0x3f800000u ^ (uint32_t)(i * 2654435761u & 0x807fffffu); /* finite, both signs */
		T_EQ(tq_first_nonfinite(u, TQ_DTYPE_F32, n), -1);
		for (size_t at = 0; at < n; at += at < 300 ? 1 : 97) {
			const uint32_t keep = u[at];
			u[at] = bad[at % 4];
			T_EQ(tq_first_nonfinite(u, TQ_DTYPE_F32, n), (long)at);
			if (at + 1 < n) { /* a second one later does not matter */
				const uint32_t k2 = u[n - 1];
				u[n - 1] = bad[0];
				T_EQ(tq_first_nonfinite(u, TQ_DTYPE_F32, n), (long)at);
				u[n - 1] = k2;
			}
			u[at] = keep;
		}
	}
}

/* tq_fwht and the rotations on it against the reference, bit for bit:
 * every power of two up to TQ_DIM_MAX, other dims (the dense rotation),
 * several seeds, values of mixed signs and magnitudes, in place too. */
static void test_fast_rotation(void)
{
	static float x[TQ_DIM_MAX], a[TQ_DIM_MAX], b[TQ_DIM_MAX];
	uint64_t s = 0x5eed;
	tq_error err;

	for (int n = 1; n <= TQ_DIM_MAX; n *= 2)
		for (int rep = 0; rep < 20; rep++) {
			for (int i = 0; i < n; i++) {
				s = s * 6364136223846793005ull + 1442695040888963407ull;
				x[i] = (float)((int64_t)(s >> 11) - (int64_t)(1ll << 52)) * 0x1p-52f *
				       (float)(1u << (s >> 60)); /* ±[0, 2^15) */
			}
			memcpy(a, x, sizeof(float) * (size_t)n);
			memcpy(b, x, sizeof(float) * (size_t)n);
			tq_fwht_ref(a, n);
			tq_fwht(b, n);
			T_ASSERT(memcmp(a, b, sizeof(float) * (size_t)n) == 0);
		}
	const int dims[] = { 8, 16, 32, 48, 64, 96, 128, 256, 512 };
	for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++)
		for (uint64_t seed = 1; seed <= 3; seed++) {
			struct tq_rotation r;
			const int d = dims[di];
			T_EQ(tq_rotation_init(&r, d, seed * 0x9e3779b97f4a7c15ull, &err), 0);
			for (int i = 0; i < d; i++)
				x[i] = (float)((i * 37 + (int)seed * 11) % 29) - 14.25f;
			tq_rotation_apply_ref(&r, x, a);
			tq_rotation_apply(&r, x, b);
			T_ASSERT(memcmp(a, b, sizeof(float) * (size_t)d) == 0);
			tq_rotation_inverse_ref(&r, a, x);
			memcpy(b, a, sizeof(float) * (size_t)d);
			tq_rotation_inverse(&r, b, b); /* in place */
			T_ASSERT(memcmp(x, b, sizeof(float) * (size_t)d) == 0);
			tq_rotation_destroy(&r);
		}
}

static void test_f16_conversion(void)
{
	/* every half round-trips; every midpoint rounds to the even neighbour */
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = tq_f16_to_f32((uint16_t)h);
		if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
			continue; /* NaN */
		if (tq_f32_to_f16(f) != h)
			T_FAIL("half %#x -> %g -> %#x", h, f, tq_f32_to_f16(f));
		if ((h & 0x7fff) < 0x7bff) {
			float g = tq_f16_to_f32((uint16_t)(h + 1));
			float mid = (float)(((double)f + g) / 2);
			uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
			if ((h & 0x8000) == 0 && tq_f32_to_f16(mid) != want)
				T_FAIL("midpoint of %#x: %#x, want %#x", h, tq_f32_to_f16(mid), want);
		}
	}
	T_EQ(tq_f32_to_f16(65520.0f), 0x7c00);   /* rounds up to inf */
	T_EQ(tq_f32_to_f16(65519.0f), 0x7bff);
	T_EQ(tq_f32_to_f16(1e-8f), 0);
	T_EQ(tq_f32_to_bf16(1.0f), 0x3f80);
	T_EQ(tq_f32_to_bf16(tq_bf16_to_f32(0x4049)), 0x4049);
}

static void test_detmath(void)
{
	for (double x = 1e-300; x < 1e300; x *= 1.7)
		if (fabs(tq_det_log(x) - log(x)) > 1e-13 * fmax(1, fabs(log(x))))
			T_FAIL("log(%g): %.17g vs libm %.17g", x, tq_det_log(x), log(x));
	for (double x = -700; x < 700; x += 0.37)
		if (fabs(tq_det_exp(x) / exp(x) - 1) > 1e-14)
			T_FAIL("exp(%g): %.17g vs libm %.17g", x, tq_det_exp(x), exp(x));
}

/* Worst relative error of cb's entries times s rounded to FP16. */
static double h16_err(const tq_codebook *cb, float s)
{
	double w = 0.0;
	for (int i = 0; i < cb->levels; i++) {
		const float v = cb->centroid[i] * s;
		w = fmax(w, fabs((double)tq_f16_to_f32(tq_f32_to_f16(v)) - v) / fabs((double)v));
	}
	return w;
}

/* The FP16 table scale (tq_codebook.h16_scale: the GPU's decode tables):
 * every entry of a 1- to 5-bit codebook (5: tq4o's first half), times it,
 * within 2.5e-4 of an FP16 number (measured: 1.3e-4 up to 4 bits, 2.2e-4 at
 * 5), and never further than with the power of two that puts the largest
 * entry in [1, 2); more levels: 1. */
static void test_h16_scale(void)
{
	static const int dims[] = { 8, 64, 96, 128, 256, 512 };
	double worst = 0.0, worst_p2 = 0.0;

	for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++)
		for (int bits = 1; bits <= 8; bits++) {
			const tq_codebook *cb;
			T_ASSERT(tq_cache_get(cache, dims[di], bits, &cb, NULL) == 0);
			if (cb->levels > 32) {
				T_EQ(cb->h16_scale, 1.0f);
				continue;
			}
			T_ASSERT(cb->h16_scale > 0.0f && isfinite(cb->h16_scale));
			int e;
			(void)frexpf(cb->centroid[cb->levels - 1], &e); /* the largest: symmetric, ascending */
			const double er = h16_err(cb, cb->h16_scale), e2 = h16_err(cb, ldexpf(1.0f, 1 - e));
			if (getenv("TQ_TEST_VERBOSE"))
				fprintf(stderr, "    d %d bits %d: %.3g (power of two %.3g)\n", dims[di], bits, er, e2);
			if (!(er <= e2 && er <= 2.5e-4))
				T_FAIL("d %d bits %d: scale %.9g error %.3g (power of two: %.3g)", dims[di], bits,
				       (double)cb->h16_scale, er, e2);
			worst = fmax(worst, er);
			worst_p2 = fmax(worst_p2, e2);
		}
	fprintf(stderr, "    worst relative FP16 rounding of a scaled entry %.2e (power-of-two scale %.2e)\n", worst,
		worst_p2);
}

/* tq3o / tq4o: each half is exactly the TurboQuant vector of dim/2 that its
 * rotation seed and width name — the first half at B + 1 bits with the
 * codec's seed, the second at B - 1 with seed ^ TQ_TQO_SEED_XOR — so its
 * index planes are byte-identical to that codec's (tq4 for tq3o's first
 * half, tq3 for tq4o's second) and its decoded values agree up to the bf16
 * scale (a relative 2^-9).  Also: the sizes, the dims refused, the block
 * diagonal rotation, each half's shrink, and a huge half that still fits. */
static void test_outlier_codecs(void)
{
	enum { D = 128, H = D / 2, N = 40 };
	struct tq_rng rng;
	tq_error err;
	tq_rng_seed(&rng, t_seed());

	T_EQ(tq_block_bytes(TQ_CODEC_TQ4O, 128, NULL), 68);
	T_EQ(tq_block_bytes(TQ_CODEC_TQ3O, 64, NULL), 28);
	T_EQ(tq_block_bytes(TQ_CODEC_TQ4O, 64, NULL), tq_block_bytes(TQ_CODEC_TQ4, 64, NULL));
	T_EQ(tq_block_bytes(TQ_CODEC_TQ4O, 72, &err), -EINVAL); /* a multiple of 8, not of 16 */
	T_ASSERT(strstr(err.msg, "multiple of 16"));
	T_EQ(tq_codec_from_name("tq4o"), TQ_CODEC_TQ4O);
	T_EQ(tq_codec_from_name("tq3o"), TQ_CODEC_TQ3O);
	T_EQ(tq_codec_id_parts(TQ_CODEC_TQ3O), 2);
	T_EQ(tq_codec_id_parts(TQ_CODEC_TQ4), 1);

	/* which half matches which plain codec: tq3o's first (4 bits) is tq4
	 * at dim/2 with the seed; tq4o's second (3 bits) is tq3 at dim/2 with
	 * the second seed */
	const struct {
		enum tq_codec_id o, plain;
		int second;
	} cases[] = { { TQ_CODEC_TQ3O, TQ_CODEC_TQ4, 0 }, { TQ_CODEC_TQ4O, TQ_CODEC_TQ3, 1 },
		      { TQ_CODEC_TQ3O, TQ_CODEC_TQ2, 1 } };
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		const uint64_t seed = 0x1234 + k;
		struct tq_codec_params po = { cases[k].o, D, seed, TQ_ISA_AUTO };
		struct tq_codec_params pp = { cases[k].plain, H, cases[k].second ? seed ^ TQ_TQO_SEED_XOR : seed,
					      TQ_ISA_SCALAR };
		tq_codec *co, *cp;
		static float x[N][D], half[N][H], back[N][D], backp[N][H], y[D], z[D];
		static uint8_t blk[N * 68], blkp[N * 68];
		T_ASSERT(tq_codec_new(&co, cache, &po, NULL) == 0);
		T_ASSERT(tq_codec_new(&cp, cache, &pp, NULL) == 0);
		T_EQ(tq_codec_parts(co), 2);
		const size_t ob = tq_codec_block_bytes(co), pb = tq_codec_block_bytes(cp);
		const int bits_a = tq_codec_bits(cases[k].o) + 1;
		const size_t off = 4 + (cases[k].second ? (size_t)H * bits_a / 8 : 0);
		for (int t = 0; t < N; t++)
			for (int j = 0; j < D; j++) /* loud first half, as K order makes it */
				x[t][j] = (float)tq_rng_gauss(&rng) * (j < H ? 4.0f : 1.0f) * (t == 3 ? 1e15f : 1.0f);
		for (int t = 0; t < N; t++)
			memcpy(half[t], x[t] + (cases[k].second ? H : 0), sizeof(half[t]));
		T_EQ(tq_encode(co, x, TQ_DTYPE_F32, N, blk, NULL), 0);
		T_EQ(tq_encode(cp, half, TQ_DTYPE_F32, N, blkp, NULL), 0);
		T_EQ(tq_decode(co, blk, N, &back[0][0]), 0);
		T_EQ(tq_decode(cp, blkp, N, &backp[0][0]), 0);
		for (int t = 0; t < N; t++) {
			if (memcmp(blk + t * ob + off, blkp + t * pb + 4, pb - 4))
				T_FAIL("%s vector %d: the half's planes differ from %s's", tq_codec_name(cases[k].o), t,
				       tq_codec_name(cases[k].plain));
			const float *bo = back[t] + (cases[k].second ? H : 0);
			double nrm = 0, dif = 0;
			for (int j = 0; j < H; j++) {
				nrm += (double)backp[t][j] * backp[t][j];
				dif += ((double)bo[j] - backp[t][j]) * ((double)bo[j] - backp[t][j]);
			}
			if (!(dif <= nrm * 0x1.0p-16))
				T_FAIL("%s vector %d: the half decodes %g (relative) off %s's", tq_codec_name(cases[k].o),
				       t, sqrt(dif / nrm), tq_codec_name(cases[k].plain));
		}
		/* the rotation is block diagonal: each half by its own */
		tq_rotate(co, x[0], y);
		tq_rotate(cp, x[0] + (cases[k].second ? H : 0), z);
		for (int j = 0; j < H; j++)
			T_ASSERT(y[(cases[k].second ? H : 0) + j] == z[j]);
		tq_unrotate(co, y, z);
		for (int j = 0; j < D; j++)
			T_NEAR(z[j], x[0][j], 1e-5 * (fabs(x[0][j]) + 4));
		/* each half's shrink is its codebook's */
		T_NEAR(tq_codec_shrink_at(co, cases[k].second ? D - 1 : 0), tq_codec_shrink(cp), 1e-12);
		tq_codec_free(co);
		tq_codec_free(cp);
	}
}

int main(void)
{
	cache = tq_cache_new();
	T_RUN(test_h16_scale);
	T_RUN(test_block_sizes);
	T_RUN(test_detmath);
	T_RUN(test_f16_conversion);
	T_RUN(test_row_conversion_and_finite);
	T_RUN(test_fast_rotation);
	T_RUN(test_pack_exhaustive);
	T_RUN(test_bad_params);
	T_RUN(test_bad_vectors);
	T_RUN(test_zero_and_range);
	T_RUN(test_subnormal);
	T_RUN(test_rotation_orthogonal);
	T_RUN(test_determinism);
	T_RUN(test_norm_preserved);
	T_RUN(test_codec_accuracy);
	T_RUN(test_mse_paper_d128);
	T_RUN(test_mse_codebook_theory);
	T_RUN(test_codec_mse_norm_corrected);
	T_RUN(test_outlier_codecs);
	tq_cache_free(cache);
	return t_done();
}
