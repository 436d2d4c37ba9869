/* bpe.c — byte-level BPE: vocabulary checks, the GPT-2 pre-tokenizer by
 * hand over generated Unicode tables, merges on a heap, decoding. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "bpe_unicode.h"

enum { PRE_GPT2, PRE_SMOLLM };

/* A merge rule: the pair (left, right) of token ids becomes `result`;
 * lower rank merges first.  rank < 0: an empty slot. */
struct merge_slot {
	int32_t left, right;
	int32_t rank, result;
};

struct tqr_bpe {
	int n;                    /* tokens                                    */
	int pre;                  /* PRE_*                                     */
	char *raw;                /* every raw vocabulary string, back to back */
	uint32_t *raw_off;        /* [n + 1]: token i is raw[raw_off[i]..[i+1]) */
	char *dec;                /* decoded bytes of normal and byte tokens   */
	uint32_t *dec_off;        /* [n + 1], like raw_off                     */
	uint8_t *type;            /* [n] enum tqr_bpe_type                     */
	int32_t *tok_hash;        /* [tok_mask + 1] token ids, -1 empty        */
	uint32_t tok_mask;
	struct merge_slot *merge; /* [merge_mask + 1]                          */
	uint32_t merge_mask;
	int32_t byte_tok[256];    /* the token of byte b's character, or -1   */
	int32_t *special;         /* [n_special] matched as whole strings,     */
	int n_special;            /*   longest first                           */
	uint8_t special_first[256]; /* a special string starts with this byte */
};

/* ---- GPT-2's byte-to-unicode map ------------------------------------------
 * Printable Latin-1 bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for
 * themselves; the other 68 bytes, in order, for U+0100 onwards. */
static uint32_t byte_char(int b)
{
	int n = 0;

	if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
		return (uint32_t)b;
	for (int i = 0; i < b; i++)
		if (!((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF)))
			n++;
	return 256u + (uint32_t)n;
}

/* The byte that code point cp stands for, or -1. */
static int char_byte(uint32_t cp)
{
	if (cp < 256)
		return byte_char((int)cp) == cp ? (int)cp : -1;
	for (int b = 0; b < 256; b++)
		if (byte_char(b) == cp)
			return b;
	return -1;
}

/* ---- UTF-8 ------------------------------------------------------------- */

/* The code point at s[0..n) (n >= 1) and its length; an invalid sequence
 * (bad lead, missing continuation, overlong, surrogate, > U+10FFFF) is one
 * byte long and returns -1. */
static int32_t utf8_next(const unsigned char *s, size_t n, size_t *len)
{
	uint32_t c = s[0], min;
	size_t k;

	*len = 1;
	if (c < 0x80)
		return (int32_t)c;
	if (c >= 0xC2 && c <= 0xDF) {
		k = 2;
		c &= 0x1F;
		min = 0x80;
	} else if (c >= 0xE0 && c <= 0xEF) {
		k = 3;
		c &= 0x0F;
		min = 0x800;
	} else if (c >= 0xF0 && c <= 0xF4) {
		k = 4;
		c &= 0x07;
		min = 0x10000;
	} else {
		return -1;
	}
	if (n < k)
		return -1;
	for (size_t i = 1; i < k; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return -1;
		c = c << 6 | (s[i] & 0x3F);
	}
	if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
		return -1;
	*len = k;
	return (int32_t)c;
}

static size_t utf8_put(char *out, uint32_t c)
{
	if (c < 0x80) {
		out[0] = (char)c;
		return 1;
	}
	if (c < 0x800) {
		out[0] = (char)(0xC0 | c >> 6);
		out[1] = (char)(0x80 | (c & 0x3F));
		return 2;
	}
	out[0] = (char)(0xE0 | c >> 12); /* the map stays below U+0800 */
	out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
	out[2] = (char)(0x80 | (c & 0x3F));
	return 3;
}

