/* test_persist — persistent sessions' files (daemon/persist.c): manifests
 * round-trip and refuse every damaged byte, journals replay up to a torn or
 * foreign record and never beyond.
 *
 * The same binary is the client of tests/integration/persist.sh
 * (`--client MODE DIR ...`, through libtqkv against a real tqkvd):
 *   fill DIR NAME SECONDS LOG  open (or re-attach) persistent session NAME and
 *                              append to both layers until SECONDS pass or
 *                              the daemon dies; after every completed append
 *                              attend at the new last position and log
 *                              (layer, length, output bits) to LOG
 *   verify DIR NAME LOG        after a restart: re-attach by name; every
 *                              layer holds at least the tokens LOG says
 *                              completed; truncated to that length, attention
 *                              at its last position equals LOG's bits
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "dataop_internal.h"
#include "devsim.h"
#include "harness.h"
#include "kvfix.h"
#include "kvpersist.h"
#include "persist.h"
#include "spill.h"
#include "tq_cuda.h"
#include "tq_xform.h"
#include "tqkv.h"
#include "tqkv_ring.h"

/* ---- unit: manifests ------------------------------------------------------- */
/* Layer 0's transform statistics in the sample: bytes only (persist.c does
 * not parse them), the size of a K-centering blob of 2 heads x 64. */
#define XF_SAMPLE_BYTES (32u + 2u * 64u * 4u)
static uint8_t xf_sample[XF_SAMPLE_BYTES];

static void sample_manifest(struct persist_manifest *m, struct persist_layer *L, struct persist_page *pg)
{
	memset(m, 0, sizeof(*m));
	m->id = 42;
	snprintf(m->tenant, sizeof(m->tenant), "prod");
	snprintf(m->name, sizeof(m->name), "chat-1");
	m->owner_uid = 1000;
	m->geom = (struct session_geom){ .n_layers = 2, .n_kv_heads = 2, .n_q_heads = 4, .head_dim = 64,
					 .k_codec = TQ_CODEC_TQ4, .v_codec = TQ_CODEC_TQ3, .max_tokens = 4096,
					 .kv_xform = TQ_XF_DEFAULT };
	m->seed = 0x1234567890abcdefull;
	m->created_ms = 1700000000000ull;
	m->page_bytes = 65536;
	m->page_tokens = 240;
	m->layout_id = 1;
	m->slot_bytes = 65536 + 4096;
	m->epoch = 7;
	m->gen_next = 99;
	for (int i = 0; i < 3; i++)
		pg[i] = (struct persist_page){ .slot = (uint64_t)(10 + i), .gen = (uint64_t)(50 + i) };
	pg[2].slot = PERSIST_SLOT_LOST;
	L[0] = (struct persist_layer){ .n_tokens = 300, .n_pages = 2, .pages = pg };
	L[1] = (struct persist_layer){ .n_tokens = 100, .n_pages = 1, .pages = pg + 2 };
	for (uint32_t i = 0; i < XF_SAMPLE_BYTES; i++)
		xf_sample[i] = (uint8_t)(i * 7 + 3);
	L[0].xf = xf_sample;
	L[0].xf_bytes = XF_SAMPLE_BYTES;
	m->layers = L;
}

/* After editing an encoded manifest: its length field and checksum. */
static void reseal(uint8_t *b, size_t len)
{
	for (int i = 0; i < 8; i++)
		b[16 + i] = (uint8_t)((uint64_t)len >> (8 * i));
	memset(b + 12, 0, 4);
	uint32_t crc = tq_crc32c(0, b, len);
	for (int i = 0; i < 4; i++)
		b[12 + i] = (uint8_t)(crc >> (8 * i));
}

static void test_manifest_roundtrip(void)
{
	struct persist_manifest m, d;
	struct persist_layer L[2];
	struct persist_page pg[3];
	char why[256];
	size_t len;

	sample_manifest(&m, L, pg);
	uint8_t *b = persist_manifest_encode(&m, &len);
	T_ASSERT(b);
	T_EQ(len, PERSIST_MAN_HDR + 2 * 8 + 3 * 16 + 2 * 4 + XF_SAMPLE_BYTES);
	T_EQ(persist_manifest_decode(b, len, &d, why, sizeof(why)), 0);
	T_EQ(d.format, PERSIST_FORMAT);
	T_EQ(d.page_tokens, 240);
	T_EQ(d.geom.kv_xform, TQ_XF_DEFAULT);
	T_EQ(d.layers[0].xf_bytes, XF_SAMPLE_BYTES);
	T_ASSERT(d.layers[0].xf && !memcmp(d.layers[0].xf, xf_sample, XF_SAMPLE_BYTES));
	T_EQ(d.layers[1].xf_bytes, 0);
	T_ASSERT(!d.layers[1].xf);
	T_EQ(d.id, 42);
	T_ASSERT(!strcmp(d.tenant, "prod") && !strcmp(d.name, "chat-1"));
	T_EQ(d.owner_uid, 1000);
	T_EQ(d.geom.n_layers, 2);
	T_EQ(d.geom.head_dim, 64);
	T_EQ(d.geom.k_codec, TQ_CODEC_TQ4);
	T_EQ(d.geom.v_codec, TQ_CODEC_TQ3);
	T_EQ(d.geom.max_tokens, 4096);
	T_ASSERT(d.seed == m.seed && d.epoch == 7 && d.gen_next == 99 && d.slot_bytes == m.slot_bytes);
	T_EQ(d.layers[0].n_tokens, 300);
	T_EQ(d.layers[1].pages[0].slot, (long long)PERSIST_SLOT_LOST);
	T_EQ(d.layers[0].pages[1].gen, 51);
	persist_manifest_free(&d);
	free(b);
}

/* Every single damaged byte, and every truncation, is refused. */
static void test_manifest_damage(void)
{
	struct persist_manifest m, d;
	struct persist_layer L[2];
	struct persist_page pg[3];
	char why[256];
	size_t len;

	sample_manifest(&m, L, pg);
	uint8_t *b = persist_manifest_encode(&m, &len);
	T_ASSERT(b);
	for (size_t i = 0; i < len; i++) {
		for (int bit = 0; bit < 8; bit += 3) {
			b[i] ^= (uint8_t)(1u << bit);
			int r = persist_manifest_decode(b, len, &d, why, sizeof(why));
			b[i] ^= (uint8_t)(1u << bit);
			if (r == 0) {
				persist_manifest_free(&d);
				T_FAIL("byte %zu bit %d flipped: accepted", i, bit);
			}
		}
	}
	for (size_t n = 0; n < len; n++)
		if (persist_manifest_decode(b, n, &d, why, sizeof(why)) == 0) {
			persist_manifest_free(&d);
			T_FAIL("truncated to %zu bytes: accepted", n);
		}
	/* a valid checksum over nonsense counts is still refused */
	b[92] = 0xff; /* n_layers */
	b[12] = b[13] = b[14] = b[15] = 0;
	T_ASSERT(persist_manifest_decode(b, len, &d, why, sizeof(why)) < 0);
	free(b);
}

/* Format 1 (before transforms): no mode, no statistics; still read. */
static void test_manifest_v1(void)
{
	struct persist_manifest m, d;
	struct persist_layer L[2];
	struct persist_page pg[3];
	char why[256];
	size_t len;

	sample_manifest(&m, L, pg);
	m.geom.kv_xform = 0;
	L[0].xf = NULL;
	L[0].xf_bytes = 0;
	uint8_t *b = persist_manifest_encode(&m, &len);
	T_ASSERT(b);
	/* format 2 with nothing to add is format 1 and two zero lengths */
	T_EQ(len, PERSIST_MAN_HDR + 2 * 8 + 3 * 16 + 2 * 4);
	len -= 2 * 4;
	b[8] = 1;
	memset(b + 244, 0, 4); /* format 3's tokens a page */
	reseal(b, len);
	T_EQ(persist_manifest_decode(b, len, &d, why, sizeof(why)), 0);
	T_EQ(d.format, 1);
	T_EQ(d.page_tokens, 0);
	T_EQ(d.geom.kv_xform, 0);
	T_EQ(d.layers[0].n_tokens, 300);
	T_EQ(d.layers[0].pages[1].gen, 51);
	T_ASSERT(!d.layers[0].xf_bytes && !d.layers[1].xf_bytes && !d.layers[0].xf);
	/* what it encodes to is format 3, and reads back the same */
	size_t len2;
	uint8_t *b2 = persist_manifest_encode(&d, &len2);
	persist_manifest_free(&d);
	T_ASSERT(b2);
	T_EQ(persist_manifest_decode(b2, len2, &d, why, sizeof(why)), 0);
	T_EQ(d.format, PERSIST_FORMAT);
	T_EQ(d.layers[1].pages[0].slot, (long long)PERSIST_SLOT_LOST);
	persist_manifest_free(&d);
	free(b2);
	/* format 1 has no mode field: a byte there is damage */
	b[240] = 1;
	reseal(b, len);
	T_ASSERT(persist_manifest_decode(b, len, &d, why, sizeof(why)) == -EBADMSG);
	b[240] = 0;
	/* nor statistics: bytes after the pages are refused */
	uint8_t *b3 = calloc(1, len + 8);
	T_ASSERT(b3);
	memcpy(b3, b, len);
	reseal(b3, len + 8);
	T_ASSERT(persist_manifest_decode(b3, len + 8, &d, why, sizeof(why)) == -EBADMSG);
	/* an unknown format */
	b[8] = 4;
	reseal(b, len);
	T_EQ(persist_manifest_decode(b, len, &d, why, sizeof(why)), -EPROTO);
	T_ASSERT(strstr(why, "format 4"));
	free(b3);
	free(b);
}

/* Statistics the geometry cannot have, or that run past the file, or a
 * session without transforms that has some: refused with a reason. */
static void test_manifest_xf_bounds(void)
{
	struct persist_manifest m, d;
	struct persist_layer L[2];
	struct persist_page pg[3];
	char why[256];
	size_t len;
	const uint32_t max = (uint32_t)persist_xf_max(2, 64);
	uint8_t *big = calloc(1, max + 4);

	T_ASSERT(big);
	T_EQ(max, 32 + 5 * 2 * 64 * 4);
	/* the fullest transform (every stored part, K order over tq4o keys)
	 * fits the bound */
	{
		struct tq_codec_params kp = { TQ_CODEC_TQ4O, 64, 1, TQ_ISA_AUTO };
		tq_codec *kc;
		tq_xf *xf;
		static float k[32 * 2 * 64], v[32 * 2 * 64], q[32 * 4 * 64];
		for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
			k[i] = (float)((i * 7919) % 61) - 30.0f;
			v[i] = (float)((i * 104729) % 37) - 18.0f;
		}
		for (size_t i = 0; i < sizeof(q) / sizeof(q[0]); i++)
			q[i] = (float)((i * 31) % 17) - 8.0f;
		T_EQ(tq_codec_new(&kc, NULL, &kp, NULL), 0);
		T_EQ(tq_xf_new(&xf, TQ_XF_K_CENTER | TQ_XF_V_CENTER | TQ_XF_K_EQ_QK | TQ_XF_V_EQ | TQ_XF_K_ORDER |
				       TQ_XF_K_UNSHRINK, 2, 4, 64, kc, NULL), 0);
		T_EQ(tq_xf_calibrate(xf, k, v, q, 32, 32, TQ_DTYPE_F32), 0);
		T_EQ(tq_xf_applied(xf), TQ_XF_MASK & ~(uint32_t)(TQ_XF_K_SINK | TQ_XF_K_EQ_K));
		T_EQ(tq_xf_blob_bytes(xf), max);
		tq_xf_free(xf);
		tq_codec_free(kc);
	}
	sample_manifest(&m, L, pg);
	/* the largest allowed decodes */
	L[1].xf = big;
	L[1].xf_bytes = max;
	uint8_t *b = persist_manifest_encode(&m, &len);
	T_ASSERT(b);
	T_EQ(persist_manifest_decode(b, len, &d, why, sizeof(why)), 0);
	T_EQ(d.layers[1].xf_bytes, max);
	persist_manifest_free(&d);
	free(b);
	/* one more does not */
	L[1].xf_bytes = max + 1;
	b = persist_manifest_encode(&m, &len);
	T_ASSERT(b);
	why[0] = 0;
	T_EQ(persist_manifest_decode(b, len, &d, why, sizeof(why)), -EBADMSG);
	T_ASSERT(strstr(why, "layer 1") && strstr(why, "statistics"));
	free(b);
	/* a length beyond the file (checksum valid) */
	L[1].xf_bytes = 64;
	b = persist_manifest_encode(&m, &len);
	T_ASSERT(b);
	len -= 8;
	reseal(b, len);
	T_EQ(persist_manifest_decode(b, len, &d, why, sizeof(why)), -EBADMSG);
	free(b);
	/* statistics without a transform mode */
	L[1].xf_bytes = 0;
	m.geom.kv_xform = 0;
	b = persist_manifest_encode(&m, &len);
	T_ASSERT(b);
	T_EQ(persist_manifest_decode(b, len, &d, why, sizeof(why)), -EBADMSG);
	free(b);
	/* an unknown mode bit */
	L[0].xf_bytes = 0;
	m.geom.kv_xform = 0x100;
	b = persist_manifest_encode(&m, &len);
	T_ASSERT(b);
	T_EQ(persist_manifest_decode(b, len, &d, why, sizeof(why)), -EBADMSG);
	T_ASSERT(strstr(why, "transform mode"));
	free(b);
	/* a huge geometry cannot make the bound wrap */
	T_ASSERT(persist_xf_max(UINT32_MAX, UINT32_MAX) == UINT64_MAX);
	T_ASSERT(persist_xf_max(1024, 1024) == 32 + 20ull * 1024 * 1024);
	free(big);
}

