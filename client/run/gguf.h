/* gguf.h — a reader of GGUF v3 files (llama.cpp's model format) for
 * tqkv-run, and the dequantizers of the weight types it loads.
 *
 * File layout (little-endian; "string" = u64 length + bytes, no NUL):
 *   u32 magic "GGUF", u32 version (3), u64 n_tensors, u64 n_kv
 *   n_kv times:      string key, u32 value type, value
 *                    (an array: u32 element type, u64 count, elements)
 *   n_tensors times: string name, u32 n_dims, u64 ne[n_dims], u32 ggml type,
 *                    u64 offset (from the data section, a multiple of the
 *                    alignment)
 *   padding to `general.alignment` (u32, a power of two, default 32)
 *   the data section: the tensors, ne[0] the fastest-varying dimension
 *
 * Every byte is untrusted: each count, length, offset and size is checked
 * against the file's size with overflow-safe arithmetic before it is used
 * or anything is allocated from it; keys and tensor names must be unique;
 * tensors must lie inside the data section without overlapping; nested
 * arrays, unknown value types and unknown ggml types are refused.  GGUF
 * v1 and v2 are refused by name.  Errors name the field and its offset.
 *
 * A tqr_gguf keeps the file mapped (read-only) while it lives; every string,
 * array and tensor pointer it hands out points into that mapping.  It is
 * immutable after parsing and may be shared between threads. */
#ifndef TQR_GGUF_H
#define TQR_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "tqr_util.h"

#define TQR_GGUF_MAGIC            0x46554747u /* "GGUF" read as a little-endian u32 */
#define TQR_GGUF_VERSION          3
#define TQR_GGUF_DEFAULT_ALIGNMENT 32
#define TQR_GGUF_MAX_DIMS         4

/* Metadata value types (the file's numbers; append-only). */
enum tqr_gguf_type {
	TQR_GGUF_U8 = 0, TQR_GGUF_I8 = 1, TQR_GGUF_U16 = 2, TQR_GGUF_I16 = 3,
	TQR_GGUF_U32 = 4, TQR_GGUF_I32 = 5, TQR_GGUF_F32 = 6, TQR_GGUF_BOOL = 7,
	TQR_GGUF_STRING = 8, TQR_GGUF_ARRAY = 9, TQR_GGUF_U64 = 10, TQR_GGUF_I64 = 11,
	TQR_GGUF_F64 = 12,
	TQR_GGUF_TYPE_COUNT
};
const char *tqr_gguf_type_name(uint32_t type); /* "u32", ..., or "unknown" */

/* ggml tensor types (ggml.h's numbers; gaps are types ggml removed). */
enum tqr_ggml_type {
	TQR_GGML_F32 = 0, TQR_GGML_F16 = 1, TQR_GGML_Q4_0 = 2, TQR_GGML_Q4_1 = 3,
	TQR_GGML_Q5_0 = 6, TQR_GGML_Q5_1 = 7, TQR_GGML_Q8_0 = 8, TQR_GGML_Q8_1 = 9,
	TQR_GGML_BF16 = 30,
	TQR_GGML_TYPE_COUNT = 42
};
/* The type's name, or NULL for a number ggml does not define. */
const char *tqr_ggml_type_name(uint32_t type);
/* Elements per block and bytes per block; 0 for an unknown type. */
uint32_t tqr_ggml_block_elems(uint32_t type);
uint32_t tqr_ggml_block_bytes(uint32_t type);

/* ggml's block layouts of the quantized types tqkv-run dequantizes. */
#define TQR_QK 32
struct tqr_block_q8_0 { uint16_t d; int8_t qs[TQR_QK]; };            /* x = q d        */
struct tqr_block_q4_0 { uint16_t d; uint8_t qs[TQR_QK / 2]; };       /* x = (q - 8) d  */
struct tqr_block_q4_1 { uint16_t d, m; uint8_t qs[TQR_QK / 2]; };    /* x = q d + m    */
_Static_assert(sizeof(struct tqr_block_q8_0) == 34, "block_q8_0 is 34 bytes");
_Static_assert(sizeof(struct tqr_block_q4_0) == 18, "block_q4_0 is 18 bytes");
_Static_assert(sizeof(struct tqr_block_q4_1) == 20, "block_q4_1 is 20 bytes");
/* d and m are fp16; in Q4_x element j < 16 is the low nibble of qs[j],
 * element j + 16 its high nibble. */

