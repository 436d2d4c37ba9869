/* test_spm — sentencepiece-style vocabularies from GGUF metadata
 * (tokenizer.ggml.model "llama": client/run/tok_gguf.c, tokenizer.c).
 *
 * Oracles independent of the code under test:
 *   - tests/data/spm_tok512.txt: the ids Google's sentencepiece gives for a
 *     set of strings with tok512.bin's vocabulary, checked against Hugging
 *     Face tokenizers (scripts/gen-spm-fixture.py);
 *   - naive_spm(): sentencepiece's BPE written plainly — quadratic merges
 *     over strings with linear lookups — on a synthetic vocabulary with
 *     tied scores, control, unused and missing byte tokens;
 *   - tqr_tok_load(tok512.bin): llama2.c's rules, which agree with the
 *     GGUF ones on this vocabulary except where tokenizer.h says they
 *     differ (a literal U+2581 in the text).
 * The GGUF files are written here (only tokenizer metadata, no tensors)
 * from ../shared/data/tok512.bin; build/spm/tok512-vocab.gguf, written by
 * the fixture script with the `gguf` package's GGUFWriter, is read too when
 * present.  Without ../shared/data the synthetic cases run and the test
 * exits 77.  TQ_SPM_FIXTURE names another fixture (gen-spm-fixture.py
 * --random N writes a stress set). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "gguf.h"
#include "harness.h"
#include "tokenizer.h"

#define SP "\xe2\x96\x81"

static const char *src_dir(void)
{
	const char *s = getenv("TQ_SRC");
	return s ? s : ".";
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

/* ---- a vocabulary in memory, and its GGUF metadata ------------------------ */

#define V_MAX 1024
struct voc {
	char *tok[V_MAX];
	size_t len[V_MAX];
	float score[V_MAX];
	int32_t type[V_MAX];
	int n;
};

static void voc_add(struct voc *v, const char *s, size_t n, float score, int32_t type)
{
	v->tok[v->n] = malloc(n + 1);
	memcpy(v->tok[v->n], s, n);
	v->tok[v->n][n] = 0;
	v->len[v->n] = n;
	v->score[v->n] = score;
	v->type[v->n++] = type;
}

static void voc_free(struct voc *v)
{
	for (int i = 0; i < v->n; i++)
		free(v->tok[i]);
	v->n = 0;
}

/* tok512.bin with spaces as U+2581 and GGUF types, as the script does */
static int voc_from_tokbin(struct voc *v, const char *path)
{
	size_t n, off = 4;
	unsigned char *b = slurp(path, &n);

	if (!b)
		return -1;
	v->n = 0;
	while (off + 8 <= n && v->n < V_MAX) {
		float sc;
		int32_t len;
		char s[256];
		size_t k = 0;
		memcpy(&sc, b + off, 4);
		memcpy(&len, b + off + 4, 4);
		off += 8;
		for (int32_t i = 0; i < len && k + 3 < sizeof(s); i++) {
			if (b[off + (size_t)i] == ' ') {
				memcpy(s + k, SP, 3);
				k += 3;
			} else {
				s[k++] = (char)b[off + (size_t)i];
			}
		}
		off += (size_t)len;
		int id = v->n, ty = id == 0 ? TQR_BPE_UNKNOWN : id < 3 ? TQR_BPE_CONTROL :
			 (k == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') ? TQR_BPE_BYTE : TQR_BPE_NORMAL;
		voc_add(v, s, k, sc, ty);
	}
	free(b);
	return 0;
}

struct buf {
	unsigned char *p;
	size_t n, cap;
};

static void put(struct buf *b, const void *p, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
	}
	memcpy(b->p + b->n, p, n);
	b->n += n;
}
static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(struct buf *b, const char *s, size_t n) { put_u64(b, n); put(b, s, n); }
static void put_key(struct buf *b, const char *k, uint32_t type)
{
	put_str(b, k, strlen(k));
	put_u32(b, type);
}

/* What the GGUF metadata may get wrong, one at a time. */
struct meta_opts {
	int n_tok, n_score, n_type;        /* array lengths (-1: the vocabulary's) */
	uint32_t score_type, type_type;    /* element types                        */
	int no_scores, no_types;
	const char *model;
	int64_t bos, eos, unk;             /* -1: key absent                       */
	int add_bos, add_space;            /* -1: key absent                       */
};