/* persist_scan lists exactly the n ids of want (ascending); *si its info. */
static void scan_lists(int fd, const uint64_t *want, size_t n, struct persist_scan_info *si)
{
	uint64_t *ids;
	size_t got;

	T_EQ(persist_scan(fd, &ids, &got, si), 0);
	T_EQ(got, n);
	for (size_t i = 0; i < n && i < got; i++)
		T_EQ(ids[i], want[i]);
	free(ids);
}

/* Files: atomic write, read back, scan removes leftovers. */
static void test_manifest_files(void)
{
	char dir[] = "/tmp/tqp-XXXXXX", why[256], path[128];
	struct persist_manifest m, d;
	struct persist_layer L[2];
	struct persist_page pg[3];
	struct persist_scan_info si;
	int fd;

	T_ASSERT(mkdtemp(dir));
	fd = persist_dir_open(dir, why, sizeof(why));
	T_ASSERT(fd >= 0);
	sample_manifest(&m, L, pg);
	T_EQ(persist_manifest_write(fd, &m, why, sizeof(why)), 0);
	m.id = 7;
	T_EQ(persist_manifest_write(fd, &m, why, sizeof(why)), 0);
	snprintf(path, sizeof(path), "%s/sessions/9.tqm.tmp", dir);   /* an interrupted write */
	close(open(path, O_CREAT | O_WRONLY, 0600));
	snprintf(path, sizeof(path), "%s/sessions/8.tqj", dir);       /* a journal without a manifest */
	close(open(path, O_CREAT | O_WRONLY, 0600));
	scan_lists(fd, (const uint64_t[]){ 7, 42 }, 2, &si);
	T_EQ(si.removed, 2);
	T_EQ(si.max_aside, 0);
	T_EQ(si.closed, 0);
	T_EQ(persist_manifest_read(fd, 42, &d, why, sizeof(why)), 0);
	T_EQ(d.layers[0].n_pages, 2);
	persist_manifest_free(&d);
	/* 7.tqm holds id 7; renamed to 5.tqm it names another session: refused */
	char a[128], bpath[128];
	snprintf(a, sizeof(a), "%s/sessions/7.tqm", dir);
	snprintf(bpath, sizeof(bpath), "%s/sessions/5.tqm", dir);
	T_EQ(rename(a, bpath), 0);
	T_ASSERT(persist_manifest_read(fd, 5, &d, why, sizeof(why)) < 0);
	persist_set_aside(fd, 5);
	snprintf(a, sizeof(a), "%s/sessions/5.tqm.dropped", dir);
	T_EQ(access(a, F_OK), 0);
	T_EQ(persist_remove(fd, 42), 0);
	/* closed while in use, then a crash before the files went (the
	 * manifests are at epoch 7): 11 marked at epoch 7 and 13 at epoch 6
	 * (a checkpoint in flight then) go, manifest and journal with the
	 * mark; 12's mark alone goes too; 10 (unmarked) stays; 14's mark
	 * (epoch 5) is stale, the session ran on: the mark goes, 14 stays */
	for (uint64_t id = 10; id <= 14; id++) {
		if (id == 12)
			continue;
		m.id = id;
		T_EQ(persist_manifest_write(fd, &m, why, sizeof(why)), 0);
		int jfd = persist_journal_reset(fd, id, 7, why, sizeof(why));
		T_ASSERT(jfd >= 0);
		close(jfd);
	}
	T_EQ(persist_mark_closed(fd, 11, 7, why, sizeof(why)), 0);
	T_EQ(persist_mark_closed(fd, 12, 0, why, sizeof(why)), 0);
	T_EQ(persist_mark_closed(fd, 13, 6, why, sizeof(why)), 0);
	T_EQ(persist_mark_closed(fd, 14, 5, why, sizeof(why)), 0);
	scan_lists(fd, (const uint64_t[]){ 10, 14 }, 2, &si);
	T_EQ(si.closed, 3);
	T_EQ(si.closed_kept, 0);
	T_EQ(si.marks_stale, 1);
	T_EQ(si.max_aside, 14); /* a marked id is not handed out again */
	static const char *const gone[] = { "11.tqm", "11.tqj", "11.closed", "12.closed",
					    "13.tqm", "13.tqj", "13.closed", "14.closed" };
	for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++) {
		snprintf(a, sizeof(a), "%s/sessions/%s", dir, gone[i]);
		T_ASSERT(access(a, F_OK) < 0 && errno == ENOENT);
	}
	/* files that cannot be removed now (the directory's sync after the
	 * manifest's unlink fails): 10 is not listed, its mark stays, its id
	 * is not handed out; the next scan finishes it */
	T_EQ(persist_mark_closed(fd, 10, 7, why, sizeof(why)), 0);
	persist_fault_dirsync(1);
	scan_lists(fd, (const uint64_t[]){ 14 }, 1, &si);
	T_EQ(si.closed, 0);
	T_EQ(si.closed_kept, 1);
	T_EQ(si.max_aside, 10);
	snprintf(a, sizeof(a), "%s/sessions/10.closed", dir);
	T_EQ(access(a, F_OK), 0);
	scan_lists(fd, (const uint64_t[]){ 14 }, 1, &si);
	T_EQ(si.closed, 1);
	T_ASSERT(access(a, F_OK) < 0 && errno == ENOENT);
	T_EQ(persist_remove(fd, 14), 0);
	scan_lists(fd, NULL, 0, &si);
	T_EQ(si.closed, 0);
	T_EQ(si.max_aside, 5); /* 5.tqm.dropped: no new session may take id 5 */
	close(fd);
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	T_EQ(system(cmd), 0);
}

/* ---- unit: journals ---------------------------------------------------------- */
struct collect {
	uint32_t n;
	uint32_t firsts[16];
	uint8_t last_payload[64];
};

static int collect_fn(void *ctx, const struct persist_rec *r, const uint8_t *payload)
{
	struct collect *c = ctx;
	if (c->n < 16)
		c->firsts[c->n] = r->first;
	if (r->payload_bytes <= sizeof(c->last_payload))
		memcpy(c->last_payload, payload, r->payload_bytes);
	c->n++;
	return 0;
}

static void test_journal(void)
{
	char dir[] = "/tmp/tqj-XXXXXX", why[256], path[128];
	uint8_t pay[40];
	uint64_t off = PERSIST_JNL_HDR;
	struct collect c;
	uint32_t n;
	int dfd, jfd;

	T_ASSERT(mkdtemp(dir));
	dfd = persist_dir_open(dir, why, sizeof(why));
	T_ASSERT(dfd >= 0);
	jfd = persist_journal_reset(dfd, 3, 5, why, sizeof(why));
	T_ASSERT(jfd >= 0);
	for (uint32_t i = 0; i < 4; i++) {
		memset(pay, (int)i + 1, sizeof(pay));
		/* the first: a calibration (its payload the statistics) */
		struct persist_rec r = { .type = i ? PERSIST_REC_APPEND : PERSIST_REC_XFORM, .layer = 0,
					 .first = i * 2, .n = i ? 2 : 0, .payload_bytes = sizeof(pay), .seq = i,
					 .epoch = 5 };
		T_EQ(persist_journal_write(jfd, &off, &r, pay, 16, pay + 16, 24), 0);
	}
	memset(&c, 0, sizeof(c));
	T_EQ(persist_journal_replay(dfd, 3, 3, 5, collect_fn, &c, &n, why, sizeof(why)), 0);
	T_EQ(n, 4);
	T_EQ(c.firsts[3], 6);
	T_EQ(c.last_payload[39], 4);
	/* another epoch: the manifest has these already */
	memset(&c, 0, sizeof(c));
	T_EQ(persist_journal_replay(dfd, 3, 3, 6, collect_fn, &c, &n, why, sizeof(why)), 0);
	T_EQ(n, 0);
	/* a torn last record: the first three replay, not the fourth */
	T_EQ(ftruncate(jfd, (off_t)off - 5), 0);
	memset(&c, 0, sizeof(c));
	T_EQ(persist_journal_replay(dfd, 3, 3, 5, collect_fn, &c, &n, why, sizeof(why)), 0);
	T_EQ(n, 3);
	T_ASSERT(strstr(why, "torn") || strstr(why, "damaged") || strstr(why, "checksum"));
	/* a flipped byte in the second record's payload: only the first */
	uint8_t x;
	off_t second = PERSIST_JNL_HDR + PERSIST_REC_HDR + 40 + PERSIST_REC_HDR + 7;
	T_EQ(pread(jfd, &x, 1, second), 1);
	x ^= 0x10;
	T_EQ(pwrite(jfd, &x, 1, second), 1);
	memset(&c, 0, sizeof(c));
	T_EQ(persist_journal_replay(dfd, 3, 3, 5, collect_fn, &c, &n, why, sizeof(why)), 0);
	T_EQ(n, 1);
	/* a journal of another session is not replayed */
	T_EQ(persist_journal_replay(dfd, 3, 4, 5, collect_fn, &c, &n, why, sizeof(why)), 0);
	T_EQ(n, 0);
	/* far larger than memory (checkpoints that failed for hours; here
	 * 2 TiB, sparse): read a record at a time, the first replays and the
	 * flipped byte ends it as before.  (It was read whole: refused above
	 * 1 TiB, -ENOMEM or the OOM killer below.) */
	if (ftruncate(jfd, (off_t)2 << 40) == 0) {
		memset(&c, 0, sizeof(c));
		T_EQ(persist_journal_replay(dfd, 3, 3, 5, collect_fn, &c, &n, why, sizeof(why)), 0);
		T_EQ(n, 1);
		fprintf(stderr, "    2 TiB: %s\n", why);
		T_ASSERT(strstr(why, "record 1 at offset")); /* the flipped byte above */
	} else {
		fprintf(stderr, "    (no 2 TiB sparse file here: %s)\n", strerror(errno));
	}
	close(jfd);
	snprintf(path, sizeof(path), "rm -rf %s", dir);
	close(dfd);
	T_EQ(system(path), 0);
}

/* Mutations of a valid journal never crash the reader or replay a record
 * whose bytes changed. */
static void test_journal_fuzz(void)
{
	uint8_t buf[PERSIST_JNL_HDR + 3 * (PERSIST_REC_HDR + 16)];
	char dir[] = "/tmp/tqf-XXXXXX", why[256], path[128];
	uint64_t off = PERSIST_JNL_HDR, rs = t_seed();
	struct collect c;
	uint32_t n;
	int dfd, jfd;

	T_ASSERT(mkdtemp(dir));
	dfd = persist_dir_open(dir, why, sizeof(why));
	jfd = persist_journal_reset(dfd, 1, 1, why, sizeof(why));
	T_ASSERT(jfd >= 0);
	for (uint32_t i = 0; i < 3; i++) {
		uint8_t pay[16];
		memset(pay, 0x40 + (int)i, sizeof(pay));
		struct persist_rec r = { .type = PERSIST_REC_APPEND, .first = i, .n = 1, .payload_bytes = 16, .seq = i,
					 .epoch = 1 };
		T_EQ(persist_journal_write(jfd, &off, &r, pay, 16, NULL, 0), 0);
	}
	T_EQ(pread(jfd, buf, sizeof(buf), 0), (long)sizeof(buf));
	close(jfd);
	for (int it = 0; it < 20000; it++) {
		uint8_t m[sizeof(buf)];
		memcpy(m, buf, sizeof(m));
		rs = rs * 6364136223846793005ull + 1442695040888963407ull;
		size_t pos = (rs >> 33) % sizeof(m);
		m[pos] ^= (uint8_t)(1u << ((rs >> 20) & 7));
		size_t len = (it & 1) ? sizeof(m) : (rs >> 40) % (sizeof(m) + 1);
		memset(&c, 0, sizeof(c));
		persist_journal_replay_buf(m, len, 1, 1, collect_fn, &c, &n, why, sizeof(why));
		/* records before the damaged byte may replay, never the one holding it */
		size_t limit = pos < PERSIST_JNL_HDR ? 0 : (pos - PERSIST_JNL_HDR) / (PERSIST_REC_HDR + 16);
		if (n > limit)
			T_FAIL("iteration %d: byte %zu damaged, %u records replayed (at most %zu)", it, pos, n, limit);
	}
	snprintf(path, sizeof(path), "rm -rf %s", dir);
	close(dfd);
	T_EQ(system(path), 0);
}

