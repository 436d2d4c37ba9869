/* test_hostile — hostile clients against the real data path (issue 14,
 * item 3), in one process: the ring server, workers, dataop, pool, session
 * and tenant modules (ringfix.h), and clients that drive the ring directly.
 *
 *   test_flood          a client flooding ATTENDs without reading its
 *                       completions, then one reading them and flooding at
 *                       its full rate, next to a well-behaved client whose
 *                       per-op latency is held to the stated bound (below);
 *                       the same flood on a one-worker daemon shows that the
 *                       bound catches a daemon that makes the good client
 *                       wait behind the hostile one
 *   test_arena_rewrite  a thread rewriting K, V, queries (NaN, Inf, huge)
 *                       and positions (negative, past the end) while
 *                       APPEND / APPEND_ATTEND / ATTEND run on them
 *   test_arena_toctou   one K value flipping between finite and NaN under
 *                       f32 appends: the encoder must store what it checked
 *   test_hole_punch     holes punched into the arena's memfd while
 *                       operations run; the seals refuse every resize
 *   test_max_sessions_conns  sessions and connections up to every cap
 *
 * The second-uid attacks and the control plane's caps, through a real
 * tqkvd, are tests/integration/hostile_uid.sh and hostile_limits.sh; they
 * run this binary as their client (`--client MODE ...`, see client_main).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dataop_internal.h"
#include "harness.h"
#include "log.h"
#include "ringfix.h"
#include "tq_page.h"
#include "tq_xform.h"
#include "tqkv.h"

#define MiB (1ull << 20)
#define KiB (1ull << 10)

/* ---- small helpers ------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* xorshift floats in [-2, 2) */
static void fill_f32(float *x, size_t n, uint64_t *s)
{
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(rng_next(s) >> 40) / (float)(1 << 22) - 2.0f;
}

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static double cpu_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* the q-th quantile (0..1) of n samples, sorted in place */
static double quantile(double *v, int n, double q)
{
	if (n <= 0)
		return 0;
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	int i = (int)(q * (n - 1) + 0.5);
	return v[i < n ? i : n - 1];
}

static struct session_geom geom(uint32_t layers, uint32_t kv, uint32_t q, uint32_t dim, enum tq_codec_id k,
				enum tq_codec_id v, uint64_t max_tokens, uint32_t xf)
{
	struct session_geom g = { layers, kv, q, dim, k, v, max_tokens, xf };
	return g;
}

static uint64_t open_sess(struct srv *s, uid_t owner, const struct session_geom *g, uint64_t seed)
{
	struct session_info info;
	char why[200];

	if (session_open(s->st, tenant_find(s->tt, "big"), "", owner, g, seed, 0, 0, &info, why, sizeof(why)) < 0) {
		fprintf(stderr, "session_open: %s\n", why);
		return 0;
	}
	return info.id;
}

static uint64_t sess_tokens(struct srv *s, uint64_t id)
{
	struct session_info info;
	return session_get_info(s->st, id, &info) < 0 ? UINT64_MAX : info.tokens;
}

/* Append n tokens of random data to `layer` through r's arena at offset 0
 * (K) and kb (V): the CQE's status. */
static int raw_fill(struct raw *r, uint64_t id, uint32_t layer, const struct session_geom *g, uint32_t n,
		    uint64_t *seed, uint64_t user_data)
{
	size_t kb = (size_t)n * g->n_kv_heads * g->head_dim * 4;
	int res;

	if (2 * kb > r->arena_bytes)
		return -1;
	fill_f32((float *)(void *)r->arena, 2 * kb / 4, seed);
	struct tqkv_sqe e = { .opcode = TQKV_OP_APPEND, .session = id, .layer = layer, .n_tokens = n,
			      .k_off = 0, .v_off = kb, .user_data = user_data };
	return raw_op(r, &e, &res);
}

/* ---- the well-behaved client ----------------------------------------------------------- */

/* One small session, 256 tokens in layer 0; each op is an ATTEND of one
 * query at the last position — a decode step's attention, ~0.1 ms. */
struct good {
	struct raw r;
	uint64_t id;
	struct tqkv_sqe op;
	double lat[8192];
	int n;
};

static int good_start(struct good *g, struct srv *s, uint64_t seed)
{
	struct session_geom sg = geom(2, 2, 8, 128, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 4096, TQ_XF_DEFAULT);
	uint64_t rs = seed;
	size_t qb = (size_t)sg.n_q_heads * sg.head_dim * 4;

	memset(g, 0, sizeof(*g));
	if (!(g->id = open_sess(s, getuid(), &sg, seed)) || raw_attach(&g->r, s, g->id, 1) != TQKV_ST_OK ||
	    raw_fill(&g->r, g->id, 0, &sg, 256, &rs, 1) != TQKV_ST_OK)
		return -1;
	fill_f32((float *)(void *)g->r.arena, qb / 4, &rs);
	int32_t pos = 255;
	memcpy(g->r.arena + 65536, &pos, 4);
	g->op = (struct tqkv_sqe){ .opcode = TQKV_OP_ATTEND, .session = g->id, .n_q = 1, .q_off = 0,
				   .pos_off = 65536, .out_off = 131072 };
	return 0;
}

/* Ops for at least `ms` milliseconds (and at least 20 of them), one every
 * ~0.5 ms like a decode loop; latencies in g->lat.  0, or the first
 * status that was not OK. */
static int good_run(struct good *g, double ms)
{
	double t_end = now_ms() + ms;
	int res;

	g->n = 0;
	while ((now_ms() < t_end || g->n < 20) && g->n < (int)(sizeof(g->lat) / sizeof(g->lat[0]))) {
		double t0 = now_ms();
		g->op.user_data = 1000 + (uint64_t)g->n;
		int st = raw_op(&g->r, &g->op, &res);
		g->lat[g->n++] = now_ms() - t0;
		if (st != TQKV_ST_OK)
			return st ? st : -1;
		usleep(500);
	}
	return 0;
}

/* ---- the stated bound ---------------------------------------------------------------------
 *
 * Under attack, the well-behaved client's p99 op latency must stay within
 *
 *     BOUND_FACTOR x (its own p99 measured alone, in the same run) + BOUND_SLACK_MS.
 *
 * Why these numbers: the attacks below leave the good client its own ring
 * thread and (with 2 workers) a worker of its own, so what remains is CPU
 * contention: on a 2-core machine the hostile's worker computes on one
 * core while the hostile thread, the ring threads, the good client's
 * worker, the good client — and whatever else the machine runs — share
 * the other.  A wake-up may then wait behind a running thread's time slice
 * (a few ms under CFS), several times per op at worst; AddressSanitizer
 * slows the code, not the scheduler.  Measured here (2 vCPUs, load average
 * about 5 from other jobs): p99 under attack up to 24 ms, so 40 ms.  The
 * factor absorbs a slower steady state (caches shared with the hostile's
 * attention).  The hostile op is sized at run time to take at least
 * HOSTILE_OP_MS, so a daemon that made the good client wait for it — one
 * worker for both, a ring thread shared, the good op queued behind the
 * flood — puts the good client's p99 at about that, well past the bound:
 * test_flood checks this on a one-worker daemon, where the good op does
 * wait for the hostile one, and fails if the bound does not catch it. */
#define BOUND_FACTOR 4.0
#define BOUND_SLACK_MS 40.0
#define HOSTILE_OP_MS 150.0

/* ---- flood ----------------------------------------------------------------------------------- */

/* The hostile side of test_flood: one session of 8 KV heads / 32 query
 * heads, d 128, 2048 tokens; its op an ATTEND of n_q queries at the last
 * position, n_q chosen so that one op takes >= HOSTILE_OP_MS. */
struct flood {
	struct raw r;
	uint64_t id;
	struct tqkv_sqe op;
	bool read_cqes;          /* reads its completions (else never) */
	int stop;                /* atomic */
	uint64_t submitted, completed, bad;
	double op_ms;            /* one op alone */
};

#define FLOOD_ARENA (16 * MiB)

/* This thread alone (a raw syscall, not glibc's process-wide setresuid)
 * takes effective uid `uid`, keeping root's file access (fsuid 0): a
 * connection made now carries uid in its SO_PEERCRED.  Root only. */
static int thread_euid(uid_t uid)
{
	if (syscall(SYS_setresuid, -1, uid, -1) != 0)
		return -1;
	syscall(SYS_setfsuid, 0);
	return 0;
}

static int flood_start_as(struct flood *f, struct srv *s, uint64_t seed, uint32_t sqn, uint32_t cqn, uid_t uid);

static int flood_start(struct flood *f, struct srv *s, uint64_t seed, uint32_t sqn, uint32_t cqn)
{
	return flood_start_as(f, s, seed, sqn, cqn, getuid());
}