/* The pre-tokenizer class of a code point (-1: an invalid byte, "other"). */
static int cp_class(int32_t cp)
{
	size_t lo = 0, hi = sizeof(bpe_uranges) / sizeof(bpe_uranges[0]);

	if (cp < 0)
		return BPE_OTHER;
	if (cp < 0x80) {
		if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
			return BPE_LETTER;
		if (cp >= '0' && cp <= '9')
			return BPE_NUMBER;
		if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D))
			return BPE_SPACE;
		return BPE_OTHER;
	}
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if ((uint32_t)cp > bpe_uranges[mid].hi)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < sizeof(bpe_uranges) / sizeof(bpe_uranges[0]) && (uint32_t)cp >= bpe_uranges[lo].lo)
		return bpe_uranges[lo].cls;
	return BPE_OTHER;
}

/* ---- hash tables --------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
	return h ^ h >> 29;
}

static uint32_t hash_pair(int32_t a, int32_t b)
{
	uint64_t h = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) * 0x9E3779B97F4A7C15ull;
	return (uint32_t)(h >> 32);
}

static size_t table_size(size_t n)
{
	size_t s = 16;

	while (s < 2 * n)
		s *= 2;
	return s;
}

int32_t tqr_bpe_lookup(const tqr_bpe *b, const char *s, size_t n)
{
	for (uint32_t i = (uint32_t)hash_bytes(s, n) & b->tok_mask;; i = (i + 1) & b->tok_mask) {
		int32_t id = b->tok_hash[i];
		if (id < 0)
			return -1;
		if (b->raw_off[id + 1] - b->raw_off[id] == n && !memcmp(b->raw + b->raw_off[id], s, n))
			return id;
	}
}

static const struct merge_slot *merge_find(const tqr_bpe *b, int32_t l, int32_t r)
{
	for (uint32_t i = hash_pair(l, r) & b->merge_mask;; i = (i + 1) & b->merge_mask) {
		const struct merge_slot *m = &b->merge[i];
		if (m->rank < 0)
			return NULL;
		if (m->left == l && m->right == r)
			return m;
	}
}

/* ---- construction -------------------------------------------------------- */

void tqr_bpe_free(tqr_bpe *b)
{
	if (!b)
		return;
	free(b->raw);
	free(b->raw_off);
	free(b->dec);
	free(b->dec_off);
	free(b->type);
	free(b->tok_hash);
	free(b->merge);
	free(b->special);
	free(b);
}

/* Decodes byte-level text s[0..n) into out (room for n bytes); the number
 * of bytes, or -1 when s is not UTF-8 made of byte-map characters. */
static long byte_level_decode(const char *s, size_t n, char *out, const int16_t *cp_byte)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t i = 0, k, o = 0;

	while (i < n) {
		int32_t cp = utf8_next(u + i, n - i, &k);
		if (cp < 0 || cp >= 512 || cp_byte[cp] < 0)
			return -1;
		out[o++] = (char)cp_byte[cp];
		i += k;
	}
	return (long)o;
}

struct special_key {
	uint32_t len;
	int32_t id;
};

/* longest first, then by id */
static int special_cmp(const void *x, const void *y)
{
	const struct special_key *a = x, *b = y;

	if (a->len != b->len)
		return a->len > b->len ? -1 : 1;
	return (a->id > b->id) - (a->id < b->id);
}

