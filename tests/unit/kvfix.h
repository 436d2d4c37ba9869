/* kvfix.h — the data path in-process, for unit tests: a config's tenants,
 * a host pool, the page tables and a spill store in a fresh temporary
 * directory (io_uring, or pread/pwrite where it is missing). */
#ifndef TQKVD_TEST_KVFIX_H
#define TQKVD_TEST_KVFIX_H

#include <stdint.h>

#include "config.h"
#include "dataop.h"
#include "pool.h"
#include "session.h"
#include "spill.h"
#include "tenant.h"
#include "tq_codec.h"

struct kvfix {
	char dir[64];
	struct config cfg;
	struct tenant_table *tt;
	struct pool *pool;
	tq_cache *cache;
	struct kvstore *ks;
	struct session_table *st;
	struct spill *sp;
	/* what kvfix_start was given (kvfix_restart starts the same again) */
	const char *conf;
	uint64_t pool_bytes, spill_slots;
	uint32_t page_bytes;
};

/* conf: the config text; pool_bytes: the pool's real size, which replaces
 * the config's [pool] pool_bytes (the bound of the tenants' budgets), so a
 * test may run a pool below the config's 16 MiB minimum; pages of
 * page_bytes; spill_slots slots.  Exits with the reason when anything
 * fails. */
/* The pool's backend for the next kvfix_start (NULL: host memory); with
 * one whose pages are not host memory (devsim.h) the spill store copies
 * through staging, as tqkvd sets it up for a GPU pool. */
extern const struct backend_ops *kvfix_backend;

void kvfix_start(struct kvfix *f, const char *conf, uint64_t pool_bytes, uint32_t page_bytes,
		 uint64_t spill_slots);
void kvfix_stop(struct kvfix *f);
/* A restart after a crash: everything is freed as is (persistent sessions'
 * files stay: call kvstore_persist_stop(f->ks, NULL) first) except the
 * directory and its files, then started again on them.  Persistence is
 * the caller's to open and recover again. */
void kvfix_restart(struct kvfix *f);

#endif
