/* pool.c — fixed-size pages over one backend region, O(1) alloc/free. */
#include "pool.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct pool {
	const struct backend_ops *be;
	struct backend_region region;
	uint32_t page_bytes;
	uint32_t n_pages;

	pthread_mutex_t lock;       /* guards the fields below */
	uint32_t *free_stack;       /* [n_pages] page indices; [0, n_free) are free */
	uint32_t n_free;
	uint32_t used_peak;
	uint8_t *in_use;            /* [n_pages] 0/1: catches double frees */
	uint64_t allocs_total;
	uint64_t alloc_failures;

	struct pool_kernel_stats ks;   /* atomics: the backend's kernels */
	uint64_t ks_gpu_ns;            /* GPU time, nanoseconds (atomic) */
	uint64_t ks_call_ns;           /* the calls' wall time, nanoseconds (atomic) */
};

int pool_new(struct pool **out, const struct pool_params *pp, char *why, size_t whylen)
{
	struct pool *p = NULL;
	struct backend_params bp;
	uint64_t n;
	int r;

	*out = NULL;
	if (pp->page_bytes < POOL_PAGE_BYTES_MIN || pp->page_bytes > POOL_PAGE_BYTES_MAX ||
	    pp->page_bytes % 4096u) {
		snprintf(why, whylen, "page size %u is not a multiple of 4096 in [%u, %u]",
			 pp->page_bytes, POOL_PAGE_BYTES_MIN, POOL_PAGE_BYTES_MAX);
		return -EINVAL;
	}
	n = pp->bytes / pp->page_bytes;
	if (n < 1 || n > UINT32_MAX) {
		snprintf(why, whylen, "pool of %llu bytes makes %llu pages of %u bytes (need 1 .. 2^32-1)",
			 (unsigned long long)pp->bytes, (unsigned long long)n, pp->page_bytes);
		return -EINVAL;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	pthread_mutex_init(&p->lock, NULL);
	p->region.numa_node = -1;
	p->be = pp->backend ? pp->backend : &backend_host;
	p->page_bytes = pp->page_bytes;
	p->n_pages = (uint32_t)n;
	p->free_stack = malloc(sizeof(uint32_t) * n);
	p->in_use = calloc(n, 1);
	if (!p->free_stack || !p->in_use) {
		snprintf(why, whylen, "out of memory for the page index of %llu pages", (unsigned long long)n);
		r = -ENOMEM;
		goto fail;
	}
	bp.bytes = n * pp->page_bytes;
	bp.numa_node = pp->numa_node;
	bp.hugepages = pp->hugepages;
	bp.device = pp->device;
	bp.host_avail = pp->host_avail;
	if ((r = p->be->region_alloc(&bp, &p->region, why, whylen)) < 0)
		goto fail;
	/* Lowest pages on top of the stack: the region is touched from the front. */
	for (uint32_t i = 0; i < p->n_pages; i++)
		p->free_stack[i] = p->n_pages - 1 - i;
	p->n_free = p->n_pages;
	*out = p;
	return 0;
fail:
	pool_free(p);
	return r;
}

void pool_free(struct pool *p)
{
	if (!p)
		return;
	assert(!p->free_stack || !p->region.base || p->n_free == p->n_pages);
	if (p->be)
		p->be->region_free(&p->region);
	free(p->free_stack);
	free(p->in_use);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

uint32_t pool_page_bytes(const struct pool *p)
{
	return p->page_bytes;
}

int pool_pages_alloc(struct pool *p, uint32_t n, uint8_t **pages)
{
	pthread_mutex_lock(&p->lock);
	if (n > p->n_free) {
		p->alloc_failures++;
		pthread_mutex_unlock(&p->lock);
		return -ENOSPC;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t idx = p->free_stack[--p->n_free];
		assert(!p->in_use[idx]);
		p->in_use[idx] = 1;
		pages[i] = p->region.base + (uint64_t)idx * p->page_bytes;
	}
	p->allocs_total += n;
	if (p->n_pages - p->n_free > p->used_peak)
		p->used_peak = p->n_pages - p->n_free;
	pthread_mutex_unlock(&p->lock);
	return 0;
}

void pool_pages_free(struct pool *p, uint8_t *const *pages, uint32_t n)
{
	pthread_mutex_lock(&p->lock);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t off = (uint64_t)(pages[i] - p->region.base);
		uint32_t idx = (uint32_t)(off / p->page_bytes);

		assert(pages[i] >= p->region.base && off % p->page_bytes == 0 && idx < p->n_pages);
		assert(p->in_use[idx] && "page freed twice");
		p->in_use[idx] = 0;
		p->free_stack[p->n_free++] = idx;
	}
	pthread_mutex_unlock(&p->lock);
}

uint32_t pool_pages_free_count(struct pool *p)
{
	uint32_t n;

	pthread_mutex_lock(&p->lock);
	n = p->n_free;
	pthread_mutex_unlock(&p->lock);
	return n;
}

uint32_t pool_pages_total(const struct pool *p)
{
	return p->n_pages;
}

void pool_stats(struct pool *p, struct pool_stats *out)
{
	struct backend_stats bs;

	memset(out, 0, sizeof(*out));
	p->be->stats(&p->region, &bs);
	out->backend = p->be->name;
	out->desc = p->region.desc;
	out->page_bytes = p->page_bytes;
	out->pages_total = p->n_pages;
	out->bytes = (uint64_t)p->n_pages * p->page_bytes;
	out->resident_bytes = bs.resident_bytes;
	out->numa_node = bs.numa_node;
	out->hugepages = bs.hugepages;
	pthread_mutex_lock(&p->lock);
	out->pages_free = p->n_free;
	out->pages_used_peak = p->used_peak;
	out->allocs_total = p->allocs_total;
	out->alloc_failures = p->alloc_failures;
	pthread_mutex_unlock(&p->lock);
}

/* ---- the tier's own operations ------------------------------------------------------ */

bool pool_host_accessible(const struct pool *p)
{
	return p->region.host_accessible;
}

bool pool_has_kernels(const struct pool *p)
{
	return p->be->append && p->be->attend;
}

uint32_t pool_page_tokens_align(const struct pool *p)
{
	return p->be->page_tokens_align;
}

int pool_copy(struct pool *p, void *dst, const void *src, size_t n, char *why, size_t whylen)
{
	if (!p->be->copy) {
		memcpy(dst, src, n);
		return 0;
	}
	return p->be->copy(&p->region, dst, src, n, why, whylen);
}

int pool_host_register(struct pool *p, void *addr, size_t n, char *why, size_t whylen)
{
	int r;

	if (!p->be->host_register)
		return 0;
	r = p->be->host_register(&p->region, addr, n, why, whylen);
	return r < 0 ? r : 1;
}

void pool_host_unregister(struct pool *p, void *addr)
{
	if (p->be->host_unregister)
		p->be->host_unregister(&p->region, addr);
}

bool pool_lost(struct pool *p, char *why, size_t whylen)
{
	return p->be->lost && p->be->lost(&p->region, why, whylen) > 0;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* After a kernel call of the backend's that began at t0 (mono_ns): its
 * count, failure, wall and GPU time (and for a decode step, whether it
 * waited once) */
static void kern_count(struct pool *p, uint64_t *calls, int rc, const uint32_t *bad, uint64_t t0)
{
	double us = 0.0;
	int one = 0;

	__atomic_add_fetch(calls, 1, __ATOMIC_RELAXED);
	/* the device's failures, not a client's values refused (NaN, out of
	 * range: -EINVAL / -ERANGE with the token in *bad, counted as such by
	 * the data path) */
	if (rc < 0 && !((rc == -EINVAL || rc == -ERANGE) && bad && *bad != UINT32_MAX))
		__atomic_add_fetch(&p->ks.failures, 1, __ATOMIC_RELAXED);
	if (rc == 0)
		__atomic_add_fetch(&p->ks_call_ns, mono_ns() - t0, __ATOMIC_RELAXED);
	if (p->be->last_call) {
		p->be->last_call(&p->region, &us, &one);
		if (rc == 0 && us > 0.0 && us < 1e9)
			__atomic_add_fetch(&p->ks_gpu_ns, (uint64_t)(us * 1e3), __ATOMIC_RELAXED);
		if (rc == 0 && one && calls == &p->ks.steps) /* only append_attend says one */
			__atomic_add_fetch(&p->ks.steps_one_wait, 1, __ATOMIC_RELAXED);
	}
}

int pool_append(struct pool *p, const struct tqc_append *a, uint32_t *bad, tq_error *err)
{
	const uint64_t t0 = mono_ns();
	int rc = p->be->append(&p->region, a, bad, err);

	kern_count(p, &p->ks.appends, rc, bad, t0);
	return rc;
}

int pool_attend(struct pool *p, const struct tq_attn_params *a, tq_error *err)
{
	const uint64_t t0 = mono_ns();
	int rc = p->be->attend(&p->region, a, err);

	kern_count(p, &p->ks.attends, rc, NULL, t0);
	return rc;
}

bool pool_has_append_attend(const struct pool *p)
{
	return pool_has_kernels(p) && p->be->append_attend;
}

int pool_append_attend(struct pool *p, const struct tqc_append *a, const struct tq_attn_params *ap, uint32_t *bad,
		       int *stage, tq_error *err)
{
	const uint64_t t0 = mono_ns();
	int rc = p->be->append_attend(&p->region, a, ap, bad, stage, err);

	kern_count(p, &p->ks.steps, rc, bad, t0);
	return rc;
}

void pool_kernel_stats(struct pool *p, struct pool_kernel_stats *out)
{
	out->appends = __atomic_load_n(&p->ks.appends, __ATOMIC_RELAXED);
	out->attends = __atomic_load_n(&p->ks.attends, __ATOMIC_RELAXED);
	out->steps = __atomic_load_n(&p->ks.steps, __ATOMIC_RELAXED);
	out->steps_one_wait = __atomic_load_n(&p->ks.steps_one_wait, __ATOMIC_RELAXED);
	out->failures = __atomic_load_n(&p->ks.failures, __ATOMIC_RELAXED);
	out->gpu_us = __atomic_load_n(&p->ks_gpu_ns, __ATOMIC_RELAXED) / 1000u;
	out->call_us = __atomic_load_n(&p->ks_call_ns, __ATOMIC_RELAXED) / 1000u;
}

int pool_spill_copy(void *pool, void *dst, const void *src, size_t n, char *why, size_t whylen)
{
	return pool_copy(pool, dst, src, n, why, whylen);
}

int pool_spill_pin(void *pool, void *buf, size_t n, char *why, size_t whylen)
{
	int r = pool_host_register(pool, buf, n, why, whylen);

	return r < 0 ? r : 0;
}

void pool_spill_unpin(void *pool, void *buf)
{
	pool_host_unregister(pool, buf);
}