static struct meta_opts meta_default(void)
{
	return (struct meta_opts){ -1, -1, -1, TQR_GGUF_F32, TQR_GGUF_I32, 0, 0, "llama", 1, 2, 0, 1, 1 };
}

/* A GGUF v3 file with no tensors and the vocabulary's tokenizer metadata. */
static struct buf gguf_of(const struct voc *v, const struct meta_opts *o)
{
	struct buf b = { 0 };
	uint64_t nkv = 2;
	int nt = o->n_tok < 0 ? v->n : o->n_tok, ns = o->n_score < 0 ? v->n : o->n_score,
	    ny = o->n_type < 0 ? v->n : o->n_type;

	nkv += !o->no_scores + !o->no_types + (o->bos >= 0) + (o->eos >= 0) + (o->unk >= 0) +
	       (o->add_bos >= 0) + (o->add_space >= 0);
	put_u32(&b, TQR_GGUF_MAGIC);
	put_u32(&b, 3);
	put_u64(&b, 0);
	put_u64(&b, nkv);
	put_key(&b, "tokenizer.ggml.model", TQR_GGUF_STRING);
	put_str(&b, o->model, strlen(o->model));
	put_key(&b, "tokenizer.ggml.tokens", TQR_GGUF_ARRAY);
	put_u32(&b, TQR_GGUF_STRING);
	put_u64(&b, (uint64_t)nt);
	for (int i = 0; i < nt; i++)
		put_str(&b, v->tok[i % v->n], v->len[i % v->n]);
	if (!o->no_scores) {
		put_key(&b, "tokenizer.ggml.scores", TQR_GGUF_ARRAY);
		put_u32(&b, o->score_type);
		put_u64(&b, (uint64_t)ns);
		for (int i = 0; i < ns; i++) {
			if (o->score_type == TQR_GGUF_F32)
				put(&b, &v->score[i % v->n], 4);
			else
				put_u32(&b, (uint32_t)(int32_t)v->score[i % v->n]);
		}
	}
	if (!o->no_types) {
		put_key(&b, "tokenizer.ggml.token_type", TQR_GGUF_ARRAY);
		put_u32(&b, o->type_type);
		put_u64(&b, (uint64_t)ny);
		for (int i = 0; i < ny; i++) {
			if (o->type_type == TQR_GGUF_STRING)
				put_str(&b, "1", 1);
			else
				put_u32(&b, (uint32_t)v->type[i % v->n]);
		}
	}
	const char *ids[] = { "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
			      "tokenizer.ggml.unknown_token_id" };
	int64_t idv[] = { o->bos, o->eos, o->unk };
	for (int i = 0; i < 3; i++)
		if (idv[i] >= 0) {
			put_key(&b, ids[i], TQR_GGUF_U32);
			put_u32(&b, (uint32_t)idv[i]);
		}
	const char *bools[] = { "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix" };
	int bv[] = { o->add_bos, o->add_space };
	for (int i = 0; i < 2; i++)
		if (bv[i] >= 0) {
			unsigned char c = (unsigned char)bv[i];
			put_key(&b, bools[i], TQR_GGUF_BOOL);
			put(&b, &c, 1);
		}
	return b;
}

/* The tokenizer of a GGUF image (kept by the caller while t lives: no, the
 * tokenizer copies what it needs; the image may go). */
static int tok_of(const struct buf *b, int vocab, tqr_tok **t, tqr_error *err)
{
	tqr_gguf *g = NULL;
	int rc = tqr_gguf_parse(&g, b->p, b->n, "mem.gguf", err);

	if (rc == 0)
		rc = tqr_tok_from_gguf_meta(t, g, vocab, err);
	tqr_gguf_free(g);
	return rc;
}

/* ---- sentencepiece's BPE, plainly ----------------------------------------- */

static int lin_find(const struct voc *v, const char *s, size_t n, int matchable_only)
{
	for (int i = 0; i < v->n; i++)
		if (v->len[i] == n && !memcmp(v->tok[i], s, n) &&
		    (!matchable_only || v->type[i] == TQR_BPE_NORMAL || v->type[i] == TQR_BPE_USER))
			return i;
	return -1;
}

