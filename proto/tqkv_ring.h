/* tqkv_ring.h — the data-path ABI between tqkvd and libtqkv, defined once.
 *
 * C only (daemon, client, tests): fixed-width types, inline helpers and
 * static_asserts.  Every layout below is little-endian and versioned by
 * TQKV_RING_VERSION; a change that moves a field bumps the major number.
 *
 * A client owns one memfd, sealed against shrinking and growing, laid out as
 *
 *   offset 0                         struct tqkv_ring_hdr   (TQKV_RING_HDR_BYTES)
 *   offset sq_off = HDR_BYTES        struct tqkv_sqe [sq_entries]
 *   offset cq_off                    struct tqkv_cqe [cq_entries]
 *   offset arena_off (page-aligned)  the data arena [arena_bytes]
 *   total = arena_off + arena_bytes (tqkv_ring_layout() computes it)
 *
 * Both queues are single-producer / single-consumer rings of free-running
 * uint32 indices (entry = index & (entries - 1)).  The SQ is produced by the
 * client and consumed by the daemon; the CQ the other way round.  The daemon
 * never trusts a word the client can write: it keeps its own copy of every
 * index it produces or consumes, copies each SQE out before looking at it,
 * and bounds-checks every offset and length against the arena.
 *
 * Doorbells are futexes on the index words themselves (shared, not
 * FUTEX_PRIVATE): the daemon sleeps on sq_tail after setting sq_sleeping, the
 * client on cq_tail after setting cq_waiting; each side wakes the other
 * after publishing an index when the other's flag is set.
 *
 * The handshake over unix:<run_dir>/data.sock (SOCK_SEQPACKET): the client
 * sends struct tqkv_hello with the memfd in SCM_RIGHTS; the daemon answers
 * struct tqkv_welcome.  The connection stays open; its EOF ends the client.
 */
#ifndef TQKV_RING_H
#define TQKV_RING_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#define TQKV_RING_MAGIC         UINT64_C(0x474e49525f564b51) /* "QKV_RING" */
#define TQKV_RING_VERSION_MAJOR 1u
#define TQKV_RING_VERSION_MINOR 3u  /* 1.3: TQKV_ST_EVICTED's detail is an enum tqkv_evict_reason */
#define TQKV_RING_VERSION       ((TQKV_RING_VERSION_MAJOR << 16) | TQKV_RING_VERSION_MINOR)
#define TQKV_DATA_SOCK          "data.sock"

#define TQKV_RING_HDR_BYTES     4096u
#define TQKV_RING_ALIGN         4096u           /* arena_off alignment */
#define TQKV_SQ_ENTRIES_MIN     1u
#define TQKV_SQ_ENTRIES_MAX     4096u           /* power of two */
#define TQKV_CQ_ENTRIES_MAX     8192u           /* power of two, >= sq_entries */
#define TQKV_ARENA_BYTES_MAX    (UINT64_C(1) << 32) /* 4 GiB per connection */
#define TQKV_CACHELINE          64u

/* ---- header --------------------------------------------------------------
 * Line 0 is written by the client before the handshake and read once by the
 * daemon (which recomputes and checks it).  Each later line has one writer. */
struct tqkv_ring_hdr {
	/* line 0: geometry (client, before the handshake) */
	uint64_t magic;          /* TQKV_RING_MAGIC */
	uint32_t version;        /* TQKV_RING_VERSION */
	uint32_t hdr_bytes;      /* TQKV_RING_HDR_BYTES */
	uint32_t sq_entries;
	uint32_t cq_entries;
	uint64_t sq_off;
	uint64_t cq_off;
	uint64_t arena_off;
	uint64_t arena_bytes;
	uint64_t total_bytes;
	/* line 1: client writes */
	uint32_t sq_tail __attribute__((aligned(TQKV_CACHELINE))); /* futex: the daemon sleeps here */
	/* line 2: daemon writes */
	uint32_t sq_head __attribute__((aligned(TQKV_CACHELINE))); /* SQEs the daemon has taken */
	uint32_t sq_sleeping;    /* 1: the daemon may be asleep on sq_tail */
	/* line 3: daemon writes */
	uint32_t cq_tail __attribute__((aligned(TQKV_CACHELINE))); /* futex: the client sleeps here */
	/* line 4: client writes */
	uint32_t cq_head __attribute__((aligned(TQKV_CACHELINE))); /* CQEs the client has consumed */
	uint32_t cq_waiting;     /* 1: the client may be asleep on cq_tail */
	/* line 5: daemon writes */
	uint32_t state __attribute__((aligned(TQKV_CACHELINE))); /* enum tqkv_ring_state */
	uint32_t state_status;   /* enum tqkv_status: why the ring stopped */
	uint8_t  pad[TQKV_RING_HDR_BYTES - 6 * TQKV_CACHELINE];
};

