/* tqkv-run — a real model (llama2.c checkpoint or GGUF llama) end to end
 * with its KV cache in tqkvd.
 *
 *   tqkv-run generate --model M --tokenizer T --prompt TEXT [--steps N]
 *                     [--temperature X] [--top-p P] [--seed S] [common]
 *   tqkv-run generate --model M --tokens ID,ID,... [...]   (ids in and out)
 *   tqkv-run ppl      --model M --tokenizer T FILE [--windows N] [--json]
 *                     [--logits-out PATH] [common]
 *
 * common: --run-dir DIR  --k CODEC --v CODEC | --kv CODEC  --local
 *         --threads N  --chunk N  --rotation-seed S  --tenant NAME
 *         --kv-transform MODE
 *
 * The forward pass runs here (model.c); the KV cache lives in the backend
 * chosen by the options (kvback.h): a tqkvd session (default), the same
 * kernels in this process (--local), or an exact fp32 cache (--local --kv f32).
 * This is the top layer: the only place that prints.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf.h"
#include "kvback.h"
#include "model.h"
#include "sampler.h"
#include "tokenizer.h"
#include "tq_threads.h"
#include "tq_xform.h"

#define PROG "tqkv-run"
/* The daemon's default run directory (daemon/config.h CONFIG_DEFAULT_RUN_DIR),
 * relative to the source tree where `make run` starts it. */
#define DEFAULT_RUN_DIR "build/run"
#define DEFAULT_ROTATION_SEED 0x7165766b72756e31ULL /* "qkvrun1" */

struct opts {
	const char *cmd;
	const char *model, *tokenizer, *prompt, *tokens, *file, *run_dir, *tenant, *logits_out, *system;
	int k_codec, v_codec;
	int exact;                /* --kv f32 with --local */
	int local;
	int threads, chunk, steps, windows, json, sessions;
	int ctx;                  /* --ctx: 0 = the model's (ppl on GGUF: 512)       */
	float sparse_v;           /* --sparse-v (with --local)                       */
	int gguf;                 /* the model file is GGUF                          */
	float temperature, top_p;
	uint64_t seed, rotation_seed;
	int have_seed;
	uint32_t kv_xform;        /* --kv-transform: TQ_XF_* (kernels/tq_xform.h)    */
	char kv_xform_name[TQ_XF_NAME_MAX]; /* ... as tq_xf_mode_str writes it         */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " generate --model M --tokenizer T --prompt TEXT [--steps N]\n"
		"                [--temperature X] [--top-p P] [--seed S] [options]\n"
		"       " PROG " generate --model M --tokens ID,ID,... [...]\n"
		"       " PROG " ppl --model M --tokenizer T FILE [--windows N] [--json]\n"
		"       " PROG " chat --model M.gguf [--prompt TEXT] [--system TEXT] [options]\n"
		"                [--sessions N] [--logits-out PATH] [options]\n"
		"\n"
		"Runs a llama2.c checkpoint (legacy fp32 format) or a GGUF llama model\n"
		"(F32/F16/BF16/Q8_0/Q4_0/Q4_1 weights, dequantized to fp32 at load) with\n"
		"its KV cache kept compressed by tqkvd.\n"
		"\n"
		"options:\n"
		"  --run-dir DIR        tqkvd's run directory (default $TQKV_RUN_DIR, else\n"
		"                       " DEFAULT_RUN_DIR ", where `make run` starts tqkvd)\n"
		"  --tenant NAME        tenant of the session (default: default)\n"
		"  --k CODEC --v CODEC  key / value codecs: f32 f16 q8 q4a tq2 tq3 tq4\n"
		"                       tq3o tq4o (keys: outlier channels at one bit more)\n"
		"                       (default q8 / tq4)\n"
		"  --kv CODEC           both; with --local, --kv f32 is the exact fp32\n"
		"                       reference cache (no codec, plain attention)\n"
		"  --local              run the kernels in this process, without tqkvd\n"
		"  --threads N          attention threads with --local (default 1)\n"
		"  --chunk N            prompt tokens per forward chunk (default 64)\n"
		"  --rotation-seed S    the session's rotation seed (default fixed)\n"
		"  --kv-transform MODE  K/V transforms that attention undoes, frozen by each\n"
		"                       layer's first chunk (its keys and queries): default\n"
		"                       (k-center+v-eq+k-eq-qk+k-unshrink+k-order), none, or\n"
		"                       parts joined by '+': k-center, k-sink, v-center, v-eq,\n"
		"                       k-eq-qk, k-eq-k, k-unshrink, k-order (tq3o/tq4o keys);\n"
		"                       the same with --local and tqkvd\n"
		"                       (measured: BENCHMARKS.md 4a)\n"
		"  --sparse-v X         with --local: skip values while at most X of each\n"
		"                       head's attention weight is left out (the kernels'\n"
		"                       sparse-V; default 0, off); with tqkvd the tenant's\n"
		"                       sparse_v (config) decides\n"
		"  --ctx N              the context in tokens, at most the model's (default:\n"
		"                       the model's; ppl on a GGUF model: 512)\n"
		"\n"
		"A GGUF model (llama family, e.g. SmolLM2) brings its tokenizer: --tokenizer\n"
		"is then optional.\n"
		"generate:\n"
		"  --steps N            tokens to generate (default 256; stops at seq_len)\n"
		"  --temperature X      0 = greedy (default 1.0)\n"
		"  --top-p P            nucleus sampling, 0 or 1 = off (default 0.9)\n"
		"  --seed S             sampler seed (default: from the clock, printed)\n"
		"  --tokens ID,...      the prompt as token ids instead of --prompt; without\n"
		"                       --tokenizer the output is token ids too\n"
		"chat:\n"
		"  the model's ChatML template: each line on stdin is a user turn (or one\n"
		"  turn, --prompt); the answer streams as it is generated; the KV cache keeps\n"
		"  the whole conversation.  --system TEXT replaces the template's system\n"
		"  message.  --steps caps each answer (default 256).\n"
		"ppl:\n"
		"  FILE                 text scored in non-overlapping windows of seq_len tokens\n"
		"                       llama.cpp's way with --ctx N or a GGUF model: chunks\n"
		"                       of N tokens (BOS first where the file says so), the\n"
		"                       second half of each scored, as llama-perplexity does\n"
		"  --windows N          score at most N windows (default all)\n"
		"  --sessions N         score N windows at a time, each in its own session,\n"
		"                       interleaved chunk by chunk as a server batching\n"
		"                       requests would (default 1); the logits are the same\n"
		"                       bits, --logits-out rows come in the order scored\n"
		"  --json               one JSON line on stdout\n"
		"  --logits-out PATH    write every scored position's fp32 logits to PATH\n");
}

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 0);
	if (errno || end == s || *end || v < lo || v > hi) {
		fprintf(stderr, PROG ": %s: '%s' is not an integer in [%ld, %ld]\n", opt, s, lo, hi);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

static int parse_u64(const char *opt, const char *s, uint64_t *out)
{
	char *end;

	errno = 0;
	if (*s == '-' || (*out = strtoull(s, &end, 0), errno) || end == s || *end) {
		fprintf(stderr, PROG ": %s: '%s' is not an unsigned 64-bit integer\n", opt, s);
		return -EINVAL;
	}
	return 0;
}

static int parse_float(const char *opt, const char *s, float *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v)) {
		fprintf(stderr, PROG ": %s: '%s' is not a finite number\n", opt, s);
		return -EINVAL;
	}
	*out = (float)v;
	return 0;
}

