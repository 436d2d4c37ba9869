/* config.c — the option table and everything driven by it. */
#include "config.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <ini.h>
#include <inttypes.h>
#include <math.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "log.h"
#include "spill.h" /* SPILL_HDR_BYTES: a spill slot's header */
#include "tq_size.h"
#include "tq_xform.h"

enum opt_type {
	OPT_PATH,      /* char[CONFIG_DIR_MAX]                      */
	OPT_NAME,      /* char[CONFIG_NAME_MAX], group name or ""   */
	OPT_LOGLEVEL,  /* int                                       */
	OPT_U32,       /* uint32_t in [min, max]                    */
	OPT_I32,       /* int32_t in [min, max]                     */
	OPT_SIZE,      /* uint64_t bytes in [min, max]              */
	OPT_DURATION,  /* uint64_t milliseconds in [min, max]       */
	OPT_BOOL,      /* bool: yes/no, true/false, on/off, 1/0     */
	OPT_UIDS,      /* tenant_conf.any_uid / n_uids / uids       */
	OPT_GIDS,      /* tenant_conf.n_gids / gids                 */
	OPT_CHOICE,    /* int: index into opt.choices               */
	OPT_XFORM,     /* uint32_t TQ_XF_* mode (tq_xf_mode_parse)  */
	OPT_FRACTION,  /* float in [min, max] millionths            */
};

enum opt_scope { SCOPE_GLOBAL, SCOPE_TENANT };

struct opt {
	const char *section;    /* "daemon", "pool"; "tenant" for [tenant NAME] */
	const char *name;
	enum opt_type type;
	enum opt_scope scope;
	size_t off;             /* in struct config or struct tenant_conf       */
	uint64_t min, max;      /* numeric bounds (I32: as int64 casts)          */
	const char *def;        /* default, config syntax; NULL: computed        */
	const char *def_text;   /* shown when def is NULL                        */
	bool reloadable;
	const char *help;
	const char *const *choices; /* OPT_CHOICE: the names, NULL-terminated   */
};

static const char *const pressure_actions[] = { "fail", "evict", NULL }; /* enum config_pressure_action */
static const char *const backends[] = { "host", "cuda", NULL };          /* enum config_backend */

#define G(f) SCOPE_GLOBAL, offsetof(struct config, f)
#define T(f) SCOPE_TENANT, offsetof(struct tenant_conf, f)
#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define PiB ((uint64_t)1 << 50)
#define DAY_MS ((uint64_t)86400 * 1000)

