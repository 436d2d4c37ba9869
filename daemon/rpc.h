/* rpc.h — the control plane: a gRPC (C core) server for tqkv.v1.Control.
 *
 * Threads: one acceptor thread owns unix:<run_dir>/control.sock (mode 0660)
 * and reads each connection's kernel peer credentials (SO_PEERCRED) before
 * handing the connection to gRPC; one RPC thread runs every handler from
 * its own completion queue.  Optionally gRPC also listens on
 * 127.0.0.1:<control_tcp_port> itself (no peer credentials there).
 *
 * The caller must hold the run directory's lock file before rpc_start():
 * the socket path is unlinked and re-created here.
 */
#ifndef TQKVD_RPC_H
#define TQKVD_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "session.h"
#include "tenant.h"

/* Largest control message accepted; bigger ones get RESOURCE_EXHAUSTED. */
#define RPC_MAX_RECV_BYTES (64 * 1024)

struct rpc_server;

/* Binds the sockets and starts both threads; on return the control socket
 * accepts calls.  cfg is copied (rpc_set_config replaces the copy).
 * Errors: negative errno, with a message in err. */
int rpc_start(struct rpc_server **out, const struct config *cfg,
	      struct session_table *sessions, struct tenant_table *tenants,
	      char *err, size_t errlen);
/* Stops accepting, lets in-flight calls finish for up to drain_ms, then
 * cancels the rest, joins the threads, frees everything and removes the
 * socket file.  Accepts NULL. */
void rpc_stop(struct rpc_server *srv, int drain_ms);
/* Tests: the next n requests for calls fail as out of memory would. */
void rpc_fault_request(uint32_t n);
/* A reloaded configuration: the tenant table takes its budgets and
 * GetConfig shows it, in one step under the configuration's lock, so a
 * SetTenantBudget falls wholly before it (and the file's budgets win) or
 * after it (and shows what it set).  before (may be NULL) runs first in
 * that step, with the budgets still as they run; its value is returned. */
int rpc_set_config(struct rpc_server *srv, const struct config *cfg, int (*before)(void *ctx), void *ctx);
/* The data path whose figures GetStats reports (may be set after
 * rpc_start, from the main thread; NULL: not reported).  A pool once set
 * is freed only after rpc_stop: a handler may still be reading it. */
struct pool;
struct ring_server;
void rpc_set_datapath(struct rpc_server *srv, struct pool *pool, struct ring_server *ring);
struct spill;
struct kvstore;
/* The spill store (GetStats, SpillSession, RestoreSession) and the page
 * tables it moves pages of; NULL: none. */
void rpc_set_spill(struct rpc_server *srv, struct spill *sp, struct kvstore *kv);
/* The reclaimer (GetStats; SetTenantBudget kicks it); NULL: none. */
struct reclaim;
void rpc_set_reclaim(struct rpc_server *srv, struct reclaim *rc);

/* ---- the checks on a request's bytes (pure functions; fuzzed by
 * tests/fuzz/fuzz_rpc.c) ------------------------------------------------------ */
struct ProtobufCMessage;
struct ProtobufCMessageDescriptor;
/* Before the unpack: protobuf-c turns a string with an embedded NUL into
 * its prefix, so the wire bytes of a message of descriptor d are walked
 * (nested messages to depth 8) and a string field holding a NUL refused:
 * -EINVAL with *field naming it.  Malformed wire data is left to the
 * unpacker: 0 then. */
int rpc_wire_check(const struct ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, int depth,
		   const char **field);
/* After the unpack, before the handler: the checks of request req of the
 * service's method `method` (its index in tqkv.proto) that need no daemon
 * state — ids, tenant and session names, codecs, kv_transform, the
 * geometry (session_geom_check), a budget change that changes something.
 * 0, or the gRPC status code with why. */
int rpc_request_check(unsigned method, const struct ProtobufCMessage *req, char *why, size_t whylen);

#endif
