/* kvpersist.c — persistent sessions over the page tables (kvpersist.h). */
#include "kvpersist.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dataop_internal.h"
#include "log.h"
#include "persist.h"
#include "spill.h"
#include "tqkv_ring.h"

struct kvpersist {
	int dirfd;                /* spill_dir/sessions */
	uint64_t interval_ms;     /* atomic */
	pthread_t thread;
	bool running, stop, shutdown;
	pthread_mutex_t lock;     /* guards stop and kick (with cond) */
	pthread_cond_t cond;
	bool kick;                /* a journal passed KVP_JOURNAL_CHECKPOINT */
	struct session_table *st;
	/* counters (atomic) */
	uint64_t checkpoints, checkpoint_failures, journal_records, journal_bytes;
	uint64_t restored, dropped;
};

struct kvp_wt {                   /* one page being written through */
	uint32_t l, i;
	uint64_t slot, gen;
	struct io_one io;
};

struct kvp_sess {
	int jfd;                  /* the journal; -1: a checkpoint must come first */
	uint64_t joff;            /* its end */
	uint32_t jseq;            /* next record's number in this epoch */
	uint64_t epoch;           /* of the manifest on disk (0: none yet) */
	bool dirty;               /* atomic: changed since that manifest */
	uint64_t last_ckpt_ms;
	/* checkpoints failing in a row, and no periodic one before retry_ms
	 * (atomic, CLOCK_MONOTONIC): a failing one is retried with a growing
	 * delay, not at every tick (nor at every append once the journal is
	 * past KVP_JOURNAL_CHECKPOINT) */
	uint32_t fails;
	uint64_t retry_ms;
	uint64_t *dfree;          /* slots a manifest on disk may still name */
	size_t n_dfree, cap_dfree;
	struct io_batch wt_b;     /* write-through in flight */
	struct kvp_wt *wt;
	uint32_t wt_n, wt_cap;
	bool wt_warned;
	uint8_t *buf;             /* journal record scratch */
	size_t buf_cap;
};

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

bool kvstore_persist_enabled(struct kvstore *ks)
{
	return ks->persist != NULL && ks->spill != NULL;
}

/* ---- per session ------------------------------------------------------------------ */
int kvp_sess_new(struct kvstore *ks, struct kv_sess *kv)
{
	(void)ks;
	if (!(kv->p = calloc(1, sizeof(*kv->p))))
		return -ENOMEM;
	kv->p->jfd = -1;
	kv->p->last_ckpt_ms = mono_ms();
	return 0;
}

void kvp_defer_free(struct kv_sess *kv, uint64_t slot)
{
	struct kvp_sess *p = kv->p;

	if (p->n_dfree == p->cap_dfree) {
		size_t cap = p->cap_dfree ? p->cap_dfree * 2 : 64;
		uint64_t *n = realloc(p->dfree, cap * sizeof(*n));
		if (!n) {
			/* cannot remember it: leak the slot rather than risk
			 * reusing one a manifest names (freed at restart) */
			log_err("session %" PRIu64 ": out of memory; spill slot %" PRIu64 " stays used until restart",
				kv->id, slot);
			return;
		}
		p->dfree = n;
		p->cap_dfree = cap;
	}
	p->dfree[p->n_dfree++] = slot;
}

static void free_deferred(struct kvstore *ks, struct kvp_sess *p)
{
	for (size_t i = 0; i < p->n_dfree; i++)
		spill_slot_free(ks->spill, p->dfree[i]);
	p->n_dfree = 0;
}

void kvp_sess_free(struct kvstore *ks, struct kv_sess *kv)
{
	struct kvp_sess *p = kv->p;

	if (!p)
		return;
	/* Its slots go back only once no manifest names them: closed or
	 * evicted, the copy on disk goes first (so a crash in between never
	 * finds a manifest naming free slots); a manifest that could not be
	 * removed, or that is kept (the daemon's shutdown, or a session
	 * recovery keeps for the next start), keeps them used until restart. */
	bool keep = ks->persist != NULL;
	if (ks->persist && !ks->persist->shutdown) {
		int r = persist_remove(ks->persist->dirfd, kv->id);
		if (r < 0) {
			log_err("session %" PRIu64 ": removing its persistent copy (%s/%" PRIu64 ".tqm, then syncing "
				"the directory): %s; its spill slots stay used until restart", kv->id, PERSIST_SUBDIR,
				kv->id, strerror(-r));
		} else {
			log_info("session %" PRIu64 ": persistent copy removed", kv->id);
			keep = false;
		}
	}
	if (keep)
		p->n_dfree = 0;
	else
		free_deferred(ks, p);
	if (p->jfd >= 0)
		close(p->jfd);
	free(p->dfree);
	free(p->wt);
	free(p->buf);
	free(p);
	kv->p = NULL;
}

void kvp_sess_ending(struct kvstore *ks, struct session *s, struct kv_sess *kv)
{
	struct kvpersist *kp = ks->persist;
	const uint64_t id = session_id(s);
	char why[256];

	/* (at the daemon's shutdown a session stays whatever its state).  A
	 * persistent session whose KV state is not made yet (its open is
	 * still writing the first manifest) is marked too: a mark without
	 * files costs nothing. */
	if (!kp || kp->shutdown || !session_persistent(s))
		return;
	/* the manifest's epoch now: one checkpoint in flight may still move
	 * it by one (no other starts on a session that is not open) */
	uint64_t epoch = kv && kv->p ? __atomic_load_n(&kv->p->epoch, __ATOMIC_RELAXED) : 0;
	int r = persist_mark_closed(kp->dirfd, id, epoch, why, sizeof(why));
	if (r < 0)
		log_err("session %" PRIu64 ": closed while in use, and its persistent copy could not be marked "
			"closed (%s): if tqkvd stops before that use ends, the next start brings the session back",
			id, why);
	else
		log_debug("session %" PRIu64 ": closed while in use: its persistent copy is marked closed, "
			  "removed when that use ends", id);
}

/* ---- write-through ------------------------------------------------------------------- */
/* Wait for the batch in flight and take its results: written pages are
 * clean, failed ones keep no slot.  The first failure: its errno, and
 * why (may be NULL) says which page and how; 0 when all were written. */
static int wt_finish(struct kvstore *ks, struct kv_sess *kv, char *why, size_t whylen)
{
	struct kvp_sess *p = kv->p;
	int err = 0;

	if (!p || !p->wt_n)
		return 0;
	dataop_batch_wait(ks, &p->wt_b);
	for (uint32_t k = 0; k < p->wt_n; k++) {
		struct kvp_wt *w = &p->wt[k];
		struct kv_page_meta *m = &kv->layer[w->l].meta[w->i];
		if (w->io.res == 0) {
			m->slot = w->slot;
			m->gen = w->gen;
			m->clean = 1;
			continue;
		}
		spill_slot_free(ks->spill, w->slot);
		if (!err) {
			err = w->io.res;
			if (why)
				snprintf(why, whylen, "layer %u page %u: %s", w->l, w->i, w->io.why);
		}
	}
	p->wt_n = 0;
	return err;
}

void kvp_wt_collect(struct kvstore *ks, struct kv_sess *kv)
{
	char why[384];

	if (wt_finish(ks, kv, why, sizeof(why)) < 0 && !kv->p->wt_warned) {
		log_warning("session %" PRIu64 ": writing a full page through failed: %s (the next checkpoint "
			    "writes it; the journal holds its tokens meanwhile)", kv->id, why);
		kv->p->wt_warned = true;
	}
}

/* Queue pages of kv for writing (kv->lock held, no batch in flight):
 * every RESIDENT page without a copy among (l, from..to) or, for l ==
 * UINT32_MAX, every layer's.  Returns how many are queued; *err: the
 * first failure to queue one (-ENOSPC: the tier is full). */
static uint32_t wt_queue(struct kvstore *ks, struct kv_sess *kv, uint32_t l0, uint32_t from, uint32_t to, int *err)
{
	struct kvp_sess *p = kv->p;
	uint32_t want = 0;

	*err = 0;
	for (uint32_t l = l0 == UINT32_MAX ? 0 : l0; l < (l0 == UINT32_MAX ? kv->n_layers : l0 + 1); l++) {
		struct kv_layer *L = &kv->layer[l];
		uint32_t a = l0 == UINT32_MAX ? 0 : from, b = l0 == UINT32_MAX ? L->n_pages : to;
		for (uint32_t i = a; i < b && i < L->n_pages; i++)
			want += L->meta[i].state == PG_RESIDENT && !L->meta[i].clean;
	}
	if (!want)
		return 0;
	if (want > p->wt_cap) {
		struct kvp_wt *n = realloc(p->wt, want * sizeof(*n));
		if (!n) {
			*err = -ENOMEM;
			return 0;
		}
		p->wt = n;
		p->wt_cap = want;
	}
	p->wt_b.pending = 0;
	p->wt_n = 0;
	for (uint32_t l = l0 == UINT32_MAX ? 0 : l0; l < (l0 == UINT32_MAX ? kv->n_layers : l0 + 1); l++) {
		struct kv_layer *L = &kv->layer[l];
		uint32_t a = l0 == UINT32_MAX ? 0 : from, b = l0 == UINT32_MAX ? L->n_pages : to;
		for (uint32_t i = a; i < b && i < L->n_pages; i++) {
			if (L->meta[i].state != PG_RESIDENT || L->meta[i].clean)
				continue;
			struct kvp_wt *w = &p->wt[p->wt_n];
			int e = spill_slot_alloc(ks->spill, &w->slot);
			if (e < 0) {
				*err = e;
				goto submit;
			}
			w->l = l;
			w->i = i;
			w->gen = ++kv->gen_next;
			w->io.b = &p->wt_b;
			w->io.res = 0;
			w->io.why[0] = 0;
			p->wt_n++;
		}
	}
submit:
	/* pending first: a completion may come before the last submit */
	p->wt_b.pending = p->wt_n;
	for (uint32_t k = 0; k < p->wt_n; k++) {
		struct kvp_wt *w = &p->wt[k];
		struct spill_page_hdr h = dataop_hdr_of(kv, w->l, w->i);
		int e;
		h.generation = w->gen;
		if ((e = spill_write(ks->spill, w->slot, &h, kv->layer[w->l].pages[w->i], dataop_io_done, &w->io,
				       SPILL_BACKGROUND)) < 0)
			dataop_io_fail(&w->io, e);
	}
	return p->wt_n;
}

