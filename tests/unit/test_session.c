/* test_session: tenant accounting and the session table, including the
 * races the data path will create (evict/close during an operation). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "config.h"
#include "idstore.h"
#include "session.h"
#include "tenant.h"

#define MiB (1ull << 20)

static struct config *two_tenants(void)
{
	struct config *c = malloc(sizeof(*c));
	char err[CONFIG_ERR_MAX];
	const char *text = "[pool]\npool_bytes = 64M\n"
			   "[tenant a]\nlimit = 16M\nguaranteed = 8M\nallow_uids = 1000\nallow_gids = 50\n"
			   "[tenant b]\nlimit = 32M\nallow_uids = *\n";
	if (!c || config_load_string(c, "t.conf", text, err, sizeof(err)) != 0)
		abort();
	return c;
}

static const struct session_geom g_small = {
	.n_layers = 2, .n_kv_heads = 2, .n_q_heads = 4, .head_dim = 128,
	.k_codec = TQ_CODEC_Q8, .v_codec = TQ_CODEC_TQ4, .max_tokens = 64,
};

static void test_tenant_charge(void)
{
	struct config *c = two_tenants();
	struct tenant_table *tt;

	T_EQ(tenant_table_new(&tt, c), 0);
	struct tenant *a = tenant_find(tt, "a");
	T_ASSERT(a && tenant_find(tt, "b") && !tenant_find(tt, "zz"));
	T_EQ(tenant_charge(a, 10 * MiB), 0);
	T_EQ(tenant_charge(a, 6 * MiB), 0);
	T_EQ(tenant_used(a), 16 * MiB);
	T_EQ(tenant_charge(a, 1), -ENOSPC);           /* limit enforced */
	T_EQ(tenant_used(a), 16 * MiB);               /* nothing charged on failure */
	T_EQ(tenant_charge(a, UINT64_MAX), -ENOSPC);  /* no overflow */
	tenant_uncharge(a, 6 * MiB);
	T_EQ(tenant_charge(a, 6 * MiB), 0);
	T_EQ(tenant_table_used(tt), 16 * MiB);
	tenant_uncharge(a, 16 * MiB);
	T_EQ(tenant_used(a), 0);
	tenant_table_free(tt);
	free(c);
}

static void test_tenant_budget(void)
{
	struct config *c = two_tenants();
	struct tenant_table *tt;
	struct tenant_info ti;

	T_EQ(tenant_table_new(&tt, c), 0);
	struct tenant *a = tenant_find(tt, "a"), *b = tenant_find(tt, "b");
	T_EQ(tenant_set_budget(tt, a, true, 24 * MiB, false, 0, NULL, 0), 0);
	tenant_get_info(a, &ti);
	T_EQ(ti.limit, 24 * MiB);
	T_EQ(ti.guaranteed, 8 * MiB);
	T_EQ(tenant_set_budget(tt, a, true, 128 * MiB, false, 0, NULL, 0), -EINVAL);   /* > pool */
	T_EQ(tenant_set_budget(tt, a, false, 0, true, 25 * MiB, NULL, 0), -EINVAL);    /* > limit */
	T_EQ(tenant_set_budget(tt, a, true, 1000, false, 0, NULL, 0), -EINVAL);        /* < 1 MiB */
	T_EQ(tenant_set_budget(tt, b, false, 0, true, 32 * MiB, NULL, 0), 0);
	/* a 8 + b 32 = 40 of 64; a cannot take 40 more */
	T_EQ(tenant_set_budget(tt, a, true, 64 * MiB, true, 40 * MiB, NULL, 0), -ENOSPC);
	T_EQ(tenant_set_budget(tt, a, true, 64 * MiB, true, 32 * MiB, NULL, 0), 0);
	/* lowering the limit under the use: accepted, new charges fail */
	T_EQ(tenant_charge(b, 20 * MiB), 0);
	T_EQ(tenant_set_budget(tt, b, true, 10 * MiB, true, 0, NULL, 0), 0);
	T_EQ(tenant_charge(b, 1), -ENOSPC);
	tenant_uncharge(b, 20 * MiB);
	/* a reload restores the file's budgets */
	tenant_table_apply(tt, c);
	tenant_get_info(a, &ti);
	T_EQ(ti.limit, 16 * MiB);
	T_EQ(ti.guaranteed, 8 * MiB);
	tenant_table_free(tt);
	/* pages of 48 KiB: the 64 MiB pool holds 1,365, a's 8 MiB needs 171
	 * (170.67): b's 56 MiB fits in bytes but needs 1,195 pages */
	char why[256];
	c->page_bytes = 48 << 10;
	T_EQ(tenant_table_new(&tt, c), 0);
	b = tenant_find(tt, "b");
	T_EQ(tenant_set_budget(tt, b, true, 56 * MiB, true, 56 * MiB, why, sizeof(why)), -ENOSPC);
	T_ASSERT(strstr(why, "need 1366 pages of 48.0 KiB") && strstr(why, "holds 1365"));
	T_EQ(tenant_set_budget(tt, b, true, 56 * MiB, true, 55 * MiB, why, sizeof(why)), 0);
	tenant_table_free(tt);
	free(c);
}