/* The table.  Order = order in GetConfig, --check-config and the file. */
static const struct opt opts[] = {
	{ "daemon", "run_dir", OPT_PATH, G(run_dir), 0, 0, CONFIG_DEFAULT_RUN_DIR, NULL, false,
	  "control socket and lock file directory (--run-dir overrides)", NULL },
	{ "daemon", "log_level", OPT_LOGLEVEL, G(log_level), 0, 0, "info", NULL, true,
	  "err, warning, notice, info or debug", NULL },
	{ "daemon", "control_tcp_port", OPT_U32, G(control_tcp_port), 0, 65535, "0", NULL, false,
	  "also serve the control API on 127.0.0.1:PORT (0: unix socket only)", NULL },
	{ "daemon", "control_group", OPT_NAME, G(control_group), 0, 0, "", NULL, false,
	  "group that owns control.sock and data.sock (mode 0660): its members are clients; "
	  "empty: the daemon's group", NULL },
	{ "daemon", "operator_group", OPT_NAME, G(operator_group), 0, 0, "", NULL, true,
	  "members may act on every session, budgets and the configuration (root and the daemon's "
	  "user always may); empty: nobody else", NULL },
	{ "daemon", "max_sessions", OPT_U32, G(max_sessions), 1, 65536, "1024", NULL, true,
	  "sessions open or evicted at once; OpenSession beyond it fails", NULL },
	{ "daemon", "max_sessions_per_uid", OPT_U32, G(max_sessions_per_uid), 1, 65536, "256", NULL, true,
	  "sessions one user may hold at once (open or evicted)", NULL },
	{ "daemon", "session_idle_ttl", OPT_DURATION, G(session_idle_ttl_ms), 0, 30 * DAY_MS, "1h", NULL, true,
	  "evict sessions idle this long, drop evicted ones after as long again (0: never)", NULL },
	{ "daemon", "max_clients", OPT_U32, G(max_clients), 1, 65536, "256", NULL, true,
	  "data connections (data.sock) at once, all users; one thread each", NULL },
	{ "daemon", "max_clients_per_uid", OPT_U32, G(max_clients_per_uid), 1, 65536, "32", NULL, true,
	  "data connections one user may hold at once (handshakes in progress count)", NULL },
	{ "daemon", "max_arena_per_uid", OPT_SIZE, G(max_arena_per_uid), MiB, PiB, "16GiB", NULL, true,
	  "shared ring memory one user's data connections may map together", NULL },
	{ "daemon", "max_workers_per_uid", OPT_U32, G(max_workers_per_uid), 0, 256, "0", NULL, true,
	  "data workers one user's operations may hold at once, so another user's next op never waits "
	  "behind a busy one's (0: no cap; one user with nobody else waiting still gets them all)", NULL },
	{ "daemon", "data_workers", OPT_U32, G(data_workers), 0, 256, "0", NULL, false,
	  "threads running data operations (append, attention); 0: one per CPU", NULL },
	{ "daemon", "attention_threads", OPT_U32, G(attention_threads), 1, 256, "1", NULL, false,
	  "threads per attention call (each data worker owns a pool of this many)", NULL },
	{ "daemon", "kv_transform", OPT_XFORM, G(kv_transform), 0, 0, "default", NULL, true,
	  "K/V transforms of new sessions that ask for none (attention undoes them exactly): none, "
	  "default (k-center+v-eq+k-eq-qk+k-unshrink+k-order), or parts joined by '+': k-center, k-sink, v-center, v-eq, k-eq-qk, k-eq-k, k-unshrink, k-order", NULL },
	{ "pool", "pool_bytes", OPT_SIZE, G(pool_bytes), 4 * MiB, PiB, "1GiB", NULL, false,
	  "host memory for compressed KV pages; tenant budgets must fit in it", NULL },
	{ "pool", "spill_dir", OPT_PATH, G(spill_dir), 0, 0, CONFIG_DEFAULT_SPILL_DIR, NULL, false,
	  "directory for spill files (created at start; must be writable)", NULL },
	{ "pool", "page_bytes", OPT_SIZE, G(page_bytes), 4 * KiB, 64 * MiB, "64KiB", NULL, false,
	  "pool page size (a multiple of 4KiB): one (session, layer)'s run of tokens", NULL },
	{ "pool", "numa_node", OPT_I32, G(numa_node), (uint64_t)(int64_t)-1, 1023, "-1", NULL, false,
	  "bind the pool to this NUMA node (libnuma); -1: no binding", NULL },
	{ "pool", "allow_overcommit", OPT_BOOL, G(allow_overcommit), 0, 0, "no", NULL, false,
	  "start even when pool_bytes exceeds the machine's available memory (MemAvailable)", NULL },
	{ "pool", "spill_bytes", OPT_SIZE, G(spill_bytes), 0, 64 * PiB, "0", NULL, false,
	  "capacity of the spill file in spill_dir, preallocated at start; 0: 4 x pool_bytes", NULL },
	{ "pool", "spill_fallback", OPT_BOOL, G(spill_fallback), 0, 0, "no", NULL, false,
	  "use pread/pwrite when io_uring or O_DIRECT is unavailable (slower; logged)", NULL },
	{ "pool", "checkpoint_interval", OPT_DURATION, G(checkpoint_interval_ms), 100, 3600 * 1000, "5s", NULL, true,
	  "persistent sessions: write what changed (pages, manifest) this often; a power loss "
	  "loses at most this much (a killed daemon loses nothing: appends are journaled)", NULL },
	{ "pool", "high_watermark", OPT_U32, G(high_watermark), 1, 100, "90", NULL, true,
	  "percent of the pool in use above which the reclaimer spills the pages of tenants "
	  "above their guarantee (lowest priority first)", NULL },
	{ "pool", "low_watermark", OPT_U32, G(low_watermark), 0, 99, "80", NULL, true,
	  "percent of the pool the reclaimer spills down to once it started (< high_watermark)", NULL },
	{ "pool", "admission_wait", OPT_DURATION, G(admission_wait_ms), 0, 60 * 1000, "2s", NULL, true,
	  "how long an allocation may wait on a full pool while pages of tenants above their "
	  "guarantee are spilled for it; 0: never wait", NULL },
	{ "pool", "pressure_action", OPT_CHOICE, G(pressure_action), 0, 0, "fail", NULL, true,
	  "when nothing can be spilled (tier full or failing): fail (the allocation gets POOL_FULL) "
	  "or evict (the lowest-priority session above its tenant's guarantee is dropped; its owner "
	  "gets EVICTED)", pressure_actions },
	{ "pool", "backend", OPT_CHOICE, G(backend), 0, 0, "host", NULL, false,
	  "where the pool lives and attention runs: host (DRAM, CPU kernels) or cuda (the memory "
	  "of CUDA device pool.device — device memory on a discrete GPU, memory the CPU and GPU "
	  "share on an integrated one — and the GPU kernels)", backends },
	{ "pool", "device", OPT_U32, G(device), 0, 1023, "0", NULL, false,
	  "pool.backend = cuda: the CUDA device index (as nvidia-smi and CUDA_VISIBLE_DEVICES count)", NULL },
	{ "pool", "backend_fallback", OPT_BOOL, G(backend_fallback), 0, 0, "no", NULL, false,
	  "pool.backend = cuda and no usable GPU (no driver, no such device, out of device memory): "
	  "start on host memory with the CPU kernels instead of failing (logged)", NULL },
	{ "tenant", "guaranteed", OPT_SIZE, T(guaranteed), 0, PiB, "0", NULL, true,
	  "bytes this tenant keeps under pressure; all guarantees fit in pool_bytes", NULL },
	{ "tenant", "limit", OPT_SIZE, T(limit), MiB, PiB, NULL, "pool_bytes", true,
	  "bytes this tenant may hold at most (>= guaranteed, <= pool_bytes)", NULL },
	{ "tenant", "priority", OPT_I32, T(priority), 0, 100, "0", NULL, true,
	  "0..100; under pressure lower priorities spill first", NULL },
	{ "tenant", "allow_uids", OPT_UIDS, T(any_uid), 0, 0, "", NULL, true,
	  "users (names or numbers, comma-separated, * = anyone) that may open sessions", NULL },
	{ "tenant", "allow_gids", OPT_GIDS, T(n_gids), 0, 0, "", NULL, true,
	  "groups (names or numbers) whose members may open sessions", NULL },
	{ "tenant", "sparse_v", OPT_FRACTION, T(sparse_v), 0, 100000, "0", NULL, true,
	  "attention of its sessions skips decoding values while at most this fraction of each "
	  "query head's attention weight is left out (0..0.1; 0: off, exact): each output moves by "
	  "at most sparse_v x the largest value norm", NULL },
};
#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

static_assert(N_OPTS <= sizeof(((struct config *)0)->opt_line) / sizeof(int), "opt_line too small");

static int first_tenant_opt(void)
{
	for (size_t i = 0; i < N_OPTS; i++)
		if (opts[i].scope == SCOPE_TENANT)
			return (int)i;
	return (int)N_OPTS;
}

/* ---- error text ------------------------------------------------------------ */
struct errbuf {
	char *buf;
	size_t len, used;
	int n;
};

