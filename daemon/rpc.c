/* rpc.c — the gRPC control server and its handlers.
 *
 * Trust model (docs/ARCHITECTURE.md §4, "Who may do what"): whoever can
 * connect to control.sock (mode 0660, owner = the daemon's user, group =
 * daemon.control_group) is a client: it may open sessions in the tenants
 * that allow it and see, evict and close its own sessions.  Operators —
 * root, the daemon's own uid and members of daemon.operator_group — may
 * act on every session, change budgets and read the configuration.  Rights
 * come from the kernel's credentials of the connection (SO_PEERCRED and
 * SO_PEERGROUPS, read by our own acceptor), never from a value the client
 * sends; a TCP peer has none and may only call Health and GetStats.  gRPC 1.51 exposes no peer credentials of its own, so we
 * accept the unix connections ourselves and pass each one to gRPC with
 * grpc_server_add_channel_from_fd(); gRPC names such a peer "fd:N", which
 * leads back to the credentials recorded for fd N (checked against the
 * socket's inode).  TCP peers have no credentials: OpenSession is refused
 * there.
 */
#include "rpc.h"

#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "dataop.h"
#include "kvpersist.h"
#include "log.h"
#include "pool.h"
#include "reclaim.h"
#include "ring.h"
#include "spill.h"
#include "tq_xform.h"
#include "tqkv.pb-c.h"
#include "version.h"

#define N_METHODS 13

/* Index of each method in methods[] (= the service's order in tqkv.proto). */
enum {
	M_HEALTH, M_GET_STATS, M_OPEN_SESSION, M_CLOSE_SESSION, M_GET_SESSION, M_LIST_SESSIONS,
	M_EVICT_SESSION, M_LIST_TENANTS, M_SET_TENANT_BUDGET, M_GET_CONFIG, M_SPILL_SESSION,
	M_RESTORE_SESSION, M_CHECKPOINT_SESSION,
};

#define PEER_GROUPS_MAX 64

/* Who is calling.  has_cred: kernel credentials of a unix-socket peer. */
struct peer {
	bool has_cred;
	bool operator_;         /* may act on everything (see the top of this file) */
	struct ucred cred;
	int n_groups;           /* supplementary groups at connect time */
	gid_t groups[PEER_GROUPS_MAX];
	char desc[96];          /* "uid 1000 pid 42" or "ipv4:127.0.0.1:5555" */
};

/* What a method needs from its caller. */
enum right {
	RIGHT_ANY,              /* any peer, TCP included */
	RIGHT_CLIENT,           /* kernel credentials (unix socket); the handler checks ownership */
	RIGHT_OPERATOR,         /* an operator */
};

struct reply {
	grpc_status_code code;
	char msg[512];
	grpc_byte_buffer *payload;  /* NULL unless code == GRPC_STATUS_OK */
};

typedef void (*handler_fn)(struct rpc_server *srv, const struct peer *peer,
			   const ProtobufCMessage *req, struct reply *rep);

enum call_phase { PHASE_REQUESTED, PHASE_SENDING };

/* One call: a pending request for a method, then the reply in flight.
 * Owned by the RPC thread; the pointer is the completion-queue tag. */
struct call {
	enum call_phase phase;
	int method;                 /* index into methods[], -1: unregistered */
	grpc_call *call;
	gpr_timespec deadline;
	grpc_metadata_array md;
	grpc_byte_buffer *payload;
	grpc_call_details details;  /* unregistered calls only */
	grpc_byte_buffer *reply;
	grpc_slice status_msg;
	int cancelled;
};

struct peer_slot {
	bool valid;
	ino_t ino;
	struct ucred cred;
	int n_groups;
	gid_t groups[PEER_GROUPS_MAX];
};

struct rpc_server {
	struct session_table *sessions;
	struct tenant_table *tenants;
	struct pool *pool;              /* atomic pointer: rpc_set_datapath */
	struct ring_server *ring;       /* under ring_lock: rpc_set_datapath */
	pthread_mutex_t ring_lock;      /* held while a handler uses ring: rpc_set_datapath
					 * waits for it, so the data server can go first */
	struct spill *spill;            /* atomic pointers: rpc_set_spill */
	struct kvstore *kv;
	struct reclaim *reclaim;        /* atomic pointer: rpc_set_reclaim */
	uint64_t start_ms, start_mono_ms;

	pthread_mutex_t cfg_lock;       /* guards cfg, reloads, operator_gid */
	struct config *cfg;
	uint64_t reloads;
	gid_t operator_gid;             /* (gid_t)-1: no operator group */

	grpc_server *server;
	grpc_completion_queue *cq;
	void *method_tag[N_METHODS];
	char method_path[N_METHODS][64];
	pthread_t rpc_thread;
	bool rpc_thread_started;
	int stopping;                   /* atomic: set by rpc_stop */
	int slow_closed;                /* atomic: rpc_stop takes no more slow calls */
	int drain_ms;
	int shutdown_tag;               /* its address is the shutdown tag */
	bool started, server_destroyed;

	char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int listen_fd;
	int wake_fd;                    /* eventfd: stops the acceptor */
	pthread_t accept_thread;
	bool accept_thread_started;
	grpc_server_credentials *fd_creds;

	pthread_mutex_t peer_lock;      /* guards peers */
	struct peer_slot *peers;        /* [n_peers], indexed by fd */
	size_t n_peers;

	uint64_t calls, errors;         /* atomic */
	uint32_t slow_calls;            /* atomic: slow methods running on their own threads */
	/* calls of each method (index method + 1: -1 is "any other") that
	 * could not be requested again after one arrived (out of memory);
	 * the RPC thread retries them every tick: each method must always
	 * have one request waiting, or its calls queue unanswered for good */
	uint32_t unrequested[N_METHODS + 1];
};

static uint64_t now_realtime_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t now_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- replies ------------------------------------------------------------------ */
__attribute__((format(printf, 3, 4)))
static void rep_error(struct reply *rep, grpc_status_code code, const char *fmt, ...)
{
	va_list ap;

	rep->code = code;
	va_start(ap, fmt);
	vsnprintf(rep->msg, sizeof(rep->msg), fmt, ap);
	va_end(ap);
}

static void rep_ok(struct reply *rep, const ProtobufCMessage *m)
{
	size_t len = protobuf_c_message_get_packed_size(m);
	grpc_slice s = grpc_slice_malloc(len);

	protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
	rep->payload = grpc_raw_byte_buffer_create(&s, 1);
	grpc_slice_unref(s);
	rep->code = GRPC_STATUS_OK;
	rep->msg[0] = '\0';
}

/* A client string for a message: printable ASCII only, else a placeholder. */
static const char *safe(const char *s)
{
	size_t n = strlen(s);

	if (n > 80)
		return "(too long)";
	for (size_t i = 0; i < n; i++)
		if (s[i] < 0x20 || s[i] > 0x7e)
			return "(not printable)";
	return s;
}

/* ---- handlers ------------------------------------------------------------------ */
static void h_health(struct rpc_server *srv, const struct peer *peer,
		     const ProtobufCMessage *req, struct reply *rep)
{
	Tqkv__V1__HealthReply r = TQKV__V1__HEALTH_REPLY__INIT;
	struct pool *pool = __atomic_load_n(&srv->pool, __ATOMIC_ACQUIRE);
	char why[512];

	/* a lost GPU: the main loop stops tqkvd within a tick; until then the
	 * probe must not say SERVING (data operations already fail) */
	r.status = (char *)"SERVING";
	if (pool && pool_lost(pool, why, sizeof(why))) {
		r.status = (char *)"NOT_SERVING";
		r.reason = why;
	} else if (__atomic_load_n(&srv->stopping, __ATOMIC_ACQUIRE)) {
		r.status = (char *)"NOT_SERVING";
		r.reason = (char *)"shutting down";
	}
	r.version = (char *)(TQ_VERSION " (git " TQ_GIT_REV ")");
	r.uptime_ms = now_mono_ms() - srv->start_mono_ms;
	r.pid = (uint32_t)getpid();
	rep_ok(rep, &r.base);
}

