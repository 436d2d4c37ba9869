/* tokenizer.c — llama2.c tokenizer.bin: loading, BPE encoding, decoding. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

#include "bpe.h"

struct tok_entry {
	const char *s;      /* into tqr_tok.strings */
	uint32_t n;
	int id;
};

struct tqr_tok {
	tqr_bpe *bpe;             /* GGUF gpt2 vocabularies: all calls go there */
	int bos_id, eos_id, add_bos;
	int vocab_size;
	int max_len;              /* max_token_length from the file        */
	float *score;             /* [vocab_size]                          */
	struct tok_entry *by_id;  /* [vocab_size]                          */
	struct tok_entry *sorted; /* [vocab_size] by bytes, then id        */
	char *strings;            /* every token's bytes, NUL after each   */
	int byte_id[256];         /* the "<0xXX>" token of each byte, or -1 */
	unsigned char bytes[256]; /* byte b's decoded piece is bytes + b   */
};

static int entry_cmp(const void *a, const void *b)
{
	const struct tok_entry *x = a, *y = b;
	uint32_t n = x->n < y->n ? x->n : y->n;
	int c = memcmp(x->s, y->s, n);

	if (c)
		return c;
	if (x->n != y->n)
		return x->n < y->n ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

static int key_cmp(const char *s, uint32_t n, const struct tok_entry *e)
{
	uint32_t m = n < e->n ? n : e->n;
	int c = memcmp(s, e->s, m);

	if (c)
		return c;
	return (n > e->n) - (n < e->n);
}

int tqr_tok_lookup(const tqr_tok *t, const char *s, size_t n)
{
	size_t lo = 0, hi = (size_t)t->vocab_size;

	if (t->bpe)
		return tqr_bpe_lookup(t->bpe, s, n);

	if (n > UINT32_MAX)
		return -1;
	/* lower bound: the smallest id among equal strings */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (key_cmp(s, (uint32_t)n, &t->sorted[mid]) > 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < (size_t)t->vocab_size && key_cmp(s, (uint32_t)n, &t->sorted[lo]) == 0)
		return t->sorted[lo].id;
	return -1;
}

static uint32_t rd_u32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int is_byte_token(const char *s, uint32_t n, int *byte)
{
	static const char hex[] = "0123456789ABCDEF";
	const char *h, *l;

	if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
		return 0;
	h = memchr(hex, s[3], 16);
	l = memchr(hex, s[4], 16);
	if (!h || !l || !s[3] || !s[4])
		return 0;
	*byte = (int)((h - hex) * 16 + (l - hex));
	return 1;
}

void tqr_tok_free(tqr_tok *t)
{
	if (!t)
		return;
	tqr_bpe_free(t->bpe);
	free(t->score);
	free(t->by_id);
	free(t->sorted);
	free(t->strings);
	free(t);
}

int tqr_tok_load(tqr_tok **out, const char *path, int vocab_size, tqr_error *err)
{
	unsigned char *buf = NULL;
	size_t len, off, str_bytes = 0;
	tqr_tok *t = NULL;
	int32_t max_len;
	long count = 0;
	int rc;

	*out = NULL;
	if (vocab_size < 3)
		return tqr_fail(err, -EINVAL, "%s: vocab_size %d is too small (BOS and EOS are tokens 1 and 2)",
				path, vocab_size);
	if ((rc = tqr_file_read(path, (size_t)1 << 30, &buf, &len, err)) < 0)
		return rc;
	if (len < 4) {
		rc = tqr_fail(err, -EINVAL, "%s: %zu bytes, too short for a tokenizer header", path, len);
		goto fail;
	}
	max_len = (int32_t)rd_u32(buf);
	if (max_len < 1 || max_len > TQR_TOK_LEN_MAX) {
		rc = tqr_fail(err, -EINVAL, "%s: max_token_length %d is out of range [1, %d]: not a llama2.c tokenizer.bin",
			      path, max_len, TQR_TOK_LEN_MAX);
		goto fail;
	}
	/* First pass: count the entries and validate each one. */
	for (off = 4; off < len; count++) {
		float score;
		int32_t n;

		if (len - off < 8) {
			rc = tqr_fail(err, -EINVAL, "%s: truncated at byte %zu: token %ld's header needs 8 bytes",
				      path, off, count);
			goto fail;
		}
		memcpy(&score, buf + off, 4);
		n = (int32_t)rd_u32(buf + off + 4);
		if (!isfinite(score)) {
			rc = tqr_fail(err, -EINVAL, "%s: token %ld (byte %zu) has a non-finite score", path, count, off);
			goto fail;
		}
		if (n < 0 || n > max_len) {
			rc = tqr_fail(err, -EINVAL, "%s: token %ld (byte %zu) has length %d, outside [0, max_token_length %d]",
				      path, count, off, n, max_len);
			goto fail;
		}
		off += 8;
		if (len - off < (size_t)n) {
			rc = tqr_fail(err, -EINVAL, "%s: truncated at byte %zu: token %ld needs %d bytes, %zu left",
				      path, off, count, n, len - off);
			goto fail;
		}
		off += (size_t)n;
		str_bytes += (size_t)n + 1;
	}
	if (count != vocab_size) {
		rc = tqr_fail(err, -EINVAL, "%s: tokenizer mismatch: the file holds %ld tokens, the model's vocabulary has %d",
			      path, count, vocab_size);
		goto fail;
	}

	rc = -ENOMEM;
	if (!(t = calloc(1, sizeof(*t))))
		goto fail_nomem;
	t->vocab_size = vocab_size;
	t->max_len = max_len;
	t->score = malloc(sizeof(float) * (size_t)vocab_size);
	t->by_id = malloc(sizeof(*t->by_id) * (size_t)vocab_size);
	t->sorted = malloc(sizeof(*t->sorted) * (size_t)vocab_size);
	t->strings = malloc(str_bytes ? str_bytes : 1);
	if (!t->score || !t->by_id || !t->sorted || !t->strings)
		goto fail_nomem;
	for (int i = 0; i < 256; i++) {
		t->byte_id[i] = -1;
		t->bytes[i] = (unsigned char)i;
	}
	char *sp = t->strings;
	off = 4;
	for (int i = 0; i < vocab_size; i++) {
		uint32_t n = rd_u32(buf + off + 4);
		int b;

		memcpy(&t->score[i], buf + off, 4);
		memcpy(sp, buf + off + 8, n);
		sp[n] = 0;
		t->by_id[i] = (struct tok_entry){ sp, n, i };
		if (is_byte_token(sp, n, &b) && t->byte_id[b] < 0)
			t->byte_id[b] = i;
		sp += n + 1;
		off += 8 + n;
	}
	memcpy(t->sorted, t->by_id, sizeof(*t->sorted) * (size_t)vocab_size);
	qsort(t->sorted, (size_t)vocab_size, sizeof(*t->sorted), entry_cmp);
	free(buf);
	*out = t;
	return 0;

fail_nomem:
	rc = tqr_fail(err, -ENOMEM, "%s: out of memory", path);
fail:
	tqr_tok_free(t);
	free(buf);
	return rc;
}

int tqr_tok_vocab_size(const tqr_tok *t)
{
	return t->vocab_size;
}

int tqr_tok_wrap_bpe(tqr_tok **out, tqr_bpe *b, int bos_id, int eos_id, int add_bos, tqr_error *err)
{
	tqr_tok *t = calloc(1, sizeof(*t));

	*out = NULL;
	if (!t) {
		tqr_bpe_free(b);
		return tqr_fail(err, -ENOMEM, "out of memory");
	}
	t->bpe = b;
	t->vocab_size = tqr_bpe_n_tokens(b);
	t->bos_id = bos_id;
	t->eos_id = eos_id;
	t->add_bos = add_bos;
	*out = t;
	return 0;
}

int tqr_tok_bos(const tqr_tok *t)
{
	return t->bpe ? t->bos_id : TQR_TOK_BOS;
}

int tqr_tok_eos(const tqr_tok *t)
{
	return t->bpe ? t->eos_id : TQR_TOK_EOS;
}

int tqr_tok_adds_bos(const tqr_tok *t)
{
	return t->bpe ? t->add_bos : 1;
}

int tqr_tok_is_control(const tqr_tok *t, int id)
{
	if (t->bpe)
		return tqr_bpe_type(t->bpe, id) == TQR_BPE_CONTROL;
	return id == TQR_TOK_BOS || id == TQR_TOK_EOS;
}

const char *tqr_tok_str(const tqr_tok *t, int id, size_t *n)
{
	if (t->bpe)
		return tqr_bpe_token(t->bpe, id, n);
	if (id < 0 || id >= t->vocab_size) {
		*n = 0;
		return NULL;
	}
	*n = t->by_id[id].n;
	return t->by_id[id].s;
}

float tqr_tok_score(const tqr_tok *t, int id)
{
	if (t->bpe)
		return 0.0f;
	return id >= 0 && id < t->vocab_size ? t->score[id] : -INFINITY;
}

int tqr_tok_decode(const tqr_tok *t, int prev, int id, const char **piece, size_t *n)
{
	const struct tok_entry *e;
	int b;

	if (t->bpe)
		return tqr_bpe_decode(t->bpe, id, 0, piece, n);
	if (id < 0 || id >= t->vocab_size)
		return -EINVAL;
	e = &t->by_id[id];
	if (is_byte_token(e->s, e->n, &b)) {
		*piece = (const char *)t->bytes + b;
		*n = 1;
		return 0;
	}
	*piece = e->s;
	*n = e->n;
	if (prev == TQR_TOK_BOS && e->n && e->s[0] == ' ') {
		(*piece)++;
		(*n)--;
	}
	return 0;
}

/* ---- encoding ------------------------------------------------------------- */

/* One symbol of the text being merged: a token id in a doubly linked list
 * ordered like the text (array order never changes, merges unlink). */
struct sym {
	int id;
	int prev, next;   /* -1 at the ends */
};

/* A merge candidate: symbols `left` and its successor `right` with ids
 * (lid, rid) merge into `merged`, whose score is `score`. */
struct cand {
	float score;
	int left, right;
	int lid, rid;
	int merged;
};

/* Heap order: higher score first, then the leftmost pair (llama2.c scans left
 * to right and keeps the first strictly better score). */
static int cand_before(const struct cand *a, const struct cand *b)
{
	if (a->score != b->score)
		return a->score > b->score;
	return a->left < b->left;
}

struct heap {
	struct cand *v;
	size_t n, cap;
};

static void heap_push(struct heap *h, struct cand c)
{
	size_t i = h->n++;

	/* capacity is sized by the caller: every push follows a pop or the
	 * initial fill, so n never exceeds cap */
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!cand_before(&c, &h->v[p]))
			break;
		h->v[i] = h->v[p];
		i = p;
	}
	h->v[i] = c;
}

