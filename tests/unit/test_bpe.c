/* test_bpe — the byte-level BPE tokenizer (client/run/bpe.c).
 *
 * Oracles independent of the code under test:
 *   - tests/data/bpe_smollm2.txt: SmolLM2's ids for a set of strings from
 *     Hugging Face tokenizers (scripts/gen-bpe-fixture.py);
 *   - naive_bpe(): the quadratic merge loop over strings, with merge ranks
 *     found by a linear search of the merge list, on a synthetic vocabulary.
 * The real vocabulary is the model's own: the metadata of
 * build/models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/get-models.sh) read
 * by tok_gguf.c, as tqkv-run reads it; TQ_BPE_VOCAB names a dump of
 * scripts/gen-bpe-fixture.py instead.  Without either the synthetic cases
 * run and the test exits 77.  TQ_BPE_FIXTURE names
 * another fixture (gen-bpe-fixture.py --random N writes a stress set). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bpe.h"
#include "gguf.h"
#include "harness.h"
#include "tokenizer.h"

static const char *src_dir(void)
{
	const char *s = getenv("TQ_SRC");
	return s ? s : ".";
}

/* ---- a synthetic vocabulary: the 256 byte characters, then merges ------ */

/* GPT-2's byte-to-unicode character of byte b, as UTF-8 (written here
 * from the published table: printable Latin-1 stands for itself). */