static int parse_codec(const char *opt, const char *s, int *out)
{
	int id = tq_codec_from_name(s);

	if (id < 0) {
		fprintf(stderr, PROG ": %s: unknown codec '%s' (f32 f16 q8 q4a tq2 tq3 tq4 tq3o tq4o)\n", opt, s);
		return -EINVAL;
	}
	*out = id;
	return 0;
}

/* 1 if path starts with GGUF's magic (the loaders check the rest). */
static int is_gguf(const char *path)
{
	unsigned char m[4] = { 0 };
	FILE *f = fopen(path, "rb");
	int r = f && fread(m, 1, 4, f) == 4 && !memcmp(m, "GGUF", 4);

	if (f)
		fclose(f);
	return r;
}

enum {
	O_MODEL = 256, O_TOKENIZER, O_PROMPT, O_STEPS, O_TEMP, O_TOPP, O_SEED, O_WINDOWS, O_JSON,
	O_RUNDIR, O_K, O_V, O_KV, O_LOCAL, O_THREADS, O_CHUNK, O_RSEED, O_TENANT, O_LOGITS, O_SESSIONS, O_TOKENS,
	O_CTX, O_SYSTEM, O_SPARSE, O_KVXF, O_HELP,
};

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "model", required_argument, NULL, O_MODEL },
		{ "tokenizer", required_argument, NULL, O_TOKENIZER },
		{ "prompt", required_argument, NULL, O_PROMPT },
		{ "steps", required_argument, NULL, O_STEPS },
		{ "temperature", required_argument, NULL, O_TEMP },
		{ "top-p", required_argument, NULL, O_TOPP },
		{ "seed", required_argument, NULL, O_SEED },
		{ "windows", required_argument, NULL, O_WINDOWS },
		{ "json", no_argument, NULL, O_JSON },
		{ "run-dir", required_argument, NULL, O_RUNDIR },
		{ "k", required_argument, NULL, O_K },
		{ "v", required_argument, NULL, O_V },
		{ "kv", required_argument, NULL, O_KV },
		{ "local", no_argument, NULL, O_LOCAL },
		{ "threads", required_argument, NULL, O_THREADS },
		{ "chunk", required_argument, NULL, O_CHUNK },
		{ "rotation-seed", required_argument, NULL, O_RSEED },
		{ "tenant", required_argument, NULL, O_TENANT },
		{ "logits-out", required_argument, NULL, O_LOGITS },
		{ "sessions", required_argument, NULL, O_SESSIONS },
		{ "tokens", required_argument, NULL, O_TOKENS },
		{ "ctx", required_argument, NULL, O_CTX },
		{ "system", required_argument, NULL, O_SYSTEM },
		{ "sparse-v", required_argument, NULL, O_SPARSE },
		{ "kv-transform", required_argument, NULL, O_KVXF },
		{ "help", no_argument, NULL, O_HELP },
		{ 0 },
	};
	int c, kv_f32 = 0, gen, chat;
	long v;

	memset(o, 0, sizeof(*o));
	o->run_dir = getenv("TQKV_RUN_DIR") && *getenv("TQKV_RUN_DIR") ? getenv("TQKV_RUN_DIR") : DEFAULT_RUN_DIR;
	o->tenant = "default";
	o->k_codec = TQ_CODEC_Q8;
	o->v_codec = TQ_CODEC_TQ4;
	o->threads = 1;
	o->chunk = 64;
	o->steps = 256;
	o->windows = INT_MAX;
	o->sessions = 1;
	o->temperature = 1.0f;
	o->top_p = 0.9f;
	o->rotation_seed = DEFAULT_ROTATION_SEED;
	o->kv_xform = TQ_XF_DEFAULT;

	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? -EINVAL : 1;
	}
	o->cmd = argv[1];
	gen = !strcmp(o->cmd, "generate");
	chat = !strcmp(o->cmd, "chat");
	if (!gen && !chat && strcmp(o->cmd, "ppl")) {
		fprintf(stderr, PROG ": unknown command '%s' (generate, chat or ppl; --help)\n", o->cmd);
		return -EINVAL;
	}
	optind = 2;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		int rc = 0;
		switch (c) {
		case O_MODEL: o->model = optarg; break;
		case O_TOKENIZER: o->tokenizer = optarg; break;
		case O_PROMPT: o->prompt = optarg; break;
		case O_TOKENS: o->tokens = optarg; break;
		case O_STEPS: rc = parse_long("--steps", optarg, 0, INT_MAX, &v); o->steps = (int)v; break;
		case O_TEMP: rc = parse_float("--temperature", optarg, &o->temperature); break;
		case O_TOPP: rc = parse_float("--top-p", optarg, &o->top_p); break;
		case O_SEED: rc = parse_u64("--seed", optarg, &o->seed); o->have_seed = 1; break;
		case O_WINDOWS: rc = parse_long("--windows", optarg, 1, INT_MAX, &v); o->windows = (int)v; break;
		case O_JSON: o->json = 1; break;
		case O_RUNDIR: o->run_dir = optarg; break;
		case O_K: rc = parse_codec("--k", optarg, &o->k_codec); break;
		case O_V: rc = parse_codec("--v", optarg, &o->v_codec); break;
		case O_KV:
			rc = parse_codec("--kv", optarg, &o->k_codec);
			o->v_codec = o->k_codec;
			kv_f32 = o->k_codec == TQ_CODEC_F32;
			break;
		case O_LOCAL: o->local = 1; break;
		case O_THREADS: rc = parse_long("--threads", optarg, 1, TQ_THREADS_MAX, &v); o->threads = (int)v; break;
		case O_CHUNK: rc = parse_long("--chunk", optarg, 1, 65536, &v); o->chunk = (int)v; break;
		case O_RSEED: rc = parse_u64("--rotation-seed", optarg, &o->rotation_seed); break;
		case O_TENANT: o->tenant = optarg; break;
		case O_LOGITS: o->logits_out = optarg; break;
		case O_SESSIONS: rc = parse_long("--sessions", optarg, 1, 1024, &v); o->sessions = (int)v; break;
		case O_CTX: rc = parse_long("--ctx", optarg, 2, INT_MAX, &v); o->ctx = (int)v; break;
		case O_SYSTEM: o->system = optarg; break;
		case O_SPARSE: rc = parse_float("--sparse-v", optarg, &o->sparse_v); break;
		case O_KVXF:
			if ((rc = tq_xf_mode_parse(optarg, &o->kv_xform)) < 0)
				fprintf(stderr, PROG ": --kv-transform: unknown mode '%s' (none, default, or parts "
					"joined by '+': k-center, k-sink, v-center, v-eq, k-eq-qk, k-eq-k, k-unshrink; at most one k-eq-* and one of k-center, k-sink)\n",
					optarg);
			break;
		case O_HELP: usage(stdout); return 1;
		default:
			fprintf(stderr, PROG ": see '" PROG " --help'\n");
			return -EINVAL;
		}
		if (rc < 0)
			return rc;
	}
	if (o->model)
		o->gguf = is_gguf(o->model);
	if (!o->model || (!o->tokenizer && !o->gguf && !(gen && o->tokens))) {
		fprintf(stderr, PROG " %s: --model and --tokenizer are required (a GGUF model brings its tokenizer)\n",
			o->cmd);
		return -EINVAL;
	}
	if (chat) {
		if (!o->gguf) {
			fprintf(stderr, PROG " chat: needs a GGUF model with a chat template\n");
			return -EINVAL;
		}
		if (o->tokens || optind != argc) {
			fprintf(stderr, PROG " chat: unexpected %s\n", o->tokens ? "--tokens" : argv[optind]);
			return -EINVAL;
		}
	} else if (gen) {
		if (!o->prompt == !o->tokens) {
			fprintf(stderr, PROG " generate: --prompt is required (or --tokens ID,..., not both)\n");
			return -EINVAL;
		}
		if (optind != argc) {
			fprintf(stderr, PROG " generate: unexpected argument '%s'\n", argv[optind]);
			return -EINVAL;
		}
	} else {
		if (optind != argc - 1) {
			fprintf(stderr, PROG " ppl: exactly one text FILE is required\n");
			return -EINVAL;
		}
		o->file = argv[optind];
	}
	if (!gen && !chat && o->tokens) {
		fprintf(stderr, PROG " ppl: --tokens is for generate\n");
		return -EINVAL;
	}
	if (o->sparse_v != 0.0f && (!o->local || !(o->sparse_v > 0.0f && o->sparse_v < 1.0f))) {
		fprintf(stderr, PROG ": --sparse-v is in (0, 1) and needs --local (with tqkvd, the tenant's "
			"sparse_v in its config decides)\n");
		return -EINVAL;
	}
	if (o->temperature < 0.0f) {
		fprintf(stderr, PROG ": --temperature must be >= 0 (got %g)\n", (double)o->temperature);
		return -EINVAL;
	}
	if (o->top_p < 0.0f || o->top_p > 1.0f) {
		fprintf(stderr, PROG ": --top-p must be in [0, 1] (got %g)\n", (double)o->top_p);
		return -EINVAL;
	}
	/* --kv f32 (both f32 through one option) is the exact reference; --k
	 * f32 --v f32 stays the f32 codec through the kernels. */
	o->exact = kv_f32 && o->k_codec == TQ_CODEC_F32 && o->v_codec == TQ_CODEC_F32;
	if (o->exact && !o->local) {
		fprintf(stderr, PROG ": --kv f32 (the exact fp32 reference cache) needs --local\n");
		return -EINVAL;
	}
	if (o->exact)
		o->kv_xform = 0; /* the reference stores what it is given */
	tq_xf_mode_str(o->kv_xform, o->kv_xform_name, sizeof(o->kv_xform_name));
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *backend_kind(const struct opts *o)
{
	return o->exact ? "exact" : o->local ? "local" : "tqkvd";
}