enum tqkv_ring_state {
	TQKV_RING_LIVE = 0,
	TQKV_RING_BROKEN = 1,    /* the daemon stopped reading this ring (corrupt index) */
	TQKV_RING_SHUTDOWN = 2,  /* the daemon is stopping */
};

/* ---- opcodes (append-only; never renumber) -------------------------------- */
enum tqkv_op {
	TQKV_OP_NOP = 0,           /* completes at once: latency probe               */
	TQKV_OP_ATTACH = 1,        /* bind `session` to this connection               */
	TQKV_OP_DETACH = 2,        /* unbind it (the session stays open)              */
	TQKV_OP_APPEND = 3,        /* K, V of n_tokens tokens for `layer`             */
	TQKV_OP_ATTEND = 4,        /* n_q queries at positions for `layer`, causal    */
	TQKV_OP_APPEND_ATTEND = 5, /* APPEND then ATTEND in one round trip            */
	TQKV_OP_TRUNCATE = 6,      /* drop tokens at positions >= pos                 */
	TQKV_OP_CLOSE = 7,         /* close the session (in order after its queued    */
				   /* operations; completes even if the client leaves) */
	TQKV_OP_PREFETCH = 8,      /* read the session's spilled pages back now, so   */
				   /* its next operations find them resident        */
	TQKV_OP__COUNT
};

/* SQE flags */
#define TQKV_SQE_EPHEMERAL  0x0001u /* ATTACH: close the session with this connection */
#define TQKV_SQE_ALL_LAYERS 0x0002u /* TRUNCATE: every layer (layer must be 0)        */
#define TQKV_SQE_FLAGS_ALL  0x0003u

/* ---- submission queue entry (128 bytes) ---------------------------------------
 * Data lives in the client's arena at the given byte offsets:
 *   K, V:  [n_tokens][n_kv_heads][head_dim] of dtype (K after RoPE)
 *   Q:     [n_q][n_q_heads][head_dim] of dtype
 *   pos:   [n_q] int32 absolute positions, each < the layer's length after
 *          the append (query i sees keys 0..pos[i])
 *   out:   [n_q][n_q_heads][head_dim] float32, written by the daemon (after a
 *          failed operation its contents are unspecified)
 * Offsets are aligned to their element size.  Unused fields and `reserved`
 * must be zero. */
struct tqkv_sqe {
	uint8_t  opcode;         /* enum tqkv_op */
	uint8_t  dtype;          /* enum tq_dtype of K, V and Q: 0 f32, 1 f16, 2 bf16 */
	uint16_t flags;          /* TQKV_SQE_* */
	uint32_t layer;
	uint64_t user_data;      /* returned in the CQE */
	uint64_t session;        /* session id from OpenSession */
	uint32_t n_tokens;       /* APPEND: tokens to append */
	uint32_t n_q;            /* ATTEND: query tokens */
	uint64_t k_off;
	uint64_t v_off;
	uint64_t q_off;
	uint64_t pos_off;
	uint64_t out_off;
	uint64_t pos;            /* TRUNCATE: first position dropped */
	uint64_t reserved[6];
};

/* ---- completion queue entry (32 bytes) ------------------------------------ */
struct tqkv_cqe {
	uint64_t user_data;
	int32_t  res;            /* >= 0 on success, else a negative errno */
	uint16_t status;         /* enum tqkv_status: the precise reason */
	uint16_t flags;          /* 0 */
	uint64_t n_tokens;       /* the layer's length after the operation */
	uint32_t detail;         /* status-specific: offending token/query index, … */
	uint32_t reserved;
};

