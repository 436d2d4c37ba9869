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
 * page + 4 KiB header) on a file in the same directory, each job paired
 * with our measurement on the same amount of work, just before or after
 * it in turns; the medians of the pairs' ratios are printed. */
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
	double p50_us, p99_us;     /* total latency: submission to completion */
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

/* Run fio over the first `size` bytes of file; n_ios > 0: that many I/Os,
 * else one pass.  0 and the job's figures. */
static int fio_run(const char *file, uint64_t size, uint64_t bs, const char *rw, int qd, int n_ios,
		   struct fio_res *out)
{
	char cmd[1024], buf[1 << 16], extra[64] = "";
	size_t n = 0;
	FILE *f;

	if (n_ios > 0)
		snprintf(extra, sizeof(extra), "--number_ios=%d", n_ios);
	snprintf(cmd, sizeof(cmd),
		 "fio --name=tq --filename=%s --size=%" PRIu64 " --bs=%" PRIu64 " --rw=%s --ioengine=io_uring "
		 "--direct=1 --iodepth=%d %s --lat_percentiles=1 --output-format=json 2>&1",
		 file, size, bs, rw, qd, extra);
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
	/* total latency (submission + completion), as ours is measured: the
	 * caller's view; clat alone would leave out fio's submit syscall */
	const char *cl = strstr(o, "\"lat_ns\"");
	out->p50_us = cl ? json_num(cl, "50.000000") / 1e3 : -1;
	out->p99_us = cl ? json_num(cl, "99.000000") / 1e3 : -1;
	return out->bw > 0 ? 0 : -1;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

#define QD1_N 2000

/* QD1_N random single-page reads at queue depth 1: p50 and p99 in us. */
static int qd1_reads(struct spill *sp, const uint64_t *slots, uint64_t n_slots, void *pg, uint64_t *rng,
		     double *p50, double *p99)
{
	enum { N = QD1_N };
	static double lat[N];
	char why[512];

	for (int i = 0; i < N; i++) {
		*rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t k = (*rng >> 20) % n_slots;
		struct spill_page_hdr h = { .session_id = 1, .page_index = (uint32_t)k, .generation = 1 };
		double t0 = bench_now();
		if (spill_read_sync(sp, slots[k], &h, pg, why, sizeof(why)) < 0) {
			fprintf(stderr, "tqbench spill: %s\n", why);
			return -1;
		}
		lat[i] = (bench_now() - t0) * 1e6;
	}
	qsort(lat, N, sizeof(lat[0]), cmp_d);
	*p50 = lat[N / 2];
	*p99 = lat[N * 99 / 100];
	return 0;
}

/* Open a session of g's geometry with tokens per layer and fill it. */
static int open_filled(struct session_table *st, struct tenant *t, struct kvstore *ks, const struct session_geom *g0,
		       uint32_t tokens, const float *kv, uint32_t chunk, struct session **s, struct session_info *si)
{
	struct session_geom g = *g0;
	struct dataop_res r;
	char why[512];

	g.max_tokens = tokens;
	if (session_open(st, t, "", 0, &g, 7, 0, 0, si, why, sizeof(why)) < 0 || session_acquire(st, si->id, 0, s) < 0) {
		fprintf(stderr, "tqbench spill: session: %s\n", why);
		return -1;
	}
	for (uint32_t l = 0; l < g.n_layers; l++)
		for (uint32_t i = 0; i < tokens; i += chunk) {
			dataop_append(ks, *s, l, kv, kv, TQ_DTYPE_F32, tokens - i < chunk ? tokens - i : chunk, &r);
			if (r.res < 0) {
				fprintf(stderr, "tqbench spill: append: %s\n", tqkv_status_str(r.status));
				return -1;
			}
		}
	session_get_info(st, si->id, si);
	return 0;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return v[n / 2];
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tqbench spill [--dir DIR] [--mib N] [--ctx T] [--rounds R] [--isa scalar|avx2|avx512|neon] [--json]\n"
		   "  --dir DIR  where the spill file and fio's file go (default build/bench-spill);\n"
		   "             put it on the disk you mean to measure\n"
		   "  --mib N    session size of the throughput measures (default 1024)\n"
		   "  --ctx T    tokens of the restore + attend session (default 32768)\n"
		   "  --rounds R rounds (1..9, default 5): each measure runs ours and fio's\n"
		   "             job back to back on the same amount of work, in turns\n"
		   "             (odd rounds fio first); the medians of the pairs' ratios\n"
		   "             are printed\n"
		   "  --isa I    cap the kernels' ISA (restore + attend, encoding); default: the best\n");
}

