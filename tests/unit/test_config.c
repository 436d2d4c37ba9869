/* test_config: the option table — sizes, durations, bounds, file:line
 * errors, tenants, reload merging, and the shipped config/tqkvd.conf. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "config.h"
#include "tq_xform.h"
#include "../../client/ctl.h"

static struct config *cfg_new(void)
{
	struct config *c = malloc(sizeof(*c));
	if (!c)
		abort();
	return c;
}

static void test_sizes(void)
{
	static const struct { const char *s; uint64_t v; } ok[] = {
		{ "0", 0 }, { "4096", 4096 }, { "4096B", 4096 }, { "1K", 1024 }, { "1k", 1024 },
		{ "1KiB", 1024 }, { "512M", 512ull << 20 }, { "512MiB", 512ull << 20 }, { "512MB", 512ull << 20 },
		{ "1GiB", 1ull << 30 }, { "1G", 1ull << 30 }, { "3T", 3ull << 40 }, { "2P", 2ull << 50 },
		{ " 8 M ", 8ull << 20 }, { "16383P", 16383ull << 50 },
	};
	static const char *const bad[] = { "", "M", "-1", "1.5G", "1X", "1GiBs", "1 G B", "0x10", "1e9", "1iB" };
	uint64_t v, w;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		if (config_parse_size(ok[i].s, &v) != 0)
			T_FAIL("'%s' should parse", ok[i].s);
		T_EQ(v, ok[i].v);
		/* tqctl's parser follows the same grammar */
		T_EQ(ctl_parse_size(ok[i].s, &w), 0);
		T_EQ(w, ok[i].v);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (config_parse_size(bad[i], &v) == 0)
			T_FAIL("'%s' should not parse", bad[i]);
		if (ctl_parse_size(bad[i], &w) == 0)
			T_FAIL("tqctl: '%s' should not parse", bad[i]);
	}
	T_EQ(config_parse_size("16384P", &v), -ERANGE);
	T_EQ(config_parse_size("99999999999999999999", &v), -ERANGE);
	T_EQ(ctl_parse_size("16384P", &v), -ERANGE);
}

static void test_size_format(void)
{
	char b[32];
	uint64_t v;

	config_format_size(1ull << 30, b, sizeof(b));
	T_ASSERT(strcmp(b, "1GiB") == 0);
	config_format_size(1536ull << 20, b, sizeof(b));
	T_ASSERT(strcmp(b, "1536MiB") == 0);
	config_format_size(1000, b, sizeof(b));
	T_ASSERT(strcmp(b, "1000") == 0);
	config_format_size(0, b, sizeof(b));
	T_ASSERT(strcmp(b, "0") == 0);
	/* round trip for a spread of values */
	for (uint64_t x = 1; x < (1ull << 60); x = x * 3 + 7) {
		config_format_size(x, b, sizeof(b));
		T_EQ(config_parse_size(b, &v), 0);
		T_EQ(v, x);
	}
	config_format_size_human(1536ull << 20, b, sizeof(b));
	T_ASSERT(strcmp(b, "1.50 GiB") == 0);
	ctl_format_size(512, b, sizeof(b));
	T_ASSERT(strcmp(b, "512 B") == 0);
}