static size_t byte_utf8(int b, char *out)
{
	int n = 0, cp;

	if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) {
		cp = b;
	} else {
		for (int i = 0; i < b; i++)
			n += !((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE);
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	out[0] = (char)(0xC0 | cp >> 6);
	out[1] = (char)(0x80 | (cp & 0x3F));
	return 2;
}

#define SYN_MAX 400
struct syn {
	char *tok[SYN_MAX];
	size_t tok_len[SYN_MAX];
	int32_t type[SYN_MAX];
	int n;
	char *merge[SYN_MAX];
	size_t merge_len[SYN_MAX];
	int n_merge;
};

static void syn_tok(struct syn *s, const char *t, size_t n, int32_t type)
{
	s->tok[s->n] = malloc(n + 1);
	memcpy(s->tok[s->n], t, n);
	s->tok[s->n][n] = 0;
	s->tok_len[s->n] = n;
	s->type[s->n++] = type;
}

/* adds merge "a b" and its result a+b as a token (if new) */
static void syn_merge(struct syn *s, const char *a, const char *b)
{
	char m[64], r[64];
	int have = 0;

	snprintf(m, sizeof(m), "%s %s", a, b);
	snprintf(r, sizeof(r), "%s%s", a, b);
	s->merge[s->n_merge] = strdup(m);
	s->merge_len[s->n_merge++] = strlen(m);
	for (int i = 0; i < s->n; i++)
		have |= s->tok_len[i] == strlen(r) && !memcmp(s->tok[i], r, strlen(r));
	if (!have)
		syn_tok(s, r, strlen(r), TQR_BPE_NORMAL);
}

static void syn_init(struct syn *s)
{
	char u[4];

	memset(s, 0, sizeof(*s));
	syn_tok(s, "<|endoftext|>", 13, TQR_BPE_CONTROL);
	syn_tok(s, "<|im_start|>", 12, TQR_BPE_CONTROL);
	syn_tok(s, "<|im_end|>", 10, TQR_BPE_CONTROL);
	for (int b = 0; b < 256; b++)
		syn_tok(s, u, byte_utf8(b, u), TQR_BPE_NORMAL);
	syn_tok(s, "<user>", 6, TQR_BPE_USER);
	/* overlapping merges so that order matters: "Ġ" is space */
	syn_merge(s, "a", "b");
	syn_merge(s, "b", "a");
	syn_merge(s, "a", "a");
	syn_merge(s, "ab", "a");
	syn_merge(s, "aa", "b");
	syn_merge(s, "b", "b");
	syn_merge(s, "ba", "ab");
	syn_merge(s, "Ġ", "a");
	syn_merge(s, "Ġa", "b");
	syn_merge(s, "bb", "a");
	syn_merge(s, "aa", "aa");
	syn_merge(s, "c", "a");
	syn_merge(s, "ab", "c");
	syn_merge(s, "ca", "b");
	syn_merge(s, "b", "c");
}

static void syn_free(struct syn *s)
{
	for (int i = 0; i < s->n; i++)
		free(s->tok[i]);
	for (int i = 0; i < s->n_merge; i++)
		free(s->merge[i]);
}

static int syn_new(struct syn *s, tqr_bpe **b, tqr_error *err)
{
	return tqr_bpe_new(b, (const char *const *)s->tok, s->tok_len, s->type, s->n,
			   (const char *const *)s->merge, s->merge_len, s->n_merge, "gpt2", err);
}

/* The quadratic loop over strings: merge the adjacent pair whose "l r"
 * comes first in the merge list, leftmost among equals, until none. */
static int naive_bpe(const struct syn *s, const char *word, int32_t *ids)
{
	char sym[64][64];
	int n = 0;

	for (const unsigned char *p = (const unsigned char *)word; *p; p++) {
		size_t k = byte_utf8(*p, sym[n]);
		sym[n++][k] = 0;
	}
	for (;;) {
		int best = -1, best_rank = 1 << 30;
		for (int i = 0; i + 1 < n; i++) {
			char m[160];
			snprintf(m, sizeof(m), "%.63s %.63s", sym[i], sym[i + 1]);
			for (int r = 0; r < s->n_merge && r < best_rank; r++)
				if (!strcmp(s->merge[r], m)) {
					best = i;
					best_rank = r;
				}
		}
		if (best < 0)
			break;
		{
			size_t la = strlen(sym[best]), lb = strlen(sym[best + 1]);
			if (la + lb >= sizeof(sym[0]))
				return -1;
			memcpy(sym[best] + la, sym[best + 1], lb + 1);
		}
		memmove(sym[best + 1], sym[best + 2], sizeof(sym[0]) * (size_t)(n - best - 2));
		n--;
	}
	for (int i = 0; i < n; i++) {
		ids[i] = -1;
		for (int t = 0; t < s->n; t++)
			if (s->type[t] == TQR_BPE_NORMAL && !strcmp(s->tok[t], sym[i]))
				ids[i] = t;
	}
	return n;
}

static void test_merges_match_naive(void)
{
	struct syn s;
	tqr_bpe *b = NULL;
	tqr_error err;
	uint64_t seed = t_seed();

	syn_init(&s);
	T_ASSERT(syn_new(&s, &b, &err) == 0);
	for (int iter = 0; iter < 3000; iter++) {
		char w[48];
		int32_t got[64], want[64];
		int n = 1 + (int)(seed % 40);
		long g;
		int k;

		/* one pre-token: letters from {a, b, c} */
		for (int i = 0; i < n; i++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			w[i] = "abc"[(seed >> 33) % 3];
		}
		w[n] = 0;
		g = tqr_bpe_encode(b, w, (size_t)n, 0, got, 64, &err);
		k = naive_bpe(&s, w, want);
		T_EQ(g, k);
		for (int i = 0; i < k; i++)
			if (got[i] != want[i])
				T_FAIL("\"%s\": id %d is %d, the quadratic loop says %d", w, i, got[i], want[i]);
	}
	tqr_bpe_free(b);
	syn_free(&s);
}

static void test_special_and_decode(void)
{
	static const char text[] = "<|im_start|>ab<user> ab<|im_end|><|im_end";
	struct syn s;
	tqr_bpe *b = NULL;
	tqr_error err;
	int32_t ids[64];
	char out[128];
	size_t o = 0;
	long n;

	syn_init(&s);
	T_ASSERT(syn_new(&s, &b, &err) == 0);
	n = tqr_bpe_encode(b, text, sizeof(text) - 1, 1, ids, 64, &err);
	T_ASSERT(n > 4);
	T_EQ(ids[0], 1);
	T_EQ(tqr_bpe_type(b, ids[0]), TQR_BPE_CONTROL);
	for (long i = 0; i < n; i++) {
		const char *p;
		size_t k;
		T_EQ(tqr_bpe_decode(b, ids[i], 1, &p, &k), 0);
		memcpy(out + o, p, k);
		o += k;
	}
	T_EQ(o, sizeof(text) - 1);
	T_ASSERT(!memcmp(out, text, o));
	/* without parse_special the control tokens are text, <user> is not */
	n = tqr_bpe_encode(b, text, sizeof(text) - 1, 0, ids, 64, &err);
	for (long i = 0; i < n; i++)
		T_ASSERT(tqr_bpe_type(b, ids[i]) != TQR_BPE_CONTROL);
	T_EQ(tqr_bpe_lookup(b, "<user>", 6) >= 0, 1);
	{
		int user = 0;
		for (long i = 0; i < n; i++)
			user += ids[i] == tqr_bpe_lookup(b, "<user>", 6);
		T_EQ(user, 1);
	}
	/* control tokens decode to nothing without `special` */
	{
		const char *p;
		size_t k;
		T_EQ(tqr_bpe_decode(b, 1, 0, &p, &k), 0);
		T_EQ(k, 0);
		T_EQ(tqr_bpe_decode(b, s.n, 1, &p, &k), -EINVAL);
		T_EQ(tqr_bpe_decode(b, -1, 1, &p, &k), -EINVAL);
	}
	/* a short output buffer */
	T_EQ(tqr_bpe_encode(b, text, sizeof(text) - 1, 1, ids, 2, &err), -ENOBUFS);
	T_EQ(tqr_bpe_encode(b, "", 0, 1, ids, 0, &err), 0);
	tqr_bpe_free(b);
	syn_free(&s);
}

/* Each bad array fails with -EINVAL and a message naming the entry. */
static void test_bad_vocab(void)
{
	struct syn s;
	tqr_bpe *b = NULL;
	tqr_error err;
	char *keep;
	size_t keep_len;

	syn_init(&s);
	T_EQ(syn_new(&s, &b, &err), 0);
	tqr_bpe_free(b);

	/* a duplicate token */
	keep = s.tok[5];
	keep_len = s.tok_len[5];
	s.tok[5] = s.tok[6];
	s.tok_len[5] = s.tok_len[6];
	T_EQ(syn_new(&s, &b, &err), -EINVAL);
	T_ASSERT(b == NULL);
	T_ASSERT(strstr(err.msg, "token 6") && strstr(err.msg, "repeats token 5"));
	s.tok[5] = keep;
	s.tok_len[5] = keep_len;

	/* a normal token that is not byte-level text */
	s.tok_len[s.n - 1] = 1;
	s.tok[s.n - 1][0] = ' ';
	T_EQ(syn_new(&s, &b, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "not byte-level text"));
	s.tok[s.n - 1][0] = 'b';
	s.tok_len[s.n - 1] = strlen(s.tok[s.n - 1]);

	/* a bad type */
	s.type[7] = 9;
	T_EQ(syn_new(&s, &b, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "token 7 has type 9"));
	s.type[7] = TQR_BPE_NORMAL;

	/* a merge without a space, with a missing part, a missing result, twice */
	keep = s.merge[2];
	keep_len = s.merge_len[2];
	s.merge[2] = "ab";
	s.merge_len[2] = 2;
	T_EQ(syn_new(&s, &b, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "merge 2"));
	s.merge[2] = "zz a";
	s.merge_len[2] = 4;
	T_EQ(syn_new(&s, &b, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "merge 2") && strstr(err.msg, "left part"));
	s.merge[2] = "a zz";
	T_EQ(syn_new(&s, &b, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "right part"));
	s.merge[2] = "x y";
	s.merge_len[2] = 3;
	T_EQ(syn_new(&s, &b, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "merged token"));
	s.merge[2] = s.merge[0];
	s.merge_len[2] = s.merge_len[0];
	T_EQ(syn_new(&s, &b, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "merge 2") && strstr(err.msg, "repeats merge 0"));
	s.merge[2] = keep;
	s.merge_len[2] = keep_len;

	/* an unknown pre-tokenizer, an empty vocabulary, a too long token */
	T_EQ(tqr_bpe_new(&b, (const char *const *)s.tok, s.tok_len, s.type, s.n,
			 (const char *const *)s.merge, s.merge_len, s.n_merge, "llama3", &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "llama3"));
	T_EQ(tqr_bpe_new(&b, (const char *const *)s.tok, s.tok_len, s.type, 0, NULL, NULL, 0, "gpt2", &err),
	     -EINVAL);
	keep_len = s.tok_len[9];
	s.tok_len[9] = TQR_BPE_TOKEN_LEN_MAX + 1;
	T_EQ(syn_new(&s, &b, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "token 9"));
	s.tok_len[9] = keep_len;
	T_EQ(syn_new(&s, &b, &err), 0);
	tqr_bpe_free(b);
	tqr_bpe_free(NULL);
	syn_free(&s);
}

/* ---- the real vocabulary ------------------------------------------------- */

static struct real {
	unsigned char *buf;
	char **tok, **merge;
	size_t *tok_len, *merge_len;
	int32_t *type;
	uint32_t n, n_merge;
	char pre[32];
	tqr_bpe *b;
} R;

static uint32_t rd32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static unsigned char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	unsigned char *b = NULL;
	long sz;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (sz = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (b = malloc((size_t)sz + 1)) && fread(b, 1, (size_t)sz, f) == (size_t)sz) {
		b[sz] = 0;
		*n = (size_t)sz;
	} else {
		free(b);
		b = NULL;
	}
	fclose(f);
	return b;
}

