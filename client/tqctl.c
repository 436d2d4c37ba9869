/* tqctl — the operator's command line for tqkvd's control API.
 *
 * Exit status: 0 success, 1 error (the daemon refused or is unreachable),
 * 2 bad usage.  Read commands print aligned tables (human sizes) or, with
 * --json, one JSON object built from the reply message's fields (proto
 * field names; 64-bit numbers as JSON numbers).
 */
#include <errno.h>
#include <getopt.h>
#include <grpc/status.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "tqkv.pb-c.h"
#include "version.h"

#define EXIT_ERR   1
#define EXIT_USAGE 2
#define DEFAULT_TIMEOUT_MS 5000
#define DEV_SOCKET "build/run/control.sock"      /* `make run` from the repo root */
#define SYS_SOCKET "/run/tqkvd/control.sock"     /* systemd/tqkvd.service */

struct ctx {
	const char *socket;
	bool json;
	int timeout_ms;
	struct ctl *ctl;
};

struct cmd {
	const char *name;
	const char *args;       /* usage after the name */
	const char *summary;
	const char *help;       /* details for `tqctl CMD --help` */
	bool reads;             /* takes --json */
	int (*fn)(struct ctx *x, int argc, char **argv);
};

static const struct cmd *cur_cmd;

/* ---- output helpers ------------------------------------------------------------ */
static void json_string(const char *s)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

static void json_message(const ProtobufCMessage *m);

static size_t elem_size(const ProtobufCFieldDescriptor *fd)
{
	switch (fd->type) {
	case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
	case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_ENUM:
		return 4;
	case PROTOBUF_C_TYPE_BOOL:
		return sizeof(protobuf_c_boolean);
	case PROTOBUF_C_TYPE_FLOAT:
		return sizeof(float);
	case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_MESSAGE:
		return sizeof(void *);
	case PROTOBUF_C_TYPE_BYTES:
		return sizeof(ProtobufCBinaryData);
	default:
		return 8;
	}
}

static void json_value(const ProtobufCFieldDescriptor *fd, const void *p)
{
	switch (fd->type) {
	case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
		printf("%" PRId32, *(const int32_t *)p);
		break;
	case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
		printf("%" PRIu32, *(const uint32_t *)p);
		break;
	case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
		printf("%" PRId64, *(const int64_t *)p);
		break;
	case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
		printf("%" PRIu64, *(const uint64_t *)p);
		break;
	case PROTOBUF_C_TYPE_BOOL:
		printf("%s", *(const protobuf_c_boolean *)p ? "true" : "false");
		break;
	case PROTOBUF_C_TYPE_FLOAT:
		printf("%.9g", (double)*(const float *)p);
		break;
	case PROTOBUF_C_TYPE_DOUBLE:
		printf("%.17g", *(const double *)p);
		break;
	case PROTOBUF_C_TYPE_ENUM: {
		const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(fd->descriptor, *(const int *)p);
		if (v)
			json_string(v->name);
		else
			printf("%d", *(const int *)p);
		break;
	}
	case PROTOBUF_C_TYPE_STRING:
		json_string(*(char *const *)p ? *(char *const *)p : "");
		break;
	case PROTOBUF_C_TYPE_MESSAGE:
		if (*(ProtobufCMessage *const *)p)
			json_message(*(ProtobufCMessage *const *)p);
		else
			printf("null");
		break;
	case PROTOBUF_C_TYPE_BYTES:
		printf("null"); /* no bytes fields in tqkv.proto */
		break;
	}
}

static void json_message(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;

	putchar('{');
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *fd = &d->fields[i];
		const char *base = (const char *)m + fd->offset;
		if (i)
			putchar(',');
		json_string(fd->name);
		putchar(':');
		if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)((const char *)m + fd->quantifier_offset);
			const char *arr = *(char *const *)base;
			putchar('[');
			for (size_t k = 0; k < n; k++) {
				if (k)
					putchar(',');
				json_value(fd, arr + k * elem_size(fd));
			}
			putchar(']');
		} else {
			json_value(fd, base);
		}
	}
	putchar('}');
}

static void print_json(const ProtobufCMessage *m)
{
	json_message(m);
	putchar('\n');
}

/* A table: a header row and cells; numbers-like columns right-aligned. */
#define MAX_COLS 16
struct table {
	int ncol;
	const char *hdr[MAX_COLS];
	unsigned right;         /* bit c: right-align column c */
	char **cell;            /* [nrow][ncol] */
	size_t nrow, cap;
};

static int table_rowv(struct table *t, const char *const *v)
{
	if (t->nrow == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 16;
		char **c = realloc(t->cell, cap * (size_t)t->ncol * sizeof(*c));
		if (!c)
			return -ENOMEM;
		t->cell = c;
		t->cap = cap;
	}
	for (int i = 0; i < t->ncol; i++)
		t->cell[t->nrow * (size_t)t->ncol + (size_t)i] = strdup(v[i] ? v[i] : "");
	t->nrow++;
	return 0;
}

static int table_row(struct table *t, ...)
{
	const char *v[MAX_COLS];
	va_list ap;

	va_start(ap, t);
	for (int i = 0; i < t->ncol; i++)
		v[i] = va_arg(ap, const char *);
	va_end(ap);
	return table_rowv(t, v);
}

static void table_free(struct table *t)
{
	for (size_t i = 0; i < t->nrow * (size_t)t->ncol; i++)
		free(t->cell[i]);
	free(t->cell);
	t->cell = NULL;
	t->nrow = t->cap = 0;
}

