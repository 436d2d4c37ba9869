/* test_rpc: the control server in-process, driven through client/ctl.c —
 * every method's answers and the untrusted-input paths (malformed,
 * oversized, empty and unknown requests; uid checks; TCP peers). */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/status.h>

#include "harness.h"
#include "config.h"
#include "dataop.h"
#include "pool.h"
#include "devsim.h"
#include "rpc.h"
#include "session.h"
#include "tenant.h"
#include "tq_xform.h"
#include "tqkv.pb-c.h"
#include "../../client/ctl.h"

static struct config *cfg;
static struct tenant_table *tenants;
static struct session_table *sessions;
static struct pool *pool;          /* the page tables GetSession reads transforms from */
static tq_cache *codebooks;
static struct kvstore *kvs;
static struct rpc_server *srv;
static struct ctl *cl, *cl_tcp;
static char dir[64];

static int free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
		return -1;
	close(fd);
	return ntohs(sa.sin_port);
}

static void setup(void)
{
	char text[1024], err[CONFIG_ERR_MAX], target[128];
	struct ctl_status st;
	int port = free_port();

	snprintf(dir, sizeof(dir), "/tmp/tq-rpc-XXXXXX");
	if (!mkdtemp(dir) || port <= 0)
		t_skip("no temporary directory or TCP port");
	/* As root, the rights test below runs clients as uid 65534: the socket's
	 * group is then nogroup (client) and operators are the group users. */
	bool groups = geteuid() == 0 && getgrnam("nogroup") && getgrnam("users");
	snprintf(text, sizeof(text),
		 "[daemon]\nrun_dir = %s\nmax_sessions = 4\ncontrol_tcp_port = %d\nkv_transform = k-center\n%s"
		 "[pool]\npool_bytes = 64M\n"
		 "[tenant default]\nlimit = 32M\nallow_uids = *\n"
		 "[tenant locked]\nlimit = 16M\nallow_uids = 4242\n", dir, port,
		 groups ? "control_group = nogroup\noperator_group = users\n" : "");
	cfg = malloc(sizeof(*cfg));
	if (!cfg || config_load_string(cfg, "test.conf", text, err, sizeof(err)) != 0) {
		fprintf(stderr, "%s\n", err);
		exit(1);
	}
	struct pool_params pp = { .bytes = 16 << 20, .page_bytes = 64 << 10, .numa_node = -1 };
	if (tenant_table_new(&tenants, cfg) || pool_new(&pool, &pp, err, sizeof(err)) ||
	    !(codebooks = tq_cache_new()) || kvstore_new(&kvs, pool, codebooks) ||
	    session_table_new(&sessions, cfg->max_sessions, kvstore_release, kvs) ||
	    (session_table_set_ending(sessions, kvstore_ending), 0) ||
	    rpc_start(&srv, cfg, sessions, tenants, err, sizeof(err))) {
		fprintf(stderr, "setup: %s\n", err);
		exit(1);
	}
	rpc_set_spill(srv, NULL, kvs); /* page tables, no spill tier */
	snprintf(target, sizeof(target), "unix:%s/control.sock", dir);
	if (ctl_open(&cl, target, &st) < 0)
		exit(1);
	snprintf(target, sizeof(target), "127.0.0.1:%d", port);
	if (ctl_open(&cl_tcp, target, &st) < 0)
		exit(1);
}

/* Pools a case gave the running server: freed after rpc_stop.  A handler
 * that read one ran before the case's reply came back, but through gRPC
 * (not instrumented), so ThreadSanitizer would see no order between that
 * read and a free in the case; rpc_stop joins the server's threads.  (The
 * daemon frees its pool only after rpc_stop.) */
static struct pool *retired[8];
static int n_retired;

static void retire(struct pool *p)
{
	rpc_set_datapath(srv, NULL, NULL);
	if (n_retired < (int)(sizeof(retired) / sizeof(retired[0])))
		retired[n_retired++] = p;
	else
		abort();
}

static void teardown(void)
{
	char path[128];

	ctl_close(cl_tcp);
	ctl_close(cl);
	rpc_stop(srv, 500);
	while (n_retired)
		pool_free(retired[--n_retired]);
	session_table_free(sessions);
	kvstore_free(kvs);
	tq_cache_free(codebooks);
	pool_free(pool);
	tenant_table_free(tenants);
	free(cfg);
	snprintf(path, sizeof(path), "%s/control.sock", dir);
	T_EQ(access(path, F_OK), -1); /* removed at stop */
	rmdir(dir);
}

/* OpenSession of 4 layers x 2/8 heads x dim; kv_transform NULL: not set. */
static int open_session_xf(struct ctl *c, const char *tenant, const char *name, uint32_t dim,
			   uint64_t max_tokens, const char *kv_transform, Tqkv__V1__Session **out,
			   struct ctl_status *st)
{
	Tqkv__V1__OpenSessionRequest q = TQKV__V1__OPEN_SESSION_REQUEST__INIT;
	ProtobufCMessage *rep = NULL;

	if (kv_transform)
		q.kv_transform = (char *)kv_transform;
	q.tenant = (char *)tenant;
	q.name = (char *)name;
	q.n_layers = 4;
	q.n_kv_heads = 2;
	q.n_q_heads = 8;
	q.head_dim = dim;
	q.max_tokens = max_tokens;
	int r = ctl_call(c, "OpenSession", &q.base, &rep, 5000, st);
	if (out)
		*out = (void *)rep;
	else if (rep)
		protobuf_c_message_free_unpacked(rep, NULL);
	return r;
}

static int open_session(struct ctl *c, const char *tenant, const char *name, uint32_t dim,
			uint64_t max_tokens, Tqkv__V1__Session **out, struct ctl_status *st)
{
	return open_session_xf(c, tenant, name, dim, max_tokens, NULL, out, st);
}