/* ---- unit: restarts in-process (kvfix) ------------------------------------------ */
/* The geometry of these and of the integration client. */
#define L_N 2
#define KVH 2
#define QH 4
#define DIM 64

static float val_of(uint32_t tok, uint32_t layer, uint32_t h, uint32_t d, int kv)
{
	uint64_t x = ((uint64_t)tok * 1315423911u) ^ ((uint64_t)layer << 40) ^ ((uint64_t)h << 32) ^
		     ((uint64_t)d << 16) ^ (uint64_t)kv;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* A persistent session with K/V transforms, its tables torn down as a
 * SIGKILL leaves them and recovered from its files: each layer's transform
 * statistics come back exactly (from the manifest and from journaled
 * calibrations, with a truncation to 0 and a recalibration between), and
 * attention answers bit for bit as before. */
#define XPAGE (16u << 10)
#define XCONF "[pool]\npool_bytes = 16M\n[tenant t]\nlimit = 16M\nallow_uids = *\n"
#define MUST(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #x); exit(1); } } while (0)
static const struct session_geom XG = { .n_layers = 2, .n_kv_heads = 2, .n_q_heads = 4, .head_dim = 64,
					.k_codec = TQ_CODEC_TQ4O, .v_codec = TQ_CODEC_TQ3, .max_tokens = 4096,
					.kv_xform = TQ_XF_DEFAULT }; /* tq4o: K order stored too */

/* The fixture stopped and its directory removed: system()'s status. */
static int xfinish(struct kvfix *f)
{
	char cmd[128];

	kvfix_stop(f);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
	return system(cmd);
}

static void xpersist_up(struct kvfix *f)
{
	char why[512];
	uint64_t max_id;

	if (kvstore_persist_open(f->ks, f->dir, 3600000, why, sizeof(why)) < 0) {
		fprintf(stderr, "persistence: %s\n", why);
		exit(1);
	}
	MUST(kvstore_recover(f->ks, f->st, f->tt, &max_id) == 0);
}

/* A persistent session of geometry g in tenant t, acquired, its files
 * started (dataop_persist_init); si filled. */
static struct session *xopen(struct kvfix *f, const struct session_geom *g, const char *name, uint64_t seed,
			     struct session_info *si)
{
	struct session *s;
	char why[512];

	MUST(session_open(f->st, tenant_find(f->tt, "t"), name, 1000, g, seed, SESSION_PERSISTENT, 0, si, why,
			  sizeof(why)) == 0);
	MUST(session_acquire(f->st, si->id, 0, &s) == 0);
	MUST(dataop_persist_init(f->ks, s, why, sizeof(why)) == 0);
	return s;
}

/* A SIGKILL: nothing checkpointed, the files as they are; then a start. */
static void xcrash(struct kvfix *f)
{
	kvstore_persist_stop(f->ks, NULL);
	kvfix_restart(f);
	xpersist_up(f);
}

/* n tokens more on layer l (data set `gen`), calibrating an empty layer. */
static void xfill(struct kvfix *f, struct session *s, uint32_t l, uint32_t n, uint32_t gen)
{
	static float k[64 * KVH * DIM], v[64 * KVH * DIM], q[64 * QH * DIM];
	struct dataop_res r;
	struct session_info si;

	MUST(n <= 64);
	MUST(session_get_info(f->st, session_id(s), &si) == 0);
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t h = 0; h < QH; h++)
			for (uint32_t d = 0; d < DIM; d++) {
				/* keys with a channel offset (what centering removes) */
				if (h < KVH) {
					k[(t * KVH + h) * DIM + d] = val_of(t + 100 * gen, l, h, d, 0) + 0.02f * (float)d;
					v[(t * KVH + h) * DIM + d] = val_of(t + 100 * gen, l, h, d, 1);
				}
				q[(t * QH + h) * DIM + d] = val_of(t + 100 * gen, l, h, d, 2) * (1.0f + (float)(d % 7));
			}
	/* APPEND_ATTEND, as a prefill: an empty layer calibrates from these
	 * keys, values and queries (dataop.c) and journals the statistics */
	struct kv_sess *kv;
	struct dataop_ws ws = { 0 };
	static float out[64 * QH * DIM];
	int32_t pos[64];
	MUST(dataop_kv_get(f->ks, s, &kv) == 0);
	for (uint32_t t = 0; t < n; t++)
		pos[t] = (int32_t)(kv->layer[l].n_tokens + t);
	dataop_attend(f->ks, s, &ws, l, k, v, n, q, pos, n, TQ_DTYPE_F32, out, &r);
	dataop_ws_free(&ws);
	MUST(r.status == TQKV_ST_OK);
}

struct xsnap {
	uint32_t n_tokens[2], xb[2];
	uint8_t blob[2][4096];
	float out[2][4 * QH * DIM];
};

static void xsnapshot(struct kvfix *f, uint64_t id, struct xsnap *sn)
{
	struct dataop_ws ws = { 0 };
	struct dataop_res r;
	struct session *s;
	struct kv_sess *kv;
	float q[4 * QH * DIM];

	memset(sn, 0, sizeof(*sn));
	for (int i = 0; i < 4 * QH * DIM; i++)
		q[i] = val_of(5, 77, 0, (uint32_t)i, 3);
	MUST(session_acquire(f->st, id, 0, &s) == 0);
	MUST(dataop_kv_get(f->ks, s, &kv) == 0);
	for (uint32_t l = 0; l < 2; l++) {
		pthread_mutex_lock(&kv->lock);
		sn->n_tokens[l] = kv->layer[l].n_tokens;
		if (kv->layer[l].xf) {
			sn->xb[l] = (uint32_t)tq_xf_blob_bytes(kv->layer[l].xf);
			MUST(sn->xb[l] <= sizeof(sn->blob[l]));
			tq_xf_blob_write(kv->layer[l].xf, sn->blob[l]);
		}
		pthread_mutex_unlock(&kv->lock);
		if (!sn->n_tokens[l])
			continue;
		int32_t n = (int32_t)sn->n_tokens[l], pos[4] = { 0, n / 3, n / 2, n - 1 };
		dataop_attend(f->ks, s, &ws, l, NULL, NULL, 0, q, pos, 4, TQ_DTYPE_F32, sn->out[l], &r);
		MUST(r.status == TQKV_ST_OK);
	}
	session_release(s);
	dataop_ws_free(&ws);
}

static void xsame(const struct xsnap *a, const struct xsnap *b)
{
	for (uint32_t l = 0; l < 2; l++) {
		T_EQ(b->n_tokens[l], a->n_tokens[l]);
		T_EQ(b->xb[l], a->xb[l]);
		if (memcmp(b->blob[l], a->blob[l], a->xb[l]))
			T_FAIL("layer %u: the transform's statistics differ after the restart", l);
		if (memcmp(b->out[l], a->out[l], sizeof(a->out[l])))
			T_FAIL("layer %u: attention differs after the restart", l);
	}
}

static void test_xform_restart(void)
{
	struct kvfix f;
	struct session_info si;
	struct session *s;
	struct dataop_res r;
	static struct xsnap a, b, c;
	uint8_t first1[4096];
	uint32_t first1_bytes;
	char why[512];

	kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
	xpersist_up(&f);
	s = xopen(&f, &XG, "xf", 77, &si);
	xfill(&f, s, 0, 40, 0);
	xfill(&f, s, 1, 30, 0);
	xfill(&f, s, 0, 5, 0);
	session_release(s);
	xsnapshot(&f, si.id, &a);
	T_ASSERT(a.xb[0] > 32 && a.xb[1] > 32); /* statistics applied, not the identity */
	first1_bytes = a.xb[1];
	memcpy(first1, a.blob[1], first1_bytes);
	/* from the journal alone (the manifest is the empty session's) */
	xcrash(&f);
	xsnapshot(&f, si.id, &b);
	xsame(&a, &b);

	/* the statistics in a manifest; then, journaled after it, layer 1
	 * emptied and calibrated afresh from other data, layer 0 grown */
	MUST(session_acquire(f.st, si.id, 0, &s) == 0);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
	dataop_truncate(f.ks, s, 1, 0, 0, &r);
	T_EQ(r.status, TQKV_ST_OK);
	xfill(&f, s, 1, 20, 1);
	xfill(&f, s, 0, 10, 0);
	session_release(s);
	xsnapshot(&f, si.id, &a);
	T_ASSERT(a.xb[1] != first1_bytes || memcmp(a.blob[1], first1, first1_bytes));
	xcrash(&f);
	xsnapshot(&f, si.id, &b);
	xsame(&a, &b);
	/* recovery checkpointed what it replayed: from the manifest alone */
	xcrash(&f);
	xsnapshot(&f, si.id, &c);
	xsame(&a, &c);

	/* emptied and not refilled: uncalibrated after a restart (the next
	 * append calibrates it) */
	MUST(session_acquire(f.st, si.id, 0, &s) == 0);
	dataop_truncate(f.ks, s, 1, 0, 0, &r);
	session_release(s);
	xcrash(&f);
	xsnapshot(&f, si.id, &b);
	T_EQ(b.n_tokens[1], 0);
	T_EQ(b.xb[1], 0);
	T_EQ(b.n_tokens[0], a.n_tokens[0]);
	T_ASSERT(!memcmp(b.out[0], a.out[0], sizeof(a.out[0])));
	T_EQ(session_close(f.st, si.id, NULL), 0);
	T_EQ(xfinish(&f), 0);
}

/* A checkpoint that keeps failing (every spill write fails) is retried
 * with a growing delay — 2, 4, 8, 16 intervals — not at every tick of the
 * persist thread (nor, with a journal past 64 MiB, at every append: the
 * log said so thousands of times a second).  Once writes work again, the
 * next try succeeds. */
static void test_checkpoint_backoff(void)
{
	struct kvfix f;
	struct session_info si;
	struct session *s;
	struct kvpersist_stats ps;
	uint64_t max_id;
	char why[512];

	kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
	MUST(kvstore_persist_open(f.ks, f.dir, 50, why, sizeof(why)) == 0); /* every 50 ms */
	MUST(kvstore_recover(f.ks, f.st, f.tt, &max_id) == 0);
	s = xopen(&f, &XG, "bo", 79, &si);
	xfill(&f, s, 0, 40, 0);
	session_release(s);
	kvstore_persist_stats(f.ks, &ps);
	const uint64_t c0 = ps.checkpoints; /* the empty session's, at its start */
	spill_fault_arm_n(f.sp, SPILL_FAULT_WRITE, 1, 1u << 30, -EIO);
	T_EQ(kvstore_persist_start(f.ks, f.st), 0);
	usleep(1300 * 1000);
	kvstore_persist_stats(f.ks, &ps);
	fprintf(stderr, "    %" PRIu64 " checkpoints failed in 1.3 s (every 50 ms: 26)\n", ps.checkpoint_failures);
	T_ASSERT(ps.checkpoint_failures >= 2 && ps.checkpoint_failures <= 5); /* at 0.05, 0.15, 0.35, 0.75 s */
	spill_fault_arm_n(f.sp, SPILL_FAULT_WRITE, 0, 0, 0);
	const uint64_t failed = ps.checkpoint_failures;
	for (int i = 0; i < 100 && ps.checkpoints == c0; i++) { /* the next try, at 1.55 s */
		usleep(50 * 1000);
		kvstore_persist_stats(f.ks, &ps);
	}
	T_EQ(ps.checkpoints, c0 + 1);
	T_EQ(ps.checkpoint_failures, failed);
	kvstore_persist_stop(f.ks, NULL);
	T_EQ(session_close(f.st, si.id, NULL), 0);
	T_EQ(xfinish(&f), 0);
}

