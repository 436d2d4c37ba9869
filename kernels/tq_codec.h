/* tq_codec.h — the TurboQuant codec family: the public interface of kernels/.
 *
 * A codec handle (tq_codec) binds a codec id, a head dim and a rotation seed;
 * it owns its codebook and rotation, is immutable after tq_codec_new(), and
 * may be used from any number of threads at once.  Codebooks are solved in
 * double precision (Lloyd–Max on the exact marginal of one coordinate of a
 * uniform unit vector in R^dim) and can be shared through a tq_cache.
 *
 * Errors: functions return 0 (or a count) on success and a negative errno on
 * failure; when `err` is not NULL it receives a one-line message.  Nothing
 * here logs, allocates behind the caller's back after creation, or keeps
 * mutable global state (the CPU feature probe is a read-only fact).
 *
 * Block layouts are in tq_layout.h.
 */
#ifndef TQ_CODEC_H
#define TQ_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tq_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tq_error {
	char msg[200];
} tq_error;

/* Element types of input vectors (output is always fp32). */
enum tq_dtype {
	TQ_DTYPE_F32  = 0,
	TQ_DTYPE_F16  = 1,
	TQ_DTYPE_BF16 = 2,
};

/* Instruction-set paths.  AUTO picks the best the CPU supports. */
enum tq_isa {
	TQ_ISA_AUTO   = 0,
	TQ_ISA_SCALAR = 1, /* portable C: the reference, and the fallback elsewhere */
	TQ_ISA_AVX2   = 2, /* AVX2 + FMA + F16C */
	TQ_ISA_AVX512 = 3, /* AVX-512 F/BW/DQ/VL */
	TQ_ISA_NEON   = 4, /* aarch64 Advanced SIMD (ARMv8.0) */
};

/* ---- codec ids ---------------------------------------------------------- */
const char *tq_codec_name(enum tq_codec_id id);          /* "tq4"; "?" if unknown */
int tq_codec_from_name(const char *name);                /* id, or -EINVAL        */
int tq_codec_bits(enum tq_codec_id id);                  /* index bits (tq*), 8 (q8), 4 (q4a), 16, 32 */
int tq_codec_rotated(enum tq_codec_id id);               /* 1 if blocks live in a rotated frame */
/* 2 for the outlier codecs (tq3o, tq4o: two halves of dim/2, each its own
 * TurboQuant vector; tq_layout.h), 1 for the others. */
int tq_codec_id_parts(enum tq_codec_id id);
/* Bytes of one block; -EINVAL when the codec or dim is unsupported. */
long tq_block_bytes(enum tq_codec_id id, int dim, tq_error *err);
/* 0 if dim is a supported head dim (multiple of 8 in [8, 512]; of 16 for
 * tq3o / tq4o, checked by tq_block_bytes), else -EINVAL. */
int tq_dim_check(int dim, tq_error *err);

const char *tq_dtype_name(enum tq_dtype t);
size_t tq_dtype_size(enum tq_dtype t);                   /* 0 if unknown */
const char *tq_isa_name(enum tq_isa isa);
/* "auto", "scalar", "avx2", "avx512", "neon" to the enum; -EINVAL if unknown. */
int tq_isa_from_name(const char *name);
/* The best ISA this CPU runs (never AUTO). */
enum tq_isa tq_isa_best(void);
/* 1 if this CPU (and this build) can run `isa`. */
int tq_isa_supported(enum tq_isa isa);

/* ---- codebooks -----------------------------------------------------------
 * Lloyd–Max codebook for one coordinate of a uniform unit vector in R^dim:
 * density f(x) ∝ (1 - x^2)^((dim-3)/2) on [-1, 1].  dim in [8, 512] (any
 * integer), bits in [1, 8].  Deterministic: the same bits on every machine. */
typedef struct tq_codebook {
	int dim;
	int bits;
	int levels;              /* 2^bits                                        */
	float centroid[256];     /* [levels], ascending, symmetric                */
	float bound[255];        /* [levels-1], bound[i] = (c[i] + c[i+1]) / 2    */
	double distortion;       /* E[(x - c(x))^2] per coordinate, in double     */
	double centroid_d[256];  /* the double-precision solution                 */
	float h16_scale;         /* levels <= 32: the scale at which centroid[]   */
				 /* comes closest to FP16 numbers (the GPU's       */
				 /* decode tables); 1 for more levels              */
} tq_codebook;

int tq_codebook_solve(tq_codebook *cb, int dim, int bits, tq_error *err);

/* A thread-safe cache of solved codebooks.  Codecs created with a cache
 * copy what they need, so a cache may be freed while codecs still live. */
typedef struct tq_cache tq_cache;
tq_cache *tq_cache_new(void);
void tq_cache_free(tq_cache *cache);
/* The cached codebook for (dim, bits); solved on first use.  The pointer
 * stays valid until tq_cache_free(). */