/* Close every session the caller sees (room under max_sessions = 4). */
static void close_all(void)
{
	Tqkv__V1__ListSessionsRequest lq = TQKV__V1__LIST_SESSIONS_REQUEST__INIT;
	ProtobufCMessage *lrep;
	struct ctl_status st;

	T_EQ(ctl_call(cl, "ListSessions", &lq.base, &lrep, 5000, &st), 0);
	Tqkv__V1__ListSessionsReply *l = (void *)lrep;
	for (size_t i = 0; i < l->n_sessions; i++) {
		Tqkv__V1__SessionRef r0 = TQKV__V1__SESSION_REF__INIT;
		ProtobufCMessage *crep;
		r0.id = l->sessions[i]->id;
		T_EQ(ctl_call(cl, "CloseSession", &r0.base, &crep, 5000, &st), 0);
		protobuf_c_message_free_unpacked(crep, NULL);
	}
	protobuf_c_message_free_unpacked(lrep, NULL);
}

static void test_health(void)
{
	Tqkv__V1__HealthRequest q = TQKV__V1__HEALTH_REQUEST__INIT;
	ProtobufCMessage *rep;
	struct ctl_status st;

	T_EQ(ctl_call(cl, "Health", &q.base, &rep, 5000, &st), 0);
	Tqkv__V1__HealthReply *h = (void *)rep;
	T_ASSERT(strcmp(h->status, "SERVING") == 0);
	T_EQ(h->pid, getpid());
	protobuf_c_message_free_unpacked(rep, NULL);
	T_EQ(ctl_call(cl_tcp, "Health", &q.base, &rep, 5000, &st), 0);
	protobuf_c_message_free_unpacked(rep, NULL);
}

/* The pool's GPU lost (devsim_lose, as tqc_device_lost): Health says
 * NOT_SERVING and why, until the device works again (the main loop stops
 * tqkvd within a tick; the probe must not say SERVING meanwhile). */
static void test_health_device_lost(void)
{
	Tqkv__V1__HealthRequest q = TQKV__V1__HEALTH_REQUEST__INIT;
	ProtobufCMessage *rep;
	struct ctl_status st;
	struct pool *dp;
	char err[256];
	struct pool_params pp = { .bytes = 4 << 20, .page_bytes = 64 << 10, .numa_node = -1,
				  .backend = &backend_devsim };

	T_EQ(pool_new(&dp, &pp, err, sizeof(err)), 0);
	rpc_set_datapath(srv, dp, NULL);
	for (int lost = 0; lost < 3; lost++) { /* works, lost, works again */
		devsim_lose(lost == 1 ? "CUDA error 999 (unspecified launch failure) in attention" : NULL);
		T_EQ(ctl_call(cl, "Health", &q.base, &rep, 5000, &st), 0);
		Tqkv__V1__HealthReply *h = (void *)rep;
		if (lost == 1) {
			T_ASSERT(strcmp(h->status, "NOT_SERVING") == 0);
			T_ASSERT(strstr(h->reason, "unspecified launch failure") != NULL);
		} else {
			T_ASSERT(strcmp(h->status, "SERVING") == 0);
			T_ASSERT(strcmp(h->reason, "") == 0);
		}
		protobuf_c_message_free_unpacked(rep, NULL);
	}
	retire(dp);
}

/* A session's pages: GetSession's page_tokens and GetStats'
 * page_tokens_align, on a host pool (the most tokens that fit) and on a
 * pool whose kernels read tiles of 32 tokens (devsim, as cuda: a multiple
 * of 32, and the daemon logs a session whose page holds fewer). */
static void test_page_tokens(void)
{
	Tqkv__V1__GetStatsRequest sq = TQKV__V1__GET_STATS_REQUEST__INIT;
	const struct session_geom g = { .n_layers = 4, .n_kv_heads = 2, .n_q_heads = 8, .head_dim = 128,
					.k_codec = TQ_CODEC_Q8, .v_codec = TQ_CODEC_TQ4, .max_tokens = 1000 };
	const struct backend_ops *bes[2] = { &backend_host, &backend_devsim };
	struct ctl_status st;
	char err[256];

	/* 4 KiB pages at 400 bytes a token (2 heads x (132 + 68)): 10 tokens, below 32 */
	T_EQ(dataop_page_tokens(4096, 32, &g), 10);
	T_EQ(dataop_page_tokens(4096, 0, &g), 10);
	T_EQ(dataop_page_bytes_min(32, &g), 16384u);
	T_EQ(dataop_page_tokens(16384, 32, &g), 32);
	for (int b = 0; b < 2; b++) {
		struct pool *p;
		struct pool_params pp = { .bytes = 4 << 20, .page_bytes = 64 << 10, .numa_node = -1,
					  .backend = bes[b] };
		Tqkv__V1__Session *s;
		ProtobufCMessage *rep;

		T_EQ(pool_new(&p, &pp, err, sizeof(err)), 0);
		rpc_set_datapath(srv, p, NULL);
		T_EQ(ctl_call(cl, "GetStats", &sq.base, &rep, 5000, &st), 0);
		T_EQ(((Tqkv__V1__Stats *)rep)->page_tokens_align, b ? 32u : 0u);
		protobuf_c_message_free_unpacked(rep, NULL);
		T_EQ(open_session(cl, "", "pages", 128, 1000, &s, &st), 0);
		/* 64 KiB at 400 bytes a token: 163 fit; 160 in tiles of 32 */
		T_EQ(s->page_tokens, b ? 160u : 163u);
		T_EQ(s->page_tokens, (uint32_t)dataop_page_tokens(64 << 10, b ? 32 : 0, &g));
		protobuf_c_message_free_unpacked(&s->base, NULL);
		close_all();
		retire(p);
	}
}

