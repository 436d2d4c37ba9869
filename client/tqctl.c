/* tqctl — the operator's command line for tqkvd's control API.
 *
 * Exit status: 0 success, 1 error (the daemon refused or is unreachable;
 * health: it answered NOT_SERVING), 2 bad usage.  Read commands print aligned tables (human sizes) or, with
 * --json, one JSON object built from the reply message's fields (proto
 * field names; 64-bit numbers as JSON numbers).
 */
#include <errno.h>
#include <getopt.h>
#include <grpc/status.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
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
#define MAX_COLS 20
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

/* Column widths into w[ncol]; returns the width of a whole line. */
static size_t table_widths(const struct table *t, size_t *w)
{
	size_t len = 0;

	for (int c = 0; c < t->ncol; c++) {
		w[c] = strlen(t->hdr[c]);
		for (size_t r = 0; r < t->nrow; r++) {
			const char *s = t->cell[r * (size_t)t->ncol + (size_t)c];
			if (s && strlen(s) > w[c])
				w[c] = strlen(s);
		}
		len += w[c] + (c ? 2 : 0);
	}
	return len;
}

/* Prints the header and the rows, then frees the cells.  width > 0 cuts
 * every line at that many columns (tqctl top on a terminal). */
static void table_print_cut(struct table *t, int width)
{
	size_t w[MAX_COLS];
	size_t len = table_widths(t, w);
	char *line = malloc(len + 1);

	if (!line) {
		fprintf(stderr, "tqctl: out of memory\n");
		table_free(t);
		return;
	}
	for (size_t r = 0; r <= t->nrow; r++) {
		size_t n = 0;
		for (int c = 0; c < t->ncol; c++) {
			const char *s = r == 0 ? t->hdr[c] : t->cell[(r - 1) * (size_t)t->ncol + (size_t)c];
			s = s ? s : "?";
			size_t sl = strlen(s), pad = w[c] - sl;
			bool right = t->right & (1u << c), last = c == t->ncol - 1;
			if (c) {
				memcpy(line + n, "  ", 2);
				n += 2;
			}
			if (right || !last) {
				memset(line + n + (right ? 0 : sl), ' ', pad);
				memcpy(line + n + (right ? pad : 0), s, sl);
				n += sl + pad;
			} else {
				memcpy(line + n, s, sl);
				n += sl;
			}
		}
		if (width > 0 && n > (size_t)width)
			n = (size_t)width;
		fwrite(line, 1, n, stdout);
		putchar('\n');
	}
	free(line);
	table_free(t);
}