/* ---- status codes (append-only) ------------------------------------------- */
enum tqkv_status {
	TQKV_ST_OK = 0,
	TQKV_ST_BAD_OPCODE = 1,      /* -EINVAL   unknown opcode                            */
	TQKV_ST_BAD_FIELD = 2,       /* -EINVAL   flags, reserved or unused field not zero  */
	TQKV_ST_BAD_RANGE = 3,       /* -EFAULT   offset/length outside the arena           */
	TQKV_ST_BAD_ALIGN = 4,       /* -EFAULT   offset not aligned to its element size    */
	TQKV_ST_BAD_DTYPE = 5,       /* -EINVAL   dtype not f32/f16/bf16                    */
	TQKV_ST_BAD_LAYER = 6,       /* -EINVAL   layer >= n_layers                         */
	TQKV_ST_BAD_COUNT = 7,       /* -EINVAL   n_tokens / n_q zero or too large          */
	TQKV_ST_NO_SESSION = 8,      /* -ENOENT   no such session                           */
	TQKV_ST_NOT_ATTACHED = 9,    /* -EBADF    session not attached to this connection   */
	TQKV_ST_NOT_OWNER = 10,      /* -EPERM    session belongs to another uid            */
	TQKV_ST_ATTACHED_ELSEWHERE = 11, /* -EBUSY session attached to another connection   */
	TQKV_ST_NONFINITE = 12,      /* -EINVAL   NaN/Inf (or beyond fp16) in K, V or Q     */
	TQKV_ST_BAD_POSITION = 13,   /* -EINVAL   query position outside [0, length)        */
	TQKV_ST_TENANT_LIMIT = 14,   /* -ENOSPC   the tenant's limit would be exceeded      */
	TQKV_ST_POOL_FULL = 15,      /* -ENOSPC   no free page in the pool                  */
	TQKV_ST_MAX_TOKENS = 16,     /* -ENOSPC   the session's max_tokens would be exceeded */
	TQKV_ST_EVICTED = 17,        /* -ESTALE   the session was evicted                   */
	TQKV_ST_CLOSING = 18,        /* -ESHUTDOWN session closing or daemon stopping       */
	TQKV_ST_NOMEM = 19,          /* -ENOMEM   daemon out of memory                      */
	TQKV_ST_INTERNAL = 20,       /* kernel error (the daemon logs it)                   */
	TQKV_ST_RING_CORRUPT = 21,   /* -EPROTO   the client's SQ/CQ indices are inconsistent */
	TQKV_ST_TOO_MANY_SESSIONS = 22, /* -EUSERS too many sessions attached here          */
	TQKV_ST_GEOMETRY = 23,       /* -E2BIG    one token of all KV heads exceeds a pool page */
	TQKV_ST_DATA_LOSS = 24,      /* -EBADMSG  a spilled page failed its checks: lost    */
	TQKV_ST_SPILL_IO = 25,       /* -EIO      the spill tier could not read or write    */
	TQKV_ST_DEVICE_LOST = 26,    /* -ENOTRECOVERABLE the pool's GPU failed (its CUDA   */
				     /* context is lost); tqkvd stops, for systemd to     */
				     /* restart it (persistent sessions come back)        */
	TQKV_ST__COUNT
};

/* TQKV_ST_EVICTED: the CQE's detail says who evicted the session (the
 * daemon's log and GetSession give the full reason). */
enum tqkv_evict_reason {
	TQKV_EVICT_UNKNOWN = 0,
	TQKV_EVICT_OPERATOR = 1,     /* tqctl evict (EvictSession)                        */
	TQKV_EVICT_IDLE = 2,         /* idle past daemon.session_idle_ttl                  */
	TQKV_EVICT_PRESSURE = 3,     /* a full pool with nothing to spill, pool.pressure_action = evict */
	TQKV_EVICT__COUNT
};

static inline const char *tqkv_evict_reason_str(uint32_t r)
{
	static const char *const s[TQKV_EVICT__COUNT] = {
		[TQKV_EVICT_UNKNOWN] = "evicted",
		[TQKV_EVICT_OPERATOR] = "evicted by an operator",
		[TQKV_EVICT_IDLE] = "evicted after being idle past the daemon's session_idle_ttl",
		[TQKV_EVICT_PRESSURE] = "evicted under memory pressure (the pool was full and nothing could be spilled)",
	};
	return r < TQKV_EVICT__COUNT ? s[r] : "evicted";
}