/* Out of memory while replaying a journaled calibration says nothing of
 * the record: the session is not served in that run and its files stay as
 * they are; the next start brings it back whole.  (The failure was taken
 * for a damaged record: replay stopped there and the journal was reset,
 * and the acknowledged appends after it were gone for good.) */
static void test_replay_nomem_keeps(void)
{
	struct kvfix f;
	struct session_info si, got;
	struct session *s;
	struct kvpersist_stats ps;
	static struct xsnap a, b;

	kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
	xpersist_up(&f);
	s = xopen(&f, &XG, "nomem", 78, &si);
	xfill(&f, s, 0, 40, 0); /* calibrates: a transform record, then the appends */
	xfill(&f, s, 1, 30, 0);
	session_release(s);
	xsnapshot(&f, si.id, &a);
	kvstore_fault_xf_new(1);
	xcrash(&f);
	kvstore_fault_xf_new(0);
	T_EQ(session_get_info(f.st, si.id, &got), -ENOENT); /* not served in this run */
	kvstore_persist_stats(f.ks, &ps);
	T_EQ(ps.restored, 0);
	T_EQ(ps.dropped, 0);
	xcrash(&f);
	kvstore_persist_stats(f.ks, &ps);
	T_EQ(ps.restored, 1);
	xsnapshot(&f, si.id, &b);
	xsame(&a, &b);
	T_EQ(session_close(f.st, si.id, NULL), 0);
	T_EQ(xfinish(&f), 0);
}

/* Two persistent sessions, the first with journaled tokens after its last
 * checkpoint: at the restart its replay checkpoints, and that checkpoint
 * writes pages to free slots.  Every manifest's slots are claimed before
 * any replay (kvstore_recover's two passes), so it cannot take a slot the
 * second session's manifest names: both come back, bit for bit.  (One
 * pass, manifest by manifest, dropped the second: "names spill slot N,
 * which another page names too"; the GPU pool's chaos soak found it.) */
static void test_recover_two_sessions(void)
{
	struct kvfix f;
	struct session_info sa, sb;
	struct session *s;
	struct kvpersist_stats ps;
	static struct xsnap a0, b0, a1, b1;
	char why[512];

	kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
	xpersist_up(&f);
	T_EQ(session_open(f.st, tenant_find(f.tt, "t"), "a", 1000, &XG, 71, SESSION_PERSISTENT, 0, &sa, why,
			  sizeof(why)), 0);
	T_EQ(session_open(f.st, tenant_find(f.tt, "t"), "b", 1000, &XG, 72, SESSION_PERSISTENT, 0, &sb, why,
			  sizeof(why)), 0);
	T_ASSERT(sa.id < sb.id);
	/* a's pages in the first slots, b's in the next ones */
	const uint64_t ids[2] = { sa.id, sb.id };
	for (uint32_t k = 0; k < 2; k++) {
		MUST(session_acquire(f.st, ids[k], 0, &s) == 0);
		T_EQ(dataop_persist_init(f.ks, s, why, sizeof(why)), 0);
		xfill(&f, s, 0, 60, k);
		xfill(&f, s, 1, 60, k);
		T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
		session_release(s);
	}
	/* a grows after its checkpoint: only its journal has these */
	MUST(session_acquire(f.st, sa.id, 0, &s) == 0);
	xfill(&f, s, 0, 50, 2);
	xfill(&f, s, 1, 50, 2);
	session_release(s);
	xsnapshot(&f, sa.id, &a0);
	xsnapshot(&f, sb.id, &b0);
	xcrash(&f);
	kvstore_persist_stats(f.ks, &ps);
	T_EQ(ps.restored, 2);
	T_EQ(ps.dropped, 0);
	xsnapshot(&f, sa.id, &a1);
	xsnapshot(&f, sb.id, &b1);
	xsame(&a0, &a1);
	xsame(&b0, &b1);
	/* and again, from what the replay checkpointed */
	xcrash(&f);
	kvstore_persist_stats(f.ks, &ps);
	T_ASSERT(ps.restored == 2 && ps.dropped == 0);
	xsnapshot(&f, sb.id, &b1);
	xsame(&b0, &b1);
	T_EQ(session_close(f.st, sa.id, NULL), 0);
	T_EQ(session_close(f.st, sb.id, NULL), 0);
	T_EQ(xfinish(&f), 0);
}

/* The pool's GPU lost (devsim plays a CUDA context lost to a sticky error,
 * as on a discrete GPU: its memory unreadable).  Operations fail with
 * DEVICE_LOST; tqkvd's stop then tries the shutdown checkpoint, whose
 * copies out of the device fail, and must leave the files as they were: on
 * a new context (a restart) the persistent session comes back with every
 * token it had before the loss, from its journal, bit for bit. */
static void test_device_lost_restart(void)
{
	struct kvfix f;
	struct session_info si;
	struct session *s;
	struct dataop_res r;
	static struct xsnap a, b;
	static float q[QH * DIM], out[QH * DIM];
	int32_t pos = 0;
	char why[512];

	kvfix_backend = &backend_devsim;
	kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
	xpersist_up(&f);
	T_ASSERT(!pool_host_accessible(f.pool));
	s = xopen(&f, &XG, "gpu", 78, &si);
	xfill(&f, s, 0, 40, 0);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
	xfill(&f, s, 1, 30, 0); /* after the checkpoint: in the journal only */
	xfill(&f, s, 0, 7, 0);
	session_release(s);
	xsnapshot(&f, si.id, &a);

	devsim_lose("CUDA device 0 failed (attention: kernels: an illegal memory access was encountered, "
		    "cudaErrorIllegalAddress): its context is lost");
	MUST(session_acquire(f.st, si.id, 0, &s) == 0);
	struct dataop_ws ws = { 0 };
	dataop_attend(f.ks, s, &ws, 0, NULL, NULL, 0, q, &pos, 1, TQ_DTYPE_F32, out, &r);
	dataop_ws_free(&ws);
	T_EQ(r.status, TQKV_ST_DEVICE_LOST);
	/* no page can be copied out: refused at once, with the device's
	 * reason, before any page is tried (none is written to the tier) */
	struct kvpersist_stats ps0, ps1;
	struct spill_stats ss0, ss1;
	kvstore_persist_stats(f.ks, &ps0);
	spill_stats(f.sp, &ss0);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), -ENOTRECOVERABLE);
	T_ASSERT(strstr(why, "cudaErrorIllegalAddress): its context is lost") != NULL);
	session_release(s);
	/* tqkvd's stop: the shutdown checkpoint of every session (refused
	 * likewise, counted), then exit */
	kvstore_persist_stop(f.ks, f.st);
	kvstore_persist_stats(f.ks, &ps1);
	spill_stats(f.sp, &ss1);
	T_EQ(ps1.checkpoint_failures, ps0.checkpoint_failures + 2);
	T_EQ(ps1.checkpoints, ps0.checkpoints);
	T_EQ(ss1.writes, ss0.writes);
	T_EQ(ss1.slots_used, ss0.slots_used);
	devsim_lose(NULL); /* the new process's context */
	kvfix_restart(&f);
	xpersist_up(&f);
	xsnapshot(&f, si.id, &b);
	xsame(&a, &b);
	T_EQ(b.n_tokens[0], 47);
	T_EQ(b.n_tokens[1], 30);
	T_EQ(session_close(f.st, si.id, NULL), 0);
	kvfix_backend = NULL;
	T_EQ(xfinish(&f), 0);
}

/* A session persisted by a host pool, reopened by a pool whose pages hold a
 * multiple of 32 tokens (devsim, as a GPU pool) at the same page_bytes, and
 * back: it keeps its pages' number of tokens wherever it is reopened (its
 * tokens are where they were written), its tokens and their bits the same;
 * a session opened on that pool has the pool's number, and keeps it on a
 * host pool. */
static void test_page_tokens_moved(void)
{
	struct kvfix f;
	struct session_info si, si2;
	struct session *s;
	struct kv_sess *kv;
	static struct xsnap a, b;
	char why[512], path[600];
	uint32_t page = 0;
	int host = 0, gpu = 0;
	struct session_geom g = XG;

	g.k_codec = TQ_CODEC_Q8; /* 192 bytes a token: XG's 128 make every 4 KiB 32 tokens */
	/* a page size whose pages hold other than a multiple of 32 tokens of g */
	for (uint32_t p = 12u << 10; p <= (64u << 10) && host == gpu; p += 4096u) {
		page = p;
		host = dataop_page_tokens(p, 0, &g);
		gpu = dataop_page_tokens(p, TQC_PAGE_TOKENS_ALIGN, &g);
	}
	T_ASSERT(host > 0 && gpu > 0 && host != gpu && gpu % 32 == 0);
	kvfix_start(&f, XCONF, 16u << 20, page, 256);
	xpersist_up(&f);
	s = xopen(&f, &g, "moved", 79, &si);
	xfill(&f, s, 0, 64, 0);
	xfill(&f, s, 0, 60, 1);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
	xfill(&f, s, 1, 50, 0); /* after the checkpoint: in the journal only */
	session_release(s);
	xsnapshot(&f, si.id, &a);
	kvstore_persist_stop(f.ks, f.st);
	for (int round = 0; round < 2; round++) { /* onto the GPU-like pool, then back */
		kvfix_backend = round == 0 ? &backend_devsim : NULL;
		kvfix_restart(&f);
		t_stderr_begin();
		xpersist_up(&f);
		char *log = t_stderr_end();
		T_ASSERT(log);
		/* the GPU pool's tiled kernel cannot read its pages: said once, on that pool only */
		snprintf(path, sizeof(path), "persistent session %" PRIu64 ": its pages hold %d tokens", si.id, host);
		const int said = strstr(log, path) != NULL && strstr(log, "the GPU's general kernel") != NULL;
		free(log);
		T_EQ(said, round == 0);
		MUST(session_acquire(f.st, si.id, 0, &s) == 0);
		MUST(dataop_kv_get(f.ks, s, &kv) == 0);
		T_EQ(kv->geom.page_tokens, (uint32_t)host);
		session_release(s);
		xsnapshot(&f, si.id, &b);
		xsame(&a, &b);
		T_EQ(b.n_tokens[0], 124);
		T_EQ(b.n_tokens[1], 50);
		kvstore_persist_stop(f.ks, f.st);
	}
	/* opened on the GPU-like pool: its number, kept on a host pool */
	kvfix_backend = &backend_devsim;
	kvfix_restart(&f);
	xpersist_up(&f);
	s = xopen(&f, &g, "stays", 80, &si2);
	xfill(&f, s, 0, 40, 0);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
	session_release(s);
	xsnapshot(&f, si2.id, &a);
	kvstore_persist_stop(f.ks, f.st);
	kvfix_backend = NULL;
	kvfix_restart(&f);
	xpersist_up(&f);
	MUST(session_acquire(f.st, si2.id, 0, &s) == 0);
	MUST(dataop_kv_get(f.ks, s, &kv) == 0);
	T_EQ(kv->geom.page_tokens, (uint32_t)gpu);
	session_release(s);
	xsnapshot(&f, si2.id, &b);
	xsame(&a, &b);
	T_EQ(session_close(f.st, si.id, NULL), 0);
	T_EQ(session_close(f.st, si2.id, NULL), 0);
	T_EQ(xfinish(&f), 0);
}

/* Statistics that do not parse, or tokens without statistics: the session
 * is dropped with its manifest set aside, the others stay. */