static void table_print(struct table *t)
{
	table_print_cut(t, 0);
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
	if (r == GRPC_STATUS_CANCELLED) { /* what a call in flight gets when the daemon stops */
		fprintf(stderr, "tqctl: %s: tqkvd at %s cancelled the call: is it stopping?\n", cur_cmd->name, x->socket);
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

/* The STATE column: "open,P" for an open persistent session. */
static const char *session_state(const Tqkv__V1__Session *s)
{
	if (s->persistent && s->state == TQKV__V1__SESSION_STATE__SESSION_STATE_OPEN)
		return "open,P";
	return state_name(s->state);
}

static void print_session_row(struct table *t, const Tqkv__V1__Session *s)
{
	char id[24], uid[16], geo[64], codecs[32], tok[24], res[24], sp[24], idle[24];

	snprintf(geo, sizeof(geo), "%ux%u/%ux%u", s->n_layers, s->n_kv_heads, s->n_q_heads, s->head_dim);
	snprintf(codecs, sizeof(codecs), "%s/%s", s->k_codec, s->v_codec);
	snprintf(uid, sizeof(uid), "%u", s->owner_uid);
	table_row(t, num(s->id, id, sizeof(id)), s->name[0] ? s->name : "-", s->tenant, uid,
		  session_state(s), geo, codecs, num(s->tokens, tok, sizeof(tok)),
		  sz(s->resident_bytes, res, sizeof(res)), sz(s->spilled_bytes, sp, sizeof(sp)),
		  ago(s->last_access_ms, idle, sizeof(idle)));
}

/* "0.83": x of `of`, or "-" when `of` is 0 (nothing measured). */
static const char *ratio(float x, float of, char *buf, size_t n)
{
	if (!(of > 0.0f))
		return "-";
	snprintf(buf, n, "%.3g", (double)(x / of));
	return buf;
}

/* One row per layer: its transform as the layer's first append froze it. */
static void print_layer_transforms(const Tqkv__V1__Session *s)
{
	struct table t = { .ncol = 7, .hdr = { "LAYER", "STATE", "APPLIED", "TOKENS", "|MEAN K|/RMS",
		"K SCALES", "|MEAN V|/RMS" }, .right = (1u << 0) | (1u << 3) | (1u << 4) | (1u << 6) };

	if (strcmp(s->kv_transform, "none") == 0)
		return; /* nothing to calibrate */
	if (s->n_layer_transforms == 0) {
		if (s->state == TQKV__V1__SESSION_STATE__SESSION_STATE_OPEN)
			printf("layer transforms: - (no data yet: a layer's first append calibrates it)\n");
		return;
	}
	printf("layer transforms (frozen by each layer's first append):\n");
	for (size_t i = 0; i < s->n_layer_transforms; i++) {
		const Tqkv__V1__LayerTransform *l = s->layer_transforms[i];
		char layer[16], tok[24], mk[24], mv[24], sc[48];
		snprintf(layer, sizeof(layer), "%u", l->layer);
		if (!l->calibrated) {
			table_row(&t, layer, "uncalibrated", "-", "-", "-", "-", "-");
			continue;
		}
		if (l->scale_min == 1.0f && l->scale_max == 1.0f)
			snprintf(sc, sizeof(sc), "-");
		else
			snprintf(sc, sizeof(sc), "%.3g..%.3g", (double)l->scale_min, (double)l->scale_max);
		table_row(&t, layer, "calibrated", l->applied, num(l->calib_tokens, tok, sizeof(tok)),
			  ratio(l->k_mean_norm, l->k_rms, mk, sizeof(mk)), sc,
			  ratio(l->v_mean_norm, l->v_rms, mv, sizeof(mv)));
	}
	table_print(&t);
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
	printf("kv transform:    %s\n", s->kv_transform[0] ? s->kv_transform : "?");
	printf("rotation seed:   0x%016" PRIx64 "\n", s->rotation_seed);
	printf("bytes per token: %s\n", sz(s->bytes_per_token, a, sizeof(a)));
	if (s->page_tokens)
		printf("tokens a page:   %u\n", s->page_tokens);
	printf("tokens:          %" PRIu64 " of %" PRIu64 "\n", s->tokens, s->max_tokens);
	printf("resident:        %s\n", sz(s->resident_bytes, a, sizeof(a)));
	printf("spilled:         %s\n", sz(s->spilled_bytes, a, sizeof(a)));
	printf("created:         %s\n", when(s->created_ms, a, sizeof(a)));
	printf("last access:     %s (%s ago)\n", when(s->last_access_ms, a, sizeof(a)),
	       ago(s->last_access_ms, b, sizeof(b)));
	print_layer_transforms(s);
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
	/* anything but SERVING is an error for a probe (exit 1) */
	const int serving = strcmp(h->status, "SERVING") == 0;
	if (x->json)
		print_json(rep);
	else if (h->reason && h->reason[0])
		printf("%s: tqkvd %s, pid %u, up %" PRIu64 "s: %s\n", h->status, h->version, h->pid,
		       h->uptime_ms / 1000, h->reason);
	else
		printf("%s: tqkvd %s, pid %u, up %" PRIu64 "s\n", h->status, h->version, h->pid,
		       h->uptime_ms / 1000);
	protobuf_c_message_free_unpacked(rep, NULL);
	return serving ? 0 : EXIT_ERR;
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
			if (s->page_tokens_align)
				printf("tokens a page:     a multiple of %u (the GPU kernels' tile)\n",
				       s->page_tokens_align);
			if (strcmp(s->pool_backend, "host") != 0) {
				printf("pool memory:       %s\n", s->pool_memory);
				printf("GPU kernels:       %" PRIu64 " appends, %" PRIu64 " attentions, %" PRIu64
				       " decode steps in one call (%" PRIu64 " with one wait), %" PRIu64
				       " failed; %.3f s of GPU time\n", s->gpu_appends, s->gpu_attentions,
				       s->gpu_decode_steps, s->gpu_decode_steps_one_wait, s->gpu_kernel_failures,
				       (double)s->gpu_busy_us / 1e6);
			}
			printf("data clients:      %u connected, %" PRIu64 " ops (%" PRIu64 " failed), %s mapped\n",
			       s->data_clients, s->data_ops_total, s->data_op_errors_total,
			       sz(s->data_arena_bytes, b, sizeof(b)));
			if (s->data_ops_run)
				printf("worker ops:        %" PRIu64 ", on average %.1f us queued and %.1f us running\n",
				       s->data_ops_run, (double)s->data_op_queue_us / (double)s->data_ops_run,
				       (double)s->data_op_run_us / (double)s->data_ops_run);
		}
		if (s->spill_capacity_bytes) {
			char c[32], d[32];
			printf("spill:             %s used of %s (%s; %s)\n", sz(s->spill_used_bytes, a, sizeof(a)),
			       sz(s->spill_capacity_bytes, b, sizeof(b)), s->spill_path, s->spill_engine);
			printf("spill I/O:         %s written in %" PRIu64 " writes, %s read in %" PRIu64
			       " reads, %" PRIu64 " I/O errors, %" PRIu64 " checksum failures, %" PRIu64
			       " retried\n", sz(s->spill_bytes_written, c, sizeof(c)), s->spill_writes,
			       sz(s->spill_bytes_read, d, sizeof(d)), s->spill_reads, s->spill_io_errors,
			       s->spill_checksum_failures, s->spill_retries);
			if (s->spill_submit_failures)
				printf("spill submits:     %" PRIu64 " failed (the I/O was submitted again)\n",
				       s->spill_submit_failures);
			if (s->spill_stopped && *s->spill_stopped)
				printf("spill STOPPED:     %s\n", s->spill_stopped);
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

/* The tenants table's columns: `tqctl tenants` and `budget set` show all of
 * them, `tqctl top` a selection. */
enum tcol {
	TC_NAME, TC_PRIO, TC_GUAR, TC_LIMIT, TC_USED, TC_PCT, TC_SPILLED, TC_SESSIONS,
	/* what memory pressure did to the tenant since the daemon started */
	TC_SPILLS, TC_RESTORES, TC_WAITS, TC_WAITED, TC_MAXWAIT, TC_REFUSED, TC_ATLIMIT, TC_EVICTED,
	/* sparse-V: the threshold, and the share of value chunks it skipped */
	TC_SPARSE, TC_VSKIP,
	TC_ALLOWED, TC_N
};
_Static_assert(TC_N <= MAX_COLS, "the tenants table is wider than MAX_COLS");

static const char *const tcol_hdr[TC_N] = {
	"TENANT", "PRIO", "GUARANTEED", "LIMIT", "USED", "USE%", "SPILLED", "SESSIONS",
	"SPILLS", "RESTORES", "WAITS", "WAITED", "MAXWAIT", "REFUSED", "AT-LIMIT", "EVICTED", "SPARSE-V", "V-SKIP",
	"ALLOWED",
};

static const enum tcol tc_all[] = {
	TC_NAME, TC_PRIO, TC_GUAR, TC_LIMIT, TC_USED, TC_PCT, TC_SPILLED, TC_SESSIONS,
	TC_SPILLS, TC_RESTORES, TC_WAITS, TC_WAITED, TC_MAXWAIT, TC_REFUSED, TC_ATLIMIT, TC_EVICTED, TC_SPARSE,
	TC_VSKIP, TC_ALLOWED,
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
	num(m->limit_refusals, c[TC_ATLIMIT], sizeof(c[0]));
	num(m->evictions, c[TC_EVICTED], sizeof(c[0]));
	snprintf(c[TC_SPARSE], sizeof(c[0]), "%g", (double)m->sparse_v);
	if (m->value_chunks)
		snprintf(c[TC_VSKIP], sizeof(c[0]), "%.1f%%",
			 100.0 * (double)m->value_chunks_skipped / (double)m->value_chunks);
	else
		snprintf(c[TC_VSKIP], sizeof(c[0]), "-");
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

/* argv (after option parsing): tenant layers kv q dim kcodec vcodec max name seed persistent
 * kv-transform */
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
	q.kv_transform = argv[11];
	if ((r = call(x, "OpenSession", &q.base, &rep)) != 0)
		return r;
	if (x->json)
		print_json(rep);
	else
		print_session_detail((void *)rep);
	protobuf_c_message_free_unpacked(rep, NULL);
	return 0;
}

/* ---- top ---------------------------------------------------------------------------- */
/* The terminal's settings while top reads keys; put back on every way out
 * (return, exit, SIGINT/SIGTERM/SIGHUP).  Only async-signal-safe calls. */
static struct termios term_saved;
static volatile sig_atomic_t term_changed, cursor_hidden;

static void term_restore(void)
{
	if (cursor_hidden) {
		cursor_hidden = 0;
		if (write(STDOUT_FILENO, "\033[?25h", 6) < 0) {
			/* nothing left to tell it to */
		}
	}
	if (term_changed) {
		term_changed = 0;
		tcsetattr(STDIN_FILENO, TCSAFLUSH, &term_saved);
	}
}

static void top_on_signal(int sig)
{
	term_restore();
	raise(sig); /* SA_RESETHAND: the default action, so the parent sees the signal */
}

static void top_on_winch(int sig)
{
	(void)sig; /* interrupts poll(): the next frame takes the new size */
}

/* stdout is a terminal: hide the cursor and, when stdin is a terminal too,
 * read keys one at a time without echo.  Returns the fd to poll for keys or -1. */
static int term_setup(void)
{
	struct sigaction sa = { .sa_handler = top_on_signal, .sa_flags = SA_RESETHAND };
	struct sigaction wa = { .sa_handler = top_on_winch }; /* no SA_RESTART */
	struct termios t;

	sigemptyset(&sa.sa_mask);
	sigemptyset(&wa.sa_mask);
	atexit(term_restore);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGWINCH, &wa, NULL);
	cursor_hidden = 1;
	fputs("\033[?25l", stdout);
	fflush(stdout); /* before any restore, which write()s */
	if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &term_saved) < 0)
		return -1;
	t = term_saved;
	t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
	t.c_cc[VMIN] = 1;
	t.c_cc[VTIME] = 0;
	term_changed = 1; /* before the change: a signal in between restores the same settings */
	if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &t) < 0) {
		term_changed = 0;
		return -1;
	}
	return STDIN_FILENO;
}