static inline const char *tqkv_status_str(uint32_t st)
{
	static const char *const s[TQKV_ST__COUNT] = {
		[TQKV_ST_OK] = "ok",
		[TQKV_ST_BAD_OPCODE] = "unknown opcode",
		[TQKV_ST_BAD_FIELD] = "flags, reserved or unused field not zero",
		[TQKV_ST_BAD_RANGE] = "offset or length outside the client's arena",
		[TQKV_ST_BAD_ALIGN] = "offset not aligned to its element size",
		[TQKV_ST_BAD_DTYPE] = "dtype is not f32, f16 or bf16",
		[TQKV_ST_BAD_LAYER] = "layer out of range",
		[TQKV_ST_BAD_COUNT] = "token or query count zero or too large",
		[TQKV_ST_NO_SESSION] = "no such session",
		[TQKV_ST_NOT_ATTACHED] = "session not attached to this connection",
		[TQKV_ST_NOT_OWNER] = "session belongs to another user",
		[TQKV_ST_ATTACHED_ELSEWHERE] = "session attached to another connection",
		[TQKV_ST_NONFINITE] = "NaN, Inf or out-of-range value in the data",
		[TQKV_ST_BAD_POSITION] = "query position outside the layer's tokens",
		[TQKV_ST_TENANT_LIMIT] = "tenant memory limit reached",
		[TQKV_ST_POOL_FULL] = "memory pool full",
		[TQKV_ST_MAX_TOKENS] = "session max_tokens reached",
		[TQKV_ST_EVICTED] = "session was evicted",
		[TQKV_ST_CLOSING] = "session closing or daemon stopping",
		[TQKV_ST_NOMEM] = "daemon out of memory",
		[TQKV_ST_INTERNAL] = "internal error (see the daemon log)",
		[TQKV_ST_RING_CORRUPT] = "ring indices corrupted; the daemon stopped this ring",
		[TQKV_ST_TOO_MANY_SESSIONS] = "too many sessions attached to this connection",
		[TQKV_ST_GEOMETRY] = "one token of all KV heads does not fit a pool page",
		[TQKV_ST_DATA_LOSS] = "a spilled page failed its checks: its tokens are lost",
		[TQKV_ST_SPILL_IO] = "the spill tier could not read or write a page",
		[TQKV_ST_DEVICE_LOST] = "the pool's GPU failed (its context is lost): tqkvd is restarting",
	};
	return st < TQKV_ST__COUNT && s[st] ? s[st] : "unknown status";
}

/* ---- handshake messages (SOCK_SEQPACKET, one message each way) ----------- */
struct tqkv_hello {
	uint64_t magic;          /* TQKV_RING_MAGIC */
	uint32_t version;        /* TQKV_RING_VERSION */
	uint32_t flags;          /* 0 */
	uint32_t sq_entries;
	uint32_t cq_entries;
	uint64_t arena_bytes;
	uint64_t total_bytes;    /* size of the memfd sent with this message */
	uint64_t reserved[3];
};

struct tqkv_welcome {
	uint64_t magic;
	uint32_t version;        /* the daemon's TQKV_RING_VERSION */
	int32_t  res;            /* 0, or a negative errno (then msg says why) */
	uint64_t client_id;
	uint32_t max_sessions;   /* sessions one connection may attach */
	uint32_t max_tokens_per_op;
	char     msg[96];
};

#define TQKV_MAX_ATTACHED      1024u    /* sessions attached to one connection */
#define TQKV_MAX_TOKENS_PER_OP 65536u   /* n_tokens and n_q per SQE */

/* ---- layout ---------------------------------------------------------------- */
struct tqkv_ring_layout {
	uint64_t sq_off, cq_off, arena_off, total_bytes;
};

static inline int tqkv_is_pow2(uint32_t x) { return x && !(x & (x - 1)); }