/* 1 when tqr_ggml_dequant() takes the type: F32, F16, BF16, Q8_0, Q4_0, Q4_1. */
int tqr_ggml_dequant_supported(uint32_t type);
/* Converts n elements (a multiple of the type's block size) at src, which
 * holds n / block_elems blocks (any alignment), to fp32. */
void tqr_ggml_dequant(uint32_t type, const void *src, uint64_t n, float *dst);

typedef struct tqr_gguf tqr_gguf;

/* A tensor of the file.  ne[i] = 1 for i >= n_dims. */
struct tqr_gguf_tensor {
	const char *name;          /* name_len bytes, not NUL-terminated */
	size_t name_len;
	uint32_t n_dims;
	uint32_t type;             /* enum tqr_ggml_type */
	uint64_t ne[TQR_GGUF_MAX_DIMS];
	uint64_t n_elems;
	uint64_t offset;           /* from the data section */
	uint64_t bytes;
	const void *data;          /* into the mapping */
};

/* An array value: `count` elements of `type` (never TQR_GGUF_ARRAY) at data,
 * unaligned.  Strings are packed (u64 length + bytes each): read them in
 * order with tqr_gguf_arr_str_next(). */
struct tqr_gguf_arr {
	uint32_t type;
	uint64_t count;
	const unsigned char *data;
	uint64_t bytes;
};

/* Maps and parses `path`.  -errno of open/mmap, -EINVAL (malformed: the
 * message names the field and its offset), -ENOMEM. */
int tqr_gguf_open(tqr_gguf **out, const char *path, tqr_error *err);
/* Parses size bytes at data (kept, not copied: they must outlive *out).
 * `name` prefixes the messages. */
int tqr_gguf_parse(tqr_gguf **out, const void *data, size_t size, const char *name, tqr_error *err);
void tqr_gguf_free(tqr_gguf *g);

uint32_t tqr_gguf_alignment(const tqr_gguf *g);
uint64_t tqr_gguf_data_offset(const tqr_gguf *g);   /* the data section's start in the file */
uint64_t tqr_gguf_n_kv(const tqr_gguf *g);
uint64_t tqr_gguf_n_tensors(const tqr_gguf *g);

/* The i-th key/value in file order: key (not NUL-terminated), value type. */
void tqr_gguf_kv_at(const tqr_gguf *g, uint64_t i, const char **key, size_t *key_len, uint32_t *type);
/* The value type of `key` (NUL-terminated), or -ENOENT. */
int tqr_gguf_find(const tqr_gguf *g, const char *key);

/* Typed getters: 0, -ENOENT (no such key; the message says so), -EINVAL
 * (another type, or an integer out of the target's range).  get_u32 and
 * get_i64 take any integer type; get_f32 takes f32 and f64 (finite). */
int tqr_gguf_get_u32(const tqr_gguf *g, const char *key, uint32_t *v, tqr_error *err);
int tqr_gguf_get_i64(const tqr_gguf *g, const char *key, int64_t *v, tqr_error *err);
int tqr_gguf_get_f32(const tqr_gguf *g, const char *key, float *v, tqr_error *err);
int tqr_gguf_get_bool(const tqr_gguf *g, const char *key, int *v, tqr_error *err);
int tqr_gguf_get_str(const tqr_gguf *g, const char *key, const char **s, size_t *n, tqr_error *err);
int tqr_gguf_get_arr(const tqr_gguf *g, const char *key, struct tqr_gguf_arr *a, tqr_error *err);

/* Array elements.  arr_i64 / arr_f64: element i (< count) of a numeric array
 * (integers, bool, f32/f64), -EINVAL for a string array.  arr_str_next: the
 * string at *cursor (start at 0), advancing it; -ENOENT past the end. */
int tqr_gguf_arr_i64(const struct tqr_gguf_arr *a, uint64_t i, int64_t *v);
int tqr_gguf_arr_f64(const struct tqr_gguf_arr *a, uint64_t i, double *v);
int tqr_gguf_arr_str_next(const struct tqr_gguf_arr *a, uint64_t *cursor, const char **s, size_t *n);

/* Tensors: by index in file order, or by name (NULL when absent). */
const struct tqr_gguf_tensor *tqr_gguf_tensor_at(const tqr_gguf *g, uint64_t i);
const struct tqr_gguf_tensor *tqr_gguf_tensor_find(const tqr_gguf *g, const char *name);

#endif /* TQR_GGUF_H */
