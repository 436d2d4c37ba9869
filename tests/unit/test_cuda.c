/* test_cuda — the GPU kernels (tq_cuda.h) against the CPU references.
 *
 *   encoder:   tqc_append writes the bytes of tq_encode_ref for every codec,
 *              input dtype and a spread of head dims (Hadamard and dense
 *              rotations), with zero, tiny (q8's subnormal max), huge,
 *              signed-zero (q4a's min), rounding-tie and codebook-bound-tie
 *              vectors, several KV heads, tokens across page boundaries,
 *              inputs in host, device and unified memory, several launches;
 *              NaN/Inf and out-of-range vectors: the right errno, token,
 *              side, head and element;
 *   attention: tqc_attend against tq_attend_ref on the same pages (encoded
 *              on the CPU and copied, or appended on the GPU), every K/V
 *              codec pair, head dims 64 / 96 / 128 / 256, GQA 1 / 4 / 8,
 *              contexts that are and are not page multiples, pages in
 *              device and in unified memory, decode (causal or not), causal
 *              prefill, split-K over a long context, query dtypes, logits
 *              beyond float range (NaN rows), errors with the CPU path's
 *              messages.
 * Without a usable GPU (or in a build without CUDA) it says why and exits
 * 77 (skipped). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tietest.h"
#include "tq_attn.h"
#include "tq_cuda.h"
#include "tq_cuda_internal.h"
#include "tq_internal.h"

#define TOL 1e-3   /* max |gpu - oracle| per output row, relative to the row's norm */

/* TQ_CUDA_QUICK=1 (tests/integration/cuda_simt.sh, on the CPU emulator):
 * the longest cases shortened — 8 prefill queries instead of 128 (GQA 4
 * only), split-K over 2000 tokens instead of 20000, the codec pairs at d 64
 * (d 96 once), contexts up to 1000, a 2100-token append in launches of
 * 1000 (TQ_CUDA_ENC_PASS) instead of 40,000 in launches of 32768. */
static int quick;

static tq_cache *cache;
static tqc_ctx *ctx;
static tqc_ctx *gctx;    /* TQ_CUDA_ENC=general: the general encoder only */
static tqc_ctx *sctx;    /* TQ_CUDA_SPLIT_MIN=256: splits as short as 256 keys */
static tqc_ctx *lctx;    /* TQ_CUDA_SPLIT_MIN=2^20: one split (a warp's many tiles) */
static tqc_ctx *pctx;    /* TQ_CUDA_ENC_PASS=1000: appends of 1000 tokens a launch */
static tqc_ctx *enc_ctx; /* append_both's: ctx, or gctx */
static int enc_general_only; /* TQ_CUDA_ENC=general: ctx runs the general encoder */
static int dev;

static const enum tq_codec_id all_codecs[] = {
	TQ_CODEC_F16, TQ_CODEC_Q8, TQ_CODEC_Q4A, TQ_CODEC_TQ2, TQ_CODEC_TQ3, TQ_CODEC_TQ4, TQ_CODEC_F32,
	TQ_CODEC_TQ3O, TQ_CODEC_TQ4O,
};
#define N_CODECS 9
static const enum tq_dtype dtypes[] = { TQ_DTYPE_F32, TQ_DTYPE_F16, TQ_DTYPE_BF16 };

/* ---- memory on the device ------------------------------------------------------- */

/* MEM_REGISTERED: host memory pinned by tqc_host_register (as tqkvd pins a
 * client's arena); the loops over the first three leave it out */
enum mem { MEM_HOST = 0, MEM_DEVICE = 1, MEM_UNIFIED = 2, MEM_REGISTERED = 3 };
static const char *mem_name[] = { "host", "device", "unified", "registered" };

struct buf {
	enum mem kind;
	void *p;
	size_t bytes;
};

/* A buffer of `bytes` of kind `kind`, holding a copy of src (if any). */
static int buf_new(struct buf *b, enum mem kind, size_t bytes, const void *src)
{
	char why[200];

	b->kind = kind;
	b->bytes = bytes;
	b->p = NULL;
	if (kind == MEM_HOST || kind == MEM_REGISTERED) {
		const size_t n = (bytes + 4095) & ~(size_t)4095;
		b->p = kind == MEM_HOST ? malloc(bytes ? bytes : 1) : aligned_alloc(4096, n ? n : 4096);
		if (b->p && src)
			memcpy(b->p, src, bytes);
		if (!b->p)
			return -ENOMEM;
		if (kind == MEM_REGISTERED && tqc_host_register(dev, b->p, n ? n : 4096, why, sizeof(why)) < 0) {
			fprintf(stderr, "  register %zu bytes: %s\n", n, why);
			free(b->p);
			b->p = NULL;
			return -EIO;
		}
		return 0;
	}
	int rc = tqc_region_alloc(dev, bytes ? bytes : 1, kind == MEM_UNIFIED, &b->p, why, sizeof(why));
	if (rc) {
		fprintf(stderr, "  region of %zu bytes: %s\n", bytes, why);
		return rc;
	}
	if (src && tqc_copy(dev, b->p, src, bytes, why, sizeof(why))) {
		fprintf(stderr, "  copy: %s\n", why);
		return -EIO;
	}
	return 0;
}

static void buf_free(struct buf *b)
{
	if (b->kind == MEM_REGISTERED && b->p)
		tqc_host_unregister(dev, b->p);
	if (b->kind == MEM_HOST || b->kind == MEM_REGISTERED)
		free(b->p);
	else if (b->p)
		tqc_region_free(dev, b->p, b->kind == MEM_UNIFIED);
	b->p = NULL;
}

/* Copy a buffer (any kind) to host memory. */
static int buf_read(const struct buf *b, void *dst, size_t bytes)
{
	char why[200];

	if (tqc_copy(dev, dst, b->p, bytes, why, sizeof(why))) {
		fprintf(stderr, "  copy back: %s\n", why);
		return -EIO;
	}
	return 0;
}

/* ---- a layer's pages: host copies (the CPU's view) and device pages ----------- */

struct layer {
	tq_codec *kc, *vc;
	int dim;
	struct tq_page_geom g;
	uint32_t n_pages;
	size_t page_bytes;
	uint8_t **hpages;               /* [n_pages] host pages (aligned)            */
	struct buf dmem;                /* the device pages, back to back            */
	const uint8_t **dpages;         /* [n_pages] device addresses                */
	struct tq_page_table ht, dt;    /* host / device tables                      */
};

static void layer_free(struct layer *L)
{
	if (L->hpages)
		for (uint32_t i = 0; i < L->n_pages; i++)
			free(L->hpages[i]);
	free(L->hpages);
	free(L->dpages);
	buf_free(&L->dmem);
	tq_codec_free(L->kc);
	tq_codec_free(L->vc);
	memset(L, 0, sizeof(*L));
}

/* Codecs, geometry and n_pages pages on both sides, every byte 0xA5. */
static int layer_new(struct layer *L, enum tq_codec_id kid, enum tq_codec_id vid, int dim, int n_kv,
		     uint32_t page_tokens, uint32_t n_pages, uint64_t seed, enum mem kind)
{
	struct tq_codec_params kp = { .id = kid, .dim = dim, .seed = seed ^ 0x1111 };
	struct tq_codec_params vp = { .id = vid, .dim = dim, .seed = seed ^ 0x2222 };
	tq_error err;

	memset(L, 0, sizeof(*L));
	L->dmem.kind = MEM_HOST;
	L->dim = dim;
	if (tq_codec_new(&L->kc, cache, &kp, &err) || tq_codec_new(&L->vc, cache, &vp, &err)) {
		fprintf(stderr, "  codec: %s\n", err.msg);
		return -EINVAL;
	}
	L->g.n_kv_heads = (uint32_t)n_kv;
	L->g.page_tokens = page_tokens;
	L->g.k_block_bytes = (uint32_t)tq_codec_block_bytes(L->kc);
	L->g.v_block_bytes = (uint32_t)tq_codec_block_bytes(L->vc);
	L->n_pages = n_pages;
	L->page_bytes = tq_page_bytes(&L->g);
	L->hpages = calloc(n_pages + 1, sizeof(*L->hpages));
	L->dpages = calloc(n_pages + 1, sizeof(*L->dpages));
	if (!L->hpages || !L->dpages)
		return -ENOMEM;
	uint8_t *junk = malloc(L->page_bytes * (n_pages ? n_pages : 1));
	if (!junk)
		return -ENOMEM;
	memset(junk, 0xA5, L->page_bytes * (n_pages ? n_pages : 1));
	int rc = buf_new(&L->dmem, kind, L->page_bytes * (n_pages ? n_pages : 1), junk);
	free(junk);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < n_pages; i++) {
		if (!(L->hpages[i] = aligned_alloc(TQ_PAGE_ALIGN, L->page_bytes)))
			return -ENOMEM;
		memset(L->hpages[i], 0xA5, L->page_bytes);
		L->dpages[i] = (const uint8_t *)L->dmem.p + (size_t)i * L->page_bytes;
	}
	L->ht.pages = (const uint8_t *const *)L->hpages;
	L->dt.pages = L->dpages;
	L->ht.n_pages = L->dt.n_pages = n_pages;
	L->ht.geom = L->dt.geom = L->g;
	return 0;
}

static void layer_set_len(struct layer *L, uint32_t n_tokens)
{
	L->ht.n_tokens = L->dt.n_tokens = n_tokens;
}

/* Host pages -> device pages. */
static int layer_upload(struct layer *L)
{
	char why[200];

	for (uint32_t i = 0; i < L->n_pages; i++)
		if (tqc_copy(dev, (void *)L->dpages[i], L->hpages[i], L->page_bytes, why, sizeof(why))) {
			fprintf(stderr, "  upload: %s\n", why);
			return -EIO;
		}
	return 0;
}

/* Device pages -> host pages. */
static int layer_download(struct layer *L)
{
	char why[200];

	for (uint32_t i = 0; i < L->n_pages; i++)
		if (tqc_copy(dev, L->hpages[i], L->dpages[i], L->page_bytes, why, sizeof(why))) {
			fprintf(stderr, "  download: %s\n", why);
			return -EIO;
		}
	return 0;
}

/* A failing vector's block is zeroed by the encoder, never left with the
 * slot's earlier bytes (another session's, in a pool): the blocks (slot, 0
 * K / 1 V, KV head) of bl are all zero on the device; 0, or how many are
 * not (-1: a copy failed).  They get 0xA5 again for the next call. */
static int failed_blocks_zeroed(struct layer *L, const uint32_t (*bl)[3], int n)
{
	int dirty = 0;

	if (layer_download(L))
		return -1;
	for (int i = 0; i < n; i++) {
		const uint32_t slot = bl[i][0], pi = slot / L->g.page_tokens, sl = slot % L->g.page_tokens;
		const uint64_t off = bl[i][1] ? tq_page_v_off(&L->g, bl[i][2], sl) : tq_page_k_off(&L->g, bl[i][2], sl);
		const uint32_t bytes = bl[i][1] ? L->g.v_block_bytes : L->g.k_block_bytes;
		uint8_t *b = L->hpages[pi] + off;
		for (uint32_t j = 0; j < bytes; j++)
			if (b[j]) {
				dirty++;
				break;
			}
		memset(b, 0xA5, bytes);
	}
	return layer_upload(L) ? -1 : dirty;
}

/* ---- inputs ----------------------------------------------------------------------- */

static uint64_t rng_state;
static double urand(void)
{
	rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
	return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}
static float gauss(void)
{
	double u = urand() + 1e-12, v = urand();
	return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}
static uint32_t urand_u32(void)
{
	return (uint32_t)(urand() * 4294967296.0);
}

static void put_row(void *row, enum tq_dtype dt, const float *x, int dim)
{
	for (int i = 0; i < dim; i++) {
		if (dt == TQ_DTYPE_F32)
			memcpy((uint8_t *)row + 4 * (size_t)i, &x[i], 4);
		else {
			uint16_t h = dt == TQ_DTYPE_F16 ? tq_f32_to_f16(x[i]) : tq_f32_to_bf16(x[i]);
			memcpy((uint8_t *)row + 2 * (size_t)i, &h, 2);
		}
	}
}

/* tietest.h's draws */
static uint64_t rnd_u64(void *unused)
{
	return urand_u32();
}

/* Vector kind k: Gaussian, outliers, tiny, huge, zero, subnormal (q8's
 * subnormal max), signed zeros (q4a's min is a zero), q4a rounding ties,
 * fp16 rounding ties and range edge, codebook-bound ties. */
static void gen_vec(int kind, float *x, int dim, enum tq_dtype dt, const tq_codec *c)
{
	enum tq_codec_id id = tq_codec_id(c);
	int narrow = dt == TQ_DTYPE_F16 || id == TQ_CODEC_F16 || id == TQ_CODEC_Q4A;
	double amp = 1.0;

	switch (kind % 13) {
	case 0: case 1:
		break;
	case 2:
		amp = 1e-3;
		break;
	case 3:
		amp = narrow ? 1000.0 : 1e15;
		break;
	case 4:
		amp = dt == TQ_DTYPE_F16 ? 1e-5 : 1e-19;       /* squares underflow */
		break;
	case 5:
		amp = dt == TQ_DTYPE_F16 ? 1e-7 : 1e-39;       /* subnormal inputs and max */
		break;
	case 6:
		memset(x, 0, sizeof(float) * (size_t)dim);
		return;
	case 7: /* signed zeros and non-negative values (or, every other time, non-positive) */
		for (int i = 0; i < dim; i++) {
			uint32_t u = urand_u32();
			x[i] = (u & 3) == 0 ? 0.0f : (u & 3) == 1 ? -0.0f : (float)(u >> 12) * 0x1p-20f;
		}
		if (urand() < 0.5)
			for (int i = 0; i < dim; i++)
				x[i] = -x[i];
		return;
	case 8: /* q4a ties: min -1, max 14: scale 1, values k + 0.5 */
		for (int i = 0; i < dim; i++)
			x[i] = -1.0f + (float)(urand_u32() % 15) + 0.5f;
		x[0] = -1.0f;
		x[dim - 1] = 14.0f;
		return;
	case 9: { /* fp16 rounding ties and the edge of its range */
		static const float t[] = { 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0x1p-25f, 3 * 0x1p-25f,
					   65504.0f, 65519.0f, -65519.0f, 0x1p-14f, 0x1.ffcp-15f };
		for (int i = 0; i < dim; i++) {
			uint32_t u = urand_u32();
			x[i] = t[u % 9] * ((u >> 8) & 1 ? -1.0f : 1.0f) * (dt == TQ_DTYPE_BF16 ? 0.25f : 1.0f);
		}
		return;
	}
	case 10: /* a rotated coordinate exactly on a codebook bound */
		if (id >= TQ_CODEC_TQ2 && id <= TQ_CODEC_TQ4 && dt == TQ_DTYPE_F32 && tie_make(c, rnd_u64, NULL, x))
			return;
		break;
	case 11: /* one huge lane, the rest small: the norm is that lane */
		for (int i = 0; i < dim; i++)
			x[i] = gauss() * 1e-3f;
		x[urand_u32() % (uint32_t)dim] = narrow ? 3000.0f : 1e18f;
		return;
	default: /* outlier channels */
		for (int i = 0; i < dim; i++)
			x[i] = gauss() * (i % 17 == 3 ? 80.0f : 1.0f);
		return;
	}
	for (int i = 0; i < dim; i++)
		x[i] = (float)(gauss() * amp);
	if (kind % 13 == 1)
		for (int i = 0; i < dim; i += 7)
			x[i] = (float)(gauss() * 100.0);
}

