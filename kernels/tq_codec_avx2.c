/* tq_codec_avx2.c — AVX2 codec paths (bit-identical to tq_codec_ref.c). */
#include "tq_internal.h"

const struct tq_codec_ops *tq_codec_ops_avx2(void)
{
	return NULL; /* filled in by the SIMD implementation */
}
