/* kvback_internal.h — what a KV backend of tqkv-run implements (kvback.c
 * holds the exact and local backends, kvback_daemon.c the tqkvd one). */
#ifndef TQR_KVBACK_INTERNAL_H
#define TQR_KVBACK_INTERNAL_H

#include "kvback.h"

struct kv_ops {
	const char *kind;
	/* called with arguments already checked against the geometry and the
	 * layer's length; the caller moves the length on success */
	int (*append_attend)(tqr_kv *kv, int layer, int pos0, int n, const float *q,
			     const float *k, const float *v, float *out, tqr_error *err);
	int (*reset)(tqr_kv *kv, tqr_error *err);
	uint64_t (*resident)(const tqr_kv *kv);   /* 0 = unknown */
	void (*destroy)(tqr_kv *kv);              /* frees priv; may see it half-built */
};

struct tqr_kv {
	const struct kv_ops *ops;
	struct tqr_kv_geom g;
	char name[64];
	int *len;                 /* [n_layers] tokens held per layer */
	uint64_t peak_tokens;
	uint64_t bytes_per_token;
	void *priv;               /* the backend's state */
};

/* A handle with the geometry checked and ops set; priv, name and
 * bytes_per_token are the backend's to fill.  Free with tqr_kv_free. */
int tqr_kv_alloc(tqr_kv **out, const struct tqr_kv_geom *g, const struct kv_ops *ops,
		 tqr_error *err);

#endif /* TQR_KVBACK_INTERNAL_H */
