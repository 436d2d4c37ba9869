/* tq_rotation.c — seeded random rotations.
 *
 * Power-of-two dim: randomized Hadamard, R = (1/sqrt(d)) H D with D a seeded
 * ±1 diagonal — O(d log d) and no storage but the signs.
 * Other dims: a Haar-random orthogonal matrix, the Q of a QR factorization
 * of a seeded Gaussian matrix (modified Gram–Schmidt, run twice, in double;
 * Q's columns are taken with R's diagonal positive, which makes Q Haar
 * distributed).  Gaussian samples come from tq_rng_gauss, which uses no libm
 * transcendental, so a seed gives the same rotation on every machine. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tq_internal.h"

static int is_pow2(int n)
{
	return n > 0 && (n & (n - 1)) == 0;
}

void tq_fwht_ref(float *v, int n)
{
	for (int h = 1; h < n; h <<= 1)
		for (int i = 0; i < n; i += 2 * h)
			for (int j = i; j < i + h; j++) {
				float a = v[j], b = v[j + h];
				v[j] = a + b;
				v[j + h] = a - b;
			}
}

typedef float fwht_v4 __attribute__((vector_size(16)));

void tq_fwht(float *v, int n)
{
	if (n < 8 || (n & (n - 1))) {
		tq_fwht_ref(v, n);
		return;
	}
	for (int i = 0; i < n; i += 4) { /* h = 1, then h = 2 */
		const float b0 = v[i] + v[i + 1], b1 = v[i] - v[i + 1];
		const float b2 = v[i + 2] + v[i + 3], b3 = v[i + 2] - v[i + 3];
		v[i] = b0 + b2;
		v[i + 1] = b1 + b3;
		v[i + 2] = b0 - b2;
		v[i + 3] = b1 - b3;
	}
	for (int h = 4; h < n; h <<= 1)
		for (int i = 0; i < n; i += 2 * h)
			for (int j = i; j < i + h; j += 4) {
				/* four butterflies as one vector (GNU C's vector
				 * extension: SSE on x86-64, NEON on aarch64; each
				 * lane the scalar add and subtract) */
				fwht_v4 a, b, sum, dif;
				memcpy(&a, v + j, sizeof(a));
				memcpy(&b, v + j + h, sizeof(b));
				sum = a + b;
				dif = a - b;
				memcpy(v + j, &sum, sizeof(sum));
				memcpy(v + j + h, &dif, sizeof(dif));
			}
}

static int dense_init(struct tq_rotation *r, struct tq_rng *rng)
{
	int d = r->dim;
	double *q = malloc(sizeof(double) * (size_t)d * (size_t)d); /* [d cols][d] */

	r->mat = malloc(sizeof(float) * (size_t)d * (size_t)d);
	r->mat_t = malloc(sizeof(float) * (size_t)d * (size_t)d);
	if (!q || !r->mat || !r->mat_t) {
		free(q);
		return -ENOMEM;
	}
	/* Gaussian matrix G[i][j], drawn row-major; column j is q[j*d ...] */
	for (int i = 0; i < d; i++)
		for (int j = 0; j < d; j++)
			q[(size_t)j * d + i] = tq_rng_gauss(rng);
	for (int j = 0; j < d; j++) {
		double *cj = q + (size_t)j * d;
		for (int pass = 0; pass < 2; pass++)
			for (int k = 0; k < j; k++) {
				const double *ck = q + (size_t)k * d;
				double dot = 0.0;
				for (int i = 0; i < d; i++)
					dot += ck[i] * cj[i];
				for (int i = 0; i < d; i++)
					cj[i] -= dot * ck[i];
			}
		double nrm = 0.0;
		for (int i = 0; i < d; i++)
			nrm += cj[i] * cj[i];
		nrm = sqrt(nrm);
		for (int i = 0; i < d; i++)
			cj[i] /= nrm;
	}
	/* R = Q: R[i][j] = column j, row i */
	for (int i = 0; i < d; i++)
		for (int j = 0; j < d; j++) {
			float v = (float)q[(size_t)j * d + i];
			r->mat[(size_t)i * d + j] = v;
			r->mat_t[(size_t)j * d + i] = v;
		}
	free(q);
	return 0;
}

