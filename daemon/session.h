/* session.h — the session table.
 *
 * A session is one inference context's KV cache: a fixed geometry (layers,
 * KV heads, query heads, head dim, K and V codecs), a rotation seed, an
 * owner uid and a tenant that pays for its bytes.
 *
 * States:  OPEN ──evict──> EVICTED ──close──> (gone)
 *            └──────────────close─────────────> CLOSING ──last op ends──> (gone)
 * An evicted session keeps its record so its owner gets a clear error
 * (-ESTALE) instead of "no such session"; CloseSession (or the idle timer)
 * removes it.
 *
 * Thread-safe.  Control-plane calls (open, evict, close, list) and the data
 * path's operations (acquire/charge/release, next release) may race freely:
 *
 *   struct session *s;
 *   if (session_acquire(st, id, now_ms, &s) < 0) ...;  // -ENOENT / -ESTALE / -ESHUTDOWN
 *   r = session_charge(s, page_bytes);                 // -ENOSPC: over the tenant limit
 *   ... work on the session's pages ...
 *   session_release(s);                                 // ends the operation
 *
 * Memory is given back (the tenant uncharged, the release hook run) exactly
 * once, when the session has left the OPEN state *and* no operation is in
 * flight; the struct itself lives until its last reference is dropped.
 */
#ifndef TQKVD_SESSION_H
#define TQKVD_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "tenant.h"
#include "tq_codec.h"

/* Values match tqkv.v1.SessionState. */
enum session_state {
	SESSION_OPEN = 1,
	SESSION_EVICTED = 2,
	SESSION_CLOSING = 3,
};

/* Bounds on a session's geometry (head_dim: tq_dim_check). */
#define SESSION_MAX_LAYERS     1024
#define SESSION_MAX_KV_HEADS   1024
#define SESSION_MAX_Q_HEADS    8192
#define SESSION_MAX_TOKENS     (UINT64_C(1) << 32)

struct session_geom {
	uint32_t n_layers;
	uint32_t n_kv_heads;
	uint32_t n_q_heads;          /* a multiple of n_kv_heads (GQA groups) */
	uint32_t head_dim;
	enum tq_codec_id k_codec;
	enum tq_codec_id v_codec;
	uint64_t max_tokens;
	uint32_t kv_xform;           /* TQ_XF_* transforms of each layer's K/V   */
				     /* (kernels/tq_xform.h); 0: none            */
};

/* An operation's wait for memory (session_admit_begin). */
struct session_wait {
	uint64_t since_us;           /* CLOCK_MONOTONIC; 0: no wait                      */
	uint64_t bytes;              /* what it asks for                                 */
	bool at_limit;               /* room under its tenant's limit (reclaim_charge),  */
	                             /* else pool pages (reclaim_admit)                  */
	bool stuck;                  /* its last try got nothing and met sessions whose  */
	                             /* operations hold pages it could take: it waits    */
	                             /* for them (cleared when a try begins)             */
};

struct session_info {
	uint64_t id;
	char name[CONFIG_NAME_MAX];  /* "" when the client chose none */
	char tenant[CONFIG_NAME_MAX];
	uint32_t owner_uid;
	struct session_geom geom;
	uint64_t seed;
	uint64_t bytes_per_token;    /* all layers, K and V */
	uint64_t tokens;
	uint64_t resident_bytes;
	uint64_t spilled_bytes;
	uint64_t created_ms;         /* session_clock_ms() (a restored session: its manifest's) */
	uint64_t last_access_ms;     /* session_clock_ms() */
	enum session_state state;
	bool persistent;             /* survives restarts (SESSION_PERSISTENT) */
	uint32_t evict_reason;       /* EVICTED: enum tqkv_evict_reason */
	char evict_why[200];         /* EVICTED: the reason in words ("" if none given) */
	struct session_wait wait;    /* its operation's wait for memory, if any          */
};

struct session_stats {
	uint32_t open, evicted;
	uint64_t opened_total, closed_total, evictions_total;
};

struct session;
struct session_table;

/* Called once per session when its memory must go (see above); runs on
 * the thread that triggered it, with no session-table lock held. */
