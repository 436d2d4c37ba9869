/* tqkv.h — libtqkv: hand an inference process's KV cache to tqkvd.
 *
 *   tqkv *c;
 *   tqkv_session *s;
 *   struct tqkv_session_params p = { .tenant = "default", .n_layers = 32,
 *       .n_kv_heads = 8, .n_q_heads = 32, .head_dim = 128, .max_tokens = 8192 };
 *   if ((r = tqkv_connect(&c, NULL)) < 0) die(tqkv_strerror(r));
 *   if ((r = tqkv_session_open(c, &p, &s)) < 0) die(tqkv_last_error());
 *   // per layer and decode step: append this token's K/V, attend with q
 *   r = tqkv_append_attend(s, layer, k, v, 1, q, &pos, 1, TQKV_F16, out);
 *   tqkv_session_close(s);
 *   tqkv_disconnect(c);
 *
 * Two channels: control (gRPC on unix:<run_dir>/control.sock) opens
 * sessions; data (a shared-memory ring handed over unix:<run_dir>/data.sock)
 * carries appends, attention and close.  Sessions opened here are ephemeral
 * — closed by the daemon when this connection ends (the process exits or
 * is killed, at any point, even inside tqkv_session_open) — unless opened
 * with TQKV_SESSION_DETACHED.  The caller needs the group of both sockets
 * (tqkvd's daemon.control_group); it may open, inspect and close only its
 * own uid's sessions.
 *
 * Shapes (row-major, dtype = the call's element type):
 *   k, v:  [n_tokens][n_kv_heads][head_dim]   K after RoPE
 *   q:     [n_q][n_q_heads][head_dim]
 *   pos:   [n_q] absolute positions; query i sees keys 0..pos[i] (causal),
 *          each < the layer's length after the call's append
 *   out:   [n_q][n_q_heads][head_dim] float
 * Appends go to the end of the layer.  Every call copies its inputs into
 * the shared arena before it returns (submit variants too), so the caller's
 * buffers may be reused at once; `out` is written by tqkv_wait().
 *
 * Errors: every function returns a negative errno on failure (0 or a count
 * on success).  tqkv_strerror() names the errno; tqkv_last_error() gives
 * the calling thread's last detailed message (the daemon's reason where
 * there is one).  The ring's precise reason for a failed operation is in
 * struct tqkv_result.status (tqkv_status_name()).
 *
 * Deadlines: every data operation has one, op_timeout_ms (default 60 s;
 * negative: none) from its submit — a submit that waited for room in the
 * ring leaves the wait what is left of it, so a synchronous call takes at
 * most that long — or tqkv_wait_timeout's, from that call.  (Libraries
 * before the TQKV_0.4 node counted tqkv_wait's from the wait, for every
 * symbol version alike.)  A submit that
 * finds no room in time returns -ETIMEDOUT with nothing submitted.  A wait
 * that passes it returns -ETIMEDOUT and the operation is abandoned: it may
 * still run in the daemon, so the session's state after it is unknown
 * (e.g. re-read the length with a truncate to a known position).  A daemon that dies is
 * noticed within about 50 ms: every call then returns -ECONNRESET (or
 * -ESHUTDOWN when it stopped in order).
 *
 * Thread safety: a tqkv connection and its sessions may be used from any
 * number of threads at once.  Operations on one session run in the order
 * they were submitted (across threads: the order of the submit calls);
 * operations on different sessions run in parallel in the daemon.  A
 * tqkv_req belongs to the thread that waits for it; wait for each exactly
 * once.  Do not use a session after tqkv_session_close/detach, or anything
 * after tqkv_disconnect.  fork(): the child must not use the parent's
 * connection, and — because gRPC does not survive fork() — must not call
 * libtqkv at all if the parent opened a connection with the control
 * channel; exec() first (TQKV_CONNECT_NO_CONTROL connections use no gRPC).
 * A child that does not exec() holds the connection's socket: the daemon
 * sees the connection end, and closes its ephemeral sessions, only when
 * every process holding it has exited, or when one of them calls
 * tqkv_disconnect (which shuts the socket down for all: a child must not
 * call it on the parent's connection).  The descriptors are close-on-exec.
 */
