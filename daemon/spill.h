/* spill.h — the spill store: pool pages on local NVMe, in one preallocated
 * file, through io_uring.
 *
 * The store knows slots, not sessions: a slot holds one pool page behind a
 * 4 KiB header (struct spill_page_hdr) that names what the page is (session,
 * layer, page index, generation, layout, codecs, seed, token count) and
 * carries a crc32c of the header and the payload.  A read verifies all of
 * it against what the caller expects; a page that fails is never handed
 * out (-EBADMSG, the reason names the file, the offset and what failed).
 *
 * File: DIR/spill.dat, mode 0600, preallocated with fallocate to
 * spill_bytes (whole slots) at start, checked against the file system's
 * free space first, so a write never meets a full disk later.  Opened
 * O_DIRECT: slot offsets and the staging buffers are 4 KiB aligned, pages
 * never pass through the page cache.
 *
 * Engine: an io_uring with the file registered (IOSQE_FIXED_FILE) and a
 * staging area registered as fixed buffers (one staging slot per queue
 * entry: header + page; at most 64 entries and under 8 MiB, the default
 * RLIMIT_MEMLOCK).  No thread sits between a caller and the disk: the
 * submitting thread stages its request (a write's copy + crc) and submits
 * it itself; a request that finds every staging slot busy waits in a queue
 * that each completion drains.  Completions are reaped by whoever waits:
 * a thread in spill_wait (or the _sync calls) drives the ring — it sleeps
 * in io_uring_enter and is woken by the kernel itself, reaps, and runs the
 * callbacks of every completion it finds, its own and others' — and the
 * store's I/O thread reaps the rest (read-ahead, write-through) when
 * nobody waits, woken by the ring's completion eventfd.  So a single-page
 * restore costs one wake-up, as a program doing its own I/O would.  A
 * write copies the page into staging when it is submitted (or leaves the
 * queue), so the page may change again once its callback ran; a read
 * lands in staging, is verified, then copied out.  When io_uring is not
 * available (kernel, seccomp, io_uring_disabled, memlock) or the file
 * system has no O_DIRECT (tmpfs), spill_open fails and says exactly which
 * — unless params.allow_fallback, when the I/O thread does pread/pwrite
 * one request at a time instead and the start-up log says so (slower;
 * never silent).
 *
 * Thread-safe: any thread may allocate slots and submit.
 */
#ifndef TQKVD_SPILL_H
#define TQKVD_SPILL_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "crc32c.h"

#define SPILL_FILE      "spill.dat"
#define SPILL_MAGIC     0x314c5053564b5154ull   /* "TQKVSPL1" on disk */
#define SPILL_FORMAT    1u
#define SPILL_HDR_BYTES 4096u                   /* one O_DIRECT block */

/* On disk, little-endian, at the start of the slot's 4 KiB header block. */
struct spill_page_hdr {
	uint64_t magic;           /* SPILL_MAGIC                                  */
	uint32_t format;          /* SPILL_FORMAT                                 */
	uint32_t hdr_bytes;       /* SPILL_HDR_BYTES                              */
	uint32_t layout_id;       /* TQ_PAGE_LAYOUT_ID of the payload             */
	uint32_t payload_bytes;   /* the pool's page size                         */
	uint64_t session_id;
	uint64_t generation;      /* the writer's count: a stale copy never fits  */
	uint64_t rotation_seed;
	uint32_t layer;
	uint32_t page_index;      /* in the layer's page table                    */
	uint32_t n_tokens;        /* tokens in this page                          */
	uint8_t k_codec, v_codec; /* enum tq_codec_id                             */
	uint16_t reserved0;
	uint32_t crc32c;          /* header (this field 0) + payload              */
	uint32_t reserved[3];
};
static_assert(sizeof(struct spill_page_hdr) == 80, "spill header layout");

/* The header a write puts in front of payload (page_bytes): magic,
 * format, sizes, layout and crc32c filled in, the names (session, layer,
 * page, generation, …) as the caller set them.  A pure function. */
