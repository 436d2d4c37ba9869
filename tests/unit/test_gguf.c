/* test_gguf — the GGUF reader, the dequantizers and GGUF llama models
 * (client/run/gguf.c, model_gguf.c).
 *
 *   test_gguf                         the unit cases: tiny files built here,
 *                                     every kind of corruption, hand-made
 *                                     blocks, a GGUF llama against the same
 *                                     weights as a llama2.c checkpoint
 *   test_gguf --dequant MODEL DIR T.. each tensor T against DIR/T.f32, which
 *                                     scripts/ref-dequant.py wrote with the
 *                                     `gguf` package (bit-exact)
 *   test_gguf --forward MODEL REF IDS the forward pass of token ids IDS
 *                                     (comma-separated) with the exact fp32
 *                                     KV cache against REF, the float32
 *                                     [n][vocab] logits of scripts/ref-forward.py
 * The last two are run by tests/integration/gguf_ref.sh when the model is
 * there. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf.h"
#include "harness.h"
#include "kvback.h"
#include "model.h"
#include "tq_codec.h"

/* ---- a GGUF writer ------------------------------------------------------------ */

struct gb {
	unsigned char *b;
	size_t n, cap;
};

static void put(struct gb *g, const void *p, size_t n)
{
	if (g->n + n > g->cap) {
		g->cap = (g->n + n) * 2 + 64;
		g->b = realloc(g->b, g->cap);
		if (!g->b)
			abort();
	}
	memcpy(g->b + g->n, p, n);
	g->n += n;
}

static void u8(struct gb *g, uint8_t v) { put(g, &v, 1); }
static void u32(struct gb *g, uint32_t v) { put(g, &v, 4); }
static void u64(struct gb *g, uint64_t v) { put(g, &v, 8); }
static void f32(struct gb *g, float v) { put(g, &v, 4); }
static void str(struct gb *g, const char *s) { u64(g, strlen(s)); put(g, s, strlen(s)); }
static void key(struct gb *g, const char *k, uint32_t type) { str(g, k); u32(g, type); }
static void pad_to(struct gb *g, size_t align)
{
	while (g->n % align)
		u8(g, 0);
}

static void header(struct gb *g, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
	u32(g, TQR_GGUF_MAGIC);
	u32(g, version);
	u64(g, n_tensors);
	u64(g, n_kv);
}

static void tensor_info(struct gb *g, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
			uint64_t offset)
{
	str(g, name);
	u32(g, n_dims);
	for (uint32_t i = 0; i < n_dims; i++)
		u64(g, ne[i]);
	u32(g, type);
	u64(g, offset);
}

/* The tiny valid file: every value type, general.alignment 64, three
 * tensors (F32 [8], Q8_0 [32, 2], Q4_1 [32]); it ends where the last
 * tensor does, so every truncation cuts something. */
static struct gb tiny(void)
{
	struct gb g = { 0 };
	header(&g, 3, 3, 16);
	key(&g, "t.u8", TQR_GGUF_U8); u8(&g, 200);
	key(&g, "t.i8", TQR_GGUF_I8); u8(&g, 0xfe);
	key(&g, "t.u16", TQR_GGUF_U16); u8(&g, 0x34); u8(&g, 0x12);
	key(&g, "t.i16", TQR_GGUF_I16); u8(&g, 0xff); u8(&g, 0xff);
	key(&g, "t.u32", TQR_GGUF_U32); u32(&g, 4000000000u);
	key(&g, "t.i32", TQR_GGUF_I32); u32(&g, (uint32_t)-5);
	key(&g, "t.f32", TQR_GGUF_F32); f32(&g, 1.5f);
	key(&g, "t.bool", TQR_GGUF_BOOL); u8(&g, 1);
	key(&g, "t.str", TQR_GGUF_STRING); str(&g, "hello");
	key(&g, "t.u64", TQR_GGUF_U64); u64(&g, 1ull << 40);
	key(&g, "t.i64", TQR_GGUF_I64); u64(&g, (uint64_t)-7);
	double d = 2.25;
	key(&g, "t.f64", TQR_GGUF_F64); put(&g, &d, 8);
	key(&g, "t.arr_i32", TQR_GGUF_ARRAY); u32(&g, TQR_GGUF_I32); u64(&g, 3);
	u32(&g, 10); u32(&g, (uint32_t)-20); u32(&g, 30);
	key(&g, "t.arr_str", TQR_GGUF_ARRAY); u32(&g, TQR_GGUF_STRING); u64(&g, 3);
	str(&g, "a"); str(&g, ""); str(&g, "ccc");
	key(&g, "t.arr_empty", TQR_GGUF_ARRAY); u32(&g, TQR_GGUF_F32); u64(&g, 0);
	key(&g, "general.alignment", TQR_GGUF_U32); u32(&g, 64);
	uint64_t ne_a[] = { 8 }, ne_b[] = { 32, 2 }, ne_c[] = { 32 };
	tensor_info(&g, "a", 1, ne_a, TQR_GGML_F32, 0);          /* 32 bytes */
	tensor_info(&g, "b", 2, ne_b, TQR_GGML_Q8_0, 64);        /* 68 bytes */
	tensor_info(&g, "c", 1, ne_c, TQR_GGML_Q4_1, 192);       /* 20 bytes */
	pad_to(&g, 64);
	size_t base = g.n;
	for (int i = 0; i < 8; i++)
		f32(&g, (float)i - 3.5f);
	pad_to(&g, 64);
	for (int blk = 0; blk < 2; blk++) {
		u8(&g, 0x00); u8(&g, 0x38);  /* d = 0.5 */
		for (int j = 0; j < 32; j++)
			u8(&g, (uint8_t)(int8_t)(j - 16 + blk));
	}
	while (g.n < base + 192)
		u8(&g, 0);
	u8(&g, 0x00); u8(&g, 0x3c);      /* d = 1 */
	u8(&g, 0x00); u8(&g, 0xbc);      /* m = -1 */
	for (int j = 0; j < 16; j++)
		u8(&g, (uint8_t)(j | (15 - j) << 4));
	return g;
}