static void test_tenant_allows(void)
{
	struct config *c = two_tenants();
	struct tenant_table *tt;
	gid_t groups[] = { 7, 50 };

	T_EQ(tenant_table_new(&tt, c), 0);
	struct tenant *a = tenant_find(tt, "a"), *b = tenant_find(tt, "b");
	T_EQ(tenant_allows(a, 1000, 1000, NULL, 0), 1);
	T_EQ(tenant_allows(a, 1001, 1001, NULL, 0), 0);
	T_EQ(tenant_allows(a, 1001, 50, NULL, 0), 1);        /* primary group */
	T_EQ(tenant_allows(a, 1001, 1001, groups, 2), 1);    /* supplementary */
	T_EQ(tenant_allows(a, 1001, 1001, groups, 1), 0);
	T_EQ(tenant_allows(b, 4242, 4242, NULL, 0), 1);      /* * */
	tenant_table_free(tt);
	free(c);
}

static void test_geometry(void)
{
	struct session_geom g = g_small;
	char why[256];
	uint64_t bpt;

	T_EQ(session_geom_check(&g, &bpt, why, sizeof(why)), 0);
	/* n_layers * n_kv_heads * (q8 132 + tq4 68) at d = 128 */
	T_EQ(bpt, 2 * 2 * (132 + 68));
	g = g_small; g.head_dim = 100;
	T_EQ(session_geom_check(&g, &bpt, why, sizeof(why)), -EINVAL);
	T_ASSERT(strstr(why, "head_dim"));
	g = g_small; g.head_dim = 1024;
	T_EQ(session_geom_check(&g, &bpt, why, sizeof(why)), -EINVAL);
	g = g_small; g.n_q_heads = 3;
	T_EQ(session_geom_check(&g, &bpt, why, sizeof(why)), -EINVAL);
	T_ASSERT(strstr(why, "multiple"));
	g = g_small; g.n_layers = 0;
	T_EQ(session_geom_check(&g, &bpt, why, sizeof(why)), -EINVAL);
	g = g_small; g.n_kv_heads = 5000;
	T_EQ(session_geom_check(&g, &bpt, why, sizeof(why)), -EINVAL);
	g = g_small; g.max_tokens = 0;
	T_EQ(session_geom_check(&g, &bpt, why, sizeof(why)), -EINVAL);
	g = g_small; g.k_codec = (enum tq_codec_id)99;
	T_EQ(session_geom_check(&g, &bpt, why, sizeof(why)), -EINVAL);
	T_ASSERT(strstr(why, "K codec"));
	g = g_small; g.v_codec = TQ_CODEC_TQ3; g.head_dim = 64;
	T_EQ(session_geom_check(&g, &bpt, why, sizeof(why)), 0);
	T_EQ(bpt, 2 * 2 * ((4 + 64) + (4 + 64 * 3 / 8)));
}

