/* gguf.c — GGUF v3 parsing of untrusted bytes, and ggml's dequantizers. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "tq_codec.h"

/* ---- types ------------------------------------------------------------------- */

static const struct {
	const char *name;
	uint32_t bytes;    /* 0: variable (string, array) */
} value_types[TQR_GGUF_TYPE_COUNT] = {
	[TQR_GGUF_U8] = { "u8", 1 },       [TQR_GGUF_I8] = { "i8", 1 },
	[TQR_GGUF_U16] = { "u16", 2 },     [TQR_GGUF_I16] = { "i16", 2 },
	[TQR_GGUF_U32] = { "u32", 4 },     [TQR_GGUF_I32] = { "i32", 4 },
	[TQR_GGUF_F32] = { "f32", 4 },     [TQR_GGUF_BOOL] = { "bool", 1 },
	[TQR_GGUF_STRING] = { "string", 0 }, [TQR_GGUF_ARRAY] = { "array", 0 },
	[TQR_GGUF_U64] = { "u64", 8 },     [TQR_GGUF_I64] = { "i64", 8 },
	[TQR_GGUF_F64] = { "f64", 8 },
};

const char *tqr_gguf_type_name(uint32_t type)
{
	return type < TQR_GGUF_TYPE_COUNT ? value_types[type].name : "unknown";
}

typedef void (*dequant_fn)(const unsigned char *src, uint64_t nblocks, float *dst);

static void dq_f32(const unsigned char *s, uint64_t nb, float *d);
static void dq_f16(const unsigned char *s, uint64_t nb, float *d);
static void dq_bf16(const unsigned char *s, uint64_t nb, float *d);
static void dq_q8_0(const unsigned char *s, uint64_t nb, float *d);
static void dq_q4_0(const unsigned char *s, uint64_t nb, float *d);
static void dq_q4_1(const unsigned char *s, uint64_t nb, float *d);

/* ggml's type_traits (ggml.c): name, elements and bytes per block.  Sizes
 * as ggml defines the blocks; Q8_1 is 36 bytes there (fp16 d and s). */
static const struct {
	const char *name;
	uint32_t blck, bytes;
	dequant_fn dequant;   /* NULL: tqkv-run does not load this type */
} ggml_types[TQR_GGML_TYPE_COUNT] = {
	[0] = { "F32", 1, 4, dq_f32 },       [1] = { "F16", 1, 2, dq_f16 },
	[2] = { "Q4_0", 32, 18, dq_q4_0 },   [3] = { "Q4_1", 32, 20, dq_q4_1 },
	[6] = { "Q5_0", 32, 22, NULL },      [7] = { "Q5_1", 32, 24, NULL },
	[8] = { "Q8_0", 32, 34, dq_q8_0 },   [9] = { "Q8_1", 32, 36, NULL },
	[10] = { "Q2_K", 256, 84, NULL },    [11] = { "Q3_K", 256, 110, NULL },
	[12] = { "Q4_K", 256, 144, NULL },   [13] = { "Q5_K", 256, 176, NULL },
	[14] = { "Q6_K", 256, 210, NULL },   [15] = { "Q8_K", 256, 292, NULL },
	[16] = { "IQ2_XXS", 256, 66, NULL }, [17] = { "IQ2_XS", 256, 74, NULL },
	[18] = { "IQ3_XXS", 256, 98, NULL }, [19] = { "IQ1_S", 256, 50, NULL },
	[20] = { "IQ4_NL", 32, 18, NULL },   [21] = { "IQ3_S", 256, 110, NULL },
	[22] = { "IQ2_S", 256, 82, NULL },   [23] = { "IQ4_XS", 256, 136, NULL },
	[24] = { "I8", 1, 1, NULL },         [25] = { "I16", 1, 2, NULL },
	[26] = { "I32", 1, 4, NULL },        [27] = { "I64", 1, 8, NULL },
	[28] = { "F64", 1, 8, NULL },        [29] = { "IQ1_M", 256, 56, NULL },
	[30] = { "BF16", 1, 2, dq_bf16 },
	[34] = { "TQ1_0", 256, 54, NULL },   [35] = { "TQ2_0", 256, 66, NULL },
	[39] = { "MXFP4", 32, 17, NULL },    [40] = { "NVFP4", 64, 36, NULL },
	[41] = { "Q1_0", 128, 18, NULL },
};

const char *tqr_ggml_type_name(uint32_t type)
{
	return type < TQR_GGML_TYPE_COUNT ? ggml_types[type].name : NULL;
}