void kvp_write_through(struct kvstore *ks, struct kv_sess *kv, uint32_t l, uint32_t from, uint32_t to)
{
	int err;

	if (from >= to)
		return;
	kvp_wt_collect(ks, kv);
	wt_queue(ks, kv, l, from, to, &err);
	if (err && !kv->p->wt_warned) {
		log_warning("session %" PRIu64 ": cannot write layer %u's full pages through: %s (the next "
			    "checkpoint tries again; the journal holds their tokens meanwhile)", kv->id, l,
			    strerror(-err));
		kv->p->wt_warned = true;
	}
}

/* ---- checkpoints --------------------------------------------------------------------- */
static int checkpoint_locked(struct kvstore *ks, struct session *s, struct kv_sess *kv, char *why, size_t whylen)
{
	struct kvpersist *kp = ks->persist;
	struct kvp_sess *p = kv->p;
	struct persist_manifest m;
	struct session_info si;
	int err, r;

	for (uint32_t l = 0; l < kv->n_layers; l++)
		dataop_readahead_finish(ks, s, kv, l);
	kvp_wt_collect(ks, kv);
	/* every page without a copy on disk gets one */
	wt_queue(ks, kv, UINT32_MAX, 0, 0, &err);
	r = wt_finish(ks, kv, why, whylen);
	err = err ? err : r;
	if (err) {
		if (!why[0] && err == -ENOSPC) {
			struct spill_stats st;
			spill_stats(ks->spill, &st);
			snprintf(why, whylen, "the spill tier is full (%" PRIu64 " of %" PRIu64 " slots in use)",
				 st.slots_used, st.slots_total);
		} else if (!why[0]) {
			snprintf(why, whylen, "%s", strerror(-err));
		}
		return err;
	}
	if ((r = spill_sync(ks->spill)) < 0) {
		snprintf(why, whylen, "fdatasync of %s: %s", spill_path(ks->spill), strerror(-r));
		return r;
	}
	session_info_of(s, &si);
	memset(&m, 0, sizeof(m));
	m.id = kv->id;
	snprintf(m.tenant, sizeof(m.tenant), "%s", si.tenant);
	snprintf(m.name, sizeof(m.name), "%s", si.name);
	m.owner_uid = si.owner_uid;
	m.geom = si.geom;
	m.seed = kv->seed;
	m.created_ms = si.created_ms;
	m.page_bytes = ks->page_bytes;
	m.page_tokens = kv->geom.page_tokens;
	m.layout_id = TQ_PAGE_LAYOUT_ID;
	{
		struct spill_stats st;
		spill_stats(ks->spill, &st);
		m.slot_bytes = st.slot_bytes;
	}
	m.epoch = p->epoch + 1;
	m.gen_next = kv->gen_next;
	if (!(m.layers = calloc(kv->n_layers, sizeof(*m.layers)))) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	for (uint32_t l = 0; l < kv->n_layers; l++) {
		struct kv_layer *L = &kv->layer[l];
		m.layers[l].n_tokens = L->n_tokens;
		m.layers[l].n_pages = L->n_pages;
		if (L->n_pages && !(m.layers[l].pages = calloc(L->n_pages, sizeof(struct persist_page)))) {
			persist_manifest_free(&m);
			snprintf(why, whylen, "out of memory");
			return -ENOMEM;
		}
		for (uint32_t i = 0; i < L->n_pages; i++) {
			struct kv_page_meta *pm = &L->meta[i];
			bool copy = pm->state == PG_SPILLED || (pm->state == PG_RESIDENT && pm->clean);
			m.layers[l].pages[i].slot = copy ? pm->slot : PERSIST_SLOT_LOST;
			m.layers[l].pages[i].gen = copy ? pm->gen : 0;
		}
		/* the statistics the pages' keys and values were transformed by */
		size_t xb = L->xf ? tq_xf_blob_bytes(L->xf) : 0;
		if (xb && !(m.layers[l].xf = malloc(xb))) {
			persist_manifest_free(&m);
			snprintf(why, whylen, "out of memory");
			return -ENOMEM;
		}
		if (xb)
			tq_xf_blob_write(L->xf, m.layers[l].xf);
		m.layers[l].xf_bytes = (uint32_t)xb;
	}
	r = persist_manifest_write(kp->dirfd, &m, why, whylen);
	persist_manifest_free(&m);
	if (r < 0)
		return r;
	/* The manifest is in place (a restart reads it): the old journal is
	 * history, and its records would be skipped as already in it.  The
	 * slots only the old manifest named are history too once the
	 * directory is synced: not before (a power loss may bring the old
	 * manifest back), so after a failed sync they wait for the next
	 * checkpoint. */
	const bool synced = r == 0;
	char sync_why[256] = "";
	if (!synced)
		snprintf(sync_why, sizeof(sync_why), "%s", why);
	__atomic_store_n(&p->epoch, p->epoch + 1, __ATOMIC_RELAXED); /* read unlocked by kvp_sess_ending */
	if (p->jfd >= 0)
		close(p->jfd);
	p->jfd = persist_journal_reset(kp->dirfd, kv->id, p->epoch, why, whylen);
	if (p->jfd < 0)
		log_err("session %" PRIu64 ": new journal: %s (the next append checkpoints again)", kv->id, why);
	__atomic_store_n(&p->joff, PERSIST_JNL_HDR, __ATOMIC_RELAXED);
	p->jseq = 0;
	if (!synced) {
		/* dirty: the next checkpoint (the periodic one too) syncs again
		 * and frees the slots */
		__atomic_store_n(&p->dirty, true, __ATOMIC_RELAXED);
		snprintf(why, whylen, "%s (the checkpoint is in place; the slots it let go wait for the next one)",
			 sync_why);
		log_err("session %" PRIu64 ": checkpoint: %s", kv->id, why);
		return -EIO;
	}
	free_deferred(ks, p);
	__atomic_store_n(&p->dirty, false, __ATOMIC_RELAXED);
	__atomic_store_n(&p->last_ckpt_ms, mono_ms(), __ATOMIC_RELAXED);
	p->wt_warned = false;
	__atomic_add_fetch(&kp->checkpoints, 1, __ATOMIC_RELAXED);
	why[0] = 0;
	return 0;
}

/* After a failed checkpoint: twice the interval, doubling per failure in
 * a row, a minute at most. */
static uint64_t retry_delay_ms(uint64_t iv, uint32_t fails)
{
	uint64_t d = iv << (fails < 10 ? fails : 10);
	return d < 60000 ? d : 60000;
}

static int checkpoint_or_count(struct kvstore *ks, struct session *s, struct kv_sess *kv, char *why, size_t whylen)
{
	struct kvp_sess *p = kv->p;
	int r = checkpoint_locked(ks, s, kv, why, whylen);

	if (r < 0) {
		__atomic_add_fetch(&ks->persist->checkpoint_failures, 1, __ATOMIC_RELAXED);
		p->fails++;
		__atomic_store_n(&p->retry_ms,
				 mono_ms() + retry_delay_ms(__atomic_load_n(&ks->persist->interval_ms, __ATOMIC_RELAXED),
							    p->fails),
				 __ATOMIC_RELAXED);
	} else {
		p->fails = 0;
		__atomic_store_n(&p->retry_ms, 0, __ATOMIC_RELAXED);
	}
	return r;
}

int dataop_checkpoint(struct kvstore *ks, struct session *s, char *why, size_t whylen)
{
	struct kv_sess *kv;
	int r;

	why[0] = 0;
	if (!session_persistent(s) || !kvstore_persist_enabled(ks)) {
		snprintf(why, whylen, "session %" PRIu64 " is not persistent", session_id(s));
		return -EINVAL;
	}
	if ((r = dataop_kv_get(ks, s, &kv)) < 0) {
		snprintf(why, whylen, "session state: %s", strerror(-r));
		return r;
	}
	pthread_mutex_lock(&kv->lock);
	if (kv->p->epoch && kv->p->jfd >= 0 && !__atomic_load_n(&kv->p->dirty, __ATOMIC_RELAXED))
		r = 0; /* nothing changed */
	else if (!pool_host_accessible(ks->pool) && pool_lost(ks->pool, why, whylen)) {
		/* a lost discrete GPU: no page can be copied out (each would fail) */
		__atomic_add_fetch(&ks->persist->checkpoint_failures, 1, __ATOMIC_RELAXED);
		r = -ENOTRECOVERABLE;
	} else {
		r = checkpoint_or_count(ks, s, kv, why, whylen);
	}
	pthread_mutex_unlock(&kv->lock);
	return r;
}

