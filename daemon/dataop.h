/* dataop.h — the data-path operations on a session's compressed KV cache:
 * append, attend, truncate, and the per-session page tables they work on.
 *
 * A kvstore maps session id -> KV state: per layer a page table in the
 * layout of kernels/tq_page.h (the attention kernel reads it as is), the
 * layer's token count, and the layer's K and V codecs, created on first use
 * with rotation seeds tqkv_seed_derive(session seed, layer, 0 = K / 1 = V)
 * (proto/tqkv_ring.h).  Every page is charged to the session's tenant
 * (session_charge) before it is taken from the pool; truncation gives pages
 * back and uncharges them; the session table's release hook
 * (kvstore_release) gives back the rest — the session module uncharges
 * those bytes itself.
 *
 * Calling contract: every dataop_* call runs inside a session operation
 * (session_acquire .. session_release by the caller), which keeps the
 * release hook away while it runs.  Calls on one session are serialized by
 * the session's KV lock; calls on different sessions run in parallel.
 * Inputs are pointers the ring server has bounds-checked; queries and
 * positions are copied into the worker's scratch before they are checked.
 * Nothing here logs: the result carries a tqkv_status, a detail index and,
 * for internal errors, a message.
 */
#ifndef TQKVD_DATAOP_H
#define TQKVD_DATAOP_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"
#include "session.h"
#include "tq_attn.h"
#include "tq_codec.h"

struct kvstore;

/* Worker-private scratch: one per worker thread, never shared. */
/* Bounds on a worker's scratch: one ATTEND runs its queries in passes whose
 * query copy and attention workspace fit the CHUNK sizes, and a worker
 * keeps at most DATAOP_WS_KEEP between operations (the rest is unmapped). */
#define DATAOP_Q_CHUNK_BYTES  ((size_t)4 << 20)
#define DATAOP_WS_CHUNK_BYTES ((size_t)16 << 20)
#define DATAOP_WS_KEEP        ((size_t)8 << 20)
/* A decode step's transformed K/V on a GPU pool: up to 16 tokens of 8 KV
 * heads of d 256 in one registered buffer per worker (more are staged). */
#define DATAOP_XPIN_BYTES     ((size_t)256 << 10)
/* An append's transformed K/V on a GPU pool otherwise: passes of at most
 * this many bytes (so one APPEND of many tokens allocates no more). */
#define DATAOP_XF_PASS_BYTES  ((size_t)4 << 20)

struct dataop_ws {
	tq_threads *threads;     /* attention pool of this worker (NULL: caller only) */
	void *attn;              /* tq_attend workspace                                */
	size_t attn_bytes;
	void *q;                 /* private copy of the queries                        */
	size_t q_bytes;
	int32_t *pos;            /* private copy of the positions                      */
	size_t pos_bytes;
	float *qx;               /* the queries through the layer's transform          */
	size_t qx_bytes;
	/* a GPU pool's decode step: the K/V through the layer's transform, in
	 * DATAOP_XPIN_BYTES registered with xpin_pool (dataop.c: ws_xpin) */
	float *xpin;
	struct pool *xpin_pool;
	int xpin_failed;         /* its registration was refused: not tried again      */
};

struct dataop_res {
	int res;                 /* 0 / count, or negative errno                       */
	uint32_t status;         /* enum tqkv_status                                   */
	uint32_t detail;         /* offending token / query index where one applies    */
	uint64_t n_tokens;       /* the layer's length after the operation             */
	char msg[256];           /* TQKV_ST_INTERNAL: what failed                      */
};

struct kvstore_stats {
	uint32_t sessions;       /* sessions with KV state                             */
	uint64_t pages;          /* pages they hold (resident or spilled)              */
	uint64_t spilled_pages;  /* of which in spill slots                            */
	uint64_t tokens;         /* sum over sessions of the longest layer             */
};

int kvstore_new(struct kvstore **out, struct pool *pool, tq_cache *cache);
/* Gives back the pages of every session still present. */
void kvstore_free(struct kvstore *ks);
/* The session release hook (session_release_fn): frees the session's KV
 * state and returns its pages to the pool. */
void kvstore_release(void *ks, struct session *s);
/* The session table's ending hook (session_ending_fn). */
void kvstore_ending(void *ks, struct session *s);
void kvstore_stats(struct kvstore *ks, struct kvstore_stats *out);
/* The pool the store's pages come from. */
struct pool *kvstore_pool(struct kvstore *ks);

/* ---- the spill tier's hooks (daemon/spill.h holds the store) -------------------
 * A page is resident, being written, spilled, being read back, or lost (its
 * copy failed its checks).  Every transition happens under the session's
 * operation lock, so pages an operation uses can never be spilled under
 * it; other sessions run meanwhile.  An append or attend on a layer with
 * spilled pages restores them first (TENANT_LIMIT, POOL_FULL, SPILL_IO or
 * DATA_LOSS when it cannot).  A spilled page gives its pool page back and
 * its bytes move from the session's resident_bytes (and the tenant's use)
 * to spilled_bytes. */
