/* tok_gguf.c — a GGUF model's tokenizer from its metadata (tokenizer.h):
 *   "gpt2"   a byte-level BPE (bpe.h) with the file's tokens, token types,
 *            merges and pre-tokenizer name, and its BOS / EOS ids and
 *            add_bos_token (default false);
 *   "llama"  a sentencepiece-style vocabulary (tqr_tok_new_spm) with the
 *            file's tokens (spaces spelled U+2581), scores (f32) and token
 *            types, required all three; bos / eos / unknown_token_id
 *            (defaults 1 / 2 / 0, llama.cpp's, when in range),
 *            add_bos_token and add_space_prefix (both default true).
 * The metadata is untrusted like the rest of the file: gguf.c checked the
 * arrays' bounds, bpe.c and tokenizer.c check their contents; here every
 * count must be the model's vocabulary size, every id inside it, and every
 * type the one the key is defined with.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "gguf.h"
#include "tokenizer.h"

/* The strings of array `key` (count must be n when n >= 0): pointers into
 * the mapping and their lengths, malloc'ed. */
static int str_array(const tqr_gguf *g, const char *key, long n, const char ***s, size_t **len,
		     long *count, tqr_error *err)
{
	struct tqr_gguf_arr a;
	uint64_t cur = 0;
	int rc = tqr_gguf_get_arr(g, key, &a, err);

	if (rc < 0)
		return rc;
	if (a.type != TQR_GGUF_STRING)
		return tqr_fail(err, -EINVAL, "%s: an array of %s, not of strings", key, tqr_gguf_type_name(a.type));
	if (a.count > (uint64_t)INT32_MAX || (n >= 0 && a.count != (uint64_t)n))
		return tqr_fail(err, -EINVAL, "%s: %llu entries%s", key, (unsigned long long)a.count,
				n >= 0 ? ", not the model's vocabulary size" : ", too many");
	*s = calloc(a.count ? a.count : 1, sizeof(**s));
	*len = calloc(a.count ? a.count : 1, sizeof(**len));
	if (!*s || !*len)
		return tqr_fail(err, -ENOMEM, "out of memory");
	for (uint64_t i = 0; i < a.count; i++)
		if (tqr_gguf_arr_str_next(&a, &cur, &(*s)[i], &(*len)[i]) < 0)
			return tqr_fail(err, -EINVAL, "%s: entry %llu unreadable", key, (unsigned long long)i);
	*count = (long)a.count;
	return 0;
}

/* tokenizer.ggml.token_type: n integers, malloc'ed into *type. */
static int token_types(const tqr_gguf *g, long n, int32_t **type, tqr_error *err)
{
	struct tqr_gguf_arr ta;
	int rc;

	*type = NULL;
	if ((rc = tqr_gguf_get_arr(g, "tokenizer.ggml.token_type", &ta, err)) < 0)
		return rc;
	if (ta.type == TQR_GGUF_STRING || ta.count != (uint64_t)n)
		return tqr_fail(err, -EINVAL, "tokenizer.ggml.token_type: %llu %s entries for %ld tokens",
				(unsigned long long)ta.count, tqr_gguf_type_name(ta.type), n);
	if (!(*type = malloc(sizeof(**type) * (size_t)(n ? n : 1))))
		return tqr_fail(err, -ENOMEM, "out of memory");
	for (long i = 0; i < n; i++) {
		int64_t v;
		if (tqr_gguf_arr_i64(&ta, (uint64_t)i, &v) < 0 || v < INT32_MIN || v > INT32_MAX)
			return tqr_fail(err, -EINVAL, "tokenizer.ggml.token_type: entry %ld unreadable", i);
		(*type)[i] = (int32_t)v;
	}
	return 0;
}