/* The model file's vocabulary, through tok_gguf.c. */
static int real_load_gguf(const char *path)
{
	tqr_gguf *g;
	tqr_error err;
	int rc;

	if (tqr_gguf_open(&g, path, &err) < 0)
		return -1;
	rc = tqr_bpe_from_gguf(&R.b, g, 49152, &err);
	if (rc < 0)
		fprintf(stderr, "  %s: %s\n", path, err.msg);
	tqr_gguf_free(g);
	return rc < 0 ? -1 : 0;
}

/* The dump of scripts/gen-bpe-fixture.py (trusted: the test's own file). */
static int real_load(const char *path)
{
	size_t len, off = 20;
	uint32_t pl;
	tqr_error err;

	if (!(R.buf = slurp(path, &len)) || len < 20 || memcmp(R.buf, "TQBPEV1\n", 8))
		return -1;
	R.n = rd32(R.buf + 8);
	R.n_merge = rd32(R.buf + 12);
	pl = rd32(R.buf + 16);
	snprintf(R.pre, sizeof(R.pre), "%.*s", (int)pl, (const char *)R.buf + off);
	off += pl;
	R.tok = calloc(R.n, sizeof(char *));
	R.tok_len = calloc(R.n, sizeof(size_t));
	R.type = calloc(R.n, sizeof(int32_t));
	R.merge = calloc(R.n_merge, sizeof(char *));
	R.merge_len = calloc(R.n_merge, sizeof(size_t));
	for (uint32_t i = 0; i < R.n; i++) {
		R.type[i] = (int32_t)rd32(R.buf + off);
		R.tok_len[i] = rd32(R.buf + off + 4);
		R.tok[i] = (char *)R.buf + off + 8;
		off += 8 + R.tok_len[i];
	}
	for (uint32_t i = 0; i < R.n_merge; i++) {
		R.merge_len[i] = rd32(R.buf + off);
		R.merge[i] = (char *)R.buf + off + 4;
		off += 4 + R.merge_len[i];
	}
	if (off != len)
		return -1;
	if (tqr_bpe_new(&R.b, (const char *const *)R.tok, R.tok_len, R.type, (int)R.n,
			(const char *const *)R.merge, R.merge_len, (int)R.n_merge, R.pre, &err) < 0) {
		fprintf(stderr, "  %s: %s\n", path, err.msg);
		return -1;
	}
	return 0;
}

