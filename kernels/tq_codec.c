/* tq_codec.c — the codec traits table, codec handles and path dispatch. */
#include <math.h>
#include <stdlib.h>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#endif

#include "tq_internal.h"

/* The traits table, indexed by the append-only enum tq_codec_id. */
static const struct {
	const char *name;
	int bits;        /* index bits per value (tq*), or element bits */
	int rotated;
} traits[TQ_CODEC__COUNT] = {
	[TQ_CODEC_F16] = { "f16", 16, 0 },
	[TQ_CODEC_Q8]  = { "q8", 8, 1 },
	[TQ_CODEC_Q4A] = { "q4a", 4, 0 },
	[TQ_CODEC_TQ2] = { "tq2", 2, 1 },
	[TQ_CODEC_TQ3] = { "tq3", 3, 1 },
	[TQ_CODEC_TQ4] = { "tq4", 4, 1 },
	[TQ_CODEC_F32] = { "f32", 32, 0 },
	[TQ_CODEC_TQ3O] = { "tq3o", 3, 1 },
	[TQ_CODEC_TQ4O] = { "tq4o", 4, 1 },
};

static int codec_valid(int id)
{
	return id >= 0 && id < TQ_CODEC__COUNT;
}

const char *tq_codec_name(enum tq_codec_id id)
{
	return codec_valid((int)id) ? traits[id].name : "?";
}

int tq_codec_from_name(const char *name)
{
	for (int i = 0; name && i < TQ_CODEC__COUNT; i++)
		if (!strcmp(traits[i].name, name))
			return i;
	return -EINVAL;
}

int tq_codec_bits(enum tq_codec_id id)
{
	return codec_valid((int)id) ? traits[id].bits : -EINVAL;
}

int tq_codec_rotated(enum tq_codec_id id)
{
	return codec_valid((int)id) ? traits[id].rotated : 0;
}

int tq_codec_id_parts(enum tq_codec_id id)
{
	return id == TQ_CODEC_TQ3O || id == TQ_CODEC_TQ4O ? 2 : 1;
}

int tq_dim_check(int dim, tq_error *err)
{
	if (dim < TQ_DIM_MIN || dim > TQ_DIM_MAX || dim % TQ_DIM_ALIGN)
		return tq_fail(err, "head dim %d is not supported (a multiple of %d from %d to %d)",
			       dim, TQ_DIM_ALIGN, TQ_DIM_MIN, TQ_DIM_MAX);
	return 0;
}

long tq_block_bytes(enum tq_codec_id id, int dim, tq_error *err)
{
	int r;

	if (!codec_valid((int)id))
		return tq_fail(err, "unknown codec id %d", (int)id);
	if ((r = tq_dim_check(dim, err)) < 0)
		return r;
	switch (id) {
	case TQ_CODEC_F16: return TQ_F16_BLOCK_BYTES(dim);
	case TQ_CODEC_F32: return TQ_F32_BLOCK_BYTES(dim);
	case TQ_CODEC_Q8:  return TQ_Q8_BLOCK_BYTES(dim);
	case TQ_CODEC_Q4A: return TQ_Q4A_BLOCK_BYTES(dim);
	case TQ_CODEC_TQ2:
	case TQ_CODEC_TQ3:
	case TQ_CODEC_TQ4: return TQ_TQ_BLOCK_BYTES(dim, traits[id].bits);
	case TQ_CODEC_TQ3O:
	case TQ_CODEC_TQ4O:
		if (dim % TQ_TQO_DIM_ALIGN)
			return tq_fail(err, "codec %s needs a head dim that is a multiple of %d (got %d)",
				       traits[id].name, TQ_TQO_DIM_ALIGN, dim);
		return TQ_TQO_BLOCK_BYTES(dim, traits[id].bits);
	default: break;
	}
	return tq_fail(err, "unknown codec id %d", (int)id);
}

