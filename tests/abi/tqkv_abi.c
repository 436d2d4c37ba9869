/* tqkv_abi: libtqkv's binary interface, through the shared library, the
 * way programs built against older releases call it (libtqkv_abi.sh runs
 * it against a real tqkvd: argv[1] is its run directory).
 *
 * A program built against 0.1 or 0.2 calls tqkv_connect@TQKV_0.1,
 * tqkv_session_open@TQKV_0.1 and tqkv_session_info@TQKV_0.2 with the
 * shorter structs of those releases, restated here as they were shipped
 * (not taken from tqkv.h, which has moved on).  Checked: each old entry
 * point works, reads no field its release did not have (ASan, on structs
 * allocated to their exact size), and writes none past its struct
 * (canaries, in every build); and tqkv_client_id, tqkv_session_checkpoint
 * and tqkv_session_drop (its rights between users: hostile_uid.sh). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tqkv.h>

/* ---- the 0.1 / 0.2 structs, as released ---- */
struct opts_0_1 {
	const char *run_dir;
	uint32_t queue_depth;
	uint64_t arena_bytes;
	uint32_t flags;
	int timeout_ms;
};

struct params_0_1 {
	const char *tenant, *name;
	uint32_t n_layers, n_kv_heads, n_q_heads, head_dim;
	const char *k_codec, *v_codec;
	uint64_t max_tokens;
	int has_seed;
	uint64_t seed;
	uint32_t flags;
};

struct info_0_2 {
	uint64_t id, tokens, max_tokens, resident_bytes, spilled_bytes;
	int evicted, persistent;
};

/* calls to these go to the old versions, as an old binary's do */
int old_connect(tqkv **out, const struct opts_0_1 *o);
int old_session_open(tqkv *c, const struct params_0_1 *p, tqkv_session **out);
int old_session_info(tqkv_session *s, struct info_0_2 *out);
__asm__(".symver old_connect,tqkv_connect@TQKV_0.1");
__asm__(".symver old_session_open,tqkv_session_open@TQKV_0.1");
__asm__(".symver old_session_info,tqkv_session_info@TQKV_0.2");

enum { LAYERS = 2, KV = 2, QH = 4, DIM = 64, NT = 8, CANARY = 0xA5 };

static int failures;