/* The same, the session owned by and the connection made as `uid`. */
static int flood_start_as(struct flood *f, struct srv *s, uint64_t seed, uint32_t sqn, uint32_t cqn, uid_t uid)
{
	struct session_geom sg = geom(1, 8, 32, 128, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 4096, TQ_XF_DEFAULT);
	struct tqkv_sqe at = { .opcode = TQKV_OP_ATTACH, .user_data = 1, .flags = TQKV_SQE_EPHEMERAL };
	uint64_t rs = seed;
	int res;

	memset(f, 0, sizeof(*f));
	if (!(f->id = open_sess(s, uid, &sg, seed)))
		return -1;
	if (uid != getuid() && thread_euid(uid) < 0)
		return -1;
	int cr = raw_connect(&f->r, s->dir, sqn, cqn, FLOOD_ARENA, RAW_OK);
	if (uid != getuid())
		thread_euid(getuid());
	if (cr < 0)
		return -1;
	at.session = f->id;
	if (raw_op(&f->r, &at, &res) != TQKV_ST_OK)
		return -1;
	for (int i = 0; i < 8; i++)
		if (raw_fill(&f->r, f->id, 0, &sg, 256, &rs, 10 + (uint64_t)i) != TQKV_ST_OK)
			return -1;
	size_t qrow = (size_t)sg.n_q_heads * sg.head_dim * 4;
	uint32_t max_q = (uint32_t)((FLOOD_ARENA - MiB) / 2 / qrow);
	fill_f32((float *)(void *)f->r.arena, (size_t)max_q * qrow / 4, &rs);
	int32_t *pos = (int32_t *)(void *)(f->r.arena + FLOOD_ARENA - MiB);
	for (uint32_t i = 0; i < max_q; i++)
		pos[i] = 2047;
	f->op = (struct tqkv_sqe){ .opcode = TQKV_OP_ATTEND, .session = f->id, .q_off = 0,
				   .pos_off = FLOOD_ARENA - MiB, .out_off = (uint64_t)max_q * qrow };
	/* size the op: double n_q until one op takes HOSTILE_OP_MS */
	for (uint32_t nq = 8;; nq *= 2) {
		f->op.n_q = nq < max_q ? nq : max_q;
		double t0 = now_ms();
		f->op.user_data = 100 + nq;
		if (raw_op(&f->r, &f->op, &res) != TQKV_ST_OK)
			return -1;
		f->op_ms = now_ms() - t0;
		if (f->op_ms >= HOSTILE_OP_MS || f->op.n_q == max_q)
			break;
	}
	return 0;
}

/* Submit as fast as the SQ takes SQEs; with nothing to do, sleep as
 * libtqkv does (futex on cq_tail) rather than spin: a hostile process
 * burning a core is the kernel's scheduling to share out, not the
 * daemon's, and on a 2-core machine it would drown what we measure. */
static void *flood_main(void *arg)
{
	struct flood *f = arg;

	while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
		if (f->r.tail - __atomic_load_n(&f->r.hdr->sq_head, __ATOMIC_ACQUIRE) < f->r.sqn) {
			f->op.user_data = ++f->submitted;
			raw_submit(&f->r, &f->op);
			continue;
		}
		uint32_t seen = __atomic_load_n(&f->r.hdr->cq_tail, __ATOMIC_ACQUIRE);
		if (f->read_cqes && seen != f->r.head) {
			for (; f->r.head != seen; f->r.head++, f->completed++)
				f->bad += f->r.cq[f->r.head & (f->r.cqn - 1)].status != TQKV_ST_OK;
			/* room again: say so, as libtqkv does */
			__atomic_store_n(&f->r.hdr->cq_head, f->r.head, __ATOMIC_SEQ_CST);
			syscall(SYS_futex, &f->r.hdr->sq_tail, FUTEX_WAKE, 1, NULL, NULL, 0);
			continue;
		}
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		__atomic_store_n(&f->r.hdr->cq_waiting, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&f->r.hdr->cq_tail, __ATOMIC_SEQ_CST) == seen)
			syscall(SYS_futex, &f->r.hdr->cq_tail, FUTEX_WAIT, seen, &ts, NULL, 0);
		__atomic_store_n(&f->r.hdr->cq_waiting, 0, __ATOMIC_RELAXED);
	}
	return NULL;
}

/* The good client's p50/p99 for `ms` while f floods (f == NULL: alone). */
static int measure(struct good *g, struct flood *f, double ms, double *p50, double *p99)
{
	pthread_t th;
	int st;

	uint32_t head0 = f ? __atomic_load_n(&f->r.hdr->sq_head, __ATOMIC_ACQUIRE) : 0;

	if (f && pthread_create(&th, NULL, flood_main, f) != 0)
		return -1;
	if (f) /* the flood is under way: the daemon took its first SQE */
		for (int i = 0; i < 1000 && __atomic_load_n(&f->r.hdr->sq_head, __ATOMIC_ACQUIRE) == head0; i++)
			usleep(1000);
	st = good_run(g, ms);
	if (f) {
		__atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
		pthread_join(th, NULL);
		f->stop = 0;
	}
	*p99 = quantile(g->lat, g->n, 0.99);
	*p50 = quantile(g->lat, g->n, 0.50);
	return st;
}

static void test_flood(void)
{
	struct srv s;
	struct good g;
	struct flood a, b;
	double b50, b99, p50, p99;
	int res;

	T_ASSERT(srv_start(&s, 64 * MiB, 2) == 0);
	T_EQ(good_start(&g, &s, 7), 0);
	T_EQ(measure(&g, NULL, 600, &b50, &b99), 0);
	double bound = BOUND_FACTOR * b99 + BOUND_SLACK_MS;
	fprintf(stderr, "    good client alone: p50 %.3f ms, p99 %.3f ms (%d ops); bound under attack: p99 <= %.1f ms\n",
		b50, b99, g.n, bound);

	/* 1. a client that floods real ATTENDs and never reads a completion:
	 * the daemon takes only what its CQ has room for (SQ 4, CQ 8) */
	T_EQ(flood_start(&a, &s, 21, 4, 8), 0);
	fprintf(stderr, "    hostile op: ATTEND of %u queries x 32 heads over 2048 tokens, %.1f ms alone\n",
		a.op.n_q, a.op_ms);
	uint32_t cq0 = __atomic_load_n(&a.r.hdr->cq_tail, __ATOMIC_ACQUIRE);   /* the sizing ops' CQEs were read */
	T_EQ(measure(&g, &a, 600, &p50, &p99), 0);
	fprintf(stderr, "    never-reader flooding: good p50 %.3f ms, p99 %.3f ms (%d ops)\n", p50, p99, g.n);
	if (p99 > bound)
		T_FAIL("the good client's p99 %.3f ms under a never-reading flood passes the bound %.1f ms", p99, bound);
	/* the CQ fills, then nothing more is taken */
	for (int w = 0; w < 1000 && __atomic_load_n(&a.r.hdr->cq_tail, __ATOMIC_ACQUIRE) - cq0 < a.r.cqn; w++)
		usleep(10000);
	usleep(50000);
	T_EQ(__atomic_load_n(&a.r.hdr->cq_tail, __ATOMIC_ACQUIRE) - cq0, a.r.cqn);
	T_EQ(__atomic_load_n(&a.r.hdr->sq_head, __ATOMIC_ACQUIRE) - cq0, a.r.cqn);
	T_EQ(a.r.tail - __atomic_load_n(&a.r.hdr->sq_head, __ATOMIC_ACQUIRE), a.r.sqn);   /* the SQ stays full */
	for (uint32_t i = 0; i < a.r.cqn; i++)
		T_EQ(a.r.cq[(cq0 + i) & (a.r.cqn - 1)].status, TQKV_ST_OK);
	/* held back, it costs the daemon nothing */
	double c0 = cpu_ms();
	usleep(300000);
	double used = cpu_ms() - c0;
	if (used > 100)
		T_FAIL("the daemon used %.0f ms of CPU in 300 ms with only a held-back client", used);
	T_EQ(measure(&g, NULL, 300, &p50, &p99), 0);
	fprintf(stderr, "    never-reader held back (CQ full): good p50 %.3f ms, p99 %.3f ms\n", p50, p99);
	if (p99 > bound)
		T_FAIL("p99 %.3f ms next to a held-back client passes the bound %.1f ms", p99, bound);
	raw_close(&a.r);

	/* 2. a client that reads its completions and floods at full rate:
	 * one op of its session runs at a time (a session's FIFO), the other
	 * worker serves the good client */
	T_EQ(flood_start(&b, &s, 22, 8, 16), 0);
	b.read_cqes = true;
	b.r.head = __atomic_load_n(&b.r.hdr->cq_tail, __ATOMIC_ACQUIRE);
	T_EQ(measure(&g, &b, 800, &p50, &p99), 0);
	fprintf(stderr, "    full-rate flood (%llu ops done, %llu failed): good p50 %.3f ms, p99 %.3f ms (%d ops)\n",
		(unsigned long long)b.completed, (unsigned long long)b.bad, p50, p99, g.n);
	T_EQ(b.bad, 0);
	if (p99 > bound)
		T_FAIL("the good client's p99 %.3f ms under a full-rate flood passes the bound %.1f ms", p99, bound);
	raw_close(&b.r);
	raw_close(&g.r);
	T_EQ(srv_wait_idle(&s), 0);
	srv_stop(&s);

	/* 3. the bound's teeth: with one worker for everybody the good op
	 * waits for the hostile op that is running — the bound must fail */
	T_ASSERT(srv_start(&s, 64 * MiB, 1) == 0);
	T_EQ(good_start(&g, &s, 7), 0);
	T_EQ(flood_start(&b, &s, 22, 8, 16), 0);
	b.read_cqes = true;
	b.r.head = __atomic_load_n(&b.r.hdr->cq_tail, __ATOMIC_ACQUIRE);
	T_EQ(measure(&g, &b, 3 * b.op_ms, &p50, &p99), 0);
	fprintf(stderr, "    control, one worker for both: good p50 %.3f ms, p99 %.3f ms (%d ops) > bound %.1f ms\n",
		p50, p99, g.n, bound);
	if (p99 <= bound)
		T_FAIL("a good client that waits behind the flood (p99 %.3f ms) passes the bound %.1f ms: it proves nothing",
		       p99, bound);
	raw_close(&b.r);
	raw_close(&g.r);
	T_EQ(srv_wait_idle(&s), 0);
	(void)res;
	srv_stop(&s);
}

