/* persist.h — persistent sessions on disk: manifests and journals.
 *
 * A persistent session's pages live in spill slots (daemon/spill.h); what
 * makes them a session again after a restart is in spill_dir/sessions/:
 *
 *   ID.tqm   the manifest: the session record (id, tenant, owner, name,
 *            geometry, codecs, seed, K/V transform mode) and, per layer,
 *            its token count, the (slot, generation) of each page at the
 *            last checkpoint and its transform's frozen statistics
 *            (kernels/tq_xform.h: the pages hold transformed keys and
 *            values, useless without them).
 *            crc32c over the whole file; written to ID.tqm.tmp, fdatasync'ed,
 *            renamed over ID.tqm, the directory fsync'ed: a reader sees
 *            the old manifest or the new one, never a mix.
 *   ID.tqj   the journal: what happened since that checkpoint — appended
 *            tokens (their encoded K and V blocks, as the pages hold them),
 *            truncations and calibrations of a layer's transform — one
 *            checksummed record per operation,
 *            written before the operation completes.  Its header and each
 *            record carry the manifest's epoch: records of an older epoch
 *            are already in the manifest and are never replayed.
 *   ID.closed  "epoch N": the session was closed (or evicted) while an
 *            operation held it, and its files go when that ends; one
 *            found at a start means they did not, and they go then
 *            (unless the manifest is past epoch N + 1: persist_scan).
 *
 * Formats: 2 (this tqkvd writes it) adds the transform mode and the
 * per-layer statistics to the manifest and the XFORM record to the
 * journal; format 1 files (older tqkvd) still read, as sessions without
 * transforms.
 *
 * This module is the formats and the files, nothing else: it never touches
 * a page table (daemon/kvpersist.c does).  Everything read back is
 * untrusted and validated (sizes, counts, names, checksums) before use.
 */
#ifndef TQKVD_PERSIST_H
#define TQKVD_PERSIST_H

#include <stddef.h>
#include <stdint.h>

#include "session.h"

#define PERSIST_SUBDIR     "sessions"
#define PERSIST_MAN_MAGIC  0x314e414d564b5154ull   /* "TQKVMAN1" */
#define PERSIST_JNL_MAGIC  0x314c4e4a564b5154ull   /* "TQKVJNL1" */
#define PERSIST_REC_MAGIC  0x4345524au             /* "JREC"     */
#define PERSIST_FORMAT     3u                      /* written; 1 to 3 are read */
#define PERSIST_FORMAT_MIN 1u
#define PERSIST_MAN_HDR    256u                    /* fixed part of a manifest */
#define PERSIST_JNL_HDR    64u
#define PERSIST_REC_HDR    48u
#define PERSIST_SLOT_LOST  UINT64_MAX              /* a page whose copy failed its checks */
/* A journal record's payload is at most this (one append's K and V blocks
 * of one layer: a persistent session refuses a larger append, E2BIG). */
#define PERSIST_REC_MAX    ((uint32_t)32 << 20)
/* A layer's transform statistics are at most this many bytes (a 32-byte
 * header and five [n_kv_heads][head_dim] arrays of 4-byte entries: the K
 * centre, K scales, V mean, V scales and the K order of tq_xform.c;
 * test_persist checks the fullest mode against it); UINT64_MAX where that
 * does not fit (geometries read from a file are untrusted until checked). */
static inline uint64_t persist_xf_max(uint32_t n_kv_heads, uint32_t head_dim)
{
	uint64_t w = (uint64_t)n_kv_heads * head_dim;
	return w > (UINT64_MAX - 32) / 20 ? UINT64_MAX : 32 + 20 * w;
}

struct persist_page {
	uint64_t slot;            /* spill slot, or PERSIST_SLOT_LOST */
	uint64_t gen;             /* generation written in the slot's header */
};

struct persist_layer {
	uint32_t n_tokens;
	uint32_t n_pages;
	struct persist_page *pages;
	uint32_t xf_bytes;        /* the transform's statistics (tq_xf_blob_write); */
	uint8_t *xf;              /* 0 bytes, NULL: not calibrated                   */
};

struct persist_manifest {
	uint64_t id;
	char tenant[CONFIG_NAME_MAX];
	char name[CONFIG_NAME_MAX];
	uint32_t owner_uid;
	struct session_geom geom;
	uint64_t seed;
	uint64_t created_ms;
	uint32_t page_bytes;      /* the pool's page size when written */
	uint32_t layout_id;       /* TQ_PAGE_LAYOUT_ID */
	uint64_t slot_bytes;      /* the spill store's slot size */
	uint64_t epoch;           /* checkpoint number: journal records carry it */
	uint64_t gen_next;        /* page generations continue above this */
	uint32_t format;          /* the format decoded (encode writes PERSIST_FORMAT) */
	uint32_t page_tokens;     /* format 3: the session's tokens a page; 0 (always in
				   * formats 1 and 2, written before GPU pools cut pages
				   * to a multiple of 32 tokens): all that fit page_bytes */
	struct persist_layer *layers;  /* [geom.n_layers] */
	bool conflicts;           /* in memory only (recovery): pages lost to another's
				   * claim on their slot; checkpointed once restored */
};

enum persist_rec_type { PERSIST_REC_APPEND = 1, PERSIST_REC_TRUNCATE = 2, PERSIST_REC_XFORM = 3 };
#define PERSIST_ALL_LAYERS UINT32_MAX

/* A journal record's header (on disk little-endian, PERSIST_REC_HDR bytes).
 * APPEND: n tokens from `first` of `layer`; payload = their K blocks
 * [n][n_kv_heads] then their V blocks [n][n_kv_heads].  TRUNCATE: tokens
 * from `first` dropped from `layer` (or every layer: PERSIST_ALL_LAYERS);
 * no payload.  XFORM (format 2): `layer`, empty, was calibrated; payload =
 * its transform's statistics (tq_xf_blob_write), written before the APPEND
 * that brings the first tokens transformed by them; first = n = 0. */
