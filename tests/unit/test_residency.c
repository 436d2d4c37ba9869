/* test_residency — pages moving between the pool and the spill tier under
 * the data operations: spill, restore on access (bit-exact attention),
 * exact accounting through every transition, a corrupted or unreadable
 * copy reported to its own session only, a full tier. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "devsim.h"
#include "kvfix.h"
#include "config.h"
#include "dataop.h"
#include "pool.h"
#include "session.h"
#include "spill.h"
#include "tenant.h"
#include "tqkv_ring.h"
#include "tq_xform.h"

#define MiB (1ull << 20)
/* in helpers that return a value (T_* return from the caller) */
#define MUST(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #x); exit(1); } } while (0)
#define PAGE (16u << 10)

static void fix_start(struct kvfix *f, uint64_t spill_slots)
{
	kvfix_start(f, "[pool]\npool_bytes = 16M\n[tenant t]\nlimit = 16M\nallow_uids = *\n", 16 * MiB, PAGE,
		    spill_slots);
}

static const struct session_geom G = { 3, 2, 4, 64, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 1024, 0 };

static uint64_t open_filled(struct kvfix *f, uint32_t tokens, uint64_t seed)
{
	struct session_info si;
	struct session *s;
	struct dataop_res r;
	char why[200];
	float *k = malloc((size_t)tokens * 2 * 64 * 4), *v = malloc((size_t)tokens * 2 * 64 * 4);

	if (session_open(f->st, tenant_find(f->tt, "t"), "", 1000, &G, seed, 0, 0, &si, why, sizeof(why)) < 0)
		exit(1);
	for (size_t i = 0; i < (size_t)tokens * 2 * 64; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		k[i] = (float)(seed >> 40) / (float)(1 << 24) - 0.5f;
		v[i] = (float)(seed >> 20 & 0xfffff) / (float)(1 << 20) - 0.5f;
	}
	MUST(session_acquire(f->st, si.id, 0, &s) == 0);
	for (uint32_t l = 0; l < G.n_layers; l++) {
		dataop_append(f->ks, s, l, k, v, TQ_DTYPE_F32, tokens, &r);
		MUST(r.status == TQKV_ST_OK);
	}
	session_release(s);
	free(k);
	free(v);
	return si.id;
}

/* out[4 queries][4 heads][64] over layer l, positions spread over the context */
static int attend(struct kvfix *f, uint64_t id, uint32_t l, uint32_t tokens, float *out, struct dataop_res *r)
{
	struct dataop_ws ws = { 0 };
	struct session *s;
	float q[4 * 4 * 64];
	int32_t pos[4] = { 0, (int32_t)tokens / 3, (int32_t)tokens / 2, (int32_t)tokens - 1 };

	for (int i = 0; i < 4 * 4 * 64; i++)
		q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
	MUST(session_acquire(f->st, id, 0, &s) == 0);
	dataop_attend(f->ks, s, &ws, l, NULL, NULL, 0, q, pos, 4, TQ_DTYPE_F32, out, r);
	session_release(s);
	dataop_ws_free(&ws);
	return r->res;
}

static void info(struct kvfix *f, uint64_t id, struct session_info *si)
{
	T_EQ(session_get_info(f->st, id, si), 0);
}

static int spill(struct kvfix *f, uint64_t id, uint64_t bytes, uint64_t *done, char *why)
{
	struct session *s;
	MUST(session_acquire(f->st, id, 0, &s) == 0);
	int r = dataop_spill(f->ks, s, bytes, done, why, 512);
	session_release(s);
	return r;
}