int tqr_bpe_new(tqr_bpe **out, const char *const *tokens, const size_t *token_lens,
		const int32_t *token_types, int n_tokens, const char *const *merges,
		const size_t *merge_lens, int n_merges, const char *pre, tqr_error *err)
{
	struct special_key *keys = NULL;
	int16_t cp_byte[512];
	size_t raw_bytes = 0;
	char *cat = NULL;
	tqr_bpe *b = NULL;
	int rc = -EINVAL;

	*out = NULL;
	if (!pre)
		pre = "(none)";
	if (n_tokens < 1 || n_tokens > TQR_BPE_TOKENS_MAX)
		return tqr_fail(err, -EINVAL, "BPE vocabulary: %d tokens, outside [1, %d]", n_tokens,
				TQR_BPE_TOKENS_MAX);
	if (n_merges < 0 || n_merges > TQR_BPE_TOKENS_MAX)
		return tqr_fail(err, -EINVAL, "BPE vocabulary: %d merges, outside [0, %d]", n_merges,
				TQR_BPE_TOKENS_MAX);
	for (int i = 0; i < n_tokens; i++) {
		int32_t ty = token_types ? token_types[i] : TQR_BPE_NORMAL;
		if (!tokens[i] && token_lens[i])
			return tqr_fail(err, -EINVAL, "BPE vocabulary: token %d is NULL", i);
		if (token_lens[i] > TQR_BPE_TOKEN_LEN_MAX)
			return tqr_fail(err, -EINVAL, "BPE vocabulary: token %d is %zu bytes long, more than %d",
					i, token_lens[i], TQR_BPE_TOKEN_LEN_MAX);
		if (ty < TQR_BPE_NORMAL || ty > TQR_BPE_BYTE)
			return tqr_fail(err, -EINVAL, "BPE vocabulary: token %d has type %d, not in [1, 6]", i,
					(int)ty);
		raw_bytes += token_lens[i];
	}
	if (raw_bytes >= UINT32_MAX)
		return tqr_fail(err, -EINVAL, "BPE vocabulary: %zu bytes of token text, 4 GiB at most", raw_bytes);
	if (!(b = calloc(1, sizeof(*b))))
		goto fail_nomem;
	if (!strcmp(pre, "gpt2")) {
		b->pre = PRE_GPT2;
	} else if (!strcmp(pre, "smollm")) {
		b->pre = PRE_SMOLLM;
	} else {
		rc = tqr_fail(err, -EINVAL, "BPE pre-tokenizer \"%.64s\" is not supported (gpt2, smollm)", pre);
		goto fail;
	}
	b->n = n_tokens;
	b->tok_mask = (uint32_t)table_size((size_t)n_tokens) - 1;
	b->merge_mask = (uint32_t)table_size((size_t)n_merges) - 1;
	b->raw = malloc(raw_bytes + 1);
	b->dec = malloc(raw_bytes + 1);
	b->raw_off = malloc(sizeof(uint32_t) * ((size_t)n_tokens + 1));
	b->dec_off = malloc(sizeof(uint32_t) * ((size_t)n_tokens + 1));
	b->type = malloc((size_t)n_tokens);
	b->tok_hash = malloc(sizeof(int32_t) * ((size_t)b->tok_mask + 1));
	b->merge = malloc(sizeof(*b->merge) * ((size_t)b->merge_mask + 1));
	b->special = malloc(sizeof(int32_t) * (size_t)n_tokens);
	cat = malloc(2 * TQR_BPE_TOKEN_LEN_MAX);
	if (!b->raw || !b->dec || !b->raw_off || !b->dec_off || !b->type || !b->tok_hash ||
	    !b->merge || !b->special || !cat)
		goto fail_nomem;
	memset(b->tok_hash, 0xff, sizeof(int32_t) * ((size_t)b->tok_mask + 1));
	for (uint32_t i = 0; i <= b->merge_mask; i++)
		b->merge[i].rank = -1;
	for (int c = 0; c < 512; c++)
		cp_byte[c] = (int16_t)char_byte((uint32_t)c);

	/* tokens: copy, decode, index, and reject duplicates */
	b->raw_off[0] = b->dec_off[0] = 0;
	for (int i = 0; i < n_tokens; i++) {
		size_t n = token_lens[i];
		char *s = b->raw + b->raw_off[i];
		uint32_t h;

		b->type[i] = (uint8_t)(token_types ? token_types[i] : TQR_BPE_NORMAL);
		if (n)
			memcpy(s, tokens[i], n);
		b->raw_off[i + 1] = b->raw_off[i] + (uint32_t)n;
		b->dec_off[i + 1] = b->dec_off[i];
		if (b->type[i] == TQR_BPE_NORMAL || b->type[i] == TQR_BPE_BYTE) {
			long d = byte_level_decode(s, n, b->dec + b->dec_off[i], cp_byte);
			if (d < 0) {
				rc = tqr_fail(err, -EINVAL, "BPE vocabulary: token %d (\"%.*s\") is not byte-level text "
					      "(a character outside GPT-2's byte-to-unicode map)", i, (int)(n > 64 ? 64 : n), s);
				goto fail;
			}
			b->dec_off[i + 1] += (uint32_t)d;
		} else if (b->type[i] != TQR_BPE_UNUSED) {
			memcpy(b->dec + b->dec_off[i], s, n);
			b->dec_off[i + 1] += (uint32_t)n;
		}
		for (h = (uint32_t)hash_bytes(s, n) & b->tok_mask; b->tok_hash[h] >= 0; h = (h + 1) & b->tok_mask) {
			int32_t j = b->tok_hash[h];
			if (b->raw_off[j + 1] - b->raw_off[j] == n && !memcmp(b->raw + b->raw_off[j], s, n)) {
				rc = tqr_fail(err, -EINVAL, "BPE vocabulary: token %d (\"%.*s\") repeats token %d", i,
					      (int)(n > 64 ? 64 : n), s, (int)j);
				goto fail;
			}
		}
		b->tok_hash[h] = i;
		if (n && (b->type[i] == TQR_BPE_CONTROL || b->type[i] == TQR_BPE_UNKNOWN ||
			  b->type[i] == TQR_BPE_USER)) {
			b->special[b->n_special++] = i;
			b->special_first[(unsigned char)s[0]] = 1;
		}
	}
	if (b->n_special) {
		if (!(keys = malloc(sizeof(*keys) * (size_t)b->n_special)))
			goto fail_nomem;
		for (int k = 0; k < b->n_special; k++) {
			int32_t id = b->special[k];
			keys[k] = (struct special_key){ b->raw_off[id + 1] - b->raw_off[id], id };
		}
		qsort(keys, (size_t)b->n_special, sizeof(*keys), special_cmp);
		for (int k = 0; k < b->n_special; k++)
			b->special[k] = keys[k].id;
	}
	for (int c = 0; c < 256; c++) {
		char u[4];
		int32_t id = tqr_bpe_lookup(b, u, utf8_put(u, byte_char(c)));
		b->byte_tok[c] = id >= 0 && (b->type[id] == TQR_BPE_NORMAL || b->type[id] == TQR_BPE_BYTE) ? id : -1;
	}

	/* merges: "left right" -> (left id, right id) -> result id */
	for (int i = 0; i < n_merges; i++) {
		const char *m = merges[i];
		size_t n = merge_lens[i];
		const char *sp = n > 1 && m ? memchr(m + 1, ' ', n - 1) : NULL;
		int32_t l, r, res;
		size_t ln, rn;
		uint32_t h;

		if (!sp) {
			rc = tqr_fail(err, -EINVAL, "BPE merge %d (\"%.*s\") is not \"left right\"", i,
				      (int)(n > 64 ? 64 : n), m ? m : "");
			goto fail;
		}
		ln = (size_t)(sp - m);
		rn = n - ln - 1;
		l = tqr_bpe_lookup(b, m, ln);
		r = tqr_bpe_lookup(b, sp + 1, rn);
		res = -1;
		if (l >= 0 && r >= 0 && ln + rn <= 2 * TQR_BPE_TOKEN_LEN_MAX) {
			memcpy(cat, m, ln);
			memcpy(cat + ln, sp + 1, rn);
			res = tqr_bpe_lookup(b, cat, ln + rn);
		}
		if (l < 0 || r < 0 || res < 0) {
			rc = tqr_fail(err, -EINVAL, "BPE merge %d (\"%.*s\"): %s is not in the vocabulary", i,
				      (int)(n > 64 ? 64 : n), m,
				      l < 0 ? "its left part" : r < 0 ? "its right part" : "the merged token");
			goto fail;
		}
		for (h = hash_pair(l, r) & b->merge_mask; b->merge[h].rank >= 0; h = (h + 1) & b->merge_mask) {
			if (b->merge[h].left == l && b->merge[h].right == r) {
				rc = tqr_fail(err, -EINVAL, "BPE merge %d (\"%.*s\") repeats merge %d", i,
					      (int)(n > 64 ? 64 : n), m, (int)b->merge[h].rank);
				goto fail;
			}
		}
		b->merge[h] = (struct merge_slot){ l, r, i, res };
	}
	free(keys);
	free(cat);
	*out = b;
	return 0;

fail_nomem:
	rc = tqr_fail(err, -ENOMEM, "BPE vocabulary: out of memory for %d tokens", n_tokens);
fail:
	free(keys);
	free(cat);
	tqr_bpe_free(b);
	return rc;
}

