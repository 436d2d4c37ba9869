/* tok_gguf.c — a GGUF model's tokenizer from its metadata (tokenizer.h):
 * tokenizer.ggml.model "gpt2" becomes a byte-level BPE (bpe.h) with the
 * file's tokens, token types, merges and pre-tokenizer name, and its BOS /
 * EOS ids and add_bos_token.  The metadata is untrusted like the rest of
 * the file: gguf.c checked the arrays' bounds, bpe.c checks their contents;
 * here every count must fit the model and every type must be the one the
 * key is defined with.
 */
#include <errno.h>
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

int tqr_bpe_from_gguf(struct tqr_bpe **out, const struct tqr_gguf *g, int vocab_size, tqr_error *err)
{
	const char **tok = NULL, **merge = NULL, *model, *pre = "gpt2";
	size_t *tok_len = NULL, *merge_len = NULL, n_model, n_pre = 4;
	int32_t *type = NULL;
	long n_tok = 0, n_merge = 0;
	char pre_name[64];
	struct tqr_gguf_arr ta;
	int rc;

	*out = NULL;
	if ((rc = tqr_gguf_get_str(g, "tokenizer.ggml.model", &model, &n_model, err)) < 0)
		return rc;
	if (n_model == 5 && !memcmp(model, "llama", 5))
		return tqr_fail(err, -EOPNOTSUPP, "tokenizer.ggml.model \"llama\" (sentencepiece) is not "
				"supported yet; byte-level BPE (\"gpt2\") is");
	if (n_model != 4 || memcmp(model, "gpt2", 4))
		return tqr_fail(err, -EINVAL, "tokenizer.ggml.model \"%.*s\" is not supported (\"gpt2\" is)",
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
	if (tqr_gguf_find(g, "tokenizer.ggml.token_type") >= 0) {
		if ((rc = tqr_gguf_get_arr(g, "tokenizer.ggml.token_type", &ta, err)) < 0)
			goto out;
		if (ta.type == TQR_GGUF_STRING || ta.count != (uint64_t)n_tok) {
			rc = tqr_fail(err, -EINVAL, "tokenizer.ggml.token_type: %llu entries for %ld tokens",
				      (unsigned long long)ta.count, n_tok);
			goto out;
		}
		if (!(type = malloc(sizeof(*type) * (size_t)(n_tok ? n_tok : 1)))) {
			rc = tqr_fail(err, -ENOMEM, "out of memory");
			goto out;
		}
		for (long i = 0; i < n_tok; i++) {
			int64_t v;
			if (tqr_gguf_arr_i64(&ta, (uint64_t)i, &v) < 0 || v < INT32_MIN || v > INT32_MAX) {
				rc = tqr_fail(err, -EINVAL, "tokenizer.ggml.token_type: entry %ld unreadable", i);
				goto out;
			}
			type[i] = (int32_t)v;
		}
	}
	rc = tqr_bpe_new(out, tok, tok_len, type, (int)n_tok, merge, merge_len, (int)n_merge, pre_name, err);
out:
	free(tok);
	free(tok_len);
	free(merge);
	free(merge_len);
	free(type);
	return rc;
}

/* An optional token id: absent -> def; present -> in [0, n). */
static int opt_id(const tqr_gguf *g, const char *key, int n, int def, int *id, tqr_error *err)
{
	uint32_t v;
	int rc;

	*id = def;
	if (tqr_gguf_find(g, key) < 0)
		return 0;
	if ((rc = tqr_gguf_get_u32(g, key, &v, err)) < 0)
		return rc;
	if (v >= (uint32_t)n)
		return tqr_fail(err, -EINVAL, "%s: token %u is not in the vocabulary of %d", key, v, n);
	*id = (int)v;
	return 0;
}

int tqr_tok_from_gguf(tqr_tok **out, const char *path, int vocab_size, tqr_error *err)
{
	tqr_gguf *g = NULL;
	tqr_bpe *b = NULL;
	int bos, eos, add_bos = 0, rc;

	*out = NULL;
	if ((rc = tqr_gguf_open(&g, path, err)) < 0)
		return rc;
	if ((rc = tqr_bpe_from_gguf(&b, g, vocab_size, err)) < 0 ||
	    (rc = opt_id(g, "tokenizer.ggml.bos_token_id", vocab_size, -1, &bos, err)) < 0 ||
	    (rc = opt_id(g, "tokenizer.ggml.eos_token_id", vocab_size, -1, &eos, err)) < 0)
		goto fail;
	if (tqr_gguf_find(g, "tokenizer.ggml.add_bos_token") >= 0 &&
	    (rc = tqr_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, err)) < 0)
		goto fail;
	if (add_bos && bos < 0) {
		rc = tqr_fail(err, -EINVAL, "%s: add_bos_token without a bos_token_id", path);
		goto fail;
	}
	tqr_gguf_free(g);
	return tqr_tok_wrap_bpe(out, b, bos, eos, add_bos, err);
fail:
	tqr_bpe_free(b);
	tqr_gguf_free(g);
	return rc;
}
