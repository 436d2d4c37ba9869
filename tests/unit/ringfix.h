/* ringfix.h — the data path's server in-process, and raw ring access, for
 * the unit tests that talk to the ring (test_ring, test_hostile).
 *
 * srv_*: the real ring server, workers, dataop, pool, session and tenant
 * modules in this process, on a fresh temporary run directory; tenants
 * "big" (64 MiB) and "small" (1 MiB), both open to every uid; pool pages
 * of RINGFIX_PAGE_BYTES.
 *
 * raw_*: a client that drives the ring directly through proto/tqkv_ring.h,
 * the way a hostile one would: no libtqkv, every field its own choice.
 */
#ifndef TQKVD_TEST_RINGFIX_H
#define TQKVD_TEST_RINGFIX_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "dataop.h"
#include "pool.h"
#include "ring.h"
#include "session.h"
#include "tenant.h"
#include "tq_codec.h"
#include "tqkv_ring.h"

#define RINGFIX_PAGE_BYTES (8u << 10)   /* small pages: the tests cross page boundaries */

struct srv {
	char dir[64];
	struct config cfg;
	struct tenant_table *tt;
	struct pool *pool;
	tq_cache *cache;
	struct kvstore *ks;
	struct session_table *st;
	struct ring_server *rs;
};

/* The next srv_start's pool backend (NULL: host memory). */
extern const struct backend_ops *srv_backend;

/* A pool of pool_bytes, `workers` workers, max_clients 16.  0 or -1. */
int srv_start(struct srv *s, uint64_t pool_bytes, uint32_t workers);
void srv_stop(struct srv *s);
/* Wait (up to 5 s) until the daemon has let go of every client and page. */
int srv_wait_idle(struct srv *s);

struct raw {
	int fd;
	int memfd;                 /* kept only with RAW_KEEPFD (else -1) */
	uint8_t *map;
	size_t bytes;
	struct tqkv_ring_hdr *hdr;
	struct tqkv_sqe *sq;
	struct tqkv_cqe *cq;
	uint8_t *arena;
	uint64_t arena_off;        /* the arena's offset in the memfd */
	uint32_t sqn, cqn, tail, head;
	uint64_t arena_bytes;
	struct tqkv_welcome w;
};

enum {
	RAW_OK = 0, RAW_NOSEAL = 1, RAW_BADMAGIC = 2, RAW_BADVER = 4, RAW_BADSIZE = 8,
	RAW_KEEPFD = 16,           /* keep the memfd open in r->memfd */
};

/* Connect to dir's data.sock with a ring of sqn/cqn entries and an arena
 * of `arena` bytes (`how`: RAW_* flags).  The welcome's res (0 or a
 * negative errno; its message in r->w.msg), or a negative errno of our own. */
int raw_connect(struct raw *r, const char *dir, uint32_t sqn, uint32_t cqn, uint64_t arena, int how);
void raw_close(struct raw *r);
/* Publish one SQE and ring the doorbell (no check for room). */
void raw_submit(struct raw *r, const struct tqkv_sqe *e);
/* The next CQE within 3 s: 0, or -ETIMEDOUT. */
int raw_reap(struct raw *r, struct tqkv_cqe *out);
/* Submit one SQE and return its CQE's status (res in *res); -1000 when
 * no CQE came, -1001 when another SQE's did. */
int raw_op(struct raw *r, const struct tqkv_sqe *e, int *res);
/* Open a raw client (SQ 8, CQ 16, 1 MiB arena) and attach `id` (0 =
 * none): ATTACH's status, 0 with no id, -1 when the connection failed. */
int raw_attach(struct raw *r, struct srv *s, uint64_t id, int ephemeral);

#endif
