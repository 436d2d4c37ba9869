/* tqkv.c — libtqkv: the client side of the data ring plus session open /
 * close over the control channel (ctl.c).
 *
 * One mutex per connection guards the private ring indices, the request
 * table and the arena slots.  One waiting thread at a time is the reaper:
 * it spins briefly on the CQ tail, then sleeps on it (futex), and hands
 * every completion it finds to its request; the other waiters sleep on a
 * condition variable.  Inputs are copied into arena slots at submit time;
 * outputs are copied out by tqkv_wait.
 */
#include "tqkv.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stddef.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "tqkv.pb-c.h"
#include "tqkv_ring.h"

#define DEFAULT_RUN_DIR   "/run/tqkvd"
#define DEFAULT_DEPTH     64u
#define DEFAULT_ARENA     ((uint64_t)64 << 20)
#define SPIN_NS           20000u     /* spin on the CQ before sleeping */
#define SLEEP_MS          50         /* futex sleeps end this often to check the socket */
#define DEFAULT_OP_TIMEOUT_MS 60000  /* data operations (tqkv_connect_opts.op_timeout_ms) */

#define EXPORT __attribute__((visibility("default")))

struct tqkv_req {
	tqkv *c;
	uint32_t idx, gen;
	bool in_use, done;
	bool abandoned;               /* timed out: freed when its CQE comes (or the connection dies) */
	uint32_t slot0, n_slots;      /* arena slots held */
	float *out;                   /* caller's output, or NULL */
	uint64_t out_off;
	size_t out_bytes;
	uint64_t deadline;            /* op_timeout_ms from its submit (ns; 0: none) */
	struct tqkv_result res;
};

struct tqkv_session {
	tqkv *c;
	uint64_t id, seed;
	uint32_t n_layers, n_kv_heads, n_q_heads, head_dim;
};

struct tqkv {
	int fd;
	uint8_t *map;
	size_t map_bytes;
	struct tqkv_ring_hdr *hdr;
	uint8_t *sq, *cq, *arena;
	uint32_t sq_entries, cq_entries;
	uint64_t arena_bytes;
	uint64_t client_id;
	uint32_t flags;
	int timeout_ms;               /* control calls */
	int op_timeout_ms;            /* data operations; < 0: none */
	const char *die_at;           /* $TQKV_TEST_DIE_AT: tests only, see test_die() */

	pthread_mutex_t ctl_lock;     /* struct ctl is one-thread-at-a-time */
	struct ctl *ctl;

	pthread_mutex_t lock;         /* everything below */
	pthread_cond_t cond;          /* completions reaped / slots freed */
	uint32_t sq_tail, cq_head;
	bool reaping;
	int dead;                     /* 0, or the errno every call now returns */
	uint32_t n_slots;
	uint64_t slot_bytes;
	uint8_t *slot_used;           /* [n_slots] */
	struct tqkv_req *reqs;        /* [cq_entries] */
	uint32_t *free_reqs, n_free;
};

static __thread char last_err[320];

static int fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_err, sizeof(last_err), fmt, ap);
	va_end(ap);
	return err;
}

EXPORT const char *tqkv_last_error(void)
{
	return last_err;
}

EXPORT const char *tqkv_strerror(int err)
{
	const char *s;

	if (err < 0)
		err = -err;
	s = strerrordesc_np(err);
	return s ? s : "unknown error";
}

EXPORT const char *tqkv_status_name(uint32_t status)
{
	return tqkv_status_str(status);
}

static void futex_wake(uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void futex_wait(uint32_t *addr, uint32_t val, int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static uint64_t now_ns(void)
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

/* ---- completions (c->lock held) --------------------------------------------------- */

static void req_free_locked(tqkv *c, struct tqkv_req *q);

/* A test-only hook: with $TQKV_TEST_DIE_AT naming this point, the process
 * exits on the spot, as if killed there (tests/integration prove that the
 * daemon cleans up after a client that dies inside a call). */
static void test_die(const tqkv *c, const char *point)
{
	if (c->die_at && strcmp(c->die_at, point) == 0)
		_exit(86);
}

static void mark_dead(tqkv *c, int err)
{
	if (c->dead)
		return;
	c->dead = err;
	for (uint32_t i = 0; i < c->cq_entries; i++) {
		struct tqkv_req *q = &c->reqs[i];
		if (q->in_use && q->abandoned)
			req_free_locked(c, q);
		else if (q->in_use && !q->done) {
			q->done = true;
			q->res.res = err;
		}
	}
}

static void reap_locked(tqkv *c)
{
	uint32_t tail = __atomic_load_n(&c->hdr->cq_tail, __ATOMIC_ACQUIRE);

	if (tail - c->cq_head > c->cq_entries) {
		/* more completions than the ring holds: not a daemon's ring any more */
		mark_dead(c, -EPROTO);
		return;
	}
	while (c->cq_head != tail) {
		struct tqkv_cqe e;
		memcpy(&e, c->cq + (size_t)(c->cq_head & (c->cq_entries - 1)) * sizeof(e), sizeof(e));
		c->cq_head++;
		uint32_t idx = (uint32_t)e.user_data, gen = (uint32_t)(e.user_data >> 32);
		if (idx < c->cq_entries) {
			struct tqkv_req *q = &c->reqs[idx];
			if (q->in_use && q->abandoned && q->gen == gen) {
				req_free_locked(c, q); /* its waiter gave up; the arena slots are free now */
			} else if (q->in_use && !q->done && q->gen == gen) {
				q->done = true;
				q->res.res = e.res;
				q->res.status = e.status;
				q->res.detail = e.detail;
				q->res.n_tokens = e.n_tokens;
			}
		}
	}
	__atomic_store_n(&c->hdr->cq_head, c->cq_head, __ATOMIC_SEQ_CST);
	/* The daemon may be holding SQEs back until the CQ has room. */
	if (__atomic_load_n(&c->hdr->sq_sleeping, __ATOMIC_SEQ_CST) &&
	    __atomic_load_n(&c->hdr->sq_head, __ATOMIC_ACQUIRE) != c->sq_tail)
		futex_wake(&c->hdr->sq_tail);
	uint32_t st = __atomic_load_n(&c->hdr->state, __ATOMIC_ACQUIRE);
	if (st == TQKV_RING_BROKEN)
		mark_dead(c, -EPROTO);
	else if (st == TQKV_RING_SHUTDOWN)
		mark_dead(c, -ESHUTDOWN);
}

/* Wait for some progress: become the reaper (spin, then futex) or sleep
 * until the reaper reports.  c->lock held on entry and exit.  deadline: a
 * CLOCK_MONOTONIC time in ns, or 0; the caller checks whether it passed. */
static void progress_locked(tqkv *c, uint64_t deadline)
{
	if (c->reaping) {
		if (deadline) {
			struct timespec ts = { (time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u) };
			pthread_cond_timedwait(&c->cond, &c->lock, &ts);
		} else {
			pthread_cond_wait(&c->cond, &c->lock);
		}
		return;
	}
	uint32_t before = c->cq_head;
	reap_locked(c);
	if (c->cq_head != before || c->dead) {
		/* completions were waiting: that is progress, no need to sleep */
		pthread_cond_broadcast(&c->cond);
		return;
	}
	c->reaping = true;
	uint32_t seen = c->cq_head;
	pthread_mutex_unlock(&c->lock);

	uint64_t t0 = now_ns();
	bool got = false;
	while (now_ns() - t0 < SPIN_NS) {
		if (__atomic_load_n(&c->hdr->cq_tail, __ATOMIC_ACQUIRE) != seen) {
			got = true;
			break;
		}
		cpu_relax();
	}
	if (!got) {
		__atomic_store_n(&c->hdr->cq_waiting, 1, __ATOMIC_SEQ_CST);
		int ms = SLEEP_MS;
		if (deadline) {
			uint64_t now = now_ns();
			ms = now >= deadline ? 0 : (deadline - now) / 1000000u < SLEEP_MS ? (int)((deadline - now) / 1000000u) + 1 : SLEEP_MS;
		}
		if (ms > 0 && __atomic_load_n(&c->hdr->cq_tail, __ATOMIC_SEQ_CST) == seen)
			futex_wait(&c->hdr->cq_tail, seen, ms);
		__atomic_store_n(&c->hdr->cq_waiting, 0, __ATOMIC_RELAXED);
	}
	pthread_mutex_lock(&c->lock);
	reap_locked(c);
	if (c->cq_head == seen && !c->dead) {
		/* nothing came: is the daemon still there? */
		struct pollfd p = { .fd = c->fd, .events = POLLIN };
		if (poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)))
			mark_dead(c, -ECONNRESET);
	}
	c->reaping = false;
	pthread_cond_broadcast(&c->cond);
}