static void test_durations(void)
{
	uint64_t v;
	char b[32];

	T_EQ(config_parse_duration_ms("0", &v), 0);
	T_EQ(v, 0);
	T_EQ(config_parse_duration_ms("30", &v), 0);
	T_EQ(v, 30000);
	T_EQ(config_parse_duration_ms("500ms", &v), 0);
	T_EQ(v, 500);
	T_EQ(config_parse_duration_ms("10m", &v), 0);
	T_EQ(v, 600000);
	T_EQ(config_parse_duration_ms("2h", &v), 0);
	T_EQ(v, 7200000);
	T_EQ(config_parse_duration_ms("1d", &v), 0);
	T_EQ(v, 86400000);
	/* a space before the unit, or after it, as sizes take "16 G" */
	T_EQ(config_parse_duration_ms("2 s", &v), 0);
	T_EQ(v, 2000);
	T_EQ(config_parse_duration_ms("500ms ", &v), 0);
	T_EQ(v, 500);
	T_EQ(config_parse_duration_ms(" 3 ms", &v), 0);
	T_EQ(v, 3);
	T_ASSERT(config_parse_duration_ms("2 s s", &v) < 0);
	T_ASSERT(config_parse_duration_ms("5 m s", &v) < 0);
	T_ASSERT(config_parse_duration_ms("1w", &v) < 0);
	T_ASSERT(config_parse_duration_ms("m", &v) < 0);
	T_ASSERT(config_parse_duration_ms("-1s", &v) < 0);
	config_format_duration_ms(90000, b, sizeof(b));
	T_ASSERT(strcmp(b, "90s") == 0);
	config_format_duration_ms(7200000, b, sizeof(b));
	T_ASSERT(strcmp(b, "2h") == 0);
	config_format_duration_ms(1500, b, sizeof(b));
	T_ASSERT(strcmp(b, "1500ms") == 0);
}

static void test_defaults(void)
{
	struct config *c = cfg_new();
	char err[CONFIG_ERR_MAX];

	T_EQ(config_load(c, NULL, err, sizeof(err)), 0);
	T_ASSERT(strcmp(c->run_dir, "build/run") == 0);
	T_ASSERT(strcmp(c->spill_dir, "build/spill") == 0);
	T_EQ(c->pool_bytes, 1ull << 30);
	T_EQ(c->n_tenants, 1);
	T_ASSERT(strcmp(c->tenant[0].name, "default") == 0);
	T_EQ(c->tenant[0].limit, 1ull << 30);
	T_ASSERT(c->tenant[0].any_uid);
	T_EQ(c->max_sessions, 1024);
	T_EQ(c->high_watermark, 90);
	T_EQ(c->low_watermark, 80);
	T_EQ(c->admission_wait_ms, 2000);
	T_EQ(c->pressure_action, CONFIG_PRESSURE_FAIL);
	T_EQ(config_load_string(c, "t.conf", "[pool]\npressure_action = evict\n", err, sizeof(err)), 0);
	T_EQ(c->pressure_action, CONFIG_PRESSURE_EVICT);
	free(c);
}

/* Load text that must fail; err must contain every `want` string. */
static int load_fails(const char *text, const char *want1, const char *want2)
{
	struct config *c = cfg_new();
	char err[CONFIG_ERR_MAX];
	int r = config_load_string(c, "t.conf", text, err, sizeof(err));

	free(c);
	if (r == 0) {
		fprintf(stderr, "  loaded but should fail:\n%s\n", text);
		return 0;
	}
	if ((want1 && !strstr(err, want1)) || (want2 && !strstr(err, want2))) {
		fprintf(stderr, "  error text '%s' lacks '%s' / '%s'\n", err, want1 ? want1 : "",
			want2 ? want2 : "");
		return 0;
	}
	return 1;
}

