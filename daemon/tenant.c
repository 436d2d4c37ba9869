#include "tenant.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "tq_attn.h"
#include "tq_size.h"

struct tenant {
	char name[CONFIG_NAME_MAX];
	uint64_t used;                  /* atomic: bytes charged           */
	uint64_t spilled;               /* atomic: its sessions' bytes in the spill tier */
	uint64_t spilling;              /* atomic: of `used`, bytes the reclaimer is writing out */
	uint64_t limit;                 /* atomic: read by every charge    */
	uint32_t sessions;              /* atomic                          */
	struct tenant_pressure pr;      /* atomic, each field              */
	float sparse_v;                 /* atomic                          */
	struct tq_attn_stats sv;        /* atomic, each field: the kernels add */
	pthread_mutex_t lock;           /* guards the fields below         */
	uint64_t guaranteed;
	int32_t priority;
	bool any_uid;
	uint32_t n_uids, n_gids;
	uint32_t uids[CONFIG_MAX_IDS];
	uint32_t gids[CONFIG_MAX_IDS];
};

struct tenant_table {
	uint64_t pool_bytes;
	uint64_t page_bytes;            /* guarantees are honoured in whole pages */
	pthread_mutex_t budget_lock;    /* serializes budget changes (sum of guarantees) */
	uint32_t n;
	struct tenant t[];              /* [n] */
};

static void tenant_load(struct tenant *t, const struct tenant_conf *tc)
{
	pthread_mutex_lock(&t->lock);
	__atomic_store_n(&t->limit, tc->limit, __ATOMIC_RELAXED);
	float sv = tc->sparse_v;
	__atomic_store(&t->sparse_v, &sv, __ATOMIC_RELAXED);
	t->guaranteed = tc->guaranteed;
	t->priority = tc->priority;
	t->any_uid = tc->any_uid;
	t->n_uids = tc->n_uids;
	t->n_gids = tc->n_gids;
	memcpy(t->uids, tc->uids, sizeof(t->uids));
	memcpy(t->gids, tc->gids, sizeof(t->gids));
	pthread_mutex_unlock(&t->lock);
}

int tenant_table_new(struct tenant_table **out, const struct config *cfg)
{
	struct tenant_table *tt;

	*out = NULL;
	if (cfg->n_tenants == 0 || cfg->n_tenants > CONFIG_MAX_TENANTS)
		return -EINVAL;
	tt = calloc(1, sizeof(*tt) + cfg->n_tenants * sizeof(struct tenant));
	if (!tt)
		return -ENOMEM;
	tt->pool_bytes = cfg->pool_bytes;
	tt->page_bytes = cfg->page_bytes;
	tt->n = cfg->n_tenants;
	pthread_mutex_init(&tt->budget_lock, NULL);
	for (uint32_t i = 0; i < tt->n; i++) {
		pthread_mutex_init(&tt->t[i].lock, NULL);
		memcpy(tt->t[i].name, cfg->tenant[i].name, sizeof(tt->t[i].name));
		tenant_load(&tt->t[i], &cfg->tenant[i]);
	}
	*out = tt;
	return 0;
}

void tenant_table_free(struct tenant_table *tt)
{
	if (!tt)
		return;
	for (uint32_t i = 0; i < tt->n; i++)
		pthread_mutex_destroy(&tt->t[i].lock);
	pthread_mutex_destroy(&tt->budget_lock);
	free(tt);
}

void tenant_table_apply(struct tenant_table *tt, const struct config *cfg)
{
	pthread_mutex_lock(&tt->budget_lock);
	for (uint32_t i = 0; i < tt->n; i++) {
		const struct tenant_conf *tc = config_tenant(cfg, tt->t[i].name);
		if (tc)
			tenant_load(&tt->t[i], tc);
	}
	pthread_mutex_unlock(&tt->budget_lock);
}

uint32_t tenant_count(const struct tenant_table *tt)
{
	return tt->n;
}

struct tenant *tenant_at(struct tenant_table *tt, uint32_t i)
{
	return i < tt->n ? &tt->t[i] : NULL;
}

struct tenant *tenant_find(struct tenant_table *tt, const char *name)
{
	for (uint32_t i = 0; i < tt->n; i++)
		if (strcmp(tt->t[i].name, name) == 0)
			return &tt->t[i];
	return NULL;
}

const char *tenant_name(const struct tenant *t)
{
	return t->name;
}