static size_t unescape(const char *s, size_t n, char *out)
{
	size_t o = 0;

	for (size_t i = 0; i < n; i++) {
		if (s[i] != '\\' || i + 1 >= n) {
			out[o++] = s[i];
			continue;
		}
		switch (s[++i]) {
		case 't': out[o++] = '\t'; break;
		case 'n': out[o++] = '\n'; break;
		case 'r': out[o++] = '\r'; break;
		case 'x': {
			char h[3] = { s[i + 1], s[i + 2], 0 };
			out[o++] = (char)strtol(h, NULL, 16);
			i += 2;
			break;
		}
		default: out[o++] = s[i]; break;
		}
	}
	return o;
}

/* The bytes a decode of ids gives (special: control tokens as text). */
static size_t decode_all(const int32_t *ids, long n, char *out)
{
	size_t o = 0;

	for (long i = 0; i < n; i++) {
		const char *p;
		size_t k;
		if (tqr_bpe_decode(R.b, ids[i], 1, &p, &k) < 0)
			return (size_t)-1;
		memcpy(out + o, p, k);
		o += k;
	}
	return o;
}

/* s without the bytes whose character is not in the vocabulary */
static size_t droppable_removed(const char *s, size_t n, char *out)
{
	size_t o = 0;

	for (size_t i = 0; i < n; i++) {
		char u[4];
		if (tqr_bpe_lookup(R.b, u, byte_utf8((unsigned char)s[i], u)) >= 0)
			out[o++] = s[i];
	}
	return o;
}