static void test_xform_damage(void)
{
	struct kvfix f;
	struct session_info si[4];
	struct session *s;
	struct persist_manifest m;
	struct dataop_res r;
	char why[512], path[256];
	int dfd;

	kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
	xpersist_up(&f);
	for (int i = 0; i < 4; i++) {
		char name[8];
		snprintf(name, sizeof(name), "d%d", i);
		T_EQ(session_open(f.st, tenant_find(f.tt, "t"), name, 1000, &XG, 5 + (uint64_t)i, SESSION_PERSISTENT,
				  0, &si[i], why, sizeof(why)), 0);
		MUST(session_acquire(f.st, si[i].id, 0, &s) == 0);
		T_EQ(dataop_persist_init(f.ks, s, why, sizeof(why)), 0);
		xfill(&f, s, 0, 20, 0);
		xfill(&f, s, 1, 20, 0);
		T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
		if (i == 3) { /* journal #0: layer 1 emptied */
			dataop_truncate(f.ks, s, 1, 0, 0, &r);
			T_EQ(r.status, TQKV_ST_OK);
		}
		session_release(s);
	}
	kvstore_persist_stop(f.ks, NULL);
	dfd = persist_dir_open(f.dir, why, sizeof(why));
	T_ASSERT(dfd >= 0);
	/* d0: a NaN among layer 0's channel means (the checksum is right) */
	T_EQ(persist_manifest_read(dfd, si[0].id, &m, why, sizeof(why)), 0);
	T_ASSERT(m.layers[0].xf_bytes > 40);
	memset(m.layers[0].xf + 36, 0xff, 4);
	T_EQ(persist_manifest_write(dfd, &m, why, sizeof(why)), 0);
	persist_manifest_free(&m);
	/* d1: layer 1's tokens without their statistics */
	T_EQ(persist_manifest_read(dfd, si[1].id, &m, why, sizeof(why)), 0);
	free(m.layers[1].xf);
	m.layers[1].xf = NULL;
	m.layers[1].xf_bytes = 0;
	T_EQ(persist_manifest_write(dfd, &m, why, sizeof(why)), 0);
	persist_manifest_free(&m);
	/* d3: journal #1 calibrates layer 1 from statistics that do not parse
	 * (checksummed all the same), #2 appends to it: the replay stops at #1 */
	T_EQ(persist_manifest_read(dfd, si[3].id, &m, why, sizeof(why)), 0);
	snprintf(path, sizeof(path), "%" PRIu64 ".tqj", si[3].id);
	int jfd = openat(dfd, path, O_WRONLY);
	T_ASSERT(jfd >= 0);
	uint64_t off = (uint64_t)lseek(jfd, 0, SEEK_END);
	uint8_t junk[64];
	memset(junk, 0x5a, sizeof(junk));
	struct persist_rec xr = { .type = PERSIST_REC_XFORM, .layer = 1, .payload_bytes = 64, .seq = 1,
				  .epoch = m.epoch };
	struct persist_rec ar = { .type = PERSIST_REC_APPEND, .layer = 1, .n = 1, .seq = 2, .epoch = m.epoch,
				  .payload_bytes = 64 };
	T_EQ(persist_journal_write(jfd, &off, &xr, junk, sizeof(junk), NULL, 0), 0);
	T_EQ(persist_journal_write(jfd, &off, &ar, junk, ar.payload_bytes, NULL, 0), 0);
	close(jfd);
	persist_manifest_free(&m);
	close(dfd);
	kvfix_restart(&f);
	xpersist_up(&f);
	struct session_info got;
	T_EQ(session_get_info(f.st, si[0].id, &got), -ENOENT);
	T_EQ(session_get_info(f.st, si[1].id, &got), -ENOENT);
	T_EQ(session_get_info(f.st, si[2].id, &got), 0);
	static struct xsnap sn;
	xsnapshot(&f, si[3].id, &sn);
	T_EQ(sn.n_tokens[0], 20);
	T_EQ(sn.n_tokens[1], 0);
	T_EQ(sn.xb[1], 0);
	T_EQ(session_close(f.st, si[3].id, NULL), 0);
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/%s/%" PRIu64 ".tqm.dropped", f.dir, PERSIST_SUBDIR, si[i].id);
		T_EQ(access(path, F_OK), 0);
	}
	T_EQ(session_close(f.st, si[2].id, NULL), 0);
	T_EQ(xfinish(&f), 0);
}

/* The configuration changed between two runs, as an operator may change it:
 * a persistent session that no longer fits is dropped with the reason and
 * its manifest set aside, and only it — the others come back bit for bit.
 *   1. its tenant's section removed from the config;
 *   2. pool.spill_bytes shrunk below one of its slots (the slots it had
 *      claimed before that one are given back: nothing leaks);
 *   3. pool.page_bytes changed. */
#define CCONF_TU "[pool]\npool_bytes = 16M\n[tenant t]\nlimit = 8M\nallow_uids = *\n" \
		 "[tenant u]\nlimit = 8M\nallow_uids = *\n"
#define CCONF_T "[pool]\npool_bytes = 16M\n[tenant t]\nlimit = 8M\nallow_uids = *\n"

/* The lowest and highest spill slot session id's manifest names; returns
 * how many it names. */
static uint64_t slot_range(const char *dir, uint64_t id, uint64_t *lo, uint64_t *hi)
{
	struct persist_manifest m;
	char why[512];
	int dfd = persist_dir_open(dir, why, sizeof(why));

	uint64_t n = 0;
	MUST(dfd >= 0 && persist_manifest_read(dfd, id, &m, why, sizeof(why)) == 0);
	*lo = UINT64_MAX;
	*hi = 0;
	for (uint32_t l = 0; l < m.geom.n_layers; l++)
		for (uint32_t i = 0; i < m.layers[l].n_pages; i++) {
			uint64_t sl = m.layers[l].pages[i].slot;
			if (sl == PERSIST_SLOT_LOST)
				continue;
			*lo = sl < *lo ? sl : *lo;
			*hi = sl > *hi ? sl : *hi;
			n++;
		}
	persist_manifest_free(&m);
	close(dfd);
	return n;
}

/* The slot that the manifest of session id names for page `page` of layer
 * l (PERSIST_SLOT_LOST for a lost page); *slot_bytes: the store's. */
static uint64_t manifest_slot(const char *dir, uint64_t id, uint32_t l, uint32_t page, uint64_t *slot_bytes)
{
	struct persist_manifest m;
	char why[512];
	int dfd = persist_dir_open(dir, why, sizeof(why));

	MUST(dfd >= 0 && persist_manifest_read(dfd, id, &m, why, sizeof(why)) == 0);
	MUST(l < m.geom.n_layers && page < m.layers[l].n_pages);
	const uint64_t slot = m.layers[l].pages[page].slot;
	if (slot_bytes)
		*slot_bytes = m.slot_bytes;
	persist_manifest_free(&m);
	close(dfd);
	return slot;
}

/* Flip a payload byte of the slot that the manifest of session id names
 * for page `page` of layer l (a damaged disk). */
static void damage_page(const char *dir, uint64_t id, uint32_t l, uint32_t page)
{
	char path[512];
	uint64_t slot_bytes;
	const uint64_t slot = manifest_slot(dir, id, l, page, &slot_bytes);
	const off_t off = (off_t)(slot * slot_bytes + SPILL_HDR_BYTES + 77);
	uint8_t b;

	MUST(slot != PERSIST_SLOT_LOST);
	snprintf(path, sizeof(path), "%s/%s", dir, SPILL_FILE);
	int fd = open(path, O_RDWR);
	MUST(fd >= 0 && pread(fd, &b, 1, off) == 1);
	b ^= 0x40;
	MUST(pwrite(fd, &b, 1, off) == 1);
	close(fd);
}

/* Layer l's attention at positions 0, n/3, n/2, n-1 (as xsnapshot): the
 * status, out filled when OK. */
static uint32_t xattend_layer(struct kvfix *f, uint64_t id, uint32_t l, uint32_t n, float *out)
{
	struct dataop_ws ws = { 0 };
	struct dataop_res r;
	struct session *s;
	float q[4 * QH * DIM];
	int32_t pos[4] = { 0, (int32_t)n / 3, (int32_t)n / 2, (int32_t)n - 1 };

	for (int i = 0; i < 4 * QH * DIM; i++)
		q[i] = val_of(5, 77, 0, (uint32_t)i, 3);
	MUST(session_acquire(f->st, id, 0, &s) == 0);
	dataop_attend(f->ks, s, &ws, l, NULL, NULL, 0, q, pos, 4, TQ_DTYPE_F32, out, &r);
	session_release(s);
	dataop_ws_free(&ws);
	return r.status;
}

static void xtruncate(struct kvfix *f, struct session *s, uint32_t l, int all, uint64_t pos)
{
	struct dataop_res r;

	dataop_truncate(f->ks, s, l, all, pos, &r);
	MUST(r.status == TQKV_ST_OK);
}

/* A checkpointed tail page damaged on disk, that a journaled append of
 * its layer must read back at restart: that page is lost (DATA_LOSS for
 * its layer, as for any lost page: its slot given back, the next
 * manifest names it lost) and that layer's appends are dropped, while
 * every other layer's are replayed — replay used to stop at the first,
 * dropping every layer's later tokens.  A journaled truncation that cuts
 * the lost page off (of the layer, or of all layers) lets the layer's
 * later appends apply again; one that does not (past the layer's frozen
 * length, or into the lost page) leaves it as it was.  A second start
 * finds what the first one's checkpoint after replay kept. */
static void test_damaged_tail_others_replay(void)
{
	enum { AS_IS, CUT_LAYER, CUT_PAST_THEN_ALL, CUT_INTO, N_CASES };
	static const char *const name[N_CASES] = { "no truncation", "layer 0 cut to 0, then appended",
						   "cut past its length, then all layers cut to 0",
						   "cut into the lost page" };

	for (int c = 0; c < N_CASES; c++) {
		struct kvfix f;
		struct session_info si;
		static struct xsnap before;
		static float out[4 * QH * DIM];
		char why[512];

		kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
		xpersist_up(&f);
		struct session *s = xopen(&f, &XG, "damaged", 63, &si);
		xfill(&f, s, 0, 40, 0);
		xfill(&f, s, 1, 30, 1);
		T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
		/* journaled: both layers' tail pages grow, layer 0's first */
		xfill(&f, s, 0, 10, 2);
		xfill(&f, s, 1, 10, 3);
		if (c == CUT_LAYER) {
			xtruncate(&f, s, 0, 0, 0);
			xfill(&f, s, 0, 12, 4);
		} else if (c == CUT_PAST_THEN_ALL) {
			xtruncate(&f, s, 0, 0, 45); /* above the 40 it holds at restart */
			xfill(&f, s, 0, 5, 6);
			xtruncate(&f, s, 0, 1, 0);
			xfill(&f, s, 0, 12, 4);
			xfill(&f, s, 1, 9, 7);
		} else if (c == CUT_INTO) {
			xtruncate(&f, s, 0, 0, 20);
		}
		xfill(&f, s, 1, 7, 5);
		session_release(s);
		xsnapshot(&f, si.id, &before);
		const bool healed = c == CUT_LAYER || c == CUT_PAST_THEN_ALL;
		const uint32_t want0 = healed ? before.n_tokens[0] : c == CUT_INTO ? 20 : 40;

		kvstore_persist_stop(f.ks, NULL); /* a SIGKILL */
		damage_page(f.dir, si.id, 0, 0);
		for (int start = 0; start < 2; start++) {
			kvfix_restart(&f);
			xpersist_up(&f);
			struct kvpersist_stats ps;
			kvstore_persist_stats(f.ks, &ps);
			T_EQ(ps.restored, 1);
			/* layer 1: every acknowledged token, attention bit for bit */
			T_EQ(xattend_layer(&f, si.id, 1, before.n_tokens[1], out), TQKV_ST_OK);
			if (memcmp(out, before.out[1], sizeof(out)))
				T_FAIL("%s, start %d: layer 1's attention differs", name[c], start);
			uint32_t st0 = xattend_layer(&f, si.id, 0, want0, out);
			if (healed) {
				T_EQ(st0, TQKV_ST_OK);
				if (memcmp(out, before.out[0], sizeof(out)))
					T_FAIL("%s, start %d: layer 0's attention differs", name[c], start);
			} else {
				T_EQ(st0, TQKV_ST_DATA_LOSS); /* never served */
			}
			/* the lost page's slot given back, the manifest says lost */
			struct session *s2;
			struct kv_sess *kv;
			struct session_info now;
			struct spill_stats ss;
			uint64_t lo, hi;
			MUST(session_acquire(f.st, si.id, 0, &s2) == 0);
			MUST(dataop_kv_get(f.ks, s2, &kv) == 0);
			T_EQ(kv->layer[0].n_tokens, want0);
			T_EQ(kv->layer[1].n_tokens, before.n_tokens[1]);
			MUST(session_get_info(f.st, si.id, &now) == 0);
			T_EQ(now.spilled_bytes, kv->n_spilled * XPAGE);
			session_release(s2);
			spill_stats(f.sp, &ss);
			T_EQ(ss.slots_used, slot_range(f.dir, si.id, &lo, &hi));
			if (!healed)
				T_EQ(manifest_slot(f.dir, si.id, 0, 0, NULL), PERSIST_SLOT_LOST);
			kvstore_persist_stop(f.ks, NULL);
		}
		T_EQ(xfinish(&f), 0);
	}
}

/* A journal that cannot be replayed now — its next append needs a pool
 * page and the pool (one page, after a restart on a smaller pool) has
 * none — is not a damaged one: the session is not served in that run,
 * its files stay as they are and its spill slots claimed (nobody else's
 * pages may land there), and the next start on a pool with room brings it
 * back with every acknowledged append.  (Checkpointing or resetting the
 * journal there lost the appends after the checkpoint.) */