static void test_spill_restore_exact(void)
{
	struct kvfix f;
	struct session_info si, si2;
	struct dataop_res r;
	struct spill_stats st;
	static float before[3][4 * 4 * 64], after[4 * 4 * 64];
	uint64_t done;
	char why[512];
	const uint32_t tokens = 700;

	fix_start(&f, 256);
	uint32_t free0 = pool_pages_free_count(f.pool);
	uint64_t id = open_filled(&f, tokens, 11), other = open_filled(&f, 100, 12);
	for (uint32_t l = 0; l < 3; l++)
		T_EQ(attend(&f, id, l, tokens, before[l], &r), 4);
	info(&f, id, &si);
	uint64_t resident0 = si.resident_bytes, pages = resident0 / PAGE;
	T_ASSERT(pages >= 6);
	uint64_t used0 = tenant_table_used(f.tt);
	uint32_t free1 = pool_pages_free_count(f.pool);

	/* part of it: whole pages, full ones first */
	T_EQ(spill(&f, id, 2 * PAGE + 1, &done, why), 0);
	T_EQ(done, 3 * PAGE);
	info(&f, id, &si);
	T_EQ(si.resident_bytes, resident0 - 3 * PAGE);
	T_EQ(si.spilled_bytes, 3 * PAGE);
	T_EQ(tenant_table_used(f.tt), used0 - 3 * PAGE);
	T_EQ(pool_pages_free_count(f.pool), free1 + 3);
	/* all of it */
	T_EQ(spill(&f, id, UINT64_MAX, &done, why), 0);
	T_EQ(done, resident0 - 3 * PAGE);
	info(&f, id, &si);
	T_EQ(si.resident_bytes, 0);
	T_EQ(si.spilled_bytes, resident0);
	T_EQ(pool_pages_free_count(f.pool), free1 + pages);
	struct tenant_info ti;
	tenant_get_info(tenant_find(f.tt, "t"), &ti);
	T_EQ(ti.spilled, resident0);
	T_EQ(ti.used, used0 - resident0);
	T_EQ(spill(&f, id, UINT64_MAX, &done, why), 0); /* nothing left to spill */
	T_EQ(done, 0);
	spill_stats(f.sp, &st);
	T_EQ(st.slots_used, pages);
	/* the other session is untouched and still served */
	info(&f, other, &si2);
	T_EQ(si2.spilled_bytes, 0);
	T_EQ(attend(&f, other, 0, 100, after, &r), 4);
	/* an attend restores the layer it needs, bit-exact */
	T_EQ(attend(&f, id, 1, tokens, after, &r), 4);
	T_ASSERT(memcmp(after, before[1], sizeof(after)) == 0);
	info(&f, id, &si);
	T_EQ(si.resident_bytes + si.spilled_bytes, resident0);
	T_ASSERT(si.resident_bytes > 0 && si.spilled_bytes > 0);
	/* restore the rest: everything back, the slots free again */
	struct session *s;
	T_EQ(session_acquire(f.st, id, 0, &s), 0);
	T_EQ(dataop_restore(f.ks, s, why, sizeof(why)), 0);
	session_release(s);
	info(&f, id, &si);
	T_EQ(si.resident_bytes, resident0);
	T_EQ(si.spilled_bytes, 0);
	T_EQ(tenant_table_used(f.tt), used0);
	tenant_get_info(tenant_find(f.tt, "t"), &ti);
	T_EQ(ti.spilled, 0);
	spill_stats(f.sp, &st);
	T_EQ(st.slots_used, 0);
	for (uint32_t l = 0; l < 3; l++) {
		T_EQ(attend(&f, id, l, tokens, after, &r), 4);
		T_ASSERT(memcmp(after, before[l], sizeof(after)) == 0);
	}
	/* spill, then truncate and close: slots and bytes come back */
	T_EQ(spill(&f, id, UINT64_MAX, &done, why), 0);
	T_EQ(session_acquire(f.st, id, 0, &s), 0);
	dataop_truncate(f.ks, s, 0, 0, 10, &r);
	session_release(s);
	T_EQ(r.status, TQKV_ST_OK);
	info(&f, id, &si);
	T_EQ(si.resident_bytes, 0);
	T_ASSERT(si.spilled_bytes < resident0);
	T_EQ(session_close(f.st, id, NULL), 0);
	T_EQ(session_close(f.st, other, NULL), 0);
	spill_stats(f.sp, &st);
	T_EQ(st.slots_used, 0);
	T_EQ(tenant_table_used(f.tt), 0);
	tenant_get_info(tenant_find(f.tt, "t"), &ti);
	T_EQ(ti.spilled, 0);
	T_EQ(pool_pages_free_count(f.pool), free0);
	kvfix_stop(&f);
}

