#include "session.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tq_xform.h"
#include "tqkv_ring.h"

#define N_BUCKETS 1024 /* power of two; chains stay short up to ~64k sessions */

struct session {
	/* immutable after open */
	uint64_t id;
	char name[CONFIG_NAME_MAX];
	struct tenant *tenant;
	uid_t owner;
	struct session_geom geom;
	uint64_t seed;
	uint64_t bytes_per_token;
	uint64_t created_ms;
	unsigned flags;              /* SESSION_PERSISTENT */
	struct session_table *st;

	uint32_t refs;               /* atomic: table (while listed) + acquirers */
	struct session *next;        /* bucket chain; table lock */

	pthread_mutex_t lock;        /* guards the fields below */
	enum session_state state;
	uint32_t ops;                /* operations in flight */
	uint32_t admitting;          /* of them, waiting for memory (reclaim_admit, reclaim_charge) */
	struct session_wait wait;    /* session_admit_begin (the first wait's) */
	bool released;               /* memory given back */
	bool release_pending;        /* no longer OPEN, memory not yet given back */
	bool ended;                  /* the table's ending hook ran (ending_due) */
	uint64_t tokens;
	uint64_t resident_bytes;
	uint64_t spilled_bytes;
	uint64_t last_access_ms;
	uint64_t evicted_ms;
	uint32_t evict_reason;       /* enum tqkv_evict_reason */
	char evict_why[200];
};

struct session_table {
	pthread_mutex_t lock;        /* guards buckets, counts, next_id, reserved */
	pthread_mutex_t reserve_lock;/* one reserve() at a time, without `lock` (it fsyncs); */
				     /* taken before `lock` */
	struct session *bucket[N_BUCKETS];
	uint32_t n;                  /* listed: open + evicted */
	uint32_t max_sessions;
	uint32_t max_per_uid;        /* 0: max_sessions */
	uint64_t next_id;
	uint64_t reserved;           /* ids <= reserved may be handed out */
	session_reserve_fn reserve;  /* NULL: ids are not persisted */
	void *reserve_ctx;
	session_release_fn release;
	session_ending_fn ending;    /* NULL: none */
	void *release_ctx;
	/* counters (atomic) */
	uint64_t opened_total, closed_total, evictions_total;
	uint32_t pending_release;    /* atomic: sessions with release_pending */
};

static struct session **slot_of(struct session_table *st, uint64_t id)
{
	struct session **pp = &st->bucket[id & (N_BUCKETS - 1)];

	while (*pp && (*pp)->id != id)
		pp = &(*pp)->next;
	return pp;
}

static void session_free(struct session *s)
{
	if (!s)
		return;
	pthread_mutex_destroy(&s->lock);
	free(s);
}

static void session_unref(struct session *s)
{
	if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0)
		session_free(s);
}

/* Give the memory back if the session is no longer OPEN and idle.  Called
 * with s->lock held; returns true when the caller must run the release
 * (after dropping the lock). */
static bool release_due(struct session *s)
{
	if (s->state == SESSION_OPEN || s->ops > 0 || s->released)
		return false;
	s->released = true;
	return true;
}

/* The session left OPEN while an operation holds it (s->lock held): its
 * memory comes back when that returns; until then the table counts it
 * (session_table_pending_release), for admission to wait for. */
static void note_pending(struct session *s, bool run_release)
{
	if (!run_release && !s->released && !s->release_pending) {
		s->release_pending = true;
		__atomic_add_fetch(&s->st->pending_release, 1, __ATOMIC_SEQ_CST);
	}
}

