/* dataop_internal.h — the page tables behind dataop.h, shared with the
 * modules that work on them directly (kvpersist.c: persistent sessions).
 * Nothing outside daemon/dataop*.c and daemon/kvpersist.c includes this. */
#ifndef TQKVD_DATAOP_INTERNAL_H
#define TQKVD_DATAOP_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "dataop.h"
#include "tq_page.h"
#include "tq_xform.h"

#define N_BUCKETS 1024 /* power of two */

/* Residency of one page (kv->lock held for every transition; WRITING and
 * READING last only while the thread that set them waits for its I/O). */
enum page_state {
	PG_RESIDENT = 0,          /* in the pool: pages[i] is its base               */
	PG_WRITING,               /* in the pool, being copied to its spill slot     */
	PG_SPILLED,               /* only in its spill slot: pages[i] is NULL        */
	PG_READING,               /* being read back into a fresh pool page          */
	PG_LOST,                  /* its slot failed its checks: the tokens are gone */
};

struct kv_page_meta {
	uint64_t slot;            /* spill slot while SPILLED, or while clean        */
	uint64_t gen;             /* generation written to the slot                  */
	uint8_t state;            /* enum page_state                                 */
	uint8_t clean;            /* RESIDENT and slot holds the same bytes (only
	                           * persistent sessions keep such copies)           */
};

struct kv_layer {
	uint8_t **pages;          /* [cap] page bases; [0, n_pages) are held        */
	struct kv_page_meta *meta; /* [cap] residency of each page                   */
	uint32_t n_pages, cap;
	uint32_t n_out;           /* pages not resident (SPILLED, READING or LOST)   */
	struct kv_readahead *ra;  /* reads of its spilled pages in flight, or NULL   */
	uint32_t n_tokens;        /* tokens 0..n_tokens-1 are committed              */
	tq_codec *kc, *vc;        /* created on first use                            */
	tq_xf *xf;                /* K/V transforms (kv_xform != 0), with the codecs */
};

struct kv_sess {
	uint64_t id;
	struct kv_sess *next;     /* bucket chain; kvstore lock                      */
	pthread_mutex_t lock;     /* serializes operations on this session           */
	struct tq_page_geom geom;
	uint32_t n_layers, n_q_heads, dim;
	enum tq_codec_id k_id, v_id;
	uint32_t xform;           /* TQ_XF_* mode of every layer (session_geom)      */
	uint64_t seed;
	uint64_t max_tokens;      /* per layer, from the session                     */
	uint64_t max_len;         /* longest layer (the session's token count)       */
	uint64_t n_pages;         /* all layers                                      */
	uint64_t n_spilled;       /* pages in spill slots, all layers                */
	uint64_t gen_next;        /* spill generations                               */
	struct kvp_sess *p;       /* persistent sessions: journal, checkpoints       */
	struct kv_layer layer[];  /* [n_layers] */
};

struct kvstore {
	struct pool *pool;
	tq_cache *cache;
	struct spill *spill;      /* NULL: no spill tier */
	uint32_t page_bytes;
	pthread_mutex_t lock;     /* guards bucket[] and n */
	struct kv_sess *bucket[N_BUCKETS];
	uint32_t n;
	struct kvpersist *persist; /* NULL: no persistent sessions (kvpersist.c)     */
	struct reclaim *reclaim;  /* NULL: a full pool fails at once (reclaim.h)    */
};


/* ---- shared between dataop.c and kvpersist.c (kv->lock held) ---------------- */
void dataop_res_set(struct dataop_res *r, int res, uint32_t status, uint32_t detail);
/* A failure of the pool's device operations (kernels, copies) as the
 * ring's status: the pool's GPU lost (-ENOTRECOVERABLE: tqc_device_lost;
 * the main loop stops the daemon), out of memory, or an internal error the
 * message names. */
uint32_t dataop_kernel_status(int e);
/* One batch of spill I/O and one request in it. */
struct io_batch {
	uint32_t pending;         /* set before the first submit; atomic after */
};
struct io_one {
	struct io_batch *b;
	int res;
	char why[320];
};
void dataop_io_done(void *ctx, int res, const char *why);
/* Wait for every request of b (driving the spill ring meanwhile). */
void dataop_batch_wait(struct kvstore *ks, struct io_batch *b);
/* A request of b that failed to submit: counts as done with res. */
void dataop_io_fail(struct io_one *o, int res);
struct spill_page_hdr dataop_hdr_of(const struct kv_sess *kv, uint32_t l, uint32_t i);
/* A slot the session no longer needs: freed at once, or for a persistent
 * session kept until a checkpoint no longer names it. */
void dataop_slot_release(struct kvstore *ks, struct kv_sess *kv, uint64_t slot);
void dataop_readahead_finish(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l);
/* Room for tokens up to new_len in layer l: page table capacity, charge,
 * pool pages; *added = the new pages.  0, or an error in r. */
int dataop_layer_grow(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l, uint64_t new_len,
		      uint32_t *added, struct dataop_res *r);
/* Give back the `added` pages dataop_layer_grow took (not yet committed). */
void dataop_layer_shrink(struct kvstore *ks, struct session *s, struct kv_layer *L, uint32_t added);
void dataop_truncate_layer(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l, uint64_t pos);
void dataop_update_tokens(struct session *s, struct kv_sess *kv);
int dataop_kv_get(struct kvstore *ks, struct session *s, struct kv_sess **out);
/* dataop_kv_get for a session whose pages hold page_tokens tokens, not the
 * pool's number (a persistent session written by another kind of pool:
 * host pools fill a page, GPU pools cut it to a multiple of 32 tokens):
 * -E2BIG when they do not fit a page. */
int dataop_kv_get_paged(struct kvstore *ks, struct session *s, uint32_t page_tokens, struct kv_sess **out);
/* Spill every resident page of kv (kv->lock held). */
int dataop_spill_locked(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint64_t want,
			uint64_t *spilled, char *why, size_t whylen);

#endif