static void test_faults(void)
{
	struct kvfix f;
	struct session_info si;
	struct dataop_res r;
	float out[4 * 4 * 64];
	uint64_t done;
	char why[512], path[128];

	fix_start(&f, 8);
	uint64_t id = open_filled(&f, 700, 21), other = open_filled(&f, 300, 22);
	info(&f, id, &si);
	uint64_t pages = si.resident_bytes / PAGE;
	/* a full tier: what fits goes, the rest says why */
	T_EQ(spill(&f, id, UINT64_MAX, &done, why), 0);
	T_EQ(done, 8 * PAGE);
	T_ASSERT(pages > 8);
	T_EQ(spill(&f, other, UINT64_MAX, &done, why), -ENOSPC);
	T_ASSERT(strstr(why, "the spill tier is full (8 of 8 slots in use)"));
	/* an unreadable page: SPILL_IO, still spilled, a retry works */
	spill_fault_arm(f.sp, SPILL_FAULT_READ, 1, -EIO);
	T_EQ(attend(&f, id, 0, 700, out, &r), -EIO);
	T_EQ(r.status, TQKV_ST_SPILL_IO);
	T_ASSERT(strstr(r.msg, "injected"));
	T_EQ(attend(&f, id, 0, 700, out, &r), 4);
	/* a write that fails: the page stays resident, nothing is lost */
	struct session *s;
	T_EQ(session_acquire(f.st, id, 0, &s), 0);
	T_EQ(dataop_restore(f.ks, s, why, sizeof(why)), 0);
	session_release(s);
	spill_fault_arm(f.sp, SPILL_FAULT_WRITE, 1, -EIO);
	T_EQ(spill(&f, other, PAGE, &done, why), -EIO);
	T_EQ(done, 0);
	info(&f, other, &si);
	T_EQ(si.spilled_bytes, 0);
	T_EQ(attend(&f, other, 0, 300, out, &r), 4);
	/* a corrupted copy: DATA_LOSS for its session only, never served */
	T_EQ(spill(&f, id, PAGE, &done, why), 0);
	snprintf(path, sizeof(path), "%s/%s", f.dir, SPILL_FILE);
	int fd = open(path, O_RDWR);
	T_ASSERT(fd >= 0);
	for (uint64_t slot = 0; slot < 8; slot++) { /* flip a payload byte in every slot */
		uint8_t b;
		off_t off = (off_t)(slot * (SPILL_HDR_BYTES + PAGE) + SPILL_HDR_BYTES + 77);
		T_EQ(pread(fd, &b, 1, off), 1);
		b ^= 0x40;
		T_EQ(pwrite(fd, &b, 1, off), 1);
	}
	close(fd);
	T_EQ(attend(&f, id, 0, 700, out, &r), -EBADMSG);
	T_EQ(r.status, TQKV_ST_DATA_LOSS);
	T_ASSERT(strstr(r.msg, "checksum mismatch"));
	T_EQ(attend(&f, id, 0, 700, out, &r), -EBADMSG); /* and stays lost */
	T_ASSERT(strstr(r.msg, "was lost"));
	T_EQ(attend(&f, id, 1, 700, out, &r), 4);          /* other layers are fine */
	T_EQ(attend(&f, other, 0, 300, out, &r), 4);       /* the other session too */
	info(&f, id, &si);
	T_EQ(si.spilled_bytes, 0);
	/* truncating below the lost page makes the layer usable again */
	T_EQ(session_acquire(f.st, id, 0, &s), 0);
	dataop_truncate(f.ks, s, 0, 0, 0, &r);
	session_release(s);
	T_EQ(session_close(f.st, id, NULL), 0);
	T_EQ(session_close(f.st, other, NULL), 0);
	struct spill_stats st;
	spill_stats(f.sp, &st);
	T_EQ(st.slots_used, 0);
	T_EQ(st.crc_failures, 1);
	T_EQ(tenant_table_used(f.tt), 0);
	kvfix_stop(&f);
}

/* Reading layer l back starts reading layer l + 1 (read-ahead): by the
 * time its attention comes, its pages are in; a corrupted page read ahead
 * is lost for that layer's operation all the same. */