static void test_open_and_names(void)
{
	struct config *c = two_tenants();
	struct tenant_table *tt;
	struct session_table *st;
	struct session_info si, si2;
	struct session_geom g = g_small;
	char why[256];

	T_EQ(tenant_table_new(&tt, c), 0);
	T_EQ(session_table_new(&st, 3, NULL, NULL), 0);
	struct tenant *a = tenant_find(tt, "a"), *b = tenant_find(tt, "b");
	T_EQ(session_open(st, a, "x", 1000, &g, 42, 0, 1000, &si, why, sizeof(why)), 0);
	T_EQ(si.id, 1);
	T_EQ(si.state, SESSION_OPEN);
	T_EQ(si.seed, 42);
	T_EQ(si.owner_uid, 1000);
	T_ASSERT(strcmp(si.tenant, "a") == 0);
	T_EQ(session_open(st, a, "x", 1000, &g, 1, 0, 1000, &si2, why, sizeof(why)), -EEXIST);
	T_EQ(session_open(st, b, "x", 1000, &g, 1, 0, 1000, &si2, why, sizeof(why)), 0); /* other tenant */
	T_EQ(session_open(st, a, "bad name", 1000, &g, 1, 0, 1000, &si2, why, sizeof(why)), -EINVAL);
	/* footprint beyond the tenant's limit (16 MiB): 800 B/token */
	g.max_tokens = 16 * MiB / 800 + 1;
	T_EQ(session_open(st, a, "", 1000, &g, 1, 0, 1000, &si2, why, sizeof(why)), -ENOSPC);
	T_ASSERT(strstr(why, "tenant 'a'"));
	g.max_tokens = 16 * MiB / 800;
	T_EQ(session_open(st, a, "", 1000, &g, 1, 0, 1000, &si2, why, sizeof(why)), 0);
	T_EQ(session_open(st, a, "", 1000, &g, 1, 0, 1000, &si2, why, sizeof(why)), -EUSERS); /* max 3 */
	struct tenant_info ti;
	tenant_get_info(a, &ti);
	T_EQ(ti.sessions, 2);
	/* list, filtered */
	struct session_info *v;
	size_t n;
	T_EQ(session_list(st, a, &v, &n), 0);
	T_EQ(n, 2);
	T_ASSERT(v[0].id < v[1].id);
	free(v);
	T_EQ(session_list(st, NULL, &v, &n), 0);
	T_EQ(n, 3);
	free(v);
	/* closing frees the name and a slot */
	T_EQ(session_close(st, si.id, NULL), 0);
	T_EQ(session_close(st, si.id, NULL), -ENOENT);
	T_EQ(session_get_info(st, si.id, &si2), -ENOENT);
	g = g_small;
	T_EQ(session_open(st, a, "x", 1000, &g, 1, 0, 1000, &si2, why, sizeof(why)), 0);
	T_ASSERT(si2.id > si.id); /* ids are not reused */
	struct session_stats ss;
	session_table_stats(st, &ss);
	T_EQ(ss.open, 3);
	T_EQ(ss.opened_total, 4);
	T_EQ(ss.closed_total, 1);
	session_table_free(st);
	tenant_get_info(a, &ti);
	T_EQ(ti.sessions, 0);
	tenant_table_free(tt);
	free(c);
}

static int released_count;
static void on_release(void *ctx, struct session *s)
{
	__atomic_add_fetch(&released_count, 1, __ATOMIC_RELAXED);
	/* the hook still sees what the session holds */
	T_ASSERT(session_id(s) > 0);
}

/* The ending hook: runs before a deferred close or eviction is answered,
 * while the release still waits; a holder that finishes meanwhile
 * (ending_holder, released from inside the hook) does not release it
 * under the hook. */
static int ending_count;
static struct session *ending_holder;
static void on_ending(void *ctx, struct session *s)
{
	int before = __atomic_load_n(&released_count, __ATOMIC_RELAXED);

	(void)ctx;
	ending_count++;
	T_ASSERT(session_id(s) > 0);
	if (ending_holder) {
		session_release(ending_holder);
		ending_holder = NULL;
	}
	T_EQ(__atomic_load_n(&released_count, __ATOMIC_RELAXED), before);
}