static void table_print(struct table *t)
{
	size_t w[MAX_COLS];

	for (int c = 0; c < t->ncol; c++) {
		w[c] = strlen(t->hdr[c]);
		for (size_t r = 0; r < t->nrow; r++) {
			const char *s = t->cell[r * (size_t)t->ncol + (size_t)c];
			if (s && strlen(s) > w[c])
				w[c] = strlen(s);
		}
	}
	for (size_t r = 0; r <= t->nrow; r++) {
		for (int c = 0; c < t->ncol; c++) {
			const char *s = r == 0 ? t->hdr[c] : t->cell[(r - 1) * (size_t)t->ncol + (size_t)c];
			s = s ? s : "?";
			bool last = c == t->ncol - 1;
			if (t->right & (1u << c))
				printf("%*s%s", (int)w[c], s, last ? "" : "  ");
			else if (last)
				printf("%s", s);
			else
				printf("%-*s  ", (int)w[c], s);
		}
		putchar('\n');
	}
	table_free(t);
}

static const char *sz(uint64_t v, char *buf, size_t n)
{
	ctl_format_size(v, buf, n);
	return buf;
}

static const char *num(uint64_t v, char *buf, size_t n)
{
	snprintf(buf, n, "%" PRIu64, v);
	return buf;
}

/* A duration in microseconds: "0", "850us", "12ms", "3.4s", "12m05s", "2.5h". */
static const char *dur(uint64_t us, char *buf, size_t n)
{
	if (us == 0)
		snprintf(buf, n, "0");
	else if (us < 1000)
		snprintf(buf, n, "%" PRIu64 "us", us);
	else if (us < 9950)
		snprintf(buf, n, "%.1fms", (double)us / 1e3);
	else if (us < 1000000)
		snprintf(buf, n, "%" PRIu64 "ms", us / 1000);
	else if (us < 59950000)
		snprintf(buf, n, "%.1fs", (double)us / 1e6);
	else if (us < UINT64_C(3600000000))
		snprintf(buf, n, "%" PRIu64 "m%02" PRIu64 "s", us / 60000000, us / 1000000 % 60);
	else
		snprintf(buf, n, "%.1fh", (double)us / 3.6e9);
	return buf;
}

/* bytes per second in decimal units, as BENCHMARKS.md: "12.3 MB/s", "1.92 GB/s";
 * "-" when no time passed. */
static const char *rate(double bytes, double seconds, char *buf, size_t n)
{
	double r = seconds > 0 ? bytes / seconds : 0;

	if (seconds <= 0)
		snprintf(buf, n, "-");
	else if (r >= 1e9)
		snprintf(buf, n, "%.2f GB/s", r / 1e9);
	else
		snprintf(buf, n, "%.1f MB/s", r / 1e6);
	return buf;
}

static const char *ago(uint64_t ms_epoch, char *buf, size_t n)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	uint64_t s = now > ms_epoch ? (now - ms_epoch) / 1000 : 0;

	if (s < 120)
		snprintf(buf, n, "%" PRIu64 "s", s);
	else if (s < 7200)
		snprintf(buf, n, "%" PRIu64 "m", s / 60);
	else if (s < 172800)
		snprintf(buf, n, "%" PRIu64 "h", s / 3600);
	else
		snprintf(buf, n, "%" PRIu64 "d", s / 86400);
	return buf;
}

static const char *when(uint64_t ms_epoch, char *buf, size_t n)
{
	time_t t = (time_t)(ms_epoch / 1000);
	struct tm tm;

	localtime_r(&t, &tm);
	strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm);
	return buf;
}

static const char *state_name(Tqkv__V1__SessionState s)
{
	switch (s) {
	case TQKV__V1__SESSION_STATE__SESSION_STATE_OPEN: return "open";
	case TQKV__V1__SESSION_STATE__SESSION_STATE_EVICTED: return "evicted";
	case TQKV__V1__SESSION_STATE__SESSION_STATE_CLOSING: return "closing";
	default: return "?";
	}
}

/* ---- calls ------------------------------------------------------------------------ */
static int call(struct ctx *x, const char *method, const ProtobufCMessage *req, ProtobufCMessage **rep)
{
	struct ctl_status st = { 0 };
	int r = ctl_call(x->ctl, method, req, rep, x->timeout_ms, &st);

	if (r == GRPC_STATUS_UNAVAILABLE || r == GRPC_STATUS_DEADLINE_EXCEEDED) {
		fprintf(stderr, "tqctl: cannot reach tqkvd at %s: %s (%s)\n", x->socket, st.msg,
			ctl_status_name(r));
		fprintf(stderr, "tqctl: is tqkvd running?  Give the socket with --socket PATH or TQKVD_SOCKET.\n");
		return EXIT_ERR;
	}
	if (r != 0) {
		fprintf(stderr, "tqctl: %s: %s%s%s\n", cur_cmd->name, r > 0 ? ctl_status_name(r) : "error",
			st.msg[0] ? ": " : "", st.msg);
		return EXIT_ERR;
	}
	return 0;
}

__attribute__((format(printf, 1, 2)))
static void usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "tqctl: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'tqctl %s --help'.\n", cur_cmd ? cur_cmd->name : "");
}

static int parse_id(const char *s, uint64_t *id)
{
	char *end;

	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (!s[0] || *end || errno || v == 0 || s[0] == '-') {
		usage_error("'%s' is not a session id (a positive integer)", s);
		return -EINVAL;
	}
	*id = v;
	return 0;
}

static void print_session_row(struct table *t, const Tqkv__V1__Session *s)
{
	char id[24], uid[16], geo[64], codecs[32], tok[24], res[24], sp[24], idle[24];

	snprintf(geo, sizeof(geo), "%ux%u/%ux%u", s->n_layers, s->n_kv_heads, s->n_q_heads, s->head_dim);
	snprintf(codecs, sizeof(codecs), "%s/%s", s->k_codec, s->v_codec);
	snprintf(uid, sizeof(uid), "%u", s->owner_uid);
	table_row(t, num(s->id, id, sizeof(id)), s->name[0] ? s->name : "-", s->tenant, uid,
		  s->persistent ? (s->state == TQKV__V1__SESSION_STATE__SESSION_STATE_OPEN ? "open,P" : state_name(s->state))
				: state_name(s->state), geo, codecs, num(s->tokens, tok, sizeof(tok)),
		  sz(s->resident_bytes, res, sizeof(res)), sz(s->spilled_bytes, sp, sizeof(sp)),
		  ago(s->last_access_ms, idle, sizeof(idle)));
}