/* A row of `dtype` for codec c that the reference encodes without error. */
static void good_row(int kind, uint8_t *row, int dim, enum tq_dtype dt, const tq_codec *c)
{
	float x[TQ_DIM_MAX];
	uint8_t blk[TQ_F32_BLOCK_BYTES(TQ_DIM_MAX)];

	gen_vec(kind, x, dim, dt, c);
	put_row(row, dt, x, dim);
	for (int tries = 0; tq_encode_ref(c, row, dt, 1, blk, NULL) != 0 && tries < 8; tries++) {
		gen_vec(0, x, dim, dt, c);
		put_row(row, dt, x, dim);
	}
}

/* ---- the encoder ----------------------------------------------------------------- */

/* Appends n tokens at pos with the GPU (inputs of kind `mem`) and with the CPU
 * reference into the host pages; the device pages must then equal the host
 * pages, byte for byte (unused slots keep their junk on both sides).
 * k, v: [n][n_kv][dim] of dt.  Returns 0 when equal. */
/* Bytes by which append_both misaligns the inputs it hands tqc_append
 * (the kernel reads rows at any alignment; an aligned row takes one load
 * per element, any other byte loads). */
static int enc_skew;

static int append_both(struct layer *L, uint32_t pos, uint32_t n, const uint8_t *k, const uint8_t *v,
		       enum tq_dtype dt, enum mem mem, const char *what)
{
	const size_t row = tq_dtype_size(dt) * (size_t)L->dim, tok = row * L->g.n_kv_heads;
	struct buf kb, vb;
	tq_error err;
	uint32_t bad = 0;
	int rc = -1;

	for (uint32_t t = 0; t < n; t++)
		for (uint32_t h = 0; h < L->g.n_kv_heads; h++) {
			uint32_t s = pos + t, pg = s / L->g.page_tokens, sl = s % L->g.page_tokens;
			if (tq_encode_ref(L->kc, k + t * tok + h * row, dt, 1, L->hpages[pg] + tq_page_k_off(&L->g, h, sl),
					  &err) ||
			    tq_encode_ref(L->vc, v + t * tok + h * row, dt, 1, L->hpages[pg] + tq_page_v_off(&L->g, h, sl),
					  &err)) {
				fprintf(stderr, "  %s: reference: %s\n", what, err.msg);
				return -1;
			}
		}
	const size_t sk = (size_t)enc_skew;
	uint8_t *ks = malloc(n * tok + sk + 1), *vs = malloc(n * tok + sk + 1);
	if (!ks || !vs) {
		free(ks);
		free(vs);
		return -1;
	}
	memcpy(ks + sk, k, n * tok);
	memcpy(vs + sk, v, n * tok);
	if (buf_new(&kb, mem, n * tok + sk, ks)) {
		free(ks);
		free(vs);
		return -1;
	}
	if (buf_new(&vb, mem, n * tok + sk, vs)) {
		buf_free(&kb);
		free(ks);
		free(vs);
		return -1;
	}
	free(ks);
	free(vs);
	struct tqc_append a = { .k_codec = L->kc, .v_codec = L->vc, .kv = &L->dt, .pos = pos, .n = n,
				.k = (uint8_t *)kb.p + sk, .v = (uint8_t *)vb.p + sk, .dtype = dt };
	int r = tqc_append(enc_ctx, &a, &bad, &err);
	if (r) {
		fprintf(stderr, "  %s: tqc_append: rc %d bad %u: %s\n", what, r, bad, err.msg);
		goto out;
	}
	uint8_t *got = malloc(L->page_bytes);
	rc = 0;
	for (uint32_t i = 0; i < L->n_pages && !rc; i++) {
		if (buf_read(&(struct buf){ .p = (void *)L->dpages[i] }, got, L->page_bytes)) {
			rc = -1;
			break;
		}
		if (memcmp(got, L->hpages[i], L->page_bytes)) {
			size_t b = 0;
			while (got[b] == L->hpages[i][b])
				b++;
			uint64_t vo = tq_page_v_offset(&L->g);
			int side = b >= vo;
			uint64_t rel = side ? b - vo : b, bb = side ? L->g.v_block_bytes : L->g.k_block_bytes;
			uint64_t blk = rel / bb;
			fprintf(stderr,
				"  %s: page %u differs at byte %zu (%s head %llu slot %llu, block byte %llu): gpu %02x cpu %02x\n",
				what, i, b, side ? "V" : "K", (unsigned long long)(blk / L->g.page_tokens),
				(unsigned long long)(blk % L->g.page_tokens), (unsigned long long)(rel % bb), got[b],
				L->hpages[i][b]);
			rc = -1;
		}
	}
	free(got);
out:
	buf_free(&kb);
	buf_free(&vb);
	return rc;
}

/* One encoder case on enc_ctx: a layer of K kid / V vid at dim (3 KV heads,
 * 5-token pages), 13 tokens of rows of every kind gen_vec makes appended at
 * slot 3 by append_both, then, with `one`, a single token after them (a
 * decode token's launch).  *ran: the kernel of the first append.  0 when
 * the device pages equal the reference's. */
static int enc_case(enum tq_codec_id kid, enum tq_codec_id vid, int dim, enum tq_dtype dt, enum mem mem,
		    uint64_t seed, int one, const char **ran, const char *what)
{
	const int n_kv = 3;
	const uint32_t n = 13, pos = 3, pt = 5;
	struct layer L;

	if (layer_new(&L, kid, vid, dim, n_kv, pt, (pos + n + 1 + pt - 1) / pt, seed, MEM_DEVICE)) {
		layer_free(&L);
		fprintf(stderr, "  %s: layer\n", what);
		return -1;
	}
	const size_t row = tq_dtype_size(dt) * (size_t)dim;
	uint8_t *k = malloc(row * n * n_kv), *v = malloc(row * n * n_kv);
	for (uint32_t i = 0; i < n * (uint32_t)n_kv; i++) {
		good_row((int)i, k + i * row, dim, dt, L.kc);
		good_row((int)i + 5, v + i * row, dim, dt, L.vc);
	}
	int rc = append_both(&L, pos, n, k, v, dt, mem, what);
	*ran = tqc_ctx_last_append(enc_ctx);
	if (!rc && one)
		rc = append_both(&L, pos + n, 1, k + row * n_kv * 7, v + row * n_kv * 2, dt, mem, what);
	free(k);
	free(v);
	layer_free(&L);
	return rc;
}

/* Does the register encoder (tqc_append's "reg" kernel) take this pair and
 * dim with aligned inputs?  Power-of-two dims rotate by Hadamard. */
static int enc_reg_takes(enum tq_codec_id k, enum tq_codec_id v, int dim)
{
	const enum tq_codec_id c[2] = { k, v };

	if (dim != 64 && dim != 128 && dim != 256)
		return 0;
	for (int i = 0; i < 2; i++)
		if (c[i] != TQ_CODEC_Q8 && c[i] != TQ_CODEC_TQ2 && c[i] != TQ_CODEC_TQ3 && c[i] != TQ_CODEC_TQ4 &&
		    c[i] != TQ_CODEC_TQ3O && c[i] != TQ_CODEC_TQ4O)
			return 0;
	return 1;
}

/* Every codec (K side; a rotating other codec on the V side) x input dtype x
 * head dim, 13 tokens at slot 3 of 5-token pages, 3 KV heads, inputs in
 * host, device or unified memory: once with aligned rows on ctx (the
 * register encoder where it applies), once on gctx (TQ_CUDA_ENC=general)
 * with rows 0, 1 or 2 bytes off.  Each case checks which kernel ran. */
static void test_encode_exact(void)
{
	static const int dims[] = { 8, 64, 96, 128, 256, 512, 40 };
	int cases = 0, reg = 0;

	for (int pass = 0; pass < 2; pass++) {
		rng_state = t_seed();
		enc_ctx = pass ? gctx : ctx;
		for (int ci = 0; ci < N_CODECS; ci++)
			for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++)
				for (int ti = 0; ti < 3; ti++) {
					const enum tq_codec_id kid = all_codecs[ci];
					/* tq*o takes multiples of 16: 8 -> 16, 40 -> 48
					 * (halves of 8, Hadamard, and of 24, dense) */
					const int dim = dims[di] + (tq_codec_id_parts(kid) == 2 && dims[di] % 16 ? 8 : 0);
					enum tq_codec_id vid = all_codecs[(ci + 1 + (int)di + ti) % N_CODECS];
					if (tq_codec_id_parts(vid) == 2 && dim % 16)
						vid = TQ_CODEC_TQ3;
					const enum tq_dtype dt = dtypes[ti];
					const enum mem mem = (enum mem)((ci + di + ti) % 3);
					const char *want = !pass && !enc_general_only && enc_reg_takes(kid, vid, dim) ? "reg" : "general";
					const char *ran = "";
					char what[160];

					enc_skew = pass ? (ci + (int)di + 2 * ti) % 3 : 0; /* bytes off */
					snprintf(what, sizeof(what),
						 "K %s V %s d %d %s input in %s memory, %d bytes off, %s kernel",
						 tq_codec_name(kid), tq_codec_name(vid), dim, tq_dtype_name(dt),
						 mem_name[mem], enc_skew, want);
					if (enc_case(kid, vid, dim, dt, mem, t_seed() + ci * 31 + di, 0, &ran, what))
						T_FAIL("%s", what);
					if (strcmp(ran, want))
						T_FAIL("%s: ran the %s kernel", what, ran);
					reg += !strcmp(want, "reg");
					cases++;
				}
	}
	enc_skew = 0;
	enc_ctx = ctx;
	fprintf(stderr, "    %d codec x dim x dtype cases byte-identical (%d on the register kernel; the general "
			"one with inputs at every alignment)\n", cases, reg);
}

/* The register encoder on every pair it takes: K and V each of tq2..tq4 /
 * q8 / tq3o / tq4o, head dims 64 / 128 / 256, every input dtype, inputs in host, device
 * or unified memory; rows of every kind gen_vec makes (zeros, squares that
 * underflow, subnormal maxima, huge lanes, signed zeros, ...). */
static void test_encode_reg(void)
{
	static const enum tq_codec_id reg_codecs[] = { TQ_CODEC_TQ2, TQ_CODEC_TQ3,  TQ_CODEC_TQ4,
						       TQ_CODEC_Q8,  TQ_CODEC_TQ3O, TQ_CODEC_TQ4O };
	enum { NR = sizeof(reg_codecs) / sizeof(reg_codecs[0]) };
	static const int dims[] = { 64, 128, 256 };
	const char *want = enc_general_only ? "general" : "reg";
	int cases = 0;

	rng_state = t_seed() ^ 0x5e9;
	for (int ki = 0; ki < NR; ki++)
		for (int vi = 0; vi < NR; vi++)
			for (int di = 0; di < 3; di++)
				for (int ti = 0; ti < 3; ti++) {
					const enum tq_codec_id kid = reg_codecs[ki], vid = reg_codecs[vi];
					const enum tq_dtype dt = dtypes[ti];
					const enum mem mem = (enum mem)((ki + vi + di + ti) % 3);
					const char *ran = "";
					char what[128];

					snprintf(what, sizeof(what), "register kernel: K %s V %s d %d %s input in %s memory",
						 tq_codec_name(kid), tq_codec_name(vid), dims[di], tq_dtype_name(dt),
						 mem_name[mem]);
					/* 13 tokens (78 vectors: several CTAs), then one */
					if (enc_case(kid, vid, dims[di], dt, mem, t_seed() + 7 * ki + vi, 1, &ran, what))
						T_FAIL("%s", what);
					if (strcmp(ran, want) || strcmp(tqc_ctx_last_append(ctx), want))
						T_FAIL("%s: ran the %s / %s kernel", what, ran, tqc_ctx_last_append(ctx));
					cases++;
				}
	fprintf(stderr, "    %d pair x dim x dtype cases byte-identical\n", cases);
}

/* Rotated coordinates exactly on codebook bounds, every tq codec and a
 * spread of dims (Hadamard and dense). */
static void test_encode_bound_ties(void)
{
	static const int dims[] = { 8, 24, 64, 96, 128, 200, 256, 512 };
	const uint32_t n = 6;

	rng_state = t_seed() ^ 0x77;
	for (int id = TQ_CODEC_TQ2; id <= TQ_CODEC_TQ4; id++)
		for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
			const int dim = dims[di];
			struct layer L;
			char what[96];
			float x[TQ_DIM_MAX];
			int found = 0;

			snprintf(what, sizeof(what), "bound ties %s d %d", tq_codec_name((enum tq_codec_id)id), dim);
			if (layer_new(&L, (enum tq_codec_id)id, (enum tq_codec_id)id, dim, 1, 4, 2, t_seed() + di,
				      MEM_DEVICE)) {
				layer_free(&L);
				T_FAIL("%s: layer", what);
			}
			float *k = malloc(sizeof(float) * dim * n), *v = malloc(sizeof(float) * dim * n);
			for (uint32_t i = 0; i < n; i++) {
				found += tie_make(L.kc, rnd_u64, NULL, x);
				memcpy(k + i * dim, x, sizeof(float) * dim);
				found += tie_make(L.vc, rnd_u64, NULL, x);
				memcpy(v + i * dim, x, sizeof(float) * dim);
			}
			int rc = append_both(&L, 1, n, (const uint8_t *)k, (const uint8_t *)v, TQ_DTYPE_F32, MEM_HOST,
					     what);
			free(k);
			free(v);
			layer_free(&L);
			if (rc)
				T_FAIL("%s", what);
			if (!found)
				fprintf(stderr, "    %s: no tie found\n", what);
		}
}

/* Many tokens: several launches (32768 tokens each), staged host input. */
static void test_encode_long(void)
{
	/* quick (the emulator): launches of 1000 tokens (TQ_CUDA_ENC_PASS), so
	 * that 2100 tokens take three; else the real 32768 a launch */
	tqc_ctx *const lc = quick ? pctx : ctx, *keep = enc_ctx;
	const uint32_t n = quick ? 2100 : 40000, pt = 256, first = quick ? 1000 : 32768;
	const int dim = 64;
	struct layer L;

	rng_state = t_seed() ^ 0x1234;
	T_ASSERT(layer_new(&L, TQ_CODEC_TQ3, TQ_CODEC_Q8, dim, 1, pt, (n + 7 + pt - 1) / pt, t_seed(), MEM_DEVICE) ==
		 0);
	float *k = malloc(sizeof(float) * dim * n), *v = malloc(sizeof(float) * dim * n);
	for (size_t i = 0; i < (size_t)dim * n; i++) {
		k[i] = gauss();
		v[i] = gauss();
	}
	enc_ctx = lc;
	int rc = append_both(&L, 7, n, (const uint8_t *)k, (const uint8_t *)v, TQ_DTYPE_F32, MEM_HOST, "many tokens");
	enc_ctx = keep;
	T_ASSERT(tqc_ctx_last_us(lc) > 0.0);

	/* a NaN in the second launch: found there, token counted from the call */
	tq_error err;
	uint32_t bad = 0;
	const uint32_t nan_tok = n - 100; /* past the first launch */
	T_ASSERT(nan_tok > first);
	k[(size_t)nan_tok * dim + 5] = NAN;
	struct tqc_append a = { .k_codec = L.kc, .v_codec = L.vc, .kv = &L.dt, .pos = 7, .n = n, .k = k, .v = v,
				.dtype = TQ_DTYPE_F32 };
	int r = tqc_append(lc, &a, &bad, &err);
	free(k);
	free(v);
	layer_free(&L);
	T_ASSERT(rc == 0);
	T_EQ(r, -EINVAL);
	T_EQ(bad, nan_tok);
	char want[96];
	snprintf(want, sizeof(want), "token %u K head 0: NaN or Inf at element 5", nan_tok);
	T_ASSERT(strcmp(err.msg, want) == 0);
}