static void test_evict_during_operation(void)
{
	struct config *c = two_tenants();
	struct tenant_table *tt;
	struct session_table *st;
	struct session_info si;
	struct session *s, *s2;
	char why[256];

	released_count = 0;
	ending_count = 0;
	T_EQ(tenant_table_new(&tt, c), 0);
	T_EQ(session_table_new(&st, 8, on_release, NULL), 0);
	session_table_set_ending(st, on_ending);
	struct tenant *a = tenant_find(tt, "a");
	T_EQ(session_open(st, a, "", 1000, &g_small, 1, 0, 1000, &si, why, sizeof(why)), 0);
	T_EQ(session_acquire(st, si.id, 2000, &s), 0);
	T_EQ(session_charge(s, 4 * MiB), 0);
	T_EQ(session_charge(s, 13 * MiB), -ENOSPC);  /* 4 + 13 > 16 */
	session_set_tokens(s, 10);
	T_EQ(tenant_used(a), 4 * MiB);
	/* evict while the operation runs: memory stays until it ends */
	T_EQ(session_evict(st, si.id, &si), 0);
	T_EQ(si.state, SESSION_EVICTED);
	T_EQ(tenant_used(a), 4 * MiB);
	T_EQ(released_count, 0);
	T_EQ(ending_count, 1);
	T_EQ(session_charge(s, MiB), -ESTALE);       /* no new charges after evict */
	T_EQ(session_evict(st, si.id, NULL), -EALREADY);
	T_EQ(session_acquire(st, si.id, 2000, &s2), -ESTALE); /* the owner's clear error */
	session_release(s);
	T_EQ(released_count, 1);
	T_EQ(tenant_used(a), 0);
	T_EQ(session_get_info(st, si.id, &si), 0);   /* the record stays */
	T_EQ(si.resident_bytes, 0);
	T_EQ(si.tokens, 10);
	T_EQ(si.last_access_ms, 2000);
	uint64_t rel = 99;
	T_EQ(session_close(st, si.id, &rel), 0);
	T_EQ(rel, 0);
	T_EQ(released_count, 1);                     /* released once only */
	T_EQ(ending_count, 1);                       /* nothing held it */

	/* close during an operation */
	T_EQ(session_open(st, a, "", 1000, &g_small, 1, 0, 1000, &si, why, sizeof(why)), 0);
	T_EQ(session_acquire(st, si.id, 3000, &s), 0);
	T_EQ(session_charge(s, 2 * MiB), 0);
	T_EQ(session_close(st, si.id, &rel), 0);
	T_EQ(rel, 2 * MiB);
	T_EQ(session_acquire(st, si.id, 3000, &s2), -ENOENT);
	T_EQ(tenant_used(a), 2 * MiB);
	T_EQ(session_charge(s, MiB), -ESTALE);
	T_EQ(ending_count, 2);
	session_release(s);                          /* last reference: freed */
	T_EQ(tenant_used(a), 0);
	T_EQ(released_count, 2);

	/* evicted, then closed, while held: the hook runs once */
	T_EQ(session_open(st, a, "", 1000, &g_small, 1, 0, 1000, &si, why, sizeof(why)), 0);
	T_EQ(session_acquire(st, si.id, 3500, &s), 0);
	T_EQ(session_evict(st, si.id, NULL), 0);
	T_EQ(ending_count, 3);
	T_EQ(session_close(st, si.id, NULL), 0);
	T_EQ(ending_count, 3);
	session_release(s);
	T_EQ(released_count, 3);

	/* the holder done while the hook runs: the close releases it, after */
	T_EQ(session_open(st, a, "", 1000, &g_small, 1, 0, 1000, &si, why, sizeof(why)), 0);
	T_EQ(session_acquire(st, si.id, 4000, &s), 0);
	T_EQ(session_charge(s, MiB), 0);
	ending_holder = s;
	T_EQ(session_close(st, si.id, NULL), 0);
	T_EQ(ending_count, 4);
	T_EQ(released_count, 4);
	T_EQ(tenant_used(a), 0);
	session_table_free(st);
	tenant_table_free(tt);
	free(c);
}

static void test_idle_expiry(void)
{
	struct config *c = two_tenants();
	struct tenant_table *tt;
	struct session_table *st;
	struct session_info s1, s2;
	struct session *s;
	char why[256];

	T_EQ(tenant_table_new(&tt, c), 0);
	T_EQ(session_table_new(&st, 8, NULL, NULL), 0);
	struct tenant *b = tenant_find(tt, "b");
	T_EQ(session_open(st, b, "", 1, &g_small, 1, 0, 1000, &s1, why, sizeof(why)), 0);
	T_EQ(session_open(st, b, "", 1, &g_small, 1, 0, 1000, &s2, why, sizeof(why)), 0);
	T_EQ(session_acquire(st, s2.id, 5000, &s), 0);
	session_release(s);
	T_EQ(session_table_expire(st, 5500, 0), 0);     /* ttl 0: off */
	T_EQ(session_table_expire(st, 5500, 4000), 1);  /* s1 idle 4.5 s; s2 0.5 s */
	T_EQ(session_get_info(st, s1.id, &s1), 0);
	T_EQ(s1.state, SESSION_EVICTED);
	T_EQ(session_get_info(st, s2.id, &s2), 0);
	T_EQ(s2.state, SESSION_OPEN);
	/* busy sessions are not evicted */
	T_EQ(session_acquire(st, s2.id, 5000, &s), 0);
	T_EQ(session_table_expire(st, 9000, 4000), 0);
	session_release(s);
	/* evicted at 5500: dropped at 9500 */
	T_EQ(session_table_expire(st, 9600, 4000), 2);   /* s1 dropped, s2 evicted */
	T_EQ(session_get_info(st, s1.id, &s1), -ENOENT);
	session_table_free(st);
	tenant_table_free(tt);
	free(c);
}

