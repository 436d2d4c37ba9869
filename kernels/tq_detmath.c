/* tq_detmath.c — deterministic math for everything kernels/ derives from a
 * seed: log/exp from + - * / and exact libm bit operations only (frexp,
 * ldexp, floor), and the project's one PRNG.  Compiled, like all of the tree,
 * with -ffp-contract=off, so the results are the same bits on any IEEE-754
 * machine (x86-64, aarch64) whatever its libm. */
#include <math.h>

#include "tq_internal.h"

static const double LN2_HI = 6.93147180369123816490e-01; /* 0x3fe62e42fee00000 */
static const double LN2_LO = 1.90821492927058770002e-10; /* 0x3dea39ef35793c76 */

double tq_det_log(double x)
{
	if (!(x > 0.0))
		return x == 0.0 ? -INFINITY : NAN;
	if (isinf(x))
		return x;
	int e;
	double m = frexp(x, &e); /* x = m 2^e, m in [0.5, 1) */
	if (m < 0.70710678118654752440) {
		m *= 2.0;
		e -= 1;
	}
	/* log(m) = 2 atanh(z), z = (m-1)/(m+1), |z| <= 0.1716 */
	double z = (m - 1.0) / (m + 1.0), z2 = z * z, term = z, sum = 0.0;
	for (int k = 1; k <= 41; k += 2) {
		sum += term / (double)k;
		term *= z2;
	}
	return (double)e * LN2_HI + ((double)e * LN2_LO + 2.0 * sum);
}

double tq_det_exp(double x)
{
	if (isnan(x))
		return x;
	if (x > 709.0)
		return INFINITY;
	if (x < -745.0)
		return 0.0;
	double k = floor(x * 1.44269504088896340736 + 0.5);
	double r = (x - k * LN2_HI) - k * LN2_LO; /* |r| <= 0.35 */
	double p = 1.0;
	for (int n = 24; n >= 1; n--)
		p = 1.0 + p * r / (double)n;
	return ldexp(p, (int)k);
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

void tq_rng_seed(struct tq_rng *r, uint64_t seed)
{
	for (int i = 0; i < 4; i++)
		r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

uint64_t tq_rng_next(struct tq_rng *r)
{
	uint64_t *s = r->s;
	uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

double tq_rng_uniform(struct tq_rng *r)
{
	return (double)(tq_rng_next(r) >> 11) * 0x1.0p-53;
}

double tq_rng_gauss(struct tq_rng *r)
{
	for (;;) {
		double u = 2.0 * tq_rng_uniform(r) - 1.0, v = 2.0 * tq_rng_uniform(r) - 1.0;
		double s = u * u + v * v;
		if (s > 0.0 && s < 1.0)
			return u * sqrt(-2.0 * tq_det_log(s) / s);
	}
}