static float bits_f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* Bad vectors: the first failing one (token-major, K before V, then head)
 * names itself; the errno is the reference's. */
static void test_encode_errors(void)
{
	const int dim = 64, n_kv = 3;
	const uint32_t n = 8;
	struct layer L;
	tq_error err, rerr;
	uint32_t bad;
	char want[200];

	rng_state = t_seed() ^ 0x99;
	for (int ci = 0; ci < N_CODECS; ci++)
		for (int ti = 0; ti < 3; ti++) {
			const enum tq_codec_id id = all_codecs[ci];
			const enum tq_dtype dt = dtypes[ti];
			const size_t row = tq_dtype_size(dt) * dim;
			float x[TQ_DIM_MAX], conv[TQ_DIM_MAX];
			uint8_t blk[TQ_F32_BLOCK_BYTES(TQ_DIM_MAX)];

			T_ASSERT(layer_new(&L, id, all_codecs[(ci + 2) % N_CODECS], dim, n_kv, 4, 3, t_seed(), MEM_DEVICE) ==
				 0);
			uint8_t *k = malloc(row * n * n_kv), *v = malloc(row * n * n_kv);
			for (int kind = 0; kind < 7; kind++) {
				for (uint32_t i = 0; i < n * (uint32_t)n_kv; i++) {
					good_row(0, k + i * row, dim, dt, L.kc);
					good_row(0, v + i * row, dim, dt, L.vc);
				}
				/* the first bad vector: token 3 K head 1; later ones:
				 * token 3 V head 0, token 5 K head 0 */
				uint8_t *first = k + (3 * n_kv + 1) * row;
				int el = 17;
				gen_vec(0, x, dim, dt, L.kc);
				switch (kind) {
				case 0: x[el] = bits_f(0x7fc00000u); break;              /* qNaN */
				case 1: x[el] = bits_f(0xff800000u); break;              /* -Inf */
				case 2: for (int i = 0; i < dim; i++) x[i] = 1e20f; break; /* norm overflows */
				case 3: x[el] = 70000.0f; break;                          /* beyond fp16 */
				case 4: x[el] = 3e38f; x[el + 1] = -3e38f; break;         /* range overflows */
				case 5: for (int i = 0; i < dim; i++) x[i] = (i & 1) ? -3e38f : 3e38f; break;
				default: for (int i = 0; i < dim; i++) x[i] = -65520.0f - (float)i; break;
				}
				put_row(first, dt, x, dim);
				int want_rc = tq_encode_ref(L.kc, first, dt, 1, blk, &rerr);
				if (want_rc == 0)
					continue; /* representable by this codec and dtype */
				int bel = -1; /* the first NaN/Inf of the row as converted */
				(void)tq_row_to_f32(first, dt, dim, conv, &bel);
				put_row(v + (3 * n_kv + 0) * row, dt, (float[TQ_DIM_MAX]){ [3] = NAN }, dim);
				put_row(k + (5 * n_kv + 0) * row, dt, (float[TQ_DIM_MAX]){ [0] = INFINITY }, dim);
				for (int m = 0; m < 3; m++) {
					struct buf kb, vb;
					T_ASSERT(buf_new(&kb, (enum mem)m, row * n * n_kv, k) == 0);
					T_ASSERT(buf_new(&vb, (enum mem)m, row * n * n_kv, v) == 0);
					struct tqc_append a = { .k_codec = L.kc, .v_codec = L.vc, .kv = &L.dt, .pos = 2, .n = n,
								.k = kb.p, .v = vb.p, .dtype = dt };
					bad = 0;
					int r = tqc_append(ctx, &a, &bad, &err);
					buf_free(&kb);
					buf_free(&vb);
					if (want_rc == -EINVAL) {
						snprintf(want, sizeof(want), "token 3 K head 1: NaN or Inf at element %d", bel);
					} else {
						snprintf(want, sizeof(want), "token 3 K head 1: %s",
							 id == TQ_CODEC_F16 ? "a value is beyond the fp16 range"
									    : "values too large to encode (norm or range overflows fp32/fp16)");
					}
					if (r != want_rc || bad != 3 || strcmp(err.msg, want))
						T_FAIL("%s %s kind %d %s: rc %d (want %d) bad %u: '%s' (want '%s')",
						       tq_codec_name(id), tq_dtype_name(dt), kind, mem_name[m], r, want_rc, bad,
						       err.msg, want);
					/* token 3 (slot 5) K head 1 and V head 0, token 5 (slot 7) K head 0 */
					static const uint32_t failed[3][3] = { { 5, 0, 1 }, { 5, 1, 0 }, { 7, 0, 0 } };
					const int dirty = failed_blocks_zeroed(&L, failed, 3);
					if (dirty)
						T_FAIL("%s %s kind %d %s: %d failed vectors' blocks not zeroed", tq_codec_name(id),
						       tq_dtype_name(dt), kind, mem_name[m], dirty);
				}
			}
			/* K before V of the same token; V head 0 before K of a later token */
			for (uint32_t i = 0; i < n * (uint32_t)n_kv; i++) {
				good_row(0, k + i * row, dim, dt, L.kc);
				good_row(0, v + i * row, dim, dt, L.vc);
			}
			put_row(v + (2 * n_kv + 0) * row, dt, (float[TQ_DIM_MAX]){ [9] = NAN }, dim);
			put_row(k + (2 * n_kv + 2) * row, dt, (float[TQ_DIM_MAX]){ [4] = -INFINITY }, dim);
			put_row(k + (6 * n_kv + 0) * row, dt, (float[TQ_DIM_MAX]){ [0] = NAN }, dim);
			struct tqc_append a = { .k_codec = L.kc, .v_codec = L.vc, .kv = &L.dt, .pos = 0, .n = n, .k = k,
						.v = v, .dtype = dt };
			T_EQ(tqc_append(ctx, &a, &bad, &err), -EINVAL);
			T_EQ(bad, 2);
			T_ASSERT(strcmp(err.msg, "token 2 K head 2: NaN or Inf at element 4") == 0);
			put_row(k + (2 * n_kv + 2) * row, dt, (float[TQ_DIM_MAX]){ 0 }, dim);
			T_EQ(tqc_append(ctx, &a, &bad, &err), -EINVAL);
			T_ASSERT(strcmp(err.msg, "token 2 V head 0: NaN or Inf at element 9") == 0);
			/* one token (a launch of one CTA where the register
			 * kernel takes the pair): its report, then a clean one */
			struct tqc_append a1 = { .k_codec = L.kc, .v_codec = L.vc, .kv = &L.dt, .pos = 7, .n = 1,
						 .k = k + 2 * n_kv * row, .v = v + 2 * n_kv * row, .dtype = dt };
			T_EQ(tqc_append(ctx, &a1, &bad, &err), -EINVAL);
			T_EQ(bad, 0); /* tokens count from the call's first */
			T_ASSERT(strcmp(err.msg, "token 0 V head 0: NaN or Inf at element 9") == 0);
			a1.k = k;
			a1.v = v;
			T_EQ(tqc_append(ctx, &a1, &bad, &err), 0);
			T_EQ(bad, UINT32_MAX);
			free(k);
			free(v);
			layer_free(&L);
		}
}

/* Argument checks. */
static void test_encode_args(void)
{
	struct layer L, L2;
	float k[2 * 64], v[2 * 64];
	tq_error err;
	uint32_t bad;

	memset(k, 0, sizeof(k));
	memset(v, 0, sizeof(v));
	T_ASSERT(layer_new(&L, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 64, 1, 4, 2, t_seed(), MEM_DEVICE) == 0);
	T_ASSERT(layer_new(&L2, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 128, 1, 4, 2, t_seed(), MEM_DEVICE) == 0);
	struct tqc_append a = { .k_codec = L.kc, .v_codec = L.vc, .kv = &L.dt, .pos = 6, .n = 2, .k = k, .v = v,
				.dtype = TQ_DTYPE_F32 };
	T_EQ(tqc_append(ctx, &a, &bad, &err), 0);
	a.pos = 7; /* slot 8 needs a third page */
	T_EQ(tqc_append(ctx, &a, &bad, &err), -EINVAL);
	a.pos = 0;
	a.n = 0;
	T_EQ(tqc_append(ctx, &a, &bad, &err), -EINVAL);
	a.n = 2;
	a.v_codec = L2.vc; /* dim 128 */
	T_EQ(tqc_append(ctx, &a, &bad, &err), -EINVAL);
	a.v_codec = L.kc; /* tq4 blocks are not the pages' tq3 blocks */
	T_EQ(tqc_append(ctx, &a, &bad, &err), -EINVAL);
	a.v_codec = L.vc;
	a.dtype = (enum tq_dtype)7;
	T_EQ(tqc_append(ctx, &a, &bad, &err), -EINVAL);
	a.dtype = TQ_DTYPE_F32;
	a.k = NULL;
	T_EQ(tqc_append(ctx, &a, &bad, &err), -EINVAL);
	a.k = k;
	a.pos = UINT32_MAX;
	T_EQ(tqc_append(ctx, &a, &bad, &err), -EINVAL);
	a.pos = 0;
	const uint8_t *keep = L.dpages[0];
	L.dpages[0] = keep + 8; /* not page aligned */
	T_EQ(tqc_append(ctx, &a, &bad, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "aligned") != NULL);
	L.dpages[0] = NULL;
	T_EQ(tqc_append(ctx, &a, &bad, &err), -EINVAL);
	L.dpages[0] = keep;
	T_EQ(tqc_append(NULL, &a, &bad, &err), -EINVAL);
	T_EQ(tqc_append(ctx, &a, &bad, &err), 0);
	layer_free(&L);
	layer_free(&L2);
}

/* ---- attention ------------------------------------------------------------------- */

/* Fill `len` tokens of the layer: on the CPU (tq_encode into the host pages,
 * uploaded) or with tqc_append from the same raw vectors (pages downloaded
 * for the oracle). */
static int layer_fill(struct layer *L, uint32_t len, int on_gpu, uint64_t seed)
{
	const int d = L->dim, H = (int)L->g.n_kv_heads;
	const uint32_t chunk = 4096;
	float *k = malloc(sizeof(float) * d * H * chunk), *v = malloc(sizeof(float) * d * H * chunk);
	tq_error err;
	int rc = 0;

	if (!k || !v) {
		free(k);
		free(v);
		return -ENOMEM;
	}
	rng_state = seed;
	layer_set_len(L, len);
	for (uint32_t t0 = 0; t0 < len && !rc; t0 += chunk) {
		uint32_t n = len - t0 < chunk ? len - t0 : chunk;
		/* keys with channel means and a few large channels, as real ones */
		for (uint32_t i = 0; i < n * (uint32_t)H; i++)
			for (int j = 0; j < d; j++) {
				float mean = (float)((j * 37 % 11) - 5) * 0.1f, amp = (j % 29 == 3) ? 6.0f : 1.0f;
				k[(size_t)i * d + j] = mean + amp * gauss();
				v[(size_t)i * d + j] = gauss();
			}
		if (on_gpu) {
			uint32_t bad;
			struct tqc_append a = { .k_codec = L->kc, .v_codec = L->vc, .kv = &L->dt, .pos = t0, .n = n,
						.k = k, .v = v, .dtype = TQ_DTYPE_F32 };
			if ((rc = tqc_append(ctx, &a, &bad, &err)))
				fprintf(stderr, "  fill: tqc_append: %s\n", err.msg);
			continue;
		}
		for (uint32_t i = 0; i < n && !rc; i++)
			for (int h = 0; h < H && !rc; h++) {
				uint32_t s = t0 + i, pg = s / L->g.page_tokens, sl = s % L->g.page_tokens;
				const float *kr = k + ((size_t)i * H + h) * d, *vr = v + ((size_t)i * H + h) * d;
				if ((rc = tq_encode(L->kc, kr, TQ_DTYPE_F32, 1, L->hpages[pg] + tq_page_k_off(&L->g, h, sl), &err)) ||
				    (rc = tq_encode(L->vc, vr, TQ_DTYPE_F32, 1, L->hpages[pg] + tq_page_v_off(&L->g, h, sl), &err)))
					fprintf(stderr, "  fill: tq_encode: %s\n", err.msg);
			}
	}
	free(k);
	free(v);
	if (rc)
		return rc;
	return on_gpu ? layer_download(L) : layer_upload(L);
}

/* The pages in `kind` memory (device, or unified: the integrated GPU's pool) */
static struct layer *layer_build_in(struct layer *L, enum tq_codec_id kid, enum tq_codec_id vid, int dim, int n_kv,
				    uint32_t pt, uint32_t len, int on_gpu, uint64_t seed, enum mem kind)
{
	uint32_t np = (len + pt - 1) / pt;

	if (layer_new(L, kid, vid, dim, n_kv, pt, np, seed, kind) || layer_fill(L, len, on_gpu, seed)) {
		layer_free(L);
		return NULL;
	}
	return L;
}

static struct layer *layer_build(struct layer *L, enum tq_codec_id kid, enum tq_codec_id vid, int dim, int n_kv,
				 uint32_t pt, uint32_t len, int on_gpu, uint64_t seed)
{
	return layer_build_in(L, kid, vid, dim, n_kv, pt, len, on_gpu, seed, MEM_DEVICE);
}

/* Max over rows of max_j |a - b| / ||b_row|| (NaN-safe: NaN counts as huge). */
static double row_err(const float *a, const float *b, size_t rows, int dim)
{
	double worst = 0.0;
	for (size_t r = 0; r < rows; r++) {
		double n2 = 0.0, mx = 0.0;
		for (int j = 0; j < dim; j++) {
			double bj = b[r * dim + j], dd = fabs((double)a[r * dim + j] - bj);
			n2 += bj * bj;
			if (!(dd <= mx))
				mx = dd;
		}
		double e = mx / (sqrt(n2) + 1e-12);
		if (!(e <= worst))
			worst = e;
	}
	return worst;
}

/* Which attention kernel tqc_attend must pick for the layer (tq_cuda.h):
 * the tiled one for its shapes, where its shared memory fits the device
 * (an A100 takes less than an H100), unless TQ_CUDA_ATTN=general. */
static int general_only;
static int smem_optin; /* the device's, bytes */
static int n_sms;      /* the device's multiprocessors */
static int smem_sm;    /* the device's shared memory per multiprocessor, bytes */

static int tiled_expected(const struct layer *L)
{
	const enum tq_codec_id k = tq_codec_id(L->kc), v = tq_codec_id(L->vc);
	const int tv = v == TQ_CODEC_TQ2 || v == TQ_CODEC_TQ3 || v == TQ_CODEC_TQ4 || v == TQ_CODEC_Q8;
	/* keys: the values' codecs, and the outlier codecs (a build of their own) */
	const int tk = k == TQ_CODEC_TQ2 || k == TQ_CODEC_TQ3 || k == TQ_CODEC_TQ4 || k == TQ_CODEC_Q8 ||
		       k == TQ_CODEC_TQ3O || k == TQ_CODEC_TQ4O;

	return !general_only && tk && tv && (L->dim == 64 || L->dim == 128 || L->dim == 256) &&
	       L->g.page_tokens % 32 == 0 &&
	       tqc_attn_mma_warps(L->dim, L->g.k_block_bytes, L->g.v_block_bytes, (size_t)smem_optin) > 0;
}