static void h_get_stats(struct rpc_server *srv, const struct peer *peer,
			const ProtobufCMessage *req, struct reply *rep)
{
	Tqkv__V1__Stats r = TQKV__V1__STATS__INIT;
	struct session_stats ss;

	session_table_stats(srv->sessions, &ss);
	r.version = (char *)TQ_VERSION;
	r.uptime_ms = now_mono_ms() - srv->start_mono_ms;
	r.pid = (uint32_t)getpid();
	pthread_mutex_lock(&srv->cfg_lock);
	r.pool_bytes = srv->cfg->pool_bytes;
	r.reloads_total = srv->reloads;
	pthread_mutex_unlock(&srv->cfg_lock);
	r.used_bytes = tenant_table_used(srv->tenants);
	r.sessions_open = ss.open;
	r.sessions_evicted = ss.evicted;
	r.sessions_opened_total = ss.opened_total;
	r.sessions_closed_total = ss.closed_total;
	r.evictions_total = ss.evictions_total;
	r.rpc_calls_total = __atomic_load_n(&srv->calls, __ATOMIC_RELAXED);
	r.rpc_errors_total = __atomic_load_n(&srv->errors, __ATOMIC_RELAXED);
	r.tenants = tenant_count(srv->tenants);
	struct pool *pool = __atomic_load_n(&srv->pool, __ATOMIC_ACQUIRE);
	pthread_mutex_lock(&srv->ring_lock);
	struct ring_server *ring = srv->ring;
	if (pool) {
		struct pool_stats ps;
		pool_stats(pool, &ps);
		r.page_bytes = ps.page_bytes;
		r.page_tokens_align = pool_page_tokens_align(pool);
		r.pages_total = ps.pages_total;
		r.pages_free = ps.pages_free;
		r.pool_resident_bytes = ps.resident_bytes;
		r.pool_backend = (char *)ps.backend;
		r.pool_memory = (char *)ps.desc;
		r.numa_node = ps.numa_node;
		r.hugepages = ps.hugepages;
		struct pool_kernel_stats pk;
		pool_kernel_stats(pool, &pk);
		r.gpu_appends = pk.appends;
		r.gpu_attentions = pk.attends;
		r.gpu_decode_steps = pk.steps;
		r.gpu_decode_steps_one_wait = pk.steps_one_wait;
		r.gpu_kernel_failures = pk.failures;
		r.gpu_busy_us = pk.gpu_us;
		r.gpu_call_us = pk.call_us;
	}
	if (ring) {
		struct ring_stats rs;
		ring_server_stats(ring, &rs);
		r.data_clients = rs.clients;
		r.data_ops_total = rs.ops_total;
		r.data_op_errors_total = rs.op_errors_total;
		r.data_ops_run = rs.ops_run;
		r.data_op_queue_us = rs.op_queue_us;
		r.data_op_run_us = rs.op_run_us;
		r.data_arena_bytes = rs.arena_bytes;
	}
	pthread_mutex_unlock(&srv->ring_lock);
	struct spill *sp = __atomic_load_n(&srv->spill, __ATOMIC_ACQUIRE);
	char stopped[256];
	if (sp) {
		struct spill_stats st;
		spill_stats(sp, &st);
		r.spill_path = (char *)spill_path(sp);
		r.spill_engine = (char *)spill_engine(sp);
		r.spill_capacity_bytes = st.slots_total * st.slot_bytes;
		r.spill_used_bytes = st.slots_used * st.slot_bytes;
		r.spill_bytes_written = st.bytes_written;
		r.spill_bytes_read = st.bytes_read;
		r.spill_writes = st.writes;
		r.spill_reads = st.reads;
		r.spill_io_errors = st.io_errors;
		r.spill_retries = st.retries;
		r.spill_submit_failures = st.submit_failures;
		if (spill_stopped(sp, stopped, sizeof(stopped)))
			r.spill_stopped = stopped;
		r.spill_checksum_failures = st.crc_failures;
		r.spill_restore_p50_us = st.read_p50_us;
		r.spill_restore_p99_us = st.read_p99_us;
	}
	struct kvstore *ks = __atomic_load_n(&srv->kv, __ATOMIC_ACQUIRE);
	if (ks) {
		struct kvpersist_stats ps;
		kvstore_persist_stats(ks, &ps);
		r.persistent_sessions = ps.sessions;
		r.checkpoints_total = ps.checkpoints;
		r.checkpoint_failures_total = ps.checkpoint_failures;
		r.journal_records_total = ps.journal_records;
		r.journal_bytes_total = ps.journal_bytes;
		r.persistent_restored = ps.restored;
		r.persistent_dropped = ps.dropped;
	}
	struct reclaim *rc = __atomic_load_n(&srv->reclaim, __ATOMIC_ACQUIRE);
	if (rc) {
		struct reclaim_stats rs;
		struct reclaim_params rp;
		reclaim_stats(rc, &rs);
		reclaim_get_params(rc, &rp);
		r.high_watermark_pct = rp.high_pct;
		r.low_watermark_pct = rp.low_pct;
		r.reclaim_passes = rs.passes;
		r.reclaim_bytes = rs.spilled_bytes;
		r.reclaim_failures = rs.failures;
		r.reclaim_busy_us = rs.busy_us;
		r.admission_waits = rs.admission_waits;
		r.pressure_evictions = rs.evictions;
	}
	rep_ok(rep, &r.base);
}

/* tq_xf_mode_str of every mode, built once: messages point into it. */
static char xf_names[TQ_XF_MASK + 1][TQ_XF_NAME_MAX];
static pthread_once_t xf_names_once = PTHREAD_ONCE_INIT;

static void xf_names_init(void)
{
	for (uint32_t m = 0; m <= TQ_XF_MASK; m++)
		tq_xf_mode_str(m, xf_names[m], sizeof(xf_names[m]));
}

static const char *xf_name(uint32_t mode)
{
	pthread_once(&xf_names_once, xf_names_init);
	return mode <= TQ_XF_MASK ? xf_names[mode] : "?";
}

#define XF_MODES_HELP "none, default, or parts joined by '+': k-center, k-sink, v-center, v-eq, k-eq-qk, k-eq-k, k-unshrink, k-order; " \
		      "at most one k-eq-* and one of k-center, k-sink"

/* Tokens a page of session id's holds: its pages' own number once it has
 * KV state (a persistent session keeps the number it was written with),
 * else the pool's for its geometry g (0: no pool). */
static uint32_t page_tokens_of(struct rpc_server *srv, uint64_t id, const struct session_geom *g)
{
	struct pool *pool = __atomic_load_n(&srv->pool, __ATOMIC_ACQUIRE);
	struct kvstore *ks = __atomic_load_n(&srv->kv, __ATOMIC_ACQUIRE);
	uint32_t have = ks ? dataop_session_page_tokens(ks, id) : 0;
	int pt = pool ? dataop_page_tokens(pool_page_bytes(pool), pool_page_tokens_align(pool), g) : 0;

	return have ? have : pt > 0 ? (uint32_t)pt : 0;
}

/* The message's strings point into `si` (and static tables). */
static void session_to_msg(struct rpc_server *srv, struct session_info *si, Tqkv__V1__Session *m)
{
	tqkv__v1__session__init(m);
	m->id = si->id;
	m->name = si->name;
	m->tenant = si->tenant;
	m->owner_uid = si->owner_uid;
	m->n_layers = si->geom.n_layers;
	m->n_kv_heads = si->geom.n_kv_heads;
	m->n_q_heads = si->geom.n_q_heads;
	m->head_dim = si->geom.head_dim;
	m->k_codec = (char *)tq_codec_name(si->geom.k_codec);
	m->v_codec = (char *)tq_codec_name(si->geom.v_codec);
	m->rotation_seed = si->seed;
	m->max_tokens = si->geom.max_tokens;
	m->tokens = si->tokens;
	m->resident_bytes = si->resident_bytes;
	m->spilled_bytes = si->spilled_bytes;
	m->created_ms = si->created_ms;
	m->last_access_ms = si->last_access_ms;
	m->state = (Tqkv__V1__SessionState)si->state;
	m->persistent = si->persistent;
	m->evict_reason = si->state == SESSION_EVICTED ? si->evict_why : (char *)"";
	m->bytes_per_token = si->bytes_per_token;
	m->kv_transform = (char *)xf_name(si->geom.kv_xform);
	m->page_tokens = page_tokens_of(srv, si->id, &si->geom);
}

static void rep_session(struct rpc_server *srv, struct reply *rep, struct session_info *si)
{
	Tqkv__V1__Session m;

	session_to_msg(srv, si, &m);
	rep_ok(rep, &m.base);
}

static int codec_arg(const char *name, const char *def, enum tq_codec_id *out)
{
	int id = tq_codec_from_name(name[0] ? name : def);

	if (id < 0)
		return id;
	*out = (enum tq_codec_id)id;
	return 0;
}

static const char *known_codecs(char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	for (int i = 0; i < TQ_CODEC__COUNT && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "",
				      tq_codec_name((enum tq_codec_id)i));
	return buf;
}

static bool in_groups(gid_t g, const gid_t *groups, int n)
{
	for (int i = 0; i < n; i++)
		if (groups[i] == g)
			return true;
	return false;
}

/* uid's groups from the user database (when SO_PEERGROUPS is missing). */
static int peer_groups(uid_t uid, gid_t gid, gid_t *groups, int max)
{
	struct passwd pw, *r = NULL;
	char buf[4096];
	int n = max;

	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &r) != 0 || !r)
		return 0;
	if (getgrouplist(pw.pw_name, gid, groups, &n) < 0)
		return max;
	return n;
}

/* OpenSession with data_client: attach the new session to that data
 * connection in this same call, or close it again and say why. */
static int bind_new_session(struct rpc_server *srv, const struct peer *peer,
			    const Tqkv__V1__OpenSessionRequest *q, struct session_info *si,
			    struct reply *rep)
{
	pthread_mutex_lock(&srv->ring_lock);
	int r = srv->ring ? ring_server_bind(srv->ring, q->data_client, peer->cred.uid, si->id, &si->geom,
					     q->detached || q->persistent) : -ENOENT;
	pthread_mutex_unlock(&srv->ring_lock);

	if (r == 0)
		return 0;
	session_close(srv->sessions, si->id, NULL);
	switch (r) {
	case -ENOENT:
		rep_error(rep, GRPC_STATUS_FAILED_PRECONDITION, "no live data connection %" PRIu64
			  " (data_client); the session was not opened", q->data_client);
		break;
	case -EPERM:
		rep_error(rep, GRPC_STATUS_PERMISSION_DENIED, "data connection %" PRIu64
			  " belongs to another user; the session was not opened", q->data_client);
		break;
	case -ESHUTDOWN:
		rep_error(rep, GRPC_STATUS_FAILED_PRECONDITION, "data connection %" PRIu64
			  " is closing; the session was not opened", q->data_client);
		break;
	case -EUSERS:
		rep_error(rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "data connection %" PRIu64 " has %u sessions "
			  "attached already; the session was not opened", q->data_client, TQKV_MAX_ATTACHED);
		break;
	default:
		rep_error(rep, GRPC_STATUS_INTERNAL, "cannot attach the session to data connection %" PRIu64
			  ": %s; the session was not opened", q->data_client, strerror(-r));
	}
	return r;
}

/* A new persistent session's first manifest, before its open is answered;
 * on failure the session is closed and the reply says why. */
static int persist_new_session(struct rpc_server *srv, uint64_t id, struct reply *rep)
{
	struct kvstore *ks = __atomic_load_n(&srv->kv, __ATOMIC_ACQUIRE);
	struct session *s;
	char why[320] = "";
	int r;

	if ((r = session_acquire(srv->sessions, id, 0, &s)) == 0) {
		r = dataop_persist_init(ks, s, why, sizeof(why));
		session_release(s);
	}
	if (r == 0)
		return 0;
	session_close(srv->sessions, id, NULL);
	rep_error(rep, GRPC_STATUS_UNAVAILABLE, "cannot keep the session on disk: %s; the session was not opened",
		  why[0] ? why : strerror(-r));
	return r;
}