__attribute__((format(printf, 2, 3)))
static void err_add(struct errbuf *e, const char *fmt, ...)
{
	va_list ap;

	e->n++;
	if (!e->buf || e->len == 0 || e->used + 1 >= e->len)
		return;
	if (e->used > 0) {
		e->buf[e->used++] = '\n';
		e->buf[e->used] = '\0';
	}
	va_start(ap, fmt);
	int m = vsnprintf(e->buf + e->used, e->len - e->used, fmt, ap);
	va_end(ap);
	if (m > 0)
		e->used += (size_t)m;
	if (e->used >= e->len)
		e->used = e->len - 1;
}

/* ---- values ------------------------------------------------------------------ */
int config_parse_size(const char *s, uint64_t *out)
{
	return tq_size_parse(s, out);
}

int config_parse_duration_ms(const char *s, uint64_t *out)
{
	const char *p = s;
	uint64_t v = 0, mul = 1000;

	while (isspace((unsigned char)*p))
		p++;
	if (!isdigit((unsigned char)*p))
		return -EINVAL;
	for (; isdigit((unsigned char)*p); p++) {
		if (v > (UINT64_MAX - 9) / 10)
			return -ERANGE;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	while (isspace((unsigned char)*p)) /* "2 s", as sizes take "16 G" */
		p++;
	if (strncmp(p, "ms", 2) == 0)
		mul = 1, p += 2;
	else if (*p == 's')
		mul = 1000, p++;
	else if (*p == 'm')
		mul = 60 * 1000, p++;
	else if (*p == 'h')
		mul = 3600 * 1000, p++;
	else if (*p == 'd')
		mul = DAY_MS, p++;
	while (isspace((unsigned char)*p))
		p++;
	if (*p)
		return -EINVAL;
	if (v > UINT64_MAX / mul)
		return -ERANGE;
	*out = v * mul;
	return 0;
}

void config_format_size(uint64_t v, char *buf, size_t n)
{
	static const char *const unit[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
	int u = -1;

	while (v && u < 4 && (v & 1023) == 0) {
		v >>= 10;
		u++;
	}
	if (u < 0)
		snprintf(buf, n, "%" PRIu64, v);
	else
		snprintf(buf, n, "%" PRIu64 "%s", v, unit[u]);
}

void config_format_size_human(uint64_t v, char *buf, size_t n)
{
	tq_size_format_human(v, buf, n);
}

void config_format_duration_ms(uint64_t ms, char *buf, size_t n)
{
	if (ms == 0)
		snprintf(buf, n, "0");
	else if (ms % DAY_MS == 0)
		snprintf(buf, n, "%" PRIu64 "d", ms / DAY_MS);
	else if (ms % 3600000 == 0)
		snprintf(buf, n, "%" PRIu64 "h", ms / 3600000);
	else if (ms % 60000 == 0)
		snprintf(buf, n, "%" PRIu64 "m", ms / 60000);
	else if (ms % 1000 == 0)
		snprintf(buf, n, "%" PRIu64 "s", ms / 1000);
	else
		snprintf(buf, n, "%" PRIu64 "ms", ms);
}

int config_check_name(const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || n >= CONFIG_NAME_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)name[i]) && !strchr("_.-", name[i]))
			return -EINVAL;
	return 0;
}

/* "alice, 1000, *" → ids; names resolve through NSS now (start or reload). */
static int parse_id_list(const char *s, bool users, bool *any, uint32_t *ids, uint32_t *n_ids,
			 char *why, size_t whylen)
{
	char tok[CONFIG_NAME_MAX];
	const char *p = s;

	*n_ids = 0;
	if (any)
		*any = false;
	while (*p) {
		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		if (!*p)
			break;
		size_t k = 0;
		while (*p && *p != ',' && *p != ' ' && *p != '\t') {
			if (k + 1 >= sizeof(tok)) {
				snprintf(why, whylen, "name too long");
				return -EINVAL;
			}
			tok[k++] = *p++;
		}
		tok[k] = '\0';
		if (strcmp(tok, "*") == 0) {
			if (!any) {
				snprintf(why, whylen, "'*' is only valid in allow_uids");
				return -EINVAL;
			}
			*any = true;
			continue;
		}
		char *end;
		uint32_t id;
		errno = 0;
		unsigned long long v = strtoull(tok, &end, 10);
		if (isdigit((unsigned char)tok[0]) && *end == '\0') {
			if (errno || v >= UINT32_MAX) {
				snprintf(why, whylen, "'%s' is out of range", tok);
				return -ERANGE;
			}
			id = (uint32_t)v;
		} else if (users) {
			struct passwd pw, *r = NULL;
			char nb[4096];
			if (getpwnam_r(tok, &pw, nb, sizeof(nb), &r) != 0 || !r) {
				snprintf(why, whylen, "unknown user '%s'", tok);
				return -ENOENT;
			}
			id = (uint32_t)pw.pw_uid;
		} else {
			struct group gr, *r = NULL;
			char nb[8192];
			if (getgrnam_r(tok, &gr, nb, sizeof(nb), &r) != 0 || !r) {
				snprintf(why, whylen, "unknown group '%s'", tok);
				return -ENOENT;
			}
			id = (uint32_t)gr.gr_gid;
		}
		if (*n_ids >= CONFIG_MAX_IDS) {
			snprintf(why, whylen, "more than %d ids", CONFIG_MAX_IDS);
			return -E2BIG;
		}
		ids[(*n_ids)++] = id;
	}
	return 0;
}

