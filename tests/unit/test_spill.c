/* test_spill — the spill store on its own: pages round-trip bit-exact
 * through io_uring (and the pread/pwrite fallback), from block-aligned
 * pages (the fast path: the page is the I/O buffer) and from unaligned
 * ones (the reference path: through the registered staging buffers),
 * batches of asynchronous I/O complete, threads waiting at once all get
 * their own pages while one of them drives the ring, a corrupted byte or
 * a page that is not the expected one is never served, injected I/O
 * errors surface, a full store says so, and a file system without room is
 * refused at open. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "spill.h"

#define PAGE (64u << 10)

static char dir[64];

static void mkdir_tmp(void)
{
	snprintf(dir, sizeof(dir), "/tmp/tq-spill-XXXXXX");
	if (!mkdtemp(dir))
		t_skip("no temporary directory");
}

static void rm_tmp(void)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/%s", dir, SPILL_FILE);
	unlink(path);
	rmdir(dir);
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		p[i] = (uint8_t)(seed >> 56);
	}
}

static struct spill_page_hdr hdr_of(uint64_t session, uint32_t layer, uint32_t page, uint64_t gen)
{
	struct spill_page_hdr h = { 0 };
	h.session_id = session;
	h.layer = layer;
	h.page_index = page;
	h.generation = gen;
	h.n_tokens = 17;
	h.rotation_seed = 0xabcdef;
	h.k_codec = 4;
	h.v_codec = 3;
	return h;
}

static void test_crc32c(void)
{
	/* the standard check value, and continuation */
	T_EQ(spill_crc32c(0, "123456789", 9), 0xe3069283u);
	T_EQ(spill_crc32c(spill_crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
	T_EQ(spill_crc32c(0, "", 0), 0u);
}

static struct spill *open_store(uint64_t slots, bool fallback)
{
	struct spill_params p = { .dir = dir, .bytes = slots * (SPILL_HDR_BYTES + PAGE), .page_bytes = PAGE,
				  .queue_depth = 8, .force_fallback = fallback };
	struct spill *sp;
	char why[512];
	int r = spill_open(&sp, &p, why, sizeof(why));
	if (r < 0) {
		fprintf(stderr, "    spill_open: %s\n", why);
		return NULL;
	}
	fprintf(stderr, "    engine: %s\n", spill_engine(sp));
	return sp;
}

struct counter {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int done, failed;
};

static void count_done(void *ctx, int res, const char *why)
{
	struct counter *c = ctx;
	pthread_mutex_lock(&c->lock);
	c->done++;
	c->failed += res < 0;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
	(void)why;
}

/* n pages: block-aligned (direct), or 64 bytes off (through staging). */
static uint8_t *pages_of(uint8_t **base, size_t n, bool direct)
{
	if (!(*base = aligned_alloc(4096, n * PAGE + 4096))) {
		fprintf(stderr, "out of memory\n");
		abort();
	}
	return *base + (direct ? 0 : 64);
}

static void roundtrip(struct spill *sp, bool direct)
{
	enum { N = 40 };
	uint8_t *base_p, *base_b;
	uint8_t (*pages)[PAGE] = (uint8_t (*)[PAGE])pages_of(&base_p, N, direct);
	uint8_t (*back)[PAGE] = (uint8_t (*)[PAGE])pages_of(&base_b, N, direct);
	uint64_t slots[N];
	struct counter c = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
	struct spill_stats st;
	char why[512];

	/* more requests than queue entries: they wait for staging and complete */
	for (int i = 0; i < N; i++) {
		fill(pages[i], PAGE, (uint64_t)i + 1);
		T_EQ(spill_slot_alloc(sp, &slots[i]), 0);
		struct spill_page_hdr h = hdr_of(7, (uint32_t)i % 3, (uint32_t)i, 1);
		T_EQ(spill_write(sp, slots[i], &h, pages[i], count_done, &c, i % 2 ? SPILL_BACKGROUND : 0), 0);
	}
	pthread_mutex_lock(&c.lock);
	while (c.done < N)
		pthread_cond_wait(&c.cond, &c.lock);
	pthread_mutex_unlock(&c.lock);
	T_EQ(c.failed, 0);
	c.done = 0;
	for (int i = N - 1; i >= 0; i--) {
		struct spill_page_hdr h = hdr_of(7, (uint32_t)i % 3, (uint32_t)i, 1);
		T_EQ(spill_read(sp, slots[i], &h, back[i], count_done, &c, i % 3 ? 0 : SPILL_BACKGROUND), 0);
	}
	pthread_mutex_lock(&c.lock);
	while (c.done < N)
		pthread_cond_wait(&c.cond, &c.lock);
	pthread_mutex_unlock(&c.lock);
	T_EQ(c.failed, 0);
	for (int i = 0; i < N; i++)
		if (memcmp(pages[i], back[i], PAGE))
			T_FAIL("page %d differs after the round trip", i);
	/* the wrong page, generation or session is refused, not served */
	struct spill_page_hdr h = hdr_of(7, 0, 0, 2);
	memset(back[0], 0x5a, PAGE);
	T_EQ(spill_read_sync(sp, slots[0], &h, back[0], why, sizeof(why)), -EBADMSG);
	T_ASSERT(strstr(why, "generation 1, expected") && strstr(why, SPILL_FILE));
	if (!direct) /* through staging the page is untouched; direct, its bytes are the caller's to drop */
		T_EQ(back[0][0], 0x5a);
	h = hdr_of(8, 0, 0, 1);
	T_EQ(spill_read_sync(sp, slots[0], &h, back[0], why, sizeof(why)), -EBADMSG);
	/* a reader that counts more tokens in the page than its copy holds
	 * (17) is refused (it would read slots never written); fewer (a
	 * truncated layer's) is fine */
	h = hdr_of(7, 0, 0, 1);
	h.n_tokens = 18;
	T_EQ(spill_read_sync(sp, slots[0], &h, back[0], why, sizeof(why)), -EBADMSG);
	T_ASSERT(strstr(why, "holds 17 tokens of page 0, the session counts 18 there"));
	h.n_tokens = 3;
	T_EQ(spill_read_sync(sp, slots[0], &h, back[0], why, sizeof(why)), 0);
	T_ASSERT(memcmp(pages[0], back[0], PAGE) == 0);
	spill_stats(sp, &st);
	T_ASSERT(st.read_p99_us >= st.read_p50_us);
	for (int i = 0; i < N; i++)
		spill_slot_free(sp, slots[i]);
	spill_stats(sp, &st);
	T_EQ(st.slots_used, 0);
	free(base_p);
	free(base_b);
}

static void roundtrip_counted(struct spill *sp, bool direct)
{
	struct spill_stats st0, st;

	spill_stats(sp, &st0);
	roundtrip(sp, direct);
	spill_stats(sp, &st);
	T_EQ(st.writes - st0.writes, 40);
	T_EQ(st.reads - st0.reads, 40 + 4);
	T_EQ(st.crc_failures - st0.crc_failures, 3);
	T_EQ(st.bytes_written - st0.bytes_written, (uint64_t)40 * st.slot_bytes);
}

/* Threads that wait at once: one drives the ring and runs the others'
 * callbacks; each gets exactly its own pages.  The main thread meanwhile
 * keeps asynchronous writes in flight that nobody waits on in the store
 * (the I/O thread reaps those when no waiter does). */
enum { MT_THREADS = 4, MT_PAGES = 24, MT_READS = 150 };
struct mt_arg {
	struct spill *sp;
	uint64_t *slots;
	int id, bad;
};

static void *mt_reader(void *arg)
{
	struct mt_arg *a = arg;
	uint8_t *base, *pg = pages_of(&base, 1, a->id % 2 == 0), *want = malloc(PAGE);
	uint64_t rng = (uint64_t)a->id * 7919 + 1;
	char why[512];

	for (int i = 0; i < MT_READS; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		uint32_t k = (uint32_t)(rng >> 33) % MT_PAGES;
		struct spill_page_hdr h = hdr_of(11, 0, k, 1);
		if (spill_read_sync(a->sp, a->slots[k], &h, pg, why, sizeof(why)) != 0) {
			a->bad++;
			continue;
		}
		fill(want, PAGE, 1000 + k);
		a->bad += memcmp(pg, want, PAGE) != 0;
	}
	free(want);
	free(base);
	return NULL;
}

/* An io_uring store in a fresh directory, or NULL (said why, cleaned up):
 * no io_uring or O_DIRECT here; the fallback's tests still run. */
static struct spill *open_uring_store(void)
{
	mkdir_tmp();
	struct spill *sp = open_store(64, false);
	if (!sp) {
		rm_tmp();
		fprintf(stderr, "    skipped: io_uring with O_DIRECT is not available here\n");
	}
	return sp;
}

static void test_concurrent_waiters(void)
{
	struct spill *sp = open_uring_store();
	if (!sp)
		return;
	uint8_t *base, *pages = pages_of(&base, MT_PAGES, true);
	uint64_t slots[MT_PAGES], wslots[8];
	char why[512];
	for (uint32_t k = 0; k < MT_PAGES; k++) {
		fill(pages + (size_t)k * PAGE, PAGE, 1000 + k);
		struct spill_page_hdr h = hdr_of(11, 0, k, 1);
		T_EQ(spill_slot_alloc(sp, &slots[k]), 0);
		T_EQ(spill_write_sync(sp, slots[k], &h, pages + (size_t)k * PAGE, why, sizeof(why)), 0);
	}
	for (int i = 0; i < 8; i++)
		T_EQ(spill_slot_alloc(sp, &wslots[i]), 0);
	pthread_t th[MT_THREADS];
	struct mt_arg args[MT_THREADS];
	for (int t = 0; t < MT_THREADS; t++) {
		args[t] = (struct mt_arg){ sp, slots, t, 0 };
		T_EQ(pthread_create(&th[t], NULL, mt_reader, &args[t]), 0);
	}
	struct counter c = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
	int sent = 0;
	for (int round = 0; round < 40; round++) {
		for (int i = 0; i < 8; i++, sent++) {
			struct spill_page_hdr h = hdr_of(12, 0, (uint32_t)i, (uint64_t)round + 1);
			T_EQ(spill_write(sp, wslots[i], &h, pages + (size_t)i * PAGE, count_done, &c, SPILL_BACKGROUND), 0);
		}
		pthread_mutex_lock(&c.lock);
		while (c.done < sent)
			pthread_cond_wait(&c.cond, &c.lock);
		pthread_mutex_unlock(&c.lock);
	}
	for (int t = 0; t < MT_THREADS; t++) {
		pthread_join(th[t], NULL);
		T_EQ(args[t].bad, 0);
	}
	T_EQ(c.failed, 0);
	struct spill_stats st;
	spill_stats(sp, &st);
	T_EQ(st.reads, (uint64_t)MT_THREADS * MT_READS);
	T_EQ(st.io_errors + st.crc_failures, 0);
	spill_close(sp);
	free(base);
	rm_tmp();
}

static void test_roundtrip_uring(void)
{
	struct spill *sp = open_uring_store();
	if (!sp)
		return;
	T_ASSERT(strstr(spill_engine(sp), "io_uring"));
	roundtrip_counted(sp, true);
	roundtrip_counted(sp, false);
	spill_close(sp);
	rm_tmp();
}

static void test_roundtrip_fallback(void)
{
	/* the fallback engine, forced: tmpfs has no O_DIRECT; elsewhere,
	 * the same engine is reached only when io_uring fails, so this test
	 * drives it on /dev/shm when it exists */
	struct stat sb;
	if (stat("/dev/shm", &sb) < 0) {
		fprintf(stderr, "    skipped: no /dev/shm\n");
		return;
	}
	snprintf(dir, sizeof(dir), "/dev/shm/tq-spill-XXXXXX");
	T_ASSERT(mkdtemp(dir));
	struct spill_params p = { .dir = dir, .bytes = 64 * (SPILL_HDR_BYTES + PAGE), .page_bytes = PAGE };
	struct spill *sp;
	char why[512];
	int r = spill_open(&sp, &p, why, sizeof(why));
	if (r == 0) { /* this tmpfs takes O_DIRECT (Linux >= 6.6) and io_uring works */
		spill_close(sp);
	} else {
		/* without the switch: refused, naming the reason and the switch */
		T_ASSERT(strstr(why, "spill_fallback"));
	}
	sp = open_store(64, true);
	T_ASSERT(sp != NULL);
	T_ASSERT(strstr(spill_engine(sp), "pread/pwrite"));
	roundtrip_counted(sp, true);
	spill_close(sp);
	rm_tmp();
}

static void corruption_and_faults(bool fallback, bool direct)
{
	uint8_t *base_p, *base_b, *page = pages_of(&base_p, 1, direct), *back = pages_of(&base_b, 1, direct);
	char why[512], path[128];
	uint64_t slot, slot2;

	mkdir_tmp();
	struct spill *sp = open_store(4, fallback);
	if (!sp) {
		fprintf(stderr, "    skipped (%s): io_uring with O_DIRECT is not available here\n",
			direct ? "direct" : "staged");
		rm_tmp();
		free(base_p);
		free(base_b);
		return;
	}
	fill(page, PAGE, 99);
	struct spill_page_hdr h = hdr_of(3, 1, 5, 9);
	T_EQ(spill_slot_alloc(sp, &slot), 0);
	T_EQ(spill_write_sync(sp, slot, &h, page, why, sizeof(why)), 0);
	T_EQ(spill_read_sync(sp, slot, &h, back, why, sizeof(why)), 0);
	T_ASSERT(memcmp(page, back, PAGE) == 0);
	/* one flipped byte in the payload, then in the header */
	snprintf(path, sizeof(path), "%s/%s", dir, SPILL_FILE);
	int fd = open(path, O_RDWR);
	T_ASSERT(fd >= 0);
	uint64_t off = slot * (SPILL_HDR_BYTES + PAGE);
	uint8_t b;
	T_EQ(pread(fd, &b, 1, (off_t)(off + SPILL_HDR_BYTES + 1000)), 1);
	b ^= 0x10;
	T_EQ(pwrite(fd, &b, 1, (off_t)(off + SPILL_HDR_BYTES + 1000)), 1);
	memset(back, 0, PAGE);
	T_EQ(spill_read_sync(sp, slot, &h, back, why, sizeof(why)), -EBADMSG);
	T_ASSERT(strstr(why, "checksum mismatch") && strstr(why, path));
	if (!direct)
		T_EQ(back[0], 0); /* nothing was served */
	T_EQ(spill_write_sync(sp, slot, &h, page, why, sizeof(why)), 0);
	T_EQ(pread(fd, &b, 1, (off_t)(off + 40)), 1); /* inside the header: generation */
	b ^= 1;
	T_EQ(pwrite(fd, &b, 1, (off_t)(off + 40)), 1);
	T_EQ(spill_read_sync(sp, slot, &h, back, why, sizeof(why)), -EBADMSG);
	close(fd);
	/* injected I/O errors: the nth next write, then read */
	spill_fault_arm(sp, SPILL_FAULT_WRITE, 2, -EIO);
	T_EQ(spill_write_sync(sp, slot, &h, page, why, sizeof(why)), 0);
	T_EQ(spill_write_sync(sp, slot, &h, page, why, sizeof(why)), -EIO);
	T_ASSERT(strstr(why, "injected"));
	T_EQ(spill_write_sync(sp, slot, &h, page, why, sizeof(why)), 0);
	spill_fault_arm(sp, SPILL_FAULT_READ, 1, -EIO);
	T_EQ(spill_read_sync(sp, slot, &h, back, why, sizeof(why)), -EIO);
	T_EQ(spill_read_sync(sp, slot, &h, back, why, sizeof(why)), 0);
	/* transient failures (a cancelled or interrupted request: its
	 * submitter exited, a signal) are submitted again, not reported */
	struct spill_stats st0;
	spill_stats(sp, &st0);
	spill_fault_arm(sp, SPILL_FAULT_WRITE, 1, -ECANCELED);
	T_EQ(spill_write_sync(sp, slot, &h, page, why, sizeof(why)), 0);
	spill_fault_arm(sp, SPILL_FAULT_READ, 1, -EINTR);
	memset(back, 0, PAGE);
	T_EQ(spill_read_sync(sp, slot, &h, back, why, sizeof(why)), 0);
	T_ASSERT(memcmp(page, back, PAGE) == 0);
	struct spill_stats st1;
	spill_stats(sp, &st1);
	T_EQ(st1.retries - st0.retries, 2);
	T_EQ(st1.io_errors, st0.io_errors);
	/* a disk that keeps failing so: submitted again 3 times, then the
	 * error, saying so; 3 in a row still come through */
	spill_fault_arm_n(sp, SPILL_FAULT_READ, 1, 4, -ECANCELED);
	T_EQ(spill_read_sync(sp, slot, &h, back, why, sizeof(why)), -ECANCELED);
	T_ASSERT(strstr(why, "after 3 transient failure(s)"));
	spill_fault_arm_n(sp, SPILL_FAULT_WRITE, 1, 3, -EAGAIN);
	T_EQ(spill_write_sync(sp, slot, &h, page, why, sizeof(why)), 0);
	memset(back, 0, PAGE);
	T_EQ(spill_read_sync(sp, slot, &h, back, why, sizeof(why)), 0);
	T_ASSERT(memcmp(page, back, PAGE) == 0);
	spill_stats(sp, &st1);
	T_EQ(st1.retries - st0.retries, 2 + 3 + 3);
	T_EQ(st1.io_errors, st0.io_errors + 1);
	/* a full store */
	uint64_t s3, s4;
	T_EQ(spill_slot_alloc(sp, &slot2), 0);
	T_EQ(spill_slot_alloc(sp, &s3), 0);
	T_EQ(spill_slot_alloc(sp, &s4), 0);
	uint64_t s5;
	T_EQ(spill_slot_alloc(sp, &s5), -ENOSPC);
	spill_slot_free(sp, s3);
	T_EQ(spill_slot_alloc(sp, &s5), 0);
	T_EQ(s5, s3);
	struct spill_stats st;
	spill_stats(sp, &st);
	T_EQ(st.io_errors, 3); /* two injected -EIO, one -ECANCELED past its retries */
	T_EQ(st.crc_failures, 2);
	T_EQ(st.slots_total, 4);
	spill_close(sp);
	rm_tmp();
	free(base_p);
	free(base_b);
}

/* A file larger than the store now asks for (pool.spill_bytes lowered) is
 * left as it is: pages of persistent sessions set aside may lie beyond
 * (a start used to cut them off). */
static void test_larger_file_kept(void)
{
	struct spill_params p = { .dir = NULL, .bytes = 8 * (SPILL_HDR_BYTES + PAGE), .page_bytes = PAGE,
				  .allow_fallback = true };
	struct spill *sp;
	struct stat sb;
	char why[512], path[600];

	mkdir_tmp();
	p.dir = dir;
	T_EQ(spill_open(&sp, &p, why, sizeof(why)), 0);
	spill_close(sp);
	snprintf(path, sizeof(path), "%s/%s", dir, SPILL_FILE);
	p.bytes = 4 * (SPILL_HDR_BYTES + PAGE);
	T_EQ(spill_open(&sp, &p, why, sizeof(why)), 0);
	struct spill_stats st;
	spill_stats(sp, &st);
	T_EQ(st.slots_total, 4);
	T_EQ(stat(path, &sb), 0);
	T_EQ((uint64_t)sb.st_size, 8 * (SPILL_HDR_BYTES + PAGE)); /* not cut */
	spill_close(sp);
	rm_tmp();
}

/* spill.dat must be a regular file of its own: a symbolic link left in
 * spill_dir is not followed (the store would write where it points), a
 * FIFO or a directory is refused with the reason.  A file system that
 * cannot preallocate gets a file of the size, not a refusal. */
static void test_not_a_file(void)
{
	struct spill_params p = { .dir = NULL, .bytes = 64 * (SPILL_HDR_BYTES + PAGE), .page_bytes = PAGE,
				  .allow_fallback = true };
	struct spill *sp;
	struct stat sb;
	char why[512], path[600], target[600];

	mkdir_tmp();
	p.dir = dir;
	snprintf(path, sizeof(path), "%s/%s", dir, SPILL_FILE);
	snprintf(target, sizeof(target), "%s/elsewhere", dir);
	T_EQ(symlink(target, path), 0);
	T_ASSERT(spill_open(&sp, &p, why, sizeof(why)) < 0);
	fprintf(stderr, "    link: %s\n", why);
	T_ASSERT(strstr(why, "symbolic link") && strstr(why, "spill_dir"));
	T_EQ(stat(target, &sb), -1); /* nothing created where it points */
	T_EQ(unlink(path), 0);

	T_EQ(mkfifo(path, 0600), 0);
	T_EQ(spill_open(&sp, &p, why, sizeof(why)), -EINVAL);
	fprintf(stderr, "    fifo: %s\n", why);
	T_ASSERT(strstr(why, "not a regular file"));
	T_EQ(unlink(path), 0);

	T_EQ(mkdir(path, 0700), 0);
	T_ASSERT(spill_open(&sp, &p, why, sizeof(why)) < 0);
	fprintf(stderr, "    directory: %s\n", why);
	T_EQ(rmdir(path), 0);

	setenv("TQKVD_TEST_NO_FALLOCATE", "1", 1);
	T_EQ(spill_open(&sp, &p, why, sizeof(why)), 0);
	T_EQ(stat(path, &sb), 0);
	T_EQ((uint64_t)sb.st_size, 64 * (SPILL_HDR_BYTES + PAGE)); /* sized, blocks not reserved */
	roundtrip_counted(sp, true);
	spill_close(sp);
	unsetenv("TQKVD_TEST_NO_FALLOCATE");
	rm_tmp();
}

static double ms_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* io_uring_submit failing: a few times, the I/O is submitted again and
 * completes; for give_up_ms in a row, the store stops — what the kernel
 * never took fails with the reason (a waiter that drives the ring lets the
 * I/O thread fail it), later requests fail at once, close returns.  Before,
 * every request waited forever, each holding its session's lock. */
static void test_submit_failures(void)
{
	struct spill_stats st;
	struct spill *sp;
	char why[512];

	mkdir_tmp();
	if (!(sp = open_store(64, false)))
		T_FAIL("the store did not open");
	if (!strstr(spill_engine(sp), "io_uring")) {
		spill_close(sp);
		rm_tmp();
		t_skip("no io_uring engine here");
	}
	spill_fault_submit(sp, 5, -EAGAIN, 0);
	roundtrip_counted(sp, true);
	spill_stats(sp, &st);
	T_EQ(st.submit_failures, 5);
	T_ASSERT(!st.stopped);
	T_EQ(spill_stopped(sp, why, sizeof(why)), 0);

	enum { N = 6 };
	uint8_t *base;
	uint8_t (*pages)[PAGE] = (uint8_t (*)[PAGE])pages_of(&base, N + 1, true);
	uint64_t slots[N + 1];
	struct counter c = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
	struct timespec t0;

	spill_fault_submit(sp, UINT64_MAX, -EBUSY, 300);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < N + 1; i++) {
		fill(pages[i], PAGE, (uint64_t)i + 100);
		T_EQ(spill_slot_alloc(sp, &slots[i]), 0);
	}
	for (int i = 0; i < N; i++) {
		struct spill_page_hdr h = hdr_of(9, 0, (uint32_t)i, 1);
		T_EQ(spill_write(sp, slots[i], &h, pages[i], count_done, &c, i % 2 ? SPILL_BACKGROUND : 0), 0);
	}
	/* this thread drives the ring meanwhile, asleep in the kernel */
	struct spill_page_hdr h = hdr_of(9, 0, N, 1);
	T_EQ(spill_write_sync(sp, slots[N], &h, pages[N], why, sizeof(why)), -EIO);
	double ms = ms_since(&t0);
	fprintf(stderr, "    failed after %.0f ms: %s\n", ms, why);
	T_ASSERT(ms >= 250 && ms < 5000);
	T_ASSERT(strstr(why, "was not submitted") && strstr(why, "io_uring_submit failed") &&
		 strstr(why, "restart tqkvd"));
	pthread_mutex_lock(&c.lock);
	while (c.done < N)
		pthread_cond_wait(&c.cond, &c.lock);
	pthread_mutex_unlock(&c.lock);
	T_EQ(c.failed, N);
	/* later requests fail at once */
	T_EQ(spill_read(sp, slots[0], &h, pages[0], count_done, &c, 0), -EIO);
	T_EQ(spill_stopped(sp, why, sizeof(why)), -EIO);
	T_ASSERT(strstr(why, "the spill store stopped"));
	spill_stats(sp, &st);
	T_ASSERT(st.stopped);
	T_ASSERT(st.submit_failures > 5);
	T_EQ(st.io_errors, N + 1);
	for (int i = 0; i < N + 1; i++)
		spill_slot_free(sp, slots[i]);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	spill_close(sp);
	T_ASSERT(ms_since(&t0) < 2000);
	free(base);
	rm_tmp();
}