int tq_cache_get(tq_cache *cache, int dim, int bits, const tq_codebook **out, tq_error *err);

/* ---- codecs ---------------------------------------------------------------- */
#define TQ_TQO_SEED_XOR 0x5851f42d4c957f2dull
typedef struct tq_codec tq_codec;

struct tq_codec_params {
	enum tq_codec_id id;
	int dim;
	uint64_t seed;           /* rotation seed (ignored by unrotated codecs) */
	enum tq_isa isa;         /* TQ_ISA_AUTO unless a test pins a path       */
};

/* cache may be NULL (the codebook is then solved privately). */
int tq_codec_new(tq_codec **out, tq_cache *cache, const struct tq_codec_params *p, tq_error *err);
void tq_codec_free(tq_codec *c);

enum tq_codec_id tq_codec_id(const tq_codec *c);
int tq_codec_dim(const tq_codec *c);
size_t tq_codec_block_bytes(const tq_codec *c);
enum tq_isa tq_codec_isa(const tq_codec *c);
/* The expected factor by which a decoded vector's component along the
 * original shrinks: for the norm-corrected TurboQuant codecs, decoded
 * x̂ = |x| ĉ/|ĉ| with <c, ĉ> ≈ |ĉ|² = 1 − D (Lloyd–Max), so
 * E[q·x̂] ≈ sqrt(1 − D) q·x, D = dim × the codebook's per-coordinate
 * distortion (tq4 at d = 64: 0.9954; tq3 0.983; tq2 0.941).  1 for the
 * codecs that keep values as given (q8, q4a, f16, f32).  tq_xform.h's
 * TQ_XF_UNSHRINK divides it back out. */
double tq_codec_shrink(const tq_codec *c);
/* The same factor for coordinate j of the codec's input: the two halves of
 * tq3o / tq4o have their own (tq4o at d = 64: 0.9989 for the 5-bit half,
 * 0.983 for the 3-bit one); tq_codec_shrink() elsewhere. */
double tq_codec_shrink_at(const tq_codec *c, int j);
/* tq_codec_id_parts of the codec's id. */
int tq_codec_parts(const tq_codec *c);

/* Encode n vectors.  src: [n][dim] of `dtype`; dst: [n][block_bytes].
 * A vector with a NaN or Inf (or, for f16, a value beyond fp16 range) fails
 * the call with -EINVAL (-ERANGE for the fp16 range) naming the vector and
 * element: blocks before it are written, nothing is written for it or after
 * it.  A zero vector encodes to a block that decodes to zeros. */
int tq_encode(const tq_codec *c, const void *src, enum tq_dtype dtype, size_t n,
	      void *dst, tq_error *err);
/* Decode n blocks to fp32.  src: [n][block_bytes]; dst: [n][dim]. */
int tq_decode(const tq_codec *c, const void *src, size_t n, float *dst);

/* The scalar reference twins: the same contract and the same output bits as
 * tq_encode / tq_decode on every path (see docs/ARCHITECTURE.md). */
int tq_encode_ref(const tq_codec *c, const void *src, enum tq_dtype dtype, size_t n,
		  void *dst, tq_error *err);
int tq_decode_ref(const tq_codec *c, const void *src, size_t n, float *dst);

/* The codec's rotation: y = R x and x = R^T y, [dim] floats, out of place.
 * Identity for unrotated codecs (q4a, f16, f32).  tq3o / tq4o: block
 * diagonal, the first half's rotation (of dim/2, the codec's seed) on
 * x[0, dim/2) and the second half's (seed ^ TQ_TQO_SEED_XOR) on the rest. */
void tq_rotate(const tq_codec *c, const float *x, float *y);
void tq_unrotate(const tq_codec *c, const float *y, float *x);

/* ---- element conversions (exact where the format allows) ------------------- */
float tq_f16_to_f32(uint16_t h);
uint16_t tq_f32_to_f16(float f);      /* round to nearest even; overflow -> inf */
static inline float tq_bf16_to_f32(uint16_t h) /* exact; inline: the key scorers call it per token */
{
	const uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}
uint16_t tq_f32_to_bf16(float f);     /* round to nearest even */
/* n elements of dtype (f32, f16, bf16) to float: tq_f16_to_f32's and
 * tq_bf16_to_f32's bits, a row at a time and branch-free (the compiler
 * vectorizes it; the data path converts every query and K/V row). */
void tq_to_f32(const void *src, enum tq_dtype dtype, size_t n, float *dst);
/* The index of the first of n elements of dtype that is Inf or NaN, or -1:
 * by their exponent bits (what isfinite says of the converted value), in
 * blocks the compiler vectorizes before looking for the element. */
long tq_first_nonfinite(const void *src, enum tq_dtype dtype, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* TQ_CODEC_H */