void spill_hdr_seal(struct spill_page_hdr *h, const void *payload, uint32_t page_bytes);
/* The checks a read makes (fuzzed by tests/fuzz/fuzz_spillhdr.c): the
 * header's first sizeof(struct spill_page_hdr) bytes, as read from disk,
 * and the payload (page_bytes) against what the reader expects (only
 * session_id, layer, page_index and generation of e are looked at, and
 * n_tokens: the page must hold at least that many).  0:
 * the page is the one expected, sealed by spill_hdr_seal and unchanged
 * since; else -EBADMSG with why.  A pure function. */
int spill_hdr_check(const void *hdr_bytes, const void *payload, uint32_t page_bytes,
		    const struct spill_page_hdr *e, char *why, size_t whylen);

struct spill_params {
	const char *dir;
	uint64_t bytes;           /* capacity; rounded down to whole slots        */
	uint32_t page_bytes;      /* payload per slot: the pool's page size       */
	uint32_t queue_depth;     /* I/Os in flight (0: 32)                       */
	bool allow_fallback;      /* pread/pwrite when io_uring/O_DIRECT fail     */
	bool force_fallback;      /* tests: pread/pwrite even where io_uring works */
	/* Pages outside host memory (a discrete GPU's pool): every request goes
	 * through the staging area, and page_copy moves a page's bytes between
	 * the pool and staging (synchronously: 0, or a negative errno with why;
	 * the request then fails with it — a write's slot is left invalid, a
	 * read hands nothing out).  pin_staging, if set, pins the staging area
	 * for the copies' DMA (a failure is not fatal: the copies are slower),
	 * unpin_staging undoes it at close.  NULL page_copy: pages are host
	 * memory (memcpy; block-aligned pages are the I/O buffers themselves). */
	int (*page_copy)(void *ctx, void *dst, const void *src, size_t n, char *why, size_t whylen);
	int (*pin_staging)(void *ctx, void *buf, size_t n, char *why, size_t whylen);
	void (*unpin_staging)(void *ctx, void *buf);
	void *copy_ctx;
};

struct spill_stats {
	uint64_t slots_total, slots_used;
	uint64_t slot_bytes;
	uint32_t queue_depth;     /* I/Os the engine keeps in flight at most     */
	uint64_t bytes_written, bytes_read;
	uint64_t writes, reads;
	uint64_t io_errors;       /* failed reads and writes (I/O errors)         */
	uint64_t retries;         /* I/Os submitted again after a transient       */
	                          /* failure (-EAGAIN, -EINTR, -ECANCELED, short) */
	uint64_t crc_failures;    /* pages whose checks failed: never served      */
	uint64_t submit_failures; /* io_uring_submit calls that failed (retried)  */
	bool stopped;             /* they failed for 10 s: the store stopped, its */
	                          /* I/O fails (until tqkvd restarts)             */
	uint64_t read_p50_us, read_p99_us; /* of the last 1024 reads              */
};

struct spill;

/* Open the store (creating and preallocating the file): 0, or a negative
 * errno with why set (what failed and what to do about it). */
int spill_open(struct spill **out, const struct spill_params *p, char *why, size_t whylen);
void spill_close(struct spill *sp);
/* "io_uring, O_DIRECT" or "pread/pwrite (fallback: <why>)". */
const char *spill_engine(const struct spill *sp);
const char *spill_path(const struct spill *sp);
void spill_stats(struct spill *sp, struct spill_stats *out);

/* The header block of a slot, read now (pread; recovery): 0, or -ERANGE,
 * -errno, -EBADMSG (not a spilled page's header).  Its crc covers the
 * page too: only a full read (spill_read) checks it. */
int spill_read_hdr(struct spill *sp, uint64_t slot, struct spill_page_hdr *out);
/* A free slot: 0, or -ENOSPC when the store is full. */
int spill_slot_alloc(struct spill *sp, uint64_t *slot);
void spill_slot_free(struct spill *sp, uint64_t slot);
/* Recovery: mark a slot a persistent session's manifest names as used:
 * 0, -ERANGE (beyond the store) or -EEXIST (claimed already). */
int spill_slot_claim(struct spill *sp, uint64_t slot);
/* Make every completed write durable (fdatasync of spill.dat): 0 or
 * -errno.  O_DIRECT puts the bytes on the device; the extents' metadata
 * (preallocated space becomes written space) needs this. */
