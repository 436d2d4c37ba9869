/* backend_host.c — host DRAM: anonymous mmap, transparent huge pages,
 * NUMA placement through libnuma. */
#include "backend.h"

#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_2M ((uint64_t)2 << 20)

static int host_alloc(const struct backend_params *p, struct backend_region *out,
		      char *why, size_t whylen)
{
	uint64_t bytes, map_bytes;
	uint8_t *raw = MAP_FAILED, *base;
	int r;

	memset(out, 0, sizeof(*out));
	out->numa_node = -1;
	if (p->bytes == 0 || p->bytes > ((uint64_t)1 << 56)) {
		snprintf(why, whylen, "region size %llu is out of range", (unsigned long long)p->bytes);
		return -EINVAL;
	}
	/* Whole 2 MiB units, 2 MiB aligned, so THP can back every byte. */
	bytes = (p->bytes + HUGE_2M - 1) & ~(HUGE_2M - 1);
	map_bytes = bytes + HUGE_2M;
	raw = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (raw == MAP_FAILED) {
		r = -errno;
		snprintf(why, whylen, "mmap of %llu bytes: %s", (unsigned long long)map_bytes, strerror(errno));
		goto fail;
	}
	base = (uint8_t *)(((uintptr_t)raw + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1));
	if (base > raw)
		munmap(raw, (size_t)(base - raw));
	if (raw + map_bytes > base + bytes)
		munmap(base + bytes, (size_t)(raw + map_bytes - (base + bytes)));
	raw = MAP_FAILED;
	out->base = base;
	out->bytes = bytes;
	out->host_accessible = true;
	snprintf(out->desc, sizeof(out->desc), "host memory");

	if (p->hugepages && madvise(base, bytes, MADV_HUGEPAGE) == 0)
		out->hugepages = true; /* EINVAL: THP not built in; the pool still works */

	if (p->numa_node >= 0) {
		if (numa_available() < 0) {
			snprintf(why, whylen, "numa_node %d requested but NUMA is not available",
				 p->numa_node);
			r = -ENODEV;
			goto fail;
		}
		if (p->numa_node > numa_max_node()) {
			snprintf(why, whylen, "numa_node %d does not exist (highest is %d)",
				 p->numa_node, numa_max_node());
			r = -ENODEV;
			goto fail;
		}
		/* Strict binding (mbind MPOL_BIND): pages fault in on that node. */
		numa_tonode_memory(base, bytes, p->numa_node);
		out->numa_node = p->numa_node;
	}
	return 0;
fail:
	if (raw != MAP_FAILED)
		munmap(raw, map_bytes);
	if (out->base)
		munmap(out->base, out->bytes);
	memset(out, 0, sizeof(*out));
	out->numa_node = -1;
	return r;
}

static void host_free(struct backend_region *r)
{
	if (r->base)
		munmap(r->base, r->bytes);
	memset(r, 0, sizeof(*r));
	r->numa_node = -1;
}

static void host_stats(const struct backend_region *r, struct backend_stats *out)
{
	long pg = sysconf(_SC_PAGESIZE);
	unsigned char vec[4096];
	uint64_t resident = 0;

	memset(out, 0, sizeof(*out));
	out->bytes = r->bytes;
	out->numa_node = r->numa_node;
	out->hugepages = r->hugepages;
	if (!r->base || pg <= 0)
		return;
	/* mincore in chunks of 4096 base pages */
	for (uint64_t off = 0; off < r->bytes; off += (uint64_t)pg * sizeof(vec)) {
		uint64_t len = r->bytes - off;
		if (len > (uint64_t)pg * sizeof(vec))
			len = (uint64_t)pg * sizeof(vec);
		if (mincore(r->base + off, len, vec) < 0)
			return;
		for (uint64_t i = 0; i < (len + (uint64_t)pg - 1) / (uint64_t)pg; i++)
			resident += vec[i] & 1;
	}
	out->resident_bytes = resident * (uint64_t)pg;
}

const struct backend_ops backend_host = {
	.name = "host",
	.region_alloc = host_alloc,
	.region_free = host_free,
	.stats = host_stats,
};
