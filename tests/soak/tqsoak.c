/* tqsoak — the chaos soak's client (tests/soak/soak.sh runs N of them
 * against one tqkvd while it kills, evicts, spills, reloads and restarts).
 *
 *   tqsoak client RUN_DIR STATE_DIR INDEX SEED PAGE_BYTES
 *   tqsoak report STATE_DIR          sum every client's counters; exit 1 on a violation
 *   tqsoak errors RUN_DIR N          N failing operations, then disconnect
 *
 * A client keeps up to NSLOT sessions (ephemeral, detached or persistent,
 * in random tenants, geometries and K/V transform modes) and does random
 * opens, appends, APPEND_ATTENDs, ATTENDs, truncates, detaches,
 * re-attaches (by id and by name), closes, and attach attempts on other
 * clients' sessions, until STATE_DIR/stop exists.
 *
 * Every successful attention output is compared bit for bit with the
 * kernels run in-process on the same inputs (the daemon runs one
 * attention thread: tq_attend on one thread is its bits).  The reference
 * is rebuilt from each session's operation log (STATE_DIR/cI/slotK.log),
 * written before each operation is submitted and marked done after it
 * completes, so a client killed at any moment is replaced by one that
 * finds its detached and persistent sessions again, and an operation
 * whose completion was lost (a killed client or daemon) is made certain
 * by truncating the layer to its length before that operation.
 *
 * Data are generated from per-operation seeds that include the client's
 * index: another client's tokens in a result would not match.
 *
 * Counters live in a shared file per incarnation (cI/counters.N), so a
 * SIGKILLed client's counts survive it; errors are logged one per line in
 * cI/events ("MS KIND SESSION pid PID: DETAIL") for soak.sh to match against the
 * daemon's log and its own chaos log; "VIOLATION" lines fail the soak.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tq_attn.h"
#include "tq_codec.h"
#include "tq_page.h"
#include "tq_xform.h"
#include "tqkv.h"
#include "tqkv_ring.h"

#define NSLOT 3
#define MAX_LOG_RECORDS 800      /* a session whose log grows past this is closed */
#define MAX_PAGES 256
#define MAX_LAYERS 2
#define CONN_RETRY_MS 60000      /* give up reconnecting after this long */

/* ---- what clients count (one shared file per incarnation) ---------------------- */
enum {
	C_OPEN, C_APPEND, C_APPEND_ATTEND, C_ATTEND, C_TRUNCATE, C_DETACH, C_CLOSE,
	C_ATTACH_ID, C_ATTACH_NAME, C_PROBE, C_RECOVER, C_RESOLVE,
	C_CHECK_EXACT, C_CHECK_LEN, C_CHECK_PROBE, C_CHECK_GONE, /* output: bit for bit (a GPU pool: GPU_TOL) */
	C_ERR_CONN, C_ERR_GONE, C_ERR_BUSY_RETRY, C_VIOLATION,
	C__COUNT
};
static const char *const c_names[C__COUNT] = {
	"open", "append", "append_attend", "attend", "truncate", "detach", "close",
	"attach_by_id", "attach_by_name", "probe_other_session", "recoveries", "uncertain_ops_resolved",
	"check_output", "check_length", "check_probe_refused", "check_closed_gone",
	"err_connection", "err_session_gone", "err_busy_retried", "VIOLATIONS",
};
struct counters {
	uint64_t magic;
	uint64_t c[C__COUNT];
	uint64_t status[TQKV_ST__COUNT];   /* failed operations by the ring's status */
};
#define COUNTERS_MAGIC 0x74716b76736f616bull

static struct counters *K;
static int events_fd = -1;
static int cidx;

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* One line to cI/events (and stderr for VIOLATION). */
static void event(const char *kind, uint64_t sid, const char *fmt, ...)
{
	char buf[512], msg[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	int n = snprintf(buf, sizeof(buf), "%llu %s %llu pid %d: %s\n", (unsigned long long)now_ms(), kind,
			 (unsigned long long)sid, (int)getpid(), msg);
	if (n > (int)sizeof(buf) - 1)
		n = (int)sizeof(buf) - 1;
	if (write(events_fd, buf, (size_t)n) < 0) {
		/* nothing better to do: the counters still count it */
	}
	if (!strcmp(kind, "VIOLATION")) {
		K->c[C_VIOLATION]++;
		fprintf(stderr, "tqsoak client %d: VIOLATION session %llu: %s\n", cidx, (unsigned long long)sid, msg);
	}
}

/* ---- data ----------------------------------------------------------------------------- */
static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}
static uint32_t rnd_below(uint64_t *s, uint32_t n) { return (uint32_t)(splitmix(s) % n); }

/* n values in [-2, 2) plus a per-channel offset (so centering has work) */
static void fill(void *buf, enum tq_dtype dt, size_t n, size_t row, uint64_t *s)
{
	for (size_t i = 0; i < n; i++) {
		float x = (float)((splitmix(s) >> 40) * (1.0 / (double)(1ull << 24))) * 4.0f - 2.0f;
		x += 0.5f * (float)((i % row) % 5) - 1.0f;
		if (dt == TQ_DTYPE_F32)
			((float *)buf)[i] = x;
		else if (dt == TQ_DTYPE_F16)
			((uint16_t *)buf)[i] = tq_f32_to_f16(x);
		else
			((uint16_t *)buf)[i] = tq_f32_to_bf16(x);
	}
}

/* ---- session kinds ---------------------------------------------------------------------- */
struct geo {
	uint32_t n_layers, n_kv, n_q, dim;
	const char *k, *v;
	uint32_t max_tokens;      /* per layer, what sessions are opened with */
};
static const struct geo GEOS[] = {
	/* 800 bytes a token and layer: tenants run into their limits; its
	 * max_tokens fits the smallest limit (OpenSession checks) */
	{ 2, 4, 8, 128, "q8", "tq4", 512 },
	{ 2, 1, 4, 64, "tq4", "tq3", 1024 },
	{ 1, 2, 4, 128, "tq3", "tq2", 1024 },
};
#define NGEO (sizeof(GEOS) / sizeof(GEOS[0]))
/* NULL: the daemon's default (daemon.kv_transform, not set: "default") */
static const char *const XFORMS[] = { NULL, "none", "k-center+k-eq-qk+k-unshrink", "k-sink+v-center", "k-eq-k",
					"k-center+v-eq+k-eq-qk" };
#define NXF (sizeof(XFORMS) / sizeof(XFORMS[0]))
static const char *const TENANTS[] = { "alpha", "beta", "gamma" };
#define NTEN (sizeof(TENANTS) / sizeof(TENANTS[0]))