static void do_release(struct session *s)
{
	struct session_table *st = s->st;
	uint64_t bytes;

	if (st->release)
		st->release(st->release_ctx, s);
	pthread_mutex_lock(&s->lock);
	bytes = s->resident_bytes;
	uint64_t spilled = s->spilled_bytes;
	s->resident_bytes = 0;
	s->spilled_bytes = 0;
	bool pending = s->release_pending;
	s->release_pending = false;
	pthread_mutex_unlock(&s->lock);
	if (bytes)
		tenant_uncharge(s->tenant, bytes);
	if (spilled)
		tenant_spilled_add(s->tenant, -(int64_t)spilled);
	if (pending) /* after the pages are back */
		__atomic_sub_fetch(&st->pending_release, 1, __ATOMIC_SEQ_CST);
}

/* Called with s->lock held once s left OPEN, after release_due: true when
 * an operation still holds s and the table's `ending` hook must run before
 * the close or eviction is answered (run_ending, without the lock).  The
 * hook's own operation count and reference keep the release (and the
 * memory) from going before it is done. */
static bool ending_due(struct session *s, bool run_release)
{
	if (run_release || s->released || s->ended || !s->st->ending)
		return false;
	s->ended = true; /* once: an eviction then a close, both while held */
	s->ops++;
	__atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
	return true;
}

static void run_ending(struct session *s)
{
	s->st->ending(s->st->release_ctx, s);
	session_release(s); /* the release, if the holder is done meanwhile */
}

uint32_t session_table_pending_release(struct session_table *st)
{
	return __atomic_load_n(&st->pending_release, __ATOMIC_SEQ_CST);
}

int session_table_new(struct session_table **out, uint32_t max_sessions,
		      session_release_fn release, void *release_ctx)
{
	struct session_table *st = calloc(1, sizeof(*st));

	*out = NULL;
	if (!st)
		return -ENOMEM;
	pthread_mutex_init(&st->lock, NULL);
	pthread_mutex_init(&st->reserve_lock, NULL);
	st->max_sessions = max_sessions;
	st->next_id = 1;
	st->release = release;
	st->release_ctx = release_ctx;
	*out = st;
	return 0;
}

void session_table_free(struct session_table *st)
{
	if (!st)
		return;
	for (size_t b = 0; b < N_BUCKETS; b++) {
		while (st->bucket[b])
			session_close(st, st->bucket[b]->id, NULL);
	}
	pthread_mutex_destroy(&st->lock);
	pthread_mutex_destroy(&st->reserve_lock);
	free(st);
}

void session_table_set_max(struct session_table *st, uint32_t max_sessions, uint32_t max_per_uid)
{
	pthread_mutex_lock(&st->lock);
	st->max_sessions = max_sessions;
	st->max_per_uid = max_per_uid;
	pthread_mutex_unlock(&st->lock);
}

void session_table_set_ending(struct session_table *st, session_ending_fn ending)
{
	st->ending = ending;
}

void session_table_ids_above(struct session_table *st, uint64_t id)
{
	pthread_mutex_lock(&st->lock);
	if (id < UINT64_MAX - 1 && id >= st->next_id)
		st->next_id = id + 1; /* reserved before it is handed out, as after recovery */
	pthread_mutex_unlock(&st->lock);
}

void session_table_set_ids(struct session_table *st, uint64_t first_id,
			   session_reserve_fn reserve, void *ctx)
{
	pthread_mutex_lock(&st->lock);
	st->next_id = first_id ? first_id : 1;
	st->reserved = st->next_id - 1;
	st->reserve = reserve;
	st->reserve_ctx = ctx;
	pthread_mutex_unlock(&st->lock);
}

void session_table_stats(struct session_table *st, struct session_stats *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&st->lock);
	for (size_t b = 0; b < N_BUCKETS; b++) {
		for (struct session *s = st->bucket[b]; s; s = s->next) {
			pthread_mutex_lock(&s->lock);
			if (s->state == SESSION_OPEN)
				out->open++;
			else if (s->state == SESSION_EVICTED)
				out->evicted++;
			pthread_mutex_unlock(&s->lock);
		}
	}
	pthread_mutex_unlock(&st->lock);
	out->opened_total = __atomic_load_n(&st->opened_total, __ATOMIC_RELAXED);
	out->closed_total = __atomic_load_n(&st->closed_total, __ATOMIC_RELAXED);
	out->evictions_total = __atomic_load_n(&st->evictions_total, __ATOMIC_RELAXED);
}