int tqr_bpe_from_gguf(struct tqr_bpe **out, const struct tqr_gguf *g, int vocab_size, tqr_error *err)
{
	const char **tok = NULL, **merge = NULL, *model, *pre = "gpt2";
	size_t *tok_len = NULL, *merge_len = NULL, n_model, n_pre = 4;
	int32_t *type = NULL;
	long n_tok = 0, n_merge = 0;
	char pre_name[64];
	int rc;

	*out = NULL;
	if ((rc = tqr_gguf_get_str(g, "tokenizer.ggml.model", &model, &n_model, err)) < 0)
		return rc;
	if (n_model != 4 || memcmp(model, "gpt2", 4))
		return tqr_fail(err, -EINVAL, "tokenizer.ggml.model \"%.*s\" is not byte-level BPE (\"gpt2\")",
				(int)(n_model < 64 ? n_model : 64), model);
	if (tqr_gguf_find(g, "tokenizer.ggml.pre") >= 0 &&
	    (rc = tqr_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &n_pre, err)) < 0)
		return rc;
	if (n_pre >= sizeof(pre_name))
		return tqr_fail(err, -EINVAL, "tokenizer.ggml.pre: %zu bytes, too long for a pre-tokenizer name",
				n_pre);
	memcpy(pre_name, pre, n_pre);
	pre_name[n_pre] = 0;

	if ((rc = str_array(g, "tokenizer.ggml.tokens", vocab_size, &tok, &tok_len, &n_tok, err)) < 0 ||
	    (rc = str_array(g, "tokenizer.ggml.merges", -1, &merge, &merge_len, &n_merge, err)) < 0)
		goto out;
	if (tqr_gguf_find(g, "tokenizer.ggml.token_type") >= 0 &&
	    (rc = token_types(g, n_tok, &type, err)) < 0)
		goto out;
	rc = tqr_bpe_new(out, tok, tok_len, type, (int)n_tok, merge, merge_len, (int)n_merge, pre_name, err);
out:
	free(tok);
	free(tok_len);
	free(merge);
	free(merge_len);
	free(type);
	return rc;
}

/* An optional token id: absent -> def (-1 when def is not in [0, n));
 * present -> in [0, n). */
static int opt_id(const tqr_gguf *g, const char *key, int n, int def, int *id, tqr_error *err)
{
	uint32_t v;
	int rc;

	*id = def >= 0 && def < n ? def : -1;
	if (tqr_gguf_find(g, key) < 0)
		return 0;
	if ((rc = tqr_gguf_get_u32(g, key, &v, err)) < 0)
		return rc;
	if (v >= (uint32_t)n)
		return tqr_fail(err, -EINVAL, "%s: token %u is not in the vocabulary of %d", key, v, n);
	*id = (int)v;
	return 0;
}

/* An optional bool: absent -> def. */
static int opt_bool(const tqr_gguf *g, const char *key, int def, int *v, tqr_error *err)
{
	*v = def;
	if (tqr_gguf_find(g, key) < 0)
		return 0;
	return tqr_gguf_get_bool(g, key, v, err);
}

/* tokenizer.ggml.model "llama": tokens, scores and types, each exactly
 * vocab_size entries. */