static int open_backend(const struct opts *o, const struct tqr_config *c, tqr_kv **kv, tqr_error *err)
{
	struct tqr_kv_geom g = {
		.n_layers = c->n_layers,
		.n_kv_heads = c->n_kv_heads,
		.n_q_heads = c->n_heads,
		.head_dim = c->head_dim,
		.max_tokens = c->seq_len,
	};

	if (o->exact)
		return tqr_kv_new_exact(kv, &g, err);
	if (o->local) {
		struct tqr_kv_local_opts lo = {
			.k_codec = (enum tq_codec_id)o->k_codec,
			.v_codec = (enum tq_codec_id)o->v_codec,
			.rotation_seed = o->rotation_seed,
			.threads = o->threads,
			.sparse_v = o->sparse_v,
			.kv_xform = o->kv_xform,
		};
		return tqr_kv_new_local(kv, &g, &lo, err);
	}
	struct tqr_kv_daemon_opts dop = {
		.run_dir = o->run_dir,
		.tenant = o->tenant,
		.k_codec = (enum tq_codec_id)o->k_codec,
		.v_codec = (enum tq_codec_id)o->v_codec,
		.rotation_seed = o->rotation_seed,
		.kv_transform = o->kv_xform_name,
	};
	return tqr_kv_new_daemon(kv, &g, &dop, err);
}