/* The oracle on the host pages, the GPU on the device pages (output in
 * `out_mem` memory); the worst relative row error, or -1 on a failed call. */
static double compare(const struct layer *L, int n_q, int n_q_heads, const void *q, enum tq_dtype q_dtype,
		      const int32_t *pos, int causal, float scale, enum mem out_mem, const char *what)
{
	const size_t rows = (size_t)n_q * n_q_heads, bytes = rows * L->dim * sizeof(float);
	float *ref = malloc(bytes + 4), *got = malloc(bytes + 4);
	struct buf ob;
	tq_error err;
	double e = -1;

	struct tq_attn_params p = { .k_codec = L->kc, .v_codec = L->vc, .n_q_heads = n_q_heads, .kv = &L->ht,
				    .n_q = n_q, .q = q, .q_dtype = q_dtype, .q_pos = pos, .causal = causal,
				    .scale = scale, .out = ref };
	if (tq_attend_ref(&p, &err)) {
		fprintf(stderr, "  %s: ref: %s\n", what, err.msg);
		goto out;
	}
	memset(got, 0xFF, bytes); /* NaN until written */
	if (buf_new(&ob, out_mem, bytes, got))
		goto out;
	p.kv = &L->dt;
	p.out = ob.p;
	int rc = tqc_attend(ctx, &p, &err);
	const char *kern = tqc_ctx_last_attn(ctx), *want = tiled_expected(L) ? "mma" : "general";
	if (rc)
		fprintf(stderr, "  %s: tqc_attend: rc %d: %s\n", what, rc, err.msg);
	else if (strcmp(kern, want))
		fprintf(stderr, "  %s: ran the %s kernel, not the %s one\n", what, kern, want);
	else if (buf_read(&ob, got, bytes) == 0)
		e = row_err(got, ref, rows, L->dim);
	buf_free(&ob);
	if (rc == 0 && (!(e >= 0 && e <= TOL) || getenv("TQ_TEST_VERBOSE")))
		fprintf(stderr, "  %s: error %.3g (%.0f us; %s)\n", what, e, tqc_ctx_last_us(ctx),
			tqc_ctx_last_attn_plan(ctx));
out:
	free(ref);
	free(got);
	return e;
}

static float *make_q(int n_q, int n_q_heads, int dim)
{
	float *q = malloc(sizeof(float) * (size_t)n_q * n_q_heads * dim + 4);
	for (size_t i = 0; i < (size_t)n_q * n_q_heads * dim; i++)
		q[i] = gauss() * 1.5f;
	return q;
}

/* Decode (causal and not) and a small causal prefill on one layer. */
static int check_layer(const struct layer *L, int group, const char *what0)
{
	const int H = (int)L->g.n_kv_heads, nqh = H * group, d = L->dim;
	const uint32_t len = L->ht.n_tokens, pt = L->g.page_tokens;
	char what[160];
	int32_t last = (int32_t)len - 1;
	int32_t pos[5] = { 0, (int32_t)(pt - 1 < len - 1 ? pt - 1 : 0), (int32_t)(pt < len ? pt : 0), (int32_t)len / 2,
			   last };
	float *q1 = make_q(1, nqh, d), *q5 = make_q(5, nqh, d);
	double e1, e2, e3;

	snprintf(what, sizeof(what), "%s decode causal", what0);
	e1 = compare(L, 1, nqh, q1, TQ_DTYPE_F32, &last, 1, 0.0f, MEM_HOST, what);
	snprintf(what, sizeof(what), "%s decode", what0);
	e2 = compare(L, 1, nqh, q1, TQ_DTYPE_F32, NULL, 0, 0.0f, MEM_DEVICE, what);
	snprintf(what, sizeof(what), "%s prefill 5", what0);
	e3 = compare(L, 5, nqh, q5, TQ_DTYPE_F32, pos, 1, 0.0f, MEM_UNIFIED, what);
	free(q1);
	free(q5);
	return e1 >= 0 && e1 <= TOL && e2 >= 0 && e2 <= TOL && e3 >= 0 && e3 <= TOL ? 0 : -1;
}

/* Every K/V codec pair at head dims 64, 128, 256 (GQA 1, 4, 8 in turn,
 * 203 tokens in 48-token pages: the general kernel), the pairs the tiled
 * kernel takes again in 64-token pages (GQA 1, 2, 4, 8 in turn: 1 to 40 of
 * its 8-row blocks' rows in use), and dim 96 (dense rotations) once. */
static void test_attn_pairs(void)
{
	static const int dims[] = { 64, 128, 256 };
	static const int groups[] = { 1, 4, 8 }, tgroups[] = { 1, 2, 4, 8 };
	int n = 0, nt = 0;

	for (size_t di = 0; di < (quick ? 1u : 3u); di++)
		for (int i = 0; i < N_CODECS; i++)
			for (int j = 0; j < N_CODECS; j++)
				for (int pt = 48; pt <= 64; pt += 16) {
					struct layer L;
					char what[96];
					int G = pt == 48 ? groups[(i + j + (int)di) % 3] : tgroups[(i + j + (int)di) % 4];
					snprintf(what, sizeof(what), "K %s V %s d %d G %d, %d-token pages",
						 tq_codec_name(all_codecs[i]), tq_codec_name(all_codecs[j]), dims[di], G,
						 pt);
					if (!layer_build(&L, all_codecs[i], all_codecs[j], dims[di], 2, (uint32_t)pt, 203, 0,
							 t_seed() + (uint64_t)(i * 7 + j)))
						T_FAIL("%s: layer", what);
					const int tiled = tiled_expected(&L);
					int rc = pt == 48 || tiled ? check_layer(&L, G, what) : 0;
					layer_free(&L);
					if (rc)
						T_FAIL("%s", what);
					n += pt == 48 || tiled;
					nt += tiled;
				}
	static const struct { enum tq_codec_id k, v; } d96[] = {
		{ TQ_CODEC_TQ4, TQ_CODEC_TQ3 }, { TQ_CODEC_Q8, TQ_CODEC_TQ2 }, { TQ_CODEC_Q4A, TQ_CODEC_Q8 },
		{ TQ_CODEC_TQ4O, TQ_CODEC_TQ3O }, /* halves of 48: dense */
	};
	for (size_t i = 0; i < sizeof(d96) / sizeof(d96[0]); i++) {
		struct layer L;
		char what[96];
		snprintf(what, sizeof(what), "K %s V %s d 96 G 4", tq_codec_name(d96[i].k), tq_codec_name(d96[i].v));
		if (!layer_build(&L, d96[i].k, d96[i].v, 96, 2, 48, 203, 0, t_seed() + 96 + i))
			T_FAIL("%s: layer", what);
		int rc = check_layer(&L, 4, what);
		layer_free(&L);
		if (rc)
			T_FAIL("%s", what);
		n++;
	}
	fprintf(stderr, "    %d layers (%d on the tiled kernel), 3 calls each, within %.0e\n", n, nt, TOL);
}

/* Context lengths that are and are not page multiples; pages appended on the
 * GPU for some. */
static void test_attn_contexts(void)
{
	static const uint32_t lens[] = { 1, 7, 64, 1000, 4097 };
	static const struct { enum tq_codec_id k, v; } pairs[] = {
		{ TQ_CODEC_TQ4, TQ_CODEC_TQ3 }, { TQ_CODEC_Q8, TQ_CODEC_TQ4 }, { TQ_CODEC_F16, TQ_CODEC_Q4A },
	};

	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]) - (quick ? 1u : 0u); li++)
		for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
			struct layer L;
			char what[96];
			int on_gpu = (int)((li + i) % 2);
			snprintf(what, sizeof(what), "K %s V %s T %u%s", tq_codec_name(pairs[i].k),
				 tq_codec_name(pairs[i].v), lens[li], on_gpu ? " (appended on the GPU)" : "");
			if (!layer_build(&L, pairs[i].k, pairs[i].v, 128, 2, 64, lens[li], on_gpu, t_seed() + li * 3 + i))
				T_FAIL("%s: layer", what);
			int rc = check_layer(&L, 4, what);
			layer_free(&L);
			if (rc)
				T_FAIL("%s", what);
		}
}

/* K/V pages in unified (host-mapped) memory, as the pool of an integrated
 * GPU (GB10) or a Grace Hopper has them: attn_mma's tile copies (bulk
 * copies on sm_90) and the quantize-append read and write them there. */
static void test_attn_unified_pages(void)
{
	static const struct { enum tq_codec_id k, v; } pairs[] = {
		{ TQ_CODEC_TQ4, TQ_CODEC_TQ3 }, { TQ_CODEC_Q8, TQ_CODEC_TQ4 }, { TQ_CODEC_TQ4O, TQ_CODEC_TQ3 },
	};

	for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
		struct layer L;
		char what[96];
		const int on_gpu = (int)(i % 2);
		snprintf(what, sizeof(what), "K %s V %s T 1000, unified pages%s", tq_codec_name(pairs[i].k),
			 tq_codec_name(pairs[i].v), on_gpu ? " (appended on the GPU)" : "");
		if (!layer_build_in(&L, pairs[i].k, pairs[i].v, 128, 2, 64, 1000, on_gpu, t_seed() + 77 * i, MEM_UNIFIED))
			T_FAIL("%s: layer", what);
		int rc = check_layer(&L, 4, what);
		layer_free(&L);
		if (rc)
			T_FAIL("%s", what);
	}
}

/* Causal prefill: 128 query tokens at the end of a 1000-token context and at
 * scattered positions; GQA 4 and 8; a custom scale, not causal. */
static void test_attn_prefill(void)
{
	struct layer L;
	int32_t pos[128];

	const int nq = quick ? 8 : 128;
	T_ASSERT(layer_build(&L, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 128, 2, 256, 1000, 1, t_seed()) != NULL);
	for (int g = 4; g <= (quick ? 4 : 8); g += 4) {
		float *q = make_q(nq, 2 * g, 128);
		for (int i = 0; i < nq; i++)
			pos[i] = 1000 - nq + i;
		double e1 = compare(&L, nq, 2 * g, q, TQ_DTYPE_F32, pos, 1, 0.0f, MEM_DEVICE, "prefill at the end");
		for (int i = 0; i < nq; i++)
			pos[i] = (int32_t)((i * 7919u) % 1000u);
		double e2 = compare(&L, nq, 2 * g, q, TQ_DTYPE_F32, pos, 1, 0.0f, MEM_HOST, "prefill scattered");
		double e3 = compare(&L, nq, 2 * g, q, TQ_DTYPE_F32, pos, 0, 0.3f, MEM_HOST, "not causal, scale 0.3");
		free(q);
		T_ASSERT(e1 >= 0 && e1 <= TOL);
		T_ASSERT(e2 >= 0 && e2 <= TOL);
		T_ASSERT(e3 >= 0 && e3 <= TOL);
	}
	layer_free(&L);
}

/* A long context: split-K with the log-sum-exp merge (quick: 5000 tokens;
 * on a context whose splits may be as short as 256 keys, TQ_CUDA_SPLIT_MIN,
 * the tiled case runs 18 splits of 288 keys, so attn_mma's finish takes its
 * splits' partials in two batches of 16, the second short: checked). */
static void test_attn_split_k(void)
{
	tqc_ctx *keep = ctx;
	ctx = sctx;
	static const struct { enum tq_codec_id k, v; int dim; } cases[] = {
		{ TQ_CODEC_TQ4, TQ_CODEC_TQ2, 128 }, { TQ_CODEC_F32, TQ_CODEC_F16, 64 }, { TQ_CODEC_Q8, TQ_CODEC_Q4A, 256 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct layer L;
		const uint32_t len = quick ? 5000 : 20000;
		char what[96];
		snprintf(what, sizeof(what), "split-K K %s V %s d %d T %u", tq_codec_name(cases[i].k),
			 tq_codec_name(cases[i].v), cases[i].dim, len);
		if (!layer_build(&L, cases[i].k, cases[i].v, cases[i].dim, 2, 256, len, (int)(i % 2), t_seed() + i))
			T_FAIL("%s: layer", what);
		float *q = make_q(3, 8, cases[i].dim);
		int32_t pos[3] = { (int32_t)len - 1, (int32_t)(len * 5 / 8), 100 };
		double e1 = compare(&L, 1, 8, q, TQ_DTYPE_F32, pos, 1, 0.0f, MEM_HOST, what);
		double e2 = compare(&L, 3, 8, q, TQ_DTYPE_F32, pos, 1, 0.0f, MEM_DEVICE, what);
		double e3 = compare(&L, 3, 8, q, TQ_DTYPE_F32, pos, 0, 0.0f, MEM_HOST, what);
		int splits = 0;
		const char *sp = strstr(tqc_ctx_last_attn_plan(ctx), ", ");
		if (i == 0 && !general_only && (!sp || sscanf(sp, ", %d split", &splits) != 1 || splits <= 16))
			T_FAIL("%s: plan '%s': want more than 16 splits", what, tqc_ctx_last_attn_plan(ctx));
		free(q);
		layer_free(&L);
		T_ASSERT(e1 >= 0 && e1 <= TOL);
		T_ASSERT(e2 >= 0 && e2 <= TOL);
		T_ASSERT(e3 >= 0 && e3 <= TOL);
	}
	ctx = keep;
}

/* attn_mma's plan fills whole waves: its CTAs (splits x row blocks x KV
 * heads) never outnumber what runs at once (the CTAs per SM it planned x the
 * SMs), since a partial second wave would nearly double the call; and its
 * warps are within the kernel's bounds.  Where two CTAs of
 * TQC_MMA_WARPS_PAIR warps fit an SM's shared memory (tq4 / tq3 at d 128 on
 * an H100), the plan has them: the runtime's occupancy query answers 0 for a
 * kernel not yet allowed that much shared memory, which once left every
 * long call with two waves.  16 query tokens of 32 heads over 8 KV heads
 * make 8 row blocks a head, so the split count is bound by the device, not
 * the 1280-token context. */
static void test_attn_waves(void)
{
	static const struct { enum tq_codec_id k, v; int dim; } cases[] = {
		{ TQ_CODEC_TQ4, TQ_CODEC_TQ3, 128 }, { TQ_CODEC_Q8, TQ_CODEC_TQ4, 128 },
		{ TQ_CODEC_Q8, TQ_CODEC_Q8, 64 },    { TQ_CODEC_TQ4, TQ_CODEC_TQ2, 256 },
	};
	const int n_q = 16, n_qh = 32, n_kv = 8, n_rb = n_q * (n_qh / n_kv) / 8;
	const uint32_t len = 1280;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct layer L;
		char what[96];
		int32_t pos[16];
		snprintf(what, sizeof(what), "waves K %s V %s d %d", tq_codec_name(cases[i].k), tq_codec_name(cases[i].v),
			 cases[i].dim);
		if (!layer_build(&L, cases[i].k, cases[i].v, cases[i].dim, n_kv, 256, len, 0, t_seed() + i))
			T_FAIL("%s: layer", what);
		for (int j = 0; j < n_q; j++)
			pos[j] = (int32_t)len - n_q + j;
		float *q = make_q(n_q, n_qh, cases[i].dim);
		const double e = compare(&L, n_q, n_qh, q, TQ_DTYPE_F32, pos, 1, 0.0f, MEM_HOST, what);
		const int tiled = tiled_expected(&L);
		const size_t pair_smem =
			tqc_attn_mma_smem(cases[i].dim, L.g.k_block_bytes, L.g.v_block_bytes, TQC_MMA_WARPS_PAIR);
		free(q);
		layer_free(&L);
		T_ASSERT(e >= 0 && e <= TOL);
		if (!tiled)
			continue;
		const char *plan = tqc_ctx_last_attn_plan(ctx), *sp = strstr(plan, ", ");
		int warps = 0, per_sm = 0, splits = 0;
		T_ASSERT(sscanf(plan, "mma: %d warps x %d CTA", &warps, &per_sm) == 2);
		T_ASSERT(sp && sscanf(sp, ", %d split", &splits) == 1);
		T_ASSERT(warps >= 4 && warps <= (cases[i].dim > 128 ? 8 : 12));
		T_ASSERT(per_sm >= 1 && splits >= 1);
		T_ASSERT((long)splits * n_rb * n_kv <= (long)per_sm * n_sms);
		if (cases[i].dim <= 128 && 2 * (pair_smem + TQC_MMA_STATIC_SMEM + 1024) <= (size_t)smem_sm &&
		    pair_smem + TQC_MMA_STATIC_SMEM <= (size_t)smem_optin)
			T_ASSERT(warps == TQC_MMA_WARPS_PAIR && per_sm == 2);
	}
}