void tenant_get_info(struct tenant *t, struct tenant_info *out)
{
	memset(out, 0, sizeof(*out));
	memcpy(out->name, t->name, sizeof(out->name));
	pthread_mutex_lock(&t->lock);
	out->guaranteed = t->guaranteed;
	out->limit = __atomic_load_n(&t->limit, __ATOMIC_RELAXED);
	out->priority = t->priority;
	out->any_uid = t->any_uid;
	out->n_uids = t->n_uids;
	out->n_gids = t->n_gids;
	memcpy(out->uids, t->uids, sizeof(out->uids));
	memcpy(out->gids, t->gids, sizeof(out->gids));
	pthread_mutex_unlock(&t->lock);
	/* spilling before used: a spill done meanwhile uncharges, then
	 * releases its spilling (tenant_spilling_add); one whose smaller
	 * spilling is seen here is seen uncharged too, so used - spilling
	 * never counts the same bytes as neither (the reclaimer's takable) */
	out->spilling = __atomic_load_n(&t->spilling, __ATOMIC_ACQUIRE);
	out->used = tenant_used(t);
	out->spilled = __atomic_load_n(&t->spilled, __ATOMIC_RELAXED);
	out->sessions = __atomic_load_n(&t->sessions, __ATOMIC_RELAXED);
	out->sparse_v = tenant_sparse_v(t);
	out->v_chunks = __atomic_load_n(&t->sv.v_chunks, __ATOMIC_RELAXED);
	out->v_skipped = __atomic_load_n(&t->sv.v_skipped, __ATOMIC_RELAXED);
	out->pressure.spilled_bytes = __atomic_load_n(&t->pr.spilled_bytes, __ATOMIC_RELAXED);
	out->pressure.restored_bytes = __atomic_load_n(&t->pr.restored_bytes, __ATOMIC_RELAXED);
	out->pressure.waits = __atomic_load_n(&t->pr.waits, __ATOMIC_RELAXED);
	out->pressure.wait_us = __atomic_load_n(&t->pr.wait_us, __ATOMIC_RELAXED);
	out->pressure.wait_max_us = __atomic_load_n(&t->pr.wait_max_us, __ATOMIC_RELAXED);
	out->pressure.refusals = __atomic_load_n(&t->pr.refusals, __ATOMIC_RELAXED);
	out->pressure.evictions = __atomic_load_n(&t->pr.evictions, __ATOMIC_RELAXED);
	out->pressure.limit_refusals = __atomic_load_n(&t->pr.limit_refusals, __ATOMIC_RELAXED);
}

uint64_t tenant_guaranteed(struct tenant *t)
{
	pthread_mutex_lock(&t->lock);
	uint64_t g = t->guaranteed;
	pthread_mutex_unlock(&t->lock);
	return g;
}

int32_t tenant_priority(struct tenant *t)
{
	pthread_mutex_lock(&t->lock);
	int32_t p = t->priority;
	pthread_mutex_unlock(&t->lock);
	return p;
}

float tenant_sparse_v(struct tenant *t)
{
	float v;

	__atomic_load(&t->sparse_v, &v, __ATOMIC_RELAXED);
	return v;
}

struct tq_attn_stats *tenant_attn_stats(struct tenant *t)
{
	return &t->sv;
}

void tenant_note(struct tenant *t, enum tenant_counter c, uint64_t v)
{
	uint64_t *f = NULL;

	switch (c) {
	case TENANT_SPILLED: f = &t->pr.spilled_bytes; break;
	case TENANT_RESTORED: f = &t->pr.restored_bytes; break;
	case TENANT_REFUSALS: f = &t->pr.refusals; break;
	case TENANT_EVICTIONS: f = &t->pr.evictions; break;
	case TENANT_LIMIT_REFUSALS: f = &t->pr.limit_refusals; break;
	}
	assert(f && "tenant_note: unknown counter");
	if (f)
		__atomic_add_fetch(f, v, __ATOMIC_RELAXED);
}

void tenant_note_wait(struct tenant *t, uint64_t us)
{
	uint64_t max = __atomic_load_n(&t->pr.wait_max_us, __ATOMIC_RELAXED);

	__atomic_add_fetch(&t->pr.waits, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&t->pr.wait_us, us, __ATOMIC_RELAXED);
	while (us > max && !__atomic_compare_exchange_n(&t->pr.wait_max_us, &max, us, true, __ATOMIC_RELAXED,
							 __ATOMIC_RELAXED)) {
	}
}

uint64_t tenant_table_used(struct tenant_table *tt)
{
	uint64_t sum = 0;

	for (uint32_t i = 0; i < tt->n; i++)
		sum += tenant_used(&tt->t[i]);
	return sum;
}