uint32_t tqr_ggml_block_elems(uint32_t type)
{
	return type < TQR_GGML_TYPE_COUNT && ggml_types[type].name ? ggml_types[type].blck : 0;
}

uint32_t tqr_ggml_block_bytes(uint32_t type)
{
	return type < TQR_GGML_TYPE_COUNT && ggml_types[type].name ? ggml_types[type].bytes : 0;
}

int tqr_ggml_dequant_supported(uint32_t type)
{
	return type < TQR_GGML_TYPE_COUNT && ggml_types[type].dequant;
}

void tqr_ggml_dequant(uint32_t type, const void *src, uint64_t n, float *dst)
{
	ggml_types[type].dequant(src, n / ggml_types[type].blck, dst);
}

/* ---- dequantizers (one block at a time, any alignment) ------------------------ */

static uint16_t le16(const unsigned char *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void dq_f32(const unsigned char *s, uint64_t nb, float *d)
{
	for (uint64_t i = 0; i < nb; i++) {
		uint32_t u = le32(s + 4 * i);
		memcpy(d + i, &u, 4);
	}
}

static void dq_f16(const unsigned char *s, uint64_t nb, float *d)
{
	for (uint64_t i = 0; i < nb; i++)
		d[i] = tq_f16_to_f32(le16(s + 2 * i));
}

static void dq_bf16(const unsigned char *s, uint64_t nb, float *d)
{
	for (uint64_t i = 0; i < nb; i++)
		d[i] = tq_bf16_to_f32(le16(s + 2 * i));
}

static void dq_q8_0(const unsigned char *s, uint64_t nb, float *d)
{
	for (uint64_t b = 0; b < nb; b++, s += sizeof(struct tqr_block_q8_0), d += TQR_QK) {
		float sc = tq_f16_to_f32(le16(s));
		for (int j = 0; j < TQR_QK; j++)
			d[j] = (float)(int8_t)s[2 + j] * sc;
	}
}

static void dq_q4_0(const unsigned char *s, uint64_t nb, float *d)
{
	for (uint64_t b = 0; b < nb; b++, s += sizeof(struct tqr_block_q4_0), d += TQR_QK) {
		float sc = tq_f16_to_f32(le16(s));
		const unsigned char *q = s + 2;
		for (int j = 0; j < TQR_QK / 2; j++) {
			d[j] = (float)((q[j] & 0x0f) - 8) * sc;
			d[j + TQR_QK / 2] = (float)((q[j] >> 4) - 8) * sc;
		}
	}
}

static void dq_q4_1(const unsigned char *s, uint64_t nb, float *d)
{
	for (uint64_t b = 0; b < nb; b++, s += sizeof(struct tqr_block_q4_1), d += TQR_QK) {
		float sc = tq_f16_to_f32(le16(s)), m = tq_f16_to_f32(le16(s + 2));
		const unsigned char *q = s + 4;
		for (int j = 0; j < TQR_QK / 2; j++) {
			d[j] = (float)(q[j] & 0x0f) * sc + m;
			d[j + TQR_QK / 2] = (float)(q[j] >> 4) * sc + m;
		}
	}
}

/* ---- the parsed file ------------------------------------------------------------ */

struct kv {
	const char *key;
	size_t key_len;
	uint32_t type;
	const unsigned char *val;   /* the value's bytes (an array: its elements) */
	struct tqr_gguf_arr arr;    /* type ARRAY only */
};

struct tqr_gguf {
	const unsigned char *base;
	size_t size;
	int mapped;                 /* 1: munmap(base, size) at free */
	char *name;                 /* for messages */
	uint32_t alignment;
	uint64_t data_off;
	uint64_t n_kv, n_tensors;
	struct kv *kv;                       /* [n_kv] file order */
	struct kv **kv_sorted;               /* [n_kv] by key */
	struct tqr_gguf_tensor *t;           /* [n_tensors] file order */
	struct tqr_gguf_tensor **t_sorted;   /* [n_tensors] by name */
};

void tqr_gguf_free(tqr_gguf *g)
{
	if (!g)
		return;
	if (g->mapped)
		munmap((void *)g->base, g->size);
	free(g->name);
	free(g->kv);
	free(g->kv_sorted);
	free(g->t);
	free(g->t_sorted);
	free(g);
}

uint32_t tqr_gguf_alignment(const tqr_gguf *g) { return g->alignment; }
uint64_t tqr_gguf_data_offset(const tqr_gguf *g) { return g->data_off; }
uint64_t tqr_gguf_n_kv(const tqr_gguf *g) { return g->n_kv; }
uint64_t tqr_gguf_n_tensors(const tqr_gguf *g) { return g->n_tensors; }

/* ---- parsing -------------------------------------------------------------------- */

struct cur {
	const unsigned char *b;
	size_t size, pos;
	const char *name;
	tqr_error *err;
};

static size_t left(const struct cur *c)
{
	return c->size - c->pos;
}

static int truncated(struct cur *c, const char *what, uint64_t idx, size_t need)
{
	return tqr_fail(c->err, -EINVAL, "%s: truncated: %s (#%llu) at offset %zu needs %zu bytes, the file has %zu left",
			c->name, what, (unsigned long long)idx, c->pos, need, left(c));
}

static int rd_u32(struct cur *c, const char *what, uint64_t idx, uint32_t *v)
{
	if (left(c) < 4)
		return truncated(c, what, idx, 4);
	*v = le32(c->b + c->pos);
	c->pos += 4;
	return 0;
}

static int rd_u64(struct cur *c, const char *what, uint64_t idx, uint64_t *v)
{
	if (left(c) < 8)
		return truncated(c, what, idx, 8);
	*v = le64(c->b + c->pos);
	c->pos += 8;
	return 0;
}

static int rd_str(struct cur *c, const char *what, uint64_t idx, const char **s, size_t *n)
{
	uint64_t len = 0;
	int rc;

	if ((rc = rd_u64(c, what, idx, &len)) < 0)
		return rc;
	if (len > left(c))
		return tqr_fail(c->err, -EINVAL, "%s: %s (#%llu): string length %llu at offset %zu is beyond the %zu bytes left in the file",
				c->name, what, (unsigned long long)idx, (unsigned long long)len, c->pos - 8, left(c));
	*s = (const char *)c->b + c->pos;
	*n = (size_t)len;
	c->pos += (size_t)len;
	return 0;
}

/* One value of `type` (not an array) at the cursor, skipped. */
static int skip_value(struct cur *c, uint32_t type, const struct kv *k, uint64_t idx)
{
	if (type == TQR_GGUF_STRING) {
		const char *s;
		size_t n;
		return rd_str(c, "metadata string value", idx, &s, &n);
	}
	uint32_t w = value_types[type].bytes;
	if (left(c) < w)
		return tqr_fail(c->err, -EINVAL, "%s: truncated: metadata '%.*s' (#%llu): a %s value at offset %zu, %zu bytes left",
				c->name, (int)k->key_len, k->key, (unsigned long long)idx, value_types[type].name,
				c->pos, left(c));
	if (type == TQR_GGUF_BOOL && c->b[c->pos] > 1)
		return tqr_fail(c->err, -EINVAL, "%s: metadata '%.*s' (#%llu): bool value %u at offset %zu is not 0 or 1",
				c->name, (int)k->key_len, k->key, (unsigned long long)idx, c->b[c->pos], c->pos);
	c->pos += w;
	return 0;
}

static int parse_kv(struct cur *c, struct kv *k, uint64_t idx)
{
	int rc;

	if ((rc = rd_str(c, "metadata key", idx, &k->key, &k->key_len)) < 0)
		return rc;
	if (k->key_len == 0)
		return tqr_fail(c->err, -EINVAL, "%s: metadata key #%llu at offset %zu is empty", c->name,
				(unsigned long long)idx, c->pos - 8);
	if ((rc = rd_u32(c, "metadata value type", idx, &k->type)) < 0)
		return rc;
	if (k->type >= TQR_GGUF_TYPE_COUNT)
		return tqr_fail(c->err, -EINVAL, "%s: metadata '%.*s' (#%llu): unknown value type %u at offset %zu",
				c->name, (int)k->key_len, k->key, (unsigned long long)idx, k->type, c->pos - 4);
	if (k->type != TQR_GGUF_ARRAY) {
		k->val = c->b + c->pos;
		return skip_value(c, k->type, k, idx);
	}
	struct tqr_gguf_arr *a = &k->arr;
	if ((rc = rd_u32(c, "metadata array element type", idx, &a->type)) < 0)
		return rc;
	if (a->type == TQR_GGUF_ARRAY)
		return tqr_fail(c->err, -EINVAL, "%s: metadata '%.*s' (#%llu): nested arrays are not supported (offset %zu)",
				c->name, (int)k->key_len, k->key, (unsigned long long)idx, c->pos - 4);
	if (a->type >= TQR_GGUF_TYPE_COUNT)
		return tqr_fail(c->err, -EINVAL, "%s: metadata '%.*s' (#%llu): unknown array element type %u at offset %zu",
				c->name, (int)k->key_len, k->key, (unsigned long long)idx, a->type, c->pos - 4);
	if ((rc = rd_u64(c, "metadata array count", idx, &a->count)) < 0)
		return rc;
	/* each element takes at least its width (a string: its 8-byte length) */
	uint32_t w = a->type == TQR_GGUF_STRING ? 8 : value_types[a->type].bytes;
	if (a->count > left(c) / w)
		return tqr_fail(c->err, -EINVAL, "%s: metadata '%.*s' (#%llu): array of %llu %s at offset %zu needs at least %llu bytes, the file has %zu left",
				c->name, (int)k->key_len, k->key, (unsigned long long)idx, (unsigned long long)a->count,
				value_types[a->type].name, c->pos - 8,
				a->count > UINT64_MAX / w ? UINT64_MAX : (unsigned long long)(a->count * w), left(c));
	a->data = c->b + c->pos;
	k->val = a->data;
	for (uint64_t i = 0; i < a->count; i++)
		if ((rc = skip_value(c, a->type, k, idx)) < 0)
			return rc;
	a->bytes = (uint64_t)(c->b + c->pos - a->data);
	return 0;
}

static int name_cmp(const char *a, size_t an, const char *b, size_t bn)
{
	int r = memcmp(a, b, an < bn ? an : bn);
	return r ? r : (an > bn) - (an < bn);
}

static int kv_cmp(const void *x, const void *y)
{
	const struct kv *a = *(const struct kv *const *)x, *b = *(const struct kv *const *)y;
	return name_cmp(a->key, a->key_len, b->key, b->key_len);
}

static int t_name_cmp(const void *x, const void *y)
{
	const struct tqr_gguf_tensor *a = *(const struct tqr_gguf_tensor *const *)x;
	const struct tqr_gguf_tensor *b = *(const struct tqr_gguf_tensor *const *)y;
	return name_cmp(a->name, a->name_len, b->name, b->name_len);
}

static int t_off_cmp(const void *x, const void *y)
{
	const struct tqr_gguf_tensor *a = *(const struct tqr_gguf_tensor *const *)x;
	const struct tqr_gguf_tensor *b = *(const struct tqr_gguf_tensor *const *)y;
	return (a->offset > b->offset) - (a->offset < b->offset);
}

static int parse_tensor(struct cur *c, struct tqr_gguf_tensor *t, uint64_t idx)
{
	int rc;

	if ((rc = rd_str(c, "tensor name", idx, &t->name, &t->name_len)) < 0)
		return rc;
	if (t->name_len == 0)
		return tqr_fail(c->err, -EINVAL, "%s: tensor #%llu: empty name at offset %zu", c->name,
				(unsigned long long)idx, c->pos - 8);
#define TNAME c->name, (int)t->name_len, t->name, (unsigned long long)idx
	if ((rc = rd_u32(c, "tensor n_dims", idx, &t->n_dims)) < 0)
		return rc;
	if (t->n_dims < 1 || t->n_dims > TQR_GGUF_MAX_DIMS)
		return tqr_fail(c->err, -EINVAL, "%s: tensor '%.*s' (#%llu): n_dims %u at offset %zu is outside [1, %d]",
				TNAME, t->n_dims, c->pos - 4, TQR_GGUF_MAX_DIMS);
	t->n_elems = 1;
	for (uint32_t i = 0; i < TQR_GGUF_MAX_DIMS; i++) {
		t->ne[i] = 1;
		if (i < t->n_dims && (rc = rd_u64(c, "tensor dimension", idx, &t->ne[i])) < 0)
			return rc;
		if (t->ne[i] == 0 || t->ne[i] > (uint64_t)INT64_MAX / t->n_elems)
			return tqr_fail(c->err, -EINVAL, "%s: tensor '%.*s' (#%llu): dimension ne[%u] = %llu at offset %zu is zero or makes the element count overflow",
					TNAME, i, (unsigned long long)t->ne[i], c->pos - 8);
		t->n_elems *= t->ne[i];
	}
	if ((rc = rd_u32(c, "tensor type", idx, &t->type)) < 0)
		return rc;
	uint32_t be = tqr_ggml_block_elems(t->type), bb = tqr_ggml_block_bytes(t->type);
	if (!be)
		return tqr_fail(c->err, -EINVAL, "%s: tensor '%.*s' (#%llu): unknown ggml type %u at offset %zu",
				TNAME, t->type, c->pos - 4);
	if (t->ne[0] % be)
		return tqr_fail(c->err, -EINVAL, "%s: tensor '%.*s' (#%llu): ne[0] = %llu is not a multiple of %s's block of %u",
				TNAME, (unsigned long long)t->ne[0], ggml_types[t->type].name, be);
	if (t->n_elems / be > UINT64_MAX / bb)
		return tqr_fail(c->err, -EINVAL, "%s: tensor '%.*s' (#%llu): the size of %llu %s elements overflows 64 bits",
				TNAME, (unsigned long long)t->n_elems, ggml_types[t->type].name);
	t->bytes = t->n_elems / be * bb;
	if ((rc = rd_u64(c, "tensor offset", idx, &t->offset)) < 0)
		return rc;
#undef TNAME
	return 0;
}

static struct kv *kv_lookup(const tqr_gguf *g, const char *key)
{
	size_t n = strlen(key);
	uint64_t lo = 0, hi = g->n_kv;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		int r = name_cmp(g->kv_sorted[mid]->key, g->kv_sorted[mid]->key_len, key, n);
		if (r == 0)
			return g->kv_sorted[mid];
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

int tqr_gguf_parse(tqr_gguf **out, const void *data, size_t size, const char *name, tqr_error *err)
{
	struct cur c = { data, size, 0, name, err };
	tqr_gguf *g = NULL;
	uint32_t version;
	int rc;

	*out = NULL;
	if (size < 4 || le32(c.b) != TQR_GGUF_MAGIC)
		return tqr_fail(err, -EINVAL, "%s: not a GGUF file (no \"GGUF\" magic)", name);
	c.pos = 4;
	if ((rc = rd_u32(&c, "header version", 0, &version)) < 0)
		return rc;
	if (version == 1 || version == 2)
		return tqr_fail(err, -EINVAL, "%s: GGUF version %u: tqkv-run reads GGUF version 3 only (convert the model again with a current llama.cpp)",
				name, version);
	if (version != TQR_GGUF_VERSION)
		return tqr_fail(err, -EINVAL, "%s: GGUF version %u (0x%08x) is not supported: tqkv-run reads version 3%s",
				name, version, version,
				version == 0x03000000u ? " (this looks like a big-endian GGUF)" : "");
	if (!(g = calloc(1, sizeof(*g))) || !(g->name = strdup(name))) {
		rc = tqr_fail(err, -ENOMEM, "%s: out of memory", name);
		goto fail;
	}
	g->base = data;
	g->size = size;
	g->alignment = TQR_GGUF_DEFAULT_ALIGNMENT;
	if ((rc = rd_u64(&c, "header n_tensors", 0, &g->n_tensors)) < 0 ||
	    (rc = rd_u64(&c, "header n_kv", 0, &g->n_kv)) < 0)
		goto fail;
	/* a key/value takes >= 14 bytes (8 + 1 key + 4 type + 1 value); a
	 * tensor >= 33 (8 + 1 name + 4 n_dims + 8 ne + 4 type + 8 offset) */
	if (g->n_kv > left(&c) / 14) {
		rc = tqr_fail(err, -EINVAL, "%s: header n_kv = %llu: %zu bytes cannot hold that many key/values",
			      name, (unsigned long long)g->n_kv, left(&c));
		goto fail;
	}
	if (g->n_tensors > (left(&c) - g->n_kv * 14) / 33) {
		rc = tqr_fail(err, -EINVAL, "%s: header n_tensors = %llu: %zu bytes cannot hold that many tensor descriptions",
			      name, (unsigned long long)g->n_tensors, left(&c));
		goto fail;
	}
	if (!(g->kv = calloc((size_t)g->n_kv + 1, sizeof(*g->kv))) ||
	    !(g->kv_sorted = calloc((size_t)g->n_kv + 1, sizeof(*g->kv_sorted))) ||
	    !(g->t = calloc((size_t)g->n_tensors + 1, sizeof(*g->t))) ||
	    !(g->t_sorted = calloc((size_t)g->n_tensors + 1, sizeof(*g->t_sorted)))) {
		rc = tqr_fail(err, -ENOMEM, "%s: out of memory for %llu key/values and %llu tensors", name,
			      (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors);
		goto fail;
	}
	for (uint64_t i = 0; i < g->n_kv; i++) {
		if ((rc = parse_kv(&c, &g->kv[i], i)) < 0)
			goto fail;
		g->kv_sorted[i] = &g->kv[i];
	}
	qsort(g->kv_sorted, (size_t)g->n_kv, sizeof(*g->kv_sorted), kv_cmp);
	for (uint64_t i = 1; i < g->n_kv; i++)
		if (kv_cmp(&g->kv_sorted[i - 1], &g->kv_sorted[i]) == 0) {
			rc = tqr_fail(err, -EINVAL, "%s: metadata key '%.*s' appears more than once", name,
				      (int)g->kv_sorted[i]->key_len, g->kv_sorted[i]->key);
			goto fail;
		}
	struct kv *al = kv_lookup(g, "general.alignment");
	if (al) {
		if (al->type != TQR_GGUF_U32) {
			rc = tqr_fail(err, -EINVAL, "%s: general.alignment is a %s, not a u32", name,
				      tqr_gguf_type_name(al->type));
			goto fail;
		}
		g->alignment = le32(al->val);
		if (g->alignment == 0 || (g->alignment & (g->alignment - 1))) {
			rc = tqr_fail(err, -EINVAL, "%s: general.alignment = %u is not a power of two", name,
				      g->alignment);
			goto fail;
		}
	}
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		if ((rc = parse_tensor(&c, &g->t[i], i)) < 0)
			goto fail;
		g->t_sorted[i] = &g->t[i];
	}
	qsort(g->t_sorted, (size_t)g->n_tensors, sizeof(*g->t_sorted), t_name_cmp);
	for (uint64_t i = 1; i < g->n_tensors; i++)
		if (t_name_cmp(&g->t_sorted[i - 1], &g->t_sorted[i]) == 0) {
			rc = tqr_fail(err, -EINVAL, "%s: tensor name '%.*s' appears more than once", name,
				      (int)g->t_sorted[i]->name_len, g->t_sorted[i]->name);
			goto fail;
		}

	/* the data section: c.pos rounded up to the alignment (c.pos < 2^63) */
	g->data_off = ((uint64_t)c.pos + g->alignment - 1) & ~(uint64_t)(g->alignment - 1);
	uint64_t data_size = g->data_off <= size ? size - g->data_off : 0;
	if (g->n_tensors && g->data_off > size) {
		rc = tqr_fail(err, -EINVAL, "%s: truncated: the data section would start at offset %llu (aligned to %u), the file has %zu bytes",
			      name, (unsigned long long)g->data_off, g->alignment, size);
		goto fail;
	}
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		struct tqr_gguf_tensor *t = &g->t[i];
		if (t->offset % g->alignment) {
			rc = tqr_fail(err, -EINVAL, "%s: tensor '%.*s': offset %llu is not a multiple of the alignment %u",
				      name, (int)t->name_len, t->name, (unsigned long long)t->offset, g->alignment);
			goto fail;
		}
		if (t->offset > data_size || t->bytes > data_size - t->offset) {
			rc = tqr_fail(err, -EINVAL, "%s: tensor '%.*s': %llu bytes at data offset %llu lie beyond the end of the file (data section: %llu bytes from offset %llu)",
				      name, (int)t->name_len, t->name, (unsigned long long)t->bytes,
				      (unsigned long long)t->offset, (unsigned long long)data_size,
				      (unsigned long long)g->data_off);
			goto fail;
		}
		t->data = g->base + g->data_off + t->offset;
	}
	/* overlaps: in offset order each tensor ends where the next may start */
	qsort(g->t_sorted, (size_t)g->n_tensors, sizeof(*g->t_sorted), t_off_cmp);
	for (uint64_t i = 1; i < g->n_tensors; i++) {
		const struct tqr_gguf_tensor *a = g->t_sorted[i - 1], *b = g->t_sorted[i];
		if (a->offset + a->bytes > b->offset) {
			rc = tqr_fail(err, -EINVAL, "%s: tensors '%.*s' (data offset %llu, %llu bytes) and '%.*s' (data offset %llu) overlap",
				      name, (int)a->name_len, a->name, (unsigned long long)a->offset,
				      (unsigned long long)a->bytes, (int)b->name_len, b->name,
				      (unsigned long long)b->offset);
			goto fail;
		}
	}
	qsort(g->t_sorted, (size_t)g->n_tensors, sizeof(*g->t_sorted), t_name_cmp);
	*out = g;
	return 0;
fail:
	tqr_gguf_free(g);
	return rc;
}

int tqr_gguf_open(tqr_gguf **out, const char *path, tqr_error *err)
{
	struct stat st;
	void *p;
	int fd, rc;

	*out = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return tqr_fail(err, -errno, "%s: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		rc = tqr_fail(err, -errno, "%s: %s", path, strerror(errno));
		close(fd);
		return rc;
	}
	if (!S_ISREG(st.st_mode) || st.st_size < 4 || (uint64_t)st.st_size > SIZE_MAX / 2) {
		close(fd);
		return tqr_fail(err, -EINVAL, "%s: %s", path,
				!S_ISREG(st.st_mode) ? "not a regular file" : "not a GGUF file (too short or too large)");
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	rc = errno;
	close(fd);
	if (p == MAP_FAILED)
		return tqr_fail(err, -rc, "%s: mmap: %s", path, strerror(rc));
	if ((rc = tqr_gguf_parse(out, p, (size_t)st.st_size, path, err)) < 0) {
		munmap(p, (size_t)st.st_size);
		return rc;
	}
	(*out)->mapped = 1;
	return 0;
}

/* ---- lookups ---------------------------------------------------------------------- */

void tqr_gguf_kv_at(const tqr_gguf *g, uint64_t i, const char **key, size_t *key_len, uint32_t *type)
{
	*key = g->kv[i].key;
	*key_len = g->kv[i].key_len;
	*type = g->kv[i].type;
}

int tqr_gguf_find(const tqr_gguf *g, const char *key)
{
	const struct kv *k = kv_lookup(g, key);
	return k ? (int)k->type : -ENOENT;
}

static const struct kv *get(const tqr_gguf *g, const char *key, tqr_error *err)
{
	const struct kv *k = kv_lookup(g, key);

	if (!k)
		tqr_fail(err, -ENOENT, "%s: metadata key %s is missing", g->name, key);
	return k;
}

static int wrong_type(const tqr_gguf *g, const struct kv *k, const char *want, tqr_error *err)
{
	return tqr_fail(err, -EINVAL, "%s: metadata %.*s is a %s, not %s", g->name, (int)k->key_len, k->key,
			tqr_gguf_type_name(k->type), want);
}

/* An integer element of width type at p, as i64 in *v; 1 if it is a u64 above INT64_MAX. */
static int int_at(uint32_t type, const unsigned char *p, int64_t *v)
{
	switch (type) {
	case TQR_GGUF_U8: case TQR_GGUF_BOOL: *v = p[0]; return 0;
	case TQR_GGUF_I8: *v = (int8_t)p[0]; return 0;
	case TQR_GGUF_U16: *v = le16(p); return 0;
	case TQR_GGUF_I16: *v = (int16_t)le16(p); return 0;
	case TQR_GGUF_U32: *v = le32(p); return 0;
	case TQR_GGUF_I32: *v = (int32_t)le32(p); return 0;
	case TQR_GGUF_U64: *v = (int64_t)le64(p); return le64(p) > (uint64_t)INT64_MAX;
	case TQR_GGUF_I64: *v = (int64_t)le64(p); return 0;
	}
	return -1;
}

static int is_int(uint32_t type)
{
	return type <= TQR_GGUF_I32 || type == TQR_GGUF_U64 || type == TQR_GGUF_I64;
}

int tqr_gguf_get_i64(const tqr_gguf *g, const char *key, int64_t *v, tqr_error *err)
{
	const struct kv *k = get(g, key, err);

	if (!k)
		return -ENOENT;
	if (!is_int(k->type))
		return wrong_type(g, k, "an integer", err);
	if (int_at(k->type, k->val, v))
		return tqr_fail(err, -EINVAL, "%s: metadata %s = %llu is out of range", g->name, key,
				(unsigned long long)le64(k->val));
	return 0;
}

int tqr_gguf_get_u32(const tqr_gguf *g, const char *key, uint32_t *v, tqr_error *err)
{
	int64_t x;
	int rc = tqr_gguf_get_i64(g, key, &x, err);

	if (rc < 0)
		return rc;
	if (x < 0 || x > UINT32_MAX)
		return tqr_fail(err, -EINVAL, "%s: metadata %s = %lld is outside [0, %u]", g->name, key,
				(long long)x, UINT32_MAX);
	*v = (uint32_t)x;
	return 0;
}

static double float_at(uint32_t type, const unsigned char *p)
{
	if (type == TQR_GGUF_F32) {
		uint32_t u = le32(p);
		float f;
		memcpy(&f, &u, 4);
		return f;
	}
	uint64_t u = le64(p);
	double d;
	memcpy(&d, &u, 8);
	return d;
}

int tqr_gguf_get_f32(const tqr_gguf *g, const char *key, float *v, tqr_error *err)
{
	const struct kv *k = get(g, key, err);

	if (!k)
		return -ENOENT;
	if (k->type != TQR_GGUF_F32 && k->type != TQR_GGUF_F64)
		return wrong_type(g, k, "a float", err);
	double d = float_at(k->type, k->val);
	if (!isfinite(d) || fabs(d) > 3.4e38)
		return tqr_fail(err, -EINVAL, "%s: metadata %s = %g is not a finite f32", g->name, key, d);
	*v = (float)d;
	return 0;
}

int tqr_gguf_get_bool(const tqr_gguf *g, const char *key, int *v, tqr_error *err)
{
	const struct kv *k = get(g, key, err);

	if (!k)
		return -ENOENT;
	if (k->type != TQR_GGUF_BOOL)
		return wrong_type(g, k, "a bool", err);
	*v = k->val[0];
	return 0;
}

int tqr_gguf_get_str(const tqr_gguf *g, const char *key, const char **s, size_t *n, tqr_error *err)
{
	const struct kv *k = get(g, key, err);

	if (!k)
		return -ENOENT;
	if (k->type != TQR_GGUF_STRING)
		return wrong_type(g, k, "a string", err);
	*n = (size_t)le64(k->val);
	*s = (const char *)k->val + 8;
	return 0;
}

int tqr_gguf_get_arr(const tqr_gguf *g, const char *key, struct tqr_gguf_arr *a, tqr_error *err)
{
	const struct kv *k = get(g, key, err);

	if (!k)
		return -ENOENT;
	if (k->type != TQR_GGUF_ARRAY)
		return wrong_type(g, k, "an array", err);
	*a = k->arr;
	return 0;
}

int tqr_gguf_arr_i64(const struct tqr_gguf_arr *a, uint64_t i, int64_t *v)
{
	if (i >= a->count || a->type == TQR_GGUF_STRING)
		return -EINVAL;
	const unsigned char *p = a->data + i * value_types[a->type].bytes;
	if (a->type == TQR_GGUF_F32 || a->type == TQR_GGUF_F64) {
		double d = float_at(a->type, p);
		if (!(d >= -9.2e18 && d <= 9.2e18))
			return -EINVAL;
		*v = (int64_t)d;
		return 0;
	}
	return int_at(a->type, p, v) ? -EINVAL : 0;
}

int tqr_gguf_arr_f64(const struct tqr_gguf_arr *a, uint64_t i, double *v)
{
	if (i >= a->count || a->type == TQR_GGUF_STRING)
		return -EINVAL;
	const unsigned char *p = a->data + i * value_types[a->type].bytes;
	if (a->type == TQR_GGUF_F32 || a->type == TQR_GGUF_F64) {
		*v = float_at(a->type, p);
		return 0;
	}
	int64_t x;
	if (int_at(a->type, p, &x)) {
		*v = (double)le64(p);
		return 0;
	}
	*v = (double)x;
	return 0;
}

int tqr_gguf_arr_str_next(const struct tqr_gguf_arr *a, uint64_t *cursor, const char **s, size_t *n)
{
	/* the parser checked every length against the array's bytes */
	if (a->type != TQR_GGUF_STRING || *cursor + 8 > a->bytes)
		return -ENOENT;
	uint64_t len = le64(a->data + *cursor);
	*s = (const char *)a->data + *cursor + 8;
	*n = (size_t)len;
	*cursor += 8 + len;
	return 0;
}

const struct tqr_gguf_tensor *tqr_gguf_tensor_at(const tqr_gguf *g, uint64_t i)
{
	return i < g->n_tensors ? &g->t[i] : NULL;
}

const struct tqr_gguf_tensor *tqr_gguf_tensor_find(const tqr_gguf *g, const char *name)
{
	size_t n = strlen(name);
	uint64_t lo = 0, hi = g->n_tensors;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		int r = name_cmp(g->t_sorted[mid]->name, g->t_sorted[mid]->name_len, name, n);
		if (r == 0)
			return g->t_sorted[mid];
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}
