/* tokenizer.c — sentencepiece-style vocabularies: llama2.c's tokenizer.bin
 * and GGUF "llama" metadata (tok_gguf.c) share one constructor
 * (tok_new) and one encoder (encode_spm); GGUF "gpt2" vocabularies are
 * handed to bpe.c. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

#include "bpe.h"

#define SPACE_MARK "\xe2\x96\x81" /* U+2581, sentencepiece's space */

struct tok_entry {
	const char *s;      /* into tqr_tok.strings (or .pieces) */
	uint32_t n;
	int id;
};

struct tqr_tok {
	tqr_bpe *bpe;             /* GGUF gpt2 vocabularies: all calls go there */
	int spm;                  /* GGUF llama: sentencepiece rules (tokenizer.h) */
	int bos_id, eos_id, unk_id, add_bos, add_space;
	int vocab_size;
	int max_len;              /* the longest token's bytes                 */
	float *score;             /* [vocab_size]                              */
	uint8_t *type;            /* [vocab_size] enum tqr_bpe_type; NULL: llama2.c */
	struct tok_entry *by_id;  /* [vocab_size]                              */
	struct tok_entry *sorted; /* [vocab_size] by bytes, then id            */
	struct tok_entry *piece;  /* [vocab_size] spm: decoded bytes, NULL else */
	char *strings;            /* every token's bytes, NUL after each       */
	char *pieces;             /* spm: every decoded piece                  */
	int byte_id[256];         /* the "<0xXX>" token of each byte, or -1     */
	unsigned char bytes[256]; /* byte b's decoded piece is bytes + b       */
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

/* The first index of t->sorted whose string is >= s[0..n). */
static size_t lower_bound(const tqr_tok *t, const char *s, uint32_t n)
{
	size_t lo = 0, hi = (size_t)t->vocab_size;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (key_cmp(s, n, &t->sorted[mid]) > 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int tqr_tok_lookup(const tqr_tok *t, const char *s, size_t n)
{
	size_t i;

	if (t->bpe)
		return tqr_bpe_lookup(t->bpe, s, n);
	if (n > UINT32_MAX)
		return -1;
	i = lower_bound(t, s, (uint32_t)n);
	if (i < (size_t)t->vocab_size && key_cmp(s, (uint32_t)n, &t->sorted[i]) == 0)
		return t->sorted[i].id; /* the smallest id among equal strings */
	return -1;
}

/* Whether text may become token id: llama2.c matches any token; a GGUF
 * vocabulary only normal and user-defined ones (sentencepiece's pieces_). */
static int matchable(const tqr_tok *t, int id)
{
	return !t->type || t->type[id] == TQR_BPE_NORMAL || t->type[id] == TQR_BPE_USER;
}

/* The matchable token spelled s[0..n), or -1. */
static int piece_lookup(const tqr_tok *t, const char *s, size_t n)
{
	if (n > (size_t)t->max_len)
		return -1;
	for (size_t i = lower_bound(t, s, (uint32_t)n);
	     i < (size_t)t->vocab_size && key_cmp(s, (uint32_t)n, &t->sorted[i]) == 0; i++)
		if (matchable(t, t->sorted[i].id))
			return t->sorted[i].id;
	return -1;
}

static uint32_t rd_u32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int is_byte_token(const char *s, size_t n, int *byte)
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
	free(t->type);
	free(t->by_id);
	free(t->sorted);
	free(t->piece);
	free(t->strings);
	free(t->pieces);
	free(t);
}

/* Each GGUF type's validity for tqr_tok_new_spm. */
static int spm_type_ok(int32_t ty)
{
	return ty >= TQR_BPE_NORMAL && ty <= TQR_BPE_BYTE;
}

/* The one constructor.  types == NULL: a llama2.c tokenizer.bin (its
 * strings and scores already checked by the loader; duplicates allowed,
 * ids 1 / 2 are BOS / EOS).  Otherwise a sentencepiece vocabulary from
 * GGUF metadata: every entry is checked here.  `what` names the source in
 * messages. */
static int tok_new(tqr_tok **out, const char *const *tokens, const size_t *lens, const float *scores,
		   const int32_t *types, int n, const struct tqr_spm_spec *spec, const char *what,
		   tqr_error *err)
{
	size_t str_bytes = 0;
	tqr_tok *t = NULL;
	char *sp, *pp;
	int rc;

	*out = NULL;
	for (int i = 0; i < n; i++) {
		int b;
		if (lens[i] > TQR_TOK_LEN_MAX)
			return tqr_fail(err, -EINVAL, "%s: token %d is %zu bytes long, more than %d", what, i,
					lens[i], TQR_TOK_LEN_MAX);
		if (!isfinite(scores[i]))
			return tqr_fail(err, -EINVAL, "%s: token %d has a non-finite score", what, i);
		if (types && !spm_type_ok(types[i]))
			return tqr_fail(err, -EINVAL, "%s: token %d has type %d (valid: 1..6)", what, i,
					(int)types[i]);
		if (types && types[i] == TQR_BPE_BYTE && !is_byte_token(tokens[i], lens[i], &b))
			return tqr_fail(err, -EINVAL, "%s: token %d is a byte token not spelled <0xXX>", what, i);
		str_bytes += lens[i] + 1;
	}
	if (!(t = calloc(1, sizeof(*t))))
		goto fail_nomem;
	t->vocab_size = n;
	t->spm = types != NULL;
	if (spec) {
		t->bos_id = spec->bos_id;
		t->eos_id = spec->eos_id;
		t->unk_id = spec->unk_id;
		t->add_bos = spec->add_bos;
		t->add_space = spec->add_space_prefix;
	} else {
		t->bos_id = TQR_TOK_BOS;
		t->eos_id = TQR_TOK_EOS;
		t->unk_id = TQR_TOK_UNK;
		t->add_bos = 1;
		t->add_space = 1;
	}
	t->score = malloc(sizeof(float) * (size_t)n);
	t->by_id = malloc(sizeof(*t->by_id) * (size_t)n);
	t->sorted = malloc(sizeof(*t->sorted) * (size_t)n);
	t->strings = malloc(str_bytes ? str_bytes : 1);
	if (!t->score || !t->by_id || !t->sorted || !t->strings)
		goto fail_nomem;
	if (types) {
		t->type = malloc((size_t)n);
		t->piece = malloc(sizeof(*t->piece) * (size_t)n);
		t->pieces = malloc(str_bytes ? str_bytes : 1);
		if (!t->type || !t->piece || !t->pieces)
			goto fail_nomem;
	}
	for (int i = 0; i < 256; i++) {
		t->byte_id[i] = -1;
		t->bytes[i] = (unsigned char)i;
	}
	sp = t->strings;
	pp = t->pieces;
	for (int i = 0; i < n; i++) {
		uint32_t len = (uint32_t)lens[i];
		int b;

		t->score[i] = scores[i];
		memcpy(sp, tokens[i], len);
		sp[len] = 0;
		t->by_id[i] = (struct tok_entry){ sp, len, i };
		if (len > (uint32_t)t->max_len)
			t->max_len = (int)len;
		/* llama2.c: any "<0xXX>"; GGUF: the byte-typed ones */
		if ((!types || types[i] == TQR_BPE_BYTE) && is_byte_token(sp, len, &b) && t->byte_id[b] < 0)
			t->byte_id[b] = i;
		if (types) {
			/* the decoded piece: U+2581 -> ' ' for text tokens, the
			 * byte for byte tokens, nothing for the others
			 * (llama.cpp's token_to_piece without `special`) */
			uint32_t k = 0;
			t->type[i] = (uint8_t)types[i];
			if (types[i] == TQR_BPE_BYTE) {
				pp[k++] = (char)b;
			} else if (types[i] == TQR_BPE_NORMAL || types[i] == TQR_BPE_USER) {
				for (uint32_t j = 0; j < len; j++) {
					if (j + 3 <= len && !memcmp(sp + j, SPACE_MARK, 3)) {
						pp[k++] = ' ';
						j += 2;
					} else {
						pp[k++] = sp[j];
					}
				}
			}
			pp[k] = 0;
			t->piece[i] = (struct tok_entry){ pp, k, i };
			pp += k + 1;
		}
		sp += len + 1;
	}
	memcpy(t->sorted, t->by_id, sizeof(*t->sorted) * (size_t)n);
	qsort(t->sorted, (size_t)n, sizeof(*t->sorted), entry_cmp);
	if (types) {
		/* two matchable tokens (or two byte tokens) with one spelling:
		 * which id the text means would be arbitrary */
		for (int i = 1; i < n; i++) {
			const struct tok_entry *a = &t->sorted[i - 1], *c = &t->sorted[i];
			int ma = matchable(t, a->id) || t->type[a->id] == TQR_BPE_BYTE;
			int mc = matchable(t, c->id) || t->type[c->id] == TQR_BPE_BYTE;
			if (ma && mc && a->n == c->n && !memcmp(a->s, c->s, a->n)) {
				rc = tqr_fail(err, -EINVAL, "%s: token %d repeats token %d", what, c->id, a->id);
				goto fail;
			}
		}
		/* every escaped space needs it: without it one input byte could
		 * become three byte tokens (and break encode's len + 3 bound) */
		if (piece_lookup(t, SPACE_MARK, 3) < 0) {
			rc = tqr_fail(err, -EINVAL, "%s: no normal token \"" SPACE_MARK "\" (U+2581, the space)", what);
			goto fail;
		}
	}
	*out = t;
	return 0;

fail_nomem:
	rc = tqr_fail(err, -ENOMEM, "%s: out of memory", what);
fail:
	tqr_tok_free(t);
	return rc;
}

int tqr_tok_new_spm(tqr_tok **out, const char *const *tokens, const size_t *lens, const float *scores,
		    const int32_t *types, int n, const struct tqr_spm_spec *spec, tqr_error *err)
{
	*out = NULL;
	if (n < 1 || n > TQR_BPE_TOKENS_MAX)
		return tqr_fail(err, -EINVAL, "a vocabulary of %d tokens (valid: 1..%d)", n, TQR_BPE_TOKENS_MAX);
	if (!types)
		return tqr_fail(err, -EINVAL, "a sentencepiece vocabulary needs token types");
	if (spec->bos_id < -1 || spec->bos_id >= n || spec->eos_id < -1 || spec->eos_id >= n ||
	    spec->unk_id < -1 || spec->unk_id >= n)
		return tqr_fail(err, -EINVAL, "BOS %d, EOS %d or unknown %d is not a token id in [0, %d)",
				spec->bos_id, spec->eos_id, spec->unk_id, n);
	if (spec->add_bos && spec->bos_id < 0)
		return tqr_fail(err, -EINVAL, "add_bos_token without a BOS token");
	return tok_new(out, tokens, lens, scores, types, n, spec, "tokenizer.ggml", err);
}

int tqr_tok_load(tqr_tok **out, const char *path, int vocab_size, tqr_error *err)
{
	unsigned char *buf = NULL;
	const char **tok = NULL;
	size_t len, off, *tlen = NULL;
	float *score = NULL;
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
		float sc;
		int32_t n;

		if (len - off < 8) {
			rc = tqr_fail(err, -EINVAL, "%s: truncated at byte %zu: token %ld's header needs 8 bytes",
				      path, off, count);
			goto fail;
		}
		memcpy(&sc, buf + off, 4);
		n = (int32_t)rd_u32(buf + off + 4);
		if (!isfinite(sc)) {
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
	}
	if (count != vocab_size) {
		rc = tqr_fail(err, -EINVAL, "%s: tokenizer mismatch: the file holds %ld tokens, the model's vocabulary has %d",
			      path, count, vocab_size);
		goto fail;
	}
	tok = malloc(sizeof(*tok) * (size_t)vocab_size);
	tlen = malloc(sizeof(*tlen) * (size_t)vocab_size);
	score = malloc(sizeof(*score) * (size_t)vocab_size);
	if (!tok || !tlen || !score) {
		rc = tqr_fail(err, -ENOMEM, "%s: out of memory", path);
		goto fail;
	}
	off = 4;
	for (int i = 0; i < vocab_size; i++) {
		memcpy(&score[i], buf + off, 4);
		tlen[i] = rd_u32(buf + off + 4);
		tok[i] = (const char *)buf + off + 8;
		off += 8 + tlen[i];
	}
	rc = tok_new(out, tok, tlen, score, NULL, vocab_size, NULL, path, err);
fail:
	free(tok);
	free(tlen);
	free(score);
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
	t->unk_id = -1;
	t->add_bos = add_bos;
	*out = t;
	return 0;
}

int tqr_tok_bos(const tqr_tok *t)
{
	return t->bos_id;
}

int tqr_tok_eos(const tqr_tok *t)
{
	return t->eos_id;
}

int tqr_tok_adds_bos(const tqr_tok *t)
{
	return t->add_bos;
}

int tqr_tok_is_control(const tqr_tok *t, int id)
{
	if (t->bpe)
		return tqr_bpe_type(t->bpe, id) == TQR_BPE_CONTROL;
	if (t->type)
		return id >= 0 && id < t->vocab_size && t->type[id] == TQR_BPE_CONTROL;
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
	if (t->spm) {
		/* sentencepiece drops the dummy prefix of the first piece of a
		 * text: at the start (prev < 0) or after a control token */
		e = &t->piece[id];
		*piece = e->s;
		*n = e->n;
		if (t->add_space && e->n && e->s[0] == ' ' && t->type[id] == TQR_BPE_NORMAL &&
		    (prev < 0 || tqr_tok_is_control(t, prev))) {
			(*piece)++;
			(*n)--;
		}
		return 0;
	}
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

/* One symbol of the text being merged: the bytes work[start, start + n) and
 * their token (-1: a GGUF vocabulary's unknown code point, resolved after
 * the merges).  A doubly linked list ordered like the text: adjacent
 * symbols are adjacent bytes, so a pair's text is contiguous.  Array order
 * never changes; merges unlink (n = 0: merged away). */
struct sym {
	uint32_t start, n;
	int id;
	int pinned;       /* llama2.c byte fallback: never merges */
	int prev, next;   /* -1 at the ends */
};

/* A merge candidate: symbols `left` (ln bytes) and its successor `right`
 * (rn bytes) merge into `merged`, whose score is `score`. */
struct cand {
	float score;
	int left, right;
	uint32_t ln, rn;
	int merged;
};

/* Heap order: higher score first, then the leftmost pair (llama2.c scans left
 * to right and keeps the first strictly better score; llama.cpp and
 * sentencepiece order their queues the same way). */
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

/* Pushes the merge of symbols l and r when their text is a token. */
static void try_pair(const tqr_tok *t, struct heap *h, const struct sym *s, const char *work, int l, int r)
{
	int id;

	if (l < 0 || r < 0 || s[l].pinned || s[r].pinned)
		return;
	id = piece_lookup(t, work + s[l].start, (size_t)s[l].n + s[r].n);
	if (id < 0)
		return;
	heap_push(h, (struct cand){ t->score[id], l, r, s[l].n, s[r].n, id });
}

/* The bytes of the code point at w[i..len): llama2.c takes a byte and the
 * continuation bytes after it (at most 4 in all); a GGUF vocabulary the
 * continuation bytes its lead byte announces (llama.cpp's unicode_len_utf8
 * on valid UTF-8; a malformed sequence ends at its first byte that is not
 * a continuation byte, where llama.cpp would take that byte along). */
static size_t cp_len(const tqr_tok *t, const unsigned char *w, size_t i, size_t len)
{
	size_t want = 4, k = 1;

	if (t->spm) {
		unsigned char c = w[i];
		want = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 1;
	}
	while (i + k < len && k < want && (w[i + k] & 0xC0) == 0x80)
		k++;
	return k;
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

	struct sym *s = NULL;
	struct heap h = { 0 };
	char *work = NULL;
	size_t n = 0, wlen = 0, plen = 0, i, k;
	long out = 0;
	int rc;

	if (len > (SIZE_MAX - 8) / 3 || len > UINT32_MAX / 4) {
		rc = tqr_fail(err, -E2BIG, "%zu bytes are too many to encode at once", len);
		goto fail;
	}
	/* work: the dummy prefix and the text; a GGUF vocabulary spells
	 * spaces U+2581 (3 bytes).  At most one symbol per byte. */
	work = malloc(3 * len + 4);
	s = malloc(sizeof(*s) * (3 * len + 4));
	if (!work || !s) {
		rc = tqr_fail(err, -ENOMEM, "out of memory encoding %zu bytes", len);
		goto fail;
	}
	if (len && t->add_space) {
		plen = t->spm ? 3 : 1;
		memcpy(work, t->spm ? SPACE_MARK : " ", plen);
		wlen = plen;
	}
	for (i = 0; i < len; i++) {
		if (t->spm && text[i] == ' ') {
			memcpy(work + wlen, SPACE_MARK, 3);
			wlen += 3;
		} else {
			work[wlen++] = text[i];
		}
	}
	/* One symbol per code point (the prefix on its own). */
	for (i = 0; i < wlen; i += k) {
		int id;

		k = i < plen ? plen : cp_len(t, (const unsigned char *)work, i, wlen);
		id = piece_lookup(t, work + i, k);
		if (id >= 0 || t->spm) {
			/* GGUF: an unknown code point may still merge with its
			 * neighbours (sentencepiece, llama.cpp) */
			s[n++] = (struct sym){ (uint32_t)i, (uint32_t)k, id, 0, 0, 0 };
			continue;
		}
		/* llama2.c: its bytes' tokens now, and they never merge */
		for (size_t j = i; j < i + k; j++) {
			unsigned char b = (unsigned char)work[j];
			if (t->byte_id[b] < 0) {
				rc = tqr_fail(err, -EILSEQ, "byte 0x%02X at offset %zu has no <0x%02X> token", b,
					      j >= plen ? j - plen : 0, b);
				goto fail;
			}
			s[n++] = (struct sym){ (uint32_t)j, 1, t->byte_id[b], 1, 0, 0 };
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
		try_pair(t, &h, s, work, (int)i, (int)i + 1);
	while (h.n) {
		struct cand c = heap_pop(&h);
		struct sym *l = &s[c.left], *r = &s[c.right];
		/* stale: a side was merged away or grew since the push (a
		 * symbol's start never moves, so the sizes tell) */
		if (l->n != c.ln || l->next != c.right || r->n != c.rn)
			continue;
		l->id = c.merged;
		l->n += r->n;
		l->next = r->next;
		if (r->next >= 0)
			s[r->next].prev = c.left;
		r->n = 0;
		r->next = -1;
		try_pair(t, &h, s, work, l->prev, c.left);
		try_pair(t, &h, s, work, c.left, l->next);
	}
	if (bos && t->add_bos && t->bos_id >= 0)
		tokens[out++] = t->bos_id;
	for (int j = n ? 0 : -1; j >= 0; j = s[j].next) {
		const unsigned char *w = (const unsigned char *)work + s[j].start;
		size_t m = s[j].n, b;

		if (s[j].id >= 0) {
			tokens[out++] = s[j].id;
			continue;
		}
		/* GGUF: an unknown code point left alone — its bytes' tokens,
		 * or the unknown token when one is missing (sentencepiece) */
		for (b = 0; b < m && t->byte_id[w[b]] >= 0; b++)
			;
		if (b == m) {
			for (b = 0; b < m; b++)
				tokens[out++] = t->byte_id[w[b]];
		} else if (t->unk_id >= 0) {
			tokens[out++] = t->unk_id;
		} else {
			rc = tqr_fail(err, -EILSEQ, "byte 0x%02X has no <0x%02X> token and the vocabulary no "
				      "unknown token", w[b], w[b]);
			goto fail;
		}
	}
	if (eos && t->eos_id >= 0)
		tokens[out++] = t->eos_id;
	free(h.v);
	free(work);
	free(s);
	return out;
fail:
	free(h.v);
	free(work);
	free(s);
	return rc;
}
