/* tq_neon.h — NEON helpers shared by tq_codec_neon.c and tq_attn_neon.c:
 * a tq3o / tq4o half's index planes unpacked in registers.  Include only
 * from aarch64 builds (inside their __aarch64__ blocks); kernels/ internal,
 * not installed. */
#ifndef TQ_NEON_H
#define TQ_NEON_H

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

/* Indices [j0, j0 + 16) of a half of h values (h a power of two) from its
 * planes (tq_layout.h): plane p (width w, stride S = h w / 8 bytes) holds
 * index j's bits in byte j mod S at bit w (j / S).  Planes of fewer than
 * 16 bytes are copied out (nothing past them is read) and spread by tbl. */
static inline __attribute__((always_inline)) uint8x16_t tq_neon_unpack16(const uint8_t *planes, const int h, const int bits, int j0)
{
	static const uint8_t iota[16] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 };
	uint8x16_t q = vdupq_n_u8(0);

	_Pragma("GCC unroll 3")
	for (int w = 4, sh = 0; w >= 1; w >>= 1) {
		if (!(bits & w))
			continue;
		const int S = h * w / 8, lgS = __builtin_ctz((unsigned)S), lgw = __builtin_ctz((unsigned)w);
		uint8x16_t b;
		int8x16_t cnt; /* negative: right shifts */
		if (S >= 16) {
			b = vld1q_u8(planes + (j0 & (S - 1)));
			cnt = vdupq_n_s8((int8_t)-(w * (j0 / S)));
		} else {
			uint8_t tmp[16] = { 0 };
			memcpy(tmp, planes, (size_t)S);
			const uint8x16_t io = vld1q_u8(iota);
			b = vqtbl1q_u8(vld1q_u8(tmp), vandq_u8(io, vdupq_n_u8((uint8_t)(S - 1))));
			/* j0 + i < 256: h <= TQ_DIM_MAX / 2 */
			const uint8x16_t sl = vshlq_u8(vshlq_u8(vaddq_u8(io, vdupq_n_u8((uint8_t)j0)),
								vdupq_n_s8((int8_t)-lgS)),
						       vdupq_n_s8((int8_t)lgw));
			cnt = vnegq_s8(vreinterpretq_s8_u8(sl));
		}
		const uint8x16_t v = vandq_u8(vshlq_u8(b, cnt), vdupq_n_u8((uint8_t)((1 << w) - 1)));
		q = vorrq_u8(q, vshlq_u8(v, vdupq_n_s8((int8_t)sh)));
		planes += S;
		sh += w;
	}
	return q;
}

#endif /* TQ_NEON_H */