static int bench_spill_main(int argc, char **argv)
{
	const char *dir = "build/bench-spill";
	uint64_t mib = 1024;
	uint32_t ctx = 32768;
	int json = 0, rounds = 5;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--dir") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
			mib = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
			ctx = (uint32_t)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
			const char *isa = argv[++i];
			if (tq_isa_from_name(isa) <= TQ_ISA_AUTO) {
				fprintf(stderr, "tqbench spill: unknown isa %s\n", isa);
				return 2;
			}
			/* the daemon's code picks TQ_ISA_AUTO; TQ_ISA caps that choice */
			setenv("TQ_ISA", isa, 1);
		} else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--json"))
			json = 1;
		else {
			usage(!strcmp(argv[i], "--help") ? stdout : stderr);
			return strcmp(argv[i], "--help") ? 2 : 0;
		}
	}
	if (rounds < 1 || rounds > 9 || mib < 64 || mib > (1u << 20) || ctx < 1 || ctx > (1u << 20)) {
		usage(stderr);
		return 2;
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
	/* the session of the throughput measures: about mib MiB; the one of
	 * restore + attend: ctx tokens */
	const struct session_geom g0 = { 32, 8, 32, 128, TQ_CODEC_Q8, TQ_CODEC_TQ4, 1, 0 };
	int pt = dataop_page_tokens(page, 0, &g0);
	uint64_t pages_per_layer = mib * MiB / page / 32;
	uint32_t tokens = (uint32_t)(pages_per_layer * (uint64_t)pt);
	uint64_t ctx_pages = ((uint64_t)ctx + (uint64_t)pt - 1) / (uint64_t)pt * 32;
	uint64_t pool_bytes = (mib + mib / 4 + 64) * MiB + ctx_pages * page * 5 / 4;
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
	struct spill_params spp = { .dir = dir, .bytes = (mib * MiB / page + 64 + qd1_pages + ctx_pages) * slot_bytes,
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
	uint8_t *pg = aligned_alloc(4096, page); /* a pool page is block-aligned */
	uint64_t *slots = malloc(qd1_pages * sizeof(*slots));
	memset(pg, 0x3c, page);
	for (uint64_t i = 0; i < qd1_pages; i++) {
		struct spill_page_hdr h = { .session_id = 1, .page_index = (uint32_t)i, .generation = 1 };
		if (spill_slot_alloc(sp, &slots[i]) < 0 || spill_write_sync(sp, slots[i], &h, pg, why, sizeof(why)) < 0) {
			fprintf(stderr, "tqbench spill: %s\n", why);
			return 1;
		}
	}
	uint64_t rng = 0x9e3779b97f4a7c15ull;

	/* the sessions: 32 layers x 8 KV heads x 128 */
	const uint32_t chunk = 256;
	float *kv = malloc((size_t)chunk * 8 * 128 * sizeof(float));
	for (size_t i = 0; i < (size_t)chunk * 8 * 128; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		kv[i] = (float)(rng >> 40) / (float)(1 << 24) - 0.5f;
	}
	struct dataop_res r;
	struct session_info si, si2;
	struct session *s, *s2;
	if (open_filled(st, tenant_find(tt, "t"), ks, &g0, tokens, kv, chunk, &s, &si) < 0 ||
	    open_filled(st, tenant_find(tt, "t"), ks, &g0, ctx, kv, chunk, &s2, &si2) < 0)
		return 1;
	uint64_t bytes = si.resident_bytes, done;

	/* a first pass writes the slots' fallocated (unwritten) extents, which
	 * costs the file system extra once; the measured passes follow */
	if (dataop_spill(ks, s, UINT64_MAX, &done, why, sizeof(why)) < 0 || dataop_restore(ks, s, why, sizeof(why)) < 0 ||
	    dataop_spill(ks, s2, UINT64_MAX, &done, why, sizeof(why)) < 0 || dataop_restore(ks, s2, why, sizeof(why)) < 0) {
		fprintf(stderr, "tqbench spill: warm-up: %s\n", why);
		return 1;
	}
	/* The disk of a cloud VM swings by 2x within seconds (bursts, host
	 * neighbours), so each of our measurements is paired with fio's job on
	 * the same amount of work run right before or after it (alternating),
	 * and the medians of the pairs' ratios are reported. */
	struct dataop_ws ws = { 0 };
	float q[32 * 128], out[32 * 128];
	int32_t pos = (int32_t)ctx - 1;
	for (int i = 0; i < 32 * 128; i++)
		q[i] = kv[i];
	char file[512];
	snprintf(file, sizeof(file), "%s/fio.dat", dir);
	/* preallocated and written once, like the spill file after warm-up */
	int ffd = open(file, O_RDWR | O_CREAT, 0600);
	if (ffd < 0 || posix_fallocate(ffd, 0, (off_t)bytes) != 0) {
		fprintf(stderr, "tqbench spill: %s: cannot preallocate\n", file);
		return 1;
	}
	close(ffd);
	struct fio_res fw, fr, fq;
	struct spill_stats sst;
	spill_stats(sp, &sst);
	int qd = (int)sst.queue_depth; /* fio keeps as many in flight as we do */
	if (fio_run(file, bytes, slot_bytes, "write", qd, 0, &fw) < 0) {
		fprintf(stderr, "tqbench spill: no figures from fio\n");
		return 1;
	}
	enum { RMAX = 9 };
	double v_spill[RMAX], v_restore[RMAX], v_ra[RMAX], v_at[RMAX], v_p50[RMAX], v_p99[RMAX];
	double f_w[RMAX], f_r[RMAX], f_p50[RMAX], f_p99[RMAX];
	double x_w[RMAX], x_r[RMAX], x_p50[RMAX], x_p99[RMAX];
	for (int k = 0; k < rounds; k++) {
		bool fio_first = k % 2;
		double t0;
		/* spill vs sequential write */
		if (fio_first && fio_run(file, bytes, slot_bytes, "write", qd, 0, &fw) < 0)
			goto fio_failed;
		t0 = bench_now();
		if (dataop_spill(ks, s, UINT64_MAX, &done, why, sizeof(why)) < 0 || done != bytes) {
			fprintf(stderr, "tqbench spill: spill: %s\n", why);
			return 1;
		}
		v_spill[k] = (double)bytes / (bench_now() - t0);
		if (!fio_first && fio_run(file, bytes, slot_bytes, "write", qd, 0, &fw) < 0)
			goto fio_failed;
		/* restore vs sequential read */
		if (fio_first && fio_run(file, bytes, slot_bytes, "read", qd, 0, &fr) < 0)
			goto fio_failed;
		t0 = bench_now();
		if (dataop_restore(ks, s, why, sizeof(why)) < 0) {
			fprintf(stderr, "tqbench spill: restore: %s\n", why);
			return 1;
		}
		double t_restore = bench_now() - t0;
		v_restore[k] = (double)bytes / t_restore;
		if (!fio_first && fio_run(file, bytes, slot_bytes, "read", qd, 0, &fr) < 0)
			goto fio_failed;
		/* restore + attend, on the ctx-token session: restore alone; then
		 * attention alone, every page resident (what read-ahead hides);
		 * then spilled again, and every layer read back by the attention
		 * that needs it */
		dataop_spill(ks, s2, UINT64_MAX, &done, why, sizeof(why));
		t0 = bench_now();
		if (dataop_restore(ks, s2, why, sizeof(why)) < 0) {
			fprintf(stderr, "tqbench spill: restore: %s\n", why);
			return 1;
		}
		t_restore = bench_now() - t0;
		t0 = bench_now();
		for (uint32_t l = 0; l < 32; l++)
			dataop_attend(ks, s2, &ws, l, NULL, NULL, 0, q, &pos, 1, TQ_DTYPE_F32, out, &r);
		v_at[k] = (bench_now() - t0) / t_restore;
		dataop_spill(ks, s2, UINT64_MAX, &done, why, sizeof(why));
		t0 = bench_now();
		for (uint32_t l = 0; l < 32; l++) {
			dataop_attend(ks, s2, &ws, l, NULL, NULL, 0, q, &pos, 1, TQ_DTYPE_F32, out, &r);
			if (r.res < 0) {
				fprintf(stderr, "tqbench spill: attend: %s %s\n", tqkv_status_str(r.status), r.msg);
				return 1;
			}
		}
		v_ra[k] = (bench_now() - t0) / t_restore;
		bench_sink(out);
		/* single-page restores vs QD1 random reads */
		if (fio_first && fio_run(file, bytes, slot_bytes, "randread", 1, QD1_N, &fq) < 0)
			goto fio_failed;
		if (qd1_reads(sp, slots, qd1_pages, pg, &rng, &v_p50[k], &v_p99[k]) < 0)
			return 1;
		if (!fio_first && fio_run(file, bytes, slot_bytes, "randread", 1, QD1_N, &fq) < 0)
			goto fio_failed;
		f_w[k] = fw.bw;
		f_r[k] = fr.bw;
		f_p50[k] = fq.p50_us;
		f_p99[k] = fq.p99_us;
		x_w[k] = v_spill[k] / fw.bw;
		x_r[k] = v_restore[k] / fr.bw;
		x_p50[k] = v_p50[k] / fq.p50_us;
		x_p99[k] = v_p99[k] / fq.p99_us;
		if (!json)
			printf("round %d (%s first): write %.2f/%.2f GB/s, read %.2f/%.2f GB/s, QD1 p50 %.0f/%.0f us, "
			       "p99 %.0f/%.0f us, attend alone %.2f, restore+attend %.2f\n", k + 1, fio_first ? "fio" : "ours",
			       v_spill[k] / 1e9, fw.bw / 1e9, v_restore[k] / 1e9, fr.bw / 1e9, v_p50[k], fq.p50_us,
			       v_p99[k], fq.p99_us, v_at[k], v_ra[k]);
	}
	if (0) {
fio_failed:
		fprintf(stderr, "tqbench spill: no figures from fio\n");
		unlink(file);
		return 1;
	}
	unlink(file);
	dataop_ws_free(&ws);
	session_release(s);
	session_close(st, si.id, NULL);
	session_release(s2);
	session_close(st, si2.id, NULL);
	for (uint64_t i = 0; i < qd1_pages; i++)
		spill_slot_free(sp, slots[i]);
	double spill_bw = median(v_spill, rounds), restore_bw = median(v_restore, rounds);
	double qd1_p50 = median(v_p50, rounds), qd1_p99 = median(v_p99, rounds), ra = median(v_ra, rounds);
	fw.bw = median(f_w, rounds);
	fr.bw = median(f_r, rounds);
	fq.p50_us = median(f_p50, rounds);
	fq.p99_us = median(f_p99, rounds);
	double r_w = median(x_w, rounds), r_r = median(x_r, rounds), r_p50 = median(x_p50, rounds),
	       r_p99 = median(x_p99, rounds);

	double gb = (double)bytes / 1e9;
	const char *isa = tq_isa_name(tq_isa_best());
	if (json) {
		printf("{\"suite\":\"spill\",\"isa\":\"%s\",\"engine\":\"%s\",\"session_bytes\":%" PRIu64
		       ",\"tokens\":%u,\"block_bytes\":%" PRIu64 ",\"spill_GBps\":%.3f,\"fio_write_GBps\":%.3f,"
		       "\"restore_GBps\":%.3f,\"fio_read_GBps\":%.3f,\"qd1_p50_us\":%.1f,\"qd1_p99_us\":%.1f,"
		       "\"fio_qd1_p50_us\":%.1f,\"fio_qd1_p99_us\":%.1f,\"spill_vs_fio\":%.3f,\"restore_vs_fio\":%.3f,"
		       "\"qd1_p50_vs_fio\":%.3f,\"qd1_p99_vs_fio\":%.3f,\"restore_attend_vs_restore\":%.3f,\"attend_vs_restore\":%.3f,\"ctx\":%u,\"rounds\":%d}\n",
		       isa, spill_engine(sp), bytes, tokens, slot_bytes, spill_bw / 1e9, fw.bw / 1e9, restore_bw / 1e9,
		       fr.bw / 1e9, qd1_p50, qd1_p99, fq.p50_us, fq.p99_us, r_w, r_r, r_p50, r_p99, ra, median(v_at, rounds), ctx, rounds);
	} else {
		printf("spill tier: %s; %s; ISA %s\n", spill_path(sp), spill_engine(sp), isa);
		printf("session: %.2f GB, %u tokens x 32 layers x 8 KV heads x 128 (q8/tq4); blocks of %" PRIu64
		       " bytes\n", gb, tokens, slot_bytes);
		printf("restore + attend: a session of %u tokens (%.2f GB), one query per layer at the last position\n\n",
		       ctx, (double)si2.resident_bytes / 1e9);
		printf("%-34s %12s %12s %8s\n", "measure", "tqkvd", "fio", "ratio");
		printf("%-34s %9.2f GB/s %7.2f GB/s %8.2f\n", "spill (seq write)", spill_bw / 1e9,
		       fw.bw / 1e9, r_w);
		printf("%-34s %9.2f GB/s %7.2f GB/s %8.2f\n", "restore (seq read)", restore_bw / 1e9,
		       fr.bw / 1e9, r_r);
		printf("%-34s %10.1f us %9.1f us %8.2f\n", "single-page restore QD1 p50", qd1_p50, fq.p50_us,
		       r_p50);
		printf("%-34s %10.1f us %9.1f us %8.2f\n", "single-page restore QD1 p99", qd1_p99, fq.p99_us,
		       r_p99);
		printf("%-34s %12s %12s %8.2f\n", "restore + attend / restore alone", "", "", ra);
		printf("%-34s %12s %12s %8.2f\n", "(attend alone / restore alone)", "", "", median(v_at, rounds));
		printf("\n(%d rounds; each measure paired with fio's job on the same work, run just before or\n"
		       " after it in turns; figures: medians of the rounds; ratio: median of the pairs' ratios)\n",
		       rounds);
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
	return 0;
}

TQ_BENCH_SUITE(spill, "spill [--dir DIR] [--mib N] [--ctx T] [--rounds R] [--isa I] [--json]", bench_spill_main)
