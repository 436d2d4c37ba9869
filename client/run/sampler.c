/* sampler.c — greedy, multinomial and top-p sampling (llama2.c's rules). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "sampler.h"

struct prob_index {
	float p;
	int i;
};

struct tqr_sampler {
	int vocab;
	float temperature;
	float top_p;
	uint64_t state;             /* xorshift64*, never 0 */
	struct prob_index *scratch; /* [vocab] for top-p    */
};

int tqr_sampler_new(tqr_sampler **out, int vocab_size, float temperature, float top_p,
		    uint64_t seed, tqr_error *err)
{
	tqr_sampler *s;

	*out = NULL;
	if (vocab_size < 1)
		return tqr_fail(err, -EINVAL, "sampler: vocab_size %d", vocab_size);
	if (!(temperature >= 0.0f) || !isfinite(temperature))
		return tqr_fail(err, -EINVAL, "--temperature must be a finite number >= 0 (got %g)",
				(double)temperature);
	if (!(top_p >= 0.0f && top_p <= 1.0f))
		return tqr_fail(err, -EINVAL, "--top-p must be in [0, 1] (got %g)", (double)top_p);
	s = calloc(1, sizeof(*s));
	if (!s || !(s->scratch = malloc(sizeof(*s->scratch) * (size_t)vocab_size))) {
		free(s);
		return tqr_fail(err, -ENOMEM, "sampler: out of memory");
	}
	s->vocab = vocab_size;
	s->temperature = temperature;
	s->top_p = top_p;
	/* splitmix64 of the seed: any seed, 0 included, gives a non-zero state */
	uint64_t z = seed + 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	z ^= z >> 31;
	s->state = z ? z : 0x2545F4914F6CDD1DULL;
	*out = s;
	return 0;
}

void tqr_sampler_free(tqr_sampler *s)
{
	if (!s)
		return;
	free(s->scratch);
	free(s);
}

static uint32_t rng_u32(tqr_sampler *s)
{
	s->state ^= s->state >> 12;
	s->state ^= s->state << 25;
	s->state ^= s->state >> 27;
	return (uint32_t)((s->state * 0x2545F4914F6CDD1DULL) >> 32);
}

float tqr_sampler_uniform(tqr_sampler *s)
{
	return (float)(rng_u32(s) >> 8) / 16777216.0f;
}

static int argmax(const float *x, int n)
{
	int best = 0;

	for (int i = 1; i < n; i++)
		if (x[i] > x[best] || !isfinite(x[best]))
			best = i;
	return best;
}

static int cmp_desc(const void *a, const void *b)
{
	const struct prob_index *x = a, *y = b;

	if (x->p != y->p)
		return x->p < y->p ? 1 : -1;
	return (x->i > y->i) - (x->i < y->i);
}

int tqr_sample(tqr_sampler *s, float *logits)
{
	int n = s->vocab;
	float mx = -INFINITY, coin;
	double sum = 0, cdf = 0;

	if (s->temperature == 0.0f)
		return argmax(logits, n);
	for (int i = 0; i < n; i++) {
		if (!isfinite(logits[i]))
			return argmax(logits, n);
		logits[i] /= s->temperature;
		if (logits[i] > mx)
			mx = logits[i];
	}
	for (int i = 0; i < n; i++) {
		logits[i] = expf(logits[i] - mx);
		sum += logits[i];
	}
	for (int i = 0; i < n; i++)
		logits[i] = (float)(logits[i] / sum);
	coin = tqr_sampler_uniform(s);

	if (s->top_p <= 0.0f || s->top_p >= 1.0f) {
		for (int i = 0; i < n; i++) {
			cdf += logits[i];
			if (coin < cdf)
				return i;
		}
		return n - 1; /* rounding */
	}
	/* top-p: the smallest set of most likely tokens whose mass exceeds
	 * top_p; tokens below (1 - top_p) / (n - 1) can never be in it */
	float cutoff = n > 1 ? (1.0f - s->top_p) / (float)(n - 1) : 0.0f;
	int m = 0, last;
	for (int i = 0; i < n; i++)
		if (logits[i] >= cutoff)
			s->scratch[m++] = (struct prob_index){ logits[i], i };
	if (m == 0)
		return argmax(logits, n);
	qsort(s->scratch, (size_t)m, sizeof(*s->scratch), cmp_desc);
	last = m - 1;
	double mass = 0;
	for (int i = 0; i < m; i++) {
		mass += s->scratch[i].p;
		if (mass > s->top_p) {
			last = i;
			break;
		}
	}
	double r = coin * mass;
	for (int i = 0; i <= last; i++) {
		cdf += s->scratch[i].p;
		if (r < cdf)
			return s->scratch[i].i;
	}
	return s->scratch[last].i;
}