/* One session's tokens at the previous refresh. */
struct top_tok {
	uint64_t id, tokens;
};

struct top {
	int interval_ms;
	long count;             /* refreshes left; < 0: until q */
	bool tty;               /* stdout is a terminal: redraw in place */
	int key_fd;             /* stdin in non-canonical mode, or -1 */
	int width, height;      /* the terminal's; 0: no limit */
	int lines;              /* printed in this frame */
	unsigned long frames;
	/* the previous refresh, for the rates: counters at the daemon's uptime prev_ms */
	bool have_prev;
	uint64_t prev_ms, prev_reclaim, prev_busy_us, prev_read, prev_written, prev_ops;
	uint64_t prev_gpu_us, prev_steps, prev_one;
	struct top_tok *tok;    /* [n_tok], sorted by id */
	size_t n_tok;
};

/* Lines left on the screen; the last row stays empty so nothing scrolls. */
static int top_room(const struct top *tp)
{
	return tp->height ? tp->height - 1 - tp->lines : INT_MAX;
}

__attribute__((format(printf, 2, 3)))
static void top_line(struct top *tp, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	int n;

	if (top_room(tp) <= 0)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (n >= (int)sizeof(buf))
		n = (int)sizeof(buf) - 1;
	if (tp->width > 0 && n > tp->width)
		n = tp->width;
	fwrite(buf, 1, (size_t)n, stdout);
	putchar('\n');
	tp->lines++;
}

