/* ring.c — the data-path server (see ring.h for the threads and the trust
 * model).
 *
 * Locking: rs->lock guards the run queue, every binding's FIFO and flags,
 * the attach map, the client list and each client's `inflight` count.
 * c->cq_lock serializes the CQ producers of one client (its ring thread and
 * the workers).  Lock order: rs->lock, then c->cq_lock; the session and
 * kvstore locks are only taken with neither held.
 */
#include "ring.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "dataop.h"
#include "log.h"
#include "pool.h"
#include "tq_size.h"
#include "tqkv_ring.h"

#define MAP_BUCKETS    1024            /* attach map; power of two */
#define SLEEP_MS       100             /* futex sleeps end at least this often */
#define LOG_BURST      5               /* client-error log lines per window */
#define LOG_WINDOW_MS  10000
#define CLIENT_STACK   (512u << 10)    /* ring threads: small stacks, many threads */

struct ring_client;

struct op {
	struct op *next;
	struct tqkv_sqe e;                 /* the private copy, validated */
	uint64_t t_queued;                 /* CLOCK_MONOTONIC ns, when queued */
};

/* A session attached to one connection. */
struct binding {
	uint64_t id;
	struct ring_client *c;
	struct session_geom geom;          /* copied at ATTACH (immutable) */
	bool ephemeral;                    /* closed with the connection */
	bool detached;                     /* DETACH or CLOSE seen: freed once idle */
	bool close_requested;              /* CLOSE seen: the session is closed in order */
	bool queued;                       /* on the run queue or running */
	struct op *head, *tail;            /* pending operations, in order */
	struct binding *rq_next;           /* run queue */
	struct binding *map_next;          /* attach map chain */
	struct binding *c_next;            /* the client's list */
};

struct ring_client {
	struct ring_server *rs;
	uint64_t id;
	int fd;
	uid_t uid;
	pid_t pid;
	pthread_t thread;
	bool thread_started;
	bool live;                         /* handshake done (set under rs->lock) */
	uint64_t arena_claim;              /* ring bytes counted against the uid (rs->lock) */
	struct ring_client *next;          /* rs->clients */

	/* the shared mapping and what the daemon copied out of it at the handshake */
	uint8_t *map;
	uint64_t map_bytes;
	bool map_pinned;             /* registered with a GPU pool's device */
	struct tqkv_ring_hdr *hdr;
	uint8_t *sq, *cq, *arena;
	uint32_t sq_entries, cq_entries;
	uint64_t arena_bytes;

	uint32_t sq_head;                  /* private: next SQE to take */
	pthread_mutex_t cq_lock;
	uint32_t cq_tail;                  /* private: next CQE to write (written under
	                                      cq_lock, read atomically without it) */

	int closing;                       /* atomic: stop taking SQEs, drop queued work */
	bool broken;                       /* ring_break: the ring is not read again */
	int done;                          /* atomic: the ring thread has finished */
	uint32_t inflight;                 /* queued + running operations: written under
	                                      rs->lock, read atomically without it */
	pthread_cond_t idle;               /* inflight reached 0 (rs->lock) */
	struct binding *bindings;          /* rs->lock */
	uint32_t n_bindings;
	uint32_t spin_ns;                  /* adaptive doorbell spin */

	/* rate-limited error log (ring thread and workers: cq_lock) */
	uint64_t log_window_ms;
	uint32_t log_count;
	uint64_t log_suppressed;
};

struct ring_worker {
	struct ring_server *rs;
	pthread_t thread;
	bool started;
	bool busy;                /* running an op (rs->lock) ...              */
	uid_t busy_uid;           /* ... for a client of this uid              */
	struct dataop_ws ws;
};

struct ring_server {
	struct ring_params p;
	struct session_table *st;
	struct kvstore *ks;
	char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int listen_fd, epoll_fd, event_fd;
	pthread_t ctl_thread;
	bool ctl_started;
	int stopping;                      /* atomic: ring-ctl ends, clients close */
	int workers_stop;                  /* atomic: set once every client is gone */

	/* limits (atomic: a reload changes them) */
	uint32_t max_clients, max_clients_per_uid;
	uint32_t max_workers_per_uid;      /* rs->lock; 0: no cap */
	uint64_t max_arena_per_uid;

	pthread_mutex_t lock;
	pthread_cond_t work;               /* run queue not empty / stopping */
	struct binding *rq_head, *rq_tail;
	uint32_t sleepers;                 /* workers waiting on `work` */
	struct binding *map[MAP_BUCKETS];
	struct ring_client *clients;
	uint32_t n_clients;
	uint64_t next_client_id;

	struct ring_worker *workers;
	uint32_t n_workers;

	/* counters (atomic) */
	uint64_t clients_total, handshakes_failed, ops_total, op_errors_total, ops_dropped,
		rings_broken, sessions_closed_on_eof, arena_bytes;
	uint64_t ops_run, op_queue_ns, op_run_ns; /* the workers' ops: queued, then run */
};

/* ---- small helpers ------------------------------------------------------------ */

static long futex_wait(uint32_t *addr, uint32_t val, int timeout_ms)
{
	struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };
	return syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static uint64_t now_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

static const char *op_name(uint32_t op)
{
	static const char *const n[TQKV_OP__COUNT] = { "NOP", "ATTACH", "DETACH", "APPEND", "ATTEND",
						       "APPEND_ATTEND", "TRUNCATE", "CLOSE", "PREFETCH" };
	return op < TQKV_OP__COUNT ? n[op] : "?";
}

/* One log line per client error, at most LOG_BURST per window; called
 * with c->cq_lock held. */
