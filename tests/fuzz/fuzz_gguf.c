/* fuzz_gguf — the GGUF reader, the GGUF llama loader and the GGUF
 * tokenizer loader (client/run/gguf.c, model_gguf.c, tok_gguf.c): any bytes
 * parse or fail with a message; on a parsed file every accessor stays
 * inside the bytes (each key's getters, every array element, every
 * tensor's dequantization), a loaded model's configuration is consistent,
 * and a loaded vocabulary ("gpt2" or "llama", its size taken from
 * tokenizer.ggml.tokens) encodes and decodes text. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "gguf.h"
#include "model.h"
#include "tokenizer.h"

static volatile float sink;

static void walk(const tqr_gguf *g)
{
	for (uint64_t i = 0; i < tqr_gguf_n_kv(g); i++) {
		const char *k, *s;
		char key[256];
		size_t kn, n;
		uint32_t type, u;
		int64_t v;
		float f;
		int b;
		struct tqr_gguf_arr a;
		tqr_error err;

		tqr_gguf_kv_at(g, i, &k, &kn, &type);
		if (kn >= sizeof(key) || memchr(k, 0, kn))
			continue;
		memcpy(key, k, kn);
		key[kn] = 0;
		if (tqr_gguf_find(g, key) != (int)type)
			abort();
		tqr_gguf_get_u32(g, key, &u, &err);
		tqr_gguf_get_i64(g, key, &v, &err);
		tqr_gguf_get_f32(g, key, &f, &err);
		tqr_gguf_get_bool(g, key, &b, &err);
		if (tqr_gguf_get_str(g, key, &s, &n, &err) == 0 && n)
			sink += (float)(unsigned char)s[n - 1];
		if (tqr_gguf_get_arr(g, key, &a, &err) == 0) {
			uint64_t cur = 0, count = 0;
			double d;
			while (tqr_gguf_arr_str_next(&a, &cur, &s, &n) == 0) {
				if (n)
					sink += (float)(unsigned char)s[n - 1];
				count++;
			}
			if (a.type == 8 /* string */ && count != a.count)
				abort();
			for (uint64_t j = 0; j < a.count && j < 4096; j++)
				if (tqr_gguf_arr_f64(&a, j, &d) == 0)
					sink += (float)d;
		}
	}
	for (uint64_t i = 0; i < tqr_gguf_n_tensors(g); i++) {
		const struct tqr_gguf_tensor *t = tqr_gguf_tensor_at(g, i);
		char name[256];
		if (t->name_len < sizeof(name) && !memchr(t->name, 0, t->name_len)) {
			memcpy(name, t->name, t->name_len);
			name[t->name_len] = 0;
			if (tqr_gguf_tensor_find(g, name) != t)
				abort();
		}
		if (!tqr_ggml_dequant_supported(t->type) || t->n_elems > (1u << 22))
			continue;
		float *out = malloc(sizeof(float) * t->n_elems);
		if (!out)
			continue;
		tqr_ggml_dequant(t->type, t->data, t->n_elems, out);
		sink += out[t->n_elems - 1];
		free(out);
	}
}

/* The file's vocabulary, if it loads: ids from encode decode. */
static void tokenize(const tqr_gguf *g)
{
	static const char text[] = "Once upon a time, \xc3\xa9t\xc3\xa9 \xe2\x96\x81 \xff\xfe 42!\n<s>";
	int toks[sizeof(text) + 3];
	struct tqr_gguf_arr a;
	tqr_tok *t = NULL;
	tqr_error err;

	if (tqr_gguf_get_arr(g, "tokenizer.ggml.tokens", &a, &err) < 0 || a.count > 4096)
		return;
	if (tqr_tok_from_gguf_meta(&t, g, (int)a.count, &err) < 0)
		return;
	long n = tqr_tok_encode(t, text, sizeof(text) - 1, 1, 1, toks, &err);
	if (n > (long)sizeof(text) + 2)
		abort(); /* more ids than the documented bound */
	for (long i = 0; i < n; i++) {
		const char *piece;
		size_t len;
		if (tqr_tok_decode(t, i ? toks[i - 1] : -1, toks[i], &piece, &len) < 0)
			abort(); /* encode produced an id decode refuses */
	}
	tqr_tok_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	tqr_gguf *g = NULL;
	tqr_model *m = NULL;
	tqr_error err;
	char path[64];
	int fd;

	if (tqr_gguf_parse(&g, data, size, "fuzz.gguf", &err) == 0) {
		walk(g);
		tokenize(g);
		tqr_gguf_free(g);
	}
	if ((fd = fuzz_as_file(data, size, path, sizeof(path))) < 0)
		return 0;
	if (tqr_model_load(&m, path, &err) == 0) {
		const struct tqr_config *c = tqr_model_config(m);
		if (c->dim <= 0 || c->n_heads <= 0 || c->dim % c->n_heads || c->n_kv_heads <= 0 ||
		    c->n_heads % c->n_kv_heads || c->vocab_size <= 0 || c->seq_len <= 0 || !(c->rope_theta > 1.0f))
			abort();
		tqr_model_free(m);
	}
	close(fd);
	return 0;
}