/* ---- submission -------------------------------------------------------------------- */

struct in_buf {
	const void *src;
	size_t bytes;
	uint64_t *off;        /* where the arena offset goes in the SQE */
};

static bool slots_find(tqkv *c, uint32_t need, uint32_t *first)
{
	uint32_t run = 0;

	for (uint32_t i = 0; i < c->n_slots; i++) {
		run = c->slot_used[i] ? 0 : run + 1;
		if (run == need) {
			*first = i + 1 - need;
			return true;
		}
	}
	return false;
}

static void req_free_locked(tqkv *c, struct tqkv_req *q)
{
	for (uint32_t i = 0; i < q->n_slots; i++)
		c->slot_used[q->slot0 + i] = 0;
	q->in_use = false;
	q->abandoned = false; /* the next operation in this slot is waited for */
	c->free_reqs[c->n_free++] = q->idx;
	pthread_cond_broadcast(&c->cond);
}

/* Queue one SQE: inputs copied into fresh arena slots, followed by room
 * for out_bytes of output.  e->user_data and offsets are filled here. */
static int submit(tqkv *c, struct tqkv_sqe *e, struct in_buf *in, int n_in, float *out,
		  size_t out_bytes, uint64_t *out_off, tqkv_req **reqp)
{
	uint64_t total = 0, off, deadline, need64;
	uint32_t need, first = 0;
	struct tqkv_req *q;
	int r;

	*reqp = NULL;
	/* each part at most the arena (the sum then cannot wrap), the slot
	 * count checked before it is narrowed */
	for (int i = 0; i <= n_in; i++) {
		uint64_t b = i < n_in ? in[i].bytes : out_bytes;
		if (b > c->arena_bytes)
			return fail(-E2BIG, "operation needs more than the connection's %llu bytes of arena",
				    (unsigned long long)c->arena_bytes);
		total += (b + 63) & ~(uint64_t)63;
	}
	need64 = (total + c->slot_bytes - 1) / c->slot_bytes;
	if (need64 > c->n_slots)
		return fail(-E2BIG, "operation needs %llu bytes of arena, the connection has %llu",
			    (unsigned long long)total, (unsigned long long)c->arena_bytes);
	need = (uint32_t)need64;

	deadline = c->op_timeout_ms > 0 ? now_ns() + (uint64_t)c->op_timeout_ms * 1000000u : 0;
	pthread_mutex_lock(&c->lock);
	for (;;) {
		if (c->dead) {
			r = fail(c->dead, "connection to tqkvd lost: %s", tqkv_strerror(c->dead));
			goto out;
		}
		if (c->n_free && (need == 0 || slots_find(c, need, &first)) &&
		    c->sq_tail - __atomic_load_n(&c->hdr->sq_head, __ATOMIC_ACQUIRE) < c->sq_entries)
			break;
		if (deadline && now_ns() >= deadline) {
			r = fail(-ETIMEDOUT, "no room in the ring for %d ms: tqkvd is not taking operations "
				 "(stopped or overloaded); nothing was submitted", c->op_timeout_ms);
			goto out;
		}
		progress_locked(c, deadline);
	}
	q = &c->reqs[c->free_reqs[--c->n_free]];
	q->in_use = true;
	q->done = false;
	q->abandoned = false;
	q->gen++;
	q->slot0 = first;
	q->n_slots = need;
	q->out = out;
	q->out_bytes = out_bytes;
	q->deadline = deadline; /* submit + wait: one deadline (tqkv_wait) */
	memset(&q->res, 0, sizeof(q->res));
	for (uint32_t i = 0; i < need; i++)
		c->slot_used[first + i] = 1;
	off = (uint64_t)first * c->slot_bytes;
	for (int i = 0; i < n_in; i++) {
		memcpy(c->arena + off, in[i].src, in[i].bytes);
		*in[i].off = off;
		off += (in[i].bytes + 63) & ~(uint64_t)63;
	}
	q->out_off = off;
	if (out_off)
		*out_off = off;
	e->user_data = (uint64_t)q->gen << 32 | q->idx;
	memcpy(c->sq + (size_t)(c->sq_tail & (c->sq_entries - 1)) * sizeof(*e), e, sizeof(*e));
	c->sq_tail++;
	__atomic_store_n(&c->hdr->sq_tail, c->sq_tail, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&c->hdr->sq_sleeping, __ATOMIC_SEQ_CST))
		futex_wake(&c->hdr->sq_tail);
	*reqp = q;
	r = 0;