static struct cand heap_pop(struct heap *h)
{
	struct cand top = h->v[0], last = h->v[--h->n];
	size_t i = 0;

	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		const struct cand *best = &last;
		if (l < h->n && cand_before(&h->v[l], best)) {
			m = l;
			best = &h->v[l];
		}
		if (r < h->n && cand_before(&h->v[r], best))
			m = r;
		if (m == i)
			break;
		h->v[i] = h->v[m];
		i = m;
	}
	if (h->n)
		h->v[i] = last;
	return top;
}

/* Pushes the merge of symbols l and r when their concatenation is a token. */
static void try_pair(const tqr_tok *t, struct heap *h, const struct sym *s, int l, int r, char *buf)
{
	const struct tok_entry *a, *b;
	int id;

	if (l < 0 || r < 0)
		return;
	a = &t->by_id[s[l].id];
	b = &t->by_id[s[r].id];
	memcpy(buf, a->s, a->n);
	memcpy(buf + a->n, b->s, b->n);
	id = tqr_tok_lookup(t, buf, (size_t)a->n + b->n);
	if (id < 0)
		return;
	heap_push(h, (struct cand){ t->score[id], l, r, s[l].id, s[r].id, id });
}

/* A byte-level BPE vocabulary: BOS only where the file says the model
 * takes one, special tokens as text unless parse_special. */