/* Parse `value` into the field of `o` inside `base`; why gets the reason. */
static int opt_parse(const struct opt *o, void *base, const char *value, char *why, size_t whylen)
{
	char *f = (char *)base + o->off;
	int r;

	switch (o->type) {
	case OPT_PATH:
		if (value[0] == '\0') {
			snprintf(why, whylen, "must not be empty");
			return -EINVAL;
		}
		if (strlen(value) >= CONFIG_DIR_MAX) {
			snprintf(why, whylen, "longer than %d characters", CONFIG_DIR_MAX - 1);
			return -ENAMETOOLONG;
		}
		strcpy(f, value);
		return 0;
	case OPT_NAME:
		if (value[0] && config_check_name(value) < 0) {
			snprintf(why, whylen, "'%s' is not a name ([A-Za-z0-9_.-], 1..%d characters)",
				 value, CONFIG_NAME_MAX - 1);
			return -EINVAL;
		}
		strcpy(f, value);
		return 0;
	case OPT_LOGLEVEL:
		r = log_level_from_name(value);
		if (r < 0) {
			snprintf(why, whylen, "'%s' is not a log level (err, warning, notice, info, debug)", value);
			return r;
		}
		*(int *)f = r;
		return 0;
	case OPT_U32:
	case OPT_I32: {
		char *end;
		errno = 0;
		long long v = strtoll(value, &end, 10);
		if (value[0] == '\0' || *end != '\0' || errno) {
			snprintf(why, whylen, "'%s' is not an integer", value);
			return -EINVAL;
		}
		if (v < (long long)o->min || v > (long long)o->max) {
			snprintf(why, whylen, "%lld is out of range [%lld, %lld]", v, (long long)o->min,
				 (long long)o->max);
			return -ERANGE;
		}
		if (o->type == OPT_U32)
			*(uint32_t *)f = (uint32_t)v;
		else
			*(int32_t *)f = (int32_t)v;
		return 0;
	}
	case OPT_SIZE:
	case OPT_DURATION: {
		uint64_t v;
		char lo[32], hi[32];
		if (o->type == OPT_SIZE) {
			r = config_parse_size(value, &v);
			config_format_size(o->min, lo, sizeof(lo));
			config_format_size(o->max, hi, sizeof(hi));
		} else {
			r = config_parse_duration_ms(value, &v);
			config_format_duration_ms(o->min, lo, sizeof(lo));
			config_format_duration_ms(o->max, hi, sizeof(hi));
		}
		if (r < 0 && r != -ERANGE) {
			snprintf(why, whylen, o->type == OPT_SIZE
				 ? "'%s' is not a size (examples: 4096, 512M, 1GiB)"
				 : "'%s' is not a duration (examples: 0, 500ms, 30s, 10m, 2h, 1d)", value);
			return r;
		}
		if (r == -ERANGE || v < o->min || v > o->max) {
			snprintf(why, whylen, "'%s' is out of range [%s, %s]", value, lo, hi);
			return -ERANGE;
		}
		*(uint64_t *)f = v;
		return 0;
	}
	case OPT_BOOL:
		if (!strcmp(value, "yes") || !strcmp(value, "true") || !strcmp(value, "on") || !strcmp(value, "1"))
			*(bool *)f = true;
		else if (!strcmp(value, "no") || !strcmp(value, "false") || !strcmp(value, "off") || !strcmp(value, "0"))
			*(bool *)f = false;
		else {
			snprintf(why, whylen, "'%s' is not a boolean (yes or no)", value);
			return -EINVAL;
		}
		return 0;
	case OPT_UIDS: {
		struct tenant_conf *t = base;
		return parse_id_list(value, true, &t->any_uid, t->uids, &t->n_uids, why, whylen);
	}
	case OPT_GIDS: {
		struct tenant_conf *t = base;
		return parse_id_list(value, false, NULL, t->gids, &t->n_gids, why, whylen);
	}
	case OPT_XFORM:
		if (tq_xf_mode_parse(value, (uint32_t *)(void *)f) < 0) {
			snprintf(why, whylen, "'%s' is not a transform mode (none, default, or parts joined by "
				 "'+': k-center, k-sink, v-center, v-eq, k-eq-qk, k-eq-k, k-unshrink, k-order; at most one k-eq-* and one of k-center, k-sink)", value);
			return -EINVAL;
		}
		return 0;
	case OPT_FRACTION: {
		char *end;
		errno = 0;
		double v = strtod(value, &end);
		if (value[0] == '\0' || *end != '\0' || errno || !isfinite(v)) {
			snprintf(why, whylen, "'%s' is not a number (examples: 0, 0.001, 1e-3)", value);
			return -EINVAL;
		}
		if (v < (double)o->min * 1e-6 || v > (double)o->max * 1e-6) {
			snprintf(why, whylen, "%s is out of range [%g, %g]", value, (double)o->min * 1e-6,
				 (double)o->max * 1e-6);
			return -ERANGE;
		}
		*(float *)(void *)f = (float)v;
		return 0;
	}
	case OPT_CHOICE: {
		size_t used = 0;
		char list[256] = "";
		for (int i = 0; o->choices[i]; i++) {
			if (!strcmp(value, o->choices[i])) {
				*(int *)f = i;
				return 0;
			}
			used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%s", i ? ", " : "",
						 o->choices[i]);
			if (used >= sizeof(list))
				used = sizeof(list) - 1;
		}
		snprintf(why, whylen, "'%s' is not one of: %s", value, list);
		return -EINVAL;
	}
	}
	snprintf(why, whylen, "bad option type");
	return -EINVAL;
}