struct persist_rec {
	uint32_t type;
	uint32_t layer;
	uint32_t first;
	uint32_t n;
	uint32_t payload_bytes;
	uint32_t seq;             /* 0, 1, 2, ... within an epoch */
	uint64_t epoch;
};

/* spill_dir/sessions, created if missing: an O_DIRECTORY fd or -errno. */
int persist_dir_open(const char *spill_dir, char *why, size_t whylen);

/* Encode m: a malloc'd buffer of *len bytes (NULL: out of memory). */
uint8_t *persist_manifest_encode(const struct persist_manifest *m, size_t *len);
/* Decode and validate a manifest's bytes (format 1 or 2): 0, or -EBADMSG /
 * -EPROTO (unknown format) / -ENOMEM with the reason.  *m owns its layers
 * and their statistics (persist_manifest_free).  Checks the encoding
 * only (a statistics length within PERSIST_XF_MAX of the geometry, none
 * without a transform mode): whether the pages fit the geometry, the
 * slots fit the store and the statistics parse is the caller's. */
int persist_manifest_decode(const uint8_t *buf, size_t len, struct persist_manifest *m,
			    char *why, size_t whylen);
void persist_manifest_free(struct persist_manifest *m);

/* Atomically replace ID.tqm (tmp, fdatasync, rename, fsync of the
 * directory): 0, or -errno with why (the old manifest stands), or 1 with
 * why: the new one is in place (a restart reads it) but the directory's
 * fsync failed, so a power loss may bring the old one back. */
int persist_manifest_write(int dirfd, const struct persist_manifest *m, char *why, size_t whylen);
/* Tests: the next n fsyncs of the directory after a manifest's rename fail
 * with EIO; the next n manifest reads fail with EIO. */
void persist_fault_dirsync(uint32_t n);
void persist_fault_manifest_read(uint32_t n);
/* Read and decode ID.tqm. */
int persist_manifest_read(int dirfd, uint64_t id, struct persist_manifest *m, char *why, size_t whylen);
/* Remove ID.tqm, ID.tqj and ID.closed (a closed session): 0 or -errno
 * (also when the directory could not be synced after the manifest went: a
 * crash could bring it back, so its slots must stay used). */
int persist_remove(int dirfd, uint64_t id);
/* Keep a session that could not be used for the operator: ID.tqm ->
 * ID.tqm.dropped and ID.tqj -> ID.tqj.dropped (renamed back, on a
 * configuration that fits, the next start takes it back). */
void persist_set_aside(int dirfd, uint64_t id);

/* Mark `id` closed (ID.closed: "epoch N", N its manifest's epoch, synced
 * with the directory): a session closed or evicted while an operation
 * holds it, whose files go when that ends.  A restart finds the mark and
 * removes the files (persist_scan), so the session never comes back;
 * persist_remove takes the mark away last.  0, or -errno with why. */
int persist_mark_closed(int dirfd, uint64_t id, uint64_t epoch, char *why, size_t whylen);

struct persist_scan_info {
	uint32_t removed;     /* leftovers of interrupted writes (*.tmp), journals without a manifest */
	uint32_t closed;      /* sessions marked closed (ID.closed): their files removed */
	uint32_t closed_kept; /* others marked closed whose files could not be removed (not listed;
			       * tried again at the next start) */
	uint32_t marks_stale; /* marks removed, their sessions listed: the manifest is more than one
			       * checkpoint past the mark's epoch (the one in flight at the close may
			       * finish), so the session went on (a tqkvd that ignores marks ran it) */
	uint64_t max_aside;   /* the highest id of a session set aside (ID.tqm.dropped,
			       * ID.tqj.dropped) or marked closed, 0 if none: no new
			       * session may take it (renamed back, or its mark found
			       * at the next start, its files would replace or remove
			       * the new one's) */
};
/* Ids that have a manifest and no closed mark (but a stale one),
 * ascending (*ids malloc'd); the rest in *info. */
int persist_scan(int dirfd, uint64_t **ids, size_t *n, struct persist_scan_info *info);

/* ---- journal ---------------------------------------------------------------- */
/* Create or empty ID.tqj and write its header for epoch: an fd (the
 * journal's end is at PERSIST_JNL_HDR) or -errno with why. */
int persist_journal_reset(int dirfd, uint64_t id, uint64_t epoch, char *why, size_t whylen);
/* Write one record at *off (header + the payload in two parts), then
 * advance *off: 0 or -errno (nothing is considered written then). */
int persist_journal_write(int fd, uint64_t *off, const struct persist_rec *r, const void *p1, size_t n1,
			  const void *p2, size_t n2);

/* Replay: fn is called for each record of `epoch`, in order, with its
 * verified payload; a nonzero return stops the replay (and is returned).
 * Stops quietly at the end, at a torn or damaged record (*why says which
 * and where) or at a record of another epoch.  *n_records: records
 * replayed.  -ENOENT when there is no journal. */
typedef int (*persist_replay_fn)(void *ctx, const struct persist_rec *r, const uint8_t *payload);
int persist_journal_replay(int dirfd, uint64_t id, uint64_t session_id, uint64_t epoch, persist_replay_fn fn,
			   void *ctx, uint32_t *n_records, char *why, size_t whylen);
/* The same over a journal's bytes in memory (fuzzing, tests). */
int persist_journal_replay_buf(const uint8_t *buf, size_t len, uint64_t session_id, uint64_t epoch,
			       persist_replay_fn fn, void *ctx, uint32_t *n_records, char *why, size_t whylen);

#endif
