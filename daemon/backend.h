/* backend.h — where the pool's memory comes from, and what computes on it.
 *
 * A backend hands the pool one contiguous region and takes it back; the pool
 * cuts it into pages.  The host backend (backend_host.c) maps anonymous
 * memory, asks for transparent huge pages and binds it to a NUMA node; the
 * data path runs the CPU kernels (tq_encode, tq_attend) on its pages.  The
 * CUDA backend (backend_cuda.c) takes the memory of one GPU — device memory
 * on a discrete GPU (`host_accessible` false: only kernels and `copy` touch
 * it), memory the CPU and GPU share on an integrated one — and runs the GPU
 * kernels (tq_cuda.h) through `append` and `attend`.
 *
 * The optional operations (NULL in the host backend) are the whole of what
 * the rest of the daemon needs to know about a tier that is not host DRAM:
 *   copy            page bytes to or from host memory (spill, persistence)
 *   host_register   pin a client's shared arena so kernels use it directly
 *   append, attend  the kernels, on the calling thread's own stream
 *   append_attend   both for one layer's decode step, one wait for the two
 *
 * Nothing here logs: errors come back as a negative errno and a reason.
 * A region is used by one pool; the functions are not thread-safe on the
 * same region (the pool calls them from its own new/free).
 */
#ifndef TQKVD_BACKEND_H
#define TQKVD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tq_attn.h"
#include "tq_cuda.h"

struct backend_params {
	uint64_t bytes;          /* region size; the backend may round it up       */
	int numa_node;           /* -1: no placement; else bind to this node        */
	bool hugepages;          /* ask for huge pages where the backend has them   */
	int device;              /* cuda: the device index                          */
	uint64_t host_avail;     /* cuda on a GPU that shares host memory: the host */
				 /* memory the pool may pin (0: not checked)       */
};

struct backend_region {
	uint8_t *base;           /* [bytes], aligned to at least 4096               */
	uint64_t bytes;
	int numa_node;           /* the node the region is bound to, or -1          */
	bool hugepages;          /* huge pages were requested and accepted (advice) */
	bool host_accessible;    /* the daemon's threads may read and write it      */
	char desc[192];          /* for the log: what the memory is                 */
	void *priv;              /* the backend's own state                         */
};

struct backend_stats {
	uint64_t bytes;          /* region size                                      */
	uint64_t resident_bytes; /* touched so far (host: mincore), 0 if unknown     */
	int numa_node;
	bool hugepages;
};

struct backend_ops {
	const char *name;        /* "host", "cuda" */
	/* Pages of a multiple of this many tokens suit the backend's kernels
	 * (cuda: TQC_PAGE_TOKENS_ALIGN, the tiled attention's tile); a
	 * session's pages are cut to it where one holds at least that many.
	 * 0: any number (the CPU kernels). */
	uint32_t page_tokens_align;
	/* 0, or -EINVAL (params), -ENOMEM, -ENODEV (node absent) with why set. */
	int (*region_alloc)(const struct backend_params *p, struct backend_region *out,
			    char *why, size_t whylen);
	/* Accepts a zeroed (never allocated) region. */
	void (*region_free)(struct backend_region *r);
	void (*stats)(const struct backend_region *r, struct backend_stats *out);

	/* ---- optional (NULL: host memory, CPU kernels) ---- */
	/* After a pool on this backend failed to start (nothing of it left):
	 * give back what the driver still holds for this process on that
	 * device (cuda: its context), before falling back to another. */
	void (*release)(int device);
	/* Copy n bytes between host memory and the region (either side may be
	 * the region), synchronously: 0, or -EIO with why. */
	int (*copy)(const struct backend_region *r, void *dst, const void *src, size_t n,
		    char *why, size_t whylen);
	/* Pin host memory for the device (a client arena mapped by the ring
	 * server): 0, or a negative errno with why (kernels then reach it
	 * through staged copies).  unregister before it is unmapped. */
	int (*host_register)(const struct backend_region *r, void *p, size_t n, char *why, size_t whylen);
	void (*host_unregister)(const struct backend_region *r, void *p);
	/* The kernels, as tqc_append / tqc_attend (tq_cuda.h), on an execution
	 * context (stream + scratch) of the calling thread: each thread that
	 * runs data operations gets its own on first use, freed when it exits.
	 * They return after the device finished the work. */
	int (*append)(const struct backend_region *r, const struct tqc_append *a, uint32_t *bad, tq_error *err);
	int (*attend)(const struct backend_region *r, const struct tq_attn_params *p, tq_error *err);
	/* One layer's decode step, as tqc_append_attend: a's append, then p's
	 * attention over the layer with a's tokens, the append queued ahead of
	 * the attention with no wait between where it can be; *stage says
	 * which part failed (TQC_STAGE_*).  NULL: the data path calls append,
	 * then attend. */
	int (*append_attend)(const struct backend_region *r, const struct tqc_append *a,
			     const struct tq_attn_params *p, uint32_t *bad, int *stage, tq_error *err);
	/* What the calling thread's last append / attend / append_attend
	 * cost: its GPU time by the stream's events (microseconds) and, for
	 * append_attend, whether the attention was queued behind the append
	 * (one wait).  Optional within the optional operations. */
	void (*last_call)(const struct backend_region *r, double *gpu_us, int *one_wait);
	/* 1 with why once the device failed for good (a CUDA context lost to
	 * a sticky error: tqc_device_lost; its operations then fail with
	 * -ENOTRECOVERABLE), else 0. */
	int (*lost)(const struct backend_region *r, char *why, size_t whylen);
};

extern const struct backend_ops backend_host;
extern const struct backend_ops backend_cuda;


#endif