/* OpenSession's arguments, as far as they need no daemon state: names,
 * codecs, the transform (an empty one: default_xform, the daemon's) and
 * the geometry (session_geom_check) into *g.  0, or a gRPC status with why.
 * Whether the tenant exists and the caller may use it is the handler's. */
static int open_args(const Tqkv__V1__OpenSessionRequest *q, uint32_t default_xform, struct session_geom *g,
		     char *why, size_t whylen)
{
	const char *tname = q->tenant[0] ? q->tenant : CONFIG_DEFAULT_TENANT;
	char known[256];
	uint64_t bpt;

	memset(g, 0, sizeof(*g));
	if (config_check_name(tname) < 0) {
		snprintf(why, whylen, q->tenant[0] ? "unknown tenant '%s'" : "no tenant given and there is no tenant '%s'",
			 safe(tname));
		return GRPC_STATUS_INVALID_ARGUMENT;
	}
	if (q->name[0] && config_check_name(q->name) < 0) {
		snprintf(why, whylen, "session name '%s' is not valid ([A-Za-z0-9_.-], 1..%d characters)",
			 safe(q->name), CONFIG_NAME_MAX - 1);
		return GRPC_STATUS_INVALID_ARGUMENT;
	}
	if (codec_arg(q->k_codec, "q8", &g->k_codec) < 0) {
		snprintf(why, whylen, "unknown K codec '%s' (known: %s)", safe(q->k_codec),
			 known_codecs(known, sizeof(known)));
		return GRPC_STATUS_INVALID_ARGUMENT;
	}
	if (codec_arg(q->v_codec, "tq4", &g->v_codec) < 0) {
		snprintf(why, whylen, "unknown V codec '%s' (known: %s)", safe(q->v_codec),
			 known_codecs(known, sizeof(known)));
		return GRPC_STATUS_INVALID_ARGUMENT;
	}
	if (!q->kv_transform[0]) {
		g->kv_xform = default_xform;
	} else if (tq_xf_mode_parse(q->kv_transform, &g->kv_xform) < 0) {
		snprintf(why, whylen, "unknown kv_transform '%s' (known: " XF_MODES_HELP ")", safe(q->kv_transform));
		return GRPC_STATUS_INVALID_ARGUMENT;
	}
	if (q->detached && !q->data_client) {
		snprintf(why, whylen, "detached applies to data_client (the connection the session is attached "
			 "to); without data_client a session is not attached");
		return GRPC_STATUS_INVALID_ARGUMENT;
	}
	g->n_layers = q->n_layers;
	g->n_kv_heads = q->n_kv_heads;
	g->n_q_heads = q->n_q_heads;
	g->head_dim = q->head_dim;
	g->max_tokens = q->max_tokens;
	if (session_geom_check(g, &bpt, why, whylen) < 0)
		return GRPC_STATUS_INVALID_ARGUMENT;
	return 0;
}

static int id_arg(uint64_t id, char *why, size_t whylen)
{
	if (id == 0) {
		snprintf(why, whylen, "session id is required (ids start at 1)");
		return GRPC_STATUS_INVALID_ARGUMENT;
	}
	return 0;
}

static int tenant_arg(const char *name, char *why, size_t whylen)
{
	if (config_check_name(name) < 0) {
		snprintf(why, whylen, "unknown tenant '%s'", safe(name));
		return GRPC_STATUS_INVALID_ARGUMENT;
	}
	return 0;
}

int rpc_request_check(unsigned method, const ProtobufCMessage *req, char *why, size_t whylen)
{
	switch (method) {
	case M_OPEN_SESSION: {
		struct session_geom g;
		/* an empty kv_transform is the daemon's, valid since its config loaded */
		return open_args((const void *)req, 0, &g, why, whylen);
	}
	case M_CLOSE_SESSION:
	case M_GET_SESSION:
	case M_EVICT_SESSION:
	case M_RESTORE_SESSION:
	case M_CHECKPOINT_SESSION:
		return id_arg(((const Tqkv__V1__SessionRef *)(const void *)req)->id, why, whylen);
	case M_SPILL_SESSION:
		return id_arg(((const Tqkv__V1__SpillSessionRequest *)(const void *)req)->id, why, whylen);
	case M_LIST_SESSIONS: {
		const Tqkv__V1__ListSessionsRequest *q = (const void *)req;
		return q->tenant[0] ? tenant_arg(q->tenant, why, whylen) : 0;
	}
	case M_SET_TENANT_BUDGET: {
		const Tqkv__V1__SetTenantBudgetRequest *q = (const void *)req;
		int code = tenant_arg(q->tenant, why, whylen);
		if (code == 0 && !q->set_limit && !q->set_guaranteed) {
			snprintf(why, whylen, "nothing to change: give a limit and/or a guarantee");
			code = GRPC_STATUS_INVALID_ARGUMENT;
		}
		return code;
	}
	default: /* Health, GetStats, ListTenants, GetConfig: nothing to check */
		return 0;
	}
}

static void h_open_session(struct rpc_server *srv, const struct peer *peer,
			   const ProtobufCMessage *req, struct reply *rep)
{
	const Tqkv__V1__OpenSessionRequest *q = (const void *)req;
	struct session_geom g = { 0 };
	struct session_info si;
	struct tenant *t;
	char why[512];
	uint64_t seed;
	int r;

	if (!peer->has_cred) {
		rep_error(rep, GRPC_STATUS_PERMISSION_DENIED,
			  "OpenSession needs the unix control socket: the session owner is the caller's "
			  "uid from the kernel, which a TCP peer does not have");
		return;
	}
	uint32_t xf;
	pthread_mutex_lock(&srv->cfg_lock);
	xf = srv->cfg->kv_transform; /* daemon.kv_transform, as of now */
	pthread_mutex_unlock(&srv->cfg_lock);
	if ((r = open_args(q, xf, &g, why, sizeof(why))) != 0) {
		rep_error(rep, (grpc_status_code)r, "%s", why);
		return;
	}
	const char *tname = q->tenant[0] ? q->tenant : CONFIG_DEFAULT_TENANT;
	if (!(t = tenant_find(srv->tenants, tname))) {
		rep_error(rep, GRPC_STATUS_INVALID_ARGUMENT, q->tenant[0]
			  ? "unknown tenant '%s'" : "no tenant given and there is no tenant '%s'",
			  safe(tname));
		return;
	}
	if (q->persistent) {
		struct kvstore *ks = __atomic_load_n(&srv->kv, __ATOMIC_ACQUIRE);
		if (!ks || !kvstore_persist_enabled(ks)) {
			rep_error(rep, GRPC_STATUS_FAILED_PRECONDITION, "this tqkvd keeps no persistent sessions "
				  "(no spill tier, or still starting)");
			return;
		}
	}
	if (!tenant_allows(t, peer->cred.uid, peer->cred.gid, peer->groups, peer->n_groups)) {
		rep_error(rep, GRPC_STATUS_PERMISSION_DENIED, "uid %u may not use tenant '%s' (allow_uids/allow_gids)",
			  (unsigned)peer->cred.uid, tname);
		return;
	}
	if (q->has_rotation_seed)
		seed = q->rotation_seed;
	else if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed)) {
		rep_error(rep, GRPC_STATUS_INTERNAL, "cannot draw a rotation seed: %s", strerror(errno));
		return;
	}
	/* One token of every KV head must fit a pool page (the geometry's other
	 * checks are session_open's; this one needs the pool). */
	struct pool *pool = __atomic_load_n(&srv->pool, __ATOMIC_ACQUIRE);
	const int page_tokens = pool ? dataop_page_tokens(pool_page_bytes(pool), pool_page_tokens_align(pool), &g) : 0;
	if (page_tokens < 0) {
		rep_error(rep, GRPC_STATUS_INVALID_ARGUMENT,
			  "one token of %u KV heads (%s/%s, head_dim %u) does not fit a pool page of %u bytes "
			  "(pool.page_bytes)", g.n_kv_heads, tq_codec_name(g.k_codec), tq_codec_name(g.v_codec),
			  g.head_dim, pool_page_bytes(pool));
		return;
	}
	why[0] = '\0';
	r = session_open(srv->sessions, t, q->name, peer->cred.uid, &g, seed,
			 q->persistent ? SESSION_PERSISTENT : 0, session_clock_ms(), &si, why, sizeof(why));
	switch (r) {
	case 0:
		if (q->persistent && persist_new_session(srv, si.id, rep) < 0)
			return;
		if (q->data_client && bind_new_session(srv, peer, q, &si, rep) < 0)
			return;
		log_info("session %" PRIu64 " opened: tenant %s, uid %u, name '%s', %u layers x %u/%u heads x %u, "
			 "%s/%s, transform %s, max %" PRIu64 " tokens%s%s", si.id, si.tenant, si.owner_uid, si.name,
			 g.n_layers, g.n_kv_heads, g.n_q_heads, g.head_dim, tq_codec_name(g.k_codec),
			 tq_codec_name(g.v_codec), xf_name(g.kv_xform), g.max_tokens,
			 !q->data_client ? ", not attached" : q->detached || q->persistent ? ", attached (detached)"
							     : ", attached",
			 q->persistent ? ", persistent" : "");
		/* pages the GPU's fast attention kernel cannot read: said once */
		if (pool && pool_page_tokens_align(pool) && page_tokens % (int)pool_page_tokens_align(pool))
			log_warning("session %" PRIu64 ": a page of %u bytes (pool.page_bytes) holds %d of its tokens, "
				    "fewer than %u: its attention runs on the GPU's general kernel, several times "
				    "slower; pages of %" PRIu64 " bytes or more hold %u", si.id, pool_page_bytes(pool),
				    page_tokens, pool_page_tokens_align(pool),
				    dataop_page_bytes_min(pool_page_tokens_align(pool), &g), pool_page_tokens_align(pool));
		rep_session(srv, rep, &si);
		return;
	case -EINVAL:
	case -EOVERFLOW:
		rep_error(rep, GRPC_STATUS_INVALID_ARGUMENT, "%s", why);
		return;
	case -EEXIST:
		rep_error(rep, GRPC_STATUS_ALREADY_EXISTS, "%s", why);
		return;
	case -EUSERS:
	case -ENOSPC:
		rep_error(rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s", why);
		return;
	default:
		rep_error(rep, GRPC_STATUS_INTERNAL, "cannot open the session: %s", strerror(-r));
		return;
	}
}