static void *last_copy; /* the bytes of the last successful parse() */

static int parse(const void *p, size_t n, tqr_gguf **g, tqr_error *err)
{
	/* an exact-size copy, so that a read past the end is a sanitizer report */
	void *c = malloc(n ? n : 1);
	memcpy(c, p, n);
	int rc = tqr_gguf_parse(g, c, n, "t.gguf", err);
	if (rc < 0)
		free(c);
	else
		last_copy = c;
	return rc;
}

/* Frees g and the bytes it was parsed from. */
static void parsed_free(tqr_gguf *g)
{
	tqr_gguf_free(g);
	free(last_copy);
	last_copy = NULL;
}

static void test_tiny_valid(void)
{
	struct gb b = tiny();
	tqr_gguf *g;
	tqr_error err = { { 0 } };
	int rc = parse(b.b, b.n, &g, &err);
	free(b.b);
	T_ASSERT(rc == 0 || (fprintf(stderr, "%s\n", err.msg), 0));
	T_EQ(tqr_gguf_n_kv(g), 16);
	T_EQ(tqr_gguf_n_tensors(g), 3);
	T_EQ(tqr_gguf_alignment(g), 64);
	T_EQ(tqr_gguf_data_offset(g) % 64, 0);

	uint32_t u; int64_t i; float f; int bo; const char *s; size_t n;
	T_EQ(tqr_gguf_get_u32(g, "t.u8", &u, &err), 0); T_EQ(u, 200);
	T_EQ(tqr_gguf_get_i64(g, "t.i8", &i, &err), 0); T_EQ(i, -2);
	T_EQ(tqr_gguf_get_u32(g, "t.u16", &u, &err), 0); T_EQ(u, 0x1234);
	T_EQ(tqr_gguf_get_i64(g, "t.i16", &i, &err), 0); T_EQ(i, -1);
	T_EQ(tqr_gguf_get_u32(g, "t.u32", &u, &err), 0); T_EQ(u, 4000000000u);
	T_EQ(tqr_gguf_get_i64(g, "t.i32", &i, &err), 0); T_EQ(i, -5);
	T_EQ(tqr_gguf_get_u32(g, "t.i32", &u, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "t.i32 = -5 is outside"));
	T_EQ(tqr_gguf_get_f32(g, "t.f32", &f, &err), 0); T_NEAR(f, 1.5, 0);
	T_EQ(tqr_gguf_get_f32(g, "t.f64", &f, &err), 0); T_NEAR(f, 2.25, 0);
	T_EQ(tqr_gguf_get_bool(g, "t.bool", &bo, &err), 0); T_EQ(bo, 1);
	T_EQ(tqr_gguf_get_str(g, "t.str", &s, &n, &err), 0);
	T_ASSERT(n == 5 && !memcmp(s, "hello", 5));
	T_EQ(tqr_gguf_get_u32(g, "t.u64", &u, &err), -EINVAL);
	T_EQ(tqr_gguf_get_i64(g, "t.u64", &i, &err), 0); T_EQ(i, 1ll << 40);
	T_EQ(tqr_gguf_get_i64(g, "t.i64", &i, &err), 0); T_EQ(i, -7);
	T_EQ(tqr_gguf_get_u32(g, "t.str", &u, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "t.str is a string, not an integer"));
	T_EQ(tqr_gguf_get_str(g, "t.f32", &s, &n, &err), -EINVAL);
	T_EQ(tqr_gguf_get_u32(g, "no.such", &u, &err), -ENOENT);
	T_ASSERT(strstr(err.msg, "no.such is missing"));
	T_EQ(tqr_gguf_find(g, "t.arr_str"), TQR_GGUF_ARRAY);
	T_EQ(tqr_gguf_find(g, "t"), -ENOENT);

	struct tqr_gguf_arr a;
	T_EQ(tqr_gguf_get_arr(g, "t.arr_i32", &a, &err), 0);
	T_EQ(a.type, TQR_GGUF_I32); T_EQ(a.count, 3);
	T_EQ(tqr_gguf_arr_i64(&a, 1, &i), 0); T_EQ(i, -20);
	double dv;
	T_EQ(tqr_gguf_arr_f64(&a, 2, &dv), 0); T_NEAR(dv, 30, 0);
	T_EQ(tqr_gguf_arr_i64(&a, 3, &i), -EINVAL);
	T_EQ(tqr_gguf_get_arr(g, "t.arr_str", &a, &err), 0);
	T_EQ(a.count, 3);
	uint64_t cur = 0;
	T_EQ(tqr_gguf_arr_str_next(&a, &cur, &s, &n), 0); T_ASSERT(n == 1 && s[0] == 'a');
	T_EQ(tqr_gguf_arr_str_next(&a, &cur, &s, &n), 0); T_EQ(n, 0);
	T_EQ(tqr_gguf_arr_str_next(&a, &cur, &s, &n), 0); T_ASSERT(n == 3 && !memcmp(s, "ccc", 3));
	T_EQ(tqr_gguf_arr_str_next(&a, &cur, &s, &n), -ENOENT);
	T_EQ(tqr_gguf_arr_i64(&a, 0, &i), -EINVAL);
	T_EQ(tqr_gguf_get_arr(g, "t.arr_empty", &a, &err), 0); T_EQ(a.count, 0);

	const struct tqr_gguf_tensor *t = tqr_gguf_tensor_find(g, "b");
	T_ASSERT(t && t->type == TQR_GGML_Q8_0 && t->n_dims == 2 && t->ne[0] == 32 && t->ne[1] == 2 &&
		 t->ne[2] == 1 && t->n_elems == 64 && t->bytes == 68 && t->offset == 64);
	T_ASSERT(tqr_gguf_tensor_find(g, "x") == NULL && tqr_gguf_tensor_find(g, "") == NULL);
	T_ASSERT(tqr_gguf_tensor_at(g, 0) == tqr_gguf_tensor_find(g, "a"));
	float out[64];
	tqr_ggml_dequant(t->type, t->data, t->n_elems, out);
	for (int j = 0; j < 64; j++)
		T_NEAR(out[j], 0.5 * (j % 32 - 16 + j / 32), 0);
	t = tqr_gguf_tensor_find(g, "a");
	tqr_ggml_dequant(t->type, t->data, t->n_elems, out);
	for (int j = 0; j < 8; j++)
		T_NEAR(out[j], j - 3.5, 0);
	t = tqr_gguf_tensor_find(g, "c");
	tqr_ggml_dequant(t->type, t->data, t->n_elems, out);
	for (int j = 0; j < 16; j++) {
		T_NEAR(out[j], j - 1, 0);
		T_NEAR(out[j + 16], 15 - j - 1, 0);
	}
	parsed_free(g);
}