#ifndef TQKV_H
#define TQKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TQKV_API_VERSION 1    /* bumped on an incompatible change */

typedef struct tqkv tqkv;
typedef struct tqkv_session tqkv_session;
typedef struct tqkv_req tqkv_req;

enum tqkv_dtype {
	TQKV_F32 = 0,
	TQKV_F16 = 1,
	TQKV_BF16 = 2,
};

/* ---- connection ------------------------------------------------------------ */
#define TQKV_CONNECT_NO_CONTROL 0x1u /* data channel only: attach sessions by id with a geometry */

struct tqkv_connect_opts {
	const char *run_dir;      /* NULL: $TQKV_RUN_DIR, else "/run/tqkvd"                 */
	uint32_t queue_depth;     /* operations in flight: a power of two <= 4096 (0: 64)   */
	uint64_t arena_bytes;     /* shared data arena (0: 64 MiB, at most 4 GiB); one      */
				  /* operation's inputs and output must fit in it           */
	uint32_t flags;           /* TQKV_CONNECT_*                                          */
	int timeout_ms;           /* control calls, and connecting to the data socket       */
	                          /* with its handshake (<= 0: 10000; signals that          */
	                          /* interrupt it are waited through, not -EINTR)           */
	int op_timeout_ms;        /* data operations: submit + wait together (0: 60000,      */
	                          /* < 0: none)                                             */
				  /* (added in 0.2; a 0.1 binary gets the defaults)         */
};

/* opts may be NULL (all defaults).  -ENOENT/-ECONNREFUSED: no daemon;
 * -EPROTONOSUPPORT: ABI mismatch; tqkv_last_error() says more. */
int tqkv_connect(tqkv **out, const struct tqkv_connect_opts *opts);
/* Ends the connection: the daemon closes its ephemeral sessions.  Waits
 * for nothing; requests not yet waited for are abandoned.  NULL is fine. */
void tqkv_disconnect(tqkv *c);
/* The daemon's id for this data connection (its log lines name it). */
uint64_t tqkv_client_id(const tqkv *c);

/* ---- sessions -------------------------------------------------------------- */
#define TQKV_SESSION_DETACHED 0x1u /* survives this connection (closed, evicted or idle TTL) */
/* Kept on disk: survives a restart of the daemon, clean or killed (every
 * append is journaled before it completes); implies DETACHED; never
 * idle-expired.  After a restart, re-attach by id or by (tenant, name). */
#define TQKV_SESSION_PERSISTENT 0x2u

struct tqkv_session_params {
	const char *tenant;       /* NULL or "": "default"                                   */
	const char *name;         /* optional, unique per tenant and owner                   */
	uint32_t n_layers;
	uint32_t n_kv_heads;
	uint32_t n_q_heads;       /* a multiple of n_kv_heads                                */
	uint32_t head_dim;        /* a multiple of 8 in [8, 512]                             */
	const char *k_codec;      /* NULL: "q8"  (tq2, tq3, tq4, q8, q4a, f16, f32, tq3o, tq4o) */
	const char *v_codec;      /* NULL: "tq4"                                             */
	uint64_t max_tokens;      /* per layer                                               */
	int has_seed;             /* 0: the daemon draws the rotation seed                    */
	uint64_t seed;
	uint32_t flags;           /* TQKV_SESSION_*                                          */
	/* Transforms of each layer's K/V that attention undoes exactly, so the  */
	/* codecs lose less (the daemon's daemon.kv_transform documents them):   */
	/* NULL or "": the daemon's default; "none"; "default"; or parts joined  */
	/* by "+": k-center, k-sink, v-center, v-eq, k-eq-qk, k-eq-k, k-unshrink      */
	/* ("k-center+k-eq-qk").                                                 */
	/* k-eq-qk is calibrated from the queries of the append that fills an    */
	/* empty layer: give prefill as tqkv_append_attend, not append + attend. */
	/* -EINVAL for an unknown mode.  (Added in 0.3; a 0.1/0.2 binary gets    */
	/* the daemon's default.)                                                */
	const char *kv_transform;
};