static void test_fixture(void)
{
	char path[1024], *fix;
	size_t len, cases = 0, round = 0;

	if (getenv("TQ_BPE_FIXTURE"))
		snprintf(path, sizeof(path), "%s", getenv("TQ_BPE_FIXTURE"));
	else
		snprintf(path, sizeof(path), "%s/tests/data/bpe_smollm2.txt", src_dir());
	fix = (char *)slurp(path, &len);
	T_ASSERT(fix);
	for (char *line = fix, *nl; line < fix + len; line = nl + 1) {
		char *t1, *t2, text[4096], want_s[8192];
		int32_t want[4096], got[4096];
		size_t tn, nw = 0;
		long ng;
		tqr_error err;

		nl = strchr(line, '\n');
		if (!nl)
			nl = fix + len;
		*nl = 0;
		if (line[0] == '#' || !line[0])
			continue;
		t1 = strchr(line, '\t');
		t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
		T_ASSERT(t1 && t2 && (size_t)(t2 - t1) < sizeof(text));
		tn = unescape(t1 + 1, (size_t)(t2 - t1 - 1), text);
		snprintf(want_s, sizeof(want_s), "%s", t2 + 1);
		for (char *p = want_s, *e; *p; p = e) {
			want[nw++] = (int32_t)strtol(p, &e, 10);
			if (e == p)
				break;
		}
		ng = tqr_bpe_encode(R.b, text, tn, line[0] == 's', got, 4096, &err);
		if (ng < 0)
			T_FAIL("line %zu: %s", cases, err.msg);
		if ((size_t)ng != nw || memcmp(got, want, nw * sizeof(int32_t))) {
			fprintf(stderr, "  \"%s\"\n  want:", t1 + 1);
			for (size_t i = 0; i < nw; i++)
				fprintf(stderr, " %d", want[i]);
			fprintf(stderr, "\n  got: ");
			for (long i = 0; i < ng; i++)
				fprintf(stderr, " %d", got[i]);
			T_FAIL("ids differ from the reference");
		}
		cases++;
		if (line[0] == 's') {
			/* decode(encode(s)) == s, the dropped bytes aside */
			char dec[8192], kept[4096];
			size_t nd = decode_all(got, ng, dec), nk = droppable_removed(text, tn, kept);
			T_EQ(nd, nk);
			T_ASSERT(!memcmp(dec, kept, nk));
			round++;
		}
	}
	free(fix);
	printf("  %zu fixture strings match the reference, %zu decode back\n", cases, round);
	T_ASSERT(cases >= 50);
}