/* Every prefix of the tiny file is refused with a message, never a crash. */
static void test_truncation_everywhere(void)
{
	struct gb b = tiny();
	tqr_error err;

	for (size_t k = 0; k < b.n; k++) {
		tqr_gguf *g = NULL;
		err.msg[0] = 0;
		int rc = parse(b.b, k, &g, &err);
		if (rc != -EINVAL || !err.msg[0]) {
			free(b.b);
			T_FAIL("a %zu-byte prefix: rc %d, '%s'", k, rc, err.msg);
		}
		if (k >= 24 && !strstr(err.msg, "truncated") && !strstr(err.msg, "beyond") &&
		    !strstr(err.msg, "cannot hold") && !strstr(err.msg, "left")) {
			free(b.b);
			T_FAIL("a %zu-byte prefix: '%s' says nothing of the truncation", k, err.msg);
		}
	}
	free(b.b);
}

/* A file with one key/value (built by fn) and no tensors; its message. */
static int one_kv(void (*fn)(struct gb *), uint32_t version, char *msg)
{
	struct gb b = { 0 };
	tqr_gguf *g = NULL;
	tqr_error err = { { 0 } };

	header(&b, version, 0, 1);
	fn(&b);
	int rc = parse(b.b, b.n, &g, &err);
	free(b.b);
	if (rc == 0)
		parsed_free(g);
	strcpy(msg, err.msg);
	return rc;
}

static void kv_plain(struct gb *b) { key(b, "k", TQR_GGUF_U32); u32(b, 1); }
static void kv_huge_str(struct gb *b) { key(b, "k", TQR_GGUF_STRING); u64(b, 1ull << 62); }
static void kv_huge_key(struct gb *b) { u64(b, UINT64_MAX); u64(b, 0); u64(b, 0); }
static void kv_huge_arr(struct gb *b) { key(b, "k", TQR_GGUF_ARRAY); u32(b, TQR_GGUF_U64); u64(b, 1ull << 61); }
static void kv_huge_sarr(struct gb *b) { key(b, "k", TQR_GGUF_ARRAY); u32(b, TQR_GGUF_STRING); u64(b, UINT64_MAX); }
static void kv_nested(struct gb *b) { key(b, "k", TQR_GGUF_ARRAY); u32(b, TQR_GGUF_ARRAY); u64(b, 1); u32(b, 4); u64(b, 0); }
static void kv_badtype(struct gb *b) { key(b, "k", 13); u64(b, 0); }
static void kv_badelem(struct gb *b) { key(b, "k", TQR_GGUF_ARRAY); u32(b, 99); u64(b, 0); }
static void kv_bool2(struct gb *b) { key(b, "k", TQR_GGUF_BOOL); u8(b, 2); u64(b, 0); }
static void kv_empty_key(struct gb *b) { str(b, ""); u32(b, TQR_GGUF_U8); u8(b, 0); u64(b, 0); }
static void kv_align3(struct gb *b) { key(b, "general.alignment", TQR_GGUF_U32); u32(b, 3); }
static void kv_align0(struct gb *b) { key(b, "general.alignment", TQR_GGUF_U32); u32(b, 0); }
static void kv_align64(struct gb *b) { key(b, "general.alignment", TQR_GGUF_U64); u64(b, 32); }

