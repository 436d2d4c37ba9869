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
#include <unistd.h>

#include "config.h"
#include "dataop.h"
#include "log.h"
#include "pool.h"
#include "session.h"
#include "tenant.h"
#include "tq_size.h"
#include "tqkv_ring.h"

/* Admission spills at least this many pages at a time (fewer, larger
 * writes; the background pass takes the pool the rest of the way). */
#define ADMIT_BATCH_PAGES 32u
/* A failing spill tier is reported at most this often (it is retried
 * every tick). */
#define FAIL_LOG_MS 10000u

struct reclaim {
	struct pool *pool;
	struct tenant_table *tt;
	struct session_table *st;
	struct kvstore *ks;

	pthread_mutex_t lock;     /* everything below */
	pthread_cond_t cond;
	struct reclaim_params p;
	bool kicked, stop, no_tier_said;
	uint64_t fail_logged_ms;
	struct reclaim_stats stats;
	pthread_t thread;
	bool threaded;            /* false: reclaim_start_manual */

	uint32_t kick_pending;    /* atomic: a kick is on its way (reclaim_note_alloc) */
	uint32_t high_pct;        /* atomic: p.high_pct, for reclaim_note_alloc */
	pthread_mutex_t pass_lock; /* one background pass at a time */
};

static uint64_t mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int check_params(const struct reclaim_params *p, char *why, size_t whylen)
{
	if (p->high_pct < 1 || p->high_pct > 100 || p->low_pct >= p->high_pct) {
		snprintf(why, whylen, "pool watermarks: low %u%% and high %u%% (need 0 <= low < high <= 100)",
			 p->low_pct, p->high_pct);
		return -EINVAL;
	}
	if (p->pressure_action != CONFIG_PRESSURE_FAIL && p->pressure_action != CONFIG_PRESSURE_EVICT) {
		snprintf(why, whylen, "pool.pressure_action: unknown action %d", p->pressure_action);
		return -EINVAL;
	}
	return 0;
}

static struct reclaim_params params_of(struct reclaim *rc)
{
	pthread_mutex_lock(&rc->lock);
	struct reclaim_params p = rc->p;
	pthread_mutex_unlock(&rc->lock);
	return p;
}

/* Pool use in bytes, and the pool's size. */
static uint64_t pool_used(struct reclaim *rc, uint64_t *total)
{
	uint64_t pages = pool_pages_total(rc->pool), page = pool_page_bytes(rc->pool);

	*total = pages * page;
	return (pages - pool_pages_free_count(rc->pool)) * page;
}