static void client_log_error(struct ring_client *c, const struct tqkv_sqe *e, int res,
			     uint32_t status, uint32_t detail, const char *msg)
{
	uint64_t now = now_mono_ns() / 1000000u;
	const bool severe = status == TQKV_ST_INTERNAL || status == TQKV_ST_NOMEM || status == TQKV_ST_DEVICE_LOST;
	int level = severe ? LOG_ERR : LOG_INFO;

	if (now - c->log_window_ms >= LOG_WINDOW_MS) {
		if (c->log_suppressed)
			log_info("data client %llu (pid %d uid %u): %llu more errors not logged",
				 (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid,
				 (unsigned long long)c->log_suppressed);
		c->log_window_ms = now;
		c->log_count = 0;
		c->log_suppressed = 0;
	}
	if (c->log_count >= LOG_BURST && level != LOG_ERR) {
		c->log_suppressed++;
		return;
	}
	c->log_count++;
	log_msg(level, "data client %llu (pid %d uid %u): %s session %llu layer %u: %s (%s, detail %u)%s%s",
		(unsigned long long)c->id, (int)c->pid, (unsigned)c->uid, op_name(e->opcode),
		(unsigned long long)e->session, e->layer, tqkv_status_str(status), strerror(-res),
		detail, msg && msg[0] ? ": " : "", msg ? msg : "");
}

/* Write one CQE and ring the client's doorbell if it may be asleep. */
static void cq_post(struct ring_client *c, const struct tqkv_sqe *e, int res, uint32_t status,
		    uint32_t detail, uint64_t n_tokens, const char *msg)
{
	struct tqkv_cqe cqe = {
		.user_data = e->user_data,
		.res = res,
		.status = (uint16_t)status,
		.n_tokens = n_tokens,
		.detail = detail,
	};

	pthread_mutex_lock(&c->cq_lock);
	memcpy(c->cq + (size_t)(c->cq_tail & (c->cq_entries - 1)) * sizeof(cqe), &cqe, sizeof(cqe));
	__atomic_store_n(&c->cq_tail, c->cq_tail + 1, __ATOMIC_RELEASE); /* read unlocked by cq_has_room */
	__atomic_store_n(&c->hdr->cq_tail, c->cq_tail, __ATOMIC_SEQ_CST);
	if (res < 0)
		client_log_error(c, e, res, status, detail, msg);
	pthread_mutex_unlock(&c->cq_lock);
	__atomic_add_fetch(&c->rs->ops_total, 1, __ATOMIC_RELAXED);
	if (res < 0)
		__atomic_add_fetch(&c->rs->op_errors_total, 1, __ATOMIC_RELAXED);
	/* Pairs with the client's store of cq_waiting and re-check of cq_tail. */
	if (__atomic_load_n(&c->hdr->cq_waiting, __ATOMIC_SEQ_CST))
		futex_wake(&c->hdr->cq_tail);
}

static int status_errno(uint32_t st)
{
	switch (st) {
	case TQKV_ST_BAD_RANGE: case TQKV_ST_BAD_ALIGN: return -EFAULT;
	case TQKV_ST_NO_SESSION: return -ENOENT;
	case TQKV_ST_NOT_ATTACHED: return -EBADF;
	case TQKV_ST_NOT_OWNER: return -EPERM;
	case TQKV_ST_ATTACHED_ELSEWHERE: return -EBUSY;
	case TQKV_ST_EVICTED: return -ESTALE;
	case TQKV_ST_CLOSING: return -ESHUTDOWN;
	case TQKV_ST_TOO_MANY_SESSIONS: return -EUSERS;
	case TQKV_ST_DATA_LOSS: return -EBADMSG;
	case TQKV_ST_SPILL_IO: return -EIO;
	case TQKV_ST_DEVICE_LOST: return -ENOTRECOVERABLE;
	default: return -EINVAL;
	}
}

static void cq_fail(struct ring_client *c, const struct tqkv_sqe *e, uint32_t status, uint32_t detail)
{
	cq_post(c, e, status_errno(status), status, detail, 0, NULL);
}

static uint32_t session_errno_status(int r)
{
	return r == -ESTALE ? TQKV_ST_EVICTED : r == -ESHUTDOWN ? TQKV_ST_CLOSING : TQKV_ST_NO_SESSION;
}

/* ---- attach map (rs->lock) ------------------------------------------------------ */

static struct binding **map_slot(struct ring_server *rs, uint64_t id)
{
	struct binding **pp = &rs->map[id & (MAP_BUCKETS - 1)];
	while (*pp && (*pp)->id != id)
		pp = &(*pp)->map_next;
	return pp;
}

/* Unlink b from the map and its client; rs->lock held.  b must be idle. */
static void binding_unlink(struct ring_server *rs, struct binding *b)
{
	struct binding **pp = map_slot(rs, b->id);
	assert(*pp == b && !b->queued && !b->head);
	*pp = b->map_next;
	for (pp = &b->c->bindings; *pp != b; pp = &(*pp)->c_next)
		;
	*pp = b->c_next;
	b->c->n_bindings--;
}

/* ---- validation ------------------------------------------------------------------ */

/* Bytes of [n][heads][dim] elements of esize. */
static uint64_t tensor_bytes(uint32_t n, uint32_t heads, uint32_t dim, size_t esize)
{
	return (uint64_t)n * heads * dim * esize; /* < 2^16 * 2^13 * 2^9 * 4: no overflow */
}

/* 0, or the status for a region [off, off+len) of the arena aligned to `align`. */
static uint32_t check_region(uint64_t arena_bytes, uint64_t off, uint64_t len, uint32_t align)
{
	if (off > arena_bytes || len > arena_bytes - off)
		return TQKV_ST_BAD_RANGE;
	if (off % align)
		return TQKV_ST_BAD_ALIGN;
	return TQKV_ST_OK;
}

static bool all_zero(const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return false;
	return true;
}

/* Every field an op does not use is zero (NOP: all of them, session too). */
static bool sqe_unused_zero(const struct tqkv_sqe *e, uint16_t flags_ok)
{
	return !(e->flags & ~flags_ok) && !e->dtype && !e->layer && !e->n_tokens && !e->n_q && !e->k_off &&
	       !e->v_off && !e->q_off && !e->pos_off && !e->out_off && !e->pos &&
	       (e->opcode != TQKV_OP_NOP || !e->session);
}

/* The data ops' checks against the session's geometry and the arena. */
static uint32_t sqe_check_data(const struct tqkv_sqe *e, uint64_t arena_bytes, const struct session_geom *g,
			       uint32_t *detail)
{
	size_t es;
	uint32_t st;
	bool app = e->opcode == TQKV_OP_APPEND || e->opcode == TQKV_OP_APPEND_ATTEND;
	bool att = e->opcode == TQKV_OP_ATTEND || e->opcode == TQKV_OP_APPEND_ATTEND;

	if (e->opcode == TQKV_OP_TRUNCATE) {
		if ((e->flags & ~TQKV_SQE_ALL_LAYERS) || e->dtype || e->n_tokens || e->n_q || e->k_off ||
		    e->v_off || e->q_off || e->pos_off || e->out_off ||
		    ((e->flags & TQKV_SQE_ALL_LAYERS) && e->layer))
			return TQKV_ST_BAD_FIELD;
		if (!(e->flags & TQKV_SQE_ALL_LAYERS) && e->layer >= g->n_layers) {
			*detail = e->layer;
			return TQKV_ST_BAD_LAYER;
		}
		return TQKV_ST_OK;
	}
	if (e->flags || e->pos)
		return TQKV_ST_BAD_FIELD;
	if (e->dtype > TQ_DTYPE_BF16) {
		*detail = e->dtype;
		return TQKV_ST_BAD_DTYPE;
	}
	if (e->layer >= g->n_layers) {
		*detail = e->layer;
		return TQKV_ST_BAD_LAYER;
	}
	es = tq_dtype_size((enum tq_dtype)e->dtype);
	if (app) {
		uint64_t kvb;
		if (e->n_tokens == 0 || e->n_tokens > TQKV_MAX_TOKENS_PER_OP) {
			*detail = e->n_tokens;
			return TQKV_ST_BAD_COUNT;
		}
		kvb = tensor_bytes(e->n_tokens, g->n_kv_heads, g->head_dim, es);
		if ((st = check_region(arena_bytes, e->k_off, kvb, (uint32_t)es)) ||
		    (st = check_region(arena_bytes, e->v_off, kvb, (uint32_t)es)))
			return st;
	} else if (e->n_tokens || e->k_off || e->v_off) {
		return TQKV_ST_BAD_FIELD;
	}
	if (att) {
		if (e->n_q == 0 || e->n_q > TQKV_MAX_TOKENS_PER_OP) {
			*detail = e->n_q;
			return TQKV_ST_BAD_COUNT;
		}
		if ((st = check_region(arena_bytes, e->q_off, tensor_bytes(e->n_q, g->n_q_heads, g->head_dim, es),
				       (uint32_t)es)) ||
		    (st = check_region(arena_bytes, e->pos_off, (uint64_t)e->n_q * 4u, 4)) ||
		    (st = check_region(arena_bytes, e->out_off, tensor_bytes(e->n_q, g->n_q_heads, g->head_dim, 4), 4)))
			return st;
	} else if (e->n_q || e->q_off || e->pos_off || e->out_off) {
		return TQKV_ST_BAD_FIELD;
	}
	return TQKV_ST_OK;
}

uint32_t ring_sqe_check(const struct tqkv_sqe *e, uint64_t arena_bytes, const struct session_geom *g,
			uint32_t *detail)
{
	*detail = 0;
	if (!all_zero(e->reserved, sizeof(e->reserved)))
		return TQKV_ST_BAD_FIELD;
	switch (e->opcode) {
	case TQKV_OP_NOP:
		return sqe_unused_zero(e, 0) ? TQKV_ST_OK : TQKV_ST_BAD_FIELD;
	case TQKV_OP_ATTACH:
		return sqe_unused_zero(e, TQKV_SQE_EPHEMERAL) ? TQKV_ST_OK : TQKV_ST_BAD_FIELD;
	case TQKV_OP_DETACH:
	case TQKV_OP_CLOSE:
	case TQKV_OP_PREFETCH:
		if (!g)
			return TQKV_ST_NOT_ATTACHED;
		return sqe_unused_zero(e, 0) ? TQKV_ST_OK : TQKV_ST_BAD_FIELD;
	case TQKV_OP_APPEND:
	case TQKV_OP_ATTEND:
	case TQKV_OP_APPEND_ATTEND:
	case TQKV_OP_TRUNCATE:
		if (!g)
			return TQKV_ST_NOT_ATTACHED;
		return sqe_check_data(e, arena_bytes, g, detail);
	default:
		*detail = e->opcode;
		return TQKV_ST_BAD_OPCODE;
	}
}

/* ---- ATTACH / DETACH (ring thread) ------------------------------------------------ */

static void do_attach(struct ring_client *c, const struct tqkv_sqe *e)
{
	struct ring_server *rs = c->rs;
	struct session_info info;
	struct binding *b, **pp;
	uint32_t st = TQKV_ST_OK;
	bool fresh = false;

	/* its fields were checked by dispatch (ring_sqe_check) */
	if (session_get_info(rs->st, e->session, &info) < 0)
		return cq_fail(c, e, TQKV_ST_NO_SESSION, 0);
	/* Never say more about another user's session than "not yours". */
	if (info.owner_uid != (uint32_t)c->uid)
		return cq_fail(c, e, TQKV_ST_NOT_OWNER, 0);
	if (info.state == SESSION_EVICTED)
		return cq_fail(c, e, TQKV_ST_EVICTED, info.evict_reason);
	if (info.state != SESSION_OPEN)
		return cq_fail(c, e, TQKV_ST_CLOSING, 0);

	pthread_mutex_lock(&rs->lock);
	pp = map_slot(rs, e->session);
	b = *pp;
	if (b && b->c != c) {
		st = TQKV_ST_ATTACHED_ELSEWHERE;
	} else if (b && b->close_requested) {
		st = TQKV_ST_CLOSING;
	} else if (b) {
		/* attached here already (or detached and still draining): re-arm */
		b->detached = false;
		b->ephemeral = (e->flags & TQKV_SQE_EPHEMERAL) != 0;
	} else if (c->n_bindings >= TQKV_MAX_ATTACHED) {
		st = TQKV_ST_TOO_MANY_SESSIONS;
	} else if (!(b = calloc(1, sizeof(*b)))) {
		st = TQKV_ST_NOMEM;
	} else {
		b->id = e->session;
		b->c = c;
		b->geom = info.geom;
		b->ephemeral = (e->flags & TQKV_SQE_EPHEMERAL) != 0;
		*pp = b;
		b->c_next = c->bindings;
		c->bindings = b;
		c->n_bindings++;
		fresh = true;
	}
	pthread_mutex_unlock(&rs->lock);
	if (st)
		return cq_post(c, e, st == TQKV_ST_NOMEM ? -ENOMEM : status_errno(st), st, 0, 0, NULL);
	/* The session was looked up before the lock: its owner's connection
	 * may have closed it since (a close runs before its binding goes, so
	 * an empty slot here means that close is done).  Look again: a
	 * binding to a closed session would answer OK and then NO_SESSION
	 * (found by the chaos soak). */
	struct session_info now;
	if (fresh && (session_get_info(rs->st, e->session, &now) < 0 || now.state != SESSION_OPEN)) {
		pthread_mutex_lock(&rs->lock);
		binding_unlink(rs, b);
		free(b);
		pthread_mutex_unlock(&rs->lock);
		return cq_fail(c, e, TQKV_ST_NO_SESSION, 0);
	}
	cq_post(c, e, 0, TQKV_ST_OK, 0, info.tokens, NULL);
}

/* ---- dispatch (ring thread) --------------------------------------------------------- */

static void push_runq(struct ring_server *rs, struct binding *b)
{
	b->rq_next = NULL;
	if (rs->rq_tail)
		rs->rq_tail->rq_next = b;
	else
		__atomic_store_n(&rs->rq_head, b, __ATOMIC_RELEASE); /* read unlocked by spinning workers */
	rs->rq_tail = b;
	b->queued = true;
	if (rs->sleepers)
		pthread_cond_signal(&rs->work);
}

/* Workers running an op for uid (rs->lock held). */
static uint32_t uid_running(const struct ring_server *rs, uid_t uid)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < rs->n_workers; i++)
		n += rs->workers[i].busy && rs->workers[i].busy_uid == uid;
	return n;
}