static void test_kv_corruptions(void)
{
	char msg[512];
	static const struct {
		void (*fn)(struct gb *);
		uint32_t version;
		const char *want;    /* NULL: valid */
	} cases[] = {
		{ kv_plain, 3, NULL },
		{ kv_plain, 2, "GGUF version 2: tqkv-run reads GGUF version 3 only" },
		{ kv_plain, 1, "GGUF version 1" },
		{ kv_plain, 0x03000000, "big-endian" },
		{ kv_plain, 4, "GGUF version 4" },
		{ kv_huge_str, 3, "string length 4611686018427387904" },
		{ kv_huge_key, 3, "metadata key (#0): string length" },
		{ kv_huge_arr, 3, "array of 2305843009213693952 u64" },
		{ kv_huge_sarr, 3, "array of 18446744073709551615 string" },
		{ kv_nested, 3, "nested arrays are not supported" },
		{ kv_badtype, 3, "unknown value type 13" },
		{ kv_badelem, 3, "unknown array element type 99" },
		{ kv_bool2, 3, "bool value 2" },
		{ kv_empty_key, 3, "metadata key #0 at offset 24 is empty" },
		{ kv_align3, 3, "general.alignment = 3 is not a power of two" },
		{ kv_align0, 3, "general.alignment = 0 is not a power of two" },
		{ kv_align64, 3, "general.alignment is a u64, not a u32" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = one_kv(cases[i].fn, cases[i].version, msg);
		if (!cases[i].want && rc != 0)
			T_FAIL("case %zu: %s", i, msg);
		if (cases[i].want && (rc != -EINVAL || !strstr(msg, cases[i].want)))
			T_FAIL("case %zu: rc %d, '%s' (want '%s')", i, rc, msg, cases[i].want);
	}
}

static void test_header_corruptions(void)
{
	struct gb b = { 0 };
	tqr_gguf *g = NULL;
	tqr_error err;

	header(&b, 3, 0, UINT64_MAX);
	T_EQ(parse(b.b, b.n, &g, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "n_kv = 18446744073709551615"));
	b.n = 0;
	header(&b, 3, 1ull << 40, 0);
	T_EQ(parse(b.b, b.n, &g, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "n_tensors = 1099511627776"));
	b.n = 0;
	u32(&b, 0x46554748);
	T_EQ(parse(b.b, b.n, &g, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "not a GGUF file"));
	/* duplicated keys */
	b.n = 0;
	header(&b, 3, 0, 2);
	kv_plain(&b);
	kv_plain(&b);
	T_EQ(parse(b.b, b.n, &g, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "metadata key 'k' appears more than once"));
	/* no tensors, no data section: valid */
	b.n = 0;
	header(&b, 3, 0, 0);
	T_EQ(parse(b.b, b.n, &g, &err), 0);
	parsed_free(g);
	free(b.b);
}

/* Two tensors with their data: a [nb][4] F32 at offset 0 and b as given. */
static int two_tensors(uint32_t n_dims, uint64_t ne0, uint32_t type, uint64_t off_b, const char *name_b,
		       size_t data_bytes, char *msg)
{
	struct gb b = { 0 };
	tqr_gguf *g = NULL;
	tqr_error err = { { 0 } };
	uint64_t ne_a[] = { 8 }, ne_b[] = { ne0, 1, 1, 1, 1 };

	header(&b, 3, 2, 0);
	tensor_info(&b, "a", 1, ne_a, TQR_GGML_F32, 0);
	tensor_info(&b, name_b, n_dims, ne_b, type, off_b);
	pad_to(&b, 32);
	for (size_t i = 0; i < data_bytes; i++)
		u8(&b, 0);
	int rc = parse(b.b, b.n, &g, &err);
	free(b.b);
	if (rc == 0)
		parsed_free(g);
	strcpy(msg, err.msg);
	return rc;
}

static void test_tensor_corruptions(void)
{
	char msg[512];
	static const struct {
		uint32_t n_dims;
		uint64_t ne0;
		uint32_t type;
		uint64_t off;
		const char *name;
		size_t bytes;
		const char *want;
	} cases[] = {
		{ 1, 32, TQR_GGML_Q4_0, 32, "b", 64, NULL },
		{ 1, 32, TQR_GGML_Q4_0, 0, "b", 64, "tensors 'a' (data offset 0, 32 bytes) and 'b' (data offset 0) overlap" },
		{ 1, 64, TQR_GGML_F16, 32, "b", 64, "'b': 128 bytes at data offset 32 lie beyond the end of the file" },
		{ 1, 8, TQR_GGML_F32, 16, "b", 64, "offset 16 is not a multiple of the alignment 32" },
		{ 1, 32, 4, 32, "b", 64, "unknown ggml type 4" },
		{ 1, 32, 99, 32, "b", 64, "unknown ggml type 99" },
		{ 1, 16, TQR_GGML_Q8_0, 32, "b", 64, "ne[0] = 16 is not a multiple of Q8_0's block of 32" },
		{ 5, 8, TQR_GGML_F32, 32, "b", 64, "n_dims 5" },
		{ 0, 8, TQR_GGML_F32, 32, "b", 64, "n_dims 0" },
		{ 1, 0, TQR_GGML_F32, 32, "b", 64, "ne[0] = 0" },
		{ 1, 1ull << 40, TQR_GGML_F32, 32, "b", 64, "4398046511104 bytes at data offset 32 lie beyond the end of the file" },
		{ 1, 1ull << 62, TQR_GGML_F32, 32, "b", 64, "the size of 4611686018427387904 F32 elements overflows" },
		{ 1, 8, TQR_GGML_F32, UINT64_MAX - 30, "b", 64, "not a multiple of the alignment" },
		{ 1, 8, TQR_GGML_F32, 1ull << 63, "b", 64, "beyond the end of the file" },
		{ 1, 8, TQR_GGML_F32, 32, "a", 64, "tensor name 'a' appears more than once" },
		{ 1, 8, TQR_GGML_F32, 32, "", 64, "empty name" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = two_tensors(cases[i].n_dims, cases[i].ne0, cases[i].type, cases[i].off, cases[i].name,
				     cases[i].bytes, msg);
		if (!cases[i].want && rc != 0)
			T_FAIL("case %zu: %s", i, msg);
		if (cases[i].want && (rc != -EINVAL || !strstr(msg, cases[i].want)))
			T_FAIL("case %zu: rc %d, '%s' (want '%s')", i, rc, msg, cases[i].want);
	}
	/* a product of dimensions that overflows */
	struct gb b = { 0 };
	tqr_gguf *g = NULL;
	tqr_error err;
	uint64_t ne[] = { 1ull << 32, 1ull << 32 };
	header(&b, 3, 1, 0);
	tensor_info(&b, "x", 2, ne, TQR_GGML_F32, 0);
	T_EQ(parse(b.b, b.n, &g, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "ne[1] = 4294967296") && strstr(err.msg, "overflow"));
	free(b.b);
}

/* ---- the dequantizers on hand-made blocks ----------------------------------------- */

static void test_dequant_blocks(void)
{
	unsigned char blk[64];
	float out[64];

	/* Q8_0: d = -0.25 (0xb400), q = -128 .. 127 stepping 8 */
	blk[0] = 0x00; blk[1] = 0xb4;
	for (int j = 0; j < 32; j++)
		blk[2 + j] = (unsigned char)(int8_t)(-128 + 8 * j + (j == 31 ? 7 : 0));
	tqr_ggml_dequant(TQR_GGML_Q8_0, blk, 32, out);
	for (int j = 0; j < 32; j++)
		T_NEAR(out[j], -0.25 * (-128 + 8 * j + (j == 31 ? 7 : 0)), 0);
	/* Q4_0: d = 2 (0x4000); low nibble of byte j is element j, high element j + 16 */
	blk[0] = 0x00; blk[1] = 0x40;
	for (int j = 0; j < 16; j++)
		blk[2 + j] = (unsigned char)(j | ((j * 7) & 15) << 4);
	tqr_ggml_dequant(TQR_GGML_Q4_0, blk, 32, out);
	for (int j = 0; j < 16; j++) {
		T_NEAR(out[j], 2.0 * (j - 8), 0);
		T_NEAR(out[j + 16], 2.0 * (((j * 7) & 15) - 8), 0);
	}
	/* Q4_1: d = 0.5 (0x3800), m = -3 (0xc200) */
	blk[0] = 0x00; blk[1] = 0x38; blk[2] = 0x00; blk[3] = 0xc2;
	for (int j = 0; j < 16; j++)
		blk[4 + j] = (unsigned char)((15 - j) | j << 4);
	tqr_ggml_dequant(TQR_GGML_Q4_1, blk, 32, out);
	for (int j = 0; j < 16; j++) {
		T_NEAR(out[j], 0.5 * (15 - j) - 3, 0);
		T_NEAR(out[j + 16], 0.5 * j - 3, 0);
	}
	/* F16 (a subnormal, -2, 65504), BF16 (1.0, -0.5), F32 */
	static const unsigned char f16[] = { 0x01, 0x00, 0x00, 0xc0, 0xff, 0x7b };
	tqr_ggml_dequant(TQR_GGML_F16, f16, 3, out);
	T_NEAR(out[0], ldexp(1, -24), 0);
	T_NEAR(out[1], -2, 0);
	T_NEAR(out[2], 65504, 0);
	static const unsigned char bf16[] = { 0x80, 0x3f, 0x00, 0xbf };
	tqr_ggml_dequant(TQR_GGML_BF16, bf16, 2, out);
	T_NEAR(out[0], 1, 0);
	T_NEAR(out[1], -0.5, 0);
	float x[3] = { 1e-30f, -7.0f, 3.25f };
	tqr_ggml_dequant(TQR_GGML_F32, (const unsigned char *)x, 3, out); /* any alignment */
	T_ASSERT(!memcmp(out, x, sizeof(x)));
	T_ASSERT(tqr_ggml_dequant_supported(TQR_GGML_Q4_1) && !tqr_ggml_dequant_supported(14) &&
		 !tqr_ggml_dequant_supported(4) && !tqr_ggml_dequant_supported(1000));
	T_ASSERT(!strcmp(tqr_ggml_type_name(14), "Q6_K") && tqr_ggml_type_name(5) == NULL);
	T_EQ(tqr_ggml_block_bytes(TQR_GGML_Q8_0), 34);
	T_EQ(tqr_ggml_block_elems(TQR_GGML_Q4_1), 32);
}

/* ---- a GGUF llama against the same weights as a llama2.c checkpoint -------------- */

static char tmpdir[256];

static uint64_t rng;
static float rnd(void)
{
	rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
	return (float)((double)(rng >> 11) / (double)(1ULL << 52) - 1.0);
}

/* Writes the same random model as a llama2.c checkpoint and as a GGUF (F32
 * weights; the classifier tied or not; the GGUF's token embedding in F16
 * when f16_emb, the checkpoint then holding its rounded values). */
static int write_pair(const char *ckpt, const char *gguf, int tied, int f16_emb, const char *arch)
{
	const int dim = 16, hid = 24, L = 2, nh = 2, nkv = 1, V = 11, S = 12, hd = dim / nh, kvd = nkv * hd;
	struct { const char *name; int per_layer; int rows, cols; } t[] = {
		{ "token_embd.weight", 0, V, dim }, { "attn_norm.weight", 1, 1, dim },
		{ "attn_q.weight", 1, dim, dim }, { "attn_k.weight", 1, kvd, dim },
		{ "attn_v.weight", 1, kvd, dim }, { "attn_output.weight", 1, dim, dim },
		{ "ffn_norm.weight", 1, 1, dim }, { "ffn_gate.weight", 1, hid, dim },
		{ "ffn_down.weight", 1, dim, hid }, { "ffn_up.weight", 1, hid, dim },
		{ "output_norm.weight", 0, 1, dim }, { "output.weight", 0, V, dim },
	};
	int nt = (int)(sizeof(t) / sizeof(t[0])) - (tied ? 1 : 0);
	float *w[12][2];
	struct gb ck = { 0 }, g = { 0 };

	for (int i = 0; i < nt; i++)
		for (int l = 0; l < (t[i].per_layer ? L : 1); l++) {
			size_t n = (size_t)t[i].rows * t[i].cols;
			w[i][l] = malloc(sizeof(float) * n);
			for (size_t j = 0; j < n; j++)
				w[i][l][j] = t[i].rows == 1 ? 1.0f + 0.2f * rnd() : 0.4f * rnd();
			if (i == 0 && f16_emb)
				for (size_t j = 0; j < n; j++)
					w[i][l][j] = tq_f16_to_f32(tq_f32_to_f16(w[i][l][j]));
		}
	int32_t h[7] = { dim, hid, L, nh, nkv, tied ? V : -V, S };
	put(&ck, h, sizeof(h));
	/* llama2.c order: emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis, wcls */
	static const int order[] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
	for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++) {
		int i = order[k];
		for (int l = 0; l < (t[i].per_layer ? L : 1); l++)
			put(&ck, w[i][l], sizeof(float) * (size_t)t[i].rows * t[i].cols);
	}
	for (int j = 0; j < S * hd; j++)
		f32(&ck, 0);
	if (!tied)
		put(&ck, w[11][0], sizeof(float) * (size_t)V * dim);

	int ntensors = 0;
	for (int i = 0; i < nt; i++)
		ntensors += t[i].per_layer ? L : 1;
	header(&g, 3, (uint64_t)ntensors, 9);
	key(&g, "general.architecture", TQR_GGUF_STRING); str(&g, arch);
	key(&g, "llama.embedding_length", TQR_GGUF_U32); u32(&g, dim);
	key(&g, "llama.feed_forward_length", TQR_GGUF_U32); u32(&g, hid);
	key(&g, "llama.block_count", TQR_GGUF_U32); u32(&g, L);
	key(&g, "llama.attention.head_count", TQR_GGUF_U32); u32(&g, nh);
	key(&g, "llama.attention.head_count_kv", TQR_GGUF_U32); u32(&g, nkv);
	key(&g, "llama.context_length", TQR_GGUF_U32); u32(&g, S);
	key(&g, "llama.rope.freq_base", TQR_GGUF_F32); f32(&g, 10000.0f);
	key(&g, "llama.attention.layer_norm_rms_epsilon", TQR_GGUF_F32); f32(&g, 1e-5f);
	uint64_t off = 0;
	for (int i = nt - 1; i >= 0; i--) /* reverse order: the offsets need not follow the table */
		for (int l = 0; l < (t[i].per_layer ? L : 1); l++) {
			char name[64];
			uint64_t ne[2] = { (uint64_t)t[i].cols, (uint64_t)t[i].rows };
			int f16 = i == 0 && f16_emb;
			if (t[i].per_layer)
				snprintf(name, sizeof(name), "blk.%d.%s", l, t[i].name);
			else
				snprintf(name, sizeof(name), "%s", t[i].name);
			tensor_info(&g, name, t[i].rows == 1 ? 1 : 2, ne, f16 ? TQR_GGML_F16 : TQR_GGML_F32, off);
			off += (uint64_t)t[i].rows * t[i].cols * (f16 ? 2 : 4);
			off = (off + 31) & ~31ull;
		}
	pad_to(&g, 32);
	for (int i = nt - 1; i >= 0; i--)
		for (int l = 0; l < (t[i].per_layer ? L : 1); l++) {
			size_t n = (size_t)t[i].rows * t[i].cols;
			for (size_t j = 0; j < n; j++) {
				if (i == 0 && f16_emb) {
					uint16_t hv = tq_f32_to_f16(w[i][l][j]);
					put(&g, &hv, 2);
				} else {
					f32(&g, w[i][l][j]);
				}
			}
			pad_to(&g, 32);
		}
	FILE *f1 = fopen(ckpt, "wb"), *f2 = fopen(gguf, "wb");
	int ok = f1 && f2 && fwrite(ck.b, 1, ck.n, f1) == ck.n && fwrite(g.b, 1, g.n, f2) == g.n;
	if (f1)
		fclose(f1);
	if (f2)
		fclose(f2);
	for (int i = 0; i < nt; i++)
		for (int l = 0; l < (t[i].per_layer ? L : 1); l++)
			free(w[i][l]);
	free(ck.b);
	free(g.b);
	return ok ? 0 : -1;
}

/* The logits of tokens through model at path (exact KV), [n][vocab]. */
static int run_logits(const char *path, const int *toks, int n, float *logits, tqr_error *err)
{
	tqr_model *m = NULL;
	tqr_forward *f = NULL;
	tqr_kv *kv = NULL;
	int rc;

	if ((rc = tqr_model_load(&m, path, err)) < 0)
		return rc;
	const struct tqr_config *c = tqr_model_config(m);
	struct tqr_kv_geom geom = { c->n_layers, c->n_kv_heads, c->n_heads, c->head_dim, n };
	if ((rc = tqr_forward_new(&f, m, n, err)) == 0 && (rc = tqr_kv_new_exact(&kv, &geom, err)) == 0)
		rc = tqr_forward_run(f, kv, toks, n, 0, logits, 1, err);
	tqr_kv_free(kv);
	tqr_forward_free(f);
	tqr_model_free(m);
	return rc;
}

static void test_gguf_llama_matches_llama2c(void)
{
	char ck[300], gg[300];
	static const int toks[] = { 1, 5, 9, 3, 10, 0, 7 };
	float a[7 * 11], b[7 * 11];
	tqr_error err = { { 0 } };

	snprintf(ck, sizeof(ck), "%s/m.bin", tmpdir);
	snprintf(gg, sizeof(gg), "%s/m.gguf", tmpdir);
	for (int variant = 0; variant < 3; variant++) {
		rng = 42 + (uint64_t)variant;
		T_EQ(write_pair(ck, gg, variant != 1, variant == 2, "llama"), 0);
		T_ASSERT(run_logits(ck, toks, 7, a, &err) == 0 || (fprintf(stderr, "%s\n", err.msg), 0));
		T_ASSERT(run_logits(gg, toks, 7, b, &err) == 0 || (fprintf(stderr, "%s\n", err.msg), 0));
		/* the same weights, theta and eps: the same bits */
		if (memcmp(a, b, sizeof(a)))
			T_FAIL("variant %d: the GGUF model's logits differ from the llama2.c checkpoint's", variant);
	}
	tqr_model *m = NULL;
	T_EQ(tqr_model_load(&m, gg, &err), 0);
	const struct tqr_config *c = tqr_model_config(m);
	T_ASSERT(c->shared_classifier && c->vocab_size == 11 && c->seq_len == 12 && c->head_dim == 8 &&
		 c->rope_theta == 10000.0f && c->norm_eps == 1e-5f);
	tqr_model_free(m);
	T_EQ(write_pair(ck, gg, 1, 0, "gpt2"), 0);
	T_EQ(tqr_model_load(&m, gg, &err), -EOPNOTSUPP);
	T_ASSERT(strstr(err.msg, "general.architecture is 'gpt2': tqkv-run runs llama models"));
	unlink(ck);
	unlink(gg);
}

/* The fuzz seed llama.gguf (tests/fuzz/make_gguf_seeds.py: Q8_0, Q4_1, Q4_0,
 * F16 and F32 tensors) loads and runs: the seeds reach the model loader. */
static void test_seed_llama_loads(void)
{
	static const int toks[] = { 1, 3, 0, 2 };
	float lg[4 * 4];
	tqr_error err = { { 0 } };
	char path[600];

	/* from the source tree: $TQ_SRC (tests/run.sh) or the working directory */
	snprintf(path, sizeof(path), "%s/tests/fuzz/seeds/gguf/llama.gguf", getenv("TQ_SRC") ? getenv("TQ_SRC") : ".");
	if (access(path, R_OK) != 0)
		T_FAIL("%s is not readable (run from the source tree or set TQ_SRC)", path);
	T_ASSERT(run_logits(path, toks, 4, lg, &err) == 0 ||
		 (fprintf(stderr, "%s\n", err.msg), 0));
	for (int i = 0; i < 16; i++)
		T_ASSERT(isfinite(lg[i]));
}

/* ---- against the `gguf` package and the numpy reference (gguf_ref.sh) ------------- */

static void *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	char *b = NULL;
	long sz;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (sz = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (b = malloc((size_t)sz + 1)) && fread(b, 1, (size_t)sz, f) == (size_t)sz) {
		*n = (size_t)sz;
	} else {
		free(b);
		b = NULL;
	}
	fclose(f);
	return b;
}