int tqr_bpe_n_tokens(const tqr_bpe *b)
{
	return b->n;
}

const char *tqr_bpe_token(const tqr_bpe *b, int32_t id, size_t *n)
{
	if (id < 0 || id >= b->n) {
		*n = 0;
		return NULL;
	}
	*n = b->raw_off[id + 1] - b->raw_off[id];
	return b->raw + b->raw_off[id];
}

int tqr_bpe_type(const tqr_bpe *b, int32_t id)
{
	return id >= 0 && id < b->n ? b->type[id] : -EINVAL;
}

int tqr_bpe_decode(const tqr_bpe *b, int32_t id, int special, const char **piece, size_t *n)
{
	if (id < 0 || id >= b->n)
		return -EINVAL;
	*piece = b->dec + b->dec_off[id];
	*n = b->dec_off[id + 1] - b->dec_off[id];
	if (!special && (b->type[id] == TQR_BPE_CONTROL || b->type[id] == TQR_BPE_UNKNOWN))
		*n = 0;
	return 0;
}

/* ---- encoding ------------------------------------------------------------
 * Scratch for one encode call.  cp_off/cp_cls describe the code points of
 * the whole text; sym and heap serve one pre-token at a time and grow to
 * the longest. */
struct enc {
	const tqr_bpe *b;
	const unsigned char *text;
	uint32_t *cp_off;  /* [n_cp + 1] byte offset of each code point */
	uint8_t *cp_cls;   /* [n_cp] BPE_* class                        */
	struct sym {
		int32_t id;
		int32_t prev, next; /* -1 at the ends */
	} *sym;
	struct cand {
		int32_t rank;
		int32_t left, right;  /* symbol indices */
		int32_t lid, rid;     /* their ids when pushed */
		int32_t result;
	} *heap;
	size_t sym_cap, heap_n;
	int32_t *ids;
	size_t n_ids, cap;
	int overflow, nomem;
};

