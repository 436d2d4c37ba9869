/* kvfix.c — see kvfix.h. */
#include "kvfix.h"

#include "kvpersist.h"
#include "persist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const struct backend_ops *kvfix_backend;

/* Everything on f->dir (which exists). */
static void kvfix_up(struct kvfix *f)
{
	char err[CONFIG_ERR_MAX] = "", why[512] = "";
	const uint64_t pool_bytes = f->pool_bytes;
	const uint32_t page_bytes = f->page_bytes;
	struct pool_params pp = { .bytes = pool_bytes, .page_bytes = page_bytes, .numa_node = -1,
				  .backend = kvfix_backend };
	struct spill_params sp = { .dir = f->dir, .bytes = f->spill_slots * (SPILL_HDR_BYTES + page_bytes),
				   .page_bytes = page_bytes, .allow_fallback = true };

	if (config_load_string(&f->cfg, "t.conf", f->conf, err, sizeof(err)) != 0)
		goto fail;
	f->cfg.pool_bytes = pool_bytes; /* budgets are checked against the real pool */
	f->cfg.page_bytes = page_bytes;
	if (tenant_table_new(&f->tt, &f->cfg) < 0 || pool_new(&f->pool, &pp, why, sizeof(why)) < 0 ||
	    !(f->cache = tq_cache_new()) || kvstore_new(&f->ks, f->pool, f->cache) < 0 ||
	    session_table_new(&f->st, 16, kvstore_release, f->ks) < 0)
		goto fail;
	session_table_set_ending(f->st, kvstore_ending); /* as tqkvd does */
	if (!pool_host_accessible(f->pool)) { /* as tqkvd's start_spill does */
		sp.page_copy = pool_spill_copy;
		sp.pin_staging = pool_spill_pin;
		sp.unpin_staging = pool_spill_unpin;
		sp.copy_ctx = f->pool;
	}
	if (spill_open(&f->sp, &sp, why, sizeof(why)) < 0)
		goto fail;
	kvstore_set_spill(f->ks, f->sp);
	return;
fail:
	fprintf(stderr, "setup failed: %s %s\n", err, why);
	exit(1);
}

void kvfix_start(struct kvfix *f, const char *conf, uint64_t pool_bytes, uint32_t page_bytes,
		 uint64_t spill_slots)
{
	memset(f, 0, sizeof(*f));
	snprintf(f->dir, sizeof(f->dir), "/tmp/tq-kvfix-XXXXXX");
	f->conf = conf;
	f->pool_bytes = pool_bytes;
	f->page_bytes = page_bytes;
	f->spill_slots = spill_slots;
	if (!mkdtemp(f->dir)) {
		fprintf(stderr, "setup failed: %s: cannot create\n", f->dir);
		exit(1);
	}
	kvfix_up(f);
}

static void kvfix_down(struct kvfix *f)
{
	session_table_free(f->st);
	kvstore_persist_close(f->ks);
	kvstore_free(f->ks);
	spill_close(f->sp);
	tq_cache_free(f->cache);
	pool_free(f->pool);
	tenant_table_free(f->tt);
}

void kvfix_restart(struct kvfix *f)
{
	kvfix_down(f);
	kvfix_up(f);
}

void kvfix_stop(struct kvfix *f)
{
	char path[128];

	kvfix_down(f);
	snprintf(path, sizeof(path), "%s/%s", f->dir, SPILL_FILE);
	unlink(path);
	snprintf(path, sizeof(path), "%s/%s", f->dir, PERSIST_SUBDIR);
	rmdir(path); /* persistent sessions' files are gone with them */
	rmdir(f->dir);
}