static int by_last_access(const void *a, const void *b)
{
	const struct session_info *x = a, *y = b;
	if (x->last_access_ms != y->last_access_ms)
		return x->last_access_ms < y->last_access_ms ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* An operation waiting for memory (reclaim_admit, reclaim_charge). */
struct waiter {
	uint64_t since_us;        /* CLOCK_MONOTONIC, > 0 */
	uint64_t id;              /* its session */
	struct tenant *t;         /* its session's tenant */
};

/* What spilling from a tenant came to. */
struct spill_res {
	uint64_t got;             /* bytes spilled                                 */
	uint32_t held;            /* of busy: open sessions an operation held       */
	uint32_t busy;            /* sessions skipped: an operation held them (or  */
	                          /* holds an evicted one's memory a while yet)    */
	uint32_t too_big;         /* sessions not evicted: more than their tenant  */
	                          /* holds above its guarantee (evict_one)         */
	uint32_t gave_way;        /* sessions not waited for: earlier waiters that */
	                          /* could take the requester's pages (gives_way;  */
	                          /* one counted once per scan)                    */
	const struct waiter *me;  /* in: the requester (NULL: the reclaimer)       */
	/* in: spills for the pool stop at what takable(from, asking, t) allows
	 * at each session (the guarantee, with other passes' writes in flight
	 * counted); spills down to a limit (guard false) do not */
	bool guard;
	struct tenant *from;
	uint64_t asking;
	int err;                  /* the first hard failure: -ENOSPC (tier full),  */
	char why[512];            /* -EIO, -EOPNOTSUPP (no tier); 0: none          */
};

/* One session's spill done: counters, log, res. */
static void spilled_one(struct reclaim *rc, struct tenant *t, const struct session_info *si, int e, uint64_t done,
			const char *why, const char *reason, uint64_t now, struct spill_res *res)
{
	char b1[32], b2[32];

	if (e < 0 && !done && !res->err) {
		res->err = e;
		snprintf(res->why, sizeof(res->why), "%s", why);
	}
	pthread_mutex_lock(&rc->lock);
	bool say_no_tier = e == -EOPNOTSUPP && !rc->no_tier_said;
	bool say_fail = e < 0 && e != -EOPNOTSUPP && now >= rc->fail_logged_ms + FAIL_LOG_MS;
	rc->no_tier_said |= e == -EOPNOTSUPP;
	if (say_fail)
		rc->fail_logged_ms = now;
	if (e != -EOPNOTSUPP) {
		rc->stats.decisions += done != 0;
		rc->stats.spilled_bytes += done;
		rc->stats.failures += e < 0;
	}
	pthread_mutex_unlock(&rc->lock);
	res->got += done;
	tq_size_format_human(done, b1, sizeof(b1));
	tq_size_format_human(si->resident_bytes, b2, sizeof(b2));
	if (say_no_tier)
		log_warning("reclaim: %s; nothing can be spilled from tenant '%s' (%s)", why, tenant_name(t), reason);
	else if (say_fail)
		log_warning("reclaim: tenant '%s' session %" PRIu64 ": spilled %s of %s resident, then failed: %s "
			    "(%s; such failures are reported once per %u s)", tenant_name(t), si->id, b1, b2, why,
			    reason, FAIL_LOG_MS / 1000);
	else if (done)
		log_info("reclaim: tenant '%s' session %" PRIu64 " (idle %" PRIu64 " ms): spilled %s of %s resident (%s)",
			 tenant_name(t), si->id, now > si->last_access_ms ? now - si->last_access_ms : 0, b1, b2,
			 reason);
}

/* Admission's rule: the bytes tenant `of` holds above its guarantee that
 * an allocation of tenant `from` (NULL: the reclaimer) may take, 0 if
 * none: any tenant's when `from` is within its guarantee, else those of
 * the same or a lower priority (its own included); `asking`: bytes `from`
 * is charged for already but does not hold yet (not its to give up). */
static uint64_t takable(struct tenant *from, uint64_t asking, struct tenant *of)
{
	struct tenant_info o, f;

	tenant_get_info(of, &o);
	if (of == from)
		o.used -= asking < o.used ? asking : o.used;
	/* bytes other spills are writing out are going already: counted
	 * twice, two passes at once took a tenant below its guarantee */
	o.used -= o.spilling < o.used ? o.spilling : o.used;
	if (o.used <= o.guaranteed)
		return 0;
	if (from && from != of) {
		tenant_get_info(from, &f);
		if (f.used > f.guaranteed && o.priority > f.priority)
			return 0;
	}
	return o.used - o.guaranteed;
}

/* Could wait w of a session of tenant `from` take pages of tenant `of`?
 * At the limit only its own tenant's; for the pool, admission's rule. */
static bool could_take(const struct session_wait *w, struct tenant *from, struct tenant *of)
{
	return w->at_limit ? from == of : takable(from, w->bytes, of) > 0;
}

/* Does requester `me`, which would spill (or evict) session `id` of tenant
 * t, whose operation holds it and is in wait w, give way to it instead of
 * waiting for it?  When w began before me (ties: the lower id first), is
 * stuck (it waits for pages operations hold) and could take me's pages:
 * it then waits for me's among them, and each would wait for the other
 * until admission_wait ran out.  The later of the two gives way, the
 * earlier waits for it to give up.  A waiter that gets pages meanwhile,
 * or could not take me's, waits for someone else's: me waits for it.
 * (Pairs only: a cycle of three waiters, each able to take only the next
 * one's pages, ends at admission_wait.) */
static bool gives_way(const struct waiter *me, uint64_t id, struct tenant *t, const struct session_wait *w)
{
	if (!me || !w->since_us || !w->stuck)
		return false;
	if (w->since_us > me->since_us || (w->since_us == me->since_us && id > me->id))
		return false;
	return could_take(w, t, me->t);
}

/* Sessions whose writes are in flight together: one session's batch
 * alone would let the disk's queue run dry at its end. */
#define SPILL_INFLIGHT 8

/* One scan of tenant t's sessions, least recently used first, until
 * res->got reaches got0 + want: up to 8 sessions at a time are asked for
 * what is still wanted; with res->guard, never more than the tenant's
 * takable bytes at that moment (whole pages). */
static void spill_scan(struct reclaim *rc, struct tenant *t, uint64_t want, uint64_t got0,
		       const struct session *skip, const char *reason, uint64_t now, struct spill_res *res)
{
	struct session_info *si = NULL;
	size_t n = 0, i = 0;
	uint32_t page = pool_page_bytes(rc->pool);
	char why[512];

	if (session_list(rc->st, t, &si, &n) < 0)
		return;
	qsort(si, n, sizeof(*si), by_last_access);
	while (i < n && res->got - got0 < want && !res->err) {
		struct { struct session *s; struct dataop_spill_op *op; size_t idx; uint64_t take; } fl[SPILL_INFLIGHT];
		uint64_t planned = res->got - got0, t0 = mono_us();
		int nf = 0;
		for (; i < n && nf < SPILL_INFLIGHT && planned < want && !res->err; i++) {
			struct session *s;
			struct dataop_spill_op *op;
			uint64_t take = want - planned;
			if (si[i].state == SESSION_EVICTED && si[i].resident_bytes) {
				res->busy++; /* its memory comes back when its operation returns */
				continue;
			}
			if (si[i].state != SESSION_OPEN || !si[i].resident_bytes ||
			    (skip && si[i].id == session_id(skip)))
				continue;
			if (take > si[i].resident_bytes)
				take = si[i].resident_bytes;
			if (res->guard) { /* the tenant's use now, others' spills in flight counted */
				uint64_t room = takable(res->from, res->asking, t);
				room -= room % page;
				if (!room) {
					i = n;
					break;
				}
				if (take > room)
					take = room;
			}
			if (session_acquire(rc->st, si[i].id, 0, &s) < 0)
				continue; /* gone meanwhile */
			/* counted before it starts: another pass must not see
			 * these bytes as the tenant's to give between the two */
			tenant_spilling_add(t, (int64_t)take);
			int e = dataop_spill_start(rc->ks, s, take, &op, why, sizeof(why));
			if (e < 0) {
				tenant_spilling_add(t, -(int64_t)take);
				struct session_wait w;
				session_wait_get(s, &w); /* now, not as listed */
				session_release(s);
				if (e != -EBUSY)
					spilled_one(rc, t, &si[i], e, 0, why, reason, now, res);
				else if (gives_way(res->me, si[i].id, t, &w))
					res->gave_way++;
				else {
					res->busy++;
					res->held++;
				}
				continue;
			}
			fl[nf].s = s;
			fl[nf].op = op;
			fl[nf].take = take;
			fl[nf++].idx = i;
			planned += take;
			if (dataop_spill_stopped(op)) { /* the tier is full: finish what is in flight */
				i++;
				break;
			}
		}
		for (int k = 0; k < nf; k++) {
			uint64_t done = 0;
			int e = dataop_spill_finish(fl[k].op, &done, why, sizeof(why));
			tenant_spilling_add(t, -(int64_t)fl[k].take); /* `used` has dropped by `done` */
			session_release(fl[k].s);
			spilled_one(rc, t, &si[fl[k].idx], e, done, why, reason, now, res);
		}
		if (nf) {
			pthread_mutex_lock(&rc->lock);
			rc->stats.busy_us += mono_us() - t0;
			pthread_mutex_unlock(&rc->lock);
		}
	}
	free(si);
}

/* Spill up to `want` bytes of tenant t, least recently used sessions
 * first, never `skip` nor a session an operation holds; adds to res (which
 * may hold other tenants' bytes already: admission).  reason: for the
 * log.  A session may give less than it was asked for (pages being read
 * or written): a second scan asks the sessions again for the rest. */
static void spill_tenant(struct reclaim *rc, struct tenant *t, uint64_t want, const struct session *skip,
			 const char *reason, struct spill_res *res)
{
	uint32_t page = pool_page_bytes(rc->pool);
	uint64_t now = session_clock_ms(), got0 = res->got; /* as last_access_ms */

	want -= want % page; /* whole pages: never below what the caller allows */
	for (int scan = 0; scan < 2 && want && res->got - got0 < want && !res->err; scan++)
		spill_scan(rc, t, want, got0, skip, reason, now, res);
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

/* Tenants above their guarantee that `for_t` may take from (NULL: any),
 * in the order they give pages up; `asking`: bytes for_t is charged for
 * already but does not hold yet (they are not its to give up).  c has room
 * for every tenant. */
static size_t victims(struct reclaim *rc, struct tenant *for_t, uint64_t asking, struct cand *c)
{
	uint32_t nt = tenant_count(rc->tt);
	size_t n = 0;

	for (uint32_t i = 0; i < nt; i++) {
		struct tenant *t = tenant_at(rc->tt, i);
		uint64_t excess = takable(for_t, asking, t);
		/* whole pages only (spill_tenant takes no part of one): a
		 * fraction of a page is nothing to take, and an admission that
		 * finds nothing else waits for spills in flight instead */
		if (excess >= pool_page_bytes(rc->pool))
			c[n++] = (struct cand){ t, tenant_priority(t), excess };
	}
	qsort(c, n, sizeof(*c), by_priority);
	return n;
}

uint64_t reclaim_pass(struct reclaim *rc)
{
	uint32_t nt = tenant_count(rc->tt);
	struct cand *c = calloc(nt ? nt : 1, sizeof(*c));
	uint64_t spilled = 0, total, used;
	struct reclaim_params p = params_of(rc);
	char reason[256], b1[32], b2[32];

	if (!c)
		return 0;
	pthread_mutex_lock(&rc->pass_lock);

	/* 1. tenants above their limit come down to it */
	for (uint32_t i = 0; i < nt; i++) {
		struct tenant_info ti;
		struct spill_res res = { 0 };
		tenant_get_info(tenant_at(rc->tt, i), &ti);
		if (ti.used <= ti.limit)
			continue;
		tq_size_format_human(ti.used, b1, sizeof(b1));
		tq_size_format_human(ti.limit, b2, sizeof(b2));
		snprintf(reason, sizeof(reason), "the tenant holds %s, above its limit of %s", b1, b2);
		/* whole pages, rounded up: down to the limit (which need not be
		 * a multiple of the page size), not just near it */
		uint64_t page = pool_page_bytes(rc->pool), over = ti.used - ti.limit;
		spill_tenant(rc, tenant_at(rc->tt, i), over + (page - over % page) % page, NULL, reason, &res);
		spilled += res.got;
	}

	/* 2. above the high mark: down to the low mark, from the tenants
	 * above their guarantee, lowest priority first */
	used = pool_used(rc, &total);
	if (total && used * 100 > total * p.high_pct) {
		uint64_t target = used - total * p.low_pct / 100;
		size_t n = victims(rc, NULL, 0, c);
		for (size_t k = 0; k < n && target; k++) {
			struct spill_res res = { .guard = true };
			uint64_t take = c[k].excess < target ? c[k].excess : target;
			tq_size_format_human(c[k].excess, b1, sizeof(b1));
			snprintf(reason, sizeof(reason), "pool %" PRIu64 "%% used, above the %u%% mark; the tenant "
				 "(priority %d) is %s above its guarantee", used * 100 / total, p.high_pct,
				 c[k].priority, b1);
			spill_tenant(rc, c[k].t, take, NULL, reason, &res);
			target -= res.got < target ? res.got : target;
			spilled += res.got;
			if (res.err == -EOPNOTSUPP || res.err == -ENOSPC)
				break; /* no tier, or it is full: the next tenant fares no better */
		}
	}
	pthread_mutex_lock(&rc->lock);
	rc->stats.passes += spilled != 0;
	pthread_mutex_unlock(&rc->lock);
	pthread_mutex_unlock(&rc->pass_lock);
	free(c);
	return spilled;
}

/* Sessions in the order the second pass of evict_one tries them: the
 * smallest that covers `asking` first, then the larger ones down. */
static int by_cover(const void *a, const void *b, void *want_)
{
	const struct session_info *x = a, *y = b;
	const uint64_t want = *(const uint64_t *)want_;
	const bool cx = x->resident_bytes >= want, cy = y->resident_bytes >= want;

	if (cx != cy)
		return cx ? -1 : 1;
	if (x->resident_bytes != y->resident_bytes)
		return (x->resident_bytes < y->resident_bytes) == cx ? -1 : 1;
	return by_last_access(a, b);
}

/* pool.pressure_action = evict: a session (not `skip`, not persistent, not
 * itself waiting for pool pages) of the first tenant in c that has one.
 * First the least recently used one whose resident bytes fit within its
 * tenant's excess over its guarantee (all of a session goes: a tenant one
 * page above its guarantee lost a whole 8 GiB session); only when none
 * fits and the requester's tenant is within its own guarantee (which then
 * wins over the victim's), the smallest that covers the request.  1 when
 * one was evicted (its id in *evicted); -EBUSY when the only ones left are
 * waiting for pages (they may be evictable once they have given up) or
 * were evicted already and give their memory back when their operation
 * returns: try again; 0: none (res->gave_way: waiters for pages that
 * res->me gave way to, gives_way(); res->held: those it waits for;
 * res->too_big: sessions larger than their tenant's excess). */
static int evict_one(struct reclaim *rc, const struct cand *c, size_t nc, const struct session *skip,
		     const char *need, uint64_t *evicted, struct spill_res *res)
{
	char why[1024], b1[32];
	bool waiting = false;
	const bool within = res->from && tenant_used(res->from) <= tenant_guaranteed(res->from);

	for (int pass = 0; pass < 2 && (pass == 0 || within); pass++) {
		for (size_t k = 0; k < nc; k++) {
			struct session_info *si = NULL, info;
			size_t n = 0;
			if (session_list(rc->st, c[k].t, &si, &n) < 0)
				continue;
			if (pass)
				qsort_r(si, n, sizeof(*si), by_cover, &res->asking);
			else
				qsort(si, n, sizeof(*si), by_last_access);
			for (size_t i = 0; i < n; i++) {
				/* evicted (by anyone) while an operation still holds
				 * it: its memory comes back when that returns */
				waiting |= si[i].state == SESSION_EVICTED && si[i].resident_bytes;
				if (si[i].state != SESSION_OPEN || si[i].persistent || !si[i].resident_bytes ||
				    (skip && si[i].id == session_id(skip)))
					continue;
				if (!pass && si[i].resident_bytes > takable(res->from, res->asking, c[k].t)) {
					res->too_big++;
					continue;
				}
				snprintf(why, sizeof(why), "evicted under memory pressure: %s (pool.pressure_action = "
					 "evict)", need);
				int e = session_evict_pressure(rc->st, si[i].id, why, &info);
				if (e == -EBUSY) { /* it waits for pages itself (info: now): unless me gives way */
					bool gw = gives_way(res->me, si[i].id, c[k].t, &info.wait);
					res->gave_way += gw;
					res->held += !gw;
					waiting |= !gw;
				}
				if (e < 0)
					continue;
				tq_size_format_human(si[i].resident_bytes + si[i].spilled_bytes, b1, sizeof(b1));
				log_warning("reclaim: evicted session %" PRIu64 " of tenant '%s' (priority %d, %s%s): %s",
					    si[i].id, si[i].tenant, c[k].priority, b1,
					    pass ? "; more than the tenant held above its guarantee, for a tenant within "
						   "its own" : "", why);
				tenant_note(c[k].t, TENANT_EVICTIONS, 1);
				pthread_mutex_lock(&rc->lock);
				rc->stats.evictions++;
				pthread_mutex_unlock(&rc->lock);
				*evicted = si[i].id;
				free(si);
				return 1;
			}
			free(si);
		}
	}
	return waiting ? -EBUSY : 0;
}

/* Is any tenant's memory being spilled right now (tenant_spilling_add)? */
static bool spills_in_flight(struct reclaim *rc)
{
	uint32_t nt = tenant_count(rc->tt);

	for (uint32_t i = 0; i < nt; i++)
		if (tenant_spilling(tenant_at(rc->tt, i)))
			return true;
	return false;
}

/* Has the memory of an evicted session been given back yet?  (Closed
 * meanwhile, it is out of the table: then whether any session's memory is
 * still on its way back.) */
static bool released(struct reclaim *rc, uint64_t id)
{
	struct session_info si;

	if (session_get_info(rc->st, id, &si) < 0)
		return session_table_pending_release(rc->st) == 0;
	return si.resident_bytes == 0 && si.spilled_bytes == 0;
}

int reclaim_admit(struct reclaim *rc, struct session *s, uint32_t n, uint8_t **pages, char *why, size_t whylen)
{
	struct tenant *t = session_tenant(s);
	uint32_t nt = tenant_count(rc->tt), page = pool_page_bytes(rc->pool);
	struct cand *c = calloc(nt ? nt : 1, sizeof(*c));
	struct reclaim_params p = params_of(rc);
	uint64_t t0 = mono_us(), deadline = t0 + p.admission_wait_ms * 1000u, evicted = 0;
	const struct waiter me = { t0 ? t0 : 1, session_id(s), t }; /* since 0 says "not waiting" */
	bool waited = false, stuck = false;
	char need[160];
	int r = -ENOSPC;

	snprintf(need, sizeof(need), "tenant '%s' (priority %d) needed %u page(s) on a full pool", tenant_name(t),
		 tenant_priority(t), n);
	if (!c) {
		snprintf(why, whylen, "the pool is full (and the daemon is out of memory)");
		goto out;
	}
	session_admit_begin(s, me.since_us, false, (uint64_t)n * page);
	for (;;) {
		if (pool_pages_alloc(rc->pool, n, pages) == 0) {
			r = 0;
			break;
		}
		if (!session_is_open(s)) {
			/* evicted (an operator, or pressure before it waited) or
			 * closed meanwhile: the pages are no longer its to take */
			snprintf(why, whylen, "the session was evicted or closed while it waited for pool pages");
			r = -ESTALE;
			break;
		}
		size_t nc = victims(rc, t, (uint64_t)n * page, c);
		if (!nc && spills_in_flight(rc) && mono_us() < deadline) {
			/* pages on their way out (another pass's writes): they
			 * are free in a moment, and not to be taken twice */
			waited = true;
			usleep(500);
			continue;
		}
		if (!nc) {
			snprintf(why, whylen, "the pool is full (%u pages free) and no tenant %sholds pages above "
				 "its guarantee", pool_pages_free_count(rc->pool),
				 tenant_used(t) <= tenant_guaranteed(t) ? "" : "of this or a lower priority ");
			break;
		}
		if (mono_us() >= deadline) {
			if (p.admission_wait_ms)
				snprintf(why, whylen, "the pool is full: waited %" PRIu64 " ms (pool.admission_wait) "
					 "while other sessions' pages were in use", (mono_us() - t0) / 1000);
			else
				snprintf(why, whylen, "the pool is full (pool.admission_wait = 0: no waiting for "
					 "the reclaimer)");
			break;
		}
		waited = true;
		if (stuck) /* a new try: it may get pages (from a third session) */
			session_admit_stuck(s, stuck = false);
		/* spill for it: lowest priority first, never this session */
		struct spill_res res = { .me = &me, .guard = true, .from = t, .asking = (uint64_t)n * page };
		uint64_t want = (uint64_t)(n > ADMIT_BATCH_PAGES ? n : ADMIT_BATCH_PAGES) * page;
		char reason[256];
		for (size_t k = 0; k < nc && res.got < want && !res.err; k++) {
			uint64_t take = want - res.got;
			snprintf(reason, sizeof(reason), "%s; this tenant (priority %d) is above its guarantee",
				 need, c[k].priority);
			spill_tenant(rc, c[k].t, c[k].excess < take ? c[k].excess : take, s, reason, &res);
		}
		reclaim_kick(rc); /* the background pass takes the pool to the low mark */
		if (res.got)
			continue;
		/* memory of sessions evicted or closed in an operation comes
		 * back when it returns (they are out of the table once closed) */
		res.busy += session_table_pending_release(rc->st);
		if (!res.err && !res.busy && (!evicted || released(rc, evicted))) {
			snprintf(why, whylen, "the pool is full, and the only pages above a guarantee that this tenant "
				 "may take are the requesting session's own%s", res.gave_way ? " or earlier waiters'" : "");
			break;
		}
		if (res.err) {
			/* nothing can be spilled: the tier is full, failing or absent */
			if (p.pressure_action == CONFIG_PRESSURE_EVICT) {
				if (!evicted || released(rc, evicted)) {
					char e[768];
					snprintf(e, sizeof(e), "%s and nothing could be spilled (%s)", need, res.why);
					int ev = evict_one(rc, c, nc, s, e, &evicted, &res);
					if (ev > 0)
						continue;
					if (ev == 0 && !session_table_pending_release(rc->st)) {
						snprintf(why, whylen, "the pool is full, nothing could be spilled (%s) "
							 "and no session could be evicted%s%s", res.why, res.gave_way ?
							 " but earlier waiters" : "", res.too_big ? " (each holds more than "
							 "its tenant has above its guarantee)" : "");
						break;
					}
					/* the only candidates wait for pages themselves */
				}
			} else {
				snprintf(why, whylen, "the pool is full and nothing could be spilled: %s "
					 "(pool.pressure_action = fail)", res.why);
				break;
			}
		}
		/* the pages to take are in use right now (or an evicted
		 * session's are on their way back): try again shortly; stuck
		 * when it waits for sessions that operations hold (not only for
		 * memory on its way back) */
		if (res.held)
			session_admit_stuck(s, stuck = true);
		usleep(500);
	}
	/* a release that ended after the loop's allocation (and before what
	 * made it give up: no more memory on its way back) has put its pages
	 * in the pool: one more try */
	if (r == -ENOSPC && pool_pages_alloc(rc->pool, n, pages) == 0)
		r = 0;
	session_admit_end(s);
out:
	if (waited)
		tenant_note_wait(t, mono_us() - t0);
	if (r == -ENOSPC) /* (-ESTALE: evicted or closed meanwhile, not refused) */
		tenant_note(t, TENANT_REFUSALS, 1);
	pthread_mutex_lock(&rc->lock);
	rc->stats.admission_waits += waited;
	rc->stats.admission_refusals += r == -ENOSPC;
	pthread_mutex_unlock(&rc->lock);
	free(c);
	return r;
}

/* Tenant t (using `used` bytes) as requester `me` (waiting at its limit)
 * sees it: *reach, the bytes a spill could take for me (not me's own, nor
 * those of a sibling it gives way to: that one waits for me's pages, and
 * would until admission_wait ran out if me waited for its in turn;
 * *kept); *unlisted, bytes charged to sessions no longer in the table
 * (closed in an operation: given back when it returns), or charged a
 * moment before the session counts them. */
static void tenant_view(struct reclaim *rc, const struct waiter *me, uint64_t used, uint64_t *reach,
			uint64_t *unlisted, uint64_t *kept)
{
	struct session_info *si = NULL;
	uint64_t listed = 0, held = 0;
	size_t n = 0;

	*reach = 0;
	*unlisted = 0;
	*kept = 0;
	if (session_list(rc->st, me->t, &si, &n) < 0)
		return;
	for (size_t i = 0; i < n; i++) {
		listed += si[i].resident_bytes;
		if (si[i].id == me->id) {
			held += si[i].resident_bytes;
		} else if (gives_way(me, si[i].id, me->t, &si[i].wait)) {
			held += si[i].resident_bytes;
			*kept += si[i].resident_bytes;
		}
	}
	free(si);
	*unlisted = used > listed ? used - listed : 0;
	*reach = used > held ? used - held : 0;
}

int reclaim_charge(struct reclaim *rc, struct session *s, uint64_t bytes, int (*charge)(struct session *, uint64_t),
		   char *why, size_t whylen)
{
	struct tenant *t = session_tenant(s);
	uint32_t page = pool_page_bytes(rc->pool);
	struct reclaim_params p = params_of(rc);
	uint64_t t0 = mono_us(), deadline = t0 + p.admission_wait_ms * 1000u;
	const struct waiter me = { t0 ? t0 : 1, session_id(s), t }; /* since 0 says "not waiting" */
	bool waited = false, stuck = false;
	char b1[32], b2[32], b3[32];
	int r;

	session_admit_begin(s, me.since_us, true, bytes);
	for (;;) {
		/* (session_restore_move does not look at the session's state) */
		if ((r = charge(s, bytes)) == -ENOSPC && !session_is_open(s))
			r = -ESTALE;
		if (r != -ENOSPC) {
			if (r == -ESTALE) /* evicted or closed meanwhile */
				snprintf(why, whylen, "the session was evicted or closed while it waited");
			break;
		}
		uint64_t used = tenant_used(t), limit = tenant_limit(t);
		tq_size_format_human(limit, b2, sizeof(b2));
		if (used + bytes <= limit && mono_us() < deadline)
			continue; /* another session gave pages back meanwhile */
		uint64_t over = used + bytes > limit ? used + bytes - limit : 0, others, unlisted, kept;
		tenant_view(rc, &me, used, &others, &unlisted, &kept);
		tq_size_format_human(others, b1, sizeof(b1));
		if (others < over) {
			tq_size_format_human(kept, b3, sizeof(b3));
			snprintf(why, whylen, "its other sessions hold %s%s%s%s, less than the %" PRIu64 " bytes over "
				 "its limit of %s", b1, kept ? " (+" : "", kept ? b3 : "",
				 kept ? " held by earlier waiters)" : "", over, b2);
			break;
		}
		if (!p.admission_wait_ms) {
			snprintf(why, whylen, "its limit is %s (pool.admission_wait = 0: no waiting while its other "
				 "sessions' pages are spilled)", b2);
			break;
		}
		if (mono_us() >= deadline) {
			snprintf(why, whylen, "its limit is %s: waited %" PRIu64 " ms (pool.admission_wait) while its "
				 "other sessions' pages were in use", b2, (mono_us() - t0) / 1000);
			break;
		}
		waited = true;
		if (stuck) /* a new try: it may get pages (from a third session) */
			session_admit_stuck(s, stuck = false);
		/* its own least recently used sessions give pages up (its
		 * guarantee is no floor here: it protects the tenant from
		 * others, and these stay its own, on the tier) */
		struct spill_res res = { .me = &me };
		uint64_t want = over > (uint64_t)ADMIT_BATCH_PAGES * page ? over : (uint64_t)ADMIT_BATCH_PAGES * page;
		char reason[256];
		tq_size_format_human(used, b3, sizeof(b3));
		snprintf(reason, sizeof(reason), "tenant '%s' holds %s, and %" PRIu64 " more bytes would take it above its "
			 "limit of %s", tenant_name(t), b3, bytes, b2);
		want += (page - want % page) % page; /* whole pages, at least what it is over */
		spill_tenant(rc, t, want, s, reason, &res);
		if (res.got)
			continue;
		if (res.err) {
			snprintf(why, whylen, "its limit is %s and its other sessions' pages could not be spilled: %s",
				 b2, res.why);
			break;
		}
		/* a session closed in an operation holds its charge until that
		 * returns (it is out of the table: spill_scan cannot see it) */
		res.busy += unlisted > 0;
		if (!res.busy) {
			snprintf(why, whylen, "its limit is %s, and its other sessions have no pages left to spill%s",
				 b2, res.gave_way ? " but earlier waiters'" : "");
			break;
		}
		if (res.held) /* (not when only a closed sibling's charge is on its way back) */
			session_admit_stuck(s, stuck = true);
		usleep(500); /* the pages to spill are in use right now: shortly */
	}
	/* a release that ended after the last try gave its bytes back */
	if (r == -ENOSPC && charge(s, bytes) == 0)
		r = 0;
	session_admit_end(s);
	if (waited)
		tenant_note_wait(t, mono_us() - t0);
	pthread_mutex_lock(&rc->lock);
	rc->stats.admission_waits += waited;
	pthread_mutex_unlock(&rc->lock);
	return r;
}

static bool above_low(struct reclaim *rc)
{
	uint64_t total, used = pool_used(rc, &total);
	uint32_t low = params_of(rc).low_pct;

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
		__atomic_store_n(&rc->kick_pending, 0, __ATOMIC_RELAXED);
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

static int start(struct reclaim **out, struct pool *pool, struct tenant_table *tt, struct session_table *st,
		 struct kvstore *ks, const struct reclaim_params *p, bool threaded, char *why, size_t whylen)
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
	rc->high_pct = p->high_pct;
	pthread_mutex_init(&rc->lock, NULL);
	pthread_mutex_init(&rc->pass_lock, NULL);
	pthread_cond_init(&rc->cond, NULL);
	rc->threaded = threaded;
	if (threaded && (r = pthread_create(&rc->thread, NULL, reclaim_main, rc)) != 0) {
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

int reclaim_start(struct reclaim **out, struct pool *pool, struct tenant_table *tt, struct session_table *st,
		  struct kvstore *ks, const struct reclaim_params *p, char *why, size_t whylen)
{
	return start(out, pool, tt, st, ks, p, true, why, whylen);
}

int reclaim_start_manual(struct reclaim **out, struct pool *pool, struct tenant_table *tt,
			 struct session_table *st, struct kvstore *ks, const struct reclaim_params *p,
			 char *why, size_t whylen)
{
	return start(out, pool, tt, st, ks, p, false, why, whylen);
}

void reclaim_stop(struct reclaim *rc)
{
	if (!rc)
		return;
	pthread_mutex_lock(&rc->lock);
	rc->stop = true;
	pthread_cond_signal(&rc->cond);
	pthread_mutex_unlock(&rc->lock);
	if (rc->threaded)
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
	__atomic_store_n(&rc->high_pct, p->high_pct, __ATOMIC_RELAXED);
	rc->kicked = true;
	pthread_cond_signal(&rc->cond);
	pthread_mutex_unlock(&rc->lock);
	return 0;
}

void reclaim_get_params(struct reclaim *rc, struct reclaim_params *out)
{
	*out = params_of(rc);
}

void reclaim_kick(struct reclaim *rc)
{
	pthread_mutex_lock(&rc->lock);
	rc->kicked = true;
	pthread_cond_signal(&rc->cond);
	pthread_mutex_unlock(&rc->lock);
}

void reclaim_note_alloc(struct reclaim *rc)
{
	uint64_t total, used;

	if (__atomic_load_n(&rc->kick_pending, __ATOMIC_RELAXED))
		return;
	used = pool_used(rc, &total);
	if (total && used * 100 > total * __atomic_load_n(&rc->high_pct, __ATOMIC_RELAXED)) {
		__atomic_store_n(&rc->kick_pending, 1, __ATOMIC_RELAXED);
		reclaim_kick(rc);
	}
}

void reclaim_stats(struct reclaim *rc, struct reclaim_stats *out)
{
	pthread_mutex_lock(&rc->lock);
	*out = rc->stats;
	pthread_mutex_unlock(&rc->lock);
}