static void test_errors_name_file_and_line(void)
{
	T_ASSERT(load_fails("[pool]\npool_bytes = 1XB\n", "t.conf:2:", "pool.pool_bytes"));
	T_ASSERT(load_fails("[pool]\n\n\npool_bytes = 1M\n", "t.conf:4:", "out of range"));
	T_ASSERT(load_fails("[pool]\npool_bytes = 2P\n", "t.conf:2:", "out of range"));
	T_ASSERT(load_fails("[daemon]\nmax_sessions = 0\n", "t.conf:2:", "[1, 65536]"));
	T_ASSERT(load_fails("[daemon]\nmax_sessions = 65537\n", "t.conf:2:", NULL));
	T_ASSERT(load_fails("[daemon]\nmax_sessions = ten\n", "t.conf:2:", "not an integer"));
	T_ASSERT(load_fails("[daemon]\ncontrol_tcp_port = 70000\n", "t.conf:2:", NULL));
	T_ASSERT(load_fails("[daemon]\nlog_level = loud\n", "t.conf:2:", "not a log level"));
	T_ASSERT(load_fails("[daemon]\nsession_idle_ttl = 31d\n", "t.conf:2:", "out of range"));
	T_ASSERT(load_fails("# comment\n[daemon]\nbogus = 1\n", "t.conf:3:", "unknown option 'bogus'"));
	T_ASSERT(load_fails("[nope]\nx = 1\n", "t.conf:1:", "unknown section [nope]"));
	T_ASSERT(load_fails("[daemon]\nlog_level = info\nlog_level = debug\n", "t.conf:3:", "first at line 2"));
	T_ASSERT(load_fails("[pool]\n\npage_bytes = 5000\n", "t.conf:3:", "not a multiple of 4KiB"));
	T_ASSERT(load_fails("[pool]\npool_bytes = 16M\npage_bytes = 32M\n", "t.conf:2:", "smaller than one page"));
	/* a spill file must hold one slot: a page behind its 4 KiB header */
	T_ASSERT(load_fails("[pool]\n\nspill_bytes = 64KiB\n", "t.conf:3:", "at least 68KiB"));
	T_ASSERT(load_fails("[pool]\npage_bytes = 1M\nspill_bytes = 1M\n", "t.conf:3:", "holds no spill slot"));
	T_ASSERT(load_fails("[daemon\n", "t.conf:1:", "syntax"));
	T_ASSERT(load_fails("[daemon]\njust words\n", "t.conf:2:", "syntax"));
	T_ASSERT(load_fails("[daemon]\nrun_dir = /a/very/long/path/that/will/never/fit/into/a/unix/socket/address/because/"
			    "sun_path/is/only/one/hundred/and/eight/bytes\n", "run_dir", "too long"));
	/* memory pressure: the action is one of a list, the marks are ordered */
	T_ASSERT(load_fails("[pool]\npressure_action = drop\n", "t.conf:2:", "not one of: fail, evict"));
	T_ASSERT(load_fails("[pool]\nhigh_watermark = 101\n", "t.conf:2:", "[1, 100]"));
	T_ASSERT(load_fails("[pool]\nhigh_watermark = 70\n\nlow_watermark = 70\n", "t.conf:4:",
			    "must be below pool.high_watermark"));
	/* several errors: all reported */
	T_ASSERT(load_fails("[daemon]\nmax_sessions = 0\n[pool]\npool_bytes = x\n", "t.conf:2:", "t.conf:4:"));
	/* a long line is an error, not a silent split */
	char *big = malloc(3000);
	if (!big)
		T_FAIL("malloc");
	snprintf(big, 3000, "[daemon]\nrun_dir = %02900d\n", 0);
	int ok = load_fails(big, "t.conf:2:", "line longer");
	free(big);
	T_ASSERT(ok);
}

/* daemon.kv_transform: tq_xf_mode_parse's syntax, shown as tq_xf_mode_str
 * writes it; reloads. */
static int kv_transform_value(void *ctx, const char *key, const char *value, const char *def, bool reloadable,
			      const char *help)
{
	if (strcmp(key, "daemon.kv_transform") != 0)
		return 0;
	snprintf(ctx, 64, "%s|%s|%d", value, def, reloadable);
	return 1;
}

