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

void tq_pack_planes(const uint8_t *idx, int dim, int bits, uint8_t *out)
{
	int w[3], np = plane_widths(bits, w), shift = 0;

	for (int p = 0; p < np; p++) {
		int k = 8 / w[p], stride = dim / k;
		unsigned mask = (1u << w[p]) - 1u;

		for (int j = 0; j < stride; j++) {
			unsigned byte = 0;
			for (int s = 0; s < k; s++)
				byte |= ((unsigned)(idx[j + s * stride] >> shift) & mask) << (s * w[p]);
			out[j] = (uint8_t)byte;
		}
		out += stride;
		shift += w[p];
	}
}

void tq_unpack_planes(const uint8_t *in, int dim, int bits, uint8_t *idx)
{
	int w[3], np = plane_widths(bits, w), shift = 0;

	for (int i = 0; i < dim; i++)
		idx[i] = 0;
	for (int p = 0; p < np; p++) {
		int k = 8 / w[p], stride = dim / k;
		unsigned mask = (1u << w[p]) - 1u;

		for (int j = 0; j < stride; j++)
			for (int s = 0; s < k; s++)
				idx[j + s * stride] |= (uint8_t)(((in[j] >> (s * w[p])) & mask) << shift);
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