/* Session `id` for a caller that must own it (operators may touch any):
 * true and *si, or false with the reply set.  Another user's session is
 * "not yours", never more about it. */
static bool own_session(struct rpc_server *srv, const struct peer *peer, uint64_t id,
			struct session_info *si, struct reply *rep)
{
	if (session_get_info(srv->sessions, id, si) < 0) {
		rep_error(rep, GRPC_STATUS_NOT_FOUND, "no session %" PRIu64, id);
		return false;
	}
	if (!peer->operator_ && si->owner_uid != (uint32_t)peer->cred.uid) {
		rep_error(rep, GRPC_STATUS_PERMISSION_DENIED, "session %" PRIu64 " belongs to another user "
			  "(only its owner or an operator may act on it)", id);
		return false;
	}
	return true;
}

static void h_close_session(struct rpc_server *srv, const struct peer *peer,
			    const ProtobufCMessage *req, struct reply *rep)
{
	const Tqkv__V1__SessionRef *q = (const void *)req;
	Tqkv__V1__CloseSessionReply r = TQKV__V1__CLOSE_SESSION_REPLY__INIT;
	struct session_info si;
	uint64_t released = 0;

	if (!own_session(srv, peer, q->id, &si, rep))
		return;
	if (session_close(srv->sessions, q->id, &released) < 0) {
		rep_error(rep, GRPC_STATUS_NOT_FOUND, "no session %" PRIu64, q->id);
		return;
	}
	log_info("session %" PRIu64 " closed by %s (%" PRIu64 " bytes released)", q->id, peer->desc, released);
	r.released_bytes = released;
	rep_ok(rep, &r.base);
}

/* The session's per-layer transforms into m (layer_transforms), in `lt`
 * and `plt` ([n_layers] each, the caller frees them).  Nothing when the
 * session holds no data yet, is evicted or closing, or the data path is
 * not up, or an operation holds the session's KV lock longer than
 * DATAOP_XF_WAIT_MS (a spill or restore of many pages). */
static int layer_transforms(struct rpc_server *srv, uint64_t id, uint32_t n_layers, Tqkv__V1__Session *m,
			    Tqkv__V1__LayerTransform **lt, Tqkv__V1__LayerTransform ***plt)
{
	struct kvstore *ks = __atomic_load_n(&srv->kv, __ATOMIC_ACQUIRE);
	struct tq_xf_summary *sum = NULL;
	struct session *s;
	int r;

	*lt = NULL;
	*plt = NULL;
	if (!ks || session_acquire(srv->sessions, id, 0, &s) < 0)
		return 0;
	if (!(sum = calloc(n_layers, sizeof(*sum))) || !(*lt = calloc(n_layers, sizeof(**lt))) ||
	    !(*plt = calloc(n_layers, sizeof(**plt)))) {
		r = -ENOMEM;
		goto out;
	}
	if ((r = dataop_xf_summary(ks, s, sum, n_layers)) < 0) {
		if (r == -EBUSY)
			log_info("GetSession: session %llu is busy (a long operation); its layers' "
				"transforms are left out of this answer", (unsigned long long)id);
		r = r == -ENOENT || r == -EBUSY ? 0 : r; /* no layers to show */
		goto out;
	}
	for (uint32_t l = 0; l < n_layers; l++) {
		Tqkv__V1__LayerTransform *e = &(*lt)[l];
		tqkv__v1__layer_transform__init(e);
		e->layer = l;
		e->calibrated = sum[l].calibrated != 0;
		e->applied = (char *)xf_name(sum[l].applied);
		e->calib_tokens = sum[l].calib_tokens;
		e->k_rms = sum[l].k_rms;
		e->k_mean_norm = sum[l].k_mean_norm;
		e->v_rms = sum[l].v_rms;
		e->v_mean_norm = sum[l].v_mean_norm;
		e->scale_min = sum[l].scale_min;
		e->scale_max = sum[l].scale_max;
		(*plt)[l] = e;
	}
	m->n_layer_transforms = n_layers;
	m->layer_transforms = *plt;
out:
	session_release(s);
	free(sum);
	return r;
}