out:
	pthread_mutex_unlock(&c->lock);
	return r;
}

EXPORT int tqkv_wait_timeout(tqkv_req *q, struct tqkv_result *res, int timeout_ms)
{
	tqkv *c = q->c;
	const bool own = timeout_ms != TQKV_WAIT_DEFAULT;
	/* the connection's deadline runs from the operation's submit (a
	 * submit that waited for room leaves the wait the rest of it) */
	uint64_t deadline = own ? (timeout_ms > 0 ? now_ns() + (uint64_t)timeout_ms * 1000000u : 0) : q->deadline;
	int r;

	pthread_mutex_lock(&c->lock);
	while (!q->done) {
		if (deadline && now_ns() >= deadline) {
			/* a completion already in the queue is not late (also
			 * while another thread is the reaper: it has let go of
			 * the lock, and reads the queue again when it takes it) */
			if (!c->dead) {
				uint32_t before = c->cq_head;
				reap_locked(c);
				if (c->cq_head != before || c->dead)
					pthread_cond_broadcast(&c->cond);
			}
			if (q->done)
				break;
			/* Abandon it: the arena slots stay reserved until its
			 * completion comes, since the daemon may still write them. */
			q->abandoned = true;
			if (res) {
				memset(res, 0, sizeof(*res));
				res->res = -ETIMEDOUT;
			}
			pthread_mutex_unlock(&c->lock);
			if (own)
				return fail(-ETIMEDOUT, "no completion from tqkvd in %d ms; the operation was "
					    "abandoned (it may still run: the session's state after it is unknown)",
					    timeout_ms);
			return fail(-ETIMEDOUT, "no completion from tqkvd within %d ms of the submit "
				    "(op_timeout_ms); the operation was abandoned (it may still run: the session's "
				    "state after it is unknown)", c->op_timeout_ms);
		}
		progress_locked(c, deadline);
	}
	if (q->res.res >= 0 && q->out && q->out_bytes)
		memcpy(q->out, c->arena + q->out_off, q->out_bytes);
	if (res)
		*res = q->res;
	r = q->res.res;
	if (r < 0 && q->res.status == TQKV_ST_EVICTED)
		fail(r, "session %s", tqkv_evict_reason_str(q->res.detail));
	else if (r < 0 && q->res.status)
		fail(r, "%s (detail %u)", tqkv_status_str(q->res.status), q->res.detail);
	else if (r < 0)
		fail(r, "%s", tqkv_strerror(r));
	req_free_locked(c, q);
	pthread_mutex_unlock(&c->lock);
	return r;
}

EXPORT int tqkv_wait(tqkv_req *q, struct tqkv_result *res)
{
	return tqkv_wait_timeout(q, res, TQKV_WAIT_DEFAULT);
}

static size_t dsize(enum tqkv_dtype dt)
{
	return dt == TQKV_F32 ? 4 : dt == TQKV_F16 || dt == TQKV_BF16 ? 2 : 0;
}

/* a * b * c * d bytes, or -E2BIG when that does not fit a size_t */
static int bytes_of(uint64_t a, uint64_t b, uint64_t c, uint64_t d, size_t *out)
{
	uint64_t x;

	if (__builtin_mul_overflow(a, b, &x) || __builtin_mul_overflow(x, c, &x) ||
	    __builtin_mul_overflow(x, d, &x) || x > SIZE_MAX)
		return -E2BIG;
	*out = (size_t)x;
	return 0;
}

static int check_dtype(enum tqkv_dtype dt)
{
	return dsize(dt) ? 0 : fail(-EINVAL, "unknown dtype %d", (int)dt);
}

EXPORT int tqkv_submit_append_attend(tqkv_session *s, uint32_t layer, const void *k, const void *v,
				     uint32_t n_tokens, const void *q, const int32_t *pos, uint32_t n_q,
				     enum tqkv_dtype dtype, float *out, tqkv_req **req)
{
	struct tqkv_sqe e;
	struct in_buf in[4];
	int n_in = 0, r;
	size_t es = dsize(dtype), kvb, qb, ob;

	*req = NULL;
	if ((r = check_dtype(dtype)) < 0)
		return r;
	/* a session attached with the caller's geometry: its shape is the
	 * caller's word, so the sizes are checked, not trusted to fit */
	if (bytes_of(n_tokens, s->n_kv_heads, s->head_dim, es, &kvb) < 0 ||
	    bytes_of(n_q, s->n_q_heads, s->head_dim, es, &qb) < 0 ||
	    bytes_of(n_q, s->n_q_heads, s->head_dim, sizeof(float), &ob) < 0)
		return fail(-E2BIG, "operation too large (%u tokens, %u queries of %u x %u)", n_tokens, n_q,
			    s->n_q_heads, s->head_dim);
	if ((n_tokens && (!k || !v)) || (n_q && (!q || !pos || !out)) || (!n_tokens && !n_q))
		return fail(-EINVAL, "NULL buffer or nothing to do");
	memset(&e, 0, sizeof(e));
	e.opcode = n_tokens && n_q ? TQKV_OP_APPEND_ATTEND : n_tokens ? TQKV_OP_APPEND : TQKV_OP_ATTEND;
	e.dtype = (uint8_t)dtype;
	e.layer = layer;
	e.session = s->id;
	e.n_tokens = n_tokens;
	e.n_q = n_q;
	if (n_tokens) {
		in[n_in++] = (struct in_buf){ k, kvb, &e.k_off };
		in[n_in++] = (struct in_buf){ v, kvb, &e.v_off };
	}
	if (n_q) {
		in[n_in++] = (struct in_buf){ q, qb, &e.q_off };
		in[n_in++] = (struct in_buf){ pos, (size_t)n_q * sizeof(int32_t), &e.pos_off };
	}
	return submit(s->c, &e, in, n_in, n_q ? out : NULL, n_q ? ob : 0, n_q ? &e.out_off : NULL, req);
}