static void test_open_defaults_and_owner(void)
{
	Tqkv__V1__Session *s;
	struct ctl_status st;

	T_EQ(open_session(cl, "", "one", 128, 1000, &s, &st), 0);
	T_ASSERT(strcmp(s->tenant, "default") == 0);     /* no tenant: "default" */
	T_ASSERT(strcmp(s->k_codec, "q8") == 0);         /* the default pair */
	T_ASSERT(strcmp(s->v_codec, "tq4") == 0);
	T_EQ(s->owner_uid, getuid());                     /* from the kernel */
	T_EQ(s->state, TQKV__V1__SESSION_STATE__SESSION_STATE_OPEN);
	T_EQ(s->bytes_per_token, 4 * 2 * (132 + 68));
	uint64_t id = s->id;
	protobuf_c_message_free_unpacked(&s->base, NULL);

	Tqkv__V1__SessionRef ref = TQKV__V1__SESSION_REF__INIT;
	ProtobufCMessage *rep;
	ref.id = id;
	T_EQ(ctl_call(cl, "GetSession", &ref.base, &rep, 5000, &st), 0);
	T_ASSERT(strcmp(((Tqkv__V1__Session *)rep)->name, "one") == 0);
	protobuf_c_message_free_unpacked(rep, NULL);
	T_EQ(ctl_call(cl, "EvictSession", &ref.base, &rep, 5000, &st), 0);
	T_EQ(((Tqkv__V1__Session *)rep)->state, TQKV__V1__SESSION_STATE__SESSION_STATE_EVICTED);
	protobuf_c_message_free_unpacked(rep, NULL);
	T_EQ(ctl_call(cl, "EvictSession", &ref.base, &rep, 5000, &st), GRPC_STATUS_FAILED_PRECONDITION);
	T_EQ(ctl_call(cl, "CloseSession", &ref.base, &rep, 5000, &st), 0);
	protobuf_c_message_free_unpacked(rep, NULL);
	T_EQ(ctl_call(cl, "CloseSession", &ref.base, &rep, 5000, &st), GRPC_STATUS_NOT_FOUND);
	T_ASSERT(strstr(st.msg, "no session"));
	T_EQ(ctl_call(cl, "GetSession", &ref.base, &rep, 5000, &st), GRPC_STATUS_NOT_FOUND);
	ref.id = 0;
	T_EQ(ctl_call(cl, "GetSession", &ref.base, &rep, 5000, &st), GRPC_STATUS_INVALID_ARGUMENT);
}

static void test_open_rejections(void)
{
	Tqkv__V1__OpenSessionRequest q = TQKV__V1__OPEN_SESSION_REQUEST__INIT;
	ProtobufCMessage *rep;
	struct ctl_status st;

	T_EQ(open_session(cl, "nope", "", 128, 10, NULL, &st), GRPC_STATUS_INVALID_ARGUMENT);
	T_ASSERT(strstr(st.msg, "unknown tenant 'nope'"));
	T_EQ(open_session(cl, "locked", "", 128, 10, NULL, &st), GRPC_STATUS_PERMISSION_DENIED);
	T_ASSERT(strstr(st.msg, "may not use tenant 'locked'"));
	T_EQ(open_session(cl, "default", "", 100, 10, NULL, &st), GRPC_STATUS_INVALID_ARGUMENT);
	T_ASSERT(strstr(st.msg, "head_dim"));
	T_EQ(open_session(cl, "default", "", 128, 1ull << 40, NULL, &st), GRPC_STATUS_INVALID_ARGUMENT);
	T_EQ(open_session(cl, "default", "", 128, 1ull << 30, NULL, &st), GRPC_STATUS_RESOURCE_EXHAUSTED);
	T_EQ(open_session(cl, "default", "bad name!", 128, 10, NULL, &st), GRPC_STATUS_INVALID_ARGUMENT);
	T_EQ(open_session(cl, "default", "\x01\x02", 128, 10, NULL, &st), GRPC_STATUS_INVALID_ARGUMENT);
	T_ASSERT(strstr(st.msg, "not printable"));
	/* TCP peers have no kernel credentials */
	T_EQ(open_session(cl_tcp, "default", "", 128, 10, NULL, &st), GRPC_STATUS_PERMISSION_DENIED);
	T_ASSERT(strstr(st.msg, "unix control socket"));
	/* attached to a data connection that does not exist (here: no data
	 * path at all): refused with the reason, and no session left behind */
	Tqkv__V1__ListSessionsRequest lq = TQKV__V1__LIST_SESSIONS_REQUEST__INIT;
	ProtobufCMessage *lrep;
	T_EQ(ctl_call(cl, "ListSessions", &lq.base, &lrep, 5000, &st), 0);
	const size_t before = ((Tqkv__V1__ListSessionsReply *)lrep)->n_sessions;
	protobuf_c_message_free_unpacked(lrep, NULL);
	Tqkv__V1__OpenSessionRequest qd = TQKV__V1__OPEN_SESSION_REQUEST__INIT;
	qd.tenant = (char *)"default";
	qd.n_layers = 1; qd.n_kv_heads = 1; qd.n_q_heads = 1; qd.head_dim = 64; qd.max_tokens = 1;
	qd.data_client = 4242;
	T_EQ(ctl_call(cl, "OpenSession", &qd.base, &rep, 5000, &st), GRPC_STATUS_FAILED_PRECONDITION);
	T_ASSERT(strstr(st.msg, "no live data connection 4242"));
	T_ASSERT(strstr(st.msg, "the session was not opened"));
	T_EQ(ctl_call(cl, "ListSessions", &lq.base, &lrep, 5000, &st), 0);
	T_EQ(((Tqkv__V1__ListSessionsReply *)lrep)->n_sessions, before);
	protobuf_c_message_free_unpacked(lrep, NULL);
	/* an empty request: everything missing */
	T_EQ(ctl_call(cl, "OpenSession", &q.base, &rep, 5000, &st), GRPC_STATUS_INVALID_ARGUMENT);
	q.n_layers = 1; q.n_kv_heads = 1; q.n_q_heads = 1; q.head_dim = 64; q.max_tokens = 1;
	q.k_codec = (char *)"tq9";
	T_EQ(ctl_call(cl, "OpenSession", &q.base, &rep, 5000, &st), GRPC_STATUS_INVALID_ARGUMENT);
	T_ASSERT(strstr(st.msg, "unknown K codec 'tq9'"));
	q.k_codec = (char *)"";
	q.v_codec = (char *)"f32";
	q.has_rotation_seed = 1;
	q.rotation_seed = 77;
	T_EQ(ctl_call(cl, "OpenSession", &q.base, &rep, 5000, &st), 0);
	T_EQ(((Tqkv__V1__Session *)rep)->rotation_seed, 77);
	T_ASSERT(strcmp(((Tqkv__V1__Session *)rep)->v_codec, "f32") == 0);
	protobuf_c_message_free_unpacked(rep, NULL);
}