static void h_get_session(struct rpc_server *srv, const struct peer *peer,
			  const ProtobufCMessage *req, struct reply *rep)
{
	const Tqkv__V1__SessionRef *q = (const void *)req;
	Tqkv__V1__LayerTransform *lt, **plt;
	struct session_info si;
	Tqkv__V1__Session m;
	int r;

	if (!own_session(srv, peer, q->id, &si, rep))
		return;
	session_to_msg(srv, &si, &m);
	if ((r = layer_transforms(srv, si.id, si.geom.n_layers, &m, &lt, &plt)) == -ENOMEM)
		rep_error(rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
	else if (r < 0)
		rep_error(rep, GRPC_STATUS_INTERNAL, "cannot read session %" PRIu64 "'s transforms: %s",
			  si.id, strerror(-r));
	else
		rep_ok(rep, &m.base);
	free(plt);
	free(lt);
}

static void h_list_sessions(struct rpc_server *srv, const struct peer *peer,
			    const ProtobufCMessage *req, struct reply *rep)
{
	const Tqkv__V1__ListSessionsRequest *q = (const void *)req;
	Tqkv__V1__ListSessionsReply r = TQKV__V1__LIST_SESSIONS_REPLY__INIT;
	struct session_info *v = NULL;
	Tqkv__V1__Session *m = NULL, **pm = NULL;
	struct tenant *t = NULL;
	size_t n = 0;

	if (q->tenant[0] && !(t = tenant_find(srv->tenants, q->tenant))) {
		rep_error(rep, GRPC_STATUS_INVALID_ARGUMENT, "unknown tenant '%s'", safe(q->tenant));
		return;
	}
	if (session_list(srv->sessions, t, &v, &n) < 0)
		goto nomem;
	m = calloc(n ? n : 1, sizeof(*m));
	pm = calloc(n ? n : 1, sizeof(*pm));
	if (!m || !pm)
		goto nomem;
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (!peer->operator_ && v[i].owner_uid != (uint32_t)peer->cred.uid)
			continue; /* a client sees its own sessions only */
		session_to_msg(srv, &v[i], &m[k]);
		pm[k] = &m[k];
		k++;
	}
	r.n_sessions = k;
	r.sessions = pm;
	rep_ok(rep, &r.base);
	goto out;
nomem:
	rep_error(rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
out:
	free(pm);
	free(m);
	free(v);
}

static void h_evict_session(struct rpc_server *srv, const struct peer *peer,
			    const ProtobufCMessage *req, struct reply *rep)
{
	const Tqkv__V1__SessionRef *q = (const void *)req;
	struct session_info si;
	int r;

	if (!own_session(srv, peer, q->id, &si, rep))
		return;
	r = session_evict(srv->sessions, q->id, &si);
	if (r == -ENOENT) {
		rep_error(rep, GRPC_STATUS_NOT_FOUND, "no session %" PRIu64, q->id);
		return;
	}
	if (r == -EALREADY || r == -ESHUTDOWN) {
		rep_error(rep, GRPC_STATUS_FAILED_PRECONDITION, "session %" PRIu64 " is %s already",
			  q->id, r == -EALREADY ? "evicted" : "closing");
		return;
	}
	log_notice("session %" PRIu64 " (tenant %s, uid %u) evicted by %s", si.id, si.tenant,
		   si.owner_uid, peer->desc);
	rep_session(srv, rep, &si);
}

enum disk_op { OP_SPILL, OP_RESTORE, OP_CHECKPOINT };

/* SpillSession / RestoreSession / CheckpointSession: the session held
 * (acquired) for the I/O, so it cannot be closed under it; its own
 * operations wait on its lock. */
static void disk_op(struct rpc_server *srv, const struct peer *peer, uint64_t id, enum disk_op op,
		    uint64_t bytes, struct reply *rep)
{
	struct kvstore *kv = __atomic_load_n(&srv->kv, __ATOMIC_ACQUIRE);
	struct session_info si;
	struct session *s;
	uint64_t done = 0;
	char why[512];
	int r;

	if (op == OP_CHECKPOINT && !own_session(srv, peer, id, &si, rep))
		return;
	if (!kv || !__atomic_load_n(&srv->spill, __ATOMIC_ACQUIRE)) {
		rep_error(rep, GRPC_STATUS_FAILED_PRECONDITION, "this tqkvd has no spill tier");
		return;
	}
	if ((r = session_acquire(srv->sessions, id, session_clock_ms(), &s)) < 0) {
		rep_error(rep, r == -ENOENT ? GRPC_STATUS_NOT_FOUND : GRPC_STATUS_FAILED_PRECONDITION,
			  "session %" PRIu64 ": %s", id, r == -ENOENT ? "no such session" :
			  r == -ESTALE ? "evicted" : "closing");
		return;
	}
	r = op == OP_SPILL ? dataop_spill(kv, s, bytes ? bytes : UINT64_MAX, &done, why, sizeof(why))
	  : op == OP_RESTORE ? dataop_restore(kv, s, why, sizeof(why))
			     : dataop_checkpoint(kv, s, why, sizeof(why));
	session_release(s);
	if (r < 0) {
		int code = r == -EBADMSG ? GRPC_STATUS_DATA_LOSS :
			   r == -ENOSPC ? GRPC_STATUS_RESOURCE_EXHAUSTED :
			   r == -EOPNOTSUPP || r == -EINVAL ? GRPC_STATUS_FAILED_PRECONDITION : GRPC_STATUS_UNAVAILABLE;
		rep_error(rep, code, "session %" PRIu64 ": %s", id, why);
		return;
	}
	if (session_get_info(srv->sessions, id, &si) < 0) {
		rep_error(rep, GRPC_STATUS_NOT_FOUND, "no session %" PRIu64, id);
		return;
	}
	if (op == OP_SPILL)
		log_info("session %" PRIu64 " (tenant %s): %" PRIu64 " bytes spilled by %s; %" PRIu64
			 " resident, %" PRIu64 " spilled", id, si.tenant, done, peer->desc, si.resident_bytes,
			 si.spilled_bytes);
	else if (op == OP_CHECKPOINT)
		log_info("session %" PRIu64 " (tenant %s) checkpointed by %s; %" PRIu64 " tokens", id, si.tenant,
			 peer->desc, si.tokens);
	else
		log_info("session %" PRIu64 " (tenant %s) restored by %s; %" PRIu64 " resident", id, si.tenant,
			 peer->desc, si.resident_bytes);
	rep_session(srv, rep, &si);
}

static void h_spill_session(struct rpc_server *srv, const struct peer *peer,
			    const ProtobufCMessage *req, struct reply *rep)
{
	const Tqkv__V1__SpillSessionRequest *q = (const void *)req;

	disk_op(srv, peer, q->id, OP_SPILL, q->bytes, rep);
}

static void h_restore_session(struct rpc_server *srv, const struct peer *peer,
			      const ProtobufCMessage *req, struct reply *rep)
{
	const Tqkv__V1__SessionRef *q = (const void *)req;

	disk_op(srv, peer, q->id, OP_RESTORE, 0, rep);
}

static void h_checkpoint_session(struct rpc_server *srv, const struct peer *peer,
				 const ProtobufCMessage *req, struct reply *rep)
{
	const Tqkv__V1__SessionRef *q = (const void *)req;

	disk_op(srv, peer, q->id, OP_CHECKPOINT, 0, rep);
}

/* The message's arrays point into `ti`. */
static void tenant_to_msg(struct tenant_info *ti, Tqkv__V1__Tenant *m)
{
	tqkv__v1__tenant__init(m);
	m->name = ti->name;
	m->guaranteed_bytes = ti->guaranteed;
	m->limit_bytes = ti->limit;
	m->priority = ti->priority;
	m->used_bytes = ti->used;
	m->spilled_bytes = ti->spilled;
	m->sessions = ti->sessions;
	m->any_uid = ti->any_uid;
	m->n_allow_uids = ti->n_uids;
	m->allow_uids = ti->uids;
	m->n_allow_gids = ti->n_gids;
	m->allow_gids = ti->gids;
	m->spilled_total_bytes = ti->pressure.spilled_bytes;
	m->restored_total_bytes = ti->pressure.restored_bytes;
	m->waits = ti->pressure.waits;
	m->wait_us = ti->pressure.wait_us;
	m->wait_max_us = ti->pressure.wait_max_us;
	m->refusals = ti->pressure.refusals;
	m->evictions = ti->pressure.evictions;
	m->limit_refusals = ti->pressure.limit_refusals;
	m->sparse_v = ti->sparse_v;
	m->value_chunks = ti->v_chunks;
	m->value_chunks_skipped = ti->v_skipped;
}

static void h_list_tenants(struct rpc_server *srv, const struct peer *peer,
			   const ProtobufCMessage *req, struct reply *rep)
{
	Tqkv__V1__ListTenantsReply r = TQKV__V1__LIST_TENANTS_REPLY__INIT;
	uint32_t n = tenant_count(srv->tenants);
	struct tenant_info *ti = calloc(n ? n : 1, sizeof(*ti));
	Tqkv__V1__Tenant *m = calloc(n ? n : 1, sizeof(*m));
	Tqkv__V1__Tenant **pm = calloc(n ? n : 1, sizeof(*pm));

	if (!ti || !m || !pm) {
		rep_error(rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
		goto out;
	}
	uint32_t k = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct tenant *t = tenant_at(srv->tenants, i);
		/* a client sees the tenants it may use */
		if (!peer->operator_ && !tenant_allows(t, peer->cred.uid, peer->cred.gid, peer->groups, peer->n_groups))
			continue;
		tenant_get_info(t, &ti[k]);
		tenant_to_msg(&ti[k], &m[k]);
		pm[k] = &m[k];
		k++;
	}
	r.n_tenants = k;
	r.tenants = pm;
	rep_ok(rep, &r.base);
out:
	free(pm);
	free(m);
	free(ti);
}

static void h_set_tenant_budget(struct rpc_server *srv, const struct peer *peer,
				const ProtobufCMessage *req, struct reply *rep)
{
	const Tqkv__V1__SetTenantBudgetRequest *q = (const void *)req;
	Tqkv__V1__Tenant m;
	struct tenant_info ti;
	struct tenant *t;
	char a[32], b[32], why[256];
	int r;

	if (!(t = tenant_find(srv->tenants, q->tenant))) {
		rep_error(rep, GRPC_STATUS_INVALID_ARGUMENT, "unknown tenant '%s'", safe(q->tenant));
		return;
	}
	/* the change and GetConfig's copy of it (tqctl config shows what
	 * runs, until a reload puts the file's budgets back) in one step
	 * under cfg_lock, as a reload's are (rpc_set_config): otherwise a
	 * reload between the two left one budget running and another shown */
	pthread_mutex_lock(&srv->cfg_lock);
	r = tenant_set_budget(srv->tenants, t, q->set_limit, q->limit_bytes, q->set_guaranteed,
			      q->guaranteed_bytes, why, sizeof(why));
	if (r < 0) {
		pthread_mutex_unlock(&srv->cfg_lock);
		rep_error(rep, r == -EINVAL ? GRPC_STATUS_INVALID_ARGUMENT : GRPC_STATUS_FAILED_PRECONDITION,
			  "tenant '%s': %s", q->tenant, why);
		return;
	}
	tenant_get_info(t, &ti);
	for (uint32_t i = 0; i < srv->cfg->n_tenants; i++) {
		struct tenant_conf *tc = &srv->cfg->tenant[i];
		if (strcmp(tc->name, ti.name) == 0) {
			tc->limit = ti.limit;
			tc->guaranteed = ti.guaranteed;
		}
	}
	pthread_mutex_unlock(&srv->cfg_lock);
	/* a lowered limit: the reclaimer brings the tenant down to it now */
	struct reclaim *rc = __atomic_load_n(&srv->reclaim, __ATOMIC_ACQUIRE);
	if (rc)
		reclaim_kick(rc);
	config_format_size(ti.limit, a, sizeof(a));
	config_format_size(ti.guaranteed, b, sizeof(b));
	log_notice("tenant %s: budget set by %s: limit %s, guaranteed %s", ti.name, peer->desc, a, b);
	tenant_to_msg(&ti, &m);
	rep_ok(rep, &m.base);
}

struct cfg_visit {
	Tqkv__V1__ConfigEntry *e;   /* [cap] */
	Tqkv__V1__ConfigEntry **pe;
	char (*text)[3][CONFIG_DIR_MAX + 64]; /* key, value, default per entry */
	size_t n, cap;
};

static int visit_entry(void *ctx, const char *key, const char *value, const char *def,
		       bool reloadable, const char *help)
{
	struct cfg_visit *v = ctx;

	if (v->n >= v->cap)
		return -ENOBUFS;
	snprintf(v->text[v->n][0], sizeof(v->text[0][0]), "%s", key);
	snprintf(v->text[v->n][1], sizeof(v->text[0][1]), "%s", value);
	snprintf(v->text[v->n][2], sizeof(v->text[0][2]), "%s", def);
	Tqkv__V1__ConfigEntry *e = &v->e[v->n];
	tqkv__v1__config_entry__init(e);
	e->key = v->text[v->n][0];
	e->value = v->text[v->n][1];
	e->default_value = v->text[v->n][2];
	e->reloadable = reloadable;
	e->help = (char *)help;
	v->pe[v->n] = e;
	v->n++;
	return 0;
}

static void h_get_config(struct rpc_server *srv, const struct peer *peer,
			 const ProtobufCMessage *req, struct reply *rep)
{
	Tqkv__V1__GetConfigReply r = TQKV__V1__GET_CONFIG_REPLY__INIT;
	struct cfg_visit v = { .cap = 16 + 8 * CONFIG_MAX_TENANTS };
	char path[CONFIG_DIR_MAX];
	int rc;

	v.e = calloc(v.cap, sizeof(*v.e));
	v.pe = calloc(v.cap, sizeof(*v.pe));
	v.text = calloc(v.cap, sizeof(*v.text));
	if (!v.e || !v.pe || !v.text) {
		rep_error(rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
		goto out;
	}
	pthread_mutex_lock(&srv->cfg_lock);
	rc = config_visit(srv->cfg, visit_entry, &v);
	snprintf(path, sizeof(path), "%s", srv->cfg->path);
	pthread_mutex_unlock(&srv->cfg_lock);
	if (rc < 0) {
		rep_error(rep, GRPC_STATUS_INTERNAL, "config table larger than expected");
		goto out;
	}
	r.config_path = path;
	r.n_entries = v.n;
	r.entries = v.pe;
	rep_ok(rep, &r.base);
out:
	free(v.text);
	free(v.pe);
	free(v.e);
}

/* Order = the service's methods in tqkv.proto (checked at start). */
static const struct {
	const char *name;
	handler_fn fn;
	enum right need;
	bool slow;              /* disk I/O: runs on its own thread (call_async) */
} methods[N_METHODS] = {
	{ "Health", h_health, RIGHT_ANY, false },
	{ "GetStats", h_get_stats, RIGHT_ANY, false },
	{ "OpenSession", h_open_session, RIGHT_CLIENT, false },
	{ "CloseSession", h_close_session, RIGHT_CLIENT, false },
	{ "GetSession", h_get_session, RIGHT_CLIENT, false },
	{ "ListSessions", h_list_sessions, RIGHT_CLIENT, false },
	{ "EvictSession", h_evict_session, RIGHT_CLIENT, false },
	{ "ListTenants", h_list_tenants, RIGHT_CLIENT, false },
	{ "SetTenantBudget", h_set_tenant_budget, RIGHT_OPERATOR, false },
	{ "GetConfig", h_get_config, RIGHT_OPERATOR, false },
	{ "SpillSession", h_spill_session, RIGHT_OPERATOR, true },
	{ "RestoreSession", h_restore_session, RIGHT_OPERATOR, true },
	{ "CheckpointSession", h_checkpoint_session, RIGHT_CLIENT, true },
};

/* protobuf-c turns a string with an embedded NUL into its prefix (a C
 * string), so "prod\0x" would silently name tenant "prod": walk the wire
 * bytes with the message's descriptor, nested messages included (rpc.h). */
int rpc_wire_check(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
			      int depth, const char **field)
{
	size_t i = 0;

	if (depth > 8)
		return 0;
	while (i < n) {
		uint64_t key = 0, len = 0;
		int shift = 0;
		do {
			if (i >= n || shift > 63)
				return 0;
			key |= (uint64_t)(p[i] & 0x7f) << shift;
			shift += 7;
		} while (p[i++] & 0x80);
		switch (key & 7) {
		case 0:
			while (i < n && (p[i] & 0x80))
				i++;
			i++;
			continue;
		case 1: i += 8; continue;
		case 5: i += 4; continue;
		case 2: break;
		default: return 0;
		}
		shift = 0;
		do {
			if (i >= n || shift > 63)
				return 0;
			len |= (uint64_t)(p[i] & 0x7f) << shift;
			shift += 7;
		} while (p[i++] & 0x80);
		if (len > n - i)
			return 0;
		const ProtobufCFieldDescriptor *f =
			key >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
		if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p + i, 0, len)) {
			*field = f->name;
			return -EINVAL;
		}
		if (f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
		    rpc_wire_check(f->descriptor, p + i, len, depth + 1, field) < 0)
			return -EINVAL;
		i += len;
	}
	return 0;
}

