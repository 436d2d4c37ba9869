/* reclaim.c — the reclaimer (see reclaim.h). */
#include "reclaim.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dataop.h"
#include "log.h"
#include "pool.h"
#include "session.h"
#include "tenant.h"
#include "tq_size.h"

struct reclaim {
	struct pool *pool;
	struct tenant_table *tt;
	struct session_table *st;
	struct kvstore *ks;

	pthread_mutex_t lock;     /* everything below */
	pthread_cond_t cond;
	struct reclaim_params p;
	bool kicked, stop, no_tier_said;
	struct reclaim_stats stats;
	pthread_t thread;

	pthread_mutex_t pass_lock; /* one pass at a time */
};

static int check_params(const struct reclaim_params *p, char *why, size_t whylen)
{
	if (p->high_pct < 1 || p->high_pct > 100 || p->low_pct >= p->high_pct) {
		snprintf(why, whylen, "pool watermarks: low %u%% and high %u%% (need 0 <= low < high <= 100)",
			 p->low_pct, p->high_pct);
		return -EINVAL;
	}
	return 0;
}

/* Pool use in bytes, and the pool's size. */
static uint64_t pool_used(struct reclaim *rc, uint64_t *total)
{
	struct pool_stats ps;

	pool_stats(rc->pool, &ps);
	*total = (uint64_t)ps.pages_total * ps.page_bytes;
	return (uint64_t)(ps.pages_total - ps.pages_free) * ps.page_bytes;
}

static int by_last_access(const void *a, const void *b)
{
	const struct session_info *x = a, *y = b;
	return x->last_access_ms < y->last_access_ms ? -1 : x->last_access_ms > y->last_access_ms;
}

/* Spill up to `want` bytes of tenant t, least recently used sessions
 * first; returns what was spilled.  reason: for the log. */
static uint64_t spill_tenant(struct reclaim *rc, struct tenant *t, uint64_t want, const char *reason)
{
	struct session_info *si = NULL;
	size_t n = 0;
	uint64_t got = 0;
	uint32_t page = pool_page_bytes(rc->pool);
	char why[512], b1[32], b2[32];

	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;

	want -= want % page; /* whole pages: never below what the caller allows */
	if (!want || session_list(rc->st, t, &si, &n) < 0)
		return 0;
	qsort(si, n, sizeof(*si), by_last_access);
	for (size_t i = 0; i < n && got < want; i++) {
		struct session *s;
		uint64_t done = 0, take = want - got;
		if (si[i].state != SESSION_OPEN || !si[i].resident_bytes)
			continue;
		if (take > si[i].resident_bytes)
			take = si[i].resident_bytes;
		if (session_acquire(rc->st, si[i].id, 0, &s) < 0)
			continue; /* gone meanwhile */
		int e = dataop_spill(rc->ks, s, take, &done, why, sizeof(why));
		session_release(s);
		pthread_mutex_lock(&rc->lock);
		if (e == -EOPNOTSUPP) {
			bool said = rc->no_tier_said;
			rc->no_tier_said = true;
			pthread_mutex_unlock(&rc->lock);
			if (!said)
				log_warning("reclaim: %s; tenant '%s' %s, but nothing can be spilled", why,
					    tenant_name(t), reason);
			break;
		}
		rc->stats.decisions++;
		rc->stats.spilled_bytes += done;
		rc->stats.failures += e < 0;
		pthread_mutex_unlock(&rc->lock);
		got += done;
		tq_size_format_human(done, b1, sizeof(b1));
		tq_size_format_human(si[i].resident_bytes, b2, sizeof(b2));
		if (e < 0)
			log_warning("reclaim: tenant '%s' session %" PRIu64 ": spilled %s of %s resident, then failed: %s "
				    "(%s)", tenant_name(t), si[i].id, b1, b2, why, reason);
		else
			log_info("reclaim: tenant '%s' session %" PRIu64 " (idle %" PRIu64 " ms): spilled %s of %s "
				 "resident (%s)", tenant_name(t), si[i].id, now > si[i].last_access_ms ?
				 now - si[i].last_access_ms : 0, b1, b2, reason);
	}
	free(si);
	return got;
}

struct cand {
	struct tenant *t;
	int32_t priority;
	uint64_t excess;
};

static int by_priority(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->priority != y->priority)
		return x->priority < y->priority ? -1 : 1;
	return x->excess > y->excess ? -1 : x->excess < y->excess;
}