static void test_corruption_and_faults(void)
{
	corruption_and_faults(false, true);  /* io_uring, the page is the buffer */
	corruption_and_faults(false, false); /* io_uring, through staging */
	corruption_and_faults(true, false);  /* pread/pwrite */
}

static void test_no_room(void)
{
	struct spill_params p = { .dir = NULL, .bytes = (uint64_t)1 << 60, .page_bytes = PAGE };
	struct spill *sp;
	char why[512];

	mkdir_tmp();
	p.dir = dir;
	T_EQ(spill_open(&sp, &p, why, sizeof(why)), -ENOSPC);
	T_ASSERT(strstr(why, "pool.spill_bytes is") && strstr(why, "has room for"));
	p.bytes = 1000; /* less than one slot */
	T_EQ(spill_open(&sp, &p, why, sizeof(why)), -EINVAL);
	p.bytes = 4 * (SPILL_HDR_BYTES + PAGE);
	p.page_bytes = 1000;
	T_EQ(spill_open(&sp, &p, why, sizeof(why)), -EINVAL);
	rm_tmp();
}

/* A waiter whose read is done returns at once, not after another waiter
 * that drives the ring for a long wait (a big spill): it waited for that
 * one's lock.  Here the other waits for a flag a timer sets after 1 s. */
