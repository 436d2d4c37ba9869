/* tietest.h — inputs that land exactly on a codebook bound, for the tests
 * that hold an encoder to the reference's bytes (test_codec_simd: the SIMD
 * paths; test_cuda: the GPU).  A coordinate equal to a bound is where a
 * centroid search that is not exactly the reference's (a `>=` for a `>`, a
 * fused multiply-add in the rotation) picks another index. */
#ifndef TQ_TEST_TIETEST_H
#define TQ_TEST_TIETEST_H

#include <stdint.h>

#include "tq_internal.h"

/* u = R x / ||x|| with the reference's float operations (tq_codec_ref.c). */
void tie_ref_u(const tq_codec *c, const float *x, float *u);

/* A 2-sparse x = e_j + t e_k (dim floats) whose rotated coordinate lands
 * exactly on one of the tq codec c's bounds: j, k and the target bound drawn
 * from rnd(ctx), t bisected for the crossing, then the floats around it
 * walked.  1 when found (x holds it), 0 after 12 attempts. */
int tie_make(const tq_codec *c, uint64_t (*rnd)(void *ctx), void *ctx, float *x);

#endif