static uint64_t clock_of(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Session times (idle expiry) run on CLOCK_BOOTTIME, aligned with the
 * wall clock once: their distance to CLOCK_BOOTTIME never changes, so a
 * wall-clock step (NTP, a VM resumed) cannot expire every idle session at
 * once (they ran on CLOCK_REALTIME); here, where nothing steps the wall
 * clock, they are within a second of it. */
static void test_session_clock(void)
{
	uint64_t a = session_clock_ms(), m1 = clock_of(CLOCK_BOOTTIME);
	usleep(30000);
	uint64_t b = session_clock_ms(), m2 = clock_of(CLOCK_BOOTTIME), w = clock_of(CLOCK_REALTIME);
	T_ASSERT(b >= a + 30);
	int64_t d1 = (int64_t)(a - m1), d2 = (int64_t)(b - m2);
	T_ASSERT(d1 - d2 <= 1 && d2 - d1 <= 1);
	T_ASSERT(b + 1000 > w && w + 1000 > b);
}

/* Threads charge and release while the main thread evicts and closes:
 * at the end the tenant must be back at zero, with no crash. */
struct race {
	struct session_table *st;
	uint64_t first_id;
	int n_ids;
	int stop;
	long ops;
};

static void *racer(void *arg)
{
	struct race *r = arg;
	unsigned seed = (unsigned)(uintptr_t)&seed;

	while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
		struct session *s;
		uint64_t id = r->first_id + (uint64_t)(rand_r(&seed) % r->n_ids);
		if (session_acquire(r->st, id, 1, &s) < 0)
			continue;
		if (session_charge(s, 4096) == 0 && rand_r(&seed) % 2)
			session_uncharge(s, 4096);
		session_release(s);
		__atomic_add_fetch(&r->ops, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

/* Open one session in a fresh table over the idstore in dir: its id. */
static int64_t open_one(const char *dir, struct tenant *t, struct session_table **stp, struct idstore **isp,
			char *why, size_t whylen)
{
	struct session_info si;
	uint64_t first;
	int r;

	if ((r = idstore_open(isp, dir, &first, why, whylen)) < 0)
		return r;
	if (session_table_new(stp, 64, NULL, NULL) < 0)
		return -ENOMEM;
	session_table_set_ids(*stp, first, idstore_reserve, *isp);
	if ((r = session_open(*stp, t, "", 1000, &g_small, 1, 0, 1000, &si, why, whylen)) < 0)
		return r;
	return (int64_t)si.id;
}

/* Session ids never repeat across restarts (idstore): a new table over the
 * same directory continues past the last reserved block, a damaged file is
 * an error, a failing store fails the open (never hands out an id unsaved). */
static void test_ids_persist(void)
{
	struct config *c = two_tenants();
	struct tenant_table *tt;
	struct session_table *st;
	struct idstore *is;
	struct session_info si;
	char dir[] = "/tmp/tq-ids-XXXXXX", path[64], why[256];
	FILE *f;

	T_ASSERT(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/%s", dir, IDSTORE_FILE);
	T_EQ(tenant_table_new(&tt, c), 0);
	struct tenant *b = tenant_find(tt, "b");
	T_EQ(open_one(dir, b, &st, &is, why, sizeof(why)), 1);       /* a fresh directory */
	for (int i = 0; i < 40; i++) { /* past a block boundary: open and close */
		T_EQ(session_open(st, b, "", 1000, &g_small, 1, 0, 1000, &si, why, sizeof(why)), 0);
		T_EQ(session_close(st, si.id, NULL), 0);
	}
	T_EQ(si.id, 41);
	/* a "crash": no clean close of anything; the next run starts after the block */
	session_table_free(st);
	idstore_close(is);
	T_EQ(open_one(dir, b, &st, &is, why, sizeof(why)), SESSION_ID_BLOCK + 1);
	session_table_free(st);
	idstore_close(is);
	T_EQ(open_one(dir, b, &st, &is, why, sizeof(why)), 2 * SESSION_ID_BLOCK + 1);
	/* the store cannot write (its directory is gone): the open that needs a new
	 * block fails with the reason; ids already reserved are still handed out */
	session_table_free(st);
	idstore_close(is);
	T_ASSERT((f = fopen(path, "w")) != NULL);
	fprintf(f, "tqkvd session-ids 1 reserved_through=5\n");
	fclose(f);
	T_EQ(open_one(dir, b, &st, &is, why, sizeof(why)), 6);
	T_EQ(unlink(path), 0);
	T_EQ(rmdir(dir), 0);
	for (int i = 0; i < 5; i++) /* 7..11: reserved at open_one's first open */
		(void)session_open(st, b, "", 1000, &g_small, 1, 0, 1000, &si, why, sizeof(why));
	int r = 0;
	for (int i = 0; i < SESSION_ID_BLOCK + 1 && r == 0; i++) {
		r = session_open(st, b, "", 1000, &g_small, 1, 0, 1000, &si, why, sizeof(why));
		if (r == 0)
			session_close(st, si.id, NULL);
	}
	T_ASSERT(r < 0);
	T_ASSERT(strstr(why, "cannot persist the session-id counter"));
	session_table_free(st);
	idstore_close(is);
	/* damaged or foreign files are refused at open, not guessed at */
	strcpy(dir, "/tmp/tq-ids-XXXXXX");
	T_ASSERT(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/%s", dir, IDSTORE_FILE);
	const char *bad[] = { "garbage\n", "tqkvd session-ids 1 reserved_through=\n",
			      "tqkvd session-ids 1 reserved_through=12x\n", "" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint64_t first;
		T_ASSERT((f = fopen(path, "w")) != NULL);
		fputs(bad[i], f);
		fclose(f);
		T_ASSERT(idstore_open(&is, dir, &first, why, sizeof(why)) < 0);
		T_ASSERT(strstr(why, path));
	}
	unlink(path);
	/* a reservation whose rename fails (the file's name taken by a
	 * directory): refused, and no session-ids.tmp left behind */
	uint64_t first;
	char tmp[96], sub[96];
	T_EQ(idstore_open(&is, dir, &first, why, sizeof(why)), 0);
	T_EQ(mkdir(path, 0700), 0);
	snprintf(sub, sizeof(sub), "%s/x", path);
	T_EQ(mkdir(sub, 0700), 0);
	T_ASSERT(idstore_reserve(is, 100, why, sizeof(why)) < 0);
	T_ASSERT(strstr(why, "cannot persist the session-id counter"));
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	T_ASSERT(access(tmp, F_OK) < 0 && errno == ENOENT);
	idstore_close(is);
	rmdir(sub);
	rmdir(path);
	rmdir(dir);
	tenant_table_free(tt);
	free(c);
}

static void test_concurrent_evict_close(void)
{
	struct config *c = two_tenants();
	struct tenant_table *tt;
	struct session_table *st;
	struct session_info si;
	pthread_t th[3];
	char why[256];
	struct race r = { 0 };

	T_EQ(tenant_table_new(&tt, c), 0);
	T_EQ(session_table_new(&st, 1024, NULL, NULL), 0);
	struct tenant *b = tenant_find(tt, "b");
	r.st = st;
	r.n_ids = 32;
	for (int i = 0; i < r.n_ids; i++) {
		T_EQ(session_open(st, b, "", 1, &g_small, 1, 0, 1, &si, why, sizeof(why)), 0);
		if (i == 0)
			r.first_id = si.id;
	}
	for (int i = 0; i < 3; i++)
		T_EQ(pthread_create(&th[i], NULL, racer, &r), 0);
	for (int i = 0; i < r.n_ids; i++) {
		struct timespec ts = { 0, 200000 };
		nanosleep(&ts, NULL);
		if (i % 2)
			session_evict(st, r.first_id + (uint64_t)i, NULL);
		else
			session_close(st, r.first_id + (uint64_t)i, NULL);
	}
	__atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	T_ASSERT(r.ops > 0);
	T_EQ(tenant_used(b), 0);
	session_table_free(st);
	tenant_table_free(tt);
	free(c);
}

/* A reserve hook as slow as a busy disk's two fsyncs: it runs without
 * the table lock (every data operation takes that lock: they would all
 * stall behind it), once for opens that need the same block. */
static uint32_t slow_reserves, reserve_sleep_us = 300000;
static uint64_t persisted; /* the highest `through` the hook was given */
static int slow_reserve(void *ctx, uint64_t through, char *why, size_t whylen)
{
	(void)ctx, (void)why, (void)whylen;
	__atomic_add_fetch(&slow_reserves, 1, __ATOMIC_RELAXED);
	usleep(__atomic_load_n(&reserve_sleep_us, __ATOMIC_RELAXED));
	if (through > __atomic_load_n(&persisted, __ATOMIC_RELAXED))
		__atomic_store_n(&persisted, through, __ATOMIC_RELAXED);
	return 0;
}

struct opener {
	struct session_table *st;
	struct tenant *t;
	int r;
	uint64_t id;
};

static void *opener_main(void *arg)
{
	struct opener *o = arg;
	struct session_info si;
	char why[256];

	o->r = session_open(o->st, o->t, "", 1, &g_small, 1, 0, 1, &si, why, sizeof(why));
	o->id = si.id;
	return NULL;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_reserve_off_lock(void)
{
	struct config *c = two_tenants();
	struct tenant_table *tt;
	struct session_table *st;
	struct session_info si;
	struct session *s;
	char why[256];

	T_EQ(tenant_table_new(&tt, c), 0);
	T_EQ(session_table_new(&st, 64, NULL, NULL), 0);
	struct tenant *b = tenant_find(tt, "b");
	T_EQ(session_open(st, b, "", 1, &g_small, 1, 0, 1, &si, why, sizeof(why)), 0); /* ids not persisted yet */
	session_table_set_ids(st, si.id + 1, slow_reserve, NULL);
	struct opener o[2] = { { st, b, 0, 0 }, { st, b, 0, 0 } };
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		T_EQ(pthread_create(&th[i], NULL, opener_main, &o[i]), 0);
	usleep(50000); /* the reserve runs */
	double t0 = now_s();
	T_EQ(session_acquire(st, si.id, 0, &s), 0);
	session_release(s);
	double took = now_s() - t0;
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	fprintf(stderr, "    an operation's acquire during a 300 ms reserve took %.1f ms\n", took * 1e3);
	T_ASSERT(took < 0.1);
	T_EQ(o[0].r, 0);
	T_EQ(o[1].r, 0);
	T_ASSERT(o[0].id != o[1].id && o[0].id > si.id && o[1].id > si.id);
	T_EQ(__atomic_load_n(&slow_reserves, __ATOMIC_RELAXED), 1); /* one block for both */
	/* no id beyond what the hook persisted, ever: through the next
	 * blocks (the second opener above must not have moved the mark) */
	__atomic_store_n(&reserve_sleep_us, 0, __ATOMIC_RELAXED);
	T_EQ(session_close(st, o[0].id, NULL), 0);
	T_EQ(session_close(st, o[1].id, NULL), 0);
	uint64_t beyond = 0;
	for (int i = 0; i < 2 * SESSION_ID_BLOCK + 10; i++) {
		struct session_info sj;
		T_EQ(session_open(st, b, "", 1, &g_small, 1, 0, 1, &sj, why, sizeof(why)), 0);
		if (sj.id > __atomic_load_n(&persisted, __ATOMIC_RELAXED) && !beyond++)
			fprintf(stderr, "    id %llu handed out, only %llu persisted\n", (unsigned long long)sj.id,
				(unsigned long long)persisted);
		T_EQ(session_close(st, sj.id, NULL), 0);
	}
	T_EQ(beyond, 0);
	session_table_free(st);
	tenant_table_free(tt);
	free(c);
}

int main(void)
{
	T_RUN(test_tenant_charge);
	T_RUN(test_tenant_budget);
	T_RUN(test_tenant_allows);
	T_RUN(test_geometry);
	T_RUN(test_open_and_names);
	T_RUN(test_evict_during_operation);
	T_RUN(test_idle_expiry);
	T_RUN(test_session_clock);
	T_RUN(test_concurrent_evict_close);
	T_RUN(test_ids_persist);
	T_RUN(test_reserve_off_lock);
	return t_done();
}
