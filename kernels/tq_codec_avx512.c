/* tq_codec_avx512.c — AVX-512 codec paths (bit-identical to tq_codec_ref.c). */
#include "tq_internal.h"

const struct tq_codec_ops *tq_codec_ops_avx512(void)
{
	return NULL; /* filled in by the SIMD implementation */
}