static void test_readahead(void)
{
	struct kvfix f;
	struct session_info si;
	struct dataop_res r;
	struct spill_stats st;
	static float before[3][4 * 4 * 64], out[4 * 4 * 64];
	uint64_t done;
	char why[512], path[128];

	fix_start(&f, 64);
	uint64_t id = open_filled(&f, 700, 31);
	for (uint32_t l = 0; l < 3; l++)
		T_EQ(attend(&f, id, l, 700, before[l], &r), 4);
	info(&f, id, &si);
	uint64_t all = si.resident_bytes, per_layer = all / 3;
	T_EQ(spill(&f, id, UINT64_MAX, &done, why), 0);
	T_EQ(attend(&f, id, 0, 700, out, &r), 4);
	T_ASSERT(memcmp(out, before[0], sizeof(out)) == 0);
	info(&f, id, &si); /* layer 0 back, layer 1 charged and on its way */
	T_EQ(si.resident_bytes, 2 * per_layer);
	T_EQ(si.spilled_bytes, per_layer);
	/* a spill takes the read-ahead pages too (charged pool pages nobody
	 * uses yet: an idle session's must not be beyond the reclaimer's
	 * reach), then the layers come back as before */
	T_EQ(spill(&f, id, UINT64_MAX, &done, why), 0);
	T_EQ(done, 2 * per_layer);
	info(&f, id, &si);
	T_EQ(si.resident_bytes, 0);
	T_EQ(attend(&f, id, 0, 700, out, &r), 4);
	T_ASSERT(memcmp(out, before[0], sizeof(out)) == 0);
	for (uint32_t l = 1; l < 3; l++) {
		T_EQ(attend(&f, id, l, 700, out, &r), 4);
		T_ASSERT(memcmp(out, before[l], sizeof(out)) == 0);
	}
	info(&f, id, &si);
	T_EQ(si.resident_bytes, all);
	spill_stats(f.sp, &st);
	T_EQ(st.slots_used, 0);
	/* a corrupted page of layer 1, read ahead while layer 0 is served */
	T_EQ(spill(&f, id, UINT64_MAX, &done, why), 0);
	snprintf(path, sizeof(path), "%s/%s", f.dir, SPILL_FILE);
	int fd = open(path, O_RDWR);
	T_ASSERT(fd >= 0);
	for (uint64_t slot = 0; slot < 64; slot++) { /* every slot of layer 1 */
		uint8_t h[SPILL_HDR_BYTES];
		off_t off = (off_t)(slot * (SPILL_HDR_BYTES + PAGE));
		if (pread(fd, h, sizeof(h), off) != (ssize_t)sizeof(h))
			break;
		struct spill_page_hdr ph;
		memcpy(&ph, h, sizeof(ph));
		if (ph.magic == SPILL_MAGIC && ph.layer == 1) {
			uint8_t b;
			T_EQ(pread(fd, &b, 1, off + SPILL_HDR_BYTES + 5), 1);
			b ^= 1;
			T_EQ(pwrite(fd, &b, 1, off + SPILL_HDR_BYTES + 5), 1);
		}
	}
	close(fd);
	T_EQ(attend(&f, id, 0, 700, out, &r), 4);
	T_EQ(attend(&f, id, 1, 700, out, &r), -EBADMSG);
	T_EQ(r.status, TQKV_ST_DATA_LOSS);
	T_EQ(attend(&f, id, 2, 700, out, &r), 4);
	T_ASSERT(memcmp(out, before[2], sizeof(out)) == 0);
	T_EQ(session_close(f.st, id, NULL), 0);
	spill_stats(f.sp, &st);
	T_EQ(st.slots_used, 0);
	T_EQ(tenant_table_used(f.tt), 0);
	kvfix_stop(&f);
}

struct bg_attend {
	struct kvfix *f;
	uint64_t id;
	int res;
	double ms;
};

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void *bg_attend_main(void *arg)
{
	struct bg_attend *a = arg;
	struct dataop_res r;
	static float out[4 * 4 * 64];
	double t0 = now_ms();
	a->res = attend(a->f, a->id, 0, 700, out, &r);
	a->ms = now_ms() - t0;
	return NULL;
}

/* A slow disk holds up only the sessions that read from it: while one
 * session's layer comes back at 600 ms per I/O, another, resident,
 * session's attention runs at its usual speed (under 300 ms each, where
 * one held up behind the restore would take 550 ms or more: a sanitizer
 * build beside other tests is slow, not that slow). */
static void test_slow_disk(void)
{
	struct kvfix f;
	struct dataop_res r;
	float out[4 * 4 * 64];
	uint64_t done;
	char why[512];
	pthread_t th;

	fix_start(&f, 64);
	uint64_t a = open_filled(&f, 700, 41), b = open_filled(&f, 700, 42);
	T_EQ(spill(&f, a, UINT64_MAX, &done, why), 0);
	spill_fault_delay(f.sp, 600000);
	struct bg_attend bg = { &f, a, 0, 0 };
	T_EQ(pthread_create(&th, NULL, bg_attend_main, &bg), 0);
	usleep(50000); /* a's restore is under way */
	double worst = 0;
	for (int i = 0; i < 5; i++) {
		double t0 = now_ms();
		T_EQ(attend(&f, b, 0, 700, out, &r), 4);
		double ms = now_ms() - t0;
		worst = ms > worst ? ms : worst;
	}
	pthread_join(th, NULL);
	spill_fault_delay(f.sp, 0);
	fprintf(stderr, "    slow disk: the spilled session's attend took %.0f ms; the resident one's worst %.1f ms\n",
		bg.ms, worst);
	T_EQ(bg.res, 4);
	T_ASSERT(bg.ms >= 600);
	T_ASSERT(worst < 300);
	T_EQ(session_close(f.st, a, NULL), 0);
	T_EQ(session_close(f.st, b, NULL), 0);
	kvfix_stop(&f);
}