static void fmt_bytes(char *buf, size_t n, uint64_t b)
{
	if (b >= 10u << 20)
		snprintf(buf, n, "%.1f MiB", b / 1048576.0);
	else if (b >= 10u << 10)
		snprintf(buf, n, "%.1f KiB", b / 1024.0);
	else
		snprintf(buf, n, "%" PRIu64 " B", b);
}

/* Prints a piece, dropping lone control bytes other than whitespace (a raw
 * byte token may be anything). */
static void put_piece(const char *p, size_t n)
{
	if (n == 1 && (unsigned char)p[0] < 0x20 && p[0] != '\n' && p[0] != '\t' && p[0] != '\r')
		return;
	fwrite(p, 1, n, stdout);
}

/* "ID,ID,..." into tokens[] (room for strlen(s) + 3); the count or -EINVAL. */
static long parse_ids(const char *s, int vocab, int *tokens, tqr_error *err)
{
	long n = 0;

	for (const char *p = s;;) {
		char *end;
		errno = 0;
		long v = strtol(p, &end, 10);
		if (errno || end == p || v < 0 || v >= vocab)
			return tqr_fail(err, -EINVAL, "--tokens: '%s' is not a comma-separated list of ids in [0, %d)",
					s, vocab);
		tokens[n++] = (int)v;
		if (!*end)
			return n;
		if (*end != ',')
			return tqr_fail(err, -EINVAL, "--tokens: '%s': unexpected '%c'", s, *end);
		p = end + 1;
	}
}