/* Symbols are strings; the best pair (highest score, leftmost) merges
 * until none; leftovers that are not pieces become their bytes' byte
 * tokens, or <unk> (id unk) when one is missing.  Spaces -> U+2581, a
 * U+2581 prefix; code points by their lead byte. */
static int naive_spm(const struct voc *v, const char *text, size_t len, int unk, int *out)
{
	char *w = malloc(3 * len + 4), **sym = malloc(sizeof(char *) * (3 * len + 4));
	size_t wl = 0, *sl = malloc(sizeof(size_t) * (3 * len + 4));
	int n = 0, o = 0;

	if (len) {
		memcpy(w, SP, 3);
		wl = 3;
	}
	for (size_t i = 0; i < len; i++) {
		if (text[i] == ' ') {
			memcpy(w + wl, SP, 3);
			wl += 3;
		} else {
			w[wl++] = text[i];
		}
	}
	for (size_t i = 0; i < wl;) {
		unsigned char c = (unsigned char)w[i];
		size_t want = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 1, k = 1;
		while (i + k < wl && k < want && ((unsigned char)w[i + k] & 0xC0) == 0x80)
			k++;
		sym[n] = w + i;
		sl[n++] = k;
		i += k;
	}
	for (;;) {
		int best = -1;
		float bs = -INFINITY;
		for (int i = 0; i + 1 < n; i++) {
			int id = lin_find(v, sym[i], sl[i] + sl[i + 1], 1);
			if (id >= 0 && (best < 0 || v->score[id] > bs)) {
				best = i;
				bs = v->score[id];
			}
		}
		if (best < 0)
			break;
		sl[best] += sl[best + 1];
		memmove(sym + best + 1, sym + best + 2, sizeof(char *) * (size_t)(n - best - 2));
		memmove(sl + best + 1, sl + best + 2, sizeof(size_t) * (size_t)(n - best - 2));
		n--;
	}
	for (int i = 0; i < n; i++) {
		int id = lin_find(v, sym[i], sl[i], 1), bid[4], all = 1;
		char h[8];
		if (id >= 0) {
			out[o++] = id;
			continue;
		}
		for (size_t j = 0; j < sl[i]; j++) {
			snprintf(h, sizeof(h), "<0x%02X>", (unsigned char)sym[i][j]);
			bid[j] = lin_find(v, h, 6, 0);
			all &= bid[j] >= 0 && v->type[bid[j]] == TQR_BPE_BYTE;
		}
		if (all)
			for (size_t j = 0; j < sl[i]; j++)
				out[o++] = bid[j];
		else
			out[o++] = unk;
	}
	free(w);
	free(sym);
	free(sl);
	return o;
}

/* A vocabulary where the rules matter: tied scores, a control token and an
 * unused one whose text would otherwise merge, a piece holding a code
 * point that is not a piece ("xé" without "é"... "é" has no byte tokens
 * for 0xA9 so it falls back to <unk>), byte tokens for most bytes. */
static void voc_synthetic(struct voc *v)
{
	static const struct { const char *s; float sc; int ty; } ex[] = {
		{ SP, -1, 1 }, { "a", -1, 1 }, { "b", -1, 1 }, { "c", -1, 1 }, { "x", -1, 1 },
		{ "ab", -2, 1 }, { "ba", -2, 1 }, { "bc", -2, 1 }, { "aa", -3, 1 }, { "aaa", -3, 1 },
		{ "abc", -2, 1 }, { SP "a", -4, 1 }, { SP "ab", -2, 1 }, { "cab", -5, 1 }, { "ca", -2, 1 },
		{ "abab", -6, 1 }, { SP SP, -3, 1 }, { "x\xc3\xa9", -1, 1 }, { "\xc3\xa9x", -7, 1 },
		{ "cc", 5, 3 }, { "bb", 5, 5 }, { "<user>", 0, 4 },
	};
	char h[8];

	v->n = 0;
	voc_add(v, "<unk>", 5, 0, TQR_BPE_UNKNOWN);
	voc_add(v, "<s>", 3, 0, TQR_BPE_CONTROL);
	voc_add(v, "</s>", 4, 0, TQR_BPE_CONTROL);
	for (int b = 0; b < 256; b++) {
		if (b == 0xA9 || b == 0xFE)
			continue; /* missing: é and 0xFE fall back to <unk> */
		snprintf(h, sizeof(h), "<0x%02X>", b);
		voc_add(v, h, 6, 0, TQR_BPE_BYTE);
	}
	for (size_t i = 0; i < sizeof(ex) / sizeof(ex[0]); i++)
		voc_add(v, ex[i].s, strlen(ex[i].s), ex[i].sc, ex[i].ty);
}