int session_geom_check(const struct session_geom *g, uint64_t *bytes_per_token,
		       char *why, size_t whylen)
{
	tq_error te;
	long kb, vb;
	uint64_t per_layer, total;

	if (g->n_layers < 1 || g->n_layers > SESSION_MAX_LAYERS) {
		snprintf(why, whylen, "n_layers %u is out of range [1, %d]", g->n_layers, SESSION_MAX_LAYERS);
		return -EINVAL;
	}
	if (g->n_kv_heads < 1 || g->n_kv_heads > SESSION_MAX_KV_HEADS) {
		snprintf(why, whylen, "n_kv_heads %u is out of range [1, %d]", g->n_kv_heads, SESSION_MAX_KV_HEADS);
		return -EINVAL;
	}
	if (g->n_q_heads < g->n_kv_heads || g->n_q_heads > SESSION_MAX_Q_HEADS ||
	    g->n_q_heads % g->n_kv_heads) {
		snprintf(why, whylen, "n_q_heads %u must be a multiple of n_kv_heads %u and at most %d",
			 g->n_q_heads, g->n_kv_heads, SESSION_MAX_Q_HEADS);
		return -EINVAL;
	}
	if (g->head_dim > INT32_MAX || tq_dim_check((int)g->head_dim, &te) < 0) {
		snprintf(why, whylen, "head_dim %u is not supported (a multiple of %d from %d to %d)",
			 g->head_dim, TQ_DIM_ALIGN, TQ_DIM_MIN, TQ_DIM_MAX);
		return -EINVAL;
	}
	if ((kb = tq_block_bytes(g->k_codec, (int)g->head_dim, &te)) < 0) {
		snprintf(why, whylen, "K codec: %s", te.msg);
		return -EINVAL;
	}
	if ((vb = tq_block_bytes(g->v_codec, (int)g->head_dim, &te)) < 0) {
		snprintf(why, whylen, "V codec: %s", te.msg);
		return -EINVAL;
	}
	if (tq_xf_mode_check(g->kv_xform, &te) < 0) {
		snprintf(why, whylen, "%s", te.msg);
		return -EINVAL;
	}
	if (g->max_tokens < 1 || g->max_tokens > SESSION_MAX_TOKENS) {
		snprintf(why, whylen, "max_tokens %llu is out of range [1, 2^32]",
			 (unsigned long long)g->max_tokens);
		return -EINVAL;
	}
	/* bytes per token per layer = n_kv_heads * (K block + V block) */
	per_layer = (uint64_t)g->n_kv_heads * (uint64_t)(kb + vb);
	if (__builtin_mul_overflow(per_layer, (uint64_t)g->n_layers, &total)) {
		snprintf(why, whylen, "geometry too large");
		return -EOVERFLOW;
	}
	*bytes_per_token = total;
	return 0;
}

static void fill_info(struct session *s, struct session_info *out)
{
	memset(out, 0, sizeof(*out));
	out->id = s->id;
	memcpy(out->name, s->name, sizeof(out->name));
	snprintf(out->tenant, sizeof(out->tenant), "%s", tenant_name(s->tenant));
	out->owner_uid = (uint32_t)s->owner;
	out->geom = s->geom;
	out->seed = s->seed;
	out->bytes_per_token = s->bytes_per_token;
	out->created_ms = s->created_ms;
	pthread_mutex_lock(&s->lock);
	out->tokens = s->tokens;
	out->resident_bytes = s->resident_bytes;
	out->spilled_bytes = s->spilled_bytes;
	out->last_access_ms = s->last_access_ms;
	out->state = s->state;
	out->evict_reason = s->evict_reason;
	memcpy(out->evict_why, s->evict_why, sizeof(out->evict_why));
	out->wait = s->wait;
	pthread_mutex_unlock(&s->lock);
	out->persistent = (s->flags & SESSION_PERSISTENT) != 0;
}

