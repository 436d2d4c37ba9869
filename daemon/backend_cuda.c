/* backend_cuda.c — the GPU tier: the pool in the memory of one CUDA device,
 * the kernels of tq_cuda.h on it.
 *
 *   discrete GPU   one cudaMalloc'd region (device memory), cut into pages
 *                  like the host pool; the daemon's threads never touch its
 *                  bytes: spill and persistence copy through `copy` (the
 *                  spill store's staging is pinned), kernels do the rest.
 *   integrated /   (cudaDevAttrIntegrated, or pageable memory access through
 *   unified GPU    the host's page tables, as on Grace: GB10, GH200) memory
 *                  both the CPU and the GPU use without copies: the region is
 *                  host-accessible and spill writes pages straight from it.
 *
 * Each thread that runs data operations (a ring worker) gets its own
 * execution context — a CUDA stream and its scratch — on its first
 * operation, kept in a thread-specific slot and freed when the thread
 * exits: workers never share a stream, and an operation returns (and
 * completes on the ring) only after its stream work has finished.
 *
 * Nothing here logs; errors carry the reason (tq_cuda.h words them: no
 * driver, driver too old, no such device, out of device memory).
 */
#include "backend.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cuda_region {
	int device;
	int unified;
	struct tqc_device_info info;
};

static void fmt_gib(uint64_t b, char *out, size_t n)
{
	snprintf(out, n, "%.1f GiB", (double)b / (double)(1ull << 30));
}

static int cuda_alloc(const struct backend_params *p, struct backend_region *out, char *why, size_t whylen)
{
	struct cuda_region *cr;
	char have[32], want[32];
	void *base = NULL;
	int r;

	memset(out, 0, sizeof(*out));
	out->numa_node = -1;
	if (p->bytes == 0 || p->bytes > ((uint64_t)1 << 56)) {
		snprintf(why, whylen, "region size %llu is out of range", (unsigned long long)p->bytes);
		return -EINVAL;
	}
	if (!(cr = calloc(1, sizeof(*cr))))
		return -ENOMEM;
	cr->device = p->device;
	if ((r = tqc_device_query(p->device, &cr->info, why, whylen)) < 0)
		goto fail;
	cr->unified = tqc_device_unified(&cr->info);
	fmt_gib(p->bytes, want, sizeof(want));
	if (!cr->unified && p->bytes > cr->info.free_bytes) {
		fmt_gib(cr->info.free_bytes, have, sizeof(have));
		snprintf(why, whylen, "CUDA device %d (%s) has %s of device memory free; the pool needs %s",
			 p->device, cr->info.name, have, want);
		r = -ENOMEM;
		goto fail;
	}
	if (cr->unified && p->host_avail && p->bytes > p->host_avail) {
		/* the pool's pages would be pinned host memory, never swapped:
		 * what the host backend refuses (MemAvailable), refused here
		 * too, not granted until the machine stalls */
		fmt_gib(p->host_avail, have, sizeof(have));
		snprintf(why, whylen, "CUDA device %d (%s) shares the host's memory, where the pool's %s would be "
			 "pinned (never swapped): more than the %s available (MemAvailable); lower pool.pool_bytes, "
			 "or set pool.allow_overcommit = yes", p->device, cr->info.name, want, have);
		r = -ENOMEM;
		goto fail;
	}
	if ((r = tqc_region_alloc(p->device, p->bytes, cr->unified, &base, why, whylen)) < 0)
		goto fail;
	out->base = base;
	out->bytes = p->bytes;
	out->host_accessible = cr->unified != 0;
	out->priv = cr;
	snprintf(out->desc, sizeof(out->desc), "CUDA device %d: %.60s, sm_%d%d, %d SMs, %.0f GB/s, %s",
		 p->device, cr->info.name, cr->info.cc_major, cr->info.cc_minor, cr->info.sms,
		 cr->info.peak_gbps, cr->unified ? "unified memory (no copies)" : "device memory");
	return 0;
fail:
	free(cr);
	memset(out, 0, sizeof(*out));
	out->numa_node = -1;
	return r;
}

static void cuda_free(struct backend_region *r)
{
	struct cuda_region *cr = r->priv;

	if (cr && r->base)
		tqc_region_free(cr->device, r->base, cr->unified);
	free(cr);
	memset(r, 0, sizeof(*r));
	r->numa_node = -1;
}