static void test_merges_match_naive(void)
{
	static const char *alpha[] = { "a", "b", "c", " ", "x", "\xc3\xa9", "\xe2\x82", "\xff", "\xc3", "\xfe",
				       SP, "bb", "cc", "\n" };
	struct voc v;
	struct meta_opts o = meta_default();
	struct buf b;
	tqr_tok *t = NULL;
	tqr_error err;
	uint64_t seed = t_seed();
	int differ = 0;

	voc_synthetic(&v);
	b = gguf_of(&v, &o);
	T_ASSERT(tok_of(&b, v.n, &t, &err) == 0 || (fprintf(stderr, "%s\n", err.msg), 0));
	for (int iter = 0; iter < 3000; iter++) {
		char s[256];
		int got[512], want[512];
		size_t n = 0;
		long g;
		int k;

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		for (int m = (int)(seed >> 59); m >= 0; m--) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			const char *a = alpha[(seed >> 33) % (sizeof(alpha) / sizeof(alpha[0]))];
			memcpy(s + n, a, strlen(a));
			n += strlen(a);
		}
		g = tqr_tok_encode(t, s, n, 0, 0, got, &err);
		k = naive_spm(&v, s, n, 0, want);
		if (g != k || memcmp(got, want, sizeof(int) * (size_t)k)) {
			if (differ++ < 3)
				fprintf(stderr, "  '%.*s': %ld tokens vs naive %d\n", (int)n, s, g, k);
		}
	}
	T_EQ(differ, 0);
	/* the unused "bb" and the control "cc" are never produced */
	int ids[16];
	long k;
	for (int j = 0; j < 2; j++) {
		k = tqr_tok_encode(t, j ? "cc" : "bb", 2, 1, 1, ids, &err);
		T_EQ(k, 5); /* BOS ▁ b b EOS */
		T_EQ(ids[0], 1);
		T_EQ(ids[4], 2);
		for (long i = 1; i < 4; i++)
			T_ASSERT(tqr_tok_score(t, ids[i]) == -1.0f);
	}
	/* "é" is not a piece but "xé" is: merged by text (sentencepiece) */
	k = tqr_tok_encode(t, "x\xc3\xa9", 3, 0, 0, ids, &err);
	T_EQ(k, 2);
	T_EQ(ids[1], lin_find(&v, "x\xc3\xa9", 3, 1));
	/* "é" alone: 0xA9 has no byte token: <unk> */
	k = tqr_tok_encode(t, "\xc3\xa9", 2, 0, 0, ids, &err);
	T_EQ(k, 2);
	T_EQ(ids[1], 0);
	/* decode: the prefix space goes at the start and after a control
	 * token, stays elsewhere; control and unknown tokens are nothing */
	const char *p;
	size_t pn;
	int sab = lin_find(&v, SP "ab", 5, 1);
	T_EQ(tqr_tok_decode(t, -1, sab, &p, &pn), 0);
	T_ASSERT(pn == 2 && !memcmp(p, "ab", 2));
	T_EQ(tqr_tok_decode(t, 1, sab, &p, &pn), 0);
	T_ASSERT(pn == 2 && !memcmp(p, "ab", 2));
	T_EQ(tqr_tok_decode(t, 4, sab, &p, &pn), 0);
	T_ASSERT(pn == 3 && !memcmp(p, " ab", 3));
	T_EQ(tqr_tok_decode(t, 4, 1, &p, &pn), 0);
	T_EQ(pn, 0);
	T_EQ(tqr_tok_decode(t, 4, 0, &p, &pn), 0);
	T_EQ(pn, 0);
	T_EQ(tqr_tok_decode(t, 4, 3 + 0x41, &p, &pn), 0);
	T_ASSERT(pn == 1 && p[0] == 'A');
	T_EQ(tqr_tok_decode(t, 4, v.n, &p, &pn), -EINVAL);
	T_EQ(tqr_tok_is_control(t, 1), 1);
	T_EQ(tqr_tok_is_control(t, 0), 0);
	T_EQ(tqr_tok_adds_bos(t), 1);
	tqr_tok_free(t);
	free(b.p);

	/* add_bos_token false, add_space_prefix false */
	o.add_bos = 0;
	o.add_space = 0;
	b = gguf_of(&v, &o);
	T_ASSERT(tok_of(&b, v.n, &t, &err) == 0);
	k = tqr_tok_encode(t, "ab", 2, 1, 0, ids, &err);
	T_EQ(k, 1);
	T_EQ(ids[0], lin_find(&v, "ab", 2, 1));
	T_EQ(tqr_tok_adds_bos(t), 0);
	T_EQ(tqr_tok_decode(t, -1, lin_find(&v, SP "a", 4, 1), &p, &pn), 0);
	T_ASSERT(pn == 2 && !memcmp(p, " a", 2));
	tqr_tok_free(t);
	free(b.p);
	voc_free(&v);
}

