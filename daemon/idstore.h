/* idstore.h — session ids that never repeat, across restarts and crashes.
 *
 * A client that remembers a session id (a worker re-attaching after its
 * own crash, say) must never reach another conversation's K/V because the
 * daemon restarted and handed the same number out again.  The session
 * table hands ids out in increasing order; before it passes the last
 * reserved id it asks this store to persist a new high-water mark
 * (`reserved_through`), in blocks of SESSION_ID_BLOCK, so the file is
 * written once per block, and a daemon that starts again — after a clean
 * stop or a SIGKILL — continues after the mark.
 *
 * The file is DIR/session-ids (DIR: the spill directory, which persists
 * across restarts; /run does not), a line of text:
 *   tqkvd session-ids 1 reserved_through=N
 * replaced atomically (write a temporary file, fsync, rename, fsync the
 * directory).  A file that exists but cannot be read is an error at start:
 * guessing could hand a remembered id to someone else.
 *
 * Not thread-safe by itself: the session table calls idstore_reserve under
 * its lock.
 */
#ifndef TQKVD_IDSTORE_H
#define TQKVD_IDSTORE_H

#include <stddef.h>
#include <stdint.h>

#define IDSTORE_FILE "session-ids"

struct idstore;

/* Open (or create) DIR/session-ids: 0 and *first_id (the first id this
 * run may hand out: 1 on a fresh directory), or a negative errno with why. */
int idstore_open(struct idstore **out, const char *dir, uint64_t *first_id, char *why, size_t whylen);
/* Persist that ids up to `through` may be handed out (a session_reserve_fn). */
int idstore_reserve(void *is, uint64_t through, char *why, size_t whylen);
void idstore_close(struct idstore *is);

#endif