static void emit(struct enc *e, int32_t id)
{
	if (e->n_ids < e->cap)
		e->ids[e->n_ids] = id;
	else
		e->overflow = 1;
	e->n_ids++;
}

/* Heap order: the lowest rank first, then the leftmost pair (HF's Word::merge_all). */
static int cand_before(const struct cand *a, const struct cand *b)
{
	if (a->rank != b->rank)
		return a->rank < b->rank;
	return a->left < b->left;
}

static void heap_push(struct enc *e, struct cand c)
{
	size_t i = e->heap_n++;

	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!cand_before(&c, &e->heap[p]))
			break;
		e->heap[i] = e->heap[p];
		i = p;
	}
	e->heap[i] = c;
}

static struct cand heap_pop(struct enc *e)
{
	struct cand top = e->heap[0], last = e->heap[--e->heap_n];
	size_t i = 0, n = e->heap_n;

	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		const struct cand *best = &last;
		if (l < n && cand_before(&e->heap[l], best)) {
			m = l;
			best = &e->heap[l];
		}
		if (r < n && cand_before(&e->heap[r], best))
			m = r;
		if (m == i)
			break;
		e->heap[i] = e->heap[m];
		i = m;
	}
	if (n)
		e->heap[i] = last;
	return top;
}

static void try_pair(struct enc *e, int32_t l, int32_t r)
{
	const struct merge_slot *m;

	if (l < 0 || r < 0)
		return;
	m = merge_find(e->b, e->sym[l].id, e->sym[r].id);
	if (m)
		heap_push(e, (struct cand){ m->rank, l, r, e->sym[l].id, e->sym[r].id, m->result });
}

