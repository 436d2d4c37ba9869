/* tq_codebook.c — Lloyd–Max codebooks for the unit-sphere marginal.
 *
 * One coordinate of a uniform unit vector in R^d has density
 *   f(x) = (1 - x^2)^((d-3)/2) / B(1/2, (d-1)/2)   on [-1, 1].
 * We tabulate f on a fine grid (2^15 intervals over [-L, L], L = min(1,
 * 14/sqrt(d)): beyond 14 standard deviations the mass is < 1e-40), treat it
 * as piecewise linear, and integrate the zeroth, first and second moments of
 * that interpolant exactly, so any interval's mass, mean and distortion cost
 * O(log N).  Lloyd's iteration (boundaries at midpoints, centroids at
 * conditional means) converges to the unique optimum because f is
 * log-concave; we symmetrize after every step so c[i] = -c[n-1-i] exactly.
 * Everything is double precision and uses tq_det_log/tq_det_exp, so the
 * codebook is the same on every machine. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "tq_internal.h"

#define GRID 32768

struct grid {
	double lo, h;
	double f[GRID + 1];   /* density at x_k = lo + k h (unnormalized)       */
	double m0[GRID + 1];  /* ∫_{lo}^{x_k} f      of the piecewise-linear f   */
	double m1[GRID + 1];  /* ∫_{lo}^{x_k} x f                                */
	double m2[GRID + 1];  /* ∫_{lo}^{x_k} x^2 f                              */
};

/* Moments of the linear piece starting at node k over [x_k, x_k + tau]. */
static void piece(const struct grid *g, int k, double tau, double m[3])
{
	double xk = g->lo + k * g->h, fk = g->f[k];
	double s = (g->f[k + 1] - fk) / g->h;
	double t2 = tau * tau, t3 = t2 * tau, t4 = t3 * tau;

	m[0] = fk * tau + s * t2 / 2.0;
	m[1] = xk * fk * tau + (xk * s + fk) * t2 / 2.0 + s * t3 / 3.0;
	m[2] = xk * xk * fk * tau + (xk * xk * s + 2.0 * xk * fk) * t2 / 2.0 +
	       (2.0 * xk * s + fk) * t3 / 3.0 + s * t4 / 4.0;
}

/* The scale at which n entries come closest to FP16 numbers (the GPU's
 * attention decodes through FP16 tables, kernels/tq_cuda_attn.cu): of 4096
 * scales spread over the octave that puts the largest |entry| in [1, 2),
 * the one with the smallest worst relative rounding error: 1.3e-4 at worst
 * over the 1-4-bit codebooks, 2.2e-4 over the 5-bit ones (tq4o's first
 * half), 4.4e-4 with a power of two (test_codec). */
static float h16_search(const float *cb, int n)
{
	float mx = 0.0f, best = 1.0f;
	double best_err = INFINITY;
	int e;

	for (int i = 0; i < n; i++)
		mx = fmaxf(mx, fabsf(cb[i]));
	if (!(mx > 0.0f) || !isfinite(mx))
		return 1.0f;
	(void)frexpf(mx, &e); /* mx in [2^(e-1), 2^e) */
	const float base = ldexpf(1.0f, 1 - e);
	for (int k = 0; k < 4096; k++) {
		const float s = base * (1.0f + (float)k / 4096.0f);
		double err = 0.0;
		for (int i = 0; i < n && err < best_err; i++) {
			const float v = cb[i] * s;
			if (v != 0.0f)
				err = fmax(err, fabs((double)tq_f16_to_f32(tq_f32_to_f16(v)) - v) / fabs((double)v));
		}
		if (err < best_err) {
			best_err = err;
			best = s;
		}
	}
	return best;
}

/* Cumulative moments from lo up to t. */
static void cumulative(const struct grid *g, double t, double m[3])
{
	double u = (t - g->lo) / g->h;
	int k;

	if (u <= 0.0) {
		m[0] = m[1] = m[2] = 0.0;
		return;
	}
	if (u >= GRID) {
		m[0] = g->m0[GRID];
		m[1] = g->m1[GRID];
		m[2] = g->m2[GRID];
		return;
	}
	k = (int)u;
	piece(g, k, t - (g->lo + k * g->h), m);
	m[0] += g->m0[k];
	m[1] += g->m1[k];
	m[2] += g->m2[k];
}