/* Each bad piece of metadata fails with a message. */
static int meta_fails(const struct voc *v, const struct meta_opts *o, int vocab, const char *want)
{
	struct buf b = gguf_of(v, o);
	tqr_tok *t = NULL;
	tqr_error err = { { 0 } };
	int rc = tok_of(&b, vocab, &t, &err);

	tqr_tok_free(t);
	free(b.p);
	/* -EINVAL, or -ENOENT for a missing key */
	if ((rc != -EINVAL && rc != -ENOENT) || !strstr(err.msg, want)) {
		fprintf(stderr, "  rc %d '%s' (want '%s')\n", rc, err.msg, want);
		return 0;
	}
	return 1;
}

static void test_bad_metadata(void)
{
	struct voc v;
	struct meta_opts o;
	char *keep;
	size_t keep_len;

	voc_synthetic(&v);
#define WITH(field, value, vocab, msg) \
	do { o = meta_default(); o.field = value; T_ASSERT(meta_fails(&v, &o, vocab, msg)); } while (0)
	o = meta_default();
	T_ASSERT(meta_fails(&v, &o, v.n + 1, "not the model's vocabulary size"));
	WITH(n_tok, v.n - 1, v.n, "not the model's vocabulary size");
	WITH(n_score, v.n - 1, v.n, "tokenizer.ggml.scores");
	WITH(n_score, v.n + 1, v.n, "tokenizer.ggml.scores");
	WITH(score_type, TQR_GGUF_I32, v.n, "not");
	WITH(no_scores, 1, v.n, "tokenizer.ggml.scores");
	WITH(n_type, v.n - 1, v.n, "tokenizer.ggml.token_type");
	WITH(type_type, TQR_GGUF_STRING, v.n, "tokenizer.ggml.token_type");
	WITH(no_types, 1, v.n, "token_type is missing");
	WITH(bos, v.n, v.n, "bos_token_id");
	WITH(eos, v.n + 7, v.n, "eos_token_id");
	WITH(unk, 1u << 31, v.n, "unknown_token_id");
	WITH(model, "bert", v.n, "\"bert\" is not supported");
	/* a NaN score, a bad type, a misspelled byte token, a duplicate */
	float sc = v.score[270];
	v.score[270] = NAN;
	o = meta_default();
	T_ASSERT(meta_fails(&v, &o, v.n, "scores: entry 270 is not a finite number"));
	v.score[270] = INFINITY;
	T_ASSERT(meta_fails(&v, &o, v.n, "scores: entry 270 is not a finite number"));
	v.score[270] = sc;
	v.type[5] = 7;
	T_ASSERT(meta_fails(&v, &o, v.n, "token 5 has type 7"));
	v.type[5] = 0;
	T_ASSERT(meta_fails(&v, &o, v.n, "token 5 has type 0"));
	v.type[5] = TQR_BPE_BYTE;
	v.tok[5][3] = 'g';
	T_ASSERT(meta_fails(&v, &o, v.n, "token 5 is a byte token not spelled <0xXX>"));
	v.tok[5][3] = '0';
	keep = v.tok[v.n - 4];
	keep_len = v.len[v.n - 4];
	v.tok[v.n - 4] = v.tok[v.n - 5];
	v.len[v.n - 4] = v.len[v.n - 5];
	T_ASSERT(meta_fails(&v, &o, v.n, "repeats token"));
	v.tok[v.n - 4] = keep;
	v.len[v.n - 4] = keep_len;
	/* no U+2581 piece */
	{
		int sp = lin_find(&v, SP, 3, 1);
		T_ASSERT(sp > 0);
		v.type[sp] = TQR_BPE_UNUSED;
		T_ASSERT(meta_fails(&v, &o, v.n, "U+2581"));
		v.type[sp] = TQR_BPE_NORMAL;
	}
	/* add_bos_token without a BOS: a vocabulary of 1 has no default id 1 */
	{
		struct voc one = { 0 };
		voc_add(&one, SP, 3, 0, TQR_BPE_NORMAL);
		o = meta_default();
		o.bos = o.eos = o.unk = -1;
		T_ASSERT(meta_fails(&one, &o, 1, "add_bos_token without a BOS"));
		o.add_bos = 0;
		struct buf b = gguf_of(&one, &o);
		tqr_tok *t = NULL;
		tqr_error err;
		int ids[8];
		T_EQ(tok_of(&b, 1, &t, &err), 0);
		/* "a" is unknown, no byte tokens: the unknown token, which is
		 * llama.cpp's default id 0, here "▁" */
		T_EQ(tqr_tok_encode(t, "a", 1, 1, 0, ids, &err), 2);
		T_ASSERT(ids[0] == 0 && ids[1] == 0);
		T_EQ(tqr_tok_bos(t), -1);
		T_EQ(tqr_tok_eos(t), -1);
		T_EQ(tqr_tok_encode(t, " ", 1, 1, 1, ids, &err), 2);
		tqr_tok_free(t);
		/* without an unknown token the encode fails */
		const struct tqr_spm_spec none = { -1, -1, -1, 0, 1 };
		const char *tk[] = { SP };
		size_t tl[] = { 3 };
		float ts[] = { 0 };
		int32_t ty[] = { TQR_BPE_NORMAL };
		T_EQ(tqr_tok_new_spm(&t, tk, tl, ts, ty, 1, &none, &err), 0);
		T_EQ(tqr_tok_encode(t, "a", 1, 1, 0, ids, &err), -EILSEQ);
		T_ASSERT(strstr(err.msg, "0x61"));
		tqr_tok_free(t);
		/* the constructor's own checks */
		ts[0] = NAN;
		T_EQ(tqr_tok_new_spm(&t, tk, tl, ts, ty, 1, &none, &err), -EINVAL);
		T_ASSERT(strstr(err.msg, "token 0 has a non-finite score"));
		ts[0] = 0;
		T_EQ(tqr_tok_new_spm(&t, tk, tl, ts, NULL, 1, &none, &err), -EINVAL);
		T_EQ(tqr_tok_new_spm(&t, tk, tl, ts, ty, 0, &none, &err), -EINVAL);
		tl[0] = TQR_TOK_LEN_MAX + 1;
		T_EQ(tqr_tok_new_spm(&t, tk, tl, ts, ty, 1, &none, &err), -EINVAL);
		T_ASSERT(strstr(err.msg, "token 0 is"));
		T_ASSERT(t == NULL);
		free(b.p);
		voc_free(&one);
	}
	/* and the valid file loads */
	o = meta_default();
	{
		struct buf b = gguf_of(&v, &o);
		tqr_tok *t = NULL;
		tqr_error err;
		T_EQ(tok_of(&b, v.n, &t, &err), 0);
		tqr_tok_free(t);
		free(b.p);
	}
#undef WITH
	voc_free(&v);
}

