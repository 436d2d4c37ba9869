/* sampler.h — next-token sampling for tqkv-run: greedy (temperature 0),
 * temperature + multinomial, or temperature + top-p (nucleus), with a seeded
 * xorshift64* generator so that a seed reproduces a run exactly.
 * Not thread-safe: one sampler per generating thread. */
#ifndef TQR_SAMPLER_H
#define TQR_SAMPLER_H

#include <stdint.h>

#include "tqr_util.h"

typedef struct tqr_sampler tqr_sampler;

/* temperature >= 0 (0 = argmax), top_p in [0, 1] (0 or 1 = off).
 * 0, -EINVAL (bad values), -ENOMEM. */
int tqr_sampler_new(tqr_sampler **out, int vocab_size, float temperature, float top_p,
		    uint64_t seed, tqr_error *err);
void tqr_sampler_free(tqr_sampler *s);

/* Picks a token from logits[vocab_size]; the logits are overwritten (scaled,
 * then turned into probabilities).  Never fails for finite logits; a
 * non-finite logit falls back to argmax over the finite ones. */
int tqr_sample(tqr_sampler *s, float *logits);

/* The generator itself (tests): a uniform float in [0, 1). */
float tqr_sampler_uniform(tqr_sampler *s);

#endif /* TQR_SAMPLER_H */
