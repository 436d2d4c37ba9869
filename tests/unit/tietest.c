/* tietest.c — see tietest.h. */
#include "tietest.h"

#include <math.h>
#include <string.h>

void tie_ref_u(const tq_codec *c, const float *x, float *u)
{
	const struct tq_rotation *r = &c->rot;
	int d = c->dim;
	float norm = sqrtf(tq_sumsq16(x, d)), inv = 1.0f / norm;

	if (r->kind == TQ_ROT_HADAMARD) {
		float fac = inv * r->inv_sqrt_dim;
		for (int i = 0; i < d; i++)
			u[i] = x[i] * r->sign[i];
		tq_fwht_ref(u, d);
		for (int i = 0; i < d; i++)
			u[i] = u[i] * fac;
	} else {
		for (int i = 0; i < d; i++) {
			float acc = 0.0f;
			for (int j = 0; j < d; j++)
				acc = acc + r->mat[(size_t)i * d + j] * x[j];
			u[i] = acc;
		}
		for (int i = 0; i < d; i++)
			u[i] = u[i] * inv;
	}
}

static int hits_bound(const tq_codec *c, const float *u)
{
	for (int i = 0; i < c->dim; i++)
		for (int b = 0; b < c->cb.levels - 1; b++)
			if (u[i] == c->cb.bound[b])
				return 1;
	return 0;
}

int tie_make(const tq_codec *c, uint64_t (*rnd)(void *ctx), void *ctx, float *x)
{
	int d = c->dim;
	float u[TQ_DIM_MAX];

	for (int attempt = 0; attempt < 12; attempt++) {
		int j = (int)(rnd(ctx) % (uint64_t)d), k = (int)(rnd(ctx) % (uint64_t)d);
		int i = (int)(rnd(ctx) % (uint64_t)d), b = (int)(rnd(ctx) % (uint64_t)(c->cb.levels - 1));
		float target = c->cb.bound[b], lo = -4.0f, hi = 4.0f;
		if (j == k)
			continue;
		memset(x, 0, sizeof(float) * (size_t)d);
		x[j] = 1.0f;
		x[k] = lo;
		tie_ref_u(c, x, u);
		float flo = u[i] - target;
		x[k] = hi;
		tie_ref_u(c, x, u);
		if ((flo > 0) == (u[i] - target > 0))
			continue;
		for (int it = 0; it < 60; it++) {
			float mid = 0.5f * (lo + hi);
			x[k] = mid;
			tie_ref_u(c, x, u);
			if ((u[i] - target > 0) == (flo > 0))
				lo = mid;
			else
				hi = mid;
		}
		float t = lo;
		for (int s = 0; s < 64; s++)
			t = nextafterf(t, -8.0f);
		for (int s = 0; s < 128; s++, t = nextafterf(t, 8.0f)) {
			x[k] = t;
			tie_ref_u(c, x, u);
			if (hits_bound(c, u))
				return 1;
		}
	}
	return 0;
}