/* The fuzz seed spm.gguf (tests/fuzz/make_gguf_seeds.py) loads: fuzz_gguf's
 * seeds reach the "llama" vocabulary loader. */
static void test_seed_loads(void)
{
	char path[1024];
	tqr_tok *t = NULL;
	tqr_error err;
	int ids[32];

	snprintf(path, sizeof(path), "%s/tests/fuzz/seeds/gguf/spm.gguf", src_dir());
	T_ASSERT(tqr_tok_from_gguf(&t, path, 36, &err) == 0 || (fprintf(stderr, "%s\n", err.msg), 0));
	T_EQ(tqr_tok_encode(t, "a time", 6, 1, 0, ids, &err), 4); /* BOS ▁a ▁tim e */
	T_EQ(ids[0], 1);
	tqr_tok_free(t);
	T_EQ(tqr_tok_from_gguf(&t, path, 37, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "spm.gguf: tokenizer.ggml.tokens"));
}

/* ---- tok512.bin's vocabulary against the references ------------------------ */

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

/* decode(ids) after BOS, as tqkv-run prints them */
static size_t decode_all(const tqr_tok *t, const int *ids, long n, char *out)
{
	size_t o = 0;

	for (long i = 0; i < n; i++) {
		const char *p;
		size_t k;
		if (tqr_tok_decode(t, i ? ids[i - 1] : tqr_tok_bos(t), ids[i], &p, &k) < 0)
			return (size_t)-1;
		memcpy(out + o, p, k);
		o += k;
	}
	return o;
}

