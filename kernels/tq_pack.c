/* tq_pack.c — index planes of any width 1..8 (layout in tq_layout.h). */
#include "tq_internal.h"

/* Plane widths of a `bits`-bit index, widest (lowest bits) first. */
static int plane_widths(int bits, int w[3])
{
	int n = 0;

	if (bits == 8) {
		w[n++] = 8;
		return n;
	}
	for (int p = 4; p >= 1; p >>= 1)
		if (bits & p)
			w[n++] = p;
	return n;
}

/* Eight plane bytes at a time in 64-bit words: shifting a word of eight
 * indices right by `shift` and masking each byte's low w bits takes their
 * bits [shift, shift + w) (shift + w <= 8: nothing from the next byte
 * survives the mask), and the shift into place, s*w, stays inside the byte
 * (s*w + w <= 8). */
void tq_pack_planes(const uint8_t *idx, int dim, int bits, uint8_t *out)
{
	int w[3], np = plane_widths(bits, w), shift = 0;

	for (int p = 0; p < np; p++) {
		const int k = 8 / w[p], stride = dim / k;
		const unsigned mask = (1u << w[p]) - 1u;
		const uint64_t m8 = (uint64_t)mask * 0x0101010101010101ull;
		int j = 0;

		for (; j + 8 <= stride; j += 8) {
			uint64_t word = 0;
			for (int s = 0; s < k; s++) {
				uint64_t x;
				memcpy(&x, idx + j + s * stride, 8);
				word |= ((x >> shift) & m8) << (s * w[p]);
			}
			memcpy(out + j, &word, 8);
		}
		for (; j < stride; j++) {
			unsigned byte = 0;
			for (int s = 0; s < k; s++)
				byte |= ((unsigned)(idx[j + s * stride] >> shift) & mask) << (s * w[p]);
			out[j] = (uint8_t)byte;
		}
		out += stride;
		shift += w[p];
	}
}

/* Unpacking likewise: a plane byte j holds value
 * j + s*stride at bits [s*w, s*w + w); shifting a word by s*w and masking
 * each byte's low w bits takes eight of them (bits shifted in from the next
 * byte are masked off, s*w + w <= 8); the shift into place stays inside
 * the byte (shift + w <= 8).  The attention's tile decoders use it too. */
void tq_unpack_planes(const uint8_t *in, int dim, int bits, uint8_t *idx)
{
	int w[3], np = plane_widths(bits, w), shift = 0;

	memset(idx, 0, (size_t)dim);
	for (int p = 0; p < np; p++) {
		const int k = 8 / w[p], stride = dim / k;
		const unsigned mask = (1u << w[p]) - 1u;
		const uint64_t m8 = (uint64_t)mask * 0x0101010101010101ull;

		for (int s = 0; s < k; s++) {
			uint8_t *o = idx + s * stride;
			int j = 0;
			for (; j + 8 <= stride; j += 8) {
				uint64_t x, y;
				memcpy(&x, in + j, 8);
				memcpy(&y, o + j, 8);
				y |= ((x >> (s * w[p])) & m8) << shift;
				memcpy(o + j, &y, 8);
			}
			for (; j < stride; j++)
				o[j] |= (uint8_t)(((in[j] >> (s * w[p])) & mask) << shift);
		}
		in += stride;
		shift += w[p];
	}
}

float tq_sumsq16(const float *x, int n)
{
	float l[16] = { 0 };

	for (int i = 0; i < n; i++) {
		float sq = x[i] * x[i];
		l[i & 15] = l[i & 15] + sq;
	}
	for (int w = 8; w >= 1; w >>= 1)
		for (int i = 0; i < w; i++)
			l[i] = l[i] + l[i + w];
	return l[0];
}