int spill_sync(struct spill *sp);

/* Completion: res 0 or a negative errno (-EIO, -EBADMSG: the page failed
 * its checks), why says what happened (file, offset, reason) when res < 0.
 * Runs on whichever thread reaps — one waiting in spill_wait (anyone's),
 * or the I/O thread: keep it short, take only locks nothing holds while
 * calling into the store, never wait on the store from it. */
typedef void (*spill_done_fn)(void *ctx, int res, const char *why);

/* flags: SPILL_BACKGROUND — nobody will wait for it soon (read-ahead,
 * write-through): the I/O thread submits it, so the kernel's completion
 * work (run in the submitter's context) does not interrupt a thread that
 * is busy computing.  Without it the calling thread submits at once. */
#define SPILL_BACKGROUND 1u

/* Write page (payload_bytes) to slot with hdr (crc computed here).  page
 * must stay unchanged until fn runs.  0 if queued (fn will run), or a
 * negative errno at once (fn will not run).  A block-aligned page (4 KiB:
 * every pool page) is itself the I/O buffer; any other goes through the
 * store's staging buffers. */
int spill_write(struct spill *sp, uint64_t slot, const struct spill_page_hdr *hdr, const void *page,
		spill_done_fn fn, void *ctx, unsigned flags);
/* Read slot into page after checking it against expect (magic, format,
 * layout, size, session, layer, page index, generation, crc).  When the
 * read fails, page's bytes are unspecified (a block-aligned page is read
 * into directly): never use them. */
int spill_read(struct spill *sp, uint64_t slot, const struct spill_page_hdr *expect, void *page,
	       spill_done_fn fn, void *ctx, unsigned flags);
/* Wait until done(arg) is true, done turning true in the callbacks of
 * requests already submitted: drives the ring from this thread meanwhile
 * (see Engine above).  done is called often, from this thread only. */
void spill_wait(struct spill *sp, bool (*done)(void *arg), void *arg);
/* The same, waiting for the result; why (may be NULL) gets the reason. */
int spill_write_sync(struct spill *sp, uint64_t slot, const struct spill_page_hdr *hdr, const void *page,
		     char *why, size_t whylen);
int spill_read_sync(struct spill *sp, uint64_t slot, const struct spill_page_hdr *expect, void *page,
		    char *why, size_t whylen);

/* Fault injection (tests): the nth write (or read) submitted from now —
 * counting every submission, those after a transient failure too —
 * completes with err (-EIO, -ENOSPC, ...; -ECANCELED, -EINTR, -EAGAIN:
 * submitted again) whatever the disk did.  nth 0 disarms. */
enum spill_fault { SPILL_FAULT_WRITE, SPILL_FAULT_READ };
void spill_fault_arm(struct spill *sp, enum spill_fault kind, uint64_t nth, int err);
/* The same for `count` submissions in a row from the nth on. */
void spill_fault_arm_n(struct spill *sp, enum spill_fault kind, uint64_t nth, uint64_t count, int err);
/* io_uring_submit fails (tests): the next `count` calls fail with err
 * without entering the kernel (UINT64_MAX: every one), and the store stops
 * after give_up_ms of failures in a row (0: the default, 10 s).  The
 * io_uring engine only. */
void spill_fault_submit(struct spill *sp, uint64_t count, int err, uint32_t give_up_ms);
/* A slow disk (tests): every I/O completes at least us microseconds after
 * it was submitted; 0 restores full speed. */
void spill_fault_delay(struct spill *sp, uint32_t us);

/* Called once a second (main thread): is spill.dat still the file we hold
 * open, in a directory we can write?  Logs once when that changes (the
 * directory removed, replaced or made read-only): spilled pages stay
 * readable through the open file, but the operator must know.  Returns 0,
 * or -ENOENT / -EROFS / -EACCES while the condition lasts. */
int spill_check(struct spill *sp);
/* The store has stopped (io_uring_submit failed for 10 s in a row): -EIO
 * with why, else 0. */
int spill_stopped(struct spill *sp, char *why, size_t whylen);

/* crc32c (Castagnoli) of n bytes, continuing from crc (0 to start). */
#define spill_crc32c tq_crc32c

#endif