static void test_replay_cannot_apply(void)
{
	struct kvfix f;
	struct session_info si, got;
	struct spill_stats ss;
	struct kvpersist_stats ps;
	static struct xsnap before, after;
	char why[512], path[256];
	uint64_t lo, hi;

	kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
	xpersist_up(&f);
	struct session *s = xopen(&f, &XG, "cannot", 61, &si);
	xfill(&f, s, 0, 60, 0);
	xfill(&f, s, 0, 55, 1);
	xfill(&f, s, 1, 30, 2);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
	/* journaled after the checkpoint: layer 0's tail page fills, and the
	 * append goes on into a page of its own */
	struct kv_sess *kv;
	MUST(dataop_kv_get(f.ks, s, &kv) == 0);
	const uint32_t pt = kv->geom.page_tokens;
	T_ASSERT(115 < pt && pt < 115 + 30);
	xfill(&f, s, 0, 30, 3);
	session_release(s);
	xsnapshot(&f, si.id, &before);
	const uint64_t n_slots = slot_range(f.dir, si.id, &lo, &hi);
	T_ASSERT(n_slots >= 2);

	/* a SIGKILL, then a start on a pool of one page */
	kvstore_persist_stop(f.ks, NULL);
	f.pool_bytes = XPAGE;
	kvfix_restart(&f);
	xpersist_up(&f);
	T_EQ(session_get_info(f.st, si.id, &got), -ENOENT);
	kvstore_persist_stats(f.ks, &ps);
	T_EQ(ps.restored, 0);
	T_EQ(ps.dropped, 0); /* kept, not dropped */
	snprintf(path, sizeof(path), "%s/%s/%" PRIu64 ".tqm", f.dir, PERSIST_SUBDIR, si.id);
	T_EQ(access(path, F_OK), 0);
	snprintf(path, sizeof(path), "%s/%s/%" PRIu64 ".tqj", f.dir, PERSIST_SUBDIR, si.id);
	struct stat st;
	T_EQ(stat(path, &st), 0);
	T_ASSERT(st.st_size > PERSIST_JNL_HDR); /* its records are still there */
	spill_stats(f.sp, &ss);
	T_EQ(ss.slots_used, n_slots);
	/* meanwhile a new persistent session takes the name (the old one is
	 * not in the table) and gets tokens */
	struct session_info si2;
	static struct xsnap before2, after2;
	s = xopen(&f, &XG, "cannot", 62, &si2);
	xfill(&f, s, 0, 5, 4);
	session_release(s);
	xsnapshot(&f, si2.id, &before2);

	/* room again: every token back, bit for bit; the newer session of the
	 * same name cannot be served beside it, and is kept, not set aside
	 * with its journal deleted */
	kvstore_persist_stop(f.ks, NULL);
	f.pool_bytes = 16u << 20;
	kvfix_restart(&f);
	xpersist_up(&f);
	kvstore_persist_stats(f.ks, &ps);
	T_EQ(ps.restored, 1);
	xsnapshot(&f, si.id, &after);
	xsame(&before, &after);
	T_EQ(after.n_tokens[0], 145);
	T_EQ(ps.dropped, 0);
	T_EQ(session_get_info(f.st, si2.id, &got), -ENOENT);
	snprintf(path, sizeof(path), "%s/%s/%" PRIu64 ".tqm", f.dir, PERSIST_SUBDIR, si2.id);
	T_EQ(access(path, F_OK), 0);
	snprintf(path, sizeof(path), "%s/%s/%" PRIu64 ".tqj", f.dir, PERSIST_SUBDIR, si2.id);
	T_EQ(stat(path, &st), 0);
	T_ASSERT(st.st_size > PERSIST_JNL_HDR);
	/* once the first is closed, the next start serves the second */
	T_EQ(session_close(f.st, si.id, NULL), 0);
	xcrash(&f);
	kvstore_persist_stats(f.ks, &ps);
	T_EQ(ps.restored, 1);
	xsnapshot(&f, si2.id, &after2);
	xsame(&before2, &after2);
	T_EQ(xfinish(&f), 0);
}

/* A restart (persistence stopped first) on f's changed config: session
 * `dropped` is gone with its manifest set aside, and the start counted
 * `restored` sessions back and one dropped. */
static void restart_dropping(struct kvfix *f, uint64_t dropped, uint64_t restored)
{
	struct session_info got;
	struct kvpersist_stats ps;
	char path[256];

	kvfix_restart(f);
	xpersist_up(f);
	T_EQ(session_get_info(f->st, dropped, &got), -ENOENT);
	snprintf(path, sizeof(path), "%s/%s/%" PRIu64 ".tqm.dropped", f->dir, PERSIST_SUBDIR, dropped);
	T_EQ(access(path, F_OK), 0);
	kvstore_persist_stats(f->ks, &ps);
	T_EQ(ps.restored, restored);
	T_EQ(ps.dropped, 1);
}

/* The operator's way back for a dropped session: ID.tqm.dropped and
 * ID.tqj.dropped renamed back (tqkvd stopped); 0 or -errno. */
static int undrop(struct kvfix *f, uint64_t id)
{
	char a[256], b[256];

	for (int j = 0; j < 2; j++) {
		const char *ext = j ? "tqj" : "tqm";
		snprintf(a, sizeof(a), "%s/%s/%" PRIu64 ".%s.dropped", f->dir, PERSIST_SUBDIR, id, ext);
		snprintf(b, sizeof(b), "%s/%s/%" PRIu64 ".%s", f->dir, PERSIST_SUBDIR, id, ext);
		if (rename(a, b) < 0)
			return -errno;
	}
	return 0;
}

/* A session set aside (its tenant gone) whose slots a newer session took
 * meanwhile, renamed back (the tenant back): both come back.  The slots
 * hold the newer one's pages — their headers say so — so it is whole, and
 * the older lost those pages (DATA_LOSS on their layers).  Before, the
 * newer was dropped whole: it claims second ("which another page names
 * too").  And the other way round: a later manifest that names an earlier
 * one's slots loses them. */
static void test_undrop_after_reuse(void)
{
	struct kvfix f;
	struct session_info c, d;
	struct session *s;
	struct kvpersist_stats ps;
	struct dataop_ws ws = { 0 };
	struct dataop_res r;
	static struct xsnap d0, d1;
	static float q[QH * DIM], out[QH * DIM];
	char why[512];

	kvfix_start(&f, CCONF_TU, 16u << 20, XPAGE, 256);
	xpersist_up(&f);
	T_EQ(session_open(f.st, tenant_find(f.tt, "u"), "c", 1000, &XG, 81, SESSION_PERSISTENT, 0, &c, why,
			  sizeof(why)), 0);
	MUST(session_acquire(f.st, c.id, 0, &s) == 0);
	T_EQ(dataop_persist_init(f.ks, s, why, sizeof(why)), 0);
	xfill(&f, s, 0, 40, 1);
	xfill(&f, s, 1, 30, 1);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
	session_release(s);

	/* tenant u gone: c is set aside, none of its slots claimed */
	kvstore_persist_stop(f.ks, NULL);
	f.conf = CCONF_T;
	restart_dropping(&f, c.id, 0);
	/* d (tenant t) takes the first free slots: c's */
	T_EQ(session_open(f.st, tenant_find(f.tt, "t"), "d", 1000, &XG, 82, SESSION_PERSISTENT, 0, &d, why,
			  sizeof(why)), 0);
	MUST(session_acquire(f.st, d.id, 0, &s) == 0);
	T_EQ(dataop_persist_init(f.ks, s, why, sizeof(why)), 0);
	xfill(&f, s, 0, 50, 2);
	xfill(&f, s, 1, 40, 2);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
	session_release(s);
	xsnapshot(&f, d.id, &d0);
	T_ASSERT(d.id > c.id); /* not c's id, though c is set aside */

	/* the operator brings c back: tenant u, its files renamed back */
	kvstore_persist_stop(f.ks, NULL);
	f.conf = CCONF_TU;
	T_EQ(undrop(&f, c.id), 0);
	kvfix_restart(&f);
	xpersist_up(&f);
	kvstore_persist_stats(f.ks, &ps);
	T_EQ(ps.restored, 2);
	T_EQ(ps.dropped, 0);
	xsnapshot(&f, d.id, &d1);
	xsame(&d0, &d1);
	/* c is back, without the pages d's slots hold: never served */
	MUST(session_acquire(f.st, c.id, 0, &s) == 0);
	for (uint32_t l = 0; l < 2; l++) {
		int32_t pos = 20;
		dataop_attend(f.ks, s, &ws, l, NULL, NULL, 0, q, &pos, 1, TQ_DTYPE_F32, out, &r);
		T_EQ(r.status, TQKV_ST_DATA_LOSS);
	}
	session_release(s);

	/* c's manifest was checkpointed at that start: it no longer names the
	 * slots (every later start would have read their headers again) */
	struct persist_manifest m;
	int dfd = persist_dir_open(f.dir, why, sizeof(why));
	MUST(dfd >= 0 && persist_manifest_read(dfd, c.id, &m, why, sizeof(why)) == 0);
	for (uint32_t l = 0; l < m.geom.n_layers; l++)
		for (uint32_t i = 0; i < m.layers[l].n_pages; i++)
			T_EQ(m.layers[l].pages[i].slot, PERSIST_SLOT_LOST);
	persist_manifest_free(&m);

	/* the other way round: a manifest under a higher id naming d's slots
	 * (a copy of d's) claims second and loses them — the headers name d —
	 * and comes back without its pages; d is whole */
	kvstore_persist_stop(f.ks, NULL);
	MUST(persist_manifest_read(dfd, d.id, &m, why, sizeof(why)) == 0);
	const uint64_t e_id = d.id + 100;
	m.id = e_id;
	snprintf(m.name, sizeof(m.name), "e");
	T_EQ(persist_manifest_write(dfd, &m, why, sizeof(why)), 0);
	persist_manifest_free(&m);
	close(dfd);
	kvfix_restart(&f);
	xpersist_up(&f);
	kvstore_persist_stats(f.ks, &ps);
	T_EQ(ps.restored, 3);
	T_EQ(ps.dropped, 0);
	xsnapshot(&f, d.id, &d1);
	xsame(&d0, &d1);
	MUST(session_acquire(f.st, e_id, 0, &s) == 0);
	for (uint32_t l = 0; l < 2; l++) {
		int32_t pos = 20;
		dataop_attend(f.ks, s, &ws, l, NULL, NULL, 0, q, &pos, 1, TQ_DTYPE_F32, out, &r);
		T_EQ(r.status, TQKV_ST_DATA_LOSS);
	}
	session_release(s);
	dataop_ws_free(&ws);
	T_EQ(session_close(f.st, c.id, NULL), 0);
	T_EQ(session_close(f.st, d.id, NULL), 0);
	T_EQ(session_close(f.st, e_id, NULL), 0);
	T_EQ(xfinish(&f), 0);
}