/* ---- peers ------------------------------------------------------------------------ */
/* The peer's supplementary groups as the kernel saw them at connect time
 * (SO_PEERGROUPS, Linux 4.13; ascending).  A process of more than
 * PEER_GROUPS_MAX groups counts its first PEER_GROUPS_MAX (logged): never
 * the user database's, which may name groups the process dropped.  Only a
 * kernel without SO_PEERGROUPS falls back to the database. */
static int peer_groups_of(int fd, const struct ucred *cred, gid_t *groups)
{
	socklen_t len = PEER_GROUPS_MAX * sizeof(gid_t);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
		return (int)(len / sizeof(gid_t));
	if (errno == ENOPROTOOPT)
		return peer_groups(cred->uid, cred->gid, groups, PEER_GROUPS_MAX);
	gid_t *all = errno == ERANGE && len > PEER_GROUPS_MAX * sizeof(gid_t) ? malloc(len) : NULL;
	int n = 0;
	if (all && getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, all, &len) == 0) {
		n = (int)(len / sizeof(gid_t)) < PEER_GROUPS_MAX ? (int)(len / sizeof(gid_t)) : PEER_GROUPS_MAX;
		memcpy(groups, all, (size_t)n * sizeof(gid_t));
		if (len / sizeof(gid_t) > PEER_GROUPS_MAX)
			log_warning("control socket: uid %u pid %d has %zu supplementary groups; the first %d (by gid) "
				    "count for operator_group and allow_gids", (unsigned)cred->uid, (int)cred->pid,
				    (size_t)(len / sizeof(gid_t)), PEER_GROUPS_MAX);
	}
	free(all);
	return n; /* none but its primary group where they could not be read */
}
static void peer_record(struct rpc_server *srv, int fd, const struct ucred *cred, ino_t ino,
			const gid_t *groups, int n_groups)
{
	pthread_mutex_lock(&srv->peer_lock);
	if ((size_t)fd >= srv->n_peers) {
		size_t n = (size_t)fd + 64;
		struct peer_slot *p = realloc(srv->peers, n * sizeof(*p));
		if (!p)
			goto out; /* the peer then has no credentials: OpenSession is refused */
		memset(p + srv->n_peers, 0, (n - srv->n_peers) * sizeof(*p));
		srv->peers = p;
		srv->n_peers = n;
	}
	srv->peers[fd] = (struct peer_slot){ .valid = true, .ino = ino, .cred = *cred, .n_groups = n_groups };
	memcpy(srv->peers[fd].groups, groups, (size_t)n_groups * sizeof(gid_t));
out:
	pthread_mutex_unlock(&srv->peer_lock);
}

static void peer_lookup(struct rpc_server *srv, grpc_call *call, struct peer *p)
{
	char *s = grpc_call_get_peer(call);
	struct stat st;
	int fd = -1, n = 0;

	memset(p, 0, sizeof(*p));
	snprintf(p->desc, sizeof(p->desc), "%s", s ? safe(s) : "?");
	if (s && sscanf(s, "fd:%d%n", &fd, &n) == 1 && s[n] == '\0' && fd >= 0) {
		/* fstat under peer_lock: the accept thread made fd and recorded
		 * it under the same lock before gRPC saw it */
		pthread_mutex_lock(&srv->peer_lock);
		if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) &&
		    (size_t)fd < srv->n_peers && srv->peers[fd].valid && srv->peers[fd].ino == st.st_ino) {
			p->has_cred = true;
			p->cred = srv->peers[fd].cred;
			p->n_groups = srv->peers[fd].n_groups;
			memcpy(p->groups, srv->peers[fd].groups, sizeof(p->groups));
		}
		pthread_mutex_unlock(&srv->peer_lock);
		if (p->has_cred) {
			gid_t og;
			pthread_mutex_lock(&srv->cfg_lock);
			og = srv->operator_gid;
			pthread_mutex_unlock(&srv->cfg_lock);
			p->operator_ = p->cred.uid == 0 || p->cred.uid == geteuid() ||
				       (og != (gid_t)-1 && (p->cred.gid == og || in_groups(og, p->groups, p->n_groups)));
			snprintf(p->desc, sizeof(p->desc), "uid %u pid %d%s", (unsigned)p->cred.uid,
				 (int)p->cred.pid, p->operator_ ? " (operator)" : "");
		}
	}
	gpr_free(s);
}

static void *accept_main(void *arg)
{
	struct rpc_server *srv = arg;
	struct pollfd pf[2] = { { srv->listen_fd, POLLIN, 0 }, { srv->wake_fd, POLLIN, 0 } };

	for (;;) {
		if (poll(pf, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			log_err("control socket: poll: %s", strerror(errno));
			return NULL;
		}
		if (pf[1].revents)
			return NULL;
		int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED)
				continue;
			log_warning("control socket: accept: %s", strerror(errno));
			/* EMFILE and friends: back off instead of spinning */
			poll(&pf[1], 1, 100);
			continue;
		}
		struct ucred cred;
		socklen_t len = sizeof(cred);
		struct stat st;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || fstat(fd, &st) < 0) {
			log_warning("control socket: peer credentials: %s", strerror(errno));
			close(fd);
			continue;
		}
		gid_t groups[PEER_GROUPS_MAX];
		int n_groups = peer_groups_of(fd, &cred, groups);
		peer_record(srv, fd, &cred, st.st_ino, groups, n_groups);
		log_debug("control connection fd %d from uid %u pid %d", fd, (unsigned)cred.uid, (int)cred.pid);
		/* gRPC owns fd from here and closes it when the connection ends */
		grpc_server_add_channel_from_fd(srv->server, fd, srv->fd_creds);
	}
}

/* ---- the RPC thread ---------------------------------------------------------- */
static uint32_t request_faults; /* atomic: rpc_fault_request */

void rpc_fault_request(uint32_t n)
{
	__atomic_store_n(&request_faults, n, __ATOMIC_SEQ_CST);
}

static int request_call(struct rpc_server *srv, int method)
{
	uint32_t f = __atomic_load_n(&request_faults, __ATOMIC_SEQ_CST);
	while (f && !__atomic_compare_exchange_n(&request_faults, &f, f - 1, false, __ATOMIC_SEQ_CST,
						 __ATOMIC_SEQ_CST))
		;
	if (f)
		return -ENOMEM;
	struct call *c = calloc(1, sizeof(*c));
	grpc_call_error e;

	if (!c)
		return -ENOMEM;
	c->phase = PHASE_REQUESTED;
	c->method = method;
	grpc_metadata_array_init(&c->md);
	if (method >= 0) {
		e = grpc_server_request_registered_call(srv->server, srv->method_tag[method], &c->call,
							&c->deadline, &c->md, &c->payload, srv->cq, srv->cq, c);
	} else {
		grpc_call_details_init(&c->details);
		e = grpc_server_request_call(srv->server, &c->call, &c->details, &c->md, srv->cq, srv->cq, c);
	}
	if (e != GRPC_CALL_OK) {
		grpc_metadata_array_destroy(&c->md);
		if (method < 0)
			grpc_call_details_destroy(&c->details);
		free(c);
		return -EIO;
	}
	return 0;
}

/* What gRPC allocated for a call.  A frame of its own, never inlined:
 * gRPC's destroy functions reach free() by tail calls (gpr_free is a jump),
 * so a ThreadSanitizer report of such a free shows no gRPC frame, only this
 * one, which tests/tsan.supp names. */
static __attribute__((noinline)) void call_release_grpc(struct call *c)
{
	grpc_metadata_array_destroy(&c->md);
	if (c->method < 0)
		grpc_call_details_destroy(&c->details);
	if (c->payload)
		grpc_byte_buffer_destroy(c->payload);
	if (c->reply)
		grpc_byte_buffer_destroy(c->reply);
	if (c->phase == PHASE_SENDING)
		grpc_slice_unref(c->status_msg);
	if (c->call)
		grpc_call_unref(c->call);
}

static void call_free(struct call *c)
{
	if (!c)
		return;
	call_release_grpc(c);
	free(c);
}

/* May `peer` call a method that needs `need`?  false with the reply set. */
static bool allowed(const struct peer *peer, enum right need, const char *mname, struct reply *rep)
{
	if (need == RIGHT_ANY || (need == RIGHT_CLIENT && peer->has_cred) || peer->operator_)
		return true;
	if (!peer->has_cred)
		rep_error(rep, GRPC_STATUS_PERMISSION_DENIED, "%s needs the unix control socket: a TCP peer has "
			  "no credentials and may only call Health and GetStats", mname);
	else
		rep_error(rep, GRPC_STATUS_PERMISSION_DENIED, "%s is for operators (root, the daemon's user or "
			  "daemon.operator_group); uid %u is a client", mname, (unsigned)peer->cred.uid);
	return false;
}

/* Decode, run the handler, start sending the reply. */
static void call_reply(struct rpc_server *srv, struct call *c, const struct peer *peer, const char *mname,
		       struct reply *rep);