static int cmd_generate(const struct opts *o, const tqr_model *m, const tqr_tok *tok)
{
	const struct tqr_config *c = tqr_model_config(m);
	tqr_forward *fw = NULL;
	tqr_sampler *smp = NULL;
	tqr_kv *kv = NULL;
	tqr_error err = { { 0 } };
	float *logits = NULL;
	int *toks = NULL, rc, n_prompt, n_gen = 0, pos, printed = 0, chunk = o->chunk < c->seq_len ? o->chunk : c->seq_len;
	uint64_t seed = o->have_seed ? o->seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	size_t plen = strlen(o->prompt ? o->prompt : o->tokens);
	double t0, t1, t2;
	long nt;

	if (!(toks = malloc(sizeof(int) * (plen + 3))) || !(logits = malloc(sizeof(float) * (size_t)c->vocab_size))) {
		rc = tqr_fail(&err, -ENOMEM, "out of memory");
		goto fail;
	}
	if (o->tokens)
		nt = parse_ids(o->tokens, c->vocab_size, toks, &err);
	else
		nt = tqr_tok_encode(tok, o->prompt, plen, 1, 0, toks, &err);
	if (nt < 0) {
		rc = (int)nt;
		goto fail;
	}
	n_prompt = (int)nt;
	if (n_prompt >= c->seq_len) {
		rc = tqr_fail(&err, -E2BIG, "the prompt is %d tokens; the model's context is %d", n_prompt, c->seq_len);
		goto fail;
	}
	if ((rc = tqr_sampler_new(&smp, c->vocab_size, o->temperature, o->top_p, seed, &err)) < 0 ||
	    (rc = tqr_forward_new(&fw, m, chunk, &err)) < 0 || (rc = open_backend(o, c, &kv, &err)) < 0)
		goto fail;

	/* the prompt echoed, without the BOS the tokenizer put first */
	for (int i = tok && tqr_tok_adds_bos(tok) ? 1 : 0; i < n_prompt; i++) {
		const char *p;
		size_t n;
		if (!tok)
			printf("%s%d", i ? " " : "", toks[i]);
		else if (tqr_tok_decode(tok, i ? toks[i - 1] : -1, toks[i], &p, &n) == 0)
			put_piece(p, n);
		printed = 1;
	}
	fflush(stdout);
	/* the prompt in chunks: APPEND + causal ATTEND per layer and chunk;
	 * only the last token's logits are needed */
	t0 = now_s();
	for (pos = 0; pos < n_prompt; pos += chunk) {
		int n = n_prompt - pos < chunk ? n_prompt - pos : chunk;
		if ((rc = tqr_forward_run(fw, kv, toks + pos, n, pos, logits, 0, &err)) < 0)
			goto fail;
	}
	t1 = now_s();
	pos = n_prompt;
	int prev = toks[n_prompt - 1];
	int steps = o->steps < c->seq_len - n_prompt ? o->steps : c->seq_len - n_prompt;
	for (; n_gen < steps; n_gen++) {
		int next = tqr_sample(smp, logits);
		const char *p;
		size_t n;
		/* BOS, EOS, and a GGUF vocabulary's other control tokens
		 * (SmolLM2's <|endoftext|>, <|im_end|>) end the text */
		if (tok ? tqr_tok_is_control(tok, next) : next == TQR_TOK_BOS || next == TQR_TOK_EOS)
			break;
		if (!tok)
			printf(" %d", next);
		else if (tqr_tok_decode(tok, prev, next, &p, &n) == 0)
			put_piece(p, n);
		fflush(stdout);
		prev = next;
		/* decode: one APPEND_ATTEND per layer */
		if (n_gen + 1 < steps && (rc = tqr_forward_run(fw, kv, &next, 1, pos++, logits, 0, &err)) < 0)
			goto fail;
	}
	t2 = now_s();
	printf("\n");

	struct tqr_kv_stats st;
	char a[32], b[32], r[48];
	tqr_kv_stats(kv, &st);
	fmt_bytes(a, sizeof(a), st.tokens * st.bytes_per_token);
	fmt_bytes(b, sizeof(b), st.tokens * st.fp16_per_token);
	r[0] = 0;
	if (st.resident_bytes) { /* pages held, when the backend knows them */
		memcpy(r, "; pages held ", 13);
		fmt_bytes(r + 13, sizeof(r) - 13, st.resident_bytes);
	}
	printf("---\n");
	printf("prompt: %d tokens at %.0f tokens/s; generated: %d tokens at %.1f tokens/s (seed %" PRIu64 ")\n",
	       n_prompt, n_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_gen,
	       n_gen / (t2 - t1 > 0 ? t2 - t1 : 1e-9), seed);
	printf("KV cache (%s)%s%s: %" PRIu64 " tokens x %d layers, %s vs %s for fp16 (%.1f %%, %.2f bits/value)%s\n",
	       tqr_kv_name(kv), o->exact ? "" : ", transform ", o->exact ? "" : o->kv_xform_name, st.tokens,
	       c->n_layers, a, b,
	       100.0 * (double)st.bytes_per_token / (double)st.fp16_per_token,
	       16.0 * (double)st.bytes_per_token / (double)st.fp16_per_token, r);
	rc = 0;
	goto out;
fail:
	fflush(stdout);
	fprintf(stderr, "%s" PROG " generate: %s\n", printed ? "\n" : "", err.msg[0] ? err.msg : strerror(-rc));
out:
	tqr_kv_free(kv);
	tqr_forward_free(fw);
	tqr_sampler_free(smp);
	free(logits);
	free(toks);
	return rc;
}

/* The model's chat template.  Only ChatML is known (recognised by its
 * markers; the template's Jinja is not run): turns are
 * "<|im_start|>ROLE\nTEXT<|im_end|>\n".  The template's own default system
 * message, when it holds a literal one, is copied into sys. */
static int chat_template(const char *path, char *sys, size_t cap, tqr_error *err)
{
	static const char mark[] = "<|im_start|>system\n";
	tqr_gguf *g = NULL;
	const char *t;
	size_t n;
	int rc;

	sys[0] = 0;
	if ((rc = tqr_gguf_open(&g, path, err)) < 0)
		return rc;
	if (tqr_gguf_find(g, "tokenizer.chat_template") < 0) {
		rc = tqr_fail(err, -EINVAL, "%s: no tokenizer.chat_template: not a chat model", path);
		goto out;
	}
	if ((rc = tqr_gguf_get_str(g, "tokenizer.chat_template", &t, &n, err)) < 0)
		goto out;
	if (!memmem(t, n, "<|im_start|>", 12) || !memmem(t, n, "<|im_end|>", 10)) {
		rc = tqr_fail(err, -EOPNOTSUPP, "%s: the chat template is not ChatML (the only one supported)", path);
		goto out;
	}
	const char *a = memmem(t, n, mark, sizeof(mark) - 1);
	if (a) {
		a += sizeof(mark) - 1;
		const char *e = memmem(a, n - (size_t)(a - t), "<|im_end|>", 10);
		if (e && !memchr(a, '{', (size_t)(e - a)) && !memchr(a, '}', (size_t)(e - a)) &&
		    (size_t)(e - a) < cap) {
			memcpy(sys, a, (size_t)(e - a));
			sys[e - a] = 0;
		}
	}
	rc = 0;
out:
	tqr_gguf_free(g);
	return rc;
}