int dataop_persist_init(struct kvstore *ks, struct session *s, char *why, size_t whylen)
{
	return dataop_checkpoint(ks, s, why, whylen);
}

/* ---- the journal ---------------------------------------------------------------------- */
/* The journal is usable (else, where the session's pages are as its
 * counts say, a checkpoint makes a new one): 0 or an error in r. */
static int journal_ready(struct kvstore *ks, struct session *s, struct kv_sess *kv, bool may_checkpoint,
			 struct dataop_res *r)
{
	char why[256] = "";

	if (kv->p->jfd >= 0)
		return 0;
	if (!may_checkpoint) {
		/* a record of this append failed to reach the journal already */
		dataop_res_set(r, -EIO, TQKV_ST_SPILL_IO, 0);
		snprintf(r->msg, sizeof(r->msg), "persistent session: its journal failed during the operation");
		return r->res;
	}
	checkpoint_or_count(ks, s, kv, why, sizeof(why));
	if (kv->p->jfd >= 0) /* (also after a checkpoint whose directory sync failed: it is in place) */
		return 0;
	dataop_res_set(r, -EIO, TQKV_ST_SPILL_IO, 0);
	snprintf(r->msg, sizeof(r->msg), "persistent session: no journal for the operation: %.180s", why);
	return r->res;
}

int kvp_journal_open(struct kvstore *ks, struct session *s, struct kv_sess *kv, struct dataop_res *r)
{
	return journal_ready(ks, s, kv, true, r);
}

static int journal_put(struct kvstore *ks, struct kv_sess *kv, struct persist_rec *rec, const void *p1, size_t n1,
		       const void *p2, size_t n2, struct dataop_res *r)
{
	struct kvpersist *kp = ks->persist;
	struct kvp_sess *p = kv->p;
	int e;

	rec->seq = p->jseq;
	rec->epoch = p->epoch;
	if ((e = persist_journal_write(p->jfd, &p->joff, rec, p1, n1, p2, n2)) < 0) {
		/* whatever reached the file is a torn record replay stops at;
		 * nothing more goes after it before a checkpoint */
		close(p->jfd);
		p->jfd = -1;
		dataop_res_set(r, e, TQKV_ST_SPILL_IO, 0);
		snprintf(r->msg, sizeof(r->msg), "persistent session: writing its journal (%s/%" PRIu64 ".tqj): %s",
			 PERSIST_SUBDIR, kv->id, strerror(-e));
		log_err("session %" PRIu64 ": %s", kv->id, r->msg);
		return e;
	}
	p->jseq++;
	__atomic_store_n(&p->dirty, true, __ATOMIC_RELAXED);
	__atomic_add_fetch(&kp->journal_records, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&kp->journal_bytes, PERSIST_REC_HDR + n1 + n2, __ATOMIC_RELAXED);
	if (p->joff >= KVP_JOURNAL_CHECKPOINT && mono_ms() >= __atomic_load_n(&p->retry_ms, __ATOMIC_RELAXED)) {
		pthread_mutex_lock(&kp->lock);
		kp->kick = true;
		pthread_cond_signal(&kp->cond);
		pthread_mutex_unlock(&kp->lock);
	}
	return 0;
}

int kvp_journal_append(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l, uint32_t first,
		       uint32_t n, struct dataop_res *r)
{
	const struct tq_page_geom *g = &kv->geom;
	struct kvp_sess *p = kv->p;
	struct kv_layer *L = &kv->layer[l];
	size_t kb = g->k_block_bytes, vb = g->v_block_bytes;
	size_t kpart = (size_t)n * g->n_kv_heads * kb, vpart = (size_t)n * g->n_kv_heads * vb;
	struct persist_rec rec = { .type = PERSIST_REC_APPEND, .layer = l, .first = first, .n = n };
	int e;

	if (!n)
		return 0;
	if (kpart + vpart > PERSIST_REC_MAX) {
		dataop_res_set(r, -E2BIG, TQKV_ST_SPILL_IO, 0);
		snprintf(r->msg, sizeof(r->msg), "persistent session: one append of %u tokens is %zu compressed "
			 "bytes, more than a journal record holds (%u); append in smaller steps", n, kpart + vpart,
			 PERSIST_REC_MAX);
		return r->res;
	}
	if ((e = journal_ready(ks, s, kv, false, r)) < 0)
		return e;
	if (p->buf_cap < kpart + vpart) {
		uint8_t *nb = malloc(kpart + vpart);
		if (!nb) {
			dataop_res_set(r, -ENOMEM, TQKV_ST_NOMEM, 0);
			return r->res;
		}
		free(p->buf);
		p->buf = nb;
		p->buf_cap = kpart + vpart;
	}
	uint8_t *kd = p->buf, *vd = p->buf + kpart;
	for (uint32_t t = 0; t < n; t++) {
		uint32_t tok = first + t;
		const uint8_t *page = L->pages[tok / g->page_tokens];
		uint32_t slot = tok % g->page_tokens;
		for (uint32_t h = 0; h < g->n_kv_heads; h++) {
			/* pool_copy: the pages may be a GPU's (memcpy on host memory) */
			if ((e = pool_copy(ks->pool, kd + ((size_t)t * g->n_kv_heads + h) * kb,
					   page + tq_page_k_off(g, h, slot), kb, r->msg, sizeof(r->msg))) < 0 ||
			    (e = pool_copy(ks->pool, vd + ((size_t)t * g->n_kv_heads + h) * vb,
					   page + tq_page_v_off(g, h, slot), vb, r->msg, sizeof(r->msg))) < 0) {
				dataop_res_set(r, e, dataop_kernel_status(e), 0);
				return e;
			}
		}
	}
	rec.payload_bytes = (uint32_t)(kpart + vpart);
	e = journal_put(ks, kv, &rec, kd, kpart, vd, vpart, r);
	if (p->buf_cap > ((size_t)1 << 20)) { /* keep at most 1 MiB between appends */
		free(p->buf);
		p->buf = NULL;
		p->buf_cap = 0;
	}
	return e;
}

int kvp_journal_truncate(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t layer, uint64_t pos,
			 struct dataop_res *r)
{
	struct persist_rec rec = { .type = PERSIST_REC_TRUNCATE, .layer = layer,
				   .first = pos > UINT32_MAX ? UINT32_MAX : (uint32_t)pos };
	bool changes = false;
	int e;

	for (uint32_t l = 0; l < kv->n_layers; l++)
		if ((layer == PERSIST_ALL_LAYERS || l == layer) && pos < kv->layer[l].n_tokens)
			changes = true;
	if (!changes)
		return 0;
	if ((e = journal_ready(ks, s, kv, true, r)) < 0) /* before the truncation changes anything */
		return e;
	return journal_put(ks, kv, &rec, NULL, 0, NULL, 0, r);
}

int kvp_journal_xform(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l, struct dataop_res *r)
{
	struct persist_rec rec = { .type = PERSIST_REC_XFORM, .layer = l };
	const tq_xf *xf = kv->layer[l].xf;
	size_t xb = xf ? tq_xf_blob_bytes(xf) : 0;
	uint8_t *blob;
	int e;

	if (!xb) { /* a bug: only a calibrated transform is journaled */
		dataop_res_set(r, -EINVAL, TQKV_ST_INTERNAL, l);
		snprintf(r->msg, sizeof(r->msg), "persistent session: layer %u's transform is not calibrated", l);
		return r->res;
	}
	if ((e = journal_ready(ks, s, kv, false, r)) < 0)
		return e;
	if (!(blob = malloc(xb))) {
		dataop_res_set(r, -ENOMEM, TQKV_ST_NOMEM, 0);
		return r->res;
	}
	tq_xf_blob_write(xf, blob);
	rec.payload_bytes = (uint32_t)xb;
	e = journal_put(ks, kv, &rec, blob, xb, NULL, 0, r);
	free(blob);
	return e;
}