/* Every fixture line through t (and, where comparable, through llama2.c's
 * tokenizer l); *n_cases: the number of lines. */
static void check_fixture(const tqr_tok *t, const tqr_tok *l, const char *name, size_t *n_cases)
{
	char path[1024], *fix;
	size_t len, cases = 0, same_l2c = 0, diff_l2c = 0;

	if (getenv("TQ_SPM_FIXTURE"))
		snprintf(path, sizeof(path), "%s", getenv("TQ_SPM_FIXTURE"));
	else
		snprintf(path, sizeof(path), "%s/tests/data/spm_tok512.txt", src_dir());
	fix = (char *)slurp(path, &len);
	T_ASSERT(fix);
	for (char *line = fix, *nl; line < fix + len; line = nl + 1) {
		static char text[8192], want_s[16384], dec[32768];
		static int want[8192], got[8192], gotb[8192], l2c[8192];
		char *t1, *t2;
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
			want[nw++] = (int)strtol(p, &e, 10);
			if (e == p)
				break;
		}
		ng = tqr_tok_encode(t, text, tn, 0, 0, got, &err);
		if (ng < 0)
			T_FAIL("%s, line %zu: %s", name, cases, err.msg);
		if ((size_t)ng != nw || memcmp(got, want, nw * sizeof(int))) {
			fprintf(stderr, "  %s: \"%s\"\n  want:", name, t1 + 1);
			for (size_t i = 0; i < nw; i++)
				fprintf(stderr, " %d", want[i]);
			fprintf(stderr, "\n  got: ");
			for (long i = 0; i < ng; i++)
				fprintf(stderr, " %d", got[i]);
			T_FAIL("ids differ from the reference");
		}
		/* BOS comes first on request (add_bos_token) */
		T_EQ(tqr_tok_encode(t, text, tn, 1, 0, gotb, &err), ng + 1);
		T_EQ(gotb[0], 1);
		/* decode gives the text back, a literal U+2581 as a space */
		{
			char norm[8192];
			size_t nn = 0, nd = decode_all(t, gotb + 1, ng, dec);
			for (size_t i = 0; i < tn; i++) {
				if (i + 3 <= tn && !memcmp(text + i, SP, 3)) {
					norm[nn++] = ' ';
					i += 2;
				} else {
					norm[nn++] = text[i];
				}
			}
			if (nd != nn || memcmp(dec, norm, nn))
				T_FAIL("%s: \"%s\" does not decode back", name, t1 + 1);
		}
		/* llama2.c's tokenizer.bin rules: the same ids, except where
		 * the text holds U+2581 (a space only to sentencepiece) */
		if (l) {
			long nl2 = tqr_tok_encode(l, text, tn, 0, 0, l2c, &err);
			int eq = nl2 == ng && !memcmp(l2c, got, sizeof(int) * (size_t)ng);
			int has_sp = memmem(text, tn, SP, 3) != NULL;
			if (has_sp) {
				T_ASSERT(!eq);
				diff_l2c++;
			} else {
				if (!eq)
					T_FAIL("\"%s\": llama2.c's rules give other ids", t1 + 1);
				same_l2c++;
			}
		}
		cases++;
	}
	free(fix);
	printf("  %s: %zu fixture strings match sentencepiece and decode back", name, cases);
	if (l)
		printf("; llama2.c's tokenizer.bin agrees on %zu, differs (U+2581 in the text) on %zu", same_l2c,
		       diff_l2c);
	printf("\n");
	*n_cases = cases;
}