/* A call that starts while another is in flight (another context, another
 * thread: the daemon's workers, tqbench's concurrent sessions) shares the
 * GPU and splits its context in at most 16 (splits of at most
 * TQ_CUDA_SPLIT_SHARED keys, at least the shortest); a lone call keeps its
 * plan.  On a context whose splits may be as short as 64 keys, 2048 keys:
 * lone, more than 16 splits; shared, 16 of 128 or fewer.  Both within the
 * oracle's tolerance.  (On a GPU the other call may end before this one
 * starts: tried again, a few times.) */
static tqc_ctx *ctx_env(const char *name, const char *val);

struct inflight_call {
	tqc_ctx *x;
	struct tq_attn_params p;
	int rc, done;
	tq_error err;
};

static void *inflight_run(void *arg)
{
	struct inflight_call *c = arg;

	c->rc = tqc_attend(c->x, &c->p, &c->err);
	__atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Two workers on layouts that need different shared memory from the same
 * tiled kernel (d 128: q8 / q8 and tq4 / q8), at once: the kernel's limit
 * is the process's, so one setting it lower for its own launch failed the
 * other's (cudaErrorInvalidValue: INTERNAL to a client, under load only).
 * On the emulator TQ_FAKE_SETATTR_US widens the window between a set and
 * the launch that relies on it. */
struct smem_racer {
	tqc_ctx *x;
	struct tq_attn_params p;
	const float *ref;
	int rows, dim, n, fails;
	char msg[200];
};

static void *smem_race_run(void *arg)
{
	struct smem_racer *r = arg;
	float *got = malloc(sizeof(float) * (size_t)r->rows * r->dim);
	tq_error err;

	for (int i = 0; i < r->n; i++) {
		r->p.out = got;
		if (tqc_attend(r->x, &r->p, &err) != 0) {
			if (!r->fails++)
				snprintf(r->msg, sizeof(r->msg), "call %d: %.160s", i, err.msg);
		} else if (!(row_err(got, r->ref, (size_t)r->rows, r->dim) <= TOL)) {
			if (!r->fails++)
				snprintf(r->msg, sizeof(r->msg), "call %d: wrong output", i);
		}
	}
	free(got);
	return NULL;
}

static void test_attn_smem_race(void)
{
	static const enum tq_codec_id kc[2] = { TQ_CODEC_Q8, TQ_CODEC_TQ4 };
	struct layer L[2];
	struct smem_racer r[2];
	pthread_t th[2];
	tqc_ctx *xc[2] = { NULL, NULL };
	float *q = make_q(1, 8, 128), *ref[2] = { NULL, NULL };
	int32_t last = 127;
	size_t smem[2];
	int ok = 1;

	setenv("TQ_FAKE_SETATTR_US", "300", 1);
	for (int i = 0; i < 2; i++) {
		tq_error err;
		if (tqc_ctx_new(&xc[i], dev, &err) || !layer_build(&L[i], kc[i], TQ_CODEC_Q8, 128, 2, 64, 128, 1, t_seed())) {
			ok = 0;
			continue;
		}
		smem[i] = tqc_attn_mma_smem(128, L[i].g.k_block_bytes, L[i].g.v_block_bytes,
					    tqc_attn_mma_warps(128, L[i].g.k_block_bytes, L[i].g.v_block_bytes,
							       (size_t)smem_optin));
		ref[i] = malloc(sizeof(float) * 8 * 128);
		r[i] = (struct smem_racer){ .x = xc[i], .ref = ref[i], .rows = 8, .dim = 128, .n = 40 };
		r[i].p = (struct tq_attn_params){ .k_codec = L[i].kc, .v_codec = L[i].vc, .n_q_heads = 8, .kv = &L[i].ht,
						  .n_q = 1, .q = q, .q_dtype = TQ_DTYPE_F32, .q_pos = &last, .causal = 1,
						  .out = ref[i] };
		if (tq_attend_ref(&r[i].p, &err))
			ok = 0;
		r[i].p.kv = &L[i].dt;
	}
	if (!ok)
		T_FAIL("smem race: contexts or layers");
	if (!tiled_expected(&L[0]) || !tiled_expected(&L[1]) || smem[0] == smem[1] || smem[0] <= (48u << 10)) {
		fprintf(stderr, "    (not two tiled layouts of different shared memory here: %zu, %zu bytes)\n", smem[0],
			smem[1]);
	} else {
		for (int i = 0; i < 2; i++)
			if (pthread_create(&th[i], NULL, smem_race_run, &r[i]) != 0)
				T_FAIL("pthread_create");
		for (int i = 0; i < 2; i++)
			pthread_join(th[i], NULL);
		for (int i = 0; i < 2; i++)
			if (r[i].fails)
				T_FAIL("%s keys (%zu bytes of shared memory): %d of %d calls failed: %s",
				       tq_codec_name(kc[i]), smem[i], r[i].fails, r[i].n, r[i].msg);
		fprintf(stderr, "    %d + %d calls at once, %zu and %zu bytes of shared memory: every one within %.0e\n",
			r[0].n, r[1].n, smem[0], smem[1], TOL);
	}
	unsetenv("TQ_FAKE_SETATTR_US");
	for (int i = 0; i < 2; i++) {
		layer_free(&L[i]);
		tqc_ctx_free(xc[i]);
		free(ref[i]);
	}
	free(q);
}

static void test_attn_shared_gpu(void)
{
	const uint32_t len = 2048;
	struct layer L;
	tqc_ctx *xc = ctx_env("TQ_CUDA_SPLIT_MIN", "64");
	int32_t last = (int32_t)len - 1;
	int splits = 0;
	uint32_t keys = 0;

	if (!xc || !layer_build(&L, TQ_CODEC_TQ4, TQ_CODEC_TQ3, 128, 2, 256, len, 1, t_seed())) {
		tqc_ctx_free(xc);
		T_FAIL("shared GPU: context or layer");
	}
	if (!tiled_expected(&L)) {
		fprintf(stderr, "    (the general kernel: the rule is the tiled kernel's)\n");
		goto out;
	}
	float *q = make_q(1, 8, 128);
	float *ref = malloc(sizeof(float) * 8 * 128), *got = malloc(sizeof(float) * 8 * 128),
	      *other = malloc(sizeof(float) * 8 * 128);
	struct tq_attn_params p = { .k_codec = L.kc, .v_codec = L.vc, .n_q_heads = 8, .kv = &L.ht, .n_q = 1,
				    .q = q, .q_dtype = TQ_DTYPE_F32, .q_pos = &last, .causal = 1, .out = ref };
	tq_error err;
	T_EQ(tq_attend_ref(&p, &err), 0);
	p.kv = &L.dt;

	/* alone */
	T_EQ(tqc_attn_inflight(dev), 0);
	p.out = got;
	T_EQ(tqc_attend(xc, &p, &err), 0);
	const char *plan = tqc_ctx_last_attn_plan(xc), *sp = strstr(plan, ", ");
	T_ASSERT(sp && sscanf(sp, ", %d splits of %u keys", &splits, &keys) == 2);
	if (strstr(plan, "GPU shared") || splits <= 16)
		T_FAIL("alone: plan '%s': want more than 16 splits, not shared", plan);
	T_ASSERT(row_err(got, ref, 8, 128) <= TOL);

	/* beside a call of another context on another thread */
	int shared = 0;
	for (int attempt = 0; attempt < 20 && !shared; attempt++) {
		struct inflight_call c = { .x = ctx, .p = p };
		pthread_t th;
		c.p.out = other;
		if (pthread_create(&th, NULL, inflight_run, &c) != 0)
			T_FAIL("pthread_create");
		/* until the other call has started (or has already ended: a fast
		 * GPU's; then this attempt runs alone and another follows) */
		while (tqc_attn_inflight(dev) == 0 && !__atomic_load_n(&c.done, __ATOMIC_ACQUIRE))
			;
		memset(got, 0xFF, sizeof(float) * 8 * 128);
		p.out = got;
		const int rc = tqc_attend(xc, &p, &err);
		pthread_join(th, NULL); /* before any return: c is on this stack */
		T_EQ(rc, 0);
		T_EQ(c.rc, 0);
		T_ASSERT(row_err(other, ref, 8, 128) <= TOL);
		T_ASSERT(row_err(got, ref, 8, 128) <= TOL);
		plan = tqc_ctx_last_attn_plan(xc);
		shared = strstr(plan, " (GPU shared)") != NULL;
	}
	if (!shared)
		T_FAIL("beside another call: plan '%s' never planned as shared", plan);
	sp = strstr(plan, ", ");
	T_ASSERT(sp && sscanf(sp, ", %d splits of %u keys", &splits, &keys) == 2);
	if (splits > 16 || keys < len / 16)
		T_FAIL("beside another call: plan '%s': want at most 16 splits of %u keys or more", plan, len / 16);
	T_EQ(tqc_attn_inflight(dev), 0);
	fprintf(stderr, "    alone and beside another call: within %.0e (%s)\n", TOL, plan);
	free(q);
	free(ref);
	free(got);
	free(other);
out:
	layer_free(&L);
	tqc_ctx_free(xc);
}

/* Sharp attention on the tiled kernel: queries 16 x the others' (or
 * TQ_TEST_SHARP x), so a logit error becomes a large weight error — q8
 * keys fail it (1.5e-3) with the queries' low FP16 parts dropped (attn_mma's
 * hi + lo split).  Every tiled K codec (tq3o / tq4o: each half's own block
 * scale), V tq3, GQA 4. */
static void test_attn_sharp(void)
{
	static const enum tq_codec_id ks[] = { TQ_CODEC_TQ2, TQ_CODEC_TQ3, TQ_CODEC_TQ4, TQ_CODEC_Q8, TQ_CODEC_TQ3O,
					      TQ_CODEC_TQ4O };
	const float sharp = getenv("TQ_TEST_SHARP") ? strtof(getenv("TQ_TEST_SHARP"), NULL) : 16.0f;
	double worst = 0.0;

	for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
		struct layer L;
		char what[96];
		snprintf(what, sizeof(what), "K %s V tq3 d 128 G 4, queries x %g", tq_codec_name(ks[i]), (double)sharp);
		T_ASSERT(layer_build(&L, ks[i], TQ_CODEC_TQ3, 128, 2, 64, 500, 0, t_seed() + 31 * i) != NULL);
		T_ASSERT(tiled_expected(&L) || general_only);
		float *q = make_q(1, 8, 128);
		for (int j = 0; j < 8 * 128; j++)
			q[j] *= sharp;
		const double e = compare(&L, 1, 8, q, TQ_DTYPE_F32, NULL, 0, 0.0f, MEM_DEVICE, what);
		free(q);
		layer_free(&L);
		if (!(e >= 0 && e <= TOL))
			T_FAIL("%s: error %.3g", what, e);
		worst = fmax(worst, e);
	}
	fprintf(stderr, "    worst error %.3g (within %.0e)\n", worst, TOL);
}

/* The largest decoded value norm of a layer (its host pages): the scale of
 * sparse-V's bound. */
static double layer_max_v_norm(const struct layer *L)
{
	float v[TQ_DIM_MAX];
	double mx = 0.0;

	for (uint32_t t = 0; t < L->ht.n_tokens; t++)
		for (uint32_t h = 0; h < L->g.n_kv_heads; h++) {
			const uint8_t *blk = L->hpages[t / L->g.page_tokens] + tq_page_v_off(&L->g, h, t % L->g.page_tokens);
			if (tq_decode_ref(L->vc, blk, 1, v))
				return INFINITY;
			double n2 = 0.0;
			for (int j = 0; j < L->dim; j++)
				n2 += (double)v[j] * v[j];
			mx = fmax(mx, sqrt(n2));
		}
	return mx;
}

/* Sparse-V on the GPU, tq_attend's contract (test_attn test_sparse_v): at
 * most sparse_v of each row's attention mass is skipped, so each output row
 * moves (in L2) by at most sparse_v times the largest value norm from the
 * same call without skipping, and the same call again gives the same bits;
 * a threshold nothing reaches changes no bit; the chunks reached and
 * skipped are counted (only with sparse_v > 0).  On
 * the tiled kernel (64-token pages: a chunk is a warp's 32-key tile) and
 * the general one (48-token pages: a key), one query token and five
 * (causal limits inside tiles), GQA 4, sharply peaked attention.  Each
 * warp keeps its own running sums (a warp of attn_mma walks every NW-th
 * tile of its split, with a share of the CTA's snapshots besides;
 * attn_main's, every 4th key), so its first tile is never skipped: one
 * split (lctx) gives each warp the many tiles a long context's splits give
 * it. */
