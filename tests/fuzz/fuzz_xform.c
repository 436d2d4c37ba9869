/* fuzz_xform — a layer's frozen K/V transform statistics as a persistent
 * session's manifest or journal hands them back (kernels/tq_xform.c,
 * tq_xf_blob_read): any bytes are refused with a reason, leaving the
 * transform as it was, or accepted; accepted bytes write back to exactly
 * themselves, and keys, values, queries and outputs through the loaded
 * transform stay finite.  The first 3 bytes pick the session's shape and mode (kv
 * heads 1..4, group 1..4, dim 8..64 in steps of 8, mode: any valid one);
 * the rest is the blob. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "tq_xform.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint32_t n_kv, g, dim, mode;
	tq_xf *xf;
	tq_error err;

	if (size < 3)
		return 0;
	n_kv = 1u + (data[0] & 3u);
	g = 1u + ((data[0] >> 2) & 3u);
	dim = 8u * (1u + (data[1] & 7u));
	mode = data[2] & TQ_XF_MASK;
	if (tq_xf_mode_check(mode, NULL) < 0)
		return 0;
	if (tq_xf_new(&xf, mode, n_kv, n_kv * g, dim, NULL, &err) < 0)
		abort();
	if (tq_xf_blob_read(xf, data + 3, size - 3, &err) < 0) {
		if (!err.msg[0] || tq_xf_calibrated(xf))
			abort(); /* a refusal says why and changes nothing */
	} else {
		size_t n = tq_xf_blob_bytes(xf);
		uint8_t *back = malloc(n ? n : 1);
		float *in = malloc(sizeof(float) * n_kv * g * dim), *out = malloc(sizeof(float) * n_kv * g * dim);
		if (!back || !in || !out || n != size - 3)
			abort();
		tq_xf_blob_write(xf, back);
		if (memcmp(back, data + 3, n))
			abort();
		for (uint32_t i = 0; i < n_kv * g * dim; i++)
			in[i] = (float)((int)(i % 7) - 3);
		tq_xf_keys(xf, in, TQ_DTYPE_F32, 1, out);
		for (uint32_t i = 0; i < n_kv * dim; i++)
			if (!isfinite(out[i]))
				abort();
		tq_xf_values(xf, in, TQ_DTYPE_F32, 1, out);
		for (uint32_t i = 0; i < n_kv * dim; i++)
			if (!isfinite(out[i]))
				abort();
		tq_xf_queries(xf, in, TQ_DTYPE_F32, 1, out);
		tq_xf_output(xf, out, 1);
		for (uint32_t i = 0; i < n_kv * g * dim; i++)
			if (!isfinite(out[i]))
				abort();
		free(back);
		free(in);
		free(out);
	}
	tq_xf_free(xf);
	return 0;
}