/* ---- the in-process reference of one session ------------------------------------------- */
struct ref_layer {
	uint8_t *pages[MAX_PAGES];   /* [n_pages] tq_page_bytes(&pg) each, tq_page.h layout */
	uint32_t n_pages, n;
	tq_codec *kc, *vc;
	tq_xf *xf;
};
struct ref {
	const struct geo *g;
	struct tq_page_geom pg;
	struct ref_layer L[MAX_LAYERS];
};

/* The daemon's page_tokens for a geometry (daemon/dataop.c geom_of). */
static int page_geom(uint32_t page_bytes, const struct geo *g, struct tq_page_geom *pg)
{
	tq_error te;
	long kb = tq_block_bytes(tq_codec_from_name(g->k), (int)g->dim, &te);
	long vb = tq_block_bytes(tq_codec_from_name(g->v), (int)g->dim, &te);
	uint64_t per_token = (uint64_t)g->n_kv * (uint64_t)(kb + vb);
	uint32_t pt = (uint32_t)(page_bytes / per_token < TQ_PAGE_TOKENS_MAX ? page_bytes / per_token
									 : TQ_PAGE_TOKENS_MAX);
	pg->n_kv_heads = g->n_kv;
	pg->k_block_bytes = (uint32_t)kb;
	pg->v_block_bytes = (uint32_t)vb;
	for (; pt > 0; pt--) {
		pg->page_tokens = pt;
		if (tq_page_bytes(pg) <= page_bytes)
			break;
	}
	return pt ? 0 : -1;
}

static void ref_free(struct ref *r)
{
	for (int l = 0; l < MAX_LAYERS; l++) {
		for (uint32_t p = 0; p < r->L[l].n_pages; p++)
			free(r->L[l].pages[p]);
		tq_codec_free(r->L[l].kc);
		tq_codec_free(r->L[l].vc);
		tq_xf_free(r->L[l].xf);
	}
	memset(r, 0, sizeof(*r));
}

static int ref_init(struct ref *r, const struct geo *g, uint64_t seed, uint32_t xmode, uint32_t page_bytes)
{
	tq_error te;

	memset(r, 0, sizeof(*r));
	r->g = g;
	if (page_geom(page_bytes, g, &r->pg) < 0)
		return -1;
	for (uint32_t l = 0; l < g->n_layers; l++) {
		struct tq_codec_params kp = { tq_codec_from_name(g->k), (int)g->dim, tqkv_seed_derive(seed, l, 0), TQ_ISA_AUTO };
		struct tq_codec_params vp = { tq_codec_from_name(g->v), (int)g->dim, tqkv_seed_derive(seed, l, 1), TQ_ISA_AUTO };
		if (tq_codec_new(&r->L[l].kc, NULL, &kp, &te) < 0 || tq_codec_new(&r->L[l].vc, NULL, &vp, &te) < 0)
			goto fail;
		if (xmode && tq_xf_new(&r->L[l].xf, xmode, g->n_kv, g->n_q, g->dim, r->L[l].kc, &te) < 0)
			goto fail;
	}
	return 0;
fail:
	fprintf(stderr, "tqsoak: reference: %s\n", te.msg);
	ref_free(r);
	return -1;
}

/* As dataop's append: an empty layer calibrates its transform from the
 * first TQ_XF_CALIB_MAX tokens and queries (q: APPEND_ATTEND's, or NULL). */
static int ref_append(struct ref *r, uint32_t l, const void *k, const void *v, enum tq_dtype dt, uint32_t n,
		      const void *q, uint32_t n_q)
{
	struct ref_layer *L = &r->L[l];
	const struct geo *g = r->g;
	size_t row = (size_t)g->n_kv * g->dim * tq_dtype_size(dt);
	float xk[8 * 128], xv[8 * 128];   /* one token's transformed K and V rows */
	tq_error te;

	if (L->xf && !L->n && n) {
		tq_xf_reset(L->xf);
		if (tq_xf_calibrate(L->xf, k, v, q, n < TQ_XF_CALIB_MAX ? n : TQ_XF_CALIB_MAX,
				    !q ? 0 : n_q < TQ_XF_CALIB_MAX ? n_q : TQ_XF_CALIB_MAX, dt) < 0)
			return -1;
	}
	for (uint32_t t = 0; t < n; t++) {
		uint32_t p = L->n + t;
		while (p / r->pg.page_tokens >= L->n_pages) {
			if (L->n_pages == MAX_PAGES)
				return -1;
			L->pages[L->n_pages++] = aligned_alloc(64, tq_page_bytes(&r->pg));
		}
		uint8_t *page = L->pages[p / r->pg.page_tokens];
		const uint8_t *krow = (const uint8_t *)k + t * row, *vrow = (const uint8_t *)v + t * row;
		enum tq_dtype in = dt;
		size_t in_row = (size_t)g->dim * tq_dtype_size(dt);
		if (L->xf) {
			tq_xf_keys(L->xf, krow, dt, 1, xk);
			tq_xf_values(L->xf, vrow, dt, 1, xv);
			krow = (const uint8_t *)xk;
			vrow = (const uint8_t *)xv;
			in = TQ_DTYPE_F32;
			in_row = (size_t)g->dim * sizeof(float);
		}
		for (uint32_t h = 0; h < g->n_kv; h++)
			if (tq_encode(L->kc, krow + h * in_row, in, 1, page + tq_page_k_off(&r->pg, h, p % r->pg.page_tokens), &te) < 0 ||
			    tq_encode(L->vc, vrow + h * in_row, in, 1, page + tq_page_v_off(&r->pg, h, p % r->pg.page_tokens), &te) < 0)
				return -1;
	}
	L->n += n;
	return 0;
}

static int ref_attend(struct ref *r, uint32_t l, const void *q, const int32_t *pos, uint32_t n_q,
		      enum tq_dtype dt, float *out)
{
	struct ref_layer *L = &r->L[l];
	struct tq_page_table pt = { (const uint8_t *const *)L->pages, L->n_pages, L->n, r->pg };
	float xq[4 * 8 * 128];
	tq_error te;

	if (L->xf && tq_xf_touches_queries(L->xf)) {
		tq_xf_queries(L->xf, q, dt, n_q, xq);
		q = xq;
		dt = TQ_DTYPE_F32;
	}
	struct tq_attn_params ap = { .k_codec = L->kc, .v_codec = L->vc, .n_q_heads = (int)r->g->n_q,
				     .kv = &pt, .n_q = (int)n_q, .q = q, .q_dtype = dt, .q_pos = pos,
				     .causal = 1, .out = out, .isa = TQ_ISA_AUTO };
	if (tq_attend(&ap, &te) < 0) {
		fprintf(stderr, "tqsoak: reference attention: %s\n", te.msg);
		return -1;
	}
	if (L->xf)
		tq_xf_output(L->xf, out, n_q);
	return 0;
}