static void test_names_and_limits(void)
{
	Tqkv__V1__ListSessionsRequest lq = TQKV__V1__LIST_SESSIONS_REQUEST__INIT;
	ProtobufCMessage *rep;
	struct ctl_status st;

	T_EQ(open_session(cl, "default", "dup", 64, 10, NULL, &st), 0);
	T_EQ(open_session(cl, "default", "dup", 64, 10, NULL, &st), GRPC_STATUS_ALREADY_EXISTS);
	/* max_sessions = 4: the earlier test left one, "dup" makes two */
	T_EQ(open_session(cl, "default", "", 64, 10, NULL, &st), 0);
	T_EQ(open_session(cl, "default", "", 64, 10, NULL, &st), 0);
	T_EQ(open_session(cl, "default", "", 64, 10, NULL, &st), GRPC_STATUS_RESOURCE_EXHAUSTED);
	T_ASSERT(strstr(st.msg, "max_sessions"));
	T_EQ(ctl_call(cl, "ListSessions", &lq.base, &rep, 5000, &st), 0);
	T_EQ(((Tqkv__V1__ListSessionsReply *)rep)->n_sessions, 4);
	protobuf_c_message_free_unpacked(rep, NULL);
	lq.tenant = (char *)"locked";
	T_EQ(ctl_call(cl, "ListSessions", &lq.base, &rep, 5000, &st), 0);
	T_EQ(((Tqkv__V1__ListSessionsReply *)rep)->n_sessions, 0);
	protobuf_c_message_free_unpacked(rep, NULL);
	lq.tenant = (char *)"zzz";
	T_EQ(ctl_call(cl, "ListSessions", &lq.base, &rep, 5000, &st), GRPC_STATUS_INVALID_ARGUMENT);
}

/* A call whose method cannot be requested again when it arrives (out of
 * memory) is retried at the RPC thread's next tick: the method's next
 * call is answered, not queued unanswered for good (it was: every later
 * call of that method ran into its deadline while the watchdog went on). */