/* ---- the checkpoint thread ------------------------------------------------------------- */
static void checkpoint_due(struct kvstore *ks, struct session_table *st, bool all)
{
	struct kvpersist *kp = ks->persist;
	uint64_t now = mono_ms(), iv = __atomic_load_n(&kp->interval_ms, __ATOMIC_RELAXED);
	uint64_t *ids = NULL;
	size_t n = 0, cap = 0;

	pthread_mutex_lock(&ks->lock);
	for (size_t b = 0; b < N_BUCKETS; b++)
		for (struct kv_sess *kv = ks->bucket[b]; kv; kv = kv->next) {
			struct kvp_sess *p = kv->p;
			if (!p || !__atomic_load_n(&p->dirty, __ATOMIC_RELAXED))
				continue;
			/* joff and last_ckpt_ms move under the session's lock, not
			 * ks->lock: read atomically, a hint for this pass only */
			if (!all && now - __atomic_load_n(&p->last_ckpt_ms, __ATOMIC_RELAXED) < iv &&
			    __atomic_load_n(&p->joff, __ATOMIC_RELAXED) < KVP_JOURNAL_CHECKPOINT)
				continue;
			if (!all && now < __atomic_load_n(&p->retry_ms, __ATOMIC_RELAXED))
				continue; /* failed lately: not yet again */
			if (n == cap) {
				uint64_t *ni = realloc(ids, (cap ? cap * 2 : 16) * sizeof(*ni));
				if (!ni)
					break;
				ids = ni;
				cap = cap ? cap * 2 : 16;
			}
			ids[n++] = kv->id;
		}
	pthread_mutex_unlock(&ks->lock);
	/* A lost discrete GPU refuses every session's checkpoint alike
	 * (dataop_checkpoint: -ENOTRECOVERABLE): one line for them all, and
	 * the files stay as they are (last checkpoint + journal: what the
	 * next start restores). */
	char lost[320];
	size_t n_lost = 0;
	for (size_t i = 0; i < n; i++) {
		struct session *s;
		char why[320];
		if (session_acquire(st, ids[i], 0, &s) < 0)
			continue; /* closed or evicted meanwhile */
		int r = dataop_checkpoint(ks, s, why, sizeof(why));
		if (r == -ENOTRECOVERABLE) {
			if (n_lost++ == 0)
				snprintf(lost, sizeof(lost), "%s", why);
		} else if (r < 0) {
			if (all)
				log_err("session %" PRIu64 ": checkpoint failed: %s (its files stay as of its last "
					"checkpoint and journal record)", ids[i], why);
			else
				log_err("session %" PRIu64 ": checkpoint failed: %s (the journal keeps every "
					"change; retried later, the delay doubling from %" PRIu64 " ms to a minute "
					"while it fails)", ids[i], why, 2 * iv);
		}
		session_release(s);
	}
	if (n_lost)
		log_err("persistent sessions: %zu checkpoint%s not written: %s; their files stay as of their "
			"last checkpoint and journal record", n_lost, n_lost == 1 ? "" : "s", lost);
	free(ids);
}