/* One user with several busy sessions against another's single client
 * (daemon.max_workers_per_uid): two connections of a second uid flood
 * full-rate ATTENDs (one op per session at a time, so together they can
 * hold both workers).  With max_workers_per_uid = 1 they share one worker
 * and the good client keeps the other: the stated bound holds.  Without a
 * cap the good op waits for one of theirs whenever both run (printed, the
 * control).  Root only (the second uid's connections). */
static void test_worker_share(void)
{
	struct srv s;
	struct good g;
	struct flood a, b;
	double b50, b99, p50, p99;
	const uid_t other = getuid() + 4242;

	if (geteuid() != 0) {
		fprintf(stderr, "    skipped: needs root to connect as a second uid\n");
		return;
	}
	for (int capped = 1; capped >= 0; capped--) {
		T_ASSERT(srv_start(&s, 64 * MiB, 2) == 0);
		ring_server_set_worker_share(s.rs, capped ? 1 : 0);
		T_EQ(good_start(&g, &s, 7), 0);
		T_EQ(measure(&g, NULL, 400, &b50, &b99), 0);
		double bound = BOUND_FACTOR * b99 + BOUND_SLACK_MS;
		T_EQ(flood_start_as(&a, &s, 31, 8, 16, other), 0);
		T_EQ(flood_start_as(&b, &s, 32, 8, 16, other), 0);
		a.read_cqes = b.read_cqes = true;
		a.r.head = __atomic_load_n(&a.r.hdr->cq_tail, __ATOMIC_ACQUIRE);
		b.r.head = __atomic_load_n(&b.r.hdr->cq_tail, __ATOMIC_ACQUIRE);
		pthread_t tb;
		T_EQ(pthread_create(&tb, NULL, flood_main, &b), 0);
		T_EQ(measure(&g, &a, capped ? 800 : 4 * a.op_ms, &p50, &p99), 0);
		__atomic_store_n(&b.stop, 1, __ATOMIC_RELEASE);
		pthread_join(tb, NULL);
		fprintf(stderr, "    uid %u, two sessions flooding (%.0f ms ops; %llu + %llu done), max_workers_per_uid %d: "
			"good alone p99 %.3f ms; under the flood p50 %.3f ms, p99 %.3f ms (bound %.1f ms)\n",
			(unsigned)other, a.op_ms, (unsigned long long)a.completed, (unsigned long long)b.completed,
			capped, b99, p50, p99, bound);
		T_EQ(a.bad + b.bad, 0);
		if (capped && p99 > bound)
			T_FAIL("with max_workers_per_uid 1 the good client's p99 %.3f ms passes the bound %.1f ms", p99, bound);
		if (capped)
			T_ASSERT(a.completed > 0 && b.completed > 0);   /* throttled, not starved */
		raw_close(&a.r);
		raw_close(&b.r);
		raw_close(&g.r);
		T_EQ(srv_wait_idle(&s), 0);
		srv_stop(&s);
	}
}

/* ---- arena rewritten during operations ---------------------------------------------------- */

/* Regions of the hostile arena (byte offsets); everything else holds a
 * canary the daemon must never write. */
#define RW_K    0u
#define RW_V    (64u * 1024)
#define RW_Q    (128u * 1024)
#define RW_POS  (192u * 1024)
#define RW_OUT  (256u * 1024)
#define RW_MAXN 4u               /* tokens or queries per op */
#define CANARY  0xA5

struct rewriter {
	uint8_t *arena;
	size_t k_len, q_len;     /* bytes of K (= V) and Q the ops read */
	int stop;
	uint64_t writes;
};

/* Rewrite one random input element after another: finite values, NaN,
 * ±Inf, huge finite values (whose transform or logits may overflow), and
 * positions that are negative or past the end.  A bad value is usually
 * put back a moment later, so most operations see finite inputs that go
 * bad while they run — what a check-then-read would miss. */
static void *rewriter_main(void *arg)
{
	struct rewriter *w = arg;
	uint64_t s = 0x5eed;
	static const float bad[] = { NAN, INFINITY, -INFINITY, 3e38f, -3e38f };
	static const int32_t badpos[] = { -1, INT32_MIN, INT32_MAX, 1 << 30, 100000 };

	while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
		uint64_t x = rng_next(&s);
		unsigned kind = (unsigned)(x & 15);
		if (kind < 12) {
			size_t base = kind < 5 ? RW_K : kind < 9 ? RW_V : RW_Q;
			size_t len = base == RW_Q ? w->q_len : w->k_len;
			volatile float *p = (volatile float *)(void *)(w->arena + base + ((x >> 8) % (len / 4)) * 4);
			float old = *p;
			*p = bad[(x >> 40) % 5];
			for (int i = 0; i < (int)((x >> 48) & 255); i++)
				__asm__ __volatile__("" ::: "memory");
			if ((x >> 56) % 8)   /* mostly put back; sometimes left bad for a while */
				*p = old;
			else
				*p = (float)((x >> 20) & 1023) / 512.0f - 1.0f;
		} else {
			volatile int32_t *p = (volatile int32_t *)(void *)(w->arena + RW_POS + ((x >> 8) % RW_MAXN) * 4);
			int32_t old = *p;
			*p = badpos[(x >> 40) % 5];
			if ((x >> 56) % 4)
				*p = old;
		}
		w->writes++;
	}
	return NULL;
}

struct victim {
	uint64_t id;
	struct session_geom g;
	uint32_t len[2];         /* per layer: what the CQEs said */
};

/* White-box: the count of non-finite values in the K and V blocks of a
 * session's committed tokens — every value of an f32 block, the scale of
 * a tq2/tq3/tq4/q8 block (its indices cannot hold a NaN) — or -1 when the
 * session cannot be read this way. */
static long cache_nonfinite(struct srv *s, uint64_t id)
{
	struct session *sess;
	struct kv_sess *kv;
	long bad = 0;

	if (session_acquire(s->st, id, 0, &sess) < 0)
		return -1;
	if (dataop_kv_get(s->ks, sess, &kv) < 0 || kv->layer[0].kc == NULL ||
	    tq_codec_id(kv->layer[0].kc) == TQ_CODEC_F16 || tq_codec_id(kv->layer[0].kc) == TQ_CODEC_Q4A ||
	    tq_codec_id(kv->layer[0].vc) == TQ_CODEC_F16 || tq_codec_id(kv->layer[0].vc) == TQ_CODEC_Q4A) {
		session_release(sess);
		return -1;
	}
	pthread_mutex_lock(&kv->lock);
	const struct tq_page_geom *g = &kv->geom;
	for (uint32_t l = 0; l < kv->n_layers; l++)
		for (uint32_t t = 0; t < kv->layer[l].n_tokens; t++)
			for (uint32_t hd = 0; hd < g->n_kv_heads; hd++) {
				const uint8_t *page = kv->layer[l].pages[t / g->page_tokens];
				const float *kf = (const float *)(const void *)(page + tq_page_k_off(g, hd, t % g->page_tokens));
				const float *vf = (const float *)(const void *)(page + tq_page_v_off(g, hd, t % g->page_tokens));
				uint32_t nk = tq_codec_id(kv->layer[l].kc) == TQ_CODEC_F32 ? kv->dim : 1;
				uint32_t nv = tq_codec_id(kv->layer[l].vc) == TQ_CODEC_F32 ? kv->dim : 1;
				for (uint32_t j = 0; j < nk; j++)
					bad += !isfinite(kf[j]);
				for (uint32_t j = 0; j < nv; j++)
					bad += !isfinite(vf[j]);
			}
	pthread_mutex_unlock(&kv->lock);
	session_release(sess);
	return bad;
}