static void test_request_retried(void)
{
	Tqkv__V1__HealthRequest q = TQKV__V1__HEALTH_REQUEST__INIT;
	ProtobufCMessage *rep;
	struct ctl_status st;
	struct timespec a, b;

	rpc_fault_request(1);
	T_EQ(ctl_call(cl, "Health", &q.base, &rep, 5000, &st), 0); /* answered; its method's request fails */
	protobuf_c_message_free_unpacked(rep, NULL);
	clock_gettime(CLOCK_MONOTONIC, &a);
	T_EQ(ctl_call(cl, "Health", &q.base, &rep, 3000, &st), 0);
	protobuf_c_message_free_unpacked(rep, NULL);
	clock_gettime(CLOCK_MONOTONIC, &b);
	T_ASSERT((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 < 2000);
}

static void test_tenants_and_budget(void)
{
	Tqkv__V1__ListTenantsRequest lq = TQKV__V1__LIST_TENANTS_REQUEST__INIT;
	Tqkv__V1__SetTenantBudgetRequest bq = TQKV__V1__SET_TENANT_BUDGET_REQUEST__INIT;
	ProtobufCMessage *rep;
	struct ctl_status st;

	T_EQ(ctl_call(cl, "ListTenants", &lq.base, &rep, 5000, &st), 0);
	Tqkv__V1__ListTenantsReply *l = (void *)rep;
	T_EQ(l->n_tenants, 2);
	T_ASSERT(strcmp(l->tenants[1]->name, "locked") == 0);
	T_EQ(l->tenants[1]->n_allow_uids, 1);
	T_EQ(l->tenants[1]->allow_uids[0], 4242);
	T_EQ(l->tenants[0]->sessions, 4);
	protobuf_c_message_free_unpacked(rep, NULL);

	bq.tenant = (char *)"locked";
	T_EQ(ctl_call(cl, "SetTenantBudget", &bq.base, &rep, 5000, &st), GRPC_STATUS_INVALID_ARGUMENT);
	bq.set_limit = 1;
	bq.limit_bytes = 8 << 20;
	bq.set_guaranteed = 1;
	bq.guaranteed_bytes = 4 << 20;
	T_EQ(ctl_call(cl, "SetTenantBudget", &bq.base, &rep, 5000, &st), 0);
	T_EQ(((Tqkv__V1__Tenant *)rep)->limit_bytes, 8 << 20);
	T_EQ(((Tqkv__V1__Tenant *)rep)->guaranteed_bytes, 4 << 20);
	protobuf_c_message_free_unpacked(rep, NULL);
	bq.limit_bytes = 1ull << 40;
	T_EQ(ctl_call(cl, "SetTenantBudget", &bq.base, &rep, 5000, &st), GRPC_STATUS_INVALID_ARGUMENT);
	T_ASSERT(strstr(st.msg, "limit"));
	bq.set_limit = 0;
	bq.guaranteed_bytes = 1ull << 40;
	T_EQ(ctl_call(cl, "SetTenantBudget", &bq.base, &rep, 5000, &st), GRPC_STATUS_INVALID_ARGUMENT);
	bq.tenant = (char *)"nope";
	T_EQ(ctl_call(cl, "SetTenantBudget", &bq.base, &rep, 5000, &st), GRPC_STATUS_INVALID_ARGUMENT);
	/* a reload's configuration puts the file's budget back in the table
	 * itself, with GetConfig's copy, under one lock: a SetTenantBudget
	 * between the table's apply and the copy left one budget running
	 * and another shown */
	rpc_set_config(srv, cfg, NULL, NULL);
	T_EQ(ctl_call(cl, "ListTenants", &lq.base, &rep, 5000, &st), 0);
	l = (void *)rep;
	T_EQ(l->tenants[1]->limit_bytes, config_tenant(cfg, "locked")->limit);
	T_EQ(l->tenants[1]->guaranteed_bytes, config_tenant(cfg, "locked")->guaranteed);
	protobuf_c_message_free_unpacked(rep, NULL);
}

static void test_stats_and_config(void)
{
	Tqkv__V1__GetStatsRequest sq = TQKV__V1__GET_STATS_REQUEST__INIT;
	Tqkv__V1__GetConfigRequest cq = TQKV__V1__GET_CONFIG_REQUEST__INIT;
	ProtobufCMessage *rep;
	struct ctl_status st;

	T_EQ(ctl_call(cl, "GetStats", &sq.base, &rep, 5000, &st), 0);
	Tqkv__V1__Stats *s = (void *)rep;
	T_EQ(s->pool_bytes, 64 << 20);
	T_EQ(s->sessions_open, 4);
	T_EQ(s->tenants, 2);
	T_ASSERT(s->rpc_calls_total > 10);
	T_ASSERT(s->rpc_errors_total > 5);
	T_EQ(s->evictions_total, 1);
	protobuf_c_message_free_unpacked(rep, NULL);

	T_EQ(ctl_call(cl, "GetConfig", &cq.base, &rep, 5000, &st), 0);
	Tqkv__V1__GetConfigReply *c = (void *)rep;
	T_ASSERT(strcmp(c->config_path, "test.conf") == 0);
	int seen = 0;
	for (size_t i = 0; i < c->n_entries; i++) {
		if (strcmp(c->entries[i]->key, "pool.pool_bytes") == 0) {
			T_ASSERT(strcmp(c->entries[i]->value, "64MiB") == 0);
			T_ASSERT(strcmp(c->entries[i]->default_value, "1GiB") == 0);
			T_ASSERT(!c->entries[i]->reloadable);
			seen++;
		}
		if (strcmp(c->entries[i]->key, "tenant.locked.allow_uids") == 0) {
			T_ASSERT(strcmp(c->entries[i]->value, "4242") == 0);
			T_ASSERT(c->entries[i]->reloadable);
			seen++;
		}
	}
	T_EQ(seen, 2);
	protobuf_c_message_free_unpacked(rep, NULL);
}

static void test_bad_messages(void)
{
	struct ctl_status st;
	void *rep;
	size_t len;
	/* field 1 as a length-delimited string longer than the message */
	static const uint8_t truncated[] = { 0x0a, 0x50, 'a', 'b' };
	/* an unknown wire type (7) */
	static const uint8_t bad_wire[] = { 0x0f, 0x01 };
	/* a varint that never ends */
	static const uint8_t endless[] = { 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };

	T_EQ(ctl_call_raw(cl, "/tqkv.v1.Control/OpenSession", truncated, sizeof(truncated), &rep, &len, 5000, &st),
	     GRPC_STATUS_INVALID_ARGUMENT);
	T_ASSERT(strstr(st.msg, "malformed"));
	T_EQ(ctl_call_raw(cl, "/tqkv.v1.Control/GetSession", bad_wire, sizeof(bad_wire), &rep, &len, 5000, &st),
	     GRPC_STATUS_INVALID_ARGUMENT);
	T_EQ(ctl_call_raw(cl, "/tqkv.v1.Control/GetSession", endless, sizeof(endless), &rep, &len, 5000, &st),
	     GRPC_STATUS_INVALID_ARGUMENT);
	/* a string with an embedded NUL is refused, not taken as its prefix
	 * ("default\0x" would otherwise name tenant 'default') */
	static const uint8_t nul_tenant[] = { 0x0a, 0x09, 'd', 'e', 'f', 'a', 'u', 'l', 't', 0, 'x' };
	T_EQ(ctl_call_raw(cl, "/tqkv.v1.Control/ListSessions", nul_tenant, sizeof(nul_tenant), &rep, &len, 5000, &st),
	     GRPC_STATUS_INVALID_ARGUMENT);
	T_ASSERT(strstr(st.msg, "NUL"));
	T_EQ(ctl_call_raw(cl, "/tqkv.v1.Control/SetTenantBudget", nul_tenant, sizeof(nul_tenant), &rep, &len, 5000, &st),
	     GRPC_STATUS_INVALID_ARGUMENT);
	/* unknown method */
	T_EQ(ctl_call_raw(cl, "/tqkv.v1.Control/Explode", "", 0, &rep, &len, 5000, &st), GRPC_STATUS_UNIMPLEMENTED);
	T_EQ(ctl_call_raw(cl, "/other.Service/Health", "", 0, &rep, &len, 5000, &st), GRPC_STATUS_UNIMPLEMENTED);
	/* oversized: more than RPC_MAX_RECV_BYTES */
	size_t big = RPC_MAX_RECV_BYTES * 4;
	uint8_t *b = calloc(1, big);
	T_ASSERT(b);
	T_EQ(ctl_call_raw(cl, "/tqkv.v1.Control/Health", b, big, &rep, &len, 5000, &st),
	     GRPC_STATUS_RESOURCE_EXHAUSTED);
	free(b);
	/* an empty message is a valid Health request */
	T_EQ(ctl_call_raw(cl, "/tqkv.v1.Control/Health", "", 0, &rep, &len, 5000, &st), 0);
	free(rep);
	/* and the server still answers after all that */
	T_EQ(ctl_call_raw(cl, "/tqkv.v1.Control/Health", "", 0, &rep, &len, 5000, &st), 0);
	free(rep);
}

/* ---- who may do what (run as root: clients as uid 65534) ---------------------------- */

static int child_fails;
#define C_EXPECT(call, want) do { \
	int got_ = (call); \
	if (got_ != (want)) { \
		fprintf(stderr, "  as uid %u: %s: got %d, want %d (%s)\n", (unsigned)getuid(), #call, got_, \
			(want), st.msg); \
		child_fails++; \
	} \
} while (0)