static void ref_truncate(struct ref *r, uint32_t l, uint32_t pos)
{
	if (pos < r->L[l].n)
		r->L[l].n = pos;
	if (!pos && r->L[l].xf)
		tq_xf_reset(r->L[l].xf);
}

/* ---- one operation's inputs, from its seed ------------------------------------------------ */
struct opdata {
	uint32_t layer, n, n_q;
	enum tq_dtype dt;
	uint64_t dseed;
	int32_t pos[4];
	uint8_t k[64 * 4 * 128 * 4], v[64 * 4 * 128 * 4];   /* [n][n_kv][dim] of dt */
	uint8_t q[4 * 8 * 128 * 4];                          /* [n_q][n_q_heads][dim] of dt */
};

static void op_gen(struct opdata *o, const struct geo *g)
{
	uint64_t s = o->dseed;
	size_t kvn = (size_t)o->n * g->n_kv * g->dim;
	fill(o->k, o->dt, kvn, g->dim, &s);
	fill(o->v, o->dt, kvn, g->dim, &s);
	if (o->n_q)
		fill(o->q, o->dt, (size_t)o->n_q * g->n_q * g->dim, g->dim, &s);
}

/* ---- slots: a session, its log and its reference -------------------------------------------- */
enum kind { EPHEMERAL = 0, DETACHED = 1, PERSISTENT = 2 };
struct slot {
	bool used;
	bool attached;            /* s is valid */
	bool need_recover;        /* the reference must be rebuilt from the log */
	bool closing;             /* the log says a close was submitted */
	tqkv_session *s;
	uint64_t id, seed;
	char name[64];
	int tenant, gi, xi;
	enum kind kind;
	struct ref ref;
	int log_fd;
	int n_records;
};

static const char *state_dir;
static char cdir[512];
static const char *run_dir;
static uint32_t page_bytes;
/* TQ_EXPECT_GPU=1: the daemon's pool is a GPU's (soak.sh with
 * TQ_POOL_BACKEND=cuda): its kernels' outputs are held to the in-process
 * kernels' within GPU_TOL of each row's norm (tq_cuda.h: 1e-3 of the
 * oracle), not bit for bit; the blocks they append are the CPU's bytes, so
 * every later check still compares against the same cache */
static int expect_gpu;
#define GPU_TOL 2e-3

/* The worst row's max |a - b| over its norm in b (NaN counts as huge). */
static double worst_row_err(const float *a, const float *b, size_t rows, size_t dim)
{
	double worst = 0.0;

	for (size_t r = 0; r < rows; r++) {
		double n2 = 0.0, mx = 0.0;
		for (size_t j = 0; j < dim; j++) {
			const double bj = b[r * dim + j], d = fabs((double)a[r * dim + j] - bj);
			n2 += bj * bj;
			if (!(d <= mx))
				mx = d;
		}
		const double e = mx / (sqrt(n2) + 1e-12);
		if (!(e <= worst))
			worst = e;
	}
	return worst;
}
static tqkv *conn;
static struct slot S[NSLOT];
static uint64_t rng;
static uint64_t opno;
static int incarnation;

static void slot_path(int k, char *buf, size_t len) { snprintf(buf, len, "%s/slot%d.log", cdir, k); }

static void log_rec(struct slot *sl, const char *fmt, ...)
{
	char buf[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (write(sl->log_fd, buf, (size_t)n) != n) {
		fprintf(stderr, "tqsoak: slot log: %s\n", strerror(errno));
		exit(3);
	}
	sl->n_records++;
}

static void slot_drop(int k)
{
	char p[600];
	struct slot *sl = &S[k];

	if (sl->log_fd >= 0)
		close(sl->log_fd);
	ref_free(&sl->ref);
	slot_path(k, p, sizeof(p));
	unlink(p);
	memset(sl, 0, sizeof(*sl));
	sl->log_fd = -1;
}

static uint32_t xmode_of(int xi)
{
	uint32_t m = TQ_XF_DEFAULT;
	if (XFORMS[xi] && tq_xf_mode_parse(XFORMS[xi], &m) < 0)
		abort();   /* a bug in XFORMS */
	return m;
}

/* The ids of this client's ephemeral sessions now attached, for other
 * clients' probes (cI/attached, replaced atomically). */
static void publish_attached(void)
{
	char p[600], tmp[600];
	snprintf(p, sizeof(p), "%s/attached", cdir);
	snprintf(tmp, sizeof(tmp), "%s/attached.tmp", cdir);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	for (int k = 0; k < NSLOT; k++)
		if (S[k].used && S[k].attached && S[k].kind == EPHEMERAL)
			fprintf(f, "%llu\n", (unsigned long long)S[k].id);
	fclose(f);
	rename(tmp, p);
}

/* ---- errors ------------------------------------------------------------------------------------ */
static bool conn_err(int r)
{
	return r == -ECONNRESET || r == -ESHUTDOWN || r == -EPIPE || r == -ECONNREFUSED || r == -ENOENT ||
	       r == -ETIMEDOUT || r == -ENOTCONN || r == -EIO || r == -ECONNABORTED || r == -EAGAIN;
}

/* Classify a failed data operation on slot k.  Returns 0: a known,
 * expected refusal (nothing changed); 1: the session is gone (evicted);
 * 2: the connection is lost (the operation's effect is unknown). */
static int op_failed(int k, const char *op, int r, const struct tqkv_result *res)
{
	struct slot *sl = &S[k];
	uint32_t st = res ? res->status : 0;

	if (st && st < TQKV_ST__COUNT)
		K->status[st]++;
	if (st == TQKV_ST_TENANT_LIMIT || st == TQKV_ST_POOL_FULL) {
		event(st == TQKV_ST_TENANT_LIMIT ? "TENANT_LIMIT" : "POOL_FULL", sl->id, "%s tenant %s: %s", op, TENANTS[sl->tenant], tqkv_last_error());
		return 0;
	}
	/* the synchronous calls (tqkv_truncate) give the errno alone:
	 * -ESTALE is libtqkv's EVICTED */
	if (st == TQKV_ST_EVICTED || (!st && r == -ESTALE)) {
		event("EVICTED", sl->id, "%s: %s", op, tqkv_last_error());
		return 1;
	}
	if (!st && conn_err(r)) {
		K->c[C_ERR_CONN]++;
		event("CONN", sl->id, "%s: %s: %s", op, tqkv_strerror(r), tqkv_last_error());
		return 2;
	}
	event("VIOLATION", sl->id, "%s: unexpected error %s (status %s): %s", op, tqkv_strerror(r),
	      tqkv_status_name(st), tqkv_last_error());
	return 0;
}

/* ---- the daemon connection ---------------------------------------------------------------------- */
static void conn_drop(void)
{
	for (int k = 0; k < NSLOT; k++)
		if (S[k].used && S[k].attached) {
			S[k].attached = false;
			S[k].need_recover = true;
			/* the connection is dead: detach only frees the handle */
			tqkv_session_detach(S[k].s);
			S[k].s = NULL;
		}
	tqkv_disconnect(conn);
	conn = NULL;
	publish_attached();
}

static bool stop_requested(void)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/stop", state_dir);
	return access(p, F_OK) == 0;
}

