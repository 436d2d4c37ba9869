/* ring.h — the data-path server: shared-memory rings over unix:<run_dir>/data.sock.
 *
 * Threads (all owned here):
 *   ring-ctl      accepts connections, runs the handshake (version, SO_PEERCRED
 *                 uid, the client's sealed memfd by SCM_RIGHTS), watches every
 *                 data socket for EOF and frees finished clients;
 *   ring-client   one per connection: waits on the SQ doorbell (adaptive spin,
 *                 then futex), copies each SQE out of shared memory, validates
 *                 it against that client's arena and attached sessions, answers
 *                 NOP / ATTACH / DETACH and bad SQEs itself, and queues the rest
 *                 on the session's FIFO;
 *   ring-worker   N of them: run the FIFO of one session at a time (so one
 *                 session's operations run in submission order, different
 *                 sessions in parallel), post the CQE, ring the client's
 *                 doorbell.
 *
 * Trust: nothing in a client's shared memory is trusted (docs/ARCHITECTURE-
 * datapath.md).  A client's mistakes complete its own SQEs with an error
 * (logged once per client, rate-limited); a corrupted index stops that ring;
 * the socket's EOF drops the client's queued work, closes its ephemeral
 * sessions and unmaps its memory.
 *
 * ring_server_new / ring_server_free are called from the main thread;
 * ring_server_stats from any thread.
 */
#ifndef TQKVD_RING_H
#define TQKVD_RING_H

#include <stddef.h>
#include <stdint.h>

#include "dataop.h"
#include "session.h"
#include "tqkv_ring.h"

struct ring_server;

struct ring_params {
	const char *run_dir;       /* data.sock is created here (0660 by umask)       */
	uint32_t n_workers;        /* 1 .. 256                                        */
	uint32_t attn_threads;     /* attention threads per worker (1: none extra)    */
	uint32_t max_clients;      /* connections at once                             */
	uint32_t spin_us;          /* longest adaptive spin before a futex sleep      */
};

struct ring_stats {
	uint32_t clients;                 /* connected now                     */
	uint64_t clients_total;           /* accepted since start              */
	uint64_t handshakes_failed;
	uint64_t ops_total;               /* completed SQEs                    */
	uint64_t op_errors_total;         /* of which res < 0                  */
	uint64_t ops_dropped;             /* queued work of departed clients   */
	uint64_t rings_broken;            /* corrupted indices                 */
	uint64_t sessions_closed_on_eof;  /* ephemeral sessions closed         */
	uint64_t arena_bytes;             /* mapped client memory now          */
};

/* Binds <run_dir>/data.sock and starts the threads.  0, or a negative
 * errno with why set. */
int ring_server_new(struct ring_server **out, const struct ring_params *p,
		    struct session_table *st, struct kvstore *ks, char *why, size_t whylen);
/* Stops accepting, marks every ring SHUTDOWN, finishes the operations that
 * are running, drops the queued ones, closes ephemeral sessions, joins. */
void ring_server_free(struct ring_server *rs);
void ring_server_stats(struct ring_server *rs, struct ring_stats *out);

#endif