/* Take the session whose op runs next off the run queue (rs->lock held),
 * or NULL when every queued session's uid is at daemon.max_workers_per_uid.
 * Round robin between sessions, with two rules between users:
 *  - the cap, when set: a uid never holds more workers than it, so another
 *    user's op finds one free (not work-conserving: the cap holds with
 *    nobody else waiting too; it is for boxes shared between users);
 *  - without one, a uid holding all workers but one does not get the last
 *    while another uid's session waits, so a user with many busy sessions
 *    delays a queued op of another by at most the shortest of its running
 *    ops, not by its whole queue; with nobody else waiting it gets all. */
static struct binding *pop_runq(struct ring_server *rs)
{
	const uint32_t cap = rs->max_workers_per_uid;
	const uint32_t share = cap ? cap : rs->n_workers > 1 ? rs->n_workers - 1 : 1;
	struct binding *b = NULL, *prev = NULL;

	for (struct binding *x = rs->rq_head, *xp = NULL; x; xp = x, x = x->rq_next)
		if (uid_running(rs, x->c->uid) < share) {
			b = x;
			prev = xp;
			break;
		}
	if (!b) {
		if (cap || !rs->rq_head)
			return NULL;
		b = rs->rq_head;   /* every uid at its share, no cap: the oldest */
	}
	if (prev)
		prev->rq_next = b->rq_next;
	else
		__atomic_store_n(&rs->rq_head, b->rq_next, __ATOMIC_RELAXED);
	if (rs->rq_tail == b)
		rs->rq_tail = prev;
	b->rq_next = NULL;
	return b;
}

static void dispatch(struct ring_client *c, const struct tqkv_sqe *e)
{
	struct ring_server *rs = c->rs;
	struct binding *b;
	struct op *o;
	uint32_t st, detail = 0;

	/* NOP, ATTACH and unknown opcodes name no attached session. */
	if (e->opcode == TQKV_OP_NOP || e->opcode == TQKV_OP_ATTACH || e->opcode >= TQKV_OP__COUNT) {
		if ((st = ring_sqe_check(e, c->arena_bytes, NULL, &detail)) != TQKV_ST_OK)
			return cq_fail(c, e, st, detail);
		if (e->opcode == TQKV_OP_ATTACH)
			return do_attach(c, e);
		return cq_post(c, e, 0, TQKV_ST_OK, 0, 0, NULL);
	}

	o = malloc(sizeof(*o));
	if (!o)
		return cq_post(c, e, -ENOMEM, TQKV_ST_NOMEM, 0, 0, NULL);
	o->next = NULL;
	o->e = *e;
	o->t_queued = now_mono_ns();
	pthread_mutex_lock(&rs->lock);
	b = *map_slot(rs, e->session);
	if (b && (b->c != c || b->detached))
		b = NULL;
	st = ring_sqe_check(e, c->arena_bytes, b ? &b->geom : NULL, &detail);
	if (st == TQKV_ST_OK && (e->opcode == TQKV_OP_DETACH || e->opcode == TQKV_OP_CLOSE)) {
		b->detached = true; /* later SQEs of this session: NOT_ATTACHED */
		b->close_requested = e->opcode == TQKV_OP_CLOSE;
	}
	if (st == TQKV_ST_OK) {
		if (b->tail)
			b->tail->next = o;
		else
			b->head = o;
		b->tail = o;
		__atomic_add_fetch(&c->inflight, 1, __ATOMIC_RELEASE); /* read unlocked by drain() */
		if (!b->queued)
			push_runq(rs, b);
	}
	pthread_mutex_unlock(&rs->lock);
	if (st != TQKV_ST_OK) {
		free(o);
		cq_fail(c, e, st, detail);
	}
}

/* ---- the client's ring thread -------------------------------------------------------- */