static int cmd_chat(const struct opts *o, const tqr_model *m, const tqr_tok *tok)
{
	const struct tqr_config *c = tqr_model_config(m);
	tqr_forward *fw = NULL;
	tqr_sampler *smp = NULL;
	tqr_kv *kv = NULL;
	tqr_error err = { { 0 } };
	float *logits = NULL;
	int *toks = NULL, rc, pos = 0, turns = 0, mid_line = 0;
	int chunk = o->chunk < c->seq_len ? o->chunk : c->seq_len;
	uint64_t seed = o->have_seed ? o->seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	char sys[2048], *line = NULL, *text = NULL;
	size_t line_cap = 0;
	long n_prompt_all = 0, n_gen_all = 0;
	double t_prompt = 0, t_gen = 0;
	const char *tail = "";   /* what the last answer left unsaid: its end marker */
	const int im_end = tqr_tok_lookup(tok, "<|im_end|>", 10);
	const int tty = isatty(0) && !o->prompt;

	if ((rc = chat_template(o->model, sys, sizeof(sys), &err)) < 0)
		goto fail;
	const char *system = o->system ? o->system : sys;
	if (!(logits = malloc(sizeof(float) * (size_t)c->vocab_size))) {
		rc = tqr_fail(&err, -ENOMEM, "out of memory");
		goto fail;
	}
	if ((rc = tqr_sampler_new(&smp, c->vocab_size, o->temperature, o->top_p, seed, &err)) < 0 ||
	    (rc = tqr_forward_new(&fw, m, chunk, &err)) < 0 || (rc = open_backend(o, c, &kv, &err)) < 0)
		goto fail;
	for (;;) {
		const char *user;
		if (o->prompt) {
			if (turns)
				break;
			user = o->prompt;
		} else {
			if (tty)
				fprintf(stderr, "> ");
			ssize_t got = getline(&line, &line_cap, stdin);
			if (got < 0)
				break;
			if (got && line[got - 1] == '\n')
				line[--got] = 0;
			if (!got)
				continue;
			user = line;
		}
		size_t need = strlen(tail) + strlen(system) + strlen(user) + 128;
		char *nt = realloc(text, need);
		int *nk = realloc(toks, sizeof(int) * (need + 3));
		if (!nt || !nk) {
			free(nt ? nt : text);
			text = NULL;
			toks = nk ? nk : toks;
			rc = tqr_fail(&err, -ENOMEM, "out of memory");
			goto fail;
		}
		text = nt;
		toks = nk;
		if (!turns && *system)
			snprintf(text, need, "<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n"
				 "<|im_start|>assistant\n", system, user);
		else
			snprintf(text, need, "%s<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", tail, user);
		long n = tqr_tok_encode_special(tok, text, strlen(text), !turns, 0, toks, &err);
		if (n < 0) {
			rc = (int)n;
			goto fail;
		}
		if (pos + n + 1 > c->seq_len) {
			rc = tqr_fail(&err, -E2BIG, "the conversation needs %ld tokens; the context is %d (--ctx)",
				      pos + n + 1, c->seq_len);
			goto fail;
		}
		double t0 = now_s();
		for (long i = 0; i < n; i += chunk) {
			int k = n - i < chunk ? (int)(n - i) : chunk;
			if ((rc = tqr_forward_run(fw, kv, toks + i, k, pos, logits, 0, &err)) < 0)
				goto fail;
			pos += k;
		}
		double t1 = now_s();
		n_prompt_all += n;
		t_prompt += t1 - t0;
		/* the answer, streamed; it ends at a control token (<|im_end|>),
		 * the --steps cap or the context */
		int steps = o->steps, g = 0;
		tail = "<|im_end|>\n";
		for (; g < steps && pos < c->seq_len; g++) {
			int next = tqr_sample(smp, logits);
			const char *p;
			size_t pn;
			if (tqr_tok_is_control(tok, next))
				break;
			if (tqr_tok_decode(tok, -1, next, &p, &pn) == 0)
				put_piece(p, pn);
			fflush(stdout);
			mid_line = 1;
			if ((rc = tqr_forward_run(fw, kv, &next, 1, pos++, logits, 0, &err)) < 0)
				goto fail;
		}
		if (im_end < 0)
			tail = "";
		n_gen_all += g;
		t_gen += now_s() - t1;
		printf("\n");
		mid_line = 0;
		fflush(stdout);
		turns++;
	}

	struct tqr_kv_stats st;
	char a[32], b[32];
	tqr_kv_stats(kv, &st);
	fmt_bytes(a, sizeof(a), st.tokens * st.bytes_per_token);
	fmt_bytes(b, sizeof(b), st.tokens * st.fp16_per_token);
	fprintf(tty ? stderr : stdout, "---\n%d turn%s: prompt %ld tokens at %.0f tokens/s; answers %ld tokens at "
		"%.1f tokens/s\nKV cache (%s)%s%s: %" PRIu64 " tokens x %d layers, %s vs %s for fp16 (%.2f bits/value)\n",
		turns, turns == 1 ? "" : "s", n_prompt_all, n_prompt_all / (t_prompt > 0 ? t_prompt : 1e-9),
		n_gen_all, n_gen_all / (t_gen > 0 ? t_gen : 1e-9), tqr_kv_name(kv), o->exact ? "" : ", transform ",
		o->exact ? "" : o->kv_xform_name, st.tokens, c->n_layers, a, b,
		16.0 * (double)st.bytes_per_token / (double)st.fp16_per_token);
	rc = 0;
	goto out;
fail:
	fflush(stdout);
	fprintf(stderr, "%s" PROG " chat: %s\n", mid_line ? "\n" : "", err.msg[0] ? err.msg : strerror(-rc));
out:
	tqr_kv_free(kv);
	tqr_forward_free(fw);
	tqr_sampler_free(smp);
	free(logits);
	free(toks);
	free(text);
	free(line);
	return rc;
}