/* In the child, as uid 65534: every method once, on its own session and
 * on root's.  operator: the child has the operator group. */
/* ctl_call, the reply freed: only the status matters here. */
static int cc(struct ctl *c, const char *method, const ProtobufCMessage *q, struct ctl_status *st)
{
	ProtobufCMessage *rep = NULL;
	int r = ctl_call(c, method, q, &rep, 5000, st);
	if (rep)
		protobuf_c_message_free_unpacked(rep, NULL);
	return r;
}

static int rights_child(const char *sock, uint64_t roots, int operator_)
{
	struct ctl *c;
	struct ctl_status st;
	ProtobufCMessage *rep;
	Tqkv__V1__Session *mine;
	Tqkv__V1__SessionRef ref = TQKV__V1__SESSION_REF__INIT;
	Tqkv__V1__HealthRequest hq = TQKV__V1__HEALTH_REQUEST__INIT;
	Tqkv__V1__GetStatsRequest sq = TQKV__V1__GET_STATS_REQUEST__INIT;
	Tqkv__V1__ListSessionsRequest lq = TQKV__V1__LIST_SESSIONS_REQUEST__INIT;
	Tqkv__V1__ListTenantsRequest tq = TQKV__V1__LIST_TENANTS_REQUEST__INIT;
	Tqkv__V1__SetTenantBudgetRequest bq = TQKV__V1__SET_TENANT_BUDGET_REQUEST__INIT;
	Tqkv__V1__GetConfigRequest cq = TQKV__V1__GET_CONFIG_REQUEST__INIT;
	int denied = GRPC_STATUS_PERMISSION_DENIED, ok_op = operator_ ? 0 : denied;

	if (ctl_open(&c, sock, &st) < 0) {
		fprintf(stderr, "  as uid %u: connect %s: %s\n", (unsigned)getuid(), sock, st.msg);
		return 1;
	}
	C_EXPECT(cc(c, "Health", &hq.base, &st), 0);
	C_EXPECT(cc(c, "GetStats", &sq.base, &st), 0);
	/* its own session: open, get, list (only its own unless operator), evict, close */
	C_EXPECT(open_session(c, "default", "", 64, 100, &mine, &st), 0);
	if (!mine)
		return 1;
	C_EXPECT((int)mine->owner_uid, (int)getuid());
	C_EXPECT(open_session(c, "locked", "", 64, 100, NULL, &st), denied); /* allow_uids 4242 */
	ref.id = mine->id;
	C_EXPECT(cc(c, "GetSession", &ref.base, &st), 0);
	C_EXPECT(ctl_call(c, "ListSessions", &lq.base, &rep, 5000, &st), 0);
	if (rep) {
		Tqkv__V1__ListSessionsReply *l = (void *)rep;
		size_t others = 0;
		for (size_t i = 0; i < l->n_sessions; i++)
			others += l->sessions[i]->owner_uid != getuid();
		C_EXPECT(others > 0, operator_ != 0);
		protobuf_c_message_free_unpacked(rep, NULL);
	}
	C_EXPECT(cc(c, "ListTenants", &tq.base, &st), 0);
	C_EXPECT(cc(c, "EvictSession", &ref.base, &st), 0);
	C_EXPECT(cc(c, "CloseSession", &ref.base, &st), 0);
	/* root's session */
	ref.id = roots;
	C_EXPECT(cc(c, "GetSession", &ref.base, &st), ok_op);
	if (!operator_ && !strstr(st.msg, "belongs to another user")) {
		fprintf(stderr, "  GetSession of another's session: '%s'\n", st.msg);
		child_fails++;
	}
	C_EXPECT(cc(c, "EvictSession", &ref.base, &st), ok_op);
	if (!operator_)
		C_EXPECT(cc(c, "CloseSession", &ref.base, &st), denied);
	/* operators only */
	bq.tenant = "default";
	bq.set_limit = 1;
	bq.limit_bytes = 32 << 20;
	C_EXPECT(cc(c, "SetTenantBudget", &bq.base, &st), ok_op);
	if (!operator_ && !strstr(st.msg, "operator")) {
		fprintf(stderr, "  SetTenantBudget refusal does not say why: '%s'\n", st.msg);
		child_fails++;
	}
	C_EXPECT(cc(c, "GetConfig", &cq.base, &st), ok_op);
	/* the spill tier's actions: operators only (this server has no tier) */
	Tqkv__V1__SpillSessionRequest spq = TQKV__V1__SPILL_SESSION_REQUEST__INIT;
	spq.id = roots;
	C_EXPECT(cc(c, "SpillSession", &spq.base, &st), operator_ ? GRPC_STATUS_FAILED_PRECONDITION : denied);
	C_EXPECT(cc(c, "RestoreSession", &ref.base, &st), operator_ ? GRPC_STATUS_FAILED_PRECONDITION : denied);
	protobuf_c_message_free_unpacked(&mine->base, NULL);
	ctl_close(c);
	return child_fails ? 1 : 0;
}

/* fork, drop to uid 65534 (with the operator group or not), exec the copy. */
/* operator_: 0 a client, 1 an operator (the group "users" its one
 * supplementary group), 2 an operator among 80 groups (more than the
 * daemon keeps a peer's: the first 64 by gid, "users" among them; the user
 * database, which the daemon read instead, names none for uid 65534) */