static int cmd_dequant(const char *model, const char *dir, int nt, char **names)
{
	tqr_gguf *g;
	tqr_error err;
	int bad = 0;

	if (tqr_gguf_open(&g, model, &err) < 0) {
		fprintf(stderr, "%s\n", err.msg);
		return 1;
	}
	for (int i = 0; i < nt; i++) {
		const struct tqr_gguf_tensor *t = tqr_gguf_tensor_find(g, names[i]);
		char path[1024];
		size_t n = 0;
		snprintf(path, sizeof(path), "%s/%s.f32", dir, names[i]);
		float *ref = slurp(path, &n), *out = t ? malloc(sizeof(float) * t->n_elems) : NULL;
		if (!t || !ref || n != t->n_elems * 4 || !out) {
			fprintf(stderr, "%s: missing, or %s does not hold %llu floats\n", names[i], path,
				t ? (unsigned long long)t->n_elems : 0ull);
			bad = 1;
		} else {
			tqr_ggml_dequant(t->type, t->data, t->n_elems, out);
			uint64_t diff = 0;
			double maxd = 0;
			for (uint64_t j = 0; j < t->n_elems; j++)
				if (memcmp(&out[j], &ref[j], 4)) {
					diff++;
					if (fabs(out[j] - ref[j]) > maxd)
						maxd = fabs(out[j] - ref[j]);
				}
			printf("%-28s %-5s %9llu elements: %llu differ from gguf.quants.dequantize (max |diff| %g)\n",
			       names[i], tqr_ggml_type_name(t->type), (unsigned long long)t->n_elems,
			       (unsigned long long)diff, maxd);
			bad |= diff != 0;
		}
		free(ref);
		free(out);
	}
	tqr_gguf_free(g);
	return bad;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmd_forward(const char *model, const char *refpath, const char *ids)
{
	int toks[256], n = 0;
	tqr_error err = { { 0 } };
	tqr_model *m = NULL;
	size_t rn = 0;

	for (const char *p = ids; *p && n < 256;) {
		toks[n++] = (int)strtol(p, (char **)&p, 10);
		if (*p == ',')
			p++;
	}
	double t0 = now_s();
	if (tqr_model_load(&m, model, &err) < 0) {
		fprintf(stderr, "%s\n", err.msg);
		return 1;
	}
	double t1 = now_s();
	const struct tqr_config cfg = *tqr_model_config(m), *c = &cfg;
	printf("loaded %s in %.2f s: dim %d, hidden %d, %d layers, %d heads (%d KV), head_dim %d, vocab %d, context %d, rope_theta %g, eps %g, %s classifier\n",
	       model, t1 - t0, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
	       c->vocab_size, c->seq_len, (double)c->rope_theta, (double)c->norm_eps,
	       c->shared_classifier ? "tied" : "separate");
	tqr_model_free(m);
	float *ref = slurp(refpath, &rn);
	float *lg = malloc(sizeof(float) * (size_t)n * (size_t)c->vocab_size);
	int V = c->vocab_size, bad = 0;
	if (!ref || rn != sizeof(float) * (size_t)n * V || !lg) {
		fprintf(stderr, "%s: missing or not [%d][%d] floats\n", refpath, n, V);
		return 1;
	}
	t0 = now_s();
	if (run_logits(model, toks, n, lg, &err) < 0) {
		fprintf(stderr, "%s\n", err.msg);
		return 1;
	}
	printf("forward (load + %d tokens, exact fp32 KV): %.2f s\n", n, now_s() - t0);
	double worst_rel = 0;
	for (int t = 0; t < n; t++) {
		const float *a = lg + (size_t)t * V, *b = ref + (size_t)t * V;
		int am = 0, bm = 0;
		double maxd = 0, maxabs = 0;
		for (int j = 0; j < V; j++) {
			if (a[j] > a[am]) am = j;
			if (b[j] > b[bm]) bm = j;
			if (fabs(a[j] - b[j]) > maxd) maxd = fabs(a[j] - b[j]);
			if (fabs(b[j]) > maxabs) maxabs = fabs(b[j]);
		}
		double rel = maxd / maxabs;
		if (rel > worst_rel)
			worst_rel = rel;
		printf("pos %d: token %5d  argmax %5d (reference %5d)  max|diff| %.3g  relative to max|logit| %.3g: %.3g\n",
		       t, toks[t], am, bm, maxd, maxabs, rel);
		bad |= am != bm;
	}
	printf("worst relative difference %.3g (limit 2e-3); argmax %s\n", worst_rel, bad ? "DIFFERS" : "identical");
	free(ref);
	free(lg);
	return bad || worst_rel > 2e-3;
}

int main(int argc, char **argv)
{
	if (argc >= 4 && !strcmp(argv[1], "--dequant"))
		return cmd_dequant(argv[2], argv[3], argc - 4, argv + 4);
	if (argc == 5 && !strcmp(argv[1], "--forward"))
		return cmd_forward(argv[2], argv[3], argv[4]);
	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	snprintf(tmpdir, sizeof(tmpdir), "%s/test_gguf.XXXXXX", tmp);
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	T_RUN(test_tiny_valid);
	T_RUN(test_truncation_everywhere);
	T_RUN(test_kv_corruptions);
	T_RUN(test_header_corruptions);
	T_RUN(test_tensor_corruptions);
	T_RUN(test_dequant_blocks);
	T_RUN(test_gguf_llama_matches_llama2c);
	T_RUN(test_seed_llama_loads);
	rmdir(tmpdir);
	return t_done();
}