static int spm_from_gguf(tqr_tok **out, const tqr_gguf *g, int vocab_size, tqr_error *err)
{
	const char **tok = NULL;
	size_t *tok_len = NULL;
	int32_t *type = NULL;
	float *score = NULL;
	long n_tok = 0;
	struct tqr_gguf_arr sa;
	struct tqr_spm_spec spec;
	int rc;

	if ((rc = str_array(g, "tokenizer.ggml.tokens", vocab_size, &tok, &tok_len, &n_tok, err)) < 0)
		goto out;
	if ((rc = tqr_gguf_get_arr(g, "tokenizer.ggml.scores", &sa, err)) < 0)
		goto out;
	if (sa.type != TQR_GGUF_F32 || sa.count != (uint64_t)n_tok) {
		rc = tqr_fail(err, -EINVAL, "tokenizer.ggml.scores: %llu %s entries, not %ld f32 ones",
			      (unsigned long long)sa.count, tqr_gguf_type_name(sa.type), n_tok);
		goto out;
	}
	if (!(score = malloc(sizeof(*score) * (size_t)(n_tok ? n_tok : 1)))) {
		rc = tqr_fail(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (long i = 0; i < n_tok; i++) {
		double d;
		if (tqr_gguf_arr_f64(&sa, (uint64_t)i, &d) < 0 || !isfinite(d)) {
			rc = tqr_fail(err, -EINVAL, "tokenizer.ggml.scores: entry %ld is not a finite number", i);
			goto out;
		}
		score[i] = (float)d;
	}
	if ((rc = tqr_gguf_find(g, "tokenizer.ggml.token_type")) < 0) {
		rc = tqr_fail(err, -EINVAL, "tokenizer.ggml.token_type is missing (a \"llama\" vocabulary "
			      "needs it for its byte and control tokens)");
		goto out;
	}
	if ((rc = token_types(g, n_tok, &type, err)) < 0 ||
	    (rc = opt_id(g, "tokenizer.ggml.bos_token_id", vocab_size, 1, &spec.bos_id, err)) < 0 ||
	    (rc = opt_id(g, "tokenizer.ggml.eos_token_id", vocab_size, 2, &spec.eos_id, err)) < 0 ||
	    (rc = opt_id(g, "tokenizer.ggml.unknown_token_id", vocab_size, 0, &spec.unk_id, err)) < 0 ||
	    (rc = opt_bool(g, "tokenizer.ggml.add_bos_token", 1, &spec.add_bos, err)) < 0 ||
	    (rc = opt_bool(g, "tokenizer.ggml.add_space_prefix", 1, &spec.add_space_prefix, err)) < 0)
		goto out;
	rc = tqr_tok_new_spm(out, tok, tok_len, score, type, (int)n_tok, &spec, err);
out:
	free(tok);
	free(tok_len);
	free(score);
	free(type);
	return rc;
}

int tqr_tok_from_gguf_meta(tqr_tok **out, const tqr_gguf *g, int vocab_size, tqr_error *err)
{
	tqr_bpe *b = NULL;
	const char *model;
	size_t n_model;
	int bos, eos, add_bos, rc;

	*out = NULL;
	if ((rc = tqr_gguf_get_str(g, "tokenizer.ggml.model", &model, &n_model, err)) < 0)
		return rc;
	if (n_model == 5 && !memcmp(model, "llama", 5))
		return spm_from_gguf(out, g, vocab_size, err);
	if (n_model != 4 || memcmp(model, "gpt2", 4))
		return tqr_fail(err, -EINVAL, "tokenizer.ggml.model \"%.*s\" is not supported (\"gpt2\" and "
				"\"llama\" are)", (int)(n_model < 64 ? n_model : 64), model);
	if ((rc = tqr_bpe_from_gguf(&b, g, vocab_size, err)) < 0 ||
	    (rc = opt_id(g, "tokenizer.ggml.bos_token_id", vocab_size, -1, &bos, err)) < 0 ||
	    (rc = opt_id(g, "tokenizer.ggml.eos_token_id", vocab_size, -1, &eos, err)) < 0 ||
	    (rc = opt_bool(g, "tokenizer.ggml.add_bos_token", 0, &add_bos, err)) < 0)
		goto fail;
	if (add_bos && bos < 0) {
		rc = tqr_fail(err, -EINVAL, "tokenizer.ggml.add_bos_token without a bos_token_id");
		goto fail;
	}
	return tqr_tok_wrap_bpe(out, b, bos, eos, add_bos, err);
fail:
	tqr_bpe_free(b);
	return rc;
}

int tqr_tok_from_gguf(tqr_tok **out, const char *path, int vocab_size, tqr_error *err)
{
	tqr_gguf *g = NULL;
	int rc;

	*out = NULL;
	if ((rc = tqr_gguf_open(&g, path, err)) < 0)
		return rc;
	if ((rc = tqr_tok_from_gguf_meta(out, g, vocab_size, err)) < 0 && err) {
		char m[sizeof(err->msg)];
		snprintf(m, sizeof(m), "%s", err->msg);
		tqr_fail(err, rc, "%s: %s", path, m);
	}
	tqr_gguf_free(g);
	return rc;
}