static void ring_break(struct ring_client *c, const char *what, uint32_t a, uint32_t b)
{
	log_warning("data client %llu (pid %d uid %u): %s (%u vs %u); ring stopped",
		    (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid, what, a, b);
	__atomic_store_n(&c->hdr->state_status, TQKV_ST_RING_CORRUPT, __ATOMIC_RELAXED);
	__atomic_store_n(&c->hdr->state, TQKV_RING_BROKEN, __ATOMIC_SEQ_CST);
	c->broken = true;
	__atomic_add_fetch(&c->rs->rings_broken, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&c->closing, 1, __ATOMIC_SEQ_CST);
	futex_wake(&c->hdr->cq_tail);
	shutdown(c->fd, SHUT_RDWR); /* the client sees EOF too */
}

/* Take every SQE the client has published and the CQ has room for.
 * Returns how many were taken, or -EPROTO when the ring broke. */
static int drain(struct ring_client *c)
{
	int n = 0;

	for (;;) {
		uint32_t tail = __atomic_load_n(&c->hdr->sq_tail, __ATOMIC_ACQUIRE);
		uint32_t cq_head = __atomic_load_n(&c->hdr->cq_head, __ATOMIC_ACQUIRE);
		uint32_t cq_used, inflight;
		struct tqkv_sqe e;

		if (tail - c->sq_head > c->sq_entries) {
			ring_break(c, "SQ tail is not within sq_entries of the head", tail, c->sq_head);
			return -EPROTO;
		}
		pthread_mutex_lock(&c->cq_lock);
		cq_used = c->cq_tail - cq_head;
		pthread_mutex_unlock(&c->cq_lock);
		if (cq_used > c->cq_entries) {
			ring_break(c, "CQ head is not within cq_entries of the tail", cq_head, c->cq_tail);
			return -EPROTO;
		}
		if (tail == c->sq_head)
			return n;
		inflight = __atomic_load_n(&c->inflight, __ATOMIC_ACQUIRE);
		if (cq_used + inflight >= c->cq_entries)
			return n; /* the client must read completions first */
		/* Copy first, then look: the client can rewrite the slot at any time. */
		memcpy(&e, c->sq + (size_t)(c->sq_head & (c->sq_entries - 1)) * sizeof(e), sizeof(e));
		c->sq_head++;
		__atomic_store_n(&c->hdr->sq_head, c->sq_head, __ATOMIC_RELEASE);
		dispatch(c, &e);
		n++;
	}
}

/* 1 if one more operation may be taken without overflowing the CQ (a
 * corrupt cq_head counts as room: drain() then stops the ring). */
static bool cq_has_room(struct ring_client *c)
{
	uint32_t cq_head = __atomic_load_n(&c->hdr->cq_head, __ATOMIC_SEQ_CST);
	uint32_t used = __atomic_load_n(&c->cq_tail, __ATOMIC_ACQUIRE) - cq_head;

	return used > c->cq_entries ||
	       used + __atomic_load_n(&c->inflight, __ATOMIC_ACQUIRE) < c->cq_entries;
}

/* Something drain() would take: an SQE and room for its CQE.  A client
 * that does not read its completions must not keep this thread spinning. */
static bool has_work(struct ring_client *c)
{
	return __atomic_load_n(&c->hdr->sq_tail, __ATOMIC_ACQUIRE) != c->sq_head && cq_has_room(c);
}

static void client_teardown(struct ring_client *c);

static int client_start(struct ring_client *c);

/* The client has gone (or the daemon stops): a CLOSE it managed to queue
 * still completes — once sent, a close must not depend on the client
 * living on (it may die right after the submit).  Other SQEs left in the
 * SQ are not taken.  Not after ring_break: that ring is not trusted. */
static void sweep_closes(struct ring_client *c)
{
	uint32_t tail = __atomic_load_n(&c->hdr->sq_tail, __ATOMIC_ACQUIRE);

	if (c->broken || tail - c->sq_head > c->sq_entries)
		return;
	for (; c->sq_head != tail; c->sq_head++) {
		struct tqkv_sqe e;
		memcpy(&e, c->sq + (size_t)(c->sq_head & (c->sq_entries - 1)) * sizeof(e), sizeof(e));
		if (e.opcode == TQKV_OP_CLOSE)
			dispatch(c, &e);
	}
	__atomic_store_n(&c->hdr->sq_head, c->sq_head, __ATOMIC_RELEASE);
}

static void *client_main(void *arg)
{
	struct ring_client *c = arg;
	uint32_t spin_max = c->rs->p.spin_us * 1000u;

	if (client_start(c) < 0) {
		__atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
		uint64_t one = 1;
		if (write(c->rs->event_fd, &one, sizeof(one)) < 0) {
			/* eventfd counter saturated: ring-ctl is already due to look */
		}
		return NULL;
	}

	c->spin_ns = spin_max / 4;
	while (!__atomic_load_n(&c->closing, __ATOMIC_ACQUIRE)) {
		int n = drain(c);
		uint64_t t0;
		bool found = false;

		if (n < 0)
			break;
		if (n > 0)
			continue;
		/* Adaptive spin: grows when work arrives while spinning, shrinks
		 * when the spin ends in a sleep. */
		t0 = now_mono_ns();
		do { /* look at least once, however slow the clock is to read */
			if (has_work(c) || __atomic_load_n(&c->closing, __ATOMIC_ACQUIRE)) {
				found = true;
				break;
			}
			for (int i = 0; i < 16; i++)
				cpu_relax();
		} while (now_mono_ns() - t0 < c->spin_ns);
		if (found) {
			c->spin_ns = c->spin_ns * 2 < spin_max ? c->spin_ns * 2 : spin_max;
			continue;
		}
		c->spin_ns = c->spin_ns / 2 > 1000 ? c->spin_ns / 2 : 1000;
		/* Announce the sleep, then look again (pairs with the client's
		 * store of sq_tail and load of sq_sleeping). */
		__atomic_store_n(&c->hdr->sq_sleeping, 1, __ATOMIC_SEQ_CST);
		uint32_t tail = __atomic_load_n(&c->hdr->sq_tail, __ATOMIC_SEQ_CST);
		/* With SQEs pending but no CQ room, sleep on the tail seen: the
		 * client wakes us after it reads completions. */
		if ((tail == c->sq_head || !cq_has_room(c)) && !__atomic_load_n(&c->closing, __ATOMIC_ACQUIRE))
			futex_wait(&c->hdr->sq_tail, tail, SLEEP_MS);
		__atomic_store_n(&c->hdr->sq_sleeping, 0, __ATOMIC_RELAXED);
	}
	sweep_closes(c);
	client_teardown(c);
	return NULL;
}

/* Ring thread, on its way out: wait for running operations, drop queued
 * ones (the workers skip them), close ephemeral sessions, then hand the
 * client to ring-ctl for the final free. */
static void client_teardown(struct ring_client *c)
{
	struct ring_server *rs = c->rs;
	uint64_t closed = 0;

	pthread_mutex_lock(&rs->lock);
	while (c->inflight > 0)
		pthread_cond_wait(&c->idle, &rs->lock);
	while (c->bindings) {
		struct binding *b = c->bindings;
		uint64_t id = b->id;
		bool eph = (b->ephemeral && !b->detached) || b->close_requested;

		/* Closed while still bound here: another connection of the
		 * same uid that tries to ATTACH it meanwhile is told it is
		 * attached elsewhere, then that it is gone — it never gets an
		 * ephemeral session whose owner just left, for this loop to
		 * close under it (found by the chaos soak).  Nobody else
		 * unlinks c's bindings: its operations are done. */
		if (eph) {
			pthread_mutex_unlock(&rs->lock);
			if (session_close(rs->st, id, NULL) == 0)
				closed++;
			pthread_mutex_lock(&rs->lock);
		}
		binding_unlink(rs, b);
		free(b);
	}
	pthread_mutex_unlock(&rs->lock);
	__atomic_add_fetch(&rs->sessions_closed_on_eof, closed, __ATOMIC_RELAXED);
	__atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
	uint64_t one = 1;
	if (write(rs->event_fd, &one, sizeof(one)) < 0) {
		/* eventfd counter saturated: ring-ctl is already due to look */
	}
}

/* ---- workers ----------------------------------------------------------------------- */

static void run_op(struct ring_server *rs, struct ring_worker *w, struct binding *b, const struct tqkv_sqe *e)
{
	struct ring_client *c = b->c;
	struct session *s;
	struct dataop_res r;
	enum tq_dtype dt = (enum tq_dtype)e->dtype;
	int x;

	if (e->opcode == TQKV_OP_DETACH)
		return cq_post(c, e, 0, TQKV_ST_OK, 0, 0, NULL);
	if (e->opcode == TQKV_OP_CLOSE) {
		uint64_t released = 0;
		if ((x = session_close(rs->st, b->id, &released)) < 0)
			return cq_post(c, e, x, TQKV_ST_NO_SESSION, 0, 0, NULL);
		log_info("session %llu closed by data client %llu (pid %d uid %u), %llu bytes released",
			 (unsigned long long)b->id, (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid,
			 (unsigned long long)released);
		return cq_post(c, e, 0, TQKV_ST_OK, 0, 0, NULL);
	}
	if ((x = session_acquire(rs->st, b->id, session_clock_ms(), &s)) < 0)
		return cq_post(c, e, x, session_errno_status(x),
			       x == -ESTALE ? session_evict_reason(rs->st, b->id) : 0, 0, NULL);
	switch (e->opcode) {
	case TQKV_OP_APPEND:
		dataop_append(rs->ks, s, e->layer, c->arena + e->k_off, c->arena + e->v_off, dt,
			      e->n_tokens, &r);
		break;
	case TQKV_OP_ATTEND:
	case TQKV_OP_APPEND_ATTEND: {
		bool app = e->opcode == TQKV_OP_APPEND_ATTEND;
		dataop_attend(rs->ks, s, &w->ws, e->layer, app ? c->arena + e->k_off : NULL,
			      app ? c->arena + e->v_off : NULL, app ? e->n_tokens : 0,
			      c->arena + e->q_off, c->arena + e->pos_off, e->n_q, dt,
			      (float *)(void *)(c->arena + e->out_off), &r);
		break;
	}
	case TQKV_OP_TRUNCATE:
		dataop_truncate(rs->ks, s, e->layer, (e->flags & TQKV_SQE_ALL_LAYERS) != 0, e->pos, &r);
		break;
	case TQKV_OP_PREFETCH:
		dataop_prefetch(rs->ks, s, &r);
		break;
	default:
		assert(!"dispatch let an unknown opcode through");
		memset(&r, 0, sizeof(r));
		r.res = -EINVAL;
		r.status = TQKV_ST_BAD_OPCODE;
	}
	session_release(s);
	if (r.status == TQKV_ST_EVICTED) /* evicted while it ran */
		r.detail = session_evict_reason(rs->st, b->id);
	cq_post(c, e, r.res, r.status, r.detail, r.n_tokens, r.msg);
}

static void *worker_main(void *arg)
{
	struct ring_worker *w = arg;
	struct ring_server *rs = w->rs;

	pthread_mutex_lock(&rs->lock);
	for (;;) {
		struct binding *b;
		struct op *o;
		struct ring_client *c;

		b = rs->rq_head ? pop_runq(rs) : NULL;
		if (!b && rs->rq_head) {
			/* queued work, all of it of uids at their cap: wait for a
			 * worker to finish (it wakes us) */
			if (__atomic_load_n(&rs->workers_stop, __ATOMIC_ACQUIRE))
				break;
			rs->sleepers++;
			pthread_cond_wait(&rs->work, &rs->lock);
			rs->sleepers--;
			continue;
		}
		if (!b) {
			if (__atomic_load_n(&rs->workers_stop, __ATOMIC_ACQUIRE))
				break;
			/* short spin before sleeping: back-to-back ops skip the wake-up */
			pthread_mutex_unlock(&rs->lock);
			uint64_t t0 = now_mono_ns(), lim = (uint64_t)rs->p.spin_us * 1000u / 2;
			while (!__atomic_load_n(&rs->rq_head, __ATOMIC_RELAXED) && now_mono_ns() - t0 < lim)
				for (int i = 0; i < 16; i++)
					cpu_relax();
			pthread_mutex_lock(&rs->lock);
			if (!rs->rq_head && !__atomic_load_n(&rs->workers_stop, __ATOMIC_ACQUIRE)) {
				rs->sleepers++;
				pthread_cond_wait(&rs->work, &rs->lock);
				rs->sleepers--;
			}
			continue;
		}
		o = b->head;
		b->head = o->next;
		if (!b->head)
			b->tail = NULL;
		c = b->c;
		w->busy = true;
		w->busy_uid = c->uid;
		pthread_mutex_unlock(&rs->lock);

		/* A departed client's queued work is dropped, but never a CLOSE:
		 * once sent, a close completes whatever the client does next. */
		if (__atomic_load_n(&c->closing, __ATOMIC_ACQUIRE) && o->e.opcode != TQKV_OP_CLOSE) {
			__atomic_add_fetch(&rs->ops_dropped, 1, __ATOMIC_RELAXED);
		} else {
			const uint64_t t0 = now_mono_ns();
			run_op(rs, w, b, &o->e);
			__atomic_add_fetch(&rs->op_queue_ns, t0 - o->t_queued, __ATOMIC_RELAXED);
			__atomic_add_fetch(&rs->op_run_ns, now_mono_ns() - t0, __ATOMIC_RELAXED);
			__atomic_add_fetch(&rs->ops_run, 1, __ATOMIC_RELAXED);
		}
		free(o);

		pthread_mutex_lock(&rs->lock);
		w->busy = false;
		/* a capped uid's queued work may run now: wake a sleeper for it
		 * (push_runq below signals for this session's next op) */
		if (rs->max_workers_per_uid && rs->rq_head && rs->sleepers)
			pthread_cond_signal(&rs->work);
		if (b->head) {
			push_runq(rs, b); /* round robin between sessions */
		} else {
			b->queued = false;
			if (b->detached) {
				binding_unlink(rs, b);
				free(b);
			}
		}
		if (__atomic_sub_fetch(&c->inflight, 1, __ATOMIC_RELEASE) == 0)
			pthread_cond_broadcast(&c->idle);
	}
	pthread_mutex_unlock(&rs->lock);
	return NULL;
}

/* ---- connections (ring-ctl) ------------------------------------------------------------ */

static void client_free(struct ring_client *c)
{
	if (!c)
		return;
	if (c->map) {
		if (c->map_pinned)
			pool_host_unregister(kvstore_pool(c->rs->ks), c->map);
		munmap(c->map, c->map_bytes);
		__atomic_sub_fetch(&c->rs->arena_bytes, c->map_bytes, __ATOMIC_RELAXED);
	}
	if (c->fd >= 0)
		close(c->fd);
	pthread_mutex_destroy(&c->cq_lock);
	pthread_cond_destroy(&c->idle);
	free(c);
}

static void welcome_send(int fd, int res, uint64_t client_id, const char *msg)
{
	struct tqkv_welcome w;

	memset(&w, 0, sizeof(w));
	w.magic = TQKV_RING_MAGIC;
	w.version = TQKV_RING_VERSION;
	w.res = res;
	w.client_id = client_id;
	w.max_sessions = TQKV_MAX_ATTACHED;
	w.max_tokens_per_op = TQKV_MAX_TOKENS_PER_OP;
	snprintf(w.msg, sizeof(w.msg), "%s", msg ? msg : "");
	if (send(fd, &w, sizeof(w), MSG_NOSIGNAL) < 0) {
		/* the client left; its EOF is handled like any other */
	}
}

int ring_hello_check(const struct tqkv_hello *h, size_t n, size_t n_fds, bool ctrunc,
		     struct tqkv_ring_layout *lay, char *why, size_t whylen)
{
	if (n != sizeof(*h)) {
		snprintf(why, whylen, "hello of %zu bytes (expected %zu)", n, sizeof(*h));
		return -EPROTO;
	}
	if (ctrunc || n_fds > 1) {
		snprintf(why, whylen, "the hello must carry exactly one fd (the ring's memfd); it carried %s",
			 ctrunc ? "more than 4" : "several");
		return -EPROTO;
	}
	if (h->magic != TQKV_RING_MAGIC) {
		snprintf(why, whylen, "not a tqkv data client (bad magic)");
		return -EPROTO;
	}
	if ((h->version >> 16) != TQKV_RING_VERSION_MAJOR) {
		snprintf(why, whylen, "ring ABI %u.%u is not supported (daemon speaks %u.%u)",
			 h->version >> 16, h->version & 0xffff, TQKV_RING_VERSION_MAJOR, TQKV_RING_VERSION_MINOR);
		return -EPROTONOSUPPORT;
	}
	if (h->flags || !all_zero(h->reserved, sizeof(h->reserved)) ||
	    tqkv_ring_layout(h->sq_entries, h->cq_entries, h->arena_bytes, lay) < 0 ||
	    lay->total_bytes != h->total_bytes) {
		snprintf(why, whylen, "bad ring geometry (sq %u, cq %u, arena %llu, total %llu)",
			 h->sq_entries, h->cq_entries, (unsigned long long)h->arena_bytes,
			 (unsigned long long)h->total_bytes);
		return -EINVAL;
	}
	return 0;
}

int ring_memfd_check(uint32_t mode, uint64_t size, int seals, uint64_t total_bytes, char *why, size_t whylen)
{
	/* Sealed against shrinking, so no access inside total_bytes can SIGBUS. */
	if (!S_ISREG(mode) || seals < 0 ||
	    (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW) || size != total_bytes) {
		snprintf(why, whylen, "the fd must be a memfd of %llu bytes sealed with F_SEAL_SHRINK|F_SEAL_GROW",
			 (unsigned long long)total_bytes);
		return -EINVAL;
	}
	return 0;
}

/* Handshake on a new connection: 0 and the mapped client, or a negative
 * errno with why set (the caller answers and closes). */
static int handshake(struct ring_server *rs, struct ring_client *c, char *why, size_t whylen)
{
	struct tqkv_hello h;
	struct tqkv_ring_layout lay;
	union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int) * 4)]; } cbuf;
	struct iovec iov = { &h, sizeof(h) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
			      .msg_controllen = sizeof(cbuf.buf) };
	struct timeval tv = { 2, 0 };
	struct stat sb;
	int memfd = -1, seals, r;
	size_t n_fds = 0;
	ssize_t n;

	setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	memset(&h, 0, sizeof(h));
	memset(&cbuf, 0, sizeof(cbuf));
	/* MSG_TRUNC: n is the message's real length even when it was longer
	 * than the hello (SOCK_SEQPACKET), so the refusal can say so. */
	n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC | MSG_TRUNC);
	/* Take ownership of every passed fd before judging the message — only
	 * of a message that arrived: after a failed recvmsg the control buffer
	 * holds no fds, and walking it would close fds that are not ours. */
	for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&msg) : NULL; cm; cm = CMSG_NXTHDR(&msg, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < nfd; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			n_fds++;
			if (memfd < 0)
				memfd = fd;
			else
				close(fd);
		}
	}
	if (n < 0) {
		r = -errno;
		snprintf(why, whylen, "reading the hello: %s", strerror(errno));
		goto fail;
	}
	if ((r = ring_hello_check(&h, (size_t)n, n_fds, (msg.msg_flags & MSG_CTRUNC) != 0, &lay, why,
				  whylen)) < 0)
		goto fail;
	if (memfd < 0) {
		r = -EBADF;
		snprintf(why, whylen, "no memfd passed with the hello");
		goto fail;
	}
	seals = fcntl(memfd, F_GET_SEALS);
	if (fstat(memfd, &sb) < 0)
		sb.st_mode = 0; /* not a regular file: refused below */
	if ((r = ring_memfd_check(sb.st_mode, (uint64_t)sb.st_size, seals, h.total_bytes, why, whylen)) < 0)
		goto fail;
	/* The uid's ring memory, all its connections together, is capped. */
	pthread_mutex_lock(&rs->lock);
	uint64_t mine = 0, cap = __atomic_load_n(&rs->max_arena_per_uid, __ATOMIC_RELAXED);
	for (struct ring_client *o = rs->clients; o; o = o->next)
		if (o != c && o->uid == c->uid)
			mine += o->arena_claim;
	if (cap && (h.total_bytes > cap || mine > cap - h.total_bytes)) {
		pthread_mutex_unlock(&rs->lock);
		char a[32], b[32], m[32];
		tq_size_format_human(h.total_bytes, a, sizeof(a));
		tq_size_format_human(mine, m, sizeof(m));
		tq_size_format_human(cap, b, sizeof(b));
		r = -EUSERS;
		snprintf(why, whylen, "uid %u maps %s of rings already; %s more passes max_arena_per_uid %s",
			 (unsigned)c->uid, m, a, b);
		goto fail;
	}
	c->arena_claim = h.total_bytes;
	pthread_mutex_unlock(&rs->lock);
	c->map = mmap(NULL, h.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (c->map == MAP_FAILED) {
		c->map = NULL;
		r = -errno;
		snprintf(why, whylen, "mmap of the ring: %s", strerror(errno));
		goto fail;
	}
	c->map_bytes = h.total_bytes;
	__atomic_add_fetch(&rs->arena_bytes, c->map_bytes, __ATOMIC_RELAXED);
	close(memfd);
	memfd = -1;
	/* A GPU pool's kernels read K/V and write outputs in the arena
	 * directly once it is pinned; if that fails they stage copies. */
	{
		char pwhy[256];
		int pr = pool_host_register(kvstore_pool(rs->ks), c->map, c->map_bytes, pwhy, sizeof(pwhy));
		c->map_pinned = pr > 0;
		if (pr < 0)
			log_warning("data client %llu: ring memory not pinned for the GPU (%s): "
				    "its data is copied through staging buffers", (unsigned long long)c->id, pwhy);
	}
	c->hdr = (struct tqkv_ring_hdr *)(void *)c->map;
	c->sq = c->map + lay.sq_off;
	c->cq = c->map + lay.cq_off;
	c->arena = c->map + lay.arena_off;
	c->sq_entries = h.sq_entries;
	c->cq_entries = h.cq_entries;
	c->arena_bytes = h.arena_bytes;
	/* The daemon's lines start from its own values. */
	c->sq_head = 0;
	c->cq_tail = 0;
	__atomic_store_n(&c->hdr->sq_head, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&c->hdr->sq_sleeping, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&c->hdr->cq_tail, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&c->hdr->state_status, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&c->hdr->state, TQKV_RING_LIVE, __ATOMIC_SEQ_CST);
	tv.tv_sec = 0;
	setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return 0;
fail:
	if (memfd >= 0)
		close(memfd);
	return r;
}