uint64_t reclaim_pass(struct reclaim *rc)
{
	uint32_t nt = tenant_count(rc->tt);
	struct cand *c = calloc(nt ? nt : 1, sizeof(*c));
	uint64_t spilled = 0, total, used;
	struct reclaim_params p;
	char reason[256], b1[32], b2[32];

	if (!c)
		return 0;
	pthread_mutex_lock(&rc->pass_lock);
	pthread_mutex_lock(&rc->lock);
	p = rc->p;
	pthread_mutex_unlock(&rc->lock);

	/* 1. tenants above their limit come down to it */
	for (uint32_t i = 0; i < nt; i++) {
		struct tenant_info ti;
		tenant_get_info(tenant_at(rc->tt, i), &ti);
		if (ti.used <= ti.limit)
			continue;
		tq_size_format_human(ti.used, b1, sizeof(b1));
		tq_size_format_human(ti.limit, b2, sizeof(b2));
		snprintf(reason, sizeof(reason), "the tenant holds %s, above its limit of %s", b1, b2);
		spilled += spill_tenant(rc, tenant_at(rc->tt, i), ti.used - ti.limit, reason);
	}

	/* 2. above the high mark: down to the low mark, from the tenants
	 * above their guarantee, lowest priority first */
	used = pool_used(rc, &total);
	if (total && used * 100 > total * p.high_pct) {
		uint64_t target = used - total * p.low_pct / 100, n = 0;
		for (uint32_t i = 0; i < nt; i++) {
			struct tenant_info ti;
			tenant_get_info(tenant_at(rc->tt, i), &ti);
			if (ti.used > ti.guaranteed)
				c[n++] = (struct cand){ tenant_at(rc->tt, i), ti.priority, ti.used - ti.guaranteed };
		}
		qsort(c, n, sizeof(*c), by_priority);
		for (uint64_t k = 0; k < n && target; k++) {
			uint64_t take = c[k].excess < target ? c[k].excess : target;
			tq_size_format_human(c[k].excess, b1, sizeof(b1));
			snprintf(reason, sizeof(reason), "pool %" PRIu64 "%% used, above the %u%% mark; the tenant "
				 "(priority %d) is %s above its guarantee", used * 100 / total, p.high_pct,
				 c[k].priority, b1);
			uint64_t got = spill_tenant(rc, c[k].t, take, reason);
			target -= got < target ? got : target;
			spilled += got;
		}
	}
	pthread_mutex_lock(&rc->lock);
	rc->stats.passes += spilled != 0;
	pthread_mutex_unlock(&rc->lock);
	pthread_mutex_unlock(&rc->pass_lock);
	free(c);
	return spilled;
}

static bool above_low(struct reclaim *rc)
{
	uint64_t total, used = pool_used(rc, &total);
	uint32_t low;

	pthread_mutex_lock(&rc->lock);
	low = rc->p.low_pct;
	pthread_mutex_unlock(&rc->lock);
	return total && used * 100 > total * low;
}

static void *reclaim_main(void *arg)
{
	struct reclaim *rc = arg;

	pthread_mutex_lock(&rc->lock);
	while (!rc->stop) {
		if (!rc->kicked) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			pthread_cond_timedwait(&rc->cond, &rc->lock, &ts);
		}
		rc->kicked = false;
		if (rc->stop)
			break;
		pthread_mutex_unlock(&rc->lock);
		/* once started, keep going to the low mark while passes help */
		while (reclaim_pass(rc) && above_low(rc)) {
		}
		pthread_mutex_lock(&rc->lock);
	}
	pthread_mutex_unlock(&rc->lock);
	return NULL;
}

int reclaim_start(struct reclaim **out, struct pool *pool, struct tenant_table *tt, struct session_table *st,
		  struct kvstore *ks, const struct reclaim_params *p, char *why, size_t whylen)
{
	struct reclaim *rc;
	int r;

	*out = NULL;
	if ((r = check_params(p, why, whylen)) < 0)
		return r;
	if (!(rc = calloc(1, sizeof(*rc)))) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	rc->pool = pool;
	rc->tt = tt;
	rc->st = st;
	rc->ks = ks;
	rc->p = *p;
	pthread_mutex_init(&rc->lock, NULL);
	pthread_mutex_init(&rc->pass_lock, NULL);
	pthread_cond_init(&rc->cond, NULL);
	if ((r = pthread_create(&rc->thread, NULL, reclaim_main, rc)) != 0) {
		snprintf(why, whylen, "reclaim: cannot start its thread: %s", strerror(r));
		pthread_mutex_destroy(&rc->lock);
		pthread_mutex_destroy(&rc->pass_lock);
		pthread_cond_destroy(&rc->cond);
		free(rc);
		return -r;
	}
	*out = rc;
	return 0;
}

void reclaim_stop(struct reclaim *rc)
{
	if (!rc)
		return;
	pthread_mutex_lock(&rc->lock);
	rc->stop = true;
	pthread_cond_signal(&rc->cond);
	pthread_mutex_unlock(&rc->lock);
	pthread_join(rc->thread, NULL);
	pthread_mutex_destroy(&rc->lock);
	pthread_mutex_destroy(&rc->pass_lock);
	pthread_cond_destroy(&rc->cond);
	free(rc);
}

int reclaim_set_params(struct reclaim *rc, const struct reclaim_params *p, char *why, size_t whylen)
{
	int r = check_params(p, why, whylen);

	if (r < 0)
		return r;
	pthread_mutex_lock(&rc->lock);
	rc->p = *p;
	rc->kicked = true;
	pthread_cond_signal(&rc->cond);
	pthread_mutex_unlock(&rc->lock);
	return 0;
}

void reclaim_kick(struct reclaim *rc)
{
	pthread_mutex_lock(&rc->lock);
	rc->kicked = true;
	pthread_cond_signal(&rc->cond);
	pthread_mutex_unlock(&rc->lock);
}

void reclaim_stats(struct reclaim *rc, struct reclaim_stats *out)
{
	pthread_mutex_lock(&rc->lock);
	*out = rc->stats;
	pthread_mutex_unlock(&rc->lock);
}