static struct voc T512;
static tqr_tok *L2C;

static void test_fixture(void)
{
	struct meta_opts o = meta_default();
	struct buf b = gguf_of(&T512, &o);
	tqr_tok *t = NULL;
	tqr_error err;
	char path[1024];

	T_ASSERT(tok_of(&b, 512, &t, &err) == 0 || (fprintf(stderr, "%s\n", err.msg), 0));
	size_t cases = 0;
	check_fixture(t, L2C, "tok512 (written here)", &cases);
	T_ASSERT(cases >= 40);
	tqr_tok_free(t);
	free(b.p);

	/* the script's GGUFWriter file, when it was written */
	snprintf(path, sizeof(path), "%s/build/spm/tok512-vocab.gguf", src_dir());
	if (tqr_tok_from_gguf(&t, path, 512, &err) == 0) {
		check_fixture(t, NULL, "tok512-vocab.gguf (GGUFWriter)", &cases);
		tqr_tok_free(t);
	} else {
		printf("  (%s: %s — scripts/gen-spm-fixture.py writes it)\n", path, err.msg);
	}
}

/* TinyStories text: the GGUF vocabulary and llama2.c's tokenizer.bin agree
 * token for token (no U+2581 in it), and decode gives the text back. */
static void test_text_agrees(void)
{
	struct meta_opts o = meta_default();
	struct buf b = gguf_of(&T512, &o);
	tqr_tok *t = NULL;
	tqr_error err;
	char path[1024];
	size_t len;
	char *text;

	snprintf(path, sizeof(path), "%s/../shared/data/tinystories-dev.txt", src_dir());
	if (!(text = (char *)slurp(path, &len))) {
		printf("  (no %s)\n", path);
		free(b.p);
		return;
	}
	T_ASSERT(tok_of(&b, 512, &t, &err) == 0);
	int *a = malloc(sizeof(int) * (len + 3)), *c = malloc(sizeof(int) * (len + 3));
	char *dec = malloc(len + 16);
	long na = tqr_tok_encode(t, text, len, 1, 0, a, &err), nc = tqr_tok_encode(L2C, text, len, 1, 0, c, &err);
	T_EQ(na, nc);
	T_ASSERT(na > 0 && !memcmp(a, c, sizeof(int) * (size_t)na));
	T_EQ(decode_all(t, a + 1, na - 1, dec), len);
	T_ASSERT(!memcmp(dec, text, len));
	printf("  tinystories-dev.txt: %zu bytes -> %ld tokens, the same as tokenizer.bin's\n", len, na);
	free(a);
	free(c);
	free(dec);
	free(text);
	tqr_tok_free(t);
	free(b.p);
}

int main(void)
{
	char path[1024];
	tqr_error err;
	int rc;

	T_RUN(test_merges_match_naive);
	T_RUN(test_bad_metadata);
	T_RUN(test_seed_loads);
	snprintf(path, sizeof(path), "%s/../shared/data/tok512.bin", src_dir());
	if (voc_from_tokbin(&T512, path) < 0 || T512.n != 512 || tqr_tok_load(&L2C, path, 512, &err) < 0) {
		if ((rc = t_done()) != 0)
			return rc;
		t_skip("no ../shared/data/tok512.bin: the reference cases were skipped (the synthetic ones passed)");
	}
	T_RUN(test_fixture);
	T_RUN(test_text_agrees);
	rc = t_done();
	tqr_tok_free(L2C);
	voc_free(&T512);
	return rc;
}
