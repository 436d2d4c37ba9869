/* persist.c — manifests and journals of persistent sessions (persist.h). */
#include "persist.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "crc32c.h"
#include "tq_xform.h"

/* ---- little-endian fields ------------------------------------------------- */
static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* Manifest, fixed part (PERSIST_MAN_HDR bytes):
 *   0 magic  8 format  12 crc32c  16 file_bytes  24 id  32 epoch  40 gen_next
 *  48 seed  56 created_ms  64 max_tokens  72 slot_bytes  80 page_bytes
 *  84 layout_id  88 owner_uid  92 n_layers  96 n_kv_heads  100 n_q_heads
 * 104 head_dim  108 k_codec  109 v_codec  112 tenant[64]  176 name[64]
 * 240 kv_xform (format 2; zero in format 1)  244 page_tokens (format 3; zero
 * before)  248..255 zero.  Then n_layers
 * x (n_tokens, n_pages: u32), then every layer's pages in order, (slot,
 * gen: u64) each; format 2 then has, per layer in order, xf_bytes (u32)
 * and that many bytes of transform statistics (no padding).  The crc
 * covers the whole file with its own field zero. */
enum {
	M_MAGIC = 0, M_FORMAT = 8, M_CRC = 12, M_BYTES = 16, M_ID = 24, M_EPOCH = 32, M_GEN = 40,
	M_SEED = 48, M_CREATED = 56, M_MAXTOK = 64, M_SLOTB = 72, M_PAGEB = 80, M_LAYOUT = 84,
	M_OWNER = 88, M_LAYERS = 92, M_KVH = 96, M_QH = 100, M_DIM = 104, M_KC = 108, M_VC = 109,
	M_TENANT = 112, M_NAME = 176, M_XFORM = 240, M_PTOK = 244,
};

uint8_t *persist_manifest_encode(const struct persist_manifest *m, size_t *len)
{
	uint32_t nl = m->geom.n_layers;
	uint64_t pages = 0;
	size_t n, off;
	uint8_t *b;

	for (uint32_t l = 0; l < nl; l++)
		pages += m->layers[l].n_pages;
	n = PERSIST_MAN_HDR + (size_t)nl * 8 + (size_t)pages * 16;
	for (uint32_t l = 0; l < nl; l++)
		n += 4 + (size_t)m->layers[l].xf_bytes;
	if (!(b = calloc(1, n)))
		return NULL;
	put64(b + M_MAGIC, PERSIST_MAN_MAGIC);
	put32(b + M_FORMAT, PERSIST_FORMAT);
	put64(b + M_BYTES, n);
	put64(b + M_ID, m->id);
	put64(b + M_EPOCH, m->epoch);
	put64(b + M_GEN, m->gen_next);
	put64(b + M_SEED, m->seed);
	put64(b + M_CREATED, m->created_ms);
	put64(b + M_MAXTOK, m->geom.max_tokens);
	put64(b + M_SLOTB, m->slot_bytes);
	put32(b + M_PAGEB, m->page_bytes);
	put32(b + M_LAYOUT, m->layout_id);
	put32(b + M_OWNER, m->owner_uid);
	put32(b + M_LAYERS, nl);
	put32(b + M_KVH, m->geom.n_kv_heads);
	put32(b + M_QH, m->geom.n_q_heads);
	put32(b + M_DIM, m->geom.head_dim);
	b[M_KC] = (uint8_t)m->geom.k_codec;
	b[M_VC] = (uint8_t)m->geom.v_codec;
	memcpy(b + M_TENANT, m->tenant, strnlen(m->tenant, CONFIG_NAME_MAX - 1));
	memcpy(b + M_NAME, m->name, strnlen(m->name, CONFIG_NAME_MAX - 1));
	put32(b + M_XFORM, m->geom.kv_xform);
	put32(b + M_PTOK, m->page_tokens);
	off = PERSIST_MAN_HDR;
	for (uint32_t l = 0; l < nl; l++, off += 8) {
		put32(b + off, m->layers[l].n_tokens);
		put32(b + off + 4, m->layers[l].n_pages);
	}
	for (uint32_t l = 0; l < nl; l++)
		for (uint32_t i = 0; i < m->layers[l].n_pages; i++, off += 16) {
			put64(b + off, m->layers[l].pages[i].slot);
			put64(b + off + 8, m->layers[l].pages[i].gen);
		}
	for (uint32_t l = 0; l < nl; l++) {
		put32(b + off, m->layers[l].xf_bytes);
		if (m->layers[l].xf_bytes)
			memcpy(b + off + 4, m->layers[l].xf, m->layers[l].xf_bytes);
		off += 4 + (size_t)m->layers[l].xf_bytes;
	}
	put32(b + M_CRC, tq_crc32c(0, b, n));
	*len = n;
	return b;
}

