/* kvpersist.h — persistent sessions: what makes a session survive a
 * restart, clean or SIGKILL.
 *
 * A persistent session's pages are copied to spill slots as they fill
 * (write-through, asynchronous); every append and truncation is written to
 * the session's journal (daemon/persist.h) before it completes, so a
 * SIGKILLed daemon loses nothing it acknowledged; a checkpoint — every
 * pool.checkpoint_interval while the session changes, on `tqctl checkpoint`,
 * at clean shutdown, and when a journal passes KVP_JOURNAL_CHECKPOINT
 * bytes — writes the pages that have no current copy, fdatasyncs the spill
 * file, replaces the manifest atomically and starts an empty journal.  A
 * power loss loses at most what came after the last checkpoint.
 *
 * Slots a manifest on disk may still name are never reused before a newer
 * manifest stops naming them (they are freed after the next checkpoint).
 *
 * A layer's K/V transform (kernels/tq_xform.h) is part of its state: the
 * pages hold transformed keys and values.  Its statistics are journaled
 * when the layer calibrates (before the append that uses them) and written
 * into every manifest; a layer restored without tokens is uncalibrated, as
 * a truncation to 0 leaves it.
 *
 * At start, kvstore_recover() reads every manifest, claims its slots,
 * re-creates the session under its id (state: spilled, restored on first
 * use; detached, so its owner re-attaches by id or by (tenant, name)),
 * replays its journal, and checkpoints what the journal added.  Anything
 * that does not check out is dropped with the reason in the log; the
 * manifest is kept aside as ID.tqm.dropped.
 */
#ifndef TQKVD_KVPERSIST_H
#define TQKVD_KVPERSIST_H

#include <stdint.h>

#include "dataop.h"
#include "persist.h"
#include "session.h"
#include "tenant.h"

/* A journal this large asks for a checkpoint at once. */
#define KVP_JOURNAL_CHECKPOINT ((uint64_t)64 << 20)

struct kvpersist_stats {
	uint32_t sessions;            /* persistent sessions with page tables       */
	uint64_t checkpoints;         /* manifests written                          */
	uint64_t checkpoint_failures;
	uint64_t journal_records, journal_bytes; /* written since start           */
	uint64_t restored, dropped;   /* at the last start                          */
};

/* Persistence for ks (its spill tier set): spill_dir/sessions.  0 or
 * -errno with why. */
int kvstore_persist_open(struct kvstore *ks, const char *spill_dir, uint64_t interval_ms, char *why,
			 size_t whylen);
void kvstore_persist_set_interval(struct kvstore *ks, uint64_t interval_ms);
/* Rebuild the persistent sessions found on disk (before any client can
 * connect).  Logs each one and a summary; *max_id: the largest id seen. */
int kvstore_recover(struct kvstore *ks, struct session_table *st, struct tenant_table *tt, uint64_t *max_id);
/* The checkpoint thread (every interval, for sessions that changed). */
int kvstore_persist_start(struct kvstore *ks, struct session_table *st);
/* Clean shutdown: stop the thread, checkpoint every persistent session;
 * sessions released after this keep their files. */
void kvstore_persist_stop(struct kvstore *ks, struct session_table *st);
void kvstore_persist_close(struct kvstore *ks);
void kvstore_persist_stats(struct kvstore *ks, struct kvpersist_stats *out);
/* Fault injection (tests): the next n transform statistics recovery loads
 * fail for want of memory (-ENOMEM). */
void kvstore_fault_xf_new(uint32_t n);
/* Can ks keep persistent sessions? */
bool kvstore_persist_enabled(struct kvstore *ks);

/* A new persistent session: its first manifest and an empty journal, so
 * it exists on disk before its open is answered.  0 or -errno with why. */
int dataop_persist_init(struct kvstore *ks, struct session *s, char *why, size_t whylen);
/* Checkpoint s now (a no-op when nothing changed): 0 or -errno with why;
 * -EINVAL: s is not persistent. */
int dataop_checkpoint(struct kvstore *ks, struct session *s, char *why, size_t whylen);

/* ---- dataop.c's hooks (kv->lock held) ----------------------------------------- */
struct kv_sess;
struct dataop_res;
int kvp_sess_new(struct kvstore *ks, struct kv_sess *kv);
void kvp_sess_free(struct kvstore *ks, struct kv_sess *kv);
/* Closed or evicted while an operation holds it (kvstore_ending; kv NULL
 * when its KV state is not made yet): a persistent session's files are
 * marked closed before that is answered (persist_mark_closed). */
void kvp_sess_ending(struct kvstore *ks, struct session *s, struct kv_sess *kv);
void kvp_defer_free(struct kv_sess *kv, uint64_t slot);
/* Before an append changes anything: the journal is open (after a failed
 * journal write, a checkpoint makes a new one).  0, or an error in r.  The
 * records the append then writes never checkpoint: a checkpoint in the
 * middle of an append would copy its half-changed tail page and call the
 * page clean with fewer tokens than the layer is about to count. */
int kvp_journal_open(struct kvstore *ks, struct session *s, struct kv_sess *kv, struct dataop_res *r);
/* Journal tokens [first, first + n) of layer l, already encoded in its
 * pages (L->pages holds the new ones already): 0, or an error in r. */
int kvp_journal_append(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l, uint32_t first,
		       uint32_t n, struct dataop_res *r);
/* Layer l's transform was just calibrated (by the append about to bring
 * its first tokens): journal its statistics, before that append's record.
 * 0, or an error in r (the caller then makes the layer uncalibrated again
 * and fails the append). */
int kvp_journal_xform(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t l, struct dataop_res *r);
int kvp_journal_truncate(struct kvstore *ks, struct session *s, struct kv_sess *kv, uint32_t layer, uint64_t pos,
			 struct dataop_res *r);
/* Start copying the full pages [from, to) of layer l that have no copy. */
void kvp_write_through(struct kvstore *ks, struct kv_sess *kv, uint32_t l, uint32_t from, uint32_t to);
/* Wait for the write-through in flight and take its results. */
void kvp_wt_collect(struct kvstore *ks, struct kv_sess *kv);

#endif