static void top_table(struct top *tp, struct table *t)
{
	tp->lines += 1 + (int)t->nrow;
	table_print_cut(t, tp->width);
}

/* "3s", "12m05s", "5h02m", "3d04h" */
static const char *uptime(uint64_t ms, char *buf, size_t n)
{
	uint64_t s = ms / 1000;

	if (s < 60)
		snprintf(buf, n, "%" PRIu64 "s", s);
	else if (s < 3600)
		snprintf(buf, n, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, n, "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s / 60 % 60);
	else
		snprintf(buf, n, "%" PRIu64 "d%02" PRIu64 "h", s / 86400, s / 3600 % 24);
	return buf;
}

/* Seconds since the previous refresh by the daemon's clock; 0 when there is
 * none to compare with (the first, or the daemon restarted in between). */
static double top_elapsed(const struct top *tp, const Tqkv__V1__Stats *s)
{
	if (!tp->have_prev || s->uptime_ms <= tp->prev_ms)
		return 0;
	return (double)(s->uptime_ms - tp->prev_ms) / 1e3;
}

static double delta(uint64_t now, uint64_t before)
{
	return now > before ? (double)(now - before) : 0;
}

static void top_header(struct top *tp, const Tqkv__V1__Stats *s)
{
	double dt = top_elapsed(tp, s);
	char a[32], b[32], c[32], d[32];
	struct tm tm;
	time_t now = time(NULL);

	localtime_r(&now, &tm);
	strftime(c, sizeof(c), "%H:%M:%S", &tm);
	top_line(tp, "tqkvd %s (pid %u), up %s; %s, every %gs%s", s->version, s->pid, uptime(s->uptime_ms, a, sizeof(a)),
		 c, tp->interval_ms / 1e3, tp->key_fd >= 0 ? "; q quits" : "");
	top_line(tp, "pool:     %s used of %s (%.0f%%; watermarks %u%%/%u%%), %u pages free",
		 sz(s->used_bytes, a, sizeof(a)), sz(s->pool_bytes, b, sizeof(b)),
		 s->pool_bytes ? 100.0 * (double)s->used_bytes / (double)s->pool_bytes : 0.0, s->high_watermark_pct,
		 s->low_watermark_pct, s->pages_free);
	if (s->spill_capacity_bytes)
		top_line(tp, "spill:    %s used of %s; read %s, write %s", sz(s->spill_used_bytes, a, sizeof(a)),
			 sz(s->spill_capacity_bytes, b, sizeof(b)),
			 rate(delta(s->spill_bytes_read, tp->prev_read), dt, c, sizeof(c)),
			 rate(delta(s->spill_bytes_written, tp->prev_written), dt, d, sizeof(d)));
	if (dt > 0)
		snprintf(d, sizeof(d), "%.0f%%", 100.0 * delta(s->reclaim_busy_us, tp->prev_busy_us) / (dt * 1e6));
	else
		snprintf(d, sizeof(d), "-");
	/* admission waits and pressure evictions: the tenants table's WAITS, EVICTED */
	top_line(tp, "reclaim:  %s, busy %s; since start %s in %" PRIu64 " passes, %" PRIu64 " failed",
		 rate(delta(s->reclaim_bytes, tp->prev_reclaim), dt, c, sizeof(c)), d, sz(s->reclaim_bytes, a, sizeof(a)),
		 s->reclaim_passes, s->reclaim_failures);
	if (dt > 0)
		snprintf(c, sizeof(c), "%.0f", delta(s->data_ops_total, tp->prev_ops) / dt);
	else
		snprintf(c, sizeof(c), "-");
	top_line(tp, "data:     %u client%s, %s ops/s; sessions %u open, %u evicted", s->data_clients,
		 s->data_clients == 1 ? "" : "s", c, s->sessions_open, s->sessions_evicted);
	if (s->pool_backend && strcmp(s->pool_backend, "host") != 0) {
		/* the GPU's kernels: busy share, decode steps and how many waited once */
		const double steps = delta(s->gpu_decode_steps, tp->prev_steps);
		if (dt > 0) {
			snprintf(a, sizeof(a), "%.0f%%", 100.0 * delta(s->gpu_busy_us, tp->prev_gpu_us) / (dt * 1e6));
			snprintf(c, sizeof(c), "%.0f", steps / dt);
			if (steps > 0)
				snprintf(d, sizeof(d), "%.0f%%", 100.0 * delta(s->gpu_decode_steps_one_wait, tp->prev_one) / steps);
			else
				snprintf(d, sizeof(d), "-");
		} else {
			snprintf(a, sizeof(a), "-");
			snprintf(c, sizeof(c), "-");
			snprintf(d, sizeof(d), "-");
		}
		top_line(tp, "gpu:      busy %s; %s decode steps/s (%s with one wait); %" PRIu64 " kernel failures",
			 a, c, d, s->gpu_kernel_failures);
	}
}

/* The tenants table without ALLOWED (static, and the widest cell).  On a
 * terminal too narrow for that (it needs about 140 columns), only the columns
 * that move under pressure: use and what was done about it, which fits 80.
 * The budget (GUARANTEED, LIMIT; USE% is of the limit), SESSIONS (listed
 * below), the totals SPILLS, RESTORES, WAITED and AT-LIMIT stay in
 * `tqctl tenants`. */
static const enum tcol tc_top[] = {
	TC_NAME, TC_PRIO, TC_GUAR, TC_LIMIT, TC_USED, TC_PCT, TC_SPILLED, TC_SESSIONS,
	TC_SPILLS, TC_RESTORES, TC_WAITS, TC_WAITED, TC_MAXWAIT, TC_REFUSED, TC_ATLIMIT, TC_EVICTED,
};
static const enum tcol tc_narrow[] = {
	TC_NAME, TC_PRIO, TC_USED, TC_PCT, TC_SPILLED, TC_WAITS, TC_MAXWAIT, TC_REFUSED, TC_EVICTED,
};

static void top_tenants_fill(struct table *t, const enum tcol *cols, int ncol, const Tqkv__V1__ListTenantsReply *l,
			     size_t rows)
{
	tenant_table(t, cols, ncol);
	for (size_t i = 0; i < l->n_tenants && i < rows; i++)
		tenant_row(t, cols, l->tenants[i]);
}

static void top_tenants(struct top *tp, const Tqkv__V1__ListTenantsReply *l)
{
	size_t w[MAX_COLS], rows = l->n_tenants;
	int room = top_room(tp) - 2; /* the blank line and the header */
	struct table t;

	top_line(tp, "%s", "");
	if (room <= 0)
		return;
	if ((size_t)room < rows)
		rows = (size_t)room - 1; /* and a line that says how many more */
	top_tenants_fill(&t, tc_top, (int)(sizeof(tc_top) / sizeof(tc_top[0])), l, rows);
	if (tp->width > 0 && table_widths(&t, w) > (size_t)tp->width) {
		table_free(&t);
		top_tenants_fill(&t, tc_narrow, (int)(sizeof(tc_narrow) / sizeof(tc_narrow[0])), l, rows);
	}
	top_table(tp, &t);
	if (rows < l->n_tenants)
		top_line(tp, "(%zu more tenants: tqctl tenants)", l->n_tenants - rows);
}

static int tok_cmp(const void *a, const void *b)
{
	const struct top_tok *x = a, *y = b;

	return x->id < y->id ? -1 : x->id > y->id;
}

/* A session and its tokens appended per second since the previous refresh
 * (< 0: unknown, the first refresh). */
struct top_sess {
	const Tqkv__V1__Session *s;
	double tps;
};

/* Busiest first: tokens/s, then the most recent access, then the id. */
static int sess_cmp(const void *a, const void *b)
{
	const struct top_sess *x = a, *y = b;

	if (x->tps != y->tps)
		return x->tps < y->tps ? 1 : -1;
	if (x->s->last_access_ms != y->s->last_access_ms)
		return x->s->last_access_ms < y->s->last_access_ms ? 1 : -1;
	return x->s->id < y->s->id ? -1 : x->s->id > y->s->id;
}

static void top_session_row(struct table *t, const struct top_sess *e)
{
	const Tqkv__V1__Session *s = e->s;
	char id[24], tok[24], tps[24], res[24], sp[24], idle[24];

	if (e->tps < 0)
		snprintf(tps, sizeof(tps), "-");
	else
		snprintf(tps, sizeof(tps), e->tps < 10 ? "%.1f" : "%.0f", e->tps);
	table_row(t, num(s->id, id, sizeof(id)), s->tenant, session_state(s), num(s->tokens, tok, sizeof(tok)), tps,
		  sz(s->resident_bytes, res, sizeof(res)), sz(s->spilled_bytes, sp, sizeof(sp)),
		  ago(s->last_access_ms, idle, sizeof(idle)));
}

/* The busiest sessions, as many as fit (10 without a terminal); then
 * remembers every session's tokens for the next refresh. */
static int top_sessions(struct top *tp, const Tqkv__V1__ListSessionsReply *l, double dt)
{
	size_t n = l->n_sessions, show = tp->height ? 0 : 10;
	struct top_sess *e = calloc(n ? n : 1, sizeof(*e));
	struct top_tok *tok = calloc(n ? n : 1, sizeof(*tok));

	if (!e || !tok) {
		free(e);
		free(tok);
		fprintf(stderr, "tqctl: out of memory\n");
		return EXIT_ERR;
	}
	for (size_t i = 0; i < n; i++) {
		const Tqkv__V1__Session *s = l->sessions[i];
		struct top_tok key = { .id = s->id }, *p;
		e[i].s = s;
		e[i].tps = -1;
		if (dt > 0) {
			p = bsearch(&key, tp->tok, tp->n_tok, sizeof(*tp->tok), tok_cmp);
			e[i].tps = delta(s->tokens, p ? p->tokens : 0) / dt; /* new since: all its tokens */
		}
		tok[i] = (struct top_tok){ s->id, s->tokens };
	}
	qsort(e, n, sizeof(*e), sess_cmp);
	qsort(tok, n, sizeof(*tok), tok_cmp);
	free(tp->tok);
	tp->tok = tok;
	tp->n_tok = n;

	top_line(tp, "%s", "");
	if (tp->height && top_room(tp) > 2)
		show = (size_t)top_room(tp) - 2; /* the title and the header */
	if (show > n)
		show = n;
	if (n == 0)
		top_line(tp, "%s", "sessions: none");
	else
		top_line(tp, "sessions: %zu of %zu, busiest first (tokens/s, then last access)", show, n);
	if (show) {
		struct table t = { .ncol = 8, .hdr = { "ID", "TENANT", "STATE", "TOKENS", "TOK/S", "RESIDENT", "SPILLED",
			"IDLE" }, .right = (1u << 0) | (1u << 3) | (1u << 4) | (1u << 5) | (1u << 6) | (1u << 7) };
		for (size_t i = 0; i < show; i++)
			top_session_row(&t, &e[i]);
		top_table(tp, &t);
	}
	free(e);
	return 0;
}

/* One refresh: three calls, then the frame.  Nonzero: the daemon failed. */
static int top_refresh(struct ctx *x, struct top *tp)
{
	Tqkv__V1__GetStatsRequest sq = TQKV__V1__GET_STATS_REQUEST__INIT;
	Tqkv__V1__ListTenantsRequest tq = TQKV__V1__LIST_TENANTS_REQUEST__INIT;
	Tqkv__V1__ListSessionsRequest lq = TQKV__V1__LIST_SESSIONS_REQUEST__INIT;
	ProtobufCMessage *srep = NULL, *trep = NULL, *lrep = NULL;
	struct winsize ws;
	int r;

	if ((r = call(x, "GetStats", &sq.base, &srep)) != 0 || (r = call(x, "ListTenants", &tq.base, &trep)) != 0 ||
	    (r = call(x, "ListSessions", &lq.base, &lrep)) != 0)
		goto out;
	Tqkv__V1__Stats *s = (void *)srep;
	tp->width = tp->height = 0;
	if (tp->tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0) {
		tp->width = ws.ws_col;
		tp->height = ws.ws_row;
	}
	if (tp->tty)
		fputs("\033[H\033[2J", stdout);
	else if (tp->frames)
		putchar('\n');
	tp->frames++;
	tp->lines = 0;
	top_header(tp, s);
	top_tenants(tp, (void *)trep);
	r = top_sessions(tp, (void *)lrep, top_elapsed(tp, s));
	fflush(stdout);
	tp->have_prev = true;
	tp->prev_ms = s->uptime_ms;
	tp->prev_reclaim = s->reclaim_bytes;
	tp->prev_busy_us = s->reclaim_busy_us;
	tp->prev_read = s->spill_bytes_read;
	tp->prev_written = s->spill_bytes_written;
	tp->prev_ops = s->data_ops_total;
	tp->prev_gpu_us = s->gpu_busy_us;
	tp->prev_steps = s->gpu_decode_steps;
	tp->prev_one = s->gpu_decode_steps_one_wait;
out:
	if (srep)
		protobuf_c_message_free_unpacked(srep, NULL);
	if (trep)
		protobuf_c_message_free_unpacked(trep, NULL);
	if (lrep)
		protobuf_c_message_free_unpacked(lrep, NULL);
	return r;
}

/* Waits one interval.  1: quit (q, or the terminal went away); 0: refresh
 * (the time is up, another key, or the window changed size). */
static int top_wait(const struct top *tp)
{
	struct pollfd p = { .fd = tp->key_fd, .events = POLLIN };
	char keys[64];

	if (poll(&p, tp->key_fd >= 0 ? 1 : 0, tp->interval_ms) <= 0 || !(p.revents & (POLLIN | POLLHUP | POLLERR)))
		return 0;
	ssize_t n = read(tp->key_fd, keys, sizeof(keys));
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return 0;
	if (n <= 0)
		return 1;
	return memchr(keys, 'q', (size_t)n) || memchr(keys, 'Q', (size_t)n);
}

static int parse_interval(const char *s, int *ms)
{
	char *end;

	errno = 0;
	double v = strtod(s, &end);
	if (!s[0] || *end || errno || !(v > 0) || v > 86400) {
		usage_error("--interval: '%s' is not a number of seconds above 0 (examples: 2, 0.5)", s);
		return -EINVAL;
	}
	double m = v * 1e3;
	*ms = (int)m;
	if (*ms < m) /* round up: 0.0001 s is 1 ms, not a busy loop */
		(*ms)++;
	return 0;
}

/* argv (after option parsing): interval count, "" = not given */
static int cmd_top(struct ctx *x, int argc, char **argv)
{
	struct top tp = { .interval_ms = 1000, .count = -1, .key_fd = -1 };
	int r = 0;

	if (argc != 2) {
		usage_error("%s", "top takes options only");
		return EXIT_USAGE;
	}
	if (argv[0][0] && parse_interval(argv[0], &tp.interval_ms) < 0)
		return EXIT_USAGE;
	if (argv[1][0]) {
		char *end;
		errno = 0;
		tp.count = strtol(argv[1], &end, 10);
		if (*end || errno || tp.count <= 0) {
			usage_error("-n: '%s' is not a positive number of refreshes", argv[1]);
			return EXIT_USAGE;
		}
	}
	tp.tty = isatty(STDOUT_FILENO);
	if (tp.tty) {
		setvbuf(stdout, NULL, _IOFBF, 1 << 16); /* one write per frame: no flicker */
		tp.key_fd = term_setup();
	} else if (tp.count < 0) {
		tp.count = 1;
	}
	for (;;) {
		if ((r = top_refresh(x, &tp)) != 0)
			break;
		if ((tp.count > 0 && --tp.count == 0) || top_wait(&tp))
			break;
	}
	free(tp.tok);
	fflush(stdout);
	term_restore();
	return r;
}

static const struct cmd cmds[] = {
	{ "health", "", "is the daemon up? (Health)",
	  "Prints SERVING, the version, the pid and the uptime; or NOT_SERVING and why\n"
	  "(the pool's GPU failed and tqkvd is stopping, or it is shutting down), and\n"
	  "then exits 1.", true, cmd_health },
	{ "stats", "", "daemon-wide counters (GetStats)",
	  "Pool use, sessions open/evicted, totals, control calls, reloads, the data\n"
	  "path, the spill tier, persistent sessions, and the reclaimer: its watermarks\n"
	  "(percent of the pool: spill above the first down to the second), bytes it\n"
	  "spilled and in how many passes, its rate (those bytes over the time it spent\n"
	  "spilling; '-' before it ran), spills that failed, allocations that waited\n"
	  "for it, and sessions evicted under pressure (pool.pressure_action = evict).\n"
	  "On a GPU pool also its kernel calls: appends, attentions, decode steps\n"
	  "(APPEND_ATTEND) in one call and how many of them waited once (the attention\n"
	  "queued behind the append), failures, and the GPU time they took.", true, cmd_stats },
	{ "sessions", "[--tenant TENANT]", "list sessions (ListSessions)",
	  "One row per session: id, name, tenant, owner uid, state, geometry\n"
	  "(layers x kv heads / query heads x head dim), K/V codecs, tokens, resident and\n"
	  "spilled bytes, time since the last access.", true, cmd_sessions },
	{ "session", "ID", "one session in detail (GetSession)",
	  "Every field of session ID; for an evicted session, who evicted it and why.\n"
	  "Its K/V transform mode, then one row per layer once it holds data: whether\n"
	  "its first append calibrated it, the parts applied (fewer than the mode when\n"
	  "that append had under 8 tokens, or no queries for k-eq-qk), the tokens it\n"
	  "was calibrated on, the calibration keys' |mean| relative to their rms (what\n"
	  "K centering removes), the range of K equalization's channel scales, and the\n"
	  "values' |mean| relative to their rms.", true, cmd_session },
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
	  "  WAITS     allocations that waited for memory (a full pool, or room under\n"
	  "            the tenant's limit) while pages were spilled for them\n"
	  "  WAITED    the time they waited, all together; MAXWAIT the longest wait\n"
	  "  REFUSED   allocations refused on a full pool (POOL_FULL)\n"
	  "  AT-LIMIT  appends and restores refused at the tenant's limit (TENANT_LIMIT;\n"
	  "            RestoreSession's RESOURCE_EXHAUSTED)\n"
	  "  EVICTED   sessions evicted under pressure (pool.pressure_action = evict)\n"
	  "its sessions' sparse-V (tenant.sparse_v; 0: off) and, since start, the\n"
	  "share of value chunks (up to 32 keys of a KV head) their attention\n"
	  "skipped (V-SKIP; '-' before any attention; on a cuda pool the chunks are\n"
	  "counted only while sparse_v > 0);\n"
	  "and the users/groups allowed to open sessions.", true, cmd_tenants },
	{ "budget", "set TENANT [--limit SIZE] [--guaranteed SIZE]", "change a tenant's budget (SetTenantBudget)",
	  "SIZE: an integer with an optional binary unit: 4096, 512M, 2GiB, 1T.\n"
	  "Takes effect at once; a lower limit than the current use stops new charges.\n"
	  "SIGHUP (reload) restores the config file's values.", true, cmd_budget },
	{ "config", "", "the daemon's effective configuration (GetConfig)",
	  "Every option with its value, default and whether SIGHUP reloads it.", true, cmd_config },
	{ "open", "[--tenant T] --layers N --kv-heads N --q-heads N --head-dim D --max-tokens N\n"
	  "                 [--k-codec C] [--v-codec C] [--name NAME] [--seed S] [--persistent]\n"
	  "                 [--kv-transform MODE]",
	  "admit a session owned by you (OpenSession)",
	  "For operators and tests; inference processes open sessions through libtqkv.\n"
	  "--tenant: default the tenant \"default\".\n"
	  "Codecs: f16 f32 q8 q4a tq2 tq3 tq4, and tq3o tq4o (keys with outlier\n"
	  "channels at one bit more); default q8 (K) and tq4 (V).\n"
	  "The session is not tied to any connection: it stays until closed or\n"
	  "evicted, or idle past daemon.session_idle_ttl (default 1h).\n"
	  "--persistent: the session is kept on\n"
	  "disk and survives a restart of the daemon; it is never idle-expired.\n"
	  "--kv-transform MODE: the K/V transforms attention undoes exactly (default:\n"
	  "the daemon's daemon.kv_transform): none, default\n"
	  "(k-center+v-eq+k-eq-qk+k-unshrink+k-order), or parts joined by '+':\n"
	  "k-center, k-sink, v-center, v-eq, k-eq-qk, k-eq-k, k-unshrink, k-order.", true, cmd_open },
	{ "top", "[--interval SECONDS] [-n COUNT]", "a live view of the pool, tenants and busiest sessions",
	  "Calls GetStats, ListTenants and ListSessions every --interval SECONDS\n"
	  "(default 1; decimals such as 0.5 are fine) and shows:\n"
	  "  the daemon's version and uptime; pool use of its size, the reclaimer's\n"
	  "  watermarks and free pages; spill tier use; since the previous refresh\n"
	  "  ('-' on the first), the reclaimer's rate and busy share, spill reads and\n"
	  "  writes per second and data-path operations per second; since start, what\n"
	  "  the reclaimer spilled and its failures; on a GPU pool, the GPU's busy share,\n"
	  "  decode steps per second and the share that waited once, kernel failures;\n"
	  "  the tenants table of `tqctl tenants` without ALLOWED (on a terminal too\n"
	  "  narrow for it: use, spilled, waits, refusals on a full pool and evictions\n"
	  "  only);\n"
	  "  the busiest sessions, by tokens appended per second (TOK/S), then by the\n"
	  "  most recent access: as many as fit the terminal, 10 otherwise.\n"
	  "On a terminal it redraws in place until q is pressed (any other key\n"
	  "refreshes now), or for COUNT refreshes with -n (--count).  Otherwise it\n"
	  "prints COUNT (default 1) plain snapshots separated by a blank line.  A\n"
	  "client sees the tenants it may use and its own sessions.  Exit status 1 if\n"
	  "the daemon fails or goes away.  No --json: use stats, tenants or sessions\n"
	  "--json.", false, cmd_top },
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
		"Exit status: 0 success, 1 error (health: NOT_SERVING too), 2 bad usage.\n", DEFAULT_TIMEOUT_MS);
}