static void test_kv_transform(void)
{
	static const struct { const char *s; uint32_t mode; const char *shown; } ok[] = {
		{ "default", TQ_XF_DEFAULT, "k-center+v-eq+k-eq-qk+k-unshrink+k-order" },
		{ "k-unshrink", TQ_XF_K_UNSHRINK, "k-unshrink" },
		{ "none", 0, "none" },
		{ "k-center", TQ_XF_K_CENTER, "k-center" },
		{ "k-center,v-center", TQ_XF_K_CENTER | TQ_XF_V_CENTER, "k-center+v-center" },
		{ "k-eq-k + k-center", TQ_XF_K_CENTER | TQ_XF_K_EQ_K, "k-center+k-eq-k" },
	};
	struct config *c = cfg_new(), *next = cfg_new();
	char err[CONFIG_ERR_MAX], text[128], got[64] = "", notes[CONFIG_ERR_MAX];

	T_EQ(config_load(c, NULL, err, sizeof(err)), 0);
	T_EQ(c->kv_transform, TQ_XF_DEFAULT);
	T_EQ(config_visit(c, kv_transform_value, got), 1);
	T_ASSERT(strcmp(got, "k-center+v-eq+k-eq-qk+k-unshrink+k-order|default|1") == 0);
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		snprintf(text, sizeof(text), "[daemon]\nkv_transform = %s\n", ok[i].s);
		T_EQ(config_load_string(c, "t.conf", text, err, sizeof(err)), 0);
		T_EQ(c->kv_transform, ok[i].mode);
		T_EQ(config_visit(c, kv_transform_value, got), 1);
		T_ASSERT(strncmp(got, ok[i].shown, strlen(ok[i].shown)) == 0 && got[strlen(ok[i].shown)] == '|');
	}
	T_ASSERT(load_fails("[daemon]\nkv_transform = k-center+k-eq-qk+k-eq-k\n", "t.conf:2: daemon.kv_transform:",
			    "not a transform mode"));
	T_ASSERT(load_fails("[daemon]\n\nkv_transform = center\n", "t.conf:3: daemon.kv_transform: 'center'",
			    "k-center, k-sink, v-center, v-eq, k-eq-qk, k-eq-k, k-unshrink"));
	T_ASSERT(load_fails("[pool]\nkv_transform = none\n", "t.conf:2:", "unknown option 'kv_transform' in [pool]"));
	/* a reload applies it (to the sessions opened after) */
	T_EQ(config_load_string(c, "t.conf", "[daemon]\nkv_transform = default\n", err, sizeof(err)), 0);
	T_EQ(config_load_string(next, "t.conf", "[daemon]\nkv_transform = none\n", err, sizeof(err)), 0);
	T_EQ(config_apply_reload(c, next, notes, sizeof(notes), NULL, 0), 1);
	T_EQ(c->kv_transform, 0);
	T_ASSERT(notes[0] == '\0');
	free(c);
	free(next);
}

static void test_tenants(void)
{
	struct config *c = cfg_new();
	char err[CONFIG_ERR_MAX];
	const char *text =
		"[pool]\npool_bytes = 8GiB\n"
		"[tenant prod]\nguaranteed = 4G\nlimit = 6G\npriority = 90\nallow_uids = root, 4242\n"
		"[tenant test]\npriority = 10\nallow_gids = 0, 77\nsparse_v = 1e-3\n";

	T_EQ(config_load_string(c, "t.conf", text, err, sizeof(err)), 0);
	T_EQ(c->n_tenants, 2); /* the embedded default is replaced */
	const struct tenant_conf *p = config_tenant(c, "prod"), *t = config_tenant(c, "test");
	T_ASSERT(p && t && !config_tenant(c, "default"));
	T_EQ(p->guaranteed, 4ull << 30);
	T_EQ(p->limit, 6ull << 30);
	T_EQ(p->priority, 90);
	T_EQ(p->n_uids, 2);
	T_EQ(p->uids[0], 0);
	T_EQ(p->uids[1], 4242);
	T_ASSERT(!p->any_uid);
	T_EQ(t->limit, 8ull << 30); /* default: pool_bytes */
	T_EQ(t->n_gids, 2);
	T_EQ(t->gids[1], 77);
	T_ASSERT(p->sparse_v == 0.0f && t->sparse_v == 1e-3f);
	T_EQ(p->line, 3);
	free(c);

	T_ASSERT(load_fails("[tenant a]\nlimit = 2G\nallow_uids = *\n", "t.conf:1:", "larger than pool.pool_bytes"));
	T_ASSERT(load_fails("[tenant a]\nguaranteed = 512M\nlimit = 256M\nallow_uids = *\n", "t.conf:1:",
			    "larger than its limit"));
	T_ASSERT(load_fails("[tenant a]\nguaranteed = 600M\nallow_uids = *\n[tenant b]\nguaranteed = 600M\nallow_uids = *\n",
			    "guarantees add up to", NULL));
	T_ASSERT(load_fails("[tenant a]\npriority = 5\n", "t.conf:1:", "nobody may use it"));
	T_ASSERT(load_fails("[tenant a]\nallow_uids = *\n[tenant a]\nallow_uids = *\n", "t.conf:3:", "first at line 1"));
	T_ASSERT(load_fails("[tenant bad/name]\nallow_uids = *\n", "t.conf:1:", "not valid"));
	T_ASSERT(load_fails("[tenant]\nallow_uids = *\n", "t.conf:1:", "not valid"));
	T_ASSERT(load_fails("[tenant a]\nallow_uids = no-such-user-xyz\n", "t.conf:2:", "unknown user"));
	T_ASSERT(load_fails("[tenant a]\nallow_gids = *\n", "t.conf:2:", "only valid in allow_uids"));
	T_ASSERT(load_fails("[tenant a]\nallow_uids = *\npriority = 101\n", "t.conf:3:", "[0, 100]"));
	T_ASSERT(load_fails("[tenant a]\nallow_uids = *\nwho = me\n", "t.conf:3:", "unknown option 'who'"));
	T_ASSERT(load_fails("[tenant a]\nallow_uids = *\nsparse_v = 0.2\n", "t.conf:3:", "[0, 0.1]"));
	T_ASSERT(load_fails("[tenant a]\nallow_uids = *\nsparse_v = -1e-9\n", "t.conf:3:", "out of range"));
	T_ASSERT(load_fails("[tenant a]\nallow_uids = *\nsparse_v = nan\n", "t.conf:3:", "not a number"));
	T_ASSERT(load_fails("[tenant a]\nallow_uids = *\nsparse_v = 1%\n", "t.conf:3:", "not a number"));
}