/* A slow method (spill I/O) runs on a thread of its own, so the RPC thread
 * keeps answering everything else meanwhile.  At most SLOW_CALLS_MAX at
 * once; gRPC core takes a call's batch from any thread, and a server
 * shutdown waits for the reply like for any call in flight. */
#define SLOW_CALLS_MAX 4

struct slow_call {
	struct rpc_server *srv;
	struct call *c;
	struct peer peer;
	ProtobufCMessage *req;
};

static void *slow_main(void *arg)
{
	struct slow_call *sc = arg;
	struct reply rep = { .code = GRPC_STATUS_OK };

	methods[sc->c->method].fn(sc->srv, &sc->peer, sc->req, &rep);
	protobuf_c_message_free_unpacked(sc->req, NULL);
	call_reply(sc->srv, sc->c, &sc->peer, methods[sc->c->method].name, &rep);
	__atomic_sub_fetch(&sc->srv->slow_calls, 1, __ATOMIC_RELEASE);
	free(sc);
	return NULL;
}

/* 0: the call's thread owns req and replies; -EBUSY: refused (rep says
 * why: as many run already); another negative errno: no thread for it (the
 * caller runs it inline). */
static int call_async(struct rpc_server *srv, struct call *c, const struct peer *peer, ProtobufCMessage *req,
		      struct reply *rep)
{
	struct slow_call *sc;
	pthread_attr_t attr;
	pthread_t th;
	int r;

	/* counted first, then the stop checked (rpc_stop does the two the
	 * other way round, all seq_cst): either the stop sees this call and
	 * waits for it, or this call sees the stop */
	uint32_t n = __atomic_add_fetch(&srv->slow_calls, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&srv->slow_closed, __ATOMIC_SEQ_CST)) {
		__atomic_sub_fetch(&srv->slow_calls, 1, __ATOMIC_RELEASE);
		rep_error(rep, GRPC_STATUS_UNAVAILABLE, "tqkvd is stopping");
		return -EBUSY;
	}
	if (n > SLOW_CALLS_MAX) {
		__atomic_sub_fetch(&srv->slow_calls, 1, __ATOMIC_RELEASE);
		rep_error(rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "%d spill/restore/checkpoint calls are running "
			  "already; try again when one is done", SLOW_CALLS_MAX);
		return -EBUSY;
	}
	if (!(sc = malloc(sizeof(*sc)))) {
		__atomic_sub_fetch(&srv->slow_calls, 1, __ATOMIC_RELEASE);
		return -ENOMEM; /* run it inline */
	}
	*sc = (struct slow_call){ srv, c, *peer, req };
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	r = pthread_create(&th, &attr, slow_main, sc);
	pthread_attr_destroy(&attr);
	if (r != 0) {
		free(sc);
		__atomic_sub_fetch(&srv->slow_calls, 1, __ATOMIC_RELEASE);
		return -r; /* run it inline */
	}
	return 0;
}

static void call_handle(struct rpc_server *srv, struct call *c)
{
	struct reply rep = { .code = GRPC_STATUS_OK };
	struct peer peer;
	ProtobufCMessage *req = NULL;
	const char *mname = "?";

	__atomic_add_fetch(&srv->calls, 1, __ATOMIC_RELAXED);
	peer_lookup(srv, c->call, &peer);
	if (c->method < 0) {
		rep_error(&rep, GRPC_STATUS_UNIMPLEMENTED, "unknown method");
	} else {
		const ProtobufCMethodDescriptor *md = &tqkv__v1__control__descriptor.methods[c->method];
		mname = methods[c->method].name;
		if (!c->payload) {
			rep_error(&rep, GRPC_STATUS_INVALID_ARGUMENT, "%s: no request message", mname);
		} else {
			grpc_byte_buffer_reader rd;
			grpc_slice s;
			if (!grpc_byte_buffer_reader_init(&rd, c->payload)) {
				rep_error(&rep, GRPC_STATUS_INVALID_ARGUMENT, "%s: unreadable request", mname);
			} else {
				const char *bad = NULL;
				s = grpc_byte_buffer_reader_readall(&rd);
				grpc_byte_buffer_reader_destroy(&rd);
				if (rpc_wire_check(md->input, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), 0,
						       &bad) < 0) {
					rep_error(&rep, GRPC_STATUS_INVALID_ARGUMENT,
						  "%s: field '%s' contains a NUL byte", mname, bad);
				} else {
					req = protobuf_c_message_unpack(md->input, NULL, GRPC_SLICE_LENGTH(s),
									GRPC_SLICE_START_PTR(s));
					if (!req)
						rep_error(&rep, GRPC_STATUS_INVALID_ARGUMENT,
							  "%s: malformed %s message", mname, md->input->name);
				}
				grpc_slice_unref(s);
			}
		}
		char why[512];
		int code;
		if (req && !allowed(&peer, methods[c->method].need, mname, &rep))
			;
		else if (req && (code = rpc_request_check((unsigned)c->method, req, why, sizeof(why))) != 0)
			rep_error(&rep, (grpc_status_code)code, "%s", why);
		else if (req && methods[c->method].slow) {
			const int ar = call_async(srv, c, &peer, req, &rep);
			if (ar == 0)
				return; /* its thread replies */
			if (ar != -EBUSY) /* no thread to be had: here, as a last resort */
				methods[c->method].fn(srv, &peer, req, &rep);
		} else if (req) {
			methods[c->method].fn(srv, &peer, req, &rep);
		}
	}
	if (req)
		protobuf_c_message_free_unpacked(req, NULL);
	call_reply(srv, c, &peer, mname, &rep);
}

/* Log the outcome and start sending the reply: the call is freed when the
 * batch completes (RPC thread).  Any thread may call this for its call. */
static void call_reply(struct rpc_server *srv, struct call *c, const struct peer *peer, const char *mname,
		       struct reply *rep_)
{
	struct reply rep = *rep_;
	if (rep.code != GRPC_STATUS_OK) {
		__atomic_add_fetch(&srv->errors, 1, __ATOMIC_RELAXED);
		log_info("%s from %s: %s", mname, peer->desc, rep.msg);
	} else {
		log_debug("%s from %s: ok", mname, peer->desc);
	}

	grpc_op ops[4];
	size_t n = 0;
	memset(ops, 0, sizeof(ops));
	ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[n++].data.send_initial_metadata.count = 0;
	if (rep.payload) {
		c->reply = rep.payload;
		ops[n].op = GRPC_OP_SEND_MESSAGE;
		ops[n++].data.send_message.send_message = c->reply;
	}
	c->status_msg = grpc_slice_from_copied_string(rep.msg);
	/* A spill or restore replies from its own thread, and the RPC thread
	 * reads the call when gRPC hands it back: gRPC orders the two, but
	 * inside a library ThreadSanitizer does not see; the release here and
	 * the acquire there say it where it does.  After the store this
	 * thread reads nothing of c: the RPC thread may free it as soon as the
	 * batch is started. */
	grpc_call *call = c->call;
	__atomic_store_n(&c->phase, PHASE_SENDING, __ATOMIC_RELEASE);
	ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[n].data.send_status_from_server.trailing_metadata_count = 0;
	ops[n].data.send_status_from_server.status = rep.code;
	ops[n++].data.send_status_from_server.status_details = &c->status_msg;
	ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
	if (grpc_call_start_batch(call, ops, n, c, NULL) != GRPC_CALL_OK) {
		log_err("%s: cannot send the reply", mname);
		call_free(c); /* no batch, no completion: c is still ours */
	}
}

/* Request a call of `method` again; one that cannot be (out of memory) is
 * counted and retried at the next tick (rerequest). */
static void request_again(struct rpc_server *srv, int method)
{
	if (request_call(srv, method) == 0)
		return;
	if (!srv->unrequested[method + 1]++)
		log_err("cannot request further calls for %s (out of memory); trying again every 100 ms",
			method >= 0 ? methods[method].name : "(other)");
}

static void rerequest(struct rpc_server *srv)
{
	for (int m = -1; m < N_METHODS; m++) {
		uint32_t *n = &srv->unrequested[m + 1];
		if (!*n)
			continue;
		while (*n && request_call(srv, m) == 0)
			(*n)--;
		if (!*n)
			log_notice("calls for %s are requested again", m >= 0 ? methods[m].name : "(other)");
	}
}

static void *rpc_main(void *arg)
{
	struct rpc_server *srv = arg;
	bool shutdown_seen = false, cancelled = false, cq_down = false;
	uint64_t stop_at = 0;

	for (;;) {
		gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(100, GPR_TIMESPAN));
		grpc_event ev = grpc_completion_queue_next(srv->cq, dl, NULL);

		if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
		if (!__atomic_load_n(&srv->stopping, __ATOMIC_ACQUIRE))
			rerequest(srv);
		if (__atomic_load_n(&srv->stopping, __ATOMIC_ACQUIRE)) {
			if (!stop_at)
				stop_at = now_mono_ms() + (uint64_t)srv->drain_ms;
			if (!shutdown_seen && !cancelled && now_mono_ms() >= stop_at) {
				log_warning("calls still in flight after %d ms; cancelling them", srv->drain_ms);
				grpc_server_cancel_all_calls(srv->server);
				cancelled = true;
			}
		}
		if (ev.type == GRPC_QUEUE_TIMEOUT)
			continue;
		if (ev.tag == &srv->shutdown_tag) {
			/* every call has finished: the server can go, then the queue */
			shutdown_seen = true;
			grpc_server_destroy(srv->server);
			srv->server_destroyed = true;
			if (!cq_down) {
				grpc_completion_queue_shutdown(srv->cq);
				cq_down = true;
			}
			continue;
		}
		struct call *c = ev.tag;
		if (__atomic_load_n(&c->phase, __ATOMIC_ACQUIRE) == PHASE_REQUESTED) {
			bool stop = __atomic_load_n(&srv->stopping, __ATOMIC_ACQUIRE);
			if (!ev.success) { /* the server is shutting down (else: a request lost, made again) */
				if (!stop)
					request_again(srv, c->method);
				call_free(c);
				continue;
			}
			if (!stop)
				request_again(srv, c->method);
			call_handle(srv, c);
		} else {
			call_free(c);
		}
	}
	return NULL;
}