static void test_attn_sparse_v(void)
{
	enum { NQ = 5, H = 2, G = 4, D = 128 };
	const uint32_t len = quick ? 1500 : 3000;
	tqc_ctx *keep = ctx;
	ctx = lctx;
	const int32_t poss[NQ] = { (int32_t)len - 1, (int32_t)len / 2, 257, 600, 31 };
	const size_t bytes = (size_t)NQ * H * G * D * sizeof(float);
	float *full = malloc(bytes), *out = malloc(bytes), *full2 = malloc(bytes);
	tq_error err;

	T_ASSERT(full && out && full2);
	for (uint32_t pt = 64; pt >= 48; pt -= 16) {
		struct layer L;
		T_ASSERT(layer_build(&L, TQ_CODEC_TQ4, TQ_CODEC_TQ3, D, H, pt, len, 0, t_seed() + pt) != NULL);
		const int tiled = tiled_expected(&L);
		const double vmax = layer_max_v_norm(&L);
		T_ASSERT(vmax > 0.0 && vmax < 1e3);
		for (int nq = 1; nq <= NQ; nq += NQ - 1) {
			const size_t rows = (size_t)nq * H * G;
			float *q = make_q(nq, H * G, D);
			for (size_t j = 0; j < rows * D; j++)
				q[j] *= 6.0f; /* logits of standard deviation about 14: a few keys carry a row */
			struct tq_attn_stats st = { 0, 0 };
			struct tq_attn_params p = { .k_codec = L.kc, .v_codec = L.vc, .n_q_heads = H * G, .kv = &L.dt,
						    .n_q = nq, .q = q, .q_dtype = TQ_DTYPE_F32, .q_pos = poss,
						    .causal = 1, .out = full, .stats = &st };
			T_EQ(tqc_attend(ctx, &p, &err), 0);
			T_EQ(strcmp(tqc_ctx_last_attn(ctx), tiled ? "mma" : "general"), 0);
			T_ASSERT(st.v_chunks == 0 && st.v_skipped == 0); /* exact: nothing counted */
			/* a threshold no weight reaches: every chunk reached, none
			 * skipped, the same bits */
			p.out = out;
			p.sparse_v = 1e-30f;
			T_EQ(tqc_attend(ctx, &p, &err), 0);
			T_EQ(st.v_skipped, 0u);
			if (nq == 1) /* every tile (key) of each KV head */
				T_EQ(st.v_chunks, (uint64_t)H * (tiled ? (len + 31) / 32 : len));
			T_ASSERT(st.v_chunks > 0);
			T_ASSERT(row_err(out, full, rows, D) == 0.0);
			const uint64_t reached = st.v_chunks;
			static const float eps[] = { 1e-3f, 1e-2f, 0.1f };
			for (size_t e = 0; e < sizeof(eps) / sizeof(eps[0]); e++) {
				p.sparse_v = eps[e];
				st.v_chunks = st.v_skipped = 0;
				T_EQ(tqc_attend(ctx, &p, &err), 0);
				if (getenv("TQ_TEST_VERBOSE"))
					fprintf(stderr, "  sparse-V %g, %d queries, %s kernel: %llu of %llu chunks skipped\n",
						(double)eps[e], nq, tiled ? "tiled" : "general", (unsigned long long)st.v_skipped,
						(unsigned long long)st.v_chunks);
				T_EQ(st.v_chunks, reached);
				T_ASSERT(st.v_skipped > 0 && st.v_skipped < st.v_chunks);
				double worst = 0.0, moved = 0.0;
				for (size_t r = 0; r < rows; r++) {
					double d2 = 0.0;
					for (int j = 0; j < D; j++) {
						const double dd = (double)out[r * D + j] - full[r * D + j];
						d2 += dd * dd;
					}
					const double dn = sqrt(d2);
					if (!(dn / (eps[e] * vmax) <= worst))
						worst = dn / (eps[e] * vmax);
					moved = fmax(moved, dn);
				}
				if (getenv("TQ_TEST_VERBOSE") || !(worst <= 1.0 + 1e-3))
					fprintf(stderr, "  sparse-V %g, %d queries, %s kernel: moved %.3g, %.3f of the bound\n",
						(double)eps[e], nq, tiled ? "tiled" : "general", moved, worst);
				T_ASSERT(worst <= 1.0 + 1e-3);
				T_ASSERT(moved > 1e-6); /* values were skipped: the result moved */
				/* the skips are the same every call: the same bits */
				const uint64_t skipped = st.v_skipped;
				memcpy(full2, out, rows * D * sizeof(float));
				T_EQ(tqc_attend(ctx, &p, &err), 0);
				T_EQ(st.v_skipped, 2 * skipped);
				T_ASSERT(row_err(out, full2, rows, D) == 0.0);
			}
			free(q);
		}
		layer_free(&L);
	}
	free(full);
	free(out);
	free(full2);
	ctx = keep;
}

/* f16 / bf16 queries go through the CPU path's conversion. */
/* The tiled kernel's phase clocks (tq_cuda.h "profiling"; what tqbench
 * --phases reads).  In a build of the kernels with TQC_PHASES (the
 * emulator's cp.async build): every CTA of the grid writes its record, with
 * the launch's grid and warps; within a CTA the phases come in order; the
 * splits' tiles add up to the context's; one CTA per (row block, KV head)
 * merges; taking the records clears them; and arming changes no bit of the
 * output.  In other builds arming is refused with the reason. */
static void test_attn_phases(void)
{
	enum { H = 2, G = 4, D = 128 };
	const uint32_t len = 1000;
	const int32_t pos = (int32_t)len - 1;
	const size_t bytes = (size_t)H * G * D * sizeof(float);
	struct tqc_phase_rec rec[64];
	char why[256];
	uint32_t n = 0;
	tq_error err;
	struct layer L;

	int rc = tqc_phases_arm(dev, 64, why, sizeof(why));
	if (rc == -ENOTSUP) {
		T_ASSERT(strstr(why, "TQC_PHASES") != NULL);
		T_EQ(tqc_phases_take(rec, 64, &n, why, sizeof(why)), -ENOTSUP);
		T_EQ(n, 0u);
		return;
	}
	T_EQ(rc, 0);
	T_EQ(tqc_phases_arm(dev, 0, why, sizeof(why)), -EINVAL); /* refused: still armed */
	T_EQ(tqc_phases_take(rec, 64, &n, why, sizeof(why)), 0);
	T_EQ(n, 0u); /* nothing launched yet */
	T_ASSERT(layer_build(&L, TQ_CODEC_TQ4, TQ_CODEC_TQ3, D, H, 64, len, 0, t_seed()) != NULL);
	T_ASSERT(tiled_expected(&L));
	float *q = make_q(1, H * G, D), *out = malloc(bytes), *plain = malloc(bytes);
	T_ASSERT(q && out && plain);
	struct tq_attn_params p = { .k_codec = L.kc, .v_codec = L.vc, .n_q_heads = H * G, .kv = &L.dt, .n_q = 1,
				    .q = q, .q_dtype = TQ_DTYPE_F32, .q_pos = &pos, .causal = 1, .out = out };
	T_EQ(tqc_attend(sctx, &p, &err), 0); /* splits of 256 keys and more: several */
	T_EQ(strcmp(tqc_ctx_last_attn(sctx), "mma"), 0);
	T_EQ(tqc_phases_take(rec, 64, &n, why, sizeof(why)), 0);
	T_ASSERT(n >= 2 * H && n <= 64);
	T_EQ(rec[0].grid[0], 1u); /* one row block (G rows) */
	T_EQ(rec[0].grid[2], (uint32_t)H);
	T_EQ(n, rec[0].grid[0] * rec[0].grid[1] * rec[0].grid[2]);
	uint32_t lasts = 0, tiles[H] = { 0, 0 };
	for (uint32_t i = 0; i < n; i++) {
		const struct tqc_phase_rec *r = &rec[i];
		T_EQ(r->written, 1u);
		T_ASSERT(memcmp(r->grid, rec[0].grid, sizeof(r->grid)) == 0);
		T_ASSERT(r->warps >= TQC_MMA_WARPS_MIN && r->warps <= TQC_MMA_WARPS_MAX);
		T_ASSERT(r->tiles >= 1);
		T_ASSERT(r->c_entry <= r->c_qrot && r->c_qrot <= r->c_tables);
		T_ASSERT(r->c_tables <= r->c_tile1 && r->c_tile1 <= r->c_loop_first); /* warp 0 has tile 0 */
		T_ASSERT(r->c_loop_first <= r->c_loop_last && r->c_loop_last <= r->c_part && r->c_part <= r->c_end);
		T_ASSERT(r->gt_entry <= r->gt_end);
		T_ASSERT(r->last <= 1u);
		lasts += r->last;
		tiles[i / rec[0].grid[1]] += r->tiles; /* CTA x + X (y + Y z), X = 1 */
	}
	T_EQ(lasts, (uint32_t)H);
	for (int h = 0; h < H; h++)
		T_EQ(tiles[h], (len + 31) / 32);
	/* taken: cleared for the next call */
	T_EQ(tqc_phases_take(rec, 64, &n, why, sizeof(why)), 0);
	T_EQ(n, 0u);
	/* the same call unarmed: the same bits */
	tqc_phases_disarm();
	p.out = plain;
	T_EQ(tqc_attend(sctx, &p, &err), 0);
	T_ASSERT(row_err(out, plain, (size_t)H * G, D) == 0.0);
	T_EQ(tqc_phases_take(rec, 64, &n, why, sizeof(why)), -EINVAL); /* disarmed */
	free(q);
	free(out);
	free(plain);
	layer_free(&L);
}

/* The emulator's fault injection (tests/simt/fake_cudart.cpp): after n more
 * work items, a synchronization meets an illegal address and every later
 * runtime call returns it, as a context lost to a sticky error does.  NULL
 * on a GPU (no such hook in the CUDA runtime). */
void fake_cuda_fault_code(long after, int code) __attribute__((weak));

/* A device fault (an illegal address in a kernel: a sticky error) loses the
 * process's CUDA context: the call that met it fails with -ENOTRECOVERABLE
 * and says so, tqc_device_lost reports it from then on, and every later
 * call that would touch the device fails at once with the same reason,
 * whatever its arguments.  Runs last: nothing on the device works after it
 * (on the emulator only: a real GPU has no fault to inject). */
/* Device pages against the host pages (the reference's bytes): 0 when equal. */
static int pages_match(const struct layer *L, const char *what)
{
	uint8_t *got = malloc(L->page_bytes);
	int rc = got ? 0 : -1;

	for (uint32_t i = 0; i < L->n_pages && !rc; i++) {
		if (buf_read(&(struct buf){ .p = (void *)L->dpages[i] }, got, L->page_bytes))
			rc = -1;
		else if (memcmp(got, L->hpages[i], L->page_bytes)) {
			fprintf(stderr, "  %s: page %u differs from the reference encoder's\n", what, i);
			rc = -1;
		}
	}
	free(got);
	return rc;
}

/* One tqc_append_attend case on layer L (length len, room after it): n
 * tokens of f32 K/V in `mem` memory appended at len, n_q queries at the
 * last n_q positions (causal); then the same attention alone.  Checks: the
 * result and stage, tqc_ctx_last_fused == fused, the pages byte for byte
 * the reference encoder's, the output bit for bit the attention alone's and
 * within TOL of the oracle.  0 when all hold. */
static int aa_case(struct layer *L, uint32_t len, uint32_t n, int n_q, int group, enum mem mem, int fused,
		   const char *what)
{
	const int H = (int)L->g.n_kv_heads, d = L->dim, nqh = H * group;
	const size_t tok = (size_t)H * d, rows = (size_t)n_q * nqh, ob = rows * d * sizeof(float);
	float *k = malloc(sizeof(float) * tok * n), *v = malloc(sizeof(float) * tok * n);
	float *q = make_q(n_q, nqh, d), *out = malloc(ob + 4), *alone = malloc(ob + 4), *ref = malloc(ob + 4);
	int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_q + 4);
	struct buf kb = { 0 }, vb = { 0 };
	tq_error err;
	uint32_t bad = 7;
	int stage = -1, rc = -1;

	if (!k || !v || !q || !out || !alone || !ref || !pos)
		goto out;
	for (size_t i = 0; i < tok * n; i++) {
		k[i] = gauss() + 0.3f * (float)(i % 7);
		v[i] = gauss();
	}
	for (int i = 0; i < n_q; i++)
		pos[i] = (int32_t)(len + n) - n_q + i;
	/* the expected bytes: the reference encoder into the host pages */
	for (uint32_t t = 0; t < n; t++)
		for (int h = 0; h < H; h++) {
			uint32_t s = len + t, pg = s / L->g.page_tokens, sl = s % L->g.page_tokens;
			if (tq_encode_ref(L->kc, k + t * tok + (size_t)h * d, TQ_DTYPE_F32, 1,
					  L->hpages[pg] + tq_page_k_off(&L->g, (uint32_t)h, sl), &err) ||
			    tq_encode_ref(L->vc, v + t * tok + (size_t)h * d, TQ_DTYPE_F32, 1,
					  L->hpages[pg] + tq_page_v_off(&L->g, (uint32_t)h, sl), &err)) {
				fprintf(stderr, "  %s: reference: %s\n", what, err.msg);
				goto out;
			}
		}
	if (buf_new(&kb, mem, sizeof(float) * tok * n, k) || buf_new(&vb, mem, sizeof(float) * tok * n, v))
		goto out;
	layer_set_len(L, len);
	struct tqc_append a = { .k_codec = L->kc, .v_codec = L->vc, .kv = &L->dt, .pos = len, .n = n, .k = kb.p,
				.v = vb.p, .dtype = TQ_DTYPE_F32 };
	struct tq_page_table at = L->dt;
	at.n_tokens = len + n;
	struct tq_attn_params p = { .k_codec = L->kc, .v_codec = L->vc, .n_q_heads = nqh, .kv = &at, .n_q = n_q,
				    .q = q, .q_dtype = TQ_DTYPE_F32, .q_pos = pos, .causal = 1, .out = out };
	memset(out, 0xFF, ob);
	int r = tqc_append_attend(ctx, &a, &p, &bad, &stage, &err);
	if (r || stage != TQC_STAGE_NONE || bad != UINT32_MAX) {
		fprintf(stderr, "  %s: rc %d stage %d bad %u: %s\n", what, r, stage, bad, r ? err.msg : "");
		goto out;
	}
	if (tqc_ctx_last_fused(ctx) != fused) {
		fprintf(stderr, "  %s: fused %d, expected %d\n", what, tqc_ctx_last_fused(ctx), fused);
		goto out;
	}
	if (pages_match(L, what))
		goto out;
	layer_set_len(L, len + n);
	p.out = alone;
	if (tqc_attend(ctx, &p, &err)) {
		fprintf(stderr, "  %s: tqc_attend: %s\n", what, err.msg);
		goto out;
	}
	if (memcmp(out, alone, ob)) {
		fprintf(stderr, "  %s: the output differs from the attention alone's\n", what);
		goto out;
	}
	p.kv = &L->ht;
	p.out = ref;
	if (tq_attend_ref(&p, &err)) {
		fprintf(stderr, "  %s: oracle: %s\n", what, err.msg);
		goto out;
	}
	double e = row_err(out, ref, rows, d);
	if (!(e <= TOL)) {
		fprintf(stderr, "  %s: error %.3g against the oracle\n", what, e);
		goto out;
	}
	rc = 0;
out:
	buf_free(&kb);
	buf_free(&vb);
	free(k);
	free(v);
	free(q);
	free(out);
	free(alone);
	free(ref);
	free(pos);
	return rc;
}

/* tqc_append_attend: one layer's decode step.  The append is queued ahead
 * of the attention where it needs no staging (inputs in device or unified
 * memory, a page table that rides in the launch); otherwise the two run in
 * turn.  Either way the pages are the reference encoder's and the output
 * the attention alone's, bit for bit; a failure names its part. */