static void progress(int done, int total, double nll, long count)
{
	int width = 30, fill = total ? done * width / total : width;

	fprintf(stderr, "\r[%.*s%*s] %d/%d windows  ppl %.4f", fill, "##############################",
		width - fill, "", done, total, count ? exp(nll / (double)count) : 0.0);
	if (done == total)
		fputc('\n', stderr);
	fflush(stderr);
}

struct logits_out {
	FILE *f;
	int vocab;
};

static int write_logits(void *arg, const float *logits, int rows)
{
	struct logits_out *w = arg;
	size_t n = (size_t)rows * (size_t)w->vocab;

	return fwrite(logits, sizeof(float), n, w->f) == n ? 0 : -EIO;
}

static int cmd_ppl(const struct opts *o, const tqr_model *m, const tqr_tok *tok)
{
	const struct tqr_config *c = tqr_model_config(m);
	tqr_forward *fw = NULL;
	tqr_kv *kv = NULL, **kvs = NULL;
	tqr_error err = { { 0 } };
	unsigned char *text = NULL;
	float *logits = NULL;
	double *wnll = NULL;
	int ns = 0;
	int *toks = NULL, rc, chunk = o->chunk < c->seq_len ? o->chunk : c->seq_len;
	FILE *lf = NULL;
	size_t tlen;
	long nt, count = 0;
	double nll = 0, t0, t1;
	int bar = !o->json && isatty(2);

	if ((rc = tqr_file_read(o->file, (size_t)1 << 30, &text, &tlen, &err)) < 0)
		goto fail;
	if (!(toks = malloc(sizeof(int) * (tlen + 3))) ||
	    !(logits = malloc(sizeof(float) * (size_t)chunk * c->vocab_size))) {
		rc = tqr_fail(&err, -ENOMEM, "out of memory");
		goto fail;
	}
	/* the whole text as one stream, BOS first where the vocabulary takes
	 * one (llama2.c's always; a GGUF file's add_bos_token) */
	if ((nt = tqr_tok_encode(tok, (const char *)text, tlen, 1, 0, toks, &err)) < 0) {
		rc = (int)nt;
		goto fail;
	}
	if (nt < 2) {
		rc = tqr_fail(&err, -EINVAL, "%s: too little text to score (%ld tokens)", o->file, nt);
		goto fail;
	}
	/* windows of seq_len tokens; a text shorter than one is one short window */
	int wlen = nt >= c->seq_len ? c->seq_len : (int)nt;
	long avail = nt / wlen;
	int windows = avail < o->windows ? (int)avail : o->windows;
	/* llama.cpp's perplexity: each chunk starts with BOS where the file
	 * adds one, and only its second half is scored */
	const int llama = o->ctx || o->gguf;
	const int first = llama ? wlen / 2 : 0;
	if (llama && wlen < 4) {
		rc = tqr_fail(&err, -EINVAL, "%s: %ld tokens, too few for chunks scored in their second half", o->file, nt);
		goto fail;
	}
	if (llama && tqr_tok_adds_bos(tok))
		for (int w = 0; w < windows; w++)
			toks[(size_t)w * wlen] = tqr_tok_bos(tok);

	if (o->logits_out && !(lf = fopen(o->logits_out, "wb"))) {
		rc = tqr_fail(&err, -errno, "%s: %s", o->logits_out, strerror(errno));
		goto fail;
	}
	ns = o->sessions < windows ? o->sessions : windows;
	if (!(kvs = calloc((size_t)ns, sizeof(*kvs))) || !(wnll = calloc((size_t)ns, sizeof(*wnll)))) {
		rc = tqr_fail(&err, -ENOMEM, "out of memory");
		goto fail;
	}
	if ((rc = tqr_forward_new(&fw, m, chunk, &err)) < 0 || (rc = open_backend(o, c, &kv, &err)) < 0)
		goto fail;
	kvs[0] = kv;
	for (int i = 1; i < ns; i++)
		if ((rc = open_backend(o, c, &kvs[i], &err)) < 0)
			goto fail;
	struct logits_out wl = { lf, c->vocab_size };
	t0 = now_s();
	if (bar)
		progress(0, windows, 0, 0);
	if (ns == 1) {
		for (int w = 0; w < windows; w++) {
			long scored = tqr_forward_score(fw, kv, toks + (size_t)w * wlen, wlen, first, logits, &nll,
							lf ? write_logits : NULL, &wl, &err);
			if (scored < 0) {
				rc = (int)scored;
				goto fail;
			}
			count += scored;
			if (bar)
				progress(w + 1, windows, nll, count);
		}
	}
	/* --sessions: ns windows at a time, a chunk of each in turn; each
	 * window's sum is its own, added in window order */
	for (int w0 = 0; ns > 1 && w0 < windows; w0 += ns) {
		int nw = windows - w0 < ns ? windows - w0 : ns;
		for (int i = 0; i < nw; i++)
			wnll[i] = 0;
		for (int pos = 0; pos < wlen; pos += chunk) {
			for (int i = 0; i < nw; i++) {
				long rows = tqr_forward_score_chunk(fw, kvs[i], toks + (size_t)(w0 + i) * wlen, wlen, pos,
								    first, logits, &wnll[i], lf ? write_logits : NULL,
								    &wl, &err);
				if (rows < 0) {
					rc = (int)rows;
					goto fail;
				}
				count += rows;
			}
		}
		for (int i = 0; i < nw; i++)
			nll += wnll[i];
		if (bar)
			progress(w0 + nw, windows, nll, count);
	}
	t1 = now_s();
	if (lf) {
		int bad = ferror(lf);
		if (fclose(lf) != 0 || bad) {
			lf = NULL;
			rc = tqr_fail(&err, -EIO, "%s: write failed", o->logits_out);
			goto fail;
		}
		lf = NULL;
	}

	struct tqr_kv_stats st;
	tqr_kv_stats(kv, &st);
	double ppl = exp(nll / (double)count);
	uint64_t kvb = st.peak_tokens * st.bytes_per_token, f16b = st.peak_tokens * st.fp16_per_token;
	double bits = 16.0 * (double)st.bytes_per_token / (double)st.fp16_per_token;
	double tps = (double)windows * wlen / (t1 - t0 > 0 ? t1 - t0 : 1e-9);
	const char *kn = o->exact ? "f32" : tq_codec_name((enum tq_codec_id)o->k_codec);
	const char *vn = o->exact ? "f32" : tq_codec_name((enum tq_codec_id)o->v_codec);
	if (o->json) {
		printf("{\"ppl\":%.6f,\"nll_per_token\":%.6f,\"tokens\":%ld,\"windows\":%d,\"window_tokens\":%d,"
		       "\"scored_from\":%d,\"text_tokens\":%ld,\"k\":\"%s\",\"v\":\"%s\",\"backend\":\"%s\","
		       "\"kv_transform\":\"%s\",\"kv_bytes\":%" PRIu64
		       ",\"fp16_kv_bytes\":%" PRIu64 ",\"bits_per_value\":%.4f,\"tokens_per_s\":%.1f}\n",
		       ppl, nll / (double)count, count, windows, wlen, first, nt, kn, vn, backend_kind(o),
		       o->kv_xform_name, kvb, f16b, bits, tps);
	} else {
		char a[32], b[32];
		fmt_bytes(a, sizeof(a), kvb);
		fmt_bytes(b, sizeof(b), f16b);
		printf("%s: %ld tokens; scored %ld in %d windows of %d%s (KV %s, K %s, V %s, transform %s)\n",
		       o->file, nt, count, windows, wlen, first ? ", second halves (llama-perplexity's way)" : "",
		       tqr_kv_name(kv), kn, vn, o->kv_xform_name);
		printf("perplexity %.4f  (%.4f nats/token)\n", ppl, nll / (double)count);
		printf("KV cache per window: %s vs %s for fp16 (%.2f bits/value); %.0f tokens/s\n", a, b, bits, tps);
	}
	rc = 0;
	goto out;
fail:
	if (bar)
		fputc('\n', stderr);
	fprintf(stderr, PROG " ppl: %s\n", err.msg[0] ? err.msg : strerror(-rc));
out:
	if (lf)
		fclose(lf);
	for (int i = 1; kvs && i < ns; i++)
		tqr_kv_free(kvs[i]);
	free(kvs);
	free(wnll);
	tqr_kv_free(kv);
	tqr_forward_free(fw);
	free(logits);
	free(toks);
	free(text);
	return rc;
}