/* daemon.operator_group → gid ((gid_t)-1: none, or unknown — the config
 * check refuses an unknown group, so that only happens if it vanished). */
static gid_t operator_gid_of(const struct config *cfg)
{
	struct group gr, *res = NULL;
	char buf[8192];

	if (!cfg->operator_group[0])
		return (gid_t)-1;
	if (getgrnam_r(cfg->operator_group, &gr, buf, sizeof(buf), &res) != 0 || !res) {
		log_warning("daemon.operator_group: unknown group '%s'; only root and the daemon's user are "
			    "operators", cfg->operator_group);
		return (gid_t)-1;
	}
	return gr.gr_gid;
}

/* ---- start / stop ------------------------------------------------------------------- */
static int listen_unix(struct rpc_server *srv, const struct config *cfg, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	gid_t gid = (gid_t)-1;
	int fd = -1, r;

	if (cfg->control_group[0]) {
		struct group gr, *res = NULL;
		char buf[8192];
		if (getgrnam_r(cfg->control_group, &gr, buf, sizeof(buf), &res) != 0 || !res) {
			snprintf(err, errlen, "daemon.control_group: unknown group '%s'", cfg->control_group);
			return -ENOENT;
		}
		gid = gr.gr_gid;
	}
	if ((size_t)snprintf(srv->sock_path, sizeof(srv->sock_path), "%s/%s", cfg->run_dir,
			     CONFIG_CONTROL_SOCK) >= sizeof(srv->sock_path)) {
		snprintf(err, errlen, "%s: run directory path too long for a unix socket", cfg->run_dir);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, srv->sock_path, sizeof(srv->sock_path));
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		goto fail_errno;
	/* Safe: we hold the run directory's lock, so a socket file here is a
	 * dead daemon's leftover. */
	if (unlink(srv->sock_path) < 0 && errno != ENOENT)
		goto fail_errno;
	mode_t old = umask(0117); /* the socket file is created 0660 */
	r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (r < 0)
		goto fail_errno;
	if (chmod(srv->sock_path, 0660) < 0)
		goto fail_errno;
	if (gid != (gid_t)-1 && chown(srv->sock_path, (uid_t)-1, gid) < 0)
		goto fail_errno;
	if (listen(fd, 64) < 0)
		goto fail_errno;
	srv->listen_fd = fd;
	return 0;
fail_errno:
	r = -errno;
	snprintf(err, errlen, "%s: %s", srv->sock_path, strerror(errno));
	if (fd >= 0)
		close(fd);
	return r;
}

int rpc_start(struct rpc_server **out, const struct config *cfg,
	      struct session_table *sessions, struct tenant_table *tenants,
	      char *err, size_t errlen)
{
	struct rpc_server *srv;
	int r;

	*out = NULL;
	srv = calloc(1, sizeof(*srv));
	if (!srv) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	srv->listen_fd = -1;
	srv->wake_fd = -1;
	srv->sessions = sessions;
	srv->tenants = tenants;
	srv->start_ms = now_realtime_ms();
	srv->start_mono_ms = now_mono_ms();
	pthread_mutex_init(&srv->cfg_lock, NULL);
	pthread_mutex_init(&srv->ring_lock, NULL);
	pthread_mutex_init(&srv->peer_lock, NULL);
	srv->cfg = malloc(sizeof(*srv->cfg));
	if (!srv->cfg) {
		snprintf(err, errlen, "out of memory");
		r = -ENOMEM;
		goto fail;
	}
	memcpy(srv->cfg, cfg, sizeof(*cfg));
	srv->operator_gid = operator_gid_of(cfg);

	const ProtobufCServiceDescriptor *sd = &tqkv__v1__control__descriptor;
	if (sd->n_methods != N_METHODS) {
		snprintf(err, errlen, "tqkv.proto has %u methods, the server knows %d", sd->n_methods, N_METHODS);
		r = -EPROTO;
		goto fail;
	}
	for (int i = 0; i < N_METHODS; i++) {
		if (strcmp(sd->methods[i].name, methods[i].name) != 0) {
			snprintf(err, errlen, "tqkv.proto method %d is %s, the server expects %s",
				 i, sd->methods[i].name, methods[i].name);
			r = -EPROTO;
			goto fail;
		}
		snprintf(srv->method_path[i], sizeof(srv->method_path[i]), "/%s/%s", sd->name, methods[i].name);
	}

	grpc_init();
	grpc_arg args[] = {
		{ .type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
		  .value.integer = RPC_MAX_RECV_BYTES },
		{ .type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0 },
		{ .type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_CONCURRENT_STREAMS, .value.integer = 32 },
	};
	grpc_channel_args ca = { sizeof(args) / sizeof(args[0]), args };
	srv->server = grpc_server_create(&ca, NULL);
	srv->cq = grpc_completion_queue_create_for_next(NULL);
	grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
	for (int i = 0; i < N_METHODS; i++)
		srv->method_tag[i] = grpc_server_register_method(srv->server, srv->method_path[i], NULL,
								 GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
	if (cfg->control_tcp_port) {
		char addr[32];
		grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
		snprintf(addr, sizeof(addr), "127.0.0.1:%u", cfg->control_tcp_port);
		int port = grpc_server_add_http2_port(srv->server, addr, creds);
		grpc_server_credentials_release(creds);
		if (port <= 0) {
			snprintf(err, errlen, "cannot listen on %s (daemon.control_tcp_port)", addr);
			r = -EADDRINUSE;
			goto fail;
		}
	}
	srv->fd_creds = grpc_insecure_server_credentials_create();
	if ((r = listen_unix(srv, cfg, err, errlen)) < 0)
		goto fail;
	srv->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (srv->wake_fd < 0) {
		r = -errno;
		snprintf(err, errlen, "eventfd: %s", strerror(errno));
		goto fail;
	}
	grpc_server_start(srv->server);
	srv->started = true;
	for (int i = -1; i < N_METHODS; i++) {
		if ((r = request_call(srv, i)) < 0) {
			snprintf(err, errlen, "cannot request calls from gRPC");
			goto fail;
		}
	}
	if ((r = -pthread_create(&srv->rpc_thread, NULL, rpc_main, srv)) < 0) {
		snprintf(err, errlen, "cannot start the RPC thread: %s", strerror(-r));
		goto fail;
	}
	srv->rpc_thread_started = true;
	if ((r = -pthread_create(&srv->accept_thread, NULL, accept_main, srv)) < 0) {
		snprintf(err, errlen, "cannot start the acceptor thread: %s", strerror(-r));
		goto fail;
	}
	srv->accept_thread_started = true;
	*out = srv;
	return 0;
fail:
	rpc_stop(srv, 0);
	return r;
}

void rpc_stop(struct rpc_server *srv, int drain_ms)
{
	if (!srv)
		return;
	if (srv->accept_thread_started) {
		uint64_t one = 1;
		ssize_t w = write(srv->wake_fd, &one, sizeof(one));
		(void)w;
		pthread_join(srv->accept_thread, NULL);
	}
	if (srv->listen_fd >= 0) {
		close(srv->listen_fd);
		unlink(srv->sock_path);
	}
	if (srv->wake_fd >= 0)
		close(srv->wake_fd);
	/* Slow calls on their own threads use the page tables and the
	 * spill store, which go after this returns: let them finish (and reply).
	 * No new one starts meanwhile (a client calling them in a loop would
	 * hold the stop off for good). */
	__atomic_store_n(&srv->slow_closed, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; __atomic_load_n(&srv->slow_calls, __ATOMIC_SEQ_CST); i++) {
		if (i == 0)
			log_notice("waiting for %u spill/restore/checkpoint call(s) to finish",
				   __atomic_load_n(&srv->slow_calls, __ATOMIC_ACQUIRE));
		usleep(10000);
	}
	if (srv->server) {
		if (!srv->started)
			grpc_server_start(srv->server); /* shutdown wants a started server */
		srv->drain_ms = drain_ms;
		__atomic_store_n(&srv->stopping, 1, __ATOMIC_RELEASE);
		grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_tag);
		if (srv->rpc_thread_started)
			pthread_join(srv->rpc_thread, NULL);
		else
			rpc_main(srv); /* start-up failed: drain right here */
		grpc_completion_queue_destroy(srv->cq);
	}
	if (srv->fd_creds)
		grpc_server_credentials_release(srv->fd_creds);
	if (srv->server)
		grpc_shutdown_blocking();
	pthread_mutex_destroy(&srv->peer_lock);
	pthread_mutex_destroy(&srv->cfg_lock);
	pthread_mutex_destroy(&srv->ring_lock);
	free(srv->peers);
	free(srv->cfg);
	free(srv);
}

int rpc_set_config(struct rpc_server *srv, const struct config *cfg, int (*before)(void *ctx), void *ctx)
{
	gid_t og = operator_gid_of(cfg);
	int r = 0;

	pthread_mutex_lock(&srv->cfg_lock);
	if (before)
		r = before(ctx);
	tenant_table_apply(srv->tenants, cfg); /* cfg_lock, then the table's budget_lock */
	srv->operator_gid = og;
	memcpy(srv->cfg, cfg, sizeof(*cfg));
	srv->reloads++;
	pthread_mutex_unlock(&srv->cfg_lock);
	return r;
}

void rpc_set_datapath(struct rpc_server *srv, struct pool *pool, struct ring_server *ring)
{
	__atomic_store_n(&srv->pool, pool, __ATOMIC_RELEASE);
	pthread_mutex_lock(&srv->ring_lock);
	srv->ring = ring;
	pthread_mutex_unlock(&srv->ring_lock);
}

void rpc_set_reclaim(struct rpc_server *srv, struct reclaim *rc)
{
	__atomic_store_n(&srv->reclaim, rc, __ATOMIC_RELEASE);
}

void rpc_set_spill(struct rpc_server *srv, struct spill *sp, struct kvstore *kv)
{
	__atomic_store_n(&srv->kv, kv, __ATOMIC_RELEASE);
	__atomic_store_n(&srv->spill, sp, __ATOMIC_RELEASE);
}
