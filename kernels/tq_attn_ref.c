/* tq_attn_ref.c — the oracle for tq_attend: every K and V block decoded to
 * fp32 with tq_decode_ref (so in the original frame), then exact softmax
 * attention with double accumulators.  Slow and obviously correct; it is what
 * every fused path is tested against (tests/unit/test_attn.c).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tq_attn_internal.h"

int tq_attend_ref(const struct tq_attn_params *p, tq_error *err)
{
	struct tqa_shape sh;
	int rc = tqa_validate(p, &sh, err);

	if (rc || p->n_q == 0)
		return rc;

	const int d = sh.dim, H = sh.n_kv, G = sh.group;
	const uint32_t T = sh.kv_len;
	const struct tq_page_geom *g = &p->kv->geom;
	float *k = malloc(((size_t)H * T + 1) * d * sizeof(float));   /* [H][T][d] */
	float *v = malloc(((size_t)H * T + 1) * d * sizeof(float));   /* [H][T][d] */
	double *sc = malloc(((size_t)T + 1) * sizeof(double));        /* [T]       */
	double *acc = malloc((size_t)d * sizeof(double));              /* [d]       */
	float *q = malloc((size_t)d * sizeof(float));                  /* [d]       */

	if (!k || !v || !sc || !acc || !q) {
		rc = -ENOMEM;
		goto out;
	}
	for (int h = 0; h < H; h++)
		for (uint32_t t = 0; t < T; t++) {
			const uint8_t *pg = p->kv->pages[t / g->page_tokens];
			uint32_t slot = t % g->page_tokens;
			tq_decode_ref(p->k_codec, pg + tq_page_k_off(g, (uint32_t)h, slot), 1,
				      k + ((size_t)h * T + t) * d);
			tq_decode_ref(p->v_codec, pg + tq_page_v_off(g, (uint32_t)h, slot), 1,
				      v + ((size_t)h * T + t) * d);
		}

	for (int i = 0; i < p->n_q; i++) {
		uint32_t n_vis = p->causal ? (uint32_t)p->q_pos[i] + 1 : T;
		for (int hq = 0; hq < p->n_q_heads; hq++) {
			size_t row = (size_t)i * p->n_q_heads + hq;
			float *o = p->out + row * d;
			int h = hq / G;

			if (n_vis == 0) { /* empty cache, no mask: nothing to attend */
				memset(o, 0, (size_t)d * sizeof(float));
				continue;
			}
			tqa_q_row(p, d, row, q);
			double mx = -INFINITY;
			for (uint32_t t = 0; t < n_vis; t++) {
				const float *kt = k + ((size_t)h * T + t) * d;
				double s = 0.0;
				for (int j = 0; j < d; j++)
					s += (double)q[j] * (double)kt[j];
				sc[t] = s * (double)sh.scale;
				if (sc[t] > mx)
					mx = sc[t];
			}
			double l = 0.0;
			memset(acc, 0, (size_t)d * sizeof(double));
			for (uint32_t t = 0; t < n_vis; t++) {
				double w = exp(sc[t] - mx);
				const float *vt = v + ((size_t)h * T + t) * d;
				l += w;
				for (int j = 0; j < d; j++)
					acc[j] += w * (double)vt[j];
			}
			for (int j = 0; j < d; j++)
				o[j] = (float)(acc[j] / l);
		}
	}
out:
	free(k);
	free(v);
	free(sc);
	free(acc);
	free(q);
	if (rc == -ENOMEM && err)
		snprintf(err->msg, sizeof(err->msg), "attention (ref): out of memory");
	return rc;
}