static void test_config_change(void)
{
	struct kvfix f;
	struct session_info si[3];
	struct session *s;
	struct spill_stats ss;
	static struct xsnap before[3], after;
	static const char *const tenant[3] = { "t", "u", "t" };
	char why[512];

	kvfix_start(&f, CCONF_TU, 16u << 20, XPAGE, 256);
	xpersist_up(&f);
	/* A (t), B (u), C (t): checkpointed one after the other, so C's slots
	 * come after A's */
	for (int i = 0; i < 3; i++) {
		char name[8];
		snprintf(name, sizeof(name), "c%d", i);
		T_EQ(session_open(f.st, tenant_find(f.tt, tenant[i]), name, 1000, &XG, 40 + (uint64_t)i,
				  SESSION_PERSISTENT, 0, &si[i], why, sizeof(why)), 0);
		MUST(session_acquire(f.st, si[i].id, 0, &s) == 0);
		T_EQ(dataop_persist_init(f.ks, s, why, sizeof(why)), 0);
		xfill(&f, s, 0, 40, (uint32_t)i);
		xfill(&f, s, 1, 30, (uint32_t)i);
		T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
		session_release(s);
		xsnapshot(&f, si[i].id, &before[i]);
	}

	/* 1. tenant u is gone: B is dropped, A and C are back */
	kvstore_persist_stop(f.ks, NULL);
	f.conf = CCONF_T;
	restart_dropping(&f, si[1].id, 2);
	for (int i = 0; i < 3; i += 2) {
		xsnapshot(&f, si[i].id, &after);
		xsame(&before[i], &after);
	}

	/* C gets appends after its checkpoint: they are in its journal only */
	MUST(session_acquire(f.st, si[2].id, 0, &s) == 0);
	xfill(&f, s, 1, 9, 7);
	session_release(s);
	xsnapshot(&f, si[2].id, &before[2]);
	T_EQ(before[2].n_tokens[1], 39);

	/* 2. the spill file shrunk to end just past C's first slot: C's first
	 * slot is claimed, a later one is beyond the file, so C is dropped and
	 * that first slot given back; A (all below) comes back */
	kvstore_persist_stop(f.ks, NULL);
	uint64_t a_lo, a_hi, c_lo, c_hi;
	const uint64_t a_slots = slot_range(f.dir, si[0].id, &a_lo, &a_hi);
	slot_range(f.dir, si[2].id, &c_lo, &c_hi);
	T_ASSERT(a_hi < c_lo && c_lo < c_hi);
	f.spill_slots = c_lo + 1;
	restart_dropping(&f, si[2].id, 1);
	xsnapshot(&f, si[0].id, &after);
	xsame(&before[0], &after);
	/* only A's slots are in use: C's claimed one went back.  (A's pages
	 * come back into the pool when used, keeping their slots: clean.) */
	spill_stats(f.sp, &ss);
	T_EQ(ss.slots_used, a_slots);

	/* 2b. the store as large as before, C's files renamed back: C is back
	 * whole, its journaled appends too (its journal was deleted) */
	kvstore_persist_stop(f.ks, NULL);
	f.spill_slots = 256;
	T_EQ(undrop(&f, si[2].id), 0);
	kvfix_restart(&f);
	xpersist_up(&f);
	struct kvpersist_stats ps;
	kvstore_persist_stats(f.ks, &ps);
	T_EQ(ps.restored, 2);
	T_EQ(ps.dropped, 0);
	for (int i = 0; i < 3; i += 2) {
		xsnapshot(&f, si[i].id, &after);
		xsame(&before[i], &after);
	}
	T_EQ(session_close(f.st, si[2].id, NULL), 0);

	/* 3. another page size: A no longer fits and is dropped */
	kvstore_persist_stop(f.ks, NULL);
	f.page_bytes = 2 * XPAGE;
	f.spill_slots = 256;
	restart_dropping(&f, si[0].id, 0);
	spill_stats(f.sp, &ss);
	T_EQ(ss.slots_used, 0);

	T_EQ(xfinish(&f), 0);
}

/* ---- the integration client ---------------------------------------------------- */

static int open_session(const char *dir, const char *name, tqkv **c, tqkv_session **s)
{
	struct tqkv_connect_opts o = { .run_dir = dir, .timeout_ms = 5000 };
	struct tqkv_session_params p = { .name = name, .n_layers = L_N, .n_kv_heads = KVH, .n_q_heads = QH,
					 .head_dim = DIM, .k_codec = "tq4", .v_codec = "tq3",
					 .max_tokens = 1u << 18, .flags = TQKV_SESSION_PERSISTENT };
	int r;

	for (int tries = 0; tries < 100; tries++) {
		if ((r = tqkv_connect(c, &o)) == 0)
			break;
		usleep(100000);
	}
	if (r < 0)
		return r;
	if ((r = tqkv_session_attach_name(*c, NULL, name, TQKV_SESSION_DETACHED, s)) == 0)
		return 0;
	if (r != -ENOENT)
		return r;
	return tqkv_session_open(*c, &p, s);
}

/* One log record: layer, length, then the attention output's bits. */
struct rec {
	uint32_t layer, len;
	float out[QH * DIM];
};

static int client_fill(const char *dir, const char *name, double seconds, const char *log)
{
	static float k[8 * KVH * DIM], v[8 * KVH * DIM], q[QH * DIM];
	struct tqkv_session_info info;
	tqkv *c;
	tqkv_session *s;
	struct timespec t0, t;
	uint32_t len[L_N];
	uint64_t rs = (uint64_t)getpid();
	FILE *f;
	int r;

	if ((r = open_session(dir, name, &c, &s)) < 0) {
		fprintf(stderr, "fill: %s\n", tqkv_last_error());
		return 2;
	}
	if (!(f = fopen(log, "ab")))
		return 2;
	if ((r = tqkv_session_info(s, &info)) < 0 || !info.persistent) {
		fprintf(stderr, "fill: session info: %s\n", r < 0 ? tqkv_last_error() : "not persistent");
		return 2;
	}
	for (uint32_t l = 0; l < L_N; l++) { /* each layer's length: truncating past it is a no-op */
		int n = tqkv_truncate(s, l, (uint32_t)info.tokens);
		if (n < 0) {
			fprintf(stderr, "fill: %s\n", tqkv_last_error());
			return 2;
		}
		len[l] = (uint32_t)n;
	}
	for (int i = 0; i < QH * DIM; i++)
		q[i] = val_of(7, 99, 0, (uint32_t)i, 3);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	printf("ready %u\n", len[0]);
	fflush(stdout);
	for (uint64_t step = 0;; step++) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 > seconds)
			break;
		rs = rs * 6364136223846793005ull + 1442695040888963407ull;
		uint32_t l = (uint32_t)(step % L_N), n = 1 + (uint32_t)((rs >> 33) % 8);
		for (uint32_t t2 = 0; t2 < n; t2++)
			for (uint32_t h = 0; h < KVH; h++)
				for (uint32_t d = 0; d < DIM; d++) {
					k[(t2 * KVH + h) * DIM + d] = val_of(len[l] + t2, l, h, d, 0);
					v[(t2 * KVH + h) * DIM + d] = val_of(len[l] + t2, l, h, d, 1);
				}
		if ((r = tqkv_append(s, l, k, v, n, TQKV_F32)) < 0)
			break; /* the daemon died */
		len[l] = (uint32_t)r;
		struct rec rc = { .layer = l, .len = len[l] };
		int32_t pos = (int32_t)len[l] - 1;
		if ((r = tqkv_attend(s, l, q, &pos, 1, TQKV_F32, rc.out)) < 0)
			break;
		if (fwrite(&rc, sizeof(rc), 1, f) != 1 || fflush(f) != 0)
			return 2;
		usleep(500); /* a steady stream, not a flood: the session stays small */
	}
	fclose(f);
	printf("stopped at %u/%u tokens: %s\n", len[0], len[1], r < 0 ? tqkv_strerror(r) : "time");
	tqkv_session_detach(s);
	tqkv_disconnect(c);
	return 0;
}

static int client_verify(const char *dir, const char *name, const char *log)
{
	static float q[QH * DIM], out[QH * DIM];
	struct rec last[L_N], rc;
	bool have[L_N] = { false };
	tqkv *c;
	tqkv_session *s;
	FILE *f = fopen(log, "rb");
	int r, bad = 0;

	if (!f)
		return 2;
	while (fread(&rc, sizeof(rc), 1, f) == 1) {
		if (rc.layer < L_N) {
			last[rc.layer] = rc;
			have[rc.layer] = true;
		}
	}
	fclose(f);
	if ((r = open_session(dir, name, &c, &s)) < 0) {
		fprintf(stderr, "verify: %s\n", tqkv_last_error());
		return 2;
	}
	for (int i = 0; i < QH * DIM; i++)
		q[i] = val_of(7, 99, 0, (uint32_t)i, 3);
	for (uint32_t l = 0; l < L_N; l++) {
		if (!have[l])
			continue;
		/* everything acknowledged is there: truncating to it leaves it */
		if ((r = tqkv_truncate(s, l, last[l].len)) < 0 || (uint32_t)r != last[l].len) {
			fprintf(stderr, "verify: layer %u: %u tokens were acknowledged, the session has %d (%s)\n", l,
				last[l].len, r, r < 0 ? tqkv_last_error() : "tokens lost");
			bad = 1;
			continue;
		}
		int32_t pos = (int32_t)last[l].len - 1;
		if ((r = tqkv_attend(s, l, q, &pos, 1, TQKV_F32, out)) < 0) {
			fprintf(stderr, "verify: layer %u attend: %s\n", l, tqkv_last_error());
			bad = 1;
			continue;
		}
		if (memcmp(out, last[l].out, sizeof(out))) {
			fprintf(stderr, "verify: layer %u at %u tokens: attention differs from before the restart\n", l,
				last[l].len);
			bad = 1;
		}
	}
	printf("verified %u/%u tokens: %s\n", have[0] ? last[0].len : 0, have[1] ? last[1].len : 0,
	       bad ? "MISMATCH" : "bit-identical");
	tqkv_session_detach(s);
	tqkv_disconnect(c);
	return bad;
}

static int write_seed(const char *dir, const char *name, uint8_t tag, const uint8_t *b, size_t len)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (!(f = fopen(path, "wb")))
		return 1;
	fwrite(&tag, 1, 1, f);
	fwrite(b, 1, len, f);
	return fclose(f) != 0;
}

/* tests/fuzz/seeds/persist: manifests (format 2 with transform statistics,
 * format 1) and journals (appends and a truncation; a calibration, appends,
 * a truncation to 0 and another calibration), as fuzz_persist reads them
 * (first byte: 0 manifest, 1 journal). */
static int write_seeds(const char *dir)
{
	struct persist_manifest m;
	struct persist_layer L[2];
	struct persist_page pg[3];
	char path[512], why[256], tmp[] = "/tmp/tqs-XXXXXX";
	size_t len;
	uint64_t off = PERSIST_JNL_HDR;

	sample_manifest(&m, L, pg);
	L[0].xf_bytes = 32 + 16; /* small: the fuzzer's mutations matter, not the size */
	uint8_t *b = persist_manifest_encode(&m, &len);
	if (!b || write_seed(dir, "manifest", 0, b, len))
		return 1;
	free(b);
	m.geom.kv_xform = 0;
	L[0].xf_bytes = 0;
	if (!(b = persist_manifest_encode(&m, &len)))
		return 1;
	len -= 2 * 4; /* format 1: no statistics, no mode, no tokens a page */
	b[8] = 1;
	memset(b + 244, 0, 4);
	reseal(b, len);
	if (write_seed(dir, "manifest_v1", 0, b, len))
		return 1;
	free(b);
	if (!mkdtemp(tmp))
		return 1;
	int dfd = persist_dir_open(tmp, why, sizeof(why)), jfd = persist_journal_reset(dfd, 1, 1, why, sizeof(why));
	uint8_t pay[24];
	for (uint32_t i = 0; i < 3; i++) {
		memset(pay, 0x30 + (int)i, sizeof(pay));
		struct persist_rec r = { .type = i == 2 ? PERSIST_REC_TRUNCATE : PERSIST_REC_APPEND, .first = i,
					 .n = i == 2 ? 0 : 1, .payload_bytes = i == 2 ? 0 : 24, .seq = i, .epoch = 1 };
		if (persist_journal_write(jfd, &off, &r, pay, r.payload_bytes, NULL, 0) < 0)
			return 1;
	}
	uint8_t jb[4096];
	ssize_t n = pread(jfd, jb, sizeof(jb), 0);
	if (n <= 0 || write_seed(dir, "journal", 1, jb, (size_t)n))
		return 1;
	close(jfd);
	/* XFORM, APPEND, TRUNCATE to 0, XFORM, APPEND */
	off = PERSIST_JNL_HDR;
	jfd = persist_journal_reset(dfd, 1, 1, why, sizeof(why));
	for (uint32_t i = 0; i < 5; i++) {
		static const uint32_t type[5] = { PERSIST_REC_XFORM, PERSIST_REC_APPEND, PERSIST_REC_TRUNCATE,
						  PERSIST_REC_XFORM, PERSIST_REC_APPEND };
		uint32_t bytes = type[i] == PERSIST_REC_TRUNCATE ? 0 : type[i] == PERSIST_REC_XFORM ? 40 : 24;
		uint8_t p2[40];
		memset(p2, 0x50 + (int)i, sizeof(p2));
		struct persist_rec r = { .type = type[i], .n = type[i] == PERSIST_REC_APPEND, .payload_bytes = bytes,
					 .seq = i, .epoch = 1 };
		if (persist_journal_write(jfd, &off, &r, p2, bytes, NULL, 0) < 0)
			return 1;
	}
	n = pread(jfd, jb, sizeof(jb), 0);
	if (n <= 0 || write_seed(dir, "journal_xform", 1, jb, (size_t)n))
		return 1;
	close(jfd);
	close(dfd);
	snprintf(path, sizeof(path), "rm -rf %s", tmp);
	return system(path) != 0;
}

/* After the journal was lost (a failed journal write, or a checkpoint
 * whose new journal could not be made), the next append makes a new one
 * (a checkpoint) before it changes anything.  It checkpointed from the
 * middle of the append: the tail page, already holding the new tokens,
 * was copied with the old token count and called clean, so a spill kept
 * that short copy (DATA_LOSS on read-back) and a restart lost the page. */
