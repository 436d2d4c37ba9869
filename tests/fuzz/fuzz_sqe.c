/* fuzz_sqe — the ring's SQE validator (daemon/ring.c, ring_sqe_check): the
 * 128 bytes a client writes into its submission queue, which the daemon
 * copies out of shared memory and checks before any worker touches the
 * arena.  Proves, for any bytes: the check never crashes; it only accepts
 * known opcodes whose unused fields and reserved words are zero; an op
 * that needs a session is refused when none is attached; and every
 * accepted APPEND / ATTEND / APPEND_ATTEND has each of its regions (K, V,
 * Q, positions, output, lengths from the counts, geometry and dtype)
 * inside the arena and aligned — checked by arithmetic, and by touching
 * both ends of each region in an arena of exactly arena_bytes under ASan.
 *
 * Input: 16 bytes of connection state, then SQEs of 128 bytes each
 * (a short last one is zero-padded):
 *   [0..3]  arena_bytes (le32; bit 31 of byte 3 set: a huge arena up to
 *           TQKV_ARENA_BYTES_MAX, checked by arithmetic only)
 *   [4..5]  n_layers - 1, [6] n_kv_heads - 1, [7] GQA group - 1,
 *   [8]     head_dim / 8, [9] k codec, [10] v codec, [11] bit 0: attached
 *   [12..15] unused
 * A geometry session_geom_check refuses is replaced by a fixed valid one
 * (the daemon never binds a session with a refused geometry). */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "ring.h"
#include "session.h"
#include "tq_codec.h"

#define SMALL_ARENA_MAX (1u << 20)

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Abort unless [off, off + len) lies in [0, arena) aligned to `align`;
 * touch its first and last byte when the arena is real. */
static void region_in(volatile uint8_t *arena, uint64_t arena_bytes, uint64_t off, uint64_t len,
		      uint64_t align)
{
	if (off > arena_bytes || len > arena_bytes - off || off % align)
		abort();
	if (arena && len) {
		arena[off] = arena[off];
		arena[off + len - 1] = arena[off + len - 1];
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct session_geom g = { 0 };
	uint64_t arena_bytes, bpt;
	uint8_t *arena = NULL;
	char why[256];
	bool attached;

	if (size < 16)
		return 0;
	arena_bytes = le32(data);
	if (arena_bytes & 0x80000000u)
		arena_bytes = ((arena_bytes & 0x7fffffffu) * 2u + 1) % (TQKV_ARENA_BYTES_MAX + 1);
	else
		arena_bytes %= SMALL_ARENA_MAX + 1;
	g.n_layers = ((uint32_t)data[4] | (uint32_t)data[5] << 8) % SESSION_MAX_LAYERS + 1;
	g.n_kv_heads = (uint32_t)data[6] + 1;
	g.n_q_heads = g.n_kv_heads * ((uint32_t)data[7] % 8 + 1);
	g.head_dim = (uint32_t)data[8] * 8;
	g.k_codec = (enum tq_codec_id)(data[9] % (TQ_CODEC__COUNT + 1));
	g.v_codec = (enum tq_codec_id)(data[10] % (TQ_CODEC__COUNT + 1));
	g.max_tokens = 1u << 20;
	attached = data[11] & 1;
	if (session_geom_check(&g, &bpt, why, sizeof(why)) < 0)
		g = (struct session_geom){ .n_layers = 4, .n_kv_heads = 2, .n_q_heads = 4, .head_dim = 64,
					   .k_codec = TQ_CODEC_Q8, .v_codec = TQ_CODEC_Q8, .max_tokens = 1u << 20 };
	if (arena_bytes <= SMALL_ARENA_MAX && !(arena = malloc(arena_bytes ? arena_bytes : 1)))
		return 0;

	for (size_t at = 16; at < size; at += sizeof(struct tqkv_sqe)) {
		struct tqkv_sqe e;
		uint32_t detail, st;
		size_t n = size - at < sizeof(e) ? size - at : sizeof(e);

		memset(&e, 0, sizeof(e));
		memcpy(&e, data + at, n);
		st = ring_sqe_check(&e, arena_bytes, attached ? &g : NULL, &detail);
		if (st >= TQKV_ST__COUNT)
			abort();
		if (st != TQKV_ST_OK)
			continue;
		/* accepted: a known opcode with zero reserved words */
		for (int i = 0; i < 6; i++)
			if (e.reserved[i])
				abort();
		if (e.opcode >= TQKV_OP__COUNT)
			abort();
		if (e.opcode != TQKV_OP_NOP && e.opcode != TQKV_OP_ATTACH && !attached)
			abort(); /* an op on a session this connection does not hold */
		bool app = e.opcode == TQKV_OP_APPEND || e.opcode == TQKV_OP_APPEND_ATTEND;
		bool att = e.opcode == TQKV_OP_ATTEND || e.opcode == TQKV_OP_APPEND_ATTEND;
		if (!app && (e.n_tokens || e.k_off || e.v_off))
			abort();
		if (!att && (e.n_q || e.q_off || e.pos_off || e.out_off))
			abort();
		if (app || att) {
			if (e.dtype > TQ_DTYPE_BF16 || e.layer >= g.n_layers || e.flags || e.pos)
				abort();
		}
		if (e.opcode == TQKV_OP_TRUNCATE && !(e.flags & TQKV_SQE_ALL_LAYERS) && e.layer >= g.n_layers)
			abort();
		uint64_t es = tq_dtype_size((enum tq_dtype)e.dtype);
		if (app) {
			uint64_t kvb = (uint64_t)e.n_tokens * g.n_kv_heads * g.head_dim * es;
			if (e.n_tokens == 0 || e.n_tokens > TQKV_MAX_TOKENS_PER_OP)
				abort();
			region_in(arena, arena_bytes, e.k_off, kvb, es);
			region_in(arena, arena_bytes, e.v_off, kvb, es);
		}
		if (att) {
			uint64_t qb = (uint64_t)e.n_q * g.n_q_heads * g.head_dim;
			if (e.n_q == 0 || e.n_q > TQKV_MAX_TOKENS_PER_OP)
				abort();
			region_in(arena, arena_bytes, e.q_off, qb * es, es);
			region_in(arena, arena_bytes, e.pos_off, (uint64_t)e.n_q * 4, 4);
			region_in(arena, arena_bytes, e.out_off, qb * 4, 4);
		}
	}
	free(arena);
	return 0;
}