static void test_arena_rewrite(void)
{
	struct srv s;
	struct raw h, o;
	struct rewriter w = { 0 };
	pthread_t th;
	uint64_t rs = t_seed() | 1;
	int res;
	/* the f32 codec without a transform reads the arena straight into the
	 * page (the row the encoder checks is the row it stores); tq4/tq3 with
	 * the default transform reads it through the transform's copy */
	struct victim v[2] = {
		{ .g = geom(1, 1, 2, 128, TQ_CODEC_F32, TQ_CODEC_F32, 65536, 0) },
		{ .g = geom(2, 2, 8, 128, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 65536, TQ_XF_DEFAULT) },
	};
	const struct session_geom og = geom(2, 2, 4, 128, TQ_CODEC_Q8, TQ_CODEC_TQ4, 4096, TQ_XF_DEFAULT);

	T_ASSERT(srv_start(&s, 64 * MiB, 2) == 0);
	/* another client's session, and what it attends to before the attack */
	uint64_t oid = open_sess(&s, getuid(), &og, 31);
	T_ASSERT(oid);
	T_EQ(raw_attach(&o, &s, oid, 1), TQKV_ST_OK);
	uint64_t os = 77;
	for (uint32_t l = 0; l < 2; l++)
		T_EQ(raw_fill(&o, oid, l, &og, 100, &os, 2 + l), TQKV_ST_OK);
	size_t oqb = (size_t)og.n_q_heads * og.head_dim * 4 * 3;
	fill_f32((float *)(void *)(o.arena + 65536), oqb / 4, &os);
	int32_t opos[3] = { 0, 50, 99 };
	memcpy(o.arena + 131072, opos, sizeof(opos));
	static float before[2][3 * 4 * 128];
	struct tqkv_sqe oat = { .opcode = TQKV_OP_ATTEND, .session = oid, .n_q = 3, .q_off = 65536,
				.pos_off = 131072, .out_off = 262144 };
	for (uint32_t l = 0; l < 2; l++) {
		oat.layer = l;
		oat.user_data = 50 + l;
		T_EQ(raw_op(&o, &oat, &res), TQKV_ST_OK);
		memcpy(before[l], o.arena + 262144, sizeof(before[l]));
	}

	/* the hostile client: both victims attached, the arena a canary */
	T_EQ(raw_connect(&h, s.dir, 8, 16, 1 * MiB, RAW_OK), 0);
	memset(h.arena, CANARY, h.arena_bytes);
	for (int i = 0; i < 2; i++) {
		T_ASSERT((v[i].id = open_sess(&s, getuid(), &v[i].g, 40 + (uint64_t)i)));
		struct tqkv_sqe at = { .opcode = TQKV_OP_ATTACH, .session = v[i].id, .user_data = 60 + (uint64_t)i,
				       .flags = TQKV_SQE_EPHEMERAL };
		T_EQ(raw_op(&h, &at, &res), TQKV_ST_OK);
	}
	w.arena = h.arena;
	w.k_len = (size_t)RW_MAXN * 2 * 128 * 4;    /* the larger victim's K for RW_MAXN tokens */
	w.q_len = (size_t)RW_MAXN * 8 * 128 * 4;
	size_t out_len = w.q_len;
	fill_f32((float *)(void *)(h.arena + RW_K), w.k_len / 4, &rs);
	fill_f32((float *)(void *)(h.arena + RW_V), w.k_len / 4, &rs);
	fill_f32((float *)(void *)(h.arena + RW_Q), w.q_len / 4, &rs);
	memset(h.arena + RW_POS, 0, RW_MAXN * 4);
	T_EQ(pthread_create(&th, NULL, rewriter_main, &w), 0);

	uint32_t counts[TQKV_ST__COUNT] = { 0 };
	const int n_ops = 4000;
	for (int i = 0; i < n_ops; i++) {
		uint64_t x = rng_next(&rs);
		struct victim *vi = &v[x & 1];
		uint32_t layer = (uint32_t)((x >> 1) % vi->g.n_layers);
		uint32_t n = 1 + (uint32_t)((x >> 8) % RW_MAXN), nq = 1 + (uint32_t)((x >> 16) % RW_MAXN);
		uint8_t op = (uint8_t)((x >> 24) % 3 == 0 ? TQKV_OP_APPEND : (x >> 24) % 3 == 1 ? TQKV_OP_APPEND_ATTEND
											: TQKV_OP_ATTEND);
		struct tqkv_sqe e = { .opcode = op, .session = vi->id, .layer = layer, .user_data = 1000 + (uint64_t)i };
		if (op != TQKV_OP_ATTEND) {
			e.n_tokens = n;
			e.k_off = RW_K;
			e.v_off = RW_V;
		}
		if (op != TQKV_OP_APPEND) {
			e.n_q = nq;
			e.q_off = RW_Q;
			e.pos_off = RW_POS;
			e.out_off = RW_OUT;
			/* positions that would be fine if left alone */
			uint32_t after = vi->len[layer] + (op == TQKV_OP_APPEND_ATTEND ? n : 0);
			for (uint32_t j = 0; j < nq; j++) {
				int32_t p = after ? (int32_t)((rng_next(&rs) % after)) : 0;
				memcpy(h.arena + RW_POS + 4 * j, &p, 4);
			}
		}
		struct tqkv_cqe c;
		raw_submit(&h, &e);
		T_EQ(raw_reap(&h, &c), 0);
		T_EQ(c.user_data, e.user_data);
		if (c.status != TQKV_ST_OK && c.status != TQKV_ST_NONFINITE && c.status != TQKV_ST_BAD_POSITION)
			T_FAIL("op %d (%s): status %s", i, op == TQKV_OP_APPEND ? "APPEND" :
			       op == TQKV_OP_ATTEND ? "ATTEND" : "APPEND_ATTEND", tqkv_status_str(c.status));
		T_ASSERT((c.status == TQKV_ST_OK) == (c.res >= 0));
		counts[c.status]++;
		/* the length the CQE reports is the layer's: an APPEND adds all
		 * or nothing; an APPEND_ATTEND whose attention part failed keeps
		 * its append (positions are checked before it, so BAD_POSITION
		 * appends nothing) */
		uint32_t want = vi->len[layer];
		if (c.status == TQKV_ST_OK && op != TQKV_OP_ATTEND)
			want += n;
		if (op == TQKV_OP_APPEND_ATTEND && c.status == TQKV_ST_NONFINITE && c.n_tokens == want + n)
			want += n;
		if (c.n_tokens != want)
			T_FAIL("op %d: the layer holds %llu tokens after a %s, expected %u", i,
			       (unsigned long long)c.n_tokens, tqkv_status_str(c.status), want);
		vi->len[layer] = want;
	}
	__atomic_store_n(&w.stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	fprintf(stderr, "    %d ops under %llu rewrites: %u OK, %u NONFINITE, %u BAD_POSITION\n", n_ops,
		(unsigned long long)w.writes, counts[TQKV_ST_OK], counts[TQKV_ST_NONFINITE],
		counts[TQKV_ST_BAD_POSITION]);
	T_ASSERT(counts[TQKV_ST_OK] > n_ops / 10);

	/* nothing outside the inputs and the output was written */
	const size_t used[][2] = { { RW_K, w.k_len }, { RW_V, w.k_len }, { RW_Q, w.q_len }, { RW_POS, RW_MAXN * 4 },
				   { RW_OUT, out_len } };
	for (size_t off = 0; off < h.arena_bytes; off++) {
		bool in = false;
		for (size_t u = 0; u < sizeof(used) / sizeof(used[0]); u++)
			in |= off >= used[u][0] && off < used[u][0] + used[u][1];
		if (!in && h.arena[off] != CANARY)
			T_FAIL("arena byte %zu changed to 0x%02x (outside every region of the ops)", off, h.arena[off]);
	}
	/* the caches hold only what passed the checks: every stored value
	 * finite, read in the pages themselves (attention over them is no
	 * test: ±3e38 is finite, stored as it is by f32, and attention over
	 * it may overflow — a NONFINITE the daemon reports, not a NaN in the
	 * cache); the token counts are the CQEs' */
	for (int i = 0; i < 2; i++) {
		long bad = cache_nonfinite(&s, v[i].id);
		if (bad)
			T_FAIL("victim %d: %ld non-finite values in its cache", i, bad);
	}
	fill_f32((float *)(void *)(h.arena + RW_Q), w.q_len / 4, &rs);
	for (int i = 0; i < 2; i++) {
		uint32_t longest = 0;
		for (uint32_t l = 0; l < v[i].g.n_layers; l++) {
			longest = v[i].len[l] > longest ? v[i].len[l] : longest;
			if (!v[i].len[l] || i == 0)
				continue;
			int32_t p = (int32_t)v[i].len[l] - 1;
			memcpy(h.arena + RW_POS, &p, 4);
			struct tqkv_sqe e = { .opcode = TQKV_OP_ATTEND, .session = v[i].id, .layer = l, .n_q = 1,
					      .q_off = RW_Q, .pos_off = RW_POS, .out_off = RW_OUT, .user_data = 9000 };
			int st = raw_op(&h, &e, &res);
			/* the tq4/tq3 cache cannot hold a huge row (its norm
			 * overflows), but its transform's statistics may come
			 * from one: the attention answers, finite or NONFINITE */
			if (st != TQKV_ST_OK && st != TQKV_ST_NONFINITE)
				T_FAIL("victim %d layer %u (%u tokens): attention over the cache gives %s", i, l,
				       v[i].len[l], tqkv_status_str((uint32_t)st));
		}
		T_EQ(sess_tokens(&s, v[i].id), longest);
	}
	/* the other client's session: untouched, bit for bit */
	for (uint32_t l = 0; l < 2; l++) {
		oat.layer = l;
		oat.user_data = 70 + l;
		T_EQ(raw_op(&o, &oat, &res), TQKV_ST_OK);
		T_ASSERT(memcmp(before[l], o.arena + 262144, sizeof(before[l])) == 0);
	}
	T_EQ(sess_tokens(&s, oid), 100);
	raw_close(&h);
	raw_close(&o);
	T_EQ(srv_wait_idle(&s), 0);
	T_EQ(tenant_table_used(s.tt), 0);
	srv_stop(&s);
}

/* The narrowest form of the same attack, aimed at a reader that checks a
 * row and then reads it again to store it: one K value flips between
 * finite and NaN as fast as a core can write, under appends of one token
 * of one head into an f32 cache (no transform: the encoder reads the
 * arena itself).  An append either fails with NONFINITE or stores a
 * finite row; afterwards attention over every token must be finite.
 * Before the encoders read each row exactly once, this found a NaN in
 * the cache in most runs. */
struct toggler {
	volatile float *p;
	int stop;
	uint64_t flips;
};

static void *toggler_main(void *arg)
{
	struct toggler *t = arg;
	cpu_set_t cs;

	CPU_ZERO(&cs);   /* a core of its own where there are two, so it runs while the worker reads */
	CPU_SET(1, &cs);
	sched_setaffinity(0, sizeof(cs), &cs);
	while (!__atomic_load_n(&t->stop, __ATOMIC_RELAXED)) {
		/* NaN, then finite, each held for 0..63 spins: some hold
		 * matches the time between a reader's two looks */
		for (int i = 0; i < 64; i++) {
			*t->p = NAN;
			for (volatile int j = 0; j < i; j++)
				;
			*t->p = 0.5f;
			for (volatile int j = 0; j < i; j++)
				;
		}
		t->flips += 64;
	}
	return NULL;
}

static void test_arena_toctou(void)
{
	struct srv s;
	struct raw h;
	struct toggler t = { 0 };
	pthread_t th;
	uint64_t rs = 11;
	const struct session_geom sg = geom(1, 1, 1, 128, TQ_CODEC_F32, TQ_CODEC_F32, 65536, 0);
	uint32_t ok = 0, nonfinite = 0;
	cpu_set_t was, cs;
	int res;

	/* the daemon's threads (created by srv_start) and this one on core 0,
	 * the toggler on core 1: the race then happens whenever the worker
	 * encodes, not only when the scheduler happens to overlap them */
	T_EQ(sched_getaffinity(0, sizeof(was), &was), 0);
	CPU_ZERO(&cs);
	CPU_SET(0, &cs);
	bool pinned = CPU_COUNT(&was) >= 2 && CPU_ISSET(0, &was) && CPU_ISSET(1, &was) &&
		      sched_setaffinity(0, sizeof(cs), &cs) == 0;
	T_ASSERT(srv_start(&s, 64 * MiB, 2) == 0);
	if (pinned)
		sched_setaffinity(0, sizeof(was), &was);
	uint64_t id = open_sess(&s, getuid(), &sg, 1);
	T_ASSERT(id);
	T_EQ(raw_attach(&h, &s, id, 1), TQKV_ST_OK);
	fill_f32((float *)(void *)h.arena, 2 * 128, &rs);
	t.p = (volatile float *)(void *)(h.arena + 4 * 77);
	T_EQ(pthread_create(&th, NULL, toggler_main, &t), 0);
	struct tqkv_sqe e = { .opcode = TQKV_OP_APPEND, .session = id, .n_tokens = 1, .k_off = 0, .v_off = 512 };
	double t_end = now_ms() + 600;
	for (int i = 0; now_ms() < t_end || i < 500; i++) {
		e.user_data = (uint64_t)i;
		int st = raw_op(&h, &e, &res);
		if (st == TQKV_ST_OK)
			ok++;
		else if (st == TQKV_ST_NONFINITE)
			nonfinite++;
		else
			T_FAIL("append %d: status %d", i, st);
	}
	__atomic_store_n(&t.stop, 1, __ATOMIC_RELAXED);
	pthread_join(th, NULL);
	fprintf(stderr, "    %u appends OK, %u NONFINITE under %llu flips\n", ok, nonfinite, (unsigned long long)t.flips);
	T_EQ(sess_tokens(&s, id), ok);
	long bad = cache_nonfinite(&s, id);
	if (bad)
		T_FAIL("%ld non-finite values in the f32 cache after %u appends that passed the check", bad, ok);
	*t.p = 0.5f;
	int32_t pos = (int32_t)ok - 1;
	memcpy(h.arena + 4096, &pos, 4);
	struct tqkv_sqe a = { .opcode = TQKV_OP_ATTEND, .session = id, .n_q = 1, .q_off = 0, .pos_off = 4096,
			      .out_off = 8192, .user_data = 99999 };
	int st = raw_op(&h, &a, &res);
	if (st != TQKV_ST_OK)
		T_FAIL("attention over the %u tokens appended gives %s: a NaN got into the cache", ok,
		       tqkv_status_str((uint32_t)st));
	raw_close(&h);
	T_EQ(srv_wait_idle(&s), 0);
	srv_stop(&s);
}

/* ---- holes punched into the arena ------------------------------------------------------------ */

struct puncher {
	int memfd;
	uint64_t base, span;     /* file range it punches */
	int stop;
	uint64_t punches, failed;
};

static void *puncher_main(void *arg)
{
	struct puncher *p = arg;
	uint64_t s = 0xfa11;

	while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
		uint64_t x = rng_next(&s);
		uint64_t off = ((x >> 8) % (p->span / 4096)) * 4096, len = 4096 * (1 + (x >> 40) % 16);
		if (fallocate(p->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(p->base + off), (off_t)len) < 0)
			p->failed++;
		p->punches++;
		if (x & 1)
			sched_yield();
	}
	return NULL;
}