#define CHECK(cond, ...)                                                               \
	do {                                                                           \
		if (!(cond)) {                                                         \
			fprintf(stderr, "tqkv_abi: line %d: %s: ", __LINE__, #cond);   \
			fprintf(stderr, __VA_ARGS__);                                  \
			fprintf(stderr, " (last error: %s)\n", tqkv_last_error());     \
			failures++;                                                    \
		}                                                                      \
	} while (0)

/* A struct of `size` bytes followed by `extra` canary bytes. */
static unsigned char *canaried(size_t size, size_t extra)
{
	unsigned char *b = malloc(size + extra);
	if (!b) {
		perror("malloc");
		exit(1);
	}
	memset(b, CANARY, size + extra);
	return b;
}

static int canaries_intact(const unsigned char *b, size_t size, size_t extra)
{
	for (size_t i = size; i < size + extra; i++)
		if (b[i] != CANARY)
			return 0;
	return 1;
}

/* NT tokens of layer 0 appended and attended by one query at the last
 * position: the append's new length and a finite output. */
static void use(tqkv_session *s, const char *what)
{
	static float k[NT * KV * DIM], v[NT * KV * DIM], q[QH * DIM], out[QH * DIM];
	int32_t pos = NT - 1;

	for (int i = 0; i < NT * KV * DIM; i++) {
		k[i] = sinf(0.37f * (float)i);
		v[i] = cosf(0.11f * (float)i);
	}
	for (int i = 0; i < QH * DIM; i++)
		q[i] = sinf(0.05f * (float)i + 1.0f);
	int r = tqkv_append(s, 0, k, v, NT, TQKV_F32);
	CHECK(r == NT, "%s: append returned %d", what, r);
	r = tqkv_attend(s, 0, q, &pos, 1, TQKV_F32, out);
	CHECK(r == 1, "%s: attend returned %d", what, r);
	int finite = 1;
	for (int i = 0; i < QH * DIM; i++)
		finite &= isfinite(out[i]) != 0;
	CHECK(finite, "%s: attention output not finite", what);
}

int main(int argc, char **argv)
{
	tqkv *c = NULL, *c2 = NULL;
	tqkv_session *s = NULL, *sp = NULL, *sd = NULL;
	int r;

	if (argc != 2) {
		fprintf(stderr, "usage: tqkv_abi RUN_DIR\n");
		return 2;
	}

	/* 0.1 connect: the shorter options (no op_timeout_ms).  The old structs
	 * are heap blocks of exactly their size, so that a read past one (a
	 * field the release did not have) is an error under ASan (make test
	 * SANITIZER=address runs this too). */
	struct opts_0_1 *o = calloc(1, sizeof(*o));
	CHECK(o != NULL, "calloc");
	if (!o)
		return 1;
	o->run_dir = argv[1];
	o->queue_depth = 16;
	o->arena_bytes = 8u << 20;
	r = old_connect(&c, o);
	CHECK(r == 0, "tqkv_connect@TQKV_0.1 returned %d", r);
	if (r != 0)
		return 1;
	CHECK(tqkv_client_id(c) != 0, "tqkv_client_id is 0");

	/* 0.1 session_open: no kv_transform field; the daemon's default applies */
	struct params_0_1 *p = calloc(1, sizeof(*p));
	CHECK(p != NULL, "calloc");
	if (!p)
		return 1;
	p->tenant = "default";
	p->name = "abi-0.1";
	p->n_layers = LAYERS;
	p->n_kv_heads = KV;
	p->n_q_heads = QH;
	p->head_dim = DIM;
	p->k_codec = "q8";
	p->v_codec = "tq4";
	p->max_tokens = 64;
	p->has_seed = 1;
	p->seed = 4242;
	r = old_session_open(c, p, &s);
	CHECK(r == 0, "tqkv_session_open@TQKV_0.1 returned %d", r);
	if (r != 0)
		return 1;
	CHECK(tqkv_session_seed(s) == 4242, "seed %llu, not 4242", (unsigned long long)tqkv_session_seed(s));
	use(s, "0.1 session");

	/* 0.2 session_info: its fields, and not a byte past its struct */
	unsigned char *ib = canaried(sizeof(struct info_0_2), 64);
	struct info_0_2 *oi = (void *)ib;
	r = old_session_info(s, oi);
	CHECK(r == 0, "tqkv_session_info@TQKV_0.2 returned %d", r);
	CHECK(canaries_intact(ib, sizeof(*oi), 64), "tqkv_session_info@TQKV_0.2 wrote past the 0.2 struct");
	CHECK(oi->id == tqkv_session_id(s), "0.2 info: id %llu, session %llu", (unsigned long long)oi->id,
	      (unsigned long long)tqkv_session_id(s));
	CHECK(oi->tokens == NT && oi->max_tokens == 64, "0.2 info: tokens %llu of %llu",
	      (unsigned long long)oi->tokens, (unsigned long long)oi->max_tokens);
	CHECK(oi->resident_bytes > 0 && oi->spilled_bytes == 0, "0.2 info: resident %llu, spilled %llu",
	      (unsigned long long)oi->resident_bytes, (unsigned long long)oi->spilled_bytes);
	CHECK(oi->evicted == 0 && oi->persistent == 0, "0.2 info: evicted %d, persistent %d", oi->evicted,
	      oi->persistent);

	/* today's info on the same session: the same fields, and the daemon's
	 * default transforms (what a 0.1 open gets) */
	struct tqkv_session_info ni;
	memset(&ni, 0, sizeof(ni));
	r = tqkv_session_info(s, &ni);
	CHECK(r == 0, "tqkv_session_info returned %d", r);
	CHECK(ni.id == oi->id && ni.tokens == oi->tokens && ni.resident_bytes == oi->resident_bytes,
	      "0.3 info differs from 0.2's");
	CHECK(ni.kv_transform[0] && memchr(ni.kv_transform, 0, sizeof(ni.kv_transform)),
	      "0.3 info: kv_transform '%.48s'", ni.kv_transform);

	/* checkpoint: -EBUSY on a session that is not persistent */
	r = tqkv_session_checkpoint(s);
	CHECK(r == -EBUSY, "checkpoint of a non-persistent session returned %d, not -EBUSY", r);

	/* checkpoint of a persistent session (today's open) */
	struct tqkv_session_params np = { .tenant = "default", .name = "abi-persistent", .n_layers = LAYERS,
					  .n_kv_heads = KV, .n_q_heads = QH, .head_dim = DIM, .max_tokens = 64,
					  .flags = TQKV_SESSION_PERSISTENT, .kv_transform = "none" };
	r = tqkv_session_open(c, &np, &sp);
	CHECK(r == 0, "persistent open returned %d", r);
	if (r == 0) {
		use(sp, "persistent session");
		r = tqkv_session_checkpoint(sp);
		CHECK(r == 0, "checkpoint of a persistent session returned %d", r);
		memset(&ni, 0, sizeof(ni));
		CHECK(tqkv_session_info(sp, &ni) == 0 && ni.persistent == 1 && strcmp(ni.kv_transform, "none") == 0,
		      "persistent info: persistent %d, kv_transform '%.48s'", ni.persistent, ni.kv_transform);
	}

	/* drop: a detached session closed by id from another connection,
	 * without attaching it; then it is gone */
	np.name = "abi-detached";
	np.flags = TQKV_SESSION_DETACHED;
	r = tqkv_session_open(c, &np, &sd);
	CHECK(r == 0, "detached open returned %d", r);
	uint64_t did = sd ? tqkv_session_id(sd) : 0;
	if (r == 0)
		CHECK(tqkv_session_detach(sd) == 0, "detach failed");
	r = tqkv_connect(&c2, &(struct tqkv_connect_opts){ .run_dir = argv[1], .queue_depth = 8,
							     .arena_bytes = 4u << 20 });
	CHECK(r == 0, "second connection: %d", r);
	if (r == 0) {
		CHECK(tqkv_client_id(c2) != 0 && tqkv_client_id(c2) != tqkv_client_id(c),
		      "client ids %llu and %llu", (unsigned long long)tqkv_client_id(c),
		      (unsigned long long)tqkv_client_id(c2));
		r = tqkv_session_drop(c2, did);
		CHECK(r == 0, "drop of session %llu returned %d", (unsigned long long)did, r);
		r = tqkv_session_drop(c2, did);
		CHECK(r == -ENOENT, "second drop returned %d, not -ENOENT", r);
		r = tqkv_session_attach(c2, did, NULL, 0, &sd);
		CHECK(r < 0, "a dropped session could be attached (%d)", r);
		r = tqkv_session_drop(c2, 0);
		CHECK(r < 0, "drop of session 0 returned %d", r);
		/* the persistent one goes too, so that its files do not outlive the test */
		if (sp) {
			uint64_t pid = tqkv_session_id(sp);
			CHECK(tqkv_session_detach(sp) == 0, "detach of the persistent session failed");
			sp = NULL;
			r = tqkv_session_drop(c2, pid);
			CHECK(r == 0, "drop of the persistent session returned %d", r);
		}
		tqkv_disconnect(c2);
	}
	/* no control channel: drop and checkpoint say so */
	r = tqkv_connect(&c2, &(struct tqkv_connect_opts){ .run_dir = argv[1], .flags = TQKV_CONNECT_NO_CONTROL,
							     .queue_depth = 8, .arena_bytes = 4u << 20 });
	CHECK(r == 0, "data-only connection: %d", r);
	if (r == 0) {
		r = tqkv_session_drop(c2, tqkv_session_id(s));
		CHECK(r == -ENOTSUP, "drop without a control channel returned %d, not -ENOTSUP", r);
		tqkv_disconnect(c2);
	}

	CHECK(tqkv_session_close(s) == 0, "close failed");
	if (sp)
		tqkv_session_close(sp);
	tqkv_disconnect(c);
	free(o);
	free(p);
	free(ib);
	if (failures) {
		fprintf(stderr, "tqkv_abi: %d check(s) failed\n", failures);
		return 1;
	}
	printf("tqkv_abi: ok\n");
	return 0;
}
