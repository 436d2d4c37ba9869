/* backend.h — where the pool's memory comes from.
 *
 * A backend hands the pool one contiguous region and takes it back; the pool
 * cuts it into pages.  The host backend (backend_host.c) maps anonymous
 * memory, asks for transparent huge pages and binds it to a NUMA node; a
 * CUDA device-memory backend implements the same table next (its region is
 * device memory: only kernels touch it, so `host_accessible` is false).
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

struct backend_params {
	uint64_t bytes;          /* region size; the backend may round it up       */
	int numa_node;           /* -1: no placement; else bind to this node        */
	bool hugepages;          /* ask for huge pages where the backend has them   */
};

struct backend_region {
	uint8_t *base;           /* [bytes], aligned to at least 4096               */
	uint64_t bytes;
	int numa_node;           /* the node the region is bound to, or -1          */
	bool hugepages;          /* huge pages were requested and accepted (advice) */
	bool host_accessible;    /* the daemon's threads may read and write it      */
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
	/* 0, or -EINVAL (params), -ENOMEM, -ENODEV (node absent) with why set. */
	int (*region_alloc)(const struct backend_params *p, struct backend_region *out,
			    char *why, size_t whylen);
	/* Accepts a zeroed (never allocated) region. */
	void (*region_free)(struct backend_region *r);
	void (*stats)(const struct backend_region *r, struct backend_stats *out);
};

extern const struct backend_ops backend_host;

/* The backend called `name` ("host"), or NULL. */
const struct backend_ops *backend_find(const char *name);

#endif