/* Connect, retrying while the daemon restarts.  0 or -1 (gave up). */
static int conn_get(void)
{
	struct tqkv_connect_opts o = { .run_dir = run_dir, .queue_depth = 8, .arena_bytes = 4u << 20,
				       .timeout_ms = 10000, .op_timeout_ms = 20000 };
	uint64_t t0 = now_ms();
	int r;

	while (!conn) {
		if ((r = tqkv_connect(&conn, &o)) == 0)
			return 0;
		conn = NULL;
		if (now_ms() - t0 > CONN_RETRY_MS) {
			event("VIOLATION", 0, "cannot connect for %d s: %s: %s", CONN_RETRY_MS / 1000, tqkv_strerror(r),
			      tqkv_last_error());
			return -1;
		}
		usleep(100000);
	}
	return 0;
}

/* ---- recovery: find a session again and rebuild its reference from the log ------------------------ */
struct rec {
	char type;                /* 'A' append, 'T' truncate */
	uint64_t no;
	int layer;                /* -1: all layers (T) */
	uint32_t n, pos, n_q;
	int dt;
	uint64_t dseed;
	char state;               /* 'P' pending, 'C' done, 'F' failed */
};

static int replay(struct slot *sl, struct rec *recs, int n, struct rec **pending)
{
	static struct opdata o;
	const struct geo *g = &GEOS[sl->gi];

	ref_free(&sl->ref);
	if (ref_init(&sl->ref, g, sl->seed, XFORMS[sl->xi] && !strcmp(XFORMS[sl->xi], "none") ? 0 : xmode_of(sl->xi),
		     page_bytes) < 0)
		return -1;
	*pending = NULL;
	for (int i = 0; i < n; i++) {
		struct rec *e = &recs[i];
		if (e->state == 'F')
			continue;
		if (e->state == 'P') {
			*pending = e;   /* only the last one can be: one operation at a time */
			continue;
		}
		if (e->type == 'A') {
			o.layer = (uint32_t)e->layer;
			o.n = e->n;
			o.n_q = e->n_q;
			o.dt = (enum tq_dtype)e->dt;
			o.dseed = e->dseed;
			op_gen(&o, g);
			if (ref_append(&sl->ref, o.layer, o.k, o.v, o.dt, o.n, o.n_q ? o.q : NULL, o.n_q) < 0)
				return -1;
		} else {
			for (uint32_t l = 0; l < g->n_layers; l++)
				if (e->layer < 0 || (uint32_t)e->layer == l)
					ref_truncate(&sl->ref, l, e->pos);
		}
	}
	return 0;
}

/* Read slot k's log into S[k] (header) and recs.  Returns the record count or -1. */
static int log_read(int k, struct rec *recs, int max)
{
	char p[600], line[256];
	struct slot *sl = &S[k];
	int n = 0;

	slot_path(k, p, sizeof(p));
	FILE *f = fopen(p, "r");
	if (!f)
		return -1;
	if (!fgets(line, sizeof(line), f)) {
		fclose(f);
		return -1;
	}
	unsigned long long id, seed;
	int kind;
	if (sscanf(line, "S %llu %63s %d %d %d %d %llu", &id, sl->name, &sl->tenant, &sl->gi, &sl->xi, &kind, &seed) != 7) {
		fclose(f);
		return -1;
	}
	sl->id = id;
	sl->seed = seed;
	sl->kind = (enum kind)kind;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long no, ds;
		int a, b, c, d, e;
		if (line[0] == 'X') {
			sl->closing = true;
		} else if (line[0] == 'P' && n < max) {
			struct rec *r = &recs[n];
			memset(r, 0, sizeof(*r));
			if (sscanf(line, "P %llu A %d %d %d %d %llu", &no, &a, &b, &c, &d, &ds) == 6) {
				*r = (struct rec){ 'A', no, a, (uint32_t)b, 0, (uint32_t)d, c, ds, 'P' };
				n++;
			} else if (sscanf(line, "P %llu T %d %d", &no, &a, &e) == 3) {
				*r = (struct rec){ 'T', no, a, 0, (uint32_t)e, 0, 0, 0, 'P' };
				n++;
			}
		} else if ((line[0] == 'C' || line[0] == 'F') && sscanf(line + 1, " %llu", &no) == 1) {
			for (int i = n - 1; i >= 0; i--)
				if (recs[i].no == no) {
					recs[i].state = line[0];
					break;
				}
		}
	}
	fclose(f);
	sl->n_records = n;
	return n;
}

static int attach_slot(int k, bool by_name)
{
	struct slot *sl = &S[k];
	uint32_t fl = sl->kind == EPHEMERAL ? 0 : TQKV_SESSION_DETACHED;
	int r;

	if (by_name) {
		K->c[C_ATTACH_NAME]++;
		r = tqkv_session_attach_name(conn, TENANTS[sl->tenant], sl->name, fl, &sl->s);
		if (r == 0 && tqkv_session_id(sl->s) != sl->id) {
			event("VIOLATION", sl->id, "attach by name %s gave session %llu", sl->name,
			      (unsigned long long)tqkv_session_id(sl->s));
			tqkv_session_detach(sl->s);
			return -EEXIST;
		}
	} else {
		K->c[C_ATTACH_ID]++;
		r = tqkv_session_attach(conn, sl->id, NULL, fl, &sl->s);
	}
	if (r == 0)
		sl->attached = true;
	return r;
}

/* A session of ours evicted while detached: attach refuses it (-ESTALE),
 * so close it by id (tqkv_session_drop) rather than leave its record and
 * name to the idle TTL.  Gone already (an operator, the TTL): fine. */
static void drop_evicted(int k)
{
	struct slot *sl = &S[k];
	int r = tqkv_session_drop(conn, sl->id);

	if (r < 0 && r != -ENOENT && !conn_err(r))
		event("VIOLATION", sl->id, "drop of an evicted session: %s: %s", tqkv_strerror(r), tqkv_last_error());
}

static int check_lengths(int k);
static int do_close(int k);

/* Slot k's session must be gone (attach fails); a VIOLATION saying `why`
 * if not.  Returns 1 (the slot dropped), or 2 when the connection is lost. */