EXPORT int tqkv_submit_append(tqkv_session *s, uint32_t layer, const void *k, const void *v,
			      uint32_t n_tokens, enum tqkv_dtype dtype, tqkv_req **req)
{
	if (!n_tokens) {
		*req = NULL;
		return fail(-EINVAL, "append of 0 tokens");
	}
	return tqkv_submit_append_attend(s, layer, k, v, n_tokens, NULL, NULL, 0, dtype, NULL, req);
}

EXPORT int tqkv_submit_attend(tqkv_session *s, uint32_t layer, const void *q, const int32_t *pos,
			      uint32_t n_q, enum tqkv_dtype dtype, float *out, tqkv_req **req)
{
	if (!n_q) {
		*req = NULL;
		return fail(-EINVAL, "attend with 0 queries");
	}
	return tqkv_submit_append_attend(s, layer, NULL, NULL, 0, q, pos, n_q, dtype, out, req);
}

EXPORT int tqkv_submit_truncate(tqkv_session *s, uint32_t layer, uint64_t pos, tqkv_req **req)
{
	struct tqkv_sqe e;

	memset(&e, 0, sizeof(e));
	e.opcode = TQKV_OP_TRUNCATE;
	e.session = s->id;
	if (layer == TQKV_ALL_LAYERS)
		e.flags = TQKV_SQE_ALL_LAYERS;
	else
		e.layer = layer;
	e.pos = pos;
	return submit(s->c, &e, NULL, 0, NULL, 0, NULL, req);
}

EXPORT int tqkv_submit_nop(tqkv *c, tqkv_req **req)
{
	struct tqkv_sqe e;

	memset(&e, 0, sizeof(e));
	e.opcode = TQKV_OP_NOP;
	return submit(c, &e, NULL, 0, NULL, 0, NULL, req);
}

/* The result of a blocking call: the layer's length for append and
 * truncate, the query count for attend. */
static int wait_value(tqkv_req *q, int r, bool length)
{
	struct tqkv_result res;

	if (r < 0)
		return r;
	if ((r = tqkv_wait(q, &res)) < 0)
		return r;
	if (length)
		return res.n_tokens > INT_MAX ? INT_MAX : (int)res.n_tokens;
	return r;
}

EXPORT int tqkv_append(tqkv_session *s, uint32_t layer, const void *k, const void *v,
		       uint32_t n_tokens, enum tqkv_dtype dtype)
{
	tqkv_req *q;
	int r = tqkv_submit_append(s, layer, k, v, n_tokens, dtype, &q);
	return wait_value(q, r, true);
}

EXPORT int tqkv_attend(tqkv_session *s, uint32_t layer, const void *qv, const int32_t *pos,
		       uint32_t n_q, enum tqkv_dtype dtype, float *out)
{
	tqkv_req *q;
	int r = tqkv_submit_attend(s, layer, qv, pos, n_q, dtype, out, &q);
	return wait_value(q, r, false);
}

EXPORT int tqkv_append_attend(tqkv_session *s, uint32_t layer, const void *k, const void *v,
			      uint32_t n_tokens, const void *qv, const int32_t *pos, uint32_t n_q,
			      enum tqkv_dtype dtype, float *out)
{
	tqkv_req *q;
	int r = tqkv_submit_append_attend(s, layer, k, v, n_tokens, qv, pos, n_q, dtype, out, &q);
	return wait_value(q, r, false);
}

EXPORT int tqkv_truncate(tqkv_session *s, uint32_t layer, uint64_t pos)
{
	tqkv_req *q;
	int r = tqkv_submit_truncate(s, layer, pos, &q);
	return wait_value(q, r, true);
}

EXPORT int tqkv_nop(tqkv *c)
{
	tqkv_req *q;
	int r = tqkv_submit_nop(c, &q);
	return wait_value(q, r, false);
}

/* ---- connection ------------------------------------------------------------------------ */

/* Set the socket's SO_RCVTIMEO or SO_SNDTIMEO to what is left until
 * deadline (CLOCK_MONOTONIC ns): 0, or -ETIMEDOUT once it has passed.  A
 * socket call with a timeout is not restarted after a signal handler ran
 * (EINTR, SA_RESTART or not): connecting calls it again with what is
 * left, so a caller's timer signals do not fail tqkv_connect. */
static int sock_timeo(int fd, int opt, uint64_t deadline)
{
	uint64_t now = now_ns();
	if (now >= deadline)
		return -ETIMEDOUT;
	uint64_t us = (deadline - now + 999) / 1000;
	struct timeval tv = { (time_t)(us / 1000000u), (suseconds_t)(us % 1000000u) };
	return setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof(tv)) < 0 ? -errno : 0;
}