static void test_hole_punch(void)
{
	struct srv s;
	struct raw h;
	struct good g;
	struct puncher p = { 0 };
	pthread_t th;
	uint64_t rs = 5;
	const struct session_geom sg[2] = {
		geom(2, 2, 8, 128, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 65536, TQ_XF_DEFAULT),
		geom(1, 1, 2, 128, TQ_CODEC_F32, TQ_CODEC_F32, 65536, 0),
	};
	uint64_t id[2];
	uint32_t len[2][2] = { { 0, 0 }, { 0, 0 } };
	int res;

	T_ASSERT(srv_start(&s, 64 * MiB, 2) == 0);
	T_EQ(good_start(&g, &s, 9), 0);
	T_EQ(raw_connect(&h, s.dir, 8, 16, 1 * MiB, RAW_KEEPFD), 0);
	T_ASSERT(h.memfd >= 0);
	for (int i = 0; i < 2; i++) {
		T_ASSERT((id[i] = open_sess(&s, getuid(), &sg[i], 50 + (uint64_t)i)));
		struct tqkv_sqe at = { .opcode = TQKV_OP_ATTACH, .session = id[i], .user_data = 1,
				       .flags = TQKV_SQE_EPHEMERAL };
		T_EQ(raw_op(&h, &at, &res), TQKV_ST_OK);
	}
	/* the seals: no shrinking, no growing, by any call */
	struct stat st0;
	T_EQ(fstat(h.memfd, &st0), 0);
	errno = 0;
	T_EQ(ftruncate(h.memfd, st0.st_size / 2), -1);
	T_EQ(errno, EPERM);
	T_EQ(ftruncate(h.memfd, 0), -1);
	T_EQ(ftruncate(h.memfd, st0.st_size + 4096), -1);
	T_EQ(errno, EPERM);
	T_EQ(fallocate(h.memfd, 0, st0.st_size, 4096), -1);
	T_EQ(errno, EPERM);
	T_EQ(fcntl(h.memfd, F_ADD_SEALS, 0), 0);   /* not F_SEAL_SEAL here: libtqkv adds it, a raw client need not */

	/* punch holes into the data arena while the ops read and write it:
	 * holes read as zeros (finite K, V, queries; position 0) */
	p.memfd = h.memfd;
	p.base = h.arena_off;
	p.span = RW_OUT + 64 * KiB;
	T_EQ(pthread_create(&th, NULL, puncher_main, &p), 0);
	double t_end = now_ms() + 600;
	int ops = 0;
	uint32_t bad = 0;
	while (now_ms() < t_end || ops < 200) {
		int i = ops & 1;
		uint32_t layer = (uint32_t)(ops >> 1) % sg[i].n_layers;
		uint32_t kvb = RW_MAXN * sg[i].n_kv_heads * 128 * 4, qb = RW_MAXN * sg[i].n_q_heads * 128 * 4;
		fill_f32((float *)(void *)(h.arena + RW_K), kvb / 4, &rs);
		fill_f32((float *)(void *)(h.arena + RW_V), kvb / 4, &rs);
		fill_f32((float *)(void *)(h.arena + RW_Q), qb / 4, &rs);
		for (uint32_t j = 0; j < RW_MAXN; j++) {
			int32_t q = (int32_t)(rng_next(&rs) % (len[i][layer] + RW_MAXN));
			memcpy(h.arena + RW_POS + 4 * j, &q, 4);
		}
		struct tqkv_sqe e = { .opcode = TQKV_OP_APPEND_ATTEND, .session = id[i], .layer = layer,
				      .n_tokens = RW_MAXN, .k_off = RW_K, .v_off = RW_V, .n_q = RW_MAXN, .q_off = RW_Q,
				      .pos_off = RW_POS, .out_off = RW_OUT, .user_data = 100 + (uint64_t)ops };
		struct tqkv_cqe c;
		raw_submit(&h, &e);
		T_EQ(raw_reap(&h, &c), 0);
		/* zeros are finite and position 0 always exists: every op succeeds */
		if (c.status != TQKV_ST_OK)
			bad++;
		if (c.status != TQKV_ST_OK && c.status != TQKV_ST_NONFINITE)
			T_FAIL("op %d with holes punched: %s", ops, tqkv_status_str(c.status));
		T_EQ(c.n_tokens, len[i][layer] + (c.status == TQKV_ST_OK ? RW_MAXN : 0));
		len[i][layer] = (uint32_t)c.n_tokens;
		ops++;
	}
	__atomic_store_n(&p.stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	fprintf(stderr, "    %d APPEND_ATTENDs under %llu hole punches (%llu refused): %u not OK\n", ops,
		(unsigned long long)p.punches, (unsigned long long)p.failed, bad);
	T_EQ(p.failed, 0);
	T_EQ(bad, 0);
	/* the good client was never disturbed */
	double p50, p99;
	T_EQ(measure(&g, NULL, 100, &p50, &p99), 0);

	/* the whole file, header and rings included: the indices read as
	 * zeros, which is a corrupt ring — stopped, connection closed */
	T_EQ(fallocate(h.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)h.bytes), 0);
	struct tqkv_sqe nop = { .opcode = TQKV_OP_NOP, .user_data = 1 };
	raw_submit(&h, &nop);
	for (int i = 0; i < 300 && __atomic_load_n(&h.hdr->state, __ATOMIC_ACQUIRE) != TQKV_RING_BROKEN; i++)
		usleep(10000);
	T_EQ(h.hdr->state, TQKV_RING_BROKEN);
	T_EQ(h.hdr->state_status, TQKV_ST_RING_CORRUPT);
	char byte;
	T_EQ(recv(h.fd, &byte, 1, 0), 0);
	raw_close(&h);
	/* its sessions were ephemeral: gone, with their pages */
	for (int w = 0; w < 300 && (sess_tokens(&s, id[0]) != UINT64_MAX || sess_tokens(&s, id[1]) != UINT64_MAX); w++)
		usleep(10000);
	T_EQ(sess_tokens(&s, id[0]), UINT64_MAX);
	T_EQ(sess_tokens(&s, id[1]), UINT64_MAX);
	T_EQ(measure(&g, NULL, 100, &p50, &p99), 0);
	raw_close(&g.r);
	T_EQ(srv_wait_idle(&s), 0);
	T_EQ(tenant_table_used(s.tt), 0);
	srv_stop(&s);
}