static void opt_format(const struct opt *o, const void *base, char *buf, size_t n)
{
	const char *f = (const char *)base + o->off;

	switch (o->type) {
	case OPT_PATH:
	case OPT_NAME:
		snprintf(buf, n, "%s", f);
		return;
	case OPT_LOGLEVEL:
		snprintf(buf, n, "%s", log_level_name(*(const int *)f));
		return;
	case OPT_U32:
		snprintf(buf, n, "%" PRIu32, *(const uint32_t *)f);
		return;
	case OPT_I32:
		snprintf(buf, n, "%" PRId32, *(const int32_t *)f);
		return;
	case OPT_SIZE:
		config_format_size(*(const uint64_t *)f, buf, n);
		return;
	case OPT_DURATION:
		config_format_duration_ms(*(const uint64_t *)f, buf, n);
		return;
	case OPT_BOOL:
		snprintf(buf, n, "%s", *(const bool *)f ? "yes" : "no");
		return;
	case OPT_CHOICE:
		snprintf(buf, n, "%s", o->choices[*(const int *)f]);
		return;
	case OPT_XFORM:
		tq_xf_mode_str(*(const uint32_t *)(const void *)f, buf, n);
		return;
	case OPT_FRACTION:
		snprintf(buf, n, "%g", (double)*(const float *)(const void *)f);
		return;
	case OPT_UIDS:
	case OPT_GIDS: {
		const struct tenant_conf *t = base;
		const uint32_t *ids = o->type == OPT_UIDS ? t->uids : t->gids;
		uint32_t k = o->type == OPT_UIDS ? t->n_uids : t->n_gids;
		size_t used = 0;
		buf[0] = '\0';
		if (o->type == OPT_UIDS && t->any_uid)
			used += (size_t)snprintf(buf, n, "*");
		for (uint32_t i = 0; i < k && used < n; i++)
			used += (size_t)snprintf(buf + used, n - used, "%s%" PRIu32, used ? "," : "", ids[i]);
		return;
	}
	}
	buf[0] = '\0';
}

static bool opt_equal(const struct opt *o, const void *a, const void *b)
{
	char x[1024], y[1024];

	opt_format(o, a, x, sizeof(x));
	opt_format(o, b, y, sizeof(y));
	return strcmp(x, y) == 0;
}

static void opt_copy(const struct opt *o, void *dst, const void *src)
{
	size_t sz;

	switch (o->type) {
	case OPT_PATH: sz = CONFIG_DIR_MAX; break;
	case OPT_NAME: sz = CONFIG_NAME_MAX; break;
	case OPT_LOGLEVEL:
	case OPT_CHOICE: sz = sizeof(int); break;
	case OPT_U32:
	case OPT_XFORM: sz = sizeof(uint32_t); break;
	case OPT_I32: sz = sizeof(int32_t); break;
	case OPT_SIZE:
	case OPT_DURATION: sz = sizeof(uint64_t); break;
	case OPT_BOOL: sz = sizeof(bool); break;
	case OPT_FRACTION: sz = sizeof(float); break;
	case OPT_UIDS: {
		struct tenant_conf *d = dst;
		const struct tenant_conf *s = src;
		d->any_uid = s->any_uid;
		d->n_uids = s->n_uids;
		memcpy(d->uids, s->uids, sizeof(d->uids));
		return;
	}
	case OPT_GIDS: {
		struct tenant_conf *d = dst;
		const struct tenant_conf *s = src;
		d->n_gids = s->n_gids;
		memcpy(d->gids, s->gids, sizeof(d->gids));
		return;
	}
	default:
		return;
	}
	memcpy((char *)dst + o->off, (const char *)src + o->off, sz);
}

/* ---- defaults ---------------------------------------------------------------- */
static void tenant_defaults(struct tenant_conf *t, const char *name, uint64_t pool_bytes)
{
	char why[128];

	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	for (size_t i = 0; i < N_OPTS; i++)
		if (opts[i].scope == SCOPE_TENANT && opts[i].def)
			opt_parse(&opts[i], t, opts[i].def, why, sizeof(why));
	t->limit = pool_bytes;
}

void config_defaults(struct config *c)
{
	char why[128];

	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < N_OPTS; i++)
		if (opts[i].scope == SCOPE_GLOBAL && opts[i].def)
			opt_parse(&opts[i], c, opts[i].def, why, sizeof(why));
	c->n_tenants = 1;
	tenant_defaults(&c->tenant[0], CONFIG_DEFAULT_TENANT, c->pool_bytes);
	c->tenant[0].any_uid = true;
}

/* ---- parsing ----------------------------------------------------------------- */
struct parse_state {
	struct config *c;
	const char *file;
	struct errbuf *e;
	int line;                       /* of the line inih is handling */
	int section_line;               /* of the last [section] header read */
	int handled_line;               /* section_line when the handler last saw a new section */
	bool long_line;
	const char *text;               /* string source, or NULL */
	FILE *fp;                       /* file source, or NULL */
	char section[CONFIG_DIR_MAX];   /* last section seen by the handler */
	struct tenant_conf *cur;        /* current [tenant NAME], or NULL */
	bool any_tenant;                /* the file has [tenant ...] sections */
};

/* fgets-like reader that counts lines, so handler errors name them. */
static char *reader(char *str, int num, void *stream)
{
	struct parse_state *ps = stream;
	char buf[8192];
	size_t n = 0;

	if (ps->fp) {
		if (!fgets(buf, sizeof(buf), ps->fp))
			return NULL;
		n = strlen(buf);
		if (n == sizeof(buf) - 1 && buf[n - 1] != '\n') {
			int ch;
			while ((ch = fgetc(ps->fp)) != EOF && ch != '\n')
				;
		}
	} else {
		if (!*ps->text)
			return NULL;
		const char *nl = strchr(ps->text, '\n');
		size_t len = nl ? (size_t)(nl - ps->text + 1) : strlen(ps->text);
		n = len < sizeof(buf) - 1 ? len : sizeof(buf) - 1;
		memcpy(buf, ps->text, n);
		buf[n] = '\0';
		ps->text += len;
	}
	ps->line++;
	const char *p = buf;
	while (*p == ' ' || *p == '\t')
		p++;
	if (*p == '[')
		ps->section_line = ps->line;
	if (n + 1 > (size_t)num) {
		err_add(ps->e, "%s:%d: line longer than %d characters", ps->file, ps->line, num - 3);
		snprintf(str, (size_t)num, "\n");
		return str;
	}
	memcpy(str, buf, n + 1);
	return str;
}