typedef void (*session_release_fn)(void *ctx, struct session *s);
/* Called when a close or an eviction is answered while an operation still
 * holds the session, so that its release comes later, on that operation's
 * thread: what must be durable before the answer is done here (the
 * daemon marks a persistent session's files closed, so that a crash in
 * between does not bring it back).  Once per session (an eviction, then a
 * close while still held: at the eviction); never when the release runs
 * at once.  Runs on the closing thread with the release context and no
 * lock of the session table's (the caller's own may be held: reclaim
 * evicts while an append waits for pages); the release waits for it. */
typedef void (*session_ending_fn)(void *ctx, struct session *s);

/* Persists that ids up to `through` may be handed out: 0, or a negative
 * errno (the open that needed it then fails with why set).  Called once
 * per SESSION_ID_BLOCK ids, one call at a time, without the table's lock
 * (it fsyncs; every data operation takes that lock). */
typedef int (*session_reserve_fn)(void *ctx, uint64_t through, char *why, size_t whylen);
#define SESSION_ID_BLOCK 1024

/* Ids start at 1 and are never persisted unless session_table_set_ids()
 * gives the table a source (the daemon's idstore). */
int session_table_new(struct session_table **out, uint32_t max_sessions,
		      session_release_fn release, void *release_ctx);
void session_table_set_ending(struct session_table *st, session_ending_fn ending);
/* Closes every session; no operation may be in flight. */
void session_table_free(struct session_table *st);
/* max_per_uid: sessions one owner may hold (0: max_sessions). */
void session_table_set_max(struct session_table *st, uint32_t max_sessions, uint32_t max_per_uid);
/* New ids from above id on (recovery: sessions set aside keep theirs). */
void session_table_ids_above(struct session_table *st, uint64_t id);
/* Before the first open: ids continue at first_id; reserve() is called
 * before any id beyond the last reservation is handed out, so an id is
 * never handed out twice, across restarts too. */
void session_table_set_ids(struct session_table *st, uint64_t first_id,
			   session_reserve_fn reserve, void *ctx);
void session_table_stats(struct session_table *st, struct session_stats *out);

/* Check a geometry: 0 and *bytes_per_token, or -EINVAL / -EOVERFLOW with
 * the reason in why.  Codecs come from kernels/tq_codec.h. */
int session_geom_check(const struct session_geom *g, uint64_t *bytes_per_token,
		       char *why, size_t whylen);

/* Flags at open. */
#define SESSION_PERSISTENT 0x1u  /* kept on disk across restarts; never idle-expired */

/* Admit a session.  name may be "" (none) and must be unique in the tenant.
 * -EINVAL (geometry, name; why says what), -EEXIST (name taken),
 * -EUSERS (max_sessions or the owner's max_per_uid reached), -ENOSPC
 * (max_tokens would not fit in the tenant's limit even alone), or the
 * reserve hook's error (ids could not be persisted). */
int session_open(struct session_table *st, struct tenant *t, const char *name, uid_t owner,
		 const struct session_geom *g, uint64_t seed, unsigned flags, uint64_t now_ms,
		 struct session_info *out, char *why, size_t whylen);
/* Recovery (a persistent session found on disk at start): admit it under
 * its own id, created_ms and flags, with no limit on counts (it existed
 * already).  -EEXIST (id or name taken), -EINVAL (geometry, name).  Ids
 * handed out later are above it. */
int session_adopt(struct session_table *st, struct tenant *t, const char *name, uid_t owner,
		  const struct session_geom *g, uint64_t seed, unsigned flags, uint64_t id,
		  uint64_t created_ms, uint64_t now_ms, char *why, size_t whylen);
int session_get_info(struct session_table *st, uint64_t id, struct session_info *out);
/* All sessions (of tenant t, or all when NULL), by id; *out is malloc'd. */
int session_list(struct session_table *st, const struct tenant *t,
		 struct session_info **out, size_t *n);
/* -ENOENT, -EALREADY (already evicted), -ESHUTDOWN (closing).  An
 * operator's eviction (TQKV_EVICT_OPERATOR). */
int session_evict(struct session_table *st, uint64_t id, struct session_info *out);
/* pool.pressure_action = evict (TQKV_EVICT_PRESSURE, with why in words,
 * which the owner's next call and GetSession report): the same, but
 * -EBUSY while the session is waiting for memory itself
 * (session_admit_begin): two sessions waiting on a full pool would evict
 * each other, and neither one's memory comes back until both give up. */