/* A pool whose pages the host cannot touch (devsim.h: the GPU tier's
 * plumbing): the same attention bits as a host pool, spill and restore
 * through staging copies, and a copy that fails in either direction
 * loses nothing. */
static void test_device_tier(void)
{
	struct kvfix f;
	struct session_info si;
	struct dataop_res r;
	struct spill_stats st;
	struct devsim_stats ds0, ds1;
	static float host[3][4 * 4 * 64], out[4 * 4 * 64];
	uint64_t done;
	char why[512];
	const uint32_t tokens = 500;

	/* the reference: a host pool */
	fix_start(&f, 64);
	uint64_t id = open_filled(&f, tokens, 31);
	for (uint32_t l = 0; l < 3; l++)
		T_EQ(attend(&f, id, l, tokens, host[l], &r), 4);
	T_EQ(session_close(f.st, id, NULL), 0);
	kvfix_stop(&f);

	kvfix_backend = &backend_devsim;
	fix_start(&f, 64);
	kvfix_backend = NULL;
	T_ASSERT(!pool_host_accessible(f.pool) && pool_has_kernels(f.pool));
	uint32_t free0 = pool_pages_free_count(f.pool);
	devsim_stats(&ds0);
	id = open_filled(&f, tokens, 31);
	for (uint32_t l = 0; l < 3; l++) {
		T_EQ(attend(&f, id, l, tokens, out, &r), 4);
		T_ASSERT(memcmp(out, host[l], sizeof(out)) == 0);
	}
	devsim_stats(&ds1);
	T_EQ(ds1.appends - ds0.appends, 3);
	T_EQ(ds1.attends - ds0.attends, 3);
	info(&f, id, &si);
	uint64_t resident0 = si.resident_bytes;

	/* the first page's copy to staging fails: that write fails, the page
	 * stays resident and its tokens intact */
	devsim_fail_copy(1);
	int e = spill(&f, id, UINT64_MAX, &done, why);
	T_ASSERT(e < 0 || done < resident0);
	info(&f, id, &si);
	T_EQ(si.resident_bytes + si.spilled_bytes, resident0);
	T_ASSERT(si.resident_bytes >= PAGE);
	/* the rest goes; a restore whose copy into the pool fails is an error
	 * for this call only, and the next one gets every page back */
	T_EQ(spill(&f, id, UINT64_MAX, &done, why), 0);
	info(&f, id, &si);
	T_EQ(si.resident_bytes, 0);
	devsim_stats(&ds0);
	T_ASSERT(ds0.copies_from_dev > ds1.copies_from_dev);
	devsim_fail_copy(1);
	/* the failed copy is this call's error — or, when a read-ahead took
	 * it, the call reads the page again: never wrong bits */
	attend(&f, id, 1, tokens, out, &r);
	T_ASSERT((r.res < 0 && r.status != TQKV_ST_OK) ||
		 (r.res == 4 && memcmp(out, host[1], sizeof(out)) == 0));
	devsim_fail_copy(0);
	for (uint32_t l = 0; l < 3; l++) {
		T_EQ(attend(&f, id, l, tokens, out, &r), 4);
		T_ASSERT(memcmp(out, host[l], sizeof(out)) == 0);
	}
	devsim_stats(&ds1);
	T_ASSERT(ds1.copies_to_dev > ds0.copies_to_dev);
	/* a restore into a GPU lost meanwhile is DEVICE_LOST (a retry will
	 * not do), not SPILL_IO (it said a retry may work) */
	T_EQ(spill(&f, id, UINT64_MAX, &done, why), 0);
	devsim_lose("the GPU fell off the bus");
	T_ASSERT(attend(&f, id, 0, tokens, out, &r) < 0);
	T_EQ(r.status, TQKV_ST_DEVICE_LOST);
	devsim_lose(NULL);
	T_EQ(session_close(f.st, id, NULL), 0);
	spill_stats(f.sp, &st);
	T_EQ(st.slots_used, 0);
	T_EQ(tenant_table_used(f.tt), 0);
	T_EQ(pool_pages_free_count(f.pool), free0);
	kvfix_stop(&f);
}

/* One decode step (APPEND_ATTEND) of layer l on session id: n tokens of k/v,
 * n_q queries at the last n_q positions; the result's status, the output
 * in out. */
static uint32_t step(struct kvfix *f, uint64_t id, uint32_t l, const float *k, const float *v, uint32_t n,
		     const float *q, uint32_t n_q, uint32_t len, float *out, struct dataop_res *r)
{
	struct dataop_ws ws = { 0 };
	struct session *s;
	int32_t pos[4];

	for (uint32_t i = 0; i < n_q; i++)
		pos[i] = (int32_t)(len + n - n_q + i);
	MUST(session_acquire(f->st, id, 0, &s) == 0);
	dataop_attend(f->ks, s, &ws, l, k, v, n, q, pos, n_q, TQ_DTYPE_F32, out, r);
	session_release(s);
	dataop_ws_free(&ws);
	return r->status;
}