int main(int argc, char **argv)
{
	struct opts o;
	tqr_model *m = NULL;
	tqr_tok *tok = NULL;
	tqr_error err = { { 0 } };
	int rc;

	rc = parse_args(argc, argv, &o);
	if (rc)
		return rc > 0 ? 0 : 2;
	if ((rc = tqr_model_load(&m, o.model, &err)) < 0 ||
	    /* an explicit --ctx beyond the model's is an error; ppl on a GGUF
	     * model defaults to llama-perplexity's 512 */
	    (o.ctx && (rc = tqr_model_limit_context(m, o.ctx, &err)) < 0) ||
	    (!o.ctx && o.gguf && !strcmp(o.cmd, "ppl") && tqr_model_config(m)->seq_len > 512 &&
	     (rc = tqr_model_limit_context(m, 512, &err)) < 0) ||
	    (o.tokenizer && (rc = tqr_tok_load(&tok, o.tokenizer, tqr_model_config(m)->vocab_size, &err)) < 0) ||
	    (!o.tokenizer && o.gguf && !(o.tokens && !strcmp(o.cmd, "generate")) &&
	     (rc = tqr_tok_from_gguf(&tok, o.model, tqr_model_config(m)->vocab_size, &err)) < 0)) {
		fprintf(stderr, PROG ": %s\n", err.msg);
		tqr_model_free(m);
		return 1;
	}
	rc = !strcmp(o.cmd, "generate") ? cmd_generate(&o, m, tok) :
	     !strcmp(o.cmd, "chat") ? cmd_chat(&o, m, tok) : cmd_ppl(&o, m, tok);
	tqr_tok_free(tok);
	tqr_model_free(m);
	return rc < 0 ? 1 : 0;
}
