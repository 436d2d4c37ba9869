/* tq_codec_avx2.c — AVX2 codec paths (bit-identical to tq_codec_ref.c). */
#include "tq_internal.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
static int enc(const tq_codec *c, const void *src, enum tq_dtype dtype, size_t n, void *dst, tq_error *err)
{
	return tq_encode_ref(c, src, dtype, n, dst, err);
}
static int dec(const tq_codec *c, const void *src, size_t n, float *dst)
{
	return tq_decode_ref(c, src, n, dst);
}
static const struct tq_codec_ops ops = { TQ_ISA_AVX2, enc, dec };
const struct tq_codec_ops *tq_codec_ops_avx2(void)
{
	return &ops;
}
#else
const struct tq_codec_ops *tq_codec_ops_avx2(void)
{
	return NULL;
}
#endif