static const struct opt *opt_find(const char *section, const char *name, enum opt_scope scope)
{
	for (size_t i = 0; i < N_OPTS; i++)
		if (opts[i].scope == scope && strcmp(opts[i].section, section) == 0 &&
		    strcmp(opts[i].name, name) == 0)
			return &opts[i];
	return NULL;
}

static int start_tenant(struct parse_state *ps, const char *section)
{
	const char *name = section + strlen("tenant");

	ps->cur = NULL;
	while (*name == ' ' || *name == '\t')
		name++;
	if (name == section + strlen("tenant") && *name) {
		err_add(ps->e, "%s:%d: unknown section [%s]", ps->file, ps->section_line, section);
		return 0;
	}
	if (config_check_name(name) < 0) {
		err_add(ps->e, "%s:%d: [%s]: tenant name '%s' is not valid ([A-Za-z0-9_.-], 1..%d characters)",
			ps->file, ps->section_line, section, name, CONFIG_NAME_MAX - 1);
		return 0;
	}
	if (!ps->any_tenant) {
		ps->any_tenant = true;
		ps->c->n_tenants = 0; /* the file's tenants replace the embedded one */
	}
	for (uint32_t i = 0; i < ps->c->n_tenants; i++) {
		if (strcmp(ps->c->tenant[i].name, name) == 0) {
			err_add(ps->e, "%s:%d: tenant '%s' defined twice (first at line %d)",
				ps->file, ps->section_line, name, ps->c->tenant[i].line);
			return 0;
		}
	}
	if (ps->c->n_tenants >= CONFIG_MAX_TENANTS) {
		err_add(ps->e, "%s:%d: more than %d tenants", ps->file, ps->line, CONFIG_MAX_TENANTS);
		return 0;
	}
	ps->cur = &ps->c->tenant[ps->c->n_tenants++];
	tenant_defaults(ps->cur, name, 0);
	ps->cur->limit = 0; /* resolved to pool_bytes after the file when unset */
	ps->cur->line = ps->section_line;
	return 1;
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
	struct parse_state *ps = user;
	char why[256];
	const struct opt *o;

	/* A new header (even one repeating the last name) starts a section. */
	if (strcmp(section, ps->section) != 0 || ps->section_line != ps->handled_line) {
		snprintf(ps->section, sizeof(ps->section), "%s", section);
		ps->handled_line = ps->section_line;
		ps->cur = NULL;
		if (strncmp(section, "tenant", 6) == 0 && !start_tenant(ps, section))
			return 0;
	}
	if (strncmp(section, "tenant", 6) == 0) {
		if (!ps->cur)
			return 0; /* the bad header was reported once */
		o = opt_find("tenant", name, SCOPE_TENANT);
	} else if (strcmp(section, "daemon") == 0 || strcmp(section, "pool") == 0) {
		o = opt_find(section, name, SCOPE_GLOBAL);
	} else {
		err_add(ps->e, "%s:%d: unknown section [%s] (known: [daemon], [pool], [tenant NAME])",
			ps->file, ps->section_line, section);
		return 0;
	}
	if (!o) {
		err_add(ps->e, "%s:%d: unknown option '%s' in [%s]", ps->file, ps->line, name, section);
		return 0;
	}
	int idx = (int)(o - opts);
	int *where;
	if (o->scope == SCOPE_TENANT) {
		int k = idx - first_tenant_opt();
		where = &ps->cur->opt_line[k];
		ps->cur->set |= 1u << k;
	} else {
		where = &ps->c->opt_line[idx];
	}
	if (*where) {
		err_add(ps->e, "%s:%d: '%s' set twice in [%s] (first at line %d)",
			ps->file, ps->line, name, section, *where);
		return 0;
	}
	*where = ps->line;
	if (opt_parse(o, o->scope == SCOPE_TENANT ? (void *)ps->cur : (void *)ps->c, value,
		      why, sizeof(why)) < 0) {
		err_add(ps->e, "%s:%d: %s.%s: %s", ps->file, ps->line,
			o->scope == SCOPE_TENANT ? "tenant" : o->section, name, why);
		return 0;
	}
	return 1;
}

/* "file:line", or "file" for an option left at its default (line 0). */
static const char *at(char *buf, size_t n, const char *file, int line)
{
	if (line > 0)
		snprintf(buf, n, "%s:%d", file, line);
	else
		snprintf(buf, n, "%s", file);
	return buf;
}