struct spill;
void kvstore_set_spill(struct kvstore *ks, struct spill *sp);
/* Spill at least `want` bytes of s (whole pages; UINT64_MAX: all), the
 * coldest first: full pages, oldest tokens first, then the layers' tail
 * pages.  0 with *spilled (maybe less than asked: not that many resident
 * pages), or a negative errno with why when nothing could be spilled
 * (-ENOSPC: the tier is full; -EIO). */
int dataop_spill(struct kvstore *ks, struct session *s, uint64_t want, uint64_t *spilled,
		 char *why, size_t whylen);
/* The same in two steps, so that several sessions' writes are in flight
 * together (the reclaimer's way): start takes the session's lock
 * (-EBUSY at once when an operation holds it), chooses the pages and
 * submits their writes; finish waits for them, lets the written pages
 * go, unlocks and frees op.  Between the two the caller keeps its
 * session reference.  Errors as dataop_spill's, from either step. */
struct dataop_spill_op;
int dataop_spill_start(struct kvstore *ks, struct session *s, uint64_t want, struct dataop_spill_op **op,
		       char *why, size_t whylen);
int dataop_spill_finish(struct dataop_spill_op *op, uint64_t *spilled, char *why, size_t whylen);
/* Non-zero (-ENOSPC: the tier filled up) when start chose fewer pages
 * than asked because it could go no further: start no other session. */
int dataop_spill_stopped(const struct dataop_spill_op *op);
/* Where allocations go when the pool is full (reclaim_admit); NULL: they
 * fail at once with POOL_FULL. */
struct reclaim;
void kvstore_set_reclaim(struct kvstore *ks, struct reclaim *rc);
/* Restore every spilled page of s: 0, or the first error with why. */
int dataop_restore(struct kvstore *ks, struct session *s, char *why, size_t whylen);
/* The same as a ring operation (PREFETCH): the first failure in r. */
void dataop_prefetch(struct kvstore *ks, struct session *s, struct dataop_res *r);
/* Tokens a page of session id's pages holds, or 0 when it has no KV state
 * yet (a persistent session written by another kind of pool keeps its
 * own number: dataop_kv_get_paged). */
uint32_t dataop_session_page_tokens(struct kvstore *ks, uint64_t id);
/* Tokens per page of page_bytes for a geometry (the most that fit with the
 * K and V regions rounded up to TQ_PAGE_ALIGN, cut to a multiple of align
 * where at least align fit: pool_page_tokens_align, 0 for any): > 0, or
 * -E2BIG when one token of all KV heads does not fit a page, -EINVAL on a
 * bad geometry.  A pure function: tests use it to lay out a reference
 * cache. */
int dataop_page_tokens(uint32_t page_bytes, uint32_t align, const struct session_geom *g);
/* The smallest pool.page_bytes (a multiple of 4 KiB) whose pages hold
 * `tokens` tokens of geometry g. */
uint64_t dataop_page_bytes_min(uint32_t tokens, const struct session_geom *g);

/* Append n tokens to `layer`.  k, v: [n][n_kv_heads][head_dim] of dtype.
 * All or nothing: on any error the layer is as before. */
void dataop_append(struct kvstore *ks, struct session *s, uint32_t layer, const void *k,
		   const void *v, enum tq_dtype dtype, uint32_t n, struct dataop_res *r);

/* Causal attention for n_q queries over `layer`, optionally after
 * appending n_append tokens (k, v as above; n_append = 0: plain attend).
 * q: [n_q][n_q_heads][head_dim] of dtype; pos: [n_q] int32 (unaligned
 * allowed), each < the layer's length after the append; out:
 * [n_q][n_q_heads][head_dim] fp32.  Queries and positions are checked
 * before anything is appended.  The queries go through the kernel in passes
 * (scratch bounded by the DATAOP_* sizes above) whose answers are the bits
 * of one call over all of them.  Logits beyond float range (finite inputs
 * can overflow) fail the operation with TQKV_ST_NONFINITE, detail = the
 * first such query; `out` then holds no meaning. */
void dataop_attend(struct kvstore *ks, struct session *s, struct dataop_ws *ws, uint32_t layer,
		   const void *k, const void *v, uint32_t n_append, const void *q,
		   const void *pos, uint32_t n_q, enum tq_dtype dtype, float *out,
		   struct dataop_res *r);

/* Drop tokens at positions >= pos of `layer`, or of every layer when
 * all_layers (then layer is ignored).  Pages no longer needed go back. */
void dataop_truncate(struct kvstore *ks, struct session *s, uint32_t layer, int all_layers,
		     uint64_t pos, struct dataop_res *r);

void dataop_ws_free(struct dataop_ws *ws);

/* The K/V transforms of each layer (kernels/tq_xform.h): out[n_layers],
 * zeros for layers never appended to.  Inside session_acquire/release
 * (now_ms 0 leaves the session's last access as it is).  0, -ENOENT (the
 * session holds no data yet: every entry zero), -EBUSY (an operation held
 * the session longer than DATAOP_XF_WAIT_MS), -EINVAL (n_layers is not
 * the session's). */
#define DATAOP_XF_WAIT_MS 200

struct tq_xf_summary;
int dataop_xf_summary(struct kvstore *ks, struct session *s, struct tq_xf_summary *out, uint32_t n_layers);

#endif