struct visit_ctx {
	struct config *other;
	int n, mismatches;
	char keys[64][96];
};

static int collect(void *ctx, const char *key, const char *value, const char *def, bool reloadable,
		   const char *help)
{
	struct visit_ctx *v = ctx;

	if (v->n < 64)
		snprintf(v->keys[v->n++], sizeof(v->keys[0]), "%s=%s", key, value);
	return 0;
}

/* The shipped file lists every option with its default value. */
static void test_shipped_file_is_the_defaults(void)
{
	struct config *file = cfg_new(), *def = cfg_new();
	struct visit_ctx a = { 0 }, b = { 0 };
	char err[CONFIG_ERR_MAX], path[4096];
	const char *src = getenv("TQ_SRC");

	snprintf(path, sizeof(path), "%s/config/tqkvd.conf", src ? src : ".");
	T_EQ(config_load(file, path, err, sizeof(err)), 0);
	T_EQ(config_load(def, NULL, err, sizeof(err)), 0);
	config_visit(file, collect, &a);
	config_visit(def, collect, &b);
	T_EQ(a.n, b.n);
	for (int i = 0; i < a.n; i++)
		if (strcmp(a.keys[i], b.keys[i]) != 0)
			T_FAIL("%s differs from the embedded default %s", a.keys[i], b.keys[i]);
	/* every option is set explicitly in the file (none left to defaults) */
	FILE *f = fopen(path, "r");
	T_ASSERT(f);
	char line[1100], text[65536] = "";
	size_t used = 0;
	while (fgets(line, sizeof(line), f))
		if (line[0] != '#' && used + strlen(line) < sizeof(text))
			used += (size_t)snprintf(text + used, sizeof(text) - used, "%s", line);
	fclose(f);
	for (int i = 0; i < a.n; i++) {
		char key[96];
		const char *dot = strrchr(a.keys[i], '.');
		snprintf(key, sizeof(key), "\n%.*s =", (int)(strchr(dot, '=') - dot - 1), dot + 1);
		if (!strstr(text, key))
			T_FAIL("config/tqkvd.conf does not set %s", a.keys[i]);
	}
	free(file);
	free(def);
}