static int validate(const struct config *c, struct errbuf *e)
{
	const char *file = c->path[0] ? c->path : "(defaults)";
	char where[CONFIG_DIR_MAX + 16];
	int n0 = e->n;
	uint64_t sum = 0, sum_pages = 0;
	int li_pool = 0, li_page = 0, li_low = 0, li_high = 0, li_spill = 0, li_guar = 0;

	for (size_t i = 0; i < N_OPTS; i++) {
		if (strcmp(opts[i].name, "pool_bytes") == 0)
			li_pool = c->opt_line[i];
		if (strcmp(opts[i].name, "page_bytes") == 0)
			li_page = c->opt_line[i];
		if (strcmp(opts[i].name, "low_watermark") == 0)
			li_low = c->opt_line[i];
		if (strcmp(opts[i].name, "high_watermark") == 0)
			li_high = c->opt_line[i];
		if (strcmp(opts[i].name, "spill_bytes") == 0)
			li_spill = c->opt_line[i];
	}
	if (c->low_watermark >= c->high_watermark)
		err_add(e, "%s: pool.low_watermark: %" PRIu32 "%% must be below pool.high_watermark (%" PRIu32 "%%)",
			at(where, sizeof(where), file, li_low ? li_low : li_high), c->low_watermark,
			c->high_watermark);
	/* the pool maps whole pages of the machine's 4 KiB granularity */
	if (c->page_bytes % 4096u)
		err_add(e, "%s:%d: pool.page_bytes: %" PRIu64 " is not a multiple of 4KiB", file, li_page, c->page_bytes);
	if (c->pool_bytes < c->page_bytes)
		err_add(e, "%s:%d: pool.pool_bytes: smaller than one page (pool.page_bytes)", file, li_pool);
	/* a spill slot is a page behind its header: a file of less holds none */
	if (c->spill_bytes && c->spill_bytes < c->page_bytes + SPILL_HDR_BYTES) {
		char b[32];
		config_format_size(c->page_bytes + SPILL_HDR_BYTES, b, sizeof(b));
		err_add(e, "%s:%d: pool.spill_bytes: holds no spill slot (0 for the default, or at least %s: "
			   "pool.page_bytes and a 4KiB header)", file, li_spill, b);
	}
	/* sun_path holds 108 bytes including the NUL */
	if (strlen(c->run_dir) + 1 + strlen(CONFIG_CONTROL_SOCK) >= sizeof(((struct sockaddr_un *)0)->sun_path))
		err_add(e, "%s:%d: daemon.run_dir: '%s' is too long for a unix socket path (at most %zu characters)",
			file, c->opt_line[0], c->run_dir,
			sizeof(((struct sockaddr_un *)0)->sun_path) - 2 - strlen(CONFIG_CONTROL_SOCK));
	if (c->control_group[0]) {
		struct group gr, *r = NULL;
		char nb[8192];
		if (getgrnam_r(c->control_group, &gr, nb, sizeof(nb), &r) != 0 || !r)
			err_add(e, "%s:%d: daemon.control_group: unknown group '%s'", file, c->opt_line[3],
				c->control_group);
	}
	if (c->operator_group[0]) {
		struct group gr, *r = NULL;
		char nb[8192];
		if (getgrnam_r(c->operator_group, &gr, nb, sizeof(nb), &r) != 0 || !r)
			err_add(e, "%s:%d: daemon.operator_group: unknown group '%s'", file, c->opt_line[4],
				c->operator_group);
	}
	if (c->n_tenants == 0)
		err_add(e, "%s: no tenants", file);
	for (uint32_t i = 0; i < c->n_tenants; i++) {
		const struct tenant_conf *t = &c->tenant[i];
		if (t->limit > c->pool_bytes) {
			char a[32], b[32];
			config_format_size(t->limit, a, sizeof(a));
			config_format_size(c->pool_bytes, b, sizeof(b));
			err_add(e, "%s: tenant '%s': limit %s is larger than pool.pool_bytes %s",
				at(where, sizeof(where), file, t->line), t->name, a, b);
		}
		if (t->guaranteed > t->limit) {
			char a[32], b[32];
			config_format_size(t->guaranteed, a, sizeof(a));
			config_format_size(t->limit, b, sizeof(b));
			err_add(e, "%s:%d: tenant '%s': guaranteed %s is larger than its limit %s",
				file, t->line, t->name, a, b);
		}
		if (!t->any_uid && t->n_uids == 0 && t->n_gids == 0)
			err_add(e, "%s:%d: tenant '%s': nobody may use it: set allow_uids and/or allow_gids "
				"(allow_uids = * allows everyone)", file, t->line, t->name);
		sum += t->guaranteed;
		sum_pages += config_pages_ceil(t->guaranteed, c->page_bytes);
		if (t->guaranteed && !li_guar)
			li_guar = t->line;
	}
	if (sum > c->pool_bytes) {
		char a[32], b[32];
		config_format_size(sum, a, sizeof(a));
		config_format_size(c->pool_bytes, b, sizeof(b));
		err_add(e, "%s: the tenants' guarantees add up to %s, more than pool.pool_bytes %s",
			at(where, sizeof(where), file, li_pool ? li_pool : li_guar), a, b);
	} else if (c->page_bytes && sum_pages > c->pool_bytes / c->page_bytes) {
		/* pages are charged whole: a guarantee of 2.5 pages is honoured
		 * as 3, and 1 GiB of 48 KiB pages is 21,845 pages, not 21,845.33 */
		char a[32], b[32], p[32];
		config_format_size(sum, a, sizeof(a));
		config_format_size(c->pool_bytes, b, sizeof(b));
		config_format_size(c->page_bytes, p, sizeof(p));
		err_add(e, "%s: the tenants' guarantees (%s) need %" PRIu64 " pages of pool.page_bytes %s, each "
			"rounded up to whole pages, and pool.pool_bytes %s holds %" PRIu64 ": make each guarantee a "
			"multiple of the page size, or leave a page or more of the pool unguaranteed",
			at(where, sizeof(where), file, li_pool ? li_pool : li_guar), a, sum_pages, p, b,
			c->pool_bytes / c->page_bytes);
	}
	return e->n > n0 ? -EINVAL : 0;
}

int config_validate(const struct config *c, char *err, size_t errlen)
{
	struct errbuf e = { err, errlen, 0, 0 };

	if (err && errlen)
		err[0] = '\0';
	return validate(c, &e);
}

static int load(struct config *c, const char *name, FILE *fp, const char *text,
		char *err, size_t errlen)
{
	struct errbuf e = { err, errlen, 0, 0 };
	struct parse_state ps = { .c = c, .file = name, .e = &e, .fp = fp, .text = text };

	if (err && errlen)
		err[0] = '\0';
	config_defaults(c);
	if (name)
		snprintf(c->path, sizeof(c->path), "%s", name);
	if (fp || text) {
		/* libinih's run-time knobs (Debian builds them as variables) */
		ini_use_stack = false;
		ini_max_line = 1024;
		ini_allow_multiline = false;
		ini_stop_on_first_error = false;
		int r = ini_parse_stream(reader, &ps, handler, &ps);
		if (r > 0 && e.n == 0)
			err_add(&e, "%s:%d: syntax error (expected '[section]', 'key = value' or a comment)",
				name, r);
		if (r < 0 && e.n == 0)
			err_add(&e, "%s: cannot parse (out of memory)", name);
		if (e.n)
			return -EINVAL;
		for (uint32_t i = 0; i < c->n_tenants; i++)
			if (c->tenant[i].limit == 0)
				c->tenant[i].limit = c->pool_bytes;
		if (!ps.any_tenant)
			c->tenant[0].limit = c->pool_bytes;
	}
	return validate(c, &e);
}