static void test_append_attend(void)
{
	enum { H = 2, G = 4, D = 128 };
	const uint32_t pt = 64, len = 300;
	struct layer L;
	tq_error err;
	uint32_t bad;
	int stage;

	rng_state = t_seed() ^ 0xAA;
	/* room for 300 + 600 tokens */
	T_ASSERT(layer_new(&L, TQ_CODEC_TQ4, TQ_CODEC_TQ3, D, H, pt, (len + 600 + pt - 1) / pt, t_seed(), MEM_DEVICE) ==
		 0);
	T_ASSERT(layer_fill(&L, len, 1, t_seed()) == 0);
	uint32_t at = len;
	T_EQ(aa_case(&L, at, 1, 1, G, MEM_DEVICE, 1, "decode token, inputs on the device"), 0);
	at += 1;
	T_EQ(aa_case(&L, at, 1, 1, G, MEM_UNIFIED, 1, "decode token, inputs in unified memory"), 0);
	at += 1;
	T_EQ(aa_case(&L, at, 1, 1, G, MEM_HOST, 0, "decode token, inputs in plain host memory (staged)"), 0);
	at += 1;
	T_EQ(aa_case(&L, at, 1, 1, G, MEM_REGISTERED, 1, "decode token, inputs in registered host memory"), 0);
	at += 1;
	/* 3 tokens across a page boundary (slots 318..320), 3 queries */
	at = 318;
	T_EQ(aa_case(&L, at, 3, 3, G, MEM_DEVICE, 1, "3 tokens across a page boundary"), 0);
	at += 3;
	/* 580 tokens: 10 pages, more than a launch's arguments carry */
	T_EQ(aa_case(&L, at, 580, 2, G, MEM_DEVICE, 0, "580 tokens (a page table)"), 0);
	at += 580;

	/* failures: a NaN in the second token's V (the attention has run over
	 * the slots when it is found) */
	{
		const size_t tok = (size_t)H * D;
		struct buf kb, vb;
		float *kv = malloc(sizeof(float) * tok * 2), *q = make_q(1, H * G, D), *out = malloc(sizeof(float) * H * G * D);
		T_ASSERT(kv && q && out);
		for (size_t i = 0; i < tok * 2; i++)
			kv[i] = gauss();
		T_ASSERT(buf_new(&kb, MEM_DEVICE, sizeof(float) * tok * 2, kv) == 0);
		kv[tok + D + 5] = NAN; /* token 1, head 1, element 5 */
		T_ASSERT(buf_new(&vb, MEM_DEVICE, sizeof(float) * tok * 2, kv) == 0);
		const uint32_t base = 100; /* rewrite slots 100, 101 of the 881 */
		layer_set_len(&L, base);
		/* the failing vector's slot holds another session's bytes (0xA5,
		 * as far as the kernels know): the encoder zeroes it before the
		 * attention queued behind it reads it */
		static const uint32_t failed[1][3] = { { 101, 1, 1 } };
		T_EQ(failed_blocks_zeroed(&L, failed, 1), 1); /* it was the layer's token 101: not zero */
		struct tqc_append a = { .k_codec = L.kc, .v_codec = L.vc, .kv = &L.dt, .pos = base, .n = 2, .k = kb.p,
					.v = vb.p, .dtype = TQ_DTYPE_F32 };
		struct tq_page_table t2 = L.dt;
		t2.n_tokens = base + 2;
		int32_t qp = (int32_t)base + 1;
		struct tq_attn_params p = { .k_codec = L.kc, .v_codec = L.vc, .n_q_heads = H * G, .kv = &t2, .n_q = 1,
					    .q = q, .q_dtype = TQ_DTYPE_F32, .q_pos = &qp, .causal = 1, .out = out };
		T_EQ(tqc_append_attend(ctx, &a, &p, &bad, &stage, &err), -EINVAL);
		T_EQ(stage, TQC_STAGE_APPEND);
		T_EQ(bad, 1);
		T_EQ(tqc_ctx_last_fused(ctx), 0);
		if (!strstr(err.msg, "token 1 V head 1: NaN or Inf at element 5"))
			T_FAIL("the append's error: %s", err.msg);
		T_EQ(failed_blocks_zeroed(&L, failed, 1), 0);
		/* the attention fails (a position past the layer) after a good
		 * append: its error, and the append's tokens are written */
		buf_free(&vb);
		for (size_t i = 0; i < tok * 2; i++)
			kv[i] = gauss();
		T_ASSERT(buf_new(&vb, MEM_DEVICE, sizeof(float) * tok * 2, kv) == 0);
		a.v = vb.p;
		qp = (int32_t)base + 2;
		T_EQ(tqc_append_attend(ctx, &a, &p, &bad, &stage, &err), -EINVAL);
		T_EQ(stage, TQC_STAGE_ATTEND);
		T_EQ(bad, UINT32_MAX);
		T_EQ(tqc_ctx_last_fused(ctx), 0); /* queued, but it failed */
		if (!strstr(err.msg, "position"))
			T_FAIL("the attention's error: %s", err.msg);
		/* both fail: the append's is the one reported */
		kv[3] = INFINITY;
		buf_free(&kb);
		T_ASSERT(buf_new(&kb, MEM_DEVICE, sizeof(float) * tok * 2, kv) == 0);
		a.k = kb.p;
		T_EQ(tqc_append_attend(ctx, &a, &p, &bad, &stage, &err), -EINVAL);
		T_EQ(stage, TQC_STAGE_APPEND);
		T_EQ(bad, 0);
		if (!strstr(err.msg, "token 0 K head 0: NaN or Inf at element 3"))
			T_FAIL("the append's error: %s", err.msg);
		/* no query: the append alone, still queued ahead */
		kv[3] = 0.5f;
		buf_free(&kb);
		T_ASSERT(buf_new(&kb, MEM_DEVICE, sizeof(float) * tok * 2, kv) == 0);
		a.k = kb.p;
		p.n_q = 0;
		T_EQ(tqc_append_attend(ctx, &a, &p, &bad, &stage, &err), 0);
		T_EQ(stage, TQC_STAGE_NONE);
		T_EQ(tqc_ctx_last_fused(ctx), 1);
		/* arguments */
		T_ASSERT(tqc_append_attend(NULL, &a, &p, &bad, &stage, &err) == -EINVAL && stage == TQC_STAGE_APPEND);
		T_ASSERT(tqc_append_attend(ctx, NULL, &p, NULL, NULL, &err) == -EINVAL);
		T_ASSERT(tqc_append_attend(ctx, &a, NULL, &bad, &stage, &err) == -EINVAL && stage == TQC_STAGE_ATTEND);
		buf_free(&kb);
		buf_free(&vb);
		free(kv);
		free(q);
		free(out);
	}
	layer_free(&L);
}

static void test_device_lost(void)
{
	enum { H = 2, G = 4, D = 64 };
	const uint32_t len = 300;
	const int32_t pos = (int32_t)len - 1;
	char why[512], w2[512];
	tq_error err;
	struct layer L;

	if (!fake_cuda_fault_code) {
		fprintf(stderr, "  (a device fault can be injected on the emulator only: not run here)\n");
		return;
	}
	T_EQ(tqc_device_lost(why, sizeof(why)), 0);
	T_ASSERT(layer_build(&L, TQ_CODEC_TQ4, TQ_CODEC_TQ3, D, H, 64, len, 0, t_seed()) != NULL);
	float *q = make_q(1, H * G, D), *out = malloc(sizeof(float) * H * G * D);
	T_ASSERT(q && out);
	struct tq_attn_params p = { .k_codec = L.kc, .v_codec = L.vc, .n_q_heads = H * G, .kv = &L.dt, .n_q = 1,
				    .q = q, .q_dtype = TQ_DTYPE_F32, .q_pos = &pos, .causal = 1, .out = out };
	T_EQ(tqc_attend(ctx, &p, &err), 0);
	/* An append queued on the stream meets the end of the MPS client
	 * (sticky, as an illegal address is: device_lost.sh; it was taken for
	 * a one-off error, and the daemon served on a dead context), and the
	 * attention after it fails on its own before queueing anything (a
	 * position past the layer): the loss is what the call reports (it
	 * returned the attention's EINVAL, and nothing knew the context was
	 * lost). */
	const size_t tok = (size_t)H * D;
	float *kv = malloc(sizeof(float) * tok * 2);
	struct buf kb;
	T_ASSERT(kv != NULL);
	for (size_t i = 0; i < tok * 2; i++)
		kv[i] = gauss();
	T_ASSERT(buf_new(&kb, MEM_DEVICE, sizeof(float) * tok * 2, kv) == 0);
	layer_set_len(&L, 100);
	struct tqc_append a0 = { .k_codec = L.kc, .v_codec = L.vc, .kv = &L.dt, .pos = 100, .n = 2, .k = kb.p,
				 .v = kb.p, .dtype = TQ_DTYPE_F32 };
	struct tq_page_table t2 = L.dt;
	t2.n_tokens = 102;
	const int32_t past = 102;
	struct tq_attn_params pb = p;
	pb.kv = &t2;
	pb.q_pos = &past;
	int st0 = -1;
	uint32_t bad0 = 0;
	fake_cuda_fault_code(0, 810); /* the append's kernel, the first work item */
	T_EQ(tqc_append_attend(ctx, &a0, &pb, &bad0, &st0, &err), -ENOTRECOVERABLE);
	T_EQ(st0, TQC_STAGE_APPEND);
	if (!strstr(err.msg, "cudaErrorMpsClientTerminated") || !strstr(err.msg, "context is lost"))
		T_FAIL("the reason: %s", err.msg);
	T_EQ(tqc_device_lost(why, sizeof(why)), 1);
	T_ASSERT(strcmp(why, err.msg) == 0);
	buf_free(&kb);
	free(kv);
	/* everything after: the same reason at once */
	memset(&err, 0, sizeof(err));
	T_EQ(tqc_attend(ctx, &p, &err), -ENOTRECOVERABLE);
	T_ASSERT(strcmp(err.msg, why) == 0);
	struct tqc_append a;
	uint32_t bad = 0;
	memset(&a, 0, sizeof(a)); /* its arguments are not even looked at */
	T_EQ(tqc_append(ctx, &a, &bad, &err), -ENOTRECOVERABLE);
	T_ASSERT(strcmp(err.msg, why) == 0);
	T_EQ(bad, UINT32_MAX);
	int stage = -1;
	memset(&err, 0, sizeof(err));
	T_EQ(tqc_append_attend(ctx, &a, &p, &bad, &stage, &err), -ENOTRECOVERABLE);
	T_ASSERT(stage == TQC_STAGE_APPEND && strcmp(err.msg, why) == 0);
	uint8_t host[64] = { 0 };
	T_EQ(tqc_copy(dev, (void *)L.dpages[0], host, sizeof(host), w2, sizeof(w2)), -ENOTRECOVERABLE);
	T_ASSERT(strcmp(w2, why) == 0);
	void *mem = NULL;
	T_EQ(tqc_region_alloc(dev, 1 << 20, 0, &mem, w2, sizeof(w2)), -ENOTRECOVERABLE);
	T_ASSERT(mem == NULL);
	tqc_ctx *x2 = NULL;
	T_EQ(tqc_ctx_new(&x2, dev, &err), -ENOTRECOVERABLE);
	T_ASSERT(x2 == NULL && strcmp(err.msg, why) == 0);
	T_ASSERT(tqc_pinned_alloc(dev, 4096) == NULL);
	free(q);
	free(out);
	layer_free(&L);
}

static void test_attn_query_dtypes(void)
{
	struct layer L;
	int32_t pos[2] = { 10, 99 };
	float *q = make_q(2, 8, 128);
	uint16_t h[2 * 8 * 128];

	T_ASSERT(layer_build(&L, TQ_CODEC_TQ4, TQ_CODEC_TQ4, 128, 2, 32, 100, 0, t_seed()) != NULL);
	for (int i = 0; i < 2 * 8 * 128; i++)
		h[i] = tq_f32_to_f16(q[i]);
	double e1 = compare(&L, 2, 8, h, TQ_DTYPE_F16, pos, 1, 0.0f, MEM_HOST, "f16 q");
	for (int i = 0; i < 2 * 8 * 128; i++)
		h[i] = tq_f32_to_bf16(q[i]);
	double e2 = compare(&L, 2, 8, h, TQ_DTYPE_BF16, pos, 1, 0.0f, MEM_HOST, "bf16 q");
	free(q);
	layer_free(&L);
	T_ASSERT(e1 >= 0 && e1 <= TOL);
	T_ASSERT(e2 >= 0 && e2 <= TOL);
}

/* The checks of tq_attend, with its messages; an empty cache; n_q = 0. */
static void test_attn_errors(void)
{
	struct layer L, L0;
	int32_t pos[2] = { 5, 9 };
	float out[2 * 8 * 128];
	tq_error err, cerr;

	T_ASSERT(layer_build(&L, TQ_CODEC_TQ4, TQ_CODEC_Q8, 128, 2, 8, 10, 0, t_seed()) != NULL);
	T_ASSERT(layer_new(&L0, TQ_CODEC_TQ4, TQ_CODEC_Q8, 128, 2, 8, 0, t_seed(), MEM_DEVICE) == 0);
	float *q = make_q(2, 8, 128);
	struct tq_attn_params p = { .k_codec = L.kc, .v_codec = L.vc, .n_q_heads = 8, .kv = &L.dt, .n_q = 2,
				    .q = q, .q_dtype = TQ_DTYPE_F32, .q_pos = pos, .causal = 1, .out = out };
	struct tq_attn_params c = p; /* the same call on the CPU */
	c.kv = &L.ht;
#define BOTH_FAIL(want)                                                                                    \
	do {                                                                                               \
		int _g = tqc_attend(ctx, &p, &err), _c = tq_attend(&c, &cerr);                             \
		if (_g != (want) || _c != (want) || strcmp(err.msg, cerr.msg))                              \
			T_FAIL("gpu %d '%s', cpu %d '%s', want %d", _g, err.msg, _c, cerr.msg, (int)(want)); \
	} while (0)

	T_EQ(tqc_attend(ctx, &p, &err), 0);
	/* positions past the cache, negative, missing */
	pos[1] = 10;
	BOTH_FAIL(-EINVAL);
	pos[1] = -1;
	BOTH_FAIL(-EINVAL);
	pos[1] = 9;
	p.q_pos = c.q_pos = NULL;
	BOTH_FAIL(-EINVAL);
	p.q_pos = c.q_pos = pos;
	/* NaN / Inf queries in every dtype */
	q[8 * 128 + 77] = NAN;
	BOTH_FAIL(-EINVAL);
	q[8 * 128 + 77] = INFINITY;
	BOTH_FAIL(-EINVAL);
	q[8 * 128 + 77] = 0.5f;
	uint16_t h[2 * 8 * 128];
	for (int i = 0; i < 2 * 8 * 128; i++)
		h[i] = tq_f32_to_f16(q[i]);
	h[3] = 0x7C00;
	p.q = c.q = h;
	p.q_dtype = c.q_dtype = TQ_DTYPE_F16;
	BOTH_FAIL(-EINVAL);
	h[3] = 0x7FC0;
	p.q_dtype = c.q_dtype = TQ_DTYPE_BF16;
	BOTH_FAIL(-EINVAL);
	p.q = c.q = q;
	p.q_dtype = c.q_dtype = TQ_DTYPE_F32;
	/* shapes and codecs */
	p.n_q_heads = c.n_q_heads = 7;
	BOTH_FAIL(-EINVAL);
	p.n_q_heads = c.n_q_heads = 8;
	p.v_codec = c.v_codec = L.kc;
	BOTH_FAIL(-EINVAL);
	p.v_codec = c.v_codec = L.vc;
	p.scale = c.scale = NAN;
	BOTH_FAIL(-EINVAL);
	p.scale = c.scale = 0.0f;
	p.out = c.out = NULL;
	BOTH_FAIL(-EINVAL);
	p.out = c.out = out;
	/* sparse-V's threshold: checked as on the CPU */
	p.sparse_v = c.sparse_v = 1.5f;
	BOTH_FAIL(-EINVAL);
	p.sparse_v = c.sparse_v = NAN;
	BOTH_FAIL(-EINVAL);
	p.sparse_v = c.sparse_v = -0.01f;
	BOTH_FAIL(-EINVAL);
	p.sparse_v = c.sparse_v = 0.0f;
	/* what the GPU ignores */
	p.isa = (enum tq_isa)99;
	p.plan_n_q = 1;
	T_EQ(tqc_attend(ctx, &p, &err), 0);
	p.isa = TQ_ISA_AUTO;
	p.plan_n_q = 0;
	/* a page that is not page aligned */
	const uint8_t *keep = L.dpages[1];
	L.dpages[1] = keep + 4;
	T_EQ(tqc_attend(ctx, &p, &err), -EINVAL);
	T_ASSERT(strstr(err.msg, "aligned") != NULL);
	L.dpages[1] = keep;
	T_EQ(tqc_attend(NULL, &p, &err), -EINVAL);

	/* an empty cache: causal positions are all past it; not causal: zeros */
	p.kv = &L0.dt;
	T_EQ(tqc_attend(ctx, &p, &err), -EINVAL);
	p.causal = 0;
	p.q_pos = NULL;
	for (int m = 0; m < 3; m++) {
		struct buf ob;
		memset(out, 0x7F, sizeof(out));
		T_ASSERT(buf_new(&ob, (enum mem)m, sizeof(out), out) == 0);
		p.out = ob.p;
		int rc = tqc_attend(ctx, &p, &err);
		T_ASSERT(buf_read(&ob, out, sizeof(out)) == 0);
		buf_free(&ob);
		T_EQ(rc, 0);
		for (int i = 0; i < 2 * 8 * 128; i++)
			T_ASSERT(out[i] == 0.0f);
	}
	p.out = out;
	p.n_q = 0;
	T_EQ(tqc_attend(ctx, &p, &err), 0);
#undef BOTH_FAIL
	free(q);
	layer_free(&L);
	layer_free(&L0);
}