/* BPE over the bytes of one pre-token, text[from..to). */
static void bpe_piece(struct enc *e, size_t from, size_t to)
{
	const tqr_bpe *b = e->b;
	size_t n = 0, len = to - from;

	if (len > e->sym_cap) {
		size_t cap = len < 64 ? 64 : len;
		struct sym *s = realloc(e->sym, sizeof(*s) * cap);
		struct cand *h = s ? realloc(e->heap, sizeof(*h) * (3 * cap + 1)) : NULL;
		if (s)
			e->sym = s;
		if (!h) {
			e->nomem = 1;
			return;
		}
		e->heap = h;
		e->sym_cap = cap;
	}
	/* one symbol per byte; a byte without a token is dropped (HF without
	 * unk_token), its neighbours become adjacent */
	for (size_t i = from; i < to; i++) {
		int32_t id = b->byte_tok[e->text[i]];
		if (id >= 0)
			e->sym[n++].id = id;
	}
	if (n == 1) {
		emit(e, e->sym[0].id);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		e->sym[i].prev = (int32_t)i - 1;
		e->sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
	}
	/* n - 1 initial pairs, then at most 2 pushes per merge (< n merges) */
	e->heap_n = 0;
	for (size_t i = 0; i + 1 < n; i++)
		try_pair(e, (int32_t)i, (int32_t)i + 1);
	while (e->heap_n) {
		struct cand c = heap_pop(e);
		struct sym *l = &e->sym[c.left], *r = &e->sym[c.right];
		/* stale: a side was merged away or changed since the push */
		if (l->id != c.lid || l->next != c.right || r->id != c.rid)
			continue;
		l->id = c.result;
		l->next = r->next;
		if (r->next >= 0)
			e->sym[r->next].prev = c.left;
		r->id = -1;
		r->next = -1;
		try_pair(e, l->prev, c.left);
		try_pair(e, c.left, l->next);
	}
	for (int32_t k = n ? 0 : -1; k >= 0; k = e->sym[k].next)
		emit(e, e->sym[k].id);
}

/* The code point i as an ASCII byte, or 0. */
static int cp_ascii(const struct enc *e, size_t i)
{
	unsigned char c = e->text[e->cp_off[i]];

	return e->cp_off[i + 1] - e->cp_off[i] == 1 && c < 0x80 ? c : 0;
}

/* GPT-2's regex over code points [s, end) (the end of the string to the
 * regex); each match goes to BPE.  At code point i, the first alternative
 * that matches wins:
 *   's 't 're 've 'm 'll 'd         (case-sensitive, ASCII)
 *   ' '? letters+ | ' '? numbers+ | ' '? others+
 *   spaces+ that end the string, or all but the last of a run of >= 2
 *   (the last one joins what follows: \s+(?!\S)), else one space (\s+). */
