/* reclaim.h — the reclaimer: keeps the pool under its high watermark by
 * spilling pages of the tenants that hold more than their guarantee.
 *
 * Policy (one pass, reclaim_pass):
 *   1. A tenant above its limit (a limit lowered at run time) is brought
 *      down to it: its least recently used sessions' coldest pages first.
 *   2. When pool use is above the high mark, pages are spilled until it is
 *      at the low mark (hysteresis): tenants above their guarantee, lowest
 *      priority first (then the largest excess), each down to its
 *      guarantee at most; within a tenant, least recently used sessions
 *      first, and within a session its coldest pages (dataop_spill's
 *      order: full pages, oldest tokens, every layer; tail pages last).
 *   A tenant at or under its guarantee is never spilled by the reclaimer.
 *   Pages an operation is using are never chosen: dataop_spill takes the
 *   session's lock, so it waits for the operation in flight and spills
 *   afterwards.  Every decision is logged at info: tenant, session, bytes
 *   and the reason.
 *
 * Thread: one, started by reclaim_start; it sleeps until reclaim_kick (the
 * data path's allocations cross the high mark) or a 1 s tick, then runs
 * passes while use stays above the low mark.  Without a spill tier it
 * does nothing (and says so once).
 */
#ifndef TQKVD_RECLAIM_H
#define TQKVD_RECLAIM_H

#include <stddef.h>
#include <stdint.h>

struct pool;
struct tenant_table;
struct session_table;
struct kvstore;

struct reclaim_params {
	uint32_t high_pct;        /* start above this pool use, 1..100         */
	uint32_t low_pct;         /* spill down to this, < high_pct            */
};

struct reclaim_stats {
	uint64_t passes;          /* passes that spilled something            */
	uint64_t spilled_bytes;   /* by the reclaimer, all tenants             */
	uint64_t decisions;       /* sessions spilled from (log lines)         */
	uint64_t failures;        /* spills that failed (tier full, I/O)       */
};

struct reclaim;

/* 0, or a negative errno with why set. */
int reclaim_start(struct reclaim **out, struct pool *pool, struct tenant_table *tt, struct session_table *st,
		  struct kvstore *ks, const struct reclaim_params *p, char *why, size_t whylen);
void reclaim_stop(struct reclaim *rc);
/* -EINVAL (with why) unless 0 < low < high <= 100; in effect at once. */
int reclaim_set_params(struct reclaim *rc, const struct reclaim_params *p, char *why, size_t whylen);
/* Ask for a pass soon (cheap; any thread). */
void reclaim_kick(struct reclaim *rc);
/* One pass on the calling thread (the reclaimer's thread, and tests):
 * the bytes it spilled. */
uint64_t reclaim_pass(struct reclaim *rc);
void reclaim_stats(struct reclaim *rc, struct reclaim_stats *out);

#endif