/* Refuse a connection at once, on ring-ctl: the welcome with the reason,
 * then whatever the client already sent is read and dropped (closing any
 * fd it passed) — closing a socket with unread data would make the
 * client's next read fail with ECONNRESET before it sees the reason. */
static void refuse_now(int fd, int res, const char *why)
{
	union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int) * 4)]; } cbuf;
	char junk[256];

	welcome_send(fd, res, 0, why);
	shutdown(fd, SHUT_WR);
	for (int i = 0; i < 4; i++) {
		struct iovec iov = { junk, sizeof(junk) };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
				      .msg_controllen = sizeof(cbuf.buf) };
		ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0)
			break;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			for (size_t k = 0; k < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); k++) {
				int x;
				memcpy(&x, CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
				close(x);
			}
		}
	}
	close(fd);
}

/* The handshake runs on the client's own thread (client_start), so a peer
 * that connects and says nothing delays nobody: ring-ctl only accepts,
 * reads the peer's credentials, counts the client against max_clients and
 * its uid's max_clients_per_uid, and starts its thread. */
static void accept_one(struct ring_server *rs)
{
	struct ring_client *c = NULL;
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	char why[160] = "";
	uint32_t mine = 0, alive = 0, cap_all, cap_uid;
	pthread_attr_t attr;
	int fd, r;

	fd = accept4(rs->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0) {
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
			/* out of descriptors or memory: the connection stays queued
			 * and the listening socket readable (level-triggered), so
			 * back off rather than spin; said once every 10 s */
			static uint64_t said_ms;
			struct timespec now, pause = { 0, 100 * 1000 * 1000 };
			clock_gettime(CLOCK_MONOTONIC, &now);
			const uint64_t ms = (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
			if (!said_ms || ms - said_ms >= 10000) {
				log_warning("data socket: accept: %s (new clients wait until descriptors are free)",
					    strerror(errno));
				said_ms = ms;
			}
			nanosleep(&pause, NULL);
		}
		return; /* EAGAIN, or the client gave up: nothing to do */
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
		log_warning("data socket: peer credentials: %s", strerror(errno));
		close(fd);
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		refuse_now(fd, -ENOMEM, "the daemon is out of memory");
		return;
	}
	c->rs = rs;
	c->fd = fd;
	c->uid = cred.uid;
	c->pid = cred.pid;
	pthread_mutex_init(&c->cq_lock, NULL);
	pthread_cond_init(&c->idle, NULL);

	cap_all = __atomic_load_n(&rs->max_clients, __ATOMIC_RELAXED);
	cap_uid = __atomic_load_n(&rs->max_clients_per_uid, __ATOMIC_RELAXED);
	pthread_mutex_lock(&rs->lock);
	c->id = ++rs->next_client_id;
	/* a client whose ring thread has finished (its sessions closed or
	 * detached) is gone: this thread frees it on the wake-up it sent,
	 * and a client reconnecting at its cap must not wait for that */
	for (struct ring_client *o = rs->clients; o; o = o->next) {
		if (__atomic_load_n(&o->done, __ATOMIC_ACQUIRE))
			continue;
		alive++;
		mine += o->uid == c->uid;
	}
	if (cap_uid && mine >= cap_uid) {
		r = -EUSERS;
		snprintf(why, sizeof(why), "uid %u has %u data connections already (daemon.max_clients_per_uid)",
			 (unsigned)c->uid, mine);
	} else if (alive >= cap_all) {
		r = -EUSERS;
		snprintf(why, sizeof(why), "%u data clients already connected (daemon.max_clients)", alive);
	} else {
		/* counted from now on: pending handshakes count too */
		r = 0;
		c->next = rs->clients;
		rs->clients = c;
		rs->n_clients++;
	}
	pthread_mutex_unlock(&rs->lock);
	if (r < 0) {
		__atomic_add_fetch(&rs->handshakes_failed, 1, __ATOMIC_RELAXED);
		log_info("data client %llu (pid %d uid %u) refused: %s", (unsigned long long)c->id,
			 (int)c->pid, (unsigned)c->uid, why);
		c->fd = -1;
		client_free(c);
		refuse_now(fd, r, why);
		return;
	}
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, CLIENT_STACK);
	r = pthread_create(&c->thread, &attr, client_main, c);
	pthread_attr_destroy(&attr);
	if (r != 0) {
		log_err("data client %llu: cannot start its thread: %s", (unsigned long long)c->id, strerror(r));
		welcome_send(fd, -r, 0, "the daemon cannot start a thread for this client");
		__atomic_store_n(&c->done, 1, __ATOMIC_RELEASE); /* reaped below */
		uint64_t one = 1;
		if (write(rs->event_fd, &one, sizeof(one)) < 0) {
			/* saturated: a reap is due anyway */
		}
		return;
	}
	c->thread_started = true;
}