const char *tq_dtype_name(enum tq_dtype t)
{
	switch (t) {
	case TQ_DTYPE_F32: return "f32";
	case TQ_DTYPE_F16: return "f16";
	case TQ_DTYPE_BF16: return "bf16";
	}
	return "?";
}

size_t tq_dtype_size(enum tq_dtype t)
{
	switch (t) {
	case TQ_DTYPE_F32: return 4;
	case TQ_DTYPE_F16:
	case TQ_DTYPE_BF16: return 2;
	}
	return 0;
}

const char *tq_isa_name(enum tq_isa isa)
{
	switch (isa) {
	case TQ_ISA_AUTO: return "auto";
	case TQ_ISA_SCALAR: return "scalar";
	case TQ_ISA_AVX2: return "avx2";
	case TQ_ISA_AVX512: return "avx512";
	case TQ_ISA_NEON: return "neon";
	}
	return "?";
}

int tq_isa_from_name(const char *name)
{
	static const enum tq_isa all[] = { TQ_ISA_AUTO, TQ_ISA_SCALAR, TQ_ISA_AVX2, TQ_ISA_AVX512,
					   TQ_ISA_NEON };

	for (size_t i = 0; name && i < sizeof(all) / sizeof(all[0]); i++)
		if (!strcmp(tq_isa_name(all[i]), name))
			return (int)all[i];
	return -EINVAL;
}