void persist_manifest_free(struct persist_manifest *m)
{
	if (!m || !m->layers)
		return;
	for (uint32_t l = 0; l < m->geom.n_layers; l++) {
		free(m->layers[l].pages);
		free(m->layers[l].xf);
	}
	free(m->layers);
	m->layers = NULL;
}

/* A NUL-terminated name in a 64-byte field: "" allowed when may_be_empty. */
static int get_name(char *dst, const uint8_t *src, int may_be_empty)
{
	size_t n = strnlen((const char *)src, CONFIG_NAME_MAX);

	if (n == CONFIG_NAME_MAX)
		return -1;
	for (size_t i = n; i < CONFIG_NAME_MAX; i++)
		if (src[i])
			return -1;
	memcpy(dst, src, n + 1);
	if (n == 0)
		return may_be_empty ? 0 : -1;
	return config_check_name(dst) < 0 ? -1 : 0;
}

int persist_manifest_decode(const uint8_t *b, size_t len, struct persist_manifest *m, char *why, size_t whylen)
{
	uint8_t tmp[4] = { 0 };
	uint32_t crc, nl, format;
	uint64_t pages = 0, xf_max;
	size_t off, xf_off;

	memset(m, 0, sizeof(*m));
	if (len < PERSIST_MAN_HDR || get64(b + M_MAGIC) != PERSIST_MAN_MAGIC) {
		snprintf(why, whylen, "not a tqkvd manifest (%zu bytes, bad magic or too short)", len);
		return -EBADMSG;
	}
	format = get32(b + M_FORMAT);
	if (format < PERSIST_FORMAT_MIN || format > PERSIST_FORMAT) {
		snprintf(why, whylen, "manifest format %u, this tqkvd reads formats %u to %u", format,
			 PERSIST_FORMAT_MIN, PERSIST_FORMAT);
		return -EPROTO;
	}
	if (get64(b + M_BYTES) != len) {
		snprintf(why, whylen, "manifest is %zu bytes, its header says %" PRIu64 " (torn write?)", len,
			 get64(b + M_BYTES));
		return -EBADMSG;
	}
	crc = tq_crc32c(0, b, M_CRC);
	crc = tq_crc32c(crc, tmp, 4);
	crc = tq_crc32c(crc, b + M_CRC + 4, len - M_CRC - 4);
	if (crc != get32(b + M_CRC)) {
		snprintf(why, whylen, "manifest checksum mismatch (crc32c %08x, stored %08x)", crc, get32(b + M_CRC));
		return -EBADMSG;
	}
	nl = get32(b + M_LAYERS);
	if (nl < 1 || nl > SESSION_MAX_LAYERS || (len - PERSIST_MAN_HDR) / 8 < nl) {
		snprintf(why, whylen, "manifest names %u layers", nl);
		return -EBADMSG;
	}
	m->id = get64(b + M_ID);
	m->epoch = get64(b + M_EPOCH);
	m->gen_next = get64(b + M_GEN);
	m->seed = get64(b + M_SEED);
	m->created_ms = get64(b + M_CREATED);
	m->slot_bytes = get64(b + M_SLOTB);
	m->page_bytes = get32(b + M_PAGEB);
	m->layout_id = get32(b + M_LAYOUT);
	m->owner_uid = get32(b + M_OWNER);
	m->geom.n_layers = nl;
	m->geom.n_kv_heads = get32(b + M_KVH);
	m->geom.n_q_heads = get32(b + M_QH);
	m->geom.head_dim = get32(b + M_DIM);
	m->geom.k_codec = (enum tq_codec_id)b[M_KC];
	m->geom.v_codec = (enum tq_codec_id)b[M_VC];
	m->geom.max_tokens = get64(b + M_MAXTOK);
	m->geom.kv_xform = format >= 2 ? get32(b + M_XFORM) : 0;
	m->page_tokens = format >= 3 ? get32(b + M_PTOK) : 0;
	m->format = format;
	if (m->page_tokens > 65536u) { /* TQ_PAGE_TOKENS_MAX; 0: not said (all that fit) */
		snprintf(why, whylen, "manifest has %u tokens a page", m->page_tokens);
		return -EBADMSG;
	}
	if (m->id == 0 || get_name(m->tenant, b + M_TENANT, 0) < 0 || get_name(m->name, b + M_NAME, 1) < 0) {
		snprintf(why, whylen, "manifest has a bad id, tenant or session name");
		return -EBADMSG;
	}
	if (b[M_VC + 1] || b[M_VC + 2]) {
		snprintf(why, whylen, "manifest header bytes 110..111 are not zero");
		return -EBADMSG;
	}
	if (m->geom.kv_xform & ~TQ_XF_MASK) {
		snprintf(why, whylen, "manifest has an unknown kv transform mode 0x%x", m->geom.kv_xform);
		return -EBADMSG;
	}
	for (off = format >= 3 ? M_PTOK + 4 : format >= 2 ? M_XFORM + 4 : M_XFORM; off < PERSIST_MAN_HDR; off++)
		if (b[off]) {
			snprintf(why, whylen, "manifest header byte %zu is not zero", off);
			return -EBADMSG;
		}
	off = PERSIST_MAN_HDR;
	for (uint32_t l = 0; l < nl; l++)
		pages += get32(b + off + 8 * l + 4);
	/* pages <= nl * 2^32: no overflow below */
	if ((len - PERSIST_MAN_HDR - (size_t)nl * 8) / 16 < pages ||
	    (format < 2 && (len - PERSIST_MAN_HDR - (size_t)nl * 8) != pages * 16)) {
		snprintf(why, whylen, "manifest names %" PRIu64 " pages but holds %zu bytes", pages, len);
		return -EBADMSG;
	}
	/* format 2: each layer's statistics, bounded by the geometry (a
	 * session without transforms has none) */
	xf_max = m->geom.kv_xform ? persist_xf_max(m->geom.n_kv_heads, m->geom.head_dim) : 0;
	xf_off = PERSIST_MAN_HDR + (size_t)nl * 8 + (size_t)pages * 16;
	for (uint32_t l = 0; format >= 2 && l < nl; l++) {
		uint32_t xb;
		if (len - xf_off < 4) {
			snprintf(why, whylen, "manifest ends in layer %u's transform statistics", l);
			return -EBADMSG;
		}
		xb = get32(b + xf_off);
		if (xb > xf_max || xb > len - xf_off - 4) {
			snprintf(why, whylen, "layer %u's transform statistics are %u bytes (at most %" PRIu64
				 " for the geometry, %zu left in the file)", l, xb, xf_max, len - xf_off - 4);
			return -EBADMSG;
		}
		xf_off += 4 + (size_t)xb;
	}
	if (xf_off != len) {
		snprintf(why, whylen, "manifest has %zu bytes after its last layer", len - xf_off);
		return -EBADMSG;
	}
	if (!(m->layers = calloc(nl, sizeof(*m->layers)))) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	for (uint32_t l = 0; l < nl; l++, off += 8) {
		m->layers[l].n_tokens = get32(b + off);
		m->layers[l].n_pages = get32(b + off + 4);
	}
	for (uint32_t l = 0; l < nl; l++) {
		struct persist_layer *L = &m->layers[l];
		if (L->n_pages && !(L->pages = calloc(L->n_pages, sizeof(*L->pages)))) {
			persist_manifest_free(m);
			snprintf(why, whylen, "out of memory");
			return -ENOMEM;
		}
		for (uint32_t i = 0; i < L->n_pages; i++, off += 16) {
			L->pages[i].slot = get64(b + off);
			L->pages[i].gen = get64(b + off + 8);
		}
	}
	for (uint32_t l = 0; format >= 2 && l < nl; l++) {
		struct persist_layer *L = &m->layers[l];
		L->xf_bytes = get32(b + off);
		off += 4;
		if (L->xf_bytes && !(L->xf = malloc(L->xf_bytes))) {
			persist_manifest_free(m);
			snprintf(why, whylen, "out of memory");
			return -ENOMEM;
		}
		if (L->xf_bytes)
			memcpy(L->xf, b + off, L->xf_bytes);
		off += L->xf_bytes;
	}
	return 0;
}