static int flag_set_;
static bool flag_set(void *arg)
{
	(void)arg;
	return __atomic_load_n(&flag_set_, __ATOMIC_ACQUIRE) != 0;
}

static void *long_waiter(void *arg)
{
	spill_wait(arg, flag_set, NULL);
	return NULL;
}

static void *timer_1s(void *arg)
{
	(void)arg;
	usleep(1000000);
	__atomic_store_n(&flag_set_, 1, __ATOMIC_RELEASE);
	return NULL;
}

struct one_done {
	int done, res;
};

static void one_cb(void *ctx, int res, const char *why)
{
	struct one_done *d = ctx;
	(void)why;
	d->res = res;
	__atomic_store_n(&d->done, 1, __ATOMIC_RELEASE);
}

static bool one_is_done(void *arg)
{
	return __atomic_load_n(&((struct one_done *)arg)->done, __ATOMIC_ACQUIRE) != 0;
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_waiter_not_behind_another(void)
{
	struct spill *sp = open_uring_store();
	if (!sp)
		return;
	uint8_t *base, *pages = pages_of(&base, 2, true);
	uint64_t slot;
	char why[512];
	struct spill_page_hdr h = hdr_of(21, 0, 0, 1);
	fill(pages, PAGE, 77);
	T_EQ(spill_slot_alloc(sp, &slot), 0);
	T_EQ(spill_write_sync(sp, slot, &h, pages, why, sizeof(why)), 0);
	pthread_t a, t;
	__atomic_store_n(&flag_set_, 0, __ATOMIC_RELEASE);
	T_EQ(pthread_create(&a, NULL, long_waiter, sp), 0);
	T_EQ(pthread_create(&t, NULL, timer_1s, NULL), 0);
	usleep(50000); /* it drives the ring now */
	struct one_done d = { 0, 0 };
	double t0 = mono_s();
	T_EQ(spill_read(sp, slot, &h, pages + PAGE, one_cb, &d, 0), 0);
	spill_wait(sp, one_is_done, &d);
	double took = mono_s() - t0;
	pthread_join(t, NULL);
	pthread_join(a, NULL);
	fprintf(stderr, "    a read beside a waiter driving the ring returned after %.1f ms\n", took * 1e3);
	T_EQ(d.res, 0);
	T_ASSERT(memcmp(pages, pages + PAGE, PAGE) == 0);
	T_ASSERT(took < 0.5);
	spill_close(sp);
	free(base);
	rm_tmp();
}

/* A kernel whose io_uring lacks IORING_FEAT_EXT_ARG (Linux < 5.11): a wait
 * with a timeout queues liburing's own SQE from the waiter's thread and its
 * completion comes back among the store's (a crash on the first wait that
 * slept).  Refused with the reason; the fallback engine takes over where
 * allowed. */
static void test_old_uring_refused(void)
{
	struct spill_params p = { .dir = dir, .bytes = 64 * (SPILL_HDR_BYTES + PAGE), .page_bytes = PAGE,
				  .queue_depth = 8 };
	struct spill *sp;
	char why[512];

	mkdir_tmp();
	setenv("TQKVD_TEST_URING_OLD", "1", 1);
	T_ASSERT(spill_open(&sp, &p, why, sizeof(why)) < 0);
	fprintf(stderr, "    refused: %s\n", why);
	T_ASSERT(strstr(why, "Linux >= 5.11") && strstr(why, "spill_fallback"));
	p.allow_fallback = true;
	T_EQ(spill_open(&sp, &p, why, sizeof(why)), 0);
	fprintf(stderr, "    engine: %s\n", spill_engine(sp));
	T_ASSERT(strstr(spill_engine(sp), "pread/pwrite"));
	roundtrip_counted(sp, true);
	spill_close(sp);
	unsetenv("TQKVD_TEST_URING_OLD");
	rm_tmp();
}

int main(void)
{
	T_RUN(test_crc32c);
	T_RUN(test_roundtrip_uring);
	T_RUN(test_roundtrip_fallback);
	T_RUN(test_corruption_and_faults);
	T_RUN(test_larger_file_kept);
	T_RUN(test_concurrent_waiters);
	T_RUN(test_waiter_not_behind_another);
	T_RUN(test_old_uring_refused);
	T_RUN(test_no_room);
	T_RUN(test_not_a_file);
	T_RUN(test_submit_failures);
	return t_done();
}
