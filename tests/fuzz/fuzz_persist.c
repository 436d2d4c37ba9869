/* fuzz_persist — persistent sessions' files (daemon/persist.c), the bytes a
 * disk hands back after a crash or a bit flip.  A manifest either decodes
 * into one that encodes back to the same bytes (format 3; a format 1 or 2
 * one into a format 3 one that decodes to the same), or fails with a reason; a
 * journal replays only records whose sizes fit the bytes and whose
 * sequence numbers follow each other.  The first byte picks the reader
 * (even: manifest, odd: journal of session 1, checkpoint 1). */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "persist.h"

struct seen {
	size_t len;
	uint32_t next_seq;
};

static int check_rec(void *ctx, const struct persist_rec *r, const uint8_t *payload)
{
	struct seen *s = ctx;

	(void)payload;
	if (r->payload_bytes > s->len || r->seq != s->next_seq || r->epoch != 1)
		abort();
	s->next_seq++;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char why[512] = "";

	if (size < 1)
		return 0;
	if (data[0] % 2 == 0) {
		struct persist_manifest m;
		size_t len;
		if (persist_manifest_decode(data + 1, size - 1, &m, why, sizeof(why)) != 0) {
			if (!why[0])
				abort(); /* a failure always says why */
			return 0;
		}
		uint8_t *b = persist_manifest_encode(&m, &len);
		if (b && m.format == PERSIST_FORMAT && (len != size - 1 || memcmp(b, data + 1, len)))
			abort(); /* what decodes, encodes back to the same bytes */
		if (b && m.format != PERSIST_FORMAT) {
			/* an older format: re-encoded, the same manifest */
			struct persist_manifest m2;
			if (persist_manifest_decode(b, len, &m2, why, sizeof(why)) != 0)
				abort();
			if (m2.id != m.id || m2.epoch != m.epoch || m2.geom.n_layers != m.geom.n_layers ||
			    m2.geom.kv_xform != m.geom.kv_xform || m2.page_tokens != m.page_tokens)
				abort();
			for (uint32_t l = 0; l < m.geom.n_layers; l++)
				if (m2.layers[l].n_tokens != m.layers[l].n_tokens ||
				    m2.layers[l].n_pages != m.layers[l].n_pages ||
				    m2.layers[l].xf_bytes != m.layers[l].xf_bytes)
					abort();
			persist_manifest_free(&m2);
		}
		free(b);
		persist_manifest_free(&m);
	} else {
		struct seen s = { .len = size - 1 };
		uint32_t n;
		persist_journal_replay_buf(data + 1, size - 1, 1, 1, check_rec, &s, &n, why, sizeof(why));
		if (n != s.next_seq)
			abort();
	}
	return 0;
}