static void test_append_after_journal_loss(void)
{
	for (int restart = 0; restart < 2; restart++) {
		struct kvfix f;
		struct session_info si;
		static struct xsnap a, b;
		char why[512], path[512];
		uint64_t out;

		kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
		xpersist_up(&f);
		struct session *s = xopen(&f, &XG, "jl", 61, &si);
		xfill(&f, s, 0, 50, 0);
		T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
		xfill(&f, s, 0, 10, 1);
		/* the checkpoint's new journal cannot be made: none after it */
		snprintf(path, sizeof(path), "%s/%s/%" PRIu64 ".tqj", f.dir, PERSIST_SUBDIR, si.id);
		T_EQ(unlink(path), 0);
		T_EQ(mkdir(path, 0700), 0);
		dataop_checkpoint(f.ks, s, why, sizeof(why));
		T_EQ(rmdir(path), 0);
		xfill(&f, s, 0, 10, 2); /* into the partly filled tail page */
		struct kv_sess *kv;
		MUST(dataop_kv_get(f.ks, s, &kv) == 0);
		T_ASSERT(kv->layer[0].n_tokens < kv->geom.page_tokens); /* still the first page */
		session_release(s);
		xsnapshot(&f, si.id, &a);
		T_EQ(a.n_tokens[0], 70);
		if (restart) {
			/* another layer's checkpoint names the tail page's slot */
			MUST(session_acquire(f.st, si.id, 0, &s) == 0);
			xfill(&f, s, 1, 20, 3);
			T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
			session_release(s);
			xsnapshot(&f, si.id, &a);
			xcrash(&f);
		} else {
			MUST(session_acquire(f.st, si.id, 0, &s) == 0);
			T_EQ(dataop_spill(f.ks, s, UINT64_MAX, &out, why, sizeof(why)), 0);
			session_release(s);
		}
		xsnapshot(&f, si.id, &b); /* every page read back (exits on DATA_LOSS) */
		xsame(&a, &b);
		T_EQ(xfinish(&f), 0);
	}
}

/* A checkpoint whose manifest was renamed into place but whose directory
 * fsync failed: a restart reads the new manifest, so the session goes on
 * with the new journal.  It went on appending to the old one (epoch
 * behind the manifest), whose records a restart skips as already in the
 * manifest: every append since was lost after a SIGKILL. */
static void test_dirsync_fails(void)
{
	struct kvfix f;
	struct session_info si;
	struct spill_stats ss0, ss1;
	static struct xsnap a, b;
	char why[512];

	kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
	xpersist_up(&f);
	struct session *s = xopen(&f, &XG, "dirsync", 63, &si);
	xfill(&f, s, 0, 60, 0);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
	xfill(&f, s, 0, 50, 1);
	spill_stats(f.sp, &ss0);
	persist_fault_dirsync(1);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), -EIO);
	T_ASSERT(strstr(why, "syncing sessions/") && strstr(why, "the checkpoint is in place"));
	xfill(&f, s, 0, 20, 2); /* journaled after it */
	xfill(&f, s, 1, 10, 3);
	session_release(s);
	xsnapshot(&f, si.id, &a);
	T_EQ(a.n_tokens[0], 130);
	xcrash(&f);
	xsnapshot(&f, si.id, &b);
	xsame(&a, &b);
	/* the next good checkpoint lets the old slots go */
	MUST(session_acquire(f.st, si.id, 0, &s) == 0);
	xfill(&f, s, 1, 5, 4);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
	session_release(s);
	spill_stats(f.sp, &ss1);
	T_ASSERT(ss1.slots_used <= ss0.slots_used + 4);
	T_EQ(xfinish(&f), 0);
}

/* A closed session whose manifest's removal could not be synced (the
 * directory's fsync failed): a crash could bring the manifest back, so
 * its slots stay used until restart instead of going to other sessions
 * (which a manifest come back would then name too). */
static void test_remove_dirsync_fails(void)
{
	struct kvfix f;
	struct session_info si;
	struct spill_stats ss0, ss1;
	char why[512];

	kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
	xpersist_up(&f);
	struct session *s = xopen(&f, &XG, "rmsync", 65, &si);
	xfill(&f, s, 0, 60, 0);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
	session_release(s);
	spill_stats(f.sp, &ss0);
	T_ASSERT(ss0.slots_used > 0);
	persist_fault_dirsync(1);
	T_EQ(session_close(f.st, si.id, NULL), 0);
	spill_stats(f.sp, &ss1);
	T_EQ(ss1.slots_used, ss0.slots_used);
	T_EQ(xfinish(&f), 0);
}

/* sessions/ID.ext of the fixture is there. */
static bool xfile(const struct kvfix *f, uint64_t id, const char *ext)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/sessions/%" PRIu64 ".%s", f->dir, id, ext);
	return access(path, F_OK) == 0;
}

/* Sessions closed or evicted while an operation holds them: their files
 * go when that ends, after the close is answered.  Each is marked closed
 * (ID.closed) before the answer, so a crash in between (here the persist
 * side stopped as a SIGKILL leaves it, before the holders are done) does
 * not bring them back; without one, the files and the mark go when the
 * holder is done.  (Old: both came back at the restart.) */
static void test_close_while_held(void)
{
	struct kvfix f;
	struct session_info a, b, c, x;
	struct spill_stats ss;
	char why[512];

	kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
	xpersist_up(&f);
	struct session *sa = xopen(&f, &XG, "held-close", 71, &a);
	struct session *sb = xopen(&f, &XG, "held-evict", 72, &b);
	struct session *sc = xopen(&f, &XG, "held-done", 73, &c);
	struct session *held[] = { sa, sb, sc };
	for (int i = 0; i < 3; i++) {
		xfill(&f, held[i], 0, 40, (uint32_t)i);
		T_EQ(dataop_checkpoint(f.ks, held[i], why, sizeof(why)), 0);
		xfill(&f, held[i], 1, 10, (uint32_t)i); /* journaled */
	}
	T_EQ(session_close(f.st, a.id, NULL), 0);
	T_EQ(session_evict(f.st, b.id, NULL), 0);
	T_EQ(session_close(f.st, c.id, NULL), 0);
	T_ASSERT(xfile(&f, a.id, "tqm") && xfile(&f, a.id, "tqj") && xfile(&f, a.id, "closed"));
	T_ASSERT(xfile(&f, b.id, "tqm") && xfile(&f, b.id, "closed"));
	T_ASSERT(xfile(&f, c.id, "tqm") && xfile(&f, c.id, "closed"));
	/* c's holder is done: its files go, the mark last */
	session_release(sc);
	T_ASSERT(!xfile(&f, c.id, "tqm") && !xfile(&f, c.id, "tqj") && !xfile(&f, c.id, "closed"));
	/* the crash, before a's and b's holders are done */
	kvstore_persist_stop(f.ks, NULL);
	session_release(sa);
	session_release(sb);
	T_ASSERT(xfile(&f, a.id, "tqm") && xfile(&f, b.id, "tqm"));
	kvfix_restart(&f);
	xpersist_up(&f);
	T_EQ(session_get_info(f.st, a.id, &x), -ENOENT);
	T_EQ(session_get_info(f.st, b.id, &x), -ENOENT);
	T_ASSERT(!xfile(&f, a.id, "tqm") && !xfile(&f, a.id, "tqj") && !xfile(&f, a.id, "closed"));
	T_ASSERT(!xfile(&f, b.id, "tqm") && !xfile(&f, b.id, "closed"));
	spill_stats(f.sp, &ss);
	T_EQ(ss.slots_used, 0); /* nothing names their slots any more */
	/* a new session takes none of their ids */
	struct session *sn = xopen(&f, &XG, "after", 74, &x);
	T_ASSERT(x.id > b.id);
	session_release(sn);
	T_EQ(xfinish(&f), 0);
}

/* A manifest that cannot be read for a reason that says nothing about it
 * (here an injected EIO, then a format another tqkvd wrote): the start
 * stops with the reason, the files as
 * they are (it was set aside, its journal deleted; keeping it unread
 * would let a run give its slots to other sessions); the next start gets
 * every token back. */
static void test_manifest_unreadable(void)
{
	struct kvfix f;
	struct session_info si;
	static struct xsnap a, b;
	char why[512], path[256];
	uint64_t max_id;

	kvfix_start(&f, XCONF, 16u << 20, XPAGE, 256);
	xpersist_up(&f);
	struct session *s = xopen(&f, &XG, "unreadable", 64, &si);
	xfill(&f, s, 0, 40, 0);
	T_EQ(dataop_checkpoint(f.ks, s, why, sizeof(why)), 0);
	xfill(&f, s, 1, 20, 1); /* journaled */
	session_release(s);
	xsnapshot(&f, si.id, &a);
	kvstore_persist_stop(f.ks, NULL);
	kvfix_restart(&f);
	MUST(kvstore_persist_open(f.ks, f.dir, 3600000, why, sizeof(why)) == 0);
	persist_fault_manifest_read(1);
	T_ASSERT(kvstore_recover(f.ks, f.st, f.tt, &max_id) < 0);
	struct session_info got;
	T_EQ(session_get_info(f.st, si.id, &got), -ENOENT);
	snprintf(path, sizeof(path), "%s/%s/%" PRIu64 ".tqm", f.dir, PERSIST_SUBDIR, si.id);
	T_EQ(access(path, F_OK), 0);
	snprintf(path, sizeof(path), "%s/%s/%" PRIu64 ".tqj", f.dir, PERSIST_SUBDIR, si.id);
	T_EQ(access(path, F_OK), 0);
	xcrash(&f); /* the next start */
	xsnapshot(&f, si.id, &b);
	xsame(&a, &b);

	/* a manifest of a format this tqkvd does not read (a newer one's,
	 * after a downgrade): the same — it was set aside and its slots given
	 * to other sessions, and the upgrade back found it lost */
	kvstore_persist_stop(f.ks, NULL);
	snprintf(path, sizeof(path), "%s/%s/%" PRIu64 ".tqm", f.dir, PERSIST_SUBDIR, si.id);
	int fd = open(path, O_RDWR);
	uint8_t fmt[4], newer[4] = { 0xff, 0, 0, 0 };
	T_ASSERT(fd >= 0 && pread(fd, fmt, 4, 8) == 4 && pwrite(fd, newer, 4, 8) == 4); /* M_FORMAT */
	kvfix_restart(&f);
	MUST(kvstore_persist_open(f.ks, f.dir, 3600000, why, sizeof(why)) == 0);
	T_ASSERT(kvstore_recover(f.ks, f.st, f.tt, &max_id) < 0);
	T_EQ(access(path, F_OK), 0);
	T_ASSERT(pwrite(fd, fmt, 4, 8) == 4); /* the tqkvd that reads it */
	close(fd);
	xcrash(&f);
	xsnapshot(&f, si.id, &b);
	xsame(&a, &b);
	T_EQ(xfinish(&f), 0);
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--write-seeds"))
		return write_seeds(argv[2]);
	if (argc > 2 && !strcmp(argv[1], "--client")) {
		if (!strcmp(argv[2], "fill") && argc == 7)
			return client_fill(argv[3], argv[4], atof(argv[5]), argv[6]);
		if (!strcmp(argv[2], "verify") && argc == 6)
			return client_verify(argv[3], argv[4], argv[5]);
		fprintf(stderr, "usage: %s --client fill DIR NAME SECONDS LOG | verify DIR NAME LOG\n", argv[0]);
		return 2;
	}
	T_RUN(test_manifest_roundtrip);
	T_RUN(test_manifest_damage);
	T_RUN(test_manifest_v1);
	T_RUN(test_manifest_xf_bounds);
	T_RUN(test_manifest_files);
	T_RUN(test_journal);
	T_RUN(test_journal_fuzz);
	T_RUN(test_xform_restart);
	T_RUN(test_replay_nomem_keeps);
	T_RUN(test_checkpoint_backoff);
	T_RUN(test_recover_two_sessions);
	T_RUN(test_xform_damage);
	T_RUN(test_device_lost_restart);
	T_RUN(test_page_tokens_moved);
	T_RUN(test_config_change);
	T_RUN(test_undrop_after_reuse);
	T_RUN(test_replay_cannot_apply);
	T_RUN(test_damaged_tail_others_replay);
	T_RUN(test_append_after_journal_loss);
	T_RUN(test_dirsync_fails);
	T_RUN(test_remove_dirsync_fails);
	T_RUN(test_close_while_held);
	T_RUN(test_manifest_unreadable);
	return t_done();
}