int tq_isa_supported(enum tq_isa isa)
{
	switch (isa) {
	case TQ_ISA_AUTO:
	case TQ_ISA_SCALAR:
		return 1;
#if defined(__x86_64__)
	case TQ_ISA_AVX2:
		return tq_codec_ops_avx2() && __builtin_cpu_supports("avx2") &&
		       __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
		       __builtin_cpu_supports("bmi2");
	case TQ_ISA_AVX512:
		return tq_codec_ops_avx512() && tq_isa_supported(TQ_ISA_AVX2) &&
		       __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
#if defined(__aarch64__)
	case TQ_ISA_NEON:
		/* Advanced SIMD is architecturally mandatory for Linux on
		 * aarch64; the hwcap says so all the same.  Only baseline
		 * instructions are used (no fp16 arithmetic, no dot product). */
#if defined(__linux__)
		return tq_codec_ops_neon() && (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#else
		return tq_codec_ops_neon() != NULL;
#endif
#endif
	default:
		return 0;
	}
}

enum tq_isa tq_isa_best(void)
{
	/* TQ_ISA=scalar|avx2|avx512|neon caps the choice (for tests and
	 * triage); naming the best path (or one this CPU lacks) changes
	 * nothing. */
	const char *cap = getenv("TQ_ISA");
	enum tq_isa best = TQ_ISA_SCALAR;

	if (tq_isa_supported(TQ_ISA_AVX2))
		best = TQ_ISA_AVX2;
	if (tq_isa_supported(TQ_ISA_AVX512))
		best = TQ_ISA_AVX512;
	if (tq_isa_supported(TQ_ISA_NEON))
		best = TQ_ISA_NEON;
	if (cap && !strcmp(cap, "scalar"))
		best = TQ_ISA_SCALAR;
	else if (cap && !strcmp(cap, "avx2") && best == TQ_ISA_AVX512)
		best = TQ_ISA_AVX2; /* enum order is not rank: NEON (4) is no x86 path */
	return best;
}

static const struct tq_codec_ops *ops_for(enum tq_isa isa)
{
	switch (isa) {
	case TQ_ISA_AVX2: return tq_codec_ops_avx2();
	case TQ_ISA_AVX512: return tq_codec_ops_avx512();
	case TQ_ISA_NEON: return tq_codec_ops_neon();
	default: return &tq_codec_ops_scalar;
	}
}

static int codebook_get(tq_cache *cache, int dim, int bits, tq_codebook *out, tq_error *err)
{
	const tq_codebook *cb;
	int r;

	if (!cache)
		return tq_codebook_solve(out, dim, bits, err);
	if ((r = tq_cache_get(cache, dim, bits, &cb, err)) < 0)
		return r;
	*out = *cb;
	return 0;
}

int tq_codec_new(tq_codec **out, tq_cache *cache, const struct tq_codec_params *p, tq_error *err)
{
	tq_codec *c;
	long bb;
	int r;
	enum tq_isa isa;

	*out = NULL;
	if ((bb = tq_block_bytes(p->id, p->dim, err)) < 0)
		return (int)bb;
	isa = p->isa == TQ_ISA_AUTO ? tq_isa_best() : p->isa;
	if (!tq_isa_supported(isa))
		return tq_fail(err, "instruction set %s is not available on this CPU or build",
			       tq_isa_name(isa));
	c = calloc(1, sizeof(*c));
	if (!c)
		goto nomem;
	c->id = p->id;
	c->dim = p->dim;
	c->bits = traits[p->id].bits;
	c->block_bytes = (uint32_t)bb;
	c->seed = p->seed;
	/* tq3o / tq4o: every SIMD path has an encoder and a decoder (power-
	 * of-two halves; the reference takes the rest); attention decodes
	 * their tiles itself (tq_attn*.c) */
	c->ops = ops_for(isa);
	c->rot.dim = p->dim;
	c->rot.kind = TQ_ROT_NONE;
	c->rot_b.kind = TQ_ROT_NONE;
	if (tq_codec_id_parts(p->id) == 2) {
		c->half = p->dim / 2;
		if ((r = tq_rotation_init(&c->rot, c->half, p->seed, err)) < 0 ||
		    (r = tq_rotation_init(&c->rot_b, c->half, p->seed ^ TQ_TQO_SEED_XOR, err)) < 0 ||
		    (r = codebook_get(cache, c->half, c->bits + 1, &c->cb, err)) < 0 ||
		    (r = codebook_get(cache, c->half, c->bits - 1, &c->cb_b, err)) < 0)
			goto fail;
	} else {
		if (traits[p->id].rotated && (r = tq_rotation_init(&c->rot, p->dim, p->seed, err)) < 0)
			goto fail;
		if ((p->id == TQ_CODEC_TQ2 || p->id == TQ_CODEC_TQ3 || p->id == TQ_CODEC_TQ4) &&
		    (r = codebook_get(cache, p->dim, c->bits, &c->cb, err)) < 0)
			goto fail;
	}
	if (c->ops->prepare && !(c->isa_ctx = c->ops->prepare(c)))
		goto nomem;
	*out = c;
	return 0;
nomem:
	r = -ENOMEM;
	if (err)
		snprintf(err->msg, sizeof(err->msg), "codec: out of memory");
fail:
	tq_codec_free(c);
	return r;
}

void tq_codec_free(tq_codec *c)
{
	if (!c)
		return;
	tq_rotation_destroy(&c->rot);
	tq_rotation_destroy(&c->rot_b);
	free(c->isa_ctx);
	free(c);
}

enum tq_codec_id tq_codec_id(const tq_codec *c) { return c->id; }
int tq_codec_dim(const tq_codec *c) { return c->dim; }
size_t tq_codec_block_bytes(const tq_codec *c) { return c->block_bytes; }
enum tq_isa tq_codec_isa(const tq_codec *c) { return c->ops->isa; }

static double cb_shrink(const tq_codebook *cb)
{
	/* distortion is per coordinate of a unit vector: cb->dim of them */
	double D = cb->distortion * cb->dim;

	return D > 0 && D < 1 ? sqrt(1.0 - D) : 1.0;
}

double tq_codec_shrink(const tq_codec *c)
{
	if (!tq_codec_rotated(c->id) || c->cb.bits < 1)
		return 1.0;
	if (c->half) /* the halves' mean */
		return 0.5 * (cb_shrink(&c->cb) + cb_shrink(&c->cb_b));
	return cb_shrink(&c->cb);
}

double tq_codec_shrink_at(const tq_codec *c, int j)
{
	if (c->half)
		return cb_shrink(j < c->half ? &c->cb : &c->cb_b);
	return tq_codec_shrink(c);
}

int tq_codec_parts(const tq_codec *c) { return c->half ? 2 : 1; }

int tq_encode(const tq_codec *c, const void *src, enum tq_dtype dtype, size_t n, void *dst,
	      tq_error *err)
{
	return c->ops->encode(c, src, dtype, n, dst, err);
}

int tq_decode(const tq_codec *c, const void *src, size_t n, float *dst)
{
	return c->ops->decode(c, src, n, dst);
}

int tq_encode_ref(const tq_codec *c, const void *src, enum tq_dtype dtype, size_t n, void *dst,
		  tq_error *err)
{
	return tq_codec_ops_scalar.encode(c, src, dtype, n, dst, err);
}

int tq_decode_ref(const tq_codec *c, const void *src, size_t n, float *dst)
{
	return tq_codec_ops_scalar.decode(c, src, n, dst);
}

void tq_rotate(const tq_codec *c, const float *x, float *y)
{
	tq_rotation_apply(&c->rot, x, y);
	if (c->half)
		tq_rotation_apply(&c->rot_b, x + c->half, y + c->half);
}

void tq_unrotate(const tq_codec *c, const float *y, float *x)
{
	tq_rotation_inverse(&c->rot, y, x);
	if (c->half)
		tq_rotation_inverse(&c->rot_b, y + c->half, x + c->half);
}

/* ---- element conversions ----------------------------------------------------- */

float tq_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
	float f;

	if (exp == 0x1f) {
		bits = sign | 0x7f800000u | (man << 13);
	} else if (exp == 0) {
		/* zero or subnormal: man * 2^-24, exact in float */
		f = (float)man * 0x1.0p-24f;
		memcpy(&bits, &f, 4);
		bits |= sign;
	} else {
		bits = sign | ((exp + 112u) << 23) | (man << 13);
	}
	memcpy(&f, &bits, 4);
	return f;
}