static void test_reload_merge(void)
{
	struct config *live = cfg_new(), *next = cfg_new();
	char err[CONFIG_ERR_MAX], notes[CONFIG_ERR_MAX];
	const char *t1 = "[daemon]\nlog_level = info\n[pool]\npool_bytes = 2G\n"
			 "[tenant a]\nlimit = 1G\nallow_uids = *\n";
	const char *t2 = "[daemon]\nlog_level = debug\nmax_sessions = 5\n[pool]\npool_bytes = 4G\n"
			 "[tenant a]\nlimit = 512M\nguaranteed = 256M\nallow_uids = *\nsparse_v = 0.005\n"
			 "[tenant b]\nallow_uids = *\n";

	T_EQ(config_load_string(live, "a.conf", t1, err, sizeof(err)), 0);
	T_EQ(config_load_string(next, "a.conf", t2, err, sizeof(err)), 0);
	char changes[CONFIG_ERR_MAX];
	int n = config_apply_reload(live, next, notes, sizeof(notes), changes, sizeof(changes));
	T_EQ(n, 5); /* log_level, max_sessions, a.limit, a.guaranteed, a.sparse_v */
	/* each change named, with both values, for the log */
	T_ASSERT(strstr(changes, "daemon.log_level: info -> debug\n"));
	T_ASSERT(strstr(changes, "tenant.a.limit: 1GiB -> 512MiB\n"));
	T_ASSERT(!strstr(changes, "pool_bytes"));
	T_EQ(live->log_level, 7);
	T_EQ(live->max_sessions, 5);
	T_EQ(live->pool_bytes, 2ull << 30); /* does not reload */
	T_EQ(live->n_tenants, 1);
	T_EQ(config_tenant(live, "a")->limit, 512ull << 20);
	T_EQ(config_tenant(live, "a")->guaranteed, 256ull << 20);
	T_ASSERT(config_tenant(live, "a")->sparse_v == 0.005f);
	T_ASSERT(strstr(notes, "pool.pool_bytes changed"));
	T_ASSERT(strstr(notes, "tenant 'b' is new"));
	T_EQ(config_validate(live, err, sizeof(err)), 0);

	/* A tenant without a limit in the file is limited by the pool, and the
	 * pool keeps its size until a restart: a pool_bytes staged in the file
	 * neither lowers such a limit at once nor makes every reload fail
	 * ("limit larger than the pool") until the restart.  With tenants and
	 * with the embedded default tenant. */
	static const char *const unlimited[2][3] = {
		{ "[pool]\npool_bytes = 2G\n[tenant a]\nguaranteed = 1G\nallow_uids = *\n",
		  "[pool]\npool_bytes = 4G\n[tenant a]\nguaranteed = 1G\nallow_uids = *\n",
		  "[pool]\npool_bytes = 1G\n[tenant a]\nguaranteed = 512M\nallow_uids = *\n" },
		{ "[pool]\npool_bytes = 2G\n", "[daemon]\nlog_level = debug\n[pool]\npool_bytes = 4G\n",
		  "[pool]\npool_bytes = 1G\n" },
	};
	for (int k = 0; k < 2; k++) {
		const char *tn = k ? "default" : "a";
		T_EQ(config_load_string(live, "u.conf", unlimited[k][0], err, sizeof(err)), 0);
		for (int step = 1; step < 3; step++) {
			T_EQ(config_load_string(next, "u.conf", unlimited[k][step], err, sizeof(err)), 0);
			config_apply_reload(live, next, notes, sizeof(notes), changes, sizeof(changes));
			T_EQ(live->pool_bytes, 2ull << 30);
			T_EQ(config_tenant(live, tn)->limit, 2ull << 30);
			T_ASSERT(strstr(notes, "pool.pool_bytes changed in the file; it takes effect after a restart"));
			T_ASSERT(!strstr(changes, ".limit"));
			if (config_validate(live, err, sizeof(err)) != 0)
				T_FAIL("case %d step %d: %s", k, step, err);
		}
		if (k == 1)
			T_EQ(live->log_level, 6); /* the second file's debug, back to info: applied */
	}
	/* a limit the file sets still reloads */
	T_EQ(config_load_string(next, "u.conf", "[pool]\npool_bytes = 2G\n[tenant default]\nlimit = 1G\n"
				"allow_uids = *\n", err, sizeof(err)), 0);
	T_EQ(config_apply_reload(live, next, notes, sizeof(notes), changes, sizeof(changes)), 1);
	T_EQ(config_tenant(live, "default")->limit, 1ull << 30);
	free(live);
	free(next);
}