/* 0 and the layout, or -22 (EINVAL) when the sizes are out of bounds. */
static inline int tqkv_ring_layout(uint32_t sq_entries, uint32_t cq_entries, uint64_t arena_bytes,
				   struct tqkv_ring_layout *l)
{
	if (!tqkv_is_pow2(sq_entries) || sq_entries > TQKV_SQ_ENTRIES_MAX ||
	    !tqkv_is_pow2(cq_entries) || cq_entries > TQKV_CQ_ENTRIES_MAX || cq_entries < sq_entries ||
	    arena_bytes == 0 || arena_bytes > TQKV_ARENA_BYTES_MAX)
		return -22;
	l->sq_off = TQKV_RING_HDR_BYTES;
	l->cq_off = l->sq_off + (uint64_t)sq_entries * 128u;
	l->arena_off = (l->cq_off + (uint64_t)cq_entries * 32u + TQKV_RING_ALIGN - 1) &
		       ~(uint64_t)(TQKV_RING_ALIGN - 1);
	l->total_bytes = l->arena_off + ((arena_bytes + TQKV_RING_ALIGN - 1) & ~(uint64_t)(TQKV_RING_ALIGN - 1));
	return 0;
}

/* ---- rotation seeds ----------------------------------------------------------
 * The codecs of (layer, K or V) use rotation seed
 *   tqkv_seed_derive(session_seed, layer, kind),  kind 0 = K, 1 = V
 * = splitmix64(session_seed + 0x9E3779B97F4A7C15 * (2 * layer + kind + 1)).
 * Stable forever: spilled and persisted pages are only valid under it. */
static inline uint64_t tqkv_seed_derive(uint64_t session_seed, uint32_t layer, uint32_t kind)
{
	uint64_t z = session_seed + UINT64_C(0x9E3779B97F4A7C15) * (2 * (uint64_t)layer + kind + 1);
	z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
	return z ^ (z >> 31);
}

static_assert(sizeof(struct tqkv_ring_hdr) == TQKV_RING_HDR_BYTES, "ring header is one page");
static_assert(offsetof(struct tqkv_ring_hdr, total_bytes) == 56, "geometry fits line 0");
static_assert(offsetof(struct tqkv_ring_hdr, sq_tail) == 1 * TQKV_CACHELINE, "sq_tail on line 1");
static_assert(offsetof(struct tqkv_ring_hdr, sq_head) == 2 * TQKV_CACHELINE, "sq_head on line 2");
static_assert(offsetof(struct tqkv_ring_hdr, sq_sleeping) == 2 * TQKV_CACHELINE + 4, "sq_sleeping");
static_assert(offsetof(struct tqkv_ring_hdr, cq_tail) == 3 * TQKV_CACHELINE, "cq_tail on line 3");
static_assert(offsetof(struct tqkv_ring_hdr, cq_head) == 4 * TQKV_CACHELINE, "cq_head on line 4");
static_assert(offsetof(struct tqkv_ring_hdr, cq_waiting) == 4 * TQKV_CACHELINE + 4, "cq_waiting");
static_assert(offsetof(struct tqkv_ring_hdr, state) == 5 * TQKV_CACHELINE, "state on line 5");
static_assert(sizeof(struct tqkv_sqe) == 128, "SQE is 128 bytes");
static_assert(offsetof(struct tqkv_sqe, user_data) == 8, "sqe.user_data");
static_assert(offsetof(struct tqkv_sqe, session) == 16, "sqe.session");
static_assert(offsetof(struct tqkv_sqe, n_tokens) == 24, "sqe.n_tokens");
static_assert(offsetof(struct tqkv_sqe, k_off) == 32, "sqe.k_off");
static_assert(offsetof(struct tqkv_sqe, out_off) == 64, "sqe.out_off");
static_assert(offsetof(struct tqkv_sqe, pos) == 72, "sqe.pos");
static_assert(offsetof(struct tqkv_sqe, reserved) == 80, "sqe.reserved");
static_assert(sizeof(struct tqkv_cqe) == 32, "CQE is 32 bytes");
static_assert(offsetof(struct tqkv_cqe, res) == 8, "cqe.res");
static_assert(offsetof(struct tqkv_cqe, status) == 12, "cqe.status");
static_assert(offsetof(struct tqkv_cqe, n_tokens) == 16, "cqe.n_tokens");
static_assert(offsetof(struct tqkv_cqe, detail) == 24, "cqe.detail");
static_assert(sizeof(struct tqkv_hello) == 64, "hello is 64 bytes");
static_assert(sizeof(struct tqkv_welcome) == 128, "welcome is 128 bytes");
static_assert(TQKV_OP__COUNT == 9, "opcodes are append-only");
static_assert(TQKV_ST__COUNT == 27, "status codes are append-only");

#endif /* TQKV_RING_H */