/* Client thread, first: the handshake, then the epoll registration that
 * turns the socket's EOF into the client's end.  0, or a negative errno
 * after the refusal was sent (the caller marks the client done). */
static int client_start(struct ring_client *c)
{
	struct ring_server *rs = c->rs;
	struct epoll_event ev;
	char why[160] = "";
	int r;

	if ((r = handshake(rs, c, why, sizeof(why))) < 0)
		goto fail;
	ev.events = EPOLLIN | EPOLLRDHUP;
	ev.data.ptr = c;
	if (epoll_ctl(rs->epoll_fd, EPOLL_CTL_ADD, c->fd, &ev) < 0) {
		r = -errno;
		snprintf(why, sizeof(why), "epoll: %s", strerror(errno));
		goto fail;
	}
	pthread_mutex_lock(&rs->lock);
	c->live = true;
	pthread_mutex_unlock(&rs->lock);
	welcome_send(c->fd, 0, c->id, "");
	__atomic_add_fetch(&rs->clients_total, 1, __ATOMIC_RELAXED);
	log_info("data client %llu connected (pid %d uid %u, sq %u, cq %u, arena %llu bytes)",
		 (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid, c->sq_entries, c->cq_entries,
		 (unsigned long long)c->arena_bytes);
	return 0;
fail:
	__atomic_add_fetch(&rs->handshakes_failed, 1, __ATOMIC_RELAXED);
	log_info("data client %llu (pid %d uid %u) refused: %s", (unsigned long long)c->id, (int)c->pid,
		 (unsigned)c->uid, why);
	welcome_send(c->fd, r, 0, why);
	return r;
}

/* Any event on a data socket after the handshake ends the client: EOF is
 * the normal way out, and a client has nothing else to say on it. */
static void client_hangup(struct ring_server *rs, struct ring_client *c)
{
	epoll_ctl(rs->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
	__atomic_store_n(&c->closing, 1, __ATOMIC_SEQ_CST);
	futex_wake(&c->hdr->sq_tail);
}

/* Join and free every client whose ring thread has finished. */
static void reap(struct ring_server *rs)
{
	for (;;) {
		struct ring_client *c, **pp;

		pthread_mutex_lock(&rs->lock);
		for (pp = &rs->clients; *pp && !__atomic_load_n(&(*pp)->done, __ATOMIC_ACQUIRE); pp = &(*pp)->next)
			;
		c = *pp;
		if (c)
			*pp = c->next;
		pthread_mutex_unlock(&rs->lock);
		if (!c)
			return;
		if (c->thread_started)
			pthread_join(c->thread, NULL);
		epoll_ctl(rs->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
		if (c->live) {
			/* errors the rate limit held back in the last window would
			 * otherwise be counted only when the next one comes */
			pthread_mutex_lock(&c->cq_lock);
			uint64_t held = c->log_suppressed;
			pthread_mutex_unlock(&c->cq_lock);
			if (held)
				log_info("data client %llu (pid %d uid %u): %llu more errors not logged",
					 (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid,
					 (unsigned long long)held);
			log_info("data client %llu (pid %d) disconnected", (unsigned long long)c->id, (int)c->pid);
		}
		client_free(c);
		/* counted until its memory is gone: clients == 0 means all unmapped */
		pthread_mutex_lock(&rs->lock);
		rs->n_clients--;
		pthread_mutex_unlock(&rs->lock);
	}
}

static void *ctl_main(void *arg)
{
	struct ring_server *rs = arg;
	struct epoll_event ev[32];

	while (!__atomic_load_n(&rs->stopping, __ATOMIC_ACQUIRE)) {
		int n = epoll_wait(rs->epoll_fd, ev, 32, 1000);
		bool do_reap = false;

		/* Reap last: a freed client must not appear later in this batch. */
		for (int i = 0; i < n; i++) {
			if (ev[i].data.ptr == &rs->listen_fd) {
				accept_one(rs);
			} else if (ev[i].data.ptr == &rs->event_fd) {
				uint64_t v;
				if (read(rs->event_fd, &v, sizeof(v)) < 0) {
					/* EAGAIN: another read took it */
				}
				do_reap = true;
			} else {
				client_hangup(rs, ev[i].data.ptr);
			}
		}
		if (do_reap)
			reap(rs);
	}
	return NULL;
}

/* ---- server --------------------------------------------------------------------------- */

int ring_server_new(struct ring_server **out, const struct ring_params *p,
		    struct session_table *st, struct kvstore *ks, char *why, size_t whylen)
{
	struct ring_server *rs;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct epoll_event ev;
	int r;

	*out = NULL;
	if (p->n_workers < 1 || p->n_workers > 256 || p->attn_threads < 1 ||
	    p->attn_threads > TQ_THREADS_MAX || p->max_clients < 1) {
		snprintf(why, whylen, "workers %u, attention threads %u, max clients %u out of range",
			 p->n_workers, p->attn_threads, p->max_clients);
		return -EINVAL;
	}
	rs = calloc(1, sizeof(*rs));
	if (!rs) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	rs->p = *p;
	rs->p.run_dir = NULL;
	rs->max_clients = p->max_clients;
	rs->max_clients_per_uid = p->max_clients_per_uid;
	rs->max_workers_per_uid = p->max_workers_per_uid;
	rs->max_arena_per_uid = p->max_arena_per_uid;
	rs->st = st;
	rs->ks = ks;
	rs->listen_fd = rs->epoll_fd = rs->event_fd = -1;
	pthread_mutex_init(&rs->lock, NULL);
	pthread_cond_init(&rs->work, NULL);

	if ((size_t)snprintf(rs->sock_path, sizeof(rs->sock_path), "%s/%s", p->run_dir, TQKV_DATA_SOCK) >=
	    sizeof(rs->sock_path)) {
		snprintf(why, whylen, "socket path %s/%s is too long", p->run_dir, TQKV_DATA_SOCK);
		r = -ENAMETOOLONG;
		goto fail;
	}
	memcpy(sa.sun_path, rs->sock_path, sizeof(rs->sock_path));
	rs->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	rs->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
	rs->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (rs->listen_fd < 0 || rs->epoll_fd < 0 || rs->event_fd < 0) {
		r = -errno;
		snprintf(why, whylen, "socket/epoll/eventfd: %s", strerror(errno));
		goto fail;
	}
	/* The caller holds the run directory's lock: a stale socket is ours.
	 * Mode 0660 and the clients' group, as control.sock: whoever may open
	 * a session must be able to reach its data too. */
	unlink(rs->sock_path);
	mode_t old = umask(0117);
	r = bind(rs->listen_fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (r < 0 || chmod(rs->sock_path, 0660) < 0 ||
	    (p->sock_gid != (gid_t)-1 && chown(rs->sock_path, (uid_t)-1, p->sock_gid) < 0) ||
	    listen(rs->listen_fd, 128) < 0) {
		r = -errno;
		snprintf(why, whylen, "%s: %s", rs->sock_path, strerror(errno));
		goto fail;
	}
	ev.events = EPOLLIN;
	ev.data.ptr = &rs->listen_fd;
	epoll_ctl(rs->epoll_fd, EPOLL_CTL_ADD, rs->listen_fd, &ev);
	ev.data.ptr = &rs->event_fd;
	epoll_ctl(rs->epoll_fd, EPOLL_CTL_ADD, rs->event_fd, &ev);

	rs->workers = calloc(p->n_workers, sizeof(*rs->workers));
	if (!rs->workers) {
		r = -ENOMEM;
		snprintf(why, whylen, "out of memory");
		goto fail;
	}
	for (uint32_t i = 0; i < p->n_workers; i++) {
		struct ring_worker *w = &rs->workers[i];
		w->rs = rs;
		if (p->attn_threads > 1 && (r = tq_threads_new(&w->ws.threads, (int)p->attn_threads)) < 0) {
			snprintf(why, whylen, "attention threads: %s", strerror(-r));
			goto fail;
		}
		if ((r = pthread_create(&w->thread, NULL, worker_main, w)) != 0) {
			snprintf(why, whylen, "worker thread: %s", strerror(r));
			r = -r;
			goto fail;
		}
		w->started = true;
		rs->n_workers++;
	}
	if ((r = pthread_create(&rs->ctl_thread, NULL, ctl_main, rs)) != 0) {
		snprintf(why, whylen, "ring-ctl thread: %s", strerror(r));
		r = -r;
		goto fail;
	}
	rs->ctl_started = true;
	*out = rs;
	return 0;
fail:
	ring_server_free(rs);
	return r;
}

void ring_server_free(struct ring_server *rs)
{
	if (!rs)
		return;
	__atomic_store_n(&rs->stopping, 1, __ATOMIC_SEQ_CST);
	if (rs->ctl_started) {
		uint64_t one = 1;
		if (write(rs->event_fd, &one, sizeof(one)) < 0) {
			/* saturated: ring-ctl wakes anyway */
		}
		pthread_join(rs->ctl_thread, NULL);
	}
	if (rs->listen_fd >= 0) {
		close(rs->listen_fd);
		unlink(rs->sock_path);
	}
	/* Every client: SHUTDOWN, stop, wait for its ring thread's teardown. */
	pthread_mutex_lock(&rs->lock);
	for (struct ring_client *c = rs->clients; c; c = c->next) {
		__atomic_store_n(&c->closing, 1, __ATOMIC_SEQ_CST);
		if (c->live) {
			__atomic_store_n(&c->hdr->state, TQKV_RING_SHUTDOWN, __ATOMIC_SEQ_CST);
			futex_wake(&c->hdr->sq_tail);
			futex_wake(&c->hdr->cq_tail);
		}
		/* also ends a handshake still waiting for its hello */
		shutdown(c->fd, SHUT_RDWR);
	}
	pthread_mutex_unlock(&rs->lock);
	/* The workers keep running until the clients are gone: they finish or
	 * drop what is queued, so the ring threads' teardowns complete. */
	for (;;) {
		bool left;
		reap(rs);
		pthread_mutex_lock(&rs->lock);
		left = rs->clients != NULL;
		pthread_mutex_unlock(&rs->lock);
		if (!left)
			break;
		usleep(1000);
	}
	pthread_mutex_lock(&rs->lock);
	__atomic_store_n(&rs->workers_stop, 1, __ATOMIC_SEQ_CST);
	pthread_cond_broadcast(&rs->work);
	pthread_mutex_unlock(&rs->lock);
	if (rs->workers) {
		for (uint32_t i = 0; i < rs->p.n_workers; i++) {
			if (rs->workers[i].started)
				pthread_join(rs->workers[i].thread, NULL);
			dataop_ws_free(&rs->workers[i].ws);
		}
		free(rs->workers);
	}
	if (rs->epoll_fd >= 0)
		close(rs->epoll_fd);
	if (rs->event_fd >= 0)
		close(rs->event_fd);
	pthread_cond_destroy(&rs->work);
	pthread_mutex_destroy(&rs->lock);
	free(rs);
}

void ring_server_stats(struct ring_server *rs, struct ring_stats *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&rs->lock);
	out->clients = rs->n_clients;
	pthread_mutex_unlock(&rs->lock);
	out->clients_total = __atomic_load_n(&rs->clients_total, __ATOMIC_RELAXED);
	out->handshakes_failed = __atomic_load_n(&rs->handshakes_failed, __ATOMIC_RELAXED);
	out->ops_total = __atomic_load_n(&rs->ops_total, __ATOMIC_RELAXED);
	out->op_errors_total = __atomic_load_n(&rs->op_errors_total, __ATOMIC_RELAXED);
	out->ops_dropped = __atomic_load_n(&rs->ops_dropped, __ATOMIC_RELAXED);
	out->rings_broken = __atomic_load_n(&rs->rings_broken, __ATOMIC_RELAXED);
	out->sessions_closed_on_eof = __atomic_load_n(&rs->sessions_closed_on_eof, __ATOMIC_RELAXED);
	out->arena_bytes = __atomic_load_n(&rs->arena_bytes, __ATOMIC_RELAXED);
	out->ops_run = __atomic_load_n(&rs->ops_run, __ATOMIC_RELAXED);
	out->op_queue_us = __atomic_load_n(&rs->op_queue_ns, __ATOMIC_RELAXED) / 1000u;
	out->op_run_us = __atomic_load_n(&rs->op_run_ns, __ATOMIC_RELAXED) / 1000u;
}

void ring_server_set_limits(struct ring_server *rs, uint32_t max_clients, uint32_t max_clients_per_uid,
			    uint64_t max_arena_per_uid)
{
	if (!rs)
		return;
	__atomic_store_n(&rs->max_clients, max_clients ? max_clients : 1, __ATOMIC_RELAXED);
	__atomic_store_n(&rs->max_clients_per_uid, max_clients_per_uid, __ATOMIC_RELAXED);
	__atomic_store_n(&rs->max_arena_per_uid, max_arena_per_uid, __ATOMIC_RELAXED);
}

void ring_server_set_worker_share(struct ring_server *rs, uint32_t max_workers_per_uid)
{
	if (!rs)
		return;
	pthread_mutex_lock(&rs->lock);
	rs->max_workers_per_uid = max_workers_per_uid;
	if (rs->sleepers)
		pthread_cond_broadcast(&rs->work); /* a raised cap may free queued work */
	pthread_mutex_unlock(&rs->lock);
}

int ring_server_bind(struct ring_server *rs, uint64_t client_id, uid_t uid, uint64_t id,
		     const struct session_geom *g, bool detached)
{
	struct ring_client *c;
	struct binding *b, **pp;
	int r = 0;

	pthread_mutex_lock(&rs->lock);
	for (c = rs->clients; c && !(c->id == client_id && c->live); c = c->next)
		;
	/* closing is checked under rs->lock: the ring thread's teardown walks
	 * the bindings under it after closing is set, so a binding made here
	 * is either refused or seen (and its session closed) by the teardown. */
	if (!c)
		r = -ENOENT;
	else if (c->uid != uid)
		r = -EPERM;
	else if (__atomic_load_n(&c->closing, __ATOMIC_ACQUIRE))
		r = -ESHUTDOWN;
	else if (*(pp = map_slot(rs, id)))
		r = -EBUSY;
	else if (c->n_bindings >= TQKV_MAX_ATTACHED)
		r = -EUSERS;
	else if (!(b = calloc(1, sizeof(*b))))
		r = -ENOMEM;
	if (r == 0) {
		b->id = id;
		b->c = c;
		b->geom = *g;
		b->ephemeral = !detached;
		*pp = b;
		b->c_next = c->bindings;
		c->bindings = b;
		c->n_bindings++;
	}
	pthread_mutex_unlock(&rs->lock);
	return r;
}