/* tq_f16_to_f32 without branches (the exponent's three cases selected):
 * normal  (e in 1..30): bits << 13 with the exponent rebased by 127 - 15;
 * Inf/NaN (e = 31): rebased once more, to 255;
 * zero / subnormal (e = 0): the mantissa as a float of exponent 2^-14's
 *   ulp, by (magic + m) - magic, exact. */
static inline float f16_to_f32_nb(uint16_t h)
{
	const uint32_t em = (uint32_t)(h & 0x7fffu) << 13, sign = (uint32_t)(h & 0x8000u) << 16;
	const uint32_t e = em & 0x0f800000u, magic_bits = 113u << 23;
	uint32_t sub = em + magic_bits, bits;
	float fs, magic, f;

	memcpy(&fs, &sub, 4);
	memcpy(&magic, &magic_bits, 4);
	fs -= magic;
	memcpy(&sub, &fs, 4);
	/* masks, not branches: every case computed, one kept */
	const uint32_t special = 0u - (uint32_t)(e == 0x0f800000u), zero = 0u - (uint32_t)(e == 0);
	bits = ((em + (224u << 23)) & special) | (sub & zero) | ((em + (112u << 23)) & ~(special | zero));
	bits |= sign;
	memcpy(&f, &bits, 4);
	return f;
}

/* Blocks of a constant length, so that -O2's cheap vectorizer takes the
 * loops (no epilogue to cost), then the tail element by element. */
#define ROW_BLOCK 32u