/* ---- files ----------------------------------------------------------------- */
int persist_dir_open(const char *spill_dir, char *why, size_t whylen)
{
	char path[4096];
	int fd;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", spill_dir, PERSIST_SUBDIR) >= sizeof(path)) {
		snprintf(why, whylen, "%.200s/%s: path too long", spill_dir, PERSIST_SUBDIR);
		return -ENAMETOOLONG;
	}
	if (mkdir(path, 0750) < 0 && errno != EEXIST) {
		snprintf(why, whylen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	if ((fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		snprintf(why, whylen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	return fd;
}

static void fname(char *buf, size_t n, uint64_t id, const char *ext)
{
	snprintf(buf, n, "%" PRIu64 ".%s", id, ext);
}

static int write_all(int fd, const uint8_t *p, size_t n, off_t off)
{
	while (n) {
		ssize_t w = pwrite(fd, p, n, off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		if (w == 0)
			return -EIO;
		p += w;
		n -= (size_t)w;
		off += w;
	}
	return 0;
}

static uint32_t dirsync_faults; /* atomic: persist_fault_dirsync */
static uint32_t read_faults;    /* atomic: persist_fault_manifest_read */

void persist_fault_dirsync(uint32_t n)
{
	__atomic_store_n(&dirsync_faults, n, __ATOMIC_RELAXED);
}

void persist_fault_manifest_read(uint32_t n)
{
	__atomic_store_n(&read_faults, n, __ATOMIC_RELAXED);
}

/* Take one injected fault of *counter: true when this call fails. */
static bool fault_take(uint32_t *counter)
{
	uint32_t f = __atomic_load_n(counter, __ATOMIC_RELAXED);

	return f && __atomic_compare_exchange_n(counter, &f, f - 1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* fsync of the directory after a manifest's rename (or a test's EIO) */
static int dirsync(int dirfd)
{
	if (fault_take(&dirsync_faults)) {
		errno = EIO;
		return -1;
	}
	return fsync(dirfd);
}

int persist_manifest_write(int dirfd, const struct persist_manifest *m, char *why, size_t whylen)
{
	char tmp[64], dst[64];
	size_t len;
	uint8_t *b = persist_manifest_encode(m, &len);
	int fd, r = 0;

	if (!b) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	fname(tmp, sizeof(tmp), m->id, "tqm.tmp");
	fname(dst, sizeof(dst), m->id, "tqm");
	if ((fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0) {
		r = -errno;
		snprintf(why, whylen, "%s/%s: %s", PERSIST_SUBDIR, tmp, strerror(-r));
		free(b);
		return r;
	}
	if ((r = write_all(fd, b, len, 0)) < 0 || (fdatasync(fd) < 0 && (r = -errno))) {
		snprintf(why, whylen, "writing %s/%s: %s", PERSIST_SUBDIR, tmp, strerror(-r));
	} else if (renameat(dirfd, tmp, dirfd, dst) < 0) {
		r = -errno;
		snprintf(why, whylen, "renaming %s/%s: %s", PERSIST_SUBDIR, tmp, strerror(-r));
	} else if (dirsync(dirfd) < 0) {
		/* renamed: published whatever the sync says */
		snprintf(why, whylen, "syncing %s/ after replacing %s: %s", PERSIST_SUBDIR, dst, strerror(errno));
		r = 1;
	}
	close(fd);
	if (r < 0)
		unlinkat(dirfd, tmp, 0);
	free(b);
	return r;
}

/* A whole small file (at most max bytes): 0, or -errno / -EFBIG. */
static int read_file_at(int dirfd, const char *name, size_t max, uint8_t **out, size_t *len)
{
	struct stat sb;
	uint8_t *b;
	size_t got = 0;
	int fd, r = 0;

	*out = NULL;
	if ((fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC)) < 0)
		return -errno;
	if (fstat(fd, &sb) < 0) {
		r = -errno;
		goto out;
	}
	if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max) {
		r = S_ISREG(sb.st_mode) ? -EFBIG : -EINVAL;
		goto out;
	}
	if (!(b = malloc((size_t)sb.st_size + 1))) {
		r = -ENOMEM;
		goto out;
	}
	while (got < (size_t)sb.st_size) {
		ssize_t n = pread(fd, b + got, (size_t)sb.st_size - got, (off_t)got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO;
			free(b);
			goto out;
		}
		got += (size_t)n;
	}
	*out = b;
	*len = got;
out:
	close(fd);
	return r;
}

/* A manifest of SESSION_MAX_LAYERS layers of 2^20 pages each is far
 * beyond any real pool; refuse more than 256 MiB. */
#define MAN_MAX_BYTES ((size_t)256 << 20)

int persist_manifest_read(int dirfd, uint64_t id, struct persist_manifest *m, char *why, size_t whylen)
{
	char name[64];
	uint8_t *b;
	size_t len = 0;
	int r;

	memset(m, 0, sizeof(*m));
	fname(name, sizeof(name), id, "tqm");
	if ((r = fault_take(&read_faults) ? -EIO : read_file_at(dirfd, name, MAN_MAX_BYTES, &b, &len)) < 0) {
		snprintf(why, whylen, "%s/%s: %s", PERSIST_SUBDIR, name, strerror(-r));
		return r;
	}
	r = persist_manifest_decode(b, len, m, why, whylen);
	free(b);
	if (r == 0 && m->id != id) {
		snprintf(why, whylen, "%s/%s holds session %" PRIu64, PERSIST_SUBDIR, name, m->id);
		persist_manifest_free(m);
		r = -EBADMSG;
	}
	return r;
}

int persist_remove(int dirfd, uint64_t id)
{
	char name[64];
	int r = 0;

	/* the manifest first: without it the session is gone at the next
	 * start (persist_scan removes a journal alone); a journal removed
	 * first and a crash before the manifest would bring a closed session
	 * back.  A manifest that stays keeps its journal too. */
	fname(name, sizeof(name), id, "tqm");
	if (unlinkat(dirfd, name, 0) < 0 && errno != ENOENT)
		return -errno;
	/* not on disk yet, a crash could bring the manifest back: its slots
	 * must not go to other sessions (the caller keeps them until restart) */
	if (dirsync(dirfd) < 0)
		return -errno;
	fname(name, sizeof(name), id, "tqj");
	if (unlinkat(dirfd, name, 0) < 0 && errno != ENOENT)
		r = -errno;
	/* the mark goes last: until the manifest's removal is on disk, it
	 * is what keeps a crash from bringing the session back.  One that
	 * stays names no files (the next start removes it), so its failure
	 * keeps nothing else. */
	fname(name, sizeof(name), id, "closed");
	unlinkat(dirfd, name, 0);
	fsync(dirfd);
	return r;
}

int persist_mark_closed(int dirfd, uint64_t id, uint64_t epoch, char *why, size_t whylen)
{
	char name[64], text[40];
	int fd, r;

	fname(name, sizeof(name), id, "closed");
	if ((fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0) {
		r = -errno;
		snprintf(why, whylen, "creating %s/%s: %s", PERSIST_SUBDIR, name, strerror(-r));
		return r;
	}
	int n = snprintf(text, sizeof(text), "epoch %" PRIu64 "\n", epoch);
	if ((r = write_all(fd, (const uint8_t *)text, (size_t)n, 0)) < 0 || (fdatasync(fd) < 0 && (r = -errno))) {
		snprintf(why, whylen, "writing %s/%s: %s", PERSIST_SUBDIR, name, strerror(-r));
		close(fd);
		unlinkat(dirfd, name, 0);
		return r;
	}
	close(fd);
	if (dirsync(dirfd) < 0) {
		r = -errno;
		snprintf(why, whylen, "syncing %s/ after creating %s: %s", PERSIST_SUBDIR, name, strerror(-r));
		return r;
	}
	return 0;
}

/* Is id's mark older than its manifest: the session checkpointed more
 * than once since (by a tqkvd that ignores marks, after a downgrade)?
 * A mark or manifest that cannot be read is not: the close stands. */
static bool mark_stale(int dirfd, uint64_t id)
{
	char name[64], why[256];
	uint8_t *b;
	size_t len;
	uint64_t epoch;
	struct persist_manifest m;
	bool stale = false;

	fname(name, sizeof(name), id, "closed");
	if (read_file_at(dirfd, name, 64, &b, &len) < 0)
		return false;
	b[len] = 0;
	int ok = sscanf((const char *)b, "epoch %" SCNu64, &epoch) == 1;
	free(b);
	if (ok && epoch < UINT64_MAX - 1 && persist_manifest_read(dirfd, id, &m, why, sizeof(why)) == 0) {
		stale = m.epoch > epoch + 1;
		persist_manifest_free(&m);
	}
	return stale;
}

void persist_set_aside(int dirfd, uint64_t id)
{
	char a[64], b[64];

	fname(a, sizeof(a), id, "tqm");
	fname(b, sizeof(b), id, "tqm.dropped");
	/* a rename that fails (a read-only or failing file system) leaves
	 * both files where they are: the next start looks at them again,
	 * rather than the operator's only copy being deleted */
	if (renameat(dirfd, a, dirfd, b) < 0)
		return;
	/* the journal beside it: the appends since the last checkpoint are
	 * the operator's too (a session dropped because the store shrank
	 * comes back whole once both are renamed back on a larger one) */
	fname(a, sizeof(a), id, "tqj");
	fname(b, sizeof(b), id, "tqj.dropped");
	if (renameat(dirfd, a, dirfd, b) < 0 && errno != ENOENT)
		unlinkat(dirfd, a, 0); /* a journal without its manifest is of no use */
	fsync(dirfd);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* "123.ext" with a decimal id > 0: the id, else 0. */
static uint64_t id_of(const char *name, const char *ext)
{
	char *end;
	uint64_t id;

	if (name[0] < '1' || name[0] > '9')
		return 0;
	errno = 0;
	id = strtoull(name, &end, 10);
	/* (ids count up from 1: one near UINT64_MAX is not ours, and would
	 * push new ids to wrap) */
	if (errno || *end != '.' || strcmp(end + 1, ext) || id > UINT64_MAX / 4)
		return 0;
	return id;
}

/* v[*k] = id, v growing by doubling: 0 or -ENOMEM. */
static int ids_push(uint64_t **v, size_t *k, size_t *cap, uint64_t id)
{
	if (*k == *cap) {
		size_t nc = *cap ? *cap * 2 : 16;
		uint64_t *nv = realloc(*v, sizeof(**v) * nc);
		if (!nv)
			return -ENOMEM;
		*v = nv;
		*cap = nc;
	}
	(*v)[(*k)++] = id;
	return 0;
}

int persist_scan(int dirfd, uint64_t **ids, size_t *n, struct persist_scan_info *info)
{
	int fd = dup(dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *de;
	uint64_t *v = NULL, *dead = NULL;
	size_t cap = 0, k = 0, dcap = 0, nd = 0;

	*ids = NULL;
	*n = 0;
	memset(info, 0, sizeof(*info));
	if (!d) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		uint64_t id = id_of(de->d_name, "tqm"), aside = 0, closed = 0;
		if (!id && !(aside = id_of(de->d_name, "tqm.dropped")) && !(aside = id_of(de->d_name, "tqj.dropped")))
			closed = id_of(de->d_name, "closed");
		/* (a closed session's id too: if its files cannot be removed
		 * now, no new session may take the id they would take away) */
		const uint64_t taken = aside ? aside : closed;
		if (taken > info->max_aside)
			info->max_aside = taken;
		if (closed) {
			if (ids_push(&dead, &nd, &dcap, closed) < 0)
				goto nomem;
			continue;
		}
		if (!id) {
			size_t l = strlen(de->d_name);
			if (l > 4 && !strcmp(de->d_name + l - 4, ".tmp")) {
				unlinkat(dirfd, de->d_name, 0);
				info->removed++;
			}
			continue;
		}
		if (ids_push(&v, &k, &cap, id) < 0)
			goto nomem;
	}
	/* sessions closed while in use, their files still there: closed
	 * they stay (their journals go below with the manifest-less ones) */
	for (size_t i = 0; i < nd; i++) {
		char name[64];
		if (mark_stale(dirfd, dead[i])) {
			fname(name, sizeof(name), dead[i], "closed");
			unlinkat(dirfd, name, 0);
			info->marks_stale++;
			continue;
		}
		for (size_t j = 0; j < k; j++)
			if (v[j] == dead[i]) {
				v[j] = v[--k];
				break;
			}
		if (persist_remove(dirfd, dead[i]) == 0)
			info->closed++;
		else
			info->closed_kept++;
	}
	free(dead);
	/* journals whose session has no manifest */
	rewinddir(d);
	while ((de = readdir(d))) {
		uint64_t id = id_of(de->d_name, "tqj");
		bool found = false;
		if (!id)
			continue;
		for (size_t i = 0; i < k && !found; i++)
			found = v[i] == id;
		if (!found) {
			unlinkat(dirfd, de->d_name, 0);
			info->removed++;
		}
	}
	closedir(d);
	if (k)
		qsort(v, k, sizeof(*v), cmp_u64);
	*ids = v;
	*n = k;
	return 0;
nomem:
	free(v);
	free(dead);
	closedir(d);
	return -ENOMEM;
}

/* ---- journal ---------------------------------------------------------------- */
/* Header: 0 magic, 8 format (3 written, as the manifest's; 1 and 2 read
 * too: 1 has no XFORM records, the record format is the same), 12 crc32c (of the 64 bytes, this field 0),
 * 16 session id, 24 epoch, 32..63 zero. */
int persist_journal_reset(int dirfd, uint64_t id, uint64_t epoch, char *why, size_t whylen)
{
	uint8_t h[PERSIST_JNL_HDR] = { 0 };
	char name[64];
	int fd, r = 0;

	fname(name, sizeof(name), id, "tqj");
	if ((fd = openat(dirfd, name, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0) {
		r = -errno;
		snprintf(why, whylen, "%s/%s: %s", PERSIST_SUBDIR, name, strerror(-r));
		return r;
	}
	put64(h, PERSIST_JNL_MAGIC);
	put32(h + 8, PERSIST_FORMAT);
	put64(h + 16, id);
	put64(h + 24, epoch);
	put32(h + 12, tq_crc32c(0, h, sizeof(h)));
	if (ftruncate(fd, 0) < 0 || (r = write_all(fd, h, sizeof(h), 0)) < 0) {
		r = r < 0 ? r : -errno;
		snprintf(why, whylen, "%s/%s: %s", PERSIST_SUBDIR, name, strerror(-r));
		close(fd);
		return r;
	}
	return fd;
}

/* Record header: 0 magic, 4 type, 8 layer, 12 first, 16 n, 20 payload_bytes,
 * 24 seq, 28 crc32c (header with this field 0, then payload), 32 epoch,
 * 40..47 zero. */
static void rec_encode(uint8_t *h, const struct persist_rec *r)
{
	memset(h, 0, PERSIST_REC_HDR);
	put32(h, PERSIST_REC_MAGIC);
	put32(h + 4, r->type);
	put32(h + 8, r->layer);
	put32(h + 12, r->first);
	put32(h + 16, r->n);
	put32(h + 20, r->payload_bytes);
	put32(h + 24, r->seq);
	put64(h + 32, r->epoch);
}

int persist_journal_write(int fd, uint64_t *off, const struct persist_rec *r, const void *p1, size_t n1,
			  const void *p2, size_t n2)
{
	uint8_t h[PERSIST_REC_HDR];
	uint32_t crc;
	struct iovec iov[3] = { { h, sizeof(h) }, { (void *)p1, n1 }, { (void *)p2, n2 } };
	size_t total = sizeof(h) + n1 + n2, done = 0;

	if (n1 + n2 != r->payload_bytes || r->payload_bytes > PERSIST_REC_MAX)
		return -EINVAL;
	rec_encode(h, r);
	crc = tq_crc32c(0, h, sizeof(h));
	crc = tq_crc32c(crc, p1, n1);
	crc = tq_crc32c(crc, p2, n2);
	put32(h + 28, crc);
	while (done < total) {
		/* skip what is written already */
		struct iovec v[3];
		int nv = 0;
		size_t skip = done;
		for (int i = 0; i < 3; i++) {
			if (skip >= iov[i].iov_len) {
				skip -= iov[i].iov_len;
				continue;
			}
			v[nv].iov_base = (uint8_t *)iov[i].iov_base + skip;
			v[nv].iov_len = iov[i].iov_len - skip;
			skip = 0;
			nv++;
		}
		ssize_t w = pwritev(fd, v, nv, (off_t)(*off + done));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		done += (size_t)w;
	}
	/* one writer (the session's lock holder); the checkpoint thread reads
	 * *off without that lock to see whether the journal has grown long */
	__atomic_store_n(off, *off + total, __ATOMIC_RELAXED);
	return 0;
}

/* Where replay reads a journal's bytes: a buffer (the fuzzer, tests) or
 * the file itself, a record at a time (a journal may be far larger than
 * memory: checkpoints that failed for hours).  get: n bytes at off into
 * *p (valid until the next get of the same `which`: 0 headers, 1
 * payloads), 0 or a negative errno. */
struct jsrc {
	size_t len;
	int (*get)(struct jsrc *j, int which, size_t off, size_t n, const uint8_t **p);
	const uint8_t *buf; /* a buffer */
	int fd;             /* a file: its scratch per `which` */
	uint8_t *scratch[2];
	size_t cap[2];
};

static int buf_get(struct jsrc *j, int which, size_t off, size_t n, const uint8_t **p)
{
	*p = j->buf + off;
	return 0;
}

static int file_get(struct jsrc *j, int which, size_t off, size_t n, const uint8_t **p)
{
	if (n > j->cap[which]) {
		uint8_t *nb = realloc(j->scratch[which], n);
		if (!nb)
			return -ENOMEM;
		j->scratch[which] = nb;
		j->cap[which] = n;
	}
	for (size_t got = 0; got < n;) {
		ssize_t k = pread(j->fd, j->scratch[which] + got, n - got, (off_t)(off + got));
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EIO; /* shorter than it was a moment ago */
		got += (size_t)k;
	}
	*p = j->scratch[which];
	return 0;
}

static int replay_src(struct jsrc *j, uint64_t session_id, uint64_t epoch, persist_replay_fn fn, void *ctx,
		      uint32_t *n_records, char *why, size_t whylen)
{
	uint8_t h[PERSIST_JNL_HDR];
	const uint8_t *b;
	const size_t len = j->len;
	size_t off = PERSIST_JNL_HDR;
	uint32_t seq = 0;
	int r;

	*n_records = 0;
	why[0] = 0;
	if (len < PERSIST_JNL_HDR) {
		snprintf(why, whylen, "journal header torn (%zu bytes)", len);
		return 0;
	}
	if ((r = j->get(j, 0, 0, PERSIST_JNL_HDR, &b)) < 0) {
		snprintf(why, whylen, "reading the journal: %s", strerror(-r));
		return r;
	}
	memcpy(h, b, sizeof(h));
	put32(h + 12, 0);
	if (get64(b) != PERSIST_JNL_MAGIC || get32(b + 8) < PERSIST_FORMAT_MIN || get32(b + 8) > PERSIST_FORMAT ||
	    get32(b + 12) != tq_crc32c(0, h, sizeof(h)) || get64(b + 16) != session_id) {
		snprintf(why, whylen, "journal header damaged or of another session");
		return 0;
	}
	if (get64(b + 24) != epoch) {
		snprintf(why, whylen, "journal of checkpoint %" PRIu64 ", the manifest is at %" PRIu64
			 " (already in it)", get64(b + 24), epoch);
		return 0;
	}
	while (len - off >= PERSIST_REC_HDR) {
		const uint8_t *p, *payload;
		if ((r = j->get(j, 0, off, PERSIST_REC_HDR, &p)) < 0) {
			snprintf(why, whylen, "reading the journal at offset %zu: %s", off, strerror(-r));
			return r;
		}
		struct persist_rec rec = {
			.type = get32(p + 4), .layer = get32(p + 8), .first = get32(p + 12), .n = get32(p + 16),
			.payload_bytes = get32(p + 20), .seq = get32(p + 24), .epoch = get64(p + 32),
		};
		uint8_t rh[PERSIST_REC_HDR];
		if (get32(p) != PERSIST_REC_MAGIC || rec.payload_bytes > PERSIST_REC_MAX ||
		    rec.payload_bytes > len - off - PERSIST_REC_HDR) {
			snprintf(why, whylen, "record %u at offset %zu torn or damaged (header)", seq, off);
			return 0;
		}
		memcpy(rh, p, sizeof(rh));
		put32(rh + 28, 0);
		if ((r = j->get(j, 1, off + PERSIST_REC_HDR, rec.payload_bytes, &payload)) < 0) {
			snprintf(why, whylen, "reading the journal at offset %zu: %s", off, strerror(-r));
			return r;
		}
		uint32_t crc = tq_crc32c(tq_crc32c(0, rh, sizeof(rh)), payload, rec.payload_bytes);
		if (crc != get32(p + 28)) {
			snprintf(why, whylen, "record %u at offset %zu fails its checksum (torn write?)", seq, off);
			return 0;
		}
		if (rec.epoch != epoch || rec.seq != seq) {
			snprintf(why, whylen, "record at offset %zu is of checkpoint %" PRIu64 " #%u, expected %" PRIu64
				 " #%u", off, rec.epoch, rec.seq, epoch, seq);
			return 0;
		}
		if ((r = fn(ctx, &rec, payload)) != 0)
			return r;
		(*n_records)++;
		seq++;
		off += PERSIST_REC_HDR + rec.payload_bytes;
	}
	if (off != len)
		snprintf(why, whylen, "%zu bytes of a torn record at the end", len - off);
	return 0;
}

int persist_journal_replay_buf(const uint8_t *b, size_t len, uint64_t session_id, uint64_t epoch,
			       persist_replay_fn fn, void *ctx, uint32_t *n_records, char *why, size_t whylen)
{
	struct jsrc j = { .len = len, .get = buf_get, .buf = b, .fd = -1 };

	return replay_src(&j, session_id, epoch, fn, ctx, n_records, why, whylen);
}

int persist_journal_replay(int dirfd, uint64_t id, uint64_t session_id, uint64_t epoch, persist_replay_fn fn,
			   void *ctx, uint32_t *n_records, char *why, size_t whylen)
{
	char name[64];
	struct stat sb;
	int r;

	*n_records = 0;
	fname(name, sizeof(name), id, "tqj");
	struct jsrc j = { .get = file_get, .fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) };
	if (j.fd < 0) {
		r = -errno;
		snprintf(why, whylen, "%s/%s: %s", PERSIST_SUBDIR, name, strerror(-r));
		return r;
	}
	if ((r = fstat(j.fd, &sb) < 0 ? -errno : S_ISREG(sb.st_mode) ? 0 : -EINVAL) < 0) {
		snprintf(why, whylen, "%s/%s: %s", PERSIST_SUBDIR, name,
			 r == -EINVAL ? "not a regular file" : strerror(-r));
		close(j.fd);
		return r;
	}
	j.len = (size_t)sb.st_size;
	r = replay_src(&j, session_id, epoch, fn, ctx, n_records, why, whylen);
	close(j.fd);
	free(j.scratch[0]);
	free(j.scratch[1]);
	return r;
}
