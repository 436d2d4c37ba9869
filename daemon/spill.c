/* spill.c — the spill store (see spill.h): slots in a preallocated
 * O_DIRECT file, one I/O thread driving io_uring (or pread/pwrite when the
 * operator allowed the fallback). */
#include "spill.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "tq_page.h"
#include "tq_size.h"

#define DEFAULT_QD   64u
#define SUBMIT_EVERY 4u         /* staged SQEs per io_uring_submit */
#define LAT_SAMPLES  1024u
#define REAP_EVERY_US 200u      /* the I/O thread's passes while completions come */
/* io_uring_submit failing this long in a row (every try: the I/O thread's,
 * each 100 ms, and every submitter's) stops the store (ring_broken) */
#define SUBMIT_GIVE_UP_MS 10000u
#define SUBMIT_LOG_EVERY_NS (10ull * 1000000000u)

enum req_op { REQ_WRITE, REQ_READ };

struct req {
	struct req *next;
	enum req_op op;
	uint64_t slot;
	struct spill_page_hdr hdr;   /* write: what to write; read: what to expect */
	const void *src;             /* write: the page */
	void *dst;                   /* read: where the page goes */
	spill_done_fn fn;
	void *ctx;
	uint64_t t0_ns;
	uint32_t stage;              /* staging slot while in flight */
	bool direct;                 /* the page itself is the I/O buffer */
	int inject;                  /* an armed fault this request takes (-errno) */
	uint8_t tries;               /* submitted again after transient failures    */
	int copy_err;                /* write: the page could not be staged (-errno) */
	uint8_t abandoned;           /* the store stopped (ring_broken): 1 never submitted, */
	                             /* 2 not submitted again after a transient failure */
	struct iovec iov[2];         /* direct: header in staging, the page */
	char copy_why[200];
};

struct spill {
	char path[320];
	char engine[256];
	int fd;
	bool uring;                  /* else pread/pwrite */
	int check_state;             /* spill_check: the last condition logged */
	uint32_t page_bytes, qd;
	uint64_t slot_bytes, n_slots;
	/* pages outside host memory: copies through staging (spill.h) */
	int (*page_copy)(void *ctx, void *dst, const void *src, size_t n, char *why, size_t whylen);
	void (*unpin_staging)(void *ctx, void *buf);
	void *copy_ctx;
	bool staging_pinned;

	pthread_mutex_t lock;        /* the slot bitmap, stats, faults */
	pthread_cond_t done_cond;    /* fallback engine: broadcast after each completion */
	pthread_cond_t reap_cond;    /* io_uring: broadcast after each reap (CLOCK_MONOTONIC) */
	uint64_t reap_passes;        /* counted under lock */
	uint64_t *bitmap;            /* [n_slots/64] used slots */
	uint64_t used, hint;
	uint64_t fault_nth[2];
	uint64_t fault_more[2];      /* submissions after the nth that fail too */
	int fault_err[2];
	uint32_t delay_us;           /* spill_fault_delay */
	struct spill_stats st;
	uint32_t lat_us[LAT_SAMPLES], lat_n;

	/* Submission side: the queue of requests waiting for a staging slot,
	 * the staging slots, the ring's SQ.  Whoever submits stages and
	 * submits in its own thread (copy + crc, then io_uring_submit); a
	 * request that finds no free staging slot waits in the queue until a
	 * completion frees one.  Fallback engine: the queue, and cond wakes
	 * its thread. */
	pthread_mutex_t sq_lock;
	pthread_cond_t cond;
	struct req *q_head, *q_tail;
	struct req *r_head, *r_tail; /* submitted again after a transient failure:
	                              * by the I/O thread only (sq_lock) */
	bool stop;
	/* io_uring_submit failing (ring_submit): since when, how often in
	 * this run and in all, the last log; the injected failures left */
	uint64_t sub_fail_since_ns, sub_fails, sub_fails_total, sub_logged_ns;
	uint64_t sub_fault_left;
	int sub_fault_err;
	uint32_t give_up_ms;
	int sub_last_err;
	int broken;                  /* -errno: the store stopped (ring_broken); read
	                              * atomically, set under sq_lock */
	char broken_why[256];        /* set once, before broken */
	uint8_t *staging;            /* qd slots of slot_bytes, 4 KiB aligned */
	size_t staging_bytes;
	struct req **inflight;       /* [qd] by staging slot */
	uint32_t *free_stage, n_free_stage;