/* random bytes (UTF-8 pieces, ASCII, invalid bytes) decode back */
static void test_round_trip_random(void)
{
	static const char *const parts[] = { "a", "Z", " ", "  ", "\n", "\t", "7", "'s", "'", "é", "日本",
					     "😀", "\xff", "\xe2\x82", "\xc0", ",", ".", "<|im_end|>", "\x04", "ü" };
	uint64_t seed = t_seed() ^ 0x5bd1e995;

	for (int iter = 0; iter < 2000; iter++) {
		char text[512], dec[2048], kept[512];
		int32_t ids[512];
		size_t n = 0;
		long k;
		tqr_error err;

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		for (int m = (int)(seed >> 58); m >= 0; m--) {
			const char *p;
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			p = parts[(seed >> 33) % (sizeof(parts) / sizeof(parts[0]))];
			memcpy(text + n, p, strlen(p));
			n += strlen(p);
		}
		k = tqr_bpe_encode(R.b, text, n, 1, ids, 512, &err);
		T_ASSERT(k >= 0 && (size_t)k <= n);
		T_EQ(decode_all(ids, k, dec), droppable_removed(text, n, kept));
		T_ASSERT(!memcmp(dec, kept, droppable_removed(text, n, kept)));
	}
}

static void test_speed(void)
{
	char path[1024];
	size_t len;
	char *text;
	int32_t *ids;
	struct timespec a, z;
	long n;
	tqr_error err;
	double s;

	snprintf(path, sizeof(path), "%s/../shared/data/tinystories-dev.txt", src_dir());
	if (!(text = (char *)slurp(path, &len))) {
		printf("  (no %s: speed not measured)\n", path);
		return;
	}
	ids = malloc(sizeof(int32_t) * len);
	clock_gettime(CLOCK_MONOTONIC, &a);
	n = tqr_bpe_encode(R.b, text, len, 0, ids, len, &err);
	clock_gettime(CLOCK_MONOTONIC, &z);
	s = (double)(z.tv_sec - a.tv_sec) + (double)(z.tv_nsec - a.tv_nsec) * 1e-9;
	printf("  tinystories-dev.txt: %zu bytes -> %ld tokens in %.1f ms (%.1f MB/s)\n", len, n, s * 1e3,
	       (double)len / s / 1e6);
	T_ASSERT(n > 0);
	T_ASSERT(s < 5.0); /* "well under a second" unsanitized; slack for ASan/valgrind */
	free(ids);
	free(text);
}

int main(void)
{
	char path[1024];
	const char *v = getenv("TQ_BPE_VOCAB");
	int rc;

	T_RUN(test_merges_match_naive);
	T_RUN(test_special_and_decode);
	T_RUN(test_bad_vocab);
	if (v)
		snprintf(path, sizeof(path), "%s", v);
	else
		snprintf(path, sizeof(path), "%s/build/models/SmolLM2-135M-Instruct.Q4_1.gguf", src_dir());
	if ((v ? real_load(path) : real_load_gguf(path)) < 0) {
		if ((rc = t_done()) != 0)
			return rc;
		fprintf(stderr, "%s is absent or unreadable (%s)\n", path,
			v ? "scripts/gen-bpe-fixture.py writes it" : "scripts/get-models.sh fetches it");
		t_skip("no SmolLM2 vocabulary: the reference cases were skipped (the synthetic ones passed)");
	}
	T_RUN(test_fixture);
	T_RUN(test_round_trip_random);
	T_RUN(test_speed);
	rc = t_done();
	tqr_bpe_free(R.b);
	free(R.tok);
	free(R.tok_len);
	free(R.type);
	free(R.merge);
	free(R.merge_len);
	free(R.buf);
	return rc;
}