static int handshake(tqkv *c, int memfd, const struct tqkv_ring_layout *lay, uint64_t deadline)
{
	struct tqkv_hello h;
	struct tqkv_welcome w;
	union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } cbuf;
	struct iovec iov = { &h, sizeof(h) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
			      .msg_controllen = sizeof(cbuf.buf) };
	struct cmsghdr *cm;
	struct timeval tv;
	int send_err = 0, r;
	ssize_t n;

	memset(&h, 0, sizeof(h));
	memset(&cbuf, 0, sizeof(cbuf));
	h.magic = TQKV_RING_MAGIC;
	h.version = TQKV_RING_VERSION;
	h.sq_entries = c->sq_entries;
	h.cq_entries = c->cq_entries;
	h.arena_bytes = c->arena_bytes;
	h.total_bytes = lay->total_bytes;
	cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &memfd, sizeof(int));
	/* A daemon that refuses the connection (limits) answers first and
	 * closes: the send may then fail with EPIPE/ECONNRESET while its
	 * answer waits in our queue.  Read it either way, so the caller
	 * gets the daemon's reason, not a bare errno.  (A message on a
	 * SOCK_SEQPACKET socket goes whole or not at all: an interrupted
	 * send sent nothing.) */
	while ((r = sock_timeo(c->fd, SO_SNDTIMEO, deadline)) == 0 &&
	       (n = sendmsg(c->fd, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
	}
	if (r == 0 && n != (ssize_t)sizeof(h)) {
		int err = n < 0 ? errno : EPROTO;
		if (err == EAGAIN || err == EWOULDBLOCK)
			r = -ETIMEDOUT;
		else if (err != EPIPE && err != ECONNRESET)
			return fail(-err, "sending the ring handshake: %s", strerror(err));
		else
			send_err = err;
	}
	if (r == -ETIMEDOUT)
		return fail(-ETIMEDOUT, "the ring handshake could not be sent in %d ms (timeout_ms): tqkvd is "
			    "stopped or overloaded", c->timeout_ms);
	if (r < 0)
		return fail(r, "the ring handshake: setting the socket's timeout: %s", strerror(-r));
	/* the daemon's answer by the connection's deadline (timeout_ms) */
	n = -1; /* (not the send's count) */
	bool reset = false;
	while (r == 0 && (r = sock_timeo(c->fd, SO_RCVTIMEO, deadline)) == 0) {
		n = recv(c->fd, &w, sizeof(w), 0);
		if (n < 0 && errno == EINTR)
			continue; /* a signal handler ran: wait what is left */
		if (n < 0 && errno == ECONNRESET && !reset) {
			reset = true; /* reported before queued data, once: read on */
			continue;
		}
		if (n == 0 && reset) {
			n = -1; /* nothing queued behind the reset */
			errno = ECONNRESET;
		}
		break;
	}
	if (n != (ssize_t)sizeof(w)) {
		int err = send_err ? send_err : r < 0 ? -r : n < 0 ? errno : EPROTO;
		if (err == EAGAIN || err == EWOULDBLOCK || err == ETIMEDOUT)
			return fail(-ETIMEDOUT, "no answer to the ring handshake in %d ms (timeout_ms): tqkvd is "
				    "stopped or overloaded", c->timeout_ms);
		return fail(-err, "no answer to the ring handshake: %s", strerror(err));
	}
	w.msg[sizeof(w.msg) - 1] = 0;
	if (w.magic != TQKV_RING_MAGIC)
		return fail(-EPROTO, "the data socket's answer is not tqkvd's");
	if (w.res < 0)
		return fail(w.res, "tqkvd refused the data connection: %s", w.msg);
	tv = (struct timeval){ 0, 0 };
	setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	c->client_id = w.client_id;
	return 0;
}

EXPORT void tqkv_disconnect(tqkv *c)
{
	if (!c)
		return;
	if (c->fd >= 0) {
		/* the end for the daemon even where a forked child holds the
		 * socket too (close alone ends it only with the last holder) */
		shutdown(c->fd, SHUT_RDWR);
		close(c->fd);
	}
	if (c->map)
		munmap(c->map, c->map_bytes);
	ctl_close(c->ctl);
	free(c->slot_used);
	free(c->reqs);
	free(c->free_reqs);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->ctl_lock);
	pthread_cond_destroy(&c->cond);
	free(c);
}

EXPORT uint64_t tqkv_client_id(const tqkv *c)
{
	return c->client_id;
}