/* A new session's struct after the checks every admission makes: 0 and
 * *out, or an error with why. */
static int session_new(struct tenant *t, const char *name, uid_t owner, const struct session_geom *g,
		       uint64_t seed, unsigned flags, uint64_t created_ms, uint64_t now_ms,
		       struct session **out, char *why, size_t whylen)
{
	struct session *s;
	uint64_t bpt, footprint;
	int r;

	*out = NULL;
	if ((r = session_geom_check(g, &bpt, why, whylen)) < 0)
		return r;
	if (name[0] && config_check_name(name) < 0) {
		snprintf(why, whylen, "session name is not valid ([A-Za-z0-9_.-], 1..%d characters)",
			 CONFIG_NAME_MAX - 1);
		return -EINVAL;
	}
	if (__builtin_mul_overflow(bpt, g->max_tokens, &footprint) || footprint > tenant_limit(t)) {
		char a[32], b[32];
		config_format_size_human(footprint, a, sizeof(a));
		config_format_size_human(tenant_limit(t), b, sizeof(b));
		snprintf(why, whylen, "max_tokens %llu needs %s, more than tenant '%s' may hold (%s)",
			 (unsigned long long)g->max_tokens, a, tenant_name(t), b);
		return -ENOSPC;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->lock, NULL);
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->tenant = t;
	s->owner = owner;
	s->geom = *g;
	s->seed = seed;
	s->flags = flags & SESSION_PERSISTENT;
	s->bytes_per_token = bpt;
	s->created_ms = created_ms;
	s->last_access_ms = now_ms;
	s->state = SESSION_OPEN;
	s->refs = 1; /* the table's */
	*out = s;
	return 0;
}

/* Is `name` free for owner in t?  Names are the owner's: another user's
 * session of the same name in the same tenant neither clashes nor shows
 * (a clash told any user of the tenant that it existed, and its id, and
 * let one take the names another's service uses).  Table lock held;
 * *mine counts owner's sessions. */
static int name_free(struct session_table *st, struct tenant *t, const char *name, uid_t owner,
		     uint32_t *mine, char *why, size_t whylen)
{
	*mine = 0;
	for (size_t b = 0; b < N_BUCKETS; b++) {
		for (struct session *o = st->bucket[b]; o; o = o->next) {
			*mine += o->owner == owner;
			if (name[0] && o->owner == owner && o->tenant == t && strcmp(o->name, name) == 0) {
				snprintf(why, whylen, "tenant '%s' has a session named '%s' already (id %llu)",
					 tenant_name(t), name, (unsigned long long)o->id);
				return -EEXIST;
			}
		}
	}
	return 0;
}

/* List s under its id; table lock held. */
static void insert(struct session_table *st, struct session *s)
{
	struct session **pp = slot_of(st, s->id);

	assert(!*pp);
	s->st = st;
	*pp = s;
	st->n++;
	tenant_session_add(s->tenant, 1);
	__atomic_add_fetch(&st->opened_total, 1, __ATOMIC_RELAXED);
}

int session_open(struct session_table *st, struct tenant *t, const char *name, uid_t owner,
		 const struct session_geom *g, uint64_t seed, unsigned flags, uint64_t now_ms,
		 struct session_info *out, char *why, size_t whylen)
{
	struct session *s = NULL;
	uint32_t mine;
	int r;