int config_load(struct config *c, const char *path, char *err, size_t errlen)
{
	FILE *fp = NULL;
	int r;

	if (!path)
		return load(c, NULL, NULL, NULL, err, errlen);
	if (strlen(path) >= CONFIG_DIR_MAX) {
		snprintf(err, errlen, "%.64s...: path too long", path);
		return -ENAMETOOLONG;
	}
	fp = fopen(path, "re");
	if (!fp) {
		r = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return r;
	}
	r = load(c, path, fp, NULL, err, errlen);
	fclose(fp);
	return r;
}

int config_load_string(struct config *c, const char *name, const char *text, char *err, size_t errlen)
{
	return load(c, name, NULL, text, err, errlen);
}

const struct tenant_conf *config_tenant(const struct config *c, const char *name)
{
	for (uint32_t i = 0; i < c->n_tenants; i++)
		if (strcmp(c->tenant[i].name, name) == 0)
			return &c->tenant[i];
	return NULL;
}

/* ---- reload -------------------------------------------------------------------- */
/* "section.name: old -> new" (tenant options: "tenant.T.name") into e. */
static void note_change(struct errbuf *e, const struct opt *o, const char *tenant, const void *from, const void *to)
{
	char a[256], b[256];

	if (!e->buf)
		return;
	opt_format(o, from, a, sizeof(a));
	opt_format(o, to, b, sizeof(b));
	if (tenant)
		err_add(e, "tenant.%s.%s: %s -> %s", tenant, o->name, a, b);
	else
		err_add(e, "%s.%s: %s -> %s", o->section, o->name, a, b);
}

int config_apply_reload(struct config *live, const struct config *next, char *notes, size_t noteslen,
			char *changes, size_t changeslen)
{
	struct errbuf e = { notes, noteslen, 0, 0 }, ch = { changes, changeslen, 0, 0 };
	const struct opt *lim = opt_find("tenant", "limit", SCOPE_TENANT);
	const uint32_t lim_bit = 1u << (int)(lim - opts - first_tenant_opt());
	int changed = 0;

	if (notes && noteslen)
		notes[0] = '\0';
	if (changes && changeslen)
		changes[0] = '\0';
	for (size_t i = 0; i < N_OPTS; i++) {
		const struct opt *o = &opts[i];
		if (o->scope != SCOPE_GLOBAL || opt_equal(o, live, next))
			continue;
		if (o->reloadable) {
			note_change(&ch, o, NULL, live, next);
			opt_copy(o, live, next);
			live->opt_line[i] = next->opt_line[i]; /* errors name the file as it is now */
			changed++;
		} else {
			err_add(&e, "%s.%s changed in the file; it takes effect after a restart",
				o->section, o->name);
		}
	}
	for (uint32_t t = 0; t < live->n_tenants; t++) {
		struct tenant_conf *lt = &live->tenant[t];
		const struct tenant_conf *found = config_tenant(next, lt->name);
		if (!found) {
			err_add(&e, "tenant '%s' is gone from the file; tenants change after a restart", lt->name);
			continue;
		}
		/* no limit in the file: the pool's size, which is the running
		 * pool's (pool_bytes takes a restart), not the file's */
		struct tenant_conf nt = *found;
		if (!(nt.set & lim_bit))
			nt.limit = live->pool_bytes;
		for (size_t i = 0; i < N_OPTS; i++) {
			const struct opt *o = &opts[i];
			if (o->scope != SCOPE_TENANT || opt_equal(o, lt, &nt))
				continue;
			note_change(&ch, o, lt->name, lt, &nt);
			opt_copy(o, lt, &nt); /* every tenant option reloads */
			changed++;
		}
		lt->line = nt.line;
		lt->set = nt.set;
		memcpy(lt->opt_line, nt.opt_line, sizeof(lt->opt_line));
	}
	for (uint32_t t = 0; t < next->n_tenants; t++)
		if (!config_tenant(live, next->tenant[t].name))
			err_add(&e, "tenant '%s' is new in the file; tenants change after a restart",
				next->tenant[t].name);
	snprintf(live->path, sizeof(live->path), "%s", next->path);
	return changed;
}

/* ---- visiting ---------------------------------------------------------------- */
int config_visit(const struct config *c, config_visit_fn fn, void *ctx)
{
	char key[CONFIG_NAME_MAX + 32], val[CONFIG_DIR_MAX + 32], def[64];
	int r;

	for (size_t i = 0; i < N_OPTS; i++) {
		const struct opt *o = &opts[i];
		if (o->scope != SCOPE_GLOBAL)
			continue;
		snprintf(key, sizeof(key), "%s.%s", o->section, o->name);
		opt_format(o, c, val, sizeof(val));
		r = fn(ctx, key, val, o->def ? o->def : o->def_text, o->reloadable, o->help);
		if (r)
			return r;
	}
	for (uint32_t t = 0; t < c->n_tenants; t++) {
		for (size_t i = 0; i < N_OPTS; i++) {
			const struct opt *o = &opts[i];
			if (o->scope != SCOPE_TENANT)
				continue;
			snprintf(key, sizeof(key), "tenant.%s.%s", c->tenant[t].name, o->name);
			opt_format(o, &c->tenant[t], val, sizeof(val));
			if (o->def)
				snprintf(def, sizeof(def), "%s", o->def);
			else
				config_format_size(c->pool_bytes, def, sizeof(def));
			r = fn(ctx, key, val, def, o->reloadable, o->help);
			if (r)
				return r;
		}
	}
	return 0;
}
