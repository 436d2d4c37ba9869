/* tenant.h — tenants and their memory accounting.
 *
 * A tenant is a budget from the config: `limit` bytes at most, `guaranteed`
 * bytes never taken away under pressure, a priority and the uids/gids that
 * may open sessions in it.  The data path charges every byte it admits
 * (tenant_charge) before doing the work and uncharges what it frees.
 *
 * Thread-safe.  Tenants live as long as their table: the set is fixed at
 * start (a reload changes budgets, never the set), so a struct tenant *
 * needs no reference count.  Accounting is lock-free (atomics); budget
 * and access-list changes take the tenant's lock.
 */
#ifndef TQKVD_TENANT_H
#define TQKVD_TENANT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"

struct tenant;
struct tenant_table;

/* What memory pressure did to a tenant, since start (monotonic). */
struct tenant_pressure {
	uint64_t spilled_bytes;       /* pages written out to the spill tier            */
	uint64_t restored_bytes;      /* pages read back                                */
	uint64_t waits;               /* allocations that waited for memory (pool, limit) */
	uint64_t wait_us;             /* time they waited, all together                 */
	uint64_t wait_max_us;         /* the longest one                                */
	uint64_t refusals;            /* allocations refused on a full pool (POOL_FULL) */
	uint64_t evictions;           /* its sessions evicted by pressure               */
	uint64_t limit_refusals;      /* charges refused at its limit (TENANT_LIMIT)    */
};
enum tenant_counter {
	TENANT_SPILLED, TENANT_RESTORED, TENANT_REFUSALS, TENANT_EVICTIONS, TENANT_LIMIT_REFUSALS,
};

/* A consistent snapshot of one tenant. */
struct tenant_info {
	char name[CONFIG_NAME_MAX];
	uint64_t guaranteed;
	uint64_t limit;
	int32_t priority;
	uint64_t used;                /* pool bytes charged (resident pages) */
	uint64_t spilled;             /* its sessions' bytes in the spill tier (not charged) */
	uint64_t spilling;            /* of used, bytes being spilled now (the reclaimer's) */
	uint32_t sessions;
	struct tenant_pressure pressure;
	float sparse_v;               /* its sessions' sparse-V threshold (config) */
	uint64_t v_chunks;            /* value chunks its CPU attention reached    */
	uint64_t v_skipped;           /* of them, skipped by sparse-V              */
	bool any_uid;
	uint32_t n_uids, n_gids;
	uint32_t uids[CONFIG_MAX_IDS];
	uint32_t gids[CONFIG_MAX_IDS];
};

/* One tenant per cfg->tenant[]; pool_bytes bounds later budget changes. */
int tenant_table_new(struct tenant_table **out, const struct config *cfg);
void tenant_table_free(struct tenant_table *tt);
/* Budgets, priorities and access lists from a reloaded config; tenants
 * not in the table are ignored (config_apply_reload reports them). */
void tenant_table_apply(struct tenant_table *tt, const struct config *cfg);

uint32_t tenant_count(const struct tenant_table *tt);
struct tenant *tenant_at(struct tenant_table *tt, uint32_t i);   /* NULL past the end */
struct tenant *tenant_find(struct tenant_table *tt, const char *name);
const char *tenant_name(const struct tenant *t);
void tenant_get_info(struct tenant *t, struct tenant_info *out);
/* Bytes charged to all tenants together. */
uint64_t tenant_table_used(struct tenant_table *tt);

/* Charge `bytes` if used + bytes stays within the limit: 0, or -ENOSPC
 * (nothing charged).  Uncharging more than is charged is a bug. */
int tenant_charge(struct tenant *t, uint64_t bytes);
void tenant_uncharge(struct tenant *t, uint64_t bytes);
uint64_t tenant_used(const struct tenant *t);
/* Bytes of the tenant's sessions in the spill tier (session.c keeps it). */
void tenant_spilled_add(struct tenant *t, int64_t delta);
/* The reclaimer's writes in flight: bytes of `used` about to go, which
 * another spill pass must not count as the tenant's to give up again. */
void tenant_spilling_add(struct tenant *t, int64_t delta);
uint64_t tenant_spilling(const struct tenant *t);
uint64_t tenant_limit(const struct tenant *t);
uint64_t tenant_guaranteed(struct tenant *t);
int32_t tenant_priority(struct tenant *t);

/* tenant.sparse_v of the config (reloads change it), and the counters
 * the CPU attention kernels add to for its sessions (tq_attn_params.stats). */
struct tq_attn_stats;
float tenant_sparse_v(struct tenant *t);
struct tq_attn_stats *tenant_attn_stats(struct tenant *t);

/* Pressure counters (any thread). */
void tenant_note(struct tenant *t, enum tenant_counter c, uint64_t v);
void tenant_note_wait(struct tenant *t, uint64_t us);

/* Session counting (the session table keeps it). */
void tenant_session_add(struct tenant *t, int delta);

/* New budget.  set_* = false keeps that value.  -EINVAL when guaranteed >
 * limit, limit < 1 MiB or limit > pool_bytes; -ENOSPC when the guarantees
 * of all tenants would exceed pool_bytes.  why (may be NULL) says which.
 * A limit below the current usage is accepted: new charges fail until
 * usage drops under it (the reclaimer spills the tenant down to it). */
int tenant_set_budget(struct tenant_table *tt, struct tenant *t, bool set_limit, uint64_t limit,
		      bool set_guaranteed, uint64_t guaranteed, char *why, size_t whylen);

/* 1 if uid (primary gid, supplementary groups) may use the tenant, else 0. */
int tenant_allows(struct tenant *t, uid_t uid, gid_t gid, const gid_t *groups, int n_groups);

#endif