/* ---- every cap ------------------------------------------------------------------------------- */

/* A client that connects again and again past the caps. */
struct hammer {
	const char *dir;
	int *stop;
	int refused, other, transient, last_transient;
};

/* refused: -EUSERS with the cap's name, as it must be; other: accepted past
 * the cap, or refused without the reason (a daemon bug); transient: the
 * socket itself failed (a full backlog, a reset while the refusal was in
 * flight — the kernel's, not the daemon's; counted and bounded) */
static void *hammer_main(void *arg)
{
	struct hammer *h = arg;
	while (!__atomic_load_n(h->stop, __ATOMIC_ACQUIRE)) {
		struct raw r;
		int e = raw_connect(&r, h->dir, 8, 16, MiB, RAW_OK);
		if (e == -EUSERS && strstr(r.w.msg, "daemon.max_clients"))
			h->refused++;
		else if (e == 0 || e == -EUSERS || r.w.magic == TQKV_RING_MAGIC)
			h->other++;
		else
			h->transient++, h->last_transient = e;
		raw_close(&r);
	}
	return NULL;
}

static void test_max_sessions_conns(void)
{
	struct srv s;
	struct good g;
	struct raw c[4], x;
	struct ring_stats r0, r1;
	struct session_geom sg = geom(1, 1, 1, 64, TQ_CODEC_TQ4, TQ_CODEC_TQ4, 64, 0);
	struct session_info info;
	char why[200];
	double b50, b99, p50, p99;
	int res;

	T_ASSERT(srv_start(&s, 64 * MiB, 2) == 0);
	T_EQ(good_start(&g, &s, 3), 0);   /* a session and a connection of its own */
	T_EQ(measure(&g, NULL, 200, &b50, &b99), 0);
	double bound = BOUND_FACTOR * b99 + BOUND_SLACK_MS;
	ring_server_stats(s.rs, &r0);

	/* sessions: up to max_sessions_per_uid, then refused with the reason */
	session_table_set_max(s.st, 2000, 1100);
	uint64_t *ids = calloc(1200, sizeof(*ids));
	T_ASSERT(ids);
	int n = 0;
	for (; n < 1200; n++)
		if (session_open(s.st, tenant_find(s.tt, "big"), "", getuid(), &sg, 1, 0, 0, &info, why, sizeof(why)) < 0)
			break;
		else
			ids[n] = info.id;
	T_EQ(n, 1100 - 1);   /* the good client holds one */
	T_ASSERT(strstr(why, "max_sessions_per_uid"));
	/* another uid is not held to this uid's cap */
	T_EQ(session_open(s.st, tenant_find(s.tt, "big"), "", getuid() + 1, &sg, 1, 0, 0, &info, why, sizeof(why)), 0);
	T_EQ(session_close(s.st, info.id, NULL), 0);
	/* one connection attaches up to TQKV_MAX_ATTACHED, then a clear status */
	T_EQ(raw_connect(&c[0], s.dir, 8, 16, MiB, RAW_OK), 0);
	int attached = 0, st = TQKV_ST_OK;
	for (int i = 0; i < n && st == TQKV_ST_OK; i++) {
		struct tqkv_sqe at = { .opcode = TQKV_OP_ATTACH, .session = ids[i], .user_data = (uint64_t)i,
				       .flags = TQKV_SQE_EPHEMERAL };
		if ((st = raw_op(&c[0], &at, &res)) == TQKV_ST_OK)
			attached++;
	}
	T_EQ(attached, TQKV_MAX_ATTACHED);
	T_EQ(st, TQKV_ST_TOO_MANY_SESSIONS);
	T_EQ(res, -EUSERS);
	T_EQ(measure(&g, NULL, 200, &p50, &p99), 0);
	fprintf(stderr, "    %d sessions, %d attached to one connection: good p50 %.3f ms, p99 %.3f ms (alone %.3f)\n",
		n + 1, attached, p50, p99, b99);
	if (p99 > bound)
		T_FAIL("p99 %.3f ms next to a uid at its session caps passes the bound %.1f ms", p99, bound);

	/* connections: max_clients_per_uid 3 (the good client has one) */
	ring_server_set_limits(s.rs, 16, 3, 0);
	T_EQ(raw_connect(&c[1], s.dir, 8, 16, MiB, RAW_OK), 0);
	T_EQ(raw_connect(&c[2], s.dir, 8, 16, MiB, RAW_OK), -EUSERS);
	T_ASSERT(strstr(c[2].w.msg, "has 3 data connections already (daemon.max_clients_per_uid)"));
	raw_close(&c[2]);
	/* and the total, for whoever connects */
	ring_server_set_limits(s.rs, 3, 0, 0);
	T_EQ(raw_connect(&c[2], s.dir, 8, 16, MiB, RAW_OK), -EUSERS);
	T_ASSERT(strstr(c[2].w.msg, "(daemon.max_clients)"));
	raw_close(&c[2]);
	/* refused connections in a tight loop do not slow the others */
	int stop = 0;
	pthread_t th;
	struct hammer hm = { .dir = s.dir, .stop = &stop };
	T_EQ(pthread_create(&th, NULL, hammer_main, &hm), 0);
	T_EQ(measure(&g, NULL, 400, &p50, &p99), 0);
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	fprintf(stderr, "    %d refused connections meanwhile (%d failed in the socket layer%s%s): good p50 %.3f ms, "
		"p99 %.3f ms\n", hm.refused, hm.transient, hm.transient ? ", last: " : "",
		hm.transient ? strerror(-hm.last_transient) : "", p50, p99);
	T_EQ(hm.other, 0);
	T_ASSERT(hm.refused > 10);
	T_ASSERT(hm.transient <= hm.refused / 100 + 1);
	if (p99 > bound)
		T_FAIL("p99 %.3f ms next to a connect flood passes the bound %.1f ms", p99, bound);

	/* the hostile one leaves: sessions, bindings, arena, connection slots back */
	raw_close(&c[0]);
	raw_close(&c[1]);
	for (int i = attached; i < n; i++)   /* those it could not attach */
		T_EQ(session_close(s.st, ids[i], NULL), 0);
	for (int w = 0; w < 500; w++) {
		ring_server_stats(s.rs, &r1);
		if (r1.clients == r0.clients && r1.arena_bytes == r0.arena_bytes && sess_tokens(&s, ids[0]) == UINT64_MAX)
			break;
		usleep(10000);
	}
	T_EQ(r1.clients, r0.clients);
	T_EQ(r1.arena_bytes, r0.arena_bytes);
	for (int i = 0; i < n; i++)
		T_EQ(sess_tokens(&s, ids[i]), UINT64_MAX);
	free(ids);
	T_EQ(session_open(s.st, tenant_find(s.tt, "big"), "", getuid(), &sg, 1, 0, 0, &info, why, sizeof(why)), 0);
	T_EQ(raw_connect(&x, s.dir, 8, 16, MiB, RAW_OK), 0);
	struct tqkv_sqe at = { .opcode = TQKV_OP_ATTACH, .session = info.id, .user_data = 1,
			       .flags = TQKV_SQE_EPHEMERAL };
	T_EQ(raw_op(&x, &at, &res), TQKV_ST_OK);
	raw_close(&x);
	raw_close(&g.r);
	T_EQ(srv_wait_idle(&s), 0);
	srv_stop(&s);
}