static void gpt2_split(struct enc *e, size_t s, size_t end)
{
	size_t i = s;

	while (i < end) {
		size_t j = i + 1;
		int c = e->cp_cls[i];

		if (cp_ascii(e, i) == '\'' && i + 1 < end) {
			int c1 = cp_ascii(e, i + 1), c2 = i + 2 < end ? cp_ascii(e, i + 2) : 0;
			if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
				j = i + 2;
			else if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
				j = i + 3;
			if (j > i + 1)
				goto match;
		}
		if (cp_ascii(e, i) == ' ' && i + 1 < end && e->cp_cls[i + 1] != BPE_SPACE) {
			c = e->cp_cls[i + 1];
			j = i + 2;
		}
		if (c != BPE_SPACE) {
			while (j < end && e->cp_cls[j] == c)
				j++;
		} else {
			while (j < end && e->cp_cls[j] == BPE_SPACE)
				j++;
			if (j < end && j - i >= 2)
				j--;
		}
match:
		bpe_piece(e, e->cp_off[i], e->cp_off[j]);
		i = j;
	}
}

/* Pre-tokenizes and encodes text[from..to), a stretch without special tokens. */
static void encode_stretch(struct enc *e, size_t from, size_t to)
{
	size_t n = 0, i = from, k;

	while (i < to) {
		int32_t cp = utf8_next(e->text + i, to - i, &k);
		e->cp_off[n] = (uint32_t)i;
		e->cp_cls[n++] = (uint8_t)cp_class(cp);
		i += k;
	}
	e->cp_off[n] = (uint32_t)to;
	if (e->b->pre == PRE_SMOLLM) {
		/* Digits(individual_digits): each number code point is a
		 * piece, the regex runs between them */
		size_t s = 0;
		for (i = 0; i < n; i++) {
			if (e->cp_cls[i] != BPE_NUMBER)
				continue;
			gpt2_split(e, s, i);
			bpe_piece(e, e->cp_off[i], e->cp_off[i + 1]);
			s = i + 1;
		}
		gpt2_split(e, s, n);
	} else {
		gpt2_split(e, 0, n);
	}
}

/* The special token at text[i..len) (the longest), or -1. */
static int32_t special_at(const tqr_bpe *b, const unsigned char *text, size_t i, size_t len,
			  int parse_special)
{
	if (!b->special_first[text[i]])
		return -1;
	for (int k = 0; k < b->n_special; k++) {
		int32_t id = b->special[k];
		uint32_t n = b->raw_off[id + 1] - b->raw_off[id];
		if (!parse_special && b->type[id] != TQR_BPE_USER)
			continue;
		if (n <= len - i && !memcmp(text + i, b->raw + b->raw_off[id], n))
			return id;
	}
	return -1;
}

long tqr_bpe_encode(const tqr_bpe *b, const char *text, size_t len, int parse_special,
		    int32_t *ids, size_t cap, tqr_error *err)
{
	struct enc e = { .b = b, .text = (const unsigned char *)text, .ids = ids, .cap = cap };
	size_t from = 0;
	long rc;

	if (len > UINT32_MAX - 1)
		return tqr_fail(err, -EINVAL, "BPE encode: %zu bytes is more than the 4 GiB we take", len);
	e.cp_off = malloc(sizeof(uint32_t) * (len + 1));
	e.cp_cls = malloc(len + 1);
	if (!e.cp_off || !e.cp_cls) {
		e.nomem = 1;
		goto out;
	}
	for (size_t i = 0; i < len && !e.nomem; i++) {
		int32_t id = b->n_special ? special_at(b, e.text, i, len, parse_special) : -1;
		if (id < 0)
			continue;
		encode_stretch(&e, from, i);
		emit(&e, id);
		from = i + (b->raw_off[id + 1] - b->raw_off[id]);
		i = from - 1;
	}
	if (!e.nomem)
		encode_stretch(&e, from, len);
out:
	if (e.nomem)
		rc = tqr_fail(err, -ENOMEM, "BPE encode: out of memory for %zu bytes", len);
	else if (e.overflow)
		rc = tqr_fail(err, -ENOBUFS, "BPE encode: %zu ids do not fit in %zu", e.n_ids, cap);
	else
		rc = (long)e.n_ids;
	free(e.cp_off);
	free(e.cp_cls);
	free(e.sym);
	free(e.heap);
	return rc;
}