static void grid_build(struct grid *g, int dim)
{
	double a = (dim - 3) / 2.0;
	double L = 14.0 / sqrt((double)dim);

	if (L > 1.0)
		L = 1.0;
	g->lo = -L;
	g->h = 2.0 * L / GRID;
	for (int k = 0; k <= GRID; k++) {
		double x = g->lo + k * g->h, q = 1.0 - x * x;
		g->f[k] = q > 0.0 ? (a == 0.0 ? 1.0 : tq_det_exp(a * tq_det_log(q))) : 0.0;
	}
	g->m0[0] = g->m1[0] = g->m2[0] = 0.0;
	for (int k = 0; k < GRID; k++) {
		double m[3];
		piece(g, k, g->h, m);
		g->m0[k + 1] = g->m0[k] + m[0];
		g->m1[k + 1] = g->m1[k] + m[1];
		g->m2[k + 1] = g->m2[k] + m[2];
	}
	/* normalize to a probability density */
	double z = g->m0[GRID];
	for (int k = 0; k <= GRID; k++) {
		g->f[k] /= z;
		g->m0[k] /= z;
		g->m1[k] /= z;
		g->m2[k] /= z;
	}
}

int tq_codebook_solve(tq_codebook *cb, int dim, int bits, tq_error *err)
{
	struct grid *g;
	int n = 1 << bits;
	double c[256], t[257];

	if (dim < TQ_DIM_MIN || dim > TQ_DIM_MAX)
		return tq_fail(err, "codebook: dim %d is outside [%d, %d]", dim, TQ_DIM_MIN, TQ_DIM_MAX);
	if (bits < 1 || bits > TQ_BITS_MAX)
		return tq_fail(err, "codebook: %d bits is outside [1, %d]", bits, TQ_BITS_MAX);
	g = malloc(sizeof(*g));
	if (!g) {
		if (err)
			snprintf(err->msg, sizeof(err->msg), "codebook: out of memory");
		return -ENOMEM;
	}
	grid_build(g, dim);

	/* Start from the high-resolution optimum (Panter–Dite: point density
	 * ∝ f^(1/3)); Lloyd then needs few iterations even at 8 bits. */
	double *cf = malloc(sizeof(double) * (GRID + 1));
	if (!cf) {
		free(g);
		if (err)
			snprintf(err->msg, sizeof(err->msg), "codebook: out of memory");
		return -ENOMEM;
	}
	cf[0] = 0.0;
	for (int k = 0; k < GRID; k++)
		cf[k + 1] = cf[k] + (cbrt(g->f[k]) + cbrt(g->f[k + 1])) / 2.0;
	for (int i = 0, k = 0; i < n; i++) {
		double target = (i + 0.5) / n * cf[GRID];
		while (k < GRID && cf[k + 1] < target)
			k++;
		double span = cf[k + 1] - cf[k];
		c[i] = g->lo + g->h * (k + (span > 0.0 ? (target - cf[k]) / span : 0.0));
	}
	free(cf);
	for (int i = 0; i < n / 2; i++) {
		double s = (c[n - 1 - i] - c[i]) / 2.0;
		c[i] = -s;
		c[n - 1 - i] = s;
	}
	t[0] = g->lo;
	t[n] = -g->lo;
	/* Lloyd iterations; each one is O(n log GRID).  The fixed point is
	 * unique (log-concave f); stop when no centroid moves by more than
	 * 1e-8 of the coordinate's standard deviation (far below float
	 * resolution), or when the steps stop shrinking: the moments' rounding
	 * noise in the far tails (1e-10 at 8 bits) is then the floor. */
	double tol = 1e-8 / sqrt((double)dim), best = INFINITY;
	for (int it = 0, it_best = 0; it < 200000 && it - it_best < 2000; it++) {
		double moved = 0.0, lo[3], hi[3];

		for (int i = 1; i < n; i++)
			t[i] = (c[i - 1] + c[i]) / 2.0;
		cumulative(g, t[0], lo);
		for (int i = 0; i < n; i++) {
			cumulative(g, t[i + 1], hi);
			double mass = hi[0] - lo[0];
			if (mass > 1e-300) {
				double nc = (hi[1] - lo[1]) / mass;
				moved = fmax(moved, fabs(nc - c[i]));
				c[i] = nc;
			}
			lo[0] = hi[0];
			lo[1] = hi[1];
			lo[2] = hi[2];
		}
		for (int i = 0; i < n / 2; i++) {
			double s = (c[n - 1 - i] - c[i]) / 2.0;
			c[i] = -s;
			c[n - 1 - i] = s;
		}
		if (moved < best) {
			best = moved;
			it_best = it;
		}
		if (moved < tol)
			break;
	}

	/* distortion per coordinate: Σ_i ∫_cell (x - c_i)^2 f */
	double dist = 0.0, lo[3], hi[3];
	for (int i = 1; i < n; i++)
		t[i] = (c[i - 1] + c[i]) / 2.0;
	cumulative(g, t[0], lo);
	for (int i = 0; i < n; i++) {
		cumulative(g, t[i + 1], hi);
		dist += (hi[2] - lo[2]) - 2.0 * c[i] * (hi[1] - lo[1]) + c[i] * c[i] * (hi[0] - lo[0]);
		lo[0] = hi[0];
		lo[1] = hi[1];
		lo[2] = hi[2];
	}

	memset(cb, 0, sizeof(*cb));
	cb->dim = dim;
	cb->bits = bits;
	cb->levels = n;
	cb->distortion = dist;
	for (int i = 0; i < n; i++) {
		cb->centroid_d[i] = c[i];
		cb->centroid[i] = (float)c[i];
	}
	for (int i = 0; i + 1 < n; i++)
		cb->bound[i] = (float)((c[i] + c[i + 1]) / 2.0);
	cb->h16_scale = n <= 32 ? h16_search(cb->centroid, n) : 1.0f;
	free(g);
	return 0;
}