/* ---- client modes for tests/integration/hostile_*.sh ---------------------------------------
 *
 *   --client fill DIR NAME     open a detached session NAME in tenant "default"
 *                              (2 layers, 2/8 heads, d 128, tq4/tq3, seed 42),
 *                              300 tokens per layer of fixed data; prints "ID ready"
 *   --client digest DIR ID     attach ID, attend fixed queries at positions 0,
 *                              150, 299 of each layer, check that 300 is past
 *                              the end; prints "digest HEX tokens 300"
 *   --client intrude DIR ID NAME   every data-path way into someone else's
 *                              session ID (named NAME): each must be refused;
 *                              prints one line per attempt, exits 0 when all were
 *   --client drop DIR ID       attach ID (printed: refused once it was
 *                              evicted), then close it by id (tqkv_session_drop)
 *   --client sessions DIR N    open up to N ephemeral sessions until refused;
 *                              prints "opened K" and the refusal, then holds
 *                              them until stdin closes
 */
static const struct tqkv_session_params client_geom = {
	.tenant = "default", .n_layers = 2, .n_kv_heads = 2, .n_q_heads = 8, .head_dim = 128,
	.k_codec = "tq4", .v_codec = "tq3", .max_tokens = 4096, .has_seed = 1, .seed = 42,
};

static int client_fill(const char *dir, const char *name)
{
	struct tqkv_connect_opts o = { .run_dir = dir };
	struct tqkv_session_params p = client_geom;
	static float k[300 * 2 * 128], v[300 * 2 * 128];
	uint64_t rs = 42;
	tqkv *c;
	tqkv_session *ss;

	p.name = name;
	p.flags = TQKV_SESSION_DETACHED;
	if (tqkv_connect(&c, &o) < 0 || tqkv_session_open(c, &p, &ss) < 0) {
		printf("fill: %s\n", tqkv_last_error());
		return 2;
	}
	for (uint32_t l = 0; l < 2; l++) {
		fill_f32(k, sizeof(k) / 4, &rs);
		fill_f32(v, sizeof(v) / 4, &rs);
		if (tqkv_append(ss, l, k, v, 300, TQKV_F32) != 300) {
			printf("fill: append: %s\n", tqkv_last_error());
			return 3;
		}
	}
	printf("%llu ready\n", (unsigned long long)tqkv_session_id(ss));
	tqkv_session_detach(ss);
	tqkv_disconnect(c);
	return 0;
}

static int client_digest(const char *dir, uint64_t id)
{
	struct tqkv_connect_opts o = { .run_dir = dir, .flags = TQKV_CONNECT_NO_CONTROL };
	static float q[3 * 8 * 128], out[3 * 8 * 128];
	int32_t pos[3] = { 0, 150, 299 }, past = 300;
	uint64_t rs = 7, h = 0xcbf29ce484222325ull;
	tqkv *c;
	tqkv_session *ss;
	int r;

	if (tqkv_connect(&c, &o) < 0 || tqkv_session_attach(c, id, &client_geom, TQKV_SESSION_DETACHED, &ss) < 0) {
		printf("digest: %s\n", tqkv_last_error());
		return 2;
	}
	fill_f32(q, sizeof(q) / 4, &rs);
	for (uint32_t l = 0; l < 2; l++) {
		if ((r = tqkv_attend(ss, l, q, pos, 3, TQKV_F32, out)) != 3) {
			printf("digest: attend: %s\n", tqkv_last_error());
			return 3;
		}
		const uint8_t *b = (const uint8_t *)out;
		for (size_t i = 0; i < sizeof(out); i++)
			h = (h ^ b[i]) * 0x100000001b3ull;
		/* exactly 300 tokens: position 300 is past the end */
		struct tqkv_result res;
		tqkv_req *rq;
		if (tqkv_submit_attend(ss, l, q, &past, 1, TQKV_F32, out, &rq) < 0 || tqkv_wait(rq, &res) >= 0 ||
		    res.status != TQKV_ST_BAD_POSITION || res.n_tokens != 300) {
			printf("digest: layer %u does not hold exactly 300 tokens (%s, %llu)\n", l,
			       tqkv_status_name(res.status), (unsigned long long)res.n_tokens);
			return 4;
		}
	}
	printf("digest %016llx tokens 300\n", (unsigned long long)h);
	tqkv_session_detach(ss);
	tqkv_disconnect(c);
	return 0;
}

