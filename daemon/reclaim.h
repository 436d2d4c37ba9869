/* reclaim.h — the reclaimer: keeps the pool under its high watermark by
 * spilling pages of the tenants that hold more than their guarantee, and
 * makes room for allocations that find the pool full (admission).
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
 *   Pages an operation is using are never chosen: a session with an
 *   operation in flight is skipped (dataop_spill_start) and taken at a later
 *   pass.  Every decision is logged at info: tenant, session, bytes and
 *   the reason.
 *
 * Admission (reclaim_admit): an allocation that finds the pool full waits
 * up to pool.admission_wait while pages are spilled for it, from tenants
 * above their guarantee: any of them when the requester's tenant is within
 * its guarantee, else those of the same or a lower priority (its own other
 * sessions included).  The requesting session itself is never spilled.
 * When nothing can be spilled (the tier is full or failing),
 * pool.pressure_action says what happens: fail (POOL_FULL, with why) or
 * evict (the least recently used session of the lowest-priority tenant
 * above its guarantee whose resident bytes fit within that excess is
 * evicted; when none fits and the requester's tenant is within its own
 * guarantee, the smallest session that covers the request; never a
 * persistent one nor one that waits for pages itself, and its owner gets EVICTED with
 * TQKV_EVICT_PRESSURE; a session evicted in the middle of an operation
 * gives its memory back when the operation returns, which the requester
 * waits for).  Two sessions that wait at once therefore never evict each
 * other (each would hold on to the memory the other waits for until
 * admission_wait ran out, and both would be lost), and a waiter that is
 * evicted or closed meanwhile stops waiting at once (-ESTALE: its
 * operation fails with EVICTED).  Waits, refusals and evictions are
 * counted per tenant (tenant_info.pressure).
 *
 * At the limit (reclaim_charge): a charge that would take a tenant above
 * its limit spills the tenant's own least recently used other sessions
 * first, for pool.admission_wait at most (TENANT_LIMIT only when they hold
 * too little or cannot be spilled).
 *
 * Two waiters (both, and evict's candidates): a session an operation
 * holds is waited for, except one waiting for memory itself since before
 * the requester, stuck (its last try found only pages operations hold),
 * that could take the requester's pages (it waits for them): of two such,
 * the later gives way at once (refused unless a third session's pages
 * will do) and the earlier spills or evicts it once its operation
 * returns.  Cycles of three or more end at admission_wait.
 *
 * Threads: the reclaimer's own thread (reclaim_start) sleeps until
 * reclaim_kick (an allocation took the pool above the high mark, a budget
 * changed) or a 1 s tick, then runs passes while use stays above the low
 * mark; admission runs on the allocating thread (a ring worker, which
 * holds its own session's lock: that is why nobody here ever blocks on
 * another session's lock).  Without a spill tier it does nothing (and
 * says so once).
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
	uint32_t high_pct;          /* start above this pool use, 1..100              */
	uint32_t low_pct;           /* spill down to this, < high_pct                 */
	uint64_t admission_wait_ms; /* an allocation waits this long at most; 0: not  */
	int pressure_action;        /* enum config_pressure_action                    */
};

struct reclaim_stats {
	uint64_t passes;            /* background passes that spilled something       */
	uint64_t spilled_bytes;     /* by the reclaimer (passes and admission)        */
	uint64_t decisions;         /* sessions spilled from (log lines)              */
	uint64_t failures;          /* spills that failed (tier full, I/O)            */
	uint64_t busy_us;           /* time spent spilling: spilled_bytes / this = rate */
	uint64_t admission_waits;   /* allocations that waited                        */
	uint64_t admission_refusals;/* allocations refused after all                  */
	uint64_t evictions;         /* sessions evicted (pressure_action = evict)     */
};

struct reclaim;

/* 0, or a negative errno with why set. */
int reclaim_start(struct reclaim **out, struct pool *pool, struct tenant_table *tt, struct session_table *st,
		  struct kvstore *ks, const struct reclaim_params *p, char *why, size_t whylen);
/* Tests that check the pool after every step (test_pressure_model): the
 * same without the thread.  Passes run only when reclaim_pass is called
 * (kicks are noted and nothing acts on them); admission works as ever. */
int reclaim_start_manual(struct reclaim **out, struct pool *pool, struct tenant_table *tt,
			 struct session_table *st, struct kvstore *ks, const struct reclaim_params *p,
			 char *why, size_t whylen);
void reclaim_stop(struct reclaim *rc);
/* -EINVAL (with why) unless 0 < low < high <= 100; in effect at once. */
int reclaim_set_params(struct reclaim *rc, const struct reclaim_params *p, char *why, size_t whylen);
void reclaim_get_params(struct reclaim *rc, struct reclaim_params *out);
/* Ask for a pass soon (cheap; any thread). */
void reclaim_kick(struct reclaim *rc);
/* An allocation succeeded: kicks the thread when the pool is above the
 * high mark (cheap; any thread). */
void reclaim_note_alloc(struct reclaim *rc);
/* Admission: n pool pages for session s (in an operation, its tenant
 * already charged for them) after pool_pages_alloc found the pool full.
 * 0 with pages[0..n), or -ENOSPC with why (nothing taken), or -ESTALE
 * when s was evicted or closed while it waited. */
struct session;
int reclaim_admit(struct reclaim *rc, struct session *s, uint32_t n, uint8_t **pages, char *why, size_t whylen);
/* Admission to a tenant's limit: `charge` (session_charge or
 * session_restore_move) found that `bytes` more would take s's tenant
 * above its limit.  Spills the tenant's own least recently used other
 * sessions (never s; the tenant's guarantee is no floor here) until the
 * charge fits, for pool.admission_wait at most, then charges.  0: charged;
 * -ENOSPC with why: the other sessions hold too little, nothing could be
 * spilled (no tier, full, failing), or the wait ran out; -ESTALE: s was
 * evicted or closed meanwhile. */
int reclaim_charge(struct reclaim *rc, struct session *s, uint64_t bytes, int (*charge)(struct session *, uint64_t),
		   char *why, size_t whylen);
/* One pass on the calling thread (the reclaimer's thread, and tests):
 * the bytes it spilled. */
uint64_t reclaim_pass(struct reclaim *rc);
void reclaim_stats(struct reclaim *rc, struct reclaim_stats *out);

#endif