static int run_as_65534(const char *exe, uint64_t roots, int operator_)
{
	char idbuf[32], sock[128];
	pid_t pid;
	int wst;

	snprintf(idbuf, sizeof(idbuf), "%llu", (unsigned long long)roots);
	snprintf(sock, sizeof(sock), "unix:%s/control.sock", dir);
	pid = fork();
	if (pid == 0) {
		gid_t g[80];
		g[0] = getgrnam("users")->gr_gid;
		for (int i = 1; i < 80; i++)
			g[i] = 40000 + (gid_t)i;
		if (setgroups(operator_ == 2 ? 80 : operator_ ? 1 : 0, g) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
			_exit(99);
		execl(exe, exe, "--rights-child", sock, idbuf, operator_ ? "1" : "0", (char *)NULL);
		_exit(98);
	}
	if (pid < 0 || waitpid(pid, &wst, 0) < 0)
		return -1;
	return WIFEXITED(wst) ? WEXITSTATUS(wst) : 128 + WTERMSIG(wst);
}

static void test_rights(void)
{
	char exe[128], cmd[320];
	Tqkv__V1__Session *s;
	struct ctl_status st;

	if (geteuid() != 0 || !getgrnam("nogroup") || !getgrnam("users")) {
		fprintf(stderr, "    skipped: needs root and the groups nogroup and users\n");
		return;
	}
	/* the child runs from a copy it can read, in a directory it can reach */
	snprintf(exe, sizeof(exe), "%s/test_rpc", dir);
	snprintf(cmd, sizeof(cmd), "cp /proc/%d/exe %s && chmod 0755 %s", (int)getpid(), exe, exe);
	T_EQ(system(cmd), 0);
	T_EQ(chmod(dir, 0711), 0);
	/* room under max_sessions: close what the earlier cases left */
	close_all();
	T_EQ(open_session(cl, "default", "roots", 64, 100, &s, &st), 0);
	uint64_t id = s->id;
	protobuf_c_message_free_unpacked(&s->base, NULL);
	T_EQ(run_as_65534(exe, id, 0), 0);   /* a client */
	T_EQ(run_as_65534(exe, id, 1), 0);   /* an operator (operator_group) */
	Tqkv__V1__SessionRef ref = TQKV__V1__SESSION_REF__INIT;
	ProtobufCMessage *rep;
	ref.id = id;
	T_EQ(ctl_call(cl, "CloseSession", &ref.base, &rep, 5000, &st), 0);
	protobuf_c_message_free_unpacked(rep, NULL);
	/* the same among 80 groups, on a session of root's of its own (the
	 * operator's run evicted the first) */
	close_all();
	T_EQ(open_session(cl, "default", "roots2", 64, 100, &s, &st), 0);
	ref.id = s->id;
	protobuf_c_message_free_unpacked(&s->base, NULL);
	T_EQ(run_as_65534(exe, ref.id, 2), 0);
	T_EQ(ctl_call(cl, "CloseSession", &ref.base, &rep, 5000, &st), 0);
	protobuf_c_message_free_unpacked(rep, NULL);
	unlink(exe);
}

static void get_session(uint64_t id, Tqkv__V1__Session **out)
{
	Tqkv__V1__SessionRef ref = TQKV__V1__SESSION_REF__INIT;
	ProtobufCMessage *rep = NULL;
	struct ctl_status st;

	ref.id = id;
	T_EQ(ctl_call(cl, "GetSession", &ref.base, &rep, 5000, &st), 0);
	*out = (void *)rep;
}

/* OpenSession.kv_transform: validated, "" = daemon.kv_transform (reloads);
 * GetSession's per-layer transforms after appends. */
static void test_kv_transform(void)
{
	Tqkv__V1__Session *s;
	struct ctl_status st;

	close_all();
	static const char *const bad[] = { "bogus", "k-eq-k+k-eq-qk", "k-center;v-center", "0x3" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		T_EQ(open_session_xf(cl, "default", "", 64, 64, bad[i], NULL, &st), GRPC_STATUS_INVALID_ARGUMENT);
		T_ASSERT(strstr(st.msg, "unknown kv_transform"));
		T_ASSERT(strstr(st.msg, "k-center, k-sink, v-center, v-eq, k-eq-qk, k-eq-k, k-unshrink")); /* lists the names */
	}
	/* "": the configured default (k-center in this test's config) */
	T_EQ(open_session_xf(cl, "default", "", 64, 64, "", &s, &st), 0);
	T_ASSERT(strcmp(s->kv_transform, "k-center") == 0);
	T_EQ(s->n_layer_transforms, 0); /* OpenSession's reply: none */
	uint64_t id_cfg = s->id;
	protobuf_c_message_free_unpacked(&s->base, NULL);
	T_EQ(open_session_xf(cl, "default", "", 64, 64, "none", &s, &st), 0);
	T_ASSERT(strcmp(s->kv_transform, "none") == 0);
	uint64_t id_none = s->id;
	protobuf_c_message_free_unpacked(&s->base, NULL);
	T_EQ(open_session_xf(cl, "default", "", 64, 64, "default", &s, &st), 0);
	T_ASSERT(strcmp(s->kv_transform, "k-center+v-eq+k-eq-qk+k-unshrink+k-order") == 0); /* TQ_XF_DEFAULT */
	uint64_t id = s->id;
	protobuf_c_message_free_unpacked(&s->base, NULL);
	/* a reload changes what new sessions get, not the open ones */
	struct config *next = malloc(sizeof(*next));
	T_ASSERT(next);
	memcpy(next, cfg, sizeof(*cfg));
	next->kv_transform = TQ_XF_K_CENTER | TQ_XF_V_CENTER;
	rpc_set_config(srv, next, NULL, NULL);
	T_EQ(open_session_xf(cl, "default", "", 64, 64, NULL, &s, &st), 0);
	T_ASSERT(strcmp(s->kv_transform, "k-center+v-center") == 0);
	uint64_t id_reload = s->id;
	protobuf_c_message_free_unpacked(&s->base, NULL);
	rpc_set_config(srv, cfg, NULL, NULL);
	free(next);
	get_session(id_cfg, &s);
	T_ASSERT(strcmp(s->kv_transform, "k-center") == 0);
	T_EQ(s->n_layer_transforms, 0); /* no data yet */
	protobuf_c_message_free_unpacked(&s->base, NULL);

	/* ListSessions: the mode, never the layers */
	Tqkv__V1__ListSessionsRequest lq = TQKV__V1__LIST_SESSIONS_REQUEST__INIT;
	ProtobufCMessage *lrep;
	T_EQ(ctl_call(cl, "ListSessions", &lq.base, &lrep, 5000, &st), 0);
	Tqkv__V1__ListSessionsReply *l = (void *)lrep;
	T_EQ(l->n_sessions, 4);
	for (size_t i = 0; i < l->n_sessions; i++) {
		T_ASSERT(l->sessions[i]->kv_transform[0]);
		T_EQ(l->sessions[i]->n_layer_transforms, 0);
	}
	protobuf_c_message_free_unpacked(lrep, NULL);

	/* Session `id` (k-center+v-eq+k-eq-qk+k-unshrink): layer 0 gets 16 tokens with their
	 * queries (prefill: it calibrates K centering and equalization), layer
	 * 1 four tokens (under TQ_XF_MIN_TOKENS: the identity), 2 and 3 none. */
	enum { N = 16, KVH = 2, QH = 8, D = 64 };
	static float k[N * KVH * D], v[N * KVH * D], q[N * QH * D], out[N * QH * D];
	int32_t pos[N];
	uint32_t x = 12345;
	for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
		x = x * 1103515245u + 12345u;
		k[i] = 2.0f + (float)(x >> 16) / 65536.0f * (1.0f + (float)(i % D) / 8.0f); /* offset keys */
		x = x * 1103515245u + 12345u;
		v[i] = (float)(x >> 16) / 65536.0f - 0.5f;
	}
	for (size_t i = 0; i < sizeof(q) / sizeof(q[0]); i++) {
		x = x * 1103515245u + 12345u;
		q[i] = (float)(x >> 16) / 65536.0f - 0.5f;
	}
	for (int i = 0; i < N; i++)
		pos[i] = i;
	struct session *ss;
	struct dataop_ws ws = { 0 };
	struct dataop_res r;
	T_EQ(session_acquire(sessions, id, 0, &ss), 0);
	dataop_attend(kvs, ss, &ws, 0, k, v, N, q, pos, N, TQ_DTYPE_F32, out, &r);
	T_EQ(r.res, N);
	dataop_append(kvs, ss, 1, k, v, TQ_DTYPE_F32, 4, &r);
	T_EQ(r.res, 4);
	session_release(ss);
	dataop_ws_free(&ws);

	get_session(id, &s);
	T_EQ(s->tokens, N);
	T_EQ(s->n_layer_transforms, 4); /* one per layer, in order */
	for (uint32_t i = 0; i < 4; i++)
		T_EQ(s->layer_transforms[i]->layer, i);
	const Tqkv__V1__LayerTransform *l0 = s->layer_transforms[0], *l1 = s->layer_transforms[1];
	for (uint32_t i = 2; i < 4; i++) { /* never appended to */
		T_ASSERT(!s->layer_transforms[i]->calibrated);
		T_ASSERT(strcmp(s->layer_transforms[i]->applied, "none") == 0);
		T_EQ(s->layer_transforms[i]->calib_tokens, 0);
	}
	{
		T_ASSERT(l0->calibrated);
		T_ASSERT(strcmp(l0->applied, "k-center+v-eq+k-eq-qk+k-unshrink") == 0);
		T_EQ(l0->calib_tokens, N);
		T_ASSERT(l0->k_rms > 0.0f && l0->k_mean_norm > 0.5f * l0->k_rms); /* the offset shows */
		T_ASSERT(l0->scale_min > 0.0f && l0->scale_min < 1.0f && l0->scale_max > 1.0f);
		T_ASSERT(l1->calibrated);
		T_ASSERT(strcmp(l1->applied, "k-unshrink") == 0); /* 4 < TQ_XF_MIN_TOKENS: no statistics */
	}
	protobuf_c_message_free_unpacked(&s->base, NULL);

	/* evicted: the mode stays, the layers are gone */
	Tqkv__V1__SessionRef ref = TQKV__V1__SESSION_REF__INIT;
	ProtobufCMessage *rep;
	ref.id = id;
	T_EQ(ctl_call(cl, "EvictSession", &ref.base, &rep, 5000, &st), 0);
	protobuf_c_message_free_unpacked(rep, NULL);
	get_session(id, &s);
	T_ASSERT(strcmp(s->kv_transform, "k-center+v-eq+k-eq-qk+k-unshrink+k-order") == 0);
	T_EQ(s->n_layer_transforms, 0);
	protobuf_c_message_free_unpacked(&s->base, NULL);
	(void)id_none;
	(void)id_reload;
	close_all();
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "--rights-child"))
		return rights_child(argv[2], strtoull(argv[3], NULL, 0), atoi(argv[4]));
	setup();
	T_RUN(test_health);
	T_RUN(test_health_device_lost);
	T_RUN(test_request_retried);
	T_RUN(test_open_defaults_and_owner);
	T_RUN(test_page_tokens);
	T_RUN(test_open_rejections);
	T_RUN(test_names_and_limits);
	T_RUN(test_tenants_and_budget);
	T_RUN(test_stats_and_config);
	T_RUN(test_bad_messages);
	T_RUN(test_rights);
	T_RUN(test_kv_transform);
	T_RUN(teardown);
	return t_done();
}
