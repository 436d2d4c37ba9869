/* tq_cuda_none.c — tq_cuda.h in a build without CUDA: every call says so.
 *
 * Built instead of tq_cuda.c and the .cu files when the build has no
 * CUDA (make USE_CUDA=no, or auto without nvcc), so the daemon, the tests
 * and the benchmark compile one way everywhere and a configured GPU pool
 * fails (or falls back) with a reason instead of a link error. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "tq_cuda.h"

#define NO_CUDA "this tqkvd was built without CUDA (rebuild with make USE_CUDA=yes)"

static int none(char *why, size_t whylen)
{
	if (why && whylen)
		snprintf(why, whylen, "%s", NO_CUDA);
	return -ENOSYS;
}

static int none_err(tq_error *err)
{
	if (err)
		snprintf(err->msg, sizeof(err->msg), "%s", NO_CUDA);
	return -ENOSYS;
}

int tqc_built(void) { return 0; }
int tqc_device_lost(char *why, size_t whylen) { return 0; }
int tqc_device_count(char *why, size_t whylen) { return none(why, whylen); }

int tqc_device_query(int device, struct tqc_device_info *out, char *why, size_t whylen)
{
	if (out)
		memset(out, 0, sizeof(*out));
	return none(why, whylen);
}

int tqc_device_unified(const struct tqc_device_info *d) { return 0; }
void tqc_device_release(int device) {}

int tqc_region_alloc(int device, uint64_t bytes, int unified, void **out, char *why, size_t whylen)
{
	if (out)
		*out = NULL;
	return none(why, whylen);
}

void tqc_region_free(int device, void *p, int unified) {}
int tqc_host_register(int device, void *p, size_t bytes, char *why, size_t whylen) { return none(why, whylen); }
void tqc_host_unregister(int device, void *p) {}
int tqc_copy(int device, void *dst, const void *src, size_t bytes, char *why, size_t whylen) { return none(why, whylen); }
void *tqc_pinned_alloc(int device, size_t bytes) { return NULL; }
void tqc_pinned_free(void *p) {}

int tqc_ctx_new(tqc_ctx **out, int device, tq_error *err)
{
	if (out)
		*out = NULL;
	return none_err(err);
}

void tqc_ctx_free(tqc_ctx *x) {}
int tqc_ctx_device(const tqc_ctx *x) { return -1; }
double tqc_ctx_last_us(const tqc_ctx *x) { return 0.0; }
const char *tqc_ctx_last_append(const tqc_ctx *x) { return ""; }
const char *tqc_ctx_last_attn(const tqc_ctx *x) { return ""; }
const char *tqc_ctx_last_attn_plan(tqc_ctx *x) { return ""; }
int tqc_attn_inflight(int device) { return 0; }

int tqc_append(tqc_ctx *x, const struct tqc_append *a, uint32_t *bad, tq_error *err)
{
	return none_err(err);
}

int tqc_attend(tqc_ctx *x, const struct tq_attn_params *p, tq_error *err) { return none_err(err); }

int tqc_append_attend(tqc_ctx *x, const struct tqc_append *a, const struct tq_attn_params *p, uint32_t *bad,
		      int *stage, tq_error *err)
{
	if (stage)
		*stage = TQC_STAGE_APPEND;
	return none_err(err);
}

int tqc_ctx_last_fused(const tqc_ctx *x) { return 0; }

int tqc_phases_arm(int device, uint32_t max_ctas, char *why, size_t whylen) { return none(why, whylen); }
int tqc_phases_take(struct tqc_phase_rec *out, uint32_t max, uint32_t *n, char *why, size_t whylen)
{
	if (n)
		*n = 0;
	return none(why, whylen);
}

void tqc_phases_disarm(void) {}