	if ((r = session_new(t, name, owner, g, seed, flags, now_ms, now_ms, &s, why, whylen)) < 0)
		return r;
	pthread_mutex_lock(&st->lock);
	for (;;) {
		if (st->n >= st->max_sessions) {
			snprintf(why, whylen, "%u sessions already (daemon.max_sessions)", st->n);
			r = -EUSERS;
			goto fail;
		}
		if ((r = name_free(st, t, name, owner, &mine, why, whylen)) < 0)
			goto fail;
		if (st->max_per_uid && mine >= st->max_per_uid) {
			snprintf(why, whylen, "uid %u holds %u sessions already (daemon.max_sessions_per_uid)",
				 (unsigned)owner, mine);
			r = -EUSERS;
			goto fail;
		}
		if (!st->reserve || st->next_id <= st->reserved)
			break;
		/* The next block of ids on disk (a write and two fsyncs) without
		 * the table lock, which every data operation takes; then the
		 * checks again, since other opens and closes ran meanwhile. */
		pthread_mutex_unlock(&st->lock);
		pthread_mutex_lock(&st->reserve_lock);
		pthread_mutex_lock(&st->lock);
		const bool need = st->next_id > st->reserved;
		const uint64_t through = st->next_id + SESSION_ID_BLOCK - 1;
		pthread_mutex_unlock(&st->lock);
		r = need ? st->reserve(st->reserve_ctx, through, why, whylen) : 0;
		pthread_mutex_lock(&st->lock);
		if (need && r == 0) /* (another open's reserve made room already: nothing new on disk) */
			st->reserved = through;
		pthread_mutex_unlock(&st->reserve_lock);
		if (r < 0)
			goto fail;
	}
	s->id = st->next_id++;
	insert(st, s);
	fill_info(s, out);
	pthread_mutex_unlock(&st->lock);
	return 0;
fail:
	pthread_mutex_unlock(&st->lock);
	session_free(s);
	return r;
}

int session_adopt(struct session_table *st, struct tenant *t, const char *name, uid_t owner,
		  const struct session_geom *g, uint64_t seed, unsigned flags, uint64_t id,
		  uint64_t created_ms, uint64_t now_ms, char *why, size_t whylen)
{
	struct session *s = NULL;
	uint32_t mine;
	int r;

	if (id == 0 || id == UINT64_MAX) {
		snprintf(why, whylen, "session id %llu is not valid", (unsigned long long)id);
		return -EINVAL;
	}
	if ((r = session_new(t, name, owner, g, seed, flags, created_ms, now_ms, &s, why, whylen)) < 0)
		return r;
	pthread_mutex_lock(&st->lock);
	if (*slot_of(st, id)) {
		snprintf(why, whylen, "session id %llu is taken", (unsigned long long)id);
		r = -EEXIST;
		goto fail;
	}
	if ((r = name_free(st, t, name, owner, &mine, why, whylen)) < 0)
		goto fail;
	s->id = id;
	if (id >= st->next_id)
		st->next_id = id + 1; /* reserved again before it is handed out */
	insert(st, s);
	pthread_mutex_unlock(&st->lock);
	return 0;
fail:
	pthread_mutex_unlock(&st->lock);
	session_free(s);
	return r;
}

int session_get_info(struct session_table *st, uint64_t id, struct session_info *out)
{
	struct session *s;

	pthread_mutex_lock(&st->lock);
	s = *slot_of(st, id);
	if (s)
		fill_info(s, out);
	pthread_mutex_unlock(&st->lock);
	return s ? 0 : -ENOENT;
}

static int cmp_info(const void *a, const void *b)
{
	const struct session_info *x = a, *y = b;

	return x->id < y->id ? -1 : x->id > y->id;
}

int session_list(struct session_table *st, const struct tenant *t,
		 struct session_info **out, size_t *n)
{
	struct session_info *v;
	size_t k = 0;

	*out = NULL;
	*n = 0;
	pthread_mutex_lock(&st->lock);
	v = calloc(st->n ? st->n : 1, sizeof(*v));
	if (!v) {
		pthread_mutex_unlock(&st->lock);
		return -ENOMEM;
	}
	for (size_t b = 0; b < N_BUCKETS; b++)
		for (struct session *s = st->bucket[b]; s; s = s->next)
			if (!t || s->tenant == t)
				fill_info(s, &v[k++]);
	pthread_mutex_unlock(&st->lock);
	qsort(v, k, sizeof(*v), cmp_info);
	*out = v;
	*n = k;
	return 0;
}