static void print_session_detail(const Tqkv__V1__Session *s)
{
	char a[64], b[64];

	printf("id:              %" PRIu64 "\n", s->id);
	printf("name:            %s\n", s->name[0] ? s->name : "-");
	printf("tenant:          %s\n", s->tenant);
	printf("owner uid:       %u\n", s->owner_uid);
	printf("state:           %s%s\n", state_name(s->state), s->persistent ? " (persistent)" : "");
	if (s->state == TQKV__V1__SESSION_STATE__SESSION_STATE_EVICTED && s->evict_reason[0])
		printf("evict reason:    %s\n", s->evict_reason);
	printf("layers:          %u\n", s->n_layers);
	printf("kv heads:        %u\n", s->n_kv_heads);
	printf("query heads:     %u\n", s->n_q_heads);
	printf("head dim:        %u\n", s->head_dim);
	printf("codecs (K/V):    %s / %s\n", s->k_codec, s->v_codec);
	printf("rotation seed:   0x%016" PRIx64 "\n", s->rotation_seed);
	printf("bytes per token: %s\n", sz(s->bytes_per_token, a, sizeof(a)));
	printf("tokens:          %" PRIu64 " of %" PRIu64 "\n", s->tokens, s->max_tokens);
	printf("resident:        %s\n", sz(s->resident_bytes, a, sizeof(a)));
	printf("spilled:         %s\n", sz(s->spilled_bytes, a, sizeof(a)));
	printf("created:         %s\n", when(s->created_ms, a, sizeof(a)));
	printf("last access:     %s (%s ago)\n", when(s->last_access_ms, a, sizeof(a)),
	       ago(s->last_access_ms, b, sizeof(b)));
}