void tq_to_f32(const void *src, enum tq_dtype dtype, size_t n, float *dst)
{
	const uint16_t *h = src;
	size_t i = 0;

	switch (dtype) {
	case TQ_DTYPE_F16:
		for (; i + ROW_BLOCK <= n; i += ROW_BLOCK)
			for (size_t j = 0; j < ROW_BLOCK; j++)
				dst[i + j] = f16_to_f32_nb(h[i + j]);
		for (; i < n; i++)
			dst[i] = f16_to_f32_nb(h[i]);
		break;
	case TQ_DTYPE_BF16:
		for (; i + ROW_BLOCK <= n; i += ROW_BLOCK)
			for (size_t j = 0; j < ROW_BLOCK; j++)
				dst[i + j] = tq_bf16_to_f32(h[i + j]);
		for (; i < n; i++)
			dst[i] = tq_bf16_to_f32(h[i]);
		break;
	default:
		memcpy(dst, src, n * sizeof(float));
		break;
	}
}

/* exponent all ones: Inf or NaN.  Whole blocks are OR-reduced (the
 * compiler vectorizes it); the block that has one, or the tail, is looked
 * at element by element. */
#define NF_BLOCK 128u
#define NF_SCAN(T, mask)                                                    \
	do {                                                                \
		const T *x = src;                                           \
		size_t b = 0;                                               \
		for (; b + NF_BLOCK <= n; b += NF_BLOCK) {                  \
			T any = 0;                                          \
			for (size_t i = 0; i < NF_BLOCK; i++)               \
				any |= (T)((x[b + i] & (mask)) == (mask));  \
			if (any)                                            \
				break;                                      \
		}                                                           \
		for (size_t i = b; i < n; i++)                              \
			if ((x[i] & (mask)) == (mask))                      \
				return (long)i;                             \
	} while (0)

long tq_first_nonfinite(const void *src, enum tq_dtype dtype, size_t n)
{
	switch (dtype) {
	case TQ_DTYPE_F16: NF_SCAN(uint16_t, 0x7c00u); break;
	case TQ_DTYPE_BF16: NF_SCAN(uint16_t, 0x7f80u); break;
	default: NF_SCAN(uint32_t, 0x7f800000u); break;
	}
	return -1;
}

uint16_t tq_f32_to_f16(float f)
{
	uint32_t x, sign, exp, man;

	memcpy(&x, &f, 4);
	sign = (x >> 16) & 0x8000u;
	exp = (x >> 23) & 0xffu;
	man = x & 0x7fffffu;
	if (exp == 0xff) /* inf / nan (quiet) */
		return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
	int e = (int)exp - 127 + 15;
	if (e >= 0x1f)
		return (uint16_t)(sign | 0x7c00u);
	if (e <= 0) {
		/* subnormal half (or zero): shift the full mantissa, round to even */
		if (e < -10)
			return (uint16_t)sign;
		uint32_t m = man | 0x800000u;
		int shift = 14 - e;
		uint32_t half = m >> shift, rem = m & ((1u << shift) - 1u), mid = 1u << (shift - 1);
		if (rem > mid || (rem == mid && (half & 1u)))
			half++;
		return (uint16_t)(sign | half);
	}
	uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (half & 1u)))
		half++; /* may carry into the exponent, up to inf: correct */
	return (uint16_t)half;
}

uint16_t tq_f32_to_bf16(float f)
{
	uint32_t x;

	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

int tq_row_to_f32(const void *src, enum tq_dtype dtype, int dim, float *dst, int *bad)
{
	const uint16_t *h = src;

	switch (dtype) {
	case TQ_DTYPE_F32:
		memcpy(dst, src, sizeof(float) * (size_t)dim);
		break;
	case TQ_DTYPE_F16:
		for (int i = 0; i < dim; i++)
			dst[i] = tq_f16_to_f32(h[i]);
		break;
	case TQ_DTYPE_BF16:
		for (int i = 0; i < dim; i++)
			dst[i] = tq_bf16_to_f32(h[i]);
		break;
	default:
		*bad = -1;
		return -EINVAL;
	}
	for (int i = 0; i < dim; i++)
		if (!isfinite(dst[i])) {
			*bad = i;
			return -EINVAL;
		}
	return 0;
}