static int client_intrude(const char *dir, uint64_t id, const char *name)
{
	struct tqkv_connect_opts o = { .run_dir = dir };
	struct tqkv_session_params p = client_geom;
	struct raw r;
	tqkv *c;
	tqkv_session *ss = NULL;
	int fails = 0, res, e;

#define EXPECT(what, cond, msg) do { bool ok_ = (cond); fails += !ok_; \
	printf("%s %s: %s\n", ok_ ? "refused" : "ALLOWED", what, msg); } while (0)

	if ((e = raw_connect(&r, dir, 8, 16, MiB, RAW_OK)) < 0) {
		printf("intrude: data connection: %d %s\n", e, r.w.msg);
		return 2;
	}
	/* ATTACH by id, ephemeral or not */
	for (int f = 0; f < 2; f++) {
		struct tqkv_sqe a = { .opcode = TQKV_OP_ATTACH, .session = id, .user_data = 1 + (uint64_t)f,
				      .flags = f ? TQKV_SQE_EPHEMERAL : 0 };
		int st = raw_op(&r, &a, &res);
		EXPECT(f ? "ATTACH (ephemeral)" : "ATTACH", st == TQKV_ST_NOT_OWNER && res == -EPERM,
		       tqkv_status_str((uint32_t)st));
	}
	/* every operation naming its id: not attached here, whatever it is */
	static const struct { uint8_t op; const char *name; } ops[] = {
		{ TQKV_OP_APPEND, "APPEND" }, { TQKV_OP_ATTEND, "ATTEND" }, { TQKV_OP_APPEND_ATTEND, "APPEND_ATTEND" },
		{ TQKV_OP_TRUNCATE, "TRUNCATE" }, { TQKV_OP_DETACH, "DETACH" }, { TQKV_OP_CLOSE, "CLOSE" },
		{ TQKV_OP_PREFETCH, "PREFETCH" },
	};
	memset(r.arena, 0, 65536);
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		struct tqkv_sqe e2 = { .opcode = ops[i].op, .session = id, .user_data = 10 + i };
		if (ops[i].op == TQKV_OP_APPEND || ops[i].op == TQKV_OP_APPEND_ATTEND) {
			e2.n_tokens = 1;
			e2.v_off = 4096;
		}
		if (ops[i].op == TQKV_OP_ATTEND || ops[i].op == TQKV_OP_APPEND_ATTEND) {
			e2.n_q = 1;
			e2.q_off = 8192;
			e2.pos_off = 16384;
			e2.out_off = 32768;
		}
		int st = raw_op(&r, &e2, &res);
		EXPECT(ops[i].name, st == TQKV_ST_NOT_ATTACHED && res == -EBADF, tqkv_status_str((uint32_t)st));
	}
	raw_close(&r);
	/* through libtqkv: by id with a geometry, by id asking the control
	 * channel, by name; a session of its own under the same name */
	if (tqkv_connect(&c, &o) < 0) {
		printf("intrude: connect: %s\n", tqkv_last_error());
		return 2;
	}
	e = tqkv_session_attach(c, id, &client_geom, TQKV_SESSION_DETACHED, &ss);
	EXPECT("tqkv_session_attach (geometry given)", e == -EPERM, e < 0 ? tqkv_last_error() : "attached");
	if (e == 0)
		tqkv_session_detach(ss);
	e = tqkv_session_attach(c, id, NULL, TQKV_SESSION_DETACHED, &ss);
	EXPECT("tqkv_session_attach (geometry asked)", e < 0, e < 0 ? tqkv_last_error() : "attached");
	if (e == 0)
		tqkv_session_detach(ss);
	e = tqkv_session_attach_name(c, "default", name, TQKV_SESSION_DETACHED, &ss);
	EXPECT("tqkv_session_attach_name", e == -ENOENT, e < 0 ? tqkv_last_error() : "attached");
	if (e == 0)
		tqkv_session_detach(ss);
	e = tqkv_session_drop(c, id);
	EXPECT("tqkv_session_drop", e == -EPERM, e < 0 ? tqkv_last_error() : "dropped");
	/* names are per owner: a session of its own under the same name, which
	 * is what attach by that name then finds, never the other's */
	p.name = name;
	e = tqkv_session_open(c, &p, &ss);
	EXPECT("tqkv_session_open under its name (its own)", e == 0, e < 0 ? tqkv_last_error() : "opened");
	if (e == 0) {
		const uint64_t mine = tqkv_session_id(ss);
		EXPECT("its own session, not the other's", mine != id, "the other's id");
		tqkv_session_close(ss);
		e = tqkv_session_open(c, &p, &ss); /* the name is free again */
		EXPECT("tqkv_session_open under its name again", e == 0, e < 0 ? tqkv_last_error() : "opened");
		if (e == 0) {
			const uint64_t again = tqkv_session_id(ss);
			tqkv_session_detach(ss);
			e = tqkv_session_attach_name(c, "default", name, TQKV_SESSION_DETACHED, &ss);
			EXPECT("tqkv_session_attach_name finds its own", e == 0 && tqkv_session_id(ss) == again,
			       e < 0 ? tqkv_last_error() : "another session");
			if (e == 0)
				tqkv_session_close(ss);
		}
	}
	tqkv_disconnect(c);
#undef EXPECT
	return fails ? 1 : 0;
}

static int client_sessions(const char *dir, int n)
{
	struct tqkv_connect_opts o = { .run_dir = dir };
	struct tqkv_session_params p = client_geom;
	/* the handles stay reachable, never freed: this client leaves its
	 * sessions to the daemon by disconnecting (no API frees a handle
	 * without telling the daemon) */
	static tqkv_session *ss[1024];
	tqkv *c;
	int i, e = 0;
	char buf[16];

	p.has_seed = 0;
	if (tqkv_connect(&c, &o) < 0) {
		printf("sessions: %s\n", tqkv_last_error());
		return 2;
	}
	for (i = 0; i < n && i < 1024 && (e = tqkv_session_open(c, &p, &ss[i])) == 0; i++)
		;
	printf("opened %d\n", i);
	if (e < 0)
		printf("refused: %s: %s\n", tqkv_strerror(e), tqkv_last_error());
	fflush(stdout);
	while (read(0, buf, sizeof(buf)) > 0)
		;
	tqkv_disconnect(c);   /* the daemon closes them all */
	return 0;
}

/* --client drop DIR ID: close session ID by id (tqkv_session_drop), e.g.
 * its owner's after it was evicted while detached; prints the result. */
static int client_drop(const char *dir, uint64_t id)
{
	struct tqkv_connect_opts o = { .run_dir = dir };
	tqkv *c;
	int e;

	if (tqkv_connect(&c, &o) < 0) {
		printf("drop: connect: %s\n", tqkv_last_error());
		return 2;
	}
	e = tqkv_session_attach(c, id, NULL, TQKV_SESSION_DETACHED, &(tqkv_session *){ NULL });
	printf("attach: %s\n", e < 0 ? tqkv_strerror(e) : "ok");
	e = tqkv_session_drop(c, id);
	printf("drop: %s\n", e < 0 ? tqkv_last_error() : "ok");
	tqkv_disconnect(c);
	return e < 0 ? 1 : 0;
}

static int client_main(int argc, char **argv)
{
	const char *mode = argv[2], *dir = argv[3];

	log_set_level(LOG_WARNING);
	if (!strcmp(mode, "fill") && argc > 4)
		return client_fill(dir, argv[4]);
	if (!strcmp(mode, "digest") && argc > 4)
		return client_digest(dir, strtoull(argv[4], NULL, 0));
	if (!strcmp(mode, "intrude") && argc > 5)
		return client_intrude(dir, strtoull(argv[4], NULL, 0), argv[5]);
	if (!strcmp(mode, "drop") && argc > 4)
		return client_drop(dir, strtoull(argv[4], NULL, 0));
	if (!strcmp(mode, "sessions") && argc > 4)
		return client_sessions(dir, atoi(argv[4]));
	fprintf(stderr, "unknown client mode %s\n", mode);
	return 100;
}

/* OpenSession's data_client (rpc.c attaches the new session to that data
 * connection through ring_server_bind): only the connection's own uid may
 * bind to it — another local user naming a victim's connection id (ids are
 * small integers) must not fill it with sessions; an unknown or dead
 * connection and a session bound already are refused too.  And the victim's
 * connection keeps working. */
static void test_bind_foreign(void)
{
	struct srv s;
	struct raw c;
	struct session_geom sg = geom(1, 1, 1, 64, TQ_CODEC_TQ4, TQ_CODEC_TQ4, 64, 0);
	struct session_info a, b;
	char why[200];
	int res;

	T_ASSERT(srv_start(&s, 16 * MiB, 1) == 0);
	T_EQ(raw_connect(&c, s.dir, 8, 16, MiB, RAW_OK), 0);
	const uint64_t cid = c.w.client_id;
	T_ASSERT(cid != 0);
	T_EQ(session_open(s.st, tenant_find(s.tt, "big"), "", getuid() + 1, &sg, 1, 0, 0, &a, why, sizeof(why)), 0);
	T_EQ(session_open(s.st, tenant_find(s.tt, "big"), "", getuid(), &sg, 1, 0, 0, &b, why, sizeof(why)), 0);
	/* another uid's session onto this uid's connection: refused */
	T_EQ(ring_server_bind(s.rs, cid, getuid() + 1, a.id, &sg, false), -EPERM);
	/* connections that do not exist */
	T_EQ(ring_server_bind(s.rs, cid + 1000, getuid(), b.id, &sg, false), -ENOENT);
	T_EQ(ring_server_bind(s.rs, 0, getuid(), b.id, &sg, false), -ENOENT);
	/* the owner binds; the same session twice is refused */
	T_EQ(ring_server_bind(s.rs, cid, getuid(), b.id, &sg, false), 0);
	T_EQ(ring_server_bind(s.rs, cid, getuid(), b.id, &sg, false), -EBUSY);
	/* the bound session works on the connection; the foreign one is not on it */
	struct tqkv_sqe tr = { .opcode = TQKV_OP_TRUNCATE, .session = b.id, .layer = 0, .pos = 0, .user_data = 1 };
	T_EQ(raw_op(&c, &tr, &res), TQKV_ST_OK);
	tr.session = a.id;
	T_ASSERT(raw_op(&c, &tr, &res) != TQKV_ST_OK);
	struct tqkv_sqe at = { .opcode = TQKV_OP_ATTACH, .session = a.id, .user_data = 2,
			       .flags = TQKV_SQE_EPHEMERAL };
	T_ASSERT(raw_op(&c, &at, &res) != TQKV_ST_OK);
	/* once the connection is gone its id binds nothing */
	raw_close(&c);
	T_EQ(srv_wait_idle(&s), 0);
	T_EQ(ring_server_bind(s.rs, cid, getuid(), a.id, &sg, false), -ENOENT);
	session_close(s.st, a.id, NULL);
	srv_stop(&s);
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	if (argc > 3 && !strcmp(argv[1], "--client"))
		return client_main(argc, argv);
	log_set_level(getenv("TQ_TEST_VERBOSE") ? LOG_DEBUG : LOG_ERR);
	T_RUN(test_flood);
	T_RUN(test_worker_share);
	T_RUN(test_arena_rewrite);
	T_RUN(test_arena_toctou);
	T_RUN(test_hole_punch);
	T_RUN(test_max_sessions_conns);
	T_RUN(test_bind_foreign);
	return t_done();
}
