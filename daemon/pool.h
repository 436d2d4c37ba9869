/* pool.h — the KV page pool: one backend region cut into fixed-size pages.
 *
 * Pages are handed out and taken back in O(1) (a stack of free page
 * indices).  Allocation is all-or-nothing: pool_pages_alloc(n) gives n pages
 * or none (-ENOSPC).  The pool does no tenant accounting: the data path
 * charges a page's bytes to the session's tenant before it asks for the page
 * (session_charge), and uncharges after it gives the page back.
 *
 * Thread-safe (one mutex around the free stack; the critical section is a
 * few loads and stores).  Nothing here logs.
 */
#ifndef TQKVD_POOL_H
#define TQKVD_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#define POOL_PAGE_BYTES_DEFAULT (64u << 10)
#define POOL_PAGE_BYTES_MIN     (4u << 10)
#define POOL_PAGE_BYTES_MAX     (64u << 20)

struct pool;

struct pool_params {
	uint64_t bytes;                  /* region size (pages = bytes / page_bytes)    */
	uint32_t page_bytes;             /* multiple of 4096 in [MIN, MAX]              */
	int numa_node;                   /* -1: no placement                            */
	bool hugepages;                  /* transparent huge pages where available      */
	const struct backend_ops *backend; /* NULL: host                               */
	int device;                      /* cuda: the device index                      */
	uint64_t host_avail;             /* backend_params.host_avail                   */
};

struct pool_stats {
	const char *backend;             /* "host", "cuda"                              */
	const char *desc;                /* what the memory is (backend_region.desc)    */
	uint64_t bytes;                  /* pages * page_bytes                          */
	uint32_t page_bytes;
	uint32_t pages_total;
	uint32_t pages_free;
	uint32_t pages_used_peak;
	uint64_t allocs_total;           /* pages handed out since start                */
	uint64_t alloc_failures;         /* pool_pages_alloc calls that got -ENOSPC     */
	uint64_t resident_bytes;         /* of the region touched so far (0: unknown)   */
	int numa_node;
	bool hugepages;
};

/* 0, or -EINVAL / -ENOMEM / -ENODEV with why set. */
int pool_new(struct pool **out, const struct pool_params *p, char *why, size_t whylen);
/* Every page must have been given back (a leak is a bug: asserted). */
void pool_free(struct pool *p);

uint32_t pool_page_bytes(const struct pool *p);
/* n pages into pages[0..n): 0, or -ENOSPC (nothing taken). */
int pool_pages_alloc(struct pool *p, uint32_t n, uint8_t **pages);
/* Give back n pages from pool_pages_alloc; giving back a page twice, or a
 * pointer that is not a page of this pool, is a bug. */
void pool_pages_free(struct pool *p, uint8_t *const *pages, uint32_t n);
uint32_t pool_pages_free_count(struct pool *p);
uint32_t pool_pages_total(const struct pool *p);
void pool_stats(struct pool *p, struct pool_stats *out);

/* ---- the tier's own operations (backend.h) --------------------------------------
 * A pool on host memory answers these the host's way (memcpy, nothing to
 * register, no kernels of its own); a GPU pool through its backend. */
/* The daemon's threads may read and write the pages (host, unified memory). */
bool pool_host_accessible(const struct pool *p);
/* The backend runs append and attention itself (pool_append, pool_attend);
 * else the data path runs the CPU kernels on the pages. */
bool pool_has_kernels(const struct pool *p);
/* Pages of a multiple of this many tokens suit the pool's kernels (0: any;
 * backend.h's page_tokens_align). */
uint32_t pool_page_tokens_align(const struct pool *p);
/* Copy n bytes between host memory and pages (either side): 0, or -EIO. */
int pool_copy(struct pool *p, void *dst, const void *src, size_t n, char *why, size_t whylen);
/* Pin a client arena for the backend's kernels: 1 registered, 0 nothing to
 * do (host), or a negative errno with why (the kernels then stage copies). */
int pool_host_register(struct pool *p, void *addr, size_t n, char *why, size_t whylen);
void pool_host_unregister(struct pool *p, void *addr);
/* The spill store's hooks for pages outside host memory (spill_params'
 * page_copy, pin_staging, unpin_staging with copy_ctx = the pool). */
int pool_spill_copy(void *pool, void *dst, const void *src, size_t n, char *why, size_t whylen);
int pool_spill_pin(void *pool, void *buf, size_t n, char *why, size_t whylen);
void pool_spill_unpin(void *pool, void *buf);
/* The pool's device failed for good (backend.h's lost): its operations
 * fail with -ENOTRECOVERABLE from then on, and tqkvd stops (main.c). */
bool pool_lost(struct pool *p, char *why, size_t whylen);
/* The backend's kernels (only when pool_has_kernels). */
int pool_append(struct pool *p, const struct tqc_append *a, uint32_t *bad, tq_error *err);
int pool_attend(struct pool *p, const struct tq_attn_params *a, tq_error *err);
/* The backend's kernel calls since start (a pool without kernels: zeros). */
struct pool_kernel_stats {
	uint64_t appends;                /* pool_append                                 */
	uint64_t attends;                /* pool_attend                                 */
	uint64_t steps;                  /* pool_append_attend: a layer's decode step   */
	uint64_t steps_one_wait;         /* of which the attention was queued behind    */
					 /* the append (tqc_append_attend)             */
	uint64_t failures;               /* calls of the three that failed (not counting */
					 /* a client's values refused: NaN, range)    */
	uint64_t gpu_us;                 /* the successful calls' GPU time (events)     */
	uint64_t call_us;                /* and their wall time, the host's side too    */
};
void pool_kernel_stats(struct pool *p, struct pool_kernel_stats *out);

/* The backend takes an append and the attention after it in one call
 * (pool_append_attend); else pool_append, then pool_attend. */
bool pool_has_append_attend(const struct pool *p);
int pool_append_attend(struct pool *p, const struct tqc_append *a, const struct tq_attn_params *ap, uint32_t *bad,
		       int *stage, tq_error *err);

#endif