/* Open a session (control channel) and attach it to this connection. */
int tqkv_session_open(tqkv *c, const struct tqkv_session_params *p, tqkv_session **out);
/* Attach an open session by id (same uid; not attached elsewhere).  geom:
 * its geometry (only the shape fields are used), or NULL to ask the
 * control channel.  flags: TQKV_SESSION_DETACHED or 0 (ephemeral). */
int tqkv_session_attach(tqkv *c, uint64_t id, const struct tqkv_session_params *geom,
			uint32_t flags, tqkv_session **out);
/* Attach the caller's session named `name` in `tenant` (NULL or "":
 * "default"), e.g. a worker's detached session after the worker restarted.
 * -ENOENT when there is none (control channel: -ENOTSUP without it). */
int tqkv_session_attach_name(tqkv *c, const char *tenant, const char *name, uint32_t flags,
			     tqkv_session **out);
/* Detach (the session stays open in the daemon) and free the handle. */
int tqkv_session_detach(tqkv_session *s);
/* Close the session in the daemon (its pages are freed) after the
 * operations submitted before, and free the handle.  Goes over the data
 * ring, so it works on TQKV_CONNECT_NO_CONTROL connections too; once it
 * was submitted the close completes even if this process dies. */
int tqkv_session_close(tqkv_session *s);
/* Close the caller's session `id` in the daemon without attaching it —
 * e.g. one evicted while detached, which attach refuses (-ESTALE) and which
 * would otherwise hold its name until the idle TTL drops it.  Over the
 * control channel (-ENOTSUP without it); -ENOENT when there is none, -EPERM
 * when it is another user's.  A handle to it, if any, must still be freed
 * with tqkv_session_detach (its operations then fail). */
int tqkv_session_drop(tqkv *c, uint64_t id);
uint64_t tqkv_session_id(const tqkv_session *s);
/* Ask the daemon to read the session's spilled pages back now (after the
 * operations submitted before), so later operations find them resident.
 * Returns at once: 0 when queued, or a negative errno; nothing to wait
 * for (operations restore what they need anyway). */
int tqkv_session_prefetch(tqkv_session *s);
struct tqkv_session_info {
	uint64_t id;
	uint64_t tokens;          /* the longest layer's length                              */
	uint64_t max_tokens;
	uint64_t resident_bytes;  /* in the daemon's memory pool                             */
	uint64_t spilled_bytes;   /* in its spill tier (read back on use)                    */
	int evicted;              /* the session was evicted: operations fail with -ESTALE   */
	int persistent;           /* opened with TQKV_SESSION_PERSISTENT                     */
	char kv_transform[48];    /* its K/V transforms: "k-center+k-eq-qk", "none"          */
				  /* (added in 0.3; a 0.2 binary gets the fields above)    */
};
/* The session as the daemon sees it (control channel: -ENOTSUP on a
 * TQKV_CONNECT_NO_CONTROL connection). */
int tqkv_session_info(tqkv_session *s, struct tqkv_session_info *out);
uint64_t tqkv_session_seed(const tqkv_session *s);  /* 0 when attached with a geometry */
/* A persistent session: write what changed to disk now (the daemon does
 * so every pool.checkpoint_interval anyway; a killed daemon loses nothing
 * either way — this bounds what a power loss may take).  0 or -errno:
 * -EBUSY when the session is not persistent; another error when the disk
 * failed (tqkv_last_error says how). */