/* One APPEND of many tokens through a K/V transform on a GPU-like pool:
 * transformed in passes of DATAOP_XF_PASS_BYTES (not one buffer of the
 * whole append: a client's huge APPEND would make the daemon allocate as
 * much before its budget is checked), each pass one append of the pool's;
 * the attention the host pool's bits; a NaN in a later pass names its
 * token counted from the APPEND's first, as on the host pool, and leaves
 * the layer and the tenant's bytes as they were. */
static void test_device_transform_passes(void)
{
	enum { NKV = 2, D = 64, N = 9000, BAD = 5000, PRE = 100 };
	const struct session_geom gx = { 1, NKV, 4, D, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 10000, TQ_XF_DEFAULT };
	const uint32_t per_pass = (uint32_t)(DATAOP_XF_PASS_BYTES / (2 * NKV * D * sizeof(float)));
	static float host[4 * 4 * D], out[4 * 4 * D];
	float *k = malloc(sizeof(float) * N * NKV * D), *v = malloc(sizeof(float) * N * NKV * D);
	uint32_t detail[2] = { 0, 0 };

	T_ASSERT(k && v);
	T_ASSERT(N > 2 * per_pass && BAD > per_pass && BAD < 2 * per_pass);
	for (int dev = 0; dev < 2; dev++) {
		struct kvfix f;
		struct session_info si;
		struct session *s;
		struct dataop_res r;
		struct devsim_stats d0, d1;
		char why[200];

		kvfix_backend = dev ? &backend_devsim : NULL;
		fix_start(&f, 64);
		kvfix_backend = NULL;
		T_EQ(pool_has_kernels(f.pool), dev);
		/* a calibrated layer (its first tokens), then one big APPEND */
		T_ASSERT(session_open(f.st, tenant_find(f.tt, "t"), "", 1000, &gx, 77, 0, 0, &si, why, sizeof(why)) == 0);
		T_ASSERT(session_acquire(f.st, si.id, 0, &s) == 0);
		uint64_t seed = 5;
		for (size_t i = 0; i < (size_t)N * NKV * D; i++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			k[i] = (float)(seed >> 40) / (float)(1 << 24) - 0.5f + (i % D == 3 ? 2.0f : 0.0f);
			v[i] = (float)(seed >> 20 & 0xfffff) / (float)(1 << 20) - 0.5f;
		}
		dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, PRE, &r);
		T_EQ(r.status, TQKV_ST_OK);
		uint64_t used = tenant_table_used(f.tt);
		/* a NaN in the second pass: nothing of the APPEND stays */
		v[(size_t)BAD * NKV * D + D + 7] = NAN;
		devsim_stats(&d0);
		dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, N, &r);
		T_EQ(r.status, TQKV_ST_NONFINITE);
		detail[dev] = r.detail;
		T_EQ(r.n_tokens, PRE);
		T_EQ(tenant_table_used(f.tt), used);
		v[(size_t)BAD * NKV * D + D + 7] = 0.25f;
		dataop_append(f.ks, s, 0, k, v, TQ_DTYPE_F32, N, &r);
		T_EQ(r.status, TQKV_ST_OK);
		T_EQ(r.n_tokens, PRE + N);
		devsim_stats(&d1);
		if (dev) /* two passes up to the NaN's, then all three */
			T_EQ(d1.appends - d0.appends, 2 + (N + per_pass - 1) / per_pass);
		session_release(s);
		T_EQ(attend(&f, si.id, 0, PRE + N, dev ? out : host, &r), 4);
		if (dev && memcmp(out, host, sizeof(out)))
			T_FAIL("the GPU-like pool's attention differs from the host pool's");
		T_EQ(session_close(f.st, si.id, NULL), 0);
		kvfix_stop(&f);
	}
	T_EQ(detail[0], BAD);
	T_EQ(detail[1], BAD);
	free(k);
	free(v);
}

/* One layer's decode step on a device pool: APPEND_ATTEND runs as one
 * call of the backend's (pool_append_attend; on a GPU the attention is
 * queued behind the append).  The answers and lengths are a host pool's,
 * bit for bit; a bad token fails the step with nothing appended; an
 * attention that fails after a good append keeps the tokens, as on the
 * CPU, and the layer goes on. */