int tenant_charge(struct tenant *t, uint64_t bytes)
{
	uint64_t cur = __atomic_load_n(&t->used, __ATOMIC_RELAXED);

	for (;;) {
		uint64_t limit = __atomic_load_n(&t->limit, __ATOMIC_RELAXED);
		if (bytes > limit || cur > limit - bytes)
			return -ENOSPC;
		if (__atomic_compare_exchange_n(&t->used, &cur, cur + bytes, true,
						__ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			return 0;
	}
}

void tenant_uncharge(struct tenant *t, uint64_t bytes)
{
	uint64_t old = __atomic_fetch_sub(&t->used, bytes, __ATOMIC_ACQ_REL);

	assert(old >= bytes && "uncharged more than was charged");
	(void)old;
}

void tenant_spilled_add(struct tenant *t, int64_t delta)
{
	uint64_t old = __atomic_fetch_add(&t->spilled, (uint64_t)delta, __ATOMIC_RELAXED);

	assert((delta >= 0 || old >= (uint64_t)-delta) && "tenant spilled bytes below zero");
	(void)old;
}

void tenant_spilling_add(struct tenant *t, int64_t delta)
{
	/* release: what the spill uncharged before is seen with it */
	uint64_t old = __atomic_fetch_add(&t->spilling, (uint64_t)delta, __ATOMIC_ACQ_REL);

	assert((delta >= 0 || old >= (uint64_t)-delta) && "tenant spilling bytes below zero");
	(void)old;
}

uint64_t tenant_spilling(const struct tenant *t)
{
	return __atomic_load_n(&t->spilling, __ATOMIC_ACQUIRE);
}

uint64_t tenant_used(const struct tenant *t)
{
	return __atomic_load_n(&t->used, __ATOMIC_RELAXED);
}

uint64_t tenant_limit(const struct tenant *t)
{
	return __atomic_load_n(&t->limit, __ATOMIC_RELAXED);
}

void tenant_session_add(struct tenant *t, int delta)
{
	__atomic_add_fetch(&t->sessions, (uint32_t)delta, __ATOMIC_RELAXED);
}

int tenant_set_budget(struct tenant_table *tt, struct tenant *t, bool set_limit, uint64_t limit,
		      bool set_guaranteed, uint64_t guaranteed, char *why, size_t whylen)
{
	char b1[32], b2[32], b3[32];
	int r = 0;

	pthread_mutex_lock(&tt->budget_lock);
	pthread_mutex_lock(&t->lock);
	if (!set_limit)
		limit = __atomic_load_n(&t->limit, __ATOMIC_RELAXED);
	if (!set_guaranteed)
		guaranteed = t->guaranteed;
	tq_size_format_human(limit, b1, sizeof(b1));
	tq_size_format_human(guaranteed, b2, sizeof(b2));
	tq_size_format_human(tt->pool_bytes, b3, sizeof(b3));
	if (limit < (1u << 20) || limit > tt->pool_bytes || guaranteed > limit) {
		if (why && guaranteed > limit)
			snprintf(why, whylen, "the guarantee (%s) would exceed the limit (%s)", b2, b1);
		else if (why)
			snprintf(why, whylen, "the limit (%s) must be in [1 MiB, the pool's %s]", b1, b3);
		r = -EINVAL;
		goto fail;
	}
	uint64_t sum = guaranteed, pages = config_pages_ceil(guaranteed, tt->page_bytes);
	for (uint32_t i = 0; i < tt->n; i++)
		if (&tt->t[i] != t) { /* stable: every writer holds budget_lock */
			sum += tt->t[i].guaranteed;
			pages += config_pages_ceil(tt->t[i].guaranteed, tt->page_bytes);
		}
	if (sum > tt->pool_bytes || (tt->page_bytes && pages > tt->pool_bytes / tt->page_bytes)) {
		if (why) {
			char b4[32];
			tq_size_format_human(sum - guaranteed, b1, sizeof(b1));
			tq_size_format_human(tt->page_bytes, b4, sizeof(b4));
			if (sum > tt->pool_bytes)
				snprintf(why, whylen, "the other tenants' guarantees (%s) and this one (%s) would exceed "
					 "the pool (%s)", b1, b2, b3);
			else /* pages are charged whole (config_pages_ceil) */
				snprintf(why, whylen, "the other tenants' guarantees (%s) and this one (%s) need %" PRIu64
					 " pages of %s, each rounded up to whole pages as they are charged, and the pool "
					 "(%s) holds %" PRIu64 ": make the guarantee a multiple of the page size", b1, b2,
					 pages, b4, b3, tt->pool_bytes / tt->page_bytes);
		}
		r = -ENOSPC;
		goto fail;
	}
	__atomic_store_n(&t->limit, limit, __ATOMIC_RELAXED);
	t->guaranteed = guaranteed;
fail:
	pthread_mutex_unlock(&t->lock);
	pthread_mutex_unlock(&tt->budget_lock);
	return r;
}

int tenant_allows(struct tenant *t, uid_t uid, gid_t gid, const gid_t *groups, int n_groups)
{
	int ok = 0;

	pthread_mutex_lock(&t->lock);
	if (t->any_uid)
		ok = 1;
	for (uint32_t i = 0; !ok && i < t->n_uids; i++)
		ok = t->uids[i] == (uint32_t)uid;
	for (uint32_t i = 0; !ok && i < t->n_gids; i++) {
		ok = t->gids[i] == (uint32_t)gid;
		for (int j = 0; !ok && j < n_groups; j++)
			ok = t->gids[i] == (uint32_t)groups[j];
	}
	pthread_mutex_unlock(&t->lock);
	return ok;
}