/* ---- commands ---------------------------------------------------------------------- */
static int cmd_health(struct ctx *x, int argc, char **argv)
{
	Tqkv__V1__HealthRequest q = TQKV__V1__HEALTH_REQUEST__INIT;
	ProtobufCMessage *rep;
	int r;

	if ((r = call(x, "Health", &q.base, &rep)) != 0)
		return r;
	Tqkv__V1__HealthReply *h = (void *)rep;
	if (x->json)
		print_json(rep);
	else
		printf("%s: tqkvd %s, pid %u, up %" PRIu64 "s\n", h->status, h->version, h->pid,
		       h->uptime_ms / 1000);
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

static int cmd_stats(struct ctx *x, int argc, char **argv)
{
	Tqkv__V1__GetStatsRequest q = TQKV__V1__GET_STATS_REQUEST__INIT;
	ProtobufCMessage *rep;
	char a[32], b[32];
	int r;

	if ((r = call(x, "GetStats", &q.base, &rep)) != 0)
		return r;
	Tqkv__V1__Stats *s = (void *)rep;
	if (x->json) {
		print_json(rep);
	} else {
		printf("version:           %s (pid %u, up %" PRIu64 "s)\n", s->version, s->pid, s->uptime_ms / 1000);
		printf("pool:              %s used of %s\n", sz(s->used_bytes, a, sizeof(a)),
		       sz(s->pool_bytes, b, sizeof(b)));
		printf("tenants:           %u\n", s->tenants);
		printf("sessions:          %u open, %u evicted\n", s->sessions_open, s->sessions_evicted);
		printf("sessions (total):  %" PRIu64 " opened, %" PRIu64 " closed, %" PRIu64 " evictions\n",
		       s->sessions_opened_total, s->sessions_closed_total, s->evictions_total);
		printf("control calls:     %" PRIu64 " (%" PRIu64 " failed)\n", s->rpc_calls_total, s->rpc_errors_total);
		printf("reloads:           %" PRIu64 "\n", s->reloads_total);
		if (s->pages_total) {
			printf("pages:             %u free of %u, %s each (%s, NUMA node %d%s)\n", s->pages_free,
			       s->pages_total, sz(s->page_bytes, a, sizeof(a)), s->pool_backend, s->numa_node,
			       s->hugepages ? ", huge pages" : "");
			printf("data clients:      %u connected, %" PRIu64 " ops (%" PRIu64 " failed), %s mapped\n",
			       s->data_clients, s->data_ops_total, s->data_op_errors_total,
			       sz(s->data_arena_bytes, b, sizeof(b)));
		}
		if (s->spill_capacity_bytes) {
			char c[32], d[32];
			printf("spill:             %s used of %s (%s; %s)\n", sz(s->spill_used_bytes, a, sizeof(a)),
			       sz(s->spill_capacity_bytes, b, sizeof(b)), s->spill_path, s->spill_engine);
			printf("spill I/O:         %s written in %" PRIu64 " writes, %s read in %" PRIu64
			       " reads, %" PRIu64 " I/O errors, %" PRIu64 " checksum failures\n",
			       sz(s->spill_bytes_written, c, sizeof(c)), s->spill_writes,
			       sz(s->spill_bytes_read, d, sizeof(d)), s->spill_reads, s->spill_io_errors,
			       s->spill_checksum_failures);
			printf("restore latency:   p50 %" PRIu64 " us, p99 %" PRIu64 " us (per page, last 1024)\n",
			       s->spill_restore_p50_us, s->spill_restore_p99_us);
			printf("persistent:        %u sessions; %" PRIu64 " checkpoints (%" PRIu64 " failed), %" PRIu64
			       " journal records (%s); at start %" PRIu64 " restored, %" PRIu64 " dropped\n",
			       s->persistent_sessions, s->checkpoints_total, s->checkpoint_failures_total,
			       s->journal_records_total, sz(s->journal_bytes_total, c, sizeof(c)), s->persistent_restored,
			       s->persistent_dropped);
		}
		if (s->high_watermark_pct) /* 0: a daemon without the reclaimer */
			printf("reclaim:           watermarks %u%%/%u%%; %s spilled in %" PRIu64 " passes, rate %s, %"
			       PRIu64 " failures; %" PRIu64 " admission waits, %" PRIu64 " pressure evictions\n",
			       s->high_watermark_pct, s->low_watermark_pct, sz(s->reclaim_bytes, a, sizeof(a)),
			       s->reclaim_passes, rate((double)s->reclaim_bytes, (double)s->reclaim_busy_us / 1e6, b, sizeof(b)),
			       s->reclaim_failures, s->admission_waits, s->pressure_evictions);
	}
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

static int cmd_sessions(struct ctx *x, int argc, char **argv)
{
	Tqkv__V1__ListSessionsRequest q = TQKV__V1__LIST_SESSIONS_REQUEST__INIT;
	ProtobufCMessage *rep;
	int r;

	/* argv: [--tenant T] was parsed into argv[0] by the caller */
	if (argc > 0)
		q.tenant = argv[0];
	if ((r = call(x, "ListSessions", &q.base, &rep)) != 0)
		return r;
	Tqkv__V1__ListSessionsReply *l = (void *)rep;
	if (x->json) {
		print_json(rep);
	} else if (l->n_sessions == 0) {
		printf("no sessions\n");
	} else {
		struct table t = { .ncol = 11, .hdr = { "ID", "NAME", "TENANT", "UID", "STATE",
			"GEOMETRY", "K/V", "TOKENS", "RESIDENT", "SPILLED", "IDLE" },
			.right = (1u << 0) | (1u << 3) | (1u << 7) | (1u << 8) | (1u << 9) | (1u << 10) };
		for (size_t i = 0; i < l->n_sessions; i++)
			print_session_row(&t, l->sessions[i]);
		table_print(&t);
	}
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

static int session_ref_cmd(struct ctx *x, int argc, char **argv, const char *method)
{
	Tqkv__V1__SessionRef q = TQKV__V1__SESSION_REF__INIT;
	ProtobufCMessage *rep;
	int r;

	if (argc != 1) {
		usage_error("%s", argc ? "too many arguments" : "a session ID is required");
		return EXIT_USAGE;
	}
	if (parse_id(argv[0], &q.id) < 0)
		return EXIT_USAGE;
	if ((r = call(x, method, &q.base, &rep)) != 0)
		return r;
	if (x->json) {
		print_json(rep);
	} else if (strcmp(method, "GetSession") == 0) {
		print_session_detail((void *)rep);
	} else if (strcmp(method, "EvictSession") == 0) {
		Tqkv__V1__Session *s = (void *)rep;
		printf("session %" PRIu64 " evicted (tenant %s, owner uid %u)\n", s->id, s->tenant, s->owner_uid);
	} else {
		char a[32];
		printf("session %" PRIu64 " closed, %s released\n", q.id,
		       sz(((Tqkv__V1__CloseSessionReply *)rep)->released_bytes, a, sizeof(a)));
	}
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

static int cmd_session(struct ctx *x, int argc, char **argv)
{
	return session_ref_cmd(x, argc, argv, "GetSession");
}

static int cmd_evict(struct ctx *x, int argc, char **argv)
{
	return session_ref_cmd(x, argc, argv, "EvictSession");
}

static int cmd_close(struct ctx *x, int argc, char **argv)
{
	return session_ref_cmd(x, argc, argv, "CloseSession");
}

/* spill ID [SIZE] / restore ID / checkpoint ID: all answer with the session. */
static int spill_cmd(struct ctx *x, int argc, char **argv, bool spill, const char *method)
{
	Tqkv__V1__SpillSessionRequest sq = TQKV__V1__SPILL_SESSION_REQUEST__INIT;
	Tqkv__V1__SessionRef rq = TQKV__V1__SESSION_REF__INIT;
	ProtobufCMessage *rep;
	char a[32], b[32];
	int r;

	if (argc < 1 || argc > (spill ? 2 : 1)) {
		usage_error("%s", argc ? "too many arguments" : "a session ID is required");
		return EXIT_USAGE;
	}
	if (parse_id(argv[0], spill ? &sq.id : &rq.id) < 0)
		return EXIT_USAGE;
	if (argc == 2 && ctl_parse_size(argv[1], &sq.bytes) < 0) {
		usage_error("'%s' is not a size (examples: 64M, 1GiB)", argv[1]);
		return EXIT_USAGE;
	}
	if ((r = call(x, method, spill ? &sq.base : &rq.base, &rep)) != 0)
		return r;
	if (x->json) {
		print_json(rep);
	} else {
		Tqkv__V1__Session *s = (void *)rep;
		printf("session %" PRIu64 " %s: %" PRIu64 " tokens, %s resident, %s spilled\n", s->id,
		       spill ? "spilled" : strcmp(method, "RestoreSession") ? "checkpointed" : "restored", s->tokens,
		       sz(s->resident_bytes, a, sizeof(a)), sz(s->spilled_bytes, b, sizeof(b)));
	}
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

static int cmd_spill(struct ctx *x, int argc, char **argv)
{
	return spill_cmd(x, argc, argv, true, "SpillSession");
}

static int cmd_restore(struct ctx *x, int argc, char **argv)
{
	return spill_cmd(x, argc, argv, false, "RestoreSession");
}

static int cmd_checkpoint(struct ctx *x, int argc, char **argv)
{
	return spill_cmd(x, argc, argv, false, "CheckpointSession");
}

/* The tenants table's columns (`tqctl tenants`, `budget set`). */
enum tcol {
	TC_NAME, TC_PRIO, TC_GUAR, TC_LIMIT, TC_USED, TC_PCT, TC_SPILLED, TC_SESSIONS,
	/* what memory pressure did to the tenant since the daemon started */
	TC_SPILLS, TC_RESTORES, TC_WAITS, TC_WAITED, TC_MAXWAIT, TC_REFUSED, TC_EVICTED,
	TC_ALLOWED, TC_N
};
_Static_assert(TC_N <= MAX_COLS, "the tenants table is wider than MAX_COLS");

static const char *const tcol_hdr[TC_N] = {
	"TENANT", "PRIO", "GUARANTEED", "LIMIT", "USED", "USE%", "SPILLED", "SESSIONS",
	"SPILLS", "RESTORES", "WAITS", "WAITED", "MAXWAIT", "REFUSED", "EVICTED", "ALLOWED",
};

static const enum tcol tc_all[] = {
	TC_NAME, TC_PRIO, TC_GUAR, TC_LIMIT, TC_USED, TC_PCT, TC_SPILLED, TC_SESSIONS,
	TC_SPILLS, TC_RESTORES, TC_WAITS, TC_WAITED, TC_MAXWAIT, TC_REFUSED, TC_EVICTED, TC_ALLOWED,
};
#define N_TC_ALL ((int)(sizeof(tc_all) / sizeof(tc_all[0])))

static void tenant_table(struct table *t, const enum tcol *cols, int n)
{
	*t = (struct table){ .ncol = n };
	for (int i = 0; i < n; i++) {
		t->hdr[i] = tcol_hdr[cols[i]];
		if (cols[i] != TC_NAME && cols[i] != TC_ALLOWED)
			t->right |= 1u << i;
	}
}

/* One row of a table made by tenant_table(t, cols, ...). */
static void tenant_row(struct table *t, const enum tcol *cols, const Tqkv__V1__Tenant *m)
{
	char c[TC_N][32], allow[256];
	const char *v[MAX_COLS];
	size_t n = 0;

	snprintf(c[TC_PRIO], sizeof(c[0]), "%d", m->priority);
	sz(m->guaranteed_bytes, c[TC_GUAR], sizeof(c[0]));
	sz(m->limit_bytes, c[TC_LIMIT], sizeof(c[0]));
	sz(m->used_bytes, c[TC_USED], sizeof(c[0]));
	snprintf(c[TC_PCT], sizeof(c[0]), "%.0f%%",
		 m->limit_bytes ? 100.0 * (double)m->used_bytes / (double)m->limit_bytes : 0.0);
	sz(m->spilled_bytes, c[TC_SPILLED], sizeof(c[0]));
	snprintf(c[TC_SESSIONS], sizeof(c[0]), "%u", m->sessions);
	sz(m->spilled_total_bytes, c[TC_SPILLS], sizeof(c[0]));
	sz(m->restored_total_bytes, c[TC_RESTORES], sizeof(c[0]));
	num(m->waits, c[TC_WAITS], sizeof(c[0]));
	dur(m->wait_us, c[TC_WAITED], sizeof(c[0]));
	dur(m->wait_max_us, c[TC_MAXWAIT], sizeof(c[0]));
	num(m->refusals, c[TC_REFUSED], sizeof(c[0]));
	num(m->evictions, c[TC_EVICTED], sizeof(c[0]));
	allow[0] = '\0';
	if (m->any_uid)
		n += (size_t)snprintf(allow + n, sizeof(allow) - n, "*");
	for (size_t i = 0; i < m->n_allow_uids && n < sizeof(allow); i++)
		n += (size_t)snprintf(allow + n, sizeof(allow) - n, "%suid %u", n ? "," : "", m->allow_uids[i]);
	for (size_t i = 0; i < m->n_allow_gids && n < sizeof(allow); i++)
		n += (size_t)snprintf(allow + n, sizeof(allow) - n, "%sgid %u", n ? "," : "", m->allow_gids[i]);
	for (int i = 0; i < t->ncol; i++)
		v[i] = cols[i] == TC_NAME ? m->name : cols[i] == TC_ALLOWED ? allow : c[cols[i]];
	table_rowv(t, v);
}

static int cmd_tenants(struct ctx *x, int argc, char **argv)
{
	Tqkv__V1__ListTenantsRequest q = TQKV__V1__LIST_TENANTS_REQUEST__INIT;
	ProtobufCMessage *rep;
	int r;

	if (argc) {
		usage_error("%s", "too many arguments");
		return EXIT_USAGE;
	}
	if ((r = call(x, "ListTenants", &q.base, &rep)) != 0)
		return r;
	Tqkv__V1__ListTenantsReply *l = (void *)rep;
	if (x->json) {
		print_json(rep);
	} else {
		struct table t;
		tenant_table(&t, tc_all, N_TC_ALL);
		for (size_t i = 0; i < l->n_tenants; i++)
			tenant_row(&t, tc_all, l->tenants[i]);
		table_print(&t);
	}
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

static int cmd_budget(struct ctx *x, int argc, char **argv)
{
	Tqkv__V1__SetTenantBudgetRequest q = TQKV__V1__SET_TENANT_BUDGET_REQUEST__INIT;
	ProtobufCMessage *rep;
	int r;

	/* argv: set TENANT, then --limit/--guaranteed values prepared by main */
	if (argc < 2 || strcmp(argv[0], "set") != 0) {
		usage_error("%s", "usage: budget set TENANT [--limit SIZE] [--guaranteed SIZE]");
		return EXIT_USAGE;
	}
	if (argc != 4) {
		usage_error("%s", "give --limit SIZE and/or --guaranteed SIZE");
		return EXIT_USAGE;
	}
	q.tenant = argv[1];
	if (argv[2][0]) {
		q.set_limit = true;
		if (ctl_parse_size(argv[2], &q.limit_bytes) < 0) {
			usage_error("--limit: '%s' is not a size (examples: 512M, 2GiB)", argv[2]);
			return EXIT_USAGE;
		}
	}
	if (argv[3][0]) {
		q.set_guaranteed = true;
		if (ctl_parse_size(argv[3], &q.guaranteed_bytes) < 0) {
			usage_error("--guaranteed: '%s' is not a size (examples: 512M, 2GiB)", argv[3]);
			return EXIT_USAGE;
		}
	}
	if (!q.set_limit && !q.set_guaranteed) {
		usage_error("%s", "give --limit SIZE and/or --guaranteed SIZE");
		return EXIT_USAGE;
	}
	if ((r = call(x, "SetTenantBudget", &q.base, &rep)) != 0)
		return r;
	if (x->json) {
		print_json(rep);
	} else {
		struct table t;
		tenant_table(&t, tc_all, N_TC_ALL);
		tenant_row(&t, tc_all, (void *)rep);
		table_print(&t);
	}
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

static int cmd_config(struct ctx *x, int argc, char **argv)
{
	Tqkv__V1__GetConfigRequest q = TQKV__V1__GET_CONFIG_REQUEST__INIT;
	ProtobufCMessage *rep;
	int r;

	if (argc) {
		usage_error("%s", "too many arguments");
		return EXIT_USAGE;
	}
	if ((r = call(x, "GetConfig", &q.base, &rep)) != 0)
		return r;
	Tqkv__V1__GetConfigReply *c = (void *)rep;
	if (x->json) {
		print_json(rep);
	} else {
		printf("# %s\n", c->config_path[0] ? c->config_path : "embedded defaults (no --config)");
		struct table t = { .ncol = 4, .hdr = { "KEY", "VALUE", "DEFAULT", "RELOAD" } };
		for (size_t i = 0; i < c->n_entries; i++)
			table_row(&t, c->entries[i]->key, c->entries[i]->value[0] ? c->entries[i]->value : "\"\"",
				  c->entries[i]->default_value[0] ? c->entries[i]->default_value : "\"\"",
				  c->entries[i]->reloadable ? "yes" : "no");
		table_print(&t);
	}
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

/* argv (after option parsing): tenant layers kv q dim kcodec vcodec max name seed persistent */
static int cmd_open(struct ctx *x, int argc, char **argv)
{
	Tqkv__V1__OpenSessionRequest q = TQKV__V1__OPEN_SESSION_REQUEST__INIT;
	uint32_t *u32[] = { &q.n_layers, &q.n_kv_heads, &q.n_q_heads, &q.head_dim };
	static const char *const names[] = { "--layers", "--kv-heads", "--q-heads", "--head-dim" };
	ProtobufCMessage *rep;
	int r;

	q.tenant = argv[0];
	for (int i = 0; i < 4; i++) {
		char *end;
		errno = 0;
		unsigned long v = strtoul(argv[1 + i], &end, 10);
		if (!argv[1 + i][0] || *end || errno || v > UINT32_MAX || argv[1 + i][0] == '-') {
			usage_error("%s: a non-negative integer is required", names[i]);
			return EXIT_USAGE;
		}
		*u32[i] = (uint32_t)v;
	}
	q.k_codec = argv[5];
	q.v_codec = argv[6];
	char *end;
	errno = 0;
	q.max_tokens = strtoull(argv[7], &end, 10);
	if (!argv[7][0] || *end || errno || argv[7][0] == '-') {
		usage_error("--max-tokens: '%s' is not a non-negative integer", argv[7]);
		return EXIT_USAGE;
	}
	q.name = argv[8];
	if (argv[9][0]) {
		errno = 0;
		q.rotation_seed = strtoull(argv[9], &end, 0);
		if (*end || errno || argv[9][0] == '-') {
			usage_error("--seed: '%s' is not an integer", argv[9]);
			return EXIT_USAGE;
		}
		q.has_rotation_seed = true;
	}
	q.persistent = argv[10][0] != 0;
	if ((r = call(x, "OpenSession", &q.base, &rep)) != 0)
		return r;
	if (x->json)
		print_json(rep);
	else
		print_session_detail((void *)rep);
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

static const struct cmd cmds[] = {
	{ "health", "", "is the daemon up? (Health)",
	  "Prints SERVING, the version, the pid and the uptime.", true, cmd_health },
	{ "stats", "", "daemon-wide counters (GetStats)",
	  "Pool use, sessions open/evicted, totals, control calls, reloads, the data\n"
	  "path, the spill tier, persistent sessions, and the reclaimer: its watermarks\n"
	  "(percent of the pool: spill above the first down to the second), bytes it\n"
	  "spilled and in how many passes, its rate (those bytes over the time it spent\n"
	  "spilling; '-' before it ran), spills that failed, allocations that waited\n"
	  "for it, and sessions evicted under pressure (pool.pressure_action = evict).", true, cmd_stats },
	{ "sessions", "[--tenant TENANT]", "list sessions (ListSessions)",
	  "One row per session: id, name, tenant, owner uid, state, geometry\n"
	  "(layers x kv heads / query heads x head dim), K/V codecs, tokens, resident and\n"
	  "spilled bytes, time since the last access.", true, cmd_sessions },
	{ "session", "ID", "one session in detail (GetSession)",
	  "Every field of session ID; for an evicted session, who evicted it and why.", true, cmd_session },
	{ "evict", "ID", "release a session's memory now (EvictSession)",
	  "The record stays (state evicted) so its owner gets a clear error on its next\n"
	  "call; `tqctl close ID` removes it.", true, cmd_evict },
	{ "close", "ID", "drop a session (CloseSession)",
	  "Removes session ID and releases its memory.", true, cmd_close },
	{ "spill", "ID [SIZE]", "move a session's pages to the spill tier (SpillSession)",
	  "Writes at least SIZE bytes (whole pages; default: all) of session ID to the\n"
	  "spill file, coldest first, and gives their pool memory back.  The session's\n"
	  "next operation on a layer reads that layer back.  Operators only.", true, cmd_spill },
	{ "restore", "ID", "read a session's spilled pages back (RestoreSession)",
	  "Reads every spilled page of session ID back into the pool.  A page that fails\n"
	  "its checksum is never served: DATA_LOSS.  Operators only.", true, cmd_restore },
	{ "checkpoint", "ID", "write a persistent session to disk now (CheckpointSession)",
	  "Writes the pages of persistent session ID that have no copy on disk and\n"
	  "replaces its manifest, as pool.checkpoint_interval does.  Its owner or an\n"
	  "operator.", true, cmd_checkpoint },
	{ "tenants", "", "tenants, budgets, use and pressure (ListTenants)",
	  "Per tenant: priority, guaranteed bytes, limit, bytes used (in the pool) and\n"
	  "USE% of the limit, bytes spilled now (in the spill tier, not counted in\n"
	  "USED), sessions; what memory pressure did to it since the daemon started:\n"
	  "  SPILLS    bytes written to the spill tier (reclaimer, tqctl spill, ...)\n"
	  "  RESTORES  bytes read back from it\n"
	  "  WAITS     allocations that waited on a full pool for the reclaimer\n"
	  "  WAITED    the time they waited, all together; MAXWAIT the longest wait\n"
	  "  REFUSED   allocations refused on a full pool (POOL_FULL)\n"
	  "  EVICTED   sessions evicted under pressure (pool.pressure_action = evict)\n"
	  "and the users/groups allowed to open sessions.", true, cmd_tenants },
	{ "budget", "set TENANT [--limit SIZE] [--guaranteed SIZE]", "change a tenant's budget (SetTenantBudget)",
	  "SIZE: an integer with an optional binary unit: 4096, 512M, 2GiB, 1T.\n"
	  "Takes effect at once; a lower limit than the current use stops new charges.\n"
	  "SIGHUP (reload) restores the config file's values.", true, cmd_budget },
	{ "config", "", "the daemon's effective configuration (GetConfig)",
	  "Every option with its value, default and whether SIGHUP reloads it.", true, cmd_config },
	{ "open", "--tenant T --layers N --kv-heads N --q-heads N --head-dim D --max-tokens N\n"
	  "                 [--k-codec C] [--v-codec C] [--name NAME] [--seed S] [--persistent]",
	  "admit a session owned by you (OpenSession)",
	  "For operators and tests; inference processes open sessions through libtqkv.\n"
	  "Codecs default to q8 (K) and tq4 (V).  The session is not tied to any\n"
	  "connection: it stays until closed or evicted, or idle past\n"
	  "daemon.session_idle_ttl (default 1h).  --persistent: the session is kept on\n"
	  "disk and survives a restart of the daemon; it is never idle-expired.", true, cmd_open },
};
#define N_CMDS (sizeof(cmds) / sizeof(cmds[0]))

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: tqctl [--socket PATH] [--json] [--timeout MS] COMMAND [ARGS]\n"
		"\n"
		"Talks to tqkvd's control socket.\n"
		"\n"
		"Commands:\n");
	for (size_t i = 0; i < N_CMDS; i++)
		fprintf(f, "  %-9s %s\n", cmds[i].name, cmds[i].summary);
	fprintf(f,
		"\n"
		"Who may do what: any member of the socket's group (daemon.control_group)\n"
		"may run health and stats, open sessions and list, inspect, evict and close\n"
		"its own; operators (root, tqkvd's own user, daemon.operator_group) act on\n"
		"every session and alone may run budget, config, spill and restore.\n"
		"\n"
		"Options (also accepted after COMMAND):\n"
		"  -s, --socket PATH   the control socket; default $TQKVD_SOCKET, else\n"
		"                      " DEV_SOCKET " if it exists (make run), else\n"
		"                      " SYS_SOCKET " (systemd)\n"
		"  -j, --json          machine-readable output (read commands)\n"
		"  -t, --timeout MS    per-call deadline (default %d)\n"
		"  -h, --help          this help; `tqctl COMMAND --help` for one command\n"
		"  -V, --version\n"
		"\n"
		"Exit status: 0 success, 1 error, 2 bad usage.\n", DEFAULT_TIMEOUT_MS);
}

static void cmd_usage(const struct cmd *c, FILE *f)
{
	fprintf(f, "Usage: tqctl %s %s\n\n%s.\n\n%s\n\nOptions: --socket PATH, --json, --timeout MS (see tqctl --help).\n",
		c->name, c->args, c->summary, c->help);
}

static const char *default_socket(void)
{
	const char *env = getenv("TQKVD_SOCKET");
	struct stat st;

	if (env && *env)
		return env;
	if (stat(DEV_SOCKET, &st) == 0)
		return DEV_SOCKET;
	return SYS_SOCKET;
}

int main(int argc, char **argv)
{
	enum { O_TENANT = 256, O_LIMIT, O_GUAR, O_LAYERS, O_KVH, O_QH, O_DIM, O_KC, O_VC, O_MAXT, O_NAME, O_SEED,
	       O_PERSIST };
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "timeout", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "tenant", required_argument, NULL, O_TENANT },
		{ "limit", required_argument, NULL, O_LIMIT },
		{ "guaranteed", required_argument, NULL, O_GUAR },
		{ "layers", required_argument, NULL, O_LAYERS },
		{ "kv-heads", required_argument, NULL, O_KVH },
		{ "q-heads", required_argument, NULL, O_QH },
		{ "head-dim", required_argument, NULL, O_DIM },
		{ "k-codec", required_argument, NULL, O_KC },
		{ "v-codec", required_argument, NULL, O_VC },
		{ "max-tokens", required_argument, NULL, O_MAXT },
		{ "name", required_argument, NULL, O_NAME },
		{ "seed", required_argument, NULL, O_SEED },
		{ "persistent", no_argument, NULL, O_PERSIST },
		{ NULL, 0, NULL, 0 },
	};
	struct ctx x = { .timeout_ms = DEFAULT_TIMEOUT_MS };
	/* values of the command-specific options, "" = not given */
	const char *val[O_PERSIST - O_TENANT + 1];
	bool help = false;
	char target[4200];
	char *pos[16];
	int npos = 0, opt, rc;

	for (size_t i = 0; i < sizeof(val) / sizeof(val[0]); i++)
		val[i] = NULL;
	/* "+": stop at the command; its own options are parsed in a second pass */
	while ((opt = getopt_long(argc, argv, "+s:jt:hV", longopts, NULL)) != -1) {
		switch (opt) {
		case 's': x.socket = optarg; break;
		case 'j': x.json = true; break;
		case 't': x.timeout_ms = atoi(optarg); break;
		case 'h': usage(stdout); return 0;
		case 'V': printf("tqctl %s (git %s)\n", TQ_VERSION, TQ_GIT_REV); return 0;
		default:
			if (opt >= O_TENANT) {
				fprintf(stderr, "tqctl: %s belongs after a command\n", argv[optind - 1]);
				return EXIT_USAGE;
			}
			fprintf(stderr, "Try 'tqctl --help'.\n");
			return EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	const char *name = argv[optind];
	for (size_t i = 0; i < N_CMDS; i++)
		if (strcmp(cmds[i].name, name) == 0)
			cur_cmd = &cmds[i];
	if (!cur_cmd) {
		fprintf(stderr, "tqctl: unknown command '%s'\nTry 'tqctl --help'.\n", name);
		return EXIT_USAGE;
	}
	/* the command's arguments, in any order with its options */
	int sub_argc = argc - optind;
	char **sub_argv = argv + optind;
	optind = 0; /* 0, not 1: glibc then resets its scanning state too */
	while ((opt = getopt_long(sub_argc, sub_argv, "s:jt:h", longopts, NULL)) != -1) {
		switch (opt) {
		case 's': x.socket = optarg; break;
		case 'j': x.json = true; break;
		case 't': x.timeout_ms = atoi(optarg); break;
		case 'h': help = true; break;
		case '?':
			fprintf(stderr, "Try 'tqctl %s --help'.\n", cur_cmd->name);
			return EXIT_USAGE;
		default:
			val[opt - O_TENANT] = opt == O_PERSIST ? "yes" : optarg;
			break;
		}
	}
	if (help) {
		cmd_usage(cur_cmd, stdout);
		return 0;
	}
	for (int i = optind; i < sub_argc; i++) {
		if (npos >= 8) {
			usage_error("%s", "too many arguments");
			return EXIT_USAGE;
		}
		pos[npos++] = sub_argv[i];
	}
	if (x.timeout_ms <= 0) {
		usage_error("%s", "--timeout: a positive number of milliseconds is required");
		return EXIT_USAGE;
	}
	/* options that only some commands take */
	bool is_sessions = cur_cmd->fn == cmd_sessions, is_budget = cur_cmd->fn == cmd_budget,
	     is_open = cur_cmd->fn == cmd_open;
	for (int i = 0; i <= O_PERSIST - O_TENANT; i++) {
		int o = O_TENANT + i;
		bool ok = (o == O_TENANT && (is_sessions || is_open)) ||
			  ((o == O_LIMIT || o == O_GUAR) && is_budget) || (o >= O_LAYERS && is_open);
		if (val[i] && !ok) {
			usage_error("this command takes no --%s", longopts[5 + i].name);
			return EXIT_USAGE;
		}
	}
	if (is_sessions) {
		if (npos) {
			usage_error("%s", "too many arguments");
			return EXIT_USAGE;
		}
		if (val[O_TENANT - O_TENANT])
			pos[npos++] = (char *)val[O_TENANT - O_TENANT];
	} else if (is_budget) {
		if (npos != 2) {
			usage_error("%s", "usage: budget set TENANT [--limit SIZE] [--guaranteed SIZE]");
			return EXIT_USAGE;
		}
		pos[npos++] = (char *)(val[O_LIMIT - O_TENANT] ? val[O_LIMIT - O_TENANT] : "");
		pos[npos++] = (char *)(val[O_GUAR - O_TENANT] ? val[O_GUAR - O_TENANT] : "");
	} else if (is_open) {
		if (npos) {
			usage_error("%s", "open takes options only");
			return EXIT_USAGE;
		}
		static const int need[] = { O_TENANT, O_LAYERS, O_KVH, O_QH, O_DIM, O_KC, O_VC, O_MAXT, O_NAME, O_SEED,
					    O_PERSIST };
		for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
			const char *v = val[need[i] - O_TENANT];
			bool optional = need[i] == O_KC || need[i] == O_VC || need[i] == O_NAME ||
					need[i] == O_SEED || need[i] == O_TENANT || need[i] == O_PERSIST;
			if (!v && !optional) {
				usage_error("--%s is required", longopts[5 + need[i] - O_TENANT].name);
				return EXIT_USAGE;
			}
			pos[npos++] = (char *)(v ? v : "");
		}
	}
	if (!x.socket)
		x.socket = default_socket();
	if (strncmp(x.socket, "unix:", 5) == 0 || strchr(x.socket, '/') == NULL) {
		/* a gRPC target already ("unix:/p", "127.0.0.1:7070"), or a bare host:port */
		snprintf(target, sizeof(target), "%s", x.socket);
	} else if (x.socket[0] == '/') {
		snprintf(target, sizeof(target), "unix:%s", x.socket);
	} else {
		char cwd[4096];
		if (!getcwd(cwd, sizeof(cwd))) {
			fprintf(stderr, "tqctl: getcwd: %s\n", strerror(errno));
			return EXIT_ERR;
		}
		snprintf(target, sizeof(target), "unix:%s/%s", cwd, x.socket);
	}
	struct ctl_status st;
	if (ctl_open(&x.ctl, target, &st) < 0) {
		fprintf(stderr, "tqctl: %s\n", st.msg);
		return EXIT_ERR;
	}
	rc = cur_cmd->fn(&x, npos, pos);
	ctl_close(x.ctl);
	return rc;
}