	/* Completion side: whoever holds cq_lock reaps the ring's CQ and runs
	 * the callbacks: a caller waiting in spill_wait (it sleeps in
	 * io_uring_enter and is woken by the kernel itself), else the I/O
	 * thread (woken by the ring's completion eventfd).  Order: cq_lock,
	 * then sq_lock, then lock. */
	pthread_mutex_t cq_lock;
	struct io_uring ring;
	pthread_t thread;
	int efd;                     /* wakes the I/O thread: stop, a waiter left */
	int cq_efd;                  /* the ring -> I/O thread (completions) */
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- slots --------------------------------------------------------------------- */

int spill_slot_alloc(struct spill *sp, uint64_t *slot)
{
	int r = -ENOSPC;

	pthread_mutex_lock(&sp->lock);
	if (sp->used < sp->n_slots) {
		uint64_t words = (sp->n_slots + 63) / 64;
		for (uint64_t i = 0; i < words; i++) {
			uint64_t w = (sp->hint + i) % words;
			uint64_t freebits = ~sp->bitmap[w];
			if (w == words - 1 && sp->n_slots % 64)
				freebits &= (1ull << (sp->n_slots % 64)) - 1;
			if (!freebits)
				continue;
			int b = __builtin_ctzll(freebits);
			sp->bitmap[w] |= 1ull << b;
			sp->used++;
			sp->hint = w;
			*slot = w * 64 + (uint64_t)b;
			r = 0;
			break;
		}
	}
	pthread_mutex_unlock(&sp->lock);
	return r;
}

void spill_slot_free(struct spill *sp, uint64_t slot)
{
	pthread_mutex_lock(&sp->lock);
	if (slot < sp->n_slots && (sp->bitmap[slot / 64] & (1ull << (slot % 64)))) {
		sp->bitmap[slot / 64] &= ~(1ull << (slot % 64));
		sp->used--;
	} else {
		log_err("spill: slot %" PRIu64 " freed twice or out of range (internal error)", slot);
	}
	pthread_mutex_unlock(&sp->lock);
}

/* ---- checks ------------------------------------------------------------------------ */

int spill_slot_claim(struct spill *sp, uint64_t slot)
{
	int r = 0;

	pthread_mutex_lock(&sp->lock);
	if (slot >= sp->n_slots)
		r = -ERANGE;
	else if (sp->bitmap[slot / 64] & (1ull << (slot % 64)))
		r = -EEXIST;
	else {
		sp->bitmap[slot / 64] |= 1ull << (slot % 64);
		sp->used++;
	}
	pthread_mutex_unlock(&sp->lock);
	return r;
}

int spill_sync(struct spill *sp)
{
	return fdatasync(sp->fd) < 0 ? -errno : 0;
}

static uint32_t page_crc(const struct spill_page_hdr *h, const void *payload, uint32_t bytes)
{
	struct spill_page_hdr c = *h;

	c.crc32c = 0;
	return spill_crc32c(spill_crc32c(0, &c, sizeof(c)), payload, bytes);
}

void spill_hdr_seal(struct spill_page_hdr *h, const void *payload, uint32_t page_bytes)
{
	h->magic = SPILL_MAGIC;
	h->format = SPILL_FORMAT;
	h->hdr_bytes = SPILL_HDR_BYTES;
	h->layout_id = TQ_PAGE_LAYOUT_ID;
	h->payload_bytes = page_bytes;
	h->crc32c = 0;
	h->crc32c = page_crc(h, payload, page_bytes);
}

int spill_hdr_check(const void *hdr_bytes, const void *payload, uint32_t page_bytes,
		    const struct spill_page_hdr *e, char *why, size_t whylen)
{
	struct spill_page_hdr h;

	memcpy(&h, hdr_bytes, sizeof(h));
	if (h.magic != SPILL_MAGIC || h.hdr_bytes != SPILL_HDR_BYTES)
		snprintf(why, whylen, "not a spilled page (bad magic)");
	else if (h.format != SPILL_FORMAT)
		snprintf(why, whylen, "page format %u, this tqkvd reads %u", h.format, SPILL_FORMAT);
	else if (h.layout_id != TQ_PAGE_LAYOUT_ID || h.payload_bytes != page_bytes)
		snprintf(why, whylen, "page layout %u of %u bytes, expected layout %u of %u", h.layout_id,
			 h.payload_bytes, TQ_PAGE_LAYOUT_ID, page_bytes);
	else if (h.crc32c != page_crc(&h, payload, page_bytes))
		snprintf(why, whylen, "checksum mismatch (crc32c %08x stored, %08x computed)", h.crc32c,
			 page_crc(&h, payload, page_bytes));
	else if (h.session_id != e->session_id || h.layer != e->layer || h.page_index != e->page_index ||
		 h.generation != e->generation)
		snprintf(why, whylen, "holds session %" PRIu64 " layer %u page %u generation %" PRIu64
			 ", expected session %" PRIu64 " layer %u page %u generation %" PRIu64,
			 h.session_id, h.layer, h.page_index, h.generation, e->session_id, e->layer,
			 e->page_index, e->generation);
	/* a page's copy holds at least the tokens its layer counts in it (a
	 * truncate only lowers the count; an append drops the tail page's
	 * copy first): fewer, and the reader would take slots the session
	 * never wrote — bytes of the page's earlier owner */
	else if (h.n_tokens < e->n_tokens)
		snprintf(why, whylen, "holds %u tokens of page %u, the session counts %u there", h.n_tokens,
			 h.page_index, e->n_tokens);
	else
		return 0;
	return -EBADMSG;
}

/* 0, or -EBADMSG with why: the header (in staging) and the payload
 * against what the reader expects, the location prefixed to why. */
static int verify(struct spill *sp, const struct req *q, const uint8_t *buf, const uint8_t *payload, char *why,
		  size_t whylen)
{
	uint64_t off = q->slot * sp->slot_bytes;

	if (spill_hdr_check(buf, payload, sp->page_bytes, &q->hdr, why, whylen) == 0)
		return 0;
	/* prefix the location: the log and the session's error name it */
	char tmp[256];
	snprintf(tmp, sizeof(tmp), "%s", why);
	snprintf(why, whylen, "%s offset %" PRIu64 " (slot %" PRIu64 "): %s", sp->path, off, q->slot, tmp);
	return -EBADMSG;
}

/* ---- completion ------------------------------------------------------------------------- */

/* A failure worth submitting again (SPILL_RETRIES times at most): the
 * kernel cancelled the request (-ECANCELED: its submitter — any thread
 * that waits drives the ring — exited with it in the kernel's worker
 * queue), interrupted it, asked for a retry, or moved fewer bytes than
 * the slot (O_DIRECT on a regular file does not, but nothing forbids it).
 * An injected fault stands for what the disk said. */
#define SPILL_RETRIES 3
static bool transient(const struct spill *sp, const struct req *q, long res)
{
	if (q->inject)
		res = q->inject;
	if (q->copy_err || q->tries >= SPILL_RETRIES)
		return false;
	return res == -EAGAIN || res == -EINTR || res == -ECANCELED || (res >= 0 && (uint64_t)res < sp->slot_bytes);
}

/* q goes back to be submitted again (the caller requeues it). */
static void retry_note(struct spill *sp, struct req *q, long res)
{
	long r = q->inject ? q->inject : res;
	const char *inj = q->inject ? " (injected fault)" : "";
	uint64_t off = q->slot * sp->slot_bytes;

	q->tries++;
	q->inject = 0;
	pthread_mutex_lock(&sp->lock);
	sp->st.retries++;
	pthread_mutex_unlock(&sp->lock);
	if (r < 0)
		log_warning("spill: %s offset %" PRIu64 ": %s failed: %s%s; submitted again (%u of %d)", sp->path,
			    off, q->op == REQ_WRITE ? "write" : "read", strerror((int)-r), inj, q->tries, SPILL_RETRIES);
	else
		log_warning("spill: %s offset %" PRIu64 ": short %s (%ld of %" PRIu64 " bytes), submitted again "
			    "(%u of %d)", sp->path, off, q->op == REQ_WRITE ? "write" : "read", r, sp->slot_bytes,
			    q->tries, SPILL_RETRIES);
}

static int fault_take(struct spill *sp, enum req_op op)
{
	int err = 0;

	pthread_mutex_lock(&sp->lock);
	if (sp->fault_nth[op] && --sp->fault_nth[op] == 0) {
		err = sp->fault_err[op];
		if (sp->fault_more[op]) { /* the next one fails too */
			sp->fault_more[op]--;
			sp->fault_nth[op] = 1;
		}
	}
	pthread_mutex_unlock(&sp->lock);
	return err;
}

/* res: the syscall's result for the whole slot (bytes, or -errno).  Runs
 * on whichever thread reaps (cq_lock held), or the fallback's thread. */
static void complete(struct spill *sp, struct req *q, const uint8_t *buf, long res)
{
	char why[1024] = "";
	int r = 0, inj = q->inject;
	uint64_t off = q->slot * sp->slot_bytes;
	uint32_t delay = __atomic_load_n(&sp->delay_us, __ATOMIC_RELAXED);

	if (delay) { /* a slow disk: this I/O took at least `delay` */
		uint64_t due = q->t0_ns + (uint64_t)delay * 1000u, now = now_ns();
		if (now < due)
			usleep((useconds_t)((due - now) / 1000u));
	}

	if (q->abandoned) {
		r = -EIO;
		snprintf(why, sizeof(why), "%s offset %" PRIu64 ": the %s was not submitted%s: %s", sp->path, off,
			 q->op == REQ_WRITE ? "write" : "read", q->abandoned == 2 ? " again" : "", sp->broken_why);
	} else if (q->copy_err) {
		r = q->copy_err;
		snprintf(why, sizeof(why), "%s offset %" PRIu64 ": the page could not be copied for the write "
			 "(the slot was written invalid): %s", sp->path, off, q->copy_why);
	} else if (inj) {
		r = inj;
		snprintf(why, sizeof(why), "%s offset %" PRIu64 ": %s (injected fault)", sp->path, off, strerror(-inj));
	} else if (res < 0) {
		r = (int)res;
		snprintf(why, sizeof(why), "%s offset %" PRIu64 ": %s failed: %s", sp->path, off,
			 q->op == REQ_WRITE ? "write" : "read", strerror((int)-res));
	} else if ((uint64_t)res != sp->slot_bytes) {
		r = -EIO;
		snprintf(why, sizeof(why), "%s offset %" PRIu64 ": short %s (%ld of %" PRIu64 " bytes)", sp->path,
			 off, q->op == REQ_WRITE ? "write" : "read", res, sp->slot_bytes);
	} else if (q->op == REQ_READ) {
		const uint8_t *payload = q->direct ? q->dst : buf + SPILL_HDR_BYTES;
		if ((r = verify(sp, q, buf, payload, why, sizeof(why))) == 0 && !q->direct) {
			char cwhy[200];
			if (!sp->page_copy)
				memcpy(q->dst, payload, sp->page_bytes);
			else if ((r = sp->page_copy(sp->copy_ctx, q->dst, payload, sp->page_bytes, cwhy,
						    sizeof(cwhy))) < 0)
				snprintf(why, sizeof(why), "%s offset %" PRIu64 ": the page read back could not be "
					 "copied into the pool: %s", sp->path, off, cwhy);
		}
	}

	if (r < 0 && q->tries) {
		size_t l = strlen(why);
		snprintf(why + l, sizeof(why) - l, " (after %u transient failure(s), submitted again)", q->tries);
	}
	uint64_t us = (now_ns() - q->t0_ns) / 1000u;
	pthread_mutex_lock(&sp->lock);
	if (q->op == REQ_WRITE) {
		sp->st.writes++;
		if (r == 0)
			sp->st.bytes_written += sp->slot_bytes;
	} else {
		sp->st.reads++;
		if (r == 0)
			sp->st.bytes_read += sp->slot_bytes;
		sp->lat_us[sp->lat_n++ % LAT_SAMPLES] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
	}
	if (r == -EBADMSG)
		sp->st.crc_failures++;
	else if (r < 0)
		sp->st.io_errors++;
	pthread_mutex_unlock(&sp->lock);
	if (r < 0)
		log_err("spill: %s", why);
	q->fn(q->ctx, r, why);
	free(q);
	if (!sp->uring) { /* spill_wait's sleepers look again */
		pthread_mutex_lock(&sp->lock);
		pthread_cond_broadcast(&sp->done_cond);
		pthread_mutex_unlock(&sp->lock);
	}
}

/* Fill staging slot buf for a write: the header with its crc, and the
 * payload unless the page itself goes to the disk (direct). */
static void stage_write(struct spill *sp, struct req *q, uint8_t *buf)
{
	struct spill_page_hdr h = q->hdr;
	const void *payload = q->src;

	if (!q->direct && !sp->page_copy)
		payload = memcpy(buf + SPILL_HDR_BYTES, q->src, sp->page_bytes);
	else if (!q->direct) {
		payload = buf + SPILL_HDR_BYTES;
		q->copy_err = sp->page_copy(sp->copy_ctx, buf + SPILL_HDR_BYTES, q->src, sp->page_bytes,
					    q->copy_why, sizeof(q->copy_why));
		if (q->copy_err > 0)
			q->copy_err = -EIO;
	}
	spill_hdr_seal(&h, payload, sp->page_bytes);
	if (q->copy_err)
		h.magic = 0; /* what staging holds is not the page: the slot must never verify */
	memset(buf, 0, SPILL_HDR_BYTES);
	memcpy(buf, &h, sizeof(h));
}

/* ---- the io_uring engine --------------------------------------------------------------- */

static void kick(int fd)
{
	uint64_t one = 1;
	if (write(fd, &one, sizeof(one)) < 0) {
		/* counter saturated: the I/O thread is due to look anyway */
	}
}

static void drain_efd(int fd)
{
	uint64_t v;
	if (read(fd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nothing was signalled */
	}
}

/* Hand the staged SQEs to the kernel (sq_lock held).  A failure leaves
 * them queued: the next submit retries (the I/O thread's every 100 ms, and
 * whoever submits or waits meanwhile).  Failing SUBMIT_GIVE_UP_MS in a row
 * stops the store (ring_broken, from the I/O thread). */
static void ring_submit(struct spill *sp)
{
	if (sp->broken)
		return; /* never again: the kernel would run SQEs whose requests have failed */
	int r;
	if (sp->sub_fault_left) {
		sp->sub_fault_left--;
		r = sp->sub_fault_err;
	} else {
		r = io_uring_submit(&sp->ring);
	}
	uint64_t now = now_ns();
	if (r >= 0) {
		if (sp->sub_fails)
			log_notice("spill: io_uring_submit works again, after %" PRIu64 " failure%s in %.1f s",
				   sp->sub_fails, sp->sub_fails == 1 ? "" : "s",
				   (double)(now - sp->sub_fail_since_ns) / 1e9);
		sp->sub_fails = 0;
		return;
	}
	sp->sub_fails_total++;
	if (sp->sub_fails++ == 0) {
		sp->sub_fail_since_ns = now;
		sp->sub_logged_ns = now;
		log_err("spill: io_uring_submit: %s: the I/O stays queued and is submitted again "
			"(the store stops if this lasts %.1f s)", strerror(-r), sp->give_up_ms / 1000.0);
	} else if (now - sp->sub_logged_ns >= SUBMIT_LOG_EVERY_NS) {
		sp->sub_logged_ns = now;
		log_err("spill: io_uring_submit still fails: %s (%" PRIu64 " times in %.0f s)", strerror(-r),
			sp->sub_fails, (double)(now - sp->sub_fail_since_ns) / 1e9);
	}
	sp->sub_last_err = r;
}

/* io_uring_submit has failed for give_up_ms (sq_lock held): the store
 * stops, and its requests fail rather than wait forever (each waiter holds
 * its session's lock; spill_close would never return).  The SQEs the
 * kernel never took are abandoned — their requests, the queued ones and
 * those to submit again come back as a list for the I/O thread to
 * complete — and no submit ever runs again, since the kernel would run
 * them.  What the kernel took completes as usual.  Later requests fail at
 * once (submit).  The pages stay where they are: a write that fails leaves
 * its page in memory; a read leaves it on disk, unreadable until a restart
 * (persistent sessions come back from their files then). */
static void abandon(struct req ***tail, struct req *q, unsigned *n)
{
	q->abandoned = q->tries ? 2 : 1;
	**tail = q;
	*tail = &q->next;
	(*n)++;
}

static struct req *ring_broken(struct spill *sp)
{
	struct req *failed = NULL, **tail = &failed;
	struct io_uring_sq *sq = &sp->ring.sq;
	unsigned n = 0;

	snprintf(sp->broken_why, sizeof(sp->broken_why),
		 "the spill store stopped: io_uring_submit failed for %.1f s (%s); restart tqkvd to use it again",
		 (double)(now_ns() - sp->sub_fail_since_ns) / 1e9, strerror(-sp->sub_last_err));
	__atomic_store_n(&sp->broken, sp->sub_last_err, __ATOMIC_RELEASE);
	for (unsigned i = *sq->khead; i != sq->sqe_tail; i++) {
		uint64_t tag = sq->sqes[i & sq->ring_mask].user_data;
		struct req *q = tag < sp->qd ? __atomic_exchange_n(&sp->inflight[tag], NULL, __ATOMIC_ACQ_REL) : NULL;
		if (!q)
			continue;
		sp->free_stage[sp->n_free_stage++] = (uint32_t)tag;
		abandon(&tail, q, &n);
	}
	for (struct req *q = sp->r_head, *next; q; q = next) {
		next = q->next;
		abandon(&tail, q, &n);
	}
	for (struct req *q = sp->q_head, *next; q; q = next) {
		next = q->next;
		abandon(&tail, q, &n);
	}
	*tail = NULL;
	sp->r_head = sp->r_tail = sp->q_head = sp->q_tail = NULL;
	log_err("spill: %s; the %u I/O(s) it had not taken fail, and so do later ones: pages being spilled "
		 "stay in memory, spilled pages cannot be read back until then", sp->broken_why, n);
	return failed;
}

static __thread const struct spill *io_thread_of; /* set by the store's I/O thread */

/* Stage q in a free staging slot and queue its SQE (sq_lock held). */
static void stage_one(struct spill *sp, struct req *q)
{
	q->stage = sp->free_stage[--sp->n_free_stage];
	q->inject = fault_take(sp, q->op); /* in submission order: deterministic */
	uint8_t *buf = sp->staging + (size_t)q->stage * sp->slot_bytes;
	struct io_uring_sqe *e = io_uring_get_sqe(&sp->ring); /* qd entries, qd stages */
	uint64_t off = q->slot * sp->slot_bytes;
	void *page = q->op == REQ_WRITE ? (void *)q->src : q->dst;
	/* A block-aligned page (every pool page) is the I/O buffer itself,
	 * behind its header in staging: no copy.  Else all of the slot
	 * goes through staging (registered buffers). */
	q->direct = !sp->page_copy && ((uintptr_t)page & (SPILL_HDR_BYTES - 1)) == 0;
	q->iov[0] = (struct iovec){ buf, SPILL_HDR_BYTES };
	q->iov[1] = (struct iovec){ page, sp->page_bytes };
	if (q->op == REQ_WRITE)
		stage_write(sp, q, buf);
	if (q->direct && q->op == REQ_WRITE)
		io_uring_prep_writev(e, 0, q->iov, 2, off);
	else if (q->direct)
		io_uring_prep_readv(e, 0, q->iov, 2, off);
	else if (q->op == REQ_WRITE)
		io_uring_prep_write_fixed(e, 0, buf, (unsigned)sp->slot_bytes, off, 0);
	else
		io_uring_prep_read_fixed(e, 0, buf, (unsigned)sp->slot_bytes, off, 0);
	e->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data64(e, q->stage);
	/* published to whichever thread reaps the completion (it holds
	 * cq_lock, not sq_lock): the kernel orders the two, the
	 * release/acquire pair says so to the compiler and to TSan */
	__atomic_store_n(&sp->inflight[q->stage], q, __ATOMIC_RELEASE);
}

/* The next request to stage: a request to submit again first, and only on
 * the I/O thread (a waiter that reaped it may be a short-lived thread whose
 * exit would cancel it once more); while there is one, other threads
 * leave the free slots to it. */
static struct req *next_req(struct spill *sp)
{
	struct req *q = NULL;

	if (sp->r_head) {
		if (io_thread_of != sp)
			return NULL;
		q = sp->r_head;
		if (!(sp->r_head = q->next))
			sp->r_tail = NULL;
	} else if (sp->q_head) {
		q = sp->q_head;
		if (!(sp->q_head = q->next))
			sp->q_tail = NULL;
	}
	return q;
}

/* Stage and submit queued requests, as far as staging slots go (sq_lock
 * held).  Staging a write costs ~10 us (copy + crc): the disk gets every
 * few at once rather than the whole batch at the end. */
static void pump_locked(struct spill *sp)
{
	unsigned n = 0;
	struct req *q;

	if (sp->broken)
		return;
	while (sp->n_free_stage && (q = next_req(sp))) {
		stage_one(sp, q);
		if (++n % SUBMIT_EVERY == 0)
			ring_submit(sp);
	}
	if (n % SUBMIT_EVERY || io_uring_sq_ready(&sp->ring))
		ring_submit(sp);
}

/* Callbacks ran, or the reaper left: the waiters that do not reap look
 * at their requests again (spill_wait). */
static void reaped(struct spill *sp)
{
	pthread_mutex_lock(&sp->lock);
	sp->reap_passes++;
	pthread_cond_broadcast(&sp->reap_cond);
	pthread_mutex_unlock(&sp->lock);
}

/* Hand back every completion there is (cq_lock held): callbacks, then the
 * staging slots go back and queued requests take them.  Returns how many. */
static unsigned reap_locked(struct spill *sp)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	uint32_t done[DEFAULT_QD * 2];

	struct req *again = NULL, *again_last = NULL;

	io_uring_for_each_cqe(&sp->ring, head, cqe) {
		uint64_t tag = io_uring_cqe_get_data64(cqe);
		if (tag >= sp->qd || !__atomic_load_n(&sp->inflight[tag], __ATOMIC_ACQUIRE)) {
			/* not one of ours (liburing's own, on a kernel start_uring
			 * refuses): nothing to hand back */
			log_err("spill: a completion with tag %" PRIu64 " that is not in flight (ignored)", tag);
			done[n++] = UINT32_MAX;
		} else {
			struct req *q = __atomic_exchange_n(&sp->inflight[tag], NULL, __ATOMIC_ACQUIRE);
			/* (the store stopped: nothing goes again, the failure stands) */
			if (transient(sp, q, cqe->res) && !__atomic_load_n(&sp->broken, __ATOMIC_ACQUIRE)) {
				retry_note(sp, q, cqe->res);
				q->next = NULL;
				if (again_last)
					again_last->next = q;
				else
					again = q;
				again_last = q;
			} else {
				complete(sp, q, sp->staging + (size_t)tag * sp->slot_bytes, cqe->res);
			}
			done[n++] = (uint32_t)tag;
		}
		if (n == sizeof(done) / sizeof(done[0]))
			break;
	}
	io_uring_cq_advance(&sp->ring, n);
	if (n) {
		pthread_mutex_lock(&sp->sq_lock);
		for (unsigned i = 0; i < n; i++)
			if (done[i] != UINT32_MAX)
				sp->free_stage[sp->n_free_stage++] = done[i];
		struct req *abandon = NULL;
		if (again && sp->broken) { /* nothing is submitted again: they fail here */
			abandon = again;
		} else if (again) { /* the I/O thread submits them again, first in line */
			if (sp->r_tail)
				sp->r_tail->next = again;
			else
				sp->r_head = again;
			sp->r_tail = again_last;
		}
		pump_locked(sp);
		/* requests to submit again wait for the I/O thread (and keep
		 * the free slots for themselves): wake it */
		bool wake = sp->r_head && io_thread_of != sp;
		pthread_mutex_unlock(&sp->sq_lock);
		if (wake)
			kick(sp->efd);
		while (abandon) { /* (the store stopped since the check above) */
			struct req *q = abandon;
			abandon = q->next;
			q->abandoned = 2;
			complete(sp, q, NULL, -EIO);
		}
		reaped(sp);
	}
	return n;
}

/* The I/O thread reaps what nobody waits for (write-through, read-ahead,
 * anything whose waiter has not come yet).  It sleeps in poll() on the
 * ring's completion eventfd and the wake-up eventfd — plain blocking
 * syscalls every tool (gdb, strace, valgrind) understands — and steps
 * aside while a waiter holds cq_lock. */
static void *uring_main(void *arg)
{
	struct spill *sp = arg;

	io_thread_of = sp;
	for (;;) {
		unsigned n = 0;
		if (pthread_mutex_trylock(&sp->cq_lock) == 0) {
			n = reap_locked(sp);
			pthread_mutex_unlock(&sp->cq_lock);
			/* a waiter that found the lock taken (its broadcast from
			 * reap_locked came while this thread still held it) takes
			 * over now, not at its 5 ms safety net */
			reaped(sp);
		}
		pthread_mutex_lock(&sp->sq_lock);
		uint32_t was_free = sp->n_free_stage;
		pump_locked(sp); /* background requests; and a submit that failed before */
		n += was_free - sp->n_free_stage;
		struct req *failed = NULL;
		if (sp->sub_fails && !sp->broken && now_ns() - sp->sub_fail_since_ns >= sp->give_up_ms * 1000000ull)
			failed = ring_broken(sp);
		bool stop = sp->stop, more = sp->q_head || sp->r_head;
		uint32_t busy = sp->qd - sp->n_free_stage;
		pthread_mutex_unlock(&sp->sq_lock);
		if (failed) {
			/* callbacks run under cq_lock, as from reap_locked: a
			 * waiter that holds it lets go within a second (spill_wait) */
			pthread_mutex_lock(&sp->cq_lock);
			while (failed) {
				struct req *q = failed;
				failed = q->next;
				complete(sp, q, NULL, -EIO);
			}
			pthread_mutex_unlock(&sp->cq_lock);
			reaped(sp);
			continue;
		}
		if (stop && busy == 0 && !more)
			break;
		if (n) {
			/* Nobody waits on these (a waiter reaps for itself), so
			 * take them in batches: one pass per REAP_EVERY_US rather
			 * than a wake-up per completion, which would take CPU from
			 * the attention that read-ahead overlaps with.  64 in
			 * flight last milliseconds even on a fast disk. */
			if (!stop)
				usleep(REAP_EVERY_US);
			continue;
		}
		struct pollfd pf[2] = { { sp->efd, POLLIN, 0 }, { sp->cq_efd, POLLIN, 0 } };
		if (poll(pf, 2, busy ? 100 : -1) > 0) {
			if (pf[0].revents)
				drain_efd(sp->efd);
			if (pf[1].revents)
				drain_efd(sp->cq_efd);
		}
	}
	return NULL;
}

/* ---- the pread/pwrite engine ------------------------------------------------------------ */

static void *sync_main(void *arg)
{
	struct spill *sp = arg;
	uint8_t *buf = sp->staging;

	pthread_mutex_lock(&sp->sq_lock);
	for (;;) {
		while (!sp->q_head && !sp->stop)
			pthread_cond_wait(&sp->cond, &sp->sq_lock);
		if (!sp->q_head)
			break;
		struct req *q = sp->q_head;
		sp->q_head = q->next;
		if (!sp->q_head)
			sp->q_tail = NULL;
		pthread_mutex_unlock(&sp->sq_lock);
		off_t off = (off_t)(q->slot * sp->slot_bytes);
		long res;
		if (q->op == REQ_WRITE)
			stage_write(sp, q, buf);
		for (;;) {
			q->inject = fault_take(sp, q->op);
			ssize_t n = q->op == REQ_WRITE ? pwrite(sp->fd, buf, sp->slot_bytes, off)
						       : pread(sp->fd, buf, sp->slot_bytes, off);
			res = n < 0 ? -errno : (long)n;
			if (!transient(sp, q, res))
				break;
			retry_note(sp, q, res);
		}
		complete(sp, q, buf, res);
		pthread_mutex_lock(&sp->sq_lock);
	}
	pthread_mutex_unlock(&sp->sq_lock);
	return NULL;
}

/* ---- submission and waiting ------------------------------------------------------------ */

static int submit(struct spill *sp, enum req_op op, uint64_t slot, const struct spill_page_hdr *hdr,
		  const void *src, void *dst, spill_done_fn fn, void *ctx, unsigned flags)
{
	struct req *q;

	if (slot >= sp->n_slots)
		return -EINVAL;
	if (!(q = calloc(1, sizeof(*q))))
		return -ENOMEM;
	q->op = op;
	q->slot = slot;
	q->hdr = *hdr;
	q->src = src;
	q->dst = dst;
	q->fn = fn;
	q->ctx = ctx;
	q->t0_ns = now_ns();
	pthread_mutex_lock(&sp->sq_lock);
	if (sp->stop || sp->broken) {
		int r = sp->stop ? -ESHUTDOWN : -EIO;
		pthread_mutex_unlock(&sp->sq_lock);
		free(q);
		return r;
	}
	if (sp->q_tail)
		sp->q_tail->next = q;
	else
		sp->q_head = q;
	sp->q_tail = q;
	bool bg = sp->uring && (flags & SPILL_BACKGROUND);
	if (sp->uring && !bg)
		pump_locked(sp); /* in this thread: no hand-off before the disk sees it */
	else if (!sp->uring)
		pthread_cond_signal(&sp->cond);
	pthread_mutex_unlock(&sp->sq_lock);
	if (bg) /* the I/O thread submits it, so the kernel's completion work lands there too */
		kick(sp->efd);
	return 0;
}

int spill_write(struct spill *sp, uint64_t slot, const struct spill_page_hdr *hdr, const void *page,
		spill_done_fn fn, void *ctx, unsigned flags)
{
	return submit(sp, REQ_WRITE, slot, hdr, page, NULL, fn, ctx, flags);
}

int spill_read(struct spill *sp, uint64_t slot, const struct spill_page_hdr *expect, void *page,
	       spill_done_fn fn, void *ctx, unsigned flags)
{
	return submit(sp, REQ_READ, slot, expect, NULL, page, fn, ctx, flags);
}

void spill_wait(struct spill *sp, bool (*done)(void *arg), void *arg)
{
	if (!sp->uring) {
		pthread_mutex_lock(&sp->lock);
		while (!done(arg))
			pthread_cond_wait(&sp->done_cond, &sp->lock);
		pthread_mutex_unlock(&sp->lock);
		return;
	}
	/* Drive the ring from here until done: reap, and sleep in
	 * io_uring_enter for the next completion.  A thread already doing so
	 * reaps ours too: we look at ours after each of its passes (a short
	 * read must not wait out another's batch of thousands of writes), and
	 * take over when it leaves.  Once the store has stopped (ring_broken)
	 * the I/O thread reaps, and completes what it could not submit. */
again:
	if (done(arg))
		return;
	for (;;) {
		/* the pass count before the try: a pass (or the reaper's
		 * leaving) after it is not waited for */
		pthread_mutex_lock(&sp->lock);
		const uint64_t seen = sp->reap_passes;
		pthread_mutex_unlock(&sp->lock);
		if (!__atomic_load_n(&sp->broken, __ATOMIC_ACQUIRE) && pthread_mutex_trylock(&sp->cq_lock) == 0)
			break;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 5 * 1000000; /* a safety net */
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_mutex_lock(&sp->lock);
		/* a pass that ran our callback counts under `lock`: none is missed */
		while (!done(arg) && sp->reap_passes == seen &&
		       pthread_cond_timedwait(&sp->reap_cond, &sp->lock, &ts) == 0) {
		}
		pthread_mutex_unlock(&sp->lock);
		if (done(arg))
			return;
	}
	/* nobody else reaps meanwhile: the I/O thread need not wake */
	bool toggled = io_uring_cq_eventfd_toggle(&sp->ring, false) == 0, leave = false;
	while (!done(arg) && !leave) {
		if (reap_locked(sp))
			continue;
		if (__atomic_load_n(&sp->broken, __ATOMIC_ACQUIRE)) {
			leave = true; /* the I/O thread needs cq_lock to fail the rest */
			break;
		}
		struct io_uring_cqe *cqe;
		struct __kernel_timespec ts = { 1, 0 }; /* a safety net, not a timeout */
		/* (a wait submits nothing: with IORING_FEAT_EXT_ARG, which
		 * start_uring requires, liburing enters with to_submit 0) */
		int r = io_uring_wait_cqe_timeout(&sp->ring, &cqe, &ts);
		if (r == -ETIME) {
			pthread_mutex_lock(&sp->sq_lock); /* an SQE a failed submit left behind? */
			if (sp->broken)
				leave = true;
			else if (io_uring_sq_ready(&sp->ring))
				ring_submit(sp);
			pthread_mutex_unlock(&sp->sq_lock);
		} else if (r < 0 && r != -EINTR && r != -EAGAIN) {
			log_err("spill: waiting for completions: %s", strerror(-r));
			usleep(1000);
		}
	}
	if (toggled)
		io_uring_cq_eventfd_toggle(&sp->ring, true);
	/* what completed between the last reap and the toggle went unsignalled
	 * (read under cq_lock: another waiter's reap moves the CQ head) */
	bool pending = io_uring_cq_ready(&sp->ring) > 0;
	pthread_mutex_unlock(&sp->cq_lock);
	reaped(sp); /* a waiter takes over */
	if (pending || leave)
		kick(sp->efd);
	if (leave)
		goto again;
}

struct waiter {
	bool done;
	int res;
	char why[1024];
};

static void wake(void *ctx, int res, const char *why)
{
	struct waiter *w = ctx;

	w->res = res;
	snprintf(w->why, sizeof(w->why), "%s", why ? why : "");
	__atomic_store_n(&w->done, true, __ATOMIC_RELEASE);
}

static bool waiter_done(void *arg)
{
	struct waiter *w = arg;
	return __atomic_load_n(&w->done, __ATOMIC_ACQUIRE);
}

static int wait_for(struct spill *sp, struct waiter *w, int r, char *why, size_t whylen)
{
	if (r == 0) {
		spill_wait(sp, waiter_done, w);
		r = w->res;
		if (why && whylen)
			snprintf(why, whylen, "%s", w->why);
	} else if (why && whylen) {
		snprintf(why, whylen, "spill: %s", strerror(-r));
	}
	return r;
}

int spill_write_sync(struct spill *sp, uint64_t slot, const struct spill_page_hdr *hdr, const void *page,
		     char *why, size_t whylen)
{
	struct waiter w = { false, 0, "" };
	return wait_for(sp, &w, spill_write(sp, slot, hdr, page, wake, &w, 0), why, whylen);
}

int spill_read_sync(struct spill *sp, uint64_t slot, const struct spill_page_hdr *expect, void *page,
		    char *why, size_t whylen)
{
	struct waiter w = { false, 0, "" };
	return wait_for(sp, &w, spill_read(sp, slot, expect, page, wake, &w, 0), why, whylen);
}

void spill_fault_arm_n(struct spill *sp, enum spill_fault kind, uint64_t nth, uint64_t count, int err)
{
	enum req_op op = kind == SPILL_FAULT_WRITE ? REQ_WRITE : REQ_READ;

	pthread_mutex_lock(&sp->lock);
	sp->fault_nth[op] = count ? nth : 0;
	sp->fault_more[op] = nth && count ? count - 1 : 0;
	sp->fault_err[op] = err < 0 ? err : -EIO;
	pthread_mutex_unlock(&sp->lock);
}

void spill_fault_arm(struct spill *sp, enum spill_fault kind, uint64_t nth, int err)
{
	spill_fault_arm_n(sp, kind, nth, 1, err);
}

void spill_fault_submit(struct spill *sp, uint64_t count, int err, uint32_t give_up_ms)
{
	pthread_mutex_lock(&sp->sq_lock);
	sp->sub_fault_left = count;
	sp->sub_fault_err = err < 0 ? err : -EAGAIN;
	sp->give_up_ms = give_up_ms ? give_up_ms : SUBMIT_GIVE_UP_MS;
	pthread_mutex_unlock(&sp->sq_lock);
}

void spill_fault_delay(struct spill *sp, uint32_t us)
{
	__atomic_store_n(&sp->delay_us, us, __ATOMIC_RELAXED);
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

void spill_stats(struct spill *sp, struct spill_stats *out)
{
	uint32_t lat[LAT_SAMPLES], n;

	pthread_mutex_lock(&sp->lock);
	*out = sp->st;
	out->slots_total = sp->n_slots;
	out->slots_used = sp->used;
	out->slot_bytes = sp->slot_bytes;
	out->queue_depth = sp->uring ? sp->qd : 1;
	n = sp->lat_n < LAT_SAMPLES ? sp->lat_n : LAT_SAMPLES;
	memcpy(lat, sp->lat_us, n * sizeof(lat[0]));
	pthread_mutex_unlock(&sp->lock);
	pthread_mutex_lock(&sp->sq_lock);
	out->submit_failures = sp->sub_fails_total;
	out->stopped = sp->broken != 0;
	pthread_mutex_unlock(&sp->sq_lock);
	if (n) {
		qsort(lat, n, sizeof(lat[0]), cmp_u32);
		out->read_p50_us = lat[(n - 1) / 2];
		out->read_p99_us = lat[(uint64_t)(n - 1) * 99 / 100];
	}
}

int spill_check(struct spill *sp)
{
	struct stat held, now;
	char dir[sizeof(sp->path)];
	int r = 0;

	if (!sp)
		return 0;
	snprintf(dir, sizeof(dir), "%s", sp->path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*slash = 0;
	if (fstat(sp->fd, &held) < 0 || stat(sp->path, &now) < 0 || now.st_ino != held.st_ino ||
	    now.st_dev != held.st_dev)
		r = -ENOENT;
	else if (access(dir, W_OK) < 0)
		r = errno == EROFS ? -EROFS : -EACCES;
	if (r != sp->check_state) {
		if (r == -ENOENT)
			log_err("spill: %s was removed or replaced while tqkvd runs: spilled pages stay readable "
				"through the open file until tqkvd stops, then they are gone; new session ids may "
				"fail to persist (session-ids lives beside it)", sp->path);
		else if (r)
			log_err("spill: %s is no longer writable (%s): the session-id counter cannot be saved "
				"there", dir, strerror(-r));
		else
			log_notice("spill: %s is back to normal", sp->path);
		sp->check_state = r;
	}
	return r;
}

int spill_read_hdr(struct spill *sp, uint64_t slot, struct spill_page_hdr *out)
{
	void *buf;
	int r = 0;

	if (slot >= sp->n_slots)
		return -ERANGE;
	if (posix_memalign(&buf, SPILL_HDR_BYTES, SPILL_HDR_BYTES)) /* O_DIRECT: an aligned block */
		return -ENOMEM;
	ssize_t n = pread(sp->fd, buf, SPILL_HDR_BYTES, (off_t)(slot * sp->slot_bytes));
	if (n != SPILL_HDR_BYTES)
		r = n < 0 ? -errno : -EIO;
	else
		memcpy(out, buf, sizeof(*out));
	if (r == 0 && (out->magic != SPILL_MAGIC || out->hdr_bytes != SPILL_HDR_BYTES || out->format != SPILL_FORMAT))
		r = -EBADMSG;
	free(buf);
	return r;
}

int spill_stopped(struct spill *sp, char *why, size_t whylen)
{
	if (!sp || !__atomic_load_n(&sp->broken, __ATOMIC_ACQUIRE))
		return 0;
	snprintf(why, whylen, "%s", sp->broken_why); /* written before broken was set, never after */
	return -EIO;
}

const char *spill_engine(const struct spill *sp)
{
	return sp->engine;
}

const char *spill_path(const struct spill *sp)
{
	return sp->path;
}

/* ---- open / close ----------------------------------------------------------------------- */

/* Why io_uring is refused here, in words an operator can act on. */
static void uring_why(int err, char *buf, size_t len)
{
	FILE *f = fopen("/proc/sys/kernel/io_uring_disabled", "r");
	int disabled = 0;

	if (f) {
		if (fscanf(f, "%d", &disabled) != 1)
			disabled = 0;
		fclose(f);
	}
	if (err == ENOSYS)
		snprintf(buf, len, "io_uring is not available: the kernel lacks it (ENOSYS; Linux >= 5.11 needed)");
	else if (err == EPERM && disabled)
		snprintf(buf, len, "io_uring is disabled by kernel.io_uring_disabled = %d (EPERM)", disabled);
	else if (err == EPERM)
		snprintf(buf, len, "io_uring is not permitted here (EPERM: a seccomp filter, e.g. a container's, "
			 "or io_uring_group)");
	else if (err == ENOMEM)
		snprintf(buf, len, "io_uring could not lock its memory (ENOMEM: raise LimitMEMLOCK / ulimit -l)");
	else
		snprintf(buf, len, "io_uring setup failed: %s", strerror(err));
}

static int start_uring(struct spill *sp, char *why, size_t whylen)
{
	struct iovec iov = { sp->staging, sp->staging_bytes };
	int r;

	if ((r = io_uring_queue_init(sp->qd, &sp->ring, 0)) < 0) {
		uring_why(-r, why, whylen);
		return r;
	}
	/* Before Linux 5.11 a wait with a timeout queues a timeout SQE of
	 * liburing's own: from the waiter's thread, beside the submitters, and
	 * its completion comes back among ours.  Not on such a kernel. */
	if (!(sp->ring.features & IORING_FEAT_EXT_ARG) || getenv("TQKVD_TEST_URING_OLD")) {
		snprintf(why, whylen, "io_uring is too old here (no IORING_FEAT_EXT_ARG: Linux >= 5.11 needed)");
		io_uring_queue_exit(&sp->ring);
		return -EOPNOTSUPP;
	}
	if ((r = io_uring_register_files(&sp->ring, &sp->fd, 1)) < 0 ||
	    (r = io_uring_register_buffers(&sp->ring, &iov, 1)) < 0) {
		if (r == -ENOMEM)
			uring_why(ENOMEM, why, whylen);
		else
			snprintf(why, whylen, "io_uring: registering the spill file and buffers: %s", strerror(-r));
		io_uring_queue_exit(&sp->ring);
		return r;
	}
	sp->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	sp->cq_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (sp->efd < 0 || sp->cq_efd < 0 || (r = io_uring_register_eventfd(&sp->ring, sp->cq_efd)) < 0) {
		r = sp->efd < 0 || sp->cq_efd < 0 ? -errno : r;
		snprintf(why, whylen, "io_uring: completion eventfd: %s", strerror(-r));
		io_uring_queue_exit(&sp->ring);
		return r;
	}
	return 0;
}

/* Create or reuse DIR/spill.dat (one tqkvd per spill_dir: main.c locks
 * it), at least its size, preallocated: 0 or -errno. */
static int open_file(struct spill *sp, uint64_t bytes, bool *direct, char *why, size_t whylen)
{
	struct statvfs vfs;
	struct stat sb;
	char have[32], need[32];

	/* not through a symbolic link, and a regular file only: the store
	 * writes where spill_dir says, never where a link left there points */
	const int flags = O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
	sp->fd = open(sp->path, flags | O_DIRECT, 0600);
	*direct = sp->fd >= 0;
	if (sp->fd < 0 && errno == EINVAL)
		sp->fd = open(sp->path, flags, 0600);
	if (sp->fd < 0) {
		int e = errno;
		snprintf(why, whylen, "%s: %s", sp->path,
			 e == ELOOP ? "is a symbolic link (set pool.spill_dir to the directory instead)" : strerror(e));
		return -e;
	}
	if (fstat(sp->fd, &sb) < 0 || fstatvfs(sp->fd, &vfs) < 0) {
		snprintf(why, whylen, "%s: %s", sp->path, strerror(errno));
		return -errno;
	}
	if (!S_ISREG(sb.st_mode)) {
		snprintf(why, whylen, "%s: not a regular file", sp->path);
		return -EINVAL;
	}
	/* O_NONBLOCK only kept a FIFO from blocking the open: io_uring
	 * would answer -EAGAIN for I/O on a non-blocking file */
	int fl = fcntl(sp->fd, F_GETFL);
	if (fl < 0 || fcntl(sp->fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
		snprintf(why, whylen, "%s: %s", sp->path, strerror(errno));
		return -errno;
	}
	/* What the file already holds counts toward the size. */
	uint64_t held = (uint64_t)sb.st_blocks * 512u;
	uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	if (bytes > held && bytes - held > avail) {
		tq_size_format_human(bytes, need, sizeof(need));
		tq_size_format_human(avail + held, have, sizeof(have));
		snprintf(why, whylen, "pool.spill_bytes is %s but the file system of %s has room for %s: "
			 "lower spill_bytes or free space", need, sp->path, have);
		return -ENOSPC;
	}
	/* TQKVD_TEST_NO_FALLOCATE: as on such a file system (tests) */
	if (getenv("TQKVD_TEST_NO_FALLOCATE") ? (errno = EOPNOTSUPP, 1) : fallocate(sp->fd, 0, 0, (off_t)bytes) < 0) {
		int e = errno;
		tq_size_format_human(bytes, need, sizeof(need));
		if (e != EOPNOTSUPP) {
			snprintf(why, whylen, "%s: preallocating %s: %s", sp->path, need, strerror(e));
			return -e;
		}
		/* a file system without preallocation (NFS before 4.2, some
		 * FUSE ones): the file gets its size, not its blocks; a spill
		 * that then finds the disk full fails, and its page stays in
		 * memory (nothing is lost) */
		if ((uint64_t)sb.st_size < bytes && ftruncate(sp->fd, (off_t)bytes) < 0) {
			e = errno;
			snprintf(why, whylen, "%s: sizing to %s: %s", sp->path, need, strerror(e));
			return -e;
		}
		log_warning("spill: %s: the file system cannot preallocate (fallocate: %s): the %s are not "
			    "reserved, and spills fail if it fills up", sp->path, strerror(e), need);
	}
	if ((uint64_t)sb.st_size > bytes) {
		/* never cut at start: pages of persistent sessions whose slots
		 * lie beyond are all that is left of them once recovery has set
		 * their manifests aside (ID.tqm.dropped, up to their last
		 * checkpoint): a start does not destroy them, an operator may */
		tq_size_format_human((uint64_t)sb.st_size, have, sizeof(have));
		tq_size_format_human(bytes, need, sizeof(need));
		log_warning("spill: %s is %s, more than the %s of pool.spill_bytes: the rest is left as it is, "
			    "unused (pages of persistent sessions set aside may lie there); to give the space back, "
			    "remove the file while tqkvd is stopped (persistent sessions are lost with it)", sp->path,
			    have, need);
	}
	return 0;
}

/* What spill_open set up, whatever it got to (no thread, no ring). */
static void spill_free(struct spill *sp)
{
	if (sp->fd >= 0)
		close(sp->fd);
	if (sp->efd >= 0)
		close(sp->efd);
	if (sp->cq_efd >= 0)
		close(sp->cq_efd);
	if (sp->staging && sp->staging_pinned && sp->unpin_staging)
		sp->unpin_staging(sp->copy_ctx, sp->staging);
	if (sp->staging)
		munmap(sp->staging, sp->staging_bytes);
	free(sp->bitmap);
	free(sp->inflight);
	free(sp->free_stage);
	pthread_mutex_destroy(&sp->lock);
	pthread_mutex_destroy(&sp->sq_lock);
	pthread_mutex_destroy(&sp->cq_lock);
	pthread_cond_destroy(&sp->cond);
	pthread_cond_destroy(&sp->done_cond);
	pthread_cond_destroy(&sp->reap_cond);
	free(sp);
}

int spill_open(struct spill **out, const struct spill_params *p, char *why, size_t whylen)
{
	struct spill *sp;
	bool direct;
	char uwhy[256] = "";
	int r;

	*out = NULL;
	if (!p->page_bytes || p->page_bytes % 4096) {
		snprintf(why, whylen, "spill: page size %u is not a multiple of 4 KiB", p->page_bytes);
		return -EINVAL;
	}
	sp = calloc(1, sizeof(*sp));
	if (!sp) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	sp->fd = -1;
	sp->efd = -1;
	sp->cq_efd = -1;
	pthread_mutex_init(&sp->lock, NULL);
	pthread_mutex_init(&sp->sq_lock, NULL);
	pthread_mutex_init(&sp->cq_lock, NULL);
	pthread_cond_init(&sp->cond, NULL);
	pthread_cond_init(&sp->done_cond, NULL);
	{
		pthread_condattr_t ca;
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&sp->reap_cond, &ca);
		pthread_condattr_destroy(&ca);
	}
	sp->give_up_ms = SUBMIT_GIVE_UP_MS;
	sp->page_bytes = p->page_bytes;
	sp->slot_bytes = (uint64_t)SPILL_HDR_BYTES + p->page_bytes;
	sp->n_slots = p->bytes / sp->slot_bytes;
	/* staging is registered (locked) memory: keep it under 8 MiB, the
	 * default RLIMIT_MEMLOCK, unless the caller asks for more */
	sp->qd = p->queue_depth ? p->queue_depth : (uint32_t)(((size_t)6 << 20) / sp->slot_bytes);
	if (!p->queue_depth)
		sp->qd = sp->qd < 2 ? 2 : sp->qd > DEFAULT_QD ? DEFAULT_QD : sp->qd;
	if ((size_t)snprintf(sp->path, sizeof(sp->path), "%s/%s", p->dir, SPILL_FILE) >= sizeof(sp->path)) {
		snprintf(why, whylen, "spill directory %.200s...: path too long", p->dir);
		r = -ENAMETOOLONG;
		goto fail;
	}
	if (sp->n_slots == 0) {
		snprintf(why, whylen, "pool.spill_bytes %" PRIu64 " holds no page of %" PRIu64 " bytes (with its header)",
			 p->bytes, sp->slot_bytes);
		r = -EINVAL;
		goto fail;
	}
	if ((r = open_file(sp, sp->n_slots * sp->slot_bytes, &direct, why, whylen)) < 0)
		goto fail;
	if (!(sp->bitmap = calloc((sp->n_slots + 63) / 64, sizeof(uint64_t))) ||
	    !(sp->inflight = calloc(sp->qd, sizeof(*sp->inflight))) ||
	    !(sp->free_stage = calloc(sp->qd, sizeof(*sp->free_stage)))) {
		snprintf(why, whylen, "out of memory");
		r = -ENOMEM;
		goto fail;
	}
	sp->staging_bytes = (size_t)sp->qd * sp->slot_bytes;
	sp->staging = mmap(NULL, sp->staging_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (sp->staging == MAP_FAILED) {
		sp->staging = NULL;
		snprintf(why, whylen, "spill staging buffers: %s", strerror(errno));
		r = -ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < sp->qd; i++)
		sp->free_stage[sp->n_free_stage++] = sp->qd - 1 - i;
	sp->page_copy = p->page_copy;
	sp->copy_ctx = p->copy_ctx;
	if (p->page_copy && p->pin_staging) {
		char pwhy[256];
		if (p->pin_staging(p->copy_ctx, sp->staging, sp->staging_bytes, pwhy, sizeof(pwhy)) == 0) {
			sp->staging_pinned = true;
			sp->unpin_staging = p->unpin_staging;
		} else {
			log_warning("spill: staging buffers not pinned for the GPU (%s): page copies are slower", pwhy);
		}
	}

	if (p->force_fallback)
		snprintf(uwhy, sizeof(uwhy), "forced by the caller (tests)");
	else if (!direct)
		snprintf(uwhy, sizeof(uwhy), "%s has no O_DIRECT (tmpfs?)", p->dir);
	else if (start_uring(sp, uwhy, sizeof(uwhy)) == 0)
		sp->uring = true;
	if (sp->uring) {
		snprintf(sp->engine, sizeof(sp->engine), "io_uring, O_DIRECT, %u in flight", sp->qd);
	} else if (p->allow_fallback || p->force_fallback) {
		snprintf(sp->engine, sizeof(sp->engine), "pread/pwrite%s (fallback: %s)",
			 direct ? ", O_DIRECT" : ", page cache", uwhy);
		log_warning("spill: %s; using pread/pwrite because pool.spill_fallback = yes: slower, "
			    "one I/O at a time", uwhy);
	} else {
		snprintf(why, whylen, "spill: %s; set pool.spill_fallback = yes to use pread/pwrite instead "
			 "(slower)", uwhy);
		r = direct ? -EOPNOTSUPP : -EINVAL;
		goto fail;
	}
	if ((r = pthread_create(&sp->thread, NULL, sp->uring ? uring_main : sync_main, sp)) != 0) {
		snprintf(why, whylen, "spill: cannot start the I/O thread: %s", strerror(r));
		r = -r;
		if (sp->uring) {
			io_uring_queue_exit(&sp->ring);
			sp->uring = false;
		}
		goto fail;
	}
	*out = sp;
	return 0;
fail:
	spill_free(sp);
	return r;
}

/* Waits for queued and running I/O, then closes. */
void spill_close(struct spill *sp)
{
	if (!sp)
		return;
	pthread_mutex_lock(&sp->sq_lock);
	sp->stop = true;
	pthread_cond_signal(&sp->cond);
	pthread_mutex_unlock(&sp->sq_lock);
	if (sp->uring)
		kick(sp->efd);
	pthread_join(sp->thread, NULL);
	if (sp->uring)
		io_uring_queue_exit(&sp->ring);
	spill_free(sp);
}