/* Finite inputs whose logits leave float range: (a) +inf for one key, (b)
 * -inf for every key, (c) NaN (products overflowing both ways) for some
 * keys, (d) NaN for the keys of the last splits of a long context next to a
 * row that sees only ordinary keys, (e) -inf for one key among finite ones,
 * (f) NaN for every 4th key (on the GPU: all the keys one warp of a CTA
 * walks, while the others see finite logits): those rows are NaN (as on the
 * CPU path, which is checked too), the ordinary row is not.  With f32 keys
 * and values (the general kernel) and q8 ones (the tiled kernel: int8 keys
 * of +-127 at a block scale of 1e28). */
static void test_attn_overflow(void)
{
	static float big[128], alt[128];
	float out[2 * 128];
	tq_error err;

	for (int j = 0; j < 128; j++) {
		big[j] = 1e30f;
		alt[j] = (j & 1) ? -1e30f : 1e30f;
	}
	for (int ci = 0; ci < 2; ci++)
	for (int dim = 64; dim <= 128; dim += 64)
		for (int cs = 0; cs < 6; cs++) {
			const enum tq_codec_id cid = ci ? TQ_CODEC_Q8 : TQ_CODEC_F32;
			const uint32_t len = cs == 3 ? 5000 : 40;
			const int nq = cs == 3 ? 2 : 1;
			int32_t pos[2] = { (int32_t)len - 1, 1000 };
			struct layer L;
			float qb[2 * 128];

			T_ASSERT(layer_build(&L, cid, cid, dim, 1, 256, len, 0, t_seed()) != NULL);
			for (uint32_t t = 0; t < len; t++) {
				const float *x = NULL;
				if ((cs == 0 && t == 0) || cs == 1 || (cs == 4 && t == 5))
					x = big;
				else if ((cs == 2 && t < 32) || (cs == 3 && t >= 4000) || (cs == 5 && t % 4 == 1))
					x = alt;
				uint8_t *blk = L.hpages[t / 256] + tq_page_k_off(&L.g, 0, t % 256);
				if (x && cid == TQ_CODEC_F32) {
					memcpy(blk, x, sizeof(float) * dim);
				} else if (x) {
					const float s = 1e28f;
					memcpy(blk, &s, sizeof(s));
					for (int j = 0; j < dim; j++)
						blk[TQ_Q8_HEADER_BYTES + j] = (uint8_t)(x[j] > 0 ? 127 : -127);
				}
			}
			T_ASSERT(layer_upload(&L) == 0);
			for (int j = 0; j < dim; j++) {
				qb[j] = cs == 1 || cs == 4 ? -1e10f : 1e10f;
				qb[dim + j] = gauss();
			}
			struct tq_attn_params p = { .k_codec = L.kc, .v_codec = L.vc, .n_q_heads = 1, .kv = &L.dt,
						    .n_q = nq, .q = qb, .q_dtype = TQ_DTYPE_F32, .q_pos = pos,
						    .causal = 1, .out = out };
			T_EQ(tqc_attend(ctx, &p, &err), 0);
			for (int j = 0; j < dim; j++)
				if (!isnan(out[j]))
					T_FAIL("case %c %s d %d (%s kernel): out[%d] = %g, not NaN", 'a' + cs,
					       tq_codec_name(cid), dim, tqc_ctx_last_attn(ctx), j, out[j]);
			float cpu[2 * 128];
			p.kv = &L.ht;
			p.out = cpu;
			T_EQ(tq_attend(&p, &err), 0);
			for (int j = 0; j < dim; j++)
				if (!isnan(cpu[j]))
					T_FAIL("case %c %s d %d: the CPU path gives %g, not NaN", 'a' + cs, tq_codec_name(cid),
					       dim, cpu[j]);
			if (nq > 1) {
				float ref[2 * 128];
				p.out = ref;
				T_EQ(tq_attend_ref(&p, &err), 0);
				T_ASSERT(row_err(out + dim, ref + dim, 1, dim) <= TOL);
			}
			layer_free(&L);
		}
}

/* ---- devices and memory ------------------------------------------------------------- */

static void test_device(void)
{
	struct tqc_device_info info;
	char why[200];
	int n = tqc_device_count(why, sizeof(why));

	T_ASSERT(n >= 1);
	T_EQ(tqc_device_query(dev, &info, why, sizeof(why)), 0);
	fprintf(stderr, "    device %d: %s, cc %d.%d, %d SMs, %.1f GiB (%.1f free), %.0f GB/s, driver %d runtime %d%s\n",
		info.device, info.name, info.cc_major, info.cc_minor, info.sms, info.total_bytes / 1073741824.0,
		info.free_bytes / 1073741824.0, info.peak_gbps, info.driver_version, info.runtime_version,
		tqc_device_unified(&info) ? ", unified memory" : "");
	T_ASSERT(info.sms >= 1 && info.cc_major >= 8 && info.total_bytes > 0 && info.name[0]);
	T_EQ(tqc_device_query(n, &info, why, sizeof(why)), -ENODEV);
	T_ASSERT(strstr(why, "there are") != NULL);
	T_EQ(tqc_ctx_device(ctx), dev);
	T_ASSERT(tqc_built() == 1);
	/* unified memory: an integrated GPU, or one that reads pageable memory
	 * through the host's own page tables (Grace); not HMM's mirror on an
	 * x86 server (its pool belongs in the GPU's memory) */
	struct tqc_device_info u = { 0 };
	T_EQ(tqc_device_unified(&u), 0);
	u.pageable_access = 1;
	T_EQ(tqc_device_unified(&u), 0); /* HMM */
	u.host_page_tables = 1;
	T_EQ(tqc_device_unified(&u), 1); /* ATS: GH200, GB10 */
	u = (struct tqc_device_info){ .integrated = 1 };
	T_EQ(tqc_device_unified(&u), 1);
}

static void test_memory(void)
{
	char why[200];
	void *d = NULL, *u = NULL;
	uint8_t src[4096], back[4096];

	for (int i = 0; i < 4096; i++)
		src[i] = (uint8_t)(i * 7 + 1);
	T_EQ(tqc_region_alloc(dev, 3u << 20, 0, &d, why, sizeof(why)), 0);
	T_EQ(tqc_region_alloc(dev, 5u << 20, 1, &u, why, sizeof(why)), 0);
	T_ASSERT(((uintptr_t)d & ((2u << 20) - 1)) == 0);
	T_ASSERT(((uintptr_t)u & ((2u << 20) - 1)) == 0);
	/* unified: the host writes, the device copies, the host reads */
	memcpy(u, src, sizeof(src));
	T_EQ(tqc_copy(dev, d, u, sizeof(src), why, sizeof(why)), 0);
	T_EQ(tqc_copy(dev, (uint8_t *)u + 8192, d, sizeof(src), why, sizeof(why)), 0);
	T_ASSERT(memcmp((uint8_t *)u + 8192, src, sizeof(src)) == 0);
	T_EQ(tqc_copy(dev, back, d, sizeof(src), why, sizeof(why)), 0);
	T_ASSERT(memcmp(back, src, sizeof(src)) == 0);
	tqc_region_free(dev, d, 0);
	tqc_region_free(dev, u, 1);
	T_EQ(tqc_region_alloc(dev, 0, 0, &d, why, sizeof(why)), -EINVAL);
	void *pin = tqc_pinned_alloc(dev, 1 << 20);
	T_ASSERT(pin != NULL);
	tqc_pinned_free(pin);

	/* registered host memory as an append input and an attention output */
	struct layer L;
	const int dim = 64;
	T_ASSERT(layer_new(&L, TQ_CODEC_TQ4, TQ_CODEC_Q8, dim, 1, 16, 1, t_seed(), MEM_DEVICE) == 0);
	size_t bytes = 2 * 16 * dim * sizeof(float) + 2 * dim * sizeof(float);
	float *reg = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
	T_ASSERT(reg != NULL);
	int rr = tqc_host_register(dev, reg, (bytes + 4095) & ~(size_t)4095, why, sizeof(why));
	if (rr == 0) {
		float *k = reg, *v = reg + 16 * dim, *o = reg + 32 * dim;
		rng_state = t_seed();
		for (int i = 0; i < 16 * dim; i++) {
			k[i] = gauss();
			v[i] = gauss();
		}
		T_EQ(append_both(&L, 0, 16, (uint8_t *)k, (uint8_t *)v, TQ_DTYPE_F32, MEM_HOST, "registered input"), 0);
		/* append_both copied the inputs; this call reads the registered ones */
		uint32_t bad;
		tq_error err;
		struct tqc_append a = { .k_codec = L.kc, .v_codec = L.vc, .kv = &L.dt, .pos = 0, .n = 16, .k = k, .v = v,
					.dtype = TQ_DTYPE_F32 };
		T_EQ(tqc_append(ctx, &a, &bad, &err), 0);
		layer_set_len(&L, 16);
		float *q = make_q(1, 2, dim), ref[2 * 64];
		int32_t pos = 15;
		struct tq_attn_params p = { .k_codec = L.kc, .v_codec = L.vc, .n_q_heads = 2, .kv = &L.ht, .n_q = 1,
					    .q = q, .q_dtype = TQ_DTYPE_F32, .q_pos = &pos, .causal = 1, .out = ref };
		T_EQ(tq_attend_ref(&p, &err), 0);
		p.kv = &L.dt;
		p.out = o;
		T_EQ(tqc_attend(ctx, &p, &err), 0);
		T_ASSERT(row_err(o, ref, 2, dim) <= TOL);
		free(q);
		tqc_host_unregister(dev, reg);
	} else {
		fprintf(stderr, "    host registration unavailable: %s\n", why);
	}
	free(reg);
	layer_free(&L);
}

/* A context created with the environment variable `name` set to `val` (the
 * environment steers a context at its creation: tq_cuda.h); NULL on
 * failure, said. */
static tqc_ctx *ctx_env(const char *name, const char *val)
{
	const char *was = getenv(name);
	char *keep = was ? strdup(was) : NULL;
	tqc_ctx *c = NULL;
	tq_error err;

	setenv(name, val, 1);
	if (tqc_ctx_new(&c, dev, &err)) {
		fprintf(stderr, "tqc_ctx_new(%d) with %s=%s: %s\n", dev, name, val, err.msg);
		c = NULL;
	}
	if (keep)
		setenv(name, keep, 1);
	else
		unsetenv(name);
	free(keep);
	return c;
}

int main(void)
{
	char why[256];
	tq_error err;
	const char *e = getenv("TQ_CUDA_DEVICE");

	quick = getenv("TQ_CUDA_QUICK") && atoi(getenv("TQ_CUDA_QUICK"));
	general_only = getenv("TQ_CUDA_ATTN") && !strcmp(getenv("TQ_CUDA_ATTN"), "general");

	if (!tqc_built()) {
		snprintf(why, sizeof(why), "built without CUDA");
		t_skip(why);
	}
	int n = tqc_device_count(why, sizeof(why));
	if (n <= 0)
		t_skip(why);
	dev = e ? atoi(e) : 0;
	struct tqc_device_info di;
	if (tqc_device_query(dev, &di, why, sizeof(why)) < 0) {
		fprintf(stderr, "tqc_device_query(%d): %s\n", dev, why);
		return 1;
	}
	smem_optin = di.smem_block_optin;
	n_sms = di.sms;
	smem_sm = di.smem_sm;
	if (tqc_ctx_new(&ctx, dev, &err)) {
		fprintf(stderr, "tqc_ctx_new(%d): %s\n", dev, err.msg);
		return 1;
	}
	tqc_ctx *const main_ctx = ctx;
	enc_general_only = getenv("TQ_CUDA_ENC") && !strcmp(getenv("TQ_CUDA_ENC"), "general");
	if (!(gctx = ctx_env("TQ_CUDA_ENC", "general")) || !(sctx = ctx_env("TQ_CUDA_SPLIT_MIN", "256")) ||
	    !(lctx = ctx_env("TQ_CUDA_SPLIT_MIN", "1048576")) || !(pctx = ctx_env("TQ_CUDA_ENC_PASS", "1000")))
		return 1;
	enc_ctx = ctx;
	if (!(cache = tq_cache_new()))
		return 1;
	T_RUN(test_device);
	T_RUN(test_memory);
	T_RUN(test_encode_args);
	T_RUN(test_encode_exact);
	T_RUN(test_encode_reg);
	T_RUN(test_encode_bound_ties);
	T_RUN(test_encode_errors);
	T_RUN(test_encode_long);
	T_RUN(test_attn_errors);
	T_RUN(test_attn_pairs);
	T_RUN(test_attn_contexts);
	T_RUN(test_attn_unified_pages);
	T_RUN(test_attn_prefill);
	T_RUN(test_attn_split_k);
	T_RUN(test_attn_waves);
	T_RUN(test_attn_shared_gpu);
	T_RUN(test_attn_smem_race);
	T_RUN(test_append_attend);
	T_RUN(test_attn_sharp);
	T_RUN(test_attn_sparse_v);
	T_RUN(test_attn_phases);
	T_RUN(test_attn_query_dtypes);
	T_RUN(test_attn_overflow);
	T_RUN(test_device_lost); /* last: the device is lost after it */
	tqc_ctx_free(main_ctx); /* a failed case may leave ctx at another */
	tqc_ctx_free(gctx);
	tqc_ctx_free(sctx);
	tqc_ctx_free(lctx);
	tqc_ctx_free(pctx);
	tq_cache_free(cache);
	return t_done();
}
