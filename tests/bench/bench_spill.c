/* tqbench spill — the spill tier against fio on the same file system.
 *
 * In this process: the daemon's pool, page tables and spill store (no
 * ring).  A session of an 8B-class geometry (32 layers, 8 KV heads of 32
 * query heads, d = 128, q8 K / tq4 V) is filled to --mib MiB, spilled
 * whole, restored whole, spilled again and restored by attention (one
 * query per layer at the last position, which reads the layer back
 * first).  Single-page restores at queue depth 1 read random slots of the
 * store.  fio (Debian package) runs io_uring + O_DIRECT sequential write,
 * sequential read and QD1 random read with the same block size (one slot:
 * page + 4 KiB header) on a file in the same directory, in the same run;
 * the ratios are printed. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "config.h"
#include "dataop.h"
#include "log.h"
#include "pool.h"
#include "session.h"
#include "spill.h"
#include "tenant.h"
#include "tq_codec.h"
#include "tqkv_ring.h"

#define MiB (1ull << 20)

struct fio_res {
	double bw;                 /* bytes/s */
	double p50_us, p99_us;     /* completion latency */
};

/* The number after "key" : inside the object that starts at `from`. */
static double json_num(const char *from, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\" : ", key);
	p = strstr(from, pat);
	return p ? strtod(p + strlen(pat), NULL) : -1;
}

/* Run fio; 0 and the job's figures for `dir` ("read" or "write"). */
static int fio_run(const char *file, uint64_t size, uint64_t bs, const char *rw, int qd, int seconds,
		   struct fio_res *out)
{
	char cmd[1024], buf[1 << 16];
	size_t n = 0;
	FILE *f;

	snprintf(cmd, sizeof(cmd),
		 "fio --name=tq --filename=%s --size=%" PRIu64 " --bs=%" PRIu64 " --rw=%s --ioengine=io_uring "
		 "--direct=1 --iodepth=%d %s --output-format=json 2>&1",
		 file, size, bs, rw, qd, seconds ? "--time_based --runtime=5" : "");
	if (!(f = popen(cmd, "r")))
		return -1;
	while (n < sizeof(buf) - 1 && !feof(f))
		n += fread(buf + n, 1, sizeof(buf) - 1 - n, f);
	buf[n] = 0;
	if (pclose(f) != 0) {
		fprintf(stderr, "tqbench spill: fio failed: %s\n", cmd);
		return -1;
	}
	const char *dir = strstr(rw, "write") ? "\"write\" : {" : "\"read\" : {";
	const char *o = strstr(buf, dir);
	if (!o)
		return -1;
	out->bw = json_num(o, "bw_bytes");
	const char *cl = strstr(o, "\"clat_ns\"");
	out->p50_us = cl ? json_num(cl, "50.000000") / 1e3 : -1;
	out->p99_us = cl ? json_num(cl, "99.000000") / 1e3 : -1;
	return out->bw > 0 ? 0 : -1;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tqbench spill [--dir DIR] [--mib N] [--json]\n"
		   "  --dir DIR  where the spill file and fio's file go (default build/bench-spill);\n"
		   "             put it on the disk you mean to measure\n"
		   "  --mib N    session size (default 1024)\n");
}