static void cuda_stats(const struct backend_region *r, struct backend_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->bytes = r->bytes;
	out->resident_bytes = r->bytes; /* allocated and backed at start */
	out->numa_node = -1;
}

static int dev_of(const struct backend_region *r)
{
	return ((const struct cuda_region *)r->priv)->device;
}

static int cuda_copy(const struct backend_region *r, void *dst, const void *src, size_t n, char *why, size_t whylen)
{
	return tqc_copy(dev_of(r), dst, src, n, why, whylen);
}

static int cuda_register(const struct backend_region *r, void *p, size_t n, char *why, size_t whylen)
{
	return tqc_host_register(dev_of(r), p, n, why, whylen);
}

static void cuda_unregister(const struct backend_region *r, void *p)
{
	tqc_host_unregister(dev_of(r), p);
}

/* ---- one execution context per thread ----------------------------------------------- */

static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static int ctx_key_err;

static void ctx_destroy(void *x)
{
	tqc_ctx_free(x);
}

static void ctx_key_make(void)
{
	ctx_key_err = pthread_key_create(&ctx_key, ctx_destroy);
}

static int thread_ctx(int device, tqc_ctx **out, tq_error *err)
{
	tqc_ctx *x;
	int r;

	pthread_once(&ctx_once, ctx_key_make);
	if (ctx_key_err) {
		snprintf(err->msg, sizeof(err->msg), "no thread-specific slot for a CUDA stream: %s",
			 strerror(ctx_key_err));
		return -ctx_key_err;
	}
	x = pthread_getspecific(ctx_key);
	if (x && tqc_ctx_device(x) != device) { /* a thread moved to another device's pool (tests) */
		pthread_setspecific(ctx_key, NULL);
		tqc_ctx_free(x);
		x = NULL;
	}
	if (!x) {
		if ((r = tqc_ctx_new(&x, device, err)) < 0)
			return r;
		if ((r = pthread_setspecific(ctx_key, x)) != 0) {
			tqc_ctx_free(x);
			snprintf(err->msg, sizeof(err->msg), "pthread_setspecific: %s", strerror(r));
			return -r;
		}
	}
	*out = x;
	return 0;
}

static int cuda_append(const struct backend_region *r, const struct tqc_append *a, uint32_t *bad, tq_error *err)
{
	tqc_ctx *x;
	int e = thread_ctx(dev_of(r), &x, err);

	return e < 0 ? e : tqc_append(x, a, bad, err);
}

static int cuda_attend(const struct backend_region *r, const struct tq_attn_params *p, tq_error *err)
{
	tqc_ctx *x;
	int e = thread_ctx(dev_of(r), &x, err);

	return e < 0 ? e : tqc_attend(x, p, err);
}

static int cuda_append_attend(const struct backend_region *r, const struct tqc_append *a,
			      const struct tq_attn_params *p, uint32_t *bad, int *stage, tq_error *err)
{
	tqc_ctx *x;
	int e = thread_ctx(dev_of(r), &x, err);

	if (e < 0 && stage)
		*stage = TQC_STAGE_APPEND;
	return e < 0 ? e : tqc_append_attend(x, a, p, bad, stage, err);
}

static void cuda_last_call(const struct backend_region *r, double *gpu_us, int *one_wait)
{
	tqc_ctx *x = ctx_key_err ? NULL : pthread_getspecific(ctx_key);

	*gpu_us = x ? tqc_ctx_last_us(x) : 0.0;
	*one_wait = x ? tqc_ctx_last_fused(x) : 0;
}

static void cuda_release(int device)
{
	tqc_device_release(device);
}

/* process-wide: one CUDA context a device per process (the runtime's) */
static int cuda_lost(const struct backend_region *r, char *why, size_t whylen)
{
	return tqc_device_lost(why, whylen);
}

const struct backend_ops backend_cuda = {
	.name = "cuda",
	.page_tokens_align = TQC_PAGE_TOKENS_ALIGN,
	.region_alloc = cuda_alloc,
	.region_free = cuda_free,
	.stats = cuda_stats,
	.release = cuda_release,
	.copy = cuda_copy,
	.host_register = cuda_register,
	.host_unregister = cuda_unregister,
	.append = cuda_append,
	.attend = cuda_attend,
	.append_attend = cuda_append_attend,
	.last_call = cuda_last_call,
	.lost = cuda_lost,
};