static int expect_gone(int k, const char *why)
{
	struct slot *sl = &S[k];
	int r = tqkv_session_attach(conn, sl->id, NULL, 0, &sl->s);

	if (r == 0) {
		event("VIOLATION", sl->id, "%s", why);
		tqkv_session_close(sl->s);
	} else if (conn_err(r) && r != -ENOENT) {
		return 2;
	} else {
		K->c[C_CHECK_GONE]++;
	}
	slot_drop(k);
	return 1;
}

/* Slot k after this client lost its connection or its predecessor died:
 * the session is attached again (by id or by name), its reference rebuilt
 * from the log and an operation whose completion was lost made certain.
 * Returns 0, 1 when the slot was dropped (the session is legitimately
 * gone), 2 when the connection was lost again. */
static int recover(int k)
{
	static struct rec recs[MAX_LOG_RECORDS + 16];
	struct slot *sl = &S[k];
	struct rec *pend;
	int n, r;

	sl->need_recover = false;
	if ((n = log_read(k, recs, MAX_LOG_RECORDS + 16)) < 0) {
		slot_drop(k);
		return 1;
	}
	K->c[C_RECOVER]++;
	if (!sl->id) {
		/* lost the answer to an open: close what it may have opened */
		r = tqkv_session_attach_name(conn, TENANTS[sl->tenant], sl->name, 0, &sl->s);
		if (r == 0) {
			K->c[C_CLOSE]++;
			tqkv_session_close(sl->s);
		} else if (conn_err(r) && r != -ENOENT) {
			return 2;
		}
		slot_drop(k);
		return 1;
	}
	/* killed around a close: it was submitted, so it completes; an
	 * ephemeral session's connection died: the daemon closed it */
	if (sl->closing || sl->kind == EPHEMERAL)
		return expect_gone(k, sl->closing ? "a submitted close did not complete"
						  : "ephemeral session outlived its connection");
	/* the old connection may still be being torn down: EBUSY for a moment */
	for (int tries = 0;; tries++) {
		r = attach_slot(k, splitmix(&rng) & 1);
		if (r != -EBUSY || tries > 100)
			break;
		K->c[C_ERR_BUSY_RETRY]++;
		usleep(50000);
	}
	if (r == -ESTALE) {
		/* evicted while detached: attach refuses it; closed by id */
		event("EVICTED", sl->id, "re-attach: %s", tqkv_last_error());
		drop_evicted(k);
		slot_drop(k);
		return 1;
	}
	if (r == -ENOENT) {
		/* a detached session does not survive a daemon restart; an
		 * evicted or closed one (tqctl) is gone too */
		K->c[C_ERR_GONE]++;
		event("GONE", sl->id, "%s session %s: %s", sl->kind == PERSISTENT ? "persistent" : "detached",
		      sl->name, tqkv_last_error());
		slot_drop(k);
		return 1;
	}
	if (r < 0) {
		if (conn_err(r))
			return 2;
		event("VIOLATION", sl->id, "re-attach: %s: %s", tqkv_strerror(r), tqkv_last_error());
		slot_drop(k);
		return 1;
	}
	if (sl->log_fd < 0) {
		char p[600];
		slot_path(k, p, sizeof(p));
		sl->log_fd = open(p, O_WRONLY | O_APPEND | O_CLOEXEC);
	}
	if (replay(sl, recs, n, &pend) < 0) {
		event("VIOLATION", sl->id, "replaying the log failed");
		slot_drop(k);
		return 1;
	}
	if (pend) {
		/* it happened or not: truncate to the length before it */
		uint64_t no = ++opno;
		for (uint32_t l = 0; l < GEOS[sl->gi].n_layers; l++) {
			if (pend->layer >= 0 && (uint32_t)pend->layer != l)
				continue;
			uint32_t to = pend->type == 'T' ? (pend->pos < sl->ref.L[l].n ? pend->pos : sl->ref.L[l].n)
							: sl->ref.L[l].n;
			log_rec(sl, "F %llu\nP %llu T %u %u\n", (unsigned long long)pend->no, (unsigned long long)no, l, to);
			r = tqkv_truncate(sl->s, l, to);
			if (r < 0) {
				struct tqkv_result res = { .res = r };
				int how = op_failed(k, "resolve", r, &res);
				if (how == 2)
					return 2;
				if (how == 1) {
					tqkv_session_close(sl->s);
					slot_drop(k);
					return 1;
				}
				continue;
			}
			log_rec(sl, "C %llu\n", (unsigned long long)no);
			ref_truncate(&sl->ref, l, to);
			no = ++opno;
		}
		K->c[C_RESOLVE]++;
	}
	return check_lengths(k);
}

/* Every layer holds exactly what the reference says (truncate to the
 * reference's length is a no-op that answers the length). */
static int check_lengths(int k)
{
	struct slot *sl = &S[k];
	for (uint32_t l = 0; l < GEOS[sl->gi].n_layers; l++) {
		int r = tqkv_truncate(sl->s, l, sl->ref.L[l].n);
		if (r < 0) {
			struct tqkv_result res = { .res = r };
			int how = op_failed(k, "length", r, &res);
			if (how == 1) {
				tqkv_session_close(sl->s);
				slot_drop(k);
				return 1;
			}
			if (how == 2)
				return 2;
			continue;
		}
		if ((uint32_t)r != sl->ref.L[l].n)
			event("VIOLATION", sl->id, "layer %u holds %d tokens, expected %u", l, r, sl->ref.L[l].n);
		else
			K->c[C_CHECK_LEN]++;
	}
	return 0;
}