static int bench_spill_main(int argc, char **argv)
{
	const char *dir = "build/bench-spill";
	uint64_t mib = 1024;
	int json = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--dir") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
			mib = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--json"))
			json = 1;
		else {
			usage(!strcmp(argv[i], "--help") ? stdout : stderr);
			return strcmp(argv[i], "--help") ? 2 : 0;
		}
	}
	if (system("command -v fio >/dev/null") != 0) {
		fprintf(stderr, "tqbench spill: fio is not installed (apt-get install fio): it is the baseline\n");
		return 1;
	}
	mkdir("build", 0755);
	if (mkdir(dir, 0750) < 0 && errno != EEXIST) {
		fprintf(stderr, "tqbench spill: %s: %s\n", dir, strerror(errno));
		return 1;
	}
	log_set_level(LOG_WARNING);

	const uint32_t page = 64 << 10;
	uint64_t pool_bytes = (mib + mib / 4 + 64) * MiB;
	char text[512], err[CONFIG_ERR_MAX], why[512];
	struct config cfg;
	struct tenant_table *tt;
	struct pool *pool;
	tq_cache *cache;
	struct kvstore *ks;
	struct session_table *st;
	struct spill *sp;
	struct pool_params pp = { .bytes = pool_bytes, .page_bytes = page, .numa_node = -1, .hugepages = true };
	snprintf(text, sizeof(text), "[pool]\npool_bytes = %" PRIu64 "\n[tenant t]\nlimit = %" PRIu64 "\nallow_uids = *\n",
		 pool_bytes, pool_bytes);
	uint64_t slot_bytes = SPILL_HDR_BYTES + page;
	uint64_t qd1_pages = 4096;
	struct spill_params spp = { .dir = dir, .bytes = (mib * MiB / page + 64 + qd1_pages) * slot_bytes,
				    .page_bytes = page };
	if (config_load_string(&cfg, "bench.conf", text, err, sizeof(err)) != 0 || tenant_table_new(&tt, &cfg) < 0 ||
	    pool_new(&pool, &pp, why, sizeof(why)) < 0 || !(cache = tq_cache_new()) ||
	    kvstore_new(&ks, pool, cache) < 0 || session_table_new(&st, 4, kvstore_release, ks) < 0 ||
	    spill_open(&sp, &spp, why, sizeof(why)) < 0) {
		fprintf(stderr, "tqbench spill: setup: %s %s\n", err, why);
		return 1;
	}
	kvstore_set_spill(ks, sp);

	/* QD1 single-page restores: pages of our own in slots, random reads */
	uint8_t *pg = malloc(page);
	uint64_t *slots = malloc(qd1_pages * sizeof(*slots));
	memset(pg, 0x3c, page);
	for (uint64_t i = 0; i < qd1_pages; i++) {
		struct spill_page_hdr h = { .session_id = 1, .page_index = (uint32_t)i, .generation = 1 };
		if (spill_slot_alloc(sp, &slots[i]) < 0 || spill_write_sync(sp, slots[i], &h, pg, why, sizeof(why)) < 0) {
			fprintf(stderr, "tqbench spill: %s\n", why);
			return 1;
		}
	}
	const int nread = 2000;
	double *lat = malloc(nread * sizeof(*lat));
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	for (int i = 0; i < nread; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t k = (rng >> 20) % qd1_pages;
		struct spill_page_hdr h = { .session_id = 1, .page_index = (uint32_t)k, .generation = 1 };
		double t0 = bench_now();
		if (spill_read_sync(sp, slots[k], &h, pg, why, sizeof(why)) < 0) {
			fprintf(stderr, "tqbench spill: %s\n", why);
			return 1;
		}
		lat[i] = (bench_now() - t0) * 1e6;
	}
	qsort(lat, nread, sizeof(*lat), cmp_d);
	double qd1_p50 = lat[nread / 2], qd1_p99 = lat[nread * 99 / 100];
	for (uint64_t i = 0; i < qd1_pages; i++)
		spill_slot_free(sp, slots[i]);

	/* the session: 32 layers x 8 KV heads x 128, filled to about mib MiB */
	const struct session_geom g0 = { 32, 8, 32, 128, TQ_CODEC_Q8, TQ_CODEC_TQ4, 1 };
	int pt = dataop_page_tokens(page, &g0);
	uint64_t pages_per_layer = mib * MiB / page / 32;
	uint32_t tokens = (uint32_t)(pages_per_layer * (uint64_t)pt);
	struct session_geom g = g0;
	g.max_tokens = tokens;
	struct session_info si;
	struct session *s;
	if (session_open(st, tenant_find(tt, "t"), "", 0, &g, 7, 0, &si, why, sizeof(why)) < 0 ||
	    session_acquire(st, si.id, 0, &s) < 0) {
		fprintf(stderr, "tqbench spill: session: %s\n", why);
		return 1;
	}
	const uint32_t chunk = 256;
	float *kv = malloc((size_t)chunk * 8 * 128 * sizeof(float));
	for (size_t i = 0; i < (size_t)chunk * 8 * 128; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		kv[i] = (float)(rng >> 40) / (float)(1 << 24) - 0.5f;
	}
	struct dataop_res r;
	for (uint32_t l = 0; l < 32; l++)
		for (uint32_t t = 0; t < tokens; t += chunk) {
			dataop_append(ks, s, l, kv, kv, TQ_DTYPE_F32, tokens - t < chunk ? tokens - t : chunk, &r);
			if (r.res < 0) {
				fprintf(stderr, "tqbench spill: append: %s\n", tqkv_status_str(r.status));
				return 1;
			}
		}
	session_get_info(st, si.id, &si);
	uint64_t bytes = si.resident_bytes, done;

	/* a first pass writes the slots' fallocated (unwritten) extents, which
	 * costs the file system extra once; the measured passes follow */
	if (dataop_spill(ks, s, UINT64_MAX, &done, why, sizeof(why)) < 0 || dataop_restore(ks, s, why, sizeof(why)) < 0) {
		fprintf(stderr, "tqbench spill: warm-up: %s\n", why);
		return 1;
	}
	double t0 = bench_now();
	if (dataop_spill(ks, s, UINT64_MAX, &done, why, sizeof(why)) < 0 || done != bytes) {
		fprintf(stderr, "tqbench spill: spill: %s\n", why);
		return 1;
	}
	double t_spill = bench_now() - t0;
	t0 = bench_now();
	if (dataop_restore(ks, s, why, sizeof(why)) < 0) {
		fprintf(stderr, "tqbench spill: restore: %s\n", why);
		return 1;
	}
	double t_restore = bench_now() - t0;
	/* restore + attend: every layer read back by the attention that needs it */
	struct dataop_ws ws = { 0 };
	float q[32 * 128], out[32 * 128];
	int32_t pos = (int32_t)tokens - 1;
	for (int i = 0; i < 32 * 128; i++)
		q[i] = kv[i];
	dataop_spill(ks, s, UINT64_MAX, &done, why, sizeof(why));
	t0 = bench_now();
	for (uint32_t l = 0; l < 32; l++) {
		dataop_attend(ks, s, &ws, l, NULL, NULL, 0, q, &pos, 1, TQ_DTYPE_F32, out, &r);
		if (r.res < 0) {
			fprintf(stderr, "tqbench spill: attend: %s %s\n", tqkv_status_str(r.status), r.msg);
			return 1;
		}
	}
	double t_ra = bench_now() - t0;
	bench_sink(out);
	dataop_ws_free(&ws);
	session_release(s);
	session_close(st, si.id, NULL);

	/* fio on the same file system, same block size */
	char file[512];
	struct fio_res fw, fr, fq;
	snprintf(file, sizeof(file), "%s/fio.dat", dir);
	/* preallocated like the spill file, so both write into allocated blocks;
	 * every fio job runs 5 s (one pass over a small file is mostly start-up) */
	int ffd = open(file, O_RDWR | O_CREAT, 0600);
	if (ffd < 0 || posix_fallocate(ffd, 0, (off_t)bytes) != 0) {
		fprintf(stderr, "tqbench spill: %s: cannot preallocate\n", file);
		return 1;
	}
	close(ffd);
	if (fio_run(file, bytes, slot_bytes, "write", 32, 5, &fw) < 0 ||
	    fio_run(file, bytes, slot_bytes, "read", 32, 5, &fr) < 0 ||
	    fio_run(file, bytes, slot_bytes, "randread", 1, 5, &fq) < 0) {
		fprintf(stderr, "tqbench spill: no figures from fio\n");
		return 1;
	}
	unlink(file);

	double gb = (double)bytes / 1e9;
	double spill_bw = (double)bytes / t_spill, restore_bw = (double)bytes / t_restore;
	const char *isa = tq_isa_name(tq_isa_best());
	if (json) {
		printf("{\"suite\":\"spill\",\"isa\":\"%s\",\"engine\":\"%s\",\"session_bytes\":%" PRIu64
		       ",\"tokens\":%u,\"block_bytes\":%" PRIu64 ",\"spill_GBps\":%.3f,\"fio_write_GBps\":%.3f,"
		       "\"restore_GBps\":%.3f,\"fio_read_GBps\":%.3f,\"qd1_p50_us\":%.1f,\"qd1_p99_us\":%.1f,"
		       "\"fio_qd1_p50_us\":%.1f,\"fio_qd1_p99_us\":%.1f,\"restore_s\":%.4f,\"restore_attend_s\":%.4f}\n",
		       isa, spill_engine(sp), bytes, tokens, slot_bytes, spill_bw / 1e9, fw.bw / 1e9, restore_bw / 1e9,
		       fr.bw / 1e9, qd1_p50, qd1_p99, fq.p50_us, fq.p99_us, t_restore, t_ra);
	} else {
		printf("spill tier: %s; %s; ISA %s\n", spill_path(sp), spill_engine(sp), isa);
		printf("session: %.2f GB, %u tokens x 32 layers x 8 KV heads x 128 (q8/tq4); blocks of %" PRIu64
		       " bytes\n\n", gb, tokens, slot_bytes);
		printf("%-34s %12s %12s %8s\n", "measure", "tqkvd", "fio", "ratio");
		printf("%-34s %9.2f GB/s %7.2f GB/s %8.2f\n", "spill (seq write, 32 in flight)", spill_bw / 1e9,
		       fw.bw / 1e9, spill_bw / fw.bw);
		printf("%-34s %9.2f GB/s %7.2f GB/s %8.2f\n", "restore (seq read, 32 in flight)", restore_bw / 1e9,
		       fr.bw / 1e9, restore_bw / fr.bw);
		printf("%-34s %10.1f us %9.1f us %8.2f\n", "single-page restore QD1 p50", qd1_p50, fq.p50_us,
		       qd1_p50 / fq.p50_us);
		printf("%-34s %10.1f us %9.1f us %8.2f\n", "single-page restore QD1 p99", qd1_p99, fq.p99_us,
		       qd1_p99 / fq.p99_us);
		printf("%-34s %11.1f ms %9.1f ms %8.2f\n", "restore + attend vs restore alone", t_ra * 1e3,
		       t_restore * 1e3, t_ra / t_restore);
	}
	spill_close(sp);
	kvstore_free(ks);
	session_table_free(st);
	pool_free(pool);
	tq_cache_free(cache);
	tenant_table_free(tt);
	free(kv);
	free(pg);
	free(slots);
	free(lat);
	return 0;
}

TQ_BENCH_SUITE(spill, "spill [--dir DIR] [--mib N] [--json]", bench_spill_main)