/* tqkv_connect@@TQKV_0.2: see the 0.1 twin below. */
int tqkv_connect_0_2(tqkv **out, const struct tqkv_connect_opts *o);
__asm__(".symver tqkv_connect_0_2,tqkv_connect@@TQKV_0.2");
EXPORT int tqkv_connect_0_2(tqkv **out, const struct tqkv_connect_opts *o)
{
	struct tqkv_connect_opts d = { 0 };
	struct tqkv_ring_layout lay;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *run_dir;
	tqkv *c = NULL;
	int memfd = -1, r;

	*out = NULL;
	if (!o)
		o = &d;
	run_dir = o->run_dir ? o->run_dir : getenv("TQKV_RUN_DIR") ? getenv("TQKV_RUN_DIR") : DEFAULT_RUN_DIR;
	c = calloc(1, sizeof(*c));
	if (!c)
		return fail(-ENOMEM, "out of memory");
	c->fd = -1;
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->ctl_lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines are monotonic */
	pthread_cond_init(&c->cond, &ca);
	pthread_condattr_destroy(&ca);
	c->flags = o->flags;
	c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000;
	c->op_timeout_ms = o->op_timeout_ms ? o->op_timeout_ms : DEFAULT_OP_TIMEOUT_MS;
	c->die_at = getenv("TQKV_TEST_DIE_AT");
	c->sq_entries = o->queue_depth ? o->queue_depth : DEFAULT_DEPTH;
	c->cq_entries = c->sq_entries * 2 <= TQKV_CQ_ENTRIES_MAX ? c->sq_entries * 2 : c->sq_entries;
	c->arena_bytes = o->arena_bytes ? o->arena_bytes : DEFAULT_ARENA;
	if (tqkv_ring_layout(c->sq_entries, c->cq_entries, c->arena_bytes, &lay) < 0) {
		r = fail(-EINVAL, "queue_depth %u (a power of two <= %u) or arena_bytes %llu out of range",
			 c->sq_entries, TQKV_SQ_ENTRIES_MAX, (unsigned long long)c->arena_bytes);
		goto fail;
	}
	/* Arena slots: one per queue entry, at least 64 KiB each when it fits. */
	c->n_slots = c->sq_entries;
	c->slot_bytes = c->arena_bytes / c->n_slots;
	while (c->slot_bytes < 65536 && c->n_slots > 1) {
		c->n_slots /= 2;
		c->slot_bytes = c->arena_bytes / c->n_slots;
	}
	c->slot_bytes &= ~(uint64_t)63;
	c->slot_used = calloc(c->n_slots, 1);
	c->reqs = calloc(c->cq_entries, sizeof(*c->reqs));
	c->free_reqs = calloc(c->cq_entries, sizeof(*c->free_reqs));
	if (!c->slot_used || !c->reqs || !c->free_reqs || c->slot_bytes == 0) {
		r = fail(-ENOMEM, "out of memory");
		goto fail;
	}
	/* Requests: at most cq_entries in flight, so the CQ never overflows. */
	for (uint32_t i = 0; i < c->cq_entries; i++) {
		c->reqs[i].c = c;
		c->reqs[i].idx = i;
		c->free_reqs[c->n_free++] = c->cq_entries - 1 - i;
	}

	memfd = memfd_create("tqkv-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (memfd < 0 || ftruncate(memfd, (off_t)lay.total_bytes) < 0 ||
	    fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		r = fail(-errno, "ring memfd: %s", strerror(errno));
		goto fail;
	}
	c->map = mmap(NULL, lay.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (c->map == MAP_FAILED) {
		c->map = NULL;
		r = fail(-errno, "mapping the ring: %s", strerror(errno));
		goto fail;
	}
	c->map_bytes = lay.total_bytes;
	c->hdr = (struct tqkv_ring_hdr *)(void *)c->map;
	c->sq = c->map + lay.sq_off;
	c->cq = c->map + lay.cq_off;
	c->arena = c->map + lay.arena_off;
	c->hdr->magic = TQKV_RING_MAGIC;
	c->hdr->version = TQKV_RING_VERSION;
	c->hdr->hdr_bytes = TQKV_RING_HDR_BYTES;
	c->hdr->sq_entries = c->sq_entries;
	c->hdr->cq_entries = c->cq_entries;
	c->hdr->sq_off = lay.sq_off;
	c->hdr->cq_off = lay.cq_off;
	c->hdr->arena_off = lay.arena_off;
	c->hdr->arena_bytes = c->arena_bytes;
	c->hdr->total_bytes = lay.total_bytes;

	if ((size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%s", run_dir, TQKV_DATA_SOCK) >=
	    sizeof(sa.sun_path)) {
		r = fail(-ENAMETOOLONG, "run directory %s: path too long", run_dir);
		goto fail;
	}
	c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	/* connect (a full backlog) and the handshake: timeout_ms in all
	 * (handshake clears the socket's timeouts); a signal handler that
	 * interrupts connect() (EINTR: nothing connected) is not an error */
	uint64_t deadline = now_ns() + (uint64_t)c->timeout_ms * 1000000u;
	int cr = -1;
	if (c->fd >= 0) {
		while ((r = sock_timeo(c->fd, SO_SNDTIMEO, deadline)) == 0 &&
		       (cr = connect(c->fd, (struct sockaddr *)&sa, sizeof(sa))) < 0 && errno == EINTR) {
		}
		if (r < 0)
			errno = r == -ETIMEDOUT ? EAGAIN : -r;
	}
	if (c->fd < 0 || cr < 0) {
		if (c->fd >= 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			r = fail(-ETIMEDOUT, "connecting to %s: no room in its queue for %d ms (timeout_ms): tqkvd "
				 "is stopped or overloaded", sa.sun_path, c->timeout_ms);
		else
			r = fail(-errno, "connecting to %s: %s", sa.sun_path, strerror(errno));
		goto fail;
	}
	if ((r = handshake(c, memfd, &lay, deadline)) < 0)
		goto fail;
	close(memfd);
	memfd = -1;
	if (!(c->flags & TQKV_CONNECT_NO_CONTROL)) {
		char target[sizeof(sa.sun_path) + 32];
		struct ctl_status st;
		snprintf(target, sizeof(target), "unix:%s/control.sock", run_dir);
		if ((r = ctl_open(&c->ctl, target, &st)) < 0) {
			r = fail(r, "control channel %s: %s", target, st.msg);
			goto fail;
		}
	}
	*out = c;
	return 0;
fail:
	if (memfd >= 0)
		close(memfd);
	tqkv_disconnect(c);
	return r;
}

/* The 0.1 ABI's tqkv_connect: its options end before op_timeout_ms. */
struct tqkv_connect_opts_0_1 {
	const char *run_dir;
	uint32_t queue_depth;
	uint64_t arena_bytes;
	uint32_t flags;
	int timeout_ms;
};

int tqkv_connect_0_1(tqkv **out, const struct tqkv_connect_opts_0_1 *o);
EXPORT int tqkv_connect_0_1(tqkv **out, const struct tqkv_connect_opts_0_1 *o)
{
	struct tqkv_connect_opts n = { 0 };

	if (o) {
		n.run_dir = o->run_dir;
		n.queue_depth = o->queue_depth;
		n.arena_bytes = o->arena_bytes;
		n.flags = o->flags;
		n.timeout_ms = o->timeout_ms;
	}
	return tqkv_connect_0_2(out, o ? &n : NULL);
}
__asm__(".symver tqkv_connect_0_1,tqkv_connect@TQKV_0.1");

/* ---- sessions ------------------------------------------------------------------------------ */

/* gRPC status -> errno */
static int grpc_errno(int code)
{
	switch (code) {
	case 3: return -EINVAL;        /* INVALID_ARGUMENT */
	case 4: return -ETIMEDOUT;     /* DEADLINE_EXCEEDED */
	case 5: return -ENOENT;        /* NOT_FOUND */
	case 6: return -EEXIST;        /* ALREADY_EXISTS */
	case 7: return -EPERM;         /* PERMISSION_DENIED */
	case 8: return -ENOSPC;        /* RESOURCE_EXHAUSTED */
	case 9: return -EBUSY;         /* FAILED_PRECONDITION */
	case 14: return -ECONNREFUSED; /* UNAVAILABLE */
	default: return -EIO;
	}
}

static int ctl_do(tqkv *c, const char *method, const ProtobufCMessage *q, ProtobufCMessage **rep)
{
	struct ctl_status st;
	int r;

	if (!c->ctl)
		return fail(-ENOTSUP, "%s: connected with TQKV_CONNECT_NO_CONTROL", method);
	pthread_mutex_lock(&c->ctl_lock);
	r = ctl_call(c->ctl, method, q, rep, c->timeout_ms, &st);
	pthread_mutex_unlock(&c->ctl_lock);
	if (r > 0)
		return fail(grpc_errno(r), "%s: %s", method, st.msg);
	if (r < 0)
		return fail(r, "%s: %s", method, st.msg);
	return 0;
}

static int attach_op(tqkv_session *s, uint32_t flags)
{
	struct tqkv_sqe e;
	tqkv_req *q;
	int r;

	memset(&e, 0, sizeof(e));
	e.opcode = TQKV_OP_ATTACH;
	e.session = s->id;
	e.flags = (flags & TQKV_SESSION_DETACHED) ? 0 : TQKV_SQE_EPHEMERAL;
	if ((r = submit(s->c, &e, NULL, 0, NULL, 0, NULL, &q)) < 0)
		return r;
	return tqkv_wait(q, NULL);
}

static void session_from_reply(tqkv_session *s, const Tqkv__V1__Session *m)
{
	s->id = m->id;
	s->seed = m->rotation_seed;
	s->n_layers = m->n_layers;
	s->n_kv_heads = m->n_kv_heads;
	s->n_q_heads = m->n_q_heads;
	s->head_dim = m->head_dim;
}

/* tqkv_session_open@@TQKV_0.3: see the 0.1 twin below. */
int tqkv_session_open_0_3(tqkv *c, const struct tqkv_session_params *p, tqkv_session **out);
__asm__(".symver tqkv_session_open_0_3,tqkv_session_open@@TQKV_0.3");
EXPORT int tqkv_session_open_0_3(tqkv *c, const struct tqkv_session_params *p, tqkv_session **out)
{
	Tqkv__V1__OpenSessionRequest q = TQKV__V1__OPEN_SESSION_REQUEST__INIT;
	ProtobufCMessage *rep = NULL;
	tqkv_session *s;
	int r;

	*out = NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return fail(-ENOMEM, "out of memory");
	s->c = c;
	q.tenant = (char *)(p->tenant && p->tenant[0] ? p->tenant : "default");
	q.name = (char *)(p->name ? p->name : "");
	q.n_layers = p->n_layers;
	q.n_kv_heads = p->n_kv_heads;
	q.n_q_heads = p->n_q_heads;
	q.head_dim = p->head_dim;
	q.k_codec = (char *)(p->k_codec ? p->k_codec : "");
	q.v_codec = (char *)(p->v_codec ? p->v_codec : "");
	q.max_tokens = p->max_tokens;
	q.has_rotation_seed = p->has_seed != 0;
	q.rotation_seed = p->seed;
	/* Opened already attached to this data connection, in one step: an
	 * ephemeral session is tied to the connection from the moment it
	 * exists, so no death of this process can leave it behind. */
	q.data_client = c->client_id;
	q.detached = (p->flags & (TQKV_SESSION_DETACHED | TQKV_SESSION_PERSISTENT)) != 0;
	q.persistent = (p->flags & TQKV_SESSION_PERSISTENT) != 0;
	q.kv_transform = (char *)(p->kv_transform ? p->kv_transform : "");
	if ((r = ctl_do(c, "OpenSession", &q.base, &rep)) < 0)
		goto fail;
	test_die(c, "open-after-rpc");
	session_from_reply(s, (const Tqkv__V1__Session *)rep);
	protobuf_c_message_free_unpacked(rep, NULL);
	*out = s;
	return 0;
fail:
	free(s);
	return r;
}

/* The 0.1 ABI's tqkv_session_open: its parameters end before kv_transform. */
struct tqkv_session_params_0_1 {
	const char *tenant, *name;
	uint32_t n_layers, n_kv_heads, n_q_heads, head_dim;
	const char *k_codec, *v_codec;
	uint64_t max_tokens;
	int has_seed;
	uint64_t seed;
	uint32_t flags;
};
static_assert(offsetof(struct tqkv_session_params, kv_transform) == sizeof(struct tqkv_session_params_0_1),
	      "the 0.1 parameters are a prefix of today's");

int tqkv_session_open_0_1(tqkv *c, const struct tqkv_session_params_0_1 *o, tqkv_session **out);
EXPORT int tqkv_session_open_0_1(tqkv *c, const struct tqkv_session_params_0_1 *o, tqkv_session **out)
{
	struct tqkv_session_params n = {
		.tenant = o->tenant, .name = o->name, .n_layers = o->n_layers, .n_kv_heads = o->n_kv_heads,
		.n_q_heads = o->n_q_heads, .head_dim = o->head_dim, .k_codec = o->k_codec,
		.v_codec = o->v_codec, .max_tokens = o->max_tokens, .has_seed = o->has_seed, .seed = o->seed,
		.flags = o->flags,
	};

	return tqkv_session_open_0_3(c, &n, out);
}
__asm__(".symver tqkv_session_open_0_1,tqkv_session_open@TQKV_0.1");

EXPORT int tqkv_session_attach(tqkv *c, uint64_t id, const struct tqkv_session_params *geom,
			       uint32_t flags, tqkv_session **out)
{
	tqkv_session *s;
	int r;

	*out = NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return fail(-ENOMEM, "out of memory");
	s->c = c;
	s->id = id;
	if (geom) {
		s->n_layers = geom->n_layers;
		s->n_kv_heads = geom->n_kv_heads;
		s->n_q_heads = geom->n_q_heads;
		s->head_dim = geom->head_dim;
	} else {
		Tqkv__V1__SessionRef ref = TQKV__V1__SESSION_REF__INIT;
		ProtobufCMessage *rep;
		ref.id = id;
		if ((r = ctl_do(c, "GetSession", &ref.base, &rep)) < 0)
			goto fail;
		session_from_reply(s, (const Tqkv__V1__Session *)rep);
		protobuf_c_message_free_unpacked(rep, NULL);
	}
	if ((r = attach_op(s, flags)) < 0)
		goto fail;
	*out = s;
	return 0;
fail:
	free(s);
	return r;
}

EXPORT int tqkv_session_attach_name(tqkv *c, const char *tenant, const char *name, uint32_t flags,
				    tqkv_session **out)
{
	Tqkv__V1__ListSessionsRequest q = TQKV__V1__LIST_SESSIONS_REQUEST__INIT;
	ProtobufCMessage *rep;
	tqkv_session *s;
	int r;

	*out = NULL;
	if (!name || !name[0])
		return fail(-EINVAL, "a session name is required");
	q.tenant = (char *)(tenant && tenant[0] ? tenant : "default");
	if ((r = ctl_do(c, "ListSessions", &q.base, &rep)) < 0)
		return r;
	const Tqkv__V1__ListSessionsReply *l = (const void *)rep;
	const Tqkv__V1__Session *m = NULL;
	/* the caller's own: names are per owner, and an operator's list holds
	 * every user's sessions */
	const uid_t me = geteuid();
	for (size_t i = 0; i < l->n_sessions && !m; i++)
		if (!strcmp(l->sessions[i]->name, name) && l->sessions[i]->owner_uid == (uint32_t)me)
			m = l->sessions[i];
	if (!m) {
		r = fail(-ENOENT, "no session named '%s' in tenant '%s' that you may use", name, q.tenant);
		protobuf_c_message_free_unpacked(rep, NULL);
		return r;
	}
	if (!(s = calloc(1, sizeof(*s)))) {
		protobuf_c_message_free_unpacked(rep, NULL);
		return fail(-ENOMEM, "out of memory");
	}
	s->c = c;
	session_from_reply(s, m);
	protobuf_c_message_free_unpacked(rep, NULL);
	/* by id from here: ids never repeat, so a session closed since the
	 * lookup is "no such session", never another one */
	if ((r = attach_op(s, flags)) < 0) {
		free(s);
		return r;
	}
	*out = s;
	return 0;
}

EXPORT int tqkv_session_detach(tqkv_session *s)
{
	struct tqkv_sqe e;
	tqkv_req *q;
	int r;

	if (!s)
		return 0;
	memset(&e, 0, sizeof(e));
	e.opcode = TQKV_OP_DETACH;
	e.session = s->id;
	if ((r = submit(s->c, &e, NULL, 0, NULL, 0, NULL, &q)) == 0)
		r = tqkv_wait(q, NULL);
	free(s);
	return r;
}

EXPORT int tqkv_session_close(tqkv_session *s)
{
	struct tqkv_sqe e;
	tqkv_req *q;
	int r;

	if (!s)
		return 0;
	/* One CLOSE on the ring, in order after this session's operations:
	 * once submitted, the daemon completes it even if this process dies
	 * before the answer comes. */
	memset(&e, 0, sizeof(e));
	e.opcode = TQKV_OP_CLOSE;
	e.session = s->id;
	if ((r = submit(s->c, &e, NULL, 0, NULL, 0, NULL, &q)) == 0) {
		test_die(s->c, "close-after-submit");
		r = tqkv_wait(q, NULL);
	}
	free(s);
	return r;
}

EXPORT int tqkv_session_prefetch(tqkv_session *s)
{
	struct tqkv_sqe e;
	tqkv_req *q;
	int r;

	memset(&e, 0, sizeof(e));
	e.opcode = TQKV_OP_PREFETCH;
	e.session = s->id;
	if ((r = submit(s->c, &e, NULL, 0, NULL, 0, NULL, &q)) < 0)
		return r;
	/* nobody waits for it: freed when its completion comes */
	pthread_mutex_lock(&s->c->lock);
	q->abandoned = true;
	if (q->done)
		req_free_locked(s->c, q);
	pthread_mutex_unlock(&s->c->lock);
	return 0;
}

/* tqkv_session_info@@TQKV_0.3: see the 0.2 twin below. */
int tqkv_session_info_0_3(tqkv_session *s, struct tqkv_session_info *out);
__asm__(".symver tqkv_session_info_0_3,tqkv_session_info@@TQKV_0.3");
EXPORT int tqkv_session_info_0_3(tqkv_session *s, struct tqkv_session_info *out)
{
	Tqkv__V1__SessionRef ref = TQKV__V1__SESSION_REF__INIT;
	ProtobufCMessage *rep;
	int r;

	memset(out, 0, sizeof(*out));
	ref.id = s->id;
	if ((r = ctl_do(s->c, "GetSession", &ref.base, &rep)) < 0)
		return r;
	const Tqkv__V1__Session *m = (const void *)rep;
	out->id = m->id;
	out->tokens = m->tokens;
	out->max_tokens = m->max_tokens;
	out->resident_bytes = m->resident_bytes;
	out->spilled_bytes = m->spilled_bytes;
	out->evicted = m->state == TQKV__V1__SESSION_STATE__SESSION_STATE_EVICTED;
	out->persistent = m->persistent;
	snprintf(out->kv_transform, sizeof(out->kv_transform), "%s", m->kv_transform);
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

/* The 0.2 ABI's tqkv_session_info: its struct ends before kv_transform. */
struct tqkv_session_info_0_2 {
	uint64_t id, tokens, max_tokens, resident_bytes, spilled_bytes;
	int evicted, persistent;
};
static_assert(offsetof(struct tqkv_session_info, kv_transform) == sizeof(struct tqkv_session_info_0_2),
	      "the 0.2 info is a prefix of today's");

int tqkv_session_info_0_2(tqkv_session *s, struct tqkv_session_info_0_2 *out);
EXPORT int tqkv_session_info_0_2(tqkv_session *s, struct tqkv_session_info_0_2 *out)
{
	struct tqkv_session_info n;
	int r = tqkv_session_info_0_3(s, &n);

	memcpy(out, &n, sizeof(*out)); /* the 0.2 fields are the 0.3 struct's prefix */
	return r;
}
__asm__(".symver tqkv_session_info_0_2,tqkv_session_info@TQKV_0.2");

EXPORT int tqkv_session_checkpoint(tqkv_session *s)
{
	Tqkv__V1__SessionRef ref = TQKV__V1__SESSION_REF__INIT;
	ProtobufCMessage *rep;
	int r;

	ref.id = s->id;
	if ((r = ctl_do(s->c, "CheckpointSession", &ref.base, &rep)) < 0)
		return r;
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

EXPORT int tqkv_session_drop(tqkv *c, uint64_t id)
{
	Tqkv__V1__SessionRef ref = TQKV__V1__SESSION_REF__INIT;
	ProtobufCMessage *rep;
	int r;

	ref.id = id;
	if ((r = ctl_do(c, "CloseSession", &ref.base, &rep)) < 0)
		return r;
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

EXPORT uint64_t tqkv_session_id(const tqkv_session *s)
{
	return s->id;
}

EXPORT uint64_t tqkv_session_seed(const tqkv_session *s)
{
	return s->seed;
}