/* ---- the operations ------------------------------------------------------------------------------------ */
static int do_open(int k)
{
	struct slot *sl = &S[k];
	char p[600];

	memset(sl, 0, sizeof(*sl));
	sl->log_fd = -1;
	sl->gi = (int)rnd_below(&rng, NGEO);
	sl->xi = (int)rnd_below(&rng, NXF);
	sl->tenant = (int)rnd_below(&rng, NTEN);
	sl->kind = (enum kind)rnd_below(&rng, 3);
	snprintf(sl->name, sizeof(sl->name), "c%d-i%d-o%llu", cidx, incarnation, (unsigned long long)++opno);
	const struct geo *g = &GEOS[sl->gi];
	int has_seed = rnd_below(&rng, 2);
	struct tqkv_session_params sp = {
		.tenant = TENANTS[sl->tenant], .name = sl->name, .n_layers = g->n_layers, .n_kv_heads = g->n_kv,
		.n_q_heads = g->n_q, .head_dim = g->dim, .k_codec = g->k, .v_codec = g->v, .max_tokens = g->max_tokens,
		.has_seed = has_seed, .seed = splitmix(&rng),
		.flags = sl->kind == PERSISTENT ? TQKV_SESSION_PERSISTENT : sl->kind == DETACHED ? TQKV_SESSION_DETACHED : 0,
		.kv_transform = XFORMS[sl->xi],
	};
	/* killed (or the daemon lost) before the answer: the next recovery
	 * looks the name up and closes what it finds (id 0) */
	slot_path(k, p, sizeof(p));
	FILE *f = fopen(p, "w");
	if (!f)
		exit(3);
	fprintf(f, "S 0 %s %d %d %d %d 0\n", sl->name, sl->tenant, sl->gi, sl->xi, (int)sl->kind);
	fclose(f);
	K->c[C_OPEN]++;
	int r = tqkv_session_open(conn, &sp, &sl->s);
	if (r < 0) {
		if (conn_err(r)) {
			sl->used = sl->need_recover = true;
			return 2;
		}
		unlink(p);
		memset(sl, 0, sizeof(*sl));
		sl->log_fd = -1;
		if (conn_err(r))
			return 2;
		event("VIOLATION", 0, "open: %s: %s", tqkv_strerror(r), tqkv_last_error());
		return 0;
	}
	sl->used = sl->attached = true;
	sl->id = tqkv_session_id(sl->s);
	sl->seed = tqkv_session_seed(sl->s);
	if (has_seed && sl->seed != sp.seed)
		event("VIOLATION", sl->id, "seed %llu, asked for %llu", (unsigned long long)sl->seed,
		      (unsigned long long)sp.seed);
	if (ref_init(&sl->ref, g, sl->seed, XFORMS[sl->xi] && !strcmp(XFORMS[sl->xi], "none") ? 0 : xmode_of(sl->xi),
		     page_bytes) < 0)
		exit(3);
	slot_path(k, p, sizeof(p));
	sl->log_fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
	if (sl->log_fd < 0)
		exit(3);
	log_rec(sl, "S %llu %s %d %d %d %d %llu\n", (unsigned long long)sl->id, sl->name, sl->tenant, sl->gi, sl->xi,
		(int)sl->kind, (unsigned long long)sl->seed);
	sl->n_records = 0;
	publish_attached();
	return 0;
}

/* An append (with_q: APPEND_ATTEND) or an attend (n == 0). */
static int do_data(int k, bool append, bool attend)
{
	static struct opdata o;
	static float out[4 * 8 * 128], want[4 * 8 * 128];
	struct slot *sl = &S[k];
	const struct geo *g = &GEOS[sl->gi];
	struct tqkv_result res = { 0 };
	tqkv_req *req;
	uint64_t no = ++opno;
	int r;

	memset(&o, 0, offsetof(struct opdata, k));
	o.layer = rnd_below(&rng, g->n_layers);
	o.dt = (enum tq_dtype)rnd_below(&rng, 3);
	o.dseed = splitmix(&rng) ^ ((uint64_t)cidx << 56);
	uint32_t len = sl->ref.L[o.layer].n;
	if (append) {
		/* prefill-sized now and then (and into an empty layer: it calibrates), else decode steps */
		o.n = !len || rnd_below(&rng, 4) == 0 ? 8 + rnd_below(&rng, 56) : 1 + rnd_below(&rng, 3);
		if (len + o.n > g->max_tokens)
			o.n = g->max_tokens - len;
		if (!o.n)
			return 0;
	}
	if (attend) {
		if (len + o.n == 0)
			return 0;
		o.n_q = 1 + rnd_below(&rng, 3);
		o.pos[0] = (int32_t)(len + o.n - 1);
		for (uint32_t i = 1; i < o.n_q; i++)
			o.pos[i] = (int32_t)rnd_below(&rng, len + o.n);
	}
	op_gen(&o, g);
	if (append)
		log_rec(sl, "P %llu A %u %u %d %u %llu\n", (unsigned long long)no, o.layer, o.n, (int)o.dt, o.n_q,
			(unsigned long long)o.dseed);
	K->c[append && attend ? C_APPEND_ATTEND : append ? C_APPEND : C_ATTEND]++;
	if (append && attend)
		r = tqkv_submit_append_attend(sl->s, o.layer, o.k, o.v, o.n, o.q, o.pos, o.n_q, (enum tqkv_dtype)o.dt,
					      out, &req);
	else if (append)
		r = tqkv_submit_append(sl->s, o.layer, o.k, o.v, o.n, (enum tqkv_dtype)o.dt, &req);
	else
		r = tqkv_submit_attend(sl->s, o.layer, o.q, o.pos, o.n_q, (enum tqkv_dtype)o.dt, out, &req);
	if (r == 0)
		r = tqkv_wait(req, &res);
	else
		res.res = r;
	if (r < 0) {
		int how = op_failed(k, append && attend ? "APPEND_ATTEND" : append ? "APPEND" : "ATTEND", r, &res);
		if (how == 2)
			return 2;   /* stays pending: recovery resolves it */
		if (append)
			log_rec(sl, "F %llu\n", (unsigned long long)no);
		if (how == 1)
			return do_close(k);
		return 0;
	}
	if (append) {
		log_rec(sl, "C %llu\n", (unsigned long long)no);
		if (ref_append(&sl->ref, o.layer, o.k, o.v, o.dt, o.n, attend ? o.q : NULL, o.n_q) < 0)
			exit(3);
	}
	if (res.n_tokens != sl->ref.L[o.layer].n) {
		event("VIOLATION", sl->id, "layer %u: daemon says %llu tokens, expected %u", o.layer,
		      (unsigned long long)res.n_tokens, sl->ref.L[o.layer].n);
		return 0;
	}
	K->c[C_CHECK_LEN]++;
	if (attend) {
		size_t on = (size_t)o.n_q * g->n_q * g->dim;
		if (ref_attend(&sl->ref, o.layer, o.q, o.pos, o.n_q, o.dt, want) < 0)
			exit(3);
		double ge = 0.0;
		if (expect_gpu && (ge = worst_row_err(out, want, (size_t)o.n_q * g->n_q, g->dim)) <= GPU_TOL) {
			K->c[C_CHECK_EXACT]++; /* within the GPU kernels' contract */
		} else if (expect_gpu) {
			event("VIOLATION", sl->id, "layer %u (%u tokens, xform %s, geo %d): the GPU's attention is %.3g "
			      "of a row's norm from the in-process reference (contract %.0e)", o.layer,
			      sl->ref.L[o.layer].n, XFORMS[sl->xi] ? XFORMS[sl->xi] : "(daemon default)", sl->gi, ge,
			      GPU_TOL);
		} else if (memcmp(out, want, on * sizeof(float)) != 0) {
			size_t j = 0;
			while (j < on && !memcmp(&out[j], &want[j], sizeof(float)))
				j++;
			event("VIOLATION", sl->id, "layer %u (%u tokens, xform %s, geo %d): attention differs from the "
			      "in-process reference at %zu: %.9g vs %.9g", o.layer, sl->ref.L[o.layer].n,
			      XFORMS[sl->xi] ? XFORMS[sl->xi] : "(daemon default)", sl->gi, j, out[j], want[j]);
		} else {
			K->c[C_CHECK_EXACT]++;
		}
	}
	return 0;
}