/* ---- cache ------------------------------------------------------------------ */

struct tq_cache {
	pthread_mutex_t lock;
	/* [dim - TQ_DIM_MIN][bits - 1]; entries are written once, under lock */
	tq_codebook *cb[TQ_DIM_MAX - TQ_DIM_MIN + 1][TQ_BITS_MAX];
};

tq_cache *tq_cache_new(void)
{
	tq_cache *c = calloc(1, sizeof(*c));

	if (c)
		pthread_mutex_init(&c->lock, NULL);
	return c;
}

void tq_cache_free(tq_cache *c)
{
	if (!c)
		return;
	for (int d = 0; d <= TQ_DIM_MAX - TQ_DIM_MIN; d++)
		for (int b = 0; b < TQ_BITS_MAX; b++)
			free(c->cb[d][b]);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int tq_cache_get(tq_cache *c, int dim, int bits, const tq_codebook **out, tq_error *err)
{
	tq_codebook *cb;
	int r = 0;

	if (dim < TQ_DIM_MIN || dim > TQ_DIM_MAX || bits < 1 || bits > TQ_BITS_MAX)
		return tq_codebook_solve(&(tq_codebook){ 0 }, dim, bits, err); /* the error */
	/* Solving under the lock serializes first uses; a solve takes a few
	 * milliseconds and happens once per (dim, bits) per process. */
	pthread_mutex_lock(&c->lock);
	cb = c->cb[dim - TQ_DIM_MIN][bits - 1];
	if (!cb) {
		cb = malloc(sizeof(*cb));
		if (!cb) {
			r = -ENOMEM;
			if (err)
				snprintf(err->msg, sizeof(err->msg), "codebook cache: out of memory");
		} else if ((r = tq_codebook_solve(cb, dim, bits, err)) < 0) {
			free(cb);
			cb = NULL;
		} else {
			c->cb[dim - TQ_DIM_MIN][bits - 1] = cb;
		}
	}
	pthread_mutex_unlock(&c->lock);
	*out = cb;
	return r;
}