int tq_rotation_init(struct tq_rotation *r, int dim, uint64_t seed, tq_error *err)
{
	struct tq_rng rng;
	int ret;

	memset(r, 0, sizeof(*r));
	if ((ret = tq_dim_check(dim, err)) < 0)
		return ret;
	r->dim = dim;
	r->seed = seed;
	tq_rng_seed(&rng, seed);
	if (is_pow2(dim)) {
		r->kind = TQ_ROT_HADAMARD;
		r->inv_sqrt_dim = (float)(1.0 / sqrt((double)dim));
		r->sign = malloc(sizeof(float) * (size_t)dim);
		r->sign_bits = malloc(sizeof(uint32_t) * (size_t)dim);
		if (!r->sign || !r->sign_bits)
			goto nomem;
		for (int i = 0; i < dim; i++) {
			int neg = (int)(tq_rng_next(&rng) >> 63);
			r->sign[i] = neg ? -1.0f : 1.0f;
			r->sign_bits[i] = neg ? 0x80000000u : 0u;
		}
		return 0;
	}
	r->kind = TQ_ROT_DENSE;
	if (dense_init(r, &rng) < 0)
		goto nomem;
	return 0;
nomem:
	tq_rotation_destroy(r);
	if (err)
		snprintf(err->msg, sizeof(err->msg), "rotation: out of memory (dim %d)", dim);
	return -ENOMEM;
}

void tq_rotation_destroy(struct tq_rotation *r)
{
	if (!r)
		return;
	free(r->sign);
	free(r->sign_bits);
	free(r->mat);
	free(r->mat_t);
	memset(r, 0, sizeof(*r));
}

void tq_rotation_apply_ref(const struct tq_rotation *r, const float *x, float *y)
{
	int d = r->dim;
	float tmp[TQ_DIM_MAX];

	switch (r->kind) {
	case TQ_ROT_HADAMARD:
		for (int i = 0; i < d; i++)
			tmp[i] = x[i] * r->sign[i];
		tq_fwht_ref(tmp, d);
		for (int i = 0; i < d; i++)
			y[i] = tmp[i] * r->inv_sqrt_dim;
		break;
	case TQ_ROT_DENSE:
		for (int i = 0; i < d; i++) {
			float acc = 0.0f;
			const float *row = r->mat + (size_t)i * d;
			for (int j = 0; j < d; j++)
				acc = acc + row[j] * x[j];
			tmp[i] = acc;
		}
		memcpy(y, tmp, sizeof(float) * (size_t)d);
		break;
	case TQ_ROT_NONE:
		memmove(y, x, sizeof(float) * (size_t)d);
		break;
	}
}

/* dst[i] = a[i] * b[i] and dst[i] = a[i] * s, four at a time (n % 4 == 0;
 * dst may be a) */
static void mul4(float *dst, const float *a, const float *b, int n)
{
	for (int i = 0; i < n; i += 4) {
		fwht_v4 va, vb;
		memcpy(&va, a + i, sizeof(va));
		memcpy(&vb, b + i, sizeof(vb));
		va *= vb;
		memcpy(dst + i, &va, sizeof(va));
	}
}

static void scale4(float *dst, const float *a, float s, int n)
{
	const fwht_v4 vs = { s, s, s, s };

	for (int i = 0; i < n; i += 4) {
		fwht_v4 va;
		memcpy(&va, a + i, sizeof(va));
		va *= vs;
		memcpy(dst + i, &va, sizeof(va));
	}
}

void tq_rotation_apply(const struct tq_rotation *r, const float *x, float *y)
{
	const int d = r->dim;
	float tmp[TQ_DIM_MAX];

	if (r->kind != TQ_ROT_HADAMARD || d % 4) {
		tq_rotation_apply_ref(r, x, y);
		return;
	}
	mul4(tmp, x, r->sign, d);
	tq_fwht(tmp, d);
	scale4(y, tmp, r->inv_sqrt_dim, d);
}

void tq_rotation_inverse(const struct tq_rotation *r, const float *y, float *x)
{
	const int d = r->dim;
	float tmp[TQ_DIM_MAX];

	if (r->kind != TQ_ROT_HADAMARD || d % 4) {
		tq_rotation_inverse_ref(r, y, x);
		return;
	}
	scale4(tmp, y, r->inv_sqrt_dim, d);
	tq_fwht(tmp, d);
	mul4(x, tmp, r->sign, d);
}

void tq_rotation_inverse_ref(const struct tq_rotation *r, const float *y, float *x)
{
	int d = r->dim;
	float tmp[TQ_DIM_MAX];

	switch (r->kind) {
	case TQ_ROT_HADAMARD:
		for (int i = 0; i < d; i++)
			tmp[i] = y[i] * r->inv_sqrt_dim;
		tq_fwht_ref(tmp, d);
		for (int i = 0; i < d; i++)
			x[i] = tmp[i] * r->sign[i];
		break;
	case TQ_ROT_DENSE:
		for (int j = 0; j < d; j++) {
			float acc = 0.0f;
			const float *col = r->mat_t + (size_t)j * d; /* R[.][j] */
			for (int i = 0; i < d; i++)
				acc = acc + col[i] * y[i];
			tmp[j] = acc;
		}
		memcpy(x, tmp, sizeof(float) * (size_t)d);
		break;
	case TQ_ROT_NONE:
		memmove(x, y, sizeof(float) * (size_t)d);
		break;
	}
}