static int do_truncate(int k)
{
	struct slot *sl = &S[k];
	const struct geo *g = &GEOS[sl->gi];
	int layer = rnd_below(&rng, 3) == 0 ? -1 : (int)rnd_below(&rng, g->n_layers);
	uint32_t ref_n = sl->ref.L[layer < 0 ? 0 : layer].n;
	uint32_t pos = rnd_below(&rng, 8) == 0 ? 0 : ref_n > 4 ? ref_n - 1 - rnd_below(&rng, ref_n / 4) : 0;
	uint64_t no = ++opno;
	struct tqkv_req *req;
	struct tqkv_result res = { 0 };
	int r;

	log_rec(sl, "P %llu T %d %u\n", (unsigned long long)no, layer, pos);
	K->c[C_TRUNCATE]++;
	r = tqkv_submit_truncate(sl->s, layer < 0 ? TQKV_ALL_LAYERS : (uint32_t)layer, pos, &req);
	if (r == 0)
		r = tqkv_wait(req, &res);
	else
		res.res = r;
	if (r < 0) {
		int how = op_failed(k, "TRUNCATE", r, &res);
		if (how == 2)
			return 2;
		log_rec(sl, "F %llu\n", (unsigned long long)no);
		if (how == 1)
			return do_close(k);
		return 0;
	}
	log_rec(sl, "C %llu\n", (unsigned long long)no);
	for (uint32_t l = 0; l < g->n_layers; l++)
		if (layer < 0 || (uint32_t)layer == l)
			ref_truncate(&sl->ref, l, pos);
	/* the layer's length, or the longest layer's after all of them */
	uint32_t want = 0;
	for (uint32_t l = 0; l < g->n_layers; l++)
		if (layer < 0 ? sl->ref.L[l].n > want : (uint32_t)layer == l)
			want = sl->ref.L[l].n;
	if (res.n_tokens != want)
		event("VIOLATION", sl->id, "truncate layer %d to %u: daemon says %llu tokens, expected %u", layer, pos,
		      (unsigned long long)res.n_tokens, want);
	else
		K->c[C_CHECK_LEN]++;
	return 0;
}

static int do_close(int k)
{
	K->c[C_CLOSE]++;
	/* killed between here and the unlink: the next incarnation finds it closed */
	log_rec(&S[k], "X\n");
	int r = tqkv_session_close(S[k].s);
	slot_drop(k);
	publish_attached();
	if (r < 0 && r != -ESTALE && r != -ENOENT) {
		if (conn_err(r))
			return 2;
		event("VIOLATION", 0, "close: %s: %s", tqkv_strerror(r), tqkv_last_error());
	}
	return 0;
}

static int do_detach(int k)
{
	struct slot *sl = &S[k];
	if (sl->kind == EPHEMERAL)
		return 0;
	K->c[C_DETACH]++;
	int r = tqkv_session_detach(sl->s);
	sl->s = NULL;
	sl->attached = false;
	if (r < 0) {
		sl->need_recover = true;
		if (conn_err(r))
			return 2;
		event("VIOLATION", sl->id, "detach: %s: %s", tqkv_strerror(r), tqkv_last_error());
	}
	return 0;
}

/* Re-attach a detached session of ours, then check it holds what it should. */
static int do_reattach(int k)
{
	struct slot *sl = &S[k];
	int r = attach_slot(k, rnd_below(&rng, 2));
	if (r == -ESTALE) {
		event("EVICTED", sl->id, "re-attach: %s", tqkv_last_error());
		drop_evicted(k);
		slot_drop(k);
		return 0;
	}
	if (r == -ENOENT) {
		/* closed or evicted-and-dropped by an operator, or lost in a restart */
		K->c[C_ERR_GONE]++;
		event("GONE", sl->id, "%s session %s: %s", sl->kind == PERSISTENT ? "persistent" : "detached", sl->name,
		      tqkv_last_error());
		slot_drop(k);
		return 0;
	}
	if (r < 0) {
		if (conn_err(r))
			return 2;
		event("VIOLATION", sl->id, "re-attach: %s: %s", tqkv_strerror(r), tqkv_last_error());
		return 0;
	}
	return check_lengths(k);
}

/* Attach another client's ephemeral session: it is attached to that
 * client's connection, so ATTACHED_ELSEWHERE (or gone: NO_SESSION). */
static int do_probe(void)
{
	char p[600];
	unsigned long long ids[64];
	int n = 0;
	DIR *d = opendir(state_dir);
	struct dirent *e;

	if (!d)
		return 0;
	while ((e = readdir(d)) && n < 64) {
		if (e->d_name[0] != 'c' || atoi(e->d_name + 1) == cidx)
			continue;
		snprintf(p, sizeof(p), "%s/%s/attached", state_dir, e->d_name);
		FILE *f = fopen(p, "r");
		if (!f)
			continue;
		while (n < 64 && fscanf(f, "%llu", &ids[n]) == 1)
			n++;
		fclose(f);
	}
	closedir(d);
	if (!n)
		return 0;
	uint64_t id = ids[rnd_below(&rng, (uint32_t)n)];
	tqkv_session *s;
	K->c[C_PROBE]++;
	int r = tqkv_session_attach(conn, id, NULL, 0, &s);
	if (r == 0) {
		event("VIOLATION", id, "attached another client's ephemeral session");
		tqkv_session_detach(s);
	} else if (r == -EBUSY || r == -ENOENT || r == -ESTALE || r == -ESHUTDOWN) {
		K->c[C_CHECK_PROBE]++;
	} else if (conn_err(r)) {
		return 2;
	} else {
		event("VIOLATION", id, "attach of another client's session: %s: %s", tqkv_strerror(r), tqkv_last_error());
	}
	return 0;
}

/* One random step.  Returns 2 when the connection was lost. */
static int step(void)
{
	int k = (int)rnd_below(&rng, NSLOT);
	struct slot *sl = &S[k];

	if (!sl->used)
		return do_open(k);
	if (sl->need_recover)
		return recover(k) == 2 ? 2 : 0;
	if (!sl->attached)
		return do_reattach(k);
	if (sl->n_records > MAX_LOG_RECORDS)
		return do_close(k);
	uint32_t x = rnd_below(&rng, 100);
	if (x < 32)
		return do_data(k, true, true);
	if (x < 55)
		return do_data(k, true, false);
	if (x < 78)
		return do_data(k, false, true);
	if (x < 86)
		return do_truncate(k);
	if (x < 93)
		return do_detach(k);
	if (x < 95)
		return do_close(k);
	return do_probe();
}