int tqkv_session_checkpoint(tqkv_session *s);

/* ---- operations: blocking ---------------------------------------------------- */
/* Each returns >= 0 on success (append: the layer's new length; attend:
 * n_q; truncate: the layer's length) or a negative errno. */
int tqkv_append(tqkv_session *s, uint32_t layer, const void *k, const void *v,
		uint32_t n_tokens, enum tqkv_dtype dtype);
int tqkv_attend(tqkv_session *s, uint32_t layer, const void *q, const int32_t *pos,
		uint32_t n_q, enum tqkv_dtype dtype, float *out);
int tqkv_append_attend(tqkv_session *s, uint32_t layer, const void *k, const void *v,
		       uint32_t n_tokens, const void *q, const int32_t *pos, uint32_t n_q,
		       enum tqkv_dtype dtype, float *out);
#define TQKV_ALL_LAYERS UINT32_MAX
/* Drop tokens at positions >= pos of `layer` (or TQKV_ALL_LAYERS). */
int tqkv_truncate(tqkv_session *s, uint32_t layer, uint64_t pos);
/* A round trip through the daemon doing nothing (latency probe). */
int tqkv_nop(tqkv *c);

/* ---- operations: submit now, wait later -------------------------------------- */
struct tqkv_result {
	int res;                  /* what the blocking call would return                      */
	uint32_t status;          /* the ring's reason (tqkv_status_name), 0 = ok              */
	uint32_t detail;          /* offending token / query index where one applies           */
	uint64_t n_tokens;        /* the layer's length after the operation                    */
};

/* Each copies its inputs into the arena and queues the operation; *req is
 * waited for with tqkv_wait.  Blocks only while the queue or the arena is
 * full, op_timeout_ms at most (-ETIMEDOUT: nothing submitted).  -E2BIG: the
 * operation can never fit in the arena. */
int tqkv_submit_append(tqkv_session *s, uint32_t layer, const void *k, const void *v,
		       uint32_t n_tokens, enum tqkv_dtype dtype, tqkv_req **req);
int tqkv_submit_attend(tqkv_session *s, uint32_t layer, const void *q, const int32_t *pos,
		       uint32_t n_q, enum tqkv_dtype dtype, float *out, tqkv_req **req);
int tqkv_submit_append_attend(tqkv_session *s, uint32_t layer, const void *k, const void *v,
			      uint32_t n_tokens, const void *q, const int32_t *pos, uint32_t n_q,
			      enum tqkv_dtype dtype, float *out, tqkv_req **req);
int tqkv_submit_truncate(tqkv_session *s, uint32_t layer, uint64_t pos, tqkv_req **req);
int tqkv_submit_nop(tqkv *c, tqkv_req **req);
/* Wait for req, copy its output to the caller's `out`, free it.  Returns
 * the operation's result (res as above); r may be NULL.  Waits at most
 * until the connection's op_timeout_ms from req's submit has passed (a
 * completion that came meanwhile is still returned). */
int tqkv_wait(tqkv_req *req, struct tqkv_result *r);
/* The same with this call's own deadline: timeout_ms > 0, or
 * TQKV_WAIT_DEFAULT (tqkv_wait's), or TQKV_WAIT_FOREVER (any negative
 * value).  -ETIMEDOUT:
 * req is abandoned and freed (do not wait for it again), `out` is not
 * written; see "Deadlines" above. */
#define TQKV_WAIT_DEFAULT 0
#define TQKV_WAIT_FOREVER (-1)
int tqkv_wait_timeout(tqkv_req *req, struct tqkv_result *r, int timeout_ms);

/* ---- errors ------------------------------------------------------------------- */
const char *tqkv_strerror(int err);          /* err: a negative (or positive) errno */
const char *tqkv_status_name(uint32_t status);
/* The calling thread's last error message from this library ("" if none). */
const char *tqkv_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* TQKV_H */