int session_evict_pressure(struct session_table *st, uint64_t id, const char *why, struct session_info *out);
/* (Both fill *out, when not NULL, unless -ENOENT: as the session is after.) */
/* The reason of an evicted session (TQKV_EVICT_UNKNOWN if not evicted). */
uint32_t session_evict_reason(struct session_table *st, uint64_t id);
/* Removes the session; *released = the bytes it held.  -ENOENT. */
int session_close(struct session_table *st, uint64_t id, uint64_t *released);
/* Idle handling: OPEN sessions idle for ttl are evicted (never persistent
 * ones: they last until closed), EVICTED ones
 * idle for another ttl are closed.  Returns how many changed. */
uint32_t session_table_expire(struct session_table *st, uint64_t now_ms, uint64_t ttl_ms);

/* ---- the data path --------------------------------------------------------- */
/* The clock of session times (opened, last access, evicted, idle expiry):
 * milliseconds since the epoch, but on CLOCK_BOOTTIME (CLOCK_MONOTONIC
 * that counts suspended time too), aligned with the wall clock at the
 * first call (main calls it at start).  A wall-clock step (NTP, an
 * operator's date) neither evicts every idle session at once nor stops
 * idle expiry for the length of a backward step; the times shown drift
 * from the wall clock by the steps since tqkvd started. */
uint64_t session_clock_ms(void);
/* now_ms 0: housekeeping (checkpoints), last_access_ms stays as it is. */
int session_acquire(struct session_table *st, uint64_t id, uint64_t now_ms, struct session **out);
void session_release(struct session *s);
/* Charge bytes to the tenant and the session: 0, -ENOSPC, or -ESTALE when
 * the session was evicted or closed meanwhile.  Only inside an operation. */
int session_charge(struct session *s, uint64_t bytes);
void session_uncharge(struct session *s, uint64_t bytes);
/* An operation waiting for memory (pool pages: reclaim_admit; room under
 * its tenant's limit: reclaim_charge, at_limit) brackets the wait and says
 * since when (CLOCK_MONOTONIC us, > 0) and for how many bytes, and
 * session_admit_stuck whether it waits for pages operations hold
 * (session_info.wait, session_wait_get: the later of two waiters that
 * could take each other's pages gives way, reclaim.c): meanwhile pressure
 * does not evict the session (session_evict_pressure).  One at a time in
 * practice (the operation holds the session's kv->lock); waits that
 * overlapped would keep the first one's mark until the last ended. */
void session_admit_begin(struct session *s, uint64_t since_us, bool at_limit, uint64_t bytes);
void session_admit_stuck(struct session *s, bool stuck);
/* The wait's mark now (since_us 0: none). */
void session_wait_get(struct session *s, struct session_wait *out);
void session_admit_end(struct session *s);
/* Still OPEN?  An operation that waits learns it was evicted or closed. */
bool session_is_open(struct session *s);
/* Sessions evicted or closed while an operation held them whose memory
 * has not come back yet (it does when the operation returns). */
uint32_t session_table_pending_release(struct session_table *st);
/* The spill tier's transitions: resident -> spilled (the tenant is
 * uncharged: a spilled page holds no pool memory), spilled -> resident
 * (charged again: -ENOSPC over the tenant's limit, nothing moved), and
 * spilled bytes dropped (truncated, or lost to a failed check). */
void session_spill_move(struct session *s, uint64_t bytes);
int session_restore_move(struct session *s, uint64_t bytes);
void session_unspill(struct session *s, uint64_t bytes);
/* Recovery: bytes the session holds in the spill tier from the start. */
void session_add_spilled(struct session *s, uint64_t bytes);
/* The session's length: its longest layer's token count. */
void session_set_tokens(struct session *s, uint64_t n);
uint64_t session_id(const struct session *s);
uint64_t session_seed(const struct session *s);
const struct session_geom *session_geom(const struct session *s);
struct tenant *session_tenant(const struct session *s);
bool session_persistent(const struct session *s);
void session_info_of(struct session *s, struct session_info *out);

#endif