/* Evict `id`.  idle_ttl_ms != 0: only if it is still OPEN, idle for that
 * long and without an operation in flight (the idle timer's case).
 * spare_waiting: not while it waits for pool pages itself (-EBUSY). */
static int evict_id(struct session_table *st, uint64_t id, uint64_t now_ms, uint64_t idle_ttl_ms,
		    bool spare_waiting, uint32_t reason, const char *why, struct session_info *out)
{
	struct session *s;
	bool run_release = false, ending = false;
	int r = 0;

	pthread_mutex_lock(&st->lock);
	s = *slot_of(st, id);
	if (!s) {
		pthread_mutex_unlock(&st->lock);
		return -ENOENT;
	}
	__atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&st->lock);

	pthread_mutex_lock(&s->lock);
	if (s->state == SESSION_EVICTED) {
		r = -EALREADY;
	} else if (s->state == SESSION_CLOSING) {
		r = -ESHUTDOWN;
	} else if (idle_ttl_ms && (s->ops > 0 || now_ms < s->last_access_ms ||
				   now_ms - s->last_access_ms < idle_ttl_ms)) {
		r = -EBUSY;
	} else if (spare_waiting && s->admitting) {
		r = -EBUSY;
	} else {
		s->state = SESSION_EVICTED;
		s->evicted_ms = now_ms;
		s->evict_reason = reason;
		snprintf(s->evict_why, sizeof(s->evict_why), "%s", why ? why : "");
		run_release = release_due(s);
		note_pending(s, run_release);
		ending = ending_due(s, run_release);
		__atomic_add_fetch(&st->evictions_total, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&s->lock);
	if (run_release)
		do_release(s);
	else if (ending)
		run_ending(s);
	if (out)
		fill_info(s, out);
	session_unref(s);
	return r;
}