static void test_device_decode_steps(void)
{
	struct kvfix hf, df;
	struct dataop_res hr, dr;
	struct devsim_stats ds0, ds1;
	struct pool_kernel_stats pk0, pk1;
	static float k[3 * 2 * 64], v[3 * 2 * 64], q[2 * 4 * 64], hout[4 * 4 * 64], dout[4 * 4 * 64];
	uint32_t len[3] = { 300, 300, 300 };
	uint64_t rs = 0x5eed;

	fix_start(&hf, 64);
	kvfix_backend = &backend_devsim;
	fix_start(&df, 64);
	kvfix_backend = NULL;
	T_ASSERT(pool_has_append_attend(df.pool) && !pool_has_append_attend(hf.pool));
	uint64_t hid = open_filled(&hf, len[0], 41), did = open_filled(&df, len[0], 41);
	devsim_stats(&ds0);
	pool_kernel_stats(df.pool, &pk0);
	T_EQ(pk0.appends, 3); /* open_filled's, a layer each */
	for (int i = 0; i < 12; i++) {
		const uint32_t l = (uint32_t)i % 3, n = i % 4 == 3 ? 3 : 1, n_q = i % 5 == 4 ? 2 : 1;
		for (size_t j = 0; j < sizeof(k) / sizeof(k[0]); j++) {
			rs = rs * 6364136223846793005ull + 1442695040888963407ull;
			k[j] = (float)(rs >> 40) / (float)(1 << 24) - 0.5f;
			v[j] = (float)(rs >> 20 & 0xfffff) / (float)(1 << 20) - 0.5f;
		}
		for (size_t j = 0; j < sizeof(q) / sizeof(q[0]); j++)
			q[j] = (float)(((size_t)i * 131 + j * 37) % 101) / 50.0f - 1.0f;
		T_EQ(step(&hf, hid, l, k, v, n, q, n_q, len[l], hout, &hr), TQKV_ST_OK);
		T_EQ(step(&df, did, l, k, v, n, q, n_q, len[l], dout, &dr), TQKV_ST_OK);
		T_EQ(dr.n_tokens, len[l] + n);
		T_EQ(hr.n_tokens, dr.n_tokens);
		T_ASSERT(memcmp(hout, dout, (size_t)n_q * 4 * 64 * sizeof(float)) == 0);
		len[l] += n;
	}
	devsim_stats(&ds1);
	T_EQ(ds1.append_attends - ds0.append_attends, 12);
	T_EQ(ds1.appends - ds0.appends, 12);
	T_EQ(ds1.attends - ds0.attends, 12);
	/* the pool's counters (tqctl stats) */
	pool_kernel_stats(df.pool, &pk1);
	T_EQ(pk1.steps - pk0.steps, 12);
	T_EQ(pk1.steps_one_wait - pk0.steps_one_wait, 12);
	T_EQ(pk1.appends - pk0.appends, 0);
	T_EQ(pk1.attends - pk0.attends, 0);
	T_EQ(pk1.failures, 0);
	T_ASSERT(pk1.gpu_us >= pk0.gpu_us);

	/* a NaN in token 1's V: the step fails, nothing is appended (the
	 * attention ran over the slots, as a queued GPU append's does) */
	v[1 * 2 * 64 + 64 + 9] = NAN;
	T_EQ(step(&df, did, 0, k, v, 2, q, 1, len[0], dout, &dr), TQKV_ST_NONFINITE);
	T_EQ(dr.detail, 1);
	T_EQ(dr.n_tokens, len[0]);
	v[1 * 2 * 64 + 64 + 9] = 0.25f;
	/* the layer goes on as if the step never came */
	T_EQ(step(&hf, hid, 0, k, v, 2, q, 1, len[0], hout, &hr), TQKV_ST_OK);
	T_EQ(step(&df, did, 0, k, v, 2, q, 1, len[0], dout, &dr), TQKV_ST_OK);
	T_ASSERT(memcmp(hout, dout, 4 * 64 * sizeof(float)) == 0);
	len[0] += 2;

	T_EQ(attend(&hf, hid, 1, len[1], hout, &hr), 4);
	T_EQ(attend(&df, did, 1, len[1], dout, &dr), 4);
	T_ASSERT(memcmp(hout, dout, 4 * 4 * 64 * sizeof(float)) == 0);
	/* the attention fails after a good append: the step's error, the
	 * token kept (the CQE's length says so) */
	devsim_fail_attend(1);
	T_EQ(step(&df, did, 1, k, v, 1, q, 1, len[1], dout, &dr), TQKV_ST_INTERNAL);
	T_ASSERT(strstr(dr.msg, "injected"));
	T_EQ(dr.n_tokens, len[1] + 1);
	devsim_fail_attend(0);
	struct session *s;
	MUST(session_acquire(hf.st, hid, 0, &s) == 0);
	dataop_append(hf.ks, s, 1, k, v, TQ_DTYPE_F32, 1, &hr);
	session_release(s);
	T_EQ(hr.status, TQKV_ST_OK);
	len[1] += 1;
	T_EQ(attend(&hf, hid, 1, len[1], hout, &hr), 4);
	T_EQ(attend(&df, did, 1, len[1], dout, &dr), 4);
	T_ASSERT(memcmp(hout, dout, 4 * 4 * 64 * sizeof(float)) == 0);
	/* two failed steps (the NaN, the injected failure), one good; only
	 * the device's failure counts as one (a client's NaN is refused input) */
	pool_kernel_stats(df.pool, &pk0);
	T_EQ(pk0.steps - pk1.steps, 3);
	T_EQ(pk0.steps_one_wait - pk1.steps_one_wait, 1);
	T_EQ(pk0.failures, 1);
	T_EQ(pk0.attends - pk1.attends, 2); /* the ATTENDs just now */
	struct pool_kernel_stats hk;
	pool_kernel_stats(hf.pool, &hk); /* a host pool: none */
	T_ASSERT(hk.appends == 0 && hk.attends == 0 && hk.steps == 0 && hk.gpu_us == 0);

	T_EQ(session_close(hf.st, hid, NULL), 0);
	T_EQ(session_close(df.st, did, NULL), 0);
	kvfix_stop(&hf);
	kvfix_stop(&df);
}