static void *persist_main(void *arg)
{
	struct kvstore *ks = arg;
	struct kvpersist *kp = ks->persist;

	pthread_mutex_lock(&kp->lock);
	while (!kp->stop) {
		uint64_t iv = __atomic_load_n(&kp->interval_ms, __ATOMIC_RELAXED);
		uint64_t tick = iv < 1000 ? iv : 1000;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += (time_t)(tick / 1000);
		ts.tv_nsec += (long)(tick % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		if (!kp->kick)
			pthread_cond_timedwait(&kp->cond, &kp->lock, &ts);
		if (kp->stop)
			break;
		kp->kick = false;
		pthread_mutex_unlock(&kp->lock);
		checkpoint_due(ks, kp->st, false);
		pthread_mutex_lock(&kp->lock);
	}
	pthread_mutex_unlock(&kp->lock);
	return NULL;
}

int kvstore_persist_open(struct kvstore *ks, const char *spill_dir, uint64_t interval_ms, char *why, size_t whylen)
{
	struct kvpersist *kp;
	int fd;

	if (!ks->spill) {
		snprintf(why, whylen, "persistent sessions need the spill tier");
		return -EINVAL;
	}
	if ((fd = persist_dir_open(spill_dir, why, whylen)) < 0)
		return fd;
	if (!(kp = calloc(1, sizeof(*kp)))) {
		close(fd);
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	kp->dirfd = fd;
	kp->interval_ms = interval_ms ? interval_ms : 5000;
	pthread_mutex_init(&kp->lock, NULL);
	{
		pthread_condattr_t ca;
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&kp->cond, &ca);
		pthread_condattr_destroy(&ca);
	}
	ks->persist = kp;
	return 0;
}

void kvstore_persist_set_interval(struct kvstore *ks, uint64_t interval_ms)
{
	if (ks->persist && interval_ms)
		__atomic_store_n(&ks->persist->interval_ms, interval_ms, __ATOMIC_RELAXED);
}

int kvstore_persist_start(struct kvstore *ks, struct session_table *st)
{
	struct kvpersist *kp = ks->persist;
	int r;

	if (!kp)
		return 0;
	kp->st = st;
	if ((r = pthread_create(&kp->thread, NULL, persist_main, ks)) != 0)
		return -r;
	kp->running = true;
	return 0;
}

void kvstore_persist_stop(struct kvstore *ks, struct session_table *st)
{
	struct kvpersist *kp = ks->persist;

	if (!kp)
		return;
	if (kp->running) {
		pthread_mutex_lock(&kp->lock);
		kp->stop = true;
		pthread_cond_signal(&kp->cond);
		pthread_mutex_unlock(&kp->lock);
		pthread_join(kp->thread, NULL);
		kp->running = false;
	}
	if (st) {
		uint64_t before = __atomic_load_n(&kp->checkpoints, __ATOMIC_RELAXED);
		checkpoint_due(ks, st, true);
		uint64_t done = __atomic_load_n(&kp->checkpoints, __ATOMIC_RELAXED) - before;
		if (done)
			log_info("persistent sessions: %" PRIu64 " checkpointed at shutdown", done);
	}
	kp->shutdown = true;
}

void kvstore_persist_close(struct kvstore *ks)
{
	struct kvpersist *kp = ks ? ks->persist : NULL;

	if (!kp)
		return;
	kvstore_persist_stop(ks, NULL);
	close(kp->dirfd);
	pthread_mutex_destroy(&kp->lock);
	pthread_cond_destroy(&kp->cond);
	free(kp);
	ks->persist = NULL;
}

void kvstore_persist_stats(struct kvstore *ks, struct kvpersist_stats *out)
{
	struct kvpersist *kp = ks->persist;

	memset(out, 0, sizeof(*out));
	if (!kp)
		return;
	pthread_mutex_lock(&ks->lock);
	for (size_t b = 0; b < N_BUCKETS; b++)
		for (struct kv_sess *kv = ks->bucket[b]; kv; kv = kv->next)
			out->sessions += kv->p != NULL;
	pthread_mutex_unlock(&ks->lock);
	out->checkpoints = __atomic_load_n(&kp->checkpoints, __ATOMIC_RELAXED);
	out->checkpoint_failures = __atomic_load_n(&kp->checkpoint_failures, __ATOMIC_RELAXED);
	out->journal_records = __atomic_load_n(&kp->journal_records, __ATOMIC_RELAXED);
	out->journal_bytes = __atomic_load_n(&kp->journal_bytes, __ATOMIC_RELAXED);
	out->restored = kp->restored;
	out->dropped = kp->dropped;
}

/* ---- recovery ------------------------------------------------------------------------ */
struct replay {
	struct kvstore *ks;
	struct session *s;
	struct kv_sess *kv;
	char why[320];
	/* layers whose tail page, which their next journaled append needed,
	 * was lost (failed its checks: damaged on disk): their appends are
	 * dropped until a journaled truncation cuts the lost page off; the
	 * other layers replay on */
	uint64_t damaged[SESSION_MAX_LAYERS / 64];
	uint32_t n_damaged, skipped;   /* layers, records dropped */
};

static bool is_damaged(const struct replay *rp, uint32_t l)
{
	return rp->damaged[l / 64] >> (l % 64) & 1;
}

static void set_damaged(struct replay *rp, uint32_t l, bool on)
{
	if (on == is_damaged(rp, l))
		return;
	rp->damaged[l / 64] ^= 1ull << (l % 64);
	rp->n_damaged += on ? 1 : -1;
}

/* Read page i of layer l back (only it: a journal appends to the tail). */
static int restore_page(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l, uint32_t i,
			char *why, size_t whylen)
{
	struct kv_layer *L = &kv->layer[l];
	struct kv_page_meta *pm = &L->meta[i];
	struct spill_page_hdr h;
	uint8_t *pg;
	int r;

	if (pm->state == PG_RESIDENT)
		return 0;
	if (pm->state != PG_SPILLED) {
		snprintf(why, whylen, "layer %u page %u, which the journal appends to, was lost", l, i);
		return -EBADMSG;
	}
	if ((r = session_restore_move(s, ks->page_bytes)) < 0) {
		snprintf(why, whylen, "layer %u page %u: the tenant's limit leaves no room to read it back", l, i);
		return r;
	}
	if ((r = pool_pages_alloc(ks->pool, 1, &pg)) < 0) {
		session_spill_move(s, ks->page_bytes);
		snprintf(why, whylen, "layer %u page %u: the pool is full", l, i);
		return r;
	}
	h = dataop_hdr_of(kv, l, i);
	if ((r = spill_read_sync(ks->spill, pm->slot, &h, pg, why, whylen)) < 0) {
		pool_pages_free(ks->pool, &pg, 1);
		session_spill_move(s, ks->page_bytes);
		if (r == -EBADMSG) { /* damaged: lost, as a read at run time finds it (dataop.c) */
			dataop_slot_release(ks, kv, pm->slot);
			session_unspill(s, ks->page_bytes);
			pm->state = PG_LOST;
			kv->n_spilled--;
			log_err("session %" PRIu64 " layer %u page %u lost: %s", kv->id, l, i, why);
		}
		return r;
	}
	L->pages[i] = pg;
	pm->state = PG_RESIDENT;
	pm->clean = 1;
	L->n_out--;
	kv->n_spilled--;
	return 0;
}

/* Layer l's transform from stored statistics (its xf made if missing, as
 * the layer's codecs would make it): 0, or -ENOMEM / -EBADMSG with why. */
static uint32_t xf_faults; /* atomic: kvstore_fault_xf_new */

void kvstore_fault_xf_new(uint32_t n)
{
	__atomic_store_n(&xf_faults, n, __ATOMIC_RELAXED);
}

/* A layer's transform statistics from their blob: 0, -ENOMEM (nothing
 * said about the blob), or another negative errno: the blob is refused. */
static int xf_load(struct kv_sess *kv, uint32_t l, const uint8_t *blob, size_t len, char *why, size_t whylen)
{
	struct kv_layer *L = &kv->layer[l];
	tq_error te;
	int r;

	/* the K codec's unshrink factor comes when dataop makes the codecs */
	uint32_t f = __atomic_load_n(&xf_faults, __ATOMIC_RELAXED);
	if (!L->xf && f && __atomic_compare_exchange_n(&xf_faults, &f, f - 1, false, __ATOMIC_RELAXED,
						       __ATOMIC_RELAXED)) {
		snprintf(why, whylen, "layer %u transform: out of memory (injected)", l);
		return -ENOMEM;
	}
	if (!L->xf && (r = tq_xf_new(&L->xf, kv->xform, kv->geom.n_kv_heads, kv->n_q_heads, kv->dim, L->kc,
				     &te)) < 0) {
		snprintf(why, whylen, "layer %u transform: %s", l, te.msg);
		return r;
	}
	if ((r = tq_xf_blob_read(L->xf, blob, len, &te)) < 0)
		snprintf(why, whylen, "layer %u: %s", l, te.msg);
	return r;
}

static int replay_rec(void *ctx, const struct persist_rec *rec, const uint8_t *payload)
{
	struct replay *rp = ctx;
	struct kvstore *ks = rp->ks;
	struct kv_sess *kv = rp->kv;
	const struct tq_page_geom *g = &kv->geom;
	struct dataop_res r;

	memset(&r, 0, sizeof(r));
	if (rec->type == PERSIST_REC_XFORM) {
		/* a calibration: of an empty layer of a session with transforms */
		if (!kv->xform || rec->layer >= kv->n_layers || kv->layer[rec->layer].n_tokens || rec->first ||
		    rec->n || !rec->payload_bytes ||
		    rec->payload_bytes > persist_xf_max(kv->geom.n_kv_heads, kv->dim)) {
			snprintf(rp->why, sizeof(rp->why), "transform record (layer %u, %u bytes) does not follow the "
				 "session's state (transform mode 0x%x)", rec->layer, rec->payload_bytes, kv->xform);
			return -EBADMSG;
		}
		/* out of memory says nothing of the record: the session is kept
		 * for the next start with its files (-EIO), not cut short here */
		int xr = xf_load(kv, rec->layer, payload, rec->payload_bytes, rp->why, sizeof(rp->why));
		return xr == -ENOMEM ? -EIO : xr < 0 ? -EBADMSG : 0;
	}
	if (rec->type == PERSIST_REC_TRUNCATE) {
		if (rec->layer != PERSIST_ALL_LAYERS && rec->layer >= kv->n_layers) {
			snprintf(rp->why, sizeof(rp->why), "truncation of layer %u (of %u)", rec->layer, kv->n_layers);
			return -EBADMSG;
		}
		for (uint32_t l = 0; l < kv->n_layers; l++)
			if (rec->layer == PERSIST_ALL_LAYERS || l == rec->layer) {
				/* a damaged layer cut back to the start of its lost
				 * tail page or before is where the client's is (which
				 * never held fewer tokens): its appends apply again */
				const uint32_t pt = kv->geom.page_tokens;
				if (rec->first <= kv->layer[l].n_tokens / pt * pt)
					set_damaged(rp, l, false);
				dataop_truncate_layer(ks, rp->s, kv, l, rec->first);
			}
		return 0;
	}
	if (rec->type == PERSIST_REC_APPEND && rec->layer < kv->n_layers && is_damaged(rp, rec->layer)) {
		rp->skipped++;
		return 0;
	}
	if (rec->type != PERSIST_REC_APPEND || rec->layer >= kv->n_layers || rec->n == 0 ||
	    rec->first != kv->layer[rec->layer].n_tokens ||
	    (uint64_t)rec->payload_bytes != (uint64_t)rec->n * g->n_kv_heads * (g->k_block_bytes + g->v_block_bytes)) {
		snprintf(rp->why, sizeof(rp->why), "record (type %u, layer %u, tokens %u..+%u, %u bytes) does not "
			 "follow the session's state", rec->type, rec->layer, rec->first, rec->n, rec->payload_bytes);
		return -EBADMSG;
	}
	struct kv_layer *L = &kv->layer[rec->layer];
	if (kv->xform && !(L->xf && tq_xf_calibrated(L->xf))) {
		/* the tokens were transformed by statistics the journal lacks */
		snprintf(rp->why, sizeof(rp->why), "append to layer %u at token %u, whose transform has no statistics",
			 rec->layer, rec->first);
		return -EBADMSG;
	}
	uint32_t added, tail = L->n_tokens / g->page_tokens;
	int rr;
	if (L->n_tokens % g->page_tokens &&
	    (rr = restore_page(ks, rp->s, kv, rec->layer, tail, rp->why, sizeof(rp->why))) < 0) {
		if (rr != -EBADMSG)
			return -EIO; /* room or I/O: the journal is not at fault */
		/* the tail page is lost: this layer's appends cannot apply
		 * (DATA_LOSS for it, as for any lost page); the others can */
		log_warning("session %" PRIu64 " layer %u: %s; its journaled appends from token %u on are dropped, "
			    "the other layers' replayed", kv->id, rec->layer, rp->why, rec->first);
		rp->why[0] = 0;
		set_damaged(rp, rec->layer, true);
		rp->skipped++;
		return 0;
	}
	if (dataop_layer_grow(ks, rp->s, kv, rec->layer, (uint64_t)L->n_tokens + rec->n, &added, &r) < 0) {
		snprintf(rp->why, sizeof(rp->why), "applying an append to layer %u: %s%s%s", rec->layer,
			 tqkv_status_str(r.status), r.msg[0] ? ": " : "", r.msg);
		return -EIO;
	}
	if (tail < L->n_pages && L->meta[tail].clean) {
		dataop_slot_release(ks, kv, L->meta[tail].slot);
		L->meta[tail].clean = 0;
	}
	const uint8_t *kd = payload, *vd = payload + (size_t)rec->n * g->n_kv_heads * g->k_block_bytes;
	for (uint32_t t = 0; t < rec->n; t++) {
		uint32_t tok = rec->first + t;
		uint8_t *page = L->pages[tok / g->page_tokens];
		uint32_t slot = tok % g->page_tokens;
		for (uint32_t h = 0; h < g->n_kv_heads; h++) {
			if (pool_copy(ks->pool, page + tq_page_k_off(g, h, slot),
				      kd + ((size_t)t * g->n_kv_heads + h) * g->k_block_bytes, g->k_block_bytes,
				      rp->why, sizeof(rp->why)) < 0 ||
			    pool_copy(ks->pool, page + tq_page_v_off(g, h, slot),
				      vd + ((size_t)t * g->n_kv_heads + h) * g->v_block_bytes, g->v_block_bytes,
				      rp->why, sizeof(rp->why)) < 0) {
				dataop_layer_shrink(ks, rp->s, L, added);
				return -EIO;
			}
		}
	}
	L->n_pages += added;
	L->n_tokens += rec->n;
	__atomic_add_fetch(&kv->n_pages, added, __ATOMIC_RELAXED);
	return 0;
}

/* Why m's transform statistics do not parse (for its geometry), or NULL. */
static const char *xf_misfit(const struct persist_manifest *m, char *buf, size_t n)
{
	const struct session_geom *g = &m->geom;
	const char *bad = NULL;
	tq_xf *xf = NULL;
	tq_error te;

	if (!g->kv_xform)
		return NULL; /* decoding allowed no statistics */
	if (tq_xf_new(&xf, g->kv_xform, g->n_kv_heads, g->n_q_heads, g->head_dim, NULL, &te) < 0) {
		snprintf(buf, n, "transform: %s", te.msg);
		return buf;
	}
	for (uint32_t l = 0; l < g->n_layers && !bad; l++)
		if (m->layers[l].xf_bytes && tq_xf_blob_read(xf, m->layers[l].xf, m->layers[l].xf_bytes, &te) < 0) {
			snprintf(buf, n, "layer %u: %s", l, te.msg);
			bad = buf;
		}
	tq_xf_free(xf);
	return bad;
}

/* How many tokens the session's pages hold: a manifest of format 3 says;
 * formats 1 and 2 (page_tokens 0) were written before GPU pools cut their
 * pages to a multiple of TQC_PAGE_TOKENS_ALIGN, when every pool's page held
 * all that fit.  The session keeps its number whatever pool reopens it
 * (dataop_kv_get_paged): its tokens are where they were written.  -1 when
 * they would not fit a page of this pool. */
static int manifest_page_tokens(const struct kvstore *ks, const struct persist_manifest *m)
{
	const int pt = m->page_tokens ? (int)m->page_tokens : dataop_page_tokens(m->page_bytes, 0, &m->geom);
	const int most = dataop_page_tokens(ks->page_bytes, 0, &m->geom);

	return pt > 0 && most > 0 && pt <= most ? pt : -1;
}

/* Why a manifest cannot be used here, or NULL. */
static const char *manifest_misfit(struct kvstore *ks, const struct persist_manifest *m, uint64_t slot_bytes,
				   struct tenant_table *tt, char *buf, size_t n)
{
	struct tq_page_geom pg;
	uint64_t bpt;
	char why[256];
	int mpt;

	if (m->layout_id != TQ_PAGE_LAYOUT_ID)
		snprintf(buf, n, "page layout %u, this tqkvd uses %u", m->layout_id, TQ_PAGE_LAYOUT_ID);
	else if (m->page_bytes != ks->page_bytes || m->slot_bytes != slot_bytes)
		snprintf(buf, n, "written with pool.page_bytes %u (slots of %" PRIu64 " bytes), the pool now has "
			 "pages of %u bytes", m->page_bytes, m->slot_bytes, ks->page_bytes);
	else if (!tenant_find(tt, m->tenant))
		snprintf(buf, n, "tenant '%s' is no longer configured", m->tenant);
	else if (session_geom_check(&m->geom, &bpt, why, sizeof(why)) < 0)
		snprintf(buf, n, "geometry: %s", why);
	else if (dataop_page_tokens(ks->page_bytes, 0, &m->geom) < 0)
		snprintf(buf, n, "one token does not fit a page");
	else if ((mpt = manifest_page_tokens(ks, m)) < 0)
		snprintf(buf, n, "its pages hold %u tokens, more than a page of %u bytes holds", m->page_tokens,
			 ks->page_bytes);
	else {
		pg.page_tokens = (uint32_t)mpt;
		for (uint32_t l = 0; l < m->geom.n_layers; l++) {
			const struct persist_layer *L = &m->layers[l];
			uint64_t want = ((uint64_t)L->n_tokens + pg.page_tokens - 1) / pg.page_tokens;
			if (L->n_tokens > m->geom.max_tokens || L->n_tokens > INT32_MAX || L->n_pages != want) {
				snprintf(buf, n, "layer %u: %u tokens in %u pages (expected %" PRIu64 ", max_tokens %"
					 PRIu64 ")", l, L->n_tokens, L->n_pages, want, m->geom.max_tokens);
				return buf;
			}
			if (m->geom.kv_xform && L->n_tokens && !L->xf_bytes) {
				snprintf(buf, n, "layer %u holds %u tokens but not the statistics of their transform", l,
					 L->n_tokens);
				return buf;
			}
		}
		return xf_misfit(m, buf, n);
	}
	return buf;
}

/* Give back the slots m names, in page order, before layer l's page i. */
static void release_slots(struct kvstore *ks, const struct persist_manifest *m, uint32_t l_end, uint32_t i_end)
{
	for (uint32_t l = 0; l < m->geom.n_layers && l <= l_end; l++)
		for (uint32_t i = 0; i < (l == l_end ? i_end : m->layers[l].n_pages); i++)
			if (m->layers[l].pages[i].slot != PERSIST_SLOT_LOST)
				spill_slot_free(ks->spill, m->layers[l].pages[i].slot);
}

/* Who claimed which slot at recovery, built at the first conflict (none
 * at most starts): open addressing on the slot, a page by manifest index
 * (into ms[]), layer and page.  An entry may be stale (its manifest was
 * dropped, or its page lost since): owner_of checks it against ms[]. */
struct owner {
	uint64_t slot; /* UINT64_MAX: empty */
	uint32_t m, l, i;
};
struct owners {
	struct owner *v;
	size_t cap, n;
};

static size_t owner_hash(uint64_t slot, size_t cap)
{
	return (size_t)((slot * 0x9e3779b97f4a7c15ull) >> 17) & (cap - 1);
}

static int owners_put(struct owners *o, uint64_t slot, uint32_t m, uint32_t l, uint32_t i)
{
	if (2 * (o->n + 1) > o->cap) { /* at most half full; doubling from 2 (the tests grow it) */
		size_t cap = o->cap ? 2 * o->cap : 2;
		struct owner *v = malloc(cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		for (size_t k = 0; k < cap; k++)
			v[k].slot = UINT64_MAX;
		for (size_t k = 0; k < o->cap; k++) {
			if (o->v[k].slot == UINT64_MAX)
				continue;
			size_t h = owner_hash(o->v[k].slot, cap);
			while (v[h].slot != UINT64_MAX)
				h = (h + 1) & (cap - 1);
			v[h] = o->v[k];
		}
		free(o->v);
		o->v = v;
		o->cap = cap;
	}
	size_t h = owner_hash(slot, o->cap);
	while (o->v[h].slot != UINT64_MAX && o->v[h].slot != slot)
		h = (h + 1) & (o->cap - 1);
	if (o->v[h].slot == UINT64_MAX)
		o->n++;
	o->v[h] = (struct owner){ slot, m, l, i };
	return 0;
}

/* The page that holds slot's claim (a manifest before `cur` that holds
 * its claims, or cur's own), or NULL. */
static struct persist_page *owner_of(const struct owners *o, uint64_t slot, struct persist_manifest *ms,
				     const int *ok, size_t cur, size_t *mj, uint32_t *l, uint32_t *i)
{
	size_t h = owner_hash(slot, o->cap);
	while (o->v[h].slot != UINT64_MAX && o->v[h].slot != slot)
		h = (h + 1) & (o->cap - 1);
	const struct owner *e = &o->v[h];
	if (e->slot != slot || e->m > cur || (e->m < cur && ok[e->m] != 0))
		return NULL;
	struct persist_manifest *m = &ms[e->m];
	if (e->l >= m->geom.n_layers || e->i >= m->layers[e->l].n_pages || m->layers[e->l].pages[e->i].slot != slot)
		return NULL;
	*mj = e->m, *l = e->l, *i = e->i;
	return &m->layers[e->l].pages[e->i];
}

/* Every claim so far into the table: the manifests before cur that hold
 * theirs, and cur's pages before layer l0's page i0. */
static int owners_build(struct owners *o, struct persist_manifest *ms, const int *ok, size_t cur, uint32_t l0,
			uint32_t i0)
{
	for (size_t j = 0; j <= cur; j++) {
		const struct persist_manifest *m = &ms[j];
		if (j < cur && ok[j] != 0)
			continue;
		for (uint32_t l = 0; l < m->geom.n_layers; l++)
			for (uint32_t i = 0; i < m->layers[l].n_pages; i++) {
				if (j == cur && (l > l0 || (l == l0 && i >= i0)))
					return 0;
				uint64_t slot = m->layers[l].pages[i].slot;
				if (slot != PERSIST_SLOT_LOST && owners_put(o, slot, (uint32_t)j, l, i) < 0)
					return -ENOMEM;
			}
	}
	return 0;
}

/* Page i of layer l of ms[cur] names a slot an earlier page claimed (one
 * of its own, or of an earlier manifest that holds its claims).  The
 * slot's header says whose page it holds (session, layer, page,
 * generation): the other page is lost (DATA_LOSS when read, as a page that
 * fails its checks), and its session comes back without it rather than
 * being dropped whole.  (A session set aside, ID.tqm.dropped, and renamed
 * back names slots other sessions may have taken since: it is the older,
 * claims first, and would have dropped the newer.)  0, or a negative errno
 * that says nothing about the files (memory, a failed read: passing()),
 * with nothing decided. */
static int slot_conflict(struct kvstore *ks, struct owners *own, struct persist_manifest *ms, const int *ok,
			 size_t cur, uint32_t l, uint32_t i)
{
	struct persist_manifest *m = &ms[cur];
	const uint64_t slot = m->layers[l].pages[i].slot;
	size_t oj = 0;
	uint32_t ol = 0, oi = 0;
	int r;

	if (!own->v && (r = owners_build(own, ms, ok, cur, l, i)) < 0)
		return r;
	struct persist_page *other = owner_of(own, slot, ms, ok, cur, &oj, &ol, &oi);
	struct spill_page_hdr h;
	const int hr = spill_read_hdr(ks->spill, slot, &h);
	if (hr < 0 && hr != -EBADMSG)
		return hr; /* the header says nothing yet: decide nothing */
	const bool mine = hr == 0 && h.session_id == m->id && h.layer == l && h.page_index == i &&
			  h.generation == m->layers[l].pages[i].gen;
	if (mine && other) {
		if ((r = owners_put(own, slot, (uint32_t)cur, l, i)) < 0)
			return r;
		other->slot = PERSIST_SLOT_LOST; /* the claim stays: now for m */
		ms[oj].conflicts = true;
		log_warning("persistent sessions %" PRIu64 " (layer %u page %u) and %" PRIu64 " (layer %u page %u) "
			    "name spill slot %" PRIu64 ", which holds the latter's page: the former's is lost "
			    "(DATA_LOSS on its layer)", ms[oj].id, ol, oi, m->id, l, i, slot);
		return 0;
	}
	m->layers[l].pages[i].slot = PERSIST_SLOT_LOST;
	m->conflicts = true;
	log_warning("persistent session %" PRIu64 " layer %u page %u names spill slot %" PRIu64 ", which "
		    "another page names too and %s: that page is lost (DATA_LOSS on its layer)", m->id, l, i, slot,
		    hr < 0 ? "whose header is not a spilled page's" : "holds another page");
	return 0;
}

/* Claim every slot ms[cur] names, resolving a slot an earlier page
 * claimed too (slot_conflict): 0, or a negative errno with the reason in
 * buf (nothing claimed): a slot beyond the store, or a conflict that
 * could not be decided (passing()). */
static int claim_slots(struct kvstore *ks, struct owners *own, struct persist_manifest *ms, const int *ok,
		       size_t cur, char *buf, size_t n)
{
	struct persist_manifest *m = &ms[cur];

	for (uint32_t l = 0; l < m->geom.n_layers; l++)
		for (uint32_t i = 0; i < m->layers[l].n_pages; i++) {
			uint64_t slot = m->layers[l].pages[i].slot;
			int r;
			if (slot == PERSIST_SLOT_LOST)
				continue;
			if ((r = spill_slot_claim(ks->spill, slot)) == 0) {
				if (own->v && (r = owners_put(own, slot, (uint32_t)cur, l, i)) < 0) {
					spill_slot_free(ks->spill, slot);
					snprintf(buf, n, "out of memory");
					release_slots(ks, m, l, i);
					return r;
				}
			} else if (r == -EEXIST) {
				if ((r = slot_conflict(ks, own, ms, ok, cur, l, i)) < 0) {
					snprintf(buf, n, "layer %u page %u names spill slot %" PRIu64 ", which another "
						 "page names too, and its header could not be read: %s", l, i, slot,
						 strerror(-r));
					release_slots(ks, m, l, i);
					return r;
				}
			} else {
				snprintf(buf, n, "layer %u page %u names spill slot %" PRIu64 ", %s", l, i, slot,
					 r == -ERANGE ? "beyond the spill file (pool.spill_bytes shrank?)"
						      : strerror(-r));
				release_slots(ks, m, l, i); /* what was claimed */
				return r;
			}
		}
	return 0;
}

/* Page tables of kv from m: every page spilled at its slot (or lost). */
static int build_tables(struct kvstore *ks, struct session *s, struct kv_sess *kv, const struct persist_manifest *m)
{
	uint64_t spilled = 0;

	for (uint32_t l = 0; l < kv->n_layers; l++) {
		const struct persist_layer *pl = &m->layers[l];
		struct kv_layer *L = &kv->layer[l];
		uint32_t cap = 8;
		while (cap < pl->n_pages)
			cap *= 2;
		if (!(L->pages = calloc(cap, sizeof(*L->pages))) || !(L->meta = calloc(cap, sizeof(*L->meta))))
			return -ENOMEM;
		L->cap = cap;
		for (uint32_t i = 0; i < pl->n_pages; i++) {
			struct kv_page_meta *pm = &L->meta[i];
			if (pl->pages[i].slot == PERSIST_SLOT_LOST) {
				pm->state = PG_LOST;
			} else {
				pm->state = PG_SPILLED;
				pm->slot = pl->pages[i].slot;
				pm->gen = pl->pages[i].gen;
				spilled++;
			}
			L->n_out++;
		}
		L->n_pages = pl->n_pages;
		L->n_tokens = pl->n_tokens;
		kv->n_pages += pl->n_pages;
		/* checked by manifest_misfit: only memory can fail here */
		char why[160];
		if (pl->xf_bytes && xf_load(kv, l, pl->xf, pl->xf_bytes, why, sizeof(why)) < 0)
			return -ENOMEM;
	}
	kv->n_spilled = spilled;
	kv->gen_next = m->gen_next;
	kv->p->epoch = m->epoch;
	session_add_spilled(s, spilled * ks->page_bytes);
	return 0;
}

/* A manifest set aside: why, in the log. */
static void recover_drop(struct kvstore *ks, uint64_t id, const struct persist_manifest *m, const char *why, bool keep)
{
	if (!keep) {
		persist_set_aside(ks->persist->dirfd, id);
		log_warning("persistent session %" PRIu64 "%s%s%s dropped: %s (its manifest and journal kept as "
			    "%s/%" PRIu64 ".tqm.dropped and .tqj.dropped: renamed back while tqkvd is stopped, on a "
			    "configuration that fits, the session comes back)", id, m->tenant[0] ? " (tenant " : "",
			    m->tenant, m->tenant[0] ? ")" : "", why, PERSIST_SUBDIR, id);
	} else {
		log_err("persistent session %" PRIu64 "%s%s%s not served in this run: %s (its files and spill slots "
			"are kept as they are: the next start tries again)", id, m->tenant[0] ? " (tenant " : "",
			m->tenant, m->tenant[0] ? ")" : "", why);
	}
}

/* A session recovery cannot take back now (out of memory, the tier, the
 * tenant's limit), though nothing is wrong with its files: out of the
 * table again with its files untouched and its slots still claimed
 * (kvp_sess_free keeps them while shutdown is set). */
static void recover_keep(struct kvstore *ks, struct session_table *st, struct session *s, uint64_t id,
			 const struct persist_manifest *m, const char *why)
{
	struct kvpersist *kp = ks->persist;

	session_release(s);
	kp->shutdown = true;
	session_close(st, id, NULL);
	kp->shutdown = false;
	recover_drop(ks, id, m, why, true);
}

/* The pages recovery found lost (their copies failed their checks). */
static uint64_t lost_pages(const struct kv_sess *kv)
{
	uint64_t n = 0;

	for (uint32_t l = 0; l < kv->n_layers; l++)
		for (uint32_t i = 0; i < kv->layer[l].n_pages; i++)
			n += kv->layer[l].meta[i].state == PG_LOST;
	return n;
}

/* A failure that says nothing about the files (memory, descriptors, a
 * read error): recovery keeps them for the next start instead of setting
 * the session aside and deleting its journal. */
static bool passing(int e)
{
	return e == -ENOMEM || e == -EIO || e == -EMFILE || e == -ENFILE || e == -EAGAIN || e == -EINTR ||
	       e == -ENOBUFS;
}

/* Recovery's first pass, one manifest: read, checked, its slots claimed.
 * 0 (m read and kept), or dropped (-1: m freed, the log says why), or -3:
 * it could not be read for a reason that says nothing about it (memory,
 * descriptors, I/O): the start stops.  Every
 * manifest's slots are claimed before any session is replayed: a replay's
 * checkpoint and spill take free slots, which must not be slots a manifest
 * not yet read names. */
static int recover_claim(struct kvstore *ks, struct tenant_table *tt, struct owners *own, uint64_t id,
			 uint64_t slot_bytes, uint64_t *max_id, struct persist_manifest *ms, const int *ok, size_t i)
{
	struct persist_manifest *m = &ms[i];
	char why[512] = "";

	memset(m, 0, sizeof(*m));
	if (id > *max_id)
		*max_id = id;
	int r = persist_manifest_read(ks->persist->dirfd, id, m, why, sizeof(why));
	if (r < 0 && (passing(r) || r == -EPROTO)) {
		/* nothing known to be wrong with it (or another tqkvd's format:
		 * a downgrade, say), but the slots it names are not known: a run
		 * without it would give them to other sessions (and the next
		 * start, or the upgrade back, would lose it).  The start stops
		 * with the reason. */
		log_err("persistent session %" PRIu64 ": %s; tqkvd does not start without it (its spill slots "
			"are not known): %smove %s/%" PRIu64 ".tqm away to drop that session", id, why,
			r == -EPROTO ? "run a tqkvd that reads it, or " : "", PERSIST_SUBDIR, id);
		persist_manifest_free(m);
		return -3;
	}
	if (r < 0 || manifest_misfit(ks, m, slot_bytes, tt, why, sizeof(why)) ||
	    (r = claim_slots(ks, own, ms, ok, i, why, sizeof(why))) < 0) {
		if (r < 0 && passing(r)) { /* a conflict not decided: as an unread manifest */
			log_err("persistent session %" PRIu64 ": %s; tqkvd does not start without knowing whose "
				"page that slot holds", id, why);
			persist_manifest_free(m);
			return -3;
		}
		recover_drop(ks, id, m, why, false);
		persist_manifest_free(m);
		return -1;
	}
	return 0;
}

/* Recovery's second pass, one manifest whose slots are claimed: the
 * session back in the table (its journal replayed), or dropped (its slots
 * given back), or kept for the next start (files and slots as they are).
 * Frees m.  1 restored, 0 dropped, -1 kept. */
static int recover_adopt(struct kvstore *ks, struct session_table *st, struct tenant_table *tt, uint64_t id,
			 struct persist_manifest *m)
{
	struct kvpersist *kp = ks->persist;
	struct session *s = NULL;
	struct kv_sess *kv;
	struct replay rp = { .ks = ks };
	char why[512] = "", jwhy[320] = "";
	uint32_t n_rec = 0;
	uint64_t spilled;
	int r;

	r = session_adopt(st, tenant_find(tt, m->tenant), m->name, (uid_t)m->owner_uid, &m->geom, m->seed,
			  SESSION_PERSISTENT, m->id, m->created_ms, session_clock_ms(), why, sizeof(why));
	if (r == -ENOMEM || r == -EEXIST) {
		/* out of memory, or its name (or id) taken by a session restored
		 * before it (a session kept in a run that did not serve it, whose
		 * name a new one took meanwhile): nothing is wrong with its
		 * files, which stay as they are, slots claimed, for a later start */
		if (!why[0])
			snprintf(why, sizeof(why), "out of memory");
		recover_drop(ks, id, m, why, true);
		persist_manifest_free(m);
		return -1;
	}
	if (r == 0 && (session_acquire(st, id, 0, &s) < 0 ||
		       (r = dataop_kv_get_paged(ks, s, (uint32_t)manifest_page_tokens(ks, m), &kv)) < 0 || !kv->p)) {
		if (s && passing(r)) {
			recover_keep(ks, st, s, id, m, "out of memory");
			persist_manifest_free(m);
			return -1;
		}
		r = r < 0 ? r : -EPROTO;
	}
	if (r < 0) {
		if (!why[0])
			snprintf(why, sizeof(why), "cannot re-create the session: %s", strerror(-r));
		release_slots(ks, m, UINT32_MAX, 0);
		if (s) {
			session_release(s);
			session_close(st, id, NULL);
		}
		recover_drop(ks, id, m, why, false);
		persist_manifest_free(m);
		return 0;
	}
	const uint32_t align = pool_page_tokens_align(ks->pool);
	if (align && kv->geom.page_tokens % align)
		log_warning("persistent session %" PRIu64 ": its pages hold %u tokens (written by a host pool, or "
			    "before GPU pools cut pages to a multiple of %u): its attention runs on the GPU's general "
			    "kernel, several times slower", id, kv->geom.page_tokens, align);
	pthread_mutex_lock(&kv->lock);
	if ((r = build_tables(ks, s, kv, m)) < 0) {
		pthread_mutex_unlock(&kv->lock);
		recover_keep(ks, st, s, id, m, "out of memory");
		persist_manifest_free(m);
		return -1;
	}
	rp.s = s;
	rp.kv = kv;
	r = persist_journal_replay(kp->dirfd, id, id, m->epoch, replay_rec, &rp, &n_rec, jwhy, sizeof(jwhy));
	if (r < 0 && r != -ENOENT && r != -EBADMSG) {
		/* not a damaged record: the journal could not be read, or a
		 * record not applied for want of memory, pool pages, the
		 * tenant's room or a good read — a checkpoint or a journal reset
		 * now would lose appends the client was told had succeeded */
		snprintf(why, sizeof(why), "its journal could not be replayed past record %u: %s", n_rec,
			 rp.why[0] ? rp.why : jwhy);
		pthread_mutex_unlock(&kv->lock);
		recover_keep(ks, st, s, id, m, why);
		persist_manifest_free(m);
		return -1;
	}
	if (r > 0 || (r < 0 && r != -ENOENT))
		log_warning("session %" PRIu64 ": journal replay stopped after %u record(s): %s; the changes after "
			    "it are dropped", id, n_rec, rp.why[0] ? rp.why : jwhy);
	else if (jwhy[0] && n_rec)
		log_info("session %" PRIu64 ": journal: %u record(s) replayed%s; then %s", id, n_rec - rp.skipped,
			 rp.skipped ? " (and the dropped ones below)" : "", jwhy);
	if (rp.skipped)
		log_warning("session %" PRIu64 ": %u journal record(s) dropped: they appended to a layer whose tail "
			    "page was lost; %u layer(s) end with it (DATA_LOSS there)", id, rp.skipped, rp.n_damaged);
	/* An empty layer is uncalibrated, as a truncation to 0 leaves it (a
	 * calibration whose append never completed counts for nothing). */
	for (uint32_t l = 0; l < kv->n_layers; l++)
		if (!kv->layer[l].n_tokens && kv->layer[l].xf)
			tq_xf_reset(kv->layer[l].xf);
	dataop_update_tokens(s, kv);
	/* replayed records, or pages lost to another's claim on their slot
	 * (the manifest on disk still names it): a checkpoint now */
	if (n_rec || m->conflicts) {
		uint64_t out;
		__atomic_store_n(&kv->p->dirty, true, __ATOMIC_RELAXED);
		if (checkpoint_or_count(ks, s, kv, why, sizeof(why)) < 0)
			log_err("session %" PRIu64 ": checkpoint after replay failed: %s%s", id, why,
				kv->p->jfd >= 0 ? "" : " (the journal is kept)");
		else if (dataop_spill_locked(ks, s, kv, UINT64_MAX, &out, why, sizeof(why)) < 0)
			log_warning("session %" PRIu64 ": spilling it after replay: %s (its pages stay resident)", id,
				    why);
	} else {
		kv->p->jfd = persist_journal_reset(kp->dirfd, id, kv->p->epoch, jwhy, sizeof(jwhy));
		__atomic_store_n(&kv->p->joff, PERSIST_JNL_HDR, __ATOMIC_RELAXED);
		if (kv->p->jfd < 0)
			log_err("session %" PRIu64 ": journal: %s (the first append checkpoints first)", id, jwhy);
	}
	spilled = __atomic_load_n(&kv->n_spilled, __ATOMIC_RELAXED);
	const uint64_t lost = lost_pages(kv);
	char lbuf[48] = "";
	if (lost)
		snprintf(lbuf, sizeof(lbuf), ", %" PRIu64 " page(s) lost", lost);
	log_info("session %" PRIu64 " '%s' (tenant %s, uid %u) restored from disk: %" PRIu64 " tokens, %" PRIu64
		 " page(s) spilled%s%s", id, m->name, m->tenant, m->owner_uid, kv->max_len, spilled,
		 n_rec ? ", journal replayed" : "", lbuf);
	pthread_mutex_unlock(&kv->lock);
	session_release(s);
	persist_manifest_free(m);
	return 1;
}

static int cmp_u64(const void *a, const void *b)
{
	const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int kvstore_recover(struct kvstore *ks, struct session_table *st, struct tenant_table *tt, uint64_t *max_id)
{
	struct kvpersist *kp = ks->persist;
	struct spill_stats sst;
	uint64_t *ids = NULL;
	size_t n = 0;
	struct persist_scan_info si;
	int r;

	*max_id = 0;
	if (!kp)
		return 0;
	if ((r = persist_scan(kp->dirfd, &ids, &n, &si)) < 0) {
		log_err("persistent sessions: cannot read %s/: %s", PERSIST_SUBDIR, strerror(-r));
		return r;
	}
	if (si.closed || si.closed_kept)
		log_notice("persistent sessions: %u closed or evicted while in use before the last stop: their "
			   "files removed now%s", si.closed + si.closed_kept,
			   si.closed_kept ? " (some could not be: they stay closed, and the next start tries again)" : "");
	if (si.marks_stale)
		log_warning("persistent sessions: %u closed mark(s) (%s/ID.closed) older than their session's "
			    "manifest removed, the sessions kept: they were checkpointed since (another tqkvd, "
			    "one that does not know the marks, ran them)", si.marks_stale, PERSIST_SUBDIR);
	*max_id = si.max_aside; /* recover_claim: and every manifest's */
	spill_stats(ks->spill, &sst);
	if (n > 1) /* in the order they were opened: the same log lines every start */
		qsort(ids, n, sizeof(*ids), cmp_u64);
	struct persist_manifest *ms = n ? calloc(n, sizeof(*ms)) : NULL;
	int *ok = n ? calloc(n, sizeof(*ok)) : NULL;
	if (n && (!ms || !ok)) {
		free(ms);
		free(ok);
		free(ids);
		log_err("persistent sessions: out of memory reading %zu manifests", n);
		return -ENOMEM;
	}
	/* every manifest's slots first, then the sessions (recover_claim) */
	uint64_t kept = 0;
	int stop = 0;
	struct owners own = { 0 };
	for (size_t i = 0; i < n; i++) {
		ok[i] = recover_claim(ks, tt, &own, ids[i], sst.slot_bytes, max_id, ms, ok, i);
		kp->dropped += ok[i] == -1;
		stop |= ok[i] == -3;
	}
	/* new ids go above every session's on disk, those set aside (now or
	 * before) too: renamed back, their files would replace a new one's */
	free(own.v);
	if (*max_id)
		session_table_ids_above(st, *max_id);
	if (stop) {
		for (size_t i = 0; i < n; i++)
			if (ok[i] == 0) {
				release_slots(ks, &ms[i], UINT32_MAX, 0);
				persist_manifest_free(&ms[i]);
			}
		free(ms);
		free(ok);
		free(ids);
		return -EIO;
	}
	for (size_t i = 0; i < n; i++) {
		if (ok[i] != 0)
			continue;
		int a = recover_adopt(ks, st, tt, ids[i], &ms[i]);
		kp->restored += a == 1;
		kp->dropped += a == 0;
		kept += a == -1;
	}
	free(ms);
	free(ok);
	free(ids);
	if (n || si.removed)
		log_notice("persistent sessions: %" PRIu64 " restored (spilled; restored on first use), %" PRIu64
			   " not served in this run (kept for the next start), %" PRIu64 " dropped%s; %u leftover "
			   "file(s) removed; spilled pages of other sessions from before the restart are discarded",
			   kp->restored, kept, kp->dropped, kp->dropped || kept ? " (see above)" : "", si.removed);
	return 0;
}