/* A cross-option error about an option left at its default names the
 * file (and the line of one that was set), never "file:0". */
static void test_error_lines(void)
{
	T_ASSERT(load_fails("[pool]\nhigh_watermark = 50\n", "t.conf:2: pool.low_watermark: 80%", "below"));
	T_ASSERT(load_fails("[pool]\npage_bytes = 64K\n[tenant a]\nguaranteed = 1P\nlimit = 1P\nallow_uids = *\n",
			    "t.conf:3: tenant 'a': limit", "larger than pool.pool_bytes"));
	T_ASSERT(load_fails("[tenant a]\nguaranteed = 700G\nlimit = 900G\nallow_uids = *\n"
			    "[tenant b]\nguaranteed = 700G\nlimit = 900G\nallow_uids = *\n"
			    "[pool]\npool_bytes = 1T\n",
			    "t.conf:10: the tenants' guarantees add up to", "more than pool.pool_bytes"));
	/* pool_bytes left at its 1 GiB: the first tenant that guarantees */
	T_ASSERT(load_fails("[daemon]\nlog_level = info\n[tenant a]\nallow_uids = *\n[tenant b]\nguaranteed = 600M\n"
			    "allow_uids = *\n[tenant c]\nguaranteed = 600M\nallow_uids = *\n",
			    "t.conf:5: the tenants' guarantees add up to 1200MiB", "more than pool.pool_bytes 1GiB"));
	/* pages are charged whole: 1 GiB of 48 KiB pages is 21,845 pages, and
	 * guarantees of 768 MiB and 256 MiB need 16,384 + 5,462 (the second
	 * is 5,461.33 pages): fitting in bytes is not enough */
	T_ASSERT(load_fails("[pool]\npage_bytes = 48K\n[tenant prod]\nguaranteed = 768M\nallow_uids = *\n"
			    "[tenant test]\nguaranteed = 256M\nallow_uids = *\n",
			    "need 21846 pages of pool.page_bytes 48KiB", "pool.pool_bytes 1GiB holds 21845"));
	struct config *c = cfg_new();
	char err[CONFIG_ERR_MAX];
	T_EQ(config_load_string(c, "t.conf", "[pool]\npage_bytes = 48K\n[tenant prod]\nguaranteed = 768M\n"
				"allow_uids = *\n[tenant test]\nguaranteed = 255M\nallow_uids = *\n", err, sizeof(err)), 0);
	free(c);
	T_EQ(config_pages_ceil(96 << 10, 48 << 10), 2);
	T_EQ(config_pages_ceil((96 << 10) + 1, 48 << 10), 3);
	T_EQ(config_pages_ceil(0, 48 << 10), 0);
}

static void test_names(void)
{
	T_EQ(config_check_name("prod-1.a_b"), 0);
	T_ASSERT(config_check_name("") < 0);
	T_ASSERT(config_check_name("a b") < 0);
	T_ASSERT(config_check_name("a/b") < 0);
	T_ASSERT(config_check_name("\xc3\xa9") < 0);
	char long_name[80];
	memset(long_name, 'a', sizeof(long_name) - 1);
	long_name[79] = '\0';
	T_ASSERT(config_check_name(long_name) < 0);
	long_name[63] = '\0';
	T_EQ(config_check_name(long_name), 0);
}

int main(void)
{
	T_RUN(test_sizes);
	T_RUN(test_size_format);
	T_RUN(test_durations);
	T_RUN(test_defaults);
	T_RUN(test_errors_name_file_and_line);
	T_RUN(test_kv_transform);
	T_RUN(test_tenants);
	T_RUN(test_shipped_file_is_the_defaults);
	T_RUN(test_reload_merge);
	T_RUN(test_error_lines);
	T_RUN(test_names);
	return t_done();
}