static uint64_t clock_ms(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t session_clock_ms(void)
{
	static uint64_t offset; /* atomic: the wall clock minus CLOCK_BOOTTIME, at the first call */
	uint64_t off = __atomic_load_n(&offset, __ATOMIC_RELAXED);

	if (!off) {
		uint64_t want = clock_ms(CLOCK_REALTIME) - clock_ms(CLOCK_BOOTTIME);
		want += !want; /* 0 says "not set yet" */
		/* the first thread's offset wins; a later one gets it in off */
		if (__atomic_compare_exchange_n(&offset, &off, want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
			off = want;
	}
	return clock_ms(CLOCK_BOOTTIME) + off;
}

int session_evict_pressure(struct session_table *st, uint64_t id, const char *why, struct session_info *out)
{
	return evict_id(st, id, session_clock_ms(), 0, true, TQKV_EVICT_PRESSURE, why, out);
}

int session_evict(struct session_table *st, uint64_t id, struct session_info *out)
{
	return evict_id(st, id, session_clock_ms(), 0, false, TQKV_EVICT_OPERATOR, "evicted by an operator", out);
}

uint32_t session_evict_reason(struct session_table *st, uint64_t id)
{
	struct session *s;
	uint32_t r = TQKV_EVICT_UNKNOWN;

	pthread_mutex_lock(&st->lock);
	s = *slot_of(st, id);
	if (s) {
		pthread_mutex_lock(&s->lock);
		if (s->state == SESSION_EVICTED)
			r = s->evict_reason;
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&st->lock);
	return r;
}

int session_close(struct session_table *st, uint64_t id, uint64_t *released)
{
	struct session **pp, *s;
	bool run_release, ending;

	pthread_mutex_lock(&st->lock);
	pp = slot_of(st, id);
	s = *pp;
	if (!s) {
		pthread_mutex_unlock(&st->lock);
		return -ENOENT;
	}
	*pp = s->next;
	s->next = NULL;
	st->n--;
	tenant_session_add(s->tenant, -1);
	__atomic_add_fetch(&st->closed_total, 1, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&st->lock);

	pthread_mutex_lock(&s->lock);
	if (released)
		*released = s->resident_bytes + s->spilled_bytes;
	s->state = SESSION_CLOSING;
	run_release = release_due(s);
	note_pending(s, run_release);
	ending = ending_due(s, run_release);
	pthread_mutex_unlock(&s->lock);
	if (run_release)
		do_release(s);
	else if (ending)
		run_ending(s);
	session_unref(s); /* the table's reference */
	return 0;
}

uint32_t session_table_expire(struct session_table *st, uint64_t now_ms, uint64_t ttl_ms)
{
	enum { BATCH = 256 };
	uint64_t evict[BATCH], drop[BATCH];
	uint32_t changed = 0, n_evict = 0, n_drop = 0;

	if (ttl_ms == 0)
		return 0;
	/* Pick candidates under the lock, act without it; what is left over
	 * beyond a batch waits for the next tick. */
	pthread_mutex_lock(&st->lock);
	for (size_t b = 0; b < N_BUCKETS; b++) {
		for (struct session *s = st->bucket[b]; s; s = s->next) {
			pthread_mutex_lock(&s->lock);
			if (s->state == SESSION_OPEN && s->ops == 0 && !(s->flags & SESSION_PERSISTENT) &&
			    now_ms >= s->last_access_ms &&
			    now_ms - s->last_access_ms >= ttl_ms && n_evict < BATCH)
				evict[n_evict++] = s->id;
			else if (s->state == SESSION_EVICTED && now_ms >= s->evicted_ms &&
				 now_ms - s->evicted_ms >= ttl_ms && n_drop < BATCH)
				drop[n_drop++] = s->id;
			pthread_mutex_unlock(&s->lock);
		}
	}
	pthread_mutex_unlock(&st->lock);
	for (uint32_t i = 0; i < n_evict; i++)
		if (evict_id(st, evict[i], now_ms, ttl_ms, false, TQKV_EVICT_IDLE, "idle past daemon.session_idle_ttl",
			     NULL) == 0)
			changed++;
	for (uint32_t i = 0; i < n_drop; i++)
		if (session_close(st, drop[i], NULL) == 0)
			changed++;
	return changed;
}

/* ---- the data path --------------------------------------------------------- */
int session_acquire(struct session_table *st, uint64_t id, uint64_t now_ms, struct session **out)
{
	struct session *s;
	int r = 0;

	*out = NULL;
	pthread_mutex_lock(&st->lock);
	s = *slot_of(st, id);
	if (!s) {
		pthread_mutex_unlock(&st->lock);
		return -ENOENT;
	}
	pthread_mutex_lock(&s->lock);
	if (s->state == SESSION_EVICTED) {
		r = -ESTALE;
	} else if (s->state == SESSION_CLOSING) {
		r = -ESHUTDOWN;
	} else {
		s->ops++;
		if (now_ms)
			s->last_access_ms = now_ms;
		__atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&s->lock);
	pthread_mutex_unlock(&st->lock);
	if (r == 0)
		*out = s;
	return r;
}

void session_release(struct session *s)
{
	bool run_release;

	pthread_mutex_lock(&s->lock);
	assert(s->ops > 0 && "session_release without session_acquire");
	s->ops--;
	run_release = release_due(s);
	pthread_mutex_unlock(&s->lock);
	if (run_release)
		do_release(s);
	session_unref(s);
}

void session_admit_begin(struct session *s, uint64_t since_us, bool at_limit, uint64_t bytes)
{
	assert(since_us > 0);
	pthread_mutex_lock(&s->lock);
	assert(s->ops > s->admitting && "session_admit_begin outside an operation");
	if (!s->admitting++)
		s->wait = (struct session_wait){ since_us, bytes, at_limit, false };
	pthread_mutex_unlock(&s->lock);
}

void session_admit_end(struct session *s)
{
	pthread_mutex_lock(&s->lock);
	assert(s->admitting > 0 && "session_admit_end without session_admit_begin");
	if (!--s->admitting)
		s->wait = (struct session_wait){ 0 };
	pthread_mutex_unlock(&s->lock);
}

void session_admit_stuck(struct session *s, bool stuck)
{
	pthread_mutex_lock(&s->lock);
	s->wait.stuck = stuck && s->admitting;
	pthread_mutex_unlock(&s->lock);
}

void session_wait_get(struct session *s, struct session_wait *out)
{
	pthread_mutex_lock(&s->lock);
	*out = s->wait;
	pthread_mutex_unlock(&s->lock);
}

bool session_is_open(struct session *s)
{
	bool open;

	pthread_mutex_lock(&s->lock);
	open = s->state == SESSION_OPEN;
	pthread_mutex_unlock(&s->lock);
	return open;
}

int session_charge(struct session *s, uint64_t bytes)
{
	int r;

	pthread_mutex_lock(&s->lock);
	assert(s->ops > 0 && "session_charge outside an operation");
	if (s->state != SESSION_OPEN) {
		r = -ESTALE;
		goto fail;
	}
	if ((r = tenant_charge(s->tenant, bytes)) < 0)
		goto fail;
	s->resident_bytes += bytes;
fail:
	pthread_mutex_unlock(&s->lock);
	return r;
}

void session_uncharge(struct session *s, uint64_t bytes)
{
	pthread_mutex_lock(&s->lock);
	assert(s->resident_bytes >= bytes && "uncharged more than the session holds");
	s->resident_bytes -= bytes;
	pthread_mutex_unlock(&s->lock);
	tenant_uncharge(s->tenant, bytes);
}

void session_spill_move(struct session *s, uint64_t bytes)
{
	pthread_mutex_lock(&s->lock);
	assert(s->resident_bytes >= bytes && "spilled more than the session holds");
	s->resident_bytes -= bytes;
	s->spilled_bytes += bytes;
	pthread_mutex_unlock(&s->lock);
	tenant_uncharge(s->tenant, bytes);
	tenant_spilled_add(s->tenant, (int64_t)bytes);
}

int session_restore_move(struct session *s, uint64_t bytes)
{
	int r;

	pthread_mutex_lock(&s->lock);
	assert(s->spilled_bytes >= bytes && "restored more than the session spilled");
	if ((r = tenant_charge(s->tenant, bytes)) == 0) {
		s->spilled_bytes -= bytes;
		s->resident_bytes += bytes;
		tenant_spilled_add(s->tenant, -(int64_t)bytes);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

void session_unspill(struct session *s, uint64_t bytes)
{
	pthread_mutex_lock(&s->lock);
	assert(s->spilled_bytes >= bytes && "dropped more spilled bytes than the session has");
	s->spilled_bytes -= bytes;
	pthread_mutex_unlock(&s->lock);
	tenant_spilled_add(s->tenant, -(int64_t)bytes);
}

void session_add_spilled(struct session *s, uint64_t bytes)
{
	pthread_mutex_lock(&s->lock);
	s->spilled_bytes += bytes;
	pthread_mutex_unlock(&s->lock);
	tenant_spilled_add(s->tenant, (int64_t)bytes);
}

void session_set_tokens(struct session *s, uint64_t n)
{
	pthread_mutex_lock(&s->lock);
	s->tokens = n;
	pthread_mutex_unlock(&s->lock);
}

uint64_t session_id(const struct session *s) { return s->id; }
uint64_t session_seed(const struct session *s) { return s->seed; }
const struct session_geom *session_geom(const struct session *s) { return &s->geom; }
struct tenant *session_tenant(const struct session *s) { return s->tenant; }
bool session_persistent(const struct session *s) { return (s->flags & SESSION_PERSISTENT) != 0; }
void session_info_of(struct session *s, struct session_info *out) { fill_info(s, out); }