/* At stop: recover what needs it, close everything but persistent
 * sessions, which are detached and stay for soak.sh's final checks. */
static int finish(void)
{
	for (int k = 0; k < NSLOT; k++) {
		struct slot *sl = &S[k];
		if (!sl->used)
			continue;
		if (sl->need_recover && recover(k) != 0)
			continue;
		if (!sl->attached && sl->used && do_reattach(k) != 0)
			return 2;
		if (!sl->used)
			continue;
		if (sl->kind == PERSISTENT) {
			if (check_lengths(k) == 2)
				return 2;
			if (!sl->used)
				continue;
			K->c[C_DETACH]++;
			if (tqkv_session_detach(sl->s) < 0)
				return 2;
			sl->attached = false;
		} else if (do_close(k) == 2) {
			return 2;
		}
	}
	return 0;
}

static int client_main(int argc, char **argv)
{
	char p[600];

	if (argc != 7) {
		fprintf(stderr, "usage: tqsoak client RUN_DIR STATE_DIR INDEX SEED PAGE_BYTES\n");
		return 2;
	}
	run_dir = argv[2];
	state_dir = argv[3];
	expect_gpu = getenv("TQ_EXPECT_GPU") && atoi(getenv("TQ_EXPECT_GPU"));
	cidx = atoi(argv[4]);
	page_bytes = (uint32_t)strtoul(argv[6], NULL, 0);
	snprintf(cdir, sizeof(cdir), "%s/c%d", state_dir, cidx);
	mkdir(cdir, 0755);
	for (int k = 0; k < NSLOT; k++)
		S[k].log_fd = -1;

	/* this incarnation's number and counters */
	for (incarnation = 0;; incarnation++) {
		snprintf(p, sizeof(p), "%s/counters.%d", cdir, incarnation);
		int fd = open(p, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd < 0 && errno == EEXIST)
			continue;
		if (fd < 0 || ftruncate(fd, sizeof(struct counters)) < 0)
			return 3;
		K = mmap(NULL, sizeof(*K), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
		if (K == MAP_FAILED)
			return 3;
		K->magic = COUNTERS_MAGIC;
		break;
	}
	rng = strtoull(argv[5], NULL, 0) ^ ((uint64_t)cidx << 32) ^ ((uint64_t)incarnation << 48);
	splitmix(&rng);
	opno = (uint64_t)incarnation << 40;
	snprintf(p, sizeof(p), "%s/events", cdir);
	events_fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (events_fd < 0)
		return 3;

	/* what the previous incarnation left: recovered on first use */
	for (int k = 0; k < NSLOT; k++) {
		slot_path(k, p, sizeof(p));
		if (access(p, F_OK) == 0) {
			S[k].used = true;
			S[k].need_recover = true;
		}
	}
	while (!stop_requested()) {
		if (!conn && conn_get() < 0)
			return 1;
		if (step() == 2)
			conn_drop();
	}
	for (int tries = 0; tries < 20; tries++) {
		if (!conn && conn_get() < 0)
			return 1;
		if (finish() == 0)
			break;
		conn_drop();
	}
	tqkv_disconnect(conn);
	return K->c[C_VIOLATION] ? 1 : 0;
}

/* ---- report: every incarnation of every client, summed ------------------------------------------------ */
static int report_main(int argc, char **argv)
{
	struct counters sum = { 0 };
	int files = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: tqsoak report STATE_DIR\n");
		return 2;
	}
	DIR *d = opendir(argv[2]);
	struct dirent *e;
	if (!d)
		return 2;
	while ((e = readdir(d))) {
		if (e->d_name[0] != 'c')
			continue;
		for (int i = 0;; i++) {
			char p[1024];
			struct counters c;
			snprintf(p, sizeof(p), "%s/%s/counters.%d", argv[2], e->d_name, i);
			FILE *f = fopen(p, "rb");
			if (!f)
				break;
			if (fread(&c, sizeof(c), 1, f) == 1 && c.magic == COUNTERS_MAGIC) {
				for (int j = 0; j < C__COUNT; j++)
					sum.c[j] += c.c[j];
				for (int j = 0; j < TQKV_ST__COUNT; j++)
					sum.status[j] += c.status[j];
				files++;
			}
			fclose(f);
		}
	}
	closedir(d);
	printf("client incarnations: %d\n", files);
	for (int j = 0; j < C__COUNT; j++)
		printf("  %-28s %llu\n", c_names[j], (unsigned long long)sum.c[j]);
	printf("failed data operations by status:\n");
	for (int j = 1; j < TQKV_ST__COUNT; j++)
		if (sum.status[j])
			printf("  %-28s %llu\n", tqkv_status_name((uint32_t)j), (unsigned long long)sum.status[j]);
	return sum.c[C_VIOLATION] ? 1 : 0;
}

/* errors RUN_DIR N: N failing operations (an attend on an empty layer:
 * BAD_POSITION), then disconnect: the daemon's log must account for all
 * of them (tests/integration/client_errors_log.sh). */
static int errors_main(int argc, char **argv)
{
	struct tqkv_connect_opts o = { .run_dir = argc > 2 ? argv[2] : NULL };
	struct tqkv_session_params sp = { .n_layers = 1, .n_kv_heads = 1, .n_q_heads = 1, .head_dim = 64,
					  .max_tokens = 16 };
	tqkv *c;
	tqkv_session *s;
	float q[64] = { 0 }, out[64];
	int32_t pos = 0;
	int n = argc > 3 ? atoi(argv[3]) : 0, failed = 0;

	if (argc != 4 || tqkv_connect(&c, &o) < 0 || tqkv_session_open(c, &sp, &s) < 0) {
		fprintf(stderr, "tqsoak errors: %s\n", tqkv_last_error());
		return 2;
	}
	for (int i = 0; i < n; i++)
		failed += tqkv_attend(s, 0, q, &pos, 1, TQKV_F32, out) < 0;
	printf("%d of %d operations failed\n", failed, n);
	tqkv_session_close(s);   /* not an error; the count is logged at the disconnect */
	tqkv_disconnect(c);
	return failed == n ? 0 : 1;
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	if (argc > 1 && !strcmp(argv[1], "errors"))
		return errors_main(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "client"))
		return client_main(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "report"))
		return report_main(argc, argv);
	fprintf(stderr, "usage: tqsoak client RUN_DIR STATE_DIR INDEX SEED PAGE_BYTES | tqsoak report STATE_DIR\n");
	return 2;
}