static long encode_bpe(const tqr_tok *t, const char *text, size_t len, int bos, int eos,
		       int parse_special, int *tokens, tqr_error *err)
{
	long n = 0, k;

	if (bos && t->add_bos && t->bos_id >= 0)
		tokens[n++] = t->bos_id;
	k = tqr_bpe_encode(t->bpe, text, len, parse_special, (int32_t *)(tokens + n), len, err);
	if (k < 0)
		return k;
	n += k;
	if (eos && t->eos_id >= 0)
		tokens[n++] = t->eos_id;
	return n;
}

long tqr_tok_encode_special(const tqr_tok *t, const char *text, size_t len, int bos, int eos,
			    int *tokens, tqr_error *err)
{
	if (t->bpe)
		return encode_bpe(t, text, len, bos, eos, 1, tokens, err);
	return tqr_tok_encode(t, text, len, bos, eos, tokens, err);
}

long tqr_tok_encode(const tqr_tok *t, const char *text, size_t len, int bos, int eos,
		    int *tokens, tqr_error *err)
{
	if (t->bpe)
		return encode_bpe(t, text, len, bos, eos, 0, tokens, err);

	const unsigned char *u = (const unsigned char *)text;
	struct sym *s = NULL;
	struct heap h = { 0 };
	char *buf = NULL;
	size_t n = 0, i, start;
	long out = 0;
	int rc;

	/* symbols: at most one per byte plus the dummy prefix */
	s = malloc(sizeof(*s) * (len + 1));
	buf = malloc(2 * (size_t)t->max_len + 8);
	if (!s || !buf) {
		rc = tqr_fail(err, -ENOMEM, "out of memory encoding %zu bytes", len);
		goto fail;
	}
	if (len) {
		int sp = tqr_tok_lookup(t, " ", 1);
		if (sp < 0)
			sp = t->byte_id[' '];
		if (sp < 0) {
			rc = tqr_fail(err, -EILSEQ, "the vocabulary has neither \" \" nor <0x20> for the dummy prefix");
			goto fail;
		}
		s[n++].id = sp;
	}
	/* One symbol per UTF-8 code point: a byte that is not a continuation
	 * byte starts one; at most 4 bytes. */
	for (i = 0; i < len; i = start) {
		int id;

		start = i + 1;
		while (start < len && (u[start] & 0xC0) == 0x80 && start - i < 4)
			start++;
		id = tqr_tok_lookup(t, text + i, start - i);
		if (id >= 0) {
			s[n++].id = id;
			continue;
		}
		for (size_t j = i; j < start; j++) {
			if (t->byte_id[u[j]] < 0) {
				rc = tqr_fail(err, -EILSEQ, "byte 0x%02X at offset %zu has no <0x%02X> token",
					      u[j], j, u[j]);
				goto fail;
			}
			s[n++].id = t->byte_id[u[j]];
		}
	}
	for (i = 0; i < n; i++) {
		s[i].prev = (int)i - 1;
		s[i].next = i + 1 < n ? (int)i + 1 : -1;
	}
	/* Candidates: n - 1 initial pairs, then at most 2 per merge (n - 1
	 * merges at most), and one pop per merge: 3n bounds the heap. */
	h.cap = 3 * n + 1;
	h.v = malloc(sizeof(*h.v) * h.cap);
	if (!h.v) {
		rc = tqr_fail(err, -ENOMEM, "out of memory encoding %zu bytes", len);
		goto fail;
	}
	for (i = 0; i + 1 < n; i++)
		try_pair(t, &h, s, (int)i, (int)i + 1, buf);
	while (h.n) {
		struct cand c = heap_pop(&h);
		/* stale: a side was merged away or changed since the push */
		if (s[c.left].id != c.lid || s[c.left].next != c.right || s[c.right].id != c.rid)
			continue;
		s[c.left].id = c.merged;
		s[c.left].next = s[c.right].next;
		if (s[c.right].next >= 0)
			s[s[c.right].next].prev = c.left;
		s[c.right].id = -1; /* dead */
		s[c.right].next = -1;
		try_pair(t, &h, s, s[c.left].prev, c.left, buf);
		try_pair(t, &h, s, c.left, s[c.left].next, buf);
	}
	if (bos)
		tokens[out++] = TQR_TOK_BOS;
	for (int k = n ? 0 : -1; k >= 0; k = s[k].next)
		tokens[out++] = s[k].id;
	if (eos)
		tokens[out++] = TQR_TOK_EOS;
	free(h.v);
	free(buf);
	free(s);
	return out;
fail:
	free(h.v);
	free(buf);
	free(s);
	return rc;
}