static void cmd_usage(const struct cmd *c, FILE *f)
{
	fprintf(f, "Usage: tqctl %s %s\n\n%s.\n\n%s\n\nOptions: --socket PATH, %s--timeout MS (see tqctl --help).\n",
		c->name, c->args, c->summary, c->help, c->reads ? "--json, " : "");
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
	       O_KVX, O_PERSIST, O_INTERVAL, O_COUNT, O_LAST = O_COUNT };
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
		{ "kv-transform", required_argument, NULL, O_KVX },
		{ "persistent", no_argument, NULL, O_PERSIST },
		{ "interval", required_argument, NULL, O_INTERVAL },
		{ "count", required_argument, NULL, O_COUNT }, /* -n */
		{ NULL, 0, NULL, 0 },
	};
	struct ctx x = { .timeout_ms = DEFAULT_TIMEOUT_MS };
	/* values of the command-specific options, "" = not given */
	const char *val[O_LAST - O_TENANT + 1];
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
	while ((opt = getopt_long(sub_argc, sub_argv, "s:jt:hn:", longopts, NULL)) != -1) {
		switch (opt) {
		case 's': x.socket = optarg; break;
		case 'j': x.json = true; break;
		case 't': x.timeout_ms = atoi(optarg); break;
		case 'h': help = true; break;
		case 'n': val[O_COUNT - O_TENANT] = optarg; break;
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
	if (x.json && !cur_cmd->reads) {
		usage_error("%s takes no --json; use stats, tenants or sessions --json", cur_cmd->name);
		return EXIT_USAGE;
	}
	/* options that only some commands take */
	bool is_sessions = cur_cmd->fn == cmd_sessions, is_budget = cur_cmd->fn == cmd_budget,
	     is_open = cur_cmd->fn == cmd_open, is_top = cur_cmd->fn == cmd_top;
	for (int i = 0; i <= O_LAST - O_TENANT; i++) {
		int o = O_TENANT + i;
		bool ok = (o == O_TENANT && (is_sessions || is_open)) ||
			  ((o == O_LIMIT || o == O_GUAR) && is_budget) || (o >= O_LAYERS && o <= O_PERSIST && is_open) ||
			  ((o == O_INTERVAL || o == O_COUNT) && is_top);
		if (val[i] && !ok) {
			usage_error("this command takes no %s--%s", o == O_COUNT ? "-n/" : "", longopts[5 + i].name);
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
					    O_PERSIST, O_KVX };
		for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
			const char *v = val[need[i] - O_TENANT];
			bool optional = need[i] == O_KC || need[i] == O_VC || need[i] == O_NAME ||
					need[i] == O_SEED || need[i] == O_TENANT || need[i] == O_PERSIST ||
					need[i] == O_KVX;
			if (!v && !optional) {
				usage_error("--%s is required", longopts[5 + need[i] - O_TENANT].name);
				return EXIT_USAGE;
			}
			pos[npos++] = (char *)(v ? v : "");
		}
	} else if (is_top) {
		if (npos) {
			usage_error("%s", "top takes options only");
			return EXIT_USAGE;
		}
		pos[npos++] = (char *)(val[O_INTERVAL - O_TENANT] ? val[O_INTERVAL - O_TENANT] : "");
		pos[npos++] = (char *)(val[O_COUNT - O_TENANT] ? val[O_COUNT - O_TENANT] : "");
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