/* The device fails for good (a CUDA context lost to a sticky error; devsim
 * plays it): attention and append fail with DEVICE_LOST, -ENOTRECOVERABLE
 * and the device's reason, the append adds nothing, and pool_lost reports
 * it (tqkvd's main loop then stops the daemon, for systemd to restart it). */
static void test_device_lost(void)
{
	struct kvfix f;
	struct session *s;
	struct dataop_res r;
	static float out[4 * 4 * 64], kv[2 * 64];
	char why[512];
	const uint32_t tokens = 200;
	static const char reason[] = "CUDA device 0 failed (attention: kernels: an illegal memory access was "
				     "encountered, cudaErrorIllegalAddress): its context is lost";

	kvfix_backend = &backend_devsim;
	fix_start(&f, 64);
	kvfix_backend = NULL;
	uint64_t id = open_filled(&f, tokens, 7);
	T_EQ(attend(&f, id, 0, tokens, out, &r), 4);
	T_ASSERT(!pool_lost(f.pool, why, sizeof(why)));
	devsim_lose(reason);
	T_ASSERT(pool_lost(f.pool, why, sizeof(why)));
	T_ASSERT(strcmp(why, reason) == 0);
	T_EQ(attend(&f, id, 1, tokens, out, &r), -ENOTRECOVERABLE);
	T_EQ(r.status, TQKV_ST_DEVICE_LOST);
	T_ASSERT(strstr(r.msg, reason) != NULL);
	T_ASSERT(strstr(tqkv_status_str(r.status), "GPU failed") != NULL);
	MUST(session_acquire(f.st, id, 0, &s) == 0);
	dataop_append(f.ks, s, 2, kv, kv, TQ_DTYPE_F32, 1, &r);
	session_release(s);
	T_EQ(r.res, -ENOTRECOVERABLE);
	T_EQ(r.status, TQKV_ST_DEVICE_LOST);
	T_EQ(r.n_tokens, tokens); /* nothing added */
	T_ASSERT(strstr(r.msg, reason) != NULL);
	/* a decode step (APPEND_ATTEND: one call of the pool's) as well */
	static float q[4 * 64];
	T_EQ(step(&f, id, 2, kv, kv, 1, q, 1, tokens, out, &r), TQKV_ST_DEVICE_LOST);
	T_EQ(r.res, -ENOTRECOVERABLE);
	T_EQ(r.n_tokens, tokens);
	T_ASSERT(strstr(r.msg, reason) != NULL);
	devsim_lose(NULL);
	T_EQ(session_close(f.st, id, NULL), 0);
	kvfix_stop(&f);
}

int main(void)
{
	T_RUN(test_spill_restore_exact);
	T_RUN(test_faults);
	T_RUN(test_readahead);
	T_RUN(test_slow_disk);
	T_RUN(test_device_tier);
	T_RUN(test_device_decode_steps);
	T_RUN(test_device_transform_passes);
	T_RUN(test_device_lost);
	return t_done();
}
