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
 * Trust: nothing in a client's shared memory is trusted (docs/ARCHITECTURE.md
 * §5, "Trust model").  A client's mistakes complete its own SQEs with an error
 * (logged once per client, rate-limited); a corrupted index stops that ring;
 * the socket's EOF drops the client's queued work, closes its ephemeral
 * sessions and unmaps its memory.
 *
 * ring_server_new / ring_server_free are called from the main thread;
 * ring_server_stats from any thread.
 */
#ifndef TQKVD_RING_H
#define TQKVD_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dataop.h"
#include "session.h"
#include "tqkv_ring.h"

struct ring_server;

struct ring_params {
	const char *run_dir;       /* data.sock is created here, mode 0660            */
	gid_t sock_gid;            /* group of data.sock; (gid_t)-1: the daemon's     */
	uint32_t n_workers;        /* 1 .. 256                                        */
	uint32_t attn_threads;     /* attention threads per worker (1: none extra)    */
	uint32_t max_clients;      /* connections at once                             */
	uint32_t max_clients_per_uid; /* connections of one uid at once (0: max_clients) */
	uint64_t max_arena_per_uid;   /* ring bytes one uid may map (0: no cap)        */
	uint32_t max_workers_per_uid; /* workers one uid's ops may hold (0: no cap)    */
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
	uint64_t ops_run;                 /* ops a worker ran (not NOP/ATTACH,  */
					  /* which the ring thread answers)    */
	uint64_t op_queue_us;             /* their time queued for a worker     */
	uint64_t op_run_us;               /* their time in a worker             */
};

/* Binds <run_dir>/data.sock and starts the threads.  0, or a negative
 * errno with why set. */
int ring_server_new(struct ring_server **out, const struct ring_params *p,
		    struct session_table *st, struct kvstore *ks, char *why, size_t whylen);
/* Stops accepting, marks every ring SHUTDOWN, finishes the operations that
 * are running, drops the queued ones, closes ephemeral sessions, joins. */
void ring_server_free(struct ring_server *rs);
void ring_server_stats(struct ring_server *rs, struct ring_stats *out);
/* New connection limits (a reload); connections already made stay. */
void ring_server_set_limits(struct ring_server *rs, uint32_t max_clients, uint32_t max_clients_per_uid,
			    uint64_t max_arena_per_uid);
/* How many workers one uid's operations may hold at once (a reload); 0: no
 * cap.  Without a cap, a uid holding all workers but one still does not get
 * the last while another uid's session waits. */
void ring_server_set_worker_share(struct ring_server *rs, uint32_t max_workers_per_uid);
/* Attach session `id` (just opened by `uid` over the control channel) to
 * the live data connection `client_id` of the same uid, as ATTACH does but
 * in the caller's step (OpenSession with data_client): from here on the
 * connection's end closes the session unless `detached`.  0, or -ENOENT
 * (no such live connection), -EPERM (another uid's), -ESHUTDOWN (it is
 * ending), -EBUSY (the session is attached already), -EUSERS (too many
 * sessions on it), -ENOMEM. */
int ring_server_bind(struct ring_server *rs, uint64_t client_id, uid_t uid, uint64_t id,
		     const struct session_geom *g, bool detached);

/* ---- the checks on what a client sends (pure functions; fuzzed by
 * tests/fuzz/fuzz_sqe.c and fuzz_hello.c) ---------------------------------- */

/* One SQE (the daemon's private copy) against the client's arena of
 * arena_bytes and g, the geometry of the session it names when that
 * session is attached to this connection (NULL: it is not).  TQKV_ST_OK,
 * or the status to complete it with (*detail set where one applies), in
 * this order: reserved words, opcode, attachment, the op's unused fields,
 * dtype, layer, counts, then each region.  An accepted APPEND / ATTEND /
 * APPEND_ATTEND has every region ([k|v]_off, q_off, pos_off, out_off with
 * their lengths from the counts, g and dtype) inside [0, arena_bytes) and
 * aligned to its element size.  g must satisfy session_geom_check. */
uint32_t ring_sqe_check(const struct tqkv_sqe *e, uint64_t arena_bytes, const struct session_geom *g,
			uint32_t *detail);
/* The hello of n bytes (n_fds passed with it; ctrunc: the control data
 * was cut): 0 and the ring's layout in *lay, or -EPROTO,
 * -EPROTONOSUPPORT, -EINVAL with why. */
int ring_hello_check(const struct tqkv_hello *h, size_t n, size_t n_fds, bool ctrunc,
		     struct tqkv_ring_layout *lay, char *why, size_t whylen);
/* The passed fd's st_mode, st_size and F_GET_SEALS (< 0: none) against
 * the hello's total_bytes: 0, or -EINVAL with why. */
int ring_memfd_check(uint32_t mode, uint64_t size, int seals, uint64_t total_bytes, char *why, size_t whylen);

#endif
